//! nftables inside a test namespace, as the NetworkPolicy benchmark reads it: the
//! moment each transaction is committed ([`Commits`]), and the policy table as
//! `nft -j list table` prints it ([`PolicyTableView`]).
//!
//! [`Commits`] listens on the namespace's nf_tables notification group
//! (`NFNLGRP_NFTABLES`), where the kernel multicasts every change of a committed
//! transaction and then one `NFT_MSG_NEWGEN` message that ends it, carrying the id and
//! name of the process that committed. The time a `NEWGEN` is read is the time the
//! transaction was in the kernel, up to the wake-up of the listening thread: no command
//! is run and nothing is polled. Only the `NEWGEN` messages are kept; what changed is
//! read afterwards with `nft -j list`, which never commits and so never shows up here.
//!
//! A listener makes the kernel build a notification for every object of every
//! transaction (it skips that work when nobody listens), so a benchmark opens one only
//! around the changes it times.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::Path;
use std::sync::mpsc;
use std::time::Instant;

use nix::sys::socket::{
    AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, setsockopt, socket,
    sockopt,
};
use serde_json::Value;

use crate::hostport::in_netns;
use crate::netns::Netns;

/// `NFNLGRP_NFTABLES`: the multicast group of nf_tables' notifications.
const NFNLGRP_NFTABLES: u32 = 7;
/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWGEN`.
const NEWGEN: u16 = (10 << 8) | 15;
/// `NFTA_GEN_PROC_NAME`: the committing process's name, in a `NEWGEN`.
const NFTA_GEN_PROC_NAME: u16 = 3;

/// One committed transaction.
#[derive(Debug, Clone)]
pub struct Commit {
    /// When its `NEWGEN` was read.
    pub at: Instant,
    /// The committing process's name (`comm`, at most 15 bytes), `""` if not said.
    pub process: String,
}

/// The commits of one namespace, as they happen, on a thread of their own.
#[derive(Debug)]
pub struct Commits {
    rx: mpsc::Receiver<Result<Commit, String>>,
}

impl Commits {
    /// Starts listening in the namespace at `netns`; every commit after this returns
    /// is seen.
    pub fn listen(netns: &Path) -> Self {
        let fd: OwnedFd = in_netns(netns, || {
            let fd = socket(
                AddressFamily::Netlink,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::NetlinkNetFilter,
            )
            .unwrap_or_else(|e| panic!("netlink netfilter socket: {e}"));
            // A big transaction sends one notification per object: room for them all,
            // so the NEWGEN that ends it is not lost to an overrun.
            let _ = setsockopt(&fd, sockopt::RcvBufForce, &(64 << 20));
            bind(
                fd.as_raw_fd(),
                &NetlinkAddr::new(0, 1 << (NFNLGRP_NFTABLES - 1)),
            )
            .unwrap_or_else(|e| panic!("bind to the nf_tables group: {e}"));
            fd
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = match recv(
                    fd.as_raw_fd(),
                    &mut buf,
                    nix::sys::socket::MsgFlags::empty(),
                ) {
                    Ok(n) => n,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => {
                        // ENOBUFS: notifications were lost; say so rather than time a
                        // later commit as if it were the one lost.
                        if tx
                            .send(Err(format!("nf_tables notifications: {e}")))
                            .is_err()
                        {
                            return;
                        }
                        continue;
                    }
                };
                let at = Instant::now();
                for process in newgens(&buf[..n]) {
                    if tx.send(Ok(Commit { at, process })).is_err() {
                        return;
                    }
                }
            }
        });
        Self { rx }
    }

    /// The next commit by a process named `process`, waiting until `deadline`; commits
    /// by other processes are skipped. `Err` on a timeout or lost notifications.
    pub fn next_by(&self, process: &str, deadline: Instant) -> Result<Commit, String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Ok(commit)) if commit.process == process => return Ok(commit),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(format!("no commit by {process} in time")),
            }
        }
    }

    /// Every commit seen so far and not yet taken.
    pub fn drain(&self) -> Vec<Result<Commit, String>> {
        self.rx.try_iter().collect()
    }
}

/// The process names of the `NEWGEN` messages in one datagram.
fn newgens(mut data: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    while data.len() >= 16 {
        let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        if len < 16 || len > data.len() {
            break;
        }
        if kind == NEWGEN {
            // nlmsghdr (16) + nfgenmsg (4), then attributes.
            out.push(attribute_text(&data[20.min(len)..len], NFTA_GEN_PROC_NAME));
        }
        data = &data[(len + 3) & !3..];
        if data.len() < 16 {
            break;
        }
    }
    out
}

fn attribute_text(mut attrs: &[u8], want: u16) -> String {
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            break;
        }
        if kind == want {
            let text = &attrs[4..len];
            let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
            return String::from_utf8_lossy(&text[..end]).into_owned();
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    String::new()
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

    /// Lists the IPv4 set of the ingress profile of `ip`, if it is isolated.
    pub fn read_ingress_set(&mut self, ns: &Netns, table: &str, ip: IpAddr) {
        if let Some(chain) = self.ingress4.get(&ip) {
            let name = format!("{chain}-v4");
            self.read_set(ns, table, &name);
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
                    && set["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with("-v4") || n.ends_with("-v6"))
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
        self.ingress_set(ip)
            .is_some_and(|set| set.iter().any(|b| b.holds(from, protocol, port)))
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
    fn a_newgen_is_found_with_its_process_name() {
        // nlmsghdr: len 36, type NEWGEN; nfgenmsg; attr GEN_ID (8 bytes);
        // attr PROC_NAME "cni-node\0" (4 + 9 -> 16 with padding).
        let mut msg = Vec::new();
        msg.extend_from_slice(&44u32.to_ne_bytes());
        msg.extend_from_slice(&NEWGEN.to_ne_bytes());
        msg.extend_from_slice(&[0; 10]);
        msg.extend_from_slice(&[0, 0, 0, 0]);
        msg.extend_from_slice(&8u16.to_ne_bytes());
        msg.extend_from_slice(&1u16.to_ne_bytes());
        msg.extend_from_slice(&[0, 0, 0, 7]);
        msg.extend_from_slice(&13u16.to_ne_bytes());
        msg.extend_from_slice(&NFTA_GEN_PROC_NAME.to_ne_bytes());
        msg.extend_from_slice(b"cni-node\0\0\0\0");
        assert_eq!(msg.len(), 44);
        assert_eq!(newgens(&msg), vec!["cni-node".to_owned()]);
        // Another message type before it is skipped.
        let mut two = msg.clone();
        two[4..6].copy_from_slice(&((10u16 << 8) | 12).to_ne_bytes());
        two.extend_from_slice(&msg);
        assert_eq!(newgens(&two), vec!["cni-node".to_owned()]);
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
}
