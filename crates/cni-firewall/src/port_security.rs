//! The bridge's `portSecurity`: what a pod may send into the bridge, so that it
//! cannot pass itself off as a neighbour (IP or ARP spoofing, forged neighbour
//! advertisements) or act as a router or DHCP server for them.
//!
//! Everything lives in the nftables table `bridge cni_port_security`: one base chain
//! (`prerouting`, bridge filter priority) whose rules are the same for every pod, and
//! four sets that say who each protected port's pod is: `ports` (the host ends of
//! protected pods' veths), `port_macs` (port . MAC), `port_ipv4` and `port_ipv6`
//! (port . address). Every check is a hash lookup keyed by the input port, so a packet
//! costs the same however many pods the bridge has, and adding a pod adds set elements
//! only (no rule, no chain), one nf_tables transaction that costs the same at the
//! thousandth pod as at the first. Ports not in `ports` are not filtered.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cni_protocol::MacAddr;

use crate::error::{Error, Result};
use crate::naming::{NFT_COMMENT_MAX, port_security_id};
use crate::nfnetlink::{
    BASE_LINK, BASE_NETWORK, BASE_TRANSPORT, Batch, CMP_EQ, CMP_NEQ, Element, Expr, META_IIFNAME,
    META_L4PROTO, META_PROTOCOL, NFPROTO_BRIDGE, Nfnl, REG_1, REG_2, Rule, SetSpec, TYPE_ETHERADDR,
    TYPE_IFNAME, TYPE_IP6ADDR, TYPE_IPADDR, VERDICT_DROP, is_not_found, is_restart,
};
use crate::nft_build::{add_bridge_prerouting, verdict};

/// The table and its base chain.
pub const TABLE: &str = "cni_port_security";
const BASE_CHAIN: &str = "prerouting";
/// nft's `filter` priority in the bridge family.
const PRIORITY_FILTER: i32 = -200;
/// `IFNAMSIZ`: keys start with the input port's name, NUL-padded to this size.
const IFNAMSIZ: usize = 16;

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

/// One of the table's sets: name, nft key type and key length in bytes.
struct SetKind {
    name: &'static str,
    key_type: u32,
    key_len: u32,
}

/// The protected ports.
const PORTS: SetKind = SetKind {
    name: "ports",
    key_type: TYPE_IFNAME,
    key_len: 16,
};
/// port . MAC (6 bytes, padded to 8).
const PORT_MACS: SetKind = SetKind {
    name: "port_macs",
    key_type: TYPE_IFNAME << 6 | TYPE_ETHERADDR,
    key_len: 24,
};
/// port . IPv4 address.
const PORT_IPV4: SetKind = SetKind {
    name: "port_ipv4",
    key_type: TYPE_IFNAME << 6 | TYPE_IPADDR,
    key_len: 20,
};
/// port . IPv6 address.
const PORT_IPV6: SetKind = SetKind {
    name: "port_ipv6",
    key_type: TYPE_IFNAME << 6 | TYPE_IP6ADDR,
    key_len: 32,
};
const SETS: [&SetKind; 4] = [&PORTS, &PORT_MACS, &PORT_IPV4, &PORT_IPV6];

fn load(dreg: u32, base: u32, offset: u32, len: u32) -> Expr {
    Expr::Payload {
        dreg,
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

/// `NF_ACCEPT`.
const VERDICT_ACCEPT: i32 = 1;

/// `meta protocol <ethertype>`.
fn ethertype(proto: u16) -> Vec<Expr> {
    vec![meta(META_PROTOCOL), cmp(CMP_EQ, &proto.to_be_bytes())]
}

/// `meta l4proto <proto>`.
fn l4proto(proto: u8) -> [Expr; 2] {
    [meta(META_L4PROTO), cmp(CMP_EQ, &[proto])]
}

/// `meta protocol <ethertype> udp sport <port>`: a DHCP or DHCPv6 server's reply.
fn udp_sport(proto: u16, port: u16) -> Vec<Expr> {
    let mut e = ethertype(proto);
    e.extend(l4proto(IPPROTO_UDP));
    e.extend([
        load(REG_1, BASE_TRANSPORT, 0, 2),
        cmp(CMP_EQ, &port.to_be_bytes()),
    ]);
    e
}

/// `meta protocol ip6 meta l4proto icmpv6 icmpv6 type <ty>`.
fn icmpv6_type(ty: u8) -> Vec<Expr> {
    let mut e = ethertype(ETH_P_IPV6);
    e.extend(l4proto(IPPROTO_ICMPV6));
    e.extend([load(REG_1, BASE_TRANSPORT, 0, 1), cmp(CMP_EQ, &[ty])]);
    e
}

/// `iifname . <field> [!=] @set`: the input port's name in register 1, the field
/// (a payload load) in register 2, looked up as one key.
fn port_and(field: Expr, set: &SetKind, invert: bool) -> [Expr; 3] {
    [
        meta(META_IIFNAME),
        field,
        Expr::Lookup {
            sreg: REG_1,
            dreg: None,
            set: set.name.into(),
            invert,
        },
    ]
}

fn rule(mut exprs: Vec<Expr>, code: i32, what: &str) -> Expected {
    exprs.push(verdict(code, None));
    Expected {
        exprs,
        what: what.into(),
    }
}

/// The base chain's rules, the same for every pod, in order.
fn base_rules() -> Vec<Expected> {
    let (accept, drop) = (VERDICT_ACCEPT, VERDICT_DROP);
    let arp_header = [
        load(REG_1, BASE_NETWORK, 0, 6),
        cmp(CMP_EQ, &[0, 1, 0x08, 0, 6, 4]),
    ];
    let na = || icmpv6_type(ICMPV6_NEIGHBOR_ADVERT);
    let na_length =
        |op: u32, len: u16| [load(REG_1, BASE_NETWORK, 4, 2), cmp(op, &len.to_be_bytes())];
    let with = |mut first: Vec<Expr>, rest: &[Expr]| {
        first.extend_from_slice(rest);
        first
    };
    let mut rules = vec![
        rule(
            vec![
                meta(META_IIFNAME),
                Expr::Lookup {
                    sreg: REG_1,
                    dreg: None,
                    set: PORTS.name.into(),
                    invert: true,
                },
            ],
            accept,
            "iifname != @ports accept",
        ),
        rule(
            port_and(load(REG_2, BASE_LINK, 6, 6), &PORT_MACS, true).to_vec(),
            drop,
            "iifname . ether saddr != @port_macs drop",
        ),
        // IPv4: no DHCP server, own sources, and a DHCP client's discovery.
        rule(
            udp_sport(ETH_P_IP, 67),
            drop,
            "meta protocol ip udp sport 67 drop",
        ),
        rule(
            with(
                ethertype(ETH_P_IP),
                &port_and(load(REG_2, BASE_NETWORK, 12, 4), &PORT_IPV4, false),
            ),
            accept,
            "meta protocol ip iifname . ip saddr @port_ipv4 accept",
        ),
        rule(
            with(
                ethertype(ETH_P_IP),
                &[
                    load(REG_1, BASE_NETWORK, 12, 8),
                    cmp(CMP_EQ, &[0, 0, 0, 0, 255, 255, 255, 255]),
                    meta(META_L4PROTO),
                    cmp(CMP_EQ, &[IPPROTO_UDP]),
                    load(REG_1, BASE_TRANSPORT, 0, 4),
                    cmp(CMP_EQ, &[0, 68, 0, 67]),
                ],
            ),
            accept,
            "ip saddr 0.0.0.0 ip daddr 255.255.255.255 udp sport 68 udp dport 67 accept",
        ),
        // ARP: Ethernet/IPv4 ARP with the pod's MAC as sender and one of its addresses
        // (or a probe's 0.0.0.0) as sender address; every other ARP packet meets the
        // final drop.
        rule(
            with(
                with(ethertype(ETH_P_ARP), &arp_header),
                &[
                    port_and(load(REG_2, BASE_NETWORK, 8, 6), &PORT_MACS, false).to_vec(),
                    port_and(load(REG_2, BASE_NETWORK, 14, 4), &PORT_IPV4, false).to_vec(),
                ]
                .concat(),
            ),
            accept,
            "arp htype 1 arp ptype ip arp hlen 6 arp plen 4 iifname . arp saddr ether @port_macs iifname . arp saddr ip @port_ipv4 accept",
        ),
        rule(
            with(
                with(ethertype(ETH_P_ARP), &arp_header),
                &[
                    port_and(load(REG_2, BASE_NETWORK, 8, 6), &PORT_MACS, false).to_vec(),
                    vec![load(REG_1, BASE_NETWORK, 14, 4), cmp(CMP_EQ, &[0, 0, 0, 0])],
                ]
                .concat(),
            ),
            accept,
            "arp htype 1 arp ptype ip arp hlen 6 arp plen 4 iifname . arp saddr ether @port_macs arp saddr ip 0.0.0.0 accept",
        ),
        // IPv6: no router advertisements, redirects or DHCPv6 server.
        rule(
            icmpv6_type(ICMPV6_ROUTER_ADVERT),
            drop,
            "icmpv6 type nd-router-advert drop",
        ),
        rule(
            icmpv6_type(ICMPV6_REDIRECT),
            drop,
            "icmpv6 type nd-redirect drop",
        ),
        rule(
            udp_sport(ETH_P_IPV6, 547),
            drop,
            "meta protocol ip6 udp sport 547 drop",
        ),
        // Neighbour advertisements: no extension header, one of the pod's own
        // addresses as target, and either no option or exactly one target link-layer
        // address option with the pod's MAC.
        rule(
            with(
                na(),
                &[
                    load(REG_1, BASE_NETWORK, 6, 1),
                    cmp(CMP_NEQ, &[IPPROTO_ICMPV6]),
                ],
            ),
            drop,
            "icmpv6 type nd-neighbor-advert ip6 nexthdr != ipv6-icmp drop",
        ),
        rule(
            with(
                na(),
                &port_and(load(REG_2, BASE_TRANSPORT, 8, 16), &PORT_IPV6, true),
            ),
            drop,
            "icmpv6 type nd-neighbor-advert iifname . icmpv6 target != @port_ipv6 drop",
        ),
        rule(
            with(with(na(), &na_length(CMP_NEQ, 24)), &na_length(CMP_NEQ, 32)),
            drop,
            "icmpv6 type nd-neighbor-advert ip6 length != 24 ip6 length != 32 drop",
        ),
        rule(
            with(
                with(na(), &na_length(CMP_EQ, 32)),
                &[load(REG_1, BASE_TRANSPORT, 24, 2), cmp(CMP_NEQ, &[2, 1])],
            ),
            drop,
            "icmpv6 type nd-neighbor-advert ip6 length 32 (first option not a target link-layer address) drop",
        ),
        rule(
            with(
                with(na(), &na_length(CMP_EQ, 32)),
                &port_and(load(REG_2, BASE_TRANSPORT, 26, 6), &PORT_MACS, true),
            ),
            drop,
            "icmpv6 type nd-neighbor-advert ip6 length 32 iifname . (target link-layer address) != @port_macs drop",
        ),
        rule(
            with(
                ethertype(ETH_P_IPV6),
                &port_and(load(REG_2, BASE_NETWORK, 8, 16), &PORT_IPV6, false),
            ),
            accept,
            "meta protocol ip6 iifname . ip6 saddr @port_ipv6 accept",
        ),
    ];
    for (ty, name) in [
        (ICMPV6_MLD_REPORT, "mld-listener-report"),
        (ICMPV6_NEIGHBOR_SOLICIT, "nd-neighbor-solicit"),
        (ICMPV6_MLD2_REPORT, "mld2-listener-report"),
    ] {
        let mut e = ethertype(ETH_P_IPV6);
        e.extend([
            load(REG_1, BASE_NETWORK, 8, 16),
            cmp(CMP_EQ, &Ipv6Addr::UNSPECIFIED.octets()),
            load(REG_1, BASE_NETWORK, 24, 2),
            cmp(CMP_EQ, &[0xff, 0x02]),
        ]);
        e.extend(l4proto(IPPROTO_ICMPV6));
        e.extend([load(REG_1, BASE_TRANSPORT, 0, 1), cmp(CMP_EQ, &[ty])]);
        rules.push(rule(
            e,
            accept,
            &format!("ip6 saddr :: ip6 daddr ff02::/16 icmpv6 type {name} accept"),
        ));
    }
    // Everything else: other sources, other EtherTypes.
    rules.push(rule(Vec::new(), drop, "drop"));
    rules
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

/// A key that starts with the port's name, NUL-padded to `IFNAMSIZ`, then `rest`
/// padded to a multiple of 4 bytes (as nf_tables lays out concatenations).
fn key(host_veth: &str, rest: &[u8]) -> Vec<u8> {
    let mut key = host_veth.as_bytes().to_vec();
    key.resize(IFNAMSIZ, 0);
    key.extend_from_slice(rest);
    key.resize(key.len().next_multiple_of(4), 0);
    key
}

/// The interface name a key starts with.
fn key_port(key: &[u8]) -> String {
    let name = key
        .get(..IFNAMSIZ.min(key.len()))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .next()
        .unwrap_or_default();
    String::from_utf8_lossy(name).into_owned()
}

/// The elements of `port`, set by set.
fn elements_of(port: &Port<'_>) -> Vec<(&'static SetKind, Vec<u8>)> {
    let veth = port.host_veth;
    let mut out = vec![
        (&PORTS, key(veth, &[])),
        (&PORT_MACS, key(veth, &port.mac.octets())),
    ];
    for a in port.addresses {
        if let IpAddr::V4(a) = a {
            out.push((&PORT_IPV4, key(veth, &a.octets())));
        }
    }
    for a in own_ipv6(port) {
        out.push((&PORT_IPV6, key(veth, &a.octets())));
    }
    out
}

/// The comment of every element of an attachment: its id first (what DEL and GC
/// match), then the container ID and interface name for people reading `nft list`,
/// cut to what a comment holds.
fn element_comment(container_id: &str, ifname: &str) -> String {
    let mut text = format!(
        "{} {container_id} {ifname}",
        port_security_id(container_id, ifname)
    );
    let mut end = text.len().min(NFT_COMMENT_MAX - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

/// An element of one of the table's plain sets: a key alone.
fn key_element(key: Vec<u8>) -> Element {
    Element {
        key,
        ..Element::default()
    }
}

/// The attachment id an element's comment starts with.
fn comment_id(element: &Element) -> Option<&str> {
    element.comment.as_deref()?.split(' ').next()
}

fn check_port(port: &Port<'_>) -> Result<()> {
    let bad = |value: &str, reason: &'static str| {
        Err(Error::InvalidInput {
            what: "host interface name",
            value: value.into(),
            reason,
        })
    };
    let name = port.host_veth;
    if name.is_empty() || name.len() >= IFNAMSIZ {
        return bad(name, "must be 1 to 15 bytes");
    }
    if name.bytes().any(|b| b == 0 || b.is_ascii_control()) {
        return bad(name, "contains control characters");
    }
    Ok(())
}

fn target() -> String {
    format!("table bridge {TABLE}")
}

/// The transaction that creates the table, its sets and its base chain with its rules.
fn add_base(b: &mut Batch) -> Result<()> {
    let f = NFPROTO_BRIDGE;
    b.add_table(f, TABLE, None)?;
    for set in SETS {
        // An interface name is text: nft records it in host byte order (1), to print it
        // as such; an address is left unrecorded (0).
        let key_byteorder = u32::from(set.key_type == TYPE_IFNAME);
        b.add_set_spec(
            f,
            TABLE,
            &SetSpec {
                name: set.name,
                key_type: set.key_type,
                key_len: set.key_len,
                fields: &[],
                interval: false,
                verdict_map: false,
                key_byteorder,
            },
        );
    }
    add_bridge_prerouting(b, TABLE, BASE_CHAIN, PRIORITY_FILTER)?;
    for r in base_rules() {
        b.add_rule(f, TABLE, BASE_CHAIN, &r.exprs, None)?;
    }
    Ok(())
}

/// The setup transaction: the table if it is missing (`generation` set), the removal
/// of `stale` elements (a previous port of the same name), then the port's elements.
fn setup_batch(
    port: &Port<'_>,
    generation: Option<u32>,
    stale: &[(&'static str, Vec<u8>)],
) -> Result<Batch> {
    let mut b = match generation {
        Some(g) => {
            let mut b = Batch::at_generation(g);
            add_base(&mut b)?;
            b
        }
        None => Batch::new(),
    };
    for (set, key) in stale {
        b.delete_elements(NFPROTO_BRIDGE, TABLE, set, &[key_element(key.clone())]);
    }
    let comment = element_comment(port.container_id, port.ifname);
    for (set, key) in elements_of(port) {
        let element = Element {
            comment: Some(comment.clone()),
            ..key_element(key)
        };
        b.add_elements(NFPROTO_BRIDGE, TABLE, set.name, &[element])?;
    }
    Ok(b)
}

/// Whether the base chain exists; a missing table is a missing chain.
fn has_base(nl: &mut Nfnl) -> Result<bool> {
    match nl.has_chain(NFPROTO_BRIDGE, TABLE, BASE_CHAIN) {
        Err(e) if is_not_found(&e) => Ok(false),
        other => other,
    }
}

/// Every element of the table's sets, with its set's name; none when the table is
/// missing.
fn all_elements(nl: &mut Nfnl) -> Result<Vec<(&'static str, Element)>> {
    let mut out = Vec::new();
    for set in SETS {
        match nl.elements(NFPROTO_BRIDGE, TABLE, set.name) {
            Ok(elements) => out.extend(elements.into_iter().map(|e| (set.name, e))),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
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

/// Adds the port's pod to the sets in one transaction (creating the table with the
/// node's first protected port). The port forwards nothing of the pod's that the
/// rules refuse from the moment this returns.
pub fn setup(port: &Port<'_>) -> Result<()> {
    check_port(port)?;
    let mut nl = Nfnl::open().map_err(|e| unavailable(&e))?;
    let port_key = key(port.host_veth, &[]);
    for _ in 0..8 {
        let mut base = has_base(&mut nl).map_err(|e| unavailable(&e))?;
        // The first port of a node creates the table; concurrent first ports must not
        // each add the rules, so that transaction runs only if nothing changed since
        // the table was seen missing.
        let generation = if base {
            None
        } else {
            let generation = nl.generation_id()?;
            base = has_base(&mut nl)?;
            (!base).then_some(generation)
        };
        // A port name in use means an earlier attachment on a veth of the same name
        // was never deleted: its elements go, or its addresses would stay allowed.
        let stale: Vec<(&'static str, Vec<u8>)> =
            if base && nl.has_element(NFPROTO_BRIDGE, TABLE, PORTS.name, &port_key)? {
                all_elements(&mut nl)?
                    .into_iter()
                    .filter(|(_, e)| key_port(&e.key) == port.host_veth)
                    .map(|(set, e)| (set, e.key))
                    .collect()
            } else {
                Vec::new()
            };
        let batch = setup_batch(port, generation, &stale)?;
        match nl.commit(batch, &target()) {
            Err(e) if is_restart(&e) || (!stale.is_empty() && is_not_found(&e)) => continue,
            other => return other,
        }
    }
    Err(Error::Netlink {
        target: target(),
        detail: "the rule set kept changing while the port was being added".into(),
        errno: None,
    })
}

/// The transaction that deletes `doomed` elements.
fn removal_batch(doomed: &[(&'static str, Element)]) -> Option<Batch> {
    if doomed.is_empty() {
        return None;
    }
    let mut b = Batch::new();
    for (set, e) in doomed {
        b.delete_elements(NFPROTO_BRIDGE, TABLE, set, std::slice::from_ref(e));
    }
    Some(b)
}

/// Removes an attachment's elements (found by its id, so neither the pod's netns nor
/// its addresses are needed); nothing there is nothing to do.
pub fn teardown(container_id: &str, ifname: &str) -> Result<()> {
    let id = port_security_id(container_id, ifname);
    let mut nl = Nfnl::open()?;
    // A concurrent GC may remove some of them between listing and applying.
    for _ in 0..3 {
        let doomed: Vec<_> = all_elements(&mut nl)?
            .into_iter()
            .filter(|(_, e)| comment_id(e) == Some(id.as_str()))
            .collect();
        let Some(batch) = removal_batch(&doomed) else {
            return Ok(());
        };
        match nl.commit(batch, &target()) {
            Err(e) if is_not_found(&e) => continue,
            other => return other,
        }
    }
    Ok(())
}

/// Verifies that the table's rules are in place, in order, and that the port's pod
/// is in the sets as [`setup`] put it; the error names what is missing.
pub fn check(port: &Port<'_>) -> Result<()> {
    let mut nl = Nfnl::open()?;
    let missing = |target: String, what: String| Error::Missing {
        backend: "nftables",
        target,
        what,
    };
    if !has_base(&mut nl)? {
        return Err(missing(target(), "the port-security table".into()));
    }
    let rules = nl.rules(NFPROTO_BRIDGE, TABLE, Some(BASE_CHAIN))?;
    let mut errors: Vec<Error> = differences(&rules, &base_rules())
        .into_iter()
        .map(|what| missing(format!("{} chain {BASE_CHAIN}", target()), what))
        .collect();
    for (set, key) in elements_of(port) {
        if !nl.has_element(NFPROTO_BRIDGE, TABLE, set.name, &key)? {
            errors.push(missing(
                format!("{} set {}", target(), set.name),
                describe_element(set, &key),
            ));
        }
    }
    Error::collect(errors)
}

/// An element as `nft list` prints it.
fn describe_element(set: &SetKind, key: &[u8]) -> String {
    let port = key_port(key);
    let rest = key.get(IFNAMSIZ..).unwrap_or_default();
    let field = match set.key_type & 0x3f {
        TYPE_ETHERADDR => rest
            .get(..6)
            .and_then(|m| <[u8; 6]>::try_from(m).ok())
            .map(|m| MacAddr(m).to_string()),
        TYPE_IPADDR => rest
            .get(..4)
            .and_then(|a| <[u8; 4]>::try_from(a).ok())
            .map(|a| Ipv4Addr::from(a).to_string()),
        TYPE_IP6ADDR => rest
            .get(..16)
            .and_then(|a| <[u8; 16]>::try_from(a).ok())
            .map(|a| Ipv6Addr::from(a).to_string()),
        _ => None,
    };
    match field {
        Some(field) if set.key_type != TYPE_IFNAME => format!("\"{port}\" . {field}"),
        _ => format!("\"{port}\""),
    }
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

/// Removes the elements of attachments not in `valid` (container id, interface name)
/// whose port is gone. The table serves every network on the node while `valid`
/// covers one, so an element whose port still exists is kept, whatever network it
/// is on.
pub fn gc<C: AsRef<str>, I: AsRef<str>>(valid: &[(C, I)]) -> Result<()> {
    let mut nl = Nfnl::open()?;
    if !has_base(&mut nl)? {
        return Ok(());
    }
    let elements = all_elements(&mut nl)?;
    let live = crate::macspoof::live_interfaces();
    let is_live = |name: &str| live.as_ref().is_none_or(|l| l.contains(name));
    let doomed = stale_elements(valid, elements, is_live);
    match removal_batch(&doomed) {
        Some(batch) => nl.commit(batch, &target()),
        None => Ok(()),
    }
}

/// The elements GC removes (see [`gc`]).
fn stale_elements<C: AsRef<str>, I: AsRef<str>>(
    valid: &[(C, I)],
    elements: Vec<(&'static str, Element)>,
    is_live: impl Fn(&str) -> bool,
) -> Vec<(&'static str, Element)> {
    let keep: HashSet<String> = valid
        .iter()
        .map(|(c, i)| port_security_id(c.as_ref(), i.as_ref()))
        .collect();
    elements
        .into_iter()
        .filter(|(_, e)| !comment_id(e).is_some_and(|id| keep.contains(id)))
        .filter(|(_, e)| !is_live(&key_port(&e.key)))
        .collect()
}

/// Whether this node can run `portSecurity` (nf_tables answers).
pub fn available() -> bool {
    crate::nfnetlink::usable()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfnetlink::Data;

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
    fn elements_name_the_pod_by_port() {
        let addrs: Vec<IpAddr> = vec!["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        let described: Vec<String> = elements_of(&port(&addrs))
            .into_iter()
            .map(|(set, key)| {
                assert_eq!(key.len(), set.key_len as usize, "{}", set.name);
                format!("{} {}", set.name, describe_element(set, &key))
            })
            .collect();
        assert_eq!(
            described,
            [
                "ports \"veth1234\"",
                "port_macs \"veth1234\" . 02:42:ac:11:00:02",
                "port_ipv4 \"veth1234\" . 10.1.0.2",
                "port_ipv6 \"veth1234\" . fd00::2",
                "port_ipv6 \"veth1234\" . fe80::42:acff:fe11:2",
            ]
        );
    }

    #[test]
    fn the_rules_end_in_drop_and_check_ports_first() {
        let rules = base_rules();
        assert_eq!(rules[0].what, "iifname != @ports accept");
        assert_eq!(rules[1].what, "iifname . ether saddr != @port_macs drop");
        assert_eq!(rules.last().map(|r| r.what.as_str()), Some("drop"));
        // No jump anywhere: adding elements never makes the kernel revalidate a chain
        // graph that grows with the pods.
        assert!(rules.iter().all(|r| !r.exprs.iter().any(|e| matches!(
            e,
            Expr::Immediate {
                data: Data::Verdict { chain: Some(_), .. },
                ..
            }
        ))));
    }

    #[test]
    fn first_setup_creates_the_table_later_ones_only_elements() {
        let addrs: Vec<IpAddr> = vec!["10.1.0.2".parse().unwrap()];
        let p = port(&addrs);
        let first = setup_batch(&p, Some(7), &[]).unwrap();
        let ops = first.describe();
        assert_eq!(
            ops[..6],
            [
                "add table bridge cni_port_security",
                "add set bridge cni_port_security ports",
                "add set bridge cni_port_security port_macs",
                "add set bridge cni_port_security port_ipv4",
                "add set bridge cni_port_security port_ipv6",
                "add chain bridge cni_port_security prerouting",
            ]
        );
        let later = setup_batch(&p, None, &[]).unwrap();
        let later = later.describe();
        assert_eq!(later.len(), 4, "{later:?}");
        assert!(
            later.iter().all(|o| o.starts_with("add element")),
            "{later:?}"
        );
        // A port name left by an attachment that was never deleted: its elements go first.
        let stale = [("port_ipv4", key("veth1234", &[10, 1, 0, 9]))];
        let replaced = setup_batch(&p, None, &stale).unwrap();
        assert!(
            replaced.describe()[0].starts_with("delete element bridge cni_port_security port_ipv4")
        );
    }

    fn element(set: &'static str, port: &str, id: &str) -> (&'static str, Element) {
        (
            set,
            Element {
                comment: Some(format!("{id} ctr eth0")),
                ..key_element(key(port, &[]))
            },
        )
    }

    #[test]
    fn gc_keeps_valid_and_live_ports() {
        let (a, b, c) = (
            port_security_id("ctrA", "eth0"),
            port_security_id("ctrB", "eth0"),
            port_security_id("ctrC", "eth0"),
        );
        let elements = vec![
            element("ports", "vethA", &a),
            element("ports", "vethB", &b),
            element("ports", "vethC", &c),
            element("port_macs", "vethC", &c),
        ];
        let stale = stale_elements(&[("ctrA", "eth0")], elements, |n| n == "vethB");
        assert_eq!(stale.len(), 2);
        assert!(stale.iter().all(|(_, e)| key_port(&e.key) == "vethC"));
    }

    #[test]
    fn a_node_without_nf_tables_is_told_so() {
        let kernel = Error::Netlink {
            target: "netlink socket (NETLINK_NETFILTER)".into(),
            detail: "nf_tables is not available in this kernel".into(),
            errno: Some(nix::libc::EPROTONOSUPPORT),
        };
        let text = unavailable(&kernel).to_string();
        assert!(
            text.contains("portSecurity needs nf_tables with the bridge family")
                && text.contains("nf_tables is not available in this kernel"),
            "{text}"
        );
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
    fn long_container_ids_keep_their_id_in_the_comment() {
        let id = "x".repeat(1024);
        let comment = element_comment(&id, "eth0");
        assert!(comment.len() < NFT_COMMENT_MAX);
        let e = Element {
            comment: Some(comment),
            ..key_element(key("veth1", &[]))
        };
        assert_eq!(comment_id(&e), Some(port_security_id(&id, "eth0").as_str()));
    }
}
