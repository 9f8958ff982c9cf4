//! Tests of the harness itself: namespace guards, kernel readers and the plugin runner.
//!
//! The plugin tests trust these pieces to isolate and observe; if the runner leaked the
//! machine's environment or ran outside the host namespace, a plugin test could pass for
//! the wrong reason. System binaries (`env`, `cat`, `sh`) stand in for plugins here.

use std::os::unix::fs::MetadataExt as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cni_blackbox::{Netns, Plugin, kernel, require_root};

#[test]
fn netns_guard_creates_and_deletes() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("cnibb-h");
    let path = ns.path().to_path_buf();
    assert_eq!(path, Path::new("/var/run/netns").join(ns.name()));
    assert!(path.exists());
    let listed = String::from_utf8_lossy(&ns.exec(&["ip", "netns", "list"]).stdout).into_owned();
    assert!(listed.contains(ns.name()), "{listed}");
    drop(ns);
    assert!(!path.exists(), "{} survived its guard", path.display());
}

#[test]
fn netns_guard_deletes_when_the_test_panics() {
    if !require_root() {
        return;
    }
    let mut seen: Option<PathBuf> = None;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let ns = Netns::new("cnibb-h");
        seen = Some(ns.path().to_path_buf());
        panic!("deliberate failure inside a test body");
    }));
    assert!(result.is_err());
    let path = seen.expect("the closure ran");
    assert!(!path.exists(), "{} survived a panic", path.display());
}

#[test]
fn explicit_delete_removes_the_netns_once() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("cnibb-h");
    let path = ns.path().to_path_buf();
    ns.delete();
    assert!(!path.exists());
}

#[test]
fn kernel_readers_see_the_namespace_not_the_machine() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("cnibb-h");
    // A new namespace has only `lo`, and it is down.
    let names: Vec<String> = kernel::links(&ns)
        .as_array()
        .expect("ip -j link show prints an array")
        .iter()
        .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names, ["lo"]);
    assert!(!kernel::link_is_up(&ns, "lo"));
    assert!(kernel::link(&ns, "nosuchlink0").is_none());

    ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
    assert!(kernel::link_is_up(&ns, "lo"));
    let addrs = kernel::addr_cidrs(&ns, "lo");
    assert!(addrs.contains(&"127.0.0.1/8".to_owned()), "{addrs:?}");

    // A new namespace inherits IPv4 settings from the machine's own, whatever they are
    // (forwarding is on on every container host): flip the namespace's value both ways
    // and check that the machine's stays as it was.
    let machine_forwarding = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
        .expect("the machine's ip_forward")
        .trim()
        .to_owned();
    for value in ["0", "1", "0"] {
        ns.exec_ok(&["sysctl", "-qw", &format!("net.ipv4.ip_forward={value}")]);
        assert_eq!(kernel::sysctl(&ns, "net.ipv4.ip_forward"), value);
        assert_eq!(kernel::sysctl(&ns, "net/ipv4/ip_forward"), value);
    }
    let after =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").expect("the machine's ip_forward");
    assert_eq!(
        after.trim(),
        machine_forwarding,
        "the machine's own sysctl changed"
    );
    // Routes exist once lo is up (local table aside, main has none for lo): the reader
    // must return an array either way.
    assert!(kernel::routes(&ns).is_array());
    assert!(kernel::routes6(&ns).is_array());
}

#[test]
fn runner_passes_only_path_and_chosen_variables() {
    if !require_root() {
        return;
    }
    let host = Netns::new("cnibb-h");
    let out = Plugin::at(Path::new("/usr/bin/env"), &host)
        .command("ADD")
        .cni_args("A=1")
        .run();
    out.assert_success();
    let mut names: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["CNI_ARGS", "CNI_COMMAND", "PATH"], "{out}");
    assert!(out.stdout.contains("CNI_COMMAND=ADD\n"), "{out}");
}

#[test]
fn runner_feeds_stdin_and_reports_exit_code() {
    if !require_root() {
        return;
    }
    let host = Netns::new("cnibb-h");
    let out = Plugin::at(Path::new("/bin/cat"), &host)
        .stdin("{\"a\": 1}")
        .run();
    out.assert_success();
    assert_eq!(out.stdout, "{\"a\": 1}");
    assert_eq!(out.json()["a"], 1);

    let out = Plugin::at(Path::new("/bin/sh"), &host)
        .stdin("echo '{\"code\": 7, \"msg\": \"m\", \"details\": \"d\"}'; echo log >&2; exit 3")
        .run();
    assert_eq!(out.code(), Some(3));
    assert_eq!(out.stderr, "log\n");
    assert_eq!(out.error_code(), Some(7));
    assert_eq!(out.error_msg().as_deref(), Some("m"));
    assert_eq!(out.error_details().as_deref(), Some("d"));
    out.assert_error(7, "m");
}

#[test]
fn runner_runs_inside_the_host_namespace() {
    if !require_root() {
        return;
    }
    let host = Netns::new("cnibb-h");
    let out = Plugin::at(Path::new("/bin/sh"), &host)
        .stdin("readlink /proc/self/ns/net")
        .run();
    out.assert_success();
    let inode = std::fs::metadata(host.path()).expect("netns file").ino();
    assert_eq!(out.stdout.trim(), format!("net:[{inode}]"));
}

#[test]
fn runner_json_rejects_two_documents() {
    if !require_root() {
        return;
    }
    let host = Netns::new("cnibb-h");
    let out = Plugin::at(Path::new("/bin/sh"), &host)
        .stdin("printf '{}{\"code\": 8}'")
        .run();
    assert!(catch_unwind(AssertUnwindSafe(|| out.json())).is_err());
    assert_eq!(out.error_code(), None);
}

#[test]
fn runner_times_out_a_hanging_plugin() {
    if !require_root() {
        return;
    }
    let host = Netns::new("cnibb-h");
    let hung = catch_unwind(AssertUnwindSafe(|| {
        Plugin::at(Path::new("/bin/sh"), &host)
            .stdin("exec sleep 600")
            .timeout(Duration::from_millis(300))
            .run()
    }));
    let message = hung.expect_err("a plugin sleeping 600 s must time out");
    let text = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("timed out"), "{text}");
}
