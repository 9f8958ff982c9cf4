//! The iptables host port backend, rule for rule the reference portmap's
//! (table `nat`):
//!
//! - `PREROUTING`, `OUTPUT`: `-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT`
//!   (appended, never inserted ahead of kube-proxy's rules);
//! - `CNI-HOSTPORT-DNAT`: per container and protocol, a multiport match of its
//!   host ports commented `dnat name: "<net>" id: "<id>"`, jumping to
//! - `CNI-DN-<hash>`: per mapping, mark hairpin and localhost connections for
//!   masquerade, then DNAT;
//! - `CNI-HOSTPORT-SETMARK` sets the mark, `CNI-HOSTPORT-MASQ` (first in
//!   `POSTROUTING`) masquerades marked packets. Shared chains stay after the
//!   last DEL, as the reference leaves them.
//!
//! Each change of one family is one `iptables-restore --noflush` transaction
//! computed from `iptables-save -t nat`. Chains are created with `-N` (which
//! fails if another process created the chain meanwhile) and rules deleted by
//! their full text, so a transaction computed from a state that changed
//! under it fails as a whole and is computed again.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::{Forward, Snat};
use crate::error::{Error, Result};
use crate::iptables::{
    ContainerChains, Family, NatTable, Tables as _, line, per_family, removal_input, restore, save,
    strings, target,
};
use crate::naming::{hostport_comment, hostport_dnat_chain};

/// The shared chains; never renamed, or an upgrade would strand rules.
pub(crate) const DNAT_CHAIN: &str = "CNI-HOSTPORT-DNAT";
pub(crate) const SETMARK_CHAIN: &str = "CNI-HOSTPORT-SETMARK";
pub(crate) const MASQ_CHAIN: &str = "CNI-HOSTPORT-MASQ";
/// multiport takes at most 15 ports per rule.
const MULTIPORT_MAX: usize = 15;
/// Transactions computed again after a concurrent change, at most.
const ATTEMPTS: usize = 5;

fn mark(bit: u8) -> String {
    let value = 1u32 << bit;
    format!("{value:#x}/{value:#x}")
}

fn setmark_rule(bit: u8) -> Vec<String> {
    strings(&[
        "-m",
        "comment",
        "--comment",
        "CNI portfwd masquerade mark",
        "-j",
        "MARK",
        "--set-xmark",
        &mark(bit),
    ])
}

fn masq_rule(bit: u8) -> Vec<String> {
    strings(&["-m", "mark", "--mark", &mark(bit), "-j", "MASQUERADE"])
}

fn postrouting_entry() -> Vec<String> {
    strings(&[
        "-m",
        "comment",
        "--comment",
        "CNI portfwd requiring masquerade",
        "-j",
        MASQ_CHAIN,
    ])
}

fn dnat_entry() -> Vec<String> {
    strings(&["-m", "addrtype", "--dst-type", "LOCAL", "-j", DNAT_CHAIN])
}

/// `addr/len` as iptables-save prints a `-s`/`-d` operand.
fn host_operand(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

fn dnat_target(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}:{port}"),
        IpAddr::V6(_) => format!("[{ip}]:{port}"),
    }
}

/// The rules of the container's `CNI-DN-` chain, as iptables-save prints them.
pub(crate) fn chain_rules(forward: &Forward<'_>) -> Vec<Vec<String>> {
    let ip = forward.container.ip();
    let subnet = IpNetwork::new(forward.container.network(), forward.container.prefix())
        .map_or_else(|_| forward.container.to_string(), |n| n.to_string());
    let mut rules = Vec::new();
    for m in forward.mappings() {
        let proto = m.protocol.as_str();
        let port = m.host_port.to_string();
        let base = |source: Option<&str>| {
            let mut r = Vec::new();
            if let Some(s) = source {
                r.extend(strings(&["-s", s]));
            }
            if let Some(d) = m.destination() {
                r.extend(strings(&["-d", &host_operand(d)]));
            }
            r.extend(strings(&["-p", proto, "-m", proto, "--dport", &port]));
            r
        };
        let (set_mark, masq_all) = match &forward.snat {
            Snat::Off => (None, false),
            Snat::Mark { masq_all, .. } => (Some(SETMARK_CHAIN), *masq_all),
            Snat::External { chain, masq_all } => (Some(chain.as_str()), *masq_all),
        };
        if let Some(set_mark) = set_mark {
            // masqAll matches every source, which iptables-save prints as no
            // `-s` at all.
            let mut hairpin = base((!masq_all).then_some(subnet.as_str()));
            hairpin.extend(strings(&["-j", set_mark]));
            rules.push(hairpin);
            if ip.is_ipv4() && !masq_all {
                let mut local = base(Some("127.0.0.1/32"));
                local.extend(strings(&["-j", set_mark]));
                rules.push(local);
            }
        }
        let mut dnat = base(None);
        dnat.extend(strings(&[
            "-j",
            "DNAT",
            "--to-destination",
            &dnat_target(ip, m.container_port),
        ]));
        rules.push(dnat);
    }
    rules
}

/// The jumps from `CNI-HOSTPORT-DNAT` to the container's chain: per protocol
/// (sorted), the host ports of every mapping in groups of 15. Like the
/// reference, mappings of the other family's `hostIP` count here too.
pub(crate) fn entry_rules(forward: &Forward<'_>, chain: &str) -> Vec<Vec<String>> {
    let comment = hostport_comment(forward.network, forward.container_id);
    let mut protocols: Vec<_> = forward.mappings.iter().map(|m| m.protocol).collect();
    protocols.sort();
    protocols.dedup();
    let mut rules = Vec::new();
    for proto in protocols {
        let ports: Vec<String> = forward
            .mappings
            .iter()
            .filter(|m| m.protocol == proto)
            .map(|m| m.host_port.to_string())
            .collect();
        for group in ports.chunks(MULTIPORT_MAX) {
            let mut r = strings(&[
                "-p",
                proto.as_str(),
                "-m",
                "comment",
                "--comment",
                &comment,
                "-m",
                "multiport",
                "--dports",
                &group.join(","),
            ]);
            r.extend(forward.conditions.iter().cloned());
            r.extend(strings(&["-j", chain]));
            rules.push(r);
        }
    }
    rules
}

/// The transaction that makes `current` hold the rules of `forward`.
pub(crate) fn setup_input(forward: &Forward<'_>, current: &NatTable) -> String {
    let chain = hostport_dnat_chain(forward.network, forward.container_id);
    let mut body = String::new();
    let ensure_chain = |body: &mut String, name: &str| {
        if !current.has_chain(name) {
            body.push_str(&format!("-N {name}\n"));
        }
    };
    if let Snat::Mark { mark_bit, .. } = forward.snat {
        ensure_chain(&mut body, SETMARK_CHAIN);
        ensure_chain(&mut body, MASQ_CHAIN);
        if !current.has_rule(SETMARK_CHAIN, &setmark_rule(mark_bit)) {
            body.push_str(&line(
                &format!("-A {SETMARK_CHAIN}"),
                &setmark_rule(mark_bit),
            ));
        }
        if !current.has_rule(MASQ_CHAIN, &masq_rule(mark_bit)) {
            body.push_str(&line(&format!("-A {MASQ_CHAIN}"), &masq_rule(mark_bit)));
        }
        if !current.has_rule("POSTROUTING", &postrouting_entry()) {
            // First, so the bridge's own masquerade chains cannot catch
            // the connection first (the reference inserts it too).
            body.push_str(&line("-I POSTROUTING 1", &postrouting_entry()));
        }
    }
    ensure_chain(&mut body, DNAT_CHAIN);
    for entry in ["PREROUTING", "OUTPUT"] {
        if !current.has_rule(entry, &dnat_entry()) {
            body.push_str(&line(&format!("-A {entry}"), &dnat_entry()));
        }
    }
    // A leftover of the same attachment is replaced, never merged.
    for rule in current.rules.iter().filter(|r| r.jumps_to(&chain)) {
        body.push_str(&line(&format!("-D {}", rule.chain), &rule.args));
    }
    if current.has_chain(&chain) {
        body.push_str(&format!("-F {chain}\n"));
    } else {
        body.push_str(&format!("-N {chain}\n"));
    }
    for rule in chain_rules(forward) {
        body.push_str(&line(&format!("-A {chain}"), &rule));
    }
    for rule in entry_rules(forward, &chain) {
        body.push_str(&line(&format!("-A {DNAT_CHAIN}"), &rule));
    }
    format!("*nat\n{body}COMMIT\n")
}

/// How the per-container chains are named and the jumps to them commented.
const CHAINS: ContainerChains = ContainerChains {
    kind: "dnat ",
    prefix: "CNI-DN-",
    chain_of: hostport_dnat_chain,
};

/// `CNI-DN-` chains of `network` whose container is not in `valid`, found by
/// the comments of the jumps to them (and only where the chain's name is that
/// network's and container's hash, so no other chain is ever touched).
pub(crate) fn stale_chains(
    network: &str,
    valid: &HashSet<&str>,
    current: &NatTable,
) -> Vec<String> {
    let mut out: Vec<String> = current
        .rules
        .iter()
        .filter(|r| r.chain == DNAT_CHAIN)
        .filter_map(|r| {
            let chain = r.jump_target()?;
            CHAINS
                .is_stale(network, valid, chain, r.comment()?)
                .then(|| chain.to_owned())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Runs `compute` on a fresh `iptables-save` and restores its result,
/// computing again when the table changed under the transaction.
fn transact(
    family: Family,
    target: &str,
    compute: impl Fn(&NatTable) -> Option<String>,
) -> Result<()> {
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let current = save(family)?;
        let Some(input) = compute(&current) else {
            return Ok(());
        };
        match restore(family, &input, target) {
            Ok(()) => return Ok(()),
            Err(e @ Error::Command { .. }) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::Parse {
        program: family.restore_program().into(),
        target: target.into(),
        detail: "no attempt was made".into(),
    }))
}

/// Installs the rules of `forward` in its family's table.
pub(crate) fn setup(forward: &Forward<'_>) -> Result<()> {
    let family = Family::of(forward.container.ip());
    let chain = hostport_dnat_chain(forward.network, forward.container_id);
    transact(family, &target(&chain), |current| {
        Some(setup_input(forward, current))
    })
}

/// Installs the rules of every one of `forwards` (different families), at once.
pub(crate) fn setup_all(forwards: &[Forward<'_>]) -> Result<()> {
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let workers: Vec<_> = forwards
            .iter()
            .map(|f| scope.spawn(move || setup(f)))
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    Error::collect(results.into_iter().filter_map(Result::err).collect())
}

/// Verifies every rule of `forward` with one transaction of `-C` lines
/// (which commits nothing and sees rules whatever order their matches were
/// written in); names the missing ones when it fails.
pub(crate) fn check(forward: &Forward<'_>) -> Result<()> {
    let family = Family::of(forward.container.ip());
    let chain = hostport_dnat_chain(forward.network, forward.container_id);
    let mut expected: Vec<(String, Vec<String>)> = Vec::new();
    if let Snat::Mark { mark_bit, .. } = forward.snat {
        expected.push((SETMARK_CHAIN.into(), setmark_rule(mark_bit)));
        expected.push((MASQ_CHAIN.into(), masq_rule(mark_bit)));
        expected.push(("POSTROUTING".into(), postrouting_entry()));
    }
    for entry in ["PREROUTING", "OUTPUT"] {
        expected.push((entry.into(), dnat_entry()));
    }
    for rule in chain_rules(forward) {
        expected.push((chain.clone(), rule));
    }
    for rule in entry_rules(forward, &chain) {
        expected.push((DNAT_CHAIN.into(), rule));
    }
    let body: String = expected
        .iter()
        .map(|(c, r)| line(&format!("-C {c}"), r))
        .collect();
    match restore(family, &format!("*nat\n{body}COMMIT\n"), &target(&chain)) {
        Ok(()) => Ok(()),
        Err(Error::Command { stderr, .. }) => {
            let current = save(family)?;
            let missing: Vec<Error> = expected
                .iter()
                .filter(|(c, r)| !current.has_rule(c, r))
                .map(|(c, r)| Error::Missing {
                    backend: family.name(),
                    target: target(c),
                    what: line(&format!("-A {c}"), r).trim_end().to_owned(),
                })
                .collect();
            if missing.is_empty() {
                // Only a rule with conditions can be there in another order;
                // the tool's own words say which one it did not find.
                Err(Error::Missing {
                    backend: family.name(),
                    target: target(&chain),
                    what: stderr.trim_end().to_owned(),
                })
            } else {
                Error::collect(missing)
            }
        }
        Err(e) => Err(e),
    }
}

/// Removes the container's chain (and the pre-0.7 SNAT chain) with every jump
/// to them, in both families.
pub(crate) fn teardown(network: &str, container_id: &str) -> Result<()> {
    let chains = vec![
        hostport_dnat_chain(network, container_id),
        crate::naming::hostport_old_snat_chain(network, container_id),
    ];
    let results = per_family(&Family::ALL, |family| {
        transact(family, &target(&chains[0]), |current| {
            removal_input(&chains, current)
        })
    });
    Error::collect(results.into_iter().filter_map(Result::err).collect())
}

/// Removes the chains of `network`'s containers that are not in `valid`.
pub(crate) fn gc(network: &str, valid: &HashSet<&str>) -> Result<()> {
    let results = per_family(&Family::ALL, |family| {
        transact(
            family,
            &format!("table nat chain {DNAT_CHAIN} (gc)"),
            |current| {
                let stale = stale_chains(network, valid, current);
                if stale.is_empty() {
                    return None;
                }
                removal_input(&stale, current)
            },
        )
    });
    Error::collect(results.into_iter().filter_map(Result::err).collect())
}
