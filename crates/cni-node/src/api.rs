//! The Kubernetes API client, and the watch of one kind into its store.
//!
//! The client is kube-rs's, on a connection of our own making: TCP keepalive and
//! `TCP_USER_TIMEOUT`, so a connection that died without a word (the node's own
//! address replaced, a middlebox that dropped the flow) fails within about
//! [`DEAD_CONNECTION_AFTER`] instead of leaving a watch that hears nothing until the
//! server's watch timeout, minutes later. A healthy idle watch costs a few keepalive
//! segments, no request.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tower::{BoxError, ServiceBuilder};

use crate::error::{Error, Result};
use crate::metrics::Metrics;
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
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client> {
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
    let https = config
        .rustls_https_connector_with_connector(http)
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

/// Whether the watch's resourceVersion is too old: the watch request answered
/// `410 Gone`, as an HTTP status or as an `ERROR` event in its stream.
fn is_gone(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 410,
        watcher::Error::WatchError(status) => status.code == 410,
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
    metrics.watching(K::KIND);
    loop {
        let mut stream = watcher::watcher(api.clone(), config.clone())
            .default_backoff()
            .boxed();
        let mut failures = 0u64;
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    // Each try of a list starts with Init: only what follows it shows
                    // the API answering again.
                    if !matches!(event, Event::Init) {
                        failures = 0;
                    }
                    take(event, &store, &wake, &metrics);
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
    metrics.objects(K::KIND, store.len());
    if update.changed() {
        wake.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
