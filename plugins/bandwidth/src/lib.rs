//! The bandwidth plugin: limits a pod's traffic, chained after the plugin that made
//! its veth. Traffic into the pod goes through a token bucket on the host end of the
//! veth; traffic out of the pod is redirected from the veth's ingress to an ifb
//! device whose token bucket shapes it. A drop-in for the reference `bandwidth`:
//! same keys, same device names, same qdiscs, filter and parameters.

pub mod config;

use cni_linux::netlink::tc::{self, HANDLE_INGRESS, HANDLE_ROOT, INGRESS_QDISC, Tbf};
use cni_linux::{Link, NetNs, Netlink};
use cni_protocol::failpoint::hit;
use cni_protocol::result::Interface;
use cni_protocol::{CniError, CniResult, Plugin, Request, log};

pub use config::{Limits, Shape, ifb_name};

/// The bandwidth plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bandwidth;

fn linux(e: &cni_linux::Error) -> CniError {
    cni_protocol::error::internal(e)
}

fn prev_result(req: &Request, missing: &str) -> Result<CniResult, CniError> {
    req.config
        .prev_result
        .clone()
        .ok_or_else(|| CniError::invalid_config(format!("{missing}: the config has no prevResult")))
}

fn ticks_per_usec() -> Result<f64, CniError> {
    tc::psched_ticks_per_usec()
        .map_err(|e| CniError::internal(format!("failed to read /proc/net/psched: {e}")))
}

/// The host end of the container's veth, found as the reference finds it: the
/// peer of `CNI_IFNAME` in the container, which must be an interface of
/// `prevResult` without a sandbox.
fn host_interface(req: &Request, prev: &CniResult, host: &Netlink) -> Result<Link, CniError> {
    if prev.interfaces.is_empty() {
        return Err(CniError::internal("no interfaces provided"));
    }
    let netns = NetNs::open(&req.args.netns)
        .map_err(|e| cni_linux::netns::container_netns_error(e, &req.args.netns))?;
    let ifname = &req.args.ifname;
    let inside = Netlink::connect_in(&netns).and_then(|nl| nl.link_by_name(ifname));
    let peer = match &inside {
        Ok(Some(link)) if link.kind.as_deref() == Some("veth") => link.peer_index,
        _ => None,
    };
    let Some(peer) = peer.filter(|p| *p > 0) else {
        let why = match inside {
            Ok(Some(_)) => "not a veth".to_owned(),
            Ok(None) => "link not found".to_owned(),
            Err(e) => cni_protocol::error::chain(&e),
        };
        return Err(CniError::internal(format!(
            "container interface {ifname} has no veth peer: {why}"
        )));
    };
    let link = host
        .link_by_index(peer)
        .map_err(|e| linux(&e))?
        .ok_or_else(|| {
            CniError::internal(format!("veth peer with index {peer} is not in host ns"))
        })?;
    if prev
        .interfaces
        .iter()
        .any(|i| i.sandbox.is_empty() && i.name == link.name)
    {
        Ok(link)
    } else {
        Err(CniError::internal(
            "no veth peer of container interface found in host ns",
        ))
    }
}

impl Plugin for Bandwidth {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let limits = config::parse(&req.config.raw)?;
        let mut result = prev_result(req, "must be called as chained plugin")?;
        if limits.is_empty() {
            return Ok(result);
        }
        let ticks = ticks_per_usec()?;
        let host = Netlink::connect().map_err(|e| linux(&e))?;
        let veth = host_interface(req, &result, &host)?;
        let limits = limits.for_mtu(veth.mtu);
        hit("bandwidth/found-veth")?;
        // All or nothing: until disarmed, the guard removes what this ADD made.
        let mut undo = Undo {
            host: &host,
            veth_tbf: None,
            veth_ingress: None,
            ifb: None,
        };
        if let Some(shape) = limits.ingress {
            host.add_tbf(veth.index, &config::token_bucket(shape, ticks))
                .map_err(|e| linux(&e))?;
            undo.veth_tbf = Some(veth.index);
            hit("bandwidth/ingress-limited")?;
        }
        if let Some(shape) = limits.egress {
            let name = ifb_name(&req.config.name, &req.args.container_id);
            host.create_ifb(&name, veth.mtu).map_err(|e| linux(&e))?;
            undo.ifb = Some(name.clone());
            hit("bandwidth/ifb-created")?;
            let ifb = host.require_link(&name).map_err(|e| linux(&e))?;
            result.interfaces.push(Interface {
                name: name.clone(),
                mac: ifb.mac.map(|m| m.to_string()).unwrap_or_default(),
                ..Interface::default()
            });
            host.add_ingress_qdisc(veth.index).map_err(|e| linux(&e))?;
            undo.veth_ingress = Some(veth.index);
            hit("bandwidth/ingress-qdisc")?;
            host.add_redirect_filter(veth.index, ifb.index)
                .map_err(|e| linux(&e))?;
            hit("bandwidth/redirected")?;
            host.add_tbf(ifb.index, &config::token_bucket(shape, ticks))
                .map_err(|e| linux(&e).context("create ifb qdisc"))?;
            hit("bandwidth/egress-limited")?;
        }
        undo.disarm();
        log::info(&format!("limits on {}: {limits:?}", veth.name));
        Ok(result)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        // Only the ifb device is this plugin's own: the veth, with its qdiscs, goes
        // with the main plugin's DEL. No netns or prevResult is needed.
        hit("bandwidth/del")?;
        let name = ifb_name(&req.config.name, &req.args.container_id);
        let host = Netlink::connect().map_err(|e| linux(&e))?;
        delete_ifb(&host, &name)?;
        hit("bandwidth/ifb-deleted")
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let limits = config::parse(&req.config.raw)?;
        let prev = prev_result(req, "must be called as a chained plugin")?;
        if limits.is_empty() {
            return Ok(());
        }
        let ticks = ticks_per_usec()?;
        let host = Netlink::connect().map_err(|e| linux(&e))?;
        let veth = host_interface(req, &prev, &host)?;
        let limits = limits.for_mtu(veth.mtu);
        if let Some(shape) = limits.ingress {
            let want = config::token_bucket(shape, ticks);
            check_tbf(&host, &veth, &want)?;
        }
        if let Some(shape) = limits.egress {
            let name = ifb_name(&req.config.name, &req.args.container_id);
            let ifb = host
                .link_by_name(&name)
                .map_err(|e| linux(&e))?
                .ok_or_else(|| {
                    CniError::internal(format!("get ifb device: link {name:?} not found"))
                })?;
            check_tbf(&host, &ifb, &config::token_bucket(shape, ticks))?;
            let qdiscs = host.qdiscs(veth.index).map_err(|e| linux(&e))?;
            if !qdiscs
                .iter()
                .any(|q| q.parent == HANDLE_INGRESS && q.kind == "ingress")
            {
                return Err(CniError::internal(format!(
                    "no ingress qdisc on {}: its traffic is not redirected to {name}",
                    veth.name
                )));
            }
            let filters = host
                .filters(veth.index, INGRESS_QDISC)
                .map_err(|e| linux(&e))?;
            if !filters.iter().any(|f| f.redirects_all_to(ifb.index)) {
                return Err(CniError::internal(format!(
                    "no filter on {} redirects its traffic to {name}",
                    veth.name
                )));
            }
        }
        Ok(())
    }

    fn gc(&self, req: &Request) -> Result<(), CniError> {
        let valid = req.config.valid_attachments()?;
        let keep: Vec<String> = valid
            .iter()
            .map(|a| ifb_name(&req.config.name, &a.container_id))
            .collect();
        let host = Netlink::connect().map_err(|e| linux(&e))?;
        let links = host.links().map_err(|e| linux(&e))?;
        let redirected = redirect_targets(&host)?;
        let mut errors = Vec::new();
        for link in links.iter().filter(|l| is_plugin_ifb(l)) {
            // An ifb that a pod's veth still redirects to is in use, whichever
            // network it belongs to (its name does not say).
            if keep.contains(&link.name) || redirected.contains(&link.index) {
                continue;
            }
            if let Err(e) = delete_ifb(&host, &link.name) {
                errors.push(e.msg);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(CniError::internal(errors.join("; ")))
        }
    }

    fn status(&self, req: &Request) -> Result<(), CniError> {
        config::parse(&req.config.raw)?;
        Ok(())
    }
}

/// Whether `link` looks like one of the plugin's ifb devices (`bwp` and 12 hex digits).
fn is_plugin_ifb(link: &Link) -> bool {
    link.kind.as_deref() == Some("ifb")
        && link.name.len() == 15
        && link
            .name
            .strip_prefix(config::IFB_PREFIX)
            .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The links that some link's ingress filters redirect every packet to.
fn redirect_targets(host: &Netlink) -> Result<Vec<u32>, CniError> {
    let qdiscs = host.all_qdiscs().map_err(|e| linux(&e))?;
    // Plain lists: lookups among a node's few hundred links cost nothing next to the
    // dumps.
    let mut with_ingress: Vec<u32> = qdiscs
        .iter()
        .filter(|q| q.parent == HANDLE_INGRESS)
        .map(|q| q.link)
        .collect();
    with_ingress.sort_unstable();
    with_ingress.dedup();
    let mut targets = Vec::new();
    for link in with_ingress {
        match host.filters(link, INGRESS_QDISC) {
            Ok(filters) => targets.extend(
                filters
                    .iter()
                    .filter(|f| f.matches_all)
                    .flat_map(|f| f.mirred.iter().map(|m| m.target)),
            ),
            // The link or its ingress qdisc went away meanwhile.
            Err(e) if e.is_not_found() || e.errno() == Some(cni_linux::Errno::EINVAL as i32) => {}
            Err(e) => return Err(linux(&e)),
        }
    }
    Ok(targets)
}

fn delete_ifb(host: &Netlink, name: &str) -> Result<(), CniError> {
    host.delete_link_by_name(name)
        .map(|_| ())
        .map_err(|e| linux(&e))
}

/// Compares `link`'s root token bucket with the one the limits ask for, in the
/// reference's words, naming the link and both values.
fn check_tbf(host: &Netlink, link: &Link, want: &Tbf) -> Result<(), CniError> {
    let qdiscs = host.qdiscs(link.index).map_err(|e| linux(&e))?;
    let Some(got) = qdiscs
        .iter()
        .find(|q| q.parent == HANDLE_ROOT)
        .and_then(|q| q.tbf.as_ref())
    else {
        return Err(CniError::internal(format!(
            "Failed to find qdisc: no tbf qdisc at the root of {}",
            link.name
        )));
    };
    let mismatch = |what: &str, got: u64, want: u64| {
        Err(CniError::internal(format!(
            "{what} doesn't match: the tbf qdisc of {} has {got}, the config asks for {want}",
            link.name
        )))
    };
    if got.rate != want.rate {
        return mismatch("Rate", got.rate, want.rate);
    }
    if got.limit != want.limit {
        return mismatch("Limit", got.limit.into(), want.limit.into());
    }
    if got.buffer != want.buffer {
        return mismatch("Buffer", got.buffer.into(), want.buffer.into());
    }
    Ok(())
}

/// Removes what an ADD that did not finish made (also when a step panics).
struct Undo<'a> {
    host: &'a Netlink,
    veth_tbf: Option<u32>,
    veth_ingress: Option<u32>,
    ifb: Option<String>,
}

impl Undo<'_> {
    fn disarm(&mut self) {
        self.veth_tbf = None;
        self.veth_ingress = None;
        self.ifb = None;
    }
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        // Deleting the ifb takes its token bucket along; the veth's ingress qdisc
        // takes its filter along.
        if let Some(name) = &self.ifb
            && let Err(e) = self.host.delete_link_by_name(name)
        {
            log::info(&format!("undoing a failed ADD: {e}"));
        }
        for (index, parent) in [
            (self.veth_ingress, HANDLE_INGRESS),
            (self.veth_tbf, HANDLE_ROOT),
        ] {
            if let Some(index) = index
                && let Err(e) = self.host.delete_qdisc(index, parent)
            {
                log::info(&format!("undoing a failed ADD: {e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, kind: &str) -> Link {
        Link {
            index: 9,
            name: name.to_owned(),
            mac: None,
            mtu: 1500,
            kind: Some(kind.to_owned()),
            controller: None,
            up: true,
            oper_state: cni_linux::OperState::Unknown,
            promisc: false,
            peer_index: None,
            link_netnsid: None,
            vlan_filtering: None,
            bridge_port: None,
            vxlan: None,
        }
    }

    #[test]
    fn only_the_plugins_own_ifb_devices_are_collected() {
        assert!(is_plugin_ifb(&link(&ifb_name("net1", "ctr1"), "ifb")));
        // Another kind, another prefix, another length, not hex.
        assert!(!is_plugin_ifb(&link(&ifb_name("net1", "ctr1"), "dummy")));
        assert!(!is_plugin_ifb(&link("ifb0", "ifb")));
        assert!(!is_plugin_ifb(&link("bwp85373d34c68", "ifb")));
        assert!(!is_plugin_ifb(&link("bwp85373d34c68z", "ifb")));
    }
}
