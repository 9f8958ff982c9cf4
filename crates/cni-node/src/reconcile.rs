//! The one reconciler: reads the host, computes the whole desired state
//! ([`crate::plan::desired`]) from a snapshot of the watched objects, and applies the
//! difference: the network config, the VXLAN devices, the routes with the tunnels'
//! entries, the egress rules, the policy tables. Each effect is behind a small trait
//! ([`HostReader`], [`ConfigDir`], [`VxlanDevices`], [`RouteTable`], [`EgressRules`],
//! [`PolicyDatapath`]) with in-memory
//! fakes in the tests, so what it decides is tested without root.
//!
//! A step that fails does not stop the others (a route the kernel refuses must not keep
//! the conflist from being written); the failures are returned by step for `/readyz`,
//! the metrics and the retry. A standing condition (a skipped node, a foreign route, a
//! failure) is logged when it starts and when it ends, not on every pass.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;

use crate::egress::{self, EgressRules};
use crate::encryption::step::{EncryptionCounts, EncryptionEffects, Step as EncryptionStep};
use crate::error::{Error, chain};
use crate::host::{DeviceEntries, EntriesWatch, HostReader, HostState};
use crate::node::{NodeInfo, SlimNode};
use crate::overlay::{self, VxlanDevices};
use crate::plan::NextHop;
use crate::plan::{self, Desired, NetworkConfig, Settings};
use crate::policy::datapath::{PolicyCounts, PolicyDatapath};
use crate::policy::pipeline::{Pipeline, Tier};
use crate::routes::{self, RouteChanges, RouteTable};
use crate::store::Snapshot;
use crate::store::{ItemMap, Store};

/// Where the network config is written: a trait so the reconciler is tested without a
/// file system.
pub trait ConfigDir: Send {
    /// Writes the config unless it already holds exactly `bytes`; whether it wrote.
    fn write_if_changed(&self, bytes: &[u8]) -> io::Result<bool>;
    /// Config files a runtime would load before ours.
    fn shadowing(&self) -> Vec<String>;
    /// The config's path, for messages.
    fn path(&self) -> PathBuf;
}

/// The real config directory.
#[derive(Debug, Clone)]
pub struct ConfDir {
    /// The directory.
    pub dir: PathBuf,
    /// The file's name in it.
    pub name: String,
}

impl ConfigDir for ConfDir {
    fn write_if_changed(&self, bytes: &[u8]) -> io::Result<bool> {
        crate::conflist::write_if_changed(&self.dir, &self.name, bytes)
    }
    fn shadowing(&self) -> Vec<String> {
        crate::conflist::shadowing(&self.dir, &self.name)
    }
    fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }
}

/// The effects the reconciler drives.
pub struct Effects {
    /// The host's reader.
    pub host: Box<dyn HostReader>,
    /// The config directory.
    pub config: Box<dyn ConfigDir>,
    /// The main routing table and the VXLAN devices' entries.
    pub routes: Box<dyn RouteTable>,
    /// The VXLAN devices themselves.
    pub devices: Box<dyn VxlanDevices>,
    /// The egress rules, unless egress SNAT is off.
    pub egress: Option<Box<dyn EgressRules>>,
    /// The policy tables, unless no policy kind is enforced.
    pub policy: Option<Box<dyn PolicyDatapath>>,
    /// WireGuard, the annotation and the strict table; `None`: no encryption step at
    /// all (the tests of other steps).
    pub encryption: Option<EncryptionEffects>,
}

impl std::fmt::Debug for Effects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Effects")
            .field("config", &self.config.path())
            .field("egress", &self.egress.as_ref().map(|e| e.name()))
            .field("policy", &self.policy.is_some())
            .field("encryption", &self.encryption)
            .finish_non_exhaustive()
    }
}

/// What one reconciliation found and did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Failed steps, with their errors (a step may fail more than once, e.g. routes).
    pub failures: Vec<(&'static str, Error)>,
    /// Routes of ours to IPv4 and IPv6 pod CIDRs in the table after the pass.
    pub routes: (usize, usize),
    /// Of those, the encapsulated ones (through a VXLAN device), IPv4 and IPv6.
    pub tunnels: (usize, usize),
    /// In-cluster prefixes the egress rules exempt.
    pub egress_prefixes: usize,
    /// Nodes left out.
    pub skipped: usize,
    /// What the pass could not do yet for want of a complete view: `(step, why)`.
    pub waiting: Vec<(&'static str, String)>,
    /// What the NetworkPolicy table holds.
    pub policy: PolicyCounts,
    /// Routes through the WireGuard device, IPv4 and IPv6.
    pub encrypted: (usize, usize),
    /// What the encryption step counted.
    pub encryption: EncryptionCounts,
}

impl Outcome {
    /// The failed steps, each once, in order.
    pub fn failed_steps(&self) -> Vec<&'static str> {
        let mut steps: Vec<&'static str> = Vec::new();
        for (step, _) in &self.failures {
            if !steps.contains(step) {
                steps.push(step);
            }
        }
        steps
    }
}

/// What was last logged, so a standing condition is logged once, not every pass.
#[derive(Debug, Default)]
struct Reported {
    skipped: BTreeMap<String, String>,
    foreign: BTreeMap<IpNetwork, String>,
    mtu: Option<(u32, String)>,
    waiting_for_cidrs: bool,
    shadowed_by: Vec<String>,
    failures: Vec<String>,
    policy_problems: BTreeMap<String, Vec<String>>,
}

/// How long each step of one pass took, for the debug log: where the time of a slow
/// pass goes, without a profiler.
#[derive(Debug)]
struct Phases {
    start: Instant,
    last: Instant,
    laps: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn start() -> Self {
        let now = Instant::now();
        Self {
            start: now,
            last: now,
            laps: Vec::new(),
        }
    }

    /// Ends the phase `name` now.
    fn lap(&mut self, name: &'static str) {
        let now = Instant::now();
        self.laps.push((name, now - self.last));
        self.last = now;
    }

    /// `pass 12.3 ms: host 0.2, plan 0.1, ...`.
    fn summary(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let mut text = format!("pass {:.1} ms:", ms(self.last - self.start));
        for (i, (name, took)) in self.laps.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            let _ = write!(text, "{sep}{name} {:.1}", ms(*took));
        }
        text
    }
}

/// The reconciler: settings, effects, what it has told the operator, and what the
/// VXLAN devices hold.
#[derive(Debug)]
pub struct Reconciler {
    settings: Settings,
    protocol: u8,
    effects: Effects,
    reported: Reported,
    /// The VXLAN devices' entries by device index, as read at the last resync and
    /// changed by every pass since: at thousands of peers, reading them back on every
    /// pass would cost more than the change itself. `None`: read them on the next pass.
    entries: Option<BTreeMap<u32, DeviceEntries>>,
    /// Told by the host's notifications that an entry of the devices was deleted.
    entries_watch: Option<Arc<EntriesWatch>>,
    /// The encryption step.
    encryption: Option<EncryptionStep>,
    /// The Node store itself, looked at between the steps of a pass for peers' new
    /// keys that arrived since the pass's snapshot.
    live_nodes: Option<Arc<Mutex<Store<SlimNode>>>>,
}

impl Reconciler {
    /// A reconciler that has done nothing yet.
    pub fn new(settings: Settings, protocol: u8, mut effects: Effects) -> Self {
        let encryption = effects.encryption.take().map(|e| {
            EncryptionStep::new(
                settings.plan.encryption.clone(),
                settings.encryption_device.clone(),
                settings.plan.node_name.clone(),
                e,
            )
        });
        Self {
            settings,
            protocol,
            effects,
            reported: Reported::default(),
            entries: None,
            entries_watch: None,
            encryption,
            live_nodes: None,
        }
    }

    /// Reads the VXLAN devices' entries again on the pass after `watch` heard that one
    /// was deleted, not only at the resync, and tells it which devices are ours.
    pub fn with_entries_watch(mut self, watch: Arc<EntriesWatch>) -> Self {
        self.entries_watch = Some(watch);
        self
    }

    /// Reads the WireGuard device again on the pass after `watch` saw it change (a peer
    /// deleted by hand), not only at the resync.
    pub fn with_peers_watch(mut self, watch: Arc<crate::encryption::watch::PeersWatch>) -> Self {
        self.encryption = self.encryption.map(|step| step.with_peers_watch(watch));
        self
    }

    /// Puts a peer's new key on the device between the steps of a pass too, as soon
    /// as `nodes` has it, rather than after the rest of the pass.
    pub fn with_live_nodes(mut self, nodes: Arc<Mutex<Store<SlimNode>>>) -> Self {
        self.live_nodes = Some(nodes);
        self
    }

    /// Between two steps of a pass: peers' new keys that the Node store has heard of
    /// since the pass's snapshot (see [`EncryptionStep::follow_key_changes`]).
    fn follow_keys_mid_pass(&mut self) {
        if let (Some(step), Some(live)) = (&mut self.encryption, &self.live_nodes)
            && let Some(nodes) = crate::store::snapshot_of(live)
        {
            step.follow_key_changes(&nodes, true);
        }
    }

    /// One pass against a snapshot of the stores; `resync` re-reads what is cached of
    /// the kernel first.
    pub fn reconcile(&mut self, snapshot: &Snapshot, resync: bool) -> Outcome {
        let nodes: &ItemMap<NodeInfo> = &snapshot.nodes;
        let _pass = self.encryption.as_ref().and_then(EncryptionStep::pass);
        let mut outcome = Outcome::default();
        let mut phases = Phases::start();
        if let Some(step) = &mut self.encryption {
            step.follow_key_changes(&snapshot.nodes, false);
            phases.lap("encryption keys");
        }
        let lost = self.entries_watch.as_ref().is_some_and(|w| w.take_lost());
        let read_entries = resync || lost || self.entries.is_none();
        let mut host = match self.effects.host.read(read_entries) {
            Ok(mut host) => {
                self.known_entries(&mut host, read_entries);
                if let Some(watch) = &self.entries_watch {
                    watch.watch(host.overlay.iter().map(|d| d.link.index));
                }
                host
            }
            Err(e) => {
                outcome.failures.push(("host", e));
                self.report_failures(&outcome);
                return outcome;
            }
        };
        phases.lap("host");
        self.follow_keys_mid_pass();
        if let Some(step) = &mut self.encryption {
            step.before_plan(snapshot, &mut host, resync, &mut outcome.failures);
            phases.lap("encryption");
        }
        self.follow_keys_mid_pass();
        let mut desired = plan::desired(snapshot, &host, &self.settings);
        self.report_skipped(&desired, nodes);
        outcome.skipped = desired.plan.skipped.len();
        phases.lap("plan");
        self.follow_keys_mid_pass();

        if let Err(e) = self.write_config(&desired) {
            outcome.failures.push(("conflist", e));
        }
        phases.lap("conflist");

        let devices = match &self.settings.plan.overlay {
            Some(settings) => overlay::ensure(
                self.effects.devices.as_ref(),
                &host,
                &desired.overlay,
                settings,
            ),
            None => overlay::DeviceOutcome::default(),
        };
        report_devices(&devices.done);
        outcome
            .failures
            .extend(devices.failed.into_iter().map(|e| ("overlay", e)));
        phases.lap("overlay");

        if let Some(step) = &mut self.encryption {
            step.write_peers(&desired.plan, &mut outcome.failures);
        }
        let mut changes = routes::reconcile(
            self.effects.routes.as_ref(),
            &host,
            &desired.plan.routes,
            &devices.ready,
            self.protocol,
        );
        self.report_routes(&changes);
        outcome.routes = routes_after(&host, &changes, self.protocol);
        outcome.tunnels = changes.tunnels;
        outcome.encrypted = changes.encrypted;
        self.entries = changes.entries_after.take();
        for failure in changes.failed {
            let step = if matches!(failure, Error::VxlanEntry(_)) {
                "overlay"
            } else {
                "routes"
            };
            outcome.failures.push((step, failure));
        }
        phases.lap("routes");
        self.follow_keys_mid_pass();
        if !devices.stale.is_empty() {
            let removed = overlay::remove_stale(self.effects.devices.as_ref(), &devices.stale);
            report_devices(&removed.done);
            outcome
                .failures
                .extend(removed.failed.into_iter().map(|e| ("overlay", e)));
        }
        if let Some(step) = &mut self.encryption {
            outcome.encryption = step.after_routes(
                &desired.plan,
                &host,
                resync,
                self.effects.devices.as_ref(),
                &mut outcome.failures,
            );
            phases.lap("encryption peers");
        }

        if let Some(rules) = &self.effects.egress {
            let plan = &desired.plan;
            match rules.sync(&plan.own_pod_cidrs, &plan.in_cluster) {
                Ok(true) if plan.own_pod_cidrs.is_empty() => tracing::info!(
                    "egress SNAT ({}): no pod CIDR on this node, nothing is masqueraded",
                    rules.name()
                ),
                Ok(true) => tracing::info!(
                    "egress SNAT ({}): pods of {} masquerade outside {} in-cluster prefixes",
                    rules.name(),
                    list(&plan.own_pod_cidrs),
                    plan.in_cluster.len()
                ),
                Ok(false) => {}
                Err(e) => outcome.failures.push(("egress", e)),
            }
            outcome.egress_prefixes = egress::exempt_prefixes(&plan.in_cluster);
            phases.lap("egress");
        }
        let pipeline = std::mem::take(&mut desired.policy);
        self.enforce_policy(pipeline, resync, &mut outcome, &mut phases);
        self.report_failures(&outcome);
        tracing::debug!("{}", phases.summary());
        outcome
    }

    /// Fills in the devices' entries from what the reconciler knows, or, when they were
    /// read, makes that what it knows. Setting a device down flushes its neighbours.
    fn known_entries(&mut self, host: &mut HostState, read: bool) {
        if read {
            self.entries = Some(
                host.overlay
                    .iter()
                    .filter_map(|d| Some((d.link.index, d.entries.clone()?)))
                    .collect(),
            );
            return;
        }
        let known = self.entries.get_or_insert_default();
        for device in host.overlay.iter_mut().filter(|d| d.link.vxlan.is_some()) {
            let mut entries = known.get(&device.link.index).cloned().unwrap_or_default();
            if !device.link.up {
                entries.neighbours.clear();
            }
            device.entries = Some(entries);
        }
    }

    /// The policy step: brings the tables in step with the pipeline's ready tiers; a
    /// tier still waiting for its view keeps what the kernel holds for it.
    fn enforce_policy(
        &mut self,
        pipeline: Pipeline,
        resync: bool,
        outcome: &mut Outcome,
        phases: &mut Phases,
    ) {
        let Some(datapath) = &mut self.effects.policy else {
            return;
        };
        // ClusterNetworkPolicy is optional: its tiers waiting (the API has not said
        // whether it serves the kind) keep the kernel as it is but not readiness.
        outcome.waiting.extend(
            pipeline
                .waiting()
                .into_iter()
                .filter(|(tier, _)| *tier == Tier::NetworkPolicy)
                .map(|(_, why)| ("policy", why)),
        );
        if !pipeline.any_ready() {
            return;
        }
        if resync {
            let reloaded = datapath.reload();
            phases.lap("policy reload");
            if let Err(e) = reloaded {
                outcome.failures.push(("policy", e));
                return;
            }
        }
        let counts = pipeline.counts();
        outcome.policy = counts;
        let problems = pipeline
            .network_policy
            .ready()
            .map(|want| want.problems.clone())
            .unwrap_or_default();
        let cluster = pipeline.admin.ready().is_some() || pipeline.baseline.ready().is_some();
        match datapath.apply(pipeline) {
            Ok(true) => {
                tracing::info!(
                    "NetworkPolicy: {} local pod addresses isolated for ingress, {} for egress, \
                     {} profiles, {} shared peer sets",
                    counts.ingress,
                    counts.egress,
                    counts.profiles,
                    counts.peer_sets
                );
                if cluster {
                    tracing::info!(
                        "ClusterNetworkPolicy: the Admin tier judges {} local pod addresses \
                         ({} peers, {} boxes), the Baseline tier {} ({} peers, {} boxes)",
                        counts.admin_pods,
                        counts.admin_peers,
                        counts.admin_boxes,
                        counts.baseline_pods,
                        counts.baseline_peers,
                        counts.baseline_boxes
                    );
                }
            }
            Ok(false) => {}
            Err(e) => outcome.failures.push(("policy", e)),
        }
        phases.lap("policy table");
        for (key, list) in &problems {
            if self.reported.policy_problems.get(key) != Some(list) {
                tracing::warn!(
                    "NetworkPolicy {key} cannot be enforced exactly, so it is enforced more \
                     strictly: {}",
                    list.join("; ")
                );
            }
        }
        self.reported.policy_problems = problems;
    }

    fn write_config(&mut self, desired: &Desired) -> Result<(), Error> {
        let Some(config) = &desired.config else {
            if !self.reported.waiting_for_cidrs {
                tracing::info!(
                    "node {} has no usable pod CIDR yet: no network config is written until \
                     the controller assigns one (kube-controller-manager --allocate-node-cidrs)",
                    self.settings.plan.node_name
                );
                self.reported.waiting_for_cidrs = true;
            }
            return Ok(());
        };
        self.reported.waiting_for_cidrs = false;
        let NetworkConfig {
            bytes,
            mtu,
            mtu_why,
            portmap,
        } = config;
        if self.reported.mtu.as_ref() != Some(&(*mtu, mtu_why.clone())) {
            tracing::info!("pod MTU {mtu}: {mtu_why}");
            self.reported.mtu = Some((*mtu, mtu_why.clone()));
        }
        let dir = &self.effects.config;
        let path = dir.path();
        match dir.write_if_changed(bytes) {
            Ok(true) => tracing::info!(
                "wrote {}: pod CIDRs {}, MTU {mtu}, portmap {}",
                path.display(),
                list(&desired.plan.own_pod_cidrs),
                if *portmap { "chained" } else { "not installed" }
            ),
            Ok(false) => {}
            Err(source) => return Err(Error::WriteConfig { path, source }),
        }
        let shadowed_by = dir.shadowing();
        if shadowed_by != self.reported.shadowed_by {
            if !shadowed_by.is_empty() {
                tracing::warn!(
                    "{} sorts after {} in its directory: runtimes use the first config by \
                     name, so pods do not get this network",
                    path.display(),
                    shadowed_by.join(", "),
                );
            }
            self.reported.shadowed_by = shadowed_by;
        }
        Ok(())
    }

    fn report_skipped(&mut self, desired: &Desired, nodes: &ItemMap<NodeInfo>) {
        let skipped = &desired.plan.skipped;
        for (name, why) in skipped {
            if self.reported.skipped.get(name) != Some(why) {
                tracing::warn!("node {name} skipped: {why}");
            }
        }
        for name in self.reported.skipped.keys() {
            if !skipped.contains_key(name) && nodes.contains_key(name) {
                tracing::info!("node {name} is no longer skipped");
            }
        }
        self.reported.skipped = skipped.clone();
    }

    fn report_routes(&mut self, changes: &RouteChanges) {
        let proto = self.protocol;
        let summary = |verb: &str, items: Vec<String>| {
            if items.is_empty() {
                return;
            }
            let shown: Vec<&str> = items.iter().take(8).map(String::as_str).collect();
            let more = items.len().saturating_sub(shown.len());
            tracing::info!(
                "{verb} {} route{} (proto {proto}): {}{}",
                items.len(),
                if items.len() == 1 { "" } else { "s" },
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
        };
        summary(
            "added",
            changes
                .added
                .iter()
                .map(|(d, h)| format!("{d} {}", hop_text(h)))
                .collect(),
        );
        summary(
            "changed",
            changes
                .replaced
                .iter()
                .map(|(d, h)| format!("{d} now {}", hop_text(h)))
                .collect(),
        );
        if changes.entries != (0, 0) {
            tracing::info!(
                "VXLAN peers: {} FDB and neighbour entries written, {} deleted",
                changes.entries.0,
                changes.entries.1
            );
        }
        summary(
            "removed",
            changes.removed.iter().map(ToString::to_string).collect(),
        );
        let foreign: BTreeMap<IpNetwork, String> = changes.foreign.iter().cloned().collect();
        for (dst, theirs) in &foreign {
            if self.reported.foreign.get(dst) != Some(theirs) {
                tracing::warn!(
                    "{dst} is already routed by someone else ({theirs}): left alone, no route \
                     of ours added"
                );
            }
        }
        self.reported.foreign = foreign;
    }

    fn report_failures(&mut self, outcome: &Outcome) {
        let failures: Vec<String> = outcome
            .failures
            .iter()
            .map(|(step, e)| format!("{step}: {}", chain(e)))
            .collect();
        if failures != self.reported.failures {
            for failure in &failures {
                tracing::error!("{failure} (retrying)");
            }
            if failures.is_empty() {
                tracing::info!("every reconcile step succeeds again");
            }
            self.reported.failures = failures;
        }
    }
}

/// A next hop for the log: `via 198.18.0.12`, `via 10.244.3.0 over VXLAN to 198.19.0.13`.
fn hop_text(hop: &NextHop) -> String {
    format!("via {hop}")
}

fn report_devices(done: &[String]) {
    for what in done {
        tracing::info!("overlay: {what}");
    }
}

/// Our routes per family once the changes are made: what was there, plus what was
/// added, minus what was removed (a replaced route stays one route).
fn routes_after(host: &HostState, changes: &RouteChanges, protocol: u8) -> (usize, usize) {
    let mut ours: BTreeMap<IpNetwork, ()> = host
        .ours
        .iter()
        .filter(|r| r.protocol == Some(protocol))
        .map(|r| (r.dst, ()))
        .collect();
    for dst in &changes.removed {
        ours.remove(dst);
    }
    for (dst, _) in &changes.added {
        ours.insert(*dst, ());
    }
    let v4 = ours.keys().filter(|d| d.is_ipv4()).count();
    (v4, ours.len() - v4)
}

fn list(nets: &[IpNetwork]) -> String {
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use std::sync::{Arc, Mutex};

    use crate::conflist::ConflistSettings;
    use crate::host::HostState;
    use crate::host::{HostRoute, HostView};
    use crate::overlay::fakes::NoDevices;
    use crate::plan::PlanSettings;

    /// Everything the fakes were asked to do, in order.
    type Log = Arc<Mutex<Vec<String>>>;

    /// The host as read, or `None` when reading fails.
    struct FakeHost(Arc<Mutex<Option<HostState>>>);
    impl HostReader for FakeHost {
        fn read(&self, _entries: bool) -> crate::error::Result<HostState> {
            self.0
                .lock()
                .unwrap()
                .clone()
                .ok_or_else(|| Error::HostEvents(io::Error::other("netlink said no")))
        }
    }

    struct FakeDir {
        log: Log,
        file: Arc<Mutex<Option<Vec<u8>>>>,
        writable: Arc<Mutex<bool>>,
    }
    impl ConfigDir for FakeDir {
        fn write_if_changed(&self, bytes: &[u8]) -> io::Result<bool> {
            if !*self.writable.lock().unwrap() {
                return Err(io::Error::from_raw_os_error(30));
            }
            let mut file = self.file.lock().unwrap();
            if file.as_deref() == Some(bytes) {
                return Ok(false);
            }
            *file = Some(bytes.to_vec());
            self.log.lock().unwrap().push("write conflist".into());
            Ok(true)
        }
        fn shadowing(&self) -> Vec<String> {
            Vec::new()
        }
        fn path(&self) -> PathBuf {
            PathBuf::from("/etc/cni/net.d/10-test.conflist")
        }
    }

    struct FakeTable(Log);
    impl RouteTable for FakeTable {
        fn apply(
            &self,
            changes: &[cni_linux::Change],
        ) -> cni_linux::Result<Vec<cni_linux::Result<()>>> {
            let mut log = self.0.lock().unwrap();
            for change in changes {
                log.push(match change {
                    cni_linux::Change::ReplaceRoute(r) => format!("route {r}"),
                    cni_linux::Change::DelRoute(r) => format!("delete {r}"),
                    other => format!("{other:?}"),
                });
            }
            Ok(changes.iter().map(|_| Ok(())).collect())
        }
    }

    struct FakeEgress(Log);
    impl EgressRules for FakeEgress {
        fn sync(
            &self,
            sources: &[IpNetwork],
            in_cluster: &[IpNetwork],
        ) -> crate::error::Result<bool> {
            self.0.lock().unwrap().push(format!(
                "egress {} exempt {}",
                list(sources),
                list(in_cluster)
            ));
            Ok(true)
        }
        fn name(&self) -> &'static str {
            "fake"
        }
    }

    struct Fixture {
        log: Log,
        host: Arc<Mutex<Option<HostState>>>,
        file: Arc<Mutex<Option<Vec<u8>>>>,
        writable: Arc<Mutex<bool>>,
        reconciler: Reconciler,
    }

    fn host_state() -> HostState {
        HostState {
            view: HostView {
                addresses: vec!["198.18.0.11".parse().unwrap()],
                routes: vec![HostRoute {
                    dst: "198.18.0.0/24".parse().unwrap(),
                    gw: None,
                }],
                wireguard: None,
            },
            address_mtus: vec![("198.18.0.11".parse().unwrap(), 1450, "ul0".into())],
            ..HostState::default()
        }
    }

    fn fixture() -> Fixture {
        let log = Log::default();
        let host = Arc::new(Mutex::new(Some(host_state())));
        let file = Arc::new(Mutex::new(None));
        let writable = Arc::new(Mutex::new(true));
        let effects = Effects {
            host: Box::new(FakeHost(Arc::clone(&host))),
            config: Box::new(FakeDir {
                log: Arc::clone(&log),
                file: Arc::clone(&file),
                writable: Arc::clone(&writable),
            }),
            routes: Box::new(FakeTable(Arc::clone(&log))),
            devices: Box::new(NoDevices),
            egress: Some(Box::new(FakeEgress(Arc::clone(&log)))),
            policy: None,
            encryption: None,
        };
        let settings = Settings {
            plan: PlanSettings {
                node_name: "n1".into(),
                ..PlanSettings::default()
            },
            mtu: None,
            conflist: ConflistSettings {
                network_name: "pods".into(),
                bridge: "cni0".into(),
                ..ConflistSettings::default()
            },
            policy_shared_peer_ranges: None,
            encryption_device: String::new(),
        };
        Fixture {
            log,
            host,
            file,
            writable,
            reconciler: Reconciler::new(settings, 77, effects),
        }
    }

    fn node(name: &str, cidr: &str, ip: &str) -> (String, NodeInfo) {
        (
            name.to_owned(),
            NodeInfo {
                name: name.into(),
                wireguard_key: None,
                pod_cidrs: vec![cidr.parse().unwrap()],
                internal_ips: vec![ip.parse::<IpAddr>().unwrap()],
                problems: Vec::new(),
                ..NodeInfo::default()
            },
        )
    }

    fn two_nodes() -> ItemMap<NodeInfo> {
        [
            node("n1", "10.244.1.0/24", "198.18.0.11"),
            node("n2", "10.244.2.0/24", "198.18.0.12"),
        ]
        .into_iter()
        .map(|(name, node)| (name, Arc::new(node)))
        .collect()
    }

    fn nodes_only(nodes: &ItemMap<NodeInfo>) -> Snapshot {
        Snapshot {
            nodes: Arc::new(nodes.clone()),
            policy: crate::policy::pipeline::PolicyInputs::default(),
        }
    }

    fn take(log: &Log) -> Vec<String> {
        std::mem::take(&mut *log.lock().unwrap())
    }

    /// What the fake publisher was asked to write, and whether it refuses.
    #[derive(Default, Clone)]
    struct FakePublisher(Arc<Mutex<Vec<Option<String>>>>);
    impl crate::encryption::annotation::Publisher for FakePublisher {
        fn publish(&self, node: &str, value: Option<&str>) -> crate::error::Result<()> {
            assert_eq!(node, "n1");
            self.0.lock().unwrap().push(value.map(ToOwned::to_owned));
            Ok(())
        }
    }

    /// The strict table's requests.
    #[derive(Default, Clone)]
    struct FakeStrict(Log);
    impl crate::encryption::strict::StrictRules for FakeStrict {
        fn sync(
            &self,
            policy: &crate::encryption::strict::StrictPolicy,
        ) -> crate::error::Result<bool> {
            self.0.lock().unwrap().push(format!(
                "strict {} own {} remote {} expected {}",
                policy.device,
                list(&policy.own),
                list(&policy.remote),
                list(&policy.expected)
            ));
            Ok(true)
        }
        fn remove(&self) -> crate::error::Result<bool> {
            self.0.lock().unwrap().push("strict off".into());
            Ok(false)
        }
    }

    struct Encrypting {
        f: Fixture,
        kernel: crate::encryption::device::fakes::FakeKernel,
        published: Arc<Mutex<Vec<Option<String>>>>,
        strict: Log,
        state_dir: PathBuf,
    }

    impl Drop for Encrypting {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.state_dir);
        }
    }

    fn encrypting(
        strict: bool,
        kernel: Option<Box<dyn crate::encryption::device::WireguardKernel>>,
    ) -> Encrypting {
        let mut f = fixture();
        let fake = crate::encryption::device::fakes::FakeKernel::default();
        let publisher = FakePublisher::default();
        let strict_log = Log::default();
        let state_dir = std::env::temp_dir().join(format!(
            "cni-node-reconcile-wg-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        let mut settings = f.reconciler.settings.clone();
        settings.plan.encryption = Some(crate::encryption::EncryptionSettings {
            strict,
            state_dir: state_dir.clone(),
            ..crate::encryption::EncryptionSettings::default()
        });
        settings.encryption_device = "cni-wg0".into();
        let old = std::mem::replace(
            &mut f.reconciler,
            Reconciler::new(Settings::default(), 77, effects_for_swap()),
        );
        let mut effects = old.effects;
        effects.encryption = Some(EncryptionEffects {
            kernel: Some(kernel.unwrap_or_else(|| Box::new(fake.clone()))),
            publisher: Box::new(publisher.clone()),
            strict: Box::new(FakeStrict(Arc::clone(&strict_log))),
        });
        f.reconciler = Reconciler::new(settings, 77, effects);
        Encrypting {
            f,
            kernel: fake,
            published: publisher.0,
            strict: strict_log,
            state_dir,
        }
    }

    /// Effects that do nothing, to swap a fixture's out.
    fn effects_for_swap() -> Effects {
        Effects {
            host: Box::new(FakeHost(Arc::new(Mutex::new(None)))),
            config: Box::new(FakeDir {
                log: Log::default(),
                file: Arc::default(),
                writable: Arc::new(Mutex::new(true)),
            }),
            routes: Box::new(FakeTable(Log::default())),
            devices: Box::new(NoDevices),
            egress: None,
            policy: None,
            encryption: None,
        }
    }

    fn with_key(
        mut nodes: ItemMap<NodeInfo>,
        name: &str,
        key: crate::encryption::Key,
    ) -> ItemMap<NodeInfo> {
        Arc::make_mut(nodes.get_mut(name).unwrap()).wireguard_key = Some(Ok(key));
        nodes
    }

    fn three_nodes() -> ItemMap<NodeInfo> {
        let mut nodes = two_nodes();
        nodes.extend(crate::store::item_map([node(
            "n3",
            "10.244.3.0/24",
            "198.18.0.13",
        )]));
        nodes
    }

    /// The device the fake kernel made, as the host reader would now see it.
    /// The nodes after a first pass that made the device (n2 publishing a key), shown
    /// to the host reader, with this node's new key published on n1 as the watch would
    /// bring it back.
    fn keyed_after_first_pass(e: &mut Encrypting) -> ItemMap<NodeInfo> {
        let nodes = with_key(three_nodes(), "n2", crate::encryption::Key([2; 32]));
        e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        show_device(e);
        let (own, _) = crate::encryption::key::load_or_create(&e.state_dir).unwrap();
        with_key(nodes, "n1", own.public())
    }

    fn show_device(e: &Encrypting) -> u32 {
        let state = e.kernel.0.lock().unwrap().clone();
        let device = state.device.expect("a device");
        e.f.host.lock().unwrap().as_mut().unwrap().overlay = vec![crate::overlay::fakes::device(
            device.index,
            "cni-wg0",
            "wireguard",
            0,
            "198.18.0.11".parse().unwrap(),
            device.mtu,
            true,
        )];
        device.index
    }

    #[test]
    fn encryption_makes_the_device_publishes_the_key_and_routes_keyed_nodes_through_it() {
        let mut e = encrypting(false, None);
        let k2 = crate::encryption::Key([2; 32]);
        let nodes = with_key(three_nodes(), "n2", k2);
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        let (own, _) = crate::encryption::key::load_or_create(&e.state_dir).unwrap();
        let public = own.public();
        assert_eq!(
            e.kernel.take_log(),
            vec![
                "create cni-wg0 mtu 1390".to_owned(),
                format!("key cni-wg0 {public:?} port 51830"),
                "peer n2 198.18.0.12:51830 10.244.2.0/24".to_owned(),
            ]
        );
        assert_eq!(*e.published.lock().unwrap(), vec![Some(public.to_base64())]);
        // The API took the key (the watch does not show it yet): n2's route goes
        // through the device at once, never in clear first.
        let made = e.kernel.0.lock().unwrap().device.as_ref().unwrap().index;
        let log = take(&e.f.log);
        assert!(
            log.iter().any(|l| l.starts_with("route 10.244.2.0/24")
                && l.contains(&format!("#{made}"))
                && !l.contains("via")),
            "{log:?}"
        );
        assert_eq!(*e.strict.lock().unwrap(), vec!["strict off"]);
        assert_eq!(outcome.encryption.peers, 1);
        assert_eq!(outcome.encryption.without_key, 1, "n3");
        assert_eq!(outcome.encrypted, (1, 0));
        let json: serde_json::Value =
            serde_json::from_slice(&e.f.file.lock().unwrap().clone().unwrap()).unwrap();
        assert_eq!(json["plugins"][0]["mtu"], 1390, "1450 - 60");

        // The watch shows the key now: nothing more to publish or to write.
        let index = show_device(&e);
        let nodes = with_key(nodes, "n1", public);
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        assert_eq!(e.kernel.take_log(), Vec::<String>::new());
        let log = take(&e.f.log);
        assert!(
            log.iter().any(|l| l.starts_with("route 10.244.2.0/24")
                && l.contains(&format!("#{index}"))
                && !l.contains("via")),
            "{log:?}"
        );
        assert_eq!(outcome.encrypted, (1, 0));
        assert_eq!(e.published.lock().unwrap().len(), 1, "not published again");
        assert_eq!(outcome.encryption.without_key, 1, "n3");

        // n2's key changes: the new peer first, the old one removed after the routes.
        let k7 = crate::encryption::Key([7; 32]);
        let nodes = with_key(nodes, "n2", k7);
        e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert_eq!(
            e.kernel.take_log(),
            vec![
                "peer n2 198.18.0.12:51830 10.244.2.0/24".to_owned(),
                format!("remove peer {k2:?}"),
            ]
        );
        // n2 goes: its peer goes (only it).
        let mut nodes = nodes;
        nodes.remove("n2");
        e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert_eq!(e.kernel.take_log(), vec![format!("remove peer {k7:?}")]);

        // The device deleted by hand: made again with its key and peers.
        let nodes = with_key(nodes, "n3", crate::encryption::Key([3; 32]));
        e.kernel.0.lock().unwrap().device = None;
        e.f.host.lock().unwrap().as_mut().unwrap().overlay.clear();
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        let log = e.kernel.take_log();
        assert_eq!(log.len(), 3, "{log:?}");
        assert!(log[0].starts_with("create cni-wg0") && log[2].starts_with("peer n3"));
    }

    /// A publisher the API refuses.
    struct RefusedPublisher;
    impl crate::encryption::annotation::Publisher for RefusedPublisher {
        fn publish(&self, node: &str, _: Option<&str>) -> crate::error::Result<()> {
            Err(Error::Publish {
                annotation: crate::encryption::ANNOTATION,
                node: node.to_owned(),
                source: "forbidden".into(),
            })
        }
    }

    #[test]
    fn while_the_api_has_not_taken_the_key_the_routes_stay_in_clear() {
        let mut e = encrypting(false, None);
        let old = std::mem::replace(
            &mut e.f.reconciler,
            Reconciler::new(Settings::default(), 77, effects_for_swap()),
        );
        let settings = old.settings.clone();
        let mut effects = old.effects;
        effects.encryption = Some(EncryptionEffects {
            kernel: Some(Box::new(e.kernel.clone())),
            publisher: Box::new(RefusedPublisher),
            strict: Box::new(FakeStrict(Arc::clone(&e.strict))),
        });
        e.f.reconciler = Reconciler::new(settings, 77, effects);
        let nodes = with_key(three_nodes(), "n2", crate::encryption::Key([2; 32]));
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert_eq!(outcome.failed_steps(), vec!["encryption"]);
        let log = take(&e.f.log);
        assert!(
            log.contains(&"route 10.244.2.0/24 via 198.18.0.12 table 254".to_owned()),
            "{log:?}"
        );
        assert_eq!(outcome.encrypted, (0, 0));
        assert_eq!(outcome.encryption.peers, 1, "peered all the same");
    }

    #[test]
    fn a_peers_new_key_is_on_the_device_before_the_host_read_and_the_plan() {
        let mut e = encrypting(false, None);
        let nodes = keyed_after_first_pass(&mut e);
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        e.kernel.take_log();
        // The host cannot be read in this pass, so nothing after the read runs: n2's
        // new key still reaches its peer, with its endpoint and allowed IPs.
        let host = e.f.host.lock().unwrap().take();
        let k7 = crate::encryption::Key([7; 32]);
        let nodes = with_key(nodes, "n2", k7);
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert_eq!(outcome.failed_steps(), vec!["host"]);
        assert_eq!(
            e.kernel.take_log(),
            vec!["peer n2 198.18.0.12:51830 10.244.2.0/24".to_owned()]
        );
        // The next whole pass finds the peer as it plans it and removes the old key's.
        *e.f.host.lock().unwrap() = host;
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        let k2 = crate::encryption::Key([2; 32]);
        assert_eq!(e.kernel.take_log(), vec![format!("remove peer {k2:?}")]);
        assert_eq!(outcome.encryption.peers, 1);

        // Left to the pass: a key another peer has, a Node whose pod CIDR changed with its
        // key, and a Node that is not a peer yet (n3 had no key).
        e.f.host.lock().unwrap().take();
        let mut nodes = with_key(nodes, "n3", k7);
        let n2 = Arc::make_mut(nodes.get_mut("n2").unwrap());
        n2.wireguard_key = Some(Ok(crate::encryption::Key([8; 32])));
        n2.pod_cidrs = vec!["10.244.12.0/24".parse().unwrap()];
        e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert_eq!(e.kernel.take_log(), Vec::<String>::new());
    }

    /// The Node as the watch would bring it.
    fn slim(node: &NodeInfo) -> SlimNode {
        let mut annotations = serde_json::Map::new();
        if let Some(key) = node.key() {
            annotations.insert(crate::encryption::ANNOTATION.into(), key.to_base64().into());
        }
        let addresses: Vec<serde_json::Value> = node
            .internal_ips
            .iter()
            .map(|ip| serde_json::json!({"type": "InternalIP", "address": ip.to_string()}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": node.name, "annotations": annotations},
            "spec": {"podCIDRs": node.pod_cidrs},
            "status": {"addresses": addresses},
        }))
        .unwrap()
    }

    /// Reads the host as the fixture's reader does, running `during` once first: a
    /// change that arrives while the pass reads the host.
    struct HostReadDuring {
        host: FakeHost,
        during: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    }
    impl HostReader for HostReadDuring {
        fn read(&self, entries: bool) -> crate::error::Result<HostState> {
            if let Some(during) = self.during.lock().unwrap().take() {
                during();
            }
            self.host.read(entries)
        }
    }

    #[test]
    fn a_new_key_heard_in_the_middle_of_a_pass_goes_on_at_once_and_that_pass_keeps_it() {
        use kube::runtime::watcher::Event;
        let mut e = encrypting(false, None);
        let nodes = keyed_after_first_pass(&mut e);
        e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        e.kernel.take_log();
        let live = Arc::new(Mutex::new(Store::<SlimNode>::default()));
        {
            let mut store = live.lock().unwrap();
            store.apply(Event::Init);
            for node in nodes.values() {
                store.apply(Event::InitApply(slim(node)));
            }
            store.apply(Event::InitDone);
        }
        e.f.reconciler.live_nodes = Some(Arc::clone(&live));
        let k2 = crate::encryption::Key([2; 32]);
        let k7 = crate::encryption::Key([7; 32]);
        let changed = with_key(nodes.clone(), "n2", k7);
        let n2 = slim(&changed["n2"]);
        let store = Arc::clone(&live);
        e.f.reconciler.effects.host = Box::new(HostReadDuring {
            host: FakeHost(Arc::clone(&e.f.host)),
            during: Mutex::new(Some(Box::new(move || {
                store.lock().unwrap().apply(Event::Apply(n2));
            }))),
        });
        // The pass plans from its snapshot, with n2's old key: it neither puts that key
        // back on the peer nor removes the new one.
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        assert_eq!(
            e.kernel.take_log(),
            vec!["peer n2 198.18.0.12:51830 10.244.2.0/24".to_owned()]
        );
        let holder = |e: &Encrypting| {
            let state = e.kernel.0.lock().unwrap();
            let peers = &state.device.as_ref().unwrap().peers;
            peers
                .iter()
                .filter(|p| !p.allowed_ips.is_empty())
                .map(|p| p.public_key)
                .collect::<Vec<_>>()
        };
        assert_eq!(holder(&e), [k7]);
        // The next pass, from the Nodes as they are now, removes the old key's peer.
        let now = crate::store::snapshot_of(&live).unwrap();
        let outcome = e.f.reconciler.reconcile(&nodes_only(&now), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        assert_eq!(e.kernel.take_log(), vec![format!("remove peer {k2:?}")]);
        assert_eq!(holder(&e), [k7]);
    }

    #[test]
    fn a_quiet_pass_reads_neither_the_key_file_nor_the_device_and_writes_nothing() {
        let mut e = encrypting(false, None);
        let nodes = keyed_after_first_pass(&mut e);
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        e.kernel.take_log();
        let reads = |e: &Encrypting| {
            (
                e.kernel.0.lock().unwrap().reads,
                e.f.reconciler.encryption.as_ref().unwrap().key_reads(),
            )
        };
        let before = reads(&e);
        let published = e.published.lock().unwrap().len();
        for _ in 0..3 {
            let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
            assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
            assert_eq!(outcome.encrypted, (1, 0));
        }
        assert_eq!(
            e.kernel.take_log(),
            Vec::<String>::new(),
            "no WireGuard request"
        );
        assert_eq!(reads(&e), before, "(device dumps, key file reads)");
        assert_eq!(e.published.lock().unwrap().len(), published, "no patch");
        // The resync reads the device again, but the key only if its file changed.
        e.f.reconciler.reconcile(&nodes_only(&nodes), true);
        assert_eq!(reads(&e), (before.0 + 1, before.1));
        assert_eq!(e.kernel.take_log(), Vec::<String>::new());
    }

    /// A peer removed behind the agent's back is not seen by a quiet pass (the agent
    /// keeps what it wrote); once the device watch says the device changed, the next
    /// pass reads it and writes the peer again.
    #[test]
    fn a_peer_removed_by_hand_is_written_again_on_the_pass_after_the_watch_saw_it() {
        let mut e = encrypting(false, None);
        let watch = Arc::new(crate::encryption::watch::PeersWatch::default());
        let step = e.f.reconciler.encryption.take().unwrap();
        e.f.reconciler.encryption = Some(step.with_peers_watch(Arc::clone(&watch)));
        // Each request of the reconciler is made in a pass, which the watch gives way to.
        e.kernel.0.lock().unwrap().watched = Some(Arc::clone(&watch));
        let nodes = keyed_after_first_pass(&mut e);
        e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        let peers = |e: &Encrypting| {
            let state = e.kernel.0.lock().unwrap();
            state.device.as_ref().map_or(0, |d| d.peers.len())
        };
        assert_eq!(peers(&e), 1);
        // What the agent wrote is what the watch expects: its own changes are no change.
        let held = |e: &Encrypting| {
            let state = e.kernel.0.lock().unwrap();
            let device = state.device.as_ref().unwrap();
            crate::encryption::watch::fingerprint(
                device.private_key.map(|k| k.public().0).as_ref(),
                device.port,
                device
                    .peers
                    .iter()
                    .map(|p| (&p.public_key.0, p.allowed_ips.as_slice())),
            )
        };
        assert_eq!(watch.expected(), Some(held(&e)));
        e.kernel
            .0
            .lock()
            .unwrap()
            .device
            .as_mut()
            .unwrap()
            .peers
            .clear();
        e.kernel.take_log();
        e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert_eq!(peers(&e), 0, "a quiet pass trusts what it wrote");
        watch.mark_changed();
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        assert_eq!(peers(&e), 1, "{:?}", e.kernel.take_log());
        assert!(!watch.take_changed(), "the pass took the change");
        assert_eq!(watch.expected(), Some(held(&e)));
        assert!(!watch.in_pass());
        assert_eq!(e.kernel.0.lock().unwrap().outside_a_pass, 0);
    }

    #[test]
    fn a_restart_adopts_the_device_its_key_and_peers_without_a_change() {
        let mut e = encrypting(false, None);
        let nodes = keyed_after_first_pass(&mut e);
        e.kernel.take_log();
        // A new agent (same state directory, same kernel).
        let mut settings = e.f.reconciler.settings.clone();
        settings.plan.encryption.as_mut().unwrap().state_dir = e.state_dir.clone();
        let old = std::mem::replace(
            &mut e.f.reconciler,
            Reconciler::new(Settings::default(), 77, effects_for_swap()),
        );
        let mut effects = old.effects;
        effects.encryption = Some(EncryptionEffects {
            kernel: Some(Box::new(e.kernel.clone())),
            publisher: Box::new(FakePublisher(Arc::clone(&e.published))),
            strict: Box::new(FakeStrict(Arc::clone(&e.strict))),
        });
        e.f.reconciler = Reconciler::new(settings, 77, effects);
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), true);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        assert_eq!(e.kernel.take_log(), Vec::<String>::new(), "nothing changed");
        assert_eq!(outcome.encryption.peers, 1);
    }

    #[test]
    fn without_wireguard_in_the_kernel_the_step_fails_and_everything_stays_clear() {
        let mut e = encrypting(true, Some(Box::new(crate::encryption::device::Unsupported)));
        // A key this node published before (another kernel, say) goes.
        let nodes = with_key(
            with_key(three_nodes(), "n1", crate::encryption::Key([1; 32])),
            "n2",
            crate::encryption::Key([2; 32]),
        );
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert_eq!(outcome.failed_steps(), vec!["encryption"]);
        let text = chain(&outcome.failures[0].1);
        assert!(text.contains("no WireGuard"), "{text}");
        assert_eq!(*e.published.lock().unwrap(), vec![None]);
        let log = take(&e.f.log);
        assert!(
            log.contains(&"route 10.244.2.0/24 via 198.18.0.12 table 254".to_owned()),
            "{log:?}"
        );
        // Strict: nothing leaves for another node but through the (missing) device,
        // and n2 (which publishes a key) is taken only through it.
        assert_eq!(
            *e.strict.lock().unwrap(),
            vec![
                "strict cni-wg0 own 10.244.1.0/24 remote 10.244.2.0/24, 10.244.3.0/24 expected 10.244.2.0/24"
            ]
        );
        assert_eq!(outcome.encryption.without_key, 2);
    }

    #[test]
    fn a_rotated_key_goes_on_the_device_and_is_published_while_the_routes_stay_on_it() {
        let mut e = encrypting(false, None);
        let nodes = keyed_after_first_pass(&mut e);
        let (old, _) = crate::encryption::key::load_or_create(&e.state_dir).unwrap();
        e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        e.kernel.take_log();
        take(&e.f.log);
        e.published.lock().unwrap().clear();

        let new = crate::encryption::key::rotate(&e.state_dir).unwrap();
        assert_ne!(new, old.public());
        // The API still shows the old key.
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        assert_eq!(
            e.kernel.take_log(),
            vec![format!("key cni-wg0 {new:?} port 51830")]
        );
        assert_eq!(*e.published.lock().unwrap(), vec![Some(new.to_base64())]);
        let log = take(&e.f.log);
        // (The fake host does not show what was written: the route is asked for again,
        // and must be the one through the device, never the clear one.)
        assert!(
            log.iter()
                .any(|l| l.starts_with("route 10.244.2.0/24 dev #"))
                && !log.iter().any(|l| l.starts_with("route 10.244.2.0/24 via")),
            "the route stays on the device: {log:?}"
        );
        assert_eq!(outcome.encrypted, (1, 0));
        // The API shows the new key: nothing more to do.
        let nodes = with_key(nodes, "n1", new);
        let outcome = e.f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        assert_eq!(e.kernel.take_log(), Vec::<String>::new());
        assert_eq!(e.published.lock().unwrap().len(), 1);
        assert_eq!(outcome.encrypted, (1, 0));
    }

    #[test]
    fn one_pass_writes_the_config_routes_the_others_and_syncs_egress() {
        let mut f = fixture();
        let outcome = f.reconciler.reconcile(&nodes_only(&two_nodes()), false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        assert_eq!(
            take(&f.log),
            vec![
                "write conflist",
                "route 10.244.2.0/24 via 198.18.0.12 table 254",
                "egress 10.244.1.0/24 exempt 10.244.1.0/24, 10.244.2.0/24",
            ]
        );
        assert_eq!(outcome.routes, (1, 0));
        assert_eq!(
            outcome.egress_prefixes, 2,
            "10.244.1.0/24 and 10.244.2.0/24"
        );
        let file = f.file.lock().unwrap().clone().unwrap();
        let json: serde_json::Value = serde_json::from_slice(&file).unwrap();
        assert_eq!(json["plugins"][0]["mtu"], 1450);
    }

    #[test]
    fn a_failing_step_does_not_stop_the_others_and_is_named() {
        let mut f = fixture();
        *f.writable.lock().unwrap() = false;
        let outcome = f.reconciler.reconcile(&nodes_only(&two_nodes()), false);
        assert_eq!(outcome.failed_steps(), vec!["conflist"]);
        let text = chain(&outcome.failures[0].1);
        assert!(
            text.starts_with("cannot write /etc/cni/net.d/10-test.conflist: "),
            "{text}"
        );
        let log = take(&f.log);
        assert!(
            log.iter().any(|l| l.starts_with("route 10.244.2.0/24")),
            "{log:?}"
        );
        assert!(log.iter().any(|l| l.starts_with("egress")), "{log:?}");
        // Once the directory is writable again the next pass succeeds.
        *f.writable.lock().unwrap() = true;
        assert!(
            f.reconciler
                .reconcile(&nodes_only(&two_nodes()), false)
                .failures
                .is_empty()
        );
        assert!(f.file.lock().unwrap().is_some());
    }

    #[test]
    fn a_host_that_cannot_be_read_is_a_host_failure_and_nothing_is_touched() {
        let mut f = fixture();
        *f.host.lock().unwrap() = None;
        let outcome = f.reconciler.reconcile(&nodes_only(&two_nodes()), false);
        assert_eq!(outcome.failed_steps(), vec!["host"]);
        assert!(take(&f.log).is_empty());
    }

    #[test]
    fn the_uplink_mtu_reaches_the_config() {
        let mut f = fixture();
        f.reconciler.reconcile(&nodes_only(&two_nodes()), false);
        take(&f.log);
        f.host.lock().unwrap().as_mut().unwrap().address_mtus[0].1 = 1400;
        f.reconciler.reconcile(&nodes_only(&two_nodes()), false);
        assert_eq!(take(&f.log)[0], "write conflist");
        let file = f.file.lock().unwrap().clone().unwrap();
        let json: serde_json::Value = serde_json::from_slice(&file).unwrap();
        assert_eq!(json["plugins"][0]["mtu"], 1400);
    }

    #[test]
    fn routes_follow_nodes_that_come_and_go() {
        let mut f = fixture();
        f.reconciler.reconcile(&nodes_only(&two_nodes()), false);
        // The route is in the table now; n2 leaves and n3 comes.
        f.host.lock().unwrap().as_mut().unwrap().ours = vec![crate::routes::our_route(
            "10.244.2.0/24".parse().unwrap(),
            "198.18.0.12".parse().unwrap(),
            77,
        )];
        take(&f.log);
        let mut nodes = two_nodes();
        nodes.remove("n2");
        nodes.extend(crate::store::item_map([node(
            "n3",
            "10.244.3.0/24",
            "198.18.0.13",
        )]));
        let outcome = f.reconciler.reconcile(&nodes_only(&nodes), false);
        let log = take(&f.log);
        assert_eq!(
            log[..2],
            [
                "delete 10.244.2.0/24 via 198.18.0.12 table 254".to_owned(),
                "route 10.244.3.0/24 via 198.18.0.13 table 254".to_owned(),
            ]
        );
        assert_eq!(outcome.routes, (1, 0));
    }

    #[test]
    fn vxlan_entries_are_written_once_and_read_back_only_on_a_resync() {
        let mut f = fixture();
        f.reconciler.settings.plan.overlay = Some(crate::plan::OverlaySettings {
            enabled: true,
            vni: 4097,
            port: 4789,
            device_prefix: "cni-vx".into(),
        });
        f.host
            .lock()
            .unwrap()
            .as_mut()
            .unwrap()
            .view
            .routes
            .push(HostRoute {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: Some("198.18.0.1".parse().unwrap()),
            });
        let mut nodes = two_nodes();
        nodes.extend(crate::store::item_map([node(
            "n3",
            "10.244.3.0/24",
            "203.0.113.3",
        )]));
        let entries = |log: &[String]| {
            log.iter()
                .filter(|l| l.starts_with("ReplaceFdb") || l.starts_with("ReplaceNeigh"))
                .count()
        };
        f.reconciler.reconcile(&nodes_only(&nodes), false);
        let log = take(&f.log);
        assert_eq!(entries(&log), 2, "{log:?}");
        assert!(
            log.contains(&"route 10.244.3.0/24 via 10.244.3.0 dev #1 onlink table 254".to_owned()),
            "{log:?}"
        );
        // The kernel now has the device (index 1, made by NoDevices) and the route;
        // a pass that does not read the entries trusts what it wrote.
        let local: IpAddr = "198.18.0.11".parse().unwrap();
        {
            let mut host = f.host.lock().unwrap();
            let host = host.as_mut().unwrap();
            host.address_indexes.insert(local, 2);
            host.ours = vec![crate::routes::tunnel_route(
                "10.244.3.0/24".parse().unwrap(),
                "10.244.3.0".parse().unwrap(),
                1,
                77,
            )];
            host.overlay = vec![crate::overlay::fakes::device(
                1, "cni-vx4", "vxlan", 4097, local, 1400, true,
            )];
        }
        f.reconciler.reconcile(&nodes_only(&nodes), false);
        let log = take(&f.log);
        assert_eq!(entries(&log), 0, "{log:?}");
        // A resync reads them: gone by hand, written again.
        f.host.lock().unwrap().as_mut().unwrap().overlay[0].entries =
            Some(DeviceEntries::default());
        f.reconciler.reconcile(&nodes_only(&nodes), true);
        assert_eq!(entries(&take(&f.log)), 2);
    }

    #[test]
    fn without_a_pod_cidr_no_config_is_written_but_routes_are_kept() {
        let mut f = fixture();
        let mut nodes = two_nodes();
        Arc::make_mut(nodes.get_mut("n1").unwrap())
            .pod_cidrs
            .clear();
        let outcome = f.reconciler.reconcile(&nodes_only(&nodes), false);
        assert!(outcome.failures.is_empty());
        let log = take(&f.log);
        assert!(!log.contains(&"write conflist".to_owned()), "{log:?}");
        assert!(f.file.lock().unwrap().is_none());
    }

    /// The policy datapath as the reconciler drives it: what each pass's pipeline held.
    struct FakePolicy(Log);
    impl PolicyDatapath for FakePolicy {
        fn apply(&mut self, want: Pipeline) -> crate::error::Result<bool> {
            fn stage<T>(s: &crate::policy::pipeline::Stage<T>) -> &'static str {
                match s {
                    crate::policy::pipeline::Stage::Off => "off",
                    crate::policy::pipeline::Stage::Waiting(_) => "waiting",
                    crate::policy::pipeline::Stage::Ready(_) => "ready",
                }
            }
            self.0.lock().unwrap().push(format!(
                "policy: admin {}, NetworkPolicy {}, baseline {}",
                stage(&want.admin),
                stage(&want.network_policy),
                stage(&want.baseline)
            ));
            Ok(true)
        }
        fn reload(&mut self) -> crate::error::Result<()> {
            Ok(())
        }
    }

    /// ClusterNetworkPolicy's tiers: while they wait (the API has not answered) the
    /// datapath is told so and keeps the kernel's, and the pass is ready all the same;
    /// once ready they reach the datapath with NetworkPolicy in one apply, and the
    /// outcome counts the pods each tier judges.
    #[test]
    fn cluster_tiers_reach_the_datapath_and_never_hold_back_readiness() {
        use crate::policy::cluster_network_policy;
        use crate::policy::cluster_objects::ClusterPolicyInfo;
        use crate::policy::objects::{PodInfo, SlimPod};
        use crate::policy::pipeline::{PolicyInputs, Stage};
        let mut f = fixture();
        f.reconciler.effects.policy = Some(Box::new(FakePolicy(Arc::clone(&f.log))));
        let pod: SlimPod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "x", "name": "a", "labels": {"app": "a"}},
            "spec": {"nodeName": "n1"},
            "status": {"podIPs": [{"ip": "10.244.1.5"}]},
        }))
        .unwrap();
        let info = PodInfo::from_slim(&pod);
        let pods = Arc::new(BTreeMap::from([(info.key(), Arc::new(info))]));
        let namespaces = Arc::new(BTreeMap::from([(
            "x".to_owned(),
            Arc::new(BTreeMap::new()),
        )]));
        let network_policy = crate::policy::network_policy::Snapshot {
            pods: Arc::clone(&pods),
            namespaces: Arc::clone(&namespaces),
            policies: Arc::new(BTreeMap::new()),
        };
        let mut snapshot = nodes_only(&two_nodes());
        snapshot.policy = PolicyInputs {
            admin: Stage::Waiting(cluster_network_policy::WAITING.into()),
            network_policy: Stage::Ready(network_policy.clone()),
            baseline: Stage::Waiting(cluster_network_policy::WAITING.into()),
        };
        let outcome = f.reconciler.reconcile(&snapshot, false);
        assert!(outcome.waiting.is_empty(), "{:?}", outcome.waiting);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        let log = take(&f.log);
        assert!(
            log.contains(&"policy: admin waiting, NetworkPolicy ready, baseline waiting".into()),
            "{log:?}"
        );

        let deny = ClusterPolicyInfo::read(
            "deny-all",
            &serde_json::json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
                                "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),
        );
        let cluster = cluster_network_policy::Snapshot {
            pods,
            namespaces,
            policies: Arc::new(BTreeMap::from([("deny-all".to_owned(), Arc::new(deny))])),
        };
        snapshot.policy = PolicyInputs {
            admin: Stage::Ready(cluster.clone()),
            network_policy: Stage::Ready(network_policy),
            baseline: Stage::Ready(cluster),
        };
        let outcome = f.reconciler.reconcile(&snapshot, false);
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        assert_eq!(
            (outcome.policy.admin_pods, outcome.policy.baseline_pods),
            (1, 0)
        );
        assert!(outcome.policy.admin_boxes > 0);
        let log = take(&f.log);
        assert!(
            log.contains(&"policy: admin ready, NetworkPolicy ready, baseline ready".into()),
            "{log:?}"
        );
    }
}
