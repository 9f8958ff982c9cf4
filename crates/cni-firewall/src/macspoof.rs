//! The bridge plugin's `macspoofchk`: frames entering the bridge from a
//! container's host-side veth are dropped unless their source MAC is the
//! container's.
//!
//! Same objects as the reference: table `bridge nat`, base chain
//! `PREROUTING` (filter hook, priority -300), per attachment the chains
//! `cni-br-iface-<cid>-<ifname>` and `…-mac`, every rule commented
//! `macspoofchk-<cid>-<ifname>`.
//!
//! Changes are sent as nft JSON batches rather than nft scripts: chain names
//! embed the interface name, which may hold characters that nft's script
//! grammar only accepts unquoted, and JSON needs no quoting rules at all.
//! Each call is one transaction, so unlike the reference's two, a repeated
//! setup replaces its PREROUTING rule instead of adding a second one.

use std::collections::HashSet;

use cni_protocol::MacAddr;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::naming::{
    MACSPOOF_CHAIN_PREFIX, macspoof_comment, macspoof_iface_chain, macspoof_mac_chain,
};
use crate::nft::{self, Listing};

const FAMILY: &str = "bridge";
const TABLE: &str = "nat";
const BASE_CHAIN: &str = "PREROUTING";

fn target() -> String {
    format!("table {FAMILY} {TABLE}")
}

fn chain_obj(name: &str) -> Value {
    json!({"family": FAMILY, "table": TABLE, "name": name})
}

fn rule_obj(chain: &str, expr: &Value, comment: &str) -> Value {
    json!({"family": FAMILY, "table": TABLE, "chain": chain, "expr": expr, "comment": comment})
}

fn iface_match_expr(host_veth: &str, iface_chain: &str) -> Value {
    json!([
        {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": host_veth}},
        {"jump": {"target": iface_chain}}
    ])
}

fn jump_expr(to: &str) -> Value {
    json!([{"jump": {"target": to}}])
}

fn mac_expr(mac: &str) -> Value {
    json!([
        {"match": {"op": "==", "left": {"payload": {"protocol": "ether", "field": "saddr"}}, "right": mac}},
        {"return": null}
    ])
}

fn drop_expr() -> Value {
    json!([{"drop": null}])
}

/// A container MAC as [`setup`] and [`check`] take it: already parsed (what the
/// bridge passes), or text, parsed with the suite's one MAC parser ([`MacAddr`]) and
/// refused rather than handed to nft when it is not a MAC. nft gets the canonical
/// lower-case `aa:bb:cc:dd:ee:ff` either way.
pub trait ContainerMac {
    /// The parsed MAC.
    fn container_mac(self) -> Result<MacAddr>;
}

impl ContainerMac for MacAddr {
    fn container_mac(self) -> Result<MacAddr> {
        Ok(self)
    }
}

/// A link's MAC as netlink reports it; a link without one cannot be checked.
impl ContainerMac for Option<MacAddr> {
    fn container_mac(self) -> Result<MacAddr> {
        self.ok_or(Error::InvalidInput {
            what: "container MAC",
            value: String::new(),
            reason: "the container interface has no MAC",
        })
    }
}

impl ContainerMac for &str {
    fn container_mac(self) -> Result<MacAddr> {
        self.parse().map_err(|_| Error::InvalidInput {
            what: "container MAC",
            value: self.into(),
            reason: "expected a MAC address such as 02:42:ac:11:00:02",
        })
    }
}

fn check_name(what: &'static str, value: &str) -> Result<()> {
    if value.is_empty() || value.chars().any(char::is_control) {
        return Err(Error::InvalidInput {
            what,
            value: value.into(),
            reason: "empty or contains control characters",
        });
    }
    Ok(())
}

/// Handles of PREROUTING rules that belong to this attachment: by comment,
/// and any rule jumping into its chain (which would block deleting it).
fn own_prerouting_rules(listing: &Listing, comment: &str, iface_chain: &str) -> Vec<u64> {
    listing
        .rules_in(BASE_CHAIN)
        .filter(|r| r.comment.as_deref() == Some(comment) || r.jump_target() == Some(iface_chain))
        .map(|r| r.handle)
        .collect()
}

/// The setup transaction; `stale` are PREROUTING handles of an earlier setup.
pub(crate) fn setup_batch(
    container_id: &str,
    ifname: &str,
    host_veth: &str,
    mac: &str,
    stale: &[u64],
) -> Value {
    let iface = macspoof_iface_chain(container_id, ifname);
    let mac_chain = macspoof_mac_chain(container_id, ifname);
    let comment = macspoof_comment(container_id, ifname);
    let mut cmds = vec![
        json!({"add": {"table": {"family": FAMILY, "name": TABLE}}}),
        json!({"add": {"chain": {"family": FAMILY, "table": TABLE, "name": BASE_CHAIN,
            "type": "filter", "hook": "prerouting", "prio": -300, "policy": "accept"}}}),
        json!({"add": {"chain": chain_obj(&iface)}}),
        json!({"add": {"chain": chain_obj(&mac_chain)}}),
        json!({"flush": {"chain": chain_obj(&iface)}}),
        json!({"flush": {"chain": chain_obj(&mac_chain)}}),
    ];
    for handle in stale {
        cmds.push(delete_rule(BASE_CHAIN, *handle));
    }
    cmds.extend([
        json!({"add": {"rule": rule_obj(BASE_CHAIN, &iface_match_expr(host_veth, &iface), &comment)}}),
        json!({"add": {"rule": rule_obj(&iface, &jump_expr(&mac_chain), &comment)}}),
        json!({"add": {"rule": rule_obj(&mac_chain, &mac_expr(mac), &comment)}}),
        json!({"add": {"rule": rule_obj(&mac_chain, &drop_expr(), &comment)}}),
    ]);
    json!({"nftables": cmds})
}

fn delete_rule(chain: &str, handle: u64) -> Value {
    json!({"delete": {"rule": {"family": FAMILY, "table": TABLE, "chain": chain, "handle": handle}}})
}

/// Removes PREROUTING rules by handle and the given chains (flushed first,
/// as a chain must be empty and unreferenced to go).
fn removal_batch(prerouting: &[u64], chains: &[String]) -> Option<Value> {
    if prerouting.is_empty() && chains.is_empty() {
        return None;
    }
    let mut cmds: Vec<Value> = prerouting
        .iter()
        .map(|h| delete_rule(BASE_CHAIN, *h))
        .collect();
    cmds.extend(
        chains
            .iter()
            .map(|c| json!({"flush": {"chain": chain_obj(c)}})),
    );
    cmds.extend(
        chains
            .iter()
            .map(|c| json!({"delete": {"chain": chain_obj(c)}})),
    );
    Some(json!({"nftables": cmds}))
}

/// The teardown transaction for what of this attachment `listing` shows.
pub(crate) fn teardown_batch(container_id: &str, ifname: &str, listing: &Listing) -> Option<Value> {
    let iface = macspoof_iface_chain(container_id, ifname);
    let comment = macspoof_comment(container_id, ifname);
    let rules = own_prerouting_rules(listing, &comment, &iface);
    let chains: Vec<String> = [iface, macspoof_mac_chain(container_id, ifname)]
        .into_iter()
        .filter(|c| listing.has_chain(c))
        .collect();
    removal_batch(&rules, &chains)
}

/// The GC transaction: spoof-check chains of attachments not in `valid`.
///
/// The table is shared by all networks while the valid list covers one, so
/// a chain is also kept while the host interface its PREROUTING rule matches
/// still exists (`is_live`): that attachment is alive, whatever network it
/// is on. Chains reached from kept chains are kept too.
pub(crate) fn gc_batch(
    valid: &[(&str, &str)],
    listing: &Listing,
    is_live: impl Fn(&str) -> bool,
) -> Option<Value> {
    let mut keep: HashSet<String> = valid
        .iter()
        .flat_map(|(cid, ifname)| {
            [
                macspoof_iface_chain(cid, ifname),
                macspoof_mac_chain(cid, ifname),
            ]
        })
        .collect();
    for rule in listing.rules_in(BASE_CHAIN) {
        if let (Some(to), Some(ifname)) = (rule.jump_target(), matched_iifname(&rule.expr)) {
            if to.starts_with(MACSPOOF_CHAIN_PREFIX) && is_live(ifname) {
                keep.insert(to.to_owned());
            }
        }
    }
    loop {
        let reached: Vec<String> = listing
            .rules
            .iter()
            .filter(|r| keep.contains(&r.chain))
            .filter_map(|r| r.jump_target().map(str::to_owned))
            .filter(|t| !keep.contains(t))
            .collect();
        if reached.is_empty() {
            break;
        }
        keep.extend(reached);
    }
    let stale: Vec<String> = listing
        .chains
        .iter()
        .map(|c| c.name.clone())
        .filter(|c| c.starts_with(MACSPOOF_CHAIN_PREFIX) && !keep.contains(c))
        .collect();
    let rules: Vec<u64> = listing
        .rules_in(BASE_CHAIN)
        .filter(|r| {
            r.jump_target()
                .is_some_and(|t| stale.iter().any(|s| s == t))
        })
        .map(|r| r.handle)
        .collect();
    removal_batch(&rules, &stale)
}

/// The interface name an `iifname == "<name>"` statement matches.
fn matched_iifname(expr: &[Value]) -> Option<&str> {
    expr.iter().find_map(|stmt| {
        let m = stmt.get("match")?;
        (m.get("left")?.get("meta")?.get("key")?.as_str()? == "iifname")
            .then(|| m.get("right")?.as_str())
            .flatten()
    })
}

/// What CHECK finds missing: (where, what) pairs.
pub(crate) fn missing(
    container_id: &str,
    ifname: &str,
    host_veth: &str,
    mac: &str,
    listing: &Listing,
) -> Vec<(String, String)> {
    let iface = macspoof_iface_chain(container_id, ifname);
    let mac_chain = macspoof_mac_chain(container_id, ifname);
    let comment = macspoof_comment(container_id, ifname);
    let position = |chain: &str, expr: &Value| {
        listing.rules_in(chain).position(|r| {
            r.comment.as_deref() == Some(comment.as_str())
                && expr.as_array().is_some_and(|want| *want == r.expr)
        })
    };
    let at = |chain: &str| format!("table {FAMILY} {TABLE} chain {chain}");
    let mut out = Vec::new();
    if position(BASE_CHAIN, &iface_match_expr(host_veth, &iface)).is_none() {
        out.push((
            at(BASE_CHAIN),
            format!("iifname \"{host_veth}\" jump {iface}"),
        ));
    }
    if position(&iface, &jump_expr(&mac_chain)).is_none() {
        out.push((at(&iface), format!("jump {mac_chain}")));
    }
    let accept = position(&mac_chain, &mac_expr(mac));
    let drop = position(&mac_chain, &drop_expr());
    if accept.is_none() {
        out.push((at(&mac_chain), format!("ether saddr {mac} return")));
    }
    // A drop ahead of the MAC match drops the container's own frames too.
    if drop.is_none() || accept.is_some_and(|a| drop < Some(a)) {
        out.push((at(&mac_chain), "drop (after the MAC match)".to_owned()));
    }
    out
}

fn list_table() -> Result<Option<Listing>> {
    nft::list(&["table", FAMILY, TABLE])
}

/// Installs the spoof check for an attachment: frames from `host_veth` must
/// carry `container_mac` as source. Repeating it replaces the old rules.
pub fn setup(
    container_id: &str,
    ifname: &str,
    host_veth: &str,
    container_mac: impl ContainerMac,
) -> Result<()> {
    check_name("container id", container_id)?;
    check_name("interface name", ifname)?;
    check_name("host interface name", host_veth)?;
    let mac = container_mac.container_mac()?.to_string();
    let comment = macspoof_comment(container_id, ifname);
    let iface = macspoof_iface_chain(container_id, ifname);
    // A stale handle can vanish between listing and applying (a concurrent
    // teardown of the same attachment); retry with a fresh listing.
    let mut attempts_left = 3;
    loop {
        let stale = nft::list(&["chain", FAMILY, TABLE, BASE_CHAIN])?
            .map(|l| own_prerouting_rules(&l, &comment, &iface))
            .unwrap_or_default();
        let batch = setup_batch(container_id, ifname, host_veth, &mac, &stale);
        match nft::apply_json(&batch, &target()) {
            Err(_) if !stale.is_empty() && attempts_left > 1 => attempts_left -= 1,
            other => return other,
        }
    }
}

/// Removes an attachment's spoof check; absent table, chains or nft mean
/// there is nothing to do.
pub fn teardown(container_id: &str, ifname: &str) -> Result<()> {
    let listing = match list_table() {
        Ok(Some(l)) => l,
        Ok(None) | Err(Error::ProgramNotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    match teardown_batch(container_id, ifname, &listing) {
        Some(batch) => nft::apply_json(&batch, &target()),
        None => Ok(()),
    }
}

/// Verifies [`setup`] with the same arguments is in effect; the error names
/// every missing rule.
pub fn check(
    container_id: &str,
    ifname: &str,
    host_veth: &str,
    container_mac: impl ContainerMac,
) -> Result<()> {
    let mac = container_mac.container_mac()?.to_string();
    let listing = list_table()?.ok_or_else(|| Error::Missing {
        backend: "nftables",
        target: "bridge ruleset".into(),
        what: target(),
    })?;
    let errors = missing(container_id, ifname, host_veth, &mac, &listing)
        .into_iter()
        .map(|(target, what)| Error::Missing {
            backend: "nftables",
            target,
            what,
        })
        .collect();
    Error::collect(errors)
}

/// Removes spoof-check chains of attachments not in `valid` (container id,
/// interface name) whose host interface is gone (see [`gc_batch`] for why
/// live interfaces are spared).
pub fn gc<C: AsRef<str>, I: AsRef<str>>(valid: &[(C, I)]) -> Result<()> {
    let valid: Vec<(&str, &str)> = valid
        .iter()
        .map(|(c, i)| (c.as_ref(), i.as_ref()))
        .collect();
    let listing = match list_table() {
        Ok(Some(l)) => l,
        Ok(None) | Err(Error::ProgramNotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    let live = live_interfaces();
    let is_live = |name: &str| live.as_ref().is_none_or(|l| l.contains(name));
    match gc_batch(&valid, &listing, is_live) {
        Some(batch) => nft::apply_json(&batch, &target()),
        None => Ok(()),
    }
}

/// Interface names in the calling thread's network namespace (the one nft
/// runs in); `None` if they cannot be read, in which case GC keeps every
/// chain with an interface match.
fn live_interfaces() -> Option<HashSet<String>> {
    // `thread-self`, not `self`: the caller may have entered a namespace on
    // this thread only.
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev").ok()?;
    Some(parse_net_dev(&dev))
}

/// Interface names from `/proc/net/dev` (two header lines, then
/// `<name>: <counters>`).
fn parse_net_dev(text: &str) -> HashSet<String> {
    text.lines()
        .skip(2)
        .filter_map(|l| l.split_once(':'))
        .map(|(name, _)| name.trim().to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::parse_listing;

    /// Captured from nft 1.0.6 (`nft -j list table bridge nat`) after setups
    /// of ctrA/eth0 on veth1234 and ctrB/eth0 on vethdead.
    const BRIDGE_NAT_JSON: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "bridge", "name": "nat", "handle": 1}}, {"chain": {"family": "bridge", "table": "nat", "name": "PREROUTING", "handle": 1, "type": "filter", "hook": "prerouting", "prio": -300, "policy": "accept"}}, {"chain": {"family": "bridge", "table": "nat", "name": "cni-br-iface-ctrA-eth0", "handle": 2}}, {"chain": {"family": "bridge", "table": "nat", "name": "cni-br-iface-ctrA-eth0-mac", "handle": 3}}, {"chain": {"family": "bridge", "table": "nat", "name": "cni-br-iface-ctrB-eth0", "handle": 12}}, {"chain": {"family": "bridge", "table": "nat", "name": "cni-br-iface-ctrB-eth0-mac", "handle": 13}}, {"rule": {"family": "bridge", "table": "nat", "chain": "PREROUTING", "handle": 4, "comment": "macspoofchk-ctrA-eth0", "expr": [{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "veth1234"}}, {"jump": {"target": "cni-br-iface-ctrA-eth0"}}]}}, {"rule": {"family": "bridge", "table": "nat", "chain": "PREROUTING", "handle": 14, "comment": "macspoofchk-ctrB-eth0", "expr": [{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "vethdead"}}, {"jump": {"target": "cni-br-iface-ctrB-eth0"}}]}}, {"rule": {"family": "bridge", "table": "nat", "chain": "cni-br-iface-ctrA-eth0", "handle": 9, "comment": "macspoofchk-ctrA-eth0", "expr": [{"jump": {"target": "cni-br-iface-ctrA-eth0-mac"}}]}}, {"rule": {"family": "bridge", "table": "nat", "chain": "cni-br-iface-ctrA-eth0-mac", "handle": 10, "comment": "macspoofchk-ctrA-eth0", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ether", "field": "saddr"}}, "right": "02:42:ac:11:00:02"}}, {"return": null}]}}, {"rule": {"family": "bridge", "table": "nat", "chain": "cni-br-iface-ctrA-eth0-mac", "handle": 11, "comment": "macspoofchk-ctrA-eth0", "expr": [{"drop": null}]}}, {"rule": {"family": "bridge", "table": "nat", "chain": "cni-br-iface-ctrB-eth0", "handle": 15, "comment": "macspoofchk-ctrB-eth0", "expr": [{"jump": {"target": "cni-br-iface-ctrB-eth0-mac"}}]}}, {"rule": {"family": "bridge", "table": "nat", "chain": "cni-br-iface-ctrB-eth0-mac", "handle": 16, "comment": "macspoofchk-ctrB-eth0", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ether", "field": "saddr"}}, "right": "02:42:ac:11:00:03"}}, {"return": null}]}}, {"rule": {"family": "bridge", "table": "nat", "chain": "cni-br-iface-ctrB-eth0-mac", "handle": 17, "comment": "macspoofchk-ctrB-eth0", "expr": [{"drop": null}]}}]}"#;

    fn listing() -> Listing {
        parse_listing(BRIDGE_NAT_JSON, "t").unwrap()
    }

    #[test]
    fn setup_batch_is_exact() {
        let batch = setup_batch("ctrA", "eth0", "veth1234", "02:42:ac:11:00:02", &[4]);
        let expected = r#"{"nftables":[{"add":{"table":{"family":"bridge","name":"nat"}}},{"add":{"chain":{"family":"bridge","table":"nat","name":"PREROUTING","type":"filter","hook":"prerouting","prio":-300,"policy":"accept"}}},{"add":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrA-eth0"}}},{"add":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrA-eth0-mac"}}},{"flush":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrA-eth0"}}},{"flush":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrA-eth0-mac"}}},{"delete":{"rule":{"family":"bridge","table":"nat","chain":"PREROUTING","handle":4}}},{"add":{"rule":{"family":"bridge","table":"nat","chain":"PREROUTING","expr":[{"match":{"op":"==","left":{"meta":{"key":"iifname"}},"right":"veth1234"}},{"jump":{"target":"cni-br-iface-ctrA-eth0"}}],"comment":"macspoofchk-ctrA-eth0"}}},{"add":{"rule":{"family":"bridge","table":"nat","chain":"cni-br-iface-ctrA-eth0","expr":[{"jump":{"target":"cni-br-iface-ctrA-eth0-mac"}}],"comment":"macspoofchk-ctrA-eth0"}}},{"add":{"rule":{"family":"bridge","table":"nat","chain":"cni-br-iface-ctrA-eth0-mac","expr":[{"match":{"op":"==","left":{"payload":{"protocol":"ether","field":"saddr"}},"right":"02:42:ac:11:00:02"}},{"return":null}],"comment":"macspoofchk-ctrA-eth0"}}},{"add":{"rule":{"family":"bridge","table":"nat","chain":"cni-br-iface-ctrA-eth0-mac","expr":[{"drop":null}],"comment":"macspoofchk-ctrA-eth0"}}}]}"#;
        assert_eq!(batch.to_string(), expected);
    }

    #[test]
    fn teardown_batch_is_exact() {
        let batch = teardown_batch("ctrA", "eth0", &listing()).unwrap();
        let expected = r#"{"nftables":[{"delete":{"rule":{"family":"bridge","table":"nat","chain":"PREROUTING","handle":4}}},{"flush":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrA-eth0"}}},{"flush":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrA-eth0-mac"}}},{"delete":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrA-eth0"}}},{"delete":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrA-eth0-mac"}}}]}"#;
        assert_eq!(batch.to_string(), expected);
        assert_eq!(teardown_batch("ctrZ", "eth0", &listing()), None);
    }

    #[test]
    fn check_accepts_captured_setup_and_names_gaps() {
        let l = listing();
        assert!(missing("ctrA", "eth0", "veth1234", "02:42:ac:11:00:02", &l).is_empty());
        let mut no_mac_match = l.clone();
        no_mac_match.rules.retain(|r| r.handle != 10);
        assert_eq!(
            missing(
                "ctrA",
                "eth0",
                "veth1234",
                "02:42:ac:11:00:02",
                &no_mac_match
            )
            .len(),
            1
        );
        let m = missing("ctrA", "eth0", "veth9999", "02:42:ac:11:00:09", &l);
        assert_eq!(
            m,
            vec![
                (
                    "table bridge nat chain PREROUTING".to_string(),
                    "iifname \"veth9999\" jump cni-br-iface-ctrA-eth0".to_string()
                ),
                (
                    "table bridge nat chain cni-br-iface-ctrA-eth0-mac".to_string(),
                    "ether saddr 02:42:ac:11:00:09 return".to_string()
                ),
            ]
        );
    }

    #[test]
    fn gc_removes_invalid_dead_attachments_only() {
        let l = listing();
        // Nothing valid, nothing live: both attachments go.
        let batch = gc_batch(&[], &l, |_| false).unwrap().to_string();
        for chain in ["cni-br-iface-ctrA-eth0", "cni-br-iface-ctrB-eth0-mac"] {
            assert!(batch.contains(&format!(r#"{{"delete":{{"chain":{{"family":"bridge","table":"nat","name":"{chain}"}}}}}}"#)), "{batch}");
        }
        assert!(batch.contains(r#""handle":4"#) && batch.contains(r#""handle":14"#));

        // ctrA valid, ctrB's veth gone: only ctrB goes.
        let batch = gc_batch(&[("ctrA", "eth0")], &l, |_| false).unwrap();
        let expected = r#"{"nftables":[{"delete":{"rule":{"family":"bridge","table":"nat","chain":"PREROUTING","handle":14}}},{"flush":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrB-eth0"}}},{"flush":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrB-eth0-mac"}}},{"delete":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrB-eth0"}}},{"delete":{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctrB-eth0-mac"}}}]}"#;
        assert_eq!(batch.to_string(), expected);

        // ctrB's veth still exists (another network's attachment): kept.
        assert_eq!(gc_batch(&[("ctrA", "eth0")], &l, |n| n == "vethdead"), None);
    }

    #[test]
    fn mac_is_validated_and_normalised() {
        let mac = "02:42:AC:11:00:02".container_mac().unwrap();
        assert_eq!(mac.to_string(), "02:42:ac:11:00:02");
        // Go's other spellings of the same MAC are the same MAC.
        assert_eq!("02-42-ac-11-00-02".container_mac().unwrap(), mac);
        for bad in [
            "",
            "02:42:ac:11:00",
            "02:42:ac:11:00:0g",
            "2:42:ac:11:00:02",
        ] {
            assert!(bad.container_mac().is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_proc_net_dev() {
        let text = "Inter-|   Receive                            |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes\n    lo:       0       0    0    0    0     0          0         0        0\nveth1234: 1 2 3\n";
        let names = parse_net_dev(text);
        assert_eq!(names, ["lo".to_string(), "veth1234".to_string()].into());
        assert!(live_interfaces().is_some_and(|l| l.contains("lo")));
    }

    #[test]
    fn finds_iifname() {
        let l = listing();
        let r = l.rules_in("PREROUTING").next().unwrap();
        assert_eq!(matched_iifname(&r.expr), Some("veth1234"));
    }
}
