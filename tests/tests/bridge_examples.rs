//! The example configs in `conf/bridge-*` work as shipped: each one (the bridge entry of a
//! conflist) goes through ADD, CHECK, STATUS and DEL in a throwaway host netns, with only
//! the bridge name and the IPAM `dataDir` replaced so that nothing of the machine's is
//! used, and the keys it shows off are visible in the kernel.

mod bridge_support;

use bridge_support::{Net, bridge_port, has_link, mtu_of, vlan_filtering_supported};
use cni_blackbox::{check_cases, kernel, require_root, workspace_root};
use serde_json::{Value, json};

/// `conf/bridge-*` file names, sorted.
fn example_files() -> Vec<String> {
    let dir = workspace_root().join("conf");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("bridge-"))
        .collect();
    files.sort();
    files
}

/// The bridge config of a file: a plain config, or a conflist's bridge entry with the
/// list's `cniVersion` and `name`, as libcni hands it to the plugin.
fn bridge_config(file: &str) -> Value {
    let path = workspace_root().join("conf").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
    let Some(plugins) = value.get("plugins").and_then(Value::as_array) else {
        return value;
    };
    let mut entry = plugins
        .iter()
        .find(|p| p["type"] == "bridge")
        .unwrap_or_else(|| panic!("{file}: no bridge entry"))
        .clone();
    entry["cniVersion"] = value["cniVersion"].clone();
    entry["name"] = value["name"].clone();
    entry
}

#[test]
fn there_are_bridge_examples() {
    let files = example_files();
    for expected in [
        "bridge-dualstack.conflist",
        "bridge-l2.json",
        "bridge-nftables.json",
        "bridge-vlan.json",
    ] {
        assert!(
            files.iter().any(|f| f == expected),
            "{expected} missing: {files:?}"
        );
    }
}

#[test]
fn every_bridge_example_adds_checks_and_deletes() {
    if !require_root() {
        return;
    }
    let vlan_supported = vlan_filtering_supported();
    check_cases(&example_files(), |file| {
        let net = Net::new();
        let pod = net.pod();
        let mut conf = bridge_config(file);
        assert_eq!(conf["type"], "bridge", "{file}");
        conf["bridge"] = json!(net.bridge);
        let layer3 = conf["ipam"].get("type").is_some();
        if layer3 {
            conf["ipam"]["dataDir"] = json!(net.data.path_str());
        }
        let name = conf["name"].as_str().unwrap_or_default().to_owned();
        let uses_vlans = conf.get("vlan").is_some() || conf.get("vlanTrunk").is_some();

        let add = net.run("ADD", &conf, "cnibb-ctr", &pod, "eth0");
        if uses_vlans && !vlan_supported {
            // This kernel has no bridge VLAN filtering: a clear refusal, nothing made.
            add.assert_failure();
            assert!(
                add.error_msg()
                    .is_some_and(|m| m.contains("VLAN filtering")),
                "{file}: {add}"
            );
            assert!(!has_link(&pod, "eth0"));
            assert!(net.host_veths().is_empty());
            return;
        }
        add.assert_success();
        let result = add.json();
        assert_eq!(result["cniVersion"], conf["cniVersion"], "{file}");
        assert!(kernel::link_is_up(&pod, "eth0"), "{file}");
        let veth = result["interfaces"][1]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let port = bridge_port(&net.host, &veth);
        assert_eq!(port["master"], json!(net.bridge), "{file}");

        // What each example is about.
        if let Some(mtu) = conf.get("mtu").and_then(Value::as_u64) {
            assert_eq!(mtu_of(&pod, "eth0"), mtu, "{file}");
            assert_eq!(mtu_of(&net.host, &net.bridge), mtu, "{file}");
        }
        for (key, field) in [("hairpinMode", "hairpin"), ("portIsolation", "isolated")] {
            let wanted = conf.get(key).and_then(Value::as_bool).unwrap_or(false);
            assert_eq!(port[field], json!(wanted), "{file}: {key}");
        }
        let rules = format!(
            "{}{}",
            net.host.exec_ok(&["iptables-save"]),
            net.host.exec_ok(&["nft", "list", "ruleset"])
        );
        if conf["ipMasq"] == true {
            let needle = if conf["ipMasqBackend"] == "nftables" {
                format!("net: {name}, if: eth0, id: cnibb-ctr")
            } else {
                format!(r#"name: \"{name}\" id: \"cnibb-ctr\""#)
            };
            assert!(
                rules.contains(&needle),
                "{file}: no masquerade rule:\n{rules}"
            );
        }
        if conf["macspoofchk"] == true {
            assert!(
                rules.contains("macspoofchk-cnibb-ctr-eth0"),
                "{file}:\n{rules}"
            );
        }
        if let Some(dns) = conf.get("dns") {
            assert_eq!(&result["dns"], dns, "{file}");
        }

        let mut check = conf.clone();
        check["prevResult"] = result;
        net.run("CHECK", &check, "cnibb-ctr", &pod, "eth0")
            .assert_success_silent();
        if conf["cniVersion"] == "1.1.0" {
            net.plugin("STATUS", &conf).run().assert_success_silent();
        }
        net.run("DEL", &conf, "cnibb-ctr", &pod, "eth0")
            .assert_success_silent();
        net.assert_nothing_left(file);
        assert!(!has_link(&pod, "eth0"));
    });
}
