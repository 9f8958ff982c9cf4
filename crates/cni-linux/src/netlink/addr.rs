//! IP addresses on links: list, add, delete.

use std::net::IpAddr;

use cni_netlink::wire::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, attrs, u32_ne,
};
use cni_netlink::{Malformed, Writer};
use ipnetwork::IpNetwork;

use super::rtnl::{
    AF_INET, AF_INET6, AF_UNSPEC, IFA_ADDRESS, IFA_BROADCAST, IFA_F_DADFAILED, IFA_F_NODAD,
    IFA_F_TENTATIVE, IFA_FLAGS, IFA_LOCAL, IfAddr, RTM_DELADDR, RTM_GETADDR, RTM_NEWADDR, ip_bytes,
    ip_value,
};
use super::{Family, Netlink};
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
        self.flags & IFA_F_TENTATIVE != 0
    }

    /// IPv6 duplicate address detection found a duplicate.
    pub fn is_dad_failed(&self) -> bool {
        self.flags & IFA_F_DADFAILED != 0
    }

    /// Added without duplicate address detection (IFA_F_NODAD, `nodad` in `ip addr`).
    pub fn skips_dad(&self) -> bool {
        self.flags & IFA_F_NODAD != 0
    }

    /// Scope universe: the address is routable beyond this host and link.
    pub fn is_global(&self) -> bool {
        self.scope == 0
    }

    /// Decodes an RTM_NEWADDR message; `None` for one without an address.
    pub(super) fn parse(payload: &[u8]) -> std::result::Result<Option<Self>, Malformed> {
        let (header, attributes) = IfAddr::parse(payload)?;
        // For IPv4, IFA_LOCAL is the interface's own address and IFA_ADDRESS
        // the peer on point-to-point links; IPv6 only sends IFA_ADDRESS.
        let mut local = None;
        let mut address = None;
        let mut flags = u32::from(header.flags);
        for attr in attrs(attributes) {
            let (ty, v) = attr?;
            match ty {
                IFA_LOCAL => local = Some(ip_value(header.family, v)?),
                IFA_ADDRESS => address = Some(ip_value(header.family, v)?),
                IFA_FLAGS => flags = u32_ne(v)?,
                _ => {}
            }
        }
        let Some(ip) = local.or(address) else {
            return Ok(None);
        };
        let ip = IpNetwork::new(ip, header.prefix_len)
            .map_err(|_| Malformed("address prefix length out of range"))?;
        Ok(Some(Self {
            ip,
            index: header.index,
            scope: header.scope,
            flags,
        }))
    }
}

/// How [`Netlink::add_address_with`] adds an address; the default is what
/// [`Netlink::add_address`] (and `ip addr add`) does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddressOptions {
    /// Skip IPv6 duplicate address detection (IFA_F_NODAD, `ip addr add ... nodad`): the
    /// address is usable at once instead of tentative for a second or two. Only for an
    /// address the caller owns on a link it owns (the bridge plugin's gateway address,
    /// from its own range, on its own bridge), where no other holder can exist to be
    /// detected. IPv4 has no DAD: the flag is not sent for it.
    pub skip_dad: bool,
}

impl AddressOptions {
    /// An address that is usable at once: see [`AddressOptions::skip_dad`].
    pub const NO_DAD: Self = Self { skip_dad: true };

    /// The `ifa_flags` of the request for `ip`.
    fn flags_for(self, ip: IpNetwork) -> u8 {
        if self.skip_dad && ip.is_ipv6() {
            // IFA_F_NODAD fits the header's 8 bits, where `ip addr add ... nodad` puts
            // it too; the kernel reads the header when there is no IFA_FLAGS attribute.
            IFA_F_NODAD as u8
        } else {
            0
        }
    }
}

impl Netlink {
    /// Lists the addresses on a link, optionally of one family only.
    pub fn addresses(&self, index: u32, family: Option<Family>) -> Result<Vec<Address>> {
        self.addresses_where(Some(index), family)
    }

    /// Lists the addresses of every link, optionally of one family only.
    pub fn all_addresses(&self, family: Option<Family>) -> Result<Vec<Address>> {
        self.addresses_where(None, family)
    }

    fn addresses_where(&self, index: Option<u32>, family: Option<Family>) -> Result<Vec<Address>> {
        let mut found = Vec::new();
        self.request(
            RTM_GETADDR,
            NLM_F_REQUEST | NLM_F_DUMP,
            |w| {
                IfAddr {
                    family: match family {
                        None => AF_UNSPEC,
                        Some(Family::V4) => AF_INET,
                        Some(Family::V6) => AF_INET6,
                    },
                    ..IfAddr::default()
                }
                .write(w);
            },
            |msg| {
                if msg.ty != RTM_NEWADDR {
                    return Ok(());
                }
                // Without strict checking the kernel dumps every link's addresses.
                let wanted = |a: &Address| {
                    index.is_none_or(|i| a.index == i)
                        && family.is_none_or(|f| Family::of(a.ip.ip()) == f)
                };
                found.extend(Address::parse(msg.payload)?.filter(wanted));
                Ok(())
            },
            || match index {
                Some(index) => format!("failed to list addresses of link #{index}"),
                None => "failed to list addresses".to_owned(),
            },
        )?;
        Ok(found)
    }

    /// Adds an address (with broadcast for IPv4); fails with `is_exists()` if present.
    pub fn add_address(&self, index: u32, ip: IpNetwork) -> Result<()> {
        self.add_address_with(index, ip, AddressOptions::default())
    }

    /// [`Netlink::add_address`] with [`AddressOptions`]; an address already present
    /// fails with `is_exists()` and is left as it is, its flags included.
    pub fn add_address_with(
        &self,
        index: u32,
        ip: IpNetwork,
        options: AddressOptions,
    ) -> Result<()> {
        self.exec(
            RTM_NEWADDR,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE,
            |w| address_message(w, index, ip, options.flags_for(ip)),
            || format!("failed to add address {ip} to link #{index}"),
        )
    }

    /// Deletes an address; fails with `is_not_found()` if it is not there.
    pub fn del_address(&self, index: u32, ip: IpNetwork) -> Result<()> {
        self.exec(
            RTM_DELADDR,
            NLM_F_REQUEST | NLM_F_ACK,
            |w| address_message(w, index, ip, 0),
            || format!("failed to delete address {ip} from link #{index}"),
        )
    }
}

/// `ip addr add <ip> dev #<index>`, plus `brd +` for IPv4 prefixes below /31; `flags`
/// are the header's IFA_F_* bits.
fn address_message(w: &mut Writer, index: u32, ip: IpNetwork, flags: u8) {
    let (family, bytes) = ip_bytes(ip.ip());
    IfAddr {
        family,
        prefix_len: ip.prefix(),
        flags,
        index,
        ..IfAddr::default()
    }
    .write(w);
    w.attr(IFA_LOCAL, &bytes);
    w.attr(IFA_ADDRESS, &bytes);
    match ip.ip() {
        IpAddr::V4(v4) if ip.prefix() < 31 => {
            let host_bits = u32::MAX >> ip.prefix();
            let broadcast = u32::from(v4) | host_bits;
            w.attr(IFA_BROADCAST, &broadcast.to_be_bytes());
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::{hex, message};

    #[test]
    fn ipv4_address_is_what_ip_addr_add_sends_with_broadcast() {
        // `ip addr add 10.0.0.5/24 dev cni0` (#5), strace'd, then IFA_BROADCAST
        // 10.0.0.255 as `brd +` adds it.
        let got = message(RTM_NEWADDR, 0x605, |w| {
            address_message(w, 5, "10.0.0.5/24".parse().unwrap(), 0)
        });
        let want = hex("30000000 1400 0506 01000000 00000000 \
             02180000 05000000 \
             08000200 0a000005 \
             08000100 0a000005 \
             08000400 0a0000ff");
        assert_eq!(got, want);
        let point_to_point = message(RTM_DELADDR, 0x5, |w| {
            address_message(w, 5, "10.0.0.5/31".parse().unwrap(), 0)
        });
        assert_eq!(point_to_point.len(), 0x28, "no broadcast on a /31");
    }

    #[test]
    fn ipv6_address_is_what_ip_addr_add_sends() {
        let got = message(RTM_NEWADDR, 0x605, |w| {
            address_message(w, 5, "fd00::1/64".parse().unwrap(), 0)
        });
        let want = hex("40000000 1400 0506 01000000 00000000 \
             0a400000 05000000 \
             14000200 fd000000 00000000 00000000 00000001 \
             14000100 fd000000 00000000 00000000 00000001");
        assert_eq!(got, want);
    }

    #[test]
    fn an_address_without_dad_is_what_ip_addr_add_nodad_sends() {
        // `ip addr add fd00::1/64 dev cni0 nodad` (#5): IFA_F_NODAD in the header.
        let ip: IpNetwork = "fd00::1/64".parse().unwrap();
        let got = message(RTM_NEWADDR, 0x605, |w| {
            address_message(w, 5, ip, AddressOptions::NO_DAD.flags_for(ip))
        });
        let want = hex("40000000 1400 0506 01000000 00000000 \
             0a400200 05000000 \
             14000200 fd000000 00000000 00000000 00000001 \
             14000100 fd000000 00000000 00000000 00000001");
        assert_eq!(got, want);
        // IPv4 has no DAD: the request is the plain one.
        let v4: IpNetwork = "10.0.0.1/24".parse().unwrap();
        assert_eq!(AddressOptions::NO_DAD.flags_for(v4), 0);
        assert_eq!(AddressOptions::default().flags_for(ip), 0);
    }

    #[test]
    fn a_dumped_address_decodes_with_its_flags() {
        let mut w = Writer::new();
        IfAddr {
            family: AF_INET6,
            prefix_len: 64,
            flags: 0x80,
            scope: 0,
            index: 3,
        }
        .write(&mut w);
        w.attr(
            IFA_ADDRESS,
            &"fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets(),
        );
        w.attr(99, b"unknown, skipped");
        w.attr_u32(IFA_FLAGS, IFA_F_TENTATIVE | 0x100);
        let a = Address::parse(w.as_bytes()).unwrap().unwrap();
        assert_eq!(a.ip, "fd00::2/64".parse::<IpNetwork>().unwrap());
        assert_eq!(a.index, 3);
        assert!(a.is_tentative() && !a.is_dad_failed() && !a.skips_dad() && a.is_global());
        // An IPv6 address attribute of 15 bytes, a prefix of 200, a cut header.
        let mut bad = w.as_bytes()[..8].to_vec();
        bad.extend_from_slice(&[19, 0, 1, 0]);
        bad.extend_from_slice(&[0; 16]);
        assert!(Address::parse(&bad).is_err());
        let mut wide = w.as_bytes().to_vec();
        wide[1] = 200;
        assert!(Address::parse(&wide).is_err());
        assert!(Address::parse(&w.as_bytes()[..7]).is_err());
    }
}
