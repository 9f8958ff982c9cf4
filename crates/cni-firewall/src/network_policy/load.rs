//! Reading the table back ([`PolicyTable::load`](super::PolicyTable::load)): its
//! maps, sets and chains (fixed, verdict, NetworkPolicy and tier profile chains)
//! decoded into the state they hold, and whether it is laid out as this module lays
//! it out (when not, it is made again whole).

use super::*;

/// Reads the table: its content, and whether it is laid out as this module makes
/// it.
pub(super) fn read(nl: &mut Nfnl) -> Result<View> {
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
    let mut fixed_chains = 0;
    let fixed_names: Vec<(String, Fixed)> = Fixed::all().map(|f| (f.name(), f)).into();
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
        if chain.hook.is_some() {
            rebuild = true;
            continue;
        }
        let have = rules_of
            .get(chain.name.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        if let Some((_, fixed)) = fixed_names.iter().find(|(n, _)| *n == chain.name) {
            fixed_chains += 1;
            rebuild |= !same_rules(&chain.name, fixed.rules());
            continue;
        }
        if valid_verdict_chain(&chain.name) {
            match decode_verdict_rules(&chain.name, have) {
                Some(verdict) => {
                    held.verdicts.insert(chain.name.clone(), verdict);
                }
                None => rebuild = true,
            }
            continue;
        }
        if let Some((tier, direction, profile)) = ClusterTier::parse_chain(&chain.name) {
            if same_rules(&chain.name, tier_profile_rules(tier, direction, profile)) {
                held.tiers[tier.index()].profiles[direction.index()]
                    .insert(profile.to_owned(), Arc::default());
            } else {
                rebuild = true;
            }
            continue;
        }
        if let Some((tier, direction, row)) = ClusterTier::parse_row_chain(&chain.name) {
            if same_rules(&chain.name, tier_row_rules(tier, direction, row)) {
                held.tiers[tier.index()].rows[direction.index()]
                    .insert(row.to_owned(), BTreeSet::new());
            } else {
                rebuild = true;
            }
            continue;
        }
        match Direction::parse_chain(&chain.name) {
            Some((direction, profile)) => match decode_profile_rules(direction, profile, have) {
                Some((peers, verdicts)) => {
                    held.profiles[direction.index()].insert(
                        profile.to_owned(),
                        HeldProfile {
                            boxes: BTreeSet::new(),
                            peers,
                            verdicts,
                        },
                    );
                }
                None => rebuild = true,
            },
            None => rebuild = true,
        }
    }
    rebuild |= bases != 2 || fixed_chains != fixed_names.len();
    // Every verdict chain a profile goes to must be there, with its action.
    rebuild |= held.profiles.iter().any(|profiles| {
        profiles.values().any(|p| {
            p.verdicts.as_ref().is_some_and(|v| {
                held.verdicts.get(&v.allow).map(|h| h.0) != Some(VerdictAction::Accept)
                    || held.verdicts.get(&v.deny).map(|h| h.0) != Some(VerdictAction::Drop)
            })
        })
    });

    // Every set must be one this module makes, of the type it makes.
    let mut fixed = 0;
    for set in &sets {
        let spec = match set.name.as_str() {
            PENDING4 => pending_spec(Family::V4),
            PENDING6 => pending_spec(Family::V6),
            name => {
                let map = DIRECTIONS.into_iter().find_map(|d| {
                    FAMILIES.into_iter().find_map(|f| {
                        let np = d.map(f) == name;
                        let tier = CLUSTER_TIERS.into_iter().any(|t| t.map(d, f) == name);
                        (np || tier).then(|| map_spec(name, f))
                    })
                });
                if let Some(spec) = map {
                    spec
                } else if let Some((peer, family)) = parse_peer_set(name) {
                    rebuild |= !set.matches(&peer_spec(name, family));
                    held.peer_sets.entry(peer.to_owned()).or_default();
                    continue;
                } else if let Some((tier, d, p, spec)) = tier_profile_map(name) {
                    let known = held.tiers[tier.index()].profiles[d.index()].contains_key(p);
                    rebuild |= !known || !set.matches(&spec);
                    continue;
                } else if let Some((tier, d, row)) = name
                    .strip_suffix("-keys")
                    .and_then(ClusterTier::parse_row_chain)
                {
                    let known = held.tiers[tier.index()].rows[d.index()].contains_key(row);
                    rebuild |= !known || !set.matches(&tier_keys_spec(name));
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
    rebuild |= fixed != 14;

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

    // The boxes of every tier row, from its map: each goes to a verdict chain that is
    // there, and fits the tier and direction.
    for tier in CLUSTER_TIERS {
        for direction in DIRECTIONS {
            let i = direction.index();
            let names: Vec<String> = held.tiers[tier.index()].rows[i].keys().cloned().collect();
            for name in names {
                let set = tier.row_map(direction, &name);
                if !sets.iter().any(|s| s.name == set) {
                    rebuild = true;
                    continue;
                }
                let mut boxes = BTreeSet::new();
                for e in nl.elements(NFPROTO_INET, TABLE, &set)? {
                    let fits = |b: &TierBox| match held.verdicts.get(&*b.chain) {
                        None => false,
                        Some((VerdictAction::ToNetworkPolicy(d), _)) => {
                            tier == ClusterTier::Admin && *d == direction
                        }
                        Some(_) => true,
                    };
                    match decode_tier_box(&e).filter(fits) {
                        Some(b) => {
                            boxes.insert(b);
                        }
                        None => rebuild = true,
                    }
                }
                held.tiers[tier.index()].rows[i].insert(name, boxes);
            }
        }
    }

    // The peers of every tier profile, from its maps: each goes to a row of the
    // profile's tier and direction that is there.
    for tier in CLUSTER_TIERS {
        for direction in DIRECTIONS {
            let i = direction.index();
            let t = &held.tiers[tier.index()];
            let names: Vec<String> = t.profiles[i].keys().cloned().collect();
            let rows: BTreeMap<String, Arc<str>> = t.rows[i]
                .keys()
                .map(|r| (tier.row_chain(direction, r), Arc::from(r.as_str())))
                .collect();
            for name in names {
                let mut profile = TierProfile::default();
                for family in FAMILIES {
                    let peers = tier.peers_map(direction, &name, family);
                    let ranges = tier.ranges_map(direction, &name, family);
                    if !sets.iter().any(|s| s.name == peers)
                        || !sets.iter().any(|s| s.name == ranges)
                    {
                        rebuild = true;
                        continue;
                    }
                    for e in nl.elements(NFPROTO_INET, TABLE, &peers)? {
                        let ip = addr_of(&e.key).filter(|ip| Family::of(*ip) == family);
                        let row = match &e.verdict {
                            Some((VERDICT_GOTO, Some(chain))) => rows.get(chain),
                            _ => None,
                        };
                        match (ip, row) {
                            (Some(ip), Some(row)) => {
                                profile.peers.insert(ip, Arc::clone(row));
                            }
                            _ => rebuild = true,
                        }
                    }
                    for e in nl.elements(NFPROTO_INET, TABLE, &ranges)? {
                        match decode_tier_range(&e, family)
                            .and_then(|(first, last, chain)| Some((first, last, rows.get(chain)?)))
                        {
                            Some((first, last, row)) => {
                                profile.ranges.insert(TierRange {
                                    first,
                                    last,
                                    row: Arc::clone(row),
                                });
                            }
                            None => rebuild = true,
                        }
                    }
                }
                held.tiers[tier.index()].profiles[i].insert(name, Arc::new(profile));
            }
        }
    }

    // The pods, from the maps: each must go to a profile of its map's tier and
    // direction.
    for tier in [None, Some(ClusterTier::Admin), Some(ClusterTier::Baseline)] {
        for direction in DIRECTIONS {
            let i = direction.index();
            for family in FAMILIES {
                let map = match tier {
                    None => direction.map(family),
                    Some(t) => t.map(direction, family),
                };
                if !sets.iter().any(|s| s.name == map) {
                    continue;
                }
                for e in nl.elements(NFPROTO_INET, TABLE, &map)? {
                    let ip = addr_of(&e.key).filter(|ip| Family::of(*ip) == family);
                    let chain = match &e.verdict {
                        Some((VERDICT_GOTO, Some(chain))) => Some(chain.as_str()),
                        // An earlier layout's `jump` (NetworkPolicy's maps): read for
                        // what it holds, the table made again.
                        Some((VERDICT_JUMP, Some(chain))) if tier.is_none() => {
                            rebuild = true;
                            Some(chain.as_str())
                        }
                        _ => None,
                    };
                    let profile = chain.and_then(|chain| match tier {
                        None => Direction::parse_chain(chain)
                            .filter(|(d, p)| *d == direction && held.profiles[i].contains_key(*p))
                            .map(|(_, p)| p.to_owned()),
                        Some(t) => ClusterTier::parse_chain(chain)
                            .filter(|(ct, d, p)| {
                                *ct == t
                                    && *d == direction
                                    && held.tiers[t.index()].profiles[i].contains_key(*p)
                            })
                            .map(|(_, _, p)| p.to_owned()),
                    });
                    match (ip, profile, tier) {
                        (Some(ip), Some(profile), None) => {
                            held.pods[i].insert(ip, profile);
                        }
                        (Some(ip), Some(profile), Some(t)) => {
                            held.tiers[t.index()].pods[i].insert(ip, profile);
                        }
                        _ => rebuild = true,
                    }
                }
            }
        }
    }
    Ok(View::Held {
        held: Box::new(held),
        rebuild,
    })
}

/// The tier, direction and profile of a tier profile's map of peers or of ranges, with
/// the map's spec.
fn tier_profile_map(name: &str) -> Option<(ClusterTier, Direction, &str, SetSpec<'_>)> {
    [Family::V4, Family::V6].into_iter().find_map(|family| {
        let peers = format!("-peers{}", family.digit());
        let ranges = format!("-ranges{}", family.digit());
        if let Some((t, d, p)) = name.strip_suffix(&peers).and_then(ClusterTier::parse_chain) {
            return Some((t, d, p, map_spec(name, family)));
        }
        let (t, d, p) = name
            .strip_suffix(&ranges)
            .and_then(ClusterTier::parse_chain)?;
        Some((t, d, p, tier_ranges_spec(name, family)))
    })
}

/// The peer rules and verdict chains of a profile chain whose rules are `have`, if
/// they are exactly what [`profile_rules`] makes of them (peer rules sorted, without
/// repeats).
pub(super) fn decode_profile_rules(
    direction: Direction,
    profile: &str,
    have: &[&Vec<Expr>],
) -> Option<(Vec<PeerRule>, Option<ProfileVerdicts>)> {
    let goto_of = |rule: &Vec<Expr>| match rule.last() {
        Some(Expr::Immediate {
            data:
                crate::nfnetlink::Data::Verdict {
                    code: VERDICT_GOTO,
                    chain: Some(chain),
                },
            ..
        }) => Some(chain.clone()),
        _ => None,
    };
    // The verdict chains, from the first rule (allowed) and the last (the rest).
    let verdicts = match (goto_of(have.first()?), goto_of(have.last()?)) {
        (Some(allow), Some(deny)) => Some(ProfileVerdicts { allow, deny }),
        _ => None,
    };
    let allowed = allowed_verdict(direction, verdicts.as_ref());
    let own = own_set_rules(direction, profile, &allowed);
    let (first, rest) = have.split_at_checked(own.len())?;
    let (last, middle) = rest.split_last()?;
    if !first.iter().zip(&own).all(|(h, w)| *h == w)
        || **last != vec![denied_verdict(verdicts.as_ref())]
        || middle.len() % FAMILIES.len() != 0
    {
        return None;
    }
    let mut peers = Vec::new();
    for pair in middle.chunks(FAMILIES.len()) {
        let mut decoded = pair
            .iter()
            .zip(FAMILIES)
            .map(|(rule, family)| decode_peer_rule(direction, family, rule, &allowed));
        let first = decoded.next()??;
        if !decoded.all(|d| d.as_ref() == Some(&first)) {
            return None;
        }
        peers.push(first);
    }
    (sorted_peers(&peers) == peers).then_some((peers, verdicts))
}

/// The addresses in the pending sets, with the pods they were added for (none when
/// the table or a set is missing).
pub(super) fn read_pending(nl: &mut Nfnl) -> Result<BTreeMap<IpAddr, Option<String>>> {
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
pub(super) fn releasable(
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
pub(super) fn all_not_found(e: &Error) -> bool {
    match e {
        Error::Multiple(all) => all.iter().all(is_not_found),
        e => is_not_found(e),
    }
}
