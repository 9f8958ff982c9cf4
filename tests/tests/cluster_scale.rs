//! The node agent at scale: the API test server holds N realistic Nodes (about 15 KB
//! each, 40 images) on one node's link, and one `cni-node` syncs them.
//!
//! Measured, and printed as one `cluster-scale key=value...` line: the initial sync
//! from the agent's start to every route in the kernel, the peak RSS, for 200 node
//! additions one at a time the time from the change being served to its route being in
//! the kernel (seen by `ip monitor route`), and the latency of `/healthz` probed every
//! 20 ms (a new connection each time, as kubelet does) from the agent's start until the
//! initial sync is complete. The benchmark, `tests/bench/cluster.sh`, runs this with
//! the static release agent at 5,000 nodes (300 in its smoke run) and judges those
//! figures against the `[cluster.*]` targets of `tests/bench/targets.toml`. The test
//! asserts correctness only: every route is there, every addition arrives, and every
//! probe once the endpoint listens is answered, within a generous 1 s. The default
//! here is 300 nodes (`CNI_RS_SCALE_NODES`), so the test suite runs it quickly.
//!
//! `the_agent_syncs_thousands_of_encapsulated_nodes` does the same with the other
//! nodes' InternalIPs behind a gateway, so every one of them is reached through the
//! VXLAN overlay: the initial sync then also programs an FDB and a neighbour entry per
//! node, and an addition is timed to its route through the VXLAN device (the last of
//! its three changes).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cni_blackbox::measured::peak_rss_kib;
use cni_blackbox::probe::{Probe, Prober};
use cni_blackbox::underlay::lone_node;
use cni_blackbox::{Netns, TempDir, plugin_path, require_root};
use cni_kube_api::{ApiServer, realistic_node};

fn pod_cidr(i: u32) -> String {
    format!("10.{}.{}.0/24", i / 256, i % 256)
}

/// Node `i`'s InternalIP: on this node's link (100.64.0.0/16), or with the overlay
/// behind the gateway 100.64.0.254 (100.65.0.0/16).
fn node_ip(i: u32, overlay: bool) -> String {
    let second = if overlay { 65 } else { 64 };
    format!("100.{second}.{}.{}", i / 250, i % 250 + 2)
}

fn node(i: u32, overlay: bool) -> serde_json::Value {
    realistic_node(
        &format!("scale-{i}"),
        &[&pod_cidr(i)],
        &[&node_ip(i, overlay)],
        40,
    )
}

fn route_count(ns: &Netns) -> usize {
    ns.exec_ok(&["ip", "-4", "route", "show", "proto", "77"])
        .lines()
        .count()
}

/// Where the agent serves its health endpoint, in the test's namespace.
const HEALTH_ADDR: &str = "127.0.0.1:9743";

/// A probe that waited this long for its answer counts as unanswered.
const PROBE_BOUND: Duration = Duration::from_secs(1);

/// The probes' latencies once the endpoint was listening (probes before its first
/// answer are refused: the process is still starting), and the problems: probes after
/// that without an answer, or answered later than [`PROBE_BOUND`], or not with 200.
fn probe_report(probes: &[Probe]) -> (Vec<Duration>, Vec<String>) {
    let first = probes.iter().position(|p| p.outcome.is_ok());
    let mut latencies = Vec::new();
    let mut problems = Vec::new();
    for p in &probes[first.unwrap_or(probes.len())..] {
        match &p.outcome {
            Ok(answer) if answer.status == 200 && answer.took <= PROBE_BOUND => {
                latencies.push(answer.took);
            }
            Ok(answer) => {
                latencies.push(answer.took);
                problems.push(format!("probe at {:?}: {answer}", p.at));
            }
            Err(e) => problems.push(format!("probe at {:?}: {e}", p.at)),
        }
    }
    if first.is_none() {
        problems.push(format!("none of {} probes was answered", probes.len()));
    }
    latencies.sort();
    (latencies, problems)
}

#[test]
fn the_agent_syncs_thousands_of_nodes() {
    sync(false);
}

#[test]
fn the_agent_syncs_thousands_of_encapsulated_nodes() {
    sync(true);
}

/// The measurement, with the other nodes on this node's link or (`overlay`) behind a
/// gateway.
fn sync(overlay: bool) {
    if !require_root() {
        return;
    }
    let nodes: u32 = std::env::var("CNI_RS_SCALE_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300)
        .clamp(2, 60_000);
    let agent =
        std::env::var_os("CNI_NODE_BIN").map_or_else(|| plugin_path("cni-node"), Into::into);
    let dir = TempDir::new("cnibb-scale");
    let ns = lone_node("cnibb-scale");
    if overlay {
        ns.exec_ok(&["ip", "route", "add", "100.65.0.0/16", "via", "100.64.0.254"]);
    }
    let api = ApiServer::start_in_netns(
        ns.path(),
        "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
    );
    let me = realistic_node("scale-0", &["10.255.0.0/24"], &["100.64.0.1"], 40);
    api.apply_node(me);
    for i in 1..nodes {
        api.apply_node(node(i, overlay));
    }
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let log = dir.path().join("agent.log");
    let health: std::net::SocketAddr = HEALTH_ADDR.parse().unwrap_or_else(|e| panic!("{e}"));
    // A probe's own bound is above PROBE_BOUND, so a slow answer is measured, not lost.
    let prober = Prober::start(
        ns.path(),
        health,
        "/healthz",
        Duration::from_millis(20),
        PROBE_BOUND * 5,
    );
    let start = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(&agent)
        .args(["--node-name=scale-0", "--masquerade-backend=nftables"])
        .arg(format!("--health-addr={HEALTH_ADDR}"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--cni-conf-dir={}",
            dir.path().join("net.d").display()
        ))
        .arg(format!("--cni-bin-dir={}", dir.path().display()))
        // Its own, not the machine's /run/cni-plugins-rs/pods.
        .arg(format!(
            "--pod-record-dir={}",
            dir.path().join("pods").display()
        ))
        .arg(format!(
            "--explain-socket={}",
            dir.path().join("explain.sock").display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}")))
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", agent.display()));
    let want = usize::try_from(nodes - 1).unwrap_or(usize::MAX);
    let deadline = Instant::now() + Duration::from_secs(120);
    while route_count(&ns) < want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} routes after 120 s; agent log:\n{}",
            route_count(&ns),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let initial_sync = start.elapsed();
    let rss_after_sync = peak_rss_kib(child.id());
    if overlay {
        let entries = ns
            .exec_ok(&["bridge", "fdb", "show", "dev", "cni-vx4"])
            .lines()
            .count();
        let neighbours = ns
            .exec_ok(&["ip", "neigh", "show", "dev", "cni-vx4", "nud", "permanent"])
            .lines()
            .count();
        assert_eq!(
            (entries, neighbours),
            (want, want),
            "every encapsulated node has its FDB and neighbour entry once its route is in"
        );
    }
    // The start is over; should the sync have beaten the first answer, probe on until
    // the endpoint answers once (bounded), so the report has something to say.
    let answered_by = Instant::now() + Duration::from_secs(5);
    while prober.answered() == 0 && Instant::now() < answered_by {
        std::thread::sleep(Duration::from_millis(5));
    }
    let probes = prober.finish();
    let (health_latencies, health_problems) = probe_report(&probes);
    assert!(
        health_problems.is_empty(),
        "/healthz during the start and the initial sync of {nodes} nodes ({} probes):\n{}\nagent log:\n{}",
        probes.len(),
        health_problems.join("\n"),
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // Additions one at a time, timed from the change being served to the route.
    // stdbuf: `ip monitor` writes through stdio, block-buffered into a pipe.
    let mut monitor = Command::new("stdbuf")
        .args(["-oL", "ip", "-n", ns.name(), "-4", "monitor", "route"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("ip monitor: {e}"));
    let stdout = monitor
        .stdout
        .take()
        .unwrap_or_else(|| panic!("no monitor stdout"));
    let (tx, rx) = mpsc::channel::<(String, Instant)>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("proto 77") && !line.starts_with("Deleted") {
                let dst = line
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                if tx.send((dst, Instant::now())).is_err() {
                    return;
                }
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut latencies = Vec::new();
    let mut seen: HashMap<String, Instant> = HashMap::new();
    for k in 0..200 {
        let i = nodes + k;
        let served = Instant::now();
        api.apply_node(node(i, overlay));
        let cidr = pod_cidr(i);
        let deadline = served + Duration::from_secs(10);
        let arrived = loop {
            if let Some(t) = seen.remove(&cidr) {
                break t;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((dst, t)) => {
                    seen.insert(dst, t);
                }
                Err(_) => panic!(
                    "the route for {cidr} did not arrive within 10 s; agent log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ),
            }
        };
        latencies.push(arrived.saturating_duration_since(served));
        std::thread::sleep(Duration::from_millis(10));
    }
    let rss_peak = peak_rss_kib(child.id());
    let _ = monitor.kill();
    let _ = monitor.wait();
    let _ = child.kill();
    let _ = child.wait();
    latencies.sort();
    let pct = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
    let health_pct = |p: usize| {
        health_latencies[(health_latencies.len() * p / 100).min(health_latencies.len() - 1)]
    };
    println!(
        "cluster-scale mode={} nodes={nodes} initial_sync_ms={:.0} rss_after_sync_mib={:.1} rss_peak_mib={:.1} event_p50_ms={:.2} event_p99_ms={:.2} event_max_ms={:.2} healthz_probes={} healthz_p99_ms={:.2} healthz_max_ms={:.2}",
        if overlay { "vxlan" } else { "direct" },
        initial_sync.as_secs_f64() * 1000.0,
        rss_after_sync as f64 / 1024.0,
        rss_peak as f64 / 1024.0,
        pct(50).as_secs_f64() * 1000.0,
        pct(99).as_secs_f64() * 1000.0,
        latencies[latencies.len() - 1].as_secs_f64() * 1000.0,
        health_latencies.len(),
        health_pct(99).as_secs_f64() * 1000.0,
        health_latencies[health_latencies.len() - 1].as_secs_f64() * 1000.0,
    );
}
