//! Hears of peers changed behind the agent's back. WireGuard's generic netlink family
//! sends no notification when a peer is added, changed or removed, so a thread of the
//! agent reads its device every [`INTERVAL`] (one dump over a socket of its own) and,
//! when the device's keys, port or peers' allowed IPs differ from the read before,
//! tells the reconciler to read the device again and wakes it: a peer deleted by hand
//! is back within about a second, not at the next resync. The agent's own changes are
//! seen the same way and cost one read of the device more.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cni_linux::netlink::wireguard::{WgDevice, WgPeer, Wireguard};
use ipnetwork::IpNetwork;

use crate::error::{Error, Result};
use crate::wake::Wake;

/// How often the device is read. At 5,000 peers a read is a dump of about a megabyte,
/// which the kernel answers in a few milliseconds.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Whether the device changed since the reconciler last asked.
#[derive(Debug, Default)]
pub struct PeersWatch {
    changed: AtomicBool,
}

impl PeersWatch {
    /// Whether the device changed since the last call.
    pub fn take_changed(&self) -> bool {
        self.changed.swap(false, Ordering::SeqCst)
    }

    /// The device changed: the next pass reads it.
    pub fn mark_changed(&self) {
        self.changed.store(true, Ordering::SeqCst);
    }

    /// The device reads as `now` after `before`: whether that is a change to act on.
    fn heard(&self, before: Option<u64>, now: Option<u64>) -> bool {
        let changed = before.is_some() && before != now;
        if changed {
            self.mark_changed();
        }
        changed
    }
}

/// What of a device the agent sets and a hand may change: its key, its port and each
/// peer's key and allowed IPs (not endpoints, which WireGuard moves itself when a peer
/// roams, nor handshakes and counters). A hash: the watch keeps 8 bytes however many
/// peers there are, and a change it would miss by a collision (one in 2^64) is still
/// repaired by the resync.
fn fingerprint(device: &WgDevice) -> u64 {
    let mut peers: Vec<&WgPeer> = device.peers.iter().collect();
    peers.sort_unstable_by_key(|p| p.public_key);
    let mut hasher = DefaultHasher::new();
    device.public_key.hash(&mut hasher);
    device.listen_port.hash(&mut hasher);
    let mut ips: Vec<IpNetwork> = Vec::new();
    for peer in peers {
        peer.public_key.hash(&mut hasher);
        ips.clear();
        ips.extend_from_slice(&peer.allowed_ips);
        ips.sort_unstable();
        ips.hash(&mut hasher);
    }
    hasher.finish()
}

/// Reads `device` every [`INTERVAL`] from a thread of its own; on a change, marks
/// `watch` and wakes the reconciler. A device that is missing or cannot be read reads as
/// nothing (the reconciler makes it again; its link's notification wakes it at once).
pub fn watch_peers(device: String, watch: Arc<PeersWatch>, wake: Arc<Wake>) -> Result<()> {
    std::thread::Builder::new()
        .name("wireguard-peers".into())
        .spawn(move || {
            let mut handle: Option<Wireguard> = None;
            let mut last: Option<u64> = None;
            loop {
                std::thread::sleep(INTERVAL);
                if handle.is_none() {
                    // Opened again until the module is there.
                    handle = Wireguard::open().ok();
                }
                let now = handle
                    .as_mut()
                    .and_then(|wg| wg.device(&device).ok())
                    .map(|d| fingerprint(&d));
                if watch.heard(last, now) {
                    tracing::debug!("encryption: {device} changed: reading it again");
                    wake.notify();
                }
                last = now;
            }
        })
        .map_err(|source| Error::Thread {
            name: "wireguard-peers",
            source,
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(n: u8, ips: &[&str]) -> WgPeer {
        WgPeer {
            public_key: [n; 32],
            endpoint: None,
            allowed_ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            last_handshake: None,
            rx_bytes: 0,
            tx_bytes: 0,
        }
    }

    fn device(peers: Vec<WgPeer>) -> WgDevice {
        WgDevice {
            public_key: Some([9; 32]),
            listen_port: 51830,
            peers,
            ..WgDevice::default()
        }
    }

    /// A peer gone or its allowed IPs changed is a change; the kernel's order, a roamed
    /// endpoint, a handshake or traffic are not.
    #[test]
    fn what_the_agent_sets_changes_the_fingerprint_and_nothing_else_does() {
        let both = device(vec![
            peer(1, &["10.1.0.0/24", "fd00:1::/64"]),
            peer(2, &["10.2.0.0/24"]),
        ]);
        let reordered = device(vec![
            peer(2, &["10.2.0.0/24"]),
            peer(1, &["fd00:1::/64", "10.1.0.0/24"]),
        ]);
        assert_eq!(fingerprint(&both), fingerprint(&reordered));
        let mut busy = both.clone();
        busy.peers[0].endpoint = Some("192.0.2.7:51830".parse().unwrap());
        busy.peers[0].rx_bytes = 1 << 20;
        busy.peers[0].last_handshake = Some(std::time::SystemTime::now());
        assert_eq!(fingerprint(&both), fingerprint(&busy));

        let one_gone = device(vec![peer(1, &["10.1.0.0/24", "fd00:1::/64"])]);
        assert_ne!(fingerprint(&both), fingerprint(&one_gone));
        let moved = device(vec![
            peer(1, &["10.1.0.0/24"]),
            peer(2, &["10.2.0.0/24", "fd00:1::/64"]),
        ]);
        assert_ne!(fingerprint(&both), fingerprint(&moved));
        let mut other_port = both.clone();
        other_port.listen_port = 51831;
        assert_ne!(fingerprint(&both), fingerprint(&other_port));
    }

    /// The first read is no change; a difference from the read before is, once.
    #[test]
    fn a_change_is_heard_against_the_read_before_and_taken_once() {
        let watch = PeersWatch::default();
        assert!(!watch.heard(None, Some(1)));
        assert!(!watch.heard(Some(1), Some(1)));
        assert!(!watch.take_changed());
        assert!(watch.heard(Some(1), Some(2)));
        assert!(watch.heard(Some(2), None), "the device gone");
        assert!(watch.take_changed());
        assert!(!watch.take_changed(), "taken once");
    }
}
