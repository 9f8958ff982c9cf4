//! `bridge` interrupted at every step: ADD, CHECK, DEL and GC are killed (SIGKILL) at
//! each of their failpoints in turn, and ADD is also made to fail and to panic at each
//! one. Whatever the moment, DEL (or, for a killed ADD, GC once the runtime has removed
//! the sandbox) must succeed and leave nothing of the attachment: no pod interface, no
//! host veth, no host-local reservation, no masquerade rule in either backend, no
//! spoof-check chain, no pod record, no address pending in the NetworkPolicy table;
//! and the same pod must be attachable again afterwards. A failing or panicking ADD
//! must leave nothing behind by itself, without any DEL.
//!
//! The steps are learnt from a traced clean run (`CNI_RS_FAILPOINT_TRACE`), so a new
//! failpoint in the plugin is covered without touching this file. The black-box tests
//! run the debug build, where failpoints are live (`cni_protocol::failpoint`).
//!
//! Each step runs on its own network (host netns, bridge, IPAM directory, firewall
//! tables), so steps run in parallel. Every step is run for one config per masquerade
//! backend (dual-stack, `isDefaultGateway`, `ipMasq`, `macspoofchk`, `portSecurity`,
//! `podRecordDir` with the pod in `CNI_ARGS`, and a NetworkPolicy table in the host
//! netns) and a layer-2 one (`macspoofchk`, hairpin, port isolation), in CI as well:
//! 34 and 15 ADD steps, a few
//! plugin runs each, about three minutes on two CPUs (`cargo test -p cni-blackbox --test
//! bridge_failpoints`). The panic tests also need the dispatcher to turn a panic into
//! an error document (exit code 1, the config's `cniVersion`).

mod bridge_support;

use std::os::unix::process::ExitStatusExt;

use bridge_support::{Net, has_link};
use cni_blackbox::{Netns, Outcome, TempDir, parallel, require_root};
use serde_json::{Value, json};

const CID: &str = "ctr-failpoint";
const IFNAME: &str = "eth0";
/// Not the newest version, so an error printed with the plugin's own version instead of
/// the config's is caught. GC needs 1.1.0 and gets it in [`gc_conf`].
const VERSION: &str = "1.0.0";
const VARIANTS: [&str; 3] = ["iptables", "nftables", "layer2"];
/// Steps in flight at once; each runs a handful of plugin and `ip`/`nft` processes.
const WIDTH: usize = 3;

/// What containerd passes for the pod: with `podRecordDir`, ADD records its addresses
/// and holds them pending in the NetworkPolicy table.
const K8S_ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=failpoints;K8S_POD_NAME=pod-0;K8S_POD_INFRA_CONTAINER_ID=ctr-failpoint;K8S_POD_UID=7e1c";

/// A throwaway network whose host netns has the node agent's NetworkPolicy table (its
/// pending sets), so that a pending address left behind shows in `nft list ruleset`.
fn network() -> Net {
    let net = Net::new();
    net.create_policy_table();
    net
}

/// The config of a variant: `iptables` or `nftables` (dual-stack with default gateways,
/// masquerade on that backend, the spoof check, port security and pod records), or
/// `layer2` (no IPAM; spoof check, hairpin and port isolation).
fn conf(net: &Net, variant: &str) -> Value {
    if variant == "layer2" {
        return net.conf(
            VERSION,
            &[],
            &json!({"macspoofchk": true, "hairpinMode": true, "portIsolation": true}),
        );
    }
    net.conf(
        VERSION,
        &["10.77.0.0/24", "fd00:77::/64"],
        &json!({
            "isGateway": true,
            "isDefaultGateway": true,
            "ipMasq": true,
            "ipMasqBackend": variant,
            "macspoofchk": true,
            "portSecurity": true,
            "podRecordDir": net.records_dir(),
        }),
    )
}

/// The same config as a GC request that declares no attachment valid.
fn gc_conf(conf: &Value) -> Value {
    let mut gc = conf.clone();
    gc["cniVersion"] = json!("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([]);
    gc
}

/// The same config as a CHECK request for the result `add` printed.
fn check_conf(conf: &Value, add: &Outcome) -> Value {
    let mut check = conf.clone();
    check["prevResult"] = add.json();
    check
}

/// `command` of the attachment (`CID`, `pod`, `IFNAME`) with extra environment.
fn run(net: &Net, command: &str, conf: &Value, pod: &Netns, env: &[(&str, &str)]) -> Outcome {
    let mut plugin = net
        .plugin(command, conf)
        .attachment(CID, pod, IFNAME)
        .cni_args(K8S_ARGS);
    for (key, value) in env {
        plugin = plugin.env(key, value);
    }
    plugin.run()
}

/// The bridge failpoints a clean run of `command` passes, in order. `prepare` makes the
/// state the command needs (e.g. an ADD before DEL) on the given network and pod and
/// returns the config to run `command` with.
fn learn_steps(
    variant: &str,
    command: &str,
    prefix: &str,
    prepare: impl Fn(&Net, &Netns) -> Value,
) -> Vec<String> {
    let net = network();
    let pod = net.pod();
    let conf = prepare(&net, &pod);
    let dir = TempDir::new("cnibb-fp-trace");
    let trace = dir.path().join("trace");
    let trace_text = trace.to_string_lossy().into_owned();
    let out = run(
        &net,
        command,
        &conf,
        &pod,
        &[("CNI_RS_FAILPOINT_TRACE", &trace_text)],
    );
    out.assert_success();
    let text = std::fs::read_to_string(&trace)
        .unwrap_or_else(|e| panic!("no failpoint trace from a clean {command} ({e}):\n{out}"));
    // The trace also holds the delegated IPAM plugin's failpoints (another scope).
    let steps: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect();
    assert!(
        steps.len() >= 3,
        "too few {command} failpoints traced: {steps:?}"
    );
    eprintln!(
        "{variant} {command}: {} steps: {}",
        steps.len(),
        steps.join(" ")
    );
    // Leave this network clean too: DEL, whatever the command was.
    run(&net, "DEL", &conf_of(&conf), &pod, &[]).assert_success();
    net.assert_nothing_left("after learning the steps");
    steps
}

/// `conf` without the command-specific keys, as DEL and ADD take it.
fn conf_of(conf: &Value) -> Value {
    let mut plain = conf.clone();
    if let Some(map) = plain.as_object_mut() {
        map.remove("prevResult");
        map.remove("cni.dev/valid-attachments");
    }
    plain
}

/// Panics unless the plugin died of SIGKILL (the failpoint was reached).
#[track_caller]
fn assert_killed(out: &Outcome, step: &str) {
    assert_eq!(out.status.signal(), Some(9), "not killed at {step}:\n{out}");
}

/// Nothing of the attachment in the host netns, the IPAM directory or `pod`.
#[track_caller]
fn assert_clean(net: &Net, pod: &Netns, what: &str) {
    net.assert_nothing_left(what);
    assert!(
        !has_link(pod, IFNAME),
        "{what}: pod interface {IFNAME} left"
    );
}

/// ADD of the same pod succeeds again, and its DEL leaves nothing.
#[track_caller]
fn assert_reattachable(net: &Net, conf: &Value, pod: &Netns, what: &str) {
    let add = run(net, "ADD", conf, pod, &[]);
    assert!(add.success(), "{what}: ADD again failed:\n{add}");
    run(net, "DEL", conf, pod, &[]).assert_success_silent();
    assert_clean(net, pod, &format!("{what}, ADD + DEL again"));
}

/// Runs `case` for steps `1..=steps.len()` in parallel; panics afterwards naming the steps
/// that failed (each failure's message is printed above by the panic hook).
fn every_step(steps: &[String], case: impl Fn(usize, &str) + Sync) {
    let failed: Vec<String> = parallel(steps.len(), WIDTH, |i| {
        let n = i + 1;
        let step = format!("#{n} {}", steps[i]);
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(n, &step)))
            .err()
            .map(|_| step)
    })
    .into_iter()
    .flatten()
    .collect();
    assert!(
        failed.is_empty(),
        "{} of {} steps failed: {failed:?}",
        failed.len(),
        steps.len()
    );
}

fn add_killed_then_del(variant: &str) {
    let steps = learn_steps(variant, "ADD", "bridge/add/", |net, _| conf(net, variant));
    every_step(&steps, |n, step| {
        let net = network();
        let pod = net.pod();
        let conf = conf(&net, variant);
        let trigger = format!("bridge:kill@{n}");
        let out = run(&net, "ADD", &conf, &pod, &[("CNI_RS_FAILPOINT", &trigger)]);
        assert_killed(&out, step);
        let del = run(&net, "DEL", &conf, &pod, &[]);
        assert!(del.success(), "DEL after ADD killed at {step}:\n{del}");
        assert_clean(&net, &pod, &format!("ADD killed at {step}, then DEL"));
        assert_reattachable(&net, &conf, &pod, &format!("ADD killed at {step}"));
    });
}

fn add_killed_then_gc(variant: &str) {
    let steps = learn_steps(variant, "ADD", "bridge/add/", |net, _| conf(net, variant));
    every_step(&steps, |n, step| {
        let net = network();
        let pod = net.pod();
        let conf = conf(&net, variant);
        let trigger = format!("bridge:kill@{n}");
        let out = run(&net, "ADD", &conf, &pod, &[("CNI_RS_FAILPOINT", &trigger)]);
        assert_killed(&out, step);
        // What a runtime does with a sandbox whose ADD never answered: remove it, then
        // collect garbage with the attachments that are still valid (none).
        pod.delete();
        net.wait_host_veths_gone();
        let gc = net.plugin("GC", &gc_conf(&conf)).run();
        assert!(gc.success(), "GC after ADD killed at {step}:\n{gc}");
        net.assert_nothing_left(&format!("ADD killed at {step}, then GC"));
        let pod = net.pod();
        assert_reattachable(&net, &conf, &pod, &format!("ADD killed at {step}, GC"));
    });
}

fn add_failing_rolls_back(variant: &str) {
    let steps = learn_steps(variant, "ADD", "bridge/add/", |net, _| conf(net, variant));
    every_step(&steps, |n, step| {
        let net = network();
        let pod = net.pod();
        let conf = conf(&net, variant);
        let trigger = format!("bridge:error@{n}");
        let out = run(&net, "ADD", &conf, &pod, &[("CNI_RS_FAILPOINT", &trigger)]);
        assert_eq!(out.code(), Some(1), "ADD failing at {step}:\n{out}");
        let error = out.json();
        assert_eq!(error["code"], json!(999), "ADD failing at {step}:\n{out}");
        assert_eq!(error["cniVersion"], json!(VERSION), "{out}");
        let msg = error["msg"].as_str().unwrap_or_default();
        assert!(msg.contains("failpoint"), "ADD failing at {step}:\n{out}");
        assert_clean(&net, &pod, &format!("ADD failed at {step} (no DEL)"));
        assert_reattachable(&net, &conf, &pod, &format!("ADD failed at {step}"));
    });
}

fn add_panicking_rolls_back(variant: &str) {
    let steps = learn_steps(variant, "ADD", "bridge/add/", |net, _| conf(net, variant));
    every_step(&steps, |n, step| {
        let net = network();
        let pod = net.pod();
        let conf = conf(&net, variant);
        let trigger = format!("bridge:panic@{n}");
        let out = run(&net, "ADD", &conf, &pod, &[("CNI_RS_FAILPOINT", &trigger)]);
        assert_clean(&net, &pod, &format!("ADD panicked at {step} (no DEL)"));
        // A complete error document with the config's version and exit code 1, not an
        // abort (134) or Rust's panic exit code (101).
        assert_eq!(out.code(), Some(1), "ADD panicking at {step}:\n{out}");
        let error = out.json();
        assert_eq!(error["code"], json!(999), "ADD panicking at {step}:\n{out}");
        assert_eq!(error["cniVersion"], json!(VERSION), "{out}");
        assert_reattachable(&net, &conf, &pod, &format!("ADD panicked at {step}"));
    });
}

/// `command` (run after a clean ADD) killed at every step, then DEL.
fn killed_after_add_then_del(variant: &str, command: &str, prefix: &str) {
    let prepare = |net: &Net, pod: &Netns| {
        let conf = conf(net, variant);
        let add = run(net, "ADD", &conf, pod, &[]);
        add.assert_success();
        match command {
            "CHECK" => check_conf(&conf, &add),
            "GC" => gc_conf(&conf),
            _ => conf,
        }
    };
    let steps = learn_steps(variant, command, prefix, prepare);
    every_step(&steps, |n, step| {
        let net = network();
        let pod = net.pod();
        let request = prepare(&net, &pod);
        let conf = conf_of(&request);
        let trigger = format!("bridge:kill@{n}");
        let out = run(
            &net,
            command,
            &request,
            &pod,
            &[("CNI_RS_FAILPOINT", &trigger)],
        );
        assert_killed(&out, step);
        let del = run(&net, "DEL", &conf, &pod, &[]);
        assert!(
            del.success(),
            "DEL after {command} killed at {step}:\n{del}"
        );
        assert_clean(&net, &pod, &format!("{command} killed at {step}, then DEL"));
        assert_reattachable(&net, &conf, &pod, &format!("{command} killed at {step}"));
    });
}

#[test]
fn add_killed_at_every_step_then_del_iptables() {
    if require_root() {
        add_killed_then_del("iptables");
    }
}

#[test]
fn add_killed_at_every_step_then_del_nftables() {
    if require_root() {
        add_killed_then_del("nftables");
    }
}

#[test]
fn add_killed_at_every_step_then_gc_iptables() {
    if require_root() {
        add_killed_then_gc("iptables");
    }
}

#[test]
fn add_killed_at_every_step_then_gc_nftables() {
    if require_root() {
        add_killed_then_gc("nftables");
    }
}

#[test]
fn add_failing_at_every_step_leaves_nothing_iptables() {
    if require_root() {
        add_failing_rolls_back("iptables");
    }
}

#[test]
fn add_failing_at_every_step_leaves_nothing_nftables() {
    if require_root() {
        add_failing_rolls_back("nftables");
    }
}

#[test]
fn add_panicking_at_every_step_leaves_nothing_iptables() {
    if require_root() {
        add_panicking_rolls_back("iptables");
    }
}

#[test]
fn add_panicking_at_every_step_leaves_nothing_nftables() {
    if require_root() {
        add_panicking_rolls_back("nftables");
    }
}

#[test]
fn check_killed_at_every_step_then_del() {
    if require_root() {
        for variant in VARIANTS {
            killed_after_add_then_del(variant, "CHECK", "bridge/check/");
        }
    }
}

#[test]
fn del_killed_at_every_step_then_del() {
    if require_root() {
        for variant in VARIANTS {
            killed_after_add_then_del(variant, "DEL", "bridge/del/");
        }
    }
}

#[test]
fn gc_killed_at_every_step_then_del() {
    if require_root() {
        for variant in VARIANTS {
            killed_after_add_then_del(variant, "GC", "bridge/gc/");
        }
    }
}

#[test]
fn layer2_add_killed_or_failing_at_every_step() {
    if require_root() {
        add_killed_then_del("layer2");
        add_killed_then_gc("layer2");
        add_failing_rolls_back("layer2");
    }
}

#[test]
fn add_panicking_at_every_step_leaves_nothing_layer2() {
    if require_root() {
        add_panicking_rolls_back("layer2");
    }
}
