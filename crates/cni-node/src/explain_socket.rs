//! The explain socket: where the agent answers `cni-node explain`. Its answers name
//! pods and policies of every namespace, so they are served on a unix socket only root
//! on this node (or in the agent's pod) can open, never on the health address that any
//! pod can reach. The exchange is the health endpoint's HTTP/1.0 (`GET /explain?<the
//! question>`), so the question and answer keep their format and `curl --unix-socket`
//! can ask too. Answering reads the stores' snapshot on the async runtime, never the
//! reconciler's thread.
//!
//! Life cycle: at start the socket's directory is made (0700) if missing, a socket file
//! left by a killed agent (nothing answers on it) is replaced, one that answers is
//! another agent's and the start fails, and anything else at the path is left alone
//! and the start fails; the new socket is made 0600 and only a peer with the agent's
//! own user (or root) is answered; a clean stop removes it, unless another agent's
//! socket has replaced it meanwhile.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;

use crate::error::{Error, Result, chain};
use crate::health::{self, Reply};
use crate::policy::cluster_model::NodePeer;
use crate::policy::explain::{ClusterView, Question};
use crate::store::Stores;

/// Where the agent serves explain and `cni-node explain` asks, unless told otherwise.
pub const DEFAULT_PATH: &str = "/run/cni-node/explain.sock";

/// The longest path a unix socket can be bound to (`sun_path` less its final NUL).
pub const MAX_PATH_LEN: usize = 107;

/// How long a question or an answer may take on the socket.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The socket file this agent made; dropping it removes the file if it is still the
/// one this agent bound (a clean stop).
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    /// Device, inode and change time of the file bound, so another agent's socket put
    /// at the same path later is not removed (the inode alone may be reused at once).
    identity: (u64, u64, i64, i64),
    /// The user that made it: the agent's, which may ask besides root.
    owner: u32,
}

impl SocketFile {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The user that made it (the agent's).
    pub fn owner(&self) -> u32 {
        self.owner
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = fs::symlink_metadata(&self.path).is_ok_and(|m| identity(&m) == self.identity);
        if ours && let Err(e) = fs::remove_file(&self.path) {
            tracing::warn!(
                "cannot remove the explain socket {}: {e}",
                self.path.display()
            );
        }
    }
}

/// Binds the explain socket at `path` (see the module's life cycle); needs the async
/// runtime.
pub async fn bind(path: &Path) -> Result<(UnixListener, SocketFile)> {
    let failed = |source| Error::ExplainSocket {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(failed)?;
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(Error::ExplainSocketNotOurs(path.to_owned()));
        }
        Ok(_) => {
            if answers(path).await {
                return Err(Error::ExplainSocketInUse(path.to_owned()));
            }
            tracing::info!("replacing the stale explain socket {}", path.display());
            match fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(failed(e)),
                _ => {}
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(failed(e)),
    }
    let listener = UnixListener::bind(path).map_err(failed)?;
    // Nothing is accepted before this (the peer check covers a connection made in
    // between); afterwards only the owner can even connect.
    let meta = fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .and_then(|()| fs::symlink_metadata(path))
        .map_err(|e| {
            // Not left behind open to whoever the mode let in.
            let _ = fs::remove_file(path);
            failed(e)
        })?;
    Ok((
        listener,
        SocketFile {
            path: path.to_owned(),
            identity: identity(&meta),
            owner: meta.uid(),
        },
    ))
}

fn identity(meta: &fs::Metadata) -> (u64, u64, i64, i64) {
    (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec())
}

/// Whether something accepts connections on the socket at `path`: a socket file left
/// by a killed agent refuses them at once; a live agent too busy to accept within a
/// second still counts as live.
async fn answers(path: &Path) -> bool {
    match tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::UnixStream::connect(path),
    )
    .await
    {
        Ok(Ok(_)) | Err(_) => true,
        Ok(Err(_)) => false,
    }
}

/// Answers explain questions on `listener` until the runtime stops, to peers of user
/// `owner` ([`SocketFile::owner`]) or root.
pub async fn serve(listener: UnixListener, owner: u32, stores: Arc<Stores>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, say: wait a little instead of spinning on it.
                tracing::warn!("explain socket: cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // The file's mode already keeps others out; this holds if someone loosens it.
        let peer = stream.peer_cred().map(|c| c.uid());
        if !matches!(peer, Ok(uid) if uid == owner || uid == 0) {
            tracing::warn!("explain socket: refused a peer of user {peer:?}");
            continue;
        }
        let stores = Arc::clone(&stores);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(
                TIMEOUT,
                health::respond(stream, "GET /explain?...", |path, query| {
                    answer(path, query, &stores)
                }),
            )
            .await;
        });
    }
}

fn answer(path: &str, query: &str, stores: &Stores) -> Reply {
    match path {
        "/explain" => explain(query, stores),
        _ => (
            "404 Not Found",
            health::TEXT,
            "only /explain is served here\n".into(),
        ),
    }
}

/// `/explain?from=..&to=..&protocol=..&port=..[&ipv6=1][&via_service=..]`: 200 with the
/// explanation (its first word `allowed` or `denied`), 400 for a bad question, 503
/// before the agent's NetworkPolicy view is complete.
fn explain(query: &str, stores: &Stores) -> Reply {
    let whole = stores.snapshot();
    let snapshot = whole.as_ref().and_then(|s| s.policy.network_policy.ready());
    let Some(snapshot) = snapshot else {
        return (
            "503 Service Unavailable",
            health::TEXT,
            "the agent has no complete view of Pods, Namespaces and NetworkPolicies yet \
             (or does not enforce NetworkPolicy)\n"
                .into(),
        );
    };
    let Some(question) = Question::from_query(query) else {
        return (
            "400 Bad Request",
            health::TEXT,
            "usage: /explain?from=POD|IP&to=POD|IP&protocol=TCP&port=N[&ipv6=1][&via_service=IP]\n"
                .into(),
        );
    };
    let records = stores
        .records_dir
        .as_deref()
        .map(crate::host::pod_records)
        .unwrap_or_default();
    // ClusterNetworkPolicy's tiers, from the same snapshot (one view fills both).
    let policy = whole.as_ref().map(|s| &s.policy);
    let cluster = policy.and_then(|p| p.admin.ready().or(p.baseline.ready()));
    let waiting = policy.and_then(|p| p.admin.waiting().or(p.baseline.waiting()));
    let nodes: BTreeMap<String, NodePeer> = whole
        .iter()
        .flat_map(|s| s.nodes.iter())
        .map(|(name, node)| (name.clone(), NodePeer::from(&**node)))
        .collect();
    let view = cluster.map(|c| ClusterView {
        policies: &c.policies,
        nodes: &nodes,
    });
    match crate::policy::explain::explain(snapshot, view, records, &question) {
        Ok((_, mut text)) => {
            if let Some(why) = waiting {
                text.push_str(&format!(
                    "not in this answer: the Admin and Baseline tiers (ClusterNetworkPolicy: \
                     {why}; the kernel keeps what it held for them)\n"
                ));
            }
            ("200 OK", health::TEXT, text)
        }
        Err(why) => ("400 Bad Request", health::TEXT, chain(&why) + "\n"),
    }
}

/// Asks the agent serving explain at `socket` (its `--explain-socket`): whether the
/// connection is allowed, and the explanation; an error when the agent cannot answer.
pub fn ask(socket: &Path, q: &Question) -> Result<(bool, String)> {
    let unreachable = |source| Error::AgentUnreachable {
        socket: socket.to_owned(),
        source,
    };
    let mut stream = std::os::unix::net::UnixStream::connect(socket).map_err(unreachable)?;
    let _ = stream.set_read_timeout(Some(TIMEOUT));
    let _ = stream.set_write_timeout(Some(TIMEOUT));
    let request = format!("GET /explain?{} HTTP/1.0\r\n\r\n", q.query());
    let mut reply = String::new();
    stream
        .write_all(request.as_bytes())
        .and_then(|()| stream.read_to_string(&mut reply))
        .map_err(unreachable)?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    if !head.starts_with("HTTP/1.0 200") {
        return Err(Error::AgentRefused {
            socket: socket.to_owned(),
            answer: body.trim_end().to_owned(),
        });
    }
    Ok((body.starts_with("allowed"), body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of this test's own, not made yet.
    fn dir() -> PathBuf {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("cni-node-explain-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o777
    }

    /// A missing directory is made 0700, the socket 0600, and a clean stop removes it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_new_socket_is_root_only_and_goes_at_a_clean_stop() {
        let dir = dir();
        let path = dir.join("run").join("explain.sock");
        let (_listener, file) = bind(&path)
            .await
            .unwrap_or_else(|e| panic!("{}", chain(&e)));
        assert!(fs::symlink_metadata(&path).unwrap().file_type().is_socket());
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        drop(file);
        assert!(!path.exists(), "a clean stop left the socket");
        let _ = fs::remove_dir_all(&dir);
    }

    /// A socket file nothing answers on (a killed agent's) is replaced; one that
    /// answers, or a file that is no socket, stops the start and is left alone.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stale_socket_is_replaced_a_live_one_or_other_file_is_not() {
        let dir = dir();
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("explain.sock");

        // Killed: the file stays, nothing listens.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        let stale = identity(&fs::symlink_metadata(&path).unwrap());
        let (listener, file) = bind(&path)
            .await
            .unwrap_or_else(|e| panic!("{}", chain(&e)));
        assert_ne!(identity(&fs::symlink_metadata(&path).unwrap()), stale);
        assert_eq!(mode(&path), 0o600);

        // Live: another agent's.
        let e = bind(&path).await.unwrap_err();
        assert!(matches!(e, Error::ExplainSocketInUse(_)), "{e}");
        assert_eq!(
            file.identity,
            identity(&fs::symlink_metadata(&path).unwrap())
        );
        drop(listener);

        // Replaced by someone else meanwhile: the clean stop leaves theirs.
        fs::remove_file(&path).unwrap();
        let theirs = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(file);
        assert!(path.exists(), "the clean stop removed another's socket");
        drop(theirs);
        fs::remove_file(&path).unwrap();

        // Not a socket: never removed.
        fs::write(&path, "data").unwrap();
        let e = bind(&path).await.unwrap_err();
        assert!(matches!(e, Error::ExplainSocketNotOurs(_)), "{e}");
        assert_eq!(fs::read_to_string(&path).unwrap(), "data");
        let _ = fs::remove_dir_all(&dir);
    }

    /// `cni-node explain`'s client against the served socket: before the policy view
    /// is complete the agent says so (no answer, exit 2); other paths are not served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_client_asks_over_the_socket() {
        let dir = dir();
        let path = dir.join("explain.sock");
        let (listener, file) = bind(&path)
            .await
            .unwrap_or_else(|e| panic!("{}", chain(&e)));
        let stores = Arc::new(Stores {
            policy: crate::policy::pipeline::PolicyStores::enforcing(true),
            ..Stores::default()
        });
        let server = tokio::spawn(serve(listener, file.owner(), stores));
        let q = Question {
            from: "x/a".into(),
            to: "y/b".into(),
            protocol: "TCP".into(),
            port: 80,
            ipv6: false,
            via_service: None,
        };
        let asked = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || ask(&path, &q))
                .await
                .unwrap()
        };
        let e = asked.unwrap_err();
        assert!(
            matches!(&e, Error::AgentRefused { answer, .. } if answer.contains("no complete view")),
            "{}",
            chain(&e)
        );
        assert_eq!(
            answer("/healthz", "", &Stores::default()).0,
            "404 Not Found"
        );
        server.abort();
        let _ = server.await;
        drop(file);
        assert!(!path.exists(), "the clean stop left the socket");
        let unreachable = ask(
            &path,
            &Question {
                from: "a".into(),
                to: "b".into(),
                protocol: "TCP".into(),
                port: 1,
                ipv6: false,
                via_service: None,
            },
        )
        .unwrap_err();
        assert!(
            matches!(unreachable, Error::AgentUnreachable { .. }),
            "{unreachable}"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
