//! The bridge plugin as a black box: every config key, checked in the
//! kernel state it leaves (links, bridge ports, addresses, routes, sysctls, iptables and
//! nftables rules) inside the test's own host and pod namespaces; connectivity between
//! pods; all-or-nothing ADD; idempotent DEL with or without the netns; CHECK, STATUS, GC.
//!
//! Every test makes its own host netns (the plugin runs there, so the bridge, sysctls and
//! firewall rules it makes are the test's), pod netns and IPAM `dataDir`; the guards
//! remove them on drop, also when an assertion fails. Nothing touches the root netns.

mod bridge_support;

use bridge_support::{
    Net, assert_no_masq_rules, bridge_port, global_addrs, has_link, link_details, mac_of, mtu_of,
    ping, route_lines, veths, vlan_filtering_supported,
};
use cni_blackbox::{Netns, Outcome, check_cases, kernel, require_root};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Command, Stdio};

const V4: &str = "10.77.0.0/24";
const V6: &str = "fd00:77::/64";
const CID: &str = "cnibb-ctr";

/// Lower-case hex SHA-512 of `text`, computed by `sha512sum` so that the expected rule
/// names do not come from the code under test.
fn sha512_hex(text: &str) -> String {
    let mut child = Command::new("sha512sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run sha512sum");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed sha512sum");
    let out = child.wait_with_output().expect("sha512sum output");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The reference's iptables chain for an attachment: `CNI-` + 24 hex of
/// SHA-512(network + containerID).
fn iptables_chain(network: &str, cid: &str) -> String {
    format!("CNI-{}", &sha512_hex(&format!("{network}{cid}"))[..24])
}

/// The reference's nftables masquerade comment prefix for an attachment.
fn nft_instance(network: &str, ifname: &str, cid: &str) -> String {
    format!(
        "{}-{}",
        &sha512_hex(network)[..16],
        &sha512_hex(&format!("{ifname}:{cid}"))[..16]
    )
}

/// The rules and chains of an iptables-save dump, without comments and counters.
fn rule_lines(dump: &str) -> Vec<String> {
    dump.lines()
        .filter(|l| l.starts_with("-A") || l.starts_with(':'))
        .map(|l| l.split(" [").next().unwrap_or(l).to_owned())
        .collect()
}

fn set_sysctl(ns: &Netns, key: &str, value: &str) {
    ns.exec_ok(&["sysctl", "-q", "-w", &format!("{key}={value}")]);
}

/// `ip -j link`'s field of `dev`.
fn link_field(ns: &Netns, dev: &str, field: &str) -> Value {
    link_details(ns, dev).unwrap_or_else(|| panic!("no link {dev} in {}", ns.name()))[field].clone()
}

fn host_veth_of(out: &Outcome) -> String {
    out.json()["interfaces"][1]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("no host veth in result:\n{out}"))
        .to_owned()
}

fn dual_gateway_conf(net: &Net, version: &str) -> Value {
    let mut conf = net.conf(
        version,
        &[V4, V6],
        &json!({
            "isDefaultGateway": true,
            "ipMasq": true,
            "ipMasqBackend": "iptables",
            "hairpinMode": true,
            "dns": {"nameservers": ["10.77.0.1"]},
        }),
    );
    conf["ipam"]["routes"] = json!([{"dst": "192.168.0.0/16"}]);
    conf
}

#[test]
fn add_dual_stack_gateway_result_and_kernel_state() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    // Fresh-netns defaults can be inherited from the machine; pin the "before" values
    // so that each assertion below can only pass if the plugin wrote the sysctl.
    set_sysctl(&net.host, "net.ipv4.ip_forward", "0");
    set_sysctl(&net.host, "net.ipv6.conf.all.forwarding", "0");
    set_sysctl(&net.host, "net.ipv6.conf.default.accept_ra", "1");
    set_sysctl(&pod, "net.ipv4.conf.default.arp_notify", "0");
    set_sysctl(&pod, "net.ipv6.conf.default.accept_dad", "1");
    set_sysctl(&pod, "net.ipv6.conf.default.keep_addr_on_down", "0");

    let conf = dual_gateway_conf(&net, "1.0.0");
    let out = net.run("ADD", &conf, CID, &pod, "eth0");
    out.assert_success();
    let result = out.json();
    let veth = host_veth_of(&out);

    // Result: reference shape, MACs as in the kernel.
    let expected = json!({
        "cniVersion": "1.0.0",
        "dns": {"nameservers": ["10.77.0.1"]},
        "interfaces": [
            {"mac": mac_of(&net.host, &net.bridge), "name": net.bridge},
            {"mac": mac_of(&net.host, &veth), "name": veth},
            {"mac": mac_of(&pod, "eth0"), "name": "eth0", "sandbox": pod.path_str()},
        ],
        "ips": [
            {"address": "10.77.0.2/24", "gateway": "10.77.0.1", "interface": 2},
            {"address": "fd00:77::2/64", "gateway": "fd00:77::1", "interface": 2},
        ],
        "routes": [
            {"dst": "192.168.0.0/16"},
            {"dst": "0.0.0.0/0", "gw": "10.77.0.1"},
            {"dst": "::/0", "gw": "fd00:77::1"},
        ],
    });
    assert_eq!(result, expected, "{out}");
    assert!(veth.starts_with("veth") && veth.len() == 12, "{veth}");

    // Bridge: a plain (non-VLAN-filtering) bridge, up, with both gateway addresses.
    let bridge = net.bridge_link().expect("bridge exists");
    assert_eq!(bridge["linkinfo"]["info_kind"], "bridge", "{bridge}");
    assert_eq!(bridge["linkinfo"]["info_data"]["vlan_filtering"], 0);
    assert!(kernel::link_is_up(&net.host, &net.bridge));
    assert_eq!(net.bridge_addrs("-4"), ["10.77.0.1/24"]);
    assert_eq!(net.bridge_addrs("-6"), ["fd00:77::1/64"]);
    assert_eq!(net.bridges(), std::slice::from_ref(&net.bridge));

    // Host veth: the only veth, a forwarding port of the bridge, hairpin on, not isolated.
    assert_eq!(net.host_veths(), std::slice::from_ref(&veth));
    let port = bridge_port(&net.host, &veth);
    assert_eq!(port["master"], json!(net.bridge), "{port}");
    assert_eq!(port["state"], "forwarding", "{port}");
    assert_eq!(port["hairpin"], true, "{port}");
    assert_eq!(port["isolated"], false, "{port}");
    assert!(kernel::link_is_up(&net.host, &veth));

    // Host sysctls.
    assert_eq!(kernel::sysctl(&net.host, "net/ipv4/ip_forward"), "1");
    assert_eq!(
        kernel::sysctl(&net.host, "net/ipv6/conf/all/forwarding"),
        "1"
    );
    for dev in [net.bridge.as_str(), veth.as_str()] {
        assert_eq!(
            kernel::sysctl(&net.host, &format!("net/ipv6/conf/{dev}/accept_ra")),
            "0",
            "accept_ra of {dev}"
        );
    }

    // Pod: eth0 up with both addresses, routes via the gateway, sysctls.
    assert!(kernel::link_is_up(&pod, "eth0"));
    assert_eq!(link_field(&pod, "eth0", "linkinfo")["info_kind"], "veth");
    assert_eq!(global_addrs(&pod, "-4", "eth0"), ["10.77.0.2/24"]);
    assert_eq!(global_addrs(&pod, "-6", "eth0"), ["fd00:77::2/64"]);
    assert_eq!(
        route_lines(&pod, "-4"),
        [
            "10.77.0.0/24 dev eth0",
            "192.168.0.0/16 via 10.77.0.1 dev eth0",
            "default via 10.77.0.1 dev eth0",
        ]
    );
    assert_eq!(
        route_lines(&pod, "-6"),
        ["default via fd00:77::1 dev eth0", "fd00:77::/64 dev eth0"]
    );
    for (key, value) in [
        ("net/ipv6/conf/eth0/accept_dad", "0"),
        ("net/ipv4/conf/eth0/arp_notify", "1"),
        ("net/ipv6/conf/eth0/keep_addr_on_down", "1"),
        ("net/ipv6/conf/eth0/disable_ipv6", "0"),
        ("net/ipv6/conf/lo/disable_ipv6", "0"),
    ] {
        assert_eq!(kernel::sysctl(&pod, key), value, "pod {key}");
    }
    // The pod's lo belongs to the loopback plugin.
    assert!(!kernel::link_is_up(&pod, "lo"));

    // Masquerade, reference rule names, both families.
    let chain = iptables_chain(&net.name, CID);
    let ipt = net.iptables();
    let comment = format!(r#"--comment "name: \"{}\" id: \"{CID}\"""#, net.name);
    for line in [
        format!("-A POSTROUTING -s 10.77.0.2/32 -m comment {comment} -j {chain}"),
        format!("-A {chain} -d 10.77.0.0/24 -m comment {comment} -j ACCEPT"),
        format!("-A {chain} ! -d 224.0.0.0/4 -m comment {comment} -j MASQUERADE"),
        format!("-A POSTROUTING -s fd00:77::2/128 -m comment {comment} -j {chain}"),
        format!("-A {chain} -d fd00:77::/64 -m comment {comment} -j ACCEPT"),
        format!("-A {chain} ! -d ff00::/8 -m comment {comment} -j MASQUERADE"),
    ] {
        assert!(ipt.contains(&line), "missing {line:?} in\n{ipt}");
    }

    // DEL removes the attachment and keeps the bridge (shared by other pods).
    net.run("DEL", &conf, CID, &pod, "eth0")
        .assert_success_silent();
    net.assert_nothing_left("after DEL");
    assert!(!has_link(&pod, "eth0"));
    assert_eq!(net.bridge_addrs("-4"), ["10.77.0.1/24"]);
}

#[test]
fn two_pods_ping_each_other_and_the_gateway_over_v4_and_v6() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let (a, b) = (net.pod(), net.pod());
    let conf = net.conf("1.0.0", &[V4, V6], &json!({"isDefaultGateway": true}));
    net.run("ADD", &conf, "ctr-a", &a, "eth0").assert_success();
    net.run("ADD", &conf, "ctr-b", &b, "eth0").assert_success();
    assert_eq!(global_addrs(&b, "-4", "eth0"), ["10.77.0.3/24"]);
    for (from, to) in [
        (&a, "10.77.0.3"),
        (&b, "10.77.0.2"),
        (&a, "fd00:77::3"),
        (&b, "fd00:77::2"),
        (&a, "10.77.0.1"),
        (&a, "fd00:77::1"),
        (&b, "10.77.0.1"),
    ] {
        if let Err(e) = ping(from, to) {
            panic!("{} cannot ping {to}:\n{e}", from.name());
        }
    }
}

#[test]
fn bridge_mac_stays_when_more_pods_join() {
    if !require_root() {
        return;
    }
    // With a gateway address (the reference pins the MAC there) and in layer 2 mode
    // (we also pin a bridge we create; docs/configuration.md, "Differences").
    check_cases(&["gateway", "l2"], |mode| {
        let net = Net::new();
        let subnets: &[&str] = if *mode == "gateway" { &[V4] } else { &[] };
        let conf = net.conf("1.0.0", subnets, &json!({"isGateway": *mode == "gateway"}));
        let pods: Vec<Netns> = (0..3).map(|_| net.pod()).collect();
        let first = net.run("ADD", &conf, "ctr-0", &pods[0], "eth0");
        first.assert_success();
        let mac = mac_of(&net.host, &net.bridge);
        assert_eq!(first.json()["interfaces"][0]["mac"], json!(mac));
        for (i, pod) in pods.iter().enumerate().skip(1) {
            let out = net.run("ADD", &conf, &format!("ctr-{i}"), pod, "eth0");
            out.assert_success();
            assert_eq!(mac_of(&net.host, &net.bridge), mac, "after pod {i} joined");
            assert_eq!(out.json()["interfaces"][0]["mac"], json!(mac), "{out}");
        }
        // Also when the first pod (possibly the lowest port MAC) leaves.
        net.run("DEL", &conf, "ctr-0", &pods[0], "eth0")
            .assert_success();
        assert_eq!(mac_of(&net.host, &net.bridge), mac);
    });
}

#[test]
fn mtu_applies_to_a_new_bridge_and_both_veth_ends() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    let out = net.run(
        "ADD",
        &net.conf("1.0.0", &[V4], &json!({"mtu": 1400})),
        CID,
        &pod,
        "eth0",
    );
    out.assert_success();
    assert_eq!(mtu_of(&net.host, &net.bridge), 1400);
    assert_eq!(mtu_of(&net.host, &host_veth_of(&out)), 1400);
    assert_eq!(mtu_of(&pod, "eth0"), 1400);
    // Default: the kernel's 1500 on the pod's veth.
    let other = net.pod();
    net.run(
        "ADD",
        &net.conf("1.0.0", &[V4], &json!({})),
        "c2",
        &other,
        "eth0",
    )
    .assert_success();
    assert_eq!(mtu_of(&other, "eth0"), 1500);
}

#[test]
fn hairpin_and_port_isolation_flags_on_the_host_port() {
    if !require_root() {
        return;
    }
    let cases = [
        (json!({}), false, false),
        (json!({"hairpinMode": true}), true, false),
        (json!({"hairpinMode": false}), false, false),
        (json!({"portIsolation": true}), false, true),
        (
            json!({"portIsolation": true, "hairpinMode": true}),
            true,
            true,
        ),
    ];
    check_cases(&cases, |(extra, hairpin, isolated)| {
        let net = Net::new();
        let pod = net.pod();
        let out = net.run("ADD", &net.conf("1.0.0", &[V4], extra), CID, &pod, "eth0");
        out.assert_success();
        let port = bridge_port(&net.host, &host_veth_of(&out));
        assert_eq!(port["hairpin"], json!(hairpin), "{extra}: {port}");
        assert_eq!(port["isolated"], json!(isolated), "{extra}: {port}");
    });
}

#[test]
fn promisc_mode_sets_the_bridge_promiscuous_and_excludes_hairpin() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    net.run(
        "ADD",
        &net.conf("1.0.0", &[V4], &json!({"promiscMode": true})),
        CID,
        &pod,
        "eth0",
    )
    .assert_success();
    let promiscuity = link_field(&net.host, &net.bridge, "promiscuity");
    assert!(promiscuity.as_u64().unwrap_or(0) > 0, "{promiscuity}");
    assert!(
        kernel::link_flags(&net.host, &net.bridge).contains(&"PROMISC".to_owned()),
        "{:?}",
        kernel::link_flags(&net.host, &net.bridge)
    );

    // Without the key a new bridge is not promiscuous.
    let plain = Net::new();
    let pod2 = plain.pod();
    plain
        .run(
            "ADD",
            &plain.conf("1.0.0", &[V4], &json!({})),
            CID,
            &pod2,
            "eth0",
        )
        .assert_success();
    assert_eq!(link_field(&plain.host, &plain.bridge, "promiscuity"), 0);

    // Both at once is refused before anything is made.
    let both = Net::new();
    let pod3 = both.pod();
    let out = both.run(
        "ADD",
        &both.conf(
            "1.0.0",
            &[V4],
            &json!({"promiscMode": true, "hairpinMode": true}),
        ),
        CID,
        &pod3,
        "eth0",
    );
    out.assert_error(
        7,
        "cannot set hairpin mode and promiscuous mode at the same time",
    );
    assert!(both.bridge_link().is_none());
    both.assert_nothing_left("after refused ADD");
}

#[test]
fn enabledad_keeps_dad_on_in_the_pod() {
    if !require_root() {
        return;
    }
    check_cases(&[(false, "0"), (true, "1")], |(enabledad, expected)| {
        let net = Net::new();
        let pod = net.pod();
        set_sysctl(&pod, "net.ipv6.conf.default.accept_dad", "1");
        set_sysctl(&pod, "net.ipv6.conf.default.enhanced_dad", "0");
        net.run(
            "ADD",
            &net.conf("1.0.0", &[V6], &json!({"enabledad": enabledad})),
            CID,
            &pod,
            "eth0",
        )
        .assert_success();
        assert_eq!(
            kernel::sysctl(&pod, "net/ipv6/conf/eth0/accept_dad"),
            *expected
        );
        if *enabledad {
            assert_eq!(kernel::sysctl(&pod, "net/ipv6/conf/eth0/enhanced_dad"), "1");
        }
        assert_eq!(global_addrs(&pod, "-6", "eth0"), ["fd00:77::2/64"]);
    });
}

#[test]
fn is_gateway_modes_set_bridge_addresses_routes_and_forwarding() {
    if !require_root() {
        return;
    }
    // (keys, bridge v4 addrs, pod v4 routes, ip_forward)
    let cases = [
        (json!({}), vec![], vec!["10.77.0.0/24 dev eth0"], "0"),
        (
            json!({"isGateway": true}),
            vec!["10.77.0.1/24"],
            vec!["10.77.0.0/24 dev eth0"],
            "1",
        ),
        (
            json!({"isDefaultGateway": true}),
            vec!["10.77.0.1/24"],
            vec!["10.77.0.0/24 dev eth0", "default via 10.77.0.1 dev eth0"],
            "1",
        ),
    ];
    check_cases(&cases, |(extra, bridge_addrs, routes, forward)| {
        let net = Net::new();
        let pod = net.pod();
        set_sysctl(&net.host, "net.ipv4.ip_forward", "0");
        let out = net.run("ADD", &net.conf("1.0.0", &[V4], extra), CID, &pod, "eth0");
        out.assert_success();
        assert_eq!(&net.bridge_addrs("-4"), bridge_addrs, "{extra}");
        assert_eq!(&route_lines(&pod, "-4"), routes, "{extra}");
        assert_eq!(
            kernel::sysctl(&net.host, "net/ipv4/ip_forward"),
            *forward,
            "{extra}"
        );
        // host-local reports its gateway either way; the default route only with
        // isDefaultGateway.
        assert_eq!(out.json()["ips"][0]["gateway"], "10.77.0.1", "{out}");
        let has_default = out.json()["routes"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["dst"] == "0.0.0.0/0"));
        assert_eq!(
            has_default,
            extra.get("isDefaultGateway").is_some(),
            "{out}"
        );
    });
}

#[test]
fn force_address_replaces_a_conflicting_bridge_address() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    // Another network on the same bridge already put 10.99.0.1/24 there.
    let other = Net::new();
    let first = json!({"isGateway": true});
    let mut old = net.conf("1.0.0", &["10.99.0.0/24"], &first);
    old["name"] = json!(other.name);
    old["ipam"]["dataDir"] = json!(other.data.path_str());
    let old_pod = net.pod();
    net.run("ADD", &old, "ctr-old", &old_pod, "eth0")
        .assert_success();
    let old_veths = net.host_veths();

    // Without forceAddress: refused after the veth and the reservation existed, and
    // both are undone.
    let conf = net.conf("1.0.0", &[V4], &json!({"isGateway": true}));
    let out = net.run("ADD", &conf, CID, &pod, "eth0");
    out.assert_error(
        999,
        &format!(
            "failed to set bridge addr: \"{}\" already has an IP address different from 10.77.0.1/24",
            net.bridge
        ),
    );
    assert_eq!(net.host_veths(), old_veths, "veth of the failed ADD left");
    assert!(!has_link(&pod, "eth0"));
    assert!(net.reservations().is_empty(), "{:?}", net.reservations());
    assert_eq!(net.bridge_addrs("-4"), ["10.99.0.1/24"]);

    // With forceAddress: the old address goes, the new one comes.
    let conf = net.conf(
        "1.0.0",
        &[V4],
        &json!({"isGateway": true, "forceAddress": true}),
    );
    net.run("ADD", &conf, CID, &pod, "eth0").assert_success();
    assert_eq!(net.bridge_addrs("-4"), ["10.77.0.1/24"]);
}

#[test]
fn ipv6_gateways_of_other_prefixes_coexist_on_the_bridge() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let (a, b) = (net.pod(), net.pod());
    let other = Net::new();
    let mut first = net.conf("1.0.0", &["fd00:99::/64"], &json!({"isGateway": true}));
    first["name"] = json!(other.name);
    first["ipam"]["dataDir"] = json!(other.data.path_str());
    net.run("ADD", &first, "ctr-a", &a, "eth0").assert_success();
    net.run(
        "ADD",
        &net.conf("1.0.0", &[V6], &json!({"isGateway": true})),
        "ctr-b",
        &b,
        "eth0",
    )
    .assert_success();
    let mut addrs = net.bridge_addrs("-6");
    addrs.sort();
    assert_eq!(addrs, ["fd00:77::1/64", "fd00:99::1/64"]);
}

#[test]
fn ipv6_gateway_of_a_new_bridge_answers_right_after_the_first_add() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    // DAD on for links made in the host netns, so that only the plugin can skip it.
    set_sysctl(&net.host, "net.ipv6.conf.all.accept_dad", "1");
    set_sysctl(&net.host, "net.ipv6.conf.default.accept_dad", "1");
    set_sysctl(&net.host, "net.ipv6.conf.default.dad_transmits", "1");
    let conf = net.conf("1.0.0", &[V6], &json!({"isDefaultGateway": true}));
    let out = net.run("ADD", &conf, CID, &pod, "eth0");
    out.assert_success();
    assert_eq!(net.bridge_addrs("-6"), ["fd00:77::1/64"]);

    // Without DAD the gateway is never tentative; with it, it would be for a second or
    // two after the bridge's first port comes up, answering nothing meanwhile. (The
    // bridge's link-local address is the kernel's, with the kernel's DAD.)
    let shown = net
        .host
        .exec_ok(&["ip", "-6", "addr", "show", "dev", &net.bridge]);
    let gateway_line = shown
        .lines()
        .find(|l| l.trim_start().starts_with("inet6 fd00:77::1/64"))
        .unwrap_or_else(|| panic!("no gateway address on the bridge:\n{shown}"));
    assert!(
        !gateway_line.contains("tentative"),
        "the gateway is still in DAD after ADD:\n{shown}"
    );
    // The first echo request, with one second for its answer, is answered.
    let ping = pod.exec(&["ping", "-c", "1", "-W", "1", "fd00:77::1"]);
    assert!(
        ping.status.success(),
        "the pod's first ping of its gateway went unanswered:\n{}{}\nbridge: {shown}",
        String::from_utf8_lossy(&ping.stdout),
        String::from_utf8_lossy(&ping.stderr)
    );
}

#[test]
fn ip_masq_nftables_backend_rules_and_removal() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    let conf = net.conf(
        "1.0.0",
        &[V4, V6],
        &json!({"ipMasq": true, "ipMasqBackend": "nftables"}),
    );
    net.run("ADD", &conf, CID, &pod, "eth0").assert_success();
    let nft = net.nft();
    let comment = format!(
        "{}, net: {}, if: eth0, id: {CID}",
        nft_instance(&net.name, "eth0", CID),
        net.name
    );
    for needle in [
        "table inet cni_plugins_masquerade".to_owned(),
        format!("ip saddr 10.77.0.2 ip daddr != 10.77.0.0/24 masquerade comment \"{comment}\""),
        format!("ip6 saddr fd00:77::2 ip6 daddr != fd00:77::/64 masquerade comment \"{comment}\""),
        "ip daddr 224.0.0.0/4 return".to_owned(),
        "ip6 daddr ff00::/8 return".to_owned(),
        "goto masq_checks".to_owned(),
    ] {
        assert!(nft.contains(&needle), "missing {needle:?} in\n{nft}");
    }
    assert!(!net.iptables().contains("CNI-"), "{}", net.iptables());
    net.run("DEL", &conf, CID, &pod, "eth0")
        .assert_success_silent();
    net.assert_nothing_left("after DEL");
}

#[test]
fn unknown_ip_masq_backend_is_refused_before_anything_is_made() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    let out = net.run(
        "ADD",
        &net.conf(
            "1.0.0",
            &[V4],
            &json!({"ipMasq": true, "ipMasqBackend": "pf"}),
        ),
        CID,
        &pod,
        "eth0",
    );
    out.assert_failure();
    assert!(
        out.error_msg()
            .is_some_and(|m| m.contains(r#"unknown ipmasq backend "pf""#)),
        "{out}"
    );
    assert!(net.bridge_link().is_none());
    net.assert_nothing_left("after refused ADD");
}

#[test]
fn dns_key_replaces_the_ipam_dns_in_the_result() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let dns = json!({
        "nameservers": ["10.77.0.53"],
        "domain": "pods.example",
        "search": ["example"],
        "options": ["ndots:2"],
    });
    let cases = [("1.0.0", dns.clone()), ("0.4.0", dns.clone())];
    check_cases(&cases, |(version, dns)| {
        let pod = net.pod();
        let id = cni_blackbox::unique_name("ctr");
        let out = net.run(
            "ADD",
            &net.conf(version, &[V4], &json!({"dns": dns})),
            &id,
            &pod,
            "eth0",
        );
        out.assert_success();
        assert_eq!(&out.json()["dns"], dns, "{out}");
    });
}

#[test]
fn container_mac_from_runtime_config_then_args_then_cni_args() {
    if !require_root() {
        return;
    }
    const RUNTIME: &str = "02:aa:00:00:00:01";
    const ARGS: &str = "02:aa:00:00:00:02";
    const ENV: &str = "02:aa:00:00:00:03";
    let cases = [
        (
            json!({"runtimeConfig": {"mac": RUNTIME}, "args": {"cni": {"mac": ARGS}}}),
            RUNTIME,
        ),
        (json!({"args": {"cni": {"mac": ARGS}}}), ARGS),
        (json!({}), ENV),
    ];
    check_cases(&cases, |(extra, expected)| {
        let net = Net::new();
        let pod = net.pod();
        let out = net
            .plugin("ADD", &net.conf("1.0.0", &[V4], extra))
            .attachment(CID, &pod, "eth0")
            // host-local sees CNI_ARGS too and would reject an unknown MAC=.
            .cni_args(&format!("IgnoreUnknown=1;MAC={ENV}"))
            .run();
        out.assert_success();
        assert_eq!(mac_of(&pod, "eth0"), *expected, "{extra}");
        assert_eq!(out.json()["interfaces"][2]["mac"], json!(expected), "{out}");
    });
}

#[test]
fn layer2_mode_without_ipam_type() {
    if !require_root() {
        return;
    }
    check_cases(&[json!({}), json!({"dataDir": "/nonexistent"})], |ipam| {
        let net = Net::new();
        let pod = net.pod();
        let mut conf = net.conf("1.0.0", &[], &json!({"isGateway": true}));
        conf["ipam"] = ipam.clone();
        let out = net.run("ADD", &conf, CID, &pod, "eth0");
        out.assert_success();
        let result = out.json();
        assert_eq!(result["interfaces"].as_array().map(Vec::len), Some(3));
        assert!(result.get("ips").is_none(), "{out}");
        assert!(kernel::link_is_up(&pod, "eth0"));
        assert!(global_addrs(&pod, "-4", "eth0").is_empty());
        assert!(global_addrs(&pod, "-6", "eth0").is_empty());
        assert!(net.bridge_addrs("-4").is_empty());
        assert!(!net.data.path().join(&net.name).exists());
        net.run("DEL", &conf, CID, &pod, "eth0")
            .assert_success_silent();
        assert!(net.host_veths().is_empty());
    });
}

#[test]
fn disable_container_interface_leaves_the_pod_link_down() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    let conf = net.conf("1.0.0", &[], &json!({"disableContainerInterface": true}));
    let out = net.run("ADD", &conf, CID, &pod, "eth0");
    out.assert_success();
    assert!(has_link(&pod, "eth0"));
    assert!(
        !kernel::link_is_up(&pod, "eth0"),
        "{:?}",
        kernel::link_flags(&pod, "eth0")
    );
    // The host end is up and on the bridge all the same.
    let veth = host_veth_of(&out);
    assert!(kernel::link_is_up(&net.host, &veth));
    assert_eq!(bridge_port(&net.host, &veth)["master"], json!(net.bridge));

    // With IPAM it is refused before anything is made.
    let other = net.pod();
    let out = net.run(
        "ADD",
        &net.conf("1.0.0", &[V4], &json!({"disableContainerInterface": true})),
        "c2",
        &other,
        "eth0",
    );
    out.assert_error(
        7,
        "cannot use IPAM when DisableContainerInterface flag is set",
    );
    assert!(!has_link(&other, "eth0"));
    assert_eq!(net.host_veths(), [veth]);
}

#[test]
fn macspoofchk_chains_in_the_bridge_family_and_their_removal() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    let conf = net.conf("1.0.0", &[V4], &json!({"macspoofchk": true}));
    let out = net.run("ADD", &conf, CID, &pod, "eth0");
    out.assert_success();
    let veth = host_veth_of(&out);
    let mac = mac_of(&pod, "eth0");
    let table = net.host.exec_ok(&["nft", "list", "table", "bridge", "nat"]);
    let chain = format!("cni-br-iface-{CID}-eth0");
    let comment = format!("comment \"macspoofchk-{CID}-eth0\"");
    for needle in [
        // -300 is what nft calls `dstnat` in the bridge family.
        "type filter hook prerouting priority dstnat; policy accept;".to_owned(),
        format!("iifname \"{veth}\" jump {chain} {comment}"),
        format!("chain {chain} {{"),
        format!("jump {chain}-mac {comment}"),
        format!("chain {chain}-mac {{"),
        format!("ether saddr {mac} return {comment}"),
        format!("drop {comment}"),
    ] {
        assert!(table.contains(&needle), "missing {needle:?} in\n{table}");
    }
    net.run("DEL", &conf, CID, &pod, "eth0")
        .assert_success_silent();
    net.assert_nothing_left("after DEL");
}

#[test]
fn macspoofchk_drops_frames_with_another_source_mac() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let (a, b) = (net.pod(), net.pod());
    let conf = net.conf("1.0.0", &[V4], &json!({"macspoofchk": true}));
    net.run("ADD", &conf, "ctr-a", &a, "eth0").assert_success();
    net.run("ADD", &conf, "ctr-b", &b, "eth0").assert_success();
    ping(&a, "10.77.0.3").unwrap_or_else(|e| panic!("a cannot reach b before spoofing: {e}"));
    a.exec_ok(&["ip", "link", "set", "eth0", "address", "02:de:ad:be:ef:01"]);
    a.exec_ok(&["ip", "neigh", "flush", "dev", "eth0"]);
    b.exec_ok(&["ip", "neigh", "flush", "dev", "eth0"]);
    let spoofed = a.exec(&["ping", "-c", "2", "-W", "1", "10.77.0.3"]);
    assert!(
        !spoofed.status.success(),
        "frames with a spoofed source MAC got through"
    );
}

#[test]
fn vlan_keys_without_kernel_support_fail_cleanly_or_configure_the_port() {
    if !require_root() {
        return;
    }
    let supported = vlan_filtering_supported();
    let cases = [
        json!({"vlan": 100}),
        json!({"vlanTrunk": [{"id": 101}, {"minID": 200, "maxID": 202}]}),
        json!({"vlan": 100, "vlanTrunk": [{"id": 101}], "preserveDefaultVlan": true}),
        json!({"vlanTrunk": []}),
    ];
    check_cases(&cases, |extra| {
        let net = Net::new();
        let pod = net.pod();
        let conf = net.conf("1.0.0", &[V4], extra);
        let out = net.run("ADD", &conf, CID, &pod, "eth0");
        if !supported {
            out.assert_failure();
            let msg = out.error_msg().unwrap_or_default();
            assert!(
                msg.starts_with(&format!("failed to create bridge \"{}\"", net.bridge))
                    && msg.contains("VLAN filtering")
                    && msg.contains("Operation not supported"),
                "unclear error: {out}"
            );
            assert!(net.bridge_link().is_none(), "bridge made");
            assert!(!has_link(&pod, "eth0"));
            net.assert_nothing_left("after refused ADD");
            let ports = net.host.exec_ok(&["bridge", "-j", "link", "show"]);
            assert!(ports.trim() == "[]" || ports.trim().is_empty(), "{ports}");
            return;
        }
        out.assert_success();
        let bridge = net.bridge_link().expect("bridge");
        assert_eq!(bridge["linkinfo"]["info_data"]["vlan_filtering"], 1);
        let veth = host_veth_of(&out);
        let vlans = net
            .host
            .exec_ok(&["bridge", "-j", "vlan", "show", "dev", &veth]);
        let vlans: Value = serde_json::from_str(&vlans).expect("bridge -j vlan");
        let mut seen: Vec<(u64, bool, bool)> = vlans[0]["vlans"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|v| {
                let flags: Vec<String> = v["flags"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|f| f.as_str().map(str::to_owned))
                    .collect();
                let pvid = flags.iter().any(|f| f == "PVID");
                let untagged = flags.iter().any(|f| f == "Egress Untagged");
                let start = v["vlan"].as_u64().unwrap_or(0);
                let end = v["vlanEnd"].as_u64().unwrap_or(start);
                (start..=end).map(move |id| (id, pvid, untagged))
            })
            .collect();
        seen.sort_unstable();
        let expected: Vec<(u64, bool, bool)> = match extra.get("vlan").and_then(Value::as_u64) {
            Some(100) if extra.get("preserveDefaultVlan").is_some() => {
                vec![(1, false, true), (100, true, true), (101, false, false)]
            }
            Some(100) => vec![(100, true, true)],
            _ if extra["vlanTrunk"].as_array().is_some_and(|t| t.is_empty()) => {
                vec![(1, true, true)]
            }
            _ => vec![
                (1, true, true),
                (101, false, false),
                (200, false, false),
                (201, false, false),
                (202, false, false),
            ],
        };
        assert_eq!(seen, expected, "{extra}: {vlans}");
    });
}

#[test]
fn vlan_on_an_existing_bridge_without_filtering_support_is_undone() {
    if !require_root() {
        return;
    }
    if vlan_filtering_supported() {
        // Covered by the test above with a configured port.
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    // The bridge exists already (made by an earlier plain ADD), so the failure comes
    // from the port's VLAN setup, after the veth and before IPAM.
    let first = net.pod();
    net.run(
        "ADD",
        &net.conf("1.0.0", &[V4], &json!({})),
        "ctr-0",
        &first,
        "eth0",
    )
    .assert_success();
    let before = net.host_veths();
    let reserved = net.reservations();
    let out = net.run(
        "ADD",
        &net.conf("1.0.0", &[V4], &json!({"vlan": 100, "ipMasq": true})),
        CID,
        &pod,
        "eth0",
    );
    out.assert_failure();
    assert!(
        out.error_msg()
            .is_some_and(|m| m.contains("vlan") && m.contains("Operation not supported")),
        "unclear error: {out}"
    );
    assert_eq!(net.host_veths(), before, "veth of the failed ADD left");
    assert!(!has_link(&pod, "eth0"));
    assert_eq!(net.reservations(), reserved);
    assert_no_masq_rules(&net, "after failed ADD");
}

/// Failures injected after the veth exists; each must leave nothing of its attachment.
#[test]
fn failed_add_after_the_veth_exists_leaves_nothing() {
    if !require_root() {
        return;
    }
    #[derive(Debug)]
    enum Failure {
        RangeExhausted,
        NoSuchIpam,
        UnreachableRoute,
    }
    let cases = [
        Failure::RangeExhausted,
        Failure::NoSuchIpam,
        Failure::UnreachableRoute,
    ];
    check_cases(&cases, |failure| {
        let net = Net::new();
        let pod = net.pod();
        let first_pod = net.pod();
        let keys = json!({
            "isDefaultGateway": true,
            "ipMasq": true,
            "macspoofchk": true,
            "hairpinMode": true,
        });
        let (conf, expect_msg) = match failure {
            Failure::RangeExhausted => {
                let conf = net.conf("1.0.0", &["10.8.0.0/30"], &keys);
                // The /30 has one address besides the gateway: take it.
                net.run("ADD", &conf, "ctr-first", &first_pod, "eth0")
                    .assert_success();
                (conf, vec!["no IP addresses available in range set"])
            }
            Failure::NoSuchIpam => {
                let mut conf = net.conf("1.0.0", &[V4], &keys);
                conf["ipam"]["type"] = json!("no-such-ipam");
                (conf, vec!["no-such-ipam"])
            }
            Failure::UnreachableRoute => {
                let mut conf = net.conf("1.0.0", &[V4], &keys);
                conf["ipam"]["routes"] = json!([{"dst": "10.200.0.0/16", "gw": "10.99.99.99"}]);
                // The kernel's reason must reach the user, not just what failed.
                (
                    conf,
                    vec![
                        "failed to add route '10.200.0.0/16 via 10.99.99.99",
                        "unreachable",
                    ],
                )
            }
        };
        let veths_before = net.host_veths();
        let reservations_before = net.reservations();
        let ipt_before = net.iptables();
        let out = net.run("ADD", &conf, CID, &pod, "eth0");
        out.assert_failure();
        assert!(
            out.error_msg()
                .is_some_and(|m| expect_msg.iter().all(|e| m.contains(e))),
            "{failure:?}: unexpected error:\n{out}"
        );
        assert_eq!(net.host_veths(), veths_before, "{failure:?}: veth left");
        assert!(!has_link(&pod, "eth0"), "{failure:?}: pod link left");
        assert_eq!(veths(&pod), Vec::<String>::new());
        assert_eq!(
            net.reservations(),
            reservations_before,
            "{failure:?}: reservation left"
        );
        assert_eq!(
            rule_lines(&net.iptables()),
            rule_lines(&ipt_before),
            "{failure:?}: iptables rules changed"
        );
        let nft = net.nft();
        assert!(
            !nft.contains(&format!("macspoofchk-{CID}-eth0")),
            "{failure:?}: {nft}"
        );
        assert!(!nft.contains(&format!("id: {CID}")), "{failure:?}: {nft}");
    });
}

#[test]
fn existing_link_with_the_bridge_name_that_is_not_a_bridge() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    net.host.exec_ok(&[
        "ip",
        "link",
        "add",
        &net.bridge,
        "type",
        "veth",
        "peer",
        "name",
        "cnibbpeer0",
    ]);
    let out = net.run(
        "ADD",
        &net.conf("1.0.0", &[V4], &json!({})),
        CID,
        &pod,
        "eth0",
    );
    out.assert_failure();
    assert!(
        out.error_msg().is_some_and(|m| m.contains(&format!(
            "\"{}\" already exists but is not a bridge",
            net.bridge
        ))),
        "{out}"
    );
    assert!(!has_link(&pod, "eth0"));
    assert!(net.reservations().is_empty());
    let mut left = net.host_veths();
    left.sort();
    let mut expected = vec![net.bridge.clone(), "cnibbpeer0".to_owned()];
    expected.sort();
    assert_eq!(left, expected);
}

#[test]
fn ifname_already_in_the_pod_is_refused_before_anything_is_made() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    pod.exec_ok(&[
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
    ]);
    let mac = mac_of(&pod, "eth0");
    let conf = net.conf("1.0.0", &[V4], &json!({"ipMasq": true, "isGateway": true}));
    let out = net.run("ADD", &conf, CID, &pod, "eth0");
    out.assert_failure();
    let msg = out.error_msg().unwrap_or_default();
    assert!(
        msg.contains("\"eth0\"") && msg.contains("already exists"),
        "unclear error: {out}"
    );
    assert!(net.host_veths().is_empty(), "{:?}", net.host_veths());
    assert!(net.reservations().is_empty());
    assert!(!net.data.path().join(&net.name).exists(), "IPAM was called");
    assert_no_masq_rules(&net, "after refused ADD");
    // The pod's own eth0 is untouched.
    assert_eq!(mac_of(&pod, "eth0"), mac);
    let mut pod_veths = veths(&pod);
    pod_veths.sort();
    assert_eq!(pod_veths, ["eth0", "other0"]);
}

#[test]
fn del_twice_succeeds_and_cleans_everything() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    let conf = net.conf(
        "1.0.0",
        &[V4, V6],
        &json!({"isGateway": true, "ipMasq": true, "macspoofchk": true}),
    );
    net.run("ADD", &conf, CID, &pod, "eth0").assert_success();
    assert_eq!(net.reservations().len(), 2);
    for round in ["first", "second"] {
        net.run("DEL", &conf, CID, &pod, "eth0")
            .assert_success_silent();
        net.assert_nothing_left(&format!("after the {round} DEL"));
        assert!(!has_link(&pod, "eth0"));
    }
    // DEL of an attachment that never existed is fine too.
    net.run("DEL", &conf, "never-added", &pod, "eth1")
        .assert_success_silent();
}

#[test]
fn del_without_the_netns_removes_masq_rules_in_both_backends() {
    if !require_root() {
        return;
    }
    #[derive(Debug)]
    enum Gone {
        NetnsDeleted,
        EmptyNetnsVar,
    }
    let cases = [
        ("iptables", Gone::NetnsDeleted),
        ("nftables", Gone::NetnsDeleted),
        ("iptables", Gone::EmptyNetnsVar),
        ("nftables", Gone::EmptyNetnsVar),
    ];
    check_cases(&cases, |(backend, gone)| {
        let net = Net::new();
        let pod = net.pod();
        let pod_path = pod.path_str().to_owned();
        let conf = net.conf(
            "1.0.0",
            &[V4, V6],
            &json!({"ipMasq": true, "ipMasqBackend": backend, "macspoofchk": true}),
        );
        net.run("ADD", &conf, CID, &pod, "eth0").assert_success();
        let rules = format!("{}{}", net.iptables(), net.nft());
        assert!(
            rules.contains("CNI-") || rules.contains("masquerade comment"),
            "{backend}: no rules after ADD"
        );
        let netns_var = match gone {
            Gone::NetnsDeleted => {
                pod.delete();
                pod_path
            }
            Gone::EmptyNetnsVar => {
                drop(pod);
                String::new()
            }
        };
        // (For the empty-var case the pod went too; its veth with it.)
        net.plugin("DEL", &conf)
            .container_id(CID)
            .netns(&netns_var)
            .ifname("eth0")
            .run()
            .assert_success_silent();
        // The kernel destroys a deleted netns (and the veth pair in it) asynchronously.
        net.wait_host_veths_gone();
        net.assert_nothing_left(&format!("{backend} {gone:?}"));
    });
}

#[test]
fn check_passes_after_add_and_reports_what_went_missing() {
    if !require_root() {
        return;
    }
    #[derive(Debug)]
    enum Break {
        Nothing,
        PodAddress,
        Bridge,
    }
    let cases = [
        ("0.4.0", Break::Nothing),
        ("1.0.0", Break::Nothing),
        ("1.1.0", Break::Nothing),
        ("0.4.0", Break::PodAddress),
        ("1.0.0", Break::PodAddress),
        ("1.0.0", Break::Bridge),
        ("0.4.0", Break::Bridge),
    ];
    check_cases(&cases, |(version, what)| {
        let net = Net::new();
        let pod = net.pod();
        let mut conf = net.conf(
            version,
            &[V4, V6],
            &json!({"isDefaultGateway": true, "ipMasq": true}),
        );
        let out = net.run("ADD", &conf, CID, &pod, "eth0");
        out.assert_success();
        conf["prevResult"] = out.json();
        let expected = match what {
            Break::Nothing => None,
            Break::PodAddress => {
                pod.exec_ok(&["ip", "addr", "del", "10.77.0.2/24", "dev", "eth0"]);
                Some("Failed to match addr 10.77.0.2/24 on interface eth0".to_owned())
            }
            Break::Bridge => {
                net.host.exec_ok(&["ip", "link", "del", &net.bridge]);
                Some(format!("Interface name {} not found", net.bridge))
            }
        };
        let check = net.run("CHECK", &conf, CID, &pod, "eth0");
        match expected {
            None => {
                check.assert_success_silent();
            }
            Some(msg) => {
                check.assert_error(999, &msg);
            }
        }
    });
}

#[test]
fn check_needs_a_prev_result() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    let conf = net.conf("1.0.0", &[V4], &json!({}));
    net.run("ADD", &conf, CID, &pod, "eth0").assert_success();
    net.run("CHECK", &conf, CID, &pod, "eth0")
        .assert_error(999, "Required prevResult missing");
}

#[test]
fn status_forwards_to_ipam() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let status = |conf: &Value| net.plugin("STATUS", conf).run();
    let conf = net.conf("1.1.0", &["10.8.0.0/30"], &json!({}));
    status(&conf).assert_success_silent();
    let pod = net.pod();
    net.run("ADD", &conf, CID, &pod, "eth0").assert_success();
    // The /30 is now exhausted: host-local says so with code 50, and bridge passes it on.
    let out = status(&conf);
    out.assert_failure();
    assert_eq!(out.error_code(), Some(50), "{out}");
    // Layer 2: nothing to ask.
    status(&net.conf("1.1.0", &[], &json!({}))).assert_success_silent();
    // Before 1.1.0 there is no STATUS.
    let old = status(&net.conf("1.0.0", &["10.8.0.0/30"], &json!({})));
    old.assert_failure();
}

#[test]
fn gc_removes_rules_of_stale_attachments_only() {
    if !require_root() {
        return;
    }
    check_cases(&["iptables", "nftables"], |backend| {
        let net = Net::new();
        let (keep, stale, neighbour) = (net.pod(), net.pod(), net.pod());
        let keys = json!({"ipMasq": true, "ipMasqBackend": backend, "macspoofchk": true});
        let conf = net.conf("1.1.0", &[V4], &keys);
        net.run("ADD", &conf, "ctr-keep", &keep, "eth0")
            .assert_success();
        net.run("ADD", &conf, "ctr-stale", &stale, "eth0")
            .assert_success();
        // A live attachment of another network on the same host: GC of this network
        // must not touch it (the spoof-check table is shared by all networks).
        let other_data = cni_blackbox::TempDir::new("cnibb-br-data");
        let mut other = net.conf("1.1.0", &["10.78.0.0/24"], &keys);
        other["name"] = json!("cnibb-other-net");
        other["ipam"]["dataDir"] = json!(other_data.path_str());
        net.run("ADD", &other, "ctr-other", &neighbour, "eth0")
            .assert_success();
        // The stale container is gone without a DEL (its veth goes with its netns).
        let stale_veths = veths(&net.host).len();
        stale.delete();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while net.host_veths().len() == stale_veths && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }

        let mut gc = conf.clone();
        gc["cni.dev/valid-attachments"] = json!([{"containerID": "ctr-keep", "ifname": "eth0"}]);
        net.plugin("GC", &gc).run().assert_success_silent();

        let rules = format!("{}{}", net.iptables(), net.nft());
        let present = |cid: &str| {
            let chain = iptables_chain(&net.name, cid);
            let nft = nft_instance(&net.name, "eth0", cid);
            if *backend == "iptables" {
                rules.contains(&chain)
            } else {
                rules.contains(&nft)
            }
        };
        assert!(present("ctr-keep"), "valid masq rules removed:\n{rules}");
        assert!(!present("ctr-stale"), "stale masq rules kept:\n{rules}");
        let other_masq = if *backend == "iptables" {
            iptables_chain("cnibb-other-net", "ctr-other")
        } else {
            nft_instance("cnibb-other-net", "eth0", "ctr-other")
        };
        assert!(
            rules.contains(&other_masq),
            "other network's rules removed:\n{rules}"
        );
        for (cid, kept) in [
            ("ctr-keep", true),
            ("ctr-stale", false),
            ("ctr-other", true),
        ] {
            for needle in [
                format!("chain cni-br-iface-{cid}-eth0 {{"),
                format!("chain cni-br-iface-{cid}-eth0-mac {{"),
                format!("comment \"macspoofchk-{cid}-eth0\""),
            ] {
                assert_eq!(rules.contains(&needle), kept, "{needle}:\n{rules}");
            }
        }
        // host-local released the stale reservation only.
        let owners: Vec<String> = net.reservations().into_values().collect();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert!(owners[0].starts_with("ctr-keep"), "{owners:?}");
        net.run("DEL", &conf, "ctr-keep", &keep, "eth0")
            .assert_success_silent();
        net.run("DEL", &other, "ctr-other", &neighbour, "eth0")
            .assert_success_silent();
        net.assert_nothing_left("after GC and DEL");
    });
}

#[test]
fn gc_leaves_other_networks_rules_alone() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    let conf = net.conf(
        "1.1.0",
        &[V4],
        &json!({"ipMasq": true, "ipMasqBackend": "nftables"}),
    );
    net.run("ADD", &conf, CID, &pod, "eth0").assert_success();
    let mut other = conf.clone();
    other["name"] = json!("some-other-net");
    other["ipam"]["dataDir"] = json!(net.data.path().join("other").to_str());
    other["cni.dev/valid-attachments"] = json!([]);
    net.plugin("GC", &other).run().assert_success_silent();
    assert!(
        net.nft().contains(&nft_instance(&net.name, "eth0", CID)),
        "{}",
        net.nft()
    );
    assert_eq!(net.reservations().len(), 1);
}

#[test]
fn layer2_config_at_0_2_0_fails_before_anything_is_made() {
    if !require_root() {
        return;
    }
    check_cases(&["0.1.0", "0.2.0"], |version| {
        let net = Net::new();
        let pod = net.pod();
        let out = net.run(
            "ADD",
            &net.conf(version, &[], &json!({})),
            CID,
            &pod,
            "eth0",
        );
        out.assert_error(999, "cannot convert: no valid IP addresses");
        assert!(!has_link(&pod, "eth0"));
        assert!(net.bridge_link().is_none());
        assert!(net.host_veths().is_empty());
    });
}

#[test]
fn v020_result_of_a_layer3_add() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    let mut conf = dual_gateway_conf(&net, "0.2.0");
    conf["ipam"]["ranges"] = json!([[{"subnet": V4}]]);
    let out = net.run("ADD", &conf, CID, &pod, "eth0");
    out.assert_success();
    assert_eq!(
        out.json(),
        json!({
            "cniVersion": "0.2.0",
            "ip4": {
                "ip": "10.77.0.2/24",
                "gateway": "10.77.0.1",
                "routes": [
                    {"dst": "192.168.0.0/16"},
                    {"dst": "0.0.0.0/0", "gw": "10.77.0.1"}
                ]
            },
            "dns": {"nameservers": ["10.77.0.1"]}
        })
    );
}

/// A pod on two bridge networks that both set a default route (Multus-style), as the
/// reference v1.1.1 allows: the second default route is added next to the first (IPv4:
/// a second `default` entry; IPv6: an ECMP route), not refused.
#[test]
fn one_pod_on_two_networks_with_default_gateways() {
    if !require_root() {
        return;
    }
    let first = Net::new();
    let pod = first.pod();
    let keys = json!({"isDefaultGateway": true});
    first
        .run(
            "ADD",
            &first.conf("1.0.0", &[V4, V6], &keys),
            CID,
            &pod,
            "eth0",
        )
        .assert_success();
    // The second network's bridge lives in the same host netns as the first's.
    let data = cni_blackbox::TempDir::new("cnibb-br-data");
    let mut second = first.conf("1.0.0", &["10.78.0.0/24", "fd00:78::/64"], &keys);
    second["name"] = json!("cnibb-second-net");
    second["bridge"] = json!(cni_blackbox::unique_ifname("cbr"));
    second["ipam"]["dataDir"] = json!(data.path_str());
    first
        .run("ADD", &second, CID, &pod, "net1")
        .assert_success();
    let v4 = route_lines(&pod, "-4");
    for line in [
        "default via 10.77.0.1 dev eth0",
        "default via 10.78.0.1 dev net1",
    ] {
        assert!(v4.iter().any(|l| l == line), "{line} missing: {v4:?}");
    }
    let v6 = pod.exec_ok(&["ip", "-6", "route", "show", "default"]);
    for gw in ["fd00:77::1", "fd00:78::1"] {
        assert!(v6.contains(gw), "{gw} missing: {v6}");
    }
}

/// Beyond the reference, CHECK also verifies the attachment's masquerade rules and spoof
/// check (docs/configuration.md, "Differences"): removing them makes CHECK fail.
#[test]
fn check_reports_missing_masquerade_and_spoof_check_rules() {
    if !require_root() {
        return;
    }
    #[derive(Debug)]
    enum Remove {
        IptablesChain,
        NftMasqTable,
        SpoofTable,
    }
    let cases = [
        Remove::IptablesChain,
        Remove::NftMasqTable,
        Remove::SpoofTable,
    ];
    check_cases(&cases, |remove| {
        let net = Net::new();
        let pod = net.pod();
        let backend = match remove {
            Remove::NftMasqTable => "nftables",
            _ => "iptables",
        };
        let mut conf = net.conf(
            "1.0.0",
            &[V4],
            &json!({"ipMasq": true, "ipMasqBackend": backend, "macspoofchk": true}),
        );
        let add = net.run("ADD", &conf, CID, &pod, "eth0");
        add.assert_success();
        conf["prevResult"] = add.json();
        net.run("CHECK", &conf, CID, &pod, "eth0")
            .assert_success_silent();
        match remove {
            Remove::IptablesChain => {
                let chain = iptables_chain(&net.name, CID);
                let comment = format!("name: \"{}\" id: \"{CID}\"", net.name);
                net.host.exec_ok(&[
                    "iptables",
                    "-t",
                    "nat",
                    "-D",
                    "POSTROUTING",
                    "-s",
                    "10.77.0.2/32",
                    "-m",
                    "comment",
                    "--comment",
                    &comment,
                    "-j",
                    &chain,
                ]);
            }
            Remove::NftMasqTable => {
                net.host
                    .exec_ok(&["nft", "delete", "table", "inet", "cni_plugins_masquerade"]);
            }
            Remove::SpoofTable => {
                net.host
                    .exec_ok(&["nft", "delete", "table", "bridge", "nat"]);
            }
        }
        let check = net.run("CHECK", &conf, CID, &pod, "eth0");
        check.assert_failure();
        assert!(
            check.error_msg().is_some_and(|m| m.contains("not found")),
            "{remove:?}: {check}"
        );
    });
}

#[test]
fn add_with_a_missing_netns_fails_before_anything_is_made() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let conf = net.conf("1.0.0", &[V4], &json!({"isGateway": true, "ipMasq": true}));
    let missing = "/var/run/netns/cnibb-br-no-such-netns";
    let out = net
        .plugin("ADD", &conf)
        .container_id(CID)
        .netns(missing)
        .ifname("eth0")
        .run();
    out.assert_failure();
    assert!(
        out.error_msg()
            .is_some_and(|m| m.starts_with(&format!("failed to open netns \"{missing}\""))),
        "{out}"
    );
    assert!(net.bridge_link().is_none());
    net.assert_nothing_left("after refused ADD");
    assert!(!net.data.path().join(&net.name).exists(), "IPAM was called");
}

/// Without `bridge` the plugin uses `cni0` (made inside this test's own host netns, so no
/// real `cni0` is touched).
#[test]
fn bridge_name_defaults_to_cni0() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    let conf = net.conf("1.0.0", &[V4], &json!({"bridge": null, "isGateway": true}));
    assert!(conf.get("bridge").is_none());
    let out = net.run("ADD", &conf, CID, &pod, "eth0");
    out.assert_success();
    assert_eq!(out.json()["interfaces"][0]["name"], "cni0", "{out}");
    assert_eq!(net.bridges(), ["cni0"]);
    assert_eq!(global_addrs(&net.host, "-4", "cni0"), ["10.77.0.1/24"]);
    assert_eq!(
        bridge_port(&net.host, &host_veth_of(&out))["master"],
        "cni0"
    );
}

/// Configs the plugin must refuse, each before it creates anything: no bridge, no veth,
/// no reservation.
#[test]
fn invalid_configs_are_refused_before_anything_is_made() {
    if !require_root() {
        return;
    }
    let cases = [
        (
            json!({"vlan": 4095}),
            "",
            "invalid VLAN ID 4095 (must be between 0 and 4094)",
        ),
        (
            json!({"vlanTrunk": [{"minID": 5}]}),
            "",
            "minID and maxID should be configured simultaneously, maxID is missing",
        ),
        (
            json!({"vlanTrunk": [{"minID": 9, "maxID": 5}]}),
            "",
            "minID is greater than maxID in trunk parameter",
        ),
        (
            json!({"vlanTrunk": [{"id": 4095}]}),
            "",
            "incorrect trunk id parameter",
        ),
        (
            json!({"runtimeConfig": {"mac": "not-a-mac"}}),
            "",
            "not-a-mac",
        ),
        (json!({}), "IgnoreUnknown=1;MAC=zz:zz", "zz:zz"),
        (json!({}), "FOO=bar", "unknown args"),
        (json!({"mtu": -1}), "", "-1"),
        (json!({"isGateway": "yes"}), "", "failed to load netconf: "),
    ];
    check_cases(&cases, |(extra, args, msg)| {
        let net = Net::new();
        let pod = net.pod();
        let mut plugin = net
            .plugin("ADD", &net.conf("1.0.0", &[V4], extra))
            .attachment(CID, &pod, "eth0");
        if !args.is_empty() {
            plugin = plugin.cni_args(args);
        }
        let out = plugin.run();
        out.assert_failure();
        assert!(
            out.error_msg().is_some_and(|m| m.contains(msg)),
            "expected {msg:?}:\n{out}"
        );
        // A mistake in the config is the config's (7) or its JSON's (6), never "internal"
        // (an unknown CNI_ARGS key is the environment's, answered as the reference does).
        if *msg != "unknown args" {
            assert!(
                matches!(out.error_code(), Some(6 | 7)),
                "expected code 6 or 7:\n{out}"
            );
        }
        assert!(net.bridge_link().is_none(), "bridge made:\n{out}");
        assert!(!has_link(&pod, "eth0"));
        net.assert_nothing_left("after refused ADD");
    });
}

/// What containerd passes for pod `ns/name` of sandbox `sandbox`.
fn k8s_args(ns: &str, name: &str, sandbox: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};\
         K8S_POD_INFRA_CONTAINER_ID={sandbox};K8S_POD_UID=5b1c0c4e-8f0e-4c55-9e1e-3f6b1f0a2d11"
    )
}

/// A dual-stack config with `podRecordDir` (this network's own directory).
fn records_conf(net: &Net) -> Value {
    net.conf(
        "1.1.0",
        &[V4, V6],
        &json!({"isGateway": true, "podRecordDir": net.records_dir()}),
    )
}

/// `command` of the attachment (`id`, `pod`, eth0) with the pod's CNI_ARGS.
fn run_k8s(net: &Net, command: &str, conf: &Value, id: &str, pod: &Netns, args: &str) -> Outcome {
    net.plugin(command, conf)
        .attachment(id, pod, "eth0")
        .cni_args(args)
        .run()
}

#[test]
fn pod_records_and_pending_addresses_from_add_to_del() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    net.create_policy_table();
    let conf = records_conf(&net);
    let args = k8s_args("team-a", "web-7d4b9c-x2x8v", CID);
    let add = run_k8s(&net, "ADD", &conf, CID, &pod, &args);
    add.assert_success();
    // One record per address of the pod: the pod, then the container, on two lines.
    let record = format!("team-a/web-7d4b9c-x2x8v\n{CID}\n");
    let want = BTreeMap::from([
        ("10.77.0.2".to_string(), record.clone()),
        ("fd00:77::2".to_string(), record),
    ]);
    assert_eq!(net.pod_records(), want, "{add}");
    // Held pending (for the agent to release), with the pod they were added for.
    let pending = BTreeMap::from([
        (
            "10.77.0.2".to_string(),
            "team-a/web-7d4b9c-x2x8v".to_string(),
        ),
        (
            "fd00:77::2".to_string(),
            "team-a/web-7d4b9c-x2x8v".to_string(),
        ),
    ]);
    assert_eq!(net.pending(), Some(pending));

    // CHECK wants the records.
    let mut check = conf.clone();
    check["prevResult"] = add.json();
    run_k8s(&net, "CHECK", &check, CID, &pod, &args).assert_success_silent();
    std::fs::remove_file(net.records_dir().join("fd00:77::2")).unwrap();
    let out = run_k8s(&net, "CHECK", &check, CID, &pod, &args);
    out.assert_error(
        999,
        &format!(
            "CHECK of the pod records in {}: there is no pod record of fd00:77::2",
            net.records_dir().display()
        ),
    );
    pod_record_write(&net, "fd00:77::2", "team-a/web-7d4b9c-x2x8v", CID);

    // DEL (with the cached result as prevResult, as libcni sends it): the pending
    // addresses and the records go; a second DEL is fine.
    let mut del = conf.clone();
    del["prevResult"] = add.json();
    run_k8s(&net, "DEL", &del, CID, &pod, &args).assert_success_silent();
    assert_eq!(net.pod_records(), BTreeMap::new());
    assert_eq!(net.pending(), Some(BTreeMap::new()));
    run_k8s(&net, "DEL", &del, CID, &pod, &args).assert_success_silent();
    net.assert_nothing_left("after DEL");
}

/// Writes a record by hand, as the plugin does.
fn pod_record_write(net: &Net, ip: &str, pod: &str, id: &str) {
    std::fs::write(net.records_dir().join(ip), format!("{pod}\n{id}\n")).unwrap();
}

#[test]
fn pod_records_without_the_policy_table_and_del_without_prev_result_or_netns() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    let conf = records_conf(&net);
    let args = k8s_args("default", "db-0", CID);
    let add = run_k8s(&net, "ADD", &conf, CID, &pod, &args);
    add.assert_success();
    assert_eq!(
        net.pod_records().keys().collect::<Vec<_>>(),
        ["10.77.0.2", "fd00:77::2"]
    );
    // The plugin never makes the table: no agent enforces NetworkPolicy here.
    assert_eq!(net.pending(), None);
    // Another pod's record of an address is not this container's to remove.
    pod_record_write(&net, "10.77.0.200", "default/other", "ctr-other");
    // DEL without prevResult and without a netns finds the records by container id.
    let del = net
        .plugin("DEL", &conf)
        .container_id(CID)
        .netns("")
        .ifname("eth0")
        .cni_args(&args)
        .run();
    del.assert_success_silent();
    assert_eq!(
        net.pod_records().keys().collect::<Vec<_>>(),
        ["10.77.0.200"]
    );
    std::fs::remove_file(net.records_dir().join("10.77.0.200")).unwrap();
    // The runtime removes the netns, and with it the veth.
    pod.delete();
    net.wait_host_veths_gone();
    net.assert_nothing_left("after DEL");
}

#[test]
fn without_pod_record_dir_or_pod_args_nothing_is_recorded() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    net.create_policy_table();
    // podRecordDir without the pod's arguments (a runtime that is not Kubernetes).
    let pod = net.pod();
    let conf = records_conf(&net);
    run_k8s(&net, "ADD", &conf, CID, &pod, "IgnoreUnknown=1").assert_success();
    // The pod's arguments without podRecordDir.
    let plain = net.conf("1.1.0", &[V4, V6], &json!({"isGateway": true}));
    let pod2 = net.pod();
    run_k8s(
        &net,
        "ADD",
        &plain,
        "ctr-2",
        &pod2,
        &k8s_args("a", "b", "ctr-2"),
    )
    .assert_success();
    assert!(!net.records_dir().exists());
    assert_eq!(net.pending(), Some(BTreeMap::new()));
    run_k8s(&net, "DEL", &conf, CID, &pod, "IgnoreUnknown=1").assert_success_silent();
    run_k8s(
        &net,
        "DEL",
        &plain,
        "ctr-2",
        &pod2,
        &k8s_args("a", "b", "ctr-2"),
    )
    .assert_success_silent();
    net.assert_nothing_left("after DEL");
}

#[test]
fn a_failed_add_leaves_no_pod_record_and_no_pending_address() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let pod = net.pod();
    net.create_policy_table();
    let conf = records_conf(&net);
    let args = k8s_args("team-a", "web-0", CID);
    // Bad arguments and a bad podRecordDir: refused before anything is made.
    let out = run_k8s(
        &net,
        "ADD",
        &conf,
        CID,
        &pod,
        &k8s_args("Team_A", "web-0", CID),
    );
    out.assert_error(
        4,
        "invalid K8S_POD_NAMESPACE \"Team_A\" in CNI_ARGS: a namespace is a DNS label \
         (at most 63 lower-case letters, digits and '-', starting and ending with a \
         letter or digit)",
    );
    let mut relative = conf.clone();
    relative["podRecordDir"] = json!("run/pods");
    run_k8s(&net, "ADD", &relative, CID, &pod, &args)
        .assert_error(7, "podRecordDir must be an absolute path, not \"run/pods\"");
    assert!(!net.records_dir().exists());
    // A failure after the records were made: the last step of ADD, found in a trace
    // of a clean run on the bridge an earlier ADD made (as the failing ADD finds it).
    run_k8s(&net, "ADD", &conf, CID, &pod, &args).assert_success();
    run_k8s(&net, "DEL", &conf, CID, &pod, &args).assert_success_silent();
    let trace_dir = cni_blackbox::TempDir::new("cnibb-records-trace");
    let trace = trace_dir.path().join("trace");
    let traced = net
        .plugin("ADD", &conf)
        .attachment(CID, &pod, "eth0")
        .cni_args(&args)
        .env(
            "CNI_RS_FAILPOINT_TRACE",
            trace_dir.path().join("trace").to_str().unwrap(),
        )
        .run();
    traced.assert_success();
    run_k8s(&net, "DEL", &conf, CID, &pod, &args).assert_success_silent();
    net.assert_nothing_left("after the traced ADD's DEL");
    let steps: Vec<String> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("bridge/add/"))
        .map(str::to_owned)
        .collect();
    for wanted in [
        "bridge/add/pod-record-staged",
        "bridge/add/pod-pending",
        "bridge/add/pod-record",
    ] {
        assert!(steps.iter().any(|s| s == wanted), "{wanted}: {steps:?}");
    }
    let at = |step: &str| steps.iter().position(|s| s == step);
    assert!(
        at("bridge/add/pod-record") < at("bridge/add/container-up"),
        "{steps:?}"
    );
    let last = format!("bridge:error@{}", steps.len());
    let out = net
        .plugin("ADD", &conf)
        .attachment(CID, &pod, "eth0")
        .cni_args(&args)
        .env("CNI_RS_FAILPOINT", &last)
        .run();
    assert_eq!(out.error_code(), Some(999), "{out}");
    net.assert_nothing_left("after an ADD that failed at its last step");
    assert_eq!(net.pending(), Some(BTreeMap::new()));
    assert!(!has_link(&pod, "eth0"));
}

#[test]
fn gc_removes_the_pod_records_of_containers_without_a_valid_attachment() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    net.create_policy_table();
    let conf = records_conf(&net);
    let (keep, stale) = (net.pod(), net.pod());
    run_k8s(
        &net,
        "ADD",
        &conf,
        "ctr-keep",
        &keep,
        &k8s_args("a", "keep", "ctr-keep"),
    )
    .assert_success();
    run_k8s(
        &net,
        "ADD",
        &conf,
        "ctr-stale",
        &stale,
        &k8s_args("a", "stale", "ctr-stale"),
    )
    .assert_success();
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "ctr-keep", "ifname": "eth0"}]);
    net.plugin("GC", &gc).run().assert_success_silent();
    let left: BTreeMap<String, String> = net.pod_records();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.values().all(|r| r == "a/keep\nctr-keep\n"), "{left:?}");
    let pending = net.pending().unwrap();
    assert_eq!(
        pending.keys().collect::<Vec<_>>(),
        left.keys().collect::<Vec<_>>()
    );
    run_k8s(
        &net,
        "DEL",
        &conf,
        "ctr-keep",
        &keep,
        &k8s_args("a", "keep", "ctr-keep"),
    )
    .assert_success_silent();
    drop(stale);
    net.wait_host_veths_gone();
    net.assert_nothing_left("after GC and DEL");
}
