//! The portmap plugin: publishes a container's ports on the node
//! (`runtimeConfig.portMappings`, the `portMappings` capability), chained
//! after the plugin that gave the container its addresses. A drop-in for the
//! reference `portmap`: same keys, same rules, same chain and table names.

pub mod config;

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;

use cni_firewall::hostport::{self, Forward};
use cni_protocol::failpoint::hit;
use cni_protocol::{CniError, CniResult, Context as _, ErrorCode, Plugin, Request, log};
use ipnetwork::IpNetwork;

pub use config::Config;

/// The portmap plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Portmap;

/// Where libcni (containerd, CRI-O, Podman, cnitool) caches each attachment's
/// result; GC reads it to tell whether a container is attached elsewhere.
const LIBCNI_CACHE: &str = "/var/lib/cni/results";

fn firewall_error(e: &cni_firewall::Error) -> CniError {
    cni_protocol::error::internal(e)
}

fn forward<'a>(req: &'a Request, config: &'a Config, container: IpNetwork) -> Forward<'a> {
    Forward {
        network: &req.config.name,
        container_id: &req.args.container_id,
        container,
        mappings: &config.mappings,
        snat: config.snat.clone(),
        conditions: config.conditions(container.ip()),
    }
}

fn prev_result(req: &Request, missing: &str) -> Result<CniResult, CniError> {
    req.config
        .prev_result
        .clone()
        .ok_or_else(|| CniError::invalid_config(missing))
}

impl Plugin for Portmap {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let config = Config::parse(&req.config.raw)?;
        let prev = prev_result(req, "must be called as chained plugin")?;
        if config.mappings.is_empty() {
            return Ok(prev);
        }
        hit("portmap/parsed")?;
        // Netfilter sockets are closed when the ADD is done, not each on a thread of its
        // own as it is let go: starting that thread cost more than the rest of the
        // nftables work, and an ADD only adds, so its own transaction leaves the close
        // nothing to wait for.
        let _sockets = cni_firewall::keep_sockets();
        let backend = config.backend();
        let addresses = config::container_addresses(&prev, &req.args.ifname);
        // All or nothing: until disarmed, the guard removes whatever this ADD
        // installed, also when a step panics.
        let mut undo = Undo {
            network: &req.config.name,
            container_id: &req.args.container_id,
            armed: true,
        };
        let forwards: Vec<Forward<'_>> = addresses
            .iter()
            .map(|&container| forward(req, &config, container))
            .collect();
        hostport::setup_all(backend, &forwards).map_err(|e| firewall_error(&e))?;
        hit("portmap/rules-installed")?;
        for f in &forwards {
            log::info(&format!(
                "{backend}: {} host port(s) to {}",
                f.mappings().count(),
                f.container.ip()
            ));
        }
        if config.snat != hostport::Snat::Off
            && let Some(v4) = addresses.iter().find(|a| a.is_ipv4())
        {
            enable_localnet_routing(v4.ip())?;
            hit("portmap/route-localnet")?;
        }
        let udp_ports: Vec<u16> = config
            .mappings
            .iter()
            .filter(|m| m.protocol == hostport::Protocol::Udp)
            .map(|m| m.host_port)
            .collect();
        if !udp_ports.is_empty() {
            // Each family is a walk of the kernel's whole conntrack table: both at once.
            std::thread::scope(|scope| {
                for &container in &addresses {
                    let ports = &udp_ports;
                    scope.spawn(move || forget_stale_udp(container, ports));
                }
            });
        }
        hit("portmap/conntrack")?;
        undo.armed = false;
        Ok(prev)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        // No prevResult, netns or mapping list is needed: the rules are found
        // by the network and container, in both backends.
        hit("portmap/del")?;
        hostport::teardown(&req.config.name, &req.args.container_id).map_err(|e| firewall_error(&e))
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let config = Config::parse(&req.config.raw)?;
        let prev = prev_result(req, "Required prevResult missing")?;
        if config.mappings.is_empty() {
            return Ok(());
        }
        let backend = config.backend();
        for container in config::container_addresses(&prev, &req.args.ifname) {
            hostport::check(backend, &forward(req, &config, container))
                .map_err(|e| firewall_error(&e))?;
        }
        Ok(())
    }

    fn gc(&self, req: &Request) -> Result<(), CniError> {
        let valid = req.config.valid_attachments()?;
        let valid: HashSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
        let network = req.config.name.clone();
        let elsewhere = |id: &str| attached_elsewhere(Path::new(LIBCNI_CACHE), &network, id);
        hostport::gc(&req.config.name, &valid, &elsewhere).map_err(|e| firewall_error(&e))
    }

    fn status(&self, req: &Request) -> Result<(), CniError> {
        let config = Config::parse(&req.config.raw)?;
        let backend = config.backend();
        if hostport::usable(backend) {
            Ok(())
        } else {
            Err(CniError::new(
                ErrorCode::PLUGIN_NOT_AVAILABLE,
                format!("the {backend} backend cannot be used on this node"),
            ))
        }
    }
}

/// Removes the host port rules of an ADD that did not finish.
struct Undo<'a> {
    network: &'a str,
    container_id: &'a str,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Err(e) = hostport::teardown(self.network, self.container_id) {
            log::info(&format!("undoing a failed ADD: {e}"));
        }
    }
}

/// Whether libcni's cache holds a result of container `id` on another
/// network than `network` (files are named `<network>-<id>-<ifname>`).
fn attached_elsewhere(cache: &Path, network: &str, id: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return false;
    };
    let ours = format!("{network}-{id}-");
    entries.filter_map(Result::ok).any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.contains(&format!("-{id}-")) && !name.starts_with(&ours)
    })
}

/// Lets connections from `127.0.0.1` to a host port be routed to the
/// container: the kernel drops 127/8 sources on other interfaces unless
/// `route_localnet` is set on the one that leads to the container.
fn enable_localnet_routing(container: IpAddr) -> Result<(), CniError> {
    let Some(ifname) = interface_towards(container)? else {
        return Ok(());
    };
    cni_linux::sysctl::write(&format!("net/ipv4/conf/{ifname}/route_localnet"), "1")
        .with_context(|| format!("unable to enable route_localnet on {ifname}"))
}

/// The interface the kernel routes `ip` through (`ip route get`).
fn interface_towards(ip: IpAddr) -> Result<Option<String>, CniError> {
    use cni_linux::netlink::Netlink;
    let linux = |e: cni_linux::Error| cni_protocol::error::internal(&e);
    let nl = Netlink::connect().map_err(linux)?;
    let Some(index) = nl.route_get_oif(ip).map_err(linux)? else {
        return Ok(None);
    };
    Ok(nl.link_by_index(index).map_err(linux)?.map(|l| l.name))
}

/// Deletes the conntrack entries of the UDP host `ports` in `container`'s
/// family, so that a client that kept sending to one while the container was
/// replaced reaches the new one (conntrack would otherwise keep translating
/// to the old address). A failure only costs that, so it is logged, not
/// returned.
fn forget_stale_udp(container: IpNetwork, ports: &[u16]) {
    // AF_INET, AF_INET6.
    let family = if container.is_ipv4() { 2 } else { 10 };
    if let Err(e) = cni_firewall::conntrack::delete_udp_by_dst_ports(family, ports) {
        log::info(&format!(
            "failed to delete stale UDP conntrack entries for {}: {e}",
            container.ip()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_networks_are_told_apart_in_the_cache() {
        let dir = std::env::temp_dir().join(format!("portmap-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("net1-abc-eth0"), "{}").unwrap();
        assert!(!attached_elsewhere(&dir, "net1", "abc"));
        std::fs::write(dir.join("net2-abc-eth1"), "{}").unwrap();
        assert!(attached_elsewhere(&dir, "net1", "abc"));
        assert!(!attached_elsewhere(&dir, "net1", "abd"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
