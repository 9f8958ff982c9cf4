//! Checks of a desired [`PolicyState`] before anything is sent: names the kernel
//! takes, profiles and verdict chains that exist (and whose actions fit where they are
//! used), boxes sorted and disjoint; and its normal form, the [`Held`] state that is
//! compared with what the kernel holds.

use super::*;

pub(super) fn invalid(what: String, reason: String) -> Error {
    Error::InvalidPolicy { what, reason }
}

impl PolicyState {
    pub(super) fn profiles(&self, direction: Direction) -> &BTreeMap<String, Profile> {
        match direction {
            Direction::Ingress => &self.ingress_profiles,
            Direction::Egress => &self.egress_profiles,
        }
    }

    pub(super) fn pods(&self, direction: Direction) -> &BTreeMap<IpAddr, String> {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
}

/// Checks every profile's name and boxes. A tier profile that `held` (what the table
/// holds, when the apply diffs against it) holds the same was checked when it was
/// applied: its peers are looked at again only when one of its tier's rows goes.
pub(super) fn check_profiles(want: &PolicyState, held: Option<&Held>) -> Result<()> {
    for direction in DIRECTIONS {
        for (name, profile) in want.profiles(direction) {
            let what = || format!("{} profile {name:?}", direction.name());
            if !valid_name(name) {
                return Err(invalid(
                    what(),
                    format!("a profile name is 1 to {PROFILE_NAME_MAX} characters of [a-z0-9]"),
                ));
            }
            check_boxes(&profile.allow, &what)?;
            if let Some(v) = &profile.verdicts {
                for (chain, action) in [
                    (&v.allow, VerdictAction::Accept),
                    (&v.deny, VerdictAction::Drop),
                ] {
                    if want.verdict_chains.get(chain) != Some(&action) {
                        return Err(invalid(
                            what(),
                            format!(
                                "its verdict chain {chain:?} is not a verdict chain whose action is {action:?}"
                            ),
                        ));
                    }
                }
            }
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
    for name in want.verdict_chains.keys() {
        if !valid_verdict_chain(name) {
            return Err(invalid(
                format!("verdict chain {name:?}"),
                format!(
                    "a verdict chain name is v- and 1 to {PROFILE_NAME_MAX} characters of [a-z0-9]"
                ),
            ));
        }
    }
    for tier in CLUSTER_TIERS {
        let state = tier.of(want);
        for direction in DIRECTIONS {
            check_tier_rows(want, tier, direction)?;
            let rows = state.rows(direction);
            let held = held.map(|h| &h.tiers[tier.index()]);
            let rows_go = held.is_none_or(|h| {
                h.rows[direction.index()]
                    .keys()
                    .any(|row| !rows.contains_key(row))
            });
            for (name, profile) in state.profiles(direction) {
                let what = || format!("{} {} profile {name:?}", tier.name(), direction.name());
                if !valid_name(name) {
                    return Err(invalid(
                        what(),
                        format!("a profile name is 1 to {PROFILE_NAME_MAX} characters of [a-z0-9]"),
                    ));
                }
                let same = held
                    .and_then(|h| h.profiles[direction.index()].get(name))
                    .is_some_and(|old| Arc::ptr_eq(old, profile) || old == profile);
                if same && !rows_go {
                    continue;
                }
                let no_row = |peer: String, row: &str| {
                    invalid(
                        what(),
                        format!("peer {peer} goes to row {row:?}, which does not exist"),
                    )
                };
                // Peers share their rows' names (one `Arc` a row, as a caller makes
                // them): each name is looked up once.
                let mut seen: std::collections::HashSet<*const u8> = Default::default();
                for (ip, row) in &profile.peers {
                    if seen.insert(Arc::as_ptr(row).cast()) && !rows.contains_key(&**row) {
                        return Err(no_row(ip.to_string(), row));
                    }
                }
                let mut before: Option<&TierRange> = None;
                for r in &profile.ranges {
                    let range = format!("{}-{}", r.first, r.last);
                    if r.first.is_ipv4() != r.last.is_ipv4() || r.first > r.last {
                        return Err(invalid(
                            what(),
                            format!("{range} is no range of one family"),
                        ));
                    }
                    if let Some(b) = before
                        && b.first.is_ipv4() == r.first.is_ipv4()
                        && b.last >= r.first
                    {
                        return Err(invalid(
                            what(),
                            format!("ranges {}-{} and {range} overlap", b.first, b.last),
                        ));
                    }
                    if !rows.contains_key(&*r.row) {
                        return Err(no_row(range, &r.row));
                    }
                    before = Some(r);
                }
            }
            for (ip, name) in state.pods(direction) {
                if !state.profiles(direction).contains_key(name) {
                    return Err(invalid(
                        format!("{} {} of pod {ip}", tier.name(), direction.name()),
                        format!("its profile {name:?} does not exist"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Checks a tier's rows of one direction: names, boxes (each one, pairwise disjoint)
/// and the verdict chains they go to.
fn check_tier_rows(want: &PolicyState, tier: ClusterTier, direction: Direction) -> Result<()> {
    for (name, row) in tier.of(want).rows(direction) {
        let what = || format!("{} {} row {name:?}", tier.name(), direction.name());
        if !valid_name(name) {
            return Err(invalid(
                what(),
                format!("a row name is 1 to {PROFILE_NAME_MAX} characters of [a-z0-9]"),
            ));
        }
        let mut sorted: Vec<&TierBox> = row.boxes.iter().collect();
        sorted.sort();
        for (i, a) in sorted.iter().enumerate() {
            a.check(&what)?;
            for b in &sorted[i + 1..] {
                if b.protocols.0 > a.protocols.1 {
                    break;
                }
                if a.overlaps(b) {
                    return Err(invalid(what(), format!("boxes {a} and {b} overlap")));
                }
            }
            let fits = match want.verdict_chains.get(&*a.chain) {
                None => false,
                Some(VerdictAction::ToNetworkPolicy(d)) => {
                    tier == ClusterTier::Admin && *d == direction
                }
                Some(_) => true,
            };
            if !fits {
                return Err(invalid(
                    what(),
                    format!(
                        "box {a} goes to {:?}, which is no verdict chain this tier and direction may use",
                        a.chain
                    ),
                ));
            }
        }
    }
    Ok(())
}

impl TierState {
    pub(super) fn profiles(&self, direction: Direction) -> &BTreeMap<String, Arc<TierProfile>> {
        match direction {
            Direction::Ingress => &self.ingress_profiles,
            Direction::Egress => &self.egress_profiles,
        }
    }

    pub(super) fn rows(&self, direction: Direction) -> &BTreeMap<String, TierRow> {
        match direction {
            Direction::Ingress => &self.ingress_rows,
            Direction::Egress => &self.egress_rows,
        }
    }

    pub(super) fn pods(&self, direction: Direction) -> &BTreeMap<IpAddr, String> {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
}

/// A verdict chain as the table holds it once `want` is applied.
pub(super) fn held_verdict(want: &PolicyState, action: VerdictAction) -> HeldVerdict {
    let log = if action == VerdictAction::Drop {
        want.deny_log
    } else {
        None
    };
    (action, log)
}

/// The error of a pod whose profile is not in the state.
pub(super) fn no_such_profile(direction: Direction, ip: IpAddr, name: &str) -> Error {
    invalid(
        format!("{} of pod {ip}", direction.name()),
        format!("its profile {name:?} does not exist"),
    )
}

/// Checks `want` and puts it in the form the table is compared in.
pub(super) fn normalize(want: &PolicyState) -> Result<Held> {
    check_profiles(want, None)?;
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
    for tier in CLUSTER_TIERS {
        let state = tier.of(want);
        let t = &mut held.tiers[tier.index()];
        for direction in DIRECTIONS {
            let i = direction.index();
            t.pods[i] = state.pods(direction).clone();
            t.profiles[i] = state.profiles(direction).clone();
            t.rows[i] = state
                .rows(direction)
                .iter()
                .map(|(name, r)| (name.clone(), r.boxes.iter().cloned().collect()))
                .collect();
        }
    }
    held.verdicts = want
        .verdict_chains
        .iter()
        .map(|(name, action)| (name.clone(), held_verdict(want, *action)))
        .collect();
    Ok(held)
}

pub(super) fn held_profile(p: &Profile) -> HeldProfile {
    HeldProfile {
        boxes: p.allow.iter().cloned().collect(),
        peers: sorted_peers(&p.peers),
        verdicts: p.verdicts.clone(),
    }
}

/// Checks a profile's boxes one by one and for overlaps; `what` names the profile in
/// the error.
pub(super) fn check_boxes(allow: &[Allow], what: &dyn Fn() -> String) -> Result<()> {
    for a in allow {
        a.check(what)?;
    }
    // Sorted by first address: a box can only overlap the ones after it that start
    // before it ends. (The agent's boxes come sorted: then nothing is sorted here.)
    let mut sorted: Vec<&Allow> = allow.iter().collect();
    if !is_sorted(allow) {
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
pub(super) fn same_boxes(held: &BTreeSet<Allow>, allow: &[Allow]) -> bool {
    if held.len() != allow.len() {
        return false;
    }
    if is_sorted(allow) {
        held.iter().eq(allow.iter())
    } else {
        allow.iter().all(|a| held.contains(a))
    }
}

/// [`same_boxes`] for a tier profile's boxes.
pub(super) fn same_tier_boxes(held: &BTreeSet<TierBox>, boxes: &[TierBox]) -> bool {
    if held.len() != boxes.len() {
        return false;
    }
    if boxes.windows(2).all(|w| w[0] <= w[1]) {
        held.iter().eq(boxes.iter())
    } else {
        boxes.iter().all(|b| held.contains(b))
    }
}

pub(super) fn is_sorted(allow: &[Allow]) -> bool {
    allow.windows(2).all(|w| w[0] <= w[1])
}
