//! The difference between what the kernel holds and what is wanted, as one nf_tables
//! transaction: verdict chains, profiles (NetworkPolicy's and the tiers') and peer
//! sets added, changed (a few elements, or the whole set again when that costs the
//! kernel less) or removed, pods moved between profiles, pending addresses released;
//! and the fresh table when there is none.

use super::*;

pub(super) fn target() -> String {
    format!("table inet {TABLE}")
}

/// Adds the rules `rules` to the chain `chain`, in order.
fn add_rules(b: &mut Batch, chain: &str, rules: Vec<Vec<Expr>>) -> Result<()> {
    for rule in rules {
        b.add_rule(NFPROTO_INET, TABLE, chain, &rule, None)?;
    }
    Ok(())
}

/// Adds a chain of ours (no hook) with its rules.
fn add_chain_with_rules(b: &mut Batch, chain: &str, rules: Vec<Vec<Expr>>) -> Result<()> {
    b.add_chain(NFPROTO_INET, TABLE, chain, None, None)?;
    add_rules(b, chain, rules)
}

/// Adds a profile: its sets with their elements, then its chain and rules.
pub(super) fn add_profile(
    b: &mut Batch,
    c: &mut Changes,
    direction: Direction,
    name: &str,
    profile: &HeldProfile,
) -> Result<()> {
    for family in FAMILIES {
        let set = direction.set(name, family);
        b.add_set_spec(NFPROTO_INET, TABLE, &box_spec(&set, family));
        let elems: Vec<Element> = profile
            .boxes
            .iter()
            .filter(|a| a.family() == family)
            .map(box_element)
            .collect();
        c.boxes_added += elems.len();
        if !elems.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, &set, &elems)?;
        }
    }
    let chain = direction.chain(name);
    add_chain_with_rules(
        b,
        &chain,
        profile_rules(direction, name, &profile.peers, profile.verdicts.as_ref()),
    )?;
    c.profiles_added += 1;
    Ok(())
}

/// Adds a verdict chain with its rules.
pub(super) fn add_verdict_chain(
    b: &mut Batch,
    c: &mut Changes,
    name: &str,
    (action, log): HeldVerdict,
) -> Result<()> {
    add_chain_with_rules(b, name, verdict_rules(name, action, log))?;
    c.verdict_chains_added += 1;
    Ok(())
}

/// Writes a verdict chain's rules again (its counter starts again from zero).
pub(super) fn change_verdict_chain(
    b: &mut Batch,
    c: &mut Changes,
    name: &str,
    (action, log): HeldVerdict,
) -> Result<()> {
    b.flush_chain(NFPROTO_INET, TABLE, name);
    add_rules(b, name, verdict_rules(name, action, log))?;
    c.verdict_chains_changed += 1;
    Ok(())
}

/// The elements of a tier profile's maps of one family: its single peers and its
/// ranges, each a `goto` to its row's chain.
fn tier_peer_elements(
    tier: ClusterTier,
    direction: Direction,
    profile: &TierProfile,
    family: Family,
) -> (Vec<Element>, Vec<Element>) {
    let chain = |row: &str| tier.row_chain(direction, row);
    let peers = profile
        .peers
        .iter()
        .filter(|(ip, _)| Family::of(**ip) == family)
        .map(|(ip, row)| goto_element(*ip, chain(row)))
        .collect();
    let ranges = profile
        .ranges
        .iter()
        .filter(|r| Family::of(r.first) == family)
        .map(|r| tier_range_element(r, chain(&r.row)))
        .collect();
    (peers, ranges)
}

/// Adds a tier profile: its maps with their peers, then its chain and rules.
pub(super) fn add_tier_profile(
    b: &mut Batch,
    c: &mut Changes,
    tier: ClusterTier,
    direction: Direction,
    name: &str,
    profile: &TierProfile,
) -> Result<()> {
    for family in FAMILIES {
        let (peers_map, ranges_map) = (
            tier.peers_map(direction, name, family),
            tier.ranges_map(direction, name, family),
        );
        b.add_set_spec(NFPROTO_INET, TABLE, &map_spec(&peers_map, family));
        b.add_set_spec(NFPROTO_INET, TABLE, &tier_ranges_spec(&ranges_map, family));
        let (peers, ranges) = tier_peer_elements(tier, direction, profile, family);
        c.tier_peers_added += peers.len() + ranges.len();
        if !peers.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, &peers_map, &peers)?;
        }
        if !ranges.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, &ranges_map, &ranges)?;
        }
    }
    let chain = tier.chain(direction, name);
    add_chain_with_rules(b, &chain, tier_profile_rules(tier, direction, name))?;
    c.tier_profiles_added += 1;
    Ok(())
}

/// Changes a tier profile's peers: a single peer whose row changes is taken out and put
/// back (a hashed map takes an element out at the cost of a lookup); the ranges are
/// edited element by element, or, for a map of more than [`REBUILD_ABOVE`] ranges that
/// loses any, made anew with the chain's rules written again around it (see
/// [`change_profile`]).
pub(super) fn change_tier_profile(
    b: &mut Batch,
    c: &mut Changes,
    tier: ClusterTier,
    direction: Direction,
    name: &str,
    have: &TierProfile,
    want: &TierProfile,
) -> Result<()> {
    let chain = tier.chain(direction, name);
    let row_chain = |row: &str| tier.row_chain(direction, row);
    let rebuild: Vec<Family> = FAMILIES
        .into_iter()
        .filter(|family| {
            let ours = |r: &&TierRange| Family::of(r.first) == *family;
            have.ranges.iter().filter(ours).count() > REBUILD_ABOVE
                && have.ranges.difference(&want.ranges).any(|r| ours(&r))
        })
        .collect();
    if !rebuild.is_empty() {
        b.flush_chain(NFPROTO_INET, TABLE, &chain);
    }
    let (gone_peers, new_peers) = peer_changes(&have.peers, &want.peers);
    for family in FAMILIES {
        let ours = |ip: &IpAddr| Family::of(*ip) == family;
        let gone: Vec<Element> = gone_peers
            .iter()
            .filter(|ip| ours(ip))
            .map(|ip| addr_element(*ip))
            .collect();
        let new: Vec<Element> = new_peers
            .iter()
            .filter(|(ip, _)| ours(ip))
            .map(|(ip, row)| goto_element(*ip, row_chain(row)))
            .collect();
        let (gone, new) = edit_elements(b, &tier.peers_map(direction, name, family), gone, new)?;
        c.tier_peers_removed += gone;
        c.tier_peers_added += new;
        let ranges_map = tier.ranges_map(direction, name, family);
        let range = |r: &TierRange| tier_range_element(r, row_chain(&r.row));
        if rebuild.contains(&family) {
            b.delete_set(NFPROTO_INET, TABLE, &ranges_map);
            b.add_set_spec(NFPROTO_INET, TABLE, &tier_ranges_spec(&ranges_map, family));
            let (_, elems) = tier_peer_elements(tier, direction, want, family);
            if !elems.is_empty() {
                b.add_elements(NFPROTO_INET, TABLE, &ranges_map, &elems)?;
            }
            c.tier_peers_removed += have.ranges.iter().filter(|r| ours(&r.first)).count();
            c.tier_peers_added += elems.len();
            continue;
        }
        let gone: Vec<Element> = have
            .ranges
            .difference(&want.ranges)
            .filter(|r| ours(&r.first))
            .map(range)
            .collect();
        let new: Vec<Element> = want
            .ranges
            .difference(&have.ranges)
            .filter(|r| ours(&r.first))
            .map(range)
            .collect();
        let (gone, new) = edit_elements(b, &ranges_map, gone, new)?;
        c.tier_peers_removed += gone;
        c.tier_peers_added += new;
    }
    if !rebuild.is_empty() {
        add_rules(b, &chain, tier_profile_rules(tier, direction, name))?;
    }
    c.tier_profiles_changed += 1;
    Ok(())
}

/// The single peers to take out of a tier profile's maps (gone, or going to another
/// row) and to put in (new, or going to another row), in one pass over both maps (they
/// are sorted alike): a profile holds thousands of peers, of which a change moves a few.
fn peer_changes<'a>(
    have: &'a BTreeMap<IpAddr, Arc<str>>,
    want: &'a BTreeMap<IpAddr, Arc<str>>,
) -> (Vec<IpAddr>, Vec<(IpAddr, &'a Arc<str>)>) {
    let (mut gone, mut new) = (Vec::new(), Vec::new());
    let (mut old, mut now) = (have.iter().peekable(), want.iter().peekable());
    loop {
        match (old.peek(), now.peek()) {
            (None, None) => break,
            (Some((a, _)), Some((b, _))) if a == b => {
                let ((ip, was), (_, is)) = (
                    old.next().unwrap_or_else(|| unreachable!()),
                    now.next().unwrap_or_else(|| unreachable!()),
                );
                if !Arc::ptr_eq(was, is) && was != is {
                    gone.push(*ip);
                    new.push((*ip, is));
                }
            }
            (Some((a, _)), Some((b, _))) if a > b => {
                if let Some((ip, is)) = now.next() {
                    new.push((*ip, is));
                }
            }
            (Some(_), _) => {
                if let Some((ip, _)) = old.next() {
                    gone.push(*ip);
                }
            }
            (None, Some(_)) => {
                if let Some((ip, is)) = now.next() {
                    new.push((*ip, is));
                }
            }
        }
    }
    (gone, new)
}

/// Removes a tier profile (no map element may go to it any more).
pub(super) fn remove_tier_profile(
    b: &mut Batch,
    c: &mut Changes,
    tier: ClusterTier,
    direction: Direction,
    name: &str,
) {
    b.delete_chain(NFPROTO_INET, TABLE, &tier.chain(direction, name));
    for family in FAMILIES {
        b.delete_set(
            NFPROTO_INET,
            TABLE,
            &tier.peers_map(direction, name, family),
        );
        b.delete_set(
            NFPROTO_INET,
            TABLE,
            &tier.ranges_map(direction, name, family),
        );
    }
    c.tier_profiles_removed += 1;
}

/// Adds a tier row: its verdict map with its boxes, then its chain and rules.
pub(super) fn add_tier_row(
    b: &mut Batch,
    c: &mut Changes,
    tier: ClusterTier,
    direction: Direction,
    name: &str,
    boxes: &BTreeSet<TierBox>,
) -> Result<()> {
    let map = tier.row_map(direction, name);
    b.add_set_spec(NFPROTO_INET, TABLE, &tier_keys_spec(&map));
    let elems: Vec<Element> = boxes.iter().map(tier_box_element).collect();
    c.tier_boxes_added += elems.len();
    if !elems.is_empty() {
        b.add_elements(NFPROTO_INET, TABLE, &map, &elems)?;
    }
    let chain = tier.row_chain(direction, name);
    add_chain_with_rules(b, &chain, tier_row_rules(tier, direction, name))?;
    c.tier_rows_added += 1;
    Ok(())
}

/// Changes a tier row's boxes, element by element (a row holds a few boxes: those of
/// the rules that decide for its peers). A box whose verdict chain changes is taken out
/// and put back.
pub(super) fn change_tier_row(
    b: &mut Batch,
    c: &mut Changes,
    tier: ClusterTier,
    direction: Direction,
    name: &str,
    have: &BTreeSet<TierBox>,
    want: &BTreeSet<TierBox>,
) -> Result<()> {
    let gone: Vec<Element> = have.difference(want).map(tier_box_element).collect();
    let new: Vec<Element> = want.difference(have).map(tier_box_element).collect();
    let (gone, new) = edit_elements(b, &tier.row_map(direction, name), gone, new)?;
    c.tier_boxes_removed += gone;
    c.tier_boxes_added += new;
    c.tier_rows_changed += 1;
    Ok(())
}

/// Removes a tier row (no profile's peer may go to it any more).
pub(super) fn remove_tier_row(
    b: &mut Batch,
    c: &mut Changes,
    tier: ClusterTier,
    direction: Direction,
    name: &str,
) {
    b.delete_chain(NFPROTO_INET, TABLE, &tier.row_chain(direction, name));
    b.delete_set(NFPROTO_INET, TABLE, &tier.row_map(direction, name));
    c.tier_rows_removed += 1;
}

/// Adds a shared peer set: its two kernel sets with their addresses.
pub(super) fn add_peer_set(
    b: &mut Batch,
    c: &mut Changes,
    name: &str,
    addrs: &BTreeSet<IpAddr>,
) -> Result<()> {
    for family in FAMILIES {
        let set = peer_set(name, family);
        b.add_set_spec(NFPROTO_INET, TABLE, &peer_spec(&set, family));
        let elems: Vec<Element> = addrs
            .iter()
            .filter(|ip| Family::of(**ip) == family)
            .map(|ip| addr_element(*ip))
            .collect();
        c.peer_addresses_added += elems.len();
        if !elems.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, &set, &elems)?;
        }
    }
    c.peer_sets_added += 1;
    Ok(())
}

/// Changes a shared peer set's addresses, element by element (a hashed set takes
/// an element out at the cost of a lookup).
pub(super) fn change_peer_set(
    b: &mut Batch,
    c: &mut Changes,
    name: &str,
    have: &BTreeSet<IpAddr>,
    want: &BTreeSet<IpAddr>,
) -> Result<()> {
    for family in FAMILIES {
        let set = peer_set(name, family);
        let of = |ips: std::collections::btree_set::Difference<'_, IpAddr>| -> Vec<Element> {
            ips.filter(|ip| Family::of(**ip) == family)
                .map(|ip| addr_element(*ip))
                .collect()
        };
        let (gone, new) = edit_elements(
            b,
            &set,
            of(have.difference(want)),
            of(want.difference(have)),
        )?;
        c.peer_addresses_removed += gone;
        c.peer_addresses_added += new;
    }
    Ok(())
}

/// Takes `gone` out of the set (or map) `set` and puts `new` in, removals first;
/// returns how many of each.
pub(super) fn edit_elements(
    b: &mut Batch,
    set: &str,
    gone: Vec<Element>,
    new: Vec<Element>,
) -> Result<(usize, usize)> {
    if !gone.is_empty() {
        b.delete_elements(NFPROTO_INET, TABLE, set, &gone);
    }
    if !new.is_empty() {
        b.add_elements(NFPROTO_INET, TABLE, set, &new)?;
    }
    Ok((gone.len(), new.len()))
}

/// Removes a shared peer set (no rule may use it any more).
pub(super) fn remove_peer_set(b: &mut Batch, c: &mut Changes, name: &str) {
    for family in FAMILIES {
        b.delete_set(NFPROTO_INET, TABLE, &peer_set(name, family));
    }
    c.peer_sets_removed += 1;
}

/// Removes a profile (no map element may jump to it any more): the chain with its
/// rules, then its sets.
pub(super) fn remove_profile(b: &mut Batch, c: &mut Changes, direction: Direction, name: &str) {
    b.delete_chain(NFPROTO_INET, TABLE, &direction.chain(name));
    for family in FAMILIES {
        b.delete_set(NFPROTO_INET, TABLE, &direction.set(name, family));
    }
    c.profiles_removed += 1;
}

/// Above this many elements, a set that loses elements is made anew rather than
/// edited (see [`change_profile`]).
pub(super) const REBUILD_ABOVE: usize = 64;

/// Changes a profile's boxes, per family: added boxes go in as elements; removed
/// ones go out as elements while the set is small, but a set of more than
/// [`REBUILD_ABOVE`] elements that loses any is made anew, with all its elements, in
/// the same transaction (its chain's rules are flushed and added again around it).
/// Taking an element out of a set of concatenated ranges (the kernel's pipapo
/// backend) scans the set for the element's rules: measured on Linux 6.18, one
/// removal from a set of 3,300 elements cost up to 15 ms, where making the whole set
/// costs about 3.5 µs an element (12 ms); a change of a hundred profiles that each
/// lose a few elements took tens of seconds edited in place.
pub(super) fn change_profile(
    b: &mut Batch,
    c: &mut Changes,
    direction: Direction,
    name: &str,
    have_profile: &HeldProfile,
    want_profile: &HeldProfile,
) -> Result<()> {
    let (have, want) = (&have_profile.boxes, &want_profile.boxes);
    let of = |boxes: &BTreeSet<Allow>, family: Family| -> Vec<Allow> {
        boxes
            .iter()
            .filter(|a| a.family() == family)
            .cloned()
            .collect()
    };
    let rebuild: Vec<Family> = FAMILIES
        .into_iter()
        .filter(|family| {
            let held = have.iter().filter(|a| a.family() == *family).count();
            held > REBUILD_ABOVE && have.difference(want).any(|a| a.family() == *family)
        })
        .collect();
    let chain = direction.chain(name);
    // The chain's rules are written anew when its peer rules or verdict chains change,
    // or when one of its own sets is made anew (the sets are bound to the rules:
    // unbound first).
    let rewrite = !rebuild.is_empty()
        || have_profile.peers != want_profile.peers
        || have_profile.verdicts != want_profile.verdicts;
    if rewrite {
        b.flush_chain(NFPROTO_INET, TABLE, &chain);
    }
    for family in FAMILIES {
        let set = direction.set(name, family);
        if rebuild.contains(&family) {
            b.delete_set(NFPROTO_INET, TABLE, &set);
            b.add_set_spec(NFPROTO_INET, TABLE, &box_spec(&set, family));
            let elems: Vec<Element> = of(want, family).iter().map(box_element).collect();
            if !elems.is_empty() {
                b.add_elements(NFPROTO_INET, TABLE, &set, &elems)?;
            }
            c.boxes_removed += of(have, family).len();
            c.boxes_added += elems.len();
            continue;
        }
        let gone: Vec<Element> = have
            .difference(want)
            .filter(|a| a.family() == family)
            .map(box_element)
            .collect();
        let new: Vec<Element> = want
            .difference(have)
            .filter(|a| a.family() == family)
            .map(box_element)
            .collect();
        let (gone, new) = edit_elements(b, &set, gone, new)?;
        c.boxes_removed += gone;
        c.boxes_added += new;
    }
    if rewrite {
        let verdicts = want_profile.verdicts.as_ref();
        add_rules(
            b,
            &chain,
            profile_rules(direction, name, &want_profile.peers, verdicts),
        )?;
    }
    c.profiles_changed += 1;
    Ok(())
}

/// One pod's change in one map: whether its element is there to be removed, and the
/// profile of the element that replaces it.
#[derive(Debug, Clone, Copy)]
pub(super) struct PodChange<'a> {
    ip: IpAddr,
    remove: bool,
    add: Option<&'a str>,
}

/// Map changes of one direction of NetworkPolicy (`tier` `None`) or of a tier: per
/// family, removals first (a pod that changes profile is removed and added again),
/// then additions.
pub(super) fn write_pods(
    b: &mut Batch,
    c: &mut Changes,
    tier: Option<ClusterTier>,
    direction: Direction,
    pods: &[PodChange<'_>],
) -> Result<()> {
    for family in FAMILIES {
        let map = match tier {
            None => direction.map(family),
            Some(tier) => tier.map(direction, family),
        };
        let chain = |profile: &str| match tier {
            None => direction.chain(profile),
            Some(tier) => tier.chain(direction, profile),
        };
        let ours = || pods.iter().filter(|p| Family::of(p.ip) == family);
        let gone: Vec<Element> = ours()
            .filter(|p| p.remove)
            .map(|p| addr_element(p.ip))
            .collect();
        let new: Vec<Element> = ours()
            .filter_map(|p| Some(goto_element(p.ip, chain(p.add?))))
            .collect();
        let (gone, new) = edit_elements(b, &map, gone, new)?;
        if tier.is_some() {
            c.tier_pods_removed += gone;
            c.tier_pods_added += new;
        } else {
            c.pods_removed += gone;
            c.pods_added += new;
        }
    }
    Ok(())
}

/// The pod changes of one map from `have` to `want`, in one pass over both (sorted)
/// maps. A pod may only name a profile that `exists`; `removed` holds the profiles
/// that go, which pods left as they were must not name; `missing` is the error of a
/// pod that names a profile that is not there.
pub(super) fn pod_changes<'a>(
    have: &'a BTreeMap<IpAddr, String>,
    want: &'a BTreeMap<IpAddr, String>,
    exists: &dyn Fn(&str) -> bool,
    removed: &BTreeSet<&str>,
    missing: &dyn Fn(IpAddr, &str) -> Error,
) -> Result<Vec<PodChange<'a>>> {
    let check = |ip: IpAddr, name: &'a str| {
        if exists(name) {
            Ok(Some(name))
        } else {
            Err(missing(ip, name))
        }
    };
    let mut out = Vec::new();
    let mut old = have.iter().peekable();
    let mut new = want.iter().peekable();
    loop {
        let change = match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some((ip, _)), Some((nip, _))) if ip == nip => {
                let ((ip, was), (_, is)) = (
                    old.next().unwrap_or_else(|| unreachable!()),
                    new.next().unwrap_or_else(|| unreachable!()),
                );
                if was == is {
                    if removed.contains(is.as_str()) {
                        return Err(missing(*ip, is));
                    }
                    continue;
                }
                PodChange {
                    ip: *ip,
                    remove: true,
                    add: check(*ip, is)?,
                }
            }
            (Some((ip, _)), Some((nip, _))) if ip > nip => {
                let Some((ip, is)) = new.next() else { break };
                PodChange {
                    ip: *ip,
                    remove: false,
                    add: check(*ip, is)?,
                }
            }
            (Some(_), _) => {
                let Some((ip, _)) = old.next() else { break };
                PodChange {
                    ip: *ip,
                    remove: true,
                    add: None,
                }
            }
            (None, Some(_)) => {
                let Some((ip, is)) = new.next() else { break };
                PodChange {
                    ip: *ip,
                    remove: false,
                    add: check(*ip, is)?,
                }
            }
        };
        out.push(change);
    }
    Ok(out)
}

/// Takes `ips` out of the pending sets whether or not they are there: each is
/// added (a no-op when present) and deleted in the same transaction.
pub(super) fn unpend(b: &mut Batch, ips: &[IpAddr]) -> Result<()> {
    for family in FAMILIES {
        let elems: Vec<Element> = ips
            .iter()
            .filter(|ip| Family::of(**ip) == family)
            .map(|ip| addr_element(*ip))
            .collect();
        if !elems.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, family.pending(), &elems)?;
            b.delete_elements(NFPROTO_INET, TABLE, family.pending(), &elems);
        }
    }
    Ok(())
}

pub(super) fn finish(b: Batch, mut c: Changes) -> (Batch, Changes) {
    c.messages = b.messages();
    c.bytes = b.size();
    (b, c)
}

/// What a committed diff changes in the held state.
#[derive(Debug, Default)]
pub(super) struct Edits {
    /// Profiles added or changed, and removed (`None`).
    profiles: Vec<(Direction, String, Option<HeldProfile>)>,
    /// Peer sets added or changed, and removed (`None`).
    peer_sets: Vec<(String, Option<BTreeSet<IpAddr>>)>,
    /// Pods added or moved to another profile, and removed (`None`).
    pods: Vec<(Direction, IpAddr, Option<String>)>,
    /// Verdict chains added or changed, and removed (`None`).
    verdicts: Vec<(String, Option<HeldVerdict>)>,
    /// Tier profiles added or changed, and removed (`None`).
    tier_profiles: Vec<TierProfileEdit>,
    /// Tier rows added or changed, and removed (`None`).
    tier_rows: Vec<TierRowEdit>,
    /// Tier pods added or moved, and removed (`None`).
    tier_pods: Vec<(ClusterTier, Direction, IpAddr, Option<String>)>,
}

/// A tier profile added or changed, or removed (`None`).
type TierProfileEdit = (ClusterTier, Direction, String, Option<Arc<TierProfile>>);

/// A tier row added or changed (its boxes), or removed (`None`).
type TierRowEdit = (ClusterTier, Direction, String, Option<BTreeSet<TierBox>>);

impl Edits {
    pub(super) fn apply(self, held: &mut Held) {
        for (direction, name, profile) in self.profiles {
            let profiles = &mut held.profiles[direction.index()];
            match profile {
                Some(profile) => profiles.insert(name, profile),
                None => profiles.remove(&name),
            };
        }
        for (name, addrs) in self.peer_sets {
            match addrs {
                Some(addrs) => held.peer_sets.insert(name, addrs),
                None => held.peer_sets.remove(&name),
            };
        }
        for (direction, ip, profile) in self.pods {
            let pods = &mut held.pods[direction.index()];
            match profile {
                Some(profile) => pods.insert(ip, profile),
                None => pods.remove(&ip),
            };
        }
        for (name, verdict) in self.verdicts {
            match verdict {
                Some(verdict) => held.verdicts.insert(name, verdict),
                None => held.verdicts.remove(&name),
            };
        }
        for (tier, direction, name, profile) in self.tier_profiles {
            let profiles = &mut held.tiers[tier.index()].profiles[direction.index()];
            match profile {
                Some(profile) => profiles.insert(name, profile),
                None => profiles.remove(&name),
            };
        }
        for (tier, direction, name, boxes) in self.tier_rows {
            let rows = &mut held.tiers[tier.index()].rows[direction.index()];
            match boxes {
                Some(boxes) => rows.insert(name, boxes),
                None => rows.remove(&name),
            };
        }
        for (tier, direction, ip, profile) in self.tier_pods {
            let pods = &mut held.tiers[tier.index()].pods[direction.index()];
            match profile {
                Some(profile) => pods.insert(ip, profile),
                None => pods.remove(&ip),
            };
        }
    }
}

/// A peer set to add (no held addresses) or change: name, held addresses, wanted ones.
pub(super) type PeerSetChange<'a> = (
    &'a String,
    Option<&'a BTreeSet<IpAddr>>,
    &'a BTreeSet<IpAddr>,
);

/// The transaction from `have` to `want` that also resolves `resolve`, and what
/// it changes in `have`; `None` when there is nothing to send. New verdict chains,
/// peer sets and profiles come before what refers to them (profiles' rules and map
/// elements, pods' map elements), removed ones after what used them. The profiles of
/// `want` must have been checked ([`check_profiles`]); the pods are checked here:
/// every pod that changes, and those left as they were against the profiles `want`
/// drops.
pub(super) fn diff(
    have: &Held,
    want: &PolicyState,
    resolve: &[IpAddr],
) -> Result<Option<(Batch, Changes, Edits)>> {
    let mut edits = Edits::default();
    let mut new_profiles = Vec::new();
    let mut removed: [BTreeSet<&str>; 2] = Default::default();
    let mut pods = Vec::new();
    for direction in DIRECTIONS {
        let i = direction.index();
        let profiles = want.profiles(direction);
        for (name, profile) in profiles {
            let old = have.profiles[i].get(name);
            let peers = sorted_peers(&profile.peers);
            if old.is_none_or(|old| {
                !same_boxes(&old.boxes, &profile.allow)
                    || old.peers != peers
                    || old.verdicts != profile.verdicts
            }) {
                let profile = HeldProfile {
                    boxes: profile.allow.iter().cloned().collect(),
                    peers,
                    verdicts: profile.verdicts.clone(),
                };
                new_profiles.push((direction, name, old, profile));
            }
        }
        removed[i] = have.profiles[i]
            .keys()
            .filter(|name| !profiles.contains_key(*name))
            .map(String::as_str)
            .collect();
        pods.push(pod_changes(
            &have.pods[i],
            want.pods(direction),
            &|name| profiles.contains_key(name),
            &removed[i],
            &|ip, name| no_such_profile(direction, ip, name),
        )?);
    }
    // The tiers' rows, profiles and pods, likewise.
    let mut new_tier_rows = Vec::new();
    let mut removed_tier_rows = Vec::new();
    let mut new_tier_profiles = Vec::new();
    let mut removed_tier_profiles = Vec::new();
    let mut tier_pods = Vec::new();
    for tier in CLUSTER_TIERS {
        let state = tier.of(want);
        let held = &have.tiers[tier.index()];
        for direction in DIRECTIONS {
            let i = direction.index();
            let rows = state.rows(direction);
            for (name, row) in rows {
                let old = held.rows[i].get(name);
                if old.is_none_or(|old| !same_tier_boxes(old, &row.boxes)) {
                    let boxes: BTreeSet<TierBox> = row.boxes.iter().cloned().collect();
                    new_tier_rows.push((tier, direction, name, old, boxes));
                }
            }
            removed_tier_rows.extend(
                held.rows[i]
                    .keys()
                    .filter(|name| !rows.contains_key(*name))
                    .map(|name| (tier, direction, name)),
            );
            let profiles = state.profiles(direction);
            for (name, profile) in profiles {
                let old = held.profiles[i].get(name);
                if old.is_none_or(|old| !Arc::ptr_eq(old, profile) && old != profile) {
                    new_tier_profiles.push((tier, direction, name, old, profile));
                }
            }
            let gone: BTreeSet<&str> = held.profiles[i]
                .keys()
                .filter(|name| !profiles.contains_key(*name))
                .map(String::as_str)
                .collect();
            let changes = pod_changes(
                &held.pods[i],
                state.pods(direction),
                &|name| profiles.contains_key(name),
                &gone,
                &|ip, name| {
                    invalid(
                        format!("{} {} of pod {ip}", tier.name(), direction.name()),
                        format!("its profile {name:?} does not exist"),
                    )
                },
            )?;
            tier_pods.push((tier, direction, changes));
            removed_tier_profiles.extend(gone.into_iter().map(|name| (tier, direction, name)));
        }
    }
    let verdicts: Vec<(&String, Option<&HeldVerdict>, HeldVerdict)> = want
        .verdict_chains
        .iter()
        .filter_map(|(name, action)| {
            let wanted = held_verdict(want, *action);
            match have.verdicts.get(name) {
                Some(old) if *old == wanted => None,
                old => Some((name, old, wanted)),
            }
        })
        .collect();
    let removed_verdicts: Vec<&String> = have
        .verdicts
        .keys()
        .filter(|name| !want.verdict_chains.contains_key(*name))
        .collect();
    let changed_peer_sets: Vec<PeerSetChange<'_>> = want
        .peer_sets
        .iter()
        .filter_map(|(name, addrs)| match have.peer_sets.get(name) {
            Some(old) if old == addrs => None,
            old => Some((name, old, addrs)),
        })
        .collect();
    let removed_peer_sets: Vec<&String> = have
        .peer_sets
        .keys()
        .filter(|name| !want.peer_sets.contains_key(*name))
        .collect();
    let untouched = new_profiles.is_empty()
        && removed.iter().all(BTreeSet::is_empty)
        && pods.iter().all(Vec::is_empty)
        && changed_peer_sets.is_empty()
        && removed_peer_sets.is_empty()
        && new_tier_rows.is_empty()
        && removed_tier_rows.is_empty()
        && new_tier_profiles.is_empty()
        && removed_tier_profiles.is_empty()
        && tier_pods.iter().all(|(_, _, p)| p.is_empty())
        && verdicts.is_empty()
        && removed_verdicts.is_empty();
    if untouched && resolve.is_empty() {
        return Ok(None);
    }

    let mut b = Batch::new();
    let mut c = Changes::default();
    // Verdict chains first: profiles' rules and tier boxes go to them.
    for (name, old, verdict) in verdicts {
        match old {
            None => add_verdict_chain(&mut b, &mut c, name, verdict)?,
            Some(_) => change_verdict_chain(&mut b, &mut c, name, verdict)?,
        }
        edits.verdicts.push((name.clone(), Some(verdict)));
    }
    // Peer sets before the rules that use them, removed ones after.
    for (name, old, addrs) in changed_peer_sets {
        match old {
            None => add_peer_set(&mut b, &mut c, name, addrs)?,
            Some(old) => change_peer_set(&mut b, &mut c, name, old, addrs)?,
        }
        edits.peer_sets.push((name.clone(), Some(addrs.clone())));
    }
    for (direction, name, old, profile) in new_profiles {
        match old {
            None => add_profile(&mut b, &mut c, direction, name, &profile)?,
            Some(old) => change_profile(&mut b, &mut c, direction, name, old, &profile)?,
        }
        edits
            .profiles
            .push((direction, name.clone(), Some(profile)));
    }
    // Rows before the profiles whose peers go to them, removed ones after.
    for (tier, direction, name, old, boxes) in new_tier_rows {
        match old {
            None => add_tier_row(&mut b, &mut c, tier, direction, name, &boxes)?,
            Some(old) => change_tier_row(&mut b, &mut c, tier, direction, name, old, &boxes)?,
        }
        edits
            .tier_rows
            .push((tier, direction, name.clone(), Some(boxes)));
    }
    for (tier, direction, name, old, profile) in new_tier_profiles {
        match old {
            None => add_tier_profile(&mut b, &mut c, tier, direction, name, profile)?,
            Some(old) => change_tier_profile(&mut b, &mut c, tier, direction, name, old, profile)?,
        }
        edits
            .tier_profiles
            .push((tier, direction, name.clone(), Some(Arc::clone(profile))));
    }
    for (direction, changes) in DIRECTIONS.into_iter().zip(&pods) {
        write_pods(&mut b, &mut c, None, direction, changes)?;
        edits.pods.extend(
            changes
                .iter()
                .map(|p| (direction, p.ip, p.add.map(str::to_owned))),
        );
    }
    for (tier, direction, changes) in &tier_pods {
        write_pods(&mut b, &mut c, Some(*tier), *direction, changes)?;
        edits.tier_pods.extend(
            changes
                .iter()
                .map(|p| (*tier, *direction, p.ip, p.add.map(str::to_owned))),
        );
    }
    unpend(&mut b, resolve)?;
    c.pending_resolved = resolve.len();
    for (direction, names) in DIRECTIONS.into_iter().zip(&removed) {
        for name in names {
            remove_profile(&mut b, &mut c, direction, name);
            edits.profiles.push((direction, (*name).to_owned(), None));
        }
    }
    for (tier, direction, name) in removed_tier_profiles {
        remove_tier_profile(&mut b, &mut c, tier, direction, name);
        edits
            .tier_profiles
            .push((tier, direction, name.to_owned(), None));
    }
    for (tier, direction, name) in removed_tier_rows {
        remove_tier_row(&mut b, &mut c, tier, direction, name);
        edits.tier_rows.push((tier, direction, name.clone(), None));
    }
    for name in removed_peer_sets {
        remove_peer_set(&mut b, &mut c, name);
        edits.peer_sets.push((name.clone(), None));
    }
    for name in removed_verdicts {
        b.delete_chain(NFPROTO_INET, TABLE, name);
        c.verdict_chains_removed += 1;
        edits.verdicts.push((name.clone(), None));
    }
    let (b, c) = finish(b, c);
    Ok(Some((b, c, edits)))
}

/// The transaction that makes the table from scratch, run only if the rule set is
/// still at `generation`: the old table goes first if there is one (`replace`),
/// and the addresses still `pending` are carried over, with their pods. Chains come
/// before the rules and elements that go to them: the fixed chains empty, the
/// verdict chains, the profiles, then the fixed chains' rules and the pods.
pub(super) fn fresh(
    want: &Held,
    generation: u32,
    replace: bool,
    pending: &BTreeMap<IpAddr, Option<String>>,
) -> Result<(Batch, Changes)> {
    let mut b = Batch::at_generation(generation);
    let mut c = Changes {
        created: true,
        ..Changes::default()
    };
    if replace {
        b.delete_table(NFPROTO_INET, TABLE);
    }
    b.add_table(NFPROTO_INET, TABLE, None)?;
    for direction in DIRECTIONS {
        for family in FAMILIES {
            let map = direction.map(family);
            b.add_set_spec(NFPROTO_INET, TABLE, &map_spec(&map, family));
        }
    }
    for tier in CLUSTER_TIERS {
        for direction in DIRECTIONS {
            for family in FAMILIES {
                let map = tier.map(direction, family);
                b.add_set_spec(NFPROTO_INET, TABLE, &map_spec(&map, family));
            }
        }
    }
    for family in FAMILIES {
        b.add_set_spec(NFPROTO_INET, TABLE, &pending_spec(family));
    }
    for base in [Base::Forward, Base::Input] {
        b.add_chain(NFPROTO_INET, TABLE, base.name(), Some(base.hook()), None)?;
    }
    for fixed in Fixed::all() {
        b.add_chain(NFPROTO_INET, TABLE, &fixed.name(), None, None)?;
    }
    for (name, verdict) in &want.verdicts {
        add_verdict_chain(&mut b, &mut c, name, *verdict)?;
    }
    for (name, addrs) in &want.peer_sets {
        add_peer_set(&mut b, &mut c, name, addrs)?;
    }
    for direction in DIRECTIONS {
        for (name, profile) in &want.profiles[direction.index()] {
            add_profile(&mut b, &mut c, direction, name, profile)?;
        }
    }
    for tier in CLUSTER_TIERS {
        for direction in DIRECTIONS {
            let held = &want.tiers[tier.index()];
            for (name, boxes) in &held.rows[direction.index()] {
                add_tier_row(&mut b, &mut c, tier, direction, name, boxes)?;
            }
            for (name, profile) in &held.profiles[direction.index()] {
                add_tier_profile(&mut b, &mut c, tier, direction, name, profile)?;
            }
        }
    }
    for fixed in Fixed::all() {
        for rule in fixed.rules() {
            b.add_rule(NFPROTO_INET, TABLE, &fixed.name(), &rule, None)?;
        }
    }
    for base in [Base::Forward, Base::Input] {
        for rule in base_rules(base) {
            b.add_rule(NFPROTO_INET, TABLE, base.name(), &rule, None)?;
        }
    }
    let all = |pods: &BTreeMap<IpAddr, String>| -> Vec<(IpAddr, String)> {
        pods.iter().map(|(ip, p)| (*ip, p.clone())).collect()
    };
    for direction in DIRECTIONS {
        let pods = all(&want.pods[direction.index()]);
        let changes: Vec<PodChange<'_>> = pods
            .iter()
            .map(|(ip, profile)| PodChange {
                ip: *ip,
                remove: false,
                add: Some(profile),
            })
            .collect();
        write_pods(&mut b, &mut c, None, direction, &changes)?;
    }
    for tier in CLUSTER_TIERS {
        for direction in DIRECTIONS {
            let pods = all(&want.tiers[tier.index()].pods[direction.index()]);
            let changes: Vec<PodChange<'_>> = pods
                .iter()
                .map(|(ip, profile)| PodChange {
                    ip: *ip,
                    remove: false,
                    add: Some(profile),
                })
                .collect();
            write_pods(&mut b, &mut c, Some(tier), direction, &changes)?;
        }
    }
    for family in FAMILIES {
        let elems: Vec<Element> = pending
            .iter()
            .filter(|(ip, _)| Family::of(**ip) == family)
            .map(|(ip, pod)| Element {
                key: addr_bytes(*ip),
                comment: pod.clone(),
                ..Element::default()
            })
            .collect();
        if !elems.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, family.pending(), &elems)?;
        }
    }
    Ok(finish(b, c))
}
