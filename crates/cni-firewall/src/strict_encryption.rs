//! The node agent's strict encryption (`cni-node --encryption-strict`): pod traffic
//! between nodes never crosses in clear. One table of its own, `inet
//! cni_node_encryption`, whose forward chain drops
//!
//! - what this node's pods send to another node's pod CIDR through any link but the
//!   WireGuard device (a peer without a key, or no WireGuard on this node: dropped,
//!   never sent in clear), and
//! - what arrives for this node's pods from the pod CIDR of a node that publishes a
//!   key through any link but the device (clear traffic from a node expected to
//!   encrypt).
//!
//! Node to node traffic and a pod's traffic with its own node are not matched. A
//! change is one transaction (flush and refill the chain); nothing is sent when the
//! rules are already right.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::egress::aggregate;
use crate::error::Result;
use crate::nfnetlink::{
    self, Batch, CMP_EQ, CMP_NEQ, Expr, Hook, NFPROTO_INET, Nfnl, REG_1, VERDICT_DROP,
};
use crate::nft_build::{Field, addr_match, verdict};

/// The nftables table.
pub const TABLE: &str = "cni_node_encryption";
/// Its forward chain.
pub const CHAIN: &str = "forward";
const TABLE_COMMENT: &str =
    "Drops pod traffic between nodes that is not encrypted, managed by cni-node";
/// `NF_INET_FORWARD`.
const HOOK_FORWARD: u32 = 2;
/// `NFT_META_OIFNAME`.
const META_OIFNAME: u32 = 7;
/// `NFT_META_IIFNAME`.
const META_IIFNAME: u32 = 6;

/// What the strict rules hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StrictPolicy {
    /// The WireGuard device: the one link pod traffic between nodes may use.
    pub device: String,
    /// This node's pod CIDRs.
    pub own: Vec<IpNetwork>,
    /// Every other node's pod CIDRs.
    pub remote: Vec<IpNetwork>,
    /// The pod CIDRs of the other nodes that publish a key.
    pub expected: Vec<IpNetwork>,
}

/// `meta iifname|oifname != "<device>"`.
fn not_through(key: u32, device: &str) -> [Expr; 2] {
    let mut name = device.as_bytes().to_vec();
    name.resize(16, 0);
    [
        Expr::Meta { key, dreg: REG_1 },
        Expr::Cmp {
            sreg: REG_1,
            op: CMP_NEQ,
            data: name,
        },
    ]
}

fn same_family(a: &IpNetwork, b: &IpNetwork) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

fn prefix_match(field: Field, net: &IpNetwork) -> Vec<Expr> {
    let addr: IpAddr = net.network();
    addr_match(field, CMP_EQ, addr, net.prefix())
}

/// The chain's rules.
fn rules(policy: &StrictPolicy) -> Vec<Vec<Expr>> {
    let own = aggregate(&policy.own);
    let mut out = Vec::new();
    for src in &own {
        for dst in aggregate(&policy.remote)
            .iter()
            .filter(|d| same_family(d, src))
        {
            let mut rule = Vec::from(not_through(META_OIFNAME, &policy.device));
            rule.extend(prefix_match(Field::Saddr, src));
            rule.extend(prefix_match(Field::Daddr, dst));
            rule.push(verdict(VERDICT_DROP, None));
            out.push(rule);
        }
    }
    for dst in &own {
        for src in aggregate(&policy.expected)
            .iter()
            .filter(|s| same_family(s, dst))
        {
            let mut rule = Vec::from(not_through(META_IIFNAME, &policy.device));
            rule.extend(prefix_match(Field::Saddr, src));
            rule.extend(prefix_match(Field::Daddr, dst));
            rule.push(verdict(VERDICT_DROP, None));
            out.push(rule);
        }
    }
    out
}

/// Makes the table hold `policy`'s rules; returns whether anything changed.
pub fn sync(policy: &StrictPolicy) -> Result<bool> {
    let want = rules(policy);
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
        chain_type: "filter",
        hooknum: HOOK_FORWARD,
        priority: 0,
        policy: None,
    };
    b.add_chain(NFPROTO_INET, TABLE, CHAIN, Some(hook), None)?;
    b.flush_chain(NFPROTO_INET, TABLE, CHAIN);
    for rule in &want {
        b.add_rule(NFPROTO_INET, TABLE, CHAIN, rule, None)?;
    }
    nl.commit(b, &format!("table inet {TABLE} chain {CHAIN}"))?;
    Ok(true)
}

/// Removes the table; nothing to do when it is absent, or when this kernel has no
/// usable nf_tables (then there can be none: an iptables-only host never had strict
/// mode). Returns whether it was there.
pub fn remove() -> Result<bool> {
    if !nfnetlink::usable() {
        return Ok(false);
    }
    let mut nl = Nfnl::open()?;
    if !nl.has_table(NFPROTO_INET, TABLE)? {
        return Ok(false);
    }
    let mut b = Batch::new();
    b.delete_table(NFPROTO_INET, TABLE);
    nl.commit(b, &format!("table inet {TABLE}"))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNetwork> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn one_rule_per_own_and_remote_prefix_of_a_family() {
        let policy = StrictPolicy {
            device: "cni-wg0".into(),
            own: nets(&["10.244.1.0/24", "fd00:244:0:1::/64"]),
            remote: nets(&["10.244.2.0/24", "10.244.3.0/24", "fd00:244:0:2::/64"]),
            expected: nets(&["10.244.2.0/24"]),
        };
        let rules = rules(&policy);
        // 10.244.2.0/24 and 10.244.3.0/24 merge into 10.244.2.0/23: one IPv4 rule, one
        // IPv6 rule out; one rule in.
        assert_eq!(rules.len(), 3, "{rules:#?}");
        let mut name = b"cni-wg0".to_vec();
        name.resize(16, 0);
        assert_eq!(
            rules[0][..2],
            [
                Expr::Meta {
                    key: META_OIFNAME,
                    dreg: REG_1
                },
                Expr::Cmp {
                    sreg: REG_1,
                    op: CMP_NEQ,
                    data: name.clone()
                }
            ]
        );
        assert_eq!(
            rules[2][0],
            Expr::Meta {
                key: META_IIFNAME,
                dreg: REG_1
            }
        );
        assert!(
            rules
                .iter()
                .all(|r| r.last() == Some(&verdict(VERDICT_DROP, None)))
        );
        // Nothing of this node's: no rule (no pod traffic to judge).
        assert!(
            super::rules(&StrictPolicy {
                own: Vec::new(),
                ..policy
            })
            .is_empty()
        );
    }
}
