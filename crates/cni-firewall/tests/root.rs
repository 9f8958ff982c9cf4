//! Root tests against the real `iptables-restore` and `nft`.
//!
//! Every test runs on a thread that first moves into a fresh network
//! namespace; the tools we spawn inherit that thread's namespace, so nothing
//! here touches the machine's own rules. Verification reads the state back
//! with `iptables-save` and `nft list` from the same thread.

use std::process::Command;

use cni_firewall::{Backend, Error, macspoof, masq};
use ipnetwork::IpNetwork;
use nix::sched::{CloneFlags, unshare};

/// True when we may run; under `CI=true` a missing privilege is a failure.
fn privileged() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "root tests need root (CI=true forbids skipping)"
    );
    eprintln!("skipping: root tests need root");
    false
}

/// Runs `f` on a thread inside a private network namespace.
fn in_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The rule and user-chain lines of the nat table.
fn nat_rules(save: &str) -> Vec<String> {
    sh(save, &["-t", "nat"])
        .lines()
        .filter(|l| l.starts_with("-A") || l.starts_with(":CNI-"))
        .map(str::to_owned)
        .collect()
}

fn ruleset() -> String {
    sh("nft", &["list", "ruleset"])
}

fn ips(list: &[&str]) -> Vec<IpNetwork> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

const CHAIN_A: &str = "CNI-f55d1ff5e9696738bd206b7d";

#[test]
fn iptables_setup_check_teardown() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let addrs = ips(&["10.77.0.2/24", "fd00:77::2/64"]);
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrA", &addrs).unwrap();

        // Byte for byte what the reference bridge plugin leaves.
        let v4 = vec![
            format!(":{CHAIN_A} - [0:0]"),
            format!(
                r#"-A POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j {CHAIN_A}"#
            ),
            format!(
                r#"-A {CHAIN_A} -d 10.77.0.0/24 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j ACCEPT"#
            ),
            format!(
                r#"-A {CHAIN_A} ! -d 224.0.0.0/4 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j MASQUERADE"#
            ),
        ];
        let v6 = vec![
            format!(":{CHAIN_A} - [0:0]"),
            format!(
                r#"-A POSTROUTING -s fd00:77::2/128 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j {CHAIN_A}"#
            ),
            format!(
                r#"-A {CHAIN_A} -d fd00:77::/64 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j ACCEPT"#
            ),
            format!(
                r#"-A {CHAIN_A} ! -d ff00::/8 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j MASQUERADE"#
            ),
        ];
        assert_eq!(nat_rules("iptables-save"), v4);
        assert_eq!(nat_rules("ip6tables-save"), v6);

        // Idempotent.
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrA", &addrs).unwrap();
        assert_eq!(nat_rules("iptables-save"), v4);
        assert_eq!(nat_rules("ip6tables-save"), v6);

        masq::check(Backend::Iptables, "mynet", "eth0", "ctrA", &addrs).unwrap();

        masq::teardown("mynet", "eth0", "ctrA").unwrap();
        assert_eq!(nat_rules("iptables-save"), Vec::<String>::new());
        assert_eq!(nat_rules("ip6tables-save"), Vec::<String>::new());

        // Again, with nothing left.
        masq::teardown("mynet", "eth0", "ctrA").unwrap();

        let err = masq::check(Backend::Iptables, "mynet", "eth0", "ctrA", &addrs).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("iptables: -A POSTROUTING -s 10.77.0.2/32"),
            "{text}"
        );
        assert!(
            text.contains("ip6tables: -A POSTROUTING -s fd00:77::2/128"),
            "{text}"
        );
    });
}

#[test]
fn iptables_teardown_of_one_container_keeps_the_other() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let a = ips(&["10.77.0.2/24"]);
        let b = ips(&["10.77.0.3/24"]);
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrA", &a).unwrap();
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrB", &b).unwrap();
        masq::teardown("mynet", "eth0", "ctrA").unwrap();

        masq::check(Backend::Iptables, "mynet", "eth0", "ctrB", &b).unwrap();
        let err = masq::check(Backend::Iptables, "mynet", "eth0", "ctrA", &a).unwrap_err();
        assert!(matches!(err, Error::Multiple(_)), "{err}");
        let rules = nat_rules("iptables-save");
        assert_eq!(rules.len(), 4, "{rules:#?}");
        assert!(rules.iter().all(|r| !r.contains(CHAIN_A)), "{rules:#?}");
    });
}

#[test]
fn iptables_concurrent_setups_all_land() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        // Threads spawned here share this thread's namespace.
        std::thread::scope(|s| {
            for i in 0..8 {
                s.spawn(move || {
                    let addrs = ips(&[&format!("10.77.0.{}/24", 10 + i)]);
                    masq::setup(
                        Backend::Iptables,
                        "mynet",
                        "eth0",
                        &format!("ctr{i}"),
                        &addrs,
                    )
                    .unwrap();
                });
            }
        });
        for i in 0..8 {
            let addrs = ips(&[&format!("10.77.0.{}/24", 10 + i)]);
            masq::check(
                Backend::Iptables,
                "mynet",
                "eth0",
                &format!("ctr{i}"),
                &addrs,
            )
            .unwrap();
        }
        assert_eq!(nat_rules("iptables-save").len(), 8 * 4);
    });
}

#[test]
fn iptables_gc_removes_only_stale_containers_of_the_network() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let a = ips(&["10.77.0.2/24", "fd00:77::2/64"]);
        let b = ips(&["10.77.0.3/24", "fd00:77::3/64"]);
        let c = ips(&["10.88.0.3/24"]);
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrA", &a).unwrap();
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrB", &b).unwrap();
        masq::setup(Backend::Iptables, "othernet", "eth0", "ctrB", &c).unwrap();

        masq::gc("mynet", &[("ctrA", "eth0")]).unwrap();

        masq::check(Backend::Iptables, "mynet", "eth0", "ctrA", &a).unwrap();
        masq::check(Backend::Iptables, "othernet", "eth0", "ctrB", &c).unwrap();
        assert!(masq::check(Backend::Iptables, "mynet", "eth0", "ctrB", &b).is_err());
        assert_eq!(nat_rules("iptables-save").len(), 8);
        assert_eq!(nat_rules("ip6tables-save").len(), 4);

        // An empty valid list removes the rest of this network only.
        masq::gc::<&str, &str>("mynet", &[]).unwrap();
        assert_eq!(nat_rules("ip6tables-save"), Vec::<String>::new());
        masq::check(Backend::Iptables, "othernet", "eth0", "ctrB", &c).unwrap();
    });
}

const NFT_COMMENT_G: &str = "e47d63df51ce7720-2a2f354c438bf177, net: nftnet, if: eth1, id: ctrG";

#[test]
fn nftables_setup_check_teardown() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        // Nothing there yet: teardown and GC have nothing to do.
        masq::teardown("nftnet", "eth1", "ctrG").unwrap();
        masq::gc::<&str, &str>("nftnet", &[]).unwrap();

        let addrs = ips(&["10.77.0.2/24", "fd00:77::2/64"]);
        masq::setup(Backend::Nftables, "nftnet", "eth1", "ctrG", &addrs).unwrap();
        let expected = format!(
            "table inet cni_plugins_masquerade {{
\tcomment \"Masquerading for plugins from github.com/containernetworking/plugins\"
\tchain masq_checks {{
\t\tcomment \"Masquerade traffic from certain IPs to any (non-multicast) IP outside their subnet\"
\t\tip saddr 10.77.0.2 ip daddr != 10.77.0.0/24 masquerade comment \"{NFT_COMMENT_G}\"
\t\tip6 saddr fd00:77::2 ip6 daddr != fd00:77::/64 masquerade comment \"{NFT_COMMENT_G}\"
\t}}

\tchain postrouting {{
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\tip daddr 224.0.0.0/4 return
\t\tip6 daddr ff00::/8 return
\t\tgoto masq_checks
\t}}
}}
"
        );
        assert_eq!(ruleset(), expected);

        // Idempotent: the old rules are replaced, not duplicated.
        masq::setup(Backend::Nftables, "nftnet", "eth1", "ctrG", &addrs).unwrap();
        assert_eq!(ruleset(), expected);

        masq::check(Backend::Nftables, "nftnet", "eth1", "ctrG", &addrs).unwrap();
        let err = masq::check(
            Backend::Nftables,
            "nftnet",
            "eth1",
            "ctrG",
            &ips(&["10.77.0.9/24"]),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("ip saddr == 10.77.0.9 ip daddr != 10.77.0.0/24 masquerade"),
            "{err}"
        );

        masq::teardown("nftnet", "eth1", "ctrG").unwrap();
        assert!(!ruleset().contains("masquerade comment"), "{}", ruleset());
        masq::teardown("nftnet", "eth1", "ctrG").unwrap();
        assert!(masq::check(Backend::Nftables, "nftnet", "eth1", "ctrG", &addrs).is_err());
    });
}

#[test]
fn nftables_concurrent_setups_keep_everyone() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        std::thread::scope(|s| {
            for i in 0..8 {
                s.spawn(move || {
                    let addrs = ips(&[
                        &format!("10.77.0.{}/24", 10 + i),
                        &format!("fd00:77::{}/64", 10 + i),
                    ]);
                    masq::setup(
                        Backend::Nftables,
                        "nftnet",
                        "eth0",
                        &format!("ctr{i}"),
                        &addrs,
                    )
                    .unwrap();
                });
            }
        });
        for i in 0..8 {
            let addrs = ips(&[
                &format!("10.77.0.{}/24", 10 + i),
                &format!("fd00:77::{}/64", 10 + i),
            ]);
            masq::check(
                Backend::Nftables,
                "nftnet",
                "eth0",
                &format!("ctr{i}"),
                &addrs,
            )
            .unwrap();
        }
        let rs = ruleset();
        assert_eq!(rs.matches("masquerade comment").count(), 16, "{rs}");
        assert_eq!(rs.matches("goto masq_checks").count(), 1, "{rs}");

        // Tear one down: the others stay.
        masq::teardown("nftnet", "eth0", "ctr3").unwrap();
        let rs = ruleset();
        assert_eq!(rs.matches("masquerade comment").count(), 14, "{rs}");
        assert!(!rs.contains("id: ctr3\""), "{rs}");
    });
}

#[test]
fn nftables_gc_removes_only_stale_attachments_of_the_network() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let a = ips(&["10.77.0.2/24"]);
        let b = ips(&["10.77.0.3/24"]);
        masq::setup(Backend::Nftables, "nftnet", "eth0", "ctrA", &a).unwrap();
        masq::setup(Backend::Nftables, "nftnet", "eth1", "ctrA", &b).unwrap();
        masq::setup(Backend::Nftables, "othernet", "eth0", "ctrB", &b).unwrap();

        masq::gc("nftnet", &[("ctrA".to_string(), "eth0".to_string())]).unwrap();

        masq::check(Backend::Nftables, "nftnet", "eth0", "ctrA", &a).unwrap();
        masq::check(Backend::Nftables, "othernet", "eth0", "ctrB", &b).unwrap();
        assert!(masq::check(Backend::Nftables, "nftnet", "eth1", "ctrA", &b).is_err());
        assert_eq!(ruleset().matches("masquerade comment").count(), 2);
    });
}

#[test]
fn teardown_cleans_both_backends() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let a = ips(&["10.77.0.2/24"]);
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrA", &a).unwrap();
        masq::setup(Backend::Nftables, "mynet", "eth0", "ctrA", &a).unwrap();
        masq::teardown("mynet", "eth0", "ctrA").unwrap();
        assert_eq!(nat_rules("iptables-save"), Vec::<String>::new());
        assert!(!ruleset().contains("masquerade comment"));
    });
}

#[test]
fn default_backend_is_iptables_when_usable() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        assert_eq!(Backend::from_config(None).unwrap(), Backend::Iptables);
        assert_eq!(
            Backend::from_config(Some("nftables")).unwrap(),
            Backend::Nftables
        );
    });
}

const MAC_A: &str = "02:42:ac:11:00:02";

/// A host-side interface for the spoof check to match (a veth pair: the
/// dummy module is not always available).
fn add_host_iface(name: &str) {
    let peer = format!("{name}p");
    sh(
        "ip",
        &["link", "add", name, "type", "veth", "peer", "name", &peer],
    );
}

#[test]
fn macspoof_setup_check_teardown() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        macspoof::teardown("ctrA", "eth0").unwrap();

        macspoof::setup("ctrA", "eth0", "veth1234", "02:42:AC:11:00:02").unwrap();
        let expected = "table bridge nat {
\tchain PREROUTING {
\t\ttype filter hook prerouting priority dstnat; policy accept;
\t\tiifname \"veth1234\" jump cni-br-iface-ctrA-eth0 comment \"macspoofchk-ctrA-eth0\"
\t}

\tchain cni-br-iface-ctrA-eth0 {
\t\tjump cni-br-iface-ctrA-eth0-mac comment \"macspoofchk-ctrA-eth0\"
\t}

\tchain cni-br-iface-ctrA-eth0-mac {
\t\tether saddr 02:42:ac:11:00:02 return comment \"macspoofchk-ctrA-eth0\"
\t\tdrop comment \"macspoofchk-ctrA-eth0\"
\t}
}
";
        assert_eq!(ruleset(), expected);

        // Repeated setup replaces, never duplicates.
        macspoof::setup("ctrA", "eth0", "veth1234", MAC_A).unwrap();
        assert_eq!(ruleset(), expected);

        macspoof::check("ctrA", "eth0", "veth1234", MAC_A).unwrap();
        let err = macspoof::check("ctrA", "eth0", "veth1234", "02:42:ac:11:00:09").unwrap_err();
        assert!(
            err.to_string()
                .contains("ether saddr 02:42:ac:11:00:09 return"),
            "{err}"
        );

        macspoof::teardown("ctrA", "eth0").unwrap();
        let rs = ruleset();
        assert!(!rs.contains("cni-br-iface"), "{rs}");
        assert!(rs.contains("chain PREROUTING"), "{rs}");
        macspoof::teardown("ctrA", "eth0").unwrap();
        assert!(macspoof::check("ctrA", "eth0", "veth1234", MAC_A).is_err());
    });
}

#[test]
fn macspoof_rejects_bad_input() {
    // No privileges needed: validation happens before nft runs.
    let err = macspoof::setup("ctrA", "eth0", "veth1234", "not-a-mac").unwrap_err();
    assert!(
        err.to_string().starts_with("invalid container MAC"),
        "{err}"
    );
    assert!(macspoof::setup("ctrA", "eth0", "", MAC_A).is_err());
}

#[test]
fn macspoof_gc_keeps_valid_and_live_attachments() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        add_host_iface("vethA");
        add_host_iface("vethC");
        macspoof::setup("ctrA", "eth0", "vethA", MAC_A).unwrap();
        macspoof::setup("ctrB", "eth0", "vethB", "02:42:ac:11:00:03").unwrap();
        macspoof::setup("ctrC", "eth1", "vethC", "02:42:ac:11:00:04").unwrap();

        macspoof::gc(&[("ctrA", "eth0")]).unwrap();

        macspoof::check("ctrA", "eth0", "vethA", MAC_A).unwrap();
        // Not valid here, but its host interface lives: another network's.
        macspoof::check("ctrC", "eth1", "vethC", "02:42:ac:11:00:04").unwrap();
        let rs = ruleset();
        assert!(!rs.contains("ctrB"), "{rs}");
        assert_eq!(rs.matches("chain cni-br-iface-").count(), 4, "{rs}");
    });
}

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
    use std::io::Write;
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("nft");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft -f: {}\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    for (step, (nft, ours)) in by_nft.iter().zip(&by_us).enumerate() {
        for (nft, ours) in nft.iter().zip(ours) {
            assert_eq!(ours, nft, "after step {step}");
        }
    }
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
    use std::io::Write;
    let mut child = Command::new("nft")
        .args(["-j", "-f", "-"])
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("nft");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(batch.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft -j -f: {}",
        String::from_utf8_lossy(&out.stderr)
    );
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
