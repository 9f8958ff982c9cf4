//! Root tests of the WireGuard calls against the real kernel, each in private network
//! namespaces: a device's keys, port and peers set and read back, peers updated in
//! place and removed, long peer and prefix lists that take more than one message each
//! way, and two "nodes" joined by a veth pair pinging each other through their tunnel.
//!
//! A kernel without WireGuard (the development machines') skips them with a message;
//! `CNI_RS_REQUIRE_WIREGUARD=1` (set by the stock-kernel VM tier,
//! tests/vm/run-vlan-tier.sh) makes that a failure.

mod common;

use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use cni_linux::netlink::wireguard::OVERHEAD_V4;
use cni_linux::{Error, NetNs, Netlink, VethPair, WgKey, WgPeer, WgPeerConfig, Wireguard, sysctl};
use common::{in_private_netns, index_of, ip, net, new_netns};
use ipnetwork::IpNetwork;

fn wireguard_required() -> bool {
    std::env::var("CNI_RS_REQUIRE_WIREGUARD").as_deref() == Ok("1")
}

/// A handle in the calling thread's netns; `None` (after saying so) on a kernel
/// without WireGuard, a failure under `CNI_RS_REQUIRE_WIREGUARD=1`.
fn wireguard_or_skip(test: &str) -> Option<Wireguard> {
    match Wireguard::open() {
        Ok(wg) => Some(wg),
        Err(e) if e.is_no_wireguard() => {
            assert!(
                !wireguard_required(),
                "{test}: CNI_RS_REQUIRE_WIREGUARD=1 but {e} ({e:?})"
            );
            eprintln!("skipping {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: {e:?}"),
    }
}

/// 32 random bytes: a private key (the kernel clamps it) or a stand-in public key.
fn random_key() -> WgKey {
    let mut key = [0; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .unwrap();
    key
}

fn peer_config(key: WgKey, endpoint: &str, ips: &[&str], keepalive: Option<u16>) -> WgPeerConfig {
    WgPeerConfig {
        public_key: key,
        endpoint: Some(endpoint.parse().unwrap()),
        allowed_ips: ips.iter().map(|s| net(s)).collect(),
        persistent_keepalive: keepalive,
    }
}

/// The peer as a dump of a device that never talked to it shows it.
fn as_dumped(config: &WgPeerConfig) -> WgPeer {
    WgPeer {
        public_key: config.public_key,
        endpoint: config.endpoint,
        allowed_ips: config.allowed_ips.clone(),
        last_handshake: None,
        rx_bytes: 0,
        tx_bytes: 0,
    }
}

fn sorted(mut peers: Vec<WgPeer>) -> Vec<WgPeer> {
    peers.sort_by_key(|p| p.public_key);
    peers
}

#[test]
fn open_fails_with_no_wireguard_exactly_when_the_kernel_makes_no_wireguard_links() {
    let test = "open_fails_with_no_wireguard_exactly_when_the_kernel_makes_no_wireguard_links";
    in_private_netns(test, |nl| {
        let link = nl.create_wireguard("wg-probe", None);
        let open = Wireguard::open();
        match link {
            Err(e) if e.is_no_wireguard() => {
                assert!(
                    !wireguard_required(),
                    "CNI_RS_REQUIRE_WIREGUARD=1 but {e} ({e:?})"
                );
                assert!(e.is_unsupported(), "{e:?}");
                let err = open.expect_err("the family resolves but links cannot be made");
                assert!(err.is_no_wireguard(), "{err:?}");
                assert!(matches!(err, Error::NoWireguard { .. }));
                assert!(
                    err.to_string().contains("the kernel has no WireGuard"),
                    "{err}"
                );
                assert!(!err.is_not_found());
                eprintln!("this kernel has no WireGuard: {err}");
            }
            Err(e) => panic!("{e:?}"),
            Ok(()) => {
                let mut wg = open.expect("the link kind exists but the family does not resolve");
                let device = wg.device("wg-probe").unwrap();
                assert_eq!(device.ifindex, index_of(&nl, "wg-probe"));
                assert_eq!((device.public_key, device.has_private_key), (None, false));
                assert!(device.peers.is_empty());
            }
        }
    });
}

#[test]
fn the_device_is_created_keyed_and_read_back_and_others_are_refused() {
    let test = "the_device_is_created_keyed_and_read_back_and_others_are_refused";
    in_private_netns(test, |nl| {
        let Some(mut wg) = wireguard_or_skip(test) else {
            return;
        };
        nl.create_wireguard("wg0", Some(1500 - OVERHEAD_V4))
            .unwrap();
        let link = nl.require_link("wg0").unwrap();
        assert_eq!(link.kind.as_deref(), Some("wireguard"));
        assert_eq!(link.mtu, 1440);
        assert!(!link.up);
        let again = nl.create_wireguard("wg0", None).unwrap_err();
        assert!(again.is_exists(), "{again:?}");

        let fresh = wg.device("wg0").unwrap();
        assert_eq!(fresh.ifindex, link.index);
        assert_eq!((fresh.public_key, fresh.has_private_key), (None, false));
        assert!(fresh.peers.is_empty());

        let private = random_key();
        wg.set_device("wg0", &private, 51820, 0x4000).unwrap();
        let keyed = wg.device("wg0").unwrap();
        assert!(keyed.has_private_key);
        let public = keyed.public_key.expect("a public key once keyed");
        assert_ne!(public, private);
        assert_eq!((keyed.listen_port, keyed.fwmark), (51820, 0x4000));
        // The same private key again: the same public key.
        wg.set_device("wg0", &private, 51821, 0).unwrap();
        let again = wg.device("wg0").unwrap();
        assert_eq!(again.public_key, Some(public));
        assert_eq!((again.listen_port, again.fwmark), (51821, 0));

        let missing = wg.device("wg-missing").unwrap_err();
        assert!(missing.is_not_found(), "{missing:?}");
        nl.create_veth_pair_local("veth-a", "veth-b", None).unwrap();
        let not_wg = wg.device("veth-a").unwrap_err();
        assert!(not_wg.is_unsupported(), "{not_wg:?}");
        let not_wg = wg.set_peer(
            "veth-a",
            &peer_config(random_key(), "192.0.2.1:1", &[], None),
        );
        assert!(not_wg.unwrap_err().is_unsupported());
    });
}

#[test]
fn peers_are_added_updated_in_place_and_removed_one_at_a_time() {
    let test = "peers_are_added_updated_in_place_and_removed_one_at_a_time";
    in_private_netns(test, |nl| {
        let Some(mut wg) = wireguard_or_skip(test) else {
            return;
        };
        nl.create_wireguard("wg0", None).unwrap();
        wg.set_device("wg0", &random_key(), 51820, 0).unwrap();
        let a = peer_config(
            random_key(),
            "192.168.100.2:51820",
            &["10.244.2.0/24", "fd00:244:2::/64"],
            None,
        );
        let b = peer_config(
            random_key(),
            "192.168.100.3:51820",
            &["10.244.3.0/24", "fd00:244:3::/64"],
            Some(25),
        );
        let c = peer_config(
            random_key(),
            "[fd00:100::4]:51820",
            &["10.244.4.0/24"],
            None,
        );
        for peer in [&a, &b, &c] {
            wg.set_peer("wg0", peer).unwrap();
        }
        let device = wg.device("wg0").unwrap();
        assert_eq!(
            sorted(device.peers),
            sorted(vec![as_dumped(&a), as_dumped(&b), as_dumped(&c)])
        );

        // B moves and its prefixes change: one replaced, one kept, one added.
        let b2 = peer_config(
            b.public_key,
            "192.168.200.3:51999",
            &["10.244.13.0/24", "fd00:244:3::/64", "10.96.0.0/12"],
            None,
        );
        wg.set_peer("wg0", &b2).unwrap();
        let device = wg.device("wg0").unwrap();
        assert_eq!(device.peers.len(), 3);
        let dumped = |key: WgKey| device.peers.iter().find(|p| p.public_key == key).cloned();
        assert_eq!(dumped(a.public_key), Some(as_dumped(&a)), "A untouched");
        assert_eq!(dumped(c.public_key), Some(as_dumped(&c)), "C untouched");
        let got = dumped(b.public_key).unwrap();
        assert_eq!(got.endpoint, b2.endpoint);
        let mut want_ips = b2.allowed_ips.clone();
        let mut got_ips = got.allowed_ips.clone();
        want_ips.sort();
        got_ips.sort();
        assert_eq!(got_ips, want_ips, "B's prefixes replaced, not added to");

        // A prefix of A given to C moves to C.
        let c2 = peer_config(
            c.public_key,
            "[fd00:100::4]:51820",
            &["10.244.4.0/24", "10.244.2.0/24"],
            None,
        );
        wg.set_peer("wg0", &c2).unwrap();
        let device = wg.device("wg0").unwrap();
        let a_now = device
            .peers
            .iter()
            .find(|p| p.public_key == a.public_key)
            .unwrap();
        assert_eq!(a_now.allowed_ips, [net("fd00:244:2::/64")]);

        // Removing C leaves exactly A and B; removing it again is no error.
        wg.remove_peer("wg0", &c.public_key).unwrap();
        wg.remove_peer("wg0", &c.public_key).unwrap();
        let device = wg.device("wg0").unwrap();
        let keys: Vec<WgKey> = sorted(device.peers).iter().map(|p| p.public_key).collect();
        let mut want = vec![a.public_key, b.public_key];
        want.sort();
        assert_eq!(keys, want);

        // Device settings leave the peers alone.
        wg.set_device("wg0", &random_key(), 0, 7).unwrap();
        assert_eq!(wg.device("wg0").unwrap().peers.len(), 2);
    });
}

#[test]
fn long_peer_and_prefix_lists_cross_many_messages_both_ways() {
    let test = "long_peer_and_prefix_lists_cross_many_messages_both_ways";
    in_private_netns(test, |nl| {
        let Some(mut wg) = wireguard_or_skip(test) else {
            return;
        };
        nl.create_wireguard("wg0", None).unwrap();
        // 1,500 peers of two prefixes each (set in a few requests, dumped in many
        // messages), and one peer with 4,000 prefixes (more than one request holds).
        let peers: Vec<WgPeerConfig> = (0..1500u16)
            .map(|n| {
                let [hi, lo] = n.to_be_bytes();
                WgPeerConfig {
                    public_key: random_key(),
                    endpoint: Some(SocketAddr::from(([192, 168, hi, lo], 51820))),
                    allowed_ips: vec![
                        net(&format!("10.{hi}.{lo}.0/24")),
                        net(&format!("fd00:{n:x}::/64")),
                    ],
                    persistent_keepalive: None,
                }
            })
            .collect();
        wg.set_peers("wg0", &peers).unwrap();
        let big = WgPeerConfig {
            public_key: random_key(),
            endpoint: None,
            allowed_ips: (0..4000u32)
                .map(|n| {
                    let ip = IpAddr::from((0x6400_0000 + (n << 8)).to_be_bytes());
                    IpNetwork::new(ip, 24).unwrap()
                })
                .collect(),
            persistent_keepalive: None,
        };
        wg.set_peer("wg0", &big).unwrap();
        let device = wg.device("wg0").unwrap();
        assert_eq!(device.peers.len(), 1501);
        let mut want: Vec<WgPeer> = peers.iter().map(as_dumped).collect();
        want.push(as_dumped(&big));
        let mut got = device.peers;
        for peer in &mut got {
            peer.allowed_ips.sort();
        }
        for peer in &mut want {
            peer.allowed_ips.sort();
        }
        assert_eq!(sorted(got), sorted(want));

        // A read that is given up ends at once, before the rest of the messages; the
        // handle is dropped (its socket still holds the dump) and another reads it all.
        let asked = std::cell::Cell::new(0);
        let given_up = wg.device_unless("wg0", || {
            asked.set(asked.get() + 1);
            asked.get() > 1
        });
        assert!(given_up.unwrap().is_none());
        assert_eq!(asked.get(), 2, "given up at the second message");
        drop(wg);
        let mut wg = Wireguard::open().unwrap();
        let whole = wg.device_unless("wg0", || false).unwrap().unwrap();
        assert_eq!(whole.peers.len(), 1501);

        // Replacing the big list by a short one leaves only the short one.
        let small = WgPeerConfig {
            allowed_ips: vec![net("100.0.0.0/24")],
            ..big.clone()
        };
        wg.set_peer("wg0", &small).unwrap();
        let device = wg.device("wg0").unwrap();
        let got = device
            .peers
            .iter()
            .find(|p| p.public_key == big.public_key)
            .unwrap();
        assert_eq!(got.allowed_ips, small.allowed_ips);
    });
}

/// Whether `to` answers a ping from the calling thread's netns within 3 s (echo
/// requests every 0.2 s until the first reply: a handshake goes first). `size` sets
/// the payload, and with it "don't fragment".
fn ping(to: IpAddr, size: Option<u32>) -> bool {
    let mut cmd = Command::new("ping");
    cmd.args(["-c", "1", "-w", "3", "-i", "0.2", "-n"]);
    if let Some(size) = size {
        cmd.args(["-M", "do", "-s", &size.to_string()]);
    }
    let out = cmd.arg(to.to_string()).output().expect("ping runs");
    if !out.status.success() {
        eprintln!(
            "ping {to}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status.success()
}

/// Node `n`'s WireGuard device `wg0` on its uplink `uplink` (192.168.100.n/24): keyed,
/// listening on 51820, up with 10.99.0.n/24 and fd00:99::n/64; returns its public key.
fn node(nl: &Netlink, wg: &mut Wireguard, netns: &NetNs, uplink: &str, n: u8) -> WgKey {
    for name in [
        "net/ipv6/conf/all/accept_dad",
        "net/ipv6/conf/default/accept_dad",
    ] {
        sysctl::write_in(netns, name, "0").unwrap();
    }
    let up = index_of(nl, uplink);
    nl.add_address(up, net(&format!("192.168.100.{n}/24")))
        .unwrap();
    nl.set_up(up).unwrap();
    nl.create_wireguard("wg0", Some(1500 - OVERHEAD_V4))
        .unwrap();
    let dev = index_of(nl, "wg0");
    wg.set_device("wg0", &random_key(), 51820, 0).unwrap();
    nl.add_address(dev, net(&format!("10.99.0.{n}/24")))
        .unwrap();
    nl.add_address(dev, net(&format!("fd00:99::{n}/64")))
        .unwrap();
    nl.set_up(dev).unwrap();
    wg.device("wg0").unwrap().public_key.unwrap()
}

#[test]
fn two_nodes_ping_each_other_through_the_tunnel() {
    let test = "two_nodes_ping_each_other_through_the_tunnel";
    in_private_netns(test, |nl| {
        let Some(mut wg1) = wireguard_or_skip(test) else {
            return;
        };
        let node2 = new_netns();
        nl.create_veth(&VethPair {
            name: "up1",
            mtu: None,
            controller: None,
            peer_name: "up2",
            peer_netns: Some(&node2),
            peer_mac: None,
            peer_mtu: None,
        })
        .unwrap();
        let nl2 = Netlink::connect_in(&node2).unwrap();
        let mut wg2 = Wireguard::open_in(&node2).unwrap();
        let key1 = node(&nl, &mut wg1, &NetNs::current().unwrap(), "up1", 1);
        let key2 = node(&nl2, &mut wg2, &node2, "up2", 2);
        let peer_of = |key, n: u8| {
            peer_config(
                key,
                &format!("192.168.100.{n}:51820"),
                &[&format!("10.99.0.{n}/32"), &format!("fd00:99::{n}/128")],
                None,
            )
        };
        wg1.set_peer("wg0", &peer_of(key2, 2)).unwrap();
        wg2.set_peer("wg0", &peer_of(key1, 1)).unwrap();

        assert!(ping(ip("10.99.0.2"), None), "IPv4 through the tunnel");
        assert!(ping(ip("fd00:99::2"), None), "IPv6 through the tunnel");
        // The largest packet that fits the device's MTU crosses whole, without
        // fragments; one byte more does not leave.
        let payload = 1500 - OVERHEAD_V4 - 28;
        assert!(ping(ip("10.99.0.2"), Some(payload)), "DF ping at the MTU");
        assert!(
            !ping(ip("10.99.0.2"), Some(payload + 1)),
            "DF ping past the MTU"
        );

        let seen = wg1.device("wg0").unwrap();
        let peer = &seen.peers[0];
        assert!(peer.last_handshake.is_some(), "{peer:?}");
        assert!(peer.rx_bytes > 0 && peer.tx_bytes > 0, "{peer:?}");
        assert_eq!(peer.endpoint, Some("192.168.100.2:51820".parse().unwrap()));

        // Without node 1 as its peer, node 2 drops what node 1 sends.
        wg2.remove_peer("wg0", &key1).unwrap();
        assert!(!ping(ip("10.99.0.2"), None), "answered without a peer");
        // Peers made again on both sides (node 1 forgetting its session, which node
        // 2 no longer has) shake hands again at the first packet.
        wg2.set_peer("wg0", &peer_of(key1, 1)).unwrap();
        wg1.remove_peer("wg0", &key2).unwrap();
        wg1.set_peer("wg0", &peer_of(key2, 2)).unwrap();
        assert!(ping(ip("10.99.0.2"), None), "answered again");
    });
}
