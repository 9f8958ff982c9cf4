//! The table's rules as nf_tables expressions: the pieces they are made of, the base
//! chains' and the tiers' fixed chains' rules, a NetworkPolicy profile chain's rules
//! (its own sets, one rule per shared peer set), a tier profile chain's (its peers'
//! rows, per family) and a tier row chain's (one verdict map lookup), a verdict chain's (count, log, act), and the decoding of a
//! peer rule read back from the kernel.

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
    rules.push(vec![verdict(
        VERDICT_JUMP,
        Some(&judge_chain(Direction::Egress)),
    )]);
    if base == Base::Forward {
        rules.push(vec![verdict(
            VERDICT_JUMP,
            Some(&judge_chain(Direction::Ingress)),
        )]);
    }
    rules
}

/// The fixed chains between the base chains and the profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fixed {
    /// `judge-<direction>`: the Admin tier's map, then NetworkPolicy.
    Judge(Direction),
    /// `np-<direction>`: NetworkPolicy's map, then the Baseline tier.
    NetworkPolicy(Direction),
    /// `baseline-<direction>`: the Baseline tier's map, then the end of the
    /// direction's judgement (allowed).
    Baseline(Direction),
}

impl Fixed {
    pub(super) fn all() -> [Fixed; 6] {
        use Direction::{Egress, Ingress};
        [
            Fixed::Baseline(Egress),
            Fixed::Baseline(Ingress),
            Fixed::NetworkPolicy(Egress),
            Fixed::NetworkPolicy(Ingress),
            Fixed::Judge(Egress),
            Fixed::Judge(Ingress),
        ]
    }

    pub(super) fn name(self) -> String {
        match self {
            Fixed::Judge(d) => judge_chain(d),
            Fixed::NetworkPolicy(d) => np_chain(d),
            Fixed::Baseline(d) => baseline_chain(d),
        }
    }

    /// Its rules: per family the pod's address looked up in the tier's map (a `goto`
    /// to the pod's profile chain), then a `goto` to the next tier (none after
    /// Baseline: the chain's end returns, the direction allowed).
    pub(super) fn rules(self) -> Vec<Vec<Expr>> {
        let (direction, map, next): (Direction, &dyn Fn(Family) -> String, Option<String>) =
            match self {
                Fixed::Judge(d) => (d, &move |f| ClusterTier::Admin.map(d, f), Some(np_chain(d))),
                Fixed::NetworkPolicy(d) => (d, &move |f| d.map(f), Some(baseline_chain(d))),
                Fixed::Baseline(d) => (d, &move |f| ClusterTier::Baseline.map(d, f), None),
            };
        let mut rules: Vec<Vec<Expr>> = FAMILIES
            .into_iter()
            .map(|family| addr_lookup(family, direction.pod(), &map(family), None))
            .collect();
        if let Some(next) = next {
            rules.push(vec![verdict(VERDICT_GOTO, Some(&next))]);
        }
        rules
    }
}

/// Where a NetworkPolicy profile sends allowed traffic: its allow verdict chain, or
/// straight on (ingress accepts, egress returns).
pub(super) fn allowed_verdict(direction: Direction, verdicts: Option<&ProfileVerdicts>) -> Expr {
    match verdicts {
        Some(v) => verdict(VERDICT_GOTO, Some(&v.allow)),
        None => verdict(direction.allowed(), None),
    }
}

/// Where a NetworkPolicy profile sends the rest: its deny verdict chain, or `drop`.
pub(super) fn denied_verdict(verdicts: Option<&ProfileVerdicts>) -> Expr {
    match verdicts {
        Some(v) => verdict(VERDICT_GOTO, Some(&v.deny)),
        None => verdict(VERDICT_DROP, None),
    }
}

/// A profile chain's rules: per family, `<peer> . meta l4proto . th dport @set`
/// with the allowed verdict; the peer rules (`peers`, in chain order), each per
/// family; then the denied verdict.
pub(super) fn profile_rules(
    direction: Direction,
    profile: &str,
    peers: &[PeerRule],
    verdicts: Option<&ProfileVerdicts>,
) -> Vec<Vec<Expr>> {
    let allowed = allowed_verdict(direction, verdicts);
    let mut rules = own_set_rules(direction, profile, &allowed);
    for rule in peers {
        for family in FAMILIES {
            rules.push(peer_rule(direction, family, rule, &allowed));
        }
    }
    rules.push(vec![denied_verdict(verdicts)]);
    rules
}

/// A tier profile chain's rules: per family, `<peer> vmap @<peers map>` (a single
/// address: a `goto` to its row), then `<peer> . meta l4proto vmap @<ranges map>` (a
/// range, on every protocol); after the Admin tier's, `goto np-<direction>` (no row:
/// NetworkPolicy judges); after the Baseline tier's nothing (the chain's end: allowed).
pub(super) fn tier_profile_rules(
    tier: ClusterTier,
    direction: Direction,
    profile: &str,
) -> Vec<Vec<Expr>> {
    let mut rules = Vec::new();
    for family in FAMILIES {
        let peers = tier.peers_map(direction, profile, family);
        rules.push(addr_lookup(family, direction.peer(), &peers, None));
        let proto_reg = match family {
            Family::V4 => REG32_01,
            Family::V6 => REG_2,
        };
        let mut ranges = Vec::from(nfproto(family));
        ranges.push(addr(family, direction.peer()));
        ranges.extend(l4proto(proto_reg));
        ranges.push(lookup(&tier.ranges_map(direction, profile, family), true));
        rules.push(ranges);
    }
    rules.extend(tier_tail(tier, direction));
    rules
}

/// A tier row chain's rules: `meta l4proto . th dport vmap @<row map>`, then the
/// tier's end as in [`tier_profile_rules`] (no box: no word).
pub(super) fn tier_row_rules(tier: ClusterTier, direction: Direction, row: &str) -> Vec<Vec<Expr>> {
    let mut lookup_keys = Vec::from(l4proto(REG_1));
    lookup_keys.push(load(REG32_01, BASE_TRANSPORT, 2, 2));
    lookup_keys.push(lookup(&tier.row_map(direction, row), true));
    let mut rules = vec![lookup_keys];
    rules.extend(tier_tail(tier, direction));
    rules
}

/// What follows a tier's lookups: NetworkPolicy after the Admin tier, nothing (the
/// end of the judgement: allowed) after the Baseline tier.
fn tier_tail(tier: ClusterTier, direction: Direction) -> Option<Vec<Expr>> {
    (tier == ClusterTier::Admin).then(|| vec![verdict(VERDICT_GOTO, Some(&np_chain(direction)))])
}

/// `meta l4proto` into `reg`, as nft loads it into a concatenation.
fn l4proto(reg: u32) -> [Expr; 2] {
    [
        meta(META_L4PROTO, reg),
        Expr::Byteorder {
            sreg: reg,
            dreg: reg,
            op: BYTEORDER_HTON,
            len: 1,
            size: 2,
        },
    ]
}

/// `ct state new`: the connection's first packet (of this direction's judgement).
fn ct_state_new() -> [Expr; 3] {
    [
        Expr::Ct {
            key: CT_STATE,
            dreg: REG_1,
        },
        Expr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            len: 4,
            mask: CT_STATE_NEW.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        },
        cmp(CMP_NEQ, &[0; 4]),
    ]
}

/// nft's default burst of a packet limit.
pub(super) const LOG_BURST: u32 = 5;

/// A verdict chain's rules: `ct state new counter`; for a drop with the deny log on,
/// `ct state new limit rate <n>/second log prefix "<chain>" group <g>`; then the
/// action (`return`, `drop`, `goto np-<direction>`).
pub(super) fn verdict_rules(
    name: &str,
    action: VerdictAction,
    log: Option<DenyLog>,
) -> Vec<Vec<Expr>> {
    let mut counted = Vec::from(ct_state_new());
    counted.push(Expr::Counter {
        packets: 0,
        bytes: 0,
    });
    let mut rules = vec![counted];
    if let (VerdictAction::Drop, Some(log)) = (action, log) {
        let mut logged = Vec::from(ct_state_new());
        logged.push(Expr::Limit {
            rate: u64::from(log.per_second.max(1)),
            unit: 1,
            burst: LOG_BURST,
        });
        logged.push(Expr::Log {
            prefix: name.to_owned(),
            group: log.group,
        });
        rules.push(logged);
    }
    rules.push(vec![match action {
        VerdictAction::Accept => verdict(VERDICT_RETURN, None),
        VerdictAction::Drop => verdict(VERDICT_DROP, None),
        VerdictAction::ToNetworkPolicy(d) => verdict(VERDICT_GOTO, Some(&np_chain(d))),
    }]);
    rules
}

/// The action and deny log of a verdict chain whose rules are `have` (counters as
/// the kernel holds them), if they are exactly what [`verdict_rules`] makes.
pub(super) fn decode_verdict_rules(name: &str, have: &[&Vec<Expr>]) -> Option<HeldVerdict> {
    let last = have.last()?;
    let action = match last.as_slice() {
        [
            Expr::Immediate {
                data: crate::nfnetlink::Data::Verdict { code, chain },
                ..
            },
        ] => match (*code, chain.as_deref()) {
            (VERDICT_RETURN, None) => VerdictAction::Accept,
            (VERDICT_DROP, None) => VerdictAction::Drop,
            (VERDICT_GOTO, Some(chain)) => DIRECTIONS
                .into_iter()
                .find(|d| np_chain(*d) == chain)
                .map(VerdictAction::ToNetworkPolicy)?,
            _ => return None,
        },
        _ => return None,
    };
    let log = have.iter().find_map(|rule| {
        let limit = rule.iter().find_map(|e| match e {
            Expr::Limit { rate, .. } => Some(*rate),
            _ => None,
        })?;
        let group = rule.iter().find_map(|e| match e {
            Expr::Log { group, .. } => Some(*group),
            _ => None,
        })?;
        Some(DenyLog {
            group,
            per_second: u32::try_from(limit).unwrap_or(u32::MAX),
        })
    });
    let want = verdict_rules(name, action, log);
    let zeroed = |rule: &Vec<Expr>| -> Vec<Expr> {
        rule.iter()
            .map(|e| match e {
                Expr::Counter { .. } => Expr::Counter {
                    packets: 0,
                    bytes: 0,
                },
                other => other.clone(),
            })
            .collect()
    };
    (have.len() == want.len() && have.iter().zip(&want).all(|(h, w)| zeroed(h) == *w))
        .then_some((action, log))
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
/// <protocols>] [th dport <ports>] <allowed>` (for egress: `daddr`).
pub(super) fn peer_rule(
    direction: Direction,
    family: Family,
    rule: &PeerRule,
    allowed: &Expr,
) -> Vec<Expr> {
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
    e.push(allowed.clone());
    e
}

/// The [`PeerRule`] that `exprs` is the rule of, if it is exactly such a rule.
pub(super) fn decode_peer_rule(
    direction: Direction,
    family: Family,
    exprs: &[Expr],
    allowed: &Expr,
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
    (of == family && peer_rule(direction, family, &rule, allowed) == exprs).then_some(rule)
}

/// `<peer> . meta l4proto . th dport` of one family, in nft's registers, before a
/// lookup.
fn concat_key(direction: Direction, family: Family) -> Vec<Expr> {
    // nft's registers for the second and third fields: right after the address.
    let (proto_reg, port_reg) = match family {
        Family::V4 => (REG32_01, REG32_02),
        Family::V6 => (REG_2, REG32_05),
    };
    let mut e = Vec::from(nfproto(family));
    e.push(addr(family, direction.peer()));
    e.extend(l4proto(proto_reg));
    e.push(load(port_reg, BASE_TRANSPORT, 2, 2));
    e
}

/// A profile chain's first rules: per family, the lookup in the profile's own set.
pub(super) fn own_set_rules(direction: Direction, profile: &str, allowed: &Expr) -> Vec<Vec<Expr>> {
    FAMILIES
        .into_iter()
        .map(|family| {
            let mut e = concat_key(direction, family);
            e.push(lookup(&direction.set(profile, family), false));
            e.push(allowed.clone());
            e
        })
        .collect()
}
