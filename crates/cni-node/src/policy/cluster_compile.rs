//! ClusterNetworkPolicy compiled for this node's pods, in the shape the datapath loads
//! into one verdict map per tier and direction: for each local pod address, direction and tier, the
//! rules of the policies whose subject holds the pod, in evaluation order, cut into
//! pairwise disjoint boxes of (peer addresses, protocol and destination port) with the
//! verdict and the rule of the first rule that matches there ([`TierTable`]). Where no
//! box lies the tier has no word and the packet goes on to the next tier, as after a
//! `Pass`.
//!
//! Protocol and port are one key, `protocol << 16 | port`, as in [`super::compile`]: a
//! protocol entry is one interval of it, no `protocols` is every key. The boxes come
//! from a grid: every address and key where some rule's rectangle starts or ends cuts
//! the space, each cell takes the first rule that holds it, and equal neighbours are
//! merged back (along the key, then along the address). A named port is resolved
//! against the destination pod: the local pod's own for ingress, each peer pod's for
//! egress.
//!
//! [`super::cluster_network_policy::compile`] groups the pods' boxes into the profiles
//! the datapath loads; the boxes are checked against [`super::cluster_model`] on random
//! clusters.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use cni_protocol::ip::{bounds, from_u128, to_u128};

use super::cluster_model::TieredView;
use super::cluster_objects::{Action, ClusterPeer, ClusterPolicyInfo, ClusterPort, ClusterRule};
use super::objects::PodInfo;
use super::pipeline::Tier;

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

/// One box of a tier's verdict map: peers `addresses` (inclusive, as integers of one
/// family) on keys `keys` (inclusive) get `verdict`, from `rule`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerdictBox {
    /// IPv4 (else IPv6).
    pub v4: bool,
    /// First and last peer address.
    pub addresses: (u128, u128),
    /// First and last key (`protocol << 16 | port`).
    pub keys: (u32, u32),
    /// What the tier does there; a rule that failed closed is a `Deny` here.
    pub verdict: Action,
    /// The rule that decided.
    pub rule: RuleRef,
}

impl VerdictBox {
    /// Whether the box holds the peer `ip` on `protocol`/`port`.
    pub fn holds(&self, ip: IpAddr, protocol: u8, port: u16) -> bool {
        let (n, k) = (to_u128(ip), key(protocol, port));
        ip.is_ipv4() == self.v4
            && (self.addresses.0..=self.addresses.1).contains(&n)
            && (self.keys.0..=self.keys.1).contains(&k)
    }
}

/// One tier of one direction: local pod address -> its disjoint boxes, shared (the same
/// `Arc`) by the pods that the same policies select. A pod the tier has no rule for has
/// no entry.
pub type TierTable = BTreeMap<IpAddr, Arc<Vec<VerdictBox>>>;

/// What the Admin and Baseline tiers hold on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterCompiled {
    /// Admin tier, traffic to the local pods.
    pub admin_ingress: TierTable,
    /// Admin tier, traffic from the local pods.
    pub admin_egress: TierTable,
    /// Baseline tier, traffic to the local pods.
    pub baseline_ingress: TierTable,
    /// Baseline tier, traffic from the local pods.
    pub baseline_egress: TierTable,
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
    ) -> Option<&VerdictBox> {
        self.table(tier, ingress)?
            .get(&local)?
            .iter()
            .find(|b| b.holds(peer, protocol, port))
    }

    /// How many boxes all tables hold.
    pub fn boxes(&self) -> usize {
        [
            &self.admin_ingress,
            &self.admin_egress,
            &self.baseline_ingress,
            &self.baseline_egress,
        ]
        .iter()
        .flat_map(|t| t.values())
        .map(|boxes| boxes.len())
        .sum()
    }
}

/// One address interval's key intervals, each with the index of its deciding rule.
type Row = Vec<((u32, u32), usize)>;

/// A rectangle of one family: addresses × keys, inclusive.
type Rect = ((u128, u128), (u32, u32));

/// The address ranges a peer holds, per family (`true`: IPv4).
type PeerRanges = Vec<(bool, (u128, u128))>;

/// The rectangles that cover an address interval, as (rule, keys), in rule order.
type Covering = Vec<(usize, (u32, u32))>;

/// What a pod's boxes in one tier and direction depend on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ProfileKey {
    tier: Tier,
    ingress: bool,
    /// The policies that select the pod, in evaluation order.
    policies: Vec<String>,
    /// The pod's named ports (ingress only).
    named_ports: Vec<(String, u8, u16)>,
}

/// One rule as rectangles per family, with what it does.
#[derive(Clone)]
struct Painted {
    v4: Vec<Rect>,
    v6: Vec<Rect>,
    verdict: Action,
    rule: RuleRef,
}

/// Compiles the tiers for the pods of `node` (their addresses as the view has them).
pub fn compile(tiered: &TieredView<'_>, node: &str) -> ClusterCompiled {
    let mut out = ClusterCompiled::default();
    let view = tiered.view;
    // Pods that the same policies select get the same boxes (for ingress, also the same
    // named ports, which ingress rules resolve against the subject pod): cut once.
    let mut cut_for: HashMap<ProfileKey, Option<Arc<Vec<VerdictBox>>>> = HashMap::new();
    let mut painted_rule: HashMap<(RuleRef, bool), Arc<Painted>> = HashMap::new();
    let peers = PeerIndex::new(tiered);
    for pod in view
        .pods
        .values()
        .filter(|p| p.node == node && !p.host_network)
    {
        let ips = view.ips(pod);
        if ips.is_empty() {
            continue;
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
                    policies: policies.iter().map(|p| p.name.clone()).collect(),
                    named_ports: if ingress {
                        pod.named_ports
                            .iter()
                            .map(|n| (n.name.clone(), n.protocol, n.port))
                            .collect()
                    } else {
                        Vec::new()
                    },
                };
                let table = match (tier, ingress) {
                    (Tier::Admin, true) => &mut out.admin_ingress,
                    (Tier::Admin, false) => &mut out.admin_egress,
                    (_, true) => &mut out.baseline_ingress,
                    (_, false) => &mut out.baseline_egress,
                };
                if let Some(cached) = cut_for.get(&profile) {
                    // None: no rule in this direction, so no entry.
                    if let Some(boxes) = cached {
                        for ip in &ips {
                            table.insert(*ip, Arc::clone(boxes));
                        }
                    }
                    continue;
                }
                let mut painted: Vec<Arc<Painted>> = Vec::new();
                for policy in &policies {
                    let rules = if ingress {
                        &policy.ingress
                    } else {
                        &policy.egress
                    };
                    let name: Arc<str> = Arc::from(policy.name.as_str());
                    for (index, rule) in rules.iter().enumerate() {
                        let reference = RuleRef {
                            policy: Arc::clone(&name),
                            index,
                        };
                        // Only an ingress rule's named ports depend on the subject pod;
                        // any other rule paints the same for every pod: once a pass.
                        if ingress && has_named_port(rule) {
                            painted.push(Arc::new(paint(&peers, pod, ingress, rule, reference)));
                            continue;
                        }
                        let key = (reference.clone(), ingress);
                        let done = painted_rule.entry(key).or_insert_with(|| {
                            Arc::new(paint(&peers, pod, ingress, rule, reference))
                        });
                        painted.push(Arc::clone(done));
                    }
                }
                if painted.is_empty() {
                    cut_for.insert(profile, None);
                    continue;
                }
                let mut boxes = cut(&painted, true);
                boxes.extend(cut(&painted, false));
                let boxes = Arc::new(boxes);
                for ip in &ips {
                    table.insert(*ip, Arc::clone(&boxes));
                }
                cut_for.insert(profile, Some(boxes));
            }
        }
    }
    out
}

/// Whether the rule names a port (`destinationNamedPort`).
fn has_named_port(rule: &ClusterRule) -> bool {
    rule.protocols
        .iter()
        .flatten()
        .any(|p| matches!(p, ClusterPort::Named(_)))
}

/// The rectangles a rule matches for `pod` (the subject) in one direction.
fn paint(
    peers: &PeerIndex<'_, '_>,
    pod: &PodInfo,
    ingress: bool,
    rule: &ClusterRule,
    reference: RuleRef,
) -> Painted {
    let verdict = if rule.failed_closed {
        Action::Deny
    } else {
        rule.action
    };
    let (mut v4s, mut v6s): (Vec<Rect>, Vec<Rect>) = (Vec::new(), Vec::new());
    if rule.failed_closed {
        // An Accept that failed closed matches nothing; a Deny or Pass, everything.
        if rule.action != Action::Accept {
            v4s.push(((0, u128::from(u32::MAX)), (0, MAX_KEY)));
            v6s.push(((0, u128::MAX), (0, MAX_KEY)));
        }
    } else {
        let mut push = |range: (u128, u128), v4: bool, keys: (u32, u32)| {
            if v4 {
                v4s.push((range, keys));
            } else {
                v6s.push((range, keys));
            }
        };
        rule_rects(peers, pod, ingress, rule, &mut push);
    }
    Painted {
        v4: merged(v4s),
        v6: merged(v6s),
        verdict,
        rule: reference,
    }
}

/// The same area in fewer rectangles: those of equal keys whose addresses overlap or
/// touch become one (a selector's pods sit at neighbouring addresses more often than
/// not).
fn merged(mut rects: Vec<Rect>) -> Vec<Rect> {
    rects.sort_unstable_by_key(|((a0, a1), keys)| (*keys, *a0, *a1));
    let mut out: Vec<Rect> = Vec::with_capacity(rects.len());
    for (addresses, keys) in rects {
        match out.last_mut() {
            Some((last, last_keys))
                if *last_keys == keys && last.1.checked_add(1).is_none_or(|n| n >= addresses.0) =>
            {
                last.1 = last.1.max(addresses.1);
            }
            _ => out.push((addresses, keys)),
        }
    }
    out
}

/// The rectangles of a rule that did not fail closed.
fn rule_rects(
    peers: &PeerIndex<'_, '_>,
    pod: &PodInfo,
    ingress: bool,
    rule: &ClusterRule,
    push: &mut impl FnMut((u128, u128), bool, (u32, u32)),
) {
    // The keys every peer address gets (numbered ports; all keys without protocols).
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
    let named: Vec<&str> = rule
        .protocols
        .iter()
        .flatten()
        .filter_map(|p| match p {
            ClusterPort::Named(name) => Some(name.as_str()),
            ClusterPort::Numbers { .. } => None,
        })
        .collect();
    let mut ranges: Vec<(bool, (u128, u128))> = Vec::new();
    for peer in &rule.peers {
        ranges.extend_from_slice(&peers.ranges(peer));
    }
    for &(v4, range) in &ranges {
        for keys in &keys {
            push(range, v4, *keys);
        }
    }
    if named.is_empty() {
        return;
    }
    if ingress {
        // The destination is the subject pod: its named ports, from every peer.
        for port in pod
            .named_ports
            .iter()
            .filter(|n| named.contains(&n.name.as_str()))
        {
            let k = key(port.protocol, port.port);
            for &(v4, range) in &ranges {
                push(range, v4, (k, k));
            }
        }
    } else {
        // The destination is the peer: each pod's own named ports at the addresses it
        // holds (the model resolves a named port against the pod that holds the
        // address) that the peers hold.
        for peer in &rule.peers {
            peers.for_each_held(peer, |ip, peer_pod| {
                let n = to_u128(ip);
                for port in peer_pod
                    .named_ports
                    .iter()
                    .filter(|n| named.contains(&n.name.as_str()))
                {
                    let k = key(port.protocol, port.port);
                    push((n, n), ip.is_ipv4(), (k, k));
                }
            });
        }
    }
}

/// The addresses pods hold grouped by namespace, and the address ranges of each
/// distinct peer, made once a pass: the rules of many policies share their peers, and
/// a namespace's labels are matched once per peer instead of once per pod.
struct PeerIndex<'t, 'a> {
    tiered: &'t TieredView<'a>,
    /// Namespace -> the addresses its pods hold, with the pods.
    by_namespace: BTreeMap<&'a str, Vec<(IpAddr, &'a PodInfo)>>,
    /// Peer -> the address ranges it holds, per family (`true`: IPv4), merged.
    ranges: std::cell::RefCell<HashMap<ClusterPeer, Arc<PeerRanges>>>,
}

impl<'t, 'a> PeerIndex<'t, 'a> {
    fn new(tiered: &'t TieredView<'a>) -> Self {
        let mut by_namespace: BTreeMap<&'a str, Vec<(IpAddr, &'a PodInfo)>> = BTreeMap::new();
        for (ip, pod) in tiered.view.held() {
            by_namespace
                .entry(pod.namespace.as_str())
                .or_default()
                .push((ip, pod));
        }
        Self {
            tiered,
            by_namespace,
            ranges: std::cell::RefCell::new(HashMap::new()),
        }
    }

    /// Calls `f` with every address a pod holds that `peer` holds, and that pod: what
    /// [`TieredView::peer_holds`] says of every held address.
    fn for_each_held(&self, peer: &ClusterPeer, mut f: impl FnMut(IpAddr, &PodInfo)) {
        let view = self.tiered.view;
        match peer {
            ClusterPeer::Namespaces(namespaces) => {
                for (name, held) in &self.by_namespace {
                    if view.namespace_selected(name, namespaces) {
                        held.iter().for_each(|(ip, pod)| f(*ip, pod));
                    }
                }
            }
            ClusterPeer::Pods { namespaces, pods } => {
                for (name, held) in &self.by_namespace {
                    if view.namespace_selected(name, namespaces) {
                        held.iter()
                            .filter(|(_, pod)| pods.matches(&pod.labels))
                            .for_each(|(ip, pod)| f(*ip, pod));
                    }
                }
            }
            ClusterPeer::Networks(_) | ClusterPeer::Nodes(_) | ClusterPeer::DomainNames => {
                for held in self.by_namespace.values() {
                    held.iter()
                        .filter(|(ip, _)| self.tiered.peer_holds(peer, *ip))
                        .for_each(|(ip, pod)| f(*ip, pod));
                }
            }
        }
    }

    /// The address ranges `peer` holds, per family (`true`: IPv4).
    fn ranges(&self, peer: &ClusterPeer) -> Arc<PeerRanges> {
        if let Some(done) = self.ranges.borrow().get(peer) {
            return Arc::clone(done);
        }
        let mut out = Vec::new();
        match peer {
            ClusterPeer::Namespaces(_) | ClusterPeer::Pods { .. } => {
                self.for_each_held(peer, |ip, _| {
                    let n = to_u128(ip);
                    out.push((ip.is_ipv4(), (n, n)));
                });
            }
            ClusterPeer::Networks(networks) => {
                out.extend(networks.iter().map(|n| (n.is_ipv4(), bounds(*n))));
            }
            ClusterPeer::Nodes(selector) => {
                for node in self
                    .tiered
                    .nodes
                    .values()
                    .filter(|n| selector.matches(&n.labels))
                {
                    for ip in &node.addresses {
                        let n = to_u128(*ip);
                        out.push((ip.is_ipv4(), (n, n)));
                    }
                }
            }
            ClusterPeer::DomainNames => {}
        }
        // Fewer ranges, the same addresses: neighbouring pods are one range.
        out.sort_unstable();
        let mut merged_ranges: Vec<(bool, (u128, u128))> = Vec::with_capacity(out.len());
        for (v4, (first, last)) in out {
            match merged_ranges.last_mut() {
                Some((last_v4, range))
                    if *last_v4 == v4 && range.1.checked_add(1).is_none_or(|n| n >= first) =>
                {
                    range.1 = range.1.max(last);
                }
                _ => merged_ranges.push((v4, (first, last))),
            }
        }
        let done = Arc::new(merged_ranges);
        self.ranges
            .borrow_mut()
            .insert(peer.clone(), Arc::clone(&done));
        done
    }
}

fn rects(p: &Painted, v4: bool) -> &[Rect] {
    if v4 { &p.v4 } else { &p.v6 }
}

/// The first-match-wins boxes of one family: a sweep along the addresses, keeping the
/// rectangles that cover the current address interval (in rule order), each interval's
/// key intervals decided by the first of them that covers each, and equal neighbouring
/// rows merged.
fn cut(painted: &[Arc<Painted>], v4: bool) -> Vec<VerdictBox> {
    // (first address, last address, rule, keys), by first address.
    let mut starts: Vec<(u128, u128, usize, (u32, u32))> = painted
        .iter()
        .enumerate()
        .flat_map(|(rule, p)| {
            rects(p, v4)
                .iter()
                .map(move |&((a0, a1), keys)| (a0, a1, rule, keys))
        })
        .collect();
    starts.sort_unstable_by_key(|r| r.0);
    let mut address_cuts: Vec<u128> = Vec::with_capacity(starts.len() * 2);
    for &(a0, a1, _, _) in &starts {
        address_cuts.push(a0);
        if let Some(next) = a1.checked_add(1) {
            address_cuts.push(next);
        }
    }
    address_cuts.sort_unstable();
    address_cuts.dedup();
    let last_address = if v4 { u128::from(u32::MAX) } else { u128::MAX };
    // Address intervals with their row, an index into `distinct`.
    let mut rows: Vec<((u128, u128), usize)> = Vec::new();
    // A row depends only on which rectangles cover the interval (their rules and keys,
    // in rule order), and the addresses of one namespace's pods are covered alike: each
    // such set is resolved once.
    let mut distinct: Vec<Row> = Vec::new();
    let mut row_of: HashMap<Covering, usize> = HashMap::new();
    let mut covering: Covering = Vec::new();
    // Rectangles covering the current interval: (last address, rule, keys), in rule order.
    let mut active: Vec<(u128, usize, (u32, u32))> = Vec::new();
    let mut next_start = 0;
    for (i, &first) in address_cuts.iter().enumerate() {
        let addresses = (
            first,
            address_cuts.get(i + 1).map_or(last_address, |n| n - 1),
        );
        active.retain(|(a1, _, _)| *a1 >= first);
        while next_start < starts.len() && starts[next_start].0 <= first {
            let (_, a1, rule, keys) = starts[next_start];
            if a1 >= first {
                let at = active.partition_point(|(_, r, _)| *r <= rule);
                active.insert(at, (a1, rule, keys));
            }
            next_start += 1;
        }
        if active.is_empty() {
            continue;
        }
        covering.clear();
        covering.extend(active.iter().map(|(_, rule, keys)| (*rule, *keys)));
        let row = match row_of.get(&covering) {
            Some(row) => *row,
            None => {
                distinct.push(first_match_row(&active));
                row_of.insert(covering.clone(), distinct.len() - 1);
                distinct.len() - 1
            }
        };
        if distinct[row].is_empty() {
            continue;
        }
        match rows.last_mut() {
            Some((last, last_row))
                if (*last_row == row || distinct[*last_row] == distinct[row])
                    && last.1.checked_add(1) == Some(addresses.0) =>
            {
                last.1 = addresses.1;
            }
            _ => rows.push((addresses, row)),
        }
    }
    rows.into_iter()
        .flat_map(|(addresses, row)| {
            distinct[row].iter().map(move |&(keys, rule)| VerdictBox {
                v4,
                addresses,
                keys,
                verdict: painted[rule].verdict,
                rule: painted[rule].rule.clone(),
            })
        })
        .collect()
}

/// The key intervals of one address interval, each with the first rule (of `active`, in
/// rule order) that covers it, equal neighbours merged.
fn first_match_row(active: &[(u128, usize, (u32, u32))]) -> Row {
    let mut key_cuts: Vec<u32> = active
        .iter()
        .flat_map(|(_, _, (k0, k1))| [*k0, k1 + 1])
        .collect();
    key_cuts.sort_unstable();
    key_cuts.dedup();
    let mut row: Row = Vec::new();
    for pair in key_cuts.windows(2) {
        let keys = (pair[0], pair[1] - 1);
        let Some(&(_, first, _)) = active
            .iter()
            .find(|(_, _, (k0, k1))| *k0 <= keys.0 && keys.0 <= *k1)
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

/// An address of a family from its integer (for messages and tests).
pub fn address(v4: bool, n: u128) -> IpAddr {
    from_u128(n, v4)
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
    fn boxes_are_disjoint_and_merged() {
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
        let boxes = &compiled.admin_ingress[&local];
        // Two pods per family: each peer address has Deny on TCP 80 and Accept on the
        // keys below and above it; the two pods' addresses are not adjacent.
        for (i, a) in boxes.iter().enumerate() {
            for b in &boxes[i + 1..] {
                let overlap = a.v4 == b.v4
                    && a.addresses.0 <= b.addresses.1
                    && b.addresses.0 <= a.addresses.1
                    && a.keys.0 <= b.keys.1
                    && b.keys.0 <= a.keys.1;
                assert!(!overlap, "{a:?} and {b:?} overlap");
            }
        }
        assert_eq!(boxes.len(), 2 * 2 * 3, "{boxes:#?}");
        assert!(compiled.admin_egress.is_empty() || compiled.admin_egress[&local].is_empty());
        assert!(compiled.baseline_ingress.is_empty());
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
