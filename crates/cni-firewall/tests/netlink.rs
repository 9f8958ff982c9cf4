//! Root tests of the netlink (nf_tables) side against `nft` itself: the
//! masquerade table and the MAC spoof check must come out byte-identical to
//! what the `nft` scripts/batches they replaced produce, `nft` and our code
//! must read and delete each other's rules, and the iptables-nft probe must
//! decide DEL's iptables work correctly.
//!
//! Every test runs on a thread that first moves into a fresh network
//! namespace; the tools we spawn inherit that thread's namespace, so nothing
//! here touches the machine's own rules.

use cni_firewall::{Backend, macspoof, masq};
use ipnetwork::IpNetwork;

mod common;
use common::{feed, in_netns, ips, nat_rules, privileged, ruleset, sh};

const MAC_A: &str = "02:42:ac:11:00:02";

// ---- nftables over netlink against `nft` itself ----

const MASQ_TABLE: &str = "inet cni_plugins_masquerade";

/// The script the nftables backend used to feed to `nft -f -` (and that the
/// reference's nftables backend generates) for one setup: the ground truth
/// our netlink transactions must reproduce.
fn nft_setup_script(stale: &[u64], addrs: &[IpNetwork], comment: &str) -> String {
    let t = MASQ_TABLE;
    let mut s = format!(
        "add table {t} {{ comment \"Masquerading for plugins from github.com/containernetworking/plugins\" ; }}
add chain {t} masq_checks {{ comment \"Masquerade traffic from certain IPs to any (non-multicast) IP outside their subnet\" ; }}
add chain {t} postrouting {{ type nat hook postrouting priority srcnat ; }}
flush chain {t} postrouting
add rule {t} postrouting ip daddr == 224.0.0.0/4 return
add rule {t} postrouting ip6 daddr == ff00::/8 return
add rule {t} postrouting goto masq_checks
"
    );
    for h in stale {
        s.push_str(&format!("delete rule {t} masq_checks handle {h}\n"));
    }
    for ip in addrs {
        let proto = if ip.is_ipv4() { "ip" } else { "ip6" };
        let net = IpNetwork::new(ip.network(), ip.prefix()).unwrap();
        s.push_str(&format!(
            "add rule {t} masq_checks {proto} saddr == {} {proto} daddr != {net} masquerade comment \"{comment}\"\n",
            ip.ip()
        ));
    }
    s
}

fn nft_stdin(script: &str) {
    feed("nft", &["-f", "-"], script);
}

/// Handles of `masq_checks` rules whose comment starts with `prefix`, read
/// with `nft -j`.
fn nft_handles(prefix: &str) -> Vec<u64> {
    let json = sh(
        "nft",
        &[
            "-j",
            "list",
            "chain",
            "inet",
            "cni_plugins_masquerade",
            "masq_checks",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i.get("rule"))
        .filter(|r| r["comment"].as_str().is_some_and(|c| c.starts_with(prefix)))
        .map(|r| r["handle"].as_u64().unwrap())
        .collect()
}

/// The same sequence of setups, once through `nft` scripts and once through
/// our netlink transactions, must leave byte-identical tables: text, text
/// with handles, and JSON.
#[test]
fn nftables_ruleset_is_identical_to_nft_scripts() {
    if !privileged() {
        return;
    }
    // Prefixes nft compiles differently: byte-aligned, not aligned, host
    // routes, /0, both families.
    let g = ips(&[
        "10.77.0.2/24",
        "fd00:77::2/64",
        "10.88.3.4/20",
        "10.99.0.5/32",
        "fd00:99::5/127",
        "fd00:aa::5/128",
        "10.1.2.3/0",
        "172.16.0.9/9",
    ]);
    let h = ips(&["10.77.0.3/24", "fd00:77::3/60"]);
    let g2 = ips(&["10.77.0.4/24"]);
    let steps: [(&str, &str, &[IpNetwork]); 3] = [
        ("eth1", "ctrG", &g),
        ("eth0", "ctrH", &h),
        ("eth1", "ctrG", &g2),
    ];
    let listings = || {
        [
            sh("nft", &["list", "table", "inet", "cni_plugins_masquerade"]),
            sh(
                "nft",
                &["-a", "list", "table", "inet", "cni_plugins_masquerade"],
            ),
            sh(
                "nft",
                &["-j", "list", "table", "inet", "cni_plugins_masquerade"],
            ),
        ]
    };
    let by_nft = in_netns(|| {
        let mut seen = Vec::new();
        for (ifname, cid, addrs) in steps {
            let comment = cni_firewall::naming::nft_comment("nftnet", ifname, cid);
            let prefix = cni_firewall::naming::nft_instance_hash("nftnet", ifname, cid);
            let stale = if ruleset().is_empty() {
                vec![]
            } else {
                nft_handles(&prefix)
            };
            nft_stdin(&nft_setup_script(&stale, addrs, &comment));
            seen.push(listings());
        }
        seen
    });
    let by_us = in_netns(|| {
        let mut seen = Vec::new();
        for (ifname, cid, addrs) in steps {
            masq::setup(Backend::Nftables, "nftnet", ifname, cid, addrs).unwrap();
            masq::check(Backend::Nftables, "nftnet", ifname, cid, addrs).unwrap();
            seen.push(listings());
        }
        seen
    });
    assert!(
        by_nft[0][0].contains("ip daddr != 10.88.0.0/20"),
        "{}",
        by_nft[0][0]
    );
    assert!(by_nft[2][1].contains("# handle 22"), "{}", by_nft[2][1]);
    // Handles differ by design: the scripts rewrite `postrouting` on every setup,
    // we leave it alone when it is already right (see masq::nftables::setup).
    for (step, (nft, ours)) in by_nft.iter().zip(&by_us).enumerate() {
        for (nft, ours) in nft.iter().zip(ours) {
            assert_eq!(
                without_handles(ours),
                without_handles(nft),
                "after step {step}"
            );
        }
    }
    let postrouting_handles = |listing: &str| -> Vec<String> {
        let chain = &listing[listing.find("chain postrouting").unwrap_or(0)..];
        chain
            .lines()
            .filter_map(|l| l.split("# handle ").nth(1).map(str::to_owned))
            .collect()
    };
    assert_eq!(
        postrouting_handles(&by_us[2][1]),
        postrouting_handles(&by_us[0][1]),
        "a setup rewrote a postrouting chain that was already right:\n{}",
        by_us[2][1]
    );
}

/// A listing (`nft -a` text or `nft -j` JSON) without its handle numbers.
fn without_handles(listing: &str) -> String {
    let mut out = String::with_capacity(listing.len());
    let mut rest = listing;
    while let Some(at) = ["# handle ", "\"handle\": "]
        .iter()
        .filter_map(|key| rest.find(key).map(|i| (i, key.len())))
        .min()
    {
        let (i, len) = at;
        out.push_str(&rest[..i + len]);
        rest = rest[i + len..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// Rules we add can be read and deleted by `nft`; rules `nft` added (the
/// reference's nftables backend goes through `nft`) are recognised by CHECK
/// and removed by our teardown and GC.
#[test]
fn nftables_interoperates_with_nft() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let a = ips(&["10.77.0.2/24", "fd00:77::2/64"]);
        masq::setup(Backend::Nftables, "nftnet", "eth0", "ctrA", &a).unwrap();
        let prefix_a = cni_firewall::naming::nft_instance_hash("nftnet", "eth0", "ctrA");
        let handles = nft_handles(&prefix_a);
        assert_eq!(handles.len(), 2);
        for h in handles {
            sh(
                "nft",
                &[
                    "delete",
                    "rule",
                    "inet",
                    "cni_plugins_masquerade",
                    "masq_checks",
                    "handle",
                    &h.to_string(),
                ],
            );
        }
        assert!(masq::check(Backend::Nftables, "nftnet", "eth0", "ctrA", &a).is_err());
        assert!(!ruleset().contains("masquerade comment"), "{}", ruleset());

        // Made by nft: checked, torn down, collected by us.
        let b = ips(&["10.77.0.5/24", "fd00:77::5/64"]);
        let c = ips(&["10.77.0.6/22"]);
        for (cid, addrs) in [("ctrB", &b), ("ctrC", &c)] {
            let comment = cni_firewall::naming::nft_comment("nftnet", "eth0", cid);
            nft_stdin(&nft_setup_script(&[], addrs, &comment));
        }
        masq::check(Backend::Nftables, "nftnet", "eth0", "ctrB", &b).unwrap();
        masq::check(Backend::Nftables, "nftnet", "eth0", "ctrC", &c).unwrap();
        masq::teardown("nftnet", "eth0", "ctrB").unwrap();
        assert!(!ruleset().contains("id: ctrB"), "{}", ruleset());
        masq::check(Backend::Nftables, "nftnet", "eth0", "ctrC", &c).unwrap();
        masq::gc::<&str, &str>("nftnet", &[]).unwrap();
        assert!(!ruleset().contains("masquerade comment"), "{}", ruleset());
    });
}

/// CHECK names exactly what is missing: one rule of an attachment, the
/// goto of the base chain, the whole table.
#[test]
fn nftables_check_names_missing_rules() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let err = masq::check(Backend::Nftables, "nftnet", "eth0", "ctrA", &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "nftables: table inet cni_plugins_masquerade not found in inet ruleset"
        );
        let a = ips(&["10.77.0.2/24", "fd00:77::2/64"]);
        masq::setup(Backend::Nftables, "nftnet", "eth0", "ctrA", &a).unwrap();
        let prefix = cni_firewall::naming::nft_instance_hash("nftnet", "eth0", "ctrA");
        let v6 = nft_handles(&prefix)[1].to_string();
        sh(
            "nft",
            &[
                "delete",
                "rule",
                "inet",
                "cni_plugins_masquerade",
                "masq_checks",
                "handle",
                &v6,
            ],
        );
        sh(
            "nft",
            &[
                "flush",
                "chain",
                "inet",
                "cni_plugins_masquerade",
                "postrouting",
            ],
        );
        let text = masq::check(Backend::Nftables, "nftnet", "eth0", "ctrA", &a)
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("nftables: goto masq_checks not found in table inet cni_plugins_masquerade chain postrouting"),
            "{text}"
        );
        assert!(
            text.contains("ip6 saddr == fd00:77::2 ip6 daddr != fd00:77::/64 masquerade"),
            "{text}"
        );
        assert!(!text.contains("10.77.0.2"), "{text}");
        // A setup repairs both.
        masq::setup(Backend::Nftables, "nftnet", "eth0", "ctrA", &a).unwrap();
        masq::check(Backend::Nftables, "nftnet", "eth0", "ctrA", &a).unwrap();
    });
}

/// Whether `iptables-save` and `ip6tables-save` are iptables-nft here.
fn iptables_is_nft() -> bool {
    ["iptables-save", "ip6tables-save"].iter().all(|tool| {
        ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .find_map(|dir| std::fs::canonicalize(format!("{dir}/{tool}")).ok())
            .is_some_and(|p| p.ends_with("xtables-nft-multi"))
    })
}

/// On iptables-nft, DEL asks nf_tables whether the container's chain exists
/// and runs the iptables tools only if it does; legacy iptables always runs
/// them.
#[test]
fn iptables_nft_probe_decides_teardown() {
    if !privileged() {
        return;
    }
    let nft = iptables_is_nft();
    in_netns(|| {
        // Fresh namespace: no nat table at all.
        assert_eq!(masq::iptables_teardown_needed("mynet", "ctrA"), !nft);
        masq::teardown("mynet", "eth0", "ctrA").unwrap();

        masq::setup(
            Backend::Iptables,
            "mynet",
            "eth0",
            "ctrA",
            &ips(&["10.77.0.2/24"]),
        )
        .unwrap();
        masq::setup(
            Backend::Iptables,
            "mynet",
            "eth0",
            "ctrB",
            &ips(&["fd00:77::3/64"]),
        )
        .unwrap();
        assert!(masq::iptables_teardown_needed("mynet", "ctrA"));
        // Only in ip6 nat.
        assert!(masq::iptables_teardown_needed("mynet", "ctrB"));
        // The nat tables exist, the chain does not.
        assert_eq!(masq::iptables_teardown_needed("mynet", "ctrZ"), !nft);

        masq::teardown("mynet", "eth0", "ctrA").unwrap();
        assert_eq!(masq::iptables_teardown_needed("mynet", "ctrA"), !nft);
        assert!(nat_rules("iptables-save").is_empty());
        assert!(masq::iptables_teardown_needed("mynet", "ctrB"));
        masq::teardown("mynet", "eth0", "ctrB").unwrap();
        assert!(nat_rules("ip6tables-save").is_empty());
        assert_eq!(masq::iptables_teardown_needed("mynet", "ctrB"), !nft);

        // GC with nothing of ours left is a no-op either way.
        masq::gc::<&str, &str>("mynet", &[]).unwrap();
    });
}

/// Setups and teardowns of many attachments at once, each on its own
/// socket, leave exactly the survivors' rules and one base chain.
#[test]
fn nftables_concurrent_setup_and_teardown() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let addrs = |i: usize| {
            ips(&[
                &format!("10.77.1.{}/24", 10 + i),
                &format!("fd00:78::{}/64", 10 + i),
            ])
        };
        std::thread::scope(|s| {
            for i in 0..16 {
                s.spawn(move || {
                    let cid = format!("ctr{i}");
                    masq::setup(Backend::Nftables, "nftnet", "eth0", &cid, &addrs(i)).unwrap();
                    // Re-setup (replaces by handle) races with others' setups.
                    masq::setup(Backend::Nftables, "nftnet", "eth0", &cid, &addrs(i)).unwrap();
                    if i % 2 == 1 {
                        masq::teardown("nftnet", "eth0", &cid).unwrap();
                    }
                });
            }
        });
        for i in 0..16 {
            let result = masq::check(
                Backend::Nftables,
                "nftnet",
                "eth0",
                &format!("ctr{i}"),
                &addrs(i),
            );
            assert_eq!(result.is_ok(), i % 2 == 0, "ctr{i}: {result:?}");
        }
        let rs = ruleset();
        assert_eq!(rs.matches("masquerade comment").count(), 16, "{rs}");
        assert_eq!(rs.matches("goto masq_checks").count(), 1, "{rs}");
        assert_eq!(rs.matches("return").count(), 2, "{rs}");
    });
}

/// The nft JSON batch the spoof check used to apply with `nft -j -f -`.
fn macspoof_nft_batch(cid: &str, ifname: &str, veth: &str, mac: &str, stale: &[u64]) -> String {
    use serde_json::json;
    let iface = format!("cni-br-iface-{cid}-{ifname}");
    let mac_chain = format!("{iface}-mac");
    let comment = format!("macspoofchk-{cid}-{ifname}");
    let chain = |name: &str| json!({"family": "bridge", "table": "nat", "name": name});
    let rule = |chain: &str, expr: serde_json::Value| json!({"add": {"rule": {"family": "bridge", "table": "nat", "chain": chain, "expr": expr, "comment": comment}}});
    let mut cmds = vec![
        json!({"add": {"table": {"family": "bridge", "name": "nat"}}}),
        json!({"add": {"chain": {"family": "bridge", "table": "nat", "name": "PREROUTING",
            "type": "filter", "hook": "prerouting", "prio": -300, "policy": "accept"}}}),
        json!({"add": {"chain": chain(&iface)}}),
        json!({"add": {"chain": chain(&mac_chain)}}),
        json!({"flush": {"chain": chain(&iface)}}),
        json!({"flush": {"chain": chain(&mac_chain)}}),
    ];
    for h in stale {
        cmds.push(json!({"delete": {"rule": {"family": "bridge", "table": "nat", "chain": "PREROUTING", "handle": h}}}));
    }
    cmds.extend([
        rule("PREROUTING", json!([
            {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": veth}},
            {"jump": {"target": iface}}])),
        rule(&iface, json!([{"jump": {"target": mac_chain}}])),
        rule(&mac_chain, json!([
            {"match": {"op": "==", "left": {"payload": {"protocol": "ether", "field": "saddr"}}, "right": mac}},
            {"return": null}])),
        rule(&mac_chain, json!([{"drop": null}])),
    ]);
    json!({"nftables": cmds}).to_string()
}

fn nft_json_stdin(batch: &str) {
    feed("nft", &["-j", "-f", "-"], batch);
}

/// The spoof check through netlink leaves the same `bridge nat` table as
/// the nft JSON batches it replaced, and tears down what nft made.
#[test]
fn macspoof_table_is_identical_to_nft_batches() {
    if !privileged() {
        return;
    }
    let steps = [
        ("ctrA", "eth0", "veth1234", MAC_A),
        ("ctrB", "eth1", "vethb", "02:42:ac:11:00:03"),
        ("ctrA", "eth0", "veth1234", "02:42:ac:11:00:04"),
    ];
    let listings = || {
        [
            sh("nft", &["list", "table", "bridge", "nat"]),
            sh("nft", &["-a", "list", "table", "bridge", "nat"]),
            sh("nft", &["-j", "list", "table", "bridge", "nat"]),
        ]
    };
    let by_nft = in_netns(|| {
        let mut seen = Vec::new();
        for (cid, ifname, veth, mac) in steps {
            let comment = format!("macspoofchk-{cid}-{ifname}");
            let stale: Vec<u64> = if ruleset().is_empty() {
                vec![]
            } else {
                let json = sh(
                    "nft",
                    &["-j", "list", "chain", "bridge", "nat", "PREROUTING"],
                );
                let v: serde_json::Value = serde_json::from_str(&json).unwrap();
                v["nftables"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|i| i.get("rule"))
                    .filter(|r| r["comment"].as_str() == Some(comment.as_str()))
                    .map(|r| r["handle"].as_u64().unwrap())
                    .collect()
            };
            nft_json_stdin(&macspoof_nft_batch(cid, ifname, veth, mac, &stale));
            seen.push(listings());
        }
        // What nft made, we check and remove.
        macspoof::check("ctrB", "eth1", "vethb", "02:42:ac:11:00:03").unwrap();
        macspoof::teardown("ctrB", "eth1").unwrap();
        assert!(!ruleset().contains("ctrB"), "{}", ruleset());
        macspoof::gc::<&str, &str>(&[]).unwrap();
        assert!(!ruleset().contains("cni-br-iface"), "{}", ruleset());
        seen
    });
    let by_us = in_netns(|| {
        let mut seen = Vec::new();
        for (cid, ifname, veth, mac) in steps {
            macspoof::setup(cid, ifname, veth, mac).unwrap();
            seen.push(listings());
        }
        seen
    });
    for (step, (nft, ours)) in by_nft.iter().zip(&by_us).enumerate() {
        for (nft, ours) in nft.iter().zip(ours) {
            assert_eq!(ours, nft, "after step {step}");
        }
    }
}

/// A refused change names the object in nft syntax, and nothing of the
/// transaction lands (all or nothing).
#[test]
fn nftables_refused_transaction_names_the_object_and_changes_nothing() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        // Someone else's chain of the same name with another hook.
        nft_stdin(
            "add table inet cni_plugins_masquerade\n\
             add chain inet cni_plugins_masquerade postrouting { type filter hook input priority 0 ; }\n",
        );
        let before = ruleset();
        let err = masq::setup(
            Backend::Nftables,
            "nftnet",
            "eth0",
            "ctrA",
            &ips(&["10.77.0.2/24"]),
        )
        .unwrap_err()
        .to_string();
        eprintln!("refused as: {err}");
        assert!(
            err.starts_with("nftables: add chain inet cni_plugins_masquerade postrouting failed: "),
            "{err}"
        );
        assert_eq!(ruleset(), before);
        assert!(masq::check(Backend::Nftables, "nftnet", "eth0", "ctrA", &[]).is_err());
    });
}
