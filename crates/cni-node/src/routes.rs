//! Makes the main table's routes to other nodes' pod CIDRs equal the plan, touching
//! only routes marked with the agent's protocol number.
//!
//! A route of ours whose next hop changed is replaced in place (one netlink request,
//! no moment without a route); one whose destination is no longer planned is deleted;
//! a destination that already has a route of someone else's is left alone and
//! reported.

use std::collections::BTreeMap;
use std::net::IpAddr;

use cni_linux::netlink::{Netlink, Route};
use ipnetwork::IpNetwork;

use crate::error::Error;
use crate::host::{HostState, MAIN_TABLE};

/// What one reconciliation did and found.
#[derive(Debug, Default)]
pub struct RouteChanges {
    /// Routes added.
    pub added: Vec<(IpNetwork, IpAddr)>,
    /// Routes whose next hop was changed in place.
    pub replaced: Vec<(IpNetwork, IpAddr)>,
    /// Routes of ours removed.
    pub removed: Vec<IpNetwork>,
    /// Planned destinations that someone else already routes: (destination, their route).
    pub foreign: Vec<(IpNetwork, String)>,
    /// Requests the kernel refused.
    pub failed: Vec<Error>,
}

impl RouteChanges {
    /// Whether anything changed in the kernel.
    pub fn changed(&self) -> bool {
        !(self.added.is_empty() && self.replaced.is_empty() && self.removed.is_empty())
    }
}

/// The netlink requests a reconciliation makes: a trait so the decisions are tested
/// without a kernel.
pub trait RouteTable: Send {
    /// Adds a route.
    fn add(&self, route: &Route) -> cni_linux::Result<()>;
    /// Replaces the route with the same destination.
    fn replace(&self, route: &Route) -> cni_linux::Result<()>;
    /// Deletes a route.
    fn delete(&self, route: &Route) -> cni_linux::Result<()>;
}

impl RouteTable for Netlink {
    fn add(&self, route: &Route) -> cni_linux::Result<()> {
        self.add_route(route)
    }
    fn replace(&self, route: &Route) -> cni_linux::Result<()> {
        self.replace_route(route)
    }
    fn delete(&self, route: &Route) -> cni_linux::Result<()> {
        self.del_route(route)
    }
}

/// The route the agent makes for `dst` via `gw`.
pub fn our_route(dst: IpNetwork, gw: IpAddr, protocol: u8) -> Route {
    Route {
        gw: Some(gw),
        table: Some(MAIN_TABLE),
        protocol: Some(protocol),
        ..Route::new(dst)
    }
}

/// Brings the table from `host` (as read just before) to `want`.
pub fn reconcile(
    table: &dyn RouteTable,
    host: &HostState,
    want: &BTreeMap<IpNetwork, IpAddr>,
    protocol: u8,
) -> RouteChanges {
    let mut changes = RouteChanges::default();
    let mut ours: BTreeMap<IpNetwork, Vec<&Route>> = BTreeMap::new();
    for route in &host.ours {
        ours.entry(route.dst).or_default().push(route);
    }
    for (&dst, &gw) in want {
        if let Some(theirs) = host.foreign.get(&dst) {
            let text = theirs.iter().map(describe).collect::<Vec<_>>().join(", ");
            changes.foreign.push((dst, text));
            continue;
        }
        let route = our_route(dst, gw, protocol);
        match ours.remove(&dst).as_deref() {
            Some([only]) if is_ours_as_made(only, gw) => {}
            Some([_]) => {
                // A changed next hop: the route is changed in place, no gap.
                match table.replace(&route) {
                    Ok(()) => changes.replaced.push((dst, gw)),
                    Err(e) => changes
                        .failed
                        .push(Error::route("replace", dst, Some(gw), e)),
                }
            }
            Some(several) => {
                // Duplicates (left by a hand or an older agent): keep the right one, if
                // any, delete the rest, then add the right one if it was not there.
                let exact = |r: &&Route| is_ours_as_made(r, gw);
                for extra in several.iter().filter(|r| !exact(r)) {
                    match table.delete(extra) {
                        Ok(()) => changes.removed.push(dst),
                        Err(e) if e.is_not_found() => {}
                        Err(e) => changes
                            .failed
                            .push(Error::route("delete", dst, extra.gw, e)),
                    }
                }
                if !several.iter().any(exact) {
                    match table.add(&route) {
                        Ok(()) => changes.added.push((dst, gw)),
                        Err(e) => changes.failed.push(Error::route("add", dst, Some(gw), e)),
                    }
                }
            }
            None => match table.add(&route) {
                Ok(()) => changes.added.push((dst, gw)),
                Err(e) => changes.failed.push(Error::route("add", dst, Some(gw), e)),
            },
        }
    }
    // Ours that are no longer planned, and ours shadowed by a foreign route.
    for (dst, routes) in ours {
        for route in routes {
            match table.delete(route) {
                Ok(()) => changes.removed.push(dst),
                Err(e) if e.is_not_found() => changes.removed.push(dst),
                Err(e) => changes
                    .failed
                    .push(Error::route("delete", dst, route.gw, e)),
            }
        }
    }
    changes
}

/// Whether `route` is the one the agent makes to `gw`: that next hop and the kernel's
/// default metric (none for IPv4; IPv6 routes always carry one, 1024 by default).
fn is_ours_as_made(route: &Route, gw: IpAddr) -> bool {
    let default_metric = match route.metric {
        None => true,
        Some(m) => route.dst.is_ipv6() && m == IPV6_DEFAULT_METRIC,
    };
    route.gw == Some(gw) && default_metric
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
    use std::cell::RefCell;

    #[derive(Default)]
    struct Recorder(RefCell<Vec<String>>);

    impl RouteTable for Recorder {
        fn add(&self, r: &Route) -> cni_linux::Result<()> {
            self.0.borrow_mut().push(format!("add {r}"));
            Ok(())
        }
        fn replace(&self, r: &Route) -> cni_linux::Result<()> {
            self.0.borrow_mut().push(format!("replace {r}"));
            Ok(())
        }
        fn delete(&self, r: &Route) -> cni_linux::Result<()> {
            self.0.borrow_mut().push(format!("delete {r}"));
            Ok(())
        }
    }

    const P: u8 = 77;

    fn want(pairs: &[(&str, &str)]) -> BTreeMap<IpNetwork, IpAddr> {
        pairs
            .iter()
            .map(|(d, g)| (d.parse().unwrap(), g.parse().unwrap()))
            .collect()
    }

    fn ours(pairs: &[(&str, &str)]) -> Vec<Route> {
        pairs
            .iter()
            .map(|(d, g)| our_route(d.parse().unwrap(), g.parse().unwrap(), P))
            .collect()
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
        let w = want(&[
            ("10.244.2.0/24", "198.18.0.12"),
            ("10.244.3.0/24", "198.18.0.13"),
            ("10.244.4.0/24", "198.18.0.14"),
        ]);
        let rec = Recorder::default();
        let c = reconcile(&rec, &host, &w, P);
        assert_eq!(
            *rec.0.borrow(),
            vec![
                "replace 10.244.3.0/24 via 198.18.0.13 table 254",
                "add 10.244.4.0/24 via 198.18.0.14 table 254",
                "delete 10.244.9.0/24 via 198.18.0.19 table 254",
            ]
        );
        assert_eq!(
            c.removed,
            vec!["10.244.9.0/24".parse::<IpNetwork>().unwrap()]
        );
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
        let rec = Recorder::default();
        assert!(!reconcile(&rec, &host, &w, P).changed());
        assert!(rec.0.borrow().is_empty());
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
        let rec = Recorder::default();
        let c = reconcile(
            &rec,
            &host,
            &want(&[("fd00:244:0:2::/64", "fd00:18::12")]),
            P,
        );
        assert!(!c.changed(), "{:?}", rec.0.borrow());
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
        let rec = Recorder::default();
        let c = reconcile(&rec, &host, &want(&[("10.244.2.0/24", "198.18.0.12")]), P);
        assert_eq!(c.foreign.len(), 1);
        assert!(
            c.foreign[0].1.contains("198.18.0.50 proto 4"),
            "{:?}",
            c.foreign
        );
        // Our own duplicate beside it goes, so the foreign one decides alone.
        assert_eq!(
            *rec.0.borrow(),
            vec!["delete 10.244.2.0/24 via 198.18.0.12 table 254"]
        );
    }
}
