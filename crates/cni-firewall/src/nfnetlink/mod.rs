//! A small nf_tables client speaking netlink (`NETLINK_NETFILTER`) directly,
//! so the masquerade backend changes rules without starting `nft`.
//!
//! It covers exactly what the plugins need: one batch (a kernel transaction)
//! of table/chain/rule additions and rule deletions, a dump of a table's
//! rules with their handles, comments and expressions, existence checks for
//! tables and chains, and a probe that nf_tables answers at all. Messages are
//! laid out the way `nft` lays them out (same attributes, same user-data
//! TLVs), so `nft list` prints what we add exactly as if `nft` had added it.
//!
//! This file holds the protocol's numbers and the shapes of what is sent (expressions,
//! hooks, rules); the submodules, by concern: `writer` builds messages, `batch` holds one
//! transaction of tables, chains and rules, `sets` the sets and maps of every kind
//! (interval sets of concatenations, verdict maps, elements in bulk) and their dumps,
//! `socket` the socket with its requests, commits and dumps, `decode` reads answers back
//! and `errors` says what the kernel's errors mean.
//!
//! Netlink requests to the kernel are processed synchronously inside
//! `send()`: when it returns, every acknowledgement and error of a batch is
//! already queued on the socket, which is what lets [`Nfnl::commit`] collect
//! them without a timeout.

use std::io;

use cni_netlink::Socket;
use cni_netlink::socket::NETLINK_NETFILTER;
use cni_netlink::wire::{
    NLA_F_NESTED, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REQUEST, NLMSG_ERROR, NLMSG_HDRLEN, c_string, messages,
};
use nix::libc;

use crate::error::{Error, Result};

mod batch;
mod decode;
mod errors;
mod sets;
mod socket;
#[cfg(test)]
mod tests;
mod writer;

pub(crate) use batch::*;
pub(crate) use decode::*;
pub use decode::{decode_dumped_rule, decode_dumped_set_elements};
pub(crate) use errors::*;
pub(crate) use sets::{
    BYTEORDER_BIG_ENDIAN, ChainHook, Element, SetSpec, TYPE_INET_PROTO, TYPE_INET_SERVICE,
};
pub(crate) use socket::*;
pub use socket::{SocketsKept, keep_sockets};
use writer::*;

// nfnetlink (linux/netfilter/nfnetlink.h).
const NFGENMSG_LEN: usize = 4;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;

// nf_tables message types (linux/netfilter/nf_tables.h).
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_GETGEN: u16 = 16;
/// NFTA_GEN_ID of a NEWGEN answer.
const NFTA_GEN_ID: u16 = 1;
/// Transactions of up to this many changes ask the kernel to acknowledge each; larger
/// ones only their last (see [`Nfnl::commit`]).
const ACK_EACH_UP_TO: usize = 64;
/// Transactions up to this size fit any socket's default send buffer.
const SMALL_BATCH_BYTES: usize = 64 * 1024;
/// A batch begin carrying this makes the kernel refuse the batch (ERESTART)
/// unless the rule set is still at that generation.
const NFNL_BATCH_GENID: u16 = 1;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_TABLE_USERDATA: u16 = 6;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_CHAIN_USERDATA: u16 = 12;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

/// libnftnl's user-data TLV type of a table, chain or rule comment
/// (`NFTNL_UDATA_{TABLE,CHAIN,RULE}_COMMENT`; all three are 0).
const UDATA_COMMENT: u8 = 0;

/// Address families of nf_tables tables (`NFPROTO_*`).
pub(crate) const NFPROTO_INET: u8 = 1;
pub(crate) const NFPROTO_IPV4: u8 = 2;
pub(crate) const NFPROTO_IPV6: u8 = 10;
pub(crate) const NFPROTO_BRIDGE: u8 = 7;

/// `NF_INET_PRE_ROUTING`, `NF_INET_LOCAL_OUT`, `NF_INET_POST_ROUTING`.
pub(crate) const HOOK_PREROUTING: u32 = 0;
pub(crate) const HOOK_OUTPUT: u32 = 3;
pub(crate) const HOOK_POSTROUTING: u32 = 4;
/// nft's `dstnat` priority (`NF_IP_PRI_NAT_DST`).
pub(crate) const PRIORITY_DSTNAT: i32 = -100;
/// The second 16-byte register (nft's "reg 2").
pub(crate) const REG_2: u32 = 2;
/// `NFT_META_L4PROTO`.
pub(crate) const META_L4PROTO: u32 = 16;
/// `NFT_PAYLOAD_TRANSPORT_HEADER`.
pub(crate) const BASE_TRANSPORT: u32 = 2;
/// `NFT_FIB_RESULT_ADDRTYPE` and `NFTA_FIB_F_DADDR`.
pub(crate) const FIB_RESULT_ADDRTYPE: u32 = 3;
pub(crate) const FIB_F_DADDR: u32 = 2;
/// `RTN_LOCAL`: what `fib daddr type` yields for a local address.
pub(crate) const RTN_LOCAL: u32 = 2;
/// `NFT_NAT_DNAT`.
pub(crate) const NAT_DNAT: u32 = 1;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`.
pub(crate) const NAT_F_PROTO_SPECIFIED: u32 = 2;
/// `NF_BR_PRE_ROUTING`.
pub(crate) const HOOK_BRIDGE_PREROUTING: u32 = 0;
/// nft's `srcnat` priority (`NF_IP_PRI_NAT_SRC`).
pub(crate) const PRIORITY_SRCNAT: i32 = 100;

/// nft's "register 1" (a 16-byte register).
pub(crate) const REG_1: u32 = 1;
/// The verdict register.
pub(crate) const REG_VERDICT: u32 = 0;
/// `NFT_META_NFPROTO`.
pub(crate) const META_NFPROTO: u32 = 15;
/// `NFT_META_IIFNAME`.
pub(crate) const META_IIFNAME: u32 = 6;
/// `NFT_META_PROTOCOL`: the frame's EtherType.
pub(crate) const META_PROTOCOL: u32 = 1;
/// nft's datatypes (`TYPE_*`) of set keys, so that `nft list` prints a set's type
/// and elements; a concatenation `a . b` is `a << 6 | b`.
pub(crate) const TYPE_IFNAME: u32 = 41;
pub(crate) const TYPE_ETHERADDR: u32 = 9;
pub(crate) const TYPE_IPADDR: u32 = 7;
pub(crate) const TYPE_IP6ADDR: u32 = 8;

/// `NFT_PAYLOAD_LL_HEADER`.
pub(crate) const BASE_LINK: u32 = 0;
/// `NFT_PAYLOAD_NETWORK_HEADER`.
pub(crate) const BASE_NETWORK: u32 = 1;
/// `NFT_CMP_EQ` and `NFT_CMP_NEQ`.
pub(crate) const CMP_EQ: u32 = 0;
pub(crate) const CMP_NEQ: u32 = 1;
/// `NFT_GOTO`, `NFT_JUMP`, `NFT_RETURN`.
pub(crate) const VERDICT_GOTO: i32 = -4;
pub(crate) const VERDICT_JUMP: i32 = -3;
pub(crate) const VERDICT_RETURN: i32 = -5;
/// `NF_DROP`.
pub(crate) const VERDICT_DROP: i32 = 0;
/// `NF_ACCEPT`, as a base chain policy.
pub(crate) const POLICY_ACCEPT: u32 = 1;

/// The value of an `immediate` expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Data {
    Value(Vec<u8>),
    Verdict { code: i32, chain: Option<String> },
}

/// One nf_tables expression, as far as the plugins need to tell them apart;
/// everything else decodes to [`Expr::Other`] with its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expr {
    Meta {
        key: u32,
        dreg: u32,
    },
    Cmp {
        sreg: u32,
        op: u32,
        data: Vec<u8>,
    },
    Payload {
        dreg: u32,
        base: u32,
        offset: u32,
        len: u32,
    },
    /// A boolean bitwise operation (`(reg & mask) ^ xor`).
    Bitwise {
        sreg: u32,
        dreg: u32,
        len: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    Immediate {
        dreg: u32,
        data: Data,
    },
    Masq {
        flags: u32,
    },
    /// `fib <flags> <result> => dreg` (e.g. `fib daddr type`).
    Fib {
        dreg: u32,
        result: u32,
        flags: u32,
    },
    /// `lookup`: whether the register's value is in `set` (`invert`: is not), or,
    /// with `dreg`, the map's data for it (a verdict map's `dreg` is the verdict
    /// register: `vmap`).
    Lookup {
        sreg: u32,
        dreg: Option<u32>,
        set: String,
        invert: bool,
    },
    /// `ct <key>` loaded into `dreg` (e.g. `ct state`, `ct direction`), of the
    /// packet's own direction.
    Ct {
        key: u32,
        dreg: u32,
    },
    /// `byteorder`: converts `len` bytes in `sreg`, as words of `size` bytes, to
    /// (`hton`) or from network order; nft puts one after `meta l4proto` in a
    /// concatenation.
    Byteorder {
        sreg: u32,
        dreg: u32,
        op: u32,
        len: u32,
        size: u32,
    },
    /// `snat`/`dnat` from an address register and a port register.
    Nat {
        nat_type: u32,
        family: u32,
        reg_addr: u32,
        reg_proto: u32,
        flags: u32,
    },
    /// `counter`: packets and bytes counted so far (both 0 when sent: nft sends none).
    Counter {
        packets: u64,
        bytes: u64,
    },
    /// `limit rate <rate>/<unit seconds> burst <burst> packets` (`NFT_LIMIT_PKTS`,
    /// not inverted).
    Limit {
        rate: u64,
        unit: u64,
        burst: u32,
    },
    /// `log prefix <prefix> group <group>`: to nflog group `group`.
    Log {
        prefix: String,
        group: u16,
    },
    Other(String),
}

/// A base chain's hook.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hook<'a> {
    pub(crate) chain_type: &'a str,
    pub(crate) hooknum: u32,
    pub(crate) priority: i32,
    /// `NF_ACCEPT`/`NF_DROP`; `None` leaves the kernel's default (accept).
    pub(crate) policy: Option<u32>,
}

/// A rule as dumped by the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) chain: String,
    pub(crate) handle: u64,
    /// The comment from the rule's user data (what `nft` prints after
    /// `comment`).
    pub(crate) comment: Option<String>,
    pub(crate) exprs: Vec<Expr>,
}

impl Rule {
    /// Target chain of the rule's `jump`/`goto`, if any.
    pub(crate) fn jump_target(&self) -> Option<&str> {
        self.exprs.iter().find_map(|e| match e {
            Expr::Immediate {
                dreg: REG_VERDICT,
                data:
                    Data::Verdict {
                        code: VERDICT_GOTO | VERDICT_JUMP,
                        chain: Some(chain),
                    },
            } => Some(chain.as_str()),
            _ => None,
        })
    }
}
