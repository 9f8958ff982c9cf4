//! CNI spec versions: parsing, comparison, the supported set and the result family of each.

use crate::error::{CniError, ErrorCode};
use std::fmt;

/// Every spec version this suite speaks, oldest first.
pub const SUPPORTED_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The newest spec version this suite implements.
pub const CURRENT_VERSION: &str = "1.1.0";

/// A parsed `major.minor.patch` version (missing parts are 0, an empty string is 0.1.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major part.
    pub major: u32,
    /// Minor part.
    pub minor: u32,
    /// Patch part.
    pub patch: u32,
}

impl Version {
    /// Builds a version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Parses like the reference: up to three dot-separated numbers; empty means 0.1.0.
    pub fn parse(text: &str) -> Result<Self, CniError> {
        if text.is_empty() {
            return Ok(Self::new(0, 1, 0));
        }
        let parts: Vec<&str> = text.split('.').collect();
        if parts.len() > 3 {
            return Err(CniError::new(
                ErrorCode::DECODING_FAILURE,
                format!("invalid version {text:?}: too many parts"),
            ));
        }
        let mut numbers = [0u32; 3];
        for (slot, part) in numbers.iter_mut().zip(&parts) {
            *slot = part.parse().map_err(|_| {
                CniError::new(
                    ErrorCode::DECODING_FAILURE,
                    format!("invalid version {text:?}: {part:?} is not a number"),
                )
            })?;
        }
        Ok(Self::new(numbers[0], numbers[1], numbers[2]))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The three result shapes of the spec's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultFamily {
    /// 0.1.0 and 0.2.0: `ip4` / `ip6` objects.
    V020,
    /// 0.3.0, 0.3.1 and 0.4.0: `interfaces`, `ips` with `version`.
    V040,
    /// 1.0.0 and 1.1.0.
    V100,
}

impl ResultFamily {
    /// The family whose shape a result of this version has.
    pub fn of(version: &str) -> Result<Self, CniError> {
        match version {
            "" | "0.1.0" | "0.2.0" => Ok(Self::V020),
            "0.3.0" | "0.3.1" | "0.4.0" => Ok(Self::V040),
            "1.0.0" | "1.1.0" => Ok(Self::V100),
            other => Err(CniError::new(
                ErrorCode::INCOMPATIBLE_CNI_VERSION,
                format!("unsupported CNI result version {other:?}"),
            )),
        }
    }
}

/// Go's `%q` of a string slice: `["a" "b"]`.
pub(crate) fn go_quoted_list<S: AsRef<str>>(items: &[S]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{:?}", s.as_ref())).collect();
    format!("[{}]", quoted.join(" "))
}

/// The error for a config version this suite does not speak.
pub fn incompatible(config_version: &str) -> CniError {
    CniError::new(
        ErrorCode::INCOMPATIBLE_CNI_VERSION,
        "incompatible CNI versions",
    )
    .with_details(format!(
        "config is {config_version:?}, plugin supports {}",
        go_quoted_list(&SUPPORTED_VERSIONS)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_orders() {
        assert_eq!(Version::parse("").unwrap(), Version::new(0, 1, 0));
        assert_eq!(Version::parse("1").unwrap(), Version::new(1, 0, 0));
        assert_eq!(Version::parse("0.4").unwrap(), Version::new(0, 4, 0));
        assert!(Version::parse("0.3.1").unwrap() < Version::parse("0.4.0").unwrap());
        assert!(Version::parse("1.0.0").unwrap() > Version::parse("0.4.0").unwrap());
        assert_eq!(
            Version::parse("1.2.3.4").unwrap_err().code,
            ErrorCode::DECODING_FAILURE
        );
        assert_eq!(
            Version::parse("a.b").unwrap_err().code,
            ErrorCode::DECODING_FAILURE
        );
    }

    #[test]
    fn families() {
        for (v, f) in [
            ("0.1.0", ResultFamily::V020),
            ("0.2.0", ResultFamily::V020),
            ("0.3.0", ResultFamily::V040),
            ("0.3.1", ResultFamily::V040),
            ("0.4.0", ResultFamily::V040),
            ("1.0.0", ResultFamily::V100),
            ("1.1.0", ResultFamily::V100),
        ] {
            assert_eq!(ResultFamily::of(v).unwrap(), f, "{v}");
        }
        assert!(ResultFamily::of("0.5.0").is_err());
    }

    #[test]
    fn incompatible_message_matches_reference() {
        let err = incompatible("0.5.0");
        assert_eq!(err.code, ErrorCode::INCOMPATIBLE_CNI_VERSION);
        assert_eq!(
            err.details,
            r#"config is "0.5.0", plugin supports ["0.1.0" "0.2.0" "0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]"#
        );
    }
}
