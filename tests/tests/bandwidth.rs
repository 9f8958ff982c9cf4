//! The bandwidth plugin chained after our bridge, side by side with the reference
//! (`/usr/lib/cni/bandwidth`), in a throwaway "node" netns per test.
//!
//! The same config must give the same traffic control state (qdisc kinds and
//! parameters, the ifb device's name, MTU and queue length, the redirect) and the same
//! result; an attachment made by one is removed by the other's DEL; CHECK must notice
//! every piece removed by hand; bad input is refused naming the key and leaves
//! nothing; DEL needs neither netns nor prevResult and may be repeated; GC removes the
//! ifb devices of attachments that are gone.

use std::path::Path;

use cni_blackbox::{Netns, Outcome, Plugin, TempDir, require_root, unique_ifname, unique_name};
use serde_json::{Value, json};

const REFERENCE: &str = "/usr/lib/cni/bandwidth";
const NETWORK: &str = "bwnet";

/// The node and the data dir of host-local.
struct Node {
    host: Netns,
    dir: TempDir,
    bridge: String,
}

/// A pod attached by our bridge.
struct Pod {
    netns: Netns,
    id: String,
    /// The bridge's result: bandwidth's prevResult.
    result: Value,
    /// The host end of its veth.
    veth: String,
}

impl Node {
    fn new() -> Self {
        Self {
            host: Netns::new("cnibb-bw-node"),
            dir: TempDir::new("cnibb-bw"),
            bridge: unique_ifname("cnibw"),
        }
    }

    fn bridge_conf(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": NETWORK,
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": true,
            "ipam": {
                "type": "host-local",
                "dataDir": self.dir.path_str(),
                "ranges": [[{"subnet": "10.98.0.0/24"}]],
            }
        })
    }

    fn pod(&self, version: &str) -> Pod {
        let netns = Netns::new("cnibb-bw-pod");
        let id = unique_name("bw");
        let out = Plugin::new("bridge", &self.host)
            .command("ADD")
            .attachment(&id, &netns, "eth0")
            .config(&self.bridge_conf(version))
            .run();
        out.assert_success();
        let result = out.json();
        let veth = result["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|i| i.get("sandbox").is_none() && i["name"] != self.bridge.as_str())
            .and_then(|i| i["name"].as_str())
            // A result before 0.3.0 names no interfaces.
            .unwrap_or_default()
            .to_owned();
        Pod {
            netns,
            id,
            result,
            veth,
        }
    }

    fn tc(&self, args: &[&str]) -> Value {
        let mut argv = vec!["tc", "-j"];
        argv.extend_from_slice(args);
        let text = self.host.exec_ok(&argv);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("tc {args:?}: {e}: {text}"))
    }

    /// The names of the node's ifb devices.
    fn ifbs(&self) -> Vec<String> {
        let links: Value = serde_json::from_str(&self.host.exec_ok(&["ip", "-j", "-d", "link"]))
            .expect("ip -j link");
        links
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["linkinfo"]["info_kind"] == "ifb")
            .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
            .collect()
    }

    /// Everything the plugin sets up for `pod`, as `tc` and `ip` show it, without
    /// counters, instance numbers, and with the device names replaced by placeholders.
    fn shaping(&self, pod: &Pod) -> String {
        let ifb = ifb_name(&pod.id);
        let mut state = json!({
            "veth qdiscs": self.tc(&["qdisc", "show", "dev", &pod.veth]),
            "veth ingress filters": self.tc(&["filter", "show", "dev", &pod.veth, "ingress"]),
            "ifbs": self.ifbs(),
        });
        if self.ifbs().contains(&ifb) {
            let link: Value =
                serde_json::from_str(&self.host.exec_ok(&["ip", "-j", "-d", "link", "show", &ifb]))
                    .expect("ip -j link show");
            state["ifb"] = json!({
                "mtu": link[0]["mtu"],
                "txqlen": link[0]["txqlen"],
                "up": link[0]["flags"].as_array().is_some_and(|f| f.contains(&json!("UP"))),
                "qdiscs": self.tc(&["qdisc", "show", "dev", &ifb]),
            });
        }
        let mut text = normalize(state).to_string();
        text = text.replace(&ifb, "IFB").replace(&pod.veth, "VETH");
        text
    }

    /// Removes what the plugins leave on the veth (its qdiscs go with it on the
    /// bridge's DEL), so that the next ADD on the same pod starts afresh.
    fn clear_veth(&self, pod: &Pod) {
        for parent in ["root", "ingress"] {
            let _ = self
                .host
                .exec(&["tc", "qdisc", "del", "dev", &pod.veth, parent]);
        }
    }
}

/// Drops what differs between two identical setups: counters, references and
/// action instance numbers.
fn normalize(mut v: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for key in ["refcnt", "index", "ref", "bind", "dev"] {
                    map.remove(key);
                }
                map.values_mut().for_each(walk);
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

/// `bwp` and the first 12 hex digits of SHA-512(network + container ID).
fn ifb_name(id: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha512::digest(format!("{NETWORK}{id}").as_bytes());
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("bwp{hex}")
}

fn bandwidth_conf(version: &str, limits: &Value, prev: Option<&Value>) -> Value {
    let mut conf = json!({"cniVersion": version, "name": NETWORK, "type": "bandwidth"});
    for (k, v) in limits.as_object().into_iter().flatten() {
        conf[k] = v.clone();
    }
    if let Some(prev) = prev {
        conf["prevResult"] = prev.clone();
    }
    conf
}

/// Runs ours (`None`) or the binary at `binary` on `pod`.
fn run(binary: Option<&Path>, node: &Node, command: &str, pod: &Pod, conf: &Value) -> Outcome {
    let plugin = match binary {
        Some(path) => Plugin::at(path, &node.host).cni_path("/usr/lib/cni"),
        None => Plugin::new("bandwidth", &node.host),
    };
    plugin
        .command(command)
        .attachment(&pod.id, &pod.netns, "eth0")
        .config(conf)
        .run()
}

fn reference() -> Option<&'static Path> {
    let path = Path::new(REFERENCE);
    if path.exists() {
        Some(path)
    } else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{REFERENCE} is missing (containernetworking-plugins)"
        );
        eprintln!("skipping: {REFERENCE} is missing");
        None
    }
}

/// The result without the ifb's MAC address, which the kernel picks at random.
fn without_ifb_mac(mut result: Value) -> Value {
    for iface in result["interfaces"].as_array_mut().into_iter().flatten() {
        if iface["name"].as_str().is_some_and(|n| n.starts_with("bwp")) {
            let mac = iface["mac"].as_str().unwrap_or_default();
            assert_eq!(mac.len(), 17, "the ifb's MAC is reported: {iface}");
            iface["mac"] = json!("MAC");
        }
    }
    result
}

/// CHECK exists from spec 0.4.0 on.
fn has_check(version: &str) -> bool {
    !version.starts_with("0.1") && !version.starts_with("0.2") && !version.starts_with("0.3")
}

const BOTH: &str = r#"{"ingressRate": 8000000, "ingressBurst": 80000, "egressRate": 16000000, "egressBurst": 160000}"#;

#[test]
fn the_same_configs_give_the_same_state_and_result_as_the_reference() {
    if !require_root() {
        return;
    }
    let Some(reference) = reference() else { return };
    let node = Node::new();
    let containerd_burst = u64::from(u32::MAX);
    // (version, limits, whether an egress limit applies)
    let cases: Vec<(&str, Value, bool)> = vec![
        ("1.0.0", serde_json::from_str(BOTH).unwrap(), true),
        (
            "0.3.1",
            json!({"ingressRate": 1_000_000, "ingressBurst": 1_000_000}),
            false,
        ),
        (
            "0.4.0",
            json!({"egressRate": 100_000_000, "egressBurst": 12_000}),
            true,
        ),
        // What containerd sends for the pod annotations "10M".
        (
            "1.0.0",
            json!({"runtimeConfig": {"bandwidth": {"egressRate": 10_000_000, "egressBurst": containerd_burst, "ingressRate": 10_000_000, "ingressBurst": containerd_burst}}}),
            true,
        ),
        // Above 4 GB/s: the rate travels in 64 bits.
        (
            "1.0.0",
            json!({"ingressRate": 40_000_000_000u64, "ingressBurst": 8_000_000}),
            false,
        ),
        // The config's keys win over the runtime's.
        (
            "1.0.0",
            json!({"ingressRate": 2_000_000, "ingressBurst": 50_000, "runtimeConfig": {"bandwidth": {"egressRate": 1_000_000, "egressBurst": 10_000}}}),
            false,
        ),
        // Nothing to limit: the result passes through.
        ("1.0.0", json!({"runtimeConfig": {"bandwidth": {}}}), false),
    ];
    for (version, limits, egress) in cases {
        let pod = node.pod(version);
        let conf = bandwidth_conf(version, &limits, Some(&pod.result));
        let mut seen = Vec::new();
        for binary in [Some(reference), None] {
            let who = if binary.is_some() {
                "reference"
            } else {
                "ours"
            };
            let out = run(binary, &node, "ADD", &pod, &conf);
            out.assert_success();
            let state = node.shaping(&pod);
            let result = without_ifb_mac(out.json());
            // Each CHECK accepts the state either plugin made.
            if has_check(version) {
                run(None, &node, "CHECK", &pod, &conf).assert_success_silent();
                run(Some(reference), &node, "CHECK", &pod, &conf).assert_success_silent();
            }
            run(binary, &node, "DEL", &pod, &conf).assert_success_silent();
            assert!(node.ifbs().is_empty(), "{who} DEL left {:?}", node.ifbs());
            node.clear_veth(&pod);
            seen.push((state, result));
        }
        assert_eq!(seen[0].0, seen[1].0, "tc state for {limits} ({version})");
        assert_eq!(seen[0].1, seen[1].1, "result for {limits} ({version})");
        assert_eq!(
            seen[1].0.contains("IFB"),
            egress,
            "ifb named as the reference names it: {}",
            seen[1].0
        );
        if !egress {
            assert_eq!(seen[1].1, pod.result, "result passed through");
        }
    }
}

#[test]
fn an_attachment_made_by_one_is_removed_by_the_other() {
    if !require_root() {
        return;
    }
    let Some(reference) = reference() else { return };
    let node = Node::new();
    let limits: Value = serde_json::from_str(BOTH).unwrap();
    for (adder, deleter) in [(Some(reference), None), (None, Some(reference))] {
        let pod = node.pod("1.0.0");
        let conf = bandwidth_conf("1.0.0", &limits, Some(&pod.result));
        run(adder, &node, "ADD", &pod, &conf).assert_success();
        assert_eq!(node.ifbs(), [ifb_name(&pod.id)]);
        // Each one's CHECK accepts the other's state.
        run(deleter, &node, "CHECK", &pod, &conf).assert_success_silent();
        run(deleter, &node, "DEL", &pod, &conf).assert_success_silent();
        assert!(node.ifbs().is_empty(), "left {:?}", node.ifbs());
        Plugin::new("bridge", &node.host)
            .command("DEL")
            .attachment(&pod.id, &pod.netns, "eth0")
            .config(&node.bridge_conf("1.0.0"))
            .run()
            .assert_success();
        let links = node.host.exec_ok(&["ip", "-br", "link"]);
        assert!(!links.contains(&pod.veth), "veth left: {links}");
    }
}

#[test]
fn check_notices_every_piece_removed_by_hand() {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let pod = node.pod("1.0.0");
    let limits: Value = serde_json::from_str(BOTH).unwrap();
    let conf = bandwidth_conf("1.0.0", &limits, Some(&pod.result));
    let ifb = ifb_name(&pod.id);
    let sabotage: [(&[&str], &str); 5] = [
        (
            &["tc", "qdisc", "del", "dev", &pod.veth, "root"],
            "Failed to find qdisc",
        ),
        (
            &["tc", "qdisc", "del", "dev", &pod.veth, "ingress"],
            "no ingress qdisc on",
        ),
        (
            &["tc", "qdisc", "del", "dev", &ifb, "root"],
            "Failed to find qdisc",
        ),
        (&["ip", "link", "del", &ifb], "get ifb device"),
        (
            &["tc", "filter", "del", "dev", &pod.veth, "ingress"],
            "no filter on",
        ),
    ];
    for (argv, want) in sabotage {
        run(None, &node, "ADD", &pod, &conf).assert_success();
        run(None, &node, "CHECK", &pod, &conf).assert_success_silent();
        node.host.exec_ok(argv);
        let out = run(None, &node, "CHECK", &pod, &conf);
        out.assert_failure();
        let msg = out.error_msg().unwrap_or_default();
        assert!(msg.contains(want), "after {argv:?}: {msg:?} lacks {want:?}");
        run(None, &node, "DEL", &pod, &conf).assert_success_silent();
        node.clear_veth(&pod);
    }
    // Another rate than the one installed.
    run(None, &node, "ADD", &pod, &conf).assert_success();
    let mut other = conf.clone();
    other["ingressRate"] = json!(4_000_000);
    let msg = run(None, &node, "CHECK", &pod, &other)
        .error_msg()
        .unwrap_or_default();
    assert!(msg.starts_with("Rate doesn't match"), "{msg}");
    // Without limits there is nothing to check.
    let none = bandwidth_conf("1.0.0", &json!({}), Some(&pod.result));
    run(None, &node, "CHECK", &pod, &none).assert_success_silent();
    // prevResult is required.
    let bare = bandwidth_conf("1.0.0", &limits, None);
    let out = run(None, &node, "CHECK", &pod, &bare);
    assert!(
        out.error_msg().unwrap_or_default().contains("prevResult"),
        "{out}"
    );
    run(None, &node, "DEL", &pod, &conf).assert_success_silent();
}

#[test]
fn bad_input_is_refused_naming_the_key_and_leaves_nothing() {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let pod = node.pod("1.0.0");
    let clean = node.shaping(&pod);
    let cases = [
        (
            json!({"ingressRate": 1000}),
            "ingressRate is 1000, ingressBurst is not set",
        ),
        (
            json!({"egressBurst": 1000}),
            "egressBurst is 1000, egressRate is not set",
        ),
        (
            json!({"runtimeConfig": {"bandwidth": {"egressRate": 1000, "egressBurst": 34_359_738_360u64}}}),
            "burst cannot be more than 4GB (runtimeConfig.bandwidth.egressBurst",
        ),
        (
            json!({"egressRate": 7, "egressBurst": 80}),
            "egressRate is 7",
        ),
        (
            json!({"ingressRate": 7, "ingressBurst": 80}),
            "ingressRate is 7",
        ),
        (
            json!({"egressRate": -5, "egressBurst": 80}),
            "egressRate must be a whole number",
        ),
    ];
    for (limits, want) in cases {
        let conf = bandwidth_conf("1.0.0", &limits, Some(&pod.result));
        let out = run(None, &node, "ADD", &pod, &conf);
        assert_eq!(out.error_code(), Some(7), "{limits}: {out}");
        let msg = out.error_msg().unwrap_or_default();
        assert!(msg.contains(want), "{limits}: {msg:?} lacks {want:?}");
        assert_eq!(node.shaping(&pod), clean, "{limits} left something");
    }
    let limits: Value = serde_json::from_str(BOTH).unwrap();
    let out = run(
        None,
        &node,
        "ADD",
        &pod,
        &bandwidth_conf("1.0.0", &limits, None),
    );
    out.assert_failure();
    let msg = out.error_msg().unwrap_or_default();
    assert!(
        msg.contains("must be called as chained plugin") && msg.contains("prevResult"),
        "{msg}"
    );
    assert_eq!(node.shaping(&pod), clean);

    // A step that fails half way: the ingress qdisc is already there, so the redirect
    // cannot be set up after the ifb was made. Ours removes the ifb and the veth's
    // token bucket again (the reference leaves both).
    node.host.exec_ok(&[
        "tc", "qdisc", "add", "dev", &pod.veth, "handle", "ffff:", "ingress",
    ]);
    let with_ingress = node.shaping(&pod);
    let conf = bandwidth_conf("1.0.0", &limits, Some(&pod.result));
    run(None, &node, "ADD", &pod, &conf).assert_failure();
    assert_eq!(
        node.shaping(&pod),
        with_ingress,
        "a failed ADD left something"
    );
}

#[test]
fn del_needs_no_netns_nor_prev_result_and_may_repeat() {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let pod = node.pod("1.0.0");
    let limits: Value = serde_json::from_str(BOTH).unwrap();
    run(
        None,
        &node,
        "ADD",
        &pod,
        &bandwidth_conf("1.0.0", &limits, Some(&pod.result)),
    )
    .assert_success();
    assert_eq!(node.ifbs(), [ifb_name(&pod.id)]);
    let bare = bandwidth_conf("1.0.0", &limits, None);
    for _ in 0..2 {
        Plugin::new("bandwidth", &node.host)
            .command("DEL")
            .container_id(&pod.id)
            .ifname("eth0")
            .netns("")
            .config(&bare)
            .run()
            .assert_success_silent();
        assert!(node.ifbs().is_empty(), "left {:?}", node.ifbs());
    }
}

#[test]
fn gc_removes_the_ifb_devices_of_attachments_that_are_gone() {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let limits: Value = serde_json::from_str(BOTH).unwrap();
    let kept = node.pod("1.0.0");
    let gone = node.pod("1.0.0");
    let wired = node.pod("1.0.0");
    for pod in [&kept, &gone, &wired] {
        run(
            None,
            &node,
            "ADD",
            pod,
            &bandwidth_conf("1.0.0", &limits, Some(&pod.result)),
        )
        .assert_success();
    }
    // A missed DEL: the pod's veth is gone (the main plugin's GC), its ifb is not.
    node.host.exec_ok(&["ip", "link", "del", &gone.veth]);
    let conf = json!({
        "cniVersion": "1.1.0",
        "name": NETWORK,
        "type": "bandwidth",
        "cni.dev/valid-attachments": [{"containerID": kept.id, "ifname": "eth0"}],
    });
    Plugin::new("bandwidth", &node.host)
        .command("GC")
        .config(&conf)
        .run()
        .assert_success_silent();
    let mut left = node.ifbs();
    left.sort();
    // An ifb that a veth still redirects to is in use (it may belong to another
    // network: its name does not say), so only the orphan goes.
    let mut want = vec![ifb_name(&kept.id), ifb_name(&wired.id)];
    want.sort();
    assert_eq!(left, want);
    // STATUS answers for a valid config and names the key of a bad one.
    let status = |conf: &Value| {
        Plugin::new("bandwidth", &node.host)
            .command("STATUS")
            .config(conf)
            .run()
    };
    status(&bandwidth_conf("1.1.0", &limits, None)).assert_success_silent();
    let bad = bandwidth_conf("1.1.0", &json!({"ingressRate": 1}), None);
    assert!(
        status(&bad)
            .error_msg()
            .unwrap_or_default()
            .contains("ingressRate")
    );
    for pod in [&kept, &wired] {
        run(
            None,
            &node,
            "DEL",
            pod,
            &bandwidth_conf("1.0.0", &limits, None),
        )
        .assert_success_silent();
    }
    assert!(node.ifbs().is_empty());
}

#[test]
fn every_spec_version_is_spoken() {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let limits: Value = serde_json::from_str(BOTH).unwrap();
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let pod = node.pod(version);
        let conf = bandwidth_conf(version, &limits, Some(&pod.result));
        let out = run(None, &node, "ADD", &pod, &conf);
        out.assert_success();
        let result = out.json();
        assert_eq!(result["cniVersion"], version);
        let names: Vec<&str> = result["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["name"].as_str())
            .collect();
        assert_eq!(
            names.last().copied(),
            Some(ifb_name(&pod.id).as_str()),
            "{version}"
        );
        if has_check(version) {
            run(None, &node, "CHECK", &pod, &conf).assert_success_silent();
        }
        run(None, &node, "DEL", &pod, &conf).assert_success_silent();
    }
    // Before 0.3.0 a result names no interfaces: nothing limited passes through,
    // a limit cannot find the veth.
    for version in ["0.1.0", "0.2.0"] {
        let pod = node.pod(version);
        let none = bandwidth_conf(version, &json!({}), Some(&pod.result));
        let out = run(None, &node, "ADD", &pod, &none);
        out.assert_success();
        assert_eq!(out.json(), pod.result, "{version}");
        let conf = bandwidth_conf(version, &limits, Some(&pod.result));
        let out = run(None, &node, "ADD", &pod, &conf);
        assert_eq!(
            out.error_msg().as_deref(),
            Some("no interfaces provided"),
            "{version}"
        );
        assert!(node.ifbs().is_empty());
    }
}

/// TCP payload per full-size segment, and what the token bucket counts for it
/// (Ethernet 14, IPv4 20, TCP with timestamps 32 bytes of headers).
const SEGMENT_PAYLOAD: f64 = 1448.0;
const SEGMENT_ON_WIRE: f64 = 1514.0;

/// Sends TCP as fast as it can from the netns `from` to `to` (a listener in `to_ns`)
/// for 4.5 s and returns the rate the receiver saw in the 3 s after the first second
/// (past the bucket's burst and slow start), counted as the token bucket counts it
/// (with headers), in bit/s.
fn tcp_rate(from: &Path, to_ns: &Path, to: std::net::SocketAddr) -> f64 {
    use std::time::Duration;
    tcp_rate_in(
        from,
        to_ns,
        to,
        Duration::from_millis(4500),
        (Duration::from_secs(1), Duration::from_secs(4)),
    )
}

/// The same, but over the first second of the transfer: what a bucket's burst lets
/// through before its rate holds.
fn tcp_first_second_rate(from: &Path, to_ns: &Path, to: std::net::SocketAddr) -> f64 {
    use std::time::Duration;
    tcp_rate_in(
        from,
        to_ns,
        to,
        Duration::from_millis(1500),
        (Duration::ZERO, Duration::from_secs(1)),
    )
}

/// Sends TCP for `send_for` and returns the rate the receiver saw in `window` (from
/// its first byte), with headers, in bit/s.
fn tcp_rate_in(
    from: &Path,
    to_ns: &Path,
    to: std::net::SocketAddr,
    send_for: std::time::Duration,
    window: (std::time::Duration, std::time::Duration),
) -> f64 {
    use std::io::{Read as _, Write as _};
    use std::time::{Duration, Instant};

    use cni_blackbox::hostport::in_netns;

    let listener = in_netns(to_ns, move || {
        std::net::TcpListener::bind(to).unwrap_or_else(|e| panic!("bind {to}: {e}"))
    });
    let receiver = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 16];
        let mut first = None;
        let mut counted = 0u64;
        loop {
            let n = stream.read(&mut buf).unwrap_or(0);
            if n == 0 {
                break;
            }
            let now = Instant::now();
            let start = *first.get_or_insert(now);
            let at = now - start;
            if at >= window.0 && at < window.1 {
                counted += n as u64;
            }
        }
        counted as f64 * 8.0 / (window.1 - window.0).as_secs_f64()
    });
    let mut stream = in_netns(from, move || {
        std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect {to}: {e}"))
    });
    let chunk = vec![0x5au8; 1 << 16];
    let until = Instant::now() + send_for;
    while Instant::now() < until {
        if stream.write_all(&chunk).is_err() {
            break;
        }
    }
    drop(stream);
    let goodput = receiver.join().expect("receiver");
    goodput * SEGMENT_ON_WIRE / SEGMENT_PAYLOAD
}

#[test]
fn shaping_holds_the_configured_rates_both_ways() {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let gateway: std::net::SocketAddr = "10.98.0.1:5201".parse().unwrap();
    let mut unshaped = Vec::new();
    {
        let pod = node.pod("1.0.0");
        let pod_addr = pod_address(&pod, 5201);
        unshaped.push(tcp_rate(node.host.path(), pod.netns.path(), pod_addr));
        unshaped.push(tcp_rate(pod.netns.path(), node.host.path(), gateway));
    }
    for mbit in [8u64, 80] {
        let rate = mbit * 1_000_000;
        // A bucket of 10 ms at the rate (at least a few full-size frames).
        let burst = (rate / 100).max(8 * 1514 * 4);
        let pod = node.pod("1.0.0");
        let limits = json!({"ingressRate": rate, "ingressBurst": burst, "egressRate": rate, "egressBurst": burst});
        run(
            None,
            &node,
            "ADD",
            &pod,
            &bandwidth_conf("1.0.0", &limits, Some(&pod.result)),
        )
        .assert_success();
        let into = tcp_rate(node.host.path(), pod.netns.path(), pod_address(&pod, 5201));
        let out_of = tcp_rate(pod.netns.path(), node.host.path(), gateway);
        for (direction, measured) in [("into", into), ("out of", out_of)] {
            cni_blackbox::measured::record(
                &format!("bandwidth: TCP {direction} a pod limited to {mbit} Mbit/s"),
                measured / 1e6,
                "Mbit/s",
            );
            let ratio = measured / rate as f64;
            assert!(
                (0.9..=1.1).contains(&ratio),
                "TCP {direction} the pod at {mbit} Mbit/s: {:.2} Mbit/s",
                measured / 1e6
            );
            if mbit == 80 {
                let free = if direction == "into" {
                    unshaped[0]
                } else {
                    unshaped[1]
                };
                cni_blackbox::measured::record(
                    &format!("bandwidth: TCP {direction} an unlimited pod"),
                    free / 1e6,
                    "Mbit/s",
                );
                assert!(
                    free >= 5.0 * measured,
                    "unlimited TCP {direction} a pod: {:.0} Mbit/s, not 5x {:.0}",
                    free / 1e6,
                    measured / 1e6
                );
            }
        }
        run(
            None,
            &node,
            "DEL",
            &pod,
            &bandwidth_conf("1.0.0", &limits, None),
        )
        .assert_success();
    }
}

/// The pod's IPv4 address from the bridge's result, with `port`.
fn pod_address(pod: &Pod, port: u16) -> std::net::SocketAddr {
    let cidr = pod.result["ips"][0]["address"].as_str().unwrap_or_default();
    let ip = cidr.split('/').next().unwrap_or_default();
    format!("{ip}:{port}")
        .parse()
        .unwrap_or_else(|e| panic!("pod address {cidr:?}: {e}"))
}

/// containerd's runtime config for the pod annotations `10M` both ways: 2^32-1 bits of
/// burst with each rate.
fn containerd_10m() -> Value {
    let burst = u64::from(u32::MAX);
    json!({"runtimeConfig": {"bandwidth": {
        "ingressRate": 10_000_000, "ingressBurst": burst,
        "egressRate": 10_000_000, "egressBurst": burst,
    }}})
}

#[test]
fn the_runtimes_burst_passes_the_first_second_at_line_rate_unless_capped() {
    if !require_root() {
        return;
    }
    let node = Node::new();
    let gateway: std::net::SocketAddr = "10.98.0.1:5202".parse().unwrap();
    let rate = 10e6;
    // What the cni-node conflist chains: 20 ms of the pod's rate.
    for cap in [
        None,
        Some(json!({"maxBurstMs": 20})),
        Some(json!({"maxBurst": 200_000})),
    ] {
        let mut limits = containerd_10m();
        if let Some(cap) = &cap {
            for (k, v) in cap.as_object().into_iter().flatten() {
                limits[k] = v.clone();
            }
        }
        let pod = node.pod("1.0.0");
        run(
            None,
            &node,
            "ADD",
            &pod,
            &bandwidth_conf("1.0.0", &limits, Some(&pod.result)),
        )
        .assert_success();
        let into =
            tcp_first_second_rate(node.host.path(), pod.netns.path(), pod_address(&pod, 5202));
        let out_of = tcp_first_second_rate(pod.netns.path(), node.host.path(), gateway);
        let named = cap.as_ref().map_or("no cap".to_owned(), Value::to_string);
        for (direction, measured) in [("into", into), ("out of", out_of)] {
            cni_blackbox::measured::record(
                &format!(
                    "bandwidth: first second of TCP {direction} a 10 Mbit/s pod with containerd's burst, {named}"
                ),
                measured / 1e6,
                "Mbit/s",
            );
            if cap.is_some() {
                assert!(
                    measured <= 1.15 * rate && measured >= 0.5 * rate,
                    "first second {direction} the pod with {named}: {:.2} Mbit/s, not within +15% of 10",
                    measured / 1e6
                );
            } else {
                assert!(
                    measured >= 5.0 * rate,
                    "first second {direction} the pod without a cap: {:.2} Mbit/s, expected the burst far above 10",
                    measured / 1e6
                );
            }
        }
        run(
            None,
            &node,
            "DEL",
            &pod,
            &bandwidth_conf("1.0.0", &limits, None),
        )
        .assert_success();
    }
}
