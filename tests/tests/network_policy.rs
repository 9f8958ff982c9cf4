//! NetworkPolicy end to end: the upstream e2e suite's matrix on a cluster of network
//! namespaces, with an oracle written apart from the agent as the expectation.
//!
//! The cluster (`cni_blackbox::cluster`) has two nodes running `cni-node` against the
//! Kubernetes API test server. Namespaces x, y and z (labelled `ns=<name>`) each hold
//! pods a, b and c (labelled `pod=<name>`), spread over both nodes so that same-node and
//! cross-node pairs exist. Each pod is attached through cnitool with the runtime's
//! `K8S_POD_NAMESPACE`/`K8S_POD_NAME`, its Pod object carries its addresses of both
//! families and the named ports `serve-80-tcp`, `serve-80-udp`, `serve-81-tcp` and
//! `serve-81-udp`, and it runs servers on 80 and 81, TCP and UDP, both families.
//!
//! A matrix is every (source pod, destination pod, protocol, port, family), pairs of a
//! pod with itself left out: 576 probes for the nine pods, run at once with short
//! timeouts (`cni_blackbox::netpol`). What each probe should do comes from
//! `cni_blackbox::policy_oracle` over the objects the API server holds at that moment:
//! NetworkPolicy written from the Kubernetes documentation, reading the objects' JSON
//! itself, with no code of the agent's (`policy_oracle.rs` checks it against the agent's
//! model on random clusters). A step passes when a whole matrix equals the oracle
//! ("the model" below); the matrix is run again until it does, for at most
//! [`DEADLINE`]. The time it took is printed for every step (the target is [`TARGET`],
//! which only the summary mentions: timing is for benchmarks, the test asserts the
//! deadline). The expected verdicts all come from one function, [`expected`].
//!
//! A policy's denial is a drop, so a probe the model denies passes only when it times
//! out: a refusal (a reset, an ICMP unreachable) or an error anywhere fails the test at
//! once, naming the probe and saying the server or the route is broken, not the policy.
//! A dead server behind a policy that drops would time out like a denial, so each
//! denied probe's server must be shown alive in the same pass: a probe the model allows
//! reached it, or, where none may, a probe from its node (which the policy never
//! judges; kubelet's probes must pass) did.
//!
//! Through each step, from just before its first write until the matrix equals the
//! model, three more threads probe the whole matrix round after round, each round
//! complete, each a third of a probe timeout behind the last; every cell the step
//! cannot touch must keep its verdict in every round (a failure names the cell and the
//! round's time from the change). "Cannot touch":
//! each side of the cell (the source's egress, the destination's ingress) is the same
//! in every state an agent may be in during the change: any write of each kind (each
//! kind is watched on its own), each side on its own node's agent.
//!
//! Every case runs against the same cluster, after the previous case's policies are
//! deleted and labels it changed are set back. The cases are data
//! (`network_policy_cases`): upstream's 42 TCP, 3 UDP and 3 SCTP cases, then endPort
//! and dual-stack ipBlock cases of our own. Each step's truth tables (upstream's, and
//! ours for our cases) are checked against the oracle before the matrix is checked
//! against it, so the oracle is tested too. SCTP itself is never probed (the kernel
//! here has none, which the test checks and says): the SCTP cases' truth tables check
//! the model, and their policies are probed on TCP and UDP.
//!
//! Beside the matrix: `cni-node explain` asked about every probe of one case (on each
//! agent's explain socket; the health address refuses `/explain`), the
//! policy table empty once every policy is gone, a node reaching its own pods under
//! default deny, established flows cut or kept by a new policy (a TCP connection for
//! the cut; numbered UDP datagrams every 10 ms, echoed, for a drop shorter than TCP's
//! retransmission: an allowed flow loses none), and new pods judged before their
//! addresses reach the API. Then the agent killed, and the API server gone, in the
//! middle of a policy change. Last, the harness itself: a pod's servers stopped fail
//! the matrix, whether probes the model allows meet them (refused) or only denied ones
//! do (its node's probe is refused); and a numbered flow sees a drop of about 0.1 s
//! that a TCP echo rides out. `CNI_RS_NP_KILL_SERVER=<namespace/pod>` stops that pod's
//! servers in every test, to watch them fail.

mod network_policy_cases;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cni_blackbox::cluster::{Cluster, Host, node_name, node_v4, node_v6, parse};
use cni_blackbox::hostport::in_netns;
use cni_blackbox::netpol::{self, Datagram, Outcome, Probe, Protocol, Sequence, Servers};
use cni_blackbox::policy_matrix::{self, Cell, NotConverged, Pods, Server, seconds};
use cni_blackbox::policy_oracle::{Direction, Oracle, Verdict};
use cni_blackbox::{Netns, parallel, plugin_path, require_root};
use cni_kube_api::{Kind, network_policy, realistic_namespace, realistic_pod};
use network_policy_cases::{Action, Case, Step};
use serde_json::{Value, json};

/// The servers' ports.
const PORTS: [u16; 2] = [80, 81];
/// The namespaces of the matrix.
const NAMESPACES: [&str; 3] = ["x", "y", "z"];
/// The pods of each namespace.
const PODS: [&str; 3] = ["a", "b", "c"];
/// How long a probe waits for its answer (a denial is a drop: it always waits this).
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a matrix may take to equal the model after a change.
const DEADLINE: Duration = Duration::from_secs(10);
/// How soon a policy that denies an established flow must cut it.
const CUT_WINDOW: Duration = Duration::from_secs(2);
/// What the agent should do after a change (printed, not asserted), and must do once
/// back from an API outage (asserted there).
const TARGET: Duration = Duration::from_secs(2);
/// The policy table's name (family inet).
const TABLE: &str = "cni_node_policy";

/// The tests of this file one at a time: each builds a cluster and measures how fast
/// it follows changes, which the other's load would blur.
static SERIAL: Mutex<()> = Mutex::new(());

/// A pod of the matrix.
#[derive(Debug, Clone)]
struct Member {
    namespace: String,
    name: String,
    node: u8,
    v4: IpAddr,
    v6: IpAddr,
    netns: PathBuf,
    /// Whether its Pod object shows its addresses.
    posted: bool,
}

impl Member {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn ip(&self, v6: bool) -> IpAddr {
        if v6 { self.v6 } else { self.v4 }
    }
}

/// What a probe is asked about: source and destination addresses, protocol (as
/// NetworkPolicy spells it), port.
type Ask = (IpAddr, IpAddr, &'static str, u16);

/// What NetworkPolicy says of each of `asks` given `objects`: the one place the
/// matrix's expectations come from (the tests' own oracle, which shares no code with
/// the agent).
fn expected(objects: &Objects, asks: &[Ask]) -> Vec<Verdict> {
    let oracle =
        Oracle::new(&objects.pods, &objects.namespaces, &objects.policies).unwrap_or_else(|e| {
            panic!("the oracle cannot read the API server's objects (a mistake in the case): {e}")
        });
    asks.iter()
        .map(|&(from, to, protocol, port)| oracle.verdict(from, to, protocol, port))
        .collect()
}

/// Whether a verdict's egress side and its ingress side let the connection pass: each
/// is judged by the agent of its own pod's node, which may be a view behind the other.
fn sides(verdict: &Verdict) -> (bool, bool) {
    (
        verdict.egress.as_ref().is_none_or(Direction::allows),
        verdict.from_its_node || verdict.ingress.as_ref().is_none_or(Direction::allows),
    )
}

/// A matrix that equalled the model.
#[derive(Debug)]
struct Converged {
    /// When the pass that matched began, after the change.
    after: Duration,
    passes: u32,
    cells: Vec<Cell>,
    outcomes: Vec<Outcome>,
}

impl Converged {
    fn denied(&self) -> usize {
        self.outcomes.iter().filter(|o| !o.passed()).count()
    }
}

/// A step of a case that passed.
#[derive(Debug)]
struct Stepped {
    converged: Converged,
    /// Rounds of the whole matrix made through the change.
    rounds: usize,
    /// Cells the change could not touch, watched in every round.
    kept: usize,
}

/// The objects the API server holds, as it returns them.
#[derive(Clone)]
struct Objects {
    pods: Vec<Value>,
    namespaces: Vec<Value>,
    policies: Vec<Value>,
}

/// The cluster, its pods and their servers.
struct World {
    // Field order is drop order: the servers close their sockets before the cluster
    // deletes the pods.
    /// Each member's servers (`None`: killed on purpose).
    servers: Vec<Option<Servers>>,
    cluster: Cluster,
    members: Vec<Member>,
    /// Each pod's labels now (`namespace/name`).
    pod_labels: BTreeMap<String, Vec<(String, String)>>,
    /// Each namespace's labels now, when a case changed them.
    namespace_labels: BTreeMap<String, Vec<(String, String)>>,
    /// While a change is recorded: each write's kind and the objects after it.
    writes: Option<Vec<(Written, Objects)>>,
}

/// The kind of object a write changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    Pod,
    Namespace,
    Policy,
}

/// One round of a [`Watch`]: when it began, and every probe's outcome.
struct Round {
    began: Instant,
    outcomes: Vec<Outcome>,
}

/// Probes round after round, each round complete (nothing cut short, so every cell is
/// seen in every round), until finished. A round lasts a [`PROBE_TIMEOUT`] (denied
/// probes wait it out) and a TCP probe looks once, at its SYN; so [`WATCH_LANES`]
/// threads run rounds side by side, each started that much later than the last, and a
/// cell is looked at [`WATCH_LANES`] times per timeout.
struct Watch {
    stop: Arc<AtomicBool>,
    rounds: Arc<std::sync::atomic::AtomicUsize>,
    lanes: Vec<std::thread::JoinHandle<Vec<Round>>>,
}

/// Threads of a [`Watch`].
const WATCH_LANES: u32 = 3;

impl Watch {
    fn start(probes: Vec<Probe>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let probes = Arc::new(probes);
        let lanes = (0..WATCH_LANES)
            .map(|lane| {
                let (flag, count, probes) =
                    (Arc::clone(&stop), Arc::clone(&rounds), Arc::clone(&probes));
                std::thread::spawn(move || {
                    std::thread::sleep(PROBE_TIMEOUT * lane / WATCH_LANES);
                    let mut done = Vec::new();
                    while !flag.load(Ordering::Relaxed) {
                        let began = Instant::now();
                        let outcomes = netpol::run(&probes, PROBE_TIMEOUT, |_, _| false);
                        done.push(Round { began, outcomes });
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    done
                })
            })
            .collect();
        Self {
            stop,
            rounds,
            lanes,
        }
    }

    /// Waits until a whole round is done, so that one is done before the change.
    fn wait_for_a_round(&self) {
        while self.rounds.load(Ordering::Relaxed) == 0
            && self.lanes.iter().all(|t| !t.is_finished())
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops after the rounds under way, and returns every round in the order they
    /// began.
    fn finish(mut self) -> Vec<Round> {
        self.stop.store(true, Ordering::Relaxed);
        let mut rounds: Vec<Round> = self
            .lanes
            .drain(..)
            .flat_map(|t| t.join().unwrap_or_default())
            .collect();
        rounds.sort_by_key(|r| r.began);
        rounds
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for lane in self.lanes.drain(..) {
            let _ = lane.join();
        }
    }
}

fn default_pod_labels(name: &str) -> Vec<(String, String)> {
    vec![("pod".to_owned(), name.to_owned())]
}

/// The Pod object of a matrix pod: the API test server's realistic Pod with the
/// servers' named ports, on node `node`, with `ips` (none: pending, no address yet).
fn pod_object(
    namespace: &str,
    name: &str,
    node: u8,
    ips: &[IpAddr],
    labels: &[(String, String)],
) -> Value {
    let texts: Vec<String> = ips.iter().map(ToString::to_string).collect();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let labels: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut pod = realistic_pod(namespace, name, &node_name(node), &texts, &labels);
    let ports: Vec<Value> = PORTS
        .iter()
        .flat_map(|port| {
            Protocol::ALL.iter().map(move |p| {
                json!({
                    "name": format!("serve-{port}-{}", p.name().to_ascii_lowercase()),
                    "containerPort": port,
                    "protocol": p.name(),
                })
            })
        })
        .collect();
    pod["spec"]["containers"][0]["ports"] = json!(ports);
    pod["status"]["hostIP"] = json!(node_v4(node));
    pod["status"]["hostIPs"] = json!([{"ip": node_v4(node)}, {"ip": node_v6(node)}]);
    if ips.is_empty()
        && let Some(status) = pod["status"].as_object_mut()
    {
        status.remove("podIP");
        status.remove("podIPs");
        status.insert("phase".into(), json!("Pending"));
    }
    pod
}

fn namespace_object(name: &str, labels: &[(String, String)]) -> Value {
    let labels: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    realistic_namespace(name, &labels)
}

fn default_namespace_labels(name: &str) -> Vec<(String, String)> {
    vec![("ns".to_owned(), name.to_owned())]
}

impl World {
    /// Two nodes, namespaces x, y and z, and pods a, b and c in each, with servers.
    /// Node 2's agent holds every peer of pods in a shared set (a rule per peer in its
    /// profiles), node 1's copies them into its profiles' own sets (the default for
    /// peers this small), so that both ways are judged by every matrix.
    fn new() -> Self {
        let started = Instant::now();
        let cluster = Cluster::new_with(2, 1500, |host| {
            if host.n == 2 {
                host.extra_args
                    .push("--policy-shared-peer-ranges=1".to_owned());
            }
        });
        cluster.wait_for_conflists();
        let mesh = cluster.mesh_of();
        cluster.wait_for_routes(Duration::from_secs(20), Cluster::full_mesh(&mesh));
        let mut world = Self {
            servers: Vec::new(),
            cluster,
            members: Vec::new(),
            pod_labels: BTreeMap::new(),
            namespace_labels: BTreeMap::new(),
            writes: None,
        };
        for ns in NAMESPACES {
            world
                .cluster
                .api
                .apply_namespace(namespace_object(ns, &default_namespace_labels(ns)));
        }
        let mut i = 0u8;
        for ns in NAMESPACES {
            for name in PODS {
                // x/a on node 1, x/b on node 2, x/c on node 1, y/a on node 2, ...
                world.add_pod(ns, name, 1 + i % 2);
                world.post_ips(world.members.len() - 1);
                i += 1;
            }
        }
        let placement: Vec<String> = world
            .members
            .iter()
            .map(|m| format!("{} node {}", m.key(), m.node))
            .collect();
        println!(
            "cluster of 2 nodes and {} pods ready after {:.1} s: {}",
            world.members.len(),
            started.elapsed().as_secs_f64(),
            placement.join(", ")
        );
        // CNI_RS_NP_KILL_SERVER=<namespace/pod>: that pod's servers stopped from the
        // start, to see the tests fail on a dead server rather than read it as a denial.
        if let Ok(key) = std::env::var("CNI_RS_NP_KILL_SERVER") {
            let i = world.member(&key);
            world.kill_servers(i);
            println!("CNI_RS_NP_KILL_SERVER={key}: its servers are stopped");
        }
        world
    }

    /// Stops pod `i`'s servers: its ports refuse from now on.
    fn kill_servers(&mut self, i: usize) {
        drop(self.servers[i].take());
    }

    /// Pod `namespace/name` as a runtime makes it: the Pod object (no address yet),
    /// then ADD with the K8S arguments, then its servers. Returns its index; its
    /// addresses are not posted.
    fn add_pod(&mut self, namespace: &str, name: &str, node: u8) -> usize {
        let labels = default_pod_labels(name);
        self.cluster
            .api
            .apply_pod(pod_object(namespace, name, node, &[], &labels));
        let uid = self
            .cluster
            .api
            .get(Kind::Pod, namespace, name)
            .and_then(|pod| pod["metadata"]["uid"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("the API server gave {namespace}/{name} no uid"));
        let pod = self.cluster.host(node).add_k8s_pod(namespace, name, &uid);
        let member = Member {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            node,
            v4: pod.v4,
            v6: pod.v6,
            netns: pod.ns.path().to_path_buf(),
            posted: false,
        };
        self.servers
            .push(Some(Servers::start(&member.netns, &PORTS)));
        self.pod_labels.insert(member.key(), labels);
        self.members.push(member);
        self.members.len() - 1
    }

    /// Posts pod `i`'s addresses to its Pod object, as the kubelet does.
    fn post_ips(&mut self, i: usize) {
        self.members[i].posted = true;
        self.apply_pod(i);
    }

    fn apply_pod(&self, i: usize) {
        let m = &self.members[i];
        let ips: &[IpAddr] = if m.posted { &[m.v4, m.v6] } else { &[] };
        let labels = &self.pod_labels[&m.key()];
        self.cluster
            .api
            .apply_pod(pod_object(&m.namespace, &m.name, m.node, ips, labels));
    }

    fn member(&self, key: &str) -> usize {
        self.members
            .iter()
            .position(|m| m.key() == key)
            .unwrap_or_else(|| panic!("no pod {key}"))
    }

    /// Every pod's addresses (v4, v6) by `namespace/name`.
    fn addresses(&self) -> BTreeMap<String, (IpAddr, IpAddr)> {
        self.members
            .iter()
            .map(|m| (m.key(), (m.v4, m.v6)))
            .collect()
    }

    /// The objects the API server holds now.
    fn objects(&self) -> Objects {
        let api = &self.cluster.api;
        let all = |kind: Kind| -> Vec<Value> {
            api.keys(kind)
                .iter()
                .map(|key| {
                    let (namespace, name) = key.split_once('/').unwrap_or(("", key));
                    api.get(kind, namespace, name)
                        .unwrap_or_else(|| panic!("{key} vanished"))
                })
                .collect()
        };
        Objects {
            pods: all(Kind::Pod),
            namespaces: all(Kind::Namespace),
            policies: all(Kind::NetworkPolicy),
        }
    }

    /// Every probe between pods whose addresses are posted.
    fn cells(&self) -> Vec<Cell> {
        let posted: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].posted)
            .collect();
        let mut cells = Vec::new();
        for &from in &posted {
            for &to in &posted {
                if from == to {
                    continue;
                }
                for protocol in Protocol::ALL {
                    for port in PORTS {
                        for v6 in [false, true] {
                            cells.push(Cell {
                                from,
                                to,
                                protocol,
                                port,
                                v6,
                            });
                        }
                    }
                }
            }
        }
        cells
    }

    /// Every probe between pods whose addresses are posted, with what the model (of the
    /// objects the API server holds now) says of it.
    fn model(&self) -> (Vec<Cell>, Vec<Verdict>) {
        let cells = self.cells();
        let verdicts = expected(&self.objects(), &self.asks(&cells));
        (cells, verdicts)
    }

    fn asks(&self, cells: &[Cell]) -> Vec<Ask> {
        cells
            .iter()
            .map(|c| {
                (
                    self.members[c.from].ip(c.v6),
                    self.members[c.to].ip(c.v6),
                    c.protocol.name(),
                    c.port,
                )
            })
            .collect()
    }

    /// Runs the matrix until it equals the model (of the objects now), for at most
    /// [`DEADLINE`] after `since` ([`policy_matrix::converge`]); the failure's text has
    /// the cells that differ and each node's table and log.
    fn converge(&self, since: Instant) -> Result<Converged, String> {
        let (cells, verdicts) = self.model();
        let expected: Vec<bool> = verdicts.iter().map(Verdict::allowed).collect();
        match policy_matrix::converge(self, &cells, &expected, since, DEADLINE, PROBE_TIMEOUT) {
            Ok(c) => Ok(Converged {
                after: c.after,
                passes: c.passes,
                cells,
                outcomes: c.outcomes,
            }),
            Err(NotConverged::Broken(why)) => Err(why),
            Err(NotConverged::Differs { passes, outcomes }) => {
                Err(self.report(&cells, &verdicts, &outcomes, passes))
            }
        }
    }

    fn report(
        &self,
        cells: &[Cell],
        verdicts: &[Verdict],
        outcomes: &[Outcome],
        passes: u32,
    ) -> String {
        let wrong: Vec<String> = cells
            .iter()
            .zip(verdicts)
            .zip(outcomes)
            .filter(|((_, v), o)| !o.agrees(v.allowed()))
            .map(|((c, v), o)| {
                format!(
                    "  {}: the model says {} ({}), the probe {}",
                    self.describe(c),
                    if v.allowed() { "allowed" } else { "denied" },
                    why(v),
                    o.word()
                )
            })
            .collect();
        let mut text = format!(
            "the matrix still differs from the model after {DEADLINE:?} ({passes} passes): \
             {} of {} probes\n",
            wrong.len(),
            cells.len()
        );
        for line in wrong.iter().take(40) {
            let _ = writeln!(text, "{line}");
        }
        if wrong.len() > 40 {
            let _ = writeln!(text, "  ... and {} more", wrong.len() - 40);
        }
        for host in &self.cluster.hosts {
            let table = host.ns.exec(&["nft", "list", "table", "inet", TABLE]);
            let log = host.agent_log();
            let tail: Vec<&str> = log
                .lines()
                .rev()
                .filter(|l| !l.contains(" DEBUG "))
                .take(15)
                .collect();
            let _ = write!(
                text,
                "node {} table:\n{}{}\nnode {} agent log (last lines above DEBUG):\n{}\n",
                host.n,
                String::from_utf8_lossy(&table.stdout),
                String::from_utf8_lossy(&table.stderr),
                host.n,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        text
    }

    /// Deletes every policy and sets the labels cases change back.
    fn reset(&mut self) {
        for key in self.cluster.api.keys(Kind::NetworkPolicy) {
            let (namespace, name) = key.split_once('/').unwrap_or(("", &key));
            self.cluster.api.delete_network_policy(namespace, name);
            self.wrote(Written::Policy);
        }
        for i in 0..self.members.len() {
            let (key, name) = (self.members[i].key(), self.members[i].name.clone());
            if self.pod_labels[&key] != default_pod_labels(&name) {
                self.pod_labels.insert(key, default_pod_labels(&name));
                self.apply_pod(i);
                self.wrote(Written::Pod);
            }
        }
        for (ns, _) in std::mem::take(&mut self.namespace_labels) {
            self.cluster
                .api
                .apply_namespace(namespace_object(&ns, &default_namespace_labels(&ns)));
            self.wrote(Written::Namespace);
        }
    }

    /// Notes the objects after a write of `kind`, while a change is being recorded.
    fn wrote(&mut self, kind: Written) {
        if self.writes.is_some() {
            let objects = self.objects();
            if let Some(writes) = self.writes.as_mut() {
                writes.push((kind, objects));
            }
        }
    }

    fn act(&mut self, action: &Action) {
        let owned = |labels: &[(&str, &str)]| -> Vec<(String, String)> {
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let written = match action {
            Action::Policy(ns, name, spec) => {
                self.cluster
                    .api
                    .apply_network_policy(network_policy(ns, name, spec.clone()));
                Written::Policy
            }
            Action::DeletePolicy(ns, name) => {
                assert!(
                    self.cluster.api.delete_network_policy(ns, name),
                    "no policy {ns}/{name} to delete"
                );
                Written::Policy
            }
            Action::PodLabels(ns, name, labels) => {
                let i = self.member(&format!("{ns}/{name}"));
                self.pod_labels.insert(self.members[i].key(), owned(labels));
                self.apply_pod(i);
                Written::Pod
            }
            Action::NamespaceLabels(ns, labels) => {
                let labels = owned(labels);
                self.cluster
                    .api
                    .apply_namespace(namespace_object(ns, &labels));
                self.namespace_labels.insert((*ns).to_owned(), labels);
                Written::Namespace
            }
        };
        self.wrote(written);
    }

    /// Every server of the pods whose addresses are posted.
    fn servers_posted(&self) -> Vec<Server> {
        let mut servers = Vec::new();
        for member in (0..self.members.len()).filter(|&i| self.members[i].posted) {
            for protocol in Protocol::ALL {
                for port in PORTS {
                    for v6 in [false, true] {
                        servers.push(Server {
                            member,
                            protocol,
                            port,
                            v6,
                        });
                    }
                }
            }
        }
        servers
    }

    /// For each of `cells`, its verdict when the change made of `writes` (each with the
    /// objects after it) cannot touch it, from the objects `before` on: `None` when it
    /// may. Each kind is watched on its own, so an agent may be at any write of each
    /// kind whatever it saw of the others; and each side of a cell is judged by the
    /// agent of its own pod's node, which may be at another point. A cell is untouched
    /// when each of its sides is the same in every such mix.
    fn untouched(
        &self,
        cells: &[Cell],
        before: &Objects,
        writes: &[(Written, Objects)],
    ) -> Vec<Option<bool>> {
        let mut pods = vec![&before.pods];
        let mut namespaces = vec![&before.namespaces];
        let mut policies = vec![&before.policies];
        for (kind, objects) in writes {
            match kind {
                Written::Pod => pods.push(&objects.pods),
                Written::Namespace => namespaces.push(&objects.namespaces),
                Written::Policy => policies.push(&objects.policies),
            }
        }
        let asks = self.asks(cells);
        let mut first: Option<Vec<(bool, bool)>> = None;
        let mut same = vec![true; cells.len()];
        for pods in &pods {
            for namespaces in &namespaces {
                for policies in &policies {
                    let mix = Objects {
                        pods: (*pods).clone(),
                        namespaces: (*namespaces).clone(),
                        policies: (*policies).clone(),
                    };
                    let now: Vec<(bool, bool)> = expected(&mix, &asks).iter().map(sides).collect();
                    match &first {
                        None => first = Some(now),
                        Some(first) => {
                            for ((same, a), b) in same.iter_mut().zip(first).zip(&now) {
                                *same &= a == b;
                            }
                        }
                    }
                }
            }
        }
        first
            .unwrap_or_default()
            .into_iter()
            .zip(same)
            .map(|((egress, ingress), same)| same.then_some(egress && ingress))
            .collect()
    }

    /// What went wrong in the `rounds` a [`Watch`] made of `cells` and of `servers`
    /// (from their nodes) through a change that began at `change`: a refusal or an error
    /// anywhere, a cell the change cannot touch (`untouched`) that did not keep its
    /// verdict, and a server of such a denied cell that no probe of the round reached.
    fn judge_watch(
        &self,
        cells: &[Cell],
        servers: &[Server],
        untouched: &[Option<bool>],
        rounds: &[Round],
        change: Instant,
    ) -> Vec<String> {
        let need: BTreeSet<Server> = cells
            .iter()
            .zip(untouched)
            .filter(|(_, u)| **u == Some(false))
            .map(|(c, _)| c.server())
            .collect();
        let mut problems = Vec::new();
        for (r, round) in rounds.iter().enumerate() {
            let at = if round.began >= change {
                format!("+{}", seconds(round.began - change))
            } else {
                format!("-{}", seconds(change - round.began))
            };
            let when = format!(
                "round {} of {} (begun {at} from the change)",
                r + 1,
                rounds.len()
            );
            let (outcomes, server_outcomes) = round.outcomes.split_at(cells.len());
            for line in policy_matrix::broken(self, cells, outcomes, servers, server_outcomes) {
                problems.push(format!("{when}:{line}"));
            }
            for ((cell, outcome), want) in cells.iter().zip(outcomes).zip(untouched) {
                if let Some(allowed) = *want
                    && !outcome.agrees(allowed)
                    && !outcome.broken()
                {
                    problems.push(format!(
                        "{when}: {} flipped: the change cannot touch it (the model says {} \
                         before, through and after it), the probe {}",
                        self.describe(cell),
                        if allowed { "allowed" } else { "denied" },
                        outcome.word()
                    ));
                }
            }
            let dead =
                policy_matrix::not_shown_alive(&need, cells, outcomes, servers, server_outcomes);
            if !dead.is_empty() {
                let dead: Vec<String> = dead.iter().map(|s| self.describe_server(*s)).collect();
                problems.push(format!(
                    "{when}: no probe reached these servers of denied cells (nor their node): {}",
                    dead.join(", ")
                ));
            }
        }
        problems
    }

    /// Runs a case: the previous one's policies and labels gone, then each step's
    /// changes, the model checked against upstream's truth tables, and a matrix that
    /// equals the model.
    ///
    /// Through each step, from just before its first write until the matrix equals the
    /// model, a [`Watch`] probes the whole matrix round after round; every cell that
    /// the step's writes (with the previous case's reset, for the first) cannot touch
    /// must keep its verdict in every round.
    fn run_case(&mut self, case: &Case) -> Result<Vec<Stepped>, String> {
        let mut steps = Vec::new();
        let mut problems = Vec::new();
        for (n, step) in case.steps.iter().enumerate() {
            let cells = self.cells();
            let servers = self.servers_posted();
            let watch = Watch::start(
                cells
                    .iter()
                    .map(|c| self.probe(c))
                    .chain(servers.iter().map(|s| self.node_probe(*s)))
                    .collect(),
            );
            watch.wait_for_a_round();
            let before = self.objects();
            self.writes = Some(Vec::new());
            let since = Instant::now();
            if n == 0 {
                self.reset();
            }
            for action in &step.actions {
                self.act(action);
            }
            let writes = self.writes.take().unwrap_or_default();
            let wrong = self.check_model(case, step);
            if !wrong.is_empty() {
                problems.push(format!(
                    "step {}: the model disagrees with upstream's truth table:\n{}",
                    n + 1,
                    wrong.join("\n")
                ));
            }
            let converged = self.converge(since);
            let rounds = watch.finish();
            let untouched = self.untouched(&cells, &before, &writes);
            let flips = self.judge_watch(&cells, &servers, &untouched, &rounds, since);
            let kept = untouched.iter().filter(|u| u.is_some()).count();
            if !flips.is_empty() {
                let n_flips = flips.len();
                problems.push(format!(
                    "step {}: through the change, {n_flips} problems in {} rounds of the {kept} \
                     cells it cannot touch:\n{}{}",
                    n + 1,
                    rounds.len(),
                    flips.into_iter().take(20).collect::<Vec<_>>().join("\n"),
                    if n_flips > 20 { "\n..." } else { "" }
                ));
            }
            match converged {
                Ok(converged) => steps.push(Stepped {
                    converged,
                    rounds: rounds.len(),
                    kept,
                }),
                Err(e) => {
                    problems.push(format!("step {}: {e}", n + 1));
                    break;
                }
            }
        }
        if problems.is_empty() {
            Ok(steps)
        } else {
            Err(problems.join("\n"))
        }
    }

    /// Where the model (of the objects now) and the step's truth tables disagree, on
    /// the case's pods.
    fn check_model(&self, case: &Case, step: &Step) -> Vec<String> {
        let objects = self.objects();
        let mut wrong = Vec::new();
        for check in &step.checks {
            let protocol = match check.protocol {
                "TCP" => "TCP",
                "UDP" => "UDP",
                "SCTP" => "SCTP",
                other => panic!("a truth table of {other} (a mistake in the case)"),
            };
            for from in &case.pods {
                for to in case.pods.iter().filter(|to| *to != from) {
                    let (f, t) = (
                        &self.members[self.member(from)],
                        &self.members[self.member(to)],
                    );
                    for v6 in [false, true] {
                        if (v6 && !check.ipv6) || (!v6 && !check.ipv4) {
                            continue;
                        }
                        let ask = (f.ip(v6), t.ip(v6), protocol, check.port);
                        let verdict = expected(&objects, &[ask]).remove(0);
                        let want = check.allows(from, to);
                        if verdict.allowed() != want {
                            wrong.push(format!(
                                "  {from} -> {to} {}/{} IPv{}: upstream says {}, the model {} \
                                 ({})",
                                check.protocol,
                                check.port,
                                if v6 { 6 } else { 4 },
                                if want { "allowed" } else { "denied" },
                                if verdict.allowed() {
                                    "allows"
                                } else {
                                    "denies"
                                },
                                why(&verdict)
                            ));
                        }
                    }
                }
            }
        }
        wrong
    }
}

impl Pods for World {
    /// A probe of `server` from its pod's node, which always reaches its own pods
    /// (kubelet's probes must): it shows the server alive when no pod may reach it.
    fn node_probe(&self, server: Server) -> Probe {
        let m = &self.members[server.member];
        let node = self.cluster.node(m.node);
        Probe {
            from: node.ns.path().to_path_buf(),
            to: SocketAddr::new(m.ip(server.v6), server.port),
            protocol: server.protocol,
        }
    }

    fn describe_server(&self, server: Server) -> String {
        format!(
            "{} {}/{} IPv{}",
            self.members[server.member].key(),
            server.protocol.name(),
            server.port,
            if server.v6 { 6 } else { 4 }
        )
    }

    fn probe(&self, cell: &Cell) -> Probe {
        Probe {
            from: self.members[cell.from].netns.clone(),
            to: SocketAddr::new(self.members[cell.to].ip(cell.v6), cell.port),
            protocol: cell.protocol,
        }
    }

    fn describe(&self, cell: &Cell) -> String {
        format!(
            "{} -> {} {}/{} IPv{}",
            self.members[cell.from].key(),
            self.members[cell.to].key(),
            cell.protocol.name(),
            cell.port,
            if cell.v6 { 6 } else { 4 }
        )
    }

    fn node_of(&self, member: usize) -> u8 {
        self.members[member].node
    }
}

/// Why the model decided, in a few words.
fn why(verdict: &Verdict) -> String {
    verdict.why()
}

fn note_sctp() {
    let why = if netpol::sctp_available() {
        "the prober speaks TCP and UDP only"
    } else {
        "this kernel cannot open SCTP sockets (no sctp module)"
    };
    println!(
        "SCTP: {why}: upstream's 3 SCTP cases run with their SCTP truth tables checked \
         against the model and the matrix probed on TCP and UDP, but no SCTP probe"
    );
}

/// `cni-node explain` about every probe of the last matrix, through the agent of each
/// probe's destination's node; returns the disagreements with the probes.
fn explain_disagreements(world: &World, converged: &Converged) -> Vec<String> {
    let agent = plugin_path("cni-node");
    let answers = parallel(converged.cells.len(), 4, |i| {
        let cell = converged.cells[i];
        let (from, to) = (&world.members[cell.from], &world.members[cell.to]);
        let node = world.cluster.node(to.node);
        let mut args = vec![
            "explain".to_owned(),
            format!("--from={}", from.key()),
            format!("--to={}", to.key()),
            format!("--protocol={}", cell.protocol.name()),
            format!("--port={}", cell.port),
            format!("--explain-socket={}", node.explain_socket.display()),
        ];
        if cell.v6 {
            args.push("--ipv6".into());
        }
        let agent = agent.clone();
        let node_name = node_name(node.n);
        // A process started by a thread inside the node's namespace lives in it.
        // NODE_NAME as in the agent's pod: without it (or --node-name) the command line
        // refuses the subcommand too.
        in_netns(node.ns.path(), move || {
            std::process::Command::new(&agent)
                .args(&args)
                .env("NODE_NAME", node_name)
                .output()
        })
    });
    let mut problems = Vec::new();
    for ((cell, outcome), answer) in converged.cells.iter().zip(&converged.outcomes).zip(answers) {
        let what = world.describe(cell);
        match answer {
            Ok(out) => match out.status.code() {
                Some(code @ (0 | 1)) if (code == 0) == outcome.passed() => {}
                code => problems.push(format!(
                    "{what}: explain exited {code:?}, the probe {}: {}{}",
                    outcome.word(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )),
            },
            Err(e) => problems.push(format!("{what}: cannot run cni-node explain: {e}")),
        }
    }
    problems
}

/// Every agent's health address (which any pod can reach) refuses `/explain` with a
/// 404 that says where explain went, while its socket answers the same question;
/// returns what was wrong.
fn explain_refused_on_health_address(world: &World, from: &str, to: &str) -> Vec<String> {
    let agent = plugin_path("cni-node");
    let mut problems = Vec::new();
    for host in &world.cluster.hosts {
        match host.health(&format!(
            "/explain?from={from}&to={to}&protocol=TCP&port=80"
        )) {
            Ok(a) if a.status == 404 && a.body.contains("--explain-socket") => {}
            Ok(a) => problems.push(format!(
                "node {}: /explain on the health address answered {}: {}",
                host.n, a.status, a.body
            )),
            Err(e) => problems.push(format!("node {}: health address: {e}", host.n)),
        }
        let asked = std::process::Command::new(&agent)
            .args(["explain", "--from", from, "--to", to, "--port", "80"])
            .arg(format!(
                "--explain-socket={}",
                host.explain_socket.display()
            ))
            .output();
        match asked {
            Ok(out) if matches!(out.status.code(), Some(0 | 1)) => {}
            Ok(out) => problems.push(format!(
                "node {}: explain on the socket exited {:?}: {}",
                host.n,
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            )),
            Err(e) => problems.push(format!("node {}: cannot run cni-node explain: {e}", host.n)),
        }
    }
    problems
}

/// What the policy table of a node still holds for pods or profiles: map and set
/// elements, and chains beside the base chains.
fn table_leftovers(ns: &Netns) -> Result<Vec<String>, String> {
    let out = ns.exec(&["nft", "-j", "list", "table", "inet", TABLE]);
    if !out.status.success() {
        return Err(format!(
            "nft list table inet {TABLE}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let listing: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("nft -j: not JSON: {e}"))?;
    let mut leftovers = Vec::new();
    for item in listing["nftables"].as_array().into_iter().flatten() {
        // The base chains, and the fixed chains between them and the tiers' maps.
        if let Some(name) = item["chain"]["name"].as_str()
            && !matches!(
                name,
                "forward"
                    | "input"
                    | "judge-ingress"
                    | "judge-egress"
                    | "np-ingress"
                    | "np-egress"
                    | "baseline-ingress"
                    | "baseline-egress"
            )
        {
            leftovers.push(format!("chain {name}"));
        }
        for kind in ["map", "set"] {
            let Some(name) = item[kind]["name"].as_str() else {
                continue;
            };
            let elements = item[kind]["elem"].as_array().map_or(0, Vec::len);
            if elements > 0 {
                leftovers.push(format!("{kind} {name}: {elements} elements"));
            } else if name.starts_with("ingress-")
                || name.starts_with("egress-")
                || (name.starts_with("admin-") || name.starts_with("baseline-"))
                    && (name.ends_with("-v4") || name.ends_with("-v6"))
            {
                leftovers.push(format!("{kind} {name} (a profile's)"));
            }
        }
    }
    Ok(leftovers)
}

#[test]
fn upstream_cases_and_ours_match_the_model() {
    if !require_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let started = Instant::now();
    note_sctp();
    let mut world = World::new();
    let baseline = world
        .converge(Instant::now())
        .unwrap_or_else(|e| panic!("without any policy: {e}"));
    assert_eq!(baseline.denied(), 0);
    println!(
        "no policy: all {} probes answered ({} passes, {})",
        baseline.cells.len(),
        baseline.passes,
        seconds(baseline.after)
    );

    let addresses = world.addresses();
    let ip_of = |key: &str| addresses[key];
    let mut cases = network_policy_cases::upstream_tcp(&ip_of);
    cases.extend(network_policy_cases::upstream_udp());
    cases.extend(network_policy_cases::upstream_sctp());
    cases.extend(network_policy_cases::ours(&ip_of));
    let explained = "should work with Ingress, Egress specified together";
    assert!(cases.iter().any(|c| c.name == explained));
    // CNI_NETPOL_CASES=<text>: only the cases whose name holds it (while working on one).
    if let Ok(only) = std::env::var("CNI_NETPOL_CASES") {
        cases.retain(|c| c.name.contains(&only));
        println!("CNI_NETPOL_CASES={only:?}: {} cases", cases.len());
    }

    let tables: usize = cases
        .iter()
        .flat_map(|c| &c.steps)
        .map(|s| s.checks.len())
        .sum();
    println!("{} cases, {tables} truth tables", cases.len());
    let mut failures = Vec::new();
    let mut times = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let label = format!("case {}/{} {:?}", i + 1, cases.len(), case.name);
        match world.run_case(case) {
            Ok(steps) => {
                let each: Vec<String> = steps
                    .iter()
                    .map(|s| {
                        let c = &s.converged;
                        format!(
                            "{} ({} pass{}, {} of {} denied; {} cells untouched, kept in {} \
                             rounds)",
                            seconds(c.after),
                            c.passes,
                            if c.passes == 1 { "" } else { "es" },
                            c.denied(),
                            c.cells.len(),
                            s.kept,
                            s.rounds
                        )
                    })
                    .collect();
                println!("{label}: converged after {}", each.join(", then "));
                times.extend(steps.iter().map(|s| s.converged.after));
                if case.name == explained
                    && let Some(last) = steps.last().map(|s| &s.converged)
                {
                    let took = Instant::now();
                    let mut problems = explain_disagreements(&world, last);
                    println!(
                        "explain: {} probes asked through the destination's agent in {}, {} \
                         disagreements",
                        last.cells.len(),
                        seconds(took.elapsed()),
                        problems.len()
                    );
                    if let Some(cell) = last.cells.first() {
                        problems.extend(explain_refused_on_health_address(
                            &world,
                            &world.members[cell.from].key(),
                            &world.members[cell.to].key(),
                        ));
                    }
                    // The table check at the end sees a policy's entries.
                    let seen: Vec<String> = world
                        .cluster
                        .hosts
                        .iter()
                        .flat_map(|h| table_leftovers(&h.ns).unwrap_or_else(|e| vec![e]))
                        .collect();
                    if seen.is_empty() {
                        failures.push(format!(
                            "after {label}, no node's policy table shows a pod or a profile"
                        ));
                    }
                    if !problems.is_empty() {
                        failures.push(format!(
                            "explain after {label}:\n{}",
                            problems.into_iter().take(20).collect::<Vec<_>>().join("\n")
                        ));
                    }
                }
            }
            Err(e) => {
                println!("{label}: FAILED\n{e}");
                failures.push(format!("{label}: {e}"));
            }
        }
    }

    // Every policy gone: everything answers, and the tables hold no pod and no profile.
    world.reset();
    let gone = Instant::now();
    match world.converge(gone) {
        Ok(c) => println!("all policies deleted: converged after {}", seconds(c.after)),
        Err(e) => failures.push(format!("all policies deleted: {e}")),
    }
    for host in &world.cluster.hosts {
        let mut last = Ok(Vec::new());
        let clean = cni_blackbox::cluster::wait(DEADLINE, "an empty policy table", || {
            last = table_leftovers(&host.ns);
            last.as_ref().is_ok_and(Vec::is_empty)
        });
        match clean {
            Ok(()) => println!(
                "node {}: policy table empty {} after the last policy was deleted",
                host.n,
                seconds(gone.elapsed())
            ),
            Err(e) => failures.push(format!("node {}: {e}: {last:?}", host.n)),
        }
    }

    times.sort();
    if let (Some(median), Some(max)) = (times.get(times.len() / 2), times.last()) {
        cni_blackbox::measured::record_duration(
            "network_policy: matrix convergence after a case's step (median)",
            *median,
        );
        cni_blackbox::measured::record_duration(
            "network_policy: matrix convergence after a case's step (max)",
            *max,
        );
        let over = times.iter().filter(|t| **t > TARGET).count();
        println!(
            "{} cases, {} steps: convergence median {}, max {}, {} over the {} target; \
             {} failed; run time {}",
            cases.len(),
            times.len(),
            seconds(*median),
            seconds(*max),
            over,
            seconds(TARGET),
            failures.len(),
            seconds(started.elapsed())
        );
    }
    policy_matrix::assert_no_failures(&failures);
}

/// Numbered UDP flows from x/b (member `xb`) to x/a (`xa`) port 80, IPv4 then IPv6,
/// from now on (for [`echo_losses`]): a datagram every 10 ms, so a drop too short for
/// TCP's retransmission to show still loses some.
fn echo_xb_to_xa(world: &World, xa: usize, xb: usize) -> Vec<Sequence> {
    let kept = [false, true]
        .into_iter()
        .map(|v6| {
            let to = SocketAddr::new(world.members[xa].ip(v6), 80);
            Sequence::start(&world.members[xb].netns, to)
                .unwrap_or_else(|e| panic!("UDP x/b -> {to}: {e}"))
        })
        .collect();
    // A few echoes in before anything changes.
    std::thread::sleep(Duration::from_millis(200));
    kept
}

/// The x/b -> x/a flows' datagrams (IPv4, then IPv6) `through` what the test did:
/// printed, and a failure for each family that lost any (or sent fewer than 100).
fn echo_losses(kept: Vec<Sequence>, through: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for (v6, flow) in [false, true].into_iter().zip(kept) {
        let family = if v6 { 6 } else { 4 };
        let datagrams = flow.finish();
        let lost = lost_runs(&datagrams);
        let total: usize = lost.iter().map(|(_, n)| n).sum();
        println!(
            "x/b -> x/a UDP IPv{family}: {} numbered datagrams {through}, {total} lost",
            datagrams.len()
        );
        if total > 0 || datagrams.len() < 100 {
            let first = datagrams.first().map_or(Instant::now(), |d| d.sent);
            let runs: Vec<String> = lost
                .iter()
                .take(10)
                .map(|(at, n)| format!("{n} from +{}", seconds(at.duration_since(first))))
                .collect();
            failures.push(format!(
                "x/b -> x/a UDP IPv{family}: {total} of {} numbered datagrams lost (runs: {})",
                datagrams.len(),
                runs.join(", ")
            ));
        }
    }
    failures
}

/// When a flow that a policy applied at `applied` denies was cut: every datagram sent
/// before it came back, and from the first lost on (within [`CUT_WINDOW`]) none did.
fn judge_cut(datagrams: &[Datagram], applied: Instant) -> Result<Duration, String> {
    let early = datagrams
        .iter()
        .filter(|d| d.sent < applied && d.echoed.is_none())
        .count();
    if early > 0 {
        return Err(format!(
            "{early} datagrams lost before the policy was applied"
        ));
    }
    let Some(cut) = datagrams.iter().position(|d| d.echoed.is_none()) else {
        return Err(format!(
            "all {} datagrams came back, {} after a policy that denies the flow",
            datagrams.len(),
            datagrams
                .last()
                .map_or("0 s".into(), |d| seconds(d.sent.duration_since(applied)))
        ));
    };
    let after = datagrams[cut].sent.duration_since(applied);
    let again = datagrams[cut..]
        .iter()
        .filter(|d| d.echoed.is_some())
        .count();
    if again > 0 {
        return Err(format!(
            "cut {} after the policy, then {again} of the {} later datagrams came back",
            seconds(after),
            datagrams.len() - cut
        ));
    }
    if after > CUT_WINDOW {
        return Err(format!(
            "still echoed {} after a policy that denies it",
            seconds(after)
        ));
    }
    Ok(after)
}

/// The runs of consecutive lost datagrams: when each began, and its length.
fn lost_runs(datagrams: &[Datagram]) -> Vec<(Instant, usize)> {
    let mut runs: Vec<(Instant, usize)> = Vec::new();
    let mut in_run = false;
    for d in datagrams {
        match (d.echoed.is_none(), in_run, runs.last_mut()) {
            (true, true, Some((_, n))) => *n += 1,
            (true, _, _) => runs.push((d.sent, 1)),
            (false, _, _) => {}
        }
        in_run = d.echoed.is_none();
    }
    runs
}

struct Pinger {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<(Instant, bool)>>>,
}

impl Pinger {
    /// A TCP connection that sends a byte every 20 ms and reads its echo (at most
    /// 500 ms each), recording when each was sent and whether it came back, until
    /// stopped or (with `until_lost`) an echo is lost: what shows an established
    /// connection cut (a cut is for good; a short drop is [`Sequence`]'s to see).
    fn start(mut stream: std::net::TcpStream, until_lost: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let mut pings = Vec::new();
            let mut byte = [0u8; 1];
            while !flag.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let ok = stream.write_all(b"p").is_ok() && stream.read_exact(&mut byte).is_ok();
                pings.push((sent, ok));
                if !ok && until_lost {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            pings
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<(Instant, bool)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Probes from `from` (a namespace path) to `to` on every protocol and port; the
/// outcomes by "PROTO/port".
fn probe_all(from: &Path, to: IpAddr) -> Vec<(String, Outcome)> {
    let probes: Vec<Probe> = Protocol::ALL
        .iter()
        .flat_map(|&protocol| {
            PORTS.iter().map(move |&port| Probe {
                from: from.to_path_buf(),
                to: SocketAddr::new(to, port),
                protocol,
            })
        })
        .collect();
    let outcomes = netpol::run(&probes, PROBE_TIMEOUT, |_, _| false);
    probes
        .iter()
        .zip(outcomes)
        .map(|(p, o)| (format!("{}/{}", p.protocol.name(), p.to.port()), o))
        .collect()
}

/// Probes from the namespace at `from` to port 80 of `to`, both protocols, both
/// families.
fn probes_to(from: &Path, to: &Member) -> Vec<Probe> {
    [to.v4, to.v6]
        .into_iter()
        .flat_map(|ip| {
            Protocol::ALL.into_iter().map(move |protocol| Probe {
                from: from.to_path_buf(),
                to: SocketAddr::new(ip, 80),
                protocol,
            })
        })
        .collect()
}

#[test]
fn nodes_reach_their_pods_established_connections_follow_and_new_pods_are_judged_at_once() {
    if !require_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let started = Instant::now();
    let mut world = World::new();
    world
        .converge(Instant::now())
        .unwrap_or_else(|e| panic!("without any policy: {e}"));
    let mut failures: Vec<String> = Vec::new();

    // A node reaches its own pods under default deny (kubelet's probes); another
    // node's address is no pod and is judged like any outside address.
    world.act(&Action::Policy(
        "x",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    ));
    match world.converge(Instant::now()) {
        Ok(c) => println!("default deny in x: converged after {}", seconds(c.after)),
        Err(e) => failures.push(format!("default deny in x: {e}")),
    }
    let objects = world.objects();
    let mut checked = 0;
    for host in &world.cluster.hosts {
        for m in world.members.iter().filter(|m| m.namespace == "x") {
            for v6 in [false, true] {
                let node_ip = parse(&if v6 { node_v6(host.n) } else { node_v4(host.n) });
                for (what, outcome) in probe_all(host.ns.path(), m.ip(v6)) {
                    checked += 1;
                    let own = m.node == host.n;
                    let port: u16 = what
                        .rsplit('/')
                        .next()
                        .and_then(|p| p.parse().ok())
                        .unwrap_or(0);
                    let protocol = if what.starts_with("TCP") {
                        "TCP"
                    } else {
                        "UDP"
                    };
                    // The oracle lets a pod's own node in whatever the policies say.
                    let want =
                        expected(&objects, &[(node_ip, m.ip(v6), protocol, port)])[0].allowed();
                    if !outcome.agrees(want) {
                        failures.push(format!(
                            "node {} -> {} ({}) {what} IPv{}: want {}, the probe {}",
                            host.n,
                            m.key(),
                            if own {
                                "its own pod"
                            } else {
                                "another node's pod"
                            },
                            if v6 { 6 } else { 4 },
                            if want {
                                "answered"
                            } else {
                                "dropped (timed out)"
                            },
                            outcome.word()
                        ));
                    }
                }
            }
        }
    }
    println!("node to pod under default deny: {checked} probes checked");

    // Established flows: a policy that denies y/a -> x/a cuts its TCP connection and
    // its numbered UDP flow within the window and for good, and x/b -> x/a, which it
    // still allows, loses not one datagram.
    world.reset();
    if let Err(e) = world.converge(Instant::now()) {
        failures.push(format!("after the default deny was deleted: {e}"));
    }
    let (xa, xb, ya) = (
        world.member("x/a"),
        world.member("x/b"),
        world.member("y/a"),
    );
    let connect = |from: usize, v6: bool| {
        let to = SocketAddr::new(world.members[xa].ip(v6), 80);
        netpol::connect_from(&world.members[from].netns, to, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect {} -> {to}: {e}", world.members[from].key()))
    };
    let cut: Vec<(bool, Pinger)> = [false, true]
        .into_iter()
        .map(|v6| (v6, Pinger::start(connect(ya, v6), true)))
        .collect();
    let cut_udp: Vec<(bool, Sequence)> = [false, true]
        .into_iter()
        .map(|v6| {
            let to = SocketAddr::new(world.members[xa].ip(v6), 80);
            let flow = Sequence::start(&world.members[ya].netns, to)
                .unwrap_or_else(|e| panic!("UDP y/a -> {to}: {e}"));
            (v6, flow)
        })
        .collect();
    let kept = echo_xb_to_xa(&world, xa, xb);
    std::thread::sleep(Duration::from_millis(300));
    let applied = Instant::now();
    world.act(&Action::Policy(
        "x",
        "a-from-b-only",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    ));
    std::thread::sleep(Duration::from_secs(3));
    for (v6, pinger) in cut {
        let pings = pinger.finish();
        let family = if v6 { 6 } else { 4 };
        let before = pings.iter().filter(|(t, ok)| *ok && *t < applied).count();
        match pings.iter().find(|(_, ok)| !ok) {
            Some((lost, _)) if *lost >= applied => {
                let after = lost.duration_since(applied);
                println!(
                    "established TCP y/a -> x/a IPv{family}: {before} echoes before the policy, \
                     cut within {} of it",
                    seconds(after)
                );
                if after > CUT_WINDOW {
                    failures.push(format!(
                        "TCP y/a -> x/a IPv{family}: still answering {} after the policy",
                        seconds(after)
                    ));
                }
            }
            Some(_) => failures.push(format!(
                "TCP y/a -> x/a IPv{family}: an echo was lost before the policy was applied"
            )),
            None => failures.push(format!(
                "TCP y/a -> x/a IPv{family}: the connection kept answering for 3 s after a \
                 policy that denies it"
            )),
        }
    }
    for (v6, flow) in cut_udp {
        let family = if v6 { 6 } else { 4 };
        match judge_cut(&flow.finish(), applied) {
            Ok(after) => {
                println!(
                    "established UDP y/a -> x/a IPv{family}: cut {} after the policy, for good",
                    seconds(after)
                );
                cni_blackbox::measured::record_duration(
                    &format!(
                        "network_policy: established UDP flow cut after a denying policy (IPv{family})"
                    ),
                    after,
                );
            }
            Err(e) => failures.push(format!("UDP y/a -> x/a IPv{family}: {e}")),
        }
    }
    failures.extend(echo_losses(kept, "through a policy that still allows them"));

    // New pods: judged from their ADD on, before the API shows their addresses.
    world.reset();
    world.act(&Action::Policy(
        "x",
        "only-from-y-b",
        json!({"podSelector": {}, "policyTypes": ["Ingress"],
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                       "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    ));
    if let Err(e) = world.converge(Instant::now()) {
        failures.push(format!("only y/b into x: {e}"));
    }
    let new_x = world.add_pod("x", "new", 1);
    let added = Instant::now();
    let target = world.members[new_x].clone();
    // Denied sources: y/a (on the other node) and x/c (on the same node); allowed: y/b.
    let mut probes = Vec::new();
    let mut names = Vec::new();
    // Its node too, which always reaches it: it shows the server alive in every round,
    // so that a denied probe's drop is the policy's.
    let node_ns = world.cluster.host(target.node).ns.path().to_path_buf();
    let sources: Vec<(String, PathBuf)> = ["y/a", "x/c", "y/b"]
        .into_iter()
        .map(|key| {
            (
                key.to_owned(),
                world.members[world.member(key)].netns.clone(),
            )
        })
        .chain([(format!("node {}", target.node), node_ns)])
        .collect();
    for (key, from) in &sources {
        for probe in probes_to(from, &target) {
            names.push(format!(
                "{key} -> x/new {}/{} {}",
                probe.protocol.name(),
                probe.to.port(),
                probe.to.ip()
            ));
            probes.push(probe);
        }
    }
    let allowed_from = |i: usize| names[i].starts_with("y/b");
    let from_node = |i: usize| names[i].starts_with("node ");
    let mut first = None;
    let mut got_through = Vec::new();
    let mut allowed_after = None;
    let mut allowed_last = Vec::new();
    while added.elapsed() < Duration::from_secs(1)
        || (allowed_after.is_none() && added.elapsed() < DEADLINE)
    {
        let round = Instant::now();
        first.get_or_insert_with(|| added.elapsed());
        let in_first_second = added.elapsed() < Duration::from_secs(1);
        let outcomes = netpol::run(&probes, PROBE_TIMEOUT, |_, _| false);
        for (i, outcome) in outcomes.iter().enumerate() {
            if from_node(i) {
                if !outcome.passed() {
                    got_through.push(format!(
                        "{}: {} {} after the ADD: x/new's server is not shown alive",
                        names[i],
                        outcome.word(),
                        seconds(added.elapsed())
                    ));
                }
            } else if !allowed_from(i) && in_first_second && !outcome.dropped() {
                got_through.push(format!(
                    "{}: {} {} after the ADD{}",
                    names[i],
                    outcome.word(),
                    seconds(added.elapsed()),
                    if outcome.broken() {
                        " (the server or the route is broken, not the policy)"
                    } else {
                        ""
                    }
                ));
            }
        }
        allowed_last = outcomes
            .iter()
            .enumerate()
            .filter(|(i, o)| allowed_from(*i) && !o.passed())
            .map(|(i, o)| format!("{}: {}", names[i], o.word()))
            .collect();
        if allowed_last.is_empty() && allowed_after.is_none() {
            allowed_after = Some(round.duration_since(added));
        }
        if let Some(rest) = Duration::from_millis(50).checked_sub(round.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    println!(
        "new pod x/new (only y/b may enter x; its address not posted): first probes {} \
         after its ADD returned; from y/a and x/c {} of the probes of the first second got \
         through; y/b answered after {}",
        seconds(first.unwrap_or_default()),
        got_through.len(),
        allowed_after.map_or("never".into(), seconds)
    );
    if !got_through.is_empty() {
        let n = got_through.len();
        got_through.truncate(20);
        failures.push(format!(
            "x/new before its address was posted, from pods the policy does not allow ({n} \
             probes were not dropped, or its node did not reach it):\n{}",
            got_through.join("\n")
        ));
    }
    if allowed_after.is_none() {
        failures.push(format!(
            "y/b -> x/new before its address was posted, within {DEADLINE:?}:\n{}",
            allowed_last.join("\n")
        ));
    }
    // Bounded polling until every probe from `from` to `to` answers.
    let answered = |from: &Path, to: &Member| -> Result<Duration, String> {
        let probes = probes_to(from, to);
        let start = Instant::now();
        loop {
            let round = Instant::now();
            let outcomes = netpol::run(&probes, PROBE_TIMEOUT, |_, _| false);
            if outcomes.iter().all(Outcome::passed) {
                return Ok(start.elapsed());
            }
            if start.elapsed() > DEADLINE {
                return Err(format!("{outcomes:?}"));
            }
            if let Some(rest) = Duration::from_millis(50).checked_sub(round.elapsed()) {
                std::thread::sleep(rest);
            }
        }
    };
    // A new pod no policy selects answers its neighbours before its address is posted.
    let new_z = world.add_pod("z", "new", 2);
    let added_z = Instant::now();
    let target_z = world.members[new_z].clone();
    for key in ["z/b", "x/a"] {
        let from = world.members[world.member(key)].netns.clone();
        match answered(&from, &target_z) {
            Ok(_) => println!(
                "new pod z/new (no policy): {key} answered {} after its ADD, before its address \
                 was posted",
                seconds(added_z.elapsed())
            ),
            Err(e) => failures.push(format!("{key} -> z/new before its address was posted: {e}")),
        }
    }
    // Once posted, the new pods are in the matrix like the others.
    world.post_ips(new_x);
    world.post_ips(new_z);
    match world.converge(Instant::now()) {
        Ok(c) => println!(
            "new pods' addresses posted: the {} probe matrix converged after {}",
            c.cells.len(),
            seconds(c.after)
        ),
        Err(e) => failures.push(format!("with the new pods posted: {e}")),
    }
    println!("run time {}", seconds(started.elapsed()));
    policy_matrix::assert_no_failures(&failures);
}

/// An agent SIGKILLed right after a policy change is served, then restarted: the
/// kernel keeps the rules it had (each change is one nftables transaction), so an
/// allowed connection never loses an echo and a flow denied before and after the
/// change is never let through, while the agent is away or starting again; the
/// restarted agent converges on the change.
#[test]
fn an_agent_killed_in_the_middle_of_a_policy_change_opens_nothing_and_breaks_nothing() {
    if !require_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut world = World::new();
    let guard = |also_y_b: bool| {
        let mut from = vec![json!({"podSelector": {"matchLabels": {"pod": "b"}}})];
        if also_y_b {
            from.push(json!({"namespaceSelector": {"matchLabels": {"ns": "y"}},
                             "podSelector": {"matchLabels": {"pod": "b"}}}));
        }
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
               "ingress": [{"from": from}]})
    };
    world.act(&Action::Policy("x", "a-guard", guard(false)));
    world
        .converge(Instant::now())
        .unwrap_or_else(|e| panic!("x/a admitting only x/b: {e}"));
    let (xa, xb, ya) = (
        world.member("x/a"),
        world.member("x/b"),
        world.member("y/a"),
    );
    let kept = echo_xb_to_xa(&world, xa, xb);

    // The change (x/a also admits y/b) is served and the agent of x/a's node is killed
    // at once, as it may be reading or applying it.
    let node = world.members[xa].node;
    let kubeconfig = world.cluster.kubeconfig.clone();
    world.act(&Action::Policy("x", "a-guard", guard(true)));
    world.cluster.host(node).kill_agent();
    let killed = Instant::now();

    // y/a -> x/a is denied before and after the change: probed while the agent is away
    // and while it starts again.
    // Each round also probes x/a from its node, which shows its servers alive: a
    // denied probe must time out while they answer.
    let denied = probes_to(&world.members[ya].netns, &world.members[xa]);
    let node_ns = world.cluster.host(node).ns.path().to_path_buf();
    let alive = probes_to(&node_ns, &world.members[xa]);
    let probes: Vec<Probe> = denied.iter().chain(&alive).cloned().collect();
    let mut passed: Vec<String> = Vec::new();
    let mut rounds = 0;
    let probe_denied = |passed: &mut Vec<String>, rounds: &mut usize| {
        *rounds += 1;
        let at = seconds(killed.elapsed());
        let outcomes = netpol::run(&probes, PROBE_TIMEOUT, |_, _| false);
        let (to_denied, to_alive) = outcomes.split_at(denied.len());
        for (probe, outcome) in denied.iter().zip(to_denied) {
            if !outcome.dropped() {
                passed.push(format!(
                    "y/a -> {} {}: {} {at} after the kill{}",
                    probe.to,
                    probe.protocol.name(),
                    outcome.word(),
                    if outcome.broken() {
                        " (the server or the route is broken, not the policy)"
                    } else {
                        ""
                    }
                ));
            }
        }
        for (probe, outcome) in alive.iter().zip(to_alive) {
            if !outcome.passed() {
                passed.push(format!(
                    "node {node} -> {} {}: {} {at} after the kill: x/a's server is not shown \
                     alive, so its denied probes prove nothing",
                    probe.to,
                    probe.protocol.name(),
                    outcome.word()
                ));
            }
        }
    };
    while killed.elapsed() < Duration::from_secs(2) {
        probe_denied(&mut passed, &mut rounds);
    }
    world.cluster.host(node).start_agent(&kubeconfig);
    let restarted = Instant::now();
    while restarted.elapsed() < Duration::from_secs(2) {
        probe_denied(&mut passed, &mut rounds);
    }
    let converged = world.converge(restarted);
    probe_denied(&mut passed, &mut rounds);
    let mut failures = Vec::new();
    match &converged {
        Ok(c) => println!(
            "agent killed after the change and restarted 2 s later: converged {} after the \
             restart; y/a -> x/a probed in {rounds} rounds",
            seconds(c.after)
        ),
        Err(e) => failures.push(format!("after the restart: {e}")),
    }
    failures.extend(passed);
    failures.extend(echo_losses(kept, "through the kill and restart"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// How long the API server stays away in [`an_api_outage_in_the_middle_of_a_policy_change_keeps_every_verdict_until_the_relist`].
const OUTAGE: Duration = Duration::from_secs(2);
/// The kinds NetworkPolicy is judged on, as the agent's metrics label them.
const POLICY_KINDS: [&str; 3] = ["Pod", "Namespace", "NetworkPolicy"];
/// Complete lists an agent received, by kind (the first and every relist).
const LISTS: &str = "cni_node_watch_lists_total";
/// Watches an agent saw fail and retried or started again, by kind.
const RESTARTS: &str = "cni_node_watch_restarts_total";

/// The counter `name{kind="<kind>"}` of `host`'s agent (its `/metrics`).
fn kind_counter(host: &Host, name: &str, kind: &str) -> Result<f64, String> {
    let answer = host.health("/metrics")?;
    if answer.status != 200 {
        return Err(format!("node {}: GET /metrics: {answer}", host.n));
    }
    let prefix = format!("{name}{{kind=\"{kind}\"}} ");
    answer
        .body
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| format!("node {}: no {prefix}in /metrics", host.n))
}

/// [`kind_counter`] of every node and every kind of [`POLICY_KINDS`]; panics when an
/// agent does not answer (the API server is up: nothing excuses it).
fn kind_counters(world: &World, name: &str) -> BTreeMap<(u8, &'static str), f64> {
    let mut counters = BTreeMap::new();
    for host in &world.cluster.hosts {
        for kind in POLICY_KINDS {
            let value = kind_counter(host, name, kind).unwrap_or_else(|e| panic!("{e}"));
            counters.insert((host.n, kind), value);
        }
    }
    counters
}

/// The first 20 of `problems`, each prefixed with `what`, and how many more there were.
fn first_of(what: &str, problems: Vec<String>) -> Vec<String> {
    let n = problems.len();
    let mut lines: Vec<String> = problems
        .into_iter()
        .take(20)
        .map(|p| format!("{what}: {p}"))
        .collect();
    if n > 20 {
        lines.push(format!("{what}: ... and {} more", n - 20));
    }
    lines
}

impl World {
    /// Runs the whole matrix over and over (each round as soon as the last one ended:
    /// a round lasts one probe timeout, as denied probes wait it out) for [`OUTAGE`]
    /// while the API server is away, and asks every agent's `/healthz` and `/readyz`
    /// after each round. `before` and `after` are the model's verdicts before and after
    /// the change in flight: where they agree, every probe must agree with them; where
    /// they differ, the agent may or may not have heard of the change before the API
    /// went away, so either is right. Returns the rounds, how many of them had the
    /// change in force on every cell it changes, and what went wrong.
    fn hold_while_away(
        &self,
        cells: &[Cell],
        before: &[bool],
        after: &[bool],
        stopped: Instant,
    ) -> (usize, usize, Vec<String>) {
        let servers = self.servers_posted();
        let probes: Vec<Probe> = cells
            .iter()
            .map(|c| self.probe(c))
            .chain(servers.iter().map(|s| self.node_probe(*s)))
            .collect();
        let need: BTreeSet<Server> = cells
            .iter()
            .enumerate()
            .filter(|&(i, _)| !before[i] && !after[i])
            .map(|(_, c)| c.server())
            .collect();
        let mut problems = Vec::new();
        let (mut rounds, mut in_force) = (0, 0);
        while stopped.elapsed() < OUTAGE {
            let outcomes = netpol::run(&probes, PROBE_TIMEOUT, |_, _| false);
            let (outcomes, server_outcomes) = outcomes.split_at(cells.len());
            let at = seconds(stopped.elapsed());
            rounds += 1;
            for line in policy_matrix::broken(self, cells, outcomes, &servers, server_outcomes) {
                problems.push(format!("{at} after the API went away:{line}"));
            }
            let dead =
                policy_matrix::not_shown_alive(&need, cells, outcomes, &servers, server_outcomes);
            if !dead.is_empty() {
                let dead: Vec<String> = dead.iter().map(|s| self.describe_server(*s)).collect();
                problems.push(format!(
                    "{at} after the API went away: no probe reached these servers of denied \
                     cells (nor their node): {}",
                    dead.join(", ")
                ));
            }
            let mut changed_in_force = true;
            for (i, outcome) in outcomes.iter().enumerate() {
                if before[i] != after[i] {
                    changed_in_force &= outcome.agrees(after[i]);
                } else if !outcome.agrees(before[i]) && !outcome.broken() {
                    problems.push(format!(
                        "{}: {} {at} after the API went away; the model says {} before and \
                         after the change",
                        self.describe(&cells[i]),
                        outcome.word(),
                        if before[i] { "allowed" } else { "denied" }
                    ));
                }
            }
            if changed_in_force && before != after {
                in_force += 1;
            }
            for host in &self.cluster.hosts {
                // `/readyz` says `ready`, then what is only watched (ClusterNetworkPolicy).
                for (path, want) in [("/healthz", "ok"), ("/readyz", "ready")] {
                    match host.health(path) {
                        Ok(a) if a.status == 200 && a.body.lines().next() == Some(want) => {}
                        Ok(a) => problems.push(format!(
                            "node {}: GET {path} {at} after the API went away: {a} (the agent \
                             enforces its last complete view, and its last pass succeeded)",
                            host.n
                        )),
                        Err(e) => problems.push(format!(
                            "node {}: GET {path} {at} after the API went away: no answer: {e}",
                            host.n
                        )),
                    }
                }
            }
        }
        (rounds, in_force, problems)
    }

    /// After the API server came back at `restarted` with every earlier version
    /// compacted away, so that each watch's first contact is answered `410 Gone`, which
    /// the agent counts as a failed watch: waits until every agent has tried each watch
    /// of [`POLICY_KINDS`] again (its `restarts` counter, read just before the return,
    /// grew), then runs the matrix against the model from the last of those tries while
    /// a thread watches for the relists (`lists`, the counters from before the outage).
    /// Every watch must list again, and the matrix equal the model, within [`TARGET`] of
    /// the last try: the contract of a return, asserted here (unlike elsewhere in this
    /// file) because what it catches is a relist left to the watch's backoff, seconds
    /// after an outage, while the matrix takes a few tens of milliseconds. A try that
    /// failed on a connection the outage left dead would count as the first, which can
    /// only make the time longer.
    fn converge_after_reconnects(
        &self,
        what: &str,
        restarted: Instant,
        lists: &BTreeMap<(u8, &'static str), f64>,
        restarts: &BTreeMap<(u8, &'static str), f64>,
    ) -> Result<(), String> {
        let counter = |(n, kind): (u8, &str), name: &str| {
            let host = self.cluster.hosts.iter().find(|h| h.n == n);
            host.and_then(|h| kind_counter(h, name, kind).ok())
        };
        let mut reconnected: BTreeMap<(u8, &'static str), Instant> = BTreeMap::new();
        let mut relisted: BTreeMap<(u8, &'static str), Instant> = BTreeMap::new();
        let see_relists = |relisted: &mut BTreeMap<(u8, &'static str), Instant>| {
            for (&key, &count) in lists {
                if !relisted.contains_key(&key) && counter(key, LISTS) > Some(count) {
                    relisted.insert(key, Instant::now());
                }
            }
        };
        while reconnected.len() < restarts.len() {
            for (&key, &count) in restarts {
                if !reconnected.contains_key(&key) && counter(key, RESTARTS) > Some(count) {
                    reconnected.insert(key, Instant::now());
                }
            }
            see_relists(&mut relisted);
            if restarted.elapsed() > DEADLINE * 2 {
                let missing: Vec<String> = restarts
                    .keys()
                    .filter(|k| !reconnected.contains_key(k))
                    .map(|(n, kind)| format!("node {n} {kind}s"))
                    .collect();
                return Err(format!(
                    "{what}: the watches of {} were not tried again within {:?} of the \
                     API's return (no failure counted, though every version they held is \
                     gone)",
                    missing.join(", "),
                    DEADLINE * 2
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let last = reconnected.values().max().copied().unwrap_or(restarted);
        let done = AtomicBool::new(false);
        let (converged, relisted) = std::thread::scope(|scope| {
            let relists = scope.spawn(|| {
                // Until every watch listed again, or the matrix is done and the time the
                // contract gives is over.
                while relisted.len() < lists.len()
                    && !(done.load(Ordering::Relaxed) && last.elapsed() > TARGET)
                {
                    see_relists(&mut relisted);
                    std::thread::sleep(Duration::from_millis(10));
                }
                relisted
            });
            let converged = self.converge(last);
            done.store(true, Ordering::Relaxed);
            (converged, relists.join().unwrap_or_default())
        });
        let converged = converged.map_err(|e| format!("{what}: {e}"))?;
        let missing: Vec<String> = lists
            .keys()
            .filter(|k| !relisted.contains_key(k))
            .map(|(n, kind)| format!("node {n} {kind}s"))
            .collect();
        let when: Vec<String> = reconnected
            .iter()
            .map(|(&(n, kind), at)| {
                format!(
                    "node {n} {kind}s {}{}",
                    seconds(*at - restarted),
                    relisted.get(&(n, kind)).map_or(String::new(), |r| format!(
                        " (listed {} later)",
                        seconds(r.saturating_duration_since(*at))
                    ))
                )
            })
            .collect();
        println!(
            "{what}: each watch's first try after the API's return: {}; the {} probe matrix ({} \
             denied) equalled the new model {} after the last try, {} after the return (target \
             {})",
            when.join(", "),
            converged.cells.len(),
            converged.denied(),
            seconds(converged.after),
            seconds(last.duration_since(restarted) + converged.after),
            seconds(TARGET),
        );
        let mut problems = Vec::new();
        if !missing.is_empty() {
            problems.push(format!(
                "{what}: these watches did not list again within {} of the last try, though \
                 every version they held is gone: {}",
                seconds(TARGET),
                missing.join(", ")
            ));
        }
        if converged.after > TARGET {
            problems.push(format!(
                "{what}: the matrix equalled the new model {} after the last watch was tried \
                 again, over the {} the contract gives",
                seconds(converged.after),
                seconds(TARGET)
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}

/// The API server goes away in the middle of a policy change, twice, and comes back
/// with every earlier resourceVersion compacted away, so the agents must list again:
///
/// 1. a change is stored and the server stops at once (the agents may or may not have
///    heard of it); it comes back answering the agents' watches with `410 Gone` in the
///    stream (an `ERROR` event);
/// 2. the server stops, then a policy changes, another is deleted and a pod is
///    relabelled while the agents cannot see it; it comes back answering with an HTTP
///    `410` status.
///
/// While the server is away, every probe of the matrix whose verdict the change does
/// not touch keeps it, round after round (in 2, where the agents cannot know of the
/// change, that is every probe), and every agent stays alive and ready: it enforces its
/// last complete view, and its passes over it succeed. Once back, each agent lists
/// again and the matrix equals the model of the new objects within [`TARGET`] of the
/// agents' return to the API (asserted: see [`World::converge_after_reconnects`]). An
/// established connection that every state allows never loses an echo.
#[test]
fn an_api_outage_in_the_middle_of_a_policy_change_keeps_every_verdict_until_the_relist() {
    if !require_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let started = Instant::now();
    let mut world = World::new();
    // x/a admits pods labelled pod=b of its own namespace and of `namespaces`.
    let guard = |namespaces: &[&str]| {
        let mut from = vec![json!({"podSelector": {"matchLabels": {"pod": "b"}}})];
        for ns in namespaces {
            from.push(json!({"namespaceSelector": {"matchLabels": {"ns": ns}},
                             "podSelector": {"matchLabels": {"pod": "b"}}}));
        }
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
               "ingress": [{"from": from}]})
    };
    world.act(&Action::Policy("x", "a-guard", guard(&[])));
    world.act(&Action::Policy(
        "z",
        "deny-ingress",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    ));
    let first = world
        .converge(Instant::now())
        .unwrap_or_else(|e| panic!("x/a admitting x/b only, z closed: {e}"));
    println!(
        "before the outages: the {} probe matrix ({} denied) converged after {}",
        first.cells.len(),
        first.denied(),
        seconds(first.after)
    );
    let (xa, xb) = (world.member("x/a"), world.member("x/b"));
    let kept = echo_xb_to_xa(&world, xa, xb);
    let mut failures: Vec<String> = Vec::new();
    let verdicts = |world: &World| -> (Vec<Cell>, Vec<bool>) {
        let (cells, verdicts) = world.model();
        (cells, verdicts.iter().map(Verdict::allowed).collect())
    };

    // 1. The change (x/a also admits y/b) is stored, and the API server is gone at once.
    let what = "1. stored, then the API gone";
    let (cells, before) = verdicts(&world);
    let lists = kind_counters(&world, LISTS);
    world.act(&Action::Policy("x", "a-guard", guard(&["y"])));
    world.cluster.api.stop();
    let stopped = Instant::now();
    let (_, after) = verdicts(&world);
    // A write the agents do not see (x written again as it is) moves the newest version
    // past the one they may hold; the compaction then makes every version they hold too
    // old: a watch resumed from it gets 410 Gone.
    world
        .cluster
        .api
        .apply_namespace(namespace_object("x", &default_namespace_labels("x")));
    world.cluster.api.compact();
    let (rounds, in_force, problems) = world.hold_while_away(&cells, &before, &after, stopped);
    let changed = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    println!(
        "{what}: {rounds} rounds of the matrix in {}, the change ({changed} probes) in force \
         in {in_force} of them; {} problems",
        seconds(OUTAGE),
        problems.len()
    );
    failures.extend(first_of(what, problems));
    let restarts = kind_counters(&world, RESTARTS);
    world.cluster.api.restart();
    if let Err(e) = world.converge_after_reconnects(what, Instant::now(), &lists, &restarts) {
        failures.push(e);
    }

    // 2. The API server goes away; meanwhile x/a's guard lets z/b in instead of y/b, z's
    // deny is deleted and z/c becomes pod=b.
    let what = "2. changed while the API is away";
    let (cells, before) = verdicts(&world);
    let lists = kind_counters(&world, LISTS);
    world.cluster.api.stop();
    let stopped = Instant::now();
    world.act(&Action::Policy("x", "a-guard", guard(&["z"])));
    world.act(&Action::DeletePolicy("z", "deny-ingress"));
    world.act(&Action::PodLabels("z", "c", vec![("pod", "b")]));
    world.cluster.api.compact();
    world.cluster.api.set_gone_as_http_status(true);
    let (_, after) = verdicts(&world);
    let changed = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    assert!(
        changed > 0,
        "the change changes no verdict (a mistake in the test)"
    );
    // Nobody can tell the agents: every verdict stays as it was.
    let (rounds, _, problems) = world.hold_while_away(&cells, &before, &before, stopped);
    println!(
        "{what}: {rounds} rounds of the matrix in {} kept every verdict but {} ({changed} \
         probes change once the agents see it)",
        seconds(OUTAGE),
        problems.len()
    );
    failures.extend(first_of(what, problems));
    let restarts = kind_counters(&world, RESTARTS);
    world.cluster.api.restart();
    if let Err(e) = world.converge_after_reconnects(what, Instant::now(), &lists, &restarts) {
        failures.push(e);
    }

    failures.extend(echo_losses(kept, "through both outages"));
    println!("run time {}", seconds(started.elapsed()));
    if failures.len() > 40 {
        let n = failures.len();
        failures.truncate(40);
        failures.push(format!("... and {} more", n - 40));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The harness itself: a server that is down must fail the matrix, both where a probe
/// the model allows meets it (refused) and where only denied probes go to it (they time
/// out whether the server is up or not, so only the probe from its node, which the
/// policy does not judge, can tell).
#[test]
fn a_dead_server_fails_the_matrix_instead_of_passing_for_a_denial() {
    if !require_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut world = World::new();
    let xa = world.member("x/a");
    let node = world.members[xa].node;

    // x/a closed to every pod: its probes time out whether its servers are up or not;
    // the probes from its node are refused once they are stopped.
    world.act(&Action::Policy(
        "x",
        "a-closed",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"]}),
    ));
    world
        .converge(Instant::now())
        .unwrap_or_else(|e| panic!("x/a closed, its servers up: {e}"));
    world.kill_servers(xa);
    let closed = world
        .converge(Instant::now())
        .map(|c| format!("converged after {}", seconds(c.after)))
        .err();
    println!("x/a's servers stopped, x/a closed by a policy: {closed:?}");
    let closed =
        closed.unwrap_or_else(|| panic!("the matrix passed with x/a's servers stopped and closed"));
    let broken: Vec<&str> = closed.lines().filter(|l| l.contains("broken")).collect();
    assert!(
        !broken.is_empty()
            && broken
                .iter()
                .all(|l| l.contains(&format!("node {node} -> x/a "))),
        "the failure should name the probes of x/a from its node, refused, and only them: \
         {closed}"
    );

    // No policy: the probes the model allows to x/a are refused.
    world.act(&Action::DeletePolicy("x", "a-closed"));
    let open = world
        .converge(Instant::now())
        .map(|c| format!("converged after {}", seconds(c.after)))
        .err();
    println!("x/a's servers stopped, no policy: {open:?}");
    let open = open.unwrap_or_else(|| panic!("the matrix passed with x/a's servers stopped"));
    assert!(
        open.contains("-> x/a TCP/80 IPv4: refused: the server or the route is broken"),
        "the failure does not name a refused probe to x/a as a broken server: {open}"
    );
}

/// The harness itself: a [`Sequence`] sees a drop far shorter than TCP's retransmission
/// timeout, which a TCP echo with a generous read timeout rides out. Two namespaces of
/// our own joined by a veth pair, no cluster; the drop is an nftables rule in the
/// server's namespace, in place for about 60 ms.
#[test]
fn a_numbered_flow_sees_a_drop_shorter_than_a_tcp_retransmission() {
    if !require_root() {
        return;
    }
    let (client, server) = (Netns::new("cnibb-np-seq-c"), Netns::new("cnibb-np-seq-s"));
    client.exec_ok(&[
        "ip",
        "link",
        "add",
        "seq0",
        "type",
        "veth",
        "peer",
        "name",
        "seq1",
        "netns",
        server.name(),
    ]);
    for (ns, dev, addr) in [
        (&client, "seq0", "10.231.0.1/24"),
        (&server, "seq1", "10.231.0.2/24"),
    ] {
        ns.exec_ok(&["ip", "addr", "add", addr, "dev", dev]);
        ns.exec_ok(&["ip", "link", "set", dev, "up"]);
        ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
    }
    let port = 7070;
    let _servers = Servers::start(server.path(), &[port]);
    let to = SocketAddr::from(([10, 231, 0, 2], port));
    let flow = Sequence::start(client.path(), to).unwrap_or_else(|e| panic!("UDP {to}: {e}"));
    let stream = netpol::connect_from(client.path(), to, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("TCP {to}: {e}"));
    let echo = Pinger::start(stream, false);
    std::thread::sleep(Duration::from_millis(300));
    server.exec_ok(&["nft", "add", "table", "inet", "seq_drop"]);
    server.exec_ok(&[
        "nft",
        "add",
        "chain",
        "inet",
        "seq_drop",
        "input",
        "{ type filter hook input priority 0; }",
    ]);
    let dropping = Instant::now();
    server.exec_ok(&[
        "nft", "add", "rule", "inet", "seq_drop", "input", "tcp", "dport", "7070", "drop",
    ]);
    server.exec_ok(&[
        "nft", "add", "rule", "inet", "seq_drop", "input", "udp", "dport", "7070", "drop",
    ]);
    std::thread::sleep(Duration::from_millis(60));
    server.exec_ok(&["nft", "delete", "table", "inet", "seq_drop"]);
    let dropped_for = dropping.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    let datagrams = flow.finish();
    let echoes = echo.finish();
    let runs = lost_runs(&datagrams);
    let lost: usize = runs.iter().map(|(_, n)| n).sum();
    let tcp_lost = echoes.iter().filter(|(_, ok)| !ok).count();
    println!(
        "a drop of {} (from the first rule to the table's deletion): {lost} of {} numbered \
         datagrams lost in {} runs; the TCP echo (500 ms read timeout) lost {tcp_lost} of {}",
        seconds(dropped_for),
        datagrams.len(),
        runs.len(),
        echoes.len()
    );
    // Only datagrams sent while the rules were in place (give or take the time a
    // packet takes to cross) may be lost, and some must be.
    let slack = Duration::from_millis(20);
    let outside: Vec<f64> = datagrams
        .iter()
        .filter(|d| d.echoed.is_none())
        .filter(|d| d.sent + slack < dropping || d.sent > dropping + dropped_for)
        .map(|d| {
            if d.sent >= dropping {
                d.sent.duration_since(dropping).as_secs_f64()
            } else {
                -dropping.duration_since(d.sent).as_secs_f64()
            }
        })
        .collect();
    assert!(
        lost >= 1 && outside.is_empty(),
        "want datagrams lost while the drop was in place ({}), and only then: {lost} lost, \
         these outside it (s from its start): {outside:?}",
        seconds(dropped_for)
    );
}
