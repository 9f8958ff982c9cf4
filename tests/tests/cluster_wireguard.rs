//! `cni-node --encryption wireguard` for real, on a kernel with WireGuard (the
//! stock-kernel VM tier, tests/vm/run-vlan-tier.sh, runs it; a kernel without WireGuard
//! skips it with a message, a failure under `CNI_RS_REQUIRE_WIREGUARD=1`): three nodes,
//! 1 and 2 on one underlay segment and 3 behind a router on another
//! (`cni_blackbox::segments`), each encrypting, with a pod each. Once every node routes
//! the others' pod CIDRs through its WireGuard device, every pod reaches every other pod
//! in both families with its own address, a ping with "don't fragment" at the pod MTU
//! crosses between the segments, and a capture on the underlay (a packet socket in the
//! underlay namespace, every bridge port) holds, between nodes, only WireGuard's UDP
//! between node addresses: no frame carries a pod address or the probes' payload in
//! clear. Then, on the same cluster, the faults: the agents go quiet once converged
//! (their own changes do not wake them again); an agent SIGKILLed and restarted under a
//! ping every 10 ms keeps its device and loses no packet worth mentioning; a key rotated
//! with `cni-node rotate-key` under the same ping reaches the peers; with no resync
//! left to help, a peer removed by hand with `wg` and the device deleted by hand are
//! repaired; a node that turns encryption off is reached in clear by a node that does
//! not insist and is cut off from a strict one, and comes back encrypted; a renumbered
//! node's endpoint moves on every peer; a node deleted from the API leaves the others'
//! devices.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cni_blackbox::cluster::{API_V4, Host, WITHOUT_RESYNC, pod_cidr_v4, pod_cidr_v6, wait};
use cni_blackbox::hostport::in_netns;
use cni_blackbox::kernel::wireguard_probe;
use cni_blackbox::measured::{record, record_duration};
use cni_blackbox::segments::{Place, b_v4, b_v6, df_ping, node_at, two_segments};
use cni_blackbox::underlay::address;
use cni_blackbox::{Netns, plugin_path, require_root};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, recv, socket};

/// The underlay MTU.
const MTU: u32 = 1500;
/// The agents' WireGuard device and port (their defaults, passed explicitly).
const DEVICE: &str = "cni-wg0";
const PORT: u16 = 51830;
/// What the probes of `Cluster::check_pod_to_pod` carry (`unique_name("udp-token")`).
const PROBE_PAYLOAD: &[u8] = b"udp-token";

/// A node's state directory (its key file's), beside its other files.
fn state_dir(host: &Host) -> PathBuf {
    host.conf_dir
        .parent()
        .unwrap_or_else(|| panic!("{} has no parent", host.conf_dir.display()))
        .join("state")
}

/// Turns encryption on for a node, its state directory beside its other files.
fn encrypting(host: &mut Host) {
    let state = state_dir(host);
    host.extra_args.extend([
        "--encryption=wireguard".to_owned(),
        format!("--wireguard-device={DEVICE}"),
        format!("--wireguard-port={PORT}"),
        format!("--state-dir={}", state.display()),
    ]);
}

/// Whether every route of the agent in `host` to another node's pod CIDRs goes through
/// the WireGuard device.
fn routes_through_device(host: &Host, others: &[u8]) -> bool {
    others.iter().all(|&o| {
        [("-4", pod_cidr_v4(o)), ("-6", pod_cidr_v6(o))]
            .iter()
            .all(|(family, cidr)| {
                let out = host
                    .ns
                    .exec(&["ip", family, "route", "show", "proto", "77", cidr]);
                String::from_utf8_lossy(&out.stdout).contains(&format!("dev {DEVICE}"))
            })
    })
}

/// The MTU of `eth0` in `pod`.
fn pod_mtu(pod: &Netns) -> u32 {
    let out = pod.exec_ok(&["ip", "-o", "link", "show", "eth0"]);
    out.split_whitespace()
        .skip_while(|w| *w != "mtu")
        .nth(1)
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no MTU in {out:?}"))
}

/// A packet socket in `ns` taking every frame of every link there, read on a thread until
/// [`Capture::stop`].
struct Capture {
    stop: Arc<AtomicBool>,
    reader: JoinHandle<Vec<Vec<u8>>>,
}

impl Capture {
    fn start(ns: &Netns) -> Self {
        let sock: OwnedFd = in_netns(ns.path(), || {
            socket(
                AddressFamily::Packet,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::EthAll,
            )
            .unwrap_or_else(|e| panic!("packet socket: {e}"))
        });
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let reader = std::thread::spawn(move || {
            let mut frames = Vec::new();
            let mut buf = vec![0u8; 65536];
            while !stopped.load(Ordering::Relaxed) {
                let mut fds = [PollFd::new(
                    std::os::fd::AsFd::as_fd(&sock),
                    PollFlags::POLLIN,
                )];
                if poll(&mut fds, PollTimeout::from(100u8)).unwrap_or(0) == 0 {
                    continue;
                }
                match recv(sock.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
                    Ok(n) => frames.push(buf[..n].to_vec()),
                    Err(e) => assert!(
                        e == nix::errno::Errno::EAGAIN || e == nix::errno::Errno::EINTR,
                        "capture: {e}"
                    ),
                }
            }
            frames
        });
        Self { stop, reader }
    }

    /// Stops reading (after what is queued) and returns the frames.
    fn stop(self) -> Vec<Vec<u8>> {
        std::thread::sleep(Duration::from_millis(300));
        self.stop.store(true, Ordering::Relaxed);
        self.reader
            .join()
            .unwrap_or_else(|_| panic!("capture thread panicked"))
    }
}

/// What a captured frame is, for the verdict.
#[derive(Debug, PartialEq, Eq)]
enum Frame {
    /// UDP to or from the WireGuard port between two node addresses.
    Wireguard,
    /// To or from the API server, which listens on the underlay.
    Api,
    /// ARP, IPv6 neighbour discovery, multicast listener reports and the like.
    Control,
    /// Anything else between two hosts: a failure.
    Other(String),
}

/// Reads the IP header of an Ethernet frame.
fn classify(frame: &[u8], nodes: &[IpAddr]) -> Frame {
    let Some(ethertype) = frame.get(12..14) else {
        return Frame::Other("runt frame".into());
    };
    let ip = &frame[14..];
    let (src, dst, protocol, l4): (IpAddr, IpAddr, u8, &[u8]) = match ethertype {
        [0x08, 0x06] => return Frame::Control,
        [0x08, 0x00] if ip.len() >= 20 => {
            let header = usize::from(ip[0] & 0x0f) * 4;
            let addr =
                |at: usize| IpAddr::from(Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]));
            (
                addr(12),
                addr(16),
                ip[9],
                ip.get(header..).unwrap_or_default(),
            )
        }
        [0x86, 0xdd] if ip.len() >= 40 => {
            let addr = |at: usize| {
                let octets: [u8; 16] = ip[at..at + 16].try_into().unwrap_or_default();
                IpAddr::from(Ipv6Addr::from(octets))
            };
            (addr(8), addr(24), ip[6], &ip[40..])
        }
        other => return Frame::Other(format!("ethertype {other:02x?}")),
    };
    let api: IpAddr = API_V4.parse().unwrap_or_else(|e| panic!("{e}"));
    if src == api || dst == api {
        return Frame::Api;
    }
    // The links' own: IGMP, IPv6 hop-by-hop options (MLD), ICMPv6 router and neighbour
    // discovery and MLDv2 reports.
    if protocol == 2
        || protocol == 0
        || (protocol == 58 && matches!(l4.first(), Some(133..=137 | 143)))
    {
        return Frame::Control;
    }
    let ports = l4.get(..4).map(|p| {
        (
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        )
    });
    match (protocol, ports) {
        (17, Some((sport, dport)))
            if (sport == PORT || dport == PORT) && nodes.contains(&src) && nodes.contains(&dst) =>
        {
            Frame::Wireguard
        }
        _ => Frame::Other(format!(
            "protocol {protocol} {src} -> {dst} ports {ports:?}"
        )),
    }
}

/// The ping interval of the fault scenarios.
const PING_INTERVAL: Duration = Duration::from_millis(10);

/// `ping` every 10 ms from a pod to an address, until [`Pinger::stop`].
struct Pinger {
    child: Child,
}

impl Pinger {
    fn start(from: &Netns, to: IpAddr) -> Self {
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                from.name(),
                "ping",
                "-n",
                "-i",
                "0.01",
                "-W",
                "1",
            ])
            .arg(to.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start ping: {e}"));
        Self { child }
    }

    /// Interrupts ping and returns the longest run of lost echoes followed by an
    /// answered one, times the interval, and how many were sent.
    fn stop(mut self) -> (Duration, u64) {
        let pid = nix::unistd::Pid::from_raw(
            i32::try_from(self.child.id()).unwrap_or_else(|e| panic!("{e}")),
        );
        // Lets the last echoes come back first.
        std::thread::sleep(Duration::from_millis(300));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let mut out = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            let _ = stdout.read_to_string(&mut out);
        }
        let _ = self.child.wait();
        let answered: std::collections::BTreeSet<u64> = out
            .lines()
            .filter_map(|l| l.split("icmp_seq=").nth(1))
            .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
            .collect();
        (
            longest_gap(&answered),
            answered.last().copied().unwrap_or(0),
        )
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The longest run of sequence numbers missing between answered ones (from 1), times
/// the interval: echoes still in flight at the end are not a gap.
fn longest_gap(answered: &std::collections::BTreeSet<u64>) -> Duration {
    let mut last = 0;
    let mut longest = 0;
    for &seq in answered {
        longest = longest.max(seq.saturating_sub(last + 1));
        last = seq;
    }
    PING_INTERVAL * u32::try_from(longest).unwrap_or(u32::MAX)
}

/// The index of the WireGuard device in `host`.
fn device_index(host: &Host) -> String {
    let out = host.ns.exec_ok(&["ip", "-o", "link", "show", DEVICE]);
    out.split(':').next().unwrap_or_default().trim().to_owned()
}

/// The public key the API shows on node `n`.
fn published_key(cluster: &cni_blackbox::cluster::Cluster, n: u8) -> Option<String> {
    let node = cluster.api.get(
        cni_kube_api::Kind::Node,
        "",
        &cni_blackbox::cluster::node_name(n),
    )?;
    node["metadata"]["annotations"]["cni-plugins-rs.io/wireguard-public-key"]
        .as_str()
        .map(ToOwned::to_owned)
}

/// Waits until `what` holds, at most `limit`; how long it took.
fn took(limit: Duration, what: &str, ok: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    wait(limit, what, ok).unwrap_or_else(|e| panic!("{e}"));
    start.elapsed()
}

/// The public keys of the peers of node `host`'s device (`wg show`, as an operator
/// checks).
fn wg_peers(host: &Host) -> String {
    host.ns.exec_ok(&["wg", "show", DEVICE, "peers"])
}

/// Whether a ping from `from`'s first pod reaches `to`'s first pod (IPv4 and IPv6).
fn pods_reach(cluster: &cni_blackbox::cluster::Cluster, from: usize, to: usize) -> bool {
    let (a, b) = (&cluster.hosts[from].pods[0], &cluster.hosts[to].pods[0]);
    df_ping(&a.ns, b.v4, 56).is_ok() && df_ping(&a.ns, b.v6, 56).is_ok()
}

/// Node 1's device changed by hand, its agent running without a resync: a peer removed
/// with `wg` (WireGuard notifies nobody; the agent's watch of the device sees it) and
/// the device deleted (its link notification) are both repaired, and traffic flows.
fn by_hand(cluster: &mut cni_blackbox::cluster::Cluster) {
    let key3 = published_key(cluster, 3).unwrap_or_else(|| panic!("node-3 shows no key"));
    assert!(wg_peers(&cluster.hosts[0]).contains(&key3));
    cluster.hosts[0]
        .ns
        .exec_ok(&["wg", "set", DEVICE, "peer", &key3, "remove"]);
    let back = took(
        Duration::from_secs(30),
        "node 3's peer written again on node 1",
        || wg_peers(&cluster.hosts[0]).contains(&key3),
    );
    record_duration(
        "wireguard faults: peer removed by hand until written again",
        back,
    );
    assert!(
        cluster.hosts[0]
            .agent_log()
            .contains("lost 1 peer(s) behind the agent's back"),
        "node 1's agent did not say it lost the peer:\n{}",
        cluster.hosts[0].agent_log()
    );
    took(Duration::from_secs(30), "pod 1 reaches pod 3 again", || {
        pods_reach(cluster, 0, 2)
    });

    let key1 = published_key(cluster, 1).unwrap_or_else(|| panic!("node-1 shows no key"));
    cluster.hosts[0].ns.exec_ok(&["ip", "link", "del", DEVICE]);
    let back = took(
        Duration::from_secs(30),
        "node 1's device back with its key and routes",
        || {
            let host = &cluster.hosts[0];
            let key = host.ns.exec(&["wg", "show", DEVICE, "public-key"]);
            String::from_utf8_lossy(&key.stdout).trim() == key1
                && routes_through_device(host, &[2, 3])
        },
    );
    record_duration("wireguard faults: device deleted by hand until back", back);
    took(
        Duration::from_secs(30),
        "pod 1 reaches pod 3 through the new device",
        || pods_reach(cluster, 0, 2),
    );
}

/// Node 2 turns encryption off and node 3 turns strict mode on, as documented: node 1
/// (encrypting, not strict) reaches node 2 in clear and node 3 encrypted; node 3 and
/// node 2 are cut off from each other for pod traffic. Then node 2 turns encryption on
/// again with the key it had.
fn mixed_and_strict(cluster: &mut cni_blackbox::cluster::Cluster) {
    let kubeconfig = cluster.kubeconfig.clone();
    let plain: Vec<String> = cluster.hosts[1]
        .extra_args
        .iter()
        .filter(|a| {
            !["--encryption", "--wireguard-", "--state-dir"]
                .iter()
                .any(|flag| a.starts_with(flag))
        })
        .cloned()
        .collect();
    let encrypted = std::mem::replace(&mut cluster.hosts[1].extra_args, plain);
    cluster.hosts[1].kill_agent();
    cluster.hosts[1].start_agent(&kubeconfig);
    cluster.hosts[2]
        .extra_args
        .push("--encryption-strict".to_owned());
    cluster.hosts[2].kill_agent();
    cluster.hosts[2].start_agent(&kubeconfig);
    let settled = took(
        Duration::from_secs(120),
        "node 2 without a key and device, node 1 routing to it in clear, node 3 strict",
        || {
            published_key(cluster, 2).is_none()
                && !cluster.hosts[1]
                    .ns
                    .exec(&["ip", "link", "show", DEVICE])
                    .status
                    .success()
                && !routes_through_device(&cluster.hosts[0], &[2])
                && routes_through_device(&cluster.hosts[0], &[3])
                && cluster.hosts[2]
                    .ns
                    .exec(&["nft", "list", "table", "inet", "cni_node_encryption"])
                    .status
                    .success()
        },
    );
    record_duration(
        "wireguard mixed: node 2 off and node 3 strict, settled",
        settled,
    );
    took(
        Duration::from_secs(30),
        "pod 1 reaches pod 2 in clear",
        || pods_reach(cluster, 0, 1) && pods_reach(cluster, 1, 0),
    );
    took(
        Duration::from_secs(30),
        "pod 1 and pod 3 reach each other",
        || pods_reach(cluster, 0, 2) && pods_reach(cluster, 2, 0),
    );
    let (pod2, pod3) = (&cluster.hosts[1].pods[0], &cluster.hosts[2].pods[0]);
    for (from, to, what) in [
        (&pod3.ns, pod2.v4, "3 -> 2, IPv4"),
        (&pod3.ns, pod2.v6, "3 -> 2, IPv6"),
        (&pod2.ns, pod3.v4, "2 -> 3, IPv4"),
        (&pod2.ns, pod3.v6, "2 -> 3, IPv6"),
    ] {
        assert!(
            df_ping(from, to, 56).is_err(),
            "pod {what} crossed between a strict node and a node without a key"
        );
    }

    cluster.hosts[1].extra_args = encrypted;
    cluster.hosts[1].kill_agent();
    cluster.hosts[1].start_agent(&kubeconfig);
    took(
        Duration::from_secs(120),
        "node 2 encrypting again, node 1 and 3 routing to it through the device",
        || {
            published_key(cluster, 2).is_some()
                && routes_through_device(&cluster.hosts[0], &[2])
                && routes_through_device(&cluster.hosts[2], &[2])
        },
    );
    took(
        Duration::from_secs(30),
        "pod 3 and pod 2 reach each other again",
        || pods_reach(cluster, 2, 1) && pods_reach(cluster, 1, 2),
    );
}

/// Node 3 renumbered on its segment (the new addresses added, its Node updated, then
/// the old addresses removed): node 1's and node 2's peers of it move their endpoint to
/// the new address, and their pods reach node 3's pod once the old address is gone.
fn renumbered(cluster: &mut cni_blackbox::cluster::Cluster) {
    let (old_v4, old_v6) = (b_v4(3), b_v6(3));
    let new = Place {
        segment: 'B',
        v4: b_v4(33),
        v6: b_v6(33),
    };
    let ns = &cluster.hosts[2].ns;
    ns.exec_ok(&["sysctl", "-qw", "net.ipv4.conf.ul0.promote_secondaries=1"]);
    address(ns, &new.v4, "24");
    address(ns, &new.v6, "64");
    cluster.api.apply_node(node_at(3, &new));
    let endpoint = format!("{}:{PORT}", new.v4);
    let moved = took(
        Duration::from_secs(60),
        "node 1's and node 2's peer of node 3 at its new address",
        || {
            cluster.hosts[..2].iter().all(|h| {
                h.ns.exec_ok(&["wg", "show", DEVICE, "endpoints"])
                    .contains(&endpoint)
            })
        },
    );
    record_duration(
        "wireguard faults: node renumbered until both peers' endpoints moved",
        moved,
    );
    ns.exec_ok(&["ip", "addr", "del", &format!("{old_v4}/24"), "dev", "ul0"]);
    ns.exec_ok(&["ip", "addr", "del", &format!("{old_v6}/64"), "dev", "ul0"]);
    took(
        Duration::from_secs(30),
        "pods of node 1 and 2 reach node 3's pod at its node's new address",
        || pods_reach(cluster, 0, 2) && pods_reach(cluster, 1, 2),
    );
}

/// The faults, on the converged cluster of the test below.
fn faults(cluster: &mut cni_blackbox::cluster::Cluster) {
    // Quiet: converged agents make no pass but the resync (every 10 s), whatever they
    // changed themselves a moment ago.
    for host in &cluster.hosts {
        host.wait_until_quiet(Duration::from_secs(4));
    }
    let before: Vec<f64> = cluster
        .hosts
        .iter()
        .map(|h| h.passes().unwrap_or(0.0))
        .collect();
    std::thread::sleep(Duration::from_secs(10));
    for (host, before) in cluster.hosts.iter().zip(before) {
        let passes = host.passes().unwrap_or(0.0) - before;
        record(
            &format!(
                "wireguard faults: node {} passes in 10 s once quiet",
                host.n
            ),
            passes,
            "count",
        );
        assert!(
            passes <= 2.0,
            "node {}: {passes} passes in 10 s with nothing changing (the resync is every 10 s)\nagent log:\n{}",
            host.n,
            host.agent_log()
        );
    }

    let pod_of = |cluster: &cni_blackbox::cluster::Cluster, n: u8| -> (String, IpAddr) {
        let host = cluster.node(n);
        (host.pods[0].ns.name().to_owned(), host.pods[0].v4)
    };
    let (_, to_v4) = pod_of(cluster, 3);
    let kubeconfig = cluster.kubeconfig.clone();

    // SIGKILL and restart node 1's agent under a ping from its pod to node 3's.
    let index = device_index(&cluster.hosts[0]);
    let ping = Pinger::start(&cluster.hosts[0].pods[0].ns, to_v4);
    std::thread::sleep(Duration::from_millis(500));
    let restart = Instant::now();
    let host = &mut cluster.hosts[0];
    host.kill_agent();
    // From here on node 1 makes no resync: what it repairs below, its events did.
    host.resync_secs = WITHOUT_RESYNC;
    host.start_agent(&kubeconfig);
    wait(
        Duration::from_secs(120),
        "the restarted agent's first pass",
        || host.passes().is_some_and(|p| p >= 1.0),
    )
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", host.agent_log()));
    record_duration(
        "wireguard faults: SIGKILL until the new agent's first pass",
        restart.elapsed(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let (gap, sent) = ping.stop();
    record(
        "wireguard faults: restart: pings sent",
        sent as f64,
        "count",
    );
    record_duration("wireguard faults: restart: longest ping gap", gap);
    assert!(sent > 0, "no ping answered at all across the restart");
    assert_eq!(
        device_index(&cluster.hosts[0]),
        index,
        "the device was not kept"
    );
    assert!(
        gap <= Duration::from_millis(100),
        "a gap of {gap:?} across the restart (the device and its peers stay)"
    );

    // Rotation on node 1 under the same ping: node 2 and 3 replace its peer.
    let ping = Pinger::start(&cluster.hosts[0].pods[0].ns, to_v4);
    std::thread::sleep(Duration::from_millis(500));
    let rotated = Instant::now();
    let out = Command::new(plugin_path("cni-node"))
        .args(["rotate-key", "--state-dir"])
        .arg(state_dir(&cluster.hosts[0]))
        .output()
        .unwrap_or_else(|e| panic!("cni-node rotate-key: {e}"));
    assert!(
        out.status.success(),
        "rotate-key: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let new_key = stdout
        .split_whitespace()
        .find(|w| w.len() == 44 && w.ends_with('='))
        .unwrap_or_else(|| panic!("no public key in {stdout:?}"))
        .to_owned();
    let peer_line = format!("peer node-1 ({new_key})");
    let follow = took(
        Duration::from_secs(60),
        "node 2 and 3 peer node 1's new key",
        || {
            cluster.hosts[1..]
                .iter()
                .all(|h| h.agent_log().contains(&peer_line))
        },
    );
    record_duration(
        "wireguard faults: rotate-key until both peers have the new key",
        follow,
    );
    assert_eq!(published_key(cluster, 1).as_deref(), Some(new_key.as_str()));
    // The ping goes on until an echo crosses again, plus a moment.
    std::thread::sleep(Duration::from_secs(2));
    let (gap, sent) = ping.stop();
    record_duration("wireguard faults: rotation: longest ping gap", gap);
    record_duration(
        "wireguard faults: rotation: whole scenario",
        rotated.elapsed(),
    );
    assert!(sent > 0, "no ping answered at all across the rotation");
    // WireGuard retries a handshake every 5 s: the gap is the peers' delay and one retry.
    assert!(
        gap <= follow + Duration::from_secs(6),
        "a gap of {gap:?}: more than the peers' {follow:?} and one handshake"
    );

    by_hand(cluster);
    mixed_and_strict(cluster);
    renumbered(cluster);

    // Node 2 deleted from the API: its peer leaves node 1 and 3.
    let key2 = published_key(cluster, 2).unwrap_or_else(|| panic!("node-2 shows no key"));
    let removed_line = format!("removed the peer {key2}");
    assert!(
        cluster
            .api
            .delete_node(&cni_blackbox::cluster::node_name(2))
    );
    let gone = took(
        Duration::from_secs(60),
        "node 2's peer removed from node 1 and 3",
        || {
            [0, 2]
                .iter()
                .all(|&i| cluster.hosts[i].agent_log().contains(&removed_line))
        },
    );
    record_duration(
        "wireguard faults: node deleted until its peer left both others",
        gone,
    );
}

#[test]
fn encrypted_pod_traffic_crosses_the_underlay_only_as_wireguard_between_nodes() {
    let test = "encrypted_pod_traffic_crosses_the_underlay_only_as_wireguard_between_nodes";
    if !require_root() || wireguard_probe(test).is_none() {
        return;
    }
    let started = Instant::now();
    let (mut cluster, _router, places) = two_segments(&[1, 2], &[3], MTU);
    record_duration(
        "wireguard cluster: underlay, router and 3 node namespaces made",
        started.elapsed(),
    );
    let agents = Instant::now();
    for (n, place) in &places {
        cluster.api.apply_node(node_at(*n, place));
    }
    let kubeconfig = cluster.kubeconfig.clone();
    for host in &mut cluster.hosts {
        encrypting(host);
        host.start_agent(&kubeconfig);
    }
    // Bounds fit for emulation, where starting a process is 20-60 times slower.
    for host in &cluster.hosts {
        wait(Duration::from_secs(120), "the conflist", || {
            host.conflist().is_some()
        })
        .unwrap_or_else(|e| panic!("node {}: {e}\nagent log:\n{}", host.n, host.agent_log()));
    }
    let numbers: Vec<u8> = places.keys().copied().collect();
    for host in &cluster.hosts {
        let others: Vec<u8> = numbers.iter().copied().filter(|&o| o != host.n).collect();
        wait(
            Duration::from_secs(120),
            "routes through the WireGuard device",
            || routes_through_device(host, &others),
        )
        .unwrap_or_else(|e| {
            panic!(
                "node {}: {e}\n{}{}\nagent log:\n{}",
                host.n,
                host.ns.exec_ok(&["ip", "-4", "route"]),
                host.ns.exec_ok(&["ip", "-6", "route"]),
                host.agent_log()
            )
        });
    }
    record_duration(
        "wireguard cluster: 3 agents started until every route goes through the device",
        agents.elapsed(),
    );
    let pods = Instant::now();
    for host in &mut cluster.hosts {
        host.add_pod();
    }

    record_duration(
        "wireguard cluster: 3 pods added with cnitool",
        pods.elapsed(),
    );
    let capture = Capture::start(&cluster.underlay);
    let crossing = Instant::now();
    cluster.check_pod_to_pod();
    record_duration(
        "wireguard cluster: pod to pod, 6 pairs x 2 families",
        crossing.elapsed(),
    );

    // Don't fragment, at the pod MTU, between the segments (through the router) and on
    // one segment, both families.
    let mtu = pod_mtu(&cluster.hosts[0].pods[0].ns);
    assert!(
        mtu <= MTU - 60,
        "pod MTU {mtu} leaves no room for WireGuard's 60 bytes"
    );
    record("wireguard cluster: pod MTU", f64::from(mtu), "bytes");
    let pod = |n: u8| {
        let host = cluster.node(n);
        &host.pods[0]
    };
    for (from, to) in [(1, 3), (3, 1), (1, 2)] {
        let (a, b) = (pod(from), pod(to));
        df_ping(&a.ns, b.v4, mtu - 28).unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
        df_ping(&a.ns, b.v6, mtu - 48).unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
    }
    let frames = capture.stop();

    let nodes: Vec<IpAddr> = places
        .values()
        .flat_map(|p: &Place| [p.v4.parse(), p.v6.parse()])
        .map(|ip| ip.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let mut wireguard = 0;
    let mut problems = Vec::new();
    for frame in &frames {
        if frame
            .windows(PROBE_PAYLOAD.len())
            .any(|w| w == PROBE_PAYLOAD)
        {
            problems.push("a probe's payload crossed the underlay in clear".to_owned());
        }
        match classify(frame, &nodes) {
            Frame::Wireguard => wireguard += 1,
            Frame::Api | Frame::Control => {}
            Frame::Other(what) => problems.push(what),
        }
    }
    problems.sort();
    problems.dedup();
    assert!(
        problems.is_empty(),
        "{} frames captured, {wireguard} of WireGuard; not WireGuard between nodes:\n{}",
        frames.len(),
        problems.join("\n")
    );
    assert!(
        wireguard > 0,
        "the capture saw no WireGuard at all ({} frames)",
        frames.len()
    );
    record(
        "wireguard cluster: WireGuard frames captured on the underlay",
        f64::from(wireguard),
        "count",
    );
    let faults_started = Instant::now();
    faults(&mut cluster);
    record_duration("wireguard faults: all scenarios", faults_started.elapsed());
    record_duration("wireguard cluster: whole test", started.elapsed());
}

/// An Ethernet frame carrying an IP packet of `protocol` from `src` to `dst` whose first
/// payload bytes are `l4`.
fn frame(src: &str, dst: &str, protocol: u8, l4: &[u8]) -> Vec<u8> {
    let (src, dst): (IpAddr, IpAddr) = (src.parse().unwrap(), dst.parse().unwrap());
    let mut f = vec![0u8; 12];
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 0, 0, 0, 0, 0, 64, protocol, 0, 0]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 0, protocol, 64]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        _ => panic!("mixed families"),
    }
    f.extend_from_slice(l4);
    f
}

#[test]
fn a_gap_is_the_longest_run_of_lost_echoes_between_answered_ones() {
    let seqs = |v: &[u64]| {
        v.iter()
            .copied()
            .collect::<std::collections::BTreeSet<u64>>()
    };
    assert_eq!(longest_gap(&seqs(&[1, 2, 3, 4])), Duration::ZERO);
    assert_eq!(longest_gap(&seqs(&[1, 2, 6, 7, 9])), PING_INTERVAL * 3);
    assert_eq!(
        longest_gap(&seqs(&[3, 4])),
        PING_INTERVAL * 2,
        "lost from the start"
    );
}

#[test]
fn the_capture_verdict_tells_wireguard_from_anything_in_clear() {
    let nodes: Vec<IpAddr> = ["198.18.0.11", "198.19.0.13", "fd00:18::11"]
        .iter()
        .map(|ip| ip.parse().unwrap())
        .collect();
    let [hi, lo] = PORT.to_be_bytes();
    let wg_ports = [hi, lo, hi, lo];
    let pod_ports = [0x30, 0x39, 0x30, 0x39];
    let verdict = |src, dst, protocol, l4: &[u8]| classify(&frame(src, dst, protocol, l4), &nodes);
    assert_eq!(
        verdict("198.18.0.11", "198.19.0.13", 17, &wg_ports),
        Frame::Wireguard
    );
    assert_eq!(
        verdict("fd00:18::11", "fd00:18::11", 17, &wg_ports),
        Frame::Wireguard
    );
    assert_eq!(verdict("198.18.0.11", API_V4, 6, &pod_ports), Frame::Api);
    assert_eq!(
        verdict("fe80::1", "ff02::1:ff00:11", 58, &[135]),
        Frame::Control
    );
    let mut arp = vec![0u8; 12];
    arp.extend_from_slice(&[0x08, 0x06, 0, 1]);
    assert_eq!(classify(&arp, &nodes), Frame::Control);
    // Pod traffic in clear, other ports between nodes, a node talking to a stranger, an
    // ICMP error: all failures.
    for (src, dst, protocol, l4) in [
        ("10.244.1.2", "10.244.3.2", 17, &pod_ports[..]),
        ("198.18.0.11", "198.19.0.13", 17, &pod_ports[..]),
        ("198.18.0.11", "198.18.0.99", 17, &wg_ports[..]),
        ("198.18.0.11", "198.19.0.13", 1, &[3, 4][..]),
        ("fd00:244:0:1::2", "fd00:244:0:3::2", 58, &[128][..]),
    ] {
        assert!(
            matches!(verdict(src, dst, protocol, l4), Frame::Other(_)),
            "{src} -> {dst} protocol {protocol}"
        );
    }
}
