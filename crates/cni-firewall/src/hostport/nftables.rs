//! The nftables host port backend: the reference portmap's tables
//! `ip cni_hostport` and `ip6 cni_hostport`, spoken over netlink.
//!
//! - `prerouting` and `output` (nat hooks, `dstnat`): `fib daddr type local
//!   jump hostports_all`, so only connections to this node's own addresses
//!   are translated (traffic routed through the node to a pod that happens
//!   to use the port is not);
//! - `hostports_all` jumps to `hostip_hostports` (kept empty, for the
//!   reference's upgrades) and `hostports`, which holds one DNAT rule per
//!   mapping, commented with the container ID;
//! - `masquerading` (nat postrouting, `srcnat`): hairpin and localhost
//!   connections to the container, commented the same way.
//!
//! One transaction per ADD and per DEL. ADD reads only the chains whose
//! content it has to know (the fixed ones, one or two rules each), never the
//! containers' rules, so its cost does not grow with the pods on the node.
//! Like the reference it appends the container's rules without looking for
//! ones the container may already have: a container attached to two networks
//! keeps both networks' rules, and a second ADD without DEL (which the spec
//! forbids) adds them again, all of which one DEL removes.

use std::net::IpAddr;

use super::{Forward, Snat};
use crate::error::{Error, Result};
use crate::nfnetlink::{
    BASE_TRANSPORT, Batch, CMP_EQ, Data, Expr, FIB_F_DADDR, FIB_RESULT_ADDRTYPE, HOOK_OUTPUT,
    HOOK_POSTROUTING, HOOK_PREROUTING, Hook, META_L4PROTO, NAT_DNAT, NAT_F_PROTO_SPECIFIED,
    NFPROTO_IPV4, NFPROTO_IPV6, Nfnl, PRIORITY_DSTNAT, PRIORITY_SRCNAT, REG_1, REG_2, RTN_LOCAL,
    Rule, VERDICT_JUMP,
};
use crate::nft_build::{Field, addr_bytes, addr_match, verdict};

pub(crate) const TABLE: &str = "cni_hostport";
const TABLE_COMMENT: &str = "CNI portmap plugin";
const HOSTPORTS_ALL: &str = "hostports_all";
const HOSTIP_HOSTPORTS: &str = "hostip_hostports";
const HOSTPORTS: &str = "hostports";
const MASQUERADING: &str = "masquerading";
/// The chains that hold per-container rules.
const CONTAINER_CHAINS: [&str; 3] = [HOSTPORTS, HOSTIP_HOSTPORTS, MASQUERADING];

fn family_of(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        NFPROTO_IPV4
    } else {
        NFPROTO_IPV6
    }
}

/// `ip[6] saddr|daddr <addr>[/prefix]` in an `ip`/`ip6` table (no
/// `meta nfproto`, which nft adds only in `inet` tables).
fn addr(field: Field, ip: IpAddr, prefix: u8) -> Vec<Expr> {
    addr_match(field, CMP_EQ, ip, prefix)
        .into_iter()
        .skip(2)
        .collect()
}

fn host_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// `fib daddr type local jump hostports_all`.
pub(crate) fn entry_rule() -> Vec<Expr> {
    vec![
        Expr::Fib {
            dreg: REG_1,
            result: FIB_RESULT_ADDRTYPE,
            flags: FIB_F_DADDR,
        },
        Expr::Cmp {
            sreg: REG_1,
            op: CMP_EQ,
            data: RTN_LOCAL.to_ne_bytes().to_vec(),
        },
        verdict(VERDICT_JUMP, Some(HOSTPORTS_ALL)),
    ]
}

fn jump(chain: &str) -> Vec<Expr> {
    vec![verdict(VERDICT_JUMP, Some(chain))]
}

/// `[ip daddr <hostIP>] <proto> dport <port> dnat to <container>:<port>`
/// per mapping of the container's family.
pub(crate) fn dnat_rules(forward: &Forward<'_>) -> Vec<Vec<Expr>> {
    let ip = forward.container.ip();
    forward
        .mappings()
        .map(|m| {
            let mut rule = Vec::new();
            if let Some(d) = m.destination() {
                rule.extend(addr(Field::Daddr, d, host_prefix(d)));
            }
            rule.extend([
                Expr::Meta {
                    key: META_L4PROTO,
                    dreg: REG_1,
                },
                Expr::Cmp {
                    sreg: REG_1,
                    op: CMP_EQ,
                    data: vec![m.protocol.number()],
                },
                Expr::Payload {
                    dreg: REG_1,
                    base: BASE_TRANSPORT,
                    offset: 2,
                    len: 2,
                },
                Expr::Cmp {
                    sreg: REG_1,
                    op: CMP_EQ,
                    data: m.host_port.to_be_bytes().to_vec(),
                },
                Expr::Immediate {
                    dreg: REG_1,
                    data: Data::Value(addr_bytes(ip)),
                },
                Expr::Immediate {
                    dreg: REG_2,
                    data: Data::Value(m.container_port.to_be_bytes().to_vec()),
                },
                Expr::Nat {
                    nat_type: NAT_DNAT,
                    family: u32::from(family_of(ip)),
                    reg_addr: REG_1,
                    reg_proto: REG_2,
                    flags: NAT_F_PROTO_SPECIFIED,
                },
            ]);
            rule
        })
        .collect()
}

/// `ip[6] saddr <source> ip[6] daddr <container> masquerade` for hairpin
/// (the container itself, or everyone with `masqAll`) and, for IPv4,
/// localhost.
pub(crate) fn masq_rules(forward: &Forward<'_>) -> Vec<Vec<Expr>> {
    let ip = forward.container.ip();
    let masq_all = match &forward.snat {
        Snat::Off => return Vec::new(),
        Snat::Mark { masq_all, .. } | Snat::External { masq_all, .. } => *masq_all,
    };
    let rule = |source: IpAddr, prefix: u8| {
        let mut r = addr(Field::Saddr, source, prefix);
        r.extend(addr(Field::Daddr, ip, host_prefix(ip)));
        r.push(Expr::Masq { flags: 0 });
        r
    };
    let unspecified = if ip.is_ipv4() {
        IpAddr::from([0u8; 4])
    } else {
        IpAddr::from([0u8; 16])
    };
    let mut out = vec![if masq_all {
        rule(unspecified, 0)
    } else {
        rule(ip, host_prefix(ip))
    }];
    if ip.is_ipv4() && !masq_all {
        out.push(rule(IpAddr::from([127, 0, 0, 1]), 32));
    }
    out
}

fn nat_hook(hooknum: u32, priority: i32) -> Hook<'static> {
    Hook {
        chain_type: "nat",
        hooknum,
        priority,
        policy: None,
    }
}

fn has_rule(rules: &[Rule], chain: &str, exprs: &[Expr], comment: Option<&str>) -> bool {
    rules
        .iter()
        .any(|r| r.chain == chain && r.exprs == exprs && r.comment.as_deref() == comment)
}

/// What an ADD has to know of the table (`None` when it does not exist): which
/// of the chains it needs exist, and the rules of the fixed chains.
pub(crate) struct Current {
    pub(crate) chains: Vec<String>,
    /// The rules of [`FIXED_CHAINS`] only.
    pub(crate) rules: Vec<Rule>,
}

/// The chains whose rules are the same on every node: written by whoever makes the
/// table, rewritten only when they are not as they should be.
const FIXED_CHAINS: [&str; 3] = [HOSTPORTS_ALL, "prerouting", "output"];

/// Adds to `b` the changes that install `forward`, given the table now.
///
/// The table and chains are added only when missing: adding what exists is
/// an update transaction of its own, and the kernel then makes the next
/// release of a netfilter socket (the process's exit) wait for an RCU grace
/// period, tens of milliseconds, for nothing.
fn add_setup(b: &mut Batch, forward: &Forward<'_>, current: Option<&Current>) -> Result<()> {
    let family = family_of(forward.container.ip());
    let id = forward.container_id;
    let rules = current.map(|c| c.rules.as_slice()).unwrap_or_default();
    let has_chain = |name: &str| current.is_some_and(|c| c.chains.iter().any(|n| n == name));
    if current.is_none() {
        b.add_table(family, TABLE, Some(TABLE_COMMENT))?;
    }
    for chain in [HOSTPORTS, HOSTIP_HOSTPORTS, HOSTPORTS_ALL] {
        if !has_chain(chain) {
            b.add_chain(family, TABLE, chain, None, None)?;
        }
    }
    for (chain, hook) in [("prerouting", HOOK_PREROUTING), ("output", HOOK_OUTPUT)] {
        if !has_chain(chain) {
            b.add_chain(
                family,
                TABLE,
                chain,
                Some(nat_hook(hook, PRIORITY_DSTNAT)),
                None,
            )?;
        }
    }
    // The fixed rules are written again only when they are not exactly as
    // they should be (the reference rewrites them on every ADD).
    let fixed = [
        (HOSTPORTS_ALL, vec![jump(HOSTIP_HOSTPORTS), jump(HOSTPORTS)]),
        ("prerouting", vec![entry_rule()]),
        ("output", vec![entry_rule()]),
    ];
    for (chain, want) in &fixed {
        let have: Vec<&Vec<Expr>> = rules
            .iter()
            .filter(|r| r.chain == *chain)
            .map(|r| &r.exprs)
            .collect();
        if have.len() != want.len() || have.iter().zip(want).any(|(h, w)| *h != w) {
            b.flush_chain(family, TABLE, chain);
            for rule in want {
                b.add_rule(family, TABLE, chain, rule, None)?;
            }
        }
    }
    if forward.snat != Snat::Off && !has_chain(MASQUERADING) {
        b.add_chain(
            family,
            TABLE,
            MASQUERADING,
            Some(nat_hook(HOOK_POSTROUTING, PRIORITY_SRCNAT)),
            None,
        )?;
    }
    for rule in dnat_rules(forward) {
        b.add_rule(family, TABLE, HOSTPORTS, &rule, Some(id))?;
    }
    for rule in masq_rules(forward) {
        b.add_rule(family, TABLE, MASQUERADING, &rule, Some(id))?;
    }
    Ok(())
}

/// The table's rules (`None` when it does not exist; a table with no rule holds
/// nothing of ours either), with the expressions of those in the chains `decode` names.
fn table_rules(
    nl: &mut Nfnl,
    family: u8,
    decode: &dyn Fn(&str) -> bool,
) -> Result<Option<Vec<Rule>>> {
    match nl.rules_decoding(family, TABLE, None, decode) {
        Err(e) if crate::nfnetlink::is_not_found(&e) => Ok(None),
        Ok(rules) if rules.is_empty() => Ok(None),
        other => other.map(Some),
    }
}

/// What an ADD needs of the table, in requests whose answers do not grow with the pods
/// on the node: the rules of each fixed chain (one small dump each); a chain with rules,
/// or that one of them jumps to, exists. Only the chains still unaccounted for are asked
/// for one by one: `masquerading` on a node in service (when `snat`), more on a first ADD
/// or after someone else changed the table.
fn current(nl: &mut Nfnl, family: u8, snat: bool) -> Result<Option<Current>> {
    let mut rules = Vec::new();
    for chain in FIXED_CHAINS {
        // The kernel answers a dump of a missing chain or table with nothing, so
        // only a chain with rules is known to exist.
        match nl.rules(family, TABLE, Some(chain)) {
            Err(e) if crate::nfnetlink::is_not_found(&e) => {}
            answer => rules.extend(answer?),
        }
    }
    let mut chains: Vec<String> = rules
        .iter()
        .flat_map(|r| [Some(r.chain.clone()), r.jump_target().map(str::to_owned)])
        .flatten()
        .collect();
    if chains.is_empty() && !nl.has_table(family, TABLE)? {
        return Ok(None);
    }
    let needed = [HOSTPORTS, HOSTIP_HOSTPORTS]
        .into_iter()
        .chain(FIXED_CHAINS)
        .chain(snat.then_some(MASQUERADING));
    for chain in needed {
        if !chains.iter().any(|c| c == chain) && nl.has_chain(family, TABLE, chain)? {
            chains.push(chain.to_owned());
        }
    }
    Ok(Some(Current { chains, rules }))
}

fn target(family: u8) -> String {
    format!("table {} {TABLE}", crate::nfnetlink::family_name(family))
}

/// The reference writes nft conditions as nft source text, which only `nft`
/// itself can compile; this backend speaks netlink and refuses them rather
/// than ignore them.
fn refuse_conditions(forward: &Forward<'_>) -> Result<()> {
    match forward.conditions.first() {
        None => Ok(()),
        Some(first) => Err(Error::InvalidInput {
            what: if forward.container.is_ipv4() {
                "conditionsV4"
            } else {
                "conditionsV6"
            },
            value: first.clone(),
            reason: "nftables conditions are not supported; use \"backend\": \"iptables\" with iptables conditions",
        }),
    }
}

/// Installs the rules of every one of `forwards` (a container's addresses, one per
/// family) in one transaction, over one socket.
pub(crate) fn setup_all(forwards: &[Forward<'_>]) -> Result<()> {
    let mut nl = Nfnl::open()?;
    let mut batch = Batch::new();
    for forward in forwards {
        refuse_conditions(forward)?;
        let snat = forward.snat != Snat::Off;
        let current = current(&mut nl, family_of(forward.container.ip()), snat)?;
        add_setup(&mut batch, forward, current.as_ref())?;
    }
    nl.commit(batch, &format!("table ip/ip6 {TABLE}"))
}

/// Whether every rule of `forward` is in place.
pub(crate) fn check(forward: &Forward<'_>) -> Result<()> {
    refuse_conditions(forward)?;
    let family = family_of(forward.container.ip());
    let mut nl = Nfnl::open()?;
    let rules = table_rules(&mut nl, family, &|_| true)?.unwrap_or_default();
    let id = Some(forward.container_id);
    let entry = "fib daddr type local jump hostports_all".to_owned();
    let container = format!("a rule of container {}", forward.container_id);
    // (chain, expressions, comment, what it is in words)
    let mut expected: Vec<(&str, Vec<Expr>, Option<&str>, String)> = vec![
        ("prerouting", entry_rule(), None, entry.clone()),
        ("output", entry_rule(), None, entry),
        (
            HOSTPORTS_ALL,
            jump(HOSTPORTS),
            None,
            "jump hostports".to_owned(),
        ),
    ];
    expected.extend(
        dnat_rules(forward)
            .into_iter()
            .map(|r| (HOSTPORTS, r, id, container.clone())),
    );
    expected.extend(
        masq_rules(forward)
            .into_iter()
            .map(|r| (MASQUERADING, r, id, container.clone())),
    );
    let errors: Vec<Error> = expected
        .into_iter()
        .filter(|(chain, exprs, comment, _)| !has_rule(&rules, chain, exprs, *comment))
        .map(|(chain, _, _, what)| Error::Missing {
            backend: "nftables",
            target: format!("{} chain {chain}", target(family)),
            what,
        })
        .collect();
    Error::collect(errors)
}

/// Deletes the rules commented `container_id` from both families' tables.
pub(crate) fn teardown(container_id: &str) -> Result<()> {
    remove_where(|comment| comment == container_id)
}

/// Deletes the rules of containers that `keep` does not keep.
pub(crate) fn gc(keep: &dyn Fn(&str) -> bool) -> Result<()> {
    remove_where(|comment| !keep(comment))
}

fn remove_where(doomed: impl Fn(&str) -> bool) -> Result<()> {
    let mut nl = Nfnl::open()?;
    let mut batch = Batch::new();
    let mut any = false;
    for family in [NFPROTO_IPV4, NFPROTO_IPV6] {
        // Chain, handle and comment are all a deletion needs (two or three rules per pod).
        let Some(rules) = table_rules(&mut nl, family, &|_| false)? else {
            continue;
        };
        for rule in rules.iter().filter(|r| {
            CONTAINER_CHAINS.contains(&r.chain.as_str())
                && r.comment.as_deref().is_some_and(&doomed)
        }) {
            batch.delete_rule(family, TABLE, &rule.chain, rule.handle);
            any = true;
        }
    }
    if !any {
        return Ok(());
    }
    nl.commit(batch, &format!("table ip/ip6 {TABLE}"))
}

/// Whether nf_tables works here.
pub(crate) fn usable() -> bool {
    crate::nfnetlink::usable()
}
