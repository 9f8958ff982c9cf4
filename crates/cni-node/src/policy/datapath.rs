//! The kernel side of NetworkPolicy: what the reconciler asks of it ([`PolicyDatapath`],
//! a trait so the reconciler is tested without nf_tables), what it holds after a pass
//! ([`PolicyCounts`]), and the real one over the firewall crate's `inet cni_node_policy`
//! table, which keeps what it committed in memory and sends only differences.

use cni_firewall::network_policy::{self, PolicyState, PolicyTable};

use super::pipeline::{Pipeline, Stage};
use crate::error::{Error, Result};

/// The policy tables: a trait so the reconciler is tested without nf_tables.
pub trait PolicyDatapath: Send {
    /// Makes the kernel hold what the pipeline's ready tiers want (only the differences
    /// from what it holds) and releases the addresses they judge from the pending sets;
    /// a tier that is not ready keeps what the kernel holds for it. Whether anything
    /// changed.
    fn apply(&mut self, want: Pipeline) -> Result<bool>;
    /// Reads the kernel's table again (the resync: a hand edit is repaired by the next
    /// apply).
    fn reload(&mut self) -> Result<()>;
}

/// What the NetworkPolicy table holds after a pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyCounts {
    /// Local pod addresses isolated for ingress.
    pub ingress: usize,
    /// Local pod addresses isolated for egress.
    pub egress: usize,
    /// Profiles (what a set of pods allows), both directions.
    pub profiles: usize,
    /// Shared peer sets.
    pub peer_sets: usize,
}

/// The table, as the agent drives it.
#[derive(Debug)]
pub struct Table {
    table: PolicyTable,
    bridge_netfilter_on: bool,
}

impl Table {
    /// Opens the table and reads what an earlier run left in the kernel, so the first
    /// pass sends only what differs (a restart changes nothing that is right).
    pub fn open() -> Result<Self> {
        let mut table = PolicyTable::open().map_err(Error::Policy)?;
        table.load().map_err(Error::Policy)?;
        Ok(Self {
            table,
            bridge_netfilter_on: false,
        })
    }
}

impl PolicyDatapath for Table {
    fn apply(&mut self, want: Pipeline) -> Result<bool> {
        // The one kind so far: while it waits, the table stays as it is.
        let Stage::Ready(want) = want.network_policy else {
            return Ok(false);
        };
        let want = want.compiled;
        // Bridged traffic between a node's pods reaches netfilter only through
        // br_netfilter; checked every pass (two sysctl reads), since anything may turn
        // it off.
        let were_on = network_policy::enable_bridge_netfilter().map_err(Error::Policy)?;
        if !were_on || !self.bridge_netfilter_on {
            tracing::info!(
                "bridged traffic goes through netfilter (net.bridge.bridge-nf-call-iptables \
                 and -ip6tables {}), so NetworkPolicy applies between pods of this node",
                if were_on { "are on" } else { "turned on" }
            );
            self.bridge_netfilter_on = true;
        }
        let state = PolicyState {
            ingress: want.ingress,
            egress: want.egress,
            ingress_profiles: want.ingress_profiles,
            egress_profiles: want.egress_profiles,
            peer_sets: want.peer_sets,
        };
        let changes = self
            .table
            .apply_judged(&state, &want.judged)
            .map_err(Error::Policy)?;
        Ok(changes.sent())
    }

    fn reload(&mut self) -> Result<()> {
        self.table.load().map_err(Error::Policy)
    }
}
