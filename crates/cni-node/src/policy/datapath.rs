//! The kernel side of policy: what the reconciler asks of it ([`PolicyDatapath`], a
//! trait so the reconciler is tested without nf_tables), what it holds after a pass
//! ([`PolicyCounts`]), and the real one over the firewall crate's `inet
//! cni_node_policy` table ([`Table`]), which keeps what it committed in memory and
//! sends only differences.
//!
//! The pipeline's tiers become one firewall state, applied in one transaction: the
//! Admin and Baseline tiers' profiles of verdict boxes, NetworkPolicy's profiles, and a
//! verdict chain for every origin a box or profile decides by ([`VerdictOrigin`]: a
//! ClusterNetworkPolicy rule's verdict, or per namespace NetworkPolicy's allow and
//! default deny), whose names are published for `/metrics` and the deny log
//! ([`SharedVerdictNames`]). A tier that waits keeps what the kernel holds for it; a
//! tier that is off holds nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use cni_firewall::network_policy::{
    self, ClusterTier, Direction as FwDirection, PolicyState, PolicyTable, ProfileVerdicts,
    TierBox, TierProfile, TierRow, TierState, VerdictAction,
};

/// The deny log's settings ([`Table::with_deny_log`]).
pub use cni_firewall::network_policy::DenyLog;

use super::cluster_network_policy::TierWant;
use super::pipeline::{Pipeline, Stage, Tier};
use super::verdicts::{Direction, SharedVerdictNames, Verdict, VerdictNames, VerdictOrigin};
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

/// What the policy table holds after a pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyCounts {
    /// Local pod addresses isolated for ingress by NetworkPolicy.
    pub ingress: usize,
    /// Local pod addresses isolated for egress by NetworkPolicy.
    pub egress: usize,
    /// NetworkPolicy profiles (what a set of pods allows), both directions.
    pub profiles: usize,
    /// Shared peer sets.
    pub peer_sets: usize,
    /// Local pod addresses the Admin tier has a word for (either direction).
    pub admin_pods: usize,
    /// Peers (single addresses and ranges) of the Admin tier's profiles.
    pub admin_peers: usize,
    /// Boxes of the Admin tier's rows.
    pub admin_boxes: usize,
    /// Local pod addresses the Baseline tier has a word for.
    pub baseline_pods: usize,
    /// Peers of the Baseline tier's profiles.
    pub baseline_peers: usize,
    /// Boxes of the Baseline tier's rows.
    pub baseline_boxes: usize,
}

/// The table, as the agent drives it.
#[derive(Debug)]
pub struct Table {
    table: PolicyTable,
    bridge_netfilter_on: bool,
    names: SharedVerdictNames,
    deny_log: Option<DenyLog>,
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
            names: SharedVerdictNames::default(),
            deny_log: None,
        })
    }

    /// Publishes the names of the verdict chains of every apply into `names` (which
    /// `/metrics` and the deny log read).
    pub fn with_verdict_names(mut self, names: SharedVerdictNames) -> Self {
        self.names = names;
        self
    }

    /// Turns the deny log on (`Some`) or off for the applies that follow: every
    /// verdict chain that drops logs the first packet of the connections it drops to
    /// the nflog group, at most `per_second` a second per chain, prefixed with the
    /// chain's name.
    pub fn with_deny_log(mut self, deny_log: Option<DenyLog>) -> Self {
        self.deny_log = deny_log;
        self
    }

    /// The names published at each apply.
    pub fn verdict_names(&self) -> SharedVerdictNames {
        SharedVerdictNames::clone(&self.names)
    }
}

/// The firewall's direction of a verdict's.
fn firewall(direction: Direction) -> FwDirection {
    match direction {
        Direction::Ingress => FwDirection::Ingress,
        Direction::Egress => FwDirection::Egress,
    }
}

/// What a verdict chain does for an origin: a Pass hands on to NetworkPolicy in the
/// Admin tier, and allows in the Baseline tier (nothing comes after it).
fn action(origin: &VerdictOrigin) -> VerdictAction {
    match (origin.verdict, origin.tier) {
        (Verdict::Deny, _) => VerdictAction::Drop,
        (Verdict::Pass, Tier::Admin) => VerdictAction::ToNetworkPolicy(firewall(origin.direction)),
        (Verdict::Accept | Verdict::Pass, _) => VerdictAction::Accept,
    }
}

/// The state as it is built from the pipeline: the firewall state and the origins of
/// the verdict chains it names.
#[derive(Default)]
struct Building {
    state: PolicyState,
    origins: BTreeMap<String, VerdictOrigin>,
    /// The chain of each origin met so far: a tier's boxes share a few hundred origins
    /// among hundreds of thousands of boxes, and a name costs a hash.
    chain_of: HashMap<VerdictOrigin, Arc<str>>,
}

impl Building {
    fn chain(&mut self, origin: &VerdictOrigin) -> Arc<str> {
        if let Some(name) = self.chain_of.get(origin) {
            return Arc::clone(name);
        }
        let name = origin.chain();
        self.state
            .verdict_chains
            .insert(name.clone(), action(origin));
        self.origins
            .entry(name.clone())
            .or_insert_with(|| origin.clone());
        let name: Arc<str> = name.into();
        self.chain_of.insert(origin.clone(), Arc::clone(&name));
        name
    }

    /// A ClusterNetworkPolicy tier's profiles and pods. Takes the tier's want, so that
    /// each profile's boxes are freed once converted: the two copies of every box are
    /// never held at once.
    fn tier(&mut self, want: TierWant) -> TierState {
        let TierWant {
            ingress,
            egress,
            ingress_profiles,
            egress_profiles,
            ingress_rows,
            egress_rows,
        } = want;
        let mut out = TierState {
            ingress,
            egress,
            ingress_profiles,
            egress_profiles,
            ..TierState::default()
        };
        for (rows, into) in [
            (ingress_rows, &mut out.ingress_rows),
            (egress_rows, &mut out.egress_rows),
        ] {
            for (name, boxes) in rows {
                // The boxes of a rule share their origin (one `Arc`): looked up by its
                // address first, which spares hashing the origin's strings per box.
                let mut by_address: HashMap<*const VerdictOrigin, Arc<str>> = HashMap::new();
                let boxes = boxes
                    .iter()
                    .map(|b| {
                        let address = Arc::as_ptr(&b.origin);
                        let chain = match by_address.get(&address) {
                            Some(chain) => Arc::clone(chain),
                            None => {
                                let chain = self.chain(&b.origin);
                                by_address.insert(address, Arc::clone(&chain));
                                chain
                            }
                        };
                        TierBox {
                            protocols: b.protocols,
                            ports: b.ports,
                            chain,
                        }
                    })
                    .collect();
                into.insert(name, TierRow { boxes });
            }
        }
        out
    }

    /// NetworkPolicy's profiles, each through its namespace's allow and default-deny
    /// verdict chains (a profile's pods are all of one namespace: its name comes from
    /// the policies that select them, which are theirs).
    fn network_policy(&mut self, want: super::compile::Compiled) {
        let super::compile::Compiled {
            ingress,
            egress,
            ingress_profiles,
            egress_profiles,
            peer_sets,
            judged,
        } = want;
        let s = &mut self.state;
        (s.ingress, s.egress) = (ingress, egress);
        (s.ingress_profiles, s.egress_profiles) = (ingress_profiles, egress_profiles);
        s.peer_sets = peer_sets;
        for direction in [Direction::Ingress, Direction::Egress] {
            let pods = match direction {
                Direction::Ingress => &self.state.ingress,
                Direction::Egress => &self.state.egress,
            };
            let mut namespace_of: BTreeMap<&str, &str> = BTreeMap::new();
            for (ip, profile) in pods {
                if let Some(pod) = judged.get(ip) {
                    let namespace = pod.split_once('/').map_or(pod.as_str(), |(ns, _)| ns);
                    namespace_of.entry(profile).or_insert(namespace);
                }
            }
            let names: Vec<(String, String)> = namespace_of
                .iter()
                .map(|(p, ns)| ((*p).to_owned(), (*ns).to_owned()))
                .collect();
            for (profile, namespace) in names {
                let origin = |rule: &str, verdict| VerdictOrigin {
                    tier: Tier::NetworkPolicy,
                    policy: namespace.clone(),
                    rule: rule.to_owned(),
                    direction,
                    verdict,
                };
                let verdicts = ProfileVerdicts {
                    allow: self.chain(&origin("allow", Verdict::Accept)).to_string(),
                    deny: self
                        .chain(&origin("default-deny", Verdict::Deny))
                        .to_string(),
                };
                let profiles = match direction {
                    Direction::Ingress => &mut self.state.ingress_profiles,
                    Direction::Egress => &mut self.state.egress_profiles,
                };
                if let Some(p) = profiles.get_mut(&profile) {
                    p.verdicts = Some(verdicts);
                }
            }
        }
    }

    /// Keeps what the kernel holds for a tier that waits: the tier's part of `held`
    /// and the verdict chains it goes to.
    fn keep_tier(&mut self, held: &PolicyState, tier: Tier) -> TierState {
        let kept = match tier {
            Tier::Admin => held.admin.clone(),
            Tier::Baseline => held.baseline.clone(),
            Tier::NetworkPolicy => return TierState::default(),
        };
        for row in kept.ingress_rows.values().chain(kept.egress_rows.values()) {
            for b in &row.boxes {
                self.keep_chain(held, &b.chain);
            }
        }
        kept
    }

    fn keep_network_policy(&mut self, held: &PolicyState) {
        let s = &mut self.state;
        s.ingress = held.ingress.clone();
        s.egress = held.egress.clone();
        s.ingress_profiles = held.ingress_profiles.clone();
        s.egress_profiles = held.egress_profiles.clone();
        s.peer_sets = held.peer_sets.clone();
        let chains: Vec<String> = held
            .ingress_profiles
            .values()
            .chain(held.egress_profiles.values())
            .filter_map(|p| p.verdicts.as_ref())
            .flat_map(|v| [v.allow.clone(), v.deny.clone()])
            .collect();
        for chain in chains {
            self.keep_chain(held, &chain);
        }
    }

    fn keep_chain(&mut self, held: &PolicyState, chain: &str) {
        if let Some(action) = held.verdict_chains.get(chain) {
            self.state.verdict_chains.insert(chain.to_owned(), *action);
        }
    }
}

/// The firewall state of a pipeline, keeping `held`'s part for the tiers that wait;
/// with the origins of the verdict chains it builds.
fn state_of(
    want: Pipeline,
    held: &PolicyState,
    deny_log: Option<DenyLog>,
) -> (PolicyState, BTreeMap<String, VerdictOrigin>) {
    let mut b = Building::default();
    match want.network_policy {
        Stage::Ready(np) => b.network_policy(np.compiled),
        Stage::Waiting(_) => b.keep_network_policy(held),
        Stage::Off => {}
    }
    b.state.admin = match want.admin {
        Stage::Ready(admin) => b.tier(admin),
        Stage::Waiting(_) => b.keep_tier(held, Tier::Admin),
        Stage::Off => TierState::default(),
    };
    b.state.baseline = match want.baseline {
        Stage::Ready(baseline) => b.tier(baseline),
        Stage::Waiting(_) => b.keep_tier(held, Tier::Baseline),
        Stage::Off => TierState::default(),
    };
    b.state.deny_log = deny_log;
    (b.state, b.origins)
}

/// What the kernel holds of a tier and direction: its pods and their profiles.
type HeldPods<'h> = dyn Fn(ClusterTier, FwDirection) -> Option<&'h BTreeMap<IpAddr, String>> + 'h;

/// What the kernel holds of a tier and direction: the profile of a name.
type HeldProfile<'h> = dyn Fn(ClusterTier, FwDirection, &str) -> Option<&'h Arc<TierProfile>> + 'h;

/// Gives each new tier profile the name of a held profile that is wanted no more: the
/// one most of its pods had, the profiles with the most such pods choosing first. A
/// policy added or removed, a pod added, or a namespace's labels changed, changes which
/// pods a profile judges and so the name the compile gives it, while its peers and rows
/// change little. Under its old name the profile changes by the peers that differ;
/// under a new one it would be made whole (thousands of elements) and the old one
/// removed. Which names the kernel holds is the only input besides the state, so a
/// restart that adopts the table gives the same names again.
fn inherit_profile_names<'h>(
    state: &mut PolicyState,
    held_pods: &HeldPods<'h>,
    held_profile: &HeldProfile<'h>,
) {
    for (tier, wanted) in [
        (ClusterTier::Admin, &mut state.admin),
        (ClusterTier::Baseline, &mut state.baseline),
    ] {
        for direction in [FwDirection::Ingress, FwDirection::Egress] {
            let Some(held_pods) = held_pods(tier, direction) else {
                continue;
            };
            let (pods, profiles) = match direction {
                FwDirection::Ingress => (&mut wanted.ingress, &mut wanted.ingress_profiles),
                FwDirection::Egress => (&mut wanted.egress, &mut wanted.egress_profiles),
            };
            // How many of each new profile's pods had each held profile that no wanted
            // profile is named for.
            let mut had: BTreeMap<(&str, &str), usize> = BTreeMap::new();
            for (ip, name) in pods.iter() {
                if held_profile(tier, direction, name).is_none()
                    && let Some(before) = held_pods.get(ip)
                    && !profiles.contains_key(before)
                {
                    *had.entry((name.as_str(), before.as_str())).or_default() += 1;
                }
            }
            let mut claims: Vec<(usize, &str, &str)> = had
                .into_iter()
                .map(|((new, old), n)| (n, new, old))
                .collect();
            claims.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| (a.1, a.2).cmp(&(b.1, b.2))));
            let mut renames: Vec<(String, String)> = Vec::new();
            let mut named: BTreeSet<&str> = BTreeSet::new();
            let mut taken: BTreeSet<&str> = BTreeSet::new();
            for (_, new, old) in claims {
                if !named.contains(new) && !taken.contains(old) {
                    named.insert(new);
                    taken.insert(old);
                    renames.push((new.to_owned(), old.to_owned()));
                }
            }
            for (new, old) in renames {
                if let Some(profile) = profiles.remove(&new) {
                    profiles.insert(old.clone(), profile);
                }
                for name in pods.values_mut().filter(|name| **name == new) {
                    name.clone_from(&old);
                }
            }
            // A profile equal to the one held goes as the held one: the apply then
            // knows it unchanged without comparing their peers again.
            for (name, profile) in profiles.iter_mut() {
                if let Some(held) = held_profile(tier, direction, name)
                    && held == profile
                {
                    *profile = Arc::clone(held);
                }
            }
        }
    }
}

impl PolicyDatapath for Table {
    fn apply(&mut self, want: Pipeline) -> Result<bool> {
        if !want.any_ready() {
            // Every tier waits or is off: the table stays as it is.
            return Ok(false);
        }
        // Bridged traffic between a node's pods reaches netfilter only through
        // br_netfilter; checked every pass (two sysctl reads), since anything may turn
        // it off.
        let were_on = network_policy::enable_bridge_netfilter().map_err(Error::Policy)?;
        if !were_on || !self.bridge_netfilter_on {
            tracing::info!(
                "bridged traffic goes through netfilter (net.bridge.bridge-nf-call-iptables \
                 and -ip6tables {}), so policy applies between pods of this node",
                if were_on { "are on" } else { "turned on" }
            );
            self.bridge_netfilter_on = true;
        }
        // What the kernel holds, for the tiers that wait; read back only when one
        // waits. Not known (a failure): read again; still not: change nothing, for a
        // waiting tier must never lose what it holds.
        let held = if want.waiting().is_empty() {
            PolicyState::default()
        } else {
            if self.table.held_state().is_none() {
                self.table.load().map_err(Error::Policy)?;
            }
            match self.table.held_state() {
                Some(held) => held,
                None => return Ok(false),
            }
        };
        let judged = match &want.network_policy {
            Stage::Ready(np) => np.compiled.judged.clone(),
            Stage::Waiting(_) | Stage::Off => BTreeMap::new(),
        };
        let started = std::time::Instant::now();
        let (mut state, origins) = state_of(want, &held, self.deny_log);
        let table = &self.table;
        inherit_profile_names(
            &mut state,
            &|tier, direction| table.held_tier_pods(tier, direction),
            &|tier, direction, name| table.held_tier_profile(tier, direction, name),
        );
        let built = started.elapsed();
        let changes = self
            .table
            .apply_judged(&state, &judged)
            .map_err(Error::Policy)?;
        tracing::debug!(
            "policy table: state {:.1} ms, applied {:.1} ms ({} messages)",
            built.as_secs_f64() * 1e3,
            (started.elapsed() - built).as_secs_f64() * 1e3,
            changes.messages
        );
        // Every chain of the state is named: by this pass when a ready tier built it,
        // else as the last pass named it.
        let mut names = self
            .names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let previous = std::mem::take(&mut *names);
        *names = VerdictNames::new(state.verdict_chains.keys().filter_map(|chain| {
            origins
                .get(chain)
                .or_else(|| previous.origin(chain))
                .cloned()
        }));
        Ok(changes.sent())
    }

    fn reload(&mut self) -> Result<()> {
        self.table.load().map_err(Error::Policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::cluster_network_policy::TierVerdict;
    use cni_firewall::network_policy::{Profile, TierProfile, TierRange};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn origin(tier: Tier, verdict: Verdict, direction: Direction) -> VerdictOrigin {
        VerdictOrigin {
            tier,
            policy: "p".into(),
            rule: "r".into(),
            direction,
            verdict,
        }
    }

    fn tier_want(origin: VerdictOrigin) -> TierWant {
        let mut want = TierWant::default();
        want.egress.insert(ip("10.0.0.2"), "e1".into());
        want.egress_rows.insert(
            "r1".into(),
            vec![TierVerdict {
                protocols: (0, 255),
                ports: (0, 65535),
                origin: std::sync::Arc::new(origin),
            }],
        );
        want.egress_profiles.insert(
            "e1".into(),
            Arc::new(TierProfile {
                peers: BTreeMap::new(),
                ranges: [TierRange {
                    first: ip("10.0.0.0"),
                    last: ip("10.0.0.255"),
                    row: "r1".into(),
                }]
                .into(),
            }),
        );
        want
    }

    /// A new profile takes the held name that most of its pods had, unless a wanted
    /// profile is named so; the profile with more such pods chooses first; pods new to
    /// the tier do not stand in the way.
    #[test]
    fn new_profiles_inherit_the_held_name_of_most_of_their_pods() {
        let held: BTreeMap<IpAddr, String> = [
            ("10.0.0.2", "old1"),
            ("10.0.0.3", "old1"),
            ("10.0.0.4", "old2"),
            ("10.0.0.5", "old3"),
            ("10.0.0.6", "old3"),
            ("10.0.0.7", "old2"),
            ("10.0.0.8", "old4"),
            ("10.0.0.9", "old4"),
            ("10.0.0.11", "old5"),
            ("10.0.0.12", "old5"),
            ("10.0.0.13", "old5"),
            ("10.0.0.14", "old5"),
        ]
        .into_iter()
        .map(|(a, n)| (ip(a), n.to_owned()))
        .collect();
        let mut state = PolicyState::default();
        let e = &mut state.admin.egress;
        for (a, n) in [
            // Two pods of old1, and one new to the tier.
            ("10.0.0.2", "new1"),
            ("10.0.0.3", "new1"),
            ("10.0.0.10", "new1"),
            // Two of old2, one of old3 (which is wanted still).
            ("10.0.0.4", "new2"),
            ("10.0.0.7", "new2"),
            ("10.0.0.5", "new2"),
            ("10.0.0.6", "old3"),
            ("10.0.0.8", "new3"),
            ("10.0.0.9", "new3"),
            // Three of old5 against one: new4 has it.
            ("10.0.0.11", "new4"),
            ("10.0.0.12", "new4"),
            ("10.0.0.13", "new4"),
            ("10.0.0.14", "new5"),
        ] {
            e.insert(ip(a), n.into());
        }
        for name in ["new1", "new2", "new3", "new4", "new5", "old3"] {
            state
                .admin
                .egress_profiles
                .insert(name.into(), Arc::default());
        }
        let before = state.clone();
        let old = Arc::default();
        inherit_profile_names(
            &mut state,
            &|tier, direction| {
                (tier == ClusterTier::Admin && direction == FwDirection::Egress).then_some(&held)
            },
            &|_, _, name| name.starts_with("old").then_some(&old),
        );
        let e = &state.admin.egress;
        let names = |addresses: &[&str]| -> Vec<&str> {
            addresses.iter().map(|a| e[&ip(a)].as_str()).collect()
        };
        assert_eq!(names(&["10.0.0.2", "10.0.0.3", "10.0.0.10"]), ["old1"; 3]);
        assert_eq!(names(&["10.0.0.4", "10.0.0.7", "10.0.0.5"]), ["old2"; 3]);
        assert_eq!(names(&["10.0.0.6"]), ["old3"]);
        assert_eq!(names(&["10.0.0.8", "10.0.0.9"]), ["old4"; 2]);
        assert_eq!(names(&["10.0.0.11", "10.0.0.12", "10.0.0.13"]), ["old5"; 3]);
        assert_eq!(
            names(&["10.0.0.14"]),
            ["new5"],
            "old5 went to the bigger claim"
        );
        assert_eq!(
            state.admin.egress_profiles.keys().collect::<Vec<_>>(),
            ["new5", "old1", "old2", "old3", "old4", "old5"]
        );
        assert_eq!(state.baseline, before.baseline);
        // An equal profile goes as the held one.
        assert!(Arc::ptr_eq(&state.admin.egress_profiles["old1"], &old));
    }

    /// Each verdict becomes the chain action that means it in its tier; a waiting
    /// tier keeps what the kernel holds, with its chains; an off tier holds nothing.
    #[test]
    fn tiers_become_one_state_with_their_verdict_chains() {
        let pass = origin(Tier::Admin, Verdict::Pass, Direction::Egress);
        let base_pass = origin(Tier::Baseline, Verdict::Pass, Direction::Egress);
        let want = Pipeline {
            admin: Stage::Ready(tier_want(pass.clone())),
            network_policy: Stage::Off,
            baseline: Stage::Ready(tier_want(base_pass.clone())),
        };
        let (state, origins) = state_of(want, &PolicyState::default(), None);
        assert_eq!(
            state.verdict_chains,
            [
                (
                    pass.chain(),
                    VerdictAction::ToNetworkPolicy(FwDirection::Egress)
                ),
                (base_pass.chain(), VerdictAction::Accept),
            ]
            .into()
        );
        assert_eq!(origins.len(), 2);
        assert_eq!(*state.admin.egress_rows["r1"].boxes[0].chain, pass.chain());

        // Admin waits: the held Admin tier and its chain stay; Baseline off: gone.
        let waiting = Pipeline {
            admin: Stage::Waiting("list".into()),
            network_policy: Stage::Off,
            baseline: Stage::Off,
        };
        let (kept, origins) = state_of(waiting, &state, None);
        assert_eq!(kept.admin, state.admin);
        assert!(kept.baseline.is_empty());
        assert_eq!(
            kept.verdict_chains.keys().collect::<Vec<_>>(),
            [&pass.chain()]
        );
        assert!(origins.is_empty(), "kept chains keep the names they had");
    }

    /// NetworkPolicy's profiles go through their namespace's allow and default-deny
    /// chains.
    #[test]
    fn network_policy_profiles_count_per_namespace() {
        let mut compiled = super::super::compile::Compiled::default();
        compiled
            .ingress_profiles
            .insert("aa".into(), Profile::default());
        compiled.ingress.insert(ip("10.0.0.2"), "aa".into());
        compiled.judged.insert(ip("10.0.0.2"), "shop/web".into());
        let want = Pipeline {
            admin: Stage::Off,
            network_policy: Stage::Ready(super::super::network_policy::Want {
                compiled,
                problems: BTreeMap::new(),
            }),
            baseline: Stage::Off,
        };
        let (state, origins) = state_of(
            want,
            &PolicyState::default(),
            Some(DenyLog {
                group: 3,
                per_second: 10,
            }),
        );
        let verdicts = state.ingress_profiles["aa"].verdicts.clone().unwrap();
        assert_eq!(origins[&verdicts.allow].policy, "shop");
        assert_eq!(origins[&verdicts.deny].rule, "default-deny");
        assert_eq!(state.verdict_chains[&verdicts.deny], VerdictAction::Drop);
        assert_eq!(state.deny_log.map(|l| l.group), Some(3));
    }
}
