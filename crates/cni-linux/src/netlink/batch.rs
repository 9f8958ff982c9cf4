//! Several changes to one namespace sent as one datagram: a pod's addresses, its
//! link going up and its routes.
//!
//! Why: once a link goes up, the kernel's IPv6 autoconfiguration runs on a worker
//! that holds RTNL while the link-local address's MLD reports and router
//! solicitation are flooded through the bridge to every other pod. Requests made
//! one after another each wait for RTNL behind that worker; requests in one
//! datagram are handled within the one `send`, before the worker gets its turn.
//!
//! Each change is the same message, with the same error context, as the
//! single-change method ([`Netlink::add_address`], [`Netlink::set_up`],
//! [`Netlink::add_route`]); only the sequence numbers differ.

use cni_netlink::Writer;
use cni_netlink::wire::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST};
use ipnetwork::IpNetwork;

use super::Netlink;
use super::addr::address_message;
use super::route::Route;
use super::rtnl::{IFF_UP, IfInfo, RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE};
use crate::error::{Error, Result};

/// One change of a [`Netlink::apply`] batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a> {
    /// [`Netlink::add_address`].
    AddAddress { index: u32, ip: IpNetwork },
    /// [`Netlink::set_up`].
    SetUp { index: u32 },
    /// [`Netlink::add_route`].
    AddRoute(&'a Route),
}

impl Change<'_> {
    /// The error context of the single-change method.
    fn context(&self) -> String {
        match self {
            Self::AddAddress { index, ip } => {
                format!("failed to add address {ip} to link #{index}")
            }
            Self::SetUp { index } => format!("failed to set link #{index} up"),
            Self::AddRoute(route) => format!("failed to add route {route}"),
        }
    }

    /// Appends this change's message, numbered `seq`; a route that cannot be
    /// expressed is refused before anything is written.
    fn write(&self, w: &mut Writer, seq: u32) -> Result<()> {
        let mut body = Writer::new();
        let (ty, flags) = match self {
            Self::AddAddress { index, ip } => {
                address_message(&mut body, *index, *ip);
                (
                    RTM_NEWADDR,
                    NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE,
                )
            }
            Self::SetUp { index } => {
                IfInfo {
                    flags: IFF_UP,
                    change: IFF_UP,
                    ..IfInfo::index(*index)
                }
                .write(&mut body);
                (RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK)
            }
            Self::AddRoute(route) => {
                route.write(&mut body, false)?;
                (RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE)
            }
        };
        let start = w.begin_msg(ty, flags, seq);
        w.bytes(body.as_bytes());
        w.end_msg(start);
        Ok(())
    }
}

impl Netlink {
    /// Makes `changes` in one datagram and returns each one's outcome, in order.
    ///
    /// The kernel makes every change it is sent, also after one it refuses: a
    /// caller that stops at the first failure must undo what came after it (for
    /// a pod's interface, deleting the link does). A change that cannot be
    /// expressed (a route mixing families) is not sent and fails with the error
    /// its single-change method gives. A failure of the exchange itself is
    /// reported for every change it left unanswered.
    pub fn apply(&self, changes: &[Change<'_>]) -> Vec<Result<()>> {
        let mut sock = self.sock.borrow_mut();
        let mut w = Writer::new();
        let mut outcomes: Vec<Option<Result<()>>> = Vec::with_capacity(changes.len());
        let mut sent = Vec::new();
        for (at, change) in changes.iter().enumerate() {
            let mut msg = Writer::new();
            match change.write(&mut msg, sock.next_seq()) {
                Ok(()) => {
                    w.bytes(msg.as_bytes());
                    sent.push(at);
                    outcomes.push(None);
                }
                Err(e) => outcomes.push(Some(Err(e))),
            }
        }
        if !sent.is_empty() {
            match sock.request_batch(w.as_bytes()) {
                Ok(answers) => {
                    for (at, answer) in sent.iter().zip(answers) {
                        outcomes[*at] =
                            Some(answer.map_err(|e| Error::netlink(changes[*at].context(), e)));
                    }
                }
                Err(e) => {
                    // Not cloneable: the first unanswered change gets the error
                    // itself, the others its text.
                    let text = e.to_string();
                    let mut first = Some(e);
                    for at in &sent {
                        let e = first.take().unwrap_or_else(|| {
                            cni_netlink::Error::Io(std::io::Error::other(text.clone()))
                        });
                        outcomes[*at] = Some(Err(Error::netlink(changes[*at].context(), e)));
                    }
                }
            }
        }
        outcomes
            .into_iter()
            .zip(changes)
            .map(|(outcome, change)| {
                outcome.unwrap_or_else(|| {
                    let missing = cni_netlink::Malformed("no answer to a batched request");
                    Err(Error::netlink(change.context(), missing.into()))
                })
            })
            .collect()
    }
}
