//! Host ports (the `portmap` plugin): DNAT from a port of the node's local
//! addresses to a container's port, and masquerade for the connections that
//! need it (a container reaching its own hostPort, and connections from
//! `127.0.0.1`), on iptables or nftables with the reference plugin's chain
//! names, rule comments and table, so that either plugin removes what the
//! other made.
//!
//! Setup and CHECK use the configured backend; teardown and GC clean both,
//! because the attachment may have been made by another version or
//! configuration.

pub(crate) mod iptables;
pub(crate) mod nftables;

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::backend::Backend;
use crate::error::{Error, Result};

/// The reference's default mark bit for "masquerade this" (Kubernetes uses
/// 14 and 15, Calico 20-31).
pub const DEFAULT_MARK_BIT: u8 = 13;

/// A transport protocol a host port can be mapped for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// The protocol as iptables and nft spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The IP protocol number.
    pub(crate) fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    /// Parses a `protocol` value the way runtimes send it (any case).
    pub fn parse(value: &str) -> Option<Protocol> {
        match value.to_ascii_lowercase().as_str() {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            "sctp" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `runtimeConfig.portMappings` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// The port on the node.
    pub host_port: u16,
    /// The port in the container.
    pub container_port: u16,
    /// TCP, UDP or SCTP.
    pub protocol: Protocol,
    /// Only this local address of the node (`None`, or an unspecified
    /// address, means every local address).
    pub host_ip: Option<IpAddr>,
}

impl Mapping {
    /// Whether the mapping applies to a container address of `ip`'s family:
    /// a `hostIP` of the other family skips it, as in the reference.
    pub(crate) fn applies_to(&self, ip: IpAddr) -> bool {
        self.host_ip.is_none_or(|h| h.is_ipv4() == ip.is_ipv4())
    }

    /// The destination address to match, if the mapping names one.
    pub(crate) fn destination(&self) -> Option<IpAddr> {
        self.host_ip.filter(|h| !h.is_unspecified())
    }
}

/// How connections to a host port are masqueraded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Snat {
    /// `snat: false`: no masquerade at all.
    Off,
    /// Mark with bit `mark_bit` in the shared `CNI-HOSTPORT-SETMARK` chain,
    /// masqueraded by `CNI-HOSTPORT-MASQ` (iptables; nftables masquerades
    /// directly).
    Mark {
        /// `markMasqBit`, 0-31.
        mark_bit: u8,
        /// `masqAll`: masquerade every connection to the host port, not only
        /// hairpin and localhost ones.
        masq_all: bool,
    },
    /// `externalSetMarkChain`: jump to this chain (owned by someone else,
    /// e.g. kube-proxy's `KUBE-MARK-MASQ`) instead of ours.
    External {
        /// The chain to jump to.
        chain: String,
        /// `masqAll`.
        masq_all: bool,
    },
}

/// One attachment's host ports for one container address.
#[derive(Debug, Clone)]
pub struct Forward<'a> {
    /// The network name.
    pub network: &'a str,
    /// `CNI_CONTAINERID`.
    pub container_id: &'a str,
    /// The container address with its prefix, e.g. `10.244.1.5/24`.
    pub container: IpNetwork,
    /// Every mapping of the attachment (those of the other family are skipped).
    pub mappings: &'a [Mapping],
    /// Masquerade choice.
    pub snat: Snat,
    /// `conditionsV4`/`conditionsV6` of this family: extra matches on the
    /// entry rules, in the backend's own syntax.
    pub conditions: &'a [String],
}

impl Forward<'_> {
    /// The mappings for this container address's family.
    pub fn mappings(&self) -> impl Iterator<Item = &Mapping> {
        let ip = self.container.ip();
        self.mappings.iter().filter(move |m| m.applies_to(ip))
    }
}

/// Installs the rules of all `forwards` (one container's addresses, one per family):
/// on nftables in one transaction (the kernel serializes a netns's commits anyway),
/// on iptables each family's save and restore at the same time. On failure the
/// caller removes what was installed ([`teardown`]).
pub fn setup_all(backend: Backend, forwards: &[Forward<'_>]) -> Result<()> {
    match backend {
        Backend::Iptables => iptables::setup_all(forwards),
        Backend::Nftables => nftables::setup_all(forwards),
    }
}

/// Whether the rules of `forward` are all in place.
pub fn check(backend: Backend, forward: &Forward<'_>) -> Result<()> {
    match backend {
        Backend::Iptables => iptables::check(forward),
        Backend::Nftables => nftables::check(forward),
    }
}

/// Removes the host port rules of (`network`, `container_id`) from both
/// backends; absent tools, tables or rules are not errors.
pub fn teardown(network: &str, container_id: &str) -> Result<()> {
    let nft = relevant(nftables::teardown(container_id), nftables::usable);
    let ipt = relevant(
        iptables::teardown(network, container_id),
        crate::iptables::usable,
    );
    Error::collect([nft, ipt].into_iter().filter_map(Result::err).collect())
}

/// Removes the host port rules of every attachment of `network` whose
/// container is not in `valid`. iptables rules name their network, so that
/// side is exact. nftables rules carry only the container ID (as the
/// reference writes them), so a container is kept there also when
/// `elsewhere(id)` says it is attached to another network.
pub fn gc(network: &str, valid: &HashSet<&str>, elsewhere: &dyn Fn(&str) -> bool) -> Result<()> {
    let nft = relevant(
        nftables::gc(&|id: &str| valid.contains(id) || elsewhere(id)),
        nftables::usable,
    );
    let ipt = relevant(iptables::gc(network, valid), crate::iptables::usable);
    Error::collect([nft, ipt].into_iter().filter_map(Result::err).collect())
}

/// Whether the named backend can be used here at all.
pub fn usable(backend: Backend) -> bool {
    match backend {
        Backend::Iptables => crate::iptables::usable(),
        Backend::Nftables => nftables::usable(),
    }
}

/// A failure of a backend that does not work here at all is not a failure
/// to clean up: there is nothing of ours in it.
fn relevant(result: Result<()>, usable: impl FnOnce() -> bool) -> Result<()> {
    match result {
        Err(Error::ProgramNotFound { .. }) => Ok(()),
        Err(e) if !usable() => {
            drop(e);
            Ok(())
        }
        other => other,
    }
}
