//! A policy matrix run against the kernel until it equals what the tests' oracle
//! expects, shared by the NetworkPolicy and ClusterNetworkPolicy end-to-end tests: the
//! cells (a source pod, a destination server), the probes that show the servers of
//! denied cells alive, what a round says is broken, and the loop that runs the matrix
//! until it agrees. Each test says how its pods are probed and named ([`Pods`]).
//!
//! A policy drops, so a denied cell agrees only by timing out: a refusal or an error
//! means a broken server or route and fails at once. A dead server would time out like
//! a denial, so every server of a denied cell must be shown alive in the same pass: by
//! an allowed cell that reached it or, where none may, by a probe from its node (which
//! policy never judges).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::netpol::{self, Outcome, Probe, Protocol};

/// One probe of a matrix: from pod `from` to pod `to`'s server.
#[derive(Debug, Clone, Copy)]
pub struct Cell {
    /// The source pod (an index into the test's pods).
    pub from: usize,
    /// The destination pod.
    pub to: usize,
    /// The protocol.
    pub protocol: Protocol,
    /// The destination port.
    pub port: u16,
    /// IPv6 (else IPv4).
    pub v6: bool,
}

impl Cell {
    /// The server the cell reaches.
    pub fn server(&self) -> Server {
        Server {
            member: self.to,
            protocol: self.protocol,
            port: self.port,
            v6: self.v6,
        }
    }
}

/// One server of a pod: what a probe reaches, whoever sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Server {
    /// The pod.
    pub member: usize,
    /// The protocol.
    pub protocol: Protocol,
    /// The port.
    pub port: u16,
    /// IPv6 (else IPv4).
    pub v6: bool,
}

/// How a test's pods are probed and named.
pub trait Pods {
    /// The probe of a cell, from its source pod.
    fn probe(&self, cell: &Cell) -> Probe;
    /// A probe of `server` from its pod's node, which always reaches its own pods.
    fn node_probe(&self, server: Server) -> Probe;
    /// A cell in words, for messages.
    fn describe(&self, cell: &Cell) -> String;
    /// A server in words.
    fn describe_server(&self, server: Server) -> String;
    /// The node of pod `member`.
    fn node_of(&self, member: usize) -> u8;
    /// Whether a failed probe is neither the server's nor the route's fault (`cell`: a
    /// probe of the matrix; `None`: one from the server's node): it is then no verdict
    /// and the matrix runs again. None is by default.
    fn excused(&self, _cell: Option<&Cell>, _outcome: &Outcome) -> bool {
        false
    }
}

/// The servers of the cells `allowed` denies.
pub fn denied_servers(cells: &[Cell], allowed: &[bool]) -> BTreeSet<Server> {
    cells
        .iter()
        .zip(allowed)
        .filter(|(_, a)| !**a)
        .map(|(c, _)| c.server())
        .collect()
}

/// The probes of `cells`, then of the servers of `need` that no cell `allowed` allows
/// reaches (from their nodes); returns them with those servers.
pub fn probes_with_alive(
    pods: &impl Pods,
    cells: &[Cell],
    allowed: &[bool],
    need: &BTreeSet<Server>,
) -> (Vec<Probe>, Vec<Server>) {
    let reached: BTreeSet<Server> = cells
        .iter()
        .zip(allowed)
        .filter(|(_, a)| **a)
        .map(|(c, _)| c.server())
        .collect();
    let servers: Vec<Server> = need.difference(&reached).copied().collect();
    let probes = cells
        .iter()
        .map(|c| pods.probe(c))
        .chain(servers.iter().map(|s| pods.node_probe(*s)))
        .collect();
    (probes, servers)
}

/// Every probe of `cells` and of `servers` (from their nodes) that says the path is
/// broken: a policy drops, so a refusal or an error means the server is down or the
/// route is wrong, whatever the policy says.
pub fn broken(
    pods: &impl Pods,
    cells: &[Cell],
    outcomes: &[Outcome],
    servers: &[Server],
    server_outcomes: &[Outcome],
) -> Vec<String> {
    let cells = cells
        .iter()
        .zip(outcomes)
        .filter(|(c, o)| o.broken() && !pods.excused(Some(c), o))
        .map(|(c, o)| (pods.describe(c), o));
    let servers = servers
        .iter()
        .zip(server_outcomes)
        .filter(|(_, o)| o.broken() && !pods.excused(None, o))
        .map(|(s, o)| {
            let node = pods.node_of(s.member);
            (format!("node {node} -> {}", pods.describe_server(*s)), o)
        });
    cells
        .chain(servers)
        .map(|(what, o)| {
            format!(
                "  {what}: {}: the server or the route is broken, not the policy (a policy \
                 drops: nothing answers)",
                o.word()
            )
        })
        .collect()
}

/// The servers of `need` that no probe of the round reached: not a cell of `cells` to
/// it, nor a probe of `servers` from its node.
pub fn not_shown_alive(
    need: &BTreeSet<Server>,
    cells: &[Cell],
    outcomes: &[Outcome],
    servers: &[Server],
    server_outcomes: &[Outcome],
) -> Vec<Server> {
    let alive: BTreeSet<Server> = cells
        .iter()
        .map(Cell::server)
        .zip(outcomes)
        .chain(servers.iter().copied().zip(server_outcomes))
        .filter(|(_, o)| o.passed())
        .map(|(s, _)| s)
        .collect();
    need.difference(&alive).copied().collect()
}

/// A matrix that equalled the expectation.
#[derive(Debug)]
pub struct Converged {
    /// When the pass that matched began, after the change.
    pub after: Duration,
    /// Passes run.
    pub passes: u32,
    /// The cells' outcomes in that pass.
    pub outcomes: Vec<Outcome>,
}

impl Converged {
    /// How many cells were denied.
    pub fn denied(&self) -> usize {
        self.outcomes.iter().filter(|o| !o.passed()).count()
    }
}

/// Why a matrix did not converge.
#[derive(Debug)]
pub enum NotConverged {
    /// A probe was refused or failed, or the servers of denied cells were not shown
    /// alive in the pass that agreed: what, in words.
    Broken(String),
    /// At the deadline the matrix still differed: the last pass's outcomes of the
    /// cells, for the test's report.
    Differs {
        /// Passes run.
        passes: u32,
        /// The last pass's outcomes.
        outcomes: Vec<Outcome>,
    },
}

/// Runs the matrix of `cells` until its outcomes agree with `expected`, for at most
/// `deadline` after `since`; the time is when the pass that matched began. A pass ends
/// at the first probe that disagrees, so while a change that denies is not in force
/// passes follow each other every few milliseconds; a change that allows shows up to
/// one `timeout` late, when the first SYNs were dropped (TCP sends the next one only
/// after a second). A refusal or an error anywhere fails at once; every server of a
/// denied cell must be shown alive in the pass that matches.
pub fn converge(
    pods: &impl Pods,
    cells: &[Cell],
    expected: &[bool],
    since: Instant,
    deadline: Duration,
    timeout: Duration,
) -> Result<Converged, NotConverged> {
    let need = denied_servers(cells, expected);
    let (probes, servers) = probes_with_alive(pods, cells, expected, &need);
    let n = cells.len();
    let mut passes = 0;
    loop {
        let began = since.elapsed();
        let last = began >= deadline;
        passes += 1;
        let pass = Instant::now();
        // A probe that disagrees ends the pass at once, but for the last one, whose
        // every outcome goes into the report. (A node's probe that is not answered
        // times out with the denied probes: the pass is over then anyway.)
        let outcomes = netpol::run(&probes, timeout, |i, outcome| {
            !last && (outcome.broken() || expected.get(i).is_some_and(|e| !outcome.agrees(*e)))
        });
        let (outcomes, server_outcomes) = outcomes.split_at(n);
        let broken = broken(pods, cells, outcomes, &servers, server_outcomes);
        if !broken.is_empty() {
            return Err(NotConverged::Broken(format!(
                "{} probes refused or failed {} after the change (pass {passes}):\n{}",
                broken.len(),
                seconds(began),
                broken.join("\n")
            )));
        }
        if outcomes.iter().zip(expected).all(|(o, e)| o.agrees(*e)) {
            let dead = not_shown_alive(&need, cells, outcomes, &servers, server_outcomes);
            if dead.is_empty() {
                return Ok(Converged {
                    after: began,
                    passes,
                    outcomes: outcomes.to_vec(),
                });
            }
            let dead: Vec<String> = dead.iter().map(|s| pods.describe_server(*s)).collect();
            return Err(NotConverged::Broken(format!(
                "the matrix equals the expectation {} after the change (pass {passes}), but \
                 no probe of that pass reached these servers of denied probes (nor their \
                 node): {}",
                seconds(began),
                dead.join(", ")
            )));
        } else if last {
            return Err(NotConverged::Differs {
                passes,
                outcomes: outcomes.to_vec(),
            });
        }
        if let Some(rest) = Duration::from_millis(20).checked_sub(pass.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

/// Fails the test with every failure a test gathered (it goes on past the first, so one
/// run shows them all), each as a paragraph.
#[track_caller]
pub fn assert_no_failures(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// A duration in seconds, for messages.
pub fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}
