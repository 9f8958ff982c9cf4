//! Host port probes: a TCP server in a pod that answers each connection with the source
//! address it saw, clients in any netns, and a "node uplink" to a client netns (another
//! machine on the node's network). Namespaces are named by path, so pods of containerd
//! or Podman (`/proc/<pid>/ns/net`) work as well as [`Netns`] ones.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::Netns;

/// The node's IPv4 address on its uplink.
pub const NODE_V4: &str = "192.0.2.1";
/// The node's IPv6 address on its uplink.
pub const NODE_V6: &str = "fd00:2::1";
/// The IPv4 address of the client beside the node.
pub const CLIENT_V4: &str = "192.0.2.2";
/// The IPv6 address of the client beside the node.
pub const CLIENT_V6: &str = "fd00:2::2";

/// Runs `work` on a thread inside the netns at `netns`.
pub fn in_netns<T: Send + 'static>(netns: &Path, work: impl FnOnce() -> T + Send + 'static) -> T {
    let path = netns.to_path_buf();
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|e| panic!("setns {}: {e}", path.display()));
        work()
    })
    .join()
    .unwrap_or_else(|_| panic!("a thread in {} panicked", netns.display()))
}

/// A TCP server on `port` (both families) in the netns at `pod`: answers each
/// connection with the peer address it saw, for as long as the process runs.
pub fn serve_peer_address(pod: &Path, port: u16) {
    let listener = in_netns(pod, move || {
        TcpListener::bind(("::", port)).unwrap_or_else(|e| panic!("bind [::]:{port}: {e}"))
    });
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let peer = stream
                .peer_addr()
                .map(|a| a.ip().to_canonical().to_string())
                .unwrap_or_default();
            let _ = stream.write_all(peer.as_bytes());
        }
    });
}

/// Connects from the netns at `from` to `to` (retrying for up to 5 s) and returns the
/// source address the server reported.
pub fn peer_seen(from: &Path, to: SocketAddr) -> Result<String, String> {
    in_netns(from, move || {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let attempt =
                TcpStream::connect_timeout(&to, Duration::from_secs(2)).and_then(|mut s| {
                    s.set_read_timeout(Some(Duration::from_secs(2)))?;
                    let mut seen = String::new();
                    s.read_to_string(&mut seen)?;
                    Ok(seen)
                });
            match attempt {
                Ok(seen) if !seen.is_empty() => return Ok(seen),
                Ok(_) | Err(_) if Instant::now() < deadline => {}
                Ok(_) => return Err(format!("{to}: empty answer")),
                Err(e) => return Err(format!("{to}: {e}")),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// `ip:port` as a socket address.
pub fn socket(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}")), port)
}

/// A client netns joined to `host` by a veth (`uplink` in the host, with [`NODE_V4`] and
/// [`NODE_V6`]; the client holds [`CLIENT_V4`] and [`CLIENT_V6`]), with forwarding on in
/// the host. The veth goes with the client netns.
pub fn client_on_uplink(host: &Netns) -> Netns {
    let client = Netns::new("cnibb-client");
    client.exec_ok(&["ip", "link", "set", "lo", "up"]);
    host.exec_ok(&["ip", "link", "set", "lo", "up"]);
    host.exec_ok(&[
        "ip",
        "link",
        "add",
        "uplink",
        "type",
        "veth",
        "peer",
        "name",
        "uplink-peer",
    ]);
    host.exec_ok(&["ip", "link", "set", "uplink-peer", "netns", client.name()]);
    for (ns, dev, v4, v6) in [
        (host, "uplink", NODE_V4, NODE_V6),
        (&client, "uplink-peer", CLIENT_V4, CLIENT_V6),
    ] {
        ns.exec_ok(&["ip", "addr", "add", &format!("{v4}/24"), "dev", dev]);
        ns.exec_ok(&[
            "ip",
            "addr",
            "add",
            &format!("{v6}/64"),
            "dev",
            dev,
            "nodad",
        ]);
        ns.exec_ok(&["ip", "link", "set", dev, "up"]);
    }
    for sysctl in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
        host.exec_ok(&["sysctl", "-qw", sysctl]);
    }
    client
}

/// The netns path of a process (a pod's sandbox process).
pub fn netns_of(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/net"))
}

/// The portmap plugin's per-container iptables chain, as the reference names it:
/// `CNI-DN-` + the first 21 hex digits of SHA-512(network + container ID).
pub fn dnat_chain(network: &str, container_id: &str) -> String {
    use std::process::{Command, Stdio};
    let mut child = Command::new("sha512sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("sha512sum: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(format!("{network}{container_id}").as_bytes())
            .unwrap_or_else(|e| panic!("write to sha512sum: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("sha512sum: {e}"));
    let hex = String::from_utf8_lossy(&out.stdout);
    format!("CNI-DN-{}", hex.get(..21).unwrap_or_default())
}
