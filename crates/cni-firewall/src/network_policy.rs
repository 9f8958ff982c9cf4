//! NetworkPolicy's datapath on a node whose pods sit on a Linux bridge: the
//! nftables table `inet cni_node_policy` that allows or drops pods' traffic as the
//! node agent computed it, and the "pending" sets that hold a new pod's traffic until
//! the agent has judged it.
//!
//! The agent computes the desired state as plain data ([`PolicyState`]): which
//! local pod address is judged by which ingress and egress *profile*, and what
//! each profile allows: its own disjoint boxes of (peer address range, IP protocol
//! range, destination port range), and rules over *peer sets* that profiles share
//! (the addresses of a peer that many profiles allow, held once).
//! [`PolicyTable`] makes the kernel hold that state: it
//! keeps what it committed in memory and sends only the differences, in one
//! nf_tables transaction, over netlink (a profile's set of many elements that loses
//! any is sent whole again, which costs the kernel less than taking elements out of
//! it); it lists the table only in
//! [`PolicyTable::load`] (at start, to adopt a table a previous run left, and at a
//! periodic resync, to notice hand edits), never on the event path.
//!
//! # The table
//!
//! Its rules do not grow with pods; pods, boxes and peers' addresses are set
//! elements, and a profile's chain has a rule per peer set it uses:
//!
//! ```text
//! table inet cni_node_policy {
//!     map ingress4 { type ipv4_addr : verdict }      # pod -> jump ingress-<profile>
//!     map ingress6, egress4, egress6 ...             # likewise
//!     set pending4 { type ipv4_addr }                # new pods not judged yet
//!     set pending6 { type ipv6_addr }
//!     set ingress-<profile>-v4 {                     # one pair per profile
//!         type ipv4_addr . inet_proto . inet_service
//!         flags interval                             # concatenated ranges (pipapo)
//!     }
//!     set peer-<peer>-v4 { type ipv4_addr }          # one pair per shared peer
//!     set peer-<peer>-v6 { type ipv6_addr }
//!     chain ingress-<profile> {
//!         ip saddr . meta l4proto . th dport @ingress-<profile>-v4 accept
//!         ip6 saddr . meta l4proto . th dport @ingress-<profile>-v6 accept
//!         ip saddr @peer-<peer>-v4 tcp dport 8080 accept   # per peer rule, per family
//!         ip6 saddr @peer-<peer>-v6 tcp dport 8080 accept
//!         drop
//!     }
//!     chain egress-<profile> {                       # `return` instead of accept
//!         ip daddr . meta l4proto . th dport @egress-<profile>-v4 return
//!         ip6 daddr . meta l4proto . th dport @egress-<profile>-v6 return
//!         drop
//!     }
//!     chain forward {
//!         type filter hook forward priority filter; policy accept;
//!         ct direction reply accept
//!         ct state related accept
//!         icmpv6 type 133-137 accept                 # router and neighbour discovery
//!         ip saddr @pending4 drop
//!         ip daddr @pending4 drop
//!         ip6 saddr @pending6 drop
//!         ip6 daddr @pending6 drop
//!         ip saddr vmap @egress4                     # returns when allowed, drops if not
//!         ip6 saddr vmap @egress6
//!         ip daddr vmap @ingress4                    # accepts when allowed, drops if not
//!         ip6 daddr vmap @ingress6
//!     }
//!     chain input {                                  # pods to the node's own addresses
//!         type filter hook input priority filter; policy accept;
//!         (the reply, related, ICMPv6 and source pending rules, and the egress maps)
//!     }
//! }
//! ```
//!
//! Traffic between two pods of the node passes the forward hook once, so the
//! source's egress profile and the destination's ingress profile both judge it. A
//! pod's traffic to its own address never leaves it and is not judged; to itself
//! through a Service address (kube-proxy's DNAT on the node) it passes the forward
//! hook with the pod's address as source and destination, on the port after DNAT,
//! and both its profiles judge it (conntrack's original destination is not looked
//! at). A
//! pod's traffic to the node itself is judged by its egress profile alone (input);
//! the node's own traffic to its pods (output) is not judged at all, on purpose:
//! kubelet's probes must reach pods that deny everything. Bridged traffic reaches
//! these hooks only with `br_netfilter`'s switches on ([`enable_bridge_netfilter`]).
//!
//! `th dport` of a packet without ports (ICMP) reads bytes 2–3 of its header (the
//! checksum): only a box with ports 0–65535 covers it, so "everything" is protocols
//! 0–255 and ports 0–65535 ([`Allow::all_traffic`]).
//!
//! # Established connections
//!
//! Only replies (`ct direction reply`) and related packets (ICMP errors) pass
//! without a judgement; every packet of the original direction is judged, also of
//! an established connection. A change that denies a flow therefore cuts its
//! established connections at once, and a change that still allows it never breaks
//! it: no conntrack sweep is needed, and none is made. The cost per
//! original-direction packet is four hash lookups (the pending set twice, the two
//! maps), one pipapo lookup per profile that judges it (at most two), whatever the
//! numbers of pods and policies, and, when the profile's own set does not allow the
//! packet, a hash lookup per peer rule of the profile up to the one that does: the
//! caller decides which peers are worth a shared set (big ones, which would
//! otherwise be copied into many profiles) and which go into the profiles' own sets.
//!
//! # New pods
//!
//! The bridge plugin adds a new pod's addresses to the pending sets at ADD
//! ([`add_pending`], a no-op when the table does not exist), with the pod's
//! `namespace/name` as the elements' comment, so the pod neither sends nor receives
//! anything (but router and neighbour discovery, and replies to the node's probes)
//! until the agent has judged it. The agent releases them in the same transaction
//! as the map elements that judge the pod: [`PolicyTable::apply_judged`] releases
//! the pending addresses it judges for the same pod (an address handed on to a new
//! pod stays pending while the agent still believes it is the old pod's);
//! [`PolicyTable::apply_resolving`] releases the addresses it is given. DEL removes
//! them ([`remove_pending`]).
//!
//! # Living with other tables
//!
//! This table is the module's own and nothing else is touched. An `accept` here
//! ends this table's judgement only: a drop in another table (masquerade, host
//! ports, port security, kube-proxy) still drops, as nftables does.
//!
//! The socket, and so the table, belong to the network namespace of the thread
//! that opened the [`PolicyTable`] (or called the free functions).
//!
//! # What the judgement rests on
//!
//! - Addresses: a pod is known by the addresses in the maps, and judged by what
//!   its packets say their source is. Without the bridge's `portSecurity` a pod can
//!   send with another pod's source address. Traffic to or from an address in no
//!   map (a pod's IPv6 link-local address, unless the agent puts it in the maps;
//!   multicast and broadcast) is not judged.
//! - Kernel: sets of concatenated ranges (`NFT_SET_CONCAT`, the pipapo backend)
//!   need Linux 5.7 or newer; `br_netfilter`'s switches are per network namespace
//!   since 5.3.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use crate::error::{Error, Result};
use sha2::Digest as _;

use crate::nfnetlink::{
    BASE_NETWORK, BASE_TRANSPORT, BYTEORDER_BIG_ENDIAN, Batch, CMP_EQ, CMP_NEQ, ChainHook, Element,
    Expr, Hook, META_L4PROTO, META_NFPROTO, NFPROTO_INET, NFPROTO_IPV4, NFPROTO_IPV6, Nfnl,
    POLICY_ACCEPT, REG_1, REG_2, SetSpec, TYPE_INET_PROTO, TYPE_INET_SERVICE, TYPE_IP6ADDR,
    TYPE_IPADDR, VERDICT_DROP, VERDICT_JUMP, VERDICT_RETURN, is_not_found, is_restart,
};
use crate::nft_build::{addr_bytes, verdict};

/// The table (family `inet`).
pub const TABLE: &str = "cni_node_policy";

/// The sysctls (below `/proc/sys`) that hand bridged IPv4 and IPv6 traffic to
/// netfilter's hooks.
pub const BRIDGE_NF_SYSCTLS: [&str; 2] = [
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
];

/// Longest profile name.
pub const PROFILE_NAME_MAX: usize = 32;

const FORWARD: &str = "forward";
const INPUT: &str = "input";
const PENDING4: &str = "pending4";
const PENDING6: &str = "pending6";

/// `NF_ACCEPT`.
const VERDICT_ACCEPT: i32 = 1;
/// `NFT_CMP_LTE`, `NFT_CMP_GTE`.
const CMP_LTE: u32 = 3;
const CMP_GTE: u32 = 5;
/// `NFT_CT_STATE`, `NFT_CT_DIRECTION`.
const CT_STATE: u32 = 0;
const CT_DIRECTION: u32 = 1;
/// `IP_CT_DIR_REPLY`.
const CT_DIR_REPLY: u8 = 1;
/// `NF_CT_STATE_BIT(IP_CT_RELATED)`, a host-order word.
const CT_STATE_RELATED: u32 = 4;
/// `NFT_BYTEORDER_HTON`.
const BYTEORDER_HTON: u32 = 1;
/// The 4-byte registers after register 1's first word (`NFT_REG32_01`, `_02`), and
/// the one after an IPv6 address and a protocol (`NFT_REG32_05`), where nft puts the
/// fields of a concatenation.
const REG32_01: u32 = 9;
const REG32_02: u32 = 10;
const REG32_05: u32 = 13;
/// `NF_INET_LOCAL_IN`, `NF_INET_FORWARD`, and nft's `filter` priority.
const HOOK_INPUT: u32 = 1;
const HOOK_FORWARD: u32 = 2;
const PRIORITY_FILTER: i32 = 0;
const IPPROTO_ICMPV6: u8 = 58;
/// ICMPv6 router solicitation through redirect: router and neighbour discovery.
const ICMPV6_ND_FIRST: u8 = 133;
const ICMPV6_ND_LAST: u8 = 137;
/// Attempts at a transaction that must start from what was just read.
const ATTEMPTS: usize = 10;

/// Allowed traffic as a box: peer addresses `first..=last` (one family), IP
/// protocols `protocols.0..=protocols.1` and destination ports
/// `ports.0..=ports.1`. A packet without ports (ICMP) is covered only by ports
/// 0–65535 (its checksum is where a port would be).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Allow {
    /// First peer address.
    pub first: IpAddr,
    /// Last peer address (same family as `first`, not below it).
    pub last: IpAddr,
    /// IP protocol numbers (`meta l4proto`), inclusive.
    pub protocols: (u8, u8),
    /// Destination ports (`th dport`), inclusive.
    pub ports: (u16, u16),
}

impl Allow {
    /// Everything from the peers `first..=last`: all protocols, all ports (ICMP
    /// included).
    pub fn all_traffic(first: IpAddr, last: IpAddr) -> Allow {
        Allow {
            first,
            last,
            protocols: (0, 255),
            ports: (0, 65535),
        }
    }

    fn family(&self) -> Family {
        Family::of(self.first)
    }

    fn overlaps(&self, other: &Allow) -> bool {
        fn meet<T: Ord>(a: (T, T), b: (T, T)) -> bool {
            a.0 <= b.1 && b.0 <= a.1
        }
        self.family() == other.family()
            && meet((self.first, self.last), (other.first, other.last))
            && meet(self.protocols, other.protocols)
            && meet(self.ports, other.ports)
    }

    /// Whether the box is one; `what` names its profile in the error.
    fn check(&self, what: &dyn Fn() -> String) -> Result<()> {
        let fault = if self.first.is_ipv4() != self.last.is_ipv4() {
            "mixes IPv4 and IPv6"
        } else if self.first > self.last {
            "ends before it starts (addresses)"
        } else if self.protocols.0 > self.protocols.1 {
            "ends before it starts (protocols)"
        } else if self.ports.0 > self.ports.1 {
            "ends before it starts (ports)"
        } else {
            return Ok(());
        };
        Err(invalid(what(), format!("box {self} {fault}")))
    }
}

/// As an element in nft's syntax: `10.0.0.0-10.0.0.255 . 6 . 80-81`.
impl fmt::Display for Allow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn range<T: fmt::Display + PartialEq>(
            f: &mut fmt::Formatter<'_>,
            a: T,
            b: T,
        ) -> fmt::Result {
            if a == b {
                write!(f, "{a}")
            } else {
                write!(f, "{a}-{b}")
            }
        }
        range(f, self.first, self.last)?;
        f.write_str(" . ")?;
        range(f, self.protocols.0, self.protocols.1)?;
        f.write_str(" . ")?;
        range(f, self.ports.0, self.ports.1)
    }
}

/// What one profile allows: its own boxes, pairwise disjoint (checked: an overlap is
/// an error that names both), of both families, and rules over shared peer sets. No
/// box of a family denies that family entirely.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Profile {
    /// The boxes, in any order: the profile's own set.
    pub allow: Vec<Allow>,
    /// Rules over shared peer sets ([`PolicyState::peer_sets`]), in any order; one
    /// rule per family each in the profile's chain, after the lookup of its own set.
    pub peers: Vec<PeerRule>,
}

/// Traffic allowed from (ingress) or to (egress) the addresses of a shared peer set:
/// IP protocols `protocols.0..=protocols.1`, destination ports `ports.0..=ports.1`
/// (as in [`Allow`]: a packet without ports is covered only by ports 0–65535).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerRule {
    /// The peer set's name (a key of [`PolicyState::peer_sets`]).
    pub set: String,
    /// IP protocol numbers, inclusive.
    pub protocols: (u8, u8),
    /// Destination ports, inclusive.
    pub ports: (u16, u16),
}

impl PeerRule {
    /// Whether the rule's ranges are ranges; `what` names its profile in the error.
    fn check(&self, what: &dyn Fn() -> String) -> Result<()> {
        if self.protocols.0 > self.protocols.1 || self.ports.0 > self.ports.1 {
            return Err(invalid(
                what(),
                format!(
                    "the rule over peer set {:?} has a range that ends before it starts",
                    self.set
                ),
            ));
        }
        Ok(())
    }

    fn all_protocols(&self) -> bool {
        self.protocols == (0, u8::MAX)
    }

    fn all_ports(&self) -> bool {
        self.ports == (0, u16::MAX)
    }
}

/// The desired state, as the agent computes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyState {
    /// Local pod address -> name of the ingress profile that judges traffic TO it
    /// (pods isolated for ingress).
    pub ingress: BTreeMap<IpAddr, String>,
    /// Local pod address -> name of the egress profile that judges traffic FROM it
    /// (pods isolated for egress).
    pub egress: BTreeMap<IpAddr, String>,
    /// Ingress profiles by name; their boxes hold allowed SOURCES. Names are the
    /// caller's: 1 to [`PROFILE_NAME_MAX`] characters of `[a-z0-9]` (a hash in hex).
    pub ingress_profiles: BTreeMap<String, Profile>,
    /// Egress profiles by name; their boxes hold allowed DESTINATIONS.
    pub egress_profiles: BTreeMap<String, Profile>,
    /// Peer sets shared by profiles' [`PeerRule`]s, by name (named as profiles are):
    /// the addresses of a peer that many profiles allow (the pods of a selector), held
    /// once, so that a pod coming or going changes one element of each set it is in,
    /// not one element of every profile.
    pub peer_sets: BTreeMap<String, BTreeSet<IpAddr>>,
}

/// What one [`PolicyTable::apply`] changed (all zero: nothing was sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Changes {
    /// The table was created, or made again from scratch in the same transaction
    /// (what the kernel held was not what this module makes: a hand edit, a table
    /// of an older layout).
    pub created: bool,
    /// Profiles (chain and sets) added.
    pub profiles_added: usize,
    /// Profiles removed.
    pub profiles_removed: usize,
    /// Profiles whose boxes changed (elements changed in place, or a big set made
    /// anew).
    pub profiles_changed: usize,
    /// Boxes (elements of profiles' sets) added, also of added profiles (a set made
    /// anew counts all its elements here and all the old ones as removed).
    pub boxes_added: usize,
    /// Boxes removed from profiles that stay.
    pub boxes_removed: usize,
    /// Peer sets added (each a pair, one per family).
    pub peer_sets_added: usize,
    /// Peer sets removed.
    pub peer_sets_removed: usize,
    /// Addresses added to peer sets, also to added ones.
    pub peer_addresses_added: usize,
    /// Addresses removed from peer sets that stay.
    pub peer_addresses_removed: usize,
    /// Map elements added (a pod that moves to another profile counts here and in
    /// `pods_removed`).
    pub pods_added: usize,
    /// Map elements removed.
    pub pods_removed: usize,
    /// Addresses taken out of the pending sets (by a diff: all those asked for,
    /// whether or not they were there; by a table made from scratch: those that
    /// were).
    pub pending_resolved: usize,
    /// Netlink messages in the transaction (0: nothing was sent).
    pub messages: usize,
    /// Size of the transaction in bytes.
    pub bytes: usize,
}

impl Changes {
    /// Whether a transaction was sent.
    pub fn sent(&self) -> bool {
        self.messages > 0
    }
}

/// The table as this process last committed or read it, and the socket it talks
/// through (in the network namespace of the thread that opened it).
#[derive(Debug)]
pub struct PolicyTable {
    nl: Nfnl,
    view: View,
}

/// What the kernel holds, as far as this process knows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum View {
    /// Not read yet, or a failure left it unknown.
    Unknown,
    /// No table.
    Absent,
    /// The table with this content; `rebuild`: its fixed part or its objects are
    /// not what this module makes, so the next apply makes it again from scratch.
    Held { held: Held, rebuild: bool },
}

/// The table's content: per direction, the pods' profiles and the profiles; the
/// shared peer sets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Held {
    pods: [BTreeMap<IpAddr, String>; 2],
    profiles: [BTreeMap<String, HeldProfile>; 2],
    peer_sets: BTreeMap<String, BTreeSet<IpAddr>>,
}

/// A profile as the table holds it: its own boxes, and its peer rules sorted and
/// without repeats (the order of its chain).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct HeldProfile {
    boxes: BTreeSet<Allow>,
    peers: Vec<PeerRule>,
}

/// A profile's peer rules in chain order.
fn sorted_peers(peers: &[PeerRule]) -> Vec<PeerRule> {
    let mut out = peers.to_vec();
    out.sort();
    out.dedup();
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

impl Family {
    fn of(ip: IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    fn nfproto(self) -> u8 {
        match self {
            Family::V4 => NFPROTO_IPV4,
            Family::V6 => NFPROTO_IPV6,
        }
    }

    fn addr_len(self) -> u32 {
        match self {
            Family::V4 => 4,
            Family::V6 => 16,
        }
    }

    fn addr_type(self) -> u32 {
        match self {
            Family::V4 => TYPE_IPADDR,
            Family::V6 => TYPE_IP6ADDR,
        }
    }

    /// Offset of the source or destination address in the IP header.
    fn offset(self, field: Field) -> u32 {
        match (self, field) {
            (Family::V4, Field::Saddr) => 12,
            (Family::V4, Field::Daddr) => 16,
            (Family::V6, Field::Saddr) => 8,
            (Family::V6, Field::Daddr) => 24,
        }
    }

    fn pending(self) -> &'static str {
        match self {
            Family::V4 => PENDING4,
            Family::V6 => PENDING6,
        }
    }

    fn digit(self) -> char {
        match self {
            Family::V4 => '4',
            Family::V6 => '6',
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Saddr,
    Daddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

const DIRECTIONS: [Direction; 2] = [Direction::Ingress, Direction::Egress];

impl Direction {
    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }

    /// The pod's own address (the maps' key): the destination of what it receives.
    fn pod(self) -> Field {
        match self {
            Direction::Ingress => Field::Daddr,
            Direction::Egress => Field::Saddr,
        }
    }

    /// The peer's address (the boxes' first field).
    fn peer(self) -> Field {
        match self {
            Direction::Ingress => Field::Saddr,
            Direction::Egress => Field::Daddr,
        }
    }

    /// What a profile chain does with allowed traffic: ingress accepts (the last
    /// judgement), egress returns so that the destination's ingress still judges.
    fn allowed(self) -> i32 {
        match self {
            Direction::Ingress => VERDICT_ACCEPT,
            Direction::Egress => VERDICT_RETURN,
        }
    }

    fn map(self, family: Family) -> String {
        format!("{}{}", self.name(), family.digit())
    }

    fn chain(self, profile: &str) -> String {
        format!("{}-{profile}", self.name())
    }

    fn set(self, profile: &str, family: Family) -> String {
        format!("{}-{profile}-v{}", self.name(), family.digit())
    }

    /// The direction and profile of a profile chain's name.
    fn parse_chain(name: &str) -> Option<(Direction, &str)> {
        DIRECTIONS.into_iter().find_map(|d| {
            let profile = name.strip_prefix(d.name())?.strip_prefix('-')?;
            valid_name(profile).then_some((d, profile))
        })
    }
}

/// A shared peer set's kernel set of one family.
fn peer_set(name: &str, family: Family) -> String {
    format!("peer-{name}-v{}", family.digit())
}

/// The peer set and family of a kernel set's name.
fn parse_peer_set(set: &str) -> Option<(&str, Family)> {
    let rest = set.strip_prefix("peer-")?;
    let (name, family) = rest
        .strip_suffix("-v4")
        .map(|n| (n, Family::V4))
        .or_else(|| rest.strip_suffix("-v6").map(|n| (n, Family::V6)))?;
    valid_name(name).then_some((name, family))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= PROFILE_NAME_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

// ---- expressions ----

fn meta(key: u32, dreg: u32) -> Expr {
    Expr::Meta { key, dreg }
}

fn cmp(op: u32, data: &[u8]) -> Expr {
    Expr::Cmp {
        sreg: REG_1,
        op,
        data: data.to_vec(),
    }
}

fn load(dreg: u32, base: u32, offset: u32, len: u32) -> Expr {
    Expr::Payload {
        dreg,
        base,
        offset,
        len,
    }
}

/// `meta nfproto ipv4|ipv6`, which guards every `ip`/`ip6` match in an inet table.
fn nfproto(family: Family) -> [Expr; 2] {
    [meta(META_NFPROTO, REG_1), cmp(CMP_EQ, &[family.nfproto()])]
}

fn addr(family: Family, field: Field) -> Expr {
    load(REG_1, BASE_NETWORK, family.offset(field), family.addr_len())
}

fn lookup(set: &str, vmap: bool) -> Expr {
    Expr::Lookup {
        sreg: REG_1,
        dreg: vmap.then_some(crate::nfnetlink::REG_VERDICT),
        set: set.into(),
        invert: false,
    }
}

/// `ip[6] saddr|daddr @set <verdict>` or, without a verdict, `... vmap @set`.
fn addr_lookup(family: Family, field: Field, set: &str, code: Option<i32>) -> Vec<Expr> {
    let mut e = Vec::from(nfproto(family));
    e.push(addr(family, field));
    e.push(lookup(set, code.is_none()));
    if let Some(code) = code {
        e.push(verdict(code, None));
    }
    e
}

/// Which base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    Forward,
    Input,
}

impl Base {
    fn name(self) -> &'static str {
        match self {
            Base::Forward => FORWARD,
            Base::Input => INPUT,
        }
    }

    fn hook(self) -> Hook<'static> {
        Hook {
            chain_type: "filter",
            hooknum: match self {
                Base::Forward => HOOK_FORWARD,
                Base::Input => HOOK_INPUT,
            },
            priority: PRIORITY_FILTER,
            policy: Some(POLICY_ACCEPT),
        }
    }

    fn hook_matches(self, hook: Option<&ChainHook>) -> bool {
        let want = self.hook();
        hook.is_some_and(|h| {
            h.chain_type == want.chain_type
                && h.hooknum == want.hooknum
                && h.priority == want.priority
                && h.policy == want.policy
        })
    }
}

/// A base chain's rules, in order (see the module documentation).
fn base_rules(base: Base) -> Vec<Vec<Expr>> {
    let accept = || verdict(VERDICT_ACCEPT, None);
    let mut rules = vec![
        // ct direction reply accept
        vec![
            Expr::Ct {
                key: CT_DIRECTION,
                dreg: REG_1,
            },
            cmp(CMP_EQ, &[CT_DIR_REPLY]),
            accept(),
        ],
        // ct state related accept
        vec![
            Expr::Ct {
                key: CT_STATE,
                dreg: REG_1,
            },
            Expr::Bitwise {
                sreg: REG_1,
                dreg: REG_1,
                len: 4,
                mask: CT_STATE_RELATED.to_ne_bytes().to_vec(),
                xor: vec![0; 4],
            },
            cmp(CMP_NEQ, &[0; 4]),
            accept(),
        ],
        // icmpv6 type 133-137 accept
        [
            nfproto(Family::V6).as_slice(),
            &[
                meta(META_L4PROTO, REG_1),
                cmp(CMP_EQ, &[IPPROTO_ICMPV6]),
                load(REG_1, BASE_TRANSPORT, 0, 1),
                cmp(CMP_GTE, &[ICMPV6_ND_FIRST]),
                cmp(CMP_LTE, &[ICMPV6_ND_LAST]),
                accept(),
            ],
        ]
        .concat(),
    ];
    for family in FAMILIES {
        rules.push(addr_lookup(
            family,
            Field::Saddr,
            family.pending(),
            Some(VERDICT_DROP),
        ));
        if base == Base::Forward {
            rules.push(addr_lookup(
                family,
                Field::Daddr,
                family.pending(),
                Some(VERDICT_DROP),
            ));
        }
    }
    let mut directions = vec![Direction::Egress];
    if base == Base::Forward {
        directions.push(Direction::Ingress);
    }
    for direction in directions {
        for family in FAMILIES {
            rules.push(addr_lookup(
                family,
                direction.pod(),
                &direction.map(family),
                None,
            ));
        }
    }
    rules
}

/// A profile chain's rules: per family, `<peer> . meta l4proto . th dport @set`
/// with the direction's verdict; the peer rules (`peers`, in chain order), each per
/// family; then `drop`.
fn profile_rules(direction: Direction, profile: &str, peers: &[PeerRule]) -> Vec<Vec<Expr>> {
    let mut rules = own_set_rules(direction, profile);
    for rule in peers {
        for family in FAMILIES {
            rules.push(peer_rule(direction, family, rule));
        }
    }
    rules.push(vec![verdict(VERDICT_DROP, None)]);
    rules
}

/// `<field> <value>` for a one-value range, `<field> >= <first> <field> <= <last>`
/// for a wider one, as nft writes them (the field loaded for each comparison); the
/// data in network order, which the kernel compares byte by byte.
fn range_match(field: &Expr, first: &[u8], last: &[u8]) -> Vec<Expr> {
    if first == last {
        vec![field.clone(), cmp(CMP_EQ, first)]
    } else {
        vec![
            field.clone(),
            cmp(CMP_GTE, first),
            field.clone(),
            cmp(CMP_LTE, last),
        ]
    }
}

/// One family's rule of a [`PeerRule`]: `ip saddr @peer-<set>-v4 [meta l4proto
/// <protocols>] [th dport <ports>] accept` (for egress: `daddr`, `return`).
fn peer_rule(direction: Direction, family: Family, rule: &PeerRule) -> Vec<Expr> {
    let mut e = Vec::from(nfproto(family));
    e.push(addr(family, direction.peer()));
    e.push(lookup(&peer_set(&rule.set, family), false));
    if !rule.all_protocols() {
        e.extend(range_match(
            &meta(META_L4PROTO, REG_1),
            &[rule.protocols.0],
            &[rule.protocols.1],
        ));
    }
    if !rule.all_ports() {
        e.extend(range_match(
            &load(REG_1, BASE_TRANSPORT, 2, 2),
            &rule.ports.0.to_be_bytes(),
            &rule.ports.1.to_be_bytes(),
        ));
    }
    e.push(verdict(direction.allowed(), None));
    e
}

/// The [`PeerRule`] that `exprs` is the rule of, if it is exactly such a rule.
fn decode_peer_rule(direction: Direction, family: Family, exprs: &[Expr]) -> Option<PeerRule> {
    let at = exprs
        .iter()
        .position(|e| matches!(e, Expr::Lookup { dreg: None, .. }))?;
    let Expr::Lookup { set, .. } = &exprs[at] else {
        return None;
    };
    let (name, of) = parse_peer_set(set)?;
    let mut rule = PeerRule {
        set: name.to_owned(),
        protocols: (0, u8::MAX),
        ports: (0, u16::MAX),
    };
    // Which field the comparisons that follow are about.
    let mut ports = false;
    for e in &exprs[at + 1..] {
        match e {
            Expr::Meta { .. } => ports = false,
            Expr::Payload { .. } => ports = true,
            Expr::Cmp { op, data, .. } => {
                let (low, high) = (
                    *op == CMP_EQ || *op == CMP_GTE,
                    *op == CMP_EQ || *op == CMP_LTE,
                );
                if ports {
                    let v = u16::from_be_bytes(<[u8; 2]>::try_from(data.as_slice()).ok()?);
                    if low {
                        rule.ports.0 = v;
                    }
                    if high {
                        rule.ports.1 = v;
                    }
                } else {
                    let v = *data.first()?;
                    if low {
                        rule.protocols.0 = v;
                    }
                    if high {
                        rule.protocols.1 = v;
                    }
                }
            }
            _ => {}
        }
    }
    (of == family && peer_rule(direction, family, &rule) == exprs).then_some(rule)
}

/// A profile chain's first rules: per family, the lookup in the profile's own set.
fn own_set_rules(direction: Direction, profile: &str) -> Vec<Vec<Expr>> {
    FAMILIES
        .into_iter()
        .map(|family| {
            // nft's registers for the second and third fields: right after the
            // address.
            let (proto_reg, port_reg) = match family {
                Family::V4 => (REG32_01, REG32_02),
                Family::V6 => (REG_2, REG32_05),
            };
            let mut e = Vec::from(nfproto(family));
            e.extend([
                addr(family, direction.peer()),
                meta(META_L4PROTO, proto_reg),
                Expr::Byteorder {
                    sreg: proto_reg,
                    dreg: proto_reg,
                    op: BYTEORDER_HTON,
                    len: 1,
                    size: 2,
                },
                load(port_reg, BASE_TRANSPORT, 2, 2),
                lookup(&direction.set(profile, family), false),
                verdict(direction.allowed(), None),
            ]);
            e
        })
        .collect()
}

// ---- sets and elements ----

/// The field lengths of a box key: address, protocol, port.
const BOX_FIELDS_V4: [u32; 3] = [4, 1, 2];
const BOX_FIELDS_V6: [u32; 3] = [16, 1, 2];

fn map_spec(name: &str, family: Family) -> SetSpec<'_> {
    SetSpec {
        name,
        key_type: family.addr_type(),
        key_len: family.addr_len(),
        fields: &[],
        interval: false,
        verdict_map: true,
        key_byteorder: BYTEORDER_BIG_ENDIAN,
    }
}

/// A shared peer set of one family: plain addresses, hashed.
fn peer_spec(name: &str, family: Family) -> SetSpec<'_> {
    SetSpec {
        name,
        verdict_map: false,
        ..map_spec("", family)
    }
}

fn pending_spec(family: Family) -> SetSpec<'static> {
    SetSpec {
        name: family.pending(),
        verdict_map: false,
        ..map_spec("", family)
    }
}

fn box_spec(name: &str, family: Family) -> SetSpec<'_> {
    SetSpec {
        name,
        key_type: (family.addr_type() << 12) | (TYPE_INET_PROTO << 6) | TYPE_INET_SERVICE,
        key_len: family.addr_len() + 8,
        fields: match family {
            Family::V4 => &BOX_FIELDS_V4,
            Family::V6 => &BOX_FIELDS_V6,
        },
        interval: true,
        verdict_map: false,
        key_byteorder: 0,
    }
}

fn addr_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// A box corner as nf_tables lays out the concatenation: each field padded to 4
/// bytes.
fn box_key(ip: IpAddr, protocol: u8, port: u16) -> Vec<u8> {
    let mut key = addr_bytes(ip);
    key.extend_from_slice(&[protocol, 0, 0, 0]);
    key.extend_from_slice(&port.to_be_bytes());
    key.extend_from_slice(&[0, 0]);
    key
}

fn box_element(a: &Allow) -> Element {
    Element {
        key: box_key(a.first, a.protocols.0, a.ports.0),
        key_end: Some(box_key(a.last, a.protocols.1, a.ports.1)),
        ..Element::default()
    }
}

fn decode_corner(key: &[u8]) -> Option<(IpAddr, u8, u16)> {
    let len = key.len().checked_sub(8)?;
    let ip = addr_of(&key[..len])?;
    Some((
        ip,
        key[len],
        u16::from_be_bytes([key[len + 4], key[len + 5]]),
    ))
}

fn decode_box(e: &Element, family: Family) -> Option<Allow> {
    let (first, p0, d0) = decode_corner(&e.key)?;
    let (last, p1, d1) = decode_corner(e.key_end.as_deref().unwrap_or(&e.key))?;
    let a = Allow {
        first,
        last,
        protocols: (p0, p1),
        ports: (d0, d1),
    };
    (a.family() == family && a.check(&String::new).is_ok()).then_some(a)
}

fn addr_element(ip: IpAddr) -> Element {
    Element {
        key: addr_bytes(ip),
        ..Element::default()
    }
}

/// A pending address, with the pod it was added for.
fn pending_element(ip: IpAddr, pod: Option<&str>) -> Element {
    Element {
        key: addr_bytes(ip),
        comment: pod.map(pod_tag),
        ..Element::default()
    }
}

/// Longest pod name kept whole in a pending element's comment (nft's comments hold
/// 254 bytes).
const POD_TAG_MAX: usize = 200;

/// What a pending element's comment holds of its pod's `namespace/name`: all of it,
/// or, when too long, its start and a hash of the whole (the same for the same pod,
/// which is all a comparison needs).
fn pod_tag(pod: &str) -> String {
    if pod.len() <= POD_TAG_MAX {
        return pod.to_owned();
    }
    let mut end = 120;
    while !pod.is_char_boundary(end) {
        end -= 1;
    }
    // SHA-512, which the plugins carry already for the reference's chain names.
    let hash: String = sha2::Sha512::digest(pod.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{}... sha512:{hash}", &pod[..end])
}

fn jump_element(ip: IpAddr, chain: String) -> Element {
    Element {
        key: addr_bytes(ip),
        verdict: Some((VERDICT_JUMP, Some(chain))),
        ..Element::default()
    }
}

// ---- validation ----

fn invalid(what: String, reason: String) -> Error {
    Error::InvalidPolicy { what, reason }
}

impl PolicyState {
    fn profiles(&self, direction: Direction) -> &BTreeMap<String, Profile> {
        match direction {
            Direction::Ingress => &self.ingress_profiles,
            Direction::Egress => &self.egress_profiles,
        }
    }

    fn pods(&self, direction: Direction) -> &BTreeMap<IpAddr, String> {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
}

/// Checks every profile's name and boxes.
fn check_profiles(want: &PolicyState) -> Result<()> {
    for direction in DIRECTIONS {
        for (name, profile) in want.profiles(direction) {
            let what = || format!("{} profile {name:?}", direction.name());
            if !valid_name(name) {
                return Err(invalid(
                    what(),
                    format!("a profile name is 1 to {PROFILE_NAME_MAX} characters of [a-z0-9]"),
                ));
            }
            check_boxes(profile, &what)?;
            for rule in &profile.peers {
                rule.check(&what)?;
                if !want.peer_sets.contains_key(&rule.set) {
                    return Err(invalid(
                        what(),
                        format!("its peer set {:?} does not exist", rule.set),
                    ));
                }
            }
        }
    }
    for name in want.peer_sets.keys() {
        if !valid_name(name) {
            return Err(invalid(
                format!("peer set {name:?}"),
                format!("a peer set name is 1 to {PROFILE_NAME_MAX} characters of [a-z0-9]"),
            ));
        }
    }
    Ok(())
}

/// The error of a pod whose profile is not in the state.
fn no_such_profile(direction: Direction, ip: IpAddr, name: &str) -> Error {
    invalid(
        format!("{} of pod {ip}", direction.name()),
        format!("its profile {name:?} does not exist"),
    )
}

/// Checks `want` and puts it in the form the table is compared in.
fn normalize(want: &PolicyState) -> Result<Held> {
    check_profiles(want)?;
    let mut held = Held::default();
    for direction in DIRECTIONS {
        let i = direction.index();
        let profiles = want.profiles(direction);
        for (ip, name) in want.pods(direction) {
            if !profiles.contains_key(name) {
                return Err(no_such_profile(direction, *ip, name));
            }
        }
        held.profiles[i] = profiles
            .iter()
            .map(|(name, p)| (name.clone(), held_profile(p)))
            .collect();
        held.pods[i] = want.pods(direction).clone();
    }
    held.peer_sets = want.peer_sets.clone();
    Ok(held)
}

fn held_profile(p: &Profile) -> HeldProfile {
    HeldProfile {
        boxes: p.allow.iter().cloned().collect(),
        peers: sorted_peers(&p.peers),
    }
}

/// Checks a profile's boxes one by one and for overlaps; `what` names the profile in
/// the error.
fn check_boxes(profile: &Profile, what: &dyn Fn() -> String) -> Result<()> {
    for a in &profile.allow {
        a.check(what)?;
    }
    // Sorted by first address: a box can only overlap the ones after it that start
    // before it ends. (The agent's boxes come sorted: then nothing is sorted here.)
    let mut sorted: Vec<&Allow> = profile.allow.iter().collect();
    if !is_sorted(&profile.allow) {
        sorted.sort();
    }
    for (i, a) in sorted.iter().enumerate() {
        for b in &sorted[i + 1..] {
            if b.family() != a.family() || b.first > a.last {
                break;
            }
            if a.overlaps(b) {
                return Err(invalid(what(), format!("boxes {a} and {b} overlap")));
            }
        }
    }
    Ok(())
}

/// Whether a profile's (valid, so duplicate-free) boxes are the held ones: compared
/// in order when they come sorted (one pass, no lookups), else looked up one by one.
fn same_boxes(held: &BTreeSet<Allow>, allow: &[Allow]) -> bool {
    if held.len() != allow.len() {
        return false;
    }
    if is_sorted(allow) {
        held.iter().eq(allow.iter())
    } else {
        allow.iter().all(|a| held.contains(a))
    }
}

fn is_sorted(allow: &[Allow]) -> bool {
    allow.windows(2).all(|w| w[0] <= w[1])
}

// ---- transactions ----

fn target() -> String {
    format!("table inet {TABLE}")
}

/// Adds a profile: its sets with their elements, then its chain and rules.
fn add_profile(
    b: &mut Batch,
    c: &mut Changes,
    direction: Direction,
    name: &str,
    profile: &HeldProfile,
) -> Result<()> {
    for family in FAMILIES {
        let set = direction.set(name, family);
        b.add_set_spec(NFPROTO_INET, TABLE, &box_spec(&set, family));
        let elems: Vec<Element> = profile
            .boxes
            .iter()
            .filter(|a| a.family() == family)
            .map(box_element)
            .collect();
        c.boxes_added += elems.len();
        if !elems.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, &set, &elems)?;
        }
    }
    let chain = direction.chain(name);
    b.add_chain(NFPROTO_INET, TABLE, &chain, None, None)?;
    for rule in profile_rules(direction, name, &profile.peers) {
        b.add_rule(NFPROTO_INET, TABLE, &chain, &rule, None)?;
    }
    c.profiles_added += 1;
    Ok(())
}

/// Adds a shared peer set: its two kernel sets with their addresses.
fn add_peer_set(
    b: &mut Batch,
    c: &mut Changes,
    name: &str,
    addrs: &BTreeSet<IpAddr>,
) -> Result<()> {
    for family in FAMILIES {
        let set = peer_set(name, family);
        b.add_set_spec(NFPROTO_INET, TABLE, &peer_spec(&set, family));
        let elems: Vec<Element> = addrs
            .iter()
            .filter(|ip| Family::of(**ip) == family)
            .map(|ip| addr_element(*ip))
            .collect();
        c.peer_addresses_added += elems.len();
        if !elems.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, &set, &elems)?;
        }
    }
    c.peer_sets_added += 1;
    Ok(())
}

/// Changes a shared peer set's addresses, element by element (a hashed set takes
/// an element out at the cost of a lookup).
fn change_peer_set(
    b: &mut Batch,
    c: &mut Changes,
    name: &str,
    have: &BTreeSet<IpAddr>,
    want: &BTreeSet<IpAddr>,
) -> Result<()> {
    for family in FAMILIES {
        let set = peer_set(name, family);
        let of = |ips: std::collections::btree_set::Difference<'_, IpAddr>| -> Vec<Element> {
            ips.filter(|ip| Family::of(**ip) == family)
                .map(|ip| addr_element(*ip))
                .collect()
        };
        let (gone, new) = edit_elements(
            b,
            &set,
            of(have.difference(want)),
            of(want.difference(have)),
        )?;
        c.peer_addresses_removed += gone;
        c.peer_addresses_added += new;
    }
    Ok(())
}

/// Takes `gone` out of the set (or map) `set` and puts `new` in, removals first;
/// returns how many of each.
fn edit_elements(
    b: &mut Batch,
    set: &str,
    gone: Vec<Element>,
    new: Vec<Element>,
) -> Result<(usize, usize)> {
    if !gone.is_empty() {
        b.delete_elements(NFPROTO_INET, TABLE, set, &gone);
    }
    if !new.is_empty() {
        b.add_elements(NFPROTO_INET, TABLE, set, &new)?;
    }
    Ok((gone.len(), new.len()))
}

/// Removes a shared peer set (no rule may use it any more).
fn remove_peer_set(b: &mut Batch, c: &mut Changes, name: &str) {
    for family in FAMILIES {
        b.delete_set(NFPROTO_INET, TABLE, &peer_set(name, family));
    }
    c.peer_sets_removed += 1;
}

/// Removes a profile (no map element may jump to it any more): the chain with its
/// rules, then its sets.
fn remove_profile(b: &mut Batch, c: &mut Changes, direction: Direction, name: &str) {
    b.delete_chain(NFPROTO_INET, TABLE, &direction.chain(name));
    for family in FAMILIES {
        b.delete_set(NFPROTO_INET, TABLE, &direction.set(name, family));
    }
    c.profiles_removed += 1;
}

/// Above this many elements, a set that loses elements is made anew rather than
/// edited (see [`change_profile`]).
const REBUILD_ABOVE: usize = 64;

/// Changes a profile's boxes, per family: added boxes go in as elements; removed
/// ones go out as elements while the set is small, but a set of more than
/// [`REBUILD_ABOVE`] elements that loses any is made anew, with all its elements, in
/// the same transaction (its chain's rules are flushed and added again around it).
/// Taking an element out of a set of concatenated ranges (the kernel's pipapo
/// backend) scans the set for the element's rules: measured on Linux 6.18, one
/// removal from a set of 3,300 elements cost up to 15 ms, where making the whole set
/// costs about 3.5 µs an element (12 ms); a change of a hundred profiles that each
/// lose a few elements took tens of seconds edited in place.
fn change_profile(
    b: &mut Batch,
    c: &mut Changes,
    direction: Direction,
    name: &str,
    have_profile: &HeldProfile,
    want_profile: &HeldProfile,
) -> Result<()> {
    let (have, want) = (&have_profile.boxes, &want_profile.boxes);
    let of = |boxes: &BTreeSet<Allow>, family: Family| -> Vec<Allow> {
        boxes
            .iter()
            .filter(|a| a.family() == family)
            .cloned()
            .collect()
    };
    let rebuild: Vec<Family> = FAMILIES
        .into_iter()
        .filter(|family| {
            let held = have.iter().filter(|a| a.family() == *family).count();
            held > REBUILD_ABOVE && have.difference(want).any(|a| a.family() == *family)
        })
        .collect();
    let chain = direction.chain(name);
    // The chain's rules are written anew when its peer rules change, or when one of
    // its own sets is made anew (the sets are bound to the rules: unbound first).
    let rewrite = !rebuild.is_empty() || have_profile.peers != want_profile.peers;
    if rewrite {
        b.flush_chain(NFPROTO_INET, TABLE, &chain);
    }
    for family in FAMILIES {
        let set = direction.set(name, family);
        if rebuild.contains(&family) {
            b.delete_set(NFPROTO_INET, TABLE, &set);
            b.add_set_spec(NFPROTO_INET, TABLE, &box_spec(&set, family));
            let elems: Vec<Element> = of(want, family).iter().map(box_element).collect();
            if !elems.is_empty() {
                b.add_elements(NFPROTO_INET, TABLE, &set, &elems)?;
            }
            c.boxes_removed += of(have, family).len();
            c.boxes_added += elems.len();
            continue;
        }
        let gone: Vec<Element> = have
            .difference(want)
            .filter(|a| a.family() == family)
            .map(box_element)
            .collect();
        let new: Vec<Element> = want
            .difference(have)
            .filter(|a| a.family() == family)
            .map(box_element)
            .collect();
        let (gone, new) = edit_elements(b, &set, gone, new)?;
        c.boxes_removed += gone;
        c.boxes_added += new;
    }
    if rewrite {
        for rule in profile_rules(direction, name, &want_profile.peers) {
            b.add_rule(NFPROTO_INET, TABLE, &chain, &rule, None)?;
        }
    }
    c.profiles_changed += 1;
    Ok(())
}

/// One pod's change in one direction's maps: whether its element is there to be
/// removed, and the profile of the element that replaces it.
#[derive(Debug, Clone, Copy)]
struct PodChange<'a> {
    ip: IpAddr,
    remove: bool,
    add: Option<&'a str>,
}

/// Map changes of one direction: per family, removals first (a pod that changes
/// profile is removed and added again), then additions.
fn write_pods(
    b: &mut Batch,
    c: &mut Changes,
    direction: Direction,
    pods: &[PodChange<'_>],
) -> Result<()> {
    for family in FAMILIES {
        let map = direction.map(family);
        let ours = || pods.iter().filter(|p| Family::of(p.ip) == family);
        let gone: Vec<Element> = ours()
            .filter(|p| p.remove)
            .map(|p| addr_element(p.ip))
            .collect();
        let new: Vec<Element> = ours()
            .filter_map(|p| Some(jump_element(p.ip, direction.chain(p.add?))))
            .collect();
        let (gone, new) = edit_elements(b, &map, gone, new)?;
        c.pods_removed += gone;
        c.pods_added += new;
    }
    Ok(())
}

/// The pod changes of one direction from `have` to `want`, in one pass over both
/// (sorted) maps. A pod may only name a profile of `want`; `removed` holds the
/// profiles `want` drops, which pods left as they were must not name.
fn pod_changes<'a>(
    direction: Direction,
    have: &'a BTreeMap<IpAddr, String>,
    want: &'a PolicyState,
    removed: &BTreeSet<&str>,
) -> Result<Vec<PodChange<'a>>> {
    let profiles = want.profiles(direction);
    let exists = |ip: IpAddr, name: &'a str| {
        if profiles.contains_key(name) {
            Ok(Some(name))
        } else {
            Err(no_such_profile(direction, ip, name))
        }
    };
    let mut out = Vec::new();
    let mut old = have.iter().peekable();
    let mut new = want.pods(direction).iter().peekable();
    loop {
        let change = match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some((ip, _)), Some((nip, _))) if ip == nip => {
                let ((ip, was), (_, is)) = (
                    old.next().unwrap_or_else(|| unreachable!()),
                    new.next().unwrap_or_else(|| unreachable!()),
                );
                if was == is {
                    if removed.contains(is.as_str()) {
                        return Err(no_such_profile(direction, *ip, is));
                    }
                    continue;
                }
                PodChange {
                    ip: *ip,
                    remove: true,
                    add: exists(*ip, is)?,
                }
            }
            (Some((ip, _)), Some((nip, _))) if ip > nip => {
                let Some((ip, is)) = new.next() else { break };
                PodChange {
                    ip: *ip,
                    remove: false,
                    add: exists(*ip, is)?,
                }
            }
            (Some(_), _) => {
                let Some((ip, _)) = old.next() else { break };
                PodChange {
                    ip: *ip,
                    remove: true,
                    add: None,
                }
            }
            (None, Some(_)) => {
                let Some((ip, is)) = new.next() else { break };
                PodChange {
                    ip: *ip,
                    remove: false,
                    add: exists(*ip, is)?,
                }
            }
        };
        out.push(change);
    }
    Ok(out)
}

/// Takes `ips` out of the pending sets whether or not they are there: each is
/// added (a no-op when present) and deleted in the same transaction.
fn unpend(b: &mut Batch, ips: &[IpAddr]) -> Result<()> {
    for family in FAMILIES {
        let elems: Vec<Element> = ips
            .iter()
            .filter(|ip| Family::of(**ip) == family)
            .map(|ip| addr_element(*ip))
            .collect();
        if !elems.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, family.pending(), &elems)?;
            b.delete_elements(NFPROTO_INET, TABLE, family.pending(), &elems);
        }
    }
    Ok(())
}

fn finish(b: Batch, mut c: Changes) -> (Batch, Changes) {
    c.messages = b.messages();
    c.bytes = b.size();
    (b, c)
}

/// What a committed diff changes in the held state.
#[derive(Debug, Default)]
struct Edits {
    /// Profiles added or changed, and removed (`None`).
    profiles: Vec<(Direction, String, Option<HeldProfile>)>,
    /// Peer sets added or changed, and removed (`None`).
    peer_sets: Vec<(String, Option<BTreeSet<IpAddr>>)>,
    /// Pods added or moved to another profile, and removed (`None`).
    pods: Vec<(Direction, IpAddr, Option<String>)>,
}

impl Edits {
    fn apply(self, held: &mut Held) {
        for (direction, name, profile) in self.profiles {
            let profiles = &mut held.profiles[direction.index()];
            match profile {
                Some(profile) => profiles.insert(name, profile),
                None => profiles.remove(&name),
            };
        }
        for (name, addrs) in self.peer_sets {
            match addrs {
                Some(addrs) => held.peer_sets.insert(name, addrs),
                None => held.peer_sets.remove(&name),
            };
        }
        for (direction, ip, profile) in self.pods {
            let pods = &mut held.pods[direction.index()];
            match profile {
                Some(profile) => pods.insert(ip, profile),
                None => pods.remove(&ip),
            };
        }
    }
}

/// A peer set to add (no held addresses) or change: name, held addresses, wanted ones.
type PeerSetChange<'a> = (
    &'a String,
    Option<&'a BTreeSet<IpAddr>>,
    &'a BTreeSet<IpAddr>,
);

/// The transaction from `have` to `want` that also resolves `resolve`, and what
/// it changes in `have`; `None` when there is nothing to send. New profiles come
/// before the map elements that jump to them, removed ones after the map elements
/// that used them. The profiles of `want` must have been checked
/// ([`check_profiles`]); the pods are checked here: every pod that changes, and
/// those left as they were against the profiles `want` drops.
fn diff(
    have: &Held,
    want: &PolicyState,
    resolve: &[IpAddr],
) -> Result<Option<(Batch, Changes, Edits)>> {
    let mut edits = Edits::default();
    let mut new_profiles = Vec::new();
    let mut removed: [BTreeSet<&str>; 2] = Default::default();
    let mut pods = Vec::new();
    for direction in DIRECTIONS {
        let i = direction.index();
        let profiles = want.profiles(direction);
        for (name, profile) in profiles {
            let old = have.profiles[i].get(name);
            let peers = sorted_peers(&profile.peers);
            if old.is_none_or(|old| !same_boxes(&old.boxes, &profile.allow) || old.peers != peers) {
                let profile = HeldProfile {
                    boxes: profile.allow.iter().cloned().collect(),
                    peers,
                };
                new_profiles.push((direction, name, old, profile));
            }
        }
        removed[i] = have.profiles[i]
            .keys()
            .filter(|name| !profiles.contains_key(*name))
            .map(String::as_str)
            .collect();
        pods.push(pod_changes(direction, &have.pods[i], want, &removed[i])?);
    }
    let changed_peer_sets: Vec<PeerSetChange<'_>> = want
        .peer_sets
        .iter()
        .filter_map(|(name, addrs)| match have.peer_sets.get(name) {
            Some(old) if old == addrs => None,
            old => Some((name, old, addrs)),
        })
        .collect();
    let removed_peer_sets: Vec<&String> = have
        .peer_sets
        .keys()
        .filter(|name| !want.peer_sets.contains_key(*name))
        .collect();
    let untouched = new_profiles.is_empty()
        && removed.iter().all(BTreeSet::is_empty)
        && pods.iter().all(Vec::is_empty)
        && changed_peer_sets.is_empty()
        && removed_peer_sets.is_empty();
    if untouched && resolve.is_empty() {
        return Ok(None);
    }

    let mut b = Batch::new();
    let mut c = Changes::default();
    // Peer sets before the rules that use them, removed ones after.
    for (name, old, addrs) in changed_peer_sets {
        match old {
            None => add_peer_set(&mut b, &mut c, name, addrs)?,
            Some(old) => change_peer_set(&mut b, &mut c, name, old, addrs)?,
        }
        edits.peer_sets.push((name.clone(), Some(addrs.clone())));
    }
    for (direction, name, old, profile) in new_profiles {
        match old {
            None => add_profile(&mut b, &mut c, direction, name, &profile)?,
            Some(old) => change_profile(&mut b, &mut c, direction, name, old, &profile)?,
        }
        edits
            .profiles
            .push((direction, name.clone(), Some(profile)));
    }
    for (direction, changes) in DIRECTIONS.into_iter().zip(&pods) {
        write_pods(&mut b, &mut c, direction, changes)?;
        edits.pods.extend(
            changes
                .iter()
                .map(|p| (direction, p.ip, p.add.map(str::to_owned))),
        );
    }
    unpend(&mut b, resolve)?;
    c.pending_resolved = resolve.len();
    for (direction, names) in DIRECTIONS.into_iter().zip(&removed) {
        for name in names {
            remove_profile(&mut b, &mut c, direction, name);
            edits.profiles.push((direction, (*name).to_owned(), None));
        }
    }
    for name in removed_peer_sets {
        remove_peer_set(&mut b, &mut c, name);
        edits.peer_sets.push((name.clone(), None));
    }
    let (b, c) = finish(b, c);
    Ok(Some((b, c, edits)))
}

/// The transaction that makes the table from scratch, run only if the rule set is
/// still at `generation`: the old table goes first if there is one (`replace`),
/// and the addresses still `pending` are carried over, with their pods.
fn fresh(
    want: &Held,
    generation: u32,
    replace: bool,
    pending: &BTreeMap<IpAddr, Option<String>>,
) -> Result<(Batch, Changes)> {
    let mut b = Batch::at_generation(generation);
    let mut c = Changes {
        created: true,
        ..Changes::default()
    };
    if replace {
        b.delete_table(NFPROTO_INET, TABLE);
    }
    b.add_table(NFPROTO_INET, TABLE, None)?;
    for direction in DIRECTIONS {
        for family in FAMILIES {
            let map = direction.map(family);
            b.add_set_spec(NFPROTO_INET, TABLE, &map_spec(&map, family));
        }
    }
    for family in FAMILIES {
        b.add_set_spec(NFPROTO_INET, TABLE, &pending_spec(family));
    }
    for base in [Base::Forward, Base::Input] {
        b.add_chain(NFPROTO_INET, TABLE, base.name(), Some(base.hook()), None)?;
        for rule in base_rules(base) {
            b.add_rule(NFPROTO_INET, TABLE, base.name(), &rule, None)?;
        }
    }
    for (name, addrs) in &want.peer_sets {
        add_peer_set(&mut b, &mut c, name, addrs)?;
    }
    for direction in DIRECTIONS {
        for (name, profile) in &want.profiles[direction.index()] {
            add_profile(&mut b, &mut c, direction, name, profile)?;
        }
    }
    for direction in DIRECTIONS {
        let pods: Vec<PodChange<'_>> = want.pods[direction.index()]
            .iter()
            .map(|(ip, profile)| PodChange {
                ip: *ip,
                remove: false,
                add: Some(profile),
            })
            .collect();
        write_pods(&mut b, &mut c, direction, &pods)?;
    }
    for family in FAMILIES {
        let elems: Vec<Element> = pending
            .iter()
            .filter(|(ip, _)| Family::of(**ip) == family)
            .map(|(ip, pod)| Element {
                key: addr_bytes(*ip),
                comment: pod.clone(),
                ..Element::default()
            })
            .collect();
        if !elems.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, family.pending(), &elems)?;
        }
    }
    Ok(finish(b, c))
}

// ---- reading the table ----

/// Reads the table: its content, and whether it is laid out as this module makes
/// it.
fn read(nl: &mut Nfnl) -> Result<View> {
    if !nl.has_table(NFPROTO_INET, TABLE)? {
        return Ok(View::Absent);
    }
    let chains = nl.chains(NFPROTO_INET, TABLE)?;
    let sets = nl.sets(NFPROTO_INET, TABLE)?;
    let rules = nl.rules(NFPROTO_INET, TABLE, None)?;
    let mut held = Held::default();
    let mut rebuild = false;

    let mut rules_of: BTreeMap<&str, Vec<&Vec<Expr>>> = BTreeMap::new();
    for r in &rules {
        rules_of.entry(r.chain.as_str()).or_default().push(&r.exprs);
    }
    let same_rules = |chain: &str, want: Vec<Vec<Expr>>| {
        let have = rules_of.get(chain).map(Vec::as_slice).unwrap_or_default();
        have.len() == want.len() && have.iter().zip(&want).all(|(h, w)| *h == w)
    };
    let mut bases = 0;
    for chain in &chains {
        let base = match chain.name.as_str() {
            FORWARD => Some(Base::Forward),
            INPUT => Some(Base::Input),
            _ => None,
        };
        if let Some(base) = base {
            bases += 1;
            rebuild |= !base.hook_matches(chain.hook.as_ref())
                || !same_rules(base.name(), base_rules(base));
            continue;
        }
        match Direction::parse_chain(&chain.name) {
            Some((direction, profile)) if chain.hook.is_none() => {
                let have = rules_of
                    .get(chain.name.as_str())
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                match decode_profile_rules(direction, profile, have) {
                    Some(peers) => {
                        let (profile_name, held_one) = (
                            profile.to_owned(),
                            HeldProfile {
                                boxes: BTreeSet::new(),
                                peers,
                            },
                        );
                        held.profiles[direction.index()].insert(profile_name, held_one);
                    }
                    None => rebuild = true,
                }
            }
            _ => rebuild = true,
        }
    }
    rebuild |= bases != 2;

    // Every set must be one this module makes, of the type it makes.
    let mut fixed = 0;
    for set in &sets {
        let spec = match set.name.as_str() {
            PENDING4 => pending_spec(Family::V4),
            PENDING6 => pending_spec(Family::V6),
            name => {
                let map = DIRECTIONS.into_iter().find_map(|d| {
                    FAMILIES
                        .into_iter()
                        .find(|f| d.map(*f) == name)
                        .map(|f| map_spec(name, f))
                });
                if let Some(spec) = map {
                    spec
                } else if let Some((peer, family)) = parse_peer_set(name) {
                    rebuild |= !set.matches(&peer_spec(name, family));
                    held.peer_sets.entry(peer.to_owned()).or_default();
                    continue;
                } else {
                    let Some((chain, family)) = name
                        .strip_suffix("-v4")
                        .map(|c| (c, Family::V4))
                        .or_else(|| name.strip_suffix("-v6").map(|c| (c, Family::V6)))
                    else {
                        rebuild = true;
                        continue;
                    };
                    let known = Direction::parse_chain(chain)
                        .is_some_and(|(d, p)| held.profiles[d.index()].contains_key(p));
                    rebuild |= !known || !set.matches(&box_spec(name, family));
                    continue;
                }
            }
        };
        fixed += 1;
        rebuild |= !set.matches(&spec);
    }
    rebuild |= fixed != 6;

    // The addresses of every peer set, from both of its sets; every peer rule's set
    // must be there.
    let names: Vec<String> = held.peer_sets.keys().cloned().collect();
    for name in names {
        let mut addrs = BTreeSet::new();
        for family in FAMILIES {
            let set = peer_set(&name, family);
            if !sets.iter().any(|s| s.name == set) {
                rebuild = true;
                continue;
            }
            for e in nl.elements(NFPROTO_INET, TABLE, &set)? {
                match addr_of(&e.key).filter(|ip| Family::of(*ip) == family) {
                    Some(ip) => {
                        addrs.insert(ip);
                    }
                    None => rebuild = true,
                }
            }
        }
        held.peer_sets.insert(name, addrs);
    }
    rebuild |= held.profiles.iter().any(|profiles| {
        profiles
            .values()
            .any(|p| p.peers.iter().any(|r| !held.peer_sets.contains_key(&r.set)))
    });

    // The boxes of every profile, from both of its sets.
    for direction in DIRECTIONS {
        let i = direction.index();
        let names: Vec<String> = held.profiles[i].keys().cloned().collect();
        for name in names {
            let mut boxes = BTreeSet::new();
            for family in FAMILIES {
                let set = direction.set(&name, family);
                if !sets.iter().any(|s| s.name == set) {
                    rebuild = true;
                    continue;
                }
                for e in nl.elements(NFPROTO_INET, TABLE, &set)? {
                    match decode_box(&e, family) {
                        Some(a) => {
                            boxes.insert(a);
                        }
                        None => rebuild = true,
                    }
                }
            }
            if let Some(profile) = held.profiles[i].get_mut(&name) {
                profile.boxes = boxes;
            }
        }
    }

    // The pods, from the maps: each must jump to a profile of its direction.
    for direction in DIRECTIONS {
        let i = direction.index();
        for family in FAMILIES {
            let map = direction.map(family);
            if !sets.iter().any(|s| s.name == map) {
                continue;
            }
            for e in nl.elements(NFPROTO_INET, TABLE, &map)? {
                let ip = addr_of(&e.key).filter(|ip| Family::of(*ip) == family);
                let profile = match &e.verdict {
                    Some((VERDICT_JUMP, Some(chain))) => Direction::parse_chain(chain)
                        .filter(|(d, p)| *d == direction && held.profiles[i].contains_key(*p))
                        .map(|(_, p)| p.to_owned()),
                    _ => None,
                };
                match (ip, profile) {
                    (Some(ip), Some(profile)) => {
                        held.pods[i].insert(ip, profile);
                    }
                    _ => rebuild = true,
                }
            }
        }
    }
    Ok(View::Held { held, rebuild })
}

/// The peer rules of a profile chain whose rules are `have`, if they are exactly
/// what [`profile_rules`] makes of them (sorted, without repeats).
fn decode_profile_rules(
    direction: Direction,
    profile: &str,
    have: &[&Vec<Expr>],
) -> Option<Vec<PeerRule>> {
    let own = own_set_rules(direction, profile);
    let (first, rest) = have.split_at_checked(own.len())?;
    let (last, middle) = rest.split_last()?;
    if !first.iter().zip(&own).all(|(h, w)| *h == w)
        || **last != vec![verdict(VERDICT_DROP, None)]
        || middle.len() % FAMILIES.len() != 0
    {
        return None;
    }
    let mut peers = Vec::new();
    for pair in middle.chunks(FAMILIES.len()) {
        let mut decoded = pair
            .iter()
            .zip(FAMILIES)
            .map(|(rule, family)| decode_peer_rule(direction, family, rule));
        let first = decoded.next()??;
        if !decoded.all(|d| d.as_ref() == Some(&first)) {
            return None;
        }
        peers.push(first);
    }
    (sorted_peers(&peers) == peers).then_some(peers)
}

/// The addresses in the pending sets, with the pods they were added for (none when
/// the table or a set is missing).
fn read_pending(nl: &mut Nfnl) -> Result<BTreeMap<IpAddr, Option<String>>> {
    let mut out = BTreeMap::new();
    for family in FAMILIES {
        match nl.elements(NFPROTO_INET, TABLE, family.pending()) {
            Ok(elems) => out.extend(
                elems
                    .into_iter()
                    .filter_map(|e| Some((addr_of(&e.key)?, e.comment))),
            ),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The pending addresses that `judged` holds for the pod they were added for (or
/// that were added without one).
fn releasable(
    pending: &BTreeMap<IpAddr, Option<String>>,
    judged: &BTreeMap<IpAddr, String>,
) -> Vec<IpAddr> {
    pending
        .iter()
        .filter(|(ip, pod)| {
            judged
                .get(ip)
                .is_some_and(|j| pod.as_ref().is_none_or(|p| *p == pod_tag(j)))
        })
        .map(|(ip, _)| *ip)
        .collect()
}

/// Whether every error in `e` is the kernel's "no such table, chain or set".
fn all_not_found(e: &Error) -> bool {
    match e {
        Error::Multiple(all) => all.iter().all(is_not_found),
        e => is_not_found(e),
    }
}

impl PolicyTable {
    /// Opens the nf_tables socket in the calling thread's network namespace; changes
    /// nothing and reads nothing (the first [`PolicyTable::apply`] reads the table
    /// if [`PolicyTable::load`] was not called).
    pub fn open() -> Result<Self> {
        Ok(PolicyTable {
            nl: Nfnl::open()?,
            view: View::Unknown,
        })
    }

    /// Reads what the kernel holds, which the next [`PolicyTable::apply`] diffs
    /// against: at start, to adopt a table a previous run left (the same state
    /// then sends nothing, so nothing flaps), and at a periodic resync, to notice
    /// hand edits. A table that is not laid out as this module makes it (a chain,
    /// rule or set changed by hand, an older layout) is made again from scratch by
    /// the next apply, in one transaction. The only function that lists the table.
    pub fn load(&mut self) -> Result<()> {
        self.view = View::Unknown;
        self.view = read(&mut self.nl)?;
        Ok(())
    }

    /// Makes the kernel hold `want`: one transaction with only the differences
    /// from what was last committed (or read), creating the table, its base chains,
    /// maps and pending sets if missing (also for an empty `want`: enforcement is
    /// on once the table exists, and new pods are held pending from then on).
    /// Nothing is sent when nothing differs. On a failure the table is read again,
    /// so that the next call starts from what the kernel holds. An invalid `want`
    /// is an error before anything is sent.
    ///
    /// Making the table (again) from scratch reads the pending sets, to carry
    /// them over, and runs only if nothing changed in between (else it reads and
    /// tries again); a diff reads nothing.
    pub fn apply(&mut self, want: &PolicyState) -> Result<Changes> {
        self.apply_resolving(want, &[])
    }

    /// [`PolicyTable::apply`], and takes `resolve` out of the pending sets in the
    /// same transaction: the addresses of new pods that `want` judges (whether
    /// or not they are still pending), so that no packet passes between the
    /// pending drop and the profiles' judgement.
    pub fn apply_resolving(&mut self, want: &PolicyState, resolve: &[IpAddr]) -> Result<Changes> {
        check_profiles(want)?;
        self.apply_checked(want, resolve)
    }

    /// [`PolicyTable::apply_resolving`] of a `want` whose profiles are checked.
    fn apply_checked(&mut self, want: &PolicyState, resolve: &[IpAddr]) -> Result<Changes> {
        if self.view == View::Unknown {
            self.load()?;
        }
        let failed = match &mut self.view {
            View::Held {
                held,
                rebuild: false,
            } => match diff(held, want, resolve)? {
                None => return Ok(Changes::default()),
                Some((batch, changes, edits)) => match self.nl.commit(batch, &target()) {
                    Ok(()) => {
                        edits.apply(held);
                        return Ok(changes);
                    }
                    Err(e) => e,
                },
            },
            _ => {
                let held = normalize(want)?;
                match self.create(&held, resolve) {
                    Ok(changes) => {
                        self.view = View::Held {
                            held,
                            rebuild: false,
                        };
                        return Ok(changes);
                    }
                    Err(e) => e,
                }
            }
        };
        // The error that counts is the first; a failed read leaves the view
        // unknown, and the next apply reads again.
        let _ = self.load();
        Err(failed)
    }

    /// [`PolicyTable::apply_resolving`] for an agent that knows which pod holds each
    /// address it judges (`judged`: address -> `namespace/name`, isolated or not):
    /// the pending addresses that `judged` holds for the same pod (or that were
    /// added without a pod) are released in the same transaction. Reads the two
    /// pending sets (new pods only: a handful of elements), never the rest of the
    /// table; a pass with nothing to change and nothing pending sends nothing.
    pub fn apply_judged(
        &mut self,
        want: &PolicyState,
        judged: &BTreeMap<IpAddr, String>,
    ) -> Result<Changes> {
        check_profiles(want)?;
        let pending = read_pending(&mut self.nl)?;
        let resolve = releasable(&pending, judged);
        self.apply_checked(want, &resolve)
    }

    /// Makes the table from scratch (replacing one that is there), carrying over
    /// the pending addresses but `resolve`, in a transaction that runs only if
    /// nothing changed since they were read.
    fn create(&mut self, want: &Held, resolve: &[IpAddr]) -> Result<Changes> {
        for _ in 0..ATTEMPTS {
            let generation = self.nl.generation_id()?;
            let exists = self.nl.has_table(NFPROTO_INET, TABLE)?;
            let pending = if exists {
                read_pending(&mut self.nl)?
            } else {
                BTreeMap::new()
            };
            let mut kept = pending.clone();
            kept.retain(|ip, _| !resolve.contains(ip));
            let (batch, mut changes) = fresh(want, generation, exists, &kept)?;
            changes.pending_resolved = pending.len() - kept.len();
            match self.nl.commit(batch, &target()) {
                Err(e) if is_restart(&e) => continue,
                other => return other.map(|()| changes),
            }
        }
        Err(Error::Netlink {
            target: target(),
            detail: "the rule set kept changing while the table was being made".into(),
            errno: None,
        })
    }

    /// Removes the whole table (enforcement turned off); nothing there is nothing
    /// to do.
    pub fn delete(&mut self) -> Result<()> {
        let mut b = Batch::new();
        b.delete_table(NFPROTO_INET, TABLE);
        match self.nl.commit(b, &target()) {
            Err(e) if !is_not_found(&e) => {
                let _ = self.load();
                Err(e)
            }
            _ => {
                self.view = View::Absent;
                Ok(())
            }
        }
    }
}

/// For the bridge plugin at ADD: puts a new pod's addresses in the pending sets,
/// so that its traffic is dropped until the agent has judged it, in one small
/// transaction. `pod` is the pod's `namespace/name` when the runtime gave it
/// (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`): kept with the addresses (the elements'
/// comment), so that [`PolicyTable::apply_judged`] releases them only for that pod,
/// not for an earlier pod the agent still believes holds the address. Returns
/// false, changing nothing, when the table does not exist (NetworkPolicy is not
/// enforced on this node) or `ips` is empty.
///
/// Call it before the pod record that tells the agent about the pod is written, and
/// before the pod's interface comes up.
pub fn add_pending(ips: &[IpAddr], pod: Option<&str>) -> Result<bool> {
    if ips.is_empty() {
        return Ok(false);
    }
    // Asking first is cheaper than a transaction the kernel refuses (about 10 ms): a
    // node whose agent has not made the table yet pays one small request per ADD.
    let mut nl = Nfnl::open()?;
    if !nl.has_table(NFPROTO_INET, TABLE)? {
        return Ok(false);
    }
    let mut b = Batch::new();
    for family in FAMILIES {
        let elems: Vec<Element> = ips
            .iter()
            .filter(|ip| Family::of(**ip) == family)
            .map(|ip| pending_element(*ip, pod))
            .collect();
        if !elems.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, family.pending(), &elems)?;
        }
    }
    match nl.commit(b, &target()) {
        Ok(()) => Ok(true),
        Err(e) if all_not_found(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// For DEL: takes the addresses out of the pending sets, whether or not they are
/// there (and whether or not the table is). Call it before the addresses are given
/// back to IPAM: once they are, another pod's ADD may make them pending again.
pub fn remove_pending(ips: &[IpAddr]) -> Result<()> {
    if ips.is_empty() {
        return Ok(());
    }
    let mut nl = Nfnl::open()?;
    if !nl.has_table(NFPROTO_INET, TABLE)? {
        return Ok(());
    }
    let mut b = Batch::new();
    unpend(&mut b, ips)?;
    match nl.commit(b, &target()) {
        Err(e) if !all_not_found(&e) => Err(e),
        _ => Ok(()),
    }
}

/// The addresses in the pending sets, with the pods they were added for as their
/// comments hold them (for the agent's start and GC); none when the table does not
/// exist.
pub fn pending() -> Result<BTreeMap<IpAddr, Option<String>>> {
    read_pending(&mut Nfnl::open()?)
}

/// Turns on `br_netfilter`'s switches ([`BRIDGE_NF_SYSCTLS`]) in the calling
/// thread's network namespace, so that bridged traffic between pods passes the
/// table's hooks; returns whether both were on already. The switches are per
/// network namespace on kernels since 5.3 (and global before); the module must be
/// loaded (`modprobe br_netfilter`), or its sysctls do not exist.
pub fn enable_bridge_netfilter() -> Result<bool> {
    let mut were_on = true;
    for name in BRIDGE_NF_SYSCTLS {
        let dotted = name.replace('/', ".");
        let current = cni_linux::sysctl::read(name).map_err(|e| {
            let what = if e.errno() == Some(nix::libc::ENOENT) {
                format!(
                    "{dotted} does not exist: the br_netfilter module is not loaded (modprobe br_netfilter)"
                )
            } else {
                format!("cannot read {dotted}")
            };
            Error::BridgeNetfilter {
                what,
                source: Some(e),
            }
        })?;
        if current != "1" {
            were_on = false;
            cni_linux::sysctl::write(name, "1").map_err(|e| Error::BridgeNetfilter {
                what: format!("cannot turn on {dotted}"),
                source: Some(e),
            })?;
        }
    }
    Ok(were_on)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn allow(first: &str, last: &str, protocols: (u8, u8), ports: (u16, u16)) -> Allow {
        Allow {
            first: ip(first),
            last: ip(last),
            protocols,
            ports,
        }
    }

    fn profile(boxes: &[Allow]) -> Profile {
        Profile {
            allow: boxes.to_vec(),
            peers: Vec::new(),
        }
    }

    fn peer(set: &str, protocols: (u8, u8), ports: (u16, u16)) -> PeerRule {
        PeerRule {
            set: set.into(),
            protocols,
            ports,
        }
    }

    /// [`state`] with a shared peer set that the ingress profile allows on TCP 8080
    /// and everything.
    fn state_with_peers() -> PolicyState {
        let mut s = state();
        s.peer_sets.insert(
            "pp01".into(),
            [ip("10.9.0.1"), ip("10.9.0.2"), ip("fd09::1")].into(),
        );
        s.peer_sets.insert("pp02".into(), [ip("10.9.1.1")].into());
        let p = s.ingress_profiles.get_mut("aa11").unwrap();
        p.peers = vec![
            peer("pp01", (6, 6), (8080, 8080)),
            peer("pp02", (0, 255), (0, 65535)),
        ];
        s
    }

    /// Two pods, one ingress and one egress profile.
    fn state() -> PolicyState {
        let mut s = PolicyState::default();
        s.ingress_profiles.insert(
            "aa11".into(),
            profile(&[
                allow("10.1.0.0", "10.1.0.255", (6, 6), (80, 81)),
                allow("10.2.0.7", "10.2.0.7", (0, 255), (0, 65535)),
                allow("fd00::", "fd00::ffff", (17, 17), (53, 53)),
            ]),
        );
        s.egress_profiles.insert(
            "bb22".into(),
            profile(&[allow("10.0.0.0", "10.255.255.255", (6, 6), (443, 443))]),
        );
        s.ingress.insert(ip("10.1.0.2"), "aa11".into());
        s.ingress.insert(ip("fd00::2"), "aa11".into());
        s.egress.insert(ip("10.1.0.2"), "bb22".into());
        s
    }

    fn describe(b: &Batch) -> Vec<String> {
        b.describe().into_iter().map(str::to_owned).collect()
    }

    #[test]
    fn boxes_print_as_nft_elements() {
        assert_eq!(
            allow("10.1.0.0", "10.1.0.255", (6, 6), (80, 81)).to_string(),
            "10.1.0.0-10.1.0.255 . 6 . 80-81"
        );
        assert_eq!(
            Allow::all_traffic(ip("fd00::1"), ip("fd00::1")).to_string(),
            "fd00::1 . 0-255 . 0-65535"
        );
    }

    #[test]
    fn box_keys_round_trip_in_nft_layout() {
        let a = allow("10.0.0.0", "10.0.0.255", (6, 6), (80, 81));
        let e = box_element(&a);
        // As nft sends `10.0.0.0-10.0.0.255 . 6 . 80-81`.
        assert_eq!(e.key, [10, 0, 0, 0, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(
            e.key_end.as_deref(),
            Some(&[10, 0, 0, 255, 6, 0, 0, 0, 0, 81, 0, 0][..])
        );
        assert_eq!(decode_box(&e, Family::V4), Some(a.clone()));
        assert_eq!(decode_box(&e, Family::V6), None);
        let b = allow("fd00::", "fd00::ff", (0, 255), (0, 65535));
        let e = box_element(&b);
        assert_eq!(e.key.len(), 24);
        assert_eq!(decode_box(&e, Family::V6), Some(b));
        let single = Element {
            key_end: None,
            ..box_element(&a)
        };
        assert_eq!(
            decode_box(&single, Family::V4),
            Some(allow("10.0.0.0", "10.0.0.0", (6, 6), (80, 80)))
        );
    }

    #[test]
    fn overlapping_boxes_are_refused_naming_both() {
        let mut s = state();
        s.ingress_profiles
            .get_mut("aa11")
            .unwrap()
            .allow
            .push(allow("10.1.0.200", "10.1.1.5", (0, 255), (81, 90)));
        let e = normalize(&s).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid network policy state: ingress profile \"aa11\": boxes 10.1.0.0-10.1.0.255 . 6 . 80-81 and 10.1.0.200-10.1.1.5 . 0-255 . 81-90 overlap"
        );
        // Adjacent, or apart in one field only, is no overlap.
        let mut s = state();
        s.ingress_profiles.get_mut("aa11").unwrap().allow.extend([
            allow("10.1.0.0", "10.1.0.255", (6, 6), (82, 90)),
            allow("10.1.0.0", "10.1.0.255", (17, 17), (80, 81)),
            allow("10.1.1.0", "10.1.1.0", (6, 6), (80, 81)),
            allow("fd00::1:0", "fd00::1:0", (17, 17), (53, 53)),
        ]);
        normalize(&s).unwrap();
        // The same box twice overlaps itself.
        let mut s = state();
        let dup = s.egress_profiles["bb22"].allow[0].clone();
        s.egress_profiles.get_mut("bb22").unwrap().allow.push(dup);
        assert!(normalize(&s).unwrap_err().to_string().contains("overlap"));
    }

    /// A change to a valid state.
    type Edit = fn(&mut PolicyState);

    #[test]
    fn bad_boxes_names_and_references_are_refused() {
        let cases: Vec<(Edit, &str)> = vec![
            (
                |s| {
                    s.ingress_profiles
                        .get_mut("aa11")
                        .unwrap()
                        .allow
                        .push(allow("10.9.0.0", "fd00::9", (6, 6), (1, 1)))
                },
                "box 10.9.0.0-fd00::9 . 6 . 1 mixes IPv4 and IPv6",
            ),
            (
                |s| {
                    s.ingress_profiles
                        .get_mut("aa11")
                        .unwrap()
                        .allow
                        .push(allow("10.9.0.9", "10.9.0.1", (6, 6), (1, 1)))
                },
                "ends before it starts (addresses)",
            ),
            (
                |s| {
                    s.ingress_profiles
                        .get_mut("aa11")
                        .unwrap()
                        .allow
                        .push(allow("10.9.0.1", "10.9.0.1", (6, 6), (9, 1)))
                },
                "ends before it starts (ports)",
            ),
            (
                |s| {
                    s.egress_profiles
                        .insert("Bad-Name".into(), Profile::default());
                },
                "egress profile \"Bad-Name\": a profile name is 1 to 32 characters of [a-z0-9]",
            ),
            (
                |s| {
                    s.egress_profiles.insert("a".repeat(33), Profile::default());
                },
                "a profile name is 1 to 32 characters",
            ),
            (
                |s| {
                    s.egress_profiles.insert(String::new(), Profile::default());
                },
                "a profile name is 1 to 32 characters",
            ),
            (
                |s| {
                    s.egress.insert(ip("10.1.0.9"), "aa11".into());
                },
                "egress of pod 10.1.0.9: its profile \"aa11\" does not exist",
            ),
        ];
        for (change, words) in cases {
            let mut s = state();
            change(&mut s);
            let e = normalize(&s).unwrap_err();
            assert!(matches!(e, Error::InvalidPolicy { .. }), "{e:?}");
            assert!(e.to_string().contains(words), "{e} lacks {words:?}");
        }
        assert!(valid_name(&"0".repeat(32)));
    }

    #[test]
    fn the_same_state_sends_nothing() {
        let held = normalize(&state()).unwrap();
        assert!(diff(&held, &state(), &[]).unwrap().is_none());
        // Box order does not matter.
        let mut s = state();
        s.ingress_profiles.get_mut("aa11").unwrap().allow.reverse();
        assert!(diff(&held, &s, &[]).unwrap().is_none());
    }

    /// From any of these states to any other, the diff's edits turn the held state
    /// into the wanted one (and no diff means they are the same).
    #[test]
    fn edits_make_the_held_state_the_wanted_one() {
        let mut states = vec![PolicyState::default(), state(), state_with_peers()];
        let mut p = state_with_peers();
        p.peer_sets.get_mut("pp01").unwrap().insert(ip("10.9.0.7"));
        p.ingress_profiles.get_mut("aa11").unwrap().peers.pop();
        p.peer_sets.remove("pp02");
        states.push(p);
        let mut s = state();
        s.ingress.insert(ip("fd00::9"), "aa11".into());
        s.egress.remove(&ip("10.1.0.2"));
        states.push(s.clone());
        s.ingress_profiles.insert("cc33".into(), profile(&[]));
        s.ingress.insert(ip("10.1.0.2"), "cc33".into());
        states.push(s.clone());
        s.ingress_profiles.remove("aa11");
        s.ingress.retain(|_, p| p != "aa11");
        s.egress_profiles.get_mut("bb22").unwrap().allow[0].ports = (1, 2);
        states.push(s);
        for from in &states {
            for to in &states {
                let mut have = normalize(from).unwrap();
                match diff(&have, to, &[]).unwrap() {
                    None => assert_eq!(have, normalize(to).unwrap()),
                    Some((_, _, edits)) => {
                        edits.apply(&mut have);
                        assert_eq!(have, normalize(to).unwrap());
                    }
                }
            }
        }
    }

    #[test]
    fn pods_may_only_name_profiles_that_stay() {
        let have = normalize(&state()).unwrap();
        // Left as it was, but its profile goes.
        let mut s = state();
        s.egress_profiles.clear();
        let e = diff(&have, &s, &[]).unwrap_err().to_string();
        assert!(
            e.contains("egress of pod 10.1.0.2: its profile \"bb22\" does not exist"),
            "{e}"
        );
        // Moved to a profile that does not exist.
        let mut s = state();
        s.ingress.insert(ip("fd00::2"), "zz99".into());
        let e = diff(&have, &s, &[]).unwrap_err().to_string();
        assert!(
            e.contains("ingress of pod fd00::2: its profile \"zz99\" does not exist"),
            "{e}"
        );
    }

    #[test]
    fn a_new_pod_is_one_small_transaction_with_its_resolution_in_it() {
        let have = normalize(&state()).unwrap();
        let mut s = state();
        s.ingress.insert(ip("10.1.0.3"), "aa11".into());
        let (b, c, _) = diff(&have, &s, &[ip("10.1.0.3")]).unwrap().unwrap();
        assert_eq!(
            describe(&b),
            [
                "add element inet cni_node_policy ingress4 (1 element)",
                "add element inet cni_node_policy pending4 (1 element)",
                "delete element inet cni_node_policy pending4 (1 element)",
            ]
        );
        assert_eq!(
            c,
            Changes {
                pods_added: 1,
                pending_resolved: 1,
                messages: 3,
                bytes: c.bytes,
                ..Changes::default()
            }
        );
    }

    #[test]
    fn new_profiles_come_before_their_pods_removed_ones_after() {
        let have = normalize(&state()).unwrap();
        let mut s = state();
        s.ingress_profiles.remove("aa11");
        s.ingress_profiles.insert(
            "cc33".into(),
            profile(&[allow("10.3.0.0", "10.3.0.255", (6, 6), (22, 22))]),
        );
        s.ingress.insert(ip("10.1.0.2"), "cc33".into());
        s.ingress.insert(ip("fd00::2"), "cc33".into());
        let (b, c, _) = diff(&have, &s, &[]).unwrap().unwrap();
        let t = "inet cni_node_policy";
        assert_eq!(
            describe(&b),
            [
                format!("add set {t} ingress-cc33-v4"),
                format!("add element {t} ingress-cc33-v4 (1 element)"),
                format!("add set {t} ingress-cc33-v6"),
                format!("add chain {t} ingress-cc33"),
                format!("add rule {t} ingress-cc33"),
                format!("add rule {t} ingress-cc33"),
                format!("add rule {t} ingress-cc33"),
                format!("delete element {t} ingress4 (1 element)"),
                format!("add element {t} ingress4 (1 element)"),
                format!("delete element {t} ingress6 (1 element)"),
                format!("add element {t} ingress6 (1 element)"),
                format!("delete chain {t} ingress-aa11"),
                format!("delete set {t} ingress-aa11-v4"),
                format!("delete set {t} ingress-aa11-v6"),
            ]
        );
        assert_eq!(
            (
                c.profiles_added,
                c.profiles_removed,
                c.pods_added,
                c.pods_removed
            ),
            (1, 1, 2, 2)
        );
    }

    #[test]
    fn boxes_compare_in_any_order() {
        let boxes = state().ingress_profiles["aa11"].allow.clone();
        let held: BTreeSet<Allow> = boxes.iter().cloned().collect();
        let mut reversed = boxes.clone();
        reversed.reverse();
        assert!(is_sorted(&boxes) && !is_sorted(&reversed));
        assert!(same_boxes(&held, &boxes));
        assert!(same_boxes(&held, &reversed));
        let mut other = boxes.clone();
        other[0].ports = (80, 82);
        assert!(!same_boxes(&held, &other));
        assert!(!same_boxes(&held, &boxes[1..]));
        let mut overlapping = boxes.clone();
        overlapping.push(allow("10.1.0.9", "10.1.0.9", (6, 6), (80, 80)));
        let what = || "ingress profile \"aa11\"".to_string();
        assert!(
            check_boxes(&profile(&overlapping), &what).is_err(),
            "unsorted"
        );
        overlapping.sort();
        assert!(
            check_boxes(&profile(&overlapping), &what).is_err(),
            "sorted"
        );
    }

    #[test]
    fn a_big_set_that_loses_elements_is_made_anew() {
        let mut s = state();
        let boxes: Vec<Allow> = (0..=REBUILD_ABOVE as u8)
            .map(|i| Allow {
                first: format!("10.7.{i}.0").parse().unwrap(),
                last: format!("10.7.{i}.9").parse().unwrap(),
                protocols: (6, 6),
                ports: (80, 80),
            })
            .collect();
        s.ingress_profiles.get_mut("aa11").unwrap().allow = boxes.clone();
        let have = normalize(&s).unwrap();
        // One more: added as an element.
        let mut more = s.clone();
        let mut bigger = boxes.clone();
        bigger.push(Allow {
            first: "10.8.0.0".parse().unwrap(),
            last: "10.8.0.0".parse().unwrap(),
            protocols: (6, 6),
            ports: (80, 80),
        });
        more.ingress_profiles.get_mut("aa11").unwrap().allow = bigger;
        let (b, _, _) = diff(&have, &more, &[]).unwrap().unwrap();
        assert_eq!(
            describe(&b),
            ["add element inet cni_node_policy ingress-aa11-v4 (1 element)"]
        );
        // One less: the IPv4 set is made anew, the IPv6 set is left alone.
        let mut less = s.clone();
        less.ingress_profiles.get_mut("aa11").unwrap().allow = boxes[1..].to_vec();
        let (b, c, _) = diff(&have, &less, &[]).unwrap().unwrap();
        let kept = REBUILD_ABOVE;
        assert_eq!(
            describe(&b),
            [
                "flush chain inet cni_node_policy ingress-aa11".to_owned(),
                "delete set inet cni_node_policy ingress-aa11-v4".to_owned(),
                "add set inet cni_node_policy ingress-aa11-v4".to_owned(),
                format!("add element inet cni_node_policy ingress-aa11-v4 ({kept} elements)"),
                "add rule inet cni_node_policy ingress-aa11".to_owned(),
                "add rule inet cni_node_policy ingress-aa11".to_owned(),
                "add rule inet cni_node_policy ingress-aa11".to_owned(),
            ]
        );
        assert_eq!(
            (c.profiles_changed, c.boxes_added, c.boxes_removed),
            (1, kept, kept + 1)
        );
    }

    #[test]
    fn changed_boxes_are_changed_in_place() {
        let have = normalize(&state()).unwrap();
        let mut s = state();
        let p = s.ingress_profiles.get_mut("aa11").unwrap();
        p.allow[0].ports = (80, 82);
        let (b, c, _) = diff(&have, &s, &[]).unwrap().unwrap();
        assert_eq!(
            describe(&b),
            [
                "delete element inet cni_node_policy ingress-aa11-v4 (1 element)",
                "add element inet cni_node_policy ingress-aa11-v4 (1 element)",
            ]
        );
        assert_eq!(
            (c.profiles_changed, c.boxes_added, c.boxes_removed),
            (1, 1, 1)
        );
    }

    #[test]
    fn a_fresh_table_has_its_fixed_part_first_and_carries_pending_over() {
        let want = normalize(&state()).unwrap();
        let pending = [(ip("10.1.0.9"), Some("ns/new".to_owned()))].into();
        let (b, c) = fresh(&want, 7, true, &pending).unwrap();
        let ops = describe(&b);
        let t = "inet cni_node_policy";
        assert_eq!(
            ops[..10],
            [
                format!("delete table {t}"),
                format!("add table {t}"),
                format!("add map {t} ingress4"),
                format!("add map {t} ingress6"),
                format!("add map {t} egress4"),
                format!("add map {t} egress6"),
                format!("add set {t} pending4"),
                format!("add set {t} pending6"),
                format!("add chain {t} forward"),
                format!("add rule {t} forward"),
            ]
        );
        assert_eq!(
            ops.last().unwrap(),
            &format!("add element {t} pending4 (1 element)")
        );
        assert!(c.created);
        assert_eq!((c.profiles_added, c.pods_added, c.boxes_added), (2, 3, 4));
    }

    /// An address is released for the pod it was made pending for: not for another
    /// pod the agent still believes holds it (an address handed on).
    #[test]
    fn pending_addresses_are_released_for_their_own_pod() {
        let pending: BTreeMap<IpAddr, Option<String>> = [
            (ip("10.1.0.5"), Some("ns/b".to_owned())),
            (ip("10.1.0.6"), None),
            (ip("10.1.0.7"), Some("ns/c".to_owned())),
            (ip("10.1.0.8"), Some(pod_tag(&"x".repeat(300)))),
        ]
        .into();
        let judged: BTreeMap<IpAddr, String> = [
            (ip("10.1.0.5"), "ns/a".to_owned()),
            (ip("10.1.0.6"), "ns/d".to_owned()),
            (ip("10.1.0.8"), "x".repeat(300)),
        ]
        .into();
        assert_eq!(
            releasable(&pending, &judged),
            [ip("10.1.0.6"), ip("10.1.0.8")]
        );
        let mut judged = judged;
        judged.insert(ip("10.1.0.5"), "ns/b".into());
        assert_eq!(releasable(&pending, &judged).len(), 3);
    }

    #[test]
    fn long_pod_names_are_cut_to_what_a_comment_holds() {
        assert_eq!(pod_tag("ns/pod"), "ns/pod");
        let long = format!("ns/{}", "é".repeat(150));
        let tag = pod_tag(&long);
        assert!(tag.len() < 160 && tag.contains("... sha512:"), "{tag}");
        assert_eq!(tag, pod_tag(&long));
        assert_ne!(tag, pod_tag(&format!("{long}x")));
        let mut b = Batch::new();
        b.add_elements(
            NFPROTO_INET,
            TABLE,
            PENDING4,
            &[pending_element(ip("10.0.0.1"), Some(&long))],
        )
        .unwrap();
    }

    #[test]
    fn base_chains_judge_both_directions_in_forward_and_egress_only_in_input() {
        let forward = base_rules(Base::Forward);
        let input = base_rules(Base::Input);
        assert_eq!(forward.len(), 11);
        assert_eq!(input.len(), 7);
        let vmaps = |rules: &[Vec<Expr>]| -> Vec<String> {
            rules
                .iter()
                .filter_map(|r| match r.last() {
                    Some(Expr::Lookup {
                        dreg: Some(_), set, ..
                    }) => Some(set.clone()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(
            vmaps(&forward),
            ["egress4", "egress6", "ingress4", "ingress6"]
        );
        assert_eq!(vmaps(&input), ["egress4", "egress6"]);
    }

    #[test]
    fn profile_chains_accept_or_return_then_drop() {
        let ingress = profile_rules(Direction::Ingress, "aa11", &[]);
        let egress = profile_rules(Direction::Egress, "aa11", &[]);
        assert_eq!(ingress.len(), 3);
        assert_eq!(ingress[0].last(), Some(&verdict(VERDICT_ACCEPT, None)));
        assert_eq!(egress[1].last(), Some(&verdict(VERDICT_RETURN, None)));
        assert_eq!(egress[2], [verdict(VERDICT_DROP, None)]);
        assert_eq!(
            Direction::parse_chain("egress-aa11"),
            Some((Direction::Egress, "aa11"))
        );
        assert_eq!(Direction::parse_chain("egress-"), None);
        assert_eq!(Direction::parse_chain("forward"), None);
    }

    #[test]
    fn peer_rules_read_back_as_they_were_written() {
        let rules = [
            peer("pp01", (6, 6), (8080, 8080)),
            peer("pp01", (6, 17), (8080, 8090)),
            peer("pp01", (0, 255), (53, 53)),
            peer("pp01", (17, 17), (0, 65535)),
            peer("pp01", (0, 255), (0, 65535)),
        ];
        for direction in DIRECTIONS {
            for family in FAMILIES {
                for rule in &rules {
                    let exprs = peer_rule(direction, family, rule);
                    assert_eq!(
                        decode_peer_rule(direction, family, &exprs).as_ref(),
                        Some(rule)
                    );
                    let other = match family {
                        Family::V4 => Family::V6,
                        Family::V6 => Family::V4,
                    };
                    assert_eq!(decode_peer_rule(direction, other, &exprs), None);
                }
            }
        }
        // A whole chain: own sets, the peer rules per family, drop.
        let peers = sorted_peers(&rules);
        let chain = profile_rules(Direction::Egress, "aa11", &peers);
        assert_eq!(chain.len(), 2 + 2 * peers.len() + 1);
        let refs: Vec<&Vec<Expr>> = chain.iter().collect();
        assert_eq!(
            decode_profile_rules(Direction::Egress, "aa11", &refs),
            Some(peers.clone())
        );
        assert_eq!(
            decode_profile_rules(Direction::Ingress, "aa11", &refs),
            None
        );
        // Out of order, or a rule missing: not ours.
        let mut swapped = refs.clone();
        swapped.swap(2, 4);
        swapped.swap(3, 5);
        assert_eq!(
            decode_profile_rules(Direction::Egress, "aa11", &swapped),
            None
        );
        let mut short = refs.clone();
        short.remove(3);
        assert_eq!(
            decode_profile_rules(Direction::Egress, "aa11", &short),
            None
        );
    }

    #[test]
    fn a_peer_rule_needs_its_set() {
        let mut s = state_with_peers();
        assert!(normalize(&s).is_ok());
        s.peer_sets.remove("pp02");
        let e = normalize(&s).unwrap_err().to_string();
        assert!(e.contains("its peer set \"pp02\" does not exist"), "{e}");
        let mut s = state_with_peers();
        s.peer_sets.insert("Bad".into(), BTreeSet::new());
        let e = normalize(&s).unwrap_err().to_string();
        assert!(e.contains("peer set \"Bad\""), "{e}");
    }

    #[test]
    fn peer_sets_come_before_the_rules_that_use_them_and_go_after() {
        let t = "inet cni_node_policy";
        let have = normalize(&state()).unwrap();
        let (b, c, _) = diff(&have, &state_with_peers(), &[]).unwrap().unwrap();
        let d = describe(&b);
        assert_eq!(
            d[..6],
            [
                format!("add set {t} peer-pp01-v4"),
                format!("add element {t} peer-pp01-v4 (2 elements)"),
                format!("add set {t} peer-pp01-v6"),
                format!("add element {t} peer-pp01-v6 (1 element)"),
                format!("add set {t} peer-pp02-v4"),
                format!("add element {t} peer-pp02-v4 (1 element)"),
            ]
        );
        assert_eq!(d[7], format!("flush chain {t} ingress-aa11"));
        assert_eq!(d.len(), 8 + 2 + 4 + 1, "{d:?}");
        assert_eq!((c.peer_sets_added, c.peer_addresses_added), (2, 4));
        // And back: the chain is written again first, then the sets go.
        let have = normalize(&state_with_peers()).unwrap();
        let (b, c, _) = diff(&have, &state(), &[]).unwrap().unwrap();
        let d = describe(&b);
        assert_eq!(d[0], format!("flush chain {t} ingress-aa11"));
        assert_eq!(
            d[d.len() - 4..],
            [
                format!("delete set {t} peer-pp01-v4"),
                format!("delete set {t} peer-pp01-v6"),
                format!("delete set {t} peer-pp02-v4"),
                format!("delete set {t} peer-pp02-v6"),
            ]
        );
        assert_eq!(c.peer_sets_removed, 2);
    }

    #[test]
    fn a_pod_joining_a_peer_set_is_one_element() {
        let have = normalize(&state_with_peers()).unwrap();
        let mut s = state_with_peers();
        s.peer_sets.get_mut("pp01").unwrap().insert(ip("10.9.0.3"));
        s.peer_sets.get_mut("pp01").unwrap().remove(&ip("fd09::1"));
        let (b, c, _) = diff(&have, &s, &[]).unwrap().unwrap();
        assert_eq!(
            describe(&b),
            [
                "add element inet cni_node_policy peer-pp01-v4 (1 element)",
                "delete element inet cni_node_policy peer-pp01-v6 (1 element)",
            ]
        );
        assert_eq!((c.peer_addresses_added, c.peer_addresses_removed), (1, 1));
        // Peer rules in another order are the same profile.
        let mut s = state_with_peers();
        s.ingress_profiles.get_mut("aa11").unwrap().peers.reverse();
        assert!(diff(&have, &s, &[]).unwrap().is_none());
    }
}
