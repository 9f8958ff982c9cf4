//! Root tests of the overlay's netlink calls (VXLAN devices, FDB and neighbour
//! entries, onlink routes) against the real kernel, each in private network
//! namespaces: two "nodes" joined by a veth pair standing for the underlay.

mod common;

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use cni_linux::netlink::vtep_mac;
use cni_linux::netlink::vxlan::{IANA_PORT, OVERHEAD_V4, OVERHEAD_V6};
use cni_linux::{Change, Family, MacAddr, NetNs, Netlink, Route, VethPair, Vxlan, sysctl};
use common::{in_private_netns, index_of, ip, net, new_netns};
use ipnetwork::IpNetwork;

/// The protocol the agent stamps on its routes, in these tests.
const PROTO: u8 = 77;

/// No duplicate address detection in the namespace (IPv6 addresses usable at once).
fn no_dad(netns: &NetNs) {
    for name in [
        "net/ipv6/conf/all/accept_dad",
        "net/ipv6/conf/default/accept_dad",
    ] {
        sysctl::write_in(netns, name, "0").unwrap();
    }
}

/// One side of the test's underlay: the veth end `uplink` of node `n` (1 or 2),
/// up, with 192.168.100.n/24 and fd00:100::n/64.
fn underlay(nl: &Netlink, uplink: &str, n: u8) -> u32 {
    let index = index_of(nl, uplink);
    nl.add_address(index, net(&format!("192.168.100.{n}/24")))
        .unwrap();
    nl.add_address(index, net(&format!("fd00:100::{n}/64")))
        .unwrap();
    nl.set_up(index).unwrap();
    index
}

/// Node `n`'s underlay addresses.
fn node_v4(n: u8) -> IpAddr {
    ip(&format!("192.168.100.{n}"))
}

fn node_v6(n: u8) -> IpAddr {
    ip(&format!("fd00:100::{n}"))
}

/// Node `n`'s VTEP addresses: the first address of its pod CIDRs
/// (10.244.n.0/24, fd00:244:n::/64), as flannel uses them.
fn vtep_v4(n: u8) -> IpAddr {
    ip(&format!("10.244.{n}.0"))
}

fn vtep_v6(n: u8) -> IpAddr {
    ip(&format!("fd00:244:{n}::"))
}

/// The device of family `v6` of node `n`, as the agent would make it.
fn device(n: u8, v6: bool, underlay: u32) -> Vxlan<'static> {
    let local = if v6 { node_v6(n) } else { node_v4(n) };
    Vxlan {
        name: if v6 { "vxlan6" } else { "vxlan4" },
        vni: 4242,
        local: Some(local),
        port: IANA_PORT,
        underlay: Some(underlay),
        mtu: Some(1500 - if v6 { OVERHEAD_V6 } else { OVERHEAD_V4 }),
        mac: Some(vtep_mac(local)),
    }
}

/// Node `n`'s overlay: both devices, up, each with its VTEP address; returns
/// (vxlan4, vxlan6) indexes.
fn overlay(nl: &Netlink, n: u8, uplink: u32) -> (u32, u32) {
    let mut indexes = [0; 2];
    for (slot, v6) in [false, true].into_iter().enumerate() {
        let dev = device(n, v6, uplink);
        nl.create_vxlan(&dev).unwrap();
        let index = index_of(nl, dev.name);
        let vtep = if v6 { vtep_v6(n) } else { vtep_v4(n) };
        nl.add_address(index, IpNetwork::from(vtep)).unwrap();
        nl.set_up(index).unwrap();
        indexes[slot] = index;
    }
    (indexes[0], indexes[1])
}

/// What node `local` programs for the remote node `remote` (by hand here, by
/// the agent's reconciler later): FDB entry, neighbour entry and onlink route,
/// both families.
fn program_peer(nl: &Netlink, (vx4, vx6): (u32, u32), remote: u8) {
    let changes = peer_changes((vx4, vx6), remote);
    for (change, outcome) in changes.iter().zip(nl.apply(&changes).unwrap()) {
        outcome.unwrap_or_else(|e| panic!("{change:?}: {e:?}"));
    }
}

fn peer_changes((vx4, vx6): (u32, u32), remote: u8) -> Vec<Change> {
    let mut changes = Vec::new();
    for (index, node, vtep, cidr) in [
        (
            vx4,
            node_v4(remote),
            vtep_v4(remote),
            format!("10.244.{remote}.0/24"),
        ),
        (
            vx6,
            node_v6(remote),
            vtep_v6(remote),
            format!("fd00:244:{remote}::/64"),
        ),
    ] {
        changes.extend(tunnel_to(index, node, vtep, net(&cidr)));
    }
    changes
}

/// A peer through the device `index`: its FDB entry (its VTEP MAC at the underlay
/// address `node`), its neighbour entry (`vtep` at that MAC), and the route of its pod
/// CIDR via `vtep`, in that order.
fn tunnel_to(index: u32, node: IpAddr, vtep: IpAddr, cidr: IpNetwork) -> [Change; 3] {
    let mac = vtep_mac(node);
    [
        Change::ReplaceFdbEntry {
            index,
            mac,
            dst: node,
        },
        Change::ReplaceNeighbour {
            index,
            ip: vtep,
            mac,
        },
        Change::ReplaceRoute(Route {
            gw: Some(vtep),
            oif: Some(index),
            onlink: true,
            protocol: Some(PROTO),
            ..Route::new(cidr)
        }),
    ]
}

/// Two nodes: this thread's netns (node 1) and a new one (node 2), joined by
/// the veth pair up1/up2; returns node 2's netns, its handle and both uplinks.
fn two_nodes(nl: &Netlink) -> (NetNs, Netlink, u32, u32) {
    let node2 = new_netns();
    no_dad(&NetNs::current().unwrap());
    no_dad(&node2);
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
    let up1 = underlay(nl, "up1", 1);
    let up2 = underlay(&nl2, "up2", 2);
    (node2, nl2, up1, up2)
}

/// Whether `to` answers a ping from the calling thread's netns (a child inherits the
/// thread's) within 3 s: echo requests every 0.2 s until the first reply, since a
/// device just made and addressed may drop the very first packets (seen once for IPv6
/// in a whole run of the suite).
fn ping(to: IpAddr) -> bool {
    let out = Command::new("ping")
        .args(["-c", "1", "-w", "3", "-i", "0.2", "-n"])
        .arg(to.to_string())
        .output()
        .expect("ping runs");
    if !out.status.success() {
        eprintln!(
            "ping {to}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status.success()
}

#[test]
fn vxlan_devices_are_created_read_back_changed_and_deleted() {
    in_private_netns(
        "vxlan_devices_are_created_read_back_changed_and_deleted",
        |nl| {
            no_dad(&NetNs::current().unwrap());
            nl.create_veth_pair_local("up1", "up9", None).unwrap();
            let up = underlay(&nl, "up1", 1);
            let v4 = device(1, false, up);
            let v6 = device(1, true, up);
            nl.create_vxlan(&v4).unwrap();
            nl.create_vxlan(&v6).unwrap();

            let link = nl.require_link("vxlan4").unwrap();
            assert_eq!(link.kind.as_deref(), Some("vxlan"));
            assert_eq!(link.mac, Some(vtep_mac(node_v4(1))));
            assert_eq!(link.mtu, 1450);
            assert!(!link.up, "created down");
            let info = link.vxlan.unwrap();
            assert_eq!(
                (info.vni, info.port, info.local, info.underlay),
                (4242, IANA_PORT, Some(node_v4(1)), Some(up))
            );
            assert!(!info.learning && info.udp_csum, "{info:?}");
            assert!(v4.matches(&link));
            let six = nl.require_link("vxlan6").unwrap();
            let info6 = six.vxlan.unwrap();
            assert_eq!((info6.vni, info6.local), (4242, Some(node_v6(1))));
            assert!(!info6.udp6_zero_csum_tx && !info6.udp6_zero_csum_rx && !info6.learning);
            assert_eq!(six.mtu, 1430);
            assert!(v6.matches(&six) && !v6.matches(&link));
            assert_eq!(nl.require_link("up1").unwrap().vxlan, None);

            // In place: MTU (up to the underlay's minus the overhead), MAC, up/down.
            nl.set_mtu(link.index, 1400).unwrap();
            let too_big = nl.set_mtu(link.index, 1451).unwrap_err();
            assert_eq!(too_big.errno(), Some(nix::libc::EINVAL), "{too_big:?}");
            let other: MacAddr = "0a:58:01:02:03:04".parse().unwrap();
            nl.set_mac(link.index, other).unwrap();
            nl.set_up(link.index).unwrap();
            let changed = nl.link_by_index(link.index).unwrap().unwrap();
            assert_eq!(
                (changed.mtu, changed.mac, changed.up),
                (1400, Some(other), true)
            );
            assert!(
                v4.matches(&changed),
                "MTU, MAC and up/down are not compared"
            );
            nl.set_down(link.index).unwrap();

            // The name, and the VNI on the same port in the same family, are taken;
            // the kernel says which.
            let taken = nl.create_vxlan(&v4).unwrap_err();
            assert!(taken.is_exists(), "{taken:?}");
            let same_vni = nl
                .create_vxlan(&Vxlan {
                    name: "vxlan4b",
                    ..v4
                })
                .unwrap_err();
            assert!(same_vni.is_exists(), "{same_vni:?}");
            eprintln!(
                "same VNI and port: {}",
                cni_protocol::error::chain(&same_vni)
            );
            // Another VNI, or another port, is another device.
            nl.create_vxlan(&Vxlan {
                name: "vxlan4c",
                vni: 4243,
                mac: None,
                ..v4
            })
            .unwrap();
            assert!(nl.delete_link_by_name("vxlan4c").unwrap());

            // Deleting the underlay deletes the devices on it.
            nl.delete_link(up).unwrap();
            assert_eq!(nl.link_by_name("vxlan4").unwrap(), None);
            assert_eq!(nl.link_by_name("vxlan6").unwrap(), None);
            // Without an underlay or an MTU the kernel makes it 1500, too big
            // for a 1500-byte underlay: the agent sets it.
            nl.create_vxlan(&Vxlan {
                underlay: None,
                mtu: None,
                ..v4
            })
            .unwrap();
            assert_eq!(nl.require_link("vxlan4").unwrap().mtu, 1500);
            assert!(nl.delete_link_by_name("vxlan4").unwrap());
            assert!(!nl.delete_link_by_name("vxlan4").unwrap());
        },
    );
}

#[test]
fn fdb_entries_are_added_replaced_listed_and_deleted() {
    in_private_netns("fdb_entries_are_added_replaced_listed_and_deleted", |nl| {
        no_dad(&NetNs::current().unwrap());
        nl.create_veth_pair_local("up1", "up9", None).unwrap();
        let up = underlay(&nl, "up1", 1);
        for v6 in [false, true] {
            let dev = device(1, v6, up);
            nl.create_vxlan(&dev).unwrap();
            let index = index_of(&nl, dev.name);
            assert!(nl.fdb_entries(index).unwrap().is_empty());
            let (remote, moved) = if v6 {
                (node_v6(2), node_v6(3))
            } else {
                (node_v4(2), node_v4(3))
            };
            let mac = vtep_mac(remote);
            nl.add_fdb_entry(index, mac, remote).unwrap();
            let dup = nl.add_fdb_entry(index, mac, remote).unwrap_err();
            assert!(dup.is_exists(), "{dup:?}");
            let entries = nl.fdb_entries(index).unwrap();
            assert_eq!(entries.len(), 1, "{entries:?}");
            let e = entries[0];
            assert_eq!((e.index, e.mac, e.dst), (index, mac, Some(remote)));
            assert!(e.is_permanent() && e.is_self(), "{e}");
            assert_eq!((e.vni, e.port), (None, None), "the device's own");

            // Replace moves the one destination; twice is the same.
            nl.replace_fdb_entry(index, mac, moved).unwrap();
            nl.replace_fdb_entry(index, mac, moved).unwrap();
            let entries = nl.fdb_entries(index).unwrap();
            assert_eq!(
                entries.iter().map(|e| (e.mac, e.dst)).collect::<Vec<_>>(),
                [(mac, Some(moved))]
            );

            // Another device's entries are not listed.
            let other = vtep_mac(ip("192.168.100.200"));
            nl.replace_fdb_entry(index, other, moved).unwrap();
            assert_eq!(nl.fdb_entries(index).unwrap().len(), 2);
            assert!(nl.fdb_entries(up).unwrap().iter().all(|e| e.index == up));

            // Deleting a destination that is not the entry's is a silent no-op;
            // the right one, or none, deletes the entry.
            nl.del_fdb_entry(index, mac, Some(remote)).unwrap();
            assert_eq!(nl.fdb_entries(index).unwrap().len(), 2);
            nl.del_fdb_entry(index, mac, Some(moved)).unwrap();
            nl.del_fdb_entry(index, other, None).unwrap();
            assert!(nl.fdb_entries(index).unwrap().is_empty());
            let gone = nl.del_fdb_entry(index, mac, None).unwrap_err();
            assert!(gone.is_not_found(), "{gone:?}");
        }
        // The IPv4 device takes an IPv6 destination (and could not send to it).
        let vx4 = index_of(&nl, "vxlan4");
        let cross = nl
            .add_fdb_entry(vx4, vtep_mac(node_v6(2)), node_v6(2))
            .unwrap_err();
        assert_eq!(cross.errno(), Some(nix::libc::EAFNOSUPPORT), "{cross:?}");
    });
}

#[test]
fn neighbours_are_added_replaced_listed_and_deleted() {
    in_private_netns("neighbours_are_added_replaced_listed_and_deleted", |nl| {
        no_dad(&NetNs::current().unwrap());
        nl.create_veth_pair_local("up1", "up9", None).unwrap();
        let up = underlay(&nl, "up1", 1);
        let (vx4, vx6) = overlay(&nl, 1, up);
        for (index, family, vtep) in [(vx4, Family::V4, vtep_v4(2)), (vx6, Family::V6, vtep_v6(2))]
        {
            let mac = vtep_mac(vtep);
            nl.add_neighbour(index, vtep, mac).unwrap();
            let dup = nl.add_neighbour(index, vtep, mac).unwrap_err();
            assert!(dup.is_exists(), "{dup:?}");
            let ours: Vec<_> = nl
                .neighbours(index, Some(family))
                .unwrap()
                .into_iter()
                .filter(|n| n.is_permanent())
                .collect();
            assert_eq!(ours.len(), 1, "{ours:?}");
            assert_eq!(
                (ours[0].index, ours[0].ip, ours[0].mac),
                (index, vtep, Some(mac))
            );

            let other: MacAddr = "0a:58:ff:ff:ff:01".parse().unwrap();
            nl.replace_neighbour(index, vtep, other).unwrap();
            nl.replace_neighbour(index, vtep, other).unwrap();
            let all = nl.neighbours(index, None).unwrap();
            let found: Vec<_> = all.iter().filter(|n| n.ip == vtep).collect();
            assert_eq!(found.len(), 1, "{all:?}");
            assert_eq!(found[0].mac, Some(other));
            assert!(all.iter().all(|n| n.index == index));

            nl.del_neighbour(index, vtep).unwrap();
            assert!(
                nl.neighbours(index, None)
                    .unwrap()
                    .iter()
                    .all(|n| n.ip != vtep)
            );
            let gone = nl.del_neighbour(index, vtep).unwrap_err();
            assert!(gone.is_not_found(), "{gone:?}");
        }
    });
}

#[test]
fn two_nodes_ping_each_other_across_the_vxlan_in_both_families() {
    in_private_netns(
        "two_nodes_ping_each_other_across_the_vxlan_in_both_families",
        |nl| {
            let (node2, nl2, up1, up2) = two_nodes(&nl);
            let dev1 = overlay(&nl, 1, up1);
            let dev2 = overlay(&nl2, 2, up2);
            program_peer(&nl, dev1, 2);
            program_peer(&nl2, dev2, 1);

            // The VTEP addresses of node 2, from node 1.
            assert!(ping(vtep_v4(2)), "IPv4 across the VXLAN");
            assert!(ping(vtep_v6(2)), "IPv6 across the VXLAN");

            // A pod behind node 2, as the bridge plugin would attach it: a veth
            // into a third netns, node 2 forwarding.
            let pod = new_netns();
            no_dad(&pod);
            for name in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"] {
                sysctl::write_in(&node2, name, "1").unwrap();
            }
            nl2.create_veth(&VethPair {
                name: "vpod",
                mtu: Some(1430),
                controller: None,
                peer_name: "eth0",
                peer_netns: Some(&pod),
                peer_mac: None,
                peer_mtu: Some(1430),
            })
            .unwrap();
            let vpod = index_of(&nl2, "vpod");
            nl2.add_address(vpod, net("10.244.2.1/24")).unwrap();
            nl2.add_address(vpod, net("fd00:244:2::1/64")).unwrap();
            nl2.set_up(vpod).unwrap();
            let in_pod = Netlink::connect_in(&pod).unwrap();
            let eth0 = index_of(&in_pod, "eth0");
            in_pod.add_address(eth0, net("10.244.2.5/24")).unwrap();
            in_pod.add_address(eth0, net("fd00:244:2::5/64")).unwrap();
            in_pod.set_up(eth0).unwrap();
            for (dst, gw) in [("0.0.0.0/0", "10.244.2.1"), ("::/0", "fd00:244:2::1")] {
                in_pod
                    .add_route(&Route {
                        gw: Some(ip(gw)),
                        oif: Some(eth0),
                        ..Route::new(net(dst))
                    })
                    .unwrap();
            }
            assert!(ping(ip("10.244.2.5")), "IPv4 to a pod behind node 2");
            assert!(ping(ip("fd00:244:2::5")), "IPv6 to a pod behind node 2");

            // Without node 1's FDB entries on node 2 the answers have nowhere to go.
            let mac1 = vtep_mac(node_v4(1));
            nl2.del_fdb_entry(dev2.0, mac1, None).unwrap();
            assert!(!ping(vtep_v4(2)), "answered without an FDB entry");
            nl2.replace_fdb_entry(dev2.0, mac1, node_v4(1)).unwrap();
            assert!(ping(vtep_v4(2)));
        },
    );
}

/// Down and up again, the device keeps its FDB entries but loses its neighbour
/// entries and the routes through it (both families): the agent programs them
/// again when it sees the device come back up.
#[test]
fn a_device_set_down_keeps_its_fdb_and_loses_neighbours_and_routes() {
    in_private_netns(
        "a_device_set_down_keeps_its_fdb_and_loses_neighbours_and_routes",
        |nl| {
            let (_node2, _nl2, up1, _up2) = two_nodes(&nl);
            let (vx4, vx6) = overlay(&nl, 1, up1);
            program_peer(&nl, (vx4, vx6), 2);
            let ours = |nl: &Netlink, family| {
                nl.routes(family, Some(254))
                    .unwrap()
                    .into_iter()
                    .filter(|r| r.protocol == Some(PROTO))
                    .count()
            };
            assert_eq!((ours(&nl, Family::V4), ours(&nl, Family::V6)), (1, 1));
            for index in [vx4, vx6] {
                nl.set_down(index).unwrap();
                nl.set_up(index).unwrap();
                assert_eq!(nl.fdb_entries(index).unwrap().len(), 1, "FDB kept");
                let neighbours = nl.neighbours(index, None).unwrap();
                assert!(
                    !neighbours.iter().any(|n| n.is_permanent()),
                    "{neighbours:?}"
                );
            }
            assert_eq!((ours(&nl, Family::V4), ours(&nl, Family::V6)), (0, 0));
            // Programming the peer again brings everything back.
            program_peer(&nl, (vx4, vx6), 2);
            assert_eq!((ours(&nl, Family::V4), ours(&nl, Family::V6)), (1, 1));
        },
    );
}

/// The route to node 2's pod CIDR moves between the underlay (node 2 reachable
/// directly, a plain route via its address) and the VXLAN device (an onlink
/// route via its VTEP address), with `NLM_F_REPLACE`: in place in both families.
#[test]
fn routes_move_between_the_uplink_and_the_vxlan_in_place() {
    in_private_netns(
        "routes_move_between_the_uplink_and_the_vxlan_in_place",
        |nl| {
            let (_node2, nl2, up1, up2) = two_nodes(&nl);
            let dev1 = overlay(&nl, 1, up1);
            let dev2 = overlay(&nl2, 2, up2);
            program_peer(&nl2, dev2, 1);
            for (family, cidr, direct_gw, vtep, vx) in [
                (Family::V4, "10.244.2.0/24", node_v4(2), vtep_v4(2), dev1.0),
                (
                    Family::V6,
                    "fd00:244:2::/64",
                    node_v6(2),
                    vtep_v6(2),
                    dev1.1,
                ),
            ] {
                let mac = vtep_mac(direct_gw);
                nl.replace_fdb_entry(vx, mac, direct_gw).unwrap();
                nl.replace_neighbour(vx, vtep, mac).unwrap();
                let direct = Route {
                    gw: Some(direct_gw),
                    protocol: Some(PROTO),
                    ..Route::new(net(cidr))
                };
                let overlay = Route {
                    gw: Some(vtep),
                    oif: Some(vx),
                    onlink: true,
                    protocol: Some(PROTO),
                    ..Route::new(net(cidr))
                };
                let routes_to = |nl: &Netlink| -> Vec<Route> {
                    nl.routes(family, Some(254))
                        .unwrap()
                        .into_iter()
                        .filter(|r| r.dst == net(cidr))
                        .collect()
                };
                // A host route for the VTEP address through the device, for as long
                // as the onlink route replaces the direct one (see below).
                let host = Route {
                    oif: Some(vx),
                    protocol: Some(PROTO),
                    ..Route::new(IpNetwork::from(vtep))
                };
                for (step, want, oif) in [
                    ("direct", &direct, up1),
                    ("to the VXLAN", &overlay, vx),
                    ("back to direct", &direct, up1),
                    ("to the VXLAN again", &overlay, vx),
                ] {
                    if want.onlink && family == Family::V6 {
                        // IPv6 checks an onlink gateway against the routes: one through
                        // another device covering it (here the very route being replaced)
                        // is refused.
                        let e = nl.replace_route(want).unwrap_err();
                        assert_eq!(e.errno(), Some(nix::libc::EINVAL), "{e:?}");
                        eprintln!("IPv6 direct to onlink: {}", cni_protocol::error::chain(&e));
                        // In one batch: the host route, the replacement, the host route
                        // gone; the replacement stays.
                        let outcomes = nl
                            .apply(&[
                                Change::ReplaceRoute(host),
                                Change::ReplaceRoute(*want),
                                Change::DelRoute(host),
                            ])
                            .unwrap();
                        for outcome in outcomes {
                            outcome.unwrap();
                        }
                    } else {
                        nl.replace_route(want).unwrap();
                    }
                    let now = routes_to(&nl);
                    assert_eq!(now.len(), 1, "{family:?} {step}: {now:?}");
                    let r = now[0];
                    assert_eq!(
                        (r.gw, r.oif, r.onlink),
                        (want.gw, Some(oif), want.onlink),
                        "{family:?} {step}"
                    );
                    // The pod CIDR's first address answers either way (node 2 owns it).
                    assert!(ping(vtep), "{family:?} {step}");
                }
                // Another metric is another route, beside the first.
                nl.replace_route(&Route {
                    metric: Some(100),
                    ..direct
                })
                .unwrap();
                assert_eq!(
                    routes_to(&nl).len(),
                    2,
                    "{family:?}: the metric is part of the key"
                );
                nl.del_route(&Route {
                    metric: Some(100),
                    ..direct
                })
                .unwrap();
                nl.del_route(&overlay).unwrap();
                assert!(routes_to(&nl).is_empty());
            }

            // An onlink route through a device that is down: refused in both
            // families ("Nexthop device is not up"); the agent sets the device up
            // before it adds the routes.
            nl.set_down(dev1.0).unwrap();
            nl.set_down(dev1.1).unwrap();
            let v4 = Route {
                gw: Some(vtep_v4(2)),
                oif: Some(dev1.0),
                onlink: true,
                ..Route::new(net("10.244.2.0/24"))
            };
            let v6 = Route {
                gw: Some(vtep_v6(2)),
                oif: Some(dev1.1),
                onlink: true,
                ..Route::new(net("fd00:244:2::/64"))
            };
            for route in [v4, v6] {
                let e = nl.replace_route(&route).unwrap_err();
                eprintln!("device down: {}", cni_protocol::error::chain(&e));
                assert_eq!(e.errno(), Some(nix::libc::ENETDOWN), "{e:?}");
            }
            // Without onlink, the VTEP address is on no subnet of the device:
            // refused too.
            nl.set_up(dev1.0).unwrap();
            nl.set_up(dev1.1).unwrap();
            for route in [v4, v6] {
                let e = nl
                    .replace_route(&Route {
                        onlink: false,
                        ..route
                    })
                    .unwrap_err();
                eprintln!("without onlink: {}", cni_protocol::error::chain(&e));
            }
        },
    );
}

/// An agent's start at 5,000 remote nodes: their FDB entries in one `apply`,
/// timed and printed (a bound only catches the pathological).
#[test]
fn five_thousand_fdb_entries_in_one_apply() {
    in_private_netns("five_thousand_fdb_entries_in_one_apply", |nl| {
        const PEERS: u32 = 5_000;
        let dev = Vxlan {
            name: "vxlan4",
            vni: 4242,
            local: Some(ip("192.168.100.1")),
            port: IANA_PORT,
            underlay: None,
            mtu: None,
            mac: None,
        };
        nl.create_vxlan(&dev).unwrap();
        let index = index_of(&nl, "vxlan4");
        let peers: Vec<IpAddr> = (0..PEERS)
            .map(|i| IpAddr::from(std::net::Ipv4Addr::from(0xac10_0000 + i)))
            .collect();
        let fdb: Vec<Change> = peers
            .iter()
            .map(|&dst| Change::ReplaceFdbEntry {
                index,
                mac: vtep_mac(dst),
                dst,
            })
            .collect();

        let start = Instant::now();
        let outcomes = nl.apply(&fdb).unwrap();
        let batched = start.elapsed();
        assert_eq!(outcomes.len(), fdb.len());
        assert!(outcomes.iter().all(Result::is_ok));

        let start = Instant::now();
        let entries = nl.fdb_entries(index).unwrap();
        let dumped = start.elapsed();
        assert_eq!(entries.len(), PEERS as usize);
        assert!(entries.iter().all(|e| e.is_permanent() && e.is_self()));
        let mut dsts: Vec<IpAddr> = entries.iter().filter_map(|e| e.dst).collect();
        dsts.sort();
        assert_eq!(dsts, peers);

        // For comparison: the same entries on a second device, one request each.
        nl.create_vxlan(&Vxlan {
            name: "vxlan4b",
            vni: 4243,
            ..dev
        })
        .unwrap();
        let other = index_of(&nl, "vxlan4b");
        let start = Instant::now();
        for &dst in &peers {
            nl.replace_fdb_entry(other, vtep_mac(dst), dst).unwrap();
        }
        let one_by_one = start.elapsed();
        // And the batch again: all there already, nothing changes.
        let start = Instant::now();
        assert!(nl.apply(&fdb).unwrap().iter().all(Result::is_ok));
        let unchanged = start.elapsed();

        let delete: Vec<Change> = peers
            .iter()
            .map(|&dst| Change::DelFdbEntry {
                index,
                mac: vtep_mac(dst),
                dst: None,
            })
            .collect();
        let start = Instant::now();
        assert!(nl.apply(&delete).unwrap().iter().all(Result::is_ok));
        let deleted = start.elapsed();
        assert!(nl.fdb_entries(index).unwrap().is_empty());
        // Deleted again: every request refused, each refusal reported (none lost
        // to a full receive buffer).
        let start = Instant::now();
        let again = nl.apply(&delete).unwrap();
        let refused = start.elapsed();
        assert!(
            again
                .iter()
                .all(|o| o.as_ref().is_err_and(|e| e.is_not_found()))
        );

        println!(
            "{PEERS} FDB entries: added in one apply in {batched:?} (one request each: \
             {one_by_one:?}), dumped in {dumped:?}, replaced unchanged in one apply in \
             {unchanged:?}, deleted in one apply in {deleted:?}, deleted again (all refused) \
             in one apply in {refused:?}"
        );
        assert!(batched < Duration::from_secs(60), "{batched:?}");
    });
}

/// The whole start of an agent at 5,000 remote nodes in one family: FDB entry,
/// neighbour entry and onlink route each, in one `apply`, timed and printed.
#[test]
fn five_thousand_peers_programmed_in_one_apply() {
    in_private_netns("five_thousand_peers_programmed_in_one_apply", |nl| {
        const PEERS: u32 = 5_000;
        nl.create_vxlan(&Vxlan {
            name: "vxlan4",
            vni: 4242,
            local: Some(ip("192.168.100.1")),
            port: IANA_PORT,
            underlay: None,
            mtu: None,
            mac: None,
        })
        .unwrap();
        let index = index_of(&nl, "vxlan4");
        nl.set_up(index).unwrap();
        // Its own VTEP address. (Without any IPv4 address in the namespace
        // there is no local table, and IPv4 takes no onlink gateway: "Nexthop
        // has invalid gateway".)
        nl.add_address(index, net("10.255.0.0/32")).unwrap();
        let mut changes = Vec::new();
        for i in 0..PEERS {
            let node = IpAddr::from(std::net::Ipv4Addr::from(0xac10_0000 + i));
            // Pod CIDR 10.(i / 256).(i % 256).0/24 under 10.0.0.0/8, VTEP its .0.
            let vtep = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + (i << 8)));
            changes.extend(tunnel_to(
                index,
                node,
                vtep,
                IpNetwork::new(vtep, 24).unwrap(),
            ));
        }
        let start = Instant::now();
        let outcomes = nl.apply(&changes).unwrap();
        let took = start.elapsed();
        let failed: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        assert!(
            failed.is_empty(),
            "{} failed, first {:?}",
            failed.len(),
            failed[0]
        );
        let routes = nl.routes(Family::V4, Some(254)).unwrap();
        assert_eq!(
            routes
                .iter()
                .filter(|r| r.protocol == Some(PROTO) && r.onlink)
                .count(),
            PEERS as usize
        );
        assert_eq!(
            nl.neighbours(index, Some(Family::V4))
                .unwrap()
                .iter()
                .filter(|n| n.is_permanent())
                .count(),
            PEERS as usize
        );
        println!(
            "{PEERS} peers (FDB entry, neighbour entry, onlink route: {} changes) in one apply in {took:?}",
            changes.len()
        );
        assert!(took < Duration::from_secs(120), "{took:?}");
    });
}

#[test]
fn a_refused_change_is_reported_and_the_rest_go_in() {
    in_private_netns("a_refused_change_is_reported_and_the_rest_go_in", |nl| {
        nl.create_vxlan(&Vxlan {
            name: "vxlan4",
            vni: 4242,
            local: None,
            port: IANA_PORT,
            underlay: None,
            mtu: None,
            mac: None,
        })
        .unwrap();
        let index = index_of(&nl, "vxlan4");
        let a = vtep_mac(ip("172.16.0.1"));
        let b = vtep_mac(ip("172.16.0.2"));
        let changes = [
            Change::ReplaceFdbEntry {
                index,
                mac: a,
                dst: ip("172.16.0.1"),
            },
            // Nothing to delete.
            Change::DelFdbEntry {
                index,
                mac: b,
                dst: None,
            },
            // No such device.
            Change::ReplaceNeighbour {
                index: 4242,
                ip: ip("10.0.0.1"),
                mac: a,
            },
            // Mixed families: refused before it is sent.
            Change::ReplaceRoute(Route {
                gw: Some(ip("10.0.0.1")),
                ..Route::new(net("fd00::/64"))
            }),
            Change::ReplaceFdbEntry {
                index,
                mac: b,
                dst: ip("172.16.0.2"),
            },
        ];
        let outcomes = nl.apply(&changes).unwrap();
        assert!(outcomes[0].is_ok() && outcomes[4].is_ok(), "{outcomes:?}");
        let gone = outcomes[1].as_ref().unwrap_err();
        assert!(gone.is_not_found(), "{gone:?}");
        assert!(gone.to_string().contains(&b.to_string()), "{gone}");
        let nodev = outcomes[2].as_ref().unwrap_err();
        assert!(nodev.is_not_found(), "{nodev:?}");
        assert!(
            matches!(outcomes[3], Err(cni_linux::Error::InvalidRoute { .. })),
            "{outcomes:?}"
        );
        let macs: Vec<MacAddr> = nl
            .fdb_entries(index)
            .unwrap()
            .iter()
            .map(|e| e.mac)
            .collect();
        assert_eq!(macs.len(), 2);
        assert!(macs.contains(&a) && macs.contains(&b));
        assert!(nl.apply(&[]).unwrap().is_empty());
    });
}
