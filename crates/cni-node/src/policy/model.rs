//! NetworkPolicy's meaning, written once as plain code over the agent's view: whether
//! a connection from an address to a pod is allowed, and which policies decided it.
//! `cni-node explain` answers from it, and the tests compare the kernel's behaviour
//! with it; the datapath is compiled from the same selectors and peers
//! ([`super::compile`]).
//!
//! The rules (networking.k8s.io/v1): a pod is isolated for a direction once any policy
//! selecting it has that type; an isolated pod allows what any rule of any of those
//! policies allows (they add up); a connection passes only if the source pod's egress
//! and the destination pod's ingress both allow it. Selectors never match hostNetwork
//! pods (they have the node's addresses): only `ipBlock` does. A pod reaching its own
//! address is not subject to policy (its packets never leave it); a pod reaching itself
//! through a Service address is, like any other connection: kube-proxy's DNAT on the
//! node makes the packet's source and destination the pod's address, and it passes the
//! node's forward hook both ways ([`View::verdict_through_service`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use super::objects::{NamedPort, Peer, PodInfo, PolicyInfo, PolicyPort, PortRef, Rule};
use super::selector::{Labels, Selector};
use crate::store::ItemMap;

/// The objects policy is judged on.
#[derive(Debug)]
pub struct View<'a> {
    /// Pods by `namespace/name`.
    pub pods: &'a ItemMap<PodInfo>,
    /// Namespaces' labels by name.
    pub namespaces: &'a ItemMap<Labels>,
    /// Policies by `namespace/name`.
    pub policies: &'a ItemMap<PolicyInfo>,
    /// Pods by address, made on first use (the model's verdicts need it, the compile
    /// does not).
    by_ip: std::cell::OnceCell<HashMap<IpAddr, &'a PodInfo>>,
    /// Addresses the CNI plugin recorded on this node, with their pods: a new pod's
    /// addresses before the API shows them, and the owner of an address the API still
    /// shows on a pod that is leaving.
    records: BTreeMap<IpAddr, String>,
    /// Recorded addresses by pod.
    recorded: HashMap<String, Vec<IpAddr>>,
    /// The pods of `recorded`, known by address without making their keys.
    recorded_pods: HashSet<*const PodInfo>,
}

/// One direction's judgement.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Side {
    /// Policies that select the pod for this direction (empty: not isolated).
    pub isolated_by: Vec<String>,
    /// Those of them with a rule that allows the connection.
    pub allowed_by: Vec<String>,
}

impl Side {
    /// Whether the direction lets the connection pass.
    pub fn allowed(&self) -> bool {
        self.isolated_by.is_empty() || !self.allowed_by.is_empty()
    }
}

/// The judgement of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The source pod's egress, when the source is a pod.
    pub egress: Option<Side>,
    /// The destination pod's ingress, when the destination is a pod.
    pub ingress: Option<Side>,
    /// The source and the destination are the same pod.
    pub same_pod: bool,
}

impl Verdict {
    /// Whether the connection passes.
    pub fn allowed(&self) -> bool {
        self.same_pod
            || (self.egress.as_ref().is_none_or(Side::allowed)
                && self.ingress.as_ref().is_none_or(Side::allowed))
    }
}

impl<'a> View<'a> {
    /// A view over the stores' items.
    pub fn new(
        pods: &'a ItemMap<PodInfo>,
        namespaces: &'a ItemMap<Labels>,
        policies: &'a ItemMap<PolicyInfo>,
    ) -> Self {
        Self::with_records(pods, namespaces, policies, BTreeMap::new())
    }

    /// A view over the stores' items and this node's pod records (address -> pod
    /// key): a recorded address is its recorded pod's, whatever the API shows yet.
    pub fn with_records(
        pods: &'a ItemMap<PodInfo>,
        namespaces: &'a ItemMap<Labels>,
        policies: &'a ItemMap<PolicyInfo>,
        records: BTreeMap<IpAddr, String>,
    ) -> Self {
        let mut recorded: HashMap<String, Vec<IpAddr>> = HashMap::new();
        let mut recorded_pods = HashSet::new();
        for (ip, key) in &records {
            if let Some(pod) = pods.get(key).filter(|p| !p.host_network) {
                recorded.entry(key.clone()).or_default().push(*ip);
                recorded_pods.insert(Arc::as_ptr(pod));
            }
        }
        Self {
            pods,
            namespaces,
            policies,
            by_ip: std::cell::OnceCell::new(),
            records,
            recorded,
            recorded_pods,
        }
    }

    fn by_ip(&self) -> &HashMap<IpAddr, &'a PodInfo> {
        self.by_ip.get_or_init(|| {
            // Sized for an address a pod from the start: growing it rehashes every
            // address again.
            let mut by_ip: HashMap<IpAddr, &'a PodInfo> =
                HashMap::with_capacity(self.pods.len() + self.records.len());
            by_ip.extend(
                self.pods
                    .values()
                    .filter(|p| !p.host_network)
                    .flat_map(|p| p.ips.iter().map(move |ip| (*ip, &**p))),
            );
            for (ip, key) in &self.records {
                match self.pods.get(key).filter(|p| !p.host_network) {
                    Some(pod) => {
                        by_ip.insert(*ip, pod);
                    }
                    // The pod is not (or no longer) known: the address is nobody's.
                    None => {
                        by_ip.remove(ip);
                    }
                }
            }
            by_ip
        })
    }

    /// Every address a (non-hostNetwork) pod holds, with that pod: the addresses of
    /// [`View::ips`] over all pods, each with the pod [`View::pod_at`] names; in the
    /// addresses' order. Made by one walk over the pods, without the map of
    /// [`View::pod_at`], which the compile has no other use for.
    pub fn held(&self) -> impl Iterator<Item = (IpAddr, &'a PodInfo)> + use<'a> {
        let mut pairs: Vec<(IpAddr, &'a PodInfo)> = Vec::with_capacity(self.pods.len());
        for pod in self.pods.values().filter(|p| !p.host_network) {
            let recorded = self.recorded_pods.contains(&Arc::as_ptr(pod))
                || pod.ips.iter().any(|ip| self.records.contains_key(ip));
            if recorded {
                pairs.extend(self.ips_of(pod).iter().map(|ip| (*ip, &**pod)));
            } else {
                pairs.extend(pod.ips.iter().map(|ip| (*ip, &**pod)));
            }
        }
        // An address that two pods show is the later one's (in key order), as for
        // `pod_at`; the sort keeps their order.
        pairs.sort_by_key(|(ip, _)| *ip);
        let mut held: Vec<(IpAddr, &'a PodInfo)> = Vec::with_capacity(pairs.len());
        for pair in pairs {
            match held.last_mut() {
                Some(last) if last.0 == pair.0 => *last = pair,
                _ => held.push(pair),
            }
        }
        held.into_iter()
    }

    /// This node's pod records: address -> pod key.
    pub fn records(&self) -> &BTreeMap<IpAddr, String> {
        &self.records
    }

    /// A pod's addresses: those the API shows, less any recorded for another pod,
    /// and those recorded for it.
    pub fn ips(&self, pod: &PodInfo) -> Vec<IpAddr> {
        self.ips_of(pod).into_owned()
    }

    /// [`View::ips`], borrowed from the pod when no record changes them.
    pub fn ips_of<'p>(&self, pod: &'p PodInfo) -> std::borrow::Cow<'p, [IpAddr]> {
        if pod.host_network || self.records.is_empty() {
            return std::borrow::Cow::Borrowed(&pod.ips);
        }
        let key = pod.key();
        let mut out: Vec<IpAddr> = pod
            .ips
            .iter()
            .copied()
            .filter(|ip| self.records.get(ip).is_none_or(|owner| *owner == key))
            .collect();
        for ip in self.recorded.get(&key).into_iter().flatten() {
            if !out.contains(ip) {
                out.push(*ip);
            }
        }
        std::borrow::Cow::Owned(out)
    }

    /// The (non-hostNetwork) pod holding `ip`.
    pub fn pod_at(&self, ip: IpAddr) -> Option<&'a PodInfo> {
        self.by_ip().get(&ip).copied()
    }

    /// Whether `policy` selects `pod`.
    pub fn selects(policy: &PolicyInfo, pod: &PodInfo) -> bool {
        !pod.host_network
            && policy.namespace == pod.namespace
            && policy.pod_selector.matches(&pod.labels)
    }

    /// Whether a selector peer of a policy in `namespace` matches `pod`.
    pub fn peer_selects(&self, namespace: &str, peer: &Peer, pod: &PodInfo) -> bool {
        match peer {
            Peer::IpBlock { .. } => false,
            Peer::Pods { .. } if pod.host_network => false,
            Peer::Pods {
                namespaces: None,
                pods,
            } => pod.namespace == namespace && pods.matches(&pod.labels),
            Peer::Pods {
                namespaces: Some(namespaces),
                pods,
            } => self.namespace_selected(&pod.namespace, namespaces) && pods.matches(&pod.labels),
        }
    }

    /// Whether a peer's namespace selector selects the namespace `name`. A namespace
    /// that is not (yet) known is selected only by a selector of every namespace.
    pub fn namespace_selected(&self, name: &str, selector: &Selector) -> bool {
        match self.namespaces.get(name) {
            Some(labels) => selector.matches(labels),
            None => selector.is_everything(),
        }
    }

    /// Whether `peer` matches the address `ip`.
    pub fn peer_matches(&self, namespace: &str, peer: &Peer, ip: IpAddr) -> bool {
        match peer {
            Peer::IpBlock { cidr, except } => {
                cidr.contains(ip) && !except.iter().any(|e| e.contains(ip))
            }
            Peer::Pods { .. } => self
                .pod_at(ip)
                .is_some_and(|pod| self.peer_selects(namespace, peer, pod)),
        }
    }

    /// Whether `rule` of a policy in `namespace` allows the peer `ip` on
    /// `protocol`/`port`, named ports resolved against `named` (the destination
    /// pod's).
    pub fn rule_allows(
        &self,
        namespace: &str,
        rule: &Rule,
        ip: IpAddr,
        protocol: u8,
        port: u16,
        named: &[NamedPort],
    ) -> bool {
        let peer_ok = rule
            .peers
            .as_ref()
            .is_none_or(|peers| peers.iter().any(|p| self.peer_matches(namespace, p, ip)));
        let port_ok = rule
            .ports
            .as_ref()
            .is_none_or(|ports| ports.iter().any(|p| port_matches(p, protocol, port, named)));
        peer_ok && port_ok
    }

    /// Judges a connection from `src` to `dst` on `protocol`/`port`.
    pub fn verdict(&self, src: IpAddr, dst: IpAddr, protocol: u8, port: u16) -> Verdict {
        let src_pod = self.pod_at(src);
        let dst_pod = self.pod_at(dst);
        let same_pod = match (src_pod, dst_pod) {
            (Some(a), Some(b)) => a.key() == b.key(),
            _ => false,
        };
        let dst_named: &[NamedPort] = dst_pod.map_or(&[], |p| &p.named_ports);
        let egress = src_pod.map(|pod| {
            self.side(
                pod,
                |p| p.egress.as_deref(),
                |ns, rule| self.rule_allows(ns, rule, dst, protocol, port, dst_named),
            )
        });
        let ingress = dst_pod.map(|pod| {
            self.side(
                pod,
                |p| p.ingress.as_deref(),
                |ns, rule| self.rule_allows(ns, rule, src, protocol, port, &pod.named_ports),
            )
        });
        Verdict {
            egress,
            ingress,
            same_pod,
        }
    }

    /// Judges a connection that `src` opened to a Service address, which kube-proxy's
    /// DNAT turned into `dst` and `port` (the pod's port, not the Service's). As
    /// [`Self::verdict`], but a pod reaching itself this way is judged like any other
    /// connection: the kernel sees a packet from the pod's address to the pod's address
    /// leave the pod and come back through the node, and judges it.
    pub fn verdict_through_service(
        &self,
        src: IpAddr,
        dst: IpAddr,
        protocol: u8,
        port: u16,
    ) -> Verdict {
        Verdict {
            same_pod: false,
            ..self.verdict(src, dst, protocol, port)
        }
    }

    fn side(
        &self,
        pod: &PodInfo,
        rules_of: impl Fn(&PolicyInfo) -> Option<&[Rule]>,
        allows: impl Fn(&str, &Rule) -> bool,
    ) -> Side {
        let mut side = Side::default();
        for (key, policy) in self.policies {
            let Some(rules) = rules_of(policy) else {
                continue;
            };
            if !Self::selects(policy, pod) {
                continue;
            }
            side.isolated_by.push(key.clone());
            if rules.iter().any(|r| allows(&policy.namespace, r)) {
                side.allowed_by.push(key.clone());
            }
        }
        side
    }
}

/// Whether a rule's port entry matches `protocol`/`port`; a named port resolves against
/// `named`, and one the pod does not have matches nothing.
pub fn port_matches(entry: &PolicyPort, protocol: u8, port: u16, named: &[NamedPort]) -> bool {
    if entry.protocol != protocol {
        return false;
    }
    match &entry.port {
        PortRef::Any => true,
        PortRef::Range(a, b) => (*a..=*b).contains(&port),
        PortRef::Named(name) => named
            .iter()
            .any(|n| n.name == *name && n.protocol == protocol && n.port == port),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::objects::{SlimNetworkPolicy, TCP, UDP};
    use serde_json::{Value, json};
    use std::sync::Arc;

    /// `held` walks the pods and gives what `pod_at` says of each address: a recorded
    /// address is its recorded pod's, an address two pods show is the later one's, and
    /// hostNetwork pods hold none.
    #[test]
    fn held_addresses_are_those_pod_at_names() {
        let pod = |key: &str, ips: &[&str], host_network: bool| {
            let (namespace, name) = key.split_once('/').unwrap();
            let info = PodInfo {
                namespace: namespace.into(),
                name: name.into(),
                host_network,
                ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
                ..PodInfo::default()
            };
            (key.to_owned(), Arc::new(info))
        };
        let pods: ItemMap<PodInfo> = [
            pod("x/a", &["10.0.0.1"], false),
            pod("x/b", &["10.0.0.1", "10.0.0.2"], false),
            pod("x/c", &["10.0.0.3"], true),
            pod("y/a", &["10.0.0.4"], false),
            pod("y/b", &[], false),
            pod("y/c", &["10.0.0.5", "fd00::5"], false),
        ]
        .into_iter()
        .collect();
        let records: BTreeMap<IpAddr, String> = [
            ("10.0.0.4", "y/b"),
            ("10.0.0.5", "gone/pod"),
            ("10.0.0.6", "y/a"),
            ("10.0.0.7", "x/c"),
        ]
        .into_iter()
        .map(|(ip, key)| (ip.parse().unwrap(), key.to_owned()))
        .collect();
        let namespaces = BTreeMap::new();
        let policies = BTreeMap::new();
        let view = View::with_records(&pods, &namespaces, &policies, records);
        let held: Vec<(String, String)> = view
            .held()
            .map(|(ip, pod)| (ip.to_string(), pod.key()))
            .collect();
        let want: Vec<(String, String)> = [
            ("10.0.0.1", "x/b"),
            ("10.0.0.2", "x/b"),
            ("10.0.0.4", "y/b"),
            ("10.0.0.6", "y/a"),
            ("fd00::5", "y/c"),
        ]
        .into_iter()
        .map(|(ip, key)| (ip.to_owned(), key.to_owned()))
        .collect();
        assert_eq!(held, want);
        for (ip, key) in &want {
            assert_eq!(
                view.pod_at(ip.parse().unwrap()).map(PodInfo::key).as_ref(),
                Some(key)
            );
        }
        for ip in ["10.0.0.3", "10.0.0.5", "10.0.0.7"] {
            assert_eq!(view.pod_at(ip.parse().unwrap()), None, "{ip}");
        }
    }

    /// The upstream suite's cluster: namespaces x, y, z (label `ns=<name>`), pods a, b, c
    /// in each (label `pod=<name>`), each serving 80 and 81 on TCP and UDP with named
    /// ports `serve-80-tcp` and so on.
    pub(crate) fn cluster() -> (ItemMap<PodInfo>, ItemMap<Labels>) {
        let mut pods = BTreeMap::new();
        let mut namespaces = BTreeMap::new();
        for (n, ns) in ["x", "y", "z"].iter().enumerate() {
            namespaces.insert(
                (*ns).to_owned(),
                std::sync::Arc::new(
                    [
                        ("ns".to_owned(), (*ns).to_owned()),
                        ("kubernetes.io/metadata.name".to_owned(), (*ns).to_owned()),
                    ]
                    .into_iter()
                    .collect(),
                ),
            );
            for (i, name) in ["a", "b", "c"].iter().enumerate() {
                let mut named_ports = Vec::new();
                for port in [80, 81] {
                    for (protocol, p) in [(TCP, "tcp"), (UDP, "udp")] {
                        named_ports.push(NamedPort {
                            name: format!("serve-{port}-{p}"),
                            protocol,
                            port,
                        });
                    }
                }
                let pod = PodInfo {
                    namespace: (*ns).to_owned(),
                    name: (*name).to_owned(),
                    labels: [("pod".to_owned(), (*name).to_owned())]
                        .into_iter()
                        .collect(),
                    node: if i == 0 { "n1" } else { "n2" }.into(),
                    ips: vec![
                        format!("10.244.{n}.{}", i + 10).parse().unwrap(),
                        format!("fd00::{n}:{}", i + 10).parse().unwrap(),
                    ],
                    named_ports,
                    ..PodInfo::default()
                };
                pods.insert(pod.key(), std::sync::Arc::new(pod));
            }
        }
        (pods, namespaces)
    }

    pub(crate) fn policy(ns: &str, name: &str, spec: Value) -> (String, Arc<PolicyInfo>) {
        let slim: SlimNetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns}, "spec": spec,
        }))
        .unwrap();
        let info = PolicyInfo::from_slim(&slim);
        (info.key(), Arc::new(info))
    }

    fn ip(pods: &ItemMap<PodInfo>, key: &str) -> IpAddr {
        pods[key].ips[0]
    }

    #[test]
    fn default_deny_ingress_isolates_only_its_namespace() {
        let (pods, ns) = cluster();
        let policies: BTreeMap<_, _> = [policy("x", "deny", json!({"podSelector": {}}))]
            .into_iter()
            .collect();
        let v = View::new(&pods, &ns, &policies);
        let to_xa = v.verdict(ip(&pods, "y/b"), ip(&pods, "x/a"), TCP, 80);
        assert!(!to_xa.allowed());
        assert_eq!(to_xa.ingress.unwrap().isolated_by, vec!["x/deny"]);
        assert!(
            v.verdict(ip(&pods, "x/a"), ip(&pods, "y/b"), TCP, 80)
                .allowed()
        );
        // From outside the cluster (an address that is no pod) too.
        assert!(
            !v.verdict("192.0.2.1".parse().unwrap(), ip(&pods, "x/a"), TCP, 80)
                .allowed()
        );
        // A pod to its own address is never judged; through a Service address it is.
        assert!(
            v.verdict(ip(&pods, "x/a"), ip(&pods, "x/a"), TCP, 80)
                .allowed()
        );
        let hairpin = v.verdict_through_service(ip(&pods, "x/a"), ip(&pods, "x/a"), TCP, 80);
        assert!(
            !hairpin.allowed(),
            "x/deny isolates x/a from itself too: {hairpin:?}"
        );
    }

    #[test]
    fn selectors_and_peers_combine_as_the_api_says() {
        let (pods, ns) = cluster();
        let policies: BTreeMap<_, _> = [policy(
            "x",
            "allow",
            json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [
                    // AND within a peer: pods b of namespace y.
                    {"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "b"}}},
                    // OR across peers: pod c of x.
                    {"podSelector": {"matchLabels": {"pod": "c"}}},
                ], "ports": [{"port": "serve-81-tcp"}]}],
            }),
        )]
        .into_iter()
        .collect();
        let v = View::new(&pods, &ns, &policies);
        let xa = ip(&pods, "x/a");
        for (src, port, want) in [
            ("y/b", 81, true),
            ("x/c", 81, true),
            ("y/b", 80, false),
            ("y/a", 81, false),
            ("z/b", 81, false),
            ("x/b", 81, false),
        ] {
            let got = v.verdict(ip(&pods, src), xa, TCP, port).allowed();
            assert_eq!(got, want, "{src} -> x/a:{port}");
        }
        // UDP 81 is another named port.
        assert!(!v.verdict(ip(&pods, "y/b"), xa, UDP, 81).allowed());
    }

    #[test]
    fn egress_and_ingress_both_apply_and_policies_add_up() {
        let (pods, ns) = cluster();
        let policies: BTreeMap<_, _> = [
            policy(
                "x",
                "egress-deny",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"]}),
            ),
            policy(
                "x",
                "egress-to-y",
                json!({
                    "podSelector": {"matchLabels": {"pod": "a"}},
                    "policyTypes": ["Egress"],
                    "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}],
                }),
            ),
            policy(
                "y",
                "deny",
                json!({"podSelector": {"matchLabels": {"pod": "b"}}}),
            ),
        ]
        .into_iter()
        .collect();
        let v = View::new(&pods, &ns, &policies);
        let xa = ip(&pods, "x/a");
        let verdict = v.verdict(xa, ip(&pods, "y/a"), TCP, 80);
        assert!(verdict.allowed(), "{verdict:?}");
        assert_eq!(verdict.egress.unwrap().allowed_by, vec!["x/egress-to-y"]);
        assert!(!v.verdict(xa, ip(&pods, "z/a"), TCP, 80).allowed());
        // y/b's ingress deny still applies though x/a's egress allows it.
        let verdict = v.verdict(xa, ip(&pods, "y/b"), TCP, 80);
        assert!(!verdict.allowed());
        assert!(verdict.egress.unwrap().allowed());
    }

    #[test]
    fn ip_blocks_with_except_and_end_ports() {
        let (pods, ns) = cluster();
        let policies: BTreeMap<_, _> = [policy(
            "x",
            "blocks",
            json!({
                "podSelector": {},
                "ingress": [{"from": [{"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.1.0/24"]}}],
                             "ports": [{"port": 80, "endPort": 81}]}],
            }),
        )]
        .into_iter()
        .collect();
        let v = View::new(&pods, &ns, &policies);
        let xa = ip(&pods, "x/a");
        assert!(v.verdict(ip(&pods, "z/b"), xa, TCP, 81).allowed());
        assert!(!v.verdict(ip(&pods, "z/b"), xa, TCP, 82).allowed());
        assert!(
            !v.verdict(ip(&pods, "y/b"), xa, TCP, 80).allowed(),
            "y is 10.244.1.0/24"
        );
        // IPv6 sources are outside the IPv4 block.
        assert!(
            !v.verdict(pods["z/b"].ips[1], pods["x/a"].ips[1], TCP, 80)
                .allowed()
        );
    }

    #[test]
    fn a_named_port_the_pod_lacks_matches_nothing_and_host_network_pods_are_no_pods() {
        let (mut pods, ns) = cluster();
        let mut host = (*pods["z/c"]).clone();
        host.name = "node-dns".into();
        host.host_network = true;
        host.ips = vec!["198.18.0.11".parse().unwrap()];
        pods.insert(host.key(), Arc::new(host));
        let policies: BTreeMap<_, _> = [policy(
            "x",
            "p",
            json!({
                "podSelector": {},
                "ingress": [{"from": [{"namespaceSelector": {}}], "ports": [{"port": "no-such-port"}]},
                            {"from": [{"namespaceSelector": {}}], "ports": [{"port": 80}]}],
            }),
        )]
        .into_iter()
        .collect();
        let v = View::new(&pods, &ns, &policies);
        let xa = ip(&pods, "x/a");
        assert!(!v.verdict(ip(&pods, "y/a"), xa, TCP, 81).allowed());
        assert!(v.verdict(ip(&pods, "y/a"), xa, TCP, 80).allowed());
        assert!(
            !v.verdict("198.18.0.11".parse().unwrap(), xa, TCP, 80)
                .allowed(),
            "a hostNetwork pod is not matched by a namespace selector"
        );
    }
}
