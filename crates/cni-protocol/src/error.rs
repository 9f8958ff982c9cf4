//! The CNI error: a numeric code, a short message and optional details, printed
//! as the spec's error JSON on stdout by the dispatcher.

use std::fmt;

/// A CNI error code. Codes 0-99 are reserved by the spec; plugins may use 100 and up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    /// Unspecified error.
    pub const UNKNOWN: Self = Self(0);
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_CNI_VERSION: Self = Self(1);
    /// Unsupported field in the network configuration.
    pub const UNSUPPORTED_FIELD: Self = Self(2);
    /// Container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: Self = Self(3);
    /// Invalid or missing `CNI_*` environment variables.
    pub const INVALID_ENVIRONMENT_VARIABLES: Self = Self(4);
    /// I/O failure.
    pub const IO_FAILURE: Self = Self(5);
    /// Failed to decode content.
    pub const DECODING_FAILURE: Self = Self(6);
    /// Invalid network configuration.
    pub const INVALID_NETWORK_CONFIG: Self = Self(7);
    /// `CNI_NETNS` is the plugin's own network namespace (reference extension).
    pub const INVALID_NETNS: Self = Self(8);
    /// Transient condition: try again later.
    pub const TRY_AGAIN_LATER: Self = Self(11);
    /// STATUS: the plugin cannot service ADD requests.
    pub const PLUGIN_NOT_AVAILABLE: Self = Self(50);
    /// STATUS: cannot service ADD, and existing containers may have limited connectivity.
    pub const LIMITED_CONNECTIVITY: Self = Self(51);
    /// Any other plugin failure (the reference plugins' catch-all).
    pub const INTERNAL: Self = Self(999);
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An error as the CNI protocol reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.text())]
pub struct CniError {
    /// The error code.
    pub code: ErrorCode,
    /// Short message.
    pub msg: String,
    /// Longer explanation; empty when there is none.
    pub details: String,
}

impl CniError {
    /// An error with a code and a message.
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// A code-999 error, what the reference plugins return for their own failures.
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::INTERNAL, msg)
    }

    /// The same error with details added.
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The same error with `prefix: ` put before its message (keeps the code).
    pub fn context(mut self, prefix: impl fmt::Display) -> Self {
        self.msg = format!("{prefix}: {}", self.msg);
        self
    }

    fn text(&self) -> String {
        if self.details.is_empty() {
            self.msg.clone()
        } else {
            format!("{}; {}", self.msg, self.details)
        }
    }

    /// The error JSON (pretty-printed like the reference), with the given `cniVersion`.
    pub fn to_json(&self, cni_version: &str) -> String {
        let mut obj = serde_json::Map::new();
        obj.insert("cniVersion".into(), cni_version.into());
        obj.insert("code".into(), self.code.0.into());
        obj.insert("msg".into(), self.msg.clone().into());
        if !self.details.is_empty() {
            obj.insert("details".into(), self.details.clone().into());
        }
        crate::json::to_pretty(&serde_json::Value::Object(obj))
    }

    /// Parses an error JSON printed by another plugin (a delegate).
    pub fn from_json(bytes: &[u8]) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        let code = value.get("code")?.as_u64()?;
        let text = |key: &str| {
            value
                .get(key)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        Some(Self {
            code: ErrorCode(u32::try_from(code).ok()?),
            msg: text("msg"),
            details: text("details"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_matches_reference_layout_plus_version() {
        let err = CniError::new(
            ErrorCode::INCOMPATIBLE_CNI_VERSION,
            "incompatible CNI versions",
        )
        .with_details("config is \"0.5.0\"");
        assert_eq!(
            err.to_json("0.5.0"),
            "{\n    \"cniVersion\": \"0.5.0\",\n    \"code\": 1,\n    \"msg\": \"incompatible CNI versions\",\n    \"details\": \"config is \\\"0.5.0\\\"\"\n}"
        );
    }

    #[test]
    fn details_omitted_when_empty() {
        let json = CniError::internal("boom").to_json("1.1.0");
        assert!(!json.contains("details"));
    }

    #[test]
    fn round_trips_through_json() {
        let err = CniError::new(ErrorCode(11), "busy").with_details("lock");
        assert_eq!(
            CniError::from_json(err.to_json("1.0.0").as_bytes()),
            Some(err)
        );
        assert_eq!(CniError::from_json(b"not json"), None);
    }
}
