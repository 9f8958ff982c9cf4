//! Captures the seeds of the `netlink` and `nftables` targets: what the kernel answers
//! the client's requests in the calling thread's network namespace, one datagram file
//! per request, written as the socket received it (the end-of-dump message aside).
//! `capture-seeds.sh` runs it in a throwaway namespace it fills with a bridge, a veth
//! port, addresses, routes and nftables rules like the plugins'.
//!
//! Usage: capture_seeds <seeds dir>

use std::path::{Path, PathBuf};

use cni_netlink::socket::{NETLINK_NETFILTER, NETLINK_ROUTE};
use cni_netlink::wire::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_ERROR};
use cni_netlink::{Socket, Writer};

const RTM_GETLINK: u16 = 18;
const RTM_GETADDR: u16 = 22;
const RTM_GETROUTE: u16 = 26;
const RTM_GETNEIGH: u16 = 30;
const RTM_GETNETCONF: u16 = 82;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_BRIDGE: u8 = 7;
const AF_INET6: u8 = 10;
const IFLA_EXT_MASK: u16 = 29;
const RTEXT_FILTER_BRVLAN: u32 = 2;
const NETCONFA_IFINDEX: u16 = 1;
/// `(NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETRULE`.
const NFT_GETRULE: u16 = (10 << 8) | 7;
/// `(NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETSETELEM`.
const NFT_GETSETELEM: u16 = (10 << 8) | 13;

/// Sends one request built by `build` and writes every reply into `out` as one datagram.
fn capture(
    sock: &mut Socket,
    ty: u16,
    flags: u16,
    build: impl FnOnce(&mut Writer),
    out: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut w = Writer::new();
    let start = w.begin_msg(ty, NLM_F_REQUEST | flags, sock.next_seq());
    build(&mut w);
    w.end_msg(start);
    let mut datagram = Writer::new();
    sock.request(w.as_bytes(), |msg| {
        let start = datagram.begin_msg(msg.ty, msg.flags, msg.seq);
        datagram.bytes(msg.payload);
        datagram.end_msg(start);
    })?;
    std::fs::write(out, datagram.into_bytes())?;
    println!("{}", out.display());
    Ok(())
}

/// `struct ifinfomsg` of `family` for any link, `struct ifaddrmsg` and `struct rtmsg`
/// likewise: the family byte, the rest zero.
fn family_header(w: &mut Writer, family: u8, len: usize) {
    let mut header = vec![0; len];
    header[0] = family;
    w.bytes(&header);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: capture_seeds <seeds dir>")?,
    );
    let netlink = dir.join("netlink");
    let nftables = dir.join("nftables");
    std::fs::create_dir_all(&netlink)?;
    std::fs::create_dir_all(&nftables)?;

    let mut rt = Socket::open(NETLINK_ROUTE)?;
    capture(
        &mut rt,
        RTM_GETLINK,
        NLM_F_DUMP,
        |w| family_header(w, AF_UNSPEC, 16),
        &netlink.join("link-dump"),
    )?;
    capture(
        &mut rt,
        RTM_GETLINK,
        NLM_F_DUMP,
        |w| {
            family_header(w, AF_BRIDGE, 16);
            w.attr_u32(IFLA_EXT_MASK, RTEXT_FILTER_BRVLAN);
        },
        &netlink.join("bridge-vlan-dump"),
    )?;
    capture(
        &mut rt,
        RTM_GETADDR,
        NLM_F_DUMP,
        |w| family_header(w, AF_UNSPEC, 8),
        &netlink.join("addr-dump"),
    )?;
    capture(
        &mut rt,
        RTM_GETROUTE,
        NLM_F_DUMP,
        |w| family_header(w, AF_INET, 12),
        &netlink.join("route4-dump"),
    )?;
    capture(
        &mut rt,
        RTM_GETROUTE,
        NLM_F_DUMP,
        |w| family_header(w, AF_INET6, 12),
        &netlink.join("route6-dump"),
    )?;
    // The FDB entries of every device (the VXLAN devices' own, the bridge's,
    // the addresses devices list) and the neighbours of every link.
    capture(
        &mut rt,
        RTM_GETNEIGH,
        NLM_F_DUMP,
        |w| family_header(w, AF_BRIDGE, 16),
        &netlink.join("fdb-dump"),
    )?;
    capture(
        &mut rt,
        RTM_GETNEIGH,
        NLM_F_DUMP,
        |w| family_header(w, AF_UNSPEC, 12),
        &netlink.join("neigh-dump"),
    )?;
    capture(
        &mut rt,
        RTM_GETNETCONF,
        NLM_F_ACK,
        |w| {
            w.bytes(&[AF_INET, 0, 0, 0]);
            w.attr_i32(NETCONFA_IFINDEX, -1);
        },
        &netlink.join("netconf-v4"),
    )?;

    // A refusal with the kernel's explanation, as `Socket` asks for them (capped, with
    // extended ack): the reply to a link of an unknown kind.
    let mut w = Writer::new();
    let start = w.begin_msg(NLMSG_ERROR, 0x100 | 0x200, 1);
    w.bytes(&(-95i32).to_ne_bytes());
    w.bytes(&[32, 0, 0, 0, 16, 0, 5, 6, 1, 0, 0, 0, 0, 0, 0, 0]);
    w.attr_str(1, "Unknown device type");
    w.end_msg(start);
    std::fs::write(netlink.join("error-ext-ack"), w.as_bytes())?;

    let mut nf = Socket::open(NETLINK_NETFILTER)?;
    capture(
        &mut nf,
        NFT_GETRULE,
        NLM_F_DUMP,
        // nfgenmsg: any family, version 0, resource id 0.
        |w| w.bytes(&[AF_UNSPEC, 0, 0, 0]),
        &nftables.join("rule-dump"),
    )?;
    capture(
        &mut nf,
        NFT_GETSETELEM,
        NLM_F_DUMP,
        |w| {
            w.bytes(&[AF_BRIDGE, 0, 0, 0]);
            w.attr_str(1, "cni_port_security"); // NFTA_SET_ELEM_LIST_TABLE
            w.attr_str(2, "port_ipv6"); // NFTA_SET_ELEM_LIST_SET
        },
        &nftables.join("set-element-dump"),
    )?;
    Ok(())
}
