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
