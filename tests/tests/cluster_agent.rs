//! The node agent's own contract, in the namespace cluster of `cluster_network.rs`
//! (`cni_blackbox::cluster`): what `/readyz` says while a step fails and after, host
//! changes noticed through netlink notifications rather than the resync tick, and a
//! watch whose connection died silently.
//!
//! Times are printed; what is asserted is a generous bound above the contract's figure
//! (the machine may be loaded), so a failure means "did not happen", not "was slow".
//! Tests that must prove the agent's own retry or a netlink notification acted, not the
//! resync, run the agent with `--resync-interval 3600`.

use std::collections::BTreeSet;
use std::fs;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use cni_blackbox::cluster::{
    API_V4, Cluster, Host, node_object, node_v4, node_v6, pod_cidr_v4, pod_cidr_v6, routes_to,
};
use cni_blackbox::hostport::in_netns;
use cni_blackbox::probe::Answer;
use cni_blackbox::require_root;
use cni_blackbox::underlay::address;
use serde_json::Value;

/// The steps `/readyz` names, one `<step>: <error>` line each.
const STEPS: [&str; 4] = ["host", "conflist", "routes", "egress"];

/// Asks `path` of `host`'s agent every 50 ms until `check` says done (`Ok(true)`),
/// fails (`Err`, at once), or `within` passes; a probe that gets no answer (not yet
/// listening) is retried. Returns the last answer and how long it took.
fn poll_health(
    host: &Host,
    path: &str,
    within: Duration,
    mut check: impl FnMut(&Answer) -> Result<bool, String>,
) -> Result<(Answer, Duration), String> {
    let start = Instant::now();
    loop {
        let last = match host.health(path) {
            Ok(answer) => match check(&answer) {
                Ok(true) => return Ok((answer, start.elapsed())),
                Ok(false) => answer.to_string(),
                Err(e) => return Err(format!("GET {path}: {e}")),
            },
            Err(e) => e,
        };
        if start.elapsed() >= within {
            return Err(format!(
                "GET {path}: not as expected after {within:?}; last: {last}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The lines of a `/readyz` failure body that are not `<step>: <error>`.
fn malformed_lines(body: &str) -> Vec<String> {
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| {
            !l.split_once(": ")
                .is_some_and(|(step, error)| STEPS.contains(&step) && !error.trim().is_empty())
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn readyz_is_503_naming_the_failed_step_and_ready_once_the_cause_is_gone() {
    if !require_root() {
        return;
    }
    let mut cluster = Cluster::without_nodes(1500);
    // The API is not reachable at all when the agent starts.
    cluster.api.stop();
    cluster.api.apply_node(node_object(1));
    let mut host = cluster.new_host(1, 1500);
    // The conf dir's parent is a regular file: the conflist cannot be written.
    let blocker = cluster.dir.path().join("node-1").join("blocked");
    fs::write(&blocker, "a file where a directory should be\n")
        .unwrap_or_else(|e| panic!("write {}: {e}", blocker.display()));
    host.conf_dir = blocker.join("net.d");
    // Not the resync tick: the failed step's own retry must bring it back.
    host.resync_secs = 3600;
    host.start_agent(&cluster.kubeconfig);
    cluster.hosts.push(host);
    let host = &cluster.hosts[0];
    let log = || host.agent_log();

    // Before the first list: 503, waiting for it; and it stays so while the API is away.
    let waiting = |a: &Answer| -> Result<bool, String> {
        if a.status == 503 && a.body.to_lowercase().contains("waiting for the first list") {
            Ok(true)
        } else {
            Err(format!(
                "the API is unreachable, so 503 waiting for the first list was due, got {a}"
            ))
        }
    };
    let (first, _) = poll_health(host, "/readyz", Duration::from_secs(20), waiting)
        .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", log()));
    eprintln!("API unreachable: /readyz {first}");
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let answer = host
            .health("/readyz")
            .unwrap_or_else(|e| panic!("/readyz: {e}\nagent log:\n{}", log()));
        waiting(&answer).unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", log()));
        std::thread::sleep(Duration::from_millis(100));
    }

    // The API comes: the Node has pod CIDRs, the conflist cannot be written.
    cluster.api.restart();
    let host = &cluster.hosts[0];
    let (failing, took) = poll_health(host, "/readyz", Duration::from_secs(30), |a| {
        if a.status == 200 {
            return Err(format!(
                "ready although {} cannot be written: {a}",
                host.conf_dir.display()
            ));
        }
        Ok(a.status == 503 && a.body.lines().any(|l| l.starts_with("conflist: ")))
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", host.agent_log()));
    eprintln!("API reachable, conflist unwritable: /readyz {failing} after {took:?}");
    let bad = malformed_lines(&failing.body);
    assert!(
        bad.is_empty(),
        "/readyz lines not of the form `<step>: <error>` (step one of {STEPS:?}): {bad:?}"
    );
    assert!(host.conflist().is_none());

    // The path is made writable: ready within the retry's backoff (capped at 4 s: the
    // contract says 5 s; the bound asserted is generous).
    fs::remove_file(&blocker).unwrap_or_else(|e| panic!("rm {}: {e}", blocker.display()));
    fs::create_dir_all(&host.conf_dir)
        .unwrap_or_else(|e| panic!("mkdir {}: {e}", host.conf_dir.display()));
    let (ready, took) = poll_health(host, "/readyz", Duration::from_secs(15), |a| {
        Ok(a.status == 200 && a.body == "ready\n")
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", host.agent_log()));
    eprintln!("conf dir writable: /readyz {ready} after {took:?} (contract: 5 s)");
    let conf = host
        .conflist()
        .unwrap_or_else(|| panic!("ready, but no conflist\nagent log:\n{}", host.agent_log()));
    assert_eq!(
        conf["plugins"][0]["ipam"]["ranges"],
        serde_json::json!([[{"subnet": pod_cidr_v4(1)}], [{"subnet": pod_cidr_v6(1)}]]),
        "{conf}"
    );
}

#[test]
fn readyz_lines_are_checked_for_their_form() {
    assert!(
        malformed_lines("conflist: cannot write /x: Not a directory\nroutes: EPERM\n").is_empty()
    );
    assert_eq!(
        malformed_lines("not ready\nconflist: x\nfirewall: y\nhost:\n"),
        ["not ready", "firewall: y", "host:"]
    );
}

/// Polls `ok` every 10 ms for at most `within`; whether it came true.
fn cluster_wait(within: Duration, ok: impl FnMut() -> bool) -> bool {
    cni_blackbox::cluster::wait(within, "", ok).is_ok()
}

#[test]
fn an_uplink_mtu_change_reaches_the_conflist_through_a_notification() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new_with(1, 1500, |h| h.resync_secs = 3600);
    cluster.wait_for_conflists();
    let host = &cluster.hosts[0];
    let mtu_now = || host.conflist().map(|c| c["plugins"][0]["mtu"].clone());
    assert_eq!(mtu_now(), Some(Value::from(1500)));
    for mtu in [1400, 1450] {
        host.ns
            .exec_ok(&["ip", "link", "set", "ul0", "mtu", &mtu.to_string()]);
        let changed = Instant::now();
        let outcome = cluster_wait(Duration::from_secs(5), || {
            mtu_now() == Some(Value::from(mtu))
        });
        let took = changed.elapsed();
        assert!(
            outcome,
            "ul0's MTU set to {mtu}: the conflist still says {:?} after {took:?} \
             (--resync-interval 3600: only a link notification can act)\nagent log:\n{}",
            mtu_now(),
            host.agent_log()
        );
        eprintln!("uplink MTU {mtu}: in the conflist after {took:?} (contract: 1 s)");
    }
}

#[test]
fn a_route_deleted_by_hand_is_back_through_a_notification() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new_with(2, 1500, |h| h.resync_secs = 3600);
    let mesh = cluster.mesh_of();
    cluster.wait_for_routes(Duration::from_secs(10), Cluster::full_mesh(&mesh));
    let host = &cluster.hosts[0];
    let want = Cluster::full_mesh(&mesh)(host.n);
    for (family, cidr) in [("-4", pod_cidr_v4(2)), ("-6", pod_cidr_v6(2))] {
        host.ns
            .exec_ok(&["ip", family, "route", "del", &cidr, "proto", "77"]);
        let deleted = Instant::now();
        let back = cluster_wait(Duration::from_secs(5), || host.our_routes() == want);
        let took = deleted.elapsed();
        assert!(
            back,
            "{cidr} deleted by hand: not back after {took:?} (--resync-interval 3600: only a \
             route notification can act); routes: {:?}\nagent log:\n{}",
            host.our_routes(),
            host.agent_log()
        );
        eprintln!("{cidr} deleted by hand: back after {took:?} (contract: 1 s)");
    }
}

/// The local addresses of the TCP connections established from `host` to the API server.
fn api_connections(host: &Host) -> Vec<String> {
    host.ns
        .exec_ok(&["ss", "-Htn", "state", "established", "dst", API_V4])
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect()
}

#[test]
fn a_watch_that_died_with_the_nodes_old_address_is_replaced() {
    if !require_root() {
        return;
    }
    const NEW_V4: &str = "198.18.0.61";
    const NEW_V6: &str = "fd00:18::61";
    let cluster = Cluster::new(2, 1500);
    let mesh = cluster.mesh_of();
    cluster.wait_for_routes(Duration::from_secs(10), Cluster::full_mesh(&mesh));
    let a = &cluster.hosts[0];
    assert_eq!(a.n, 1);
    let (old_v4, old_v6) = (node_v4(1), node_v6(1));
    // The agent watches over a connection from its old address.
    let before = api_connections(a);
    assert!(
        before.iter().any(|c| c.starts_with(&format!("{old_v4}:"))),
        "node 1's agent has no connection from {old_v4} to the API: {before:?}"
    );

    // The node is renumbered on the same subnet: new addresses first (the old primary's
    // removal promotes the new one, so the subnet and default routes stay), then the old
    // ones go. Nothing resets the agent's socket; it just stops hearing anything.
    a.ns.exec_ok(&["sysctl", "-qw", "net.ipv4.conf.ul0.promote_secondaries=1"]);
    address(&a.ns, NEW_V4, "24");
    address(&a.ns, NEW_V6, "64");
    a.ns.exec_ok(&["ip", "addr", "del", &format!("{old_v4}/24"), "dev", "ul0"]);
    a.ns.exec_ok(&["ip", "addr", "del", &format!("{old_v6}/64"), "dev", "ul0"]);
    let changed = Instant::now();
    eprintln!(
        "node 1 renumbered {old_v4} -> {NEW_V4}, {old_v6} -> {NEW_V6}; its agent's API \
         connections were from {before:?}"
    );

    // The setup does what it says: the API server cannot reach the old addresses any
    // more, and node 1 reaches the API server from the new one.
    for (flag, old) in [("-4", &old_v4), ("-6", &old_v6)] {
        let out = cluster
            .underlay
            .exec(&["ping", flag, "-c", "1", "-W", "1", old]);
        assert!(
            !out.status.success(),
            "the API server's namespace still reaches {old}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let api = cluster.api.addr();
    let local = in_netns(a.ns.path(), move || {
        TcpStream::connect_timeout(&api, Duration::from_secs(5)).and_then(|s| s.local_addr())
    })
    .unwrap_or_else(|e| panic!("node 1 cannot reach the API server at {api}: {e}"));
    assert_eq!(local.ip().to_string(), NEW_V4, "connected from {local}");
    let default = a.ns.exec_ok(&["ip", "-4", "route", "show", "default"]);
    assert!(default.contains("via"), "node 1 lost its default route");

    // A moment later, the kubelet reports the new addresses and a node joins.
    std::thread::sleep(Duration::from_secs(2));
    let mut renumbered = node_object(1);
    renumbered["status"]["addresses"][0]["address"] = Value::from(NEW_V4);
    renumbered["status"]["addresses"][1]["address"] = Value::from(NEW_V6);
    cluster.api.apply_node(renumbered);
    cluster.api.apply_node(node_object(3));

    // Node 2's watch is fine: it follows at once.
    let to_3 = routes_to(3, &node_v4(3), &node_v6(3));
    let want_2: BTreeSet<String> = routes_to(1, NEW_V4, NEW_V6)
        .into_iter()
        .chain(to_3.clone())
        .collect();
    let b = &cluster.hosts[1];
    assert!(
        cluster_wait(Duration::from_secs(10), || b.our_routes() == want_2),
        "node 2: want {want_2:?}, have {:?}\nagent log:\n{}",
        b.our_routes(),
        b.agent_log()
    );

    // Node 1's watch died silently; it must be found dead and replaced, and resume.
    let want_1: BTreeSet<String> = routes_to(2, &node_v4(2), &node_v6(2))
        .into_iter()
        .chain(to_3)
        .collect();
    let deadline = changed + Duration::from_secs(40);
    let routed = cluster_wait(deadline.saturating_duration_since(Instant::now()), || {
        a.our_routes() == want_1
    });
    let took = changed.elapsed();
    let after = api_connections(a);
    assert!(
        routed,
        "node 1 did not route node 3 within {took:?} of its address change (contract: 30 s): \
         want {want_1:?}, have {:?}; its API connections now: {after:?}\nagent log:\n{}",
        a.our_routes(),
        a.agent_log()
    );
    eprintln!(
        "node 1 routed the node added after its renumbering {took:?} after the change \
         (contract: 30 s); API connections now from {after:?}"
    );
}
