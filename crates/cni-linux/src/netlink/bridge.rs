//! Linux bridges and their ports: bridge creation, VLAN filtering, port
//! flags (hairpin, isolation) and per-port VLAN membership.

use cni_netlink::wire::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, attrs, u16_ne,
};
use cni_netlink::{Malformed, Writer};

use super::Netlink;
use super::rtnl::{
    AF_BRIDGE, BRIDGE_VLAN_INFO_PVID, BRIDGE_VLAN_INFO_UNTAGGED, IFLA_AF_SPEC,
    IFLA_BR_VLAN_FILTERING, IFLA_BRIDGE_VLAN_INFO, IFLA_BRPORT_ISOLATED, IFLA_BRPORT_MODE,
    IFLA_EXT_MASK, IFLA_IFNAME, IFLA_INFO_DATA, IFLA_INFO_KIND, IFLA_INFO_SLAVE_DATA,
    IFLA_INFO_SLAVE_KIND, IFLA_LINKINFO, IFLA_MTU, IfInfo, RTEXT_FILTER_BRVLAN, RTM_DELLINK,
    RTM_GETLINK, RTM_NEWLINK, RTM_SETLINK,
};
use crate::error::Result;

/// One VLAN a bridge port is a member of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VlanEntry {
    /// VLAN id.
    pub vid: u16,
    /// Untagged ingress frames are assigned to this VLAN.
    pub pvid: bool,
    /// Frames leave the port without a tag.
    pub untagged: bool,
}

impl Netlink {
    /// Creates a bridge, down, failing with `is_exists()` if the name is taken.
    ///
    /// `vlan_filtering` is only sent when true, so kernels built without
    /// bridge VLAN filtering can still create plain bridges.
    pub fn create_bridge(&self, name: &str, mtu: Option<u32>, vlan_filtering: bool) -> Result<()> {
        self.exec(
            RTM_NEWLINK,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE,
            |w| bridge_message(w, name, mtu, vlan_filtering),
            || format!("failed to create bridge {name:?}"),
        )
    }

    /// Turns VLAN filtering on or off on an existing bridge.
    pub fn set_bridge_vlan_filtering(&self, index: u32, on: bool) -> Result<()> {
        self.exec(
            RTM_NEWLINK,
            NLM_F_REQUEST | NLM_F_ACK,
            |w| vlan_filtering_message(w, index, on),
            || format!("failed to set vlan_filtering {on} on bridge #{index}"),
        )
    }

    /// Sets hairpin mode on a bridge port.
    pub fn set_port_hairpin(&self, index: u32, on: bool) -> Result<()> {
        self.set_port(index, Some(on), None, || {
            format!("failed to set hairpin mode {on} on bridge port #{index}")
        })
    }

    /// Sets hairpin mode and port isolation of a bridge port in one request.
    pub fn set_port_flags(&self, index: u32, hairpin: bool, isolated: bool) -> Result<()> {
        self.set_port(index, Some(hairpin), Some(isolated), || {
            format!(
                "failed to set hairpin {hairpin} and isolated {isolated} on bridge port #{index}"
            )
        })
    }

    /// Sets port isolation on a bridge port.
    pub fn set_port_isolated(&self, index: u32, on: bool) -> Result<()> {
        self.set_port(index, None, Some(on), || {
            format!("failed to set isolated {on} on bridge port #{index}")
        })
    }

    fn set_port(
        &self,
        index: u32,
        hairpin: Option<bool>,
        isolated: Option<bool>,
        context: impl FnOnce() -> String,
    ) -> Result<()> {
        self.exec(
            RTM_NEWLINK,
            NLM_F_REQUEST | NLM_F_ACK,
            |w| port_message(w, index, hairpin, isolated),
            context,
        )
    }

    /// Lists the VLANs of a bridge port (as `bridge vlan show dev <port>`).
    pub fn port_vlans(&self, index: u32) -> Result<Vec<VlanEntry>> {
        // Per-port VLAN lists only come from the AF_BRIDGE dump with the
        // BRVLAN extension mask; a plain GETLINK never carries them.
        let mut vlans = Vec::new();
        self.request(
            RTM_GETLINK,
            NLM_F_REQUEST | NLM_F_DUMP,
            |w| {
                IfInfo {
                    family: AF_BRIDGE,
                    ..IfInfo::default()
                }
                .write(w);
                w.attr_u32(IFLA_EXT_MASK, RTEXT_FILTER_BRVLAN);
            },
            |msg| {
                if msg.ty != RTM_NEWLINK {
                    return Ok(());
                }
                let (header, attributes) = IfInfo::parse(msg.payload)?;
                if header.index == index {
                    vlans.extend(vlan_entries(attributes)?);
                }
                Ok(())
            },
            || format!("failed to list VLANs of bridge port #{index}"),
        )?;
        Ok(vlans)
    }

    /// Adds a VLAN to a bridge port (bridge side, like `bridge vlan add ... master`).
    pub fn add_port_vlan(&self, index: u32, vid: u16, pvid: bool, untagged: bool) -> Result<()> {
        self.exec(
            RTM_SETLINK,
            NLM_F_REQUEST | NLM_F_ACK,
            |w| port_vlan_message(w, index, vid, pvid, untagged),
            || format!("failed to add VLAN {vid} to bridge port #{index}"),
        )
    }

    /// Removes a VLAN from a bridge port.
    pub fn del_port_vlan(&self, index: u32, vid: u16) -> Result<()> {
        self.exec(
            RTM_DELLINK,
            NLM_F_REQUEST | NLM_F_ACK,
            |w| port_vlan_message(w, index, vid, false, false),
            || format!("failed to remove VLAN {vid} from bridge port #{index}"),
        )
    }
}

/// IFLA_LINKINFO with the bridge kind and, if given, IFLA_BR_VLAN_FILTERING.
fn bridge_info(w: &mut Writer, vlan_filtering: Option<bool>) {
    let info = w.nest_start(IFLA_LINKINFO);
    // Without a NUL, as `ip` sends kinds.
    w.attr(IFLA_INFO_KIND, b"bridge");
    if let Some(on) = vlan_filtering {
        let data = w.nest_start(IFLA_INFO_DATA);
        w.attr_u8(IFLA_BR_VLAN_FILTERING, u8::from(on));
        w.nest_end(data);
    }
    w.nest_end(info);
}

fn bridge_message(w: &mut Writer, name: &str, mtu: Option<u32>, vlan_filtering: bool) {
    IfInfo::default().write(w);
    w.attr_str(IFLA_IFNAME, name);
    if let Some(mtu) = mtu {
        w.attr_u32(IFLA_MTU, mtu);
    }
    bridge_info(w, vlan_filtering.then_some(true));
}

/// The kernel only applies IFLA_BR_VLAN_FILTERING through RTM_NEWLINK
/// carrying the bridge kind; RTM_SETLINK ignores it (netavark found this by
/// stracing `ip link set ... type bridge vlan_filtering 1`).
fn vlan_filtering_message(w: &mut Writer, index: u32, on: bool) {
    IfInfo::index(index).write(w);
    bridge_info(w, Some(on));
}

/// Port flags through the port kind's data, as `ip link set dev <port> type
/// bridge_slave hairpin on isolated on` sets them.
fn port_message(w: &mut Writer, index: u32, hairpin: Option<bool>, isolated: Option<bool>) {
    IfInfo::index(index).write(w);
    let info = w.nest_start(IFLA_LINKINFO);
    w.attr(IFLA_INFO_SLAVE_KIND, b"bridge");
    let data = w.nest_start(IFLA_INFO_SLAVE_DATA);
    if let Some(on) = hairpin {
        w.attr_u8(IFLA_BRPORT_MODE, u8::from(on));
    }
    if let Some(on) = isolated {
        w.attr_u8(IFLA_BRPORT_ISOLATED, u8::from(on));
    }
    w.nest_end(data);
    w.nest_end(info);
}

/// AF_BRIDGE message with one IFLA_BRIDGE_VLAN_INFO and no IFLA_BRIDGE_FLAGS,
/// which the kernel treats as "master": the bridge's view of the port, what
/// `bridge vlan add dev <port> vid <n> master` does.
fn port_vlan_message(w: &mut Writer, index: u32, vid: u16, pvid: bool, untagged: bool) {
    IfInfo {
        family: AF_BRIDGE,
        ..IfInfo::index(index)
    }
    .write(w);
    let mut flags = 0;
    if pvid {
        flags |= BRIDGE_VLAN_INFO_PVID;
    }
    if untagged {
        flags |= BRIDGE_VLAN_INFO_UNTAGGED;
    }
    let spec = w.nest_start(IFLA_AF_SPEC);
    let mut info = [0u8; 4];
    info[..2].copy_from_slice(&flags.to_ne_bytes());
    info[2..].copy_from_slice(&vid.to_ne_bytes());
    w.attr(IFLA_BRIDGE_VLAN_INFO, &info);
    w.nest_end(spec);
}

/// The `struct bridge_vlan_info` entries of an AF_BRIDGE link message's attributes.
pub(super) fn vlan_entries(attributes: &[u8]) -> std::result::Result<Vec<VlanEntry>, Malformed> {
    let mut entries = Vec::new();
    for attr in attrs(attributes) {
        let (ty, spec) = attr?;
        if ty != IFLA_AF_SPEC {
            continue;
        }
        for attr in attrs(spec) {
            let (ty, v) = attr?;
            if ty != IFLA_BRIDGE_VLAN_INFO {
                continue;
            }
            let (flags, vid) = match v {
                [f0, f1, v0, v1] => (u16_ne(&[*f0, *f1])?, u16_ne(&[*v0, *v1])?),
                _ => return Err(Malformed("bridge_vlan_info of another length")),
            };
            entries.push(VlanEntry {
                vid,
                pvid: flags & BRIDGE_VLAN_INFO_PVID != 0,
                untagged: flags & BRIDGE_VLAN_INFO_UNTAGGED != 0,
            });
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::{hex, message};

    #[test]
    fn bridge_create_is_what_ip_link_add_sends() {
        // `ip link add cni0 mtu 1400 type bridge`, strace'd: IFLA_MTU, IFLA_IFNAME,
        // IFLA_LINKINFO {IFLA_INFO_KIND "bridge"}; we put the name first.
        let got = message(RTM_NEWLINK, 0x605, |w| {
            bridge_message(w, "cni0", Some(1400), false)
        });
        let want = hex("44000000 1000 0506 01000000 00000000 \
             00000000 00000000 00000000 00000000 \
             09000300 636e6930 00000000 \
             08000400 78050000 \
             10001200 0a000100 62726964 67650000");
        assert_eq!(got, want);
    }

    #[test]
    fn bridge_with_vlan_filtering_carries_it_in_the_bridge_data() {
        let got = message(RTM_NEWLINK, 0x605, |w| {
            bridge_message(w, "cni0", None, true)
        });
        let tail = hex("1c001200 0a000100 62726964 67650000 0c000200 05000700 01000000");
        assert!(got.ends_with(&tail), "{got:02x?}");
    }

    #[test]
    fn vlan_filtering_toggle_is_what_ip_link_set_sends() {
        // `ip link set dev cni0 type bridge vlan_filtering 0` (cni0 is #5).
        let got = message(RTM_NEWLINK, 0x5, |w| vlan_filtering_message(w, 5, false));
        let want = hex("3c000000 1000 0500 01000000 00000000 \
             00000000 05000000 00000000 00000000 \
             1c001200 0a000100 62726964 67650000 0c000200 05000700 00000000");
        assert_eq!(got, want);
    }

    #[test]
    fn port_flags_go_in_the_bridge_port_data() {
        // What `ip link set dev vethA type bridge_slave hairpin on isolated on`
        // sends, but with IFLA_INFO_SLAVE_KIND "bridge" where ip puts
        // IFLA_INFO_KIND "bridge_slave": the kernel takes either for a port.
        let got = message(RTM_NEWLINK, 0x5, |w| {
            port_message(w, 6, Some(true), Some(true))
        });
        let want = hex("44000000 1000 0500 01000000 00000000 \
             00000000 06000000 00000000 00000000 \
             24001200 0a000400 62726964 67650000 \
             14000500 05000400 01000000 05002100 01000000");
        assert_eq!(got, want);
        let only_isolated = message(RTM_NEWLINK, 0x5, |w| port_message(w, 6, None, Some(false)));
        assert!(only_isolated.ends_with(&hex("0c000500 05002100 00000000")));
    }

    #[test]
    fn port_vlan_is_bridge_family_master_side() {
        // `bridge vlan add dev vethA vid 10 pvid untagged master` sends the same
        // VLAN info after an IFLA_BRIDGE_FLAGS "master", which is the default.
        let got = message(RTM_SETLINK, 0x5, |w| {
            port_vlan_message(w, 6, 10, true, true)
        });
        let want = hex("2c000000 1300 0500 01000000 00000000 \
             07000000 06000000 00000000 00000000 \
             0c001a00 08000200 06000a00");
        assert_eq!(got, want);
        let attributes = &got[32..];
        assert_eq!(
            vlan_entries(attributes).unwrap(),
            [VlanEntry {
                vid: 10,
                pvid: true,
                untagged: true
            }]
        );
    }

    #[test]
    fn tagged_port_vlan_has_no_flags() {
        let got = message(RTM_DELLINK, 0x5, |w| {
            port_vlan_message(w, 9, 20, false, false)
        });
        assert_eq!(
            vlan_entries(&got[32..]).unwrap(),
            [VlanEntry {
                vid: 20,
                pvid: false,
                untagged: false
            }]
        );
    }

    #[test]
    fn a_short_vlan_info_is_an_error() {
        let mut w = Writer::new();
        let spec = w.nest_start(IFLA_AF_SPEC);
        w.attr(IFLA_BRIDGE_VLAN_INFO, &[6, 0, 10]);
        w.nest_end(spec);
        assert!(vlan_entries(w.as_bytes()).is_err());
    }
}
