//! IP addresses on links: list, add, delete.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;
use rtnetlink::AddressMessageBuilder;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};

use super::{Family, Netlink, collect, exec};
use crate::error::Result;

/// An address on a link, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    /// Address with its prefix length; host bits are kept (`10.0.0.5/24`).
    pub ip: IpNetwork,
    /// Index of the link it is on.
    pub index: u32,
    /// Scope (0 universe, 200 site, 253 link, 254 host).
    pub scope: u8,
    /// IFA_F_* flags.
    pub flags: u32,
}

impl Address {
    /// IPv6 duplicate address detection is still running.
    pub fn is_tentative(&self) -> bool {
        self.flags & AddressFlags::Tentative.bits() != 0
    }

    /// IPv6 duplicate address detection found a duplicate.
    pub fn is_dad_failed(&self) -> bool {
        self.flags & AddressFlags::Dadfailed.bits() != 0
    }

    /// Scope universe: the address is routable beyond this host and link.
    pub fn is_global(&self) -> bool {
        self.scope == 0
    }

    fn from_message(msg: &AddressMessage) -> Option<Self> {
        // For IPv4, IFA_LOCAL is the interface's own address and IFA_ADDRESS
        // the peer on point-to-point links; IPv6 only sends IFA_ADDRESS.
        let mut local = None;
        let mut address = None;
        let mut flags = u32::from(msg.header.flags.bits());
        for attr in &msg.attributes {
            match attr {
                AddressAttribute::Local(ip) => local = Some(*ip),
                AddressAttribute::Address(ip) => address = Some(*ip),
                AddressAttribute::Flags(f) => flags = f.bits(),
                _ => {}
            }
        }
        let ip = IpNetwork::new(local.or(address)?, msg.header.prefix_len).ok()?;
        Some(Self {
            ip,
            index: msg.header.index,
            scope: msg.header.scope.into(),
            flags,
        })
    }
}

impl Netlink {
    /// Lists the addresses on a link, optionally of one family only.
    pub async fn addresses(&self, index: u32, family: Option<Family>) -> Result<Vec<Address>> {
        let mut request = self.handle.address().get().set_link_index_filter(index);
        if let Some(family) = family {
            request.message_mut().header.family = match family {
                Family::V4 => AddressFamily::Inet,
                Family::V6 => AddressFamily::Inet6,
            };
        }
        let messages = collect(request.execute(), || {
            format!("failed to list addresses of link #{index}")
        })
        .await?;
        Ok(messages
            .iter()
            .filter_map(Address::from_message)
            .filter(|a| family.is_none_or(|f| Family::of(a.ip.ip()) == f))
            .collect())
    }

    /// Adds an address (with broadcast for IPv4); fails with `is_exists()` if present.
    pub async fn add_address(&self, index: u32, ip: IpNetwork) -> Result<()> {
        let request = self.handle.address().add(index, ip.ip(), ip.prefix());
        exec(request.execute(), || {
            format!("failed to add address {ip} to link #{index}")
        })
        .await
    }

    /// Deletes an address; fails with `is_not_found()` if it is not there.
    pub async fn del_address(&self, index: u32, ip: IpNetwork) -> Result<()> {
        let msg = match ip.ip() {
            IpAddr::V4(v4) => v4_message(index, v4, ip.prefix()),
            IpAddr::V6(v6) => v6_message(index, v6, ip.prefix()),
        };
        exec(self.handle.address().del(msg).execute(), || {
            format!("failed to delete address {ip} from link #{index}")
        })
        .await
    }
}

fn v4_message(index: u32, ip: Ipv4Addr, prefix: u8) -> AddressMessage {
    AddressMessageBuilder::<Ipv4Addr>::new()
        .index(index)
        .address(ip, prefix)
        .build()
}

fn v6_message(index: u32, ip: Ipv6Addr, prefix: u8) -> AddressMessage {
    AddressMessageBuilder::<Ipv6Addr>::new()
        .index(index)
        .address(ip, prefix)
        .build()
}
