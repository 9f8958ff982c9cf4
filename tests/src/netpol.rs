//! What NetworkPolicy tests need on the wire: servers in a pod that answer on TCP and UDP
//! ports of both families, and a prober that runs many probes at once with short
//! timeouts.
//!
//! A policy's denial is a drop, so a denied probe only ever times out; running the
//! probes one after the other would cost a timeout per denied pair. The prober instead
//! opens every probe's socket in its source namespace (a short-lived thread enters the
//! namespace and makes them; a socket stays in the namespace it was made in, whichever
//! thread uses it), starts them all (a non-blocking TCP connect, a UDP request), and
//! waits for all of them in one `poll` loop: a matrix of hundreds of probes takes about
//! one timeout.
//!
//! A TCP probe passes when the handshake completes; a UDP probe passes when the server
//! sends the request back (it is sent again every [`UDP_RESEND`] until then). A refusal
//! (a reset, an ICMP port unreachable) is told apart from silence: it means the packet
//! reached the pod (or something that answers for it), so a test can say "the server
//! was not running" rather than "the policy dropped it". [`Outcome::agrees`] is the
//! judgement tests use: a probe the policy allows must be answered, one it denies must
//! time out, and [`Outcome::broken`] (a refusal or an error) agrees with neither.
//!
//! A [`Sequence`] is a long-lived flow that shows drops too short for TCP to notice (a
//! TCP echo rides out any drop shorter than its retransmission timeout, 200 ms at
//! least): a numbered UDP datagram every [`SEQUENCE_INTERVAL`] to a [`Servers`] port,
//! which echoes it; a number without its echo is a loss.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    self, AddressFamily, SockFlag, SockProtocol, SockType, SockaddrStorage, sockopt,
};

use crate::hostport::in_netns;

/// How often an unanswered UDP request is sent again.
pub const UDP_RESEND: Duration = Duration::from_millis(100);

/// Most probes in flight at once (each holds a socket).
pub const MAX_IN_FLIGHT: usize = 1024;

/// The transport protocols probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// A TCP connect.
    Tcp,
    /// A UDP request and its answer.
    Udp,
}

impl Protocol {
    /// Both.
    pub const ALL: [Protocol; 2] = [Protocol::Tcp, Protocol::Udp];

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
        }
    }

    /// As NetworkPolicy spells it.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

/// Whether this kernel can open SCTP sockets (the module may be missing or blocked).
pub fn sctp_available() -> bool {
    socket::socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Sctp,
    )
    .is_ok()
}

/// TCP and UDP servers on some ports of both families (`[::]`, not V6ONLY) in one
/// namespace, served by one thread: TCP connections are accepted and echo what they
/// receive, UDP datagrams are sent back to their sender. Stopped (and every socket
/// closed) on drop.
#[derive(Debug)]
pub struct Servers {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Servers {
    /// Binds the servers in the namespace at `netns` and starts serving; panics if a
    /// port cannot be bound.
    pub fn start(netns: &Path, ports: &[u16]) -> Self {
        let ports = ports.to_vec();
        let name = netns.display().to_string();
        let (tcp, udp) = in_netns(netns, move || {
            let mut tcp = Vec::new();
            let mut udp = Vec::new();
            for port in ports {
                let addr = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
                let listener = TcpListener::bind(addr)
                    .unwrap_or_else(|e| panic!("{name}: bind TCP {addr}: {e}"));
                let socket = UdpSocket::bind(addr)
                    .unwrap_or_else(|e| panic!("{name}: bind UDP {addr}: {e}"));
                for result in [listener.set_nonblocking(true), socket.set_nonblocking(true)] {
                    result.unwrap_or_else(|e| panic!("{name}: non-blocking: {e}"));
                }
                tcp.push(listener);
                udp.push(socket);
            }
            (tcp, udp)
        });
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || serve(&tcp, &udp, &flag));
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(listeners: &[TcpListener], udp: &[UdpSocket], stop: &AtomicBool) {
    let mut connections: Vec<TcpStream> = Vec::new();
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd<'_>> = listeners
                .iter()
                .map(AsFd::as_fd)
                .chain(udp.iter().map(AsFd::as_fd))
                .chain(connections.iter().map(AsFd::as_fd))
                .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
                .collect();
            if let Err(e) = poll(&mut fds, PollTimeout::from(50u16))
                && e != Errno::EINTR
            {
                eprintln!("servers: poll: {e}");
                return;
            }
            fds.iter()
                .map(|fd| fd.revents().is_some_and(|r| !r.is_empty()))
                .collect()
        };
        let (ready_listeners, rest) = ready.split_at(listeners.len());
        let (ready_udp, ready_connections) = rest.split_at(udp.len());
        for (listener, _) in listeners.iter().zip(ready_listeners).filter(|(_, r)| **r) {
            while let Ok((stream, _)) = listener.accept() {
                if stream.set_nonblocking(true).is_ok() {
                    connections.push(stream);
                }
            }
        }
        for (socket, _) in udp.iter().zip(ready_udp).filter(|(_, r)| **r) {
            while let Ok((len, peer)) = socket.recv_from(&mut buf) {
                let _ = socket.send_to(&buf[..len], peer);
            }
        }
        let mut closed = vec![false; connections.len()];
        for (i, stream) in connections.iter_mut().enumerate() {
            if !ready_connections.get(i).copied().unwrap_or(false) {
                continue;
            }
            match stream.read(&mut buf) {
                Ok(0) => closed[i] = true,
                Ok(len) => {
                    if stream.write_all(&buf[..len]).is_err() {
                        closed[i] = true;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => closed[i] = true,
            }
        }
        let mut i = 0;
        connections.retain(|_| {
            i += 1;
            !closed[i - 1]
        });
    }
}

/// One probe: from a namespace to an address and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The source namespace's path.
    pub from: PathBuf,
    /// The destination.
    pub to: SocketAddr,
    /// TCP or UDP.
    pub protocol: Protocol,
}

/// How a probe ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The TCP handshake completed, or the UDP request came back.
    Answered,
    /// Refused: a reset or an ICMP port unreachable (the packet got through to
    /// something that answered no).
    Refused,
    /// Nothing came back in time (what a drop looks like).
    TimedOut,
    /// The probe could not be made (the error).
    Failed(String),
    /// Not settled when the run was cut short.
    Abandoned,
}

impl Outcome {
    /// Whether the probe got through.
    pub fn passed(&self) -> bool {
        *self == Outcome::Answered
    }

    /// Whether nothing came back: the only way a policy's denial shows. A refusal or an
    /// error is not one: something answered, or the probe never left.
    pub fn dropped(&self) -> bool {
        *self == Outcome::TimedOut
    }

    /// Whether the probe says the path is broken whatever the policy: refused (the
    /// server is not listening, or a router answered unreachable) or failed.
    pub fn broken(&self) -> bool {
        matches!(self, Outcome::Refused | Outcome::Failed(_))
    }

    /// Whether this is what a probe the policy allows (`allowed`) or drops must show.
    pub fn agrees(&self, allowed: bool) -> bool {
        if allowed {
            self.passed()
        } else {
            self.dropped()
        }
    }

    /// Short text for reports.
    pub fn word(&self) -> String {
        match self {
            Outcome::Answered => "answered".into(),
            Outcome::Refused => "refused".into(),
            Outcome::TimedOut => "timed out".into(),
            Outcome::Failed(e) => format!("failed ({e})"),
            Outcome::Abandoned => "abandoned".into(),
        }
    }
}

enum Flight {
    Tcp(OwnedFd),
    Udp {
        socket: UdpSocket,
        token: Vec<u8>,
        sent: Instant,
    },
}

/// Runs `probes` at once (at most [`MAX_IN_FLIGHT`] at a time), each bounded by
/// `timeout`. `settled(i, outcome)` is told each probe's outcome as it comes; when it
/// returns true, the run stops and every probe not settled yet is
/// [`Outcome::Abandoned`]. Outcomes come back in the probes' order.
pub fn run(
    probes: &[Probe],
    timeout: Duration,
    mut settled: impl FnMut(usize, &Outcome) -> bool,
) -> Vec<Outcome> {
    let mut outcomes = vec![Outcome::Abandoned; probes.len()];
    let mut stopped = false;
    let mut start = 0;
    while start < probes.len() && !stopped {
        let end = (start + MAX_IN_FLIGHT).min(probes.len());
        stopped = run_chunk(probes, start..end, timeout, &mut outcomes, &mut settled);
        start = end;
    }
    outcomes
}

fn run_chunk(
    probes: &[Probe],
    range: std::ops::Range<usize>,
    timeout: Duration,
    outcomes: &mut [Outcome],
    settled: &mut impl FnMut(usize, &Outcome) -> bool,
) -> bool {
    // Sockets, made in their sources' namespaces.
    let mut by_source: BTreeMap<&Path, Vec<usize>> = BTreeMap::new();
    for i in range {
        by_source.entry(&probes[i].from).or_default().push(i);
    }
    let mut sockets: Vec<(usize, Result<OwnedFd, Errno>)> = Vec::new();
    for (from, indices) in by_source {
        let kinds: Vec<(bool, Protocol)> = indices
            .iter()
            .map(|&i| (probes[i].to.is_ipv4(), probes[i].protocol))
            .collect();
        let made = in_netns(from, move || {
            kinds
                .into_iter()
                .map(|(v4, protocol)| {
                    socket::socket(
                        if v4 {
                            AddressFamily::Inet
                        } else {
                            AddressFamily::Inet6
                        },
                        match protocol {
                            Protocol::Tcp => SockType::Stream,
                            Protocol::Udp => SockType::Datagram,
                        },
                        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                        None,
                    )
                })
                .collect::<Vec<_>>()
        });
        sockets.extend(indices.into_iter().zip(made));
    }
    // Every probe started.
    let mut flights: Vec<(usize, Flight)> = Vec::new();
    let mut stop = false;
    let mut settle = |i: usize, outcome: Outcome, outcomes: &mut [Outcome]| {
        let cut = settled(i, &outcome);
        outcomes[i] = outcome;
        cut
    };
    for (i, fd) in sockets {
        if stop {
            break;
        }
        let fd = match fd {
            Ok(fd) => fd,
            Err(e) => {
                stop |= settle(i, Outcome::Failed(format!("socket: {e}")), outcomes);
                continue;
            }
        };
        let to = probes[i].to;
        match probes[i].protocol {
            Protocol::Tcp => match socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(to)) {
                Ok(()) => stop |= settle(i, Outcome::Answered, outcomes),
                Err(Errno::EINPROGRESS) => flights.push((i, Flight::Tcp(fd))),
                Err(e) => stop |= settle(i, errno_outcome(e), outcomes),
            },
            Protocol::Udp => {
                let socket = UdpSocket::from(fd);
                let token = format!("probe {i} {:?}", Instant::now()).into_bytes();
                match socket.connect(to).and_then(|()| socket.send(&token)) {
                    Ok(_) => flights.push((
                        i,
                        Flight::Udp {
                            socket,
                            token,
                            sent: Instant::now(),
                        },
                    )),
                    Err(e) => stop |= settle(i, io_outcome(&e), outcomes),
                }
            }
        }
    }
    // Waiting for them all.
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 256];
    while !stop && !flights.is_empty() {
        let now = Instant::now();
        // Past the deadline, one last look without waiting before the rest time out:
        // an answer that came while this thread was not running (a busy machine can
        // hold it off for longer than the whole timeout) is an answer.
        let last_look = now >= deadline;
        let wait = deadline.saturating_duration_since(now).min(UDP_RESEND / 2);
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd<'_>> = flights
                .iter()
                .map(|(_, f)| match f {
                    Flight::Tcp(fd) => PollFd::new(fd.as_fd(), PollFlags::POLLOUT),
                    Flight::Udp { socket, .. } => PollFd::new(socket.as_fd(), PollFlags::POLLIN),
                })
                .collect();
            let millis = if last_look {
                0
            } else {
                u16::try_from(wait.as_millis().max(1)).unwrap_or(u16::MAX)
            };
            match poll(&mut fds, PollTimeout::from(millis)) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => panic!("poll: {e}"),
            }
            fds.iter()
                .map(|fd| fd.revents().is_some_and(|r| !r.is_empty()))
                .collect()
        };
        let mut done: Vec<(usize, Outcome)> = Vec::new();
        for ((i, flight), ready) in flights.iter_mut().zip(&ready) {
            match flight {
                Flight::Tcp(fd) if *ready => {
                    let outcome = match socket::getsockopt(fd, sockopt::SocketError) {
                        Ok(0) => Outcome::Answered,
                        Ok(errno) => errno_outcome(Errno::from_raw(errno)),
                        Err(e) => Outcome::Failed(format!("SO_ERROR: {e}")),
                    };
                    done.push((*i, outcome));
                }
                Flight::Tcp(_) => {}
                Flight::Udp {
                    socket,
                    token,
                    sent,
                } => {
                    if *ready {
                        match socket.recv(&mut buf) {
                            Ok(len) if buf[..len] == token[..] => {
                                done.push((*i, Outcome::Answered));
                                continue;
                            }
                            Ok(_) => {}
                            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                            Err(e) => {
                                done.push((*i, io_outcome(&e)));
                                continue;
                            }
                        }
                    }
                    if !last_look && sent.elapsed() >= UDP_RESEND {
                        *sent = Instant::now();
                        if let Err(e) = socket.send(token)
                            && e.kind() != ErrorKind::WouldBlock
                        {
                            done.push((*i, io_outcome(&e)));
                        }
                    }
                }
            }
        }
        for (i, outcome) in done {
            flights.retain(|(j, _)| *j != i);
            if settle(i, outcome, outcomes) {
                return true;
            }
        }
        if last_look {
            for (i, _) in flights.drain(..) {
                if settle(i, Outcome::TimedOut, outcomes) {
                    return true;
                }
            }
        }
    }
    stop
}

fn errno_outcome(e: Errno) -> Outcome {
    match e {
        Errno::ECONNREFUSED | Errno::ECONNRESET => Outcome::Refused,
        e => Outcome::Failed(e.desc().to_owned()),
    }
}

fn io_outcome(e: &std::io::Error) -> Outcome {
    match e.kind() {
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset => Outcome::Refused,
        _ => Outcome::Failed(e.to_string()),
    }
}

/// How often a [`Sequence`] sends a datagram: well under TCP's shortest retransmission
/// timeout (200 ms), so a drop too short for a TCP echo to notice still loses some.
pub const SEQUENCE_INTERVAL: Duration = Duration::from_millis(10);

/// How long [`Sequence::finish`] waits for the echoes of the last datagrams.
pub const SEQUENCE_DRAIN: Duration = Duration::from_millis(500);

/// A UDP flow that does not rely on retransmission to hide a drop: a numbered datagram
/// every [`SEQUENCE_INTERVAL`] from a namespace to a [`Servers`] port, which echoes it;
/// a number whose echo never comes back was lost on the way there or back. The flow
/// keeps one source port, so after its first echo conntrack holds it as established,
/// like a long-lived connection.
#[derive(Debug)]
pub struct Sequence {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Datagram>>>,
}

/// One datagram of a [`Sequence`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram {
    /// When it was sent.
    pub sent: Instant,
    /// When its echo came back, if it did.
    pub echoed: Option<Instant>,
}

impl Sequence {
    /// Starts sending from the namespace at `from` to `to`; the socket's errors
    /// (a refusal included) end the flow early, which shows as lost datagrams.
    pub fn start(from: &Path, to: SocketAddr) -> std::io::Result<Self> {
        let socket = in_netns(from, move || {
            let any: SocketAddr = if to.is_ipv4() {
                (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let socket = UdpSocket::bind(any)?;
            socket.connect(to)?;
            socket.set_read_timeout(Some(SEQUENCE_INTERVAL / 4))?;
            Ok::<_, std::io::Error>(socket)
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || sequence(&socket, &flag));
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops sending, waits [`SEQUENCE_DRAIN`] for the last echoes, and returns every
    /// datagram sent, in order.
    pub fn finish(mut self) -> Vec<Datagram> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Sequence {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn sequence(socket: &UdpSocket, stop: &AtomicBool) -> Vec<Datagram> {
    let mut sent: Vec<Datagram> = Vec::new();
    let mut next = Instant::now();
    let mut stopped: Option<Instant> = None;
    let mut buf = [0u8; 64];
    loop {
        let now = Instant::now();
        if stopped.is_none() && stop.load(Ordering::Relaxed) {
            stopped = Some(now);
        }
        match stopped {
            Some(at) if now >= at + SEQUENCE_DRAIN => break,
            Some(_) => {}
            None if now >= next => {
                let number = sent.len() as u64;
                sent.push(Datagram {
                    sent: now,
                    echoed: None,
                });
                // A send error is a loss like any other: the datagram's echo never
                // comes.
                let _ = socket.send(&number.to_be_bytes());
                next += SEQUENCE_INTERVAL;
            }
            None => {}
        }
        match socket.recv(&mut buf) {
            Ok(8) => {
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(&buf[..8]);
                let number = u64::from_be_bytes(bytes);
                if let Some(datagram) = usize::try_from(number).ok().and_then(|n| sent.get_mut(n)) {
                    datagram.echoed.get_or_insert_with(Instant::now);
                }
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            // A refusal (ICMP port unreachable) arrives as an error on the next call;
            // the datagrams it concerns are lost, the flow goes on.
            Err(_) => {}
        }
    }
    sent
}

/// A TCP connection from the namespace at `from` to `to` (bounded by `timeout`), for
/// tests that keep a connection open.
pub fn connect_from(from: &Path, to: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    in_netns(from, move || TcpStream::connect_timeout(&to, timeout))
}
