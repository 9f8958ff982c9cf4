//! Egress SNAT for a cluster's flat pod network (the node agent's): packets from this
//! node's pod CIDRs to anything outside the cluster leave with the node's address;
//! traffic between pods, on this node or another, keeps its source address.
//!
//! nftables: one table of its own, `inet cni_node_egress`, whose NAT postrouting chain
//! returns for multicast and for every in-cluster prefix, then masquerades each pod
//! CIDR. iptables (where nf_tables cannot be used): the same rules in a `nat` chain
//! `CNI-NODE-EGRESS` per family, jumped from POSTROUTING. The in-cluster prefixes are
//! merged first ([`aggregate`]): node pod CIDRs handed out from one cluster CIDR merge
//! into a few prefixes, so the rules a packet walks stay few.
//!
//! A change is one nf_tables transaction (flush and refill the chain) or one
//! `iptables-restore` per family, so packets see the old rules or the new, never a
//! half-written set; nothing is sent when the rules are already right.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::error::{Error, Result};
use crate::iptables::{self as ipt, Tables as _};
use crate::nfnetlink::{
    self, Batch, CMP_EQ, Expr, HOOK_POSTROUTING, Hook, NFPROTO_INET, Nfnl, PRIORITY_SRCNAT,
    VERDICT_RETURN,
};
use crate::nft_build::{Field, addr_match, verdict};
use cni_protocol::ip::{Family, from_u128, to_u128};

/// The nftables table.
pub const TABLE: &str = "cni_node_egress";
/// Its NAT postrouting chain.
pub const CHAIN: &str = "postrouting";
/// The iptables chain (both families).
pub const IPTABLES_CHAIN: &str = "CNI-NODE-EGRESS";
const TABLE_COMMENT: &str = "Egress SNAT of pod traffic leaving the cluster, managed by cni-node";
const IPTABLES_COMMENT: &str = "cni-node egress SNAT";

/// What to masquerade.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// This node's pod CIDRs: the sources that are masqueraded.
    pub sources: Vec<IpNetwork>,
    /// Destinations that are not: every node's pod CIDR and the operator's extras.
    pub exempt: Vec<IpNetwork>,
}

/// Where the rules live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressBackend {
    /// The `inet cni_node_egress` table, over netlink.
    Nftables,
    /// The `CNI-NODE-EGRESS` chains, through `iptables-restore`.
    Iptables,
}

impl EgressBackend {
    /// nftables when the kernel's nf_tables answers, else iptables when its tools work.
    pub fn detect() -> Result<Self> {
        if nfnetlink::usable() {
            Ok(Self::Nftables)
        } else if ipt::usable() {
            Ok(Self::Iptables)
        } else {
            Err(Error::InvalidInput {
                what: "firewall",
                value: "nftables, iptables".into(),
                reason: "neither nf_tables over netlink nor iptables-restore works here",
            })
        }
    }
}

/// The smallest list of prefixes covering exactly the union of `nets`: contained
/// prefixes dropped, sibling halves merged; per family, sorted, IPv4 first.
pub fn aggregate(nets: &[IpNetwork]) -> Vec<IpNetwork> {
    let mut out = Vec::new();
    for v4 in [true, false] {
        let width: u8 = if v4 { 32 } else { 128 };
        let mut ranges: Vec<(u128, u8)> = nets
            .iter()
            .filter(|n| n.is_ipv4() == v4)
            .map(|n| (to_u128(n.network()), n.prefix()))
            .collect();
        ranges.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        // Drop prefixes inside an earlier (wider or equal) one.
        let mut kept: Vec<(u128, u8)> = Vec::new();
        for (start, prefix) in ranges {
            if let Some(&(s, p)) = kept.last()
                && start >= s
                && start <= last_addr(s, p, width)
            {
                continue;
            }
            kept.push((start, prefix));
        }
        // Merge sibling halves until nothing changes (a stack does it in one pass).
        let mut stack: Vec<(u128, u8)> = Vec::new();
        for item in kept {
            stack.push(item);
            while stack.len() >= 2 {
                let (b_start, b_prefix) = stack[stack.len() - 1];
                let (a_start, a_prefix) = stack[stack.len() - 2];
                let sibling = a_prefix == b_prefix
                    && a_prefix > 0
                    && a_start & host_mask(a_prefix - 1, width) == 0
                    && b_start == a_start | (1u128 << (width - a_prefix));
                if !sibling {
                    break;
                }
                stack.truncate(stack.len() - 2);
                stack.push((a_start, a_prefix - 1));
            }
        }
        out.extend(
            stack
                .into_iter()
                .filter_map(|(start, prefix)| IpNetwork::new(from_u128(start, v4), prefix).ok()),
        );
    }
    out
}

/// The host bits of a `/prefix` in a `width`-bit address.
fn host_mask(prefix: u8, width: u8) -> u128 {
    let bits = u32::from(width - prefix);
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

fn last_addr(start: u128, prefix: u8, width: u8) -> u128 {
    start | host_mask(prefix, width)
}

/// The rules, in order, as nftables expressions.
fn nft_rules(policy: &EgressPolicy) -> Vec<Vec<Expr>> {
    let mut rules = Vec::new();
    let ret = |addr: IpAddr, prefix: u8| {
        let mut rule = addr_match(Field::Daddr, CMP_EQ, addr, prefix);
        rule.push(verdict(VERDICT_RETURN, None));
        rule
    };
    rules.push(ret(IpAddr::from([224, 0, 0, 0]), 4));
    rules.push(ret(IpAddr::from([0xff00, 0, 0, 0, 0, 0, 0, 0]), 8));
    for net in aggregate(&policy.exempt) {
        rules.push(ret(net.network(), net.prefix()));
    }
    for net in aggregate(&policy.sources) {
        let mut rule = addr_match(Field::Saddr, CMP_EQ, net.network(), net.prefix());
        rule.push(Expr::Masq { flags: 0 });
        rules.push(rule);
    }
    rules
}

fn target() -> String {
    format!("table inet {TABLE} chain {CHAIN}")
}

/// Makes the installed rules equal `policy`; returns whether anything changed.
pub fn sync(backend: EgressBackend, policy: &EgressPolicy) -> Result<bool> {
    match backend {
        EgressBackend::Nftables => sync_nftables(policy),
        EgressBackend::Iptables => sync_iptables(policy),
    }
}

fn sync_nftables(policy: &EgressPolicy) -> Result<bool> {
    let want = nft_rules(policy);
    let mut nl = Nfnl::open()?;
    let have: Vec<Vec<Expr>> = match nl.rules(NFPROTO_INET, TABLE, Some(CHAIN)) {
        Ok(rules) => rules.into_iter().map(|r| r.exprs).collect(),
        Err(e) if nfnetlink::is_not_found(&e) => Vec::new(),
        Err(e) => return Err(e),
    };
    if have == want && nl.has_chain(NFPROTO_INET, TABLE, CHAIN)? {
        return Ok(false);
    }
    let mut b = Batch::new();
    b.add_table(NFPROTO_INET, TABLE, Some(TABLE_COMMENT))?;
    let hook = Hook {
        chain_type: "nat",
        hooknum: HOOK_POSTROUTING,
        priority: PRIORITY_SRCNAT,
        policy: None,
    };
    b.add_chain(NFPROTO_INET, TABLE, CHAIN, Some(hook), None)?;
    b.flush_chain(NFPROTO_INET, TABLE, CHAIN);
    for rule in &want {
        b.add_rule(NFPROTO_INET, TABLE, CHAIN, rule, None)?;
    }
    nl.commit(b, &target())?;
    Ok(true)
}

/// The iptables rules of one family, as `iptables-save` prints them after `-A CHAIN`.
fn iptables_rules(policy: &EgressPolicy, family: Family) -> Vec<Vec<String>> {
    let v4 = family == Family::V4;
    let of_family = |nets: &[IpNetwork]| -> Vec<IpNetwork> {
        aggregate(nets)
            .into_iter()
            .filter(|n| n.is_ipv4() == v4)
            .collect()
    };
    let comment = || {
        vec![
            "-m".to_owned(),
            "comment".to_owned(),
            "--comment".to_owned(),
            IPTABLES_COMMENT.to_owned(),
        ]
    };
    let multicast = if v4 { "224.0.0.0/4" } else { "ff00::/8" };
    let mut rules = Vec::new();
    for dst in std::iter::once(multicast.to_owned())
        .chain(of_family(&policy.exempt).iter().map(ToString::to_string))
    {
        let mut r = vec!["-d".to_owned(), dst];
        r.extend(comment());
        r.extend(["-j".to_owned(), "RETURN".to_owned()]);
        rules.push(r);
    }
    for src in of_family(&policy.sources) {
        let mut r = vec!["-s".to_owned(), src.to_string()];
        r.extend(comment());
        r.extend(["-j".to_owned(), "MASQUERADE".to_owned()]);
        rules.push(r);
    }
    rules
}

fn sync_iptables(policy: &EgressPolicy) -> Result<bool> {
    let mut changed = false;
    for family in Family::ALL {
        let want = iptables_rules(policy, family);
        // The whole nat table: `-S <chain>` of a chain that does not exist fails with
        // different words in the nft and legacy variants.
        let nat = ipt::save(family)?;
        let have = nat
            .chains
            .iter()
            .any(|c| c == IPTABLES_CHAIN)
            .then_some(&nat);
        let jump = nat
            .rules
            .iter()
            .any(|r| r.chain == "POSTROUTING" && r.args.iter().any(|a| a == IPTABLES_CHAIN));
        let same = have.as_ref().is_some_and(|t| {
            let have: Vec<&Vec<String>> = t
                .rules
                .iter()
                .filter(|r| r.chain == IPTABLES_CHAIN)
                .map(|r| &r.args)
                .collect();
            have == want.iter().collect::<Vec<_>>()
        });
        if same && jump {
            continue;
        }
        let mut input = String::from("*nat\n");
        input.push_str(&format!(":{IPTABLES_CHAIN} - [0:0]\n"));
        input.push_str(&format!("-F {IPTABLES_CHAIN}\n"));
        for rule in &want {
            input.push_str(&ipt::line(&format!("-A {IPTABLES_CHAIN}"), rule));
        }
        if !jump {
            input.push_str(&ipt::line(
                "-A POSTROUTING",
                &ipt::strings(&[
                    "-m",
                    "comment",
                    "--comment",
                    IPTABLES_COMMENT,
                    "-j",
                    IPTABLES_CHAIN,
                ]),
            ));
        }
        input.push_str("COMMIT\n");
        ipt::restore(
            family,
            &input,
            &format!("{} nat {IPTABLES_CHAIN}", family.name()),
        )?;
        changed = true;
    }
    Ok(changed)
}

/// Removes the table (nftables) or the chains and their jumps (iptables); nothing to
/// do when they are absent.
pub fn remove(backend: EgressBackend) -> Result<()> {
    match backend {
        EgressBackend::Nftables => {
            let mut nl = Nfnl::open()?;
            if !nl.has_table(NFPROTO_INET, TABLE)? {
                return Ok(());
            }
            let mut b = Batch::new();
            b.delete_table(NFPROTO_INET, TABLE);
            nl.commit(b, &format!("table inet {TABLE}"))
        }
        EgressBackend::Iptables => {
            for family in Family::ALL {
                let nat = ipt::save(family)?;
                if !nat.chains.iter().any(|c| c == IPTABLES_CHAIN) {
                    continue;
                }
                let mut input = String::from("*nat\n");
                for rule in &nat.rules {
                    if rule.chain == "POSTROUTING" && rule.args.iter().any(|a| a == IPTABLES_CHAIN)
                    {
                        input.push_str(&ipt::line("-D POSTROUTING", &rule.args));
                    }
                }
                input.push_str(&format!(
                    "-F {IPTABLES_CHAIN}\n-X {IPTABLES_CHAIN}\nCOMMIT\n"
                ));
                ipt::restore(
                    family,
                    &input,
                    &format!("{} nat {IPTABLES_CHAIN}", family.name()),
                )?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNetwork> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    fn text(list: Vec<IpNetwork>) -> Vec<String> {
        list.into_iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn aggregation_merges_siblings_and_drops_contained() {
        assert_eq!(
            text(aggregate(&nets(&[
                "10.244.1.0/24",
                "10.244.0.0/24",
                "10.244.2.0/24",
                "10.244.3.0/24",
                "10.244.3.128/25",
                "fd00:244:0:1::/64",
                "fd00:244::/64",
                "10.9.0.0/16",
            ]))),
            ["10.9.0.0/16", "10.244.0.0/22", "fd00:244::/63"]
        );
        assert_eq!(
            text(aggregate(&nets(&[
                "0.0.0.0/1",
                "128.0.0.0/1",
                "::/0",
                "1::/64"
            ]))),
            ["0.0.0.0/0", "::/0"]
        );
        assert_eq!(
            text(aggregate(&nets(&[
                "10.0.0.1/32",
                "10.0.0.0/32",
                "10.0.0.3/32"
            ]))),
            ["10.0.0.0/31", "10.0.0.3/32"]
        );
        // Not siblings: 10.0.1.0/24 and 10.0.2.0/24 are in different /23s.
        assert_eq!(
            text(aggregate(&nets(&["10.0.1.0/24", "10.0.2.0/24"]))),
            ["10.0.1.0/24", "10.0.2.0/24"]
        );
    }

    #[test]
    fn aggregation_covers_exactly_the_union() {
        // Pseudo-random /24../28 prefixes in 10.0.0.0/16, checked address by address.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20 {
            let input: Vec<IpNetwork> = (0..40)
                .map(|_| {
                    let prefix = 24 + (next() % 5) as u8;
                    let addr = 0x0a00_0000u32 | (next() as u32 & 0xffff);
                    let net = IpNetwork::new(IpAddr::from(addr.to_be_bytes()), prefix).unwrap();
                    IpNetwork::new(net.network(), prefix).unwrap()
                })
                .collect();
            let out = aggregate(&input);
            for host in 0..=0xffffu32 {
                let ip = IpAddr::from((0x0a00_0000 | host).to_be_bytes());
                assert_eq!(
                    input.iter().any(|n| n.contains(ip)),
                    out.iter().any(|n| n.contains(ip)),
                    "{ip}: {input:?} -> {out:?}"
                );
            }
            // Minimal: no two outputs overlap or are mergeable siblings.
            assert_eq!(aggregate(&out), out);
        }
    }

    #[test]
    fn iptables_rules_per_family() {
        let policy = EgressPolicy {
            sources: nets(&["10.244.1.0/24", "fd00:244:0:1::/64"]),
            exempt: nets(&["10.244.1.0/24", "10.244.0.0/24", "fd00:244::/48"]),
        };
        let v4: Vec<String> = iptables_rules(&policy, Family::V4)
            .iter()
            .map(|r| ipt::line("-A CNI-NODE-EGRESS", r))
            .collect();
        assert_eq!(
            v4,
            [
                "-A CNI-NODE-EGRESS -d 224.0.0.0/4 -m comment --comment \"cni-node egress SNAT\" -j RETURN\n",
                "-A CNI-NODE-EGRESS -d 10.244.0.0/23 -m comment --comment \"cni-node egress SNAT\" -j RETURN\n",
                "-A CNI-NODE-EGRESS -s 10.244.1.0/24 -m comment --comment \"cni-node egress SNAT\" -j MASQUERADE\n",
            ]
        );
        assert_eq!(iptables_rules(&policy, Family::V6).len(), 3);
    }

    #[test]
    fn nftables_rules_return_for_multicast_and_the_cluster_then_masquerade() {
        let policy = EgressPolicy {
            sources: nets(&["10.244.1.0/24"]),
            exempt: nets(&["10.244.0.0/16", "fd00::/48"]),
        };
        let rules = nft_rules(&policy);
        assert_eq!(rules.len(), 5);
        assert!(matches!(rules[4].last(), Some(Expr::Masq { .. })));
        assert!(
            rules[..4]
                .iter()
                .all(|r| matches!(r.last(), Some(Expr::Immediate { .. })))
        );
    }
}
