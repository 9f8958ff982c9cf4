//! The ClusterNetworkPolicy kind (`policy.networking.k8s.io/v1alpha2`), which will fill
//! the pipeline's Admin and Baseline tiers: its own store (the policies, read by
//! [`super::cluster_objects`]), whether the API serves it at all ([`Served`]: the kind
//! is a CRD that many clusters do not install), and its meaning
//! ([`super::cluster_model`]).
//!
//! It is watched, not yet enforced: no datapath consumes the Admin and Baseline tiers
//! yet, so they stay [`super::pipeline::Stage::Off`] whatever this store holds, and
//! nothing of it holds back readiness. Its view is complete once its store and the Pods
//! and Namespaces it selects have their first whole list ([`Stores::complete`]).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::objects::SlimClusterNetworkPolicy;
use super::pipeline::Selected;
use crate::store::{Items, Store, snapshot_of};

/// How long the agent waits before looking again for a kind the API does not serve.
pub const LOOK_AGAIN_AFTER: Duration = Duration::from_secs(30);

/// Whether the API serves the kind.
#[derive(Debug, Default)]
pub struct Served(AtomicU8);

/// What is known of whether the API serves a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// Not known yet: no list has succeeded or been refused.
    Unknown,
    /// The API answered 404: the kind's CRD is not installed.
    Absent,
    /// A list succeeded.
    Served,
}

impl Served {
    /// What is known.
    pub fn get(&self) -> Availability {
        match self.0.load(Ordering::SeqCst) {
            1 => Availability::Absent,
            2 => Availability::Served,
            _ => Availability::Unknown,
        }
    }

    /// Records what is known; returns what was known before.
    pub fn set(&self, now: Availability) -> Availability {
        let code = match now {
            Availability::Unknown => 0,
            Availability::Absent => 1,
            Availability::Served => 2,
        };
        match self.0.swap(code, Ordering::SeqCst) {
            1 => Availability::Absent,
            2 => Availability::Served,
            _ => Availability::Unknown,
        }
    }
}

/// The kind's own store, and whether the API serves it.
#[derive(Debug, Default)]
pub struct Stores {
    /// ClusterNetworkPolicies by name.
    pub policies: Arc<Mutex<Store<SlimClusterNetworkPolicy>>>,
    /// Whether the API serves the kind.
    pub served: Arc<Served>,
}

/// The objects ClusterNetworkPolicy is judged on, as of one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// What every kind selects.
    pub pods: Items<super::objects::SlimPod>,
    /// Namespaces' labels.
    pub namespaces: Items<super::objects::SlimNamespace>,
    /// The policies by name.
    pub policies: Items<SlimClusterNetworkPolicy>,
}

impl Stores {
    /// The kind's input once its view is complete.
    pub fn complete(&self, selected: &Selected) -> Option<Snapshot> {
        Some(Snapshot {
            pods: selected.pods.clone()?,
            namespaces: selected.namespaces.clone()?,
            policies: snapshot_of(&self.policies)?,
        })
    }

    /// What `/readyz` says of the kind once the API serves it (`None` before: a
    /// cluster without the kind hears nothing of it there).
    pub fn status(&self) -> Option<String> {
        (self.served.get() == Availability::Served).then(|| {
            let count = snapshot_of(&self.policies).map(|p| p.len());
            match count {
                Some(n) => {
                    format!("ClusterNetworkPolicy: watched ({n} policies), not yet enforced")
                }
                None => "ClusterNetworkPolicy: watched, not yet enforced".to_owned(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_remembers_the_last_word() {
        let served = Served::default();
        assert_eq!(served.get(), Availability::Unknown);
        assert_eq!(served.set(Availability::Absent), Availability::Unknown);
        assert_eq!(served.set(Availability::Absent), Availability::Absent);
        assert_eq!(served.set(Availability::Served), Availability::Absent);
        assert_eq!(served.get(), Availability::Served);
    }

    #[test]
    fn readyz_hears_of_the_kind_only_once_it_is_served() {
        let stores = Stores::default();
        assert_eq!(stores.status(), None);
        stores.served.set(Availability::Absent);
        assert_eq!(stores.status(), None);
        stores.served.set(Availability::Served);
        assert!(stores.status().unwrap().contains("not yet enforced"));
    }
}
