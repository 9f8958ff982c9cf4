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
//! writes, and the agent routes another node's pod CIDRs and masquerades egress. Every
//! test also checks that the machine's own netns, /run and /var/lib were not touched.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cni_blackbox::hostport::in_netns;
use cni_blackbox::{plugin_path, require_root, unique_name};
use cni_containerd_suite::cri::{HostPort, Protocol};
use cni_containerd_suite::{Containerd, NETWORK, PodMeta, ping_from};
use cni_kube_api::{ApiServer, realistic_namespace, realistic_node, realistic_pod};

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
    /// agent and containerd's private tmpfs for the plugins.
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
            .arg("--resync-interval=1")
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
