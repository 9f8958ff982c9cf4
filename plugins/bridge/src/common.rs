//! Helpers shared by ADD, CHECK and DEL: opening the netns, deleting a link, a
//! link's MAC as text, joining a step run on its own thread, and the error of a
//! failed step that has no underlying cause.

use crate::links::Links;
use cni_linux::netns::container_netns_error;
use cni_linux::{Link, NetNs};
use cni_protocol::{CmdArgs, CniError, Context};

/// Opens the container's netns once, refusing the plugin's own (unless
/// `CNI_NETNS_OVERRIDE`); the handle, not the path, is used from then on.
pub(crate) fn open_netns(args: &CmdArgs) -> Result<NetNs, CniError> {
    NetNs::open_container(&args.netns, args.netns_override)
        .map_err(|e| container_netns_error(e, &args.netns))
}

/// Deletes `ifname` in the netns `nl` talks to; a missing link is fine.
pub(crate) fn delete_link(nl: &impl Links, ifname: &str) -> Result<(), CniError> {
    match nl.delete_link_by_name(ifname) {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e).with_context(|| format!("failed to delete {ifname:?}")),
    }
}

pub(crate) fn mac_text(link: &Link) -> String {
    link.mac.map(|m| m.to_string()).unwrap_or_default()
}

/// The outcome of a step run on its own thread; its panic carries on here.
pub(crate) fn joined<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// A code-999 error for a failed step that has no underlying error to add context
/// to (that case is [`cni_protocol::Context`]).
pub(crate) fn fail(msg: impl Into<String>) -> CniError {
    CniError::internal(msg)
}
