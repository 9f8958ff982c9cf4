//! Soak: many ADD/DEL cycles of one pod slot (bridge + host-local,
//! dual-stack, masquerade on), and afterwards nothing has grown: the same files in the
//! network's state directory, the same links, addresses, routes, neighbours and bridge
//! FDB entries in the host netns, the same iptables and nftables rules, nothing left in
//! the pod, and no plugin process bigger than in the first tenth of the run (peak RSS of
//! the test's children, a generous bound). Conntrack entries are printed, not compared
//! (see [`conntrack_entries`]).
//!
//! Cycles: `CNI_SOAK_CYCLES` (default 100, also under CI). The full soak is 5,000 cycles,
//! run by `tests/bench/soak.sh`, which judges the figures this test prints on its
//! `soak-figures` line (what grew, the plugins' peak RSS, p50 of wall and CPU time in
//! the last tenth against the first) against `[soak.*]` in tests/bench/targets.toml:
//! timing is reported here, never asserted.
//! `CNI_SOAK_BACKEND` sets `ipMasqBackend` (default: unset, the reference's default).
//! With `CNI_BLACKBOX_BIN_DIR=/usr/lib/cni` the same soak runs against the reference.

mod bridge_support;

use std::io::Write as _;
use std::time::{Duration, Instant};

use bridge_support::{Net, names};
use cni_blackbox::{Netns, kernel, require_root};
use nix::sys::resource::{UsageWho, getrusage};
use serde_json::json;

const DEFAULT_CYCLES: usize = 100;

fn cycles() -> usize {
    match std::env::var("CNI_SOAK_CYCLES") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|&n: &usize| n >= 10)
            .unwrap_or_else(|| panic!("CNI_SOAK_CYCLES={v:?}: want a whole number >= 10")),
        Err(_) => DEFAULT_CYCLES,
    }
}

/// Everything an attachment could leave behind, in a form that compares equal when
/// nothing has grown. Counters and the `last_reserved_ip` contents change from cycle to
/// cycle and are left out.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    state_files: Vec<String>,
    host_links: Vec<String>,
    host_addrs: Vec<String>,
    host_routes: Vec<String>,
    host_neighbours: usize,
    bridge_ports: usize,
    bridge_fdb: usize,
    iptables: Vec<String>,
    nft: Vec<String>,
    pod_links: Vec<String>,
    pod_addrs: Vec<String>,
}

fn snapshot(net: &Net, pod: &Netns) -> Snapshot {
    let mut state_files: Vec<String> = std::fs::read_dir(net.data.path().join(&net.name))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    state_files.sort();
    let all_addrs = |ns: &Netns| -> Vec<String> {
        kernel::ip_json(ns, &["addr", "show"])
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|l| {
                let dev = l["ifname"].as_str().unwrap_or_default().to_owned();
                l["addr_info"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |a| format!("{dev} {} {}", a["local"], a["prefixlen"]))
            })
            .collect()
    };
    // Sorted: the order of tables and chains says nothing about growth.
    let lines = |text: String| -> Vec<String> {
        let mut lines: Vec<String> = text
            .lines()
            // iptables-save headers carry a date; counters ([0:0]) are not state.
            .filter(|l| !l.starts_with('#'))
            .map(|l| match l.split_once(" [") {
                Some((chain, _)) if l.starts_with(':') => chain.to_owned(),
                _ => l.to_owned(),
            })
            .collect();
        lines.sort();
        lines
    };
    let mut host_routes = bridge_support::route_lines(&net.host, "-4");
    host_routes.extend(bridge_support::route_lines(&net.host, "-6"));
    let count = |v: serde_json::Value| v.as_array().map_or(0, Vec::len);
    Snapshot {
        state_files,
        host_links: names(&kernel::links(&net.host)),
        host_addrs: all_addrs(&net.host),
        host_routes,
        host_neighbours: count(kernel::ip_json(&net.host, &["neigh", "show"])),
        bridge_ports: count(kernel::ip_json(
            &net.host,
            &["link", "show", "master", &net.bridge],
        )),
        bridge_fdb: {
            let text = net
                .host
                .exec_ok(&["bridge", "-j", "fdb", "show", "br", &net.bridge]);
            // The bridge's own entries (its MAC, the multicast groups of its addresses)
            // follow its MAC and addresses; a leak would be an entry of a port.
            serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter(|e| e["ifname"] != json!(net.bridge))
                .count()
        },
        iptables: lines(net.iptables()),
        nft: lines(net.nft()),
        pod_links: names(&kernel::links(pod)),
        pod_addrs: all_addrs(pod),
    }
}

/// The host netns' conntrack entries (`/proc/net/nf_conntrack`, empty when the kernel
/// has no conntrack procfs). Not part of [`Snapshot`]: the plugins make no conntrack
/// state, but a pod's own packets while it lives (IPv6 router solicitations, MLD reports)
/// can leave an entry in the host netns that only expires by timeout (30 s for ICMPv6),
/// so the count at an instant says nothing about a leak. Printed for the record.
fn conntrack_entries(host: &Netns) -> Vec<String> {
    let out = host.exec(&["cat", "/proc/net/nf_conntrack"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Peak RSS (KiB) of any child process this test has waited for so far, the plugins
/// (and the host-local each bridge runs) included: a running maximum.
fn children_peak_rss_kib() -> i64 {
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| u.max_rss())
        .unwrap_or_else(|e| panic!("getrusage(RUSAGE_CHILDREN): {e}"))
}

/// User + system CPU time of every child process this test has waited for so far: the
/// difference around one plugin call is that call's CPU time (its IPAM child included),
/// which a loaded machine stretches far less than wall time.
fn children_cpu() -> Duration {
    let u = getrusage(UsageWho::RUSAGE_CHILDREN)
        .unwrap_or_else(|e| panic!("getrusage(RUSAGE_CHILDREN): {e}"));
    let d = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    d(u.user_time()) + d(u.system_time())
}

/// p50 of the last tenth of `samples` over p50 of the first tenth: 1 when nothing
/// drifted.
fn last_vs_first(samples: &[Duration]) -> f64 {
    let tenth = samples.len() / 10;
    let first = quantile_ms(&samples[..tenth], 0.5);
    let last = quantile_ms(&samples[samples.len() - tenth..], 0.5);
    if first > 0.0 { last / first } else { f64::NAN }
}

/// `q`-quantile (nearest rank) of `samples`, in ms.
fn quantile_ms(samples: &[Duration], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1000.0
}

fn report(label: &str, samples: &[Duration]) -> String {
    let tenth = samples.len() / 10;
    let (first, last) = (&samples[..tenth], &samples[samples.len() - tenth..]);
    format!(
        "{label}: first tenth p50 {:.1} ms p99 {:.1} ms | last tenth p50 {:.1} ms p99 {:.1} ms | max {:.1} ms",
        quantile_ms(first, 0.5),
        quantile_ms(first, 0.99),
        quantile_ms(last, 0.5),
        quantile_ms(last, 0.99),
        quantile_ms(samples, 1.0),
    )
}

#[test]
fn add_del_cycles_leave_nothing_behind() {
    if !require_root() {
        return;
    }
    let cycles = cycles();
    let net = Net::new();
    let pod = net.pod();
    let mut extra = json!({"isGateway": true, "ipMasq": true});
    if let Ok(backend) = std::env::var("CNI_SOAK_BACKEND") {
        extra["ipMasqBackend"] = json!(backend);
    }
    let conf = net.conf("1.0.0", &["10.79.0.0/24", "fd00:79::/64"], &extra);
    let mut add_times = Vec::with_capacity(cycles);
    let mut del_times = Vec::with_capacity(cycles);
    let mut cpu_times = Vec::with_capacity(cycles);
    // The children's peak RSS after the first ADD and DEL, before any snapshot runs a
    // tool (iptables-save, nft) that is no plugin: the plugins' own peak.
    let mut rss_plugins = 0;
    let mut baseline = None;
    let mut rss_first_tenth = 0;
    let (mut rss_peak, mut rss_raised_at) = (0, 0);
    let started = Instant::now();

    for cycle in 0..cycles {
        // A new container each time, as on a node: new reservation, rule and chain names.
        let cid = format!("soak-{cycle}");
        let cpu = children_cpu();
        let t = Instant::now();
        let add = net.run("ADD", &conf, &cid, &pod, "eth0");
        add_times.push(t.elapsed());
        add.assert_success();
        let ips = add.json()["ips"].as_array().map_or(0, Vec::len);
        assert_eq!(ips, 2, "cycle {cycle}: one address per family:\n{add}");
        let t = Instant::now();
        let del = net.run("DEL", &conf, &cid, &pod, "eth0");
        del_times.push(t.elapsed());
        cpu_times.push(children_cpu().saturating_sub(cpu));
        del.assert_success_silent();

        // The first cycle makes what stays for every later pod (bridge, gateway
        // addresses, sysctls, the lock file): the baseline is taken after it.
        if cycle == 0 {
            rss_plugins = children_peak_rss_kib();
            baseline = Some(snapshot(&net, &pod));
        }
        let rss = children_peak_rss_kib();
        if rss > rss_peak {
            rss_peak = rss;
            rss_raised_at = cycle;
        }
        if cycle + 1 == cycles / 10 {
            rss_first_tenth = rss;
        }
    }
    let elapsed = started.elapsed();
    let rss_end = children_peak_rss_kib();
    let end = snapshot(&net, &pod);
    let conntrack = conntrack_entries(&net.host);

    let _ = writeln!(
        std::io::stderr(),
        "soak: {cycles} cycles in {:.1} s\n{}\n{}\npeak RSS of child processes: {rss_first_tenth} KiB after the first tenth, {rss_end} KiB at the end, last raised in cycle {rss_raised_at}\nstate at the end: {end:?}\nconntrack entries in the host netns at the end: {conntrack:#?}",
        elapsed.as_secs_f64(),
        report("ADD", &add_times),
        report("DEL", &del_times),
    );

    let baseline = baseline.unwrap_or_else(|| panic!("no cycle ran"));
    // The figures tests/bench/soak.sh judges, on one line of `name=value`.
    let grew = [
        end.state_files != baseline.state_files,
        end.host_links != baseline.host_links,
        end.host_addrs != baseline.host_addrs,
        end.host_routes != baseline.host_routes,
        end.host_neighbours != baseline.host_neighbours,
        end.bridge_ports != baseline.bridge_ports,
        end.bridge_fdb != baseline.bridge_fdb,
        end.iptables != baseline.iptables,
        end.nft != baseline.nft,
        end.pod_links != baseline.pod_links,
        end.pod_addrs != baseline.pod_addrs,
    ];
    let reservations_left = end
        .state_files
        .iter()
        .filter(|f| f.parse::<std::net::IpAddr>().is_ok())
        .count();
    let both: Vec<Duration> = add_times
        .iter()
        .zip(&del_times)
        .map(|(a, d)| *a + *d)
        .collect();
    let _ = writeln!(
        std::io::stderr(),
        "soak-figures cycles={cycles} seconds={:.1} kinds_grew={} reservations_left={reservations_left} \
         pod_eth0_left={} plugin_rss_peak_mib={:.2} children_rss_growth={:.3} \
         add_del_wall_last_vs_first={:.3} add_del_cpu_last_vs_first={:.3} \
         add_p50_first_ms={:.1} add_p50_last_ms={:.1} del_p50_first_ms={:.1} del_p50_last_ms={:.1} \
         conntrack_entries_end={}",
        elapsed.as_secs_f64(),
        grew.iter().filter(|g| **g).count(),
        u8::from(end.pod_links.iter().any(|l| l == "eth0")),
        rss_plugins as f64 / 1024.0,
        rss_end as f64 / rss_first_tenth.max(1) as f64,
        last_vs_first(&both),
        last_vs_first(&cpu_times),
        quantile_ms(&add_times[..cycles / 10], 0.5),
        quantile_ms(&add_times[cycles - cycles / 10..], 0.5),
        quantile_ms(&del_times[..cycles / 10], 0.5),
        quantile_ms(&del_times[cycles - cycles / 10..], 0.5),
        conntrack.len(),
    );
    assert_eq!(end, baseline, "state grew over {cycles} cycles");
    assert!(
        !end.pod_links.iter().any(|l| l == "eth0"),
        "pod still has eth0"
    );
    assert!(
        end.state_files
            .iter()
            .all(|f| f.parse::<std::net::IpAddr>().is_err()),
        "reservations left: {:?}",
        end.state_files
    );
    // Not a timing bound: a plugin whose memory grew with the work done before it would
    // have to be half again as big as every process of the first tenth.
    assert!(
        rss_end <= rss_first_tenth + rss_first_tenth / 2,
        "peak RSS grew from {rss_first_tenth} KiB (first tenth) to {rss_end} KiB"
    );
}
