//! Our plugins driven by the real runtime-side library, libcni (Debian's
//! golang-github-appc-cni-dev 1.1.2, the code containerd and CRI-O embed), through the
//! small Go program in `tests/interop/libcni-driver`.
//!
//! libcni does what a runtime does and what the other black-box tests only imitate: it
//! loads the conflist, builds each plugin's stdin (name, cniVersion, prevResult,
//! runtimeConfig from capabilities), chains prevResult through the list, joins CNI_ARGS,
//! caches the final ADD result and feeds it back as prevResult to CHECK and DEL (in
//! reverse order), and probes VERSION. Chains mix our binaries with the reference Go
//! plugins from `/usr/lib/cni` (firewall, tuning), so results flow from ours to theirs
//! and back; our portmap is driven on both backends with real connections.
//!
//! Each case gets its own host and pod netns, network name, bridge name, host-local
//! `dataDir` and libcni cache dir; the driver runs inside the host netns (`ip netns exec`)
//! so bridges, veths and iptables rules never reach the machine's own netns. Everything
//! is removed by the guards' Drop, also when an assertion fails.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod libcni_support;

use cni_blackbox::hostport::{
    NODE_V4, NODE_V6, client_on_uplink, dnat_chain, peer_seen, serve_peer_address, socket,
};
use cni_blackbox::{
    Netns, Outcome, TempDir, bin_dir, check_cases, kernel, require_root, unique_ifname, unique_name,
};
use libcni_support::run_driver;
use serde_json::{Value, json};

/// The reference plugins (Debian containernetworking-plugins 1.1.1). It also holds Go
/// `bridge`, `host-local` and `loopback`: CNI_PATH lists our dir first, and
/// [`our_binaries_are_found_first`] checks that libcni resolves those names to ours.
const REFERENCE_DIR: &str = "/usr/lib/cni";

/// CNI_ARGS exactly as kubelet (through containerd/CRI-O) sends them.
const K8S_ARGS: &str =
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod;K8S_POD_INFRA_CONTAINER_ID=id";

/// The spec versions libcni 1.1.2 and the reference plugins have in common, as a runtime
/// would write them in a conflist.
const VERSIONS: [&str; 3] = ["0.3.1", "0.4.0", "1.0.0"];

// ---------------------------------------------------------------------------------------
// The driver (built and run by `libcni_support`)
// ---------------------------------------------------------------------------------------

/// CNI_PATH: ours first, then the reference plugins.
fn cni_path() -> String {
    format!("{}:{REFERENCE_DIR}", bin_dir().display())
}

// ---------------------------------------------------------------------------------------
// One pod on one network
// ---------------------------------------------------------------------------------------

/// Host and pod netns, network and bridge names, dataDir, libcni cache and conflist dir
/// of one attachment. Drop removes all of it (the netns take their links and rules).
struct Lab {
    host: Netns,
    pod: Netns,
    /// CNI_NETNS: the pod's path (kept when the pod netns is deleted under the runtime).
    netns_path: String,
    data: TempDir,
    cache: TempDir,
    confdir: TempDir,
    network: String,
    bridge: String,
    id: String,
    ifname: String,
    cni_args: String,
}

impl Lab {
    fn new() -> Self {
        let pod = Netns::new("cnibb-lc-pod");
        Self {
            host: Netns::new("cnibb-lc-host"),
            netns_path: pod.path_str().to_owned(),
            pod,
            data: TempDir::new("cnibb-lc-data"),
            cache: TempDir::new("cnibb-lc-cache"),
            confdir: TempDir::new("cnibb-lc-conf"),
            network: unique_name("cnibb-lcnet"),
            bridge: unique_ifname("lcbr"),
            id: unique_name("cnibb-lcctr"),
            ifname: "eth0".to_owned(),
            cni_args: K8S_ARGS.to_owned(),
        }
    }

    /// `{"cniVersion", "name", "plugins"}` written as `<confdir>/<network>.conflist`.
    fn conflist(&self, version: &str, plugins: &[Value]) -> PathBuf {
        let list = json!({"cniVersion": version, "name": self.network, "plugins": plugins});
        let path = self
            .confdir
            .path()
            .join(format!("{}.conflist", self.network));
        fs::write(&path, serde_json::to_vec_pretty(&list).unwrap_or_default())
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// Our bridge with our host-local, masquerading, gateway on the bridge.
    fn bridge_plugin(&self, ranges: &Value, default_gw: bool) -> Value {
        json!({
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": true,
            "isDefaultGateway": default_gw,
            "ipMasq": true,
            "ipam": {
                "type": "host-local",
                "dataDir": self.data.path_str(),
                "ranges": ranges
            }
        })
    }

    /// One libcni operation on this attachment.
    fn libcni(&self, command: &str, conflist: &Path, cap_args: Option<&Value>) -> Outcome {
        let mut args = vec![
            command.to_owned(),
            "-conflist".to_owned(),
            conflist.display().to_string(),
            "-netns".to_owned(),
            self.netns_path.clone(),
            "-id".to_owned(),
            self.id.clone(),
            "-ifname".to_owned(),
            self.ifname.clone(),
            "-path".to_owned(),
            cni_path(),
            "-cache-dir".to_owned(),
            self.cache.path_str().to_owned(),
            "-args".to_owned(),
            self.cni_args.clone(),
        ];
        if let Some(caps) = cap_args {
            args.push("-cap-args".to_owned());
            args.push(caps.to_string());
        }
        run_driver(&self.host, &args)
    }

    /// ADD; panics unless it succeeded. Returns the result JSON.
    #[track_caller]
    fn add(&self, conflist: &Path, cap_args: Option<&Value>) -> Value {
        let out = self.libcni("add", conflist, cap_args);
        out.assert_success();
        out.json()
    }

    /// libcni's cache file for this attachment.
    fn cache_file(&self) -> PathBuf {
        self.cache
            .path()
            .join("results")
            .join(format!("{}-{}-{}", self.network, self.id, self.ifname))
    }

    /// The cached entry, checked for the fields a runtime relies on. Returns its result.
    #[track_caller]
    fn cached_result(&self) -> Value {
        let path = self.cache_file();
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("no libcni cache entry {}: {e}", path.display()));
        let entry: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(entry["kind"], "cniCacheV1", "{text}");
        assert_eq!(entry["containerId"], self.id.as_str(), "{text}");
        assert_eq!(entry["ifName"], self.ifname.as_str(), "{text}");
        assert_eq!(entry["networkName"], self.network.as_str(), "{text}");
        entry["result"].clone()
    }

    /// Reservation files (`ip -> content`) in the host-local dataDir for this network.
    fn reservations(&self) -> BTreeMap<String, String> {
        cni_blackbox::ipam::reservations(&self.data.path().join(&self.network))
    }

    /// Links of the host netns other than `lo` and the bridge, i.e. leftover veths.
    fn host_veths(&self) -> Vec<String> {
        link_names(&self.host)
            .into_iter()
            .filter(|n| n != "lo" && *n != self.bridge)
            .collect()
    }

    /// Panics if any firewall rule or non-base chain in the host netns mentions this
    /// attachment (container id, network name, any of `ips`).
    #[track_caller]
    fn assert_no_rules_left(&self, ips: &[String], context: &str) {
        let mut needles: Vec<&str> = vec![&self.id, &self.network];
        needles.extend(ips.iter().map(String::as_str));
        assert_no_rules_mention(&self.host, &needles, context);
    }
}

/// Names of every link in `ns`.
fn link_names(ns: &Netns) -> Vec<String> {
    kernel::links(ns)
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
        .collect()
}

/// Chains a reference plugin creates once per netns and leaves behind on purpose
/// (portmap's and firewall's base chains); nothing per container may remain.
const SHARED_CHAINS: [&str; 5] = [
    "CNI-HOSTPORT-DNAT",
    "CNI-HOSTPORT-MASQ",
    "CNI-HOSTPORT-SETMARK",
    "CNI-FORWARD",
    "CNI-ADMIN",
];

/// iptables-save, ip6tables-save and `nft list ruleset` of `ns`: no line may mention one
/// of `needles`, and no `CNI-` chain other than the shared base chains may exist.
#[track_caller]
fn assert_no_rules_mention(ns: &Netns, needles: &[&str], context: &str) {
    for save in ["iptables-save", "ip6tables-save"] {
        let text = ns.exec_ok(&[save]);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let hit = needles.iter().find(|n| line.contains(*n));
            assert!(
                hit.is_none(),
                "{context}: {save} in {} still mentions {hit:?}:\n{line}\n\n{text}",
                ns.name()
            );
            if let Some(chain) = line.strip_prefix(':') {
                let chain = chain.split_whitespace().next().unwrap_or_default();
                assert!(
                    !chain.starts_with("CNI-") || SHARED_CHAINS.contains(&chain),
                    "{context}: per-container chain {chain} left in {} ({save}):\n{text}",
                    ns.name()
                );
            }
        }
    }
    let nft = ns.exec(&["nft", "list", "ruleset"]);
    let text = String::from_utf8_lossy(&nft.stdout);
    let hit = needles.iter().find(|n| text.contains(*n));
    assert!(
        hit.is_none(),
        "{context}: nft ruleset in {} still mentions {hit:?}:\n{text}",
        ns.name()
    );
}

/// Addresses (`ip/prefix`) of a result's `ips`, in order.
fn result_addresses(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str().map(str::to_owned))
        .collect()
}

/// `a.b.c.d/n` -> `a.b.c.d`.
fn bare(cidr: &str) -> String {
    cidr.split('/').next().unwrap_or_default().to_owned()
}

/// The result carries `"version"` in its `ips` exactly for the 0.3.x/0.4.0 shape.
#[track_caller]
fn assert_ips_shape(result: &Value, version: &str) {
    for ip in result["ips"].as_array().into_iter().flatten() {
        let v040 = matches!(version, "0.3.0" | "0.3.1" | "0.4.0");
        assert_eq!(
            ip.get("version").is_some(),
            v040,
            "ips entry shape for {version}: {result:#}"
        );
    }
}

/// MAC and mtu of `dev` in `ns`.
fn mac_and_mtu(ns: &Netns, dev: &str) -> (String, u64) {
    let link = kernel::link(ns, dev).unwrap_or_else(|| panic!("no {dev} in {}", ns.name()));
    (
        link["address"].as_str().unwrap_or_default().to_owned(),
        link["mtu"].as_u64().unwrap_or_default(),
    )
}

/// The default route's gateway in `ns` for IPv4 (`v6` false) or IPv6.
fn default_gateway(ns: &Netns, v6: bool) -> Option<String> {
    let routes = if v6 {
        kernel::routes6(ns)
    } else {
        kernel::routes(ns)
    };
    routes
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["dst"] == "default")
        .and_then(|r| r["gateway"].as_str().map(str::to_owned))
}

// ---------------------------------------------------------------------------------------
// The checks shared by the bridge scenarios
// ---------------------------------------------------------------------------------------

/// What a bridge ADD result must say and the kernel must show. `expected` are the pod
/// addresses (`ip/prefix`) in result order, `gateways` the matching gateways.
#[track_caller]
fn assert_bridge_attachment(
    lab: &Lab,
    version: &str,
    result: &Value,
    expected: &[&str],
    gateways: &[&str],
) {
    let context = format!("{version}: {result:#}");
    assert_eq!(result["cniVersion"], version, "{context}");
    assert_ips_shape(result, version);
    let interfaces = result["interfaces"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        interfaces.len(),
        3,
        "bridge, host veth, pod iface: {context}"
    );
    assert_eq!(interfaces[0]["name"], lab.bridge.as_str(), "{context}");
    let host_veth = interfaces[1]["name"].as_str().unwrap_or_default();
    assert_eq!(interfaces[2]["name"], lab.ifname.as_str(), "{context}");
    assert_eq!(interfaces[2]["sandbox"], lab.pod.path_str(), "{context}");

    // The result's MACs are the kernel's.
    let (bridge_mac, _) = mac_and_mtu(&lab.host, &lab.bridge);
    let (veth_mac, _) = mac_and_mtu(&lab.host, host_veth);
    let (pod_mac, _) = mac_and_mtu(&lab.pod, &lab.ifname);
    assert_eq!(interfaces[0]["mac"], bridge_mac.as_str(), "{context}");
    assert_eq!(interfaces[1]["mac"], veth_mac.as_str(), "{context}");
    assert_eq!(interfaces[2]["mac"], pod_mac.as_str(), "{context}");
    let veth = kernel::link(&lab.host, host_veth).unwrap_or_default();
    assert_eq!(
        veth["master"],
        lab.bridge.as_str(),
        "host veth on the bridge"
    );

    assert_eq!(result_addresses(result), expected, "{context}");
    for (ip, gw) in result["ips"].as_array().into_iter().flatten().zip(gateways) {
        assert_eq!(ip["gateway"], *gw, "{context}");
        assert_eq!(ip["interface"], 2, "{context}");
    }
    let pod_addrs = kernel::addr_cidrs(&lab.pod, &lab.ifname);
    for addr in expected {
        assert!(
            pod_addrs.iter().any(|a| a == addr),
            "{addr} not on pod {}: {pod_addrs:?}",
            lab.ifname
        );
    }
    let bridge_addrs = kernel::addr_cidrs(&lab.host, &lab.bridge);
    for (addr, gw) in expected.iter().zip(gateways) {
        let prefix = addr.split('/').nth(1).unwrap_or_default();
        let want = format!("{gw}/{prefix}");
        assert!(
            bridge_addrs.contains(&want),
            "gateway {want} not on the bridge: {bridge_addrs:?}"
        );
    }

    // host-local reserved exactly these addresses for this attachment.
    let want: BTreeMap<String, String> = expected
        .iter()
        .map(|a| (bare(a), format!("{}\r\n{}", lab.id, lab.ifname)))
        .collect();
    assert_eq!(lab.reservations(), want, "reservation files");

    // libcni cached the final result; it is what CHECK and DEL will send as prevResult.
    assert_eq!(&lab.cached_result(), result, "cached result");

    // ipMasq: our chain for this container, with the reference comment.
    let nat = lab.host.exec_ok(&["iptables-save", "-t", "nat"]);
    let comment = format!(
        r#"--comment "name: \"{}\" id: \"{}\"""#,
        lab.network, lab.id
    );
    let v4 = expected.iter().find(|a| !a.contains(':'));
    if let Some(v4) = v4 {
        assert!(
            nat.lines().any(
                |l| l.starts_with(&format!("-A POSTROUTING -s {}/32 ", bare(v4)))
                    && l.contains(&comment)
            ),
            "no masquerade jump for {v4}:\n{nat}"
        );
    }
}

/// After DEL: no veth, no reservation, no rule, no cache entry; the pod iface is gone.
#[track_caller]
fn assert_all_gone(lab: &Lab, ips: &[String], context: &str) {
    assert_eq!(
        lab.host_veths(),
        Vec::<String>::new(),
        "{context}: host veths"
    );
    assert!(
        kernel::link(&lab.pod, &lab.ifname).is_none(),
        "{context}: pod {} survived DEL",
        lab.ifname
    );
    assert_eq!(
        lab.reservations(),
        BTreeMap::new(),
        "{context}: reservations"
    );
    assert!(
        !lab.cache_file().exists(),
        "{context}: libcni cache entry survived DEL"
    );
    let bare_ips: Vec<String> = ips.iter().map(|a| bare(a)).collect();
    lab.assert_no_rules_left(&bare_ips, context);
}

/// Pings `target` from the pod (traffic between our own namespaces only).
#[track_caller]
fn assert_pod_pings(lab: &Lab, target: &str) {
    let out = lab
        .pod
        .exec(&["ping", "-c", "1", "-W", "5", "-n", "-q", target]);
    assert!(
        out.status.success(),
        "pod cannot ping {target}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// CHECK: succeeds from 0.4.0 on; libcni itself refuses it for 0.3.1.
#[track_caller]
fn assert_check(lab: &Lab, version: &str, conflist: &Path, cap_args: Option<&Value>) {
    let out = lab.libcni("check", conflist, cap_args);
    if version == "0.3.1" {
        out.assert_failure();
        assert!(
            out.stderr
                .contains(r#"configuration version "0.3.1" does not support the CHECK command"#),
            "{out}"
        );
    } else {
        out.assert_success();
        assert_eq!(out.stdout, "", "{out}");
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

#[test]
fn our_binaries_are_found_first_and_libcni_reads_their_versions() {
    if !require_root() {
        return;
    }
    let host = Netns::new("cnibb-lc-host");
    for plugin in ["loopback", "bridge", "host-local"] {
        let found = run_driver(
            &host,
            &[
                "find".into(),
                "-plugin".into(),
                plugin.into(),
                "-path".into(),
                cni_path(),
            ],
        );
        found.assert_success();
        assert_eq!(
            found.json(),
            json!(bin_dir().join(plugin).display().to_string()),
            "libcni must run our {plugin}, not the reference one:\n{found}"
        );

        let version = run_driver(
            &host,
            &[
                "version".into(),
                "-plugin".into(),
                plugin.into(),
                "-path".into(),
                cni_path(),
            ],
        );
        version.assert_success();
        // The reference binaries stop at 1.0.0; ours also speak 1.1.0.
        assert_eq!(
            version.json()["supportedVersions"],
            json!(cni_blackbox::ALL_VERSIONS),
            "{version}"
        );
    }
}

#[test]
fn validate_network_list_reports_capabilities_at_each_version() {
    if !require_root() {
        return;
    }
    check_cases(&VERSIONS, |version| {
        let lab = Lab::new();
        let mut bridge = lab.bridge_plugin(&json!([[{"subnet": "10.42.0.0/24"}]]), true);
        // `ips` is read by host-local, but a capability belongs to the list entry whose
        // stdin carries runtimeConfig: the bridge, which hands its stdin to host-local.
        bridge["capabilities"] = json!({"mac": true, "ips": true});
        let conflist = lab.conflist(
            version,
            &[
                bridge,
                json!({"type": "portmap", "capabilities": {"portMappings": true}}),
                json!({"type": "tuning", "mtu": 1400}),
                json!({"type": "loopback"}),
            ],
        );
        let out = run_driver(
            &lab.host,
            &[
                "validate".into(),
                "-conflist".into(),
                conflist.display().to_string(),
                "-path".into(),
                cni_path(),
            ],
        );
        out.assert_success();
        assert_eq!(out.json(), json!(["ips", "mac", "portMappings"]), "{out}");
    });
}

#[test]
fn loopback_alone_add_check_del() {
    if !require_root() {
        return;
    }
    check_cases(&VERSIONS, |version| {
        let lab = Lab::new();
        let conflist = lab.conflist(version, &[json!({"type": "loopback"})]);
        let result = lab.add(&conflist, None);
        assert_eq!(result["cniVersion"], *version, "{result:#}");
        assert_eq!(
            result["interfaces"][0]["name"], "lo",
            "loopback result: {result:#}"
        );
        assert_eq!(
            result_addresses(&result),
            ["127.0.0.1/8", "::1/128"],
            "{result:#}"
        );
        assert_ips_shape(&result, version);
        assert!(kernel::link_is_up(&lab.pod, "lo"), "pod lo down after ADD");
        assert!(!kernel::link_is_up(&lab.host, "lo"), "host lo touched");
        assert_eq!(&lab.cached_result(), &result);

        assert_check(&lab, version, &conflist, None);

        lab.libcni("del", &conflist, None).assert_success();
        assert!(!kernel::link_is_up(&lab.pod, "lo"), "pod lo up after DEL");
        assert!(!lab.cache_file().exists(), "cache entry survived DEL");
    });
}

#[test]
fn bridge_host_local_ipv4_add_check_del_twice() {
    if !require_root() {
        return;
    }
    check_cases(&VERSIONS, |version| {
        let lab = Lab::new();
        let conflist = lab.conflist(
            version,
            &[lab.bridge_plugin(&json!([[{"subnet": "10.42.0.0/24"}]]), true)],
        );
        let result = lab.add(&conflist, None);
        assert_bridge_attachment(&lab, version, &result, &["10.42.0.2/24"], &["10.42.0.1"]);
        assert_eq!(
            default_gateway(&lab.pod, false).as_deref(),
            Some("10.42.0.1")
        );
        assert_pod_pings(&lab, "10.42.0.1");

        assert_check(&lab, version, &conflist, None);

        lab.libcni("del", &conflist, None).assert_success();
        assert_all_gone(&lab, &result_addresses(&result), "after DEL");
        // A runtime retries DEL (kubelet does, e.g. after a restart): without a cache
        // entry there is no prevResult, and it must still succeed.
        lab.libcni("del", &conflist, None).assert_success();
        assert_all_gone(&lab, &result_addresses(&result), "after second DEL");
    });
}

#[test]
fn bridge_host_local_dual_stack_add_check_del() {
    if !require_root() {
        return;
    }
    check_cases(&VERSIONS, |version| {
        let lab = Lab::new();
        let ranges = json!([[{"subnet": "10.43.0.0/24"}], [{"subnet": "fd43::/64"}]]);
        let conflist = lab.conflist(version, &[lab.bridge_plugin(&ranges, true)]);
        let result = lab.add(&conflist, None);
        assert_bridge_attachment(
            &lab,
            version,
            &result,
            &["10.43.0.2/24", "fd43::2/64"],
            &["10.43.0.1", "fd43::1"],
        );
        assert_eq!(
            default_gateway(&lab.pod, false).as_deref(),
            Some("10.43.0.1")
        );
        assert_eq!(default_gateway(&lab.pod, true).as_deref(), Some("fd43::1"));
        assert_pod_pings(&lab, "10.43.0.1");

        assert_check(&lab, version, &conflist, None);

        lab.libcni("del", &conflist, None).assert_success();
        assert_all_gone(&lab, &result_addresses(&result), "after DEL");
    });
}

/// A runtime whose pod netns is already gone (the pod was torn down first) still DELs
/// with the cached prevResult: our bridge and host-local must release everything.
#[test]
fn del_after_the_pod_netns_is_gone_releases_everything() {
    if !require_root() {
        return;
    }
    check_cases(&VERSIONS, |version| {
        let mut lab = Lab::new();
        let ranges = json!([[{"subnet": "10.44.0.0/24"}], [{"subnet": "fd44::/64"}]]);
        let conflist = lab.conflist(version, &[lab.bridge_plugin(&ranges, false)]);
        let result = lab.add(&conflist, None);
        let ips = result_addresses(&result);
        // The pod goes away under the runtime's feet; CNI_NETNS still names its path.
        let pod = std::mem::replace(&mut lab.pod, Netns::new("cnibb-lc-unused"));
        pod.delete();

        let del = lab.libcni("del", &conflist, None);
        del.assert_success();
        // The kernel removes the host end when it destroys the pod netns, in a work queue
        // after `ip netns delete` returned: wait for that (bounded), do not time it.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !lab.host_veths().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(lab.host_veths(), Vec::<String>::new(), "host veth: {del}");
        assert_eq!(lab.reservations(), BTreeMap::new(), "reservations: {del}");
        let bare_ips: Vec<String> = ips.iter().map(|a| bare(a)).collect();
        lab.assert_no_rules_left(&bare_ips, "DEL without netns");
    });
}

/// Our bridge + host-local and portmap, then the reference firewall and tuning, then our
/// loopback: results go from ours to theirs (firewall reads our IPs, tuning rewrites our
/// MAC) and back (our loopback passes tuning's result on; DEL and CHECK give our bridge
/// the cached result holding tuning's MAC).
#[test]
fn chained_with_reference_firewall_tuning() {
    if !require_root() {
        return;
    }
    const MAC: &str = "02:42:ac:11:00:99";
    check_cases(&VERSIONS, |version| {
        let lab = Lab::new();
        let ranges = json!([[{"subnet": "10.45.0.0/24"}], [{"subnet": "fd45::/64"}]]);
        // The reference firewall plugin supports 0.4.0 and later only.
        let firewall = *version != "0.3.1";
        let mut plugins = vec![
            lab.bridge_plugin(&ranges, true),
            json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}),
        ];
        if firewall {
            plugins.push(json!({"type": "firewall"}));
        }
        plugins.push(json!({
            "type": "tuning",
            "mtu": 1400,
            "mac": MAC,
            "sysctl": {"net.ipv4.conf.eth0.rp_filter": "2"}
        }));
        plugins.push(json!({"type": "loopback"}));
        let conflist = lab.conflist(version, &plugins);
        let ports = json!({"portMappings": [
            {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 18053, "containerPort": 53, "protocol": "udp"}
        ]});
        let result = lab.add(&conflist, Some(&ports));
        assert_bridge_attachment(
            &lab,
            version,
            &result,
            &["10.45.0.2/24", "fd45::2/64"],
            &["10.45.0.1", "fd45::1"],
        );

        // tuning's changes are in the kernel and in the result that reached the end.
        assert_eq!(
            mac_and_mtu(&lab.pod, "eth0"),
            (MAC.to_owned(), 1400),
            "tuning"
        );
        assert_eq!(result["interfaces"][2]["mac"], MAC, "{result:#}");
        assert_eq!(
            kernel::sysctl(&lab.pod, "net/ipv4/conf/eth0/rp_filter"),
            "2"
        );
        // Our loopback, last in the chain, brought lo up and passed the result on.
        assert!(kernel::link_is_up(&lab.pod, "lo"), "pod lo down");

        // portmap read our IPs from prevResult.
        let nat = lab.host.exec_ok(&["iptables-save", "-t", "nat"]);
        let dnat = format!(
            r#"--comment "dnat name: \"{}\" id: \"{}\"""#,
            lab.network, lab.id
        );
        assert!(
            nat.lines()
                .any(|l| l.starts_with("-A CNI-HOSTPORT-DNAT") && l.contains(&dnat)),
            "no portmap DNAT jump:\n{nat}"
        );
        for target in ["10.45.0.2:80", "10.45.0.2:53"] {
            assert!(
                nat.contains(&format!("--to-destination {target}")),
                "no DNAT to {target}:\n{nat}"
            );
        }
        let nat6 = lab.host.exec_ok(&["ip6tables-save", "-t", "nat"]);
        assert!(
            nat6.contains("--to-destination [fd45::2]:80"),
            "no v6 DNAT:\n{nat6}"
        );
        // firewall read them too.
        if firewall {
            let filter = lab.host.exec_ok(&["iptables-save", "-t", "filter"]);
            assert!(
                filter.contains("-A CNI-FORWARD -s 10.45.0.2/32 -j ACCEPT"),
                "no firewall rule:\n{filter}"
            );
        }
        assert_pod_pings(&lab, "10.45.0.1");

        // With the port mappings (Debian's portmap 1.1.1 fails every such CHECK, "could
        // not check ipv6 dnat": it looks for its IPv4 rules in ip6tables; ours does not).
        assert_check(&lab, version, &conflist, Some(&ports));

        let del = lab.libcni("del", &conflist, Some(&ports));
        del.assert_success();
        assert_all_gone(&lab, &result_addresses(&result), "after chained DEL");
    });
}

/// Our portmap after our bridge, as libcni chains them (capability `portMappings`), on
/// both backends and both families: a host port answers a client through the node's
/// addresses, the node itself and the pod itself (hairpin); CHECK with the mappings
/// passes and fails once a rule is removed by hand; DEL leaves nothing.
#[test]
fn our_portmap_through_libcni_on_both_backends() {
    if !require_root() {
        return;
    }
    check_cases(&["iptables", "nftables"], |backend| {
        let lab = Lab::new();
        let client = client_on_uplink(&lab.host);
        let ranges = json!([[{"subnet": "10.46.0.0/24"}], [{"subnet": "fd46::/64"}]]);
        let mut bridge = lab.bridge_plugin(&ranges, true);
        bridge["hairpinMode"] = json!(true);
        let conflist = lab.conflist(
            "1.0.0",
            &[
                bridge,
                json!({"type": "portmap", "capabilities": {"portMappings": true}, "backend": backend}),
                json!({"type": "loopback"}),
            ],
        );
        let ports = json!({"portMappings": [
            {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}
        ]});
        let result = lab.add(&conflist, Some(&ports));
        serve_peer_address(lab.pod.path(), 80);
        for to in [socket(NODE_V4, 18080), socket(NODE_V6, 18080)] {
            for (who, from) in [
                ("a client", client.path()),
                ("the node", lab.host.path()),
                ("the pod itself", lab.pod.path()),
            ] {
                peer_seen(from, to).unwrap_or_else(|e| panic!("{backend}: {who}: {e}"));
            }
        }
        assert_check(&lab, "1.0.0", &conflist, Some(&ports));
        match *backend {
            "iptables" => lab.host.exec_ok(&[
                "iptables",
                "-t",
                "nat",
                "-F",
                &dnat_chain(&lab.network, &lab.id),
            ]),
            _ => lab
                .host
                .exec_ok(&["nft", "flush", "chain", "ip", "cni_hostport", "hostports"]),
        };
        lab.libcni("check", &conflist, Some(&ports))
            .assert_failure();
        lab.libcni("del", &conflist, Some(&ports)).assert_success();
        drop(client);
        assert_all_gone(&lab, &result_addresses(&result), "after DEL");
    });
}

/// Our bandwidth after our bridge, its limits from the `bandwidth` capability as
/// containerd fills it from the pod annotations (burst 2^32 - 1 bits): the veth and an
/// ifb device get their token buckets, CHECK passes until the ifb is deleted by hand,
/// and DEL (bandwidth first, as libcni goes backwards) leaves no link.
#[test]
fn our_bandwidth_through_libcni_from_capability_args() {
    if !require_root() {
        return;
    }
    check_cases(&VERSIONS, |version| {
        let lab = Lab::new();
        let ranges = json!([[{"subnet": "10.46.0.0/24"}]]);
        let conflist = lab.conflist(
            version,
            &[
                lab.bridge_plugin(&ranges, true),
                json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
            ],
        );
        let burst = u64::from(u32::MAX);
        let caps = json!({"bandwidth": {
            "ingressRate": 10_000_000, "ingressBurst": burst,
            "egressRate": 20_000_000, "egressBurst": burst
        }});
        let result = lab.add(&conflist, Some(&caps));
        let interfaces = result["interfaces"].as_array().cloned().unwrap_or_default();
        let ifb = interfaces
            .iter()
            .filter_map(|i| i["name"].as_str())
            .find(|n| n.starts_with("bwp"))
            .unwrap_or_else(|| panic!("no ifb in the result: {result:#}"))
            .to_owned();
        let details = kernel::ip_json(&lab.host, &["-d", "link", "show", "dev", &ifb]);
        assert_eq!(
            details[0]["linkinfo"]["info_kind"], "ifb",
            "{version}: {details}"
        );
        let qdiscs = lab.host.exec_ok(&["tc", "qdisc", "show"]);
        assert!(qdiscs.contains("rate 10Mbit"), "{version}: {qdiscs}");
        assert!(
            qdiscs.contains(&format!("tbf 1: dev {ifb} root")),
            "{version}: {qdiscs}"
        );
        assert!(qdiscs.contains("rate 20Mbit"), "{version}: {qdiscs}");
        assert_check(&lab, version, &conflist, Some(&caps));
        if *version != "0.3.1" {
            lab.host.exec_ok(&["ip", "link", "del", &ifb]);
            lab.libcni("check", &conflist, Some(&caps)).assert_failure();
        }
        lab.libcni("del", &conflist, Some(&caps)).assert_success();
        assert!(
            kernel::link(&lab.host, &ifb).is_none(),
            "{version}: {ifb} survived DEL"
        );
        assert_all_gone(&lab, &result_addresses(&result), "after DEL");
    });
}

/// Runtime capability args: `ips` (host-local, e.g. a static pod IP) and `mac`
/// (bridge), with kubelet's CNI_ARGS.
#[test]
fn capability_args_ips_and_mac() {
    if !require_root() {
        return;
    }
    const MAC: &str = "0a:58:0a:2e:00:4d";
    check_cases(&VERSIONS, |version| {
        let lab = Lab::new();
        let ranges = json!([[{"subnet": "10.46.0.0/24"}], [{"subnet": "fd46::/64"}]]);
        let mut bridge = lab.bridge_plugin(&ranges, true);
        bridge["capabilities"] = json!({"mac": true, "ips": true});
        let conflist = lab.conflist(version, &[bridge]);
        let caps = json!({"ips": ["10.46.0.77/24", "fd46::77/64"], "mac": MAC});
        let result = lab.add(&conflist, Some(&caps));
        assert_bridge_attachment(
            &lab,
            version,
            &result,
            &["10.46.0.77/24", "fd46::77/64"],
            &["10.46.0.1", "fd46::1"],
        );
        assert_eq!(mac_and_mtu(&lab.pod, "eth0").0, MAC, "runtimeConfig.mac");
        assert_eq!(result["interfaces"][2]["mac"], MAC, "{result:#}");

        assert_check(&lab, version, &conflist, Some(&caps));

        lab.libcni("del", &conflist, Some(&caps)).assert_success();
        assert_all_gone(&lab, &result_addresses(&result), "after DEL");
    });
}

// ---------------------------------------------------------------------------------------
// Differential: the same libcni ADD with our plugins and with the reference ones
// ---------------------------------------------------------------------------------------

/// What a runtime or an admin tool sees of one link, with per-run values (names, MACs,
/// indexes) left out: operstate, flags, mtu, txqueuelen, and for a bridge whether its
/// STP bridge id carries its own MAC.
fn link_facts(ns: &Netns, dev: &str) -> Value {
    let text = ns.exec_ok(&["ip", "-j", "-d", "link", "show", "dev", dev]);
    let parsed: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let link = &parsed[0];
    let mut facts = json!({
        "operstate": link["operstate"],
        "flags": link["flags"],
        "mtu": link["mtu"],
        "txqlen": link["txqlen"],
    });
    let data = &link["linkinfo"]["info_data"];
    if let Some(bridge_id) = data["bridge_id"].as_str() {
        // `ip` prints the id as "8000.2:11:22:33:44:55" (no leading zeros).
        let mac: Vec<String> = link["address"]
            .as_str()
            .unwrap_or_default()
            .split(':')
            .map(|b| u8::from_str_radix(b, 16).map_or_else(|_| b.to_owned(), |v| format!("{v:x}")))
            .collect();
        facts["bridge_id_is_own_mac"] = json!(bridge_id.ends_with(&mac.join(":")));
    }
    facts
}

/// The kernel facts of one ADD through libcni with `path` as CNI_PATH.
fn attachment_facts(path: &str, version: &str) -> Value {
    let lab = Lab::new();
    let ranges = json!([[{"subnet": "10.47.0.0/24"}], [{"subnet": "fd47::/64"}]]);
    let conflist = lab.conflist(version, &[lab.bridge_plugin(&ranges, true)]);
    let mut args = vec![
        "add".to_owned(),
        "-conflist".to_owned(),
        conflist.display().to_string(),
        "-netns".to_owned(),
        lab.netns_path.clone(),
        "-id".to_owned(),
        lab.id.clone(),
        "-path".to_owned(),
        path.to_owned(),
        "-cache-dir".to_owned(),
        lab.cache.path_str().to_owned(),
        "-args".to_owned(),
        K8S_ARGS.to_owned(),
    ];
    let out = run_driver(&lab.host, &args);
    out.assert_success();
    let result = out.json();
    let host_veth = result["interfaces"][1]["name"].as_str().unwrap_or_default();
    let facts = json!({
        "bridge": link_facts(&lab.host, &lab.bridge),
        "host veth": link_facts(&lab.host, host_veth),
        "pod eth0": link_facts(&lab.pod, "eth0"),
        "pod sysctls": {
            "accept_dad": kernel::sysctl(&lab.pod, "net/ipv6/conf/eth0/accept_dad"),
            "arp_notify": kernel::sysctl(&lab.pod, "net/ipv4/conf/eth0/arp_notify"),
        },
        "host sysctls": {
            "ip_forward": kernel::sysctl(&lab.host, "net/ipv4/ip_forward"),
            "ipv6 forwarding": kernel::sysctl(&lab.host, "net/ipv6/conf/all/forwarding"),
            "bridge accept_ra": kernel::sysctl(&lab.host, &format!("net/ipv6/conf/{}/accept_ra", lab.bridge)),
        },
    });
    args[0] = "del".to_owned();
    run_driver(&lab.host, &args).assert_success();
    facts
}

/// Our bridge leaves the kernel in the state the reference does: same
/// link states, queue lengths, bridge id and sysctls, after the same libcni ADD.
#[test]
fn kernel_state_after_add_matches_the_reference() {
    if !require_root() {
        return;
    }
    check_cases(&VERSIONS, |version| {
        let ours = attachment_facts(&cni_path(), version);
        let reference = attachment_facts(REFERENCE_DIR, version);
        assert_eq!(
            ours, reference,
            "{version}: ours (left) vs reference (right):\n{ours:#}\n{reference:#}"
        );
    });
}
