//! The agent's parts and how they meet: the API watches fill their stores on the async
//! runtime; the host's kernel notifications arrive on a thread of their own; the
//! reconciler runs on another thread, one pass at a time, woken by either (changes
//! that arrive meanwhile collapse into one more pass), by a retry after a failure, or
//! by the slow resync that repairs what was changed by hand. The probes and metrics,
//! and `explain` on its own socket, are served on the runtime and never wait for a pass.
//! With `--deny-log`, one more thread reads the policy table's log group
//! ([`crate::deny_log`]).
//!
//! Nothing is removed on the word of a broken watch: a store changes only through
//! watch events and complete lists; until the Nodes' first complete list nothing at all
//! is done, and each policy kind leaves its tables alone until its own stores have
//! theirs, so an agent that cannot reach the API leaves the node as it was.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Api;
use kube::runtime::watcher;
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::{EncryptionMode, Options, OverlayMode};
use crate::conflist::ConflistSettings;
use crate::encryption::EncryptionSettings;
use crate::encryption::step::EncryptionEffects;
use crate::error::{Error, Result, chain};
use crate::health::{Health, Readiness};
use crate::host::Host;
use crate::metrics::Metrics;
use crate::node::SlimNode;
use crate::plan::{OverlaySettings, PlanSettings, Settings};
use crate::policy::cluster_network_policy::LOOK_AGAIN_AFTER;
use crate::policy::objects::{SlimClusterNetworkPolicy, SlimNamespace, SlimNetworkPolicy, SlimPod};
use crate::policy::pipeline::PolicyStores;
use crate::reconcile::{ConfDir, Effects, Reconciler};
use crate::store::Stores;
use crate::wake::{Wake, Woken};
use crate::{api, egress, host};

/// The first retry after a failed pass; it doubles up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(250);
/// The longest wait before a failed pass is retried: short enough that the node is
/// ready a few seconds after the cause is gone.
const RETRY_MAX: Duration = Duration::from_secs(4);

/// The settings the plan needs, read once from the options.
pub fn settings(options: &Options) -> Settings {
    Settings {
        plan: PlanSettings {
            node_name: options.node_name.clone(),
            cluster_cidrs: options.cluster_cidrs.clone(),
            no_masquerade: options.no_masquerade.clone(),
            overlay: Some(overlay_settings(options)),
            encryption: encryption_settings(options),
        },
        mtu: options.mtu,
        conflist: ConflistSettings {
            network_name: options.network_name.clone(),
            bridge: options.bridge.clone(),
            ipam_data_dir: options
                .ipam_data_dir
                .as_ref()
                .map(|d| d.to_string_lossy().into_owned()),
            portmap: false,
            bandwidth: false,
            pod_record_dir: options
                .network_policy
                .then(|| options.pod_record_dir.to_string_lossy().into_owned()),
        },
        policy_shared_peer_ranges: usize::try_from(options.policy_shared_peer_ranges).ok(),
        encryption_device: options.wireguard_device.clone(),
    }
}

/// The encryption settings with `--encryption wireguard`, else `None`.
pub fn encryption_settings(options: &Options) -> Option<EncryptionSettings> {
    (options.encryption == EncryptionMode::Wireguard).then(|| EncryptionSettings {
        device: options.wireguard_device.clone(),
        port: options.wireguard_port,
        strict: options.encryption_strict,
        state_dir: options.state_dir.clone(),
    })
}

/// The overlay's settings (with `--overlay off` not enabled: the agent still knows
/// its devices, to delete them).
pub fn overlay_settings(options: &Options) -> OverlaySettings {
    OverlaySettings {
        enabled: options.overlay == OverlayMode::Vxlan,
        vni: options.vxlan_vni,
        port: options.vxlan_port,
        device_prefix: options.vxlan_device.clone(),
    }
}

/// The reconciler's loop, until [`Wake::stop`]: a pass whenever something changed, a
/// failed pass retried with backoff, a pass every `resync` regardless.
pub fn reconcile_loop(
    mut reconciler: Reconciler,
    stores: &Stores,
    wake: &Wake,
    health: &Health,
    metrics: &Metrics,
    resync: Duration,
) {
    let mut retry = RETRY_MIN;
    let mut retry_at: Option<Instant> = None;
    let mut next_resync = Instant::now() + resync;
    loop {
        health.beat();
        let deadline = retry_at.map_or(next_resync, |r| r.min(next_resync));
        if wake.wait_until(deadline) == Woken::Stop {
            return;
        }
        health.beat();
        let now = Instant::now();
        let full = now >= next_resync;
        if full {
            next_resync = now + resync;
        }
        let Some(snapshot) = stores.snapshot() else {
            health.set(Readiness::WaitingForList);
            continue;
        };
        let outcome = reconciler.reconcile(&snapshot, full);
        let failed = outcome.failed_steps();
        metrics.reconciled(now.elapsed(), &failed);
        let (v4, v6) = outcome.routes;
        metrics.owned(v4, v6, outcome.egress_prefixes, outcome.skipped);
        metrics.tunnels(outcome.tunnels.0, outcome.tunnels.1);
        metrics.policy(outcome.policy);
        metrics.encryption(outcome.encrypted, &outcome.encryption);
        let mut not_ready: Vec<(&'static str, String)> = outcome
            .failures
            .iter()
            .map(|(step, e)| (*step, chain(e)))
            .collect();
        not_ready.extend(outcome.waiting.iter().cloned());
        health.set(if not_ready.is_empty() {
            Readiness::Ready
        } else {
            Readiness::NotReady(not_ready)
        });
        if failed.is_empty() {
            retry = RETRY_MIN;
            retry_at = None;
        } else {
            retry_at = Some(Instant::now() + retry);
            retry = (retry * 2).min(RETRY_MAX);
        }
    }
}

/// Runs until SIGTERM or SIGINT; an error only for a setup that cannot work.
pub async fn run(options: Options) -> Result<()> {
    tracing::info!(
        "cni-node{} starting on node {}",
        cni_build_stamp::STAMP,
        options.node_name
    );
    let nl = cni_linux::Netlink::connect().map_err(Error::Netlink)?;
    let egress = egress::open(options.masquerade)?;
    let metrics = Arc::new(Metrics::new());
    let records_dir = options
        .network_policy
        .then(|| options.pod_record_dir.clone());
    let stores = Arc::new(Stores {
        policy: PolicyStores::enforcing(options.network_policy),
        records_dir: records_dir.clone(),
        ..Stores::default()
    });
    // Alive while the reconciler turns at least once every few resync intervals.
    let health = Health::new(options.resync * 6 + Duration::from_secs(30));
    if let Some(addr) = options.health_addr.0 {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Listen { addr, source })?;
        tokio::spawn(crate::health::serve(
            listener,
            Arc::clone(&health),
            Arc::clone(&metrics),
            Arc::clone(&stores),
        ));
    }
    // Held to the end of this function: a clean stop removes the socket.
    let explain_socket = match &options.explain_socket.0 {
        Some(path) => {
            let (listener, file) = crate::explain_socket::bind(path).await?;
            tokio::spawn(crate::explain_socket::serve(
                listener,
                file.owner(),
                Arc::clone(&stores),
            ));
            tracing::info!("explain is answered on {}", file.path().display());
            Some(file)
        }
        None => None,
    };
    let mut term = signal(SignalKind::terminate()).map_err(|source| Error::Signal {
        signal: "SIGTERM",
        source,
    })?;
    let mut int = signal(SignalKind::interrupt()).map_err(|source| Error::Signal {
        signal: "SIGINT",
        source,
    })?;
    let connections = Arc::new(api::Connections::default());
    let client = api::client(options.kubeconfig.as_deref(), &connections).await?;

    let wake = Arc::new(Wake::default());
    let entries_watch = Arc::new(host::EntriesWatch::default());
    host::notify_changes(
        Arc::clone(&wake),
        Arc::clone(&metrics),
        options.route_protocol,
        Arc::clone(&entries_watch),
        move |removed| {
            let severed = connections.sever(removed);
            if severed > 0 {
                tracing::info!(
                    "this host lost the address {removed}: {severed} API connection(s) made \
                     from it ended, to be made again from another"
                );
            }
        },
    )?;
    if options.network_policy {
        host::notify_records(&options.pod_record_dir, Arc::clone(&wake))?;
    }
    let encryption = encryption_settings(&options);
    let peers_watch = Arc::new(crate::encryption::watch::PeersWatch::default());
    if let Some(settings) = &encryption {
        // `cni-node rotate-key` replaces the key file: the agent hears it at once.
        host::notify_key_dir(&settings.state_dir, Arc::clone(&wake))?;
        crate::encryption::watch::watch_peers(
            settings.device.clone(),
            Arc::clone(&peers_watch),
            Arc::clone(&wake),
        )?;
        tracing::info!(
            "encryption: WireGuard on {} (port {}){}, key in {}",
            settings.device,
            settings.port,
            if settings.strict { ", strict" } else { "" },
            crate::encryption::key::path(&settings.state_dir).display()
        );
    }
    let reconciler = Reconciler::new(
        settings(&options),
        options.route_protocol,
        Effects {
            host: Box::new(Host {
                nl,
                protocol: options.route_protocol,
                bin_dir: options.bin_dir.clone(),
                overlay_names: {
                    let overlay = overlay_settings(&options);
                    vec![
                        overlay.device_name(false),
                        overlay.device_name(true),
                        options.wireguard_device.clone(),
                    ]
                },
                records_dir,
            }),
            config: Box::new(ConfDir {
                dir: options.conf_dir.clone(),
                name: options.conflist_name.clone(),
            }),
            routes: Box::new(cni_linux::Netlink::connect().map_err(Error::Netlink)?),
            devices: Box::new(cni_linux::Netlink::connect().map_err(Error::Netlink)?),
            egress,
            policy: if options.network_policy {
                Some(Box::new(
                    crate::policy::datapath::Table::open()?
                        .with_verdict_names(Arc::clone(&stores.verdict_names))
                        .with_deny_log(options.deny_log_settings().map(|s| {
                            cni_firewall::network_policy::DenyLog {
                                group: s.group,
                                per_second: s.per_second,
                            }
                        })),
                ))
            } else {
                None
            },
            encryption: Some(EncryptionEffects {
                kernel: match &encryption {
                    Some(_) => Some(crate::encryption::device::open_kernel()?),
                    None => None,
                },
                publisher: Box::new(crate::encryption::annotation::ApiPublisher {
                    client: client.clone(),
                    runtime: tokio::runtime::Handle::current(),
                }),
                strict: Box::new(crate::encryption::strict::Table),
            }),
        },
    )
    .with_entries_watch(entries_watch)
    .with_peers_watch(peers_watch)
    .with_live_nodes(Arc::clone(&stores.nodes));
    if options.network_policy {
        metrics.count_verdicts(crate::metrics::VerdictSource {
            names: Arc::clone(&stores.verdict_names),
            read: Box::new(|| {
                cni_firewall::network_policy::read_verdict_counters().map_err(|e| chain(&e))
            }),
        });
    }
    if options.deny_log && !options.network_policy {
        tracing::warn!(
            "--deny-log has nothing to log: no policy is enforced (--network-policy=false)"
        );
    }
    // Told to stop at a clean stop, as the reconciler is (it ends within a second).
    let deny_log_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(settings) = options.deny_log_settings() {
        crate::deny_log::start(crate::deny_log::Reader {
            settings,
            names: Arc::clone(&stores.verdict_names),
            pods: Arc::clone(&stores.policy.pods),
            records_dir: Some(options.pod_record_dir.clone()),
            metrics: Arc::clone(&metrics),
            emit: Box::new(crate::deny_log::emit),
            stop: Arc::clone(&deny_log_stop),
        })?;
    }
    let reconciler_thread = {
        let (stores, wake, health, metrics) = (
            Arc::clone(&stores),
            Arc::clone(&wake),
            Arc::clone(&health),
            Arc::clone(&metrics),
        );
        let resync = options.resync;
        std::thread::Builder::new()
            .name("reconciler".into())
            .spawn(move || reconcile_loop(reconciler, &stores, &wake, &health, &metrics, resync))
            .map_err(|source| Error::Thread {
                name: "reconciler",
                source,
            })?
    };

    let config = watcher::Config::default().page_size(options.page_size);
    let mut watches = vec![tokio::spawn(api::watch(
        Api::<SlimNode>::all(client.clone()),
        config.clone(),
        Arc::clone(&stores.nodes),
        Arc::clone(&wake),
        Arc::clone(&metrics),
    ))];
    if let Some(own) = &stores.policy.network_policy {
        watches.push(tokio::spawn(api::watch(
            Api::<SlimNamespace>::all(client.clone()),
            config.clone(),
            Arc::clone(&stores.policy.namespaces),
            Arc::clone(&wake),
            Arc::clone(&metrics),
        )));
        watches.push(tokio::spawn(api::watch(
            Api::<SlimNetworkPolicy>::all(client.clone()),
            config.clone(),
            Arc::clone(&own.policies),
            Arc::clone(&wake),
            Arc::clone(&metrics),
        )));
        if let Some(cluster) = &stores.policy.cluster_network_policy {
            watches.push(tokio::spawn(api::watch_optional(
                Api::<SlimClusterNetworkPolicy>::all(client.clone()),
                config.clone(),
                Arc::clone(&cluster.policies),
                Arc::clone(&wake),
                Arc::clone(&metrics),
                Arc::clone(&cluster.served),
                LOOK_AGAIN_AFTER,
            )));
        }
        watches.push(tokio::spawn(api::watch(
            Api::<SlimPod>::all(client),
            config,
            Arc::clone(&stores.policy.pods),
            Arc::clone(&wake),
            Arc::clone(&metrics),
        )));
    }

    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("stopping; routes, rules and the network config stay in place for the pods");
    for watch in watches {
        watch.abort();
    }
    wake.stop();
    deny_log_stop.store(true, std::sync::atomic::Ordering::SeqCst);
    // A pass in progress ends on its own (each step is one netlink request, one file
    // rename or one firewall transaction); the thread is not cut off mid-step.
    let _ = tokio::task::spawn_blocking(move || reconciler_thread.join()).await;
    drop(explain_socket);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{HostReader, HostState};
    use crate::reconcile::ConfigDir;
    use crate::routes::RouteTable;
    use kube::runtime::watcher::Event;
    use std::io;
    use std::path::PathBuf;
    use std::sync::Mutex;

    struct Quiet;
    impl HostReader for Quiet {
        fn read(&self, _entries: bool) -> Result<HostState> {
            Ok(HostState::default())
        }
    }
    impl RouteTable for Quiet {
        fn apply(
            &self,
            changes: &[cni_linux::Change],
        ) -> cni_linux::Result<Vec<cni_linux::Result<()>>> {
            Ok(changes.iter().map(|_| Ok(())).collect())
        }
    }
    /// A config dir that refuses writes while `refuse` is set.
    struct Dir(Arc<Mutex<bool>>);
    impl ConfigDir for Dir {
        fn write_if_changed(&self, _: &[u8]) -> io::Result<bool> {
            if *self.0.lock().unwrap() {
                Err(io::Error::from_raw_os_error(13))
            } else {
                Ok(true)
            }
        }
        fn shadowing(&self) -> Vec<String> {
            Vec::new()
        }
        fn path(&self) -> PathBuf {
            PathBuf::from("/conf/10-x.conflist")
        }
    }

    fn node_event(name: &str, cidr: &str) -> SlimNode {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"podCIDRs": [cidr]},
        }))
        .unwrap()
    }

    fn wait_for(health: &Health, want: impl Fn(&Readiness) -> bool) -> Readiness {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = health.readiness();
            if want(&now) || Instant::now() > deadline {
                return now;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The loop with fakes: waits for a complete list, reports a failing step, retries
    /// it without a resync tick, and becomes ready once the step can succeed.
    /// The reconcile loop on its own thread, as the agent runs it, with a resync far away
    /// (whatever a test sees is the wake or the retry), and what a test drives it with.
    struct Running {
        stores: Arc<Stores>,
        wake: Arc<Wake>,
        health: Arc<Health>,
        metrics: Arc<Metrics>,
        thread: std::thread::JoinHandle<()>,
    }

    fn run_loop(reconciler: Reconciler, stores: Stores) -> Running {
        let stores = Arc::new(stores);
        let wake = Arc::new(Wake::default());
        let health = Health::new(Duration::from_secs(60));
        let metrics = Arc::new(Metrics::new());
        let thread = {
            let (stores, wake, health, metrics) = (
                Arc::clone(&stores),
                Arc::clone(&wake),
                Arc::clone(&health),
                Arc::clone(&metrics),
            );
            std::thread::spawn(move || {
                reconcile_loop(
                    reconciler,
                    &stores,
                    &wake,
                    &health,
                    &metrics,
                    Duration::from_secs(3600),
                );
            })
        };
        Running {
            stores,
            wake,
            health,
            metrics,
            thread,
        }
    }

    /// A reconciler for node `n1` on a host that holds nothing, whose conflist writes
    /// fail while `refuse` holds, with `policy` as its policy tables.
    fn quiet_reconciler(
        refuse: &Arc<Mutex<bool>>,
        policy: Option<Box<dyn crate::policy::datapath::PolicyDatapath>>,
    ) -> Reconciler {
        Reconciler::new(
            Settings {
                plan: PlanSettings {
                    node_name: "n1".into(),
                    ..PlanSettings::default()
                },
                ..Settings::default()
            },
            77,
            Effects {
                host: Box::new(Quiet),
                config: Box::new(Dir(Arc::clone(refuse))),
                routes: Box::new(Quiet),
                devices: Box::new(crate::overlay::fakes::NoDevices),
                egress: None,
                policy,
                encryption: None,
            },
        )
    }

    /// The Nodes store complete with one node, `n1`.
    fn list_one_node(stores: &Stores) {
        let mut nodes = stores.nodes.lock().unwrap();
        nodes.apply(Event::Init);
        nodes.apply(Event::InitApply(node_event("n1", "10.244.1.0/24")));
        nodes.apply(Event::InitDone);
    }

    #[test]
    fn the_loop_waits_for_a_list_retries_failures_and_then_is_ready() {
        let refuse = Arc::new(Mutex::new(true));
        let reconciler = quiet_reconciler(&refuse, None);
        let Running {
            stores,
            wake,
            health,
            metrics,
            thread,
        } = run_loop(reconciler, Stores::default());
        // A change before any complete list does nothing.
        wake.notify();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(health.readiness(), Readiness::WaitingForList);

        list_one_node(&stores);
        wake.notify();
        let failing = wait_for(&health, |r| matches!(r, Readiness::NotReady(_)));
        let Readiness::NotReady(failures) = failing else {
            panic!("{failing:?}");
        };
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].0, "conflist");
        assert!(
            failures[0]
                .1
                .starts_with("cannot write /conf/10-x.conflist: "),
            "{failures:?}"
        );
        // The cause goes away; no event, no tick: the retry alone makes it ready.
        *refuse.lock().unwrap() = false;
        assert_eq!(
            wait_for(&health, |r| *r == Readiness::Ready),
            Readiness::Ready
        );
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("cni_node_reconcile_failures_total{step=\"conflist\"} "),
            "{text}"
        );
        wake.stop();
        thread.join().unwrap();
    }

    /// Records what the policy tables were asked to hold.
    struct Tables(Arc<Mutex<Vec<crate::policy::datapath::PolicyCounts>>>);
    impl crate::policy::datapath::PolicyDatapath for Tables {
        fn apply(&mut self, want: crate::policy::pipeline::Pipeline) -> Result<bool> {
            self.0.lock().unwrap().push(want.counts());
            Ok(true)
        }
        fn reload(&mut self) -> Result<()> {
            Ok(())
        }
    }

    fn complete<K: crate::store::Watched>(store: &Mutex<crate::store::Store<K>>) {
        let mut store = store.lock().unwrap();
        store.apply(Event::Init);
        store.apply(Event::InitDone);
    }

    /// A policy kind whose store never completes (its API not served, say) holds back
    /// neither the conflist nor the routes: they are written, `/readyz` names what the
    /// policy step waits for, and the tables are not touched until the view is whole.
    #[test]
    fn a_policy_kind_that_is_not_complete_holds_back_nothing_else() {
        let applied = Arc::new(Mutex::new(Vec::new()));
        let refuse = Arc::new(Mutex::new(false));
        let reconciler = quiet_reconciler(&refuse, Some(Box::new(Tables(Arc::clone(&applied)))));
        let Running {
            stores,
            wake,
            health,
            thread,
            ..
        } = run_loop(
            reconciler,
            Stores {
                policy: PolicyStores::enforcing(true),
                ..Stores::default()
            },
        );
        list_one_node(&stores);
        // Pods and Namespaces are listed; NetworkPolicies never are.
        complete(&stores.policy.pods);
        complete(&stores.policy.namespaces);
        wake.notify();
        let waiting = wait_for(&health, |r| matches!(r, Readiness::NotReady(_)));
        assert_eq!(
            waiting,
            Readiness::NotReady(vec![(
                "policy",
                crate::policy::network_policy::WAITING.to_owned()
            )]),
            "the conflist was written (no conflist failure), only policy waits"
        );
        assert!(
            applied.lock().unwrap().is_empty(),
            "the tables were touched"
        );

        complete(&stores.policy.network_policy.as_ref().unwrap().policies);
        wake.notify();
        assert_eq!(
            wait_for(&health, |r| *r == Readiness::Ready),
            Readiness::Ready
        );
        assert!(
            !applied.lock().unwrap().is_empty(),
            "the tables were never applied"
        );
        wake.stop();
        thread.join().unwrap();
    }
}
