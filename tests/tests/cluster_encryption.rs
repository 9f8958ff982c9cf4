//! `cni-node --encryption wireguard` in the namespace cluster (`cni_blackbox::cluster`)
//! on a kernel without WireGuard (this machine's): the agent says so in `/readyz`, its
//! log and `/metrics`, takes a key its node published before off the Node (so the
//! others reach it in clear), and keeps routing in clear; with `--encryption-strict` it
//! sends no pod traffic to another node in clear and takes none from a node that
//! publishes a key, while traffic between its own pods flows. Traffic through the
//! device itself needs a kernel with WireGuard: the stock-kernel VM tier runs that.

use std::time::Duration;

use cni_blackbox::cluster::{
    Cluster, Host, node_name, node_v4, node_v6, pod_cidr_v4, routes_to, wait,
};
use cni_blackbox::require_root;
use cni_blackbox::underlay::source_seen_within;
use cni_kube_api::Kind;
use serde_json::{Value, json};

const ANNOTATION: &str = "cni-plugins-rs.io/wireguard-public-key";
/// A key some node published (any 32 bytes in base64 are a key).
const SOME_KEY: &str = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=";

/// Turns encryption on for a node, with its state directory beside its other files.
fn encrypting(host: &mut Host, strict: bool) {
    let state = host
        .conf_dir
        .parent()
        .unwrap_or_else(|| panic!("{} has no parent", host.conf_dir.display()))
        .join("state");
    host.extra_args.push("--encryption=wireguard".into());
    host.extra_args
        .push(format!("--state-dir={}", state.display()));
    if strict {
        host.extra_args.push("--encryption-strict".into());
    }
}

/// Sets (or removes) node `n`'s key annotation on its Node object.
fn annotate(cluster: &Cluster, n: u8, key: Option<&str>) {
    let mut node = cluster
        .api
        .get(Kind::Node, "", &node_name(n))
        .unwrap_or_else(|| panic!("no Node {n}"));
    let annotations = node["metadata"]
        .as_object_mut()
        .unwrap_or_else(|| panic!("metadata"))
        .entry("annotations")
        .or_insert_with(|| json!({}));
    match key {
        Some(k) => annotations[ANNOTATION] = json!(k),
        None => {
            annotations.as_object_mut().map(|a| a.remove(ANNOTATION));
        }
    }
    cluster.api.apply_node(node);
}

fn annotation(cluster: &Cluster, n: u8) -> Value {
    cluster
        .api
        .get(Kind::Node, "", &node_name(n))
        .map_or(Value::Null, |node| {
            node["metadata"]["annotations"][ANNOTATION].clone()
        })
}

fn metric(host: &Host, series: &str) -> Option<f64> {
    let answer = host.health("/metrics").ok()?;
    answer
        .body
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn on_a_kernel_without_wireguard_the_agent_says_so_and_routes_in_clear() {
    if !require_root() {
        return;
    }
    let mut cluster = Cluster::without_nodes(1500);
    for n in 1..=3 {
        let mut host = cluster.new_host(n, 1500);
        if n != 3 {
            encrypting(&mut host, false);
        }
        cluster
            .api
            .apply_node(cni_blackbox::cluster::node_object(n));
        // Node 2 published a key before (a kernel with WireGuard, say).
        if n == 2 {
            annotate(&cluster, 2, Some(SOME_KEY));
        }
        host.start_agent(&cluster.kubeconfig);
        cluster.hosts.push(host);
    }
    cluster.wait_for_conflists();
    let mesh = cluster.mesh_of();
    cluster.wait_for_routes(Duration::from_secs(20), Cluster::full_mesh(&mesh));
    for n in 1..=3 {
        cluster.host(n).add_pod();
    }
    cluster.check_pod_to_pod();

    // Node 2's agent took its key off: it cannot decrypt anything.
    wait(Duration::from_secs(10), "node 2's key taken off", || {
        annotation(&cluster, 2).is_null()
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", cluster.hosts[1].agent_log()));

    for n in [1u8, 2] {
        let host = &cluster.hosts[usize::from(n) - 1];
        let readyz = host
            .health("/readyz")
            .unwrap_or_else(|e| panic!("node {n} /readyz: {e}"));
        assert_eq!(readyz.status, 503, "node {n}: {readyz}");
        let line = readyz
            .body
            .lines()
            .find(|l| l.starts_with("encryption: "))
            .unwrap_or_else(|| panic!("node {n}: no encryption line in {readyz}"));
        assert!(line.contains("no WireGuard"), "node {n}: {line}");
        let log = host.agent_log();
        assert!(
            log.contains("this kernel has no WireGuard"),
            "node {n} log:\n{log}"
        );
        assert!(
            log.contains("reached in clear: "),
            "node {n} log says which nodes go in clear:\n{log}"
        );
        assert_eq!(
            metric(host, "cni_node_wireguard_peers_without_key"),
            Some(2.0),
            "node {n}"
        );
        assert!(
            metric(
                host,
                "cni_node_reconcile_failures_total{step=\"encryption\"}"
            )
            .is_some_and(|v| v >= 1.0),
            "node {n}"
        );
        assert_eq!(metric(host, "cni_node_wireguard_peers"), Some(0.0));
    }
    // The node without encryption is ready and counts nobody as keyless.
    let plain = &cluster.hosts[2];
    let readyz = plain.health("/readyz").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(readyz.status, 200, "{readyz}");
    assert_eq!(
        metric(plain, "cni_node_wireguard_peers_without_key"),
        Some(0.0)
    );
    // No WireGuard device, no key file was made (nothing to keep one for).
    let links = cluster.hosts[0].ns.exec_ok(&["ip", "-o", "link", "show"]);
    assert!(!links.contains("cni-wg0"), "{links}");
}

#[test]
fn strict_mode_sends_no_pod_traffic_in_clear_and_takes_none_from_a_keyed_node() {
    if !require_root() {
        return;
    }
    let mut cluster = Cluster::new_with(2, 1500, |host| {
        if host.n == 1 {
            encrypting(host, true);
        }
    });
    cluster.wait_for_conflists();
    let want = |m: u8| {
        let other = 3 - m;
        routes_to(other, &node_v4(other), &node_v6(other))
            .into_iter()
            .collect()
    };
    cluster.wait_for_routes(Duration::from_secs(20), want);
    cluster.host(1).add_pod();
    cluster.host(1).add_pod();
    cluster.host(2).add_pod();
    let strict = &cluster.hosts[0];
    let table = strict
        .ns
        .exec_ok(&["nft", "list", "table", "inet", "cni_node_encryption"]);
    assert!(table.contains("oifname != \"cni-wg0\""), "{table}");
    assert!(
        !table.contains(&format!("{} . ", pod_cidr_v4(2))),
        "node 2 publishes no key: nothing expected of it yet\n{table}"
    );

    let (a, b) = (&strict.pods[0], &strict.pods[1]);
    let remote = &cluster.hosts[1].pods[0];
    let short = Duration::from_secs(2);
    // Node 1's pods reach each other; nothing of theirs leaves for node 2 in clear.
    for (dst, want) in [(b.v4, a.v4), (b.v6, a.v6)] {
        assert_eq!(source_seen_within(&a.ns, &b.ns, dst, short), Ok(want));
    }
    for dst in [remote.v4, remote.v6] {
        let got = source_seen_within(&a.ns, &remote.ns, dst, short);
        assert!(
            got.is_err(),
            "node 1 -> node 2 pod {dst} went in clear: {got:?}"
        );
    }
    // Node 2 publishes no key: what it sends in clear is taken.
    for (dst, want) in [(a.v4, remote.v4), (a.v6, remote.v6)] {
        assert_eq!(source_seen_within(&remote.ns, &a.ns, dst, short), Ok(want));
    }
    // Node 2 publishes a key (its agent stopped, so nothing takes it off): node 1 now
    // expects its pod traffic encrypted and drops what comes in clear.
    cluster.host(2).kill_agent();
    annotate(&cluster, 2, Some(SOME_KEY));
    let strict = &cluster.hosts[0];
    wait(Duration::from_secs(10), "node 2 expected encrypted", || {
        strict
            .ns
            .exec_ok(&["nft", "list", "set", "inet", "cni_node_encryption", "in4"])
            .contains(&format!("{} . ", pod_cidr_v4(2)))
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", strict.agent_log()));
    let remote = &cluster.hosts[1].pods[0];
    let a = &strict.pods[0];
    for dst in [a.v4, a.v6] {
        let got = source_seen_within(&remote.ns, &a.ns, dst, short);
        assert!(
            got.is_err(),
            "node 2 -> node 1 pod {dst} taken in clear: {got:?}"
        );
    }
    let b = &strict.pods[1];
    assert_eq!(
        source_seen_within(&a.ns, &b.ns, b.v4, short),
        Ok(a.v4),
        "pods of one node are not touched"
    );

    // Strict mode off (the agent started again without it): its table goes, and pod
    // traffic between the nodes flows in clear again.
    let host = cluster.host(1);
    host.extra_args.retain(|a| a != "--encryption-strict");
    let kubeconfig = cluster.kubeconfig.clone();
    cluster.host(1).start_agent(&kubeconfig);
    let strict = &cluster.hosts[0];
    wait(Duration::from_secs(10), "the strict table removed", || {
        !strict
            .ns
            .exec_ok(&["nft", "list", "tables"])
            .contains("cni_node_encryption")
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", strict.agent_log()));
    let (a, remote) = (&strict.pods[0], &cluster.hosts[1].pods[0]);
    assert_eq!(
        source_seen_within(&a.ns, &remote.ns, remote.v4, short),
        Ok(a.v4)
    );
    assert_eq!(
        source_seen_within(&remote.ns, &a.ns, a.v6, short),
        Ok(remote.v6)
    );
}

/// `cni-node rotate-key` writes a new root-only key into the state directory (made
/// root-only) and prints its public key; a second rotation gives another key; over a
/// file that holds no key it writes one.
#[test]
fn rotate_key_writes_a_new_root_only_key_and_prints_its_public_key() {
    use std::os::unix::fs::MetadataExt;
    let dir = cni_blackbox::TempDir::new("cnibb-wg-key");
    let state = dir.path().join("state");
    let rotate = || {
        let out = std::process::Command::new(cni_blackbox::plugin_path("cni-node"))
            .args(["rotate-key", "--state-dir"])
            .arg(&state)
            .output()
            .unwrap_or_else(|e| panic!("run cni-node rotate-key: {e}"));
        assert!(
            out.status.success(),
            "rotate-key: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let first = rotate();
    assert_eq!(first.len(), 44, "{first:?}");
    let file = state.join("wireguard.key");
    let meta = std::fs::metadata(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(meta.mode() & 0o777, 0o600);
    let dir_mode = std::fs::metadata(&state)
        .unwrap_or_else(|e| panic!("{e}"))
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700);
    let second = rotate();
    assert_ne!(first, second);
    // Over a file that holds no key (which the agent refuses to use), rotation is the
    // way out: a new key.
    std::fs::write(&file, "garbage").unwrap_or_else(|e| panic!("{e}"));
    let third = rotate();
    assert_eq!(third.len(), 44, "{third:?}");
    assert_ne!(
        std::fs::read_to_string(&file).unwrap_or_default(),
        "garbage"
    );
}
