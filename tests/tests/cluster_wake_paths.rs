//! Every way the node agent (`cni-node`) is woken, each shown to reach the kernel on its
//! own: the agent runs with `--resync-interval 3600`, so a test here fails if only the
//! resync would have acted. In the namespace cluster of `cni_blackbox::cluster`.
//!
//! The paths and where each is proved:
//!
//! | path | what changes | what reaches the kernel | test |
//! |---|---|---|---|
//! | Node watch | a Node added, deleted | routes to its pod CIDRs | [`node_events_add_and_remove_routes`] |
//! | NetworkPolicy watch | a policy added | the pod's address in `ingress4` | [`api_events_of_policies_namespaces_and_pods_reach_the_policy_table`] |
//! | Namespace watch | a namespace's labels | a peer's address in the profile | same |
//! | Pod watch | a pod's labels | the pod's address leaves `ingress4` | same |
//! | pod records (inotify) | a record written, removed (nothing else changes); a pod added by the bridge plugin, its addresses not in the API | the pod's address in, out of `ingress4` | [`pod_record_notification_judges_a_new_pod_without_its_addresses_in_the_api`] |
//! | IPv4 / IPv6 address | the InternalIP added to, removed from a link | the conflist's MTU | [`address_notifications_move_the_pod_mtu_with_the_internal_ip`] |
//! | link | the uplink's MTU | the conflist's MTU | `cluster_agent.rs`: `link_notification_…` |
//! | IPv4 / IPv6 route | a route of the agent's deleted | the route back | `cluster_agent.rs`: `route_notification_…` |
//! | address removed (API connections) | the node renumbered | watches made again | `cluster_agent.rs`: `address_notification_…` |
//! | neighbour | a VXLAN FDB or neighbour entry deleted, each kind in each family | the entry back | `overlay.rs`: `neighbour_notification_…` (a VXLAN device deleted: link, in its first test) |
//! | a failed step's retry | a blocked conflist path fixed | `/readyz` 200 | `cluster_agent.rs`: `readyz_…` |
//!
//! Before each change the agent has been idle for a second, so nothing else (what the
//! node's setup stirred up) wakes it meanwhile. Each bound is generous (10 s: "it
//! happened"); the times are recorded (`cni_blackbox::measured`).

use std::collections::BTreeSet;
use std::fs;
use std::time::{Duration, Instant};

use cni_blackbox::cluster::{
    Cluster, Host, WITHOUT_RESYNC, node_name, node_object, node_v4, node_v6, routes_to, wait,
};
use cni_blackbox::measured::record_duration;
use cni_blackbox::require_root;
use cni_kube_api::{Kind, network_policy, realistic_namespace, realistic_pod};
use serde_json::{Value, json};

/// How long a change may take to reach the kernel before the test calls it lost.
const WITHIN: Duration = Duration::from_secs(10);

/// How long the agent must have made no pass before a test changes something, so that
/// nothing but the change can wake it ([`Host::wait_until_quiet`]).
const QUIET: Duration = Duration::from_secs(1);

/// A one-node cluster whose agent runs without a resync, its conflist written.
fn lone_node() -> Cluster {
    let cluster = Cluster::new_with(1, 1500, |h| h.resync_secs = WITHOUT_RESYNC);
    cluster.wait_for_conflists();
    cluster
}

/// Waits until `ok` holds, records how long that took as `what`, and fails the test
/// with `state()` and the agent's log if it does not within [`WITHIN`].
fn reaches(
    host: &Host,
    since: Instant,
    what: &str,
    mut ok: impl FnMut() -> bool,
    state: impl Fn() -> String,
) {
    let outcome = wait(WITHIN, what, &mut ok);
    let took = since.elapsed();
    if let Err(e) = outcome {
        panic!(
            "{e} (--resync-interval 3600: only the event path can act); now: {}\nagent log:\n{}",
            state(),
            host.agent_log()
        );
    }
    eprintln!("{what}: after {took:?}");
    record_duration(what, took);
}

#[test]
fn node_events_add_and_remove_routes() {
    if !require_root() {
        return;
    }
    let cluster = lone_node();
    let host = &cluster.hosts[0];
    let other = 5;
    let to_other: BTreeSet<String> = routes_to(other, &node_v4(other), &node_v6(other)).into();

    host.wait_until_quiet(QUIET);
    let t = Instant::now();
    cluster.api.apply_node(node_object(other));
    reaches(
        host,
        t,
        "Node watch: a Node added, routes to its pod CIDRs",
        || host.our_routes() == to_other,
        || format!("{:?}", host.our_routes()),
    );

    host.wait_until_quiet(QUIET);
    let t = Instant::now();
    cluster.api.delete_node(&node_name(other));
    reaches(
        host,
        t,
        "Node watch: a Node deleted, its routes gone",
        || host.our_routes().is_empty(),
        || format!("{:?}", host.our_routes()),
    );
}

/// The NetworkPolicy table of `host`'s namespace, as `nft` lists it (empty if none).
fn policy_table(host: &Host) -> String {
    let out = host
        .ns
        .exec(&["nft", "list", "table", "inet", "cni_node_policy"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The elements of map `name` (e.g. `ingress4`) in `table`, as listed.
fn map_elements(table: &str, name: &str) -> String {
    let Some(start) = table.find(&format!("map {name} {{")) else {
        return String::new();
    };
    let rest = &table[start..];
    let end = rest.find("\n\t}").unwrap_or(rest.len());
    rest[..end].to_owned()
}

/// Whether `address` is an element key of map `name` in `host`'s policy table.
fn in_map(host: &Host, name: &str, address: &str) -> bool {
    map_elements(&policy_table(host), name).contains(&format!("{address} : "))
}

/// A pod of the API only (no namespace of its own: the agent judges addresses, it never
/// looks into pods), `namespace/name` on node `node` with `labels` and `ips`.
fn api_pod(namespace: &str, name: &str, node: u8, ips: &[&str], labels: &[(&str, &str)]) -> Value {
    realistic_pod(namespace, name, &node_name(node), ips, labels)
}

#[test]
fn api_events_of_policies_namespaces_and_pods_reach_the_policy_table() {
    if !require_root() {
        return;
    }
    let cluster = lone_node();
    let host = &cluster.hosts[0];
    // A server pod on this node in namespace "shop", a client pod on another node in
    // namespace "team"; the client's namespace is not labelled yet.
    let server_ip = "10.244.1.50";
    let client_ip = "10.244.2.60";
    cluster
        .api
        .apply_namespace(realistic_namespace("shop", &[]));
    cluster
        .api
        .apply_namespace(realistic_namespace("team", &[]));
    cluster.api.apply_pod(api_pod(
        "shop",
        "server-7d9f8-abcde",
        1,
        &[server_ip, "fd00:244:0:1::50"],
        &[("app", "server")],
    ));
    cluster.api.apply_pod(api_pod(
        "team",
        "client-5c6b7-fghij",
        2,
        &[client_ip, "fd00:244:0:2::60"],
        &[("app", "client")],
    ));
    // Settled: the agent holds no policy yet, the pods are in its stores.
    wait(WITHIN, "the Pods listed", || {
        host.health("/metrics")
            .is_ok_and(|a| a.body.contains("cni_node_watched_objects{kind=\"Pod\"} 2"))
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", host.agent_log()));
    assert!(
        !in_map(host, "ingress4", server_ip),
        "{}",
        policy_table(host)
    );

    // NetworkPolicy watch: a policy selects the server, allowing namespaces of team blue.
    host.wait_until_quiet(QUIET);
    let t = Instant::now();
    cluster.api.apply_network_policy(network_policy(
        "shop",
        "server-from-blue",
        json!({
            "podSelector": {"matchLabels": {"app": "server"}},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}],
            }],
        }),
    ));
    reaches(
        host,
        t,
        "NetworkPolicy watch: a policy added, its pod isolated in the table",
        || in_map(host, "ingress4", server_ip),
        || policy_table(host),
    );
    assert!(
        !policy_table(host).contains(client_ip),
        "the client is allowed before its namespace is blue:\n{}",
        policy_table(host)
    );

    // Namespace watch: the client's namespace becomes blue; its pod's address is a
    // peer of the server's profile.
    host.wait_until_quiet(QUIET);
    let t = Instant::now();
    cluster
        .api
        .apply_namespace(realistic_namespace("team", &[("team", "blue")]));
    reaches(
        host,
        t,
        "Namespace watch: labels changed, a peer's address in the profile",
        || policy_table(host).contains(client_ip),
        || policy_table(host),
    );

    // Pod watch: the server loses the label the policy selects; it is isolated no more.
    host.wait_until_quiet(QUIET);
    let t = Instant::now();
    cluster.api.apply_pod(api_pod(
        "shop",
        "server-7d9f8-abcde",
        1,
        &[server_ip, "fd00:244:0:1::50"],
        &[("app", "retired")],
    ));
    reaches(
        host,
        t,
        "Pod watch: labels changed, the pod out of the policy's map",
        || !in_map(host, "ingress4", server_ip) && !policy_table(host).contains(client_ip),
        || policy_table(host),
    );
}

#[test]
fn pod_record_notification_judges_a_new_pod_without_its_addresses_in_the_api() {
    if !require_root() {
        return;
    }
    let mut cluster = lone_node();
    cluster
        .api
        .apply_namespace(realistic_namespace("shop", &[]));
    cluster.api.apply_network_policy(network_policy(
        "shop",
        "deny-to-web",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}),
    ));
    // The Pod as the API has it when the runtime sets it up: scheduled, no address yet
    // (the kubelet posts them only after the sandbox is up).
    let name = "web-6f7d8-klmno";
    cluster
        .api
        .apply_pod(api_pod("shop", name, 1, &[], &[("app", "web")]));
    let uid = cluster
        .api
        .get(Kind::Pod, "shop", name)
        .and_then(|pod| pod["metadata"]["uid"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("the API server gave shop/{name} no uid"));
    let host = cluster.host(1);
    wait(WITHIN, "the Pod listed", || {
        host.health("/metrics")
            .is_ok_and(|a| a.body.contains("cni_node_watched_objects{kind=\"Pod\"} 1"))
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", host.agent_log()));

    // A record alone, written as the bridge plugin writes it (a whole file renamed into
    // place) for an address no link of the node has: nothing but the directory's
    // notification tells the agent (no link, address or route changes).
    let by_hand = "10.244.1.77";
    let record = host.record_dir.join(by_hand);
    let staged = host.record_dir.join(format!(".{by_hand}.test"));
    // The agent makes the directory at start; made here too, so that an agent that
    // does not watch it fails below, not here.
    fs::create_dir_all(&host.record_dir)
        .unwrap_or_else(|e| panic!("mkdir {}: {e}", host.record_dir.display()));
    fs::write(&staged, format!("shop/{name}\nby-hand-{by_hand}\n"))
        .unwrap_or_else(|e| panic!("write {}: {e}", staged.display()));
    host.wait_until_quiet(QUIET);
    let t = Instant::now();
    fs::rename(&staged, &record).unwrap_or_else(|e| panic!("rename to {}: {e}", record.display()));
    reaches(
        host,
        t,
        "pod records (inotify): a record written, its address judged",
        || in_map(host, "ingress4", by_hand),
        || policy_table(host),
    );
    host.wait_until_quiet(QUIET);
    let t = Instant::now();
    fs::remove_file(&record).unwrap_or_else(|e| panic!("rm {}: {e}", record.display()));
    reaches(
        host,
        t,
        "pod records (inotify): a record removed, its address no longer judged",
        || !in_map(host, "ingress4", by_hand),
        || policy_table(host),
    );

    // The bridge plugin writes the pod's record (podRecordDir in the agent's conflist)
    // and holds its address pending until the agent has judged it.
    host.wait_until_quiet(QUIET);
    let t = Instant::now();
    let v4 = host.add_k8s_pod("shop", name, &uid).v4.to_string();
    let host = &cluster.hosts[0];
    reaches(
        host,
        t,
        "pod records (inotify): a new pod's address judged from its record",
        || in_map(host, "ingress4", &v4),
        || policy_table(host),
    );
    let posted = cluster
        .api
        .get(Kind::Pod, "shop", name)
        .map(|p| p["status"]["podIPs"].clone());
    assert!(
        posted
            .as_ref()
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty),
        "the pod's addresses are in the API ({posted:?}): the record was not what told the agent"
    );
}

/// Adds `address` (with its prefix) to `link` in `host`'s namespace without a prefix
/// route, so only the address itself changes.
fn add_address(host: &Host, address: &str, link: &str) {
    host.ns.exec_ok(&[
        "ip",
        "addr",
        "add",
        address,
        "dev",
        link,
        "noprefixroute",
        "nodad",
    ]);
}

#[test]
fn address_notifications_move_the_pod_mtu_with_the_internal_ip() {
    if !require_root() {
        return;
    }
    // The pod MTU is the MTU of the link that holds the node's InternalIP, else the
    // default route's link's (ul0, 1500). The InternalIPs here are on no link yet; a
    // second link of MTU 1400 gets them, one family at a time, and loses them.
    let (v4, v6) = ("203.0.113.11", "2001:db8:1::11");
    let mut cluster = Cluster::without_nodes(1500);
    let mut host = cluster.new_host(1, 1500);
    host.resync_secs = WITHOUT_RESYNC;
    host.ns.exec_ok(&[
        "ip", "link", "add", "ul1", "mtu", "1400", "type", "veth", "peer", "name", "ul1p", "mtu",
        "1400",
    ]);
    host.ns.exec_ok(&["ip", "link", "set", "ul1", "up"]);
    host.ns.exec_ok(&["ip", "link", "set", "ul1p", "up"]);
    let mut node = node_object(1);
    node["status"]["addresses"][0]["address"] = Value::from(v4);
    node["status"]["addresses"][1]["address"] = Value::from(v6);
    cluster.api.apply_node(node);
    host.start_agent(&cluster.kubeconfig);
    cluster.hosts.push(host);
    cluster.wait_for_conflists();
    let host = &cluster.hosts[0];
    let mtu = || host.conflist().map(|c| c["plugins"][0]["mtu"].clone());
    assert_eq!(mtu(), Some(Value::from(1500)), "{:?}", host.conflist());

    for (family, address, with_prefix) in [
        ("IPv4", v4, format!("{v4}/24")),
        ("IPv6", v6, format!("{v6}/64")),
    ] {
        host.wait_until_quiet(QUIET);
        let t = Instant::now();
        add_address(host, &with_prefix, "ul1");
        reaches(
            host,
            t,
            &format!("{family} address notification: the InternalIP added to a link"),
            || mtu() == Some(Value::from(1400)),
            || format!("MTU {:?}", mtu()),
        );
        host.wait_until_quiet(QUIET);
        let t = Instant::now();
        host.ns
            .exec_ok(&["ip", "addr", "del", &with_prefix, "dev", "ul1"]);
        reaches(
            host,
            t,
            &format!("{family} address notification: the InternalIP removed from its link"),
            || mtu() == Some(Value::from(1500)),
            || format!("MTU {:?}, {address} removed", mtu()),
        );
    }
}
