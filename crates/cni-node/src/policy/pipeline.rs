//! The policy pipeline: the tiers a packet meets in order (ClusterNetworkPolicy's
//! Admin tier, NetworkPolicy, ClusterNetworkPolicy's Baseline tier), each filled by one
//! policy kind. A kind is one module with its own store, readiness and compile
//! ([`super::network_policy`] is the middle tier's); this module holds what they share:
//! the stores of what every kind selects (Pods, Namespaces) beside each kind's own
//! ([`PolicyStores`]), one [`Stage`] per tier as of one snapshot ([`PolicyInputs`]), and
//! the same tiers compiled ([`Pipeline`], which [`crate::plan::desired`] yields and the
//! datapath applies).
//!
//! Each kind is ready on its own: a kind whose view is not complete (its API not served,
//! its first list not in) is [`Stage::Waiting`] and holds back neither the routes nor the
//! other kinds. A waiting tier never opens anything: the datapath keeps what the kernel
//! holds for it (after a restart, what the last run left), and changes it only once the
//! kind's view is whole again.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::cluster_network_policy;
use super::datapath::PolicyCounts;
use super::network_policy;
use super::objects::{SlimNamespace, SlimPod};
use crate::store::{Items, Store, snapshot_of};

/// The tiers, in the order a packet meets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// ClusterNetworkPolicy's Admin tier: before NetworkPolicy, and may decide for it.
    Admin,
    /// NetworkPolicy.
    NetworkPolicy,
    /// ClusterNetworkPolicy's Baseline tier: what applies where NetworkPolicy does not.
    Baseline,
}

/// What one tier holds in a pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Stage<T> {
    /// Its kind is not enforced on this node.
    #[default]
    Off,
    /// Its kind's view is not complete yet: what it waits for. The kernel keeps what it
    /// holds for the tier.
    Waiting(String),
    /// Its kind's input (in [`PolicyInputs`]) or output (in [`Pipeline`]).
    Ready(T),
}

impl<T> Stage<T> {
    /// The ready value, if any.
    pub fn ready(&self) -> Option<&T> {
        match self {
            Self::Ready(value) => Some(value),
            Self::Off | Self::Waiting(_) => None,
        }
    }

    /// What it waits for, if it waits.
    pub fn waiting(&self) -> Option<&str> {
        match self {
            Self::Waiting(why) => Some(why),
            Self::Off | Self::Ready(_) => None,
        }
    }

    /// The same stage with its ready value mapped.
    pub fn map<U>(&self, f: impl FnOnce(&T) -> U) -> Stage<U> {
        match self {
            Self::Off => Stage::Off,
            Self::Waiting(why) => Stage::Waiting(why.clone()),
            Self::Ready(value) => Stage::Ready(f(value)),
        }
    }
}

/// One stage per tier, in the order a packet meets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiers<A, N, B> {
    /// The Admin tier.
    pub admin: Stage<A>,
    /// The NetworkPolicy tier.
    pub network_policy: Stage<N>,
    /// The Baseline tier.
    pub baseline: Stage<B>,
}

impl<A, N, B> Default for Tiers<A, N, B> {
    /// Every tier off.
    fn default() -> Self {
        Self {
            admin: Stage::Off,
            network_policy: Stage::Off,
            baseline: Stage::Off,
        }
    }
}

impl<A, N, B> Tiers<A, N, B> {
    /// What the waiting tiers wait for, in tier order.
    pub fn waiting(&self) -> Vec<(Tier, String)> {
        [
            (Tier::Admin, self.admin.waiting()),
            (Tier::NetworkPolicy, self.network_policy.waiting()),
            (Tier::Baseline, self.baseline.waiting()),
        ]
        .into_iter()
        .filter_map(|(tier, why)| Some((tier, why?.to_owned())))
        .collect()
    }

    /// Whether some tier is ready (and so the datapath has something to apply).
    pub fn any_ready(&self) -> bool {
        self.admin.ready().is_some()
            || self.network_policy.ready().is_some()
            || self.baseline.ready().is_some()
    }
}

/// What each kind is judged on, as of one snapshot of the stores (ClusterNetworkPolicy
/// fills both outer tiers from one snapshot).
pub type PolicyInputs = Tiers<
    cluster_network_policy::Snapshot,
    network_policy::Snapshot,
    cluster_network_policy::Snapshot,
>;

/// What each tier wants of the kernel on this node.
pub type Pipeline =
    Tiers<cluster_network_policy::TierWant, network_policy::Want, cluster_network_policy::TierWant>;

impl Pipeline {
    /// What the tables hold once the pipeline is applied (of the ready tiers).
    pub fn counts(&self) -> PolicyCounts {
        let mut counts = self
            .network_policy
            .ready()
            .map(network_policy::Want::counts)
            .unwrap_or_default();
        if let Some(admin) = self.admin.ready() {
            counts.admin_pods = admin.pods();
            counts.admin_peers = admin.peers();
            counts.admin_boxes = admin.boxes();
        }
        if let Some(baseline) = self.baseline.ready() {
            counts.baseline_pods = baseline.pods();
            counts.baseline_peers = baseline.peers();
            counts.baseline_boxes = baseline.boxes();
        }
        counts
    }
}

/// What every kind is compiled with besides its own input.
#[derive(Debug, Clone, Copy)]
pub struct CompileContext<'a> {
    /// This node's name: whose pods are enforced here.
    pub node: &'a str,
    /// This node's pod records (address -> pod key), as read from the host.
    pub records: &'a BTreeMap<IpAddr, String>,
    /// From how many address ranges a peer of pods is a shared set.
    pub share_from: usize,
    /// The Nodes (ClusterNetworkPolicy's `nodes` peers).
    pub nodes: &'a crate::store::ItemMap<crate::node::NodeInfo>,
}

/// Compiles each ready tier; the others stay as they are. ClusterNetworkPolicy is
/// compiled once for both of its tiers, and NetworkPolicy beside it on a second thread:
/// the two read the same snapshots and nothing of each other.
pub fn compile(inputs: &PolicyInputs, context: CompileContext<'_>) -> Pipeline {
    let tiers = || {
        let started = std::time::Instant::now();
        let compiled = inputs
            .admin
            .ready()
            .or(inputs.baseline.ready())
            .map(|s| cluster_network_policy::compile(s, context))
            .unwrap_or_default();
        (compiled, started.elapsed())
    };
    let network_policy = || {
        let started = std::time::Instant::now();
        let compiled = inputs
            .network_policy
            .map(|snapshot| network_policy::compile(snapshot, context));
        (compiled, started.elapsed())
    };
    // NetworkPolicy goes to the other thread: its compile is the smaller, and so is
    // the memory that the thread's own allocator arena keeps.
    let (((admin, baseline), tiers_took), (network_policy, network_policy_took)) =
        super::beside("network-policy", tiers, network_policy);
    tracing::debug!(
        "policy compiled: ClusterNetworkPolicy {:.1} ms, NetworkPolicy {:.1} ms",
        tiers_took.as_secs_f64() * 1e3,
        network_policy_took.as_secs_f64() * 1e3
    );
    Pipeline {
        admin: inputs.admin.map(|_| admin),
        network_policy,
        baseline: inputs.baseline.map(|_| baseline),
    }
}

/// The stores policy is judged on: what every kind selects, and each enforced kind's
/// own store (`None`: the kind is not enforced on this node).
#[derive(Debug, Default)]
pub struct PolicyStores {
    /// Pods.
    pub pods: Arc<Mutex<Store<SlimPod>>>,
    /// Namespaces.
    pub namespaces: Arc<Mutex<Store<SlimNamespace>>>,
    /// NetworkPolicy's own.
    pub network_policy: Option<network_policy::Stores>,
    /// ClusterNetworkPolicy's own: enforced wherever NetworkPolicy is, in the Admin and
    /// Baseline tiers.
    pub cluster_network_policy: Option<super::cluster_network_policy::Stores>,
}

impl PolicyStores {
    /// Stores for the given kinds, none of them complete yet. ClusterNetworkPolicy is
    /// watched wherever NetworkPolicy is enforced.
    pub fn enforcing(network_policy: bool) -> Self {
        Self {
            network_policy: network_policy.then(network_policy::Stores::default),
            cluster_network_policy: network_policy
                .then(super::cluster_network_policy::Stores::default),
            ..Self::default()
        }
    }

    /// Each kind's input, or what it waits for: one kind's incomplete view holds back
    /// no other.
    pub fn snapshot(&self) -> PolicyInputs {
        let selected = Selected {
            pods: snapshot_of(&self.pods),
            namespaces: snapshot_of(&self.namespaces),
        };
        let cluster = self
            .cluster_network_policy
            .as_ref()
            .map_or(Stage::Off, |own| own.snapshot(&selected));
        PolicyInputs {
            admin: cluster.clone(),
            network_policy: self
                .network_policy
                .as_ref()
                .map_or(Stage::Off, |own| own.snapshot(&selected)),
            baseline: cluster,
        }
    }
}

/// What every kind selects, as of one snapshot (`None`: not complete yet).
#[derive(Debug, Clone)]
pub struct Selected {
    /// Pods by `namespace/name`.
    pub pods: Option<Items<SlimPod>>,
    /// Namespaces' labels by name.
    pub namespaces: Option<Items<SlimNamespace>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    fn complete<K: crate::store::Watched>(store: &Mutex<Store<K>>) {
        let mut store = store.lock().unwrap();
        store.apply(Event::Init);
        store.apply(Event::InitDone);
    }

    #[test]
    fn a_kind_not_enforced_is_off_and_waits_for_nothing() {
        let stores = PolicyStores::enforcing(false);
        complete(&stores.pods);
        complete(&stores.namespaces);
        let inputs = stores.snapshot();
        assert_eq!(inputs.network_policy, Stage::Off);
        assert!(inputs.waiting().is_empty());
        assert!(!inputs.any_ready());
    }

    #[test]
    fn a_kind_waits_until_its_own_store_and_what_it_selects_are_complete() {
        let stores = PolicyStores::enforcing(true);
        complete(&stores.pods);
        complete(&stores.namespaces);
        // A cluster without ClusterNetworkPolicy: its tiers are off.
        let cluster = stores.cluster_network_policy.as_ref().unwrap();
        cluster
            .served
            .set(super::super::cluster_network_policy::Availability::Absent);
        let inputs = stores.snapshot();
        assert_eq!(
            inputs.waiting(),
            vec![(Tier::NetworkPolicy, network_policy::WAITING.to_owned())]
        );
        // Compiling a waiting tier waits too: nothing of it reaches the kernel.
        let records = BTreeMap::new();
        let nodes = BTreeMap::new();
        let context = CompileContext {
            node: "n1",
            records: &records,
            share_from: 16,
            nodes: &nodes,
        };
        let pipeline = compile(&inputs, context);
        assert!(!pipeline.any_ready());
        assert_eq!(pipeline.waiting().len(), 1);
        assert_eq!(pipeline.counts(), PolicyCounts::default());

        complete(&stores.network_policy.as_ref().unwrap().policies);
        let inputs = stores.snapshot();
        assert!(inputs.waiting().is_empty());
        assert!(compile(&inputs, context).any_ready());
        assert_eq!(inputs.admin, Stage::Off);
    }

    /// ClusterNetworkPolicy's tiers wait until the API has answered and its list is
    /// whole, then both are ready from one snapshot; a cluster without the kind has
    /// them off.
    #[test]
    fn the_cluster_tiers_follow_the_kind() {
        use super::super::cluster_network_policy::Availability;
        let stores = PolicyStores::enforcing(true);
        complete(&stores.pods);
        complete(&stores.namespaces);
        let cluster = stores.cluster_network_policy.as_ref().unwrap();
        let inputs = stores.snapshot();
        assert!(inputs.admin.waiting().is_some() && inputs.baseline.waiting().is_some());
        cluster.served.set(Availability::Served);
        assert!(stores.snapshot().admin.waiting().is_some(), "no list yet");
        complete(&cluster.policies);
        let inputs = stores.snapshot();
        assert!(inputs.admin.ready().is_some() && inputs.baseline.ready().is_some());
        let records = BTreeMap::new();
        let nodes = BTreeMap::new();
        let context = CompileContext {
            node: "n1",
            records: &records,
            share_from: 16,
            nodes: &nodes,
        };
        let pipeline = compile(&inputs, context);
        assert_eq!(
            pipeline.admin.ready(),
            Some(&cluster_network_policy::TierWant::default())
        );
        cluster.served.set(Availability::Absent);
        let inputs = stores.snapshot();
        assert_eq!((inputs.admin, inputs.baseline), (Stage::Off, Stage::Off));
    }
}
