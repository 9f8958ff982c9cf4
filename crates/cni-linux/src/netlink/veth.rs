//! veth pairs, created in one RTM_NEWLINK request so that a failure never
//! leaves half a pair behind: the host end already on its bridge, the peer
//! already in the container netns under its final name.

use std::os::fd::AsRawFd;

use cni_netlink::Writer;
use cni_netlink::wire::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST};

use super::Netlink;
use super::rtnl::{
    IFLA_ADDRESS, IFLA_IFNAME, IFLA_INFO_DATA, IFLA_INFO_KIND, IFLA_LINKINFO, IFLA_MASTER,
    IFLA_MTU, IFLA_NET_NS_FD, IFLA_TXQLEN, IfInfo, RTM_NEWLINK, VETH_INFO_PEER,
};
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
    pub fn create_veth(&self, pair: &VethPair<'_>) -> Result<()> {
        // The kernel resolves the netns fd during the request; `pair` borrows
        // the NetNs, so the file stays open until the answer is in.
        let peer_netns = pair.peer_netns.map(|ns| ns.as_raw_fd());
        self.exec(
            RTM_NEWLINK,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE,
            |w| veth_message(w, pair, peer_netns),
            || {
                format!(
                    "failed to create veth pair {:?} (peer {:?})",
                    pair.name, pair.peer_name
                )
            },
        )
    }

    /// Creates a veth pair with both ends in this netns and the same MTU.
    pub fn create_veth_pair_local(
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
    }
}

/// Queue length 0 on both ends, as the reference plugins create them (veths are
/// queueless; a qdisc attached later takes its default limit from this).
fn veth_message(w: &mut Writer, pair: &VethPair<'_>, peer_netns: Option<i32>) {
    IfInfo::default().write(w);
    w.attr_str(IFLA_IFNAME, pair.name);
    w.attr_u32(IFLA_TXQLEN, 0);
    if let Some(mtu) = pair.mtu {
        w.attr_u32(IFLA_MTU, mtu);
    }
    if let Some(controller) = pair.controller {
        w.attr_u32(IFLA_MASTER, controller);
    }
    let info = w.nest_start(IFLA_LINKINFO);
    w.attr(IFLA_INFO_KIND, b"veth");
    let data = w.nest_start(IFLA_INFO_DATA);
    // The peer: an ifinfomsg and its own attributes.
    let peer = w.nest_start(VETH_INFO_PEER);
    IfInfo::default().write(w);
    w.attr_str(IFLA_IFNAME, pair.peer_name);
    w.attr_u32(IFLA_TXQLEN, 0);
    if let Some(fd) = peer_netns {
        w.attr_i32(IFLA_NET_NS_FD, fd);
    }
    if let Some(mac) = pair.peer_mac {
        w.attr(IFLA_ADDRESS, &mac.octets());
    }
    if let Some(mtu) = pair.peer_mtu {
        w.attr_u32(IFLA_MTU, mtu);
    }
    w.nest_end(peer);
    w.nest_end(data);
    w.nest_end(info);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::{hex, message};

    #[test]
    fn veth_with_peer_elsewhere_carries_what_ip_link_add_sends() {
        // `ip link add vethA mtu 1400 txqueuelen 0 master cni0 type veth peer name eth0
        // txqueuelen 0 mtu 1400 address 02:00:00:00:00:42 netns <fd 4>`, strace'd, has
        // the same attributes (in another order).
        let pair = VethPair {
            name: "vethA",
            mtu: Some(1400),
            controller: Some(5),
            peer_name: "eth0",
            peer_netns: None,
            peer_mac: Some(MacAddr::from_slice(&[2, 0, 0, 0, 0, 0x42]).unwrap()),
            peer_mtu: Some(1400),
        };
        let got = message(RTM_NEWLINK, 0x605, |w| veth_message(w, &pair, Some(4)));
        let want = hex("98000000 1000 0506 01000000 00000000 \
             00000000 00000000 00000000 00000000 \
             0a000300 76657468 41000000 \
             08000d00 00000000 \
             08000400 78050000 \
             08000a00 05000000 \
             54001200 08000100 76657468 \
             48000200 44000100 \
             00000000 00000000 00000000 00000000 \
             09000300 65746830 00000000 \
             08000d00 00000000 \
             08001c00 04000000 \
             0a000100 02000000 00420000 \
             08000400 78050000");
        assert_eq!(got, want);
    }

    #[test]
    fn local_veth_has_no_netns_mac_or_controller() {
        let pair = VethPair {
            name: "a",
            mtu: None,
            controller: None,
            peer_name: "b",
            peer_netns: None,
            peer_mac: None,
            peer_mtu: None,
        };
        let got = message(RTM_NEWLINK, 0x605, |w| veth_message(w, &pair, None));
        let want = hex("64000000 1000 0506 01000000 00000000 \
             00000000 00000000 00000000 00000000 \
             06000300 61000000 \
             08000d00 00000000 \
             34001200 08000100 76657468 \
             28000200 24000100 \
             00000000 00000000 00000000 00000000 \
             06000300 62000000 \
             08000d00 00000000");
        assert_eq!(got, want);
    }
}
