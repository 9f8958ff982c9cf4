//! Allocation: one address per range set, requested addresses first, otherwise
//! round-robin from `last_reserved_ip.<set>` (reference `allocator.go` and `cmdAdd`).
//!
//! An attachment whose reservation was released as made before this boot (see
//! [`crate::reboot`]) is first offered that same address again.
//!
//! What we add is a bounded search. The directory is read once under the lock; the
//! addresses it holds are skipped without a system call, and a set whose reservations
//! already fill it is reported exhausted without walking it. Since nothing else changes
//! the directory while we hold the lock, the first address not in that listing is free,
//! so a walk takes at most (#reservations in the set + 1) steps, even in a /64.

use crate::error::{Error, Result};
use crate::range::{RangeSet, to_u128};
use crate::store::{Entry, Locked};
use cni_protocol::IpConfig;
use std::collections::HashSet;
use std::net::IpAddr;

/// After this many unexpected `EEXIST`s (names that were not in our listing, which only
/// a writer ignoring the lock could cause) we give up instead of walking on.
const MAX_SURPRISES: usize = 1024;

/// The attachment being served.
#[derive(Debug, Clone, Copy)]
pub struct Attachment<'a> {
    /// `CNI_CONTAINERID`.
    pub id: &'a str,
    /// `CNI_IFNAME`.
    pub ifname: &'a str,
}

/// Allocates one address per set. On any failure, releases what this call reserved and
/// returns the reference's error (`failed to allocate for range <i>: ...` or
/// `failed to allocate all requested IPs: ...`).
pub fn allocate(
    store: &mut Locked<'_>,
    sets: &[RangeSet],
    requested: &[IpAddr],
    who: Attachment<'_>,
) -> Result<Vec<IpConfig>> {
    let mut pending: Vec<IpAddr> = requested.to_vec();
    let mut listing: Option<Vec<Entry>> = None;
    let mut made: Vec<IpConfig> = Vec::with_capacity(sets.len());
    for (index, set) in sets.iter().enumerate() {
        let wanted = pending
            .iter()
            .position(|ip| set.contains(*ip))
            .map(|i| pending.remove(i));
        let got = match wanted {
            Some(ip) => take_requested(store, set, index, ip, who),
            None => match &listing {
                Some(entries) => take_next(store, set, index, entries, who),
                None => store.scan().and_then(|entries| {
                    let got = take_next(store, set, index, &entries, who);
                    listing = Some(entries);
                    got
                }),
            },
        };
        match got {
            Ok(ip) => made.push(ip),
            Err(e) => {
                rollback(store, &made);
                return Err(Error::Range {
                    index,
                    source: Box::new(e),
                });
            }
        }
    }
    if !pending.is_empty() {
        rollback(store, &made);
        return Err(Error::Unfulfilled(pending));
    }
    if let Err(e) = store.step("reserved") {
        rollback(store, &made);
        return Err(e);
    }
    Ok(made)
}

/// Undoes this call's reservations (only those: the reference releases everything of
/// the attachment, which would also drop addresses an earlier ADD left behind).
fn rollback(store: &Locked<'_>, made: &[IpConfig]) {
    for ip in made {
        let _ = store.release(&ip.address.ip().to_string());
    }
}

fn take_requested(
    store: &mut Locked<'_>,
    set: &RangeSet,
    index: usize,
    ip: IpAddr,
    who: Attachment<'_>,
) -> Result<IpConfig> {
    let range = *set.range_for(ip).ok_or_else(|| Error::NotInRangeSet {
        ip,
        set: set.to_string(),
    })?;
    if ip == range.gateway {
        return Err(Error::RequestedGateway(ip));
    }
    if !store.reserve(ip, who.id, who.ifname, index)? {
        return Err(Error::RequestedTaken {
            ip,
            set: set.to_string(),
        });
    }
    Ok(IpConfig {
        address: range.with_prefix(ip),
        gateway: Some(range.gateway),
        interface: None,
    })
}

fn take_next(
    store: &mut Locked<'_>,
    set: &RangeSet,
    index: usize,
    entries: &[Entry],
    who: Attachment<'_>,
) -> Result<IpConfig> {
    let in_set: Vec<Entry> = entries
        .iter()
        .filter(|e| set.contains(e.ip))
        .cloned()
        .collect();
    // The duplicate guard: one attachment holds at most one address per set. (The
    // first in name order is named, as in the reference's lexical walk.)
    if let Some((entry, _)) = store
        .owned_by(&in_set, who.id, who.ifname)
        .into_iter()
        .next()
    {
        return Err(Error::Duplicate {
            ip: entry.ip,
            id: who.id.to_string(),
        });
    }
    let taken: HashSet<u128> = in_set
        .iter()
        .filter(|e| set.allocatable(e.ip))
        .map(|e| to_u128(e.ip))
        .collect();
    let exhausted = || Error::Exhausted(set.to_string());
    if taken.len() as u128 >= set.capacity() {
        return Err(exhausted());
    }
    // An owner whose reservation was released as older than this boot gets the same
    // address back while it is free (a re-ADD after a reboot); otherwise round-robin.
    for ip in store.previous_addresses(who.id, who.ifname) {
        let Some(range) = set.range_for(ip).copied() else {
            continue;
        };
        if ip == range.gateway || taken.contains(&to_u128(ip)) {
            continue;
        }
        if store.reserve(ip, who.id, who.ifname, index)? {
            return Ok(IpConfig {
                address: range.with_prefix(ip),
                gateway: Some(range.gateway),
                interface: None,
            });
        }
    }
    let mut surprises = 0;
    for (ip, range) in set.iter_from(store.last_reserved(index)) {
        if taken.contains(&to_u128(ip)) {
            continue;
        }
        if store.reserve(ip, who.id, who.ifname, index)? {
            return Ok(IpConfig {
                address: range.with_prefix(ip),
                gateway: Some(range.gateway),
                interface: None,
            });
        }
        surprises += 1;
        if surprises > MAX_SURPRISES {
            break;
        }
    }
    Err(exhausted())
}

/// Whether every set still has a free address (STATUS), from an unlocked listing.
pub fn first_exhausted<'s>(sets: &'s [RangeSet], entries: &[Entry]) -> Option<&'s RangeSet> {
    sets.iter().find(|set| {
        let taken: HashSet<IpAddr> = entries
            .iter()
            .filter(|e| set.allocatable(e.ip))
            .map(|e| e.ip)
            .collect();
        taken.len() as u128 >= set.capacity()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range::RangeSpec;
    use crate::store::Store;
    use crate::store::tests::TempDir;
    use std::time::Duration;

    fn set(subnet: &str, start: Option<&str>, end: Option<&str>) -> RangeSet {
        RangeSet::canonicalize(&[RangeSpec {
            subnet: Some(subnet.into()),
            range_start: start.map(String::from),
            range_end: end.map(String::from),
            gateway: None,
        }])
        .unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const A: Attachment<'static> = Attachment {
        id: "c1",
        ifname: "eth0",
    };

    fn who(id: &str) -> Attachment<'_> {
        Attachment { id, ifname: "eth0" }
    }

    fn addrs(ips: &[IpConfig]) -> Vec<String> {
        ips.iter().map(|c| c.address.to_string()).collect()
    }

    #[test]
    fn round_robin_order_and_release() {
        let tmp = TempDir::new("rr");
        let store = Store::open(&tmp.0, "n").unwrap();
        let sets = [set("10.8.0.0/29", None, None)];
        let mut got = Vec::new();
        for id in ["a", "b", "c"] {
            let mut l = store.lock(Duration::from_secs(1)).unwrap();
            got.extend(addrs(&allocate(&mut l, &sets, &[], who(id)).unwrap()));
        }
        assert_eq!(got, ["10.8.0.2/29", "10.8.0.3/29", "10.8.0.4/29"]);
        // Releasing .2 does not make it next: round robin continues after .4.
        let mut l = store.lock(Duration::from_secs(1)).unwrap();
        l.release("10.8.0.2").unwrap();
        let next = allocate(&mut l, &sets, &[], who("d")).unwrap();
        assert_eq!(addrs(&next), ["10.8.0.5/29"]);
        assert_eq!(next[0].gateway, Some(ip("10.8.0.1")));
        assert_eq!(
            addrs(&allocate(&mut l, &sets, &[], who("e")).unwrap()),
            ["10.8.0.6/29"]
        );
        // Wraps around to the freed .2.
        assert_eq!(
            addrs(&allocate(&mut l, &sets, &[], who("f")).unwrap()),
            ["10.8.0.2/29"]
        );
        let err = allocate(&mut l, &sets, &[], who("g")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "failed to allocate for range 0: no IP addresses available in range set: 10.8.0.1-10.8.0.6"
        );
    }

    #[test]
    fn duplicate_guard_per_set() {
        let tmp = TempDir::new("dup");
        let store = Store::open(&tmp.0, "n").unwrap();
        let sets = [
            set("10.9.0.0/24", None, None),
            set("fd00:9::/64", None, None),
        ];
        let mut l = store.lock(Duration::from_secs(1)).unwrap();
        assert_eq!(
            addrs(&allocate(&mut l, &sets, &[], A).unwrap()),
            ["10.9.0.2/24", "fd00:9::2/64"]
        );
        let err = allocate(&mut l, &sets, &[], A).unwrap_err();
        assert_eq!(
            err.to_string(),
            "failed to allocate for range 0: 10.9.0.2 has been allocated to c1, duplicate allocation is not allowed"
        );
        // Same id, other ifname: fine.
        let other = Attachment {
            id: "c1",
            ifname: "eth1",
        };
        assert_eq!(
            addrs(&allocate(&mut l, &sets, &[], other).unwrap()),
            ["10.9.0.3/24", "fd00:9::3/64"]
        );
    }

    #[test]
    fn requested_ips() {
        let tmp = TempDir::new("req");
        let store = Store::open(&tmp.0, "n").unwrap();
        let sets = [
            set("10.9.0.0/24", None, None),
            set("fd00:9::/64", None, None),
        ];
        let mut l = store.lock(Duration::from_secs(1)).unwrap();
        let got = allocate(&mut l, &sets, &[ip("10.9.0.77")], A).unwrap();
        assert_eq!(addrs(&got), ["10.9.0.77/24", "fd00:9::2/64"]);
        let e = |r: Result<Vec<IpConfig>>| r.unwrap_err().to_string();
        assert_eq!(
            e(allocate(&mut l, &sets, &[ip("10.9.0.77")], who("x"))),
            "failed to allocate for range 0: requested IP address 10.9.0.77 is not available in range set 10.9.0.1-10.9.0.254"
        );
        assert_eq!(
            e(allocate(&mut l, &sets, &[ip("10.9.0.1")], who("x"))),
            "failed to allocate for range 0: requested ip 10.9.0.1 is subnet's gateway"
        );
        assert_eq!(
            e(allocate(&mut l, &sets, &[ip("10.10.0.77")], who("x"))),
            "failed to allocate all requested IPs: 10.10.0.77"
        );
        // Nothing of x's failed attempts is left behind.
        let l2 = l.scan().unwrap();
        let names: Vec<&str> = l2.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["10.9.0.77", "fd00:9::2"]);
    }

    #[test]
    fn later_set_failure_releases_earlier_sets() {
        let tmp = TempDir::new("rollback");
        let store = Store::open(&tmp.0, "n").unwrap();
        let sets = [
            set("10.9.0.0/24", None, None),
            set("10.8.0.0/30", None, None),
        ];
        let mut l = store.lock(Duration::from_secs(1)).unwrap();
        allocate(&mut l, &sets, &[], who("first")).unwrap();
        let err = allocate(&mut l, &sets, &[], who("second")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "failed to allocate for range 1: no IP addresses available in range set: 10.8.0.1-10.8.0.2"
        );
        assert_eq!(l.scan().unwrap().len(), 2, "second's 10.9.0.3 was released");
    }

    #[test]
    fn exhaustion_of_a_huge_range_is_found_without_walking() {
        let tmp = TempDir::new("huge");
        let store = Store::open(&tmp.0, "n").unwrap();
        // A /64 limited to 4 addresses by start/end, placed at the end so a wrap is
        // needed; then a full /64 with a few files: both answer at once.
        let small = [set("fd00::/64", Some("fd00::ffff:ffff:ffff:fffc"), None)];
        let mut l = store.lock(Duration::from_secs(1)).unwrap();
        for id in ["a", "b", "c", "d"] {
            allocate(&mut l, &small, &[], who(id)).unwrap();
        }
        assert!(matches!(
            allocate(&mut l, &small, &[], who("e")),
            Err(Error::Range { .. })
        ));
        let big = [set("fd00::/64", None, None)];
        let got = allocate(&mut l, &big, &[], who("f")).unwrap();
        // The cursor of set 0 is fd00::ffff:ffff:ffff:ffff; wrap to the first free one.
        assert_eq!(addrs(&got), ["fd00::2/64"]);
    }

    #[test]
    fn status_view() {
        let sets = [set("10.8.0.0/30", None, None), set("fd00::/64", None, None)];
        let entry = |s: &str| Entry {
            ip: ip(s),
            name: s.into(),
        };
        assert!(first_exhausted(&sets, &[entry("10.8.0.1")]).is_none());
        assert_eq!(
            first_exhausted(&sets, &[entry("10.8.0.2")]).map(ToString::to_string),
            Some("10.8.0.1-10.8.0.2".to_string())
        );
    }
}
