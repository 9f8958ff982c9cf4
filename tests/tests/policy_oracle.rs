//! The NetworkPolicy oracle (`cni_blackbox::policy_oracle`) checked twice, without
//! root: against upstream's truth tables (the e2e suite's, as
//! `network_policy_cases` holds them, and ours), and against the agent's own model
//! (`cni_node::policy::model`) on random clusters and policies.
//!
//! The oracle and the model are written apart (the oracle from the Kubernetes
//! documentation, reading the objects' JSON itself), so where they agree on thousands
//! of random cases neither hides a mistake the other lacks; a disagreement is printed
//! shrunk to a minimal case: the objects as JSON and the probe. `PROPTEST_CASES` sets
//! the number of random clusters (default [`DEFAULT_CASES`]).
//!
//! The agent's model leaves out one rule the oracle has: an isolated pod still accepts
//! connections from its own node, which the agent's datapath lets through before any
//! policy. The comparison is therefore per direction (which policies isolate and which
//! allow), not of the final answer alone.

mod network_policy_cases;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use cni_blackbox::policy_oracle::{Direction, Oracle, Verdict};
use cni_kube_api::{network_policy, realistic_namespace, realistic_pod};
use cni_node::policy::model::{self, Side, View};
use cni_node::policy::objects::{PodInfo, PolicyInfo, SlimNamespace, SlimNetworkPolicy, SlimPod};
use cni_node::policy::selector::Labels;
use cni_node::store::ItemMap;
use network_policy_cases::{Action, Case};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestError, TestRunner};
use serde_json::{Value, json};

/// Random clusters checked when `PROPTEST_CASES` is not set.
const DEFAULT_CASES: u32 = 2000;

/// The agent's model of some objects, read as the agent reads them.
struct Agent {
    pods: ItemMap<PodInfo>,
    namespaces: ItemMap<Labels>,
    policies: ItemMap<PolicyInfo>,
}

impl Agent {
    fn new(pods: &[Value], namespaces: &[Value], policies: &[Value]) -> Result<Self, String> {
        let mut agent = Self {
            pods: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            policies: BTreeMap::new(),
        };
        for pod in pods {
            let slim: SlimPod = serde_json::from_value(pod.clone()).map_err(|e| e.to_string())?;
            let info = PodInfo::from_slim(&slim);
            agent.pods.insert(info.key(), Arc::new(info));
        }
        for ns in namespaces {
            let slim: SlimNamespace =
                serde_json::from_value(ns.clone()).map_err(|e| e.to_string())?;
            let name = slim.metadata.name.clone().unwrap_or_default();
            agent
                .namespaces
                .insert(name, Arc::new(slim.metadata.labels.unwrap_or_default()));
        }
        for policy in policies {
            let slim: SlimNetworkPolicy =
                serde_json::from_value(policy.clone()).map_err(|e| e.to_string())?;
            let info = PolicyInfo::from_slim(&slim);
            if !info.problems.is_empty() {
                return Err(format!(
                    "the agent cannot read {}: {:?}",
                    info.key(),
                    info.problems
                ));
            }
            agent.policies.insert(info.key(), Arc::new(info));
        }
        Ok(agent)
    }

    fn view(&self) -> View<'_> {
        View::new(&self.pods, &self.namespaces, &self.policies)
    }
}

fn protocol_number(name: &str) -> u8 {
    match name {
        "TCP" => 6,
        "UDP" => 17,
        "SCTP" => 132,
        other => panic!("a truth table of {other} (a mistake in the case)"),
    }
}

// ---------------------------------------------------------------------------------
// Upstream's truth tables.

/// The matrix cluster of `network_policy.rs` as objects: namespaces x, y, z labelled
/// `ns=<name>`, pods a, b, c in each labelled `pod=<name>`, alternately on nodes 1 and
/// 2, with the servers' named ports, and addresses out of their node's pod ranges.
struct Matrix {
    addresses: BTreeMap<String, (IpAddr, IpAddr)>,
    nodes: BTreeMap<String, u8>,
    pod_labels: BTreeMap<String, Vec<(String, String)>>,
    namespace_labels: BTreeMap<String, Vec<(String, String)>>,
    policies: BTreeMap<String, Value>,
}

impl Matrix {
    fn new() -> Self {
        let mut matrix = Self {
            addresses: BTreeMap::new(),
            nodes: BTreeMap::new(),
            pod_labels: BTreeMap::new(),
            namespace_labels: BTreeMap::new(),
            policies: BTreeMap::new(),
        };
        for (i, key) in network_policy_cases::ALL_PODS.iter().enumerate() {
            let node = 1 + (i % 2) as u8;
            let (ns, name) = key.split_once('/').unwrap();
            let v4 = format!("10.244.{node}.{}", 10 + i).parse().unwrap();
            let v6 = format!("fd00:244:0:{node}::{:x}", 10 + i).parse().unwrap();
            matrix.addresses.insert((*key).to_owned(), (v4, v6));
            matrix.nodes.insert((*key).to_owned(), node);
            matrix
                .pod_labels
                .insert((*key).to_owned(), vec![("pod".into(), name.into())]);
            matrix
                .namespace_labels
                .insert(ns.to_owned(), vec![("ns".into(), ns.into())]);
        }
        matrix
    }

    fn act(&mut self, action: &Action) {
        let owned = |labels: &[(&str, &str)]| -> Vec<(String, String)> {
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        match action {
            Action::Policy(ns, name, spec) => {
                self.policies.insert(
                    format!("{ns}/{name}"),
                    network_policy(ns, name, spec.clone()),
                );
            }
            Action::DeletePolicy(ns, name) => {
                assert!(
                    self.policies.remove(&format!("{ns}/{name}")).is_some(),
                    "no policy {ns}/{name} to delete"
                );
            }
            Action::PodLabels(ns, name, labels) => {
                self.pod_labels
                    .insert(format!("{ns}/{name}"), owned(labels));
            }
            Action::NamespaceLabels(ns, labels) => {
                self.namespace_labels
                    .insert((*ns).to_owned(), owned(labels));
            }
        }
    }

    fn objects(&self) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
        let pods = self
            .addresses
            .iter()
            .map(|(key, (v4, v6))| {
                let (ns, name) = key.split_once('/').unwrap();
                let node = self.nodes[key];
                let labels: Vec<(&str, &str)> = self.pod_labels[key]
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                let ips = [v4.to_string(), v6.to_string()];
                let mut pod = realistic_pod(
                    ns,
                    name,
                    &format!("node-{node}"),
                    &[ips[0].as_str(), ips[1].as_str()],
                    &labels,
                );
                let mut ports = Vec::new();
                for port in [80, 81] {
                    for protocol in ["TCP", "UDP"] {
                        ports.push(json!({
                            "name": format!("serve-{port}-{}", protocol.to_ascii_lowercase()),
                            "containerPort": port,
                            "protocol": protocol,
                        }));
                    }
                }
                pod["spec"]["containers"][0]["ports"] = json!(ports);
                pod["status"]["hostIP"] = json!(format!("198.18.0.{}", 10 + node));
                pod["status"]["hostIPs"] = json!([
                    {"ip": format!("198.18.0.{}", 10 + node)},
                    {"ip": format!("fd00:18::{:x}", 0x10 + node)},
                ]);
                pod
            })
            .collect();
        let namespaces = self
            .namespace_labels
            .iter()
            .map(|(ns, labels)| {
                let labels: Vec<(&str, &str)> = labels
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                realistic_namespace(ns, &labels)
            })
            .collect();
        (pods, namespaces, self.policies.values().cloned().collect())
    }
}

/// Whether `from` may reach `to` (`namespace/pod` both) on a protocol, port and family
/// (IPv6 when true), and why.
type Judge = Box<dyn Fn(&str, &str, &str, u16, bool) -> (bool, String)>;

/// Where `case`'s truth tables and a judge disagree, step by step; the judge answers
/// whether `from` may reach `to` on a protocol, port and family.
fn disagreements(case: &Case, judge_of: &dyn Fn(&Matrix) -> Judge) -> Vec<String> {
    let mut matrix = Matrix::new();
    let mut wrong = Vec::new();
    for (n, step) in case.steps.iter().enumerate() {
        for action in &step.actions {
            matrix.act(action);
        }
        let judge = judge_of(&matrix);
        for check in &step.checks {
            for from in &case.pods {
                for to in case.pods.iter().filter(|to| *to != from) {
                    for v6 in [false, true] {
                        if (v6 && !check.ipv6) || (!v6 && !check.ipv4) {
                            continue;
                        }
                        let want = check.allows(from, to);
                        let (got, why) = judge(from, to, check.protocol, check.port, v6);
                        if got != want {
                            wrong.push(format!(
                                "  {:?} step {}: {from} -> {to} {}/{} IPv{}: upstream says {}, \
                                 the judge {} ({why})",
                                case.name,
                                n + 1,
                                check.protocol,
                                check.port,
                                if v6 { 6 } else { 4 },
                                if want { "allowed" } else { "denied" },
                                if got { "allows" } else { "denies" },
                            ));
                        }
                    }
                }
            }
        }
    }
    wrong
}

fn every_case() -> Vec<Case> {
    let addresses = Matrix::new().addresses;
    let ip_of = |key: &str| addresses[key];
    let mut cases = network_policy_cases::upstream_tcp(&ip_of);
    cases.extend(network_policy_cases::upstream_udp());
    cases.extend(network_policy_cases::upstream_sctp());
    cases.extend(network_policy_cases::ours(&ip_of));
    cases
}

#[test]
fn the_oracle_agrees_with_every_upstream_truth_table() {
    let cases = every_case();
    let mut wrong = Vec::new();
    let mut tables = 0;
    for case in &cases {
        tables += case.steps.iter().map(|s| s.checks.len()).sum::<usize>();
        wrong.extend(disagreements(case, &|matrix| {
            let (pods, namespaces, policies) = matrix.objects();
            let oracle = Oracle::new(&pods, &namespaces, &policies)
                .unwrap_or_else(|e| panic!("the oracle cannot read a case's objects: {e}"));
            let addresses = matrix.addresses.clone();
            Box::new(move |from, to, protocol, port, v6| {
                let pick = |key: &str| {
                    let (v4, v6_ip) = addresses[key];
                    if v6 { v6_ip } else { v4 }
                };
                let verdict = oracle.verdict(pick(from), pick(to), protocol, port);
                (verdict.allowed(), verdict.why())
            })
        }));
    }
    println!(
        "{} cases, {tables} truth tables: {} disagreements with the oracle",
        cases.len(),
        wrong.len()
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_agents_model_agrees_with_every_upstream_truth_table() {
    let cases = every_case();
    let mut wrong = Vec::new();
    for case in &cases {
        wrong.extend(disagreements(case, &|matrix| {
            let (pods, namespaces, policies) = matrix.objects();
            let agent = Agent::new(&pods, &namespaces, &policies)
                .unwrap_or_else(|e| panic!("a case's objects: {e}"));
            let addresses = matrix.addresses.clone();
            Box::new(move |from, to, protocol, port, v6| {
                let pick = |key: &str| {
                    let (v4, v6_ip) = addresses[key];
                    if v6 { v6_ip } else { v4 }
                };
                let verdict =
                    agent
                        .view()
                        .verdict(pick(from), pick(to), protocol_number(protocol), port);
                (verdict.allowed(), format!("{verdict:?}"))
            })
        }));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

// ---------------------------------------------------------------------------------
// Random clusters: the oracle against the agent's model.

static NAMESPACES: [&str; 3] = ["n0", "n1", "n2"];
/// Label keys, with the one the API server sets on every namespace (its name).
static KEYS: [&str; 4] = ["app", "tier", "team", "kubernetes.io/metadata.name"];
static VALUES: [&str; 4] = ["a", "b", "n0", "n1"];
static PORT_NAMES: [&str; 3] = ["http", "dns", "metrics"];
static PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];
/// The ports probed; random rules and containers use them too.
const PORTS: std::ops::RangeInclusive<u16> = 80..=84;
/// Addresses outside the pods: both nodes' and two external ones of each family.
static OUTSIDE: [&str; 8] = [
    "192.168.0.1",
    "192.168.0.2",
    "fd00:ff::1",
    "fd00:ff::2",
    "203.0.113.5",
    "2001:db8::5",
    "10.0.3.1",
    "fd00::3:1",
];
/// Addresses ipBlocks are cut around: pods', nodes' and external ones.
static ANCHORS: [&str; 12] = [
    "10.0.1.1",
    "10.0.1.2",
    "10.0.2.3",
    "10.0.2.6",
    "fd00::1:1",
    "fd00::1:2",
    "fd00::2:3",
    "fd00::2:6",
    "192.168.0.1",
    "fd00:ff::2",
    "203.0.113.5",
    "2001:db8::5",
];

fn node_v4(node: u8) -> String {
    format!("192.168.0.{node}")
}

fn node_v6(node: u8) -> String {
    format!("fd00:ff::{node}")
}

fn labels() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(select(&KEYS[..]), select(&VALUES[..]), 0..3)
        .prop_map(|labels| json!(labels))
}

fn selector() -> impl Strategy<Value = Value> {
    let expression = (
        select(&KEYS[..]),
        0..4usize,
        prop::collection::vec(select(&VALUES[..]), 1..3),
    )
        .prop_map(|(key, op, values)| match op {
            0 => json!({"key": key, "operator": "In", "values": values}),
            1 => json!({"key": key, "operator": "NotIn", "values": values}),
            2 => json!({"key": key, "operator": "Exists"}),
            _ => json!({"key": key, "operator": "DoesNotExist"}),
        });
    (
        prop::option::of(prop::collection::btree_map(
            select(&KEYS[..]),
            select(&VALUES[..]),
            0..3,
        )),
        prop::option::of(prop::collection::vec(expression, 0..3)),
    )
        .prop_map(|(labels, expressions)| {
            let mut selector = json!({});
            if let Some(labels) = labels {
                selector["matchLabels"] = json!(labels);
            }
            if let Some(expressions) = expressions {
                selector["matchExpressions"] = json!(expressions);
            }
            selector
        })
}

/// The network of `anchor` with `prefix` bits, as a CIDR.
fn network(anchor: IpAddr, prefix: u32) -> String {
    let width = if anchor.is_ipv4() { 32 } else { 128 };
    let mask = u128::MAX.checked_shl(width - prefix).unwrap_or(0);
    match anchor {
        IpAddr::V4(v4) => {
            let bits = u32::try_from(u128::from(u32::from(v4)) & mask & u128::from(u32::MAX))
                .unwrap_or_default();
            format!("{}/{prefix}", std::net::Ipv4Addr::from(bits))
        }
        IpAddr::V6(v6) => format!(
            "{}/{prefix}",
            std::net::Ipv6Addr::from(u128::from(v6) & mask)
        ),
    }
}

fn prefix_for(anchor: IpAddr, choice: usize) -> u32 {
    let (v4, v6) = ([0, 8, 16, 24, 30, 32], [0, 64, 96, 112, 126, 128]);
    if anchor.is_ipv4() {
        v4[choice % 6]
    } else {
        v6[choice % 6]
    }
}

fn ip_block() -> impl Strategy<Value = Value> {
    (
        select(&ANCHORS[..]),
        0..6usize,
        prop::collection::vec((select(&ANCHORS[..]), 0..6usize), 0..3),
    )
        .prop_map(|(anchor, choice, holes)| {
            let anchor: IpAddr = anchor.parse().unwrap();
            let prefix = prefix_for(anchor, choice);
            let cidr = network(anchor, prefix);
            // The API refuses an except outside the cidr.
            let except: Vec<String> = holes
                .into_iter()
                .filter_map(|(hole, choice)| {
                    let hole: IpAddr = hole.parse().ok()?;
                    let hole_prefix = prefix_for(hole, choice);
                    let inside = hole.is_ipv4() == anchor.is_ipv4()
                        && hole_prefix > prefix
                        && network(hole, prefix) == cidr;
                    inside.then(|| network(hole, hole_prefix))
                })
                .collect();
            if except.is_empty() {
                json!({"ipBlock": {"cidr": cidr}})
            } else {
                json!({"ipBlock": {"cidr": cidr, "except": except}})
            }
        })
}

fn peer() -> impl Strategy<Value = Value> {
    prop_oneof![
        selector().prop_map(|s| json!({"podSelector": s})),
        selector().prop_map(|s| json!({"namespaceSelector": s})),
        (selector(), selector())
            .prop_map(|(p, n)| json!({"podSelector": p, "namespaceSelector": n})),
        ip_block(),
    ]
}

fn port() -> impl Strategy<Value = Value> {
    (
        prop::option::of(select(&PROTOCOLS[..])),
        0..4usize,
        PORTS,
        0..3u16,
        select(&PORT_NAMES[..]),
    )
        .prop_map(|(protocol, kind, number, span, name)| {
            let mut entry = match kind {
                0 => json!({}),
                1 => json!({"port": number}),
                2 => json!({"port": number, "endPort": number + span}),
                _ => json!({"port": name}),
            };
            if let Some(protocol) = protocol {
                entry["protocol"] = json!(protocol);
            }
            entry
        })
}

fn rules(peers: &'static str) -> impl Strategy<Value = Option<Value>> {
    let rule = (
        prop::option::of(prop::collection::vec(peer(), 0..3)),
        prop::option::of(prop::collection::vec(port(), 0..3)),
    )
        .prop_map(move |(to, ports)| {
            let mut rule = json!({});
            if let Some(to) = to {
                rule[peers] = json!(to);
            }
            if let Some(ports) = ports {
                rule["ports"] = json!(ports);
            }
            rule
        });
    prop::option::of(prop::collection::vec(rule, 0..3).prop_map(|rules| json!(rules)))
}

fn policy_spec() -> impl Strategy<Value = (usize, Value)> {
    (
        0..NAMESPACES.len(),
        selector(),
        0..6usize,
        rules("from"),
        rules("to"),
    )
        .prop_map(|(ns, pods, types, ingress, egress)| {
            let mut spec = json!({"podSelector": pods});
            match types {
                0 | 1 => {}
                2 => spec["policyTypes"] = json!(["Ingress"]),
                3 => spec["policyTypes"] = json!(["Egress"]),
                4 => spec["policyTypes"] = json!(["Ingress", "Egress"]),
                _ => spec["policyTypes"] = json!([]),
            }
            if let Some(ingress) = ingress {
                spec["ingress"] = ingress;
            }
            if let Some(egress) = egress {
                spec["egress"] = egress;
            }
            (ns, spec)
        })
}

/// One random pod: namespace, labels, node, hostNetwork, families (0 both, 1 IPv4
/// only, 2 IPv6 only), named ports (name -> protocol, number), finished.
type PodShape = (
    usize,
    Value,
    u8,
    bool,
    usize,
    BTreeMap<&'static str, (&'static str, u16)>,
    bool,
);

fn pod_shape() -> impl Strategy<Value = PodShape> {
    (
        0..NAMESPACES.len(),
        labels(),
        1..=2u8,
        prop::bool::weighted(0.15),
        prop_oneof![4 => Just(0usize), 1 => Just(1usize), 1 => Just(2usize)],
        prop::collection::btree_map(
            select(&PORT_NAMES[..]),
            (select(&PROTOCOLS[..]), PORTS),
            0..3,
        ),
        prop::bool::weighted(0.05),
    )
}

/// A random cluster: its objects as the API server stores them.
#[derive(Clone, Debug)]
struct Cluster {
    pods: Vec<Value>,
    namespaces: Vec<Value>,
    policies: Vec<Value>,
}

fn cluster() -> impl Strategy<Value = Cluster> {
    (
        prop::collection::vec(labels(), NAMESPACES.len()),
        prop::collection::vec(pod_shape(), 1..8),
        prop::collection::vec(policy_spec(), 0..4),
    )
        .prop_map(|(namespace_labels, shapes, specs)| {
            let namespaces = NAMESPACES
                .iter()
                .zip(namespace_labels)
                .map(|(name, mut labels)| {
                    labels["kubernetes.io/metadata.name"] = json!(name);
                    json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name, "labels": labels}})
                })
                .collect();
            let pods = shapes
                .into_iter()
                .enumerate()
                .map(|(i, (ns, labels, node, host_network, families, ports, finished))| {
                    let mut ips = Vec::new();
                    if families != 2 {
                        ips.push(if host_network { node_v4(node) } else { format!("10.0.{node}.{}", i + 1) });
                    }
                    if families != 1 {
                        ips.push(if host_network { node_v6(node) } else { format!("fd00::{node}:{:x}", i + 1) });
                    }
                    // The ports spread over two containers.
                    let mut containers = vec![json!({"name": "main", "ports": []}), json!({"name": "side", "ports": []})];
                    for (n, (name, (protocol, number))) in ports.into_iter().enumerate() {
                        if let Some(list) = containers[n % 2]["ports"].as_array_mut() {
                            list.push(json!({"name": name, "containerPort": number, "protocol": protocol}));
                        }
                    }
                    json!({
                        "kind": "Pod",
                        "apiVersion": "v1",
                        "metadata": {"namespace": NAMESPACES[ns], "name": format!("pod{i}"), "labels": labels},
                        "spec": {"nodeName": format!("node-{node}"), "hostNetwork": host_network, "containers": containers},
                        "status": {
                            "phase": if finished { "Succeeded" } else { "Running" },
                            "podIP": ips[0],
                            "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
                            "hostIP": node_v4(node),
                            "hostIPs": [{"ip": node_v4(node)}, {"ip": node_v6(node)}],
                        },
                    })
                })
                .collect();
            let policies = specs
                .into_iter()
                .enumerate()
                .map(|(i, (ns, spec))| network_policy(NAMESPACES[ns], &format!("policy{i}"), spec))
                .collect();
            Cluster { pods, namespaces, policies }
        })
}

/// Which policies isolate and which allow, as both judges say it.
fn sides(direction: Option<&Direction>) -> Option<(Vec<String>, Vec<String>)> {
    direction.map(|d| (d.isolated_by.clone(), d.allowed_by.clone()))
}

fn agent_sides(side: Option<&Side>) -> Option<(Vec<String>, Vec<String>)> {
    side.map(|s| (s.isolated_by.clone(), s.allowed_by.clone()))
}

fn same(oracle: &Verdict, agent: &model::Verdict) -> bool {
    oracle.same_pod == agent.same_pod
        && sides(oracle.egress.as_ref()) == agent_sides(agent.egress.as_ref())
        && sides(oracle.ingress.as_ref()) == agent_sides(agent.ingress.as_ref())
}

/// Compares the two judges on every probe of `cluster`: from every address (pods',
/// nodes', outside ones) to every pod address, on every protocol and probed port.
fn compare(cluster: &Cluster) -> Result<(usize, usize), TestCaseError> {
    let oracle = Oracle::new(&cluster.pods, &cluster.namespaces, &cluster.policies)
        .map_err(|e| TestCaseError::fail(format!("the oracle cannot read the objects: {e}")))?;
    let agent = Agent::new(&cluster.pods, &cluster.namespaces, &cluster.policies)
        .map_err(TestCaseError::fail)?;
    let view = agent.view();
    let pod_ips: Vec<IpAddr> = cluster
        .pods
        .iter()
        .flat_map(|p| {
            p["status"]["podIPs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|e| e["ip"].as_str()?.parse().ok())
        .collect();
    let sources: Vec<IpAddr> = pod_ips
        .iter()
        .copied()
        .chain(OUTSIDE.iter().filter_map(|a| a.parse().ok()))
        .collect();
    let (mut probes, mut denied) = (0, 0);
    for &from in &sources {
        for &to in &pod_ips {
            for protocol in PROTOCOLS {
                for port in PORTS {
                    probes += 1;
                    let said = oracle.verdict(from, to, protocol, port);
                    let modelled = view.verdict(from, to, protocol_number(protocol), port);
                    denied += usize::from(!said.allowed());
                    if !same(&said, &modelled) {
                        let objects: Vec<&Value> = cluster
                            .namespaces
                            .iter()
                            .chain(&cluster.pods)
                            .chain(&cluster.policies)
                            .collect();
                        return Err(TestCaseError::fail(format!(
                            "{from} -> {to} {protocol}/{port}:\n  oracle: {} ({said:?})\n  \
                             agent's model: {} ({modelled:?})\nobjects:\n{}",
                            said.allowed(),
                            modelled.allowed(),
                            serde_json::to_string_pretty(&objects).unwrap_or_default()
                        )));
                    }
                }
            }
        }
    }
    Ok((probes, denied))
}

#[test]
fn the_oracle_and_the_agents_model_agree_on_random_clusters() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let probes = std::cell::Cell::new((0usize, 0usize));
    let started = std::time::Instant::now();
    let result = runner.run(&cluster(), |cluster| {
        let (all, denied) = compare(&cluster)?;
        let (all_before, denied_before) = probes.get();
        probes.set((all_before + all, denied_before + denied));
        Ok(())
    });
    println!(
        "{cases} random clusters, {} probes ({} denied) compared in {:.1} s",
        probes.get().0,
        probes.get().1,
        started.elapsed().as_secs_f64()
    );
    match result {
        Ok(()) => {}
        // The input is in the reason already, as JSON.
        Err(TestError::Fail(reason, _)) => panic!("the shrunk disagreement: {reason}"),
        Err(e) => panic!("{e}"),
    }
}
