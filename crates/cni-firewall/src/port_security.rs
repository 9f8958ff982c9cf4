//! The bridge's `portSecurity`: what a pod may send into the bridge, so that it
//! cannot pass itself off as a neighbour (IP or ARP spoofing, forged neighbour
//! advertisements) or act as a router or DHCP server for them.
//!
//! Everything lives in the nftables table `bridge cni_port_security`. Its one base
//! chain (`prerouting`, bridge filter priority) has a single rule,
//! `meta iifname vmap @ports`: a hash lookup of the frame's input port, so the
//! per-packet cost stays the same however many pods the bridge has. Each protected
//! port has an element in `ports` that jumps to its own chain (`port-<hash>`, and
//! `port-<hash>-na` for neighbour advertisements), built from the attachment's MAC
//! and addresses; ports without an element are not filtered. Each change is one
//! nf_tables transaction.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cni_protocol::MacAddr;

use crate::error::{Error, Result};
use crate::naming::{NFT_COMMENT_MAX, PORT_SECURITY_CHAIN_PREFIX, port_security_chain};
use crate::nfnetlink::{
    BASE_LINK, BASE_NETWORK, BASE_TRANSPORT, Batch, CMP_EQ, CMP_NEQ, Data, Expr,
    HOOK_BRIDGE_PREROUTING, Hook, META_IIFNAME, META_L4PROTO, META_PROTOCOL, NFPROTO_BRIDGE, Nfnl,
    POLICY_ACCEPT, REG_1, REG_VERDICT, Rule, TYPE_IFNAME, VERDICT_DROP, VERDICT_JUMP,
    VERDICT_RETURN, is_not_found, is_restart,
};

/// The table, its base chain and the port map.
pub const TABLE: &str = "cni_port_security";
const BASE_CHAIN: &str = "prerouting";
const MAP: &str = "ports";
/// nft's `filter` priority in the bridge family.
const PRIORITY_FILTER: i32 = -200;
/// `IFNAMSIZ`: the map's keys are NUL-padded interface names of this size.
const IFNAMSIZ: usize = 16;
/// Suffix of a port's neighbour-advertisement chain.
const NA_SUFFIX: &str = "-na";

const ETH_P_IP: u16 = 0x0800;
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
const ICMPV6_MLD_REPORT: u8 = 131;
const ICMPV6_ROUTER_ADVERT: u8 = 134;
const ICMPV6_NEIGHBOR_SOLICIT: u8 = 135;
const ICMPV6_NEIGHBOR_ADVERT: u8 = 136;
const ICMPV6_REDIRECT: u8 = 137;
const ICMPV6_MLD2_REPORT: u8 = 143;

/// One attachment as the rules see it: who the pod is on its port.
#[derive(Debug, Clone, Copy)]
pub struct Port<'a> {
    /// The container ID (names the port's chains).
    pub container_id: &'a str,
    /// The interface name inside the container (names the port's chains).
    pub ifname: &'a str,
    /// The host end of the pod's veth: the bridge port the rules apply to.
    pub host_veth: &'a str,
    /// The pod interface's MAC.
    pub mac: MacAddr,
    /// The pod interface's addresses from IPAM. Its IPv6 link-local address is
    /// added by the rules themselves ([`link_local`]).
    pub addresses: &'a [IpAddr],
}

/// The IPv6 link-local address the kernel gives an interface with MAC `mac` under
/// EUI-64 address generation (`addr_gen_mode` 0), which the bridge sets on the
/// pod's interface when `portSecurity` is on, so that it is known before the link
/// comes up.
pub fn link_local(mac: MacAddr) -> Ipv6Addr {
    let m = mac.octets();
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

/// A rule as it is added and as CHECK expects it, with its nft spelling for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expected {
    exprs: Vec<Expr>,
    what: String,
}

/// The names of an attachment's chains.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chains {
    main: String,
    na: String,
}

impl Chains {
    fn of(container_id: &str, ifname: &str) -> Chains {
        let main = port_security_chain(container_id, ifname);
        let na = format!("{main}{NA_SUFFIX}");
        Chains { main, na }
    }
}

fn load(base: u32, offset: u32, len: u32) -> Expr {
    Expr::Payload {
        dreg: REG_1,
        base,
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

fn meta(key: u32) -> Expr {
    Expr::Meta { key, dreg: REG_1 }
}

fn verdict(code: i32, chain: Option<&str>) -> Expr {
    Expr::Immediate {
        dreg: REG_VERDICT,
        data: Data::Verdict {
            code,
            chain: chain.map(Into::into),
        },
    }
}

/// `NF_ACCEPT`.
const VERDICT_ACCEPT: i32 = 1;

/// `meta protocol <ethertype>`.
fn ethertype(proto: u16) -> [Expr; 2] {
    [meta(META_PROTOCOL), cmp(CMP_EQ, &proto.to_be_bytes())]
}

/// `meta l4proto <proto>`.
fn l4proto(proto: u8) -> [Expr; 2] {
    [meta(META_L4PROTO), cmp(CMP_EQ, &[proto])]
}

/// `meta protocol ip6 meta l4proto icmpv6 icmpv6 type <ty>`.
fn icmpv6_type(ty: u8) -> Vec<Expr> {
    let mut e = ethertype(ETH_P_IPV6).to_vec();
    e.extend(l4proto(IPPROTO_ICMPV6));
    e.extend([load(BASE_TRANSPORT, 0, 1), cmp(CMP_EQ, &[ty])]);
    e
}

fn rule(mut exprs: Vec<Expr>, code: i32, chain: Option<&str>, what: String) -> Expected {
    exprs.push(verdict(code, chain));
    Expected { exprs, what }
}

/// The rules of a port's main chain, in order.
fn main_rules(port: &Port<'_>, chains: &Chains) -> Vec<Expected> {
    let mac = port.mac.octets();
    let v4: Vec<Ipv4Addr> = port
        .addresses
        .iter()
        .filter_map(|a| match a {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        })
        .collect();
    let v6 = own_ipv6(port);
    let mut out = vec![rule(
        vec![load(BASE_LINK, 6, 6), cmp(CMP_NEQ, &mac)],
        VERDICT_DROP,
        None,
        format!("ether saddr != {} drop", port.mac),
    )];

    // IPv4: no DHCP server, own sources, and a DHCP client's discovery.
    let mut dhcp_server = ethertype(ETH_P_IP).to_vec();
    dhcp_server.extend(l4proto(IPPROTO_UDP));
    dhcp_server.extend([
        load(BASE_TRANSPORT, 0, 2),
        cmp(CMP_EQ, &67u16.to_be_bytes()),
    ]);
    out.push(rule(
        dhcp_server,
        VERDICT_DROP,
        None,
        "meta protocol ip udp sport 67 drop".into(),
    ));
    for a in &v4 {
        let mut e = ethertype(ETH_P_IP).to_vec();
        e.extend([load(BASE_NETWORK, 12, 4), cmp(CMP_EQ, &a.octets())]);
        out.push(rule(
            e,
            VERDICT_ACCEPT,
            None,
            format!("meta protocol ip ip saddr {a} accept"),
        ));
    }
    let mut discover = ethertype(ETH_P_IP).to_vec();
    discover.extend([
        load(BASE_NETWORK, 12, 8),
        cmp(CMP_EQ, &[0, 0, 0, 0, 255, 255, 255, 255]),
    ]);
    discover.extend(l4proto(IPPROTO_UDP));
    discover.extend([load(BASE_TRANSPORT, 0, 4), cmp(CMP_EQ, &[0, 68, 0, 67])]);
    out.push(rule(
        discover,
        VERDICT_ACCEPT,
        None,
        "meta protocol ip ip saddr 0.0.0.0 ip daddr 255.255.255.255 udp sport 68 udp dport 67 accept".into(),
    ));

    // ARP: Ethernet/IPv4 only, the pod's MAC as sender, its addresses (or a
    // probe's 0.0.0.0) as sender address; every other ARP packet meets the final
    // drop. Written as matches that must all hold, so that `nft list` prints them
    // with their meaning.
    for a in v4.iter().chain([&Ipv4Addr::UNSPECIFIED]) {
        let mut e = ethertype(ETH_P_ARP).to_vec();
        e.extend([
            load(BASE_NETWORK, 0, 6),
            cmp(CMP_EQ, &[0, 1, 0x08, 0, 6, 4]),
            load(BASE_NETWORK, 8, 6),
            cmp(CMP_EQ, &mac),
            load(BASE_NETWORK, 14, 4),
            cmp(CMP_EQ, &a.octets()),
        ]);
        out.push(rule(
            e,
            VERDICT_ACCEPT,
            None,
            format!(
                "arp htype 1 arp ptype ip arp hlen 6 arp plen 4 arp saddr ether {} arp saddr ip {a} accept",
                port.mac
            ),
        ));
    }

    // IPv6: no router advertisements, redirects or DHCPv6 server; neighbour
    // advertisements checked apart; own sources; DAD and MLD from `::`.
    for (ty, name) in [
        (ICMPV6_ROUTER_ADVERT, "nd-router-advert"),
        (ICMPV6_REDIRECT, "nd-redirect"),
    ] {
        out.push(rule(
            icmpv6_type(ty),
            VERDICT_DROP,
            None,
            format!("meta protocol ip6 icmpv6 type {name} drop"),
        ));
    }
    let mut dhcp6_server = ethertype(ETH_P_IPV6).to_vec();
    dhcp6_server.extend(l4proto(IPPROTO_UDP));
    dhcp6_server.extend([
        load(BASE_TRANSPORT, 0, 2),
        cmp(CMP_EQ, &547u16.to_be_bytes()),
    ]);
    out.push(rule(
        dhcp6_server,
        VERDICT_DROP,
        None,
        "meta protocol ip6 udp sport 547 drop".into(),
    ));
    out.push(rule(
        icmpv6_type(ICMPV6_NEIGHBOR_ADVERT),
        VERDICT_JUMP,
        Some(&chains.na),
        format!(
            "meta protocol ip6 icmpv6 type nd-neighbor-advert jump {}",
            chains.na
        ),
    ));
    for a in &v6 {
        let mut e = ethertype(ETH_P_IPV6).to_vec();
        e.extend([load(BASE_NETWORK, 8, 16), cmp(CMP_EQ, &a.octets())]);
        out.push(rule(
            e,
            VERDICT_ACCEPT,
            None,
            format!("meta protocol ip6 ip6 saddr {a} accept"),
        ));
    }
    for (ty, name) in [
        (ICMPV6_MLD_REPORT, "mld-listener-report"),
        (ICMPV6_NEIGHBOR_SOLICIT, "nd-neighbor-solicit"),
        (ICMPV6_MLD2_REPORT, "mld2-listener-report"),
    ] {
        let mut e = ethertype(ETH_P_IPV6).to_vec();
        e.extend([
            load(BASE_NETWORK, 8, 16),
            cmp(CMP_EQ, &Ipv6Addr::UNSPECIFIED.octets()),
            load(BASE_NETWORK, 24, 2),
            cmp(CMP_EQ, &[0xff, 0x02]),
        ]);
        e.extend(l4proto(IPPROTO_ICMPV6));
        e.extend([load(BASE_TRANSPORT, 0, 1), cmp(CMP_EQ, &[ty])]);
        out.push(rule(
            e,
            VERDICT_ACCEPT,
            None,
            format!("meta protocol ip6 ip6 saddr :: ip6 daddr ff02::/16 icmpv6 type {name} accept"),
        ));
    }
    // Everything else: other sources, other EtherTypes.
    out.push(rule(Vec::new(), VERDICT_DROP, None, "drop".into()));
    out
}

/// The pod's IPv6 addresses and its link-local address.
fn own_ipv6(port: &Port<'_>) -> Vec<Ipv6Addr> {
    let mut v6: Vec<Ipv6Addr> = port
        .addresses
        .iter()
        .filter_map(|a| match a {
            IpAddr::V6(a) => Some(*a),
            IpAddr::V4(_) => None,
        })
        .collect();
    let ll = link_local(port.mac);
    if !v6.contains(&ll) {
        v6.push(ll);
    }
    v6
}

/// The rules of a port's neighbour-advertisement chain: the advertisement must
/// carry no extension header, name one of the pod's own addresses as target, and
/// either carry no option or exactly one target link-layer address option with the
/// pod's MAC. Those that pass return to the main chain, which checks the source.
fn na_rules(port: &Port<'_>) -> Vec<Expected> {
    let mac = port.mac.octets();
    let mut out = vec![rule(
        vec![load(BASE_NETWORK, 6, 1), cmp(CMP_NEQ, &[IPPROTO_ICMPV6])],
        VERDICT_DROP,
        None,
        "ip6 nexthdr != icmpv6 drop".into(),
    )];
    let mut tlla = vec![2, 1];
    tlla.extend_from_slice(&mac);
    for target in own_ipv6(port) {
        out.push(rule(
            vec![
                load(BASE_NETWORK, 4, 2),
                cmp(CMP_EQ, &24u16.to_be_bytes()),
                load(BASE_TRANSPORT, 8, 16),
                cmp(CMP_EQ, &target.octets()),
            ],
            VERDICT_RETURN,
            None,
            format!("ip6 length 24 icmpv6 target {target} return"),
        ));
        out.push(rule(
            vec![
                load(BASE_NETWORK, 4, 2),
                cmp(CMP_EQ, &32u16.to_be_bytes()),
                load(BASE_TRANSPORT, 8, 16),
                cmp(CMP_EQ, &target.octets()),
                load(BASE_TRANSPORT, 24, 8),
                cmp(CMP_EQ, &tlla),
            ],
            VERDICT_RETURN,
            None,
            format!(
                "ip6 length 32 icmpv6 target {target} option tll {} return",
                port.mac
            ),
        ));
    }
    out.push(rule(Vec::new(), VERDICT_DROP, None, "drop".into()));
    out
}

/// `meta iifname vmap @ports`.
fn dispatch_rule() -> Vec<Expr> {
    vec![
        meta(META_IIFNAME),
        Expr::Lookup {
            sreg: REG_1,
            dreg: Some(REG_VERDICT),
            set: MAP.into(),
            invert: false,
        },
    ]
}

/// A map key: the interface name, NUL-padded to `IFNAMSIZ`.
fn port_key(host_veth: &str) -> Vec<u8> {
    let mut key = host_veth.as_bytes().to_vec();
    key.resize(IFNAMSIZ, 0);
    key
}

/// The interface name of a map key.
fn key_name(key: &[u8]) -> String {
    let name = key.split(|b| *b == 0).next().unwrap_or_default();
    String::from_utf8_lossy(name).into_owned()
}

/// `<containerID> <ifname>`, cut to what an nftables comment holds, for people
/// reading `nft list` (nothing matches on it).
fn chain_comment(container_id: &str, ifname: &str) -> String {
    let mut text = format!("{container_id} {ifname}");
    let mut end = text.len().min(NFT_COMMENT_MAX - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

fn check_port(port: &Port<'_>) -> Result<()> {
    let bad = |what: &'static str, value: &str, reason: &'static str| {
        Err(Error::InvalidInput {
            what,
            value: value.into(),
            reason,
        })
    };
    if port.host_veth.is_empty() || port.host_veth.len() >= IFNAMSIZ {
        return bad(
            "host interface name",
            port.host_veth,
            "must be 1 to 15 bytes",
        );
    }
    if port
        .host_veth
        .bytes()
        .any(|b| b == 0 || b.is_ascii_control())
    {
        return bad(
            "host interface name",
            port.host_veth,
            "contains control characters",
        );
    }
    Ok(())
}

fn target() -> String {
    format!("table bridge {TABLE}")
}

/// What the setup transaction finds in place.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Found {
    /// The table, base chain, map and dispatch rule exist.
    base: bool,
    /// The port's chains exist (an earlier setup of the same attachment).
    chains: bool,
    /// The port's map element exists, with the chain it jumps to.
    element: Option<Option<String>>,
}

/// The setup transaction, given what exists.
fn setup_batch(port: &Port<'_>, found: &Found, generation: Option<u32>) -> Result<Batch> {
    let chains = Chains::of(port.container_id, port.ifname);
    let f = NFPROTO_BRIDGE;
    let mut b = match generation {
        Some(g) => Batch::at_generation(g),
        None => Batch::new(),
    };
    if !found.base {
        b.add_table(f, TABLE, None)?;
        b.add_verdict_map(f, TABLE, MAP, TYPE_IFNAME, IFNAMSIZ as u32);
        let hook = Hook {
            chain_type: "filter",
            hooknum: HOOK_BRIDGE_PREROUTING,
            priority: PRIORITY_FILTER,
            policy: Some(POLICY_ACCEPT),
        };
        b.add_chain(f, TABLE, BASE_CHAIN, Some(hook), None)?;
        b.add_rule(f, TABLE, BASE_CHAIN, &dispatch_rule(), None)?;
    }
    if found.chains {
        b.flush_chain(f, TABLE, &chains.main);
        b.flush_chain(f, TABLE, &chains.na);
    } else {
        let comment = chain_comment(port.container_id, port.ifname);
        b.add_chain(f, TABLE, &chains.na, None, None)?;
        b.add_chain(f, TABLE, &chains.main, None, Some(&comment))?;
    }
    for r in na_rules(port) {
        b.add_rule(f, TABLE, &chains.na, &r.exprs, None)?;
    }
    for r in main_rules(port, &chains) {
        b.add_rule(f, TABLE, &chains.main, &r.exprs, None)?;
    }
    let key = port_key(port.host_veth);
    match &found.element {
        Some(Some(to)) if *to == chains.main => {}
        Some(_) => {
            b.delete_map_element(f, TABLE, MAP, &key);
            b.add_map_jump(f, TABLE, MAP, &key, &chains.main);
        }
        None => b.add_map_jump(f, TABLE, MAP, &key, &chains.main),
    }
    Ok(b)
}

/// Whether `chain` exists in our table; a missing table is a missing chain.
fn has_chain(nl: &mut Nfnl, chain: &str) -> Result<bool> {
    match nl.has_chain(NFPROTO_BRIDGE, TABLE, chain) {
        Err(e) if is_not_found(&e) => Ok(false),
        other => other,
    }
}

/// The map's elements; none when the table or map is missing.
fn elements(nl: &mut Nfnl) -> Result<Vec<(Vec<u8>, Option<String>)>> {
    match nl.map_elements(NFPROTO_BRIDGE, TABLE, MAP) {
        Err(e) if is_not_found(&e) => Ok(Vec::new()),
        other => other,
    }
}

/// The operator's error when nf_tables cannot be used at all.
fn unavailable(e: &Error) -> Error {
    Error::Netlink {
        target: target(),
        detail: format!(
            "portSecurity needs nf_tables with the bridge family, which cannot be used here: {e}"
        ),
        errno: None,
    }
}

/// Installs (or replaces) the port's rules and its map element in one transaction.
/// The port forwards nothing of the pod's until this returns.
pub fn setup(port: &Port<'_>) -> Result<()> {
    check_port(port)?;
    let chains = Chains::of(port.container_id, port.ifname);
    let mut nl = Nfnl::open().map_err(|e| unavailable(&e))?;
    let key = port_key(port.host_veth);
    for _ in 0..8 {
        let mut found = Found {
            base: has_chain(&mut nl, BASE_CHAIN).map_err(|e| unavailable(&e))?,
            ..Found::default()
        };
        // The first port of a node creates the table; concurrent first ports must
        // not each add a dispatch rule, so that transaction runs only if nothing
        // changed since the table was seen missing.
        let generation = if found.base {
            None
        } else {
            let generation = nl.generation_id()?;
            found.base = has_chain(&mut nl, BASE_CHAIN)?;
            (!found.base).then_some(generation)
        };
        if found.base {
            found.chains = has_chain(&mut nl, &chains.main)?;
            found.element = nl.map_element(NFPROTO_BRIDGE, TABLE, MAP, &key)?;
        }
        let batch = setup_batch(port, &found, generation)?;
        match nl.commit(batch, &target()) {
            Err(e) if is_restart(&e) => continue,
            other => return other,
        }
    }
    Err(Error::Netlink {
        target: target(),
        detail: "the rule set kept changing while the table was being created".into(),
        errno: None,
    })
}

/// The transaction that removes the given ports' elements and chains; `existing`
/// are the table's chain names.
fn removal_batch(
    mains: &[String],
    existing: &HashSet<String>,
    elements: &[(Vec<u8>, Option<String>)],
) -> Option<Batch> {
    let f = NFPROTO_BRIDGE;
    let mut b = Batch::new();
    let mut any = false;
    for (key, to) in elements {
        if to.as_ref().is_some_and(|to| mains.contains(to)) {
            b.delete_map_element(f, TABLE, MAP, key);
            any = true;
        }
    }
    let mut doomed = Vec::new();
    for main in mains {
        let na = format!("{main}{NA_SUFFIX}");
        for chain in [main.clone(), na] {
            if existing.contains(&chain) {
                doomed.push(chain);
            }
        }
    }
    for chain in &doomed {
        b.flush_chain(f, TABLE, chain);
    }
    // The neighbour-advertisement chains first: the main chains jump to them.
    for chain in doomed
        .iter()
        .filter(|c| c.ends_with(NA_SUFFIX))
        .chain(doomed.iter().filter(|c| !c.ends_with(NA_SUFFIX)))
    {
        b.delete_chain(f, TABLE, chain);
        any = true;
    }
    any.then_some(b)
}

/// Removes an attachment's rules and map element; nothing there is nothing to do.
/// Needs neither the pod's netns nor its addresses.
pub fn teardown(container_id: &str, ifname: &str) -> Result<()> {
    let chains = Chains::of(container_id, ifname);
    let mut nl = Nfnl::open()?;
    // A concurrent GC may remove part of it between listing and applying.
    for _ in 0..3 {
        let mut existing = HashSet::new();
        for chain in [&chains.main, &chains.na] {
            if has_chain(&mut nl, chain)? {
                existing.insert(chain.clone());
            }
        }
        if existing.is_empty() {
            return Ok(());
        }
        let elements = elements(&mut nl)?;
        let Some(batch) = removal_batch(std::slice::from_ref(&chains.main), &existing, &elements)
        else {
            return Ok(());
        };
        match nl.commit(batch, &target()) {
            Err(e) if is_not_found(&e) => continue,
            other => return other,
        }
    }
    Ok(())
}

/// Verifies the port's rules are what [`setup`] installs for `port`, in order, and
/// that the port dispatches to them; the error names what is missing.
pub fn check(port: &Port<'_>) -> Result<()> {
    let chains = Chains::of(port.container_id, port.ifname);
    let mut nl = Nfnl::open()?;
    let missing = |target: String, what: String| Error::Missing {
        backend: "nftables",
        target,
        what,
    };
    let at = |chain: &str| format!("table bridge {TABLE} chain {chain}");
    if !has_chain(&mut nl, BASE_CHAIN)? {
        return Err(missing(target(), "the port-security table".into()));
    }
    let mut errors = Vec::new();
    let base = nl.rules(NFPROTO_BRIDGE, TABLE, Some(BASE_CHAIN))?;
    if !base.iter().any(|r| r.exprs == dispatch_rule()) {
        errors.push(missing(at(BASE_CHAIN), "meta iifname vmap @ports".into()));
    }
    let key = port_key(port.host_veth);
    if nl.map_element(NFPROTO_BRIDGE, TABLE, MAP, &key)?.flatten() != Some(chains.main.clone()) {
        errors.push(missing(
            format!("table bridge {TABLE} map {MAP}"),
            format!("\"{}\" : jump {}", port.host_veth, chains.main),
        ));
    }
    for (chain, expected) in [
        (&chains.main, main_rules(port, &chains)),
        (&chains.na, na_rules(port)),
    ] {
        let rules = if has_chain(&mut nl, chain)? {
            nl.rules(NFPROTO_BRIDGE, TABLE, Some(chain))?
        } else {
            Vec::new()
        };
        errors.extend(
            differences(&rules, &expected)
                .into_iter()
                .map(|what| missing(at(chain), what)),
        );
    }
    Error::collect(errors)
}

/// What of `expected` the chain's `rules` lack, or that they are out of order.
fn differences(rules: &[Rule], expected: &[Expected]) -> Vec<String> {
    let actual: Vec<&Vec<Expr>> = rules.iter().map(|r| &r.exprs).collect();
    if actual.len() == expected.len() && actual.iter().zip(expected).all(|(a, e)| **a == e.exprs) {
        return Vec::new();
    }
    let absent: Vec<String> = expected
        .iter()
        .filter(|e| !actual.contains(&&e.exprs))
        .map(|e| e.what.clone())
        .collect();
    if absent.is_empty() {
        vec!["the rules in the order portSecurity installs them (some were moved or added)".into()]
    } else {
        absent
    }
}

/// Removes the rules of ports whose attachment is not in `valid` (container id,
/// interface name) and whose host interface is gone. The table serves every
/// network on the node while `valid` covers one, so a port whose host interface
/// still exists is kept, whatever network it is on.
pub fn gc<C: AsRef<str>, I: AsRef<str>>(valid: &[(C, I)]) -> Result<()> {
    let mut nl = Nfnl::open()?;
    if !has_chain(&mut nl, BASE_CHAIN)? {
        return Ok(());
    }
    let chains: HashSet<String> = nl.chain_names(NFPROTO_BRIDGE, TABLE)?.into_iter().collect();
    let elements = elements(&mut nl)?;
    let live = crate::macspoof::live_interfaces();
    let is_live = |name: &str| live.as_ref().is_none_or(|l| l.contains(name));
    let stale = stale_ports(valid, &chains, &elements, is_live);
    match removal_batch(&stale, &chains, &elements) {
        Some(batch) => nl.commit(batch, &target()),
        None => Ok(()),
    }
}

/// The main chains GC removes (see [`gc`]).
fn stale_ports<C: AsRef<str>, I: AsRef<str>>(
    valid: &[(C, I)],
    chains: &HashSet<String>,
    elements: &[(Vec<u8>, Option<String>)],
    is_live: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut keep: HashSet<String> = valid
        .iter()
        .map(|(c, i)| port_security_chain(c.as_ref(), i.as_ref()))
        .collect();
    keep.extend(
        elements
            .iter()
            .filter(|(key, _)| is_live(&key_name(key)))
            .filter_map(|(_, to)| to.clone()),
    );
    let mut stale: Vec<String> = chains
        .iter()
        .filter(|c| c.starts_with(PORT_SECURITY_CHAIN_PREFIX))
        .map(|c| c.strip_suffix(NA_SUFFIX).unwrap_or(c).to_owned())
        .filter(|main| !keep.contains(main))
        .collect();
    stale.sort();
    stale.dedup();
    stale
}

/// Whether this node can run `portSecurity` (nf_tables answers).
pub fn available() -> bool {
    crate::nfnetlink::usable()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x02, 0x42, 0xac, 0x11, 0x00, 0x02]);

    fn port(addresses: &[IpAddr]) -> Port<'_> {
        Port {
            container_id: "ctrA",
            ifname: "eth0",
            host_veth: "veth1234",
            mac: MAC,
            addresses,
        }
    }

    #[test]
    fn link_local_is_eui64() {
        assert_eq!(
            link_local(MAC),
            "fe80::42:acff:fe11:2".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn rules_name_the_pod_and_end_in_drop() {
        let addrs: Vec<IpAddr> = vec!["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        let p = port(&addrs);
        let chains = Chains::of("ctrA", "eth0");
        let main: Vec<String> = main_rules(&p, &chains)
            .into_iter()
            .map(|r| r.what)
            .collect();
        assert_eq!(
            main,
            [
                "ether saddr != 02:42:ac:11:00:02 drop",
                "meta protocol ip udp sport 67 drop",
                "meta protocol ip ip saddr 10.1.0.2 accept",
                "meta protocol ip ip saddr 0.0.0.0 ip daddr 255.255.255.255 udp sport 68 udp dport 67 accept",
                "arp htype 1 arp ptype ip arp hlen 6 arp plen 4 arp saddr ether 02:42:ac:11:00:02 arp saddr ip 10.1.0.2 accept",
                "arp htype 1 arp ptype ip arp hlen 6 arp plen 4 arp saddr ether 02:42:ac:11:00:02 arp saddr ip 0.0.0.0 accept",
                "meta protocol ip6 icmpv6 type nd-router-advert drop",
                "meta protocol ip6 icmpv6 type nd-redirect drop",
                "meta protocol ip6 udp sport 547 drop",
                &format!(
                    "meta protocol ip6 icmpv6 type nd-neighbor-advert jump {}",
                    chains.na
                ),
                "meta protocol ip6 ip6 saddr fd00::2 accept",
                "meta protocol ip6 ip6 saddr fe80::42:acff:fe11:2 accept",
                "meta protocol ip6 ip6 saddr :: ip6 daddr ff02::/16 icmpv6 type mld-listener-report accept",
                "meta protocol ip6 ip6 saddr :: ip6 daddr ff02::/16 icmpv6 type nd-neighbor-solicit accept",
                "meta protocol ip6 ip6 saddr :: ip6 daddr ff02::/16 icmpv6 type mld2-listener-report accept",
                "drop",
            ]
        );
        let na: Vec<String> = na_rules(&p).into_iter().map(|r| r.what).collect();
        assert_eq!(na.len(), 1 + 2 * 2 + 1);
        assert_eq!(na.last().map(String::as_str), Some("drop"));
    }

    #[test]
    fn first_setup_creates_the_table_later_ones_only_the_port() {
        let addrs: Vec<IpAddr> = vec!["10.1.0.2".parse().unwrap()];
        let p = port(&addrs);
        let first = setup_batch(&p, &Found::default(), Some(7)).unwrap();
        let ops = first.describe();
        assert_eq!(
            ops[..4],
            [
                "add table bridge cni_port_security",
                "add map bridge cni_port_security ports",
                "add chain bridge cni_port_security prerouting",
                "add rule bridge cni_port_security prerouting",
            ]
        );
        let main = port_security_chain("ctrA", "eth0");
        assert_eq!(
            ops.last().copied(),
            Some(
                format!(
                    "add element bridge cni_port_security ports {{ \"veth1234\" : jump {main} }}"
                )
                .as_str()
            )
        );
        let again = Found {
            base: true,
            chains: true,
            element: Some(Some(main.clone())),
        };
        let ops2 = setup_batch(&p, &again, None).unwrap();
        let ops2 = ops2.describe();
        assert!(ops2[0].starts_with("flush chain"), "{ops2:?}");
        assert!(
            !ops2
                .iter()
                .any(|o| o.contains("add table") || o.contains("element"))
        );
        // An element left by another attachment on a reused name is replaced.
        let other = Found {
            base: true,
            chains: false,
            element: Some(Some("port-other".into())),
        };
        let ops3 = setup_batch(&p, &other, None).unwrap();
        let ops3 = ops3.describe();
        let n = ops3.len();
        assert!(ops3[n - 2].starts_with("delete element"), "{ops3:?}");
    }

    #[test]
    fn removal_deletes_elements_then_chains() {
        let main = port_security_chain("ctrA", "eth0");
        let na = format!("{main}-na");
        let existing: HashSet<String> = [main.clone(), na.clone()].into();
        let elements = vec![
            (port_key("veth1234"), Some(main.clone())),
            (port_key("vethother"), Some("port-other".into())),
        ];
        let b = removal_batch(std::slice::from_ref(&main), &existing, &elements).unwrap();
        assert_eq!(
            b.describe(),
            [
                "delete element bridge cni_port_security ports { \"veth1234\" }".to_string(),
                format!("flush chain bridge cni_port_security {main}"),
                format!("flush chain bridge cni_port_security {na}"),
                format!("delete chain bridge cni_port_security {na}"),
                format!("delete chain bridge cni_port_security {main}"),
            ]
        );
        assert!(removal_batch(&[main], &HashSet::new(), &[]).is_none());
    }

    #[test]
    fn gc_keeps_valid_and_live_ports() {
        let a = port_security_chain("ctrA", "eth0");
        let b = port_security_chain("ctrB", "eth0");
        let c = port_security_chain("ctrC", "eth0");
        let chains: HashSet<String> = [&a, &b, &c]
            .iter()
            .flat_map(|m| [m.to_string(), format!("{m}-na")])
            .chain(["prerouting".to_string()])
            .collect();
        let elements = vec![
            (port_key("vethA"), Some(a.clone())),
            (port_key("vethB"), Some(b.clone())),
            (port_key("vethC"), Some(c.clone())),
        ];
        let stale = stale_ports(&[("ctrA", "eth0")], &chains, &elements, |n| n == "vethB");
        assert_eq!(stale, vec![c]);
    }

    #[test]
    fn long_or_odd_host_names_are_refused() {
        let mut p = port(&[]);
        p.host_veth = "veth0123456789ab";
        assert!(check_port(&p).is_err());
        p.host_veth = "";
        assert!(check_port(&p).is_err());
        p.host_veth = "veth0123456789a";
        assert!(check_port(&p).is_ok());
    }

    #[test]
    fn long_container_ids_get_short_names_and_comments() {
        let id = "x".repeat(1024);
        assert_eq!(port_security_chain(&id, "eth0").len(), 29);
        assert!(chain_comment(&id, "eth0").len() < NFT_COMMENT_MAX);
    }
}
