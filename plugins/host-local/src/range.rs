//! Ranges and range sets: canonicalisation with the reference's defaults and messages,
//! containment, overlap, capacity, and the round-robin iterator.
//!
//! Addresses are handled as `u128` with a family flag, so IPv4 and IPv6 share one code
//! path (as the reference does with 16-byte `net.IP`s) and a /64 is as cheap as a /24.

use crate::error::{Error, Result};
pub use cni_protocol::ip::{from_u128, to_u128};
use ipnetwork::IpNetwork;
use std::fmt;
use std::net::IpAddr;

// Go's `To4()` and `net.ParseIP`: `::ffff:10.0.0.5` and `10.0.0.5` are the same
// reservation.
pub use cni_protocol::ip::{canonical_ip, parse_ip};

/// One canonicalised range: every field is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The subnet (network address, prefix length).
    pub subnet: IpNetwork,
    /// First allocatable address (inclusive).
    pub start: IpAddr,
    /// Last allocatable address (inclusive).
    pub end: IpAddr,
    /// The gateway returned with addresses of this range; never allocated.
    pub gateway: IpAddr,
}

/// A range as written in config, before canonicalisation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSpec {
    /// `subnet` text (required).
    pub subnet: Option<String>,
    /// `rangeStart` text.
    pub range_start: Option<String>,
    /// `rangeEnd` text.
    pub range_end: Option<String>,
    /// `gateway` text.
    pub gateway: Option<String>,
}

/// Go's `net.IP` JSON decoding: empty text is "unset", anything unparsable is an error
/// with the reference's wording.
fn optional_ip(text: Option<&String>) -> Result<Option<IpAddr>> {
    match text.map(String::as_str) {
        None | Some("") => Ok(None),
        Some(t) => parse_ip(t)
            .map(Some)
            .ok_or_else(|| Error::Invalid(format!("invalid IP address: {t}"))),
    }
}

/// The subnet as the reference holds it: address with host bits as written, prefix, and
/// whether the text was an IPv4-mapped IPv6 address (Go then has a 4-byte IP with a
/// 16-byte mask).
fn parse_subnet(text: Option<&String>) -> Result<(IpAddr, u8, bool)> {
    let Some(text) = text.filter(|t| !t.is_empty()) else {
        // The zero `types.IPNet`: canonicalizeIP fails on a nil IP.
        return Err(Error::Invalid("IP <nil> not v4 nor v6".into()));
    };
    let (ip, prefix) = cni_protocol::ip::parse_cidr_text(text)
        .ok_or_else(|| Error::Invalid(format!("invalid CIDR address: {text}")))?;
    let mapped = matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some());
    Ok((canonical_ip(ip), prefix, mapped))
}

fn bits(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// The network mask of `prefix` within `width` bits, as a number.
fn mask(prefix: u8, width: u8) -> u128 {
    let all = if width == 32 {
        u128::from(u32::MAX)
    } else {
        u128::MAX
    };
    all & !all.checked_shr(u32::from(prefix)).unwrap_or(0)
}

impl Range {
    /// Canonicalises a config range (reference `Range.Canonicalize`, HEAD): validates the
    /// subnet and fills in `gateway` (network + 1), `rangeStart` (network + 1) and
    /// `rangeEnd` (last address; minus one for IPv4, which excludes the broadcast).
    pub fn canonicalize(spec: &RangeSpec) -> Result<Self> {
        let (ip, prefix, mapped) = parse_subnet(spec.subnet.as_ref())?;
        let mask_width = if mapped { 128 } else { bits(ip) };
        if prefix > mask_width - 2 {
            return Err(Error::Invalid(format!(
                "Network {ip}/{prefix} too small to allocate from"
            )));
        }
        if mapped {
            return Err(Error::Invalid("IPNet IP and Mask version mismatch".into()));
        }
        let width = bits(ip);
        let v4 = ip.is_ipv4();
        let m = mask(prefix, width);
        let network = to_u128(ip) & m;
        if network != to_u128(ip) {
            return Err(Error::Invalid(format!(
                "Network has host bits set. For a subnet mask of length {prefix} the network address is {}",
                from_u128(network, v4)
            )));
        }
        let subnet = IpNetwork::new(from_u128(network, v4), prefix)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let broadcast = network | (!m & mask(width, width));
        let mut range = Range {
            subnet,
            start: from_u128(network + 1, v4),
            end: from_u128(if v4 { broadcast - 1 } else { broadcast }, v4),
            gateway: optional_ip(spec.gateway.as_ref())?.unwrap_or(from_u128(network + 1, v4)),
        };
        if let Some(start) = optional_ip(spec.range_start.as_ref())? {
            if !range.in_subnet(start) {
                return Err(Error::Invalid(format!(
                    "RangeStart {start} not in network {subnet}"
                )));
            }
            range.start = start;
        }
        if let Some(end) = optional_ip(spec.range_end.as_ref())? {
            // The reference tests rangeEnd with a Contains that already knows rangeStart,
            // so an end before the start reads "not in network" too.
            if !range.in_subnet(end) || to_u128(end) < to_u128(range.start) {
                return Err(Error::Invalid(format!(
                    "RangeEnd {end} not in network {subnet}"
                )));
            }
            range.end = end;
        }
        // Only a rangeStart past the default rangeEnd (an IPv4 broadcast address) gets
        // here. The reference accepts it, then hands out the broadcast address and walks
        // on past the subnet; there is nothing to allocate, so refuse it.
        if to_u128(range.start) > to_u128(range.end) {
            return Err(Error::Invalid(format!(
                "RangeStart {} is past the last usable address {} of network {subnet}",
                range.start, range.end
            )));
        }
        Ok(range)
    }

    /// Whether this is an IPv4 range.
    pub fn is_v4(&self) -> bool {
        self.subnet.is_ipv4()
    }

    fn in_subnet(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.is_v4() && self.subnet.contains(ip)
    }

    /// Reference `Range.Contains`: same family, in the subnet, within start..=end.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical_ip(ip);
        self.in_subnet(ip) && to_u128(ip) >= to_u128(self.start) && to_u128(ip) <= to_u128(self.end)
    }

    /// Reference `Range.Overlaps`: same family and an endpoint of one inside the other.
    pub fn overlaps(&self, other: &Range) -> bool {
        self.is_v4() == other.is_v4()
            && (self.contains(other.start)
                || self.contains(other.end)
                || other.contains(self.start)
                || other.contains(self.end))
    }

    /// Allocatable addresses: start..=end minus the gateway when it lies in there.
    /// Saturates at `u128::MAX` (an IPv6 /0).
    pub fn capacity(&self) -> u128 {
        let span = (to_u128(self.end) - to_u128(self.start)).saturating_add(1);
        span - u128::from(self.contains(self.gateway))
    }

    /// The address with this range's prefix length (host bits kept), for results.
    pub fn with_prefix(&self, ip: IpAddr) -> IpNetwork {
        IpNetwork::new(ip, self.subnet.prefix()).unwrap_or(self.subnet)
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// A pool of disjoint same-family ranges; one address is allocated per set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet(pub Vec<Range>);

impl RangeSet {
    /// Reference `RangeSet.Canonicalize`: non-empty, one family, no overlaps.
    pub fn canonicalize(specs: &[RangeSpec]) -> Result<Self> {
        if specs.is_empty() {
            return Err(Error::Invalid("empty range set".into()));
        }
        let mut ranges: Vec<Range> = Vec::with_capacity(specs.len());
        for spec in specs {
            let range = Range::canonicalize(spec)?;
            if ranges.first().is_some_and(|r| r.is_v4() != range.is_v4()) {
                return Err(Error::Invalid("mixed address families".into()));
            }
            ranges.push(range);
        }
        for (i, a) in ranges.iter().enumerate() {
            for b in &ranges[i + 1..] {
                if a.overlaps(b) {
                    return Err(Error::Invalid(format!("subnets {a} and {b} overlap")));
                }
            }
        }
        Ok(Self(ranges))
    }

    /// Whether the set is IPv4 (decided by its first range, as the reference does).
    pub fn is_v4(&self) -> bool {
        self.0.first().is_some_and(Range::is_v4)
    }

    /// The range holding `ip`, if any.
    pub fn range_for(&self, ip: IpAddr) -> Option<&Range> {
        self.0.iter().find(|r| r.contains(ip))
    }

    /// Whether any range holds `ip`.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some()
    }

    /// Whether `ip` is allocatable here: in a range and not that range's gateway.
    pub fn allocatable(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some_and(|r| r.gateway != ip)
    }

    /// Whether any range of one set overlaps any range of the other.
    pub fn overlaps(&self, other: &RangeSet) -> bool {
        self.0.iter().any(|a| other.0.iter().any(|b| a.overlaps(b)))
    }

    /// Allocatable addresses in the whole set (saturating).
    pub fn capacity(&self) -> u128 {
        self.0
            .iter()
            .fold(0u128, |sum, r| sum.saturating_add(r.capacity()))
    }

    /// The round-robin iterator starting after `last` (when it lies in the set), else at
    /// the first range's start.
    pub fn iter_from(&self, last: Option<IpAddr>) -> RangeIter<'_> {
        let last = last.map(canonical_ip);
        match last.and_then(|ip| self.0.iter().position(|r| r.contains(ip))) {
            Some(idx) => RangeIter {
                set: self,
                idx,
                cur: last.map(to_u128),
                start: None,
            },
            None => RangeIter {
                set: self,
                idx: 0,
                cur: None,
                start: self.0.first().map(|r| to_u128(r.start)),
            },
        }
    }
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// The reference's `RangeIter`: next address after the cursor, jumping from a range's end
/// to the next range's start (wrapping), skipping gateways, ending when it comes back to
/// where it started. Each address is yielded at most once.
#[derive(Debug, Clone)]
pub struct RangeIter<'a> {
    set: &'a RangeSet,
    idx: usize,
    cur: Option<u128>,
    start: Option<u128>,
}

impl Iterator for RangeIter<'_> {
    /// The address and the range it belongs to.
    type Item = (IpAddr, Range);

    fn next(&mut self) -> Option<Self::Item> {
        let ranges = &self.set.0;
        if ranges.is_empty() {
            return None;
        }
        loop {
            let mut r = ranges[self.idx];
            let v4 = r.is_v4();
            match self.cur {
                None => {
                    let first = to_u128(r.start);
                    self.cur = Some(first);
                    self.start = Some(first);
                }
                Some(cur) => {
                    let next = if cur == to_u128(r.end) {
                        self.idx = (self.idx + 1) % ranges.len();
                        r = ranges[self.idx];
                        to_u128(r.start)
                    } else {
                        cur + 1
                    };
                    self.cur = Some(next);
                    match self.start {
                        None => self.start = Some(next),
                        Some(s) if s == next => return None,
                        Some(_) => {}
                    }
                }
            }
            let ip = from_u128(self.cur.unwrap_or_default(), v4);
            if ip != r.gateway {
                return Some((ip, r));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(subnet: &str) -> RangeSpec {
        RangeSpec {
            subnet: Some(subnet.into()),
            ..RangeSpec::default()
        }
    }

    fn spec_full(subnet: &str, start: &str, end: &str, gw: &str) -> RangeSpec {
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
        RangeSpec {
            subnet: Some(subnet.into()),
            range_start: opt(start),
            range_end: opt(end),
            gateway: opt(gw),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn err(spec: &RangeSpec) -> String {
        Range::canonicalize(spec).unwrap_err().to_string()
    }

    #[test]
    fn v4_defaults() {
        let r = Range::canonicalize(&spec("10.9.0.0/24")).unwrap();
        assert_eq!(
            (r.start, r.end, r.gateway),
            (ip("10.9.0.1"), ip("10.9.0.254"), ip("10.9.0.1"))
        );
        assert_eq!(r.to_string(), "10.9.0.1-10.9.0.254");
        assert_eq!(r.capacity(), 253);
        let r = Range::canonicalize(&spec("10.8.0.0/30")).unwrap();
        assert_eq!(r.to_string(), "10.8.0.1-10.8.0.2");
        assert_eq!(r.capacity(), 1);
    }

    #[test]
    fn v6_defaults_for_a_64() {
        let r = Range::canonicalize(&spec("fd00:9::/64")).unwrap();
        assert_eq!(r.start, ip("fd00:9::1"));
        assert_eq!(r.end, ip("fd00:9::ffff:ffff:ffff:ffff"));
        assert_eq!(r.gateway, ip("fd00:9::1"));
        assert_eq!(r.capacity(), (1u128 << 64) - 2);
        let all = Range::canonicalize(&spec("::/0")).unwrap();
        assert_eq!(all.end, ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"));
        assert_eq!(all.capacity(), u128::MAX - 1);
    }

    #[test]
    fn validation_messages() {
        let cases = [
            (
                spec("10.0.0.0/31"),
                "Network 10.0.0.0/31 too small to allocate from",
            ),
            (
                spec("10.0.0.5/32"),
                "Network 10.0.0.5/32 too small to allocate from",
            ),
            (
                spec("fd00::/127"),
                "Network fd00::/127 too small to allocate from",
            ),
            (
                spec("10.0.0.5/24"),
                "Network has host bits set. For a subnet mask of length 24 the network address is 10.0.0.0",
            ),
            (
                spec("fd00::5/64"),
                "Network has host bits set. For a subnet mask of length 64 the network address is fd00::",
            ),
            (
                spec("::ffff:10.0.0.0/120"),
                "IPNet IP and Mask version mismatch",
            ),
            (spec("10.0.0.0/33"), "invalid CIDR address: 10.0.0.0/33"),
            (spec("10.0.0.0"), "invalid CIDR address: 10.0.0.0"),
            (RangeSpec::default(), "IP <nil> not v4 nor v6"),
            (
                spec_full("10.0.0.0/24", "10.0.1.5", "", ""),
                "RangeStart 10.0.1.5 not in network 10.0.0.0/24",
            ),
            (
                spec_full("10.0.0.0/24", "", "10.0.1.5", ""),
                "RangeEnd 10.0.1.5 not in network 10.0.0.0/24",
            ),
            (
                spec_full("10.0.0.0/24", "10.0.0.50", "10.0.0.40", ""),
                "RangeEnd 10.0.0.40 not in network 10.0.0.0/24",
            ),
            (
                spec_full("10.0.0.0/24", "fd00::1", "", ""),
                "RangeStart fd00::1 not in network 10.0.0.0/24",
            ),
            (
                spec_full("10.0.0.0/24", "10.0.0.x", "", ""),
                "invalid IP address: 10.0.0.x",
            ),
        ];
        for (s, want) in cases {
            assert_eq!(err(&s), want, "{s:?}");
        }
    }

    #[test]
    fn explicit_fields_and_mapped_addresses() {
        let r = Range::canonicalize(&spec_full(
            "10.0.0.0/24",
            "::ffff:10.0.0.10",
            "10.0.0.20",
            "10.0.0.254",
        ))
        .unwrap();
        assert_eq!(r.to_string(), "10.0.0.10-10.0.0.20");
        assert_eq!(r.gateway, ip("10.0.0.254"));
        assert_eq!(r.capacity(), 11);
        assert!(r.contains(ip("::ffff:10.0.0.15")));
        assert!(!r.contains(ip("10.0.0.9")));
        assert!(!r.contains(ip("10.0.0.21")));
    }

    #[test]
    fn set_validation() {
        let set_err = |specs: &[RangeSpec]| RangeSet::canonicalize(specs).unwrap_err().to_string();
        assert_eq!(set_err(&[]), "empty range set");
        assert_eq!(
            set_err(&[spec("10.0.0.0/24"), spec("fd00::/64")]),
            "mixed address families"
        );
        assert_eq!(
            set_err(&[spec("10.0.0.0/24"), spec("10.0.0.0/25")]),
            "subnets 10.0.0.1-10.0.0.254 and 10.0.0.1-10.0.0.126 overlap"
        );
        let ok = RangeSet::canonicalize(&[
            spec_full("10.0.0.0/24", "10.0.0.10", "10.0.0.20", ""),
            spec_full("10.0.0.0/24", "10.0.0.30", "10.0.0.40", ""),
        ])
        .unwrap();
        assert_eq!(ok.to_string(), "10.0.0.10-10.0.0.20,10.0.0.30-10.0.0.40");
        assert!(ok.contains(ip("10.0.0.35")));
        assert!(!ok.contains(ip("10.0.0.25")));
        let a = RangeSet::canonicalize(&[spec("10.0.0.0/16")]).unwrap();
        let b = RangeSet::canonicalize(&[spec("10.0.5.0/24")]).unwrap();
        let c = RangeSet::canonicalize(&[spec("fd00::/64")]).unwrap();
        assert!(a.overlaps(&b) && b.overlaps(&a));
        assert!(!a.overlaps(&c));
    }

    /// Found by the property tests: start past end made `capacity` underflow.
    #[test]
    fn range_start_at_the_broadcast_is_refused() {
        assert_eq!(
            err(&spec_full("10.0.0.0/26", "10.0.0.63", "", "")),
            "RangeStart 10.0.0.63 is past the last usable address 10.0.0.62 of network 10.0.0.0/26"
        );
        let last = Range::canonicalize(&spec_full("10.0.0.0/26", "10.0.0.62", "", "")).unwrap();
        assert_eq!(last.capacity(), 1);
    }

    fn walk(set: &RangeSet, last: Option<&str>) -> Vec<String> {
        set.iter_from(last.map(ip))
            .map(|(a, _)| a.to_string())
            .collect()
    }

    #[test]
    fn iteration_order_skips_gateway_and_wraps() {
        let set = RangeSet::canonicalize(&[spec("10.8.0.0/29")]).unwrap();
        assert_eq!(
            walk(&set, None),
            ["10.8.0.2", "10.8.0.3", "10.8.0.4", "10.8.0.5", "10.8.0.6"]
        );
        // Round robin: after the last reserved one, ending with it.
        assert_eq!(
            walk(&set, Some("10.8.0.4")),
            ["10.8.0.5", "10.8.0.6", "10.8.0.2", "10.8.0.3", "10.8.0.4"]
        );
        // A last reserved address outside the set restarts at rangeStart.
        assert_eq!(walk(&set, Some("10.9.0.4"))[0], "10.8.0.2");
        let two = RangeSet::canonicalize(&[
            spec_full("10.0.0.0/24", "10.0.0.10", "10.0.0.11", ""),
            spec_full("10.0.1.0/24", "10.0.1.1", "10.0.1.3", ""),
        ])
        .unwrap();
        // 10.0.1.1 is the second range's gateway.
        assert_eq!(
            walk(&two, Some("10.0.0.11")),
            ["10.0.1.2", "10.0.1.3", "10.0.0.10", "10.0.0.11"]
        );
    }

    #[test]
    fn v6_iteration_is_lazy() {
        let set = RangeSet::canonicalize(&[spec("fd00:9::/64")]).unwrap();
        let first: Vec<String> = set
            .iter_from(None)
            .take(2)
            .map(|(a, _)| a.to_string())
            .collect();
        assert_eq!(first, ["fd00:9::2", "fd00:9::3"]);
        let wrap: Vec<String> = set
            .iter_from(Some(ip("fd00:9::ffff:ffff:ffff:fffe")))
            .take(2)
            .map(|(a, _)| a.to_string())
            .collect();
        assert_eq!(wrap, ["fd00:9::ffff:ffff:ffff:ffff", "fd00:9::2"]);
    }

    #[test]
    fn file_names_are_gos_canonical_text() {
        // Go's net.IP.String() is RFC 5952; Rust's Display agrees on these.
        for (input, want) in [
            ("FD00:0009:0000:0000:0000:0000:0000:0002", "fd00:9::2"),
            ("1:0:2:3:4:5:6:7", "1:0:2:3:4:5:6:7"),
            ("1:0:0:2:0:0:0:3", "1:0:0:2::3"),
            ("::1.2.3.4", "::102:304"),
            ("::ffff:10.1.2.3", "10.1.2.3"),
        ] {
            assert_eq!(parse_ip(input).unwrap().to_string(), want, "{input}");
        }
    }
}
