//! The crate's one error type, and how each case maps to a CNI error code.
//!
//! Messages are the reference plugin's words wherever it has a message for the case
//! (runtimes and users grep for them); everything is code 999 like the reference,
//! except a lock wait that timed out (11, try again later) and STATUS answers (50).

use cni_protocol::{CniError, ErrorCode};
use std::net::IpAddr;
use std::path::PathBuf;

/// Everything that can go wrong in host-local.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config has no `ipam` object.
    #[error("IPAM config missing 'ipam' key")]
    MissingIpam,
    /// The config could not be decoded (wrong JSON types).
    #[error("{0}")]
    Decode(#[source] CniError),
    /// A config value is invalid; the text is the reference's message.
    #[error("{0}")]
    Invalid(String),
    /// `CNI_ARGS` could not be parsed (the protocol crate has the reference's words).
    #[error(transparent)]
    Args(#[from] CniError),
    /// Reading the `resolvConf` file failed.
    #[error("{}: {source}", path.display())]
    ResolvConf {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file system operation on the store failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What we were doing (`open`, `link`, ...).
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The network name or a path derived from config would leave `dataDir`.
    #[error("unsafe path {}: {reason}", path.display())]
    UnsafePath {
        /// The offending path.
        path: PathBuf,
        /// Why it is refused.
        reason: &'static str,
    },
    /// Another process held the network's lock for longer than `lockTimeout`.
    #[error("timed out after {seconds}s waiting for the lock {}", path.display())]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        seconds: f64,
    },
    /// Wraps the error of one range set during ADD.
    #[error("failed to allocate for range {index}: {source}")]
    Range {
        /// Range set index.
        index: usize,
        /// What failed.
        #[source]
        source: Box<Error>,
    },
    /// A requested IP is in no range of the set (kept for completeness: ADD only tries
    /// a requested IP with the set that contains it).
    #[error("{ip} not in range set {set}")]
    NotInRangeSet {
        /// The address.
        ip: IpAddr,
        /// The set, printed like the reference.
        set: String,
    },
    /// A requested IP is its range's gateway.
    #[error("requested ip {0} is subnet's gateway")]
    RequestedGateway(IpAddr),
    /// A requested IP is already reserved.
    #[error("requested IP address {ip} is not available in range set {set}")]
    RequestedTaken {
        /// The address.
        ip: IpAddr,
        /// The set.
        set: String,
    },
    /// The attachment already holds an address in this set.
    #[error("{ip} has been allocated to {id}, duplicate allocation is not allowed")]
    Duplicate {
        /// The address it holds.
        ip: IpAddr,
        /// The container id.
        id: String,
    },
    /// Every address of the set is taken.
    #[error("no IP addresses available in range set: {0}")]
    Exhausted(String),
    /// Requested IPs that lie in no range set.
    #[error("failed to allocate all requested IPs: {}", join_ips(.0))]
    Unfulfilled(Vec<IpAddr>),
    /// CHECK found no reservation of the container.
    #[error("host-local: Failed to find address added by container {0}")]
    NotFound(String),
    /// STATUS: ADD cannot be served right now.
    #[error("{0}")]
    Unavailable(Box<Error>),
    /// A failpoint told this step to fail (debug builds, tests only).
    #[error(transparent)]
    Injected(CniError),
    /// Several independent failures (DEL, GC keep going and report them together).
    #[error("{}", join_errors(.0))]
    Many(Vec<Error>),
}

fn join_ips(ips: &[IpAddr]) -> String {
    let texts: Vec<String> = ips.iter().map(ToString::to_string).collect();
    texts.join(" ")
}

fn join_errors(errors: &[Error]) -> String {
    let texts: Vec<String> = errors.iter().map(ToString::to_string).collect();
    texts.join("; ")
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// The CNI code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Args(e) => e.code,
            Self::Decode(_) => ErrorCode::DECODING_FAILURE,
            Self::LockTimeout { .. } => ErrorCode::TRY_AGAIN_LATER,
            Self::Unavailable(_) => ErrorCode::PLUGIN_NOT_AVAILABLE,
            Self::Range { source, .. } => match **source {
                Self::LockTimeout { .. } => ErrorCode::TRY_AGAIN_LATER,
                _ => ErrorCode::INTERNAL,
            },
            _ => ErrorCode::INTERNAL,
        }
    }
}

impl From<Error> for CniError {
    fn from(err: Error) -> Self {
        match err {
            Error::Args(e) => e,
            other => CniError::new(other.code(), other.to_string()),
        }
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages() {
        let exhausted = Error::Range {
            index: 0,
            source: Box::new(Error::Exhausted("10.8.0.1-10.8.0.2".into())),
        };
        let cni = CniError::from(exhausted);
        assert_eq!(cni.code, ErrorCode::INTERNAL);
        assert_eq!(
            cni.msg,
            "failed to allocate for range 0: no IP addresses available in range set: 10.8.0.1-10.8.0.2"
        );
        let busy = Error::LockTimeout {
            path: "/x/lock".into(),
            seconds: 2.5,
        };
        assert_eq!(CniError::from(busy).code, ErrorCode::TRY_AGAIN_LATER);
        let gone = Error::Unfulfilled(vec![
            "10.10.0.77".parse().unwrap(),
            "fd00::5".parse().unwrap(),
        ]);
        assert_eq!(
            gone.to_string(),
            "failed to allocate all requested IPs: 10.10.0.77 fd00::5"
        );
        let unavailable = Error::Unavailable(Box::new(Error::Exhausted("a-b".into())));
        assert_eq!(
            CniError::from(unavailable).code,
            ErrorCode::PLUGIN_NOT_AVAILABLE
        );
    }
}
