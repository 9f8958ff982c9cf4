//! A blocking netlink socket and the request/answer exchange on it.
//!
//! The kernel handles a request to rtnetlink or nf_tables inside the `send`
//! that carries it, so by the time `send` returns, the answer is queued: the
//! exchange is a send and a few reads, with no event loop.

use std::io;

use netlink_sys::SocketAddr;
use nix::libc;

pub use netlink_sys::protocols::{NETLINK_NETFILTER, NETLINK_ROUTE};

use crate::Error;
use crate::wire::{
    Malformed, Message, NLM_F_ACK, NLM_F_DUMP, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN, NLMSG_NOOP,
    i32_ne, messages,
};

/// Largest datagram the kernel sends: a dump fills at most 32 KiB
/// (`netlink_dump` caps its buffer there), acknowledgements are smaller.
const RECV_BUF: usize = 64 * 1024;

/// A netlink socket of one protocol, in the network namespace of the thread
/// that opened it (for its whole life, whichever thread uses it later).
#[derive(Debug)]
pub struct Socket {
    sock: netlink_sys::Socket,
    buf: Vec<u8>,
    seq: u32,
}

impl Socket {
    /// Opens a socket of `protocol` (e.g. [`NETLINK_ROUTE`]) talking to the kernel.
    pub fn open(protocol: isize) -> io::Result<Self> {
        let sock = netlink_sys::Socket::new(protocol)?;
        // Refusals come with the kernel's explanation where it has one, and
        // without a copy of the request (which nobody reads).
        let _ = sock.set_ext_ack(true);
        let _ = sock.set_cap_ack(true);
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(Self {
            sock,
            buf: Vec::new(),
            // Distinct from a concurrent process's numbers in error reports
            // only; answers are matched on this socket anyway.
            seq: std::process::id().wrapping_shl(12),
        })
    }

    /// The sequence number for the next request.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// The last sequence number handed out.
    pub fn last_seq(&self) -> u32 {
        self.seq
    }

    /// Moves the sequence counter on to `seq` (after numbering a batch by hand).
    pub fn set_last_seq(&mut self, seq: u32) {
        self.seq = seq;
    }

    /// Raises the socket's send buffer to hold a datagram of `send` bytes and its
    /// receive buffer to `recv` bytes, where they are smaller; never lowers them.
    ///
    /// The kernel refuses a datagram larger than the send buffer (`EMSGSIZE`), and
    /// an nf_tables transaction is one datagram. With `CAP_NET_ADMIN` the sizes are
    /// forced past the system's maxima (`SO_SNDBUFFORCE`, as `nft` does); without
    /// it they are asked for up to those maxima, and a send that still does not
    /// fit fails as it would have.
    pub fn reserve_buffers(&self, send: usize, recv: usize) {
        use nix::sys::socket::{getsockopt, setsockopt, sockopt};
        let fd = &self.sock;
        // The kernel doubles what is set (for its bookkeeping) and reports the
        // doubled value; the room for data is about half of what it reports.
        let want = send + 4096;
        if getsockopt(fd, sockopt::SndBuf).is_ok_and(|now| now / 2 < want)
            && setsockopt(fd, sockopt::SndBufForce, &want).is_err()
        {
            let _ = setsockopt(fd, sockopt::SndBuf, &want);
        }
        if getsockopt(fd, sockopt::RcvBuf).is_ok_and(|now| now / 2 < recv)
            && setsockopt(fd, sockopt::RcvBufForce, &recv).is_err()
        {
            let _ = setsockopt(fd, sockopt::RcvBuf, &recv);
        }
    }

    /// Makes a blocking [`Socket::recv`] give up after `timeout` (`None`: wait for
    /// ever), with an I/O error of kind `WouldBlock`: a reader of the kernel's
    /// unsolicited messages (a log group) can then look up now and then.
    pub fn set_recv_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        use nix::sys::socket::{setsockopt, sockopt};
        // A zero timeval means "for ever" to the kernel: a zero timeout waits 1 µs.
        let value = match timeout {
            None => nix::sys::time::TimeVal::new(0, 0),
            Some(t) => nix::sys::time::TimeVal::new(
                libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
                libc::suseconds_t::from(t.subsec_micros().max(1)),
            ),
        };
        setsockopt(&self.sock, sockopt::ReceiveTimeout, &value).map_err(io::Error::from)
    }

    /// Sends one datagram (one message or a batch of them).
    pub fn send(&self, bytes: &[u8]) -> Result<(), Error> {
        let sent = self.sock.send(bytes, 0)?;
        if sent != bytes.len() {
            return Err(Malformed("short write to the netlink socket").into());
        }
        Ok(())
    }

    /// Receives one datagram; `Ok(None)` when `nonblocking` and nothing is queued.
    pub fn recv(&mut self, nonblocking: bool) -> Result<Option<&[u8]>, Error> {
        let flags = libc_flags(nonblocking);
        if self.buf.capacity() < RECV_BUF {
            self.buf.reserve(RECV_BUF);
        }
        loop {
            self.buf.clear();
            match self.sock.recv(&mut self.buf, flags) {
                // MSG_TRUNC: the datagram's real length, even if it did not fit.
                Ok(n) if n > self.buf.len() => {
                    return Err(Malformed("netlink answer larger than the buffer").into());
                }
                Ok(_) => return Ok(Some(&self.buf)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if nonblocking && e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sends `request` (one message, numbered with [`Socket::next_seq`]) and
    /// reads its answer, handing each reply message to `on_reply`.
    ///
    /// A dump (`NLM_F_DUMP`) ends with its `NLMSG_DONE`; a request with
    /// `NLM_F_ACK` with its acknowledgement; any other with its first reply.
    /// A refusal is [`Error::Kernel`]. Messages of other sequence numbers
    /// (answers to an earlier, abandoned request) are skipped.
    pub fn request(
        &mut self,
        request: &[u8],
        mut on_reply: impl FnMut(&Message<'_>),
    ) -> Result<(), Error> {
        self.request_while(request, &mut |msg| {
            on_reply(msg);
            true
        })
        .map(|_| ())
    }

    /// [`Socket::request`], stopped as soon as `on_reply` returns `false`:
    /// `Ok(false)` then, with the rest of the answer unread. A dump holds its
    /// socket until it is read to its end (the kernel makes each part as the
    /// last is read, and refuses another dump meanwhile with `EBUSY`), so a
    /// socket whose dump was stopped is closed rather than used again: closing
    /// it ends the dump without the kernel making the rest. (`on_reply` is a trait
    /// object so that the loop is compiled once, not once per caller.)
    pub fn request_while(
        &mut self,
        request: &[u8],
        on_reply: &mut dyn FnMut(&Message<'_>) -> bool,
    ) -> Result<bool, Error> {
        let header = request
            .get(..NLMSG_HDRLEN)
            .ok_or(Malformed("request shorter than a netlink header"))?;
        let flags = u16::from_ne_bytes([header[6], header[7]]);
        let seq = u32::from_ne_bytes([header[8], header[9], header[10], header[11]]);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let wants_ack = flags & NLM_F_ACK != 0;
        self.send(request)?;
        loop {
            let Some(datagram) = self.recv(false)? else {
                continue;
            };
            for msg in messages(datagram) {
                let msg = msg?;
                if msg.seq != seq {
                    continue;
                }
                match msg.ty {
                    NLMSG_NOOP => {}
                    NLMSG_ERROR => {
                        return match msg.error_code()? {
                            0 => Ok(true),
                            errno => Err(Error::Kernel {
                                errno,
                                message: msg.ext_ack_message(),
                            }),
                        };
                    }
                    NLMSG_DONE => {
                        // A dump that failed midway says so in its DONE.
                        let code = match msg.payload.get(..4) {
                            Some(b) => i32_ne(b)?,
                            None => 0,
                        };
                        return match code {
                            0 => Ok(true),
                            code => Err(Error::Kernel {
                                errno: code.checked_neg().unwrap_or(i32::MAX),
                                message: None,
                            }),
                        };
                    }
                    _ => {
                        if !on_reply(&msg) {
                            return Ok(false);
                        }
                        if !dump && !wants_ack {
                            return Ok(true);
                        }
                    }
                }
            }
        }
    }

    /// Sends `batch`, several requests in one datagram, and returns each one's
    /// outcome in order. The requests are complete messages with distinct
    /// sequence numbers (from [`Socket::next_seq`]); none may be a dump.
    ///
    /// Only the last request asks for an acknowledgement: this clears `NLM_F_ACK`
    /// on the others and sets it on the last. The kernel handles rtnetlink
    /// requests one after the other inside the `send` that carries them, answers
    /// a refused one with its error whatever its flags, and goes on with the next;
    /// so once the last one is answered, every refusal is queued before it, and a
    /// request nobody answered went in. Thousands of requests cost one `send` and
    /// as many reads as there are refusals, where one acknowledgement each would
    /// cost a read each and could overflow the receive buffer (the kernel drops
    /// what does not fit and the read fails with `ENOBUFS`, an outer error here).
    ///
    /// The outer error is for the exchange itself: a batch that does not frame, a
    /// failed socket call, or no answer to the last request.
    pub fn request_batch(&mut self, batch: &mut [u8]) -> Result<Vec<Result<(), Error>>, Error> {
        // (offset of the flags, sequence number) of each message.
        let mut requests: Vec<(usize, u32)> = Vec::new();
        let mut offset = 0;
        while offset < batch.len() {
            let header = batch
                .get(offset..offset + NLMSG_HDRLEN)
                .ok_or(Malformed("truncated netlink header in a batch"))?;
            let len = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let flags = u16::from_ne_bytes([header[6], header[7]]);
            let seq = u32::from_ne_bytes([header[8], header[9], header[10], header[11]]);
            if len < NLMSG_HDRLEN || offset + len > batch.len() {
                return Err(Malformed("netlink message length out of bounds in a batch").into());
            }
            if flags & NLM_F_DUMP == NLM_F_DUMP {
                return Err(Malformed("a dump in a batch").into());
            }
            if requests.iter().any(|(_, s)| *s == seq) {
                return Err(Malformed("two requests of a batch share a sequence number").into());
            }
            requests.push((offset + 6, seq));
            offset += len.next_multiple_of(4);
        }
        let Some(&(_, last_seq)) = requests.last() else {
            return Ok(Vec::new());
        };
        for (i, (at, _)) in requests.iter().enumerate() {
            let flags = u16::from_ne_bytes([batch[*at], batch[*at + 1]]);
            let flags = if i + 1 == requests.len() {
                flags | NLM_F_ACK
            } else {
                flags & !NLM_F_ACK
            };
            batch[*at..*at + 2].copy_from_slice(&flags.to_ne_bytes());
        }
        let mut outcomes: Vec<Result<(), Error>> = requests.iter().map(|_| Ok(())).collect();
        self.send(batch)?;
        loop {
            // Everything is queued by the time `send` returns; an empty queue
            // before the last answer means it will never come.
            let Some(datagram) = self.recv(true)? else {
                return Err(Malformed("no answer to the last request of a batch").into());
            };
            let mut done = false;
            for msg in messages(datagram) {
                let msg = msg?;
                if msg.ty != NLMSG_ERROR {
                    continue;
                }
                let Some(i) = requests.iter().position(|(_, s)| *s == msg.seq) else {
                    continue;
                };
                let errno = msg.error_code()?;
                if errno != 0 {
                    outcomes[i] = Err(Error::Kernel {
                        errno,
                        message: msg.ext_ack_message(),
                    });
                }
                done |= msg.seq == last_seq;
            }
            if done {
                return Ok(outcomes);
            }
        }
    }
}

/// What a wait on a [`Subscription`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notified {
    /// One datagram: how many notifications it held, and how many of them the caller's
    /// filter kept.
    Messages {
        /// Notifications in the datagram.
        total: usize,
        /// Those the filter kept.
        kept: usize,
    },
    /// The kernel dropped notifications (the receive buffer overflowed): anything may
    /// have changed.
    Overflow,
}

/// A socket that receives the kernel's notifications of some multicast groups (e.g.
/// rtnetlink's link, address and route groups), in the network namespace of the
/// thread that opened it.
#[derive(Debug)]
pub struct Subscription {
    sock: netlink_sys::Socket,
    buf: Vec<u8>,
}

impl Subscription {
    /// Opens a socket of `protocol` that is a member of `groups` (the kernel's group
    /// numbers, e.g. `RTNLGRP_LINK` = 1).
    pub fn open(protocol: isize, groups: &[u32]) -> io::Result<Self> {
        let mut sock = netlink_sys::Socket::new(protocol)?;
        sock.bind_auto()?;
        // Room for a burst (a node's thousands of routes coming or going at once);
        // past it the kernel says so with ENOBUFS, which is reported, not lost.
        let _ = sock.set_rx_buf_sz(1 << 20);
        for &group in groups {
            sock.add_membership(group)?;
        }
        Ok(Self {
            sock,
            buf: Vec::with_capacity(RECV_BUF),
        })
    }

    /// Blocks until notifications arrive; `keep` says which of them matter (a
    /// notification that does not decode is kept).
    pub fn wait(&mut self, mut keep: impl FnMut(&Message<'_>) -> bool) -> Result<Notified, Error> {
        loop {
            self.buf.clear();
            match self.sock.recv(&mut self.buf, 0) {
                Ok(_) => {
                    let (mut total, mut kept) = (0, 0);
                    for message in messages(&self.buf) {
                        total += 1;
                        if message.as_ref().map_or(true, &mut keep) {
                            kept += 1;
                        }
                    }
                    return Ok(Notified::Messages { total, kept });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(Notified::Overflow),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn libc_flags(nonblocking: bool) -> i32 {
    libc::MSG_TRUNC | if nonblocking { libc::MSG_DONTWAIT } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{NLM_F_REQUEST, Writer};

    const RTM_NEWLINK: u16 = 16;
    const RTM_GETLINK: u16 = 18;

    /// A GETLINK for `index` (0 and `NLM_F_DUMP`: every link).
    fn getlink(sock: &mut Socket, index: u32, flags: u16) -> Vec<u8> {
        let mut w = Writer::new();
        let start = w.begin_msg(RTM_GETLINK, NLM_F_REQUEST | flags, sock.next_seq());
        w.bytes(&[0; 4]);
        w.bytes(&index.to_ne_bytes());
        w.bytes(&[0; 8]);
        w.end_msg(start);
        w.into_bytes()
    }

    /// Reads links of the test's own netns (no privilege needed, nothing changes):
    /// a get ends with its one reply, a dump with its DONE, a refusal is the errno.
    #[test]
    fn requests_end_with_their_reply_their_done_or_the_errno() {
        let mut sock = Socket::open(NETLINK_ROUTE).expect("a NETLINK_ROUTE socket");
        let mut replies = Vec::new();
        let get = getlink(&mut sock, 1, 0);
        sock.request(&get, |m| replies.push(m.ty)).unwrap();
        assert_eq!(replies, [RTM_NEWLINK], "loopback is always index 1");

        replies.clear();
        let dump = getlink(&mut sock, 0, NLM_F_DUMP);
        sock.request(&dump, |m| replies.push(m.ty)).unwrap();
        assert!(!replies.is_empty() && replies.iter().all(|t| *t == RTM_NEWLINK));

        let missing = getlink(&mut sock, u32::MAX >> 1, NLM_F_ACK);
        match sock.request(&missing, |_| panic!("no such link")) {
            Err(Error::Kernel { errno, .. }) => assert_eq!(errno, libc::ENODEV),
            other => panic!("{other:?}"),
        }
        // The socket stays usable after a refusal.
        replies.clear();
        let again = getlink(&mut sock, 1, 0);
        sock.request(&again, |m| replies.push(m.ty)).unwrap();
        assert_eq!(replies, [RTM_NEWLINK]);
        assert!(sock.request(&[1, 2, 3], |_| {}).is_err());
    }

    /// A request read to its end says so; one stopped by its reader stops at once.
    #[test]
    fn a_request_stops_at_the_first_reply_its_reader_refuses() {
        let mut sock = Socket::open(NETLINK_ROUTE).expect("a NETLINK_ROUTE socket");
        let mut replies = 0;
        let dump = getlink(&mut sock, 0, NLM_F_DUMP);
        let whole = sock.request_while(&dump, &mut |_| {
            replies += 1;
            true
        });
        assert!(whole.unwrap() && replies >= 1, "loopback at least");

        let mut read = 0;
        let dump = getlink(&mut sock, 0, NLM_F_DUMP);
        let stopped = sock.request_while(&dump, &mut |_| {
            read += 1;
            false
        });
        assert!(!stopped.unwrap());
        assert_eq!(read, 1);
    }

    /// A batch of link lookups (each answered by a reply, which the batch ignores):
    /// only refusals and the last acknowledgement come back, one outcome each.
    #[test]
    fn a_batch_reports_each_refusal_and_ends_with_the_last_answer() {
        let mut sock = Socket::open(NETLINK_ROUTE).expect("a NETLINK_ROUTE socket");
        let mut batch = Vec::new();
        // Loopback (there), a missing link, loopback again, a missing link last.
        for index in [1, u32::MAX >> 1, 1, u32::MAX >> 2] {
            batch.extend(getlink(&mut sock, index, NLM_F_ACK));
        }
        let outcomes = sock.request_batch(&mut batch).unwrap();
        let errnos: Vec<Option<i32>> = outcomes
            .iter()
            .map(|o| o.as_ref().err().and_then(Error::errno))
            .collect();
        assert_eq!(errnos, [None, Some(libc::ENODEV), None, Some(libc::ENODEV)]);
        // ACK cleared on all but the last.
        let flags: Vec<u16> = messages(&batch).map(|m| m.unwrap().flags).collect();
        assert_eq!(flags, [1, 1, 1, 5]);
        // Replies of the batch left in the queue do not confuse the next request.
        let mut replies = Vec::new();
        let get = getlink(&mut sock, 1, 0);
        sock.request(&get, |m| replies.push(m.ty)).unwrap();
        assert_eq!(replies, [RTM_NEWLINK]);
        assert!(sock.request_batch(&mut []).unwrap().is_empty());
    }

    #[test]
    fn a_batch_that_does_not_frame_is_refused_before_it_is_sent() {
        let mut sock = Socket::open(NETLINK_ROUTE).expect("a NETLINK_ROUTE socket");
        let mut dump = getlink(&mut sock, 0, NLM_F_DUMP);
        assert!(sock.request_batch(&mut dump).is_err());
        let mut twice = getlink(&mut sock, 1, 0);
        twice.extend(twice.clone());
        assert!(sock.request_batch(&mut twice).is_err());
        let mut cut = getlink(&mut sock, 1, 0);
        cut.truncate(20);
        assert!(sock.request_batch(&mut cut).is_err());
        let mut long = getlink(&mut sock, 1, 0);
        long[0] = 200;
        assert!(sock.request_batch(&mut long).is_err());
    }

    /// Buffers grow to what is asked (forced past the system's maxima as root,
    /// which the root tests run as; otherwise up to the maxima) and never shrink.
    #[test]
    fn buffers_grow_and_never_shrink() {
        use nix::sys::socket::{getsockopt, sockopt};
        let sock = Socket::open(NETLINK_ROUTE).expect("a NETLINK_ROUTE socket");
        let before = getsockopt(&sock.sock, sockopt::SndBuf).unwrap();
        sock.reserve_buffers(4 << 20, 1 << 20);
        let send = getsockopt(&sock.sock, sockopt::SndBuf).unwrap();
        let recv = getsockopt(&sock.sock, sockopt::RcvBuf).unwrap();
        assert!(send >= before, "{send} < {before}");
        if nix::unistd::geteuid().is_root() {
            assert!(send / 2 >= 4 << 20, "{send}");
            assert!(recv / 2 >= 1 << 20, "{recv}");
        }
        sock.reserve_buffers(1, 1);
        assert_eq!(getsockopt(&sock.sock, sockopt::SndBuf).unwrap(), send);
    }
}
