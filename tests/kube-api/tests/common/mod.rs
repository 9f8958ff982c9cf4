//! What the kube-rs tests share: a client for the server, and watcher events as short
//! strings to compare.

// Each test binary uses its own part of this.
#![allow(dead_code)]

use std::fmt::Debug;
use std::time::Duration;

use cni_kube_api::ApiServer;
use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};

pub async fn client(server: &ApiServer) -> Client {
    let config = kube::Config::new(server.url().parse().expect("url"));
    Client::try_from(config).expect("client")
}

pub fn server() -> ApiServer {
    ApiServer::start("127.0.0.1:0".parse().expect("addr"))
}

/// `namespace/name`, or `name` for a cluster-scoped object: the server's keys.
pub fn key<K: Resource>(object: &K) -> String {
    match object.namespace() {
        Some(ns) => format!("{ns}/{}", object.name_any()),
        None => object.name_any(),
    }
}

/// A summary of a watcher event: "init", "+key" (init apply), "done", "apply key",
/// "delete key".
pub fn describe<K: Resource>(event: &Event<K>) -> String {
    match event {
        Event::Init => "init".into(),
        Event::InitApply(o) => format!("+{}", key(o)),
        Event::InitDone => "done".into(),
        Event::Apply(o) => format!("apply {}", key(o)),
        Event::Delete(o) => format!("delete {}", key(o)),
    }
}

/// Takes events until `until` has been seen (errors are skipped: the backoff retries).
pub async fn take_until<K: Resource + Debug>(
    stream: &mut (impl Stream<Item = Result<Event<K>, watcher::Error>> + Unpin),
    until: &str,
) -> Vec<String> {
    let mut seen = Vec::new();
    let result = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(item) = stream.next().await {
            match item {
                Err(e) => eprintln!("watch error: {e}"),
                Ok(event) => {
                    let text = describe(&event);
                    seen.push(text.clone());
                    if text == until {
                        return;
                    }
                }
            }
        }
    })
    .await;
    assert!(result.is_ok(), "no {until:?} within 30 s; saw {seen:?}");
    seen
}

/// The "+key" entries of `seen`, without the "+".
pub fn listed(seen: &[String]) -> Vec<String> {
    seen.iter()
        .filter_map(|s| s.strip_prefix('+'))
        .map(str::to_owned)
        .collect()
}
