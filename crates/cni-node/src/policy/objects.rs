//! The few fields of Pods, Namespaces and NetworkPolicies the agent uses, read
//! defensively (as the Node's are): each watched object is turned at once into a small
//! item; a field the agent cannot read exactly becomes a problem of that object, named
//! in the log, never a failed list or a panic.
//!
//! A NetworkPolicy is read into [`PolicyInfo`] so that what cannot be enforced exactly
//! never opens traffic: an unreadable peer or port matches nothing (a `from` list whose
//! every entry is unreadable allows nothing, where an empty `from` allows everything),
//! and an unreadable `podSelector` selects every pod of the namespace, so the pods the
//! policy was meant to isolate stay isolated.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use super::Unreadable;
use super::selector::{Labels, Selector};
use crate::logging::short;
use crate::store::Watched;

/// IP protocol numbers NetworkPolicy names.
pub const TCP: u8 = 6;
/// UDP.
pub const UDP: u8 = 17;
/// SCTP.
pub const SCTP: u8 = 132;

macro_rules! slim_resource {
    ($ty:ident, $kind:literal, $version:literal, $group:literal, $path:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = if $group.is_empty() {
                $version
            } else {
                concat!($group, "/", $version)
            };
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $path;
            type Scope = $scope;
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// A Pod as the watcher receives it: metadata, `spec` and `status` as loose JSON
/// (only the fields below are read).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimPod {
    /// Name, namespace, labels.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`: nodeName, hostNetwork, containers' ports.
    #[serde(default)]
    pub spec: SlimPodSpec,
    /// `status`: podIPs, podIP, phase.
    #[serde(default)]
    pub status: SlimPodStatus,
}

/// The read parts of a Pod's `spec`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimPodSpec {
    /// `spec.nodeName`.
    #[serde(default, rename = "nodeName")]
    pub node_name: Value,
    /// `spec.hostNetwork`.
    #[serde(default, rename = "hostNetwork")]
    pub host_network: Value,
    /// `spec.containers`.
    #[serde(default)]
    pub containers: Value,
}

/// The read parts of a Pod's `status`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimPodStatus {
    /// `status.podIPs`.
    #[serde(default, rename = "podIPs")]
    pub pod_ips: Value,
    /// `status.podIP`.
    #[serde(default, rename = "podIP")]
    pub pod_ip: Value,
    /// `status.phase`.
    #[serde(default)]
    pub phase: Value,
}

slim_resource!(
    SlimPod,
    "Pod",
    "v1",
    "",
    "pods",
    k8s_openapi::NamespaceResourceScope
);

/// A container port with a name: what a named port in a policy resolves to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    /// The port's name.
    pub name: String,
    /// Its protocol.
    pub protocol: u8,
    /// Its number.
    pub port: u16,
}

/// What the agent keeps of one Pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: Labels,
    /// `spec.nodeName` (empty until scheduled).
    pub node: String,
    /// `spec.hostNetwork`: such a pod has the node's addresses and is never matched by
    /// a pod or namespace selector.
    pub host_network: bool,
    /// Its addresses (none once it has finished: a finished pod's address may be
    /// given to another pod).
    pub ips: Vec<IpAddr>,
    /// Its containers' named ports.
    pub named_ports: Vec<NamedPort>,
    /// What could not be read.
    pub problems: Vec<String>,
    /// [`PodInfo::peer_digest`], once asked.
    pub peer_digest: PeerDigest,
}

/// A digest of what peers select a pod by, made once for the pod's life: the
/// ClusterNetworkPolicy compile groups every pod of the cluster by it at each pass.
/// Not part of the pod's value: pods are equal whatever their digests hold.
#[derive(Clone, Default)]
pub struct PeerDigest(std::sync::OnceLock<[u8; 32]>);

impl PartialEq for PeerDigest {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for PeerDigest {}

impl std::fmt::Debug for PeerDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerDigest")
    }
}

impl PodInfo {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// A SHA-256 of the pod's namespace, labels and named ports: pods that every peer
    /// selects alike have the same, and no two others do (nobody can make a collision
    /// of SHA-256). Made at the first call; a pod's fields do not change once it is in
    /// a store.
    pub fn peer_digest(&self) -> &[u8; 32] {
        use sha2::Digest;
        self.peer_digest.0.get_or_init(|| {
            let mut hash = sha2::Sha256::new();
            // Each text after its length, so that no two lists of them read alike.
            let mut text = |t: &str| {
                hash.update((t.len() as u64).to_le_bytes());
                hash.update(t.as_bytes());
            };
            text(&self.namespace);
            text(&self.labels.len().to_string());
            for (key, value) in &self.labels {
                text(key);
                text(value);
            }
            text(&self.named_ports.len().to_string());
            for port in &self.named_ports {
                text(&port.name);
                text(&port.protocol.to_string());
                text(&port.port.to_string());
            }
            hash.finalize().into()
        })
    }

    /// Reads a watched Pod.
    pub fn from_slim(pod: &SlimPod) -> Self {
        let mut info = Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            node: pod.spec.node_name.as_str().unwrap_or_default().to_owned(),
            host_network: pod.spec.host_network.as_bool().unwrap_or(false),
            ..Self::default()
        };
        info.read_ports(&pod.spec.containers);
        let finished = matches!(pod.status.phase.as_str(), Some("Succeeded" | "Failed"));
        if !finished {
            info.read_ips(&pod.status);
        }
        info
    }

    fn read_ips(&mut self, status: &SlimPodStatus) {
        let mut texts: Vec<&str> = Vec::new();
        match &status.pod_ips {
            Value::Array(list) => texts.extend(
                list.iter()
                    .filter_map(|e| e.get("ip").and_then(Value::as_str)),
            ),
            Value::Null => {}
            other => self
                .problems
                .push(format!("status.podIPs is not a list: {}", short(other))),
        }
        if texts.is_empty() {
            texts.extend(status.pod_ip.as_str());
        }
        for text in texts {
            match cni_protocol::ip::parse_ip(text) {
                Some(ip) if !self.ips.contains(&ip) => self.ips.push(ip),
                Some(_) => {}
                None => self
                    .problems
                    .push(format!("pod IP {text:?} is not an IP address")),
            }
        }
    }

    fn read_ports(&mut self, containers: &Value) {
        let Value::Array(containers) = containers else {
            return;
        };
        for port in containers
            .iter()
            .filter_map(|c| c.get("ports")?.as_array())
            .flatten()
        {
            let Some(name) = port.get("name").and_then(Value::as_str) else {
                continue;
            };
            let number = port
                .get("containerPort")
                .and_then(Value::as_u64)
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0);
            let protocol = protocol(port.get("protocol").unwrap_or(&Value::Null));
            match (number, protocol) {
                (Some(port), Ok(protocol)) => self.named_ports.push(NamedPort {
                    name: name.to_owned(),
                    protocol,
                    port,
                }),
                _ => self.problems.push(format!(
                    "container port {name:?} is not a port and protocol: {}",
                    short(port)
                )),
            }
        }
        self.named_ports.sort();
        self.named_ports.dedup();
    }
}

impl Watched for SlimPod {
    const KIND: &'static str = "Pod";
    type Item = PodInfo;

    fn read(&self) -> Option<(String, PodInfo)> {
        let info = PodInfo::from_slim(self);
        (!info.name.is_empty()).then(|| (info.key(), info))
    }

    fn key(&self) -> Option<String> {
        let name = self.metadata.name.as_deref().filter(|n| !n.is_empty())?;
        Some(format!(
            "{}/{name}",
            self.metadata.namespace.as_deref().unwrap_or_default()
        ))
    }
}

/// A Namespace as the watcher receives it: only its metadata is read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimNamespace {
    /// Name and labels.
    #[serde(default)]
    pub metadata: ObjectMeta,
}

slim_resource!(
    SlimNamespace,
    "Namespace",
    "v1",
    "",
    "namespaces",
    k8s_openapi::ClusterResourceScope
);

impl Watched for SlimNamespace {
    const KIND: &'static str = "Namespace";
    /// The namespace's labels.
    type Item = Labels;

    fn read(&self) -> Option<(String, Labels)> {
        let name = self.metadata.name.clone().filter(|n| !n.is_empty())?;
        Some((name, self.metadata.labels.clone().unwrap_or_default()))
    }

    fn key(&self) -> Option<String> {
        self.metadata.name.clone().filter(|n| !n.is_empty())
    }
}

/// A NetworkPolicy as the watcher receives it: `spec` as loose JSON.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimNetworkPolicy {
    /// Name and namespace.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The whole `spec`, read by [`PolicyInfo::from_slim`].
    #[serde(default)]
    pub spec: Value,
}

slim_resource!(
    SlimNetworkPolicy,
    "NetworkPolicy",
    "v1",
    "networking.k8s.io",
    "networkpolicies",
    k8s_openapi::NamespaceResourceScope
);

/// A ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`) as the watcher
/// receives it: `spec` as loose JSON, read by
/// [`super::cluster_objects::ClusterPolicyInfo::from_slim`].
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimClusterNetworkPolicy {
    /// Its name.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The whole `spec`.
    #[serde(default)]
    pub spec: Value,
}

slim_resource!(
    SlimClusterNetworkPolicy,
    "ClusterNetworkPolicy",
    "v1alpha2",
    "policy.networking.k8s.io",
    "clusternetworkpolicies",
    k8s_openapi::ClusterResourceScope
);

/// A port of a policy rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortRef {
    /// Every port of the protocol.
    Any,
    /// A number or a range (`port` to `endPort`).
    Range(u16, u16),
    /// A named container port, resolved against the destination pod.
    Named(String),
}

/// One entry of a rule's `ports`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyPort {
    /// IP protocol number.
    pub protocol: u8,
    /// Which ports.
    pub port: PortRef,
}

/// One entry of a rule's `from` or `to`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Peer {
    /// Pods chosen by selectors: `pods` in the namespaces `namespaces` selects, or in
    /// the policy's own namespace when `namespaces` is `None`.
    Pods {
        /// The namespaces; `None` for the policy's own.
        namespaces: Option<Selector>,
        /// The pods in them.
        pods: Selector,
    },
    /// Addresses in `cidr` outside every `except`.
    IpBlock {
        /// The block.
        cidr: IpNetwork,
        /// Holes in it.
        except: Vec<IpNetwork>,
    },
}

/// One ingress or egress rule: traffic with any of `peers` on any of `ports`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    /// `None`: every peer (the list was missing or empty). `Some(list)`: only these
    /// (empty when every entry was unreadable: nothing).
    pub peers: Option<Vec<Peer>>,
    /// `None`: every port of every protocol. `Some(list)`: only these (empty: nothing).
    pub ports: Option<Vec<PolicyPort>>,
}

/// What the agent keeps of one NetworkPolicy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyInfo {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// The pods of its namespace it selects.
    pub pod_selector: Selector,
    /// Its ingress rules, when it has the Ingress type (it isolates its pods' ingress).
    pub ingress: Option<Vec<Rule>>,
    /// Its egress rules, when it has the Egress type.
    pub egress: Option<Vec<Rule>>,
    /// What could not be read, each making the policy stricter, never looser.
    pub problems: Vec<String>,
}

impl PolicyInfo {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Reads a watched NetworkPolicy.
    pub fn from_slim(policy: &SlimNetworkPolicy) -> Self {
        let mut info = Self {
            namespace: policy.metadata.namespace.clone().unwrap_or_default(),
            name: policy.metadata.name.clone().unwrap_or_default(),
            ..Self::default()
        };
        let spec = &policy.spec;
        if !spec.is_object() {
            info.problems
                .push(format!("spec is not an object: {}", short(spec)));
        }
        let null = Value::Null;
        match Selector::parse(spec.get("podSelector").unwrap_or(&null)) {
            Ok(selector) => info.pod_selector = selector,
            Err(why) => info.problems.push(format!(
                "podSelector: {why}; it selects every pod of its namespace instead"
            )),
        }
        let ingress = spec.get("ingress").unwrap_or(&null);
        let egress = spec.get("egress").unwrap_or(&null);
        let has_egress_rules = egress.as_array().is_some_and(|l| !l.is_empty());
        let (mut wants_ingress, mut wants_egress) = (true, has_egress_rules);
        match spec.get("policyTypes").unwrap_or(&null) {
            Value::Null => {}
            Value::Array(types) if !types.is_empty() => {
                wants_ingress = false;
                wants_egress = false;
                for t in types {
                    match t.as_str() {
                        Some("Ingress") => wants_ingress = true,
                        Some("Egress") => wants_egress = true,
                        _ => {
                            // Unreadable: isolate both ways, allowing what the rules say.
                            info.problems.push(format!(
                                "policyTypes holds {}; both directions are isolated",
                                short(t)
                            ));
                            wants_ingress = true;
                            wants_egress = true;
                        }
                    }
                }
            }
            Value::Array(_) => {}
            other => {
                info.problems.push(format!(
                    "policyTypes is not a list: {}; both directions are isolated",
                    short(other)
                ));
                wants_ingress = true;
                wants_egress = true;
            }
        }
        if wants_ingress {
            info.ingress = Some(info.rules(ingress, "ingress", "from"));
        }
        if wants_egress {
            info.egress = Some(info.rules(egress, "egress", "to"));
        }
        info
    }

    fn rules(&mut self, value: &Value, field: &str, peers_field: &str) -> Vec<Rule> {
        let list = match value {
            Value::Null => return Vec::new(),
            Value::Array(list) => list,
            other => {
                self.problems
                    .push(format!("{field} is not a list: {}", short(other)));
                return Vec::new();
            }
        };
        list.iter()
            .enumerate()
            .map(|(i, rule)| Rule {
                peers: self.peers(
                    rule.get(peers_field).unwrap_or(&Value::Null),
                    &format!("{field}[{i}].{peers_field}"),
                ),
                ports: self.ports(
                    rule.get("ports").unwrap_or(&Value::Null),
                    &format!("{field}[{i}].ports"),
                ),
            })
            .collect()
    }

    fn peers(&mut self, value: &Value, at: &str) -> Option<Vec<Peer>> {
        let list = match value {
            Value::Null => return None,
            Value::Array(list) if list.is_empty() => return None,
            Value::Array(list) => list,
            other => {
                self.problems.push(format!(
                    "{at} is not a list: {}; it matches nothing",
                    short(other)
                ));
                return Some(Vec::new());
            }
        };
        let mut peers = Vec::new();
        for (i, entry) in list.iter().enumerate() {
            match peer(entry) {
                Ok(p) => peers.push(p),
                Err(why) => self
                    .problems
                    .push(format!("{at}[{i}]: {why}; it matches nothing")),
            }
        }
        Some(peers)
    }

    fn ports(&mut self, value: &Value, at: &str) -> Option<Vec<PolicyPort>> {
        let list = match value {
            Value::Null => return None,
            Value::Array(list) if list.is_empty() => return None,
            Value::Array(list) => list,
            other => {
                self.problems.push(format!(
                    "{at} is not a list: {}; it matches nothing",
                    short(other)
                ));
                return Some(Vec::new());
            }
        };
        let mut ports = Vec::new();
        for (i, entry) in list.iter().enumerate() {
            match policy_port(entry) {
                Ok(p) => ports.push(p),
                Err(why) => self
                    .problems
                    .push(format!("{at}[{i}]: {why}; it matches nothing")),
            }
        }
        Some(ports)
    }
}

impl Watched for SlimNetworkPolicy {
    const KIND: &'static str = "NetworkPolicy";
    type Item = PolicyInfo;

    fn read(&self) -> Option<(String, PolicyInfo)> {
        let info = PolicyInfo::from_slim(self);
        (!info.name.is_empty()).then(|| (info.key(), info))
    }

    fn key(&self) -> Option<String> {
        let name = self.metadata.name.as_deref().filter(|n| !n.is_empty())?;
        Some(format!(
            "{}/{name}",
            self.metadata.namespace.as_deref().unwrap_or_default()
        ))
    }
}

fn peer(entry: &Value) -> Result<Peer, Unreadable> {
    if !entry.is_object() {
        return Err(Unreadable::of_type("the entry", "an object", entry));
    }
    if let Some(block) = entry.get("ipBlock").filter(|b| !b.is_null()) {
        if entry.get("podSelector").is_some_and(|v| !v.is_null())
            || entry.get("namespaceSelector").is_some_and(|v| !v.is_null())
        {
            return Err(Unreadable::Shape("ipBlock together with a selector"));
        }
        let cidr = block
            .get("cidr")
            .and_then(Value::as_str)
            .ok_or(Unreadable::Shape("ipBlock without a cidr"))?;
        let cidr = parse_cidr(cidr)?;
        let mut except = Vec::new();
        if let Some(list) = block.get("except").filter(|v| !v.is_null()) {
            let list = list
                .as_array()
                .ok_or_else(|| Unreadable::of_type("ipBlock except", "a list", list))?;
            for e in list {
                let text = e
                    .as_str()
                    .ok_or_else(|| Unreadable::of_type("an ipBlock except entry", "a string", e))?;
                let hole = parse_cidr(text)?;
                if hole.is_ipv4() != cidr.is_ipv4() {
                    return Err(Unreadable::ExceptFamily(text.to_owned()));
                }
                except.push(hole);
            }
        }
        return Ok(Peer::IpBlock { cidr, except });
    }
    let pods = entry.get("podSelector").filter(|v| !v.is_null());
    let namespaces = entry.get("namespaceSelector").filter(|v| !v.is_null());
    if pods.is_none() && namespaces.is_none() {
        return Err(Unreadable::Shape("neither a selector nor an ipBlock"));
    }
    let pods = match pods {
        Some(v) => Selector::parse(v).map_err(|e| Unreadable::Selector {
            selector: "podSelector",
            inner: Box::new(e),
        })?,
        None => Selector::default(),
    };
    let namespaces = match namespaces {
        Some(v) => Some(Selector::parse(v).map_err(|e| Unreadable::Selector {
            selector: "namespaceSelector",
            inner: Box::new(e),
        })?),
        None => None,
    };
    Ok(Peer::Pods { namespaces, pods })
}

pub(crate) fn parse_cidr(text: &str) -> Result<IpNetwork, Unreadable> {
    let net =
        cni_protocol::ip::parse_cidr(text).ok_or_else(|| Unreadable::Cidr(text.to_owned()))?;
    IpNetwork::new(net.network(), net.prefix()).map_err(|_| Unreadable::Cidr(text.to_owned()))
}

fn protocol(value: &Value) -> Result<u8, Unreadable> {
    match value {
        Value::Null => Ok(TCP),
        Value::String(p) => match p.as_str() {
            "TCP" => Ok(TCP),
            "UDP" => Ok(UDP),
            "SCTP" => Ok(SCTP),
            other => Err(Unreadable::Protocol(other.to_owned())),
        },
        other => Err(Unreadable::of_type("protocol", "a string", other)),
    }
}

fn policy_port(entry: &Value) -> Result<PolicyPort, Unreadable> {
    if !entry.is_object() {
        return Err(Unreadable::of_type("the entry", "an object", entry));
    }
    let protocol = protocol(entry.get("protocol").unwrap_or(&Value::Null))?;
    let end = match entry.get("endPort") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| Unreadable::Port {
                    field: "endPort",
                    value: short(v),
                })?,
        ),
    };
    let port = match entry.get("port") {
        None | Some(Value::Null) if end.is_none() => PortRef::Any,
        None | Some(Value::Null) => return Err(Unreadable::Shape("endPort without a port")),
        Some(Value::String(name)) if end.is_none() => match name.parse::<u16>() {
            // An IntOrString port given as a string of digits is the number.
            Ok(n) if n > 0 => PortRef::Range(n, n),
            _ if name.is_empty() => return Err(Unreadable::Shape("an empty port name")),
            _ => PortRef::Named(name.clone()),
        },
        Some(Value::String(_)) => return Err(Unreadable::Shape("endPort with a named port")),
        Some(v) => {
            let start = v
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| Unreadable::Port {
                    field: "port",
                    value: short(v),
                })?;
            let end = end.unwrap_or(start);
            if end < start {
                return Err(Unreadable::EndBelowStart { start, end });
            }
            PortRef::Range(start, end)
        }
    };
    Ok(PolicyPort { protocol, port })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(spec: Value) -> PolicyInfo {
        let slim: SlimNetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "x"},
            "spec": spec,
        }))
        .unwrap();
        PolicyInfo::from_slim(&slim)
    }

    #[test]
    fn policy_types_default_to_ingress_and_egress_when_it_has_egress_rules() {
        let p = policy(json!({"podSelector": {}}));
        assert_eq!(
            (p.ingress.as_deref(), p.egress.as_deref()),
            (Some(&[][..]), None)
        );
        let p = policy(json!({"podSelector": {}, "egress": [{}]}));
        assert!(p.ingress.is_some() && p.egress.is_some());
        let p = policy(json!({"podSelector": {}, "egress": []}));
        assert!(p.egress.is_none());
        let p = policy(json!({"podSelector": {}, "policyTypes": ["Egress"]}));
        assert!(p.ingress.is_none() && p.egress == Some(vec![]));
        assert!(p.problems.is_empty());
    }

    #[test]
    fn rules_peers_and_ports_are_read() {
        let p = policy(json!({
            "podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{
                "from": [
                    {"podSelector": {"matchLabels": {"pod": "b"}}},
                    {"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {}},
                    {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}},
                ],
                "ports": [
                    {"port": 80},
                    {"protocol": "UDP", "port": 53, "endPort": 54},
                    {"port": "serve-81"},
                    {"protocol": "SCTP"},
                ],
            }, {}],
        }));
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        let rules = p.ingress.unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[1], Rule::default(), "an empty rule allows everything");
        let peers = rules[0].peers.as_ref().unwrap();
        assert!(matches!(
            &peers[0],
            Peer::Pods {
                namespaces: None,
                ..
            }
        ));
        assert!(
            matches!(&peers[1], Peer::Pods { namespaces: Some(_), pods } if pods.is_everything())
        );
        assert!(matches!(&peers[2], Peer::IpBlock { except, .. } if except.len() == 1));
        assert_eq!(
            rules[0].ports.as_ref().unwrap(),
            &vec![
                PolicyPort {
                    protocol: TCP,
                    port: PortRef::Range(80, 80)
                },
                PolicyPort {
                    protocol: UDP,
                    port: PortRef::Range(53, 54)
                },
                PolicyPort {
                    protocol: TCP,
                    port: PortRef::Named("serve-81".into())
                },
                PolicyPort {
                    protocol: SCTP,
                    port: PortRef::Any
                },
            ]
        );
    }

    #[test]
    fn what_cannot_be_read_matches_nothing_and_is_named() {
        let p = policy(json!({
            "podSelector": {"matchExpressions": [{"key": "k", "operator": "Gt"}]},
            "ingress": [{
                "from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}],
                "ports": [{"protocol": "ICMP", "port": 1}],
            }],
        }));
        assert!(
            p.pod_selector.is_everything(),
            "fails closed: every pod of x"
        );
        let rules = p.ingress.unwrap();
        assert_eq!(rules[0].peers, Some(vec![]), "nothing, not everything");
        assert_eq!(rules[0].ports, Some(vec![]));
        let text = p.problems.join("\n");
        for want in ["podSelector", "10.0.0.0/33", "ICMP"] {
            assert!(text.contains(want), "{want}: {text}");
        }
        for (port, want) in [
            (json!({"port": 81, "endPort": 80}), "below"),
            (json!({"port": "http", "endPort": 90}), "named port"),
            (json!({"endPort": 90}), "without a port"),
            (json!({"port": 70000}), "not a port"),
        ] {
            let p = policy(json!({"podSelector": {}, "ingress": [{"ports": [port]}]}));
            assert_eq!(p.ingress.unwrap()[0].ports, Some(vec![]));
            assert!(
                p.problems.iter().any(|e| e.contains(want)),
                "{want}: {:?}",
                p.problems
            );
        }
    }

    /// Pods that peers select alike share a digest; any difference in namespace,
    /// labels or named ports, even one that only moves a character between a key and
    /// its value, gives another.
    #[test]
    fn pods_have_the_same_peer_digest_only_when_peers_select_them_alike() {
        let pod = |namespace: &str, labels: &[(&str, &str)], port: Option<(&str, u16)>| PodInfo {
            namespace: namespace.into(),
            name: "p".into(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            named_ports: port
                .map(|(name, port)| NamedPort {
                    name: name.into(),
                    protocol: 6,
                    port,
                })
                .into_iter()
                .collect(),
            ..PodInfo::default()
        };
        let base = pod("shop", &[("app", "web")], Some(("http", 80)));
        let same = PodInfo {
            name: "other".into(),
            ips: vec!["10.0.0.9".parse().unwrap()],
            ..pod("shop", &[("app", "web")], Some(("http", 80)))
        };
        assert_eq!(base.peer_digest(), same.peer_digest());
        for other in [
            pod("shop2", &[("app", "web")], Some(("http", 80))),
            pod("shop", &[("ap", "pweb")], Some(("http", 80))),
            pod("shop", &[("app", "web"), ("tier", "a")], Some(("http", 80))),
            pod("shop", &[("app", "web")], Some(("http", 81))),
            pod("shop", &[("app", "web")], None),
        ] {
            assert_ne!(base.peer_digest(), other.peer_digest(), "{other:?}");
        }
        // The digest is not part of the pod's value.
        assert_eq!(pod("shop", &[], None), {
            let asked = pod("shop", &[], None);
            asked.peer_digest();
            asked
        });
    }

    #[test]
    fn a_pod_is_read_with_its_addresses_and_named_ports() {
        let slim: SlimPod = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "x", "labels": {"pod": "a"}},
            "spec": {"nodeName": "n1", "containers": [{"ports": [
                {"name": "serve-80-tcp", "containerPort": 80},
                {"name": "serve-81-udp", "containerPort": 81, "protocol": "UDP"},
                {"containerPort": 9000},
            ]}]},
            "status": {"podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}, {"ip": "fd00::5"}]},
        }))
        .unwrap();
        let pod = PodInfo::from_slim(&slim);
        assert_eq!(pod.key(), "x/a");
        assert_eq!(pod.node, "n1");
        assert_eq!(pod.ips.len(), 2);
        assert_eq!(pod.named_ports.len(), 2);
        assert!(pod.problems.is_empty(), "{:?}", pod.problems);
        let done: SlimPod = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "x"},
            "status": {"phase": "Succeeded", "podIP": "10.244.1.5"},
        }))
        .unwrap();
        assert!(PodInfo::from_slim(&done).ips.is_empty());
    }
}
