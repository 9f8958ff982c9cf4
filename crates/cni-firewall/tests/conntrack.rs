//! Root tests of the UDP conntrack deletion against the real kernel: entries
//! are made by sending datagrams over loopback in a fresh network namespace
//! whose nftables rules use conntrack, then deleted by destination port.
//!
//! Each test body runs on a thread that first moves into a private network
//! namespace (the shared harness): the namespace has no name to leak and
//! goes away with the thread, even when an assertion fails, and the
//! conntrack entries of the machine's own namespace are never seen.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};

use cni_firewall::conntrack::{self, UdpEntry};
use nix::libc;

mod common;
use common::{feed, in_netns, privileged, sh};

const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;

/// Host ports of the test: A is the one whose entries go, B stays.
const PORT_A: u16 = 5300;
const PORT_B: u16 = 5301;
/// Client sockets per port, each its own entry.
const CLIENTS: usize = 2;

/// Loopback up, and a rule in each family that needs conntrack, so that the
/// namespace tracks the datagrams sent below.
fn namespace_with_conntrack() {
    sh("ip", &["link", "set", "lo", "up"]);
    feed(
        "nft",
        &["-f", "-"],
        "add table ip t
add chain ip t c { type filter hook output priority 0; }
add rule ip t c ct state new counter
add table ip6 t
add chain ip6 t c { type filter hook output priority 0; }
add rule ip6 t c ct state new counter
",
    );
}

/// Sends a few datagrams to `port` from `CLIENTS` sockets bound to `addr`
/// (nobody listens: the entries are made on the way out).
fn send(addr: IpAddr, port: u16) {
    for _ in 0..CLIENTS {
        let client = UdpSocket::bind((addr, 0)).unwrap();
        for _ in 0..3 {
            client.send_to(b"ping", (addr, port)).unwrap();
        }
    }
}

/// The number of UDP entries of `family` to `port`, checking they are ours.
fn entries_to(family: u8, addr: IpAddr, port: u16) -> usize {
    let entries: Vec<UdpEntry> = conntrack::udp_entries(family)
        .unwrap()
        .into_iter()
        .filter(|e| e.dst_port == port)
        .collect();
    for e in &entries {
        assert_eq!((e.src, e.dst), (addr, addr), "{entries:?}");
    }
    entries.len()
}

fn deletes_only_the_port_asked_for(family: u8, addr: IpAddr) {
    assert_eq!(entries_to(family, addr, PORT_A), CLIENTS);
    assert_eq!(entries_to(family, addr, PORT_B), CLIENTS);
    let deleted = conntrack::delete_udp_by_dst_port(family, PORT_A).unwrap();
    assert_eq!(deleted, CLIENTS);
    assert_eq!(entries_to(family, addr, PORT_A), 0);
    assert_eq!(entries_to(family, addr, PORT_B), CLIENTS);
    assert_eq!(
        conntrack::delete_udp_by_dst_port(family, PORT_A).unwrap(),
        0
    );
}

#[test]
fn udp_entries_of_one_port_are_deleted_per_family() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        namespace_with_conntrack();
        let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        for addr in [v4, v6] {
            send(addr, PORT_A);
            send(addr, PORT_B);
        }
        deletes_only_the_port_asked_for(AF_INET, v4);
        // The other family's entries to the same port are left alone.
        assert_eq!(entries_to(AF_INET6, v6, PORT_A), CLIENTS);
        deletes_only_the_port_asked_for(AF_INET6, v6);
        assert_eq!(entries_to(AF_INET, v4, PORT_B), CLIENTS);
        // Several ports at once, as portmap asks.
        for (family, addr) in [(AF_INET, v4), (AF_INET6, v6)] {
            let deleted = conntrack::delete_udp_by_dst_ports(family, &[PORT_A, PORT_B]).unwrap();
            assert_eq!(deleted, CLIENTS);
            assert_eq!(entries_to(family, addr, PORT_B), 0);
        }
    });
}

#[test]
fn a_namespace_without_tracked_traffic_has_nothing_to_delete() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        sh("ip", &["link", "set", "lo", "up"]);
        send(IpAddr::V4(Ipv4Addr::LOCALHOST), PORT_A);
        for family in [AF_INET, AF_INET6] {
            assert_eq!(conntrack::udp_entries(family).unwrap(), []);
            assert_eq!(
                conntrack::delete_udp_by_dst_port(family, PORT_A).unwrap(),
                0
            );
        }
    });
}
