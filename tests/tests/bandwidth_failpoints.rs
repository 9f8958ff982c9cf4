//! `bandwidth` interrupted at every step: ADD is killed (SIGKILL), made to fail and made
//! to panic at each of its failpoints in turn, DEL is killed at each of its own. A
//! failing or panicking ADD must leave the veth and the node as they were (no qdisc, no
//! ifb device), so that the same pod can be limited again at once; after a killed ADD,
//! the runtime's DEL of the chain (bandwidth, then the bridge) must leave nothing; after
//! a killed DEL, a DEL must remove the ifb device.
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
    veth: String,
    data: TempDir,
}

fn bridge_conf(data: &TempDir) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "bwfp",
        "type": "bridge",
        "bridge": "bwfp0",
        "isGateway": true,
        "ipam": {
            "type": "host-local",
            "dataDir": data.path_str(),
            "ranges": [[{"subnet": "10.97.0.0/24"}]]
        }
    })
}

impl Lab {
    fn new() -> Self {
        let host = Netns::new("cnibb-bwfp-host");
        let pod = Netns::new("cnibb-bwfp-pod");
        let data = TempDir::new("cnibb-bwfp");
        let id = unique_name("bwfp");
        let out = Plugin::new("bridge", &host)
            .command("ADD")
            .attachment(&id, &pod, "eth0")
            .config(&bridge_conf(&data))
            .run();
        out.assert_success();
        let prev = out.json();
        let veth = prev["interfaces"][1]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        Self {
            host,
            pod,
            id,
            prev,
            veth,
            data,
        }
    }

    fn conf(&self, with_prev: bool) -> Value {
        let mut conf = json!({
            "cniVersion": "1.0.0",
            "name": "bwfp",
            "type": "bandwidth",
            "runtimeConfig": {"bandwidth": {
                "ingressRate": 8_000_000, "ingressBurst": 80_000,
                "egressRate": 8_000_000, "egressBurst": 80_000
            }}
        });
        if with_prev {
            conf["prevResult"] = self.prev.clone();
        }
        conf
    }

    fn run(&self, command: &str, env: &[(&str, &str)]) -> Outcome {
        let mut plugin = Plugin::new("bandwidth", &self.host)
            .command(command)
            .attachment(&self.id, &self.pod, "eth0")
            .config(&self.conf(command != "DEL"));
        for (k, v) in env {
            plugin = plugin.env(k, v);
        }
        plugin.run()
    }

    /// The node's ifb devices and the veth's qdiscs other than its default one.
    fn shaping(&self) -> Vec<String> {
        let mut found: Vec<String> = self
            .host
            .exec_ok(&["ip", "-o", "link", "show", "type", "ifb"])
            .lines()
            .map(str::to_owned)
            .collect();
        if !self.veth.is_empty()
            && self
                .host
                .exec(&["ip", "link", "show", &self.veth])
                .status
                .success()
        {
            found.extend(
                self.host
                    .exec_ok(&["tc", "qdisc", "show", "dev", &self.veth])
                    .lines()
                    .filter(|l| l.contains("tbf") || l.contains("ingress"))
                    .map(str::to_owned),
            );
        }
        found
    }

    #[track_caller]
    fn assert_clean(&self, context: &str) {
        let left = self.shaping();
        assert!(left.is_empty(), "{context}: left: {left:#?}");
    }

    /// The runtime's DEL of the whole chain: bandwidth, then the bridge.
    fn del_chain(&self) {
        self.run("DEL", &[]).assert_success();
        Plugin::new("bridge", &self.host)
            .command("DEL")
            .attachment(&self.id, &self.pod, "eth0")
            .config(&bridge_conf(&self.data))
            .run()
            .assert_success();
    }
}

/// The failpoints `command` passes in a clean run.
fn steps(command: &str) -> Vec<String> {
    let lab = Lab::new();
    let trace = TempDir::new("cnibb-bwfp-trace");
    let file = trace.path().join("trace");
    let file_text = file.display().to_string();
    if command == "DEL" {
        lab.run("ADD", &[]).assert_success();
    }
    lab.run(command, &[("CNI_RS_FAILPOINT_TRACE", &file_text)])
        .assert_success();
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let steps: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("bandwidth/"))
        .map(str::to_owned)
        .collect();
    assert!(!steps.is_empty(), "no {command} failpoints traced");
    lab.run("DEL", &[]).assert_success();
    steps
}

#[test]
fn add_and_del_interrupted_at_every_step_leave_nothing() {
    if !require_root() {
        return;
    }
    let add_steps = steps("ADD");
    eprintln!("ADD steps: {add_steps:?}");
    for n in 1..=add_steps.len() {
        for action in ["kill", "error", "panic"] {
            let lab = Lab::new();
            let point = format!("bandwidth:{action}@{n}");
            let out = lab.run("ADD", &[("CNI_RS_FAILPOINT", &point)]);
            let context = format!("ADD {point} ({})", add_steps[n - 1]);
            match action {
                "kill" => {
                    assert_eq!(out.status.signal(), Some(9), "{context}: {out}");
                    lab.del_chain();
                    lab.assert_clean(&context);
                    continue;
                }
                _ => {
                    assert_eq!(out.code(), Some(1), "{context}: {out}");
                    assert!(out.error().is_some(), "{context}: no error JSON: {out}");
                }
            }
            lab.assert_clean(&context);
            lab.run("ADD", &[]).assert_success();
            lab.run("CHECK", &[]).assert_success();
            lab.run("DEL", &[]).assert_success();
        }
    }
    let del_steps = steps("DEL");
    for n in 1..=del_steps.len() {
        let lab = Lab::new();
        lab.run("ADD", &[]).assert_success();
        let point = format!("bandwidth:kill@{n}");
        let out = lab.run("DEL", &[("CNI_RS_FAILPOINT", &point)]);
        assert_eq!(out.status.signal(), Some(9), "DEL {point}: {out}");
        lab.del_chain();
        lab.assert_clean(&format!("DEL {point}"));
    }
}
