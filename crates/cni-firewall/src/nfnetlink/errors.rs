//! The kernel's answers as errors: what an errno means for an nf_tables request, and
//! which errors are a restarted dump or a missing object.

use super::*;

/// What an errno means for an nf_tables request, for the operator.
pub(super) fn explain(errno: i32) -> String {
    let os = io::Error::from_raw_os_error(errno);
    let hint = match errno {
        libc::ENOENT => "the table, chain or rule does not exist",
        libc::EEXIST => "it already exists",
        libc::EBUSY => "the object is in use",
        libc::EPERM => "operation not permitted (CAP_NET_ADMIN is needed)",
        libc::EOPNOTSUPP => {
            "not supported: an existing object may differ (e.g. a chain with another type or hook), or the kernel lacks the feature"
        }
        libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT => "nf_tables is not available in this kernel",
        libc::EINVAL => "the kernel rejected the request as invalid",
        libc::ENOBUFS | libc::ENOMEM => "the kernel ran out of memory",
        libc::ENOSPC => "too many objects",
        libc::ERANGE => "a value is out of range",
        _ => return os.to_string(),
    };
    format!("{hint} ({os})")
}

pub(super) fn nl_error(target: impl Into<String>, detail: impl Into<String>) -> Error {
    Error::Netlink {
        target: target.into(),
        detail: detail.into(),
        errno: None,
    }
}

/// A refusal, with the kernel's own explanation after ours when it gave one.
pub(super) fn kernel_error(
    target: impl Into<String>,
    errno: i32,
    message: Option<String>,
) -> Error {
    let detail = match message {
        Some(text) if !text.is_empty() => format!("{}: {text}", explain(errno)),
        _ => explain(errno),
    };
    Error::Netlink {
        target: target.into(),
        detail,
        errno: Some(errno),
    }
}

pub(super) fn io_error(target: &str, e: &io::Error) -> Error {
    match e.raw_os_error() {
        Some(errno) => kernel_error(target, errno, None),
        None => nl_error(target, e.to_string()),
    }
}

pub(super) fn netlink_error(target: &str, e: cni_netlink::Error) -> Error {
    match e {
        cni_netlink::Error::Kernel { errno, message } => kernel_error(target, errno, message),
        cni_netlink::Error::Io(e) => io_error(target, &e),
        cni_netlink::Error::Malformed(m) => nl_error(target, m.to_string()),
    }
}

/// Whether `e` is the kernel saying "no such table, chain or rule".
/// Whether a transaction pinned to a generation was refused because the rule
/// set moved on (see [`Batch::at_generation`]).
pub(crate) fn is_restart(e: &Error) -> bool {
    let restart = |e: &Error| {
        matches!(
            e,
            Error::Netlink {
                errno: Some(libc::ERESTART),
                ..
            }
        )
    };
    match e {
        Error::Multiple(all) => all.iter().any(restart),
        e => restart(e),
    }
}

pub(crate) fn is_not_found(e: &Error) -> bool {
    matches!(
        e,
        Error::Netlink {
            errno: Some(libc::ENOENT),
            ..
        }
    )
}
