//! The command line (clap, derived): every option has a long name, `--opt value` and
//! `--opt=value` alike; the node's name also comes from `NODE_NAME` and the log format
//! from `CNI_NODE_LOG_FORMAT`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use ipnetwork::IpNetwork;

const ABOUT: &str = "The cni-plugins-rs node agent: keeps this node in step with the \
Kubernetes Node objects";

const LONG_ABOUT: &str = "\
The cni-plugins-rs node agent. Watches the Kubernetes Node objects and keeps this
node in step with them: the CNI network config for its pod CIDRs (bridge +
host-local, portmap and bandwidth when installed, loopback), a route to every other node's pod
CIDR via that node's InternalIP when it is on this node's link, else through a
VXLAN device (--overlay), masquerading of pod traffic that leaves the cluster, and
a pod MTU that fits the node's uplink and the encapsulation.
Stopping it leaves routes and rules in place; the next start reconciles them.

/healthz, /readyz and /metrics (Prometheus) are served on --health-addr;
`cni-node explain` is answered on --explain-socket, a unix socket only root reaches.
The log goes to stderr; RUST_LOG (e.g. RUST_LOG=debug) overrides --verbose; with
--deny-log it has a line per new connection a policy denies.";

/// Which egress SNAT rules to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MasqueradeBackend {
    /// nftables when the kernel's nf_tables answers, else iptables.
    Auto,
    /// nftables.
    Nftables,
    /// iptables (the nf_tables or legacy variant, whichever `iptables-restore` is).
    Iptables,
    /// No egress SNAT (something else does it).
    None,
}

/// How nodes that share no link with this node are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OverlayMode {
    /// Through kernel VXLAN, one device per family; nodes on this node's link are
    /// still routed directly.
    Vxlan,
    /// Not at all: such nodes are skipped with a log line (host-gw).
    Off,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One line of text per event: time, level, message.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The command line: the agent's options, or a subcommand.
#[derive(Debug, Clone, PartialEq, Eq, Parser)]
#[command(
    name = "cni-node",
    version = &cni_build_stamp::STAMP[1..],
    about = ABOUT,
    long_about = LONG_ABOUT,
    max_term_width = 90,
    args_override_self = true,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    /// A subcommand; without one the agent runs.
    #[command(subcommand)]
    pub command: Option<Subcommand>,
    /// The agent's options.
    #[command(flatten)]
    pub options: Options,
}

impl Cli {
    /// Parses the arguments (the program's name first): the agent needs a node name,
    /// a subcommand does not.
    pub fn parse_args(
        args: impl IntoIterator<Item = std::ffi::OsString>,
    ) -> Result<Self, clap::Error> {
        use clap::CommandFactory;
        let cli = Self::try_parse_from(args)?;
        if cli.command.is_none() && cli.options.node_name.is_empty() {
            return Err(Self::command().error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "no node name: set NODE_NAME (the DaemonSet sets it from spec.nodeName) \
                 or --node-name <NAME>",
            ));
        }
        Ok(cli)
    }
}

/// What else `cni-node` does.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum Subcommand {
    /// Says whether the policy tiers (ClusterNetworkPolicy's Admin tier, NetworkPolicy,
    /// the Baseline tier) let a connection through and which tier, policy and rule
    /// decided each direction, as the agent running on this node sees it (asked on its
    /// --explain-socket: run as root in the agent's pod or on its node); exits 0 when
    /// allowed, 1 when denied, 2 without an answer
    Explain(ExplainArgs),
}

/// `cni-node explain`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ExplainArgs {
    /// The source: a pod (namespace/name) or an address
    #[arg(long, value_name = "POD|IP")]
    pub from: String,
    /// The destination: a pod (namespace/name) or an address
    #[arg(long, value_name = "POD|IP")]
    pub to: String,
    /// TCP, UDP or SCTP
    #[arg(long, value_name = "PROTOCOL", default_value = "TCP")]
    pub protocol: String,
    /// The destination port
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// Use the pods' IPv6 addresses
    #[arg(long)]
    pub ipv6: bool,
    /// The source connected to this Service address, which kube-proxy sent on to --to
    /// and --port (the pod's port): judged so, and so a pod reaching itself this way is
    /// judged (reaching its own address directly is not)
    #[arg(long, value_name = "IP")]
    pub via_service: Option<IpAddr>,
    /// The running agent's --explain-socket
    #[arg(
        long = "explain-socket",
        value_name = "PATH",
        default_value = crate::explain_socket::DEFAULT_PATH,
        value_parser = socket_path
    )]
    pub explain_socket: PathBuf,
}

/// The agent's settings.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Options {
    /// This node's name (required to run the agent)
    #[arg(
        long,
        env = "NODE_NAME",
        value_name = "NAME",
        default_value = "",
        hide_default_value = true
    )]
    pub node_name: String,

    /// The kubeconfig to use [default: $KUBECONFIG, ~/.kube/config, then the in-cluster
    /// service account]
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Where to write the network config
    #[arg(
        long = "cni-conf-dir",
        value_name = "DIR",
        default_value = "/etc/cni/net.d"
    )]
    pub conf_dir: PathBuf,

    /// The CNI plugins, to see whether portmap is installed
    #[arg(
        long = "cni-bin-dir",
        value_name = "DIR",
        default_value = "/opt/cni/bin"
    )]
    pub bin_dir: PathBuf,

    /// The config's file name
    #[arg(
        long,
        value_name = "NAME",
        default_value = "10-cni-plugins-rs.conflist",
        value_parser = conflist_name
    )]
    pub conflist_name: String,

    /// The network's name in it
    #[arg(long, value_name = "NAME", default_value = "k8s-pod-network", value_parser = non_empty)]
    pub network_name: String,

    /// The bridge's name in it
    #[arg(long, value_name = "NAME", default_value = "cni0", value_parser = interface_name)]
    pub bridge: String,

    /// host-local's dataDir in it [default: host-local's own, /var/lib/cni/networks]
    #[arg(long, value_name = "DIR")]
    pub ipam_data_dir: Option<PathBuf>,

    /// The pod MTU [default: the MTU of the link holding the node's InternalIP, the
    /// smaller one if the families differ]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(68..=65_535))]
    pub mtu: Option<u32>,

    /// Accept only pod CIDRs inside these (repeatable or comma-separated) [default: any]
    #[arg(long = "cluster-cidr", value_name = "CIDR", value_delimiter = ',', value_parser = cidr)]
    pub cluster_cidrs: Vec<IpNetwork>,

    /// Destinations pods reach with their own address besides every node's pod CIDR
    /// (repeatable or comma-separated)
    #[arg(
        long = "no-masquerade-cidr",
        value_name = "CIDR",
        value_delimiter = ',',
        value_parser = cidr
    )]
    pub no_masquerade: Vec<IpNetwork>,

    /// Which firewall masquerades egress; none for no egress SNAT
    #[arg(
        long = "masquerade-backend",
        value_name = "BACKEND",
        value_enum,
        default_value_t = MasqueradeBackend::Auto
    )]
    pub masquerade: MasqueradeBackend,

    /// The protocol number marking the agent's routes (`ip route show proto N` lists them)
    #[arg(
        long = "route-protocol",
        value_name = "N",
        default_value_t = 77,
        value_parser = clap::value_parser!(u8).range(5..=254)
    )]
    pub route_protocol: u8,

    /// Where /healthz, /readyz and /metrics are served, IP:PORT, or "off"
    #[arg(
        long = "health-addr",
        value_name = "ADDR",
        default_value = "127.0.0.1:9743",
        value_parser = health_addr
    )]
    pub health_addr: HealthAddr,

    /// Where `cni-node explain` is answered: a unix socket made root-only (0600), a
    /// stale one left by a killed agent replaced, removed at a clean stop; or "off"
    #[arg(
        long = "explain-socket",
        value_name = "PATH",
        default_value = crate::explain_socket::DEFAULT_PATH,
        value_parser = explain_socket
    )]
    pub explain_socket: ExplainSocket,

    /// How often, in seconds, routes and rules are checked and repaired even without a
    /// change from the API or the host
    #[arg(
        long = "resync-interval",
        value_name = "SECS",
        default_value = "10",
        value_parser = seconds
    )]
    pub resync: Duration,

    /// Nodes per page of the initial list
    #[arg(
        long,
        value_name = "N",
        default_value_t = 250,
        value_parser = clap::value_parser!(u32).range(1..=10_000)
    )]
    pub page_size: u32,

    /// Also log every change of every node (RUST_LOG overrides)
    #[arg(long)]
    pub verbose: bool,

    /// Enforce NetworkPolicy (watches Pods, Namespaces and NetworkPolicies)
    #[arg(
        long = "network-policy",
        value_name = "BOOL",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub network_policy: bool,

    /// NetworkPolicy: a peer of pods (a selector's pods) with at least N address
    /// ranges is held once in a set that the profiles allowing it share, with a rule in
    /// each; a smaller one is copied into each profile's own set, which costs no rule
    /// on the packet path but a change in every copy when one of its pods comes or goes
    #[arg(
        long = "policy-shared-peer-ranges",
        value_name = "N",
        default_value_t = crate::policy::compile::SHARE_FROM as u32,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub policy_shared_peer_ranges: u32,

    /// Log a line per new connection a policy tier denies: both ends (pod or address),
    /// protocol, port, and the tier, policy, rule and direction that denied it
    #[arg(long = "deny-log")]
    pub deny_log: bool,

    /// The deny log's lines per second at most (in the kernel per verdict chain, in
    /// the agent over all; the excess is dropped and counted in /metrics)
    #[arg(
        long = "deny-log-rate",
        value_name = "N",
        default_value_t = crate::deny_log::DEFAULT_RATE,
        value_parser = clap::value_parser!(u32).range(1..=100_000)
    )]
    pub deny_log_rate: u32,

    /// The nfnetlink_log group the deny log is read from (one reader per group on a
    /// host: pick another if something else reads this one)
    #[arg(
        long = "deny-log-group",
        value_name = "N",
        default_value_t = crate::deny_log::DEFAULT_GROUP
    )]
    pub deny_log_group: u16,

    /// Where the bridge plugin records which pod a new address belongs to, so that
    /// NetworkPolicy applies from a pod's first packet (a directory the agent watches)
    #[arg(
        long = "pod-record-dir",
        value_name = "DIR",
        default_value = "/run/cni-plugins-rs/pods"
    )]
    pub pod_record_dir: PathBuf,

    /// Reach nodes behind a router (whose InternalIP is not on this node's link)
    /// through VXLAN; off: skip them, as host-gw does
    #[arg(
        long,
        value_name = "MODE",
        value_enum,
        default_value_t = OverlayMode::Vxlan
    )]
    pub overlay: OverlayMode,

    /// The VXLAN network identifier of the overlay (flannel uses 1, Calico 4096)
    #[arg(
        long = "vxlan-vni",
        value_name = "N",
        default_value_t = 4097,
        value_parser = clap::value_parser!(u32).range(1..=16_777_215)
    )]
    pub vxlan_vni: u32,

    /// The overlay's UDP port: the IANA port (flannel and Cilium use 8472)
    #[arg(
        long = "vxlan-port",
        value_name = "PORT",
        default_value_t = cni_linux::netlink::vxlan::IANA_PORT,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub vxlan_port: u16,

    /// The overlay devices' name prefix: PREFIX4 carries IPv4, PREFIX6 IPv6
    #[arg(
        long = "vxlan-device",
        value_name = "PREFIX",
        default_value = "cni-vx",
        value_parser = device_prefix
    )]
    pub vxlan_device: String,

    /// How log lines are written
    #[arg(
        long = "log-format",
        value_name = "FORMAT",
        env = "CNI_NODE_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
}

impl Options {
    /// The deny log's settings, when it is on (and NetworkPolicy enforced: nothing is
    /// denied otherwise).
    pub fn deny_log_settings(&self) -> Option<crate::deny_log::Settings> {
        (self.deny_log && self.network_policy).then_some(crate::deny_log::Settings {
            group: self.deny_log_group,
            per_second: self.deny_log_rate,
        })
    }
}

/// `--health-addr`: an address or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthAddr(pub Option<SocketAddr>);

/// `--explain-socket`: a path or off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExplainSocket(pub Option<PathBuf>);

fn explain_socket(text: &str) -> Result<ExplainSocket, &'static str> {
    if text == "off" {
        return Ok(ExplainSocket(None));
    }
    socket_path(text)
        .map(|p| ExplainSocket(Some(p)))
        .map_err(|_| "expected a path of at most 107 bytes (a unix socket's limit) or off")
}

fn socket_path(text: &str) -> Result<PathBuf, &'static str> {
    if text.is_empty()
        || text.len() > crate::explain_socket::MAX_PATH_LEN
        || text.ends_with('/')
        || text.contains('\0')
    {
        return Err("expected a path of at most 107 bytes (a unix socket's limit)");
    }
    Ok(PathBuf::from(text))
}

fn non_empty(text: &str) -> Result<String, &'static str> {
    if text.is_empty() {
        return Err("must not be empty");
    }
    Ok(text.to_owned())
}

fn health_addr(text: &str) -> Result<HealthAddr, &'static str> {
    if text == "off" {
        return Ok(HealthAddr(None));
    }
    text.parse()
        .map(|a| HealthAddr(Some(a)))
        .map_err(|_| "expected IP:PORT (e.g. 127.0.0.1:9743) or off")
}

fn seconds(text: &str) -> Result<Duration, &'static str> {
    text.parse::<u64>()
        .ok()
        .filter(|n| (1..=86_400).contains(n))
        .map(Duration::from_secs)
        .ok_or("expected a whole number of seconds from 1 to 86400")
}

fn cidr(text: &str) -> Result<IpNetwork, &'static str> {
    let text = text.trim();
    let net = cni_protocol::ip::parse_cidr(text).ok_or("not a CIDR")?;
    IpNetwork::new(net.network(), net.prefix()).map_err(|_| "not a CIDR")
}

fn conflist_name(name: &str) -> Result<String, &'static str> {
    let loadable = [".conflist", ".conf", ".json"]
        .iter()
        .any(|ext| name.len() > ext.len() && name.ends_with(ext));
    if name.contains('/') || name.starts_with('.') || !loadable {
        return Err("a file name ending in .conflist, .conf or .json (what runtimes load)");
    }
    Ok(name.to_owned())
}

/// A prefix that leaves room for the family digit in an interface name.
fn device_prefix(prefix: &str) -> Result<String, &'static str> {
    interface_name(&format!("{prefix}4"))
        .map(|_| prefix.to_owned())
        .map_err(|_| "a prefix of at most 14 characters that makes a valid interface name")
}

fn interface_name(name: &str) -> Result<String, &'static str> {
    if name.is_empty()
        || name.len() > 15
        || name.contains(['/', ' ', ':'])
        || name == "."
        || name == ".."
    {
        return Err("not a valid interface name");
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::path::Path;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Cli::parse_args(
            std::iter::once("cni-node")
                .chain(args.iter().copied())
                .map(std::ffi::OsString::from),
        )
        .map(|cli| cli.options)
    }

    fn run(args: &[&str]) -> Options {
        let mut with_name = vec!["--node-name=node-a"];
        with_name.extend_from_slice(args);
        parse(&with_name).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let o = run(&[]);
        assert_eq!(o.node_name, "node-a");
        assert_eq!(o.conf_dir, PathBuf::from("/etc/cni/net.d"));
        assert_eq!(o.bin_dir, PathBuf::from("/opt/cni/bin"));
        assert_eq!(o.conflist_name, "10-cni-plugins-rs.conflist");
        assert_eq!(o.network_name, "k8s-pod-network");
        assert_eq!(o.bridge, "cni0");
        assert_eq!(o.route_protocol, 77);
        assert_eq!(o.masquerade, MasqueradeBackend::Auto);
        assert_eq!(
            o.health_addr,
            HealthAddr(Some(SocketAddr::from(([127, 0, 0, 1], 9743))))
        );
        assert_eq!(
            o.explain_socket,
            ExplainSocket(Some(PathBuf::from("/run/cni-node/explain.sock")))
        );
        assert_eq!(o.resync, Duration::from_secs(10));
        assert_eq!(o.page_size, 250);
        assert_eq!(o.log_format, LogFormat::Text);
        assert!(!o.verbose);
        assert_eq!(o.overlay, OverlayMode::Vxlan);
        assert_eq!((o.vxlan_vni, o.vxlan_port), (4097, 4789));
        assert_eq!(o.vxlan_device, "cni-vx");
    }

    #[test]
    fn every_option_in_both_spellings() {
        let o = run(&[
            "--node-name=n2",
            "--kubeconfig",
            "/k",
            "--cni-conf-dir=/c",
            "--cni-bin-dir",
            "/b",
            "--conflist-name=20-x.conflist",
            "--network-name",
            "net",
            "--bridge=br9",
            "--ipam-data-dir=/d",
            "--mtu",
            "1400",
            "--cluster-cidr=10.244.0.0/16,fd00:244::/48",
            "--no-masquerade-cidr",
            "192.0.2.0/24",
            "--no-masquerade-cidr=198.51.100.7/24",
            "--masquerade-backend=iptables",
            "--route-protocol",
            "201",
            "--health-addr=off",
            "--explain-socket=off",
            "--resync-interval=3",
            "--page-size=50",
            "--verbose",
            "--log-format=json",
            "--overlay",
            "off",
            "--vxlan-vni=5000",
            "--vxlan-port",
            "4790",
            "--vxlan-device=ovl",
        ]);
        assert_eq!(o.node_name, "n2");
        assert_eq!(o.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(o.conf_dir, PathBuf::from("/c"));
        assert_eq!(o.bin_dir, PathBuf::from("/b"));
        assert_eq!(o.conflist_name, "20-x.conflist");
        assert_eq!(o.network_name, "net");
        assert_eq!(o.bridge, "br9");
        assert_eq!(o.ipam_data_dir, Some(PathBuf::from("/d")));
        assert_eq!(o.mtu, Some(1400));
        assert_eq!(o.cluster_cidrs.len(), 2);
        // Host bits are cleared: a CIDR names a range.
        assert_eq!(
            o.no_masquerade,
            vec![
                "192.0.2.0/24".parse::<IpNetwork>().unwrap(),
                "198.51.100.0/24".parse().unwrap()
            ]
        );
        assert_eq!(o.masquerade, MasqueradeBackend::Iptables);
        assert_eq!(o.route_protocol, 201);
        assert_eq!(o.health_addr, HealthAddr(None));
        assert_eq!(o.explain_socket, ExplainSocket(None));
        assert_eq!(o.resync, Duration::from_secs(3));
        assert_eq!(o.page_size, 50);
        assert!(o.verbose);
        assert_eq!(o.log_format, LogFormat::Json);
        assert_eq!(o.overlay, OverlayMode::Off);
        assert_eq!((o.vxlan_vni, o.vxlan_port), (5000, 4790));
        assert_eq!(o.vxlan_device, "ovl");
    }

    #[test]
    fn bad_values_name_the_flag_and_the_value() {
        for (args, flag, value) in [
            (&["--mtu", "9"][..], "--mtu", "9"),
            (&["--route-protocol=3"][..], "--route-protocol", "3"),
            (
                &["--cluster-cidr=10.0.0.0/33"][..],
                "--cluster-cidr",
                "10.0.0.0/33",
            ),
            (
                &["--masquerade-backend=pf"][..],
                "--masquerade-backend",
                "pf",
            ),
            (
                &["--health-addr=localhost"][..],
                "--health-addr",
                "localhost",
            ),
            (
                &["--conflist-name=../x.conf"][..],
                "--conflist-name",
                "../x.conf",
            ),
            (&["--conflist-name=x.yaml"][..], "--conflist-name", "x.yaml"),
            (
                &["--bridge=a-very-long-bridge-name"][..],
                "--bridge",
                "a-very-long-bridge-name",
            ),
            (&["--resync-interval=0"][..], "--resync-interval", "0"),
            (
                &["--explain-socket=/run/x/"][..],
                "--explain-socket",
                "/run/x/",
            ),
            (&["--log-format=xml"][..], "--log-format", "xml"),
            (&["--overlay=gre"][..], "--overlay", "gre"),
            (&["--vxlan-vni=16777216"][..], "--vxlan-vni", "16777216"),
            (&["--vxlan-port=0"][..], "--vxlan-port", "0"),
            (
                &["--vxlan-device=fifteen-chars-x"][..],
                "--vxlan-device",
                "fifteen-chars-x",
            ),
        ] {
            let e = run_err(args);
            assert!(e.contains(flag) && e.contains(value), "{args:?}: {e}");
        }
        assert!(run_err(&["--mtu"]).contains("--mtu"));
        assert!(run_err(&["--frobnicate"]).contains("--frobnicate"));
    }

    #[test]
    fn the_deny_log_is_off_unless_asked_for() {
        let o = run(&[]);
        assert!(!o.deny_log);
        assert_eq!(o.deny_log_settings(), None);
        assert_eq!((o.deny_log_rate, o.deny_log_group), (100, 9743));
        let o = run(&["--deny-log", "--deny-log-rate=5", "--deny-log-group", "7"]);
        assert_eq!(
            o.deny_log_settings(),
            Some(crate::deny_log::Settings {
                group: 7,
                per_second: 5
            })
        );
        // Without --deny-log the rate and group change nothing.
        assert_eq!(run(&["--deny-log-rate=5"]).deny_log_settings(), None);
        for (args, flag) in [
            (&["--deny-log-rate=0"][..], "--deny-log-rate"),
            (&["--deny-log-group=65536"][..], "--deny-log-group"),
        ] {
            assert!(run_err(args).contains(flag), "{args:?}");
        }
        // NetworkPolicy off: nothing is denied, nothing to log.
        assert_eq!(
            run(&["--deny-log", "--network-policy=false"]).deny_log_settings(),
            None
        );
    }

    fn run_err(args: &[&str]) -> String {
        let mut with_name = vec!["--node-name=n"];
        with_name.extend_from_slice(args);
        match parse(&with_name) {
            Ok(o) => panic!("{args:?} was accepted: {o:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn without_a_node_name_the_error_says_how_to_give_one() {
        // NODE_NAME may be set in the environment of whoever runs the tests; the
        // command without the env fallback shows the message.
        // NODE_NAME may be set where the tests run; an empty --node-name overrides it.
        let e = parse(&["--node-name="]).unwrap_err().to_string();
        assert!(e.contains("--node-name") && e.contains("NODE_NAME"), "{e}");
        // A subcommand needs no node name.
        let cli = Cli::parse_args(
            [
                "cni-node", "explain", "--from", "x/a", "--to", "y/b", "--port", "80",
            ]
            .map(std::ffi::OsString::from),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(cli.command, Some(Subcommand::Explain(ref e)) if e.via_service.is_none()
                && e.explain_socket == Path::new("/run/cni-node/explain.sock")),
            "{cli:?}"
        );
        let hairpin = Cli::parse_args(
            [
                "cni-node",
                "explain",
                "--from",
                "x/a",
                "--to",
                "x/a",
                "--port",
                "8080",
                "--via-service",
                "10.96.0.10",
            ]
            .map(std::ffi::OsString::from),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(hairpin.command, Some(Subcommand::Explain(ref e)) if e.via_service == Some("10.96.0.10".parse().unwrap())),
            "{hairpin:?}"
        );
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("NODE_NAME"), "{help}");
        assert!(help.contains("--resync-interval"), "{help}");
    }

    /// The agent and `cni-node explain` meet at the same socket unless both are told
    /// another; a path a unix socket cannot have is refused when the command is read.
    #[test]
    fn the_explain_socket_is_one_path_for_agent_and_command() {
        let explain = |extra: &[&str]| {
            let mut args = vec!["cni-node", "explain", "--from=x/a", "--to=y/b", "--port=80"];
            args.extend_from_slice(extra);
            Cli::parse_args(args.into_iter().map(std::ffi::OsString::from)).map(|cli| {
                match cli.command {
                    Some(Subcommand::Explain(e)) => e.explain_socket,
                    other => panic!("{other:?}"),
                }
            })
        };
        assert_eq!(
            run(&[]).explain_socket.0.as_deref(),
            Some(explain(&[]).unwrap().as_path())
        );
        assert_eq!(
            run(&["--explain-socket", "/tmp/n1/explain.sock"]).explain_socket,
            ExplainSocket(Some(PathBuf::from("/tmp/n1/explain.sock")))
        );
        assert_eq!(
            explain(&["--explain-socket=/tmp/n1/explain.sock"]).unwrap(),
            Path::new("/tmp/n1/explain.sock")
        );
        let long = format!("--explain-socket=/{}", "x".repeat(107));
        let e = run_err(&[&long]);
        assert!(
            e.contains("--explain-socket") && e.contains("107 bytes"),
            "{e}"
        );
        assert!(explain(&[&long]).is_err());
        assert!(explain(&["--explain-socket="]).is_err());
        let fits = format!("/{}", "x".repeat(106));
        assert_eq!(
            run(&[&format!("--explain-socket={fits}")]).explain_socket,
            ExplainSocket(Some(PathBuf::from(fits)))
        );
        // The health address's old explain flag is gone, not silently ignored.
        assert!(explain(&["--agent=127.0.0.1:9743"]).is_err());
    }

    #[test]
    fn version_is_the_build_stamp() {
        let v = Cli::command().render_version();
        assert!(
            v.starts_with(&format!(
                "cni-node v{} (cni-plugins-rs, commit ",
                cni_build_stamp::VERSION
            )),
            "{v}"
        );
    }
}
