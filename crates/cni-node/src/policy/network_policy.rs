//! The NetworkPolicy kind, the pipeline's middle tier: its own store (the
//! NetworkPolicies), when its view is complete (that store and the Pods and Namespaces
//! it selects all have their first whole list), and what it compiles to on this node
//! ([`super::compile`], over the meaning in [`super::model`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::compile::{Compiled, compile_sharing};
use super::datapath::PolicyCounts;
use super::model::View;
use super::objects::{SlimNamespace, SlimNetworkPolicy, SlimPod};
use super::pipeline::{CompileContext, Selected, Stage};
use crate::store::{Items, Store, snapshot_of};

/// What the tier waits for until its view is complete (`/readyz` says so).
pub const WAITING: &str =
    "waiting for the first complete list of Pods, Namespaces and NetworkPolicies";

/// The kind's own store.
#[derive(Debug, Default)]
pub struct Stores {
    /// NetworkPolicies.
    pub policies: Arc<Mutex<Store<SlimNetworkPolicy>>>,
}

impl Stores {
    /// The kind's input once its view is complete, else what it waits for.
    pub fn snapshot(&self, selected: &Selected) -> Stage<Snapshot> {
        let snapshot = (|| {
            Some(Snapshot {
                pods: selected.pods.clone()?,
                namespaces: selected.namespaces.clone()?,
                policies: snapshot_of(&self.policies)?,
            })
        })();
        snapshot.map_or_else(|| Stage::Waiting(WAITING.to_owned()), Stage::Ready)
    }
}

/// The objects NetworkPolicy is judged on, as of one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Pods by `namespace/name`.
    pub pods: Items<SlimPod>,
    /// Namespaces' labels by name.
    pub namespaces: Items<SlimNamespace>,
    /// NetworkPolicies by `namespace/name`.
    pub policies: Items<SlimNetworkPolicy>,
}

/// What the tier wants of the kernel, and what of the policies could not be enforced
/// exactly (enforced more strictly instead), for the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Want {
    /// The profiles and which local pod address each judges.
    pub compiled: Compiled,
    /// Policies with problems: `namespace/name` -> the problems.
    pub problems: BTreeMap<String, Vec<String>>,
}

impl Want {
    /// What the table holds once this is applied.
    pub fn counts(&self) -> PolicyCounts {
        let compiled = &self.compiled;
        PolicyCounts {
            ingress: compiled.ingress.len(),
            egress: compiled.egress.len(),
            profiles: compiled.ingress_profiles.len() + compiled.egress_profiles.len(),
            peer_sets: compiled.peer_sets.len(),
            ..PolicyCounts::default()
        }
    }
}

/// Compiles the view for this node's pods: their addresses from the API and from the
/// plugin's records.
pub fn compile(snapshot: &Snapshot, context: CompileContext<'_>) -> Want {
    let view = View::with_records(
        &snapshot.pods,
        &snapshot.namespaces,
        &snapshot.policies,
        context.records.clone(),
    );
    Want {
        compiled: compile_sharing(&view, context.node, context.share_from),
        problems: snapshot
            .policies
            .iter()
            .filter(|(_, p)| !p.problems.is_empty())
            .map(|(k, p)| (k.clone(), p.problems.clone()))
            .collect(),
    }
}
