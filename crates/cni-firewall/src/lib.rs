//! Firewall side of the CNI plugins: IP masquerade rules on iptables or
//! nftables and the bridge plugin's MAC spoof check, named exactly like the
//! reference plugins' rules so operators and the reference plugins recognise
//! them.
//!
//! The nftables masquerade rules are changed over netlink (one nf_tables
//! transaction per change, no process started); iptables rules and the MAC
//! spoof check go through the command-line tools (`iptables-restore`, `nft`)
//! with rules on stdin, one transaction per call. Sockets and tools act in
//! the calling thread's network namespace.

pub mod error;
mod exec;
pub mod macspoof;
pub mod masq;
pub mod naming;
mod nfnetlink;
mod nft;

pub use error::{Error, Result};
pub use masq::Backend;
