//! The WireGuard device and its peers: made, adopted and repaired here, behind
//! [`WireguardKernel`] so that the decisions are tested without a kernel (this one's
//! tests run where the kernel has no WireGuard).
//!
//! A device is the agent's when it has the agent's name and is of kind `wireguard`;
//! one found at start is adopted as it is (same index, key, peers: a restart, even
//! after SIGKILL, loses no packet); a link of that name of another kind is never
//! touched. Peers are changed one at a time, never replaced as a list: a new or changed
//! peer is written before the routes that use it, a peer no longer wanted is removed
//! after the routes have left it. A key that changed is a new peer (WireGuard knows a
//! peer by its key) written with the node's allowed IPs, which moves them from the old
//! peer at once; the old one goes after the routes.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::SystemTime;

use cni_linux::Netlink;
use cni_linux::netlink::wireguard::{WgPeerConfig, Wireguard};
use ipnetwork::IpNetwork;

use super::watch::peer_hash;
use super::{Key, PeerSpec};
use crate::error::{Error, Result};

/// A peer as the kernel has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerState {
    /// Its public key.
    pub public_key: Key,
    /// Where it is sent to.
    pub endpoint: Option<SocketAddr>,
    /// What it may send and is sent.
    pub allowed_ips: Vec<IpNetwork>,
    /// The last completed handshake.
    pub last_handshake: Option<SystemTime>,
    /// Bytes received from it.
    pub rx_bytes: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
}

/// The device as the kernel has it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceState {
    /// The public key of its private key, when it has one.
    pub public_key: Option<Key>,
    /// Its UDP port.
    pub listen_port: u16,
    /// Its peers.
    pub peers: Vec<PeerState>,
}

/// What the agent asks of the kernel's WireGuard.
pub trait WireguardKernel: Send {
    /// `Err(Error::NoWireguard)` when this kernel has no WireGuard (`name`: the device
    /// the agent will ask for, for messages).
    fn check(&mut self, name: &str) -> Result<()>;
    /// Makes the device (kind `wireguard`) with `mtu`, up; returns its index.
    fn create(&mut self, name: &str, mtu: u32) -> Result<u32>;
    /// Deletes the link `index` (the agent's device, named `name`).
    fn delete(&mut self, name: &str, index: u32) -> Result<()>;
    /// Sets the MTU of link `index` and sets it up.
    fn set_link(&mut self, name: &str, index: u32, mtu: u32) -> Result<()>;
    /// The device's key, port and peers.
    fn device(&mut self, name: &str) -> Result<DeviceState>;
    /// Puts the private key and port on the device (its peers stay).
    fn set_device(&mut self, name: &str, private_key: &Key, port: u16) -> Result<()>;
    /// Adds a peer, or changes its endpoint and replaces its allowed IPs.
    fn set_peer(&mut self, name: &str, peer: &PeerSpec) -> Result<()>;
    /// Removes a peer.
    fn remove_peer(&mut self, name: &str, public_key: &Key) -> Result<()>;
}

/// The peer changes a pass makes, in two parts: writes before the routes, removals
/// after.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PeerChanges<'a> {
    /// Peers to add or change, before the routes (the plan's own: at the first pass of
    /// thousands of nodes, copies would be megabytes more at the agent's peak).
    pub write: Vec<&'a PeerSpec>,
    /// Peers to remove, after the routes.
    pub remove: Vec<Key>,
}

/// The changes that make the device's peers `want`, from what it has.
pub fn peer_changes<'a>(have: &[PeerState], want: &'a BTreeMap<Key, PeerSpec>) -> PeerChanges<'a> {
    let mut out = PeerChanges::default();
    // Indexed: at thousands of peers, a search of the list per wanted peer would cost
    // millions of comparisons on every pass.
    let by_key: BTreeMap<&Key, &PeerState> = have.iter().map(|p| (&p.public_key, p)).collect();
    for (key, spec) in want {
        // WireGuard holds each allowed IP once: same length and every one present is
        // the same set.
        let same = by_key.get(key).is_some_and(|p| {
            p.endpoint == Some(spec.endpoint)
                && p.allowed_ips.len() == spec.allowed_ips.len()
                && spec.allowed_ips.iter().all(|ip| p.allowed_ips.contains(ip))
        });
        if !same {
            out.write.push(spec);
        }
    }
    for peer in have {
        if !want.contains_key(&peer.public_key) {
            out.remove.push(peer.public_key);
        }
    }
    out
}

/// The peers as the agent last knew them: read at a resync or after a failure, and
/// kept up to date with what the kernel acknowledged since (at thousands of peers,
/// reading them on every pass would cost more than the change). Indexed by key and by
/// allowed IP, so that programming thousands of peers one by one costs no search of the
/// list per peer.
#[derive(Debug, Default)]
pub struct KnownPeers {
    /// The device's index they belong to, and the peers; `None`: read them next.
    known: Option<(u32, Vec<PeerState>)>,
    /// Where each peer is in the list.
    at: HashMap<Key, usize>,
    /// Which peer holds each allowed IP.
    owner: HashMap<IpNetwork, Key>,
    /// The sum of the known peers' [`peer_hash`]es, kept as they change: the device
    /// watch's expectation without hashing every peer on every pass.
    hashes: u64,
}

fn hash_of(peer: &PeerState) -> u64 {
    peer_hash(&peer.public_key.0, &peer.allowed_ips)
}

impl KnownPeers {
    /// The peers of device `index` as just read.
    pub fn set(&mut self, index: u32, peers: Vec<PeerState>) {
        // The list known before goes first and the indexes are refilled in place: at
        // thousands of peers, the old beside the new at every resync is megabytes.
        self.forget();
        self.at
            .extend(peers.iter().enumerate().map(|(i, p)| (p.public_key, i)));
        self.owner.extend(
            peers
                .iter()
                .flat_map(|p| p.allowed_ips.iter().map(|ip| (*ip, p.public_key))),
        );
        self.hashes = peers.iter().fold(0, |sum, p| sum.wrapping_add(hash_of(p)));
        self.known = Some((index, peers));
    }

    /// Forgets them: the next pass reads the device.
    pub fn forget(&mut self) {
        self.known = None;
        self.at.clear();
        self.owner.clear();
        self.hashes = 0;
    }

    /// The sum of the known peers' [`peer_hash`]es (0 when none are known).
    pub fn hashes(&self) -> u64 {
        self.hashes
    }

    /// The peers of device `index`, when known.
    pub fn of(&self, index: u32) -> Option<&[PeerState]> {
        match &self.known {
            Some((i, peers)) if *i == index => Some(peers),
            _ => None,
        }
    }

    /// The known peer that holds `ip` among its allowed IPs.
    pub fn holding(&self, ip: &IpNetwork) -> Option<&PeerState> {
        let (_, peers) = self.known.as_ref()?;
        let key = self.owner.get(ip)?;
        self.at.get(key).map(|&i| &peers[i])
    }

    /// Whether a known peer has `key`.
    pub fn has(&self, key: &Key) -> bool {
        self.at.contains_key(key)
    }

    /// The kernel took `spec`.
    pub fn written(&mut self, spec: &PeerSpec) {
        let Some((_, peers)) = &mut self.known else {
            return;
        };
        // The allowed IPs moved to this peer (WireGuard keeps each on one peer).
        for ip in &spec.allowed_ips {
            if let Some(old) = self.owner.insert(*ip, spec.public_key)
                && old != spec.public_key
                && let Some(&i) = self.at.get(&old)
            {
                self.hashes = self.hashes.wrapping_sub(hash_of(&peers[i]));
                peers[i].allowed_ips.retain(|a| a != ip);
                self.hashes = self.hashes.wrapping_add(hash_of(&peers[i]));
            }
        }
        match self.at.get(&spec.public_key) {
            Some(&i) => {
                let p = &mut peers[i];
                self.hashes = self.hashes.wrapping_sub(hash_of(p));
                for ip in &p.allowed_ips {
                    if !spec.allowed_ips.contains(ip) {
                        self.owner.remove(ip);
                    }
                }
                p.endpoint = Some(spec.endpoint);
                p.allowed_ips.clone_from(&spec.allowed_ips);
                self.hashes = self.hashes.wrapping_add(hash_of(p));
            }
            None => {
                self.at.insert(spec.public_key, peers.len());
                let p = PeerState {
                    public_key: spec.public_key,
                    endpoint: Some(spec.endpoint),
                    allowed_ips: spec.allowed_ips.clone(),
                    last_handshake: None,
                    rx_bytes: 0,
                    tx_bytes: 0,
                };
                self.hashes = self.hashes.wrapping_add(hash_of(&p));
                peers.push(p);
            }
        }
    }

    /// The kernel removed the peer with `key`.
    pub fn removed(&mut self, key: &Key) {
        let Some((_, peers)) = &mut self.known else {
            return;
        };
        let Some(i) = self.at.remove(key) else {
            return;
        };
        let gone = peers.swap_remove(i);
        self.hashes = self.hashes.wrapping_sub(hash_of(&gone));
        for ip in &gone.allowed_ips {
            if self.owner.get(ip) == Some(key) {
                self.owner.remove(ip);
            }
        }
        if let Some(moved) = peers.get(i) {
            self.at.insert(moved.public_key, i);
        }
    }
}

/// The kernel's WireGuard as the agent reaches it: the link over rtnetlink, keys and
/// peers over the `wireguard` generic netlink family.
pub fn open_kernel() -> Result<Box<dyn WireguardKernel>> {
    Ok(Box::new(Kernel {
        nl: Netlink::connect().map_err(Error::Netlink)?,
        wg: None,
    }))
}

/// The real kernel.
#[derive(Debug)]
pub struct Kernel {
    nl: Netlink,
    /// The generic netlink handle, once the family is found (looked up again on each
    /// pass until then: a module loaded later is found).
    wg: Option<Wireguard>,
}

impl Kernel {
    fn wg(&mut self, device: &str) -> Result<&mut Wireguard> {
        if self.wg.is_none() {
            self.wg = Some(
                Wireguard::open()
                    .map_err(|e| kernel_error(device, "reach the kernel's WireGuard for", e))?,
            );
        }
        self.wg.as_mut().ok_or_else(|| unreachable_error(device))
    }
}

fn unreachable_error(device: &str) -> Error {
    Error::Wireguard {
        device: device.to_owned(),
        what: "open".to_owned(),
        source: "no handle".into(),
    }
}

/// [`Error::NoWireguard`] for a kernel without it, else what was asked and the answer.
fn kernel_error(device: &str, what: &str, e: cni_linux::Error) -> Error {
    if e.is_no_wireguard() {
        return Error::NoWireguard;
    }
    Error::Wireguard {
        device: device.to_owned(),
        what: what.to_owned(),
        source: Box::new(e),
    }
}

impl WireguardKernel for Kernel {
    fn check(&mut self, name: &str) -> Result<()> {
        self.wg(name).map(|_| ())
    }
    fn create(&mut self, name: &str, mtu: u32) -> Result<u32> {
        let fail = |what| move |e| kernel_error(name, what, e);
        self.nl
            .create_wireguard(name, Some(mtu))
            .map_err(fail("create"))?;
        let index = self.nl.require_link(name).map_err(fail("find"))?.index;
        self.nl.set_up(index).map_err(fail("set up"))?;
        Ok(index)
    }
    fn delete(&mut self, name: &str, index: u32) -> Result<()> {
        self.nl
            .delete_link(index)
            .map_err(|e| kernel_error(name, "delete", e))
    }
    fn set_link(&mut self, name: &str, index: u32, mtu: u32) -> Result<()> {
        let fail = |what| move |e| kernel_error(name, what, e);
        self.nl
            .set_mtu(index, mtu)
            .map_err(fail("set the MTU of"))?;
        self.nl.set_up(index).map_err(fail("set up"))
    }
    fn device(&mut self, name: &str) -> Result<DeviceState> {
        let device = self
            .wg(name)?
            .device(name)
            .map_err(|e| kernel_error(name, "read", e))?;
        Ok(DeviceState {
            public_key: device.public_key.map(Key),
            listen_port: device.listen_port,
            peers: device
                .peers
                .into_iter()
                .map(|p| PeerState {
                    public_key: Key(p.public_key),
                    endpoint: p.endpoint,
                    allowed_ips: p.allowed_ips,
                    last_handshake: p.last_handshake,
                    rx_bytes: p.rx_bytes,
                    tx_bytes: p.tx_bytes,
                })
                .collect(),
        })
    }
    fn set_device(&mut self, name: &str, private_key: &Key, port: u16) -> Result<()> {
        self.wg(name)?
            .set_device(name, &private_key.0, port, 0)
            .map_err(|e| kernel_error(name, "set the key and port of", e))
    }
    fn set_peer(&mut self, name: &str, peer: &PeerSpec) -> Result<()> {
        let config = WgPeerConfig {
            public_key: peer.public_key.0,
            endpoint: Some(peer.endpoint),
            allowed_ips: peer.allowed_ips.clone(),
            persistent_keepalive: None,
        };
        self.wg(name)?
            .set_peer(name, &config)
            .map_err(|e| kernel_error(name, "set a peer of", e))
    }
    fn remove_peer(&mut self, name: &str, public_key: &Key) -> Result<()> {
        self.wg(name)?
            .remove_peer(name, &public_key.0)
            .map_err(|e| kernel_error(name, "remove a peer of", e))
    }
}

/// A kernel without WireGuard: every request is [`Error::NoWireguard`] (the tests'
/// stand-in for this machine's kernel).
#[derive(Debug, Default)]
pub struct Unsupported;

impl WireguardKernel for Unsupported {
    fn check(&mut self, _: &str) -> Result<()> {
        Err(Error::NoWireguard)
    }
    fn create(&mut self, _: &str, _: u32) -> Result<u32> {
        Err(Error::NoWireguard)
    }
    fn delete(&mut self, _: &str, _: u32) -> Result<()> {
        Err(Error::NoWireguard)
    }
    fn set_link(&mut self, _: &str, _: u32, _: u32) -> Result<()> {
        Err(Error::NoWireguard)
    }
    fn device(&mut self, _: &str) -> Result<DeviceState> {
        Err(Error::NoWireguard)
    }
    fn set_device(&mut self, _: &str, _: &Key, _: u16) -> Result<()> {
        Err(Error::NoWireguard)
    }
    fn set_peer(&mut self, _: &str, _: &PeerSpec) -> Result<()> {
        Err(Error::NoWireguard)
    }
    fn remove_peer(&mut self, _: &str, _: &Key) -> Result<()> {
        Err(Error::NoWireguard)
    }
}

/// An in-memory kernel with WireGuard, for the tests: it records every request.
pub mod fakes {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What the fake kernel holds.
    #[derive(Debug, Default, Clone)]
    pub struct FakeState {
        /// The device: index, MTU, private key, port, peers.
        pub device: Option<FakeDevice>,
        /// Every request, in order.
        pub log: Vec<String>,
        /// The next index handed out.
        pub next_index: u32,
        /// How many times the device was read (a dump: not logged with the changes).
        pub reads: usize,
        /// The device watch whose passes every request is checked to be made in.
        pub watched: Option<Arc<crate::encryption::watch::PeersWatch>>,
        /// Requests made while the watched reconciler was in no pass.
        pub outside_a_pass: usize,
    }

    /// The fake device.
    #[derive(Debug, Default, Clone)]
    pub struct FakeDevice {
        /// Its index.
        pub index: u32,
        /// Its MTU.
        pub mtu: u32,
        /// Its private key.
        pub private_key: Option<Key>,
        /// Its port.
        pub port: u16,
        /// Its peers, in the order they were added.
        pub peers: Vec<PeerState>,
    }

    /// A fake kernel with WireGuard whose state a test shares.
    #[derive(Debug, Default, Clone)]
    pub struct FakeKernel(pub Arc<Mutex<FakeState>>);

    impl FakeKernel {
        fn with<T>(&self, f: impl FnOnce(&mut FakeState) -> T) -> T {
            f(&mut self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner))
        }

        /// A request to the kernel.
        fn request<T>(&self, f: impl FnOnce(&mut FakeState) -> T) -> T {
            self.with(|s| {
                if s.watched.as_ref().is_some_and(|w| !w.in_pass()) {
                    s.outside_a_pass += 1;
                }
                f(s)
            })
        }

        /// Takes the request log.
        pub fn take_log(&self) -> Vec<String> {
            self.with(|s| std::mem::take(&mut s.log))
        }
    }

    fn missing(name: &str) -> Error {
        Error::Wireguard {
            device: name.to_owned(),
            what: "find".to_owned(),
            source: Box::new(std::io::Error::from_raw_os_error(19)),
        }
    }

    impl WireguardKernel for FakeKernel {
        fn check(&mut self, _: &str) -> Result<()> {
            Ok(())
        }
        fn create(&mut self, name: &str, mtu: u32) -> Result<u32> {
            self.request(|s| {
                s.next_index += 1;
                let index = s.next_index + 100;
                s.device = Some(FakeDevice {
                    index,
                    mtu,
                    ..FakeDevice::default()
                });
                s.log.push(format!("create {name} mtu {mtu}"));
                Ok(index)
            })
        }
        fn delete(&mut self, name: &str, _: u32) -> Result<()> {
            self.request(|s| {
                s.device = None;
                s.log.push(format!("delete {name}"));
                Ok(())
            })
        }
        fn set_link(&mut self, name: &str, _: u32, mtu: u32) -> Result<()> {
            self.request(|s| {
                let d = s.device.as_mut().ok_or_else(|| missing(name))?;
                d.mtu = mtu;
                s.log.push(format!("link {name} mtu {mtu} up"));
                Ok(())
            })
        }
        fn device(&mut self, name: &str) -> Result<DeviceState> {
            self.request(|s| {
                s.reads += 1;
                let d = s.device.as_ref().ok_or_else(|| missing(name))?;
                Ok(DeviceState {
                    public_key: d.private_key.map(|k| k.public()),
                    listen_port: d.port,
                    peers: d.peers.clone(),
                })
            })
        }
        fn set_device(&mut self, name: &str, private_key: &Key, port: u16) -> Result<()> {
            self.request(|s| {
                let d = s.device.as_mut().ok_or_else(|| missing(name))?;
                d.private_key = Some(*private_key);
                d.port = port;
                s.log
                    .push(format!("key {name} {:?} port {port}", private_key.public()));
                Ok(())
            })
        }
        fn set_peer(&mut self, name: &str, peer: &PeerSpec) -> Result<()> {
            self.request(|s| {
                let d = s.device.as_mut().ok_or_else(|| missing(name))?;
                for p in &mut d.peers {
                    p.allowed_ips.retain(|ip| !peer.allowed_ips.contains(ip));
                }
                let state = PeerState {
                    public_key: peer.public_key,
                    endpoint: Some(peer.endpoint),
                    allowed_ips: peer.allowed_ips.clone(),
                    last_handshake: None,
                    rx_bytes: 0,
                    tx_bytes: 0,
                };
                match d.peers.iter_mut().find(|p| p.public_key == peer.public_key) {
                    Some(p) => {
                        p.endpoint = state.endpoint;
                        p.allowed_ips = state.allowed_ips;
                    }
                    None => d.peers.push(state),
                }
                let ips: Vec<String> = peer.allowed_ips.iter().map(ToString::to_string).collect();
                s.log.push(format!(
                    "peer {} {} {}",
                    peer.node,
                    peer.endpoint,
                    ips.join(",")
                ));
                Ok(())
            })
        }
        fn remove_peer(&mut self, name: &str, public_key: &Key) -> Result<()> {
            self.request(|s| {
                let d = s.device.as_mut().ok_or_else(|| missing(name))?;
                d.peers.retain(|p| p.public_key != *public_key);
                s.log.push(format!("remove peer {public_key:?}"));
                Ok(())
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> Key {
        Key([n; 32])
    }

    fn spec(node: &str, n: u8, endpoint: &str, cidrs: &[&str]) -> PeerSpec {
        PeerSpec {
            node: node.into(),
            public_key: key(n),
            endpoint: endpoint.parse().unwrap(),
            allowed_ips: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        }
    }

    fn state(spec: &PeerSpec) -> PeerState {
        PeerState {
            public_key: spec.public_key,
            endpoint: Some(spec.endpoint),
            allowed_ips: spec.allowed_ips.clone(),
            last_handshake: None,
            rx_bytes: 0,
            tx_bytes: 0,
        }
    }

    /// The sum kept as peers are written (new, changed, taking another's allowed IP)
    /// and removed is the one a fresh count of the list gives, so the device watch
    /// expects what the device holds.
    #[test]
    fn the_kept_hash_sum_follows_every_change_to_the_known_peers() {
        let fresh = |known: &KnownPeers| {
            known
                .of(7)
                .unwrap()
                .iter()
                .fold(0u64, |sum, p| sum.wrapping_add(hash_of(p)))
        };
        let a = spec("a", 1, "198.18.0.12:51830", &["10.244.2.0/24", "fd00::/64"]);
        let b = spec("b", 2, "198.18.0.13:51830", &["10.244.3.0/24"]);
        let mut known = KnownPeers::default();
        known.set(7, vec![state(&a), state(&b)]);
        assert_eq!(known.hashes(), fresh(&known));
        assert_ne!(known.hashes(), 0);
        // A new key for node b takes its allowed IP from the old peer, which stays.
        let b2 = spec("b", 3, "198.18.0.13:51830", &["10.244.3.0/24"]);
        known.written(&b2);
        assert_eq!(known.hashes(), fresh(&known));
        known.removed(&b.public_key);
        assert_eq!(known.hashes(), fresh(&known));
        // A changed peer, and one that gives up an allowed IP.
        known.written(&spec("a", 1, "198.18.0.14:51830", &["10.244.2.0/24"]));
        assert_eq!(known.hashes(), fresh(&known));
        let before = known.hashes();
        known.written(&spec("c", 4, "198.18.0.15:51830", &["10.244.9.0/24"]));
        known.removed(&key(4));
        assert_eq!(known.hashes(), before);
        // The same list in another order sums the same.
        let list = known.of(7).unwrap().to_vec();
        let mut reversed = KnownPeers::default();
        reversed.set(7, list.into_iter().rev().collect());
        assert_eq!(reversed.hashes(), known.hashes());
        known.forget();
        assert_eq!(known.hashes(), 0);
    }

    #[test]
    fn only_what_differs_is_written_and_what_is_gone_is_removed() {
        let a = spec("a", 1, "198.18.0.12:51830", &["10.244.2.0/24", "fd00::/64"]);
        let b = spec("b", 2, "198.18.0.13:51830", &["10.244.3.0/24"]);
        let c = spec("c", 3, "198.18.0.14:51830", &["10.244.4.0/24"]);
        // a as wanted (allowed IPs in another order), b with an old endpoint, c gone.
        let mut a_have = state(&a);
        a_have.allowed_ips.reverse();
        let mut b_have = state(&b);
        b_have.endpoint = Some("198.18.0.99:51830".parse().unwrap());
        let have = vec![a_have, b_have, state(&c)];
        let want: BTreeMap<Key, PeerSpec> = [(a.public_key, a), (b.public_key, b.clone())].into();
        let changes = peer_changes(&have, &want);
        assert_eq!(changes.write, vec![&b]);
        assert_eq!(changes.remove, vec![key(3)]);
    }

    #[test]
    fn what_the_agent_keeps_follows_writes_and_removals_in_any_order() {
        let a = spec("a", 1, "198.18.0.12:51830", &["10.244.2.0/24"]);
        let b = spec("b", 2, "198.18.0.13:51830", &["10.244.3.0/24", "fd00::/64"]);
        let c = spec("c", 3, "198.18.0.14:51830", &["10.244.4.0/24"]);
        let mut known = KnownPeers::default();
        known.set(7, vec![state(&a), state(&b), state(&c)]);
        // a removed: c moves into its place, and is still found afterwards.
        known.removed(&key(1));
        let c2 = spec(
            "c",
            3,
            "198.18.0.99:51830",
            &["10.244.4.0/24", "10.244.9.0/24"],
        );
        known.written(&c2);
        // b's key changes: its allowed IPs move to the new peer, b keeps none.
        let b2 = spec("b", 8, "198.18.0.13:51830", &["10.244.3.0/24", "fd00::/64"]);
        known.written(&b2);
        let mut peers = known.of(7).unwrap().to_vec();
        peers.sort_by_key(|p| p.public_key);
        let mut b_emptied = state(&b);
        b_emptied.allowed_ips.clear();
        assert_eq!(peers, vec![b_emptied, state(&c2), state(&b2)]);
        known.removed(&key(2));
        known.removed(&key(2));
        assert_eq!(known.of(7).unwrap().len(), 2);
        // c gives up one prefix: a new peer takes it, c is not touched again.
        let d = spec("d", 4, "198.18.0.15:51830", &["10.244.9.0/24"]);
        known.written(&spec("c", 3, "198.18.0.99:51830", &["10.244.4.0/24"]));
        known.written(&d);
        let c_now = known.of(7).unwrap().iter().find(|p| p.public_key == key(3));
        assert_eq!(
            c_now.map(|p| p.allowed_ips.clone()),
            Some(vec!["10.244.4.0/24".parse().unwrap()])
        );
    }

    #[test]
    fn a_changed_key_is_a_new_peer_written_first_and_the_old_one_removed_after() {
        let old = spec("a", 1, "198.18.0.12:51830", &["10.244.2.0/24"]);
        let new = spec("a", 9, "198.18.0.12:51830", &["10.244.2.0/24"]);
        let want: BTreeMap<Key, PeerSpec> = [(new.public_key, new.clone())].into();
        let changes = peer_changes(&[state(&old)], &want);
        assert_eq!(changes.write, vec![&new]);
        assert_eq!(changes.remove, vec![key(1)]);
        // What the agent keeps in memory follows: the allowed IPs moved to the new key.
        let mut known = KnownPeers::default();
        known.set(7, vec![state(&old)]);
        known.written(&new);
        let peers = known.of(7).unwrap();
        assert_eq!(peers.len(), 2);
        assert!(peers[0].allowed_ips.is_empty(), "{peers:?}");
        known.removed(&key(1));
        assert_eq!(known.of(7).unwrap(), [state(&new)]);
        assert_eq!(known.of(8), None, "another device: read again");
    }
}
