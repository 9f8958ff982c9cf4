//! Root tests of the netlink client against the real kernel, each in its
//! own private network namespace.

mod common;

use std::time::Duration;

use cni_linux::{
    AddressOptions, Error, Family, MacAddr, Netlink, OPER_UP_DELAYS, OperState, Route, VethPair,
    VlanEntry, sysctl,
};
use common::{in_private_netns, index_of, ip, net, new_netns};
use ipnetwork::IpNetwork;

/// A veth pair with both ends up in this netns; returns (a, b) indexes.
fn up_pair(nl: &Netlink, a: &str, b: &str) -> (u32, u32) {
    nl.create_veth_pair_local(a, b, None).unwrap();
    let (ia, ib) = (index_of(nl, a), index_of(nl, b));
    nl.set_up(ia).unwrap();
    nl.set_up(ib).unwrap();
    (ia, ib)
}

/// Creates a VLAN-filtering bridge; `None` (after saying so) on kernels
/// built without CONFIG_BRIDGE_VLAN_FILTERING, which answer EOPNOTSUPP.
/// Under `CNI_RS_REQUIRE_VLAN=1` (set by the stock-kernel VM tier,
/// tests/vm/run-vlan-tier.sh) such a kernel is a failure instead.
fn vlan_bridge(nl: &Netlink, name: &str, test: &str) -> Option<u32> {
    match nl.create_bridge(name, None, true) {
        Ok(()) => Some(index_of(nl, name)),
        Err(e) if e.errno() == Some(nix::errno::Errno::EOPNOTSUPP as i32) => {
            assert!(
                std::env::var("CNI_RS_REQUIRE_VLAN").as_deref() != Ok("1"),
                "{test}: CNI_RS_REQUIRE_VLAN=1 but the kernel lacks bridge VLAN filtering ({e:?})"
            );
            eprintln!("skipping {test}: kernel lacks bridge VLAN filtering ({e:?})");
            None
        }
        Err(e) => panic!("{e:?}"),
    }
}

#[test]
fn bridge_is_created_with_and_without_vlan_filtering() {
    in_private_netns("bridge_is_created_with_and_without_vlan_filtering", |nl| {
        nl.create_bridge("br-plain", Some(1400), false).unwrap();

        let plain = nl.link_by_name("br-plain").unwrap().unwrap();
        assert_eq!(plain.kind.as_deref(), Some("bridge"));
        assert_eq!(plain.mtu, 1400);
        assert_eq!(plain.vlan_filtering, Some(false));
        assert!(!plain.up, "bridge must be created down");
        assert!(plain.mac.is_some());
        assert_eq!(
            nl.link_by_index(plain.index).unwrap().unwrap().name,
            "br-plain"
        );

        let names: Vec<String> = nl.links().unwrap().into_iter().map(|l| l.name).collect();
        assert!(names.contains(&"br-plain".to_owned()) && names.contains(&"lo".to_owned()));

        let test = "bridge_is_created_with_and_without_vlan_filtering";
        if let Some(index) = vlan_bridge(&nl, "br-vlan", test) {
            let vlan = nl.link_by_index(index).unwrap().unwrap();
            assert_eq!(vlan.vlan_filtering, Some(true));
        }
    });
}

#[test]
fn duplicate_bridge_reports_exists() {
    in_private_netns("duplicate_bridge_reports_exists", |nl| {
        nl.create_bridge("br0", None, false).unwrap();
        let err = nl.create_bridge("br0", None, false).unwrap_err();
        assert!(err.is_exists(), "{err:?}");
        assert!(err.to_string().contains("br0"), "{err}");
    });
}

#[test]
fn missing_link_is_none_and_not_found() {
    in_private_netns("missing_link_is_none_and_not_found", |nl| {
        assert_eq!(nl.link_by_name("nope0").unwrap(), None);
        assert_eq!(nl.link_by_index(4242).unwrap(), None);
        let err = nl.require_link("nope0").unwrap_err();
        assert!(err.is_not_found(), "{err:?}");
        assert!(nl.delete_link(4242).unwrap_err().is_not_found());
        assert!(!nl.delete_link_by_name("nope0").unwrap());
    });
}

#[test]
fn veth_peer_lands_in_pod_netns_on_bridge() {
    in_private_netns("veth_peer_lands_in_pod_netns_on_bridge", |nl| {
        let pod = new_netns();
        nl.create_bridge("cni0", None, false).unwrap();
        let bridge = index_of(&nl, "cni0");
        let mac: MacAddr = "0a:58:0a:01:02:03".parse().unwrap();

        nl.create_veth(&VethPair {
            name: "veth0123abcd",
            mtu: Some(1450),
            controller: Some(bridge),
            peer_name: "eth0",
            peer_netns: Some(&pod),
            peer_mac: Some(mac),
            peer_mtu: Some(1450),
        })
        .unwrap();

        let host = nl.require_link("veth0123abcd").unwrap();
        assert_eq!(host.kind.as_deref(), Some("veth"));
        assert_eq!(host.controller, Some(bridge));
        assert_eq!(host.mtu, 1450);
        assert!(host.link_netnsid.is_some(), "peer must be in another netns");
        assert_eq!(host.bridge_port.map(|p| p.hairpin), Some(false));
        assert!(
            nl.link_by_name("eth0").unwrap().is_none(),
            "peer leaked into host netns"
        );

        let in_pod = Netlink::connect_in(&pod).unwrap();
        let peer = in_pod.require_link("eth0").unwrap();
        assert_eq!(peer.kind.as_deref(), Some("veth"));
        assert_eq!(peer.mac, Some(mac));
        assert_eq!(peer.mtu, 1450);
        assert_eq!(host.peer_index, Some(peer.index));
        assert_eq!(peer.peer_index, Some(host.index));
        assert!(in_pod.link_by_name("veth0123abcd").unwrap().is_none());
    });
}

#[test]
fn duplicate_veth_names_report_exists_on_either_side() {
    in_private_netns("duplicate_veth_names_report_exists_on_either_side", |nl| {
        let pod = new_netns();
        let pair = |name, peer_name| VethPair {
            name,
            mtu: None,
            controller: None,
            peer_name,
            peer_netns: Some(&pod),
            peer_mac: None,
            peer_mtu: None,
        };
        nl.create_veth(&pair("vethaaaa0001", "eth0")).unwrap();

        let host_taken = nl.create_veth(&pair("vethaaaa0001", "eth1")).unwrap_err();
        assert!(host_taken.is_exists(), "{host_taken:?}");
        let pod_taken = nl.create_veth(&pair("vethaaaa0002", "eth0")).unwrap_err();
        assert!(pod_taken.is_exists(), "{pod_taken:?}");
        // One request means nothing is left behind by the failed attempts.
        assert!(nl.link_by_name("vethaaaa0002").unwrap().is_none());
        let in_pod = Netlink::connect_in(&pod).unwrap();
        assert!(in_pod.link_by_name("eth1").unwrap().is_none());
    });
}

#[test]
fn link_attributes_change_and_links_delete() {
    in_private_netns("link_attributes_change_and_links_delete", |nl| {
        nl.create_bridge("br0", None, false).unwrap();
        let br = index_of(&nl, "br0");
        nl.create_veth_pair_local("va", "vb", Some(1300)).unwrap();
        let va = index_of(&nl, "va");
        assert_eq!(nl.require_link("vb").unwrap().mtu, 1300);

        let mac: MacAddr = "02:00:00:00:00:aa".parse().unwrap();
        nl.set_mac(va, mac).unwrap();
        nl.set_mtu(va, 1280).unwrap();
        nl.set_promisc(br, true).unwrap();
        nl.set_controller(va, br).unwrap();
        nl.set_up(va).unwrap();

        let link = nl.link_by_index(va).unwrap().unwrap();
        assert_eq!(
            (link.mac, link.mtu, link.controller, link.up),
            (Some(mac), 1280, Some(br), true)
        );
        assert!(nl.link_by_index(br).unwrap().unwrap().promisc);

        nl.set_down(va).unwrap();
        nl.unset_controller(va).unwrap();
        nl.set_promisc(br, false).unwrap();
        let link = nl.link_by_index(va).unwrap().unwrap();
        assert_eq!((link.up, link.controller), (false, None));
        assert!(!nl.link_by_index(br).unwrap().unwrap().promisc);

        assert!(nl.delete_link_by_name("va").unwrap());
        assert!(
            nl.link_by_name("vb").unwrap().is_none(),
            "peer goes with its veth"
        );
        nl.delete_link(br).unwrap();
        assert!(nl.link_by_name("br0").unwrap().is_none());
    });
}

#[test]
fn addresses_add_list_delete_both_families() {
    in_private_netns("addresses_add_list_delete_both_families", |nl| {
        let (va, _) = up_pair(&nl, "va", "vb");
        let v4 = net("10.1.2.3/24");
        let v6 = net("fd00:1::5/64");
        nl.add_address(va, v4).unwrap();
        nl.add_address(va, v6).unwrap();

        let dup = nl.add_address(va, v4).unwrap_err();
        assert!(dup.is_exists(), "{dup:?}");
        assert!(dup.to_string().contains("10.1.2.3/24"), "{dup}");

        let v4s = nl.addresses(va, Some(Family::V4)).unwrap();
        assert_eq!(v4s.iter().map(|a| a.ip).collect::<Vec<_>>(), vec![v4]);
        assert!(v4s[0].is_global());
        let v6s: Vec<IpNetwork> = nl
            .addresses(va, Some(Family::V6))
            .unwrap()
            .iter()
            .map(|a| a.ip)
            .collect();
        assert!(v6s.contains(&v6), "{v6s:?}");
        assert!(v6s.iter().all(|n| n.is_ipv6()));
        let all = nl.addresses(va, None).unwrap();
        assert!(all.iter().any(|a| a.ip == v4) && all.iter().any(|a| a.ip == v6));

        nl.del_address(va, v4).unwrap();
        nl.del_address(va, v6).unwrap();
        let left: Vec<IpNetwork> = nl
            .addresses(va, None)
            .unwrap()
            .iter()
            .map(|a| a.ip)
            .collect();
        assert!(!left.contains(&v4) && !left.contains(&v6), "{left:?}");
        let gone = nl.del_address(va, v4).unwrap_err();
        assert!(gone.is_not_found(), "{gone:?}");
    });
}

#[test]
fn routes_add_list_delete() {
    in_private_netns("routes_add_list_delete", |nl| {
        let (va, _) = up_pair(&nl, "va", "vb");
        nl.add_address(va, net("10.1.2.3/24")).unwrap();
        nl.add_address(va, net("fd00:1::5/64")).unwrap();

        let v4 = Route {
            gw: Some(ip("10.1.2.1")),
            oif: Some(va),
            metric: Some(100),
            mtu: Some(1400),
            ..Route::new(net("192.168.50.0/24"))
        };
        let default_v6 = Route {
            gw: Some(ip("fd00:1::1")),
            oif: Some(va),
            ..Route::new(net("::/0"))
        };
        let in_table = Route {
            oif: Some(va),
            table: Some(1000),
            ..Route::new(net("172.16.0.0/16"))
        };
        for route in [&v4, &default_v6, &in_table] {
            nl.add_route(route).unwrap();
        }
        let dup = nl.add_route(&v4).unwrap_err();
        assert!(dup.is_exists(), "{dup:?}");

        let main4 = nl.routes(Family::V4, Some(254)).unwrap();
        let found = main4
            .iter()
            .find(|r| r.dst == net("192.168.50.0/24"))
            .expect("v4 route");
        assert_eq!(
            (found.gw, found.oif, found.metric, found.mtu),
            (v4.gw, Some(va), Some(100), Some(1400))
        );
        assert_eq!(
            found.protocol,
            Some(3),
            "routes are stamped proto boot like the reference"
        );
        assert!(
            main4.iter().all(|r| r.dst != net("172.16.0.0/16")),
            "table filter"
        );
        assert!(
            main4
                .iter()
                .any(|r| r.dst == net("10.1.2.0/24") && r.gw.is_none()),
            "connected route"
        );

        let other = nl.routes(Family::V4, Some(1000)).unwrap();
        assert_eq!(
            other.iter().map(|r| r.dst).collect::<Vec<_>>(),
            vec![net("172.16.0.0/16")]
        );

        let six = nl.routes(Family::V6, None).unwrap();
        let default = six
            .iter()
            .find(|r| r.dst.prefix() == 0)
            .expect("v6 default");
        assert_eq!(default.gw, Some(ip("fd00:1::1")));

        nl.del_route(&v4).unwrap();
        nl.del_route(&in_table).unwrap();
        let main4 = nl.routes(Family::V4, Some(254)).unwrap();
        assert!(main4.iter().all(|r| r.dst != net("192.168.50.0/24")));
        assert!(nl.routes(Family::V4, Some(1000)).unwrap().is_empty());
        assert!(nl.del_route(&v4).unwrap_err().is_not_found());
    });
}

#[test]
fn route_with_mixed_families_is_rejected_before_the_kernel() {
    in_private_netns(
        "route_with_mixed_families_is_rejected_before_the_kernel",
        |nl| {
            let route = Route {
                gw: Some(ip("10.0.0.1")),
                ..Route::new(net("fd00::/64"))
            };
            let err = nl.add_route(&route).unwrap_err();
            assert!(matches!(err, Error::InvalidRoute { .. }), "{err:?}");
        },
    );
}

#[test]
fn port_hairpin_and_isolation_flags() {
    in_private_netns("port_hairpin_and_isolation_flags", |nl| {
        nl.create_bridge("br0", None, false).unwrap();
        let br = index_of(&nl, "br0");
        nl.create_veth_pair_local("port0", "peer0", None).unwrap();
        let port = index_of(&nl, "port0");
        nl.set_controller(port, br).unwrap();

        let flags = |nl: &Netlink| {
            nl.link_by_index(port)
                .unwrap()
                .unwrap()
                .bridge_port
                .unwrap()
        };
        assert!(!flags(&nl).hairpin && !flags(&nl).isolated);

        nl.set_port_hairpin(port, true).unwrap();
        nl.set_port_isolated(port, true).unwrap();
        let on = flags(&nl);
        assert!(on.hairpin && on.isolated, "{on:?}");

        nl.set_port_hairpin(port, false).unwrap();
        let half = flags(&nl);
        assert!(!half.hairpin && half.isolated, "{half:?}");
        nl.set_port_isolated(port, false).unwrap();
        assert!(!flags(&nl).isolated);
    });
}

#[test]
fn port_vlans_add_list_delete() {
    in_private_netns("port_vlans_add_list_delete", |nl| {
        let Some(br) = vlan_bridge(&nl, "br0", "port_vlans_add_list_delete") else {
            return;
        };
        nl.create_veth_pair_local("port0", "peer0", None).unwrap();
        let port = index_of(&nl, "port0");
        nl.set_controller(port, br).unwrap();

        let default = VlanEntry {
            vid: 1,
            pvid: true,
            untagged: true,
        };
        assert_eq!(nl.port_vlans(port).unwrap(), vec![default]);

        nl.del_port_vlan(port, 1).unwrap();
        assert!(nl.port_vlans(port).unwrap().is_empty());

        nl.add_port_vlan(port, 10, true, true).unwrap();
        nl.add_port_vlan(port, 20, false, false).unwrap();
        nl.add_port_vlan(port, 30, false, false).unwrap();
        let mut vlans = nl.port_vlans(port).unwrap();
        vlans.sort();
        assert_eq!(
            vlans,
            vec![
                VlanEntry {
                    vid: 10,
                    pvid: true,
                    untagged: true
                },
                VlanEntry {
                    vid: 20,
                    pvid: false,
                    untagged: false
                },
                VlanEntry {
                    vid: 30,
                    pvid: false,
                    untagged: false
                },
            ]
        );

        nl.del_port_vlan(port, 20).unwrap();
        let vids: Vec<u16> = nl.port_vlans(port).unwrap().iter().map(|v| v.vid).collect();
        assert!(!vids.contains(&20) && vids.contains(&10), "{vids:?}");
    });
}

#[test]
fn bridge_vlan_filtering_can_be_toggled() {
    in_private_netns("bridge_vlan_filtering_can_be_toggled", |nl| {
        let Some(br) = vlan_bridge(&nl, "br0", "bridge_vlan_filtering_can_be_toggled") else {
            return;
        };
        nl.set_bridge_vlan_filtering(br, false).unwrap();
        assert_eq!(nl.require_link("br0").unwrap().vlan_filtering, Some(false));
        nl.set_bridge_vlan_filtering(br, true).unwrap();
        assert_eq!(nl.require_link("br0").unwrap().vlan_filtering, Some(true));
    });
}

#[test]
fn wait_oper_up_sees_up_and_reports_the_state_otherwise() {
    in_private_netns(
        "wait_oper_up_sees_up_and_reports_the_state_otherwise",
        |nl| {
            nl.create_veth_pair_local("va", "vb", None).unwrap();
            let (va, vb) = (index_of(&nl, "va"), index_of(&nl, "vb"));
            nl.set_up(va).unwrap();

            // Peer down: the kernel reports lowerlayerdown, never up.
            let short = [Duration::ZERO, Duration::from_millis(20)];
            match nl.wait_oper_up(va, &short) {
                Err(Error::LinkNotUp { link, state }) => {
                    assert_eq!(link, "va");
                    assert_eq!(state, OperState::LowerLayerDown);
                    assert_eq!(state.to_string(), "lowerlayerdown");
                }
                other => panic!("expected LinkNotUp, got {other:?}"),
            }

            nl.set_up(vb).unwrap();
            let link = nl.wait_oper_up(va, &OPER_UP_DELAYS).unwrap();
            assert_eq!(link.oper_state, OperState::Up);
        },
    );
}

#[test]
fn ipv6_addresses_settle_after_dad() {
    in_private_netns("ipv6_addresses_settle_after_dad", |nl| {
        let (va, _) = up_pair(&nl, "va", "vb");
        nl.wait_oper_up(va, &OPER_UP_DELAYS).unwrap();
        nl.add_address(va, net("fd00:2::1/64")).unwrap();
        nl.wait_addresses_settled(va, Duration::from_secs(10))
            .unwrap();
        let addrs = nl.addresses(va, Some(Family::V6)).unwrap();
        assert!(
            addrs
                .iter()
                .all(|a| !a.is_tentative() && !a.is_dad_failed()),
            "{addrs:?}"
        );
    });
}

#[test]
fn duplicate_ipv6_address_fails_dad() {
    in_private_netns("duplicate_ipv6_address_fails_dad", |nl| {
        let (va, vb) = up_pair(&nl, "va", "vb");
        nl.wait_oper_up(va, &OPER_UP_DELAYS).unwrap();
        let dup = net("fd00:3::1/64");
        nl.add_address(vb, dup).unwrap();
        nl.wait_addresses_settled(vb, Duration::from_secs(10))
            .unwrap();

        // vb owns the address and answers va's neighbour solicitation.
        nl.add_address(va, dup).unwrap();
        match nl.wait_addresses_settled(va, Duration::from_secs(10)) {
            Err(Error::AddressDadFailed { link, address }) => {
                assert_eq!((link.as_str(), address), ("va", dup.ip()));
            }
            other => panic!("expected AddressDadFailed, got {other:?}"),
        }
    });
}

#[test]
fn an_address_added_without_dad_is_usable_at_once() {
    in_private_netns("an_address_added_without_dad_is_usable_at_once", |nl| {
        sysctl::write("net/ipv6/conf/all/accept_dad", "1").unwrap();
        sysctl::write("net/ipv6/conf/default/accept_dad", "1").unwrap();
        let (va, vb) = up_pair(&nl, "va", "vb");
        nl.wait_oper_up(va, &OPER_UP_DELAYS).unwrap();
        let v6 = |index: u32, ip: IpNetwork| {
            let addrs = nl.addresses(index, Some(Family::V6)).unwrap();
            addrs.into_iter().find(|a| a.ip == ip).unwrap()
        };
        // With DAD, an address is tentative for a second or more after it is added.
        let with_dad = net("fd00:4::1/64");
        nl.add_address(va, with_dad).unwrap();
        let a = v6(va, with_dad);
        assert!(a.is_tentative() && !a.skips_dad(), "{a:?}");

        // Without, it never is, even when a neighbour holds it too (DAD would fail).
        let owned = net("fd00:5::1/64");
        nl.add_address(vb, owned).unwrap();
        nl.add_address_with(va, owned, AddressOptions::NO_DAD)
            .unwrap();
        let a = v6(va, owned);
        assert!(
            a.skips_dad() && !a.is_tentative() && !a.is_dad_failed(),
            "{a:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
        let a = v6(va, owned);
        assert!(!a.is_tentative() && !a.is_dad_failed(), "{a:?}");

        // IPv4 has no DAD: the option changes nothing there.
        let v4 = net("10.4.0.1/24");
        nl.add_address_with(va, v4, AddressOptions::NO_DAD).unwrap();
        let a = nl.addresses(va, Some(Family::V4)).unwrap();
        assert_eq!(
            a.iter().map(|a| (a.ip, a.flags & 0xff)).collect::<Vec<_>>(),
            [(v4, 0x80)]
        );

        // An address already there is refused and left as it was.
        let again = nl
            .add_address_with(va, with_dad, AddressOptions::NO_DAD)
            .unwrap_err();
        assert!(again.is_exists(), "{again:?}");
        assert!(!v6(va, with_dad).skips_dad());
    });
}

#[test]
fn forwarding_is_read_over_netlink_as_the_sysctl_says() {
    in_private_netns("forwarding_is_read_over_netlink_as_the_sysctl_says", |nl| {
        for (family, name) in [
            (Family::V4, "net/ipv4/ip_forward"),
            (Family::V6, "net/ipv6/conf/all/forwarding"),
        ] {
            for value in ["0", "1", "0"] {
                sysctl::write(name, value).unwrap();
                assert_eq!(
                    nl.forwarding(family).unwrap(),
                    value == "1",
                    "{name} = {value}"
                );
            }
        }
    });
}

#[test]
fn arp_notify_is_set_over_netlink_as_the_sysctl_reads_it() {
    in_private_netns(
        "arp_notify_is_set_over_netlink_as_the_sysctl_reads_it",
        |nl| {
            nl.create_veth_pair_local("va", "vb", None).unwrap();
            let va = index_of(&nl, "va");
            let name = "net/ipv4/conf/va/arp_notify";
            sysctl::write(name, "0").unwrap();
            nl.set_arp_notify(va, true).unwrap();
            assert_eq!(sysctl::read(name).unwrap(), "1");
            assert_eq!(sysctl::read("net/ipv4/conf/vb/arp_notify").unwrap(), "0");
            nl.set_arp_notify(va, false).unwrap();
            assert_eq!(sysctl::read(name).unwrap(), "0");
            let missing = nl.set_arp_notify(u32::MAX >> 1, true).unwrap_err();
            assert!(missing.is_not_found(), "{missing:?}");
        },
    );
}

#[test]
fn a_subscription_hears_link_address_and_route_changes_of_its_netns() {
    in_private_netns(
        "a_subscription_hears_link_address_and_route_changes_of_its_netns",
        |nl| {
            use cni_linux::netlink::{Notified, subscribe_host_changes};
            let mut sub = subscribe_host_changes().unwrap();
            let (a, _) = up_pair(&nl, "sub-a", "sub-b");
            // Each change is heard: wait() returns once per datagram, so count until
            // every kind of change has been seen at least once (link up, address,
            // route), bounded by a reader thread and a deadline.
            nl.set_mtu(a, 1400).unwrap();
            nl.add_address(a, net("192.0.2.1/24")).unwrap();
            nl.add_route(&Route {
                gw: Some(ip("192.0.2.9")),
                ..Route::new(net("198.51.100.0/24"))
            })
            .unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                loop {
                    let heard = sub.wait(|_| true);
                    if tx.send(heard.map_err(|e| e.to_string())).is_err() {
                        return;
                    }
                }
            });
            let mut messages = 0;
            while messages < 4 {
                match rx.recv_timeout(Duration::from_secs(5)) {
                    Ok(Ok(Notified::Messages { total, kept })) => {
                        assert_eq!(total, kept);
                        messages += kept;
                    }
                    Ok(Ok(Notified::Overflow)) => panic!("overflow on a handful of changes"),
                    Ok(Err(e)) => panic!("{e}"),
                    Err(e) => panic!("only {messages} notifications heard: {e}"),
                }
            }
        },
    );
}
