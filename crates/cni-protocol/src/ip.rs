//! Go-style parsing of IP addresses and CIDRs, the way the reference plugins read
//! them (`net.ParseIP` + `To4`, `net.ParseCIDR`): the suite's one IP parser, used for
//! results, configs and host-local's ranges and store. Also addresses as integers, the
//! one arithmetic the suite does on them (ranges, CIDR merging, policy boxes).

use ipnetwork::IpNetwork;
use std::net::IpAddr;

/// An IP address family: the one definition the netlink layer (to filter dumps)
/// and the firewall (iptables or ip6tables) share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// Both families, IPv4 first.
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The family of an address.
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }
}

/// Go's `To4()`: an IPv4-mapped IPv6 address is IPv4. The reference canonicalises
/// addresses this way, so `::ffff:10.0.0.5` and `10.0.0.5` are the same address.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Parses an address the way Go's `net.ParseIP` + `To4` does.
pub fn parse_ip(text: &str) -> Option<IpAddr> {
    text.parse().ok().map(canonical_ip)
}

/// `ip/prefix` with Go's `net.ParseCIDR` syntax: the prefix is decimal digits only and
/// at most the width of the address as written (so up to 128 for an IPv4-mapped IPv6
/// address). Returns the address as written, host bits kept, and the prefix.
pub fn parse_cidr_text(text: &str) -> Option<(IpAddr, u8)> {
    let (ip, prefix) = text.split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    let width = if ip.is_ipv4() { 32 } else { 128 };
    (prefix <= width).then_some((ip, prefix))
}

/// Parses `ip/prefix` keeping host bits (like Go's `ParseCIDR` + IP); an IPv4-mapped
/// IPv6 address becomes IPv4, as Go does.
pub fn parse_cidr(text: &str) -> Option<IpNetwork> {
    let (ip, prefix) = parse_cidr_text(text)?;
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) if prefix >= 96 => IpNetwork::new(v4.into(), prefix - 96).ok(),
            _ => IpNetwork::new(ip, prefix).ok(),
        },
        v4 => IpNetwork::new(v4, prefix).ok(),
    }
}

/// The subnet an address belongs to: its network address with the same prefix
/// (`10.1.2.3/24` gives `10.1.2.0/24`).
pub fn subnet_of(net: IpNetwork) -> IpNetwork {
    // Cannot fail: the prefix is that of a valid network of the same family.
    IpNetwork::new(net.network(), net.prefix()).unwrap_or(net)
}

/// An address as a number; IPv4 uses the low 32 bits.
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address `n` of the given family; an IPv4 `n` beyond 32 bits is
/// 255.255.255.255.
pub fn from_u128(n: u128, v4: bool) -> IpAddr {
    if v4 {
        IpAddr::from(u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes())
    } else {
        IpAddr::from(n.to_be_bytes())
    }
}

/// The first and last address of a CIDR, as numbers ([`to_u128`]).
pub fn bounds(cidr: IpNetwork) -> (u128, u128) {
    let width = if cidr.is_ipv4() { 32 } else { 128 };
    let start = to_u128(cidr.network());
    let host_bits = width - u32::from(cidr.prefix());
    let span = if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    (start, start | span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_syntax_is_gos() {
        assert_eq!(
            parse_cidr_text("10.0.0.5/24"),
            Some(("10.0.0.5".parse().unwrap(), 24))
        );
        assert_eq!(
            parse_cidr_text("::ffff:10.0.0.5/120"),
            Some(("::ffff:10.0.0.5".parse().unwrap(), 120))
        );
        for bad in [
            "10.0.0.5",
            "10.0.0.5/",
            "10.0.0.5/+24",
            "10.0.0.5/33",
            "x/24",
            "::/129",
        ] {
            assert_eq!(parse_cidr_text(bad), None, "{bad}");
        }
    }

    #[test]
    fn addresses_are_canonical() {
        assert_eq!(parse_ip("::ffff:10.0.0.5"), "10.0.0.5".parse().ok());
        assert_eq!(parse_ip("fd00::5"), "fd00::5".parse().ok());
        assert_eq!(parse_ip("10.0.0"), None);
    }

    #[test]
    fn subnet_of_drops_host_bits() {
        let net = parse_cidr("10.1.2.3/24").unwrap();
        assert_eq!(subnet_of(net).to_string(), "10.1.2.0/24");
        let net = parse_cidr("fd00::1:5/112").unwrap();
        assert_eq!(subnet_of(net).to_string(), "fd00::1:0/112");
    }

    #[test]
    fn addresses_as_numbers_round_trip_and_bound_whole_families() {
        for text in ["10.1.2.3", "0.0.0.0", "255.255.255.255", "fd00::5", "::"] {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(from_u128(to_u128(ip), ip.is_ipv4()), ip);
        }
        assert_eq!(from_u128(1 << 40, true), IpAddr::from([255, 255, 255, 255]));
        let net = |text: &str| text.parse::<IpNetwork>().unwrap();
        assert_eq!(bounds(net("0.0.0.0/0")), (0, u128::from(u32::MAX)));
        assert_eq!(bounds(net("::/0")), (0, u128::MAX));
        assert_eq!(bounds(net("10.0.0.0/31")), (0x0a00_0000, 0x0a00_0001));
        assert_eq!(bounds(net("10.0.0.7/32")), (0x0a00_0007, 0x0a00_0007));
    }
}
