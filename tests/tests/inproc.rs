//! The multi-call binary and in-process IPAM delegation, black-box, on a real kernel.
//!
//! The plugins ship as one executable hard-linked as `bridge`, `host-local` and
//! `loopback`. When the `host-local` that `CNI_PATH` resolves to is that same file, the
//! bridge runs it in-process; any other file (a copy of ours, the reference's) is
//! exec'd. Which way it went is told by the operator's log: in-process, host-local's own
//! lines carry the bridge's pid and the bridge logs `IPAM host-local <CMD> ran
//! in-process`; exec'd, host-local logs from its own pid and the bridge logs (at debug)
//! `IPAM host-local <CMD> exec'd`. Results and errors must be the same bytes either way.
//! (Tests of our multi-call binary: with `CNI_BLACKBOX_BIN_DIR` that dir must hold ours.)

mod bridge_support;

use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;

use bridge_support::{Net, REFERENCE_DIR, has_link, reference_available};
use cni_blackbox::{Netns, Outcome, Plugin, TempDir, bin_dir, multicall_path, require_root};
use serde_json::{Value, json};

const ID: &str = "cnibb-inproc";

/// A directory holding a copy (another inode) of the multi-call binary named
/// `host-local`: the same code, but not this file, so it must be exec'd.
fn copy_dir() -> TempDir {
    let dir = TempDir::new("cnibb-inproc-copy");
    std::fs::copy(multicall_path(), dir.path().join("host-local")).expect("copy host-local");
    dir
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn pid_of(line: &str) -> Option<u32> {
    let rest = line.split_once(" pid=")?.1;
    rest.split(' ').next()?.parse().ok()
}

/// How a command's IPAM step ran, read from the log lines of that command.
#[derive(Debug, PartialEq, Eq)]
enum Way {
    InProcess,
    Exec,
}

/// Reads from `log` how the IPAM step of the bridge's `cmd` for `container` ran, and
/// checks the log tells one consistent story.
#[track_caller]
fn ipam_way(log: &[String], cmd: &str, container: &str) -> Way {
    let ours: Vec<&String> = log
        .iter()
        .filter(|l| {
            l.contains(&format!(" cmd={cmd} ")) && l.contains(&format!("container={container} "))
        })
        .collect();
    let text = || {
        ours.iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let bridge_pids: Vec<u32> = ours
        .iter()
        .filter(|l| l.contains("plugin=bridge "))
        .filter_map(|l| pid_of(l))
        .collect();
    let ipam_pids: Vec<u32> = ours
        .iter()
        .filter(|l| l.contains("plugin=host-local "))
        .filter_map(|l| pid_of(l))
        .collect();
    assert!(
        !bridge_pids.is_empty() && !ipam_pids.is_empty(),
        "no bridge or host-local lines for {cmd}:\n{}",
        text()
    );
    assert!(
        ours.iter()
            .any(|l| l.contains("plugin=host-local ") && l.contains("msg=ok")),
        "host-local's {cmd} did not log its end:\n{}",
        text()
    );
    let in_process = ours.iter().any(|l| {
        l.contains("plugin=bridge ") && l.contains(&format!("IPAM host-local {cmd} ran in-process"))
    });
    let exec = ours.iter().any(|l| {
        l.contains("plugin=bridge ") && l.contains(&format!("IPAM host-local {cmd} exec'd"))
    });
    let same_pid = ipam_pids.iter().all(|p| bridge_pids.contains(p));
    let other_pid = ipam_pids.iter().all(|p| !bridge_pids.contains(p));
    match (in_process, exec) {
        (true, false) => {
            assert!(
                same_pid,
                "in-process, but host-local logged from another pid:\n{}",
                text()
            );
            Way::InProcess
        }
        (false, true) => {
            assert!(
                other_pid,
                "exec'd, but host-local logged from the bridge's pid:\n{}",
                text()
            );
            Way::Exec
        }
        _ => panic!("the log does not say how IPAM {cmd} ran:\n{}", text()),
    }
}

/// The bridge (the hard link in the shipped layout) with `CNI_PATH` = `cni_path`.
fn bridge<'a>(net: &'a Net, cni_path: &str, command: &str, conf: &Value) -> Plugin<'a> {
    net.plugin(command, conf).cni_path(cni_path)
}

/// Result text with the per-attachment random values (veth names, MACs) replaced, the
/// rest byte for byte.
fn masked(out: &Outcome) -> String {
    let mut text = out.stdout.clone();
    let mut random = Vec::new();
    collect_random(&out.json(), &mut random);
    for value in random {
        text = text.replace(&format!("\"{value}\""), "\"@RANDOM@\"");
    }
    text
}

fn collect_random(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::String(s) => {
            let is_mac = s.len() == 17 && s.split(':').count() == 6;
            if is_mac || (s.len() == 12 && s.starts_with("veth")) {
                into.push(s.clone());
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_random(v, into)),
        Value::Object(map) => map.values().for_each(|v| collect_random(v, into)),
        _ => {}
    }
}

/// ADD, CHECK and DEL of `pod` through the bridge with `cni_path`; returns the ADD's
/// outcome and how each command's IPAM step ran.
fn attach_check_detach(
    pod: &Netns,
    net: &Net,
    conf: &Value,
    cni_path: &str,
    log: &Path,
) -> (Outcome, [Way; 3]) {
    let add = bridge(net, cni_path, "ADD", conf)
        .attachment(ID, pod, "eth0")
        .run();
    add.assert_success();
    let mut check = conf.clone();
    check["prevResult"] = add.json();
    bridge(net, cni_path, "CHECK", &check)
        .attachment(ID, pod, "eth0")
        .run()
        .assert_success_silent();
    bridge(net, cni_path, "DEL", conf)
        .attachment(ID, pod, "eth0")
        .run()
        .assert_success_silent();
    net.assert_nothing_left("after DEL");
    assert!(!has_link(pod, "eth0"), "pod interface left after DEL");
    let log = lines(log);
    let ways = ["ADD", "CHECK", "DEL"].map(|cmd| ipam_way(&log, cmd, ID));
    (add, ways)
}

fn logged_conf(net: &Net, subnet: &str, log: &Path) -> Value {
    net.conf(
        "1.0.0",
        &[subnet],
        &json!({"isGateway": true, "log": {"file": log, "level": "debug"}}),
    )
}

#[test]
fn the_shipped_layout_runs_host_local_in_process_with_the_exec_result() {
    if !require_root() {
        return;
    }
    let logs = TempDir::new("cnibb-inproc-log");
    let shipped = bin_dir().to_string_lossy().into_owned();
    let copy = copy_dir();
    let copy_path = copy.path_str().to_owned();
    // One address (the /30's .2 after the gateway .1), so both runs get the same one.
    let net = Net::new();
    // The same pod for both, so the results' sandbox paths agree.
    let pod = net.pod();

    let in_log = logs.path().join("in-process.log");
    let (in_add, ways) = attach_check_detach(
        &pod,
        &net,
        &logged_conf(&net, "10.83.0.0/30", &in_log),
        &shipped,
        &in_log,
    );
    assert_eq!(ways, [Way::InProcess, Way::InProcess, Way::InProcess]);

    let exec_log = logs.path().join("exec.log");
    let (exec_add, ways) = attach_check_detach(
        &pod,
        &net,
        &logged_conf(&net, "10.83.0.0/30", &exec_log),
        &copy_path,
        &exec_log,
    );
    assert_eq!(ways, [Way::Exec, Way::Exec, Way::Exec]);

    assert_eq!(in_add.json()["ips"][0]["address"], "10.83.0.2/30");
    assert_eq!(
        masked(&in_add),
        masked(&exec_add),
        "in-process and exec'd results differ"
    );
    // Nothing of the nested command reached the bridge's stdout or stderr.
    assert_eq!(in_add.stderr, exec_add.stderr);
}

#[test]
fn the_reference_host_local_is_exec_d_and_works() {
    if !require_root() || !reference_available() {
        return;
    }
    let logs = TempDir::new("cnibb-inproc-log");
    let log = logs.path().join("reference.log");
    let net = Net::new();
    let conf = logged_conf(&net, "10.84.0.0/24", &log);
    let pod = net.pod();
    let add = bridge(&net, REFERENCE_DIR, "ADD", &conf)
        .attachment(ID, &pod, "eth0")
        .run();
    add.assert_success();
    assert_eq!(add.json()["ips"][0]["address"], "10.84.0.2/24");
    assert_eq!(net.reservations().len(), 1, "the reference reserved it");
    bridge(&net, REFERENCE_DIR, "DEL", &conf)
        .attachment(ID, &pod, "eth0")
        .run()
        .assert_success_silent();
    net.assert_nothing_left("after DEL with the reference's host-local");
    let log = lines(&log);
    for cmd in ["ADD", "DEL"] {
        assert!(
            log.iter().any(|l| l.contains(&format!(" cmd={cmd} "))
                && l.contains(&format!(
                    "IPAM host-local {cmd} exec'd: {REFERENCE_DIR}/host-local"
                ))),
            "no exec of the reference for {cmd}:\n{}",
            log.join("\n")
        );
        assert!(
            !log.iter().any(|l| l.contains("ran in-process")),
            "{}",
            log.join("\n")
        );
    }
}

/// Runs a failing bridge ADD in-process and exec'd; both must print the same bytes and
/// leave nothing behind.
#[track_caller]
fn same_error_both_ways(net: &Net, conf: &Value, what: &str) -> Outcome {
    same_error_both_ways_with(net, conf, what, &[])
}

/// [`same_error_both_ways`] with extra environment for the bridge (and its delegate).
#[track_caller]
fn same_error_both_ways_with(net: &Net, conf: &Value, what: &str, env: &[(&str, &str)]) -> Outcome {
    let shipped = bin_dir().to_string_lossy().into_owned();
    let copy = copy_dir();
    let (veths, reservations) = (net.host_veths(), net.reservations());
    let mut outs = Vec::new();
    for cni_path in [shipped.as_str(), copy.path_str()] {
        let pod = net.pod();
        let out = env
            .iter()
            .fold(bridge(net, cni_path, "ADD", conf), |p, (k, v)| p.env(k, v))
            .attachment("cnibb-inproc-fail", &pod, "eth0")
            .run();
        out.assert_failure();
        assert!(out.error().is_some(), "{what}: no error JSON:\n{out}");
        assert!(!has_link(&pod, "eth0"), "{what}: pod interface left");
        assert_eq!(net.host_veths(), veths, "{what}: a failed ADD left a veth");
        assert_eq!(
            net.reservations(),
            reservations,
            "{what}: a failed ADD changed the reservations"
        );
        outs.push(out);
    }
    assert_eq!(
        outs[0].stdout, outs[1].stdout,
        "{what}: in-process and exec'd errors differ"
    );
    outs.remove(0)
}

#[test]
fn ipam_errors_are_the_same_in_process_and_exec_d_and_leave_nothing() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let conf = net.conf("1.0.0", &["10.85.0.0/30"], &json!({"isGateway": true}));
    // The /30's one address goes to a first pod; every further ADD finds it full.
    let first = net.pod();
    net.run("ADD", &conf, ID, &first, "eth0").assert_success();
    let full = same_error_both_ways(&net, &conf, "range exhausted");
    assert!(
        full.error_msg()
            .unwrap_or_default()
            .contains("no IP addresses available"),
        "{full}"
    );
    net.run("DEL", &conf, ID, &first, "eth0")
        .assert_success_silent();
    net.assert_nothing_left("after the exhausted-range ADDs and DEL");

    let mut bad = net.conf("0.4.0", &["10.85.1.0/24"], &json!({}));
    bad["ipam"]["ranges"] = json!([[{"subnet": "10.85.1.0/24", "rangeStart": "10.99.0.1"}]]);
    same_error_both_ways(&net, &bad, "rangeStart outside the subnet");
    let mut unknown = net.conf("1.0.0", &["10.85.2.0/24"], &json!({}));
    unknown["ipam"]["ranges"] = json!("not a list");
    let out = same_error_both_ways(&net, &unknown, "ranges not a list");
    assert_eq!(out.json()["cniVersion"], "1.0.0", "{out}");
    net.assert_nothing_left("after the bad-config ADDs");
}

/// `CNI_RS_FAILPOINT=host-local:…` through the bridge (debug builds): `error` gives the
/// same error JSON in-process and exec'd; `kill` in-process kills the bridge itself at
/// host-local's step (a crash of the whole ADD, which DEL cleans up), exec'd only the
/// child, which the bridge reports and undoes.
#[test]
fn host_local_failpoints_through_the_bridge() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let conf = net.conf("1.0.0", &["10.86.0.0/24"], &json!({"isGateway": true}));
    let err = same_error_both_ways_with(
        &net,
        &conf,
        "host-local error failpoint",
        &[("CNI_RS_FAILPOINT", "host-local:error@1")],
    );
    assert!(
        err.error_msg()
            .is_some_and(|m| m.starts_with("failpoint host-local/")),
        "{err}"
    );
    net.assert_nothing_left("after the host-local error failpoint");

    let shipped = bin_dir().to_string_lossy().into_owned();
    let pod = net.pod();
    let killed = bridge(&net, &shipped, "ADD", &conf)
        .env("CNI_RS_FAILPOINT", "host-local:kill@1")
        .attachment(ID, &pod, "eth0")
        .run();
    assert_eq!(killed.status.signal(), Some(9), "in-process: {killed}");
    bridge(&net, &shipped, "DEL", &conf)
        .attachment(ID, &pod, "eth0")
        .run()
        .assert_success_silent();
    net.assert_nothing_left("after the in-process kill and DEL");
    assert!(!has_link(&pod, "eth0"), "pod interface left");

    let copy = copy_dir();
    let reported = bridge(&net, copy.path_str(), "ADD", &conf)
        .env("CNI_RS_FAILPOINT", "host-local:kill@1")
        .attachment(ID, &pod, "eth0")
        .run();
    reported.assert_failure();
    assert!(
        reported
            .error_msg()
            .is_some_and(|m| m.starts_with("netplugin failed with no error message: signal: 9")),
        "exec'd: {reported}"
    );
    assert!(
        !has_link(&pod, "eth0"),
        "the failed ADD left the pod interface"
    );
    bridge(&net, copy.path_str(), "DEL", &conf)
        .attachment(ID, &pod, "eth0")
        .run()
        .assert_success_silent();
    net.assert_nothing_left("after the exec'd kill and DEL");
}

#[test]
fn the_multi_call_binary_under_another_name_fails_cleanly() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let dir = TempDir::new("cnibb-inproc-name");
    let renamed = dir.path().join("macvlan");
    std::fs::copy(multicall_path(), &renamed).expect("copy");
    for binary in [multicall_path(), renamed] {
        let name = binary.file_name().unwrap().to_string_lossy().into_owned();
        let out = Plugin::at(&binary, &net.host).command("ADD").run();
        assert_eq!(out.code(), Some(1), "{out}");
        assert!(
            out.stderr.contains(&format!("started as \"{name}\""))
                && out.stderr.contains("bridge, host-local, loopback"),
            "{out}"
        );
        assert!(!out.stderr.contains("panicked"), "{out}");
        let error = out
            .error()
            .unwrap_or_else(|| panic!("no error JSON:\n{out}"));
        assert_eq!(error["code"], 999, "{out}");
        // Started by hand (no CNI_COMMAND): the message only.
        let bare = Plugin::at(&binary, &net.host).run();
        assert_eq!((bare.code(), bare.stdout.as_str()), (Some(1), ""), "{bare}");
        assert!(
            bare.stderr.contains("bridge, host-local, loopback"),
            "{bare}"
        );
    }
}
