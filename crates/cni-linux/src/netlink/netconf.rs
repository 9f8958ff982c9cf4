//! Per-namespace IP configuration over netlink (`RTM_GETNETCONF`): whether
//! forwarding is on, without a lookup under `/proc/sys/net`, whose cost grows
//! with the number of network namespaces on the node (each registers its own
//! entries there).

use cni_netlink::wire::{NLM_F_ACK, NLM_F_REQUEST, attrs, i32_ne};
use cni_netlink::{Malformed, Writer};

use super::rtnl::{AF_INET, AF_INET6};
use super::{Family, Netlink};
use crate::error::{Error, Result};

pub(super) const RTM_NEWNETCONF: u16 = 80;
const RTM_GETNETCONF: u16 = 82;
const NETCONFA_IFINDEX: u16 = 1;
const NETCONFA_FORWARDING: u16 = 2;
/// The `all` entry: `net.ipv4.conf.all` (whose forwarding is `net.ipv4.ip_forward`)
/// or `net.ipv6.conf.all`.
const NETCONFA_IFINDEX_ALL: i32 = -1;

/// `struct netconfmsg` (one family byte, padded to 4) and the interface index.
fn get_netconf(w: &mut Writer, family: u8, index: i32) {
    w.bytes(&[family, 0, 0, 0]);
    w.attr_i32(NETCONFA_IFINDEX, index);
}

impl Netlink {
    /// Whether forwarding is on for `family` in this namespace: the value of
    /// `net.ipv4.ip_forward` or `net.ipv6.conf.all.forwarding`.
    pub fn forwarding(&self, family: Family) -> Result<bool> {
        let af = match family {
            Family::V4 => AF_INET,
            Family::V6 => AF_INET6,
        };
        let context = || format!("failed to read the {family:?} forwarding setting");
        let mut forwarding = None;
        self.request(
            RTM_GETNETCONF,
            NLM_F_REQUEST | NLM_F_ACK,
            |w| get_netconf(w, af, NETCONFA_IFINDEX_ALL),
            |msg| {
                if msg.ty == RTM_NEWNETCONF {
                    forwarding = forwarding_of(msg.payload)?.or(forwarding);
                }
                Ok(())
            },
            context,
        )?;
        forwarding.ok_or_else(|| {
            Error::netlink(
                context(),
                cni_netlink::Malformed("netconf answer without NETCONFA_FORWARDING").into(),
            )
        })
    }
}

/// Decodes an RTM_NEWNETCONF message (payload after the netlink header): its
/// forwarding setting, `None` when it has none.
pub(super) fn forwarding_of(payload: &[u8]) -> std::result::Result<Option<bool>, Malformed> {
    let mut forwarding = None;
    for attr in attrs(payload.get(4..).unwrap_or_default()) {
        let (ty, value) = attr?;
        if ty == NETCONFA_FORWARDING {
            forwarding = Some(i32_ne(value)? != 0);
        }
    }
    Ok(forwarding)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::{hex, message};

    #[test]
    fn the_request_is_what_ip_netconf_show_sends() {
        // `ip -4 netconf show dev lo` and `ip -6 ...`, strace'd (seq 0 there).
        let v4 = message(RTM_GETNETCONF, NLM_F_REQUEST | NLM_F_ACK, |w| {
            get_netconf(w, AF_INET, 1)
        });
        assert_eq!(
            v4,
            hex("1c000000 5200 0500 01000000 00000000 02000000 08000100 01000000")
        );
        let v6 = message(RTM_GETNETCONF, NLM_F_REQUEST | NLM_F_ACK, |w| {
            get_netconf(w, AF_INET6, NETCONFA_IFINDEX_ALL)
        });
        assert_eq!(
            v6,
            hex("1c000000 5200 0500 01000000 00000000 0a000000 08000100 ffffffff")
        );
    }
}
