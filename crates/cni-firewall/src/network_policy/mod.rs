//! Policy's datapath on a node whose pods sit on a Linux bridge: the nftables table
//! `inet cni_node_policy` that judges pods' traffic tier by tier as the node agent
//! computed it (ClusterNetworkPolicy's Admin tier, NetworkPolicy, ClusterNetworkPolicy's
//! Baseline tier, then allow), counting every decision in a *verdict chain* of its
//! own, and the "pending" sets that hold a new pod's traffic until the agent has
//! judged it.
//!
//! The agent computes the desired state as plain data ([`PolicyState`]): which
//! local pod address is judged by which ingress and egress *profile* of each tier;
//! what each NetworkPolicy profile allows (its own disjoint boxes of (peer address
//! range, IP protocol range, destination port range), and rules over *peer sets* that
//! profiles share: the addresses of a peer that many profiles allow, held once); what
//! each Admin or Baseline profile decides (each peer it has a word for sent to a *row*:
//! disjoint boxes of (IP protocol range, destination port range), each going to a
//! verdict chain; rows shared by the peers, and the profiles, that the same rules
//! decide for); and the verdict chains ([`VerdictAction`]: accept, drop, or on to
//! NetworkPolicy), named by the caller for what decided there.
//! [`PolicyTable`] makes the kernel hold that state: it
//! keeps what it committed in memory and sends only the differences, in one
//! nf_tables transaction, over netlink (a profile's set of many elements that loses
//! any is sent whole again, which costs the kernel less than taking elements out of
//! it); it lists the table only in
//! [`PolicyTable::load`] (at start, to adopt a table a previous run left, and at a
//! periodic resync, to notice hand edits), never on the event path.
//! [`read_verdict_counters`] reads the verdict chains' counters on its own.
//!
//! # The table
//!
//! Its rules do not grow with pods; pods, boxes and peers' addresses are set
//! elements, and a NetworkPolicy profile's chain has a rule per peer set it uses. Each
//! direction is judged in one chain of `goto`s, so that whatever decides ends the
//! direction's judgement: `return` (allowed: back in the base chain, which goes on to
//! the other direction) or `drop`:
//!
//! ```text
//! table inet cni_node_policy {
//!     map admin-ingress4 { type ipv4_addr : verdict }  # pod -> goto admin-ingress-<p>
//!     map admin-ingress6, admin-egress4, admin-egress6 ...
//!     map ingress4 { type ipv4_addr : verdict }        # pod -> goto ingress-<profile>
//!     map ingress6, egress4, egress6 ...               # NetworkPolicy's
//!     map baseline-ingress4 ... baseline-egress6       # pod -> goto baseline-...-<p>
//!     set pending4 { type ipv4_addr }                  # new pods not judged yet
//!     set pending6 { type ipv6_addr }
//!     set ingress-<profile>-v4 {                       # one pair per NP profile
//!         type ipv4_addr . inet_proto . inet_service
//!         flags interval                               # concatenated ranges (pipapo)
//!     }
//!     set peer-<peer>-v4 { type ipv4_addr }            # one pair per shared peer
//!     set peer-<peer>-v6 { type ipv6_addr }
//!     map admin-egress-<p>-peers4 {                    # per tier profile and family
//!         type ipv4_addr : verdict                     # peer -> goto admin-egress-row-<r>
//!     }
//!     map admin-egress-<p>-ranges4 {                   # the networks rules name
//!         type ipv4_addr . inet_proto : verdict        # (every protocol)
//!         flags interval                               # -> goto admin-egress-row-<r>
//!     }
//!     map admin-egress-row-<r>-keys {                  # per row
//!         type inet_proto . inet_service : verdict
//!         flags interval                               # box -> goto v-<origin>
//!     }
//!     chain forward {
//!         type filter hook forward priority filter; policy accept;
//!         ct direction reply accept
//!         ct state related accept
//!         icmpv6 type 133-137 accept                   # router and neighbour discovery
//!         ip saddr @pending4 drop
//!         ip daddr @pending4 drop
//!         ip6 saddr @pending6 drop
//!         ip6 daddr @pending6 drop
//!         jump judge-egress                            # the source's egress, then
//!         jump judge-ingress                           # the destination's ingress
//!     }
//!     chain input {                                    # pods to the node's own addresses
//!         type filter hook input priority filter; policy accept;
//!         (the reply, related, ICMPv6 and source pending rules)
//!         jump judge-egress
//!     }
//!     chain judge-egress {                             # the Admin tier
//!         ip saddr vmap @admin-egress4
//!         ip6 saddr vmap @admin-egress6
//!         goto np-egress                               # no Admin profile
//!     }
//!     chain np-egress {                                # NetworkPolicy
//!         ip saddr vmap @egress4
//!         ip6 saddr vmap @egress6
//!         goto baseline-egress                         # not isolated
//!     }
//!     chain baseline-egress {                          # the Baseline tier
//!         ip saddr vmap @baseline-egress4
//!         ip6 saddr vmap @baseline-egress6
//!     }                                                # (its end: allowed)
//!     chain admin-egress-<p> {                         # the peer's row
//!         ip daddr vmap @admin-egress-<p>-peers4
//!         ip daddr . meta l4proto vmap @admin-egress-<p>-ranges4
//!         ip6 daddr vmap @admin-egress-<p>-peers6
//!         ip6 daddr . meta l4proto vmap @admin-egress-<p>-ranges6
//!         goto np-egress                               # no row: no word
//!     }
//!     chain admin-egress-row-<r> {                     # the row's verdict
//!         meta l4proto . th dport vmap @admin-egress-row-<r>-keys
//!         goto np-egress                               # no box: no word
//!     }
//!     chain baseline-egress-<p>, baseline-egress-row-<r> {  # likewise, and at their
//!         (the lookups)                                # end the direction is allowed
//!     }
//!     chain egress-<profile> {                         # NetworkPolicy's profile
//!         ip daddr . meta l4proto . th dport @egress-<profile>-v4 goto v-<allow>
//!         ip6 daddr . meta l4proto . th dport @egress-<profile>-v6 goto v-<allow>
//!         ip daddr @peer-<peer>-v4 tcp dport 8080 goto v-<allow>   # per peer rule
//!         ip6 daddr @peer-<peer>-v6 tcp dport 8080 goto v-<allow>
//!         goto v-<default-deny>
//!     }
//!     chain v-<origin> {                               # one per verdict origin
//!         ct state new counter packets 0 bytes 0
//!         ct state new limit rate 10/second log prefix "v-<origin>" group 1  # drops,
//!         drop                          # deny log on; else `return` or `goto np-...`
//!     }
//!     (ingress mirrors egress: daddr for the pod, saddr for the peer)
//! }
//! ```
//!
//! So each direction costs one hash lookup per tier (a miss for a pod the tier has no
//! word for) and, for a pod with a profile in a tier, one hash lookup of the peer
//! (then, for a peer that is no single address of the profile, one pipapo lookup of
//! its range) and one pipapo lookup in the row, whose map holds a few boxes. A tier's
//! boxes are held once per row, not once per peer address: a peer of thousands of pods
//! is thousands of elements of a hashed map, which a pod coming or going changes by
//! one, and the few rows its rules make. The
//! Admin tier decides first: its accept ends the direction's judgement (the source's
//! egress accepted, the destination's ingress is still judged: `return` to the base
//! chain, which jumps to the ingress side next), its drop drops, its pass goes on to
//! NetworkPolicy. NetworkPolicy's map sends a pod it isolates to its profile, which
//! decides alone: the Baseline tier never judges a direction NetworkPolicy isolates.
//! A pod it does not isolate goes on to the Baseline tier, whose pass is an allow
//! (nothing comes after it). A NetworkPolicy profile without verdict chains
//! ([`Profile::verdicts`] `None`) accepts (ingress) or returns (egress) and drops
//! right in its chain.
//!
//! Every verdict goes through a verdict chain named by the caller (`v-` and a hash of
//! what decided, for `/metrics` and the deny log to name): it counts the packets that
//! open connections (`ct state new counter`), logs them to nflog when it drops and
//! [`PolicyState::deny_log`] is set, and acts.
//!
//! Traffic between two pods of the node passes the forward hook once, so the
//! source's egress and the destination's ingress both judge it. A
//! pod's traffic to its own address never leaves it and is not judged; to itself
//! through a Service address (kube-proxy's DNAT on the node) it passes the forward
//! hook with the pod's address as source and destination, on the port after DNAT,
//! and both its sides judge it (conntrack's original destination is not looked
//! at). A
//! pod's traffic to the node itself is judged by its egress alone (input);
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
//! original-direction packet is eight hash lookups (the pending set twice, the three
//! tiers' maps per direction), one pipapo lookup per NetworkPolicy profile that judges
//! it and two or three lookups per tier profile (at most one of each per tier and
//! direction), whatever the numbers of pods and policies, and, when
//! a NetworkPolicy profile's own set does not allow the packet, a hash lookup per peer
//! rule of the profile up to the one that does: the
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
//!
//! # Where things are
//!
//! This file holds the state's types, the table's layout (its names, families,
//! directions and tiers) and [`PolicyTable`] itself; `rules` the rules as expressions
//! (and a peer rule and a verdict chain decoded back), `elements` the sets and their
//! elements, `validate` the checks of a desired state and its normal form,
//! `transaction` the difference as one transaction, `load` the decoding of the table
//! read back, `counters` the verdict chains' counters read on their own.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use crate::error::{Error, Result};
use sha2::Digest as _;

use crate::nfnetlink::{
    BASE_NETWORK, BASE_TRANSPORT, BYTEORDER_BIG_ENDIAN, Batch, CMP_EQ, CMP_NEQ, ChainHook, Element,
    Expr, Hook, META_L4PROTO, META_NFPROTO, NFPROTO_INET, NFPROTO_IPV4, NFPROTO_IPV6, Nfnl,
    POLICY_ACCEPT, REG_1, REG_2, SetSpec, TYPE_INET_PROTO, TYPE_INET_SERVICE, TYPE_IP6ADDR,
    TYPE_IPADDR, VERDICT_DROP, VERDICT_GOTO, VERDICT_JUMP, VERDICT_RETURN, is_not_found,
    is_restart,
};
use crate::nft_build::{addr_bytes, verdict};

mod counters;
mod elements;
mod load;
mod rules;
#[cfg(test)]
mod tests;
mod transaction;
mod validate;

pub use counters::read_verdict_counters;
use elements::*;
use load::*;
use rules::*;
use transaction::*;
use validate::*;

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
/// `NF_CT_STATE_BIT(IP_CT_RELATED)` and `(IP_CT_NEW)`, host-order words.
const CT_STATE_RELATED: u32 = 4;
const CT_STATE_NEW: u32 = 8;
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
    /// The verdict chains its allowed and its dropped traffic go through (to be
    /// counted, and logged when dropped); `None`: allowed traffic is let through and
    /// the rest dropped right in the profile's chain, uncounted.
    pub verdicts: Option<ProfileVerdicts>,
}

/// A NetworkPolicy profile's verdict chains ([`PolicyState::verdict_chains`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProfileVerdicts {
    /// Where allowed traffic goes: a chain whose action is [`VerdictAction::Accept`].
    pub allow: String,
    /// Where the rest goes: a chain whose action is [`VerdictAction::Drop`].
    pub deny: String,
}

/// What a verdict chain does with a packet once it has counted it (if the packet
/// opens a connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum VerdictAction {
    /// Allowed in this direction: the direction's judgement ends (`return`), and the
    /// other direction is still judged (the destination's ingress, after the
    /// source's egress).
    Accept,
    /// Dropped (after the deny log's line, when [`PolicyState::deny_log`] is set).
    Drop,
    /// On to the NetworkPolicy tier of the same direction (`goto np-<direction>`):
    /// the Admin tier's `Pass`. Only Admin boxes of that direction may use it.
    ToNetworkPolicy(Direction),
}

/// The deny log: every chain whose action is [`VerdictAction::Drop`] sends the first
/// packet of each connection it drops to nflog group `group`, at most `per_second`
/// packets a second per chain (nft's `limit`, burst 5), with the chain's name as the
/// log prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DenyLog {
    /// The nflog group.
    pub group: u16,
    /// At most this many lines a second per chain (at least 1).
    pub per_second: u32,
}

/// One box of a ClusterNetworkPolicy tier's row: traffic on IP protocols `protocols`
/// and destination ports `ports` (inclusive; a packet without ports is covered only by
/// ports 0–65535, as in [`Allow`]) goes to the verdict chain `chain`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TierBox {
    /// IP protocol numbers, inclusive.
    pub protocols: (u8, u8),
    /// Destination ports, inclusive.
    pub ports: (u16, u16),
    /// The verdict chain ([`PolicyState::verdict_chains`]), shared by the many boxes
    /// that go to it.
    pub chain: Arc<str>,
}

impl TierBox {
    fn overlaps(&self, other: &TierBox) -> bool {
        fn meet<T: Ord>(a: (T, T), b: (T, T)) -> bool {
            a.0 <= b.1 && b.0 <= a.1
        }
        meet(self.protocols, other.protocols) && meet(self.ports, other.ports)
    }

    /// Whether the box is one; `what` names its row in the error.
    fn check(&self, what: &dyn Fn() -> String) -> Result<()> {
        if self.protocols.0 > self.protocols.1 || self.ports.0 > self.ports.1 {
            return Err(invalid(
                what(),
                format!("box {self} has a range that ends before it starts"),
            ));
        }
        Ok(())
    }
}

/// As an element in nft's syntax: `6 . 80-81`.
impl fmt::Display for TierBox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.protocols.0 == self.protocols.1 {
            write!(f, "{} . ", self.protocols.0)?;
        } else {
            write!(f, "{}-{} . ", self.protocols.0, self.protocols.1)?;
        }
        if self.ports.0 == self.ports.1 {
            write!(f, "{}", self.ports.0)
        } else {
            write!(f, "{}-{}", self.ports.0, self.ports.1)
        }
    }
}

/// A row of a ClusterNetworkPolicy tier: what decides, per protocol and port, for the
/// peers a profile sends to it. Its boxes are pairwise disjoint, in any order; where
/// none lies the tier has no word (the next tier judges). Rows are shared: the peers of
/// many profiles that the same rules decide for go to one row.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TierRow {
    /// The boxes.
    pub boxes: Vec<TierBox>,
}

/// Peer addresses `first..=last` (one family) that go to the row `row`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TierRange {
    /// First address.
    pub first: IpAddr,
    /// Last address (same family as `first`, not below it).
    pub last: IpAddr,
    /// The row (a key of the tier's rows of the profile's direction).
    pub row: Arc<str>,
}

/// A profile of a ClusterNetworkPolicy tier: the peers it has a word for, each sent
/// to the row that says what decides for it. A peer is looked up among the single
/// addresses first and, only when it is none of them, among the ranges: so a single
/// address inside a range must go to a row that says, wherever the range's row has a
/// box, what that row says. A peer in neither: the tier has no word.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TierProfile {
    /// Single peer addresses (pods', Nodes') and their rows.
    pub peers: BTreeMap<IpAddr, Arc<str>>,
    /// Peer address ranges (the networks that rules name) and their rows, pairwise
    /// disjoint.
    pub ranges: BTreeSet<TierRange>,
}

/// What one ClusterNetworkPolicy tier (Admin or Baseline) holds: which local pod
/// address each of its profiles judges, per direction, the profiles and their rows. A
/// pod with no entry costs one hash miss per direction.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TierState {
    /// Local pod address -> its ingress profile.
    pub ingress: BTreeMap<IpAddr, String>,
    /// Local pod address -> its egress profile.
    pub egress: BTreeMap<IpAddr, String>,
    /// Ingress profiles by name (named as [`PolicyState::ingress_profiles`]); their
    /// peers are SOURCES. Shared with what the table holds once applied: a profile
    /// given again as the same `Arc` is known unchanged without a look at its peers.
    pub ingress_profiles: BTreeMap<String, Arc<TierProfile>>,
    /// Egress profiles by name; their peers are DESTINATIONS.
    pub egress_profiles: BTreeMap<String, Arc<TierProfile>>,
    /// Rows of the ingress profiles, by name (named as profiles are).
    pub ingress_rows: BTreeMap<String, TierRow>,
    /// Rows of the egress profiles.
    pub egress_rows: BTreeMap<String, TierRow>,
}

impl TierState {
    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.ingress.is_empty()
            && self.egress.is_empty()
            && self.ingress_profiles.is_empty()
            && self.egress_profiles.is_empty()
            && self.ingress_rows.is_empty()
            && self.egress_rows.is_empty()
    }
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
    /// ClusterNetworkPolicy's Admin tier, judged before NetworkPolicy.
    pub admin: TierState,
    /// ClusterNetworkPolicy's Baseline tier, judged after NetworkPolicy for the pods
    /// NetworkPolicy does not isolate in that direction.
    pub baseline: TierState,
    /// The verdict chains, by name: `v-` and 1 to [`PROFILE_NAME_MAX`] characters of
    /// `[a-z0-9]` (the caller names them for what decided there). Each counts the
    /// connections it sees (`ct state new counter`, read by
    /// [`read_verdict_counters`]), then does its action.
    pub verdict_chains: BTreeMap<String, VerdictAction>,
    /// The deny log, if on.
    pub deny_log: Option<DenyLog>,
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
    /// Verdict chains added.
    pub verdict_chains_added: usize,
    /// Verdict chains removed.
    pub verdict_chains_removed: usize,
    /// Verdict chains written again (their action or the deny log changed).
    pub verdict_chains_changed: usize,
    /// ClusterNetworkPolicy tier profiles (chain and maps) added.
    pub tier_profiles_added: usize,
    /// Tier profiles removed.
    pub tier_profiles_removed: usize,
    /// Tier profiles whose peers changed.
    pub tier_profiles_changed: usize,
    /// Tier profiles' peers (single addresses and ranges: map elements) added, also of
    /// added profiles.
    pub tier_peers_added: usize,
    /// Tier profiles' peers removed from profiles that stay.
    pub tier_peers_removed: usize,
    /// Tier rows (chain and map) added.
    pub tier_rows_added: usize,
    /// Tier rows removed.
    pub tier_rows_removed: usize,
    /// Tier rows whose boxes changed.
    pub tier_rows_changed: usize,
    /// Tier boxes (map elements of rows) added, also of added rows.
    pub tier_boxes_added: usize,
    /// Tier boxes removed from rows that stay.
    pub tier_boxes_removed: usize,
    /// Tier pod map elements added (both tiers).
    pub tier_pods_added: usize,
    /// Tier pod map elements removed.
    pub tier_pods_removed: usize,
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
    Held { held: Box<Held>, rebuild: bool },
}

/// The table's content: per direction, the pods' profiles and the profiles; the
/// shared peer sets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Held {
    pods: [BTreeMap<IpAddr, String>; 2],
    profiles: [BTreeMap<String, HeldProfile>; 2],
    peer_sets: BTreeMap<String, BTreeSet<IpAddr>>,
    /// The Admin and Baseline tiers ([`ClusterTier::index`]).
    tiers: [HeldTier; 2],
    /// Verdict chains: their action, and the deny log they hold (only a drop's).
    verdicts: BTreeMap<String, HeldVerdict>,
}

/// A verdict chain as the table holds it.
type HeldVerdict = (VerdictAction, Option<DenyLog>);

/// A profile as the table holds it: its own boxes, its peer rules sorted and
/// without repeats (the order of its chain), and its verdict chains.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct HeldProfile {
    boxes: BTreeSet<Allow>,
    peers: Vec<PeerRule>,
    verdicts: Option<ProfileVerdicts>,
}

/// A ClusterNetworkPolicy tier as the table holds it: per direction, the pods'
/// profiles, the profiles and the rows' boxes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct HeldTier {
    pods: [BTreeMap<IpAddr, String>; 2],
    profiles: [BTreeMap<String, Arc<TierProfile>>; 2],
    rows: [BTreeMap<String, BTreeSet<TierBox>>; 2],
}

/// The two ClusterNetworkPolicy tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterTier {
    /// Judged before NetworkPolicy ([`PolicyState::admin`]).
    Admin,
    /// Judged after it ([`PolicyState::baseline`]).
    Baseline,
}

const CLUSTER_TIERS: [ClusterTier; 2] = [ClusterTier::Admin, ClusterTier::Baseline];

impl ClusterTier {
    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        match self {
            ClusterTier::Admin => "admin",
            ClusterTier::Baseline => "baseline",
        }
    }

    /// The pods' map of a direction and family: `admin-egress4`.
    fn map(self, direction: Direction, family: Family) -> String {
        format!("{}-{}{}", self.name(), direction.name(), family.digit())
    }

    /// A profile's chain: `admin-egress-<profile>`.
    fn chain(self, direction: Direction, profile: &str) -> String {
        format!("{}-{}-{profile}", self.name(), direction.name())
    }

    /// A profile's map of single peers of one family: `admin-egress-<profile>-peers4`.
    fn peers_map(self, direction: Direction, profile: &str, family: Family) -> String {
        format!("{}-peers{}", self.chain(direction, profile), family.digit())
    }

    /// A profile's map of peer ranges of one family: `admin-egress-<profile>-ranges4`.
    fn ranges_map(self, direction: Direction, profile: &str, family: Family) -> String {
        format!(
            "{}-ranges{}",
            self.chain(direction, profile),
            family.digit()
        )
    }

    /// A row's chain: `admin-egress-row-<row>` (no profile chain's name: a profile's
    /// name has no `-`).
    fn row_chain(self, direction: Direction, row: &str) -> String {
        format!("{}-{}-row-{row}", self.name(), direction.name())
    }

    /// A row's verdict map: `admin-egress-row-<row>-keys`.
    fn row_map(self, direction: Direction, row: &str) -> String {
        format!("{}-keys", self.row_chain(direction, row))
    }

    /// The tier, direction and row of a row chain's name.
    fn parse_row_chain(name: &str) -> Option<(ClusterTier, Direction, &str)> {
        CLUSTER_TIERS.into_iter().find_map(|tier| {
            let rest = name.strip_prefix(tier.name())?.strip_prefix('-')?;
            DIRECTIONS.into_iter().find_map(|d| {
                let row = rest.strip_prefix(d.name())?.strip_prefix("-row-")?;
                valid_name(row).then_some((tier, d, row))
            })
        })
    }

    /// The tier, direction and profile of a tier profile chain's name.
    fn parse_chain(name: &str) -> Option<(ClusterTier, Direction, &str)> {
        CLUSTER_TIERS.into_iter().find_map(|tier| {
            let rest = name.strip_prefix(tier.name())?.strip_prefix('-')?;
            let (direction, profile) = Direction::parse_chain(rest)?;
            Some((tier, direction, profile))
        })
    }

    fn of(self, state: &PolicyState) -> &TierState {
        match self {
            ClusterTier::Admin => &state.admin,
            ClusterTier::Baseline => &state.baseline,
        }
    }
}

/// The fixed chains between the base chains and the profiles, per direction: the
/// entry (`judge-<direction>`: the Admin map), NetworkPolicy's (`np-<direction>`) and
/// the Baseline tier's (`baseline-<direction>`). Their names are no profile chain's
/// (those start with the direction or a tier and the direction).
fn judge_chain(direction: Direction) -> String {
    format!("judge-{}", direction.name())
}

fn np_chain(direction: Direction) -> String {
    format!("np-{}", direction.name())
}

fn baseline_chain(direction: Direction) -> String {
    format!("baseline-{}", direction.name())
}

/// Whether `name` is a verdict chain's: `v-` and a valid name.
fn valid_verdict_chain(name: &str) -> bool {
    name.strip_prefix("v-").is_some_and(valid_name)
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

/// A direction of traffic, seen from the local pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// To the pod.
    Ingress,
    /// From the pod.
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
        check_profiles(want, self.adopted())?;
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
                            held: Box::new(held),
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
        check_profiles(want, self.adopted())?;
        let pending = read_pending(&mut self.nl)?;
        let resolve = releasable(&pending, judged);
        self.apply_checked(want, &resolve)
    }

    /// What the kernel holds, when the next apply diffs against it (and does not make
    /// the table again).
    fn adopted(&self) -> Option<&Held> {
        match &self.view {
            View::Held {
                held,
                rebuild: false,
            } => Some(held),
            _ => None,
        }
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

    /// What the kernel holds, as far as this process knows (after [`PolicyTable::load`]
    /// or an apply), as a state: the tier that a caller cannot judge now (its view is
    /// not complete) is kept as it is by applying this part of it again. A table not
    /// laid out as this module makes it (a hand edit, an earlier layout, which the next
    /// apply makes again whole) gives what could be read of it. `None` when unknown (a
    /// failure left it so: [`PolicyTable::load`] reads it again).
    pub fn held_state(&self) -> Option<PolicyState> {
        let held = match &self.view {
            View::Held { held, .. } => held,
            View::Absent => return Some(PolicyState::default()),
            View::Unknown => return None,
        };
        let profiles = |d: Direction| -> BTreeMap<String, Profile> {
            held.profiles[d.index()]
                .iter()
                .map(|(name, p)| {
                    (
                        name.clone(),
                        Profile {
                            allow: p.boxes.iter().cloned().collect(),
                            peers: p.peers.clone(),
                            verdicts: p.verdicts.clone(),
                        },
                    )
                })
                .collect()
        };
        let tier = |t: ClusterTier| -> TierState {
            let h = &held.tiers[t.index()];
            let rows = |d: Direction| -> BTreeMap<String, TierRow> {
                h.rows[d.index()]
                    .iter()
                    .map(|(name, boxes)| {
                        (
                            name.clone(),
                            TierRow {
                                boxes: boxes.iter().cloned().collect(),
                            },
                        )
                    })
                    .collect()
            };
            TierState {
                ingress: h.pods[Direction::Ingress.index()].clone(),
                egress: h.pods[Direction::Egress.index()].clone(),
                ingress_profiles: h.profiles[Direction::Ingress.index()].clone(),
                egress_profiles: h.profiles[Direction::Egress.index()].clone(),
                ingress_rows: rows(Direction::Ingress),
                egress_rows: rows(Direction::Egress),
            }
        };
        Some(PolicyState {
            ingress: held.pods[Direction::Ingress.index()].clone(),
            egress: held.pods[Direction::Egress.index()].clone(),
            ingress_profiles: profiles(Direction::Ingress),
            egress_profiles: profiles(Direction::Egress),
            peer_sets: held.peer_sets.clone(),
            admin: tier(ClusterTier::Admin),
            baseline: tier(ClusterTier::Baseline),
            verdict_chains: held
                .verdicts
                .iter()
                .map(|(name, (action, _))| (name.clone(), *action))
                .collect(),
            deny_log: held.verdicts.values().find_map(|(_, log)| *log),
        })
    }

    /// The local pod addresses of a tier and direction and the profiles that judge
    /// them, as the kernel holds them (after [`PolicyTable::load`] or an apply); `None`
    /// when that is not known.
    pub fn held_tier_pods(
        &self,
        tier: ClusterTier,
        direction: Direction,
    ) -> Option<&BTreeMap<IpAddr, String>> {
        match &self.view {
            View::Held { held, .. } => Some(&held.tiers[tier.index()].pods[direction.index()]),
            _ => None,
        }
    }

    /// The tier profile of that name as the kernel holds it (as far as this process
    /// knows): a caller that gives an equal profile as this `Arc` spares the apply a
    /// comparison of their peers.
    pub fn held_tier_profile(
        &self,
        tier: ClusterTier,
        direction: Direction,
        name: &str,
    ) -> Option<&Arc<TierProfile>> {
        match &self.view {
            View::Held { held, .. } => {
                held.tiers[tier.index()].profiles[direction.index()].get(name)
            }
            _ => None,
        }
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
