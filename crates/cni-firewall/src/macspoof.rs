//! The bridge plugin's `macspoofchk`: frames entering the bridge from a
//! container's host-side veth are dropped unless their source MAC is the
//! container's.
//!
//! Same objects as the reference: table `bridge nat`, base chain
//! `PREROUTING` (filter hook, priority -300), per attachment the chains
//! `cni-br-iface-<cid>-<ifname>` and `…-mac`, every rule commented
//! `macspoofchk-<cid>-<ifname>`.
//!
//! Changes are nf_tables transactions over netlink (the crate's `nfnetlink` client),
//! with the expressions nft generates for the reference's rules, so nothing
//! is exec'd and names need no quoting. Each call is one transaction, so
//! unlike the reference's two, a repeated setup replaces its PREROUTING rule
//! instead of adding a second one.

use std::collections::HashSet;

use cni_protocol::MacAddr;

use crate::error::{Error, Result};
use crate::naming::{
    MACSPOOF_CHAIN_PREFIX, macspoof_comment, macspoof_iface_chain, macspoof_mac_chain,
};
use crate::nfnetlink::{
    BASE_LINK, Batch, CMP_EQ, Expr, META_IIFNAME, NFPROTO_BRIDGE, Nfnl, REG_1, Rule, VERDICT_DROP,
    VERDICT_JUMP, VERDICT_RETURN,
};
use crate::nft_build::{add_bridge_prerouting, verdict};

const FAMILY: &str = "bridge";
const TABLE: &str = "nat";
const BASE_CHAIN: &str = "PREROUTING";
/// nft's `dstnat` priority in the bridge family.
const PRIORITY_DSTNAT: i32 = -300;
/// `IFNAMSIZ`: nft compares interface names as this many bytes, NUL-padded.
const IFNAMSIZ: usize = 16;

fn target() -> String {
    format!("table {FAMILY} {TABLE}")
}

/// The chains and rules of `bridge nat`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) chains: Vec<String>,
    pub(crate) rules: Vec<Rule>,
}

impl Snapshot {
    fn has_chain(&self, name: &str) -> bool {
        self.chains.iter().any(|c| c == name)
    }

    fn rules_in<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a Rule> + 'a {
        self.rules.iter().filter(move |r| r.chain == chain)
    }
}

/// `iifname "<host_veth>" jump <iface_chain>`.
fn iface_match_expr(host_veth: &str, iface_chain: &str) -> Vec<Expr> {
    let mut name = host_veth.as_bytes().to_vec();
    name.resize(IFNAMSIZ.max(name.len() + 1), 0);
    vec![
        Expr::Meta {
            key: META_IIFNAME,
            dreg: REG_1,
        },
        Expr::Cmp {
            sreg: REG_1,
            op: CMP_EQ,
            data: name,
        },
        verdict(VERDICT_JUMP, Some(iface_chain)),
    ]
}

/// `jump <to>`.
fn jump_expr(to: &str) -> Vec<Expr> {
    vec![verdict(VERDICT_JUMP, Some(to))]
}

/// `ether saddr <mac> return`.
fn mac_expr(mac: MacAddr) -> Vec<Expr> {
    vec![
        Expr::Payload {
            dreg: REG_1,
            base: BASE_LINK,
            offset: 6,
            len: 6,
        },
        Expr::Cmp {
            sreg: REG_1,
            op: CMP_EQ,
            data: mac.octets().to_vec(),
        },
        verdict(VERDICT_RETURN, None),
    ]
}

/// `drop`.
fn drop_expr() -> Vec<Expr> {
    vec![verdict(VERDICT_DROP, None)]
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

/// Interface names are at most 15 bytes; nft refuses longer ones too.
fn check_ifname(value: &str) -> Result<()> {
    check_name("host interface name", value)?;
    if value.len() >= IFNAMSIZ {
        return Err(Error::InvalidInput {
            what: "host interface name",
            value: value.into(),
            reason: "longer than 15 bytes",
        });
    }
    Ok(())
}

/// Handles of PREROUTING rules that belong to this attachment: by comment,
/// and any rule jumping into its chain (which would block deleting it).
fn own_prerouting_rules(rules: &[Rule], comment: &str, iface_chain: &str) -> Vec<u64> {
    rules
        .iter()
        .filter(|r| r.chain == BASE_CHAIN)
        .filter(|r| r.comment.as_deref() == Some(comment) || r.jump_target() == Some(iface_chain))
        .map(|r| r.handle)
        .collect()
}

/// The setup transaction; `stale` are PREROUTING handles of an earlier setup.
pub(crate) fn setup_batch(
    container_id: &str,
    ifname: &str,
    host_veth: &str,
    mac: MacAddr,
    stale: &[u64],
) -> Result<Batch> {
    let iface = macspoof_iface_chain(container_id, ifname);
    let mac_chain = macspoof_mac_chain(container_id, ifname);
    let comment = macspoof_comment(container_id, ifname);
    let f = NFPROTO_BRIDGE;
    let mut b = Batch::new();
    b.add_table(f, TABLE, None)?;
    add_bridge_prerouting(&mut b, TABLE, BASE_CHAIN, PRIORITY_DSTNAT)?;
    b.add_chain(f, TABLE, &iface, None, None)?;
    b.add_chain(f, TABLE, &mac_chain, None, None)?;
    b.flush_chain(f, TABLE, &iface);
    b.flush_chain(f, TABLE, &mac_chain);
    for handle in stale {
        b.delete_rule(f, TABLE, BASE_CHAIN, *handle);
    }
    let c = Some(comment.as_str());
    b.add_rule(
        f,
        TABLE,
        BASE_CHAIN,
        &iface_match_expr(host_veth, &iface),
        c,
    )?;
    b.add_rule(f, TABLE, &iface, &jump_expr(&mac_chain), c)?;
    b.add_rule(f, TABLE, &mac_chain, &mac_expr(mac), c)?;
    b.add_rule(f, TABLE, &mac_chain, &drop_expr(), c)?;
    Ok(b)
}

/// Removes PREROUTING rules by handle and the given chains (flushed first,
/// as a chain must be empty and unreferenced to go).
fn removal_batch(prerouting: &[u64], chains: &[String]) -> Option<Batch> {
    if prerouting.is_empty() && chains.is_empty() {
        return None;
    }
    let mut b = Batch::new();
    for handle in prerouting {
        b.delete_rule(NFPROTO_BRIDGE, TABLE, BASE_CHAIN, *handle);
    }
    for chain in chains {
        b.flush_chain(NFPROTO_BRIDGE, TABLE, chain);
    }
    for chain in chains {
        b.delete_chain(NFPROTO_BRIDGE, TABLE, chain);
    }
    Some(b)
}

/// The teardown transaction for what of this attachment `table` shows.
pub(crate) fn teardown_batch(container_id: &str, ifname: &str, table: &Snapshot) -> Option<Batch> {
    let iface = macspoof_iface_chain(container_id, ifname);
    let comment = macspoof_comment(container_id, ifname);
    let rules = own_prerouting_rules(&table.rules, &comment, &iface);
    let chains: Vec<String> = [iface, macspoof_mac_chain(container_id, ifname)]
        .into_iter()
        .filter(|c| table.has_chain(c))
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
    table: &Snapshot,
    is_live: impl Fn(&str) -> bool,
) -> Option<Batch> {
    let mut keep: HashSet<String> = valid
        .iter()
        .flat_map(|(cid, ifname)| {
            [
                macspoof_iface_chain(cid, ifname),
                macspoof_mac_chain(cid, ifname),
            ]
        })
        .collect();
    for rule in table.rules_in(BASE_CHAIN) {
        if let (Some(to), Some(ifname)) = (rule.jump_target(), matched_iifname(&rule.exprs))
            && to.starts_with(MACSPOOF_CHAIN_PREFIX)
            && is_live(&ifname)
        {
            keep.insert(to.to_owned());
        }
    }
    loop {
        let reached: Vec<String> = table
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
    let stale: Vec<String> = table
        .chains
        .iter()
        .filter(|c| c.starts_with(MACSPOOF_CHAIN_PREFIX) && !keep.contains(*c))
        .cloned()
        .collect();
    let rules: Vec<u64> = table
        .rules_in(BASE_CHAIN)
        .filter(|r| {
            r.jump_target()
                .is_some_and(|t| stale.iter().any(|s| s == t))
        })
        .map(|r| r.handle)
        .collect();
    removal_batch(&rules, &stale)
}

/// The interface name an `iifname == "<name>"` match compares with.
fn matched_iifname(exprs: &[Expr]) -> Option<String> {
    exprs.windows(2).find_map(|pair| match pair {
        [
            Expr::Meta {
                key: META_IIFNAME,
                dreg,
            },
            Expr::Cmp {
                sreg,
                op: CMP_EQ,
                data,
            },
        ] if dreg == sreg => {
            let name = data.split(|b| *b == 0).next().unwrap_or_default();
            Some(String::from_utf8_lossy(name).into_owned())
        }
        _ => None,
    })
}

/// What CHECK finds missing: (where, what) pairs.
pub(crate) fn missing(
    container_id: &str,
    ifname: &str,
    host_veth: &str,
    mac: MacAddr,
    table: &Snapshot,
) -> Vec<(String, String)> {
    let iface = macspoof_iface_chain(container_id, ifname);
    let mac_chain = macspoof_mac_chain(container_id, ifname);
    let comment = macspoof_comment(container_id, ifname);
    let position = |chain: &str, exprs: &[Expr]| {
        table
            .rules_in(chain)
            .position(|r| r.comment.as_deref() == Some(comment.as_str()) && r.exprs == exprs)
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

/// Reads `bridge nat`; `None` when the table does not exist.
fn read_table(nl: &mut Nfnl) -> Result<Option<Snapshot>> {
    if !nl.has_table(NFPROTO_BRIDGE, TABLE)? {
        return Ok(None);
    }
    Ok(Some(Snapshot {
        chains: nl.chain_names(NFPROTO_BRIDGE, TABLE)?,
        rules: nl.rules(NFPROTO_BRIDGE, TABLE, None)?,
    }))
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
    check_ifname(host_veth)?;
    let mac = container_mac.container_mac()?;
    let comment = macspoof_comment(container_id, ifname);
    let iface = macspoof_iface_chain(container_id, ifname);
    let mut nl = Nfnl::open()?;
    // A stale handle can vanish between listing and applying (a concurrent
    // teardown of the same attachment); retry with a fresh listing.
    let mut attempts_left = 3;
    loop {
        let prerouting = nl.rules(NFPROTO_BRIDGE, TABLE, Some(BASE_CHAIN))?;
        let stale = own_prerouting_rules(&prerouting, &comment, &iface);
        let batch = setup_batch(container_id, ifname, host_veth, mac, &stale)?;
        match nl.commit(batch, &target()) {
            Err(_) if !stale.is_empty() && attempts_left > 1 => attempts_left -= 1,
            other => return other,
        }
    }
}

/// Removes an attachment's spoof check; an absent table or chains mean
/// there is nothing to do.
pub fn teardown(container_id: &str, ifname: &str) -> Result<()> {
    let mut nl = Nfnl::open()?;
    let Some(table) = read_table(&mut nl)? else {
        return Ok(());
    };
    match teardown_batch(container_id, ifname, &table) {
        Some(batch) => nl.commit(batch, &target()),
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
    let mac = container_mac.container_mac()?;
    let mut nl = Nfnl::open()?;
    let table = read_table(&mut nl)?.ok_or_else(|| Error::Missing {
        backend: "nftables",
        target: "bridge ruleset".into(),
        what: target(),
    })?;
    let errors = missing(container_id, ifname, host_veth, mac, &table)
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
/// interface name) whose host interface is gone (see `gc_batch` for why
/// live interfaces are spared).
pub fn gc<C: AsRef<str>, I: AsRef<str>>(valid: &[(C, I)]) -> Result<()> {
    let valid: Vec<(&str, &str)> = valid
        .iter()
        .map(|(c, i)| (c.as_ref(), i.as_ref()))
        .collect();
    let mut nl = Nfnl::open()?;
    let Some(table) = read_table(&mut nl)? else {
        return Ok(());
    };
    let live = live_interfaces();
    let is_live = |name: &str| live.as_ref().is_none_or(|l| l.contains(name));
    match gc_batch(&valid, &table, is_live) {
        Some(batch) => nl.commit(batch, &target()),
        None => Ok(()),
    }
}

/// Interface names in the calling thread's network namespace (the one nft
/// runs in); `None` if they cannot be read, in which case GC keeps every
/// chain with an interface match.
pub(crate) fn live_interfaces() -> Option<HashSet<String>> {
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

    const MAC_A: MacAddr = MacAddr([0x02, 0x42, 0xac, 0x11, 0x00, 0x02]);
    const MAC_B: MacAddr = MacAddr([0x02, 0x42, 0xac, 0x11, 0x00, 0x03]);

    fn rule(chain: &str, handle: u64, comment: &str, exprs: Vec<Expr>) -> Rule {
        Rule {
            chain: chain.into(),
            handle,
            comment: Some(comment.into()),
            exprs,
        }
    }

    /// `bridge nat` after setups of ctrA/eth0 on veth1234 and ctrB/eth0 on
    /// vethdead, handles as nft 1.0.6 assigned them.
    fn table() -> Snapshot {
        let (a, b) = ("macspoofchk-ctrA-eth0", "macspoofchk-ctrB-eth0");
        let (ia, ma) = ("cni-br-iface-ctrA-eth0", "cni-br-iface-ctrA-eth0-mac");
        let (ib, mb) = ("cni-br-iface-ctrB-eth0", "cni-br-iface-ctrB-eth0-mac");
        Snapshot {
            chains: [BASE_CHAIN, ia, ma, ib, mb].map(String::from).to_vec(),
            rules: vec![
                rule(BASE_CHAIN, 4, a, iface_match_expr("veth1234", ia)),
                rule(BASE_CHAIN, 14, b, iface_match_expr("vethdead", ib)),
                rule(ia, 9, a, jump_expr(ma)),
                rule(ma, 10, a, mac_expr(MAC_A)),
                rule(ma, 11, a, drop_expr()),
                rule(ib, 15, b, jump_expr(mb)),
                rule(mb, 16, b, mac_expr(MAC_B)),
                rule(mb, 17, b, drop_expr()),
            ],
        }
    }

    /// What `nft --debug=netlink` shows for the reference's rules (nft
    /// 1.0.6): `meta load iifname`, `cmp eq` with the NUL-padded 16-byte
    /// name, `immediate jump`; `payload load 6b @ link header + 6`, `cmp eq`
    /// the MAC, `immediate return`; `immediate drop`.
    #[test]
    fn rules_are_what_nft_generates() {
        let e = iface_match_expr("veth1234", "c");
        assert_eq!(
            e[1],
            Expr::Cmp {
                sreg: REG_1,
                op: CMP_EQ,
                data: b"veth1234\0\0\0\0\0\0\0\0".to_vec()
            }
        );
        assert_eq!(matched_iifname(&e).as_deref(), Some("veth1234"));
        assert_eq!(
            mac_expr(MAC_A)[..2],
            [
                Expr::Payload {
                    dreg: REG_1,
                    base: BASE_LINK,
                    offset: 6,
                    len: 6
                },
                Expr::Cmp {
                    sreg: REG_1,
                    op: CMP_EQ,
                    data: vec![2, 0x42, 0xac, 0x11, 0, 2]
                }
            ]
        );
        assert_eq!(drop_expr(), vec![verdict(0, None)]);
    }

    #[test]
    fn setup_batch_is_exact() {
        let batch = setup_batch("ctrA", "eth0", "veth1234", MAC_A, &[4]).unwrap();
        assert_eq!(
            batch.describe(),
            [
                "add table bridge nat",
                "add chain bridge nat PREROUTING",
                "add chain bridge nat cni-br-iface-ctrA-eth0",
                "add chain bridge nat cni-br-iface-ctrA-eth0-mac",
                "flush chain bridge nat cni-br-iface-ctrA-eth0",
                "flush chain bridge nat cni-br-iface-ctrA-eth0-mac",
                "delete rule bridge nat PREROUTING handle 4",
                "add rule bridge nat PREROUTING (comment \"macspoofchk-ctrA-eth0\")",
                "add rule bridge nat cni-br-iface-ctrA-eth0 (comment \"macspoofchk-ctrA-eth0\")",
                "add rule bridge nat cni-br-iface-ctrA-eth0-mac (comment \"macspoofchk-ctrA-eth0\")",
                "add rule bridge nat cni-br-iface-ctrA-eth0-mac (comment \"macspoofchk-ctrA-eth0\")",
            ]
        );
    }

    #[test]
    fn teardown_batch_is_exact() {
        let batch = teardown_batch("ctrA", "eth0", &table()).unwrap();
        assert_eq!(
            batch.describe(),
            [
                "delete rule bridge nat PREROUTING handle 4",
                "flush chain bridge nat cni-br-iface-ctrA-eth0",
                "flush chain bridge nat cni-br-iface-ctrA-eth0-mac",
                "delete chain bridge nat cni-br-iface-ctrA-eth0",
                "delete chain bridge nat cni-br-iface-ctrA-eth0-mac",
            ]
        );
        assert!(teardown_batch("ctrZ", "eth0", &table()).is_none());
    }

    #[test]
    fn check_accepts_setup_and_names_gaps() {
        let t = table();
        assert!(missing("ctrA", "eth0", "veth1234", MAC_A, &t).is_empty());
        let mut no_mac_match = t.clone();
        no_mac_match.rules.retain(|r| r.handle != 10);
        assert_eq!(
            missing("ctrA", "eth0", "veth1234", MAC_A, &no_mac_match).len(),
            1
        );
        let m = missing(
            "ctrA",
            "eth0",
            "veth9999",
            MacAddr([2, 0x42, 0xac, 0x11, 0, 9]),
            &t,
        );
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
        // Drop ahead of the MAC match.
        let mut swapped = t.clone();
        swapped.rules.swap(3, 4);
        assert_eq!(
            missing("ctrA", "eth0", "veth1234", MAC_A, &swapped).len(),
            1
        );
    }

    #[test]
    fn gc_removes_invalid_dead_attachments_only() {
        let t = table();
        // Nothing valid, nothing live: both attachments go.
        let batch = gc_batch(&[], &t, |_| false).unwrap();
        let ops = batch.describe();
        for op in [
            "delete chain bridge nat cni-br-iface-ctrA-eth0",
            "delete chain bridge nat cni-br-iface-ctrB-eth0-mac",
            "delete rule bridge nat PREROUTING handle 4",
            "delete rule bridge nat PREROUTING handle 14",
        ] {
            assert!(ops.contains(&op), "{ops:#?}");
        }

        // ctrA valid, ctrB's veth gone: only ctrB goes.
        let batch = gc_batch(&[("ctrA", "eth0")], &t, |_| false).unwrap();
        assert_eq!(
            batch.describe(),
            [
                "delete rule bridge nat PREROUTING handle 14",
                "flush chain bridge nat cni-br-iface-ctrB-eth0",
                "flush chain bridge nat cni-br-iface-ctrB-eth0-mac",
                "delete chain bridge nat cni-br-iface-ctrB-eth0",
                "delete chain bridge nat cni-br-iface-ctrB-eth0-mac",
            ]
        );

        // ctrB's veth still exists (another network's attachment): kept.
        assert!(gc_batch(&[("ctrA", "eth0")], &t, |n| n == "vethdead").is_none());
    }

    #[test]
    fn long_host_interface_names_are_refused() {
        assert!(check_ifname("veth0123456789a").is_ok());
        assert!(check_ifname("veth0123456789ab").is_err());
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
}
