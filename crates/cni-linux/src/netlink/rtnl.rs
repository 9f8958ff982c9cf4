//! rtnetlink's numbers (linux/rtnetlink.h, if_link.h, if_addr.h, if_bridge.h,
//! neighbour.h) and its four family headers: `ifinfomsg` (links), `ifaddrmsg`
//! (addresses), `rtmsg` (routes) and `ndmsg` (neighbours and FDB entries). Only
//! what the plugins and the node agent send or read.

use cni_netlink::{Malformed, Writer};

pub(super) const RTM_NEWLINK: u16 = 16;
pub(super) const RTM_DELLINK: u16 = 17;
pub(super) const RTM_GETLINK: u16 = 18;
pub(super) const RTM_SETLINK: u16 = 19;
pub(super) const RTM_NEWADDR: u16 = 20;
pub(super) const RTM_DELADDR: u16 = 21;
pub(super) const RTM_GETADDR: u16 = 22;
pub(super) const RTM_NEWROUTE: u16 = 24;
pub(super) const RTM_DELROUTE: u16 = 25;
pub(super) const RTM_GETROUTE: u16 = 26;
pub(super) const RTM_NEWNEIGH: u16 = 28;
pub(super) const RTM_DELNEIGH: u16 = 29;
pub(super) const RTM_GETNEIGH: u16 = 30;

pub(super) const AF_UNSPEC: u8 = 0;
pub(super) const AF_INET: u8 = 2;
pub(super) const AF_BRIDGE: u8 = 7;
pub(super) const AF_INET6: u8 = 10;

// Link attributes (IFLA_*).
pub(super) const IFLA_ADDRESS: u16 = 1;
pub(super) const IFLA_IFNAME: u16 = 3;
pub(super) const IFLA_MTU: u16 = 4;
pub(super) const IFLA_LINK: u16 = 5;
pub(super) const IFLA_MASTER: u16 = 10;
pub(super) const IFLA_TXQLEN: u16 = 13;
pub(super) const IFLA_OPERSTATE: u16 = 16;
pub(super) const IFLA_LINKINFO: u16 = 18;
pub(super) const IFLA_AF_SPEC: u16 = 26;
pub(super) const IFLA_NET_NS_FD: u16 = 28;
pub(super) const IFLA_EXT_MASK: u16 = 29;
pub(super) const IFLA_LINK_NETNSID: u16 = 37;

pub(super) const IFLA_INFO_KIND: u16 = 1;
pub(super) const IFLA_INFO_DATA: u16 = 2;
pub(super) const IFLA_INFO_SLAVE_KIND: u16 = 4;
pub(super) const IFLA_INFO_SLAVE_DATA: u16 = 5;

pub(super) const IFLA_BR_VLAN_FILTERING: u16 = 7;
pub(super) const IFLA_BRPORT_MODE: u16 = 4;
pub(super) const IFLA_BRPORT_ISOLATED: u16 = 33;
pub(super) const VETH_INFO_PEER: u16 = 1;

pub(super) const IFLA_BRIDGE_VLAN_INFO: u16 = 2;
pub(super) const BRIDGE_VLAN_INFO_PVID: u16 = 0x2;
pub(super) const BRIDGE_VLAN_INFO_UNTAGGED: u16 = 0x4;

/// `IFLA_EXT_MASK` bits: per-port VLAN lists in AF_BRIDGE dumps; no statistics
/// (most of a link message, and nothing the plugins read).
pub(super) const RTEXT_FILTER_BRVLAN: u32 = 1 << 1;
pub(super) const RTEXT_FILTER_SKIP_STATS: u32 = 1 << 3;

pub(super) const IFF_UP: u32 = 0x1;
pub(super) const IFF_PROMISC: u32 = 0x100;

// Address attributes (IFA_*).
pub(super) const IFA_ADDRESS: u16 = 1;
pub(super) const IFA_LOCAL: u16 = 2;
pub(super) const IFA_BROADCAST: u16 = 4;
pub(super) const IFA_FLAGS: u16 = 8;
pub(super) const IFA_F_NODAD: u32 = 0x02;
pub(super) const IFA_F_DADFAILED: u32 = 0x08;
pub(super) const IFA_F_TENTATIVE: u32 = 0x40;

// Route attributes (RTA_*) and metrics (RTAX_*).
pub(super) const RTA_DST: u16 = 1;
pub(super) const RTA_OIF: u16 = 4;
pub(super) const RTA_GATEWAY: u16 = 5;
pub(super) const RTA_PRIORITY: u16 = 6;
pub(super) const RTA_METRICS: u16 = 8;
pub(super) const RTA_TABLE: u16 = 15;
pub(super) const RTAX_MTU: u16 = 2;
pub(super) const RTAX_ADVMSS: u16 = 8;
pub(super) const RT_TABLE_MAIN: u8 = 254;
pub(super) const RTN_UNICAST: u8 = 1;
pub(super) const RT_SCOPE_NOWHERE: u8 = 255;
/// `rtm_flags`: the gateway is on the output link, whatever its addresses say.
pub(super) const RTNH_F_ONLINK: u32 = 0x4;

// VXLAN link data (IFLA_VXLAN_*, inside IFLA_INFO_DATA of kind "vxlan").
pub(super) const IFLA_VXLAN_ID: u16 = 1;
pub(super) const IFLA_VXLAN_LINK: u16 = 3;
pub(super) const IFLA_VXLAN_LOCAL: u16 = 4;
pub(super) const IFLA_VXLAN_LEARNING: u16 = 7;
pub(super) const IFLA_VXLAN_PORT: u16 = 15;
pub(super) const IFLA_VXLAN_LOCAL6: u16 = 17;
pub(super) const IFLA_VXLAN_UDP_CSUM: u16 = 18;
pub(super) const IFLA_VXLAN_UDP_ZERO_CSUM6_TX: u16 = 19;
pub(super) const IFLA_VXLAN_UDP_ZERO_CSUM6_RX: u16 = 20;

// Neighbour attributes (NDA_*), states (NUD_*) and flags (NTF_*).
pub(super) const NDA_DST: u16 = 1;
pub(super) const NDA_LLADDR: u16 = 2;
pub(super) const NDA_PORT: u16 = 6;
pub(super) const NDA_VNI: u16 = 7;
pub(super) const NDA_IFINDEX: u16 = 8;
pub(super) const NDA_MASTER: u16 = 9;
pub(super) const NUD_NOARP: u16 = 0x40;
pub(super) const NUD_PERMANENT: u16 = 0x80;
pub(super) const NTF_SELF: u8 = 0x02;

/// `struct ifinfomsg`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct IfInfo {
    pub(super) family: u8,
    pub(super) index: u32,
    pub(super) flags: u32,
    pub(super) change: u32,
}

impl IfInfo {
    pub(super) const LEN: usize = 16;

    pub(super) fn index(index: u32) -> Self {
        Self {
            index,
            ..Self::default()
        }
    }

    pub(super) fn write(&self, w: &mut Writer) {
        w.bytes(&[self.family, 0]);
        w.bytes(&0u16.to_ne_bytes()); // ifi_type: the kernel's to say
        w.bytes(&self.index.to_ne_bytes());
        w.bytes(&self.flags.to_ne_bytes());
        w.bytes(&self.change.to_ne_bytes());
    }

    /// The header and the attributes after it.
    pub(super) fn parse(payload: &[u8]) -> Result<(Self, &[u8]), Malformed> {
        let h = payload
            .get(..Self::LEN)
            .ok_or(Malformed("truncated ifinfomsg"))?;
        let info = Self {
            family: h[0],
            index: u32_at(h, 4),
            flags: u32_at(h, 8),
            change: u32_at(h, 12),
        };
        Ok((info, &payload[Self::LEN..]))
    }
}

/// `struct ifaddrmsg`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct IfAddr {
    pub(super) family: u8,
    pub(super) prefix_len: u8,
    pub(super) flags: u8,
    pub(super) scope: u8,
    pub(super) index: u32,
}

impl IfAddr {
    pub(super) const LEN: usize = 8;

    pub(super) fn write(&self, w: &mut Writer) {
        w.bytes(&[self.family, self.prefix_len, self.flags, self.scope]);
        w.bytes(&self.index.to_ne_bytes());
    }

    pub(super) fn parse(payload: &[u8]) -> Result<(Self, &[u8]), Malformed> {
        let h = payload
            .get(..Self::LEN)
            .ok_or(Malformed("truncated ifaddrmsg"))?;
        let header = Self {
            family: h[0],
            prefix_len: h[1],
            flags: h[2],
            scope: h[3],
            index: u32_at(h, 4),
        };
        Ok((header, &payload[Self::LEN..]))
    }
}

/// `struct rtmsg`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct RtMsg {
    pub(super) family: u8,
    pub(super) dst_len: u8,
    pub(super) table: u8,
    pub(super) protocol: u8,
    pub(super) scope: u8,
    pub(super) kind: u8,
    /// RTM_F_* and RTNH_F_* bits.
    pub(super) flags: u32,
}

impl RtMsg {
    pub(super) const LEN: usize = 12;

    pub(super) fn write(&self, w: &mut Writer) {
        // src_len and tos are 0.
        w.bytes(&[self.family, self.dst_len, 0, 0]);
        w.bytes(&[self.table, self.protocol, self.scope, self.kind]);
        w.bytes(&self.flags.to_ne_bytes());
    }

    pub(super) fn parse(payload: &[u8]) -> Result<(Self, &[u8]), Malformed> {
        let h = payload
            .get(..Self::LEN)
            .ok_or(Malformed("truncated rtmsg"))?;
        let header = Self {
            family: h[0],
            dst_len: h[1],
            table: h[4],
            protocol: h[5],
            scope: h[6],
            kind: h[7],
            flags: u32_at(h, 8),
        };
        Ok((header, &payload[Self::LEN..]))
    }
}

/// `struct ndmsg`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct NdMsg {
    pub(super) family: u8,
    pub(super) index: u32,
    /// NUD_* bits.
    pub(super) state: u16,
    /// NTF_* bits.
    pub(super) flags: u8,
    /// RTN_* type (0 in requests: the kernel's to say).
    pub(super) kind: u8,
}

impl NdMsg {
    pub(super) const LEN: usize = 12;

    pub(super) fn write(&self, w: &mut Writer) {
        w.bytes(&[self.family, 0, 0, 0]);
        w.bytes(&self.index.to_ne_bytes());
        w.bytes(&self.state.to_ne_bytes());
        w.bytes(&[self.flags, self.kind]);
    }

    pub(super) fn parse(payload: &[u8]) -> Result<(Self, &[u8]), Malformed> {
        let h = payload
            .get(..Self::LEN)
            .ok_or(Malformed("truncated ndmsg"))?;
        let header = Self {
            family: h[0],
            index: u32_at(h, 4),
            state: u16::from_ne_bytes([h[8], h[9]]),
            flags: h[10],
            kind: h[11],
        };
        Ok((header, &payload[Self::LEN..]))
    }
}

/// The callers checked that 4 bytes are there.
fn u32_at(h: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}

/// An address attribute of `family`: 4 or 16 bytes.
pub(super) fn ip_value(family: u8, v: &[u8]) -> Result<std::net::IpAddr, Malformed> {
    match family {
        AF_INET => <[u8; 4]>::try_from(v)
            .map(|b| std::net::Ipv4Addr::from(b).into())
            .map_err(|_| Malformed("IPv4 address attribute of another length")),
        AF_INET6 => <[u8; 16]>::try_from(v)
            .map(|b| std::net::Ipv6Addr::from(b).into())
            .map_err(|_| Malformed("IPv6 address attribute of another length")),
        _ => Err(Malformed("address of an unknown family")),
    }
}

/// An address attribute whose length says its family (an FDB entry's
/// destination, a VXLAN device's local address): 4 or 16 bytes.
pub(super) fn ip_of_len(v: &[u8]) -> Result<std::net::IpAddr, Malformed> {
    match v.len() {
        4 => ip_value(AF_INET, v),
        16 => ip_value(AF_INET6, v),
        _ => Err(Malformed("address attribute neither 4 nor 16 bytes long")),
    }
}

/// The bytes of an address attribute and its family.
pub(super) fn ip_bytes(ip: std::net::IpAddr) -> (u8, Vec<u8>) {
    match ip {
        std::net::IpAddr::V4(v4) => (AF_INET, v4.octets().to_vec()),
        std::net::IpAddr::V6(v6) => (AF_INET6, v6.octets().to_vec()),
    }
}
