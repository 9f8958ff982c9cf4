//! This node's CNI network config: rendered from its pod CIDRs and MTU, written into
//! the conf dir atomically and only when its bytes change (runtimes watch the
//! directory and reload on every write).

use std::io;
use std::path::Path;

use ipnetwork::IpNetwork;
use serde_json::{Value, json};

/// What shapes the conflist besides the pod CIDRs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConflistSettings {
    /// The network's `name`.
    pub network_name: String,
    /// The bridge's name.
    pub bridge: String,
    /// host-local's `dataDir`, when not its default.
    pub ipam_data_dir: Option<String>,
    /// Whether a `portmap` plugin is installed, so hostPorts work.
    pub portmap: bool,
    /// Whether a `bandwidth` plugin is installed, so the pod annotations
    /// `kubernetes.io/ingress-bandwidth` and `egress-bandwidth` are enforced.
    pub bandwidth: bool,
    /// Where the bridge plugin records each new pod's addresses for NetworkPolicy
    /// (`podRecordDir`), when the agent enforces it.
    pub pod_record_dir: Option<String>,
}

/// The cap on the burst the runtime passes with the pod annotations (2^32-1 bits from
/// containerd, which would let a `10M` pod send its first ~500 MB at line rate): what
/// the pod's own rate sends in 20 ms, at least 4 packets. A fixed number of bits cannot
/// serve every rate (a burst that keeps a 1 Mbit/s pod's first second within its
/// limit starves a 1 Gbit/s bucket below what the kernel's timer needs), a time can: 20
/// ms adds at most 2% to the first second of any rate and is well above the timer's
/// tick, so fast pods still reach their rate.
pub const BANDWIDTH_MAX_BURST_MS: u64 = 20;

/// The conflist's bytes: our `bridge` with `host-local` (one range set per pod CIDR,
/// a default route per family), then `portmap` and `bandwidth` when installed, then
/// `loopback`.
///
/// `ipMasq` is off: masquerading by the bridge would also NAT pod-to-pod traffic to
/// other nodes; the agent masquerades only what leaves the cluster.
pub fn render(pod_cidrs: &[IpNetwork], mtu: u32, settings: &ConflistSettings) -> Vec<u8> {
    let ranges: Vec<Value> = pod_cidrs
        .iter()
        .map(|c| json!([{ "subnet": c.to_string() }]))
        .collect();
    let mut routes = Vec::new();
    if pod_cidrs.iter().any(IpNetwork::is_ipv4) {
        routes.push(json!({ "dst": "0.0.0.0/0" }));
    }
    if pod_cidrs.iter().any(IpNetwork::is_ipv6) {
        routes.push(json!({ "dst": "::/0" }));
    }
    let mut ipam = json!({
        "type": "host-local",
        "ranges": ranges,
        "routes": routes,
    });
    if let Some(dir) = &settings.ipam_data_dir {
        ipam["dataDir"] = json!(dir);
    }
    let mut bridge = json!({
        "type": "bridge",
        "bridge": settings.bridge,
        "isGateway": true,
        "ipMasq": false,
        "hairpinMode": true,
        "mtu": mtu,
    });
    if let Some(dir) = &settings.pod_record_dir {
        bridge["podRecordDir"] = json!(dir);
    }
    bridge["ipam"] = ipam;
    let mut plugins = vec![bridge];
    if settings.portmap {
        plugins.push(json!({
            "type": "portmap",
            "capabilities": { "portMappings": true },
        }));
    }
    if settings.bandwidth {
        plugins.push(json!({
            "type": "bandwidth",
            "capabilities": { "bandwidth": true },
            "maxBurstMs": BANDWIDTH_MAX_BURST_MS,
        }));
    }
    plugins.push(json!({ "type": "loopback" }));
    let conf = json!({
        // 1.0.0: spoken by our plugins and the reference's alike, so a reference
        // portmap in the same bin dir works in the chain.
        "cniVersion": "1.0.0",
        "name": settings.network_name,
        "plugins": plugins,
    });
    let mut bytes = serde_json::to_vec_pretty(&conf).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Writes `bytes` as `dir/name` unless the file already holds exactly them; returns
/// whether it wrote. Atomic: a temp file beside it, fsync, rename, fsync of the dir.
pub fn write_if_changed(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<bool> {
    match std::fs::read(dir.join(name)) {
        Ok(current) if current == bytes => return Ok(false),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(dir)?;
    cni_atomic_file::write(dir, name, bytes, 0o644)?;
    Ok(true)
}

/// Config files in `dir` that a runtime would load before `name` (libcni and CRI-O
/// take the first in name order), so the operator can be told ours is not the one in
/// use.
pub fn shadowing(dir: &Path, name: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut before: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| {
            !f.starts_with('.')
                && [".conflist", ".conf", ".json"]
                    .iter()
                    .any(|ext| f.ends_with(ext))
                && f.as_str() < name
        })
        .collect();
    before.sort();
    before
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(portmap: bool) -> ConflistSettings {
        ConflistSettings {
            network_name: "k8s-pod-network".into(),
            bridge: "cni0".into(),
            ipam_data_dir: None,
            portmap,
            bandwidth: portmap,
            pod_record_dir: None,
        }
    }

    #[test]
    fn dual_stack_with_portmap() {
        let cidrs: Vec<IpNetwork> = vec![
            "10.244.1.0/24".parse().unwrap(),
            "fd00:244:0:1::/64".parse().unwrap(),
        ];
        let got: Value = serde_json::from_slice(&render(&cidrs, 1400, &settings(true))).unwrap();
        assert_eq!(
            got,
            json!({
                "cniVersion": "1.0.0",
                "name": "k8s-pod-network",
                "plugins": [
                    {
                        "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
                        "hairpinMode": true, "mtu": 1400,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:244:0:1::/64"}]],
                            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": true}},
                    {"type": "bandwidth", "capabilities": {"bandwidth": true}, "maxBurstMs": 20},
                    {"type": "loopback"},
                ],
            })
        );
    }

    #[test]
    fn single_stack_without_portmap() {
        let cidrs: Vec<IpNetwork> = vec!["fd00:244:0:1::/64".parse().unwrap()];
        let s = ConflistSettings {
            ipam_data_dir: Some("/var/lib/pods".into()),
            pod_record_dir: Some("/run/records".into()),
            ..settings(false)
        };
        let got: Value = serde_json::from_slice(&render(&cidrs, 1500, &s)).unwrap();
        assert_eq!(got["plugins"][0]["ipam"]["dataDir"], "/var/lib/pods");
        assert_eq!(got["plugins"][0]["podRecordDir"], "/run/records");
        assert_eq!(
            got["plugins"][0]["ipam"]["routes"],
            json!([{"dst": "::/0"}])
        );
        assert_eq!(got["plugins"][1], json!({"type": "loopback"}));
        assert_eq!(got["plugins"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn the_file_is_written_once_and_rewritten_on_change() {
        let dir = std::env::temp_dir().join(format!("cni-node-conflist-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let name = "10-cni-plugins-rs.conflist";
        assert!(write_if_changed(&dir, name, b"one\n").unwrap());
        assert!(!write_if_changed(&dir, name, b"one\n").unwrap());
        assert!(write_if_changed(&dir, name, b"two\n").unwrap());
        assert_eq!(std::fs::read(dir.join(name)).unwrap(), b"two\n");
        std::fs::write(dir.join("05-other.conf"), b"{}").unwrap();
        std::fs::write(dir.join("99-late.conflist"), b"{}").unwrap();
        assert_eq!(shadowing(&dir, name), vec!["05-other.conf".to_owned()]);
        // Nothing but the file itself is left behind (no temp files).
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, vec!["05-other.conf", name, "99-late.conflist"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
