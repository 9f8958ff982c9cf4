//! Label and field selectors through kube-rs: paginated lists with every label
//! operator, field selectors on Pods, 400 for what the API server refuses, and on
//! watches the watch cache's rule: an object that stops matching comes as DELETED (its
//! last matching version), one that starts matching as ADDED; kube-rs's watcher turns
//! these into deletions and applies of its view, across a 410 relist too.

mod common;

use std::time::Duration;

use cni_kube_api::{Kind, realistic_namespace, realistic_pod};
use common::{client, listed, server, take_until};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

/// Pod `i`: namespace `a` (even) or `b` (odd), `app` web/db/cache in turn,
/// `tier=front` on every fourth, `legacy` on pod 5, on node-2 when `i % 5` is 3 or 4,
/// else on node-1.
fn pod(i: usize) -> Value {
    let mut labels = vec![("app", ["web", "db", "cache"][i % 3])];
    if i.is_multiple_of(4) {
        labels.push(("tier", "front"));
    }
    if i == 5 {
        labels.push(("legacy", "true"));
    }
    realistic_pod(
        ["a", "b"][i % 2],
        &format!("p-{i:02}"),
        &format!("node-{}", 1 + i % 5 / 3),
        &[&format!("10.244.0.{i}")],
        &labels,
    )
}

/// Whether a Pod's JSON is selected.
type Predicate = Box<dyn Fn(&Value) -> bool>;

/// Every page of a list of Pods with `params`, following continue tokens; the keys,
/// and whether any page had a remainingItemCount.
async fn list_all(api: &Api<Pod>, params: ListParams) -> (Vec<String>, bool) {
    let mut keys = Vec::new();
    let mut counted = false;
    let mut token: Option<String> = None;
    loop {
        let mut page_params = params.clone().limit(2);
        if let Some(t) = &token {
            page_params = page_params.continue_token(t);
        }
        let page = api.list(&page_params).await.expect("list");
        assert!(page.items.len() <= 2);
        keys.extend(page.items.iter().map(common::key));
        counted |= page.metadata.remaining_item_count.is_some();
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return (keys, counted);
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn label_and_field_selectors_on_paginated_lists() {
    let server = server();
    for i in 0..12 {
        server.apply_pod(pod(i));
    }
    let all: Api<Pod> = Api::all(client(&server).await);
    let keys_where = |keep: &dyn Fn(&Value) -> bool| -> Vec<String> {
        server
            .keys(Kind::Pod)
            .into_iter()
            .filter(|k| {
                let (ns, name) = k.split_once('/').expect("a namespaced key");
                keep(&server.get(Kind::Pod, ns, name).expect("the pod"))
            })
            .collect()
    };
    let label = |p: &Value, k: &str| p["metadata"]["labels"][k].as_str().map(str::to_owned);
    let app = move |p: &Value| label(p, "app").unwrap_or_default();

    let (keys, counted) = list_all(&all, ListParams::default()).await;
    assert_eq!(keys, server.keys(Kind::Pod));
    assert!(counted, "no remainingItemCount without a selector");

    let cases: Vec<(&str, Predicate)> = vec![
        ("app=web", Box::new(move |p| app(p) == "web")),
        ("app==web", Box::new(move |p| app(p) == "web")),
        ("app!=web", Box::new(move |p| app(p) != "web")),
        ("app in (web,db)", Box::new(move |p| app(p) != "cache")),
        ("app notin (web,db)", Box::new(move |p| app(p) == "cache")),
        ("tier", Box::new(move |p| label(p, "tier").is_some())),
        ("!tier", Box::new(move |p| label(p, "tier").is_none())),
        (
            "app=web,tier",
            Box::new(move |p| app(p) == "web" && label(p, "tier").is_some()),
        ),
        (
            "app in (web, cache),!legacy",
            Box::new(move |p| app(p) != "db" && label(p, "legacy").is_none()),
        ),
        (
            "tier notin (front)",
            Box::new(move |p| label(p, "tier").is_none()),
        ),
    ];
    for (selector, keep) in &cases {
        let want = keys_where(keep.as_ref());
        assert!(!want.is_empty(), "{selector} selects something");
        let (keys, counted) = list_all(&all, ListParams::default().labels(selector)).await;
        assert_eq!(keys, want, "labelSelector={selector}");
        assert!(
            !counted,
            "a remainingItemCount with labelSelector={selector}"
        );
    }

    let node = |p: &Value| {
        p["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let namespace = |p: &Value| {
        p["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let (keys, _) = list_all(&all, ListParams::default().fields("spec.nodeName=node-1")).await;
    assert_eq!(keys, keys_where(&|p| node(p) == "node-1"));
    let (keys, _) = list_all(&all, ListParams::default().fields("spec.nodeName!=node-1")).await;
    assert_eq!(keys, keys_where(&|p| node(p) != "node-1"));
    let (keys, _) = list_all(&all, ListParams::default().fields("metadata.namespace!=a")).await;
    assert_eq!(keys, keys_where(&|p| namespace(p) != "a"));
    let (keys, _) = list_all(
        &all,
        ListParams::default()
            .fields("metadata.namespace=b,spec.nodeName=node-2")
            .labels("app!=db"),
    )
    .await;
    assert_eq!(
        keys,
        keys_where(&|p| namespace(p) == "b" && node(p) == "node-2" && app(p) != "db")
    );
    let in_a: Api<Pod> = Api::namespaced(client(&server).await, "a");
    let (keys, _) = list_all(&in_a, ListParams::default().fields("metadata.name=p-04")).await;
    assert_eq!(keys, ["a/p-04"]);
    let (keys, _) = list_all(&in_a, ListParams::default().labels("app=web")).await;
    assert_eq!(
        keys,
        keys_where(&|p| namespace(p) == "a" && app(p) == "web")
    );

    // What the API server refuses, it refuses with 400 and says why.
    for (params, message) in [
        (
            ListParams::default().fields("spec.foo=x"),
            "field label not supported: spec.foo",
        ),
        (
            ListParams::default().labels("app in web"),
            "unable to parse requirement",
        ),
    ] {
        match all.list(&params).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 400);
                assert!(status.message.contains(message), "{}", status.message);
            }
            other => panic!("expected 400 {message:?}, got {other:?}"),
        }
    }
    let namespaces: Api<Namespace> = Api::all(client(&server).await);
    assert!(
        namespaces
            .list(&ListParams::default().fields("spec.nodeName=x"))
            .await
            .is_err(),
        "Namespaces have no spec.nodeName"
    );
}

/// A raw watch event as "TYPE key app=... rv=N" (bookmarks left out).
fn summary(event: &WatchEvent<Pod>) -> Option<String> {
    let line = |kind: &str, p: &Pod| {
        format!(
            "{kind} {} app={} node={} rv={}",
            common::key(p),
            p.labels().get("app").map_or("-", String::as_str),
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or("-"),
            p.resource_version().unwrap_or_default()
        )
    };
    match event {
        WatchEvent::Added(p) => Some(line("ADDED", p)),
        WatchEvent::Modified(p) => Some(line("MODIFIED", p)),
        WatchEvent::Deleted(p) => Some(line("DELETED", p)),
        WatchEvent::Bookmark(_) => None,
        WatchEvent::Error(e) => Some(format!("ERROR {}", e.code)),
    }
}

/// Takes raw watch events until `n` have come.
async fn take(
    stream: &mut (impl Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin),
    n: usize,
) -> Vec<String> {
    let mut seen = Vec::new();
    let result = tokio::time::timeout(Duration::from_secs(30), async {
        while seen.len() < n {
            let event = stream
                .next()
                .await
                .expect("the stream ended")
                .expect("an event");
            seen.extend(summary(&event));
        }
    })
    .await;
    assert!(result.is_ok(), "no {n} events within 30 s; saw {seen:?}");
    seen
}

fn labelled(name: &str, node: &str, app: &str, revision: u32) -> Value {
    let mut p = realistic_pod("a", name, node, &["10.244.0.9"], &[("app", app)]);
    p["metadata"]["annotations"]["revision"] = json!(revision.to_string());
    p
}

/// The watch cache's rule, seen on the wire: ADDED when an object starts matching,
/// MODIFIED while it matches, DELETED (its last matching version, at the change's
/// resourceVersion) when it stops matching or goes; nothing for what never matches.
#[tokio::test(flavor = "current_thread")]
async fn a_watch_with_a_label_selector_adds_and_deletes_on_the_boundary() {
    let server = server();
    server.apply_pod(labelled("x", "node-1", "web", 0));
    let api: Api<Pod> = Api::all(client(&server).await);
    let from = server.resource_version().to_string();
    let mut stream = api
        .watch(&WatchParams::default().labels("app=web"), &from)
        .await
        .expect("watch")
        .boxed();
    let added = server.apply_pod(labelled("w", "node-1", "web", 1));
    server.apply_pod(labelled("d", "node-1", "db", 1)); // never matches
    let stopped = server.apply_pod(labelled("w", "node-1", "db", 2));
    server.apply_pod(labelled("w", "node-1", "db", 3)); // still not matching
    let started = server.apply_pod(labelled("w", "node-1", "web", 4));
    let modified = server.apply_pod(labelled("w", "node-1", "web", 5));
    server.delete_pod("a", "d");
    server.delete_pod("a", "w");
    let deleted = server.resource_version();
    let seen = take(&mut stream, 5).await;
    assert_eq!(
        seen,
        [
            format!("ADDED a/w app=web node=node-1 rv={added}"),
            format!("DELETED a/w app=web node=node-1 rv={stopped}"),
            format!("ADDED a/w app=web node=node-1 rv={started}"),
            format!("MODIFIED a/w app=web node=node-1 rv={modified}"),
            format!("DELETED a/w app=web node=node-1 rv={deleted}"),
        ]
    );

    // Started from version 0 (or none), a watch first sends what matches now.
    let mut stream = api
        .watch(&WatchParams::default().labels("app in (web,db)"), "0")
        .await
        .expect("watch")
        .boxed();
    let seen = take(&mut stream, 1).await;
    assert_eq!(seen, ["ADDED a/x app=web node=node-1 rv=1"]);
}

/// The agent's view of its own node: `spec.nodeName=...`. A Pod appears when it is
/// scheduled there (its nodeName set), not before; Pods of other nodes never appear.
#[tokio::test(flavor = "current_thread")]
async fn a_watch_with_a_field_selector_sees_pods_when_scheduled_to_its_node() {
    let server = server();
    let api: Api<Pod> = Api::all(client(&server).await);
    let mut stream = api
        .watch(&WatchParams::default().fields("spec.nodeName=node-1"), "0")
        .await
        .expect("watch")
        .boxed();
    let mut pending = labelled("p", "", "web", 1);
    pending["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("nodeName");
    pending["status"] = json!({"phase": "Pending"});
    server.apply_pod(pending);
    server.apply_pod(labelled("other", "node-2", "web", 1));
    let scheduled = server.apply_pod(labelled("p", "node-1", "web", 2));
    server.delete_pod("a", "other");
    server.delete_pod("a", "p");
    let deleted = server.resource_version();
    let seen = take(&mut stream, 2).await;
    assert_eq!(
        seen,
        [
            format!("ADDED a/p app=web node=node-1 rv={scheduled}"),
            format!("DELETED a/p app=web node=node-1 rv={deleted}"),
        ]
    );
}

/// kube-rs's watcher with a selector: its view loses an object that stops matching and
/// gets it back when it matches again; after a 410 it relists with the same selector.
#[tokio::test(flavor = "current_thread")]
async fn the_watcher_with_a_selector_follows_the_boundary_and_relists_with_it() {
    let mut server = server();
    server.set_bookmark_interval(Duration::from_millis(100));
    for i in 0..12 {
        server.apply_pod(pod(i));
    }
    server.apply_namespace(realistic_namespace("a", &[("team", "shop")]));
    server.apply_namespace(realistic_namespace("b", &[("team", "ops")]));
    let c = client(&server).await;
    let mut pods = watcher::watcher(
        Api::<Pod>::all(c.clone()),
        watcher::Config::default()
            .labels("app=web")
            .fields("spec.nodeName=node-1")
            .page_size(1),
    )
    .default_backoff()
    .boxed();
    let seen = take_until(&mut pods, "done").await;
    assert_eq!(listed(&seen), ["a/p-00", "a/p-06"]);

    // Stops matching (relabelled), matches again; of two new Pods, the one that
    // matches.
    let mut relabelled = pod(6);
    relabelled["metadata"]["labels"]["app"] = json!("db");
    server.apply_pod(relabelled);
    take_until(&mut pods, "delete a/p-06").await;
    server.apply_pod(pod(6));
    take_until(&mut pods, "apply a/p-06").await;
    let seen = {
        server.apply_pod(pod(13)); // db on node-2
        server.apply_pod(pod(12)); // web on node-1
        take_until(&mut pods, "apply a/p-12").await
    };
    assert_eq!(seen, ["apply a/p-12"]);

    // A namespace selector the agent might use, on Namespaces.
    let mut namespaces = watcher::watcher(
        Api::<Namespace>::all(c.clone()),
        watcher::Config::default().labels("team=shop"),
    )
    .default_backoff()
    .boxed();
    let seen = take_until(&mut namespaces, "done").await;
    assert_eq!(listed(&seen), ["a"]);
    server.apply_namespace(realistic_namespace("b", &[("team", "shop")]));
    take_until(&mut namespaces, "apply b").await;
    server.apply_namespace(realistic_namespace("a", &[("team", "ops")]));
    take_until(&mut namespaces, "delete a").await;

    // 410: the relist keeps the selector.
    server.stop();
    server.delete_pod("a", "p-00");
    server.apply_pod(pod(15)); // web, node-1
    server.compact();
    server.restart();
    let seen = take_until(&mut pods, "done").await;
    assert_eq!(listed(&seen), ["a/p-06", "a/p-12", "b/p-15"]);
}
