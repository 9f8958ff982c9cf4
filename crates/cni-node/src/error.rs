//! The one error type of the agent. Each variant says what the agent was doing and
//! keeps the cause as its `source`, so a log line ([`chain`]) shows the whole story
//! down to the kernel's or the API server's own words.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use ipnetwork::IpNetwork;

pub use cni_protocol::error::chain;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The netlink socket could not be opened.
    #[error("cannot open a netlink socket")]
    Netlink(#[source] cni_linux::Error),

    /// The host's links, addresses or routes could not be read.
    #[error("cannot read this host's links, addresses and routes")]
    ReadHost(#[source] cni_linux::Error),

    /// The host's link, address and route notifications could not be subscribed to.
    #[error("cannot subscribe to this host's link, address and route notifications")]
    HostEvents(#[source] io::Error),

    /// The pod records' directory could not be made or watched.
    #[error("cannot watch the pod records in {path}")]
    Records {
        /// The directory.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },

    /// The network config could not be written.
    #[error("cannot write {path}")]
    WriteConfig {
        /// The file.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: io::Error,
    },

    /// The kernel refused a route change.
    #[error("cannot {action} the route {dst} via {via}")]
    Route {
        /// `add`, `replace` or `delete`.
        action: &'static str,
        /// The route's destination.
        dst: IpNetwork,
        /// Its next hop.
        via: String,
        /// The kernel's answer.
        #[source]
        source: cni_linux::Error,
    },

    /// The kernel refused a change of a VXLAN device.
    #[error("cannot {what} the VXLAN device {name}")]
    Vxlan {
        /// The device.
        name: String,
        /// What was tried.
        what: &'static str,
        /// The kernel's answer.
        #[source]
        source: cni_linux::Error,
    },

    /// A link has the name of one of the agent's VXLAN devices but is not one.
    #[error(
        "link {name} ({what}) is not this agent's VXLAN device (kind vxlan with its VNI): left \
         alone, so the nodes that need it stay unreachable (rename it or set --vxlan-device \
         or --vxlan-vni)"
    )]
    ForeignDevice {
        /// Its name.
        name: String,
        /// What it is.
        what: String,
    },

    /// The kernel refused an FDB or neighbour entry of a VXLAN device.
    #[error("cannot program a VXLAN peer")]
    VxlanEntry(#[source] cni_linux::Error),

    /// A batch of route and VXLAN changes could not be sent or answered at all.
    #[error("cannot apply {count} route and VXLAN changes")]
    Batch {
        /// The changes in the batch.
        count: usize,
        /// The socket's error.
        #[source]
        source: cni_linux::Error,
    },

    /// The egress SNAT rules could not be brought in step.
    #[error("egress SNAT ({backend})")]
    Egress {
        /// `nftables` or `iptables`.
        backend: &'static str,
        /// The firewall's error.
        #[source]
        source: cni_firewall::Error,
    },

    /// The NetworkPolicy table could not be brought in step.
    #[error("NetworkPolicy table")]
    Policy(#[source] cni_firewall::Error),

    /// `--masquerade-backend auto` found no usable firewall.
    #[error("no firewall for egress SNAT (or run with --masquerade-backend none)")]
    NoFirewall(#[source] cni_firewall::Error),

    /// `--kubeconfig` could not be read.
    #[error("cannot read kubeconfig {path}")]
    ReadKubeconfig {
        /// The file.
        path: PathBuf,
        /// kube's error.
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// No API configuration was found by inference.
    #[error("no Kubernetes API configuration found")]
    InferConfig(#[source] kube::config::InferConfigError),

    /// The API client could not be built from the configuration.
    #[error("cannot make a Kubernetes client")]
    Client(#[source] kube::Error),

    /// The probes' and metrics' address could not be bound.
    #[error("cannot serve health checks and metrics on {addr}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What bind(2) said.
        #[source]
        source: io::Error,
    },

    /// A signal handler could not be installed.
    #[error("cannot handle {signal}")]
    Signal {
        /// The signal's name.
        signal: &'static str,
        /// The runtime's error.
        #[source]
        source: io::Error,
    },

    /// A thread of the agent could not be started.
    #[error("cannot start the {name} thread")]
    Thread {
        /// Which thread.
        name: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The async runtime could not be started.
    #[error("cannot start the async runtime")]
    Runtime(#[source] io::Error),

    /// `explain` was asked about a protocol NetworkPolicy does not name.
    #[error("unknown protocol {0:?}: TCP, UDP or SCTP")]
    ExplainProtocol(String),

    /// `explain` was asked about a pod the agent does not know.
    #[error("no pod {0:?} (namespace/name) and not an address")]
    ExplainNoPod(String),

    /// `explain` was asked about a pod without an address of the family.
    #[error("pod {pod} has no {family} address yet")]
    ExplainNoAddress {
        /// The pod.
        pod: String,
        /// `IPv4` or `IPv6`.
        family: &'static str,
    },

    /// `explain` was asked about two addresses of different families.
    #[error("{0} and {1} are of different families")]
    ExplainFamilies(IpAddr, IpAddr),

    /// The explain socket could not be made.
    #[error("cannot serve explain on {path}")]
    ExplainSocket {
        /// The socket's path.
        path: PathBuf,
        /// What the file system or bind(2) said.
        #[source]
        source: io::Error,
    },

    /// Another process answers on the explain socket's path.
    #[error(
        "another cni-node answers on the explain socket {0} (give this one another \
         --explain-socket, or off)"
    )]
    ExplainSocketInUse(PathBuf),

    /// Something other than a socket is at the explain socket's path.
    #[error("{0} is not a socket; the explain socket is not made over it")]
    ExplainSocketNotOurs(PathBuf),

    /// `cni-node explain` could not talk to the agent.
    #[error(
        "cannot ask the agent at {socket} (its --explain-socket: run as root in the \
         agent's pod or on its node)"
    )]
    AgentUnreachable {
        /// The agent's explain socket.
        socket: PathBuf,
        /// What the connection said.
        #[source]
        source: io::Error,
    },

    /// The agent did not answer the question.
    #[error("the agent at {socket} answered: {answer}")]
    AgentRefused {
        /// The agent's explain socket.
        socket: PathBuf,
        /// Its answer.
        answer: String,
    },

    /// The WireGuard key file could not be read, made or written.
    #[error("cannot {action} the WireGuard key file {path}")]
    KeyFile {
        /// `read`, `create` or `write`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: io::Error,
    },

    /// The WireGuard key file holds something that is not a key.
    #[error(
        "the WireGuard key file {path} does not hold a key ({why}); move it away to have a \
         new key made, or restore it from a backup"
    )]
    BadKeyFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },

    /// This kernel has no WireGuard.
    #[error(
        "this kernel has no WireGuard (no \"wireguard\" generic netlink family; load the \
         module or use a kernel that has it): pod traffic to other nodes goes in clear"
    )]
    NoWireguard,

    /// A WireGuard request failed.
    #[error("cannot {what} the WireGuard device {device}")]
    Wireguard {
        /// The device.
        device: String,
        /// What was asked.
        what: String,
        /// The kernel's answer.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A link with the WireGuard device's name is not a WireGuard device.
    #[error(
        "{name} exists and is not the agent's WireGuard device ({what}): it is left alone \
         and pod traffic to other nodes goes in clear; give --wireguard-device another name"
    )]
    ForeignWireguardDevice {
        /// The link's name.
        name: String,
        /// What it is.
        what: String,
    },

    /// This node's public key could not be published on its Node object.
    #[error("cannot write the annotation {annotation} of Node {node}")]
    Publish {
        /// The annotation.
        annotation: &'static str,
        /// This node's name.
        node: String,
        /// What the API server said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The strict mode's firewall table could not be written.
    #[error("cannot write the strict encryption table")]
    Strict(#[source] cni_firewall::error::Error),

    /// The metrics could not be encoded (a bug: the registry holds only our metrics).
    #[error("cannot encode the metrics")]
    Metrics(#[source] std::fmt::Error),
}

impl Error {
    /// A route change the kernel refused.
    pub fn route(
        action: &'static str,
        dst: IpNetwork,
        via: Option<IpAddr>,
        source: cni_linux::Error,
    ) -> Self {
        Self::Route {
            action,
            dst,
            via: via.map_or_else(|| "no gateway".to_owned(), |v| v.to_string()),
            source,
        }
    }
}
