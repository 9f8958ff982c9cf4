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
