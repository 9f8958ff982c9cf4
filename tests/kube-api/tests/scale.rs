//! 10,000 realistic Pods in 100 Namespaces through kube-rs's watcher: the paginated
//! initial list, a streaming list, a node's Pods by field selector, one namespace's,
//! and 1,000 changes and 100 deletions watched. It prints how long each took (timing
//! is for reading, not asserting: the bounds below only stop a hang).

mod common;

use std::time::{Duration, Instant};

use cni_kube_api::{Kind, realistic_namespace, realistic_pod};
use common::{client, server};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};

const NAMESPACES: usize = 100;
const PER_NAMESPACE: usize = 100;
const NODES: usize = 50;

fn pod(i: usize) -> Value {
    let ns = format!("team-{:03}", i % NAMESPACES);
    let name = format!("app-{i:05}");
    let ip = format!("10.{}.{}.{}", 64 + i / 65_536, i / 256 % 256, i % 256);
    let ip6 = format!("fd00:10:244::{i:x}");
    realistic_pod(
        &ns,
        &name,
        &format!("node-{:02}", i % NODES),
        &[&ip, &ip6],
        &[
            ("app", if i.is_multiple_of(2) { "web" } else { "worker" }),
            ("shard", &(i % 7).to_string()),
        ],
    )
}

/// Counts watcher events until InitDone (then returns the InitApply count) or until
/// `applies` Apply and `deletes` Delete events have come.
async fn count(
    stream: &mut (impl Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin),
    applies: usize,
    deletes: usize,
) -> (usize, usize, usize) {
    let (mut init, mut applied, mut deleted) = (0, 0, 0);
    let guard = tokio::time::timeout(Duration::from_secs(600), async {
        while let Some(item) = stream.next().await {
            match item.expect("a watcher event") {
                Event::Init => {}
                Event::InitApply(_) => init += 1,
                Event::InitDone => return,
                Event::Apply(_) => applied += 1,
                Event::Delete(_) => deleted += 1,
            }
            if applies + deletes > 0 && applied >= applies && deleted >= deletes {
                return;
            }
        }
    })
    .await;
    assert!(guard.is_ok(), "stuck after {init} {applied} {deleted}");
    (init, applied, deleted)
}

#[tokio::test(flavor = "current_thread")]
async fn ten_thousand_pods_in_a_hundred_namespaces_list_and_watch() {
    let server = server();
    let total = NAMESPACES * PER_NAMESPACE;
    let started = Instant::now();
    for n in 0..NAMESPACES {
        server.apply_namespace(realistic_namespace(
            &format!("team-{n:03}"),
            &[("tier", "apps")],
        ));
    }
    for i in 0..total {
        server.apply_pod(pod(i));
    }
    let bytes: usize = serde_json::to_vec(&pod(0)).expect("json").len();
    eprintln!(
        "applied {total} pods (~{bytes} bytes each) in {NAMESPACES} namespaces: {:?}",
        started.elapsed()
    );
    let c = client(&server).await;

    // The watcher's paginated list (kube-rs's default page size, 500).
    let started = Instant::now();
    let mut pods = watcher::watcher(Api::<Pod>::all(c.clone()), watcher::Config::default()).boxed();
    let (listed, _, _) = count(&mut pods, 0, 0).await;
    eprintln!(
        "watcher initial list: {listed} pods in {} pages: {:?}",
        server.list_count(),
        started.elapsed()
    );
    assert_eq!(listed, total);
    assert_eq!(server.list_count(), 20);

    // A streaming list of the same.
    let started = Instant::now();
    let mut streamed = watcher::watcher(
        Api::<Pod>::all(c.clone()),
        watcher::Config::default().streaming_lists(),
    )
    .boxed();
    let (listed, _, _) = count(&mut streamed, 0, 0).await;
    eprintln!("streaming list: {listed} pods: {:?}", started.elapsed());
    assert_eq!(listed, total);
    drop(streamed);

    // One node's pods, the agent's own view.
    let started = Instant::now();
    let mut mine = watcher::watcher(
        Api::<Pod>::all(c.clone()),
        watcher::Config::default().fields("spec.nodeName=node-07"),
    )
    .boxed();
    let (listed, _, _) = count(&mut mine, 0, 0).await;
    eprintln!(
        "watcher list with spec.nodeName=node-07: {listed} pods: {:?}",
        started.elapsed()
    );
    assert_eq!(listed, total / NODES);

    let started = Instant::now();
    let one: Api<Pod> = Api::namespaced(c.clone(), "team-042");
    let list = one.list(&ListParams::default()).await.expect("list");
    eprintln!(
        "list of namespace team-042: {} pods: {:?}",
        list.items.len(),
        started.elapsed()
    );
    assert_eq!(list.items.len(), PER_NAMESPACE);

    // 1,000 changes and 100 deletions, watched by the cluster-wide watcher and by the
    // node's (which sees its share).
    let started = Instant::now();
    for i in 0..1000 {
        let mut changed = pod(i * 7);
        changed["metadata"]["annotations"]["revision"] = json!("2");
        server.apply_pod(changed);
    }
    for i in 0..100 {
        let p = pod(i * 13 + 1);
        let (ns, name) = (
            p["metadata"]["namespace"].as_str().expect("ns"),
            p["metadata"]["name"].as_str().expect("name"),
        );
        assert!(server.delete_pod(ns, name));
    }
    let applied_here = (0..1000).filter(|i| i * 7 % NODES == 7).count();
    let deleted_here = (0..100).filter(|i| (i * 13 + 1) % NODES == 7).count();
    eprintln!(
        "1,000 changes and 100 deletions applied: {:?}",
        started.elapsed()
    );
    let (_, applied, deleted) = count(&mut pods, 1000, 100).await;
    eprintln!(
        "... and seen by the cluster-wide watcher: {:?} after the first change",
        started.elapsed()
    );
    assert_eq!((applied, deleted), (1000, 100));
    let (_, applied, deleted) = count(&mut mine, applied_here, deleted_here).await;
    eprintln!(
        "... and by node-07's ({applied} changes, {deleted} deletions): {:?}",
        started.elapsed()
    );
    assert_eq!((applied, deleted), (applied_here, deleted_here));
    assert_eq!(server.keys(Kind::Pod).len(), total - 100);
}
