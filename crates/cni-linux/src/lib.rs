//! The Linux side of the CNI plugins: network namespaces ([`netns`]),
//! netlink operations on links, bridges, veth pairs, VXLAN devices and their
//! FDB and neighbour entries, addresses and routes, WireGuard devices and their
//! peers ([`netlink`], [`netlink::wireguard`]), and sysctls ([`sysctl`]).
//!
//! Namespace discipline: no long-lived thread ever calls `setns`. Work
//! inside another netns either uses a netlink socket created there
//! ([`Netlink::connect_in`]) or runs on a short-lived thread ([`NetNs::run`]).

pub mod error;
pub mod netlink;
pub mod netns;
mod oper_state;
pub mod sysctl;

pub use cni_protocol::mac::{self, MacAddr};
pub use error::{Error, Result};
pub use netlink::{
    Address, AddressOptions, BridgePort, Change, Family, FdbEntry, Link, Neighbour, Netlink,
    OPER_UP_DELAYS, OperState, Route, VethPair, VlanEntry, Vxlan, VxlanInfo, WgDevice, WgKey,
    WgPeer, WgPeerConfig, Wireguard,
};
pub use netns::{NetNs, NetNsLock};
/// The errno type behind [`Error::errno`], to name errnos rather than write numbers.
pub use nix::errno::Errno;
