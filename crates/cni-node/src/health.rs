//! The local endpoint the DaemonSet's probes and a Prometheus scraper call:
//! `/healthz` (the reconciler is turning), `/readyz` (the last reconciliation succeeded
//! in every step, or what failed) and `/metrics`. It runs on the async runtime, never
//! on the reconciler's thread, so it answers at once whatever the reconciler is doing;
//! the one kernel read, `/metrics`' policy verdict counters, runs on a blocking thread.
//! A few lines of HTTP/1.0 are all a probe needs, so no server framework; the explain
//! socket speaks the same ([`respond`]). Whatever reaches the health address (any pod,
//! in the DaemonSet) reads it, so it holds counts and failures, never `explain`'s
//! answers, which name pods and policies ([`crate::explain_socket`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::error::chain;
use crate::metrics::{self, Metrics};
use crate::store::Stores;

/// An answer: status line, content type, body.
pub type Reply = (&'static str, &'static str, String);

/// The content type of the text answers.
pub const TEXT: &str = "text/plain; charset=utf-8";

/// What `/explain` on the health address says instead of an answer.
pub const EXPLAIN_MOVED: &str = "explain is not served here: run `cni-node explain` as root \
in the agent's pod or on its node, which asks the agent's --explain-socket\n";

/// Where the agent stands, as `/readyz` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// No complete list of Nodes yet.
    WaitingForList,
    /// The last reconciliation succeeded in every step.
    Ready,
    /// The last reconciliation failed in these steps, or could not run them yet for
    /// want of a complete view: `(step, why)`.
    NotReady(Vec<(&'static str, String)>),
}

/// What the probes see.
#[derive(Debug)]
pub struct Health {
    readiness: Mutex<Readiness>,
    heartbeat: AtomicU64,
    stale_after: Duration,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Health {
    /// Alive for `stale_after` after each [`Health::beat`]; not ready.
    pub fn new(stale_after: Duration) -> Arc<Self> {
        Arc::new(Self {
            readiness: Mutex::new(Readiness::WaitingForList),
            heartbeat: AtomicU64::new(now_secs()),
            stale_after,
        })
    }

    /// The reconciler is turning.
    pub fn beat(&self) {
        self.heartbeat.store(now_secs(), Ordering::Relaxed);
    }

    /// Records the outcome of a reconciliation (or that none can run yet).
    pub fn set(&self, readiness: Readiness) {
        *self
            .readiness
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = readiness;
    }

    /// The current readiness.
    pub fn readiness(&self) -> Readiness {
        self.readiness
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn alive(&self) -> bool {
        now_secs().saturating_sub(self.heartbeat.load(Ordering::Relaxed))
            <= self.stale_after.as_secs()
    }

    /// Status line, content type and body for a request path; `stores` adds what is
    /// watched but not enforced to a 200 `/readyz`.
    fn answer(&self, path: &str, metrics: &Metrics, stores: Option<&Stores>) -> Reply {
        const OK: &str = "200 OK";
        const UNAVAILABLE: &str = "503 Service Unavailable";
        match path {
            "/healthz" | "/livez" if self.alive() => (OK, TEXT, "ok\n".into()),
            "/healthz" | "/livez" => (
                UNAVAILABLE,
                TEXT,
                "the reconciler has not turned for too long\n".into(),
            ),
            "/readyz" => {
                let (status, kind, mut body) = self.readyz();
                // What is watched but not enforced, said where readiness is read: after
                // `ready` (a 503's lines are the failing steps, one each).
                let cluster = stores
                    .filter(|_| status == OK)
                    .and_then(|s| s.policy.cluster_network_policy.as_ref())
                    .and_then(crate::policy::cluster_network_policy::Stores::status);
                if let Some(line) = cluster {
                    body.push_str(&line);
                    body.push('\n');
                }
                (status, kind, body)
            }
            "/metrics" => match metrics.encode() {
                Ok(text) => (OK, metrics::CONTENT_TYPE, text),
                Err(e) => ("500 Internal Server Error", TEXT, chain(&e) + "\n"),
            },
            "/explain" => ("404 Not Found", TEXT, EXPLAIN_MOVED.into()),
            _ => (
                "404 Not Found",
                TEXT,
                "try /healthz, /readyz or /metrics\n".into(),
            ),
        }
    }

    /// `/readyz` without what is only watched.
    fn readyz(&self) -> Reply {
        const OK: &str = "200 OK";
        const UNAVAILABLE: &str = "503 Service Unavailable";
        match self.readiness() {
            Readiness::Ready => (OK, TEXT, "ready\n".into()),
            Readiness::WaitingForList => (
                UNAVAILABLE,
                TEXT,
                "waiting for the first list of Nodes from the API\n".into(),
            ),
            Readiness::NotReady(failures) => {
                let body = failures
                    .iter()
                    .map(|(step, error)| format!("{step}: {error}\n"))
                    .collect();
                (UNAVAILABLE, TEXT, body)
            }
        }
    }
}

/// Serves probes and metrics on `listener` until the runtime stops.
pub async fn serve(
    listener: TcpListener,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    stores: Arc<Stores>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, say: wait a little instead of spinning on it.
                tracing::warn!("health endpoint: cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let health = Arc::clone(&health);
        let metrics = Arc::clone(&metrics);
        let stores = Arc::clone(&stores);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                let mut stream = stream;
                let request = read_request(&mut stream).await?;
                if request.path() == Some("/metrics") {
                    // The verdict counters are read from the kernel, which blocks.
                    let reader = Arc::clone(&metrics);
                    if let Ok(Err(why)) =
                        tokio::task::spawn_blocking(move || reader.refresh_verdicts()).await
                    {
                        tracing::warn!("/metrics: cannot read the policy verdict counters: {why}");
                    }
                }
                reply(
                    stream,
                    &request,
                    "GET /healthz, /readyz or /metrics",
                    |path, _| health.answer(path, &metrics, Some(&stores)),
                )
                .await
            })
            .await;
        });
    }
}

/// Reads one request from `stream` and writes `answer(path, query)`'s reply, or a 400
/// naming `usage` for a request that is not a GET or HEAD.
pub async fn respond<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    usage: &str,
    answer: impl FnOnce(&str, &str) -> Reply,
) -> std::io::Result<()> {
    let request = read_request(&mut stream).await?;
    reply(stream, &request, usage, answer).await
}

/// A request's method and target (path and query), as far as they were read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    method: Option<String>,
    target: Option<String>,
}

impl Request {
    /// The path of a GET or HEAD.
    pub fn path(&self) -> Option<&str> {
        let target = self.target.as_deref()?;
        matches!(self.method.as_deref(), Some("GET" | "HEAD"))
            .then(|| target.split_once('?').map_or(target, |(path, _)| path))
    }
}

/// Reads the request line from `stream`.
pub async fn read_request<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Request> {
    let mut buf = [0u8; 1024];
    let mut len = 0;
    // The request line is all we need; stop at its end or when the buffer is full.
    while len < buf.len() && !buf[..len].contains(&b'\n') {
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            break;
        }
        len += n;
    }
    let request = String::from_utf8_lossy(&buf[..len]);
    let mut words = request.split_whitespace();
    Ok(Request {
        method: words.next().map(str::to_owned),
        target: words.next().map(str::to_owned),
    })
}

/// Writes `answer(path, query)`'s reply to `request`, or a 400 naming `usage` for a
/// request that is not a GET or HEAD.
pub async fn reply<S: AsyncWrite + Unpin>(
    mut stream: S,
    request: &Request,
    usage: &str,
    answer: impl FnOnce(&str, &str) -> Reply,
) -> std::io::Result<()> {
    let method = request.method.as_deref();
    let (status, content_type, body) = match (method, request.target.as_deref()) {
        (Some("GET" | "HEAD"), Some(target)) => {
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            answer(path, query)
        }
        _ => ("400 Bad Request", "text/plain", format!("{usage}\n")),
    };
    let mut reply = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    if method != Some("HEAD") {
        reply.push_str(&body);
    }
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    #[test]
    fn ready_only_while_the_last_reconcile_succeeded() {
        let h = Health::new(Duration::from_secs(30));
        let m = Metrics::new();
        assert_eq!(h.answer("/healthz", &m, None).0, "200 OK");
        let (status, _, body) = h.answer("/readyz", &m, None);
        assert_eq!(status, "503 Service Unavailable");
        assert!(body.contains("waiting for the first list"), "{body}");
        h.set(Readiness::Ready);
        assert_eq!(h.answer("/readyz", &m, None).2, "ready\n");
        h.set(Readiness::NotReady(vec![
            ("conflist", "cannot write /x: Permission denied".into()),
            ("egress", "nft said no".into()),
        ]));
        let (status, _, body) = h.answer("/readyz", &m, None);
        assert_eq!(status, "503 Service Unavailable");
        assert_eq!(
            body,
            "conflist: cannot write /x: Permission denied\negress: nft said no\n"
        );
        h.heartbeat.store(0, Ordering::Relaxed);
        assert_eq!(h.answer("/healthz", &m, None).0, "503 Service Unavailable");
        assert_eq!(h.answer("/", &m, None).0, "404 Not Found");
        let (status, content_type, body) = h.answer("/metrics", &m, None);
        assert_eq!((status, content_type), ("200 OK", metrics::CONTENT_TYPE));
        assert!(
            body.contains("# TYPE cni_node_reconciles counter"),
            "{body}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_probe_over_tcp() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let h = Health::new(Duration::from_secs(30));
        h.set(Readiness::Ready);
        tokio::spawn(serve(
            listener,
            Arc::clone(&h),
            Arc::new(Metrics::new()),
            Arc::new(Stores::default()),
        ));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.0 200 OK\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nready\n"), "{out}");
        // Explain's answers name pods and policies: not on an address any pod reaches.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /explain?from=x/a&to=y/b&port=80 HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.0 404 Not Found\r\n"), "{out}");
        assert!(out.ends_with(EXPLAIN_MOVED), "{out}");
    }
}
