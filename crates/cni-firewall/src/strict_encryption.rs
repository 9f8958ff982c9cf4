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
//! Each is one rule per family and one lookup, whatever the number of nodes: the pairs
//! (source range, destination range) are elements of an interval set keyed by
//! `ip saddr . ip daddr` (`out4`, `in4`, `out6`, `in6`). Node to node traffic and a
//! pod's traffic with its own node are not matched. A change replaces the table in one
//! transaction; nothing is sent when the rules and elements are already right.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::egress::aggregate;
use crate::error::Result;
use crate::nfnetlink::{
    self, BASE_NETWORK, Batch, CMP_NEQ, Element, Expr, Hook, NFPROTO_INET, Nfnl, REG_1, REG_2,
    SetSpec, TYPE_IP6ADDR, TYPE_IPADDR, VERDICT_DROP,
};
use crate::nft_build::{addr_bytes, nfproto, verdict};
use cni_protocol::ip::{bounds, from_u128};

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
/// nft's 32-bit register right after an IPv4 address in register 1.
const REG32_01: u32 = 9;
/// The field lengths of the sets' keys: source address, destination address.
const FIELDS_V4: [u32; 2] = [4, 4];
const FIELDS_V6: [u32; 2] = [16, 16];

/// The sets: name, IPv6, outgoing (else incoming).
const SETS: [(&str, bool, bool); 4] = [
    ("out4", false, true),
    ("in4", false, false),
    ("out6", true, true),
    ("in6", true, false),
];

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

fn spec(name: &str, v6: bool) -> SetSpec<'_> {
    let (ty, fields): (u32, &'static [u32]) = if v6 {
        (TYPE_IP6ADDR, &FIELDS_V6)
    } else {
        (TYPE_IPADDR, &FIELDS_V4)
    };
    SetSpec {
        name,
        key_type: (ty << 6) | ty,
        key_len: fields.iter().sum(),
        fields,
        interval: true,
        verdict_map: false,
        key_byteorder: 0,
    }
}

/// `[io]ifname != "<device>" ip[6] saddr . ip[6] daddr @<set> drop`.
fn rule(set: &str, v6: bool, out: bool, device: &str) -> Vec<Expr> {
    let (len, saddr, daddr, second) = if v6 {
        (16, 8, 24, REG_2)
    } else {
        (4, 12, 16, REG32_01)
    };
    let sample: IpAddr = if v6 {
        IpAddr::from([0u16; 8])
    } else {
        IpAddr::from([0u8; 4])
    };
    let mut e = Vec::from(not_through(
        if out { META_OIFNAME } else { META_IIFNAME },
        device,
    ));
    e.extend(nfproto(sample));
    e.extend([
        Expr::Payload {
            dreg: REG_1,
            base: BASE_NETWORK,
            offset: saddr,
            len,
        },
        Expr::Payload {
            dreg: second,
            base: BASE_NETWORK,
            offset: daddr,
            len,
        },
        Expr::Lookup {
            sreg: REG_1,
            dreg: None,
            set: set.to_owned(),
            invert: false,
        },
        verdict(VERDICT_DROP, None),
    ]);
    e
}

/// The elements of one set: every (source range, destination range) pair of the
/// family, sorted.
fn elements(sources: &[IpNetwork], destinations: &[IpNetwork], v6: bool) -> Vec<Element> {
    let of = |nets: &[IpNetwork]| -> Vec<(IpAddr, IpAddr)> {
        aggregate(nets)
            .into_iter()
            .filter(|n| n.is_ipv6() == v6)
            .map(|n| {
                let (first, last) = bounds(n);
                (from_u128(first, !v6), from_u128(last, !v6))
            })
            .collect()
    };
    let mut out = Vec::new();
    for (s_first, s_last) in of(sources) {
        for &(d_first, d_last) in &of(destinations) {
            let mut key = addr_bytes(s_first);
            key.extend(addr_bytes(d_first));
            let mut end = addr_bytes(s_last);
            end.extend(addr_bytes(d_last));
            out.push(Element {
                key,
                key_end: Some(end),
                ..Element::default()
            });
        }
    }
    out.sort_by(|a, b| (&a.key, &a.key_end).cmp(&(&b.key, &b.key_end)));
    out
}

/// A set as it should be: name, IPv6, elements.
type WantedSet = (&'static str, bool, Vec<Element>);

/// The chain's rules and each set's elements.
fn want(policy: &StrictPolicy) -> (Vec<Vec<Expr>>, Vec<WantedSet>) {
    let mut rules = Vec::new();
    let mut sets = Vec::new();
    for (name, v6, out) in SETS {
        rules.push(rule(name, v6, out, &policy.device));
        let elems = if out {
            elements(&policy.own, &policy.remote, v6)
        } else {
            elements(&policy.expected, &policy.own, v6)
        };
        sets.push((name, v6, elems));
    }
    (rules, sets)
}

/// Makes the table hold `policy`'s rules; returns whether anything changed.
pub fn sync(policy: &StrictPolicy) -> Result<bool> {
    let (rules, sets) = want(policy);
    let mut nl = Nfnl::open()?;
    let have: Vec<Vec<Expr>> = match nl.rules(NFPROTO_INET, TABLE, Some(CHAIN)) {
        Ok(rules) => rules.into_iter().map(|r| r.exprs).collect(),
        Err(e) if nfnetlink::is_not_found(&e) => Vec::new(),
        Err(e) => return Err(e),
    };
    let exists = nl.has_table(NFPROTO_INET, TABLE)?;
    if have == rules && nl.has_chain(NFPROTO_INET, TABLE, CHAIN)? {
        let mut same = true;
        for (name, _, elems) in &sets {
            let mut dumped = match nl.elements(NFPROTO_INET, TABLE, name) {
                Ok(e) => e,
                Err(e) if nfnetlink::is_not_found(&e) => {
                    same = false;
                    break;
                }
                Err(e) => return Err(e),
            };
            dumped.sort_by(|a, b| (&a.key, &a.key_end).cmp(&(&b.key, &b.key_end)));
            if dumped != *elems {
                same = false;
                break;
            }
        }
        if same {
            return Ok(false);
        }
    }
    // The whole table anew, in one transaction: packets see the old rules or the new.
    let mut b = Batch::new();
    if exists {
        b.delete_table(NFPROTO_INET, TABLE);
    }
    b.add_table(NFPROTO_INET, TABLE, Some(TABLE_COMMENT))?;
    for (name, v6, elems) in &sets {
        b.add_set_spec(NFPROTO_INET, TABLE, &spec(name, *v6));
        if !elems.is_empty() {
            b.add_elements(NFPROTO_INET, TABLE, name, elems)?;
        }
    }
    let hook = Hook {
        chain_type: "filter",
        hooknum: HOOK_FORWARD,
        priority: 0,
        policy: None,
    };
    b.add_chain(NFPROTO_INET, TABLE, CHAIN, Some(hook), None)?;
    for rule in &rules {
        b.add_rule(NFPROTO_INET, TABLE, CHAIN, rule, None)?;
    }
    nl.commit(b, &format!("table inet {TABLE}"))?;
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
    fn one_rule_per_set_and_one_element_per_pair_of_prefixes() {
        let policy = StrictPolicy {
            device: "cni-wg0".into(),
            own: nets(&["10.244.1.0/24", "fd00:244:0:1::/64"]),
            remote: nets(&["10.244.2.0/24", "10.244.3.0/24", "fd00:244:0:2::/64"]),
            expected: nets(&["10.244.2.0/24"]),
        };
        let (rules, sets) = want(&policy);
        assert_eq!(rules.len(), 4);
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
                    data: name
                }
            ]
        );
        assert!(
            rules
                .iter()
                .all(|r| r.last() == Some(&verdict(VERDICT_DROP, None)))
        );
        // 10.244.2.0/24 and 10.244.3.0/24 merge into 10.244.2.0/23: one pair out.
        let out4 = &sets[0].2;
        assert_eq!(out4.len(), 1);
        assert_eq!(out4[0].key, [10, 244, 1, 0, 10, 244, 2, 0]);
        assert_eq!(
            out4[0].key_end,
            Some(vec![10, 244, 1, 255, 10, 244, 3, 255])
        );
        let in4 = &sets[1].2;
        assert_eq!(in4[0].key, [10, 244, 2, 0, 10, 244, 1, 0]);
        assert_eq!((sets[2].2.len(), sets[3].2.len()), (1, 0));
        // Nothing of this node's: no pair (no pod traffic to judge).
        let (_, none) = want(&StrictPolicy {
            own: Vec::new(),
            ..policy
        });
        assert!(none.iter().all(|(_, _, e)| e.is_empty()));
    }
}
