//! ClusterNetworkPolicy end to end: network-policy-api's conformance suite, and the
//! tiers' own cases, on a cluster of network namespaces whose agents judge every packet
//! in the kernel, with the tests' oracle as the expectation.
//!
//! The cluster (`cni_blackbox::cluster`) has two nodes running `cni-node` against the
//! Kubernetes API test server, holding upstream's conformance base
//! (`cluster_network_policy_cases`): five namespaces `network-policy-conformance-<house>`
//! labelled `conformance-house: <house>`, two pods in each (`<set>-0` on node 1, `<set>-1`
//! on node 2) with upstream's labels and named ports (`web` TCP 80, `dns` UDP 53). The
//! pods of `forbidden-forrest` (`centaur-*`) are on the host network: their "servers" run
//! in their node's namespace, on upstream's host ports, at the node's addresses. Every
//! other pod is attached through cnitool with the runtime's `K8S_POD_*` arguments and
//! serves TCP and UDP on 80, 8080, 53 and 5353, both families.
//!
//! A matrix is every (source pod, destination pod, service, family), a pod with itself
//! left out; a destination's services are TCP 80 and 8080 and UDP 53 and 5353 (a host
//! pod's: TCP 34345 and 34346, UDP 34347 and 34349, the ports upstream probes): 720
//! probes. What each should do comes from `cni_blackbox::policy_oracle` (with the
//! ClusterNetworkPolicies, the NetworkPolicies, the Nodes, Namespaces and Pods the API
//! server holds at that moment), written apart from the agent. A step passes when a
//! whole matrix equals the oracle, within [`DEADLINE`] of the change. As in
//! `network_policy.rs`, a denied probe agrees only by timing out (a refusal or an error
//! means a broken server or route and fails at once), and every server of a denied
//! probe must be shown alive in the same pass (by an allowed probe, or from its node).
//!
//! Before a conformance step's matrix, the oracle itself is held to upstream's stated
//! verdicts for that subtest's probes (both families where upstream's hold for both),
//! so a matrix that equals a wrong oracle cannot pass. SCTP is judged by the oracle
//! only: the prober speaks TCP and UDP.
//!
//! Beside the suite: the tiers around NetworkPolicy (an Admin deny over a
//! NetworkPolicy's allow, an Admin pass handing the decision to it, a Baseline deny under
//! a NetworkPolicy that isolates), priorities swapped and rules reordered in place under
//! a numbered flow that every state allows (it must lose no datagram), an egress deny,
//! a new pod under an Admin deny probed from right after its ADD, and every policy
//! deleted (each node's table then has the shape it had before any policy); the agent
//! SIGKILLed in the middle of a change and the API server gone in the middle of one;
//! and a cluster whose API server has no ClusterNetworkPolicy CRD, where NetworkPolicy
//! works as before and the kind is enforced within [`CRD_DEADLINE`] of the CRD's
//! installation, without a restart.
//!
//! `CNI_RS_CNP_CASES=<text>` runs the conformance tests whose name holds the text; by
//! default all 24 run.

mod cluster_network_policy_cases;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cluster_network_policy_cases::{
    Action, Case, Edit, HOST_NETWORK_HOUSE, HOST_PORTS, HOUSES, Step, experimental, house_of,
    namespace, standard,
};
use cni_blackbox::cluster::{Cluster, NETWORK, node_name, node_v4, node_v6, parse};
use cni_blackbox::hostport::in_netns;
use cni_blackbox::netpol::{self, Datagram, Outcome, Probe, Protocol, Sequence, Servers};
use cni_blackbox::policy_matrix::{self, Cell, NotConverged, Pods, Server, seconds};
use cni_blackbox::policy_oracle::{Oracle, Verdict};
use cni_blackbox::{Netns, require_root};
use cni_kube_api::{
    Kind, cluster_network_policy, network_policy, realistic_namespace, realistic_pod,
};
use serde_json::{Value, json};

/// How long a probe waits for its answer (a denial is a drop: it always waits this).
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a matrix may take to equal the oracle after a change.
const DEADLINE: Duration = Duration::from_secs(10);
/// How long after the CRD's installation the kind must be enforced: the agent looks
/// for a kind the API did not serve every 30 s.
const CRD_DEADLINE: Duration = Duration::from_secs(60);
/// The policy table's name (family inet).
const TABLE: &str = "cni_node_policy";
/// What a pod serves, and the matrix probes of it.
const POD_SERVICES: [(Protocol, u16); 4] = [
    (Protocol::Tcp, 80),
    (Protocol::Tcp, 8080),
    (Protocol::Udp, 53),
    (Protocol::Udp, 5353),
];
/// What a host-network pod serves (upstream probes these of its host ports).
const HOST_SERVICES: [(Protocol, u16); 4] = [
    (Protocol::Tcp, HOST_PORTS[0]),
    (Protocol::Tcp, HOST_PORTS[1]),
    (Protocol::Udp, HOST_PORTS[2]),
    (Protocol::Udp, HOST_PORTS[4]),
];
/// The label every namespace and pod of the base carries.
const HOUSE: &str = "conformance-house";

/// The tests of this file one at a time: each builds a cluster and measures how fast it
/// follows changes, which another's load would blur.
static SERIAL: Mutex<()> = Mutex::new(());

/// A pod of the base.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    house: &'static str,
    node: u8,
    v4: IpAddr,
    v6: IpAddr,
    /// Its network namespace: its node's for a host-network pod.
    netns: PathBuf,
    host_network: bool,
    /// Whether its Pod object shows its addresses.
    posted: bool,
}

impl Member {
    fn ip(&self, v6: bool) -> IpAddr {
        if v6 { self.v6 } else { self.v4 }
    }

    fn services(&self) -> &'static [(Protocol, u16)] {
        if self.host_network {
            &HOST_SERVICES
        } else {
            &POD_SERVICES
        }
    }
}

/// A matrix that equalled the oracle.
#[derive(Debug)]
struct Converged {
    /// When the pass that matched began, after the change.
    after: Duration,
    passes: u32,
    cells: usize,
    denied: usize,
}

/// A connection a tier case states the verdict of, checked against the oracle before
/// the matrix is (so the case means what it says): from, to, protocol, port, allowed.
type Stated = (&'static str, &'static str, &'static str, u16, bool);

/// The cluster, its pods and their servers.
struct World {
    // Field order is drop order: the servers close their sockets before the cluster
    // deletes the pods.
    servers: Vec<Option<Box<dyn std::any::Any>>>,
    cluster: Cluster,
    members: Vec<Member>,
    /// The houses whose namespace labels a case changed.
    relabelled: BTreeSet<&'static str>,
}

impl World {
    /// Two nodes and upstream's base. Node 2's agent holds every peer of pods in a
    /// shared set, node 1's copies them into its profiles' own sets, so both ways are
    /// judged. Without `crd`, the API server does not serve ClusterNetworkPolicy.
    fn new(crd: bool) -> Self {
        let started = Instant::now();
        let mut cluster = Cluster::without_nodes(1500);
        if !crd {
            cluster.api.uninstall_crd(Kind::ClusterNetworkPolicy);
        }
        for n in 1..=2 {
            cluster.add_host_with(n, 1500, |host| {
                if host.n == 2 {
                    host.extra_args
                        .push("--policy-shared-peer-ranges=1".to_owned());
                }
            });
        }
        cluster.wait_for_conflists();
        let mesh = cluster.mesh_of();
        cluster.wait_for_routes(Duration::from_secs(20), Cluster::full_mesh(&mesh));
        let mut world = Self {
            servers: Vec::new(),
            cluster,
            members: Vec::new(),
            relabelled: BTreeSet::new(),
        };
        for (house, _) in HOUSES {
            world.set_namespace_labels(house, &[(HOUSE, house)]);
        }
        for (house, set) in HOUSES {
            for i in 0..2u8 {
                let name = format!("{set}-{i}");
                let m = if house == HOST_NETWORK_HOUSE {
                    world.add_host_network_pod(house, &name, 1 + i)
                } else {
                    world.add_pod(house, &name, 1 + i)
                };
                world.post_ips(m);
            }
        }
        println!(
            "cluster of 2 nodes and {} pods ({} on the host network) ready after {:.1} s",
            world.members.len(),
            world.members.iter().filter(|m| m.host_network).count(),
            started.elapsed().as_secs_f64()
        );
        world
    }

    fn set_namespace_labels(&self, house: &str, labels: &[(&str, &str)]) {
        self.cluster
            .api
            .apply_namespace(realistic_namespace(&namespace(house), labels));
    }

    /// Pod `name` of `house` as a runtime makes it: the Pod object (no address yet),
    /// then ADD with the K8S arguments, then its servers. Its addresses are not posted.
    fn add_pod(&mut self, house: &'static str, name: &str, node: u8) -> usize {
        let ns = namespace(house);
        let mut member = Member {
            name: name.to_owned(),
            house,
            node,
            v4: parse("0.0.0.0"),
            v6: parse("::"),
            netns: PathBuf::new(),
            host_network: false,
            posted: false,
        };
        self.cluster.api.apply_pod(pod_object(&member));
        let uid = self
            .cluster
            .api
            .get(Kind::Pod, &ns, name)
            .and_then(|pod| pod["metadata"]["uid"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("the API server gave {ns}/{name} no uid"));
        let pod = self.cluster.host(node).add_k8s_pod(&ns, name, &uid);
        (member.v4, member.v6) = (pod.v4, pod.v6);
        member.netns = pod.ns.path().to_path_buf();
        let ports: Vec<u16> = POD_SERVICES.iter().map(|(_, p)| *p).collect();
        self.servers
            .push(Some(Box::new(Servers::start(&member.netns, &ports))));
        self.members.push(member);
        self.members.len() - 1
    }

    /// A host-network pod on `node`: its node's addresses and namespace, servers on
    /// upstream's host ports there.
    fn add_host_network_pod(&mut self, house: &'static str, name: &str, node: u8) -> usize {
        let netns = self.cluster.host(node).ns.path().to_path_buf();
        let member = Member {
            name: name.to_owned(),
            house,
            node,
            v4: parse(&node_v4(node)),
            v6: parse(&node_v6(node)),
            netns,
            host_network: true,
            posted: false,
        };
        // TCP answers from the address it was reached at; a UDP server on a wildcard
        // address answers a pod of its own node from the bridge's address, which the
        // pod's connected socket ignores: UDP is served on the node's addresses.
        let tcp: Vec<u16> = HOST_SERVICES
            .iter()
            .filter(|(p, _)| *p == Protocol::Tcp)
            .map(|(_, port)| *port)
            .collect();
        let udp: Vec<SocketAddr> = HOST_SERVICES
            .iter()
            .filter(|(p, _)| *p == Protocol::Udp)
            .flat_map(|(_, port)| {
                [
                    SocketAddr::new(member.v4, *port),
                    SocketAddr::new(member.v6, *port),
                ]
            })
            .collect();
        let servers = (
            Servers::start(&member.netns, &tcp),
            UdpEcho::start(&member.netns, udp),
        );
        self.servers.push(Some(Box::new(servers)));
        self.members.push(member);
        self.members.len() - 1
    }

    /// Posts pod `i`'s addresses to its Pod object, as the kubelet does.
    fn post_ips(&mut self, i: usize) {
        self.members[i].posted = true;
        self.cluster.api.apply_pod(pod_object(&self.members[i]));
    }

    /// Pod `i` gone as a runtime and the API remove it: its servers stopped, DEL with
    /// its arguments, its Pod object deleted. It stays in [`Self::members`], unposted,
    /// so no cell holds it.
    fn remove_pod(&mut self, i: usize) {
        drop(self.servers[i].take());
        let m = &mut self.members[i];
        m.posted = false;
        let host = self.cluster.host(m.node);
        if let Some(at) = host.pods.iter().position(|p| p.ns.path() == m.netns) {
            let pod = host.pods.remove(at);
            host.cnitool_with_args(&["del", NETWORK, pod.ns.path_str()], &pod.id, &pod.cni_args);
        }
        let removed = self.cluster.api.delete_pod(&namespace(m.house), &m.name);
        assert!(removed, "no Pod object {} to delete", m.name);
    }

    fn member(&self, name: &str) -> usize {
        self.members
            .iter()
            .position(|m| m.name == name)
            .unwrap_or_else(|| panic!("no pod {name}"))
    }

    fn node_ns(&self, n: u8) -> &Netns {
        &self.cluster.node(n).ns
    }

    /// Every object of `kind` the API server holds now.
    fn all(&self, kind: Kind) -> Vec<Value> {
        let api = &self.cluster.api;
        if !api.crd_installed(kind) {
            return Vec::new();
        }
        api.keys(kind)
            .iter()
            .filter_map(|key| {
                let (namespace, name) = key.split_once('/').unwrap_or(("", key));
                api.get(kind, namespace, name)
            })
            .collect()
    }

    /// The oracle of the objects the API server holds now.
    fn oracle(&self) -> Oracle {
        Oracle::with_cluster_network_policies(
            &self.all(Kind::Pod),
            &self.all(Kind::Namespace),
            &self.all(Kind::Node),
            &self.all(Kind::NetworkPolicy),
            &self.all(Kind::ClusterNetworkPolicy),
        )
        .unwrap_or_else(|e| {
            panic!("the oracle cannot read the API server's objects (a mistake in the case): {e}")
        })
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
                for &(protocol, port) in self.members[to].services() {
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
        cells
    }

    fn verdicts(&self, cells: &[Cell]) -> Vec<Verdict> {
        let oracle = self.oracle();
        cells
            .iter()
            .map(|c| {
                oracle.verdict(
                    self.members[c.from].ip(c.v6),
                    self.members[c.to].ip(c.v6),
                    c.protocol.name(),
                    c.port,
                )
            })
            .collect()
    }

    /// What a round of `cells` and of `servers` (from their nodes) says is broken, and
    /// the servers of `need` it did not show alive.
    fn round_problems(
        &self,
        cells: &[Cell],
        outcomes: &[Outcome],
        servers: &[Server],
        need: &BTreeSet<Server>,
    ) -> Vec<String> {
        let (cell_outcomes, server_outcomes) = outcomes.split_at(cells.len());
        let mut problems =
            policy_matrix::broken(self, cells, cell_outcomes, servers, server_outcomes);
        let dead: Vec<String> =
            policy_matrix::not_shown_alive(need, cells, cell_outcomes, servers, server_outcomes)
                .into_iter()
                .map(|s| self.describe_server(s))
                .collect();
        if !dead.is_empty() {
            problems.push(format!(
                "  no probe reached these servers of denied probes (nor their node): {}",
                dead.join(", ")
            ));
        }
        problems
    }

    /// Runs the matrix until it equals the oracle (of the objects now), for at most
    /// `deadline` after `since` ([`policy_matrix::converge`]); the failure's text has
    /// the cells that differ and each node's table and log.
    fn converge_within(&self, since: Instant, deadline: Duration) -> Result<Converged, String> {
        let cells = self.cells();
        let verdicts = self.verdicts(&cells);
        let expected: Vec<bool> = verdicts.iter().map(Verdict::allowed).collect();
        match policy_matrix::converge(self, &cells, &expected, since, deadline, PROBE_TIMEOUT) {
            Ok(c) => Ok(Converged {
                after: c.after,
                passes: c.passes,
                cells: cells.len(),
                denied: expected.iter().filter(|a| !**a).count(),
            }),
            Err(NotConverged::Broken(why)) => Err(why),
            Err(NotConverged::Differs { passes, outcomes }) => {
                Err(self.report(&cells, &verdicts, &outcomes, passes, deadline))
            }
        }
    }

    fn converge(&self, since: Instant) -> Result<Converged, String> {
        self.converge_within(since, DEADLINE)
    }

    /// Why the matrix failed: the cells that differ, with the oracle's reason, then
    /// each node's table and the agent's last lines.
    fn report(
        &self,
        cells: &[Cell],
        verdicts: &[Verdict],
        outcomes: &[Outcome],
        passes: u32,
        deadline: Duration,
    ) -> String {
        let wrong: Vec<String> = cells
            .iter()
            .zip(verdicts)
            .zip(outcomes)
            .filter(|((_, v), o)| !o.agrees(v.allowed()))
            .map(|((c, v), o)| {
                format!(
                    "  {}: the oracle says {} ({}), the probe {}",
                    self.describe(c),
                    if v.allowed() { "allowed" } else { "denied" },
                    v.why(),
                    o.word()
                )
            })
            .collect();
        let mut text = format!(
            "the matrix still differs from the oracle after {deadline:?} ({passes} passes): {} \
             of {} probes\n",
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
            let listing = String::from_utf8_lossy(&table.stdout);
            let lines: Vec<&str> = listing.lines().collect();
            let log = host.agent_log();
            let tail: Vec<&str> = log
                .lines()
                .rev()
                .filter(|l| !l.contains(" DEBUG "))
                .take(15)
                .collect();
            let _ = write!(
                text,
                "node {} table ({} lines; the first 120):\n{}{}\nnode {} agent log (last lines \
                 above DEBUG):\n{}\n",
                host.n,
                lines.len(),
                lines
                    .iter()
                    .take(120)
                    .copied()
                    .collect::<Vec<_>>()
                    .join("\n"),
                String::from_utf8_lossy(&table.stderr),
                host.n,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        text
    }

    /// Deletes every ClusterNetworkPolicy and NetworkPolicy and sets namespace labels a
    /// case changed back.
    fn reset(&mut self) {
        let api = &self.cluster.api;
        if api.crd_installed(Kind::ClusterNetworkPolicy) {
            for key in api.keys(Kind::ClusterNetworkPolicy) {
                api.delete_cluster_network_policy(&key);
            }
        }
        for key in api.keys(Kind::NetworkPolicy) {
            let (namespace, name) = key.split_once('/').unwrap_or(("", &key));
            api.delete_network_policy(namespace, name);
        }
        for house in std::mem::take(&mut self.relabelled) {
            self.set_namespace_labels(house, &[(HOUSE, house)]);
        }
    }

    fn act(&mut self, action: &Action) -> Result<(), String> {
        let api = &self.cluster.api;
        match action {
            Action::Apply(policy) => {
                api.apply_cluster_network_policy(policy.clone());
            }
            Action::Edit(name, change) => {
                let mut policy = api
                    .get(Kind::ClusterNetworkPolicy, "", name)
                    .ok_or_else(|| format!("no ClusterNetworkPolicy {name} to change"))?;
                change.apply(&mut policy)?;
                api.apply_cluster_network_policy(policy);
            }
            Action::NetworkPolicy(house, name, spec) => {
                api.apply_network_policy(network_policy(&namespace(house), name, spec.clone()));
            }
            Action::DeleteNetworkPolicy(house, name) => {
                if !api.delete_network_policy(&namespace(house), name) {
                    return Err(format!("no NetworkPolicy {house}/{name} to delete"));
                }
            }
            Action::NamespaceLabels(house, labels) => {
                self.set_namespace_labels(house, labels);
                self.relabelled.insert(house);
            }
        }
        Ok(())
    }

    /// Where the oracle (of the objects now) and upstream's verdicts for `step`
    /// disagree; and the upstream probes of a protocol the prober speaks that the
    /// matrix does not hold (a mistake in the services).
    fn check_upstream(&self, step: &Step) -> Vec<String> {
        let oracle = self.oracle();
        let mut wrong = Vec::new();
        for probe in &step.probes {
            let (from, to) = (
                &self.members[self.member(probe.from)],
                &self.members[self.member(probe.to)],
            );
            let probed = probe.protocol == "SCTP"
                || to
                    .services()
                    .iter()
                    .any(|(p, port)| p.name() == probe.protocol && *port == probe.port);
            if !probed {
                wrong.push(format!(
                    "  {} -> {} {}/{}: upstream probes it, the matrix does not",
                    probe.from, probe.to, probe.protocol, probe.port
                ));
            }
            for v6 in [false, true] {
                if v6 && !step.ipv6 {
                    continue;
                }
                let verdict = oracle.verdict(from.ip(v6), to.ip(v6), probe.protocol, probe.port);
                if verdict.allowed() != probe.allowed {
                    wrong.push(format!(
                        "  {} -> {} {}/{} IPv{}: upstream says {}, the oracle {} ({})",
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
                        verdict.why()
                    ));
                }
            }
        }
        wrong
    }

    /// Where the oracle (of the objects now) disagrees with what a tier case states.
    fn check_stated(&self, stated: &[Stated]) -> Vec<String> {
        let oracle = self.oracle();
        let mut wrong = Vec::new();
        for &(from, to, protocol, port, allowed) in stated {
            let (f, t) = (
                &self.members[self.member(from)],
                &self.members[self.member(to)],
            );
            for v6 in [false, true] {
                let verdict = oracle.verdict(f.ip(v6), t.ip(v6), protocol, port);
                if verdict.allowed() != allowed {
                    wrong.push(format!(
                        "  {from} -> {to} {protocol}/{port} IPv{}: the case says {}, the oracle \
                         {} ({})",
                        if v6 { 6 } else { 4 },
                        if allowed { "allowed" } else { "denied" },
                        if verdict.allowed() {
                            "allows"
                        } else {
                            "denies"
                        },
                        verdict.why()
                    ));
                }
            }
        }
        wrong
    }

    /// Runs a conformance test: the previous test's policies and labels gone, its
    /// manifests, then each subtest's changes, the oracle held to upstream's verdicts,
    /// and a matrix that equals the oracle. Returns each step's convergence time.
    fn run_case(&mut self, case: &Case) -> Result<Vec<Duration>, String> {
        let mut times = Vec::new();
        let mut problems = Vec::new();
        let mut since = Instant::now();
        self.reset();
        for action in &case.manifests {
            self.act(action)?;
        }
        for (n, step) in case.steps.iter().enumerate() {
            if n > 0 {
                since = Instant::now();
            }
            for action in &step.actions {
                self.act(action)?;
            }
            let wrong = self.check_upstream(step);
            if !wrong.is_empty() {
                problems.push(format!(
                    "step {} {:?}: the oracle disagrees with upstream:\n{}",
                    n + 1,
                    step.name,
                    wrong.join("\n")
                ));
            }
            match self.converge(since) {
                Ok(c) => times.push(c.after),
                Err(e) => {
                    problems.push(format!("step {} {:?}: {e}", n + 1, step.name));
                    break;
                }
            }
        }
        if problems.is_empty() {
            Ok(times)
        } else {
            Err(problems.join("\n"))
        }
    }

    /// A tier step: `actions`, the oracle held to `stated`, then the matrix.
    fn tier_step(
        &mut self,
        what: &str,
        actions: &[Action],
        stated: &[Stated],
        failures: &mut Vec<String>,
    ) {
        let since = Instant::now();
        for action in actions {
            if let Err(e) = self.act(action) {
                failures.push(format!("{what}: {e}"));
                return;
            }
        }
        let wrong = self.check_stated(stated);
        if !wrong.is_empty() {
            failures.push(format!(
                "{what}: the oracle disagrees with the case:\n{}",
                wrong.join("\n")
            ));
        }
        match self.converge(since) {
            Ok(c) => println!(
                "{what}: converged after {} ({} passes, {} of {} denied)",
                seconds(c.after),
                c.passes,
                c.denied,
                c.cells
            ),
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }

    /// Numbered UDP flows (IPv4, IPv6) from pod `from` to port 53 of pod `to`.
    fn flows(&self, from: &str, to: &str) -> Vec<Sequence> {
        let (f, t) = (
            &self.members[self.member(from)],
            &self.members[self.member(to)],
        );
        let flows = [false, true]
            .into_iter()
            .map(|v6| {
                let addr = SocketAddr::new(t.ip(v6), 53);
                Sequence::start(&f.netns, addr)
                    .unwrap_or_else(|e| panic!("UDP {from} -> {addr}: {e}"))
            })
            .collect();
        // A few echoes in before anything changes.
        std::thread::sleep(Duration::from_millis(200));
        flows
    }

    /// Probes the whole matrix round after round for `how_long`: every cell whose
    /// verdict `keep` states (`Some`) must show it in every round, and nothing may be
    /// broken. Returns the rounds made and the problems.
    fn hold(
        &self,
        cells: &[Cell],
        keep: &[Option<bool>],
        how_long: Duration,
        what: &str,
        since: Instant,
    ) -> (usize, Vec<String>) {
        let need: BTreeSet<Server> = cells
            .iter()
            .zip(keep)
            .filter(|(_, k)| **k == Some(false))
            .map(|(c, _)| c.server())
            .collect();
        let allowed: Vec<bool> = keep.iter().map(|k| *k == Some(true)).collect();
        let (probes, servers) = policy_matrix::probes_with_alive(self, cells, &allowed, &need);
        let started = Instant::now();
        let mut rounds = 0;
        let mut problems = Vec::new();
        while started.elapsed() < how_long {
            rounds += 1;
            let at = seconds(since.elapsed());
            let outcomes = netpol::run(&probes, PROBE_TIMEOUT, |_, _| false);
            for line in self.round_problems(cells, &outcomes, &servers, &need) {
                problems.push(format!("{what}, {at}:{line}"));
            }
            for ((cell, outcome), want) in cells.iter().zip(&outcomes).zip(keep) {
                if let Some(allowed) = *want
                    && !outcome.agrees(allowed)
                    && !outcome.broken()
                {
                    problems.push(format!(
                        "{what}, {at}: {} {}, where the oracle says {} before and after the \
                         change",
                        self.describe(cell),
                        outcome.word(),
                        if allowed { "allowed" } else { "denied" }
                    ));
                }
            }
        }
        (rounds, problems)
    }
}

impl Pods for World {
    fn probe(&self, cell: &Cell) -> Probe {
        Probe {
            from: self.members[cell.from].netns.clone(),
            to: SocketAddr::new(self.members[cell.to].ip(cell.v6), cell.port),
            protocol: cell.protocol,
        }
    }

    /// A probe of `server` from its pod's node, which always reaches its own pods (and
    /// a host-network pod is its node): it shows the server alive when no pod may.
    fn node_probe(&self, server: Server) -> Probe {
        let m = &self.members[server.member];
        Probe {
            from: self.node_ns(m.node).path().to_path_buf(),
            to: SocketAddr::new(m.ip(server.v6), server.port),
            protocol: server.protocol,
        }
    }

    fn describe(&self, cell: &Cell) -> String {
        format!(
            "{} -> {} {}/{} IPv{}",
            self.members[cell.from].name,
            self.members[cell.to].name,
            cell.protocol.name(),
            cell.port,
            if cell.v6 { 6 } else { 4 }
        )
    }

    fn describe_server(&self, server: Server) -> String {
        format!(
            "{} {}/{} IPv{}",
            self.members[server.member].name,
            server.protocol.name(),
            server.port,
            if server.v6 { 6 } else { 4 }
        )
    }

    fn node_of(&self, member: usize) -> u8 {
        self.members[member].node
    }

    /// A send the sender's own node refused ([`refused_locally`]); from a pod, only a
    /// host-network one's.
    fn excused(&self, cell: Option<&Cell>, outcome: &Outcome) -> bool {
        let from_node = cell.is_none_or(|c| self.members[c.from].host_network);
        refused_locally(from_node, outcome)
    }
}

/// Whether `outcome`, of a probe sent from a node's own namespace (`from_node`), is the
/// node's kernel refusing the send (`EPERM`). Seen now and then on a UDP probe from a
/// node to a pod while the API server holds policies, a pass in a few hundred, never
/// twice in a row, and with no policy table rule on the node's own output: no verdict
/// of the pod's, so such a probe is neither broken nor a verdict, and the matrix is run
/// again (a matrix that still shows it at the deadline fails).
fn refused_locally(from_node: bool, outcome: &Outcome) -> bool {
    from_node && matches!(outcome, Outcome::Failed(e) if e.contains("Operation not permitted"))
}

/// UDP servers bound to given addresses that send every datagram back, from the
/// address it came to; stopped on drop.
struct UdpEcho {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UdpEcho {
    fn start(netns: &Path, addrs: Vec<SocketAddr>) -> Self {
        let sockets: Vec<UdpSocket> = in_netns(netns, move || {
            addrs
                .iter()
                .map(|addr| {
                    let socket =
                        UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind UDP {addr}: {e}"));
                    socket
                        .set_nonblocking(true)
                        .unwrap_or_else(|e| panic!("non-blocking: {e}"));
                    socket
                })
                .collect()
        });
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !flag.load(Ordering::Relaxed) {
                let mut idle = true;
                for socket in &sockets {
                    while let Ok((n, from)) = socket.recv_from(&mut buf) {
                        idle = false;
                        let _ = socket.send_to(&buf[..n], from);
                    }
                }
                if idle {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The Pod object of a member, with upstream's labels and named ports; pending (no
/// address) until posted.
fn pod_object(m: &Member) -> Value {
    let ips: Vec<String> = if m.posted {
        vec![m.v4.to_string(), m.v6.to_string()]
    } else {
        Vec::new()
    };
    let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
    let index = m.name.rsplit_once('-').map_or("0", |(_, i)| i);
    let mut pod = realistic_pod(
        &namespace(m.house),
        &m.name,
        &node_name(m.node),
        &ips,
        &[
            (HOUSE, m.house),
            ("statefulset.kubernetes.io/pod-name", &m.name),
            ("apps.kubernetes.io/pod-index", index),
        ],
    );
    let named = |name: String, port: u16, protocol: &str| json!({"name": name, "containerPort": port, "protocol": protocol});
    let ports = if m.host_network {
        let p = HOST_PORTS;
        pod["spec"]["hostNetwork"] = json!(true);
        vec![
            named(format!("web-{}", p[0]), p[0], "TCP"),
            named(format!("web-{}", p[1]), p[1], "TCP"),
            named(format!("dns-{}", p[2]), p[2], "UDP"),
            named(format!("dns-{}", p[4]), p[4], "UDP"),
        ]
    } else {
        vec![
            named("web".into(), 80, "TCP"),
            named("dns".into(), 53, "UDP"),
        ]
    };
    pod["spec"]["containers"][0]["ports"] = json!(ports);
    pod["spec"]["containers"][1]["ports"] = json!([]);
    pod["status"]["hostIP"] = json!(node_v4(m.node));
    pod["status"]["hostIPs"] = json!([{"ip": node_v4(m.node)}, {"ip": node_v6(m.node)}]);
    if !m.posted
        && let Some(status) = pod["status"].as_object_mut()
    {
        status.remove("podIP");
        status.remove("podIPs");
        status.insert("phase".into(), json!("Pending"));
    }
    pod
}

/// The first `n` of `problems`, and how many more there were.
fn first_of(problems: Vec<String>, n: usize) -> Vec<String> {
    let total = problems.len();
    let mut lines: Vec<String> = problems.into_iter().take(n).collect();
    if total > n {
        lines.push(format!("... and {} more", total - n));
    }
    lines
}

/// The shape of a node's policy table: every chain, set, map and rule, without
/// handles and counters' figures, elements sorted; sorted.
fn table_shape(ns: &Netns) -> Result<Vec<String>, String> {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for key in ["handle", "packets", "bytes", "expires"] {
                    map.remove(key);
                }
                for (_, v) in map.iter_mut() {
                    strip(v);
                }
                if let Some(Value::Array(elements)) = map.get_mut("elem") {
                    elements.sort_by_key(ToString::to_string);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let out = ns.exec(&["nft", "-j", "list", "table", "inet", TABLE]);
    if !out.status.success() {
        return Err(format!(
            "nft list table inet {TABLE}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut listing: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("nft -j: not JSON: {e}"))?;
    let mut shape: Vec<String> = listing["nftables"]
        .as_array_mut()
        .into_iter()
        .flatten()
        .filter(|item| item.get("metainfo").is_none())
        .map(|item| {
            strip(item);
            item.to_string()
        })
        .collect();
    shape.sort();
    Ok(shape)
}

/// What one table shape has that the other has not, for a report.
fn shape_difference(before: &[String], after: &[String]) -> String {
    let (b, a): (BTreeSet<&String>, BTreeSet<&String>) =
        (before.iter().collect(), after.iter().collect());
    let mut text = String::new();
    for gone in b.difference(&a).take(10) {
        let _ = writeln!(text, "  - {gone}");
    }
    for new in a.difference(&b).take(10) {
        let _ = writeln!(text, "  + {new}");
    }
    text
}

/// The datagrams of numbered flows that did not come back, printed; a failure per flow
/// that lost any (or sent fewer than 100).
fn flow_losses(flows: Vec<Sequence>, what: &str, through: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for (v6, flow) in [false, true].into_iter().zip(flows) {
        let datagrams: Vec<Datagram> = flow.finish();
        let lost = datagrams.iter().filter(|d| d.echoed.is_none()).count();
        println!(
            "{what} UDP IPv{}: {} numbered datagrams {through}, {lost} lost",
            if v6 { 6 } else { 4 },
            datagrams.len()
        );
        if lost > 0 || datagrams.len() < 100 {
            failures.push(format!(
                "{what} UDP IPv{}: {lost} of {} numbered datagrams lost {through}",
                if v6 { 6 } else { 4 },
                datagrams.len()
            ));
        }
    }
    failures
}

fn conformance_suite(world: &World) -> Vec<Case> {
    let ip_of = |pod: &str| world.members[world.member(pod)].v4;
    let mut cases = standard(&ip_of);
    cases.extend(experimental());
    cases
}

fn admin(name: &str, priority: u32, subject: Value, rules: Value) -> Value {
    let mut spec = json!({"tier": "Admin", "priority": priority, "subject": subject});
    for (field, list) in rules.as_object().into_iter().flatten() {
        spec[field] = list.clone();
    }
    cluster_network_policy(name, spec)
}

fn baseline(name: &str, priority: u32, subject: Value, rules: Value) -> Value {
    let mut policy = admin(name, priority, subject, rules);
    policy["spec"]["tier"] = json!("Baseline");
    policy
}

/// A `namespaces` selector of some houses by their label.
fn houses(names: &[&str]) -> Value {
    json!({"matchExpressions": [{"key": HOUSE, "operator": "In", "values": names}]})
}

fn house_namespaces(names: &[&str]) -> Value {
    json!({"namespaces": houses(names)})
}

#[test]
fn the_conformance_suite_holds_on_the_kernel() {
    if !require_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let started = Instant::now();
    let mut world = World::new(true);
    let base = world
        .converge(Instant::now())
        .unwrap_or_else(|e| panic!("without any policy: {e}"));
    assert_eq!(base.denied, 0);
    println!(
        "no policy: all {} probes answered ({} passes, {})",
        base.cells,
        base.passes,
        seconds(base.after)
    );
    let mut cases = conformance_suite(&world);
    for case in &cases {
        for step in &case.steps {
            for probe in &step.probes {
                assert!(house_of(probe.from).is_some() && house_of(probe.to).is_some());
            }
        }
    }
    // CNI_RS_CNP_CASES=<text>: only the tests whose name holds it (while working on one).
    if let Ok(only) = std::env::var("CNI_RS_CNP_CASES") {
        cases.retain(|c| c.name.contains(&only));
        println!("CNI_RS_CNP_CASES={only:?}: {} tests", cases.len());
    }
    let steps: usize = cases.iter().map(|c| c.steps.len()).sum();
    println!("{} conformance tests, {steps} steps", cases.len());
    let mut failures = Vec::new();
    let mut times = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let label = format!("test {}/{} {}", i + 1, cases.len(), case.name);
        match world.run_case(case) {
            Ok(each) => {
                let text: Vec<String> = each.iter().map(|t| seconds(*t)).collect();
                println!("{label}: converged after {}", text.join(", then "));
                times.extend(each);
            }
            Err(e) => {
                println!("{label}: FAILED\n{e}");
                failures.push(format!("{label}: {e}"));
            }
        }
    }
    world.reset();
    if let Err(e) = world.converge(Instant::now()) {
        failures.push(format!("every policy deleted: {e}"));
    }
    times.sort();
    if let (Some(median), Some(max)) = (times.get(times.len() / 2), times.last()) {
        cni_blackbox::measured::record_duration(
            "cluster_network_policy: matrix convergence after a conformance step (median)",
            *median,
        );
        cni_blackbox::measured::record_duration(
            "cluster_network_policy: matrix convergence after a conformance step (max)",
            *max,
        );
        println!(
            "{} tests, {} steps converged: median {}, max {}; {} failed; run time {}",
            cases.len(),
            times.len(),
            seconds(*median),
            seconds(*max),
            failures.len(),
            seconds(started.elapsed())
        );
    }
    policy_matrix::assert_no_failures(&failures);
}

/// The tiers around NetworkPolicy, changes in place, a new pod under an Admin deny,
/// and the tables after every policy is gone.
#[test]
fn tiers_wrap_network_policy_and_change_in_place() {
    if !require_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut world = World::new(true);
    world
        .converge(Instant::now())
        .unwrap_or_else(|e| panic!("without any policy: {e}"));
    let shapes_before: Vec<(u8, Result<Vec<String>, String>)> = world
        .cluster
        .hosts
        .iter()
        .map(|h| (h.n, table_shape(&h.ns)))
        .collect();
    let mut failures: Vec<String> = Vec::new();

    // gryffindor admits slytherin by NetworkPolicy (and so isolates itself); an Admin
    // deny of slytherin wins over it.
    world.tier_step(
        "Admin deny over a NetworkPolicy allow",
        &[
            Action::NetworkPolicy(
                "gryffindor",
                "from-slytherin",
                json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [
                    {"from": [{"namespaceSelector": {"matchLabels": {HOUSE: "slytherin"}}}]}]}),
            ),
            Action::Apply(admin(
                "no-slytherin-to-gryffindor",
                10,
                house_namespaces(&["gryffindor"]),
                json!({"ingress": [{"name": "deny-slytherin", "action": "Deny",
                                    "from": [house_namespaces(&["slytherin"])]}]}),
            )),
        ],
        &[
            ("draco-malfoy-0", "harry-potter-1", "TCP", 80, false),
            ("draco-malfoy-1", "harry-potter-1", "UDP", 53, false),
            ("cedric-diggory-0", "harry-potter-0", "TCP", 80, false),
            ("harry-potter-0", "draco-malfoy-1", "TCP", 80, true),
        ],
        &mut failures,
    );
    // The same rule made Pass: the NetworkPolicy decides, and admits slytherin only.
    world.tier_step(
        "Admin pass to NetworkPolicy",
        &[Action::Edit(
            "no-slytherin-to-gryffindor",
            Edit::IngressAction(0, "Pass"),
        )],
        &[
            ("draco-malfoy-0", "harry-potter-1", "TCP", 80, true),
            ("draco-malfoy-1", "harry-potter-0", "UDP", 53, true),
            ("cedric-diggory-0", "harry-potter-0", "TCP", 80, false),
        ],
        &mut failures,
    );
    // A Baseline deny of every ingress to gryffindor and hufflepuff: gryffindor is
    // isolated by its NetworkPolicy, which decides there; hufflepuff is not.
    world.tier_step(
        "Baseline deny under a NetworkPolicy that isolates",
        &[Action::Apply(baseline(
            "closed-by-default",
            10,
            house_namespaces(&["gryffindor", "hufflepuff"]),
            json!({"ingress": [{"name": "deny-all", "action": "Deny",
                                "from": [{"namespaces": {}}]}]}),
        ))],
        &[
            ("draco-malfoy-0", "harry-potter-1", "TCP", 80, true),
            ("luna-lovegood-0", "harry-potter-1", "TCP", 80, false),
            ("draco-malfoy-0", "cedric-diggory-1", "TCP", 8080, false),
            ("draco-malfoy-0", "luna-lovegood-1", "UDP", 5353, true),
        ],
        &mut failures,
    );

    // ravenclaw: hufflepuff always admitted first (priority 5); slytherin accepted at
    // 20 and denied at 30, then the priorities swapped, then the deny's rules
    // reordered, all in place, while a numbered flow from hufflepuff, which every
    // state admits, runs through.
    world.tier_step(
        "priorities: accept at 20 before deny at 30",
        &[
            Action::Apply(admin(
                "ravenclaw-keeps-hufflepuff",
                5,
                house_namespaces(&["ravenclaw"]),
                json!({"ingress": [{"name": "accept-hufflepuff", "action": "Accept",
                                    "from": [house_namespaces(&["hufflepuff"])]}]}),
            )),
            Action::Apply(admin(
                "ravenclaw-accepts-slytherin",
                20,
                house_namespaces(&["ravenclaw"]),
                json!({"ingress": [{"name": "accept-slytherin", "action": "Accept",
                                    "from": [house_namespaces(&["slytherin"])]}]}),
            )),
            Action::Apply(admin(
                "ravenclaw-denies-slytherin",
                30,
                house_namespaces(&["ravenclaw"]),
                json!({"ingress": [
                    {"name": "deny-slytherin", "action": "Deny",
                     "from": [house_namespaces(&["slytherin"])]},
                    {"name": "accept-slytherin", "action": "Accept",
                     "from": [house_namespaces(&["slytherin"])]}]}),
            )),
        ],
        &[
            ("draco-malfoy-0", "luna-lovegood-1", "TCP", 80, true),
            ("cedric-diggory-0", "luna-lovegood-1", "UDP", 53, true),
        ],
        &mut failures,
    );
    let flows = world.flows("cedric-diggory-0", "luna-lovegood-1");
    world.tier_step(
        "priorities swapped in place: deny at 20",
        &[
            Action::Edit("ravenclaw-accepts-slytherin", Edit::Priority(30)),
            Action::Edit("ravenclaw-denies-slytherin", Edit::Priority(20)),
        ],
        &[
            ("draco-malfoy-0", "luna-lovegood-1", "TCP", 80, false),
            ("draco-malfoy-1", "luna-lovegood-0", "UDP", 53, false),
            ("cedric-diggory-0", "luna-lovegood-1", "UDP", 53, true),
        ],
        &mut failures,
    );
    world.tier_step(
        "rules reordered in place: the accept first",
        &[Action::Edit(
            "ravenclaw-denies-slytherin",
            Edit::SwapIngress(0, 1),
        )],
        &[
            ("draco-malfoy-0", "luna-lovegood-1", "TCP", 80, true),
            ("cedric-diggory-0", "luna-lovegood-1", "UDP", 53, true),
        ],
        &mut failures,
    );
    // The flows run on a second past the last change, so that a late drop shows.
    std::thread::sleep(Duration::from_secs(1));
    failures.extend(flow_losses(
        flows,
        "cedric-diggory-0 -> luna-lovegood-1",
        "through a priority swap and a rule reorder",
    ));
    world.tier_step(
        "Admin egress deny to pods",
        &[Action::Apply(admin(
            "hufflepuff-not-to-slytherin",
            40,
            house_namespaces(&["hufflepuff"]),
            json!({"egress": [{"name": "deny-slytherin-pods", "action": "Deny",
                "to": [{"pods": {"namespaceSelector": {"matchLabels": {HOUSE: "slytherin"}},
                                 "podSelector": {"matchLabels": {HOUSE: "slytherin"}}}}]}]}),
        ))],
        &[
            ("cedric-diggory-0", "draco-malfoy-1", "TCP", 80, false),
            ("cedric-diggory-1", "draco-malfoy-1", "UDP", 5353, false),
            ("cedric-diggory-0", "harry-potter-1", "TCP", 80, false),
            ("cedric-diggory-0", "luna-lovegood-1", "TCP", 80, true),
        ],
        &mut failures,
    );

    // A new pod under an Admin deny of everything but its node: refused from the
    // first packet after its ADD, before its addresses reach the API.
    world.tier_step(
        "an Admin deny of a pod that is not there yet",
        &[Action::Apply(admin(
            "new-pod-closed",
            1,
            json!({"pods": {"namespaceSelector": {"matchLabels": {HOUSE: "ravenclaw"}},
                             "podSelector": {"matchLabels": {
                                 "statefulset.kubernetes.io/pod-name": "luna-lovegood-2"}}}}),
            json!({"ingress": [{"name": "deny-all", "action": "Deny", "from": [{"namespaces": {}}]}],
                   "egress": [{"name": "deny-all", "action": "Deny", "to": [{"namespaces": {}}]}]}),
        ))],
        &[],
        &mut failures,
    );
    let added = Instant::now();
    let new = world.add_pod("ravenclaw", "luna-lovegood-2", 1);
    let clients = [
        world.member("draco-malfoy-0"),
        world.member("cedric-diggory-1"),
    ];
    let target = world.member("harry-potter-0");
    let mut rounds = 0;
    let mut first_round = None;
    let mut new_pod_failures = Vec::new();
    while added.elapsed() < Duration::from_secs(2) {
        let m = &world.members[new];
        let mut probes = Vec::new();
        let mut what = Vec::new();
        for v6 in [false, true] {
            for &(protocol, port) in &POD_SERVICES[..3] {
                for &c in &clients {
                    probes.push(Probe {
                        from: world.members[c].netns.clone(),
                        to: SocketAddr::new(m.ip(v6), port),
                        protocol,
                    });
                    what.push((
                        format!("{} -> luna-lovegood-2", world.members[c].name),
                        v6,
                        false,
                    ));
                }
                probes.push(Probe {
                    from: m.netns.clone(),
                    to: SocketAddr::new(world.members[target].ip(v6), port),
                    protocol,
                });
                what.push(("luna-lovegood-2 -> harry-potter-0".to_owned(), v6, false));
                probes.push(Probe {
                    from: world.node_ns(m.node).path().to_path_buf(),
                    to: SocketAddr::new(m.ip(v6), port),
                    protocol,
                });
                what.push(("node 1 -> luna-lovegood-2 (its node)".to_owned(), v6, true));
            }
        }
        let began = added.elapsed();
        first_round.get_or_insert(began);
        let outcomes = netpol::run(&probes, PROBE_TIMEOUT, |_, _| false);
        rounds += 1;
        for ((probe, (who, v6, allowed)), outcome) in probes.iter().zip(&what).zip(&outcomes) {
            if !outcome.agrees(*allowed) && !refused_locally(*allowed, outcome) {
                new_pod_failures.push(format!(
                    "new pod, round begun {} after its ADD: {who} {}/{} IPv{}: {}, want {}",
                    seconds(began),
                    probe.protocol.name(),
                    probe.to.port(),
                    if *v6 { 6 } else { 4 },
                    outcome.word(),
                    if *allowed {
                        "answered (a node reaches its own pods)"
                    } else {
                        "dropped"
                    }
                ));
            }
        }
    }
    println!(
        "new pod under an Admin deny: {rounds} rounds of probes from {} after its ADD, before \
         its addresses were posted",
        seconds(first_round.unwrap_or_default())
    );
    failures.extend(first_of(new_pod_failures, 12));
    world.post_ips(new);
    match world.converge(Instant::now()) {
        Ok(c) => println!(
            "new pod posted: the {} probe matrix ({} denied) converged after {}",
            c.cells,
            c.denied,
            seconds(c.after)
        ),
        Err(e) => failures.push(format!("new pod posted: {e}")),
    }

    // Every policy gone: everything answers, and each table has its shape from before
    // any policy (the new pod is deleted first: it was not there then).
    world.remove_pod(new);
    world.reset();
    match world.converge(Instant::now()) {
        Ok(c) => println!("every policy deleted: converged after {}", seconds(c.after)),
        Err(e) => failures.push(format!("every policy deleted: {e}")),
    }
    for (n, before) in shapes_before {
        let Ok(before) = before else {
            failures.push(format!("node {n}: no table before any policy: {before:?}"));
            continue;
        };
        let ns = world.node_ns(n);
        let mut last = Ok(Vec::new());
        let same = cni_blackbox::cluster::wait(DEADLINE, "the table's shape from before", || {
            last = table_shape(ns);
            last.as_ref().is_ok_and(|now| *now == before)
        });
        if let Err(e) = same {
            let diff = match &last {
                Ok(now) => shape_difference(&before, now),
                Err(e) => e.clone(),
            };
            failures.push(format!("node {n}: {e}; it differs:\n{diff}"));
        } else {
            println!(
                "node {n}: the policy table has its shape from before any policy ({} items)",
                before.len()
            );
        }
    }
    policy_matrix::assert_no_failures(&failures);
}

/// An agent SIGKILLed right after a ClusterNetworkPolicy change is served, then the API
/// server gone while another is made: what the kernel holds is kept (the old rules or
/// the new, never neither), a flow every state admits loses nothing, and the change is
/// enforced once the agent, then the API, is back.
#[test]
fn a_killed_agent_or_a_lost_api_keeps_the_tiers_enforced() {
    if !require_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut world = World::new(true);
    let guard = |denied: &[&str]| {
        let mut rules = vec![json!({"name": "accept-hufflepuff", "action": "Accept",
                                    "from": [house_namespaces(&["hufflepuff"])]})];
        for house in denied {
            rules.push(json!({"name": format!("deny-{house}"), "action": "Deny",
                              "from": [house_namespaces(&[house])]}));
        }
        admin(
            "gryffindor-guard",
            10,
            house_namespaces(&["gryffindor"]),
            json!({ "ingress": rules }),
        )
    };
    let mut failures: Vec<String> = Vec::new();
    world
        .act(&Action::Apply(guard(&["slytherin"])))
        .unwrap_or_else(|e| panic!("{e}"));
    world
        .converge(Instant::now())
        .unwrap_or_else(|e| panic!("gryffindor closed to slytherin: {e}"));
    let flows = world.flows("cedric-diggory-0", "harry-potter-0");
    let cells = world.cells();
    let verdicts_now = |world: &World| -> Vec<bool> {
        world
            .verdicts(&cells)
            .iter()
            .map(Verdict::allowed)
            .collect()
    };
    let keep_of = |before: &[bool], after: &[bool]| -> Vec<Option<bool>> {
        before
            .iter()
            .zip(after)
            .map(|(b, a)| (b == a).then_some(*b))
            .collect()
    };

    // The change (ravenclaw denied too) is served and the agent of harry-potter-0's
    // node is killed at once, as it may be reading or applying it.
    let before = verdicts_now(&world);
    let node = world.members[world.member("harry-potter-0")].node;
    let kubeconfig = world.cluster.kubeconfig.clone();
    world
        .act(&Action::Apply(guard(&["slytherin", "ravenclaw"])))
        .unwrap_or_else(|e| panic!("{e}"));
    world.cluster.host(node).kill_agent();
    let killed = Instant::now();
    let after = verdicts_now(&world);
    let keep = keep_of(&before, &after);
    let (away, problems) = world.hold(
        &cells,
        &keep,
        Duration::from_secs(2),
        "agent killed",
        killed,
    );
    failures.extend(first_of(problems, 20));
    world.cluster.host(node).start_agent(&kubeconfig);
    let restarted = Instant::now();
    let (starting, problems) = world.hold(
        &cells,
        &keep,
        Duration::from_secs(1),
        "agent restarting",
        killed,
    );
    failures.extend(first_of(problems, 20));
    match world.converge(restarted) {
        Ok(c) => println!(
            "agent killed right after the change: {away} rounds kept every unchanged verdict \
             while it was away, {starting} while it started again; converged {} after the \
             restart",
            seconds(c.after)
        ),
        Err(e) => failures.push(format!("after the restart: {e}")),
    }

    // The API server goes away; meanwhile the guard lets slytherin in again and
    // ravenclaw stays out. Nobody can tell the agents: every verdict stays, and
    // both stay healthy and ready; once back, they enforce the change.
    let before = verdicts_now(&world);
    world.cluster.api.stop();
    let stopped = Instant::now();
    world
        .act(&Action::Apply(guard(&["ravenclaw"])))
        .unwrap_or_else(|e| panic!("{e}"));
    world.cluster.api.compact();
    let keep: Vec<Option<bool>> = before.iter().map(|b| Some(*b)).collect();
    let (rounds, problems) = world.hold(&cells, &keep, Duration::from_secs(2), "API away", stopped);
    failures.extend(first_of(problems, 20));
    for host in &world.cluster.hosts {
        for (path, want) in [("/healthz", "ok"), ("/readyz", "ready")] {
            match host.health(path) {
                Ok(a) if a.status == 200 && a.body.lines().next() == Some(want) => {}
                Ok(a) => failures.push(format!(
                    "node {}: GET {path} while the API is away: {a}",
                    host.n
                )),
                Err(e) => failures.push(format!(
                    "node {}: GET {path} while the API is away: {e}",
                    host.n
                )),
            }
        }
    }
    world.cluster.api.restart();
    let back = Instant::now();
    // The watches come back after their backoff (up to a minute after a long outage;
    // a few seconds here).
    match world.converge_within(back, DEADLINE * 3) {
        Ok(c) => println!(
            "API away for 2 s with a change made meanwhile: {rounds} rounds kept every verdict; \
             converged {} after its return",
            seconds(c.after)
        ),
        Err(e) => failures.push(format!("after the API's return: {e}")),
    }
    failures.extend(flow_losses(
        flows,
        "cedric-diggory-0 -> harry-potter-0",
        "through the kill and the outage",
    ));
    policy_matrix::assert_no_failures(&failures);
}

/// An API server without the CRD: NetworkPolicy is enforced as before and the agents
/// are ready; once the CRD is installed, a ClusterNetworkPolicy is enforced within
/// [`CRD_DEADLINE`], by the same agent processes.
#[test]
fn without_the_crd_network_policy_works_and_the_kind_is_found_once_installed() {
    if !require_root() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut world = World::new(false);
    let mut failures: Vec<String> = Vec::new();
    for host in &world.cluster.hosts {
        let ready = cni_blackbox::cluster::wait(DEADLINE, "readyz 200", || {
            host.health("/readyz").is_ok_and(|a| a.status == 200)
        });
        if let Err(e) = ready {
            failures.push(format!(
                "node {} without the CRD: {e}: {:?}",
                host.n,
                host.health("/readyz")
            ));
        }
    }
    let pids: Vec<Option<u32>> = world
        .cluster
        .hosts
        .iter()
        .map(|h| h.agent().map(|a| a.pid()))
        .collect();
    world.tier_step(
        "without the CRD: a NetworkPolicy",
        &[Action::NetworkPolicy(
            "slytherin",
            "from-gryffindor",
            json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [
                {"from": [{"namespaceSelector": {"matchLabels": {HOUSE: "gryffindor"}}}]}]}),
        )],
        &[
            ("harry-potter-0", "draco-malfoy-1", "TCP", 80, true),
            ("cedric-diggory-0", "draco-malfoy-1", "TCP", 80, false),
        ],
        &mut failures,
    );
    world.cluster.api.install_crd(Kind::ClusterNetworkPolicy);
    let installed = Instant::now();
    world
        .act(&Action::Apply(admin(
            "no-gryffindor-to-slytherin",
            10,
            house_namespaces(&["slytherin"]),
            json!({"ingress": [{"name": "deny-gryffindor", "action": "Deny",
                                "from": [house_namespaces(&["gryffindor"])]}]}),
        )))
        .unwrap_or_else(|e| panic!("{e}"));
    let wrong = world.check_stated(&[("harry-potter-0", "draco-malfoy-1", "TCP", 80, false)]);
    failures.extend(wrong);
    // The agents look for the kind again every 30 s: wait for them to say they enforce
    // it before probing, rather than probing the whole matrix over and over meanwhile
    // (tens of thousands of probes a second fill the node's conntrack table, and a full
    // table drops new connections: a send fails with EPERM).
    for host in &world.cluster.hosts {
        let found =
            cni_blackbox::cluster::wait(CRD_DEADLINE, "ClusterNetworkPolicy enforced", || {
                host.health("/readyz")
                    .is_ok_and(|a| a.body.contains("ClusterNetworkPolicy: enforced"))
            });
        if let Err(e) = found {
            failures.push(format!(
                "node {} after the CRD's installation: {e}: {:?}",
                host.n,
                host.health("/readyz")
            ));
        }
    }
    match world.converge_within(installed, CRD_DEADLINE) {
        Ok(c) => println!(
            "CRD installed: the Admin deny enforced {} after the installation",
            seconds(c.after)
        ),
        Err(e) => failures.push(format!("after the CRD's installation: {e}")),
    }
    let now: Vec<Option<u32>> = world
        .cluster
        .hosts
        .iter()
        .map(|h| h.agent().map(|a| a.pid()))
        .collect();
    assert_eq!(pids, now, "the agents are the same processes");
    for host in &world.cluster.hosts {
        // The agent's process is still the one started (not exited and restarted).
        let alive = host
            .agent()
            .is_some_and(|a| PathBuf::from(format!("/proc/{}", a.pid())).exists());
        if !alive {
            failures.push(format!(
                "node {}: the agent is gone:\n{}",
                host.n,
                host.agent_log()
            ));
        }
    }
    policy_matrix::assert_no_failures(&failures);
}
