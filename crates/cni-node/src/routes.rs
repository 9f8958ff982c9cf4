//! Makes the main table's routes to other nodes' pod CIDRs, and the VXLAN devices'
//! per-peer entries, equal the plan, touching only routes marked with the agent's
//! protocol number and entries on the agent's own devices.
//!
//! Everything goes to the kernel as one ordered batch ([`RouteTable::apply`], in
//! datagrams of a few hundred requests), so thousands of peers take a few exchanges:
//!
//! 1. routes of ours that are no longer planned are deleted, first, so that no route
//!    ever points at a neighbour or FDB entry that is gone;
//! 2. FDB entries (remote VTEP MAC -> remote underlay address) and neighbour entries
//!    (remote VTEP address -> VTEP MAC) that are missing or differ are written;
//! 3. routes that are missing or differ are written, in place (`replace`): a changed
//!    next hop, and a switch between direct and encapsulated, leave no moment without
//!    a route. IPv6 refuses to replace a route through the uplink by an onlink one
//!    through the VXLAN device (the onlink gateway is checked against the route being
//!    replaced): a host route to the VTEP through the device goes just before the
//!    replacement and is deleted just after, in the same batch;
//! 4. neighbour and FDB entries no peer needs are deleted, last.
//!
//! A destination that already has a route of someone else's is left alone and
//! reported.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use cni_linux::MacAddr;
use cni_linux::netlink::{Change, Netlink, Route};
use ipnetwork::IpNetwork;

use crate::error::Error;
use crate::host::{DeviceEntries, HostState, MAIN_TABLE};
use crate::overlay::ReadyDevice;
use crate::plan::NextHop;

/// What one reconciliation did and found.
#[derive(Debug, Default)]
pub struct RouteChanges {
    /// Routes added.
    pub added: Vec<(IpNetwork, NextHop)>,
    /// Routes whose next hop was changed in place.
    pub replaced: Vec<(IpNetwork, NextHop)>,
    /// Routes of ours removed.
    pub removed: Vec<IpNetwork>,
    /// FDB and neighbour entries written and deleted.
    pub entries: (usize, usize),
    /// Planned destinations that someone else already routes: (destination, their route).
    pub foreign: Vec<(IpNetwork, String)>,
    /// Encapsulated peers in the kernel after the pass, IPv4 and IPv6.
    pub tunnels: (usize, usize),
    /// Routes through the WireGuard device after the pass, IPv4 and IPv6.
    pub encrypted: (usize, usize),
    /// The ready devices' entries after the pass, by device index, as far as the
    /// kernel's answers tell; `None` when a batch failed as a whole (read them back).
    pub entries_after: Option<BTreeMap<u32, DeviceEntries>>,
    /// Requests the kernel refused, and a batch that failed as a whole.
    pub failed: Vec<Error>,
}

impl RouteChanges {
    /// Whether anything changed in the kernel.
    pub fn changed(&self) -> bool {
        !(self.added.is_empty()
            && self.replaced.is_empty()
            && self.removed.is_empty()
            && self.entries == (0, 0))
    }
}

/// The netlink requests a reconciliation makes: a trait so the decisions are tested
/// without a kernel.
pub trait RouteTable: Send {
    /// Makes `changes` in order and returns each one's outcome (see
    /// [`Netlink::apply`]).
    fn apply(&self, changes: &[Change]) -> cni_linux::Result<Vec<cni_linux::Result<()>>>;
}

impl RouteTable for Netlink {
    fn apply(&self, changes: &[Change]) -> cni_linux::Result<Vec<cni_linux::Result<()>>> {
        Netlink::apply(self, changes)
    }
}

/// The route the agent makes for `dst` via `gw` on this node's link.
pub fn our_route(dst: IpNetwork, gw: IpAddr, protocol: u8) -> Route {
    Route {
        gw: Some(gw),
        table: Some(MAIN_TABLE),
        protocol: Some(protocol),
        ..Route::new(dst)
    }
}

/// The route the agent makes for `dst` via the remote VTEP `vtep` through the VXLAN
/// device `index`.
pub fn tunnel_route(dst: IpNetwork, vtep: IpAddr, index: u32, protocol: u8) -> Route {
    Route {
        gw: Some(vtep),
        oif: Some(index),
        onlink: true,
        table: Some(MAIN_TABLE),
        protocol: Some(protocol),
        ..Route::new(dst)
    }
}

/// The route the agent makes for `dst` through the WireGuard device `index`: no
/// gateway, the device sends it to the peer whose allowed IPs hold it.
pub fn encrypted_route(dst: IpNetwork, index: u32, protocol: u8) -> Route {
    Route {
        oif: Some(index),
        scope: Some(SCOPE_LINK),
        table: Some(MAIN_TABLE),
        protocol: Some(protocol),
        ..Route::new(dst)
    }
}

/// `RT_SCOPE_LINK`, what `ip route add <dst> dev <link>` gives a route without a gateway.
const SCOPE_LINK: u8 = 253;

/// What a change of the batch stands for, to account for its outcome.
#[derive(Debug, Clone, Copy)]
enum Meaning {
    Add(IpNetwork, NextHop),
    Replace(IpNetwork, NextHop),
    Remove(IpNetwork),
    WriteEntry,
    DeleteEntry,
    /// The IPv6 host route around a replacement.
    Scaffold,
}

/// The ordered batch that brings the kernel from `host` to `want`, with what each change
/// stands for, the foreign destinations, and the tunnels it leaves.
#[derive(Debug, Default)]
struct Batch {
    route_deletions: Vec<(Change, Meaning)>,
    entry_writes: Vec<(Change, Meaning)>,
    route_writes: Vec<(Change, Meaning)>,
    entry_deletions: Vec<(Change, Meaning)>,
    foreign: Vec<(IpNetwork, String)>,
    tunnels: (usize, usize),
    encrypted: (usize, usize),
    /// What each ready device held before the batch.
    have: BTreeMap<u32, DeviceEntries>,
}

/// Brings the table and the devices' entries from `host` (as read just before) to
/// `want`; `devices` are the VXLAN devices ready for entries, by family (`true`:
/// IPv6). A tunnel whose device is not ready is left as it is (its failure is the
/// device's).
pub fn reconcile(
    table: &dyn RouteTable,
    host: &HostState,
    want: &BTreeMap<IpNetwork, NextHop>,
    devices: &BTreeMap<bool, ReadyDevice>,
    protocol: u8,
) -> RouteChanges {
    let batch = plan_batch(host, want, devices, protocol);
    let mut entries = batch.have;
    let mut changes = RouteChanges {
        foreign: batch.foreign,
        tunnels: batch.tunnels,
        encrypted: batch.encrypted,
        ..RouteChanges::default()
    };
    let steps: Vec<(Change, Meaning)> = batch
        .route_deletions
        .into_iter()
        .chain(batch.entry_writes)
        .chain(batch.route_writes)
        .chain(batch.entry_deletions)
        .collect();
    if steps.is_empty() {
        changes.entries_after = Some(entries);
        return changes;
    }
    let requests: Vec<Change> = steps.iter().map(|(c, _)| *c).collect();
    let outcomes = match table.apply(&requests) {
        Ok(outcomes) => outcomes,
        Err(source) => {
            changes.failed.push(Error::Batch {
                count: requests.len(),
                source,
            });
            return changes;
        }
    };
    for ((change, meaning), outcome) in steps.into_iter().zip(outcomes) {
        let deletion = matches!(
            change,
            Change::DelRoute(_) | Change::DelFdbEntry { .. } | Change::DelNeighbour { .. }
        );
        let outcome = match outcome {
            Err(e) if deletion && e.is_not_found() => Ok(()),
            other => other,
        };
        track(&mut entries, &change, outcome.is_ok());
        match (meaning, outcome) {
            (Meaning::Add(dst, hop), Ok(())) => changes.added.push((dst, hop)),
            (Meaning::Replace(dst, hop), Ok(())) => changes.replaced.push((dst, hop)),
            (Meaning::Remove(dst), Ok(())) => changes.removed.push(dst),
            (Meaning::WriteEntry, Ok(())) => changes.entries.0 += 1,
            (Meaning::DeleteEntry, Ok(())) => changes.entries.1 += 1,
            (Meaning::Scaffold, Ok(())) => {}
            (_, Err(e)) => changes.failed.push(match change {
                Change::ReplaceRoute(r) => Error::route("replace", r.dst, r.gw, e),
                Change::DelRoute(r) => Error::route("delete", r.dst, r.gw, e),
                _ => Error::VxlanEntry(e),
            }),
        }
    }
    changes.entries_after = Some(entries);
    changes
}

/// What a device holds after an entry change: a refused write leaves the entry
/// unknown (dropped, so the next pass writes it again), a refused deletion leaves it
/// there.
fn track(entries: &mut BTreeMap<u32, DeviceEntries>, change: &Change, done: bool) {
    match *change {
        Change::ReplaceFdbEntry { index, mac, dst } => {
            let fdb = &mut entries.entry(index).or_default().fdb;
            if done {
                fdb.insert(mac.0, dst);
            } else {
                fdb.remove(&mac.0);
            }
        }
        Change::DelFdbEntry { index, mac, .. } if done => {
            entries.entry(index).or_default().fdb.remove(&mac.0);
        }
        Change::ReplaceNeighbour { index, ip, mac } => {
            let neighbours = &mut entries.entry(index).or_default().neighbours;
            if done {
                neighbours.insert(ip, mac);
            } else {
                neighbours.remove(&ip);
            }
        }
        Change::DelNeighbour { index, ip } if done => {
            entries.entry(index).or_default().neighbours.remove(&ip);
        }
        _ => {}
    }
}

/// The batch, without effects.
fn plan_batch(
    host: &HostState,
    want: &BTreeMap<IpNetwork, NextHop>,
    devices: &BTreeMap<bool, ReadyDevice>,
    protocol: u8,
) -> Batch {
    let mut batch = Batch::default();
    let mut ours: BTreeMap<IpNetwork, Vec<&Route>> = BTreeMap::new();
    for route in &host.ours {
        ours.entry(route.dst).or_default().push(route);
    }
    // Per family: wanted FDB entries (MAC -> underlay) and neighbours (VTEP -> MAC).
    let mut fdb: BTreeMap<bool, BTreeMap<[u8; 6], IpAddr>> = BTreeMap::new();
    let mut neighbours: BTreeMap<bool, BTreeMap<IpAddr, MacAddr>> = BTreeMap::new();
    for (&dst, &hop) in want {
        if let Some(theirs) = host.foreign.get(&dst) {
            let text = theirs.iter().map(describe).collect::<Vec<_>>().join(", ");
            batch.foreign.push((dst, text));
            continue;
        }
        let route = match hop {
            NextHop::Direct(gw) => our_route(dst, gw, protocol),
            NextHop::Tunnel(t) => {
                let v6 = dst.is_ipv6();
                let Some(device) = devices.get(&v6) else {
                    // Left as it is: neither added nor removed.
                    ours.remove(&dst);
                    continue;
                };
                fdb.entry(v6).or_default().insert(t.mac.0, t.underlay);
                neighbours.entry(v6).or_default().insert(t.vtep, t.mac);
                if v6 {
                    batch.tunnels.1 += 1;
                } else {
                    batch.tunnels.0 += 1;
                }
                tunnel_route(dst, t.vtep, device.index, protocol)
            }
            NextHop::Encrypted(e) => {
                if dst.is_ipv6() {
                    batch.encrypted.1 += 1;
                } else {
                    batch.encrypted.0 += 1;
                }
                encrypted_route(dst, e.device, protocol)
            }
        };
        match ours.remove(&dst).as_deref() {
            Some([only]) if is_as_made(only, &route) => {}
            Some([only]) => {
                let scaffold = needs_scaffold(only, &route);
                if let Some(host_route) = scaffold {
                    batch
                        .route_writes
                        .push((Change::ReplaceRoute(host_route), Meaning::Scaffold));
                }
                batch
                    .route_writes
                    .push((Change::ReplaceRoute(route), Meaning::Replace(dst, hop)));
                if let Some(host_route) = scaffold {
                    batch
                        .route_writes
                        .push((Change::DelRoute(host_route), Meaning::Scaffold));
                }
            }
            Some(several) => {
                // Duplicates (left by a hand or an older agent): keep the right one, if
                // any, delete the rest, then add the right one if it was not there.
                for extra in several.iter().filter(|r| !is_as_made(r, &route)) {
                    batch
                        .route_deletions
                        .push((Change::DelRoute(**extra), Meaning::Remove(dst)));
                }
                if !several.iter().any(|r| is_as_made(r, &route)) {
                    batch
                        .route_writes
                        .push((Change::ReplaceRoute(route), Meaning::Add(dst, hop)));
                }
            }
            None => batch
                .route_writes
                .push((Change::ReplaceRoute(route), Meaning::Add(dst, hop))),
        }
    }
    // Ours that are no longer planned, and ours shadowed by a foreign route.
    for (dst, routes) in ours {
        for route in routes {
            batch
                .route_deletions
                .push((Change::DelRoute(*route), Meaning::Remove(dst)));
        }
    }
    for (&v6, device) in devices {
        // A fresh device holds nothing yet; entries not read are taken as absent
        // (written again: a replacement of an entry that is there changes nothing).
        let have = host
            .overlay
            .iter()
            .find(|s| s.link.index == device.index && !device.fresh)
            .and_then(|s| s.entries.clone())
            .unwrap_or_default();
        let want_fdb = fdb.remove(&v6).unwrap_or_default();
        let want_neighbours = neighbours.remove(&v6).unwrap_or_default();
        let (have_fdb, have_neighbours) = (&have.fdb, &have.neighbours);
        let index = device.index;
        for (&mac, &dst) in &want_fdb {
            if have_fdb.get(&mac) != Some(&dst) {
                let change = Change::ReplaceFdbEntry {
                    index,
                    mac: MacAddr(mac),
                    dst,
                };
                batch.entry_writes.push((change, Meaning::WriteEntry));
            }
        }
        for (&ip, &mac) in &want_neighbours {
            if have_neighbours.get(&ip) != Some(&mac) {
                let change = Change::ReplaceNeighbour { index, ip, mac };
                batch.entry_writes.push((change, Meaning::WriteEntry));
            }
        }
        // Neighbours before FDB entries, the reverse of their making.
        for &ip in have_neighbours.keys() {
            if !want_neighbours.contains_key(&ip) {
                let change = Change::DelNeighbour { index, ip };
                batch.entry_deletions.push((change, Meaning::DeleteEntry));
            }
        }
        let stale: BTreeSet<[u8; 6]> = have_fdb
            .keys()
            .filter(|m| !want_fdb.contains_key(*m))
            .copied()
            .collect();
        for mac in stale {
            let change = Change::DelFdbEntry {
                index,
                mac: MacAddr(mac),
                dst: None,
            };
            batch.entry_deletions.push((change, Meaning::DeleteEntry));
        }
        batch.have.insert(index, have);
    }
    batch
}

/// Whether `have` (read from the kernel) is `want` as the agent makes it: the same
/// next hop, device and onlink flag for a tunnel, the same next hop off-link for a
/// direct route, and the kernel's default metric (none for IPv4; IPv6 routes always
/// carry one, 1024 by default).
fn is_as_made(have: &Route, want: &Route) -> bool {
    let default_metric = match have.metric {
        None => true,
        Some(m) => have.dst.is_ipv6() && m == IPV6_DEFAULT_METRIC,
    };
    let same_path = if want.onlink || want.gw.is_none() {
        have.onlink == want.onlink && have.oif == want.oif
    } else {
        !have.onlink
    };
    have.gw == want.gw && same_path && default_metric
}

/// The host route to the remote VTEP through the device that IPv6 needs while a
/// route not through the device is replaced by an onlink one through it.
fn needs_scaffold(have: &Route, want: &Route) -> Option<Route> {
    let gw = want.gw?;
    (want.dst.is_ipv6() && want.onlink && have.oif != want.oif).then(|| Route {
        onlink: false,
        gw: None,
        ..Route {
            dst: IpNetwork::from(gw),
            ..*want
        }
    })
}

/// The metric the kernel gives an IPv6 route added without one.
const IPV6_DEFAULT_METRIC: u32 = 1024;

fn describe(route: &Route) -> String {
    let mut text = route.to_string();
    if let Some(p) = route.protocol {
        text.push_str(&format!(" proto {p}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use cni_linux::netlink::vtep_mac;

    use crate::host::DeviceState;
    use crate::plan::Tunnel;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl RouteTable for Recorder {
        fn apply(&self, changes: &[Change]) -> cni_linux::Result<Vec<cni_linux::Result<()>>> {
            let mut log = self.0.lock().unwrap();
            for change in changes {
                log.push(text(change));
            }
            Ok(changes.iter().map(|_| Ok(())).collect())
        }
    }

    /// A change as the tests read it.
    pub(crate) fn text(change: &Change) -> String {
        match change {
            Change::ReplaceRoute(r) => format!("route {r}"),
            Change::DelRoute(r) => format!("delete {r}"),
            Change::ReplaceFdbEntry { index, mac, dst } => format!("fdb #{index} {mac} {dst}"),
            Change::DelFdbEntry { index, mac, .. } => format!("delete fdb #{index} {mac}"),
            Change::ReplaceNeighbour { index, ip, mac } => format!("neigh #{index} {ip} {mac}"),
            Change::DelNeighbour { index, ip } => format!("delete neigh #{index} {ip}"),
        }
    }

    const P: u8 = 77;

    fn direct(pairs: &[(&str, &str)]) -> BTreeMap<IpNetwork, NextHop> {
        pairs
            .iter()
            .map(|(d, g)| (d.parse().unwrap(), NextHop::Direct(g.parse().unwrap())))
            .collect()
    }

    fn tunnel(cidr: &str, underlay: &str) -> (IpNetwork, NextHop) {
        let cidr: IpNetwork = cidr.parse().unwrap();
        let underlay: IpAddr = underlay.parse().unwrap();
        (
            cidr,
            NextHop::Tunnel(Tunnel {
                underlay,
                vtep: cidr.network(),
                mac: vtep_mac(underlay),
            }),
        )
    }

    fn ours(pairs: &[(&str, &str)]) -> Vec<Route> {
        pairs
            .iter()
            .map(|(d, g)| our_route(d.parse().unwrap(), g.parse().unwrap(), P))
            .collect()
    }

    fn none() -> BTreeMap<bool, ReadyDevice> {
        BTreeMap::new()
    }

    fn run(
        host: &HostState,
        want: &BTreeMap<IpNetwork, NextHop>,
        devices: &BTreeMap<bool, ReadyDevice>,
    ) -> (RouteChanges, Vec<String>) {
        let rec = Recorder::default();
        let c = reconcile(&rec, host, want, devices, P);
        (c, rec.0.into_inner().unwrap())
    }

    #[test]
    fn missing_added_changed_replaced_stale_removed_rest_untouched() {
        let host = HostState {
            ours: ours(&[
                ("10.244.2.0/24", "198.18.0.12"),
                ("10.244.3.0/24", "198.18.0.99"),
                ("10.244.9.0/24", "198.18.0.19"),
            ]),
            ..HostState::default()
        };
        let w = direct(&[
            ("10.244.2.0/24", "198.18.0.12"),
            ("10.244.3.0/24", "198.18.0.13"),
            ("10.244.4.0/24", "198.18.0.14"),
        ]);
        let (c, log) = run(&host, &w, &none());
        assert_eq!(
            log,
            vec![
                "delete 10.244.9.0/24 via 198.18.0.19 table 254",
                "route 10.244.3.0/24 via 198.18.0.13 table 254",
                "route 10.244.4.0/24 via 198.18.0.14 table 254",
            ]
        );
        assert_eq!(
            c.removed,
            vec!["10.244.9.0/24".parse::<IpNetwork>().unwrap()]
        );
        assert_eq!((c.added.len(), c.replaced.len()), (1, 1));
        assert!(c.changed());
        // Once there, nothing is sent.
        let host = HostState {
            ours: ours(&[
                ("10.244.2.0/24", "198.18.0.12"),
                ("10.244.3.0/24", "198.18.0.13"),
                ("10.244.4.0/24", "198.18.0.14"),
            ]),
            ..HostState::default()
        };
        let (c, log) = run(&host, &w, &none());
        assert!(!c.changed());
        assert!(log.is_empty());
    }

    #[test]
    fn an_ipv6_route_read_back_with_the_default_metric_is_left_as_it_is() {
        let mut route = our_route(
            "fd00:244:0:2::/64".parse().unwrap(),
            "fd00:18::12".parse().unwrap(),
            P,
        );
        route.metric = Some(1024);
        let host = HostState {
            ours: vec![route],
            ..HostState::default()
        };
        let (c, log) = run(
            &host,
            &direct(&[("fd00:244:0:2::/64", "fd00:18::12")]),
            &none(),
        );
        assert!(!c.changed(), "{log:?}");
    }

    #[test]
    fn a_foreign_route_is_left_alone_and_reported() {
        let foreign = Route {
            gw: Some("198.18.0.50".parse().unwrap()),
            protocol: Some(4),
            ..Route::new("10.244.2.0/24".parse().unwrap())
        };
        let mut host = HostState {
            ours: ours(&[("10.244.2.0/24", "198.18.0.12")]),
            ..HostState::default()
        };
        host.foreign
            .insert("10.244.2.0/24".parse().unwrap(), vec![foreign]);
        let (c, log) = run(&host, &direct(&[("10.244.2.0/24", "198.18.0.12")]), &none());
        assert_eq!(c.foreign.len(), 1);
        assert!(
            c.foreign[0].1.contains("198.18.0.50 proto 4"),
            "{:?}",
            c.foreign
        );
        // Our own duplicate beside it goes, so the foreign one decides alone.
        assert_eq!(log, vec!["delete 10.244.2.0/24 via 198.18.0.12 table 254"]);
    }

    fn devices() -> BTreeMap<bool, ReadyDevice> {
        [
            (
                false,
                ReadyDevice {
                    index: 40,
                    fresh: false,
                },
            ),
            (
                true,
                ReadyDevice {
                    index: 60,
                    fresh: false,
                },
            ),
        ]
        .into_iter()
        .collect()
    }

    fn device_state(index: u32, fdb: &[(&str, &str)], neighbours: &[(&str, &str)]) -> DeviceState {
        let local = "198.18.0.11".parse().unwrap();
        let name = format!("cni-vx{index}");
        DeviceState {
            addresses: Vec::new(),
            entries: Some(DeviceEntries {
                fdb: fdb
                    .iter()
                    .map(|(mac, dst)| (mac.parse::<MacAddr>().unwrap().0, dst.parse().unwrap()))
                    .collect(),
                neighbours: neighbours
                    .iter()
                    .map(|(ip, mac)| (ip.parse().unwrap(), mac.parse().unwrap()))
                    .collect(),
            }),
            ..crate::overlay::fakes::device(index, &name, "vxlan", 4097, local, 1450, true)
        }
    }

    /// The kernel with one peer through device 40: its route, FDB and neighbour entries.
    fn one_tunnel() -> HostState {
        HostState {
            ours: vec![tunnel_route(
                "10.244.3.0/24".parse().unwrap(),
                "10.244.3.0".parse().unwrap(),
                40,
                P,
            )],
            overlay: vec![device_state(
                40,
                &[("0a:58:c6:13:00:0d", "198.19.0.13")],
                &[("10.244.3.0", "0a:58:c6:13:00:0d")],
            )],
            ..HostState::default()
        }
    }

    #[test]
    fn a_new_tunnel_gets_its_entries_before_its_route() {
        let want: BTreeMap<_, _> = [tunnel("10.244.3.0/24", "198.19.0.13")]
            .into_iter()
            .collect();
        let (c, log) = run(&HostState::default(), &want, &devices());
        assert_eq!(
            log,
            vec![
                "fdb #40 0a:58:c6:13:00:0d 198.19.0.13",
                "neigh #40 10.244.3.0 0a:58:c6:13:00:0d",
                "route 10.244.3.0/24 via 10.244.3.0 dev #40 onlink table 254",
            ]
        );
        assert_eq!(c.tunnels, (1, 0));
        assert_eq!(c.entries, (2, 0));
    }

    #[test]
    fn a_deleted_peer_loses_its_route_before_its_entries() {
        let host = one_tunnel();
        let (c, log) = run(&host, &BTreeMap::new(), &devices());
        assert_eq!(
            log,
            vec![
                "delete 10.244.3.0/24 via 10.244.3.0 dev #40 onlink table 254",
                "delete neigh #40 10.244.3.0",
                "delete fdb #40 0a:58:c6:13:00:0d",
            ]
        );
        assert_eq!(c.entries, (0, 2));
    }

    #[test]
    fn a_moved_underlay_address_moves_the_fdb_entry_and_keeps_the_route() {
        let host = one_tunnel();
        let want: BTreeMap<_, _> = [tunnel("10.244.3.0/24", "198.19.0.33")]
            .into_iter()
            .collect();
        let (_, log) = run(&host, &want, &devices());
        assert_eq!(
            log,
            vec![
                "fdb #40 0a:58:c6:13:00:21 198.19.0.33",
                "neigh #40 10.244.3.0 0a:58:c6:13:00:21",
                "delete fdb #40 0a:58:c6:13:00:0d",
            ]
        );
    }

    #[test]
    fn switching_between_direct_and_tunnel_is_in_place_with_a_scaffold_for_ipv6() {
        let mut v6 = our_route(
            "fd00:244:0:3::/64".parse().unwrap(),
            "fd00:18::13".parse().unwrap(),
            P,
        );
        v6.metric = Some(1024);
        let host = HostState {
            ours: [ours(&[("10.244.3.0/24", "198.18.0.13")]), vec![v6]].concat(),
            ..HostState::default()
        };
        let want: BTreeMap<_, _> = [
            tunnel("10.244.3.0/24", "198.19.0.13"),
            tunnel("fd00:244:0:3::/64", "fd00:19::13"),
        ]
        .into_iter()
        .collect();
        let (c, log) = run(&host, &want, &devices());
        let routes: Vec<&String> = log
            .iter()
            .filter(|l| !l.contains("#40 0a") && !l.starts_with("fdb") && !l.starts_with("neigh"))
            .collect();
        assert_eq!(
            routes,
            vec![
                "route 10.244.3.0/24 via 10.244.3.0 dev #40 onlink table 254",
                "route fd00:244:0:3::/128 dev #60 table 254",
                "route fd00:244:0:3::/64 via fd00:244:0:3:: dev #60 onlink table 254",
                "delete fd00:244:0:3::/128 dev #60 table 254",
            ]
        );
        assert_eq!(c.replaced.len(), 2);
        assert!(c.added.is_empty());

        // And back: in place, no scaffold.
        let host = HostState {
            ours: vec![
                tunnel_route(
                    "10.244.3.0/24".parse().unwrap(),
                    "10.244.3.0".parse().unwrap(),
                    40,
                    P,
                ),
                tunnel_route(
                    "fd00:244:0:3::/64".parse().unwrap(),
                    "fd00:244:0:3::".parse().unwrap(),
                    60,
                    P,
                ),
            ],
            ..HostState::default()
        };
        let want = direct(&[
            ("10.244.3.0/24", "198.18.0.13"),
            ("fd00:244:0:3::/64", "fd00:18::13"),
        ]);
        let (_, log) = run(&host, &want, &none());
        assert_eq!(
            log,
            vec![
                "route 10.244.3.0/24 via 198.18.0.13 table 254",
                "route fd00:244:0:3::/64 via fd00:18::13 table 254",
            ]
        );
    }

    #[test]
    fn a_tunnel_without_its_device_is_left_as_it_is() {
        let route = tunnel_route(
            "10.244.3.0/24".parse().unwrap(),
            "10.244.3.0".parse().unwrap(),
            40,
            P,
        );
        let host = HostState {
            ours: vec![route],
            ..HostState::default()
        };
        let want: BTreeMap<_, _> = [tunnel("10.244.3.0/24", "198.19.0.13")]
            .into_iter()
            .collect();
        let (c, log) = run(&host, &want, &none());
        assert!(log.is_empty(), "{log:?}");
        assert_eq!(c.tunnels, (0, 0));
    }

    #[test]
    fn a_fresh_device_gets_every_entry_again() {
        let host = HostState {
            overlay: vec![device_state(
                40,
                &[("0a:58:c6:13:00:0d", "198.19.0.13")],
                &[("10.244.3.0", "0a:58:c6:13:00:0d")],
            )],
            ..HostState::default()
        };
        let want: BTreeMap<_, _> = [tunnel("10.244.3.0/24", "198.19.0.13")]
            .into_iter()
            .collect();
        let mut fresh = devices();
        fresh.insert(
            false,
            ReadyDevice {
                index: 40,
                fresh: true,
            },
        );
        let (_, log) = run(&host, &want, &fresh);
        assert_eq!(log.len(), 3, "{log:?}");
        let (_, log) = run(&host, &want, &devices());
        assert_eq!(log.len(), 1, "only the route: {log:?}");
    }
}
