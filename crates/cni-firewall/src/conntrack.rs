//! Deleting conntrack entries over netlink (ctnetlink), for the portmap
//! plugin: after a host port's DNAT rules change, a UDP client that kept
//! sending would otherwise stay translated to the old container address.

use cni_netlink::Error as NlError;
use cni_netlink::Socket;
use cni_netlink::socket::NETLINK_NETFILTER;
#[cfg(test)]
use cni_netlink::wire::messages;
use cni_netlink::wire::{
    NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, attrs,
};
use nix::libc;

use crate::error::{Error, Result};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_DST_PORT: u16 = 3;
const IPPROTO_UDP: u8 = 17;
/// Attribute type bits that are flags, not the type.
const TYPE_MASK: u16 = 0x3fff;
const NFGENMSG_LEN: usize = 4;

/// One dumped entry: its original tuple's attributes as the kernel gave
/// them (the delete request sends them back), and its zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    tuple_ip: Vec<u8>,
    tuple_proto: Vec<u8>,
    zone: Option<Vec<u8>>,
    proto: u8,
    dst_port: u16,
}

fn find(data: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(data)
        .filter_map(std::result::Result::ok)
        .find_map(|(t, v)| (t & TYPE_MASK == ty).then_some(v))
}

/// Parses a `IPCTNL_MSG_CT_NEW` message of a dump (after the netlink header).
pub(crate) fn parse_entry(payload: &[u8]) -> Option<Entry> {
    let body = payload.get(NFGENMSG_LEN..)?;
    let orig = find(body, CTA_TUPLE_ORIG)?;
    let tuple_ip = find(orig, CTA_TUPLE_IP)?.to_vec();
    let tuple_proto = find(orig, CTA_TUPLE_PROTO)?.to_vec();
    let proto = *find(&tuple_proto, CTA_PROTO_NUM)?.first()?;
    let dst_port = find(&tuple_proto, CTA_PROTO_DST_PORT)
        .and_then(|v| Some(u16::from_be_bytes(v.get(..2)?.try_into().ok()?)))
        .unwrap_or(0);
    Some(Entry {
        tuple_ip,
        tuple_proto,
        zone: find(body, CTA_ZONE).map(<[u8]>::to_vec),
        proto,
        dst_port,
    })
}

fn request(
    ty: u16,
    flags: u16,
    seq: u32,
    family: u8,
    attrs: impl FnOnce(&mut cni_netlink::Writer),
) -> Vec<u8> {
    let mut w = cni_netlink::Writer::new();
    let msg = w.begin_msg(
        (NFNL_SUBSYS_CTNETLINK << 8) | ty,
        NLM_F_REQUEST | flags,
        seq,
    );
    w.bytes(&[family, 0, 0, 0]);
    attrs(&mut w);
    w.end_msg(msg);
    w.into_bytes()
}

/// The delete request for `entry`.
pub(crate) fn delete_request(entry: &Entry, seq: u32, family: u8) -> Vec<u8> {
    request(IPCTNL_MSG_CT_DELETE, NLM_F_ACK, seq, family, |w| {
        let orig = w.nest_start(CTA_TUPLE_ORIG | NLA_F_NESTED);
        w.attr(CTA_TUPLE_IP | NLA_F_NESTED, &entry.tuple_ip);
        w.attr(CTA_TUPLE_PROTO | NLA_F_NESTED, &entry.tuple_proto);
        w.nest_end(orig);
        if let Some(zone) = &entry.zone {
            w.attr(CTA_ZONE, zone);
        }
    })
}

fn io(target: &str, e: impl std::fmt::Display) -> Error {
    Error::Netlink {
        target: target.to_owned(),
        detail: e.to_string(),
        errno: None,
    }
}

/// The errno of a kernel refusal (positive), if that is what `e` is.
fn errno(e: &NlError) -> Option<i32> {
    match e {
        NlError::Kernel { errno, .. } => Some(errno.abs()),
        _ => None,
    }
}

/// Every entry of `family` in the calling thread's network namespace.
fn dump(sock: &mut Socket, family: u8) -> Result<Option<Vec<Entry>>> {
    let target = "conntrack table";
    for _ in 0..3 {
        let seq = sock.next_seq();
        let bytes = request(IPCTNL_MSG_CT_GET, NLM_F_DUMP, seq, family, |_| {});
        let mut entries = Vec::new();
        let mut interrupted = false;
        let result = sock.request(&bytes, |msg| {
            if msg.flags & NLM_F_DUMP_INTR != 0 {
                interrupted = true;
            }
            if msg.ty == (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW
                && let Some(entry) = parse_entry(msg.payload)
            {
                entries.push(entry);
            }
        });
        match result {
            Ok(()) if interrupted => {}
            Ok(()) => return Ok(Some(entries)),
            // No conntrack in this kernel or netns: nothing to forget.
            Err(e)
                if matches!(
                    errno(&e),
                    Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOENT)
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(io(target, e)),
        }
    }
    Err(io(target, "the table kept changing during the dump"))
}

/// Deletes every conntrack entry of `family` (`AF_INET` or `AF_INET6`)
/// whose original tuple is UDP to one of the destination `ports`, in the
/// calling thread's network namespace. Returns how many were deleted; an
/// entry gone between the dump and the delete is not an error, and a kernel
/// without conntrack has nothing to delete.
///
/// One dump serves every port: the kernel walks its whole conntrack hash
/// for a dump (about 10 ms on a default-sized table, however few entries
/// this namespace has).
pub fn delete_udp_by_dst_ports(family: u8, ports: &[u16]) -> Result<usize> {
    if ports.is_empty() {
        return Ok(0);
    }
    let target = "conntrack table";
    let mut sock = Socket::open(NETLINK_NETFILTER).map_err(|e| io(target, e))?;
    let Some(entries) = dump(&mut sock, family)? else {
        return Ok(0);
    };
    let mut deleted = 0;
    for entry in entries
        .iter()
        .filter(|e| e.proto == IPPROTO_UDP && ports.contains(&e.dst_port))
    {
        let seq = sock.next_seq();
        match sock.request(&delete_request(entry, seq, family), |_| {}) {
            Ok(()) => deleted += 1,
            Err(e) if errno(&e) == Some(libc::ENOENT) => {}
            Err(e) => return Err(io(target, e)),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumped(proto: u8, port: u16) -> Vec<u8> {
        let mut w = cni_netlink::Writer::new();
        let msg = w.begin_msg((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW, 0, 1);
        w.bytes(&[2, 0, 0, 0]);
        let orig = w.nest_start(CTA_TUPLE_ORIG | NLA_F_NESTED);
        let ip = w.nest_start(CTA_TUPLE_IP | NLA_F_NESTED);
        w.attr(1, &[10, 0, 0, 1]);
        w.attr(2, &[10, 0, 0, 2]);
        w.nest_end(ip);
        let p = w.nest_start(CTA_TUPLE_PROTO | NLA_F_NESTED);
        w.attr_u8(CTA_PROTO_NUM, proto);
        w.attr(2, &1234u16.to_be_bytes());
        w.attr(CTA_PROTO_DST_PORT, &port.to_be_bytes());
        w.nest_end(p);
        w.nest_end(orig);
        w.end_msg(msg);
        w.into_bytes()
    }

    #[test]
    fn dumped_entries_parse_and_delete_requests_carry_the_tuple() {
        let bytes = dumped(IPPROTO_UDP, 5300);
        let msg = messages(&bytes).next().unwrap().unwrap();
        let entry = parse_entry(msg.payload).unwrap();
        assert_eq!((entry.proto, entry.dst_port), (IPPROTO_UDP, 5300));
        let request = delete_request(&entry, 7, 2);
        let msg = messages(&request).next().unwrap().unwrap();
        assert_eq!(msg.ty, (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE);
        let again = parse_entry(msg.payload).unwrap();
        assert_eq!(again, entry);
    }

    #[test]
    fn garbage_is_skipped() {
        assert_eq!(parse_entry(&[2, 0, 0, 0, 1, 2, 3]), None);
        assert_eq!(parse_entry(&[]), None);
    }
}
