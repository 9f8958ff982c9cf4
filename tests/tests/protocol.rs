//! The CNI protocol as every plugin binary must speak it: environment variables, command
//! dispatch, version gates, config validation and the error JSON (CNI spec, sections
//! "Execution Protocol" and "Error").
//!
//! All three plugins share one dispatcher; these tests drive it through `loopback`, the
//! plugin with the fewest side effects. Every call runs in a fresh "host" namespace with a
//! fresh pod namespace, and every rejected call is also checked for having done nothing:
//! the pod's `lo` (which loopback would bring up) must still be down.

use cni_blackbox::json::go_pretty;
use cni_blackbox::{Netns, Outcome, Plugin, check_cases, kernel, require_root};
use serde_json::{Value, json};

const PLUGIN: &str = "loopback";
const NETWORK: &str = "cnibb-net";
const SUPPORTED: &str = "0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0";

/// A minimal valid loopback config.
fn conf(version: &str) -> Value {
    json!({"cniVersion": version, "name": NETWORK, "type": PLUGIN})
}

/// Host + pod namespaces and a runner preset for a valid ADD into the pod.
struct Setup {
    host: Netns,
    pod: Netns,
}

impl Setup {
    fn new() -> Self {
        Self {
            host: Netns::new("cnibb-proto-host"),
            pod: Netns::new("cnibb-proto-pod"),
        }
    }

    /// Loopback with a complete, valid environment for `command` and a 1.0.0 config.
    fn plugin(&self, command: &str) -> Plugin<'_> {
        Plugin::new(PLUGIN, &self.host)
            .command(command)
            .attachment("cnibb-ctr", &self.pod, "eth0")
            .config(&conf("1.0.0"))
    }

    /// A rejected call must not have touched the pod (nor the host) namespace.
    fn assert_untouched(&self, out: &Outcome) {
        assert!(
            !kernel::link_is_up(&self.pod, "lo"),
            "pod lo came up although the call was rejected:\n{out}"
        );
        assert!(
            !kernel::link_is_up(&self.host, "lo"),
            "host lo came up although the call was rejected:\n{out}"
        );
    }
}

/// Error output is Go's `MarshalIndent` with 4 spaces and no trailing newline, like the
/// reference (whatever key order the implementation chose).
fn assert_go_layout(out: &Outcome) {
    assert_eq!(
        out.stdout,
        go_pretty(&out.json()),
        "error JSON is not 4-space indented without trailing newline:\n{out}"
    );
}

#[test]
fn version_prints_the_exact_reference_line() {
    if !require_root() {
        return;
    }
    #[derive(Debug)]
    struct Case {
        label: &'static str,
        env: &'static [(&'static str, &'static str)],
        stdin: &'static str,
    }
    let cases = [
        Case {
            label: "only CNI_COMMAND, no stdin",
            env: &[],
            stdin: "",
        },
        Case {
            // What libcni's version probe sends.
            label: "libcni probe",
            env: &[
                ("CNI_CONTAINERID", ""),
                ("CNI_NETNS", "dummy"),
                ("CNI_IFNAME", "dummy"),
                ("CNI_PATH", "dummy"),
                ("CNI_ARGS", ""),
            ],
            stdin: r#"{"cniVersion":"0.4.0"}"#,
        },
        Case {
            // The reference does not even read stdin for VERSION.
            label: "garbage stdin",
            env: &[],
            stdin: "this is not json",
        },
    ];
    check_cases(&cases, |case| {
        let host = Netns::new("cnibb-proto-host");
        let mut plugin = Plugin::new(PLUGIN, &host)
            .unset("CNI_PATH")
            .command("VERSION")
            .stdin(case.stdin);
        for (k, v) in case.env {
            plugin = plugin.env(k, v);
        }
        let out = plugin.run();
        out.assert_success();
        assert_eq!(
            out.stdout,
            "{\"cniVersion\":\"1.1.0\",\"supportedVersions\":\
             [\"0.1.0\",\"0.2.0\",\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}\n",
            "{}:\n{out}",
            case.label
        );
    });
}

#[test]
fn no_command_prints_about_text_on_stderr() {
    if !require_root() {
        return;
    }
    // Empty and unset CNI_COMMAND are the same to the reference (os.Getenv).
    check_cases(&[Some(""), None], |command| {
        let host = Netns::new("cnibb-proto-host");
        let mut plugin = Plugin::new(PLUGIN, &host).unset("CNI_PATH");
        if let Some(c) = command {
            plugin = plugin.command(c);
        }
        let out = plugin.run();
        out.assert_success();
        assert_eq!(out.stdout, "", "nothing on stdout:\n{out}");
        assert!(
            out.stderr
                .contains(&format!("CNI protocol versions supported: {SUPPORTED}\n")),
            "{out}"
        );
        // The about line: the reference's first words, then what we are and our commit.
        let about = out.stderr.lines().next().unwrap_or_default();
        let prefix = format!(
            "CNI {PLUGIN} plugin v{} (cni-plugins-rs, commit ",
            env!("CARGO_PKG_VERSION")
        );
        assert!(
            about.starts_with(&prefix) && about.ends_with("; not the Go reference plugins)"),
            "about line {about:?}, want {prefix:?}...\n{out}"
        );
    });
}

#[derive(Debug)]
struct EnvCase {
    label: &'static str,
    command: &'static str,
    /// Variables changed from the valid ADD environment; `None` unsets.
    env: &'static [(&'static str, Option<&'static str>)],
    code: u64,
    msg: &'static str,
    details: Option<&'static str>,
}

const UNSET_ALL: &[(&str, Option<&str>)] = &[
    ("CNI_CONTAINERID", None),
    ("CNI_NETNS", None),
    ("CNI_IFNAME", None),
    ("CNI_PATH", None),
];

#[test]
fn environment_errors_have_reference_codes_and_messages() {
    if !require_root() {
        return;
    }
    let cases = [
        EnvCase {
            label: "ADD with only CNI_COMMAND",
            command: "ADD",
            env: UNSET_ALL,
            code: 4,
            msg: "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing",
            details: None,
        },
        EnvCase {
            label: "CHECK with only CNI_COMMAND",
            command: "CHECK",
            env: UNSET_ALL,
            code: 4,
            msg: "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing",
            details: None,
        },
        EnvCase {
            // CNI_NETNS is optional for DEL.
            label: "DEL with only CNI_COMMAND",
            command: "DEL",
            env: UNSET_ALL,
            code: 4,
            msg: "required env variables [CNI_CONTAINERID,CNI_IFNAME,CNI_PATH] missing",
            details: None,
        },
        EnvCase {
            // Empty counts as missing.
            label: "ADD with empty CNI_IFNAME",
            command: "ADD",
            env: &[("CNI_IFNAME", Some(""))],
            code: 4,
            msg: "required env variables [CNI_IFNAME] missing",
            details: None,
        },
        EnvCase {
            label: "unknown command",
            command: "FOO",
            env: &[],
            code: 4,
            msg: "unknown CNI_COMMAND: FOO",
            details: None,
        },
        EnvCase {
            // Commands are case-sensitive.
            label: "lower-case command",
            command: "add",
            env: &[],
            code: 4,
            msg: "unknown CNI_COMMAND: add",
            details: None,
        },
        EnvCase {
            label: "container id with a space",
            command: "ADD",
            env: &[("CNI_CONTAINERID", Some("a b"))],
            code: 4,
            msg: "invalid characters in containerID",
            details: Some("a b"),
        },
        EnvCase {
            label: "container id starting with '-'",
            command: "ADD",
            env: &[("CNI_CONTAINERID", Some("-abc"))],
            code: 4,
            msg: "invalid characters in containerID",
            details: Some("-abc"),
        },
        EnvCase {
            label: "ifname of 16 bytes",
            command: "ADD",
            env: &[("CNI_IFNAME", Some("abcdefghijklmnop"))],
            code: 4,
            msg: "interface name is too long",
            details: Some("interface name should be less than 16 characters"),
        },
        EnvCase {
            label: "ifname with '/'",
            command: "ADD",
            env: &[("CNI_IFNAME", Some("a/b"))],
            code: 4,
            msg: "interface name contains / or : or whitespace characters",
            details: None,
        },
        EnvCase {
            label: "ifname with ':'",
            command: "ADD",
            env: &[("CNI_IFNAME", Some("eth:0"))],
            code: 4,
            msg: "interface name contains / or : or whitespace characters",
            details: None,
        },
        EnvCase {
            label: "ifname with a space",
            command: "ADD",
            env: &[("CNI_IFNAME", Some("eth 0"))],
            code: 4,
            msg: "interface name contains / or : or whitespace characters",
            details: None,
        },
        EnvCase {
            label: "ifname '..'",
            command: "ADD",
            env: &[("CNI_IFNAME", Some(".."))],
            code: 4,
            msg: "interface name is . or ..",
            details: None,
        },
        EnvCase {
            // DEL validates the ifname too.
            label: "DEL with ifname 'a/b'",
            command: "DEL",
            env: &[("CNI_IFNAME", Some("a/b"))],
            code: 4,
            msg: "interface name contains / or : or whitespace characters",
            details: None,
        },
    ];
    check_cases(&cases, |case| {
        let setup = Setup::new();
        let mut plugin = setup.plugin(case.command);
        for (k, v) in case.env {
            plugin = match v {
                Some(v) => plugin.env(k, v),
                None => plugin.unset(k),
            };
        }
        let out = plugin.run();
        let error = out.assert_error(case.code, case.msg);
        if let Some(details) = case.details {
            assert_eq!(error["details"], details, "{}:\n{out}", case.label);
        }
        assert_go_layout(&out);
        setup.assert_untouched(&out);
    });
}

#[test]
fn gc_and_status_require_only_cni_path() {
    if !require_root() {
        return;
    }
    check_cases(&["GC", "STATUS"], |command| {
        let host = Netns::new("cnibb-proto-host");
        let out = Plugin::new(PLUGIN, &host)
            .command(command)
            .unset("CNI_PATH")
            .config(&conf("1.1.0"))
            .run();
        out.assert_error(4, "required env variables [CNI_PATH] missing");
    });
}

#[derive(Debug)]
struct ConfigCase {
    label: &'static str,
    command: &'static str,
    stdin: &'static str,
    code: u64,
    /// Exact message, or its prefix when it ends in '…' (the decoder's own words follow).
    msg: &'static str,
    details: Option<&'static str>,
    /// The `cniVersion` the error JSON must carry, when the config's version is known.
    cni_version: Option<&'static str>,
}

#[test]
fn config_errors_have_reference_codes_and_messages() {
    if !require_root() {
        return;
    }
    let cases = [
        ConfigCase {
            label: "truncated JSON",
            command: "ADD",
            stdin: r#"{"cniVersion": "1.0.0", "name": "#,
            code: 6,
            msg: "error unmarshall network config…",
            details: None,
            cni_version: None,
        },
        ConfigCase {
            label: "empty stdin",
            command: "ADD",
            stdin: "",
            code: 6,
            msg: "error unmarshall network config…",
            details: None,
            cni_version: None,
        },
        ConfigCase {
            label: "not an object",
            command: "ADD",
            stdin: "[1, 2]",
            code: 6,
            msg: "error unmarshall network config…",
            details: None,
            cni_version: None,
        },
        ConfigCase {
            label: "no name",
            command: "ADD",
            stdin: r#"{"cniVersion": "1.0.0", "type": "loopback"}"#,
            code: 7,
            msg: "missing network name",
            details: None,
            cni_version: Some("1.0.0"),
        },
        ConfigCase {
            label: "empty name",
            command: "DEL",
            stdin: r#"{"cniVersion": "1.0.0", "name": "", "type": "loopback"}"#,
            code: 7,
            msg: "missing network name",
            details: None,
            cni_version: Some("1.0.0"),
        },
        ConfigCase {
            label: "name with '/'",
            command: "ADD",
            stdin: r#"{"cniVersion": "1.0.0", "name": "x/y", "type": "loopback"}"#,
            code: 7,
            msg: "invalid characters found in network name",
            details: Some("x/y"),
            cni_version: Some("1.0.0"),
        },
        ConfigCase {
            label: "unknown version on ADD",
            command: "ADD",
            stdin: r#"{"cniVersion": "0.5.0", "name": "n", "type": "loopback"}"#,
            code: 1,
            msg: "incompatible CNI versions",
            details: Some(
                r#"config is "0.5.0", plugin supports ["0.1.0" "0.2.0" "0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]"#,
            ),
            cni_version: Some("0.5.0"),
        },
        ConfigCase {
            label: "unknown version on DEL",
            command: "DEL",
            stdin: r#"{"cniVersion": "0.5.0", "name": "n", "type": "loopback"}"#,
            code: 1,
            msg: "incompatible CNI versions",
            details: Some(
                r#"config is "0.5.0", plugin supports ["0.1.0" "0.2.0" "0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]"#,
            ),
            cni_version: Some("0.5.0"),
        },
        ConfigCase {
            label: "CHECK at 0.3.1",
            command: "CHECK",
            stdin: r#"{"cniVersion": "0.3.1", "name": "n", "type": "loopback"}"#,
            code: 1,
            msg: "config version does not allow CHECK",
            details: None,
            cni_version: Some("0.3.1"),
        },
        ConfigCase {
            // A config without cniVersion is 0.1.0.
            label: "CHECK without cniVersion",
            command: "CHECK",
            stdin: r#"{"name": "n", "type": "loopback"}"#,
            code: 1,
            msg: "config version does not allow CHECK",
            details: None,
            cni_version: None,
        },
        ConfigCase {
            label: "GC at 1.0.0",
            command: "GC",
            stdin: r#"{"cniVersion": "1.0.0", "name": "n", "type": "loopback"}"#,
            code: 1,
            msg: "config version does not allow GC",
            details: None,
            cni_version: Some("1.0.0"),
        },
        ConfigCase {
            label: "STATUS at 1.0.0",
            command: "STATUS",
            stdin: r#"{"cniVersion": "1.0.0", "name": "n", "type": "loopback"}"#,
            code: 1,
            msg: "config version does not allow STATUS",
            details: None,
            cni_version: Some("1.0.0"),
        },
        ConfigCase {
            label: "GC at 0.4.0",
            command: "GC",
            stdin: r#"{"cniVersion": "0.4.0", "name": "n", "type": "loopback"}"#,
            code: 1,
            msg: "config version does not allow GC",
            details: None,
            cni_version: Some("0.4.0"),
        },
    ];
    check_cases(&cases, |case| {
        let setup = Setup::new();
        let mut plugin = setup.plugin(case.command).stdin(case.stdin);
        if matches!(case.command, "GC" | "STATUS") {
            // These take no attachment; send what a runtime sends.
            plugin = plugin
                .unset("CNI_CONTAINERID")
                .unset("CNI_NETNS")
                .unset("CNI_IFNAME");
        }
        let out = plugin.run();
        out.assert_failure();
        let error = out.json();
        assert_eq!(error["code"], case.code, "{}:\n{out}", case.label);
        let msg = error["msg"].as_str().unwrap_or_default();
        match case.msg.strip_suffix('…') {
            Some(prefix) => assert!(msg.starts_with(prefix), "{}:\n{out}", case.label),
            None => assert_eq!(msg, case.msg, "{}:\n{out}", case.label),
        }
        if let Some(details) = case.details {
            assert_eq!(error["details"], details, "{}:\n{out}", case.label);
        }
        if let Some(version) = case.cni_version {
            assert_eq!(error["cniVersion"], version, "{}:\n{out}", case.label);
        }
        assert_go_layout(&out);
        setup.assert_untouched(&out);
    });
}

#[test]
fn own_netns_is_rejected_before_doing_anything() {
    if !require_root() {
        return;
    }
    // `/var/run/netns/<host>` and `/proc/self/ns/net` both name the netns the plugin runs
    // in; the latter is the recycled-pid case of plugins#714.
    check_cases(&["host path", "/proc/self/ns/net"], |which| {
        let setup = Setup::new();
        let netns = match *which {
            "host path" => setup.host.path_str(),
            other => other,
        };
        let out = setup.plugin("ADD").netns(netns).run();
        // `assert_error` parses stdout as one JSON document: the reference's "result, then
        // error" output would fail here.
        out.assert_error(
            8,
            "plugin's netns and netns from CNI_NETNS should not be the same",
        );
        assert_go_layout(&out);
        setup.assert_untouched(&out);
    });
}

#[test]
fn netns_override_skips_the_own_netns_check() {
    if !require_root() {
        return;
    }
    #[derive(Debug)]
    struct Case {
        value: &'static str,
        overrides: bool,
    }
    let cases = [
        Case {
            value: "1",
            overrides: true,
        },
        Case {
            value: "true",
            overrides: true,
        },
        Case {
            value: "TRUE",
            overrides: true,
        },
        Case {
            value: "0",
            overrides: false,
        },
        Case {
            value: "false",
            overrides: false,
        },
    ];
    check_cases(&cases, |case| {
        let setup = Setup::new();
        let out = setup
            .plugin("ADD")
            .netns(setup.host.path_str())
            .env("CNI_NETNS_OVERRIDE", case.value)
            .run();
        if case.overrides {
            out.assert_success();
            assert!(
                kernel::link_is_up(&setup.host, "lo"),
                "with the check skipped, loopback works on its own netns:\n{out}"
            );
        } else {
            out.assert_error(
                8,
                "plugin's netns and netns from CNI_NETNS should not be the same",
            );
            setup.assert_untouched(&out);
        }
    });
}
