//! Egress SNAT as the agent asks for it: pod traffic from this node's pod CIDRs to
//! anything outside the cluster leaves with the node's address. The rules themselves
//! live in `cni_firewall::egress`; this picks the backend and adapts the call.

use cni_firewall::egress::{self, EgressBackend, EgressPolicy};
use ipnetwork::IpNetwork;

use crate::cli::MasqueradeBackend;
use crate::error::{Error, Result};

/// The rules the reconciler keeps in step: a trait so the reconciler is tested
/// without a firewall.
pub trait EgressRules: Send {
    /// Makes the rules masquerade `sources` to anything outside `in_cluster`;
    /// returns whether anything changed.
    fn sync(&self, sources: &[IpNetwork], in_cluster: &[IpNetwork]) -> Result<bool>;
    /// The backend's name, for logs.
    fn name(&self) -> &'static str;
}

struct Firewall(EgressBackend);

impl EgressRules for Firewall {
    fn sync(&self, sources: &[IpNetwork], in_cluster: &[IpNetwork]) -> Result<bool> {
        let policy = EgressPolicy {
            sources: sources.to_vec(),
            exempt: in_cluster.to_vec(),
        };
        egress::sync(self.0, &policy).map_err(|source| Error::Egress {
            backend: self.name(),
            source,
        })
    }

    fn name(&self) -> &'static str {
        match self.0 {
            EgressBackend::Nftables => "nftables",
            EgressBackend::Iptables => "iptables",
        }
    }
}

/// The egress rules for `--masquerade-backend`; None for `none`.
pub fn open(choice: MasqueradeBackend) -> Result<Option<Box<dyn EgressRules>>> {
    let backend = match choice {
        MasqueradeBackend::None => {
            tracing::info!("egress SNAT is off (--masquerade-backend none)");
            return Ok(None);
        }
        MasqueradeBackend::Nftables => EgressBackend::Nftables,
        MasqueradeBackend::Iptables => EgressBackend::Iptables,
        MasqueradeBackend::Auto => EgressBackend::detect().map_err(Error::NoFirewall)?,
    };
    let rules = Firewall(backend);
    tracing::info!("egress SNAT through {}", rules.name());
    Ok(Some(Box::new(rules)))
}

/// How many prefixes the rules exempt (after merging, as the firewall does).
pub fn exempt_prefixes(in_cluster: &[IpNetwork]) -> usize {
    egress::aggregate(in_cluster).len()
}
