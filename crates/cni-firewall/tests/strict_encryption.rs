//! Root tests of the node agent's strict encryption table against the real kernel and
//! `nft`, in a fresh network namespace: the rules and the sets' pairs read back as
//! `nft` lists them, a sync that changes nothing sends nothing, a change is applied,
//! and the table goes.

use cni_firewall::strict_encryption::{self, StrictPolicy};

mod common;
use common::{in_netns, ips, privileged, ruleset, sh};

#[test]
fn the_strict_table_is_made_left_alone_when_right_changed_and_removed() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        sh("nft", &["add", "table", "inet", "theirs"]);
        let p = StrictPolicy {
            device: "cni-wg0".into(),
            own: ips(&["10.244.1.0/24", "fd00:244:0:1::/64"]),
            remote: ips(&["10.244.2.0/24", "10.244.3.0/24", "fd00:244:0:2::/64"]),
            expected: ips(&["10.244.2.0/24"]),
        };
        assert!(strict_encryption::sync(&p).unwrap());
        let listed = sh("nft", &["list", "table", "inet", strict_encryption::TABLE]);
        for want in [
            "type filter hook forward priority filter; policy accept;",
            "oifname != \"cni-wg0\" ip saddr . ip daddr @out4 drop",
            "iifname != \"cni-wg0\" ip saddr . ip daddr @in4 drop",
            "oifname != \"cni-wg0\" ip6 saddr . ip6 daddr @out6 drop",
            "iifname != \"cni-wg0\" ip6 saddr . ip6 daddr @in6 drop",
            "10.244.1.0/24 . 10.244.2.0/23",
            "10.244.2.0/24 . 10.244.1.0/24",
            "fd00:244:0:1::/64 . fd00:244:0:2::/64",
        ] {
            assert!(listed.contains(want), "no {want:?} in:\n{listed}");
        }
        let before = ruleset();
        assert!(!strict_encryption::sync(&p).unwrap(), "already right");
        assert_eq!(ruleset(), before);
        let mut more = p.clone();
        more.expected.extend(ips(&["fd00:244:0:2::/64"]));
        assert!(strict_encryption::sync(&more).unwrap());
        let listed = sh("nft", &["list", "table", "inet", strict_encryption::TABLE]);
        assert!(
            listed.contains("fd00:244:0:2::/64 . fd00:244:0:1::/64"),
            "{listed}"
        );
        assert!(strict_encryption::remove().unwrap());
        assert!(!strict_encryption::remove().unwrap());
        let after = ruleset();
        assert!(!after.contains(strict_encryption::TABLE), "{after}");
        assert!(after.contains("table inet theirs"), "{after}");
    });
}
