//! Decoding what the kernel sends back: attributes, a rule's expressions, whole rules
//! (for the rule dumps and the debugging of dumped messages).

use super::*;

/// Attributes of a netlink attribute stream, as (type without flags, value);
/// malformed framing ends the list (the decoders below treat what is missing
/// as absent).
pub(super) fn attrs(data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    cni_netlink::attrs(data).map_while(std::result::Result::ok)
}

pub(super) fn attr(data: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(data).find_map(|(t, v)| (t == ty).then_some(v))
}

pub(super) fn be_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

pub(super) fn attr_u32(data: &[u8], ty: u16) -> Option<u32> {
    be_u32(attr(data, ty)?)
}

pub(super) fn data_value(data: &[u8], ty: u16) -> Option<Vec<u8>> {
    attr(attr(data, ty)?, NFTA_DATA_VALUE).map(<[u8]>::to_vec)
}

/// Decodes one `NFTA_LIST_ELEM` of a rule's expressions.
pub(super) fn parse_expr(elem: &[u8]) -> Expr {
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
        "counter" => {
            let u64_of = |ty| {
                attr(d, ty)
                    .and_then(|v| v.get(..8)?.try_into().ok())
                    .map(u64::from_be_bytes)
            };
            Some(Expr::Counter {
                packets: u64_of(2).unwrap_or(0),
                bytes: u64_of(1).unwrap_or(0),
            })
        }
        // Only the packet form, not inverted.
        "limit" if attr_u32(d, 4).unwrap_or(0) == 0 && attr_u32(d, 5).unwrap_or(0) == 0 => (|| {
            let u64_of = |ty| {
                attr(d, ty)
                    .and_then(|v| v.get(..8)?.try_into().ok())
                    .map(u64::from_be_bytes)
            };
            Some(Expr::Limit {
                rate: u64_of(1)?,
                unit: u64_of(2)?,
                burst: attr_u32(d, 3).unwrap_or(0),
            })
        })(
        ),
        // Only the nflog form (a group), without a snap length or queue threshold.
        "log" if attr(d, 3).is_none() && attr(d, 4).is_none() && attr(d, 5).is_none() => (|| {
            Some(Expr::Log {
                prefix: attr(d, 2).map(c_string).unwrap_or_default(),
                group: u16::from_be_bytes(attr(d, 1)?.get(..2)?.try_into().ok()?),
            })
        })(
        ),
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
pub(super) fn parse_rule(payload: &[u8]) -> Option<Rule> {
    parse_rule_of(payload, &|_| true)
}

/// [`parse_rule`], decoding the expressions only of rules in chains `decode` names
/// (the others get none: a caller that needs only their handles and comments does
/// not pay for them).
pub(super) fn parse_rule_of(payload: &[u8], decode: &dyn Fn(&str) -> bool) -> Option<Rule> {
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
