//! `portmap` interrupted at every step, on both backends: ADD is killed (SIGKILL), made
//! to fail and made to panic at each of its failpoints in turn, DEL is killed at each of
//! its own. A failing or panicking ADD must leave no rule by itself; after a killed ADD
//! or DEL, a DEL must succeed and leave no rule; and the same pod must get its host
//! ports again afterwards.
//!
//! The steps are learnt from a traced clean run (`CNI_RS_FAILPOINT_TRACE`), so a new
//! failpoint is covered without touching this file (debug builds, where failpoints are
//! live: `cni_protocol::failpoint`).

use std::os::unix::process::ExitStatusExt;

use cni_blackbox::{Netns, Outcome, Plugin, TempDir, require_root, unique_name};
use serde_json::{Value, json};

/// One pod attached by our bridge in its own host netns.
struct Lab {
    host: Netns,
    pod: Netns,
    id: String,
    prev: Value,
    _data: TempDir,
}

impl Lab {
    fn new() -> Self {
        let host = Netns::new("cnibb-pmfp-host");
        let pod = Netns::new("cnibb-pmfp-pod");
        let data = TempDir::new("cnibb-pmfp");
        let id = unique_name("pmfp");
        let bridge = json!({
            "cniVersion": "1.0.0",
            "name": "pmfp",
            "type": "bridge",
            "bridge": "pmfp0",
            "isGateway": true,
            "ipam": {
                "type": "host-local",
                "dataDir": data.path_str(),
                "ranges": [[{"subnet": "10.98.0.0/24"}], [{"subnet": "fd00:98::/64"}]]
            }
        });
        let out = Plugin::new("bridge", &host)
            .command("ADD")
            .attachment(&id, &pod, "eth0")
            .config(&bridge)
            .run();
        out.assert_success();
        let prev = out.json();
        Self {
            host,
            pod,
            id,
            prev,
            _data: data,
        }
    }

    fn conf(&self, backend: &str, with_prev: bool) -> Value {
        let mut conf = json!({
            "cniVersion": "1.0.0",
            "name": "pmfp",
            "type": "portmap",
            "backend": backend,
            "runtimeConfig": {"portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": 5300, "containerPort": 53, "protocol": "udp"}
            ]}
        });
        if with_prev {
            conf["prevResult"] = self.prev.clone();
        }
        conf
    }

    fn run(&self, command: &str, backend: &str, env: &[(&str, &str)]) -> Outcome {
        let mut plugin = Plugin::new("portmap", &self.host)
            .command(command)
            .attachment(&self.id, &self.pod, "eth0")
            .config(&self.conf(backend, command != "DEL"));
        for (k, v) in env {
            plugin = plugin.env(k, v);
        }
        plugin.run()
    }

    /// Lines of the host's firewall that belong to the pod's host ports.
    fn rules(&self) -> Vec<String> {
        cni_blackbox::kernel::nat_and_nft(&self.host)
            .lines()
            .filter(|l| l.contains(&self.id) || l.contains("CNI-DN-"))
            .map(str::to_owned)
            .collect()
    }

    #[track_caller]
    fn assert_no_rules(&self, context: &str) {
        let left = self.rules();
        assert!(left.is_empty(), "{context}: rules left: {left:#?}");
    }
}

/// The failpoints `command` passes in a clean run.
fn steps(backend: &str, command: &str) -> Vec<String> {
    let lab = Lab::new();
    let trace = TempDir::new("cnibb-pmfp-trace");
    let file = trace.path().join("trace");
    let file_text = file.display().to_string();
    if command == "DEL" {
        lab.run("ADD", backend, &[]).assert_success();
    }
    lab.run(command, backend, &[("CNI_RS_FAILPOINT_TRACE", &file_text)])
        .assert_success();
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let steps: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("portmap/"))
        .map(str::to_owned)
        .collect();
    assert!(!steps.is_empty(), "no {command} failpoints traced");
    lab.run("DEL", backend, &[]).assert_success();
    steps
}

fn every_step(backend: &str) {
    if !require_root() {
        return;
    }
    let add_steps = steps(backend, "ADD");
    eprintln!("{backend} ADD steps: {add_steps:?}");
    for n in 1..=add_steps.len() {
        for action in ["kill", "error", "panic"] {
            let lab = Lab::new();
            let point = format!("portmap:{action}@{n}");
            let out = lab.run("ADD", backend, &[("CNI_RS_FAILPOINT", &point)]);
            let context = format!("{backend} ADD {point} ({})", add_steps[n - 1]);
            match action {
                "kill" => {
                    assert_eq!(out.status.signal(), Some(9), "{context}: {out}");
                    lab.run("DEL", backend, &[]).assert_success();
                }
                _ => {
                    assert_eq!(out.code(), Some(1), "{context}: {out}");
                    assert!(out.error().is_some(), "{context}: no error JSON: {out}");
                }
            }
            lab.assert_no_rules(&context);
            lab.run("ADD", backend, &[]).assert_success();
            lab.run("CHECK", backend, &[]).assert_success();
            lab.run("DEL", backend, &[]).assert_success();
            lab.assert_no_rules(&format!("{context}, then ADD and DEL"));
        }
    }
    let del_steps = steps(backend, "DEL");
    for n in 1..=del_steps.len() {
        let lab = Lab::new();
        lab.run("ADD", backend, &[]).assert_success();
        let point = format!("portmap:kill@{n}");
        let out = lab.run("DEL", backend, &[("CNI_RS_FAILPOINT", &point)]);
        assert_eq!(out.status.signal(), Some(9), "{backend} DEL {point}: {out}");
        lab.run("DEL", backend, &[]).assert_success();
        lab.assert_no_rules(&format!("{backend} DEL {point}"));
    }
}

#[test]
fn iptables_add_and_del_interrupted_at_every_step_leave_nothing() {
    every_step("iptables");
}

#[test]
fn nftables_add_and_del_interrupted_at_every_step_leave_nothing() {
    every_step("nftables");
}
