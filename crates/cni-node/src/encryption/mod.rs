//! Encryption of pod traffic between nodes with kernel WireGuard (`--encryption
//! wireguard`): one more way to reach a peer, chosen per node pair beside direct routes
//! and VXLAN.
//!
//! Each node keeps one WireGuard device ([`device`]) with a private key kept in its
//! state directory ([`key`]) and publishes the public key on its own Node object
//! ([`annotation`]). Every other node that publishes a key is a peer: its InternalIP
//! and the device's port as endpoint, its pod CIDRs as allowed IPs, and the routes to
//! those pod CIDRs go through the device, whether the pair would be direct or VXLAN.
//! A node without a key (encryption off there, or a kernel without WireGuard) is
//! reached as before, in clear; with `--encryption-strict` the strict table
//! ([`strict`]) drops pod traffic to other nodes that would leave in clear, and clear
//! pod traffic from nodes that publish a key.
//!
//! This node encrypts towards its peers only once the API has its own current public
//! key (the patch accepted, or the watch showing it): a peer that has not learned the
//! key would drop what it sends.

pub mod annotation;
pub mod device;
pub mod key;
pub mod step;
pub mod strict;
pub mod watch;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use ipnetwork::IpNetwork;

pub use key::Key;

/// The Node annotation holding a node's WireGuard public key (base64, as `wg` shows it).
pub const ANNOTATION: &str = "cni-plugins-rs.io/wireguard-public-key";

/// The device's default UDP port: clear of Calico's and flannel's 51820 (and flannel's
/// IPv6 51821) and Cilium's 51871, so that they can share a host during a migration.
pub const DEFAULT_PORT: u16 = 51830;

/// The default device name.
pub const DEFAULT_DEVICE: &str = "cni-wg0";

/// The default state directory (the key file's).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cni-node";

/// WireGuard's overhead over an IPv4 underlay (20 + 8 + 32) and an IPv6 one (40 + 8 + 32).
pub use cni_linux::netlink::wireguard::{OVERHEAD_V4, OVERHEAD_V6};

/// The encryption settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncryptionSettings {
    /// The device's name.
    pub device: String,
    /// Its UDP port, the same on every node.
    pub port: u16,
    /// Whether pod traffic to and from other nodes is never sent or taken in clear.
    pub strict: bool,
    /// Where the key file is.
    pub state_dir: PathBuf,
}

impl Default for EncryptionSettings {
    fn default() -> Self {
        Self {
            device: DEFAULT_DEVICE.to_owned(),
            port: DEFAULT_PORT,
            strict: false,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
        }
    }
}

/// This node's side of encryption, as the plan needs it: present only while its
/// device is ready with its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalEncryption {
    /// The device's index.
    pub index: u32,
    /// This node's public key.
    pub public_key: Key,
    /// The device's UDP port (every node's).
    pub port: u16,
    /// Whether the API has this key on this node's Node (it took the patch, or the
    /// watch shows it): only then do the routes go
    /// through the device (a peer that does not know the key drops what it gets), while
    /// the peers are on the device from the start, so what they send is taken.
    pub published: bool,
}

/// A peer as it should be on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    /// The peer's node.
    pub node: String,
    /// Its public key.
    pub public_key: Key,
    /// Its InternalIP and the device's port.
    pub endpoint: SocketAddr,
    /// Its pod CIDRs.
    pub allowed_ips: Vec<IpNetwork>,
}

/// WireGuard's overhead over an underlay of the family of `endpoint`.
pub fn overhead(endpoint: IpAddr) -> u32 {
    if endpoint.is_ipv4() {
        OVERHEAD_V4
    } else {
        OVERHEAD_V6
    }
}

/// The underlay family the device's endpoints use: IPv4 when this node has an IPv4
/// InternalIP (the endpoint of a dual-stack peer is then its IPv4 one), else IPv6.
pub fn underlay_v4(own_internal_ips: &[IpAddr]) -> bool {
    own_internal_ips.iter().any(IpAddr::is_ipv4) || own_internal_ips.is_empty()
}
