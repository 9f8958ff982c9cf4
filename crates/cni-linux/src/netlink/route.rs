//! Routes: add (create, never replace), replace, list, delete.
//!
//! A route through a VXLAN device names its next hop `onlink`: the remote's VTEP
//! address is on no subnet of the device, and the flag tells the kernel to take
//! the gateway as reachable on the link anyway (`ip route add <pod cidr> via
//! <vtep> dev <vxlan> onlink`).
//!
//! Replacing in place (`NLM_F_REPLACE`) matches the route by destination,
//! table, type and metric (another metric is another route); the gateway and
//! output device may differ. What the kernel (6.18) allows, as the root tests
//! in `tests/vxlan.rs` show, for a pod CIDR's route moving between the uplink
//! (`via <node address>`) and the VXLAN device (`via <VTEP address> dev
//! <vxlan> onlink`, the VTEP address inside the pod CIDR, as flannel has it):
//!
//! - IPv4: in place both ways.
//! - IPv6: VXLAN to uplink in place; uplink to VXLAN refused (`EINVAL`,
//!   "Nexthop has invalid gateway or device mismatch"): IPv6 checks an onlink
//!   gateway against the routing table, and the route being replaced covers it
//!   through another device. In place all the same in one batch
//!   ([`Netlink::apply`](super::Netlink::apply)): a host route for the VTEP
//!   address through the VXLAN device, the replacement, the host route deleted.
//! - Both refuse an onlink route through a device that is down (`ENETDOWN`,
//!   "Nexthop device is not up"), and setting the device down deletes the
//!   routes through it: they are added again once it is up.
//! - IPv4 takes no onlink gateway in a namespace without any IPv4 address
//!   (there is no local table yet): "Nexthop has invalid gateway".

use std::fmt;
use std::net::IpAddr;

use cni_netlink::wire::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE, NLM_F_REQUEST, attrs, u32_ne,
};
use cni_netlink::{Malformed, Writer};
use ipnetwork::IpNetwork;

use super::rtnl::{
    AF_INET, AF_INET6, RT_SCOPE_NOWHERE, RT_TABLE_MAIN, RTA_DST, RTA_GATEWAY, RTA_METRICS, RTA_OIF,
    RTA_PRIORITY, RTA_TABLE, RTAX_ADVMSS, RTAX_MTU, RTM_DELROUTE, RTM_GETROUTE, RTM_NEWROUTE,
    RTN_UNICAST, RTNH_F_ONLINK, RtMsg, ip_bytes, ip_value,
};
use super::{Family, Netlink};
use crate::error::{Error, Result};

/// RTPROT_BOOT: what Go's netlink stamps on routes by default, so routes we
/// add look the same as the reference plugins' in `ip route`.
const RTPROT_BOOT: u8 = 3;

/// A unicast route. Unset fields take kernel defaults when adding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Destination; `0.0.0.0/0` or `::/0` for a default route.
    pub dst: IpNetwork,
    /// Next hop.
    pub gw: Option<IpAddr>,
    /// Output interface index.
    pub oif: Option<u32>,
    /// Metric (RTA_PRIORITY).
    pub metric: Option<u32>,
    /// Routing table; main (254) when unset.
    pub table: Option<u32>,
    /// Scope; universe (0) when unset.
    pub scope: Option<u8>,
    /// Protocol (RTPROT_*); boot (3) when unset, as the reference plugins do.
    pub protocol: Option<u8>,
    /// Path MTU metric.
    pub mtu: Option<u32>,
    /// Advertised MSS metric.
    pub advmss: Option<u32>,
    /// The gateway is reachable on the output interface (`oif`, which the
    /// kernel then requires) even though no address of it covers the gateway
    /// (`RTNH_F_ONLINK`): how a route through a VXLAN device names the remote's
    /// VTEP address. Read back from the kernel's `rtm_flags`.
    pub onlink: bool,
}

impl Route {
    /// A route to `dst` with every other field unset.
    pub fn new(dst: IpNetwork) -> Self {
        Self {
            dst,
            gw: None,
            oif: None,
            metric: None,
            table: None,
            scope: None,
            protocol: None,
            mtu: None,
            advmss: None,
            onlink: false,
        }
    }

    /// Flags of a replacement (`ip route replace`).
    pub(super) const REPLACE_FLAGS: u16 = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;

    /// Writes the route as `rtmsg` and attributes; `wildcards` leaves protocol
    /// and scope unset, so that a deletion matches whatever they are.
    pub(super) fn write(&self, w: &mut Writer, wildcards: bool) -> Result<()> {
        let (family, dst) = ip_bytes(self.dst.ip());
        let gw = match self.gw {
            Some(gw) if Family::of(gw) != Family::of(self.dst.ip()) => {
                return Err(Error::InvalidRoute {
                    route: self.to_string(),
                    reason: "gateway and destination differ in family".into(),
                });
            }
            gw => gw.map(|gw| ip_bytes(gw).1),
        };
        // Tables above 255 only fit the attribute; the header then says main.
        let table = self.table.unwrap_or(u32::from(RT_TABLE_MAIN));
        let header_table = u8::try_from(table).unwrap_or(RT_TABLE_MAIN);
        let (protocol, scope) = if wildcards {
            (0, RT_SCOPE_NOWHERE)
        } else {
            (
                self.protocol.unwrap_or(RTPROT_BOOT),
                self.scope.unwrap_or(0),
            )
        };
        RtMsg {
            family,
            dst_len: self.dst.prefix(),
            table: header_table,
            protocol,
            scope,
            kind: RTN_UNICAST,
            flags: if self.onlink { RTNH_F_ONLINK } else { 0 },
        }
        .write(w);
        w.attr(RTA_DST, &dst);
        if let Some(gw) = gw {
            w.attr(RTA_GATEWAY, &gw);
        }
        if let Some(oif) = self.oif {
            w.attr_u32(RTA_OIF, oif);
        }
        if let Some(metric) = self.metric {
            w.attr_u32(RTA_PRIORITY, metric);
        }
        if table > 255 {
            w.attr_u32(RTA_TABLE, table);
        }
        if self.mtu.is_some() || self.advmss.is_some() {
            let metrics = w.nest_start(RTA_METRICS);
            if let Some(mtu) = self.mtu {
                w.attr_u32(RTAX_MTU, mtu);
            }
            if let Some(mss) = self.advmss {
                w.attr_u32(RTAX_ADVMSS, mss);
            }
            w.nest_end(metrics);
        }
        Ok(())
    }

    /// Decodes an RTM_NEWROUTE message; `None` for a route that is not unicast
    /// or not IP.
    pub(super) fn parse(payload: &[u8]) -> std::result::Result<Option<Self>, Malformed> {
        let (header, attributes) = RtMsg::parse(payload)?;
        if header.kind != RTN_UNICAST {
            return Ok(None);
        }
        let unspecified: IpAddr = match header.family {
            AF_INET => std::net::Ipv4Addr::UNSPECIFIED.into(),
            AF_INET6 => std::net::Ipv6Addr::UNSPECIFIED.into(),
            _ => return Ok(None),
        };
        let mut dst_ip = unspecified;
        let mut route = Self::new(IpNetwork::from(unspecified));
        route.table = Some(u32::from(header.table));
        route.scope = Some(header.scope);
        route.protocol = Some(header.protocol);
        route.onlink = header.flags & RTNH_F_ONLINK != 0;
        for attr in attrs(attributes) {
            let (ty, v) = attr?;
            match ty {
                RTA_DST => dst_ip = ip_value(header.family, v)?,
                RTA_GATEWAY => route.gw = Some(ip_value(header.family, v)?),
                RTA_OIF => route.oif = Some(u32_ne(v)?),
                RTA_PRIORITY => route.metric = Some(u32_ne(v)?),
                RTA_TABLE => route.table = Some(u32_ne(v)?),
                RTA_METRICS => {
                    for metric in attrs(v) {
                        let (ty, v) = metric?;
                        match ty {
                            RTAX_MTU => route.mtu = Some(u32_ne(v)?),
                            RTAX_ADVMSS => route.advmss = Some(u32_ne(v)?),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        route.dst = IpNetwork::new(dst_ip, header.dst_len)
            .map_err(|_| Malformed("route prefix length out of range"))?;
        Ok(Some(route))
    }
}

impl fmt::Display for Route {
    /// Formats like the reference's route error messages: `<dst> via <gw> dev #<oif>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dst)?;
        if let Some(gw) = self.gw {
            write!(f, " via {gw}")?;
        }
        if let Some(oif) = self.oif {
            write!(f, " dev #{oif}")?;
        }
        if self.onlink {
            f.write_str(" onlink")?;
        }
        if let Some(metric) = self.metric {
            write!(f, " metric {metric}")?;
        }
        if let Some(table) = self.table {
            write!(f, " table {table}")?;
        }
        Ok(())
    }
}

impl Netlink {
    /// Adds a route; an identical existing route fails with `is_exists()`.
    ///
    /// Sent with CREATE but without EXCL, like the reference's `RouteAddEcmp`: a
    /// second default route via another interface (a pod on two networks) is added
    /// beside the first (IPv4) or as another next hop (IPv6) instead of failing.
    pub fn add_route(&self, route: &Route) -> Result<()> {
        let mut w = Writer::new();
        route.write(&mut w, false)?;
        self.exec(
            RTM_NEWROUTE,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
            |out| out.bytes(w.as_bytes()),
            || format!("failed to add route {route}"),
        )
    }

    /// Adds a route, or changes in place the one with the same destination, table,
    /// metric and type: packets keep flowing through the old route until the new one
    /// is in, with no gap as a delete-then-add would leave.
    pub fn replace_route(&self, route: &Route) -> Result<()> {
        let mut w = Writer::new();
        route.write(&mut w, false)?;
        self.exec(
            RTM_NEWROUTE,
            Route::REPLACE_FLAGS,
            |out| out.bytes(w.as_bytes()),
            || format!("failed to replace route {route}"),
        )
    }

    /// Deletes a route matching `route`'s destination, gateway, interface, metric and table.
    pub fn del_route(&self, route: &Route) -> Result<()> {
        let mut w = Writer::new();
        route.write(&mut w, true)?;
        self.exec(
            RTM_DELROUTE,
            NLM_F_REQUEST | NLM_F_ACK,
            |out| out.bytes(w.as_bytes()),
            || format!("failed to delete route {route}"),
        )
    }

    /// The output interface the kernel would send a packet to `ip` through, as
    /// `ip route get` asks it (one request, however many routes there are); `None`
    /// when there is no route, or the answer has no interface or is not unicast.
    pub fn route_get_oif(&self, ip: IpAddr) -> Result<Option<u32>> {
        match self.route_get_oif_raw(ip) {
            Err(e)
                if matches!(
                    e.errno(),
                    Some(nix::libc::ENETUNREACH | nix::libc::EHOSTUNREACH)
                ) =>
            {
                Ok(None)
            }
            other => other,
        }
    }

    fn route_get_oif_raw(&self, ip: IpAddr) -> Result<Option<u32>> {
        let (family, dst_len, octets) = match ip {
            IpAddr::V4(a) => (AF_INET, 32, a.octets().to_vec()),
            IpAddr::V6(a) => (AF_INET6, 128, a.octets().to_vec()),
        };
        let mut oif = None;
        self.request(
            RTM_GETROUTE,
            NLM_F_REQUEST,
            |w| {
                RtMsg {
                    family,
                    dst_len,
                    ..RtMsg::default()
                }
                .write(w);
                w.attr(RTA_DST, &octets);
            },
            |msg| {
                if msg.ty == RTM_NEWROUTE {
                    oif = Route::parse(msg.payload)?.and_then(|r| r.oif);
                }
                Ok(())
            },
            || format!("failed to look up the route to {ip}"),
        )?;
        Ok(oif)
    }

    /// Lists unicast routes of one family, optionally of one table only.
    pub fn routes(&self, family: Family, table: Option<u32>) -> Result<Vec<Route>> {
        let mut routes = Vec::new();
        self.request(
            RTM_GETROUTE,
            NLM_F_REQUEST | NLM_F_DUMP,
            |w| {
                // Everything of this family: without strict checking the kernel
                // ignores header filters in dumps anyway.
                RtMsg {
                    family: match family {
                        Family::V4 => AF_INET,
                        Family::V6 => AF_INET6,
                    },
                    ..RtMsg::default()
                }
                .write(w);
            },
            |msg| {
                if msg.ty == RTM_NEWROUTE {
                    routes.extend(
                        Route::parse(msg.payload)?
                            .filter(|r| table.is_none_or(|t| r.table == Some(t))),
                    );
                }
                Ok(())
            },
            || format!("failed to list {family:?} routes"),
        )?;
        Ok(routes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::{hex, message};

    fn route(text: &str) -> Route {
        Route::new(text.parse().unwrap())
    }

    #[test]
    fn a_route_is_what_ip_route_add_sends() {
        // `ip route add 10.0.0.0/8 via 10.0.0.9 dev cni0 metric 5 proto boot` (#5),
        // strace'd; flags CREATE without EXCL, and our attribute order.
        let r = Route {
            gw: Some("10.0.0.9".parse().unwrap()),
            oif: Some(5),
            metric: Some(5),
            ..route("10.0.0.0/8")
        };
        let got = message(RTM_NEWROUTE, 0x405, |w| r.write(w, false).unwrap());
        let want = hex(
            "3c000000 1800 0504 01000000 00000000              02080000 fe030001 00000000              08000100 0a000000              08000500 0a000009              08000400 05000000              08000600 05000000",
        );
        assert_eq!(got, want);
        // Decoding it gives the route back, with the header's fields filled in.
        let back = Route::parse(&got[16..]).unwrap().unwrap();
        assert_eq!(
            back,
            Route {
                table: Some(254),
                scope: Some(0),
                protocol: Some(3),
                ..r
            }
        );
    }

    #[test]
    fn a_replacement_is_what_ip_route_replace_sends() {
        // `ip route replace 10.244.2.0/24 via 198.18.0.12 proto 77`, strace'd: flags
        // REQUEST|ACK|REPLACE|CREATE (0x505).
        let r = Route {
            gw: Some("198.18.0.12".parse().unwrap()),
            protocol: Some(77),
            ..route("10.244.2.0/24")
        };
        let got = message(RTM_NEWROUTE, 0x505, |w| r.write(w, false).unwrap());
        let want = hex(
            "2c000000 1800 0505 01000000 00000000              02180000 fe4d0001 00000000              08000100 0af40200              08000500 c612000c",
        );
        assert_eq!(got, want);
        assert_eq!(
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            0x505
        );
    }

    #[test]
    fn an_onlink_route_through_a_vxlan_device_is_what_ip_route_add_sends() {
        // `ip route add 10.244.2.0/24 via 10.244.2.0 dev vx4 onlink` (vx4 is #4),
        // strace'd: rtm_flags RTNH_F_ONLINK, then RTA_DST, RTA_GATEWAY, RTA_OIF.
        let r = Route {
            gw: Some("10.244.2.0".parse().unwrap()),
            oif: Some(4),
            onlink: true,
            ..route("10.244.2.0/24")
        };
        let got = message(RTM_NEWROUTE, 0x605, |w| r.write(w, false).unwrap());
        let want = hex("34000000 1800 0506 01000000 00000000 \
             02180000 fe030001 04000000 \
             08000100 0af40200 \
             08000500 0af40200 \
             08000400 04000000");
        assert_eq!(got, want);
        let back = Route::parse(&got[16..]).unwrap().unwrap();
        assert!(back.onlink);
        assert_eq!(
            back.to_string(),
            "10.244.2.0/24 via 10.244.2.0 dev #4 onlink table 254"
        );
        // Other next-hop flags the kernel reports (RTNH_F_LINKDOWN) are not onlink.
        let mut linkdown = got.clone();
        linkdown[24..28].copy_from_slice(&0x10u32.to_ne_bytes());
        assert!(!Route::parse(&linkdown[16..]).unwrap().unwrap().onlink);
    }

    #[test]
    fn deletion_leaves_protocol_and_scope_as_wildcards() {
        let got = message(RTM_DELROUTE, 0x5, |w| route("::/0").write(w, true).unwrap());
        // rtmsg: AF_INET6, /0, table main, protocol 0, scope nowhere, unicast.
        assert_eq!(got[16..28], hex("0a000000 fe00ff01 00000000"));
    }

    #[test]
    fn big_tables_and_metrics_travel_as_attributes() {
        let r = Route {
            table: Some(1000),
            mtu: Some(1400),
            advmss: Some(1360),
            ..route("fd00::/64")
        };
        let got = message(RTM_NEWROUTE, 0x405, |w| r.write(w, false).unwrap());
        assert_eq!(got[20], 254, "the header says main");
        let back = Route::parse(&got[16..]).unwrap().unwrap();
        assert_eq!(
            (back.table, back.mtu, back.advmss),
            (Some(1000), Some(1400), Some(1360))
        );
        assert_eq!(back.dst, r.dst);
    }

    #[test]
    fn mixed_families_are_refused() {
        let r = Route {
            gw: Some("10.0.0.1".parse().unwrap()),
            ..route("fd00::/64")
        };
        let mut w = Writer::new();
        let e = r.write(&mut w, false).unwrap_err();
        assert!(matches!(e, Error::InvalidRoute { .. }), "{e}");
    }

    #[test]
    fn other_routes_are_skipped_and_broken_ones_refused() {
        let mut local = message(RTM_NEWROUTE, 0, |w| {
            route("10.0.0.1/32").write(w, false).unwrap()
        });
        local[16 + 7] = 2; // RTN_LOCAL
        assert_eq!(Route::parse(&local[16..]), Ok(None));
        let mut odd = message(RTM_NEWROUTE, 0, |w| {
            route("10.0.0.0/8").write(w, false).unwrap()
        });
        odd[16 + 12] = 7; // RTA_DST of 3 bytes
        assert!(Route::parse(&odd[16..]).is_err());
        assert!(Route::parse(&[2, 8, 0]).is_err());
    }
}
