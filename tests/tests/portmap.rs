//! The portmap plugin chained after our bridge, the way libcni chains it (the bridge's
//! result is portmap's `prevResult`), on both backends, IPv4 and IPv6, with real
//! connections: a TCP server in the pod answers with the address it saw.
//!
//! The "node" is a throwaway netns with an uplink to a "client" netns (another machine
//! on the node's network). A host port must answer from that client through the node's
//! address, from the node itself (also on 127.0.0.1), from another pod on the bridge and
//! from the pod itself (hairpin); CHECK must fail once a rule is removed by hand; DEL
//! (without `prevResult`) must leave no rule. Mappings made by the reference `portmap`
//! are removed by ours and the other way round. A UDP client that keeps sending to a host
//! port reaches the new pod after the old one is replaced (stale conntrack entries).

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use cni_blackbox::hostport::{
    CLIENT_V4, CLIENT_V6, NODE_V4, NODE_V6, client_on_uplink, dnat_chain, peer_seen,
    serve_peer_address, socket as addr,
};
use cni_blackbox::underlay::socket_in;
use cni_blackbox::{Netns, Plugin, TempDir, require_root, unique_name};
use serde_json::{Value, json};

const REFERENCE: &str = "/usr/lib/cni/portmap";

fn serve(pod: &Netns) {
    serve_peer_address(pod.path(), 80);
}

fn connect(from: &Netns, to: SocketAddr) -> Result<String, String> {
    peer_seen(from.path(), to)
}

/// Calls `send` until `socket` (with a read timeout) receives a datagram, for at most
/// 5 s; `failure` is the assertion's message.
#[track_caller]
fn receive_while_sending(socket: &UdpSocket, send: &dyn Fn(), failure: &str) {
    let mut buf = [0u8; 16];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        send();
        if socket.recv_from(&mut buf).is_ok() {
            return;
        }
        assert!(Instant::now() < deadline, "{failure}");
    }
}

/// The node with its uplink and client, and the data dir of host-local.
struct Node {
    host: Netns,
    client: Netns,
    dir: TempDir,
    bridge: String,
}

impl Node {
    fn new() -> Self {
        let host = Netns::new("cnibb-pm-node");
        let client = client_on_uplink(&host);
        Self {
            host,
            client,
            dir: TempDir::new("cnibb-pm"),
            bridge: cni_blackbox::unique_ifname("cnibb"),
        }
    }

    fn bridge_conf(&self) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": "pmnet",
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": true,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": self.dir.path_str(),
                "ranges": [[{"subnet": "10.99.0.0/24"}], [{"subnet": "fd00:99::/64"}]],
                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]
            }
        })
    }

    /// A pod attached by our bridge; returns its netns, id and the bridge's result.
    fn pod(&self) -> (Netns, String, Value) {
        let pod = Netns::new("cnibb-pm-pod");
        pod.exec_ok(&["ip", "link", "set", "lo", "up"]);
        let id = unique_name("pm");
        let out = Plugin::new("bridge", &self.host)
            .command("ADD")
            .attachment(&id, &pod, "eth0")
            .config(&self.bridge_conf())
            .run();
        out.assert_success();
        (pod, id, out.json())
    }

    /// Firewall state of the node (iptables nat of both families, nft ruleset).
    fn firewall(&self) -> String {
        cni_blackbox::kernel::nat_and_nft(&self.host)
    }
}

fn portmap_conf(backend: Option<&str>, prev: Option<&Value>, mappings: &Value) -> Value {
    let mut conf = json!({
        "cniVersion": "1.0.0",
        "name": "pmnet",
        "type": "portmap",
        "runtimeConfig": {"portMappings": mappings},
    });
    if let Some(b) = backend {
        conf["backend"] = json!(b);
    }
    if let Some(prev) = prev {
        conf["prevResult"] = prev.clone();
    }
    conf
}

fn web_mappings() -> Value {
    json!([
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": 8081, "containerPort": 80, "protocol": "tcp", "hostIP": NODE_V4},
        {"hostPort": 8082, "containerPort": 80, "protocol": "tcp", "hostIP": NODE_V6}
    ])
}

fn run(
    binary: Option<&Path>,
    node: &Node,
    command: &str,
    id: &str,
    pod: &Netns,
    conf: &Value,
) -> cni_blackbox::Outcome {
    let plugin = match binary {
        Some(path) => Plugin::at(path, &node.host).cni_path("/usr/lib/cni"),
        None => Plugin::new("portmap", &node.host),
    };
    plugin
        .command(command)
        .attachment(id, pod, "eth0")
        .config(conf)
        .run()
}

/// No rule of container `id` is left in either backend.
#[track_caller]
fn assert_no_rules(node: &Node, id: &str) {
    let fw = node.firewall();
    let chain = dnat_chain("pmnet", id);
    assert!(!fw.contains(&chain), "chain {chain} left:\n{fw}");
    assert!(!fw.contains(id), "a rule of {id} left:\n{fw}");
}

fn chained_ports_work_and_leave_nothing(backend: &str) {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let (pod, id, result) = node.pod();
    let (other, _, _) = node.pod();
    serve(&pod);
    let conf = portmap_conf(Some(backend), Some(&result), &web_mappings());
    let out = run(None, &node, "ADD", &id, &pod, &conf);
    out.assert_success();
    assert_eq!(
        out.json(),
        result,
        "portmap passes the previous result through"
    );

    let pod_v4 = result["ips"][0]["address"]
        .as_str()
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    // From another machine, through the node's addresses: the client's own address.
    for to in [
        addr(NODE_V4, 8080),
        addr(NODE_V6, 8080),
        addr(NODE_V4, 8081),
        addr(NODE_V6, 8082),
    ] {
        let seen = connect(&node.client, to)
            .unwrap_or_else(|e| panic!("{backend}: client: {e}\n{}", node.firewall()));
        assert!(
            seen == CLIENT_V4 || seen == CLIENT_V6,
            "{backend}: {to} saw {seen}"
        );
    }
    // A hostIP mapping answers only on that address.
    assert!(
        connect(&node.client, addr(NODE_V6, 8081)).is_err(),
        "{backend}: 8081 answered on IPv6"
    );
    // From the node itself, also on localhost (IPv4).
    for to in [
        addr(NODE_V4, 8080),
        addr(NODE_V6, 8080),
        addr("127.0.0.1", 8080),
    ] {
        connect(&node.host, to)
            .unwrap_or_else(|e| panic!("{backend}: node: {e}\n{}", node.firewall()));
    }
    // Another pod on the bridge, and the pod itself (hairpin, masqueraded).
    for to in [addr(NODE_V4, 8080), addr(NODE_V6, 8080)] {
        connect(&other, to).unwrap_or_else(|e| panic!("{backend}: other pod: {e}"));
        let seen = connect(&pod, to)
            .unwrap_or_else(|e| panic!("{backend}: hairpin: {e}\n{}", node.firewall()));
        assert_ne!(seen, pod_v4, "{backend}: hairpin not masqueraded");
    }

    run(None, &node, "CHECK", &id, &pod, &conf).assert_success();
    // A rule removed by hand: CHECK fails.
    let chain = dnat_chain("pmnet", &id);
    match backend {
        "iptables" => node.host.exec_ok(&["iptables", "-t", "nat", "-F", &chain]),
        _ => node
            .host
            .exec_ok(&["nft", "flush", "chain", "ip", "cni_hostport", "hostports"]),
    };
    let out = run(None, &node, "CHECK", &id, &pod, &conf);
    out.assert_failure();

    // DEL without prevResult removes everything of the pod.
    let bare = portmap_conf(Some(backend), None, &web_mappings());
    run(None, &node, "DEL", &id, &pod, &bare).assert_success();
    run(None, &node, "DEL", &id, &pod, &bare).assert_success();
    assert_no_rules(&node, &id);
}

#[test]
fn iptables_host_ports_answer_everywhere_and_del_leaves_nothing() {
    chained_ports_work_and_leave_nothing("iptables");
}

#[test]
fn nftables_host_ports_answer_everywhere_and_del_leaves_nothing() {
    chained_ports_work_and_leave_nothing("nftables");
}

#[test]
fn mappings_of_the_reference_and_ours_remove_each_other() {
    if !require_root() || !Path::new(REFERENCE).exists() {
        return;
    }
    let node = Node::new();
    let (pod, id, result) = node.pod();
    serve(&pod);
    let conf = portmap_conf(Some("iptables"), Some(&result), &web_mappings());
    // Made by the reference, removed by ours.
    let reference_conf = {
        let mut c = conf.clone();
        c.as_object_mut().map(|o| o.remove("backend"));
        c
    };
    run(
        Some(Path::new(REFERENCE)),
        &node,
        "ADD",
        &id,
        &pod,
        &reference_conf,
    )
    .assert_success();
    connect(&node.client, addr(NODE_V4, 8080)).unwrap_or_else(|e| panic!("reference: {e}"));
    run(None, &node, "CHECK", &id, &pod, &conf).assert_success();
    run(None, &node, "DEL", &id, &pod, &conf).assert_success();
    assert_no_rules(&node, &id);
    // Made by ours, removed by the reference.
    run(None, &node, "ADD", &id, &pod, &conf).assert_success();
    connect(&node.client, addr(NODE_V4, 8080)).unwrap_or_else(|e| panic!("ours: {e}"));
    run(
        Some(Path::new(REFERENCE)),
        &node,
        "DEL",
        &id,
        &pod,
        &reference_conf,
    )
    .assert_success();
    assert_no_rules(&node, &id);
}

#[test]
fn bad_mappings_are_refused_with_code_7_and_leave_nothing() {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let (pod, id, result) = node.pod();
    let before = node.firewall();
    for (mappings, words) in [
        (
            json!([{"hostPort": 0, "containerPort": 80}]),
            "Invalid host port number: 0",
        ),
        (
            json!([{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}]),
            "\"icmp\"",
        ),
        (
            json!([{"hostPort": 80, "containerPort": 80, "hostIP": "nope"}]),
            "hostIP",
        ),
    ] {
        let out = run(
            None,
            &node,
            "ADD",
            &id,
            &pod,
            &portmap_conf(None, Some(&result), &mappings),
        );
        assert_eq!(out.error_code(), Some(7), "{out}");
        assert!(out.error_msg().unwrap_or_default().contains(words), "{out}");
    }
    let out = run(
        None,
        &node,
        "ADD",
        &id,
        &pod,
        &portmap_conf(None, None, &web_mappings()),
    );
    out.assert_error(7, "must be called as chained plugin");
    assert_eq!(
        node.firewall(),
        before,
        "a refused ADD changed the firewall"
    );
}

#[test]
fn udp_clients_reach_the_new_pod_after_a_replacement() {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let mappings = json!([{"hostPort": 5300, "containerPort": 53, "protocol": "udp"}]);
    let (old, old_id, old_result) = node.pod();
    let old_socket = socket_in(&old, addr("0.0.0.0", 53));
    old_socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .ok();
    run(
        None,
        &node,
        "ADD",
        &old_id,
        &old,
        &portmap_conf(None, Some(&old_result), &mappings),
    )
    .assert_success();
    let client = socket_in(&node.client, addr(CLIENT_V4, 40000));
    let send = || {
        client.send_to(b"ping", addr(NODE_V4, 5300)).ok();
    };
    receive_while_sending(&old_socket, &send, "the old pod never got a datagram");
    // The old pod goes; the client keeps sending from the same port (the conntrack
    // entry stays alive) while the new pod is added.
    run(
        None,
        &node,
        "DEL",
        &old_id,
        &old,
        &portmap_conf(None, None, &mappings),
    )
    .assert_success();
    Plugin::new("bridge", &node.host)
        .command("DEL")
        .attachment(&old_id, &old, "eth0")
        .config(&node.bridge_conf())
        .run()
        .assert_success();
    drop(old_socket);
    old.delete();
    send();
    let (new, new_id, new_result) = node.pod();
    let new_socket = socket_in(&new, addr("0.0.0.0", 53));
    new_socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .ok();
    send();
    run(
        None,
        &node,
        "ADD",
        &new_id,
        &new,
        &portmap_conf(None, Some(&new_result), &mappings),
    )
    .assert_success();
    receive_while_sending(
        &new_socket,
        &send,
        "the new pod never got a datagram: stale conntrack entry",
    );
}

/// GC removes the host ports of containers outside `cni.dev/valid-attachments` on both
/// backends and keeps the valid ones; STATUS answers for the backend.
#[test]
fn gc_removes_only_attachments_outside_the_valid_list() {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let (pod_a, id_a, result_a) = node.pod();
    let (pod_b, id_b, result_b) = node.pod();
    serve(&pod_a);
    for (backend, port) in [("iptables", 8080), ("nftables", 9080)] {
        let mappings = json!([{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]);
        for (pod, id, result) in [(&pod_a, &id_a, &result_a), (&pod_b, &id_b, &result_b)] {
            run(
                None,
                &node,
                "ADD",
                id,
                pod,
                &portmap_conf(Some(backend), Some(result), &mappings),
            )
            .assert_success();
        }
    }
    let gc = |valid: Value| {
        let mut conf = portmap_conf(None, None, &json!([]));
        conf["cniVersion"] = json!("1.1.0");
        conf["cni.dev/valid-attachments"] = valid;
        Plugin::new("portmap", &node.host)
            .command("GC")
            .config(&conf)
            .run()
    };
    gc(json!([{"containerID": id_a, "ifname": "eth0"}])).assert_success();
    let fw = node.firewall();
    assert!(!fw.contains(&id_b), "GC kept the rules of {id_b}:\n{fw}");
    assert!(
        fw.contains(&id_a),
        "GC removed the rules of valid {id_a}:\n{fw}"
    );
    for port in [8080, 9080] {
        connect(&node.client, addr(NODE_V4, port))
            .unwrap_or_else(|e| panic!("the valid pod's port {port} after GC: {e}"));
    }
    gc(json!([])).assert_success();
    assert_no_rules(&node, &id_a);

    let mut status = portmap_conf(Some("nftables"), None, &json!([]));
    status["cniVersion"] = json!("1.1.0");
    Plugin::new("portmap", &node.host)
        .command("STATUS")
        .config(&status)
        .run()
        .assert_success();
}

/// A container on two networks keeps both networks' host ports on nftables: the second
/// network's ADD appends, as the reference does, and does not replace the first's rules.
#[test]
fn a_container_on_two_networks_keeps_both_host_ports() {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let (pod, id, result) = node.pod();
    serve(&pod);
    for (network, port) in [("pmnet", 9090), ("pmnet2", 9091)] {
        let mut conf = portmap_conf(
            Some("nftables"),
            Some(&result),
            &json!([{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]),
        );
        conf["name"] = json!(network);
        run(None, &node, "ADD", &id, &pod, &conf).assert_success();
    }
    for port in [9090, 9091] {
        connect(&node.client, addr(NODE_V4, port))
            .unwrap_or_else(|e| panic!("host port {port} after both ADDs: {e}"));
    }
    for network in ["pmnet", "pmnet2"] {
        let mut conf = portmap_conf(Some("nftables"), None, &json!([]));
        conf["name"] = json!(network);
        run(None, &node, "DEL", &id, &pod, &conf).assert_success();
    }
    assert_no_rules(&node, &id);
}
