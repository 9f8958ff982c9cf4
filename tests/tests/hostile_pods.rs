//! What one pod on the bridge can do to its neighbours. Each test stages the attack from a
//! pod netns (the attacker holds `CAP_NET_RAW` there, as under containerd's defaults) and
//! checks the neighbour, also with the protection turned off, which shows that the
//! attack is real and the test can fail.
//!
//! - Rogue router advertisements: by default a pod whose addresses come from IPAM takes
//!   no router advertisement (no IPv6 default route, no SLAAC address), on an IPv4-only
//!   network and on a dual-stack one; `acceptRouterAdvertisements: true` keeps them.

mod bridge_support;

use std::time::{Duration, Instant};

use bridge_support::Net;
use cni_blackbox::{Netns, require_root, unique_name};
use serde_json::json;

/// The prefix the rogue router advertises.
const ROGUE_PREFIX: &str = "2001:db8:77::";

/// Sends one router advertisement from `ns`'s `eth0` to all nodes (`ff02::1`): router
/// lifetime 1800 s and the autonomous prefix [`ROGUE_PREFIX`]/64, hop limit 255, from the
/// link-local address, as a real router sends it. Python's raw ICMPv6 socket crafts it;
/// the kernel fills in the checksum.
fn send_router_advertisement(ns: &Netns) {
    const SCRIPT: &str = r#"
import socket, struct, sys
ifindex = socket.if_nametoindex("eth0")
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, ifindex)
ra = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0)
prefix = socket.inet_pton(socket.AF_INET6, sys.argv[1])
pi = struct.pack("!BBBBIII16s", 3, 4, 64, 0xC0, 86400, 14400, 0, prefix)
s.sendto(ra + pi, ("ff02::1", 0, 0, ifindex))
"#;
    ns.exec_ok(&["python3", "-c", SCRIPT, ROGUE_PREFIX]);
}

/// `ip -6 route` default routes and global addresses in the rogue prefix, of `eth0`.
fn taken_from_rogue(ns: &Netns) -> Vec<String> {
    let mut out: Vec<String> = ns
        .exec_ok(&["ip", "-6", "route", "show", "default"])
        .lines()
        .map(|l| format!("route: {l}"))
        .collect();
    out.extend(
        ns.exec_ok(&["ip", "-6", "addr", "show", "dev", "eth0"])
            .lines()
            .filter(|l| l.contains(ROGUE_PREFIX.trim_end_matches(':')))
            .map(|l| format!("address: {}", l.trim())),
    );
    out
}

/// Two pods on one network; the first advertises itself as a router for 3 s (a
/// datagram every 300 ms). Returns what the second one took from it.
fn rogue_router_outcome(subnets: &[&str], extra: &serde_json::Value) -> Vec<String> {
    let net = Net::new();
    let conf = net.conf("1.0.0", subnets, extra);
    let attacker = net.pod();
    let victim = net.pod();
    for pod in [&attacker, &victim] {
        net.run("ADD", &conf, &unique_name("ra"), pod, "eth0")
            .assert_success();
    }
    // The attacker's own netns is its to configure: IPv6 on, a link-local to send from.
    attacker.exec_ok(&["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=0"]);
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        send_router_advertisement(&attacker);
        if !taken_from_rogue(&victim).is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    taken_from_rogue(&victim)
}

#[test]
fn rogue_router_advertisements_give_neighbours_nothing_by_default() {
    if !require_root() {
        return;
    }
    for subnets in [&["10.61.0.0/24"][..], &["10.62.0.0/24", "fd00:62::/64"][..]] {
        let taken = rogue_router_outcome(subnets, &json!({}));
        assert!(
            taken.is_empty(),
            "{subnets:?}: the neighbour took the rogue router's {taken:#?}"
        );
    }
}

#[test]
fn accepting_router_advertisements_is_a_choice_and_the_attack_is_real() {
    if !require_root() {
        return;
    }
    let taken = rogue_router_outcome(
        &["10.63.0.0/24"],
        &json!({"acceptRouterAdvertisements": true}),
    );
    assert!(
        taken
            .iter()
            .any(|t| t.starts_with("route: default via fe80")),
        "with acceptRouterAdvertisements the neighbour should take the route: {taken:?}"
    );
}

/// Two pods on a dual-stack gateway network, with `extra` merged into the config.
struct Neighbours {
    net: Net,
    attacker: Netns,
    victim: Netns,
    conf: serde_json::Value,
    /// The victim's addresses, IPv4 then IPv6.
    victim_ips: (String, String),
}

const SUBNETS: [&str; 2] = ["10.64.0.0/24", "fd00:64::/64"];
const NODE_V4: &str = "10.64.0.1";
const NODE_V6: &str = "fd00:64::1";

impl Neighbours {
    fn new(extra: &serde_json::Value) -> Self {
        let net = Net::new();
        let mut keys = json!({"isGateway": true});
        bridge_support::merge(&mut keys, extra);
        let conf = net.conf("1.0.0", &SUBNETS, &keys);
        let attacker = net.pod();
        let victim = net.pod();
        let mut victim_ips = (String::new(), String::new());
        for (pod, is_victim) in [(&attacker, false), (&victim, true)] {
            let add = net.run("ADD", &conf, &unique_name("nb"), pod, "eth0");
            add.assert_success();
            if is_victim {
                let ips = add.json()["ips"].as_array().cloned().unwrap_or_default();
                let addr = |v6: bool| {
                    ips.iter()
                        .filter_map(|ip| ip["address"].as_str())
                        .find(|a| a.contains(':') == v6)
                        .and_then(|a| a.split('/').next())
                        .unwrap_or_default()
                        .to_owned()
                };
                victim_ips = (addr(false), addr(true));
            }
        }
        // The node's IPv6 addresses on the bridge are usable once out of DAD (the
        // gateway's never enters it; the bridge's link-local address does).
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && !net
                .host
                .exec_ok(&["ip", "-6", "addr", "show", "dev", &net.bridge, "tentative"])
                .trim()
                .is_empty()
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        Neighbours {
            net,
            attacker,
            victim,
            conf,
            victim_ips,
        }
    }

    /// The node's neighbour entry for `ip` on the bridge: its MAC, if it has one.
    fn node_neighbour_mac(&self, ip: &str) -> Option<String> {
        let out = self
            .net
            .host
            .exec_ok(&["ip", "neigh", "show", ip, "dev", &self.net.bridge]);
        let words: Vec<&str> = out.split_whitespace().collect();
        words
            .windows(2)
            .find(|w| w[0] == "lladdr")
            .map(|w| w[1].to_owned())
    }
}

/// Starts a UDP receiver in `ns` on `addr`:`port` for `seconds`; returns it once it
/// listens. Its output is the sorted source addresses it heard from.
fn udp_sources(ns: &Netns, addr: &str, port: u16, seconds: f32) -> std::process::Child {
    const SCRIPT: &str = r#"
import socket, sys, time
addr, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_DGRAM)
s.bind((addr, port))
s.settimeout(0.1)
print("ready", flush=True)
seen, end = set(), time.time() + seconds
while time.time() < end:
    try:
        seen.add(s.recvfrom(64)[1][0])
    except socket.timeout:
        pass
print("\n".join(sorted(seen)))
"#;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "python3", "-c", SCRIPT, addr])
        .args([port.to_string(), seconds.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    let stdout = child.stdout.as_mut().expect("piped stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("ready");
    assert_eq!(line.trim(), "ready", "the UDP receiver did not start");
    child
}

/// Sends UDP datagrams from `ns` with the source address `source` (not its own: bound
/// with `IP_TRANSPARENT`, which `CAP_NET_RAW` allows) to `dst`:`port`, ten times over a
/// second.
fn send_udp_as(ns: &Netns, source: &str, dst: &str, port: u16) {
    const SCRIPT: &str = r#"
import socket, sys, time
src, dst, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
v6 = ":" in src
s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
if v6:
    s.setsockopt(socket.IPPROTO_IPV6, 75, 1)  # IPV6_TRANSPARENT
else:
    s.setsockopt(socket.IPPROTO_IP, 19, 1)  # IP_TRANSPARENT
s.bind((src, 0))
for _ in range(10):
    s.sendto(b"who am i", (dst, port))
    time.sleep(0.1)
"#;
    ns.exec_ok(&["python3", "-c", SCRIPT, source, dst, &port.to_string()]);
}

/// The sources the node heard when the attacker sent as the victim, per family.
fn spoofed_sources_heard(n: &Neighbours) -> Vec<String> {
    let mut heard = Vec::new();
    for (node, victim) in [(NODE_V4, &n.victim_ips.0), (NODE_V6, &n.victim_ips.1)] {
        let receiver = udp_sources(&n.net.host, node, 5353, 1.8);
        send_udp_as(&n.attacker, victim, node, 5353);
        let out = receiver.wait_with_output().expect("receiver output");
        heard.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| *l == victim.as_str())
                .map(str::to_owned),
        );
    }
    heard
}

#[test]
fn port_security_stops_a_pod_sending_as_its_neighbour() {
    if !require_root() {
        return;
    }
    let open = Neighbours::new(&json!({}));
    let heard = spoofed_sources_heard(&open);
    assert_eq!(
        heard.len(),
        2,
        "without portSecurity the node should hear the forged sources (the attack is real): {heard:?}"
    );
    let guarded = Neighbours::new(&json!({"portSecurity": true}));
    let heard = spoofed_sources_heard(&guarded);
    assert!(
        heard.is_empty(),
        "with portSecurity the node heard {heard:?}"
    );
}

/// Sends ARP requests from `ns` that claim `claimed_ip` is at `ns`'s own MAC, to
/// `target_ip` (the node), ten times over a second. A request addressed to the node is
/// enough: the node updates its entry for the sender address at once.
fn forge_arp(ns: &Netns, claimed_ip: &str, target_ip: &str) {
    const SCRIPT: &str = r#"
import socket, struct, sys, time
mac = bytes.fromhex(open("/sys/class/net/eth0/address").read().strip().replace(":", ""))
spa, tpa = socket.inet_aton(sys.argv[1]), socket.inet_aton(sys.argv[2])
arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + spa + bytes(6) + tpa
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("eth0", 0))
for _ in range(10):
    s.send(b"\xff" * 6 + mac + b"\x08\x06" + arp)
    time.sleep(0.1)
"#;
    ns.exec_ok(&["python3", "-c", SCRIPT, claimed_ip, target_ip]);
}

/// Sends unsolicited neighbour advertisements from `ns` (override flag, its own MAC in
/// the target link-layer option) for `target`, to all nodes, ten times over a second.
fn forge_neighbour_advertisement(ns: &Netns, target: &str) {
    const SCRIPT: &str = r#"
import socket, struct, sys, time
mac = bytes.fromhex(open("/sys/class/net/eth0/address").read().strip().replace(":", ""))
ifindex = socket.if_nametoindex("eth0")
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 255)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, ifindex)
na = struct.pack("!BBHI", 136, 0, 0, 0x20000000) + socket.inet_pton(socket.AF_INET6, sys.argv[1])
na += struct.pack("!BB", 2, 1) + mac
for _ in range(10):
    s.sendto(na, ("ff02::1", 0, 0, ifindex))
    time.sleep(0.1)
"#;
    ns.exec_ok(&["python3", "-c", SCRIPT, target]);
}

/// After the node has talked to the victim, the attacker claims the victim's IPv4
/// address (forged ARP) and IPv6 address (forged neighbour advertisement). Returns the
/// node's entries for the victim's addresses that now point at the attacker.
fn neighbour_entries_taken(n: &Neighbours) -> Vec<String> {
    let attacker_mac = bridge_support::mac_of(&n.attacker, "eth0");
    let (v4, v6) = &n.victim_ips;
    for ip in [v4, v6] {
        bridge_support::ping(&n.net.host, ip).unwrap_or_else(|e| panic!("{ip}: {e}"));
    }
    // The kernel ignores ARP updates within a second of the last one (locktime).
    std::thread::sleep(Duration::from_millis(1100));
    forge_arp(&n.attacker, v4, NODE_V4);
    forge_neighbour_advertisement(&n.attacker, v6);
    [v4, v6]
        .into_iter()
        .filter(|ip| n.node_neighbour_mac(ip).as_deref() == Some(attacker_mac.as_str()))
        .map(|ip| ip.to_owned())
        .collect()
}

#[test]
fn port_security_stops_forged_arp_and_neighbour_advertisements() {
    if !require_root() {
        return;
    }
    let open = Neighbours::new(&json!({}));
    let taken = neighbour_entries_taken(&open);
    assert_eq!(
        taken.len(),
        2,
        "without portSecurity the attacker should take both entries (the attack is real): {taken:?}"
    );
    let guarded = Neighbours::new(&json!({"portSecurity": true}));
    let taken = neighbour_entries_taken(&guarded);
    assert!(
        taken.is_empty(),
        "with portSecurity the attacker took the node's entries for {taken:?}"
    );
    // The victim is still reachable where it is.
    for ip in [&guarded.victim_ips.0, &guarded.victim_ips.1] {
        bridge_support::ping(&guarded.net.host, ip).unwrap_or_else(|e| panic!("{ip}: {e}"));
    }
}

#[test]
fn port_security_stops_router_advertisements_even_to_pods_that_accept_them() {
    if !require_root() {
        return;
    }
    let taken = rogue_router_outcome(
        &["10.65.0.0/24", "fd00:65::/64"],
        &json!({"acceptRouterAdvertisements": true, "portSecurity": true}),
    );
    assert!(
        taken.is_empty(),
        "with portSecurity the neighbour took the rogue router's {taken:#?}"
    );
}

#[test]
fn port_security_keeps_the_pods_own_traffic_and_leaves_nothing() {
    if !require_root() {
        return;
    }
    // Beside the spoof check and nftables masquerade, with DAD on in the pods.
    let n = Neighbours::new(&json!({
        "portSecurity": true,
        "enabledad": true,
        "macspoofchk": true,
        "ipMasq": true,
        "ipMasqBackend": "nftables",
    }));
    let attacker_ips: Vec<String> = bridge_support::global_addrs(&n.attacker, "-4", "eth0")
        .into_iter()
        .chain(bridge_support::global_addrs(&n.attacker, "-6", "eth0"))
        .collect();
    assert_eq!(attacker_ips.len(), 2, "{attacker_ips:?}");
    // Node to pods and back, pod to pod, both families; and link-local between pods.
    for (from, to) in [
        (&n.attacker, NODE_V4),
        (&n.attacker, NODE_V6),
        (&n.attacker, n.victim_ips.0.as_str()),
        (&n.attacker, n.victim_ips.1.as_str()),
        (&n.net.host, n.victim_ips.0.as_str()),
        (&n.net.host, n.victim_ips.1.as_str()),
    ] {
        bridge_support::ping(from, to).unwrap_or_else(|e| panic!("{to}: {e}"));
    }
    let link_local = eui64_link_local(&bridge_support::mac_of(&n.victim, "eth0"));
    bridge_support::ping(&n.attacker, &format!("{link_local}%eth0"))
        .unwrap_or_else(|e| panic!("link-local {link_local}: {e}"));

    // CHECK passes, and fails once a rule is removed by hand.
    let id = unique_name("own");
    let pod = n.net.pod();
    let add = n.net.run("ADD", &n.conf, &id, &pod, "eth0");
    add.assert_success();
    let mut check = n.conf.clone();
    check["prevResult"] = add.json();
    n.net
        .run("CHECK", &check, &id, &pod, "eth0")
        .assert_success();
    // This attachment's MAC element, as nft prints it, removed by hand.
    let rs = n.net.nft();
    let veth = add.json()["interfaces"][1]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mac = bridge_support::mac_of(&pod, "eth0");
    assert!(rs.contains(&format!("\"{veth}\" . {mac}")), "{rs}");
    n.net.host.exec_ok(&[
        "nft",
        "delete",
        "element",
        "bridge",
        "cni_port_security",
        "port_macs",
        &format!("{{ \"{veth}\" . {mac} }}"),
    ]);
    let out = n.net.run("CHECK", &check, &id, &pod, "eth0");
    assert!(
        !out.success(),
        "CHECK passed without the MAC element:\n{out}"
    );
    let msg = out.json()["msg"].as_str().unwrap_or_default().to_owned();
    assert!(msg.contains(&format!("\"{veth}\" . {mac}")), "{out}");

    n.net
        .run("DEL", &n.conf, &id, &pod, "eth0")
        .assert_success();
    let rs = n.net.nft();
    assert!(!rs.contains(&veth), "DEL left {veth}'s elements:\n{rs}");
    assert!(!rs.contains(&id), "DEL left {id}'s elements:\n{rs}");
}

/// The link-local address EUI-64 generation gives an interface with MAC `mac`.
fn eui64_link_local(mac: &str) -> String {
    let b: Vec<u8> = mac
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).expect("a MAC"))
        .collect();
    let groups = [
        u16::from_be_bytes([b[0] ^ 2, b[1]]),
        u16::from_be_bytes([b[2], 0xff]),
        u16::from_be_bytes([0xfe, b[3]]),
        u16::from_be_bytes([b[4], b[5]]),
    ];
    let ip = std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, groups[0], groups[1], groups[2], groups[3]);
    ip.to_string()
}

#[test]
fn port_security_needs_ipam() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let conf = net.conf("1.0.0", &[], &json!({"portSecurity": true}));
    let pod = net.pod();
    let out = net.run("ADD", &conf, &unique_name("l2"), &pod, "eth0");
    assert!(!out.success(), "{out}");
    assert_eq!(out.json()["code"], 7, "{out}");
    assert!(
        out.json()["msg"]
            .as_str()
            .unwrap_or_default()
            .contains("portSecurity"),
        "{out}"
    );
    net.assert_nothing_left("a refused layer-2 portSecurity ADD");
}
