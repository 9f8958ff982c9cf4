//! The few fields of a Kubernetes `Node` the agent uses, read defensively.
//!
//! A real Node carries its image list, conditions and node info: tens of KB each.
//! [`SlimNode`] is what the watcher deserializes into: everything else in the JSON is
//! skipped without being kept, and each event is turned at once into a [`NodeInfo`]
//! of a few dozen bytes. The fields we route on are read as loose JSON, so a garbage
//! value on one node makes that node [`NodeInfo::problems`], never a failed list
//! (which would stall the whole watch) and never a panic.

use std::borrow::Cow;
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use crate::logging::short;
use crate::store::Watched;

/// A Node as the watcher receives it: metadata, and the routing fields as loose JSON.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimNode {
    /// Name, resourceVersion and the rest of the object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`, only `podCIDR` and `podCIDRs` kept.
    #[serde(default)]
    pub spec: SlimSpec,
    /// `status`, only `addresses` kept.
    #[serde(default)]
    pub status: SlimStatus,
}

/// `spec.podCIDR` and `spec.podCIDRs`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimSpec {
    /// `spec.podCIDR` (the first of `podCIDRs`, kept for older controllers).
    #[serde(default, rename = "podCIDR")]
    pub pod_cidr: Value,
    /// `spec.podCIDRs`: one per family on a dual-stack cluster.
    #[serde(default, rename = "podCIDRs")]
    pub pod_cidrs: Value,
}

/// `status.addresses`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimStatus {
    /// `[{type, address}]`.
    #[serde(default)]
    pub addresses: Value,
}

impl k8s_openapi::Resource for SlimNode {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Node";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "nodes";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for SlimNode {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What the agent keeps of one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// Its pod CIDRs, at most one per family, network addresses (host bits zero).
    pub pod_cidrs: Vec<IpNetwork>,
    /// Its `InternalIP` addresses, at most one per family.
    pub internal_ips: Vec<IpAddr>,
    /// What was wrong with its data; a node with problems is not routed to.
    pub problems: Vec<String>,
    /// Its labels (what ClusterNetworkPolicy's `nodes` peers select).
    pub labels: crate::policy::selector::Labels,
    /// Every IP address of `status.addresses`, of any type (a `nodes` peer's
    /// addresses).
    pub addresses: Vec<IpAddr>,
}

impl NodeInfo {
    /// Reads what the agent uses from a watched Node.
    pub fn from_slim(node: &SlimNode) -> Self {
        let mut info = Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            ..Self::default()
        };
        info.read_pod_cidrs(&node.spec);
        info.read_addresses(&node.status.addresses);
        let peer = crate::policy::cluster_model::NodePeer::from_slim(node);
        info.labels = peer.labels;
        info.addresses = peer.addresses;
        info
    }

    /// The pod CIDR of one family.
    pub fn pod_cidr(&self, v4: bool) -> Option<IpNetwork> {
        self.pod_cidrs.iter().copied().find(|n| n.is_ipv4() == v4)
    }

    /// The InternalIP of one family.
    pub fn internal_ip(&self, v4: bool) -> Option<IpAddr> {
        self.internal_ips
            .iter()
            .copied()
            .find(|a| a.is_ipv4() == v4)
    }

    fn read_pod_cidrs(&mut self, spec: &SlimSpec) {
        // `podCIDRs` is the truth; `podCIDR` alone is what an old controller writes.
        let texts: Vec<Cow<'_, Value>> = match (&spec.pod_cidrs, &spec.pod_cidr) {
            (Value::Array(list), _) if !list.is_empty() => list.iter().map(Cow::Borrowed).collect(),
            (Value::Null | Value::Array(_), single @ Value::String(_)) => {
                vec![Cow::Borrowed(single)]
            }
            (Value::Null | Value::Array(_), Value::Null) => Vec::new(),
            (Value::Null | Value::Array(_), other) => {
                self.problems
                    .push(format!("spec.podCIDR is not a string: {}", short(other)));
                return;
            }
            (other, _) => {
                self.problems
                    .push(format!("spec.podCIDRs is not a list: {}", short(other)));
                return;
            }
        };
        for text in texts {
            let Some(text) = text.as_str() else {
                self.problems.push(format!(
                    "spec.podCIDRs holds a non-string: {}",
                    short(&text)
                ));
                continue;
            };
            match parse_pod_cidr(text) {
                Ok(net) if self.pod_cidr(net.is_ipv4()).is_some() => self.problems.push(format!(
                    "spec.podCIDRs has a second {} CIDR {text:?}",
                    family_name(net.is_ipv4())
                )),
                Ok(net) => self.pod_cidrs.push(net),
                Err(why) => self
                    .problems
                    .push(format!("spec.podCIDRs entry {text:?}: {why}")),
            }
        }
    }

    fn read_addresses(&mut self, addresses: &Value) {
        let list = match addresses {
            Value::Null => return,
            Value::Array(list) => list,
            other => {
                self.problems
                    .push(format!("status.addresses is not a list: {}", short(other)));
                return;
            }
        };
        for entry in list {
            if entry.get("type").and_then(Value::as_str) != Some("InternalIP") {
                continue;
            }
            let Some(text) = entry.get("address").and_then(Value::as_str) else {
                self.problems.push(format!(
                    "an InternalIP without a string address: {}",
                    short(entry)
                ));
                continue;
            };
            match cni_protocol::ip::parse_ip(text) {
                // A second address of one family (the kubelet lists the primary first):
                // the first one is the node's.
                Some(ip) if self.internal_ip(ip.is_ipv4()).is_some() => {}
                Some(ip) if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() => self
                    .problems
                    .push(format!("InternalIP {text:?} is not a unicast address")),
                Some(ip) => self.internal_ips.push(ip),
                None => self
                    .problems
                    .push(format!("InternalIP {text:?} is not an IP address")),
            }
        }
    }
}

/// A pod CIDR as the controller writes it: `network/prefix`, host bits zero, a prefix
/// that leaves room for pods and is not a default route.
fn parse_pod_cidr(text: &str) -> Result<IpNetwork, &'static str> {
    let (ip, prefix) =
        cni_protocol::ip::parse_cidr_text(text).ok_or("not an address/prefix CIDR")?;
    let ip = cni_protocol::ip::canonical_ip(ip);
    let net = IpNetwork::new(ip, prefix).map_err(|_| "prefix out of range")?;
    if net.network() != ip {
        return Err("host bits are set");
    }
    if prefix == 0 {
        return Err("a pod CIDR cannot be the whole address space");
    }
    let width = if ip.is_ipv4() { 32 } else { 128 };
    if width - prefix < 2 {
        return Err("too small to hold a gateway and a pod");
    }
    if ip.is_multicast() || ip.is_loopback() || ip.is_unspecified() {
        return Err("not a unicast range");
    }
    Ok(net)
}

fn family_name(v4: bool) -> &'static str {
    if v4 { "IPv4" } else { "IPv6" }
}

impl Watched for SlimNode {
    const KIND: &'static str = "Node";
    type Item = NodeInfo;

    fn read(&self) -> Option<(String, NodeInfo)> {
        let info = NodeInfo::from_slim(self);
        (!info.name.is_empty()).then(|| (info.name.clone(), info))
    }

    fn key(&self) -> Option<String> {
        self.metadata.name.clone().filter(|n| !n.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn info(node: Value) -> NodeInfo {
        let slim: SlimNode = serde_json::from_value(node).unwrap();
        NodeInfo::from_slim(&slim)
    }

    #[test]
    fn a_dual_stack_node_gives_both_cidrs_and_addresses() {
        let node = info(json!({
            "metadata": {"name": "n1", "resourceVersion": "7"},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:244:0:1::/64"]},
            "status": {"addresses": [
                {"type": "Hostname", "address": "n1"},
                {"type": "InternalIP", "address": "198.18.0.11"},
                {"type": "InternalIP", "address": "fd00:18::11"},
                {"type": "ExternalIP", "address": "203.0.113.9"},
            ], "images": [{"names": ["x"], "sizeBytes": 1}]},
        }));
        assert_eq!(node.name, "n1");
        assert_eq!(
            node.pod_cidrs,
            vec![
                "10.244.1.0/24".parse::<IpNetwork>().unwrap(),
                "fd00:244:0:1::/64".parse().unwrap()
            ]
        );
        assert_eq!(
            node.internal_ips,
            vec![
                "198.18.0.11".parse::<IpAddr>().unwrap(),
                "fd00:18::11".parse().unwrap()
            ]
        );
        assert!(node.problems.is_empty(), "{:?}", node.problems);
    }

    #[test]
    fn the_old_single_pod_cidr_is_read_when_the_list_is_missing() {
        let node = info(json!({"metadata": {"name": "n"}, "spec": {"podCIDR": "10.1.0.0/24"}}));
        assert_eq!(node.pod_cidrs, vec!["10.1.0.0/24".parse().unwrap()]);
    }

    #[test]
    fn a_node_without_spec_or_status_has_nothing_and_no_problem() {
        let node = info(json!({"metadata": {"name": "new"}}));
        assert_eq!(
            node,
            NodeInfo {
                name: "new".into(),
                ..NodeInfo::default()
            }
        );
    }

    #[test]
    fn garbage_is_a_problem_of_that_node_not_an_error() {
        for (spec, status, want) in [
            (
                json!({"podCIDRs": ["banana"]}),
                json!({}),
                "not an address/prefix",
            ),
            (json!({"podCIDRs": ["10.0.0.1/24"]}), json!({}), "host bits"),
            (
                json!({"podCIDRs": ["10.0.0.0/33"]}),
                json!({}),
                "not an address/prefix",
            ),
            (
                json!({"podCIDRs": ["0.0.0.0/0"]}),
                json!({}),
                "whole address space",
            ),
            (json!({"podCIDRs": ["10.0.0.0/31"]}), json!({}), "too small"),
            (json!({"podCIDRs": [7]}), json!({}), "non-string"),
            (json!({"podCIDRs": "10.0.0.0/24"}), json!({}), "not a list"),
            (json!({"podCIDR": {"a": 1}}), json!({}), "not a string"),
            (
                json!({"podCIDRs": ["10.0.0.0/24", "10.1.0.0/24"]}),
                json!({}),
                "second IPv4",
            ),
            (json!({}), json!({"addresses": 3}), "not a list"),
            (
                json!({}),
                json!({"addresses": [{"type": "InternalIP", "address": "1.2.3"}]}),
                "not an IP",
            ),
            (
                json!({}),
                json!({"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}),
                "not a unicast",
            ),
            (
                json!({}),
                json!({"addresses": [{"type": "InternalIP"}]}),
                "without a string",
            ),
        ] {
            let node = info(json!({"metadata": {"name": "bad"}, "spec": spec, "status": status}));
            assert!(
                node.problems.iter().any(|p| p.contains(want)),
                "{spec} {status}: {:?}",
                node.problems
            );
        }
    }

    #[test]
    fn a_long_garbage_value_is_cut_short_in_the_problem() {
        let long = "é".repeat(200);
        let node = info(json!({"metadata": {"name": "x"}, "spec": {"podCIDRs": {"k": long}}}));
        assert!(node.problems[0].len() < 140, "{:?}", node.problems);
    }

    #[test]
    fn the_first_internal_ip_of_a_family_is_the_nodes() {
        let node = info(json!({"metadata": {"name": "n"}, "status": {"addresses": [
            {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "InternalIP", "address": "10.0.0.2"},
        ]}}));
        assert_eq!(
            node.internal_ips,
            vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
    }
}
