//! The CNI error: a numeric code, a short message and optional details, printed
//! as the spec's error JSON on stdout by the dispatcher. Also the suite's one idiom
//! for adding context to a library's error ([`Context`]) and its one collector of
//! the failures of best-effort work such as DEL and GC ([`Errors`]).

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

    /// A code-7 error: a mistake in the network config (a key's value, a combination
    /// of keys, a missing `prevResult`).
    pub fn invalid_config(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::INVALID_NETWORK_CONFIG, msg)
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

/// `e` followed by its causes, `: `-separated. The Linux layer keeps the kernel's
/// answer (`File exists (os error 17)`, ...) as the error's source, so printing only
/// the top level would tell the user what failed but never why, nor the errno.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Adds context to a failed step: the error becomes a code-999 [`CniError`] whose
/// message is `context: ` followed by the error and all its causes ([`chain`]), so
/// the kernel's answer and errno stay in the text the user sees.
pub trait Context<T> {
    /// The error, as a CNI error, with `context` before it.
    fn context(self, context: impl fmt::Display) -> Result<T, CniError>;

    /// Like [`Context::context`], building the context only on failure.
    fn with_context<C: fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T, CniError>;
}

impl<T, E: std::error::Error> Context<T> for Result<T, E> {
    fn context(self, context: impl fmt::Display) -> Result<T, CniError> {
        self.map_err(|e| CniError::internal(format!("{context}: {}", chain(&e))))
    }

    fn with_context<C: fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T, CniError> {
        self.map_err(|e| CniError::internal(format!("{}: {}", context(), chain(&e))))
    }
}

/// A library error as a code-999 CNI error, with its causes (and so its errno).
pub fn internal(e: &dyn std::error::Error) -> CniError {
    CniError::internal(chain(e))
}

/// The failures of best-effort work (DEL, GC, rollback, teardown), which keeps
/// going past a failed step and reports every failure at the end.
#[derive(Debug)]
pub struct Errors<E>(Vec<E>);

impl<E> Default for Errors<E> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<E> Errors<E> {
    /// Keeps the error of `result`, if any.
    pub fn note<T>(&mut self, result: Result<T, E>) {
        if let Err(e) = result {
            self.0.push(e);
        }
    }

    /// Keeps `error`.
    pub fn push(&mut self, error: E) {
        self.0.push(error);
    }

    /// True when nothing failed so far.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `Ok` when nothing failed, the error itself when one step failed (so it keeps
    /// its code: a delegate's error passes through unchanged), else `many` of them.
    pub fn into_result(self, many: impl FnOnce(Vec<E>) -> E) -> Result<(), E> {
        let mut errors = self.0;
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(many(errors)),
        }
    }

    /// `Ok` when nothing failed, else `all(errors)` even for a single error.
    pub fn into_result_all(self, all: impl FnOnce(Vec<E>) -> E) -> Result<(), E> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(all(self.0))
        }
    }
}

impl<E> From<Vec<E>> for Errors<E> {
    fn from(errors: Vec<E>) -> Self {
        Self(errors)
    }
}

impl Errors<CniError> {
    /// Several CNI errors as one code-999 error, their texts `; `-separated.
    pub fn into_cni_result(self) -> Result<(), CniError> {
        self.into_result(|errors| {
            let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
            CniError::internal(text.join("; "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("failed to add link")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn context_keeps_the_cause_chain_and_errno() {
        let failed: Result<(), Outer> = Err(Outer(std::io::Error::from_raw_os_error(17)));
        let e = failed.context("could not add \"cni0\"").unwrap_err();
        assert_eq!(e.code, ErrorCode::INTERNAL);
        assert_eq!(
            e.msg,
            "could not add \"cni0\": failed to add link: File exists (os error 17)"
        );
        let lazy: Result<(), Outer> = Err(Outer(std::io::Error::from_raw_os_error(95)));
        let e = lazy.with_context(|| "vlan").unwrap_err();
        assert_eq!(
            e.msg,
            "vlan: failed to add link: Operation not supported (os error 95)"
        );
    }

    #[test]
    fn errors_pass_one_through_and_join_many() {
        assert_eq!(Errors::<CniError>::default().into_cni_result(), Ok(()));
        let mut one = Errors::default();
        one.note(Ok::<(), CniError>(()));
        one.note(Err::<(), _>(CniError::new(ErrorCode(11), "busy")));
        assert_eq!(one.into_cni_result().unwrap_err().code, ErrorCode(11));
        let mut two = Errors::default();
        two.push(CniError::new(ErrorCode(11), "busy"));
        two.push(CniError::internal("gone"));
        let e = two.into_cni_result().unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (ErrorCode::INTERNAL, "busy; gone")
        );
        let all = Errors::from(vec![1]).into_result_all(|v| v.len() * 10);
        assert_eq!(all, Err(10));
    }

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
