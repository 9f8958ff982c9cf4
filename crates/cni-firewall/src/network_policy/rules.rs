//! The table's rules as nf_tables expressions: the pieces they are made of, the base
//! chains' fixed rules, a profile chain's rules (its own sets, one rule per shared peer
//! set), and the decoding of a peer rule read back from the kernel.

use super::*;

pub(super) fn meta(key: u32, dreg: u32) -> Expr {
    Expr::Meta { key, dreg }
}

pub(super) fn cmp(op: u32, data: &[u8]) -> Expr {
    Expr::Cmp {
        sreg: REG_1,
        op,
        data: data.to_vec(),
    }
}

pub(super) fn load(dreg: u32, base: u32, offset: u32, len: u32) -> Expr {
    Expr::Payload {
        dreg,
        base,
        offset,
        len,
    }
}

/// `meta nfproto ipv4|ipv6`, which guards every `ip`/`ip6` match in an inet table.
pub(super) fn nfproto(family: Family) -> [Expr; 2] {
    [meta(META_NFPROTO, REG_1), cmp(CMP_EQ, &[family.nfproto()])]
}

pub(super) fn addr(family: Family, field: Field) -> Expr {
    load(REG_1, BASE_NETWORK, family.offset(field), family.addr_len())
}

pub(super) fn lookup(set: &str, vmap: bool) -> Expr {
    Expr::Lookup {
        sreg: REG_1,
        dreg: vmap.then_some(crate::nfnetlink::REG_VERDICT),
        set: set.into(),
        invert: false,
    }
}

/// `ip[6] saddr|daddr @set <verdict>` or, without a verdict, `... vmap @set`.
pub(super) fn addr_lookup(family: Family, field: Field, set: &str, code: Option<i32>) -> Vec<Expr> {
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
pub(super) enum Base {
    Forward,
    Input,
}

impl Base {
    pub(super) fn name(self) -> &'static str {
        match self {
            Base::Forward => FORWARD,
            Base::Input => INPUT,
        }
    }

    pub(super) fn hook(self) -> Hook<'static> {
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

    pub(super) fn hook_matches(self, hook: Option<&ChainHook>) -> bool {
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
pub(super) fn base_rules(base: Base) -> Vec<Vec<Expr>> {
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
pub(super) fn profile_rules(
    direction: Direction,
    profile: &str,
    peers: &[PeerRule],
) -> Vec<Vec<Expr>> {
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
pub(super) fn range_match(field: &Expr, first: &[u8], last: &[u8]) -> Vec<Expr> {
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
pub(super) fn peer_rule(direction: Direction, family: Family, rule: &PeerRule) -> Vec<Expr> {
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
pub(super) fn decode_peer_rule(
    direction: Direction,
    family: Family,
    exprs: &[Expr],
) -> Option<PeerRule> {
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
pub(super) fn own_set_rules(direction: Direction, profile: &str) -> Vec<Vec<Expr>> {
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
