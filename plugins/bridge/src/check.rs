//! CHECK: the attachment described by `prevResult` still exists as ADD made it:
//! bridge, container veth and its host peer on the bridge, addresses, routes, and
//! (beyond the reference) the masquerade, spoof-check and port-security rules and the
//! pod records.

use crate::common::{fail, joined, mac_text, open_netns};
use crate::config::BridgeConf;
use crate::links::Links;
use crate::records;
use cni_firewall::{macspoof, masq, port_security};
use cni_linux::{Family, Link, MacAddr, Netlink};
use cni_protocol::error::internal;
use cni_protocol::failpoint::hit;
use cni_protocol::ip::subnet_of;
use cni_protocol::{CniError, CniResult, Command, Interface, Request, Route};
use ipnetwork::IpNetwork;

/// Runs CHECK.
pub fn check_attachment(req: &Request, conf: &BridgeConf) -> Result<(), CniError> {
    let pod_ns = open_netns(&req.args)?;
    hit("bridge/check/start")?;
    let Some(prev) = req.config.prev_result.as_ref() else {
        if conf.is_layer3() {
            req.ipam(Command::Check)?;
        }
        return Err(fail("Required prevResult missing"));
    };
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
    std::thread::scope(|scope| {
        // IPAM and the firewall rules are checked beside the links. The errors keep the
        // order of a CHECK that ran them one after the other: IPAM, links, rules.
        let ipam = conf
            .is_layer3()
            .then(|| scope.spawn(|| req.ipam(Command::Check)));
        let masq = (conf.is_layer3() && conf.ip_masq).then(|| {
            scope.spawn(|| {
                let nets: Vec<IpNetwork> = prev.ips.iter().map(|ip| ip.address).collect();
                masq::check(
                    conf.masq_backend(),
                    &conf.network,
                    ifname,
                    &req.args.container_id,
                    &nets,
                )
                .map_err(|e| internal(&e))
            })
        });
        let host_veth = check_links(req, conf, &pod_ns, prev, &bridge_entry, &container_entry);
        let masq = masq.map(joined);
        if let Some(outcome) = ipam.map(joined) {
            outcome?;
            hit("bridge/check/ipam")?;
        }
        let host_veth = host_veth?;
        if let Some(outcome) = masq {
            outcome?;
            hit("bridge/check/masq")?;
        }
        let (host_veth, container_mac) = host_veth;
        if conf.macspoofchk {
            macspoof::check(
                &req.args.container_id,
                ifname,
                &host_veth.name,
                container_mac,
            )
            .map_err(|e| internal(&e))?;
            hit("bridge/check/macspoof")?;
        }
        if conf.port_security {
            let mac = container_mac
                .ok_or_else(|| fail(format!("{ifname:?} has no MAC for portSecurity")))?;
            let container_index = prev
                .interfaces
                .iter()
                .position(|i| i.name == ifname && i.sandbox == req.args.netns);
            let addresses: Vec<std::net::IpAddr> = prev
                .ips
                .iter()
                .filter(|ip| ip.interface.is_none() || ip.interface == container_index)
                .map(|ip| ip.address.ip())
                .collect();
            port_security::check(&port_security::Port {
                container_id: &req.args.container_id,
                ifname,
                host_veth: &host_veth.name,
                mac,
                addresses: &addresses,
            })
            .map_err(|e| internal(&e))?;
            hit("bridge/check/port-security")?;
        }
        if let (Some(dir), Some(pod)) = (&conf.pod_record_dir, &conf.pod) {
            records::check(req, dir, pod, prev)?;
            hit("bridge/check/pod-records")?;
        }
        Ok(())
    })
}

/// The netlink half of CHECK: bridge, veth pair, addresses and routes. Returns the
/// host end and the container's MAC.
fn check_links(
    req: &Request,
    conf: &BridgeConf,
    pod_ns: &cni_linux::NetNs,
    prev: &CniResult,
    bridge_entry: &Interface,
    container_entry: &Interface,
) -> Result<(Link, Option<MacAddr>), CniError> {
    let ifname = req.args.ifname.as_str();
    let host = Netlink::connect().map_err(|e| internal(&e))?;
    let pod = Netlink::connect_in(pod_ns).map_err(|e| internal(&e))?;
    let bridge = check_bridge(&host, bridge_entry, conf)?;
    if req.args.netns != container_entry.sandbox {
        return Err(fail(format!(
            "Sandbox in prevResult {} doesn't match configured netns: {}",
            container_entry.sandbox, req.args.netns
        )));
    }
    let container = check_container(&pod, container_entry)?;
    let others = prev
        .interfaces
        .iter()
        .filter(|i| i.name != bridge_entry.name && i.name != container_entry.name);
    let mut host_veth = None;
    for entry in others {
        if let Some(veth) = check_host_veth(&host, entry, &bridge, &container)? {
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
    check_addresses(&pod, ifname, container.index, prev)?;
    check_routes(&pod, &prev.routes)?;
    hit("bridge/check/addresses")?;
    Ok(host_veth)
}

fn lookup(nl: &impl Links, entry: &Interface) -> Result<Link, CniError> {
    if entry.name.is_empty() {
        return Err(fail("Interface name missing "));
    }
    nl.link_by_name(&entry.name)
        .map_err(|e| internal(&e))?
        .ok_or_else(|| fail(format!("Interface name {} not found", entry.name)))
}

fn check_bridge(host: &impl Links, entry: &Interface, conf: &BridgeConf) -> Result<Link, CniError> {
    let link = lookup(host, entry)?;
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

fn check_container(pod: &impl Links, entry: &Interface) -> Result<Link, CniError> {
    let link = lookup(pod, entry)?;
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
fn check_host_veth(
    host: &impl Links,
    entry: &Interface,
    bridge: &Link,
    container: &Link,
) -> Result<Option<(Link, Option<MacAddr>)>, CniError> {
    if !entry.sandbox.is_empty() {
        return Ok(None);
    }
    let link = lookup(host, entry)?;
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

fn check_addresses(
    pod: &impl Links,
    ifname: &str,
    index: u32,
    prev: &CniResult,
) -> Result<(), CniError> {
    let present = pod.addresses(index, None).map_err(|e| internal(&e))?;
    for ip in &prev.ips {
        if !present.iter().any(|a| a.ip == ip.address) {
            return Err(fail(format!(
                "Failed to match addr {} on interface {ifname}",
                ip.address
            )));
        }
        let subnet = subnet_of(ip.address);
        let family = Family::of(ip.address.ip());
        let routes = pod.routes(family, None).map_err(|e| internal(&e))?;
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
fn check_routes(pod: &impl Links, routes: &[Route]) -> Result<(), CniError> {
    for route in routes {
        let family = Family::of(route.dst.ip());
        let table = pod.routes(family, None).map_err(|e| internal(&e))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Fake, link};
    use cni_linux::{Address, Route as KernelRoute};
    use cni_protocol::IpConfig;

    fn conf(promisc: bool) -> BridgeConf {
        let json = format!(
            r#"{{"cniVersion": "1.0.0", "name": "unit", "type": "bridge",
                "bridge": "br-unit", "promiscMode": {promisc}}}"#
        );
        let config = cni_protocol::NetConf::parse(json.as_bytes()).unwrap();
        let req = Request {
            args: cni_protocol::CmdArgs {
                command: Command::Check,
                container_id: "c".into(),
                netns: String::new(),
                ifname: "eth0".into(),
                args: String::new(),
                path: vec![],
                netns_override: false,
            },
            config,
            stdin: json.into_bytes(),
        };
        BridgeConf::load(&req).unwrap()
    }

    fn entry(link: &Link, sandbox: &str) -> Interface {
        Interface {
            name: link.name.clone(),
            mac: link.mac.map(|m| m.to_string()).unwrap_or_default(),
            sandbox: sandbox.into(),
            ..Interface::default()
        }
    }

    /// Host: bridge 1, veth 2 on it; pod: eth0 3 paired with 2, and a stray veth 4.
    fn world() -> (Fake, Fake, [Link; 4]) {
        let (host, pod) = Fake::pair();
        let bridge = link(1, "br-unit", "bridge");
        let mut port = link(2, "veth0001", "veth");
        port.controller = Some(1);
        port.peer_index = Some(3);
        let mut eth0 = link(3, "eth0", "veth");
        eth0.peer_index = Some(2);
        let stray = link(4, "veth0002", "veth");
        host.with_world(|w| {
            for l in [&bridge, &port, &stray] {
                w.host.links.insert(l.index, l.clone());
            }
            w.pod.links.insert(3, eth0.clone());
        });
        (host, pod, [bridge, port, eth0, stray])
    }

    #[test]
    fn bridge_verdicts() {
        let (host, _, [bridge, port, ..]) = world();
        assert!(check_bridge(&host, &entry(&bridge, ""), &conf(false)).is_ok());
        let e = check_bridge(&host, &entry(&bridge, ""), &conf(true));
        assert_eq!(
            e.unwrap_err().msg,
            "Bridge interface br-unit configured Promisc Mode true doesn't match current state: false "
        );
        let e = check_bridge(&host, &entry(&port, ""), &conf(false));
        assert_eq!(
            e.unwrap_err().msg,
            "Interface veth0001 does not have link type of bridge"
        );
        let mut wrong_mac = entry(&bridge, "");
        wrong_mac.mac = "02:00:00:00:00:99".into();
        let e = check_bridge(&host, &wrong_mac, &conf(false));
        assert_eq!(
            e.unwrap_err().msg,
            "Bridge interface br-unit Mac doesn't match: 02:00:00:00:00:99"
        );
        let gone = Interface {
            name: "br-gone".into(),
            ..Interface::default()
        };
        let e = check_bridge(&host, &gone, &conf(false));
        assert_eq!(e.unwrap_err().msg, "Interface name br-gone not found");
    }

    #[test]
    fn the_host_veth_is_the_container_links_peer_on_the_bridge() {
        let (host, _, [bridge, port, eth0, stray]) = world();
        let found = check_host_veth(&host, &entry(&port, ""), &bridge, &eth0);
        let (veth, container_mac) = found.unwrap().unwrap();
        assert_eq!((veth.index, container_mac), (2, eth0.mac));
        let other = check_host_veth(&host, &entry(&stray, ""), &bridge, &eth0);
        assert_eq!(other.unwrap(), None);
        let in_pod = check_host_veth(&host, &entry(&port, "/x"), &bridge, &eth0);
        assert_eq!(in_pod.unwrap(), None);
        let mut wrong_mac = entry(&port, "");
        wrong_mac.mac = "02:00:00:00:00:99".into();
        let e = check_host_veth(&host, &wrong_mac, &bridge, &eth0);
        assert_eq!(
            e.unwrap_err().msg,
            "Interface veth0001 Mac doesn't match: 02:00:00:00:00:99 not found"
        );
    }

    #[test]
    fn addresses_need_the_address_and_its_subnet_route() {
        let (_, pod, _) = world();
        let prev = CniResult {
            ips: vec![IpConfig {
                address: "10.9.0.5/24".parse().unwrap(),
                gateway: None,
                interface: Some(2),
            }],
            ..CniResult::default()
        };
        let e = check_addresses(&pod, "eth0", 3, &prev).unwrap_err();
        assert_eq!(e.msg, "Failed to match addr 10.9.0.5/24 on interface eth0");
        pod.with_world(|w| {
            w.pod.addresses.push(Address {
                ip: "10.9.0.5/24".parse().unwrap(),
                index: 3,
                scope: 0,
                flags: 0,
            });
        });
        let e = check_addresses(&pod, "eth0", 3, &prev).unwrap_err();
        assert_eq!(e.msg, "Failed to find route 10.9.0.0/24 for interface eth0");
        let subnet = KernelRoute {
            oif: Some(3),
            ..KernelRoute::new("10.9.0.0/24".parse().unwrap())
        };
        pod.with_world(|w| w.pod.routes.push(subnet));
        check_addresses(&pod, "eth0", 3, &prev).unwrap();
    }

    #[test]
    fn routes_match_by_destination_and_gateway() {
        let (_, pod, _) = world();
        let default = KernelRoute {
            gw: Some("10.9.0.1".parse().unwrap()),
            oif: Some(3),
            ..KernelRoute::new("0.0.0.0/0".parse().unwrap())
        };
        pod.with_world(|w| w.pod.routes.push(default));
        let route = |dst: &str, gw: Option<&str>| {
            cni_protocol::Route::new(dst.parse().unwrap(), gw.map(|g| g.parse().unwrap()))
        };
        // Any default route will do: later plugins may change its gateway.
        check_routes(&pod, &[route("0.0.0.0/0", Some("10.9.0.254"))]).unwrap();
        let e = check_routes(&pod, &[route("10.20.0.0/16", None)]);
        assert_eq!(
            e.unwrap_err().msg,
            "Expected Route {Dst:10.20.0.0/16 GW:<nil>} not found in routing table"
        );
    }
}
