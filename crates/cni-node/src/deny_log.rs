//! The deny log (`--deny-log`): one log line per new connection a policy tier denied,
//! naming both ends (a pod's `namespace/name`, else the address), the protocol and
//! port, and the tier, policy, rule and direction that denied it.
//!
//! The datapath's deny verdict chains log a connection's first packet to an
//! nfnetlink_log group (`log prefix "<chain>" group G`, at most `--deny-log-rate` per
//! second per chain); a thread of its own reads the group ([`cni_firewall::nflog`]),
//! finds what the chain stands for in the names the datapath published
//! ([`crate::policy::verdicts`]) and the ends in the Pod store, and writes the line
//! through the agent's log (text or JSON, `--log-format`), under the target
//! `cni_node::deny_log`. The rate is bounded again here, over all chains together:
//! what is over it is dropped and counted (`/metrics`), never queued.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cni_firewall::nflog::{LogGroup, LoggedPacket, Received};

use crate::error::{Error, Result, chain};
use crate::metrics::{Metrics, tier_label};
use crate::policy::objects::SlimPod;
use crate::policy::verdicts::{SharedVerdictNames, VerdictNames};
use crate::store::{Items, Store, snapshot_of};

/// The nfnetlink_log group the deny log uses unless told another: the agent's port
/// number, far from the small groups (0 to a few hundred) that ulogd, Suricata and
/// other CNIs use by default. One reader per group on a host.
pub const DEFAULT_GROUP: u16 = 9743;

/// Lines per second unless told otherwise.
pub const DEFAULT_RATE: u32 = 100;

/// The deny log's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The nfnetlink_log group.
    pub group: u16,
    /// At most this many lines per second: the kernel's bound per verdict chain, and
    /// the agent's over all of them.
    pub per_second: u32,
}

/// One denied new connection, named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// The source: `namespace/name` of a pod, else the address.
    pub src: String,
    /// The destination, likewise.
    pub dst: String,
    /// `TCP`, `UDP`, `SCTP`, `ICMP`, `ICMPv6` or the protocol number.
    pub protocol: String,
    /// The destination port (TCP, UDP, SCTP).
    pub port: Option<u16>,
    /// `Admin`, `NetworkPolicy`, `Baseline`; `unknown` for a chain the datapath no
    /// longer names (it changed between the packet and the line).
    pub tier: &'static str,
    /// The ClusterNetworkPolicy, or the local pod's namespace for NetworkPolicy; the
    /// chain's name when unknown.
    pub policy: String,
    /// The rule (`default-deny` for NetworkPolicy).
    pub rule: String,
    /// `ingress` or `egress`: whose side denied it.
    pub direction: &'static str,
}

/// A protocol number as the line says it.
fn protocol_name(protocol: Option<u8>) -> String {
    match protocol {
        Some(6) => "TCP".into(),
        Some(17) => "UDP".into(),
        Some(132) => "SCTP".into(),
        Some(1) => "ICMP".into(),
        Some(58) => "ICMPv6".into(),
        Some(n) => n.to_string(),
        None => "unknown".into(),
    }
}

/// Names a logged packet: the chain its prefix names, the pods at its addresses.
pub fn describe(
    packet: &LoggedPacket,
    names: &VerdictNames,
    pod_at: &mut dyn FnMut(IpAddr) -> Option<String>,
) -> Denied {
    let mut end = |ip: Option<IpAddr>| match ip {
        Some(ip) => pod_at(ip).unwrap_or_else(|| ip.to_string()),
        None => "unknown".into(),
    };
    let (src, dst) = (end(packet.src()), end(packet.dst()));
    let protocol = protocol_name(packet.protocol);
    match names.origin(&packet.prefix) {
        Some(origin) => Denied {
            src,
            dst,
            protocol,
            port: packet.dst_port,
            tier: tier_label(origin),
            policy: origin.policy.clone(),
            rule: origin.rule.clone(),
            direction: origin.direction.as_str(),
        },
        None => Denied {
            src,
            dst,
            protocol,
            port: packet.dst_port,
            tier: "unknown",
            policy: packet.prefix.clone(),
            rule: "unknown".into(),
            direction: "unknown",
        },
    }
}

/// Writes the line through the agent's log.
pub fn emit(d: &Denied) {
    tracing::info!(
        target: "cni_node::deny_log",
        src = %d.src,
        dst = %d.dst,
        protocol = %d.protocol,
        port = d.port,
        tier = %d.tier,
        policy = %d.policy,
        rule = %d.rule,
        direction = %d.direction,
        "denied new connection"
    );
}

/// A token bucket: `per_second` lines a second, as many at once.
#[derive(Debug, Clone)]
pub struct RateLimit {
    per_second: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    /// Full at `now`.
    pub fn new(per_second: u32, now: Instant) -> Self {
        Self {
            per_second: f64::from(per_second.max(1)),
            tokens: f64::from(per_second.max(1)),
            last: now,
        }
    }

    /// Whether a line may be written at `now` (and takes its token).
    pub fn allow(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.per_second);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Address -> pod, from the Pod store (rebuilt when its snapshot changes) and the
/// bridge plugin's records of this node's new pods (read again on a miss, at most once
/// a second: the API may not have a new pod's address yet).
struct PodNames {
    pods: Arc<Mutex<Store<SlimPod>>>,
    seen: Option<Items<SlimPod>>,
    by_address: BTreeMap<IpAddr, String>,
    records_dir: Option<PathBuf>,
    records: BTreeMap<IpAddr, String>,
    records_read: Option<Instant>,
}

impl PodNames {
    fn pod_at(&mut self, ip: IpAddr) -> Option<String> {
        let now = snapshot_of(&self.pods);
        let changed = match (&now, &self.seen) {
            (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
            (None, None) => false,
            _ => true,
        };
        if changed {
            self.by_address = now
                .iter()
                .flat_map(|items| items.values())
                .filter(|pod| !pod.host_network)
                .flat_map(|pod| pod.ips.iter().map(move |ip| (*ip, pod.key())))
                .collect();
            self.seen = now;
        }
        if let Some(key) = self.by_address.get(&ip) {
            return Some(key.clone());
        }
        let dir = self.records_dir.as_deref()?;
        if !self.records.contains_key(&ip)
            && self
                .records_read
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
        {
            self.records = crate::host::pod_records(dir);
            self.records_read = Some(Instant::now());
        }
        self.records.get(&ip).cloned()
    }
}

/// What the deny log thread reads and writes with.
pub struct Reader {
    /// The settings.
    pub settings: Settings,
    /// The datapath's names of its verdict chains.
    pub names: SharedVerdictNames,
    /// The Pod store.
    pub pods: Arc<Mutex<Store<SlimPod>>>,
    /// The bridge plugin's pod records, when NetworkPolicy is enforced.
    pub records_dir: Option<PathBuf>,
    /// Where lines and drops are counted.
    pub metrics: Arc<Metrics>,
    /// Writes a line ([`emit`] in the agent).
    pub emit: Box<dyn FnMut(&Denied) + Send>,
    /// Set to end the thread (within a second).
    pub stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("settings", &self.settings)
            .field("records_dir", &self.records_dir)
            .finish_non_exhaustive()
    }
}

/// Starts the deny log's thread in the calling thread's network namespace. A group it
/// cannot bind (another reader holds it) is tried again every few seconds, with a
/// warning, so the rest of the agent goes on.
pub fn start(reader: Reader) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("deny-log".into())
        .spawn(move || run(reader))
        .map_err(|source| Error::Thread {
            name: "deny-log",
            source,
        })
}

fn run(mut reader: Reader) {
    let group = reader.settings.group;
    let mut warned = false;
    let mut log = loop {
        if reader.stop.load(Ordering::SeqCst) {
            return;
        }
        match LogGroup::bind(group, Some(Duration::from_secs(1))) {
            Ok(log) => break log,
            Err(e) => {
                if !warned {
                    tracing::warn!(
                        "deny log: cannot read nfnetlink_log group {group} (trying again \
                         every 5 s): {}",
                        chain(&e)
                    );
                    warned = true;
                }
                std::thread::sleep(Duration::from_secs(5));
            }
        }
    };
    tracing::info!(
        "deny log: reading nfnetlink_log group {group}, at most {} lines per second",
        reader.settings.per_second
    );
    let mut limit = RateLimit::new(reader.settings.per_second, Instant::now());
    let mut pods = PodNames {
        pods: Arc::clone(&reader.pods),
        seen: None,
        by_address: BTreeMap::new(),
        records_dir: reader.records_dir.clone(),
        records: BTreeMap::new(),
        records_read: None,
    };
    while !reader.stop.load(Ordering::SeqCst) {
        let packets = match log.recv() {
            Ok(Received::Packets(packets)) => packets,
            Ok(Received::Timeout) => continue,
            Ok(Received::Overflow) => {
                reader.metrics.deny_log_dropped("overflow", 1);
                continue;
            }
            Err(e) => {
                tracing::warn!("deny log: {}", chain(&e));
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let mut dropped = 0;
        for packet in &packets {
            if !limit.allow(Instant::now()) {
                dropped += 1;
                continue;
            }
            let denied = {
                let names = reader.names.lock().unwrap_or_else(PoisonError::into_inner);
                describe(packet, &names, &mut |ip| pods.pod_at(ip))
            };
            (reader.emit)(&denied);
            reader.metrics.deny_logged();
        }
        if dropped > 0 {
            reader.metrics.deny_log_dropped("rate", dropped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pipeline::Tier;
    use crate::policy::verdicts::{Direction, Verdict, VerdictOrigin};

    fn origin() -> VerdictOrigin {
        VerdictOrigin {
            tier: Tier::Admin,
            policy: "deny-metadata".into(),
            rule: "egress[0]".into(),
            direction: Direction::Egress,
            verdict: Verdict::Deny,
        }
    }

    fn packet(prefix: &str) -> LoggedPacket {
        LoggedPacket {
            prefix: prefix.into(),
            addresses: Some((
                "10.244.1.5".parse().unwrap(),
                "169.254.169.254".parse().unwrap(),
            )),
            protocol: Some(6),
            dst_port: Some(80),
            in_ifindex: 3,
            out_ifindex: 0,
            phys_in_ifindex: 0,
            phys_out_ifindex: 0,
        }
    }

    #[test]
    fn a_packet_is_named_by_its_chain_and_its_pods() {
        let names = VerdictNames::new([origin()]);
        let mut pod_at = |ip: IpAddr| (ip.to_string() == "10.244.1.5").then(|| "x/a".to_owned());
        let d = describe(&packet(&origin().chain()), &names, &mut pod_at);
        assert_eq!(
            d,
            Denied {
                src: "x/a".into(),
                dst: "169.254.169.254".into(),
                protocol: "TCP".into(),
                port: Some(80),
                tier: "Admin",
                policy: "deny-metadata".into(),
                rule: "egress[0]".into(),
                direction: "egress",
            }
        );
        let d = describe(&packet("v-000000000000000000000000"), &names, &mut |_| None);
        assert_eq!(
            (d.tier, d.policy.as_str(), d.src.as_str()),
            ("unknown", "v-000000000000000000000000", "10.244.1.5")
        );
        let headless = LoggedPacket {
            addresses: None,
            protocol: None,
            dst_port: None,
            ..packet("x")
        };
        let d = describe(&headless, &names, &mut |_| None);
        assert_eq!(
            (d.src.as_str(), d.protocol.as_str(), d.port),
            ("unknown", "unknown", None)
        );
    }

    #[test]
    fn the_rate_limit_lets_a_second_s_worth_through_then_refills() {
        let start = Instant::now();
        let mut limit = RateLimit::new(3, start);
        let allowed = (0..10).filter(|_| limit.allow(start)).count();
        assert_eq!(allowed, 3);
        assert!(!limit.allow(start + Duration::from_millis(100)));
        assert!(limit.allow(start + Duration::from_millis(400)));
        let later = start + Duration::from_secs(60);
        let allowed = (0..10).filter(|_| limit.allow(later)).count();
        assert_eq!(allowed, 3, "the bucket holds one second's worth, no more");
    }

    /// The line as `--log-format json` writes it: one object, every field a key.
    #[test]
    fn a_json_line_is_one_object_with_every_field() {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let buffer = Arc::clone(&buffer);
            move || Capture(Arc::clone(&buffer))
        };
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_target(false)
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .finish();
        let names = VerdictNames::new([origin()]);
        let d = describe(&packet(&origin().chain()), &names, &mut |_| {
            Some("x/a".to_owned())
        });
        tracing::subscriber::with_default(subscriber, || emit(&d));
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        for (key, want) in [
            ("message", serde_json::json!("denied new connection")),
            ("src", "x/a".into()),
            ("dst", "x/a".into()),
            ("protocol", "TCP".into()),
            ("port", 80.into()),
            ("tier", "Admin".into()),
            ("policy", "deny-metadata".into()),
            ("rule", "egress[0]".into()),
            ("direction", "egress".into()),
        ] {
            assert_eq!(line[key], want, "{key}: {text}");
        }
    }

    /// The line as `--log-format text` writes it: readable, every field `key=value`.
    #[test]
    fn a_text_line_names_every_field() {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let buffer = Arc::clone(&buffer);
            move || Capture(Arc::clone(&buffer))
        };
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .with_target(false)
            .finish();
        let names = VerdictNames::new([origin()]);
        let d = describe(&packet(&origin().chain()), &names, &mut |ip| {
            (ip.to_string() == "10.244.1.5").then(|| "x/a".to_owned())
        });
        tracing::subscriber::with_default(subscriber, || emit(&d));
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        assert!(
            text.trim_end().ends_with(
                " INFO denied new connection src=x/a dst=169.254.169.254 protocol=TCP \
                 port=80 tier=Admin policy=deny-metadata rule=egress[0] direction=egress"
            ),
            "{text}"
        );
    }

    /// Runs a tool of the test's namespace; fails the test if it fails.
    fn sh(program: &str, args: &[&str], stdin: &str) {
        use std::io::Write as _;
        let mut child = std::process::Command::new(program)
            .args(args)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The whole reader against the kernel, in a private network namespace: a deny
    /// chain's log rule, a pod of the store at the source address, the line.
    #[test]
    fn a_logged_packet_becomes_a_line_naming_the_rule_and_the_pod() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "root tests need root (CI=true forbids skipping)"
            );
            return;
        }
        let group = 31_338;
        let chain = origin().chain();
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                    sh("ip", &["link", "set", "lo", "up"], "");
                    sh(
                        "nft",
                        &["-f", "-"],
                        &format!(
                            "table inet deny_log_test {{ chain input {{ type filter hook input \
                             priority 0; udp dport 4242 ct state new log prefix \"{chain}\" \
                             group {group}\n}}\n}}\n"
                        ),
                    );
                    let pods = Arc::new(Mutex::new(Store::<SlimPod>::default()));
                    {
                        use kube::runtime::watcher::Event;
                        let pod: SlimPod = serde_json::from_value(serde_json::json!({
                            "metadata": {"namespace": "x", "name": "a"},
                            "spec": {"nodeName": "n1"},
                            "status": {"podIPs": [{"ip": "127.0.0.1"}]},
                        }))
                        .unwrap();
                        let mut store = pods.lock().unwrap();
                        store.apply(Event::Init);
                        store.apply(Event::InitApply(pod));
                        store.apply(Event::InitDone);
                    }
                    let (lines, received) = std::sync::mpsc::channel();
                    let stop = Arc::new(AtomicBool::new(false));
                    let metrics = Arc::new(Metrics::new());
                    let thread = start(Reader {
                        settings: Settings {
                            group,
                            per_second: 100,
                        },
                        names: Arc::new(Mutex::new(VerdictNames::new([origin()]))),
                        pods,
                        records_dir: None,
                        metrics: Arc::clone(&metrics),
                        emit: Box::new(move |d| {
                            let _ = lines.send(d.clone());
                        }),
                        stop: Arc::clone(&stop),
                    })
                    .unwrap();
                    // The thread binds the group on its own time: new connections
                    // (new source ports) until one is logged, for a generous minute.
                    let deadline = Instant::now() + Duration::from_secs(60);
                    let line = loop {
                        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                        socket.send_to(b"x", "127.0.0.1:4242").unwrap();
                        if let Ok(line) = received.recv_timeout(Duration::from_millis(200)) {
                            break Some(line);
                        }
                        if Instant::now() > deadline {
                            break None;
                        }
                    };
                    stop.store(true, Ordering::SeqCst);
                    thread.join().unwrap();
                    let line = line.expect("no line within a minute");
                    assert_eq!(
                        line,
                        Denied {
                            src: "x/a".into(),
                            dst: "x/a".into(),
                            protocol: "UDP".into(),
                            port: Some(4242),
                            tier: "Admin",
                            policy: "deny-metadata".into(),
                            rule: "egress[0]".into(),
                            direction: "egress",
                        }
                    );
                    let text = metrics.encode().unwrap();
                    assert!(
                        !text.contains("cni_node_policy_deny_log_lines_total 0\n"),
                        "{text}"
                    );
                })
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
        });
    }

    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
