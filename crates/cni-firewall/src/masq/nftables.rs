//! The nftables masquerade backend (table `inet cni_plugins_masquerade`).
//!
//! Layout, comments and rules are those of the reference plugins, so the
//! reference can clean up after us and vice versa. Each attachment owns the
//! rules in `masq_checks` whose comment starts with its instance hash; the
//! base chain `postrouting` is shared and rewritten by every setup, always in
//! the same transaction as the attachment's rules, so two concurrent setups
//! both leave a complete table behind.
//!
//! Changes are nf_tables transactions sent over netlink ([`crate::nfnetlink`])
//! with the expressions `nft` itself generates for the reference's rule texts
//! (shown in the docs below), so `nft list` prints the same table either way.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::error::{Error, Result};
use crate::naming::{nft_comment, nft_instance_hash, nft_network_hash};
use crate::nfnetlink::{
    self, Batch, CMP_EQ, CMP_NEQ, Expr, HOOK_POSTROUTING, Hook, NFPROTO_INET, Nfnl,
    PRIORITY_SRCNAT, Rule, VERDICT_GOTO, VERDICT_RETURN,
};
use crate::nft_build::{Field, addr_match, verdict};

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
/// Deletions per transaction in GC: every message is acknowledged, and the
/// acknowledgements of one transaction must fit the socket's receive buffer.
const DELETES_PER_BATCH: usize = 64;

fn target() -> String {
    format!("table {FAMILY} {TABLE} chain {MASQ_CHAIN}")
}

/// `ip saddr == <ip> ip daddr != <subnet> masquerade`, the reference's rule
/// text (used in messages).
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

/// The reference refuses comments nft's quoted strings cannot carry; so do
/// we, so both accept the same configurations.
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

/// The expressions of [`rule_body`]: `meta nfproto`, the source address,
/// the destination outside the subnet, `masq`.
fn masq_rule(ip: &IpNetwork) -> Vec<Expr> {
    let net = subnet(ip);
    let host = if ip.is_ipv4() { 32 } else { 128 };
    let mut out = addr_match(Field::Saddr, CMP_EQ, ip.ip(), host);
    // nft does not repeat the protocol check within one rule.
    out.extend(
        addr_match(Field::Daddr, CMP_NEQ, net.ip(), net.prefix())
            .into_iter()
            .skip(2),
    );
    out.push(Expr::Masq { flags: 0 });
    out
}

/// The rules of `postrouting`: `ip daddr == 224.0.0.0/4 return`,
/// `ip6 daddr == ff00::/8 return`, `goto masq_checks`.
fn postrouting_rules() -> [Vec<Expr>; 3] {
    let multicast = |addr: IpAddr, prefix| {
        let mut rule = addr_match(Field::Daddr, CMP_EQ, addr, prefix);
        rule.push(verdict(VERDICT_RETURN, None));
        rule
    };
    [
        multicast(IpAddr::from([224, 0, 0, 0]), 4),
        multicast(IpAddr::from([0xff00, 0, 0, 0, 0, 0, 0, 0]), 8),
        vec![verdict(VERDICT_GOTO, Some(MASQ_CHAIN))],
    ]
}

/// The whole setup transaction: ensure table and chains, rewrite the shared
/// base chain, replace this attachment's rules (`stale` handles) with one
/// rule per IP. The same as the reference's nft script:
///
/// ```text
/// add table inet cni_plugins_masquerade { comment "..." ; }
/// add chain inet cni_plugins_masquerade masq_checks { comment "..." ; }
/// add chain inet cni_plugins_masquerade postrouting { type nat hook postrouting priority srcnat ; }
/// flush chain inet cni_plugins_masquerade postrouting
/// add rule inet cni_plugins_masquerade postrouting ip daddr == 224.0.0.0/4 return
/// add rule inet cni_plugins_masquerade postrouting ip6 daddr == ff00::/8 return
/// add rule inet cni_plugins_masquerade postrouting goto masq_checks
/// delete rule inet cni_plugins_masquerade masq_checks handle <stale>...
/// add rule inet cni_plugins_masquerade masq_checks <rule_body> comment "<comment>"...
/// ```
#[cfg(test)]
pub(crate) fn setup_batch(stale: &[u64], ips: &[IpNetwork], comment: &str) -> Result<Batch> {
    let mut b = Batch::new();
    fill_setup_batch(&mut b, stale, ips, comment, true)?;
    Ok(b)
}

/// The setup transaction's changes; the table and chains are (re)made and
/// `postrouting` is flushed and rewritten when `scaffolding`.
fn fill_setup_batch(
    b: &mut Batch,
    stale: &[u64],
    ips: &[IpNetwork],
    comment: &str,
    scaffolding: bool,
) -> Result<()> {
    if scaffolding {
        b.add_table(NFPROTO_INET, TABLE, Some(TABLE_COMMENT))?;
        b.add_chain(NFPROTO_INET, TABLE, MASQ_CHAIN, None, Some(CHAIN_COMMENT))?;
        let hook = Hook {
            chain_type: "nat",
            hooknum: HOOK_POSTROUTING,
            priority: PRIORITY_SRCNAT,
            policy: None,
        };
        b.add_chain(NFPROTO_INET, TABLE, POSTROUTING_CHAIN, Some(hook), None)?;
        b.flush_chain(NFPROTO_INET, TABLE, POSTROUTING_CHAIN);
        for rule in postrouting_rules() {
            b.add_rule(NFPROTO_INET, TABLE, POSTROUTING_CHAIN, &rule, None)?;
        }
    }
    for handle in stale {
        b.delete_rule(NFPROTO_INET, TABLE, MASQ_CHAIN, *handle);
    }
    for ip in ips {
        b.add_rule(
            NFPROTO_INET,
            TABLE,
            MASQ_CHAIN,
            &masq_rule(ip),
            Some(comment),
        )?;
    }
    Ok(())
}

/// Deletes `masq_checks` rules by handle.
fn delete_batch(handles: &[u64]) -> Batch {
    let mut b = Batch::new();
    for handle in handles {
        b.delete_rule(NFPROTO_INET, TABLE, MASQ_CHAIN, *handle);
    }
    b
}

/// Handles of `masq_checks` rules whose comment starts with `prefix`.
pub(crate) fn handles_with_prefix(rules: &[Rule], prefix: &str) -> Vec<u64> {
    rules
        .iter()
        .filter(|r| r.chain == MASQ_CHAIN)
        .filter(|r| r.comment.as_deref().is_some_and(|c| c.starts_with(prefix)))
        .map(|r| r.handle)
        .collect()
}

/// Handles of this network's rules whose comment is not one of `keep`.
pub(crate) fn gc_handles(rules: &[Rule], network: &str, keep: &HashSet<String>) -> Vec<u64> {
    let prefix = format!("{}-", nft_network_hash(network));
    rules
        .iter()
        .filter(|r| r.chain == MASQ_CHAIN)
        .filter(|r| {
            r.comment
                .as_deref()
                .is_some_and(|c| c.starts_with(&prefix) && !keep.contains(c))
        })
        .map(|r| r.handle)
        .collect()
}

/// What CHECK finds missing, in nft syntax (empty when all is in place).
pub(crate) fn missing(rules: &[Rule], ips: &[IpNetwork], comment: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let has_goto = rules
        .iter()
        .any(|r| r.chain == POSTROUTING_CHAIN && r.jump_target() == Some(MASQ_CHAIN));
    if !has_goto {
        out.push((
            format!("table {FAMILY} {TABLE} chain {POSTROUTING_CHAIN}"),
            format!("goto {MASQ_CHAIN}"),
        ));
    }
    for ip in ips {
        let want = masq_rule(ip);
        let found = rules.iter().any(|r| {
            r.chain == MASQ_CHAIN && r.comment.as_deref() == Some(comment) && r.exprs == want
        });
        if !found {
            out.push((target(), format!("{} comment \"{comment}\"", rule_body(ip))));
        }
    }
    out
}

fn masq_chain_rules(nl: &mut Nfnl) -> Result<Vec<Rule>> {
    nl.rules(NFPROTO_INET, TABLE, Some(MASQ_CHAIN))
}

/// Deletes `handles` of `masq_checks` in transactions of bounded size.
fn delete_handles(nl: &mut Nfnl, handles: &[u64]) -> Result<()> {
    for chunk in handles.chunks(DELETES_PER_BATCH) {
        nl.commit(delete_batch(chunk), &target())?;
    }
    Ok(())
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
    let mut nl = Nfnl::open()?;
    // Re-adding an existing chain or rewriting the shared `postrouting` chain makes
    // the process wait a grace period (8-20 ms) when its netfilter socket closes;
    // adding rules does not. So when the table and both chains are already as they
    // must be, the transaction only adds the attachment's rules, pinned to the
    // generation they were read at: a concurrent change makes the kernel refuse it,
    // and we read again. The last attempt writes everything unpinned, which is
    // right whatever happened in between. A handle we
    // read can also vanish before our transaction runs (a concurrent DEL/GC of the
    // same attachment); the transaction then fails as a whole and a fresh read
    // fixes it.
    const ATTEMPTS: usize = 4;
    let mut attempt = 1;
    loop {
        let last = attempt == ATTEMPTS;
        let generation = nl.generation_id()?;
        let rules = match nl.rules(NFPROTO_INET, TABLE, None) {
            Ok(rules) => rules,
            Err(e) if nfnetlink::is_not_found(&e) => Vec::new(),
            Err(e) => return Err(e),
        };
        let stale = handles_with_prefix(&rules, &prefix);
        // A right `postrouting` also proves `masq_checks` exists: it jumps there.
        let in_place = !last && postrouting_in_place(&rules);
        let mut batch = if in_place {
            Batch::at_generation(generation)
        } else {
            Batch::new()
        };
        fill_setup_batch(&mut batch, &stale, ips, &comment, !in_place)?;
        match nl.commit(batch, &target()) {
            Err(e) if !last && nfnetlink::is_restart(&e) => {}
            Err(_) if !last && !stale.is_empty() => {}
            other => return other,
        }
        attempt += 1;
    }
}

/// Whether `postrouting` holds exactly the rules a setup writes, in order.
fn postrouting_in_place(rules: &[Rule]) -> bool {
    let present: Vec<&Vec<Expr>> = rules
        .iter()
        .filter(|r| r.chain == POSTROUTING_CHAIN)
        .map(|r| &r.exprs)
        .collect();
    let wanted = postrouting_rules();
    present.len() == wanted.len() && present.iter().zip(&wanted).all(|(p, w)| *p == w)
}

/// Removes the attachment's rules; a missing table means nothing to do.
pub(crate) fn teardown(
    nl: &mut Nfnl,
    network: &str,
    ifname: &str,
    container_id: &str,
) -> Result<()> {
    let prefix = nft_instance_hash(network, ifname, container_id);
    // Retried like setup: a concurrent DEL of the same attachment may delete
    // a rule between our read and our transaction.
    let mut attempts_left = 3;
    loop {
        let handles = handles_with_prefix(&masq_chain_rules(nl)?, &prefix);
        if handles.is_empty() {
            return Ok(());
        }
        match delete_handles(nl, &handles) {
            Err(e) if nfnetlink_not_found(&e) && attempts_left > 1 => attempts_left -= 1,
            other => return other,
        }
    }
}

/// Whether every error in `e` is "no such object".
fn nfnetlink_not_found(e: &Error) -> bool {
    match e {
        Error::Multiple(all) => all.iter().all(nfnetlink::is_not_found),
        e => nfnetlink::is_not_found(e),
    }
}

/// Verifies the attachment's rules are installed.
pub(crate) fn check(
    network: &str,
    ifname: &str,
    container_id: &str,
    ips: &[IpNetwork],
) -> Result<()> {
    let comment = nft_comment(network, ifname, container_id);
    let mut nl = Nfnl::open()?;
    if !nl.has_table(NFPROTO_INET, TABLE)? {
        return Err(Error::Missing {
            backend: "nftables",
            target: format!("{FAMILY} ruleset"),
            what: format!("table {FAMILY} {TABLE}"),
        });
    }
    let rules = nl.rules(NFPROTO_INET, TABLE, None)?;
    let errors = missing(&rules, ips, &comment)
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
pub(crate) fn gc(nl: &mut Nfnl, network: &str, valid: &[(&str, &str)]) -> Result<()> {
    let keep = valid
        .iter()
        .map(|(cid, ifname)| nft_comment(network, ifname, cid))
        .collect();
    let handles = gc_handles(&masq_chain_rules(nl)?, network, &keep);
    delete_handles(nl, &handles)
}

/// Whether nftables works here (the kernel answers nf_tables requests and
/// we may make them).
pub(crate) fn usable() -> bool {
    nfnetlink::usable()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfnetlink::{BASE_NETWORK, REG_1};
    use crate::nft_build::nfproto;

    fn ips() -> Vec<IpNetwork> {
        vec![
            "10.77.0.2/24".parse().unwrap(),
            "fd00:77::2/64".parse().unwrap(),
        ]
    }

    fn load(offset: u32, len: u32) -> Expr {
        Expr::Payload {
            dreg: REG_1,
            base: BASE_NETWORK,
            offset,
            len,
        }
    }

    fn cmp(op: u32, data: &[u8]) -> Expr {
        Expr::Cmp {
            sreg: REG_1,
            op,
            data: data.to_vec(),
        }
    }

    /// What `nft --debug=netlink` shows for the reference's rule texts
    /// (nft 1.0.6), e.g. for `ip saddr == 10.77.0.2 ip daddr != 10.77.0.0/24
    /// masquerade`: meta load nfproto, cmp eq 2, payload load 4b @ network
    /// header + 12, cmp eq 10.77.0.2, payload load 3b @ + 16, cmp neq
    /// 10.77.0, masq.
    #[test]
    fn rules_are_what_nft_generates() {
        let [v4, v6] = nfproto("10.0.0.1".parse().unwrap()).map(Some);
        let [m, c4] = [v4.unwrap(), v6.unwrap()];
        let c6 = cmp(CMP_EQ, &[10]);
        let v4_rule = masq_rule(&"10.77.0.2/24".parse().unwrap());
        assert_eq!(
            v4_rule,
            vec![
                m.clone(),
                c4.clone(),
                load(12, 4),
                cmp(CMP_EQ, &[10, 77, 0, 2]),
                load(16, 3),
                cmp(CMP_NEQ, &[10, 77, 0]),
                Expr::Masq { flags: 0 },
            ]
        );
        let v6_rule = masq_rule(&"fd00:77::2/64".parse().unwrap());
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&[0xfd, 0, 0, 0x77]);
        let mut host = addr;
        host[15] = 2;
        assert_eq!(
            v6_rule,
            vec![
                m.clone(),
                c6.clone(),
                load(8, 16),
                cmp(CMP_EQ, &host),
                load(24, 8),
                cmp(CMP_NEQ, &addr[..8]),
                Expr::Masq { flags: 0 },
            ]
        );
        // Not byte-aligned: whole address, masked (`ip daddr != 10.77.0.0/20`).
        let r = masq_rule(&"10.77.3.4/20".parse().unwrap());
        assert_eq!(
            r[4..7],
            [
                load(16, 4),
                Expr::Bitwise {
                    sreg: REG_1,
                    dreg: REG_1,
                    len: 4,
                    mask: vec![255, 255, 240, 0],
                    xor: vec![0; 4],
                },
                cmp(CMP_NEQ, &[10, 77, 0, 0]),
            ]
        );
        // A host route: the whole address, no mask.
        let r = masq_rule(&"10.77.3.4/32".parse().unwrap());
        assert_eq!(r[4..6], [load(16, 4), cmp(CMP_NEQ, &[10, 77, 3, 4])]);
        // /0 is masked with zeros, as nft does.
        let r = masq_rule(&"10.77.3.4/0".parse().unwrap());
        assert!(matches!(&r[5], Expr::Bitwise { mask, .. } if mask == &vec![0; 4]));

        let [multicast4, multicast6, goto] = postrouting_rules();
        assert_eq!(
            multicast4,
            vec![
                m.clone(),
                c4,
                load(16, 4),
                Expr::Bitwise {
                    sreg: REG_1,
                    dreg: REG_1,
                    len: 4,
                    mask: vec![0xf0, 0, 0, 0],
                    xor: vec![0; 4],
                },
                cmp(CMP_EQ, &[0xe0, 0, 0, 0]),
                verdict(VERDICT_RETURN, None),
            ]
        );
        assert_eq!(
            multicast6,
            vec![
                m,
                c6,
                load(24, 1),
                cmp(CMP_EQ, &[0xff]),
                verdict(VERDICT_RETURN, None)
            ]
        );
        assert_eq!(goto, vec![verdict(VERDICT_GOTO, Some("masq_checks"))]);
    }

    #[test]
    fn setup_batch_has_every_step() {
        let comment = nft_comment("nftnet", "eth1", "ctrG");
        let b = setup_batch(&[6, 7], &ips(), &comment).unwrap();
        // table, 2 chains, flush, 3 postrouting rules, 2 deletes, 2 rules.
        assert_eq!(b.len(), 11);
        assert_eq!(delete_batch(&[1, 2, 3]).len(), 3);
    }

    fn rule(chain: &str, handle: u64, comment: Option<&str>, exprs: Vec<Expr>) -> Rule {
        Rule {
            chain: chain.into(),
            handle,
            comment: comment.map(Into::into),
            exprs,
        }
    }

    /// The table after a setup of `nftnet`/`eth1`/`ctrG` and of another
    /// attachment, as the dump returns it.
    fn table() -> Vec<Rule> {
        let g = nft_comment("nftnet", "eth1", "ctrG");
        let other = "e47d63df51ce7720-0123456789abcdef, net: nftnet, if: eth0, id: other";
        let [m4, m6, goto] = postrouting_rules();
        vec![
            rule(MASQ_CHAIN, 6, Some(&g), masq_rule(&ips()[0])),
            rule(MASQ_CHAIN, 7, Some(&g), masq_rule(&ips()[1])),
            rule(
                MASQ_CHAIN,
                11,
                Some(other),
                masq_rule(&"10.77.0.3/24".parse().unwrap()),
            ),
            rule(POSTROUTING_CHAIN, 8, None, m4),
            rule(POSTROUTING_CHAIN, 9, None, m6),
            rule(POSTROUTING_CHAIN, 10, None, goto),
        ]
    }

    #[test]
    fn finds_instance_rules_by_prefix() {
        let prefix = nft_instance_hash("nftnet", "eth1", "ctrG");
        assert_eq!(handles_with_prefix(&table(), &prefix), vec![6, 7]);
        let other = nft_instance_hash("nftnet", "eth0", "ctrG");
        assert!(handles_with_prefix(&table(), &other).is_empty());
    }

    #[test]
    fn gc_keeps_valid_and_foreign_rules() {
        let keep: HashSet<String> = [nft_comment("nftnet", "eth1", "ctrG")].into();
        assert_eq!(gc_handles(&table(), "nftnet", &keep), vec![11]);
        assert_eq!(
            gc_handles(&table(), "nftnet", &HashSet::new()),
            vec![6, 7, 11]
        );
        assert!(gc_handles(&table(), "othernet", &HashSet::new()).is_empty());
    }

    #[test]
    fn check_finds_rules() {
        let comment = nft_comment("nftnet", "eth1", "ctrG");
        assert!(missing(&table(), &ips(), &comment).is_empty());

        let other: Vec<IpNetwork> = vec!["10.77.0.9/24".parse().unwrap()];
        let m = missing(&table(), &other, &comment);
        assert_eq!(
            m,
            vec![(
                "table inet cni_plugins_masquerade chain masq_checks".to_string(),
                format!(
                    "ip saddr == 10.77.0.9 ip daddr != 10.77.0.0/24 masquerade comment \"{comment}\""
                )
            )]
        );

        let mut no_goto = table();
        no_goto.retain(|r| r.handle != 10);
        assert_eq!(missing(&no_goto, &ips(), &comment).len(), 1);

        // Same comment, different rule (e.g. edited by hand): missing.
        let mut changed = table();
        changed[0].exprs.pop();
        assert_eq!(missing(&changed, &ips(), &comment).len(), 1);
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
