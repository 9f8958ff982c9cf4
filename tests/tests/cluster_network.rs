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
//!
//! The cluster itself is `cni_blackbox::cluster`, shared with `cluster_agent.rs`.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cni_blackbox::cluster::{
    Cluster, PROTO, node_name, node_object, node_v4, node_v6, pod_cidr_v4, pod_cidr_v6, routes_to,
};
use cni_blackbox::measured::record_duration;
use cni_blackbox::require_root;
use cni_blackbox::underlay::address;
use serde_json::Value;

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

    // A fourth node joins: everyone routes to it (the docs say within a second; the
    // bound is generous, the time recorded), its pod is reachable.
    cluster.add_host(4, 1500);
    let mesh = cluster.mesh_of();
    let took = cluster.wait_for_routes(Duration::from_secs(10), Cluster::full_mesh(&mesh));
    eprintln!("join: every node had its routes after {took:?}");
    record_duration("a node joined: every node routes to it", took);
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
    let took = cluster.wait_for_routes(Duration::from_secs(10), Cluster::full_mesh(&mesh));
    eprintln!("address change: routes followed after {took:?}");
    record_duration(
        "a node's InternalIP changed: every node's routes followed",
        took,
    );
    cluster.check_pod_to_pod();

    // Node 4 is deleted: its routes are gone everywhere.
    cluster.api.delete_node(&node_name(4));
    let mesh: Vec<(u8, String, String)> = mesh.into_iter().filter(|(n, _, _)| *n != 4).collect();
    // Node 4's own agent keeps its routes to the others: its own Node is gone, theirs
    // are not.
    let took = cluster.wait_for_routes(Duration::from_secs(10), Cluster::full_mesh(&mesh));
    eprintln!("leave: routes gone after {took:?}");
    record_duration("a node left: its routes gone from every node", took);
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
    // host-gw only: a node behind the gateway is skipped (with the overlay, the default,
    // it is encapsulated instead: tests/tests/overlay.rs).
    let mut cluster = Cluster::new_with(2, 1500, |h| h.extra_args.push("--overlay=off".into()));
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
