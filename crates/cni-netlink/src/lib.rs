//! Netlink, as both netlink users of the plugins speak it: the rtnetlink client
//! of `cni-linux` (links, addresses, routes) and the nf_tables client of
//! `cni-firewall`.
//!
//! - [`wire`]: the format. A [`Writer`] lays out messages with (nested)
//!   attributes; [`messages`] and [`attrs`] walk what the kernel sends back,
//!   reporting truncated or inconsistent framing as [`Malformed`], never
//!   panicking.
//! - [`socket`]: a blocking [`Socket`] with its own sequence numbers, and
//!   [`Socket::request`], one request answered by an acknowledgement, a reply
//!   or a dump, with the kernel's errno (and extended-ack text) on failure.
//!
//! Everything is synchronous: a plugin makes a handful of requests one after the
//! other, each answered within the `send` that carries it, so there is nothing
//! for an event loop to do.

pub mod socket;
pub mod wire;

pub use socket::Socket;
pub use wire::{Malformed, Message, Writer, attrs, messages};

/// What a netlink exchange can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel refused the request with this errno (positive).
    #[error("{}", std::io::Error::from_raw_os_error(*errno))]
    Kernel {
        /// The errno, positive (`EEXIST` is 17).
        errno: i32,
        /// The kernel's extended-ack text, when it sent one.
        message: Option<String>,
    },
    /// The socket call itself failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The answer could not be decoded.
    #[error(transparent)]
    Malformed(#[from] Malformed),
}

impl Error {
    /// The errno of a kernel refusal or a failed socket call.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Kernel { errno, .. } => Some(*errno),
            Self::Io(e) => e.raw_os_error(),
            Self::Malformed(_) => None,
        }
    }
}
