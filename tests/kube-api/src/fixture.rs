//! Nodes as a kubelet and the controller manager write them, for tests and the scale
//! benchmark: labels, annotations, pod CIDRs, addresses, capacity, conditions, node
//! info and an image list, so the agent parses what a real cluster sends.

use serde_json::{Value, json};

/// A Node named `name` with `pod_cidrs` (also as the single `podCIDR`), one
/// `InternalIP` per entry of `internal_ips`, and `images` image entries (40 make about
/// 15 KB of JSON).
pub fn realistic_node(
    name: &str,
    pod_cidrs: &[&str],
    internal_ips: &[&str],
    images: usize,
) -> Value {
    let mut addresses: Vec<Value> = internal_ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .collect();
    addresses.push(json!({"type": "Hostname", "address": name}));
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": kind, "status": status,
            "lastHeartbeatTime": "2026-11-24T10:41:07Z",
            "lastTransitionTime": "2026-11-20T08:12:44Z",
            "reason": reason, "message": message,
        })
    };
    let images: Vec<Value> = (0..images)
        .map(|i| {
            let repo = format!(
                "europe-west4-docker.pkg.example.com/platform-project-{}/team-{}/backend-service-{i}",
                10_000 + i * 7,
                i % 7
            );
            json!({
                "names": [
                    format!("{repo}@sha256:{:064x}", (i as u128 + 1) * 0x9e37_79b9_7f4a_7c15),
                    format!("{repo}:v1.{}.{}", i % 13, i % 5),
                ],
                "sizeBytes": 12_000_000 + i * 1_048_576,
            })
        })
        .collect();
    let mut spec = json!({"providerID": format!("test://{name}")});
    if let Some(first) = pod_cidrs.first() {
        spec["podCIDR"] = json!(first);
        spec["podCIDRs"] = json!(pod_cidrs);
    }
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "standard-4",
                "topology.kubernetes.io/region": "region-1",
                "topology.kubernetes.io/zone": "region-1-b",
            },
            "annotations": {
                "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": spec,
        "status": {
            "capacity": {"cpu": "4", "ephemeral-storage": "102626232Ki", "hugepages-2Mi": "0", "memory": "16331268Ki", "pods": "110"},
            "allocatable": {"cpu": "4", "ephemeral-storage": "94580335255", "hugepages-2Mi": "0", "memory": "16228868Ki", "pods": "110"},
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                condition("NetworkUnavailable", "False", "RouteCreated", "the node agent routes this node's pod CIDR"),
            ],
            "addresses": addresses,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "5f1ab2c3d4e5f60718293a4b5c6d7e8f",
                "systemUUID": "6a7b8c9d-0e1f-2a3b-4c5d-6e7f8a9b0c1d",
                "bootID": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
                "kernelVersion": "6.1.0-27-amd64",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": "v1.34.0",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images,
        },
    })
}
