//! Objects as a real cluster holds them, for tests and the scale benchmark, so the
//! agent parses what a real cluster sends: Nodes as a kubelet and the controller manager
//! write them (labels, annotations, pod CIDRs, addresses, capacity, conditions, node
//! info, an image list), Pods as a Deployment and the kubelet leave them (owner, named
//! container ports, pod IPs of both families, conditions, container statuses),
//! Namespaces with labels, and NetworkPolicies and ClusterNetworkPolicies from their
//! spec in JSON.

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

/// A running Pod `namespace/name` of a Deployment, scheduled on `node_name`, with
/// `labels`, `pod_ips` as `podIPs` (the first also as `podIP`; one per family in a
/// dual-stack cluster), `hostNetwork: false`, and two containers with named ports:
/// `app` (`http` 8080/TCP, `metrics` 9090/TCP) and `sidecar` (`grpc` 50051/TCP, `dns`
/// 5353/UDP). About 4 KB of JSON. Change the JSON for anything else.
pub fn realistic_pod(
    namespace: &str,
    name: &str,
    node_name: &str,
    pod_ips: &[&str],
    labels: &[(&str, &str)],
) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    let owner = name.rsplit_once('-').map_or(name, |(rs, _)| rs);
    let condition = |kind: &str| {
        json!({
            "type": kind, "status": "True", "lastProbeTime": null,
            "lastTransitionTime": "2026-11-24T09:30:12Z",
        })
    };
    let container_status = |container: &str, image: &str, id: u64| {
        json!({
            "name": container, "ready": true, "restartCount": 0, "started": true,
            "image": image,
            "imageID": format!("{image}@sha256:{:064x}", u128::from(id) * 0x9e37_79b9_7f4a_7c15),
            "containerID": format!("containerd://{:064x}", u128::from(id) * 0x2545_f491_4f6c_dd1d),
            "state": {"running": {"startedAt": "2026-11-24T09:30:14Z"}},
            "lastState": {},
            "volumeMounts": [{
                "name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": true, "recursiveReadOnly": "Disabled",
            }],
        })
    };
    let resources = json!({
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    });
    let mount = json!([{
        "name": "kube-api-access",
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": true,
    }]);
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "generateName": format!("{owner}-"),
            "labels": labels,
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-24T09:30:00Z"},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                "uid": "7d3c2b1a-0f9e-4d8c-b7a6-5e4d3c2b1a09",
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example.com/shop/app:v2.14.1",
                    "args": ["--listen=:8080", "--metrics=:9090"],
                    "ports": [
                        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
                        {"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
                    ],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}}],
                    "resources": resources,
                    "readinessProbe": {
                        "httpGet": {"path": "/ready", "port": "http", "scheme": "HTTP"},
                        "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3,
                    },
                    "volumeMounts": mount,
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                },
                {
                    "name": "sidecar",
                    "image": "registry.example.com/platform/sidecar:v1.9.0",
                    "ports": [
                        {"name": "grpc", "containerPort": 50051, "protocol": "TCP"},
                        {"name": "dns", "containerPort": 5353, "protocol": "UDP"},
                    ],
                    "resources": resources,
                    "volumeMounts": mount,
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                },
            ],
            "volumes": [{
                "name": "kube-api-access",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                    ],
                },
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": node_name,
            "hostNetwork": false,
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                condition("PodReadyToStartContainers"),
                condition("Initialized"),
                condition("Ready"),
                condition("ContainersReady"),
                condition("PodScheduled"),
            ],
            "hostIP": "198.18.0.1",
            "hostIPs": [{"ip": "198.18.0.1"}],
            "podIP": pod_ips.first(),
            "podIPs": pod_ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
            "startTime": "2026-11-24T09:30:12Z",
            "containerStatuses": [
                container_status("app", "registry.example.com/shop/app:v2.14.1", 1),
                container_status("sidecar", "registry.example.com/platform/sidecar:v1.9.0", 2),
            ],
            "qosClass": "Burstable",
        },
    })
}

/// An active Namespace `name` with `labels` and the `kubernetes.io/metadata.name` label
/// the API server gives every Namespace.
pub fn realistic_namespace(name: &str, labels: &[(&str, &str)]) -> Value {
    let mut all = serde_json::Map::new();
    for (k, v) in labels {
        all.insert((*k).to_owned(), json!(v));
    }
    all.insert("kubernetes.io/metadata.name".into(), json!(name));
    json!({
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": all},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// A NetworkPolicy `namespace/name` whose spec is `spec`, the JSON of a manifest's
/// `spec:` (`podSelector`, `policyTypes`, `ingress`, `egress`), as written:
///
/// ```
/// # use serde_json::json;
/// let policy = cni_kube_api::network_policy("shop", "web-from-frontend", json!({
///     "podSelector": {"matchLabels": {"app": "web"}},
///     "policyTypes": ["Ingress"],
///     "ingress": [{
///         "from": [{"namespaceSelector": {"matchLabels": {"team": "frontend"}}}],
///         "ports": [{"protocol": "TCP", "port": "http"}],
///     }],
/// }));
/// assert_eq!(policy["kind"], "NetworkPolicy");
/// ```
pub fn network_policy(namespace: &str, name: &str, spec: Value) -> Value {
    json!({
        "kind": "NetworkPolicy",
        "apiVersion": "networking.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": spec,
    })
}

/// A ClusterNetworkPolicy `name` (cluster-scoped) whose spec is `spec`, the JSON of a
/// manifest's `spec:` (`tier`, `priority`, `subject`, `ingress`, `egress`), as written:
///
/// ```
/// # use serde_json::json;
/// let policy = cni_kube_api::cluster_network_policy("deny-to-payments", json!({
///     "tier": "Admin",
///     "priority": 10,
///     "subject": {"namespaces": {"matchLabels": {"team": "frontend"}}},
///     "egress": [{
///         "name": "no-payments",
///         "action": "Deny",
///         "to": [{"namespaces": {"matchLabels": {"team": "payments"}}}],
///     }],
/// }));
/// assert_eq!(policy["apiVersion"], "policy.networking.k8s.io/v1alpha2");
/// ```
pub fn cluster_network_policy(name: &str, spec: Value) -> Value {
    json!({
        "kind": "ClusterNetworkPolicy",
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "metadata": {"name": name, "generation": 1},
        "spec": spec,
    })
}

/// The `env` label values of the benchmark's namespaces, in the order they take them.
pub const BENCHMARK_ENVS: [&str; 3] = ["prod", "staging", "dev"];

/// ClusterNetworkPolicy `k` of the NetworkPolicy benchmark's tier run (and of the
/// agent's in-process timing of it): Admin when `k` is even, Baseline when odd;
/// `1 + k % 25` ingress rules and half as many egress rules. Its peers are namespaces of
/// teams 3 to 9 or the DNS and monitoring namespaces, pods of those teams, and
/// documentation networks, never the benchmark's client or server (teams 1 and 2) nor
/// the addresses the changes admit, so no verdict of the test changes; its rules still
/// cover the benchmark's server `port` and every protocol form.
pub fn benchmark_cluster_policy(k: u32, port: u16) -> Value {
    let admin = k.is_multiple_of(2);
    let team = |r: u32| format!("team-{}", 3 + (k + r) % 7);
    let actions: &[&str] = if admin {
        &["Deny", "Accept", "Pass"]
    } else {
        &["Deny", "Accept"]
    };
    let rule = |r: u32, way: &str| {
        let peer = match r % 4 {
            0 => json!({"namespaces": {"matchLabels": {"team": team(r)}}}),
            1 => json!({"pods": {
                "namespaceSelector": {"matchLabels": {"team": team(r)}},
                "podSelector": {"matchLabels": {"app": format!("app-{}", r % 10)}},
            }}),
            2 if way == "to" => json!({"networks": [
                format!("203.0.113.{}/32", r % 256),
                "198.51.100.0/24",
                format!("2001:db8::{r:x}/128"),
            ]}),
            2 => json!({"namespaces": {"matchLabels": {"purpose": "monitoring"}}}),
            _ => json!({"namespaces": {"matchExpressions": [
                {"key": "purpose", "operator": "In", "values": ["dns", "monitoring"]},
            ]}}),
        };
        let mut rule = json!({
            "name": format!("rule-{r}"),
            "action": actions[(r % actions.len() as u32) as usize],
            way: [peer],
        });
        match r % 5 {
            0 => {}
            1 => rule["protocols"] = json!([{"tcp": {"destinationPort": {"number": port}}}]),
            2 => {
                rule["protocols"] = json!([{"tcp": {"destinationPort": {"range": {
                    "start": 9000 + r, "end": 9100 + r}}}}, {"udp": {"destinationPort": {"number": 53}}}]);
            }
            3 => rule["protocols"] = json!([{"destinationNamedPort": "metrics"}]),
            _ => rule["protocols"] = json!([{"sctp": {"destinationPort": {"number": 9003}}}]),
        }
        rule
    };
    let ingress: Vec<Value> = (0..=k % 25).map(|r| rule(r, "from")).collect();
    let egress: Vec<Value> = (0..(k % 25).div_ceil(2)).map(|r| rule(r, "to")).collect();
    let subject = if k.is_multiple_of(5) {
        json!({"namespaces": {}})
    } else {
        json!({"namespaces": {"matchLabels": {"env": BENCHMARK_ENVS[(k % 3) as usize]}}})
    };
    cluster_network_policy(
        &format!("{}-{k}", if admin { "admin" } else { "baseline" }),
        json!({
            "tier": if admin { "Admin" } else { "Baseline" },
            "priority": (k / 2 * 20 + k % 20) % 1000,
            "subject": subject,
            "ingress": ingress,
            "egress": egress,
        }),
    )
}
