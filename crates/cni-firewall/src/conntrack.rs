//! Deleting UDP conntrack entries over netlink (ctnetlink), for the portmap
//! plugin: after a host port's DNAT rules change, a UDP client that kept
//! sending would otherwise stay translated to the old container address.
//!
//! Entries are found by a dump of the calling thread's network namespace and
//! deleted one request each, named by their original tuple (and zone). The
//! whole dump is read before the first delete: deleting while the kernel
//! walks its table could make it skip entries.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cni_netlink::Socket;
use cni_netlink::socket::NETLINK_NETFILTER;
use cni_netlink::wire::{
    NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, attrs, u8_value,
};
use nix::libc;

use crate::error::{Error, Result};

// nfnetlink (linux/netfilter/nfnetlink.h).
const NFGENMSG_LEN: usize = 4;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;

// ctnetlink (linux/netfilter/nfnetlink_conntrack.h).
/// The type of each entry of a dump (the kernel answers a GET with NEWs).
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
/// A zone that applies to the original direction only (then `CTA_ZONE` is
/// absent); the delete must name it the same way or the lookup misses.
const CTA_TUPLE_ZONE: u16 = 3;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

const IPPROTO_UDP: u8 = 17;
const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;

/// A dump flagged as overlapping a change is read again, this many times in all.
const DUMP_TRIES: usize = 3;

/// The original-direction tuple of a UDP conntrack entry: the packet that
/// created it, before any NAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpEntry {
    /// Source address.
    pub src: IpAddr,
    /// Destination address (the host's, for a host port).
    pub dst: IpAddr,
    /// Source port.
    pub src_port: u16,
    /// Destination port (the host port).
    pub dst_port: u16,
}

/// A dumped UDP entry with what a delete request must repeat to name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    family: u8,
    tuple: UdpEntry,
    /// `CTA_ZONE`, for an entry in a zone other than the default.
    zone: Option<u16>,
    /// `CTA_TUPLE_ZONE` of the original tuple.
    tuple_zone: Option<u16>,
}

/// Deletes every conntrack entry of `family` (`libc::AF_INET` or
/// `libc::AF_INET6` as u8) whose original tuple is UDP with destination port
/// `port`, in the calling thread's current network namespace. Returns how
/// many entries were deleted. An entry that vanishes between the dump and the
/// delete (ENOENT) is not an error, and a kernel or namespace without
/// conntrack has nothing to delete.
pub fn delete_udp_by_dst_port(family: u8, port: u16) -> Result<usize> {
    delete_udp_by_dst_ports(family, &[port])
}

/// [`delete_udp_by_dst_port`] for several ports at once.
///
/// One dump serves every port: the kernel walks its whole conntrack hash for
/// a dump (about 10 ms on a default-sized table, however few entries this
/// namespace has).
pub fn delete_udp_by_dst_ports(family: u8, ports: &[u16]) -> Result<usize> {
    check_family(family)?;
    if ports.is_empty() {
        return Ok(0);
    }
    let Some(mut sock) = open(family)? else {
        return Ok(0);
    };
    let entries = dump(&mut sock, family)?;
    let mut deleted = 0;
    for entry in entries.iter().filter(|e| ports.contains(&e.tuple.dst_port)) {
        let seq = sock.next_seq();
        match sock.request(&delete_request(entry, seq), |_| {}) {
            Ok(()) => deleted += 1,
            // Timed out or deleted by someone else since the dump.
            Err(e) if e.errno() == Some(libc::ENOENT) => {}
            Err(e) => return Err(netlink_error(&describe_delete(entry), e)),
        }
    }
    Ok(deleted)
}

/// The UDP entries of `family` in the calling thread's network namespace
/// (empty when conntrack is not available), for checks and diagnostics.
pub fn udp_entries(family: u8) -> Result<Vec<UdpEntry>> {
    check_family(family)?;
    let Some(mut sock) = open(family)? else {
        return Ok(Vec::new());
    };
    Ok(dump(&mut sock, family)?
        .into_iter()
        .map(|e| e.tuple)
        .collect())
}

fn check_family(family: u8) -> Result<()> {
    match family {
        AF_INET | AF_INET6 => Ok(()),
        _ => Err(Error::InvalidInput {
            what: "conntrack address family",
            value: family.to_string(),
            reason: "is neither AF_INET nor AF_INET6",
        }),
    }
}

fn family_name(family: u8) -> &'static str {
    if family == AF_INET6 { "ipv6" } else { "ipv4" }
}

/// A socket, or `None` when the kernel has no nfnetlink at all.
fn open(family: u8) -> Result<Option<Socket>> {
    match Socket::open(NETLINK_NETFILTER) {
        Ok(sock) => Ok(Some(sock)),
        Err(e) if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) => Ok(None),
        Err(e) => Err(io_error(&describe_dump(family), &e)),
    }
}

/// Every UDP entry of `family`, read in full before anything is deleted.
fn dump(sock: &mut Socket, family: u8) -> Result<Vec<Entry>> {
    let target = describe_dump(family);
    for _ in 0..DUMP_TRIES {
        let request = dump_request(family, sock.next_seq());
        let mut entries = Vec::new();
        let mut interrupted = false;
        let answer = sock.request(&request, |msg| {
            interrupted |= msg.flags & NLM_F_DUMP_INTR != 0;
            if msg.ty == (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW
                && let Some(entry) = parse_entry(msg.payload)
                && entry.family == family
            {
                entries.push(entry);
            }
        });
        match answer {
            Ok(()) if interrupted => {}
            Ok(()) => return Ok(entries),
            // nf_conntrack (or its netlink interface) is not loaded: there is
            // no entry to forget.
            Err(e)
                if matches!(
                    e.errno(),
                    Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOENT)
                ) =>
            {
                return Ok(Vec::new());
            }
            Err(e) => return Err(netlink_error(&target, e)),
        }
    }
    Err(Error::Conntrack {
        target,
        detail: "the table kept changing during the dump".into(),
        errno: None,
    })
}

fn describe_dump(family: u8) -> String {
    format!("list {} entries", family_name(family))
}

fn describe_delete(entry: &Entry) -> String {
    let t = &entry.tuple;
    let sock = |ip, port| std::net::SocketAddr::new(ip, port);
    format!(
        "delete udp entry {} -> {}",
        sock(t.src, t.src_port),
        sock(t.dst, t.dst_port)
    )
}

/// A ctnetlink message: netlink header, `nfgenmsg` (version 0, resource id
/// 0), then the attributes `body` writes.
fn message(
    ty: u16,
    flags: u16,
    seq: u32,
    family: u8,
    body: impl FnOnce(&mut cni_netlink::Writer),
) -> Vec<u8> {
    let mut w = cni_netlink::Writer::new();
    let msg = w.begin_msg(
        (NFNL_SUBSYS_CTNETLINK << 8) | ty,
        NLM_F_REQUEST | flags,
        seq,
    );
    w.bytes(&[family, 0]);
    w.bytes(&0u16.to_be_bytes());
    body(&mut w);
    w.end_msg(msg);
    w.into_bytes()
}

fn dump_request(family: u8, seq: u32) -> Vec<u8> {
    message(IPCTNL_MSG_CT_GET, NLM_F_DUMP, seq, family, |_| {})
}

/// The delete request naming `entry`, laid out as the kernel dumps it.
fn delete_request(entry: &Entry, seq: u32) -> Vec<u8> {
    let t = &entry.tuple;
    message(IPCTNL_MSG_CT_DELETE, NLM_F_ACK, seq, entry.family, |w| {
        let orig = w.nest_start(CTA_TUPLE_ORIG | NLA_F_NESTED);
        let ip = w.nest_start(CTA_TUPLE_IP | NLA_F_NESTED);
        for (addr, v4, v6) in [
            (t.src, CTA_IP_V4_SRC, CTA_IP_V6_SRC),
            (t.dst, CTA_IP_V4_DST, CTA_IP_V6_DST),
        ] {
            match addr {
                IpAddr::V4(a) => w.attr(v4, &a.octets()),
                IpAddr::V6(a) => w.attr(v6, &a.octets()),
            }
        }
        w.nest_end(ip);
        let proto = w.nest_start(CTA_TUPLE_PROTO | NLA_F_NESTED);
        w.attr_u8(CTA_PROTO_NUM, IPPROTO_UDP);
        w.attr(CTA_PROTO_SRC_PORT, &t.src_port.to_be_bytes());
        w.attr(CTA_PROTO_DST_PORT, &t.dst_port.to_be_bytes());
        w.nest_end(proto);
        if let Some(zone) = entry.tuple_zone {
            w.attr(CTA_TUPLE_ZONE, &zone.to_be_bytes());
        }
        w.nest_end(orig);
        if let Some(zone) = entry.zone {
            w.attr(CTA_ZONE, &zone.to_be_bytes());
        }
    })
}

/// The value of the first attribute of type `ty` (flags masked off);
/// malformed framing ends the search.
fn find(data: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(data)
        .map_while(std::result::Result::ok)
        .find_map(|(t, v)| (t == ty).then_some(v))
}

fn be16(v: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(v.try_into().ok()?))
}

/// An optional big-endian u16: absent is `Some(None)`, malformed is `None`.
fn optional_be16(data: &[u8], ty: u16) -> Option<Option<u16>> {
    match find(data, ty) {
        None => Some(None),
        Some(v) => be16(v).map(Some),
    }
}

/// A UDP entry of a dump (the payload after the netlink header); `None` for
/// other protocols and for anything that does not decode, since a tuple we
/// cannot repeat exactly cannot be deleted.
fn parse_entry(payload: &[u8]) -> Option<Entry> {
    let family = *payload.first()?;
    let body = payload.get(NFGENMSG_LEN..)?;
    let orig = find(body, CTA_TUPLE_ORIG)?;
    let proto = find(orig, CTA_TUPLE_PROTO)?;
    if u8_value(find(proto, CTA_PROTO_NUM)?).ok()? != IPPROTO_UDP {
        return None;
    }
    let src_port = be16(find(proto, CTA_PROTO_SRC_PORT)?)?;
    let dst_port = be16(find(proto, CTA_PROTO_DST_PORT)?)?;
    let ip = find(orig, CTA_TUPLE_IP)?;
    let (src, dst) = match family {
        AF_INET => {
            let addr = |ty| -> Option<IpAddr> {
                let octets: [u8; 4] = find(ip, ty)?.try_into().ok()?;
                Some(Ipv4Addr::from(octets).into())
            };
            (addr(CTA_IP_V4_SRC)?, addr(CTA_IP_V4_DST)?)
        }
        AF_INET6 => {
            let addr = |ty| -> Option<IpAddr> {
                let octets: [u8; 16] = find(ip, ty)?.try_into().ok()?;
                Some(Ipv6Addr::from(octets).into())
            };
            (addr(CTA_IP_V6_SRC)?, addr(CTA_IP_V6_DST)?)
        }
        _ => return None,
    };
    Some(Entry {
        family,
        tuple: UdpEntry {
            src,
            dst,
            src_port,
            dst_port,
        },
        zone: optional_be16(body, CTA_ZONE)?,
        tuple_zone: optional_be16(orig, CTA_TUPLE_ZONE)?,
    })
}

fn netlink_error(target: &str, e: cni_netlink::Error) -> Error {
    let errno = e.errno();
    let detail = match e {
        cni_netlink::Error::Kernel {
            errno,
            message: Some(text),
        } if !text.is_empty() => format!("{}: {text}", io::Error::from_raw_os_error(errno)),
        e => e.to_string(),
    };
    Error::Conntrack {
        target: target.to_owned(),
        detail,
        errno,
    }
}

fn io_error(target: &str, e: &io::Error) -> Error {
    Error::Conntrack {
        target: target.to_owned(),
        detail: e.to_string(),
        errno: e.raw_os_error(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_netlink::wire::{NLMSG_HDRLEN, messages};

    /// Network byte order flag some attributes carry in a dump.
    const NLA_F_NET_BYTEORDER: u16 = 0x4000;

    /// One attribute laid out by hand, independently of the `Writer`.
    fn nla(ty: u16, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&u16::try_from(4 + value.len()).unwrap().to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }

    fn nlmsg(ty: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let len = u32::try_from(NLMSG_HDRLEN + payload.len()).unwrap();
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
        out.extend_from_slice(&flags.to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn ip_nest(src: IpAddr, dst: IpAddr) -> Vec<u8> {
        let octets = |a: IpAddr| match a {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        let (s, d) = if src.is_ipv4() {
            (CTA_IP_V4_SRC, CTA_IP_V4_DST)
        } else {
            (CTA_IP_V6_SRC, CTA_IP_V6_DST)
        };
        [nla(s, &octets(src)), nla(d, &octets(dst))].concat()
    }

    /// A dump message of one entry as the kernel sends it: nests flagged,
    /// ports possibly flagged as network byte order, the reply tuple and other
    /// attributes around the original tuple.
    fn dumped(family: u8, proto: u8, tuple: UdpEntry, zone: Option<u16>) -> Vec<u8> {
        let ports = [
            nla(CTA_PROTO_NUM, &[proto]),
            nla(
                CTA_PROTO_SRC_PORT | NLA_F_NET_BYTEORDER,
                &tuple.src_port.to_be_bytes(),
            ),
            nla(CTA_PROTO_DST_PORT, &tuple.dst_port.to_be_bytes()),
        ]
        .concat();
        let orig = [
            nla(CTA_TUPLE_IP | NLA_F_NESTED, &ip_nest(tuple.src, tuple.dst)),
            nla(CTA_TUPLE_PROTO | NLA_F_NESTED, &ports),
        ]
        .concat();
        let reply = [
            nla(CTA_TUPLE_IP | NLA_F_NESTED, &ip_nest(tuple.dst, tuple.src)),
            nla(CTA_TUPLE_PROTO | NLA_F_NESTED, &ports),
        ]
        .concat();
        let mut payload = vec![family, 0, 0, 0];
        payload.extend(nla(CTA_TUPLE_ORIG | NLA_F_NESTED, &orig));
        payload.extend(nla(2 | NLA_F_NESTED, &reply)); // CTA_TUPLE_REPLY
        payload.extend(nla(3, &8u32.to_be_bytes())); // CTA_STATUS
        if let Some(zone) = zone {
            payload.extend(nla(CTA_ZONE, &zone.to_be_bytes()));
        }
        nlmsg(
            (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW,
            0x2, // NLM_F_MULTI
            9,
            &payload,
        )
    }

    fn parse_one(bytes: &[u8]) -> Option<Entry> {
        let msg = messages(bytes).next().unwrap().unwrap();
        parse_entry(msg.payload)
    }

    fn v4() -> UdpEntry {
        UdpEntry {
            src: "10.0.0.1".parse().unwrap(),
            dst: "192.168.1.2".parse().unwrap(),
            src_port: 40000,
            dst_port: 5353,
        }
    }

    fn v6() -> UdpEntry {
        UdpEntry {
            src: "fd00::1".parse().unwrap(),
            dst: "2001:db8::2".parse().unwrap(),
            src_port: 0x1234,
            dst_port: 0xabcd,
        }
    }

    #[test]
    fn a_dump_request_asks_ctnetlink_for_every_entry_of_the_family() {
        let bytes = dump_request(AF_INET6, 7);
        let want = nlmsg(0x0101, NLM_F_REQUEST | NLM_F_DUMP, 7, &[10, 0, 0, 0]);
        assert_eq!(bytes, want);
    }

    #[test]
    fn dumped_udp_entries_parse_with_their_zone() {
        let entry = parse_one(&dumped(AF_INET, IPPROTO_UDP, v4(), Some(3))).unwrap();
        assert_eq!(
            entry,
            Entry {
                family: AF_INET,
                tuple: v4(),
                zone: Some(3),
                tuple_zone: None,
            }
        );
        let entry = parse_one(&dumped(AF_INET6, IPPROTO_UDP, v6(), None)).unwrap();
        assert_eq!(
            (entry.family, entry.tuple, entry.zone),
            (AF_INET6, v6(), None)
        );
    }

    #[test]
    fn other_protocols_and_mismatched_families_are_skipped() {
        assert_eq!(parse_one(&dumped(AF_INET, 6, v4(), None)), None, "TCP");
        // An IPv4 tuple in a message that claims IPv6, and the reverse.
        assert_eq!(parse_one(&dumped(AF_INET6, IPPROTO_UDP, v4(), None)), None);
        assert_eq!(parse_one(&dumped(AF_INET, IPPROTO_UDP, v6(), None)), None);
        assert_eq!(parse_one(&dumped(7, IPPROTO_UDP, v4(), None)), None);
    }

    #[test]
    fn the_ipv4_delete_request_repeats_the_tuple_and_zone() {
        let entry = parse_one(&dumped(AF_INET, IPPROTO_UDP, v4(), Some(3))).unwrap();
        let proto = [
            nla(CTA_PROTO_NUM, &[17]),
            nla(CTA_PROTO_SRC_PORT, &[0x9c, 0x40]),
            nla(CTA_PROTO_DST_PORT, &[0x14, 0xe9]),
        ]
        .concat();
        let ip = [
            nla(CTA_IP_V4_SRC, &[10, 0, 0, 1]),
            nla(CTA_IP_V4_DST, &[192, 168, 1, 2]),
        ]
        .concat();
        let orig = [
            nla(CTA_TUPLE_IP | NLA_F_NESTED, &ip),
            nla(CTA_TUPLE_PROTO | NLA_F_NESTED, &proto),
        ]
        .concat();
        let payload = [
            vec![2, 0, 0, 0],
            nla(CTA_TUPLE_ORIG | NLA_F_NESTED, &orig),
            nla(CTA_ZONE, &[0, 3]),
        ]
        .concat();
        let want = nlmsg(0x0102, NLM_F_REQUEST | NLM_F_ACK, 42, &payload);
        assert_eq!(want.len(), 80);
        assert_eq!(delete_request(&entry, 42), want);
    }

    #[test]
    fn the_ipv6_delete_request_repeats_the_tuple() {
        let entry = parse_one(&dumped(AF_INET6, IPPROTO_UDP, v6(), None)).unwrap();
        let mut src = [0u8; 16];
        src[..2].copy_from_slice(&[0xfd, 0]);
        src[15] = 1;
        let mut dst = [0u8; 16];
        dst[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        dst[15] = 2;
        let ip = [nla(CTA_IP_V6_SRC, &src), nla(CTA_IP_V6_DST, &dst)].concat();
        let proto = [
            nla(CTA_PROTO_NUM, &[17]),
            nla(CTA_PROTO_SRC_PORT, &[0x12, 0x34]),
            nla(CTA_PROTO_DST_PORT, &[0xab, 0xcd]),
        ]
        .concat();
        let orig = [
            nla(CTA_TUPLE_IP | NLA_F_NESTED, &ip),
            nla(CTA_TUPLE_PROTO | NLA_F_NESTED, &proto),
        ]
        .concat();
        let payload = [vec![10, 0, 0, 0], nla(CTA_TUPLE_ORIG | NLA_F_NESTED, &orig)].concat();
        let want = nlmsg(0x0102, NLM_F_REQUEST | NLM_F_ACK, 1, &payload);
        // Header, nfgenmsg, and the tuple: its header, 44 of addresses, 28 of ports.
        assert_eq!(want.len(), 16 + 4 + 4 + 44 + 28);
        assert_eq!(delete_request(&entry, 1), want);
    }

    #[test]
    fn a_directional_zone_is_repeated_inside_the_tuple() {
        let entry = Entry {
            family: AF_INET,
            tuple: v4(),
            zone: None,
            tuple_zone: Some(5),
        };
        let bytes = delete_request(&entry, 1);
        let msg = messages(&bytes).next().unwrap().unwrap();
        let orig = find(&msg.payload[NFGENMSG_LEN..], CTA_TUPLE_ORIG).unwrap();
        assert_eq!(find(orig, CTA_TUPLE_ZONE), Some(&[0u8, 5][..]));
        assert_eq!(find(&msg.payload[NFGENMSG_LEN..], CTA_ZONE), None);
        // And what we send parses back to the same entry.
        assert_eq!(parse_entry(msg.payload), Some(entry));
    }

    #[test]
    fn malformed_entries_are_skipped() {
        assert_eq!(parse_entry(&[]), None);
        assert_eq!(parse_entry(&[2, 0, 0]), None);
        assert_eq!(parse_entry(&[2, 0, 0, 0, 1, 2, 3]), None);
        let good = dumped(AF_INET, IPPROTO_UDP, v4(), Some(1));
        let payload = &good[NLMSG_HDRLEN..];
        // Every truncation of a good entry, and a zone of the wrong size.
        for cut in 0..payload.len() {
            let _ = parse_entry(&payload[..cut]);
        }
        let mut bad_zone = payload[..payload.len() - 8].to_vec();
        bad_zone.extend(nla(CTA_ZONE, &[0, 0, 1]));
        assert_eq!(parse_entry(&bad_zone), None);
        // A port of the wrong size.
        let orig = [
            nla(CTA_TUPLE_IP | NLA_F_NESTED, &ip_nest(v4().src, v4().dst)),
            nla(
                CTA_TUPLE_PROTO | NLA_F_NESTED,
                &[
                    nla(CTA_PROTO_NUM, &[17]),
                    nla(CTA_PROTO_SRC_PORT, &[1, 2]),
                    nla(CTA_PROTO_DST_PORT, &[1, 2, 3, 4]),
                ]
                .concat(),
            ),
        ]
        .concat();
        let odd = [vec![2, 0, 0, 0], nla(CTA_TUPLE_ORIG, &orig)].concat();
        assert_eq!(parse_entry(&odd), None);
    }

    #[test]
    fn random_input_is_survived() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let good = dumped(AF_INET6, IPPROTO_UDP, v6(), Some(2));
        for _ in 0..3000 {
            let len = (next() % 200) as usize;
            let junk: Vec<u8> = (0..len).map(|_| (next() % 5) as u8 * 0x11).collect();
            let _ = parse_entry(&junk);
            // Flipped bytes inside a good entry.
            let mut flipped = good[NLMSG_HDRLEN..].to_vec();
            for _ in 0..3 {
                let i = (next() as usize) % flipped.len();
                flipped[i] = next() as u8;
            }
            let _ = parse_entry(&flipped);
        }
    }

    #[test]
    fn only_inet_families_are_accepted() {
        assert!(check_family(AF_INET).is_ok());
        assert!(check_family(AF_INET6).is_ok());
        let e = delete_udp_by_dst_port(0, 53).unwrap_err();
        assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
        assert!(udp_entries(7).is_err());
    }

    #[test]
    fn errors_name_the_request_and_keep_the_errno() {
        let e = netlink_error(
            "list ipv4 entries",
            cni_netlink::Error::Kernel {
                errno: libc::EPERM,
                message: None,
            },
        );
        assert!(matches!(
            e,
            Error::Conntrack {
                errno: Some(libc::EPERM),
                ..
            }
        ));
        assert!(
            e.to_string()
                .starts_with("conntrack: list ipv4 entries failed: Operation not permitted"),
            "{e}"
        );
        let entry = parse_one(&dumped(AF_INET6, IPPROTO_UDP, v6(), None)).unwrap();
        assert_eq!(
            describe_delete(&entry),
            "delete udp entry [fd00::1]:4660 -> [2001:db8::2]:43981"
        );
    }
}
