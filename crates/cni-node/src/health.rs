//! The local endpoint the DaemonSet's probes and a Prometheus scraper call:
//! `/healthz` (the reconciler is turning), `/readyz` (the last reconciliation succeeded
//! in every step, or what failed) and `/metrics`. It runs on the async runtime, never
//! on the reconciler's thread, so it answers at once whatever the reconciler is doing.
//! A few lines of HTTP/1.0 are all a probe needs, so no server framework.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::error::chain;
use crate::metrics::{self, Metrics};
use crate::policy::explain::Question;
use crate::store::Stores;

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

    /// Status line, content type and body for a request path and query; `/explain`
    /// reads the stores.
    fn answer_with(
        &self,
        path: &str,
        query: &str,
        metrics: &Metrics,
        stores: Option<&Stores>,
    ) -> (&'static str, &'static str, String) {
        const TEXT: &str = "text/plain; charset=utf-8";
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
            "/explain" => explain(query, stores),
            "/metrics" => match metrics.encode() {
                Ok(text) => (OK, metrics::CONTENT_TYPE, text),
                Err(e) => ("500 Internal Server Error", TEXT, chain(&e) + "\n"),
            },
            _ => (
                "404 Not Found",
                TEXT,
                "try /healthz, /readyz, /metrics or /explain\n".into(),
            ),
        }
    }

    /// `/readyz` without what is only watched.
    fn readyz(&self) -> (&'static str, &'static str, String) {
        const TEXT: &str = "text/plain; charset=utf-8";
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

/// `/explain?from=..&to=..&protocol=..&port=..[&ipv6=1][&via_service=..]`: 200 with the explanation
/// (its first word `allowed` or `denied`), 400 for a bad question, 503 before the
/// agent's NetworkPolicy view is complete.
fn explain(query: &str, stores: Option<&Stores>) -> (&'static str, &'static str, String) {
    const TEXT: &str = "text/plain; charset=utf-8";
    let snapshot = stores
        .and_then(Stores::snapshot)
        .and_then(|s| s.policy.network_policy.ready().cloned());
    let Some(snapshot) = snapshot else {
        return (
            "503 Service Unavailable",
            TEXT,
            "the agent has no complete view of Pods, Namespaces and NetworkPolicies yet \
             (or does not enforce NetworkPolicy)\n"
                .into(),
        );
    };
    let question = Question::from_query(query);
    let Some(question) = question else {
        return (
            "400 Bad Request",
            TEXT,
            "usage: /explain?from=POD|IP&to=POD|IP&protocol=TCP&port=N[&ipv6=1][&via_service=IP]\n"
                .into(),
        );
    };
    let records = stores
        .and_then(|s| s.records_dir.as_deref())
        .map(crate::host::pod_records)
        .unwrap_or_default();
    match crate::policy::explain::explain(&snapshot, records, &question) {
        Ok((_, text)) => ("200 OK", TEXT, text),
        Err(why) => ("400 Bad Request", TEXT, chain(&why) + "\n"),
    }
}

/// Serves probes, metrics and `/explain` on `listener` until the runtime stops.
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
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                respond(stream, &health, &metrics, &stores),
            )
            .await;
        });
    }
}

async fn respond(
    mut stream: TcpStream,
    health: &Health,
    metrics: &Metrics,
    stores: &Stores,
) -> std::io::Result<()> {
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
    let (method, path) = (words.next(), words.next());
    let (status, content_type, body) = match (method, path) {
        (Some("GET" | "HEAD"), Some(target)) => {
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            health.answer_with(path, query, metrics, Some(stores))
        }
        _ => (
            "400 Bad Request",
            "text/plain",
            "GET /healthz, /readyz or /metrics\n".into(),
        ),
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

    #[test]
    fn ready_only_while_the_last_reconcile_succeeded() {
        let h = Health::new(Duration::from_secs(30));
        let m = Metrics::new();
        assert_eq!(h.answer_with("/healthz", "", &m, None).0, "200 OK");
        let (status, _, body) = h.answer_with("/readyz", "", &m, None);
        assert_eq!(status, "503 Service Unavailable");
        assert!(body.contains("waiting for the first list"), "{body}");
        h.set(Readiness::Ready);
        assert_eq!(h.answer_with("/readyz", "", &m, None).2, "ready\n");
        h.set(Readiness::NotReady(vec![
            ("conflist", "cannot write /x: Permission denied".into()),
            ("egress", "nft said no".into()),
        ]));
        let (status, _, body) = h.answer_with("/readyz", "", &m, None);
        assert_eq!(status, "503 Service Unavailable");
        assert_eq!(
            body,
            "conflist: cannot write /x: Permission denied\negress: nft said no\n"
        );
        h.heartbeat.store(0, Ordering::Relaxed);
        assert_eq!(
            h.answer_with("/healthz", "", &m, None).0,
            "503 Service Unavailable"
        );
        assert_eq!(h.answer_with("/", "", &m, None).0, "404 Not Found");
        let (status, content_type, body) = h.answer_with("/metrics", "", &m, None);
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
    }
}
