//! The Kubernetes API client, and the watch of one kind into its store.
//!
//! The client is kube-rs's, on a connection of our own making: TCP keepalive and
//! `TCP_USER_TIMEOUT`, so a connection that died without a word (a middlebox that
//! dropped the flow) fails within about [`DEAD_CONNECTION_AFTER`] instead of leaving a
//! watch that hears nothing until the server's watch timeout, minutes later; and
//! registered by its local address ([`Connections`]), so that one whose address this
//! host lost (the node renumbered) is ended at once. A healthy idle watch costs a few
//! keepalive segments, no request.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::StreamExt;
use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::client::ConfigExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tower::{BoxError, ServiceBuilder};

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::policy::cluster_network_policy::{Availability, Served};
use crate::store::{Store, Update, Watched};
use crate::wake::Wake;

/// Idle time before the first keepalive probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between unanswered probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the kernel gives the connection up.
const KEEPALIVE_PROBES: u32 = 3;
/// How long sent data may stay unacknowledged before the kernel gives up.
const USER_TIMEOUT: Duration = Duration::from_secs(25);
/// When a dead connection is noticed at the latest, idle or not.
pub const DEAD_CONNECTION_AFTER: Duration = Duration::from_secs(25);

/// A client from `--kubeconfig`, else the usual inference (`$KUBECONFIG`,
/// `~/.kube/config`, then the in-cluster service account).
/// Its connections are registered in `connections`, so that the loss of a local
/// address ends those made from it at once ([`Connections::sever`]).
pub async fn client(kubeconfig: Option<&Path>, connections: &Arc<Connections>) -> Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                Error::ReadKubeconfig {
                    path: path.to_owned(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|source| Error::ReadKubeconfig {
                    path: path.to_owned(),
                    source,
                })?
        }
        None => kube::Config::infer().await.map_err(Error::InferConfig)?,
    };
    tracing::info!("Kubernetes API at {}", config.cluster_url);
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    http.set_tcp_user_timeout(Some(USER_TIMEOUT));
    let tracked = TrackedConnector {
        http,
        connections: Arc::clone(connections),
    };
    let https = config
        .rustls_https_connector_with_connector(tracked)
        .map_err(Error::Client)?;
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(Error::Client)?)
        .layer(config.extra_headers_layer().map_err(Error::Client)?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}

/// The API connections by their local address, so that a connection whose address
/// this host lost is ended at once instead of when keepalive or `TCP_USER_TIMEOUT`
/// gives it up (the node renumbered: the watch would hear nothing for up to
/// [`DEAD_CONNECTION_AFTER`]).
#[derive(Debug, Default)]
pub struct Connections {
    live: Mutex<Vec<(IpAddr, Weak<Severed>)>>,
}

impl Connections {
    fn register(&self, local: IpAddr) -> Arc<Severed> {
        let severed = Arc::new(Severed::default());
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.retain(|(_, s)| s.strong_count() > 0);
        live.push((local, Arc::downgrade(&severed)));
        severed
    }

    /// Ends every live connection made from `local`; returns how many.
    pub fn sever(&self, local: IpAddr) -> usize {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.retain(|(_, s)| s.strong_count() > 0);
        live.iter()
            .filter(|(ip, _)| *ip == local)
            .filter_map(|(_, s)| s.upgrade())
            .map(|s| s.sever())
            .count()
    }
}

/// Whether a connection was ended by [`Connections::sever`], and the task waiting on it.
#[derive(Debug, Default)]
pub struct Severed {
    cut: AtomicBool,
    waiting: Mutex<Option<Waker>>,
}

impl Severed {
    fn sever(&self) {
        self.cut.store(true, Ordering::SeqCst);
        if let Some(waker) = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            waker.wake();
        }
    }

    /// An error once severed; else remembers the task to wake if it is.
    fn check(&self, cx: &Context<'_>) -> io::Result<()> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "this host no longer has the connection's local address",
            ));
        }
        *self.waiting.lock().unwrap_or_else(PoisonError::into_inner) = Some(cx.waker().clone());
        // Severed between the first look and the registration: seen now.
        if self.cut.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "this host no longer has the connection's local address",
            ));
        }
        Ok(())
    }
}

/// A TCP connection to the API that [`Connections::sever`] can end.
#[derive(Debug)]
struct TrackedStream {
    inner: TcpStream,
    severed: Arc<Severed>,
}

impl AsyncRead for TrackedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(e) = self.severed.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Err(e) = self.severed.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Connection for TrackedStream {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

/// hyper's TCP connector, whose connections are registered by local address.
#[derive(Debug, Clone)]
struct TrackedConnector {
    http: HttpConnector,
    connections: Arc<Connections>,
}

impl tower::Service<Uri> for TrackedConnector {
    type Response = TokioIo<TrackedStream>;
    type Error = <HttpConnector as tower::Service<Uri>>::Error;
    type Future =
        Pin<Box<dyn Future<Output = std::result::Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        self.http.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.http.call(uri);
        let connections = Arc::clone(&self.connections);
        Box::pin(async move {
            let inner = connecting.await?.into_inner();
            // Without a local address (it cannot fail on a connected socket) the
            // connection is simply never severed.
            let local = inner
                .local_addr()
                .map_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |a| a.ip());
            let severed = connections.register(local);
            Ok(TokioIo::new(TrackedStream { inner, severed }))
        })
    }
}

/// Whether the watch's resourceVersion is too old: the watch request answered
/// `410 Gone`, as an HTTP status or as an `ERROR` event in its stream.
fn is_gone(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 410,
        watcher::Error::WatchError(status) => status.code == 410,
        _ => false,
    }
}

/// Whether the API refused a list or watch with `404 Not Found`: it does not serve the
/// kind (a CRD that is not installed).
fn is_not_found(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 404,
        watcher::Error::WatchError(status) => status.code == 404,
        _ => false,
    }
}

/// Keeps `store` in step with the API's objects of kind `K`, waking the reconciler on
/// every change that matters; runs until the runtime stops.
///
/// Errors never end it: the watcher retries with backoff (up to 30 s between tries)
/// and resumes from its resourceVersion; a 410 to the watch (an HTTP status or an
/// `ERROR` event) starts a new watcher, which lists afresh. The store keeps its view meanwhile, so nothing is
/// removed while the API is away.
pub async fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    store: Arc<Mutex<Store<K>>>,
    wake: Arc<Wake>,
    metrics: Arc<Metrics>,
) where
    K: Watched + kube::Resource<DynamicType = ()> + DeserializeOwned + Sync,
{
    watch_inner(api, config, store, wake, metrics, None).await;
}

/// As [`watch`], for a kind the API may not serve (a CRD that is not installed, or
/// installed later): a `404` is said once in the log and recorded in `served`, and the
/// kind is looked for again every `look_again` until it is served, without a restart.
/// Its store stays incomplete meanwhile.
pub async fn watch_optional<K>(
    api: Api<K>,
    config: watcher::Config,
    store: Arc<Mutex<Store<K>>>,
    wake: Arc<Wake>,
    metrics: Arc<Metrics>,
    served: Arc<Served>,
    look_again: Duration,
) where
    K: Watched + kube::Resource<DynamicType = ()> + DeserializeOwned + Sync,
{
    watch_inner(
        api,
        config,
        store,
        wake,
        metrics,
        Some((served, look_again)),
    )
    .await;
}

async fn watch_inner<K>(
    api: Api<K>,
    config: watcher::Config,
    store: Arc<Mutex<Store<K>>>,
    wake: Arc<Wake>,
    metrics: Arc<Metrics>,
    optional: Option<(Arc<Served>, Duration)>,
) where
    K: Watched + kube::Resource<DynamicType = ()> + DeserializeOwned + Sync,
{
    metrics.watching(K::KIND);
    loop {
        let mut stream = watcher::watcher(api.clone(), config.clone())
            .default_backoff()
            .boxed();
        let mut failures = 0u64;
        let mut absent = false;
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    // Each try of a list starts with Init: only what follows it shows
                    // the API answering again.
                    if !matches!(event, Event::Init) {
                        failures = 0;
                    }
                    if let (Event::InitDone, Some((served, _))) = (&event, &optional)
                        && served.set(Availability::Served) != Availability::Served
                    {
                        tracing::info!("the API serves {}: watched and enforced", K::KIND);
                    }
                    take(event, &store, &wake, &metrics);
                }
                Err(e) if optional.is_some() && is_not_found(&e) => {
                    if let Some((served, look_again)) = &optional
                        && served.set(Availability::Absent) != Availability::Absent
                    {
                        tracing::info!(
                            "the API does not serve {} (its CRD is not installed);                              NetworkPolicy is enforced as before, and the kind is looked                              for again every {}s",
                            K::KIND,
                            look_again.as_secs()
                        );
                    }
                    absent = true;
                    break;
                }
                Err(e) if is_gone(&e) => {
                    // The client would retry the same too-old version forever (an HTTP
                    // 410), or list again only after its backoff, which the failures
                    // of an outage have grown to seconds (an ERROR event): a new
                    // watcher lists afresh at once.
                    metrics.watch_restarted(K::KIND);
                    tracing::warn!(
                        "the {} watch's resourceVersion expired ({e}); listing again",
                        K::KIND
                    );
                    break;
                }
                Err(e) => {
                    failures += 1;
                    metrics.watch_restarted(K::KIND);
                    tracing::warn!(
                        "{} watch failed ({failures} in a row), retrying; routes and rules \
                         stay as they are: {e}",
                        K::KIND,
                    );
                }
            }
        }
        if let (true, Some((_, look_again))) = (absent, &optional) {
            tokio::time::sleep(*look_again).await;
        }
    }
}

/// Applies one event to the store, logs and counts what it did, wakes the reconciler
/// when the view changed.
fn take<K: Watched>(event: Event<K>, store: &Mutex<Store<K>>, wake: &Wake, metrics: &Metrics) {
    let mut store = store.lock().unwrap_or_else(PoisonError::into_inner);
    let update = store.apply(event);
    match &update {
        Update::Unchanged => return,
        Update::Listed { count, first, .. } => {
            metrics.listed(K::KIND);
            let kind = K::KIND.to_lowercase();
            tracing::info!(
                "listed {count} {kind}s{}",
                if *first {
                    ""
                } else {
                    " again (the watch was restarted)"
                }
            );
        }
        Update::Applied { key } => {
            tracing::debug!("{} {key}: {:?}", K::KIND.to_lowercase(), store.get(key));
        }
        Update::Deleted { key } => {
            tracing::info!("{} {key} was deleted", K::KIND.to_lowercase());
        }
    }
    let name_problems = |key: &str, item: &K::Item| {
        let problems = K::problems(item);
        if !problems.is_empty() {
            tracing::warn!(
                "{} {key} cannot be read exactly, it is read failing closed: {}",
                K::KIND,
                problems.join("; ")
            );
        }
    };
    match &update {
        Update::Applied { key } => {
            if let Some(item) = store.get(key) {
                name_problems(key, item);
            }
        }
        Update::Listed { changed: true, .. } => {
            for (key, item) in store.snapshot().iter().flat_map(|items| items.iter()) {
                name_problems(key, item);
            }
        }
        _ => {}
    }
    metrics.objects(K::KIND, store.len());
    if update.changed() {
        wake.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;
    use tower::ServiceExt as _;

    #[tokio::test]
    async fn a_connection_from_a_lost_address_ends_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(Connections::default());
        let connector = TrackedConnector {
            http: HttpConnector::new(),
            connections: Arc::clone(&connections),
        };
        let uri: Uri = format!("http://{addr}").parse().unwrap();
        let io = connector.oneshot(uri).await.unwrap();
        let (_server, _) = listener.accept().await.unwrap();
        let mut stream = io.into_inner();
        let reading = tokio::spawn(async move {
            let mut byte = [0u8; 1];
            stream.read(&mut byte).await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!reading.is_finished(), "nothing was sent: the read waits");
        assert_eq!(connections.sever("127.0.0.2".parse().unwrap()), 0);
        assert_eq!(connections.sever("127.0.0.1".parse().unwrap()), 1);
        let read = tokio::time::timeout(Duration::from_secs(1), reading)
            .await
            .expect("the waiting read is woken")
            .unwrap();
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
    }
    use kube::core::Status;

    #[test]
    fn a_410_is_gone_whether_a_status_or_an_event() {
        let gone =
            || Box::new(Status::failure("too old resource version", "Expired").with_code(410));
        assert!(is_gone(&watcher::Error::WatchStartFailed(
            kube::Error::Api(gone())
        )));
        assert!(is_gone(&watcher::Error::WatchError(gone())));
        let other = Box::new(Status::failure("no", "InternalError").with_code(500));
        assert!(!is_gone(&watcher::Error::WatchError(other.clone())));
        assert!(!is_gone(&watcher::Error::WatchStartFailed(
            kube::Error::Api(other)
        )));
    }

    /// A kind whose CRD is absent: the watch records it absent and keeps looking, its
    /// store stays incomplete; once the CRD is installed the watch finds the kind
    /// without being restarted, and lists its objects.
    #[tokio::test]
    async fn an_optional_kind_absent_at_first_is_found_once_its_crd_is_installed() {
        use crate::policy::cluster_network_policy::Stores as ClusterStores;
        use crate::policy::objects::SlimClusterNetworkPolicy;
        use cni_kube_api::{ApiServer, Kind, cluster_network_policy};

        /// The log, kept: the runtime runs every task on this thread, so this
        /// thread's subscriber hears the watch.
        #[derive(Clone, Default)]
        struct Log(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Log {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        impl Log {
            fn count(&self, what: &str) -> usize {
                String::from_utf8_lossy(&self.0.lock().unwrap())
                    .matches(what)
                    .count()
            }
        }
        let log = Log::default();
        let writer = log.clone();
        let _log = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish(),
        );

        let server = ApiServer::start("127.0.0.1:0".parse().unwrap());
        server.uninstall_crd(Kind::ClusterNetworkPolicy);
        let dir = std::env::temp_dir().join(format!("cni-node-api-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        server.write_kubeconfig(&kubeconfig);
        let client = client(Some(&kubeconfig), &Arc::new(Connections::default()))
            .await
            .unwrap();
        let stores = ClusterStores::default();
        let wake = Arc::new(Wake::default());
        let watching = tokio::spawn(watch_optional(
            Api::<SlimClusterNetworkPolicy>::all(client),
            watcher::Config::default(),
            Arc::clone(&stores.policies),
            wake,
            Arc::new(Metrics::new()),
            Arc::clone(&stores.served),
            Duration::from_millis(100),
        ));
        async fn until(what: &str, done: impl Fn() -> bool) {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !done() {
                assert!(std::time::Instant::now() < deadline, "never: {what}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        until("the kind is known absent", || {
            stores.served.get() == Availability::Absent
        })
        .await;
        // Several tries later it is still absent, said once, and nothing was listed.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(stores.served.get(), Availability::Absent);
        assert!(crate::store::snapshot_of(&stores.policies).is_none());
        assert_eq!(stores.status(), None);
        let absent = "the API does not serve ClusterNetworkPolicy";
        assert_eq!(log.count(absent), 1);
        let tries = server
            .requests()
            .iter()
            .filter(|r| r.contains("clusternetworkpolicies"))
            .count();
        assert!(
            tries >= 3,
            "looked for {tries} times in 600 ms, every 100 ms"
        );

        server.install_crd(Kind::ClusterNetworkPolicy);
        server.apply_cluster_network_policy(cluster_network_policy(
            "deny-all",
            serde_json::json!({"tier": "Admin", "priority": 1,
                "subject": {"namespaces": {}},
                "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),
        ));
        until("the policy is listed", || {
            crate::store::snapshot_of(&stores.policies).is_some_and(|p| p.contains_key("deny-all"))
        })
        .await;
        assert_eq!(stores.served.get(), Availability::Served);
        assert!(
            stores
                .status()
                .unwrap()
                .contains("enforced (1 policies: 1 Admin, 0 Baseline)")
        );
        assert_eq!(log.count(absent), 1);
        assert_eq!(log.count("the API serves ClusterNetworkPolicy"), 1);
        watching.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
