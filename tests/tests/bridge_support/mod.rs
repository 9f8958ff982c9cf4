//! Shared pieces of the bridge black-box tests (`bridge*.rs`): a throwaway network
//! (host netns + IPAM `dataDir` + unique bridge and network names), config builders,
//! plugin calls, and readers for the kernel and firewall state the plugin leaves behind.
//!
//! Each test file includes this with `mod bridge_support;`; not every file uses every
//! helper.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cni_blackbox::{Netns, Outcome, Plugin, TempDir, in_ci, kernel, unique_ifname, unique_name};
use serde_json::{Value, json};

/// The reference bridge (containernetworking/plugins v1.1.1 on this machine).
pub const REFERENCE_DIR: &str = "/usr/lib/cni";

/// One throwaway network: its own host netns (where the bridge, host veths, sysctls and
/// firewall rules live), its own IPAM `dataDir`, and unique bridge and network names.
/// Dropping it deletes the host netns (and with it everything the plugin made there)
/// and the `dataDir`.
pub struct Net {
    pub host: Netns,
    pub data: TempDir,
    pub bridge: String,
    pub name: String,
}

impl Net {
    pub fn new() -> Self {
        Self {
            host: Netns::new("cnibb-br-host"),
            data: TempDir::new("cnibb-br-data"),
            bridge: unique_ifname("cbr"),
            name: unique_name("brnet"),
        }
    }

    /// A fresh pod netns (removed when the returned guard drops).
    pub fn pod(&self) -> Netns {
        Netns::new("cnibb-br-pod")
    }

    /// A bridge config: `ipam` is host-local on this network's `dataDir` with one range
    /// set per subnet; `extra` keys are merged over the top level (a `null` removes the
    /// key). An empty `subnets` gives the layer-2 config `"ipam": {}`.
    pub fn conf(&self, version: &str, subnets: &[&str], extra: &Value) -> Value {
        let ipam = if subnets.is_empty() {
            json!({})
        } else {
            let ranges: Vec<Value> = subnets.iter().map(|s| json!([{"subnet": s}])).collect();
            json!({"type": "host-local", "dataDir": self.data.path_str(), "ranges": ranges})
        };
        let mut conf = json!({
            "cniVersion": version,
            "name": self.name,
            "type": "bridge",
            "bridge": self.bridge,
            "ipam": ipam,
        });
        merge(&mut conf, extra);
        conf
    }

    /// One command of one attachment, with our binaries.
    pub fn run(&self, command: &str, conf: &Value, id: &str, pod: &Netns, ifname: &str) -> Outcome {
        self.plugin(command, conf).attachment(id, pod, ifname).run()
    }

    /// The builder for a command, for tests that need more env (CNI_ARGS, empty netns).
    pub fn plugin(&self, command: &str, conf: &Value) -> Plugin<'_> {
        Plugin::new("bridge", &self.host)
            .command(command)
            .config(conf)
    }

    /// The same with the reference binary and the reference's `CNI_PATH`.
    pub fn run_reference(
        &self,
        command: &str,
        conf: &Value,
        id: &str,
        pod: &Netns,
        ifname: &str,
    ) -> Outcome {
        Plugin::at(&Path::new(REFERENCE_DIR).join("bridge"), &self.host)
            .cni_path(REFERENCE_DIR)
            .command(command)
            .config(conf)
            .attachment(id, pod, ifname)
            .run()
    }

    /// Reservation files of this network: address → content (`<id>\r\n<ifname>`).
    pub fn reservations(&self) -> BTreeMap<String, String> {
        cni_blackbox::ipam::reservations(&self.data.path().join(&self.name))
    }

    /// Host veths (the pods' peers) in the host netns.
    pub fn host_veths(&self) -> Vec<String> {
        veths(&self.host)
    }

    /// Waits (bounded) until no host veth is left: after a pod netns is deleted the
    /// kernel removes its veth pairs asynchronously.
    pub fn wait_host_veths_gone(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.host_veths().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `ip -d -j link show dev <bridge>`.
    pub fn bridge_link(&self) -> Option<Value> {
        link_details(&self.host, &self.bridge)
    }

    /// Links in the host netns that are bridges.
    pub fn bridges(&self) -> Vec<String> {
        names(&kernel::ip_json(
            &self.host,
            &["link", "show", "type", "bridge"],
        ))
    }

    /// The bridge's addresses of one family (`-4` or `-6`), without link-local ones.
    pub fn bridge_addrs(&self, family: &str) -> Vec<String> {
        global_addrs(&self.host, family, &self.bridge)
    }

    /// iptables-save + ip6tables-save in the host netns.
    pub fn iptables(&self) -> String {
        let mut text = self.host.exec_ok(&["iptables-save"]);
        text.push_str(&self.host.exec_ok(&["ip6tables-save"]));
        text
    }

    /// `nft list ruleset` in the host netns.
    pub fn nft(&self) -> String {
        self.host.exec_ok(&["nft", "list", "ruleset"])
    }

    /// Panics unless no attachment is left: no host veth, no reservation, no masquerade
    /// rule in either backend, no spoof-check chain. `what` names the moment.
    #[track_caller]
    pub fn assert_nothing_left(&self, what: &str) {
        assert_eq!(
            self.host_veths(),
            Vec::<String>::new(),
            "{what}: host veths left"
        );
        assert_eq!(
            self.reservations(),
            BTreeMap::new(),
            "{what}: reservations left"
        );
        assert_no_masq_rules(self, what);
        assert_eq!(
            self.pod_records(),
            BTreeMap::new(),
            "{what}: pod records left"
        );
    }

    /// This network's `podRecordDir` (inside its `dataDir`, so it goes with it).
    pub fn records_dir(&self) -> PathBuf {
        // Not "pods": that is a network name of conf/, whose IPAM state is
        // <dataDir>/<network>.
        self.data.path().join("pod-records")
    }

    /// Every file in [`Self::records_dir`], staged (hidden) ones too: name → content.
    pub fn pod_records(&self) -> BTreeMap<String, String> {
        let Ok(list) = std::fs::read_dir(self.records_dir()) else {
            return BTreeMap::new();
        };
        list.map(|e| {
            let e = e.expect("read the records dir");
            let name = e.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            (name, text)
        })
        .collect()
    }

    /// Makes the node agent's NetworkPolicy table in the host netns by hand, with
    /// only what the plugin touches: the two pending sets.
    pub fn create_policy_table(&self) {
        self.host
            .exec_ok(&["nft", "add", "table", "inet", POLICY_TABLE]);
        for (set, kind) in [("pending4", "ipv4_addr"), ("pending6", "ipv6_addr")] {
            let spec = format!("{{ type {kind} ; }}");
            self.host
                .exec_ok(&["nft", "add", "set", "inet", POLICY_TABLE, set, &spec]);
        }
    }

    /// The addresses in the pending sets, each with its comment (the pod it was added
    /// for, or empty); `None` when the table does not exist.
    pub fn pending(&self) -> Option<BTreeMap<String, String>> {
        let mut held = BTreeMap::new();
        for set in ["pending4", "pending6"] {
            let out = self
                .host
                .exec(&["nft", "-j", "list", "set", "inet", POLICY_TABLE, set]);
            if !out.status.success() {
                return None;
            }
            let dump: Value = serde_json::from_slice(&out.stdout).expect("nft -j output");
            let elems = dump["nftables"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| o["set"]["elem"].as_array())
                .flatten();
            for elem in elems {
                // A bare address, or {"elem": {"val": address, "comment": pod}}.
                let inner = if elem["elem"].is_object() {
                    &elem["elem"]
                } else {
                    elem
                };
                let (val, comment) = match inner.as_str() {
                    Some(addr) => (addr.to_owned(), String::new()),
                    None => (
                        inner["val"].as_str().unwrap_or_default().to_owned(),
                        inner["comment"].as_str().unwrap_or_default().to_owned(),
                    ),
                };
                held.insert(val, comment);
            }
        }
        Some(held)
    }
}

/// The node agent's NetworkPolicy table (family `inet`).
pub const POLICY_TABLE: &str = "cni_node_policy";

/// Panics if any masquerade, spoof-check or port-security rule of ours is in the host
/// netns (the port-security table's empty base chain and map may stay).
#[track_caller]
pub fn assert_no_masq_rules(net: &Net, what: &str) {
    let ipt = net.iptables();
    assert!(
        !ipt.contains("CNI-"),
        "{what}: iptables masquerade rules left:\n{ipt}"
    );
    let nft = net.nft();
    for needle in [
        "masquerade comment",
        "cni-br-iface-",
        "macspoofchk-",
        "chain port-",
        "elements =",
    ] {
        assert!(
            !nft.contains(needle),
            "{what}: nftables rules left ({needle}):\n{nft}"
        );
    }
}

/// Merges `extra`'s keys into `target` (top level only; `null` removes a key).
pub fn merge(target: &mut Value, extra: &Value) {
    if let (Some(t), Some(e)) = (target.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            if v.is_null() {
                t.remove(k);
            } else {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

/// `ip -d -j link show dev <dev>`'s entry, or `None` when there is no such link.
pub fn link_details(ns: &Netns, dev: &str) -> Option<Value> {
    kernel::link(ns, dev)?;
    kernel::ip_json(ns, &["-d", "link", "show", "dev", dev])
        .as_array()
        .and_then(|a| a.first())
        .cloned()
}

/// `ifname`s of an `ip -j link` listing.
pub fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
        .collect()
}

/// Every veth in `ns`.
pub fn veths(ns: &Netns) -> Vec<String> {
    names(&kernel::ip_json(ns, &["link", "show", "type", "veth"]))
}

/// Whether `dev` exists in `ns`.
pub fn has_link(ns: &Netns, dev: &str) -> bool {
    kernel::link(ns, dev).is_some()
}

/// `dev`'s MAC address as the kernel reports it.
pub fn mac_of(ns: &Netns, dev: &str) -> String {
    kernel::link(ns, dev)
        .and_then(|l| l["address"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no link {dev} in {}", ns.name()))
}

/// `dev`'s MTU.
pub fn mtu_of(ns: &Netns, dev: &str) -> u64 {
    kernel::link(ns, dev)
        .and_then(|l| l["mtu"].as_u64())
        .unwrap_or_else(|| panic!("no link {dev} in {}", ns.name()))
}

/// `dev`'s non-link-local addresses of `family` (`-4`/`-6`) as `addr/prefix`.
pub fn global_addrs(ns: &Netns, family: &str, dev: &str) -> Vec<String> {
    kernel::ip_json(ns, &[family, "addr", "show", "dev", dev])
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["scope"] != "link")
        .filter_map(|a| {
            Some(format!(
                "{}/{}",
                a["local"].as_str()?,
                a["prefixlen"].as_u64()?
            ))
        })
        .collect()
}

/// `bridge -d -j link show dev <port>`'s entry (hairpin, isolated, state, master).
pub fn bridge_port(ns: &Netns, port: &str) -> Value {
    let text = ns.exec_ok(&["bridge", "-d", "-j", "link", "show", "dev", port]);
    let parsed: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("bridge -j link show dev {port}: {e}: {text}"));
    parsed
        .as_array()
        .and_then(|a| a.first())
        .cloned()
        .unwrap_or_else(|| panic!("{port} is not a bridge port in {}: {text}", ns.name()))
}

/// Routes of `ns` (`-4` or `-6`) as `dst via gw dev dev` lines, sorted, without the
/// kernel's own link-local and multicast entries.
pub fn route_lines(ns: &Netns, family: &str) -> Vec<String> {
    let mut lines: Vec<String> = kernel::ip_json(ns, &[family, "route", "show"])
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| {
            let dst = r["dst"].as_str().unwrap_or_default();
            !dst.starts_with("fe80:") && !dst.starts_with("ff00:")
        })
        .map(|r| {
            let mut line = r["dst"].as_str().unwrap_or_default().to_owned();
            if let Some(gw) = r["gateway"].as_str() {
                line.push_str(&format!(" via {gw}"));
            }
            line.push_str(&format!(" dev {}", r["dev"].as_str().unwrap_or_default()));
            line
        })
        .collect();
    lines.sort();
    lines
}

/// Pings `dst` from `from` (one echo per try), retrying for a bounded time: the first
/// packets may race neighbour discovery and IPv6 DAD of the target address, which the
/// kernel completes asynchronously. Returns the last output on failure.
pub fn ping(from: &Netns, dst: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = from.exec(&["ping", "-c", "1", "-W", "1", dst]);
        if out.status.success() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Result text with everything random replaced by placeholders: the names given in
/// `names` (bridge, netns path, ...) by their labels, veth names by `@VETH@` and MACs by
/// `@MAC@` (except those in `keep`, e.g. a MAC the config asked for).
pub fn normalize(value: &Value, names: &[(&str, &str)], keep: &[&str]) -> Value {
    match value {
        Value::String(s) => {
            if keep.contains(&s.as_str()) {
                return value.clone();
            }
            if let Some((_, label)) = names.iter().find(|(n, _)| n == s) {
                return json!(label);
            }
            if s.len() == 12 && s.starts_with("veth") {
                return json!("@VETH@");
            }
            let is_mac = s.len() == 17
                && s.split(':').count() == 6
                && s.split(':')
                    .all(|p| p.len() == 2 && u8::from_str_radix(p, 16).is_ok());
            if is_mac {
                return json!("@MAC@");
            }
            value.clone()
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| normalize(v, names, keep)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), normalize(v, names, keep)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The reference bridge, or `None` (skip) when it is not installed; under CI a missing
/// reference is a failure.
pub fn reference_available() -> bool {
    let path = PathBuf::from(REFERENCE_DIR).join("bridge");
    if path.is_file() && Path::new(REFERENCE_DIR).join("host-local").is_file() {
        return true;
    }
    assert!(
        !in_ci(),
        "{} missing: install containernetworking-plugins",
        path.display()
    );
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: reference plugins not installed in {REFERENCE_DIR}"
    );
    false
}

/// Whether this kernel can make a VLAN-filtering bridge, tried in a private netns.
pub fn vlan_filtering_supported() -> bool {
    let ns = Netns::new("cnibb-br-vlanprobe");
    let out = ns.exec(&[
        "ip",
        "link",
        "add",
        "probe0",
        "type",
        "bridge",
        "vlan_filtering",
        "1",
    ]);
    out.status.success()
}
