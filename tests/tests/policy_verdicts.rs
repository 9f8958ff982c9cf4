//! What the policy tiers say about what they decided, against what the kernel did: the
//! verdict counters of `/metrics`, the deny log, and `cni-node explain`.
//!
//! One node of the test cluster runs `cni-node --deny-log --log-format json` with pods
//! x/a, z/a and z/b, each serving TCP and UDP on ports 80 and 81, both families. An
//! Admin ClusterNetworkPolicy `guard` (subject: namespace x) denies egress to z on UDP 81
//! (rule `no-81-to-z`) and accepts egress to z on UDP 80 (an unnamed rule: `egress[1]`);
//! a NetworkPolicy in z allows ingress from x on UDP 80 and so isolates z's ingress.
//!
//! Once the tiers are in the kernel, a known number of new UDP flows per rule (fresh
//! sockets, half of them over IPv6; a denied flow is one datagram, never resent, since
//! each packet of a connection the kernel never confirmed is new again):
//!
//! - x/a -> z/a port 80: the Admin accept of x's egress, then z's NetworkPolicy allow;
//! - x/a -> z/a port 81: the Admin deny of x's egress;
//! - z/b -> z/a port 80: z's NetworkPolicy default deny of z/a's ingress.
//!
//! Each `cni_node_policy_verdicts_total` series must have moved by exactly its flows, and
//! the deny log must have written exactly one line per denied flow, naming both pods,
//! the protocol, port, tier, policy, rule and direction. Last, `cni-node explain` about
//! every probe of the three pods (both protocols, both ports, both families) must agree
//! with what the probe did.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cni_blackbox::cluster::{Cluster, Host, node_name, node_v4, node_v6};
use cni_blackbox::hostport::in_netns;
use cni_blackbox::netpol::{self, Probe, Protocol, Servers};
use cni_blackbox::{parallel, plugin_path, require_root};
use cni_kube_api::{
    Kind, cluster_network_policy, network_policy, realistic_namespace, realistic_pod,
};
use serde_json::{Value, json};

/// The servers' ports.
const PORTS: [u16; 2] = [80, 81];
/// How long a probe waits for its answer (a denial is a drop: it always waits this).
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// Generous bound for the tiers to reach the kernel, and for log lines to be written.
const DEADLINE: Duration = Duration::from_secs(30);

struct Pod {
    key: String,
    v4: IpAddr,
    v6: IpAddr,
    netns: PathBuf,
    _servers: Servers,
}

impl Pod {
    fn address(&self, v6: bool) -> IpAddr {
        if v6 { self.v6 } else { self.v4 }
    }
}

/// A pod on node 1: the Pod object, ADD as containerd does, the addresses posted, the
/// servers started.
fn add_pod(cluster: &mut Cluster, namespace: &str, name: &str) -> Pod {
    let node = node_name(1);
    let object = |ips: &[&str]| {
        let mut pod = realistic_pod(namespace, name, &node, ips, &[("pod", name)]);
        pod["status"]["hostIP"] = json!(node_v4(1));
        pod["status"]["hostIPs"] = json!([{"ip": node_v4(1)}, {"ip": node_v6(1)}]);
        pod
    };
    cluster.api.apply_pod(object(&[]));
    let uid = cluster
        .api
        .get(Kind::Pod, namespace, name)
        .and_then(|pod| pod["metadata"]["uid"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("the API server gave {namespace}/{name} no uid"));
    let pod = cluster.host(1).add_k8s_pod(namespace, name, &uid);
    let (v4, v6, netns) = (pod.v4, pod.v6, pod.ns.path().to_path_buf());
    cluster
        .api
        .apply_pod(object(&[&v4.to_string(), &v6.to_string()]));
    Pod {
        key: format!("{namespace}/{name}"),
        v4,
        v6,
        netns: netns.clone(),
        _servers: Servers::start(&netns, &PORTS),
    }
}

/// The value of every `cni_node_policy_verdicts_total` series, by its labels.
fn verdicts(host: &Host) -> BTreeMap<String, f64> {
    let Ok(answer) = host.health("/metrics") else {
        return BTreeMap::new();
    };
    answer
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("cni_node_policy_verdicts_total"))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// One metric without labels.
fn metric(host: &Host, name: &str) -> f64 {
    let answer = host.health("/metrics").expect("/metrics");
    answer
        .body
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{}", answer.body))
}

fn series(tier: &str, policy: &str, rule: &str, direction: &str, verdict: &str) -> String {
    format!(
        "{{tier=\"{tier}\",policy=\"{policy}\",rule=\"{rule}\",direction=\"{direction}\",\
         verdict=\"{verdict}\"}}"
    )
}

/// `count` new UDP flows from `from` to `to`:`port`, each from a fresh socket; an allowed
/// one waits for its echo (a probe resends on its own socket, which is the same flow), a
/// denied one is one datagram.
fn flows(from: &Pod, to: &Pod, port: u16, count: usize, allowed: bool) {
    for i in 0..count {
        let dst = SocketAddr::new(to.address(i % 2 == 1), port);
        // One datagram per flow, never sent again: a second one before the answer
        // (on a busy machine) would be a second new packet for the counters.
        let answered = in_netns(&from.netns, move || {
            let local: SocketAddr = if dst.is_ipv6() {
                "[::]:0".parse().unwrap()
            } else {
                "0.0.0.0:0".parse().unwrap()
            };
            let socket = UdpSocket::bind(local).unwrap();
            let token = format!("flow {i}");
            socket.send_to(token.as_bytes(), dst).unwrap();
            if !allowed {
                return Ok(());
            }
            socket
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut buf = [0u8; 64];
            match socket.recv_from(&mut buf) {
                Ok((len, _)) if buf[..len] == *token.as_bytes() => Ok(()),
                Ok((len, _)) => Err(format!("answered {:?}", &buf[..len])),
                Err(e) => Err(format!("no answer within 5 s: {e}")),
            }
        });
        if let Err(e) = answered {
            panic!("{} -> {dst}: {e}", from.key);
        }
    }
}

/// The deny log's lines in the agent's JSON log after byte `from`.
fn deny_lines(host: &Host, from: usize) -> Vec<Value> {
    host.agent_log()
        .get(from..)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["message"] == "denied new connection")
        .collect()
}

/// Every probe among `pods` (both protocols and ports, both families, a pod with itself
/// left out).
fn matrix(pods: &[Pod]) -> Vec<(usize, usize, Protocol, u16, bool)> {
    let mut cells = Vec::new();
    for from in 0..pods.len() {
        for to in (0..pods.len()).filter(|&to| to != from) {
            for protocol in Protocol::ALL {
                for port in PORTS {
                    for v6 in [false, true] {
                        cells.push((from, to, protocol, port, v6));
                    }
                }
            }
        }
    }
    cells
}

fn explain(
    socket: &Path,
    from: &Pod,
    to: &Pod,
    protocol: Protocol,
    port: u16,
    v6: bool,
) -> (Option<i32>, String) {
    let mut args = vec![
        "explain".to_owned(),
        format!("--from={}", from.key),
        format!("--to={}", to.key),
        format!("--protocol={}", protocol.name()),
        format!("--port={port}"),
        format!("--explain-socket={}", socket.display()),
    ];
    if v6 {
        args.push("--ipv6".into());
    }
    let out = std::process::Command::new(plugin_path("cni-node"))
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("cni-node explain: {e}"));
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn verdict_counters_the_deny_log_and_explain_agree_with_the_kernel() {
    if !require_root() {
        return;
    }
    let mut cluster = Cluster::new_with(1, 1500, |host| {
        host.extra_args.extend([
            "--deny-log".to_owned(),
            "--deny-log-rate=1000".to_owned(),
            "--log-format=json".to_owned(),
        ]);
    });
    cluster.wait_for_conflists();
    for ns in ["x", "z"] {
        cluster
            .api
            .apply_namespace(realistic_namespace(ns, &[("ns", ns)]));
    }
    let pods = [
        add_pod(&mut cluster, "x", "a"),
        add_pod(&mut cluster, "z", "a"),
        add_pod(&mut cluster, "z", "b"),
    ];
    let (xa, za, zb) = (&pods[0], &pods[1], &pods[2]);
    let z = json!({"namespaces": {"matchLabels": {"ns": "z"}}});
    cluster
        .api
        .apply_cluster_network_policy(cluster_network_policy(
            "guard",
            json!({"tier": "Admin", "priority": 10,
               "subject": {"namespaces": {"matchLabels": {"ns": "x"}}},
               "egress": [
                   {"name": "no-81-to-z", "action": "Deny", "to": [z],
                    "protocols": [{"udp": {"destinationPort": {"number": 81}}}]},
                   {"action": "Accept", "to": [z],
                    "protocols": [{"udp": {"destinationPort": {"number": 80}}}]}]}),
        ));
    cluster.api.apply_network_policy(network_policy(
        "z",
        "from-x",
        json!({"podSelector": {},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}],
                            "ports": [{"protocol": "UDP", "port": 80}]}]}),
    ));

    let admin_accept = series("Admin", "guard", "egress[1]", "egress", "accept");
    let admin_deny = series("Admin", "guard", "no-81-to-z", "egress", "deny");
    let np_allow = series("NetworkPolicy", "z", "allow", "ingress", "accept");
    let np_deny = series("NetworkPolicy", "z", "default-deny", "ingress", "deny");
    let wanted = [&admin_accept, &admin_deny, &np_allow, &np_deny];

    // The tiers are in the kernel once their chains are counted and the matrix's
    // telling cells do what the policies say.
    let host = &cluster.hosts[0];
    let start = Instant::now();
    loop {
        let now = verdicts(host);
        let probes: Vec<Probe> = [(xa, za, 80), (xa, za, 81), (zb, za, 80)]
            .iter()
            .map(|(from, to, port)| Probe {
                from: from.netns.clone(),
                to: SocketAddr::new(to.v4, *port),
                protocol: Protocol::Udp,
            })
            .collect();
        let outcomes = netpol::run(&probes, PROBE_TIMEOUT, |_, _| false);
        let enforced = outcomes[0].passed() && outcomes[1].dropped() && outcomes[2].dropped();
        if wanted.iter().all(|s| now.contains_key(*s)) && enforced {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the tiers did not reach the kernel within {DEADLINE:?}: series {now:#?}, \
             probes {outcomes:?}\nagent log:\n{}",
            host.agent_log()
        );
    }
    // Probes' resends settle, then the counts from here on are the flows'.
    std::thread::sleep(Duration::from_millis(500));
    let before = verdicts(host);
    let lines_before = metric(host, "cni_node_policy_deny_log_lines_total");
    let log_mark = host.agent_log().len();

    flows(xa, za, 80, 7, true);
    flows(xa, za, 81, 5, false);
    flows(zb, za, 80, 3, false);

    let mut logged = Vec::new();
    let start = Instant::now();
    while logged.len() < 8 && start.elapsed() < DEADLINE {
        std::thread::sleep(Duration::from_millis(100));
        logged = deny_lines(host, log_mark);
    }
    // Anything late would show now.
    std::thread::sleep(Duration::from_millis(500));
    logged = deny_lines(host, log_mark);
    let after = verdicts(host);
    let moved =
        |s: &String| after.get(s).copied().unwrap_or(0.0) - before.get(s).copied().unwrap_or(0.0);
    let got: Vec<(String, f64)> = wanted.iter().map(|s| ((*s).clone(), moved(s))).collect();
    assert_eq!(
        got,
        vec![
            (admin_accept.clone(), 7.0),
            (admin_deny.clone(), 5.0),
            (np_allow.clone(), 7.0),
            (np_deny.clone(), 3.0),
        ],
        "before {before:#?}\nafter {after:#?}"
    );
    let others: Vec<(&String, f64)> = after
        .keys()
        .filter(|s| !wanted.contains(s))
        .map(|s| (s, moved(s)))
        .filter(|(_, d)| *d != 0.0)
        .collect();
    assert!(
        others.is_empty(),
        "series the flows should not move: {others:?}"
    );

    let fields = |l: &Value| {
        [
            "src",
            "dst",
            "protocol",
            "port",
            "tier",
            "policy",
            "rule",
            "direction",
        ]
        .map(|k| l[k].to_string().trim_matches('"').to_owned())
        .join(" ")
    };
    let mut lines: Vec<String> = logged.iter().map(fields).collect();
    lines.sort();
    let mut want = vec!["x/a z/a UDP 81 Admin guard no-81-to-z egress".to_owned(); 5];
    want.extend(vec![
        "z/b z/a UDP 80 NetworkPolicy z default-deny ingress"
            .to_owned();
        3
    ]);
    want.sort();
    assert_eq!(lines, want, "{logged:#?}");
    assert_eq!(
        metric(host, "cni_node_policy_deny_log_lines_total") - lines_before,
        8.0
    );

    // explain against the kernel: every probe among the three pods.
    let cells = matrix(&pods);
    let probes: Vec<Probe> = cells
        .iter()
        .map(|&(from, to, protocol, port, v6)| Probe {
            from: pods[from].netns.clone(),
            to: SocketAddr::new(pods[to].address(v6), port),
            protocol,
        })
        .collect();
    let outcomes = netpol::run(&probes, PROBE_TIMEOUT, |_, _| false);
    let socket = host.explain_socket.clone();
    let answers = parallel(cells.len(), 4, |i| {
        let (from, to, protocol, port, v6) = cells[i];
        explain(&socket, &pods[from], &pods[to], protocol, port, v6)
    });
    let mut problems = Vec::new();
    for ((cell, outcome), (code, text)) in cells.iter().zip(&outcomes).zip(&answers) {
        let (from, to, protocol, port, v6) = *cell;
        let what = format!(
            "{} -> {} {} {port} {}",
            pods[from].key,
            pods[to].key,
            protocol.name(),
            if v6 { "IPv6" } else { "IPv4" }
        );
        if outcome.broken() {
            problems.push(format!("{what}: the probe {}", outcome.word()));
        } else if *code != Some(if outcome.passed() { 0 } else { 1 }) {
            problems.push(format!(
                "{what}: explain exited {code:?}, the probe {}: {text}",
                outcome.word()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The answers name the rules that decided.
    let (code, text) = explain(&socket, xa, za, Protocol::Udp, 81, false);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(
            "egress of the source: denied by the Admin tier: ClusterNetworkPolicy guard, rule no-81-to-z"
        ),
        "{text}"
    );
}
