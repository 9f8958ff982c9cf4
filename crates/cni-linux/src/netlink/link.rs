//! Links: lookup, listing, generic attribute changes (up/down, MAC, MTU,
//! promiscuous mode, controller) and deletion.

use std::fmt;

use futures::TryStreamExt;
use rtnetlink::LinkUnspec;
use rtnetlink::packet_route::link::{
    InfoBridge, InfoBridgePort, InfoData, InfoPortData, InfoPortKind, LinkAttribute, LinkFlags,
    LinkInfo, LinkMessage, State,
};

use super::{Netlink, collect, exec};
use crate::error::{Error, Result};
use crate::mac::MacAddr;

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
}

/// Flags of a bridge port that the bridge plugin manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BridgePort {
    /// Hairpin (reflective relay) mode.
    pub hairpin: bool,
    /// Port isolation.
    pub isolated: bool,
}

/// Operational state of a link; prints like Go's `netlink.LinkOperState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperState {
    /// Unknown (e.g. `lo`, a bridge without ports).
    Unknown,
    /// Some component is missing.
    NotPresent,
    /// Down.
    Down,
    /// Down because the lower layer (e.g. veth peer) is down.
    LowerLayerDown,
    /// In test mode.
    Testing,
    /// Waiting for an external event.
    Dormant,
    /// Up and able to pass packets.
    Up,
    /// A value this crate does not know.
    Other(u8),
}

impl From<State> for OperState {
    fn from(state: State) -> Self {
        match state {
            State::Unknown => Self::Unknown,
            State::NotPresent => Self::NotPresent,
            State::Down => Self::Down,
            State::LowerLayerDown => Self::LowerLayerDown,
            State::Testing => Self::Testing,
            State::Dormant => Self::Dormant,
            State::Up => Self::Up,
            State::Other(v) => Self::Other(v),
            _ => Self::Other(u8::MAX),
        }
    }
}

impl fmt::Display for OperState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown => f.write_str("unknown"),
            Self::NotPresent => f.write_str("notpresent"),
            Self::Down => f.write_str("down"),
            Self::LowerLayerDown => f.write_str("lowerlayerdown"),
            Self::Testing => f.write_str("testing"),
            Self::Dormant => f.write_str("dormant"),
            Self::Up => f.write_str("up"),
            Self::Other(v) => write!(f, "unknown state ({v})"),
        }
    }
}

impl Link {
    /// Decodes an RTM_NEWLINK message.
    pub(crate) fn from_message(msg: &LinkMessage) -> Self {
        let mut link = Self {
            index: msg.header.index,
            name: String::new(),
            mac: None,
            mtu: 0,
            kind: None,
            controller: None,
            up: msg.header.flags.contains(LinkFlags::Up),
            oper_state: OperState::Unknown,
            promisc: msg.header.flags.contains(LinkFlags::Promisc),
            peer_index: None,
            link_netnsid: None,
            vlan_filtering: None,
            bridge_port: None,
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(name) => link.name.clone_from(name),
                LinkAttribute::Address(bytes) => link.mac = MacAddr::from_slice(bytes),
                LinkAttribute::Mtu(mtu) => link.mtu = *mtu,
                LinkAttribute::Controller(idx) if *idx != 0 => link.controller = Some(*idx),
                LinkAttribute::OperState(state) => link.oper_state = (*state).into(),
                LinkAttribute::Link(idx) if *idx != 0 => link.peer_index = Some(*idx),
                LinkAttribute::LinkNetNsId(id) => link.link_netnsid = Some(*id),
                LinkAttribute::LinkInfo(infos) => link.apply_link_info(infos),
                _ => {}
            }
        }
        link
    }

    fn apply_link_info(&mut self, infos: &[LinkInfo]) {
        let mut bridge_port = false;
        for info in infos {
            match info {
                LinkInfo::Kind(kind) => self.kind = Some(kind.to_string()),
                LinkInfo::Data(InfoData::Bridge(opts)) => {
                    self.vlan_filtering = opts.iter().find_map(|o| match o {
                        InfoBridge::VlanFiltering(on) => Some(*on),
                        _ => None,
                    });
                }
                LinkInfo::PortKind(InfoPortKind::Bridge) => bridge_port = true,
                LinkInfo::PortData(InfoPortData::BridgePort(opts)) => {
                    self.bridge_port = Some(port_flags(opts));
                }
                _ => {}
            }
        }
        if bridge_port && self.bridge_port.is_none() {
            self.bridge_port = Some(BridgePort::default());
        }
    }
}

fn port_flags(opts: &[InfoBridgePort]) -> BridgePort {
    let mut port = BridgePort::default();
    for opt in opts {
        match opt {
            InfoBridgePort::HairpinMode(on) => port.hairpin = *on,
            InfoBridgePort::Isolated(on) => port.isolated = *on,
            _ => {}
        }
    }
    port
}

impl Netlink {
    /// Looks a link up by name; `Ok(None)` if there is none.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        let request = self.handle.link().get().match_name(name).execute();
        first_link(request, || format!("failed to look up link {name:?}")).await
    }

    /// Looks a link up by index; `Ok(None)` if there is none.
    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        let request = self.handle.link().get().match_index(index).execute();
        first_link(request, || format!("failed to look up link #{index}")).await
    }

    /// Looks a link up by name; a missing link is an `Error::LinkNotFound`.
    pub async fn require_link(&self, name: &str) -> Result<Link> {
        self.link_by_name(name)
            .await?
            .ok_or_else(|| Error::LinkNotFound {
                name: name.to_owned(),
            })
    }

    /// Lists every link in the netns.
    pub async fn links(&self) -> Result<Vec<Link>> {
        let messages = collect(self.handle.link().get().execute(), || {
            "failed to list links".to_owned()
        })
        .await?;
        Ok(messages.iter().map(Link::from_message).collect())
    }

    /// Sets a link administratively up.
    pub async fn set_up(&self, index: u32) -> Result<()> {
        self.change(LinkUnspec::new_with_index(index).up().build(), || {
            format!("failed to set link #{index} up")
        })
        .await
    }

    /// Sets a link administratively down.
    pub async fn set_down(&self, index: u32) -> Result<()> {
        self.change(LinkUnspec::new_with_index(index).down().build(), || {
            format!("failed to set link #{index} down")
        })
        .await
    }

    /// Turns promiscuous mode on or off.
    pub async fn set_promisc(&self, index: u32, on: bool) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).promiscuous(on).build();
        self.change(msg, || {
            format!("failed to set promiscuous mode {on} on link #{index}")
        })
        .await
    }

    /// Sets the hardware address.
    pub async fn set_mac(&self, index: u32, mac: MacAddr) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index)
            .address(mac.octets().to_vec())
            .build();
        self.change(msg, || format!("failed to set MAC {mac} on link #{index}"))
            .await
    }

    /// Sets the MTU.
    pub async fn set_mtu(&self, index: u32, mtu: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).mtu(mtu).build();
        self.change(msg, || format!("failed to set MTU {mtu} on link #{index}"))
            .await
    }

    /// Makes a link a port of `controller` (a bridge).
    pub async fn set_controller(&self, index: u32, controller: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index)
            .controller(controller)
            .build();
        self.change(msg, || {
            format!("failed to attach link #{index} to bridge #{controller}")
        })
        .await
    }

    /// Detaches a link from its controller.
    pub async fn unset_controller(&self, index: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).nocontroller().build();
        self.change(msg, || format!("failed to detach link #{index}"))
            .await
    }

    /// Deletes a link (for a veth, the peer goes with it).
    pub async fn delete_link(&self, index: u32) -> Result<()> {
        exec(self.handle.link().del(index).execute(), || {
            format!("failed to delete link #{index}")
        })
        .await
    }

    /// Deletes a link by name; `Ok(false)` if it did not exist.
    pub async fn delete_link_by_name(&self, name: &str) -> Result<bool> {
        // One request: the kernel resolves the name itself (no lookup round trip).
        let mut request = self.handle.link().del(0);
        request
            .message_mut()
            .attributes
            .push(LinkAttribute::IfName(name.to_owned()));
        let deleted = exec(request.execute(), || {
            format!("failed to delete link {name:?}")
        })
        .await;
        match deleted {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// RTM_NEWLINK without create flags is how `ip link set` changes a link.
    async fn change(&self, msg: LinkMessage, context: impl FnOnce() -> String) -> Result<()> {
        exec(self.handle.link().change(msg).execute(), context).await
    }
}

/// Takes the single answer of a non-dump GETLINK, mapping ENODEV to `None`.
async fn first_link<S>(stream: S, context: impl FnOnce() -> String) -> Result<Option<Link>>
where
    S: futures::Stream<Item = std::result::Result<LinkMessage, rtnetlink::Error>>,
{
    futures::pin_mut!(stream);
    match stream.try_next().await {
        Ok(msg) => Ok(msg.as_ref().map(Link::from_message)),
        Err(e) => {
            let err = Error::netlink(context(), e);
            if err.is_not_found() {
                Ok(None)
            } else {
                Err(err)
            }
        }
    }
}
