//! Sets and maps beyond the plain hash sets of [`Batch::add_set`]: interval sets of
//! concatenated ranges (the kernel's `pipapo` backend), verdict maps, elements with
//! a range end or a verdict, many elements in one message, the removal of a set,
//! and the dumps that read all of that back (with the chains' hooks).
//!
//! Sets are laid out as `nft` 1.0.6 lays them out (flags, key and data types, the
//! field lengths of a concatenation, the user data it records), so that
//! `nft list` prints them as if `nft` had made them.

use super::{
    Batch, NFGENMSG_LEN, NFT_MSG_DELSETELEM, NFT_MSG_GETCHAIN, NFT_MSG_GETSETELEM,
    NFT_MSG_NEWCHAIN, NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM, NFTA_CHAIN_HOOK, NFTA_CHAIN_NAME,
    NFTA_CHAIN_POLICY, NFTA_CHAIN_TABLE, NFTA_CHAIN_TYPE, NFTA_DATA_VALUE, NFTA_DATA_VERDICT,
    NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY, NFTA_LIST_ELEM, NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_LIST_ELEMENTS, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_TABLE,
    NFTA_SET_ELEM_USERDATA, NFTA_SET_FLAGS, NFTA_SET_ID, NFTA_SET_KEY_LEN, NFTA_SET_KEY_TYPE,
    NFTA_SET_NAME, NFTA_SET_TABLE, NFTA_SET_USERDATA, NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE, Nfnl,
    attr, attr_u32, attrs, be_u32, c_string, family_name, parse_udata_comment, udata_comment,
};
use crate::error::Result;

const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_DELSET: u16 = 11;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_DATA_LEN: u16 = 7;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_DESC_CONCAT: u16 = 2;
const NFTA_SET_FIELD_LEN: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_KEY_END: u16 = 10;

/// `NFT_SET_INTERVAL`: elements are ranges.
pub(crate) const SET_INTERVAL: u32 = 0x4;
/// `NFT_SET_MAP`: elements carry data.
pub(crate) const SET_MAP: u32 = 0x8;
/// `NFT_SET_CONCAT`: the key is a concatenation (with [`SET_INTERVAL`]: ranges of each
/// field, the `pipapo` backend).
pub(crate) const SET_CONCAT: u32 = 0x80;
/// `NFT_DATA_VERDICT`: a map's data are verdicts (`vmap`).
pub(crate) const DATA_VERDICT: u32 = 0xffff_ff00;
/// nft's datatypes `inet_proto` and `inet_service` (see `TYPE_IPADDR`).
pub(crate) const TYPE_INET_PROTO: u32 = 12;
pub(crate) const TYPE_INET_SERVICE: u32 = 13;

/// libnftnl's set user-data TLVs (`NFTNL_UDATA_SET_*`) that nft writes.
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const UDATA_SET_DATABYTEORDER: u8 = 1;
const UDATA_SET_KEY_TYPEOF: u8 = 3;
const UDATA_SET_DATA_INTERVAL: u8 = 6;
/// nft's `BYTEORDER_BIG_ENDIAN`, the byte order of address keys.
pub(crate) const BYTEORDER_BIG_ENDIAN: u32 = 2;
/// nft's expression type of a concatenation (`EXPR_CONCAT`), which nft 1.0.6 records
/// as the "typeof" of a concatenated key, with no field information.
const EXPR_CONCAT: u32 = 13;

/// The room for the elements of one message: the kernel reads them from one
/// attribute, whose length is 16 bits; more elements go into further messages of
/// the same transaction.
const ELEMENTS_PER_MESSAGE_BYTES: usize = 48 * 1024;

/// A set or map to create.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetSpec<'a> {
    pub(crate) name: &'a str,
    /// nft's datatype of the key (a concatenation `a . b` is `a << 6 | b`).
    pub(crate) key_type: u32,
    /// The key's length in bytes, each field of a concatenation padded to 4 bytes.
    pub(crate) key_len: u32,
    /// The length in bytes of each field of a concatenation (before padding);
    /// empty for a key of one field.
    pub(crate) fields: &'a [u32],
    /// Elements are ranges ([`SET_INTERVAL`]).
    pub(crate) interval: bool,
    /// A verdict map (`type <key> : verdict`).
    pub(crate) verdict_map: bool,
    /// The key's byte order as nft records it ([`BYTEORDER_BIG_ENDIAN`] for
    /// addresses, 0 for a concatenation), for `nft list` to print the elements.
    pub(crate) key_byteorder: u32,
}

impl SetSpec<'_> {
    /// The set's flags, as nft sets them.
    pub(crate) fn flags(&self) -> u32 {
        let mut flags = 0;
        if self.interval {
            flags |= SET_INTERVAL;
        }
        if !self.fields.is_empty() && self.interval {
            flags |= SET_CONCAT;
        }
        if self.verdict_map {
            flags |= SET_MAP;
        }
        flags
    }
}

/// A set as dumped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SetInfo {
    pub(crate) name: String,
    pub(crate) flags: u32,
    pub(crate) key_type: u32,
    pub(crate) key_len: u32,
    /// A map's data type ([`DATA_VERDICT`] for a verdict map).
    pub(crate) data_type: Option<u32>,
    /// The field lengths of a concatenation, as the set was given them.
    pub(crate) fields: Vec<u32>,
}

impl SetInfo {
    /// Whether the set is what `spec` would create.
    pub(crate) fn matches(&self, spec: &SetSpec<'_>) -> bool {
        self.flags == spec.flags()
            && self.key_type == spec.key_type
            && self.key_len == spec.key_len
            && self.data_type == spec.verdict_map.then_some(DATA_VERDICT)
            && (spec.fields.is_empty() || self.fields == spec.fields)
    }
}

/// A base chain's hook as dumped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChainHook {
    pub(crate) chain_type: String,
    pub(crate) hooknum: u32,
    pub(crate) priority: i32,
    pub(crate) policy: Option<u32>,
}

/// A chain as dumped: its name, and its hook if it is a base chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChainInfo {
    pub(crate) name: String,
    pub(crate) hook: Option<ChainHook>,
}

/// A set element: its key, the end of its range (interval sets of concatenations
/// give both ends of every field's range), a verdict map's verdict (code, and the
/// chain of a `jump`/`goto`), and its comment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Element {
    pub(crate) key: Vec<u8>,
    pub(crate) key_end: Option<Vec<u8>>,
    pub(crate) verdict: Option<(i32, Option<String>)>,
    pub(crate) comment: Option<String>,
}

/// nft's user data of a set: the key's byte order, a map's data byte order and
/// interval flag, and what it records of a concatenated key.
fn set_udata(spec: &SetSpec<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut put_u32 = |ty: u8, value: u32| {
        out.extend_from_slice(&[ty, 4]);
        out.extend_from_slice(&value.to_ne_bytes());
    };
    put_u32(UDATA_SET_KEYBYTEORDER, spec.key_byteorder);
    if spec.verdict_map {
        put_u32(UDATA_SET_DATABYTEORDER, 0);
        put_u32(UDATA_SET_DATA_INTERVAL, 0);
    }
    if !spec.fields.is_empty() {
        // A nest: the expression type (TLV 0), then its (empty) data (TLV 1).
        out.extend_from_slice(&[UDATA_SET_KEY_TYPEOF, 8, 0, 4]);
        out.extend_from_slice(&EXPR_CONCAT.to_ne_bytes());
        out.extend_from_slice(&[1, 0]);
    }
    out
}

impl Batch {
    /// Number of messages (changes) in the batch.
    pub(crate) fn messages(&self) -> usize {
        self.ops.len()
    }

    /// Size of the batch so far, in bytes.
    pub(crate) fn size(&self) -> usize {
        self.w.as_bytes().len()
    }

    /// `add set`/`add map` as `spec` says (no error if it exists with the same
    /// type).
    pub(crate) fn add_set_spec(&mut self, family: u8, table: &str, spec: &SetSpec<'_>) {
        let kind = if spec.verdict_map { "map" } else { "set" };
        let what = format!("add {kind} {} {table} {}", family_name(family), spec.name);
        let id = self.next_seq;
        let msg = self.begin(
            NFT_MSG_NEWSET,
            cni_netlink::wire::NLM_F_CREATE,
            family,
            what,
        );
        let w = &mut self.w;
        w.attr_str(NFTA_SET_TABLE, table);
        w.attr_str(NFTA_SET_NAME, spec.name);
        w.attr_u32(NFTA_SET_FLAGS, spec.flags());
        w.attr_u32(NFTA_SET_KEY_TYPE, spec.key_type);
        w.attr_u32(NFTA_SET_KEY_LEN, spec.key_len);
        if spec.verdict_map {
            w.attr_u32(NFTA_SET_DATA_TYPE, DATA_VERDICT);
            w.attr_u32(NFTA_SET_DATA_LEN, 0);
        }
        w.attr_u32(NFTA_SET_ID, id);
        if !spec.fields.is_empty() {
            let desc = w.nest_start(NFTA_SET_DESC);
            let concat = w.nest_start(NFTA_SET_DESC_CONCAT);
            for len in spec.fields {
                let elem = w.nest_start(NFTA_LIST_ELEM);
                w.attr_u32(NFTA_SET_FIELD_LEN, *len);
                w.nest_end(elem);
            }
            w.nest_end(concat);
            w.nest_end(desc);
        }
        w.attr(NFTA_SET_USERDATA, &set_udata(spec));
        self.w.end_msg(msg);
    }

    /// `delete set`/`delete map` (no rule may still refer to it).
    pub(crate) fn delete_set(&mut self, family: u8, table: &str, name: &str) {
        let what = format!("delete set {} {table} {name}", family_name(family));
        let msg = self.begin(NFT_MSG_DELSET, 0, family, what);
        self.w.attr_str(NFTA_SET_TABLE, table);
        self.w.attr_str(NFTA_SET_NAME, name);
        self.w.end_msg(msg);
    }

    /// `add element <set> { ... }`, as many messages as the elements need.
    /// Adding an element that is there already (same key and data) is no error, and
    /// leaves its comment as it was. Fails on a comment too long for nft.
    pub(crate) fn add_elements(
        &mut self,
        family: u8,
        table: &str,
        set: &str,
        elems: &[Element],
    ) -> Result<()> {
        self.elements(NFT_MSG_NEWSETELEM, family, table, set, elems)
    }

    /// `delete element <set> { ... }` (by key, and range end where there is one);
    /// a missing element fails the transaction.
    pub(crate) fn delete_elements(
        &mut self,
        family: u8,
        table: &str,
        set: &str,
        elems: &[Element],
    ) {
        // Only keys: a deletion carries no data or comment (so it cannot fail here).
        let keys: Vec<Element> = elems
            .iter()
            .map(|e| Element {
                key: e.key.clone(),
                key_end: e.key_end.clone(),
                ..Element::default()
            })
            .collect();
        let _ = self.elements(NFT_MSG_DELSETELEM, family, table, set, &keys);
    }

    fn elements(
        &mut self,
        ty: u16,
        family: u8,
        table: &str,
        set: &str,
        elems: &[Element],
    ) -> Result<()> {
        let comments: Vec<Option<Vec<u8>>> = elems
            .iter()
            .map(|e| e.comment.as_deref().map(udata_comment).transpose())
            .collect::<Result<_>>()?;
        let (verb, flags) = if ty == NFT_MSG_NEWSETELEM {
            ("add", cni_netlink::wire::NLM_F_CREATE)
        } else {
            ("delete", 0)
        };
        let mut rest = elems;
        while !rest.is_empty() {
            let what = format!(
                "{verb} element {} {table} {set} ({} element{})",
                family_name(family),
                rest.len(),
                if rest.len() == 1 { "" } else { "s" }
            );
            let msg = self.begin(ty, flags, family, what);
            self.w.attr_str(NFTA_SET_ELEM_LIST_TABLE, table);
            self.w.attr_str(NFTA_SET_ELEM_LIST_SET, set);
            let list = self.w.nest_start(NFTA_SET_ELEM_LIST_ELEMENTS);
            let mut written = 0;
            for (e, comment) in rest.iter().zip(&comments[elems.len() - rest.len()..]) {
                if self.w.as_bytes().len() - list > ELEMENTS_PER_MESSAGE_BYTES {
                    break;
                }
                let elem = self.w.nest_start(NFTA_LIST_ELEM);
                self.w.data_value(NFTA_SET_ELEM_KEY, &e.key);
                if let Some(end) = &e.key_end {
                    self.w.data_value(NFTA_SET_ELEM_KEY_END, end);
                }
                if let Some((code, chain)) = &e.verdict {
                    let data = self.w.nest_start(NFTA_SET_ELEM_DATA);
                    let verdict = self.w.nest_start(NFTA_DATA_VERDICT);
                    self.w.attr(NFTA_VERDICT_CODE, &code.to_be_bytes());
                    if let Some(chain) = chain {
                        self.w.attr_str(NFTA_VERDICT_CHAIN, chain);
                    }
                    self.w.nest_end(verdict);
                    self.w.nest_end(data);
                }
                if let Some(udata) = comment {
                    self.w.attr(NFTA_SET_ELEM_USERDATA, udata);
                }
                self.w.nest_end(elem);
                written += 1;
            }
            self.w.nest_end(list);
            self.w.end_msg(msg);
            // The description counted what was left; say what this message holds.
            if let Some((_, what)) = self.ops.last_mut() {
                *what = format!(
                    "{verb} element {} {table} {set} ({written} element{})",
                    family_name(family),
                    if written == 1 { "" } else { "s" }
                );
            }
            rest = &rest[written..];
        }
        Ok(())
    }
}

/// Decodes a `NFT_MSG_NEWSET` message of a dump.
fn parse_set(payload: &[u8]) -> Option<(String, SetInfo)> {
    let body = payload.get(NFGENMSG_LEN..)?;
    let fields = attr(body, NFTA_SET_DESC)
        .and_then(|desc| attr(desc, NFTA_SET_DESC_CONCAT))
        .map(|concat| {
            attrs(concat)
                .filter(|(t, _)| *t == NFTA_LIST_ELEM)
                .filter_map(|(_, f)| attr_u32(f, NFTA_SET_FIELD_LEN))
                .collect()
        })
        .unwrap_or_default();
    Some((
        c_string(attr(body, NFTA_SET_TABLE)?),
        SetInfo {
            name: c_string(attr(body, NFTA_SET_NAME)?),
            flags: attr_u32(body, NFTA_SET_FLAGS).unwrap_or(0),
            key_type: attr_u32(body, NFTA_SET_KEY_TYPE).unwrap_or(0),
            key_len: attr_u32(body, NFTA_SET_KEY_LEN)?,
            data_type: attr_u32(body, NFTA_SET_DATA_TYPE),
            fields,
        },
    ))
}

/// Decodes a `NFT_MSG_NEWCHAIN` message of a dump.
fn parse_chain(payload: &[u8]) -> Option<(String, ChainInfo)> {
    let body = payload.get(NFGENMSG_LEN..)?;
    let hook = attr(body, NFTA_CHAIN_HOOK).and_then(|hook| {
        Some(ChainHook {
            chain_type: attr(body, NFTA_CHAIN_TYPE).map(c_string)?,
            hooknum: attr_u32(hook, NFTA_HOOK_HOOKNUM)?,
            priority: attr_u32(hook, NFTA_HOOK_PRIORITY)? as i32,
            policy: attr_u32(body, NFTA_CHAIN_POLICY),
        })
    });
    Some((
        c_string(attr(body, NFTA_CHAIN_TABLE)?),
        ChainInfo {
            name: c_string(attr(body, NFTA_CHAIN_NAME)?),
            hook,
        },
    ))
}

/// The elements of a `NFT_MSG_NEWSETELEM` message of a dump; malformed ones are left
/// out.
pub(crate) fn parse_elements(payload: &[u8]) -> Vec<Element> {
    let Some(list) = payload
        .get(NFGENMSG_LEN..)
        .and_then(|body| attr(body, NFTA_SET_ELEM_LIST_ELEMENTS))
    else {
        return Vec::new();
    };
    let value = |elem: &[u8], ty| attr(attr(elem, ty)?, NFTA_DATA_VALUE).map(<[u8]>::to_vec);
    attrs(list)
        .filter(|(t, _)| *t == NFTA_LIST_ELEM)
        .filter_map(|(_, elem)| {
            let verdict = attr(elem, NFTA_SET_ELEM_DATA)
                .and_then(|data| attr(data, NFTA_DATA_VERDICT))
                .and_then(|v| {
                    Some((
                        be_u32(attr(v, NFTA_VERDICT_CODE)?)? as i32,
                        attr(v, NFTA_VERDICT_CHAIN).map(c_string),
                    ))
                });
            Some(Element {
                key: value(elem, NFTA_SET_ELEM_KEY)?,
                key_end: value(elem, NFTA_SET_ELEM_KEY_END),
                verdict,
                comment: attr(elem, NFTA_SET_ELEM_USERDATA).and_then(parse_udata_comment),
            })
        })
        .collect()
}

impl Nfnl {
    /// The sets and maps of `table` (empty when the table does not exist).
    pub(crate) fn sets(&mut self, family: u8, table: &str) -> Result<Vec<SetInfo>> {
        let target = format!("list sets {} {table}", family_name(family));
        Ok(self
            .dump(
                NFT_MSG_GETSET,
                NFT_MSG_NEWSET,
                family,
                |w| w.attr_str(NFTA_SET_TABLE, table),
                &target,
            )?
            .iter()
            .filter_map(|payload| parse_set(payload))
            .filter(|(t, _)| t == table)
            .map(|(_, set)| set)
            .collect())
    }

    /// The chains of `table`, with their hooks (empty when the table does not
    /// exist).
    pub(crate) fn chains(&mut self, family: u8, table: &str) -> Result<Vec<ChainInfo>> {
        let target = format!("list chains {} {table}", family_name(family));
        Ok(self
            .dump(
                NFT_MSG_GETCHAIN,
                NFT_MSG_NEWCHAIN,
                family,
                |w| w.attr_str(NFTA_CHAIN_TABLE, table),
                &target,
            )?
            .iter()
            .filter_map(|payload| parse_chain(payload))
            .filter(|(t, _)| t == table)
            .map(|(_, chain)| chain)
            .collect())
    }

    /// Every element of set or map `set`, with range ends and verdicts. Fails with
    /// "not found" when the set does not exist.
    pub(crate) fn elements(&mut self, family: u8, table: &str, set: &str) -> Result<Vec<Element>> {
        let target = format!("list set {} {table} {set}", family_name(family));
        Ok(self
            .dump(
                NFT_MSG_GETSETELEM,
                NFT_MSG_NEWSETELEM,
                family,
                |w| {
                    w.attr_str(NFTA_SET_ELEM_LIST_TABLE, table);
                    w.attr_str(NFTA_SET_ELEM_LIST_SET, set);
                },
                &target,
            )?
            .iter()
            .flat_map(|payload| parse_elements(payload))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{NFPROTO_INET, TYPE_IPADDR, VERDICT_JUMP};
    use super::*;
    use cni_netlink::wire::messages;

    fn concat_spec() -> SetSpec<'static> {
        SetSpec {
            name: "s",
            key_type: (TYPE_IPADDR << 12) | (TYPE_INET_PROTO << 6) | TYPE_INET_SERVICE,
            key_len: 12,
            fields: &[4, 1, 2],
            interval: true,
            verdict_map: false,
            key_byteorder: 0,
        }
    }

    /// The set message carries what nft 1.0.6 sends for
    /// `set s { type ipv4_addr . inet_proto . inet_service; flags interval; }`.
    #[test]
    fn a_concatenated_interval_set_is_laid_out_as_nft_does() {
        let mut b = Batch::new();
        b.add_set_spec(NFPROTO_INET, "t", &concat_spec());
        let (bytes, _) = b.finish();
        let msg = messages(&bytes).nth(1).unwrap().unwrap();
        let (table, set) = parse_set(msg.payload).unwrap();
        assert_eq!(table, "t");
        assert_eq!(set.flags, 0x84);
        assert_eq!(set.key_type, 0x730d);
        assert_eq!(set.fields, [4, 1, 2]);
        assert!(set.matches(&concat_spec()));
        let body = &msg.payload[NFGENMSG_LEN..];
        assert_eq!(
            attr(body, NFTA_SET_USERDATA).unwrap(),
            [0, 4, 0, 0, 0, 0, 3, 8, 0, 4, 13, 0, 0, 0, 1, 0]
        );
    }

    #[test]
    fn a_verdict_map_is_laid_out_as_nft_does() {
        let spec = SetSpec {
            name: "m",
            key_type: TYPE_IPADDR,
            key_len: 4,
            fields: &[],
            interval: false,
            verdict_map: true,
            key_byteorder: BYTEORDER_BIG_ENDIAN,
        };
        let mut b = Batch::new();
        b.add_set_spec(NFPROTO_INET, "t", &spec);
        let (bytes, ops) = b.finish();
        assert_eq!(ops[0].1, "add map inet t m");
        let msg = messages(&bytes).nth(1).unwrap().unwrap();
        let (_, set) = parse_set(msg.payload).unwrap();
        assert_eq!(set.flags, SET_MAP);
        assert_eq!(set.data_type, Some(DATA_VERDICT));
        assert!(set.matches(&spec));
        assert!(!set.matches(&concat_spec()));
        let body = &msg.payload[NFGENMSG_LEN..];
        assert_eq!(
            attr(body, NFTA_SET_USERDATA).unwrap(),
            [0, 4, 2, 0, 0, 0, 1, 4, 0, 0, 0, 0, 6, 4, 0, 0, 0, 0]
        );
    }

    /// Thousands of elements go into several messages, each within the 16-bit
    /// attribute length, and decode back as they were.
    #[test]
    fn many_elements_are_split_into_messages_that_decode_back() {
        let elems: Vec<Element> = (0..5000u32)
            .map(|i| Element {
                key: i.to_be_bytes().to_vec(),
                key_end: (i % 2 == 0).then(|| (i + 1).to_be_bytes().to_vec()),
                verdict: Some((VERDICT_JUMP, Some(format!("ingress-{i:032x}")))),
                comment: (i % 3 == 0).then(|| format!("ns/pod-{i}")),
            })
            .collect();
        let mut b = Batch::new();
        b.add_elements(NFPROTO_INET, "t", "m", &elems).unwrap();
        let count = b.messages();
        assert!(count > 1, "{count}");
        let (bytes, ops) = b.finish();
        assert!(
            ops[0].1.starts_with("add element inet t m ("),
            "{}",
            ops[0].1
        );
        let mut back = Vec::new();
        for msg in messages(&bytes).skip(1).take(count) {
            let msg = msg.unwrap();
            let list = attr(&msg.payload[NFGENMSG_LEN..], NFTA_SET_ELEM_LIST_ELEMENTS).unwrap();
            assert!(list.len() < 65535 - 4);
            back.extend(parse_elements(msg.payload));
        }
        assert_eq!(back, elems);
        // A comment nft cannot hold fails before anything is written.
        let long = Element {
            comment: Some("x".repeat(300)),
            ..Element::default()
        };
        let mut b = Batch::new();
        assert!(b.add_elements(NFPROTO_INET, "t", "s", &[long]).is_err());
        assert_eq!(b.messages(), 0);
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..64 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
            let _ = parse_set(&junk);
            let _ = parse_chain(&junk);
            let _ = parse_elements(&junk);
        }
    }
}
