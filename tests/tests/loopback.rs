//! The loopback plugin as a black box: ADD brings `lo` up in the pod and
//! prints the result in the shape of the requested version, DEL brings it down and
//! succeeds whatever is left of the pod, CHECK reports a down `lo`, STATUS and GC succeed.
//!
//! Each test runs the plugin inside its own "host" namespace against its own pod
//! namespace, and checks that only the pod's `lo` changed.

use cni_blackbox::json::{go_pretty, sorted};
use cni_blackbox::{ALL_VERSIONS, Netns, Outcome, Plugin, check_cases, kernel, require_root};
use serde_json::{Value, json};

const PLUGIN: &str = "loopback";
const NETWORK: &str = "cnibb-lo";
const CONTAINER: &str = "cnibb-ctr";

/// `{"cniVersion": v, "name", "type"}`; `None` leaves `cniVersion` out (meaning 0.1.0).
fn conf(version: Option<&str>) -> Value {
    let mut conf = json!({"name": NETWORK, "type": PLUGIN});
    if let Some(v) = version {
        conf["cniVersion"] = json!(v);
    }
    conf
}

struct Setup {
    host: Netns,
    pod: Netns,
}

impl Setup {
    fn new() -> Self {
        Self {
            host: Netns::new("cnibb-lo-host"),
            pod: Netns::new("cnibb-lo-pod"),
        }
    }

    /// `command` for the pod's attachment with `config` on stdin. The ifname is `eth0`, as
    /// a runtime would send: loopback must ignore it and work on `lo`.
    fn run(&self, command: &str, config: &Value) -> Outcome {
        Plugin::new(PLUGIN, &self.host)
            .command(command)
            .attachment(CONTAINER, &self.pod, "eth0")
            .config(config)
            .run()
    }

    fn add(&self, version: Option<&str>) -> Outcome {
        self.run("ADD", &conf(version))
    }

    fn pod_lo_up(&self) -> bool {
        kernel::link_is_up(&self.pod, "lo")
    }

    /// The plugin runs in the host namespace and must never change its `lo`.
    fn assert_host_lo_down(&self, out: &Outcome) {
        assert!(
            !kernel::link_is_up(&self.host, "lo"),
            "plugin changed lo of its own (host) netns:\n{out}"
        );
    }
}

/// The ADD result for `version` in the key order the reference prints (struct order up to
/// 1.0.0, with `dns` always; sorted for 1.1.0, without an empty `dns`).
fn expected_add(version: Option<&str>, sandbox: &str) -> Value {
    match version.unwrap_or("0.1.0") {
        v @ ("0.1.0" | "0.2.0") => json!({
            "cniVersion": v,
            "ip4": {"ip": "127.0.0.1/8"},
            "ip6": {"ip": "::1/128"},
            "dns": {}
        }),
        v @ ("0.3.0" | "0.3.1" | "0.4.0") => json!({
            "cniVersion": v,
            "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": sandbox}],
            "ips": [
                {"version": "4", "interface": 0, "address": "127.0.0.1/8"},
                {"version": "6", "interface": 0, "address": "::1/128"}
            ],
            "dns": {}
        }),
        "1.0.0" => json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": sandbox}],
            "ips": [
                {"interface": 0, "address": "127.0.0.1/8"},
                {"interface": 0, "address": "::1/128"}
            ],
            "dns": {}
        }),
        v => json!({
            "cniVersion": v,
            "interfaces": [{"mac": "00:00:00:00:00:00", "name": "lo", "sandbox": sandbox}],
            "ips": [
                {"address": "127.0.0.1/8", "interface": 0},
                {"address": "::1/128", "interface": 0}
            ]
        }),
    }
}

/// Parsed JSON equal to `expected`, and the text exactly its Go rendering (key order,
/// 4-space indent, no trailing newline).
fn assert_result(out: &Outcome, expected: &Value) {
    out.assert_success();
    assert_eq!(&out.json(), expected, "result differs:\n{out}");
    assert_eq!(
        out.stdout,
        go_pretty(expected),
        "result text differs:\n{out}"
    );
}

#[test]
fn add_brings_lo_up_and_prints_the_versions_shape() {
    if !require_root() {
        return;
    }
    let mut versions: Vec<Option<&str>> = ALL_VERSIONS.iter().copied().map(Some).collect();
    versions.push(None);
    check_cases(&versions, |version| {
        let setup = Setup::new();
        assert!(!setup.pod_lo_up(), "a new netns starts with lo down");
        let out = setup.add(*version);
        assert_result(&out, &expected_add(*version, setup.pod.path_str()));
        assert!(setup.pod_lo_up(), "pod lo is not up after ADD:\n{out}");
        setup.assert_host_lo_down(&out);
    });
}

/// Literal reference text, one per result family, so the renderer used above is itself
/// held to what Go prints.
#[test]
fn add_result_text_is_byte_for_byte_the_reference_layout() {
    if !require_root() {
        return;
    }
    const V020: &str = r#"{
    "cniVersion": "0.2.0",
    "ip4": {
        "ip": "127.0.0.1/8"
    },
    "ip6": {
        "ip": "::1/128"
    },
    "dns": {}
}"#;
    const V040: &str = r#"{
    "cniVersion": "0.4.0",
    "interfaces": [
        {
            "name": "lo",
            "mac": "00:00:00:00:00:00",
            "sandbox": "@SANDBOX@"
        }
    ],
    "ips": [
        {
            "version": "4",
            "interface": 0,
            "address": "127.0.0.1/8"
        },
        {
            "version": "6",
            "interface": 0,
            "address": "::1/128"
        }
    ],
    "dns": {}
}"#;
    const V110: &str = r#"{
    "cniVersion": "1.1.0",
    "interfaces": [
        {
            "mac": "00:00:00:00:00:00",
            "name": "lo",
            "sandbox": "@SANDBOX@"
        }
    ],
    "ips": [
        {
            "address": "127.0.0.1/8",
            "interface": 0
        },
        {
            "address": "::1/128",
            "interface": 0
        }
    ]
}"#;
    check_cases(
        &[("0.2.0", V020), ("0.4.0", V040), ("1.1.0", V110)],
        |(version, text)| {
            let setup = Setup::new();
            let out = setup.add(Some(version));
            out.assert_success();
            assert_eq!(
                out.stdout,
                text.replace("@SANDBOX@", setup.pod.path_str()),
                "{out}"
            );
        },
    );
}

#[test]
fn add_ignores_config_keys_it_does_not_know() {
    if !require_root() {
        return;
    }
    let setup = Setup::new();
    // What libcni may pass along: capabilities, runtimeConfig, args, dns, reserved keys.
    let config = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": PLUGIN,
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": []},
        "args": {"cni": {"labels": [{"key": "k", "value": "v"}]}},
        "dns": {"nameservers": ["10.0.0.1"]},
        "cni.dev/something": [1, 2],
        "ipMasq": true
    });
    let out = setup.run("ADD", &config);
    assert_result(&out, &expected_add(Some("1.0.0"), setup.pod.path_str()));
    assert!(setup.pod_lo_up());
}

#[test]
fn add_with_prev_result_returns_it_unchanged_in_the_config_version() {
    if !require_root() {
        return;
    }
    #[derive(Debug)]
    struct Case {
        label: &'static str,
        config_version: &'static str,
        prev: Value,
        /// Output, in the key order the reference prints it.
        expected: Value,
    }
    // A bridge-like 1.x result, keys deliberately out of order: 1.x output is sorted.
    let prev_1x = json!({
        "cniVersion": "1.1.0",
        "ips": [{"interface": 2, "gateway": "10.1.2.1", "address": "10.1.2.3/24"}],
        "interfaces": [
            {"name": "cnibr0", "mac": "02:00:00:00:00:01"},
            {"name": "veth1234", "mac": "02:00:00:00:00:02"},
            {"sandbox": "/var/run/netns/elsewhere", "name": "eth0", "mac": "02:00:00:00:00:03"}
        ],
        "routes": [{"gw": "10.1.2.1", "dst": "0.0.0.0/0"}],
        "dns": {"search": ["example.com"], "nameservers": ["10.1.2.1"]}
    });
    let mut prev_100 = prev_1x.clone();
    prev_100["cniVersion"] = json!("1.0.0");
    let mut expected_from_100 = sorted(&prev_1x);
    expected_from_100["cniVersion"] = json!("1.1.0");

    let prev_040 = json!({
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:03", "sandbox": "/var/run/netns/x"}],
        "ips": [{"version": "4", "interface": 0, "address": "10.1.2.3/24", "gateway": "10.1.2.1"}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.2.1"}],
        "dns": {"nameservers": ["10.1.2.1"], "search": ["example.com"]}
    });
    let mut prev_031_unversioned = prev_040.clone();
    prev_031_unversioned
        .as_object_mut()
        .map(|o| o.shift_remove("cniVersion"));
    let mut expected_031 = prev_040.clone();
    expected_031["cniVersion"] = json!("0.3.1");

    let prev_020 = json!({
        "cniVersion": "0.2.0",
        "ip4": {"ip": "10.1.2.3/24", "gateway": "10.1.2.1", "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.2.1"}]},
        "dns": {"nameservers": ["10.1.2.1"]}
    });

    let cases = [
        Case {
            label: "1.1.0 in 1.1.0",
            config_version: "1.1.0",
            expected: sorted(&prev_1x),
            prev: prev_1x,
        },
        Case {
            label: "1.0.0 in 1.1.0 (same family, restamped)",
            config_version: "1.1.0",
            prev: prev_100,
            expected: expected_from_100,
        },
        Case {
            label: "0.4.0 in 0.4.0",
            config_version: "0.4.0",
            expected: prev_040.clone(),
            prev: prev_040,
        },
        Case {
            label: "unversioned in 0.3.1 (taken as 0.3.1)",
            config_version: "0.3.1",
            prev: prev_031_unversioned,
            expected: expected_031,
        },
        Case {
            label: "0.2.0 in 0.2.0",
            config_version: "0.2.0",
            expected: prev_020.clone(),
            prev: prev_020,
        },
    ];
    check_cases(&cases, |case| {
        let setup = Setup::new();
        let mut config = conf(Some(case.config_version));
        config["prevResult"] = case.prev.clone();
        let out = setup.run("ADD", &config);
        assert_result(&out, &case.expected);
        // Passing the result through does not skip the work itself.
        assert!(
            setup.pod_lo_up(),
            "{}: pod lo is not up:\n{out}",
            case.label
        );
        setup.assert_host_lo_down(&out);
    });
}

#[test]
fn del_brings_lo_down_and_can_be_repeated() {
    if !require_root() {
        return;
    }
    check_cases(&ALL_VERSIONS, |version| {
        let setup = Setup::new();
        setup.add(Some(version)).assert_success();
        assert!(setup.pod_lo_up());
        for round in ["first", "second"] {
            let out = setup.run("DEL", &conf(Some(version)));
            out.assert_success_silent();
            assert!(!setup.pod_lo_up(), "{round} DEL left pod lo up:\n{out}");
            setup.assert_host_lo_down(&out);
        }
    });
}

#[test]
fn del_without_netns_succeeds_and_touches_nothing() {
    if !require_root() {
        return;
    }
    // Empty and unset CNI_NETNS: the runtime no longer knows the pod's netns.
    check_cases(&[Some(""), None], |netns| {
        let setup = Setup::new();
        setup.add(Some("1.0.0")).assert_success();
        // With the host's lo up, a plugin that fell back to its own netns would show.
        setup.host.exec_ok(&["ip", "link", "set", "lo", "up"]);
        let mut plugin = Plugin::new(PLUGIN, &setup.host)
            .command("DEL")
            .container_id(CONTAINER)
            .ifname("eth0")
            .config(&conf(Some("1.0.0")));
        if let Some(n) = netns {
            plugin = plugin.netns(n);
        }
        let out = plugin.run();
        out.assert_success_silent();
        assert!(
            kernel::link_is_up(&setup.host, "lo"),
            "DEL without CNI_NETNS took the host's lo down:\n{out}"
        );
        assert!(
            setup.pod_lo_up(),
            "DEL without CNI_NETNS cannot know the pod:\n{out}"
        );
    });
}

#[test]
fn del_after_the_netns_is_gone_succeeds() {
    if !require_root() {
        return;
    }
    let host = Netns::new("cnibb-lo-host");
    let pod = Netns::new("cnibb-lo-pod");
    let pod_path = pod.path_str().to_owned();
    let plugin = |command: &str| {
        Plugin::new(PLUGIN, &host)
            .command(command)
            .container_id(CONTAINER)
            .netns(&pod_path)
            .ifname("eth0")
            .config(&conf(Some("1.0.0")))
    };
    let added = plugin("ADD").run();
    added.assert_success();
    assert!(kernel::link_is_up(&pod, "lo"), "ADD did nothing:\n{added}");
    pod.delete();
    assert!(!std::path::Path::new(&pod_path).exists());
    plugin("DEL").run().assert_success_silent();
    // And again, as runtimes retry DEL.
    plugin("DEL").run().assert_success_silent();
}

#[test]
fn check_after_add_succeeds() {
    if !require_root() {
        return;
    }
    check_cases(&["0.4.0", "1.0.0", "1.1.0"], |version| {
        let setup = Setup::new();
        let added = setup.add(Some(version));
        added.assert_success();
        // A runtime sends the cached ADD result along with CHECK.
        let mut config = conf(Some(version));
        config["prevResult"] = added.json();
        let out = setup.run("CHECK", &config);
        out.assert_success_silent();
        assert!(setup.pod_lo_up());
    });
}

#[test]
fn check_reports_lo_down() {
    if !require_root() {
        return;
    }
    #[derive(Debug)]
    enum Before {
        AddThenDel,
        Nothing,
    }
    check_cases(&[Before::AddThenDel, Before::Nothing], |before| {
        let setup = Setup::new();
        if let Before::AddThenDel = before {
            setup.add(Some("1.0.0")).assert_success();
            setup
                .run("DEL", &conf(Some("1.0.0")))
                .assert_success_silent();
        }
        let out = setup.run("CHECK", &conf(Some("1.0.0")));
        out.assert_error(999, "loopback interface is down");
        assert!(!setup.pod_lo_up(), "CHECK must not repair:\n{out}");
    });
}

#[test]
fn status_and_gc_succeed_silently() {
    if !require_root() {
        return;
    }
    #[derive(Debug)]
    struct Case {
        command: &'static str,
        config: Value,
    }
    let base = conf(Some("1.1.0"));
    let mut gc_with_list = base.clone();
    gc_with_list["cni.dev/valid-attachments"] =
        json!([{"containerID": CONTAINER, "ifname": "eth0"}]);
    gc_with_list["cni.dev/attachments"] = gc_with_list["cni.dev/valid-attachments"].clone();
    let cases = [
        Case {
            command: "STATUS",
            config: base.clone(),
        },
        Case {
            command: "GC",
            config: base,
        },
        Case {
            command: "GC",
            config: gc_with_list,
        },
    ];
    check_cases(&cases, |case| {
        let setup = Setup::new();
        setup.add(Some("1.1.0")).assert_success();
        // GC and STATUS carry no attachment: only CNI_COMMAND and CNI_PATH.
        let out = Plugin::new(PLUGIN, &setup.host)
            .command(case.command)
            .config(&case.config)
            .run();
        out.assert_success_silent();
        assert!(
            setup.pod_lo_up(),
            "{} changed the pod:\n{out}",
            case.command
        );
        setup.assert_host_lo_down(&out);
    });
}

#[test]
fn add_into_a_missing_netns_fails_with_an_error_object() {
    if !require_root() {
        return;
    }
    let host = Netns::new("cnibb-lo-host");
    let missing = format!("/var/run/netns/{}", cni_blackbox::unique_name("cnibb-gone"));
    let out = Plugin::new(PLUGIN, &host)
        .command("ADD")
        .container_id(CONTAINER)
        .netns(&missing)
        .ifname("eth0")
        .config(&conf(Some("1.0.0")))
        .run();
    out.assert_failure();
    let error = out.json();
    assert!(error["code"].is_u64(), "no error code:\n{out}");
    assert!(
        error["msg"].as_str().is_some_and(|m| !m.is_empty()),
        "no error message:\n{out}"
    );
    assert!(!kernel::link_is_up(&host, "lo"), "{out}");
}
