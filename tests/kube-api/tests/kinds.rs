//! Every served kind against kube-rs's watcher, as the node agent watches them
//! (`Api::all`, cluster-wide): paginated lists, watch of additions, changes and
//! deletions, resuming after a restart, relisting after 410 Gone; one resourceVersion
//! sequence, so a compaction expires every kind's watch; namespaced paths; streaming
//! lists; and what kube-rs asks the server for (no discovery) and what discovery finds.

mod common;

use std::fmt::Debug;
use std::time::Duration;

use cni_kube_api::{
    Kind, cluster_network_policy, network_policy, realistic_namespace, realistic_node,
    realistic_pod,
};
use common::{client, listed, server, take_until};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::serde::de::DeserializeOwned;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

/// Namespaces the namespaced objects are spread over: "a-b" sorts before "a" in the
/// API server's (etcd's) key order, "a-b/..." < "a/...".
const NAMESPACES: [&str; 3] = ["a", "a-b", "shop"];

/// Object `i` of `kind`.
fn object(kind: Kind, i: usize) -> Value {
    let ns = NAMESPACES[i % NAMESPACES.len()];
    match kind {
        Kind::Node => realistic_node(
            &format!("node-{i}"),
            &[&format!("10.244.{i}.0/24")],
            &[&format!("198.18.0.{i}")],
            2,
        ),
        Kind::Namespace => realistic_namespace(&format!("team-{i}"), &[("team", "t")]),
        Kind::Pod => realistic_pod(
            ns,
            &format!("web-{i}"),
            "node-1",
            &[&format!("10.244.1.{i}"), &format!("fd00:10:244:1::{i:x}")],
            &[("app", "web")],
        ),
        Kind::NetworkPolicy => network_policy(
            ns,
            &format!("policy-{i}"),
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}),
        ),
        Kind::ClusterNetworkPolicy => cluster_network_policy(
            &format!("cluster-policy-{i}"),
            json!({
                "tier": "Admin", "priority": i,
                "subject": {"namespaces": {}},
                "ingress": [{"action": "Pass", "from": [{"namespaces": {}}]}],
            }),
        ),
    }
}

/// The server's key of object `i` of `kind`.
fn key_of(kind: Kind, i: usize) -> String {
    let value = object(kind, i);
    let name = value["metadata"]["name"].as_str().expect("name");
    match value["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    }
}

fn namespace_and_name(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// Five objects listed in pages of two, an addition, a change and a deletion watched,
/// a restart resumed without a relist, a restart after a compaction relisted.
async fn list_watch_relist<K>(kind: Kind)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut server = server();
    server.set_bookmark_interval(Duration::from_millis(200));
    for i in 1..=5 {
        server.apply(kind, object(kind, i));
    }
    let api: Api<K> = Api::all(client(&server).await);
    let mut stream = watcher::watcher(api, watcher::Config::default().page_size(2))
        .default_backoff()
        .boxed();
    let seen = take_until(&mut stream, "done").await;
    let mut want = vec!["init".to_owned()];
    want.extend(server.keys(kind).iter().map(|k| format!("+{k}")));
    want.push("done".into());
    assert_eq!(seen, want, "{kind:?}");
    assert_eq!(server.list_count(), 3, "{kind:?}: 5 objects in pages of 2");

    server.apply(kind, object(kind, 6));
    take_until(&mut stream, &format!("apply {}", key_of(kind, 6))).await;
    let mut changed = object(kind, 1);
    changed["metadata"]["labels"]["changed"] = json!("yes");
    server.apply(kind, changed);
    take_until(&mut stream, &format!("apply {}", key_of(kind, 1))).await;
    let gone = key_of(kind, 2);
    let (ns, name) = namespace_and_name(&gone);
    assert!(server.delete(kind, ns, name));
    take_until(&mut stream, &format!("delete {gone}")).await;

    // A stop and restart without compaction resumes the watch from where it was.
    let before = server.bookmark_count();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        server.bookmark_count() > before,
        "{kind:?}: no bookmark while idle"
    );
    let lists = server.list_count();
    server.stop();
    server.apply(kind, object(kind, 7));
    server.restart();
    take_until(&mut stream, &format!("apply {}", key_of(kind, 7))).await;
    assert_eq!(
        server.list_count(),
        lists,
        "{kind:?}: resumed without a relist"
    );

    // Stop, change, compact, restart: the watch gets 410 and the client relists.
    server.stop();
    let gone = key_of(kind, 3);
    let (ns, name) = namespace_and_name(&gone);
    assert!(server.delete(kind, ns, name));
    server.apply(kind, object(kind, 8));
    server.compact();
    let expired = server.expired_count();
    server.restart();
    let seen = take_until(&mut stream, "done").await;
    assert!(
        server.expired_count() > expired,
        "{kind:?}: no 410 was sent"
    );
    assert!(server.list_count() > lists, "{kind:?}: no relist");
    assert_eq!(listed(&seen), server.keys(kind), "{kind:?}");
    assert_eq!(server.keys(kind).len(), 6, "{kind:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn nodes_list_watch_relist() {
    list_watch_relist::<Node>(Kind::Node).await;
}

#[tokio::test(flavor = "current_thread")]
async fn namespaces_list_watch_relist() {
    list_watch_relist::<Namespace>(Kind::Namespace).await;
}

#[tokio::test(flavor = "current_thread")]
async fn pods_list_watch_relist() {
    list_watch_relist::<Pod>(Kind::Pod).await;
}

#[tokio::test(flavor = "current_thread")]
async fn network_policies_list_watch_relist() {
    list_watch_relist::<NetworkPolicy>(Kind::NetworkPolicy).await;
}

/// Lists carry their kind's `kind` and `apiVersion`, objects theirs, and the list's
/// version is the server's one sequence.
#[tokio::test(flavor = "current_thread")]
async fn lists_name_their_kind_and_share_one_version_sequence() {
    let server = server();
    for kind in Kind::ALL {
        server.apply(kind, object(kind, 1));
    }
    let rv = server.resource_version();
    assert_eq!(rv, 5, "one sequence for five objects of five kinds");
    let http = client(&server).await;
    for (kind, path) in [
        (Kind::Node, "/api/v1/nodes"),
        (Kind::Namespace, "/api/v1/namespaces"),
        (Kind::Pod, "/api/v1/pods"),
        (Kind::Pod, "/api/v1/namespaces/a-b/pods"),
        (
            Kind::NetworkPolicy,
            "/apis/networking.k8s.io/v1/networkpolicies",
        ),
        (
            Kind::NetworkPolicy,
            "/apis/networking.k8s.io/v1/namespaces/a-b/networkpolicies",
        ),
        (
            Kind::ClusterNetworkPolicy,
            "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies",
        ),
    ] {
        let request = http::Request::get(path).body(Vec::new()).expect("request");
        let list: Value = http.request(request).await.expect(path);
        assert_eq!(list["kind"], format!("{}List", kind.name()), "{path}");
        assert_eq!(list["apiVersion"], kind.api_version(), "{path}");
        assert_eq!(
            list["metadata"]["resourceVersion"],
            rv.to_string(),
            "{path}"
        );
        let items = list["items"].as_array().expect("items");
        assert_eq!(items.len(), 1, "{path}");
        assert_eq!(items[0]["kind"], kind.name(), "{path}");
    }
    // A get of one object, and a 404 for a namespaced kind without its namespace.
    let pods: Api<Pod> = Api::namespaced(http.clone(), "a-b");
    let pod = pods.get("web-1").await.expect("get pod");
    assert_eq!(pod.metadata.namespace.as_deref(), Some("a-b"));
    let policies: Api<NetworkPolicy> = Api::namespaced(http.clone(), "a-b");
    assert!(policies.get("policy-1").await.is_ok());
    let namespaces: Api<Namespace> = Api::all(http.clone());
    assert!(namespaces.get("team-1").await.is_ok());
    match namespaces.get("nope").await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 404),
        other => panic!("expected 404, got {other:?}"),
    }
    let request = http::Request::get("/api/v1/pods/web-1")
        .body(Vec::new())
        .expect("request");
    assert!(http.request::<Value>(request).await.is_err());
}

/// The pages of a list are read at the first page's version, as from etcd: changes
/// between pages do not show; after a compaction the continue token is 410 Expired.
#[tokio::test(flavor = "current_thread")]
async fn pages_are_read_at_the_first_pages_version() {
    let server = server();
    for i in 1..=6 {
        server.apply(Kind::Pod, object(Kind::Pod, i));
    }
    let before = server.keys(Kind::Pod);
    let api: Api<Pod> = Api::all(client(&server).await);
    let first = api
        .list(&kube::api::ListParams::default().limit(2))
        .await
        .expect("first page");
    let version = first.metadata.resource_version.clone();
    let mut keys: Vec<String> = first.items.iter().map(common::key).collect();
    assert_eq!(first.metadata.remaining_item_count, Some(4));
    // Between pages: one deleted, one added, one changed.
    let last = before.last().expect("a key").clone();
    let (ns, name) = namespace_and_name(&last);
    server.delete_pod(ns, name);
    server.apply(Kind::Pod, object(Kind::Pod, 7));
    let mut changed = object(Kind::Pod, 6);
    changed["metadata"]["labels"]["app"] = json!("changed");
    server.apply(Kind::Pod, changed);
    let mut token = first.metadata.continue_;
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = api
            .list(&kube::api::ListParams::default().limit(2).continue_token(&t))
            .await
            .expect("next page");
        assert_eq!(page.metadata.resource_version, version);
        for pod in &page.items {
            assert_eq!(pod.labels()["app"], "web", "a change after the snapshot");
        }
        keys.extend(page.items.iter().map(common::key));
        token = page.metadata.continue_;
    }
    assert_eq!(keys, before);

    let first = api
        .list(&kube::api::ListParams::default().limit(2))
        .await
        .expect("first page");
    server.apply(Kind::Namespace, object(Kind::Namespace, 1));
    server.compact();
    let token = first.metadata.continue_.expect("a continue token");
    match api
        .list(
            &kube::api::ListParams::default()
                .limit(2)
                .continue_token(&token),
        )
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected 410 Expired, got {other:?}"),
    }
}

/// The watches of Namespaces, Pods and NetworkPolicies all resume from versions of
/// the one sequence: a compaction after a Pod change expires all three, and all three
/// relist.
#[tokio::test(flavor = "current_thread")]
async fn a_compaction_expires_every_kinds_watch() {
    let mut server = server();
    server.set_bookmark_interval(Duration::from_millis(100));
    for kind in [Kind::Namespace, Kind::Pod, Kind::NetworkPolicy] {
        server.apply(kind, object(kind, 1));
    }
    let c = client(&server).await;
    let config = watcher::Config::default();
    let mut namespaces = watcher::watcher(Api::<Namespace>::all(c.clone()), config.clone())
        .default_backoff()
        .boxed();
    let mut pods = watcher::watcher(Api::<Pod>::all(c.clone()), config.clone())
        .default_backoff()
        .boxed();
    let mut policies = watcher::watcher(Api::<NetworkPolicy>::all(c.clone()), config)
        .default_backoff()
        .boxed();
    take_until(&mut namespaces, "done").await;
    take_until(&mut pods, "done").await;
    take_until(&mut policies, "done").await;
    let lists = server.list_count();

    server.stop();
    server.apply(Kind::Pod, object(Kind::Pod, 2));
    server.compact();
    server.restart();
    let seen = take_until(&mut namespaces, "done").await;
    assert_eq!(listed(&seen), ["team-1"]);
    let seen = take_until(&mut pods, "done").await;
    assert_eq!(listed(&seen), ["a-b/web-1", "shop/web-2"]);
    let seen = take_until(&mut policies, "done").await;
    assert_eq!(listed(&seen), ["a-b/policy-1"]);
    assert_eq!(server.list_count(), lists + 3);
    assert!(server.expired_count() >= 3);
}

/// `Api::namespaced`: the watcher lists and watches one namespace's objects only.
#[tokio::test(flavor = "current_thread")]
async fn a_namespaced_watch_sees_its_namespace_only() {
    let server = server();
    for i in 1..=9 {
        server.apply(Kind::Pod, object(Kind::Pod, i));
        server.apply(Kind::NetworkPolicy, object(Kind::NetworkPolicy, i));
    }
    let c = client(&server).await;
    let mut pods = watcher::watcher(
        Api::<Pod>::namespaced(c.clone(), "a"),
        watcher::Config::default().page_size(2),
    )
    .default_backoff()
    .boxed();
    let seen = take_until(&mut pods, "done").await;
    assert_eq!(listed(&seen), ["a/web-3", "a/web-6", "a/web-9"]);
    let mut policies = watcher::watcher(
        Api::<NetworkPolicy>::namespaced(c.clone(), "a-b"),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed();
    let seen = take_until(&mut policies, "done").await;
    assert_eq!(
        listed(&seen),
        ["a-b/policy-1", "a-b/policy-4", "a-b/policy-7"]
    );

    server.apply(Kind::Pod, object(Kind::Pod, 10)); // in a-b
    server.apply(Kind::Pod, object(Kind::Pod, 12)); // in a
    let seen = take_until(&mut pods, "apply a/web-12").await;
    assert_eq!(seen, ["apply a/web-12"], "a-b/web-10 is not in a");
    server.delete_network_policy("a", "policy-3");
    server.delete_network_policy("a-b", "policy-4");
    let seen = take_until(&mut policies, "delete a-b/policy-4").await;
    assert_eq!(seen, ["delete a-b/policy-4"]);
}

/// `streaming_lists()`: no list request; the watch sends the objects, then a bookmark
/// that marks the end of the initial events.
#[tokio::test(flavor = "current_thread")]
async fn a_streaming_list_ends_with_its_bookmark() {
    let server = server();
    for i in 1..=4 {
        server.apply(Kind::Pod, object(Kind::Pod, i));
    }
    let api: Api<Pod> = Api::all(client(&server).await);
    let mut stream = watcher::watcher(api, watcher::Config::default().streaming_lists())
        .default_backoff()
        .boxed();
    let seen = take_until(&mut stream, "done").await;
    let mut want = vec!["init".to_owned()];
    want.extend(server.keys(Kind::Pod).iter().map(|k| format!("+{k}")));
    want.push("done".into());
    assert_eq!(seen, want);
    assert_eq!(server.list_count(), 0);
    let requests = server.requests();
    eprintln!("a streaming list asked for: {requests:?}");
    assert!(
        requests[0].contains("watch=true") && requests[0].contains("sendInitialEvents=true"),
        "{requests:?}"
    );
    server.delete_pod("a", "web-3");
    take_until(&mut stream, "delete a/web-3").await;
}

/// What kube-rs 5 asks for: with `Api::all` and typed objects the watcher needs no
/// discovery, only each kind's collection; `Discovery` reads `/api`, `/api/v1`,
/// `/apis` and each group version, and finds every kind with its verbs.
#[tokio::test(flavor = "current_thread")]
async fn what_kube_rs_asks_for() {
    let server = server();
    server.apply(Kind::Pod, object(Kind::Pod, 1));
    let c = client(&server).await;
    let config = watcher::Config::default().page_size(100);
    let mut nodes = watcher::watcher(Api::<Node>::all(c.clone()), config.clone()).boxed();
    let mut namespaces = watcher::watcher(Api::<Namespace>::all(c.clone()), config.clone()).boxed();
    let mut pods = watcher::watcher(Api::<Pod>::all(c.clone()), config.clone()).boxed();
    let mut policies =
        watcher::watcher(Api::<NetworkPolicy>::all(c.clone()), config.clone()).boxed();
    take_until(&mut nodes, "done").await;
    take_until(&mut namespaces, "done").await;
    take_until(&mut pods, "done").await;
    take_until(&mut policies, "done").await;
    // The watches start after InitDone; give them a moment to be sent.
    for _ in 0..50 {
        if server.watch_count() >= 4 {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(20), nodes.next()).await;
        let _ = tokio::time::timeout(Duration::from_millis(20), namespaces.next()).await;
        let _ = tokio::time::timeout(Duration::from_millis(20), pods.next()).await;
        let _ = tokio::time::timeout(Duration::from_millis(20), policies.next()).await;
    }
    let requests = server.requests();
    eprintln!("the watchers asked for:");
    for r in &requests {
        eprintln!("  {r}");
    }
    let paths: Vec<&str> = requests
        .iter()
        .map(|r| r.split(['?', ' ']).nth(1).unwrap_or_default())
        .collect();
    for path in &paths {
        assert!(
            [
                "/api/v1/nodes",
                "/api/v1/namespaces",
                "/api/v1/pods",
                "/apis/networking.k8s.io/v1/networkpolicies"
            ]
            .contains(path),
            "unexpected request for {path}"
        );
    }
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("GET /api/v1/pods?") && r.contains("watch=true")),
        "{requests:?}"
    );

    let before = server.requests().len();
    let discovery = kube::Discovery::new(c.clone())
        .run()
        .await
        .expect("discovery");
    let asked: Vec<String> = server.requests()[before..].to_vec();
    eprintln!("discovery asked for: {asked:?}");
    for (group, kind, plural, namespaced) in [
        ("", "Pod", "pods", true),
        ("", "Namespace", "namespaces", false),
        ("", "Node", "nodes", false),
        (
            "networking.k8s.io",
            "NetworkPolicy",
            "networkpolicies",
            true,
        ),
    ] {
        let gvk = kube::api::GroupVersionKind::gvk(group, "v1", kind);
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("discovery misses {gvk:?}"));
        assert_eq!(resource.plural, plural);
        assert_eq!(
            caps.scope == kube::discovery::Scope::Namespaced,
            namespaced,
            "{kind}"
        );
        for verb in ["get", "list", "watch"] {
            assert!(caps.supports_operation(verb), "{kind} {verb}");
        }
    }
    assert!(c.apiserver_version().await.is_ok());
}

/// The fixtures are what k8s-openapi (so the agent) reads as a Pod, a Namespace and a
/// NetworkPolicy, with the fields NetworkPolicy enforcement needs.
#[test]
fn fixtures_are_valid_objects_with_what_policy_enforcement_reads() {
    let value = realistic_pod(
        "shop",
        "web-7c9f8d6b5-x2k4q",
        "node-1",
        &["10.244.1.7", "fd00:10:244:1::7"],
        &[("app", "web"), ("pod-template-hash", "7c9f8d6b5")],
    );
    let bytes = serde_json::to_vec(&value).expect("json").len();
    assert!((3_000..=6_000).contains(&bytes), "{bytes} bytes");
    let pod: Pod = serde_json::from_value(value).expect("a k8s-openapi Pod");
    assert_eq!(pod.metadata.labels.expect("labels")["app"], "web");
    let spec = pod.spec.expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some("node-1"));
    assert_eq!(spec.host_network, Some(false));
    let ports: Vec<(String, i32, String)> = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.container_port,
                p.protocol.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [
            ("http".into(), 8080, "TCP".into()),
            ("metrics".into(), 9090, "TCP".into()),
            ("grpc".into(), 50051, "TCP".into()),
            ("dns".into(), 5353, "UDP".into()),
        ]
    );
    let status = pod.status.expect("status");
    assert_eq!(status.pod_ip.as_deref(), Some("10.244.1.7"));
    let ips: Vec<String> = status
        .pod_ips
        .expect("podIPs")
        .into_iter()
        .map(|p| p.ip)
        .collect();
    assert_eq!(ips, ["10.244.1.7", "fd00:10:244:1::7"]);
    assert_eq!(status.phase.as_deref(), Some("Running"));

    let namespace: Namespace =
        serde_json::from_value(realistic_namespace("shop", &[("team", "frontend")]))
            .expect("a k8s-openapi Namespace");
    let labels = namespace.metadata.labels.expect("labels");
    assert_eq!(labels["team"], "frontend");
    assert_eq!(labels["kubernetes.io/metadata.name"], "shop");

    let policy: NetworkPolicy = serde_json::from_value(network_policy(
        "shop",
        "web-from-frontend",
        json!({
            "podSelector": {"matchLabels": {"app": "web"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{
                "from": [
                    {"namespaceSelector": {"matchLabels": {"team": "frontend"}}},
                    {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.244.0.0/16"]}},
                ],
                "ports": [{"protocol": "TCP", "port": "http"}, {"port": 9090}],
            }],
            "egress": [{"to": [{"podSelector": {}}], "ports": [{"protocol": "UDP", "port": 53, "endPort": 54}]}],
        }),
    ))
    .expect("a k8s-openapi NetworkPolicy");
    assert_eq!(policy.metadata.namespace.as_deref(), Some("shop"));
    let spec = policy.spec.expect("spec");
    assert_eq!(
        spec.ingress.expect("ingress")[0]
            .from
            .as_ref()
            .expect("from")
            .len(),
        2
    );
    assert_eq!(
        spec.egress.expect("egress")[0]
            .ports
            .as_ref()
            .expect("ports")[0]
            .end_port,
        Some(54)
    );
}
