//! The bridge plugin's VLAN keys (`vlan`, `vlanTrunk`, `preserveDefaultVlan`, as the
//! reference plugin applies them to the host port) on a kernel with bridge VLAN filtering: the VLANs each host
//! port ends up in (`bridge -j vlan show`), frames that stay inside their VLAN (pods on one
//! VLAN reach each other, pods on another VLAN of the same bridge do not, a trunk carries
//! its tagged VLAN), the `<bridge>.<vlan>` gateway interface, and DEL leaving nothing.
//!
//! The development and CI machines' kernel has no bridge VLAN filtering (there `bridge.rs`
//! checks that such configs fail cleanly), so `tests/vm/run-vlan-tier.sh` boots Debian's
//! stock kernel under emulation and runs this file inside it with `CNI_RS_REQUIRE_VLAN=1`,
//! which turns a kernel without VLAN filtering into a failure. Without that variable these
//! tests skip loudly on such a kernel; on a capable kernel they always run.
//!
//! Process starts are 20-60x slower under emulation, so each test keeps its plugin calls
//! and kernel reads few. As everywhere in `tests/`, each test makes its own host and pod
//! namespaces and never touches the machine's root netns.

mod bridge_support;

use std::io::Write as _;
use std::sync::OnceLock;

use bridge_support::{Net, global_addrs, has_link, link_details, ping, vlan_filtering_supported};
use cni_blackbox::{Netns, Outcome, require_root};
use serde_json::{Value, json};

const V4: &str = "10.77.0.0/24";

/// Set by the VM tier: a kernel without bridge VLAN filtering is then a failure.
const REQUIRE_VAR: &str = "CNI_RS_REQUIRE_VLAN";

/// Whether the test may go on: root (see [`require_root`]) and a kernel with bridge VLAN
/// filtering. Without the latter the test fails under [`REQUIRE_VAR`]`=1` and skips with a
/// message otherwise.
fn vlan_kernel() -> bool {
    if !require_root() {
        return false;
    }
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    if *SUPPORTED.get_or_init(vlan_filtering_supported) {
        return true;
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_owned();
    assert!(
        std::env::var(REQUIRE_VAR).as_deref() != Ok("1"),
        "{test}: {REQUIRE_VAR}=1 but this kernel cannot make a VLAN-filtering bridge"
    );
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: this kernel lacks bridge VLAN filtering; \
         tests/vm/run-vlan-tier.sh runs these tests on a stock kernel"
    );
    false
}

/// One VLAN membership of a port: (vid, PVID, egress untagged).
type Membership = (u64, bool, bool);

/// `bridge -j vlan show` in `ns`: every port (and the bridge itself) with its VLANs,
/// ranges expanded, sorted by vid.
fn vlan_table(ns: &Netns) -> Vec<(String, Vec<Membership>)> {
    let text = ns.exec_ok(&["bridge", "-j", "vlan", "show"]);
    if text.trim().is_empty() {
        return Vec::new();
    }
    let parsed: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("bridge -j vlan show: no JSON ({e}): {text}"));
    parsed
        .as_array()
        .into_iter()
        .flatten()
        .map(|port| {
            let name = port["ifname"].as_str().unwrap_or_default().to_owned();
            let mut vlans: Vec<Membership> = port["vlans"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|v| {
                    let flag =
                        |f: &str| v["flags"].as_array().is_some_and(|a| a.contains(&json!(f)));
                    let (pvid, untagged) = (flag("PVID"), flag("Egress Untagged"));
                    let start = v["vlan"].as_u64().unwrap_or(0);
                    let end = v["vlanEnd"].as_u64().unwrap_or(start);
                    (start..=end).map(move |id| (id, pvid, untagged))
                })
                .collect();
            vlans.sort_unstable();
            (name, vlans)
        })
        .collect()
}

/// The VLANs of one port; panics if the port is not in the table.
fn port_vlans(ns: &Netns, port: &str) -> Vec<Membership> {
    let table = vlan_table(ns);
    table
        .iter()
        .find(|(name, _)| name == port)
        .map(|(_, vlans)| vlans.clone())
        .unwrap_or_else(|| panic!("{port} not in `bridge vlan show`: {table:?}"))
}

/// Names of everything `bridge vlan show` lists.
fn vlan_ports(ns: &Netns) -> Vec<String> {
    vlan_table(ns).into_iter().map(|(name, _)| name).collect()
}

fn host_veth_of(out: &Outcome) -> String {
    out.json()["interfaces"][1]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("no host veth in result:\n{out}"))
        .to_owned()
}

/// The first address of the result, without its prefix length.
fn ip_of(out: &Outcome) -> String {
    let cidr = out.json()["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in result:\n{out}"))
        .to_owned();
    cidr.split('/').next().unwrap_or_default().to_owned()
}

/// `ping` that is expected to get no answer: two echoes, one second each. A single
/// bounded try, unlike [`ping`]: there is nothing to wait for.
fn unreachable(from: &Netns, dst: &str) -> bool {
    !from
        .exec(&["ping", "-c", "2", "-W", "1", dst])
        .status
        .success()
}

/// [`unreachable`] with the echoes sent out of `dev` (`ping -I`).
fn unreachable_via(from: &Netns, dev: &str, dst: &str) -> bool {
    !from
        .exec(&["ping", "-I", dev, "-c", "2", "-W", "1", dst])
        .status
        .success()
}

fn bridge_vlan_filtering(net: &Net) -> Value {
    net.bridge_link().expect("bridge exists")["linkinfo"]["info_data"]["vlan_filtering"].clone()
}

/// Every combination of the three keys, one pod each on one bridge (as pods with
/// different VLAN settings share a node's bridge): the VLANs of each pod's port after ADD,
/// and after DEL every port gone from `bridge vlan show` with nothing else left.
#[test]
fn vlan_keys_set_exactly_the_port_vlans_and_del_leaves_nothing() {
    if !vlan_kernel() {
        return;
    }
    let trunk = json!([{"id": 101}, {"minID": 200, "maxID": 202}]);
    let tagged = [
        (101, false, false),
        (200, false, false),
        (201, false, false),
        (202, false, false),
    ];
    let with = |head: &[Membership], tail: &[Membership]| -> Vec<Membership> {
        head.iter().chain(tail).copied().collect()
    };
    let cases: Vec<(Value, Vec<Membership>)> = vec![
        // Access port: VLAN 100 is PVID and untagged; the default VLAN 1 is removed.
        (json!({"vlan": 100}), vec![(100, true, true)]),
        // preserveDefaultVlan keeps VLAN 1 (untagged, no longer PVID).
        (
            json!({"vlan": 100, "preserveDefaultVlan": true}),
            vec![(1, false, true), (100, true, true)],
        ),
        // Trunk without `vlan`: tagged ids and ranges, native VLAN 1 (PVID, untagged).
        (
            json!({"vlanTrunk": trunk}),
            with(&[(1, true, true)], &tagged),
        ),
        // Trunk with `vlan`: that VLAN is native, VLAN 1 is gone.
        (
            json!({"vlan": 100, "vlanTrunk": trunk}),
            with(&[(100, true, true)], &tagged),
        ),
        (
            json!({"vlan": 100, "vlanTrunk": trunk, "preserveDefaultVlan": true}),
            with(&[(1, false, true), (100, true, true)], &tagged),
        ),
        // An empty trunk turns filtering on and leaves the kernel's default membership.
        (json!({"vlanTrunk": []}), vec![(1, true, true)]),
    ];
    let net = Net::new();
    let attachments: Vec<(Netns, Value, String)> = cases
        .iter()
        .enumerate()
        .map(|(i, (extra, _))| {
            let pod = net.pod();
            let conf = net.conf("1.0.0", &[V4], extra);
            let out = net.run("ADD", &conf, &format!("ctr-{i}"), &pod, "eth0");
            out.assert_success();
            let veth = host_veth_of(&out);
            (pod, conf, veth)
        })
        .collect();
    assert_eq!(bridge_vlan_filtering(&net), json!(1));

    // One read of the whole table; every mismatch is reported, not just the first.
    let table = vlan_table(&net.host);
    let wrong: Vec<String> = cases
        .iter()
        .zip(&attachments)
        .filter_map(|((extra, expected), (_, _, veth))| {
            let seen = table.iter().find(|(name, _)| name == veth).map(|(_, v)| v);
            (seen != Some(expected))
                .then(|| format!("{extra}: port VLANs {seen:?}, expected {expected:?}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{}\nwhole table: {table:?}",
        wrong.join("\n")
    );

    for (i, (pod, conf, _)) in attachments.iter().enumerate() {
        net.run("DEL", conf, &format!("ctr-{i}"), pod, "eth0")
            .assert_success_silent();
        assert!(!has_link(pod, "eth0"), "{conf}: pod interface left");
    }
    assert_eq!(
        vlan_ports(&net.host),
        vec![net.bridge.clone()],
        "ports left in `bridge vlan show`"
    );
    net.assert_nothing_left("after DEL of every pod");
}

/// Two pods on VLAN 100 reach each other, two on VLAN 200 likewise, and nothing crosses
/// between the two VLANs although all four share one bridge and one subnet. A trunk pod
/// with VLAN 100 tagged reaches VLAN 100 through a VLAN interface of its own, and not
/// VLAN 200, which its trunk does not carry.
#[test]
fn traffic_stays_inside_its_vlan() {
    if !vlan_kernel() {
        return;
    }
    let net = Net::new();
    let access = |vlan: u64| net.conf("1.0.0", &[V4], &json!({"vlan": vlan}));
    let pods: Vec<(Netns, Value)> = [100, 100, 200, 200]
        .into_iter()
        .map(|vlan| (net.pod(), access(vlan)))
        .collect();
    let mut ips = Vec::new();
    for (i, (pod, conf)) in pods.iter().enumerate() {
        let out = net.run("ADD", conf, &format!("ctr-{i}"), pod, "eth0");
        out.assert_success();
        ips.push(ip_of(&out));
    }
    let (a, c) = (&pods[0].0, &pods[2].0);

    ping(a, &ips[1]).unwrap_or_else(|e| panic!("VLAN 100: a cannot reach b: {e}"));
    ping(c, &ips[3]).unwrap_or_else(|e| panic!("VLAN 200: c cannot reach d: {e}"));
    assert!(unreachable(c, &ips[0]), "VLAN 200 pod reached VLAN 100 pod");
    assert!(unreachable(a, &ips[2]), "VLAN 100 pod reached VLAN 200 pod");

    // A layer-2 trunk port (no IPAM): VLAN 100 arrives tagged, so a VLAN interface in the
    // pod on top of eth0 is on the same segment as pods a and b; untagged frames from
    // eth0 itself go to the native VLAN 1, where nobody else is.
    let trunk_pod = net.pod();
    let trunk_conf = net.conf("1.0.0", &[], &json!({"vlanTrunk": [{"id": 100}]}));
    let out = net.run("ADD", &trunk_conf, "ctr-trunk", &trunk_pod, "eth0");
    out.assert_success();
    assert_eq!(
        port_vlans(&net.host, &host_veth_of(&out)),
        vec![(1, true, true), (100, false, false)]
    );
    trunk_pod.exec_ok(&[
        "ip", "link", "add", "link", "eth0", "name", "eth0.100", "type", "vlan", "id", "100",
    ]);
    trunk_pod.exec_ok(&["ip", "addr", "add", "10.77.0.250/24", "dev", "eth0.100"]);
    trunk_pod.exec_ok(&["ip", "link", "set", "eth0.100", "up"]);
    ping(&trunk_pod, &ips[0]).unwrap_or_else(|e| panic!("trunk cannot reach VLAN 100: {e}"));
    // VLAN 200 is not on the trunk: frames tagged 200 are dropped at the port.
    trunk_pod.exec_ok(&[
        "ip", "link", "add", "link", "eth0", "name", "eth0.200", "type", "vlan", "id", "200",
    ]);
    trunk_pod.exec_ok(&["ip", "addr", "add", "10.77.0.251/24", "dev", "eth0.200"]);
    trunk_pod.exec_ok(&["ip", "link", "set", "eth0.200", "up"]);
    assert!(
        unreachable_via(&trunk_pod, "eth0.200", &ips[2]),
        "trunk pod reached VLAN 200, which its trunk does not carry"
    );

    net.run("DEL", &trunk_conf, "ctr-trunk", &trunk_pod, "eth0")
        .assert_success_silent();
    for (i, (pod, conf)) in pods.iter().enumerate() {
        net.run("DEL", conf, &format!("ctr-{i}"), pod, "eth0")
            .assert_success_silent();
    }
    assert_eq!(vlan_ports(&net.host), vec![net.bridge.clone()]);
    net.assert_nothing_left("after DEL of every pod");
}

/// `vlan` with `isGateway`: the gateway address goes on `<bridge>.<vlan>`, one end of a
/// veth pair whose other end is a bridge port in that VLAN, and the pod reaches it. DEL
/// leaves that shared interface (as the reference does) and nothing of the pod.
#[test]
fn vlan_gateway_interface_carries_the_gateway() {
    if !vlan_kernel() {
        return;
    }
    let mut net = Net::new();
    // `<bridge>.100` must fit in 15 bytes; the name is private to this host netns.
    net.bridge = "cbrvlan".to_owned();
    let gw_if = "cbrvlan.100";
    let pod = net.pod();
    let conf = net.conf("1.0.0", &[V4], &json!({"vlan": 100, "isGateway": true}));
    let out = net.run("ADD", &conf, "ctr-gw", &pod, "eth0");
    out.assert_success();
    let result = out.json();
    assert_eq!(result["interfaces"][3]["name"], gw_if, "{out}");
    assert_eq!(result["ips"][0]["gateway"], "10.77.0.1", "{out}");
    assert_eq!(global_addrs(&net.host, "-4", gw_if), vec!["10.77.0.1/24"]);
    assert_eq!(
        global_addrs(&net.host, "-4", &net.bridge),
        Vec::<String>::new()
    );

    // The gateway interface's peer is the bridge port that puts it in VLAN 100 (`ip`
    // names a peer in the same namespace under `link`).
    let gw_link = link_details(&net.host, gw_if).expect("gateway interface");
    let gw_port = gw_link["link"]
        .as_str()
        .unwrap_or_else(|| panic!("{gw_if} has no peer in the host netns: {gw_link}"))
        .to_owned();
    let pod_veth = host_veth_of(&out);
    assert_eq!(port_vlans(&net.host, &gw_port), vec![(100, true, true)]);
    assert_eq!(port_vlans(&net.host, &pod_veth), vec![(100, true, true)]);

    ping(&pod, "10.77.0.1").unwrap_or_else(|e| panic!("pod cannot reach its gateway: {e}"));

    net.run("DEL", &conf, "ctr-gw", &pod, "eth0")
        .assert_success_silent();
    let mut left = vlan_ports(&net.host);
    left.sort();
    let mut expected = vec![net.bridge.clone(), gw_port];
    expected.sort();
    assert_eq!(left, expected, "only the bridge and the gateway port stay");
    assert!(
        has_link(&net.host, gw_if),
        "the shared gateway interface stays"
    );
    assert_eq!(net.reservations().len(), 0, "reservation left");
}
