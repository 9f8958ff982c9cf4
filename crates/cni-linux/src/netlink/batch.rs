//! Many changes in few exchanges: the overlay programs an FDB entry, a
//! neighbour entry and a route for each remote node, thousands at an agent's
//! start. [`Netlink::apply`] sends them in datagrams of up to [`BATCH_CHANGES`]
//! requests, each acknowledged only by its last request (see
//! `cni_netlink::Socket::request_batch`), and reports each change's outcome.

use std::net::IpAddr;

use cni_netlink::Writer;
use cni_netlink::wire::{NLM_F_ACK, NLM_F_REQUEST};

use super::Netlink;
use super::neigh::{
    FDB_REPLACE, NEIGHBOUR_REPLACE, fdb_context, fdb_message, neighbour_context, neighbour_message,
};
use super::route::Route;
use super::rtnl::{RTM_DELNEIGH, RTM_DELROUTE, RTM_NEWNEIGH, RTM_NEWROUTE};
use crate::error::{Error, Result};
use crate::mac::MacAddr;

/// Requests per datagram. The kernel queues an answer for each refused one; a
/// refusal with the kernel's explanation takes about 1 KiB of the receive
/// buffer, which is raised to hold a whole datagram's worth.
pub const BATCH_CHANGES: usize = 256;

/// Room in the receive buffer for the refusals of one datagram.
const REFUSAL_ROOM: usize = 1024;

/// One change of [`Netlink::apply`]: the same request as the method of the same
/// name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// [`Netlink::replace_fdb_entry`].
    ReplaceFdbEntry {
        /// The VXLAN device.
        index: u32,
        /// The remote's VTEP MAC.
        mac: MacAddr,
        /// The remote's underlay address.
        dst: IpAddr,
    },
    /// [`Netlink::del_fdb_entry`].
    DelFdbEntry {
        /// The VXLAN device.
        index: u32,
        /// The remote's VTEP MAC.
        mac: MacAddr,
        /// Only this destination of the entry; `None`: the whole entry.
        dst: Option<IpAddr>,
    },
    /// [`Netlink::replace_neighbour`].
    ReplaceNeighbour {
        /// The VXLAN device.
        index: u32,
        /// The remote's VTEP address.
        ip: IpAddr,
        /// The remote's VTEP MAC.
        mac: MacAddr,
    },
    /// [`Netlink::del_neighbour`].
    DelNeighbour {
        /// The VXLAN device.
        index: u32,
        /// The remote's VTEP address.
        ip: IpAddr,
    },
    /// [`Netlink::replace_route`].
    ReplaceRoute(Route),
    /// [`Netlink::del_route`].
    DelRoute(Route),
}

impl Change {
    /// The message type and flags, after writing the family header and
    /// attributes; a route that cannot be written is refused here.
    fn write(&self, w: &mut Writer) -> Result<(u16, u16)> {
        Ok(match *self {
            Self::ReplaceFdbEntry { index, mac, dst } => {
                fdb_message(w, index, mac, Some(dst));
                (RTM_NEWNEIGH, FDB_REPLACE)
            }
            Self::DelFdbEntry { index, mac, dst } => {
                fdb_message(w, index, mac, dst);
                (RTM_DELNEIGH, NLM_F_REQUEST | NLM_F_ACK)
            }
            Self::ReplaceNeighbour { index, ip, mac } => {
                neighbour_message(w, index, ip, Some(mac));
                (RTM_NEWNEIGH, NEIGHBOUR_REPLACE)
            }
            Self::DelNeighbour { index, ip } => {
                neighbour_message(w, index, ip, None);
                (RTM_DELNEIGH, NLM_F_REQUEST | NLM_F_ACK)
            }
            Self::ReplaceRoute(route) => {
                route.write(w, false)?;
                (RTM_NEWROUTE, Route::REPLACE_FLAGS)
            }
            Self::DelRoute(route) => {
                route.write(w, true)?;
                (RTM_DELROUTE, NLM_F_REQUEST | NLM_F_ACK)
            }
        })
    }

    /// The error context of the single-request method.
    fn context(&self) -> String {
        match *self {
            Self::ReplaceFdbEntry { index, mac, dst } => {
                fdb_context("replace", index, mac, Some(dst))
            }
            Self::DelFdbEntry { index, mac, dst } => fdb_context("delete", index, mac, dst),
            Self::ReplaceNeighbour { index, ip, mac } => {
                neighbour_context("replace", index, ip, Some(mac))
            }
            Self::DelNeighbour { index, ip } => neighbour_context("delete", index, ip, None),
            Self::ReplaceRoute(route) => format!("failed to replace route {route}"),
            Self::DelRoute(route) => format!("failed to delete route {route}"),
        }
    }
}

impl Netlink {
    /// Makes `changes`, in order, in as few exchanges as fit ([`BATCH_CHANGES`]
    /// requests each), and returns each one's outcome, in order: the error is the
    /// one the method of the same name would have returned (a deletion of
    /// something absent is `is_not_found()`). A refused change does not stop the
    /// ones after it.
    ///
    /// The outer error is an exchange that failed as a whole (a socket call, a
    /// receive buffer that overflowed): what its changes did is unknown, and so
    /// is the fate of the changes after it, which were not sent; read the
    /// tables back.
    pub fn apply(&self, changes: &[Change]) -> Result<Vec<Result<()>>> {
        let mut outcomes = Vec::with_capacity(changes.len());
        let mut sock = self.sock.borrow_mut();
        for chunk in changes.chunks(BATCH_CHANGES) {
            let mut batch = Writer::new();
            // Per change: sent, or refused before it could be.
            let mut written = Vec::with_capacity(chunk.len());
            for change in chunk {
                let mut body = Writer::new();
                written.push(change.write(&mut body).map(|(ty, flags)| {
                    let start = batch.begin_msg(ty, flags, sock.next_seq());
                    batch.bytes(body.as_bytes());
                    batch.end_msg(start);
                }));
            }
            let sent = written.iter().filter(|w| w.is_ok()).count();
            let mut batch = batch.into_bytes();
            sock.reserve_buffers(batch.len(), sent * REFUSAL_ROOM);
            let mut answers = sock
                .request_batch(&mut batch)
                .map_err(|e| Error::netlink(format!("failed to apply {sent} changes"), e))?
                .into_iter();
            for (change, written) in chunk.iter().zip(written) {
                outcomes.push(written.and_then(|()| match answers.next() {
                    Some(answer) => answer.map_err(|e| Error::netlink(change.context(), e)),
                    None => Err(Error::netlink(
                        change.context(),
                        cni_netlink::Malformed("no outcome for a change of a batch").into(),
                    )),
                }));
            }
        }
        Ok(outcomes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::hex;

    #[test]
    fn each_change_is_the_request_of_its_method() {
        let mac: MacAddr = "0a:58:c0:a8:00:02".parse().unwrap();
        let mut w = Writer::new();
        let fdb = Change::ReplaceFdbEntry {
            index: 4,
            mac,
            dst: "192.168.0.3".parse().unwrap(),
        };
        assert_eq!(fdb.write(&mut w).unwrap(), (RTM_NEWNEIGH, 0x505));
        assert_eq!(
            w.as_bytes(),
            hex("07000000 04000000 c0000200 0a000200 0a58c0a8 00020000 08000100 c0a80003")
        );
        assert_eq!(
            fdb.context(),
            "failed to replace FDB entry 0a:58:c0:a8:00:02 dst 192.168.0.3 on link #4"
        );
        let mut w = Writer::new();
        let neigh = Change::DelNeighbour {
            index: 4,
            ip: "10.244.2.0".parse().unwrap(),
        };
        assert_eq!(neigh.write(&mut w).unwrap(), (RTM_DELNEIGH, 0x5));
        let mixed = Change::ReplaceRoute(Route {
            gw: Some("10.0.0.1".parse().unwrap()),
            ..Route::new("fd00::/64".parse().unwrap())
        });
        assert!(mixed.write(&mut Writer::new()).is_err());
    }
}
