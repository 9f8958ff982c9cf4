//! The operator's log: off unless asked for; with `"log": {"file", "level"}` in the
//! config (or `CNI_RS_LOG_FILE`/`CNI_RS_LOG_LEVEL`) every command of the bridge and of
//! its IPAM delegate is recorded with its container, outcome and duration, and at
//! `debug` every step with its timing. Nothing of it reaches stdout.

mod bridge_support;

use bridge_support::Net;
use cni_blackbox::{TempDir, require_root};
use serde_json::json;

const V4: &str = "10.81.0.0/30";
const CID: &str = "cnibb-logged";

fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn commands_steps_and_failures_are_logged_to_the_file_only() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let logs = TempDir::new("cnibb-log");
    let file = logs.path().join("cni.log");
    let conf = net.conf(
        "1.0.0",
        &[V4],
        &json!({"isGateway": true, "log": {"file": file, "level": "debug"}}),
    );
    let pod = net.pod();
    let add = net.run("ADD", &conf, CID, &pod, "eth0");
    add.assert_success();
    assert!(
        add.json()["ips"].is_array(),
        "stdout is the result alone:\n{add}"
    );
    let after_add = lines(&file);
    let has = |lines: &[String], parts: &[&str]| {
        lines.iter().any(|l| parts.iter().all(|p| l.contains(p)))
    };
    for parts in [
        &[
            "plugin=bridge",
            "cmd=ADD",
            "container=cnibb-logged",
            "ifname=eth0",
            "msg=ok",
            "duration_ms=",
        ][..],
        &[
            "plugin=host-local",
            "cmd=ADD",
            "container=cnibb-logged",
            "msg=ok",
        ],
        &["plugin=bridge", "level=info", "msg=result", "10.81.0.2/30"],
        &["plugin=bridge", "level=debug", "step=bridge/", "after_ms="],
        &["plugin=host-local", "level=debug", "step=host-local/"],
    ] {
        assert!(
            has(&after_add, parts),
            "no line with {parts:?} in:\n{}",
            after_add.join("\n")
        );
    }
    for line in &after_add {
        assert!(
            line.contains(" pid=") && line.ends_with(|c: char| c != ' '),
            "{line}"
        );
    }

    // The /30 has one free address left after the gateway: a second pod exhausts it.
    let other = net.pod();
    let failed = net.run("ADD", &conf, "cnibb-logged-2", &other, "eth0");
    failed.assert_failure();
    let after_fail = lines(&file);
    assert!(
        has(
            &after_fail,
            &[
                "plugin=bridge",
                "level=error",
                "container=cnibb-logged-2",
                "msg=failed",
                "code=",
                "no IP addresses available"
            ]
        ),
        "failure not logged:\n{}",
        after_fail.join("\n")
    );
    net.run("DEL", &conf, CID, &pod, "eth0")
        .assert_success_silent();
    assert!(has(
        &lines(&file),
        &[
            "plugin=bridge",
            "cmd=DEL",
            "container=cnibb-logged",
            "msg=ok"
        ]
    ));
    net.assert_nothing_left("after DEL");
}

#[test]
fn error_level_keeps_only_failures_and_the_environment_wins() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let logs = TempDir::new("cnibb-log");
    let config_file = logs.path().join("from-config.log");
    let env_file = logs.path().join("from-env.log");
    let conf = net.conf(
        "1.0.0",
        &[V4],
        &json!({"log": {"file": config_file, "level": "debug"}}),
    );
    let pod = net.pod();
    net.plugin("ADD", &conf)
        .attachment(CID, &pod, "eth0")
        .env("CNI_RS_LOG_FILE", env_file.to_str().expect("utf-8 path"))
        .env("CNI_RS_LOG_LEVEL", "error")
        .run()
        .assert_success();
    assert!(!config_file.exists(), "the environment's file wins");
    assert_eq!(
        lines(&env_file),
        Vec::<String>::new(),
        "a success is not an error"
    );
    let out = net
        .plugin("ADD", &conf)
        .attachment(CID, &pod, "eth0")
        .env("CNI_RS_LOG_FILE", env_file.to_str().expect("utf-8 path"))
        .env("CNI_RS_LOG_LEVEL", "error")
        .run();
    out.assert_failure();
    let logged = lines(&env_file);
    assert!(
        logged.iter().all(|l| l.contains("level=error")) && !logged.is_empty(),
        "{logged:?}"
    );
    net.plugin("DEL", &conf)
        .attachment(CID, &pod, "eth0")
        .env("CNI_RS_LOG_FILE", env_file.to_str().expect("utf-8 path"))
        .run()
        .assert_success_silent();
    assert!(!config_file.exists(), "the environment's file wins");
    let no_log = net.conf("1.0.0", &[V4], &json!({}));
    net.run("ADD", &no_log, CID, &pod, "eth0").assert_success();
    net.run("DEL", &no_log, CID, &pod, "eth0")
        .assert_success_silent();
    assert_eq!(
        std::fs::read_dir(logs.path())
            .map(Iterator::count)
            .unwrap_or(0),
        1
    );
}

/// GC sent with no valid-attachments list at all (as some tools send it) releases every
/// attachment of the network, and the operator's log says so, for the bridge and for its
/// IPAM delegate.
#[test]
fn gc_without_a_valid_list_says_it_releases_everything() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let logs = TempDir::new("cnibb-log");
    let file = logs.path().join("cni.log");
    let conf = net.conf("1.1.0", &[V4], &json!({"log": {"file": file}}));
    let pod = net.pod();
    net.run("ADD", &conf, CID, &pod, "eth0").assert_success();
    net.plugin("GC", &conf).run().assert_success();
    assert!(net.reservations().is_empty(), "{:?}", net.reservations());
    let logged = lines(&file);
    for plugin in ["plugin=bridge", "plugin=host-local"] {
        assert!(
            logged.iter().any(|l| l.contains(plugin)
                && l.contains("cmd=GC")
                && l.contains(&format!("releasing everything on network {}", net.name))),
            "no {plugin} line saying so:\n{}",
            logged.join("\n")
        );
    }
}
