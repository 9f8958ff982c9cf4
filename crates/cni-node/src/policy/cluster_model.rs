//! The tiers' meaning, written once as plain code over the agent's view: the verdict of
//! one connection with ClusterNetworkPolicy's Admin and Baseline tiers around
//! NetworkPolicy, and for each direction which tier, policy and rule decided. The tests
//! check it against the test oracle, written apart from the API's documentation.
//!
//! Each direction (the source pod's egress, the destination pod's ingress) is judged on
//! its own, tier by tier:
//!
//! - the Admin tier, then NetworkPolicy (a pod it isolates in that direction gets its
//!   answer there), then the Baseline tier, then the default: allowed;
//! - within a tier, the policies whose subject holds the pod by priority (lower first),
//!   one priority by name; their rules of the direction in order, the first that
//!   matches decides: `Accept` allows, `Deny` denies, `Pass` skips the rest of the tier;
//!   a rule that failed closed ([`ClusterRule::failed_closed`]) matches nothing as an
//!   `Accept` and everything, denying, as a `Deny` or `Pass`;
//! - a rule matches when one of its peers holds the address at the other end and, with
//!   `protocols`, one entry holds the protocol and destination port (a named port is a
//!   container port of the destination pod); none means all traffic;
//! - hostNetwork pods are never subjects nor `namespaces`/`pods` peers (their addresses
//!   are their node's, which `nodes` and `networks` peers hold);
//! - a pod reaching its own address is not judged. That the node always reaches its
//!   pods is the datapath's, before any tier, as for NetworkPolicy.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::cluster_objects::{
    Action, ClusterPeer, ClusterPolicyInfo, ClusterPort, ClusterRule, Subject,
};
use super::model::{Side, View};
use super::objects::{NamedPort, PodInfo};
use super::pipeline::Tier;
use super::selector::{Labels, Selector};
use crate::store::ItemMap;

/// A Node as `nodes` peers see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePeer {
    /// Its labels.
    pub labels: Labels,
    /// Its addresses.
    pub addresses: Vec<IpAddr>,
}

impl NodePeer {
    /// Reads a watched Node: its labels and every address of `status.addresses` that
    /// is an IP address (hostnames are not).
    pub fn from_slim(node: &crate::node::SlimNode) -> Self {
        let addresses = node
            .status
            .addresses
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.get("address")?.as_str())
            .filter_map(cni_protocol::ip::parse_ip)
            .collect();
        Self {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            addresses,
        }
    }
}

impl From<&crate::node::NodeInfo> for NodePeer {
    /// What the Node store keeps of a Node, as a peer.
    fn from(node: &crate::node::NodeInfo) -> Self {
        Self {
            labels: node.labels.clone(),
            addresses: node.addresses.clone(),
        }
    }
}

/// A rule that matched a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleMatch {
    /// The policy's name.
    pub policy: String,
    /// Its tier.
    pub tier: Tier,
    /// Its priority.
    pub priority: u32,
    /// The rule's index in the policy's list for the direction.
    pub index: usize,
    /// The rule's name.
    pub name: String,
    /// Its action as read.
    pub action: Action,
    /// It failed closed: a `Deny` or `Pass` that denied all traffic.
    pub failed_closed: bool,
}

/// Who decided one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The tier that decided; `None`: no tier did, the default allowed it.
    pub tier: Option<Tier>,
    /// Whether the direction lets the connection pass.
    pub allowed: bool,
    /// The rule that decided (Admin and Baseline tiers).
    pub rule: Option<RuleMatch>,
    /// The NetworkPolicy tier's answer: the policies that allowed it when allowed, the
    /// policies that isolate the pod when denied.
    pub network_policies: Vec<String>,
    /// The `Pass` rules that sent it on, in the order they matched.
    pub passed: Vec<RuleMatch>,
}

/// One direction of a connection, as the pod at that end sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Direction {
    /// The pod (`namespace/name`).
    pub pod: String,
    /// Its NetworkPolicy side.
    pub network_policy: Side,
    /// Who decided.
    pub decided: Decision,
}

/// The judgement of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Source and destination are one pod: not judged.
    pub same_pod: bool,
    /// The source pod's egress, when the source is a pod.
    pub egress: Option<Direction>,
    /// The destination pod's ingress, when the destination is a pod.
    pub ingress: Option<Direction>,
}

impl Verdict {
    /// Whether the connection passes.
    pub fn allowed(&self) -> bool {
        let allows = |d: &Option<Direction>| d.as_ref().is_none_or(|d| d.decided.allowed);
        self.same_pod || (allows(&self.egress) && allows(&self.ingress))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Ingress,
    Egress,
}

/// The NetworkPolicy view with the ClusterNetworkPolicies and Nodes beside it.
#[derive(Debug)]
pub struct TieredView<'a> {
    /// Pods, Namespaces and NetworkPolicies.
    pub view: &'a View<'a>,
    /// ClusterNetworkPolicies in evaluation order (tier, priority, name).
    ordered: Vec<&'a ClusterPolicyInfo>,
    /// Nodes by name.
    pub nodes: &'a BTreeMap<String, NodePeer>,
}

impl<'a> TieredView<'a> {
    /// A view over the NetworkPolicy view, the ClusterNetworkPolicies (by name) and
    /// the Nodes.
    pub fn new(
        view: &'a View<'a>,
        policies: &'a ItemMap<ClusterPolicyInfo>,
        nodes: &'a BTreeMap<String, NodePeer>,
    ) -> Self {
        let mut ordered: Vec<&ClusterPolicyInfo> = policies.values().map(|p| &**p).collect();
        ordered.sort_by(|a, b| (a.tier, a.priority, &a.name).cmp(&(b.tier, b.priority, &b.name)));
        Self {
            view,
            ordered,
            nodes,
        }
    }

    /// The policies in evaluation order.
    pub fn ordered(&self) -> &[&'a ClusterPolicyInfo] {
        &self.ordered
    }

    /// Judges a connection from `src` to `dst` on `protocol`/`port`.
    pub fn verdict(&self, src: IpAddr, dst: IpAddr, protocol: u8, port: u16) -> Verdict {
        let network = self.view.verdict(src, dst, protocol, port);
        let src_pod = self.view.pod_at(src);
        let dst_pod = self.view.pod_at(dst);
        let named: &[NamedPort] = dst_pod.map_or(&[], |p| &p.named_ports);
        let direction = |pod: &PodInfo, way: Way, side: Side, peer: IpAddr| Direction {
            pod: pod.key(),
            decided: self.decide(
                pod,
                way,
                &side,
                &Connection {
                    peer,
                    protocol,
                    port,
                    named,
                },
            ),
            network_policy: side,
        };
        Verdict {
            same_pod: network.same_pod,
            egress: src_pod.map(|pod| {
                direction(
                    pod,
                    Way::Egress,
                    network.egress.clone().unwrap_or_default(),
                    dst,
                )
            }),
            ingress: dst_pod.map(|pod| {
                direction(
                    pod,
                    Way::Ingress,
                    network.ingress.clone().unwrap_or_default(),
                    src,
                )
            }),
        }
    }

    fn decide(
        &self,
        pod: &PodInfo,
        way: Way,
        network: &Side,
        connection: &Connection<'_>,
    ) -> Decision {
        let mut passed = Vec::new();
        if let Some(decided) = self.tier(Tier::Admin, pod, way, connection, &mut passed) {
            return decided;
        }
        if !network.isolated_by.is_empty() {
            let allowed = network.allowed();
            return Decision {
                tier: Some(Tier::NetworkPolicy),
                allowed,
                rule: None,
                network_policies: if allowed {
                    network.allowed_by.clone()
                } else {
                    network.isolated_by.clone()
                },
                passed,
            };
        }
        if let Some(decided) = self.tier(Tier::Baseline, pod, way, connection, &mut passed) {
            return decided;
        }
        Decision {
            tier: None,
            allowed: true,
            rule: None,
            network_policies: Vec::new(),
            passed,
        }
    }

    fn tier(
        &self,
        tier: Tier,
        pod: &PodInfo,
        way: Way,
        connection: &Connection<'_>,
        passed: &mut Vec<RuleMatch>,
    ) -> Option<Decision> {
        let policies = self
            .ordered
            .iter()
            .filter(|p| p.tier == tier && self.subject_holds(&p.subject, pod));
        for policy in policies {
            let rules = match way {
                Way::Ingress => &policy.ingress,
                Way::Egress => &policy.egress,
            };
            let Some((index, rule)) = rules
                .iter()
                .enumerate()
                .find(|(_, rule)| self.rule_matches(rule, connection))
            else {
                continue;
            };
            let found = RuleMatch {
                policy: policy.name.clone(),
                tier,
                priority: policy.priority,
                index,
                name: rule.name.clone(),
                action: rule.action,
                failed_closed: rule.failed_closed,
            };
            let allowed = match (rule.failed_closed, rule.action) {
                (true, _) | (false, Action::Deny) => false,
                (false, Action::Accept) => true,
                (false, Action::Pass) => {
                    passed.push(found);
                    return None;
                }
            };
            return Some(Decision {
                tier: Some(tier),
                allowed,
                rule: Some(found),
                network_policies: Vec::new(),
                passed: std::mem::take(passed),
            });
        }
        None
    }

    /// Whether a policy's subject holds `pod`.
    pub fn subject_holds(&self, subject: &Subject, pod: &PodInfo) -> bool {
        if pod.host_network {
            return false;
        }
        match subject {
            Subject::Namespaces(namespaces) => {
                self.view.namespace_selected(&pod.namespace, namespaces)
            }
            Subject::Pods { namespaces, pods } => self.pod_selected(pod, namespaces, pods),
        }
    }

    fn pod_selected(&self, pod: &PodInfo, namespaces: &Selector, pods: &Selector) -> bool {
        !pod.host_network
            && self.view.namespace_selected(&pod.namespace, namespaces)
            && pods.matches(&pod.labels)
    }

    /// Whether `peer` holds the address `ip`.
    pub fn peer_holds(&self, peer: &ClusterPeer, ip: IpAddr) -> bool {
        match peer {
            ClusterPeer::Namespaces(namespaces) => self
                .view
                .pod_at(ip)
                .is_some_and(|p| self.view.namespace_selected(&p.namespace, namespaces)),
            ClusterPeer::Pods { namespaces, pods } => self
                .view
                .pod_at(ip)
                .is_some_and(|p| self.pod_selected(p, namespaces, pods)),
            ClusterPeer::Networks(networks) => networks.iter().any(|n| n.contains(ip)),
            ClusterPeer::Nodes(nodes) => self
                .nodes
                .values()
                .any(|n| nodes.matches(&n.labels) && n.addresses.contains(&ip)),
            ClusterPeer::DomainNames => false,
        }
    }

    fn rule_matches(&self, rule: &ClusterRule, connection: &Connection<'_>) -> bool {
        if rule.failed_closed {
            return rule.action != Action::Accept;
        }
        rule.peers
            .iter()
            .any(|p| self.peer_holds(p, connection.peer))
            && rule.protocols.as_ref().is_none_or(|protocols| {
                protocols
                    .iter()
                    .any(|p| port_holds(p, connection.protocol, connection.port, connection.named))
            })
    }
}

/// Whether a `protocols` entry holds `protocol`/`port`, a named port resolved against
/// `named` (the destination pod's container ports).
pub fn port_holds(entry: &ClusterPort, protocol: u8, port: u16, named: &[NamedPort]) -> bool {
    match entry {
        ClusterPort::Numbers {
            protocol: p,
            first,
            last,
        } => *p == protocol && (*first..=*last).contains(&port),
        ClusterPort::Named(name) => named
            .iter()
            .any(|n| n.name == *name && n.protocol == protocol && n.port == port),
    }
}

struct Connection<'a> {
    peer: IpAddr,
    protocol: u8,
    port: u16,
    named: &'a [NamedPort],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::objects::{PolicyInfo, SlimPod, TCP};
    use serde_json::{Value, json};
    use std::sync::Arc;

    fn pod(ns: &str, name: &str, labels: Value, ip: &str) -> (String, Arc<PodInfo>) {
        let slim: SlimPod = serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "labels": labels},
            "status": {"podIPs": [{"ip": ip}]},
        }))
        .unwrap();
        let info = PodInfo::from_slim(&slim);
        (info.key(), Arc::new(info))
    }

    fn cnp(
        name: &str,
        tier: &str,
        priority: u32,
        ingress: Value,
    ) -> (String, Arc<ClusterPolicyInfo>) {
        let info = ClusterPolicyInfo::read(
            name,
            &json!({"tier": tier, "priority": priority,
                    "subject": {"namespaces": {}}, "ingress": ingress}),
        );
        assert!(info.problems.is_empty(), "{:?}", info.problems);
        (name.to_owned(), Arc::new(info))
    }

    #[test]
    fn the_first_matching_rule_of_the_first_tier_decides_and_pass_goes_on() {
        let pods = BTreeMap::from([
            pod("a", "x", json!({"app": "x"}), "10.0.0.1"),
            pod("b", "y", json!({}), "10.0.0.2"),
        ]);
        let namespaces = BTreeMap::from([
            ("a".into(), Arc::new(Labels::new())),
            ("b".into(), Arc::new(Labels::new())),
        ]);
        let policies = ItemMap::<PolicyInfo>::new();
        let view = View::new(&pods, &namespaces, &policies);
        let nodes = BTreeMap::new();
        let from_x = json!([{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "x"}}}}]);
        let cnps = BTreeMap::from([
            cnp(
                "deny",
                "Admin",
                20,
                json!([{"action": "Deny", "from": from_x}]),
            ),
            cnp(
                "pass",
                "Admin",
                10,
                json!([{"name": "p", "action": "Pass", "from": from_x}]),
            ),
            cnp(
                "base",
                "Baseline",
                0,
                json!([{"action": "Deny", "from": [{"namespaces": {}}],
                "protocols": [{"tcp": {"destinationPort": {"number": 80}}}]}]),
            ),
        ]);
        let tiered = TieredView::new(&view, &cnps, &nodes);
        let (x, y) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let verdict = tiered.verdict(x, y, TCP, 80);
        assert!(!verdict.allowed());
        let decided = &verdict.ingress.as_ref().unwrap().decided;
        assert_eq!(decided.tier, Some(Tier::Baseline));
        assert_eq!(decided.rule.as_ref().unwrap().policy, "base");
        assert_eq!(decided.passed.len(), 1);
        assert_eq!(decided.passed[0].name, "p");
        // Another port: nothing in Baseline matches, the default allows.
        let verdict = tiered.verdict(x, y, TCP, 81);
        assert!(verdict.allowed());
        assert_eq!(verdict.ingress.unwrap().decided.tier, None);
        // Not from x: the Admin rules do not match; Baseline denies port 80.
        assert!(!tiered.verdict(y, x, TCP, 80).allowed());
        // A pod to itself is not judged.
        assert!(tiered.verdict(y, y, TCP, 80).allowed());
    }
}
