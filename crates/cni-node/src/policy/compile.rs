//! From the agent's view to what the kernel must hold on this node: for every local pod
//! that some policy isolates, the profile that judges its ingress or egress, as
//! pairwise disjoint boxes of (peer addresses, protocol, destination port). Pods
//! selected by the same policies (and, for ingress, with the same named ports) share
//! one profile, named by a hash of those inputs, not of its boxes: a restarted agent
//! computes the same names and adopts what is in the kernel, and a change of what the
//! policies allow (a peer pod coming or going, a namespace's labels, a policy's rules)
//! keeps the profile's name, so it reaches the kernel as the few elements of its sets
//! that differ, not as new sets of thousands of elements.
//!
//! Protocol and port are one key, `protocol << 16 | port`: every port entry of a
//! policy is one interval of it (a protocol's port range, a protocol's every port, or
//! every protocol with every port), which keeps the union of rules a union of
//! rectangles in (address × key); the rectangles are cut into disjoint boxes and the
//! boxes merged back where they are equal, so a profile holds few elements.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::rc::Rc;

use cni_protocol::ip::{bounds, from_u128, to_u128};
use ipnetwork::IpNetwork;
use sha2::{Digest, Sha256};

use super::model::View;
use super::objects::{NamedPort, Peer, PodInfo, PolicyInfo, PortRef, Rule};

pub use cni_firewall::network_policy::{Allow, PeerRule, Profile};

/// What the kernel must hold on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compiled {
    /// Local pod address -> the profile judging traffic to it.
    pub ingress: BTreeMap<IpAddr, String>,
    /// Local pod address -> the profile judging traffic from it.
    pub egress: BTreeMap<IpAddr, String>,
    /// Ingress profiles: the sources they allow.
    pub ingress_profiles: BTreeMap<String, Profile>,
    /// Egress profiles: the destinations they allow.
    pub egress_profiles: BTreeMap<String, Profile>,
    /// The peers that profiles share, by name: pods' addresses.
    pub peer_sets: BTreeMap<String, BTreeSet<IpAddr>>,
    /// Every local pod address judged in this pass, isolated or not, with its pod.
    pub judged: BTreeMap<IpAddr, String>,
}

/// From this many address ranges on, a peer of pods is a shared peer set (one copy
/// in the kernel, a rule in each profile that allows it) instead of boxes in the
/// profiles' own sets: a peer as big as a namespace's pods would otherwise be
/// copied into every profile that allows it, and a pod coming or going would change
/// all those copies. Below it, the copies are cheap and cost no rule on the packet
/// path.
pub const SHARE_FROM: usize = 16;

/// Disjoint, merged, sorted address ranges of one family, as integers.
type Ranges = Vec<(u128, u128)>;

/// Addresses of both families.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Addrs {
    v4: Ranges,
    v6: Ranges,
}

impl Addrs {
    fn everything() -> Self {
        Self {
            v4: vec![(0, u128::from(u32::MAX))],
            v6: vec![(0, u128::MAX)],
        }
    }

    fn push(&mut self, ip: IpAddr) {
        let n = to_u128(ip);
        if ip.is_ipv4() {
            self.v4.push((n, n));
        } else {
            self.v6.push((n, n));
        }
    }

    fn push_block(&mut self, cidr: IpNetwork, except: &[IpNetwork]) {
        let (start, end) = bounds(cidr);
        let mut holes: Ranges = except.iter().map(|e| bounds(*e)).collect();
        let mut pieces = vec![(start, end)];
        holes.sort_unstable();
        for (hs, he) in holes {
            pieces = pieces
                .into_iter()
                .flat_map(|(s, e)| {
                    let mut out = Vec::new();
                    if he < s || hs > e {
                        out.push((s, e));
                    } else {
                        if hs > s {
                            out.push((s, hs - 1));
                        }
                        if he < e {
                            out.push((he + 1, e));
                        }
                    }
                    out
                })
                .collect();
        }
        let list = if cidr.is_ipv4() {
            &mut self.v4
        } else {
            &mut self.v6
        };
        list.extend(pieces);
    }

    fn normalize(mut self) -> Self {
        self.v4 = merge(self.v4);
        self.v6 = merge(self.v6);
        self
    }

    fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// Every address, one by one (for addresses of pods: ranges of single
    /// addresses merged).
    fn each(&self) -> BTreeSet<IpAddr> {
        let v4 = self
            .v4
            .iter()
            .flat_map(|&(s, e)| s..=e)
            .map(|n| from_u128(n, true));
        let v6 = self
            .v6
            .iter()
            .flat_map(|&(s, e)| s..=e)
            .map(|n| from_u128(n, false));
        v4.chain(v6).collect()
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let list = if ip.is_ipv4() { &self.v4 } else { &self.v6 };
        let n = to_u128(ip);
        let i = list.partition_point(|&(_, e)| e < n);
        list.get(i).is_some_and(|&(s, _)| s <= n)
    }
}

/// Sorts and merges overlapping or adjacent ranges.
fn merge(mut ranges: Ranges) -> Ranges {
    ranges.sort_unstable();
    let mut out: Ranges = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        match out.last_mut() {
            Some((_, last)) if s <= last.saturating_add(1) => *last = (*last).max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// The key space: `protocol << 16 | port`, inclusive intervals.
type Keys = Vec<(u32, u32)>;

/// Every protocol, every port.
const ALL_KEYS: (u32, u32) = (0, (255 << 16) | 0xFFFF);

fn key(protocol: u8, port: u16) -> u32 {
    (u32::from(protocol) << 16) | u32::from(port)
}

/// One rule's contribution: these peers on these keys.
#[derive(Debug, Clone)]
struct Rect {
    addrs: Rc<Addrs>,
    keys: Keys,
}

/// What a profile's rules add up to: rectangles for its own set, and keys allowed
/// with shared peer sets.
#[derive(Debug, Default)]
struct Parts {
    rects: Vec<Rect>,
    shared: Vec<(String, Keys)>,
}

/// A peer's addresses, and the name of the shared set that holds them when it is
/// one.
#[derive(Debug)]
struct PeerAddrs {
    addrs: Rc<Addrs>,
    shared: Option<String>,
}

/// A pod with its addresses (the API's and this node's records, see [`View::ips`]).
type Located<'a> = (&'a PodInfo, Cow<'a, [IpAddr]>);

struct Compiler<'v, 'a> {
    view: &'v View<'a>,
    by_namespace: BTreeMap<&'a str, Vec<Located<'a>>>,
    /// Peers' addresses, computed once per pass for each peer (and, for a peer of
    /// the policy's own namespace, each namespace).
    peers: HashMap<(&'a str, &'a Peer), Rc<PeerAddrs>>,
    /// Egress to a named port: per peer (`None`: every pod), port name and protocol,
    /// the parts it adds, computed once per pass.
    named: HashMap<(&'a str, Option<&'a Peer>, &'a str, u8), Rc<Parts>>,
    /// The shared peer sets made in this pass.
    shared: HashMap<String, Rc<Addrs>>,
    share_from: usize,
}

impl<'v, 'a> Compiler<'v, 'a> {
    fn new(view: &'v View<'a>, share_from: usize) -> Self {
        // Pods are keyed `namespace/name`: a namespace's pods come one after the other.
        let mut by_namespace: BTreeMap<&'a str, Vec<Located<'a>>> = BTreeMap::new();
        let mut current: Option<(&'a str, Vec<Located<'a>>)> = None;
        for pod in view.pods.values().filter(|p| !p.host_network) {
            let ips = view.ips_of(pod);
            if ips.is_empty() {
                continue;
            }
            match &mut current {
                Some((namespace, pods)) if *namespace == pod.namespace => pods.push((pod, ips)),
                _ => {
                    if let Some((namespace, pods)) = current.take() {
                        by_namespace.entry(namespace).or_default().extend(pods);
                    }
                    current = Some((pod.namespace.as_str(), vec![(pod, ips)]));
                }
            }
        }
        if let Some((namespace, pods)) = current {
            by_namespace.entry(namespace).or_default().extend(pods);
        }
        Self {
            view,
            by_namespace,
            peers: HashMap::new(),
            named: HashMap::new(),
            shared: HashMap::new(),
            share_from,
        }
    }

    /// Pods' addresses as a peer: shared when big enough, under a name that is a hash
    /// of `key` (what the addresses are: the same peer gets the same name in every
    /// pass and every run).
    fn pods_peer(&mut self, key: &str, addrs: Addrs) -> PeerAddrs {
        let addrs = Rc::new(addrs.normalize());
        if addrs.len() < self.share_from.max(1) {
            return PeerAddrs {
                addrs,
                shared: None,
            };
        }
        let name = hash_name(&[key]);
        self.shared
            .entry(name.clone())
            .or_insert_with(|| Rc::clone(&addrs));
        PeerAddrs {
            addrs,
            shared: Some(name),
        }
    }

    /// Adds `keys` with every one of `peers` (of a rule in a policy of
    /// `namespace`; `None`: every address).
    fn add_peers(
        &mut self,
        namespace: &'a str,
        peers: Option<&'a [Peer]>,
        keys: &Keys,
        out: &mut Parts,
    ) {
        if keys.is_empty() {
            return;
        }
        let Some(peers) = peers else {
            out.rects.push(Rect {
                addrs: Rc::new(Addrs::everything()),
                keys: keys.clone(),
            });
            return;
        };
        for peer in peers {
            let one = self.one_peer(namespace, peer);
            match &one.shared {
                Some(name) => out.shared.push((name.clone(), keys.clone())),
                None => out.rects.push(Rect {
                    addrs: Rc::clone(&one.addrs),
                    keys: keys.clone(),
                }),
            }
        }
    }

    /// The scope a peer's addresses depend on: only a peer without a namespace
    /// selector depends on the policy's namespace.
    fn scope(namespace: &'a str, peer: &Peer) -> &'a str {
        match peer {
            Peer::Pods {
                namespaces: None, ..
            } => namespace,
            Peer::Pods { .. } | Peer::IpBlock { .. } => "",
        }
    }

    fn one_peer(&mut self, namespace: &'a str, peer: &'a Peer) -> Rc<PeerAddrs> {
        let cache_key = (Self::scope(namespace, peer), peer);
        if let Some(hit) = self.peers.get(&cache_key) {
            return Rc::clone(hit);
        }
        let mut addrs = Addrs::default();
        match peer {
            Peer::IpBlock { cidr, except } => addrs.push_block(*cidr, except),
            Peer::Pods {
                namespaces: None,
                pods,
            } => {
                for (pod, ips) in self.by_namespace.get(namespace).into_iter().flatten() {
                    if pods.matches(&pod.labels) {
                        ips.iter().for_each(|ip| addrs.push(*ip));
                    }
                }
            }
            Peer::Pods {
                namespaces: Some(namespaces),
                pods,
            } => {
                // Each namespace's labels are matched once, not once per pod.
                for (name, in_namespace) in &self.by_namespace {
                    if !self.view.namespace_selected(name, namespaces) {
                        continue;
                    }
                    for (pod, ips) in in_namespace {
                        if pods.matches(&pod.labels) {
                            ips.iter().for_each(|ip| addrs.push(*ip));
                        }
                    }
                }
            }
        }
        let one = match peer {
            // Blocks are a few ranges: always the profiles' own.
            Peer::IpBlock { .. } => PeerAddrs {
                addrs: Rc::new(addrs.normalize()),
                shared: None,
            },
            Peer::Pods { .. } => {
                let key = format!("{}\n{peer:?}", cache_key.0);
                self.pods_peer(&key, addrs)
            }
        };
        let one = Rc::new(one);
        self.peers.insert(cache_key, Rc::clone(&one));
        one
    }

    /// The parts of one ingress rule for the destination pod's named ports.
    fn ingress_parts(
        &mut self,
        policy: &'a PolicyInfo,
        rule: &'a Rule,
        named: &[NamedPort],
        out: &mut Parts,
    ) {
        let keys = match &rule.ports {
            None => vec![ALL_KEYS],
            Some(ports) => ports
                .iter()
                .flat_map(|p| match &p.port {
                    PortRef::Any => vec![(key(p.protocol, 0), key(p.protocol, u16::MAX))],
                    PortRef::Range(a, b) => vec![(key(p.protocol, *a), key(p.protocol, *b))],
                    PortRef::Named(name) => named
                        .iter()
                        .filter(|n| n.name == *name && n.protocol == p.protocol)
                        .map(|n| (key(n.protocol, n.port), key(n.protocol, n.port)))
                        .collect(),
                })
                .collect(),
        };
        self.add_peers(&policy.namespace, rule.peers.as_deref(), &keys, out);
    }

    /// The parts of one egress rule: numbered ports for every peer address, named
    /// ports for each destination pod inside the peers that has that port (grouped by
    /// the number the name has on them).
    fn egress_parts(&mut self, policy: &'a PolicyInfo, rule: &'a Rule, out: &mut Parts) {
        let namespace = policy.namespace.as_str();
        let Some(ports) = &rule.ports else {
            self.add_peers(namespace, rule.peers.as_deref(), &vec![ALL_KEYS], out);
            return;
        };
        let mut numbered = Vec::new();
        for p in ports {
            match &p.port {
                PortRef::Any => numbered.push((key(p.protocol, 0), key(p.protocol, u16::MAX))),
                PortRef::Range(a, b) => numbered.push((key(p.protocol, *a), key(p.protocol, *b))),
                PortRef::Named(name) => {
                    let parts = self.named_destinations(namespace, rule, name, p.protocol);
                    out.rects.extend(parts.rects);
                    out.shared.extend(parts.shared);
                }
            }
        }
        self.add_peers(namespace, rule.peers.as_deref(), &numbered, out);
    }

    /// Egress to the port called `name`: per peer of `rule` (or every pod), the pods
    /// inside it that have the port, by its number there.
    fn named_destinations(
        &mut self,
        namespace: &'a str,
        rule: &'a Rule,
        name: &'a str,
        protocol: u8,
    ) -> Parts {
        let mut out = Parts::default();
        let peers: Vec<Option<&'a Peer>> = match rule.peers.as_deref() {
            None => vec![None],
            Some(peers) => peers.iter().map(Some).collect(),
        };
        for peer in peers {
            let scope = peer.map_or("", |p| Self::scope(namespace, p));
            let memo = (scope, peer, name, protocol);
            if let Some(hit) = self.named.get(&memo) {
                out.rects.extend(hit.rects.iter().cloned());
                out.shared.extend(hit.shared.iter().cloned());
                continue;
            }
            let inside = peer.map(|p| self.one_peer(namespace, p));
            // The pods that can be inside: those of the namespaces a peer of pods
            // looks in.
            let view = self.view;
            let candidates = self
                .by_namespace
                .iter()
                .filter(|(ns, _)| match peer {
                    Some(Peer::Pods {
                        namespaces: None, ..
                    }) => **ns == namespace,
                    Some(Peer::Pods {
                        namespaces: Some(selector),
                        ..
                    }) => view.namespace_selected(ns, selector),
                    Some(Peer::IpBlock { .. }) | None => true,
                })
                .flat_map(|(_, pods)| pods);
            let mut by_number: BTreeMap<u16, Addrs> = BTreeMap::new();
            for (pod, ips) in candidates {
                for n in &pod.named_ports {
                    if n.name != name || n.protocol != protocol {
                        continue;
                    }
                    for ip in ips.iter() {
                        if inside.as_ref().is_none_or(|p| p.addrs.contains(*ip)) {
                            by_number.entry(n.port).or_default().push(*ip);
                        }
                    }
                }
            }
            let peer_key = match peer {
                None => "*".to_owned(),
                Some(p) => format!("{scope}\n{p:?}"),
            };
            let mut parts = Parts::default();
            for (number, mine) in by_number {
                let k = key(protocol, number);
                let group =
                    self.pods_peer(&format!("{peer_key}\n{name}/{protocol}/{number}"), mine);
                match group.shared {
                    Some(set) => parts.shared.push((set, vec![(k, k)])),
                    None => parts.rects.push(Rect {
                        addrs: group.addrs,
                        keys: vec![(k, k)],
                    }),
                }
            }
            out.rects.extend(parts.rects.iter().cloned());
            out.shared.extend(parts.shared.iter().cloned());
            self.named.insert(memo, Rc::new(parts));
        }
        out
    }
}

/// Cuts the union of `rects` into disjoint boxes of one family.
fn boxes(rects: &[Rect], v4: bool) -> Vec<Allow> {
    let mut cuts: BTreeSet<u64> = BTreeSet::new();
    let pieces: Vec<(&Ranges, &Keys)> = rects
        .iter()
        .map(|r| (if v4 { &r.addrs.v4 } else { &r.addrs.v6 }, &r.keys))
        .filter(|(a, k)| !a.is_empty() && !k.is_empty())
        .collect();
    for (_, keys) in &pieces {
        for &(a, b) in keys.iter() {
            cuts.insert(u64::from(a));
            cuts.insert(u64::from(b) + 1);
        }
    }
    let cuts: Vec<u64> = cuts.into_iter().collect();
    // Each elementary key interval with the union of the addresses covering it;
    // neighbours with equal addresses merged.
    let mut cells: Vec<((u32, u32), Ranges)> = Vec::new();
    for w in cuts.windows(2) {
        let (lo, hi) = (w[0], w[1] - 1);
        let mut addrs: Ranges = Vec::new();
        for (a, keys) in &pieces {
            if keys
                .iter()
                .any(|&(s, e)| u64::from(s) <= lo && hi <= u64::from(e))
            {
                addrs.extend_from_slice(a);
            }
        }
        if addrs.is_empty() {
            continue;
        }
        let addrs = merge(addrs);
        let (lo, hi) = (
            u32::try_from(lo).unwrap_or(u32::MAX),
            u32::try_from(hi).unwrap_or(u32::MAX),
        );
        match cells.last_mut() {
            Some(((_, last_hi), last)) if *last_hi + 1 == lo && *last == addrs => *last_hi = hi,
            _ => cells.push(((lo, hi), addrs)),
        }
    }
    let mut out = Vec::new();
    for ((lo, hi), addrs) in cells {
        for (protocols, ports) in split_keys(lo, hi) {
            for &(s, e) in &addrs {
                out.push(Allow {
                    first: from_u128(s, v4),
                    last: from_u128(e, v4),
                    protocols,
                    ports,
                });
            }
        }
    }
    out.sort();
    out
}

/// A key interval as at most three (protocols, ports) boxes.
pub(crate) fn split_keys(lo: u32, hi: u32) -> Vec<((u8, u8), (u16, u16))> {
    let proto = |k: u32| u8::try_from(k >> 16).unwrap_or(u8::MAX);
    let port = |k: u32| u16::try_from(k & 0xFFFF).unwrap_or(u16::MAX);
    let (p1, q1, p2, q2) = (proto(lo), port(lo), proto(hi), port(hi));
    if p1 == p2 {
        return vec![((p1, p1), (q1, q2))];
    }
    let mut out = Vec::new();
    let (mut first_whole, mut last_whole) = (p1, p2);
    if q1 != 0 {
        out.push(((p1, p1), (q1, u16::MAX)));
        first_whole = p1 + 1;
    }
    let tail = q2 != u16::MAX;
    if tail {
        last_whole = p2 - 1;
    }
    if first_whole <= last_whole {
        out.push(((first_whole, last_whole), (0, u16::MAX)));
    }
    if tail {
        out.push(((p2, p2), (0, q2)));
    }
    out
}

/// A name for the kernel: 16 hex digits of a hash of `parts`.
fn hash_name(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update(part.as_bytes());
        hash.update(b"\n");
    }
    hash.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A profile's name: a hash of the keys of the policies that select its pods and, for
/// ingress, of the pods' named ports.
fn name(policies: &[String], named_ports: &[NamedPort]) -> String {
    let ports: Vec<String> = named_ports
        .iter()
        .map(|p| format!("{}/{}/{}", p.name, p.protocol, p.port))
        .collect();
    let parts: Vec<&str> = policies
        .iter()
        .map(String::as_str)
        .chain(ports.iter().map(String::as_str))
        .collect();
    hash_name(&parts)
}

/// Compiles the view for the pods of `node`: the pods the API places there, and those
/// the CNI plugin recorded here (their addresses before the API shows them, see
/// [`View::with_records`]).
pub fn compile(view: &View<'_>, node: &str) -> Compiled {
    compile_sharing(view, node, SHARE_FROM)
}

/// [`compile`], with peers of pods of at least `share_from` address ranges shared.
pub fn compile_sharing(view: &View<'_>, node: &str, share_from: usize) -> Compiled {
    let mut out = Compiled::default();
    let mut compiler = Compiler::new(view, share_from);
    let mut local: BTreeMap<String, (&PodInfo, BTreeSet<IpAddr>)> = view
        .pods
        .values()
        .filter(|pod| pod.node == node && !pod.host_network)
        .map(|pod| (pod.key(), (&**pod, view.ips(pod).into_iter().collect())))
        .collect();
    for (ip, key) in view.records() {
        if let Some(pod) = view.pods.get(key).filter(|p| !p.host_network) {
            local
                .entry(key.clone())
                .or_insert_with(|| (pod, BTreeSet::new()))
                .1
                .insert(*ip);
        }
    }
    let mut policies_in: HashMap<&str, Vec<&PolicyInfo>> = HashMap::new();
    for policy in view.policies.values() {
        policies_in
            .entry(policy.namespace.as_str())
            .or_default()
            .push(policy);
    }
    // Pods selected by the same policies (and, for ingress, with the same named ports)
    // have the same profile: computed once.
    let mut ingress_memo: HashMap<(Vec<String>, Vec<NamedPort>), String> = HashMap::new();
    let mut egress_memo: HashMap<Vec<String>, String> = HashMap::new();
    for (key, (pod, ips)) in &local {
        for ip in ips {
            out.judged.insert(*ip, key.clone());
        }
        let selecting: Vec<&PolicyInfo> = policies_in
            .get(pod.namespace.as_str())
            .into_iter()
            .flatten()
            .copied()
            .filter(|p| View::selects(p, pod))
            .collect();
        let ingress: Vec<&PolicyInfo> = selecting
            .iter()
            .copied()
            .filter(|p| p.ingress.is_some())
            .collect();
        if !ingress.is_empty() {
            let names: Vec<String> = ingress.iter().map(|p| p.key()).collect();
            let memo_key = (names, pod.named_ports.clone());
            let profile = match ingress_memo.get(&memo_key) {
                Some(name) => name.clone(),
                None => {
                    let mut parts = Parts::default();
                    for policy in &ingress {
                        for rule in policy.ingress.iter().flatten() {
                            compiler.ingress_parts(policy, rule, &pod.named_ports, &mut parts);
                        }
                    }
                    let n = name(&memo_key.0, &memo_key.1);
                    out.ingress_profiles.insert(n.clone(), profile_of(parts));
                    ingress_memo.insert(memo_key, n.clone());
                    n
                }
            };
            for ip in ips {
                out.ingress.insert(*ip, profile.clone());
            }
        }
        let egress: Vec<&PolicyInfo> = selecting
            .iter()
            .copied()
            .filter(|p| p.egress.is_some())
            .collect();
        if !egress.is_empty() {
            let names: Vec<String> = egress.iter().map(|p| p.key()).collect();
            let profile = match egress_memo.get(&names) {
                Some(name) => name.clone(),
                None => {
                    let mut parts = Parts::default();
                    for policy in &egress {
                        for rule in policy.egress.iter().flatten() {
                            compiler.egress_parts(policy, rule, &mut parts);
                        }
                    }
                    let n = name(&names, &[]);
                    out.egress_profiles.insert(n.clone(), profile_of(parts));
                    egress_memo.insert(names, n.clone());
                    n
                }
            };
            for ip in ips {
                out.egress.insert(*ip, profile.clone());
            }
        }
    }
    // The shared sets the profiles use.
    for profile in out
        .ingress_profiles
        .values()
        .chain(out.egress_profiles.values())
    {
        for rule in &profile.peers {
            if !out.peer_sets.contains_key(&rule.set)
                && let Some(addrs) = compiler.shared.get(&rule.set)
            {
                out.peer_sets.insert(rule.set.clone(), addrs.each());
            }
        }
    }
    out
}

fn profile_of(parts: Parts) -> Profile {
    let mut allow = boxes(&parts.rects, true);
    allow.extend(boxes(&parts.rects, false));
    let mut peers: Vec<PeerRule> = parts
        .shared
        .into_iter()
        .flat_map(|(set, keys)| {
            keys.into_iter()
                .flat_map(|(lo, hi)| split_keys(lo, hi))
                .map(move |(protocols, ports)| PeerRule {
                    set: set.clone(),
                    protocols,
                    ports,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    peers.sort();
    peers.dedup();
    Profile {
        allow,
        peers,
        verdicts: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::model::tests::{cluster, policy};
    use crate::policy::objects::{TCP, UDP};
    use serde_json::json;
    use std::sync::Arc;

    fn allows(c: &Compiled, profile: &Profile, ip: IpAddr, protocol: u8, port: u16) -> bool {
        let ours = |protocols: (u8, u8), ports: (u16, u16)| {
            (protocols.0..=protocols.1).contains(&protocol) && (ports.0..=ports.1).contains(&port)
        };
        profile
            .allow
            .iter()
            .any(|b| b.first <= ip && ip <= b.last && ours(b.protocols, b.ports))
            || profile
                .peers
                .iter()
                .any(|r| c.peer_sets[&r.set].contains(&ip) && ours(r.protocols, r.ports))
    }

    fn disjoint(profile: &[Allow]) -> bool {
        profile.iter().enumerate().all(|(i, a)| {
            profile[i + 1..].iter().all(|b| {
                a.first.is_ipv4() != b.first.is_ipv4()
                    || a.last < b.first
                    || b.last < a.first
                    || a.protocols.1 < b.protocols.0
                    || b.protocols.1 < a.protocols.0
                    || a.ports.1 < b.ports.0
                    || b.ports.1 < a.ports.0
            })
        })
    }

    #[test]
    fn key_intervals_split_into_boxes() {
        assert_eq!(split_keys(key(6, 80), key(6, 81)), vec![((6, 6), (80, 81))]);
        assert_eq!(
            split_keys(ALL_KEYS.0, ALL_KEYS.1),
            vec![((0, 255), (0, 65535))]
        );
        assert_eq!(
            split_keys(key(6, 80), key(17, 53)),
            vec![
                ((6, 6), (80, 65535)),
                ((7, 16), (0, 65535)),
                ((17, 17), (0, 53))
            ]
        );
        assert_eq!(
            split_keys(key(6, 80), key(7, 65535)),
            vec![((6, 6), (80, 65535)), ((7, 7), (0, 65535))]
        );
    }

    #[test]
    fn blocks_minus_holes() {
        let mut a = Addrs::default();
        a.push_block(
            "10.0.0.0/8".parse().unwrap(),
            &[
                "10.1.0.0/16".parse().unwrap(),
                "10.0.0.0/24".parse().unwrap(),
            ],
        );
        let a = a.normalize();
        assert!(a.contains("10.2.3.4".parse().unwrap()));
        assert!(!a.contains("10.1.3.4".parse().unwrap()));
        assert!(!a.contains("10.0.0.255".parse().unwrap()));
        assert!(a.contains("10.0.1.0".parse().unwrap()));
        assert_eq!(a.v4.len(), 2);
    }

    /// Every local pod's profiles agree with the model for every source pod, both
    /// protocols and both ports; boxes are disjoint.
    #[test]
    fn profiles_agree_with_the_model_on_the_upstream_cluster() {
        let (pods, ns) = cluster();
        let cases = vec![
            json!({"podSelector": {}}),
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "b"}}},
                                         {"podSelector": {"matchLabels": {"pod": "c"}}}],
                                "ports": [{"port": "serve-81-tcp"}, {"protocol": "UDP", "port": 80}]}]}),
            json!({"podSelector": {}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["z"]}]}}],
                               "ports": [{"port": "serve-80-tcp"}, {"port": 81, "endPort": 81, "protocol": "UDP"}]}]}),
            json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.1.0/24"]}},
                                                            {"ipBlock": {"cidr": "fd00::/64"}}]}]}),
            json!({"podSelector": {"matchLabels": {"pod": "b"}}, "ingress": [{}], "egress": [{"ports": [{"protocol": "UDP"}]}],
                   "policyTypes": ["Ingress", "Egress"]}),
        ];
        for (i, spec) in cases.into_iter().enumerate() {
            let policies: BTreeMap<_, _> = [policy("x", "p", spec.clone())].into_iter().collect();
            let view = View::new(&pods, &ns, &policies);
            // Every peer of pods shared, and the default.
            for (node, share_from) in [("n1", 1), ("n2", 1), ("n1", SHARE_FROM), ("n2", SHARE_FROM)]
            {
                let c = compile_sharing(&view, node, share_from);
                for p in c
                    .ingress_profiles
                    .values()
                    .chain(c.egress_profiles.values())
                {
                    assert!(disjoint(&p.allow), "case {i}: {p:?}");
                }
                for dst in pods.values().filter(|p| p.node == node) {
                    for src in pods.values() {
                        for (s, d) in src.ips.iter().zip(&dst.ips) {
                            for protocol in [TCP, UDP] {
                                for port in [80, 81] {
                                    let model = view.verdict(*s, *d, protocol, port);
                                    if let Some(ingress) = &model.ingress {
                                        let got = c.ingress.get(d).is_none_or(|n| {
                                            allows(&c, &c.ingress_profiles[n], *s, protocol, port)
                                        });
                                        assert_eq!(
                                            got,
                                            ingress.allowed(),
                                            "case {i} ingress {} -> {} {protocol}/{port}",
                                            src.key(),
                                            dst.key()
                                        );
                                    }
                                    // Egress of the local pod towards every pod.
                                    let out = view.verdict(*d, *s, protocol, port);
                                    if let Some(egress) = &out.egress {
                                        let got = c.egress.get(d).is_none_or(|n| {
                                            allows(&c, &c.egress_profiles[n], *s, protocol, port)
                                        });
                                        assert_eq!(
                                            got,
                                            egress.allowed(),
                                            "case {i} egress {} -> {} {protocol}/{port}",
                                            dst.key(),
                                            src.key()
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn pods_selected_by_the_same_policies_share_a_profile_and_names_are_stable() {
        let (pods, ns) = cluster();
        let policies: BTreeMap<_, _> = [policy("x", "deny", json!({"podSelector": {}}))]
            .into_iter()
            .collect();
        let view = View::new(&pods, &ns, &policies);
        let c = compile(&view, "n2");
        assert_eq!(c.ingress.len(), 4, "x/b and x/c, two addresses each");
        assert_eq!(c.ingress_profiles.len(), 1);
        assert_eq!(
            c.ingress_profiles.values().next().unwrap(),
            &Profile::default()
        );
        assert_eq!(c.judged.len(), 12, "six local pods, two addresses each");
        assert_eq!(compile(&view, "n2"), c);
    }

    #[test]
    fn a_profile_keeps_its_name_when_what_it_allows_changes() {
        let (mut pods, ns) = cluster();
        let policies: BTreeMap<_, _> = [policy(
            "x",
            "from-b",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        )]
        .into_iter()
        .collect();
        let before = compile(&View::new(&pods, &ns, &policies), "n1");
        // x/c gets the label the peer selects: the profile allows more, same name.
        let c = Arc::make_mut(pods.get_mut("x/c").unwrap());
        c.labels.insert("pod".into(), "b".into());
        let c_ip = c.ips[0];
        let after = compile(&View::new(&pods, &ns, &policies), "n1");
        let a_ip = pods["x/a"].ips[0];
        assert_eq!(before.ingress[&a_ip], after.ingress[&a_ip]);
        let name = &after.ingress[&a_ip];
        assert!(!allows(
            &before,
            &before.ingress_profiles[name],
            c_ip,
            TCP,
            80
        ));
        assert!(allows(&after, &after.ingress_profiles[name], c_ip, TCP, 80));
        // Another policy selecting x/a is another profile.
        let mut more = policies.clone();
        more.extend([policy("x", "deny", json!({"podSelector": {}}))]);
        let other = compile(&View::new(&pods, &ns, &more), "n1");
        assert_ne!(&other.ingress[&a_ip], name);
    }

    #[test]
    fn a_handed_over_address_is_judged_before_the_api_shows_it() {
        let (mut pods, ns) = cluster();
        let new = PodInfo {
            namespace: "x".into(),
            name: "new".into(),
            node: "n1".into(),
            ..PodInfo::default()
        };
        pods.insert(new.key(), Arc::new(new));
        let policies: BTreeMap<_, _> = [policy("x", "deny", json!({"podSelector": {}}))]
            .into_iter()
            .collect();
        let ip: IpAddr = "10.244.0.99".parse().unwrap();
        let records = [(ip, "x/new".to_owned())].into_iter().collect();
        let view = View::with_records(&pods, &ns, &policies, records);
        let c = compile(&view, "n1");
        assert!(c.ingress.contains_key(&ip));
        assert_eq!(c.judged.get(&ip).map(String::as_str), Some("x/new"));
    }

    #[test]
    fn a_recorded_address_belongs_to_the_recorded_pod_not_to_the_one_leaving() {
        let (mut pods, ns) = cluster();
        // x/a (node n1) is leaving; the API still shows its address, which the plugin
        // has just given to a new pod x/new on the same node.
        let reused = pods["x/a"].ips[0];
        let mut new = PodInfo {
            namespace: "x".into(),
            name: "new".into(),
            node: "n1".into(),
            ..PodInfo::default()
        };
        new.labels.insert("pod".into(), "new".into());
        pods.insert(new.key(), Arc::new(new));
        let policies: BTreeMap<_, _> = [policy(
            "x",
            "isolate-a",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}}),
        )]
        .into_iter()
        .collect();
        let records = [(reused, "x/new".to_owned())].into_iter().collect();
        let view = View::with_records(&pods, &ns, &policies, records);
        let c = compile(&view, "n1");
        assert_eq!(c.judged[&reused], "x/new");
        assert!(
            !c.ingress.contains_key(&reused),
            "x/new is not isolated: {c:?}"
        );
    }

    #[test]
    fn a_pod_known_only_from_its_record_is_a_peer_already() {
        let (mut pods, ns) = cluster();
        let mut client = PodInfo {
            namespace: "y".into(),
            name: "client".into(),
            node: "n1".into(),
            ..PodInfo::default()
        };
        client.labels.insert("role".into(), "client".into());
        pods.insert(client.key(), Arc::new(client));
        let policies: BTreeMap<_, _> = [policy(
            "x",
            "clients-only",
            json!({"podSelector": {}, "ingress": [{"from": [
                {"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "client"}}}
            ]}]}),
        )]
        .into_iter()
        .collect();
        let ip: IpAddr = "10.244.0.77".parse().unwrap();
        let records = [(ip, "y/client".to_owned())].into_iter().collect();
        let view = View::with_records(&pods, &ns, &policies, records);
        let c = compile(&view, "n1");
        let xa = pods["x/a"].ips[0];
        assert!(allows(
            &c,
            &c.ingress_profiles[&c.ingress[&xa]],
            ip,
            TCP,
            80
        ));
        assert!(view.verdict(ip, xa, TCP, 80).allowed());
    }

    #[test]
    fn a_big_peer_is_one_shared_set_and_a_pod_joining_it_changes_only_the_set() {
        let (mut pods, ns) = cluster();
        let from_every_a = json!({"podSelector": {}, "ingress": [{
            "from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "a"}}}],
            "ports": [{"port": 80}]}]});
        let policies: BTreeMap<_, _> = [
            policy("x", "from-a", from_every_a.clone()),
            policy("y", "from-a", from_every_a),
        ]
        .into_iter()
        .collect();
        let before = compile_sharing(&View::new(&pods, &ns, &policies), "n1", 1);
        assert_eq!(before.peer_sets.len(), 1, "{before:?}");
        let (set, addrs) = before.peer_sets.iter().next().unwrap();
        let every_a: BTreeSet<IpAddr> = pods
            .values()
            .filter(|p| p.labels.get("pod").map(String::as_str) == Some("a"))
            .flat_map(|p| p.ips.iter().copied())
            .collect();
        assert_eq!(addrs, &every_a);
        assert_eq!(before.ingress_profiles.len(), 2);
        for profile in before.ingress_profiles.values() {
            assert!(profile.allow.is_empty(), "{profile:?}");
            assert_eq!(
                profile.peers,
                [PeerRule {
                    set: set.clone(),
                    protocols: (TCP, TCP),
                    ports: (80, 80)
                }]
            );
        }
        // z/b becomes an `a`: the set gains its addresses; the profiles stay as
        // they were.
        let zb = Arc::make_mut(pods.get_mut("z/b").unwrap());
        zb.labels.insert("pod".into(), "a".into());
        let zb_ips = zb.ips.clone();
        let after = compile_sharing(&View::new(&pods, &ns, &policies), "n1", 1);
        assert_eq!(after.ingress_profiles, before.ingress_profiles);
        assert!(zb_ips.iter().all(|ip| after.peer_sets[set].contains(ip)));
        // With the default threshold, six addresses are copied into the profiles.
        let small = compile(&View::new(&pods, &ns, &policies), "n1");
        assert!(small.peer_sets.is_empty());
    }
}
