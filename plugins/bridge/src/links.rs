//! Netns, netlink and MAC helpers shared by ADD, CHECK and DEL.

use crate::errors::chain;
use cni_linux::{Link, NetNs, Netlink};
use cni_protocol::CniError;

pub(crate) fn open_netns(path: &str) -> Result<NetNs, CniError> {
    NetNs::open(path)
        .map_err(|e| CniError::internal(format!("failed to open netns {path:?}: {}", chain(&e))))
}

/// Deletes `ifname` in the netns `nl` talks to; a missing link is fine.
pub(crate) async fn delete_link(nl: &Netlink, ifname: &str) -> Result<(), CniError> {
    match nl.delete_link_by_name(ifname).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(CniError::internal(format!(
            "failed to delete {ifname:?}: {}",
            chain(&e),
        ))),
    }
}

pub(crate) fn mac_text(link: &Link) -> String {
    link.mac.map(|m| m.to_string()).unwrap_or_default()
}

/// Starts the current-thread runtime the netlink calls run on.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, CniError> {
    cni_linux::runtime().map_err(|e| CniError::internal(format!("failed to start runtime: {e}")))
}
