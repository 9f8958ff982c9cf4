//! Churn soak of the node agent: the API test server holds a small cluster (Nodes,
//! labelled Namespaces, Pods, NetworkPolicies) and one `cni-node` enforces it on node
//! `soak-0`, in a namespace with its own bridge, while the test changes the cluster
//! without pause: pods added on the agent's node and on others, relabelled and deleted,
//! NetworkPolicies added and deleted, namespaces' labels flipped, nodes added and
//! deleted. Each object lives a few rounds, so the agent always holds some that are
//! about to go.
//!
//! Every few seconds the test samples the agent: its RSS (`VmRSS`, `VmHWM`), open
//! files (`/proc/<pid>/fd`), threads, the element counts of `inet cni_node_policy`, its
//! routes (`proto 77`) and its own `/metrics` gauges. At checkpoints (six over the
//! run, the last at its end) it deletes every churned object, puts every label back
//! and waits for the agent's state to come back to the baseline, taken after the
//! initial sync of the same cluster: every set and map element, rule, chain and route,
//! and every gauge.
//!
//! Asserted (correctness): every checkpoint's state becomes the baseline again, and at
//! the end nothing is left for an object that is gone. The figures (growth of RSS, open
//! files and threads from the first third of the run to the last, time to come back at
//! the checkpoints) are printed as one `agent-soak key=value...` line, never asserted:
//! `tests/bench/agent-soak.sh` judges them against `[agent_soak.*]` of
//! `tests/bench/targets.toml`, and runs this for an hour.
//!
//! `CNI_RS_SOAK_SECONDS` (default 20) is the churn's duration; `CNI_NODE_BIN` picks the
//! agent (the benchmark's static release build); `CNI_RS_SOAK_AGENT_LOG` keeps a copy
//! of its log, `CNI_RS_SOAK_SAMPLES` a table of the samples.

use std::collections::{BTreeMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cni_blackbox::measured::{peak_rss_kib, process_status};
use cni_blackbox::underlay::lone_node;
use cni_blackbox::{Netns, TempDir, plugin_path, probe, require_root};
use cni_kube_api::{ApiServer, network_policy, realistic_namespace, realistic_node, realistic_pod};
use serde_json::{Value, json};

const TABLE: &str = "cni_node_policy";
const HEALTH_ADDR: &str = "127.0.0.1:9743";
const GATEWAY: &str = "10.100.0.1";
/// Nodes of the steady cluster; the agent runs as the first.
const NODES: u32 = 20;
const NAMESPACES: u32 = 10;
const ENVS: [&str; 3] = ["prod", "staging", "dev"];
/// How many rounds a churned object lives.
const LIFETIME: u64 = 4;
/// Between two changes served.
const GAP: Duration = Duration::from_millis(10);
const CHECKPOINTS: u32 = 6;
/// Bound of a checkpoint's wait for the baseline: a generous "it happened at all".
const SETTLE: Duration = Duration::from_secs(60);

fn node_name(n: u32) -> String {
    format!("soak-{n}")
}

fn ns_name(j: u32) -> String {
    format!("soak-ns-{j}")
}

fn node_object(name: &str, cidr: &str, ip: &str) -> Value {
    realistic_node(name, &[cidr], &[ip], 10)
}

fn steady_node(n: u32) -> Value {
    let ip = if n == 0 {
        "100.64.0.1".to_owned()
    } else {
        format!("100.64.1.{n}")
    };
    node_object(&node_name(n), &format!("10.100.{n}.0/24"), &ip)
}

fn namespace_object(j: u32, env: &str) -> Value {
    realistic_namespace(
        &ns_name(j),
        &[("team", &format!("team-{}", j % 3)), ("env", env)],
    )
}

fn steady_env(j: u32) -> &'static str {
    ENVS[(j % 3) as usize]
}

/// Pod `slot` of node `n` (slots 0-99 steady, 100-199 churned): namespace, labels,
/// address `10.100.<n>.<slot + 2>`.
fn pod_object(n: u32, slot: u32, name: &str, tier: &str) -> Value {
    let ip = Ipv4Addr::new(
        10,
        100,
        u8::try_from(n).unwrap_or(u8::MAX),
        u8::try_from(slot + 2).unwrap_or(u8::MAX),
    );
    realistic_pod(
        &ns_name(slot % NAMESPACES),
        name,
        &node_name(n),
        &[&ip.to_string()],
        &[("app", &format!("app-{}", slot % 3)), ("tier", tier)],
    )
}

fn steady_pod(n: u32, slot: u32) -> Value {
    pod_object(
        n,
        slot,
        &format!("app-{}-7d9c6b5f4-{n:02}{slot:02}", slot % 3),
        ["web", "api", "db"][(slot % 3) as usize],
    )
}

/// The steady policies of namespace `j`: ingress from other namespaces by label, from
/// pods by label to a named port, an `ipBlock`, and egress isolation for one tier.
fn steady_policies(j: u32) -> Vec<Value> {
    let ns = ns_name(j);
    vec![
        network_policy(
            &ns,
            "from-prod",
            json!({
                "podSelector": {"matchLabels": {"tier": "web"}},
                "policyTypes": ["Ingress"],
                "ingress": [{
                    "from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}}}],
                    "ports": [{"protocol": "TCP", "port": "http"}],
                }],
            }),
        ),
        network_policy(
            &ns,
            "api-from-web",
            json!({
                "podSelector": {"matchLabels": {"tier": "api"}},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"from": [{"podSelector": {"matchLabels": {"tier": "web"}}}],
                     "ports": [{"protocol": "TCP", "port": 8080, "endPort": 8090}]},
                    {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": [format!("10.{}.0.0/16", 50 + j)]}}]},
                ],
            }),
        ),
        network_policy(
            &ns,
            "db-egress",
            json!({
                "podSelector": {"matchLabels": {"tier": "db"}},
                "policyTypes": ["Egress"],
                "egress": [{
                    "to": [{"namespaceSelector": {"matchExpressions": [
                        {"key": "env", "operator": "NotIn", "values": ["dev"]},
                    ]}}],
                    "ports": [{"protocol": "TCP", "port": 5432}],
                }],
            }),
        ),
    ]
}

/// The churned policy of round `r`: selects one app of a namespace and allows a /32
/// (`172.16.x.y`, which nothing else names) and one app of any namespace.
fn churn_policy(r: u64) -> (String, String, Value) {
    let j = u32::try_from(r % u64::from(NAMESPACES)).unwrap_or(0);
    let name = format!("churn-{r}");
    let from = Ipv4Addr::new(172, 16, ((r >> 8) & 255) as u8, (r & 255) as u8);
    let types = if r.is_multiple_of(2) {
        json!(["Ingress"])
    } else {
        json!(["Ingress", "Egress"])
    };
    let object = network_policy(
        &ns_name(j),
        &name,
        json!({
            "podSelector": {"matchLabels": {"app": format!("app-{}", r % 3)}},
            "policyTypes": types,
            "ingress": [{
                "from": [
                    {"ipBlock": {"cidr": format!("{from}/32")}},
                    {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": format!("app-{}", (r + 1) % 3)}}},
                ],
                "ports": [{"protocol": "TCP", "port": 10_000 + (r % 1000)}],
            }],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"tier": "api"}}}]}],
        }),
    );
    (ns_name(j), name, object)
}

/// What one round added, deleted `LIFETIME` rounds later.
struct Churned {
    pods: Vec<(String, String)>,
    policy: (String, String),
    node: String,
}

/// A running agent; killed and reaped on drop.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One sample of the agent's process.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    rss_kib: u64,
    fds: usize,
    threads: u64,
    elements: usize,
    routes: usize,
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// The agent's state as it can be compared between two moments of the same cluster:
/// the policy table (per set and map its sorted elements, per chain its rules, without
/// handles or counters), its routes, and its gauges.
#[derive(Debug, Clone, PartialEq, Default)]
struct State {
    table: BTreeMap<String, Vec<String>>,
    routes: Vec<String>,
    gauges: BTreeMap<String, String>,
}

impl State {
    fn read(ns: &Netns) -> Self {
        let mut routes: Vec<String> = ns
            .exec_ok(&["ip", "-4", "route", "show", "proto", "77"])
            .lines()
            .map(str::to_owned)
            .collect();
        routes.sort();
        Self {
            table: table_entries(ns),
            routes,
            gauges: gauges(ns),
        }
    }

    /// Set and map elements in the table.
    fn elements(&self) -> usize {
        self.table
            .iter()
            .filter(|(k, _)| k.starts_with("set ") || k.starts_with("map "))
            .map(|(_, v)| v.len())
            .sum()
    }

    /// Entries here that `other` lacks: elements, rules, chains, sets, routes.
    fn entries_not_in(&self, other: &Self) -> Vec<String> {
        let mut extra = Vec::new();
        for (name, entries) in &self.table {
            let theirs = other.table.get(name);
            for e in entries {
                if !theirs.is_some_and(|t| t.contains(e)) {
                    extra.push(format!("{name}: {e}"));
                }
            }
            if theirs.is_none() && entries.is_empty() {
                extra.push(name.clone());
            }
        }
        for r in &self.routes {
            if !other.routes.contains(r) {
                extra.push(format!("route {r}"));
            }
        }
        extra
    }
}

/// Drops what says nothing about the state: handles and packet counters.
fn normalized(mut v: Value) -> Value {
    match &mut v {
        Value::Object(map) => {
            map.remove("handle");
            if map.contains_key("counter") {
                map.insert("counter".into(), Value::Null);
            }
            for value in map.values_mut() {
                *value = normalized(value.take());
            }
        }
        Value::Array(list) => {
            for value in list.iter_mut() {
                *value = normalized(value.take());
            }
        }
        _ => {}
    }
    v
}

fn table_entries(ns: &Netns) -> BTreeMap<String, Vec<String>> {
    let out = ns.exec(&["nft", "-j", "list", "table", "inet", TABLE]);
    let mut entries: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if !out.status.success() {
        return entries;
    }
    let listed: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("nft -j list table: {e}"));
    for item in listed["nftables"].as_array().into_iter().flatten() {
        for kind in ["set", "map"] {
            if let Some(set) = item.get(kind) {
                let name = format!("{kind} {}", set["name"].as_str().unwrap_or_default());
                let mut elements: Vec<String> = set["elem"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| normalized(e.clone()).to_string())
                    .collect();
                elements.sort();
                entries.insert(name, elements);
            }
        }
        if let Some(chain) = item.get("chain") {
            let name = format!("chain {}", chain["name"].as_str().unwrap_or_default());
            entries.entry(name).or_default();
        }
        if let Some(rule) = item.get("rule") {
            let name = format!("chain {}", rule["chain"].as_str().unwrap_or_default());
            let expr = normalized(rule["expr"].clone()).to_string();
            entries.entry(name).or_default().push(expr);
        }
    }
    entries
}

/// The agent's gauges (`cni_node_*` without `_total`, `_seconds` or a histogram's
/// buckets), by name and labels.
fn gauges(ns: &Netns) -> BTreeMap<String, String> {
    let Ok(addr) = HEALTH_ADDR.parse::<SocketAddr>() else {
        return BTreeMap::new();
    };
    let Ok(answer) = probe::get(ns.path(), addr, "/metrics", Duration::from_secs(5)) else {
        return BTreeMap::new();
    };
    answer
        .body
        .lines()
        .filter(|l| l.starts_with("cni_node_"))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(name, _)| {
            !name.contains("_total") && !name.contains("_seconds") && !name.contains("host_events")
        })
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// `cni_node_reconciles_total{result="failure"}`, 0 if the agent does not say.
fn reconcile_failures(ns: &Netns) -> u64 {
    let Ok(addr) = HEALTH_ADDR.parse::<SocketAddr>() else {
        return 0;
    };
    probe::get(ns.path(), addr, "/metrics", Duration::from_secs(5))
        .ok()
        .and_then(|a| {
            a.body.lines().find_map(|l| {
                l.strip_prefix("cni_node_reconciles_total{result=\"failure\"} ")
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
        })
        .map_or(0, |v| v as u64)
}

/// Waits until the agent's state is `want`; how long that took, or the last state seen.
fn settle(ns: &Netns, want: &State) -> Result<Duration, State> {
    let start = Instant::now();
    loop {
        let now = State::read(ns);
        if now == *want {
            return Ok(start.elapsed());
        }
        if start.elapsed() > SETTLE {
            return Err(now);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until two reads a second apart agree and the agent holds every steady route.
fn stable_state(ns: &Netns, log: &Path) -> State {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = State::default();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = State::read(ns);
        if now == last && now.routes.len() == (NODES - 1) as usize && !now.table.is_empty() {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the agent's state did not settle within 120 s; log:\n{}",
            log_of(log)
        );
        last = now;
    }
}

fn log_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

fn node_netns(prefix: &str) -> Netns {
    let ns = lone_node(prefix);
    ns.exec_ok(&["ip", "link", "add", "cni0", "type", "bridge"]);
    ns.exec_ok(&["ip", "addr", "add", &format!("{GATEWAY}/24"), "dev", "cni0"]);
    ns.exec_ok(&["ip", "link", "set", "cni0", "up"]);
    ns
}

/// The least and the most of `f` over the samples in `[from, to)` of the run.
fn span(
    samples: &[Sample],
    from: Duration,
    to: Duration,
    f: impl Fn(&Sample) -> u64,
) -> (u64, u64) {
    let values: Vec<u64> = samples
        .iter()
        .filter(|s| s.at >= from && s.at < to)
        .map(f)
        .collect();
    (
        values.iter().min().copied().unwrap_or_default(),
        values.iter().max().copied().unwrap_or_default(),
    )
}

/// Writes the samples as a table with a header, for the record.
fn write_samples(path: &std::ffi::OsStr, samples: &[Sample]) {
    let mut text = String::from("seconds\trss_kib\tfds\tthreads\telements\troutes\n");
    for s in samples {
        text.push_str(&format!(
            "{:.1}\t{}\t{}\t{}\t{}\t{}\n",
            s.at.as_secs_f64(),
            s.rss_kib,
            s.fds,
            s.threads,
            s.elements,
            s.routes
        ));
    }
    let _ = std::fs::write(path, text);
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, told in order
fn the_agent_stays_flat_under_churn() {
    if !require_root() {
        return;
    }
    let seconds: u64 = std::env::var("CNI_RS_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
        .clamp(6, 86_400);
    let duration = Duration::from_secs(seconds);
    let sample_every = Duration::from_millis((seconds * 1000 / 120).clamp(500, 10_000));
    let agent_bin =
        std::env::var_os("CNI_NODE_BIN").map_or_else(|| plugin_path("cni-node"), Into::into);

    let dir = TempDir::new("cnibb-soak");
    std::fs::create_dir_all(dir.path().join("pods")).unwrap_or_else(|e| panic!("{e}"));
    let ns = node_netns("cnibb-soak");
    let api = ApiServer::start_in_netns(
        ns.path(),
        "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
    );
    for n in 0..NODES {
        api.apply_node(steady_node(n));
    }
    for j in 0..NAMESPACES {
        api.apply_namespace(namespace_object(j, steady_env(j)));
        for policy in steady_policies(j) {
            api.apply_network_policy(policy);
        }
    }
    for n in 0..NODES {
        for slot in 0..NAMESPACES {
            api.apply_pod(steady_pod(n, slot));
        }
    }
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let log = dir.path().join("agent.log");
    let child = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(&agent_bin)
        .arg(format!("--node-name={}", node_name(0)))
        .arg("--masquerade-backend=nftables")
        .arg(format!("--health-addr={HEALTH_ADDR}"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--cni-conf-dir={}",
            dir.path().join("net.d").display()
        ))
        .arg(format!("--cni-bin-dir={}", dir.path().display()))
        .arg(format!(
            "--pod-record-dir={}",
            dir.path().join("pods").display()
        ))
        .arg(format!(
            "--explain-socket={}",
            dir.path().join("explain.sock").display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}")))
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", agent_bin.display()));
    let agent = Agent(child);
    let pid = agent.0.id();

    let baseline = stable_state(&ns, &log);
    assert!(
        baseline.elements() > 0,
        "the steady policies isolate nothing: {baseline:?}"
    );
    let failures_before = reconcile_failures(&ns);

    let mut samples: Vec<Sample> = Vec::new();
    let mut live: VecDeque<Churned> = VecDeque::new();
    let mut envs: Vec<&str> = (0..NAMESPACES).map(steady_env).collect();
    let mut changes = 0u64;
    let mut rounds = 0u64;
    let mut settle_times: Vec<Duration> = Vec::new();
    let mut mismatches: Vec<String> = Vec::new();
    let start = Instant::now();
    let mut next_sample = start;
    let mut checkpoint = 1;
    let serve = |changes: &mut u64| {
        *changes += 1;
        std::thread::sleep(GAP);
    };
    loop {
        let now = Instant::now();
        if now >= next_sample {
            let state_elements = table_entries(&ns)
                .iter()
                .filter(|(k, _)| k.starts_with("set ") || k.starts_with("map "))
                .map(|(_, v)| v.len())
                .sum();
            samples.push(Sample {
                at: now - start,
                rss_kib: process_status(pid, "VmRSS:"),
                fds: open_files(pid),
                threads: process_status(pid, "Threads:"),
                elements: state_elements,
                routes: ns
                    .exec_ok(&["ip", "-4", "route", "show", "proto", "77"])
                    .lines()
                    .count(),
            });
            next_sample = now + sample_every;
        }
        if now - start >= duration * checkpoint / CHECKPOINTS {
            // Back to the steady cluster: every churned object deleted, every label
            // as it was; the agent's state must come back to the baseline.
            for churned in live.drain(..) {
                for (pod_ns, pod) in &churned.pods {
                    api.delete_pod(pod_ns, pod);
                }
                api.delete_network_policy(&churned.policy.0, &churned.policy.1);
                api.delete_node(&churned.node);
            }
            for j in 0..NAMESPACES {
                if envs[j as usize] != steady_env(j) {
                    envs[j as usize] = steady_env(j);
                    api.apply_namespace(namespace_object(j, steady_env(j)));
                }
            }
            match settle(&ns, &baseline) {
                Ok(took) => settle_times.push(took),
                Err(seen) => mismatches.push(format!(
                    "checkpoint {checkpoint} at {:?}: not back to the baseline within {SETTLE:?}; left: {:?}; missing: {:?}; gauges {:?} (baseline {:?})",
                    now - start,
                    seen.entries_not_in(&baseline),
                    baseline.entries_not_in(&seen),
                    seen.gauges,
                    baseline.gauges
                )),
            }
            // A state that did not come back stays wrong: the run has its answer.
            if checkpoint == CHECKPOINTS || !mismatches.is_empty() {
                break;
            }
            checkpoint += 1;
            continue;
        }

        let r = rounds;
        rounds += 1;
        let slot = 100 + u32::try_from(r % 100).unwrap_or(0);
        let remote = 1 + u32::try_from(r % u64::from(NODES - 1)).unwrap_or(0);
        let local_pod = pod_object(0, slot, &format!("churn-local-{r}"), "web");
        let remote_pod = pod_object(remote, slot, &format!("churn-remote-{r}"), "api");
        let pods = vec![
            (ns_name(slot % NAMESPACES), format!("churn-local-{r}")),
            (ns_name(slot % NAMESPACES), format!("churn-remote-{r}")),
        ];
        api.apply_pod(local_pod);
        serve(&mut changes);
        api.apply_pod(remote_pod);
        serve(&mut changes);
        let (policy_ns, policy_name, policy) = churn_policy(r);
        api.apply_network_policy(policy);
        serve(&mut changes);
        let node = format!("churn-node-{r}");
        let third = (r % 250) as u8;
        api.apply_node(node_object(
            &node,
            &format!("10.200.{third}.0/24"),
            &format!("100.64.2.{}", third + 1),
        ));
        serve(&mut changes);
        // A namespace's env flips to dev and back on its next turn.
        let j = u32::try_from(r % u64::from(NAMESPACES)).unwrap_or(0);
        envs[j as usize] = if envs[j as usize] == "dev" {
            steady_env(j)
        } else {
            "dev"
        };
        api.apply_namespace(namespace_object(j, envs[j as usize]));
        serve(&mut changes);
        // The previous round's local pod changes tier (web -> db).
        if r > 0 && live.back().is_some() {
            let prev = r - 1;
            let prev_slot = 100 + u32::try_from(prev % 100).unwrap_or(0);
            api.apply_pod(pod_object(
                0,
                prev_slot,
                &format!("churn-local-{prev}"),
                "db",
            ));
            serve(&mut changes);
        }
        live.push_back(Churned {
            pods,
            policy: (policy_ns, policy_name),
            node,
        });
        if live.len() as u64 > LIFETIME
            && let Some(old) = live.pop_front()
        {
            for (pod_ns, pod) in &old.pods {
                api.delete_pod(pod_ns, pod);
                serve(&mut changes);
            }
            api.delete_network_policy(&old.policy.0, &old.policy.1);
            serve(&mut changes);
            api.delete_node(&old.node);
            serve(&mut changes);
        }
    }
    let elapsed = start.elapsed();
    let end = State::read(&ns);
    let failures = reconcile_failures(&ns).saturating_sub(failures_before);
    let rss_peak_kib = peak_rss_kib(pid);
    drop(agent);
    if let Some(keep) = std::env::var_os("CNI_RS_SOAK_AGENT_LOG") {
        let _ = std::fs::copy(&log, keep);
    }

    let left = end.entries_not_in(&baseline);
    let missing = baseline.entries_not_in(&end);
    if let Some(keep) = std::env::var_os("CNI_RS_SOAK_SAMPLES") {
        write_samples(&keep, &samples);
    }
    // Growth is what even the lowest sample of the last third holds above the highest
    // of the first: a connection or a blocking thread that comes and goes is not
    // growth, something that piles up with the work done is.
    let third = elapsed / 3;
    let first = |f: fn(&Sample) -> u64| span(&samples, Duration::ZERO, third, f);
    let last = |f: fn(&Sample) -> u64| span(&samples, elapsed - third, elapsed + third, f);
    let rss_first = first(|s| s.rss_kib).1;
    let rss_last = last(|s| s.rss_kib).1;
    let (_, fds_first) = first(|s| s.fds as u64);
    let (fds_last, _) = last(|s| s.fds as u64);
    let (_, threads_first) = first(|s| s.threads);
    let (threads_last, _) = last(|s| s.threads);
    let elements_max = samples.iter().map(|s| s.elements).max().unwrap_or(0);
    let routes_max = samples.iter().map(|s| s.routes).max().unwrap_or(0);
    let settle_max = settle_times.iter().max().copied().unwrap_or_default();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "agent-soak seconds={:.0} rounds={rounds} changes={changes} changes_per_s={:.1} samples={} checkpoints={} rss_first_third_mib={:.1} rss_last_third_mib={:.1} rss_growth_pct={:.1} rss_peak_mib={:.1} fds_first_third_max={fds_first} fds_last_third_min={fds_last} fd_growth={} threads_first_third_max={threads_first} threads_last_third_min={threads_last} thread_growth={} baseline_elements={} baseline_routes={} churn_elements_max={elements_max} churn_routes_max={routes_max} checkpoint_mismatches={} settle_max_ms={:.0} reconcile_failures={failures} left_entries={} missing_entries={}",
        elapsed.as_secs_f64(),
        changes as f64 / elapsed.as_secs_f64(),
        samples.len(),
        settle_times.len() + mismatches.len(),
        rss_first as f64 / 1024.0,
        rss_last as f64 / 1024.0,
        (rss_last as f64 / rss_first.max(1) as f64 - 1.0) * 100.0,
        rss_peak_kib as f64 / 1024.0,
        fds_last as i64 - fds_first as i64,
        threads_last as i64 - threads_first as i64,
        baseline.elements(),
        baseline.routes.len(),
        mismatches.len(),
        ms(settle_max),
        left.len(),
        missing.len(),
    );
    assert!(
        mismatches.is_empty(),
        "a checkpoint did not come back to the baseline (the run stopped there):\n{}\nagent log:\n{}",
        mismatches.join("\n"),
        log_of(&log)
    );
    assert!(
        left.is_empty() && missing.is_empty(),
        "after every churned object was deleted, left: {left:#?}\nmissing: {missing:#?}"
    );
    assert!(
        elements_max > baseline.elements() && routes_max > baseline.routes.len(),
        "the churn never showed in the agent's state (elements {elements_max}, routes {routes_max})"
    );
}
