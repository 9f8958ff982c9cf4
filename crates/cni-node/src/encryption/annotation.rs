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
