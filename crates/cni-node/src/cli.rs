//! The command line: long options parsed by hand, `--opt value` and `--opt=value`
//! alike; the node's name also comes from `NODE_NAME`.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnetwork::IpNetwork;

/// `--help` text.
pub const USAGE: &str = "\
Usage: cni-node [OPTIONS]

The cni-plugins-rs node agent. Watches the Kubernetes Node objects and keeps this
node in step with them: the CNI network config for its pod CIDRs (bridge +
host-local, portmap when installed, loopback), a route to every other node's pod
CIDR via that node's InternalIP (nodes on one L2 segment), masquerading of pod
traffic that leaves the cluster, and a pod MTU that fits the node's uplink.
Stopping it leaves routes and rules in place; the next start reconciles them.

Options:
  --node-name NAME          this node's name (default: $NODE_NAME)
  --kubeconfig FILE         kubeconfig to use (default: $KUBECONFIG, ~/.kube/config,
                            then the in-cluster service account)
  --cni-conf-dir DIR        where to write the network config (default: /etc/cni/net.d)
  --cni-bin-dir DIR         the CNI plugins, to see if portmap is installed
                            (default: /opt/cni/bin)
  --conflist-name NAME      the config's file name (default: 10-cni-plugins-rs.conflist)
  --network-name NAME       the network's name in it (default: k8s-pod-network)
  --bridge NAME             the bridge's name in it (default: cni0)
  --ipam-data-dir DIR       host-local's dataDir in it (default: host-local's own,
                            /var/lib/cni/networks)
  --mtu N                   the pod MTU (default: the MTU of the link holding the
                            node's InternalIP, the smaller one if the families differ)
  --cluster-cidr CIDR       accept only pod CIDRs inside these (repeatable or
                            comma-separated; default: any)
  --no-masquerade-cidr CIDR destinations pods reach with their own address besides
                            every node's pod CIDR (repeatable or comma-separated)
  --masquerade-backend B    nftables, iptables, auto (default: auto: nftables when
                            the kernel's nf_tables answers), or none (no egress SNAT)
  --route-protocol N        the protocol number marking the agent's routes, 5-254
                            (default: 77); `ip route show proto N` lists them
  --health-addr ADDR        where /healthz and /readyz are served (default:
                            127.0.0.1:9743; \"off\" for none)
  --resync-interval SECS    how often routes and rules are checked and repaired even
                            without a change from the API (default: 10)
  --page-size N             Nodes per page of the initial list (default: 250)
  --verbose                 also log every change of every node
  --version                 print the version and build commit
  --help                    print this help
";

/// What was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `--help`.
    Help,
    /// `--version`.
    Version,
    /// Run the agent.
    Run(Box<Options>),
}

/// Which egress SNAT rules to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MasqueradeBackend {
    /// nftables when nf_tables answers, else iptables.
    Auto,
    /// nftables.
    Nftables,
    /// iptables (the nf_tables or legacy variant, whichever `iptables-restore` is).
    Iptables,
    /// No egress SNAT (something else does it).
    None,
}

/// The agent's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `--node-name` or `$NODE_NAME`.
    pub node_name: String,
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--cni-conf-dir`.
    pub conf_dir: PathBuf,
    /// `--cni-bin-dir`.
    pub bin_dir: PathBuf,
    /// `--conflist-name`.
    pub conflist_name: String,
    /// `--network-name`.
    pub network_name: String,
    /// `--bridge`.
    pub bridge: String,
    /// `--ipam-data-dir`.
    pub ipam_data_dir: Option<PathBuf>,
    /// `--mtu`.
    pub mtu: Option<u32>,
    /// `--cluster-cidr`.
    pub cluster_cidrs: Vec<IpNetwork>,
    /// `--no-masquerade-cidr`.
    pub no_masquerade: Vec<IpNetwork>,
    /// `--masquerade-backend`.
    pub masquerade: MasqueradeBackend,
    /// `--route-protocol`.
    pub route_protocol: u8,
    /// `--health-addr`; None for off.
    pub health_addr: Option<SocketAddr>,
    /// `--resync-interval`.
    pub resync: Duration,
    /// `--page-size`.
    pub page_size: u32,
    /// `--verbose`.
    pub verbose: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            node_name: String::new(),
            kubeconfig: None,
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dir: PathBuf::from("/opt/cni/bin"),
            conflist_name: "10-cni-plugins-rs.conflist".into(),
            network_name: "k8s-pod-network".into(),
            bridge: "cni0".into(),
            ipam_data_dir: None,
            mtu: None,
            cluster_cidrs: Vec::new(),
            no_masquerade: Vec::new(),
            masquerade: MasqueradeBackend::Auto,
            route_protocol: 77,
            health_addr: Some(SocketAddr::from(([127, 0, 0, 1], 9743))),
            resync: Duration::from_secs(10),
            page_size: 250,
            verbose: false,
        }
    }
}

/// Parses the arguments after the program name; `node_name_env` is `$NODE_NAME`.
pub fn parse(
    args: impl IntoIterator<Item = OsString>,
    node_name_env: Option<String>,
) -> Result<Command, String> {
    let mut o = Options::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let text = arg
            .to_str()
            .ok_or_else(|| format!("unknown argument {arg:?}"))?;
        let (flag, inline) = match text.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_owned())),
            _ => (text, None),
        };
        let switch = matches!(flag, "--help" | "-h" | "--version" | "--verbose");
        if switch && inline.is_some() {
            return Err(format!("{flag} takes no value"));
        }
        let mut value = || -> Result<String, String> {
            let value = match inline.clone() {
                Some(v) => v,
                None => args
                    .next()
                    .ok_or_else(|| format!("{flag} needs a value"))?
                    .into_string()
                    .map_err(|v| format!("{flag}: not UTF-8: {v:?}"))?,
            };
            if value.is_empty() {
                return Err(format!("{flag} needs a non-empty value"));
            }
            Ok(value)
        };
        match flag {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" => return Ok(Command::Version),
            "--verbose" => o.verbose = true,
            "--node-name" => o.node_name = value()?,
            "--kubeconfig" => o.kubeconfig = Some(value()?.into()),
            "--cni-conf-dir" => o.conf_dir = value()?.into(),
            "--cni-bin-dir" => o.bin_dir = value()?.into(),
            "--conflist-name" => o.conflist_name = file_name(flag, value()?)?,
            "--network-name" => o.network_name = value()?,
            "--bridge" => o.bridge = interface_name(flag, value()?)?,
            "--ipam-data-dir" => o.ipam_data_dir = Some(value()?.into()),
            "--mtu" => o.mtu = Some(number(flag, &value()?, 68, 65_535)?),
            "--cluster-cidr" => o.cluster_cidrs.extend(cidrs(flag, &value()?)?),
            "--no-masquerade-cidr" => o.no_masquerade.extend(cidrs(flag, &value()?)?),
            "--masquerade-backend" => {
                o.masquerade = match value()?.as_str() {
                    "auto" => MasqueradeBackend::Auto,
                    "nftables" => MasqueradeBackend::Nftables,
                    "iptables" => MasqueradeBackend::Iptables,
                    "none" => MasqueradeBackend::None,
                    other => {
                        return Err(format!(
                            "{flag} {other:?}: expected nftables, iptables, auto or none"
                        ));
                    }
                };
            }
            "--route-protocol" => {
                // 0-4 are the kernel's own (unspec, redirect, kernel, boot, static).
                let n = number(flag, &value()?, 5, 254)?;
                o.route_protocol = u8::try_from(n).map_err(|_| format!("{flag} {n}: too big"))?;
            }
            "--health-addr" => {
                let v = value()?;
                o.health_addr = if v == "off" {
                    None
                } else {
                    Some(v.parse().map_err(|_| {
                        format!("{flag} {v:?}: expected IP:PORT (e.g. 127.0.0.1:9743) or off")
                    })?)
                };
            }
            "--resync-interval" => {
                o.resync = Duration::from_secs(u64::from(number(flag, &value()?, 1, 86_400)?));
            }
            "--page-size" => o.page_size = number(flag, &value()?, 1, 10_000)?,
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if o.node_name.is_empty() {
        o.node_name = node_name_env.filter(|n| !n.is_empty()).ok_or_else(|| {
            "no node name: set NODE_NAME (the DaemonSet sets it from spec.nodeName) or \
             --node-name"
                .to_owned()
        })?;
    }
    Ok(Command::Run(Box::new(o)))
}

fn number(flag: &str, text: &str, min: u32, max: u32) -> Result<u32, String> {
    text.parse::<u32>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| format!("{flag} {text:?}: expected a whole number from {min} to {max}"))
}

fn cidrs(flag: &str, text: &str) -> Result<Vec<IpNetwork>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            let net = cni_protocol::ip::parse_cidr(t)
                .ok_or_else(|| format!("{flag} {t:?}: not a CIDR"))?;
            IpNetwork::new(net.network(), net.prefix())
                .map_err(|_| format!("{flag} {t:?}: not a CIDR"))
        })
        .collect()
}

fn file_name(flag: &str, name: String) -> Result<String, String> {
    let loadable = [".conflist", ".conf", ".json"]
        .iter()
        .any(|ext| name.len() > ext.len() && name.ends_with(ext));
    if name.contains('/') || name.starts_with('.') || !loadable {
        return Err(format!(
            "{flag} {name:?}: a file name ending in .conflist, .conf or .json (what runtimes load)"
        ));
    }
    Ok(name)
}

fn interface_name(flag: &str, name: String) -> Result<String, String> {
    if name.len() > 15 || name.contains(['/', ' ', ':']) || name == "." || name == ".." {
        return Err(format!("{flag} {name:?}: not a valid interface name"));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str], env: Option<&str>) -> Result<Command, String> {
        parse(args.iter().map(OsString::from), env.map(str::to_owned))
    }

    fn run(args: &[&str]) -> Options {
        match parse_strs(args, Some("node-a")) {
            Ok(Command::Run(o)) => *o,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_take_the_node_name_from_the_environment() {
        let o = run(&[]);
        assert_eq!(o.node_name, "node-a");
        assert_eq!(o.conf_dir, PathBuf::from("/etc/cni/net.d"));
        assert_eq!(o.route_protocol, 77);
        let e = parse_strs(&[], None).unwrap_err();
        assert!(e.contains("NODE_NAME"), "{e}");
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
            "--no-masquerade-cidr=198.51.100.0/24",
            "--masquerade-backend=iptables",
            "--route-protocol",
            "201",
            "--health-addr=off",
            "--resync-interval=3",
            "--page-size=50",
            "--verbose",
        ]);
        assert_eq!(o.node_name, "n2");
        assert_eq!(o.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(o.bin_dir, PathBuf::from("/b"));
        assert_eq!(o.conflist_name, "20-x.conflist");
        assert_eq!(o.bridge, "br9");
        assert_eq!(o.ipam_data_dir, Some(PathBuf::from("/d")));
        assert_eq!(o.mtu, Some(1400));
        assert_eq!(o.cluster_cidrs.len(), 2);
        assert_eq!(o.no_masquerade.len(), 2);
        assert_eq!(o.masquerade, MasqueradeBackend::Iptables);
        assert_eq!(o.route_protocol, 201);
        assert_eq!(o.health_addr, None);
        assert_eq!(o.resync, Duration::from_secs(3));
        assert_eq!(o.page_size, 50);
        assert!(o.verbose);
    }

    #[test]
    fn bad_values_name_the_flag_and_the_value() {
        for (args, want) in [
            (&["--mtu", "9"][..], "--mtu \"9\""),
            (&["--route-protocol=3"][..], "--route-protocol \"3\""),
            (
                &["--cluster-cidr=10.0.0.0/33"][..],
                "--cluster-cidr \"10.0.0.0/33\"",
            ),
            (&["--masquerade-backend=pf"][..], "\"pf\""),
            (&["--health-addr=localhost"][..], "--health-addr"),
            (&["--conflist-name=../x.conf"][..], "--conflist-name"),
            (&["--conflist-name=x.yaml"][..], "--conflist-name"),
            (&["--bridge=a-very-long-bridge-name"][..], "--bridge"),
            (&["--mtu"][..], "--mtu needs a value"),
            (&["--verbose=1"][..], "takes no value"),
            (&["--frobnicate"][..], "unknown argument"),
        ] {
            let e = parse_strs(args, Some("n")).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }

    #[test]
    fn help_and_version() {
        assert_eq!(parse_strs(&["--help"], None), Ok(Command::Help));
        assert_eq!(parse_strs(&["--version"], None), Ok(Command::Version));
    }
}
