//! TCP between two namespaces: short connections timed one by one, what a new
//! connection costs on a path (the NetworkPolicy benchmark compares a node without
//! policies with one holding a thousand); and one long stream's throughput, what a
//! path carries (the overlay and encryption benchmarks).
//!
//! The server accepts and closes at once; the client connects and reads until the
//! server's close arrives. One connection is timed from the client's `connect` to
//! that end of file: the handshake (SYN, SYN-ACK, ACK), the server's accept, and its
//! FIN. Each connection is a new conntrack entry, so each SYN goes through every
//! hook's rules as a new connection would.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::hostport::in_netns;

/// Listens on `addr` in the namespace at `netns` and closes every connection as soon
/// as it is accepted, for as long as the process runs, on a thread pinned to
/// [`timing_cpu`].
pub fn serve_and_close(netns: &Path, addr: SocketAddr) {
    let listener = in_netns(netns, move || {
        TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"))
    });
    std::thread::spawn(move || {
        // Without the pin the comparison would not be fair: stop serving, and say why,
        // rather than time connections to an unpinned server.
        if let Err(e) = pin_to_timing_cpu() {
            panic!("the server at {addr} cannot be pinned: {e}");
        }
        for stream in listener.incoming() {
            drop(stream);
        }
    });
}

/// The CPU that the client and server threads of timed connections all run on: the
/// last this process may use. Two setups compared side by side so share one placement;
/// left to the scheduler, a side whose client and server happened to share a CPU would
/// be faster for the whole run than one whose two threads did not.
pub fn timing_cpu() -> Result<usize, String> {
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map_err(|e| format!("sched_getaffinity: {e}"))?;
    (0..nix::sched::CpuSet::count())
        .rev()
        .find(|&cpu| allowed.is_set(cpu).unwrap_or(false))
        .ok_or_else(|| "no CPU is allowed".to_string())
}

/// Pins the calling thread to [`timing_cpu`].
fn pin_to_timing_cpu() -> Result<(), String> {
    let mut set = nix::sched::CpuSet::new();
    set.set(timing_cpu()?).map_err(|e| e.to_string())?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| format!("sched_setaffinity: {e}"))
}

/// A thread that stays in one namespace, pinned to [`timing_cpu`], and times
/// connections from it when asked. A benchmark can so alternate two namespaces in
/// rounds of a few connections: rounds shorter than the machine's bursts of other work
/// (a timer, a kernel worker) let both sides see the same bursts.
#[derive(Debug)]
pub struct ConnectionTimer {
    asks: Option<mpsc::Sender<usize>>,
    answers: mpsc::Receiver<Result<Vec<Duration>, String>>,
    thread: Option<JoinHandle<()>>,
}

impl ConnectionTimer {
    /// The thread, entered into the namespace at `netns`, connecting to `to`.
    pub fn start(netns: &Path, to: SocketAddr) -> Self {
        let file = File::open(netns).unwrap_or_else(|e| panic!("open {}: {e}", netns.display()));
        let (asks, asked) = mpsc::channel::<usize>();
        let (answer, answers) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let entered = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("setns: {e}"))
                .and_then(|()| pin_to_timing_cpu());
            for count in asked {
                let times = entered.clone().and_then(|()| time_from_here(to, count));
                if answer.send(times).is_err() {
                    return;
                }
            }
        });
        Self {
            asks: Some(asks),
            answers,
            thread: Some(thread),
        }
    }

    /// `count` connections, one after the other; each one's time, or the first failure.
    pub fn time(&self, count: usize) -> Result<Vec<Duration>, String> {
        self.asks
            .as_ref()
            .and_then(|asks| asks.send(count).ok())
            .ok_or("the timing thread is gone")?;
        self.answers
            .recv()
            .map_err(|_| "the timing thread is gone".to_string())?
    }
}

impl Drop for ConnectionTimer {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        self.asks.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `count` connections to `to` from the calling thread's namespace.
fn time_from_here(to: SocketAddr, count: usize) -> Result<Vec<Duration>, String> {
    let mut times = Vec::with_capacity(count);
    let mut buf = [0u8; 16];
    for i in 0..count {
        let start = Instant::now();
        let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(2))
            .map_err(|e| format!("connection {i} to {to}: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        match stream.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => return Err(format!("connection {i} to {to}: {n} bytes, not a close")),
            Err(e) => return Err(format!("connection {i} to {to}: read: {e}")),
        }
        times.push(start.elapsed());
    }
    Ok(times)
}

/// Whether a connection from `netns` to `to` is established within `within`: `Err`
/// tells refused (something answered) from timed out (dropped on the way).
pub fn try_connect(netns: &Path, to: SocketAddr, within: Duration) -> Result<(), String> {
    in_netns(netns, move || {
        TcpStream::connect_timeout(&to, within)
            .map(drop)
            .map_err(|e| format!("{:?}", e.kind()))
    })
}

/// A TCP connection from the namespace at `from` to a listener in the one at `to` on
/// `ip`, with Nagle off on both ends: (client, server side).
pub fn tcp_pair(from: &Path, to: &Path, ip: IpAddr) -> (TcpStream, TcpStream) {
    let listener = in_netns(to, move || {
        TcpListener::bind(SocketAddr::new(ip, 0)).unwrap_or_else(|e| panic!("bind {ip}: {e}"))
    });
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local_addr: {e}"));
    let client = in_netns(from, move || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"))
    });
    let (server, _) = listener.accept().unwrap_or_else(|e| panic!("accept: {e}"));
    for s in [&client, &server] {
        s.set_nodelay(true)
            .unwrap_or_else(|e| panic!("nodelay: {e}"));
    }
    (client, server)
}

/// One TCP stream from the namespace at `from` to `ip` in the one at `to` for `secs`:
/// bits per second as the receiver counted. Panics if no byte crossed.
pub fn tcp_throughput(from: &Path, to: &Path, ip: IpAddr, secs: u64) -> f64 {
    let (mut client, mut server) = tcp_pair(from, to, ip);
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        let start = Instant::now();
        loop {
            match server.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n as u64,
            }
        }
        (total, start.elapsed())
    });
    let chunk = vec![0x5au8; 128 * 1024];
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        if client.write_all(&chunk).is_err() {
            break;
        }
    }
    drop(client);
    let (bytes, took) = reader
        .join()
        .unwrap_or_else(|_| panic!("the reader panicked"));
    assert!(bytes > 0, "no byte crossed to {ip}");
    bytes as f64 * 8.0 / took.as_secs_f64()
}
