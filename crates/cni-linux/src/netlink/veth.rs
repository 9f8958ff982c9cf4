//! veth pairs, created in one RTM_NEWLINK request so that a failure never
//! leaves half a pair behind: the host end already on its bridge, the peer
//! already in the container netns under its final name.

use std::os::fd::AsRawFd;

use rtnetlink::packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute};
use rtnetlink::{LinkMessageBuilder, LinkUnspec, LinkVeth};

use super::{Netlink, exec};
use crate::error::Result;
use crate::mac::MacAddr;
use crate::netns::NetNs;

/// What to create: the local end (in the handle's netns) and its peer.
#[derive(Debug, Clone, Copy)]
pub struct VethPair<'a> {
    /// Name of the end created in this handle's netns.
    pub name: &'a str,
    /// MTU of that end.
    pub mtu: Option<u32>,
    /// Bridge index to attach that end to.
    pub controller: Option<u32>,
    /// Name of the peer end.
    pub peer_name: &'a str,
    /// Netns to create the peer in; `None` keeps it in this netns.
    pub peer_netns: Option<&'a NetNs>,
    /// MAC address of the peer.
    pub peer_mac: Option<MacAddr>,
    /// MTU of the peer.
    pub peer_mtu: Option<u32>,
}

impl Netlink {
    /// Creates a veth pair as described; a taken name on either side fails with `is_exists()`.
    pub async fn create_veth(&self, pair: &VethPair<'_>) -> Result<()> {
        // Queue length 0 on both ends, as the reference plugins create them (veths are
        // queueless; a qdisc attached later takes its default limit from this).
        let mut peer = LinkUnspec::new_with_name(pair.peer_name)
            .append_extra_attribute(LinkAttribute::TxQueueLen(0));
        if let Some(netns) = pair.peer_netns {
            // The kernel resolves this fd during the request; `pair` borrows
            // the NetNs, so the file stays open until the await completes.
            peer = peer.setns_by_fd(netns.as_raw_fd());
        }
        if let Some(mac) = pair.peer_mac {
            peer = peer.address(mac.octets().to_vec());
        }
        if let Some(mtu) = pair.peer_mtu {
            peer = peer.mtu(mtu);
        }
        let mut builder = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
            .name(pair.name)
            .append_extra_attribute(LinkAttribute::TxQueueLen(0))
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer.build())));
        if let Some(mtu) = pair.mtu {
            builder = builder.mtu(mtu);
        }
        if let Some(controller) = pair.controller {
            builder = builder.controller(controller);
        }
        exec(self.handle.link().add(builder.build()).execute(), || {
            format!(
                "failed to create veth pair {:?} (peer {:?})",
                pair.name, pair.peer_name
            )
        })
        .await
    }

    /// Creates a veth pair with both ends in this netns and the same MTU.
    pub async fn create_veth_pair_local(
        &self,
        name: &str,
        peer_name: &str,
        mtu: Option<u32>,
    ) -> Result<()> {
        self.create_veth(&VethPair {
            name,
            mtu,
            controller: None,
            peer_name,
            peer_netns: None,
            peer_mac: None,
            peer_mtu: mtu,
        })
        .await
    }
}
