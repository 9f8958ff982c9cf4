//! The difference between what the kernel holds and what is wanted, as one nf_tables
//! transaction: profiles and peer sets added, changed (a few elements, or the whole
//! set again when that costs the kernel less) or removed, pods moved between
//! profiles, pending addresses released; and the fresh table when there is none.

use super::*;

pub(super) fn target() -> String {
    format!("table inet {TABLE}")
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
    b.add_chain(NFPROTO_INET, TABLE, &chain, None, None)?;
    for rule in profile_rules(direction, name, &profile.peers) {
        b.add_rule(NFPROTO_INET, TABLE, &chain, &rule, None)?;
    }
    c.profiles_added += 1;
    Ok(())
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
    // The chain's rules are written anew when its peer rules change, or when one of
    // its own sets is made anew (the sets are bound to the rules: unbound first).
    let rewrite = !rebuild.is_empty() || have_profile.peers != want_profile.peers;
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
        for rule in profile_rules(direction, name, &want_profile.peers) {
            b.add_rule(NFPROTO_INET, TABLE, &chain, &rule, None)?;
        }
    }
    c.profiles_changed += 1;
    Ok(())
}

/// One pod's change in one direction's maps: whether its element is there to be
/// removed, and the profile of the element that replaces it.
#[derive(Debug, Clone, Copy)]
pub(super) struct PodChange<'a> {
    ip: IpAddr,
    remove: bool,
    add: Option<&'a str>,
}

/// Map changes of one direction: per family, removals first (a pod that changes
/// profile is removed and added again), then additions.
pub(super) fn write_pods(
    b: &mut Batch,
    c: &mut Changes,
    direction: Direction,
    pods: &[PodChange<'_>],
) -> Result<()> {
    for family in FAMILIES {
        let map = direction.map(family);
        let ours = || pods.iter().filter(|p| Family::of(p.ip) == family);
        let gone: Vec<Element> = ours()
            .filter(|p| p.remove)
            .map(|p| addr_element(p.ip))
            .collect();
        let new: Vec<Element> = ours()
            .filter_map(|p| Some(jump_element(p.ip, direction.chain(p.add?))))
            .collect();
        let (gone, new) = edit_elements(b, &map, gone, new)?;
        c.pods_removed += gone;
        c.pods_added += new;
    }
    Ok(())
}

/// The pod changes of one direction from `have` to `want`, in one pass over both
/// (sorted) maps. A pod may only name a profile of `want`; `removed` holds the
/// profiles `want` drops, which pods left as they were must not name.
pub(super) fn pod_changes<'a>(
    direction: Direction,
    have: &'a BTreeMap<IpAddr, String>,
    want: &'a PolicyState,
    removed: &BTreeSet<&str>,
) -> Result<Vec<PodChange<'a>>> {
    let profiles = want.profiles(direction);
    let exists = |ip: IpAddr, name: &'a str| {
        if profiles.contains_key(name) {
            Ok(Some(name))
        } else {
            Err(no_such_profile(direction, ip, name))
        }
    };
    let mut out = Vec::new();
    let mut old = have.iter().peekable();
    let mut new = want.pods(direction).iter().peekable();
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
                        return Err(no_such_profile(direction, *ip, is));
                    }
                    continue;
                }
                PodChange {
                    ip: *ip,
                    remove: true,
                    add: exists(*ip, is)?,
                }
            }
            (Some((ip, _)), Some((nip, _))) if ip > nip => {
                let Some((ip, is)) = new.next() else { break };
                PodChange {
                    ip: *ip,
                    remove: false,
                    add: exists(*ip, is)?,
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
                    add: exists(*ip, is)?,
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
}

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
    }
}

/// A peer set to add (no held addresses) or change: name, held addresses, wanted ones.
pub(super) type PeerSetChange<'a> = (
    &'a String,
    Option<&'a BTreeSet<IpAddr>>,
    &'a BTreeSet<IpAddr>,
);

/// The transaction from `have` to `want` that also resolves `resolve`, and what
/// it changes in `have`; `None` when there is nothing to send. New profiles come
/// before the map elements that jump to them, removed ones after the map elements
/// that used them. The profiles of `want` must have been checked
/// ([`check_profiles`]); the pods are checked here: every pod that changes, and
/// those left as they were against the profiles `want` drops.
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
            if old.is_none_or(|old| !same_boxes(&old.boxes, &profile.allow) || old.peers != peers) {
                let profile = HeldProfile {
                    boxes: profile.allow.iter().cloned().collect(),
                    peers,
                };
                new_profiles.push((direction, name, old, profile));
            }
        }
        removed[i] = have.profiles[i]
            .keys()
            .filter(|name| !profiles.contains_key(*name))
            .map(String::as_str)
            .collect();
        pods.push(pod_changes(direction, &have.pods[i], want, &removed[i])?);
    }
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
        && removed_peer_sets.is_empty();
    if untouched && resolve.is_empty() {
        return Ok(None);
    }

    let mut b = Batch::new();
    let mut c = Changes::default();
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
    for (direction, changes) in DIRECTIONS.into_iter().zip(&pods) {
        write_pods(&mut b, &mut c, direction, changes)?;
        edits.pods.extend(
            changes
                .iter()
                .map(|p| (direction, p.ip, p.add.map(str::to_owned))),
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
    for name in removed_peer_sets {
        remove_peer_set(&mut b, &mut c, name);
        edits.peer_sets.push((name.clone(), None));
    }
    let (b, c) = finish(b, c);
    Ok(Some((b, c, edits)))
}

/// The transaction that makes the table from scratch, run only if the rule set is
/// still at `generation`: the old table goes first if there is one (`replace`),
/// and the addresses still `pending` are carried over, with their pods.
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
    for family in FAMILIES {
        b.add_set_spec(NFPROTO_INET, TABLE, &pending_spec(family));
    }
    for base in [Base::Forward, Base::Input] {
        b.add_chain(NFPROTO_INET, TABLE, base.name(), Some(base.hook()), None)?;
        for rule in base_rules(base) {
            b.add_rule(NFPROTO_INET, TABLE, base.name(), &rule, None)?;
        }
    }
    for (name, addrs) in &want.peer_sets {
        add_peer_set(&mut b, &mut c, name, addrs)?;
    }
    for direction in DIRECTIONS {
        for (name, profile) in &want.profiles[direction.index()] {
            add_profile(&mut b, &mut c, direction, name, profile)?;
        }
    }
    for direction in DIRECTIONS {
        let pods: Vec<PodChange<'_>> = want.pods[direction.index()]
            .iter()
            .map(|(ip, profile)| PodChange {
                ip: *ip,
                remove: false,
                add: Some(profile),
            })
            .collect();
        write_pods(&mut b, &mut c, direction, &pods)?;
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
