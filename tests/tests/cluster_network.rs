//! The node agent (`cni-node`) for real, in a cluster made of network namespaces.
//!
//! Each "node" is a namespace on one underlay bridge (itself in a namespace), with an
//! IPv4 and an IPv6 address, running the built `cni-node` against the project's
//! Kubernetes API test server (`tests/kube-api`), which listens on the underlay like an
//! API server would. The agents write their conflists, route each other's pod CIDRs
//! and masquerade egress; pods are attached through our `cnitool` with the conflist
//! the agent wrote. An "internet" namespace on the underlay stands for everything
//! outside the cluster. Traffic is UDP between sockets opened in the namespaces, and
//! the receiver reports the source address it saw.
//!
//! The agent's API side is tested against the test server, not a real API server (none
//! can be installed here); the server speaks the API server's list and watch protocol
//! (resourceVersions, bookmarks, 410 Gone, chunked watch streams).

use std::collections::BTreeSet;
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cni_blackbox::underlay::{address, attach, source_seen};
use cni_blackbox::{Netns, TempDir, bin_dir, plugin_path, require_root, unique_name};
use cni_kube_api::{ApiServer, realistic_node};
use serde_json::Value;

/// The agent's route protocol number (its default).
const PROTO: &str = "77";
const NETWORK: &str = "k8s-pod-network";
const INTERNET_V4: &str = "198.18.0.1";
const INTERNET_V6: &str = "fd00:18::1";
/// Where the API server listens, on the underlay bridge.
const API_V4: &str = "198.18.0.250";

fn node_v4(n: u8) -> String {
    format!("198.18.0.{}", 10 + n)
}
fn node_v6(n: u8) -> String {
    format!("fd00:18::{:x}", 0x10 + n)
}
fn pod_cidr_v4(n: u8) -> String {
    format!("10.244.{n}.0/24")
}
fn pod_cidr_v6(n: u8) -> String {
    format!("fd00:244:0:{n}::/64")
}
fn node_name(n: u8) -> String {
    format!("node-{n}")
}

/// The Node object of node `n`, as a kubelet and the controller would have written it.
fn node_object(n: u8) -> Value {
    realistic_node(
        &node_name(n),
        &[&pod_cidr_v4(n), &pod_cidr_v6(n)],
        &[&node_v4(n), &node_v6(n)],
        40,
    )
}

fn parse(text: &str) -> IpAddr {
    text.parse()
        .unwrap_or_else(|e| panic!("{text:?} is not an IP: {e}"))
}

/// A running `cni-node`; killed (SIGKILL) and reaped on drop.
struct Agent {
    child: Child,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pod attached with cnitool.
struct Pod {
    ns: Netns,
    id: String,
    v4: IpAddr,
    v6: IpAddr,
}

/// One node: its namespace, directories, agent and pods.
struct Host {
    n: u8,
    ns: Netns,
    conf_dir: PathBuf,
    data_dir: PathBuf,
    cache_dir: PathBuf,
    log: PathBuf,
    agent: Option<Agent>,
    pods: Vec<Pod>,
}

impl Host {
    /// `ip route show proto 77` of both families: "dst via gw" lines, sorted.
    fn our_routes(&self) -> BTreeSet<String> {
        routes_of(&self.ns)
    }

    fn agent_log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn conflist(&self) -> Option<Value> {
        let text = fs::read_to_string(self.conf_dir.join("10-cni-plugins-rs.conflist")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Starts (or restarts) the agent, appending to its log.
    fn start_agent(&mut self, kubeconfig: &Path) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("open {}: {e}", self.log.display()));
        let child = Command::new("ip")
            .args(["netns", "exec", self.ns.name()])
            .arg(plugin_path("cni-node"))
            .arg(format!("--node-name={}", node_name(self.n)))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--cni-conf-dir={}", self.conf_dir.display()))
            .arg(format!("--cni-bin-dir={}", bin_dir().display()))
            .arg(format!("--ipam-data-dir={}", self.data_dir.display()))
            .arg("--resync-interval=1")
            .arg("--verbose")
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start cni-node: {e}"));
        self.agent = Some(Agent { child });
    }

    /// SIGKILL, no chance to clean up anything.
    fn kill_agent(&mut self) {
        self.agent = None;
    }

    /// Attaches a pod through cnitool with the conflist the agent wrote.
    fn add_pod(&mut self) {
        let ns = Netns::new("cnibb-cl-pod");
        let id = unique_name("cl-pod");
        let out = self.cnitool(&["add", NETWORK, ns.path_str()], &id);
        let result: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("cnitool add: not JSON ({e}): {out}"));
        let ip = |v4: bool| -> IpAddr {
            result["ips"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
                .find(|a: &IpAddr| a.is_ipv4() == v4)
                .unwrap_or_else(|| panic!("no IPv{} address in {result}", if v4 { 4 } else { 6 }))
        };
        let (v4, v6) = (ip(true), ip(false));
        self.pods.push(Pod { ns, id, v4, v6 });
    }

    fn cnitool(&self, args: &[&str], id: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", self.ns.name(), "timeout", "60"])
            .arg(plugin_path("cnitool"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("NETCONFPATH", &self.conf_dir)
            .env("CNI_PATH", bin_dir())
            .env("CNI_CACHE_DIR", &self.cache_dir)
            .env("CNI_CONTAINERID", id)
            .output()
            .unwrap_or_else(|e| panic!("run cnitool: {e}"));
        assert!(
            out.status.success(),
            "node {}: cnitool {args:?} failed: {}{}",
            self.n,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.agent = None;
        for pod in std::mem::take(&mut self.pods) {
            let out = Command::new("ip")
                .args(["netns", "exec", self.ns.name(), "timeout", "60"])
                .arg(plugin_path("cnitool"))
                .args(["del", NETWORK, pod.ns.path_str()])
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("NETCONFPATH", &self.conf_dir)
                .env("CNI_PATH", bin_dir())
                .env("CNI_CACHE_DIR", &self.cache_dir)
                .env("CNI_CONTAINERID", &pod.id)
                .output();
            if let Ok(out) = out {
                if !out.status.success() {
                    eprintln!(
                        "node {}: cnitool del {}: {}",
                        self.n,
                        pod.id,
                        String::from_utf8_lossy(&out.stdout)
                    );
                }
            }
        }
    }
}

fn routes_of(ns: &Netns) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for family in ["-4", "-6"] {
        let text = ns.exec_ok(&["ip", family, "route", "show", "proto", PROTO]);
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let [dst, "via", gw, ..] = words[..] {
                out.insert(format!("{dst} via {gw}"));
            }
        }
    }
    out
}

/// The routes every node but `n` should have to node `other`.
fn routes_to(other: u8, v4: &str, v6: &str) -> [String; 2] {
    [
        format!("{} via {v4}", pod_cidr_v4(other)),
        format!("{} via {v6}", pod_cidr_v6(other)),
    ]
}

/// The cluster: API server, underlay, "internet", and nodes with agents.
struct Cluster {
    // Field order is drop order: nodes (agents, pods) first, then the namespaces they
    // live on, then the server and the files.
    hosts: Vec<Host>,
    internet: Netns,
    underlay: Netns,
    api: ApiServer,
    kubeconfig: PathBuf,
    dir: TempDir,
}

impl Cluster {
    /// `nodes` node namespaces with Node objects and running agents; `mtu` is the
    /// underlay's.
    fn new(nodes: u8, mtu: u32) -> Self {
        let dir = TempDir::new("cnibb-cl");
        let underlay = Netns::new("cnibb-cl-underlay");
        underlay.exec_ok(&[
            "ip",
            "link",
            "add",
            "ulbr",
            "mtu",
            &mtu.to_string(),
            "type",
            "bridge",
        ]);
        underlay.exec_ok(&["ip", "link", "set", "ulbr", "up"]);
        underlay.exec_ok(&["ip", "link", "set", "lo", "up"]);
        underlay.exec_ok(&["ip", "addr", "add", &format!("{API_V4}/24"), "dev", "ulbr"]);
        let api = ApiServer::start_in_netns(
            underlay.path(),
            format!("{API_V4}:0")
                .parse()
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig);
        let internet = Netns::new("cnibb-cl-internet");
        attach(&underlay, "ulbr", &internet, "inet");
        address(&internet, INTERNET_V4, "24");
        address(&internet, INTERNET_V6, "64");
        let mut cluster = Self {
            hosts: Vec::new(),
            internet,
            underlay,
            api,
            kubeconfig,
            dir,
        };
        for n in 1..=nodes {
            cluster.add_host(n, mtu);
        }
        cluster
    }

    /// A node namespace on the underlay, its Node object, and its agent.
    fn add_host(&mut self, n: u8, mtu: u32) {
        let ns = Netns::new("cnibb-cl-node");
        attach(&self.underlay, "ulbr", &ns, &format!("node{n}"));
        let port = format!("node{n}");
        self.underlay
            .exec_ok(&["ip", "link", "set", &port, "mtu", &mtu.to_string()]);
        ns.exec_ok(&["ip", "link", "set", "ul0", "mtu", &mtu.to_string()]);
        address(&ns, &node_v4(n), "24");
        address(&ns, &node_v6(n), "64");
        // A node's default route: through the "internet" host.
        ns.exec_ok(&["ip", "route", "add", "default", "via", INTERNET_V4]);
        ns.exec_ok(&["ip", "-6", "route", "add", "default", "via", INTERNET_V6]);
        ns.exec_ok(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        ns.exec_ok(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
        let base = self.dir.path().join(format!("node-{n}"));
        let mut host = Host {
            n,
            ns,
            conf_dir: base.join("net.d"),
            data_dir: base.join("ipam"),
            cache_dir: base.join("cache"),
            log: base.join("cni-node.log"),
            agent: None,
            pods: Vec::new(),
        };
        fs::create_dir_all(&base).unwrap_or_else(|e| panic!("mkdir {}: {e}", base.display()));
        self.api.apply_node(node_object(n));
        host.start_agent(&self.kubeconfig);
        self.hosts.push(host);
    }

    fn host(&mut self, n: u8) -> &mut Host {
        self.hosts
            .iter_mut()
            .find(|h| h.n == n)
            .unwrap_or_else(|| panic!("no node {n}"))
    }

    /// Waits until every node has a conflist for its own pod CIDRs.
    fn wait_for_conflists(&self) {
        for host in &self.hosts {
            wait(
                Duration::from_secs(20),
                &format!("node {}'s conflist", host.n),
                || host.conflist().is_some(),
            )
            .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", host.agent_log()));
        }
    }

    /// Waits (at most `within`) until every node `m` has exactly the routes to every
    /// other node in `want(m)`; returns how long that took.
    fn wait_for_routes(&self, within: Duration, want: impl Fn(u8) -> BTreeSet<String>) -> Duration {
        let start = Instant::now();
        for host in &self.hosts {
            let expected = want(host.n);
            let left = within.saturating_sub(start.elapsed());
            if let Err(e) = wait(left, &format!("node {}'s routes", host.n), || {
                host.our_routes() == expected
            }) {
                panic!(
                    "{e}: want {expected:?}, have {:?}\nagent log:\n{}",
                    host.our_routes(),
                    host.agent_log()
                );
            }
        }
        start.elapsed()
    }

    /// Routes node `m` should have when the cluster is `nodes` (number, v4, v6).
    fn full_mesh(nodes: &[(u8, String, String)]) -> impl Fn(u8) -> BTreeSet<String> + '_ {
        move |m| {
            nodes
                .iter()
                .filter(|(o, _, _)| *o != m)
                .flat_map(|(o, v4, v6)| routes_to(*o, v4, v6))
                .collect()
        }
    }

    fn mesh_of(&self) -> Vec<(u8, String, String)> {
        self.hosts
            .iter()
            .map(|h| (h.n, node_v4(h.n), node_v6(h.n)))
            .collect()
    }

    /// Every pod reaches every other pod with its own source address, both families.
    fn check_pod_to_pod(&self) {
        let pods: Vec<(u8, &Pod)> = self
            .hosts
            .iter()
            .flat_map(|h| h.pods.iter().map(move |p| (h.n, p)))
            .collect();
        let mut problems = Vec::new();
        for (from_n, from) in &pods {
            for (to_n, to) in &pods {
                if from.id == to.id {
                    continue;
                }
                for (dst, want) in [(to.v4, from.v4), (to.v6, from.v6)] {
                    match source_seen(&from.ns, &to.ns, dst) {
                        Ok(seen) if seen == want => {}
                        Ok(seen) => problems.push(format!(
                            "node {from_n} pod {want} -> node {to_n} pod {dst}: receiver saw {seen}"
                        )),
                        Err(e) => problems.push(format!("node {from_n} -> node {to_n}: {e}")),
                    }
                }
            }
        }
        assert!(problems.is_empty(), "pod to pod:\n{}", problems.join("\n"));
    }

    /// Every pod's traffic to the internet arrives from its node's address.
    fn check_egress(&self) {
        let mut problems = Vec::new();
        for host in &self.hosts {
            for pod in &host.pods {
                for (dst, want) in [
                    (INTERNET_V4, node_v4(host.n)),
                    (INTERNET_V6, node_v6(host.n)),
                ] {
                    match source_seen(&pod.ns, &self.internet, parse(dst)) {
                        Ok(seen) if seen == parse(&want) => {}
                        Ok(seen) => problems.push(format!(
                            "node {} pod {} -> {dst}: the outside saw {seen}, expected {want}",
                            host.n, pod.v4
                        )),
                        Err(e) => problems.push(format!("node {} -> {dst}: {e}", host.n)),
                    }
                }
            }
        }
        if !problems.is_empty() {
            let host = &self.hosts[0];
            panic!(
                "egress:\n{}\nnode {} rules:\n{}\nagent log:\n{}",
                problems.join("\n"),
                host.n,
                host.ns.exec_ok(&["nft", "list", "ruleset"]),
                host.agent_log()
            );
        }
    }
}

/// Polls `ok` every 10 ms until it holds or `within` passes.
fn wait(within: Duration, what: &str, mut ok: impl FnMut() -> bool) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if ok() {
            return Ok(());
        }
        if start.elapsed() >= within {
            return Err(format!("{what}: not there after {within:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn agents_build_a_flat_dual_stack_network_and_follow_joins_changes_and_leaves() {
    if !require_root() {
        return;
    }
    let mut cluster = Cluster::new(3, 1500);
    cluster.wait_for_conflists();
    for host in &cluster.hosts {
        let conf = host.conflist().unwrap_or_default();
        let ranges = &conf["plugins"][0]["ipam"]["ranges"];
        assert_eq!(
            ranges,
            &serde_json::json!([[{"subnet": pod_cidr_v4(host.n)}], [{"subnet": pod_cidr_v6(host.n)}]]),
            "node {}: {conf}",
            host.n
        );
        assert_eq!(conf["plugins"][0]["mtu"], 1500, "node {}: {conf}", host.n);
        assert_eq!(conf["plugins"][0]["ipMasq"], false);
    }
    let mesh = cluster.mesh_of();
    cluster.wait_for_routes(Duration::from_secs(10), Cluster::full_mesh(&mesh));
    for n in 1..=3 {
        cluster.host(n).add_pod();
        let pod = &cluster.host(n).pods[0];
        assert!(
            IpAddr::is_ipv4(&pod.v4) && pod.v4.to_string().starts_with(&format!("10.244.{n}.")),
            "{} is not from node {n}'s pod CIDR",
            pod.v4
        );
    }
    cluster.check_pod_to_pod();
    cluster.check_egress();

    // A fourth node joins: everyone routes to it within a second, its pod is reachable.
    cluster.add_host(4, 1500);
    let mesh = cluster.mesh_of();
    let took = cluster.wait_for_routes(Duration::from_secs(1), Cluster::full_mesh(&mesh));
    eprintln!("join: every node had its routes after {took:?}");
    cluster.wait_for_conflists();
    cluster.host(4).add_pod();
    cluster.check_pod_to_pod();

    // Node 3's InternalIP changes: the routes follow.
    let new_v4 = "198.18.0.33";
    address(&cluster.host(3).ns, new_v4, "24");
    let mut moved = node_object(3);
    moved["status"]["addresses"][0]["address"] = Value::from(new_v4);
    assert_eq!(
        moved["status"]["addresses"][0]["type"], "InternalIP",
        "{moved}"
    );
    cluster.api.apply_node(moved);
    let mesh: Vec<(u8, String, String)> = cluster
        .mesh_of()
        .into_iter()
        .map(|(n, v4, v6)| (n, if n == 3 { new_v4.to_owned() } else { v4 }, v6))
        .collect();
    let took = cluster.wait_for_routes(Duration::from_secs(1), Cluster::full_mesh(&mesh));
    eprintln!("address change: routes followed after {took:?}");
    cluster.check_pod_to_pod();

    // Node 4 is deleted: its routes are gone everywhere within a second.
    cluster.api.delete_node(&node_name(4));
    let mesh: Vec<(u8, String, String)> = mesh.into_iter().filter(|(n, _, _)| *n != 4).collect();
    // Node 4's own agent keeps its routes to the others: its own Node is gone, theirs
    // are not.
    let took = cluster.wait_for_routes(Duration::from_secs(1), Cluster::full_mesh(&mesh));
    eprintln!("leave: routes gone after {took:?}");
}

/// Samples every node's routes every 10 ms on a thread; `stop` returns the samples
/// that lacked a route of `must_keep`.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<(usize, Vec<String>)>>,
}

impl Sampler {
    fn start(nodes: Vec<(u8, String, BTreeSet<String>)>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let mut missing = Vec::new();
            let mut samples = 0;
            while !flag.load(Ordering::Relaxed) {
                let tick = Instant::now();
                for (n, ns_name, must_keep) in &nodes {
                    let mut have = BTreeSet::new();
                    for family in ["-4", "-6"] {
                        let out = Command::new("ip")
                            .args(["-n", ns_name, family, "route", "show", "proto", PROTO])
                            .output();
                        let Ok(out) = out else { continue };
                        for line in String::from_utf8_lossy(&out.stdout).lines() {
                            let words: Vec<&str> = line.split_whitespace().collect();
                            if let [dst, "via", gw, ..] = words[..] {
                                have.insert(format!("{dst} via {gw}"));
                            }
                        }
                    }
                    for route in must_keep.difference(&have) {
                        missing.push(format!("sample {samples}: node {n} lacked {route}"));
                    }
                }
                samples += 1;
                if let Some(left) = Duration::from_millis(10).checked_sub(tick.elapsed()) {
                    std::thread::sleep(left);
                }
            }
            (samples, missing)
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .map(|h| h.join().unwrap_or_else(|_| panic!("sampler panicked")))
            .unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[test]
fn api_outages_and_agent_kills_never_take_a_route_away() {
    if !require_root() {
        return;
    }
    let mut cluster = Cluster::new(3, 1500);
    cluster.wait_for_conflists();
    let mesh = cluster.mesh_of();
    cluster.wait_for_routes(Duration::from_secs(10), Cluster::full_mesh(&mesh));
    let sampler = Sampler::start(
        cluster
            .hosts
            .iter()
            .map(|h| (h.n, h.ns.name().to_owned(), Cluster::full_mesh(&mesh)(h.n)))
            .collect(),
    );

    // The API server is down for 10 s; a node joins meanwhile (only the API knows).
    cluster.api.stop();
    std::thread::sleep(Duration::from_secs(10));
    cluster.api.apply_node(node_object(5));
    cluster.api.restart();
    let with_5: Vec<(u8, String, String)> = mesh
        .iter()
        .cloned()
        .chain([(5, node_v4(5), node_v6(5))])
        .collect();
    cluster.wait_for_routes(Duration::from_secs(40), |m| Cluster::full_mesh(&with_5)(m));

    // Down again; node 5 leaves and node 6 joins; the history is compacted, so the
    // watches' resourceVersions are too old (410 Gone) and the agents relist.
    let gone_before = cluster.api.expired_count();
    cluster.api.stop();
    cluster.api.delete_node(&node_name(5));
    cluster.api.apply_node(node_object(6));
    cluster.api.compact();
    cluster.api.restart();
    let with_6: Vec<(u8, String, String)> = mesh
        .iter()
        .cloned()
        .chain([(6, node_v4(6), node_v6(6))])
        .collect();
    cluster.wait_for_routes(Duration::from_secs(40), |m| Cluster::full_mesh(&with_6)(m));
    assert!(
        cluster.api.expired_count() > gone_before,
        "no watch was answered with 410 Gone after the compaction"
    );

    // Node 1's agent is SIGKILLed; node 6 is deleted while it is dead; when it comes
    // back, its stale route to node 6 goes and nothing else moves.
    cluster.host(1).kill_agent();
    cluster.api.delete_node(&node_name(6));
    cluster.wait_for_routes(Duration::from_secs(5), |m| {
        if m == 1 {
            Cluster::full_mesh(&with_6)(1)
        } else {
            Cluster::full_mesh(&mesh)(m)
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let kubeconfig = cluster.kubeconfig.clone();
    cluster.host(1).start_agent(&kubeconfig);
    cluster.wait_for_routes(Duration::from_secs(20), Cluster::full_mesh(&mesh));
    let (samples, missing) = sampler.finish();
    assert!(samples > 100, "only {samples} samples were taken");
    assert!(
        missing.is_empty(),
        "routes disappeared ({} of {samples} samples):\n{}",
        missing.len(),
        missing
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("{samples} samples, no route of the three nodes ever missing");
}

#[test]
fn foreign_routes_and_garbage_nodes_are_left_alone() {
    if !require_root() {
        return;
    }
    let mut cluster = Cluster::new(2, 1500);
    let mesh = cluster.mesh_of();
    cluster.wait_for_routes(Duration::from_secs(10), Cluster::full_mesh(&mesh));
    // Someone routes node 7's pod CIDR on node 1 by hand before node 7 appears.
    let foreign = "10.244.7.0/24 via 198.18.0.12 dev ul0 proto static";
    cluster.host(1).ns.exec_ok(&[
        "ip",
        "route",
        "add",
        "10.244.7.0/24",
        "via",
        "198.18.0.12",
        "proto",
        "static",
    ]);
    // A node with garbage in podCIDRs, and one whose address is not on this link.
    let mut bad = node_object(8);
    bad["spec"]["podCIDRs"] = serde_json::json!(["banana", "fd00:244:0:8::/64"]);
    bad["spec"]["podCIDR"] = Value::from("banana");
    cluster.api.apply_node(bad);
    let mut far = node_object(9);
    far["status"]["addresses"][0]["address"] = Value::from("203.0.113.9");
    far["status"]["addresses"][1]["address"] = Value::from("2001:db8::9");
    cluster.api.apply_node(far);
    cluster.api.apply_node(node_object(7));
    // Node 2 routes to 7 (v4 and v6); node 1 only v6 (its v4 is someone else's).
    let with_7: Vec<(u8, String, String)> = mesh
        .iter()
        .cloned()
        .chain([(7, node_v4(7), node_v6(7))])
        .collect();
    cluster.wait_for_routes(Duration::from_secs(5), |m| {
        let mut want = Cluster::full_mesh(&with_7)(m);
        if m == 1 {
            want.remove(&format!("{} via {}", pod_cidr_v4(7), node_v4(7)));
        }
        want
    });
    let v4 = cluster
        .host(1)
        .ns
        .exec_ok(&["ip", "-4", "route", "show", "10.244.7.0/24"]);
    assert_eq!(v4.trim(), foreign, "the foreign route was changed");
    let log = cluster.host(1).agent_log();
    for want in [
        "10.244.7.0/24 is already routed by someone else",
        "node node-8 skipped: spec.podCIDRs entry \"banana\"",
        "node node-9 skipped: InternalIP 203.0.113.9 is reached through the gateway 198.18.0.1",
    ] {
        assert!(log.contains(want), "no {want:?} in the agent's log:\n{log}");
    }
    // The agents keep working: one more node arrives everywhere.
    cluster.api.apply_node(node_object(6));
    cluster.wait_for_routes(Duration::from_secs(5), |m| {
        let mut want = Cluster::full_mesh(&with_7)(m);
        want.extend(routes_to(6, &node_v4(6), &node_v6(6)));
        if m == 1 {
            want.remove(&format!("{} via {}", pod_cidr_v4(7), node_v4(7)));
        }
        want
    });
    // Removing the foreign route hands the destination to the agent.
    cluster
        .host(1)
        .ns
        .exec_ok(&["ip", "route", "del", "10.244.7.0/24"]);
    cluster.wait_for_routes(Duration::from_secs(5), |m| {
        let mut want = Cluster::full_mesh(&with_7)(m);
        want.extend(routes_to(6, &node_v4(6), &node_v6(6)));
        want
    });
}

#[test]
fn the_pod_mtu_follows_the_underlay_and_full_size_packets_cross_nodes() {
    if !require_root() {
        return;
    }
    let mut cluster = Cluster::new(2, 1400);
    cluster.wait_for_conflists();
    for host in &cluster.hosts {
        let conf = host.conflist().unwrap_or_default();
        assert_eq!(conf["plugins"][0]["mtu"], 1400, "node {}: {conf}", host.n);
        assert!(
            host.agent_log()
                .contains("pod MTU 1400: the MTU of ul0, which holds the InternalIP"),
            "{}",
            host.agent_log()
        );
    }
    let mesh = cluster.mesh_of();
    cluster.wait_for_routes(Duration::from_secs(10), Cluster::full_mesh(&mesh));
    cluster.host(1).add_pod();
    cluster.host(2).add_pod();
    let pod1 = &cluster.hosts[0].pods[0];
    let pod2 = &cluster.hosts[1].pods[0];
    let mtu = pod1.ns.exec_ok(&["cat", "/sys/class/net/eth0/mtu"]);
    assert_eq!(mtu.trim(), "1400");
    // 1372 bytes of payload + 8 ICMP + 20 IP = 1400: the largest that fits, with DF.
    let target = pod2.v4.to_string();
    let out = pod1.ns.exec(&[
        "ping", "-c", "3", "-W", "2", "-M", "do", "-s", "1372", &target,
    ]);
    assert!(
        out.status.success(),
        "1372-byte ping with DF across nodes failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // One byte more does not fit the pod's own link.
    let out = pod1.ns.exec(&[
        "ping", "-c", "1", "-W", "1", "-M", "do", "-s", "1373", &target,
    ]);
    assert!(
        !out.status.success(),
        "a 1401-byte packet left a 1400-MTU pod"
    );
}
