//! The ClusterNetworkPolicy kind (`policy.networking.k8s.io/v1alpha2`), which fills the
//! pipeline's Admin and Baseline tiers: its own store (the policies, read by
//! [`super::cluster_objects`]), whether the API serves it at all ([`Served`]: the kind
//! is a CRD that many clusters do not install), its meaning ([`super::cluster_model`])
//! and what it compiles to on this node ([`compile`]: per tier and direction, the
//! profiles of verdict boxes that the datapath loads into the tier's verdict maps).
//!
//! Its tiers are [`Stage::Ready`] once its store and the Pods and Namespaces it selects
//! have their first whole list ([`Stores::snapshot`]), [`Stage::Off`] while the API
//! does not serve the kind (no policy: nothing to judge), and [`Stage::Waiting`] before
//! the API has answered or while a list is missing: the kernel keeps what it holds for
//! the tiers meanwhile. Nothing of it holds back readiness.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cni_firewall::network_policy::{TierProfile, TierRange};
use cni_protocol::ip::from_u128;
use sha2::Digest as _;

use super::cluster_compile::{Classes, ProfileRows, Row, RowBox, TierTable};
use super::cluster_model::{NodePeer, TieredView};
use super::cluster_objects::{Action, ClusterPeer, ClusterPolicyInfo};
use super::model::View;
use super::objects::SlimClusterNetworkPolicy;
use super::pipeline::{CompileContext, Selected, Stage, Tier};
use super::verdicts::{Direction, Verdict, VerdictOrigin};
use crate::store::ItemMap;
use crate::store::{Items, Store, snapshot_of};

/// What the tiers wait for until the kind's view is complete (`/readyz` says so).
pub const WAITING: &str = "waiting for the API to serve ClusterNetworkPolicy or say it does not, and for the first complete list of ClusterNetworkPolicies, Pods and Namespaces";

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
#[derive(Debug, Clone, PartialEq)]
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

    /// The tiers' input: ready once the view is complete, off while the API does not
    /// serve the kind, else waiting.
    pub fn snapshot(&self, selected: &Selected) -> Stage<Snapshot> {
        match self.served.get() {
            Availability::Absent => Stage::Off,
            Availability::Unknown => Stage::Waiting(WAITING.to_owned()),
            Availability::Served => self
                .complete(selected)
                .map_or_else(|| Stage::Waiting(WAITING.to_owned()), Stage::Ready),
        }
    }

    /// What `/readyz` says of the kind once the API serves it (`None` before: a
    /// cluster without the kind hears nothing of it there).
    pub fn status(&self) -> Option<String> {
        (self.served.get() == Availability::Served).then(|| match snapshot_of(&self.policies) {
            Some(policies) => {
                let admin = policies.values().filter(|p| p.tier == Tier::Admin).count();
                format!(
                    "ClusterNetworkPolicy: enforced ({} policies: {admin} Admin, {} Baseline)",
                    policies.len(),
                    policies.len() - admin
                )
            }
            None => "ClusterNetworkPolicy: served, waiting for its first complete list".to_owned(),
        })
    }
}

/// One box of a tier row: protocols and destination ports, and what decided there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TierVerdict {
    /// IP protocol numbers, inclusive.
    pub protocols: (u8, u8),
    /// Destination ports, inclusive.
    pub ports: (u16, u16),
    /// The tier, policy, rule, direction and verdict (shared by the boxes of a rule).
    pub origin: Arc<VerdictOrigin>,
}

/// What one tier (Admin or Baseline) wants of the kernel on this node: which local pod
/// address each profile judges, per direction, the profiles (each peer they have a word
/// for, sent to its row) and the rows' boxes. Pods whose profiles are the same share
/// one, named by a hash of what makes it (the tier, the direction, the policies that
/// decide there and, for ingress, the pod's named ports), not of its peers: a pod
/// coming or going reaches the kernel as the peers that differ. Rows are named by a
/// hash of their boxes, so that profiles share them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierWant {
    /// Local pod address -> its ingress profile.
    pub ingress: BTreeMap<IpAddr, String>,
    /// Local pod address -> its egress profile.
    pub egress: BTreeMap<IpAddr, String>,
    /// Ingress profiles: their peers are sources.
    pub ingress_profiles: BTreeMap<String, Arc<TierProfile>>,
    /// Egress profiles: their peers are destinations.
    pub egress_profiles: BTreeMap<String, Arc<TierProfile>>,
    /// Rows of the ingress profiles.
    pub ingress_rows: BTreeMap<String, Vec<TierVerdict>>,
    /// Rows of the egress profiles.
    pub egress_rows: BTreeMap<String, Vec<TierVerdict>>,
}

impl TierWant {
    /// Local pod addresses with an entry in either direction.
    pub fn pods(&self) -> usize {
        let mut all: Vec<&IpAddr> = self.ingress.keys().chain(self.egress.keys()).collect();
        all.sort_unstable();
        all.dedup();
        all.len()
    }

    /// Boxes in all rows.
    pub fn boxes(&self) -> usize {
        self.ingress_rows
            .values()
            .chain(self.egress_rows.values())
            .map(Vec::len)
            .sum()
    }

    /// Peers (single addresses and ranges) in all profiles.
    pub fn peers(&self) -> usize {
        self.ingress_profiles
            .values()
            .chain(self.egress_profiles.values())
            .map(|p| p.peers.len() + p.ranges.len())
            .sum()
    }
}

/// Compiles the Admin and Baseline tiers for the pods of this node (their addresses
/// from the API and from the plugin's records).
pub fn compile(snapshot: &Snapshot, context: CompileContext<'_>) -> (TierWant, TierWant) {
    // Nothing to judge: no pod has an entry (and at thousands of Nodes, reading them as
    // peers would cost a pass more than the rest of it).
    if snapshot.policies.is_empty() {
        return (TierWant::default(), TierWant::default());
    }
    let no_policies = BTreeMap::new();
    let view = View::with_records(
        &snapshot.pods,
        &snapshot.namespaces,
        &no_policies,
        context.records.clone(),
    );
    // The Nodes as peers, only when some rule names `nodes`.
    let nodes_named = snapshot.policies.values().any(|p| {
        p.ingress.iter().chain(&p.egress).any(|r| {
            r.peers
                .iter()
                .any(|peer| matches!(peer, ClusterPeer::Nodes(_)))
        })
    });
    let nodes: BTreeMap<String, NodePeer> = if nodes_named {
        context
            .nodes
            .iter()
            .map(|(name, node)| (name.clone(), NodePeer::from(&**node)))
            .collect()
    } else {
        BTreeMap::new()
    };
    let policies: &ItemMap<ClusterPolicyInfo> = &snapshot.policies;
    let tiered = TieredView::new(&view, policies, &nodes);
    let compiled = super::cluster_compile::compile(&tiered, context.node);
    // The named ports of this node's pods, which ingress profiles are named by.
    let named_ports = |ip: &IpAddr| -> String {
        compiled
            .named_ports
            .get(ip)
            .map(|ports| {
                ports
                    .iter()
                    .map(|n| format!("{}/{}/{}", n.name, n.protocol, n.port))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default()
    };
    let tier_want = |tier: Tier| {
        let mut want = TierWant::default();
        for direction in [Direction::Ingress, Direction::Egress] {
            let ingress = direction == Direction::Ingress;
            let Some(table) = compiled.table(tier, ingress) else {
                continue;
            };
            let (pods, profiles, rows) = match direction {
                Direction::Ingress => (
                    &mut want.ingress,
                    &mut want.ingress_profiles,
                    &mut want.ingress_rows,
                ),
                Direction::Egress => (
                    &mut want.egress,
                    &mut want.egress_profiles,
                    &mut want.egress_rows,
                ),
            };
            let mut named = Naming {
                tier,
                direction,
                policies,
                origins: HashMap::new(),
                rows: HashMap::new(),
            };
            fill(
                &mut named,
                table,
                &compiled.classes,
                &|ip| {
                    if ingress {
                        named_ports(ip)
                    } else {
                        String::new()
                    }
                },
                pods,
                profiles,
                rows,
            );
        }
        want
    };
    // The tiers convert apart, Baseline on a second thread.
    super::beside(
        "baseline-tier",
        || tier_want(Tier::Admin),
        || tier_want(Tier::Baseline),
    )
}

/// One tier and direction's names for what it converts: the rows met so far (by their
/// address: the compile shares a row among the classes, and profiles, it is the same
/// for) and the verdicts' origins.
struct Naming<'p> {
    tier: Tier,
    direction: Direction,
    policies: &'p ItemMap<ClusterPolicyInfo>,
    origins: Origins,
    rows: HashMap<*const Vec<RowBox>, Arc<str>>,
}

impl Naming<'_> {
    /// The name of `row`, converted into `rows` the first time it is met.
    fn row(&mut self, row: &Row, rows: &mut BTreeMap<String, Vec<TierVerdict>>) -> Arc<str> {
        if let Some(name) = self.rows.get(&Arc::as_ptr(row)) {
            return Arc::clone(name);
        }
        let verdicts = tier_verdicts(
            self.tier,
            self.direction,
            row,
            self.policies,
            &mut self.origins,
        );
        let name = profile_name(&[
            &format!("{:?}", self.tier),
            self.direction.as_str(),
            &format!("{verdicts:?}"),
        ]);
        rows.entry(name.clone()).or_insert(verdicts);
        let name: Arc<str> = name.into();
        self.rows.insert(Arc::as_ptr(row), Arc::clone(&name));
        name
    }
}

/// One tier and direction's pods, profiles and rows from its table.
fn fill(
    naming: &mut Naming<'_>,
    table: &TierTable,
    classes: &Classes,
    named_ports: &dyn Fn(&IpAddr) -> String,
    pods: &mut BTreeMap<IpAddr, String>,
    profiles: &mut BTreeMap<String, Arc<TierProfile>>,
    rows: &mut BTreeMap<String, Vec<TierVerdict>>,
) {
    // Pods that share their profile (the same `Arc`) are converted once.
    let mut named: HashMap<*const ProfileRows, String> = HashMap::new();
    for (ip, profile) in table {
        if let Some(name) = named.get(&Arc::as_ptr(profile)) {
            pods.insert(*ip, name.clone());
            continue;
        }
        let mut deciding: Vec<&str> = profile
            .rows
            .values()
            .flat_map(|row| row.iter().map(|b| &*b.rule.policy))
            .collect();
        deciding.sort_unstable();
        deciding.dedup();
        // Class -> its row's name, by index: a lookup per peer address.
        let size = profile.rows.keys().max().map_or(0, |c| *c as usize + 1);
        let mut row_of: Vec<Option<Arc<str>>> = vec![None; size];
        for (class, row) in &profile.rows {
            row_of[*class as usize] = Some(naming.row(row, rows));
        }
        let row = |class: u32| row_of.get(class as usize).and_then(Option::as_ref);
        let want = TierProfile {
            peers: classes
                .points
                .iter()
                .filter_map(|(peer, class)| Some((*peer, Arc::clone(row(*class)?))))
                .collect(),
            ranges: classes
                .ranges
                .iter()
                .filter_map(|r| {
                    Some(TierRange {
                        first: from_u128(r.first, r.v4),
                        last: from_u128(r.last, r.v4),
                        row: Arc::clone(row(r.class)?),
                    })
                })
                .collect(),
        };
        let base = profile_name(&[
            &format!("{:?}", naming.tier),
            naming.direction.as_str(),
            &deciding.join("\n"),
            &named_ports(ip),
        ]);
        // Pods that share what decides share the profile; should their peers differ
        // all the same, a hash of which row each class goes to tells them apart.
        let name = match profiles.get(&base) {
            Some(held) if **held != want => {
                let content: Vec<String> = row_of
                    .iter()
                    .enumerate()
                    .filter_map(|(c, r)| Some(format!("{c}:{}", r.as_ref()?)))
                    .collect();
                profile_name(&[&base, &content.join(",")])
            }
            _ => base,
        };
        profiles
            .entry(name.clone())
            .or_insert_with(|| Arc::new(want));
        named.insert(Arc::as_ptr(profile), name.clone());
        pods.insert(*ip, name);
    }
}

/// The origin of each (policy, rule index, verdict) of one tier and direction, made
/// once: the boxes of a rule share it.
type Origins = HashMap<String, HashMap<(usize, Action), Arc<VerdictOrigin>>>;

/// A row's boxes as the firewall's boxes, each with its origin; sorted.
fn tier_verdicts(
    tier: Tier,
    direction: Direction,
    row: &[RowBox],
    policies: &ItemMap<ClusterPolicyInfo>,
    origins: &mut Origins,
) -> Vec<TierVerdict> {
    let mut out = Vec::with_capacity(row.len());
    let mut made = |b: &RowBox| -> Arc<VerdictOrigin> {
        let key = (b.rule.index, b.verdict);
        if let Some(origin) = origins.get(&*b.rule.policy).and_then(|o| o.get(&key)) {
            return Arc::clone(origin);
        }
        let rules = policies.get(&*b.rule.policy).map(|p| match direction {
            Direction::Ingress => &p.ingress,
            Direction::Egress => &p.egress,
        });
        let rule = rules
            .and_then(|r| r.get(b.rule.index))
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("{}[{}]", direction.as_str(), b.rule.index));
        let origin = Arc::new(VerdictOrigin {
            tier,
            policy: b.rule.policy.to_string(),
            rule,
            direction,
            verdict: match b.verdict {
                Action::Accept => Verdict::Accept,
                Action::Deny => Verdict::Deny,
                Action::Pass => Verdict::Pass,
            },
        });
        origins
            .entry(b.rule.policy.to_string())
            .or_default()
            .insert(key, Arc::clone(&origin));
        origin
    };
    for b in row {
        let origin = made(b);
        for (protocols, ports) in super::compile::split_keys(b.keys.0, b.keys.1) {
            out.push(TierVerdict {
                protocols,
                ports,
                origin: Arc::clone(&origin),
            });
        }
    }
    out.sort();
    out
}

/// A profile's name: 16 hex digits of a hash of `parts`.
fn profile_name(parts: &[&str]) -> String {
    let mut hash = sha2::Sha256::new();
    for part in parts {
        hash.update(part.as_bytes());
        hash.update(b"\n");
    }
    hash.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::item_map;

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
        assert!(stores.status().unwrap().contains("waiting"));
    }

    fn pod(namespace: &str, name: &str, ip: &str) -> (String, super::super::objects::PodInfo) {
        let slim: super::super::objects::SlimPod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": namespace, "name": name, "labels": {"app": name}},
            "spec": {"nodeName": "n1"},
            "status": {"podIPs": [{"ip": ip}]},
        }))
        .unwrap();
        let info = super::super::objects::PodInfo::from_slim(&slim);
        (info.key(), info)
    }

    fn compiled(
        pods: &[(&str, &str, &str)],
        policies: &[(&str, serde_json::Value)],
    ) -> (TierWant, TierWant) {
        let snapshot = Snapshot {
            pods: Arc::new(item_map(pods.iter().map(|(ns, n, ip)| pod(ns, n, ip)))),
            namespaces: Arc::new(item_map(
                ["x", "y"]
                    .into_iter()
                    .map(|ns| (ns.to_owned(), BTreeMap::new())),
            )),
            policies: Arc::new(item_map(policies.iter().map(|(name, spec)| {
                ((*name).to_owned(), ClusterPolicyInfo::read(name, spec))
            }))),
        };
        let records = BTreeMap::new();
        let nodes = BTreeMap::new();
        compile(
            &snapshot,
            CompileContext {
                node: "n1",
                records: &records,
                share_from: 16,
                nodes: &nodes,
            },
        )
    }

    /// Pods the same policies decide for share one profile, whose name stays when what
    /// the policies hold changes (a peer pod comes): the kernel gets the boxes that
    /// differ. Each box names its rule: its `name`, else its place.
    #[test]
    fn pods_share_profiles_named_for_what_decides() {
        let policies = [(
            "deny-y",
            serde_json::json!({"tier": "Admin", "priority": 1,
                "subject": {"namespaces": {}},
                "ingress": [{"action": "Deny", "from": [{"pods": {"namespaceSelector": {},
                              "podSelector": {"matchLabels": {"app": "c"}}}}]},
                            {"name": "pass-rest", "action": "Pass", "from": [{"namespaces": {}}]}]}),
        )];
        let before = compiled(
            &[
                ("x", "a", "10.1.1.1"),
                ("x", "b", "10.1.1.2"),
                ("y", "c", "10.1.2.1"),
            ],
            &policies,
        );
        let (admin, baseline) = &before;
        assert!(baseline.ingress.is_empty() && baseline.ingress_profiles.is_empty());
        let a = &admin.ingress[&"10.1.1.1".parse::<IpAddr>().unwrap()];
        assert_eq!(admin.ingress[&"10.1.1.2".parse::<IpAddr>().unwrap()], *a);
        assert_eq!(admin.ingress_profiles.len(), 1);
        let rules: Vec<(&str, Verdict)> = admin
            .ingress_rows
            .values()
            .flatten()
            .map(|b| (b.origin.rule.as_str(), b.origin.verdict))
            .collect();
        assert!(rules.contains(&("ingress[0]", Verdict::Deny)), "{rules:?}");
        assert!(rules.contains(&("pass-rest", Verdict::Pass)), "{rules:?}");
        // Pods c (denied) and a, b (passed) go to two rows.
        let profile = &admin.ingress_profiles[a];
        assert_eq!(profile.peers.len(), 3, "{profile:?}");
        assert_eq!(admin.ingress_rows.len(), 2);
        assert_ne!(
            profile.peers[&"10.1.2.1".parse::<IpAddr>().unwrap()],
            profile.peers[&"10.1.1.2".parse::<IpAddr>().unwrap()]
        );
        // A second pod c: the same profile name, one more peer, the same rows.
        let after = compiled(
            &[
                ("x", "a", "10.1.1.1"),
                ("x", "b", "10.1.1.2"),
                ("y", "c", "10.1.2.1"),
                ("y", "c2", "10.1.2.9"),
            ],
            &policies,
        );
        assert_eq!(after.0.ingress_profiles.keys().collect::<Vec<_>>(), [a]);
        assert_eq!(after.0.ingress_profiles[a].peers.len(), 4);
        assert_eq!(after.0.ingress_rows, before.0.ingress_rows);
    }

    /// The shape of the policy-scale benchmark's ClusterNetworkPolicy run (10,000 pods
    /// over 100 nodes, 100 namespaces, 100 policies of up to 25 ingress rules), timed in
    /// process: `cargo test -p cni-node --release --lib scale_compile -- --ignored
    /// --nocapture`. It prints the figures and asserts nothing of them.
    #[test]
    #[ignore = "a timing aid, not a test"]
    fn scale_compile() {
        use cni_kube_api::{BENCHMARK_ENVS as ENVS, benchmark_cluster_policy};
        use serde_json::json;
        let namespaces: ItemMap<super::super::selector::Labels> = (0..100u32)
            .map(|j| {
                let purpose = match j {
                    0 => "dns",
                    99 => "monitoring",
                    _ => "apps",
                };
                let labels = [
                    ("team", format!("team-{}", j % 10)),
                    ("env", ENVS[(j % 3) as usize].to_owned()),
                    ("purpose", purpose.to_owned()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
                (format!("ns-{j:02}"), Arc::new(labels))
            })
            .collect();
        let mut pods = BTreeMap::new();
        let mut records = BTreeMap::new();
        for node in 0..100u32 {
            for slot in 0..100u32 {
                let g = node * 100 + slot;
                let ip = format!("10.100.{node}.{}", slot + 2);
                let tiers = ["web", "api", "db"];
                let slim: super::super::objects::SlimPod = serde_json::from_value(json!({
                    "metadata": {"namespace": format!("ns-{:02}", (slot + node) % 100),
                                 "name": format!("app-{}-5d8f7c9b4-{g:05}", g % 10),
                                 "labels": {"app": format!("app-{}", g % 10),
                                            "tier": tiers[(g % 3) as usize],
                                            "pod-template-hash": "5d8f7c9b4"}},
                    "spec": {"nodeName": format!("np-{node}"), "containers": [{"ports": [
                        {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                        {"name": "grpc", "containerPort": 9090},
                        {"name": "http", "containerPort": 8080},
                        {"name": "metrics", "containerPort": 9100}]}]},
                    "status": {"podIPs": [{"ip": ip}]},
                }))
                .unwrap();
                let info = super::super::objects::PodInfo::from_slim(&slim);
                if node == 0 {
                    records.insert(ip.parse().unwrap(), info.key());
                }
                pods.insert(info.key(), Arc::new(info));
            }
        }
        let policies: ItemMap<ClusterPolicyInfo> = item_map((0..100u32).map(|k| {
            let object = benchmark_cluster_policy(k, 8080);
            let name = object["metadata"]["name"].as_str().unwrap().to_owned();
            let info = ClusterPolicyInfo::read(&name, &object["spec"]);
            (name, info)
        }));
        let snapshot = Snapshot {
            pods: Arc::new(pods),
            namespaces: Arc::new(namespaces),
            policies: Arc::new(policies),
        };
        let nodes = BTreeMap::new();
        let context = CompileContext {
            node: "np-0",
            records: &records,
            share_from: 16,
            nodes: &nodes,
        };
        for round in 0..10 {
            let started = std::time::Instant::now();
            let no_policies = BTreeMap::new();
            let view = View::with_records(
                &snapshot.pods,
                &snapshot.namespaces,
                &no_policies,
                records.clone(),
            );
            let node_peers = BTreeMap::new();
            let tiered = TieredView::new(&view, &snapshot.policies, &node_peers);
            let compiled = super::super::cluster_compile::compile(&tiered, "np-0");
            let classes: std::collections::BTreeSet<u32> = compiled
                .classes
                .points
                .values()
                .copied()
                .chain(compiled.classes.ranges.iter().map(|r| r.class))
                .collect();
            println!(
                "round {round}: rows {:.1} ms: {} boxes, {} classes over {} single addresses and {} ranges",
                started.elapsed().as_secs_f64() * 1e3,
                compiled.boxes(),
                classes.len(),
                compiled.classes.points.len(),
                compiled.classes.ranges.len(),
            );
            let started = std::time::Instant::now();
            let (admin, baseline) = compile(&snapshot, context);
            println!(
                "round {round}: compile {:.1} ms: admin {} pods {} profiles {} peers {} rows {} boxes, baseline {} pods {} profiles {} peers {} rows {} boxes",
                started.elapsed().as_secs_f64() * 1e3,
                admin.pods(),
                admin.ingress_profiles.len() + admin.egress_profiles.len(),
                admin.peers(),
                admin.ingress_rows.len() + admin.egress_rows.len(),
                admin.boxes(),
                baseline.pods(),
                baseline.ingress_profiles.len() + baseline.egress_profiles.len(),
                baseline.peers(),
                baseline.ingress_rows.len() + baseline.egress_rows.len(),
                baseline.boxes()
            );
        }
    }
}
