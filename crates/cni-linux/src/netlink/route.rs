//! Routes: add (create, never replace), list, delete.

use std::fmt;
use std::net::IpAddr;

use futures::StreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::RouteMessageBuilder;
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteMetric, RouteProtocol, RouteScope, RouteType,
};

use super::{Family, Netlink, collect, exec};
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
        }
    }

    fn to_message(self) -> Result<RouteMessage> {
        let invalid = |reason: String| Error::InvalidRoute {
            route: self.to_string(),
            reason,
        };
        let mut builder = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(self.dst.ip(), self.dst.prefix())
            .map_err(|e| invalid(e.to_string()))?;
        if let Some(gw) = self.gw {
            if Family::of(gw) != Family::of(self.dst.ip()) {
                return Err(invalid("gateway and destination differ in family".into()));
            }
            builder = builder.gateway(gw).map_err(|e| invalid(e.to_string()))?;
        }
        if let Some(oif) = self.oif {
            builder = builder.output_interface(oif);
        }
        if let Some(metric) = self.metric {
            builder = builder.priority(metric);
        }
        if let Some(table) = self.table {
            builder = builder.table_id(table);
        }
        builder = builder
            .scope(RouteScope::from(self.scope.unwrap_or(0)))
            .protocol(RouteProtocol::from(self.protocol.unwrap_or(RTPROT_BOOT)));
        let mut msg = builder.build();
        let metrics: Vec<RouteMetric> = [
            self.mtu.map(RouteMetric::Mtu),
            self.advmss.map(RouteMetric::Advmss),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !metrics.is_empty() {
            msg.attributes.push(RouteAttribute::Metrics(metrics));
        }
        Ok(msg)
    }

    fn from_message(msg: &RouteMessage) -> Option<Self> {
        if msg.header.kind != RouteType::Unicast {
            return None;
        }
        let mut route = Self::new(default_dst(msg.header.address_family)?);
        let mut dst_ip = None;
        route.table = Some(u32::from(msg.header.table));
        route.scope = Some(msg.header.scope.into());
        route.protocol = Some(msg.header.protocol.into());
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Destination(addr) => dst_ip = ip_of(addr),
                RouteAttribute::Gateway(addr) => route.gw = ip_of(addr),
                RouteAttribute::Oif(oif) => route.oif = Some(*oif),
                RouteAttribute::Priority(metric) => route.metric = Some(*metric),
                RouteAttribute::Table(table) => route.table = Some(*table),
                RouteAttribute::Metrics(metrics) => route.apply_metrics(metrics),
                _ => {}
            }
        }
        if let Some(ip) = dst_ip {
            route.dst = IpNetwork::new(ip, msg.header.destination_prefix_length).ok()?;
        }
        Some(route)
    }

    fn apply_metrics(&mut self, metrics: &[RouteMetric]) {
        for metric in metrics {
            match metric {
                RouteMetric::Mtu(mtu) => self.mtu = Some(*mtu),
                RouteMetric::Advmss(mss) => self.advmss = Some(*mss),
                _ => {}
            }
        }
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
        if let Some(metric) = self.metric {
            write!(f, " metric {metric}")?;
        }
        if let Some(table) = self.table {
            write!(f, " table {table}")?;
        }
        Ok(())
    }
}

fn default_dst(family: AddressFamily) -> Option<IpNetwork> {
    let unspecified: IpAddr = match family {
        AddressFamily::Inet => std::net::Ipv4Addr::UNSPECIFIED.into(),
        AddressFamily::Inet6 => std::net::Ipv6Addr::UNSPECIFIED.into(),
        _ => return None,
    };
    IpNetwork::new(unspecified, 0).ok()
}

fn ip_of(addr: &RouteAddress) -> Option<IpAddr> {
    match addr {
        RouteAddress::Inet(v4) => Some((*v4).into()),
        RouteAddress::Inet6(v6) => Some((*v6).into()),
        _ => None,
    }
}

impl Netlink {
    /// Adds a route; an identical existing route fails with `is_exists()`.
    ///
    /// Sent with CREATE but without EXCL, like the reference's `RouteAddEcmp`: a
    /// second default route via another interface (a pod on two networks) is added
    /// beside the first (IPv4) or as another next hop (IPv6) instead of failing.
    pub async fn add_route(&self, route: &Route) -> Result<()> {
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::NewRoute(route.to_message()?));
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE;
        let mut handle = self.handle.clone();
        let sent = async move {
            let mut answers = handle.request(request)?;
            while let Some(answer) = answers.next().await {
                if let NetlinkPayload::Error(err) = answer.payload {
                    return Err(rtnetlink::Error::NetlinkError(err));
                }
            }
            Ok(())
        };
        exec(sent, || format!("failed to add route {route}")).await
    }

    /// Deletes a route matching `route`'s destination, gateway, interface, metric and table.
    pub async fn del_route(&self, route: &Route) -> Result<()> {
        let mut msg = route.to_message()?;
        // Leave protocol and scope as wildcards so any matching route goes.
        msg.header.protocol = RouteProtocol::Unspec;
        msg.header.scope = RouteScope::NoWhere;
        exec(self.handle.route().del(msg).execute(), || {
            format!("failed to delete route {route}")
        })
        .await
    }

    /// Lists unicast routes of one family, optionally of one table only.
    pub async fn routes(&self, family: Family, table: Option<u32>) -> Result<Vec<Route>> {
        let mut filter = match family {
            Family::V4 => RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            Family::V6 => RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        };
        // Without strict checking the kernel ignores header filters in dumps;
        // clear them anyway so the request means "everything of this family".
        filter.header.table = 0;
        filter.header.protocol = RouteProtocol::Unspec;
        filter.header.scope = RouteScope::Universe;
        filter.header.kind = RouteType::Unspec;
        let messages = collect(self.handle.route().get(filter).execute(), || {
            format!("failed to list {family:?} routes")
        })
        .await?;
        Ok(messages
            .iter()
            .filter_map(Route::from_message)
            .filter(|r| table.is_none_or(|t| r.table == Some(t)))
            .collect())
    }
}
