//! The kinds the server serves: where each lives in the URL space, what its lists are
//! called, which fields a field selector may name (the API server's own lists), and
//! which of them a custom resource definition brings (so a server can run without it).

use serde_json::Value;

/// A kind of object the server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `v1 Node`, cluster-scoped: `/api/v1/nodes`.
    Node,
    /// `v1 Namespace`, cluster-scoped: `/api/v1/namespaces`.
    Namespace,
    /// `v1 Pod`, namespaced: `/api/v1/pods`, `/api/v1/namespaces/{ns}/pods`.
    Pod,
    /// `networking.k8s.io/v1 NetworkPolicy`, namespaced:
    /// `/apis/networking.k8s.io/v1/networkpolicies` and the same under
    /// `/apis/networking.k8s.io/v1/namespaces/{ns}/`.
    NetworkPolicy,
    /// `policy.networking.k8s.io/v1alpha2 ClusterNetworkPolicy` (network-policy-api
    /// v0.2.0), cluster-scoped: `/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies`.
    /// A custom resource: a cluster has it only once its CRD is installed.
    ClusterNetworkPolicy,
}

impl Kind {
    /// Every kind served.
    pub const ALL: [Kind; 5] = [
        Kind::Node,
        Kind::Namespace,
        Kind::Pod,
        Kind::NetworkPolicy,
        Kind::ClusterNetworkPolicy,
    ];

    /// The `kind` of an object, e.g. `Pod`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Node => "Node",
            Kind::Namespace => "Namespace",
            Kind::Pod => "Pod",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::ClusterNetworkPolicy => "ClusterNetworkPolicy",
        }
    }

    /// The `kind` of a list, e.g. `PodList`.
    pub fn list_name(self) -> &'static str {
        match self {
            Kind::Node => "NodeList",
            Kind::Namespace => "NamespaceList",
            Kind::Pod => "PodList",
            Kind::NetworkPolicy => "NetworkPolicyList",
            Kind::ClusterNetworkPolicy => "ClusterNetworkPolicyList",
        }
    }

    /// The API group, `""` for the core group.
    pub fn group(self) -> &'static str {
        match self {
            Kind::Node | Kind::Namespace | Kind::Pod => "",
            Kind::NetworkPolicy => "networking.k8s.io",
            Kind::ClusterNetworkPolicy => "policy.networking.k8s.io",
        }
    }

    /// The `apiVersion` of its objects and lists, e.g. `networking.k8s.io/v1`.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Node | Kind::Namespace | Kind::Pod => "v1",
            Kind::NetworkPolicy => "networking.k8s.io/v1",
            Kind::ClusterNetworkPolicy => "policy.networking.k8s.io/v1alpha2",
        }
    }

    /// The resource name in URLs, e.g. `pods`.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Node => "nodes",
            Kind::Namespace => "namespaces",
            Kind::Pod => "pods",
            Kind::NetworkPolicy => "networkpolicies",
            Kind::ClusterNetworkPolicy => "clusternetworkpolicies",
        }
    }

    /// The singular resource name, as discovery gives it.
    pub fn singular(self) -> &'static str {
        match self {
            Kind::Node => "node",
            Kind::Namespace => "namespace",
            Kind::Pod => "pod",
            Kind::NetworkPolicy => "networkpolicy",
            Kind::ClusterNetworkPolicy => "clusternetworkpolicy",
        }
    }

    /// The short names kubectl knows it by.
    pub fn short_names(self) -> &'static [&'static str] {
        match self {
            Kind::Node => &["no"],
            Kind::Namespace => &["ns"],
            Kind::Pod => &["po"],
            Kind::NetworkPolicy => &["netpol"],
            Kind::ClusterNetworkPolicy => &["cnp"],
        }
    }

    /// Whether its objects live in a namespace.
    pub fn namespaced(self) -> bool {
        matches!(self, Kind::Pod | Kind::NetworkPolicy)
    }

    /// Whether a custom resource definition brings it (the server can run without it,
    /// answering 404 for its group as a cluster without the CRD does).
    pub fn custom(self) -> bool {
        matches!(self, Kind::ClusterNetworkPolicy)
    }

    /// The fields a field selector may name for this kind, as the API server's
    /// field label conversions accept them (anything else is `400 field label not
    /// supported`).
    pub fn selectable_fields(self) -> &'static [&'static str] {
        match self {
            Kind::Node => &["metadata.name", "spec.unschedulable"],
            Kind::Namespace => &["metadata.name", "status.phase"],
            Kind::Pod => &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.hostNetwork",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            Kind::NetworkPolicy => &["metadata.name", "metadata.namespace"],
            // What the API server allows for every custom resource.
            Kind::ClusterNetworkPolicy => &["metadata.name", "metadata.namespace"],
        }
    }

    /// The values of [`Kind::selectable_fields`] for `object`, in the same order;
    /// a missing field is `""`, a missing boolean `"false"` (Go's zero values).
    pub fn field_values(self, object: &Value) -> Vec<String> {
        self.selectable_fields()
            .iter()
            .map(|field| {
                let mut value = object;
                for part in field.split('.') {
                    value = &value[part];
                }
                match value {
                    Value::String(s) => s.clone(),
                    Value::Bool(b) => b.to_string(),
                    Value::Null if matches!(*field, "spec.hostNetwork" | "spec.unschedulable") => {
                        "false".to_owned()
                    }
                    Value::Null => String::new(),
                    other => other.to_string(),
                }
            })
            .collect()
    }

    /// The kind served at `plural` in `api_version` (`v1`, `networking.k8s.io/v1`).
    pub fn from_resource(api_version: &str, plural: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.api_version() == api_version && k.plural() == plural)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_values_follow_go_zero_values() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}});
        let values = Kind::Pod.field_values(&pod);
        let get = |f: &str| {
            let i = Kind::Pod.selectable_fields().iter().position(|x| *x == f);
            values[i.expect("a field")].clone()
        };
        assert_eq!(get("metadata.name"), "p");
        assert_eq!(get("metadata.namespace"), "ns");
        assert_eq!(get("spec.nodeName"), "n1");
        assert_eq!(get("spec.hostNetwork"), "false");
        assert_eq!(get("status.phase"), "");
        assert_eq!(
            Kind::from_resource("networking.k8s.io/v1", "networkpolicies"),
            Some(Kind::NetworkPolicy)
        );
        assert_eq!(Kind::from_resource("v1", "networkpolicies"), None);
        assert_eq!(
            Kind::from_resource(
                "policy.networking.k8s.io/v1alpha2",
                "clusternetworkpolicies"
            ),
            Some(Kind::ClusterNetworkPolicy)
        );
        assert!(Kind::ClusterNetworkPolicy.custom() && !Kind::ClusterNetworkPolicy.namespaced());
        assert_eq!(
            Kind::ALL.iter().filter(|k| k.custom()).count(),
            1,
            "only ClusterNetworkPolicy comes from a CRD"
        );
    }
}
