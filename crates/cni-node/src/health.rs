//! The local health endpoint the DaemonSet's probes call: `/healthz` (the main loop is
//! turning) and `/readyz` (the first sync with the API is done and applied). A few
//! lines of HTTP/1.0 are all a probe needs, so no server framework.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the probes see.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    heartbeat: AtomicU64,
    stale_after: Duration,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Health {
    /// Alive for `stale_after` after each [`Health::beat`].
    pub fn new(stale_after: Duration) -> Arc<Self> {
        Arc::new(Self {
            ready: AtomicBool::new(false),
            heartbeat: AtomicU64::new(now_secs()),
            stale_after,
        })
    }

    /// The main loop is turning.
    pub fn beat(&self) {
        self.heartbeat.store(now_secs(), Ordering::Relaxed);
    }

    /// The first sync is applied.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    fn alive(&self) -> bool {
        now_secs().saturating_sub(self.heartbeat.load(Ordering::Relaxed))
            <= self.stale_after.as_secs()
    }

    /// Status line and body for a request path.
    fn answer(&self, path: &str) -> (&'static str, &'static str) {
        match path {
            "/healthz" | "/livez" if self.alive() => ("200 OK", "ok\n"),
            "/healthz" | "/livez" => ("503 Service Unavailable", "the main loop is stuck\n"),
            "/readyz" if self.ready.load(Ordering::Relaxed) => ("200 OK", "ready\n"),
            "/readyz" => (
                "503 Service Unavailable",
                "waiting for the first list of Nodes to be applied\n",
            ),
            _ => ("404 Not Found", "try /healthz or /readyz\n"),
        }
    }
}

/// Serves probes on `listener` until the runtime stops.
pub async fn serve(listener: TcpListener, health: Arc<Health>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let health = Arc::clone(&health);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), respond(stream, &health)).await;
        });
    }
}

async fn respond(mut stream: TcpStream, health: &Health) -> std::io::Result<()> {
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
    let (status, body) = match (words.next(), words.next()) {
        (Some("GET" | "HEAD"), Some(path)) => health.answer(path.split('?').next().unwrap_or("")),
        _ => ("400 Bad Request", "GET /healthz or /readyz\n"),
    };
    let reply = format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_after_the_first_sync_alive_while_beating() {
        let h = Health::new(Duration::from_secs(30));
        assert_eq!(h.answer("/healthz").0, "200 OK");
        assert_eq!(h.answer("/readyz").0, "503 Service Unavailable");
        h.set_ready();
        assert_eq!(h.answer("/readyz").0, "200 OK");
        h.heartbeat.store(0, Ordering::Relaxed);
        assert_eq!(h.answer("/healthz").0, "503 Service Unavailable");
        assert_eq!(h.answer("/").0, "404 Not Found");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_probe_over_tcp() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let h = Health::new(Duration::from_secs(30));
        h.set_ready();
        tokio::spawn(serve(listener, Arc::clone(&h)));
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
