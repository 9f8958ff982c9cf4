//! Building messages: the netlink writer with nf_tables' message header, the
//! expressions of a rule as `nft` encodes them, and the user data (`udata`) TLVs that
//! hold comments.

use super::*;

/// Builds nf_tables messages: `cni_netlink`'s framing, plus what nf_tables
/// expects of it: an `nfgenmsg` after each header, integers in network byte
/// order, and nests always flagged as such.
#[derive(Debug, Default)]
pub(super) struct Writer {
    pub(super) w: cni_netlink::Writer,
}

impl Writer {
    /// Starts a message; returns its offset for [`Writer::end_msg`].
    pub(super) fn begin_msg(
        &mut self,
        ty: u16,
        flags: u16,
        seq: u32,
        family: u8,
        res_id: u16,
    ) -> usize {
        let start = self.w.begin_msg(ty, flags, seq);
        self.w.bytes(&[family, 0]); // NFNETLINK_V0
        self.w.bytes(&res_id.to_be_bytes());
        start
    }

    pub(super) fn end_msg(&mut self, start: usize) {
        self.w.end_msg(start);
    }

    pub(super) fn attr(&mut self, ty: u16, value: &[u8]) {
        self.w.attr(ty, value);
    }

    pub(super) fn attr_str(&mut self, ty: u16, value: &str) {
        self.w.attr_str(ty, value);
    }

    pub(super) fn attr_u32(&mut self, ty: u16, value: u32) {
        self.w.attr_u32_be(ty, value);
    }

    pub(super) fn nest_start(&mut self, ty: u16) -> usize {
        self.w.nest_start(ty | NLA_F_NESTED)
    }

    pub(super) fn nest_end(&mut self, start: usize) {
        self.w.nest_end(start);
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        self.w.as_bytes()
    }

    pub(super) fn data_value(&mut self, ty: u16, value: &[u8]) {
        let nest = self.nest_start(ty);
        self.attr(NFTA_DATA_VALUE, value);
        self.nest_end(nest);
    }

    pub(super) fn expr(&mut self, expr: &Expr) {
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
            Expr::Counter { .. } => "counter",
            Expr::Limit { .. } => "limit",
            Expr::Log { .. } => "log",
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
            Expr::Counter { packets, bytes } => {
                // As nft: nothing for a counter that starts at zero.
                if *bytes != 0 {
                    self.attr(1, &bytes.to_be_bytes());
                }
                if *packets != 0 {
                    self.attr(2, &packets.to_be_bytes());
                }
            }
            Expr::Limit { rate, unit, burst } => {
                self.attr(1, &rate.to_be_bytes());
                self.attr(2, &unit.to_be_bytes());
                self.attr_u32(3, *burst);
                // NFT_LIMIT_PKTS, no flags.
                self.attr_u32(4, 0);
                self.attr_u32(5, 0);
            }
            Expr::Log { prefix, group } => {
                let mut text = prefix.as_bytes().to_vec();
                text.push(0);
                self.attr(2, &text);
                self.attr(1, &group.to_be_bytes());
            }
            Expr::Other(_) => {}
        }
        self.nest_end(data);
        self.nest_end(elem);
    }
}

/// libnftnl's user data holding one comment: TLV (type, length, value) with
/// the NUL-terminated text.
pub(super) fn udata_comment(comment: &str) -> Result<Vec<u8>> {
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
pub(super) fn parse_udata_comment(udata: &[u8]) -> Option<String> {
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
