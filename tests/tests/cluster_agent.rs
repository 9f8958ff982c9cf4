//! The node agent's own contract, in the namespace cluster of `cluster_network.rs`
//! (`cni_blackbox::cluster`): what `/readyz` says while a step fails and after, host
//! changes noticed through netlink notifications rather than the resync tick, a watch
//! whose connection died silently, and the `/metrics` exposition.
//!
//! Times are recorded (`cni_blackbox::measured`); what is asserted is a generous bound
//! above the contract's figure (the machine may be loaded), so a failure means "did not
//! happen", not "was slow". Tests that must prove the agent's own retry or a netlink
//! notification acted, not the resync, run the agent with `--resync-interval 3600`
//! ([`WITHOUT_RESYNC`]); their names say which path they prove. The documented figures
//! themselves are judged by `tests/bench/contracts.sh`, which runs the tests that
//! measure them with `CNI_RS_CONTRACT_SAMPLES` samples each
//! ([`cni_blackbox::cluster::contract_samples`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cni_blackbox::cluster::{
    API_V4, Cluster, Host, WITHOUT_RESYNC, contract_samples, node_name, node_object, node_v4,
    node_v6, pod_cidr_v4, pod_cidr_v6, routes_to,
};
use cni_blackbox::hostport::in_netns;
use cni_blackbox::measured::record_duration;
use cni_blackbox::probe::Answer;
use cni_blackbox::require_root;
use cni_blackbox::underlay::address;
use cni_kube_api::{Kind, cluster_network_policy};
use serde_json::Value;

/// The steps `/readyz` names, one `<step>: <error>` line each (the agent's own list:
/// `crates/cni-node/src/metrics.rs`).
const STEPS: [&str; 6] = ["host", "conflist", "overlay", "routes", "egress", "policy"];

/// How long the agent must have made no pass before a test changes something, so that
/// nothing but the change can wake it.
const QUIET: Duration = Duration::from_secs(1);

/// What `tests/bench/contracts.sh` reads of the figures these tests record: one name
/// per documented reaction.
const READY_AFTER_RECOVERY: &str = "contract: /readyz 200 after a failed step's cause is gone";
const MTU_TO_CONFLIST: &str = "contract: uplink MTU change in the conflist";
const ROUTE_BACK: &str = "contract: route of the agent's deleted by hand, back";
const RENUMBERED_FOLLOWS: &str =
    "contract: renumbered node's watches follow the API again after the old address went";

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
fn readyz_is_503_naming_the_failed_step_and_ready_through_the_retry_once_the_cause_is_gone() {
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
    host.resync_secs = WITHOUT_RESYNC;
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

    // The path is made writable (nothing wakes the agent for it: no notification, no
    // event): ready within the retry's backoff (capped at 4 s: the
    // contract says 5 s; the bound asserted is generous).
    fs::remove_file(&blocker).unwrap_or_else(|e| panic!("rm {}: {e}", blocker.display()));
    fs::create_dir_all(&host.conf_dir)
        .unwrap_or_else(|e| panic!("mkdir {}: {e}", host.conf_dir.display()));
    let (ready, took) = poll_health(host, "/readyz", Duration::from_secs(15), |a| {
        // `ready`, then what is only watched (ClusterNetworkPolicy) when the API serves it.
        Ok(a.status == 200 && a.body.lines().next() == Some("ready"))
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", host.agent_log()));
    eprintln!("conf dir writable: /readyz {ready} after {took:?} (contract: 5 s)");
    record_duration(READY_AFTER_RECOVERY, took);
    let conf = host
        .conflist()
        .unwrap_or_else(|| panic!("ready, but no conflist\nagent log:\n{}", host.agent_log()));
    assert_eq!(
        conf["plugins"][0]["ipam"]["ranges"],
        serde_json::json!([[{"subnet": pod_cidr_v4(1)}], [{"subnet": pod_cidr_v6(1)}]]),
        "{conf}"
    );

    // More samples of the recovery (contracts.sh): the path is blocked again, a Node
    // event makes the agent write (and fail), the failure lasts a varying while (the
    // retry's backoff grows meanwhile, up to its 4 s cap), then the path is fixed.
    for sample in 1..contract_samples(1) {
        fs::remove_dir_all(&blocker).unwrap_or_else(|e| panic!("rm -r {}: {e}", blocker.display()));
        fs::write(&blocker, "a file where a directory should be\n")
            .unwrap_or_else(|e| panic!("write {}: {e}", blocker.display()));
        let other = 9;
        if sample % 2 == 1 {
            cluster.api.apply_node(node_object(other));
        } else {
            cluster.api.delete_node(&node_name(other));
        }
        poll_health(host, "/readyz", Duration::from_secs(10), |a| {
            Ok(a.status == 503 && a.body.lines().any(|l| l.starts_with("conflist: ")))
        })
        .unwrap_or_else(|e| panic!("sample {sample}: {e}\nagent log:\n{}", host.agent_log()));
        std::thread::sleep(Duration::from_millis(800) * u32::try_from(sample % 6).unwrap_or(0));
        // Only the retry may act: no notification, no event comes while it fails.
        fs::remove_file(&blocker).unwrap_or_else(|e| panic!("rm {}: {e}", blocker.display()));
        fs::create_dir_all(&host.conf_dir)
            .unwrap_or_else(|e| panic!("mkdir {}: {e}", host.conf_dir.display()));
        let (_, took) = poll_health(host, "/readyz", Duration::from_secs(15), |a| {
            Ok(a.status == 200)
        })
        .unwrap_or_else(|e| panic!("sample {sample}: {e}\nagent log:\n{}", host.agent_log()));
        record_duration(READY_AFTER_RECOVERY, took);
    }
}

/// ClusterNetworkPolicy is optional: on an API without its CRD the agent starts, is
/// ready (its `/readyz` says nothing of the kind), says once in its log that the kind
/// is not served, and enforces NetworkPolicy as before; once the CRD is installed it
/// finds the kind without a restart (it looks again every 30 s) and says, in its log
/// and after `ready`, that it enforces it, with the count of policies per tier.
#[test]
fn cluster_network_policy_crd_absent_ready_without_it_and_found_once_installed() {
    if !require_root() {
        return;
    }
    let mut cluster = Cluster::without_nodes(1500);
    cluster.api.uninstall_crd(Kind::ClusterNetworkPolicy);
    cluster.add_host(1, 1500);
    let host = &cluster.hosts[0];
    let (_, took) = poll_health(host, "/readyz", Duration::from_secs(30), |a| {
        Ok(a.status == 200 && a.body == "ready\n")
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", host.agent_log()));
    eprintln!("ready without the ClusterNetworkPolicy CRD after {took:?}");
    const ABSENT: &str = "the API does not serve ClusterNetworkPolicy";
    assert!(
        cluster_wait(Duration::from_secs(10), || host
            .agent_log()
            .contains(ABSENT)),
        "the log never says the kind is not served:\n{}",
        host.agent_log()
    );
    assert_eq!(
        host.agent_log().matches(ABSENT).count(),
        1,
        "said more than once:\n{}",
        host.agent_log()
    );

    cluster.api.install_crd(Kind::ClusterNetworkPolicy);
    cluster
        .api
        .apply_cluster_network_policy(cluster_network_policy(
            "deny-all",
            serde_json::json!({"tier": "Admin", "priority": 1,
            "subject": {"namespaces": {}},
            "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),
        ));
    // Found within the 30 s of the next look (a generous bound).
    let (answer, took) = poll_health(host, "/readyz", Duration::from_secs(90), |a| {
        Ok(a.status == 200
            && a.body
                == "ready\nClusterNetworkPolicy: enforced (1 policies: 1 Admin, 0 Baseline)\n")
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", host.agent_log()));
    eprintln!("CRD installed: /readyz {answer} after {took:?}");
    let log = host.agent_log();
    assert!(
        log.contains("the API serves ClusterNetworkPolicy: watched and enforced"),
        "{log}"
    );
    assert_eq!(log.matches(ABSENT).count(), 1, "{log}");

    // A policy with a peer the agent does not know: named once in the log.
    cluster
        .api
        .apply_cluster_network_policy(cluster_network_policy(
            "from-the-future",
            serde_json::json!({"tier": "Baseline", "priority": 3,
            "subject": {"namespaces": {}},
            "ingress": [{"action": "Deny", "from": [{"galaxies": {}}]}]}),
        ));
    poll_health(host, "/readyz", Duration::from_secs(30), |a| {
        Ok(a.status == 200
            && a.body
                .contains("enforced (2 policies: 1 Admin, 1 Baseline)"))
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", host.agent_log()));
    const UNREADABLE: &str = "ClusterNetworkPolicy from-the-future cannot be read exactly";
    assert!(
        cluster_wait(Duration::from_secs(10), || host
            .agent_log()
            .contains(UNREADABLE)),
        "{}",
        host.agent_log()
    );
    assert_eq!(host.agent_log().matches(UNREADABLE).count(), 1);
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
fn link_notification_an_uplink_mtu_change_reaches_the_conflist() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new_with(1, 1500, |h| h.resync_secs = WITHOUT_RESYNC);
    cluster.wait_for_conflists();
    let host = &cluster.hosts[0];
    let mtu_now = || host.conflist().map(|c| c["plugins"][0]["mtu"].clone());
    assert_eq!(mtu_now(), Some(Value::from(1500)));
    for sample in 0..contract_samples(2) {
        // Nothing else wakes the agent meanwhile (what the setup stirred up is done).
        host.wait_until_quiet(QUIET);
        let mtu = if sample % 2 == 0 { 1400 } else { 1450 };
        // Timed from before the command: the agent may act before `ip` has exited.
        let changed = Instant::now();
        host.ns
            .exec_ok(&["ip", "link", "set", "ul0", "mtu", &mtu.to_string()]);
        let outcome = cluster_wait(Duration::from_secs(10), || {
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
        record_duration(MTU_TO_CONFLIST, took);
    }
}

#[test]
fn route_notification_a_route_deleted_by_hand_is_back_in_both_families() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new_with(2, 1500, |h| h.resync_secs = WITHOUT_RESYNC);
    let mesh = cluster.mesh_of();
    cluster.wait_for_routes(Duration::from_secs(10), Cluster::full_mesh(&mesh));
    let host = &cluster.hosts[0];
    let want = Cluster::full_mesh(&mesh)(host.n);
    for sample in 0..contract_samples(2) {
        host.wait_until_quiet(QUIET);
        let (family, cidr) = if sample % 2 == 0 {
            ("-4", pod_cidr_v4(2))
        } else {
            ("-6", pod_cidr_v6(2))
        };
        let deleted = Instant::now();
        host.ns
            .exec_ok(&["ip", family, "route", "del", &cidr, "proto", "77"]);
        let back = cluster_wait(Duration::from_secs(10), || host.our_routes() == want);
        let took = deleted.elapsed();
        assert!(
            back,
            "{cidr} deleted by hand: not back after {took:?} (--resync-interval 3600: only a \
             route notification can act); routes: {:?}\nagent log:\n{}",
            host.our_routes(),
            host.agent_log()
        );
        eprintln!("{cidr} deleted by hand: back after {took:?} (contract: 1 s)");
        record_duration(ROUTE_BACK, took);
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
fn address_notification_a_watch_that_died_with_the_nodes_old_address_is_replaced() {
    if !require_root() {
        return;
    }
    const NEW_V4: &str = "198.18.0.61";
    const NEW_V6: &str = "fd00:18::61";
    // No resync: it would not restart a watch anyway, but nothing else may act here
    // than the address's removal.
    let cluster = Cluster::new_with(2, 1500, |h| h.resync_secs = WITHOUT_RESYNC);
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
    // ones go. The kernel does not reset the agent's sockets from the old address;
    // they just stop hearing anything, until the agent ends them itself on the
    // address's removal (or keepalive gives them up, 25 s later).
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

    // Node 1's watches lost their address; the agent ends them when the address goes
    // and makes them again from the new one, so it follows as soon as the Node is
    // updated (2 s after the change), not after keepalive's 25 s.
    let want_1: BTreeSet<String> = routes_to(2, &node_v4(2), &node_v6(2))
        .into_iter()
        .chain(to_3)
        .collect();
    let deadline = changed + Duration::from_secs(10);
    let routed = cluster_wait(deadline.saturating_duration_since(Instant::now()), || {
        a.our_routes() == want_1
    });
    let took = changed.elapsed();
    let after = api_connections(a);
    assert!(
        routed,
        "node 1 did not route node 3 within {took:?} of its address change (10 s; keepalive \
         alone would take 25 s): \
         want {want_1:?}, have {:?}; its API connections now: {after:?}\nagent log:\n{}",
        a.our_routes(),
        a.agent_log()
    );
    eprintln!(
        "node 1 routed the node added after its renumbering {took:?} after the change (the \
         Node updated 2 s after it; keepalive alone would take 25 s); API connections now \
         from {after:?}"
    );

    // Renumbered again and again (contracts.sh asks for many samples), each time with a
    // Node event right after the old address went: how long until node 1 follows it,
    // which takes its watches made again from the new address.
    let mut at = (NEW_V4.to_owned(), NEW_V6.to_owned());
    let mut routes = want_1;
    for sample in 0..contract_samples(1) {
        a.wait_until_quiet(QUIET);
        let next = if sample % 2 == 0 {
            (old_v4.clone(), old_v6.clone())
        } else {
            (NEW_V4.to_owned(), NEW_V6.to_owned())
        };
        address(&a.ns, &next.0, "24");
        address(&a.ns, &next.1, "64");
        let changed = Instant::now();
        a.ns.exec_ok(&["ip", "addr", "del", &format!("{}/24", at.0), "dev", "ul0"]);
        a.ns.exec_ok(&["ip", "addr", "del", &format!("{}/64", at.1), "dev", "ul0"]);
        let mut renumbered = node_object(1);
        renumbered["status"]["addresses"][0]["address"] = Value::from(next.0.as_str());
        renumbered["status"]["addresses"][1]["address"] = Value::from(next.1.as_str());
        cluster.api.apply_node(renumbered);
        let toggled = 4;
        let toggled_routes = routes_to(toggled, &node_v4(toggled), &node_v6(toggled));
        if sample % 2 == 0 {
            cluster.api.apply_node(node_object(toggled));
            routes.extend(toggled_routes);
        } else {
            cluster.api.delete_node(&node_name(toggled));
            for route in &toggled_routes {
                routes.remove(route);
            }
        }
        let followed = cluster_wait(Duration::from_secs(20), || a.our_routes() == routes);
        let took = changed.elapsed();
        assert!(
            followed,
            "sample {sample}: node 1, renumbered to {next:?}, did not follow a Node event \
             within {took:?}: want {routes:?}, have {:?}\nagent log:\n{}",
            a.our_routes(),
            a.agent_log()
        );
        record_duration(RENUMBERED_FOLLOWS, took);
        at = next;
    }
}

// ---------------------------------------------------------------------------------------
// /metrics
// ---------------------------------------------------------------------------------------

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed exposition.
#[derive(Debug, Default)]
struct Exposition {
    samples: Vec<Sample>,
    /// `# TYPE` lines: family name to type.
    types: BTreeMap<String, String>,
    /// Families with a `# HELP` line.
    helps: BTreeSet<String>,
}

impl Exposition {
    /// The value of the sample `name` whose labels are exactly `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    /// The `# TYPE` of the family a sample name belongs to. A counter's family is
    /// `x_total` in the classic text format and `x` in OpenMetrics; both are accepted.
    fn type_of(&self, sample_name: &str) -> Option<(&str, &str)> {
        let base = sample_name.strip_suffix("_total");
        [Some(sample_name), base]
            .into_iter()
            .flatten()
            .find_map(|family| self.types.get_key_value(family))
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Parses the Prometheus text format (and OpenMetrics' `# EOF`): comments `# HELP`,
/// `# TYPE`, others ignored; samples `name{label="value",...} value [timestamp]`.
fn parse_exposition(text: &str) -> Result<Exposition, String> {
    let mut out = Exposition::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let fail = |why: &str| format!("line {}: {why}: {raw:?}", i + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    out.types.insert(name.to_owned(), kind.to_owned());
                }
                (Some("TYPE"), _, _) => return Err(fail("a TYPE without a type")),
                (Some("HELP"), Some(name), _) => {
                    out.helps.insert(name.to_owned());
                }
                _ => {}
            }
            continue;
        }
        let name_end = line
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(line.len());
        let name = &line[..name_end];
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(fail("no metric name"));
        }
        let mut rest = &line[name_end..];
        let mut labels = BTreeMap::new();
        if let Some(after) = rest.strip_prefix('{') {
            let (parsed, tail) = parse_labels(after).map_err(|e| fail(&e))?;
            labels = parsed;
            rest = tail;
        }
        let value = rest
            .split_whitespace()
            .next()
            .ok_or_else(|| fail("no value"))?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().map_err(|_| fail("not a number"))?,
        };
        out.samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    Ok(out)
}

/// `label="value",...}` (after the `{`): the labels and what follows the `}`.
fn parse_labels(mut s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((labels, rest));
        }
        let (name, after) = s.split_once('=').ok_or("a label without =")?;
        let name = name.trim();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad label name {name:?}"));
        }
        let mut chars = after
            .strip_prefix('"')
            .ok_or("a label value without quotes")?
            .char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("a label value ends in a backslash".into()),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => return Err("an unterminated label value".into()),
            }
        };
        labels.insert(name.to_owned(), value);
        s = after[1 + end + 1..].trim_start();
        s = s.strip_prefix(',').unwrap_or(s);
    }
}

/// The metric families of the contract, as they appear in samples, with their type.
const FAMILIES: [(&str, &str); 13] = [
    ("cni_node_reconciles_total", "counter"),
    ("cni_node_reconcile_duration_seconds", "histogram"),
    ("cni_node_reconcile_failures_total", "counter"),
    (
        "cni_node_last_successful_reconcile_timestamp_seconds",
        "gauge",
    ),
    ("cni_node_watch_restarts_total", "counter"),
    ("cni_node_watch_lists_total", "counter"),
    ("cni_node_watched_objects", "gauge"),
    ("cni_node_routes", "gauge"),
    ("cni_node_egress_prefixes", "gauge"),
    ("cni_node_skipped_nodes", "gauge"),
    ("cni_node_host_events_total", "counter"),
    ("cni_node_policy_profiles", "gauge"),
    ("cni_node_policy_peer_sets", "gauge"),
];

/// `GET /metrics` of `host`'s agent, parsed.
fn metrics(host: &Host) -> Result<Exposition, String> {
    let answer = host.health("/metrics")?;
    if answer.status != 200 {
        return Err(format!("GET /metrics: {answer}"));
    }
    parse_exposition(&answer.body).map_err(|e| format!("GET /metrics: {e}\n{}", answer.body))
}

/// Polls `/metrics` until `ok` holds of it (`within`); returns the last exposition.
fn wait_metrics(
    host: &Host,
    within: Duration,
    what: &str,
    mut ok: impl FnMut(&Exposition) -> bool,
) -> Exposition {
    let start = Instant::now();
    loop {
        match metrics(host) {
            Ok(m) if ok(&m) => return m,
            _ if start.elapsed() < within => {}
            Ok(m) => panic!(
                "{what}: not so after {within:?}; samples:\n{}\nagent log:\n{}",
                m.samples
                    .iter()
                    .map(|s| format!("{} {:?} {}", s.name, s.labels, s.value))
                    .collect::<Vec<_>>()
                    .join("\n"),
                host.agent_log()
            ),
            Err(e) => panic!("{what}: {e}\nagent log:\n{}", host.agent_log()),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[test]
fn metrics_name_every_family_and_follow_the_cluster() {
    if !require_root() {
        return;
    }
    let test_start = now_unix();
    let mut cluster = Cluster::new(2, 1500);
    let mesh = cluster.mesh_of();
    cluster.wait_for_routes(Duration::from_secs(10), Cluster::full_mesh(&mesh));
    let node = [("kind", "Node")];
    let first = wait_metrics(
        &cluster.hosts[0],
        Duration::from_secs(10),
        "cni_node_watched_objects{kind=\"Node\"} == 2",
        |m| m.get("cni_node_watched_objects", &node) == Some(2.0),
    );

    // Every family, with its type and help.
    let mut problems = Vec::new();
    for (family, kind) in FAMILIES {
        match first.type_of(family) {
            Some((declared, t)) if t == kind => {
                if !first.helps.contains(declared) {
                    problems.push(format!("{family}: no # HELP {declared}"));
                }
            }
            Some((declared, t)) => {
                problems.push(format!("{family}: # TYPE {declared} {t}, expected {kind}"));
            }
            None => problems.push(format!("{family}: no # TYPE line")),
        }
    }
    // The samples that are preset or have surely happened by now.
    let mut want: Vec<(String, Vec<(&str, &str)>)> = vec![
        (
            "cni_node_reconciles_total".into(),
            vec![("result", "success")],
        ),
        (
            "cni_node_reconciles_total".into(),
            vec![("result", "failure")],
        ),
        ("cni_node_reconcile_duration_seconds_sum".into(), vec![]),
        ("cni_node_reconcile_duration_seconds_count".into(), vec![]),
        (
            "cni_node_reconcile_duration_seconds_bucket".into(),
            vec![("le", "+Inf")],
        ),
        (
            "cni_node_last_successful_reconcile_timestamp_seconds".into(),
            vec![],
        ),
        ("cni_node_watch_lists_total".into(), node.to_vec()),
        ("cni_node_watched_objects".into(), node.to_vec()),
        ("cni_node_routes".into(), vec![("family", "ipv4")]),
        ("cni_node_routes".into(), vec![("family", "ipv6")]),
        ("cni_node_egress_prefixes".into(), vec![]),
        ("cni_node_skipped_nodes".into(), vec![]),
        ("cni_node_host_events_total".into(), vec![]),
    ];
    for step in STEPS {
        want.push((
            "cni_node_reconcile_failures_total".into(),
            vec![("step", step)],
        ));
    }
    for (name, labels) in &want {
        if first.get(name, labels).is_none() {
            problems.push(format!("no sample {name}{labels:?}"));
        }
    }
    assert!(
        problems.is_empty(),
        "/metrics:\n{}\nsamples: {:?}",
        problems.join("\n"),
        first.samples
    );
    let value = |m: &Exposition, name: &str, labels: &[(&str, &str)]| {
        m.get(name, labels).unwrap_or(f64::NAN)
    };
    let success = [("result", "success")];
    assert!(value(&first, "cni_node_reconciles_total", &success) >= 1.0);
    assert!(value(&first, "cni_node_watch_lists_total", &node) >= 1.0);
    assert_eq!(value(&first, "cni_node_routes", &[("family", "ipv4")]), 1.0);
    assert_eq!(value(&first, "cni_node_routes", &[("family", "ipv6")]), 1.0);
    assert!(value(&first, "cni_node_egress_prefixes", &[]) >= 1.0);
    assert_eq!(value(&first, "cni_node_skipped_nodes", &[]), 0.0);
    let stamp = value(
        &first,
        "cni_node_last_successful_reconcile_timestamp_seconds",
        &[],
    );
    assert!(
        stamp >= test_start - 5.0 && stamp <= now_unix() + 5.0,
        "last successful reconcile at {stamp}, the test started at {test_start}"
    );
    // A histogram's +Inf bucket counts every observation.
    assert_eq!(
        value(
            &first,
            "cni_node_reconcile_duration_seconds_bucket",
            &[("le", "+Inf")]
        ),
        value(&first, "cni_node_reconcile_duration_seconds_count", &[])
    );

    // A node joins and another leaves: the gauges follow, reconciles are counted.
    cluster.api.apply_node(node_object(3));
    cluster.api.delete_node(&node_name(2));
    let successes = value(&first, "cni_node_reconciles_total", &success);
    let host = &cluster.hosts[0];
    let moved = wait_metrics(
        host,
        Duration::from_secs(10),
        "after node 3 joined and node 2 left: 2 Nodes watched, one route per family",
        |m| {
            m.get("cni_node_watched_objects", &node) == Some(2.0)
                && m.get("cni_node_routes", &[("family", "ipv4")]) == Some(1.0)
                && m.get("cni_node_routes", &[("family", "ipv6")]) == Some(1.0)
                && m.get("cni_node_reconciles_total", &success) > Some(successes)
        },
    );
    let want_routes: BTreeSet<String> = routes_to(3, &node_v4(3), &node_v6(3)).into();
    assert_eq!(host.our_routes(), want_routes);

    // The API goes away and comes back compacted: the watch is restarted and relists.
    let lists = value(&moved, "cni_node_watch_lists_total", &node);
    let restarts = moved
        .get("cni_node_watch_restarts_total", &node)
        .unwrap_or(0.0);
    cluster.api.stop();
    std::thread::sleep(Duration::from_secs(1));
    // A change while the agent cannot see it, then a compaction: the agent's version is
    // now too old (410), so it must list again.
    cluster.api.apply_node(node_object(1));
    cluster.api.compact();
    cluster.api.restart();
    let host = &cluster.hosts[0];
    wait_metrics(
        host,
        Duration::from_secs(40),
        "after the API restarted compacted: a watch restart and a relist counted",
        |m| {
            m.get("cni_node_watch_lists_total", &node) > Some(lists)
                && m.get("cni_node_watch_restarts_total", &node) > Some(restarts)
                && m.get("cni_node_watched_objects", &node) == Some(2.0)
        },
    );
}

#[test]
fn the_exposition_parser_reads_both_text_formats() {
    let text = "# HELP cni_node_reconciles The reconciles.\n\
                # TYPE cni_node_reconciles counter\n\
                cni_node_reconciles_total{result=\"success\"} 3\n\
                cni_node_reconciles_total{result=\"failure\",} 0 1700000000000\n\
                # TYPE cni_node_routes gauge\n\
                cni_node_routes{family=\"ipv4\", note=\"a \\\"quoted\\\" }\\n\"} 2\n\
                # TYPE h histogram\n\
                h_bucket{le=\"+Inf\"} 4\n\
                h_sum 0.5e-1\n\
                # EOF\n";
    let m = parse_exposition(text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        m.get("cni_node_reconciles_total", &[("result", "success")]),
        Some(3.0)
    );
    assert_eq!(
        m.get("cni_node_reconciles_total", &[("result", "failure")]),
        Some(0.0)
    );
    assert_eq!(
        m.get(
            "cni_node_routes",
            &[("family", "ipv4"), ("note", "a \"quoted\" }\n")]
        ),
        Some(2.0)
    );
    assert_eq!(m.get("h_bucket", &[("le", "+Inf")]), Some(4.0));
    assert_eq!(m.get("h_sum", &[]), Some(0.05));
    assert_eq!(
        m.type_of("cni_node_reconciles_total"),
        Some(("cni_node_reconciles", "counter"))
    );
    assert!(m.helps.contains("cni_node_reconciles"));
    assert!(parse_exposition("x{a=\"1} 2\n").is_err());
    assert!(parse_exposition("x 1\n# TYPE y\n").is_err());
    assert!(parse_exposition("{a=\"1\"} 2\n").is_err());
}
