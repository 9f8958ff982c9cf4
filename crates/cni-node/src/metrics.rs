//! The agent's Prometheus metrics: one registry, `cni_node_` names in base units,
//! `_total` counters, served as text on `/metrics` beside the probes. Every part of
//! the agent that has something to count gets it from here, so what is exported is
//! listed in one place (and in the Kubernetes page of the docs).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::error::{Error, Result};
use crate::policy::datapath::PolicyCounts;
use crate::policy::verdicts::{SharedVerdictNames, VerdictNames, VerdictOrigin};

/// The labels of a metric family: one name, one value.
pub type Label = [(&'static str, &'static str); 1];

/// The reconcile steps, as they appear in `step` labels and in `/readyz`.
pub const STEPS: [&str; 6] = ["host", "conflist", "overlay", "routes", "egress", "policy"];

/// The content type of the text exposition ([`Metrics::encode`]).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric the agent exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<Label, Counter>,
    reconcile_duration: Histogram,
    reconcile_failures: Family<Label, Counter>,
    last_success: Gauge<f64, AtomicU64>,
    watch_restarts: Family<Label, Counter>,
    watch_lists: Family<Label, Counter>,
    watched_objects: Family<Label, Gauge>,
    routes: Family<Label, Gauge>,
    tunnel_peers: Family<Label, Gauge>,
    egress_prefixes: Gauge,
    skipped_nodes: Gauge,
    host_events: Counter,
    verdicts: Arc<VerdictSeries>,
    verdict_source: Mutex<Option<VerdictSource>>,
    deny_log_lines: Counter,
    deny_log_dropped: Family<Label, Counter>,
    policy_isolated: Family<Label, Gauge>,
    policy_profiles: Gauge,
    policy_peer_sets: Gauge,
}

/// The kernel's verdict counters: chain name -> (packets, bytes), or why not.
pub type Counters = std::result::Result<BTreeMap<String, (u64, u64)>, String>;

/// Reads the kernel's verdict counters.
pub type ReadCounters = Box<dyn Fn() -> Counters + Send + Sync>;

/// Where the verdict counters come from at a scrape: the kernel's counters, named by
/// the datapath's last apply.
pub struct VerdictSource {
    /// The chains' names.
    pub names: SharedVerdictNames,
    /// The counters.
    pub read: ReadCounters,
}

impl std::fmt::Debug for VerdictSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerdictSource").finish_non_exhaustive()
    }
}

/// `policy_verdicts_total` as of the last read: one series per verdict chain the
/// datapath named (so per tier, policy or namespace, rule, direction and verdict, never
/// per pod or address).
#[derive(Debug, Default)]
struct VerdictSeries(Mutex<Vec<(VerdictOrigin, u64)>>);

impl Collector for VerdictSeries {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
        let series = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let metric = encoder.encode_descriptor(
            "policy_verdicts",
            "New connections the policy tiers decided, by tier, policy (NetworkPolicy: the \
             local pod's namespace), rule (NetworkPolicy: allow or default-deny), direction \
             and verdict",
            None,
            prometheus_client::metrics::MetricType::Counter,
        );
        let mut metric = metric?;
        for (origin, packets) in series.iter() {
            let labels = [
                ("tier", tier_label(origin)),
                ("policy", origin.policy.as_str()),
                ("rule", origin.rule.as_str()),
                ("direction", origin.direction.as_str()),
                ("verdict", origin.verdict.as_str()),
            ];
            ConstCounter::new(*packets).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// A tier as a label value: `Admin`, `NetworkPolicy`, `Baseline`.
pub fn tier_label(origin: &VerdictOrigin) -> &'static str {
    use crate::policy::pipeline::Tier;
    match origin.tier {
        Tier::Admin => "Admin",
        Tier::NetworkPolicy => "NetworkPolicy",
        Tier::Baseline => "Baseline",
    }
}

/// Why a deny log line was not written, as in `reason` labels.
pub const DENY_LOG_DROP_REASONS: [&str; 2] = ["rate", "overflow"];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric, the label sets that should read 0 before anything
    /// happened already present.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("cni_node");
        let m = Self {
            registry: Registry::default(),
            reconciles: Family::default(),
            // 1 ms to 16 s: a quiet pass takes a few ms, the first at 5,000 nodes ~1 s.
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            reconcile_failures: Family::default(),
            last_success: Gauge::default(),
            watch_restarts: Family::default(),
            watch_lists: Family::default(),
            watched_objects: Family::default(),
            routes: Family::default(),
            tunnel_peers: Family::default(),
            egress_prefixes: Gauge::default(),
            skipped_nodes: Gauge::default(),
            host_events: Counter::default(),
            verdicts: Arc::default(),
            verdict_source: Mutex::new(None),
            deny_log_lines: Counter::default(),
            deny_log_dropped: Family::default(),
            policy_isolated: Family::default(),
            policy_profiles: Gauge::default(),
            policy_peer_sets: Gauge::default(),
        };
        registry.register(
            "reconciles",
            "Reconciliations of the node with the desired state, by result",
            m.reconciles.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "How long one reconciliation took",
            Unit::Seconds,
            m.reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_failures",
            "Failed reconcile steps (host, conflist, overlay, routes, egress, policy); retried \
             with backoff",
            m.reconcile_failures.clone(),
        );
        registry.register_with_unit(
            "last_successful_reconcile_timestamp",
            "When a reconciliation last succeeded in every step (Unix time; time() minus \
             it is the age)",
            Unit::Seconds,
            m.last_success.clone(),
        );
        registry.register(
            "watch_restarts",
            "API watches that failed and were retried or started again, by kind",
            m.watch_restarts.clone(),
        );
        registry.register(
            "watch_lists",
            "Complete lists received (the first and every relist), by kind",
            m.watch_lists.clone(),
        );
        registry.register(
            "watched_objects",
            "Objects in the agent's view, by kind",
            m.watched_objects.clone(),
        );
        registry.register(
            "routes",
            "Routes to other nodes' pod CIDRs the agent owns, by family",
            m.routes.clone(),
        );
        registry.register(
            "tunnel_peers",
            "Other nodes' pod CIDRs reached through the VXLAN overlay (their routes are \
             among the routes), by family",
            m.tunnel_peers.clone(),
        );
        registry.register(
            "egress_prefixes",
            "In-cluster prefixes the egress SNAT rules leave unmasqueraded",
            m.egress_prefixes.clone(),
        );
        registry.register(
            "skipped_nodes",
            "Nodes (or a family of a node) left out of the routes, with a reason in the log",
            m.skipped_nodes.clone(),
        );
        registry.register(
            "host_events",
            "Link, address and route notifications received from this host's kernel",
            m.host_events.clone(),
        );
        registry.register_collector(Box::new(Arc::clone(&m.verdicts)));
        registry.register(
            "policy_deny_log_lines",
            "Lines the deny log (--deny-log) wrote, one per denied new connection",
            m.deny_log_lines.clone(),
        );
        registry.register(
            "policy_deny_log_dropped",
            "Denied connections the deny log did not write, by reason: rate (over \
             --deny-log-rate in the agent), overflow (the kernel's queue to the agent was \
             full: counts the times, not the lines lost)",
            m.deny_log_dropped.clone(),
        );
        for reason in DENY_LOG_DROP_REASONS {
            let _ = m.deny_log_dropped.get_or_create(&[("reason", reason)]);
        }
        registry.register(
            "policy_isolated_addresses",
            "Local pod addresses a NetworkPolicy isolates, by direction",
            m.policy_isolated.clone(),
        );
        registry.register(
            "policy_profiles",
            "Distinct NetworkPolicy profiles (what a set of pods allows) in the kernel",
            m.policy_profiles.clone(),
        );
        registry.register(
            "policy_peer_sets",
            "NetworkPolicy peer sets (the addresses of a selector's pods) that profiles share",
            m.policy_peer_sets.clone(),
        );
        for direction in ["ingress", "egress"] {
            let _ = m.policy_isolated.get_or_create(&[("direction", direction)]);
        }
        for result in ["success", "failure"] {
            let _ = m.reconciles.get_or_create(&[("result", result)]);
        }
        for step in STEPS {
            let _ = m.reconcile_failures.get_or_create(&[("step", step)]);
        }
        for family in ["ipv4", "ipv6"] {
            let _ = m.routes.get_or_create(&[("family", family)]);
            let _ = m.tunnel_peers.get_or_create(&[("family", family)]);
        }
        Self { registry, ..m }
    }

    /// Starts counting a kind: its label sets read 0 until something happens.
    pub fn watching(&self, kind: &'static str) {
        let _ = self.watch_restarts.get_or_create(&[("kind", kind)]);
        let _ = self.watch_lists.get_or_create(&[("kind", kind)]);
        let _ = self.watched_objects.get_or_create(&[("kind", kind)]);
    }

    /// A reconciliation ended after `took`, with these steps failed.
    pub fn reconciled(&self, took: Duration, failed_steps: &[&'static str]) {
        self.reconcile_duration.observe(took.as_secs_f64());
        let result = if failed_steps.is_empty() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.last_success.set(now);
            "success"
        } else {
            "failure"
        };
        self.reconciles.get_or_create(&[("result", result)]).inc();
        for step in failed_steps {
            self.reconcile_failures
                .get_or_create(&[("step", step)])
                .inc();
        }
    }

    /// What the agent owns after a reconciliation.
    pub fn owned(
        &self,
        routes_v4: usize,
        routes_v6: usize,
        egress_prefixes: usize,
        skipped: usize,
    ) {
        self.routes
            .get_or_create(&[("family", "ipv4")])
            .set(gauge(routes_v4));
        self.routes
            .get_or_create(&[("family", "ipv6")])
            .set(gauge(routes_v6));
        self.egress_prefixes.set(gauge(egress_prefixes));
        self.skipped_nodes.set(gauge(skipped));
    }

    /// The encapsulated peers after a reconciliation.
    pub fn tunnels(&self, v4: usize, v6: usize) {
        self.tunnel_peers
            .get_or_create(&[("family", "ipv4")])
            .set(gauge(v4));
        self.tunnel_peers
            .get_or_create(&[("family", "ipv6")])
            .set(gauge(v6));
    }

    /// What the NetworkPolicy table holds after a reconciliation.
    pub fn policy(&self, counts: PolicyCounts) {
        self.policy_isolated
            .get_or_create(&[("direction", "ingress")])
            .set(gauge(counts.ingress));
        self.policy_isolated
            .get_or_create(&[("direction", "egress")])
            .set(gauge(counts.egress));
        self.policy_profiles.set(gauge(counts.profiles));
        self.policy_peer_sets.set(gauge(counts.peer_sets));
    }

    /// A watch of `kind` failed or was started again.
    pub fn watch_restarted(&self, kind: &'static str) {
        self.watch_restarts.get_or_create(&[("kind", kind)]).inc();
    }

    /// A complete list of `kind` arrived.
    pub fn listed(&self, kind: &'static str) {
        let _ = self.watch_lists.get_or_create(&[("kind", kind)]).inc();
    }

    /// The view of `kind` holds `count` objects.
    pub fn objects(&self, kind: &'static str, count: usize) {
        self.watched_objects
            .get_or_create(&[("kind", kind)])
            .set(gauge(count));
    }

    /// `count` notifications came from the host's kernel.
    pub fn host_events(&self, count: usize) {
        self.host_events
            .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
    }

    /// Where `policy_verdicts_total` comes from (without one it has no series).
    pub fn count_verdicts(&self, source: VerdictSource) {
        *self
            .verdict_source
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(source);
    }

    /// Reads the kernel's verdict counters for the next [`Metrics::encode`]: a few
    /// netlink requests, so the caller runs it off the async runtime's workers. A
    /// failed read leaves the last series and says why.
    pub fn refresh_verdicts(&self) -> std::result::Result<(), String> {
        let source = self
            .verdict_source
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(source) = source.as_ref() else {
            return Ok(());
        };
        let counters = (source.read)()?;
        let names = source
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        self.set_verdicts(&names, &counters);
        Ok(())
    }

    /// The verdict series: each counted chain the names know (a chain they do not is
    /// one the datapath is removing), its new connections.
    pub fn set_verdicts(&self, names: &VerdictNames, counters: &BTreeMap<String, (u64, u64)>) {
        let series = counters
            .iter()
            .filter_map(|(chain, (packets, _))| Some((names.origin(chain)?.clone(), *packets)))
            .collect();
        *self
            .verdicts
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = series;
    }

    /// The deny log wrote a line.
    pub fn deny_logged(&self) {
        self.deny_log_lines.inc();
    }

    /// The deny log dropped `count` lines (or overflows) for `reason` (one of
    /// [`DENY_LOG_DROP_REASONS`]).
    pub fn deny_log_dropped(&self, reason: &'static str, count: u64) {
        self.deny_log_dropped
            .get_or_create(&[("reason", reason)])
            .inc_by(count);
    }

    /// The text exposition.
    pub fn encode(&self) -> Result<String> {
        let mut text = String::new();
        encode(&mut text, &self.registry).map_err(Error::Metrics)?;
        Ok(text)
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn names_types_and_preset_series() {
        let m = Metrics::new();
        m.watching("Node");
        let text = m.encode().unwrap();
        for (name, kind) in [
            ("cni_node_reconciles", "counter"),
            ("cni_node_reconcile_duration_seconds", "histogram"),
            ("cni_node_reconcile_failures", "counter"),
            (
                "cni_node_last_successful_reconcile_timestamp_seconds",
                "gauge",
            ),
            ("cni_node_watch_restarts", "counter"),
            ("cni_node_watch_lists", "counter"),
            ("cni_node_watched_objects", "gauge"),
            ("cni_node_routes", "gauge"),
            ("cni_node_egress_prefixes", "gauge"),
            ("cni_node_skipped_nodes", "gauge"),
            ("cni_node_host_events", "counter"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} {kind}:\n{text}"
            );
        }
        for series in [
            "cni_node_reconciles_total{result=\"success\"}",
            "cni_node_reconciles_total{result=\"failure\"}",
            "cni_node_reconcile_failures_total{step=\"conflist\"}",
            "cni_node_watch_lists_total{kind=\"Node\"}",
            "cni_node_watched_objects{kind=\"Node\"}",
            "cni_node_routes{family=\"ipv6\"}",
        ] {
            assert_eq!(value(&text, series), Some(0.0), "{series}:\n{text}");
        }
    }

    fn origin(
        tier: crate::policy::pipeline::Tier,
        policy: &str,
        rule: &str,
        direction: crate::policy::verdicts::Direction,
        verdict: crate::policy::verdicts::Verdict,
    ) -> VerdictOrigin {
        VerdictOrigin {
            tier,
            policy: policy.into(),
            rule: rule.into(),
            direction,
            verdict,
        }
    }

    /// The kernel's counters, joined with the chains' names at a scrape: one series per
    /// named chain, none for a chain the names do not know, the last series kept when a
    /// read fails.
    #[test]
    fn verdict_counters_become_labelled_series() {
        use crate::policy::pipeline::Tier;
        use crate::policy::verdicts::{Direction, Verdict};
        let deny = origin(
            Tier::Admin,
            "deny-metadata",
            "egress[0]",
            Direction::Egress,
            Verdict::Deny,
        );
        let allow = origin(
            Tier::NetworkPolicy,
            "shop",
            "allow",
            Direction::Ingress,
            Verdict::Accept,
        );
        let pass = origin(
            Tier::Baseline,
            "default",
            "dns",
            Direction::Egress,
            Verdict::Pass,
        );
        let names: SharedVerdictNames = Arc::new(Mutex::new(VerdictNames::new([
            deny.clone(),
            allow.clone(),
            pass.clone(),
        ])));
        let counters: Arc<Mutex<Counters>> = Arc::new(Mutex::new(Ok([
            (deny.chain(), (3, 180)),
            (allow.chain(), (7, 420)),
            ("v-000000000000000000000000".to_owned(), (9, 9)),
        ]
        .into())));
        let m = Metrics::new();
        let text = m.encode().unwrap();
        assert!(
            text.contains("# TYPE cni_node_policy_verdicts counter\n"),
            "{text}"
        );
        assert!(!text.contains("cni_node_policy_verdicts_total{"), "{text}");
        m.count_verdicts(VerdictSource {
            names: Arc::clone(&names),
            read: Box::new({
                let counters = Arc::clone(&counters);
                move || counters.lock().unwrap().clone()
            }),
        });
        m.refresh_verdicts().unwrap();
        let text = m.encode().unwrap();
        let deny_series = "cni_node_policy_verdicts_total{tier=\"Admin\",policy=\"deny-metadata\",\
                           rule=\"egress[0]\",direction=\"egress\",verdict=\"deny\"}";
        let allow_series = "cni_node_policy_verdicts_total{tier=\"NetworkPolicy\",policy=\"shop\",\
                            rule=\"allow\",direction=\"ingress\",verdict=\"accept\"}";
        assert_eq!(value(&text, deny_series), Some(3.0), "{text}");
        assert_eq!(value(&text, allow_series), Some(7.0), "{text}");
        assert_eq!(
            text.matches("cni_node_policy_verdicts_total{").count(),
            2,
            "a chain without a name, or a name without a counter, has no series:\n{text}"
        );
        *counters.lock().unwrap() = Err("netlink said no".into());
        assert_eq!(m.refresh_verdicts(), Err("netlink said no".into()));
        assert_eq!(value(&m.encode().unwrap(), deny_series), Some(3.0));
        *counters.lock().unwrap() = Ok([(deny.chain(), (5, 300)), (pass.chain(), (1, 60))].into());
        m.refresh_verdicts().unwrap();
        let text = m.encode().unwrap();
        assert_eq!(value(&text, deny_series), Some(5.0), "{text}");
        assert_eq!(value(&text, allow_series), None, "{text}");
        assert!(
            text.contains("tier=\"Baseline\",policy=\"default\",rule=\"dns\""),
            "{text}"
        );
    }

    #[test]
    fn deny_log_lines_and_drops_are_counted() {
        let m = Metrics::new();
        let text = m.encode().unwrap();
        assert_eq!(
            value(&text, "cni_node_policy_deny_log_lines_total"),
            Some(0.0)
        );
        for reason in DENY_LOG_DROP_REASONS {
            let series = format!("cni_node_policy_deny_log_dropped_total{{reason=\"{reason}\"}}");
            assert_eq!(value(&text, &series), Some(0.0), "{text}");
        }
        m.deny_logged();
        m.deny_logged();
        m.deny_log_dropped("rate", 5);
        let text = m.encode().unwrap();
        assert_eq!(
            value(&text, "cni_node_policy_deny_log_lines_total"),
            Some(2.0)
        );
        assert_eq!(
            value(
                &text,
                "cni_node_policy_deny_log_dropped_total{reason=\"rate\"}"
            ),
            Some(5.0)
        );
    }

    #[test]
    fn counters_and_gauges_move() {
        let m = Metrics::new();
        m.reconciled(Duration::from_millis(3), &[]);
        m.reconciled(Duration::from_millis(5), &["conflist", "egress"]);
        m.listed("Node");
        m.objects("Node", 7);
        m.owned(3, 2, 4, 1);
        m.host_events(5);
        let text = m.encode().unwrap();
        for (series, want) in [
            ("cni_node_reconciles_total{result=\"success\"}", 1.0),
            ("cni_node_reconciles_total{result=\"failure\"}", 1.0),
            ("cni_node_reconcile_failures_total{step=\"conflist\"}", 1.0),
            ("cni_node_reconcile_failures_total{step=\"routes\"}", 0.0),
            ("cni_node_reconcile_duration_seconds_count", 2.0),
            ("cni_node_watch_lists_total{kind=\"Node\"}", 1.0),
            ("cni_node_watched_objects{kind=\"Node\"}", 7.0),
            ("cni_node_routes{family=\"ipv4\"}", 3.0),
            ("cni_node_egress_prefixes", 4.0),
            ("cni_node_skipped_nodes", 1.0),
            ("cni_node_host_events_total", 5.0),
        ] {
            assert_eq!(value(&text, series), Some(want), "{series}:\n{text}");
        }
        let last = value(
            &text,
            "cni_node_last_successful_reconcile_timestamp_seconds",
        );
        assert!(last.is_some_and(|t| t > 1.7e9), "{text}");
    }
}
