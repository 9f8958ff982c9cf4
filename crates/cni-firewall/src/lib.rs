//! Firewall side of the CNI plugins: IP masquerade rules on iptables or
//! nftables, the bridge plugin's MAC spoof check, the portmap plugin's host ports and
//! the node agent's egress SNAT, the bridge's port security, named exactly like the
//! reference plugins' rules so operators and the reference plugins recognise
//! them, and the node agent's NetworkPolicy datapath.
//!
//! nftables rules (masquerade and the MAC spoof check) are changed over
//! netlink, one nf_tables transaction per change, without starting `nft`;
//! iptables rules go through `iptables-save`/`iptables-restore` with rules on
//! stdin, one transaction per call. Sockets and tools act in the calling
//! thread's network namespace.
//!
//! One module per feature (`masq`, `macspoof`, `port_security`, `hostport`, `egress`),
//! over what they share: the nf_tables client (`nfnetlink`), the expressions and chains
//! several features build alike (`nft_build`), the iptables-save/restore reader-writer
//! (`iptables`) and the choice between the two tools ([`Backend`]).
//!
//! Beside them, `nflog` reads what nftables' `log ... group` rules send (the node
//! agent's deny log).

mod backend;
pub mod conntrack;
pub mod egress;
pub mod error;
mod exec;
pub mod hostport;
mod iptables;
pub mod macspoof;
pub mod masq;
pub mod naming;
pub mod network_policy;
pub mod nflog;
mod nfnetlink;
mod nft_build;
pub mod port_security;

pub use backend::Backend;
pub use error::{Error, Result};
pub use nfnetlink::{SocketsKept, keep_sockets};
#[doc(hidden)]
pub use nfnetlink::{decode_dumped_rule, decode_dumped_set_elements};
