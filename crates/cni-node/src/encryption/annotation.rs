//! Publishing this node's WireGuard public key on its own Node object (the
//! [`super::ANNOTATION`] annotation), and taking it away when this node does not
//! encrypt, so that the other nodes reach it in clear. One JSON merge patch of the
//! annotation alone: the RBAC rule is `patch` on `nodes`, which allows changing any
//! field of any Node the API lets a patch change; the agent writes only this
//! annotation of its own Node.

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};

use super::ANNOTATION;
use crate::error::{Error, Result};
use crate::node::SlimNode;

/// How long one patch may take before the step fails (and is retried).
const TIMEOUT: Duration = Duration::from_secs(5);

/// Writes the annotation: a trait so the reconciler is tested without an API server.
pub trait Publisher: Send {
    /// Sets this node's annotation to `value`, or removes it with `None`.
    fn publish(&self, node: &str, value: Option<&str>) -> Result<()>;
}

/// The real API, called from the reconciler's thread on the agent's runtime.
pub struct ApiPublisher {
    /// The agent's client.
    pub client: kube::Client,
    /// The runtime the client runs on.
    pub runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for ApiPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiPublisher").finish_non_exhaustive()
    }
}

/// The merge patch that sets or removes the annotation.
pub fn patch_body(value: Option<&str>) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": {ANNOTATION: value}}})
}

impl Publisher for ApiPublisher {
    fn publish(&self, node: &str, value: Option<&str>) -> Result<()> {
        let api = Api::<SlimNode>::all(self.client.clone());
        let body = patch_body(value);
        let fail = |source: Box<dyn std::error::Error + Send + Sync>| Error::Publish {
            annotation: ANNOTATION,
            node: node.to_owned(),
            source,
        };
        let patched = self.runtime.block_on(async {
            tokio::time::timeout(
                TIMEOUT,
                api.patch(node, &PatchParams::default(), &Patch::Merge(&body)),
            )
            .await
        });
        match patched {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(fail(Box::new(e))),
            Err(_) => Err(fail(
                format!("no answer within {} s", TIMEOUT.as_secs()).into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cni_kube_api::{ApiServer, Kind};
    use serde_json::json;

    use super::*;
    use crate::api::{Connections, client};
    use crate::node::NodeInfo;

    /// The patch against the project's API server: the annotation is set, changed and
    /// removed on the Node, the rest of the Node is kept, and a watch would see each
    /// change (the resourceVersion moves). A Node that is not there is an error naming
    /// the annotation and the node.
    #[test]
    fn the_key_is_published_changed_and_taken_off_the_node() {
        let server = ApiServer::start("127.0.0.1:0".parse().unwrap());
        server.apply_node(json!({
            "metadata": {"name": "n1", "annotations": {"other": "kept"}},
            "spec": {"podCIDRs": ["10.244.1.0/24"]},
        }));
        let dir = std::env::temp_dir().join(format!(
            "cni-node-annotation-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        server.write_kubeconfig(&kubeconfig);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let client = runtime
            .block_on(client(Some(&kubeconfig), &Arc::new(Connections::default())))
            .unwrap();
        let publisher = ApiPublisher {
            client,
            runtime: runtime.handle().clone(),
        };
        let key = |node: &serde_json::Value| {
            let slim: SlimNode = serde_json::from_value(node.clone()).unwrap();
            NodeInfo::from_slim(&slim).wireguard_key
        };
        let k = crate::encryption::Key([5; 32]);
        let rv = server.resource_version();
        publisher.publish("n1", Some(&k.to_base64())).unwrap();
        let node = server.get(Kind::Node, "", "n1").unwrap();
        assert_eq!(key(&node), Some(Ok(k)));
        assert_eq!(node["metadata"]["annotations"]["other"], "kept");
        assert_eq!(node["spec"]["podCIDRs"][0], "10.244.1.0/24");
        assert!(server.resource_version() > rv);

        let k2 = crate::encryption::Key([6; 32]);
        publisher.publish("n1", Some(&k2.to_base64())).unwrap();
        assert_eq!(
            key(&server.get(Kind::Node, "", "n1").unwrap()),
            Some(Ok(k2))
        );

        publisher.publish("n1", None).unwrap();
        let node = server.get(Kind::Node, "", "n1").unwrap();
        assert_eq!(key(&node), None);
        assert_eq!(node["metadata"]["annotations"]["other"], "kept");

        let e = publisher.publish("n9", None).unwrap_err();
        let text = crate::error::chain(&e);
        assert!(
            text.contains(ANNOTATION) && text.contains("Node n9") && text.contains("not found"),
            "{text}"
        );
        let requests = server.requests();
        assert!(
            requests
                .iter()
                .any(|r| r.starts_with("PATCH /api/v1/nodes/n1")),
            "{requests:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
