//! Netlink (rtnetlink) client: links, bridges and their ports, veth pairs,
//! VXLAN devices with their FDB and neighbour entries, addresses and routes, and
//! the traffic control (qdiscs, filters, ifb devices) of pod bandwidth limits;
//! and, over generic netlink, WireGuard devices' keys and peers ([`wireguard`]).
//! A [`Netlink`] handle talks to one network namespace, fixed when its socket
//! is created; see [`Netlink::connect_in`].
//!
//! Every method is a plain blocking call: one request, answered by the
//! kernel before the `send` carrying it returns (see `cni_netlink`), except
//! [`Netlink::apply`], which sends many in one `send`. The messages are built
//! and parsed in `rtnl`, which knows only the attributes the plugins and the
//! node agent use and skips the rest.

mod addr;
mod batch;
mod bridge;
mod genl;
mod link;
mod neigh;
mod netconf;
mod route;
mod rtnl;
pub mod tc;
mod veth;
pub mod vxlan;
mod wait;
pub mod wireguard;

use std::cell::RefCell;
use std::net::IpAddr;

use cni_netlink::socket::NETLINK_ROUTE;
use cni_netlink::{Malformed, Socket, Writer};

use crate::error::{Error, Result};
use crate::netns::NetNs;

pub use crate::oper_state::OperState;
pub use addr::{Address, AddressOptions};
pub use batch::{BATCH_CHANGES, Change};
pub use bridge::VlanEntry;
pub use link::{BridgePort, Link};
pub use neigh::{FdbEntry, Neighbour};
pub use route::Route;
pub use veth::VethPair;
pub use vxlan::{Vxlan, VxlanInfo, vtep_mac};
pub use wait::OPER_UP_DELAYS;
pub use wireguard::{WgDevice, WgKey, WgPeer, WgPeerConfig, Wireguard};

pub use cni_netlink::Message;
pub use cni_netlink::socket::{Notified, Subscription};

/// rtnetlink's multicast groups for changes of links (`RTNLGRP_LINK`), IPv4 and IPv6
/// addresses (`RTNLGRP_IPV4_IFADDR`, `RTNLGRP_IPV6_IFADDR`), IPv4 and IPv6 routes
/// (`RTNLGRP_IPV4_ROUTE`, `RTNLGRP_IPV6_ROUTE`) and neighbour and FDB entries
/// (`RTNLGRP_NEIGH`).
const HOST_CHANGE_GROUPS: [u32; 6] = [1, 5, 9, 7, 11, 3];

/// Subscribes to the link, address, route and neighbour (ARP, NDP and FDB) changes of
/// the calling thread's netns.
pub fn subscribe_host_changes() -> std::io::Result<Subscription> {
    Subscription::open(NETLINK_ROUTE, &HOST_CHANGE_GROUPS)
}

/// Whether a notification announces a new or changed route marked with `protocol`
/// (what a process that marks its routes so hears of its own additions).
pub fn is_route_added_with_protocol(msg: &Message<'_>, protocol: u8) -> bool {
    msg.ty == rtnl::RTM_NEWROUTE && msg.payload.get(5) == Some(&protocol)
}

/// The device of a neighbour or FDB entry a notification announces, and whether the
/// entry was deleted (`RTM_NEWNEIGH`, `RTM_DELNEIGH`).
pub fn neighbour_change(msg: &Message<'_>) -> Option<(u32, bool)> {
    if msg.ty != rtnl::RTM_NEWNEIGH && msg.ty != rtnl::RTM_DELNEIGH {
        return None;
    }
    // struct ndmsg: family, two bytes of padding... then the ifindex.
    let index = i32::from_ne_bytes(msg.payload.get(4..8)?.try_into().ok()?);
    Some((u32::try_from(index).ok()?, msg.ty == rtnl::RTM_DELNEIGH))
}

/// The address a notification says this host no longer has (`RTM_DELADDR`).
pub fn removed_address(msg: &Message<'_>) -> Option<IpAddr> {
    if msg.ty != rtnl::RTM_DELADDR {
        return None;
    }
    Some(addr::Address::parse(msg.payload).ok()??.ip.ip())
}

/// An IP address family, used to filter dumps.
pub use cni_protocol::ip::Family;

/// A netlink connection bound to one network namespace.
#[derive(Debug)]
pub struct Netlink {
    sock: RefCell<Socket>,
}

impl Netlink {
    /// Connects in the netns of the calling thread.
    pub fn connect() -> Result<Self> {
        let sock = Socket::open(NETLINK_ROUTE).map_err(|source| Error::Connect { source })?;
        Ok(Self {
            sock: RefCell::new(sock),
        })
    }

    /// Connects in `netns` without moving the calling thread.
    ///
    /// The socket is created on a short-lived thread that has entered the
    /// netns: a netlink socket belongs to the netns it was created in, for
    /// its whole life, whichever thread later uses it.
    pub fn connect_in(netns: &NetNs) -> Result<Self> {
        let sock = netns
            .run(|| Socket::open(NETLINK_ROUTE))?
            .map_err(|source| Error::Connect { source })?;
        Ok(Self {
            sock: RefCell::new(sock),
        })
    }

    /// Sends one request built by `build` (after the netlink header: the family
    /// header and attributes) and waits for its acknowledgement.
    fn exec(
        &self,
        ty: u16,
        flags: u16,
        build: impl FnOnce(&mut Writer),
        context: impl FnOnce() -> String,
    ) -> Result<()> {
        self.request(ty, flags, build, |_| Ok(()), context)
    }

    /// Sends one request and decodes every reply with `decode`; a reply that
    /// does not decode fails the request.
    fn request(
        &self,
        ty: u16,
        flags: u16,
        build: impl FnOnce(&mut Writer),
        mut decode: impl FnMut(&Message<'_>) -> std::result::Result<(), Malformed>,
        context: impl FnOnce() -> String,
    ) -> Result<()> {
        let mut sock = self.sock.borrow_mut();
        let mut w = Writer::new();
        let start = w.begin_msg(ty, flags, sock.next_seq());
        build(&mut w);
        w.end_msg(start);
        let mut bad = None;
        let answer = sock.request(w.as_bytes(), |msg| {
            if bad.is_none() {
                bad = decode(msg).err();
            }
        });
        match (answer, bad) {
            (Err(e), _) => Err(Error::netlink(context(), e)),
            (Ok(()), Some(malformed)) => Err(Error::netlink(context(), malformed.into())),
            (Ok(()), None) => Ok(()),
        }
    }
}

/// What one rtnetlink reply decodes to; see [`decode_reply`].
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// RTM_NEWLINK, read as a link and, from an AF_BRIDGE dump, as a bridge port's
    /// VLAN list.
    Link {
        /// The link, or why it does not decode.
        link: std::result::Result<Link, Malformed>,
        /// For an AF_BRIDGE message: its VLANs, or why they do not decode.
        vlans: Option<std::result::Result<Vec<VlanEntry>, Malformed>>,
    },
    /// RTM_NEWADDR; `None` for one without an address.
    Address(std::result::Result<Option<Address>, Malformed>),
    /// RTM_NEWROUTE; `None` for a route that is not unicast or not IP.
    Route(std::result::Result<Option<Route>, Malformed>),
    /// RTM_NEWNEIGH of family `AF_BRIDGE`; `None` for one without an Ethernet address.
    Fdb(std::result::Result<Option<FdbEntry>, Malformed>),
    /// RTM_NEWNEIGH of another family; `None` for one that is not IPv4 or IPv6 or
    /// has no address.
    Neighbour(std::result::Result<Option<Neighbour>, Malformed>),
    /// RTM_NEWNETCONF: the forwarding setting, if it carries one.
    Forwarding(std::result::Result<Option<bool>, Malformed>),
    /// RTM_NEWQDISC.
    Qdisc(std::result::Result<tc::Qdisc, Malformed>),
    /// RTM_NEWTFILTER.
    Filter(std::result::Result<tc::Filter, Malformed>),
    /// A message type no request of this client decodes.
    Other,
}

/// Decodes one reply message with the decoder the client's requests use for its
/// type, so that they can be driven with arbitrary bytes from outside the crate
/// (the fuzz targets in `tests/fuzz`); the client itself never calls this.
#[doc(hidden)]
pub fn decode_reply(msg: &Message<'_>) -> Reply {
    match msg.ty {
        rtnl::RTM_NEWLINK => Reply::Link {
            link: Link::parse(msg.payload),
            // Elsewhere IFLA_AF_SPEC nests per-family settings, not VLANs.
            vlans: match rtnl::IfInfo::parse(msg.payload) {
                Ok((header, attributes)) if header.family == rtnl::AF_BRIDGE => {
                    Some(bridge::vlan_entries(attributes))
                }
                _ => None,
            },
        },
        rtnl::RTM_NEWADDR => Reply::Address(Address::parse(msg.payload)),
        rtnl::RTM_NEWROUTE => Reply::Route(Route::parse(msg.payload)),
        rtnl::RTM_NEWNEIGH if msg.payload.first() == Some(&rtnl::AF_BRIDGE) => {
            Reply::Fdb(FdbEntry::parse(msg.payload))
        }
        rtnl::RTM_NEWNEIGH => Reply::Neighbour(Neighbour::parse(msg.payload)),
        netconf::RTM_NEWNETCONF => Reply::Forwarding(netconf::forwarding_of(msg.payload)),
        tc::RTM_NEWQDISC => Reply::Qdisc(tc::parse_qdisc(msg.payload)),
        tc::RTM_NEWTFILTER => Reply::Filter(tc::parse_filter(msg.payload)),
        _ => Reply::Other,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use cni_netlink::messages;
    use cni_netlink::wire::NLMSG_HDRLEN;

    use super::rtnl::RTM_NEWLINK;
    use super::*;
    use crate::mac::MacAddr;

    /// Bytes from hex text; spaces are for the reader.
    pub(crate) fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    /// One message as `Netlink` sends it, with sequence number 1.
    pub(crate) fn message(ty: u16, flags: u16, build: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer::new();
        let start = w.begin_msg(ty, flags, 1);
        build(&mut w);
        w.end_msg(start);
        w.into_bytes()
    }

    /// `ip -d link show` in a netns holding `lo`, a bridge `cni0` (#5, MAC
    /// 02:00:00:00:00:01, promiscuous, up, no carrier) and its port `vethA`
    /// (#7, MAC 02:00:00:00:00:02, up), whose peer is #3 in another netns, down:
    /// the kernel's RTM_NEWLINK dump datagram, captured with strace (kernel 6.18).
    fn captured_dump() -> Vec<u8> {
        hex(include_str!("testdata/link-dump.hex"))
    }

    fn parse_all(datagram: &[u8]) -> std::result::Result<Vec<Link>, Malformed> {
        messages(datagram)
            .map(|msg| {
                let msg = msg?;
                assert_eq!(msg.ty, RTM_NEWLINK);
                Link::parse(msg.payload)
            })
            .collect()
    }

    #[test]
    fn a_captured_kernel_dump_of_lo_a_bridge_and_a_veth_decodes() {
        let links = parse_all(&captured_dump()).unwrap();
        let mac = |last| MacAddr::from_slice(&[2, 0, 0, 0, 0, last]);
        assert_eq!(
            links,
            [
                Link {
                    index: 1,
                    name: "lo".into(),
                    mac: Some(MacAddr::from_slice(&[0; 6]).unwrap()),
                    mtu: 65536,
                    kind: None,
                    controller: None,
                    up: false,
                    oper_state: OperState::Down,
                    promisc: false,
                    peer_index: None,
                    link_netnsid: None,
                    vlan_filtering: None,
                    bridge_port: None,
                    vxlan: None,
                },
                Link {
                    index: 5,
                    name: "cni0".into(),
                    mac: mac(1),
                    mtu: 1500,
                    kind: Some("bridge".into()),
                    controller: None,
                    up: true,
                    oper_state: OperState::Down,
                    promisc: true,
                    peer_index: None,
                    link_netnsid: None,
                    vlan_filtering: Some(false),
                    bridge_port: None,
                    vxlan: None,
                },
                Link {
                    index: 7,
                    name: "vethA".into(),
                    mac: mac(2),
                    mtu: 1500,
                    kind: Some("veth".into()),
                    controller: Some(5),
                    up: true,
                    // No carrier while the peer is down; a port is promiscuous
                    // (IFF_PROMISC reports only what a user asked for).
                    oper_state: OperState::Down,
                    promisc: false,
                    peer_index: Some(3),
                    link_netnsid: Some(0),
                    vlan_filtering: None,
                    bridge_port: Some(BridgePort::default()),
                    vxlan: None,
                },
            ]
        );
    }

    #[test]
    fn truncations_of_a_captured_dump_are_errors_never_panics() {
        let dump = captured_dump();
        let first_len = u32::from_ne_bytes(dump[..4].try_into().unwrap()) as usize;
        // Cut the first message short at every length, keeping its header's claim:
        // the framing or an attribute no longer adds up.
        for cut in NLMSG_HDRLEN..first_len {
            assert!(parse_all(&dump[..cut]).is_err(), "cut at {cut}");
        }
        // Shrink the message's own length instead: its last attributes are cut.
        for shrink in (1..first_len - NLMSG_HDRLEN - 16).filter(|s| s % 4 != 0) {
            let mut msg = dump[..first_len].to_vec();
            let len = u32::try_from(first_len - shrink).unwrap();
            msg[..4].copy_from_slice(&len.to_ne_bytes());
            msg.truncate(first_len - shrink);
            let _ = parse_all(&msg);
        }
    }

    #[test]
    fn odd_attribute_lengths_are_errors() {
        let dump = captured_dump();
        let first_len = u32::from_ne_bytes(dump[..4].try_into().unwrap()) as usize;
        let payload = &dump[NLMSG_HDRLEN..first_len];
        // Find IFLA_MTU (8 bytes) and claim 7.
        let mut offset = 16;
        let mut patched = payload.to_vec();
        loop {
            let len = usize::from(u16::from_ne_bytes([patched[offset], patched[offset + 1]]));
            let ty = u16::from_ne_bytes([patched[offset + 2], patched[offset + 3]]);
            if ty == super::rtnl::IFLA_MTU {
                patched[offset] = 7;
                break;
            }
            offset += len.next_multiple_of(4);
        }
        assert_eq!(
            Link::parse(&patched),
            Err(Malformed("u32 attribute of another length"))
        );
        assert!(Link::parse(&payload[..15]).is_err());
    }

    #[test]
    fn corrupted_bytes_never_panic_the_decoders() {
        // Every byte of the real dump set to values that break lengths and
        // types (0, odd, huge), one at a time, then the whole dump decoded.
        let dump = captured_dump();
        for at in 0..dump.len() {
            for value in [0x00, 0x03, 0x81, 0xff] {
                let mut bytes = dump.clone();
                bytes[at] = value;
                let _ = parse_all_lenient(&bytes);
            }
        }
    }

    #[test]
    fn replies_decode_by_their_type_as_the_requests_decode_them() {
        let dump = captured_dump();
        let first = messages(&dump).next().unwrap().unwrap();
        match decode_reply(&first) {
            Reply::Link { link, vlans } => {
                assert_eq!(link.unwrap().name, "lo");
                assert_eq!(vlans, None, "not an AF_BRIDGE message");
            }
            other => panic!("{other:?}"),
        }
        let netconf = message(netconf::RTM_NEWNETCONF, 0, |w| {
            w.bytes(&[2, 0, 0, 0]);
            w.attr_i32(2, 1);
        });
        let msg = messages(&netconf).next().unwrap().unwrap();
        assert_eq!(decode_reply(&msg), Reply::Forwarding(Ok(Some(true))));
        let short = message(super::rtnl::RTM_NEWROUTE, 0, |w| w.bytes(&[2, 0]));
        let msg = messages(&short).next().unwrap().unwrap();
        assert_eq!(
            decode_reply(&msg),
            Reply::Route(Err(Malformed("truncated rtmsg")))
        );
        let fdb = message(rtnl::RTM_NEWNEIGH, 0, |w| {
            w.bytes(&hex("07000000 04000000 c0000201"));
            w.attr(rtnl::NDA_LLADDR, &[0x0a, 0x58, 10, 0, 0, 2]);
        });
        let msg = messages(&fdb).next().unwrap().unwrap();
        assert!(matches!(decode_reply(&msg), Reply::Fdb(Ok(Some(e))) if e.index == 4));
        let arp = message(rtnl::RTM_NEWNEIGH, 0, |w| {
            w.bytes(&hex("02000000 04000000 80000001"));
            w.attr(rtnl::NDA_DST, &[10, 244, 2, 0]);
        });
        let msg = messages(&arp).next().unwrap().unwrap();
        assert!(matches!(decode_reply(&msg), Reply::Neighbour(Ok(Some(n))) if n.ip.is_ipv4()));
        let qdisc = message(tc::RTM_NEWQDISC, 0, |w| w.bytes(&[0; 8]));
        let msg = messages(&qdisc).next().unwrap().unwrap();
        assert_eq!(
            decode_reply(&msg),
            Reply::Qdisc(Err(Malformed("truncated tcmsg")))
        );
        let filter = message(tc::RTM_NEWTFILTER, 0, |w| {
            w.bytes(&[0; 20]);
            w.attr_str(1, "u32");
        });
        let msg = messages(&filter).next().unwrap().unwrap();
        assert!(matches!(decode_reply(&msg), Reply::Filter(Ok(f)) if f.kind == "u32"));
        let other = message(99, 0, |_| {});
        let msg = messages(&other).next().unwrap().unwrap();
        assert_eq!(decode_reply(&msg), Reply::Other);
    }

    /// Like `parse_all`, without asserting on message types.
    fn parse_all_lenient(datagram: &[u8]) -> Vec<std::result::Result<Link, Malformed>> {
        messages(datagram)
            .map(|msg| msg.and_then(|m| Link::parse(m.payload)))
            .collect()
    }
}
