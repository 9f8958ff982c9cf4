//! Ethernet MAC addresses as the CNI result prints them (`aa:bb:cc:dd:ee:ff`,
//! lowercase) and as configs supply them: the suite's one MAC type and parser,
//! shared by the netlink layer, the firewall and the plugins.

use std::fmt;
use std::str::FromStr;

/// A MAC address string did not parse (wording of Go's net.ParseMAC).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("address {value}: invalid MAC address")]
pub struct InvalidMac {
    /// The rejected text.
    pub value: String,
}

/// A 6-byte Ethernet hardware address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The raw bytes.
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// Converts a netlink hardware address; `None` unless it is 6 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 6]>::try_from(bytes).ok().map(Self)
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(bytes: [u8; 6]) -> Self {
        Self(bytes)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddr {
    type Err = InvalidMac;

    /// Accepts the 6-byte forms of Go's `net.ParseMAC`: `aa:bb:cc:dd:ee:ff`,
    /// `aa-bb-cc-dd-ee-ff` and `aabb.ccdd.eeff`.
    fn from_str(s: &str) -> Result<Self, InvalidMac> {
        parse(s).ok_or_else(|| InvalidMac {
            value: s.to_owned(),
        })
    }
}

fn parse(s: &str) -> Option<MacAddr> {
    let hex: String = if s.len() == 14 && s.as_bytes()[4] == b'.' && s.as_bytes()[9] == b'.' {
        s.split('.').collect()
    } else if s.len() == 17 {
        let sep = s.as_bytes()[2];
        if sep != b':' && sep != b'-' {
            return None;
        }
        let groups: Vec<&str> = s.split(sep as char).collect();
        if groups.len() != 6 || groups.iter().any(|g| g.len() != 2) {
            return None;
        }
        groups.concat()
    } else {
        return None;
    };
    if hex.len() != 12 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 6];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(MacAddr(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_lowercase_with_colons() {
        let mac = MacAddr([0x0A, 0xBC, 0, 1, 0xFF, 0x10]);
        assert_eq!(mac.to_string(), "0a:bc:00:01:ff:10");
    }

    #[test]
    fn parses_go_forms() {
        let want = MacAddr([0x0a, 0xbc, 0x00, 0x01, 0xff, 0x10]);
        for text in ["0a:bc:00:01:ff:10", "0A-BC-00-01-FF-10", "0abc.0001.ff10"] {
            assert_eq!(text.parse::<MacAddr>().unwrap(), want, "{text}");
        }
    }

    #[test]
    fn rejects_malformed() {
        for text in [
            "",
            "0a:bc:00:01:ff",
            "0a:bc:00:01:ff:1g",
            "0a:bc-00:01:ff:10",
            "0a:bc:00:01:ff:10:11",
            "0abc:0001:ff10",
            "+a:bc:00:01:ff:10",
        ] {
            let err = text.parse::<MacAddr>().unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("address {text}: invalid MAC address")
            );
        }
    }

    #[test]
    fn from_slice_needs_six_bytes() {
        assert_eq!(
            MacAddr::from_slice(&[1, 2, 3, 4, 5, 6]),
            Some(MacAddr([1, 2, 3, 4, 5, 6]))
        );
        assert_eq!(MacAddr::from_slice(&[1, 2, 3, 4]), None);
    }
}
