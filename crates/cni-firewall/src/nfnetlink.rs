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
//! Sets and maps of every kind (interval sets of concatenations, verdict maps,
//! elements in bulk) and their dumps are in the `sets` submodule.
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

mod sets;
pub(crate) use sets::{
    BYTEORDER_BIG_ENDIAN, ChainHook, Element, SetSpec, TYPE_INET_PROTO, TYPE_INET_SERVICE,
};

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

/// Builds nf_tables messages: `cni_netlink`'s framing, plus what nf_tables
/// expects of it: an `nfgenmsg` after each header, integers in network byte
/// order, and nests always flagged as such.
#[derive(Debug, Default)]
struct Writer {
    w: cni_netlink::Writer,
}

impl Writer {
    /// Starts a message; returns its offset for [`Writer::end_msg`].
    fn begin_msg(&mut self, ty: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> usize {
        let start = self.w.begin_msg(ty, flags, seq);
        self.w.bytes(&[family, 0]); // NFNETLINK_V0
        self.w.bytes(&res_id.to_be_bytes());
        start
    }

    fn end_msg(&mut self, start: usize) {
        self.w.end_msg(start);
    }

    fn attr(&mut self, ty: u16, value: &[u8]) {
        self.w.attr(ty, value);
    }

    fn attr_str(&mut self, ty: u16, value: &str) {
        self.w.attr_str(ty, value);
    }

    fn attr_u32(&mut self, ty: u16, value: u32) {
        self.w.attr_u32_be(ty, value);
    }

    fn nest_start(&mut self, ty: u16) -> usize {
        self.w.nest_start(ty | NLA_F_NESTED)
    }

    fn nest_end(&mut self, start: usize) {
        self.w.nest_end(start);
    }

    fn as_bytes(&self) -> &[u8] {
        self.w.as_bytes()
    }

    fn data_value(&mut self, ty: u16, value: &[u8]) {
        let nest = self.nest_start(ty);
        self.attr(NFTA_DATA_VALUE, value);
        self.nest_end(nest);
    }

    fn expr(&mut self, expr: &Expr) {
        let elem = self.nest_start(NFTA_LIST_ELEM);
        let name = match expr {
            Expr::Meta { .. } => "meta",
            Expr::Cmp { .. } => "cmp",
            Expr::Payload { .. } => "payload",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Immediate { .. } => "immediate",
            Expr::Masq { .. } => "masq",
            Expr::Fib { .. } => "fib",
            Expr::Nat { .. } => "nat",
            Expr::Lookup { .. } => "lookup",
            Expr::Ct { .. } => "ct",
            Expr::Byteorder { .. } => "byteorder",
            Expr::Other(name) => name,
        };
        self.attr_str(NFTA_EXPR_NAME, name);
        let data = self.nest_start(NFTA_EXPR_DATA);
        // Attribute numbers and order as libnftnl emits them.
        match expr {
            Expr::Meta { key, dreg } => {
                self.attr_u32(2, *key);
                self.attr_u32(1, *dreg);
            }
            Expr::Cmp { sreg, op, data } => {
                self.attr_u32(1, *sreg);
                self.attr_u32(2, *op);
                self.data_value(3, data);
            }
            Expr::Payload {
                dreg,
                base,
                offset,
                len,
            } => {
                self.attr_u32(1, *dreg);
                self.attr_u32(2, *base);
                self.attr_u32(3, *offset);
                self.attr_u32(4, *len);
            }
            Expr::Bitwise {
                sreg,
                dreg,
                len,
                mask,
                xor,
            } => {
                self.attr_u32(1, *sreg);
                self.attr_u32(2, *dreg);
                self.attr_u32(3, *len);
                self.data_value(4, mask);
                self.data_value(5, xor);
            }
            Expr::Immediate { dreg, data } => {
                self.attr_u32(1, *dreg);
                match data {
                    Data::Value(v) => self.data_value(2, v),
                    Data::Verdict { code, chain } => {
                        let outer = self.nest_start(2);
                        let verdict = self.nest_start(NFTA_DATA_VERDICT);
                        self.attr(NFTA_VERDICT_CODE, &code.to_be_bytes());
                        if let Some(chain) = chain {
                            self.attr_str(NFTA_VERDICT_CHAIN, chain);
                        }
                        self.nest_end(verdict);
                        self.nest_end(outer);
                    }
                }
            }
            Expr::Masq { flags } => {
                if *flags != 0 {
                    self.attr_u32(1, *flags);
                }
            }
            Expr::Fib {
                dreg,
                result,
                flags,
            } => {
                self.attr_u32(3, *flags);
                self.attr_u32(2, *result);
                self.attr_u32(1, *dreg);
            }
            Expr::Nat {
                nat_type,
                family,
                reg_addr,
                reg_proto,
                flags,
            } => {
                self.attr_u32(1, *nat_type);
                self.attr_u32(2, *family);
                self.attr_u32(3, *reg_addr);
                self.attr_u32(5, *reg_proto);
                self.attr_u32(7, *flags);
            }
            Expr::Lookup {
                sreg,
                dreg,
                set,
                invert,
            } => {
                self.attr_u32(2, *sreg);
                if let Some(dreg) = dreg {
                    self.attr_u32(3, *dreg);
                }
                self.attr_str(1, set);
                if *invert {
                    // NFT_LOOKUP_F_INV
                    self.attr_u32(5, 1);
                }
            }
            Expr::Ct { key, dreg } => {
                self.attr_u32(2, *key);
                self.attr_u32(1, *dreg);
            }
            Expr::Byteorder {
                sreg,
                dreg,
                op,
                len,
                size,
            } => {
                self.attr_u32(1, *sreg);
                self.attr_u32(2, *dreg);
                self.attr_u32(3, *op);
                self.attr_u32(4, *len);
                self.attr_u32(5, *size);
            }
            Expr::Other(_) => {}
        }
        self.nest_end(data);
        self.nest_end(elem);
    }
}

/// libnftnl's user data holding one comment: TLV (type, length, value) with
/// the NUL-terminated text.
fn udata_comment(comment: &str) -> Result<Vec<u8>> {
    let len = u8::try_from(comment.len() + 1).map_err(|_| Error::InvalidInput {
        what: "nftables comment",
        value: comment.into(),
        reason: "is longer than 254 bytes",
    })?;
    let mut out = vec![UDATA_COMMENT, len];
    out.extend_from_slice(comment.as_bytes());
    out.push(0);
    Ok(out)
}

/// The comment in libnftnl user data, if there is one.
fn parse_udata_comment(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while let [ty, len, tail @ ..] = rest {
        let value = tail.get(..usize::from(*len))?;
        if *ty == UDATA_COMMENT {
            let text = value.split(|b| *b == 0).next().unwrap_or_default();
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        rest = &tail[usize::from(*len)..];
    }
    None
}

/// One transaction: the messages between a batch begin and end.
#[derive(Debug)]
pub(crate) struct Batch {
    w: Writer,
    next_seq: u32,
    /// Sequence number and description (nft syntax) of each message.
    ops: Vec<(u32, String)>,
}

impl Batch {
    pub(crate) fn new() -> Batch {
        Self::begin_batch(None)
    }

    /// A transaction the kernel runs only if the rule set is still at
    /// `generation` (see [`Nfnl::generation_id`]); otherwise it fails as a
    /// whole with ERESTART ([`is_restart`]).
    pub(crate) fn at_generation(generation: u32) -> Batch {
        Self::begin_batch(Some(generation))
    }

    fn begin_batch(generation: Option<u32>) -> Batch {
        let mut batch = Batch {
            w: Writer::default(),
            next_seq: 1,
            ops: Vec::new(),
        };
        let start = batch.w.begin_msg(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            0,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        if let Some(generation) = generation {
            batch.w.attr_u32(NFNL_BATCH_GENID, generation);
        }
        batch.w.end_msg(start);
        batch
    }

    /// Number of changes in the batch.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ops.len()
    }

    fn begin(&mut self, ty: u16, flags: u16, family: u8, what: String) -> usize {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.ops.push((seq, what));
        self.w.begin_msg(
            (NFNL_SUBSYS_NFTABLES << 8) | ty,
            NLM_F_REQUEST | NLM_F_ACK | flags,
            seq,
            family,
            0,
        )
    }

    /// `add table` (no error if it exists).
    pub(crate) fn add_table(
        &mut self,
        family: u8,
        name: &str,
        comment: Option<&str>,
    ) -> Result<()> {
        let what = format!("add table {} {name}", family_name(family));
        let msg = self.begin(NFT_MSG_NEWTABLE, NLM_F_CREATE, family, what);
        self.w.attr_str(NFTA_TABLE_NAME, name);
        self.w.attr_u32(NFTA_TABLE_FLAGS, 0);
        if let Some(comment) = comment {
            self.w.attr(NFTA_TABLE_USERDATA, &udata_comment(comment)?);
        }
        self.w.end_msg(msg);
        Ok(())
    }

    /// `add chain` (no error if it exists with the same hook).
    pub(crate) fn add_chain(
        &mut self,
        family: u8,
        table: &str,
        name: &str,
        hook: Option<Hook<'_>>,
        comment: Option<&str>,
    ) -> Result<()> {
        let what = format!("add chain {} {table} {name}", family_name(family));
        let msg = self.begin(NFT_MSG_NEWCHAIN, NLM_F_CREATE, family, what);
        self.w.attr_str(NFTA_CHAIN_TABLE, table);
        self.w.attr_str(NFTA_CHAIN_NAME, name);
        if let Some(hook) = hook {
            self.w.attr_str(NFTA_CHAIN_TYPE, hook.chain_type);
            let nest = self.w.nest_start(NFTA_CHAIN_HOOK);
            self.w.attr_u32(NFTA_HOOK_HOOKNUM, hook.hooknum);
            self.w
                .attr(NFTA_HOOK_PRIORITY, &hook.priority.to_be_bytes());
            self.w.nest_end(nest);
            if let Some(policy) = hook.policy {
                self.w.attr_u32(NFTA_CHAIN_POLICY, policy);
            }
        }
        if let Some(comment) = comment {
            self.w.attr(NFTA_CHAIN_USERDATA, &udata_comment(comment)?);
        }
        self.w.end_msg(msg);
        Ok(())
    }

    /// `flush chain`: deletes all its rules.
    pub(crate) fn flush_chain(&mut self, family: u8, table: &str, chain: &str) {
        let what = format!("flush chain {} {table} {chain}", family_name(family));
        let msg = self.begin(NFT_MSG_DELRULE, 0, family, what);
        self.w.attr_str(NFTA_RULE_TABLE, table);
        self.w.attr_str(NFTA_RULE_CHAIN, chain);
        self.w.end_msg(msg);
    }

    /// `delete table` with everything in it.
    pub(crate) fn delete_table(&mut self, family: u8, name: &str) {
        let what = format!("delete table {} {name}", family_name(family));
        let msg = self.begin(NFT_MSG_DELTABLE, 0, family, what);
        self.w.attr_str(NFTA_TABLE_NAME, name);
        self.w.end_msg(msg);
    }

    /// `delete chain` (it must be empty and unreferenced).
    pub(crate) fn delete_chain(&mut self, family: u8, table: &str, chain: &str) {
        let what = format!("delete chain {} {table} {chain}", family_name(family));
        let msg = self.begin(NFT_MSG_DELCHAIN, 0, family, what);
        self.w.attr_str(NFTA_CHAIN_TABLE, table);
        self.w.attr_str(NFTA_CHAIN_NAME, chain);
        self.w.end_msg(msg);
    }

    /// The changes in nft syntax, in order (for tests).
    #[cfg(test)]
    pub(crate) fn describe(&self) -> Vec<&str> {
        self.ops.iter().map(|(_, what)| what.as_str()).collect()
    }

    /// `add rule` (appended at the end of the chain).
    pub(crate) fn add_rule(
        &mut self,
        family: u8,
        table: &str,
        chain: &str,
        exprs: &[Expr],
        comment: Option<&str>,
    ) -> Result<()> {
        let what = match comment {
            Some(c) => format!(
                "add rule {} {table} {chain} (comment \"{c}\")",
                family_name(family)
            ),
            None => format!("add rule {} {table} {chain}", family_name(family)),
        };
        let msg = self.begin(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, family, what);
        self.w.attr_str(NFTA_RULE_TABLE, table);
        self.w.attr_str(NFTA_RULE_CHAIN, chain);
        let list = self.w.nest_start(NFTA_RULE_EXPRESSIONS);
        for expr in exprs {
            self.w.expr(expr);
        }
        self.w.nest_end(list);
        if let Some(comment) = comment {
            self.w.attr(NFTA_RULE_USERDATA, &udata_comment(comment)?);
        }
        self.w.end_msg(msg);
        Ok(())
    }

    /// `delete rule ... handle N`.
    pub(crate) fn delete_rule(&mut self, family: u8, table: &str, chain: &str, handle: u64) {
        let what = format!(
            "delete rule {} {table} {chain} handle {handle}",
            family_name(family)
        );
        let msg = self.begin(NFT_MSG_DELRULE, 0, family, what);
        self.w.attr_str(NFTA_RULE_TABLE, table);
        self.w.attr_str(NFTA_RULE_CHAIN, chain);
        self.w.attr(NFTA_RULE_HANDLE, &handle.to_be_bytes());
        self.w.end_msg(msg);
    }

    /// The finished batch as sent to the kernel.
    fn finish(mut self) -> (Vec<u8>, Vec<(u32, String)>) {
        let seq = self.next_seq;
        let start = self.w.begin_msg(
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            seq,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        self.w.end_msg(start);
        (self.w.w.into_bytes(), self.ops)
    }
}

/// A set key for messages: its text up to the first NUL (interface names), or hex.
fn printable_key(key: &[u8]) -> String {
    let text = key.split(|b| *b == 0).next().unwrap_or_default();
    match std::str::from_utf8(text) {
        Ok(t) if !t.is_empty() && t.chars().all(|c| c.is_ascii_graphic()) => format!("\"{t}\""),
        _ => key.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// nft's name of a table family.
pub(crate) fn family_name(family: u8) -> &'static str {
    match family {
        NFPROTO_INET => "inet",
        NFPROTO_IPV4 => "ip",
        NFPROTO_IPV6 => "ip6",
        NFPROTO_BRIDGE => "bridge",
        _ => "unknown-family",
    }
}

/// What an errno means for an nf_tables request, for the operator.
fn explain(errno: i32) -> String {
    let os = io::Error::from_raw_os_error(errno);
    let hint = match errno {
        libc::ENOENT => "the table, chain or rule does not exist",
        libc::EEXIST => "it already exists",
        libc::EBUSY => "the object is in use",
        libc::EPERM => "operation not permitted (CAP_NET_ADMIN is needed)",
        libc::EOPNOTSUPP => {
            "not supported: an existing object may differ (e.g. a chain with another type or hook), or the kernel lacks the feature"
        }
        libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT => "nf_tables is not available in this kernel",
        libc::EINVAL => "the kernel rejected the request as invalid",
        libc::ENOBUFS | libc::ENOMEM => "the kernel ran out of memory",
        libc::ENOSPC => "too many objects",
        libc::ERANGE => "a value is out of range",
        _ => return os.to_string(),
    };
    format!("{hint} ({os})")
}

fn nl_error(target: impl Into<String>, detail: impl Into<String>) -> Error {
    Error::Netlink {
        target: target.into(),
        detail: detail.into(),
        errno: None,
    }
}

/// A refusal, with the kernel's own explanation after ours when it gave one.
fn kernel_error(target: impl Into<String>, errno: i32, message: Option<String>) -> Error {
    let detail = match message {
        Some(text) if !text.is_empty() => format!("{}: {text}", explain(errno)),
        _ => explain(errno),
    };
    Error::Netlink {
        target: target.into(),
        detail,
        errno: Some(errno),
    }
}

fn io_error(target: &str, e: &io::Error) -> Error {
    match e.raw_os_error() {
        Some(errno) => kernel_error(target, errno, None),
        None => nl_error(target, e.to_string()),
    }
}

fn netlink_error(target: &str, e: cni_netlink::Error) -> Error {
    match e {
        cni_netlink::Error::Kernel { errno, message } => kernel_error(target, errno, message),
        cni_netlink::Error::Io(e) => io_error(target, &e),
        cni_netlink::Error::Malformed(m) => nl_error(target, m.to_string()),
    }
}

/// Whether `e` is the kernel saying "no such table, chain or rule".
/// Whether a transaction pinned to a generation was refused because the rule
/// set moved on (see [`Batch::at_generation`]).
pub(crate) fn is_restart(e: &Error) -> bool {
    let restart = |e: &Error| {
        matches!(
            e,
            Error::Netlink {
                errno: Some(libc::ERESTART),
                ..
            }
        )
    };
    match e {
        Error::Multiple(all) => all.iter().any(restart),
        e => restart(e),
    }
}

pub(crate) fn is_not_found(e: &Error) -> bool {
    matches!(
        e,
        Error::Netlink {
            errno: Some(libc::ENOENT),
            ..
        }
    )
}

/// Attributes of a netlink attribute stream, as (type without flags, value);
/// malformed framing ends the list (the decoders below treat what is missing
/// as absent).
fn attrs(data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    cni_netlink::attrs(data).map_while(std::result::Result::ok)
}

fn attr(data: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(data).find_map(|(t, v)| (t == ty).then_some(v))
}

fn be_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

fn attr_u32(data: &[u8], ty: u16) -> Option<u32> {
    be_u32(attr(data, ty)?)
}

fn data_value(data: &[u8], ty: u16) -> Option<Vec<u8>> {
    attr(attr(data, ty)?, NFTA_DATA_VALUE).map(<[u8]>::to_vec)
}

/// Decodes one `NFTA_LIST_ELEM` of a rule's expressions.
fn parse_expr(elem: &[u8]) -> Expr {
    let name = attr(elem, NFTA_EXPR_NAME).map(c_string).unwrap_or_default();
    let d = attr(elem, NFTA_EXPR_DATA).unwrap_or_default();
    let decoded = match name.as_str() {
        "meta" => (|| {
            Some(Expr::Meta {
                key: attr_u32(d, 2)?,
                dreg: attr_u32(d, 1)?,
            })
        })(),
        "cmp" => (|| {
            Some(Expr::Cmp {
                sreg: attr_u32(d, 1)?,
                op: attr_u32(d, 2)?,
                data: data_value(d, 3)?,
            })
        })(),
        "payload" => (|| {
            Some(Expr::Payload {
                dreg: attr_u32(d, 1)?,
                base: attr_u32(d, 2)?,
                offset: attr_u32(d, 3)?,
                len: attr_u32(d, 4)?,
            })
        })(),
        // Newer kernels also report the operation (6); only the boolean
        // one (0) is the mask-and-xor form.
        "bitwise" if attr_u32(d, 6).unwrap_or(0) == 0 => (|| {
            Some(Expr::Bitwise {
                sreg: attr_u32(d, 1)?,
                dreg: attr_u32(d, 2)?,
                len: attr_u32(d, 3)?,
                mask: data_value(d, 4)?,
                xor: data_value(d, 5)?,
            })
        })(),
        "immediate" => (|| {
            let dreg = attr_u32(d, 1)?;
            let value = attr(d, 2)?;
            let data = if let Some(verdict) = attr(value, NFTA_DATA_VERDICT) {
                Data::Verdict {
                    code: be_u32(attr(verdict, NFTA_VERDICT_CODE)?)? as i32,
                    chain: attr(verdict, NFTA_VERDICT_CHAIN).map(c_string),
                }
            } else {
                Data::Value(attr(value, NFTA_DATA_VALUE)?.to_vec())
            };
            Some(Expr::Immediate { dreg, data })
        })(),
        "masq" if attr(d, 2).is_none() => Some(Expr::Masq {
            flags: attr_u32(d, 1).unwrap_or(0),
        }),
        "lookup" => (|| {
            Some(Expr::Lookup {
                sreg: attr_u32(d, 2)?,
                dreg: attr_u32(d, 3),
                set: attr(d, 1).map(c_string)?,
                invert: attr_u32(d, 5).unwrap_or(0) & 1 != 0,
            })
        })(),
        // Only the load form of the packet's own direction (no source register,
        // no direction).
        "ct" if attr(d, 3).is_none() && attr(d, 4).is_none() => (|| {
            Some(Expr::Ct {
                key: attr_u32(d, 2)?,
                dreg: attr_u32(d, 1)?,
            })
        })(),
        "byteorder" => (|| {
            Some(Expr::Byteorder {
                sreg: attr_u32(d, 1)?,
                dreg: attr_u32(d, 2)?,
                op: attr_u32(d, 3)?,
                len: attr_u32(d, 4)?,
                size: attr_u32(d, 5)?,
            })
        })(),
        "fib" => (|| {
            Some(Expr::Fib {
                dreg: attr_u32(d, 1)?,
                result: attr_u32(d, 2)?,
                flags: attr_u32(d, 3)?,
            })
        })(),
        // Only the single-address, single-port form we write (the kernel
        // reports the max registers equal to the min ones then).
        "nat" => (|| {
            let reg_addr = attr_u32(d, 3)?;
            let reg_proto = attr_u32(d, 5)?;
            let single = attr_u32(d, 4).is_none_or(|r| r == reg_addr)
                && attr_u32(d, 6).is_none_or(|r| r == reg_proto);
            single.then_some(())?;
            Some(Expr::Nat {
                nat_type: attr_u32(d, 1)?,
                family: attr_u32(d, 2)?,
                reg_addr,
                reg_proto,
                // The kernel adds NF_NAT_RANGE_MAP_IPS (1) itself when an
                // address register is given; what was asked for is the rest.
                flags: attr_u32(d, 7).unwrap_or(0) & !1,
            })
        })(),
        _ => None,
    };
    decoded.unwrap_or(Expr::Other(name))
}

/// Decodes a `NFT_MSG_NEWRULE` message of a dump (payload after the netlink
/// header).
#[cfg(test)]
fn parse_rule(payload: &[u8]) -> Option<Rule> {
    parse_rule_of(payload, &|_| true)
}

/// [`parse_rule`], decoding the expressions only of rules in chains `decode` names
/// (the others get none: a caller that needs only their handles and comments does
/// not pay for them).
fn parse_rule_of(payload: &[u8], decode: &dyn Fn(&str) -> bool) -> Option<Rule> {
    let body = payload.get(NFGENMSG_LEN..)?;
    let handle = attr(body, NFTA_RULE_HANDLE)?;
    let chain = c_string(attr(body, NFTA_RULE_CHAIN)?);
    let exprs = if decode(&chain) {
        attr(body, NFTA_RULE_EXPRESSIONS)
            .map(|list| {
                attrs(list)
                    .filter(|(t, _)| *t == NFTA_LIST_ELEM)
                    .map(|(_, e)| parse_expr(e))
                    .collect()
            })
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    Some(Rule {
        chain,
        handle: u64::from_be_bytes(handle.get(..8)?.try_into().ok()?),
        comment: attr(body, NFTA_RULE_USERDATA).and_then(parse_udata_comment),
        exprs,
    })
}

/// Decodes one message of an nf_tables rule dump as [`Nfnl::rules`] does
/// (`payload`: after the netlink header), returning the rule as text (`None`:
/// a malformed rule), so that the decoder can be driven with arbitrary bytes
/// from outside the crate (the fuzz targets in `tests/fuzz`). With
/// `all_chains` false only rules of chain `c` get their expressions decoded, as
/// [`Nfnl::rules_decoding`] does for the chains it is not asked about.
#[doc(hidden)]
pub fn decode_dumped_rule(payload: &[u8], all_chains: bool) -> Option<String> {
    let rule = parse_rule_of(payload, &|chain| all_chains || chain == "c")?;
    Some(format!("{rule:?} jump {:?}", rule.jump_target()))
}

/// Decodes one message of an nf_tables set-element dump as [`Nfnl::elements`]
/// does, for the fuzz targets (see [`decode_dumped_rule`]): the elements as text.
#[doc(hidden)]
pub fn decode_dumped_set_elements(payload: &[u8]) -> Vec<String> {
    sets::parse_elements(payload)
        .iter()
        .map(|e| format!("{e:?}"))
        .collect()
}

/// A `NETLINK_NETFILTER` socket in the calling thread's network namespace.
#[derive(Debug)]
pub(crate) struct Nfnl {
    /// Always `Some` until dropped.
    sock: Option<Socket>,
}

/// Closing a netfilter socket can block for an RCU grace period (several
/// ms): on `NETLINK_URELEASE` nf_tables flushes the deferred destruction of
/// what recent transactions removed (ours or anyone's), which waits for
/// `synchronize_rcu()`. Every answer has been read by then, so the close is
/// handed to a short-lived thread and the caller goes on with its other
/// work; a process that exits right away still waits for it in `exit`, as it
/// would have in `close`.
///
/// While a [`SocketsKept`] guard exists the socket is kept open instead, and
/// closed when the guard goes: the caller picks a moment when that wait is
/// over, or at least holds nothing up.
impl Drop for Nfnl {
    fn drop(&mut self) {
        let Some(sock) = self.sock.take() else {
            return;
        };
        let sock = match KEPT.lock() {
            Ok(mut kept) if kept.guards > 0 => {
                kept.sockets.push(sock);
                return;
            }
            _ => sock,
        };
        // If no thread can be started, the closure (and the socket with
        // it) is dropped here, closing synchronously.
        let _ = std::thread::Builder::new()
            .name("nfnl-close".into())
            .spawn(move || drop(sock));
    }
}

/// Sockets whose close is put off while guards exist (see [`keep_sockets`]).
#[derive(Debug, Default)]
struct Kept {
    guards: usize,
    sockets: Vec<Socket>,
}

static KEPT: std::sync::Mutex<Kept> = std::sync::Mutex::new(Kept {
    guards: 0,
    sockets: Vec::new(),
});

/// Keeps every netfilter socket the process is done with open until the
/// returned guard is dropped.
///
/// Why: releasing the socket waits while the kernel finishes freeing a recent
/// transaction (an RCU grace period), and measured, a release during the
/// deletion of a network device in that netns delays the deletion by that
/// wait (we believe both take the netns's nf_tables commit mutex): a DEL
/// that removed rules took 8.5 ms longer. Closing after the deletion, when
/// the freeing is long done, costs nothing.
pub fn keep_sockets() -> SocketsKept {
    if let Ok(mut kept) = KEPT.lock() {
        kept.guards += 1;
    }
    SocketsKept(())
}

/// See [`keep_sockets`]; the last guard to go closes the kept sockets.
#[derive(Debug)]
pub struct SocketsKept(());

impl Drop for SocketsKept {
    fn drop(&mut self) {
        let sockets = match KEPT.lock() {
            Ok(mut kept) => {
                kept.guards = kept.guards.saturating_sub(1);
                if kept.guards > 0 {
                    return;
                }
                std::mem::take(&mut kept.sockets)
            }
            Err(_) => return,
        };
        drop(sockets);
    }
}

impl Nfnl {
    /// Opens the socket (in the calling thread's network namespace).
    pub(crate) fn open() -> Result<Nfnl> {
        let sock = Socket::open(NETLINK_NETFILTER)
            .map_err(|e| io_error("netlink socket (NETLINK_NETFILTER)", &e))?;
        Ok(Nfnl { sock: Some(sock) })
    }

    fn socket(&mut self, target: &str) -> Result<&mut Socket> {
        self.sock
            .as_mut()
            .ok_or_else(|| nl_error(target, "the netlink socket is closed"))
    }

    /// Runs `batch` as one kernel transaction: all of it or nothing. Every
    /// refused message is reported, named in nft syntax.
    pub(crate) fn commit(&mut self, batch: Batch, target: &str) -> Result<()> {
        let sock = self.socket(target)?;
        let base = sock.last_seq();
        let (mut bytes, ops) = batch.finish();
        // A large transaction asks for the acknowledgement of its last change only:
        // the kernel answers every change that asks with a datagram of its own, which
        // would overflow the receive buffer. Refusals are sent whatever the flags, and
        // the kernel queues every answer of a batch once it has processed all of it,
        // so the last change's acknowledgement still says the whole batch went in.
        let sparse = ops.len() > ACK_EACH_UP_TO;
        // Renumber into this socket's sequence space so a reply from an
        // earlier request can never be mistaken for one of these.
        let mut offset = 0;
        let mut last = base;
        while offset + NLMSG_HDRLEN <= bytes.len() {
            let len = u32::from_ne_bytes(bytes[offset..offset + 4].try_into().unwrap_or_default())
                as usize;
            let seq = u32::from_ne_bytes(
                bytes[offset + 8..offset + 12]
                    .try_into()
                    .unwrap_or_default(),
            );
            if sparse && seq >= 1 && (seq as usize) < ops.len() {
                let flags = u16::from_ne_bytes([bytes[offset + 6], bytes[offset + 7]]) & !NLM_F_ACK;
                bytes[offset + 6..offset + 8].copy_from_slice(&flags.to_ne_bytes());
            }
            last = base.wrapping_add(seq);
            bytes[offset + 8..offset + 12].copy_from_slice(&last.to_ne_bytes());
            offset += len.max(NLMSG_HDRLEN).next_multiple_of(4);
        }
        sock.set_last_seq(last);
        // Room for the whole transaction in one datagram, and for the refusals of a
        // large one (small ones fit the default buffers, and save the system calls).
        if sparse || bytes.len() > SMALL_BATCH_BYTES {
            sock.reserve_buffers(bytes.len(), 1 << 20);
        }
        sock.send(&bytes).map_err(|e| netlink_error(target, e))?;

        let mut acked = vec![sparse; ops.len()];
        if let Some(last) = acked.last_mut() {
            *last = false;
        }
        let mut errors = Vec::new();
        while let Some(datagram) = sock.recv(true).map_err(|e| netlink_error(target, e))? {
            for msg in messages(datagram) {
                let msg = msg.map_err(|e| nl_error(target, e.to_string()))?;
                if msg.ty != NLMSG_ERROR {
                    continue;
                }
                let code = msg.error_code().unwrap_or(libc::EINVAL);
                let index = msg.seq.wrapping_sub(base).wrapping_sub(1) as usize;
                let refusal = |what: String| kernel_error(what, code, msg.ext_ack_message());
                match ops.get(index) {
                    Some(_) if code == 0 => acked[index] = true,
                    Some((_, what)) => {
                        acked[index] = true;
                        errors.push(refusal(what.clone()));
                    }
                    // The batch framing itself (begin/end) or the commit.
                    None if code != 0 => {
                        errors.push(refusal(format!("{target} (transaction)")));
                    }
                    None => {}
                }
            }
        }
        if errors.is_empty() && acked.iter().any(|a| !a) {
            errors.push(nl_error(
                target,
                "the kernel did not acknowledge every change of the transaction",
            ));
        }
        Error::collect(errors)
    }

    /// Sends a one-message request and returns the answers of a dump (or
    /// the single reply of a get), failing on a kernel error.
    fn request(
        &mut self,
        ty: u16,
        flags: u16,
        family: u8,
        attrs: impl FnOnce(&mut Writer),
        target: &str,
    ) -> Result<Vec<(u16, u16, Vec<u8>)>> {
        let sock = self.socket(target)?;
        let mut w = Writer::default();
        let msg = w.begin_msg(
            (NFNL_SUBSYS_NFTABLES << 8) | ty,
            NLM_F_REQUEST | flags,
            sock.next_seq(),
            family,
            0,
        );
        attrs(&mut w);
        w.end_msg(msg);
        let mut out = Vec::new();
        sock.request(w.as_bytes(), |msg| {
            out.push((msg.ty, msg.flags, msg.payload.to_vec()));
        })
        .map_err(|e| netlink_error(target, e))?;
        Ok(out)
    }

    /// Runs a dump request of type `ty` and returns the payloads of its `answer`
    /// messages. A dump that overlaps a change is flagged as interrupted, and read
    /// again.
    fn dump(
        &mut self,
        ty: u16,
        answer: u16,
        family: u8,
        attrs: impl Fn(&mut Writer),
        target: &str,
    ) -> Result<Vec<Vec<u8>>> {
        for _ in 0..10 {
            let answers = self.request(ty, NLM_F_DUMP, family, &attrs, target)?;
            if answers
                .iter()
                .any(|(_, flags, _)| flags & NLM_F_DUMP_INTR != 0)
            {
                continue;
            }
            return Ok(answers
                .into_iter()
                .filter(|(t, _, _)| *t == (NFNL_SUBSYS_NFTABLES << 8) | answer)
                .map(|(_, _, payload)| payload)
                .collect());
        }
        Err(nl_error(
            target,
            "the rule set kept changing during the dump",
        ))
    }

    /// All rules of `table` (of one chain if given), in chain order.
    pub(crate) fn rules(
        &mut self,
        family: u8,
        table: &str,
        chain: Option<&str>,
    ) -> Result<Vec<Rule>> {
        self.rules_decoding(family, table, chain, &|_| true)
    }

    /// [`Nfnl::rules`], with the expressions decoded only for the chains `decode`
    /// names.
    pub(crate) fn rules_decoding(
        &mut self,
        family: u8,
        table: &str,
        chain: Option<&str>,
        decode: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Rule>> {
        let target = match chain {
            Some(c) => format!("list chain {} {table} {c}", family_name(family)),
            None => format!("list table {} {table}", family_name(family)),
        };
        self.dump(
            NFT_MSG_GETRULE,
            NFT_MSG_NEWRULE,
            family,
            |w| {
                w.attr_str(NFTA_RULE_TABLE, table);
                if let Some(chain) = chain {
                    w.attr_str(NFTA_RULE_CHAIN, chain);
                }
            },
            &target,
        )?
        .iter()
        .map(|payload| {
            parse_rule_of(payload, decode)
                .ok_or_else(|| nl_error(&target, "malformed rule in dump"))
        })
        .collect()
    }

    /// Whether table `table` exists.
    pub(crate) fn has_table(&mut self, family: u8, table: &str) -> Result<bool> {
        let target = format!("table {} {table}", family_name(family));
        absent_is_false(self.request(
            NFT_MSG_GETTABLE,
            0,
            family,
            |w| w.attr_str(NFTA_TABLE_NAME, table),
            &target,
        ))
    }

    /// Whether chain `chain` exists in table `table`.
    pub(crate) fn has_chain(&mut self, family: u8, table: &str, chain: &str) -> Result<bool> {
        let target = format!("chain {} {table} {chain}", family_name(family));
        absent_is_false(self.request(
            NFT_MSG_GETCHAIN,
            0,
            family,
            |w| {
                w.attr_str(NFTA_CHAIN_TABLE, table);
                w.attr_str(NFTA_CHAIN_NAME, chain);
            },
            &target,
        ))
    }

    /// Names of the chains of `table` (empty when the table does not exist).
    pub(crate) fn chain_names(&mut self, family: u8, table: &str) -> Result<Vec<String>> {
        let target = format!("list chains {} {table}", family_name(family));
        Ok(self
            .dump(NFT_MSG_GETCHAIN, NFT_MSG_NEWCHAIN, family, |_| {}, &target)?
            .iter()
            .filter_map(|payload| {
                let body = payload.get(NFGENMSG_LEN..)?;
                let in_table = attr(body, NFTA_CHAIN_TABLE).map(c_string)? == table;
                in_table.then(|| attr(body, NFTA_CHAIN_NAME).map(c_string))?
            })
            .collect())
    }

    /// Whether set `set` has an element with key `key` (false when the set is missing).
    pub(crate) fn has_element(
        &mut self,
        family: u8,
        table: &str,
        set: &str,
        key: &[u8],
    ) -> Result<bool> {
        let target = format!(
            "get element {} {table} {set} {{ {} }}",
            family_name(family),
            printable_key(key)
        );
        absent_is_false(self.request(
            NFT_MSG_GETSETELEM,
            0,
            family,
            |w| {
                w.attr_str(NFTA_SET_ELEM_LIST_TABLE, table);
                w.attr_str(NFTA_SET_ELEM_LIST_SET, set);
                let list = w.nest_start(NFTA_SET_ELEM_LIST_ELEMENTS);
                let elem = w.nest_start(NFTA_LIST_ELEM);
                w.data_value(NFTA_SET_ELEM_KEY, key);
                w.nest_end(elem);
                w.nest_end(list);
            },
            &target,
        ))
    }

    /// Asks for the rule set generation: succeeds when nf_tables is
    /// available and we may use it.
    pub(crate) fn generation(&mut self) -> Result<()> {
        self.generation_id().map(drop)
    }

    /// The rule set's generation, which every committed change moves on.
    pub(crate) fn generation_id(&mut self) -> Result<u32> {
        let target = "nf_tables generation";
        self.request(NFT_MSG_GETGEN, 0, 0, |_| {}, target)?
            .iter()
            .find_map(|(_, _, payload)| attr_u32(payload.get(NFGENMSG_LEN..)?, NFTA_GEN_ID))
            .ok_or_else(|| nl_error(target, "no generation in the answer"))
    }
}

fn absent_is_false(answer: Result<Vec<(u16, u16, Vec<u8>)>>) -> Result<bool> {
    match answer {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether nf_tables works here: the socket opens and the kernel answers.
pub(crate) fn usable() -> bool {
    Nfnl::open().and_then(|mut nl| nl.generation()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_are_kept_until_the_last_guard_goes() {
        let kept = || KEPT.lock().map(|k| k.sockets.len()).unwrap_or(usize::MAX);
        let outer = keep_sockets();
        let inner = keep_sockets();
        let nl = Nfnl::open().expect("a NETLINK_NETFILTER socket");
        let before = kept();
        drop(nl);
        // Other tests of this process may park sockets meanwhile: at least ours.
        assert!(kept() > before);
        drop(inner);
        assert!(kept() > before, "another guard is still alive");
        drop(outer);
        assert_eq!(kept(), 0);
    }

    #[test]
    fn udata_comment_round_trips() {
        let u = udata_comment("abc").unwrap();
        assert_eq!(u, vec![0, 4, b'a', b'b', b'c', 0]);
        assert_eq!(parse_udata_comment(&u).as_deref(), Some("abc"));
        // Another TLV first, as a newer nft might add.
        let mut two = vec![1, 2, 9, 9];
        two.extend_from_slice(&u);
        assert_eq!(parse_udata_comment(&two).as_deref(), Some("abc"));
        assert_eq!(parse_udata_comment(&[0, 9, b'x']), None);
        assert_eq!(parse_udata_comment(&[]), None);
        assert!(udata_comment(&"x".repeat(255)).is_err());
    }

    #[test]
    fn batch_frames_messages() {
        let mut b = Batch::new();
        b.add_table(NFPROTO_INET, "t", None).unwrap();
        b.delete_rule(NFPROTO_INET, "t", "c", 7);
        assert_eq!(b.len(), 2);
        let (bytes, ops) = b.finish();
        let msgs: Vec<_> = messages(&bytes).map(|m| m.unwrap()).collect();
        let types: Vec<u16> = msgs.iter().map(|m| m.ty).collect();
        assert_eq!(types, vec![0x10, 0x0a00, 0x0a08, 0x11]);
        // Batch begin: family unspec, res_id nftables in network order.
        assert_eq!(msgs[0].payload, &[0, 0, 0, 10]);
        assert_eq!(msgs[1].flags, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE);
        assert_eq!(
            ops.iter().map(|(_, w)| w.as_str()).collect::<Vec<_>>(),
            vec!["add table inet t", "delete rule inet t c handle 7"]
        );
        let handle = attr(&msgs[2].payload[4..], NFTA_RULE_HANDLE).unwrap();
        assert_eq!(handle, 7u64.to_be_bytes());
    }

    #[test]
    fn expressions_round_trip_through_the_wire_format() {
        let exprs = vec![
            Expr::Meta {
                key: META_NFPROTO,
                dreg: REG_1,
            },
            Expr::Cmp {
                sreg: REG_1,
                op: CMP_EQ,
                data: vec![2],
            },
            Expr::Payload {
                dreg: REG_1,
                base: BASE_NETWORK,
                offset: 16,
                len: 4,
            },
            Expr::Bitwise {
                sreg: REG_1,
                dreg: REG_1,
                len: 4,
                mask: vec![0xf0, 0, 0, 0],
                xor: vec![0; 4],
            },
            Expr::Immediate {
                dreg: REG_VERDICT,
                data: Data::Verdict {
                    code: VERDICT_GOTO,
                    chain: Some("masq_checks".into()),
                },
            },
            Expr::Masq { flags: 0 },
            Expr::Ct {
                key: 0,
                dreg: REG_1,
            },
            Expr::Byteorder {
                sreg: 9,
                dreg: 9,
                op: 1,
                len: 1,
                size: 2,
            },
        ];
        let mut b = Batch::new();
        b.add_rule(NFPROTO_INET, "t", "c", &exprs, Some("hi"))
            .unwrap();
        let (bytes, _) = b.finish();
        let msg = messages(&bytes).nth(1).unwrap().unwrap();
        // A dump carries the handle too; add one to reuse the parser.
        let mut payload = msg.payload.to_vec();
        let mut w = Writer::default();
        w.attr(NFTA_RULE_HANDLE, &5u64.to_be_bytes());
        payload.extend_from_slice(w.as_bytes());
        let rule = parse_rule(&payload).unwrap();
        assert_eq!(rule.exprs, exprs);
        assert_eq!(rule.comment.as_deref(), Some("hi"));
        assert_eq!(rule.chain, "c");
        assert_eq!(rule.handle, 5);
        assert_eq!(rule.jump_target(), Some("masq_checks"));
    }

    /// Random bytes, and random bytes inside well-formed framing, through
    /// every decoder: no panic, no endless loop.
    #[test]
    fn random_input_is_survived() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..3000 {
            let len = (next() % 160) as usize;
            let junk: Vec<u8> = (0..len).map(|_| (next() % 7) as u8 * 0x11).collect();
            let _ = messages(&junk).count();
            let _ = parse_rule(&junk);
            let _ = parse_expr(&junk);
            let _ = parse_udata_comment(&junk);
            // Junk as the expressions of an otherwise valid rule.
            let mut w = Writer::default();
            w.attr_str(NFTA_RULE_CHAIN, "c");
            w.attr(NFTA_RULE_HANDLE, &1u64.to_be_bytes());
            w.attr(NFTA_RULE_EXPRESSIONS, &junk);
            w.attr(NFTA_RULE_USERDATA, &junk);
            let mut payload = vec![1, 0, 0, 0];
            payload.extend_from_slice(w.as_bytes());
            assert!(parse_rule(&payload).is_some());
        }
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..64 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
            let _ = messages(&junk).count();
            let _ = parse_rule(&junk);
            let _ = parse_expr(&junk);
            let _ = parse_udata_comment(&junk);
        }
        assert!(messages(&[20, 0, 0, 0, 1]).next().unwrap().is_err());
        // Attributes claiming a length shorter than their header end the
        // walk instead of looping on the spot.
        assert_eq!(attrs(&[0, 0, 1, 0, 9, 9, 9, 9]).count(), 0);
        assert_eq!(attr(&[2, 0, 1, 0], 5), None);
        assert_eq!(
            parse_expr(&[0, 0, 1, 0, 0, 0, 2, 0]),
            Expr::Other(String::new())
        );
    }

    /// A set-element dump as the kernel sent it (captured by `tests/fuzz/capture-seeds.sh`
    /// from a port-security set of two elements).
    #[test]
    fn a_real_set_element_dump_decodes() {
        let datagram = include_bytes!("../../../tests/fuzz/seeds/nftables/set-element-dump");
        let elements: Vec<Element> = messages(datagram)
            .map_while(std::result::Result::ok)
            .flat_map(|m| sets::parse_elements(m.payload))
            .collect();
        assert_eq!(elements.len(), 2, "{elements:?}");
        for e in &elements {
            assert_eq!(e.key.len(), 32);
            assert!(e.key.starts_with(b"vethA\0"));
            assert_eq!(
                e.comment.as_deref(),
                Some("156492b196ad91ce0e8bd807 ctrA eth0")
            );
        }
    }

    #[test]
    fn errnos_are_explained() {
        assert!(explain(libc::ENOENT).starts_with("the table, chain or rule does not exist"));
        assert!(explain(libc::EPERM).contains("CAP_NET_ADMIN"));
    }
}
