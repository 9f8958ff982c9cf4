//! HTTP probes of a local endpoint inside a test namespace, as kubelet's probes and a
//! Prometheus scraper would make them: a new TCP connection per request, `GET` with
//! HTTP/1.0 (so the answer is the body up to the connection's end, never chunked), and
//! the time from connecting to the whole answer. [`get`] makes one; [`Prober`] makes one
//! every few milliseconds on a thread of its own until it is stopped.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::hostport::in_netns;

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status code (200, 503, ...).
    pub status: u16,
    /// The body, as text.
    pub body: String,
    /// From the start of the connect to the end of the answer.
    pub took: Duration,
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?} (in {:?})", self.status, self.body, self.took)
    }
}

/// `GET path` from `addr` in the netns at `netns`; `within` bounds the connect and
/// every read and write.
pub fn get(netns: &Path, addr: SocketAddr, path: &str, within: Duration) -> Result<Answer, String> {
    let path = path.to_owned();
    in_netns(netns, move || request(addr, &path, within))
}

/// One request in this thread's netns.
pub fn request(addr: SocketAddr, path: &str, within: Duration) -> Result<Answer, String> {
    let start = Instant::now();
    let mut stream =
        TcpStream::connect_timeout(&addr, within).map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(within))
        .and_then(|()| stream.set_write_timeout(Some(within)))
        .map_err(|e| format!("{addr}: {e}"))?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\n\r\n").as_bytes())
        .map_err(|e| format!("GET {path} from {addr}: write: {e}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("GET {path} from {addr}: read: {e}"))?;
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET {path} from {addr}: no end of headers in {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .filter(|_| head.starts_with("HTTP/"))
        .ok_or_else(|| format!("GET {path} from {addr}: no status line in {head:?}"))?;
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding") && v.trim() == "chunked"
        })
    });
    let body = if chunked {
        dechunk(body).ok_or_else(|| format!("GET {path} from {addr}: bad chunks in {body:?}"))?
    } else {
        body.to_owned()
    };
    Ok(Answer { status, body, took })
}

/// A chunked body's content (an HTTP/1.0 request should never get one, but a server may
/// send it anyway).
fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// One probe of a [`Prober`].
#[derive(Debug, Clone)]
pub struct Probe {
    /// When it started, from the prober's start.
    pub at: Duration,
    /// The answer, or why there was none.
    pub outcome: Result<Answer, String>,
}

/// Probes `GET path` every `every` (a new connection each time) from a thread that lives
/// in the netns, until [`Prober::finish`].
#[derive(Debug)]
pub struct Prober {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    handle: Option<JoinHandle<Vec<Probe>>>,
}

impl Prober {
    /// Starts probing at once. `within` bounds each probe (an answer later than that is
    /// an error, so keep it above what the test asserts).
    pub fn start(
        netns: &Path,
        addr: SocketAddr,
        path: &str,
        every: Duration,
        within: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let answered = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&answered);
        let netns: PathBuf = netns.to_path_buf();
        let path = path.to_owned();
        let handle = std::thread::spawn(move || {
            let file =
                File::open(&netns).unwrap_or_else(|e| panic!("open {}: {e}", netns.display()));
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns {}: {e}", netns.display()));
            let start = Instant::now();
            let mut probes = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let at = start.elapsed();
                let outcome = request(addr, &path, within);
                if outcome.is_ok() {
                    count.fetch_add(1, Ordering::Relaxed);
                }
                probes.push(Probe { at, outcome });
                if let Some(left) = (at + every).checked_sub(start.elapsed()) {
                    std::thread::sleep(left);
                }
            }
            probes
        });
        Self {
            stop,
            answered,
            handle: Some(handle),
        }
    }

    /// How many probes got an answer so far.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::Relaxed)
    }

    /// Stops and returns every probe, in order.
    pub fn finish(mut self) -> Vec<Probe> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .map(|h| h.join().unwrap_or_else(|_| panic!("the prober panicked")))
            .unwrap_or_default()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk("5\r\nhello\r\n7;x=1\r\n world\n\r\n0\r\n\r\n").as_deref(),
            Some("hello world\n")
        );
        assert_eq!(dechunk("5\r\nhel"), None);
    }

    #[test]
    fn a_request_over_tcp() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 256];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"GET /readyz HTTP/1.0\r\n"));
            s.write_all(
                b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 9\r\n\r\nhost: x\n\n",
            )
            .unwrap();
        });
        let answer = request(addr, "/readyz", Duration::from_secs(5)).unwrap();
        server.join().unwrap();
        assert_eq!(answer.status, 503);
        assert_eq!(answer.body, "host: x\n\n");
    }
}
