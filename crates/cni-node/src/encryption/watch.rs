//! Hears of peers changed behind the agent's back. WireGuard's generic netlink family
//! sends no notification when a peer is added, changed or removed, so a thread of the
//! agent reads its device every [`INTERVAL`] (one dump over a socket of its own) and
//! compares it with what the reconciler last said the device holds
//! ([`PeersWatch::expect`]): when the two differ, it tells the reconciler to read the
//! device again and wakes it, so a peer deleted by hand is back within about a second,
//! not at the next resync. The agent's own changes are what it expects: they cost no
//! read more. A read gives way to the reconciler's passes ([`PeersWatch::pass`]): at
//! thousands of peers it takes as long as a step of a pass, on a CPU the pass and the
//! node's pods need, and a device read while the pass writes it would only differ from
//! what the reconciler is about to say it holds.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cni_linux::netlink::wireguard::{WgDevice, Wireguard};
use ipnetwork::IpNetwork;

use crate::error::{Error, Result};
use crate::wake::Wake;

/// How often the device is read. At 5,000 peers a read is a dump of about a megabyte,
/// which the kernel answers in a few milliseconds.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The longest a read waits for the reconciler's passes, from when it was due: under
/// changes that keep the reconciler busy, a peer deleted by hand is still back within a
/// few seconds, not at the resync.
pub const GIVE_WAY_AT_MOST: Duration = Duration::from_secs(3);

/// How often a read that gives way looks whether the pass has ended.
const GIVE_WAY_POLL: Duration = Duration::from_millis(10);

/// What the reconciler and the watch tell each other of the device.
#[derive(Debug, Default)]
pub struct PeersWatch {
    /// The device differs from what the reconciler holds: the next pass reads it.
    changed: AtomicBool,
    /// The fingerprint of what the reconciler last said the device holds; `None`: it
    /// does not know (then two reads that differ are a change).
    expected: Mutex<Option<u64>>,
    /// A pass of the reconciler runs.
    passing: AtomicBool,
}

/// A pass of the reconciler, from [`PeersWatch::pass`] until it is dropped.
#[derive(Debug)]
pub struct Pass(Arc<PeersWatch>);

impl Drop for Pass {
    fn drop(&mut self) {
        self.0.passing.store(false, Ordering::SeqCst);
    }
}

impl PeersWatch {
    /// Whether the device changed since the last call.
    pub fn take_changed(&self) -> bool {
        self.changed.swap(false, Ordering::SeqCst)
    }

    /// A pass of the reconciler starts: the watch's reads give way until the returned
    /// mark is dropped.
    pub fn pass(self: &Arc<Self>) -> Pass {
        self.passing.store(true, Ordering::SeqCst);
        Pass(Arc::clone(self))
    }

    /// Whether a pass runs.
    pub(crate) fn in_pass(&self) -> bool {
        self.passing.load(Ordering::SeqCst)
    }

    /// The device changed: the next pass reads it.
    pub fn mark_changed(&self) {
        self.changed.store(true, Ordering::SeqCst);
    }

    /// The device holds what `fingerprint` says (`None`: the reconciler does not know).
    pub fn expect(&self, fingerprint: Option<u64>) {
        *self.expected.lock().unwrap_or_else(PoisonError::into_inner) = fingerprint;
    }

    /// What the reconciler last said the device holds.
    pub fn expected(&self) -> Option<u64> {
        *self.expected.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The device reads as `now`, after `before` (the watch's last read): whether that
    /// is a change to act on. Against a known expectation, a device that differs from
    /// it is, once per distinct reading (a difference the reconciler cannot mend is not
    /// heard again every second); without one, a reading that differs from the last.
    fn heard(&self, before: Option<u64>, now: Option<u64>) -> bool {
        let changed = match self.expected() {
            Some(expected) => now.is_some() && now != Some(expected) && now != before,
            None => before.is_some() && before != now,
        };
        if changed {
            self.mark_changed();
        }
        changed
    }
}

/// What of a device the agent sets and a hand may change: its public key, its port and
/// each peer's key and allowed IPs (not endpoints, which WireGuard moves itself when a
/// peer roams, nor handshakes and counters), in any order. A hash (peers combined
/// without regard to order): the watch keeps 8 bytes however many peers there are, and
/// a change it would miss by a collision (one in 2^64) is still repaired by the resync.
/// It is [`device_hash`] plus each peer's [`peer_hash`], so that the reconciler keeps the
/// sum of its known peers' as it writes them instead of hashing thousands each pass.
pub fn fingerprint<'a>(
    public_key: Option<&[u8; 32]>,
    port: u16,
    peers: impl Iterator<Item = (&'a [u8; 32], &'a [IpNetwork])>,
) -> u64 {
    peers.fold(device_hash(public_key, port), |sum, (key, allowed)| {
        sum.wrapping_add(peer_hash(key, allowed))
    })
}

/// The device's own share of a [`fingerprint`]: its public key and port.
pub fn device_hash(public_key: Option<&[u8; 32]>, port: u16) -> u64 {
    let mut hasher = DefaultHasher::new();
    public_key.hash(&mut hasher);
    port.hash(&mut hasher);
    hasher.finish()
}

/// One peer's share of a [`fingerprint`]: its key and its allowed IPs in any order.
/// Shares are summed, not xored: two peers with one hash would cancel out in a xor.
pub fn peer_hash(key: &[u8; 32], allowed: &[IpNetwork]) -> u64 {
    // The allowed IPs summed as well (the kernel holds each once per peer), so that
    // their order needs no sorted copy.
    let ips = allowed.iter().fold(0u64, |sum, ip| {
        let mut hasher = DefaultHasher::new();
        ip.hash(&mut hasher);
        sum.wrapping_add(hasher.finish())
    });
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    ips.hash(&mut hasher);
    allowed.len().hash(&mut hasher);
    hasher.finish()
}

fn fingerprint_of(device: &WgDevice) -> u64 {
    fingerprint(
        device.public_key.as_ref(),
        device.listen_port,
        device
            .peers
            .iter()
            .map(|p| (&p.public_key, p.allowed_ips.as_slice())),
    )
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
                let now = read_between_passes(&watch, Instant::now(), |give_up| {
                    if handle.is_none() {
                        // Opened again until the module is there.
                        handle = Wireguard::open().ok();
                    }
                    let Some(wg) = handle.as_mut() else {
                        return Some(None);
                    };
                    match wg.device_unless(&device, give_up) {
                        Ok(Some(d)) => Some(Some(fingerprint_of(&d))),
                        Ok(None) => {
                            // Its socket still holds the dump given up.
                            handle = None;
                            None
                        }
                        Err(_) => Some(None),
                    }
                });
                if watch.heard(last, now) {
                    tracing::debug!("encryption: {device} is not as the agent left it");
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

/// Reads with `read` while no pass of the reconciler runs: it waits for a pass to end,
/// and a read that a pass starts during is given up (`read` is handed the question and
/// returns `None` when it gave up) and made again after it. From [`GIVE_WAY_AT_MOST`]
/// after `due` on, it reads whether a pass runs or not.
fn read_between_passes<T>(
    watch: &PeersWatch,
    due: Instant,
    mut read: impl FnMut(&dyn Fn() -> bool) -> Option<T>,
) -> T {
    let giving_way = || watch.in_pass() && due.elapsed() < GIVE_WAY_AT_MOST;
    loop {
        while giving_way() {
            std::thread::sleep(GIVE_WAY_POLL);
        }
        if let Some(read) = read(&giving_way) {
            return read;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_linux::netlink::wireguard::WgPeer;

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
        assert_eq!(fingerprint_of(&both), fingerprint_of(&reordered));
        let mut busy = both.clone();
        busy.peers[0].endpoint = Some("192.0.2.7:51830".parse().unwrap());
        busy.peers[0].rx_bytes = 1 << 20;
        busy.peers[0].last_handshake = Some(std::time::SystemTime::now());
        assert_eq!(fingerprint_of(&both), fingerprint_of(&busy));

        let one_gone = device(vec![peer(1, &["10.1.0.0/24", "fd00:1::/64"])]);
        assert_ne!(fingerprint_of(&both), fingerprint_of(&one_gone));
        let moved = device(vec![
            peer(1, &["10.1.0.0/24"]),
            peer(2, &["10.2.0.0/24", "fd00:1::/64"]),
        ]);
        assert_ne!(fingerprint_of(&both), fingerprint_of(&moved));
        let mut other_port = both.clone();
        other_port.listen_port = 51831;
        assert_ne!(fingerprint_of(&both), fingerprint_of(&other_port));
        let twice = device(vec![peer(1, &["10.1.0.0/24"]), peer(1, &["10.1.0.0/24"])]);
        assert_ne!(fingerprint_of(&twice), fingerprint_of(&device(Vec::new())));
    }

    /// A read waits for the pass that runs when it is due, and reads nothing it would
    /// give up once the pass has ended.
    #[test]
    fn a_read_waits_for_the_running_pass() {
        let watch = Arc::new(PeersWatch::default());
        let pass = watch.pass();
        let ended = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // Taken before the pass ends: the read cannot come before it.
            let ended = Instant::now();
            drop(pass);
            ended
        });
        let read_at = read_between_passes(&watch, Instant::now(), |give_up| {
            assert!(!give_up());
            Some(Instant::now())
        });
        assert!(read_at >= ended.join().unwrap());
    }

    /// A pass that starts during a read makes it give up; it is made again once the
    /// pass has ended.
    #[test]
    fn a_read_a_pass_starts_during_is_given_up_and_made_again_after_it() {
        let watch = Arc::new(PeersWatch::default());
        let mut ended = None;
        let mut reads = 0;
        let read_at = read_between_passes(&watch, Instant::now(), |give_up| {
            reads += 1;
            if reads == 1 {
                assert!(!give_up());
                let pass = watch.pass();
                assert!(give_up(), "the pass started during the read");
                ended = Some(std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(30));
                    let ended = Instant::now();
                    drop(pass);
                    ended
                }));
                return None;
            }
            assert!(!give_up());
            Some(Instant::now())
        });
        assert_eq!(reads, 2);
        assert!(read_at >= ended.unwrap().join().unwrap());
    }

    /// Past its patience a read is made during a pass, and not given up.
    #[test]
    fn a_read_due_long_enough_is_made_during_a_pass() {
        let watch = Arc::new(PeersWatch::default());
        let pass = watch.pass();
        let due = Instant::now()
            .checked_sub(GIVE_WAY_AT_MOST)
            .expect("a clock past its patience");
        let mut reads = 0;
        read_between_passes(&watch, due, |give_up| {
            reads += 1;
            assert!(!give_up());
            Some(())
        });
        assert_eq!(reads, 1);
        drop(pass);
        assert!(!watch.in_pass(), "the mark dropped ends the pass");
    }

    /// Without an expectation, a reading that differs from the last is a change; the
    /// first reading is not.
    #[test]
    fn without_an_expectation_a_change_is_heard_against_the_read_before() {
        let watch = PeersWatch::default();
        assert!(!watch.heard(None, Some(1)));
        assert!(!watch.heard(Some(1), Some(1)));
        assert!(!watch.take_changed());
        assert!(watch.heard(Some(1), Some(2)));
        assert!(watch.heard(Some(2), None), "the device gone");
        assert!(watch.take_changed());
        assert!(!watch.take_changed(), "taken once");
    }

    /// With one, what the reconciler expects is no change however it came about (the
    /// agent's own writes), anything else is, once per reading.
    #[test]
    fn with_an_expectation_only_a_device_that_differs_from_it_is_a_change() {
        let watch = PeersWatch::default();
        watch.expect(Some(7));
        assert!(!watch.heard(Some(1), Some(7)), "the agent's own change");
        assert!(!watch.heard(Some(7), Some(7)));
        assert!(watch.heard(Some(7), Some(8)), "a peer removed by hand");
        assert!(watch.take_changed());
        assert!(
            !watch.heard(Some(8), Some(8)),
            "heard once, not every second"
        );
        assert!(watch.heard(Some(8), Some(9)));
        assert!(
            !watch.heard(Some(9), None),
            "a missing device: its link says so"
        );
    }
}
