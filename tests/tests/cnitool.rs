//! Our `cnitool` (crates/cnitool) driving our plugins, and sharing libcni's result cache
//! with the real libcni (the Go driver in `tests/interop/libcni-driver`).
//!
//! Each test makes its own host netns (cnitool runs inside it with `ip netns exec`, so
//! bridges, veths and masquerade rules never reach the machine's netns), pod netns,
//! network and bridge names, host-local `dataDir`, config dir (`NETCONFPATH`) and cache
//! dir (`CNI_CACHE_DIR`); the guards remove all of it on drop, also when a test fails.
//!
//! The command line itself (help, usage errors, exit codes) is checked without root.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod libcni_support;

use cni_blackbox::{
    Netns, Outcome, TempDir, bin_dir, kernel, plugin_path, require_root, unique_ifname, unique_name,
};
use libcni_support::run_driver;
use serde_json::{Value, json};

/// Runs `cnitool <args>` outside any netns, with an empty environment but PATH.
fn cnitool_plain(args: &[&str]) -> Outcome {
    let binary = plugin_path("cnitool");
    let out = Command::new(&binary)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
    Outcome {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        invocation: format!("cnitool {}", args.join(" ")),
    }
}

/// What the Go cnitool names the attachment of a netns: `cnitool-` and the first 20 hex
/// digits of the SHA-512 of the path, computed here with coreutils' `sha512sum`.
fn go_container_id(netns_path: &str) -> String {
    let mut child = Command::new("sha512sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run sha512sum: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(netns_path.as_bytes())
            .unwrap_or_else(|e| panic!("sha512sum stdin: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("sha512sum: {e}"));
    let hex = String::from_utf8_lossy(&out.stdout);
    format!("cnitool-{}", &hex[..20])
}

/// One network in one host netns, with any number of pods.
struct Lab {
    host: Netns,
    data: TempDir,
    cache: TempDir,
    confdir: TempDir,
    network: String,
    bridge: String,
}

impl Lab {
    /// A dual-stack bridge network with masquerade, at `version`.
    fn new(version: &str) -> Self {
        Self::with_plugins(version, &[])
    }

    /// The bridge network followed by `more` plugins.
    fn with_plugins(version: &str, more: &[Value]) -> Self {
        let lab = Self {
            host: Netns::new("cnibb-ct-host"),
            data: TempDir::new("cnibb-ct-data"),
            cache: TempDir::new("cnibb-ct-cache"),
            confdir: TempDir::new("cnibb-ct-conf"),
            network: unique_name("cnibb-ctnet"),
            bridge: unique_ifname("ctbr"),
        };
        let mut list = json!({
            "cniVersion": version,
            "name": lab.network,
            "plugins": [{
                "type": "bridge",
                "bridge": lab.bridge,
                "isGateway": true,
                "isDefaultGateway": true,
                "ipMasq": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": lab.data.path_str(),
                    "ranges": [[{"subnet": "10.231.0.0/24"}], [{"subnet": "fd00:231::/64"}]]
                }
            }]
        });
        if let Some(plugins) = list["plugins"].as_array_mut() {
            plugins.extend(more.iter().cloned());
        }
        fs::write(
            lab.conflist(),
            serde_json::to_vec_pretty(&list).unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("write {}: {e}", lab.conflist().display()));
        lab
    }

    fn conflist(&self) -> PathBuf {
        self.confdir
            .path()
            .join(format!("10-{}.conflist", self.network))
    }

    /// `cnitool <args>` inside the host netns with this lab's NETCONFPATH, CNI_PATH and
    /// CNI_CACHE_DIR (and `extra` variables), nothing else from our environment but PATH.
    fn cnitool(&self, args: &[&str], extra: &[(&str, &str)]) -> Outcome {
        let binary = plugin_path("cnitool");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.host.name(), "timeout", "120"])
            .arg(&binary)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("NETCONFPATH", self.confdir.path())
            .env("CNI_PATH", bin_dir())
            .env("CNI_CACHE_DIR", self.cache.path());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let invocation = format!(
            "ip netns exec {} {} {}",
            self.host.name(),
            binary.display(),
            args.join(" ")
        );
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot start {invocation}: {e}"));
        Outcome {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            invocation,
        }
    }

    /// `cnitool add <network> <pod>`; panics unless it succeeded. Returns the result.
    #[track_caller]
    fn add(&self, pod: &Netns) -> Value {
        let out = self.cnitool(&["add", &self.network, pod.path_str()], &[]);
        out.assert_success();
        out.json()
    }

    /// One libcni operation (through the Go driver) on `pod`'s attachment, with the id
    /// cnitool gives it, sharing this lab's cache dir.
    fn libcni(&self, command: &str, pod: &Netns) -> Outcome {
        let args: Vec<String> = [
            command,
            "-conflist",
            &self.conflist().display().to_string(),
            "-netns",
            pod.path_str(),
            "-id",
            &go_container_id(pod.path_str()),
            "-ifname",
            "eth0",
            "-path",
            &bin_dir().display().to_string(),
            "-cache-dir",
            self.cache.path_str(),
            "-args",
            "IgnoreUnknown=1;K8S_POD_NAME=pod",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        run_driver(&self.host, &args)
    }

    /// libcni's cache file for `pod`'s attachment on eth0.
    fn cache_file(&self, pod: &Netns) -> PathBuf {
        self.cache.path().join("results").join(format!(
            "{}-{}-eth0",
            self.network,
            go_container_id(pod.path_str())
        ))
    }

    /// host-local's reservations of this network: address -> `<id>\r\n<ifname>`.
    fn reservations(&self) -> BTreeMap<String, String> {
        cni_blackbox::ipam::reservations(&self.data.path().join(&self.network))
    }

    /// Addresses reserved for `pod`'s attachment.
    fn reserved_for(&self, pod: &Netns) -> Vec<String> {
        let id = go_container_id(pod.path_str());
        self.reservations()
            .into_iter()
            .filter(|(_, owner)| owner.starts_with(&id))
            .map(|(ip, _)| ip)
            .collect()
    }
}

fn has_eth0(pod: &Netns) -> bool {
    kernel::link(pod, "eth0").is_some()
}

/// The cache entry as JSON, checked for libcni's fields.
#[track_caller]
fn read_entry(path: &Path) -> Value {
    let text = fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no cache entry {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

// ---------------------------------------------------------------------------------------
// The command line (no root needed)
// ---------------------------------------------------------------------------------------

#[test]
fn help_for_every_command_exits_zero() {
    let root = cnitool_plain(&["--help"]);
    root.assert_success();
    assert!(root.stdout.contains("Available Commands:"), "{root:?}");
    assert_eq!(cnitool_plain(&[]).stdout, root.stdout);
    for command in ["add", "check", "del", "gc", "status"] {
        let help = cnitool_plain(&[command, "--help"]);
        help.assert_success();
        assert!(
            help.stdout
                .contains(&format!("cnitool {command} <network-name>")),
            "{help:?}"
        );
        assert_eq!(cnitool_plain(&["help", command]).stdout, help.stdout);
    }
    let gc = cnitool_plain(&["gc", "-h"]).stdout;
    assert!(
        gc.contains("EVERY attachment of the network is stale"),
        "{gc}"
    );
    assert!(gc.contains("--valid"), "{gc}");
}

#[test]
fn usage_errors_exit_one_with_a_message() {
    for (args, message) in [
        (
            &["add", "net"][..],
            "requires at least 2 arg(s), only received 1",
        ),
        (
            &["frob", "net", "ns"][..],
            "unknown command \"frob\" for \"cnitool\"",
        ),
        (
            &["add", "net", "ns", "--bogus"][..],
            "unknown flag: --bogus",
        ),
    ] {
        let out = cnitool_plain(args);
        assert_eq!(out.code(), Some(1), "{out:?}");
        assert!(
            out.stderr.starts_with(&format!("Error: {message}")),
            "{out:?}"
        );
        assert!(out.stdout.is_empty(), "{out:?}");
    }
    // NETCONFPATH unset: the default /etc/cni/net.d is searched, here for a network that
    // exists nowhere.
    let out = cnitool_plain(&["add", "cnibb-no-such-network", "/var/run/netns/none"]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("/etc/cni/net.d"), "{out:?}");
}

// ---------------------------------------------------------------------------------------
// ADD, CHECK, DEL and the cache
// ---------------------------------------------------------------------------------------

#[test]
fn add_check_del_write_and_remove_the_cache_entry() {
    if !require_root() {
        return;
    }
    let lab = Lab::new("1.1.0");
    let pod = Netns::new("cnibb-ct-pod");
    let result = lab.add(&pod);
    assert_eq!(result["cniVersion"], "1.1.0", "{result}");
    let ips: Vec<&str> = result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .collect();
    assert_eq!(ips, ["10.231.0.2/24", "fd00:231::2/64"], "{result}");
    assert!(has_eth0(&pod));

    let id = go_container_id(pod.path_str());
    let entry = read_entry(&lab.cache_file(&pod));
    assert_eq!(entry["kind"], "cniCacheV1");
    assert_eq!(entry["containerId"], id.as_str());
    assert_eq!(entry["ifName"], "eth0");
    assert_eq!(entry["networkName"], lab.network.as_str());
    assert_eq!(entry["netns"], pod.path_str());
    assert_eq!(
        entry["result"], result,
        "the cache holds the printed result"
    );
    assert!(entry["config"].as_str().is_some_and(|c| !c.is_empty()));
    assert_eq!(lab.reserved_for(&pod).len(), 2, "{:?}", lab.reservations());

    lab.cnitool(&["check", &lab.network, pod.path_str()], &[])
        .assert_success();
    lab.cnitool(&["status", &lab.network, pod.path_str()], &[])
        .assert_success();

    lab.cnitool(&["del", &lab.network, pod.path_str()], &[])
        .assert_success();
    assert!(!lab.cache_file(&pod).exists(), "cache entry left after DEL");
    assert!(lab.reservations().is_empty(), "{:?}", lab.reservations());
    assert!(!has_eth0(&pod));
    // DEL again: nothing left to do, still success.
    lab.cnitool(&["del", &lab.network, pod.path_str()], &[])
        .assert_success();
}

#[test]
fn a_failing_plugin_is_named_with_its_command() {
    if !require_root() {
        return;
    }
    let lab = Lab::new("1.0.0");
    let pod = Netns::new("cnibb-ct-pod");
    lab.add(&pod);
    pod.exec_ok(&["ip", "link", "del", "eth0"]);
    let out = lab.cnitool(&["check", &lab.network, pod.path_str()], &[]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(
        out.stderr
            .starts_with("Error: plugin type=\"bridge\" failed (check): "),
        "{out:?}"
    );
    lab.cnitool(&["del", &lab.network, pod.path_str()], &[])
        .assert_success();
    assert!(lab.reservations().is_empty());

    let out = lab.cnitool(
        &["add", &lab.network, pod.path_str()],
        &[("CNI_PATH", "/nonexistent")],
    );
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(
        out.stderr.starts_with(
            "Error: plugin type=\"bridge\" failed (add): failed to find plugin \"bridge\" in path [/nonexistent]"
        ),
        "{out:?}"
    );
}

#[test]
fn interface_name_from_flag_or_environment() {
    if !require_root() {
        return;
    }
    let lab = Lab::new("1.0.0");
    let pod = Netns::new("cnibb-ct-pod");
    lab.cnitool(&["add", "-i", "net1", &lab.network, pod.path_str()], &[])
        .assert_success();
    assert!(kernel::link(&pod, "net1").is_some());
    lab.cnitool(
        &["add", &lab.network, pod.path_str()],
        &[("CNI_IFNAME", "net2")],
    )
    .assert_success();
    assert!(kernel::link(&pod, "net2").is_some());
    let results = lab.cache.path().join("results");
    let id = go_container_id(pod.path_str());
    for ifname in ["net1", "net2"] {
        assert!(
            results
                .join(format!("{}-{id}-{ifname}", lab.network))
                .exists()
        );
    }
    lab.cnitool(&["del", "--ifname=net1", &lab.network, pod.path_str()], &[])
        .assert_success();
    lab.cnitool(
        &["del", &lab.network, pod.path_str()],
        &[("CNI_IFNAME", "net2")],
    )
    .assert_success();
    assert!(lab.reservations().is_empty(), "{:?}", lab.reservations());
    assert!(
        fs::read_dir(&results)
            .map(|d| d.count() == 0)
            .unwrap_or(true)
    );
}

/// CAP_ARGS reach the plugin that declares the capability (the reference `portmap`,
/// chained after our bridge), CNI_ARGS reach every plugin, and both are kept in the cache
/// entry; DEL removes the port mapping again.
#[test]
fn capability_and_cni_args_reach_the_plugins_and_the_cache() {
    if !require_root() {
        return;
    }
    let portmap = json!({"type": "portmap", "capabilities": {"portMappings": true}});
    let lab = Lab::with_plugins("1.0.0", &[portmap]);
    let pod = Netns::new("cnibb-ct-pod");
    let caps = r#"{"portMappings":[{"hostPort":18080,"containerPort":80,"protocol":"tcp"}],"bandwidth":{"ingressRate":1}}"#;
    let env = [
        ("CNI_PATH", format!("{}:/usr/lib/cni", bin_dir().display())),
        ("CAP_ARGS", caps.to_owned()),
        ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web".to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    lab.cnitool(&["add", &lab.network, pod.path_str()], &env)
        .assert_success();
    let nat = lab.host.exec_ok(&["iptables-save", "-t", "nat"]);
    assert!(
        nat.contains("--dport 18080"),
        "portmap got no portMappings:\n{nat}"
    );
    let entry = read_entry(&lab.cache_file(&pod));
    assert_eq!(
        entry["cniArgs"],
        json!([["IgnoreUnknown", "1"], ["K8S_POD_NAME", "web"]])
    );
    assert_eq!(
        entry["capabilityArgs"]["portMappings"][0]["hostPort"], 18080,
        "{entry}"
    );
    // No CHECK here: Debian's portmap 1.1.1 fails every CHECK that has port mappings (it
    // looks for its IPv4 DNAT rules in ip6tables; see libcni.rs).
    lab.cnitool(&["del", &lab.network, pod.path_str()], &env)
        .assert_success();
    let nat = lab.host.exec_ok(&["iptables-save", "-t", "nat"]);
    assert!(!nat.contains("--dport 18080"), "port mapping left:\n{nat}");
    assert!(lab.reservations().is_empty());
}

// ---------------------------------------------------------------------------------------
// Sharing the cache with libcni
// ---------------------------------------------------------------------------------------

#[test]
fn an_attachment_made_by_libcni_is_checked_and_deleted_by_cnitool() {
    if !require_root() {
        return;
    }
    // libcni 1.1.2 (Debian's, the driver's) speaks up to 1.0.0.
    let lab = Lab::new("1.0.0");
    let pod = Netns::new("cnibb-ct-pod");
    let out = lab.libcni("add", &pod);
    out.assert_success();
    let result = out.json();
    let entry = read_entry(&lab.cache_file(&pod));
    assert_eq!(entry["kind"], "cniCacheV1", "libcni wrote its cache entry");
    assert_eq!(lab.reserved_for(&pod).len(), 2);

    lab.cnitool(&["check", &lab.network, pod.path_str()], &[])
        .assert_success();
    lab.cnitool(&["del", &lab.network, pod.path_str()], &[])
        .assert_success();
    assert!(
        !lab.cache_file(&pod).exists(),
        "cnitool left libcni's entry"
    );
    assert!(lab.reservations().is_empty(), "{result}");
    assert!(!has_eth0(&pod));
}

#[test]
fn an_attachment_made_by_cnitool_is_checked_and_deleted_by_libcni() {
    if !require_root() {
        return;
    }
    let lab = Lab::new("1.0.0");
    let pod = Netns::new("cnibb-ct-pod");
    let result = lab.add(&pod);
    let cached = lab.libcni("cached", &pod);
    cached.assert_success();
    assert_eq!(
        cached.json()["ips"],
        result["ips"],
        "libcni reads our entry"
    );
    lab.libcni("check", &pod).assert_success();
    lab.libcni("del", &pod).assert_success();
    assert!(!lab.cache_file(&pod).exists(), "libcni left our entry");
    assert!(lab.reservations().is_empty());
    assert!(!has_eth0(&pod));
}

// ---------------------------------------------------------------------------------------
// GC
// ---------------------------------------------------------------------------------------

#[test]
fn gc_deletes_stale_cached_attachments_and_releases_uncached_reservations() {
    if !require_root() {
        return;
    }
    let lab = Lab::new("1.1.0");
    let keep = Netns::new("cnibb-ct-keep");
    let uncached = Netns::new("cnibb-ct-lost");
    let stale = Netns::new("cnibb-ct-stale");
    for pod in [&keep, &uncached, &stale] {
        lab.add(pod);
        assert_eq!(lab.reserved_for(pod).len(), 2);
    }
    // A runtime that lost its cache entry: only the plugin's GC can find this one.
    fs::remove_file(lab.cache_file(&uncached)).unwrap_or_else(|e| panic!("{e}"));

    lab.cnitool(&["gc", &lab.network, "--valid-netns", keep.path_str()], &[])
        .assert_success();
    assert_eq!(lab.reserved_for(&keep).len(), 2, "{:?}", lab.reservations());
    assert!(lab.cache_file(&keep).exists());
    assert!(has_eth0(&keep));
    assert!(
        lab.reserved_for(&uncached).is_empty(),
        "GC kept the reservation of an attachment not in the cache: {:?}",
        lab.reservations()
    );
    assert!(lab.reserved_for(&stale).is_empty());
    assert!(!lab.cache_file(&stale).exists());
    assert!(!has_eth0(&stale), "the stale attachment was not deleted");

    // The same, naming the attachment by id: nothing changes.
    let keep_id = format!("{}/eth0", go_container_id(keep.path_str()));
    lab.cnitool(&["gc", &lab.network, "--valid", &keep_id], &[])
        .assert_success();
    assert_eq!(lab.reserved_for(&keep).len(), 2);

    // Without a valid list every attachment is stale.
    lab.cnitool(&["gc", &lab.network, keep.path_str()], &[])
        .assert_success();
    assert!(lab.reservations().is_empty(), "{:?}", lab.reservations());
    assert!(!lab.cache_file(&keep).exists());
    assert!(!has_eth0(&keep));
}

/// A cache entry whose container ID climbs out of the cache (`../`) is reported and
/// skipped by `gc`: no path is built from it, so nothing outside the cache is deleted.
#[test]
fn gc_skips_planted_cache_entries_with_bad_names() {
    if !require_root() {
        return;
    }
    let lab = Lab::new("1.1.0");
    let results = lab.cache.path().join("results");
    fs::create_dir_all(&results).expect("mkdir results");
    let victim_dir = TempDir::new("cnibb-ct-victim");
    let victim = victim_dir.path().join("victim-eth0");
    fs::write(&victim, "not the cache's").expect("write victim");
    // results/<net>-<id>-eth0 is built from the entry: with a planted directory
    // results/<net>-X, the ID "X/../../../<victim dir>/victim" names the victim file.
    fs::create_dir(results.join(format!("{}-X", lab.network))).expect("plant dir");
    let victim_name = victim_dir
        .path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    assert_eq!(
        victim_dir.path().parent(),
        lab.cache.path().parent(),
        "the victim must sit beside the cache dir"
    );
    let climbing = format!("X/../../../{victim_name}/victim");
    let entry = json!({
        "kind": "cniCacheV1",
        "containerId": climbing,
        "config": "",
        "ifName": "eth0",
        "networkName": lab.network,
        "netns": "/var/run/netns/none",
    });
    fs::write(
        results.join(format!("{}-planted-eth0", lab.network)),
        entry.to_string(),
    )
    .expect("plant entry");
    let out = lab.cnitool(&["gc", &lab.network], &[]);
    assert!(out.success(), "{out}");
    assert!(victim.exists(), "gc deleted a file outside the cache");
    assert!(out.stderr.contains("skipping cache entry"), "{out}");
}
