//! The nftables masquerade backend (table `inet cni_plugins_masquerade`).
//!
//! Layout, comments and rule texts are those of the reference plugins, so the
//! reference can clean up after us and vice versa. Each attachment owns the
//! rules in `masq_checks` whose comment starts with its instance hash; the
//! base chain `postrouting` is shared and rewritten by every setup, always in
//! the same transaction as the attachment's rules, so two concurrent setups
//! both leave a complete table behind.

use std::collections::HashSet;

use ipnetwork::IpNetwork;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::naming::{nft_comment, nft_instance_hash, nft_network_hash};
use crate::nft::{self, Listing};

const FAMILY: &str = "inet";
/// Table of the reference's nftables masquerade backend.
pub(crate) const TABLE: &str = "cni_plugins_masquerade";
/// Regular chain holding one rule per container IP.
pub(crate) const MASQ_CHAIN: &str = "masq_checks";
/// Base chain hooked into NAT postrouting.
pub(crate) const POSTROUTING_CHAIN: &str = "postrouting";
const TABLE_COMMENT: &str = "Masquerading for plugins from github.com/containernetworking/plugins";
const CHAIN_COMMENT: &str =
    "Masquerade traffic from certain IPs to any (non-multicast) IP outside their subnet";

fn target() -> String {
    format!("table {FAMILY} {TABLE} chain {MASQ_CHAIN}")
}

/// `ip saddr == <ip> ip daddr != <subnet> masquerade`, as the reference
/// writes it.
fn rule_body(ip: &IpNetwork) -> String {
    let proto = if ip.is_ipv4() { "ip" } else { "ip6" };
    format!(
        "{proto} saddr == {} {proto} daddr != {} masquerade",
        ip.ip(),
        subnet(ip)
    )
}

/// The network an address lives in (`10.77.0.2/24` -> `10.77.0.0/24`).
pub(crate) fn subnet(ip: &IpNetwork) -> IpNetwork {
    IpNetwork::new(ip.network(), ip.prefix()).unwrap_or(*ip)
}

/// nft's quoted strings have no escapes: refuse what would end or break one.
fn check_comment(comment: &str) -> Result<()> {
    if comment.chars().any(|c| c == '"' || c.is_control()) {
        return Err(Error::InvalidInput {
            what: "nftables comment",
            value: comment.into(),
            reason: "contains a double quote or a control character",
        });
    }
    Ok(())
}

/// The whole setup transaction: ensure table and chains, rewrite the shared
/// base chain, replace this attachment's rules (`stale` handles) with one
/// rule per IP.
pub(crate) fn setup_script(stale: &[u64], ips: &[IpNetwork], comment: &str) -> String {
    let t = format!("{FAMILY} {TABLE}");
    let mut s = String::new();
    s.push_str(&format!(
        "add table {t} {{ comment \"{TABLE_COMMENT}\" ; }}\n"
    ));
    s.push_str(&format!(
        "add chain {t} {MASQ_CHAIN} {{ comment \"{CHAIN_COMMENT}\" ; }}\n"
    ));
    s.push_str(&format!(
        "add chain {t} {POSTROUTING_CHAIN} {{ type nat hook postrouting priority srcnat ; }}\n"
    ));
    s.push_str(&format!("flush chain {t} {POSTROUTING_CHAIN}\n"));
    s.push_str(&format!(
        "add rule {t} {POSTROUTING_CHAIN} ip daddr == 224.0.0.0/4 return\n"
    ));
    s.push_str(&format!(
        "add rule {t} {POSTROUTING_CHAIN} ip6 daddr == ff00::/8 return\n"
    ));
    s.push_str(&format!(
        "add rule {t} {POSTROUTING_CHAIN} goto {MASQ_CHAIN}\n"
    ));
    s.push_str(&delete_script(stale));
    for ip in ips {
        s.push_str(&format!(
            "add rule {t} {MASQ_CHAIN} {} comment \"{comment}\"\n",
            rule_body(ip)
        ));
    }
    s
}

/// Deletes `masq_checks` rules by handle.
pub(crate) fn delete_script(handles: &[u64]) -> String {
    handles
        .iter()
        .map(|h| format!("delete rule {FAMILY} {TABLE} {MASQ_CHAIN} handle {h}\n"))
        .collect()
}

/// Handles of `masq_checks` rules whose comment starts with `prefix`.
pub(crate) fn handles_with_prefix(listing: &Listing, prefix: &str) -> Vec<u64> {
    listing
        .rules_in(MASQ_CHAIN)
        .filter(|r| r.comment.as_deref().is_some_and(|c| c.starts_with(prefix)))
        .map(|r| r.handle)
        .collect()
}

/// Handles of this network's rules whose comment is not one of `keep`.
pub(crate) fn gc_handles(listing: &Listing, network: &str, keep: &HashSet<String>) -> Vec<u64> {
    let prefix = format!("{}-", nft_network_hash(network));
    listing
        .rules_in(MASQ_CHAIN)
        .filter(|r| {
            r.comment
                .as_deref()
                .is_some_and(|c| c.starts_with(&prefix) && !keep.contains(c))
        })
        .map(|r| r.handle)
        .collect()
}

/// The JSON statements nft lists for [`rule_body`].
fn expected_expr(ip: &IpNetwork) -> Vec<Value> {
    let proto = if ip.is_ipv4() { "ip" } else { "ip6" };
    let net = subnet(ip);
    vec![
        json!({"match": {"op": "==", "left": {"payload": {"protocol": proto, "field": "saddr"}},
                         "right": ip.ip().to_string()}}),
        json!({"match": {"op": "!=", "left": {"payload": {"protocol": proto, "field": "daddr"}},
                         "right": {"prefix": {"addr": net.ip().to_string(), "len": net.prefix()}}}}),
        json!({"masquerade": null}),
    ]
}

/// What CHECK finds missing, in nft syntax (empty when all is in place).
pub(crate) fn missing(
    listing: &Listing,
    ips: &[IpNetwork],
    comment: &str,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let has_goto = listing
        .rules_in(POSTROUTING_CHAIN)
        .any(|r| r.jump_target() == Some(MASQ_CHAIN));
    if !has_goto {
        out.push((
            format!("table {FAMILY} {TABLE} chain {POSTROUTING_CHAIN}"),
            format!("goto {MASQ_CHAIN}"),
        ));
    }
    for ip in ips {
        let want = expected_expr(ip);
        let found = listing
            .rules_in(MASQ_CHAIN)
            .any(|r| r.comment.as_deref() == Some(comment) && r.expr == want);
        if !found {
            out.push((target(), format!("{} comment \"{comment}\"", rule_body(ip))));
        }
    }
    out
}

fn list_masq_chain() -> Result<Option<Listing>> {
    nft::list(&["chain", FAMILY, TABLE, MASQ_CHAIN])
}

/// Installs the attachment's rules, replacing any it had before.
pub(crate) fn setup(
    network: &str,
    ifname: &str,
    container_id: &str,
    ips: &[IpNetwork],
) -> Result<()> {
    let comment = nft_comment(network, ifname, container_id);
    check_comment(&comment)?;
    let prefix = nft_instance_hash(network, ifname, container_id);
    // A handle we read can vanish before our transaction runs (a concurrent
    // DEL/GC of the same attachment); the transaction then fails as a whole
    // and a fresh read fixes it.
    let mut attempts_left = 3;
    loop {
        let stale = list_masq_chain()?
            .map(|l| handles_with_prefix(&l, &prefix))
            .unwrap_or_default();
        match nft::apply(&setup_script(&stale, ips, &comment), &target()) {
            Err(_) if !stale.is_empty() && attempts_left > 1 => attempts_left -= 1,
            other => return other,
        }
    }
}

/// Removes the attachment's rules; a missing table means nothing to do.
pub(crate) fn teardown(network: &str, ifname: &str, container_id: &str) -> Result<()> {
    let prefix = nft_instance_hash(network, ifname, container_id);
    let Some(listing) = list_masq_chain()? else {
        return Ok(());
    };
    let handles = handles_with_prefix(&listing, &prefix);
    if handles.is_empty() {
        return Ok(());
    }
    nft::apply(&delete_script(&handles), &target())
}

/// Verifies the attachment's rules are installed.
pub(crate) fn check(
    network: &str,
    ifname: &str,
    container_id: &str,
    ips: &[IpNetwork],
) -> Result<()> {
    let comment = nft_comment(network, ifname, container_id);
    let listing = nft::list(&["table", FAMILY, TABLE])?.ok_or_else(|| Error::Missing {
        backend: "nftables",
        target: format!("{FAMILY} ruleset"),
        what: format!("table {FAMILY} {TABLE}"),
    })?;
    let errors = missing(&listing, ips, &comment)
        .into_iter()
        .map(|(target, what)| Error::Missing {
            backend: "nftables",
            target,
            what,
        })
        .collect();
    Error::collect(errors)
}

/// Removes this network's rules that belong to no valid attachment.
pub(crate) fn gc(network: &str, valid: &[(&str, &str)]) -> Result<()> {
    let Some(listing) = list_masq_chain()? else {
        return Ok(());
    };
    let keep = valid
        .iter()
        .map(|(cid, ifname)| nft_comment(network, ifname, cid))
        .collect();
    let handles = gc_handles(&listing, network, &keep);
    if handles.is_empty() {
        return Ok(());
    }
    nft::apply(&delete_script(&handles), &target())
}

/// Whether nftables works here.
pub(crate) fn usable() -> bool {
    nft::usable(FAMILY, TABLE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::parse_listing;
    use crate::nft::tests::MASQ_TABLE_JSON;

    fn ips() -> Vec<IpNetwork> {
        vec![
            "10.77.0.2/24".parse().unwrap(),
            "fd00:77::2/64".parse().unwrap(),
        ]
    }

    #[test]
    fn setup_script_is_exact() {
        let comment = nft_comment("nftnet", "eth1", "ctrG");
        let script = setup_script(&[6, 7], &ips(), &comment);
        let expected = r#"add table inet cni_plugins_masquerade { comment "Masquerading for plugins from github.com/containernetworking/plugins" ; }
add chain inet cni_plugins_masquerade masq_checks { comment "Masquerade traffic from certain IPs to any (non-multicast) IP outside their subnet" ; }
add chain inet cni_plugins_masquerade postrouting { type nat hook postrouting priority srcnat ; }
flush chain inet cni_plugins_masquerade postrouting
add rule inet cni_plugins_masquerade postrouting ip daddr == 224.0.0.0/4 return
add rule inet cni_plugins_masquerade postrouting ip6 daddr == ff00::/8 return
add rule inet cni_plugins_masquerade postrouting goto masq_checks
delete rule inet cni_plugins_masquerade masq_checks handle 6
delete rule inet cni_plugins_masquerade masq_checks handle 7
add rule inet cni_plugins_masquerade masq_checks ip saddr == 10.77.0.2 ip daddr != 10.77.0.0/24 masquerade comment "e47d63df51ce7720-2a2f354c438bf177, net: nftnet, if: eth1, id: ctrG"
add rule inet cni_plugins_masquerade masq_checks ip6 saddr == fd00:77::2 ip6 daddr != fd00:77::/64 masquerade comment "e47d63df51ce7720-2a2f354c438bf177, net: nftnet, if: eth1, id: ctrG"
"#;
        assert_eq!(script, expected);
    }

    #[test]
    fn delete_script_is_exact() {
        assert_eq!(
            delete_script(&[11]),
            "delete rule inet cni_plugins_masquerade masq_checks handle 11\n"
        );
        assert_eq!(delete_script(&[]), "");
    }

    #[test]
    fn finds_instance_rules_by_prefix() {
        let l = parse_listing(MASQ_TABLE_JSON, "t").unwrap();
        let prefix = nft_instance_hash("nftnet", "eth1", "ctrG");
        assert_eq!(handles_with_prefix(&l, &prefix), vec![6, 7]);
        let other = nft_instance_hash("nftnet", "eth0", "ctrG");
        assert!(handles_with_prefix(&l, &other).is_empty());
    }

    #[test]
    fn gc_keeps_valid_and_foreign_rules() {
        let l = parse_listing(MASQ_TABLE_JSON, "t").unwrap();
        let keep: HashSet<String> = [nft_comment("nftnet", "eth1", "ctrG")].into();
        assert_eq!(gc_handles(&l, "nftnet", &keep), vec![11]);
        assert_eq!(gc_handles(&l, "nftnet", &HashSet::new()), vec![6, 7, 11]);
        assert!(gc_handles(&l, "othernet", &HashSet::new()).is_empty());
    }

    #[test]
    fn check_finds_rules_in_captured_listing() {
        let l = parse_listing(MASQ_TABLE_JSON, "t").unwrap();
        let comment = nft_comment("nftnet", "eth1", "ctrG");
        assert!(missing(&l, &ips(), &comment).is_empty());

        let other: Vec<IpNetwork> = vec!["10.77.0.9/24".parse().unwrap()];
        let m = missing(&l, &other, &comment);
        assert_eq!(
            m,
            vec![(
                "table inet cni_plugins_masquerade chain masq_checks".to_string(),
                format!(
                    "ip saddr == 10.77.0.9 ip daddr != 10.77.0.0/24 masquerade comment \"{comment}\""
                )
            )]
        );

        let mut no_goto = l.clone();
        no_goto.rules.retain(|r| r.handle != 10);
        assert_eq!(missing(&no_goto, &ips(), &comment).len(), 1);
    }

    #[test]
    fn comment_with_control_characters_is_refused() {
        assert!(check_comment("ok, net: a").is_ok());
        assert!(check_comment("bad\nnet").is_err());
    }

    #[test]
    fn subnet_masks_host_bits() {
        let ip: IpNetwork = "10.77.0.2/24".parse().unwrap();
        assert_eq!(subnet(&ip).to_string(), "10.77.0.0/24");
        let ip: IpNetwork = "fd00:77::2/64".parse().unwrap();
        assert_eq!(subnet(&ip).to_string(), "fd00:77::/64");
    }
}
