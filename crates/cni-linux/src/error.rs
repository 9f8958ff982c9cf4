//! The crate's one error type. Every variant names the object it failed on
//! (link, address, path) and keeps the kernel's answer as its source, so a
//! caller can both print a useful chain and branch on the errno. A netlink
//! refusal the kernel explained (extended ack) keeps the explanation too:
//! `File exists (os error 17): <the kernel's text>`.

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;

use crate::oper_state::OperState;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in the Linux layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The netns path does not exist (DEL treats this as "already gone").
    #[error("network namespace {path:?} does not exist")]
    NetnsNotFound {
        /// Path that was opened.
        path: PathBuf,
    },
    /// The netns path exists but could not be opened.
    #[error("failed to open netns {path:?}")]
    NetnsOpen {
        /// Path that was opened.
        path: PathBuf,
        /// Cause from open(2).
        #[source]
        source: io::Error,
    },
    /// The path is not a network namespace file (nsfs or procfs).
    #[error("{path:?} is not a network namespace")]
    NotNetns {
        /// Path that was opened.
        path: PathBuf,
    },
    /// The container's netns is the plugin's own.
    #[error("plugin's netns and netns from CNI_NETNS should not be the same ({path:?})")]
    SameNetns {
        /// Path that was opened.
        path: PathBuf,
    },
    /// fstat/fstatfs on a netns file failed.
    #[error("failed to inspect netns {path:?}")]
    NetnsStat {
        /// Path of the netns.
        path: PathBuf,
        /// Cause from the syscall.
        #[source]
        source: Errno,
    },
    /// flock(2) on the netns failed.
    #[error("failed to lock netns {path:?}")]
    NetnsLock {
        /// Path of the netns.
        path: PathBuf,
        /// Cause from flock(2).
        #[source]
        source: Errno,
    },
    /// setns(2) into the netns failed.
    #[error("failed to enter netns {path:?}")]
    Setns {
        /// Path of the netns.
        path: PathBuf,
        /// Cause from setns(2).
        #[source]
        source: Errno,
    },
    /// The helper thread that enters a netns could not be started.
    #[error("failed to start a thread for netns {path:?}")]
    NetnsThread {
        /// Path of the netns.
        path: PathBuf,
        /// Cause from the thread spawn.
        #[source]
        source: io::Error,
    },
    /// Opening the netlink socket failed.
    #[error("failed to open a netlink socket")]
    Connect {
        /// Cause from socket(2).
        #[source]
        source: io::Error,
    },
    /// The kernel refused a netlink request.
    #[error("{context}")]
    Netlink {
        /// What was being done, naming the object.
        context: String,
        /// The kernel's errno as an io::Error (with its extended-ack text, when
        /// it sent one; [`Error::errno`] reads the errno either way), or a
        /// protocol failure.
        #[source]
        source: io::Error,
    },
    /// The kernel has no WireGuard: the generic netlink family `wireguard` does not
    /// resolve, or links of kind `wireguard` are refused (a kernel built without it, or
    /// whose module cannot load). See [`Error::is_no_wireguard`].
    #[error(
        "the kernel has no WireGuard (no \"wireguard\" generic netlink family or link kind: \
         a kernel built without CONFIG_WIREGUARD, or its module cannot load)"
    )]
    NoWireguard {
        /// The kernel's answer: ENOENT from the family lookup, EOPNOTSUPP from a link
        /// creation.
        #[source]
        source: io::Error,
    },
    /// A link that must exist was not found.
    #[error("link {name:?} not found")]
    LinkNotFound {
        /// Name or `#<index>` of the link.
        name: String,
    },
    /// A link did not reach operational state up in time.
    #[error("link {link:?} is not up: operational state {state}")]
    LinkNotUp {
        /// Link name.
        link: String,
        /// Last operational state seen.
        state: OperState,
    },
    /// IPv6 duplicate address detection failed for an address.
    #[error("link {link} has address {address} in DADFAILED state")]
    AddressDadFailed {
        /// Link name.
        link: String,
        /// The duplicate address.
        address: IpAddr,
    },
    /// IPv6 addresses stayed tentative past the timeout.
    #[error("link {link} still has tentative addresses after {} seconds", timeout.as_secs())]
    AddressesTentative {
        /// Link name.
        link: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// A route could not be expressed as a netlink message (e.g. mixed families).
    #[error("invalid route {route}: {reason}")]
    InvalidRoute {
        /// The route as text.
        route: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A sysctl name was empty, absolute or contained `..`.
    #[error("invalid sysctl name {name:?}")]
    InvalidSysctl {
        /// The rejected name.
        name: String,
    },
    /// Reading a sysctl failed.
    #[error("failed to read sysctl {path:?}")]
    SysctlRead {
        /// Full /proc/sys path.
        path: PathBuf,
        /// Cause from the read.
        #[source]
        source: io::Error,
    },
    /// Writing a sysctl failed.
    #[error("failed to write {value:?} to sysctl {path:?}")]
    SysctlWrite {
        /// Full /proc/sys path.
        path: PathBuf,
        /// Value that was written.
        value: String,
        /// Cause from the write.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The errno behind this error as a positive number, if there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Netlink { source, .. } | Self::NoWireguard { source } => source_errno(source),
            Self::NetnsOpen { source, .. }
            | Self::NetnsThread { source, .. }
            | Self::Connect { source }
            | Self::SysctlRead { source, .. }
            | Self::SysctlWrite { source, .. } => source.raw_os_error(),
            Self::Setns { source, .. }
            | Self::NetnsStat { source, .. }
            | Self::NetnsLock { source, .. } => Some(*source as i32),
            Self::NetnsNotFound { .. } => Some(Errno::ENOENT as i32),
            Self::LinkNotFound { .. } => Some(Errno::ENODEV as i32),
            _ => None,
        }
    }

    /// True when the kernel answered EEXIST (link, address or route already there).
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(Errno::EEXIST as i32)
    }

    /// True when the kernel answered EOPNOTSUPP (e.g. a bridge with VLAN filtering on
    /// a kernel built without it).
    pub fn is_unsupported(&self) -> bool {
        self.errno() == Some(Errno::EOPNOTSUPP as i32)
    }

    /// True when the kernel has no WireGuard ([`Error::NoWireguard`]).
    pub fn is_no_wireguard(&self) -> bool {
        matches!(self, Self::NoWireguard { .. })
    }

    /// True when a link, address or route the request named does not exist.
    ///
    /// Covers `LinkNotFound` and the kernel's ENODEV (link), ENOENT, ESRCH
    /// (route) and EADDRNOTAVAIL (address) answers to netlink requests. A
    /// missing netns is a separate case: match `Error::NetnsNotFound`.
    pub fn is_not_found(&self) -> bool {
        match self {
            Self::LinkNotFound { .. } => true,
            Self::Netlink { .. } => matches!(
                self.errno().map(Errno::from_raw),
                Some(Errno::ENODEV | Errno::ENOENT | Errno::ESRCH | Errno::EADDRNOTAVAIL)
            ),
            _ => false,
        }
    }

    /// The kernel's own explanation of a netlink refusal (extended ack), when it
    /// gave one: "Nexthop has invalid gateway", ...
    pub fn kernel_message(&self) -> Option<&str> {
        match self {
            Self::Netlink { source, .. } => source
                .get_ref()?
                .downcast_ref::<Explained>()
                .map(|e| e.message.as_str()),
            _ => None,
        }
    }

    /// Wraps a netlink failure with a description of the request: the
    /// kernel's errno as the source, so `is_exists()` and friends see it.
    pub(crate) fn netlink(context: impl Into<String>, err: cni_netlink::Error) -> Self {
        let source = match err {
            cni_netlink::Error::Kernel {
                errno,
                message: Some(message),
            } if !message.is_empty() => {
                let kind = io::Error::from_raw_os_error(errno).kind();
                io::Error::new(kind, Explained { errno, message })
            }
            cni_netlink::Error::Kernel { errno, .. } => io::Error::from_raw_os_error(errno),
            cni_netlink::Error::Io(e) => e,
            cni_netlink::Error::Malformed(m) => io::Error::new(io::ErrorKind::InvalidData, m),
        };
        Self::Netlink {
            context: context.into(),
            source,
        }
    }
}

/// The errno of a netlink failure's source: in the `io::Error` itself, or in the
/// kernel's explained refusal it wraps.
pub(crate) fn source_errno(source: &io::Error) -> Option<i32> {
    source.raw_os_error().or_else(|| {
        let refusal = source.get_ref()?.downcast_ref::<Explained>()?;
        Some(refusal.errno)
    })
}

/// A refusal with the kernel's explanation: printed as the errno is, then the
/// text.
#[derive(Debug)]
struct Explained {
    errno: i32,
    message: String,
}

impl std::fmt::Display for Explained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let os = io::Error::from_raw_os_error(self.errno);
        write!(f, "{os}: {}", self.message)
    }
}

impl std::error::Error for Explained {}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(errno: Errno) -> Error {
        Error::Netlink {
            context: "failed to add thing".into(),
            source: io::Error::from_raw_os_error(errno as i32),
        }
    }

    #[test]
    fn eexist_is_exists_and_not_not_found() {
        let e = kernel(Errno::EEXIST);
        assert!(e.is_exists());
        assert!(!e.is_not_found());
        assert_eq!(e.errno(), Some(17));
    }

    #[test]
    fn eopnotsupp_is_unsupported() {
        assert!(kernel(Errno::EOPNOTSUPP).is_unsupported());
        assert!(!kernel(Errno::EEXIST).is_unsupported());
    }

    #[test]
    fn missing_objects_are_not_found() {
        for errno in [
            Errno::ENODEV,
            Errno::ENOENT,
            Errno::ESRCH,
            Errno::EADDRNOTAVAIL,
        ] {
            assert!(kernel(errno).is_not_found(), "{errno}");
        }
        assert!(!kernel(Errno::EPERM).is_not_found());
        assert!(
            Error::LinkNotFound {
                name: "eth0".into()
            }
            .is_not_found()
        );
    }

    #[test]
    fn missing_netns_is_not_a_missing_link() {
        let e = Error::NetnsNotFound {
            path: "/run/netns/x".into(),
        };
        assert!(!e.is_not_found());
        assert_eq!(e.errno(), Some(Errno::ENOENT as i32));
    }

    #[test]
    fn netlink_error_message_becomes_errno() {
        let refusal = cni_netlink::Error::Kernel {
            errno: 17,
            message: None,
        };
        let e = Error::netlink("failed to create bridge \"cni0\"", refusal);
        assert!(e.is_exists());
        assert_eq!(e.to_string(), "failed to create bridge \"cni0\"");
        let garbled = cni_netlink::Malformed("truncated ifinfomsg").into();
        let e = Error::netlink("failed to look up link \"x\"", garbled);
        assert_eq!(e.errno(), None);
        assert!(!e.is_not_found());
    }

    #[test]
    fn the_kernels_explanation_is_kept_with_the_errno() {
        let refusal = cni_netlink::Error::Kernel {
            errno: 22,
            message: Some("Nexthop has invalid gateway".into()),
        };
        let e = Error::netlink("failed to replace route 10.244.2.0/24", refusal);
        assert_eq!(e.errno(), Some(22));
        assert_eq!(e.kernel_message(), Some("Nexthop has invalid gateway"));
        assert_eq!(e.to_string(), "failed to replace route 10.244.2.0/24");
        let source = std::error::Error::source(&e).unwrap().to_string();
        assert_eq!(
            source,
            "Invalid argument (os error 22): Nexthop has invalid gateway"
        );
        let gone = Error::netlink(
            "failed to delete neighbour",
            cni_netlink::Error::Kernel {
                errno: 2,
                message: Some("no such entry".into()),
            },
        );
        assert!(gone.is_not_found());
        let plain = Error::netlink(
            "x",
            cni_netlink::Error::Kernel {
                errno: 17,
                message: Some(String::new()),
            },
        );
        assert!(plain.is_exists());
        assert_eq!(plain.kernel_message(), None);
    }

    #[test]
    fn reference_wording_is_kept() {
        let e = Error::AddressDadFailed {
            link: "eth0".into(),
            address: "fd00::1".parse().unwrap(),
        };
        assert_eq!(
            e.to_string(),
            "link eth0 has address fd00::1 in DADFAILED state"
        );
        let e = Error::AddressesTentative {
            link: "eth0".into(),
            timeout: Duration::from_secs(5),
        };
        assert_eq!(
            e.to_string(),
            "link eth0 still has tentative addresses after 5 seconds"
        );
    }
}
