//! NetworkPolicy at scale: the API test server holds a cluster of Nodes with 100 Pods
//! each, 100 labelled Namespaces (every node runs one pod of each) and NetworkPolicies
//! of upstream-like shapes spread over the namespaces; one `cni-node` enforces them on
//! node `np-0`, in a namespace with its own bridge.
//!
//! The policies, ten shapes in turn: default deny ingress; allow from namespaces by
//! label to a named port; from pods by label to a port range (`endPort`); from pods of
//! labelled namespaces (a peer with both selectors, AND) to a port and a named port; an
//! `ipBlock` with `except`; egress to DNS (numbered and named ports) and to the internet
//! (`ipBlock` with `except`); several rules and peers in both directions; default deny
//! egress for some pods; `matchExpressions` (`Exists`, `NotIn`) to a UDP range; and the
//! monitoring namespace to a named port. Two more isolate a client pod's egress and a
//! server pod's ingress on the agent's node and allow the one connection between them.
//!
//! Measured, and printed as one `policy-scale key=value...` line (the benchmark,
//! `tests/bench/network-policy.sh`, runs this with the static release agent at 10,000
//! pods and 1,000 policies, 1,000 and 100 in its smoke run, and judges the figures
//! against the `[network_policy.*]` targets of `tests/bench/targets.toml`; the test
//! asserts correctness only: every change reaches the table, the policies are in force):
//!
//! - the initial sync, from the agent's start until its metrics say every local pod
//!   address is in the table (`/metrics` polled every 10 ms), then the maps are read
//!   once with `nft -j list map` and checked address by address; the peak RSS (VmHWM);
//! - changes one at a time, a policy added, a pod's label changed, a pod added on the
//!   agent's node, a namespace's label changed, in turn: each is timed from the moment
//!   the test server holds it to the moment the agent's transaction is committed: the
//!   node namespace's nf_tables generation id, which each commit increments, asked
//!   every 0.1 ms with one small netlink request ([`cni_blackbox::nft::Generation`];
//!   only the agent commits there, and listening to nf_tables' notifications instead
//!   would make the kernel build one per element of the agent's transactions); then
//!   the table is read and the change checked in it;
//! - the cost of a new TCP connection between two pods on the node (connect, accept,
//!   close), next to the same two pods on a second node whose agent holds no policy,
//!   in alternating rounds of [`CONNECTIONS_PER_ROUND`]: [`cni_blackbox::connections`].
//!
//! With `CNI_RS_SCALE_CLUSTER_POLICIES=N` (default 0) the API server also holds N
//! ClusterNetworkPolicies, half Admin and half Baseline, each with 1 to 25 ingress rules
//! and half as many egress rules ([`cluster_policy`]): subjects every namespace, or the
//! namespaces of one `env`; peers namespaces and pods by label, `networks`; protocols
//! numbered ports, ranges and named ports; every action. None of their rules matches the
//! connection benchmark's pods or the changes' addresses, so what is measured and
//! checked is the same, with every tier's lookups in force on the way. A fifth kind of
//! change then joins the four: an Admin ClusterNetworkPolicy added at priority 0 (egress
//! denied to one /32 on one port), timed to the agent's commit.
//!
//! With `CNI_RS_SCALE_DENY_LOG=1` the agent runs with `--deny-log` (its default rate,
//! [`DENY_LOG_RATE`] lines a second), and after the connections the client floods the
//! server with [`DENY_ATTEMPTS_PER_S`] denied attempts a second for [`DENY_LOAD`]
//! ([`deny_log_load`]): the agent's CPU over it, the deny log's lines a second and the
//! slowest `/healthz` meanwhile are printed as a second `policy-scale` line.
//!
//! Sizes: `CNI_RS_SCALE_PODS` (default 1,000: 10 nodes), `CNI_RS_SCALE_POLICIES`
//! (default 100), `CNI_RS_SCALE_CHANGES` (default 20), `CNI_RS_SCALE_CONNECTIONS` (per
//! setup, default 200); `CNI_NODE_BIN` picks the agent (the benchmark's static release
//! build), `CNI_RS_SCALE_AGENT_LOG` keeps a copy of its log.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cni_blackbox::connections::{ConnectionTimer, serve_and_close, try_connect};
use cni_blackbox::measured::peak_rss_kib;
use cni_blackbox::nft::{Generation, PolicyTableView};
use cni_blackbox::probe;
use cni_blackbox::underlay::lone_node;
use cni_blackbox::{Netns, TempDir, plugin_path, require_root};
use cni_kube_api::{
    ApiServer, BENCHMARK_ENVS, benchmark_cluster_policy, cluster_network_policy, network_policy,
    realistic_namespace, realistic_node, realistic_pod,
};
use serde_json::{Value, json};

const TABLE: &str = "cni_node_policy";
const PODS_PER_NODE: u32 = 100;
const NAMESPACES: u32 = 100;
const TIERS: [&str; 3] = ["web", "api", "db"];
const ENVS: [&str; 3] = BENCHMARK_ENVS;
/// The namespace labelled `purpose=dns`, which egress policies allow DNS to.
const DNS_NS: u32 = 0;
/// The namespace labelled `purpose=monitoring`, allowed to every pod's metrics.
const MONITORING_NS: u32 = 99;
/// The connection benchmark's server and client namespaces, pods and port.
const SERVER_NS: u32 = 1;
const CLIENT_NS: u32 = 2;
/// Connections a side makes before the other side's turn: a round lasts about half a
/// millisecond, shorter than most bursts of the machine's other work.
const CONNECTIONS_PER_ROUND: usize = 10;
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 240);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 241);
const SERVER_PORT: u16 = 8080;
/// The agent's node and its health endpoint (in the node's namespace).
const NODE: u32 = 0;
const HEALTH_ADDR: &str = "127.0.0.1:9743";
/// The address of the node's bridge, the pods' default gateway.
const GATEWAY: &str = "10.100.0.1";

fn env_size(name: &str, default: u32, range: std::ops::RangeInclusive<u32>) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
        .clamp(*range.start(), *range.end())
}

fn ns_name(j: u32) -> String {
    format!("ns-{j:02}")
}

fn node_name(n: u32) -> String {
    format!("np-{n}")
}

fn node_ip(n: u32) -> String {
    if n == NODE {
        "100.64.0.1".into()
    } else {
        format!("100.64.1.{n}")
    }
}

fn node_object(n: u32) -> Value {
    realistic_node(
        &node_name(n),
        &[&format!("10.100.{n}.0/24")],
        &[&node_ip(n)],
        40,
    )
}

fn purpose(j: u32) -> &'static str {
    match j {
        DNS_NS => "dns",
        MONITORING_NS => "monitoring",
        _ => "apps",
    }
}

fn namespace_object(j: u32, env: &str) -> Value {
    realistic_namespace(
        &ns_name(j),
        &[
            ("team", &format!("team-{}", j % 10)),
            ("env", env),
            ("purpose", purpose(j)),
        ],
    )
}

/// A pod as the test knows it.
#[derive(Debug, Clone)]
struct Pod {
    ns: u32,
    name: String,
    node: u32,
    ip: Ipv4Addr,
    app: String,
    tier: String,
}

impl Pod {
    /// The pod in `slot` of node `node`: one of every namespace on every node.
    fn of_cluster(node: u32, slot: u32) -> Self {
        let g = node * PODS_PER_NODE + slot;
        let app = format!("app-{}", g % 10);
        Self {
            ns: (slot + node) % NAMESPACES,
            name: format!("{app}-5d8f7c9b4-{g:05}"),
            node,
            ip: Ipv4Addr::new(
                10,
                100,
                u8::try_from(node).unwrap_or(u8::MAX),
                u8::try_from(slot + 2).unwrap_or(u8::MAX),
            ),
            app,
            tier: TIERS[(g % 3) as usize].into(),
        }
    }

    fn object(&self) -> Value {
        realistic_pod(
            &ns_name(self.ns),
            &self.name,
            &node_name(self.node),
            &[&self.ip.to_string()],
            &[
                ("app", &self.app),
                ("tier", &self.tier),
                ("pod-template-hash", "5d8f7c9b4"),
            ],
        )
    }
}

/// Which pods of its namespace a policy selects.
#[derive(Debug, Clone)]
enum Select {
    All,
    App(String),
    Tier(&'static str),
}

/// A policy as the test knows it: enough to say which pods it isolates.
#[derive(Debug, Clone)]
struct Policy {
    ns: u32,
    select: Select,
    ingress: bool,
    egress: bool,
    object: Value,
}

impl Policy {
    fn selects(&self, pod: &Pod) -> bool {
        pod.ns == self.ns
            && match &self.select {
                Select::All => true,
                Select::App(app) => pod.app == *app,
                Select::Tier(tier) => pod.tier == *tier,
            }
    }

    fn new(ns: u32, name: &str, select: Select, types: &[&str], spec: Value) -> Self {
        let mut spec = spec;
        spec["podSelector"] = match &select {
            Select::All => json!({}),
            Select::App(app) => json!({"matchLabels": {"app": app}}),
            Select::Tier(tier) => json!({"matchLabels": {"tier": tier}}),
        };
        spec["policyTypes"] = json!(types);
        Self {
            ns,
            select,
            ingress: types.contains(&"Ingress"),
            egress: types.contains(&"Egress"),
            object: network_policy(&ns_name(ns), name, spec),
        }
    }

    /// Generated policy `p`: namespace `p % 100`, shape `(p / 100 + p) % 10`.
    fn generated(p: u32) -> Self {
        let j = p % NAMESPACES;
        let round = p / NAMESPACES;
        let shape = (round + j) % 10;
        let app = |k: u32| format!("app-{}", (j * 7 + round * 3 + k) % 10);
        let team = format!("team-{}", (j + 1) % 10);
        match shape {
            0 => Self::new(
                j,
                &format!("default-deny-ingress-{round}"),
                Select::All,
                &["Ingress"],
                json!({}),
            ),
            1 => Self::new(
                j,
                &format!("allow-from-{team}-{round}"),
                Select::App(app(0)),
                &["Ingress"],
                json!({"ingress": [{
                    "from": [{"namespaceSelector": {"matchLabels": {"team": team}}}],
                    "ports": [{"protocol": "TCP", "port": "http"}],
                }]}),
            ),
            2 => Self::new(
                j,
                &format!("allow-api-range-{round}"),
                Select::Tier("api"),
                &["Ingress"],
                json!({"ingress": [{
                    "from": [{"podSelector": {"matchLabels": {"app": app(1)}}}],
                    "ports": [{"protocol": "TCP", "port": 8080, "endPort": 8090}],
                }]}),
            ),
            3 => Self::new(
                j,
                &format!("allow-prod-app-{round}"),
                Select::App(app(0)),
                &["Ingress"],
                json!({"ingress": [{
                    "from": [{
                        "namespaceSelector": {"matchLabels": {"env": "prod"}},
                        "podSelector": {"matchLabels": {"app": app(2)}},
                    }],
                    "ports": [{"protocol": "TCP", "port": 9090}, {"protocol": "TCP", "port": "grpc"}],
                }]}),
            ),
            4 => Self::new(
                j,
                &format!("allow-vpc-https-{round}"),
                Select::Tier("web"),
                &["Ingress"],
                json!({"ingress": [{
                    "from": [{"ipBlock": {
                        "cidr": "10.0.0.0/8",
                        "except": ["10.100.0.0/16", format!("10.{}.0.0/16", 1 + j % 50)],
                    }}],
                    "ports": [{"protocol": "TCP", "port": 443}],
                }]}),
            ),
            5 => Self::new(
                j,
                &format!("egress-dns-and-internet-{round}"),
                Select::App(app(0)),
                &["Egress"],
                json!({"egress": [
                    {
                        "to": [{"namespaceSelector": {"matchLabels": {"purpose": "dns"}}}],
                        "ports": [
                            {"protocol": "UDP", "port": 53},
                            {"protocol": "TCP", "port": 53},
                            {"protocol": "UDP", "port": "dns"},
                        ],
                    },
                    {
                        "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}],
                        "ports": [{"protocol": "TCP", "port": 443}],
                    },
                ]}),
            ),
            6 => Self::new(
                j,
                &format!("db-{round}"),
                Select::Tier("db"),
                &["Ingress", "Egress"],
                json!({
                    "ingress": [
                        {
                            "from": [
                                {"podSelector": {"matchLabels": {"tier": "api"}}},
                                {"namespaceSelector": {"matchLabels": {"env": "staging"}}},
                            ],
                            "ports": [{"protocol": "TCP", "port": 5432}],
                        },
                        {
                            "from": [{"ipBlock": {"cidr": format!("192.168.{j}.0/24")}}],
                            "ports": [{"protocol": "TCP", "port": 22}],
                        },
                    ],
                    "egress": [
                        {
                            "to": [{"podSelector": {"matchLabels": {"tier": "db"}}}],
                            "ports": [{"protocol": "TCP", "port": 5432}],
                        },
                        {
                            "to": [{"namespaceSelector": {"matchLabels": {"purpose": "dns"}}}],
                            "ports": [{"protocol": "UDP", "port": 53}],
                        },
                    ],
                }),
            ),
            7 => Self::new(
                j,
                &format!("default-deny-egress-db-{round}"),
                Select::Tier("db"),
                &["Egress"],
                json!({}),
            ),
            8 => {
                let mut policy = Self::new(
                    j,
                    &format!("mdns-from-non-dev-{round}"),
                    Select::All,
                    &["Ingress"],
                    json!({"ingress": [{
                        "from": [{"namespaceSelector": {"matchExpressions": [
                            {"key": "env", "operator": "NotIn", "values": ["dev"]},
                        ]}}],
                        "ports": [{"protocol": "UDP", "port": 5353, "endPort": 5360}],
                    }]}),
                );
                // Every pod has an app label: selects all, written as an expression.
                policy.object["spec"]["podSelector"] =
                    json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]});
                policy
            }
            _ => Self::new(
                j,
                &format!("allow-monitoring-{round}"),
                Select::All,
                &["Ingress"],
                json!({"ingress": [{
                    "from": [{"namespaceSelector": {"matchLabels": {"purpose": "monitoring"}}}],
                    "ports": [{"protocol": "TCP", "port": "metrics"}],
                }]}),
            ),
        }
    }

    /// The two that isolate the connection benchmark's pods and allow it.
    fn connection_pair() -> [Self; 2] {
        let only = |j: u32, app: &str| {
            json!([{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns_name(j)}},
                "podSelector": {"matchLabels": {"app": app}},
            }])
        };
        let port = json!([{"protocol": "TCP", "port": SERVER_PORT}]);
        [
            Self::new(
                SERVER_NS,
                "bench-server-from-client",
                Select::App("bench-server".into()),
                &["Ingress"],
                json!({"ingress": [{"from": only(CLIENT_NS, "bench-client"), "ports": port}]}),
            ),
            Self::new(
                CLIENT_NS,
                "bench-client-to-server",
                Select::App("bench-client".into()),
                &["Egress"],
                json!({"egress": [{"to": only(SERVER_NS, "bench-server"), "ports": port}]}),
            ),
        ]
    }
}

fn bench_pods() -> [Pod; 2] {
    let pod = |ns: u32, name: &str, ip: Ipv4Addr, app: &str| Pod {
        ns,
        name: name.into(),
        node: NODE,
        ip,
        app: app.into(),
        tier: "bench".into(),
    };
    [
        pod(SERVER_NS, "bench-server-0", SERVER_IP, "bench-server"),
        pod(CLIENT_NS, "bench-client-0", CLIENT_IP, "bench-client"),
    ]
}

/// The local pod addresses the policies isolate, for ingress and for egress.
fn isolated(pods: &[Pod], policies: &[Policy]) -> (BTreeSet<IpAddr>, BTreeSet<IpAddr>) {
    let mut ingress = BTreeSet::new();
    let mut egress = BTreeSet::new();
    for pod in pods.iter().filter(|p| p.node == NODE) {
        for policy in policies.iter().filter(|p| p.selects(pod)) {
            if policy.ingress {
                ingress.insert(IpAddr::V4(pod.ip));
            }
            if policy.egress {
                egress.insert(IpAddr::V4(pod.ip));
            }
        }
    }
    (ingress, egress)
}

/// A running agent; killed and reaped on drop.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Agent {
    fn start(
        agent: &Path,
        ns: &Netns,
        dir: &Path,
        kubeconfig: &Path,
        log: &Path,
        extra: &[&str],
    ) -> Self {
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name()])
            .arg(agent)
            .arg(format!("--node-name={}", node_name(NODE)))
            .args(["--masquerade-backend=nftables", "--resync-interval=3600"])
            .arg(format!("--health-addr={HEALTH_ADDR}"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--cni-conf-dir={}", dir.join("net.d").display()))
            .arg(format!("--cni-bin-dir={}", dir.display()))
            .arg(format!("--pod-record-dir={}", dir.join("pods").display()))
            .arg(format!(
                "--explain-socket={}",
                dir.join("explain.sock").display()
            ))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap_or_else(|e| panic!("{e}")))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", agent.display()));
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// A node's namespace: loopback, the underlay link holding `ip`, and the pods' bridge
/// `cni0` with the gateway address.
fn node_netns(prefix: &str) -> Netns {
    let ns = lone_node(prefix);
    ns.exec_ok(&["ip", "link", "add", "cni0", "type", "bridge"]);
    ns.exec_ok(&["ip", "addr", "add", &format!("{GATEWAY}/24"), "dev", "cni0"]);
    ns.exec_ok(&["ip", "link", "set", "cni0", "up"]);
    ns
}

/// A pod's namespace on the node's bridge, with `ip`.
fn pod_netns(node: &Netns, port: &str, ip: Ipv4Addr) -> Netns {
    let pod = Netns::new("cnibb-np-pod");
    node.exec_ok(&[
        "ip",
        "link",
        "add",
        port,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        pod.name(),
    ]);
    node.exec_ok(&["ip", "link", "set", port, "master", "cni0", "up"]);
    pod.exec_ok(&["ip", "link", "set", "lo", "up"]);
    pod.exec_ok(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
    pod.exec_ok(&["ip", "link", "set", "eth0", "up"]);
    pod.exec_ok(&["ip", "route", "add", "default", "via", GATEWAY]);
    pod
}

/// The agent's isolated addresses (ingress, egress) from its metrics, if it answers.
fn isolated_metric(ns: &Netns) -> Option<(usize, usize)> {
    let addr: SocketAddr = HEALTH_ADDR.parse().ok()?;
    let answer = probe::get(ns.path(), addr, "/metrics", Duration::from_secs(2)).ok()?;
    let value = |direction: &str| {
        let head = format!("cni_node_policy_isolated_addresses{{direction=\"{direction}\"}} ");
        answer
            .body
            .lines()
            .find_map(|l| l.strip_prefix(head.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as usize)
    };
    Some((value("ingress")?, value("egress")?))
}

fn log_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One change to time: what the test server is given, and how the table shows it.
enum Check {
    /// The pod `at` admits `from` on `protocol`/`port` (or, with `false`, does not).
    Admits {
        at: IpAddr,
        from: IpAddr,
        protocol: u8,
        port: u16,
        want: bool,
    },
    /// `ingress4` maps `ip` differently than before.
    IngressChanged(IpAddr),
    /// `ingress4` holds `ip`.
    Isolated(IpAddr),
    /// A ClusterNetworkPolicy change: the commit is what is timed (the tiers' maps are
    /// the datapath's to check, in its own tests).
    Committed,
}

impl Check {
    /// What the check looks at: the maps, and the profile set it reads.
    fn read(&self, ns: &Netns) -> PolicyTableView {
        let mut view = PolicyTableView::read_maps(ns, TABLE);
        if let Self::Admits { at, .. } = self {
            view.read_ingress_set(ns, TABLE, *at);
        }
        view
    }

    fn holds(&self, before: &PolicyTableView, after: &PolicyTableView) -> bool {
        match *self {
            Self::Admits {
                at,
                from,
                protocol,
                port,
                want,
            } => {
                after.admits(at, from, protocol, port) == want
                    && before.admits(at, from, protocol, port) != want
            }
            Self::IngressChanged(ip) => after.ingress4.get(&ip) != before.ingress4.get(&ip),
            Self::Isolated(ip) => after.ingress4.contains_key(&ip),
            Self::Committed => true,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Admits {
                at,
                from,
                protocol,
                port,
                want,
            } => format!(
                "{at} {} {from} on {protocol}/{port}",
                if *want { "admits" } else { "no longer admits" }
            ),
            Self::IngressChanged(ip) => format!("{ip} jumps to another ingress profile"),
            Self::Isolated(ip) => format!("{ip} is isolated for ingress"),
            Self::Committed => "a ClusterNetworkPolicy change is committed".into(),
        }
    }
}

/// What a change gives the test server.
enum Served {
    Policy(Value),
    Pod(Value),
    Namespace(Value),
    ClusterPolicy(Value),
}

const KINDS: [&str; 5] = [
    "policy_added",
    "pod_label",
    "pod_added",
    "namespace_label",
    "cluster_policy_added",
];

#[test]
#[allow(clippy::too_many_lines)] // one scenario, told in order
fn the_agent_enforces_a_thousand_policies_over_ten_thousand_pods() {
    if !require_root() {
        return;
    }
    let pods_total = env_size("CNI_RS_SCALE_PODS", 1000, 200..=25_000);
    let nodes = pods_total / PODS_PER_NODE;
    let policy_count = env_size("CNI_RS_SCALE_POLICIES", 100, 100..=20_000);
    let changes = env_size("CNI_RS_SCALE_CHANGES", 20, 4..=2000);
    let connections = env_size("CNI_RS_SCALE_CONNECTIONS", 200, 20..=100_000) as usize;
    let cluster_policies = env_size("CNI_RS_SCALE_CLUSTER_POLICIES", 0, 0..=1000);
    let kinds: u32 = if cluster_policies > 0 { 5 } else { 4 };
    let agent_bin =
        std::env::var_os("CNI_NODE_BIN").map_or_else(|| plugin_path("cni-node"), Into::into);

    // The cluster as served.
    let mut envs: Vec<&str> = (0..NAMESPACES).map(|j| ENVS[(j % 3) as usize]).collect();
    let mut pods: Vec<Pod> = (0..nodes)
        .flat_map(|n| (0..PODS_PER_NODE).map(move |s| Pod::of_cluster(n, s)))
        .collect();
    pods.extend(bench_pods());
    let served_pods = pods.len();
    let local_pods = pods.iter().filter(|p| p.node == NODE).count();
    let mut policies: Vec<Policy> = (0..policy_count - 2).map(Policy::generated).collect();
    policies.extend(Policy::connection_pair());

    let dir = TempDir::new("cnibb-np");
    std::fs::create_dir_all(dir.path().join("pods")).unwrap_or_else(|e| panic!("{e}"));
    let ns = node_netns("cnibb-np-node");
    let server = pod_netns(&ns, "vbsrv", SERVER_IP);
    let client = pod_netns(&ns, "vbcli", CLIENT_IP);
    let api = ApiServer::start_in_netns(
        ns.path(),
        "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
    );
    for n in 0..nodes {
        api.apply_node(node_object(n));
    }
    for j in 0..NAMESPACES {
        api.apply_namespace(namespace_object(j, envs[j as usize]));
    }
    for pod in &pods {
        api.apply_pod(pod.object());
    }
    for policy in &policies {
        api.apply_network_policy(policy.object.clone());
    }
    for k in 0..cluster_policies {
        api.apply_cluster_network_policy(benchmark_cluster_policy(k, SERVER_PORT));
    }
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let (want_ingress, want_egress) = isolated(&pods, &policies);
    let log = dir.path().join("agent.log");

    // The initial sync.
    let start = Instant::now();
    let deny_log = std::env::var("CNI_RS_SCALE_DENY_LOG").is_ok_and(|v| v == "1");
    let agent = Agent::start(
        &agent_bin,
        &ns,
        dir.path(),
        &kubeconfig,
        &log,
        if deny_log { &["--deny-log"] } else { &[] },
    );
    let deadline = start + Duration::from_secs(120);
    let initial_sync = loop {
        if isolated_metric(&ns) == Some((want_ingress.len(), want_egress.len())) {
            break start.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not isolate {} + {} addresses within 120 s (metrics say {:?}); log:\n{}",
            want_ingress.len(),
            want_egress.len(),
            isolated_metric(&ns),
            log_of(&log)
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let rss_after_sync = peak_rss_kib(agent.pid());
    let mut initial = PolicyTableView::read_maps(&ns, TABLE);
    initial.read_ingress_set(&ns, TABLE, IpAddr::V4(SERVER_IP));
    let have_ingress: BTreeSet<IpAddr> = initial.ingress4.keys().copied().collect();
    let have_egress: BTreeSet<IpAddr> = initial.egress4.keys().copied().collect();
    assert_eq!(
        have_ingress, want_ingress,
        "ingress4 after the initial sync"
    );
    assert_eq!(have_egress, want_egress, "egress4 after the initial sync");
    assert!(
        initial.admits(IpAddr::V4(SERVER_IP), IpAddr::V4(CLIENT_IP), 6, SERVER_PORT),
        "the server's profile does not admit the client"
    );
    let profiles = PolicyTableView::count_sets(&ns, TABLE) / 2;

    // Changes one at a time.
    let mut generation = Generation::open(ns.path());
    let local_ip = |j: u32| IpAddr::V4(Ipv4Addr::new(10, 100, 0, u8::try_from(j + 2).unwrap_or(0)));
    let spare = |j: &u32| ![SERVER_NS, CLIENT_NS].contains(j);
    // Namespaces whose every pod is isolated for ingress (a new pod there is too).
    let isolating_all: Vec<u32> = (0..NAMESPACES)
        .filter(spare)
        .filter(|j| {
            policies
                .iter()
                .any(|p| p.ns == *j && p.ingress && matches!(p.select, Select::All))
        })
        .collect();
    // Local pods of tier web a policy selects by that tier.
    let web_pods: Vec<u32> = (0..NAMESPACES)
        .filter(spare)
        .filter(|j| TIERS[(j % 3) as usize] == "web")
        .filter(|j| {
            policies
                .iter()
                .any(|p| p.ns == *j && p.ingress && matches!(p.select, Select::Tier("web")))
        })
        .collect();
    // The observer of namespace labels: a local pod that admits UDP 5353 from pods of
    // namespaces not labelled env=dev.
    let observer = (0..NAMESPACES)
        .filter(spare)
        .find(|j| {
            policies.iter().any(|p| {
                p.ns == *j
                    && p.object["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("mdns-"))
            })
        })
        .unwrap_or_else(|| panic!("no namespace holds an mdns policy"));
    assert!(
        !isolating_all.is_empty() && !web_pods.is_empty(),
        "too few policies for every kind of change"
    );
    let mut latencies: Vec<(usize, Duration)> = Vec::new();
    let mut extra_commits = 0;
    std::thread::sleep(Duration::from_millis(200));
    for c in 0..changes {
        let kind = (c % kinds) as usize;
        let round = c / kinds;
        let (check, object) = match kind {
            0 => {
                let j = isolating_all[round as usize % isolating_all.len()];
                let from = IpAddr::V4(Ipv4Addr::new(172, 16, (c >> 8) as u8, (c & 255) as u8));
                let port = u16::try_from(10_000 + c).unwrap_or(u16::MAX);
                let policy = Policy::new(
                    j,
                    &format!("added-{c}"),
                    Select::All,
                    &["Ingress"],
                    json!({"ingress": [{
                        "from": [{"ipBlock": {"cidr": format!("{from}/32")}}],
                        "ports": [{"protocol": "TCP", "port": port}],
                    }]}),
                );
                let object = Served::Policy(policy.object.clone());
                policies.push(policy);
                let check = Check::Admits {
                    at: local_ip(j),
                    from,
                    protocol: 6,
                    port,
                    want: true,
                };
                (check, object)
            }
            1 => {
                let j = web_pods[round as usize % web_pods.len()];
                let pod = pods
                    .iter_mut()
                    .find(|p| IpAddr::V4(p.ip) == local_ip(j))
                    .unwrap_or_else(|| panic!("no local pod in {}", ns_name(j)));
                pod.tier = if pod.tier == "web" { "batch" } else { "web" }.into();
                (
                    Check::IngressChanged(local_ip(j)),
                    Served::Pod(pod.object()),
                )
            }
            2 => {
                let j = isolating_all[(round as usize * 7) % isolating_all.len()];
                let ip = Ipv4Addr::new(10, 100, 0, u8::try_from(102 + round % 130).unwrap_or(0));
                let pod = Pod {
                    ns: j,
                    name: format!("added-{c}"),
                    node: NODE,
                    ip,
                    app: format!("app-{}", c % 10),
                    tier: "api".into(),
                };
                let object = Served::Pod(pod.object());
                pods.push(pod);
                (Check::Isolated(IpAddr::V4(ip)), object)
            }
            4 => {
                // First of all (priority 0), on an address and port of its own: no
                // other rule shadows it, so it always changes what the kernel holds.
                // (`networks` peers are egress's only: in `from` they would fail closed.)
                let to = format!("172.17.{}.{}/32", (c >> 8) & 255, c & 255);
                let policy = cluster_network_policy(
                    &format!("added-{c}"),
                    json!({
                        "tier": "Admin",
                        "priority": 0,
                        "subject": {"namespaces": {}},
                        "egress": [{
                            "name": "deny-one-address",
                            "action": "Deny",
                            "to": [{"networks": [to]}],
                            "protocols": [{"tcp": {"destinationPort": {
                                "number": 10_000 + c % 50_000}}}],
                        }],
                    }),
                );
                (Check::Committed, Served::ClusterPolicy(policy))
            }
            _ => {
                let candidates: Vec<u32> = (0..NAMESPACES)
                    .filter(spare)
                    .filter(|j| *j != observer)
                    .collect();
                let j = candidates[round as usize % candidates.len()];
                let env = &mut envs[j as usize];
                *env = if *env == "dev" { "prod" } else { "dev" };
                let check = Check::Admits {
                    at: local_ip(observer),
                    from: local_ip(j),
                    protocol: 17,
                    port: 5353,
                    want: *env != "dev",
                };
                (check, Served::Namespace(namespace_object(j, env)))
            }
        };
        let before = check.read(&ns);
        let from = generation.current();
        // Served: from here on the watches see it.
        let served = Instant::now();
        match object {
            Served::Policy(object) => api.apply_network_policy(object),
            Served::Pod(object) => api.apply_pod(object),
            Served::Namespace(object) => api.apply_namespace(object),
            Served::ClusterPolicy(object) => api.apply_cluster_network_policy(object),
        };
        let committed = generation
            .changed_since(from, served + Duration::from_secs(30))
            .unwrap_or_else(|| {
                panic!(
                    "change {c} ({}): nothing committed within 30 s; agent log:\n{}",
                    KINDS[kind],
                    log_of(&log)
                )
            });
        latencies.push((kind, committed.saturating_duration_since(served)));
        std::thread::sleep(Duration::from_millis(20));
        extra_commits += generation.current().wrapping_sub(from).saturating_sub(1);
        let after = check.read(&ns);
        assert!(
            check.holds(&before, &after),
            "change {c} ({}): the table does not show that {}; agent log:\n{}",
            KINDS[kind],
            check.describe(),
            log_of(&log)
        );
    }
    let rss_peak = peak_rss_kib(agent.pid());
    let table = PolicyTableView::read_maps(&ns, TABLE);
    let (want_ingress_end, want_egress_end) = isolated(&pods, &policies);
    let have_ingress: BTreeSet<IpAddr> = table.ingress4.keys().copied().collect();
    let have_egress: BTreeSet<IpAddr> = table.egress4.keys().copied().collect();
    assert_eq!(have_ingress, want_ingress_end, "ingress4 after the changes");
    assert_eq!(have_egress, want_egress_end, "egress4 after the changes");

    // New connections, next to a node without policies.
    let bare = node_netns("cnibb-np-bare");
    let bare_server = pod_netns(&bare, "vbsrv", SERVER_IP);
    let bare_client = pod_netns(&bare, "vbcli", CLIENT_IP);
    let bare_api = ApiServer::start_in_netns(
        bare.path(),
        "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
    );
    bare_api.apply_node(node_object(NODE));
    for j in [SERVER_NS, CLIENT_NS] {
        bare_api.apply_namespace(namespace_object(j, envs[j as usize]));
    }
    for pod in bench_pods() {
        bare_api.apply_pod(pod.object());
    }
    let bare_dir = TempDir::new("cnibb-np-bare");
    let bare_kubeconfig = bare_dir.path().join("kubeconfig");
    bare_api.write_kubeconfig(&bare_kubeconfig);
    let bare_log = bare_dir.path().join("agent.log");
    let bare_agent = Agent::start(
        &agent_bin,
        &bare,
        bare_dir.path(),
        &bare_kubeconfig,
        &bare_log,
        &[],
    );
    let health: SocketAddr = HEALTH_ADDR.parse().unwrap_or_else(|e| panic!("{e}"));
    let ready_by = Instant::now() + Duration::from_secs(30);
    while probe::get(bare.path(), health, "/readyz", Duration::from_secs(2))
        .map_or(true, |a| a.status != 200)
    {
        assert!(
            Instant::now() < ready_by,
            "the second agent is not ready after 30 s; log:\n{}",
            log_of(&bare_log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let to = SocketAddr::new(IpAddr::V4(SERVER_IP), SERVER_PORT);
    let other_port = SocketAddr::new(IpAddr::V4(SERVER_IP), SERVER_PORT + 1);
    serve_and_close(server.path(), to);
    serve_and_close(bare_server.path(), to);
    // Isolation is in force on the node with policies, and on the other nothing is.
    assert_eq!(
        try_connect(client.path(), other_port, Duration::from_millis(500)),
        Err("TimedOut".into()),
        "a port no policy allows must be dropped"
    );
    assert_eq!(
        try_connect(bare_client.path(), other_port, Duration::from_millis(500)),
        Err("ConnectionRefused".into()),
        "without policies the server answers"
    );
    let timers = [
        ConnectionTimer::start(client.path(), to),
        ConnectionTimer::start(bare_client.path(), to),
    ];
    for timer in &timers {
        timer.time(50).unwrap_or_else(|e| panic!("warm-up: {e}"));
    }
    // Short rounds, alternating which side goes first, so both see the same bursts of
    // the machine's other work.
    let mut with_times = Vec::new();
    let mut without_times = Vec::new();
    let rounds = connections.div_ceil(CONNECTIONS_PER_ROUND);
    for r in 0..rounds {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let times = if side == 0 {
                &mut with_times
            } else {
                &mut without_times
            };
            times.extend(
                timers[side]
                    .time(CONNECTIONS_PER_ROUND)
                    .unwrap_or_else(|e| panic!("{e}")),
            );
        }
    }
    drop(timers);
    with_times.sort();
    without_times.sort();
    drop(bare_agent);
    let deny_load = deny_log.then(|| deny_log_load(&agent, &client, &ns, &log));
    drop(agent);
    if let Some(keep) = std::env::var_os("CNI_RS_SCALE_AGENT_LOG") {
        let _ = std::fs::copy(&log, keep);
    }

    let mut by_kind: BTreeMap<usize, Vec<Duration>> = BTreeMap::new();
    for (kind, d) in &latencies {
        by_kind.entry(*kind).or_default().push(*d);
    }
    let mut all: Vec<Duration> = latencies.iter().map(|(_, d)| *d).collect();
    all.sort();
    let kinds: Vec<String> = by_kind
        .iter_mut()
        .map(|(kind, list)| {
            list.sort();
            format!(
                "{}_p50_ms={:.2} {}_max_ms={:.2}",
                KINDS[*kind],
                ms(percentile(list, 50)),
                KINDS[*kind],
                ms(list[list.len() - 1])
            )
        })
        .collect();
    println!(
        "policy-scale pods={} nodes={nodes} namespaces={NAMESPACES} policies={policy_count} cluster_policies={cluster_policies} local_pods={} isolated_ingress={} isolated_egress={} profiles={profiles} initial_sync_ms={:.0} rss_after_sync_mib={:.1} rss_peak_mib={:.1} changes={changes} event_p50_ms={:.2} event_p99_ms={:.2} event_max_ms={:.2} {} extra_commits={extra_commits} connections={} connect_none_p50_us={:.1} connect_none_p99_us={:.1} connect_policies_p50_us={:.1} connect_policies_p99_us={:.1} ratio_p50={:.3} ratio_p99={:.3}",
        served_pods,
        local_pods,
        want_ingress.len(),
        want_egress.len(),
        ms(initial_sync),
        rss_after_sync as f64 / 1024.0,
        rss_peak as f64 / 1024.0,
        ms(percentile(&all, 50)),
        ms(percentile(&all, 99)),
        ms(all[all.len() - 1]),
        kinds.join(" "),
        with_times.len(),
        us(percentile(&without_times, 50)),
        us(percentile(&without_times, 99)),
        us(percentile(&with_times, 50)),
        us(percentile(&with_times, 99)),
        us(percentile(&with_times, 50)) / us(percentile(&without_times, 50)),
        us(percentile(&with_times, 99)) / us(percentile(&without_times, 99)),
    );
    if let Some(load) = deny_load {
        println!(
            "policy-scale deny_log_attempts_per_s={:.0} deny_log_cpu_fraction={:.3} \
             deny_log_lines_per_s={:.1} deny_log_lines_vs_rate={:.3} \
             deny_log_rate_per_s={DENY_LOG_RATE} \
             deny_log_healthz_max_ms={:.1} deny_log_healthz_asked={}",
            load.attempts_per_s,
            load.cpu_fraction,
            load.lines_per_s,
            load.lines_vs_rate,
            ms(load.healthz_max),
            load.healthz_asked,
        );
    }
}

/// The agent's default `--deny-log-rate`: lines a second.
const DENY_LOG_RATE: u32 = 100;
/// Denied attempts a second, and for how long, in [`deny_log_load`].
const DENY_ATTEMPTS_PER_S: u32 = 10_000;
const DENY_LOAD: Duration = Duration::from_secs(10);

/// What the deny log cost under a flood of denied attempts.
struct DenyLoad {
    attempts_per_s: f64,
    /// The agent's CPU time over the flood, as a fraction of one CPU.
    cpu_fraction: f64,
    lines_per_s: f64,
    /// The lines written over what the rate allows in that time: a second's worth at
    /// once (the agent's bucket starts full), then the rate.
    lines_vs_rate: f64,
    healthz_max: Duration,
    healthz_asked: usize,
}

/// The agent's CPU time so far (user + system), from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

fn deny_log_lines(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("denied new connection"))
        .count()
}

/// The deny log under load: the client sends [`DENY_ATTEMPTS_PER_S`] UDP datagrams a
/// second for [`DENY_LOAD`] to ports of the server that its policy denies, each from the
/// client's one socket to a port of its own (every one a new connection the kernel
/// drops and may log), while `/healthz` is asked every 100 ms. Measured: the attempts'
/// rate, the agent's CPU time over it, the deny log lines it wrote, the slowest answer
/// of `/healthz`.
fn deny_log_load(agent: &Agent, client: &Netns, node: &Netns, log: &Path) -> DenyLoad {
    let socket = cni_blackbox::hostport::in_netns(client.path(), || {
        std::net::UdpSocket::bind("0.0.0.0:0").unwrap_or_else(|e| panic!("bind: {e}"))
    });
    let lines_before = deny_log_lines(log);
    let cpu_before = cpu_time(agent.pid());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&stop);
    let node_path = node.path().to_path_buf();
    let health_thread = std::thread::spawn(move || {
        let health: SocketAddr = HEALTH_ADDR.parse().unwrap_or_else(|e| panic!("{e}"));
        let mut times = Vec::new();
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            let asked = Instant::now();
            let answer = probe::get(&node_path, health, "/healthz", Duration::from_secs(2));
            let took = asked.elapsed();
            assert!(
                answer.as_ref().is_ok_and(|a| a.status == 200),
                "/healthz under the deny flood: {answer:?}"
            );
            times.push(took);
            std::thread::sleep(Duration::from_millis(100).saturating_sub(took));
        }
        times
    });
    let started = Instant::now();
    let mut sent: u64 = 0;
    let batch = DENY_ATTEMPTS_PER_S / 100;
    while started.elapsed() < DENY_LOAD {
        for _ in 0..batch {
            // Ports 20,000 to 59,999 in turn: none is allowed to the client.
            let port = 20_000 + u16::try_from(sent % 40_000).unwrap_or(0);
            let _ = socket.send_to(b"denied", SocketAddr::new(IpAddr::V4(SERVER_IP), port));
            sent += 1;
        }
        let due = Duration::from_secs_f64(sent as f64 / f64::from(DENY_ATTEMPTS_PER_S));
        std::thread::sleep(due.saturating_sub(started.elapsed()));
    }
    let took = started.elapsed();
    let cpu = cpu_time(agent.pid()).saturating_sub(cpu_before);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let healthz = health_thread
        .join()
        .unwrap_or_else(|_| panic!("the /healthz asker failed"));
    // The last lines of the flood reach the log a moment later.
    std::thread::sleep(Duration::from_millis(500));
    let lines = deny_log_lines(log).saturating_sub(lines_before);
    assert!(
        lines > 0,
        "the flood of denied attempts wrote no deny log line"
    );
    // What the agent says it wrote and dropped, and why (the kernel's own limit, per
    // verdict chain, drops the rest before the agent sees it).
    let health: SocketAddr = HEALTH_ADDR.parse().unwrap_or_else(|e| panic!("{e}"));
    let metrics = probe::get(node.path(), health, "/metrics", Duration::from_secs(2))
        .map(|a| a.body)
        .unwrap_or_default();
    let counters: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("cni_node_policy_deny_log_"))
        .collect();
    println!("deny log counters after the flood: {}", counters.join("; "));
    DenyLoad {
        attempts_per_s: sent as f64 / took.as_secs_f64(),
        cpu_fraction: cpu.as_secs_f64() / took.as_secs_f64(),
        lines_per_s: lines as f64 / took.as_secs_f64(),
        lines_vs_rate: lines as f64 / (f64::from(DENY_LOG_RATE) * (took.as_secs_f64() + 1.0)),
        healthz_max: healthz.iter().max().copied().unwrap_or_default(),
        healthz_asked: healthz.len(),
    }
}
