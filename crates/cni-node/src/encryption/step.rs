//! The reconciler's encryption step, in three parts around the plan and the routes:
//!
//! 1. [`Step::before_plan`]: the key (made once, read again whenever its file
//!    changed, so a rotation is seen; a quiet pass costs a `stat`), the device (made,
//!    adopted, its MTU and up state repaired), the key and port on it, the annotation
//!    published; what is ready goes into the host view the plan reads. With
//!    encryption off, the annotation is taken away.
//! 2. [`Step::write_peers`]: new and changed peers, before the routes use them.
//! 3. [`Step::after_routes`]: peers no longer wanted, after the routes left them; the
//!    strict table; with encryption off, the agent's device deleted.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use ipnetwork::IpNetwork;

use super::annotation::Publisher;
use super::device::{KnownPeers, PeerState, WireguardKernel, peer_changes};
use super::key::KeyCache;
use super::strict::{StrictPolicy, StrictRules};
use super::watch::PeersWatch;
use super::{EncryptionSettings, Key, LocalEncryption, OVERHEAD_V4, OVERHEAD_V6, PeerSpec, key};
use crate::error::{Error, Result};
use crate::host::{self, HostState};
use crate::node::NodeInfo;
use crate::node::SlimNode;
use crate::overlay::VxlanDevices;
use crate::plan::Plan;
use crate::store::{ItemMap, Items, Snapshot};

/// The reconcile step's name, in `/readyz`, the log and the metrics.
pub const STEP: &str = "encryption";

/// A patch of the same value is not sent again sooner than this (the watch brings the
/// Node back in milliseconds; a resync sends it again regardless).
const PUBLISH_AGAIN_AFTER: Duration = Duration::from_secs(5);

/// The upper bounds (seconds) of the handshake age buckets; WireGuard renews a
/// session every 2 minutes while traffic flows, and gives a peer up after 3.
pub const HANDSHAKE_BUCKETS: [u64; 6] = [30, 120, 180, 300, 900, 3600];

/// What the encryption step drives.
pub struct EncryptionEffects {
    /// The kernel's WireGuard, with encryption on.
    pub kernel: Option<Box<dyn WireguardKernel>>,
    /// Writes this node's annotation.
    pub publisher: Box<dyn Publisher>,
    /// The strict table.
    pub strict: Box<dyn StrictRules>,
}

impl std::fmt::Debug for EncryptionEffects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptionEffects")
            .field("kernel", &self.kernel.is_some())
            .finish_non_exhaustive()
    }
}

/// What the step counted after a pass, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncryptionCounts {
    /// Whether encryption is on.
    pub enabled: bool,
    /// Peers on the device.
    pub peers: usize,
    /// Other nodes reached in clear with encryption on.
    pub without_key: usize,
    /// Peers by the age of their last handshake: how many at most each bound of
    /// [`HANDSHAKE_BUCKETS`] (cumulative), then all peers, then those that never had one.
    /// `None` when the peers were not read in this pass.
    pub handshakes: Option<(Vec<usize>, usize, usize)>,
    /// Bytes sent and received through the peers since the last count.
    pub bytes: (u64, u64),
}

/// The step's state between passes.
#[derive(Debug)]
pub struct Step {
    settings: Option<EncryptionSettings>,
    device: String,
    node: String,
    effects: EncryptionEffects,
    peers: KnownPeers,
    /// The key file as last read.
    key: KeyCache,
    /// The device, key and port last put on the device.
    applied: Option<(u32, Key, u16)>,
    /// The annotation value last sent, and when.
    published: Option<(Option<String>, Instant)>,
    /// The byte counters of each peer at the last read.
    bytes: BTreeMap<Key, (u64, u64)>,
    /// Whether the strict table was checked to be absent (strict mode off).
    strict_checked: bool,
    /// What was last logged of the nodes reached in clear.
    reported_clear: BTreeMap<String, String>,
    /// This node's device, as this pass found it.
    local: Option<LocalEncryption>,
    /// The public key the device had before this agent put another on it (a
    /// rotation): while the API still shows that one, the peers are about to follow,
    /// and the routes stay on the device rather than flap to clear and back.
    replaced: Option<Key>,
    /// Says when the device changed behind the agent's back (a peer deleted by hand).
    watch: Option<Arc<PeersWatch>>,
    /// The Nodes as [`Step::follow_key_changes`] last saw them: unchanged Nodes are
    /// the same items in the next snapshot, so only changed ones are looked at.
    nodes_seen: Option<SeenItems<NodeInfo>>,
    /// New keys written in the middle of this pass, by node: newer than the plan, which
    /// must not put the old key back nor remove the new one.
    followed: BTreeMap<String, Key>,
    /// The peers known changed in this pass (read, written or removed): the watch is
    /// told what the device now holds.
    peers_touched: bool,
}

impl Step {
    /// The step for `node`: `settings` with encryption on, `device` the device's name
    /// either way (with encryption off, a device of the agent's left from before goes).
    pub fn new(
        settings: Option<EncryptionSettings>,
        device: String,
        node: String,
        effects: EncryptionEffects,
    ) -> Self {
        Self {
            settings,
            device,
            node,
            effects,
            peers: KnownPeers::default(),
            key: KeyCache::default(),
            applied: None,
            published: None,
            bytes: BTreeMap::new(),
            strict_checked: false,
            reported_clear: BTreeMap::new(),
            local: None,
            replaced: None,
            watch: None,
            nodes_seen: None,
            followed: BTreeMap::new(),
            peers_touched: false,
        }
    }

    /// Reads the device again on the pass after `watch` saw it change, not only at the
    /// resync.
    pub fn with_peers_watch(mut self, watch: Arc<PeersWatch>) -> Self {
        self.watch = Some(watch);
        self
    }

    /// Marks a pass as running for the device watch, whose reads give way to it, until
    /// the mark is dropped.
    pub fn pass(&self) -> Option<super::watch::Pass> {
        self.watch.as_ref().map(PeersWatch::pass)
    }

    /// Before the pass: a peer's new key, at once. A Node that now publishes another
    /// valid key, and is otherwise the peer the device has (the same pod CIDRs as its
    /// allowed IPs, its endpoint still one of the Node's InternalIPs), gets a peer with
    /// the new key taking over those allowed IPs, without waiting for the host read
    /// and the plan of every node: at thousands of nodes those are most of a pass. The
    /// pass that follows plans the peer as written and removes the old key's peer after
    /// the routes, as for any change; anything else about the Node is the pass's to
    /// judge. A key that another peer or this node has is left to the pass too.
    ///
    /// Also called in the middle of a pass (`mid_pass`) with the Nodes as they are
    /// now, so that a change does not wait for the rest of a long pass (a resync reads
    /// every route and peer); such peers are newer than the pass's plan, which leaves
    /// them as they are and the old keys' peers to the next pass.
    pub fn follow_key_changes(&mut self, nodes: &Items<SlimNode>, mid_pass: bool) {
        if !mid_pass {
            self.followed.clear();
        }
        if self.nodes_seen.as_ref().is_some_and(|seen| seen.is(nodes)) {
            return;
        }
        let Some(seen) = self.nodes_seen.replace(SeenItems::of(nodes)) else {
            return;
        };
        let (Some(local), Some(kernel)) = (self.local, self.effects.kernel.as_mut()) else {
            return;
        };
        if self.peers.of(local.index).is_none() {
            return;
        }
        let mut writes = Vec::new();
        for node in changed_items(&seen.items, nodes, |n| &n.name) {
            let Some(key) = node.key() else {
                continue;
            };
            if node.name == self.node || key == local.public_key || self.peers.has(&key) {
                continue;
            }
            let Some(first) = node.pod_cidrs.first() else {
                continue;
            };
            let Some(old) = self.peers.holding(first) else {
                continue;
            };
            let same_peer = old.allowed_ips.len() == node.pod_cidrs.len()
                && node.pod_cidrs.iter().all(|c| old.allowed_ips.contains(c))
                && old
                    .endpoint
                    .is_some_and(|e| node.internal_ips.contains(&e.ip()));
            if let (true, Some(endpoint)) = (same_peer, old.endpoint) {
                writes.push(PeerSpec {
                    node: node.name.clone(),
                    public_key: key,
                    endpoint,
                    allowed_ips: old.allowed_ips.clone(),
                });
            }
        }
        for spec in &writes {
            self.peers_touched = true;
            match put_peer(
                kernel.as_mut(),
                &self.device,
                &mut self.peers,
                spec,
                ": its new key",
            ) {
                Ok(()) if mid_pass => {
                    self.followed.insert(spec.node.clone(), spec.public_key);
                }
                Ok(()) => {}
                Err(e) => {
                    // The pass that follows reads the device and writes what it plans.
                    tracing::debug!(
                        "encryption: the new key of {} waits for the pass: {e}",
                        spec.node
                    );
                    break;
                }
            }
        }
        self.tell_watch();
    }

    /// Part 1: the key, the device and the annotation; fills `host.view.wireguard`.
    pub fn before_plan(
        &mut self,
        snapshot: &Snapshot,
        host: &mut HostState,
        resync: bool,
        failures: &mut Vec<(&'static str, Error)>,
    ) {
        self.local = None;
        let me = snapshot.nodes.get(&self.node).map(|n| &**n);
        let Some(settings) = self.settings.clone() else {
            // Off: the other nodes must reach this one in clear.
            if me.is_some_and(|n| n.wireguard_key.is_some())
                && let Err(e) = self.publish(None, resync)
            {
                failures.push((STEP, e));
            }
            return;
        };
        let changed = self.watch.as_ref().is_some_and(|w| w.take_changed());
        match self.prepare(&settings, me, host, resync, changed) {
            Ok(local) => {
                let shown = me.and_then(NodeInfo::key);
                let mut published = shown == Some(local.public_key);
                let rotating = shown.is_some() && shown == self.replaced;
                if published {
                    self.replaced = None;
                } else {
                    // A patch the API took is as good as the watch showing it (the
                    // watch only tells this node, not its peers): the routes move at
                    // once instead of a pass later, which at thousands of nodes would
                    // write every route twice, in clear first.
                    match self.publish(Some(local.public_key.to_base64()), resync) {
                        Ok(()) => published = true,
                        Err(e) => failures.push((STEP, e)),
                    }
                }
                let published = published || rotating;
                let local = LocalEncryption { published, ..local };
                self.local = Some(local);
                host.view.wireguard = Some(local);
            }
            Err(e) => {
                // Without a device of its own, this node must be reached in clear: its
                // key goes from its Node. A key file that cannot be read leaves the
                // device (and the peers' traffic to it) as it is.
                let no_device =
                    matches!(e, Error::NoWireguard | Error::ForeignWireguardDevice { .. });
                if no_device
                    && me.is_some_and(|n| n.wireguard_key.is_some())
                    && let Err(e) = self.publish(None, resync)
                {
                    failures.push((STEP, e));
                }
                failures.push((STEP, e));
            }
        }
    }

    /// The key, the device, and the key and port on it.
    fn prepare(
        &mut self,
        settings: &EncryptionSettings,
        me: Option<&NodeInfo>,
        host: &HostState,
        resync: bool,
        changed_by_hand: bool,
    ) -> Result<LocalEncryption> {
        let kernel = self.effects.kernel.as_mut().ok_or(Error::NoWireguard)?;
        kernel.check(&settings.device)?;
        let (private, public, made) = self.key.load(&settings.state_dir)?;
        if made {
            tracing::info!(
                "encryption: made a new WireGuard key in {}; public key {}",
                key::path(&settings.state_dir).display(),
                public.to_base64()
            );
        }
        let own_ips = me.map(|n| n.internal_ips.clone()).unwrap_or_default();
        let mtu = device_mtu(host, &own_ips);
        let name = settings.device.as_str();
        let existing = host.overlay.iter().find(|d| d.link.name == name);
        let (index, fresh) = match existing {
            Some(d) if d.link.kind.as_deref() != Some("wireguard") => {
                return Err(Error::ForeignWireguardDevice {
                    name: name.to_owned(),
                    what: d
                        .link
                        .kind
                        .clone()
                        .unwrap_or_else(|| "a link of no kind".to_owned()),
                });
            }
            Some(d) => {
                if d.link.mtu != mtu || !d.link.up {
                    kernel.set_link(name, d.link.index, mtu)?;
                    tracing::info!(
                        "encryption: {name} MTU {mtu}{}",
                        if d.link.up { "" } else { ", was down: set up" }
                    );
                }
                (d.link.index, false)
            }
            None => {
                let index = kernel.create(name, mtu)?;
                tracing::info!(
                    "encryption: created {name} (WireGuard, port {}, MTU {mtu})",
                    settings.port
                );
                (index, true)
            }
        };
        let want = (index, public, settings.port);
        if fresh
            || resync
            || changed_by_hand
            || self.applied != Some(want)
            || self.peers.of(index).is_none()
        {
            // When the watch saw the device changed, the keys known before the read tell
            // what was lost.
            let mut lost: Option<HashSet<Key>> = changed_by_hand
                .then(|| self.peers.of(index))
                .flatten()
                .map(|known| known.iter().map(|p| p.public_key).collect());
            // Forgotten before the read, not replaced after it: thousands of peers held
            // twice would be the agent's peak. A failed read leaves them to be read again.
            self.peers.forget();
            let device = kernel.device(name)?;
            if device.public_key != Some(public) || device.listen_port != settings.port {
                kernel.set_device(name, &private, settings.port)?;
                if device.public_key != Some(public) {
                    self.replaced = device.public_key;
                }
                tracing::info!(
                    "encryption: {name} has the key {} and port {}{}",
                    public.to_base64(),
                    settings.port,
                    match device.public_key {
                        Some(old) if old != public => format!(" (was {})", old.to_base64()),
                        _ => String::new(),
                    }
                );
            }
            if let Some(lost) = &mut lost {
                for peer in &device.peers {
                    lost.remove(&peer.public_key);
                }
                let mut lost: Vec<String> = lost.iter().map(|k| k.to_base64()).collect();
                lost.sort_unstable();
                if !lost.is_empty() {
                    tracing::info!(
                        "encryption: {name} lost {} peer(s) behind the agent's back ({}): \
                         writing them again",
                        lost.len(),
                        if lost.len() > 8 {
                            format!("{} ...", lost[..8].join(", "))
                        } else {
                            lost.join(", ")
                        }
                    );
                }
            }
            self.peers.set(index, device.peers);
            self.peers_touched = true;
            self.applied = Some(want);
        }
        Ok(LocalEncryption {
            index,
            public_key: public,
            port: settings.port,
            published: false,
        })
    }

    /// How many times the key file was read.
    #[cfg(test)]
    pub fn key_reads(&self) -> u64 {
        self.key.reads()
    }

    /// Sends the annotation `value` unless the same was sent a moment ago.
    fn publish(&mut self, value: Option<String>, resync: bool) -> Result<()> {
        if !resync
            && let Some((sent, at)) = &self.published
            && *sent == value
            && at.elapsed() < PUBLISH_AGAIN_AFTER
        {
            return Ok(());
        }
        match self.effects.publisher.publish(&self.node, value.as_deref()) {
            Ok(()) => {
                match &value {
                    Some(key) => tracing::info!(
                        "encryption: published the public key {key} on Node {}",
                        self.node
                    ),
                    None => tracing::info!(
                        "encryption: took the public key off Node {}: the other nodes reach \
                         this one in clear",
                        self.node
                    ),
                }
                self.published = Some((value, Instant::now()));
                Ok(())
            }
            Err(e) => {
                self.published = None;
                Err(e)
            }
        }
    }

    /// Part 2: peers new or changed, before the routes that use them.
    pub fn write_peers(&mut self, plan: &Plan, failures: &mut Vec<(&'static str, Error)>) {
        self.report_clear(plan);
        let (Some(local), Some(kernel)) = (self.local, self.effects.kernel.as_mut()) else {
            return;
        };
        let Some(have) = self.peers.of(local.index) else {
            return;
        };
        let mut changes = peer_changes(have, &plan.peers);
        changes.write.retain(|spec| {
            self.followed
                .get(&spec.node)
                .is_none_or(|k| *k == spec.public_key)
        });
        for spec in &changes.write {
            self.peers_touched = true;
            if let Err(e) = put_peer(kernel.as_mut(), &self.device, &mut self.peers, spec, "") {
                failures.push((STEP, e));
                break;
            }
        }
        self.tell_watch();
    }

    /// Tells the device watch what the device holds now, when that changed in this
    /// pass: the peers known and the key and port put on it (nothing known: `None`).
    fn tell_watch(&mut self) {
        let Some(watch) = &self.watch else {
            return;
        };
        if !std::mem::take(&mut self.peers_touched) {
            return;
        }
        let expected = match (self.local, self.applied) {
            (Some(local), Some((index, public, port))) if index == local.index => {
                self.peers.of(index).map(|_| {
                    super::watch::device_hash(Some(&public.0), port)
                        .wrapping_add(self.peers.hashes())
                })
            }
            _ => None,
        };
        watch.expect(expected);
    }

    /// Part 3: peers no longer wanted, the strict table, a device no longer wanted.
    pub fn after_routes(
        &mut self,
        plan: &Plan,
        host: &HostState,
        resync: bool,
        devices: &dyn VxlanDevices,
        failures: &mut Vec<(&'static str, Error)>,
    ) -> EncryptionCounts {
        let mut counts = EncryptionCounts {
            enabled: self.settings.is_some(),
            without_key: if self.settings.is_some() {
                plan.clear.len()
            } else {
                0
            },
            ..EncryptionCounts::default()
        };
        if let (Some(local), Some(kernel)) = (self.local, self.effects.kernel.as_mut())
            && let Some(have) = self.peers.of(local.index)
        {
            let mut stale = peer_changes(have, &plan.peers).remove;
            stale.retain(|key| !self.followed.values().any(|k| k == key));
            for key in stale {
                match kernel.remove_peer(&self.device, &key) {
                    Ok(()) => {
                        tracing::info!("encryption: removed the peer {}", key.to_base64());
                        self.peers.removed(&key);
                        self.peers_touched = true;
                    }
                    Err(e) => {
                        self.peers.forget();
                        self.peers_touched = true;
                        failures.push((STEP, e));
                        break;
                    }
                }
            }
        }
        self.tell_watch();
        if let Some(local) = self.local
            && let Some(peers) = self.peers.of(local.index)
        {
            counts.peers = peers.len();
            // What was read of the kernel at this resync (handshakes and bytes are not
            // followed between reads).
            if resync || self.bytes.is_empty() {
                counts.handshakes = Some(handshake_ages(peers, SystemTime::now()));
                let (bytes, seen) = byte_deltas(&self.bytes, peers);
                counts.bytes = bytes;
                self.bytes = seen;
            }
        }
        let strict = self.settings.as_ref().filter(|s| s.strict);
        match strict {
            Some(settings) => {
                let policy = StrictPolicy {
                    device: settings.device.clone(),
                    own: plan.own_pod_cidrs.clone(),
                    remote: plan.remote.clone(),
                    expected: plan.keyed.clone(),
                };
                match self.effects.strict.sync(&policy) {
                    Ok(true) => tracing::info!(
                        "encryption: strict: pod traffic to {} pod CIDRs of other nodes leaves \
                         only through {}, from {} is taken only through it",
                        policy.remote.len(),
                        policy.device,
                        policy.expected.len()
                    ),
                    Ok(false) => {}
                    Err(e) => failures.push((STEP, e)),
                }
                self.strict_checked = false;
            }
            None if resync || !self.strict_checked => match self.effects.strict.remove() {
                Ok(removed) => {
                    if removed {
                        tracing::info!("encryption: strict mode is off: its table removed");
                    }
                    self.strict_checked = true;
                }
                Err(e) => failures.push((STEP, e)),
            },
            None => {}
        }
        if self.settings.is_none()
            && let Some(d) = host.overlay.iter().find(|d| d.link.name == self.device)
            && d.link.kind.as_deref() == Some("wireguard")
        {
            match devices.delete(d.link.index) {
                Ok(()) => tracing::info!(
                    "encryption: deleted {}: encryption is off on this node",
                    self.device
                ),
                Err(e) if e.is_not_found() => {}
                Err(source) => failures.push((
                    STEP,
                    Error::Wireguard {
                        device: self.device.clone(),
                        what: "delete".to_owned(),
                        source: Box::new(source),
                    },
                )),
            }
        }
        counts
    }

    /// Logs the nodes reached in clear when that changes.
    fn report_clear(&mut self, plan: &Plan) {
        if self.settings.is_none() {
            return;
        }
        // Grouped by reason: at thousands of nodes, one reason (this node's device not
        // ready, say) is one line, not one per node.
        let mut news: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, why) in &plan.clear {
            if self.reported_clear.get(name) != Some(why) {
                news.entry(why.as_str()).or_default().push(name.as_str());
            }
        }
        for (why, names) in news {
            tracing::warn!("encryption: {} reached in clear: {why}", some_nodes(&names));
        }
        let encrypted: Vec<&str> = self
            .reported_clear
            .keys()
            .filter(|name| {
                !plan.clear.contains_key(*name) && plan.peers.values().any(|p| &p.node == *name)
            })
            .map(String::as_str)
            .collect();
        if !encrypted.is_empty() {
            tracing::info!(
                "encryption: {} reached through WireGuard",
                some_nodes(&encrypted)
            );
        }
        self.reported_clear = plan.clear.clone();
    }
}

/// `node n2 is`, `nodes n2, n3 are`, `5000 nodes (n1, ..., n8 and 4992 more) are`.
fn some_nodes(names: &[&str]) -> String {
    const SHOWN: usize = 8;
    match names {
        [one] => format!("node {one} is"),
        _ if names.len() <= SHOWN => format!("nodes {} are", names.join(", ")),
        _ => format!(
            "{} nodes ({} and {} more) are",
            names.len(),
            names[..SHOWN].join(", "),
            names.len() - SHOWN
        ),
    }
}

/// The device's MTU: the uplink's minus WireGuard's overhead over the underlay the
/// endpoints use.
pub fn device_mtu(host: &HostState, own_internal_ips: &[std::net::IpAddr]) -> u32 {
    let (uplink, _) = host::choose_mtu(host, own_internal_ips);
    let cut = if super::underlay_v4(own_internal_ips) {
        OVERHEAD_V4
    } else {
        OVERHEAD_V6
    };
    uplink.saturating_sub(cut)
}

/// Bytes sent and received since the last read (`before`, by peer), and what was read
/// now; a peer not seen before counts from now.
fn byte_deltas(
    before: &BTreeMap<Key, (u64, u64)>,
    peers: &[PeerState],
) -> ((u64, u64), BTreeMap<Key, (u64, u64)>) {
    let mut delta = (0u64, 0u64);
    let mut now = BTreeMap::new();
    for p in peers {
        let (tx, rx) = before
            .get(&p.public_key)
            .copied()
            .unwrap_or((p.tx_bytes, p.rx_bytes));
        delta.0 = delta.0.saturating_add(p.tx_bytes.saturating_sub(tx));
        delta.1 = delta.1.saturating_add(p.rx_bytes.saturating_sub(rx));
        now.insert(p.public_key, (p.tx_bytes, p.rx_bytes));
    }
    (delta, now)
}

/// Peers by the age of their last handshake at `now`: cumulative counts per bound of
/// [`HANDSHAKE_BUCKETS`], all peers, and those that never had one.
pub fn handshake_ages(peers: &[PeerState], now: SystemTime) -> (Vec<usize>, usize, usize) {
    let mut buckets = vec![0; HANDSHAKE_BUCKETS.len()];
    let mut never = 0;
    for peer in peers {
        let Some(at) = peer.last_handshake else {
            never += 1;
            continue;
        };
        let age = now.duration_since(at).map_or(0, |d| d.as_secs());
        for (count, bound) in buckets.iter_mut().zip(HANDSHAKE_BUCKETS) {
            if age <= bound {
                *count += 1;
            }
        }
    }
    (buckets, peers.len(), never)
}

/// Items of a store as last looked at, held without holding their map: the store copies
/// a map still shared whole at its next change.
#[derive(Debug)]
struct SeenItems<T> {
    map: Weak<ItemMap<T>>,
    /// In the map's order.
    items: Vec<Arc<T>>,
}

impl<T> SeenItems<T> {
    fn of(map: &Arc<ItemMap<T>>) -> Self {
        Self {
            map: Arc::downgrade(map),
            items: map.values().cloned().collect(),
        }
    }

    /// Whether `map` is the very map seen, unchanged since (a change in place leaves
    /// the weak reference behind).
    fn is(&self, map: &Arc<ItemMap<T>>) -> bool {
        self.map
            .upgrade()
            .is_some_and(|seen| Arc::ptr_eq(&seen, map))
    }
}

/// The items of `now` that are not the very items of `before` (new or changed), found
/// in one walk of both, sorted by the key `key_of` gives an item.
fn changed_items<'a, T>(
    before: &[Arc<T>],
    now: &'a ItemMap<T>,
    key_of: impl Fn(&T) -> &str,
) -> Vec<&'a T> {
    let mut before = before.iter().peekable();
    let mut out = Vec::new();
    for (key, item) in now {
        while before.next_if(|old| key_of(old) < key.as_str()).is_some() {}
        let same = before
            .next_if(|old| key_of(old) == key.as_str())
            .is_some_and(|old| Arc::ptr_eq(old, item));
        if !same {
            out.push(&**item);
        }
    }
    out
}

/// Puts `spec` on `device` and logs it as every peer write is (`why` after it), then
/// counts it among the known peers; after a failure no peer is known, so the next pass
/// reads the device.
fn put_peer(
    kernel: &mut dyn WireguardKernel,
    device: &str,
    peers: &mut KnownPeers,
    spec: &PeerSpec,
    why: &str,
) -> Result<()> {
    match kernel.set_peer(device, spec) {
        Ok(()) => {
            tracing::info!(
                "encryption: peer {} ({}) at {}, allowed IPs {}{why}",
                spec.node,
                spec.public_key.to_base64(),
                spec.endpoint,
                ip_list(&spec.allowed_ips)
            );
            peers.written(spec);
            Ok(())
        }
        Err(e) => {
            peers.forget();
            Err(e)
        }
    }
}

/// Allowed IPs as the log shows them.
fn ip_list(ips: &[IpNetwork]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_items_are_the_new_and_replaced_ones_not_the_shared_or_removed() {
        let item = |k: &str, v: u8| (k.to_owned(), (k.to_owned(), v));
        let mut map = Arc::new(crate::store::item_map(
            ["a", "b", "c", "e"].map(|k| item(k, 0)),
        ));
        let seen = SeenItems::of(&map);
        assert!(seen.is(&map));
        // Seen, the map is still the store's alone: a change is made in place.
        let now = Arc::make_mut(&mut map);
        now.remove("a");
        now.extend(crate::store::item_map([
            item("c", 1),
            item("d", 0),
            item("f", 0),
        ]));
        // The same value in a new item counts: only sharing says unchanged.
        now.insert("e".into(), Arc::new(("e".to_owned(), 0)));
        assert!(!seen.is(&map));
        let changed: Vec<_> = changed_items(&seen.items, &map, |(k, _)| k)
            .into_iter()
            .map(|(k, v)| format!("{k}{v}"))
            .collect();
        assert_eq!(changed, ["c1", "d0", "e0", "f0"]);
        let again = SeenItems::of(&map);
        assert!(changed_items(&again.items, &map, |(k, _)| k).is_empty());
        assert_eq!(changed_items(&[], &map, |(k, _)| k).len(), 5);
    }

    fn peer(n: u8, handshake_secs_ago: Option<u64>, tx: u64, rx: u64) -> PeerState {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        PeerState {
            public_key: Key([n; 32]),
            endpoint: None,
            allowed_ips: Vec::new(),
            last_handshake: handshake_secs_ago.map(|s| now - Duration::from_secs(s)),
            rx_bytes: rx,
            tx_bytes: tx,
        }
    }

    #[test]
    fn handshake_ages_are_counted_in_a_few_cumulative_buckets() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        let peers = [
            peer(1, Some(5), 0, 0),
            peer(2, Some(150), 0, 0),
            peer(3, Some(5000), 0, 0),
            peer(4, None, 0, 0),
        ];
        let (buckets, all, never) = handshake_ages(&peers, now);
        // <=30, <=120, <=180, <=300, <=900, <=3600
        assert_eq!(buckets, vec![1, 1, 2, 2, 2, 2]);
        assert_eq!((all, never), (4, 1));
    }

    #[test]
    fn many_nodes_are_named_in_one_short_line() {
        assert_eq!(some_nodes(&["n2"]), "node n2 is");
        assert_eq!(some_nodes(&["n2", "n3"]), "nodes n2, n3 are");
        let many: Vec<String> = (0..20).map(|i| format!("n{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            some_nodes(&many),
            "20 nodes (n0, n1, n2, n3, n4, n5, n6, n7 and 12 more) are"
        );
    }

    #[test]
    fn bytes_count_what_moved_since_the_last_read() {
        let first = [peer(1, None, 100, 50)];
        let (delta, seen) = byte_deltas(&BTreeMap::new(), &first);
        assert_eq!(delta, (0, 0), "a new peer counts from now");
        let second = [peer(1, None, 160, 90), peer(2, None, 7, 7)];
        let (delta, seen) = byte_deltas(&seen, &second);
        assert_eq!(delta, (60, 40));
        assert_eq!(seen.len(), 2);
    }
}
