//! ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`, a custom resource) against
//! kube-rs's watcher as an agent would watch it (a dynamic object, cluster-wide):
//! paginated lists, watch of additions, changes and deletions, bookmarks, resuming after
//! a restart, relisting after 410 Gone; and a cluster without the CRD: 404 for the
//! group's paths and nothing in discovery, until the CRD is installed at run time, when
//! a watcher that kept retrying picks the kind up; taking the CRD away again deletes the
//! objects and ends the watch.

mod common;

use std::time::Duration;

use cni_kube_api::{ApiServer, Kind, cluster_network_policy};
use common::{client, listed, server, take_until};
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{Value, json};

fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "policy.networking.k8s.io",
            "v1alpha2",
            "ClusterNetworkPolicy",
        ),
        "clusternetworkpolicies",
    )
}

fn api(client: Client) -> Api<DynamicObject> {
    Api::all_with(client, &resource())
}

/// Policy `i`: Admin tier, priority `i`, denying ingress from a labelled namespace.
fn policy(i: u32) -> Value {
    cluster_network_policy(
        &format!("policy-{i}"),
        json!({
            "tier": "Admin",
            "priority": i,
            "subject": {"namespaces": {"matchLabels": {"team": "shop"}}},
            "ingress": [{
                "name": "no-guests",
                "action": "Deny",
                "from": [{"namespaces": {"matchLabels": {"team": "guests"}}}],
            }],
        }),
    )
}

#[tokio::test(flavor = "current_thread")]
async fn cluster_network_policies_list_watch_relist() {
    let mut server = server();
    server.set_bookmark_interval(Duration::from_millis(200));
    for i in 1..=5 {
        server.apply_cluster_network_policy(policy(i));
    }
    let api = api(client(&server).await);
    let mut stream = watcher::watcher(api.clone(), watcher::Config::default().page_size(2))
        .default_backoff()
        .boxed();
    let seen = take_until(&mut stream, "done").await;
    assert_eq!(
        listed(&seen),
        ["policy-1", "policy-2", "policy-3", "policy-4", "policy-5"]
    );
    assert_eq!(server.list_count(), 3, "5 objects in pages of 2");

    // What a client reads back is the object as applied, typed by the server.
    let got = api.get("policy-3").await.expect("get policy-3");
    assert_eq!(got.data["spec"]["priority"], 3);
    assert_eq!(
        got.types.as_ref().map(|t| t.api_version.as_str()),
        Some("policy.networking.k8s.io/v1alpha2")
    );
    assert!(got.metadata.namespace.is_none(), "cluster-scoped");
    // The field selectors the API server allows for every custom resource.
    let one = api
        .list(&ListParams::default().fields("metadata.name=policy-4"))
        .await
        .expect("a list by name");
    let names: Vec<_> = one.items.iter().map(|p| p.metadata.name.clone()).collect();
    assert_eq!(names, [Some("policy-4".to_owned())]);
    match api
        .list(&ListParams::default().fields("spec.tier=Admin"))
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 400),
        other => panic!("expected 400 for an unsupported field, got {other:?}"),
    }

    server.apply_cluster_network_policy(policy(6));
    take_until(&mut stream, "apply policy-6").await;
    let mut changed = policy(1);
    changed["spec"]["priority"] = json!(900);
    server.apply_cluster_network_policy(changed);
    take_until(&mut stream, "apply policy-1").await;
    assert!(server.delete_cluster_network_policy("policy-2"));
    take_until(&mut stream, "delete policy-2").await;

    let before = server.bookmark_count();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(server.bookmark_count() > before, "no bookmark while idle");

    let lists = server.list_count();
    server.stop();
    server.apply_cluster_network_policy(policy(7));
    server.restart();
    take_until(&mut stream, "apply policy-7").await;
    assert_eq!(server.list_count(), lists, "resumed without a relist");

    server.stop();
    assert!(server.delete_cluster_network_policy("policy-3"));
    server.apply_cluster_network_policy(policy(8));
    server.compact();
    let expired = server.expired_count();
    server.restart();
    let seen = take_until(&mut stream, "done").await;
    assert!(server.expired_count() > expired, "no 410 was sent");
    assert!(server.list_count() > lists, "no relist");
    assert_eq!(listed(&seen), server.keys(Kind::ClusterNetworkPolicy));
    assert_eq!(
        server.keys(Kind::ClusterNetworkPolicy),
        [
            "policy-1", "policy-4", "policy-5", "policy-6", "policy-7", "policy-8"
        ]
    );
}

/// Whether discovery finds the ClusterNetworkPolicy kind.
async fn discovered(client: &Client) -> bool {
    let discovery = kube::Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let gvk = GroupVersionKind::gvk(
        "policy.networking.k8s.io",
        "v1alpha2",
        "ClusterNetworkPolicy",
    );
    let found = discovery.resolve_gvk(&gvk);
    if let Some((resource, caps)) = &found {
        assert_eq!(resource.plural, "clusternetworkpolicies");
        assert_eq!(caps.scope, kube::discovery::Scope::Cluster);
        for verb in ["get", "list", "watch"] {
            assert!(caps.supports_operation(verb), "{verb}");
        }
    }
    let np = GroupVersionKind::gvk("networking.k8s.io", "v1", "NetworkPolicy");
    assert!(
        discovery.resolve_gvk(&np).is_some(),
        "NetworkPolicy is built in"
    );
    found.is_some()
}

/// The status code of a GET of `path`.
async fn status_of(client: &Client, path: &str) -> u16 {
    let request = http::Request::get(path).body(Vec::new()).expect("request");
    match client.request::<Value>(request).await {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(other) => panic!("GET {path}: {other}"),
    }
}

/// Requests for the ClusterNetworkPolicy collection so far (served or not).
fn asked(server: &ApiServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.contains("/clusternetworkpolicies"))
        .count()
}

/// Polls `stream` (a watcher asks only while polled), dropping what it yields, until the
/// server has had more than `more_than` requests for the collection.
async fn until_asked_again(
    server: &ApiServer,
    stream: &mut (impl futures::Stream + Unpin),
    more_than: usize,
) {
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while asked(server) <= more_than {
            let _ = tokio::time::timeout(Duration::from_millis(20), stream.next()).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "no request for the kind after {more_than}");
}

#[tokio::test(flavor = "current_thread")]
async fn without_the_crd_the_kind_is_not_found_until_installed() {
    let server = server();
    server.uninstall_crd(Kind::ClusterNetworkPolicy);
    assert!(!server.crd_installed(Kind::ClusterNetworkPolicy));
    assert!(server.crd_installed(Kind::NetworkPolicy));
    let c = client(&server).await;
    for path in [
        "/apis/policy.networking.k8s.io",
        "/apis/policy.networking.k8s.io/v1alpha2",
        "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies",
        "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies/policy-1",
    ] {
        assert_eq!(status_of(&c, path).await, 404, "{path}");
    }
    assert_eq!(
        status_of(&c, "/apis/networking.k8s.io/v1/networkpolicies").await,
        200
    );
    assert!(
        !discovered(&c).await,
        "discovery lists a kind without its CRD"
    );
    match api(c.clone()).list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 404),
        other => panic!("expected 404, got {other:?}"),
    }

    // A watcher started now keeps failing (and backing off) until the CRD comes.
    let before = asked(&server);
    let mut stream = watcher::watcher(api(c.clone()), watcher::Config::default())
        .default_backoff()
        .boxed();
    let pending = tokio::time::timeout(Duration::from_millis(300), async {
        loop {
            match stream.next().await {
                // kube-rs announces a relist before it asks for it.
                Some(Err(_) | Ok(watcher::Event::Init)) => {}
                other => return format!("{other:?}"),
            }
        }
    })
    .await;
    assert!(pending.is_err(), "the watcher got something: {pending:?}");
    until_asked_again(&server, &mut stream, before + 1).await;

    server.install_crd(Kind::ClusterNetworkPolicy);
    server.apply_cluster_network_policy(policy(1));
    let seen = take_until(&mut stream, "done").await;
    assert_eq!(listed(&seen), ["policy-1"]);
    assert!(discovered(&c).await, "discovery misses the installed kind");
    server.apply_cluster_network_policy(policy(2));
    take_until(&mut stream, "apply policy-2").await;

    // Taking the CRD away deletes its objects and ends the watch; the watcher's
    // next watch gets 404 (and it keeps retrying).
    server.uninstall_crd(Kind::ClusterNetworkPolicy);
    let seen = take_until(&mut stream, "delete policy-2").await;
    assert!(seen.contains(&"delete policy-1".to_owned()), "{seen:?}");
    assert!(server.keys(Kind::ClusterNetworkPolicy).is_empty());
    let before = asked(&server);
    until_asked_again(&server, &mut stream, before).await;

    assert_eq!(
        status_of(
            &c,
            "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies"
        )
        .await,
        404
    );

    // Installed again: the same watcher sees what is applied.
    server.install_crd(Kind::ClusterNetworkPolicy);
    server.apply_cluster_network_policy(policy(3));
    take_until(&mut stream, "apply policy-3").await;
}

#[test]
#[should_panic(expected = "its CRD is not installed")]
fn applying_an_object_without_its_crd_is_a_mistake_in_the_test() {
    let server = server();
    server.uninstall_crd(Kind::ClusterNetworkPolicy);
    server.apply_cluster_network_policy(policy(1));
}

#[test]
#[should_panic(expected = "is built in")]
fn built_in_kinds_cannot_be_uninstalled() {
    server().uninstall_crd(Kind::Pod);
}
