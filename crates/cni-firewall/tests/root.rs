//! Root tests against the real `iptables-restore` and `nft`.
//!
//! Every test runs on a thread that first moves into a fresh network
//! namespace; the tools we spawn inherit that thread's namespace, so nothing
//! here touches the machine's own rules. Verification reads the state back
//! with `iptables-save` and `nft list` from the same thread.

use std::process::Command;

use cni_firewall::{Backend, Error, macspoof, masq};

mod common;
use common::{feed, in_netns, ips, nat_rules, privileged, ruleset, sh, tool_path};

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
    const PODS: usize = 16;
    in_netns(|| {
        // Threads spawned here share this thread's namespace.
        std::thread::scope(|s| {
            for i in 0..PODS {
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
        let rules = nat_rules("iptables-save");
        for i in 0..PODS {
            let id = format!("ctr{i}");
            let addrs = ips(&[&format!("10.77.0.{}/24", 10 + i)]);
            masq::check(Backend::Iptables, "mynet", "eth0", &id, &addrs).unwrap();
            let chain = cni_firewall::naming::iptables_chain_name("mynet", &id);
            let jumps = rules
                .iter()
                .filter(|r| r.starts_with("-A POSTROUTING") && r.ends_with(&format!("-j {chain}")))
                .count();
            assert_eq!(jumps, 1, "{id}: {rules:#?}");
        }
        assert_eq!(rules.len(), PODS * 4, "{rules:#?}");

        // And all of them away at once: deletion by specification must not
        // trip over the others' concurrent changes of POSTROUTING.
        std::thread::scope(|s| {
            for i in 0..PODS {
                s.spawn(move || masq::teardown("mynet", "eth0", &format!("ctr{i}")).unwrap());
            }
        });
        assert_eq!(nat_rules("iptables-save"), Vec::<String>::new());
    });
}

/// Restores `input` into the nat table of the current namespace.
fn restore(program: &str, input: &str) {
    feed(program, &["--noflush"], input);
}

/// The ctrA rules of `mynet` for 10.77.0.2/24, as the reference lays them out.
fn ctr_a_v4() -> [String; 3] {
    [
        format!(
            r#"-A POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j {CHAIN_A}"#
        ),
        format!(
            r#"-A {CHAIN_A} -d 10.77.0.0/24 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j ACCEPT"#
        ),
        format!(
            r#"-A {CHAIN_A} ! -d 224.0.0.0/4 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j MASQUERADE"#
        ),
    ]
}

#[test]
fn iptables_setup_over_a_leftover_chain_completes_it() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let [jump, accept, masquerade] = ctr_a_v4();
        // A chain left by an earlier attachment of the same container (e.g.
        // another interface, or a killed run): one stale subnet rule and the
        // jump, but no rule for 10.77.0.0/24 and no MASQUERADE.
        let stale = format!(
            r#"-A {CHAIN_A} -d 10.66.0.0/24 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j ACCEPT"#
        );
        restore(
            "iptables-restore",
            &format!("*nat\n:{CHAIN_A} - [0:0]\n{stale}\n{jump}\nCOMMIT\n"),
        );
        let addrs = ips(&["10.77.0.2/24"]);
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrA", &addrs).unwrap();
        // The subnet rule goes before everything, MASQUERADE after; the jump
        // is not duplicated and the other rule is not ours to remove.
        let expected = vec![
            format!(":{CHAIN_A} - [0:0]"),
            jump.clone(),
            accept.clone(),
            stale.clone(),
            masquerade.clone(),
        ];
        assert_eq!(nat_rules("iptables-save"), expected);
        masq::check(Backend::Iptables, "mynet", "eth0", "ctrA", &addrs).unwrap();

        // A repeated ADD changes nothing.
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrA", &addrs).unwrap();
        assert_eq!(nat_rules("iptables-save"), expected);

        // A leftover chain without the jump: the jump is added once.
        masq::teardown("mynet", "eth0", "ctrA").unwrap();
        restore(
            "iptables-restore",
            &format!("*nat\n:{CHAIN_A} - [0:0]\n{masquerade}\nCOMMIT\n"),
        );
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrA", &addrs).unwrap();
        assert_eq!(
            nat_rules("iptables-save"),
            vec![format!(":{CHAIN_A} - [0:0]"), jump, accept, masquerade]
        );
    });
}

#[test]
fn iptables_teardown_of_unusual_leftovers() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let [jump, accept, masquerade] = ctr_a_v4();
        // A chain without any jump to it.
        restore(
            "iptables-restore",
            &format!("*nat\n:{CHAIN_A} - [0:0]\n{accept}\n{masquerade}\nCOMMIT\n"),
        );
        masq::teardown("mynet", "eth0", "ctrA").unwrap();
        assert_eq!(nat_rules("iptables-save"), Vec::<String>::new());

        // A jump from a chain other than POSTROUTING (which keeps the chain
        // from being deleted until that jump goes too), and two jumps.
        let other = format!(
            r#"-A OTHER -s 10.77.0.9/32 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j {CHAIN_A}"#
        );
        let second = jump.replace("10.77.0.2/32", "10.77.0.5/32");
        restore(
            "iptables-restore",
            &format!(
                "*nat\n:{CHAIN_A} - [0:0]\n:OTHER - [0:0]\n{masquerade}\n{jump}\n{second}\n{other}\n-A POSTROUTING -j OTHER\nCOMMIT\n"
            ),
        );
        masq::teardown("mynet", "eth0", "ctrA").unwrap();
        assert_eq!(
            nat_rules("iptables-save"),
            vec!["-A POSTROUTING -j OTHER".to_owned()]
        );
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

/// A scratch directory (tool wrappers for a child test run), removed on drop.
struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    fn new(tag: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("cni-firewall-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The iptables tools the library runs.
const XTABLES_TOOLS: [&str; 6] = [
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
];

/// Where `program` is in [`tool_path`].
fn find_tool(program: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&tool_path())
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Runs tests of this test binary in a child process whose PATH starts with
/// `dir` (the library finds its tools in PATH first); returns how many passed.
fn run_child(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> usize {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(args)
        .env("PATH", format!("{}:{}", dir.display(), tool_path()))
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child run {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("test result: ok. "))
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no test result in:\n{stdout}"))
}

/// The iptables tests above, again with the legacy (x_tables) variant: the
/// tools are the names the library runs, linked to `xtables-legacy-multi`,
/// first in the child's PATH; the checks read back with the same tools.
#[test]
fn legacy_xtables_pass_the_same_tests() {
    if !privileged() {
        return;
    }
    let Some(multi) = find_tool("xtables-legacy-multi") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "xtables-legacy-multi (Debian package iptables) is missing"
        );
        eprintln!("skipping: no xtables-legacy-multi");
        return;
    };
    // The kernel side: x_tables with the nat table in both families.
    let kernel = in_netns(|| {
        ["iptables-legacy", "ip6tables-legacy"].iter().all(|tool| {
            Command::new(tool)
                .args(["-t", "nat", "-S", "POSTROUTING"])
                .env("PATH", tool_path())
                .output()
                .is_ok_and(|o| o.status.success())
        })
    });
    if !kernel {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the kernel has no x_tables nat table for iptables-legacy"
        );
        eprintln!("skipping: the kernel has no x_tables nat table");
        return;
    }
    let dir = ScratchDir::new("legacy");
    for tool in XTABLES_TOOLS {
        std::os::unix::fs::symlink(&multi, dir.0.join(tool)).unwrap();
    }
    let version = Command::new(dir.0.join("iptables"))
        .arg("-V")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(version.contains("legacy"), "{version}");

    let passed = run_child(&dir.0, &["iptables_", "--test-threads=2"], &[]);
    assert!(passed >= 7, "only {passed} iptables tests ran");
}

/// What the library runs on each path (checked by [`traced_child`]): the
/// tools are wrapped by scripts that log their arguments, first in PATH.
#[test]
fn tool_calls_of_masquerade_setup_check_teardown() {
    if !privileged() {
        return;
    }
    let dir = ScratchDir::new("trace");
    let log = dir.0.join("calls.log");
    for tool in XTABLES_TOOLS {
        let real = find_tool(tool).unwrap_or_else(|| panic!("{tool} not installed"));
        let script = dir.0.join(tool);
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"{tool} $*\" >> '{}'\nexec '{}' \"$@\"\n",
                log.display(),
                real.display()
            ),
        )
        .unwrap();
        let mut perms = std::fs::metadata(&script).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&script, perms).unwrap();
    }
    let passed = run_child(
        &dir.0,
        &["--ignored", "--exact", "traced_child"],
        &[("CNI_FIREWALL_TRACE_LOG", log.to_str().unwrap())],
    );
    assert_eq!(passed, 1);
}

#[test]
#[ignore = "run by tool_calls_of_masquerade_setup_check_teardown"]
fn traced_child() {
    let log = std::path::PathBuf::from(std::env::var("CNI_FIREWALL_TRACE_LOG").unwrap());
    // The calls logged since the last look, sorted (the families run at once).
    let calls = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        std::fs::write(&log, "").unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines.sort();
        lines
    };
    in_netns(|| {
        let addrs = ips(&["10.77.0.2/24", "fd00:77::2/64"]);
        calls();

        // A new attachment: one transaction per family, nothing read.
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrA", &addrs).unwrap();
        let restore4 = "iptables-restore --noflush --wait=30";
        let restore6 = "ip6tables-restore --noflush --wait=30";
        assert_eq!(calls(), [restore6, restore4]);

        // Again: the chain exists, so each family falls back to the
        // whole-table computation, which finds nothing to add.
        masq::setup(Backend::Iptables, "mynet", "eth0", "ctrA", &addrs).unwrap();
        assert_eq!(
            calls(),
            [
                restore6,
                "ip6tables-save -t nat",
                restore4,
                "iptables-save -t nat"
            ]
        );

        // CHECK: one transaction of `-C` lines per family.
        masq::check(Backend::Iptables, "mynet", "eth0", "ctrA", &addrs).unwrap();
        assert_eq!(calls(), [restore6, restore4]);

        // A failing CHECK then lists POSTROUTING and the chain to say what
        // is missing.
        let more = ips(&["10.77.0.2/24", "10.88.0.2/24"]);
        let err = masq::check(Backend::Iptables, "mynet", "eth0", "ctrA", &more).unwrap_err();
        assert!(err.to_string().contains("10.88.0.0/24"), "{err}");
        let list = |tool: &str, chain: &str| format!("{tool} --wait=30 -t nat -S {chain}");
        assert_eq!(
            calls(),
            [
                list("iptables", CHAIN_A),
                list("iptables", "POSTROUTING"),
                restore4.to_owned(),
            ]
        );

        // Teardown lists POSTROUTING and removes in one transaction.
        masq::teardown("mynet", "eth0", "ctrA").unwrap();
        assert_eq!(
            calls(),
            [
                list("ip6tables", "POSTROUTING"),
                restore6.to_owned(),
                list("iptables", "POSTROUTING"),
                restore4.to_owned(),
            ]
        );
        assert_eq!(nat_rules("iptables-save"), Vec::<String>::new());
        assert_eq!(nat_rules("ip6tables-save"), Vec::<String>::new());
    });
}

mod port_security_rules {
    use super::*;
    use cni_firewall::port_security::{self, Port};
    use std::net::IpAddr;

    const MAC: cni_protocol::MacAddr = cni_protocol::MacAddr([0x02, 0x42, 0xac, 0x11, 0x00, 0x02]);

    fn port<'a>(cid: &'a str, veth: &'a str, addrs: &'a [IpAddr]) -> Port<'a> {
        Port {
            container_id: cid,
            ifname: "eth0",
            host_veth: veth,
            mac: MAC,
            addresses: addrs,
        }
    }

    #[test]
    fn setup_check_teardown_as_nft_prints_it() {
        if !privileged() {
            return;
        }
        in_netns(|| {
            let addrs: Vec<IpAddr> = vec!["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
            let p = port("ctrA", "veth1234", &addrs);
            port_security::teardown("ctrA", "eth0").unwrap();
            port_security::setup(&p).unwrap();
            let rs = ruleset();
            let id = cni_firewall::naming::port_security_id("ctrA", "eth0");
            for line in [
                "table bridge cni_port_security {".to_string(),
                format!("\tset ports {{\n\t\ttype ifname\n\t\telements = {{ \"veth1234\" comment \"{id} ctrA eth0\" }}"),
                format!("\tset port_macs {{\n\t\ttype ifname . ether_addr\n\t\telements = {{ \"veth1234\" . 02:42:ac:11:00:02 comment \"{id} ctrA eth0\" }}"),
                format!("\"veth1234\" . 10.1.0.2 comment \"{id} ctrA eth0\""),
                format!("\"veth1234\" . fd00::2 comment \"{id} ctrA eth0\""),
                format!("\"veth1234\" . fe80::42:acff:fe11:2 comment \"{id} ctrA eth0\""),
                "\t\ttype filter hook prerouting priority filter; policy accept;\n\t\tiifname != @ports accept\n\t\tiifname . ether saddr != @port_macs drop".into(),
                "iifname . ip saddr @port_ipv4 accept".into(),
                "arp htype 1 arp ptype ip arp hlen 6 arp plen 4 iifname . arp saddr ether @port_macs iifname . arp saddr ip @port_ipv4 accept".into(),
                "icmpv6 type nd-router-advert drop".into(),
                "iifname . ip6 saddr @port_ipv6 accept".into(),
                "udp sport 68 udp dport 67 accept".into(),
            ] {
                assert!(rs.contains(&line), "{line:?} not in\n{rs}");
            }
            if std::env::var_os("SHOW_RULESET").is_some() {
                eprintln!("{rs}");
            }
            // A repeated setup changes nothing.
            port_security::setup(&p).unwrap();
            assert_eq!(ruleset(), rs);
            port_security::check(&p).unwrap();

            // CHECK names what is gone: an element, a rule.
            sh(
                "nft",
                &[
                    "delete",
                    "element",
                    "bridge",
                    "cni_port_security",
                    "port_ipv4",
                    "{ \"veth1234\" . 10.1.0.2 }",
                ],
            );
            let err = port_security::check(&p).unwrap_err().to_string();
            assert!(err.contains("\"veth1234\" . 10.1.0.2"), "{err}");
            port_security::setup(&p).unwrap();
            port_security::check(&p).unwrap();
            let handle = sh(
                "nft",
                &[
                    "-a",
                    "list",
                    "chain",
                    "bridge",
                    "cni_port_security",
                    "prerouting",
                ],
            )
            .lines()
            .find(|l| l.contains("nd-router-advert"))
            .and_then(|l| l.rsplit("handle ").next().map(|h| h.trim().to_string()))
            .unwrap();
            sh(
                "nft",
                &[
                    "delete",
                    "rule",
                    "bridge",
                    "cni_port_security",
                    "prerouting",
                    "handle",
                    &handle,
                ],
            );
            let err = port_security::check(&p).unwrap_err().to_string();
            assert!(err.contains("nd-router-advert"), "{err}");
            let other: Vec<IpAddr> = vec!["10.1.0.9".parse().unwrap()];
            assert!(port_security::check(&port("ctrA", "veth1234", &other)).is_err());

            port_security::teardown("ctrA", "eth0").unwrap();
            let rs = ruleset();
            assert!(!rs.contains("veth1234"), "{rs}");
            assert!(!rs.contains("elements"), "{rs}");
            port_security::teardown("ctrA", "eth0").unwrap();
            assert!(port_security::check(&p).is_err());
        });
    }

    #[test]
    fn a_reused_port_name_takes_nothing_of_the_old_attachment() {
        if !privileged() {
            return;
        }
        in_netns(|| {
            let old: Vec<IpAddr> = vec!["10.1.0.2".parse().unwrap()];
            let new: Vec<IpAddr> = vec!["10.1.0.3".parse().unwrap()];
            port_security::setup(&port("ctrOld", "vethsame", &old)).unwrap();
            port_security::setup(&port("ctrNew", "vethsame", &new)).unwrap();
            let rs = ruleset();
            assert!(!rs.contains("10.1.0.2"), "{rs}");
            assert!(!rs.contains("ctrOld"), "{rs}");
            port_security::check(&port("ctrNew", "vethsame", &new)).unwrap();
        });
    }

    #[test]
    fn gc_keeps_valid_and_live_ports_and_removes_the_rest() {
        if !privileged() {
            return;
        }
        in_netns(|| {
            add_host_iface("vethA");
            add_host_iface("vethC");
            let addrs: Vec<IpAddr> = vec!["10.1.0.2".parse().unwrap()];
            for (cid, veth) in [("ctrA", "vethA"), ("ctrB", "vethB"), ("ctrC", "vethC")] {
                port_security::setup(&port(cid, veth, &addrs)).unwrap();
            }
            port_security::gc(&[("ctrA", "eth0")]).unwrap();
            port_security::check(&port("ctrA", "vethA", &addrs)).unwrap();
            port_security::check(&port("ctrC", "vethC", &addrs)).unwrap();
            let rs = ruleset();
            assert!(!rs.contains("ctrB"), "{rs}");
            assert!(!rs.contains("vethB"), "{rs}");
        });
    }

    #[test]
    fn concurrent_first_setups_make_one_rule_set() {
        if !privileged() {
            return;
        }
        in_netns(|| {
            let addrs: Vec<IpAddr> = vec!["10.1.0.2".parse().unwrap()];
            let ids: Vec<(String, String)> = (0..8)
                .map(|i| (format!("ctr{i}"), format!("vethc{i}")))
                .collect();
            let ns = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
            std::thread::scope(|s| {
                for (cid, veth) in &ids {
                    let ns = &ns;
                    let addrs = &addrs;
                    s.spawn(move || {
                        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                        port_security::setup(&port(cid, veth, addrs)).unwrap();
                    });
                }
            });
            let rs = ruleset();
            assert_eq!(rs.matches("iifname != @ports accept").count(), 1, "{rs}");
            for (cid, veth) in &ids {
                port_security::check(&port(cid, veth, &addrs)).unwrap();
            }
        });
    }
}
