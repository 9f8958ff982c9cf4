//! Two underlay segments joined by a router, for the multi-node tests: segment A is the
//! harness's underlay bridge (`ulbr`, 198.18.0.0/24, fd00:18::/64), segment B a second
//! bridge (`ulbr2`, 198.19.0.0/24, fd00:19::/64) in the same underlay namespace, and the
//! router a namespace on both that has no route to any pod CIDR. Nodes on one segment
//! reach each other directly; across the router only through a tunnel.

use std::collections::BTreeMap;
use std::net::IpAddr;

use cni_kube_api::realistic_node;

use crate::Netns;
use crate::cluster::{
    Cluster, Host, Segment, node_name, node_v4, node_v6, pod_cidr_v4, pod_cidr_v6,
};
use crate::underlay::{address, attach};

/// The router's IPv4 address on segment A (the harness's underlay).
pub const ROUTER_A_V4: &str = "198.18.0.254";
/// The router's IPv6 address on segment A.
pub const ROUTER_A_V6: &str = "fd00:18::fe";
/// The router's IPv4 address on segment B.
pub const ROUTER_B_V4: &str = "198.19.0.254";
/// The router's IPv6 address on segment B.
pub const ROUTER_B_V6: &str = "fd00:19::fe";

/// Node `n`'s IPv4 address on segment B.
pub fn b_v4(n: u8) -> String {
    format!("198.19.0.{}", 10 + n)
}
/// Node `n`'s IPv6 address on segment B.
pub fn b_v6(n: u8) -> String {
    format!("fd00:19::{:x}", 0x10 + n)
}

/// Where a node is and its InternalIPs.
#[derive(Debug, Clone)]
pub struct Place {
    /// `'A'` or `'B'`.
    pub segment: char,
    /// Its IPv4 InternalIP.
    pub v4: String,
    /// Its IPv6 InternalIP.
    pub v6: String,
}

/// Node `n` on segment A, at the harness's addresses for it.
pub fn on_a(n: u8) -> Place {
    Place {
        segment: 'A',
        v4: node_v4(n),
        v6: node_v6(n),
    }
}

/// Node `n` on segment B.
pub fn on_b(n: u8) -> Place {
    Place {
        segment: 'B',
        v4: b_v4(n),
        v6: b_v6(n),
    }
}

/// The Node object of node `n` at `place`.
pub fn node_at(n: u8, place: &Place) -> serde_json::Value {
    realistic_node(
        &node_name(n),
        &[&pod_cidr_v4(n), &pod_cidr_v6(n)],
        &[&place.v4, &place.v6],
        40,
    )
}

/// One `ping` with DF set and `size` bytes of payload from `from` to `to`.
pub fn df_ping(from: &Netns, to: IpAddr, size: u32) -> Result<(), String> {
    let family = if to.is_ipv4() { "-4" } else { "-6" };
    let size = size.to_string();
    let to = to.to_string();
    let out = from.exec(&[
        "ping", family, "-n", "-c", "1", "-W", "2", "-M", "do", "-s", &size, &to,
    ]);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ping -M do -s {size} {to}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Segment B's bridge and the router between the segments; the API server's
/// namespace answers segment B through the router.
pub fn second_segment(cluster: &Cluster) -> Netns {
    let ul = &cluster.underlay;
    ul.exec_ok(&[
        "ip", "link", "add", "ulbr2", "mtu", "1500", "type", "bridge",
    ]);
    ul.exec_ok(&["ip", "link", "set", "ulbr2", "up"]);
    let router = Netns::new("cnibb-ovl-router");
    attach(ul, "ulbr", &router, "rtr-a");
    address(&router, ROUTER_A_V4, "24");
    address(&router, ROUTER_A_V6, "64");
    ul.exec_ok(&[
        "ip",
        "link",
        "add",
        "rtr-b",
        "type",
        "veth",
        "peer",
        "name",
        "ul1",
        "netns",
        router.name(),
    ]);
    ul.exec_ok(&["ip", "link", "set", "rtr-b", "master", "ulbr2", "up"]);
    router.exec_ok(&["ip", "link", "set", "ul1", "up"]);
    router.exec_ok(&[
        "ip",
        "addr",
        "add",
        &format!("{ROUTER_B_V4}/24"),
        "dev",
        "ul1",
    ]);
    router.exec_ok(&[
        "ip",
        "addr",
        "add",
        &format!("{ROUTER_B_V6}/64"),
        "dev",
        "ul1",
        "nodad",
    ]);
    router.exec_ok(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    router.exec_ok(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    ul.exec_ok(&["ip", "route", "add", "198.19.0.0/24", "via", ROUTER_A_V4]);
    router
}

/// A node on segment A (`mtu` on its uplink), with routes to segment B through the router.
pub fn host_on_a(cluster: &Cluster, n: u8, mtu: u32) -> Host {
    let host = cluster.new_host(n, mtu);
    segment_a_routes(&host.ns);
    host
}

/// The routes of a node on segment A to segment B, through the router.
pub fn segment_a_routes(ns: &Netns) {
    ns.exec_ok(&["ip", "route", "add", "198.19.0.0/24", "via", ROUTER_A_V4]);
    ns.exec_ok(&[
        "ip",
        "-6",
        "route",
        "add",
        "fd00:19::/64",
        "via",
        ROUTER_A_V6,
    ]);
}

/// A node on segment B (`mtu` on its uplink), its default routes through the router.
pub fn host_on_b(cluster: &Cluster, n: u8, mtu: u32) -> Host {
    cluster.new_host_on(
        n,
        mtu,
        &Segment {
            bridge: "ulbr2",
            v4: b_v4(n),
            v6: b_v6(n),
            gateway_v4: ROUTER_B_V4.to_owned(),
            gateway_v6: ROUTER_B_V6.to_owned(),
        },
    )
}

/// The cluster with nodes `on_a_nodes` on segment A and `on_b_nodes` on segment B
/// (namespaces, no Node objects or agents yet; `mtu` on every underlay link), the router,
/// and where each node is.
pub fn two_segments(
    on_a_nodes: &[u8],
    on_b_nodes: &[u8],
    mtu: u32,
) -> (Cluster, Netns, BTreeMap<u8, Place>) {
    let mut cluster = Cluster::without_nodes(mtu);
    let router = second_segment(&cluster);
    let mut places: BTreeMap<u8, Place> = BTreeMap::new();
    for &n in on_a_nodes {
        let host = host_on_a(&cluster, n, mtu);
        cluster.hosts.push(host);
        places.insert(n, on_a(n));
    }
    for &n in on_b_nodes {
        let host = host_on_b(&cluster, n, mtu);
        cluster.hosts.push(host);
        places.insert(n, on_b(n));
    }
    (cluster, router, places)
}
