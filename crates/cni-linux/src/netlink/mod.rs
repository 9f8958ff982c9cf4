//! Netlink (rtnetlink) client: links, bridges and their ports, veth pairs,
//! addresses and routes. A [`Netlink`] handle talks to one network
//! namespace, fixed when its socket is created; see [`Netlink::connect_in`].
//!
//! All methods are async and must run inside the runtime from [`runtime`]
//! (a current-thread tokio runtime with IO and timers).

mod addr;
mod bridge;
mod link;
mod route;
mod veth;
mod wait;

use std::future::Future;

use futures::TryStreamExt;
use futures::stream::Stream;

use crate::error::{Error, Result};
use crate::netns::NetNs;

pub use addr::Address;
pub use bridge::VlanEntry;
pub use link::{BridgePort, Link, OperState};
pub use route::Route;
pub use veth::VethPair;
pub use wait::OPER_UP_DELAYS;

/// An IP address family, used to filter dumps.
pub use cni_protocol::ip::Family;

/// Builds the runtime the netlink calls expect: current-thread, IO and timers on.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// A netlink connection bound to one network namespace.
#[derive(Debug, Clone)]
pub struct Netlink {
    handle: rtnetlink::Handle,
}

impl Netlink {
    /// Connects in the netns of the calling thread.
    pub fn connect() -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(|source| Error::Connect { source })?;
        runtime.spawn(connection);
        Ok(Self { handle })
    }

    /// Connects in `netns` without moving the calling thread.
    ///
    /// The socket is created on a short-lived thread that has entered the
    /// netns: a netlink socket belongs to the netns it was created in, for
    /// its whole life, whichever thread later uses it. That thread registers
    /// the socket with the caller's runtime so it can be driven from here.
    pub fn connect_in(netns: &NetNs) -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let (connection, handle, _) = netns
            .run(|| {
                let _entered = runtime.enter();
                rtnetlink::new_connection()
            })?
            .map_err(|source| Error::Connect { source })?;
        runtime.spawn(connection);
        Ok(Self { handle })
    }

    /// The underlying rtnetlink handle, for requests this type does not cover.
    pub fn handle(&self) -> &rtnetlink::Handle {
        &self.handle
    }
}

/// Awaits a request, describing the object in the error on failure.
async fn exec<F>(request: F, context: impl FnOnce() -> String) -> Result<()>
where
    F: Future<Output = std::result::Result<(), rtnetlink::Error>>,
{
    request.await.map_err(|e| Error::netlink(context(), e))
}

/// Collects a dump, describing the object in the error on failure.
async fn collect<S, T>(stream: S, context: impl FnOnce() -> String) -> Result<Vec<T>>
where
    S: Stream<Item = std::result::Result<T, rtnetlink::Error>>,
{
    stream
        .try_collect()
        .await
        .map_err(|e| Error::netlink(context(), e))
}
