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
//! clear.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cni_blackbox::cluster::{API_V4, Host, pod_cidr_v4, pod_cidr_v6, wait};
use cni_blackbox::hostport::in_netns;
use cni_blackbox::measured::{record, record_duration};
use cni_blackbox::segments::{Place, df_ping, node_at, two_segments};
use cni_blackbox::{Netns, require_root};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, recv, socket};

/// The underlay MTU.
const MTU: u32 = 1500;
/// The agents' WireGuard device and port (their defaults, passed explicitly).
const DEVICE: &str = "cni-wg0";
const PORT: u16 = 51830;
/// What the probes of `Cluster::check_pod_to_pod` carry (`unique_name("udp-token")`).
const PROBE_PAYLOAD: &[u8] = b"udp-token";

/// Whether the kernel makes WireGuard links (tried in a throwaway namespace); a kernel
/// that does not is a skip, or a failure under `CNI_RS_REQUIRE_WIREGUARD=1`.
fn kernel_has_wireguard(test: &str) -> bool {
    let probe = Netns::new("cnibb-wg-probe");
    let out = probe.exec(&["ip", "link", "add", "wg-probe", "type", "wireguard"]);
    if out.status.success() {
        return true;
    }
    let why = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert!(
        std::env::var("CNI_RS_REQUIRE_WIREGUARD").as_deref() != Ok("1"),
        "{test}: CNI_RS_REQUIRE_WIREGUARD=1 but this kernel makes no WireGuard link: {why}"
    );
    eprintln!("skipping {test}: this kernel makes no WireGuard link ({why})");
    false
}

/// Turns encryption on for a node, its state directory beside its other files.
fn encrypting(host: &mut Host) {
    let state = host
        .conf_dir
        .parent()
        .unwrap_or_else(|| panic!("{} has no parent", host.conf_dir.display()))
        .join("state");
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

#[test]
fn encrypted_pod_traffic_crosses_the_underlay_only_as_wireguard_between_nodes() {
    let test = "encrypted_pod_traffic_crosses_the_underlay_only_as_wireguard_between_nodes";
    if !require_root() || !kernel_has_wireguard(test) {
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
        let host = cluster
            .hosts
            .iter()
            .find(|h| h.n == n)
            .unwrap_or_else(|| panic!("node {n}"));
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
