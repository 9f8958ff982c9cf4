//! CHECK: the attachment described by `prevResult` still exists as ADD made it:
//! bridge, container veth and its host peer on the bridge, addresses, routes, and
//! (beyond the reference) the masquerade and spoof-check rules.

use crate::common::{fail, mac_text, open_netns, runtime};
use crate::config::BridgeConf;
use cni_firewall::{macspoof, masq};
use cni_linux::{Family, Link, MacAddr, Netlink};
use cni_protocol::error::internal;
use cni_protocol::failpoint::hit;
use cni_protocol::ip::subnet_of;
use cni_protocol::{CniError, CniResult, Command, Interface, Request, Route};
use ipnetwork::IpNetwork;

/// Runs CHECK.
pub fn check_attachment(req: &Request, conf: &BridgeConf) -> Result<(), CniError> {
    let pod_ns = open_netns(&req.args.netns)?;
    hit("bridge/check/start")?;
    if conf.is_layer3() {
        req.ipam(Command::Check)?;
        hit("bridge/check/ipam")?;
    }
    let prev = req
        .config
        .prev_result
        .as_ref()
        .ok_or_else(|| fail("Required prevResult missing"))?;
    let ifname = req.args.ifname.as_str();
    let find = |pred: &dyn Fn(&Interface) -> bool| {
        prev.interfaces
            .iter()
            .find(|i| pred(i))
            .cloned()
            .unwrap_or_default()
    };
    let bridge_entry = find(&|i| i.name == conf.bridge);
    let container_entry = find(&|i| i.name == ifname && i.sandbox == req.args.netns);
    let host_veth = runtime()?.block_on(async {
        let host = Netlink::connect().map_err(|e| internal(&e))?;
        let pod = Netlink::connect_in(&pod_ns).map_err(|e| internal(&e))?;
        let bridge = check_bridge(&host, &bridge_entry, conf).await?;
        if req.args.netns != container_entry.sandbox {
            return Err(fail(format!(
                "Sandbox in prevResult {} doesn't match configured netns: {}",
                container_entry.sandbox, req.args.netns
            )));
        }
        let container = check_container(&pod, &container_entry).await?;
        let others = prev
            .interfaces
            .iter()
            .filter(|i| i.name != bridge_entry.name && i.name != container_entry.name);
        let mut host_veth = None;
        for entry in others {
            if let Some(veth) = check_host_veth(&host, entry, &bridge, &container).await? {
                host_veth = Some(veth);
                break;
            }
        }
        let host_veth = host_veth.ok_or_else(|| {
            fail(format!(
                "CNI veth created for bridge {} was not found",
                conf.bridge
            ))
        })?;
        hit("bridge/check/links")?;
        check_addresses(&pod, ifname, container.index, prev).await?;
        check_routes(&pod, &prev.routes).await?;
        hit("bridge/check/addresses")?;
        Ok(host_veth)
    })?;
    if conf.is_layer3() && conf.ip_masq {
        let nets: Vec<IpNetwork> = prev.ips.iter().map(|ip| ip.address).collect();
        masq::check(
            conf.masq_backend(),
            &conf.network,
            ifname,
            &req.args.container_id,
            &nets,
        )
        .map_err(|e| internal(&e))?;
        hit("bridge/check/masq")?;
    }
    if conf.macspoofchk {
        let (host_veth, container_mac) = host_veth;
        macspoof::check(
            &req.args.container_id,
            ifname,
            &host_veth.name,
            container_mac,
        )
        .map_err(|e| internal(&e))?;
        hit("bridge/check/macspoof")?;
    }
    Ok(())
}

async fn lookup(nl: &Netlink, entry: &Interface) -> Result<Link, CniError> {
    if entry.name.is_empty() {
        return Err(fail("Interface name missing "));
    }
    nl.link_by_name(&entry.name)
        .await
        .map_err(|e| internal(&e))?
        .ok_or_else(|| fail(format!("Interface name {} not found", entry.name)))
}

async fn check_bridge(
    host: &Netlink,
    entry: &Interface,
    conf: &BridgeConf,
) -> Result<Link, CniError> {
    let link = lookup(host, entry).await?;
    if !entry.sandbox.is_empty() {
        return Err(fail(format!(
            "Interface {} should not be in sandbox",
            entry.name
        )));
    }
    if link.kind.as_deref() != Some("bridge") {
        return Err(fail(format!(
            "Interface {} does not have link type of bridge",
            entry.name
        )));
    }
    if !entry.mac.is_empty() && entry.mac != mac_text(&link) {
        return Err(fail(format!(
            "Bridge interface {} Mac doesn't match: {}",
            entry.name, entry.mac
        )));
    }
    if link.promisc != conf.promisc_mode {
        return Err(fail(format!(
            "Bridge interface {} configured Promisc Mode {} doesn't match current state: {} ",
            entry.name, conf.promisc_mode, link.promisc
        )));
    }
    Ok(link)
}

async fn check_container(pod: &Netlink, entry: &Interface) -> Result<Link, CniError> {
    let link = lookup(pod, entry).await?;
    if link.kind.as_deref() != Some("veth") {
        return Err(fail(format!(
            "Error: Container interface {} not of type veth",
            link.name
        )));
    }
    let actual = mac_text(&link);
    if !entry.mac.is_empty() && entry.mac != actual {
        return Err(fail(format!(
            "Interface {} Mac {} doesn't match container Mac: {actual}",
            entry.name, entry.mac
        )));
    }
    Ok(link)
}

/// The host veth paired with the container interface and on the bridge, with its
/// container-side MAC for the spoof check; `None` when `entry` is some other interface.
async fn check_host_veth(
    host: &Netlink,
    entry: &Interface,
    bridge: &Link,
    container: &Link,
) -> Result<Option<(Link, Option<MacAddr>)>, CniError> {
    if !entry.sandbox.is_empty() {
        return Ok(None);
    }
    let link = lookup(host, entry).await?;
    let paired = link.kind.as_deref() == Some("veth")
        && container.peer_index == Some(link.index)
        && link.peer_index == Some(container.index)
        && link.controller == Some(bridge.index);
    if !paired {
        return Ok(None);
    }
    if !entry.mac.is_empty() && entry.mac != mac_text(&link) {
        return Err(fail(format!(
            "Interface {} Mac doesn't match: {} not found",
            entry.name, entry.mac
        )));
    }
    Ok(Some((link, container.mac)))
}

async fn check_addresses(
    pod: &Netlink,
    ifname: &str,
    index: u32,
    prev: &CniResult,
) -> Result<(), CniError> {
    let present = pod.addresses(index, None).await.map_err(|e| internal(&e))?;
    for ip in &prev.ips {
        if !present.iter().any(|a| a.ip == ip.address) {
            return Err(fail(format!(
                "Failed to match addr {} on interface {ifname}",
                ip.address
            )));
        }
        let subnet = subnet_of(ip.address);
        let family = Family::of(ip.address.ip());
        let routes = pod.routes(family, None).await.map_err(|e| internal(&e))?;
        if !routes.iter().any(|r| r.dst == subnet) {
            return Err(fail(format!(
                "Failed to find route {subnet} for interface {ifname}"
            )));
        }
    }
    Ok(())
}

/// Every prevResult route must be in the routing table. A default route matches any
/// default route (later plugins may change its gateway); a route without a gateway
/// matches whichever gateway ADD filled in.
async fn check_routes(pod: &Netlink, routes: &[Route]) -> Result<(), CniError> {
    for route in routes {
        let family = Family::of(route.dst.ip());
        let table = pod.routes(family, None).await.map_err(|e| internal(&e))?;
        let is_default = route.dst.prefix() == 0;
        let found = table
            .iter()
            .any(|r| r.dst == route.dst && (is_default || route.gw.is_none() || r.gw == route.gw));
        if !found {
            let gw = route
                .gw
                .map_or_else(|| "<nil>".to_string(), |g| g.to_string());
            return Err(fail(format!(
                "Expected Route {{Dst:{} GW:{gw}}} not found in routing table",
                route.dst
            )));
        }
    }
    Ok(())
}
