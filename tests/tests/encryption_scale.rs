//! The cost of `cni-node --encryption wireguard`, measured against the same agent
//! without it, on a kernel with WireGuard (the benchmark `tests/bench/encryption.sh`
//! runs these in the stock-kernel VM; both tests are ignored in the suite, and a kernel
//! without WireGuard skips them with a message, a failure under
//! `CNI_RS_REQUIRE_WIREGUARD=1`).
//!
//! `keyed_peers_sync_against_vxlan`: the API test server holds N realistic Nodes (as in
//! `cluster_scale.rs`, about 15 KB each) behind a gateway, so that without encryption
//! each is an FDB entry, a neighbour entry and a route through the VXLAN device; one
//! agent syncs them (VXLAN), then a fresh agent in a fresh namespace syncs the same
//! Nodes each publishing a WireGuard public key, so each is a peer on the WireGuard
//! device and a route through it. Timed from the agent's start to the last of its
//! routes (heard as route notifications; the peers are written before the routes that
//! use them, and the route in each mode is its node's last change), then checked whole
//! by reading the kernel. Then, with the keyed peers in place, one node's key changed
//! at a time on the API server, until the device shows a peer with the new key and the
//! node's pod CIDR, read back-to-back over generic netlink. The start of the first read
//! that shows it (a read the device changed during is read again, so one that shows the
//! change began after it was made) is late by up to one read, whose time is reported
//! beside the figures; so the figure is the kernel's: a return probe on WireGuard's
//! set-device handler times each write, and the last write that returned between the
//! change being served and that read is the latest the peer can have been put there.
//! Each change starts from an agent at rest (the old key's peer gone from the device,
//! then 100 ms), as a rotation somewhere in the cluster meets it. Printed as one
//! `encryption-scale key=value...` line, with the agent's peak RSS (VmHWM) in both
//! modes.
//!
//! `tcp_through_wireguard_and_vxlan`: two nodes on two segments joined by a router,
//! one pod each; one TCP stream from one pod to the other through VXLAN, then the
//! agents restarted with encryption on and the same stream through WireGuard, on the
//! same pods (whose MTU, set under VXLAN, is below the WireGuard device's). Printed as
//! one `encryption-traffic key=value...` line.
//!
//! `CNI_RS_SCALE_NODES` (default 300) sets N, `CNI_RS_SCALE_ROUNDS` (default 1) how
//! many syncs of each mode, alternating (each mode's time is the faster of its rounds),
//! `CNI_RS_KEY_CHANGES` (default 20) the key changes, `CNI_NODE_BIN` the agent (default the built one),
//! `ENCRYPTION_TRAFFIC_SECS` (default 3) each stream's length; `ENCRYPTION_AGENT_LOGS`
//! names a directory the scale test's agent logs are copied into.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cni_blackbox::cluster::wait;
use cni_blackbox::connections::tcp_throughput;
use cni_blackbox::hostport::in_netns;
use cni_blackbox::kernel::{wireguard_probe, wireguard_required};
use cni_blackbox::kprobe::{ReturnProbe, monotonic_now};
use cni_blackbox::measured::peak_rss_kib;
use cni_blackbox::segments::{node_at, two_segments};
use cni_blackbox::underlay::lone_node;
use cni_blackbox::{Netns, TempDir, plugin_path, require_root};
use cni_kube_api::{ApiServer, realistic_node};
use cni_linux::netlink::{
    Family, Netlink, Notified, Wireguard, is_route_added_with_protocol, subscribe_host_changes,
};
use cni_node::encryption::{ANNOTATION, Key};

/// The agent's route protocol number.
const PROTO: u8 = 77;
/// The agents' device names (their defaults).
const WG_DEVICE: &str = "cni-wg0";
const VXLAN_DEVICE: &str = "cni-vx4";
/// The underlay MTU of the traffic test.
const MTU: u32 = 1500;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

fn agent_binary() -> PathBuf {
    std::env::var_os("CNI_NODE_BIN").map_or_else(|| plugin_path("cni-node"), Into::into)
}

fn pod_cidr(i: u32) -> String {
    format!("10.{}.{}.0/24", i / 256, i % 256)
}

/// Node `i`'s InternalIP, behind the gateway 100.64.0.254.
fn node_ip(i: u32) -> String {
    format!("100.65.{}.{}", i / 250, i % 250 + 2)
}

/// A public key for node `i`'s `generation`th key: any 32 bytes are a key the kernel
/// takes as a peer's (splitmix64, so runs are alike).
fn public_key(i: u32, generation: u32) -> Key {
    let mut state = (u64::from(i) << 32 | u64::from(generation)).wrapping_add(0x9e37_79b9);
    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    Key(bytes)
}

fn node(i: u32, key: Option<Key>) -> serde_json::Value {
    let mut node = realistic_node(&format!("scale-{i}"), &[&pod_cidr(i)], &[&node_ip(i)], 40);
    if let Some(key) = key {
        node["metadata"]["annotations"][ANNOTATION] = key.to_base64().into();
    }
    node
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `p`th percentile of sorted durations.
fn pct(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// How the other nodes are reached in one measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Vxlan,
    Wireguard,
}

impl Mode {
    fn device(self) -> &'static str {
        match self {
            Mode::Vxlan => VXLAN_DEVICE,
            Mode::Wireguard => WG_DEVICE,
        }
    }
}

/// One node's namespace with the API server and N Nodes, and the agent syncing them.
struct Run {
    mode: Mode,
    nodes: u32,
    dir: TempDir,
    ns: Netns,
    api: ApiServer,
    agent: Child,
    log: PathBuf,
}

impl Drop for Run {
    fn drop(&mut self) {
        self.stop_agent();
    }
}

impl Run {
    /// Kills the agent and keeps its log for the benchmark's record (the guest's only
    /// way out is its shared directory).
    fn stop_agent(&mut self) {
        if self.agent.try_wait().is_ok_and(|status| status.is_some()) {
            return;
        }
        let _ = self.agent.kill();
        let _ = self.agent.wait();
        if let Some(dir) = std::env::var_os("ENCRYPTION_AGENT_LOGS") {
            let to = PathBuf::from(dir).join(format!("agent-{:?}.log", self.mode).to_lowercase());
            let _ = std::fs::copy(&self.log, to);
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The agent's routes (proto 77) through `device`, read over netlink.
    fn routes_through(&self, device: &str) -> usize {
        let device = device.to_owned();
        in_netns(self.ns.path(), move || {
            let nl = Netlink::connect().unwrap_or_else(|e| panic!("netlink: {e}"));
            let Ok(Some(link)) = nl.link_by_name(&device) else {
                return 0;
            };
            nl.routes(Family::V4, None)
                .unwrap_or_else(|e| panic!("route dump: {e}"))
                .iter()
                .filter(|r| r.protocol == Some(PROTO) && r.oif == Some(link.index))
                .count()
        })
    }

    fn count(&self, argv: &[&str]) -> usize {
        self.ns.exec_ok(argv).lines().count()
    }
}

/// Starts the agent on `nodes` Nodes in `mode` and waits until every other node's route
/// goes through the mode's device; the time from the start to the last route.
fn sync(mode: Mode, nodes: u32) -> (Run, Duration) {
    let dir = TempDir::new("cnibb-wgscale");
    let ns = lone_node("cnibb-wgscale");
    ns.exec_ok(&["ip", "route", "add", "100.65.0.0/16", "via", "100.64.0.254"]);
    let api = ApiServer::start_in_netns(
        ns.path(),
        "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
    );
    api.apply_node(realistic_node(
        "scale-0",
        &["10.255.0.0/24"],
        &["100.64.0.1"],
        40,
    ));
    for i in 1..nodes {
        api.apply_node(node(i, (mode == Mode::Wireguard).then(|| public_key(i, 0))));
    }
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let log = dir.path().join("agent.log");

    // The routes as the kernel announces them, counted on a thread: a count reached is
    // then checked by reading the routes (a route written twice is announced twice).
    // The thread waits on the namespace's notifications until the process ends, and
    // its socket keeps the namespace's kernel side until then: no teardown of an
    // earlier run overlaps a later one.
    let (tx, rx) = mpsc::channel::<Option<(usize, Instant)>>();
    let mut subscription = in_netns(ns.path(), || {
        subscribe_host_changes().unwrap_or_else(|e| panic!("subscribe: {e}"))
    });
    std::thread::spawn(move || {
        let mut added = 0;
        loop {
            let mut kept = 0;
            match subscription.wait(|m| {
                let route = is_route_added_with_protocol(m, PROTO);
                kept += usize::from(route);
                route
            }) {
                Ok(Notified::Messages { .. }) if kept == 0 => continue,
                Ok(Notified::Messages { .. }) => added += kept,
                // Lost notifications: the reader checks the kernel instead.
                Ok(Notified::Overflow) => {
                    if tx.send(None).is_err() {
                        return;
                    }
                    continue;
                }
                Err(_) => return,
            }
            if tx.send(Some((added, Instant::now()))).is_err() {
                return;
            }
        }
    });

    let mut args = vec![
        "--node-name=scale-0".to_owned(),
        "--masquerade-backend=nftables".to_owned(),
        "--health-addr=127.0.0.1:9744".to_owned(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--cni-conf-dir={}", dir.path().join("net.d").display()),
        format!("--cni-bin-dir={}", dir.path().display()),
        format!("--pod-record-dir={}", dir.path().join("pods").display()),
        format!(
            "--explain-socket={}",
            dir.path().join("explain.sock").display()
        ),
    ];
    if mode == Mode::Wireguard {
        args.push("--encryption=wireguard".to_owned());
        args.push(format!(
            "--state-dir={}",
            dir.path().join("state").display()
        ));
    }
    let agent_path = agent_binary();
    let start = Instant::now();
    let agent = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(&agent_path)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}")))
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", agent_path.display()));
    let run = Run {
        mode,
        nodes,
        dir,
        ns,
        api,
        agent,
        log,
    };

    let want = usize::try_from(nodes - 1).unwrap_or(usize::MAX);
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last = None;
    // The announcements after which the kernel is read: a read of thousands of routes is
    // costly under emulation, so after one that fell short, not before as many more.
    let mut check_at = want;
    let mut announced = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "{mode:?}: {} of {want} routes through {} after 600 s; agent log:\n{}",
            run.routes_through(mode.device()),
            mode.device(),
            run.log()
        );
        match rx.recv_timeout(left.min(Duration::from_secs(1))) {
            Ok(Some((added, at))) => {
                last = Some(at);
                announced = added;
                if added < check_at {
                    continue;
                }
            }
            Ok(None) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the route watch ended"),
        }
        // Everything announced so far is in the kernel: the last announcement is then the
        // end, unless a later one is still queued.
        let have = run.routes_through(mode.device());
        if have == want {
            while let Ok(Some((_, at))) = rx.try_recv() {
                last = Some(at);
            }
            break;
        }
        check_at = announced + want.saturating_sub(have);
    }
    let took = last.map_or_else(|| start.elapsed(), |at| at.duration_since(start));
    (run, took)
}

/// Checks the kernel holds the whole sync of `run`.
fn check_synced(run: &Run) {
    let want = usize::try_from(run.nodes - 1).unwrap_or(usize::MAX);
    let device = run.mode.device();
    let routes = run.count(&["ip", "-4", "route", "show", "proto", "77", "dev", device]);
    assert_eq!(routes, want, "{:?}: routes through {device}", run.mode);
    match run.mode {
        Mode::Vxlan => {
            let fdb = run.count(&["bridge", "fdb", "show", "dev", device]);
            let neighbours = run.count(&["ip", "neigh", "show", "dev", device, "nud", "permanent"]);
            assert_eq!(
                (fdb, neighbours),
                (want, want),
                "every encapsulated node has its FDB and neighbour entry"
            );
        }
        Mode::Wireguard => {
            let mut wg = in_netns(run.ns.path(), || {
                Wireguard::open().unwrap_or_else(|e| panic!("wireguard: {e}"))
            });
            let device = wg
                .device(WG_DEVICE)
                .unwrap_or_else(|e| panic!("read {WG_DEVICE}: {e}"));
            let have: BTreeSet<[u8; 32]> = device.peers.iter().map(|p| p.public_key).collect();
            let expected: BTreeSet<[u8; 32]> = (1..run.nodes).map(|i| public_key(i, 0).0).collect();
            assert!(
                have == expected,
                "the device's {} peers are not the {want} keyed nodes",
                device.peers.len()
            );
            for peer in &device.peers {
                assert_eq!(peer.allowed_ips.len(), 1, "one pod CIDR per peer");
            }
            assert!(
                run.api
                    .get(cni_kube_api::Kind::Node, "", "scale-0")
                    .is_some_and(|n| n["metadata"]["annotations"][ANNOTATION].is_string()),
                "the agent published its own key"
            );
        }
    }
    assert!(
        run.dir.path().join("net.d").read_dir().is_ok(),
        "the agent wrote no conflist directory"
    );
}

/// What the key changes measured.
struct KeyChanges {
    /// Each change, from being served to the return of the kernel's last write to the
    /// device before the read that showed its peer (or to that read, where no write was
    /// recorded).
    timed: Vec<Duration>,
    /// How many of them were timed by a recorded write.
    by_kernel: usize,
    /// Each change, from being served to the start of the first read that showed its
    /// peer.
    by_read: Vec<Duration>,
    /// Each read of the device.
    reads: Vec<Duration>,
}

/// Changes the key of one node after another on the API server; for each, the time
/// from the change being served to the device showing a peer with the new key that
/// holds the node's pod CIDR, by the read that showed it and, closer, by the kernel's
/// clock: `writes` times each return of WireGuard's set-device handler.
fn key_changes(run: &Run, changes: u32, writes: Option<&ReturnProbe>) -> KeyChanges {
    let mut wg = in_netns(run.ns.path(), || {
        Wireguard::open().unwrap_or_else(|e| panic!("wireguard: {e}"))
    });
    let others = run.nodes - 1;
    let mut measured = KeyChanges {
        timed: Vec::new(),
        by_kernel: 0,
        by_read: Vec::new(),
        reads: Vec::new(),
    };
    let mut keys: BTreeMap<u32, Key> = BTreeMap::new();
    for k in 0..changes {
        // Spread over the nodes; a node changed twice gets a new key each time.
        let i = 1 + (k * 7919) % others;
        let key = public_key(i, k + 1);
        let old = keys.insert(i, key).unwrap_or_else(|| public_key(i, 0));
        let cidr: ipnetwork::IpNetwork = pod_cidr(i).parse().unwrap_or_else(|e| panic!("{e}"));
        run.api.apply_node(node(i, Some(key)));
        let served = Instant::now();
        let served_at = monotonic_now();
        loop {
            // A read the device changed during is read again; one that went through is
            // the device as it was from its start, so the change it shows was there when
            // the read began: late by at most the read the change interrupted (or the
            // pause between reads).
            let read = Instant::now();
            let read_at = monotonic_now();
            let device = wg
                .device_once(WG_DEVICE)
                .unwrap_or_else(|e| panic!("read {WG_DEVICE}: {e}"));
            measured.reads.push(read.elapsed());
            if device.is_some_and(|d| {
                d.peers
                    .iter()
                    .any(|p| p.public_key == key.0 && p.allowed_ips.contains(&cidr))
            }) {
                let by_read = read.saturating_duration_since(served);
                measured.by_read.push(by_read);
                // The peer's key is new, so it was not on the device when the change was
                // served, and it was when this read began: one of the writes that
                // returned in between put it there, by the return of the last of them
                // at the latest.
                let returns = writes.map(|w| {
                    w.returns()
                        .unwrap_or_else(|e| panic!("the writes to {WG_DEVICE}: {e}"))
                });
                let written = returns.and_then(|r| {
                    r.into_iter()
                        .filter(|t| *t > served_at && *t <= read_at)
                        .max()
                });
                match written {
                    Some(at) => {
                        measured.timed.push(at - served_at);
                        measured.by_kernel += 1;
                    }
                    None => measured.timed.push(by_read),
                }
                break;
            }
            assert!(
                served.elapsed() < Duration::from_secs(60),
                "node {i}'s new key is not on the device after 60 s; agent log:\n{}",
                run.log()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Each change is timed from an agent at rest, as a rotation meets it: the old
        // key's peer leaves after the routes, and the pass ends soon after.
        while wg
            .device_once(WG_DEVICE)
            .unwrap_or_else(|e| panic!("read {WG_DEVICE}: {e}"))
            .is_none_or(|d| d.peers.iter().any(|p| p.public_key == old.0))
        {
            assert!(
                served.elapsed() < Duration::from_secs(60),
                "node {i}'s old key is still on the device after 60 s; agent log:\n{}",
                run.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    measured
}

/// The return probe on WireGuard's set-device handler (the module is loaded: the agent
/// made its device); without one the key changes are timed by the reads alone, which
/// the stock-kernel VM does not allow.
fn device_writes() -> Option<ReturnProbe> {
    match ReturnProbe::on("wg_set_device") {
        Ok(probe) => Some(probe),
        Err(why) => {
            assert!(
                !wireguard_required(),
                "the stock kernel times the writes to {WG_DEVICE}: {why}"
            );
            eprintln!("key changes timed by the reads alone: {why}");
            None
        }
    }
}

/// The sync of N keyed WireGuard peers against the same agent's sync of N VXLAN peers,
/// its memory, and the time of one node's key change to the kernel.
#[test]
#[ignore = "a benchmark: tests/bench/encryption.sh"]
fn keyed_peers_sync_against_vxlan() {
    let test = "keyed_peers_sync_against_vxlan";
    if !require_root() {
        return;
    }
    let Some(probe) = wireguard_probe(test) else {
        return;
    };
    let nodes =
        u32::try_from(env_number("CNI_RS_SCALE_NODES", 300).clamp(3, 60_000)).unwrap_or(300);
    let changes =
        u32::try_from(env_number("CNI_RS_KEY_CHANGES", 20).clamp(1, 10_000)).unwrap_or(20);

    let rounds = env_number("CNI_RS_SCALE_ROUNDS", 1).clamp(1, 20);

    // Rounds alternate the modes, each the faster of its rounds, so that what the
    // first agent of a boot pays alone (caches, the first of everything) is not counted.
    let mut vxlan_sync = Duration::MAX;
    let mut wg_sync = Duration::MAX;
    let mut vxlan_rss = 0;
    // The runs' namespaces are deleted at the end: the kernel tears a namespace down on
    // a worker, holding locks every netlink change needs (seconds under emulation for
    // one with a WireGuard device and its peers), which would land inside the next
    // measurement.
    let mut done = vec![];
    let mut last = None;
    for round in 0..rounds {
        let (mut vxlan, took) = sync(Mode::Vxlan, nodes);
        check_synced(&vxlan);
        vxlan_sync = vxlan_sync.min(took);
        vxlan_rss = vxlan_rss.max(peak_rss_kib(vxlan.agent.id()));
        vxlan.stop_agent();
        vxlan.api.stop();
        done.push(vxlan);
        let (mut wg, took) = sync(Mode::Wireguard, nodes);
        check_synced(&wg);
        wg_sync = wg_sync.min(took);
        if round + 1 == rounds {
            last = Some(wg);
        } else {
            wg.stop_agent();
            wg.api.stop();
            done.push(wg);
        }
    }
    let Some(wg) = last else {
        panic!("no round ran");
    };
    let wg_rss_sync = peak_rss_kib(wg.agent.id());
    let writes = device_writes();
    let mut measured = key_changes(&wg, changes, writes.as_ref());
    drop(writes);
    let wg_rss_peak = peak_rss_kib(wg.agent.id());
    assert_eq!(measured.timed.len(), changes as usize);
    // Every change makes at least one write, which returns before the read that shows it.
    assert!(
        measured.by_kernel > 0 || !wireguard_required(),
        "no write to {WG_DEVICE} was recorded"
    );
    let KeyChanges {
        timed,
        by_kernel,
        by_read,
        reads,
    } = &mut measured;
    timed.sort();
    by_read.sort();
    reads.sort();
    // The whole distributions, for the log: a p99 of 100 changes is their slowest.
    let each = |v: &[Duration]| {
        v.iter()
            .map(|d| format!("{:.1}", ms(*d)))
            .collect::<Vec<_>>()
            .join(",")
    };
    println!("encryption-key-changes ms={}", each(timed));
    println!("encryption-key-changes-by-read ms={}", each(by_read));
    println!(
        "encryption-scale nodes={nodes} rounds={rounds} vxlan_sync_ms={:.0} wireguard_sync_ms={:.0} sync_ratio={:.3} vxlan_rss_peak_mib={:.1} rss_after_sync_mib={:.1} rss_peak_mib={:.1} key_changes={changes} key_change_p50_ms={:.2} key_change_p99_ms={:.2} key_change_max_ms={:.2} key_changes_timed_by_kernel={} key_change_by_read_p50_ms={:.2} key_change_by_read_p99_ms={:.2} device_read_p50_ms={:.2}",
        ms(vxlan_sync),
        ms(wg_sync),
        wg_sync.as_secs_f64() / vxlan_sync.as_secs_f64(),
        mib(vxlan_rss),
        mib(wg_rss_sync),
        mib(wg_rss_peak),
        ms(pct(timed, 50)),
        ms(pct(timed, 99)),
        ms(timed[timed.len() - 1]),
        by_kernel,
        ms(pct(by_read, 50)),
        ms(pct(by_read, 99)),
        ms(pct(reads, 50)),
    );
    drop(wg);
    drop(done);
    drop(probe);
}

/// A connected pair of TCP sockets from `from` to `ip` in `to`.
/// Whether `ns` routes `cidr` (the agent's route) through `device`.
fn routed_through(ns: &Netns, cidr: &str, device: &str) -> bool {
    let out = ns.exec(&["ip", "-4", "route", "show", "proto", "77", cidr]);
    String::from_utf8_lossy(&out.stdout).contains(&format!("dev {device}"))
}

/// Pod to pod TCP throughput through VXLAN, then through WireGuard, the same pods.
#[test]
#[ignore = "a benchmark: tests/bench/encryption.sh"]
fn tcp_through_wireguard_and_vxlan() {
    let test = "tcp_through_wireguard_and_vxlan";
    if !require_root() || wireguard_probe(test).is_none() {
        return;
    }
    let secs = env_number("ENCRYPTION_TRAFFIC_SECS", 3).clamp(1, 600);
    let (mut cluster, _router, places) = two_segments(&[1], &[3], MTU);
    for (n, place) in &places {
        cluster.api.apply_node(node_at(*n, place));
    }
    let kubeconfig = cluster.kubeconfig.clone();
    let cidr_of = |n: u8| cni_blackbox::cluster::pod_cidr_v4(n);
    let through = |cluster: &cni_blackbox::cluster::Cluster, device: &str| {
        for (host, other) in [(&cluster.hosts[0], 3), (&cluster.hosts[1], 1)] {
            wait(
                Duration::from_secs(120),
                &format!("node {}'s route to node {other} through {device}", host.n),
                || routed_through(&host.ns, &cidr_of(other), device),
            )
            .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", host.agent_log()));
        }
    };
    for host in &mut cluster.hosts {
        host.start_agent(&kubeconfig);
    }
    through(&cluster, VXLAN_DEVICE);
    for host in &mut cluster.hosts {
        host.add_pod();
    }
    let (from, to) = (&cluster.hosts[0].pods[0], &cluster.hosts[1].pods[0]);
    let vxlan = tcp_throughput(from.ns.path(), to.ns.path(), to.v4, secs) / 1e6;

    for host in &mut cluster.hosts {
        host.kill_agent();
        let state = host
            .conf_dir
            .parent()
            .unwrap_or_else(|| panic!("{} has no parent", host.conf_dir.display()))
            .join("state");
        host.extra_args.extend([
            "--encryption=wireguard".to_owned(),
            format!("--state-dir={}", state.display()),
        ]);
        host.start_agent(&kubeconfig);
    }
    through(&cluster, WG_DEVICE);
    let (from, to) = (&cluster.hosts[0].pods[0], &cluster.hosts[1].pods[0]);
    let wireguard = tcp_throughput(from.ns.path(), to.ns.path(), to.v4, secs) / 1e6;
    // The stream went through the device: its peer counted the bytes.
    let sent: u64 = in_netns(cluster.hosts[0].ns.path(), || {
        Wireguard::open()
            .and_then(|mut wg| wg.device(WG_DEVICE))
            .unwrap_or_else(|e| panic!("read {WG_DEVICE}: {e}"))
            .peers
            .iter()
            .map(|p| p.tx_bytes)
            .sum()
    });
    assert!(
        sent > 1_000_000,
        "the WireGuard peer sent {sent} bytes during the stream"
    );
    println!(
        "encryption-traffic secs={secs} vxlan_tcp_mbit_s={vxlan:.1} wireguard_tcp_mbit_s={wireguard:.1} tcp_ratio={:.3}",
        wireguard / vxlan
    );
}
