//! A cluster made of network namespaces, for the node agent's (`cni-node`) tests.
//!
//! Each "node" is a namespace on one underlay bridge (itself in a namespace), with an
//! IPv4 and an IPv6 address on its `ul0`, running the built `cni-node` against the
//! project's Kubernetes API test server (`tests/kube-api`), which listens on the
//! underlay like an API server would. The agents write their conflists, route each
//! other's pod CIDRs and masquerade egress; pods are attached through our `cnitool`
//! with the conflist the agent wrote. An "internet" namespace on the underlay stands for
//! everything outside the cluster. Traffic is UDP between sockets opened in the
//! namespaces, and the receiver reports the source address it saw.
//!
//! Every agent runs at the product's default resync interval unless a test sets
//! [`Host::resync_secs`] (to [`WITHOUT_RESYNC`] when what it shows must be the work of
//! an event path alone), so no test passes thanks to a resync faster than a real node's.
//!
//! Every agent serves its health endpoint on its own namespace's loopback
//! ([`HEALTH_ADDR`], the agent's default), which [`Host::health`] asks, and `explain`
//! on a socket in its node's directory ([`Host::explain_socket`]).
//!
//! Everything is removed on drop (agents killed, pods deleted, namespaces and files
//! gone), also when a test panics.

use std::collections::BTreeSet;
use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cni_kube_api::{ApiServer, realistic_node};
use serde_json::Value;

use crate::probe::{self, Answer};
use crate::underlay::{address, attach, source_seen};
use crate::{Netns, TempDir, bin_dir, plugin_path, unique_name};

/// The agent's route protocol number (its default).
pub const PROTO: &str = "77";
/// The network name in the agent's conflist (its default).
pub const NETWORK: &str = "k8s-pod-network";
/// The conflist's file name (the agent's default).
pub const CONFLIST: &str = "10-cni-plugins-rs.conflist";
/// The "internet" host's IPv4 address, the nodes' IPv4 default gateway.
pub const INTERNET_V4: &str = "198.18.0.1";
/// The "internet" host's IPv6 address, the nodes' IPv6 default gateway.
pub const INTERNET_V6: &str = "fd00:18::1";
/// Where the API server listens, on the underlay bridge.
pub const API_V4: &str = "198.18.0.250";
/// The underlay bridge's MAC (locally administered), set so that it never follows its ports'.
const UNDERLAY_BRIDGE_MAC: &str = "02:c0:00:00:02:50";
/// Where every agent serves `/healthz`, `/readyz` and `/metrics` (its default), in its
/// node's namespace.
pub const HEALTH_ADDR: &str = "127.0.0.1:9743";

/// The `--resync-interval` of a test that must prove an event path acted alone: an
/// hour, so no resync runs while it lasts.
pub const WITHOUT_RESYNC: Option<u32> = Some(3600);

/// How many times a test that measures one of the agent's documented reactions repeats
/// it: `CNI_RS_CONTRACT_SAMPLES` (`tests/bench/contracts.sh` sets it, to judge the
/// figures against the docs), else `default`.
pub fn contract_samples(default: usize) -> usize {
    std::env::var("CNI_RS_CONTRACT_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(default)
}

/// Node `n`'s IPv4 address (InternalIP) on the underlay.
pub fn node_v4(n: u8) -> String {
    format!("198.18.0.{}", 10 + n)
}
/// Node `n`'s IPv6 address (InternalIP) on the underlay.
pub fn node_v6(n: u8) -> String {
    format!("fd00:18::{:x}", 0x10 + n)
}
/// Node `n`'s IPv4 pod CIDR.
pub fn pod_cidr_v4(n: u8) -> String {
    format!("10.244.{n}.0/24")
}
/// Node `n`'s IPv6 pod CIDR.
pub fn pod_cidr_v6(n: u8) -> String {
    format!("fd00:244:0:{n}::/64")
}
/// Node `n`'s name.
pub fn node_name(n: u8) -> String {
    format!("node-{n}")
}

/// The Node object of node `n`, as a kubelet and the controller would have written it.
pub fn node_object(n: u8) -> Value {
    realistic_node(
        &node_name(n),
        &[&pod_cidr_v4(n), &pod_cidr_v6(n)],
        &[&node_v4(n), &node_v6(n)],
        40,
    )
}

/// `text` as an IP address; panics (a mistake in the test) if it is none.
pub fn parse(text: &str) -> IpAddr {
    text.parse()
        .unwrap_or_else(|e| panic!("{text:?} is not an IP: {e}"))
}

/// A running `cni-node`; killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct Agent {
    child: Child,
}

impl Agent {
    /// The agent's process id (`ip netns exec` execs it, so it is the agent itself).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pod attached with cnitool.
#[derive(Debug)]
pub struct Pod {
    /// Its network namespace.
    pub ns: Netns,
    /// Its container id.
    pub id: String,
    /// Its IPv4 address.
    pub v4: IpAddr,
    /// Its IPv6 address.
    pub v6: IpAddr,
    /// The `CNI_ARGS` it was added with (and is deleted with); empty for none.
    pub cni_args: String,
}

/// One node: its namespace, directories, agent and pods.
#[derive(Debug)]
pub struct Host {
    /// The node's number (its name is [`node_name`]).
    pub n: u8,
    /// The node's namespace.
    pub ns: Netns,
    /// `--cni-conf-dir`; a test may point it elsewhere before [`Host::start_agent`].
    pub conf_dir: PathBuf,
    /// `--ipam-data-dir`.
    pub data_dir: PathBuf,
    /// `--pod-record-dir`: the node's own, as on a real node (the default is a path of
    /// the machine, which every test's nodes would share).
    pub record_dir: PathBuf,
    /// `--explain-socket`: the node's own (the default is a path of the machine, which
    /// every test's nodes would share).
    pub explain_socket: PathBuf,
    /// cnitool's cache.
    pub cache_dir: PathBuf,
    /// The agent's stderr, appended to across restarts.
    pub log: PathBuf,
    /// `--resync-interval` in seconds; `None` (the default) passes no flag, so the agent
    /// runs at the product's own resync interval (10 s), as on a real node, and a test
    /// passes only if the agent's event paths (API watches, host notifications, pod
    /// records, retries) did the work. A test about the resync, or one that must prove
    /// that an event path acted alone, sets it and says so.
    pub resync_secs: Option<u32>,
    /// More arguments for the agent, after the harness's own.
    pub extra_args: Vec<String>,
    agent: Option<Agent>,
    /// The pods attached on this node, deleted with cnitool on drop.
    pub pods: Vec<Pod>,
}

impl Host {
    /// `ip route show proto 77` of both families: "dst via gw" lines, sorted.
    pub fn our_routes(&self) -> BTreeSet<String> {
        routes_of(&self.ns)
    }

    /// The agent's log so far.
    pub fn agent_log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The conflist the agent wrote, if it is there and is JSON.
    pub fn conflist(&self) -> Option<Value> {
        let text = fs::read_to_string(self.conf_dir.join(CONFLIST)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// The running agent, if any.
    pub fn agent(&self) -> Option<&Agent> {
        self.agent.as_ref()
    }

    /// Starts (or restarts) the agent, appending to its log.
    pub fn start_agent(&mut self, kubeconfig: &Path) {
        self.agent = None;
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
            .arg(format!("--pod-record-dir={}", self.record_dir.display()))
            .arg(format!(
                "--explain-socket={}",
                self.explain_socket.display()
            ))
            .args(
                self.resync_secs
                    .map(|secs| format!("--resync-interval={secs}")),
            )
            .arg("--verbose")
            .args(&self.extra_args)
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start cni-node: {e}"));
        self.agent = Some(Agent { child });
    }

    /// SIGKILL, no chance to clean up anything.
    pub fn kill_agent(&mut self) {
        self.agent = None;
    }

    /// `GET path` from the agent's health endpoint ([`HEALTH_ADDR`] in this node's
    /// namespace), bounded by 2 s.
    pub fn health(&self, path: &str) -> Result<Answer, String> {
        let addr: SocketAddr = HEALTH_ADDR.parse().unwrap_or_else(|e| panic!("{e}"));
        probe::get(self.ns.path(), addr, path, Duration::from_secs(2))
    }

    /// The passes the agent has made (`cni_node_reconciles_total`, both results), if
    /// its `/metrics` answers.
    pub fn passes(&self) -> Option<f64> {
        let answer = self.health("/metrics").ok()?;
        (answer.status == 200).then_some(())?;
        answer
            .body
            .lines()
            .filter(|l| l.starts_with("cni_node_reconciles_total{"))
            .map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until the agent has made no pass for `window` (at most 30 s; panics after
    /// that): what a node's setup stirred up (addresses leaving IPv6 duplicate address
    /// detection, the first lists) has been handled, so a change a test makes next is
    /// the only thing that can wake the agent, and a test of one wake-up path cannot pass
    /// because another path happened to wake it.
    pub fn wait_until_quiet(&self, window: Duration) {
        let start = Instant::now();
        let mut last = self.passes();
        let mut since = Instant::now();
        while since.elapsed() < window {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "node {}: the agent never stopped making passes for {window:?} (last count \
                 {last:?})\nagent log:\n{}",
                self.n,
                self.agent_log()
            );
            std::thread::sleep(Duration::from_millis(50));
            let now = self.passes();
            if now != last || now.is_none() {
                last = now;
                since = Instant::now();
            }
        }
    }

    /// Attaches a pod through cnitool with the conflist the agent wrote.
    pub fn add_pod(&mut self) {
        self.attach(unique_name("cl-pod"), "");
    }

    /// Attaches Kubernetes pod `namespace/name` (of `uid`) as containerd does: cnitool
    /// with `CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=…;K8S_POD_NAME=…;
    /// K8S_POD_INFRA_CONTAINER_ID=<the container id>;K8S_POD_UID=…` (so the bridge
    /// records the pod's addresses for the agent), the same arguments at DEL. Returns
    /// the pod.
    pub fn add_k8s_pod(&mut self, namespace: &str, name: &str, uid: &str) -> &Pod {
        let id = unique_name("cl-pod");
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};\
             K8S_POD_INFRA_CONTAINER_ID={id};K8S_POD_UID={uid}"
        );
        self.attach(id, &args)
    }

    fn attach(&mut self, id: String, cni_args: &str) -> &Pod {
        let ns = Netns::new("cnibb-cl-pod");
        let out = self.cnitool_with_args(&["add", NETWORK, ns.path_str()], &id, cni_args);
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
        self.pods.push(Pod {
            ns,
            id,
            v4,
            v6,
            cni_args: cni_args.to_owned(),
        });
        self.pods
            .last()
            .unwrap_or_else(|| unreachable!("just pushed"))
    }

    /// Runs cnitool in this node's namespace with its conflist; panics unless it succeeds.
    pub fn cnitool(&self, args: &[&str], id: &str) -> String {
        self.cnitool_with_args(args, id, "")
    }

    /// [`Self::cnitool`] with `CNI_ARGS` (none when empty).
    pub fn cnitool_with_args(&self, args: &[&str], id: &str, cni_args: &str) -> String {
        let out = self.cnitool_command(args, id, cni_args).output();
        let out = out.unwrap_or_else(|e| panic!("run cnitool: {e}"));
        assert!(
            out.status.success(),
            "node {}: cnitool {args:?} failed: {}{}",
            self.n,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn cnitool_command(&self, args: &[&str], id: &str, cni_args: &str) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", self.ns.name(), "timeout", "60"])
            .arg(plugin_path("cnitool"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("NETCONFPATH", &self.conf_dir)
            .env("CNI_PATH", bin_dir())
            .env("CNI_CACHE_DIR", &self.cache_dir)
            .env("CNI_CONTAINERID", id);
        if !cni_args.is_empty() {
            command.env("CNI_ARGS", cni_args);
        }
        command
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.agent = None;
        for pod in std::mem::take(&mut self.pods) {
            let out = self
                .cnitool_command(&["del", NETWORK, pod.ns.path_str()], &pod.id, &pod.cni_args)
                .output();
            if let Ok(out) = out
                && !out.status.success()
            {
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

/// The agent's routes in `ns` (`ip route show proto 77`, both families) as "dst via gw".
pub fn routes_of(ns: &Netns) -> BTreeSet<String> {
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

/// The routes every node but `other` should have to node `other`, reached at `v4`/`v6`.
pub fn routes_to(other: u8, v4: &str, v6: &str) -> [String; 2] {
    [
        format!("{} via {v4}", pod_cidr_v4(other)),
        format!("{} via {v6}", pod_cidr_v6(other)),
    ]
}

/// Where a node made by [`Cluster::new_host_on`] sits: a bridge in the underlay
/// namespace, its addresses (/24 and /64) and its default gateways.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The bridge its `ul0` is a port of.
    pub bridge: &'static str,
    /// Its IPv4 address.
    pub v4: String,
    /// Its IPv6 address.
    pub v6: String,
    /// Its IPv4 default gateway.
    pub gateway_v4: String,
    /// Its IPv6 default gateway.
    pub gateway_v6: String,
}

/// The cluster: API server, underlay, "internet", and nodes with agents.
#[derive(Debug)]
pub struct Cluster {
    // Field order is drop order: nodes (agents, pods) first, then the namespaces they
    // live on, then the server and the files.
    /// The nodes.
    pub hosts: Vec<Host>,
    /// The host outside the cluster, and the nodes' default gateway.
    pub internet: Netns,
    /// The namespace of the underlay bridge `ulbr` and of the API server.
    pub underlay: Netns,
    /// The Kubernetes API test server.
    pub api: ApiServer,
    /// A kubeconfig for [`Self::api`].
    pub kubeconfig: PathBuf,
    /// Where the nodes' directories and logs are.
    pub dir: TempDir,
}

impl Cluster {
    /// `nodes` node namespaces with Node objects and running agents; `mtu` is the
    /// underlay's.
    pub fn new(nodes: u8, mtu: u32) -> Self {
        Self::new_with(nodes, mtu, |_| {})
    }

    /// [`Self::new`], with `configure` called on each node before its agent starts.
    pub fn new_with(nodes: u8, mtu: u32, configure: impl Fn(&mut Host)) -> Self {
        let mut cluster = Self::without_nodes(mtu);
        for n in 1..=nodes {
            cluster.add_host_with(n, mtu, &configure);
        }
        cluster
    }

    /// The API server, underlay and "internet", no node yet.
    pub fn without_nodes(mtu: u32) -> Self {
        let dir = TempDir::new("cnibb-cl");
        let underlay = Netns::new("cnibb-cl-underlay");
        // A MAC of its own: a bridge without one takes its lowest port's, so a node
        // joining later with a lower one would change the API server's MAC under the
        // nodes' ARP caches, and their packets to the API would be dropped until those
        // entries expire (half a minute).
        underlay.exec_ok(&[
            "ip",
            "link",
            "add",
            "ulbr",
            "address",
            UNDERLAY_BRIDGE_MAC,
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
        Self {
            hosts: Vec::new(),
            internet,
            underlay,
            api,
            kubeconfig,
            dir,
        }
    }

    /// A node namespace on the underlay, its Node object, and its agent.
    pub fn add_host(&mut self, n: u8, mtu: u32) {
        self.add_host_with(n, mtu, |_| {});
    }

    /// [`Self::add_host`], with `configure` called before the agent starts.
    pub fn add_host_with(&mut self, n: u8, mtu: u32, configure: impl Fn(&mut Host)) {
        let mut host = self.new_host(n, mtu);
        configure(&mut host);
        self.api.apply_node(node_object(n));
        host.start_agent(&self.kubeconfig);
        self.hosts.push(host);
    }

    /// A node namespace on the underlay with its directories, but no Node object and no
    /// agent: the test adds them (and [`Self::hosts`] the host) itself.
    pub fn new_host(&self, n: u8, mtu: u32) -> Host {
        self.new_host_on(
            n,
            mtu,
            &Segment {
                bridge: "ulbr",
                v4: node_v4(n),
                v6: node_v6(n),
                gateway_v4: INTERNET_V4.to_owned(),
                gateway_v6: INTERNET_V6.to_owned(),
            },
        )
    }

    /// [`Self::new_host`] on another bridge of the underlay namespace, with other
    /// addresses and default gateways.
    pub fn new_host_on(&self, n: u8, mtu: u32, segment: &Segment) -> Host {
        let ns = Netns::new("cnibb-cl-node");
        attach(&self.underlay, segment.bridge, &ns, &format!("node{n}"));
        let port = format!("node{n}");
        self.underlay
            .exec_ok(&["ip", "link", "set", &port, "mtu", &mtu.to_string()]);
        ns.exec_ok(&["ip", "link", "set", "ul0", "mtu", &mtu.to_string()]);
        address(&ns, &segment.v4, "24");
        address(&ns, &segment.v6, "64");
        // A node's default route: through the "internet" host (or the segment's router).
        ns.exec_ok(&["ip", "route", "add", "default", "via", &segment.gateway_v4]);
        ns.exec_ok(&[
            "ip",
            "-6",
            "route",
            "add",
            "default",
            "via",
            &segment.gateway_v6,
        ]);
        ns.exec_ok(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        ns.exec_ok(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
        let base = self.dir.path().join(format!("node-{n}"));
        fs::create_dir_all(&base).unwrap_or_else(|e| panic!("mkdir {}: {e}", base.display()));
        Host {
            n,
            ns,
            conf_dir: base.join("net.d"),
            data_dir: base.join("ipam"),
            record_dir: base.join("pods"),
            explain_socket: base.join("explain.sock"),
            cache_dir: base.join("cache"),
            log: base.join("cni-node.log"),
            resync_secs: None,
            extra_args: Vec::new(),
            agent: None,
            pods: Vec::new(),
        }
    }

    /// Node `n`, to look at; panics if there is none.
    pub fn node(&self, n: u8) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.n == n)
            .unwrap_or_else(|| panic!("no node {n}"))
    }

    /// Node `n`; panics if there is none.
    pub fn host(&mut self, n: u8) -> &mut Host {
        self.hosts
            .iter_mut()
            .find(|h| h.n == n)
            .unwrap_or_else(|| panic!("no node {n}"))
    }

    /// Waits until every node has a conflist for its own pod CIDRs.
    pub fn wait_for_conflists(&self) {
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
    pub fn wait_for_routes(
        &self,
        within: Duration,
        want: impl Fn(u8) -> BTreeSet<String>,
    ) -> Duration {
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
    pub fn full_mesh(nodes: &[(u8, String, String)]) -> impl Fn(u8) -> BTreeSet<String> + '_ {
        move |m| {
            nodes
                .iter()
                .filter(|(o, _, _)| *o != m)
                .flat_map(|(o, v4, v6)| routes_to(*o, v4, v6))
                .collect()
        }
    }

    /// The nodes as (number, v4, v6), for [`Self::full_mesh`].
    pub fn mesh_of(&self) -> Vec<(u8, String, String)> {
        self.hosts
            .iter()
            .map(|h| (h.n, node_v4(h.n), node_v6(h.n)))
            .collect()
    }

    /// Every pod reaches every other pod with its own source address, both families.
    pub fn check_pod_to_pod(&self) {
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
    pub fn check_egress(&self) {
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
pub fn wait(within: Duration, what: &str, mut ok: impl FnMut() -> bool) -> Result<(), String> {
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
