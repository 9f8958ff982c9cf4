//! Linux bridges and their ports: bridge creation, VLAN filtering, port
//! flags (hairpin, isolation) and per-port VLAN membership.

use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::link::{
    AfSpecBridge, BridgeVlanInfoFlags, InfoKind, LinkAttribute, LinkExtentMask, LinkMessage,
};
use rtnetlink::{LinkBridge, LinkBridgePort, LinkBridgeVlan, LinkMessageBuilder};

use super::{Netlink, collect, exec};
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
    pub async fn create_bridge(
        &self,
        name: &str,
        mtu: Option<u32>,
        vlan_filtering: bool,
    ) -> Result<()> {
        let msg = bridge_message(name, mtu, vlan_filtering);
        exec(self.handle.link().add(msg).execute(), || {
            format!("failed to create bridge {name:?}")
        })
        .await
    }

    /// Turns VLAN filtering on or off on an existing bridge.
    pub async fn set_bridge_vlan_filtering(&self, index: u32, on: bool) -> Result<()> {
        let msg = vlan_filtering_message(index, on);
        exec(self.handle.link().change(msg).execute(), || {
            format!("failed to set vlan_filtering {on} on bridge #{index}")
        })
        .await
    }

    /// Sets hairpin mode on a bridge port.
    pub async fn set_port_hairpin(&self, index: u32, on: bool) -> Result<()> {
        let msg = LinkBridgePort::new(index).hairpin(on).build();
        exec(self.handle.link().set_port(msg).execute(), || {
            format!("failed to set hairpin mode {on} on bridge port #{index}")
        })
        .await
    }

    /// Sets hairpin mode and port isolation of a bridge port in one request.
    pub async fn set_port_flags(&self, index: u32, hairpin: bool, isolated: bool) -> Result<()> {
        let msg = LinkBridgePort::new(index)
            .hairpin(hairpin)
            .isolated(isolated)
            .build();
        exec(self.handle.link().set_port(msg).execute(), || {
            format!(
                "failed to set hairpin {hairpin} and isolated {isolated} on bridge port #{index}"
            )
        })
        .await
    }

    /// Sets port isolation on a bridge port.
    pub async fn set_port_isolated(&self, index: u32, on: bool) -> Result<()> {
        let msg = LinkBridgePort::new(index).isolated(on).build();
        exec(self.handle.link().set_port(msg).execute(), || {
            format!("failed to set isolated {on} on bridge port #{index}")
        })
        .await
    }

    /// Lists the VLANs of a bridge port (as `bridge vlan show dev <port>`).
    pub async fn port_vlans(&self, index: u32) -> Result<Vec<VlanEntry>> {
        // Per-port VLAN lists only come from the AF_BRIDGE dump with the
        // BRVLAN extension mask; a plain GETLINK never carries them.
        let request = self
            .handle
            .link()
            .get()
            .set_filter_mask(AddressFamily::Bridge, vec![LinkExtentMask::Brvlan])
            .execute();
        let messages = collect(request, || {
            format!("failed to list VLANs of bridge port #{index}")
        })
        .await?;
        Ok(messages
            .iter()
            .filter(|m| m.header.index == index)
            .flat_map(vlan_entries)
            .collect())
    }

    /// Adds a VLAN to a bridge port (bridge side, like `bridge vlan add ... master`).
    pub async fn add_port_vlan(
        &self,
        index: u32,
        vid: u16,
        pvid: bool,
        untagged: bool,
    ) -> Result<()> {
        let msg = port_vlan_message(index, vid, pvid, untagged);
        exec(self.handle.link().set(msg).execute(), || {
            format!("failed to add VLAN {vid} to bridge port #{index}")
        })
        .await
    }

    /// Removes a VLAN from a bridge port.
    pub async fn del_port_vlan(&self, index: u32, vid: u16) -> Result<()> {
        let msg = port_vlan_message(index, vid, false, false);
        exec(self.handle.link().del_with_message(msg).execute(), || {
            format!("failed to remove VLAN {vid} from bridge port #{index}")
        })
        .await
    }
}

fn bridge_message(name: &str, mtu: Option<u32>, vlan_filtering: bool) -> LinkMessage {
    let mut builder = LinkMessageBuilder::<LinkBridge>::new(name);
    if let Some(mtu) = mtu {
        builder = builder.mtu(mtu);
    }
    if vlan_filtering {
        builder = builder.vlan_filtering(true);
    }
    builder.build()
}

/// The kernel only applies IFLA_BR_VLAN_FILTERING through RTM_NEWLINK
/// carrying the bridge kind; RTM_SETLINK ignores it (netavark found this by
/// stracing `ip link set ... type bridge vlan_filtering 1`).
fn vlan_filtering_message(index: u32, on: bool) -> LinkMessage {
    LinkMessageBuilder::<LinkBridge>::new_with_info_kind(InfoKind::Bridge)
        .index(index)
        .vlan_filtering(on)
        .build()
}

/// AF_BRIDGE message with one IFLA_BRIDGE_VLAN_INFO and no IFLA_BRIDGE_FLAGS,
/// which the kernel treats as "master": the bridge's view of the port, what
/// `bridge vlan add dev <port> vid <n> master` sends.
fn port_vlan_message(index: u32, vid: u16, pvid: bool, untagged: bool) -> LinkMessage {
    let mut flags = BridgeVlanInfoFlags::empty();
    flags.set(BridgeVlanInfoFlags::Pvid, pvid);
    flags.set(BridgeVlanInfoFlags::Untagged, untagged);
    LinkBridgeVlan::new(index).vlan(vid, flags).build()
}

fn vlan_entries(msg: &LinkMessage) -> Vec<VlanEntry> {
    msg.attributes
        .iter()
        .filter_map(|attr| match attr {
            LinkAttribute::AfSpecBridge(specs) => Some(specs),
            _ => None,
        })
        .flatten()
        .filter_map(|spec| match spec {
            AfSpecBridge::VlanInfo(info) => Some(VlanEntry {
                vid: info.vid,
                pvid: info.flags.contains(BridgeVlanInfoFlags::Pvid),
                untagged: info.flags.contains(BridgeVlanInfoFlags::Untagged),
            }),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rtnetlink::packet_route::link::{BridgeVlanInfo, InfoBridge, InfoData, LinkInfo};

    use super::*;

    fn link_infos(msg: &LinkMessage) -> &[LinkInfo] {
        msg.attributes
            .iter()
            .find_map(|a| match a {
                LinkAttribute::LinkInfo(infos) => Some(infos.as_slice()),
                _ => None,
            })
            .expect("IFLA_LINKINFO")
    }

    #[test]
    fn bridge_without_vlan_filtering_omits_the_attribute() {
        let msg = bridge_message("cni0", None, false);
        assert!(
            msg.attributes
                .contains(&LinkAttribute::IfName("cni0".into()))
        );
        assert!(
            !msg.attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::Mtu(_)))
        );
        assert_eq!(link_infos(&msg), &[LinkInfo::Kind(InfoKind::Bridge)]);
        assert_eq!(msg.header.flags.bits() & 1, 0, "created down");
    }

    #[test]
    fn bridge_with_vlan_filtering_and_mtu() {
        let msg = bridge_message("cni0", Some(1400), true);
        assert!(msg.attributes.contains(&LinkAttribute::Mtu(1400)));
        assert_eq!(
            link_infos(&msg),
            &[
                LinkInfo::Kind(InfoKind::Bridge),
                LinkInfo::Data(InfoData::Bridge(vec![InfoBridge::VlanFiltering(true)])),
            ]
        );
    }

    #[test]
    fn vlan_filtering_toggle_targets_the_index_with_bridge_kind() {
        let msg = vlan_filtering_message(7, false);
        assert_eq!(msg.header.index, 7);
        assert!(
            !msg.attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::IfName(_)))
        );
        assert_eq!(
            link_infos(&msg),
            &[
                LinkInfo::Kind(InfoKind::Bridge),
                LinkInfo::Data(InfoData::Bridge(vec![InfoBridge::VlanFiltering(false)])),
            ]
        );
    }

    #[test]
    fn port_vlan_is_bridge_family_master_side() {
        let msg = port_vlan_message(9, 10, true, true);
        assert_eq!(msg.header.interface_family, AddressFamily::Bridge);
        assert_eq!(msg.header.index, 9);
        let want = BridgeVlanInfo {
            vid: 10,
            flags: BridgeVlanInfoFlags::Pvid | BridgeVlanInfoFlags::Untagged,
        };
        assert_eq!(
            msg.attributes,
            vec![LinkAttribute::AfSpecBridge(vec![AfSpecBridge::VlanInfo(
                want
            )])],
            "no IFLA_BRIDGE_FLAGS: the kernel then applies it on the bridge (master) side"
        );
        assert_eq!(
            vlan_entries(&msg),
            vec![VlanEntry {
                vid: 10,
                pvid: true,
                untagged: true
            }]
        );
    }

    #[test]
    fn tagged_port_vlan_has_no_flags() {
        let msg = port_vlan_message(9, 20, false, false);
        assert_eq!(
            vlan_entries(&msg),
            vec![VlanEntry {
                vid: 20,
                pvid: false,
                untagged: false
            }]
        );
    }
}
