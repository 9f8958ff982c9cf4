//! Every way a cnitool run can fail. Messages follow libcni's words where libcni has
//! them, so what users search for finds both tools.

use cni_protocol::CniError;
use std::path::PathBuf;

/// A failed cnitool run. Every variant makes the process exit 1, as the Go tool does.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A wrong command line (unknown command or flag, missing arguments).
    #[error("{0}")]
    Usage(String),

    /// A bad environment variable (`CNI_ARGS`, `CAP_ARGS`).
    #[error("{0}")]
    Environment(String),

    /// A network config that libcni would refuse, with libcni's message.
    #[error("{0}")]
    Config(String),

    /// A config file or directory that could not be read.
    #[error("error reading {}: {source}", path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },

    /// No config in the directory names the network.
    #[error("no net configuration with name \"{name}\" in {}", dir.display())]
    NotFound {
        /// `NETCONFPATH`.
        dir: PathBuf,
        /// The network asked for.
        name: String,
    },

    /// The directory holds no config at all.
    #[error("no net configurations found in {}", dir.display())]
    NoConfigs {
        /// `NETCONFPATH`.
        dir: PathBuf,
    },

    /// One plugin of the list failed (or could not be run) in one command.
    #[error("plugin {plugin} failed ({command}): {source}")]
    Plugin {
        /// `type="bridge" name="mynet"`, as libcni describes a plugin.
        plugin: String,
        /// `add`, `check`, `delete`, `status`.
        command: &'static str,
        /// What the plugin reported (its error JSON), or why it could not run.
        #[source]
        source: CniError,
    },

    /// CHECK asked of a config version older than 0.4.0.
    #[error("configuration version \"{0}\" does not support the CHECK command")]
    CheckNotSupported(String),

    /// A `cniVersions` entry, or the `cniVersion` beside it, that is no version.
    #[error("error parsing configuration list: invalid {what}: {source}")]
    Version {
        /// `cniVersions entry 1.x at index 0` or `cniVersion 1.x`.
        what: String,
        /// Why it is no version.
        #[source]
        source: CniError,
    },

    /// The cached result of an attachment could not be read back.
    #[error("failed to get network \"{network}\" cached result: {source}")]
    CacheRead {
        /// Network name.
        network: String,
        /// Why.
        #[source]
        source: Box<Error>,
    },

    /// The result of a successful ADD could not be cached.
    #[error("failed to set network \"{network}\" cached result: {source}")]
    CacheWrite {
        /// Network name.
        network: String,
        /// Why.
        #[source]
        source: Box<Error>,
    },

    /// A part of a cache file's name that libcni would refuse on its command line.
    #[error("invalid {part} {value:?}{}", because(.source.as_ref()))]
    CacheName {
        /// `network name`, `container ID` or `interface name`.
        part: &'static str,
        /// The refused value.
        value: String,
        /// The protocol crate's reason, when it has one.
        #[source]
        source: Option<CniError>,
    },

    /// A cache file named with an empty part.
    #[error(
        "cache file path requires network name ({network:?}), container ID ({container_id:?}), and interface name ({ifname:?})"
    )]
    CachePath {
        /// Network name.
        network: String,
        /// Container ID.
        container_id: String,
        /// Interface name.
        ifname: String,
    },

    /// A cache file or its directory that could not be written.
    #[error("{op} {}: {source}", path.display())]
    CacheIo {
        /// `mkdir`, `open` or `write`.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },

    /// A cache file or a result that is not the JSON it should be.
    #[error("{0}")]
    CacheJson(#[source] serde_json::Error),

    /// A result (cached, or to be cached) that is no CNI result of its version.
    #[error("{0}")]
    CacheResult(#[source] CniError),

    /// A cached result that has no form in the config's version.
    #[error("failed to convert cached result to config version {version:?}: {source}")]
    CacheConvert {
        /// The config's version.
        version: String,
        /// Why.
        #[source]
        source: CniError,
    },

    /// One stale attachment that GC could not delete.
    #[error("failed to delete stale attachment {container_id} {ifname}: {source}")]
    StaleAttachment {
        /// Its container id.
        container_id: String,
        /// Its interface.
        ifname: String,
        /// Why the DEL failed.
        #[source]
        source: Box<Error>,
    },

    /// One plugin whose GC failed.
    #[error("failed to GC plugin {plugin}: {source}")]
    Gc {
        /// The plugin's type.
        plugin: String,
        /// What it reported.
        #[source]
        source: CniError,
    },

    /// Several failures of one GC, each on its own line (Go's `errors.Join`).
    #[error("{}", join_lines(.0))]
    Many(Vec<Error>),
}

/// `: ` and the reason's message (its details, such as the refused value, are already
/// in the text).
fn because(reason: Option<&CniError>) -> String {
    reason.map(|e| format!(": {}", e.msg)).unwrap_or_default()
}

fn join_lines(errors: &[Error]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}
