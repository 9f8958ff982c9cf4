//! The loopback plugin: brings `lo` up in the container's netns on ADD and down on DEL,
//! and reports it with its addresses in the requested version's shape.

use cni_linux::netlink::{Family, Link, Netlink};
use cni_linux::netns::{NetNs, container_netns_error};
use cni_protocol::{CniError, CniResult, Interface, IpConfig, Plugin, Request};

/// The loopback plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Loopback;

const LO: &str = "lo";

impl Plugin for Loopback {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let ns = open_netns(&req.args)?;
        let ips = in_netns(&ns, |nl| {
            let lo = require_lo(&nl)?;
            nl.set_up(lo.index).map_err(linux_error)?;
            loopback_addresses(&nl, lo.index)
        })?;
        // A chained loopback passes the previous result through, but still brings `lo` up.
        if let Some(prev) = &req.config.prev_result {
            return Ok(prev.clone());
        }
        Ok(CniResult {
            cni_version: req.config.cni_version.clone(),
            interfaces: vec![Interface {
                name: LO.into(),
                mac: "00:00:00:00:00:00".into(),
                sandbox: req.args.netns.clone(),
                ..Interface::default()
            }],
            ips,
            ..CniResult::default()
        })
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        if req.args.netns_path().is_none() {
            return Ok(());
        }
        let ns = match NetNs::open_container(&req.args.netns, req.args.netns_override) {
            Err(cni_linux::Error::NetnsNotFound { .. }) => return Ok(()),
            other => other.map_err(|e| container_netns_error(e, &req.args.netns))?,
        };
        in_netns(&ns, |nl| {
            let lo = require_lo(&nl)?;
            nl.set_down(lo.index).map_err(linux_error)
        })
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let ns = open_netns(&req.args)?;
        in_netns(&ns, |nl| {
            match nl.link_by_name(LO).map_err(linux_error)? {
                Some(lo) if lo.up => Ok(()),
                _ => Err(CniError::internal("loopback interface is down")),
            }
        })
    }
}

/// A Linux-layer error with its causes, so the kernel's errno reaches the user.
fn linux_error(e: cni_linux::Error) -> CniError {
    cni_protocol::error::internal(&e)
}

/// Opens the container's netns once, refusing the plugin's own (unless
/// `CNI_NETNS_OVERRIDE`): bringing the plugin's own `lo` down is not the runtime's wish.
fn open_netns(args: &cni_protocol::CmdArgs) -> Result<NetNs, CniError> {
    NetNs::open_container(&args.netns, args.netns_override)
        .map_err(|e| container_netns_error(e, &args.netns))
}

/// Runs `work` with a netlink connection inside `ns`.
fn in_netns<F, T>(ns: &NetNs, work: F) -> Result<T, CniError>
where
    F: FnOnce(Netlink) -> Result<T, CniError>,
{
    let nl = Netlink::connect_in(ns).map_err(linux_error)?;
    work(nl)
}

fn require_lo(nl: &Netlink) -> Result<Link, CniError> {
    nl.link_by_name(LO)
        .map_err(linux_error)?
        .ok_or_else(|| CniError::internal("failed to find loopback interface \"lo\""))
}

/// The first IPv4 and first IPv6 address of `lo`, refusing anything that is not loopback.
fn loopback_addresses(nl: &Netlink, index: u32) -> Result<Vec<IpConfig>, CniError> {
    let mut ips = Vec::new();
    for family in [Family::V4, Family::V6] {
        let addrs = nl.addresses(index, Some(family)).map_err(linux_error)?;
        if let Some(bad) = addrs.iter().find(|a| !a.ip.ip().is_loopback()) {
            // The namespace's state, not the config: the reference's words and code.
            return Err(CniError::new(
                cni_protocol::ErrorCode::INTERNAL,
                format!(
                    "loopback interface found with non-loopback address {:?}",
                    bad.ip.ip().to_string()
                ),
            ));
        }
        if let Some(first) = addrs.first() {
            ips.push(IpConfig {
                address: first.ip,
                gateway: None,
                interface: Some(0),
            });
        }
    }
    Ok(ips)
}
