//! The test server against the real client: kube-rs's watcher (list + watch, pages,
//! bookmarks, relist on 410 Gone, backoff), as the node agent uses it.

use std::time::Duration;

use cni_kube_api::{ApiServer, realistic_node};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

fn node(i: u8) -> serde_json::Value {
    realistic_node(
        &format!("node-{i}"),
        &[&format!("10.244.{i}.0/24")],
        &[&format!("198.18.0.{i}")],
        3,
    )
}

async fn client(server: &ApiServer) -> Client {
    let config = kube::Config::new(server.url().parse().expect("url"));
    Client::try_from(config).expect("client")
}

/// A summary of a watcher event: "init", "+name" (init apply), "done", "apply name",
/// "delete name".
fn describe(event: &Event<Node>) -> String {
    let name = |n: &Node| n.metadata.name.clone().unwrap_or_default();
    match event {
        Event::Init => "init".into(),
        Event::InitApply(n) => format!("+{}", name(n)),
        Event::InitDone => "done".into(),
        Event::Apply(n) => format!("apply {}", name(n)),
        Event::Delete(n) => format!("delete {}", name(n)),
    }
}

/// Takes events until `until` has been seen (errors are skipped: the backoff retries).
async fn take_until(
    stream: &mut (impl futures::Stream<Item = Result<Event<Node>, watcher::Error>> + Unpin),
    until: &str,
) -> Vec<String> {
    let mut seen = Vec::new();
    let result = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(item) = stream.next().await {
            if let Err(e) = &item {
                eprintln!("watch error: {e}");
            }
            if let Ok(event) = item {
                let text = describe(&event);
                seen.push(text.clone());
                if text == until {
                    return;
                }
            }
        }
    })
    .await;
    assert!(result.is_ok(), "no {until:?} within 30 s; saw {seen:?}");
    seen
}

#[tokio::test(flavor = "current_thread")]
async fn paged_list_then_watch_then_relist_after_410() {
    let mut server = ApiServer::start("127.0.0.1:0".parse().expect("addr"));
    server.set_bookmark_interval(Duration::from_millis(200));
    for i in 1..=5 {
        server.apply_node(node(i));
    }
    let api: Api<Node> = Api::all(client(&server).await);
    let mut stream = watcher::watcher(api, watcher::Config::default().page_size(2))
        .default_backoff()
        .boxed();
    let seen = take_until(&mut stream, "done").await;
    assert_eq!(
        seen,
        [
            "init", "+node-1", "+node-2", "+node-3", "+node-4", "+node-5", "done"
        ]
    );
    assert_eq!(server.list_count(), 3, "5 nodes in pages of 2");

    server.apply_node(node(6));
    take_until(&mut stream, "apply node-6").await;
    server.delete_node("node-2");
    take_until(&mut stream, "delete node-2").await;

    // Bookmarks flow while idle; a stop and restart without compaction resumes the
    // watch from where it was, with no new list.
    let before = server.bookmark_count();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(server.bookmark_count() > before, "no bookmark while idle");
    let lists = server.list_count();
    server.stop();
    server.apply_node(node(7));
    server.restart();
    take_until(&mut stream, "apply node-7").await;
    assert_eq!(server.list_count(), lists, "resumed without a relist");

    // Stop, change, compact, restart: the watch gets 410 and the client relists.
    server.stop();
    server.delete_node("node-3");
    server.apply_node(node(8));
    server.compact();
    let expired = server.expired_count();
    server.restart();
    let seen = take_until(&mut stream, "done").await;
    assert!(server.expired_count() > expired, "no 410 was sent");
    assert!(server.list_count() > lists, "no relist");
    let listed: Vec<&String> = seen.iter().filter(|s| s.starts_with('+')).collect();
    assert_eq!(
        listed,
        [
            "+node-1", "+node-4", "+node-5", "+node-6", "+node-7", "+node-8"
        ]
    );
}

/// An HTTP 410 answer to the watch request itself (some proxies answer so; the API
/// server sends an ERROR event instead): kube-rs 5 does not relist then, it retries the
/// same resourceVersion and surfaces `WatchStartFailed` with the 410 every time. The
/// node agent restarts its watcher on that error; this pins the client's behaviour the
/// agent works around.
#[tokio::test(flavor = "current_thread")]
async fn a_410_status_answer_surfaces_as_watch_start_failed() {
    let mut server = ApiServer::start("127.0.0.1:0".parse().expect("addr"));
    server.set_gone_as_http_status(true);
    server.apply_node(node(1));
    let api: Api<Node> = Api::all(client(&server).await);
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    take_until(&mut stream, "done").await;
    server.stop();
    server.apply_node(node(2));
    server.compact();
    server.restart();
    let error = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match stream.next().await {
                Some(Err(e)) => return e,
                Some(Ok(_)) => {}
                None => panic!("the stream ended"),
            }
        }
    })
    .await
    .expect("an error within 30 s");
    match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => {
            assert_eq!(status.code, 410, "{status:?}");
        }
        other => panic!("expected WatchStartFailed with 410, got {other:?}"),
    }
    assert!(server.expired_count() > 0);
}

#[test]
fn a_realistic_node_is_about_15_kb_and_a_valid_node() {
    let value = realistic_node(
        "n",
        &["10.244.1.0/24", "fd00::/64"],
        &["10.0.0.1", "fd00:1::1"],
        40,
    );
    let bytes = serde_json::to_vec(&value).expect("json");
    assert!(
        (13_000..=17_000).contains(&bytes.len()),
        "{} bytes",
        bytes.len()
    );
    let node: Node = serde_json::from_value(value).expect("a k8s-openapi Node");
    let spec = node.spec.expect("spec");
    assert_eq!(spec.pod_cidrs.expect("podCIDRs").len(), 2);
    assert_eq!(
        node.status.expect("status").images.expect("images").len(),
        40
    );
}
