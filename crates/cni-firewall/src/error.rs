//! The one error type of this crate.
//!
//! Firewall failures are diagnosed by operators reading the plugin's error
//! JSON, so every variant names the program that failed, what it was working
//! on (table and chain) and carries the program's own stderr verbatim.

use std::fmt;
use std::io;

use crate::naming::go_quote;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong while managing firewall rules.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configured `ipMasqBackend` is neither `iptables` nor `nftables`
    /// (same words as the reference plugin).
    #[error("unknown ipmasq backend {}", go_quote(.0))]
    UnknownBackend(String),

    /// A required program is not installed.
    #[error("failed to locate {program}: not found in PATH nor in {searched}")]
    ProgramNotFound {
        /// Program name, e.g. `iptables-restore`.
        program: String,
        /// The fallback directories that were searched as well.
        searched: String,
    },

    /// The program could not be started or talked to.
    #[error("failed to run {program} ({target}): {cause}")]
    Spawn {
        /// Program name.
        program: String,
        /// What the program was working on, e.g. `table nat chain POSTROUTING`.
        target: String,
        /// The I/O error from spawning, feeding stdin or waiting. Printed in the
        /// message and not kept as a `source`, so a printer of the cause chain
        /// (`cni_protocol::error::chain`) does not print it twice.
        cause: io::Error,
    },

    /// The program ran and reported failure.
    #[error("{program} failed on {target} ({status}): {}", stderr.trim_end())]
    Command {
        /// Program name.
        program: String,
        /// What the program was working on.
        target: String,
        /// Exit status as printed by the standard library.
        status: String,
        /// The program's stderr.
        stderr: String,
    },

    /// The program's output was not what we can understand.
    #[error("unexpected output from {program} ({target}): {detail}")]
    Parse {
        /// Program name.
        program: String,
        /// What we asked for.
        target: String,
        /// What was wrong with the output.
        detail: String,
    },

    /// A name or address would not survive being embedded in a rule.
    #[error("invalid {what} {}: {reason}", go_quote(.value))]
    InvalidInput {
        /// Which input, e.g. `container MAC`.
        what: &'static str,
        /// The offending value.
        value: String,
        /// Why it is rejected.
        reason: &'static str,
    },

    /// The kernel refused an nf_tables request made over netlink (or the
    /// netlink socket failed).
    #[error("nftables: {target} failed: {detail}")]
    Netlink {
        /// The request in nft syntax, e.g. `add table inet cni_plugins_masquerade`.
        target: String,
        /// What went wrong, with the kernel's errno.
        detail: String,
        /// The errno, when the kernel answered with one.
        errno: Option<i32>,
    },

    /// The kernel refused a conntrack request made over netlink (ctnetlink),
    /// or the netlink socket failed.
    #[error("conntrack: {target} failed: {detail}")]
    Conntrack {
        /// The request, e.g. `delete udp dport 5353 (ipv4)`.
        target: String,
        /// What went wrong, with the kernel's errno.
        detail: String,
        /// The errno, when the kernel (or the socket call) answered with one.
        errno: Option<i32>,
    },

    /// CHECK found that a rule we installed is not there (any more).
    #[error("{backend}: {what} not found in {target}")]
    Missing {
        /// `iptables`, `ip6tables`, `nftables`.
        backend: &'static str,
        /// Where we looked, e.g. `table nat chain POSTROUTING`.
        target: String,
        /// The missing rule or chain, in the tool's own syntax.
        what: String,
    },

    /// A NetworkPolicy state that cannot be enforced as given (a bad profile name,
    /// overlapping boxes, a pod judged by a profile that does not exist); nothing
    /// was changed.
    #[error("invalid network policy state: {what}: {reason}")]
    InvalidPolicy {
        /// What is wrong, e.g. `ingress profile "ab12"`.
        what: String,
        /// Why, naming the offending values.
        reason: String,
    },

    /// Bridged traffic cannot be handed to netfilter (`br_netfilter` and its
    /// `net.bridge.bridge-nf-call-*` switches), which NetworkPolicy on a bridge
    /// needs.
    #[error("bridge netfilter: {what}")]
    BridgeNetfilter {
        /// What failed.
        what: String,
        /// The sysctl's failure, if one is the cause.
        #[source]
        source: Option<cni_linux::Error>,
    },

    /// Several independent steps failed (teardown, GC keep going and report
    /// everything at the end).
    #[error("{}", Joined(.0))]
    Multiple(Vec<Error>),
}

impl Error {
    /// Folds a list of errors into one, or `Ok` when the list is empty; nested
    /// lists are flattened.
    pub(crate) fn collect(errors: Vec<Error>) -> Result<()> {
        let flat: Vec<Error> = errors
            .into_iter()
            .flat_map(|e| match e {
                Error::Multiple(inner) => inner,
                e => vec![e],
            })
            .collect();
        cni_protocol::Errors::from(flat).into_result(Error::Multiple)
    }
}

/// Displays errors one per line, like the reference joins teardown errors.
struct Joined<'a>(&'a [Error]);

impl fmt::Display for Joined<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_backend_uses_reference_words() {
        let e = Error::UnknownBackend("ipfw".into());
        assert_eq!(e.to_string(), r#"unknown ipmasq backend "ipfw""#);
    }

    #[test]
    fn command_error_names_program_target_and_stderr() {
        let e = Error::Command {
            program: "iptables-restore".into(),
            target: "table nat chain POSTROUTING".into(),
            status: "exit status: 4".into(),
            stderr: "line 2: CHAIN_DEL failed\n".into(),
        };
        assert_eq!(
            e.to_string(),
            "iptables-restore failed on table nat chain POSTROUTING (exit status: 4): line 2: CHAIN_DEL failed"
        );
    }

    #[test]
    fn collect_folds() {
        assert!(Error::collect(vec![]).is_ok());
        let one = Error::collect(vec![Error::UnknownBackend("a".into())]).unwrap_err();
        assert!(matches!(one, Error::UnknownBackend(_)));
        let two = Error::collect(vec![
            Error::UnknownBackend("a".into()),
            Error::UnknownBackend("x".into()),
        ])
        .unwrap_err();
        assert_eq!(
            two.to_string(),
            "unknown ipmasq backend \"a\"\nunknown ipmasq backend \"x\""
        );
        let nested = Error::collect(vec![two, Error::UnknownBackend("y".into())]).unwrap_err();
        assert!(
            matches!(&nested, Error::Multiple(v) if v.len() == 3),
            "{nested}"
        );
    }
}
