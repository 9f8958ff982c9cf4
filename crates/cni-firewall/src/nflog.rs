//! The receiving end of nftables' `log group N`: a socket bound to one nfnetlink_log
//! (`NFNETLINK_ULOG`) group that gets the head of each logged packet, and the reading
//! of what the kernel sends into [`LoggedPacket`]s (the rule's log prefix, the
//! addresses, the protocol and destination port, the interfaces).
//!
//! The node agent's deny log reads its verdict chains' `log ... group N` here. The
//! reading never trusts the bytes: whatever a datagram holds, it yields the packets it
//! can read and skips the rest, without a panic (the unit tests feed it arbitrary
//! bytes), since a log line is not worth the agent.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use cni_netlink::Socket;
use cni_netlink::socket::NETLINK_NETFILTER;
use cni_netlink::wire::{NLM_F_ACK, NLM_F_REQUEST, Writer, c_string, messages};
use nix::libc;

use crate::error::{Error, Result};

/// nfnetlink's subsystem of the packet log.
const NFNL_SUBSYS_ULOG: u16 = 4;
/// A logged packet (kernel to us).
const NFULNL_MSG_PACKET: u16 = 0;
/// A configuration request (us to the kernel).
const NFULNL_MSG_CONFIG: u16 = 1;

const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_QTHRESH: u16 = 5;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;

const NFULA_PACKET_HDR: u16 = 1;
const NFULA_IFINDEX_INDEV: u16 = 4;
const NFULA_IFINDEX_OUTDEV: u16 = 5;
const NFULA_IFINDEX_PHYSINDEV: u16 = 6;
const NFULA_IFINDEX_PHYSOUTDEV: u16 = 7;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;

/// `NFPROTO_IPV4` and `NFPROTO_IPV6`, the families of an `inet` table's packets.
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

/// Bytes of each packet the kernel copies: an IPv6 header with a few extension headers
/// and the transport header's ports fit; the rest of the packet is never read.
pub const COPY_BYTES: u16 = 128;

/// Transport protocols whose destination port is read.
const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;

/// What the kernel said of one logged packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedPacket {
    /// The log rule's prefix (empty without one).
    pub prefix: String,
    /// The packet's layer 3 family and addresses, when its head was copied and reads.
    pub addresses: Option<(IpAddr, IpAddr)>,
    /// The transport protocol number (the last IPv6 next header).
    pub protocol: Option<u8>,
    /// TCP, UDP or SCTP: the destination port (absent in a later fragment).
    pub dst_port: Option<u16>,
    /// The interface the packet came in on (0 when none: sent by this host).
    pub in_ifindex: u32,
    /// The interface it leaves on (0 when none or not known yet at the hook).
    pub out_ifindex: u32,
    /// The bridge port it came in on, for a bridged packet (br_netfilter).
    pub phys_in_ifindex: u32,
    /// The bridge port it leaves on, for a bridged packet.
    pub phys_out_ifindex: u32,
}

impl LoggedPacket {
    /// The source address.
    pub fn src(&self) -> Option<IpAddr> {
        self.addresses.map(|(src, _)| src)
    }

    /// The destination address.
    pub fn dst(&self) -> Option<IpAddr> {
        self.addresses.map(|(_, dst)| dst)
    }
}

/// What one wait on the socket brought.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// Logged packets (possibly none: a datagram of something else).
    Packets(Vec<LoggedPacket>),
    /// The kernel could not queue some (our receive buffer was full): that many are
    /// lost, how many is not known.
    Overflow,
    /// Nothing came within the timeout.
    Timeout,
}

/// A socket bound to one log group, in the network namespace of the thread that opened
/// it. One socket per group: the kernel refuses a second reader of a group.
#[derive(Debug)]
pub struct LogGroup {
    sock: Socket,
    group: u16,
}

impl LogGroup {
    /// Binds `group` (copying [`COPY_BYTES`] of each packet); `timeout` bounds each
    /// [`LogGroup::recv`] (`None`: it waits for a packet).
    pub fn bind(group: u16, timeout: Option<Duration>) -> Result<Self> {
        let target = format!("bind log group {group}");
        let mut sock = Socket::open(NETLINK_NETFILTER)
            .map_err(|e| io_error(&target, &e, "netlink socket (NETLINK_NETFILTER)"))?;
        // Room for a burst between two reads; past it the kernel drops and says so.
        sock.reserve_buffers(0, 1 << 20);
        sock.set_recv_timeout(timeout)
            .map_err(|e| io_error(&target, &e, "socket receive timeout"))?;
        let mut config = |attrs: &dyn Fn(&mut Writer)| -> Result<()> {
            let mut w = Writer::new();
            let start = w.begin_msg(
                (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG,
                NLM_F_REQUEST | NLM_F_ACK,
                sock.next_seq(),
            );
            // nfgenmsg: any family, version 0, the group as resource id.
            w.bytes(&[libc::AF_UNSPEC as u8, 0]);
            w.bytes(&group.to_be_bytes());
            attrs(&mut w);
            w.end_msg(start);
            sock.request(w.as_bytes(), |_| {}).map_err(|e| {
                let (errno, message) = match &e {
                    cni_netlink::Error::Kernel { errno, message } => {
                        (Some(*errno), message.clone())
                    }
                    cni_netlink::Error::Io(io) => (io.raw_os_error(), None),
                    cni_netlink::Error::Malformed(_) => (None, None),
                };
                let detail = match (errno, message) {
                    // The kernel says EPERM to a second reader of a group, as to a
                    // process without CAP_NET_ADMIN.
                    (Some(libc::EPERM | libc::EBUSY), _) => format!(
                        "{e}: another socket reads this log group (one reader per group), \
                         or this process lacks CAP_NET_ADMIN"
                    ),
                    (_, Some(text)) if !text.is_empty() => format!("{e}: {text}"),
                    _ => e.to_string(),
                };
                Error::Netlink {
                    target: target.clone(),
                    detail,
                    errno,
                }
            })
        };
        config(&|w| w.attr(NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]))?;
        config(&|w| {
            let mut mode = [0u8; 6];
            mode[..4].copy_from_slice(&u32::from(COPY_BYTES).to_be_bytes());
            mode[4] = NFULNL_COPY_PACKET;
            w.attr(NFULA_CFG_MODE, &mode);
            // Each packet is sent at once, not held for a batch.
            w.attr(NFULA_CFG_QTHRESH, &1u32.to_be_bytes());
        })?;
        Ok(Self { sock, group })
    }

    /// The group.
    pub fn group(&self) -> u16 {
        self.group
    }

    /// Waits for the next datagram of logged packets (up to the timeout).
    pub fn recv(&mut self) -> Result<Received> {
        match self.sock.recv(false) {
            Ok(Some(datagram)) => Ok(Received::Packets(parse_datagram(datagram))),
            Ok(None) => Ok(Received::Timeout),
            Err(cni_netlink::Error::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(Received::Timeout)
            }
            Err(e) if e.errno() == Some(libc::ENOBUFS) => Ok(Received::Overflow),
            Err(e) => Err(Error::Netlink {
                target: format!("read log group {}", self.group),
                errno: e.errno(),
                detail: e.to_string(),
            }),
        }
    }
}

fn io_error(target: &str, e: &io::Error, what: &str) -> Error {
    Error::Netlink {
        target: target.to_owned(),
        detail: format!("{what}: {e}"),
        errno: e.raw_os_error(),
    }
}

/// The logged packets of a datagram, in order; messages that are not logged packets or
/// do not read are skipped.
pub fn parse_datagram(datagram: &[u8]) -> Vec<LoggedPacket> {
    messages(datagram)
        .map_while(std::result::Result::ok)
        .filter(|m| m.ty == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET)
        .filter_map(|m| parse_packet(m.payload))
        .collect()
}

/// One `NFULNL_MSG_PACKET`'s payload (nfgenmsg, then attributes).
pub fn parse_packet(payload: &[u8]) -> Option<LoggedPacket> {
    let family = *payload.first()?;
    let attributes = payload.get(4..)?;
    let mut packet = LoggedPacket {
        prefix: String::new(),
        addresses: None,
        protocol: None,
        dst_port: None,
        in_ifindex: 0,
        out_ifindex: 0,
        phys_in_ifindex: 0,
        phys_out_ifindex: 0,
    };
    let be_u32 = |v: &[u8]| {
        v.get(..4)
            .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut hw_protocol = None;
    let mut head: &[u8] = &[];
    for (ty, value) in cni_netlink::attrs(attributes).map_while(std::result::Result::ok) {
        match ty {
            NFULA_PACKET_HDR => {
                hw_protocol = value.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]]));
            }
            NFULA_PREFIX => packet.prefix = c_string(value),
            NFULA_IFINDEX_INDEV => packet.in_ifindex = be_u32(value),
            NFULA_IFINDEX_OUTDEV => packet.out_ifindex = be_u32(value),
            NFULA_IFINDEX_PHYSINDEV => packet.phys_in_ifindex = be_u32(value),
            NFULA_IFINDEX_PHYSOUTDEV => packet.phys_out_ifindex = be_u32(value),
            NFULA_PAYLOAD => head = value,
            _ => {}
        }
    }
    // The family of the hook the rule ran at; otherwise (a bridge or netdev table) the
    // frame's EtherType, then the header's own version.
    let version = match (family, hw_protocol) {
        (NFPROTO_IPV4, _) => Some(4),
        (NFPROTO_IPV6, _) => Some(6),
        (_, Some(0x0800)) => Some(4),
        (_, Some(0x86dd)) => Some(6),
        _ => head.first().map(|b| b >> 4),
    };
    let read = match version {
        Some(4) => read_ipv4(head),
        Some(6) => read_ipv6(head),
        _ => None,
    };
    if let Some((src, dst, protocol, transport)) = read {
        packet.addresses = Some((src, dst));
        packet.protocol = Some(protocol);
        packet.dst_port = transport
            .filter(|_| matches!(protocol, TCP | UDP | SCTP))
            .and_then(|t| t.get(2..4))
            .map(|b| u16::from_be_bytes([b[0], b[1]]));
    }
    Some(packet)
}

/// An IPv4 header: addresses, protocol, and the transport header when this is the
/// first fragment.
fn read_ipv4(head: &[u8]) -> Option<(IpAddr, IpAddr, u8, Option<&[u8]>)> {
    if head.first()? >> 4 != 4 {
        return None;
    }
    let header_len = usize::from(head[0] & 0x0f) * 4;
    let src: [u8; 4] = head.get(12..16)?.try_into().ok()?;
    let dst: [u8; 4] = head.get(16..20)?.try_into().ok()?;
    let protocol = *head.get(9)?;
    let fragment_offset = u16::from_be_bytes([*head.get(6)?, *head.get(7)?]) & 0x1fff;
    let transport = (header_len >= 20 && fragment_offset == 0)
        .then(|| head.get(header_len..))
        .flatten();
    Some((
        IpAddr::V4(Ipv4Addr::from(src)),
        IpAddr::V4(Ipv4Addr::from(dst)),
        protocol,
        transport,
    ))
}

/// An IPv6 header: addresses, the protocol after the extension headers, and the
/// transport header when it is in the copied head and this is the first fragment.
fn read_ipv6(head: &[u8]) -> Option<(IpAddr, IpAddr, u8, Option<&[u8]>)> {
    if head.first()? >> 4 != 6 {
        return None;
    }
    let src: [u8; 16] = head.get(8..24)?.try_into().ok()?;
    let dst: [u8; 16] = head.get(24..40)?.try_into().ok()?;
    let (src, dst) = (
        IpAddr::V6(Ipv6Addr::from(src)),
        IpAddr::V6(Ipv6Addr::from(dst)),
    );
    let mut next = *head.get(6)?;
    let mut at = 40usize;
    // Hop-by-hop, routing, fragment, destination options, authentication: each says
    // what follows and how long it is; a few at most in practice.
    for _ in 0..8 {
        match next {
            0 | 43 | 60 => {
                let Some(ext) = head.get(at..at + 2) else {
                    return Some((src, dst, next, None));
                };
                next = ext[0];
                at += (usize::from(ext[1]) + 1) * 8;
            }
            44 => {
                let Some(ext) = head.get(at..at + 4) else {
                    return Some((src, dst, next, None));
                };
                let offset = u16::from_be_bytes([ext[2], ext[3]]) >> 3;
                next = ext[0];
                at += 8;
                if offset != 0 {
                    return Some((src, dst, next, None));
                }
            }
            51 => {
                let Some(ext) = head.get(at..at + 2) else {
                    return Some((src, dst, next, None));
                };
                next = ext[0];
                at += (usize::from(ext[1]) + 2) * 4;
            }
            _ => return Some((src, dst, next, head.get(at..))),
        }
    }
    Some((src, dst, next, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A logged packet's message as the kernel lays it out.
    fn message(family: u8, prefix: &str, indev: u32, head: &[u8]) -> Vec<u8> {
        let mut w = Writer::new();
        let start = w.begin_msg((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET, 0, 0);
        w.bytes(&[family, 0, 0, 7]);
        w.attr(NFULA_PACKET_HDR, &[0x08, 0x00, 1, 0]);
        w.attr_str(NFULA_PREFIX, prefix);
        w.attr(NFULA_IFINDEX_INDEV, &indev.to_be_bytes());
        w.attr(NFULA_PAYLOAD, head);
        w.end_msg(start);
        w.into_bytes()
    }

    fn ipv4_udp(dport: u16) -> Vec<u8> {
        let mut h = vec![0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, UDP, 0, 0];
        h.extend([10, 0, 0, 1, 10, 0, 0, 2]);
        h.extend([0x30, 0x39]);
        h.extend(dport.to_be_bytes());
        h.extend([0, 8, 0, 0]);
        h
    }

    fn ipv6_tcp_after_hop_by_hop(dport: u16) -> Vec<u8> {
        let mut h = vec![0x60, 0, 0, 0, 0, 28, 0, 64];
        h.extend(
            "fd00::1"
                .parse::<Ipv6Addr>()
                .unwrap()
                .octets()
                .iter()
                .chain("fd00::2".parse::<Ipv6Addr>().unwrap().octets().iter()),
        );
        // Hop-by-hop: next TCP, 8 bytes.
        h.extend([TCP, 0, 1, 4, 0, 0, 0, 0]);
        h.extend([0x30, 0x39]);
        h.extend(dport.to_be_bytes());
        h.extend([0; 16]);
        h
    }

    #[test]
    fn reads_both_families_through_extension_headers() {
        let mut datagram = message(NFPROTO_IPV4, "v-abc", 3, &ipv4_udp(53));
        datagram.extend(message(
            NFPROTO_IPV6,
            "v-def",
            4,
            &ipv6_tcp_after_hop_by_hop(443),
        ));
        let packets = parse_datagram(&datagram);
        assert_eq!(packets.len(), 2, "{packets:?}");
        assert_eq!(packets[0].prefix, "v-abc");
        assert_eq!(
            packets[0].addresses,
            Some(("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()))
        );
        assert_eq!(
            (
                packets[0].protocol,
                packets[0].dst_port,
                packets[0].in_ifindex
            ),
            (Some(UDP), Some(53), 3)
        );
        assert_eq!(packets[1].prefix, "v-def");
        assert_eq!(packets[1].dst(), Some("fd00::2".parse().unwrap()));
        assert_eq!(
            (packets[1].protocol, packets[1].dst_port),
            (Some(TCP), Some(443))
        );
    }

    #[test]
    fn a_later_fragment_or_a_short_head_has_no_port() {
        let mut fragment = ipv4_udp(53);
        fragment[6..8].copy_from_slice(&[0, 4]);
        let p = parse_packet(&message(NFPROTO_IPV4, "", 1, &fragment)[16..]).unwrap();
        assert_eq!((p.protocol, p.dst_port), (Some(UDP), None));
        let short = &ipv4_udp(53)[..22];
        let p = parse_packet(&message(NFPROTO_IPV4, "", 1, short)[16..]).unwrap();
        assert_eq!((p.protocol, p.dst_port), (Some(UDP), None));
        let p = parse_packet(&message(NFPROTO_IPV4, "", 1, &[0x45, 0])[16..]).unwrap();
        assert_eq!(p.addresses, None);
        // ICMP: a protocol without ports.
        let mut icmp = ipv4_udp(53);
        icmp[9] = 1;
        let p = parse_packet(&message(NFPROTO_IPV4, "", 1, &icmp)[16..]).unwrap();
        assert_eq!((p.protocol, p.dst_port), (Some(1), None));
    }

    #[test]
    fn other_messages_and_broken_framing_are_skipped() {
        let mut datagram = message(NFPROTO_IPV4, "a", 1, &ipv4_udp(1));
        // Same message, other type: a configuration echo.
        let mut other = datagram.clone();
        other[4] = 1;
        datagram.splice(0..0, other);
        assert_eq!(parse_datagram(&datagram).len(), 1);
        datagram.extend([200, 0, 0, 0, 0, 4]);
        assert_eq!(parse_datagram(&datagram).len(), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

        /// Anything at all: no panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_datagram(&bytes);
            let _ = parse_packet(&bytes);
        }

        /// A well-framed message around an arbitrary head: no panic, the prefix read.
        #[test]
        fn arbitrary_heads_never_panic(
            family in prop_oneof![Just(NFPROTO_IPV4), Just(NFPROTO_IPV6), any::<u8>()],
            head in proptest::collection::vec(any::<u8>(), 0..160),
            version in 0u8..16,
        ) {
            let mut head = head;
            if let Some(b) = head.first_mut() {
                *b = (version << 4) | (*b & 0x0f);
            }
            let packets = parse_datagram(&message(family, "p", 2, &head));
            prop_assert_eq!(packets.len(), 1);
            prop_assert_eq!(packets[0].prefix.as_str(), "p");
        }
    }
}
