//! The tiered policy oracle (`cni_blackbox::policy_oracle` with ClusterNetworkPolicies)
//! checked without root against every subtest of network-policy-api's conformance suite
//! (`cluster_network_policy_cases`: 24 tests, 92 subtests, standard and experimental),
//! on upstream's own base: its five namespaces and ten pods (two on the host network),
//! spread over two dual-stack nodes.
//!
//! Each test starts from the base with its manifests; its subtests run in order, each
//! making its changes and then probing; every probe is judged by the oracle from the
//! objects as the API server would hold them at that moment, for IPv4 and (where the
//! subtest's expectations hold for it) IPv6, and must give upstream's verdict.
//!
//! The agent's own model (`cni_node::policy::cluster_model`, read from the same objects as
//! the agent reads them) is held to the same subtests and to the oracle, direction by
//! direction (tier, policy, rule, the Pass rules on the way), on random clusters.
//!
//! Then properties of the tiers on random ClusterNetworkPolicies over the same base
//! (`PROPTEST_CASES` sets how many, default 200): the order the objects come in changes
//! no verdict and no named decider; Pass rules alone change no verdict of the
//! NetworkPolicies'; a first Admin deny decides every pod-to-pod connection.

mod cluster_network_policy_cases;

use std::collections::BTreeMap;
use std::net::IpAddr;

use cluster_network_policy_cases::{
    Action, Case, HOST_NETWORK_HOUSE, HOST_PORTS, HOUSES, experimental, house_of, namespace,
    standard,
};
use cni_blackbox::policy_oracle::Oracle;
use cni_kube_api::{network_policy, realistic_namespace, realistic_node, realistic_pod};
use serde_json::{Value, json};

/// Node `n`'s addresses (1 or 2).
fn node_ips(n: u8) -> (IpAddr, IpAddr) {
    (
        IpAddr::from([198, 18, 0, 10 + n]),
        format!("fd00:18::{:x}", 0x10 + n)
            .parse()
            .expect("an address"),
    )
}

/// Upstream's base, and what a test has done to it so far.
struct Base {
    /// Pod name to (house, node, IPv4, IPv6).
    pods: BTreeMap<String, (&'static str, u8, IpAddr, IpAddr)>,
    namespace_labels: BTreeMap<&'static str, Vec<(&'static str, &'static str)>>,
    network_policies: BTreeMap<String, Value>,
    cluster_policies: BTreeMap<String, Value>,
}

impl Base {
    fn new() -> Self {
        let mut pods = BTreeMap::new();
        let mut namespace_labels = BTreeMap::new();
        for (h, (house, set)) in HOUSES.iter().enumerate() {
            namespace_labels.insert(*house, vec![("conformance-house", *house)]);
            for i in 0..2u8 {
                // A StatefulSet's two pods land on the two nodes.
                let node = 1 + i;
                let (v4, v6) = if *house == HOST_NETWORK_HOUSE {
                    node_ips(node)
                } else {
                    let host = 10 + 2 * h as u8 + i;
                    (
                        IpAddr::from([10, 244, node, host]),
                        format!("fd00:244:0:{node}::{host:x}")
                            .parse()
                            .expect("an address"),
                    )
                };
                pods.insert(format!("{set}-{i}"), (*house, node, v4, v6));
            }
        }
        Self {
            pods,
            namespace_labels,
            network_policies: BTreeMap::new(),
            cluster_policies: BTreeMap::new(),
        }
    }

    fn ip(&self, pod: &str, v6: bool) -> IpAddr {
        let (_, _, v4, v6_ip) = self.pods[pod];
        if v6 { v6_ip } else { v4 }
    }

    fn act(&mut self, action: &Action) -> Result<(), String> {
        match action {
            Action::Apply(policy) => {
                let name = policy["metadata"]["name"].as_str().unwrap_or_default();
                self.cluster_policies
                    .insert(name.to_owned(), policy.clone());
            }
            Action::Edit(name, change) => {
                let policy = self
                    .cluster_policies
                    .get_mut(*name)
                    .ok_or_else(|| format!("no ClusterNetworkPolicy {name} to change"))?;
                change.apply(policy)?;
            }
            Action::NetworkPolicy(house, name, spec) => {
                self.network_policies.insert(
                    format!("{house}/{name}"),
                    network_policy(&namespace(house), name, spec.clone()),
                );
            }
            Action::DeleteNetworkPolicy(house, name) => {
                self.network_policies
                    .remove(&format!("{house}/{name}"))
                    .ok_or_else(|| format!("no NetworkPolicy {house}/{name} to delete"))?;
            }
            Action::NamespaceLabels(house, labels) => {
                self.namespace_labels.insert(house, labels.clone());
            }
        }
        Ok(())
    }

    fn pod_objects(&self) -> Vec<Value> {
        self.pods
            .iter()
            .map(|(name, (house, node, v4, v6))| {
                let index = name.rsplit_once('-').map_or("0", |(_, i)| i);
                let ips = [v4.to_string(), v6.to_string()];
                let mut pod = realistic_pod(
                    &namespace(house),
                    name,
                    &format!("node-{node}"),
                    &[ips[0].as_str(), ips[1].as_str()],
                    &[
                        ("conformance-house", house),
                        ("statefulset.kubernetes.io/pod-name", name),
                        ("apps.kubernetes.io/pod-index", index),
                    ],
                );
                let named = |name: String, port: u16, protocol: &str| {
                    json!({"name": name, "containerPort": port, "protocol": protocol})
                };
                let ports = if *house == HOST_NETWORK_HOUSE {
                    let p = HOST_PORTS;
                    pod["spec"]["hostNetwork"] = json!(true);
                    vec![
                        named(format!("web-{}", p[0]), p[0], "TCP"),
                        named(format!("web-{}", p[1]), p[1], "TCP"),
                        named(format!("dns-{}", p[2]), p[2], "UDP"),
                        named(format!("dns-{}", p[4]), p[4], "UDP"),
                    ]
                } else {
                    vec![named("web".into(), 80, "TCP"), named("dns".into(), 53, "UDP")]
                };
                pod["spec"]["containers"][0]["ports"] = json!(ports);
                pod["spec"]["containers"][1]["ports"] = json!([]);
                let (host4, host6) = node_ips(*node);
                pod["status"]["hostIP"] = json!(host4.to_string());
                pod["status"]["hostIPs"] = json!([{"ip": host4.to_string()}, {"ip": host6.to_string()}]);
                pod
            })
            .collect()
    }

    /// The Namespaces and Nodes as the API server would hold them now.
    fn namespace_and_node_objects(&self) -> (Vec<Value>, Vec<Value>) {
        let namespaces: Vec<Value> = self
            .namespace_labels
            .iter()
            .map(|(house, labels)| realistic_namespace(&namespace(house), labels))
            .collect();
        let nodes: Vec<Value> = [1, 2]
            .into_iter()
            .map(|n| {
                let (v4, v6) = node_ips(n);
                realistic_node(
                    &format!("node-{n}"),
                    &[&format!("10.244.{n}.0/24"), &format!("fd00:244:0:{n}::/64")],
                    &[&v4.to_string(), &v6.to_string()],
                    2,
                )
            })
            .collect();
        (namespaces, nodes)
    }

    /// The agent's model of the objects now, ClusterNetworkPolicies included.
    fn agent(&self) -> agent::Agent {
        let (namespaces, nodes) = self.namespace_and_node_objects();
        agent::Agent::new(
            &self.pod_objects(),
            &namespaces,
            &nodes,
            self.network_policies.values(),
            self.cluster_policies.values(),
        )
    }

    /// The oracle of the objects now; without the ClusterNetworkPolicies unless
    /// `tiers`.
    fn oracle(&self, tiers: bool) -> Result<Oracle, String> {
        let pods = self.pod_objects();
        let (namespaces, nodes) = self.namespace_and_node_objects();
        Oracle::with_cluster_network_policies(
            &pods,
            &namespaces,
            &nodes,
            self.network_policies.values(),
            self.cluster_policies.values().filter(|_| tiers),
        )
    }
}

/// What a run of the suite found.
#[derive(Default)]
struct Outcome {
    subtests: usize,
    probes: usize,
    wrong: Vec<String>,
}

/// Runs `case` against the oracle; `with_cluster_policies: false` judges every probe
/// with the ClusterNetworkPolicies left out (the suite must then fail).
fn run(case: &Case, with_cluster_policies: bool, outcome: &mut Outcome) {
    let mut base = Base::new();
    let fail = |outcome: &mut Outcome, e: String| outcome.wrong.push(format!("{}: {e}", case.name));
    for action in &case.manifests {
        if let Err(e) = base.act(action) {
            return fail(outcome, e);
        }
    }
    for step in &case.steps {
        outcome.subtests += 1;
        for action in &step.actions {
            if let Err(e) = base.act(action) {
                return fail(outcome, e);
            }
        }
        let oracle = match base.oracle(with_cluster_policies) {
            Ok(oracle) => oracle,
            Err(e) => return fail(outcome, format!("the oracle cannot read the objects: {e}")),
        };
        for probe in &step.probes {
            for v6 in [false, true] {
                if v6 && !step.ipv6 {
                    continue;
                }
                outcome.probes += 1;
                let (from, to) = (base.ip(probe.from, v6), base.ip(probe.to, v6));
                let verdict = oracle.verdict(from, to, probe.protocol, probe.port);
                if verdict.allowed() != probe.allowed {
                    outcome.wrong.push(format!(
                        "  {} / {:?}: {} -> {} {}/{} IPv{}: upstream says {}, the oracle {} ({})",
                        case.name,
                        step.name,
                        probe.from,
                        probe.to,
                        probe.protocol,
                        probe.port,
                        if v6 { 6 } else { 4 },
                        if probe.allowed { "allowed" } else { "denied" },
                        if verdict.allowed() {
                            "allows"
                        } else {
                            "denies"
                        },
                        verdict.why(),
                    ));
                }
            }
        }
    }
}

/// Runs `case` against the agent's model (`cni_node::policy::cluster_model`): each
/// direction of each probe must be decided as the oracle decides it (tier, policy,
/// rule, Pass rules on the way), and the connection must get upstream's verdict, with
/// the node's reach of its own pods (the datapath's, before any tier) taken from the
/// oracle.
fn run_agent(case: &Case, outcome: &mut Outcome) {
    let mut base = Base::new();
    let fail = |outcome: &mut Outcome, e: String| outcome.wrong.push(format!("{}: {e}", case.name));
    for action in &case.manifests {
        if let Err(e) = base.act(action) {
            return fail(outcome, e);
        }
    }
    for step in &case.steps {
        outcome.subtests += 1;
        for action in &step.actions {
            if let Err(e) = base.act(action) {
                return fail(outcome, e);
            }
        }
        let oracle = match base.oracle(true) {
            Ok(oracle) => oracle,
            Err(e) => return fail(outcome, format!("the oracle cannot read the objects: {e}")),
        };
        let agent = base.agent();
        for probe in &step.probes {
            for v6 in [false, true] {
                if v6 && !step.ipv6 {
                    continue;
                }
                outcome.probes += 1;
                let (from, to) = (base.ip(probe.from, v6), base.ip(probe.to, v6));
                let expected = oracle.verdict(from, to, probe.protocol, probe.port);
                let got = agent.verdict(from, to, probe.protocol, probe.port);
                let at = format!(
                    "  {} / {:?}: {} -> {} {}/{} IPv{}",
                    case.name,
                    step.name,
                    probe.from,
                    probe.to,
                    probe.protocol,
                    probe.port,
                    if v6 { 6 } else { 4 },
                );
                if let Err(e) = agent::same(&expected, &got) {
                    outcome.wrong.push(format!("{at}: {e}"));
                }
                if agent::allowed(&got, expected.from_its_node) != probe.allowed {
                    outcome.wrong.push(format!(
                        "{at}: upstream says {}, the agent's model {:?}",
                        if probe.allowed { "allowed" } else { "denied" },
                        got
                    ));
                }
            }
        }
    }
}

fn suite() -> Vec<Case> {
    let base = Base::new();
    let ip_of = |pod: &str| base.ip(pod, false);
    let mut cases = standard(&ip_of);
    cases.extend(experimental());
    cases
}

#[test]
fn the_oracle_agrees_with_every_conformance_subtest() {
    let cases = suite();
    for case in &cases {
        for step in &case.steps {
            for probe in &step.probes {
                for pod in [probe.from, probe.to] {
                    assert!(house_of(pod).is_some(), "{}: no pod {pod}", case.name);
                }
            }
        }
    }
    let mut outcome = Outcome::default();
    for case in &cases {
        run(case, true, &mut outcome);
    }
    let experimental = cases.iter().filter(|c| c.experimental).count();
    println!(
        "{} conformance tests ({experimental} experimental), {} steps, {} probes: {} \
         disagreements with the oracle",
        cases.len(),
        outcome.subtests,
        outcome.probes,
        outcome.wrong.len()
    );
    assert!(outcome.wrong.is_empty(), "{}", outcome.wrong.join("\n"));
    assert_eq!(cases.len(), 24);
}

#[test]
fn the_agents_model_agrees_with_every_conformance_subtest() {
    let cases = suite();
    let mut outcome = Outcome::default();
    for case in &cases {
        run_agent(case, &mut outcome);
    }
    println!(
        "{} conformance tests, {} steps, {} probes: {} disagreements of the agent's model",
        cases.len(),
        outcome.subtests,
        outcome.probes,
        outcome.wrong.len()
    );
    assert!(outcome.wrong.is_empty(), "{}", outcome.wrong.join("\n"));
    assert!(outcome.probes > 0);
}

/// Without the ClusterNetworkPolicies every probe upstream expects denied is allowed
/// (nothing else in the suite denies), so the tables above can fail.
#[test]
fn without_the_cluster_policies_every_expected_denial_is_missed() {
    let cases = suite();
    let denials: usize = cases
        .iter()
        .flat_map(|c| &c.steps)
        .map(|s| s.probes.iter().filter(|p| !p.allowed).count() * if s.ipv6 { 2 } else { 1 })
        .sum();
    let mut outcome = Outcome::default();
    for case in &cases {
        run(case, false, &mut outcome);
    }
    // Nothing but the ClusterNetworkPolicies denies anything in the suite (the
    // integration test's NetworkPolicy allows what its probes try), so every expected
    // denial, and only those, must be missed.
    assert!(
        outcome
            .wrong
            .iter()
            .all(|w| w.contains("upstream says denied")),
        "{}",
        outcome.wrong.join("\n")
    );
    assert_eq!(
        outcome.wrong.len(),
        denials,
        "only {} of {denials} expected denials were missed",
        outcome.wrong.len()
    );
}

// ---------------------------------------------------------------------------------
// The agent's model, read from the same objects as the agent reads them.

mod agent {
    use std::collections::BTreeMap;
    use std::net::IpAddr;

    use cni_blackbox::policy_oracle::{self as oracle, Decision, Direction};
    use cni_node::node::SlimNode;
    use cni_node::policy::cluster_model::{self, NodePeer, TieredView};
    use cni_node::policy::cluster_objects::{self, ClusterPolicyInfo};
    use cni_node::policy::model::View;
    use cni_node::policy::objects::{
        PodInfo, PolicyInfo, SCTP, SlimClusterNetworkPolicy, SlimNamespace, SlimNetworkPolicy,
        SlimPod, TCP, UDP,
    };
    use cni_node::policy::pipeline::Tier;
    use cni_node::policy::selector::Labels;
    use cni_node::store::ItemMap;
    use serde_json::Value;
    use std::sync::Arc;

    /// The agent's items of some objects.
    pub struct Agent {
        pods: ItemMap<PodInfo>,
        namespaces: ItemMap<Labels>,
        policies: ItemMap<PolicyInfo>,
        cluster: ItemMap<ClusterPolicyInfo>,
        nodes: BTreeMap<String, NodePeer>,
    }

    fn slim<T: serde::de::DeserializeOwned>(value: &Value) -> T {
        serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{e}: {value}"))
    }

    impl Agent {
        pub fn new<'a>(
            pods: &[Value],
            namespaces: &[Value],
            nodes: &[Value],
            network_policies: impl IntoIterator<Item = &'a Value>,
            cluster_policies: impl IntoIterator<Item = &'a Value>,
        ) -> Self {
            let mut agent = Self {
                pods: BTreeMap::new(),
                namespaces: BTreeMap::new(),
                policies: BTreeMap::new(),
                cluster: BTreeMap::new(),
                nodes: BTreeMap::new(),
            };
            for pod in pods {
                let info = PodInfo::from_slim(&slim::<SlimPod>(pod));
                agent.pods.insert(info.key(), Arc::new(info));
            }
            for ns in namespaces {
                let ns: SlimNamespace = slim(ns);
                agent.namespaces.insert(
                    ns.metadata.name.clone().unwrap_or_default(),
                    Arc::new(ns.metadata.labels.clone().unwrap_or_default()),
                );
            }
            for node in nodes {
                let node: SlimNode = slim(node);
                agent.nodes.insert(
                    node.metadata.name.clone().unwrap_or_default(),
                    NodePeer::from_slim(&node),
                );
            }
            for policy in network_policies {
                let info = PolicyInfo::from_slim(&slim::<SlimNetworkPolicy>(policy));
                agent.policies.insert(info.key(), Arc::new(info));
            }
            for policy in cluster_policies {
                let info = ClusterPolicyInfo::from_slim(&slim::<SlimClusterNetworkPolicy>(policy));
                agent.cluster.insert(info.name.clone(), Arc::new(info));
            }
            agent
        }

        pub fn verdict(
            &self,
            from: IpAddr,
            to: IpAddr,
            protocol: &str,
            port: u16,
        ) -> cluster_model::Verdict {
            let view = View::new(&self.pods, &self.namespaces, &self.policies);
            let tiered = TieredView::new(&view, &self.cluster, &self.nodes);
            let protocol = match protocol {
                "TCP" => TCP,
                "UDP" => UDP,
                "SCTP" => SCTP,
                other => panic!("protocol {other}"),
            };
            tiered.verdict(from, to, protocol, port)
        }
    }

    /// Whether the connection passes, the node's reach of its own pods given.
    pub fn allowed(verdict: &cluster_model::Verdict, from_its_node: bool) -> bool {
        let allows =
            |d: &Option<cluster_model::Direction>| d.as_ref().is_none_or(|d| d.decided.allowed);
        verdict.same_pod || (allows(&verdict.egress) && (from_its_node || allows(&verdict.ingress)))
    }

    fn rule_text(rule: &oracle::RuleMatch) -> String {
        format!(
            "{:?} {} p{} #{} {:?} {:?}{}",
            rule.tier,
            rule.policy,
            rule.priority,
            rule.index,
            rule.name,
            rule.action,
            if rule.failed_closed {
                " failed closed"
            } else {
                ""
            }
        )
    }

    fn agent_rule_text(rule: &cluster_model::RuleMatch) -> String {
        let action = match rule.action {
            cluster_objects::Action::Accept => oracle::Action::Accept,
            cluster_objects::Action::Deny => oracle::Action::Deny,
            cluster_objects::Action::Pass => oracle::Action::Pass,
        };
        let tier = match rule.tier {
            Tier::Admin => oracle::Tier::Admin,
            Tier::NetworkPolicy => oracle::Tier::NetworkPolicy,
            Tier::Baseline => oracle::Tier::Baseline,
        };
        format!(
            "{tier:?} {} p{} #{} {:?} {action:?}{}",
            rule.policy,
            rule.priority,
            rule.index,
            rule.name,
            if rule.failed_closed {
                " failed closed"
            } else {
                ""
            }
        )
    }

    fn decision_text(d: &Decision) -> String {
        format!(
            "{:?} {} rule {:?} nps {:?} passed {:?}",
            d.tier,
            if d.allowed { "allowed" } else { "denied" },
            d.rule.as_ref().map(rule_text),
            d.network_policies,
            d.passed.iter().map(rule_text).collect::<Vec<_>>()
        )
    }

    fn agent_decision_text(d: &cluster_model::Decision) -> String {
        let tier = match d.tier {
            None => oracle::Tier::Default,
            Some(Tier::Admin) => oracle::Tier::Admin,
            Some(Tier::NetworkPolicy) => oracle::Tier::NetworkPolicy,
            Some(Tier::Baseline) => oracle::Tier::Baseline,
        };
        format!(
            "{tier:?} {} rule {:?} nps {:?} passed {:?}",
            if d.allowed { "allowed" } else { "denied" },
            d.rule.as_ref().map(agent_rule_text),
            d.network_policies,
            d.passed.iter().map(agent_rule_text).collect::<Vec<_>>()
        )
    }

    fn direction_text(d: &Option<Direction>) -> Option<String> {
        d.as_ref()
            .map(|d| format!("{}: {}", d.pod, decision_text(&d.decided)))
    }

    fn agent_direction_text(d: &Option<cluster_model::Direction>) -> Option<String> {
        d.as_ref()
            .map(|d| format!("{}: {}", d.pod, agent_decision_text(&d.decided)))
    }

    /// Whether the agent's model decides each direction as the oracle does.
    pub fn same(expected: &oracle::Verdict, got: &cluster_model::Verdict) -> Result<(), String> {
        let pairs = [
            (
                "same pod",
                format!("{}", expected.same_pod),
                format!("{}", got.same_pod),
            ),
            (
                "egress",
                format!("{:?}", direction_text(&expected.egress)),
                format!("{:?}", agent_direction_text(&got.egress)),
            ),
            (
                "ingress",
                format!("{:?}", direction_text(&expected.ingress)),
                format!("{:?}", agent_direction_text(&got.ingress)),
            ),
        ];
        let wrong: Vec<String> = pairs
            .iter()
            .filter(|(_, a, b)| a != b)
            .map(|(what, a, b)| format!("{what}: the oracle {a}, the agent {b}"))
            .collect();
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    }
}

// ---------------------------------------------------------------------------------
// Properties of the tiers on random ClusterNetworkPolicies over the same base.

mod properties {
    use super::*;
    use cni_blackbox::policy_oracle::{Tier, Verdict};
    use proptest::prelude::*;
    use proptest::sample::select;
    use proptest::test_runner::{Config, TestRunner};

    const HOUSE_NAMES: [&str; 5] = [
        "gryffindor",
        "slytherin",
        "hufflepuff",
        "ravenclaw",
        "forbidden-forrest",
    ];

    fn house_selector() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(json!({})),
            select(&HOUSE_NAMES[..]).prop_map(|h| json!({"matchLabels": {"conformance-house": h}})),
        ]
    }

    fn pod_selector() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(json!({})),
            select(vec!["0", "1"])
                .prop_map(|i| json!({"matchLabels": {"apps.kubernetes.io/pod-index": i}})),
        ]
    }

    fn peer() -> impl Strategy<Value = Value> {
        prop_oneof![
            house_selector().prop_map(|s| json!({"namespaces": s})),
            (house_selector(), pod_selector())
                .prop_map(|(n, p)| json!({"pods": {"namespaceSelector": n, "podSelector": p}})),
            select(vec![
                "0.0.0.0/0",
                "10.244.1.0/24",
                "10.244.2.14/32",
                "198.18.0.0/24"
            ])
            .prop_map(|c| json!({"networks": [c]})),
            select(vec![
                json!({}),
                json!({"matchLabels": {"kubernetes.io/hostname": "node-2"}})
            ])
            .prop_map(|s| json!({"nodes": s})),
            Just(json!({"domainNames": ["*.example.com"]})),
            Just(json!({"somethingNewer": {}})),
        ]
    }

    fn protocols() -> impl Strategy<Value = Option<Value>> {
        let entry = select(vec![
            json!({"tcp": {"destinationPort": {"number": 80}}}),
            json!({"udp": {"destinationPort": {"number": 53}}}),
            json!({"sctp": {}}),
            json!({"tcp": {"destinationPort": {"range": {"start": 1, "end": 100}}}}),
            json!({"destinationNamedPort": "web"}),
            json!({"destinationNamedPort": "dns"}),
        ]);
        proptest::option::of(proptest::collection::vec(entry, 1..=2).prop_map(Value::from))
    }

    fn rule(peers: &'static str) -> impl Strategy<Value = Value> {
        (
            select(vec!["Accept", "Deny", "Pass"]),
            proptest::collection::vec(peer(), 1..=2),
            protocols(),
        )
            .prop_map(move |(action, list, protocols)| {
                let mut rule = json!({"action": action, peers: list});
                if let Some(p) = protocols {
                    rule["protocols"] = p;
                }
                rule
            })
    }

    fn cluster_policy() -> impl Strategy<Value = Value> {
        (
            select(vec!["a", "b", "c", "d"]),
            select(vec!["Admin", "Baseline"]),
            0u32..3,
            prop_oneof![
                house_selector().prop_map(|s| json!({"namespaces": s})),
                (house_selector(), pod_selector())
                    .prop_map(|(n, p)| json!({"pods": {"namespaceSelector": n, "podSelector": p}})),
            ],
            proptest::collection::vec(rule("from"), 0..=3),
            proptest::collection::vec(rule("to"), 0..=3),
        )
            .prop_map(|(name, tier, priority, subject, ingress, egress)| {
                cni_kube_api::cluster_network_policy(
                    &format!("{name}-{}", tier.to_lowercase()),
                    json!({"tier": tier, "priority": priority, "subject": subject,
                           "ingress": ingress, "egress": egress}),
                )
            })
    }

    /// Names made unique (the API server keys them by name), in the order given.
    fn policies() -> impl Strategy<Value = Vec<Value>> {
        proptest::collection::vec(cluster_policy(), 0..=5).prop_map(|list| {
            let mut seen = std::collections::BTreeSet::new();
            list.into_iter()
                .filter(|p| seen.insert(p["metadata"]["name"].to_string()))
                .collect()
        })
    }

    const PROBES: [(&str, u16); 4] = [("TCP", 80), ("UDP", 53), ("SCTP", 9003), ("TCP", 8080)];

    /// Every verdict between the base's addresses (IPv4), in a fixed order.
    fn verdicts(base: &Base, cluster: &[Value]) -> Result<Vec<Verdict>, TestCaseError> {
        verdicts_with(base, &[], cluster)
    }

    /// [`verdicts`] with NetworkPolicies too.
    fn verdicts_with(
        base: &Base,
        network_policies: &[Value],
        cluster: &[Value],
    ) -> Result<Vec<Verdict>, TestCaseError> {
        let mut with = Base::new();
        with.namespace_labels = base.namespace_labels.clone();
        for policy in cluster {
            with.act(&Action::Apply(policy.clone()))
                .map_err(TestCaseError::fail)?;
        }
        // `Base` keys policies by name; keep the order given for the oracle.
        let pods = with.pod_objects();
        let namespaces: Vec<Value> = with
            .namespace_labels
            .iter()
            .map(|(house, labels)| realistic_namespace(&namespace(house), labels))
            .collect();
        let nodes: Vec<Value> = [1, 2]
            .into_iter()
            .map(|n| {
                let (v4, v6) = node_ips(n);
                realistic_node(
                    &format!("node-{n}"),
                    &[],
                    &[&v4.to_string(), &v6.to_string()],
                    0,
                )
            })
            .collect();
        let oracle = Oracle::with_cluster_network_policies(
            &pods,
            &namespaces,
            &nodes,
            network_policies,
            cluster,
        )
        .map_err(|e| TestCaseError::fail(format!("unreadable: {e}")))?;
        let mut all = Vec::new();
        for from in with.pods.keys() {
            for to in with.pods.keys() {
                for (protocol, port) in PROBES {
                    all.push(oracle.verdict(
                        with.ip(from, false),
                        with.ip(to, false),
                        protocol,
                        port,
                    ));
                }
            }
        }
        Ok(all)
    }

    fn runner() -> TestRunner {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(200);
        TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        })
    }

    /// NetworkPolicies a random cluster may hold beside its ClusterNetworkPolicies.
    fn network_policies() -> impl Strategy<Value = Vec<(&'static str, Value)>> {
        let slytherin =
            json!({"namespaceSelector": {"matchLabels": {"conformance-house": "slytherin"}}});
        let choices = vec![
            (
                "gryffindor",
                json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [slytherin.clone()]}], "egress": [{"to": [slytherin]}]}),
            ),
            (
                "hufflepuff",
                json!({"podSelector": {"matchLabels": {"apps.kubernetes.io/pod-index": "0"}},
                "ingress": [{"ports": [{"port": "web"}]}]}),
            ),
            (
                "ravenclaw",
                json!({"podSelector": {}, "policyTypes": ["Egress"],
                "egress": [{"to": [{"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.2.0/24"]}}]}]}),
            ),
            (
                "slytherin",
                json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
            ),
        ];
        proptest::collection::vec(select(choices), 0..=2)
    }

    /// The agent's model decides every direction of every probe between the base's
    /// addresses (both families) as the oracle does, on random ClusterNetworkPolicies,
    /// NetworkPolicies and namespace labels.
    #[test]
    fn the_agents_model_agrees_with_the_oracle_on_random_clusters() {
        let strategy = (
            policies(),
            network_policies(),
            proptest::option::of(select(&HOUSE_NAMES[..])),
        );
        let probes = std::cell::Cell::new(0usize);
        runner()
            .run(&strategy, |(cluster, nps, relabelled)| {
                let mut base = Base::new();
                for policy in &cluster {
                    base.act(&Action::Apply(policy.clone())).map_err(TestCaseError::fail)?;
                }
                for (i, (house, spec)) in nps.iter().enumerate() {
                    base.network_policies.insert(
                        format!("{house}/np-{i}"),
                        network_policy(&namespace(house), &format!("np-{i}"), spec.clone()),
                    );
                }
                if let Some(house) = relabelled {
                    // A namespace whose house label is another's.
                    base.namespace_labels.insert(house, vec![("conformance-house", "slytherin")]);
                }
                let oracle = base.oracle(true).map_err(TestCaseError::fail)?;
                let agent = base.agent();
                for from in base.pods.keys() {
                    for to in base.pods.keys() {
                        for v6 in [false, true] {
                            for (protocol, port) in PROBES {
                                let (f, t) = (base.ip(from, v6), base.ip(to, v6));
                                let expected = oracle.verdict(f, t, protocol, port);
                                let got = agent.verdict(f, t, protocol, port);
                                probes.set(probes.get() + 1);
                                if let Err(e) = agent::same(&expected, &got) {
                                    return Err(TestCaseError::fail(format!(
                                        "{from} -> {to} {protocol}/{port} IPv{}: {e}\npolicies: {}\nnetwork policies: {:?}",
                                        if v6 { 6 } else { 4 },
                                        Value::from(cluster.clone()),
                                        nps
                                    )));
                                }
                            }
                        }
                    }
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
        println!(
            "{} probes: the agent's model and the oracle agree",
            probes.get()
        );
    }

    /// The order the API server lists the policies in changes nothing, not even which
    /// rule is named as the decider (priority, then name, is a total order).
    #[test]
    fn the_order_of_the_objects_changes_nothing() {
        let base = Base::new();
        runner()
            .run(&policies(), |cluster| {
                let mut reversed = cluster.clone();
                reversed.reverse();
                prop_assert_eq!(verdicts(&base, &cluster)?, verdicts(&base, &reversed)?);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Pass rules that know all their peers and protocols only hand the connection on:
    /// with every action made Pass, every verdict is the NetworkPolicies' alone (one
    /// isolates gryffindor both ways, letting slytherin in and out).
    #[test]
    fn pass_rules_alone_change_no_verdict() {
        let base = Base::new();
        let np = network_policy(
            &namespace("gryffindor"),
            "slytherin-only",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"conformance-house": "slytherin"}}}]}],
                   "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"conformance-house": "slytherin"}}}]}]}),
        );
        let network = [np];
        let open = verdicts_with(&base, &network, &[]).expect("the base");
        assert!(
            open.iter().any(|v| !v.allowed()),
            "the NetworkPolicy denies something"
        );
        runner()
            .run(&policies(), |cluster| {
                // Rules with a peer the oracle does not know for their way fail
                // closed (deny), so they are left out here.
                let known = |rule: &Value| {
                    let ingress = rule.get("from").is_some();
                    let peers = rule["from"].as_array().or(rule["to"].as_array());
                    peers.into_iter().flatten().all(|p| {
                        let egress_only = ["networks", "nodes", "domainNames"]
                            .iter()
                            .any(|f| p.get(*f).is_some());
                        p.get("somethingNewer").is_none() && !(ingress && egress_only)
                    })
                };
                let mut passing = cluster.clone();
                for policy in &mut passing {
                    for way in ["ingress", "egress"] {
                        if let Some(rules) = policy["spec"][way].as_array_mut() {
                            rules.retain(known);
                            for rule in rules {
                                rule["action"] = json!("Pass");
                            }
                        }
                    }
                }
                let got = verdicts_with(&base, &network, &passing)?;
                for (with, without) in got.iter().zip(&open) {
                    prop_assert_eq!(with.allowed(), without.allowed(), "{}", with.why());
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// An Admin policy of priority 0 named before any other that denies all ingress from
    /// every pod decides every pod-to-pod connection between two pods (unless the
    /// source's own egress already denied it).
    #[test]
    fn a_first_admin_deny_decides_every_pod_connection() {
        let base = Base::new();
        runner()
            .run(&policies(), |mut cluster| {
                cluster.push(cni_kube_api::cluster_network_policy(
                    "0-first",
                    json!({"tier": "Admin", "priority": 0, "subject": {"namespaces": {}},
                           "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),
                ));
                let got = verdicts(&base, &cluster)?;
                for verdict in got
                    .iter()
                    .filter(|v| !v.same_pod && v.egress.is_some() && v.ingress.is_some())
                {
                    prop_assert!(!verdict.allowed(), "{}", verdict.why());
                    let ingress = &verdict.ingress.as_ref().expect("a destination").decided;
                    prop_assert_eq!(ingress.tier, Tier::Admin);
                    prop_assert_eq!(
                        ingress.rule.as_ref().map(|r| r.policy.as_str()),
                        Some("0-first")
                    );
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
