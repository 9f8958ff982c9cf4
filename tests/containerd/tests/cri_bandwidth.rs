//! The pod bandwidth annotations through containerd's CRI and the node agent's
//! conflist: containerd turns `kubernetes.io/ingress-bandwidth` and
//! `kubernetes.io/egress-bandwidth` into the `bandwidth` capability's runtime config
//! with a burst of 2^32-1 bits, and the conflist's `maxBurstMs` must hold the pod to
//! its rate from the first second; a pod without annotations is not shaped.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use cni_blackbox::hostport::{in_netns, netns_of};
use cni_blackbox::{require_root, unique_name};
use cni_containerd_suite::{Containerd, NETWORK, PodMeta};
use cni_node::conflist::{ConflistSettings, render};

const POD_CIDR: &str = "10.244.77.0/24";
/// Bound on containerd noticing the conflist.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);
/// TCP payload per full-size segment and what the token bucket counts for it.
const SEGMENT_PAYLOAD: f64 = 1448.0;
const SEGMENT_ON_WIRE: f64 = 1514.0;

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// Root and containerd (without them the test skips).
fn require_containerd() -> bool {
    require_root()
        && ["containerd", "containerd-shim-runc-v2", "runc"]
            .into_iter()
            .all(on_path)
}

/// A ready pod's sandbox pid and IPv4 address.
fn run_pod(node: &Containerd, name: &str, annotations: &[(&str, &str)]) -> (u32, IpAddr) {
    let uid = unique_name("uid");
    let pod = PodMeta {
        namespace: "default",
        name,
        uid: &uid,
        labels: &[("app", "cnibb")],
    };
    let id = node
        .cri()
        .run_annotated_pod_sandbox(&pod, node.cgroup_parent(), &[], annotations)
        .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}\n{}", node.log()));
    let status = node.cri().sandbox(&id).expect("PodSandboxStatus");
    assert!(status.pid > 0, "no sandbox pid: {status:?}");
    let ip = status
        .ips
        .first()
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("no pod IP: {status:?}"));
    (status.pid, ip)
}

/// Sends TCP from the netns `from` to `to` (a listener in `to_ns`) for 1.5 s and
/// returns the rate the receiver saw in the first second from its first byte, with
/// headers as the token bucket counts them, in bit/s.
fn first_second_rate(from: &Path, to_ns: &Path, to: SocketAddr) -> f64 {
    let listener = in_netns(to_ns, move || {
        std::net::TcpListener::bind(to).unwrap_or_else(|e| panic!("bind {to}: {e}"))
    });
    let receiver = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 16];
        let (mut first, mut counted) = (None, 0u64);
        loop {
            let n = stream.read(&mut buf).unwrap_or(0);
            if n == 0 {
                break;
            }
            let now = Instant::now();
            if now - *first.get_or_insert(now) < Duration::from_secs(1) {
                counted += n as u64;
            }
        }
        counted as f64 * 8.0
    });
    let mut stream = in_netns(from, move || {
        std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect {to}: {e}"))
    });
    let chunk = vec![0x5au8; 1 << 16];
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        if stream.write_all(&chunk).is_err() {
            break;
        }
    }
    drop(stream);
    receiver.join().expect("receiver") * SEGMENT_ON_WIRE / SEGMENT_PAYLOAD
}

#[test]
fn annotated_pods_are_shaped_from_the_first_second_and_others_not_at_all() {
    if !require_containerd() {
        return;
    }
    let node = Containerd::start_without_template();
    let settings = ConflistSettings {
        network_name: NETWORK.into(),
        bridge: node.bridge().into(),
        ipam_data_dir: Some(node.ipam_dir().to_string_lossy().into_owned()),
        portmap: true,
        bandwidth: true,
        pod_record_dir: None,
    };
    let cidr = POD_CIDR.parse().expect("pod CIDR");
    std::fs::write(
        node.conf_dir().join("10-cni-plugins-rs.conflist"),
        render(&[cidr], 1500, &settings),
    )
    .expect("write the conflist");
    let deadline = Instant::now() + SETTLE_LIMIT;
    while !node.cri().status().expect("Status").network_ready {
        assert!(
            Instant::now() < deadline,
            "NetworkReady still false\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let limited = run_pod(
        &node,
        "limited",
        &[
            ("kubernetes.io/ingress-bandwidth", "10M"),
            ("kubernetes.io/egress-bandwidth", "10M"),
        ],
    );
    let free = run_pod(&node, "free", &[]);
    let peer = run_pod(&node, "peer", &[]);
    let rate = 10e6;
    let at = |(_, ip): (u32, IpAddr), port: u16| SocketAddr::new(ip, port);
    let ns = |(pid, _): (u32, IpAddr)| netns_of(pid);

    let into = first_second_rate(&ns(peer), &ns(limited), at(limited, 5301));
    let out_of = first_second_rate(&ns(limited), &ns(peer), at(peer, 5302));
    for (direction, measured) in [("into", into), ("out of", out_of)] {
        cni_blackbox::measured::record(
            &format!("bandwidth via CRI: first second of TCP {direction} a pod annotated 10M"),
            measured / 1e6,
            "Mbit/s",
        );
        assert!(
            (0.5 * rate..=1.15 * rate).contains(&measured),
            "first second {direction} the annotated pod: {:.2} Mbit/s, not within +15% of 10\n{}",
            measured / 1e6,
            node.log()
        );
    }
    let unshaped = first_second_rate(&ns(peer), &ns(free), at(free, 5303));
    cni_blackbox::measured::record(
        "bandwidth via CRI: first second of TCP into a pod without annotations",
        unshaped / 1e6,
        "Mbit/s",
    );
    assert!(
        unshaped >= 5.0 * rate,
        "first second into the pod without annotations: {:.2} Mbit/s, expected far above 10",
        unshaped / 1e6
    );
}
