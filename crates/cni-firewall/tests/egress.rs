//! Root tests of the node agent's egress SNAT rules, both backends, against the real
//! kernel and tools, each in a fresh network namespace.

use cni_firewall::egress::{self, EgressBackend, EgressPolicy};

mod common;
use common::{in_netns, ips, nat_rules, privileged, ruleset, sh};

fn policy(sources: &[&str], exempt: &[&str]) -> EgressPolicy {
    EgressPolicy {
        sources: ips(sources),
        exempt: ips(exempt),
    }
}

#[test]
fn nftables_rules_are_made_left_alone_when_right_changed_and_removed() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        // A table of someone else's, which must stay as it is.
        sh("nft", &["add", "table", "inet", "theirs"]);
        let p = policy(
            &["10.244.1.0/24", "fd00:244:0:1::/64"],
            &[
                "10.244.1.0/24",
                "10.244.0.0/24",
                "10.244.3.0/24",
                "fd00:244::/48",
            ],
        );
        assert!(egress::sync(EgressBackend::Nftables, &p).unwrap());
        let listed = sh("nft", &["list", "table", "inet", egress::TABLE]);
        for want in [
            "type nat hook postrouting priority srcnat; policy accept;",
            "ip daddr 224.0.0.0/4 return",
            "ip6 daddr ff00::/8 return",
            "ip daddr 10.244.0.0/23 return",
            "ip daddr 10.244.3.0/24 return",
            "ip6 daddr fd00:244::/48 return",
            "ip saddr 10.244.1.0/24 masquerade",
            "ip6 saddr fd00:244:0:1::/64 masquerade",
        ] {
            assert!(listed.contains(want), "no {want:?} in:\n{listed}");
        }
        // Already right: nothing is sent (the ruleset is byte for byte the same).
        let before = ruleset();
        assert!(!egress::sync(EgressBackend::Nftables, &p).unwrap());
        assert_eq!(ruleset(), before);
        // One more node.
        let mut more = p.clone();
        more.exempt.extend(ips(&["10.244.2.0/24"]));
        assert!(egress::sync(EgressBackend::Nftables, &more).unwrap());
        let listed = sh("nft", &["list", "table", "inet", egress::TABLE]);
        assert!(listed.contains("ip daddr 10.244.0.0/22 return"), "{listed}");
        egress::remove(EgressBackend::Nftables).unwrap();
        egress::remove(EgressBackend::Nftables).unwrap();
        let after = ruleset();
        assert!(!after.contains(egress::TABLE), "{after}");
        assert!(after.contains("table inet theirs"), "{after}");
    });
}

#[test]
fn iptables_rules_are_made_left_alone_when_right_changed_and_removed() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let p = policy(
            &["10.244.1.0/24", "fd00:244:0:1::/64"],
            &["10.244.1.0/24", "10.244.0.0/24", "fd00:244::/48"],
        );
        assert!(egress::sync(EgressBackend::Iptables, &p).unwrap());
        let v4 = nat_rules("iptables-save");
        let c = r#"-m comment --comment "cni-node egress SNAT""#;
        for want in [
            format!("-A POSTROUTING {c} -j CNI-NODE-EGRESS"),
            format!("-A CNI-NODE-EGRESS -d 224.0.0.0/4 {c} -j RETURN"),
            format!("-A CNI-NODE-EGRESS -d 10.244.0.0/23 {c} -j RETURN"),
            format!("-A CNI-NODE-EGRESS -s 10.244.1.0/24 {c} -j MASQUERADE"),
        ] {
            assert!(v4.contains(&want), "no {want:?} in {v4:#?}");
        }
        let v6 = nat_rules("ip6tables-save");
        assert!(
            v6.contains(&format!(
                "-A CNI-NODE-EGRESS -s fd00:244:0:1::/64 {c} -j MASQUERADE"
            )),
            "{v6:#?}"
        );
        assert!(!egress::sync(EgressBackend::Iptables, &p).unwrap());
        let mut fewer = p.clone();
        fewer.exempt.truncate(1);
        assert!(egress::sync(EgressBackend::Iptables, &fewer).unwrap());
        let v4 = nat_rules("iptables-save");
        assert!(
            v4.contains(&format!(
                "-A CNI-NODE-EGRESS -d 10.244.1.0/24 {c} -j RETURN"
            )),
            "{v4:#?}"
        );
        assert_eq!(
            v4.iter()
                .filter(|r| r.starts_with("-A POSTROUTING"))
                .count(),
            1,
            "one jump only: {v4:#?}"
        );
        egress::remove(EgressBackend::Iptables).unwrap();
        egress::remove(EgressBackend::Iptables).unwrap();
        let v4 = nat_rules("iptables-save");
        assert!(!v4.iter().any(|r| r.contains("CNI-NODE-EGRESS")), "{v4:#?}");
    });
}
