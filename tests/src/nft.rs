//! nftables inside a test namespace, as the NetworkPolicy benchmark reads it: the
//! moment a transaction is committed ([`Generation`]), and the policy table as
//! `nft -j list` prints it ([`PolicyTableView`]).
//!
//! [`Generation`] asks the namespace's nf_tables for its generation id
//! (`NFT_MSG_GETGEN`, one small netlink request and answer, no dump), which every
//! committed transaction increments, every 0.1 ms or so: the first answer with a new
//! id comes within that of the commit. Listening to the notification group instead
//! (what `nft monitor` does) would make the kernel build a notification for every
//! element of every transaction, which, measured, added about a third to the agent's
//! commits of large changes; asking costs the committer nothing. `nft -j list` never
//! commits, so reading the table between changes does not move the id.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    socket,
};
use serde_json::Value;

use crate::hostport::in_netns;
use crate::netns::Netns;

/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETGEN`.
const GETGEN: u16 = (10 << 8) | 16;
/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWGEN`: the answer.
const NEWGEN: u16 = (10 << 8) | 15;
/// `NFTA_GEN_ID`.
const NFTA_GEN_ID: u16 = 1;
const NLM_F_REQUEST: u16 = 1;
/// How long to wait between two questions.
const POLL: Duration = Duration::from_micros(100);

/// The nf_tables generation of one namespace, asked over a netlink socket made
/// there.
#[derive(Debug)]
pub struct Generation {
    fd: OwnedFd,
    seq: u32,
}

impl Generation {
    /// A socket in the namespace at `netns`.
    pub fn open(netns: &Path) -> Self {
        let fd: OwnedFd = in_netns(netns, || {
            let fd = socket(
                AddressFamily::Netlink,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::NetlinkNetFilter,
            )
            .unwrap_or_else(|e| panic!("netlink netfilter socket: {e}"));
            bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))
                .unwrap_or_else(|e| panic!("bind a netlink netfilter socket: {e}"));
            fd
        });
        Self { fd, seq: 0 }
    }

    /// The current generation id.
    pub fn current(&mut self) -> u32 {
        self.seq += 1;
        let mut msg = Vec::with_capacity(20);
        msg.extend_from_slice(&20u32.to_ne_bytes());
        msg.extend_from_slice(&GETGEN.to_ne_bytes());
        msg.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: AF_UNSPEC, version 0, resource id 0.
        msg.extend_from_slice(&[0, 0, 0, 0]);
        send(self.fd.as_raw_fd(), &msg, MsgFlags::empty())
            .unwrap_or_else(|e| panic!("ask the nf_tables generation: {e}"));
        let mut buf = [0u8; 256];
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())
                .unwrap_or_else(|e| panic!("read the nf_tables generation: {e}"));
            if let Some(id) = generation_id(&buf[..n], self.seq) {
                return id;
            }
        }
    }

    /// Waits until the generation is no longer `from` (or `deadline` passes, `None`);
    /// the moment the new id was first seen.
    pub fn changed_since(&mut self, from: u32, deadline: Instant) -> Option<Instant> {
        loop {
            if self.current() != from {
                return Some(Instant::now());
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(POLL);
        }
    }
}

/// The generation id in a `NEWGEN` answer to request `seq`, if that is what `data`
/// holds.
fn generation_id(data: &[u8], seq: u32) -> Option<u32> {
    if data.len() < 20 {
        return None;
    }
    let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
    let kind = u16::from_ne_bytes([data[4], data[5]]);
    let got_seq = u32::from_ne_bytes([data[8], data[9], data[10], data[11]]);
    if kind != NEWGEN || got_seq != seq || len > data.len() {
        return None;
    }
    let mut attrs = &data[20..len];
    while attrs.len() >= 4 {
        let alen = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let akind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if alen < 4 || alen > attrs.len() {
            return None;
        }
        if akind == NFTA_GEN_ID && alen >= 8 {
            return Some(u32::from_be_bytes([attrs[4], attrs[5], attrs[6], attrs[7]]));
        }
        attrs = &attrs[((alen + 3) & !3).min(attrs.len())..];
    }
    None
}

/// One element of a profile's set: addresses, protocols and ports, inclusive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Box3 {
    /// First and last address.
    pub addrs: (IpAddr, IpAddr),
    /// First and last IP protocol number.
    pub protocols: (u8, u8),
    /// First and last port.
    pub ports: (u16, u16),
}

impl Box3 {
    /// Whether the box holds this address, protocol and port.
    pub fn holds(&self, ip: IpAddr, protocol: u8, port: u16) -> bool {
        self.addrs.0 <= ip
            && ip <= self.addrs.1
            && (self.protocols.0..=self.protocols.1).contains(&protocol)
            && (self.ports.0..=self.ports.1).contains(&port)
    }
}

/// Parts of the policy table as `nft -j list` prints them: the IPv4 verdict maps and
/// the IPv4 sets of some profiles. Each part is listed on its own (`nft list map`,
/// `nft list set`), since listing a table of thousands of interval elements whole
/// takes nft seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyTableView {
    /// `ingress4`: pod address -> the chain it jumps to.
    pub ingress4: BTreeMap<IpAddr, String>,
    /// `egress4`: likewise.
    pub egress4: BTreeMap<IpAddr, String>,
    /// The sets read so far, by name, with their elements.
    pub sets: BTreeMap<String, Vec<Box3>>,
    /// The IPv4 peer rules of the profile chains read so far, by chain.
    pub peer_rules: BTreeMap<String, Vec<PeerRule3>>,
    /// The IPv4 peer sets read so far, by name (`peer-<name>-v4`), with their
    /// addresses.
    pub peer_sets: BTreeMap<String, BTreeSet<IpAddr>>,
}

/// A profile chain's rule over a shared peer set: `ip saddr @<set> [meta l4proto
/// <protocols>] [th dport <ports>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRule3 {
    /// The set's name (`peer-<name>-v4`).
    pub set: String,
    /// First and last IP protocol number.
    pub protocols: (u8, u8),
    /// First and last port.
    pub ports: (u16, u16),
}

impl PeerRule3 {
    /// Whether the rule's match covers this protocol and port (its set aside).
    pub fn covers(&self, protocol: u8, port: u16) -> bool {
        (self.protocols.0..=self.protocols.1).contains(&protocol)
            && (self.ports.0..=self.ports.1).contains(&port)
    }

    /// The rule a rule of `nft -j list chain` is, if it looks up a peer set.
    fn of(rule: &Value) -> Option<Self> {
        let mut out = PeerRule3 {
            set: String::new(),
            protocols: (0, u8::MAX),
            ports: (0, u16::MAX),
        };
        for e in rule["expr"].as_array()? {
            let Some(m) = e.get("match") else { continue };
            let (left, right) = (&m["left"], &m["right"]);
            if let Some(set) = right.as_str().and_then(|r| r.strip_prefix('@')) {
                if set.starts_with("peer-") && set.ends_with("-v4") {
                    out.set = set.to_owned();
                }
            } else if left["meta"]["key"] == "l4proto" {
                let (a, b) = number_range(right, protocol_number);
                out.protocols = (
                    u8::try_from(a).unwrap_or(u8::MAX),
                    u8::try_from(b).unwrap_or(u8::MAX),
                );
            } else if left["payload"]["field"] == "dport" {
                let (a, b) = number_range(right, service_number);
                out.ports = (
                    u16::try_from(a).unwrap_or(u16::MAX),
                    u16::try_from(b).unwrap_or(u16::MAX),
                );
                // `tcp dport 80`: nft folds the protocol match into the header's name.
                let protocol = &left["payload"]["protocol"];
                if protocol != "th" {
                    let n = u8::try_from(protocol_number(protocol)).unwrap_or(u8::MAX);
                    out.protocols = (n, n);
                }
            }
        }
        (!out.set.is_empty()).then_some(out)
    }
}

impl PolicyTableView {
    /// Lists the maps `ingress4` and `egress4` of `inet <table>` in `ns`; panics if
    /// nft fails or prints something this reader does not know.
    pub fn read_maps(ns: &Netns, table: &str) -> Self {
        let mut view = Self::default();
        for map in ["ingress4", "egress4"] {
            view.take(&nft_json(ns, &["list", "map", "inet", table, map]));
        }
        view
    }

    /// Lists the set `name` too.
    pub fn read_set(&mut self, ns: &Netns, table: &str, name: &str) {
        self.take(&nft_json(ns, &["list", "set", "inet", table, name]));
    }

    /// Lists the IPv4 set of the ingress profile of `ip`, if it is isolated, its
    /// chain's peer rules and their IPv4 peer sets.
    pub fn read_ingress_set(&mut self, ns: &Netns, table: &str, ip: IpAddr) {
        if let Some(chain) = self.ingress4.get(&ip).cloned() {
            let name = format!("{chain}-v4");
            self.read_set(ns, table, &name);
            let listed = nft_json(ns, &["list", "chain", "inet", table, &chain]);
            let rules: Vec<PeerRule3> = listed["nftables"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|item| item.get("rule"))
                .filter_map(PeerRule3::of)
                .collect();
            for rule in &rules {
                if !self.peer_sets.contains_key(&rule.set) {
                    let listed = nft_json(ns, &["list", "set", "inet", table, &rule.set]);
                    let addrs = listed["nftables"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|item| item.get("set"))
                        .flat_map(|set| set["elem"].as_array().cloned().unwrap_or_default())
                        .map(|e| address_range(&element_value(&e)).0)
                        .collect();
                    self.peer_sets.insert(rule.set.clone(), addrs);
                }
            }
            self.peer_rules.insert(chain, rules);
        }
    }

    /// The number of profile sets in the table (`nft list sets`, no elements).
    pub fn count_sets(ns: &Netns, table: &str) -> usize {
        nft_json(ns, &["list", "sets", "inet"])["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item.get("set"))
            .filter(|set| {
                set["table"] == table
                    && set["name"].as_str().is_some_and(|n| {
                        !n.starts_with("peer-") && (n.ends_with("-v4") || n.ends_with("-v6"))
                    })
            })
            .count()
    }

    fn take(&mut self, json: &Value) {
        for item in json["nftables"].as_array().into_iter().flatten() {
            if let Some(map) = item.get("map") {
                let name = map["name"].as_str().unwrap_or_default();
                let target = match name {
                    "ingress4" => &mut self.ingress4,
                    "egress4" => &mut self.egress4,
                    _ => continue,
                };
                for pair in map["elem"].as_array().into_iter().flatten() {
                    let key = element_value(&pair[0]);
                    let ip = key
                        .as_str()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or_else(|| panic!("map {name}: key {key} is not an address"));
                    let chain = pair[1]["jump"]["target"]
                        .as_str()
                        .or_else(|| pair[1]["goto"]["target"].as_str())
                        .unwrap_or_else(|| panic!("map {name}: verdict {} is no jump", pair[1]))
                        .to_owned();
                    target.insert(ip, chain);
                }
            } else if let Some(set) = item.get("set") {
                let name = set["name"].as_str().unwrap_or_default().to_owned();
                let boxes = set["elem"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| box_of(&element_value(e)))
                    .collect();
                self.sets.insert(name, boxes);
            }
        }
    }

    /// The IPv4 set of the chain `ingress4` sends `ip` to (`ingress-<profile>-v4`), if
    /// the pod is isolated for ingress and the set was read.
    pub fn ingress_set(&self, ip: IpAddr) -> Option<&[Box3]> {
        let chain = self.ingress4.get(&ip)?;
        self.sets.get(&format!("{chain}-v4")).map(Vec::as_slice)
    }

    /// Whether `ip` is isolated for ingress and its profile admits `from` on
    /// `protocol`/`port` (its set must have been read).
    pub fn admits(&self, ip: IpAddr, from: IpAddr, protocol: u8, port: u16) -> bool {
        let own = self
            .ingress_set(ip)
            .is_some_and(|set| set.iter().any(|b| b.holds(from, protocol, port)));
        let shared = self
            .ingress4
            .get(&ip)
            .and_then(|chain| self.peer_rules.get(chain))
            .into_iter()
            .flatten()
            .any(|r| {
                r.covers(protocol, port)
                    && self
                        .peer_sets
                        .get(&r.set)
                        .is_some_and(|set| set.contains(&from))
            });
        own || shared
    }
}

/// `nft -j <args>` in `ns`, parsed.
fn nft_json(ns: &Netns, args: &[&str]) -> Value {
    let mut argv = vec!["nft", "-j"];
    argv.extend_from_slice(args);
    let text = ns.exec_ok(&argv);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{argv:?} printed no JSON ({e}): {text}"))
}

/// The value of a set or map element (`{"elem": {"val": ..., "comment": ...}}` when it
/// has a comment or flags).
fn element_value(e: &Value) -> Value {
    e.get("elem")
        .and_then(|el| el.get("val"))
        .cloned()
        .unwrap_or_else(|| e.clone())
}

fn box_of(value: &Value) -> Box3 {
    let parts = value["concat"]
        .as_array()
        .unwrap_or_else(|| panic!("set element {value} is not a concatenation"));
    assert_eq!(parts.len(), 3, "set element {value}");
    let (a0, a1) = address_range(&parts[0]);
    let (p0, p1) = number_range(&parts[1], protocol_number);
    let (q0, q1) = number_range(&parts[2], service_number);
    Box3 {
        addrs: (a0, a1),
        protocols: (
            u8::try_from(p0).unwrap_or(u8::MAX),
            u8::try_from(p1).unwrap_or(u8::MAX),
        ),
        ports: (
            u16::try_from(q0).unwrap_or(u16::MAX),
            u16::try_from(q1).unwrap_or(u16::MAX),
        ),
    }
}

fn address_range(v: &Value) -> (IpAddr, IpAddr) {
    let parse = |s: &Value| -> IpAddr {
        s.as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{s} is not an address"))
    };
    if let Some(range) = v.get("range") {
        return (parse(&range[0]), parse(&range[1]));
    }
    if let Some(prefix) = v.get("prefix") {
        let first = parse(&prefix["addr"]);
        let len = prefix["len"].as_u64().unwrap_or(32);
        let IpAddr::V4(a) = first else {
            panic!("an IPv6 prefix {v} in an IPv4 set")
        };
        let host = if len >= 32 { 0 } else { u32::MAX >> len };
        let last = Ipv4Addr::from(u32::from(a) | host);
        return (first, IpAddr::V4(last));
    }
    let one = parse(v);
    (one, one)
}

fn number_range(v: &Value, read: fn(&Value) -> u64) -> (u64, u64) {
    if let Some(range) = v.get("range") {
        return (read(&range[0]), read(&range[1]));
    }
    let one = read(v);
    (one, one)
}

fn protocol_number(v: &Value) -> u64 {
    if let Some(n) = v.as_u64() {
        return n;
    }
    match v.as_str().unwrap_or_default() {
        "icmp" => 1,
        "tcp" => 6,
        "udp" => 17,
        "ipv6-icmp" | "icmpv6" => 58,
        "sctp" => 132,
        other => other
            .parse()
            .unwrap_or_else(|_| panic!("protocol {v} is not known here")),
    }
}

fn service_number(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("port {v} is not a number (list with -n?)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generation_is_read_from_its_answer() {
        // nlmsghdr (NEWGEN, seq 7); nfgenmsg; NFTA_GEN_ID 0x01020304 (big endian);
        // NFTA_GEN_PROC_PID.
        let mut msg = Vec::new();
        msg.extend_from_slice(&36u32.to_ne_bytes());
        msg.extend_from_slice(&NEWGEN.to_ne_bytes());
        msg.extend_from_slice(&0u16.to_ne_bytes());
        msg.extend_from_slice(&7u32.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&[0, 0, 0, 0]);
        msg.extend_from_slice(&8u16.to_ne_bytes());
        msg.extend_from_slice(&NFTA_GEN_ID.to_ne_bytes());
        msg.extend_from_slice(&[1, 2, 3, 4]);
        msg.extend_from_slice(&8u16.to_ne_bytes());
        msg.extend_from_slice(&2u16.to_ne_bytes());
        msg.extend_from_slice(&[0, 0, 0, 9]);
        assert_eq!(generation_id(&msg, 7), Some(0x0102_0304));
        assert_eq!(
            generation_id(&msg, 8),
            None,
            "an answer to another question"
        );
        assert_eq!(generation_id(&msg[..16], 7), None);
    }

    #[test]
    fn elements_read_as_boxes() {
        let element: Value = serde_json::json!({"concat": [
            {"range": ["10.0.0.0", "10.99.255.255"]}, 6, {"range": [8080, 8090]}
        ]});
        let b = box_of(&element);
        assert!(b.holds("10.1.2.3".parse().unwrap(), 6, 8085));
        assert!(!b.holds("10.100.0.1".parse().unwrap(), 6, 8085));
        let prefix: Value = serde_json::json!({"concat": [
            {"prefix": {"addr": "172.16.0.0", "len": 12}}, "udp", 53
        ]});
        let b = box_of(&prefix);
        assert_eq!(
            b.addrs,
            (
                "172.16.0.0".parse().unwrap(),
                "172.31.255.255".parse().unwrap()
            )
        );
        assert_eq!((b.protocols, b.ports), ((17, 17), (53, 53)));
    }

    #[test]
    fn peer_rules_read_as_nft_prints_them() {
        let listed: Value = serde_json::from_str(
            r#"{"nftables": [{"chain": {"family": "inet", "table": "t", "name": "c"}},
            {"rule": {"expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@peer-aa-v4"}}, {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8080}}, {"accept": null}]}},
            {"rule": {"expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@peer-aa-v4"}}, {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": {"range": [6, 17]}}}, {"match": {"op": "==", "left": {"payload": {"protocol": "th", "field": "dport"}}, "right": {"range": [1000, 2000]}}}, {"accept": null}]}},
            {"rule": {"expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@peer-aa-v4"}}, {"accept": null}]}},
            {"rule": {"expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@peer-aa-v4"}}, {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "udp"}}, {"accept": null}]}},
            {"rule": {"expr": [{"drop": null}]}}]}"#,
        )
        .unwrap();
        let rules: Vec<PeerRule3> = listed["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|item| item.get("rule"))
            .filter_map(PeerRule3::of)
            .collect();
        let rule = |protocols, ports| PeerRule3 {
            set: "peer-aa-v4".into(),
            protocols,
            ports,
        };
        assert_eq!(
            rules,
            [
                rule((6, 6), (8080, 8080)),
                rule((6, 17), (1000, 2000)),
                rule((0, 255), (0, 65535)),
                rule((17, 17), (0, 65535)),
            ]
        );
        assert!(rules[0].covers(6, 8080) && !rules[0].covers(17, 8080));
    }
}
