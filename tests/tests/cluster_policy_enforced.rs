//! ClusterNetworkPolicy enforced in the kernel, end to end: one node running `cni-node`
//! against the Kubernetes API test server, two pods of one namespace, a NetworkPolicy
//! that isolates the server and allows the client on port 80, then an Admin tier policy
//! that denies that.
//! The Admin tier is judged before NetworkPolicy, so its Deny wins over the allow; once
//! it is gone the allow holds again. The verdict chains count what they decided.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use cni_blackbox::cluster::{Cluster, node_name};
use cni_blackbox::netpol::{self, Outcome, Probe, Protocol, Servers};
use cni_blackbox::require_root;
use cni_kube_api::{
    Kind, cluster_network_policy, network_policy, realistic_namespace, realistic_pod,
};
use serde_json::json;

/// How long the agent may take to follow a change (a generous bound: it takes
/// milliseconds).
const DEADLINE: Duration = Duration::from_secs(30);
/// How long a probe waits for its answer (a denial is a drop: it always waits this).
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// One TCP probe from the namespace at `from` to `to` port `port`.
fn probe(from: &Path, to: IpAddr, port: u16) -> Outcome {
    let probes = [Probe {
        from: from.to_path_buf(),
        to: SocketAddr::new(to, port),
        protocol: Protocol::Tcp,
    }];
    netpol::run(&probes, PROBE_TIMEOUT, |_, _| false).remove(0)
}

/// Probes until the outcome is `want` (passed or dropped), for at most [`DEADLINE`];
/// a refusal or an error fails at once.
fn until(from: &Path, to: IpAddr, port: u16, pass: bool, what: &str, log: &dyn Fn() -> String) {
    let started = Instant::now();
    loop {
        let outcome = probe(from, to, port);
        assert!(!outcome.broken(), "{what}: {}\n{}", outcome.word(), log());
        if outcome.agrees(pass) {
            println!("{what}: after {:?}", started.elapsed());
            return;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{what}: still {} after {DEADLINE:?}\nagent log:\n{}",
            outcome.word(),
            log()
        );
    }
}

#[test]
fn an_admin_deny_wins_over_a_network_policy_allow() {
    if !require_root() {
        return;
    }
    let mut cluster = Cluster::new(1, 1500);
    cluster.wait_for_conflists();
    cluster.api.install_crd(Kind::ClusterNetworkPolicy);
    cluster
        .api
        .apply_namespace(realistic_namespace("x", &[("ns", "x")]));
    let mut pods = Vec::new();
    for name in ["client", "server"] {
        let labels = [("pod", name)];
        cluster
            .api
            .apply_pod(realistic_pod("x", name, &node_name(1), &[], &labels));
        let uid = cluster
            .api
            .get(Kind::Pod, "x", name)
            .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("no uid for x/{name}"));
        let pod = cluster.host(1).add_k8s_pod("x", name, &uid);
        let (path, v4, v6) = (pod.ns.path().to_path_buf(), pod.v4, pod.v6);
        let ips = [v4.to_string(), v6.to_string()];
        let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
        cluster
            .api
            .apply_pod(realistic_pod("x", name, &node_name(1), &ips, &labels));
        pods.push((path, v4));
    }
    let (client, _) = pods[0].clone();
    let (server_ns, server) = pods[1].clone();
    let _servers = Servers::start(&server_ns, &[80, 81]);
    let host = &cluster.hosts[0];
    let log = || host.agent_log();

    // NetworkPolicy isolates the server and allows the client on TCP 80.
    cluster.api.apply_network_policy(network_policy(
        "x",
        "allow-client",
        json!({"podSelector": {"matchLabels": {"pod": "server"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "client"}}}],
                            "ports": [{"protocol": "TCP", "port": 80}]}]}),
    ));
    // In force once it isolates the server: port 81 is not allowed.
    let isolates = "NetworkPolicy isolates the server";
    until(&client, server, 81, false, isolates, &log);
    let allows = "NetworkPolicy allows client -> server";
    until(&client, server, 80, true, allows, &log);

    // The Admin tier denies it: judged first, its Deny wins.
    cluster
        .api
        .apply_cluster_network_policy(cluster_network_policy(
            "deny-client",
            json!({"tier": "Admin", "priority": 10,
                   "subject": {"namespaces": {"matchLabels": {"ns": "x"}}},
                   "ingress": [{"name": "no-client", "action": "Deny",
                                "from": [{"pods": {"namespaceSelector": {},
                                                   "podSelector": {"matchLabels": {"pod": "client"}}}}],
                                "protocols": [{"tcp": {"destinationPort": {"number": 80}}}]}]}),
        ));
    let denied = "the Admin Deny wins over the allow";
    until(&client, server, 80, false, denied, &log);
    // The denial went through the rule's verdict chain, which counted it.
    let table = host
        .ns
        .exec_ok(&["nft", "list", "table", "inet", "cni_node_policy"]);
    let admin = table
        .lines()
        .skip_while(|l| !l.contains("map admin-ingress4"))
        .take(4)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        admin.contains(&server.to_string()),
        "the server's address is in the Admin tier's map:\n{table}"
    );
    let counted = table
        .lines()
        .any(|l| l.contains("ct state new counter packets") && !l.contains("counter packets 0 "));
    assert!(counted, "some verdict chain counted a connection:\n{table}");
    let ready = host.health("/readyz").unwrap_or_else(|e| panic!("{e}"));
    assert!(
        ready
            .body
            .contains("ClusterNetworkPolicy: enforced (1 policies: 1 Admin, 0 Baseline)"),
        "{}",
        ready.body
    );

    // Gone: NetworkPolicy's allow holds again.
    cluster.api.delete_cluster_network_policy("deny-client");
    let again = "without it the allow holds again";
    until(&client, server, 80, true, again, &log);
    assert!(
        probe(&client, server, 81).dropped(),
        "NetworkPolicy still isolates the server"
    );
}
