//! Our plugins under containerd's CRI, driven the way kubelet drives it: the pod CIDR
//! through `UpdateRuntimeConfig` (containerd renders the conflist from its
//! `conf_template`), then `RunPodSandbox`, `PodSandboxStatus`, `StopPodSandbox` and
//! `RemovePodSandbox`.
//!
//! Each test runs its own containerd ([`Containerd`]: throwaway host netns, private mount
//! namespace, own root/state/socket, sandbox image built locally) and checks what a node
//! operator would: addresses from the node's CIDR, pods reaching each other and the
//! gateway over IPv4 and IPv6, nothing left (reservation, veth, masquerade rule, process,
//! cgroup) after removal, a failed ADD that leaves nothing, pods that survive a
//! containerd restart. One test replaces the template with the node agent (`cni-node`
//! against the Kubernetes API test server): containerd uses the conflist the agent
//! writes, and the agent routes another node's pod CIDRs and masquerades egress. Another
//! runs the agent with a NetworkPolicy and Pod objects that kubelet has not yet given
//! addresses: a new pod is closed to the clients the policy does not allow from its
//! first packet, open to the allowed one, held while the agent cannot judge it, and
//! leaves nothing behind; the same again with an Admin ClusterNetworkPolicy's deny over
//! a NetworkPolicy that admits every pod. Every test also checks that the machine's own netns, /run and
//! /var/lib were not touched.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Write as _};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cni_blackbox::hostport::{in_netns, netns_of, peer_seen};
use cni_blackbox::{plugin_path, require_root, unique_name};
use cni_containerd_suite::cri::{HostPort, Protocol};
use cni_containerd_suite::{Containerd, NETWORK, PodMeta, ping_from};
use cni_kube_api::{
    ApiServer, cluster_network_policy, network_policy, realistic_namespace, realistic_node,
    realistic_pod,
};
use serde_json::json;

/// The template a node operator would install: our bridge with host-local over every
/// range kubelet gives (one per family), default routes for each, masquerade on, our
/// portmap for host ports, and loopback chained after them (containerd then runs it
/// with `CNI_IFNAME=eth0`).
/// `@DATADIR@` and `@BRIDGE@` are filled in by the fixture.
const TEMPLATE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "cnibb-k8s",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "@BRIDGE@",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "@DATADIR@",
        "ranges": [{{range $i, $r := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$r}}"}]{{end}}],
        "routes": [{{range $i, $r := .Routes}}{{if $i}}, {{end}}{"dst": "{{$r}}"}{{end}}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
"#;

/// Bound on a ping succeeding (IPv6 neighbour discovery, bridge port forwarding state).
const PING_LIMIT: Duration = Duration::from_secs(15);
/// Bound on containerd noticing a new conflist, and on shims exiting.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// Root (without it the test skips, except under CI=true) and every tool the suite runs
/// (a missing one fails the test, as in the Podman suite).
#[track_caller]
fn require_containerd() -> bool {
    if !require_root() {
        return false;
    }
    let missing: Vec<&str> = [
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
        "podman",
        "nsenter",
        "unshare",
        "ping",
        "iptables-save",
        "ip6tables-save",
        "nft",
    ]
    .into_iter()
    .filter(|tool| !on_path(tool))
    .collect();
    assert!(
        missing.is_empty(),
        "missing {missing:?}: tests/run-all.sh installs them \
         (apt-get install containerd runc podman busybox-static util-linux iputils-ping iptables nftables)"
    );
    assert!(
        Path::new("/bin/busybox").is_file(),
        "/bin/busybox missing (apt-get install busybox-static)"
    );
    true
}

/// The machine's own state the suite must leave alone: the root netns's links, addresses,
/// routes and iptables rules, the machine's containerd and CNI state directories, and
/// the node agent's default pod record directory.
///
/// Other software (a developer's Podman, other test suites) may change the machine
/// while we run, so the check after a test looks for what *we* could have leaked: our
/// bridge or pod CIDRs in the root netns, containerd state or pod records outside our
/// fixture, our network in the machine's /var/lib/cni.
#[derive(Debug)]
struct MachineState {
    state_dirs: BTreeMap<&'static str, Option<BTreeSet<String>>>,
    /// containerd's default pod netns pins, `/run/netns/cni-<uuid>`.
    cni_netns: BTreeSet<String>,
}

/// containerd's hard-coded and default state directories on the machine, and the
/// default of the agent's `--pod-record-dir` (the agent runs in the machine's mount
/// namespace: it must be given the fixture's).
const STATE_DIRS: [&str; 4] = [
    "/run/containerd",
    "/var/lib/containerd",
    "/opt/containerd",
    "/run/cni-plugins-rs/pods",
];

fn listing(dir: &str) -> Option<BTreeSet<String>> {
    std::fs::read_dir(dir).ok().map(|entries| {
        entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    })
}

/// `ip <args>` in the machine's netns (read only).
fn root_netns(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stdout of `program` run in the machine's netns (read only).
fn command_output(program: &str) -> String {
    let out = Command::new(program)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl MachineState {
    fn now() -> Self {
        Self {
            state_dirs: STATE_DIRS.into_iter().map(|d| (d, listing(d))).collect(),
            cni_netns: listing("/run/netns")
                .unwrap_or_default()
                .into_iter()
                .filter(|n| n.starts_with("cni-"))
                .collect(),
        }
    }

    /// Panics if the machine holds anything of the node that used `bridge` and `cidrs`.
    #[track_caller]
    fn assert_untouched(&self, bridge: &str, cidrs: &[&str]) {
        let after = Self::now();
        assert_eq!(
            after.state_dirs, self.state_dirs,
            "containerd state or pod records on the machine changed"
        );
        let new_netns: Vec<&String> = after.cni_netns.difference(&self.cni_netns).collect();
        assert!(
            new_netns.is_empty(),
            "pod netns pinned on the machine: {new_netns:?}"
        );
        let links = root_netns(&["-o", "link", "show"]);
        assert!(
            !links.contains(&format!(": {bridge}:")),
            "our bridge {bridge} is in the machine's netns:\n{links}"
        );
        let state = [
            root_netns(&["-o", "addr", "show"]),
            root_netns(&["route", "show", "table", "all"]),
            root_netns(&["-6", "route", "show", "table", "all"]),
            command_output("iptables-save"),
            command_output("ip6tables-save"),
        ]
        .concat();
        for cidr in cidrs {
            // The network part without trailing zeros: "10.244.1." or "fd00:10:244:1:".
            let network = cidr.split('/').next().unwrap_or_default();
            let prefix = if network.contains(':') {
                format!("{}:", network.trim_end_matches(':'))
            } else {
                format!("{}.", network.trim_end_matches(".0"))
            };
            assert!(
                !state.contains(&prefix),
                "the machine's netns mentions {cidr}:\n{state}"
            );
        }
        for sub in ["networks", "results"] {
            let leaked: Vec<String> = listing(&format!("/var/lib/cni/{sub}"))
                .unwrap_or_default()
                .into_iter()
                .filter(|name| name.contains(NETWORK))
                .collect();
            assert!(
                leaked.is_empty(),
                "our network in /var/lib/cni/{sub}: {leaked:?}"
            );
        }
    }
}

/// Firewall state of the host netns, all families and backends, as text.
fn firewall(node: &Containerd) -> String {
    let mut text = String::new();
    for argv in [
        &["iptables-save"][..],
        &["ip6tables-save"][..],
        &["nft", "list", "ruleset"][..],
    ] {
        let out = node.host().exec(argv);
        text.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    text
}

/// Lines of the host netns's firewall mentioning `needle`.
fn firewall_lines(node: &Containerd, needle: &str) -> Vec<String> {
    firewall(node)
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// Waits (bounded) for containerd to report NetworkReady after a conflist appeared.
#[track_caller]
fn wait_network_ready(node: &Containerd) {
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        let status = node.cri().status().expect("Status");
        if status.network_ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "NetworkReady still false: {}\n{}",
            status.network_message,
            node.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A running pod as the tests see it.
#[derive(Debug, Clone)]
struct Pod {
    name: String,
    id: String,
    v4: IpAddr,
    v6: IpAddr,
    pid: u32,
}

/// `RunPodSandbox`, then `PodSandboxStatus`: a ready sandbox with one IPv4 and one IPv6
/// address (primary first, as kubelet reads them).
#[track_caller]
fn run_pod(node: &Containerd) -> Pod {
    run_pod_with_ports(node, &[])
}

/// [`run_pod`] with the pod's host ports.
#[track_caller]
fn run_pod_with_ports(node: &Containerd, ports: &[HostPort]) -> Pod {
    let name = unique_name("cnibb-pod");
    let id = node
        .cri()
        .run_pod_with_ports(&name, &unique_name("uid"), node.cgroup_parent(), ports)
        .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}\n{}", node.log()));
    ready_pod(node, name, id)
}

/// `PodSandboxStatus` of the sandbox `id` just started for `name`: ready, with one
/// IPv4 and one IPv6 address.
#[track_caller]
fn ready_pod(node: &Containerd, name: String, id: String) -> Pod {
    let status = node.cri().sandbox(&id).expect("PodSandboxStatus");
    assert_eq!(status.state, 0, "sandbox {name} not ready: {status:?}");
    assert!(status.pid > 0, "no sandbox pid: {status:?}");
    let ips: Vec<IpAddr> = status
        .ips
        .iter()
        .map(|ip| ip.parse().unwrap_or_else(|e| panic!("pod IP {ip:?}: {e}")))
        .collect();
    let [v4 @ IpAddr::V4(_), v6 @ IpAddr::V6(_)] = ips[..] else {
        panic!("want [IPv4, IPv6] pod IPs, got {:?}", status.ips);
    };
    Pod {
        name,
        id,
        v4,
        v6,
        pid: status.pid,
    }
}

/// Whether `ip` is inside `cidr` (`a.b.c.d/n` or `x::/n`).
fn contains(cidr: &str, ip: IpAddr) -> bool {
    let Some((net, len)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(net), Ok(len)) = (net.parse::<IpAddr>(), len.parse::<u32>()) else {
        return false;
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// The `.1` / `::1` gateway of a pod CIDR.
fn gateway(cidr: &str) -> IpAddr {
    let net: IpAddr = cidr
        .split('/')
        .next()
        .unwrap_or_default()
        .parse()
        .expect("cidr");
    match net {
        IpAddr::V4(n) => IpAddr::V4((u32::from(n) + 1).into()),
        IpAddr::V6(n) => IpAddr::V6((u128::from(n) + 1).into()),
    }
}

/// host-local's files for `pods`: each address names its sandbox and `eth0`.
fn expected_reservations(pods: &[&Pod]) -> BTreeMap<String, String> {
    pods.iter()
        .flat_map(|p| {
            [p.v4, p.v6]
                .into_iter()
                .map(|ip| (ip.to_string(), format!("{}\r\neth0", p.id)))
        })
        .collect()
}

/// Every pod pings every other pod and both gateways, over IPv4 and IPv6.
#[track_caller]
fn assert_all_reach(pods: &[&Pod], gateways: &[IpAddr]) {
    for from in pods {
        let targets = pods
            .iter()
            .filter(|to| to.id != from.id)
            .flat_map(|to| [to.v4, to.v6])
            .chain(gateways.iter().copied());
        for to in targets {
            if let Err(out) = ping_from(from.pid, &to.to_string(), PING_LIMIT) {
                panic!(
                    "{} ({}, {}) cannot ping {to}:\n{out}",
                    from.name, from.v4, from.v6
                );
            }
        }
    }
}

/// The masquerade rules of `pod` exist (both families), so that their absence later
/// means they were removed.
#[track_caller]
fn assert_masqueraded(node: &Containerd, pod: &Pod) {
    for ip in [pod.v4, pod.v6] {
        assert!(
            !firewall_lines(node, &ip.to_string()).is_empty(),
            "no masquerade rule for {ip}:\n{}",
            firewall(node)
        );
    }
}

/// Stop and remove `gone` (two CNI DELs each), then check that nothing of them is left
/// while the pods `kept` still have theirs.
#[track_caller]
fn remove_pods(node: &Containerd, gone: &[&Pod], kept: &[&Pod]) {
    for pod in gone {
        node.cri()
            .stop(&pod.id)
            .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    }
    for pod in gone {
        node.cri()
            .remove(&pod.id)
            .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    }
    let mut ids = node.cri().sandbox_ids().expect("ListPodSandbox");
    ids.sort();
    let mut want: Vec<String> = kept.iter().map(|p| p.id.clone()).collect();
    want.sort();
    assert_eq!(ids, want, "sandboxes after removal");
    assert_eq!(
        node.reservations(),
        expected_reservations(kept),
        "host-local reservations after removal"
    );
    assert_eq!(
        node.host_veths().len(),
        kept.len(),
        "veths after removal: {:?}",
        node.host_veths()
    );
    for pod in gone {
        for needle in [pod.id.clone(), pod.v4.to_string(), pod.v6.to_string()] {
            let lines = firewall_lines(node, &needle);
            assert!(
                lines.is_empty(),
                "firewall still mentions {needle}: {lines:#?}"
            );
        }
    }
    for pod in kept {
        assert_masqueraded(node, pod);
    }
    // One sandbox process and one shim per pod that is left (shims exit on their own
    // after the sandbox is removed: bounded wait).
    assert_eq!(
        node.sandbox_processes().len(),
        kept.len(),
        "sandbox processes after removal: {:?}",
        node.sandbox_processes()
    );
    let deadline = Instant::now() + SETTLE_LIMIT;
    while node.shims().len() > kept.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        node.shims().len(),
        kept.len(),
        "shims after removal: {:?}",
        node.shims()
    );
}

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

#[test]
fn kubelet_flow_pods_get_dual_stack_addresses_reach_each_other_and_leave_nothing() {
    if !require_containerd() {
        return;
    }
    const PODS: usize = 3;
    let cidrs = ["10.244.1.0/24", "fd00:10:244:1::/64"];
    let machine = MachineState::now();
    let bridge = {
        let node = Containerd::start(TEMPLATE);

        // Before kubelet sends the pod CIDR there is no conflist: network not ready.
        let status = node.cri().status().expect("Status");
        assert!(status.runtime_ready && !status.network_ready, "{status:?}");
        assert!(node.rendered_conflist().is_none());

        node.cri()
            .update_pod_cidr(&cidrs.join(","))
            .expect("UpdateRuntimeConfig");
        wait_network_ready(&node);
        let conflist = node
            .rendered_conflist()
            .expect("containerd wrote the conflist");
        assert_eq!(conflist["name"], NETWORK);
        assert_eq!(conflist["plugins"][0]["type"], "bridge");
        assert_eq!(conflist["plugins"][0]["bridge"], node.bridge());
        assert_eq!(conflist["plugins"][1]["type"], "portmap");
        assert_eq!(conflist["plugins"][2]["type"], "loopback");
        let ranges = &conflist["plugins"][0]["ipam"]["ranges"];
        assert_eq!(ranges[0][0]["subnet"], cidrs[0], "{conflist}");
        assert_eq!(ranges[1][0]["subnet"], cidrs[1], "{conflist}");
        assert_eq!(
            conflist["plugins"][0]["ipam"]["routes"],
            serde_json::json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]),
            "{conflist}"
        );

        let pods: Vec<Pod> = (0..PODS).map(|_| run_pod(&node)).collect();
        let refs: Vec<&Pod> = pods.iter().collect();
        let addresses: BTreeSet<IpAddr> = pods.iter().flat_map(|p| [p.v4, p.v6]).collect();
        assert_eq!(
            addresses.len(),
            2 * PODS,
            "addresses not distinct: {pods:#?}"
        );
        for pod in &pods {
            assert!(
                contains(cidrs[0], pod.v4),
                "{} outside {}",
                pod.v4,
                cidrs[0]
            );
            assert!(
                contains(cidrs[1], pod.v6),
                "{} outside {}",
                pod.v6,
                cidrs[1]
            );
            assert_ne!(pod.v4, gateway(cidrs[0]), "pod got the gateway address");
            assert_masqueraded(&node, pod);
        }
        assert_eq!(node.reservations(), expected_reservations(&refs));
        assert_eq!(node.host_veths().len(), PODS, "{:?}", node.host_veths());

        assert_all_reach(&refs, &[gateway(cidrs[0]), gateway(cidrs[1])]);

        // StopPodSandbox alone runs the DEL that frees addresses and the veth.
        node.cri().stop(&pods[0].id).expect("StopPodSandbox");
        assert_eq!(node.reservations(), expected_reservations(&refs[1..]));
        assert_eq!(node.host_veths().len(), PODS - 1);

        remove_pods(&node, &refs, &[]);
        node.bridge().to_owned()
    };
    machine.assert_untouched(&bridge, &cidrs);
}

#[test]
fn cni_add_failing_on_an_exhausted_range_fails_the_sandbox_and_leaves_nothing() {
    if !require_containerd() {
        return;
    }
    // host-local gives out .2-.6 of the /29 but only ::2 and ::3 of the /126: the third
    // pod gets an IPv4 address and then fails on IPv6, which must give the IPv4 back.
    let cidrs = ["10.244.3.0/29", "fd00:10:244:3::/126"];
    let machine = MachineState::now();
    let bridge = {
        let node = Containerd::start(TEMPLATE);
        node.cri()
            .update_pod_cidr(&cidrs.join(","))
            .expect("UpdateRuntimeConfig");
        wait_network_ready(&node);
        let first = run_pod(&node);
        let second = run_pod(&node);
        let before = (
            node.reservations(),
            node.host_veths(),
            node.sandbox_processes(),
        );

        let error = node
            .cri()
            .run_pod(&unique_name("cnibb-pod"), "uid-full", node.cgroup_parent())
            .expect_err("a pod beyond the range must not start");
        assert!(
            error.contains("no IP addresses available"),
            "unexpected error: {error}"
        );
        assert_eq!(
            node.reservations(),
            before.0,
            "the failed ADD kept an address"
        );
        assert_eq!(node.host_veths(), before.1, "the failed ADD left a veth");
        assert_eq!(
            node.sandbox_processes(),
            before.2,
            "the failed sandbox left a process"
        );
        let mut ids = node.cri().sandbox_ids().expect("ListPodSandbox");
        ids.sort();
        let mut want = vec![first.id.clone(), second.id.clone()];
        want.sort();
        assert_eq!(ids, want, "the failed sandbox is still listed");
        // Only the two pods are masqueraded: no rule for an address of the failed one.
        let masqueraded: BTreeSet<String> = firewall(&node)
            .lines()
            .filter(|l| l.starts_with("-A POSTROUTING") && l.contains(" -s "))
            .filter_map(|l| l.split(" -s ").nth(1)?.split_whitespace().next())
            .map(|s| s.split('/').next().unwrap_or_default().to_owned())
            .collect();
        let pods_ips: BTreeSet<String> = [first.v4, first.v6, second.v4, second.v6]
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(masqueraded, pods_ips, "{}", firewall(&node));

        // The range is usable again once a pod is gone: nothing of the failure blocks it.
        remove_pods(&node, &[&first], &[&second]);
        let third = run_pod(&node);
        assert_all_reach(&[&second, &third], &[gateway(cidrs[0]), gateway(cidrs[1])]);
        remove_pods(&node, &[&second, &third], &[]);
        node.bridge().to_owned()
    };
    machine.assert_untouched(&bridge, &cidrs);
}

#[test]
fn pods_stay_reachable_across_a_containerd_restart_and_are_removed_cleanly() {
    if !require_containerd() {
        return;
    }
    let cidrs = ["10.244.2.0/24", "fd00:10:244:2::/64"];
    let machine = MachineState::now();
    let bridge = {
        let mut node = Containerd::start(TEMPLATE);
        node.cri()
            .update_pod_cidr(&cidrs.join(","))
            .expect("UpdateRuntimeConfig");
        wait_network_ready(&node);
        let a = run_pod(&node);
        let b = run_pod(&node);
        let gateways = [gateway(cidrs[0]), gateway(cidrs[1])];
        assert_all_reach(&[&a, &b], &gateways);
        let reservations = node.reservations();

        node.restart();
        wait_network_ready(&node);
        // containerd recovered the sandboxes with their addresses and processes.
        for pod in [&a, &b] {
            let status = node.cri().sandbox(&pod.id).expect("PodSandboxStatus");
            assert_eq!(status.state, 0, "{} not ready after restart", pod.name);
            assert_eq!(status.ips, [pod.v4.to_string(), pod.v6.to_string()]);
            assert_eq!(status.pid, pod.pid);
        }
        assert_eq!(node.reservations(), reservations);
        assert_all_reach(&[&a, &b], &gateways);

        // A pod started by the new containerd joins the same bridge and range.
        let c = run_pod(&node);
        assert_eq!(node.reservations(), expected_reservations(&[&a, &b, &c]));
        assert_all_reach(&[&a, &b, &c], &gateways);

        remove_pods(&node, &[&a, &b, &c], &[]);
        node.bridge().to_owned()
    };
    machine.assert_untouched(&bridge, &cidrs);
}

/// A running `cni-node` in the fixture's host netns; SIGKILLed and reaped on drop.
struct NodeAgent {
    child: std::process::Child,
    log: std::path::PathBuf,
    records: std::path::PathBuf,
}

impl NodeAgent {
    /// Starts the agent for Node `name` with the fixture's conf, bin and IPAM dirs, its
    /// bridge and its network name, as the DaemonSet's container would. Its pod record
    /// directory (which it also writes into the conflist, for the bridge plugin) is in
    /// the fixture's directory: the default, under /run, would be the machine's for the
    /// agent and containerd's private tmpfs for the plugins. It runs at the product's
    /// default resync interval, as on a real node, so only its event paths can pass.
    fn start(node: &Containerd, name: &str, kubeconfig: &Path) -> Self {
        let log = node.scratch("cni-node.log");
        let records = node.scratch("pod-records");
        let file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let child = Command::new("ip")
            .args(["netns", "exec", node.host().name()])
            .arg(plugin_path("cni-node"))
            .arg(format!("--node-name={name}"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--cni-conf-dir={}", node.conf_dir().display()))
            .arg(format!("--cni-bin-dir={}", node.plugin_dir().display()))
            .arg(format!("--ipam-data-dir={}", node.ipam_dir().display()))
            .arg(format!("--bridge={}", node.bridge()))
            .arg(format!("--network-name={NETWORK}"))
            .arg(format!("--pod-record-dir={}", records.display()))
            .arg(format!(
                "--explain-socket={}",
                node.scratch("explain.sock").display()
            ))
            .arg("--verbose")
            .env_remove("KUBECONFIG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start cni-node: {e}"));
        Self {
            child,
            log,
            records,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The pod record directory (the conflist's `podRecordDir`).
    fn record_dir(&self) -> &Path {
        &self.records
    }

    /// Every entry of the pod record directory (published records are named after the
    /// address, staged ones are hidden) with its content.
    fn records(&self) -> BTreeMap<String, String> {
        std::fs::read_dir(&self.records)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                (e.file_name().to_string_lossy().into_owned(), text)
            })
            .collect()
    }

    /// Waits (bounded) for a line of the agent's log containing `needle`.
    #[track_caller]
    fn wait_for_log(&self, needle: &str) {
        let deadline = Instant::now() + SETTLE_LIMIT;
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "cni-node never logged {needle:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent's conflist in containerd's `conf_dir`, if written.
fn agent_conflist(node: &Containerd) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(node.conf_dir().join("10-cni-plugins-rs.conflist")).ok()?;
    serde_json::from_str(&text).ok()
}

/// The Pod object `namespace/name` as the API holds it once the scheduler has put it on
/// `node` and before kubelet has posted anything: [`realistic_pod`] with `labels`,
/// phase Pending and neither `podIP` nor `podIPs`. There is no kubelet here, so the
/// agent learns a pod's addresses only from the bridge plugin's records.
fn scheduled_pod(
    namespace: &str,
    name: &str,
    node: &str,
    labels: &[(&str, &str)],
) -> serde_json::Value {
    let mut pod = realistic_pod(namespace, name, node, &[], labels);
    pod["status"] = serde_json::json!({"phase": "Pending", "qosClass": "Burstable"});
    pod
}

/// `RunPodSandbox` for the Pod `namespace/name` with `labels`, as kubelet makes it.
#[track_caller]
fn start_sandbox(
    node: &Containerd,
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> String {
    let uid = unique_name("uid");
    let pod = PodMeta {
        namespace,
        name,
        uid: &uid,
        labels,
    };
    node.cri()
        .run_pod_sandbox(&pod, node.cgroup_parent(), &[])
        .unwrap_or_else(|e| panic!("RunPodSandbox {namespace}/{name}: {e}\n{}", node.log()))
}

/// A new Pod on the Node `node_name` as kubelet sees it: its object is in the API
/// (applied here as the scheduler leaves it, [`scheduled_pod`]), then `RunPodSandbox`
/// with its namespace, name and labels, then `PodSandboxStatus`.
#[track_caller]
fn run_k8s_pod(
    node: &Containerd,
    api: &ApiServer,
    node_name: &str,
    (namespace, name): (&str, &str),
    labels: &[(&str, &str)],
) -> Pod {
    api.apply_pod(scheduled_pod(namespace, name, node_name, labels));
    let id = start_sandbox(node, namespace, name, labels);
    ready_pod(node, format!("{namespace}/{name}"), id)
}

/// The MTU of `eth0` inside the sandbox with pid `pid`.
fn pod_mtu(pid: u32) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["ip", "-j", "link", "show", "eth0"])
        .output()
        .expect("run nsenter ip link");
    let links: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    links[0]["mtu"].to_string()
}

#[test]
fn the_node_agent_writes_the_conflist_containerd_uses_and_routes_to_other_nodes() {
    if !require_containerd() {
        return;
    }
    let own = ["10.244.7.0/24", "fd00:10:244:7::/64"];
    let other = ["10.244.8.0/24", "fd00:10:244:8::/64"];
    let own_ips = ["192.168.77.1", "fd00:77::1"];
    let other_ips = ["192.168.77.2", "fd00:77::2"];
    let machine = MachineState::now();
    let bridge = {
        // No conf_template: kubelet's UpdateRuntimeConfig would render nothing, and the
        // only conflist containerd can find is the one the agent writes.
        let node = Containerd::start_without_template();
        let host = node.host();
        // The node's uplink holds its InternalIPs, with a cloud NIC's MTU; the other node
        // is on the same link.
        host.exec_ok(&[
            "ip", "link", "add", "uplink0", "mtu", "1450", "type", "veth", "peer", "name",
            "uplink1", "mtu", "1450",
        ]);
        for link in ["uplink0", "uplink1"] {
            host.exec_ok(&["ip", "link", "set", link, "up"]);
        }
        host.exec_ok(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", own_ips[0]),
            "dev",
            "uplink0",
        ]);
        host.exec_ok(&[
            "ip",
            "addr",
            "add",
            &format!("{}/64", own_ips[1]),
            "dev",
            "uplink0",
            "nodad",
        ]);
        let api = ApiServer::start_in_netns(
            host.path(),
            "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
        );
        let kubeconfig = node.scratch("kubeconfig");
        api.write_kubeconfig(&kubeconfig);
        api.apply_node(realistic_node("node-a", &[], &own_ips, 5));
        let agent = NodeAgent::start(&node, "node-a", &kubeconfig);

        // Until the controller gives this node a pod CIDR there is no config, and
        // containerd keeps the node's network NotReady.
        agent.wait_for_log("has no usable pod CIDR yet");
        assert!(agent_conflist(&node).is_none(), "{}", agent.log());
        let status = node.cri().status().expect("Status");
        assert!(status.runtime_ready && !status.network_ready, "{status:?}");

        api.apply_node(realistic_node("node-a", &own, &own_ips, 5));
        wait_network_ready(&node);
        let conflist = agent_conflist(&node).expect("the agent wrote the conflist");
        assert_eq!(conflist["name"], NETWORK, "{conflist}");
        let bridge_conf = &conflist["plugins"][0];
        assert_eq!(bridge_conf["type"], "bridge", "{conflist}");
        assert_eq!(bridge_conf["bridge"], node.bridge(), "{conflist}");
        assert_eq!(bridge_conf["mtu"], 1450, "the uplink's MTU: {conflist}");
        assert_eq!(bridge_conf["ipam"]["ranges"][0][0]["subnet"], own[0]);
        assert_eq!(bridge_conf["ipam"]["ranges"][1][0]["subnet"], own[1]);
        assert_eq!(
            bridge_conf["podRecordDir"],
            agent.record_dir().display().to_string(),
            "NetworkPolicy is on: the plugin hands new pods over: {conflist}"
        );

        // Another node joins: its pod CIDRs are routed through its InternalIPs.
        api.apply_node(realistic_node("node-b", &other, &other_ips, 5));
        let want = [
            format!("{} via {} dev uplink0", other[0], other_ips[0]),
            format!("{} via {} dev uplink0", other[1], other_ips[1]),
        ];
        let deadline = Instant::now() + SETTLE_LIMIT;
        loop {
            let routes =
                String::from_utf8_lossy(&host.exec(&["ip", "route", "show", "proto", "77"]).stdout)
                    .into_owned()
                    + &String::from_utf8_lossy(
                        &host
                            .exec(&["ip", "-6", "route", "show", "proto", "77"])
                            .stdout,
                    );
            if want.iter().all(|w| routes.contains(w.as_str())) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "routes to node-b missing: {routes}\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }

        // Pods get addresses from this node's pod CIDRs, the uplink's MTU, reach each
        // other and the gateways; traffic leaving the cluster is masqueraded by the
        // agent's rule for the pod CIDRs (the bridge's own ipMasq is off).
        api.apply_namespace(realistic_namespace("default", &[]));
        let labels = [("app", "cnibb")];
        let a = run_k8s_pod(&node, &api, "node-a", ("default", "a"), &labels);
        let b = run_k8s_pod(&node, &api, "node-a", ("default", "b"), &labels);
        for pod in [&a, &b] {
            assert!(contains(own[0], pod.v4), "{} outside {}", pod.v4, own[0]);
            assert!(contains(own[1], pod.v6), "{} outside {}", pod.v6, own[1]);
            assert_eq!(pod_mtu(pod.pid), "1450", "{} eth0 MTU", pod.name);
        }
        assert_eq!(node.reservations(), expected_reservations(&[&a, &b]));
        assert_all_reach(&[&a, &b], &[gateway(own[0]), gateway(own[1])]);
        let egress = String::from_utf8_lossy(
            &host
                .exec(&["nft", "list", "table", "inet", "cni_node_egress"])
                .stdout,
        )
        .into_owned();
        for cidr in own {
            assert!(
                egress
                    .lines()
                    .any(|l| l.contains(cidr) && l.contains("masquerade")),
                "no egress masquerade for {cidr}:\n{egress}"
            );
        }

        remove_pods(&node, &[&a, &b], &[]);
        assert_eq!(
            agent.records(),
            BTreeMap::new(),
            "pod records after removal"
        );
        drop(agent);
        drop(api);
        node.bridge().to_owned()
    };
    machine.assert_untouched(&bridge, &[own[0], own[1], other[0], other[1]]);
}

/// `busybox httpd` serving one page in a pod's netns; killed on drop.
struct Httpd {
    child: std::process::Child,
    _dir: cni_blackbox::TempDir,
}

impl Httpd {
    fn start(pod: &Pod, page: &str) -> Self {
        let dir = cni_blackbox::TempDir::new("cnibb-httpd");
        std::fs::write(dir.path().join("index.html"), format!("{page}\n"))
            .expect("write index.html");
        let child = Command::new("nsenter")
            .arg(format!("--net=/proc/{}/ns/net", pod.pid))
            .args(["busybox", "httpd", "-f", "-p", "80", "-h"])
            .arg(dir.path())
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("start busybox httpd in the pod");
        Self { child, _dir: dir }
    }
}

impl Drop for Httpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /` of `http://<to>/` from the netns at `netns` (bounded retries for the
/// server to come up); the page or the last error. busybox-static's `wget` crashes
/// (static glibc), so the request is made here, from a thread in that netns.
fn http_get(netns: &str, to: &str) -> Result<String, String> {
    use std::io::{Read as _, Write as _};
    let from = netns.to_owned();
    let to: std::net::SocketAddr = to.parse().map_err(|e| format!("{to}: {e}"))?;
    in_netns(Path::new(netns), move || {
        let netns = from;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let attempt = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(3))
                .and_then(|mut s| {
                    s.set_read_timeout(Some(Duration::from_secs(3)))?;
                    s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
                    let mut answer = String::new();
                    s.read_to_string(&mut answer)?;
                    Ok(answer)
                });
            match attempt {
                Ok(answer) if answer.starts_with("HTTP/1.1 200") => {
                    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b);
                    return Ok(body.unwrap_or_default().trim_end().to_owned());
                }
                Ok(answer) if Instant::now() > deadline => {
                    return Err(format!("GET http://{to}/ from {netns}: {answer}"));
                }
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("GET http://{to}/ from {netns}: {e}"));
                }
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    })
}

/// A UDP socket bound in the netns at `netns`.
fn udp_socket_in(netns: String, addr: &str) -> std::net::UdpSocket {
    let addr: std::net::SocketAddr = addr.parse().expect("socket address");
    in_netns(Path::new(&netns), move || {
        std::net::UdpSocket::bind(addr).expect("bind UDP")
    })
}

fn tcp(container_port: u16, host_port: u16, host_ip: &str) -> HostPort {
    HostPort {
        protocol: Protocol::Tcp,
        container_port,
        host_port,
        host_ip: host_ip.to_owned(),
    }
}

#[test]
fn host_ports_of_pods_answer_on_the_node_and_leave_no_rule() {
    if !require_containerd() {
        return;
    }
    let cidrs = ["10.244.9.0/24", "fd00:10:244:9::/64"];
    const NODE_IP: &str = "192.168.78.1";
    const CLIENT_IP: &str = "192.168.78.2";
    let machine = MachineState::now();
    let bridge = {
        let node = Containerd::start(TEMPLATE);
        let host = node.host();
        // The node's address on its network, and a machine beside it.
        let client = cni_blackbox::Netns::new("cnibb-ctrd-client");
        host.exec_ok(&[
            "ip", "link", "add", "uplink0", "type", "veth", "peer", "name", "uplink1",
        ]);
        host.exec_ok(&["ip", "link", "set", "uplink1", "netns", client.name()]);
        host.exec_ok(&[
            "ip",
            "addr",
            "add",
            &format!("{NODE_IP}/24"),
            "dev",
            "uplink0",
        ]);
        host.exec_ok(&["ip", "link", "set", "uplink0", "up"]);
        host.exec_ok(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        client.exec_ok(&[
            "ip",
            "addr",
            "add",
            &format!("{CLIENT_IP}/24"),
            "dev",
            "uplink1",
        ]);
        client.exec_ok(&["ip", "link", "set", "uplink1", "up"]);
        node.cri()
            .update_pod_cidr(&cidrs.join(","))
            .expect("UpdateRuntimeConfig");
        wait_network_ready(&node);

        let run_with = |ports: &[HostPort]| run_pod_with_ports(&node, ports);
        // hostPort 8080 on the node's address (TCP), on 127.0.0.1 (TCP), and on the
        // node's address for UDP: three pods, one port number.
        let web = run_with(&[tcp(80, 8080, NODE_IP)]);
        let local = run_with(&[tcp(80, 8080, "127.0.0.1")]);
        let dns = run_with(&[HostPort {
            protocol: Protocol::Udp,
            container_port: 53,
            host_port: 8080,
            host_ip: NODE_IP.to_owned(),
        }]);
        let neighbour = run_with(&[]);
        let _web_httpd = Httpd::start(&web, "web");
        let _local_httpd = Httpd::start(&local, "local");
        let udp = udp_socket_in(format!("/proc/{}/ns/net", dns.pid), "0.0.0.0:53");
        udp.set_read_timeout(Some(Duration::from_millis(300))).ok();

        let to = format!("{NODE_IP}:8080");
        let page = |netns: &str, to: &str| {
            http_get(netns, to).unwrap_or_else(|e| panic!("{e}\n{}", firewall(&node)))
        };
        assert_eq!(page(client.path_str(), &to), "web", "from another machine");
        assert_eq!(page(host.path_str(), &to), "web", "from the node");
        let neighbour_ns = format!("/proc/{}/ns/net", neighbour.pid);
        assert_eq!(page(&neighbour_ns, &to), "web", "from a pod on the node");
        let web_ns = format!("/proc/{}/ns/net", web.pid);
        assert_eq!(page(&web_ns, &to), "web", "from the pod itself");
        assert_eq!(
            page(host.path_str(), "127.0.0.1:8080"),
            "local",
            "on localhost"
        );

        let sender = udp_socket_in(client.path_str().to_owned(), "0.0.0.0:0");
        let mut buf = [0u8; 8];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            sender.send_to(b"query", to.as_str()).ok();
            if let Ok((n, _)) = udp.recv_from(&mut buf) {
                assert_eq!(&buf[..n], b"query");
                break;
            }
            assert!(Instant::now() < deadline, "UDP {to} never reached the pod");
        }

        // The uplink's peer is in another netns, like a pod's veth: gone first, so
        // that only pods' veths are counted.
        host.exec_ok(&["ip", "link", "del", "uplink0"]);
        let pods = [&web, &local, &dns, &neighbour];
        remove_pods(&node, &pods, &[]);
        let left: Vec<String> = firewall(&node)
            .lines()
            .filter(|l| l.contains("CNI-DN-") || l.contains("dnat name:"))
            .map(str::to_owned)
            .collect();
        assert!(left.is_empty(), "host port rules left: {left:#?}");
        node.bridge().to_owned()
    };
    machine.assert_untouched(&bridge, &cidrs);
}

// ---------------------------------------------------------------------------------------
// NetworkPolicy through the CRI
// ---------------------------------------------------------------------------------------

/// The port the server pod listens on.
const SERVER_PORT: u16 = 7070;
/// Bound on one probe's connect. Pods on one bridge answer a SYN in well under a
/// millisecond: a probe unanswered by then was dropped, or had nowhere to go yet.
const PROBE_TIMEOUT: Duration = Duration::from_millis(20);
/// Pause between two probes of one address from one source.
const PROBE_PAUSE: Duration = Duration::from_millis(5);
/// How long the clients keep probing the new server after `RunPodSandbox` returned.
const OBSERVE: Duration = Duration::from_secs(3);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Signed milliseconds from `zero` to `at` (negative: before).
fn ms(at: Instant, zero: Instant) -> f64 {
    if at >= zero {
        (at - zero).as_secs_f64() * 1e3
    } else {
        -(zero - at).as_secs_f64() * 1e3
    }
}

/// Calls `check` until it returns `Ok` or `limit` has passed (then panics with `what`
/// and its last error).
#[track_caller]
fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + limit;
    loop {
        match check() {
            Ok(()) => return,
            Err(e) => assert!(Instant::now() < deadline, "{what}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How one TCP connect to the server ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Probe {
    /// A listener accepted: the SYN reached the server.
    Connected,
    /// The server's stack answered with a reset (no listener yet): the SYN reached it.
    Reset,
    /// No answer within [`PROBE_TIMEOUT`]: dropped, or nowhere to go yet.
    Silent,
    /// Failed at once, with no answer from the server (no neighbour yet, no route).
    Unreachable,
}

impl Probe {
    /// Whether the SYN reached the server.
    fn reached(self) -> bool {
        matches!(self, Self::Connected | Self::Reset)
    }
}

/// One connect from this thread's netns.
fn probe(to: SocketAddr) -> Probe {
    match TcpStream::connect_timeout(&to, PROBE_TIMEOUT) {
        Ok(_) => Probe::Connected,
        Err(e) => match e.kind() {
            ErrorKind::ConnectionRefused => Probe::Reset,
            ErrorKind::TimedOut | ErrorKind::WouldBlock => Probe::Silent,
            _ => Probe::Unreachable,
        },
    }
}

/// One probe: when it started, where to, how it ended.
#[derive(Debug, Clone, Copy)]
struct Attempt {
    at: Instant,
    to: SocketAddr,
    outcome: Probe,
}

/// The new server's addresses, known as soon as host-local reserves them during the
/// CNI ADD (before `RunPodSandbox` returns), with the time each was seen.
type Targets = Arc<Mutex<Vec<(Instant, SocketAddr)>>>;

/// A thread of its own that stops and is joined on drop.
#[derive(Debug)]
struct Worker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    fn spawn(work: impl FnOnce(Arc<AtomicBool>) + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        Self {
            stop,
            thread: Some(std::thread::spawn(move || work(flag))),
        }
    }

    /// Stops the thread and waits for it; whether it ended without panicking.
    fn finish(&mut self) -> bool {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().is_none_or(|t| t.join().is_ok())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Fills `targets` with the addresses (on [`SERVER_PORT`]) that host-local reserves in
/// `network_dir` beyond `before`, the moment their files appear.
fn watch_reservations(network_dir: PathBuf, before: BTreeSet<String>, targets: Targets) -> Worker {
    Worker::spawn(move |stop| {
        while !stop.load(Ordering::SeqCst) {
            for address in cni_blackbox::ipam::reservations(&network_dir).into_keys() {
                let Ok(ip) = address.parse::<IpAddr>() else {
                    continue;
                };
                let to = SocketAddr::new(ip, SERVER_PORT);
                let mut known = lock(&targets);
                if !before.contains(&address) && !known.iter().any(|(_, t)| *t == to) {
                    known.push((Instant::now(), to));
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

/// TCP connects from the netns at `netns` to the known targets, one thread per address
/// family, each in a loop until stopped; every attempt is logged.
#[derive(Debug)]
struct Prober {
    log: Arc<Mutex<Vec<Attempt>>>,
    workers: Vec<Worker>,
}

impl Prober {
    fn start(netns: &Path, targets: &Targets) -> Self {
        let log = Arc::new(Mutex::new(Vec::new()));
        let workers = [true, false]
            .into_iter()
            .map(|v4| {
                let (into, targets) = (Arc::clone(&log), Arc::clone(targets));
                let netns = netns.to_path_buf();
                Worker::spawn(move |stop| {
                    in_netns(&netns, move || {
                        while !stop.load(Ordering::SeqCst) {
                            let now: Vec<SocketAddr> = lock(&targets)
                                .iter()
                                .map(|(_, t)| *t)
                                .filter(|t| t.is_ipv4() == v4)
                                .collect();
                            for to in now {
                                let at = Instant::now();
                                let outcome = probe(to);
                                lock(&into).push(Attempt { at, to, outcome });
                            }
                            std::thread::sleep(PROBE_PAUSE);
                        }
                    });
                })
            })
            .collect();
        Self { log, workers }
    }

    fn attempts(&self) -> Vec<Attempt> {
        let mut log = lock(&self.log).clone();
        log.sort_by_key(|a| a.at);
        log
    }

    /// Stops probing; every attempt made, in order.
    #[track_caller]
    fn finish(mut self) -> Vec<Attempt> {
        for worker in &mut self.workers {
            assert!(worker.finish(), "a prober failed");
        }
        self.attempts()
    }
}

/// The first attempt to `to` that ended as `wanted` says.
fn first(log: &[Attempt], to: SocketAddr, wanted: impl Fn(Probe) -> bool) -> Option<Instant> {
    log.iter()
        .find(|a| a.to == to && wanted(a.outcome))
        .map(|a| a.at)
}

/// How the attempts to `to` ended, counted.
fn tally(log: &[Attempt], to: SocketAddr) -> String {
    let mut counts: BTreeMap<Probe, usize> = BTreeMap::new();
    for a in log.iter().filter(|a| a.to == to) {
        *counts.entry(a.outcome).or_default() += 1;
    }
    let total: usize = counts.values().sum();
    format!("{total} probes {counts:?}")
}

/// A TCP server on [`SERVER_PORT`] (both families) in a pod's netns: answers each
/// connection with the peer address it saw; ends on drop.
#[derive(Debug)]
struct PeerEcho {
    _worker: Worker,
}

impl PeerEcho {
    fn start(pod: &Pod) -> Self {
        let listener = in_netns(&netns_of(pod.pid), || {
            TcpListener::bind(("::", SERVER_PORT))
                .unwrap_or_else(|e| panic!("bind [::]:{SERVER_PORT}: {e}"))
        });
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("listener: {e}"));
        let worker = Worker::spawn(move |stop| {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut stream, peer)) => {
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.write_all(peer.ip().to_canonical().to_string().as_bytes());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Self { _worker: worker }
    }
}

/// `sysctl -qw` of `settings` in the pod's netns.
#[track_caller]
fn sysctl_in_pod(pod: &Pod, settings: &[&str]) {
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{}/ns/net", pod.pid))
        .args(["sysctl", "-qw"])
        .args(settings)
        .output()
        .unwrap_or_else(|e| panic!("run sysctl in {}: {e}", pod.name));
    assert!(
        out.status.success(),
        "sysctl {settings:?} in {}: {}",
        pod.name,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `nft` with `args` and `stdin` in the netns of process `pid`; its stdout.
#[track_caller]
fn nft_in_pod(pid: u32, args: &[&str], stdin: &str) -> String {
    let mut child = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .arg("nft")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run nft in {pid}'s netns: {e}"));
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all(stdin.as_bytes())
            .unwrap_or_else(|e| panic!("nft's stdin: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("nft: {e}"));
    assert!(
        out.status.success(),
        "nft {args:?} in {pid}'s netns: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Counts, in the pod's own netns (ahead of its sockets), the SYNs to [`SERVER_PORT`]
/// from each of `sources`: what reached the pod, whatever a client concluded.
fn count_syns(pod: &Pod, sources: &[IpAddr]) {
    let rules: String = sources
        .iter()
        .map(|ip| {
            let family = if ip.is_ipv4() { "ip" } else { "ip6" };
            format!(
                "    {family} saddr {ip} tcp dport {SERVER_PORT} tcp flags & (syn | ack) == syn \
                 counter comment \"{ip}\"\n"
            )
        })
        .collect();
    nft_in_pod(
        pod.pid,
        &["-f", "-"],
        &format!(
            "table inet cnibb_seen {{\n  chain input {{\n    type filter hook input priority \
             filter; policy accept;\n{rules}  }}\n}}\n"
        ),
    );
}

/// The SYNs [`count_syns`] counted, by source address.
fn syns_seen(pod: &Pod) -> BTreeMap<IpAddr, u64> {
    nft_in_pod(pod.pid, &["list", "table", "inet", "cnibb_seen"], "")
        .lines()
        .filter_map(|line| {
            let packets = line
                .split("counter packets ")
                .nth(1)?
                .split_whitespace()
                .next()?;
            let source = line.split("comment \"").nth(1)?.split('"').next()?;
            Some((source.parse().ok()?, packets.parse().ok()?))
        })
        .collect()
}

/// The agent's NetworkPolicy table in the host netns, as `nft` prints it (`None`
/// while it does not exist).
fn policy_table(node: &Containerd) -> Option<String> {
    let out = node
        .host()
        .exec(&["nft", "list", "table", "inet", "cni_node_policy"]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The elements of the table's pending sets: address -> the pod they were held for
/// (the element's comment, empty without one).
fn pending(node: &Containerd) -> BTreeMap<String, String> {
    let mut held = BTreeMap::new();
    for set in ["pending4", "pending6"] {
        let out = node
            .host()
            .exec(&["nft", "-j", "list", "set", "inet", "cni_node_policy", set]);
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        let elements = json["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item["set"]["elem"].as_array())
            .flatten();
        for element in elements {
            let (address, pod) = match element["elem"].as_object() {
                Some(e) => (&e["val"], e.get("comment")),
                None => (element, None),
            };
            held.insert(
                address.as_str().unwrap_or_default().to_owned(),
                pod.and_then(|c| c.as_str()).unwrap_or_default().to_owned(),
            );
        }
    }
    held
}

/// What closes the server to dev/other and leaves it open to dev/client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guard {
    /// A NetworkPolicy of prod admitting dev's pods labelled role=client.
    NetworkPolicy,
    /// An Admin ClusterNetworkPolicy over prod's pods: dev's role=client pods accepted,
    /// every other pod denied; under it, a NetworkPolicy of prod that admits every pod
    /// (the Admin tier decides first).
    AdminDeny,
}

/// The NetworkPolicy of [`Guard::NetworkPolicy`], and the one under the Admin deny.
const POLICY: (&str, &str) = ("prod", "clients-from-dev");
/// The ClusterNetworkPolicy of [`Guard::AdminDeny`].
const CLUSTER_POLICY: &str = "prod-only-from-dev-clients";

fn apply_guard(api: &ApiServer, guard: Guard) {
    match guard {
        // Ingress to every pod of prod only from dev's pods labelled role=client (one
        // peer: both selectors must match); egress is not restricted.
        Guard::NetworkPolicy => {
            api.apply_network_policy(network_policy(
                POLICY.0,
                POLICY.1,
                json!({
                    "podSelector": {},
                    "policyTypes": ["Ingress"],
                    "ingress": [{"from": [{
                        "namespaceSelector": {"matchLabels": {"env": "dev"}},
                        "podSelector": {"matchLabels": {"role": "client"}},
                    }]}],
                }),
            ));
        }
        Guard::AdminDeny => {
            api.apply_network_policy(network_policy(
                POLICY.0,
                POLICY.1,
                json!({
                    "podSelector": {},
                    "policyTypes": ["Ingress"],
                    "ingress": [{"from": [{"namespaceSelector": {}}]}],
                }),
            ));
            api.apply_cluster_network_policy(cluster_network_policy(
                CLUSTER_POLICY,
                json!({
                    "tier": "Admin",
                    "priority": 10,
                    "subject": {"namespaces": {"matchLabels": {"env": "prod"}}},
                    "ingress": [
                        {"name": "accept-dev-clients", "action": "Accept", "from": [{"pods": {
                            "namespaceSelector": {"matchLabels": {"env": "dev"}},
                            "podSelector": {"matchLabels": {"role": "client"}},
                        }}]},
                        {"name": "deny-every-other-pod", "action": "Deny",
                         "from": [{"namespaces": {}}]},
                    ],
                }),
            ));
        }
    }
}

/// Deletes what [`apply_guard`] applied.
fn delete_guard(api: &ApiServer, guard: Guard) {
    assert!(api.delete_network_policy(POLICY.0, POLICY.1));
    if guard == Guard::AdminDeny {
        assert!(api.delete_cluster_network_policy(CLUSTER_POLICY));
    }
}

#[test]
fn network_policy_holds_a_new_pod_from_its_first_packet_and_admits_only_allowed_clients() {
    new_pod_behind(Guard::NetworkPolicy);
}

/// The same under an Admin ClusterNetworkPolicy's deny, over a NetworkPolicy that would
/// admit every pod: the denied client never reaches the new pod.
#[test]
fn an_admin_deny_holds_a_new_pod_from_its_first_packet_over_a_network_policy_allow() {
    new_pod_behind(Guard::AdminDeny);
}

fn new_pod_behind(guard: Guard) {
    if !require_containerd() {
        return;
    }
    let own = ["10.244.11.0/24", "fd00:10:244:11::/64"];
    let node_ips = ["192.168.79.1", "fd00:79::1"];
    let machine = MachineState::now();
    let bridge = {
        let node = Containerd::start_without_template();
        let host = node.host();
        // The node's InternalIPs, on an uplink of their own.
        host.exec_ok(&[
            "ip", "link", "add", "uplink0", "type", "veth", "peer", "name", "uplink1",
        ]);
        for link in ["uplink0", "uplink1"] {
            host.exec_ok(&["ip", "link", "set", link, "up"]);
        }
        for (ip, prefix) in [(node_ips[0], "24"), (node_ips[1], "64")] {
            host.exec_ok(&[
                "ip",
                "addr",
                "add",
                &format!("{ip}/{prefix}"),
                "dev",
                "uplink0",
                "nodad",
            ]);
        }
        let api = ApiServer::start_in_netns(
            host.path(),
            "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
        );
        let kubeconfig = node.scratch("kubeconfig");
        api.write_kubeconfig(&kubeconfig);
        api.apply_node(realistic_node("node-a", &own, &node_ips, 5));
        api.apply_namespace(realistic_namespace("prod", &[("env", "prod")]));
        api.apply_namespace(realistic_namespace("dev", &[("env", "dev")]));
        apply_guard(&api, guard);
        let agent = NodeAgent::start(&node, "node-a", &kubeconfig);
        wait_network_ready(&node);
        // The plugin holds new pods only where the agent has made its table.
        wait_until(SETTLE_LIMIT, "no NetworkPolicy table", || {
            policy_table(&node).map(drop).ok_or_else(|| agent.log())
        });

        // The clients: no policy selects them, so the agent releases them once judged.
        let client = run_k8s_pod(
            &node,
            &api,
            "node-a",
            ("dev", "client"),
            &[("app", "shop"), ("role", "client")],
        );
        let other = run_k8s_pod(&node, &api, "node-a", ("dev", "other"), &[("app", "shop")]);
        // A probe sent before the server's interface is up leaves the sender's neighbour
        // entry resolving, retried once a second: ten milliseconds instead, so that the
        // probes right after RunPodSandbox returns are answered (or dropped) as soon as
        // the server can be reached at all.
        for pod in [&client, &other] {
            sysctl_in_pod(
                pod,
                &[
                    "net.ipv4.neigh.eth0.retrans_time_ms=10",
                    "net.ipv6.neigh.eth0.retrans_time_ms=10",
                ],
            );
        }
        for family in ["ipv4", "ipv6"] {
            host.exec_ok(&[
                "sysctl",
                "-qw",
                &format!("net.{family}.neigh.{}.retrans_time_ms=10", node.bridge()),
            ]);
        }
        wait_until(SETTLE_LIMIT, "the clients are still pending", || {
            let held = pending(&node);
            held.is_empty()
                .then_some(())
                .ok_or_else(|| format!("{held:?}\n{}", agent.log()))
        });

        // The server: its Pod object first (as the scheduler leaves it), then the
        // sandbox, probed from both clients and from the node from the moment host-local
        // has reserved its addresses, before RunPodSandbox returns.
        let server_labels = [("app", "server")];
        api.apply_pod(scheduled_pod("prod", "server", "node-a", &server_labels));
        let targets = Targets::default();
        let before: BTreeSet<String> = node.reservations().into_keys().collect();
        let mut watch =
            watch_reservations(node.ipam_dir().join(NETWORK), before, Arc::clone(&targets));
        let denied = Prober::start(&netns_of(other.pid), &targets);
        let allowed = Prober::start(&netns_of(client.pid), &targets);
        let from_node = Prober::start(host.path(), &targets);
        let called = Instant::now();
        let id = start_sandbox(&node, "prod", "server", &server_labels);
        let returned = Instant::now();
        let server = ready_pod(&node, "prod/server".to_owned(), id);
        let addresses = [
            SocketAddr::new(server.v4, SERVER_PORT),
            SocketAddr::new(server.v6, SERVER_PORT),
        ];
        count_syns(&server, &[client.v4, client.v6, other.v4, other.v6]);
        let counted = Instant::now();
        let echo = PeerEcho::start(&server);
        let listening = Instant::now();
        let connected_both = |log: &[Attempt]| {
            addresses
                .iter()
                .all(|to| first(log, *to, |p| p == Probe::Connected).is_some())
        };
        while Instant::now() < returned + OBSERVE
            || (!connected_both(&allowed.attempts()) && Instant::now() < returned + SETTLE_LIMIT)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let denied = denied.finish();
        let allowed = allowed.finish();
        let from_node = from_node.finish();
        watch.finish();
        let seen = syns_seen(&server);
        let known: Vec<(Instant, SocketAddr)> = lock(&targets).clone();

        println!(
            "{guard:?} through the CRI, ms from RunPodSandbox's return (negative: before):\n\
             \x20 RunPodSandbox took {:.1}; SYN counters in the server at {:+.1}, its listener at {:+.1}",
            ms(returned, called),
            ms(counted, returned),
            ms(listening, returned),
        );
        let at = |t: Option<Instant>| {
            t.map_or_else(
                || "never".to_owned(),
                |t| format!("{:+.1}", ms(t, returned)),
            )
        };
        for to in addresses {
            let reserved = known.iter().find(|(_, t)| *t == to).map(|(at, _)| *at);
            let node_reached = first(&from_node, to, Probe::reached);
            let mine: Vec<&Attempt> = denied.iter().filter(|a| a.to == to).collect();
            let refused_while_up = node_reached.and_then(|up| {
                mine.iter()
                    .find(|a| a.at >= up && !a.outcome.reached())
                    .map(|a| a.at)
            });
            println!(
                "  {}: reserved {}\n\
                 \x20   the node (never judged): first reached {}; {}\n\
                 \x20   denied dev/other: first {}, last {}, {} before the return; first refused \
                 after the node reached the server {}; {}\n\
                 \x20   allowed dev/client: first reached {}, first connected {}; {}",
                to.ip(),
                at(reserved),
                at(node_reached),
                tally(&from_node, to),
                at(mine.first().map(|a| a.at)),
                at(mine.last().map(|a| a.at)),
                mine.iter().filter(|a| a.at < returned).count(),
                at(refused_while_up),
                tally(&denied, to),
                at(first(&allowed, to, Probe::reached)),
                at(first(&allowed, to, |p| p == Probe::Connected)),
                tally(&allowed, to),
            );
        }
        println!("  SYNs the server's netns counted, by source: {seen:?}");

        let mut reserved: Vec<SocketAddr> = known.iter().map(|(_, t)| *t).collect();
        reserved.sort();
        let mut want = addresses.to_vec();
        want.sort();
        assert_eq!(reserved, want, "the addresses probed are the server's");
        for to in addresses {
            // The server was up: the node (never judged) reached it.
            assert!(
                first(&from_node, to, Probe::reached).is_some(),
                "the node never reached {to}: {:?}\n{}",
                from_node.iter().rfind(|a| a.to == to),
                agent.log()
            );
            // The denied client probed it all along and never got through.
            let mine: Vec<&Attempt> = denied.iter().filter(|a| a.to == to).collect();
            let leaks: Vec<f64> = mine
                .iter()
                .filter(|a| a.outcome.reached())
                .map(|a| ms(a.at, returned))
                .collect();
            assert!(
                leaks.is_empty(),
                "dev/other reached {to} (ms from the return): {leaks:?}\n{}\n{}",
                policy_table(&node).unwrap_or_default(),
                agent.log()
            );
            // The allowed client got through...
            let open = first(&allowed, to, |p| p == Probe::Connected);
            assert!(
                open.is_some(),
                "dev/client never connected to {to}; last probe {:?}\n{}\n{}",
                allowed.iter().rfind(|a| a.to == to),
                policy_table(&node).unwrap_or_default(),
                agent.log()
            );
            // ... and the denied one was still refused after that, by a drop: with the
            // server up, an unreachable (or a reset, above) means the route or the server
            // is broken, not that the policy works.
            assert!(
                mine.iter().any(|a| open.is_some_and(|open| a.at > open)),
                "dev/other never probed {to} while the server accepted dev/client"
            );
            let not_dropped: Vec<String> = mine
                .iter()
                .filter(|a| open.is_some_and(|open| a.at > open) && a.outcome != Probe::Silent)
                .map(|a| format!("{:+.1} ms: {:?}", ms(a.at, returned), a.outcome))
                .collect();
            assert!(
                not_dropped.is_empty(),
                "dev/other's probes of {to} after dev/client connected were not dropped, so the \
                 route or the server is broken, not the policy: {not_dropped:?}"
            );
        }
        for ip in [other.v4, other.v6] {
            assert_eq!(
                seen.get(&ip),
                Some(&0),
                "SYNs from dev/other reached the server: {seen:?}"
            );
        }
        for ip in [client.v4, client.v6] {
            assert!(
                seen.get(&ip).is_some_and(|n| *n > 0),
                "no SYN from dev/client counted: {seen:?}"
            );
        }
        // The server sees the client's own address (pod to pod, no NAT).
        for (to, from) in [(addresses[0], client.v4), (addresses[1], client.v6)] {
            let got = peer_seen(&netns_of(client.pid), to).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got, from.to_string(), "the server saw dev/client as");
        }

        // A pod whose object the API does not hold stays pending: it reaches nothing and
        // nothing reaches it (a reset would say a SYN did). Removing its sandbox leaves
        // neither its records nor its pending addresses.
        let id = start_sandbox(&node, "prod", "unknown", &server_labels);
        let unknown = ready_pod(&node, "prod/unknown".to_owned(), id);
        let unknown_ips = [unknown.v4.to_string(), unknown.v6.to_string()];
        let records = agent.records();
        for ip in &unknown_ips {
            assert_eq!(
                records.get(ip).and_then(|r| r.lines().next()),
                Some("prod/unknown"),
                "the record of {ip}: {records:?}"
            );
        }
        let held = pending(&node);
        let want: BTreeMap<String, String> = unknown_ips
            .iter()
            .map(|ip| (ip.clone(), "prod/unknown".to_owned()))
            .collect();
        assert_eq!(held, want, "pending while the agent cannot find the Pod");
        let to_unknown: Vec<Probe> = in_netns(&netns_of(client.pid), move || {
            (0..5)
                .map(|_| probe(SocketAddr::new(unknown.v4, SERVER_PORT)))
                .collect()
        });
        assert!(
            !to_unknown.iter().any(|p| p.reached()),
            "dev/client reached the pending pod: {to_unknown:?}"
        );
        node.cri()
            .stop(&unknown.id)
            .unwrap_or_else(|e| panic!("{e}"));
        node.cri()
            .remove(&unknown.id)
            .unwrap_or_else(|e| panic!("{e}"));
        let records = agent.records();
        assert!(
            !records.values().any(|r| r.starts_with("prod/unknown")),
            "records left by the removed sandbox: {records:?}"
        );
        assert_eq!(pending(&node), BTreeMap::new(), "pending after removal");
        let table = policy_table(&node).unwrap_or_default();
        for ip in &unknown_ips {
            assert!(
                !table.contains(ip.as_str()),
                "{ip} left in the table:\n{table}"
            );
        }

        // The policy still holds: dev/other's probes are dropped while dev/client's, just
        // before, show the server up...
        let other_ns = netns_of(other.pid);
        let ns = other_ns.clone();
        // (dev/client's connect may take its time: it only has to show the server up.)
        let alive = in_netns(&netns_of(client.pid), move || {
            addresses.map(
                |to| match TcpStream::connect_timeout(&to, Duration::from_secs(2)) {
                    Ok(_) => Probe::Connected,
                    Err(_) => Probe::Unreachable,
                },
            )
        });
        let still = in_netns(&ns, move || addresses.map(probe));
        assert!(
            alive == [Probe::Connected; 2] && still == [Probe::Silent; 2],
            "dev/client (allowed) {alive:?} and dev/other (denied) {still:?} before the policy \
             was deleted: want connected and dropped\n{}\n{}",
            policy_table(&node).unwrap_or_default(),
            agent.log()
        );
        // ... and without the policy the server is open to both clients.
        delete_guard(&api, guard);
        let deleted = Instant::now();
        let mut opened = deleted;
        wait_until(SETTLE_LIMIT, "dev/other still cannot connect", || {
            let ns = other_ns.clone();
            opened = Instant::now();
            let outcomes = in_netns(&ns, move || addresses.map(probe));
            (outcomes == [Probe::Connected; 2])
                .then_some(())
                .ok_or_else(|| format!("{outcomes:?}\n{}", agent.log()))
        });
        println!(
            "  policy deleted: dev/other's first probes to connect over both families started \
             {:.1} ms after (a dropped probe takes {PROBE_TIMEOUT:?})",
            ms(opened, deleted)
        );
        for pod in [&client, &other] {
            for (to, from) in [(addresses[0], pod.v4), (addresses[1], pod.v6)] {
                let got = peer_seen(&netns_of(pod.pid), to).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(got, from.to_string(), "the server saw {} as", pod.name);
            }
        }

        // Removal leaves no record and no element of the pods in the table.
        drop(echo);
        remove_pods(&node, &[&client, &other, &server], &[]);
        assert_eq!(agent.records(), BTreeMap::new(), "records after removal");
        assert_eq!(pending(&node), BTreeMap::new(), "pending after removal");
        wait_until(
            SETTLE_LIMIT,
            "elements left in the NetworkPolicy table",
            || {
                let table = policy_table(&node).unwrap_or_default();
                (!table.contains("elements")).then_some(()).ok_or(table)
            },
        );
        drop(agent);
        drop(api);
        node.bridge().to_owned()
    };
    machine.assert_untouched(&bridge, &own);
}
