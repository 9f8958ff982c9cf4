//! Bad input never crashes the bridge plugin: configs with values of the wrong JSON type
//! and malformed or hostile IPAM results each get a whole CNI error JSON (in the config's
//! version, with the offending key or value named) and leave nothing behind: no veth, no
//! pod interface, no reservation, no rule, and the IPAM plugin's DEL has run.

mod bridge_support;

use bridge_support::{Net, has_link};
use cni_blackbox::{TempDir, bin_dir, check_cases, require_root};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt as _;

const V4: &str = "10.79.0.0/24";
const CID: &str = "cnibb-hostile";

#[test]
fn config_values_of_the_wrong_type_are_refused_by_name_and_leave_nothing() {
    if !require_root() {
        return;
    }
    // (extra keys over a dual-purpose config, expected code, text the message must hold)
    let cases: Vec<(Value, u64, &str)> = vec![
        (json!({"cniVersion": 1}), 6, ".cniVersion of type string"),
        (json!({"name": ["x"]}), 6, ".name of type string"),
        (
            json!({"isGateway": "yes"}),
            6,
            "isGateway: invalid type: string",
        ),
        (json!({"ipMasq": 1}), 6, "ipMasq: invalid type: integer"),
        (json!({"mtu": "1500"}), 6, "mtu: invalid type: string"),
        (
            json!({"vlanTrunk": {"id": 1}}),
            6,
            "vlanTrunk: invalid type: map",
        ),
        (json!({"bridge": 5}), 6, "bridge: invalid type: integer"),
        (
            json!({"dns": {"nameservers": "10.0.0.1"}}),
            6,
            ".dns.nameservers",
        ),
        (
            json!({"runtimeConfig": {"mac": 7}}),
            6,
            "runtimeConfig.mac: invalid type",
        ),
        (json!({"mtu": 1_u64 << 40}), 7, "1099511627776"),
        // Decoded by host-local, after the veth exists: the ADD is undone.
        (
            json!({"ipam": {"type": "host-local", "ranges": "10.79.0.0/24"}}),
            6,
            "ipam.ranges: invalid type: string",
        ),
        (
            json!({"ipam": {"type": "host-local", "ranges": [[{"subnet": 24}]]}}),
            6,
            "ipam.ranges[0][0].subnet: invalid type: integer",
        ),
    ];
    check_cases(&cases, |(extra, code, text)| {
        let net = Net::new();
        let pod = net.pod();
        let mut conf = net.conf("1.0.0", &[V4], &json!({"isGateway": true}));
        if let Some(ipam) = extra.get("ipam") {
            let mut ipam = ipam.clone();
            ipam["dataDir"] = json!(net.data.path_str());
            conf["ipam"] = ipam;
        }
        for (key, value) in extra.as_object().expect("object") {
            if key != "ipam" {
                conf[key] = value.clone();
            }
        }
        let out = net.run("ADD", &conf, CID, &pod, "eth0");
        out.assert_failure();
        assert_eq!(out.error_code(), Some(*code), "{extra}:\n{out}");
        let msg = out.error_msg().unwrap_or_default();
        assert!(msg.contains(text), "{extra}: {msg:?} lacks {text:?}");
        assert!(!has_link(&pod, "eth0"), "{extra}: pod interface left");
        net.assert_nothing_left(&format!("after refused {extra}"));
    });
}

/// A fake IPAM plugin that prints `result` on ADD and records every command it gets.
struct FakeIpam {
    dir: TempDir,
}

impl FakeIpam {
    fn new(result: &str) -> Self {
        let dir = TempDir::new("cnibb-fakeipam");
        let log = dir.path().join("calls");
        let script = format!(
            "#!/bin/sh\necho \"$CNI_COMMAND\" >> '{}'\nif [ \"$CNI_COMMAND\" = ADD ]; then\ncat <<'EOF'\n{result}\nEOF\nfi\n",
            log.display()
        );
        let path = dir.path().join("fakeipam");
        std::fs::write(&path, script).expect("write fake IPAM");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("chmod fake IPAM");
        Self { dir }
    }

    /// `CNI_PATH`: the fake first, then our plugins.
    fn cni_path(&self) -> String {
        format!("{}:{}", self.dir.path_str(), bin_dir().display())
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[test]
fn malformed_ipam_results_are_errors_and_the_add_is_undone() {
    if !require_root() {
        return;
    }
    let cases: Vec<(&str, &str)> = vec![
        (
            r#"{"cniVersion": "1.0.0", "ips": [{"address": "fd00:79::2/64", "gateway": "10.79.0.1"}]}"#,
            "gateway 10.79.0.1 is not of the family of address fd00:79::2/64",
        ),
        (
            r#"{"cniVersion": "1.0.0", "ips": [{"address": "10.79.0.2/24", "gateway": "fd00:79::1"}]}"#,
            "gateway fd00:79::1 is not of the family of address 10.79.0.2/24",
        ),
        (r#"{"cniVersion": "1.0.0", "ips": "10.79.0.2/24"}"#, "ips"),
        (
            r#"{"cniVersion": "1.0.0", "ips": [{"address": "10.79.0.2/40"}]}"#,
            "10.79.0.2/40",
        ),
        (
            r#"{"cniVersion": "1.0.0", "ips": [{"address": "10.79.0.2/24", "interface": -1}]}"#,
            "interface",
        ),
        (
            r#"{"cniVersion": "1.0.0", "ips": [{"address": "10.79.0.2/24"}], "routes": [{"dst": "nowhere"}]}"#,
            "nowhere",
        ),
        (r#"{"cniVersion": "1.0.0", "ips": []}"#, "missing IP config"),
        ("not json at all", "failed to parse result of fakeipam"),
        ("", ""),
    ];
    check_cases(&cases, |(result, text)| {
        let net = Net::new();
        let pod = net.pod();
        let fake = FakeIpam::new(result);
        let mut conf = net.conf("0.4.0", &[V4], &json!({"isGateway": true}));
        conf["ipam"] = json!({"type": "fakeipam"});
        let out = net
            .plugin("ADD", &conf)
            .attachment(CID, &pod, "eth0")
            .cni_path(&fake.cni_path())
            .run();
        out.assert_failure();
        let error = out.json();
        assert_eq!(error["cniVersion"], "0.4.0", "{result}:\n{out}");
        assert!(error["code"].is_u64(), "{result}:\n{out}");
        let msg = out.error_msg().unwrap_or_default();
        assert!(msg.contains(text), "{result}: {msg:?} lacks {text:?}");
        assert!(!has_link(&pod, "eth0"), "{result}: pod interface left");
        net.assert_nothing_left(&format!("after IPAM result {result}"));
        assert_eq!(
            fake.calls(),
            ["ADD", "DEL"],
            "{result}: the IPAM plugin's reservation must be released"
        );
    });
}
