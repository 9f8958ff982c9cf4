//! VXLAN devices for the node agent's overlay: one device per IP family, MAC
//! learning off, every remote programmed by hand (an FDB entry for its VTEP MAC,
//! a neighbour entry for its VTEP address, see `neigh`), as flannel does.
//!
//! What is sent when a device is created, and why:
//!
//! - `IFLA_VXLAN_LEARNING` 0 (`nolearning`): the kernel learns nothing from
//!   received frames; the FDB holds only the agent's static entries.
//! - IPv4 underlay (or no local address): `IFLA_VXLAN_UDP_CSUM` 1 (`udpcsum`),
//!   sent explicitly because the kernel's default changed over the years
//!   (zero checksums were the default once). A zero outer checksum is what broke
//!   masqueraded VXLAN traffic on kernels before 5.7 (the NAT rewrote it into a
//!   wrong one), what some middleboxes and NICs drop, and what kept receivers
//!   from aggregating (GRO) before 2021 kernels; with offload the sum costs next
//!   to nothing. The kernel refuses to change it on an existing device.
//! - IPv6 underlay: `IFLA_VXLAN_UDP_ZERO_CSUM6_TX` 0 and `_RX` 0
//!   (`noudp6zerocsumtx noudp6zerocsumrx`): checksums sent, and packets without
//!   one refused, as IPv6 requires of UDP; also sent explicitly.
//! - Nothing else: the TTL, TOS, ageing and source port range stay the kernel's.
//!
//! A device without a local address is an IPv4 device (the kernel opens an IPv6
//! socket only for an IPv6 local or remote address): the IPv6 overlay device
//! needs its local IPv6 address.
//!
//! The kernel refuses in place changes of the VNI, port and checksum settings:
//! a device whose settings differ ([`Vxlan::matches`]) is deleted and created
//! again. The MTU and MAC change in place ([`Netlink::set_mtu`],
//! [`Netlink::set_mac`]), as do up and down. Two devices of one family cannot
//! share a VNI on one port ("A VXLAN device with the specified VNI already
//! exists", `EEXIST`); the IPv4 and IPv6 devices can.
//!
//! What the kernel does to a device behind the agent's back: deleting its
//! underlay deletes it; setting it down flushes its neighbour entries (even
//! permanent ones) and the routes through it, while its FDB keeps the
//! permanent entries; an underlay that goes down leaves it up.

use std::net::IpAddr;

use cni_netlink::wire::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, attrs, u8_value, u16_ne, u32_ne,
};
use cni_netlink::{Malformed, Writer};

use super::Netlink;
use super::link::Link;
use super::rtnl::{
    IFLA_ADDRESS, IFLA_IFNAME, IFLA_INFO_DATA, IFLA_INFO_KIND, IFLA_LINKINFO, IFLA_MTU,
    IFLA_VXLAN_ID, IFLA_VXLAN_LEARNING, IFLA_VXLAN_LINK, IFLA_VXLAN_LOCAL, IFLA_VXLAN_LOCAL6,
    IFLA_VXLAN_PORT, IFLA_VXLAN_UDP_CSUM, IFLA_VXLAN_UDP_ZERO_CSUM6_RX,
    IFLA_VXLAN_UDP_ZERO_CSUM6_TX, IfInfo, RTM_NEWLINK, ip_of_len,
};
use crate::error::Result;
use crate::mac::MacAddr;

/// The IANA port for VXLAN (RFC 7348), which NICs recognise for checksum and
/// receive-side scaling offloads. Flannel and Cilium use 8472, the Linux
/// default from before the assignment; Calico uses 4789 with VNI 4096.
pub const IANA_PORT: u16 = 4789;

/// What encapsulation adds to an inner IPv4 or IPv6 packet over an IPv4
/// underlay: outer IPv4 (20), UDP (8), VXLAN (8) and inner Ethernet (14)
/// headers. The device's MTU is the uplink's minus this.
pub const OVERHEAD_V4: u32 = 50;

/// The same over an IPv6 underlay, whose header is 40 bytes.
pub const OVERHEAD_V6: u32 = 70;

/// The encapsulation overhead of a device whose underlay address is `local`
/// ([`OVERHEAD_V4`] without one).
pub fn overhead(local: Option<IpAddr>) -> u32 {
    match local {
        Some(IpAddr::V6(_)) => OVERHEAD_V6,
        _ => OVERHEAD_V4,
    }
}

/// A VXLAN device to create: learning off, UDP checksums on (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vxlan<'a> {
    /// Device name.
    pub name: &'a str,
    /// VXLAN network identifier (24 bits).
    pub vni: u32,
    /// Underlay source address; its family is the device's. `None`: IPv4, the
    /// source chosen by the routing table for each remote.
    pub local: Option<IpAddr>,
    /// UDP destination port (and the port the device listens on).
    pub port: u16,
    /// Underlay device index (`dev` in `ip link add ... type vxlan`): caps the
    /// MTU at the underlay's minus the overhead, and deleting the underlay
    /// deletes this device too.
    pub underlay: Option<u32>,
    /// MTU; the kernel's choice when `None`: the underlay's minus the overhead,
    /// but 1500 without an underlay, too big for a 1500-byte uplink. Set it.
    pub mtu: Option<u32>,
    /// Hardware address (see [`vtep_mac`]); random when `None`.
    pub mac: Option<MacAddr>,
}

impl Vxlan<'_> {
    /// Whether `link` is this device as it would be created: same name, kind
    /// `vxlan`, and the settings the kernel does not change in place (VNI, port,
    /// local address, underlay when one is asked for, learning off, the
    /// checksums). MTU, MAC and up/down are not compared: they change in place.
    pub fn matches(&self, link: &Link) -> bool {
        let Some(info) = &link.vxlan else {
            return false;
        };
        let checksums = match self.local {
            Some(IpAddr::V6(_)) => !info.udp6_zero_csum_tx && !info.udp6_zero_csum_rx,
            _ => info.udp_csum,
        };
        link.name == self.name
            && link.kind.as_deref() == Some("vxlan")
            && info.vni == self.vni
            && info.port == self.port
            && info.local == self.local
            && self.underlay.is_none_or(|u| info.underlay == Some(u))
            && !info.learning
            && checksums
    }
}

/// A VXLAN device's settings as the kernel reports them ([`Link::vxlan`]). An
/// attribute the kernel leaves out reads as its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VxlanInfo {
    /// VXLAN network identifier.
    pub vni: u32,
    /// UDP destination port.
    pub port: u16,
    /// Underlay source address.
    pub local: Option<IpAddr>,
    /// Underlay device index.
    pub underlay: Option<u32>,
    /// Whether the device learns remote MACs from received frames.
    pub learning: bool,
    /// IPv4: outer UDP checksums are computed.
    pub udp_csum: bool,
    /// IPv6: outer UDP checksums are left zero.
    pub udp6_zero_csum_tx: bool,
    /// IPv6: packets with a zero outer UDP checksum are accepted.
    pub udp6_zero_csum_rx: bool,
}

impl VxlanInfo {
    /// Decodes `IFLA_INFO_DATA` of a link of kind `vxlan`.
    pub(super) fn parse(data: &[u8]) -> std::result::Result<Self, Malformed> {
        let mut info = Self {
            vni: 0,
            port: 0,
            local: None,
            underlay: None,
            learning: true,
            udp_csum: true,
            udp6_zero_csum_tx: false,
            udp6_zero_csum_rx: false,
        };
        for attr in attrs(data) {
            let (ty, v) = attr?;
            match ty {
                IFLA_VXLAN_ID => info.vni = u32_ne(v)?,
                // Network byte order.
                IFLA_VXLAN_PORT => info.port = u16::from_be(u16_ne(v)?),
                IFLA_VXLAN_LOCAL | IFLA_VXLAN_LOCAL6 => {
                    let ip = ip_of_len(v)?;
                    // The kernel reports an unset address as all zeros.
                    info.local = Some(ip).filter(|ip| !ip.is_unspecified());
                }
                IFLA_VXLAN_LINK => info.underlay = Some(u32_ne(v)?).filter(|i| *i != 0),
                IFLA_VXLAN_LEARNING => info.learning = u8_value(v)? != 0,
                IFLA_VXLAN_UDP_CSUM => info.udp_csum = u8_value(v)? != 0,
                IFLA_VXLAN_UDP_ZERO_CSUM6_TX => info.udp6_zero_csum_tx = u8_value(v)? != 0,
                IFLA_VXLAN_UDP_ZERO_CSUM6_RX => info.udp6_zero_csum_rx = u8_value(v)? != 0,
                _ => {}
            }
        }
        Ok(info)
    }
}

impl Netlink {
    /// Creates a VXLAN device, down, failing with `is_exists()` if the name is
    /// taken or (the kernel's "A VXLAN device with the specified VNI already
    /// exists") another device of the same family has the VNI and port.
    pub fn create_vxlan(&self, vxlan: &Vxlan<'_>) -> Result<()> {
        self.exec(
            RTM_NEWLINK,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE,
            |w| vxlan_message(w, vxlan),
            || {
                format!(
                    "failed to create VXLAN device {:?} (VNI {}, port {})",
                    vxlan.name, vxlan.vni, vxlan.port
                )
            },
        )
    }
}

/// What `ip link add <name> address <mac> mtu <mtu> type vxlan id <vni> local
/// <ip> dev <underlay> dstport <port> nolearning udpcsum` sends (with
/// `noudp6zerocsumtx noudp6zerocsumrx` for an IPv6 local address instead of
/// `udpcsum`), attributes in the same order.
fn vxlan_message(w: &mut Writer, vxlan: &Vxlan<'_>) {
    IfInfo::default().write(w);
    if let Some(mac) = vxlan.mac {
        w.attr(IFLA_ADDRESS, &mac.octets());
    }
    if let Some(mtu) = vxlan.mtu {
        w.attr_u32(IFLA_MTU, mtu);
    }
    w.attr_str(IFLA_IFNAME, vxlan.name);
    let info = w.nest_start(IFLA_LINKINFO);
    w.attr(IFLA_INFO_KIND, b"vxlan");
    let data = w.nest_start(IFLA_INFO_DATA);
    if let Some(underlay) = vxlan.underlay {
        w.attr_u32(IFLA_VXLAN_LINK, underlay);
    }
    match vxlan.local {
        Some(IpAddr::V6(_)) => {
            w.attr_u8(IFLA_VXLAN_UDP_ZERO_CSUM6_TX, 0);
            w.attr_u8(IFLA_VXLAN_UDP_ZERO_CSUM6_RX, 0);
        }
        _ => w.attr_u8(IFLA_VXLAN_UDP_CSUM, 1),
    }
    w.attr_u32(IFLA_VXLAN_ID, vxlan.vni);
    match vxlan.local {
        Some(IpAddr::V4(ip)) => w.attr(IFLA_VXLAN_LOCAL, &ip.octets()),
        Some(IpAddr::V6(ip)) => w.attr(IFLA_VXLAN_LOCAL6, &ip.octets()),
        None => {}
    }
    w.attr_u8(IFLA_VXLAN_LEARNING, 0);
    w.attr(IFLA_VXLAN_PORT, &vxlan.port.to_be_bytes());
    w.nest_end(data);
    w.nest_end(info);
}

/// The VTEP MAC address of the node whose VXLAN device has the underlay
/// address `ip`, which every node computes alike from the node's address: no
/// annotation has to carry it, and an address change changes it.
///
/// Locally administered unicast (first byte `0a`: bit 1 set, bit 0 clear):
///
/// - IPv4: `0a:58` then the four bytes of the address (`10.0.0.5` is
///   `0a:58:0a:00:00:05`), the convention of other CNIs for addresses. One
///   address, one MAC: no two nodes share one.
/// - IPv6: `0a` then the first five bytes of the 64-bit FNV-1a hash of the
///   sixteen bytes of the address. Forty bits: nodes across subnets often share
///   their low bytes (`2001:db8:1::10`, `2001:db8:2::10`), so the address
///   itself cannot be cut short; two of 5,000 nodes share a MAC with a
///   probability of about 1 in 100,000 (n² / 2⁴¹). The agent knows every
///   node's address and can check its peers for a clash.
///
/// The two families' devices are separate FDBs, so the IPv4 and IPv6 MACs never
/// meet.
pub fn vtep_mac(ip: IpAddr) -> MacAddr {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            MacAddr([0x0a, 0x58, a, b, c, d])
        }
        IpAddr::V6(v6) => {
            let [h0, h1, h2, h3, h4, ..] = fnv1a_64(&v6.octets()).to_be_bytes();
            MacAddr([0x0a, h0, h1, h2, h3, h4])
        }
    }
}

/// 64-bit FNV-1a: fixed by its definition, so every node, release and
/// architecture computes the same value.
fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::netlink::tests::{hex, message};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_ipv4_device_is_what_ip_link_add_type_vxlan_sends() {
        // `ip link add vx4 address 0a:58:c0:a8:00:01 mtu 1450 type vxlan id 4242
        // local 192.168.0.1 dev up0 dstport 4790 nolearning udpcsum` (up0 is #3),
        // strace'd.
        let vxlan = Vxlan {
            name: "vx4",
            vni: 4242,
            local: Some(ip("192.168.0.1")),
            port: 4790,
            underlay: Some(3),
            mtu: Some(1450),
            mac: Some(vtep_mac(ip("192.168.0.1"))),
        };
        let got = message(RTM_NEWLINK, 0x605, |w| vxlan_message(w, &vxlan));
        let want = hex("80000000 1000 0506 01000000 00000000 \
             00000000 00000000 00000000 00000000 \
             0a000100 0a58c0a8 00010000 \
             08000400 aa050000 \
             08000300 76783400 \
             44001200 09000100 76786c61 6e000000 \
             34000200 08000300 03000000 \
             05001200 01000000 \
             08000100 92100000 \
             08000400 c0a80001 \
             05000700 00000000 \
             06000f00 12b60000");
        assert_eq!(got, want);
    }

    #[test]
    fn an_ipv6_device_asks_for_checksums_both_ways() {
        // `ip link add vx6 type vxlan id 4243 local fd00:1::1 dstport 4790
        // nolearning noudp6zerocsumtx noudp6zerocsumrx`, strace'd.
        let vxlan = Vxlan {
            name: "vx6",
            vni: 4243,
            local: Some(ip("fd00:1::1")),
            port: 4790,
            underlay: None,
            mtu: None,
            mac: None,
        };
        let got = message(RTM_NEWLINK, 0x605, |w| vxlan_message(w, &vxlan));
        let want = hex("78000000 1000 0506 01000000 00000000 \
             00000000 00000000 00000000 00000000 \
             08000300 76783600 \
             50001200 09000100 76786c61 6e000000 \
             40000200 05001300 00000000 \
             05001400 00000000 \
             08000100 93100000 \
             14001100 fd000001 00000000 00000000 00000001 \
             05000700 00000000 \
             06000f00 12b60000");
        assert_eq!(got, want);
    }

    #[test]
    fn a_device_without_local_address_is_ipv4_with_checksums() {
        let vxlan = Vxlan {
            name: "vxn",
            vni: 7,
            local: None,
            port: IANA_PORT,
            underlay: None,
            mtu: None,
            mac: None,
        };
        let got = message(RTM_NEWLINK, 0x605, |w| vxlan_message(w, &vxlan));
        let data = hex("24000200 05001200 01000000 \
             08000100 07000000 \
             05000700 00000000 \
             06000f00 12b50000");
        assert!(got.ends_with(&data), "{got:02x?}");
        assert_eq!(overhead(None), 50);
        assert_eq!(overhead(Some(ip("fd00::1"))), 70);
    }

    /// `IFLA_INFO_DATA` of `vx4` above as the kernel (6.18) reported it.
    const VX4_DATA: &str = "08000100 92100000 08000300 03000000 08000400 c0a80001 \
        05000500 00000000 05001c00 00000000 05000600 00000000 05001d00 00000000 \
        08001a00 00000000 08002000 00000000 05000700 00000000 05000b00 00000000 \
        05000c00 00000000 05000d00 00000000 05000e00 00000000 05001900 00000000 \
        08000800 2c010000 08000900 00000000 06000f00 12b60000 05001200 01000000 \
        05001300 00000000 05001400 00000000 05001500 00000000 05001600 00000000 \
        05001f00 01000000 08000a00 00000000 0c002100 f7ffffff 000000ff";

    #[test]
    fn the_kernels_vxlan_data_decodes() {
        let info = VxlanInfo::parse(&hex(VX4_DATA)).unwrap();
        assert_eq!(
            info,
            VxlanInfo {
                vni: 4242,
                port: 4790,
                local: Some(ip("192.168.0.1")),
                underlay: Some(3),
                learning: false,
                udp_csum: true,
                udp6_zero_csum_tx: false,
                udp6_zero_csum_rx: false,
            }
        );
        let data = hex(VX4_DATA);
        for cut in 0..data.len() {
            let _ = VxlanInfo::parse(&data[..cut]);
        }
        // A local address of 5 bytes, a port of 3.
        assert!(VxlanInfo::parse(&hex("09000400 c0a80001 02000000")).is_err());
        assert!(VxlanInfo::parse(&hex("07000f00 12b600")).is_err());
        // All zeros: no local address.
        let any = VxlanInfo::parse(&hex("08000400 00000000")).unwrap();
        assert_eq!(any.local, None);
    }

    /// `ip link show vx4` and `ip link show vx6` (the devices above, the second
    /// with MAC 0a:58:00:00:00:01 and MTU 1430): the kernel's RTM_NEWLINK
    /// answers, captured with strace (kernel 6.18).
    fn captured_links() -> Vec<Link> {
        let bytes = hex(include_str!("testdata/vxlan-links.hex"));
        cni_netlink::messages(&bytes)
            .map(|m| Link::parse(m.unwrap().payload).unwrap())
            .collect()
    }

    #[test]
    fn captured_vxlan_links_decode_with_their_settings() {
        let links = captured_links();
        let [vx4, vx6] = &links[..] else {
            panic!("{links:?}");
        };
        assert_eq!(
            (vx4.name.as_str(), vx4.kind.as_deref(), vx4.mtu),
            ("vx4", Some("vxlan"), 1450)
        );
        assert_eq!(vx4.mac, Some(vtep_mac(ip("192.168.0.1"))));
        assert_eq!(vx4.vxlan, Some(VxlanInfo::parse(&hex(VX4_DATA)).unwrap()));
        assert_eq!(vx6.mtu, 1430);
        assert_eq!(
            vx6.vxlan,
            Some(VxlanInfo {
                vni: 4243,
                port: 4790,
                local: Some(ip("fd00:1::1")),
                underlay: None,
                learning: false,
                // Reported for an IPv6 device too, where it means nothing.
                udp_csum: true,
                udp6_zero_csum_tx: false,
                udp6_zero_csum_rx: false,
            })
        );
        let six = Vxlan {
            name: "vx6",
            vni: 4243,
            local: Some(ip("fd00:1::1")),
            port: 4790,
            underlay: None,
            mtu: None,
            mac: None,
        };
        assert!(six.matches(vx6) && !six.matches(vx4));
    }

    #[test]
    fn corrupted_vxlan_links_never_panic_the_decoder() {
        let bytes = hex(include_str!("testdata/vxlan-links.hex"));
        for at in 0..bytes.len() {
            for value in [0x00, 0x05, 0x81, 0xff] {
                let mut b = bytes.clone();
                b[at] = value;
                for msg in cni_netlink::messages(&b).map_while(std::result::Result::ok) {
                    let _ = Link::parse(msg.payload);
                }
            }
        }
    }

    #[test]
    fn a_device_matches_only_with_the_settings_it_was_created_with() {
        let want = Vxlan {
            name: "vx4",
            vni: 4242,
            local: Some(ip("192.168.0.1")),
            port: 4790,
            underlay: Some(3),
            mtu: Some(1450),
            mac: None,
        };
        let info = VxlanInfo::parse(&hex(VX4_DATA)).unwrap();
        let link = Link {
            index: 4,
            name: "vx4".into(),
            mac: None,
            mtu: 1400,
            kind: Some("vxlan".into()),
            controller: None,
            up: false,
            oper_state: crate::netlink::OperState::Down,
            promisc: false,
            peer_index: None,
            link_netnsid: None,
            vlan_filtering: None,
            bridge_port: None,
            vxlan: Some(info),
        };
        assert!(want.matches(&link), "the MTU is not compared");
        assert!(
            Vxlan {
                underlay: None,
                ..want
            }
            .matches(&link)
        );
        for other in [
            Vxlan { vni: 1, ..want },
            Vxlan { port: 8472, ..want },
            Vxlan {
                local: None,
                ..want
            },
            Vxlan {
                underlay: Some(2),
                ..want
            },
            Vxlan {
                name: "vx5",
                ..want
            },
        ] {
            assert!(!other.matches(&link), "{other:?}");
        }
        let learning = VxlanInfo {
            learning: true,
            ..info
        };
        let no_csum = VxlanInfo {
            udp_csum: false,
            ..info
        };
        for info in [learning, no_csum] {
            let l = Link {
                vxlan: Some(info),
                ..link.clone()
            };
            assert!(!want.matches(&l), "{info:?}");
        }
        let veth = Link {
            kind: Some("veth".into()),
            vxlan: None,
            ..link.clone()
        };
        assert!(!want.matches(&veth));
    }

    #[test]
    fn vtep_macs_are_stable_locally_administered_unicast() {
        assert_eq!(
            vtep_mac(ip("10.0.0.5")),
            MacAddr([0x0a, 0x58, 0x0a, 0x00, 0x00, 0x05])
        );
        // FNV-1a's published values, then the hash of an address, pinned: every
        // node and release must compute the same MAC.
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(vtep_mac(ip("2001:db8:1::10")).to_string(), PINNED_V6);
        let mut seen = HashSet::new();
        let mut addresses: Vec<IpAddr> = Vec::new();
        for subnet in 0..40u16 {
            for host in 1..=250u16 {
                // The same low bytes in every subnet.
                addresses.push(Ipv6Addr::new(0x2001, 0xdb8, subnet, 0, 0, 0, 0, host).into());
            }
        }
        addresses.extend((0..10_000u32).map(|i| IpAddr::from(Ipv4Addr::from(0x0a00_0000 + i))));
        for a in &addresses {
            let mac = vtep_mac(*a);
            assert_eq!(mac.0[0] & 0b11, 0b10, "{a}: {mac} is not local unicast");
            assert!(seen.insert(mac), "{a}: {mac} seen twice");
        }
    }

    const PINNED_V6: &str = "0a:c8:b7:f0:bf:82";
}
