//! Links: lookup, listing, generic attribute changes (up/down, MAC, MTU,
//! promiscuous mode, controller) and deletion.

use cni_netlink::wire::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, attrs, c_string, i32_ne, u8_value, u32_ne,
};
use cni_netlink::{Malformed, Writer};

use super::Netlink;
use super::rtnl::{
    AF_INET, IFF_PROMISC, IFF_UP, IFLA_ADDRESS, IFLA_AF_SPEC, IFLA_BR_VLAN_FILTERING,
    IFLA_BRPORT_ISOLATED, IFLA_BRPORT_MODE, IFLA_EXT_MASK, IFLA_IFNAME, IFLA_INFO_DATA,
    IFLA_INFO_KIND, IFLA_INFO_SLAVE_DATA, IFLA_INFO_SLAVE_KIND, IFLA_LINK, IFLA_LINK_NETNSID,
    IFLA_LINKINFO, IFLA_MASTER, IFLA_MTU, IFLA_OPERSTATE, IfInfo, RTEXT_FILTER_SKIP_STATS,
    RTM_DELLINK, RTM_GETLINK, RTM_NEWLINK,
};
use super::vxlan::VxlanInfo;
use crate::error::{Error, Result};
use crate::mac::MacAddr;
use crate::oper_state::OperState;

/// `IFLA_INET_CONF` inside `AF_INET` inside `IFLA_AF_SPEC`.
const IFLA_INET_CONF: u16 = 1;
/// `IPV4_DEVCONF_ARP_NOTIFY` (`include/uapi/linux/ip.h`).
const IPV4_DEVCONF_ARP_NOTIFY: u16 = 22;

/// One IPv4 per-link setting (`IPV4_DEVCONF_*`), nested as the kernel's
/// `inet_set_link_af` takes it.
fn ipv4_devconf(w: &mut Writer, setting: u16, value: u32) {
    let spec = w.nest_start(IFLA_AF_SPEC);
    let inet = w.nest_start(u16::from(AF_INET));
    let conf = w.nest_start(IFLA_INET_CONF);
    w.attr_u32(setting, value);
    w.nest_end(conf);
    w.nest_end(inet);
    w.nest_end(spec);
}

/// A network interface as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Hardware address, when it is a 6-byte Ethernet address.
    pub mac: Option<MacAddr>,
    /// MTU.
    pub mtu: u32,
    /// Link kind (`"bridge"`, `"veth"`, ...), `None` for plain devices like `lo`.
    pub kind: Option<String>,
    /// Index of the controller (bridge) this link is a port of.
    pub controller: Option<u32>,
    /// Administrative state (IFF_UP).
    pub up: bool,
    /// Operational state (RFC 2863).
    pub oper_state: OperState,
    /// Promiscuous mode (IFF_PROMISC).
    pub promisc: bool,
    /// IFLA_LINK: for a veth, the peer's index (in the peer's netns).
    pub peer_index: Option<u32>,
    /// Netns id of the peer's namespace, when it lives in another netns.
    pub link_netnsid: Option<i32>,
    /// For a bridge: whether VLAN filtering is on.
    pub vlan_filtering: Option<bool>,
    /// For a bridge port: its port flags.
    pub bridge_port: Option<BridgePort>,
    /// For a VXLAN device: its settings.
    pub vxlan: Option<VxlanInfo>,
}

/// Flags of a bridge port that the bridge plugin manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BridgePort {
    /// Hairpin (reflective relay) mode.
    pub hairpin: bool,
    /// Port isolation.
    pub isolated: bool,
}

impl Link {
    /// Decodes an RTM_NEWLINK message (payload after the netlink header).
    pub(crate) fn parse(payload: &[u8]) -> std::result::Result<Self, Malformed> {
        let (header, attributes) = IfInfo::parse(payload)?;
        let mut link = Self {
            index: header.index,
            name: String::new(),
            mac: None,
            mtu: 0,
            kind: None,
            controller: None,
            up: header.flags & IFF_UP != 0,
            oper_state: OperState::Unknown,
            promisc: header.flags & IFF_PROMISC != 0,
            peer_index: None,
            link_netnsid: None,
            vlan_filtering: None,
            bridge_port: None,
            vxlan: None,
        };
        for attr in attrs(attributes) {
            let (ty, v) = attr?;
            match ty {
                IFLA_IFNAME => link.name = c_string(v),
                IFLA_ADDRESS => link.mac = MacAddr::from_slice(v),
                IFLA_MTU => link.mtu = u32_ne(v)?,
                IFLA_MASTER => link.controller = Some(u32_ne(v)?).filter(|i| *i != 0),
                IFLA_OPERSTATE => link.oper_state = u8_value(v)?.into(),
                IFLA_LINK => link.peer_index = Some(u32_ne(v)?).filter(|i| *i != 0),
                IFLA_LINK_NETNSID => link.link_netnsid = Some(i32_ne(v)?),
                IFLA_LINKINFO => link.apply_link_info(v)?,
                _ => {}
            }
        }
        Ok(link)
    }

    /// IFLA_LINKINFO: the kind first, then its data, whose attributes only mean
    /// something for that kind; likewise for the port ("slave") kind and data.
    fn apply_link_info(&mut self, info: &[u8]) -> std::result::Result<(), Malformed> {
        let mut port_kind = None;
        for attr in attrs(info) {
            let (ty, v) = attr?;
            match ty {
                IFLA_INFO_KIND => self.kind = Some(c_string(v)),
                IFLA_INFO_DATA if self.kind.as_deref() == Some("bridge") => {
                    for attr in attrs(v) {
                        let (ty, v) = attr?;
                        if ty == IFLA_BR_VLAN_FILTERING {
                            self.vlan_filtering = Some(u8_value(v)? != 0);
                        }
                    }
                }
                IFLA_INFO_DATA if self.kind.as_deref() == Some("vxlan") => {
                    self.vxlan = Some(VxlanInfo::parse(v)?);
                }
                IFLA_INFO_SLAVE_KIND => {
                    let kind = c_string(v);
                    if kind == "bridge" && self.bridge_port.is_none() {
                        self.bridge_port = Some(BridgePort::default());
                    }
                    port_kind = Some(kind);
                }
                IFLA_INFO_SLAVE_DATA if port_kind.as_deref() == Some("bridge") => {
                    let mut port = BridgePort::default();
                    for attr in attrs(v) {
                        let (ty, v) = attr?;
                        match ty {
                            IFLA_BRPORT_MODE => port.hairpin = u8_value(v)? != 0,
                            IFLA_BRPORT_ISOLATED => port.isolated = u8_value(v)? != 0,
                            _ => {}
                        }
                    }
                    self.bridge_port = Some(port);
                }
                _ => {}
            }
        }
        // A second IFLA_INFO_KIND after the data (no kernel sends one) leaves the data
        // of a kind the link no longer says it is: dropped.
        if self.kind.as_deref() != Some("vxlan") {
            self.vxlan = None;
        }
        Ok(())
    }
}

/// A GETLINK request: one link (by index or name) or, with `NLM_F_DUMP`, all.
fn get_link(w: &mut Writer, index: u32, name: Option<&str>) {
    IfInfo::index(index).write(w);
    w.attr_u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
    if let Some(name) = name {
        w.attr_str(IFLA_IFNAME, name);
    }
}

impl Netlink {
    /// Looks a link up by name; `Ok(None)` if there is none.
    pub fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        self.get_one_link(
            |w| get_link(w, 0, Some(name)),
            || format!("failed to look up link {name:?}"),
        )
    }

    /// Looks a link up by index; `Ok(None)` if there is none.
    pub fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        self.get_one_link(
            |w| get_link(w, index, None),
            || format!("failed to look up link #{index}"),
        )
    }

    /// Looks a link up by name; a missing link is an `Error::LinkNotFound`.
    pub fn require_link(&self, name: &str) -> Result<Link> {
        self.link_by_name(name)?.ok_or_else(|| Error::LinkNotFound {
            name: name.to_owned(),
        })
    }

    /// Lists every link in the netns.
    pub fn links(&self) -> Result<Vec<Link>> {
        let mut links = Vec::new();
        self.request(
            RTM_GETLINK,
            NLM_F_REQUEST | NLM_F_DUMP,
            |w| get_link(w, 0, None),
            |msg| {
                if msg.ty == RTM_NEWLINK {
                    links.push(Link::parse(msg.payload)?);
                }
                Ok(())
            },
            || "failed to list links".to_owned(),
        )?;
        Ok(links)
    }

    /// Sets a link administratively up.
    pub fn set_up(&self, index: u32) -> Result<()> {
        self.change_flags(index, IFF_UP, IFF_UP, || {
            format!("failed to set link #{index} up")
        })
    }

    /// Sets a link administratively down.
    pub fn set_down(&self, index: u32) -> Result<()> {
        self.change_flags(index, 0, IFF_UP, || {
            format!("failed to set link #{index} down")
        })
    }

    /// Turns promiscuous mode on or off.
    pub fn set_promisc(&self, index: u32, on: bool) -> Result<()> {
        let flags = if on { IFF_PROMISC } else { 0 };
        self.change_flags(index, flags, IFF_PROMISC, || {
            format!("failed to set promiscuous mode {on} on link #{index}")
        })
    }

    /// Sets the hardware address.
    pub fn set_mac(&self, index: u32, mac: MacAddr) -> Result<()> {
        self.change(
            index,
            |w| w.attr(IFLA_ADDRESS, &mac.octets()),
            || format!("failed to set MAC {mac} on link #{index}"),
        )
    }

    /// Sets the link's `net.ipv4.conf.<link>.arp_notify` over netlink
    /// (`IFLA_AF_SPEC` / `AF_INET` / `IFLA_INET_CONF`), as the sysctl write
    /// would, without a lookup under `/proc/sys/net`: that costs more the more
    /// network namespaces the node has.
    pub fn set_arp_notify(&self, index: u32, on: bool) -> Result<()> {
        self.change(
            index,
            |w| ipv4_devconf(w, IPV4_DEVCONF_ARP_NOTIFY, u32::from(on)),
            || format!("failed to set arp_notify on link #{index}"),
        )
    }

    /// Sets the MTU.
    pub fn set_mtu(&self, index: u32, mtu: u32) -> Result<()> {
        self.change(
            index,
            |w| w.attr_u32(IFLA_MTU, mtu),
            || format!("failed to set MTU {mtu} on link #{index}"),
        )
    }

    /// Makes a link a port of `controller` (a bridge).
    pub fn set_controller(&self, index: u32, controller: u32) -> Result<()> {
        self.change(
            index,
            |w| w.attr_u32(IFLA_MASTER, controller),
            || format!("failed to attach link #{index} to bridge #{controller}"),
        )
    }

    /// Detaches a link from its controller.
    pub fn unset_controller(&self, index: u32) -> Result<()> {
        self.change(
            index,
            |w| w.attr_u32(IFLA_MASTER, 0),
            || format!("failed to detach link #{index}"),
        )
    }

    /// Deletes a link (for a veth, the peer goes with it).
    pub fn delete_link(&self, index: u32) -> Result<()> {
        self.exec(
            RTM_DELLINK,
            NLM_F_REQUEST | NLM_F_ACK,
            |w| IfInfo::index(index).write(w),
            || format!("failed to delete link #{index}"),
        )
    }

    /// Deletes a link by name; `Ok(false)` if it did not exist.
    pub fn delete_link_by_name(&self, name: &str) -> Result<bool> {
        // One request: the kernel resolves the name itself (no lookup round trip).
        let deleted = self.exec(
            RTM_DELLINK,
            NLM_F_REQUEST | NLM_F_ACK,
            |w| {
                IfInfo::index(0).write(w);
                w.attr_str(IFLA_IFNAME, name);
            },
            || format!("failed to delete link {name:?}"),
        );
        match deleted {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// RTM_NEWLINK without create flags is how `ip link set` changes a link.
    fn change(
        &self,
        index: u32,
        attributes: impl FnOnce(&mut Writer),
        context: impl FnOnce() -> String,
    ) -> Result<()> {
        self.exec(
            RTM_NEWLINK,
            NLM_F_REQUEST | NLM_F_ACK,
            |w| {
                IfInfo::index(index).write(w);
                attributes(w);
            },
            context,
        )
    }

    /// Sets the `IFF_*` bits of `change` to those of `flags`.
    fn change_flags(
        &self,
        index: u32,
        flags: u32,
        change: u32,
        context: impl FnOnce() -> String,
    ) -> Result<()> {
        let header = IfInfo {
            flags,
            change,
            ..IfInfo::index(index)
        };
        self.exec(
            RTM_NEWLINK,
            NLM_F_REQUEST | NLM_F_ACK,
            |w| header.write(w),
            context,
        )
    }

    /// A non-dump GETLINK: its one answer, with ENODEV as `None`.
    fn get_one_link(
        &self,
        build: impl FnOnce(&mut Writer),
        context: impl FnOnce() -> String,
    ) -> Result<Option<Link>> {
        let mut link = None;
        let answer = self.request(
            RTM_GETLINK,
            NLM_F_REQUEST,
            build,
            |msg| {
                if msg.ty == RTM_NEWLINK {
                    link = Some(Link::parse(msg.payload)?);
                }
                Ok(())
            },
            context,
        );
        match answer {
            Ok(()) => Ok(link),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::{hex, message};

    #[test]
    fn arp_notify_is_one_ipv4_devconf_attribute_nested_as_the_kernel_takes_it() {
        // No `ip` command sets IPv4 devconf over netlink; the layout is the one
        // `inet_fill_link_af` reports (IFLA_AF_SPEC > AF_INET > IFLA_INET_CONF >
        // attribute type = IPV4_DEVCONF_ARP_NOTIFY, u32), which `inet_set_link_af`
        // takes back.
        let got = message(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, |w| {
            IfInfo::index(7).write(w);
            ipv4_devconf(w, IPV4_DEVCONF_ARP_NOTIFY, 1);
        });
        let want = hex("34000000 1000 0500 01000000 00000000 \
             00000000 07000000 00000000 00000000 \
             1400 1a00 1000 0200 0c00 0100 0800 1600 01000000");
        assert_eq!(got, want);
    }
}

#[cfg(test)]
mod fuzz_regressions {
    use crate::netlink::{Reply, decode_reply};
    use cni_netlink::messages;

    /// Found by the fuzz stage: VXLAN data, then a second IFLA_INFO_KIND naming
    /// another kind; the link must not keep VXLAN data it no longer says it is.
    #[test]
    fn vxlan_data_followed_by_another_kind_is_dropped() {
        let data = include_bytes!(
            "../../../../tests/fuzz/regressions/netlink/vxlan-data-then-another-kind"
        );
        let mut links = 0;
        for msg in messages(data) {
            let Ok(msg) = msg else { break };
            if let Reply::Link { link: Ok(link), .. } = decode_reply(&msg) {
                links += 1;
                if link.vxlan.is_some() {
                    assert_eq!(link.kind.as_deref(), Some("vxlan"), "{link:?}");
                }
            }
        }
        assert!(links > 0);
    }
}
