//! The agent's loop: the Node watch feeds the node map; after every change that
//! matters, and every resync interval, one reconciliation reads the host, computes
//! the plan and applies the difference (config file, routes, egress rules).
//!
//! Nothing is removed on the word of a broken watch: the map changes only through
//! watch events and complete lists (a relist replaces the map once it is whole), and
//! until the first complete list nothing at all is done, so an agent that cannot reach
//! the API leaves the node as it was.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cni_linux::Netlink;
use futures::{FutureExt, StreamExt};
use ipnetwork::IpNetwork;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::Options;
use crate::conflist::{self, ConflistSettings};
use crate::egress::EgressRules;
use crate::health::Health;
use crate::node::{NodeInfo, SlimNode};
use crate::plan::{self, Plan, PlanSettings};
use crate::{host, log, routes};

/// Events taken in one go before reconciling: a burst (the initial list, a relist, many
/// nodes changing at once) is applied as one change.
const BATCH: usize = 10_000;

/// The node map and what has been reported of it.
pub struct Agent {
    options: Options,
    nl: Netlink,
    egress: Option<Box<dyn EgressRules>>,
    health: Arc<Health>,
    nodes: BTreeMap<String, NodeInfo>,
    /// A relist in progress: the map it will replace.
    relist: Option<BTreeMap<String, NodeInfo>>,
    /// A complete list has been seen.
    listed: bool,
    /// What was last logged, so a standing condition is logged once, not every resync.
    reported: Reported,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("nodes", &self.nodes.len())
            .field("listed", &self.listed)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Reported {
    skipped: BTreeMap<String, String>,
    foreign: BTreeMap<IpNetwork, String>,
    mtu: Option<(u32, String)>,
    waiting_for_cidrs: bool,
    shadowed_by: Vec<String>,
    failures: Vec<String>,
}

impl Agent {
    /// An agent with an empty map.
    pub fn new(
        options: Options,
        nl: Netlink,
        egress: Option<Box<dyn EgressRules>>,
        health: Arc<Health>,
    ) -> Self {
        Self {
            options,
            nl,
            egress,
            health,
            nodes: BTreeMap::new(),
            relist: None,
            listed: false,
            reported: Reported::default(),
        }
    }

    /// Takes one watch event; returns whether the map changed in a way that needs a
    /// reconciliation.
    pub fn on_event(&mut self, event: Event<SlimNode>) -> bool {
        match event {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            Event::InitApply(node) => {
                let info = NodeInfo::from_slim(&node);
                if let Some(relist) = &mut self.relist
                    && !info.name.is_empty()
                {
                    relist.insert(info.name.clone(), info);
                }
                false
            }
            Event::InitDone => {
                let Some(relist) = self.relist.take() else {
                    return false;
                };
                let first = !self.listed;
                let changed = first || relist != self.nodes;
                log::info(&format!(
                    "listed {} nodes{}",
                    relist.len(),
                    if first {
                        ""
                    } else {
                        " again (the watch was restarted)"
                    }
                ));
                self.nodes = relist;
                self.listed = true;
                changed
            }
            Event::Apply(node) => {
                let info = NodeInfo::from_slim(&node);
                if info.name.is_empty() || self.nodes.get(&info.name) == Some(&info) {
                    // Status heartbeats change nothing we use.
                    return false;
                }
                log::debug(&format!(
                    "node {}: pod CIDRs {:?}, InternalIPs {:?}",
                    info.name, info.pod_cidrs, info.internal_ips
                ));
                self.nodes.insert(info.name.clone(), info);
                self.listed
            }
            Event::Delete(node) => {
                let name = node.metadata.name.unwrap_or_default();
                let removed = self.nodes.remove(&name).is_some();
                if removed {
                    log::info(&format!("node {name} was deleted"));
                }
                removed && self.listed
            }
        }
    }

    /// Whether a complete list has been seen (until then nothing is done).
    pub fn listed(&self) -> bool {
        self.listed
    }

    /// Reads the host, plans, applies the difference and logs what changed.
    pub fn reconcile(&mut self) {
        let protocol = self.options.route_protocol;
        let host = match host::read(&self.nl, protocol) {
            Ok(host) => host,
            Err(e) => {
                log::error(&format!(
                    "cannot read this host's addresses and routes: {e}"
                ));
                return;
            }
        };
        let settings = PlanSettings {
            node_name: self.options.node_name.clone(),
            cluster_cidrs: self.options.cluster_cidrs.clone(),
            no_masquerade: self.options.no_masquerade.clone(),
        };
        let plan = plan::plan(&self.nodes, &host.view, &settings);
        self.report_skipped(&plan);
        let mut failures = Vec::new();
        if let Err(e) = self.write_conflist(&plan, &host) {
            failures.push(e);
        }
        let changes = routes::reconcile(&self.nl, &host, &plan.routes, protocol);
        self.report_routes(&changes);
        failures.extend(changes.failed.iter().cloned());
        if let Some(egress) = &self.egress {
            match egress.sync(&plan.own_pod_cidrs, &plan.in_cluster) {
                Ok(true) if plan.own_pod_cidrs.is_empty() => log::info(&format!(
                    "egress SNAT ({}): no pod CIDR on this node, nothing is masqueraded",
                    egress.name()
                )),
                Ok(true) => log::info(&format!(
                    "egress SNAT ({}): pods of {} masquerade outside {} in-cluster prefixes",
                    egress.name(),
                    list(&plan.own_pod_cidrs),
                    plan.in_cluster.len()
                )),
                Ok(false) => {}
                Err(e) => failures.push(format!("egress SNAT ({}): {e}", egress.name())),
            }
        }
        if failures != self.reported.failures {
            for failure in &failures {
                log::error(failure);
            }
            self.reported.failures = failures;
        }
        self.health.set_ready();
    }

    fn write_conflist(&mut self, plan: &Plan, host: &host::HostState) -> Result<(), String> {
        let o = &self.options;
        if plan.own_pod_cidrs.is_empty() {
            if !self.reported.waiting_for_cidrs {
                log::info(&format!(
                    "node {} has no usable pod CIDR yet: no network config is written until \
                     the controller assigns one (kube-controller-manager --allocate-node-cidrs)",
                    o.node_name
                ));
                self.reported.waiting_for_cidrs = true;
            }
            return Ok(());
        }
        self.reported.waiting_for_cidrs = false;
        let (mtu, why) = match o.mtu {
            Some(mtu) => (mtu, "set by --mtu".to_owned()),
            None => host::choose_mtu(host, &plan.own_internal_ips),
        };
        if self.reported.mtu.as_ref() != Some(&(mtu, why.clone())) {
            log::info(&format!("pod MTU {mtu}: {why}"));
            self.reported.mtu = Some((mtu, why));
        }
        let portmap = o.bin_dir.join("portmap").is_file();
        let bytes = conflist::render(
            &plan.own_pod_cidrs,
            mtu,
            &ConflistSettings {
                network_name: o.network_name.clone(),
                bridge: o.bridge.clone(),
                ipam_data_dir: o
                    .ipam_data_dir
                    .as_ref()
                    .map(|d| d.to_string_lossy().into_owned()),
                portmap,
            },
        );
        let path = o.conf_dir.join(&o.conflist_name);
        match conflist::write_if_changed(&o.conf_dir, &o.conflist_name, &bytes) {
            Ok(true) => log::info(&format!(
                "wrote {}: pod CIDRs {}, MTU {mtu}, portmap {}",
                path.display(),
                list(&plan.own_pod_cidrs),
                if portmap { "chained" } else { "not installed" }
            )),
            Ok(false) => {}
            Err(e) => return Err(format!("cannot write {}: {e}", path.display())),
        }
        let shadowed_by = conflist::shadowing(&o.conf_dir, &o.conflist_name);
        if shadowed_by != self.reported.shadowed_by {
            if !shadowed_by.is_empty() {
                log::warn(&format!(
                    "{} sorts after {} in {}: runtimes use the first config by name, so \
                     pods do not get this network",
                    o.conflist_name,
                    shadowed_by.join(", "),
                    o.conf_dir.display()
                ));
            }
            self.reported.shadowed_by = shadowed_by;
        }
        Ok(())
    }

    fn report_skipped(&mut self, plan: &Plan) {
        for (name, why) in &plan.skipped {
            if self.reported.skipped.get(name) != Some(why) {
                log::warn(&format!("node {name} skipped: {why}"));
            }
        }
        for name in self.reported.skipped.keys() {
            if !plan.skipped.contains_key(name) && self.nodes.contains_key(name) {
                log::info(&format!("node {name} is no longer skipped"));
            }
        }
        self.reported.skipped = plan.skipped.clone();
    }

    fn report_routes(&mut self, changes: &routes::RouteChanges) {
        let proto = self.options.route_protocol;
        let summary = |verb: &str, items: Vec<String>| {
            if items.is_empty() {
                return;
            }
            let shown: Vec<&str> = items.iter().take(8).map(String::as_str).collect();
            let more = items.len().saturating_sub(shown.len());
            log::info(&format!(
                "{verb} {} route{} (proto {proto}): {}{}",
                items.len(),
                if items.len() == 1 { "" } else { "s" },
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ));
        };
        summary(
            "added",
            changes
                .added
                .iter()
                .map(|(d, g)| format!("{d} via {g}"))
                .collect(),
        );
        summary(
            "changed",
            changes
                .replaced
                .iter()
                .map(|(d, g)| format!("{d} now via {g}"))
                .collect(),
        );
        summary(
            "removed",
            changes.removed.iter().map(ToString::to_string).collect(),
        );
        let foreign: BTreeMap<IpNetwork, String> = changes.foreign.iter().cloned().collect();
        for (dst, theirs) in &foreign {
            if self.reported.foreign.get(dst) != Some(theirs) {
                log::warn(&format!(
                    "{dst} is already routed by someone else ({theirs}): left alone, no route \
                     of ours added"
                ));
            }
        }
        self.reported.foreign = foreign;
    }
}

fn list(nets: &[IpNetwork]) -> String {
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether the watch failed to start because its resourceVersion is too old.
fn is_gone(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 410)
}

/// A client from `--kubeconfig`, else the usual inference (`$KUBECONFIG`,
/// `~/.kube/config`, then the in-cluster service account).
async fn client(options: &Options) -> Result<Client, String> {
    let config = match &options.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot read kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no Kubernetes API configuration found: {e}"))?,
    };
    log::info(&format!("Kubernetes API at {}", config.cluster_url));
    Client::try_from(config).map_err(|e| format!("cannot make a Kubernetes client: {e}"))
}

/// Runs until SIGTERM or SIGINT; an error only for a setup that cannot work.
pub async fn run(options: Options) -> Result<(), String> {
    log::set_verbose(options.verbose);
    log::info(&format!(
        "cni-node{} starting on node {}",
        cni_build_stamp::STAMP,
        options.node_name
    ));
    let nl = Netlink::connect().map_err(|e| format!("netlink: {e}"))?;
    let egress = crate::egress::open(options.masquerade)?;
    // Alive while the loop turns at least once every few resync intervals.
    let health = Health::new(options.resync * 6 + Duration::from_secs(30));
    if let Some(addr) = options.health_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot serve health checks on {addr}: {e}"))?;
        tokio::spawn(crate::health::serve(listener, Arc::clone(&health)));
    }
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT: {e}"))?;
    let client = client(&options).await?;
    let config = watcher::Config::default().page_size(options.page_size);
    let resync = options.resync;
    let mut agent = Agent::new(options, nl, egress, Arc::clone(&health));
    let watch = || {
        watcher::watcher(Api::<SlimNode>::all(client.clone()), config.clone())
            .default_backoff()
            .boxed()
    };
    let mut stream = watch();
    let mut tick = tokio::time::interval(resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures = 0u64;
    loop {
        tokio::select! {
            biased;
            _ = term.recv() => break,
            _ = int.recv() => break,
            item = stream.next() => {
                let mut item = item;
                let mut dirty = false;
                for _ in 0..BATCH {
                    match item {
                        None => return Err("the Node watch ended".to_owned()),
                        Some(Ok(event)) => {
                            failures = 0;
                            dirty |= agent.on_event(event);
                        }
                        Some(Err(e)) if is_gone(&e) => {
                            // An HTTP 410 to the watch request itself: the client would
                            // retry the same too-old version forever; a new watcher
                            // lists afresh.
                            log::warn(&format!(
                                "the Node watch's resourceVersion expired ({e}); listing again"
                            ));
                            stream = watch();
                            break;
                        }
                        Some(Err(e)) => {
                            failures += 1;
                            // The stream retries by itself, backing off up to 30 s.
                            log::warn(&format!(
                                "Node watch failed ({failures} in a row), retrying; routes \
                                 and rules stay as they are: {e}"
                            ));
                        }
                    }
                    match stream.next().now_or_never() {
                        Some(next) => item = next,
                        None => break,
                    }
                }
                health.beat();
                if dirty {
                    agent.reconcile();
                }
            }
            _ = tick.tick() => {
                health.beat();
                if agent.listed() {
                    agent.reconcile();
                }
            }
        }
    }
    log::info("stopping; routes, rules and the network config stay in place for the pods");
    Ok(())
}
