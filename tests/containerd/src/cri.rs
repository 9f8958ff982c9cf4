//! A blocking CRI client over containerd's unix socket: the calls kubelet makes to set up
//! and tear down pod networking, and nothing else.
//!
//! The `runtime.v1` types and the tonic client come from the `k8s-cri` crate. Each call
//! runs to completion on a private current-thread tokio runtime, so tests stay plain
//! synchronous code; every call has a deadline, so a wedged containerd fails the test
//! instead of hanging it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
pub use k8s_cri::v1::Protocol;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    NetworkConfig, PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, PortMapping,
    RemovePodSandboxRequest, RunPodSandboxRequest, RuntimeConfig, StatusRequest,
    StopPodSandboxRequest, UpdateRuntimeConfigRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// Deadline of one CRI call (a sandbox start takes about 100 ms here).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A connected CRI runtime-service client.
#[derive(Debug)]
pub struct Cri {
    runtime: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
}

/// What `Status` says: kubelet starts pods only once both conditions are true.
#[derive(Debug, Clone)]
pub struct RuntimeStatus {
    /// containerd and its runtime are up.
    pub runtime_ready: bool,
    /// A CNI config is loaded (false until the pod CIDR produced a conflist).
    pub network_ready: bool,
    /// Why the network is not ready, when it is not.
    pub network_message: String,
}

/// One host port of a pod: protocol (TCP 0, UDP 1, SCTP 2, as in the CRI), the
/// port in the pod, the port on the node, and the node address (empty: all).
#[derive(Debug, Clone)]
pub struct HostPort {
    /// `Protocol` of the CRI API, as its number.
    pub protocol: Protocol,
    /// The port in the pod.
    pub container_port: u16,
    /// The port on the node.
    pub host_port: u16,
    /// The node address, or empty for all of them.
    pub host_ip: String,
}

/// The Pod a sandbox is made for, as kubelet copies it into the sandbox's config:
/// metadata (namespace, name, uid) and labels.
#[derive(Debug, Clone, Copy)]
pub struct PodMeta<'a> {
    /// `metadata.namespace`.
    pub namespace: &'a str,
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `metadata.labels`.
    pub labels: &'a [(&'a str, &'a str)],
}

/// What `PodSandboxStatus` (verbose) says about a sandbox's network.
#[derive(Debug, Clone)]
pub struct SandboxNet {
    /// `SANDBOX_READY` or `SANDBOX_NOTREADY`.
    pub state: i32,
    /// The primary pod IP, then the additional ones, as the CNI result gave them.
    pub ips: Vec<String>,
    /// The pid of the sandbox's init process (from the verbose `info` JSON); 0 when the
    /// sandbox is not running.
    pub pid: u32,
}

impl Cri {
    /// Connects to the socket at `socket` (no request is sent yet).
    pub fn connect(socket: &Path) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let path = socket.to_path_buf();
        let channel = runtime
            .block_on(async move {
                // The URI is required by the API but unused: the connector dials the socket.
                Endpoint::from_static("http://[::]:50051")
                    .timeout(CALL_TIMEOUT)
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path: PathBuf = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    }))
                    .await
            })
            .map_err(|e| format!("connect {}: {e}", socket.display()))?;
        Ok(Self {
            runtime,
            client: RuntimeServiceClient::new(channel),
        })
    }

    /// `Status`: the RuntimeReady and NetworkReady conditions.
    pub fn status(&self) -> Result<RuntimeStatus, String> {
        let mut client = self.client.clone();
        let response = self
            .runtime
            .block_on(client.status(StatusRequest { verbose: false }))
            .map_err(|s| format!("Status: {}", s.message()))?
            .into_inner();
        let conditions = response.status.map(|s| s.conditions).unwrap_or_default();
        let find = |kind: &str| conditions.iter().find(|c| c.r#type == kind);
        let network = find("NetworkReady");
        Ok(RuntimeStatus {
            runtime_ready: find("RuntimeReady").is_some_and(|c| c.status),
            network_ready: network.is_some_and(|c| c.status),
            network_message: network.map(|c| c.message.clone()).unwrap_or_default(),
        })
    }

    /// `UpdateRuntimeConfig` with the node's pod CIDRs, comma separated as kubelet sends
    /// them (`10.244.1.0/24,fd00:10:244:1::/64`).
    pub fn update_pod_cidr(&self, pod_cidr: &str) -> Result<(), String> {
        let mut client = self.client.clone();
        let request = UpdateRuntimeConfigRequest {
            runtime_config: Some(RuntimeConfig {
                network_config: Some(NetworkConfig {
                    pod_cidr: pod_cidr.to_owned(),
                }),
            }),
        };
        self.runtime
            .block_on(client.update_runtime_config(request))
            .map_err(|s| format!("UpdateRuntimeConfig: {}", s.message()))?;
        Ok(())
    }

    /// `RunPodSandbox` for pod `name` in namespace `default`, its own network namespace,
    /// its cgroup under `cgroup_parent` (cgroupfs). Returns the sandbox id, or the error
    /// message containerd gave.
    pub fn run_pod(&self, name: &str, uid: &str, cgroup_parent: &str) -> Result<String, String> {
        self.run_pod_with_ports(name, uid, cgroup_parent, &[])
    }

    /// [`Cri::run_pod`] with the pod's host ports, as kubelet passes a pod's
    /// `hostPort`s (containerd hands them to the `portMappings` capability).
    pub fn run_pod_with_ports(
        &self,
        name: &str,
        uid: &str,
        cgroup_parent: &str,
        ports: &[HostPort],
    ) -> Result<String, String> {
        let pod = PodMeta {
            namespace: "default",
            name,
            uid,
            labels: &[("app", "cnibb")],
        };
        self.run_pod_sandbox(&pod, cgroup_parent, ports)
    }

    /// `RunPodSandbox` as kubelet makes it for the Pod `pod` (containerd passes its
    /// namespace and name to the plugins in `CNI_ARGS`, `K8S_POD_NAMESPACE` and
    /// `K8S_POD_NAME`), with its own network namespace, its cgroup under
    /// `cgroup_parent` (cgroupfs) and `ports` as host ports. Returns the sandbox id, or
    /// the error message containerd gave.
    pub fn run_pod_sandbox(
        &self,
        pod: &PodMeta<'_>,
        cgroup_parent: &str,
        ports: &[HostPort],
    ) -> Result<String, String> {
        self.run_annotated_pod_sandbox(pod, cgroup_parent, ports, &[])
    }

    /// [`Cri::run_pod_sandbox`] with the Pod's `annotations` on the sandbox config, as
    /// kubelet copies them (containerd reads `kubernetes.io/ingress-bandwidth` and
    /// `kubernetes.io/egress-bandwidth` there for the `bandwidth` capability).
    pub fn run_annotated_pod_sandbox(
        &self,
        pod: &PodMeta<'_>,
        cgroup_parent: &str,
        ports: &[HostPort],
        annotations: &[(&str, &str)],
    ) -> Result<String, String> {
        let mut client = self.client.clone();
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: pod.name.to_owned(),
                uid: pod.uid.to_owned(),
                namespace: pod.namespace.to_owned(),
                attempt: 0,
            }),
            hostname: pod.name.to_owned(),
            port_mappings: ports
                .iter()
                .map(|p| PortMapping {
                    protocol: p.protocol as i32,
                    container_port: i32::from(p.container_port),
                    host_port: i32::from(p.host_port),
                    host_ip: p.host_ip.clone(),
                })
                .collect(),
            labels: pod
                .labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.to_owned(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Pod.into(),
                        pid: NamespaceMode::Container.into(),
                        ipc: NamespaceMode::Pod.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let request = RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        let response = self
            .runtime
            .block_on(client.run_pod_sandbox(request))
            .map_err(|s| s.message().to_owned())?;
        Ok(response.into_inner().pod_sandbox_id)
    }

    /// `PodSandboxStatus` with `verbose = true`.
    pub fn sandbox(&self, id: &str) -> Result<SandboxNet, String> {
        let mut client = self.client.clone();
        let request = PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: true,
        };
        let response = self
            .runtime
            .block_on(client.pod_sandbox_status(request))
            .map_err(|s| format!("PodSandboxStatus {id}: {}", s.message()))?
            .into_inner();
        let status = response
            .status
            .ok_or_else(|| format!("PodSandboxStatus {id}: no status"))?;
        let mut ips = Vec::new();
        if let Some(network) = status.network {
            if !network.ip.is_empty() {
                ips.push(network.ip);
            }
            ips.extend(network.additional_ips.into_iter().map(|ip| ip.ip));
        }
        // containerd puts its view of the sandbox, pid included, in `info` as JSON.
        let pid = response
            .info
            .get("info")
            .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
            .and_then(|info| info["pid"].as_u64())
            .and_then(|pid| u32::try_from(pid).ok())
            .unwrap_or(0);
        Ok(SandboxNet {
            state: status.state,
            ips,
            pid,
        })
    }

    /// Ids of the sandboxes containerd knows, ready or not.
    pub fn sandbox_ids(&self) -> Result<Vec<String>, String> {
        let mut client = self.client.clone();
        let response = self
            .runtime
            .block_on(client.list_pod_sandbox(k8s_cri::v1::ListPodSandboxRequest { filter: None }))
            .map_err(|s| format!("ListPodSandbox: {}", s.message()))?
            .into_inner();
        Ok(response.items.into_iter().map(|s| s.id).collect())
    }

    /// `StopPodSandbox`: containerd runs CNI DEL with the pod's netns.
    pub fn stop(&self, id: &str) -> Result<(), String> {
        let mut client = self.client.clone();
        self.runtime
            .block_on(client.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            }))
            .map_err(|s| format!("StopPodSandbox {id}: {}", s.message()))?;
        Ok(())
    }

    /// `RemovePodSandbox`: containerd runs CNI DEL again, without a netns.
    pub fn remove(&self, id: &str) -> Result<(), String> {
        let mut client = self.client.clone();
        self.runtime
            .block_on(client.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            }))
            .map_err(|s| format!("RemovePodSandbox {id}: {}", s.message()))?;
        Ok(())
    }
}
