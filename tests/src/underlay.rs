//! A layer-2 "underlay" between test hosts, and UDP probes between namespaces: the
//! pieces the multi-node tests share. Traffic is UDP between sockets opened inside the
//! namespaces (a thread enters the namespace, binds, and hands the socket back), so the
//! receiver reads the sender's address as it arrived, without capture tools.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use crate::names::unique_name;
use crate::netns::Netns;

/// A veth from the bridge `bridge` in `underlay` into `ns` (as `ul0`, up), named `port`
/// on the bridge; `lo` of `ns` is brought up too.
pub fn attach(underlay: &Netns, bridge: &str, ns: &Netns, port: &str) {
    underlay.exec_ok(&[
        "ip",
        "link",
        "add",
        port,
        "type",
        "veth",
        "peer",
        "name",
        "ul0",
        "netns",
        ns.name(),
    ]);
    underlay.exec_ok(&["ip", "link", "set", port, "master", bridge, "up"]);
    ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
    ns.exec_ok(&["ip", "link", "set", "ul0", "up"]);
}

/// A new namespace standing for one node of a simulated cluster: `lo` up, and an
/// underlay link `ul0` (up, 100.64.0.1/16) whose veth peer `ul1` stays in the namespace,
/// up, so that the link has a carrier and the other nodes' addresses are on it.
pub fn lone_node(prefix: &str) -> Netns {
    let ns = Netns::new(prefix);
    ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
    ns.exec_ok(&[
        "ip", "link", "add", "ul0", "type", "veth", "peer", "name", "ul1",
    ]);
    ns.exec_ok(&["ip", "addr", "add", "100.64.0.1/16", "dev", "ul0"]);
    ns.exec_ok(&["ip", "link", "set", "ul0", "up"]);
    ns.exec_ok(&["ip", "link", "set", "ul1", "up"]);
    ns
}

/// Adds `ip/prefix` to `ul0` in `ns` (IPv6 without duplicate address detection, so it is
/// usable at once: the test's own underlay has no duplicates).
pub fn address(ns: &Netns, ip: &str, prefix: &str) {
    let cidr = format!("{ip}/{prefix}");
    let mut argv = vec!["ip", "addr", "add", &cidr, "dev", "ul0"];
    if ip.contains(':') {
        argv.push("nodad");
    }
    ns.exec_ok(&argv);
}

/// A UDP socket bound to `addr` inside `ns`: a short-lived thread enters the namespace
/// and makes it; the socket stays in that namespace whichever thread uses it.
pub fn socket_in(ns: &Netns, addr: SocketAddr) -> UdpSocket {
    let name = ns.name().to_owned();
    crate::hostport::in_netns(ns.path(), move || {
        UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr} in {name}: {e}"))
    })
}

/// Sends datagrams from a socket in `from` to `to` (a socket bound there, in `to_ns`)
/// until one arrives, and returns the source address the receiver saw. Bounded (10 s):
/// the first packets may wait for neighbour resolution.
pub fn source_seen(from: &Netns, to_ns: &Netns, to: IpAddr) -> Result<IpAddr, String> {
    source_seen_within(from, to_ns, to, Duration::from_secs(10))
}

/// [`source_seen`] with its own bound.
pub fn source_seen_within(
    from: &Netns,
    to_ns: &Netns,
    to: IpAddr,
    within: Duration,
) -> Result<IpAddr, String> {
    let receiver = socket_in(to_ns, SocketAddr::new(to, 0));
    let target = receiver
        .local_addr()
        .map_err(|e| format!("local_addr: {e}"))?;
    let any: IpAddr = if to.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let sender = socket_in(from, SocketAddr::new(any, 0));
    receiver
        .set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(|e| e.to_string())?;
    let token = unique_name("udp-token");
    let deadline = Instant::now() + within;
    let mut last_error = String::new();
    while Instant::now() < deadline {
        if let Err(e) = sender.send_to(token.as_bytes(), target) {
            // Unreachable until neighbours resolve: retry like a lost datagram.
            last_error = format!("send_to {target}: {e}");
        }
        let mut buf = [0u8; 128];
        match receiver.recv_from(&mut buf) {
            Ok((len, source)) if buf[..len] == *token.as_bytes() => return Ok(source.ip()),
            Ok(_) => {}
            Err(e) => last_error = format!("recv_from: {e}"),
        }
    }
    Err(format!(
        "nothing from {} reached {target}: {last_error}",
        from.name()
    ))
}
