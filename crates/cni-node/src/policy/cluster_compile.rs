//! ClusterNetworkPolicy compiled for this node's pods, in the shape the datapath loads:
//! per tier and direction, each local pod's *profile* (shared by the pods that the same
//! policies select), which sends every peer address it has a word for to a *row*: the
//! rules that hold the peer, in evaluation order, cut into disjoint intervals of
//! (protocol and destination port) with the verdict and the rule of the first rule that
//! matches there. Where a profile sends no peer, or a row has no interval, the tier has
//! no word and the packet goes on to the next tier, as after a `Pass`.
//!
//! Peers are put in *classes* first ([`Classes`]): the addresses that the same peers of
//! all rules hold (and, for the destinations of egress rules with named ports, that have
//! the same named ports) are one class, which every rule holds or does not. A profile
//! is then cut once per class, not once per address: a selector of thousands of pods
//! costs a row or a few, and a pod coming or going changes which row its address goes
//! to, not the rows. Single addresses (pods', Nodes') are classes of their own lookup;
//! the networks that rules name are cut into disjoint ranges, each of one class, for
//! the addresses that are none of them. A single address inside a range is given the
//! range's peers too, so its row says, wherever the range's row says anything, the
//! same.
//!
//! Protocol and port are one key, `protocol << 16 | port`, as in [`super::compile`]: a
//! protocol entry is one interval of it, no `protocols` is every key. A named port is
//! resolved against the destination pod: the local pod's own for ingress (the profile
//! depends on them), the peer's for egress (its class does).
//!
//! [`super::cluster_network_policy::compile`] names the profiles and rows for the
//! datapath; [`ClusterCompiled::lookup`] is checked against [`super::cluster_model`]
//! on random clusters.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use cni_protocol::ip::{bounds, to_u128};

use super::cluster_model::TieredView;
use super::cluster_objects::{Action, ClusterPeer, ClusterPolicyInfo, ClusterPort, ClusterRule};
use super::objects::{NamedPort, PodInfo};
use super::pipeline::Tier;
use super::selector::Selector;

/// The largest key: protocol 255, port 65535.
const MAX_KEY: u32 = (255 << 16) | 0xffff;

fn key(protocol: u8, port: u16) -> u32 {
    (u32::from(protocol) << 16) | u32::from(port)
}

/// The rule a box's verdict comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleRef {
    /// The policy's name (shared by the boxes of its rules).
    pub policy: Arc<str>,
    /// The rule's index in the policy's list for the direction.
    pub index: usize,
}

/// One interval of a row: keys `keys` (inclusive, `protocol << 16 | port`) get
/// `verdict`, from `rule`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowBox {
    /// First and last key.
    pub keys: (u32, u32),
    /// What the tier does there; a rule that failed closed is a `Deny` here.
    pub verdict: Action,
    /// The rule that decided.
    pub rule: RuleRef,
}

/// A row: disjoint key intervals in order, none empty. Shared (the same `Arc`) by the
/// classes, of one profile, whose covering rules are the same.
pub type Row = Arc<Vec<RowBox>>;

/// What one profile decides: the row of each class it has a word for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileRows {
    /// Class -> its row (never empty).
    pub rows: HashMap<u32, Row>,
}

/// One tier of one direction: local pod address -> its profile, shared (the same `Arc`)
/// by the pods that the same policies select. A pod the tier has no rule for has no
/// entry.
pub type TierTable = BTreeMap<IpAddr, Arc<ProfileRows>>;

/// Addresses `first..=last` (integers of one family) of class `class`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassRange {
    /// IPv4 (else IPv6).
    pub v4: bool,
    /// First address.
    pub first: u128,
    /// Last address.
    pub last: u128,
    /// The class.
    pub class: u32,
}

/// The classes of the peers of all rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Classes {
    /// Single addresses (pods' and the Nodes' that rules name) and their class.
    pub points: BTreeMap<IpAddr, u32>,
    /// The networks that rules name, cut into disjoint ranges, sorted (IPv6 after
    /// IPv4), each of one class; an address in no range of no class has no class.
    pub ranges: Vec<ClassRange>,
}

impl Classes {
    /// The class of the range that holds `ip`.
    pub fn range_class(&self, ip: IpAddr) -> Option<u32> {
        let (v4, n) = (ip.is_ipv4(), to_u128(ip));
        let at = self.ranges.partition_point(|r| (!r.v4, r.last) < (!v4, n));
        self.ranges
            .get(at)
            .filter(|r| r.v4 == v4 && r.first <= n && n <= r.last)
            .map(|r| r.class)
    }
}

/// What the Admin and Baseline tiers hold on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterCompiled {
    /// The classes the profiles' rows are of.
    pub classes: Classes,
    /// Admin tier, traffic to the local pods.
    pub admin_ingress: TierTable,
    /// Admin tier, traffic from the local pods.
    pub admin_egress: TierTable,
    /// Baseline tier, traffic to the local pods.
    pub baseline_ingress: TierTable,
    /// Baseline tier, traffic from the local pods.
    pub baseline_egress: TierTable,
    /// The named ports of the local pods, by the addresses the tables hold them at.
    pub named_ports: BTreeMap<IpAddr, Vec<NamedPort>>,
}

impl ClusterCompiled {
    /// The table of a tier and direction (`None` for the NetworkPolicy tier).
    pub fn table(&self, tier: Tier, ingress: bool) -> Option<&TierTable> {
        match (tier, ingress) {
            (Tier::Admin, true) => Some(&self.admin_ingress),
            (Tier::Admin, false) => Some(&self.admin_egress),
            (Tier::Baseline, true) => Some(&self.baseline_ingress),
            (Tier::Baseline, false) => Some(&self.baseline_egress),
            (Tier::NetworkPolicy, _) => None,
        }
    }

    /// The row a profile sends `peer` to, as the datapath looks it up: a single address
    /// the profile has a row for is judged by that row alone; any other address by its
    /// range's.
    pub fn row_of<'a>(&self, profile: &'a ProfileRows, peer: IpAddr) -> Option<&'a Row> {
        match self
            .classes
            .points
            .get(&peer)
            .and_then(|c| profile.rows.get(c))
        {
            Some(row) => Some(row),
            None => profile.rows.get(&self.classes.range_class(peer)?),
        }
    }

    /// The box that holds a connection of the local pod address `local` with `peer`,
    /// in one tier and direction: the tier's verdict, or `None` (no word: next tier).
    pub fn lookup(
        &self,
        tier: Tier,
        ingress: bool,
        local: IpAddr,
        peer: IpAddr,
        protocol: u8,
        port: u16,
    ) -> Option<&RowBox> {
        let profile = self.table(tier, ingress)?.get(&local)?;
        let k = key(protocol, port);
        self.row_of(profile, peer)?
            .iter()
            .find(|b| (b.keys.0..=b.keys.1).contains(&k))
    }

    /// How many boxes the distinct rows of all tables hold.
    pub fn boxes(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        [
            &self.admin_ingress,
            &self.admin_egress,
            &self.baseline_ingress,
            &self.baseline_egress,
        ]
        .iter()
        .flat_map(|t| t.values())
        .flat_map(|profile| profile.rows.values())
        .filter(|row| seen.insert(Arc::as_ptr(row)))
        .map(|row| row.len())
        .sum()
    }
}

/// One class's covering rules in rule order, each with the keys it holds there.
type Covering = Vec<(usize, (u32, u32))>;

/// What a pod's profile in one tier and direction depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ProfileKey<'a> {
    tier: Tier,
    ingress: bool,
    /// The policies that select the pod, in evaluation order.
    policies: Vec<&'a str>,
    /// The pod's named ports (ingress only).
    named_ports: &'a [NamedPort],
}

/// Compiles the tiers for the pods of `node` (their addresses as the view has them).
pub fn compile(tiered: &TieredView<'_>, node: &str) -> ClusterCompiled {
    let view = tiered.view;
    let peers = PeerIndex::new(tiered);
    let mut out = ClusterCompiled {
        classes: peers.classes.clone(),
        ..ClusterCompiled::default()
    };
    // Pods that the same policies select get the same profile (for ingress, also the
    // same named ports, which ingress rules resolve against the subject pod): cut once.
    let mut cut_for: HashMap<ProfileKey, Option<Arc<ProfileRows>>> = HashMap::new();
    for pod in view
        .pods
        .values()
        .filter(|p| p.node == node && !p.host_network)
    {
        let ips = view.ips(pod);
        if ips.is_empty() {
            continue;
        }
        for ip in &ips {
            out.named_ports.insert(*ip, pod.named_ports.clone());
        }
        for tier in [Tier::Admin, Tier::Baseline] {
            let policies: Vec<&ClusterPolicyInfo> = tiered
                .ordered()
                .iter()
                .copied()
                .filter(|p| p.tier == tier && tiered.subject_holds(&p.subject, pod))
                .collect();
            for ingress in [true, false] {
                let profile = ProfileKey {
                    tier,
                    ingress,
                    policies: policies.iter().map(|p| p.name.as_str()).collect(),
                    named_ports: if ingress { &pod.named_ports } else { &[] },
                };
                let table = match (tier, ingress) {
                    (Tier::Admin, true) => &mut out.admin_ingress,
                    (Tier::Admin, false) => &mut out.admin_egress,
                    (_, true) => &mut out.baseline_ingress,
                    (_, false) => &mut out.baseline_egress,
                };
                let made = cut_for
                    .entry(profile)
                    .or_insert_with(|| cut_profile(&peers, &policies, ingress, pod));
                // None: no row, so no entry.
                if let Some(rows) = made {
                    for ip in &ips {
                        table.insert(*ip, Arc::clone(rows));
                    }
                }
            }
        }
    }
    out
}

/// One profile: the rules of `policies` for the direction, in order, cut per class.
/// `None` when it has a word for no peer.
fn cut_profile(
    peers: &PeerIndex<'_>,
    policies: &[&ClusterPolicyInfo],
    ingress: bool,
    subject: &PodInfo,
) -> Option<Arc<ProfileRows>> {
    // Each rule's verdict and reference, and per class the rules that hold it.
    let mut decided: Vec<(Action, RuleRef)> = Vec::new();
    let mut covering: HashMap<u32, Covering> = HashMap::new();
    for policy in policies {
        let rules = if ingress {
            &policy.ingress
        } else {
            &policy.egress
        };
        let name: Arc<str> = Arc::from(policy.name.as_str());
        for (index, rule) in rules.iter().enumerate() {
            let at = decided.len();
            let verdict = if rule.failed_closed {
                Action::Deny
            } else {
                rule.action
            };
            decided.push((
                verdict,
                RuleRef {
                    policy: Arc::clone(&name),
                    index,
                },
            ));
            peers.paint(rule, ingress, subject, &mut |class, keys| {
                covering.entry(class).or_default().push((at, keys));
            });
        }
    }
    // Classes covered alike get one row.
    let mut row_of: HashMap<Covering, Option<Row>> = HashMap::new();
    let mut rows = HashMap::new();
    for (class, mut cover) in covering {
        // Rule order: stable, so each rule's keys stay in the order they were painted.
        cover.sort_by_key(|(rule, _)| *rule);
        let row = row_of
            .entry(cover)
            .or_insert_with_key(|cover| {
                let row: Vec<RowBox> = first_match_row(cover)
                    .into_iter()
                    .map(|(keys, rule)| RowBox {
                        keys,
                        verdict: decided[rule].0,
                        rule: decided[rule].1.clone(),
                    })
                    .collect();
                (!row.is_empty()).then(|| Arc::new(row))
            })
            .clone();
        if let Some(row) = row {
            rows.insert(class, row);
        }
    }
    (!rows.is_empty()).then(|| Arc::new(ProfileRows { rows }))
}

/// The key intervals of one class, each with the first rule (of `cover`, in rule order)
/// that covers it, equal neighbours merged.
fn first_match_row(cover: &[(usize, (u32, u32))]) -> Vec<((u32, u32), usize)> {
    let mut key_cuts: Vec<u32> = cover
        .iter()
        .flat_map(|(_, (k0, k1))| [*k0, k1 + 1])
        .collect();
    key_cuts.sort_unstable();
    key_cuts.dedup();
    let mut row: Vec<((u32, u32), usize)> = Vec::new();
    for pair in key_cuts.windows(2) {
        let keys = (pair[0], pair[1] - 1);
        let Some(&(first, _)) = cover
            .iter()
            .find(|(_, (k0, k1))| *k0 <= keys.0 && keys.0 <= *k1)
        else {
            continue;
        };
        match row.last_mut() {
            Some((last, rule)) if *rule == first && last.1 + 1 == keys.0 => last.1 = keys.1,
            _ => row.push((keys, first)),
        }
    }
    row
}

/// The names of the ports the rule names (`destinationNamedPort`).
fn named_ports_of(rule: &ClusterRule) -> Vec<&str> {
    rule.protocols
        .iter()
        .flatten()
        .filter_map(|p| match p {
            ClusterPort::Named(name) => Some(name.as_str()),
            ClusterPort::Numbers { .. } => None,
        })
        .collect()
}

/// A peer that the index knows: one of the rules', or every address (the peer of a
/// `Deny` or `Pass` rule that failed closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Known<'a> {
    Peer(&'a ClusterPeer),
    Everything,
}

/// The peers of all rules, numbered, and the classes of the addresses they hold, made
/// once a pass: each class knows which peers hold it (and, for a pod, its named ports
/// that egress rules name), each peer which classes it holds.
struct PeerIndex<'a> {
    /// Peer -> its number.
    number: HashMap<Known<'a>, usize>,
    /// The classes.
    classes: Classes,
    /// Peer number -> the classes that it holds.
    holds: Vec<Vec<u32>>,
    /// Class -> the named ports (egress rules' names only) of its pods.
    named: Vec<NamedPorts>,
}

impl<'a> PeerIndex<'a> {
    fn new(tiered: &TieredView<'a>) -> Self {
        let view = tiered.view;
        let mut number: HashMap<Known<'a>, usize> = HashMap::new();
        let mut egress_named: Vec<&str> = Vec::new();
        for policy in tiered.ordered() {
            for (rule, egress) in policy
                .ingress
                .iter()
                .map(|r| (r, false))
                .chain(policy.egress.iter().map(|r| (r, true)))
            {
                if rule.failed_closed {
                    if rule.action != Action::Accept {
                        let next = number.len();
                        number.entry(Known::Everything).or_insert(next);
                    }
                    continue;
                }
                for peer in &rule.peers {
                    let next = number.len();
                    number.entry(Known::Peer(peer)).or_insert(next);
                }
                if egress {
                    egress_named.extend(named_ports_of(rule));
                }
            }
        }
        egress_named.sort_unstable();
        egress_named.dedup();
        // The peers that select a whole namespace, and those that select pods in it.
        let mut whole: Vec<(usize, &Selector)> = Vec::new();
        let mut by_pod: Vec<(usize, &Selector, &Selector)> = Vec::new();
        // The Nodes' addresses that peers hold, and the networks, per family.
        let mut node_peers: BTreeMap<IpAddr, Vec<usize>> = BTreeMap::new();
        let mut range_ends: Vec<(bool, u128, u128, usize)> = Vec::new();
        for (known, &n) in &number {
            match known {
                Known::Everything => {
                    range_ends.push((true, 0, u128::from(u32::MAX), n));
                    range_ends.push((false, 0, u128::MAX, n));
                }
                Known::Peer(ClusterPeer::Namespaces(namespaces)) => whole.push((n, namespaces)),
                Known::Peer(ClusterPeer::Pods { namespaces, pods }) => {
                    by_pod.push((n, namespaces, pods));
                }
                Known::Peer(ClusterPeer::Networks(networks)) => {
                    for network in networks {
                        let (first, last) = bounds(*network);
                        range_ends.push((network.is_ipv4(), first, last, n));
                    }
                }
                Known::Peer(ClusterPeer::Nodes(selector)) => {
                    for node in tiered
                        .nodes
                        .values()
                        .filter(|n| selector.matches(&n.labels))
                    {
                        for ip in &node.addresses {
                            node_peers.entry(*ip).or_default().push(n);
                        }
                    }
                }
                Known::Peer(ClusterPeer::DomainNames) => {}
            }
        }
        // Pods of one namespace with the same labels (and named ports, where egress
        // rules name some) are held by the same peers: matched once. Every pod address
        // is a single address, held or not: a network that holds it, or a named port
        // that resolves against it, judges it as the pod it is.
        // Found by each pod's digest, made once in its life: hashing and comparing
        // every pod's labels at every pass would cost more than the rest of the
        // grouping.
        type Group<'g> = (&'g PodInfo, Vec<IpAddr>);
        let mut groups: Vec<Group<'_>> = Vec::new();
        let mut by_digest: HashMap<&[u8; 32], usize> = HashMap::new();
        for (ip, pod) in view.held() {
            match by_digest.entry(pod.peer_digest()) {
                Entry::Occupied(g) => groups[*g.get()].1.push(ip),
                Entry::Vacant(v) => {
                    v.insert(groups.len());
                    groups.push((pod, vec![ip]));
                }
            }
        }
        // Per namespace: the peers that hold all its pods, and those that hold the pods
        // their selector matches.
        type Selecting<'s> = (Vec<usize>, Vec<(usize, &'s Selector)>);
        let mut of_namespace: HashMap<&str, Selecting<'_>> = HashMap::new();
        // The networks cut into disjoint ranges, each with the peers that hold it.
        let mut table = ClassTable {
            holds: vec![Vec::new(); number.len()],
            ..ClassTable::default()
        };
        let mut classes = Classes::default();
        for (v4, first, last, peers) in cut_ranges(&range_ends) {
            let class = table.intern(peers, Vec::new());
            classes.ranges.push(ClassRange {
                v4,
                first,
                last,
                class,
            });
        }
        let mut points: Vec<(IpAddr, u32)> = Vec::new();
        for (pod, ips) in groups {
            let (namespace, labels, named_ports) = (
                pod.namespace.as_str(),
                &pod.labels,
                pod.named_ports.as_slice(),
            );
            let ports: NamedPorts = named_ports
                .iter()
                .filter(|n| egress_named.binary_search(&n.name.as_str()).is_ok())
                .map(|n| (n.name.clone(), n.protocol, n.port))
                .collect();
            let (selected, by_labels) = of_namespace.entry(namespace).or_insert_with(|| {
                (
                    whole
                        .iter()
                        .filter(|(_, s)| view.namespace_selected(namespace, s))
                        .map(|(n, _)| *n)
                        .collect(),
                    by_pod
                        .iter()
                        .filter(|(_, s, _)| view.namespace_selected(namespace, s))
                        .map(|(n, _, pods)| (*n, *pods))
                        .collect(),
                )
            });
            let mut peers = selected.clone();
            peers.extend(
                by_labels
                    .iter()
                    .filter(|(_, pods)| pods.matches(labels))
                    .map(|(n, _)| *n),
            );
            peers.sort_unstable();
            // The group's own class, for its addresses that no Node or range holds.
            let mut own: Option<Option<u32>> = None;
            for ip in ips {
                let node = node_peers.remove(&ip);
                let class = if node.is_none() && classes.range_class(ip).is_none() {
                    *own.get_or_insert_with(|| {
                        (!peers.is_empty()).then(|| table.intern(peers.clone(), ports.clone()))
                    })
                } else {
                    table.single(&classes, &peers, node, ports.clone(), ip)
                };
                if let Some(class) = class {
                    points.push((ip, class));
                }
            }
        }
        // The Nodes' addresses that are no pod's.
        for (ip, node) in node_peers {
            if let Some(class) = table.single(&classes, &[], Some(node), Vec::new(), ip) {
                points.push((ip, class));
            }
        }
        classes.points = points.into_iter().collect();
        let ClassTable { holds, named, .. } = table;
        Self {
            number,
            classes,
            holds,
            named,
        }
    }

    /// Calls `paint` with every class that `rule` holds and each key interval it holds
    /// there, for a subject pod `subject` in one direction.
    fn paint(
        &self,
        rule: &ClusterRule,
        ingress: bool,
        subject: &PodInfo,
        paint: &mut dyn FnMut(u32, (u32, u32)),
    ) {
        if rule.failed_closed {
            // An Accept that failed closed matches nothing; a Deny or Pass, everything.
            if rule.action != Action::Accept
                && let Some(&n) = self.number.get(&Known::Everything)
            {
                for &class in &self.holds[n] {
                    paint(class, (0, MAX_KEY));
                }
            }
            return;
        }
        // The keys every class gets (numbered ports; all keys without protocols).
        let keys: Vec<(u32, u32)> = match &rule.protocols {
            None => vec![(0, MAX_KEY)],
            Some(list) => list
                .iter()
                .filter_map(|p| match p {
                    ClusterPort::Numbers {
                        protocol,
                        first,
                        last,
                    } => Some((key(*protocol, *first), key(*protocol, *last))),
                    ClusterPort::Named(_) => None,
                })
                .collect(),
        };
        let named = named_ports_of(rule);
        // Ingress resolves a named port against the subject: the same for every peer.
        let subject_named: Vec<(u32, u32)> = if ingress {
            subject
                .named_ports
                .iter()
                .filter(|n| named.contains(&n.name.as_str()))
                .map(|n| (key(n.protocol, n.port), key(n.protocol, n.port)))
                .collect()
        } else {
            Vec::new()
        };
        let mut classes: Vec<u32> = rule
            .peers
            .iter()
            .filter_map(|p| self.number.get(&Known::Peer(p)))
            .flat_map(|&n| self.holds[n].iter().copied())
            .collect();
        classes.sort_unstable();
        classes.dedup();
        for class in classes {
            for k in keys.iter().chain(&subject_named) {
                paint(class, *k);
            }
            if !ingress && !named.is_empty() {
                // Egress resolves it against the peer: its class's pods' named ports.
                for (name, protocol, port) in &self.named[class as usize] {
                    if named.contains(&name.as_str()) {
                        let k = key(*protocol, *port);
                        paint(class, (k, k));
                    }
                }
            }
        }
    }
}

/// A pod's named ports: name, protocol, port.
type NamedPorts = Vec<(String, u8, u16)>;

/// The classes as they are numbered: each distinct (peers, named ports) once.
#[derive(Default)]
struct ClassTable {
    of: HashMap<(Vec<usize>, NamedPorts), u32>,
    /// Class -> the peers that hold it (sorted).
    peers: Vec<Vec<usize>>,
    /// Class -> its pods' named ports.
    named: Vec<NamedPorts>,
    /// Peer -> the classes it holds.
    holds: Vec<Vec<u32>>,
}

impl ClassTable {
    /// The class of the single address `ip` that `peers` (sorted) hold, the Node peers
    /// `node` too, and the peers of the range that holds it; `None` when none does.
    fn single(
        &mut self,
        classes: &Classes,
        peers: &[usize],
        node: Option<Vec<usize>>,
        ports: NamedPorts,
        ip: IpAddr,
    ) -> Option<u32> {
        let range = classes.range_class(ip);
        if node.is_none() && range.is_none() {
            return (!peers.is_empty()).then(|| self.intern(peers.to_vec(), ports));
        }
        let mut all = peers.to_vec();
        all.extend(node.into_iter().flatten());
        if let Some(range) = range {
            all.extend_from_slice(&self.peers[range as usize]);
        }
        all.sort_unstable();
        all.dedup();
        (!all.is_empty()).then(|| self.intern(all, ports))
    }

    /// The class of the addresses that `peers` (sorted, without repeats) hold, with the
    /// named ports `ports`.
    fn intern(&mut self, peers: Vec<usize>, ports: NamedPorts) -> u32 {
        let key = (peers, ports);
        if let Some(class) = self.of.get(&key) {
            return *class;
        }
        let class = u32::try_from(self.peers.len()).unwrap_or(u32::MAX);
        for &p in &key.0 {
            self.holds[p].push(class);
        }
        self.peers.push(key.0.clone());
        self.named.push(key.1.clone());
        self.of.insert(key, class);
        class
    }
}

/// The ranges `ends` (family, first, last, peer) cut where any starts or ends, each
/// piece with the peers that hold it (none: left out), equal neighbours merged; IPv4
/// first, then by address.
fn cut_ranges(ends: &[(bool, u128, u128, usize)]) -> Vec<(bool, u128, u128, Vec<usize>)> {
    let mut out: Vec<(bool, u128, u128, Vec<usize>)> = Vec::new();
    for v4 in [true, false] {
        let ours: Vec<&(bool, u128, u128, usize)> = ends.iter().filter(|e| e.0 == v4).collect();
        let mut cuts: Vec<u128> = ours
            .iter()
            .flat_map(|(_, first, last, _)| [Some(*first), last.checked_add(1)])
            .flatten()
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        let top = if v4 { u128::from(u32::MAX) } else { u128::MAX };
        for (i, &first) in cuts.iter().enumerate() {
            let last = cuts.get(i + 1).map_or(top, |n| n - 1);
            if first > top {
                break;
            }
            let mut peers: Vec<usize> = ours
                .iter()
                .filter(|(_, f, l, _)| *f <= first && first <= *l)
                .map(|(_, _, _, p)| *p)
                .collect();
            if peers.is_empty() {
                continue;
            }
            peers.sort_unstable();
            peers.dedup();
            match out.last_mut() {
                Some((lv4, _, l, p))
                    if *lv4 == v4 && *p == peers && l.checked_add(1) == Some(first) =>
                {
                    *l = last;
                }
                _ => out.push((v4, first, last, peers)),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::SlimNode;
    use crate::policy::cluster_model::{Decision, NodePeer};
    use crate::policy::model::View;
    use crate::policy::objects::{PolicyInfo, SCTP, SlimNetworkPolicy, SlimPod, TCP, UDP};
    use crate::policy::selector::Labels;
    use crate::store::ItemMap;
    use proptest::prelude::*;
    use proptest::sample::select;
    use serde_json::{Value, json};

    const NAMESPACES: [&str; 3] = ["a", "b", "c"];
    const PROBES: [(u8, u16); 6] = [
        (TCP, 80),
        (TCP, 8080),
        (UDP, 53),
        (SCTP, 9),
        (1, 0),
        (TCP, 0),
    ];

    fn selector() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(json!({})),
            select(vec!["x", "y"]).prop_map(|v| json!({"matchLabels": {"team": v}})),
            Just(json!({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]})),
        ]
    }

    fn peer(egress: bool) -> BoxedStrategy<Value> {
        let mut options = vec![
            selector().prop_map(|s| json!({"namespaces": s})).boxed(),
            (selector(), selector())
                .prop_map(|(n, p)| json!({"pods": {"namespaceSelector": n, "podSelector": p}}))
                .boxed(),
            Just(json!({"unknownPeer": {}})).boxed(),
        ];
        if egress {
            options.push(
                select(vec![
                    "0.0.0.0/0",
                    "10.1.0.0/24",
                    "10.1.1.3/32",
                    "fd00::/8",
                    "192.0.2.0/24",
                ])
                .prop_map(|c| json!({"networks": [c]}))
                .boxed(),
            );
            options.push(selector().prop_map(|s| json!({"nodes": s})).boxed());
            options.push(Just(json!({"domainNames": ["example.org"]})).boxed());
        }
        proptest::strategy::Union::new(options).boxed()
    }

    fn rule(egress: bool) -> impl Strategy<Value = Value> {
        let protocol = select(vec![
            json!({"tcp": {"destinationPort": {"number": 80}}}),
            json!({"tcp": {"destinationPort": {"range": {"start": 1, "end": 1000}}}}),
            json!({"udp": {}}),
            json!({"sctp": {"destinationPort": {"number": 9}}}),
            json!({"destinationNamedPort": "web"}),
            json!({"destinationNamedPort": "dns"}),
        ]);
        (
            select(vec!["Accept", "Deny", "Pass"]),
            proptest::collection::vec(peer(egress), 1..=2),
            proptest::option::of(proptest::collection::vec(protocol, 1..=2)),
        )
            .prop_map(move |(action, peers, protocols)| {
                let mut rule = json!({"action": action});
                rule[if egress { "to" } else { "from" }] = Value::from(peers);
                if let Some(p) = protocols {
                    rule["protocols"] = Value::from(p);
                }
                rule
            })
    }

    fn policy() -> impl Strategy<Value = (String, Value)> {
        (
            select(vec!["p", "q", "r"]),
            select(vec!["Admin", "Baseline"]),
            0u32..3,
            prop_oneof![
                selector().prop_map(|s| json!({"namespaces": s})),
                (selector(), selector())
                    .prop_map(|(n, p)| json!({"pods": {"namespaceSelector": n, "podSelector": p}})),
            ],
            proptest::collection::vec(rule(false), 0..=3),
            proptest::collection::vec(rule(true), 0..=3),
        )
            .prop_map(|(name, tier, priority, subject, ingress, egress)| {
                (
                    format!("{name}-{tier}"),
                    json!({"tier": tier, "priority": priority, "subject": subject,
                           "ingress": ingress, "egress": egress}),
                )
            })
    }

    /// Pods: namespace, label, node, whether hostNetwork, named port "web" number.
    fn pods() -> impl Strategy<Value = Vec<(usize, Option<&'static str>, u8, bool, u16)>> {
        proptest::collection::vec(
            (
                0..NAMESPACES.len(),
                proptest::option::of(select(vec!["x", "y"])),
                1u8..=2,
                proptest::bool::weighted(0.1),
                select(vec![80u16, 8080]),
            ),
            1..=6,
        )
    }

    struct Cluster {
        pods: ItemMap<PodInfo>,
        namespaces: ItemMap<Labels>,
        policies: ItemMap<PolicyInfo>,
        cluster: ItemMap<ClusterPolicyInfo>,
        nodes: BTreeMap<String, NodePeer>,
    }

    fn cluster(
        pods: &[(usize, Option<&'static str>, u8, bool, u16)],
        labels: &[Option<&'static str>],
        policies: &[(String, Value)],
        isolate: bool,
    ) -> Cluster {
        let mut out = Cluster {
            pods: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            policies: BTreeMap::new(),
            cluster: BTreeMap::new(),
            nodes: BTreeMap::new(),
        };
        for (i, ns) in NAMESPACES.iter().enumerate() {
            let mut l = Labels::new();
            if let Some(team) = labels.get(i).copied().flatten() {
                l.insert("team".into(), team.into());
            }
            out.namespaces.insert((*ns).into(), Arc::new(l));
        }
        for n in 1..=2u8 {
            let node: SlimNode = serde_json::from_value(json!({
                "metadata": {"name": format!("n{n}"), "labels": {"team": if n == 1 { "x" } else { "y" }}},
                "status": {"addresses": [{"type": "InternalIP", "address": format!("192.0.2.{n}")},
                                         {"type": "InternalIP", "address": format!("fd00:2::{n}")}]},
            }))
            .unwrap();
            out.nodes
                .insert(format!("n{n}"), NodePeer::from_slim(&node));
        }
        for (i, (ns, label, node, host, web)) in pods.iter().enumerate() {
            let ips = if *host {
                vec![format!("192.0.2.{node}"), format!("fd00:2::{node}")]
            } else {
                vec![
                    format!("10.1.{node}.{}", i + 1),
                    format!("fd00:1:{node}::{}", i + 1),
                ]
            };
            let slim: SlimPod = serde_json::from_value(json!({
                "metadata": {"namespace": NAMESPACES[*ns], "name": format!("pod{i}"),
                             "labels": label.map(|l| json!({"team": l})).unwrap_or(json!({}))},
                "spec": {"nodeName": format!("n{node}"), "hostNetwork": host,
                         "containers": [{"ports": [
                             {"name": "web", "containerPort": web},
                             {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]},
                "status": {"podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()},
            }))
            .unwrap();
            let info = PodInfo::from_slim(&slim);
            out.pods.insert(info.key(), Arc::new(info));
        }
        if isolate {
            let slim: SlimNetworkPolicy = serde_json::from_value(json!({
                "metadata": {"namespace": "a", "name": "np"},
                "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                         "ingress": [{"from": [{"podSelector": {}}]}],
                         "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]},
            }))
            .unwrap();
            let info = PolicyInfo::from_slim(&slim);
            out.policies.insert(info.key(), Arc::new(info));
        }
        for (name, spec) in policies {
            let info = ClusterPolicyInfo::read(name, spec);
            out.cluster.insert(name.clone(), Arc::new(info));
        }
        out
    }

    /// The tiers' answer for one direction from the compiled tables, the NetworkPolicy
    /// tier's from the model (it is compiled elsewhere).
    fn from_tables(
        compiled: &ClusterCompiled,
        ingress: bool,
        local: IpAddr,
        peer: IpAddr,
        protocol: u8,
        port: u16,
        network_policy: (bool, bool),
    ) -> (Option<Tier>, bool, Option<RuleRef>, Vec<RuleRef>) {
        let mut passed = Vec::new();
        for tier in [Tier::Admin, Tier::NetworkPolicy, Tier::Baseline] {
            if tier == Tier::NetworkPolicy {
                let (isolated, allowed) = network_policy;
                if isolated {
                    return (Some(tier), allowed, None, passed);
                }
                continue;
            }
            match compiled.lookup(tier, ingress, local, peer, protocol, port) {
                Some(b) if b.verdict == Action::Pass => passed.push(b.rule.clone()),
                Some(b) => {
                    return (
                        Some(tier),
                        b.verdict == Action::Accept,
                        Some(b.rule.clone()),
                        passed,
                    );
                }
                None => {}
            }
        }
        (None, true, None, passed)
    }

    fn model_answer(d: &Decision) -> (Option<Tier>, bool, Option<RuleRef>, Vec<RuleRef>) {
        let reference = |r: &crate::policy::cluster_model::RuleMatch| RuleRef {
            policy: r.policy.as_str().into(),
            index: r.index,
        };
        (
            d.tier,
            d.allowed,
            d.rule.as_ref().map(reference),
            d.passed.iter().map(reference).collect(),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

        /// For every local pod, every peer address (pods, nodes, outside) in both
        /// families and every probe, both directions: the compiled boxes give the
        /// model's verdict, tier, deciding rule and Pass rules.
        #[test]
        fn compiled_boxes_give_the_models_verdict(
            pods in pods(),
            labels in proptest::collection::vec(proptest::option::of(select(vec!["x", "y"])), 3),
            policies in proptest::collection::vec(policy(), 0..=4),
            isolate in proptest::bool::ANY,
        ) {
            let c = cluster(&pods, &labels, &policies, isolate);
            let view = View::new(&c.pods, &c.namespaces, &c.policies);
            let tiered = TieredView::new(&view, &c.cluster, &c.nodes);
            let compiled = compile(&tiered, "n1");
            let mut peers: Vec<IpAddr> = c.pods.values().flat_map(|p| p.ips.clone()).collect();
            peers.extend(["192.0.2.1", "192.0.2.2", "198.51.100.7", "fd00:2::1", "2001:db8::1"]
                .iter()
                .map(|a| a.parse::<IpAddr>().unwrap()));
            for local_pod in c.pods.values().filter(|p| p.node == "n1" && !p.host_network) {
                for local in &local_pod.ips {
                    for peer in peers.iter().filter(|p| p.is_ipv4() == local.is_ipv4()) {
                        for (protocol, port) in PROBES {
                            for ingress in [true, false] {
                                let verdict = if ingress {
                                    tiered.verdict(*peer, *local, protocol, port)
                                } else {
                                    tiered.verdict(*local, *peer, protocol, port)
                                };
                                let side = if ingress { &verdict.ingress } else { &verdict.egress };
                                let Some(direction) = side else { continue };
                                let np = &direction.network_policy;
                                let got = from_tables(
                                    &compiled, ingress, *local, *peer, protocol, port,
                                    (!np.isolated_by.is_empty(), np.allowed()),
                                );
                                prop_assert_eq!(
                                    &got,
                                    &model_answer(&direction.decided),
                                    "{} {} {} {}/{}: {:?}",
                                    if ingress { "ingress of" } else { "egress of" },
                                    local, peer, protocol, port, policies
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn peers_of_the_same_rules_share_one_row() {
        let c = cluster(
            &[(0, Some("x"), 1, false, 80), (1, None, 2, false, 8080)],
            &[None, Some("x"), None],
            &[(
                "p".into(),
                json!({"tier": "Admin", "priority": 0, "subject": {"namespaces": {}},
                       "ingress": [
                           {"action": "Deny", "from": [{"namespaces": {}}],
                            "protocols": [{"tcp": {"destinationPort": {"number": 80}}}]},
                           {"action": "Accept", "from": [{"namespaces": {}}]}]}),
            )],
            false,
        );
        let view = View::new(&c.pods, &c.namespaces, &c.policies);
        let tiered = TieredView::new(&view, &c.cluster, &c.nodes);
        let compiled = compile(&tiered, "n1");
        let local: IpAddr = "10.1.1.1".parse().unwrap();
        let profile = &compiled.admin_ingress[&local];
        // Every pod of both families is held by the same peers: one class, one row of
        // Deny on TCP 80 and Accept on the keys below and above it.
        assert_eq!(profile.rows.len(), 1, "{profile:#?}");
        let row = profile.rows.values().next().unwrap();
        assert_eq!(
            row.iter().map(|b| (b.keys, b.verdict)).collect::<Vec<_>>(),
            [
                ((0, key(TCP, 79)), Action::Accept),
                ((key(TCP, 80), key(TCP, 80)), Action::Deny),
                ((key(TCP, 81), MAX_KEY), Action::Accept),
            ]
        );
        assert_eq!(compiled.boxes(), 3);
        assert!(compiled.admin_egress.is_empty());
        assert!(compiled.baseline_ingress.is_empty());
        // Every pod address is a single address of that class; no range.
        assert_eq!(compiled.classes.points.len(), 4, "{:?}", compiled.classes);
        assert!(compiled.classes.ranges.is_empty());
        let peer: IpAddr = "10.1.2.2".parse().unwrap();
        assert_eq!(
            compiled
                .lookup(Tier::Admin, true, local, peer, TCP, 80)
                .map(|b| b.verdict),
            Some(Action::Deny)
        );
        assert_eq!(
            compiled
                .lookup(Tier::Admin, true, local, peer, UDP, 80)
                .map(|b| b.verdict),
            Some(Action::Accept)
        );
        assert_eq!(
            compiled.lookup(
                Tier::Admin,
                true,
                local,
                "192.0.2.9".parse().unwrap(),
                TCP,
                80
            ),
            None
        );
    }
}
