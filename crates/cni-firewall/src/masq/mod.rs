//! IP masquerading for container addresses (the bridge plugin's `ipMasq`),
//! on iptables or nftables, rule for rule like the reference plugins.
//!
//! Traffic from a container address to anything outside its subnet, except
//! multicast, is masqueraded. Setup and CHECK use the configured backend;
//! teardown and GC clean both backends, because the attachment may have been
//! created by another version or configuration (the reference does the same).
//!
//! Cleaning both must not make every DEL pay for the backend it did not use:
//! the nftables side is a netlink dump (microseconds), and the iptables side
//! (an `iptables-save` + `iptables-restore` per family) is skipped when the
//! tools are iptables-nft and nf_tables shows that there is nothing of ours
//! in their `nat` tables.

pub(crate) mod iptables;
pub(crate) mod nftables;

use std::collections::HashSet;

use ipnetwork::IpNetwork;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::naming::{IPTABLES_CHAIN_PREFIX, iptables_chain_name};
use crate::nfnetlink::{NFPROTO_IPV4, NFPROTO_IPV6, Nfnl};

/// Masquerades traffic from each of `ips` (container address with its
/// prefix, e.g. `10.77.0.2/24`) to destinations outside its subnet, except
/// multicast. Idempotent: a repeated setup adds nothing twice.
///
/// If this fails part-way, [`teardown`] removes whatever was installed.
pub fn setup(
    backend: Backend,
    network: &str,
    ifname: &str,
    container_id: &str,
    ips: &[IpNetwork],
) -> Result<()> {
    match backend {
        Backend::Iptables => iptables::setup(network, container_id, ips),
        Backend::Nftables => nftables::setup(network, ifname, container_id, ips),
    }
}

/// Removes the attachment's masquerade rules from both backends. Needs no
/// IP list; absent tools, tables or rules are not errors.
///
/// The iptables chain is per (network, container) like the reference, so it
/// also carries any other interface of the same container on this network.
pub fn teardown(network: &str, ifname: &str, container_id: &str) -> Result<()> {
    // One socket for both: releasing a netfilter socket can wait for the
    // kernel to finish freeing what a recent transaction deleted (an RCU
    // grace period), so a second socket closed after our own deletions
    // would pay that wait in the middle of DEL.
    let (nft, ipt_needed) = match Nfnl::open() {
        Ok(mut nl) => {
            let needed = iptables_chain_may_exist(&mut nl, network, container_id);
            let nft = nftables::teardown(&mut nl, network, ifname, container_id);
            (nft, needed)
        }
        Err(e) => (Err(e), true),
    };
    let nft = relevant(nft, nftables::usable);
    let ipt = if ipt_needed {
        relevant(
            iptables::teardown(network, container_id),
            crate::iptables::usable,
        )
    } else {
        Ok(())
    };
    Error::collect([ipt, nft].into_iter().filter_map(Result::err).collect())
}

/// Whether [`teardown`] runs the iptables tools for this container: not when
/// they are iptables-nft and nf_tables shows no chain of the container in
/// `ip nat` or `ip6 nat` (nothing there to remove). Public for tests.
#[doc(hidden)]
pub fn iptables_teardown_needed(network: &str, container_id: &str) -> bool {
    Nfnl::open().map_or(true, |mut nl| {
        iptables_chain_may_exist(&mut nl, network, container_id)
    })
}

fn iptables_chain_may_exist(nl: &mut Nfnl, network: &str, container_id: &str) -> bool {
    let chain = iptables_chain_name(network, container_id);
    iptables_may_hold(nl, |nl, family| nl.has_chain(family, IPTABLES_NAT, &chain))
}

/// Verifies that [`setup`] with the same arguments is in effect; the error
/// names every missing rule.
pub fn check(
    backend: Backend,
    network: &str,
    ifname: &str,
    container_id: &str,
    ips: &[IpNetwork],
) -> Result<()> {
    match backend {
        Backend::Iptables => iptables::check(network, container_id, ips),
        Backend::Nftables => nftables::check(network, ifname, container_id, ips),
    }
}

/// Removes this network's masquerade rules of attachments not in `valid`
/// (pairs of container id and interface name), in both backends. Keeps going
/// past failures and reports them together.
///
/// iptables chains carry no interface name, so a chain stays as long as any
/// valid attachment has its container id.
pub fn gc<C: AsRef<str>, I: AsRef<str>>(network: &str, valid: &[(C, I)]) -> Result<()> {
    let valid: Vec<(&str, &str)> = valid
        .iter()
        .map(|(c, i)| (c.as_ref(), i.as_ref()))
        .collect();
    let ids: HashSet<&str> = valid.iter().map(|(c, _)| *c).collect();
    let any_cni_chain = |nl: &mut Nfnl, family| {
        nl.chain_names(family, IPTABLES_NAT)
            .map(|names| names.iter().any(|n| n.starts_with(IPTABLES_CHAIN_PREFIX)))
    };
    let (nft, ipt_needed) = match Nfnl::open() {
        Ok(mut nl) => (
            nftables::gc(&mut nl, network, &valid),
            iptables_may_hold(&mut nl, any_cni_chain),
        ),
        Err(e) => (Err(e), true),
    };
    let ipt = if ipt_needed {
        relevant(iptables::gc(network, &ids), crate::iptables::usable)
    } else {
        Ok(())
    };
    Error::collect(
        [ipt, relevant(nft, nftables::usable)]
            .into_iter()
            .filter_map(Result::err)
            .collect(),
    )
}

/// The table iptables-nft keeps the `nat` rules in (family `ip` for
/// iptables, `ip6` for ip6tables).
const IPTABLES_NAT: &str = "nat";

/// The multi-call binary of iptables-nft (Debian, Fedora, Alpine, ...).
const XTABLES_NFT: &str = "xtables-nft-multi";

/// Whether both `iptables-save` and `ip6tables-save` are iptables-nft, so
/// that all their rules live in nf_tables where netlink can see them.
fn iptables_is_nft() -> bool {
    ["iptables-save", "ip6tables-save"].iter().all(|program| {
        crate::exec::locate(program)
            .and_then(|path| std::fs::canonicalize(path).ok())
            .is_some_and(|real| real.file_name() == Some(XTABLES_NFT.as_ref()))
    })
}

/// Whether iptables may hold something to clean up, by asking nf_tables
/// `present` for both families' `nat` tables. Only a definite "no" in both
/// (iptables-nft, and `present` false or the table absent) lets the caller
/// skip the iptables tools; legacy iptables and any doubt keep the exec path.
fn iptables_may_hold(nl: &mut Nfnl, present: impl Fn(&mut Nfnl, u8) -> Result<bool>) -> bool {
    if !iptables_is_nft() {
        return true;
    }
    [NFPROTO_IPV4, NFPROTO_IPV6]
        .into_iter()
        .any(|family| present(nl, family).unwrap_or(true))
}

/// Cleanup errors only count for a backend that works here: a node without
/// the tool or kernel support cannot hold rules in it (the reference ignores
/// such errors too).
fn relevant(result: Result<()>, usable: impl FnOnce() -> bool) -> Result<()> {
    match result {
        Err(Error::ProgramNotFound { .. }) => Ok(()),
        Err(e) if usable() => Err(e),
        _ => Ok(()),
    }
}
