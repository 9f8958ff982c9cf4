//! Our bridge against the reference bridge (`/usr/lib/cni/bridge`, plugins v1.1.1) for the
//! same config and version: the result JSON (random veth names, MACs, bridge names and
//! netns paths aside), the pod's and the bridge's kernel state, and the error messages of
//! CHECK and of refused configs.
//!
//! Each side has its own host netns, bridge name, `dataDir` and pod netns, so their state
//! never mixes. Only keys that v1.1.1 knows are compared (it has no `portIsolation`,
//! `vlanTrunk`, `preserveDefaultVlan`, `disableContainerInterface`, `ipMasqBackend`, and
//! no cniVersion 1.1.0).

mod bridge_support;

use bridge_support::{Net, bridge_port, global_addrs, normalize, reference_available, route_lines};
use cni_blackbox::{Netns, Outcome, check_cases, kernel, require_root};
use serde_json::{Value, json};

const CID: &str = "cnibb-ctr";
const MAC: &str = "02:bb:00:00:00:01";

/// One side of a comparison: a network with one pod.
struct Side {
    net: Net,
    pod: Netns,
    reference: bool,
}

impl Side {
    fn new(reference: bool) -> Self {
        let net = Net::new();
        let pod = net.pod();
        Self {
            net,
            pod,
            reference,
        }
    }

    /// `conf` with this side's bridge and `dataDir` (the network name stays).
    fn own(&self, conf: &Value) -> Value {
        let mut conf = conf.clone();
        conf["bridge"] = json!(self.net.bridge);
        if conf["ipam"].get("dataDir").is_some() {
            conf["ipam"]["dataDir"] = json!(self.net.data.path_str());
        }
        conf
    }

    fn run(&self, command: &str, conf: &Value) -> Outcome {
        let conf = self.own(conf);
        if self.reference {
            self.net
                .run_reference(command, &conf, CID, &self.pod, "eth0")
        } else {
            self.net.run(command, &conf, CID, &self.pod, "eth0")
        }
    }

    /// Stdout (result or error) with this side's random names replaced, as compact text
    /// that keeps the printed key order (so the comparison is of the bytes, not the
    /// parsed values).
    fn normalized(&self, out: &Outcome) -> String {
        let text = normalize(
            &out.json(),
            &[
                (self.net.bridge.as_str(), "@BRIDGE@"),
                (self.pod.path_str(), "@NETNS@"),
            ],
            &[MAC],
        );
        text.to_string()
    }

    fn msg(&self, out: &Outcome) -> String {
        out.error_msg()
            .unwrap_or_else(|| panic!("no error:\n{out}"))
            .replace(&self.net.bridge, "@BRIDGE@")
            .replace(self.pod.path_str(), "@NETNS@")
    }

    /// What the plugin configured, for comparison: pod addresses, routes and sysctls,
    /// bridge addresses, port flags, forwarding.
    fn kernel_state(&self, result: &Value) -> Value {
        let pod = &self.pod;
        let host = &self.net.host;
        let has_ips = result.get("ips").is_some() || result.get("ip4").is_some();
        let veth = result["interfaces"][1]["name"].as_str().map(str::to_owned);
        json!({
            "pod_v4": global_addrs(pod, "-4", "eth0"),
            "pod_v6": global_addrs(pod, "-6", "eth0"),
            "pod_routes_v4": route_lines(pod, "-4"),
            "pod_routes_v6": route_lines(pod, "-6"),
            "pod_up": kernel::link_is_up(pod, "eth0"),
            "pod_mtu": bridge_support::mtu_of(pod, "eth0"),
            "accept_dad": kernel::sysctl(pod, "net/ipv6/conf/eth0/accept_dad"),
            "arp_notify": has_ips.then(|| kernel::sysctl(pod, "net/ipv4/conf/eth0/arp_notify")),
            "bridge_v4": self.net.bridge_addrs("-4"),
            "bridge_v6": self.net.bridge_addrs("-6"),
            "bridge_mtu": bridge_support::mtu_of(host, &self.net.bridge),
            "bridge_promisc": kernel::link_flags(host, &self.net.bridge).contains(&"PROMISC".to_owned()),
            "bridge_accept_ra": kernel::sysctl(host, &format!("net/ipv6/conf/{}/accept_ra", self.net.bridge)),
            "port": veth.as_ref().map(|v| {
                let p = bridge_port(host, v);
                json!({"hairpin": p["hairpin"], "state": p["state"], "mtu": p["mtu"]})
            }),
            "ip_forward": kernel::sysctl(host, "net/ipv4/ip_forward"),
            "ipv6_forwarding": kernel::sysctl(host, "net/ipv6/conf/all/forwarding"),
        })
    }
}

/// A config shared by both sides (bridge and dataDir are replaced per side).
fn conf(version: &str, ranges: &[&str], extra: &Value) -> Value {
    let ipam = if ranges.is_empty() {
        json!({})
    } else {
        let ranges: Vec<Value> = ranges.iter().map(|s| json!([{"subnet": s}])).collect();
        json!({"type": "host-local", "dataDir": "@", "ranges": ranges})
    };
    let mut conf = json!({
        "cniVersion": version,
        "name": "cnibb-refcmp",
        "type": "bridge",
        "bridge": "@",
        "ipam": ipam,
    });
    bridge_support::merge(&mut conf, extra);
    conf
}

/// Named config variants, each with the ranges it uses.
fn variants() -> Vec<(&'static str, Vec<&'static str>, Value)> {
    vec![
        (
            "default-gateway masq hairpin dns routes",
            vec!["10.77.0.0/24", "fd00:77::/64"],
            json!({
                "isDefaultGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "dns": {"nameservers": ["10.77.0.1"], "search": ["example"]},
            }),
        ),
        (
            "gateway v4",
            vec!["10.77.0.0/24"],
            json!({"isGateway": true}),
        ),
        ("plain v6", vec!["fd00:77::/64"], json!({})),
        (
            "mac from runtimeConfig and args, mtu, promisc",
            vec!["10.77.0.0/24"],
            json!({
                "runtimeConfig": {"mac": MAC},
                "args": {"cni": {"mac": "02:bb:00:00:00:02"}},
                "mtu": 1400,
                "promiscMode": true,
            }),
        ),
        (
            "forceAddress enabledad macspoofchk",
            vec!["10.77.0.0/24", "fd00:77::/64"],
            json!({"isGateway": true, "forceAddress": true, "enabledad": true, "macspoofchk": true}),
        ),
        ("layer 2", vec![], json!({})),
    ]
}

#[test]
fn add_result_and_kernel_state_match_the_reference() {
    if !require_root() || !reference_available() {
        return;
    }
    let mut cases = Vec::new();
    for version in ["0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"] {
        for (name, ranges, extra) in variants() {
            if version == "0.2.0" && ranges.is_empty() {
                continue; // an error on both sides; see the test below
            }
            cases.push((version, name, ranges, extra));
        }
    }
    check_cases(&cases, |(version, name, ranges, extra)| {
        let conf = conf(version, ranges, extra);
        let (ours, theirs) = (Side::new(false), Side::new(true));
        let (a, b) = (ours.run("ADD", &conf), theirs.run("ADD", &conf));
        a.assert_success();
        b.assert_success();
        assert_eq!(
            ours.normalized(&a),
            theirs.normalized(&b),
            "{version} {name}: results differ\nours:\n{a}\nreference:\n{b}"
        );
        let (ka, kb) = (ours.kernel_state(&a.json()), theirs.kernel_state(&b.json()));
        assert_eq!(ka, kb, "{version} {name}: kernel state differs");

        // Both clean up on DEL, twice.
        for _ in 0..2 {
            ours.run("DEL", &conf).assert_success_silent();
            theirs.run("DEL", &conf).assert_success_silent();
        }
        assert_eq!(ours.net.reservations(), theirs.net.reservations());
        assert!(ours.net.host_veths().is_empty());
    });
}

#[test]
fn layer2_at_0_2_0_fails_with_the_references_message() {
    if !require_root() || !reference_available() {
        return;
    }
    let conf = conf("0.2.0", &[], &json!({}));
    let (ours, theirs) = (Side::new(false), Side::new(true));
    let (a, b) = (ours.run("ADD", &conf), theirs.run("ADD", &conf));
    a.assert_failure();
    b.assert_failure();
    assert_eq!(ours.msg(&a), theirs.msg(&b));
    assert_eq!(a.error_code(), b.error_code());
    // The difference we document: the reference leaves its veth, we make none.
    assert!(!bridge_support::has_link(&ours.pod, "eth0"));
}

#[test]
fn check_messages_match_the_reference() {
    if !require_root() || !reference_available() {
        return;
    }
    #[derive(Debug)]
    enum Break {
        Nothing,
        PodAddress,
        Bridge,
        NoPrevResult,
    }
    let mut cases = Vec::new();
    for version in ["0.4.0", "1.0.0"] {
        for what in [
            Break::Nothing,
            Break::PodAddress,
            Break::Bridge,
            Break::NoPrevResult,
        ] {
            cases.push((version, what));
        }
    }
    check_cases(&cases, |(version, what)| {
        let conf = conf(
            version,
            &["10.77.0.0/24", "fd00:77::/64"],
            &json!({"isDefaultGateway": true}),
        );
        let mut outcomes = Vec::new();
        for side in [Side::new(false), Side::new(true)] {
            let add = side.run("ADD", &conf);
            add.assert_success();
            let mut check = conf.clone();
            check["prevResult"] = add.json();
            match what {
                Break::Nothing => {}
                Break::PodAddress => {
                    side.pod
                        .exec_ok(&["ip", "addr", "del", "fd00:77::2/64", "dev", "eth0"]);
                }
                Break::Bridge => {
                    side.net
                        .host
                        .exec_ok(&["ip", "link", "del", &side.net.bridge]);
                }
                Break::NoPrevResult => {
                    check["prevResult"] = Value::Null;
                    if let Some(o) = check.as_object_mut() {
                        o.remove("prevResult");
                    }
                }
            }
            let out = side.run("CHECK", &check);
            let seen = if out.success() {
                assert!(out.stdout.is_empty(), "{out}");
                None
            } else {
                Some((out.error_code(), side.msg(&out)))
            };
            outcomes.push((seen, out));
        }
        assert_eq!(
            outcomes[0].0, outcomes[1].0,
            "{version} {what:?}\nours:\n{}\nreference:\n{}",
            outcomes[0].1, outcomes[1].1
        );
        if matches!(what, Break::Nothing) {
            assert!(outcomes[0].0.is_none());
        }
    });
}

#[test]
fn refused_configs_have_the_references_messages() {
    if !require_root() || !reference_available() {
        return;
    }
    let cases = [
        json!({"vlan": 5000}),
        json!({"vlan": -1}),
        json!({"hairpinMode": true, "promiscMode": true}),
        json!({"mtu": "x"}),
    ];
    check_cases(&cases, |extra| {
        let conf = conf("1.0.0", &["10.77.0.0/24"], extra);
        let (ours, theirs) = (Side::new(false), Side::new(true));
        let (a, b) = (ours.run("ADD", &conf), theirs.run("ADD", &conf));
        a.assert_failure();
        b.assert_failure();
        // v1.1.1 ends one message with a period that later references dropped.
        let (ma, mb) = (
            ours.msg(&a),
            theirs.msg(&b).trim_end_matches('.').to_owned(),
        );
        // Go's JSON decoder words type errors its own way; the prefix is what users see.
        // A value of the wrong JSON type is a decoding failure (code 6) naming the key;
        // the reference answers 999.
        if extra.get("mtu").is_some() {
            assert!(
                ma.starts_with("failed to load netconf: mtu: ")
                    && mb.starts_with("failed to load netconf: "),
                "{ma} / {mb}"
            );
            assert_eq!((a.error_code(), b.error_code()), (Some(6), Some(999)));
        } else {
            // The same words; ours says what kind of error it is (7, a mistake in the
            // network config), where the reference answers 999 ("internal").
            assert_eq!(ma, mb, "{extra}");
            assert_eq!(
                (a.error_code(), b.error_code()),
                (Some(7), Some(999)),
                "{extra}"
            );
        }
        assert!(ours.net.host_veths().is_empty());
        assert!(ours.net.reservations().is_empty());
    });
}

#[test]
fn existing_ifname_fails_on_both_without_a_reservation() {
    if !require_root() || !reference_available() {
        return;
    }
    let conf = conf("1.0.0", &["10.77.0.0/24"], &json!({}));
    for side in [Side::new(false), Side::new(true)] {
        side.pod.exec_ok(&[
            "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
        ]);
        let out = side.run("ADD", &conf);
        out.assert_failure();
        let msg = side.msg(&out);
        assert!(
            msg.contains("eth0") && msg.contains("already exists"),
            "{out}"
        );
        assert!(side.net.reservations().is_empty(), "{out}");
    }
}
