//! The `CNI_*` environment variables: which command needs which, and their validation,
//! with the reference's codes and messages.

use crate::error::{CniError, ErrorCode};
use std::path::PathBuf;

/// The CNI operation requested through `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Attach a container to the network.
    Add,
    /// Release a container's attachment.
    Del,
    /// Verify an attachment.
    Check,
    /// Report whether the plugin can serve ADD.
    Status,
    /// Release resources of attachments that are no longer valid.
    Gc,
    /// Report the supported spec versions.
    Version,
}

impl Command {
    /// Parses a `CNI_COMMAND` value.
    pub fn parse(text: &str) -> Result<Self, CniError> {
        Ok(match text {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "STATUS" => Self::Status,
            "GC" => Self::Gc,
            "VERSION" => Self::Version,
            other => {
                return Err(CniError::new(
                    ErrorCode::INVALID_ENVIRONMENT_VARIABLES,
                    format!("unknown CNI_COMMAND: {other}"),
                ));
            }
        })
    }

    /// The `CNI_COMMAND` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Status => "STATUS",
            Self::Gc => "GC",
            Self::Version => "VERSION",
        }
    }

    /// Whether this command names one attachment (container id + interface).
    pub fn targets_attachment(self) -> bool {
        matches!(self, Self::Add | Self::Del | Self::Check)
    }
}

/// The per-invocation parameters taken from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdArgs {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID` (empty for STATUS, GC, VERSION).
    pub container_id: String,
    /// `CNI_NETNS`, the container's netns path (may be empty on DEL).
    pub netns: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`, unparsed.
    pub args: String,
    /// `CNI_PATH`, split on `:`.
    pub path: Vec<PathBuf>,
    /// `CNI_NETNS_OVERRIDE` is set: skip the "netns is not our own" check.
    pub netns_override: bool,
}

/// Which commands require each variable, in the reference's order (used for the
/// "missing" message, which lists them in this order).
const REQUIRED: [(&str, &[Command]); 5] = [
    (
        "CNI_CONTAINERID",
        &[Command::Add, Command::Del, Command::Check],
    ),
    ("CNI_NETNS", &[Command::Add, Command::Check]),
    ("CNI_IFNAME", &[Command::Add, Command::Del, Command::Check]),
    ("CNI_ARGS", &[]),
    (
        "CNI_PATH",
        &[
            Command::Add,
            Command::Del,
            Command::Check,
            Command::Gc,
            Command::Status,
        ],
    ),
];

/// Longest interface name Linux accepts (IFNAMSIZ - 1).
pub const MAX_IFNAME_LEN: usize = 15;

impl CmdArgs {
    /// Reads and validates the variables for `command` through `get` (the process
    /// environment in production, a table in tests). Empty counts as missing.
    pub fn from_env(
        command: Command,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, CniError> {
        let value = |name: &str| get(name).unwrap_or_default();
        let missing: Vec<&str> = REQUIRED
            .iter()
            .filter(|(name, cmds)| cmds.contains(&command) && value(name).is_empty())
            .map(|(name, _)| *name)
            .collect();
        if !missing.is_empty() {
            return Err(CniError::new(
                ErrorCode::INVALID_ENVIRONMENT_VARIABLES,
                format!("required env variables [{}] missing", missing.join(",")),
            ));
        }
        let args = Self {
            command,
            container_id: value("CNI_CONTAINERID"),
            netns: value("CNI_NETNS"),
            ifname: value("CNI_IFNAME"),
            args: value("CNI_ARGS"),
            path: std::env::split_paths(&value("CNI_PATH"))
                .filter(|p| !p.as_os_str().is_empty())
                .collect(),
            netns_override: matches!(
                value("CNI_NETNS_OVERRIDE").to_ascii_lowercase().as_str(),
                "1" | "true"
            ),
        };
        if command.targets_attachment() {
            validate_container_id(&args.container_id)?;
            validate_ifname(&args.ifname)?;
        }
        Ok(args)
    }

    /// The container's netns path; `None` when `CNI_NETNS` is unset or empty, which
    /// DEL (and commands that target no attachment) must accept.
    pub fn netns_path(&self) -> Option<&str> {
        Some(self.netns.as_str()).filter(|p| !p.is_empty())
    }
}

/// The reference's rule for container ids and network names: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn is_valid_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Validates a network name as the reference plugins do: present, and made of the
/// characters a container id may hold ([`is_valid_identifier`]); code 7, with the name
/// in the details.
pub fn validate_network_name(name: &str) -> Result<(), CniError> {
    if name.is_empty() {
        return Err(CniError::invalid_config("missing network name"));
    }
    if !is_valid_identifier(name) {
        return Err(
            CniError::invalid_config("invalid characters found in network name").with_details(name),
        );
    }
    Ok(())
}

/// The longest `CNI_CONTAINERID` accepted, in bytes. Runtimes use 64 hex digits; a
/// bound keeps every file, comment and name made from it within what reads it back
/// (host-local reservation files, firewall comments).
pub const MAX_CONTAINER_ID_LEN: usize = 1024;

/// Validates `CNI_CONTAINERID`.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    if id.is_empty() {
        return Err(CniError::new(
            ErrorCode::UNKNOWN_CONTAINER,
            "missing containerID",
        ));
    }
    if !is_valid_identifier(id) {
        return Err(CniError::new(
            ErrorCode::INVALID_ENVIRONMENT_VARIABLES,
            "invalid characters in containerID",
        )
        .with_details(id));
    }
    if id.len() > MAX_CONTAINER_ID_LEN {
        return Err(CniError::new(
            ErrorCode::INVALID_ENVIRONMENT_VARIABLES,
            format!(
                "containerID is {} bytes long; at most {MAX_CONTAINER_ID_LEN} are accepted",
                id.len()
            ),
        ));
    }
    Ok(())
}

/// Validates `CNI_IFNAME` as a Linux interface name.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let invalid = |msg: &str| CniError::new(ErrorCode::INVALID_ENVIRONMENT_VARIABLES, msg);
    if name.is_empty() {
        return Err(invalid("interface name is empty"));
    }
    if name.len() > MAX_IFNAME_LEN {
        return Err(invalid("interface name is too long").with_details(format!(
            "interface name should be less than {} characters",
            MAX_IFNAME_LEN + 1
        )));
    }
    if name == "." || name == ".." {
        return Err(invalid("interface name is . or .."));
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(invalid(
            "interface name contains / or : or whitespace characters",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    const FULL: [(&str, &str); 4] = [
        ("CNI_CONTAINERID", "ctr1"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    #[test]
    fn an_unset_or_empty_netns_is_absent() {
        let full = CmdArgs::from_env(Command::Del, env(&FULL)).unwrap();
        assert_eq!(full.netns_path(), Some("/var/run/netns/x"));
        let without = [FULL[0], ("CNI_NETNS", ""), FULL[2], FULL[3]];
        let del = CmdArgs::from_env(Command::Del, env(&without)).unwrap();
        assert_eq!(del.netns_path(), None);
        let del = CmdArgs::from_env(Command::Del, env(&[FULL[0], FULL[2], FULL[3]])).unwrap();
        assert_eq!(del.netns_path(), None);
    }

    #[test]
    fn commands_parse() {
        for c in ["ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION"] {
            assert_eq!(Command::parse(c).unwrap().as_str(), c);
        }
        let err = Command::parse("FOO").unwrap_err();
        assert_eq!(
            (err.code, err.msg.as_str()),
            (ErrorCode(4), "unknown CNI_COMMAND: FOO")
        );
    }

    #[test]
    fn missing_variables_listed_per_command() {
        let cases: [(Command, &str); 6] = [
            (
                Command::Add,
                "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing",
            ),
            (
                Command::Check,
                "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing",
            ),
            (
                Command::Del,
                "required env variables [CNI_CONTAINERID,CNI_IFNAME,CNI_PATH] missing",
            ),
            (Command::Gc, "required env variables [CNI_PATH] missing"),
            (Command::Status, "required env variables [CNI_PATH] missing"),
            (Command::Add, ""),
        ];
        for (cmd, want) in &cases[..5] {
            let err = CmdArgs::from_env(*cmd, env(&[])).unwrap_err();
            assert_eq!(err.code, ErrorCode::INVALID_ENVIRONMENT_VARIABLES);
            assert_eq!(&err.msg, want);
        }
        assert!(CmdArgs::from_env(Command::Version, env(&[])).is_ok());
        let partial = CmdArgs::from_env(
            Command::Add,
            env(&[("CNI_CONTAINERID", "c"), ("CNI_PATH", "/x")]),
        )
        .unwrap_err();
        assert_eq!(
            partial.msg,
            "required env variables [CNI_NETNS,CNI_IFNAME] missing"
        );
    }

    #[test]
    fn full_env_parses() {
        let args = CmdArgs::from_env(Command::Add, env(&FULL)).unwrap();
        assert_eq!(args.container_id, "ctr1");
        assert_eq!(
            args.path,
            vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
        assert!(!args.netns_override);
        let mut with_override = FULL.to_vec();
        with_override.push(("CNI_NETNS_OVERRIDE", "TRUE"));
        assert!(
            CmdArgs::from_env(Command::Add, env(&with_override))
                .unwrap()
                .netns_override
        );
    }

    #[test]
    fn container_id_rules() {
        for (id, ok) in [
            ("a", true),
            ("A-b_c.9", true),
            ("a b", false),
            ("-a", false),
            ("a/b", false),
            ("é", false),
            (&"a".repeat(MAX_CONTAINER_ID_LEN), true),
            (&"a".repeat(MAX_CONTAINER_ID_LEN + 1), false),
        ] {
            assert_eq!(validate_container_id(id).is_ok(), ok, "{id}");
        }
        let err = validate_container_id("a b").unwrap_err();
        assert_eq!(
            (err.code, err.msg.as_str(), err.details.as_str()),
            (ErrorCode(4), "invalid characters in containerID", "a b")
        );
        assert_eq!(
            validate_container_id("").unwrap_err().code,
            ErrorCode::UNKNOWN_CONTAINER
        );
    }

    #[test]
    fn network_name_rules() {
        assert!(validate_network_name("my-net.1_x").is_ok());
        let err = validate_network_name("").unwrap_err();
        assert_eq!(
            (err.code, err.msg.as_str()),
            (ErrorCode(7), "missing network name")
        );
        let err = validate_network_name("a/b").unwrap_err();
        assert_eq!(
            (err.code, err.msg.as_str(), err.details.as_str()),
            (
                ErrorCode(7),
                "invalid characters found in network name",
                "a/b"
            )
        );
    }

    #[test]
    fn ifname_rules() {
        let cases = [
            ("eth0", None),
            ("a23456789012345", None),
            ("", Some("interface name is empty")),
            ("a234567890123456", Some("interface name is too long")),
            (".", Some("interface name is . or ..")),
            ("..", Some("interface name is . or ..")),
            (
                "a/b",
                Some("interface name contains / or : or whitespace characters"),
            ),
            (
                "a:b",
                Some("interface name contains / or : or whitespace characters"),
            ),
            (
                "a b",
                Some("interface name contains / or : or whitespace characters"),
            ),
            (
                "a\u{a0}b",
                Some("interface name contains / or : or whitespace characters"),
            ),
        ];
        for (name, want) in cases {
            match (validate_ifname(name), want) {
                (Ok(()), None) => {}
                (Err(e), Some(msg)) => {
                    assert_eq!(e.code, ErrorCode::INVALID_ENVIRONMENT_VARIABLES);
                    assert_eq!(e.msg, msg, "{name}");
                }
                (got, want) => panic!("{name:?}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(
            validate_ifname("a234567890123456").unwrap_err().details,
            "interface name should be less than 16 characters"
        );
    }
}
