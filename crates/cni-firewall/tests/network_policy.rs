//! Root tests of the NetworkPolicy datapath (`network_policy`): the table as nft
//! prints it (and as nft itself makes it), real traffic between pods on a bridge and
//! from a pod to itself through a Service address, the transactions' sizes, scale,
//! and validation.
//!
//! Every test runs on a thread that first moves into a fresh network namespace (the
//! "node"); pods are named namespaces of their own, deleted by guards. Nothing here
//! touches the machine's own network namespace.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cni_firewall::Error;
use cni_firewall::network_policy::{
    self, Allow, Changes, DenyLog, Direction, PeerRule, PolicyState, PolicyTable, Profile,
    ProfileVerdicts, TABLE, TierBox, TierProfile, TierRange, TierRow, VerdictAction,
};
use nix::sched::{CloneFlags, setns};

mod common;
use common::{feed, in_netns, privileged, ruleset, sh};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn allow(first: &str, last: &str, protocols: (u8, u8), ports: (u16, u16)) -> Allow {
    Allow {
        first: ip(first),
        last: ip(last),
        protocols,
        ports,
    }
}

fn peer(set: &str, protocols: (u8, u8), ports: (u16, u16)) -> PeerRule {
    PeerRule {
        set: set.into(),
        protocols,
        ports,
    }
}

fn listing() -> String {
    sh("nft", &["list", "table", "inet", TABLE])
}

/// Two pods, two profiles: pod 10.9.0.2 (and fd09::2) isolated for ingress by
/// `aa11`, pod 10.9.0.3 isolated for egress by `bb22`.
fn small_state() -> PolicyState {
    let mut s = PolicyState::default();
    s.ingress_profiles.insert(
        "aa11".into(),
        Profile {
            allow: vec![
                allow("10.9.0.0", "10.9.0.127", (6, 6), (80, 81)),
                Allow::all_traffic(ip("10.8.0.1"), ip("10.8.0.1")),
                allow("fd09::", "fd09::ffff", (17, 17), (53, 53)),
            ],
            peers: vec![
                peer("pp01", (6, 6), (8080, 8080)),
                peer("pp02", (0, 255), (0, 65535)),
            ],
            verdicts: None,
        },
    );
    s.egress_profiles.insert(
        "bb22".into(),
        Profile {
            allow: vec![allow("0.0.0.0", "255.255.255.255", (17, 17), (53, 53))],
            peers: vec![peer("pp01", (6, 17), (1000, 2000))],
            verdicts: None,
        },
    );
    s.peer_sets
        .insert("pp01".into(), [ip("10.9.0.4"), ip("fd09::4")].into());
    s.peer_sets.insert("pp02".into(), [ip("10.8.0.9")].into());
    s.ingress.insert(ip("10.9.0.2"), "aa11".into());
    s.ingress.insert(ip("fd09::2"), "aa11".into());
    s.egress.insert(ip("10.9.0.3"), "bb22".into());
    // bb22 counts what it allows and denies; pod 10.9.0.2's egress is judged by the
    // Admin tier first (TCP 22 to the first half of its subnet and to 10.9.0.200
    // denied, DNS over IPv6 passed to NetworkPolicy), pod 10.9.0.3's ingress by the
    // Baseline tier (all denied, for NetworkPolicy does not isolate it).
    s.verdict_chains
        .insert("v-allow1".into(), VerdictAction::Accept);
    s.verdict_chains
        .insert("v-deny1".into(), VerdictAction::Drop);
    s.verdict_chains.insert(
        "v-pass1".into(),
        VerdictAction::ToNetworkPolicy(Direction::Egress),
    );
    s.egress_profiles.get_mut("bb22").unwrap().verdicts = Some(ProfileVerdicts {
        allow: "v-allow1".into(),
        deny: "v-deny1".into(),
    });
    s.admin
        .egress_rows
        .insert("r1".into(), row(&[tier_only(6, 22, "v-deny1")]));
    s.admin
        .egress_rows
        .insert("r2".into(), row(&[tier_only(17, 53, "v-pass1")]));
    s.admin.egress_profiles.insert(
        "cc33".into(),
        tier_profile(
            &[("10.9.0.200", "r1")],
            &[
                ("10.9.0.0", "10.9.0.127", "r1"),
                ("fd09::", "fd09::ffff", "r2"),
            ],
        ),
    );
    s.admin.egress.insert(ip("10.9.0.2"), "cc33".into());
    s.baseline.ingress_rows.insert(
        "r3".into(),
        row(&[tier_box((0, 255), (0, 65535), "v-deny1")]),
    );
    s.baseline.ingress_profiles.insert(
        "dd44".into(),
        tier_profile(&[], &[("0.0.0.0", "255.255.255.255", "r3")]),
    );
    s.baseline.ingress.insert(ip("10.9.0.3"), "dd44".into());
    s.deny_log = Some(DenyLog {
        group: 5,
        per_second: 10,
    });
    s
}

fn tier_box(protocols: (u8, u8), ports: (u16, u16), chain: &str) -> TierBox {
    TierBox {
        protocols,
        ports,
        chain: chain.into(),
    }
}

/// A box of one protocol and port.
fn tier_only(protocol: u8, port: u16, chain: &str) -> TierBox {
    tier_box((protocol, protocol), (port, port), chain)
}

fn row(boxes: &[TierBox]) -> TierRow {
    TierRow {
        boxes: boxes.to_vec(),
    }
}

/// A tier profile: single peers and ranges (first, last), each with its row.
fn tier_profile(peers: &[(&str, &str)], ranges: &[(&str, &str, &str)]) -> Arc<TierProfile> {
    Arc::new(TierProfile {
        peers: peers.iter().map(|(a, r)| (ip(a), (*r).into())).collect(),
        ranges: ranges
            .iter()
            .map(|(first, last, r)| TierRange {
                first: ip(first),
                last: ip(last),
                row: (*r).into(),
            })
            .collect(),
    })
}

/// What `nft list table inet cni_node_policy` prints for [`small_state`].
const SMALL_LISTING: &str = "table inet cni_node_policy {
	map ingress4 {
		type ipv4_addr : verdict
		elements = { 10.9.0.2 : goto ingress-aa11 }
	}

	map ingress6 {
		type ipv6_addr : verdict
		elements = { fd09::2 : goto ingress-aa11 }
	}

	map egress4 {
		type ipv4_addr : verdict
		elements = { 10.9.0.3 : goto egress-bb22 }
	}

	map egress6 {
		type ipv6_addr : verdict
	}

	map admin-ingress4 {
		type ipv4_addr : verdict
	}

	map admin-ingress6 {
		type ipv6_addr : verdict
	}

	map admin-egress4 {
		type ipv4_addr : verdict
		elements = { 10.9.0.2 : goto admin-egress-cc33 }
	}

	map admin-egress6 {
		type ipv6_addr : verdict
	}

	map baseline-ingress4 {
		type ipv4_addr : verdict
		elements = { 10.9.0.3 : goto baseline-ingress-dd44 }
	}

	map baseline-ingress6 {
		type ipv6_addr : verdict
	}

	map baseline-egress4 {
		type ipv4_addr : verdict
	}

	map baseline-egress6 {
		type ipv6_addr : verdict
	}

	set pending4 {
		type ipv4_addr
	}

	set pending6 {
		type ipv6_addr
	}

	set peer-pp01-v4 {
		type ipv4_addr
		elements = { 10.9.0.4 }
	}

	set peer-pp01-v6 {
		type ipv6_addr
		elements = { fd09::4 }
	}

	set peer-pp02-v4 {
		type ipv4_addr
		elements = { 10.8.0.9 }
	}

	set peer-pp02-v6 {
		type ipv6_addr
	}

	set ingress-aa11-v4 {
		type ipv4_addr . inet_proto . inet_service
		flags interval
		elements = { 10.8.0.1 . 0-255 . 0-65535,
			     10.9.0.0/25 . tcp . 80-81 }
	}

	set ingress-aa11-v6 {
		type ipv6_addr . inet_proto . inet_service
		flags interval
		elements = { fd09::/112 . udp . 53 }
	}

	set egress-bb22-v4 {
		type ipv4_addr . inet_proto . inet_service
		flags interval
		elements = { 0.0.0.0/0 . udp . 53 }
	}

	set egress-bb22-v6 {
		type ipv6_addr . inet_proto . inet_service
		flags interval
	}

	map admin-egress-row-r1-keys {
		type inet_proto . inet_service : verdict
		flags interval
		elements = { tcp . 22 : goto v-deny1 }
	}

	map admin-egress-row-r2-keys {
		type inet_proto . inet_service : verdict
		flags interval
		elements = { udp . 53 : goto v-pass1 }
	}

	map admin-egress-cc33-peers4 {
		type ipv4_addr : verdict
		elements = { 10.9.0.200 : goto admin-egress-row-r1 }
	}

	map admin-egress-cc33-ranges4 {
		type ipv4_addr . inet_proto : verdict
		flags interval
		elements = { 10.9.0.0/25 . 0-255 : goto admin-egress-row-r1 }
	}

	map admin-egress-cc33-peers6 {
		type ipv6_addr : verdict
	}

	map admin-egress-cc33-ranges6 {
		type ipv6_addr . inet_proto : verdict
		flags interval
		elements = { fd09::/112 . 0-255 : goto admin-egress-row-r2 }
	}

	map baseline-ingress-row-r3-keys {
		type inet_proto . inet_service : verdict
		flags interval
		elements = { 0-255 . 0-65535 : goto v-deny1 }
	}

	map baseline-ingress-dd44-peers4 {
		type ipv4_addr : verdict
	}

	map baseline-ingress-dd44-ranges4 {
		type ipv4_addr . inet_proto : verdict
		flags interval
		elements = { 0.0.0.0/0 . 0-255 : goto baseline-ingress-row-r3 }
	}

	map baseline-ingress-dd44-peers6 {
		type ipv6_addr : verdict
	}

	map baseline-ingress-dd44-ranges6 {
		type ipv6_addr . inet_proto : verdict
		flags interval
	}

	chain forward {
		type filter hook forward priority filter; policy accept;
		ct direction reply accept
		ct state related accept
		icmpv6 type 133-137 accept
		ip saddr @pending4 drop
		ip daddr @pending4 drop
		ip6 saddr @pending6 drop
		ip6 daddr @pending6 drop
		jump judge-egress
		jump judge-ingress
	}

	chain input {
		type filter hook input priority filter; policy accept;
		ct direction reply accept
		ct state related accept
		icmpv6 type 133-137 accept
		ip saddr @pending4 drop
		ip6 saddr @pending6 drop
		jump judge-egress
	}

	chain baseline-egress {
		ip saddr vmap @baseline-egress4
		ip6 saddr vmap @baseline-egress6
	}

	chain baseline-ingress {
		ip daddr vmap @baseline-ingress4
		ip6 daddr vmap @baseline-ingress6
	}

	chain np-egress {
		ip saddr vmap @egress4
		ip6 saddr vmap @egress6
		goto baseline-egress
	}

	chain np-ingress {
		ip daddr vmap @ingress4
		ip6 daddr vmap @ingress6
		goto baseline-ingress
	}

	chain judge-egress {
		ip saddr vmap @admin-egress4
		ip6 saddr vmap @admin-egress6
		goto np-egress
	}

	chain judge-ingress {
		ip daddr vmap @admin-ingress4
		ip6 daddr vmap @admin-ingress6
		goto np-ingress
	}

	chain v-allow1 {
		ct state new counter packets 0 bytes 0
		return
	}

	chain v-deny1 {
		ct state new counter packets 0 bytes 0
		ct state new limit rate 10/second log prefix \"v-deny1\" group 5
		drop
	}

	chain v-pass1 {
		ct state new counter packets 0 bytes 0
		goto np-egress
	}

	chain ingress-aa11 {
		ip saddr . meta l4proto . th dport @ingress-aa11-v4 accept
		ip6 saddr . meta l4proto . th dport @ingress-aa11-v6 accept
		ip saddr @peer-pp01-v4 tcp dport 8080 accept
		ip6 saddr @peer-pp01-v6 tcp dport 8080 accept
		ip saddr @peer-pp02-v4 accept
		ip6 saddr @peer-pp02-v6 accept
		drop
	}

	chain egress-bb22 {
		ip daddr . meta l4proto . th dport @egress-bb22-v4 goto v-allow1
		ip6 daddr . meta l4proto . th dport @egress-bb22-v6 goto v-allow1
		ip daddr @peer-pp01-v4 meta l4proto 6-17 th dport 1000-2000 goto v-allow1
		ip6 daddr @peer-pp01-v6 meta l4proto 6-17 th dport 1000-2000 goto v-allow1
		goto v-deny1
	}

	chain admin-egress-row-r1 {
		meta l4proto . th dport vmap @admin-egress-row-r1-keys
		goto np-egress
	}

	chain admin-egress-row-r2 {
		meta l4proto . th dport vmap @admin-egress-row-r2-keys
		goto np-egress
	}

	chain admin-egress-cc33 {
		ip daddr vmap @admin-egress-cc33-peers4
		ip daddr . meta l4proto vmap @admin-egress-cc33-ranges4
		ip6 daddr vmap @admin-egress-cc33-peers6
		ip6 daddr . meta l4proto vmap @admin-egress-cc33-ranges6
		goto np-egress
	}

	chain baseline-ingress-row-r3 {
		meta l4proto . th dport vmap @baseline-ingress-row-r3-keys
	}

	chain baseline-ingress-dd44 {
		ip saddr vmap @baseline-ingress-dd44-peers4
		ip saddr . meta l4proto vmap @baseline-ingress-dd44-ranges4
		ip6 saddr vmap @baseline-ingress-dd44-peers6
		ip6 saddr . meta l4proto vmap @baseline-ingress-dd44-ranges6
	}
}
";

/// The same table made by `nft` itself, in the order our transaction makes it.
const SMALL_BY_NFT: &str = "add table inet cni_node_policy
add map inet cni_node_policy ingress4 { type ipv4_addr : verdict; }
add map inet cni_node_policy ingress6 { type ipv6_addr : verdict; }
add map inet cni_node_policy egress4 { type ipv4_addr : verdict; }
add map inet cni_node_policy egress6 { type ipv6_addr : verdict; }
add map inet cni_node_policy admin-ingress4 { type ipv4_addr : verdict; }
add map inet cni_node_policy admin-ingress6 { type ipv6_addr : verdict; }
add map inet cni_node_policy admin-egress4 { type ipv4_addr : verdict; }
add map inet cni_node_policy admin-egress6 { type ipv6_addr : verdict; }
add map inet cni_node_policy baseline-ingress4 { type ipv4_addr : verdict; }
add map inet cni_node_policy baseline-ingress6 { type ipv6_addr : verdict; }
add map inet cni_node_policy baseline-egress4 { type ipv4_addr : verdict; }
add map inet cni_node_policy baseline-egress6 { type ipv6_addr : verdict; }
add set inet cni_node_policy pending4 { type ipv4_addr; }
add set inet cni_node_policy pending6 { type ipv6_addr; }
add chain inet cni_node_policy forward { type filter hook forward priority filter; policy accept; }
add chain inet cni_node_policy input { type filter hook input priority filter; policy accept; }
add chain inet cni_node_policy baseline-egress
add chain inet cni_node_policy baseline-ingress
add chain inet cni_node_policy np-egress
add chain inet cni_node_policy np-ingress
add chain inet cni_node_policy judge-egress
add chain inet cni_node_policy judge-ingress
add chain inet cni_node_policy v-allow1
add rule inet cni_node_policy v-allow1 ct state new counter
add rule inet cni_node_policy v-allow1 return
add chain inet cni_node_policy v-deny1
add rule inet cni_node_policy v-deny1 ct state new counter
add rule inet cni_node_policy v-deny1 ct state new limit rate 10/second burst 5 packets log prefix \"v-deny1\" group 5
add rule inet cni_node_policy v-deny1 drop
add chain inet cni_node_policy v-pass1
add rule inet cni_node_policy v-pass1 ct state new counter
add rule inet cni_node_policy v-pass1 goto np-egress
add set inet cni_node_policy peer-pp01-v4 { type ipv4_addr; }
add element inet cni_node_policy peer-pp01-v4 { 10.9.0.4 }
add set inet cni_node_policy peer-pp01-v6 { type ipv6_addr; }
add element inet cni_node_policy peer-pp01-v6 { fd09::4 }
add set inet cni_node_policy peer-pp02-v4 { type ipv4_addr; }
add element inet cni_node_policy peer-pp02-v4 { 10.8.0.9 }
add set inet cni_node_policy peer-pp02-v6 { type ipv6_addr; }
add set inet cni_node_policy ingress-aa11-v4 { type ipv4_addr . inet_proto . inet_service; flags interval; }
add element inet cni_node_policy ingress-aa11-v4 { 10.8.0.1 . 0-255 . 0-65535, 10.9.0.0-10.9.0.127 . 6 . 80-81 }
add set inet cni_node_policy ingress-aa11-v6 { type ipv6_addr . inet_proto . inet_service; flags interval; }
add element inet cni_node_policy ingress-aa11-v6 { fd09::-fd09::ffff . 17 . 53 }
add chain inet cni_node_policy ingress-aa11
add rule inet cni_node_policy ingress-aa11 ip saddr . meta l4proto . th dport @ingress-aa11-v4 accept
add rule inet cni_node_policy ingress-aa11 ip6 saddr . meta l4proto . th dport @ingress-aa11-v6 accept
add rule inet cni_node_policy ingress-aa11 ip saddr @peer-pp01-v4 meta l4proto 6 th dport 8080 accept
add rule inet cni_node_policy ingress-aa11 ip6 saddr @peer-pp01-v6 meta l4proto 6 th dport 8080 accept
add rule inet cni_node_policy ingress-aa11 ip saddr @peer-pp02-v4 accept
add rule inet cni_node_policy ingress-aa11 ip6 saddr @peer-pp02-v6 accept
add rule inet cni_node_policy ingress-aa11 drop
add set inet cni_node_policy egress-bb22-v4 { type ipv4_addr . inet_proto . inet_service; flags interval; }
add element inet cni_node_policy egress-bb22-v4 { 0.0.0.0-255.255.255.255 . 17 . 53 }
add set inet cni_node_policy egress-bb22-v6 { type ipv6_addr . inet_proto . inet_service; flags interval; }
add chain inet cni_node_policy egress-bb22
add rule inet cni_node_policy egress-bb22 ip daddr . meta l4proto . th dport @egress-bb22-v4 goto v-allow1
add rule inet cni_node_policy egress-bb22 ip6 daddr . meta l4proto . th dport @egress-bb22-v6 goto v-allow1
add rule inet cni_node_policy egress-bb22 ip daddr @peer-pp01-v4 meta l4proto >= 6 meta l4proto <= 17 th dport >= 1000 th dport <= 2000 goto v-allow1
add rule inet cni_node_policy egress-bb22 ip6 daddr @peer-pp01-v6 meta l4proto >= 6 meta l4proto <= 17 th dport >= 1000 th dport <= 2000 goto v-allow1
add rule inet cni_node_policy egress-bb22 goto v-deny1
add map inet cni_node_policy admin-egress-row-r1-keys { type inet_proto . inet_service : verdict; flags interval; }
add element inet cni_node_policy admin-egress-row-r1-keys { 6 . 22 : goto v-deny1 }
add chain inet cni_node_policy admin-egress-row-r1
add rule inet cni_node_policy admin-egress-row-r1 meta l4proto . th dport vmap @admin-egress-row-r1-keys
add rule inet cni_node_policy admin-egress-row-r1 goto np-egress
add map inet cni_node_policy admin-egress-row-r2-keys { type inet_proto . inet_service : verdict; flags interval; }
add element inet cni_node_policy admin-egress-row-r2-keys { 17 . 53 : goto v-pass1 }
add chain inet cni_node_policy admin-egress-row-r2
add rule inet cni_node_policy admin-egress-row-r2 meta l4proto . th dport vmap @admin-egress-row-r2-keys
add rule inet cni_node_policy admin-egress-row-r2 goto np-egress
add map inet cni_node_policy admin-egress-cc33-peers4 { type ipv4_addr : verdict; }
add map inet cni_node_policy admin-egress-cc33-ranges4 { type ipv4_addr . inet_proto : verdict; flags interval; }
add element inet cni_node_policy admin-egress-cc33-peers4 { 10.9.0.200 : goto admin-egress-row-r1 }
add element inet cni_node_policy admin-egress-cc33-ranges4 { 10.9.0.0-10.9.0.127 . 0-255 : goto admin-egress-row-r1 }
add map inet cni_node_policy admin-egress-cc33-peers6 { type ipv6_addr : verdict; }
add map inet cni_node_policy admin-egress-cc33-ranges6 { type ipv6_addr . inet_proto : verdict; flags interval; }
add element inet cni_node_policy admin-egress-cc33-ranges6 { fd09::-fd09::ffff . 0-255 : goto admin-egress-row-r2 }
add chain inet cni_node_policy admin-egress-cc33
add rule inet cni_node_policy admin-egress-cc33 ip daddr vmap @admin-egress-cc33-peers4
add rule inet cni_node_policy admin-egress-cc33 ip daddr . meta l4proto vmap @admin-egress-cc33-ranges4
add rule inet cni_node_policy admin-egress-cc33 ip6 daddr vmap @admin-egress-cc33-peers6
add rule inet cni_node_policy admin-egress-cc33 ip6 daddr . meta l4proto vmap @admin-egress-cc33-ranges6
add rule inet cni_node_policy admin-egress-cc33 goto np-egress
add map inet cni_node_policy baseline-ingress-row-r3-keys { type inet_proto . inet_service : verdict; flags interval; }
add element inet cni_node_policy baseline-ingress-row-r3-keys { 0-255 . 0-65535 : goto v-deny1 }
add chain inet cni_node_policy baseline-ingress-row-r3
add rule inet cni_node_policy baseline-ingress-row-r3 meta l4proto . th dport vmap @baseline-ingress-row-r3-keys
add map inet cni_node_policy baseline-ingress-dd44-peers4 { type ipv4_addr : verdict; }
add map inet cni_node_policy baseline-ingress-dd44-ranges4 { type ipv4_addr . inet_proto : verdict; flags interval; }
add element inet cni_node_policy baseline-ingress-dd44-ranges4 { 0.0.0.0-255.255.255.255 . 0-255 : goto baseline-ingress-row-r3 }
add map inet cni_node_policy baseline-ingress-dd44-peers6 { type ipv6_addr : verdict; }
add map inet cni_node_policy baseline-ingress-dd44-ranges6 { type ipv6_addr . inet_proto : verdict; flags interval; }
add chain inet cni_node_policy baseline-ingress-dd44
add rule inet cni_node_policy baseline-ingress-dd44 ip saddr vmap @baseline-ingress-dd44-peers4
add rule inet cni_node_policy baseline-ingress-dd44 ip saddr . meta l4proto vmap @baseline-ingress-dd44-ranges4
add rule inet cni_node_policy baseline-ingress-dd44 ip6 saddr vmap @baseline-ingress-dd44-peers6
add rule inet cni_node_policy baseline-ingress-dd44 ip6 saddr . meta l4proto vmap @baseline-ingress-dd44-ranges6
add rule inet cni_node_policy baseline-egress ip saddr vmap @baseline-egress4
add rule inet cni_node_policy baseline-egress ip6 saddr vmap @baseline-egress6
add rule inet cni_node_policy baseline-ingress ip daddr vmap @baseline-ingress4
add rule inet cni_node_policy baseline-ingress ip6 daddr vmap @baseline-ingress6
add rule inet cni_node_policy np-egress ip saddr vmap @egress4
add rule inet cni_node_policy np-egress ip6 saddr vmap @egress6
add rule inet cni_node_policy np-egress goto baseline-egress
add rule inet cni_node_policy np-ingress ip daddr vmap @ingress4
add rule inet cni_node_policy np-ingress ip6 daddr vmap @ingress6
add rule inet cni_node_policy np-ingress goto baseline-ingress
add rule inet cni_node_policy judge-egress ip saddr vmap @admin-egress4
add rule inet cni_node_policy judge-egress ip6 saddr vmap @admin-egress6
add rule inet cni_node_policy judge-egress goto np-egress
add rule inet cni_node_policy judge-ingress ip daddr vmap @admin-ingress4
add rule inet cni_node_policy judge-ingress ip6 daddr vmap @admin-ingress6
add rule inet cni_node_policy judge-ingress goto np-ingress
add rule inet cni_node_policy forward ct direction reply accept
add rule inet cni_node_policy forward ct state related accept
add rule inet cni_node_policy forward icmpv6 type 133-137 accept
add rule inet cni_node_policy forward ip saddr @pending4 drop
add rule inet cni_node_policy forward ip daddr @pending4 drop
add rule inet cni_node_policy forward ip6 saddr @pending6 drop
add rule inet cni_node_policy forward ip6 daddr @pending6 drop
add rule inet cni_node_policy forward jump judge-egress
add rule inet cni_node_policy forward jump judge-ingress
add rule inet cni_node_policy input ct direction reply accept
add rule inet cni_node_policy input ct state related accept
add rule inet cni_node_policy input icmpv6 type 133-137 accept
add rule inet cni_node_policy input ip saddr @pending4 drop
add rule inet cni_node_policy input ip6 saddr @pending6 drop
add rule inet cni_node_policy input jump judge-egress
add element inet cni_node_policy ingress4 { 10.9.0.2 : goto ingress-aa11 }
add element inet cni_node_policy ingress6 { fd09::2 : goto ingress-aa11 }
add element inet cni_node_policy egress4 { 10.9.0.3 : goto egress-bb22 }
add element inet cni_node_policy admin-egress4 { 10.9.0.2 : goto admin-egress-cc33 }
add element inet cni_node_policy baseline-ingress4 { 10.9.0.3 : goto baseline-ingress-dd44 }
";

/// Listings of the table that must come out the same whoever made it: text with
/// handles, JSON, and the rules' expressions as nft decodes them from the kernel.
fn listings() -> [String; 3] {
    let debug = sh(
        "nft",
        &["--debug=netlink", "-a", "list", "table", "inet", TABLE],
    );
    // Elements of hash sets come in the kernel's hash order, seeded per set: each
    // set's element lines are sorted.
    let mut netlink = Vec::new();
    let mut elements: Vec<&str> = Vec::new();
    for line in debug.lines() {
        if line.starts_with("\telement") {
            elements.push(line);
            continue;
        }
        elements.sort_unstable();
        netlink.append(&mut elements);
        netlink.push(line);
    }
    elements.sort_unstable();
    netlink.append(&mut elements);
    [
        sh("nft", &["-a", "list", "table", "inet", TABLE]),
        sh("nft", &["-j", "list", "table", "inet", TABLE]),
        netlink.join("\n"),
    ]
}

/// Test 1: the table as nft prints it, and byte for byte what nft makes of the same
/// script (sets' types, flags and concatenation lengths, rules' expressions).
#[test]
fn the_table_is_what_nft_prints_and_makes() {
    if !privileged() {
        return;
    }
    let ours = in_netns(|| {
        let mut t = PolicyTable::open().unwrap();
        let c = t.apply(&small_state()).unwrap();
        assert!(c.created && c.sent(), "{c:?}");
        assert_eq!(listing(), SMALL_LISTING);
        listings()
    });
    let by_nft = in_netns(|| {
        feed("nft", &["-f", "-"], SMALL_BY_NFT);
        assert_eq!(listing(), SMALL_LISTING);
        // What nft made, our reader adopts as it is: nothing to send.
        let mut t = PolicyTable::open().unwrap();
        t.load().unwrap();
        assert_eq!(t.apply(&small_state()).unwrap(), Changes::default());
        listings()
    });
    for (ours, theirs) in ours.iter().zip(&by_nft) {
        assert_eq!(ours, theirs);
    }
}

// ---- the traffic harness ----

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A named network namespace, deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new(prefix: &str) -> Netns {
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        sh("ip", &["netns", "add", &name]);
        Netns { name }
    }

    fn exec(&self, argv: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(argv)
            .env("PATH", common::tool_path())
            .output()
            .unwrap()
    }

    fn exec_ok(&self, argv: &[&str]) {
        let out = self.exec(argv);
        assert!(
            out.status.success(),
            "{}: {argv:?}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `f` on a thread inside the namespace; sockets it makes stay there.
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let file = File::open(format!("/var/run/netns/{}", self.name)).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                setns(&file, CloneFlags::CLONE_NEWNET).unwrap();
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .output();
    }
}

/// A pod: a namespace with `eth0` on the node's bridge.
struct Pod {
    ns: Netns,
    v4: IpAddr,
    v6: IpAddr,
}

const BRIDGE: &str = "br-np";
const GATEWAY4: &str = "10.9.0.1";

/// Makes pod number `n` (10.9.0.n, fd09::n) on the bridge of the calling thread's
/// netns (the node).
fn pod(n: u8) -> Pod {
    let ns = Netns::new("np-pod");
    let host = format!("veth-np{n}");
    sh(
        "ip",
        &[
            "link", "add", &host, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ],
    );
    sh("ip", &["link", "set", &host, "master", BRIDGE, "up"]);
    let (v4, v6) = (format!("10.9.0.{n}"), format!("fd09::{n}"));
    ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
    ns.exec_ok(&["ip", "addr", "add", &format!("{v4}/24"), "dev", "eth0"]);
    ns.exec_ok(&[
        "ip",
        "addr",
        "add",
        &format!("{v6}/64"),
        "dev",
        "eth0",
        "nodad",
    ]);
    ns.exec_ok(&["ip", "link", "set", "eth0", "up"]);
    ns.exec_ok(&["ip", "route", "add", "default", "via", GATEWAY4]);
    Pod {
        ns,
        v4: ip(&v4),
        v6: ip(&v6),
    }
}

/// The node: a bridge with the gateway addresses, br_netfilter's switches on.
fn node() {
    sh("ip", &["link", "set", "lo", "up"]);
    sh(
        "ip",
        &[
            "link",
            "add",
            BRIDGE,
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ],
    );
    sh(
        "ip",
        &["addr", "add", &format!("{GATEWAY4}/24"), "dev", BRIDGE],
    );
    sh("ip", &["addr", "add", "fd09::1/64", "dev", BRIDGE, "nodad"]);
    sh("ip", &["link", "set", BRIDGE, "up"]);
    network_policy::enable_bridge_netfilter().unwrap();
}

/// A TCP and UDP echo server, stopped on drop.
struct Server {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Echo servers on `addr`'s TCP and UDP port `port`, in `netns` (`None`: here).
fn serve(netns: Option<&Netns>, addrs: &[IpAddr], port: u16) -> Server {
    let stop = Arc::new(AtomicBool::new(false));
    let bind = || {
        addrs
            .iter()
            .map(|a| {
                let at = SocketAddr::new(*a, port);
                (TcpListener::bind(at).unwrap(), UdpSocket::bind(at).unwrap())
            })
            .collect::<Vec<_>>()
    };
    let sockets = match netns {
        Some(ns) => ns.run(bind),
        None => bind(),
    };
    let mut threads = Vec::new();
    for (tcp, udp) in sockets {
        tcp.set_nonblocking(true).unwrap();
        let s = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut conns: Vec<JoinHandle<()>> = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match tcp.accept() {
                    Ok((mut c, _)) => {
                        let s = s.clone();
                        conns.push(std::thread::spawn(move || {
                            c.set_nonblocking(false).unwrap();
                            c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                            let mut buf = [0u8; 512];
                            while !s.load(Ordering::Relaxed) {
                                match c.read(&mut buf) {
                                    Ok(0) => return,
                                    Ok(n) => {
                                        if c.write_all(&buf[..n]).is_err() {
                                            return;
                                        }
                                    }
                                    Err(_) => {}
                                }
                            }
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            for c in conns {
                let _ = c.join();
            }
        }));
        udp.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let s = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !s.load(Ordering::Relaxed) {
                if let Ok((n, from)) = udp.recv_from(&mut buf) {
                    let _ = udp.send_to(&buf[..n], from);
                }
            }
        }));
    }
    Server { stop, threads }
}

/// How long a packet that gets no answer is waited for: the namespaces are on one
/// machine, answers take microseconds.
const WAIT: Duration = Duration::from_millis(400);

/// Whether a TCP connection from `from` to `to` opens and echoes.
fn tcp_ok(from: &Netns, to: IpAddr, port: u16) -> bool {
    from.run(|| {
        let Ok(mut c) = TcpStream::connect_timeout(&SocketAddr::new(to, port), WAIT) else {
            return false;
        };
        echoes(&mut c)
    })
}

fn echoes(c: &mut TcpStream) -> bool {
    c.set_read_timeout(Some(WAIT)).unwrap();
    if c.write_all(b"ping").is_err() {
        return false;
    }
    let mut buf = [0u8; 4];
    c.read_exact(&mut buf).is_ok() && &buf == b"ping"
}

/// Whether a UDP datagram from `from` to `to` is echoed.
fn udp_ok(from: &Netns, to: IpAddr, port: u16) -> bool {
    from.run(|| {
        let any: IpAddr = if to.is_ipv4() {
            ip("0.0.0.0")
        } else {
            ip("::")
        };
        let s = UdpSocket::bind(SocketAddr::new(any, 0)).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.send_to(b"ping", SocketAddr::new(to, port)).unwrap();
        let mut buf = [0u8; 16];
        matches!(s.recv_from(&mut buf), Ok((4, _)))
    })
}

/// Whether one ping from `from` to `to` is answered.
fn ping_ok(from: &Netns, to: IpAddr) -> bool {
    from.exec(&["ping", "-c", "1", "-W", "1", &to.to_string()])
        .status
        .success()
}

fn profile(boxes: &[Allow]) -> Profile {
    Profile {
        allow: boxes.to_vec(),
        ..Profile::default()
    }
}

/// One peer, one protocol, one port.
fn only(peer: IpAddr, protocol: u8, port: u16) -> Allow {
    Allow {
        first: peer,
        last: peer,
        protocols: (protocol, protocol),
        ports: (port, port),
    }
}

const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMPV6: u8 = 58;

/// Test 2: real traffic between three pods on a bridge.
#[test]
fn traffic_between_pods_on_a_bridge_is_judged() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        node();
        let (a, b, c) = (pod(2), pod(3), pod(4));
        let _servers = [
            serve(Some(&b.ns), &[b.v4, b.v6], 80),
            serve(Some(&b.ns), &[b.v4], 81),
            serve(Some(&b.ns), &[b.v4], 53),
            serve(Some(&c.ns), &[c.v4], 80),
            serve(Some(&a.ns), &[a.v4, a.v6], 80),
            serve(None, &[ip(GATEWAY4)], 9000),
        ];
        // Without the table everything passes.
        assert!(tcp_ok(&c.ns, b.v4, 80) && tcp_ok(&a.ns, c.v4, 80));

        // b: isolated for ingress, allows a's TCP 80 (by address) and UDP 53 from
        // 10.9.0.0-10.9.0.3 (by range: a, not c), and ICMPv6 from a.
        // a: isolated for both: ingress denies everything; egress allows b's TCP
        // 80 and 81, UDP 53 and ICMPv6 only.
        let mut s = PolicyState::default();
        s.ingress_profiles.insert(
            "b0".into(),
            profile(&[
                only(a.v4, TCP, 80),
                allow("10.9.0.0", "10.9.0.3", (UDP, UDP), (53, 53)),
                Allow {
                    protocols: (ICMPV6, ICMPV6),
                    ports: (0, 65535),
                    ..Allow::all_traffic(a.v6, a.v6)
                },
            ]),
        );
        s.ingress_profiles.insert("deny".into(), Profile::default());
        s.egress_profiles.insert(
            "a0".into(),
            profile(&[
                Allow {
                    ports: (80, 81),
                    ..only(b.v4, TCP, 80)
                },
                only(b.v4, UDP, 53),
                Allow {
                    protocols: (ICMPV6, ICMPV6),
                    ports: (0, 65535),
                    ..Allow::all_traffic(b.v6, b.v6)
                },
            ]),
        );
        s.ingress.insert(b.v4, "b0".into());
        s.ingress.insert(b.v6, "b0".into());
        s.ingress.insert(a.v4, "deny".into());
        s.ingress.insert(a.v6, "deny".into());
        s.egress.insert(a.v4, "a0".into());
        s.egress.insert(a.v6, "a0".into());
        let mut t = PolicyTable::open().unwrap();
        t.apply(&s).unwrap();

        // Ingress: by source and port; replies to a pass although a denies all
        // ingress.
        assert!(tcp_ok(&a.ns, b.v4, 80), "a -> b:80 is allowed");
        assert!(!tcp_ok(&c.ns, b.v4, 80), "c -> b:80 is not (source)");
        assert!(!tcp_ok(&a.ns, b.v4, 81), "a -> b:81 is not (port)");
        assert!(udp_ok(&a.ns, b.v4, 53), "a -> b udp 53 is allowed (range)");
        assert!(!udp_ok(&c.ns, b.v4, 53), "c -> b udp 53 is not (range)");
        assert!(!tcp_ok(&b.ns, a.v4, 80), "nothing enters a");
        // Egress: a reaches nothing else, c (not isolated) and the node neither.
        assert!(!tcp_ok(&a.ns, c.v4, 80), "a's egress denies c");
        assert!(
            !tcp_ok(&a.ns, ip(GATEWAY4), 9000),
            "a's egress denies the node"
        );
        assert!(tcp_ok(&c.ns, ip(GATEWAY4), 9000), "c is not isolated");
        // The node reaches every pod (probes), whatever their ingress.
        assert!(
            tcp_ok_here(a.v4, 80),
            "node -> a passes (output is not judged)"
        );
        // IPv6: neighbour discovery passes (a denies all ingress, so b's neighbour
        // advertisements reach it only through the ICMPv6 exemption) and the ping
        // is answered; TCP over IPv6 from a to b is not allowed by a's egress.
        for pod in [&a, &b] {
            pod.ns
                .exec_ok(&["ip", "-6", "neigh", "flush", "dev", "eth0"]);
        }
        assert!(ping_ok(&a.ns, b.v6), "a pings b over IPv6");
        assert!(
            !tcp_ok(&b.ns, a.v6, 80),
            "nothing enters a over IPv6 either"
        );
        assert!(
            !tcp_ok(&a.ns, b.v6, 80),
            "a -> b:80 over IPv6 is not allowed"
        );

        // An established connection keeps passing through a change that still
        // allows it (a's egress gains a box, b's ingress is replaced by a profile
        // that allows the same), and is cut at once by one that denies it.
        let mut conn =
            a.ns.run(|| TcpStream::connect_timeout(&SocketAddr::new(b.v4, 80), WAIT).unwrap());
        assert!(echoes(&mut conn));
        let mut still = s.clone();
        still
            .egress_profiles
            .get_mut("a0")
            .unwrap()
            .allow
            .push(only(c.v4, TCP, 80));
        still
            .ingress_profiles
            .insert("b1".into(), profile(&[only(a.v4, TCP, 80)]));
        still.ingress.insert(b.v4, "b1".into());
        let changes = t.apply(&still).unwrap();
        assert_eq!(
            (
                changes.profiles_added,
                changes.boxes_added,
                changes.pods_added,
                changes.pods_removed
            ),
            (1, 2, 1, 1),
            "{changes:?}"
        );
        assert!(echoes(&mut conn), "still allowed: the connection lives");
        assert!(tcp_ok(&a.ns, c.v4, 80), "the new box allows a -> c");
        let mut denied = still.clone();
        denied
            .ingress_profiles
            .insert("b1".into(), Profile::default());
        t.apply(&denied).unwrap();
        assert!(
            !echoes(&mut conn),
            "denied: the established connection is cut"
        );
        drop(conn);

        // Shared peer sets: b's ingress allows TCP 80 from the set `cc` (c, both
        // families), a's egress everything to it. c leaving the set (one element out)
        // cuts c's established connection to b.
        let mut shared = s.clone();
        shared.peer_sets.insert("cc".into(), [c.v4, c.v6].into());
        shared.ingress_profiles.get_mut("b0").unwrap().peers = vec![PeerRule {
            set: "cc".into(),
            protocols: (TCP, TCP),
            ports: (80, 80),
        }];
        shared.egress_profiles.get_mut("a0").unwrap().peers = vec![PeerRule {
            set: "cc".into(),
            protocols: (0, 255),
            ports: (0, 65535),
        }];
        let changes = t.apply(&shared).unwrap();
        assert_eq!(
            (changes.peer_sets_added, changes.peer_addresses_added),
            (1, 2)
        );
        assert!(tcp_ok(&c.ns, b.v4, 80), "c -> b:80 through the peer set");
        assert!(tcp_ok(&c.ns, b.v6, 80), "and over IPv6");
        assert!(!tcp_ok(&c.ns, b.v4, 81), "not to another port");
        assert!(tcp_ok(&a.ns, c.v4, 80), "a's egress reaches c through it");
        let mut conn =
            c.ns.run(|| TcpStream::connect_timeout(&SocketAddr::new(b.v4, 80), WAIT).unwrap());
        assert!(echoes(&mut conn));
        let mut without = shared.clone();
        without.peer_sets.get_mut("cc").unwrap().remove(&c.v4);
        let changes = t.apply(&without).unwrap();
        assert_eq!(
            (changes.peer_addresses_removed, changes.messages),
            (1, 1),
            "{changes:?}"
        );
        assert!(!echoes(&mut conn), "c left the set: its connection is cut");
        drop(conn);
        assert!(!tcp_ok(&a.ns, c.v4, 80), "nor does a reach it");
        assert!(tcp_ok(&c.ns, b.v6, 80), "its IPv6 address is still in");

        // Pending: a new pod's traffic is dropped both ways until it is judged,
        // and passes once the transaction that judges it took it out.
        t.apply(&s).unwrap();
        let d = pod(5);
        let _d_server = serve(Some(&d.ns), &[d.v4], 80);
        assert!(network_policy::add_pending(&[d.v4, d.v6], Some("ns/d")).unwrap());
        let listed = network_policy::pending().unwrap();
        let d_pod = Some("ns/d".to_owned());
        assert_eq!(listed, [(d.v4, d_pod.clone()), (d.v6, d_pod)].into());
        assert!(!tcp_ok(&c.ns, d.v4, 80), "nothing reaches a pending pod");
        assert!(!tcp_ok(&d.ns, c.v4, 80), "a pending pod reaches nothing");
        assert!(!tcp_ok(&d.ns, ip(GATEWAY4), 9000), "nor the node");
        assert!(tcp_ok_here(d.v4, 80), "but the node's probes reach it");
        let mut judged = s.clone();
        judged
            .ingress_profiles
            .insert("d0".into(), profile(&[Allow::all_traffic(c.v4, c.v4)]));
        judged.ingress.insert(d.v4, "d0".into());
        // An agent that still believes the addresses are an earlier pod's does not
        // release them: its judgement is not d's.
        let earlier: BTreeMap<IpAddr, String> =
            [(d.v4, "ns/old".into()), (d.v6, "ns/old".into())].into();
        let changes = t.apply_judged(&judged, &earlier).unwrap();
        assert_eq!((changes.pending_resolved, changes.pods_added), (0, 1));
        assert_eq!(network_policy::pending().unwrap().len(), 2);
        assert!(!tcp_ok(&c.ns, d.v4, 80), "still pending");
        // Judged as d's: released in the transaction that judges them.
        let pods: BTreeMap<IpAddr, String> = [(d.v4, "ns/d".into()), (d.v6, "ns/d".into())].into();
        let changes = t.apply_judged(&judged, &pods).unwrap();
        assert_eq!((changes.pending_resolved, changes.messages), (2, 4));
        assert!(network_policy::pending().unwrap().is_empty());
        assert_eq!(t.apply_judged(&judged, &pods).unwrap(), Changes::default());
        assert!(tcp_ok(&c.ns, d.v4, 80), "judged: c may reach d");
        assert!(!tcp_ok(&b.ns, d.v4, 80), "judged: b may not");
        assert!(tcp_ok(&d.ns, c.v4, 80), "d is not isolated for egress");
        // DEL: the addresses go, also when they are gone already.
        network_policy::add_pending(&[d.v4], None).unwrap();
        network_policy::remove_pending(&[d.v4, d.v6]).unwrap();
        network_policy::remove_pending(&[d.v4, d.v6]).unwrap();
        assert!(network_policy::pending().unwrap().is_empty());

        // Enforcement off.
        t.delete().unwrap();
        t.delete().unwrap();
        assert!(tcp_ok(&c.ns, b.v4, 80) && tcp_ok(&a.ns, c.v4, 80));
        assert!(
            !network_policy::add_pending(&[d.v4], None).unwrap(),
            "no table: a no-op"
        );
        network_policy::remove_pending(&[d.v4]).unwrap();
        assert!(network_policy::pending().unwrap().is_empty());
    });
}

/// Whether the node itself reaches `to`.
fn tcp_ok_here(to: IpAddr, port: u16) -> bool {
    let Ok(mut c) = TcpStream::connect_timeout(&SocketAddr::new(to, port), WAIT) else {
        return false;
    };
    echoes(&mut c)
}

/// br_netfilter's switches are per network namespace here: turning them on in a
/// namespace says whether they were, and leaves the machine's own as they were.
#[test]
fn bridge_netfilter_switches_are_per_namespace() {
    if !privileged() {
        return;
    }
    let root = || {
        network_policy::BRIDGE_NF_SYSCTLS
            .map(|n| std::fs::read_to_string(format!("/proc/sys/{n}")).unwrap_or_default())
    };
    let before = root();
    in_netns(|| {
        for name in network_policy::BRIDGE_NF_SYSCTLS {
            std::fs::write(format!("/proc/sys/{name}"), "0").unwrap();
        }
        assert!(!network_policy::enable_bridge_netfilter().unwrap());
        assert!(network_policy::enable_bridge_netfilter().unwrap());
        for name in network_policy::BRIDGE_NF_SYSCTLS {
            assert_eq!(
                std::fs::read_to_string(format!("/proc/sys/{name}")).unwrap(),
                "1\n"
            );
        }
    });
    assert_eq!(root(), before);
}

/// A Service address of the pods' network, DNATed by the node as kube-proxy does.
const SERVICE: &str = "10.96.0.10";

/// A pod reaching itself. To its own address the packets never leave it: nothing
/// judges them. Through a Service address (a DNAT on the node, the hairpin sent back
/// out of the pod's bridge port and masqueraded, as kube-proxy and the bridge's
/// `hairpinMode` do) they pass the node's forward hook with the pod's address as
/// source and destination, and the pod's egress and ingress profiles judge them on
/// the port after DNAT: what `cni-node explain --via-service` answers.
#[test]
fn a_pod_reaching_itself_through_a_service_address_is_judged() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        node();
        // A node routes (the bridge plugin turns this on for its gateway): the
        // packet DNATed back to its bridge is routed before it is bridged.
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap();
        let a = pod(2);
        sh(
            "ip",
            &[
                "link",
                "set",
                "veth-np2",
                "type",
                "bridge_slave",
                "hairpin",
                "on",
            ],
        );
        let pod = a.v4;
        feed(
            "nft",
            &["-f", "-"],
            &format!(
                "table ip service {{
                    chain prerouting {{
                        type nat hook prerouting priority dstnat; policy accept;
                        ip daddr {SERVICE} tcp dport 80 dnat to {pod}:8080
                    }}
                    chain postrouting {{
                        type nat hook postrouting priority srcnat; policy accept;
                        ip saddr {pod} ip daddr {pod} snat to {GATEWAY4}
                    }}
                }}"
            ),
        );
        let _server = serve(Some(&a.ns), &[pod], 8080);
        let service = ip(SERVICE);
        assert!(tcp_ok(&a.ns, pod, 8080), "a reaches its own address");
        assert!(
            tcp_ok(&a.ns, service, 80),
            "and itself through the Service, without the table"
        );

        // a denies all ingress.
        let mut s = PolicyState::default();
        s.ingress_profiles.insert("deny".into(), Profile::default());
        s.ingress.insert(pod, "deny".into());
        let mut t = PolicyTable::open().unwrap();
        t.apply(&s).unwrap();
        assert!(tcp_ok(&a.ns, pod, 8080), "its own address is not judged");
        assert!(
            !tcp_ok(&a.ns, service, 80),
            "through the Service, a's ingress judges it"
        );

        // a's ingress allows a itself on the pod's port, after DNAT.
        s.ingress_profiles.clear();
        s.ingress_profiles
            .insert("self".into(), profile(&[only(pod, TCP, 8080)]));
        s.ingress.insert(pod, "self".into());
        t.apply(&s).unwrap();
        assert!(
            tcp_ok(&a.ns, service, 80),
            "allowed from a to its port 8080"
        );

        // a's egress judges it too.
        s.egress_profiles.insert("none".into(), Profile::default());
        s.egress.insert(pod, "none".into());
        t.apply(&s).unwrap();
        assert!(
            !tcp_ok(&a.ns, service, 80),
            "a's egress allows nothing, not even a"
        );
        assert!(
            tcp_ok(&a.ns, pod, 8080),
            "its own address still is not judged"
        );
    });
}

/// Test 3: the same state sends nothing, a one-pod change is one small
/// transaction, and a new process adopts the table without a change (restart).
#[test]
fn only_differences_are_sent_and_a_restart_adopts_the_table() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let s = small_state();
        let mut t = PolicyTable::open().unwrap();
        t.apply(&s).unwrap();
        let before = ruleset();
        assert_eq!(t.apply(&s).unwrap(), Changes::default());
        assert_eq!(ruleset(), before);

        // One pod more: one message with one element.
        let mut more = s.clone();
        more.ingress.insert(ip("10.9.0.7"), "aa11".into());
        let c = t.apply(&more).unwrap();
        assert_eq!(
            c,
            Changes {
                pods_added: 1,
                messages: 1,
                bytes: c.bytes,
                ..Changes::default()
            }
        );
        assert!(c.bytes < 256, "{c:?}");
        // The pod isolated for egress too, then no more for ingress: one element
        // each.
        let mut moved = more.clone();
        moved.egress.insert(ip("10.9.0.7"), "bb22".into());
        let c = t.apply(&moved).unwrap();
        assert_eq!((c.pods_added, c.pods_removed, c.messages), (1, 0, 1));
        moved.ingress.remove(&ip("10.9.0.7"));
        let c = t.apply(&moved).unwrap();
        assert_eq!((c.pods_added, c.pods_removed, c.messages), (0, 1, 1));
        // One box changed: delete and add in the same set.
        let mut boxes = moved.clone();
        boxes
            .egress_profiles
            .get_mut("bb22")
            .unwrap()
            .allow
            .push(allow("fd00::", "fd00::ff", (6, 6), (443, 443)));
        let c = t.apply(&boxes).unwrap();
        assert_eq!((c.profiles_changed, c.boxes_added, c.messages), (1, 1, 1));
        let listed = listing();
        assert!(
            listed.contains("elements = { fd00::/120 . tcp . 443 }"),
            "{listed}"
        );

        // Resolving pending addresses alone: their add and delete, nothing else.
        let c = t
            .apply_resolving(&boxes, &[ip("10.9.0.50"), ip("fd09::50")])
            .unwrap();
        assert_eq!((c.pending_resolved, c.messages), (2, 4), "{c:?}");

        // Restart: a new process reads the table and has nothing to send.
        let mut again = PolicyTable::open().unwrap();
        again.load().unwrap();
        assert_eq!(again.apply(&boxes).unwrap(), Changes::default());
        // Without load, the first apply reads it itself.
        let mut lazy = PolicyTable::open().unwrap();
        assert_eq!(lazy.apply(&boxes).unwrap(), Changes::default());

        // A hand edit of an element: a resync reads it, the next apply puts back
        // just that.
        sh(
            "nft",
            &[
                "delete",
                "element",
                "inet",
                TABLE,
                "egress4",
                "{ 10.9.0.3 }",
            ],
        );
        again.load().unwrap();
        let c = again.apply(&boxes).unwrap();
        assert_eq!((c.pods_added, c.messages, c.created), (1, 1, false));
        // The same edit unnoticed (no resync): a change that removes that element
        // fails as a whole, the table is read again, and the next apply succeeds.
        sh(
            "nft",
            &[
                "delete",
                "element",
                "inet",
                TABLE,
                "egress4",
                "{ 10.9.0.3 }",
            ],
        );
        let mut gone = boxes.clone();
        gone.egress.remove(&ip("10.9.0.3"));
        gone.ingress.insert(ip("10.9.0.8"), "aa11".into());
        let before = ruleset();
        let e = again.apply(&gone).unwrap_err();
        assert!(
            e.to_string()
                .contains("delete element inet cni_node_policy egress4 (1 element)"),
            "{e}"
        );
        assert_eq!(ruleset(), before, "nothing of the failed transaction stays");
        let c = again.apply(&gone).unwrap();
        assert_eq!((c.pods_added, c.pods_removed, c.messages), (1, 0, 1));
        again.apply(&boxes).unwrap();
        // A hand edit of a rule: the table is made again, in one transaction.
        sh(
            "nft",
            &["insert", "rule", "inet", TABLE, "forward", "accept"],
        );
        again.load().unwrap();
        let c = again.apply(&boxes).unwrap();
        assert!(c.created, "{c:?}");
        assert_eq!(listing(), {
            let mut t = PolicyTable::open().unwrap();
            t.load().unwrap();
            assert_eq!(t.apply(&boxes).unwrap(), Changes::default());
            listing()
        });
        assert!(!listing().contains("\t\taccept\n"));
        // A table made again keeps its pending addresses.
        network_policy::add_pending(&[ip("10.9.0.99")], Some("ns/p")).unwrap();
        sh("nft", &["add", "chain", "inet", TABLE, "stray"]);
        again.load().unwrap();
        assert!(again.apply(&boxes).unwrap().created);
        assert_eq!(
            network_policy::pending().unwrap(),
            [(ip("10.9.0.99"), Some("ns/p".to_owned()))].into(),
            "carried over with its pod"
        );
        assert!(!listing().contains("stray"));
    });
}

/// A profile set of many elements that loses one is made anew in the transaction (its
/// chain flushed and filled again), the others are edited: the kernel holds exactly
/// the wanted elements, the rules are back, a second apply sends nothing, and a new
/// process adopts the result.
#[test]
fn a_big_profile_set_that_loses_an_element_is_made_anew() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let mut s = small_state();
        let many: Vec<Allow> = (0..200u16)
            .map(|i| {
                let a = format!("10.{}.{}.1", 100 + i / 100, i % 100);
                let b = format!("10.{}.{}.2", 100 + i / 100, i % 100);
                allow(&a, &b, (17, 17), (5353, 5360))
            })
            .collect();
        s.ingress_profiles
            .get_mut("aa11")
            .unwrap()
            .allow
            .extend(many);
        let mut t = PolicyTable::open().unwrap();
        t.apply(&s).unwrap();
        let rules_before: Vec<String> = listing()
            .lines()
            .filter(|l| l.contains("@ingress-aa11"))
            .map(str::to_owned)
            .collect();
        assert_eq!(rules_before.len(), 2, "{}", listing());

        let mut less = s.clone();
        let gone = less
            .ingress_profiles
            .get_mut("aa11")
            .unwrap()
            .allow
            .remove(5);
        let ipv4 = less.ingress_profiles["aa11"]
            .allow
            .iter()
            .filter(|a| a.first.is_ipv4())
            .count();
        let c = t.apply(&less).unwrap();
        assert_eq!(
            (c.profiles_changed, c.boxes_added, c.boxes_removed),
            (1, ipv4, ipv4 + 1),
            "the IPv4 set made anew, the IPv6 set untouched"
        );
        let listed = listing();
        let rules_after: Vec<String> = listed
            .lines()
            .filter(|l| l.contains("@ingress-aa11"))
            .map(str::to_owned)
            .collect();
        assert_eq!(rules_after, rules_before);
        let set = sh("nft", &["list", "set", "inet", TABLE, "ingress-aa11-v4"]);
        assert!(!set.contains(&gone.first.to_string()), "{set}");
        assert_eq!(set.matches(". udp . 5353-5360").count(), 199, "{set}");
        assert_eq!(t.apply(&less).unwrap(), Changes::default());

        let mut again = PolicyTable::open().unwrap();
        again.load().unwrap();
        assert_eq!(again.apply(&less).unwrap(), Changes::default());
    });
}

/// Test 4: a thousand profiles and ten thousand map elements in one transaction,
/// and a one-pod change afterwards. Times are printed; the bounds are only there
/// to catch a pathology (debug build, shared machine).
#[test]
fn a_thousand_profiles_and_ten_thousand_pods() {
    if !privileged() {
        return;
    }
    const PROFILES: usize = 1000;
    const PODS: usize = 5000;
    let mut s = PolicyState::default();
    for i in 0..PROFILES {
        let name = format!("{i:032x}");
        let o = (i % 250) as u8;
        let boxes = vec![
            allow(
                &format!("10.{o}.0.0"),
                &format!("10.{o}.0.255"),
                (6, 6),
                (80, 80),
            ),
            allow(
                &format!("10.{o}.1.0"),
                &format!("10.{o}.3.255"),
                (6, 6),
                (443, 443),
            ),
            allow(
                &format!("10.{o}.4.0"),
                &format!("10.{o}.4.0"),
                (0, 255),
                (0, 65535),
            ),
            allow(
                &format!("fd00:{i:x}::"),
                &format!("fd00:{i:x}::ffff"),
                (17, 17),
                (53, 53),
            ),
        ];
        let p = Profile {
            allow: boxes,
            ..Profile::default()
        };
        if i % 2 == 0 {
            s.ingress_profiles.insert(name, p);
        } else {
            s.egress_profiles.insert(name, p);
        }
    }
    let ingress: Vec<&String> = s.ingress_profiles.keys().collect();
    let egress: Vec<&String> = s.egress_profiles.keys().collect();
    let mut pods: BTreeMap<IpAddr, (String, String)> = BTreeMap::new();
    for i in 0..PODS {
        let pod = ip(&format!("10.200.{}.{}", i / 250, i % 250 + 1));
        pods.insert(
            pod,
            (
                ingress[i % ingress.len()].clone(),
                egress[i % egress.len()].clone(),
            ),
        );
    }
    for (pod, (i, e)) in pods {
        s.ingress.insert(pod, i);
        s.egress.insert(pod, e);
    }
    in_netns(|| {
        let mut t = PolicyTable::open().unwrap();
        let started = Instant::now();
        let c = t.apply(&s).unwrap();
        let full = started.elapsed();
        assert_eq!(
            (c.profiles_added, c.pods_added, c.boxes_added),
            (PROFILES, 2 * PODS, 4 * PROFILES)
        );
        eprintln!(
            "{PROFILES} profiles, {} map elements: {} messages, {} KiB, applied in {full:?}",
            2 * PODS,
            c.messages,
            c.bytes / 1024
        );

        let mut one = s.clone();
        one.ingress.insert(
            ip("10.201.0.1"),
            s.ingress_profiles.keys().next().unwrap().clone(),
        );
        let started = Instant::now();
        let c = t.apply(&one).unwrap();
        let single = started.elapsed();
        assert_eq!((c.pods_added, c.messages), (1, 1));
        eprintln!("one more pod afterwards: {single:?}");
        // And twenty more, one by one.
        let mut each = Vec::new();
        for i in 2..22 {
            one.ingress.insert(
                ip(&format!("10.201.0.{i}")),
                s.ingress_profiles.keys().nth(i).unwrap().clone(),
            );
            let started = Instant::now();
            assert_eq!(t.apply(&one).unwrap().messages, 1);
            each.push(started.elapsed());
        }
        each.sort();
        eprintln!(
            "twenty more pods one by one: min {:?}, median {:?}, max {:?}",
            each[0], each[10], each[19]
        );

        // Ten boxes changed one by one (each: one element out, one in).
        let mut boxes = one.clone();
        let mut each = Vec::new();
        for p in boxes.egress_profiles.clone().keys().take(10) {
            boxes.egress_profiles.get_mut(p).unwrap().allow[0].ports = (80, 81);
            let started = Instant::now();
            let c = t.apply(&boxes).unwrap();
            each.push(started.elapsed());
            assert_eq!((c.boxes_added, c.boxes_removed, c.messages), (1, 1, 2));
        }
        each.sort();
        eprintln!(
            "ten boxes changed one by one: min {:?}, median {:?}, max {:?}",
            each[0], each[5], each[9]
        );

        let started = Instant::now();
        assert_eq!(t.apply(&boxes).unwrap(), Changes::default());
        eprintln!("the same state again: {:?}", started.elapsed());
        let judged: BTreeMap<IpAddr, String> = boxes
            .ingress
            .keys()
            .map(|ip| (*ip, format!("ns/{ip}")))
            .collect();
        let started = Instant::now();
        assert_eq!(t.apply_judged(&boxes, &judged).unwrap(), Changes::default());
        eprintln!(
            "the same state again, judging {} pods (the pending sets read): {:?}",
            judged.len(),
            started.elapsed()
        );

        let started = Instant::now();
        let mut again = PolicyTable::open().unwrap();
        again.load().unwrap();
        let load = started.elapsed();
        assert_eq!(again.apply(&boxes).unwrap(), Changes::default());
        eprintln!("load by a new process: {load:?}");

        let started = Instant::now();
        again.delete().unwrap();
        eprintln!("delete: {:?}", started.elapsed());

        assert!(full < Duration::from_secs(60), "{full:?}");
        assert!(single < Duration::from_secs(2), "{single:?}");
    });
}

/// Test 5: invalid states are refused with the problem named, and nothing is
/// committed.
#[test]
fn invalid_states_change_nothing() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let s = small_state();
        let mut t = PolicyTable::open().unwrap();
        t.apply(&s).unwrap();
        let before = ruleset();
        let mut overlap = s.clone();
        overlap
            .ingress_profiles
            .get_mut("aa11")
            .unwrap()
            .allow
            .push(allow("10.9.0.100", "10.9.0.200", (0, 255), (81, 81)));
        let mut bad_name = s.clone();
        bad_name
            .egress_profiles
            .insert("BB22".into(), Profile::default());
        let mut mixed = s.clone();
        mixed
            .egress_profiles
            .get_mut("bb22")
            .unwrap()
            .allow
            .push(allow("10.0.0.1", "fd00::1", (6, 6), (1, 1)));
        let mut dangling = s.clone();
        dangling.egress.insert(ip("10.9.0.2"), "cc33".into());
        for (state, words) in [
            (
                overlap,
                "ingress profile \"aa11\": boxes 10.9.0.0-10.9.0.127 . 6 . 80-81 and 10.9.0.100-10.9.0.200 . 0-255 . 81 overlap",
            ),
            (bad_name, "egress profile \"BB22\": a profile name is"),
            (mixed, "box 10.0.0.1-fd00::1 . 6 . 1 mixes IPv4 and IPv6"),
            (
                dangling,
                "egress of pod 10.9.0.2: its profile \"cc33\" does not exist",
            ),
        ] {
            let e = t.apply(&state).unwrap_err();
            assert!(matches!(e, Error::InvalidPolicy { .. }), "{e:?}");
            assert!(e.to_string().contains(words), "{e}");
            assert_eq!(ruleset(), before);
        }
        // The committed view is unchanged too: the valid state sends nothing.
        assert_eq!(t.apply(&s).unwrap(), Changes::default());
        // A pod in the pending sets that are not there (no table): no change.
        t.delete().unwrap();
        assert_eq!(ruleset(), "");
    });
}

// ---- ClusterNetworkPolicy's tiers ----

/// Verdict chains the tier tests use, by what they stand for.
fn verdict_chains(s: &mut PolicyState) {
    for (name, action) in [
        ("v-admindeny", VerdictAction::Drop),
        ("v-adminaccept", VerdictAction::Accept),
        (
            "v-adminpassin",
            VerdictAction::ToNetworkPolicy(Direction::Ingress),
        ),
        ("v-npallow", VerdictAction::Accept),
        ("v-npdeny", VerdictAction::Drop),
        ("v-basedeny", VerdictAction::Drop),
        ("v-basepass", VerdictAction::Accept),
    ] {
        s.verdict_chains.insert(name.into(), action);
    }
}

/// NetworkPolicy through verdict chains: a profile allowing `boxes`.
fn counted(boxes: &[Allow]) -> Profile {
    Profile {
        allow: boxes.to_vec(),
        peers: Vec::new(),
        verdicts: Some(ProfileVerdicts {
            allow: "v-npallow".into(),
            deny: "v-npdeny".into(),
        }),
    }
}

/// Connections from `from` to `to` over UDP, each from a socket of its own (so each
/// is a connection of its own to conntrack): how many were answered.
fn udp_flows(from: &Netns, to: IpAddr, port: u16, flows: usize) -> usize {
    (0..flows).filter(|_| udp_ok(from, to, port)).count()
}

/// The tiers in the order a packet meets them, on real traffic: Admin before
/// NetworkPolicy (its Deny over an allow, its Pass handing on, its Accept skipping the
/// source's NetworkPolicy but not the destination's ingress), Baseline only for pods
/// NetworkPolicy does not isolate (its Deny, its Pass as an allow); each verdict
/// chain counts the connections it decided; a restart adopts the table with nothing
/// sent; a change is one small transaction; an empty state leaves the bare table.
#[test]
fn tiers_judge_in_order_and_verdict_chains_count() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        node();
        let (a, b, c) = (pod(2), pod(3), pod(4));
        let _servers = [
            serve(Some(&b.ns), &[b.v4], 80),
            serve(Some(&b.ns), &[b.v4], 81),
            serve(Some(&c.ns), &[c.v4], 80),
            serve(Some(&a.ns), &[a.v4], 80),
        ];
        let bare = {
            let mut t = PolicyTable::open().unwrap();
            t.apply(&PolicyState::default()).unwrap();
            listing()
        };

        // b: NetworkPolicy isolates its ingress and allows a's and c's TCP and UDP
        // 80; the Admin tier denies a's TCP 80 to b and passes a's UDP 80 on.
        let mut s = PolicyState::default();
        verdict_chains(&mut s);
        s.ingress_profiles.insert(
            "b0".into(),
            counted(&[
                allow("10.9.0.2", "10.9.0.2", (TCP, TCP), (80, 80)),
                allow("10.9.0.2", "10.9.0.2", (UDP, UDP), (80, 80)),
                allow("10.9.0.4", "10.9.0.4", (UDP, UDP), (80, 80)),
            ]),
        );
        s.ingress.insert(b.v4, "b0".into());
        s.admin.ingress_rows.insert(
            "adeny".into(),
            row(&[
                tier_only(TCP, 80, "v-admindeny"),
                tier_only(UDP, 80, "v-adminpassin"),
            ]),
        );
        s.admin.ingress_profiles.insert(
            "b1".into(),
            Arc::new(TierProfile {
                peers: [(a.v4, "adeny".into())].into(),
                ranges: Default::default(),
            }),
        );
        s.admin.ingress.insert(b.v4, "b1".into());
        // c: not isolated by NetworkPolicy; the Baseline tier passes b's TCP 80
        // (an allow) and denies everything else.
        s.baseline.ingress_rows.insert(
            "bdeny".into(),
            row(&[tier_box((0, 255), (0, 65535), "v-basedeny")]),
        );
        s.baseline
            .ingress_rows
            .insert("bpass".into(), row(&[tier_only(TCP, 80, "v-basepass")]));
        s.baseline.ingress_profiles.insert(
            "c1".into(),
            Arc::new(TierProfile {
                peers: [(a.v4, "bdeny".into()), (b.v4, "bpass".into())].into(),
                ranges: Default::default(),
            }),
        );
        s.baseline.ingress.insert(c.v4, "c1".into());
        // b is in the Baseline tier too, denied everything: NetworkPolicy isolates
        // b's ingress, so Baseline never judges it.
        s.baseline.ingress_profiles.insert(
            "b2".into(),
            tier_profile(&[], &[("0.0.0.0", "255.255.255.255", "bdeny")]),
        );
        s.baseline.ingress.insert(b.v4, "b2".into());
        let mut t = PolicyTable::open().unwrap();
        t.apply(&s).unwrap();

        assert!(
            !tcp_ok(&a.ns, b.v4, 80),
            "Admin Deny over NetworkPolicy's allow"
        );
        assert!(udp_ok(&a.ns, b.v4, 80), "Admin Pass: NetworkPolicy allows");
        assert!(
            udp_ok(&c.ns, b.v4, 80),
            "no Admin word: NetworkPolicy allows"
        );
        assert!(
            !tcp_ok(&c.ns, b.v4, 81),
            "NetworkPolicy denies, whatever Baseline would say"
        );
        assert!(tcp_ok(&b.ns, c.v4, 80), "Baseline Pass is an allow");
        assert!(
            !tcp_ok(&a.ns, c.v4, 80),
            "Baseline Deny where NetworkPolicy is silent"
        );
        assert!(
            tcp_ok_here(c.v4, 80),
            "the node reaches c (its probes are never judged)"
        );
        assert!(tcp_ok(&b.ns, a.v4, 80), "a is in no tier: allowed");

        // Counters: a known number of new connections per verdict chain.
        let before = network_policy::read_verdict_counters().unwrap();
        assert_eq!(udp_flows(&c.ns, b.v4, 80, 5), 5);
        assert_eq!(udp_flows(&a.ns, c.v4, 80, 3), 0);
        assert_eq!(udp_flows(&a.ns, b.v4, 80, 4), 4);
        let after = network_policy::read_verdict_counters().unwrap();
        let new = |chain: &str| after[chain].0 - before.get(chain).map_or(0, |c| c.0);
        assert_eq!(new("v-npallow"), 5 + 4, "{after:?}");
        assert_eq!(new("v-basedeny"), 3, "{after:?}");
        assert_eq!(new("v-adminpassin"), 4, "{after:?}");
        assert_eq!(new("v-npdeny"), 0, "{after:?}");
        assert!(after["v-npallow"].1 > 0, "bytes are counted too");
        assert_eq!(after.len(), s.verdict_chains.len());

        // A restart adopts it all: nothing sent, the counters go on.
        let mut again = PolicyTable::open().unwrap();
        again.load().unwrap();
        assert_eq!(again.apply(&s).unwrap(), Changes::default());
        // (boxes in order, as the kernel lists them)
        assert_eq!(again.held_state().as_ref(), Some(&s));
        let kept = network_policy::read_verdict_counters().unwrap();
        assert_eq!(kept["v-npallow"], after["v-npallow"]);

        // Admin Accept of a's egress skips a's NetworkPolicy (which denies all),
        // but the destination's ingress still judges: c's Baseline denies a.
        let mut accept = s.clone();
        accept.egress_profiles.insert("a0".into(), counted(&[]));
        accept.egress.insert(a.v4, "a0".into());
        accept.admin.egress_rows.insert(
            "aaccept".into(),
            row(&[tier_only(TCP, 80, "v-adminaccept")]),
        );
        accept.admin.egress_profiles.insert(
            "a1".into(),
            tier_profile(&[], &[("0.0.0.0", "255.255.255.255", "aaccept")]),
        );
        accept.admin.egress.insert(a.v4, "a1".into());
        let c1 = again.apply(&accept).unwrap();
        assert!(c1.sent() && !c1.created, "{c1:?}");
        assert!(
            !udp_ok(&a.ns, b.v4, 80),
            "a's NetworkPolicy egress denies UDP"
        );
        assert!(!tcp_ok(&a.ns, c.v4, 80), "c's Baseline still denies a");
        // Without c's Baseline, a's TCP 80 to c passes on the Admin Accept alone.
        let mut open_c = accept.clone();
        open_c.baseline.ingress.remove(&c.v4);
        let one = again.apply(&open_c).unwrap();
        assert_eq!(
            (one.tier_pods_removed, one.messages),
            (1, 1),
            "one element out, in one transaction: {one:?}"
        );
        assert!(
            tcp_ok(&a.ns, c.v4, 80),
            "Admin Accept skips a's NetworkPolicy"
        );

        // The deny log on: the drops' chains are written again, nothing else.
        let mut logged = open_c.clone();
        logged.deny_log = Some(DenyLog {
            group: 9,
            per_second: 20,
        });
        let c2 = again.apply(&logged).unwrap();
        assert_eq!(
            (c2.verdict_chains_changed, c2.messages),
            (3, 3 * 4),
            "{c2:?}"
        );
        let listed = listing();
        assert!(
            listed.contains("log prefix \"v-npdeny\" group 9"),
            "{listed}"
        );
        let mut fresh = PolicyTable::open().unwrap();
        fresh.load().unwrap();
        assert_eq!(fresh.apply(&logged).unwrap(), Changes::default());

        // Everything gone: the bare table is left, as a table made empty is.
        let c3 = fresh.apply(&PolicyState::default()).unwrap();
        assert!(!c3.created, "{c3:?}");
        assert_eq!(listing(), bare);
        assert!(network_policy::read_verdict_counters().unwrap().is_empty());
        assert!(tcp_ok(&a.ns, b.v4, 80) && tcp_ok(&a.ns, c.v4, 80));
    });
}

/// A table of the layout before the tiers (NetworkPolicy's maps `jump`ing straight from
/// the base chains) is read for what it holds, so that a tier that waits keeps it, and
/// is made again in the tiered layout, in one transaction, with its pods and profiles.
#[test]
fn an_earlier_layout_is_read_for_what_it_holds_and_made_again() {
    if !privileged() {
        return;
    }
    const EARLIER: &str = "add table inet cni_node_policy
add map inet cni_node_policy ingress4 { type ipv4_addr : verdict; }
add map inet cni_node_policy ingress6 { type ipv6_addr : verdict; }
add map inet cni_node_policy egress4 { type ipv4_addr : verdict; }
add map inet cni_node_policy egress6 { type ipv6_addr : verdict; }
add set inet cni_node_policy pending4 { type ipv4_addr; }
add set inet cni_node_policy pending6 { type ipv6_addr; }
add chain inet cni_node_policy forward { type filter hook forward priority filter; policy accept; }
add rule inet cni_node_policy forward ct direction reply accept
add rule inet cni_node_policy forward ip daddr vmap @ingress4
add set inet cni_node_policy ingress-aa11-v4 { type ipv4_addr . inet_proto . inet_service; flags interval; }
add element inet cni_node_policy ingress-aa11-v4 { 10.9.0.0-10.9.0.127 . 6 . 80-81 }
add set inet cni_node_policy ingress-aa11-v6 { type ipv6_addr . inet_proto . inet_service; flags interval; }
add chain inet cni_node_policy ingress-aa11
add rule inet cni_node_policy ingress-aa11 ip saddr . meta l4proto . th dport @ingress-aa11-v4 accept
add rule inet cni_node_policy ingress-aa11 ip6 saddr . meta l4proto . th dport @ingress-aa11-v6 accept
add rule inet cni_node_policy ingress-aa11 drop
add element inet cni_node_policy ingress4 { 10.9.0.2 : jump ingress-aa11 }
add element inet cni_node_policy pending4 { 10.9.0.77 }
";
    in_netns(|| {
        feed("nft", &["-f", "-"], EARLIER);
        let mut t = PolicyTable::open().unwrap();
        t.load().unwrap();
        let held = t.held_state().expect("what the earlier table holds");
        let mut want = PolicyState::default();
        want.ingress_profiles.insert(
            "aa11".into(),
            profile(&[allow("10.9.0.0", "10.9.0.127", (6, 6), (80, 81))]),
        );
        want.ingress.insert(ip("10.9.0.2"), "aa11".into());
        assert_eq!(held, want);
        let c = t.apply(&held).unwrap();
        assert!(c.created && c.pods_added == 1, "{c:?}");
        let listed = listing();
        assert!(
            listed.contains("10.9.0.2 : goto ingress-aa11")
                && listed.contains("jump judge-ingress"),
            "{listed}"
        );
        assert_eq!(
            network_policy::pending().unwrap(),
            [(ip("10.9.0.77"), None)].into(),
            "pending addresses carried over"
        );
        let mut again = PolicyTable::open().unwrap();
        again.load().unwrap();
        assert_eq!(again.apply(&held).unwrap(), Changes::default());
    });
}
