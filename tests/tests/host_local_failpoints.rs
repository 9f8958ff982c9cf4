//! Kill or fail `host-local` at every step: the debug build passes a
//! failpoint (`host-local/<command>/<step>`) between any two of its file operations;
//! `CNI_RS_FAILPOINT=host-local:kill@N` dies by SIGKILL at the N-th, `error@N` fails there.
//!
//! Each test first learns the command's steps from a clean, traced run
//! (`CNI_RS_FAILPOINT_TRACE`), then walks them all: for ADD (dual-stack), DEL and GC,
//! killed at each step, a DEL (and separately a GC) with the same arguments succeeds and
//! leaves no reservation of the attachment and no temp file, and a new ADD of the same
//! container succeeds. ADD failing at each step leaves nothing reserved. A bystander
//! attachment's reservations must survive all of it.
//!
//! Failpoints exist only in debug builds: with release binaries (`CNI_BLACKBOX_BIN_DIR`)
//! the trace is empty and the tests fail saying so.

mod host_local_support;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt as _;

use cni_blackbox::{Outcome, TempDir, unique_name};
use host_local_support::*;
use serde_json::{Value, json};

/// One network: its data dir, name and a dual-stack 1.1.0 config (GC needs 1.1.0).
struct Net {
    data: TempDir,
    name: String,
    config: Value,
}

impl Net {
    fn new(tag: &str) -> Self {
        let data = TempDir::new(tag);
        let name = unique_name("hl");
        let config = dual_stack(&name, Some("1.1.0"), &data);
        Self { data, name, config }
    }

    fn add(&self, id: &str, extra: &[(&str, &str)]) -> Outcome {
        attach_with(ours(), "ADD", &self.config, id, "eth0", extra)
    }

    /// DEL with the ADD's result as `prevResult`, as a runtime sends it.
    fn del(&self, id: &str, prev: &Value, extra: &[(&str, &str)]) -> Outcome {
        let mut config = self.config.clone();
        config["prevResult"] = prev.clone();
        attach_with(ours(), "DEL", &config, id, "eth0", extra)
    }

    fn gc(&self, valid: &[&str], extra: &[(&str, &str)]) -> Outcome {
        let mut config = self.config.clone();
        let valid: Vec<Value> = valid
            .iter()
            .map(|id| json!({"containerID": id, "ifname": "eth0"}))
            .collect();
        config["cni.dev/valid-attachments"] = json!(valid);
        network_command_with(ours(), "GC", &config, extra)
    }

    fn reservations(&self) -> BTreeMap<String, String> {
        reservations(&self.data, &self.name)
    }

    /// The failpoints a command passes, learned from a traced run of `run`.
    fn trace(&self, run: impl FnOnce(&[(&str, &str)]) -> Outcome) -> Vec<String> {
        let file = self.data.path().join(unique_name("trace"));
        let path = file.to_str().unwrap_or_default().to_owned();
        run(&[("CNI_RS_FAILPOINT_TRACE", &path)]).assert_success();
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let _ = std::fs::remove_file(&file);
        let steps: Vec<String> = text.lines().map(str::to_owned).collect();
        assert!(
            !steps.is_empty(),
            "no failpoint passed: failpoints exist only in debug builds of host-local"
        );
        steps
    }

    /// Panics unless only `keep`'s reservations (both families) are left, whole, and no
    /// temp file.
    #[track_caller]
    fn assert_only(&self, keep: &[&str], context: &str) {
        let mut owners: Vec<String> = self.reservations().into_values().collect();
        owners.sort();
        let mut want: Vec<String> = keep
            .iter()
            .flat_map(|id| [format!("{id}\r\neth0"), format!("{id}\r\neth0")])
            .collect();
        want.sort();
        assert_eq!(owners, want, "{context}");
        let temps = temp_files(&self.data, &self.name);
        assert!(temps.is_empty(), "temp files left {temps:?}: {context}");
    }
}

fn killed(out: &Outcome) -> bool {
    out.status.signal() == Some(9)
}

/// `host-local:<action>@<n>`.
fn failpoint(action: &str, n: usize) -> String {
    format!("host-local:{action}@{n}")
}

#[test]
fn add_killed_at_every_step_then_del_or_gc_cleans_up() {
    let net = Net::new("hl-fp-add");
    net.add("bystander", &[]).assert_success();
    let steps = net.trace(|extra| net.add("victim", extra));
    net.del("victim", &json!({}), &[]).assert_success_silent();
    // Dual-stack: a reservation (temp, link, cursor) per family, around lock and result.
    for step in [
        "add/locked",
        "add/temp-written",
        "add/linked",
        "add/reserved",
    ] {
        assert!(
            steps.iter().any(|s| s == &format!("host-local/{step}")),
            "{step} not in {steps:?}"
        );
    }
    for (n, step) in steps.iter().enumerate().map(|(i, s)| (i + 1, s)) {
        for cleanup in ["DEL", "GC"] {
            let context = format!("ADD killed at {step} (#{n}), then {cleanup}");
            let out = net.add("victim", &[("CNI_RS_FAILPOINT", &failpoint("kill", n))]);
            assert!(killed(&out), "{context}: not killed\n{out}");
            // The runtime saw the ADD fail: it has no result to pass, and the attachment
            // is not valid.
            match cleanup {
                "DEL" => net.del("victim", &json!({}), &[]),
                _ => net.gc(&["bystander"], &[]),
            }
            .assert_success_silent();
            net.assert_only(&["bystander"], &context);
            let again = net.add("victim", &[]);
            assert_eq!(addresses(&again).len(), 2, "{context}");
            net.del("victim", &again.json(), &[])
                .assert_success_silent();
        }
    }
    // One past the last step: nothing triggers, the ADD completes.
    let past = failpoint("kill", steps.len() + 1);
    let out = net.add("victim", &[("CNI_RS_FAILPOINT", &past)]);
    assert_eq!(addresses(&out).len(), 2);
}

#[test]
fn add_failing_at_every_step_leaves_nothing_reserved() {
    let net = Net::new("hl-fp-err");
    net.add("bystander", &[]).assert_success();
    let steps = net.trace(|extra| net.add("victim", extra));
    net.del("victim", &json!({}), &[]).assert_success_silent();
    for (n, step) in steps.iter().enumerate().map(|(i, s)| (i + 1, s)) {
        let context = format!("ADD failing at {step} (#{n})");
        let out = net.add("victim", &[("CNI_RS_FAILPOINT", &failpoint("error", n))]);
        if step == "host-local/add/cursor-writing" || step == "host-local/add/cursor-temp-written" {
            // Failing to move last_reserved_ip.N is tolerated: the reservation is whole
            // and stays, only round-robin order is lost; the cursor's temp file goes.
            assert_eq!(addresses(&out).len(), 2, "{context}");
            assert!(
                out.stderr.contains("could not record the last reserved ip"),
                "{context}\n{out}"
            );
            net.assert_only(&["bystander", "victim"], &context);
            net.del("victim", &out.json(), &[]).assert_success_silent();
            continue;
        }
        assert_eq!(out.error_code(), Some(999), "{context}\n{out}");
        let msg = out.error_msg().unwrap_or_default();
        assert!(
            msg.ends_with(&format!("failpoint {step} triggered")),
            "{context}\n{out}"
        );
        net.assert_only(&["bystander"], &context);
        let again = net.add("victim", &[]);
        assert_eq!(addresses(&again).len(), 2, "{context}");
        net.del("victim", &again.json(), &[])
            .assert_success_silent();
    }
}

#[test]
fn del_killed_at_every_step_then_del_or_gc_cleans_up() {
    let net = Net::new("hl-fp-del");
    net.add("bystander", &[]).assert_success();
    let added = net.add("victim", &[]);
    let steps = net.trace(|extra| net.del("victim", &added.json(), extra));
    assert_eq!(
        steps,
        [
            "host-local/del/locked",
            "host-local/del/released",
            "host-local/del/released"
        ]
    );
    for (n, step) in steps.iter().enumerate().map(|(i, s)| (i + 1, s)) {
        for cleanup in ["DEL", "GC"] {
            let context = format!("DEL killed at {step} (#{n}), then {cleanup}");
            let added = net.add("victim", &[]);
            assert_eq!(addresses(&added).len(), 2, "{context}");
            let prev = added.json();
            let out = net.del(
                "victim",
                &prev,
                &[("CNI_RS_FAILPOINT", &failpoint("kill", n))],
            );
            assert!(killed(&out), "{context}: not killed\n{out}");
            match cleanup {
                "DEL" => net.del("victim", &prev, &[]),
                _ => net.gc(&["bystander"], &[]),
            }
            .assert_success_silent();
            net.assert_only(&["bystander"], &context);
        }
    }
    let again = net.add("victim", &[]);
    assert_eq!(addresses(&again).len(), 2);
}

#[test]
fn gc_killed_at_every_step_then_gc_or_del_cleans_up() {
    let net = Net::new("hl-fp-gc");
    net.add("bystander", &[]).assert_success();
    let stale = ["gone1", "gone2"];
    for id in stale {
        net.add(id, &[]).assert_success();
    }
    let steps = net.trace(|extra| net.gc(&["bystander"], extra));
    assert_eq!(steps.len(), 5, "lock + four releases: {steps:?}");
    for (n, step) in steps.iter().enumerate().map(|(i, s)| (i + 1, s)) {
        for cleanup in ["GC", "DEL"] {
            let context = format!("GC killed at {step} (#{n}), then {cleanup}");
            for id in stale {
                // Re-add what the previous round released (a partly released attachment is
                // first cleaned by its DEL, as a runtime would).
                net.del(id, &json!({}), &[]).assert_success_silent();
                assert_eq!(addresses(&net.add(id, &[])).len(), 2, "{context}");
            }
            let out = net.gc(
                &["bystander"],
                &[("CNI_RS_FAILPOINT", &failpoint("kill", n))],
            );
            assert!(killed(&out), "{context}: not killed\n{out}");
            if cleanup == "GC" {
                net.gc(&["bystander"], &[]).assert_success_silent();
            } else {
                for id in stale {
                    net.del(id, &json!({}), &[]).assert_success_silent();
                }
            }
            net.assert_only(&["bystander"], &context);
            let again = net.add("gone1", &[]);
            assert_eq!(addresses(&again).len(), 2, "{context}");
            net.del("gone1", &again.json(), &[]).assert_success_silent();
        }
    }
}

#[test]
fn status_killed_after_its_probe_leaves_a_temp_the_next_command_removes() {
    let net = Net::new("hl-fp-status");
    net.add("bystander", &[]).assert_success();
    let status =
        |extra: &[(&str, &str)]| network_command_with(ours(), "STATUS", &net.config, extra);
    let steps = net.trace(status);
    assert_eq!(steps, ["host-local/status/probe-written"]);
    let out = status(&[("CNI_RS_FAILPOINT", &failpoint("kill", 1))]);
    assert!(killed(&out), "{out}");
    assert_eq!(temp_files(&net.data, &net.name).len(), 1);
    // The probe is no reservation; any command under the lock removes it.
    status(&[]).assert_success_silent();
    net.gc(&["bystander"], &[]).assert_success_silent();
    net.assert_only(&["bystander"], "STATUS killed, then GC");
}
