//! The desired state, as plain data: from the node map and what this host looks like,
//! which pod CIDRs this node serves, its network config (bytes, MTU and why), which
//! routes to other nodes it wants and how each is reached (straight to the node on this
//! node's link, or encapsulated in VXLAN to a node behind a router), the VXLAN devices
//! that takes, which destinations are inside the cluster (never masqueraded), and what
//! each policy tier wants of the kernel ([`crate::policy::pipeline`]). [`desired`] is the
//! whole of it; no effects here.
//!
//! Node data is checked before anything is routed on it: a kubelet writes its own
//! Node's addresses, and one bad or hostile node must not capture another node's (or
//! this node's) traffic. A node that fails a check is skipped with a reason.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use cni_linux::MacAddr;
use cni_linux::netlink::vtep_mac;
use cni_linux::netlink::vxlan::overhead;
use cni_protocol::ip::bounds;
use ipnetwork::IpNetwork;

use crate::conflist::{self, ConflistSettings};
use crate::encryption::{self, ANNOTATION, EncryptionSettings, Key, PeerSpec, underlay_v4};
use crate::host::{self, HostState, HostView, Reach};
use crate::node::NodeInfo;
use crate::policy::compile::SHARE_FROM;
use crate::policy::pipeline::{self, CompileContext, Pipeline};
use crate::store::ItemMap;
use crate::store::Snapshot;

/// How another node's pod CIDR is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextHop {
    /// Straight to the node's InternalIP, on this node's link (host-gw).
    Direct(IpAddr),
    /// Encapsulated: through this node's VXLAN device of the family, to the node's VTEP.
    Tunnel(Tunnel),
    /// Encrypted: through this node's WireGuard device, to the node's peer there.
    Encrypted(Encrypted),
}

/// A remote node's pod CIDR reached through the WireGuard device: a route `<pod CIDR>
/// dev <device>`; the device sends it to the peer whose allowed IPs hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encrypted {
    /// The device's index.
    pub device: u32,
    /// The peer's endpoint address (its InternalIP).
    pub endpoint: IpAddr,
}

impl NextHop {
    /// The route's gateway: the InternalIP, or the remote VTEP address; none through
    /// the WireGuard device.
    pub fn via(&self) -> Option<IpAddr> {
        match self {
            Self::Direct(ip) => Some(*ip),
            Self::Tunnel(t) => Some(t.vtep),
            Self::Encrypted(_) => None,
        }
    }
}

impl std::fmt::Display for NextHop {
    /// `198.18.0.12`, or `10.244.3.0 over VXLAN to 198.19.0.13`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Direct(ip) => write!(f, "{ip}"),
            Self::Tunnel(t) => write!(f, "{} over VXLAN to {}", t.vtep, t.underlay),
            Self::Encrypted(e) => write!(f, "WireGuard to {}", e.endpoint),
        }
    }
}

/// A remote node reached through VXLAN, as flannel programs one: an FDB entry (its
/// VTEP MAC to its underlay address), a neighbour entry (its VTEP address to its VTEP
/// MAC) and a route of its pod CIDR via its VTEP address, onlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunnel {
    /// The node's InternalIP of the family: where the UDP packets go.
    pub underlay: IpAddr,
    /// The first address of its pod CIDR, which its VXLAN device holds.
    pub vtep: IpAddr,
    /// Its VTEP MAC, derived from `underlay` ([`vtep_mac`]): nothing is published.
    pub mac: MacAddr,
}

/// The overlay's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlaySettings {
    /// Whether nodes behind a router are encapsulated (`--overlay vxlan`); when not,
    /// they are skipped, and devices of the agent's left from an earlier run go.
    pub enabled: bool,
    /// VXLAN network identifier.
    pub vni: u32,
    /// UDP port.
    pub port: u16,
    /// Device name prefix: `<prefix>4` and `<prefix>6`.
    pub device_prefix: String,
}

impl OverlaySettings {
    /// The device of one family.
    pub fn device_name(&self, v6: bool) -> String {
        format!("{}{}", self.device_prefix, if v6 { 6 } else { 4 })
    }
}

/// A VXLAN device this node should have: one per family with at least one
/// encapsulated peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayDevice {
    /// Its name.
    pub name: String,
    /// VXLAN network identifier.
    pub vni: u32,
    /// UDP port.
    pub port: u16,
    /// This node's InternalIP of the family: the underlay source address.
    pub local: IpAddr,
    /// The link holding `local`, when known (`dev` of the device).
    pub uplink: Option<u32>,
    /// This node's VTEP MAC.
    pub mac: MacAddr,
    /// This node's VTEP address (the first address of its pod CIDR of the family).
    pub vtep: IpAddr,
    /// The uplink's MTU minus the encapsulation.
    pub mtu: u32,
}

impl OverlayDevice {
    /// Whether it carries IPv6.
    pub fn is_ipv6(&self) -> bool {
        self.local.is_ipv6()
    }
}

/// Settings that shape the plan.
#[derive(Debug, Clone, Default)]
pub struct PlanSettings {
    /// This node's name.
    pub node_name: String,
    /// When not empty, every pod CIDR must lie inside one of these.
    pub cluster_cidrs: Vec<IpNetwork>,
    /// Destinations never masqueraded beside the nodes' pod CIDRs.
    pub no_masquerade: Vec<IpNetwork>,
    /// The overlay for nodes behind a router; `None` (or not enabled): they are
    /// skipped.
    pub overlay: Option<OverlaySettings>,
    /// Encryption between nodes (`--encryption wireguard`), when on.
    pub encryption: Option<EncryptionSettings>,
}

/// What the node map asks of this host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// This node's pod CIDRs (one per family); empty until the controller assigns them.
    pub own_pod_cidrs: Vec<IpNetwork>,
    /// This node's InternalIPs.
    pub own_internal_ips: Vec<IpAddr>,
    /// Routes to other nodes' pod CIDRs: destination -> how it is reached.
    pub routes: BTreeMap<IpNetwork, NextHop>,
    /// Where pod traffic keeps its source address: every accepted pod CIDR and the
    /// operator's extras.
    pub in_cluster: Vec<IpNetwork>,
    /// Nodes (or one family of a node) left out, with the reason.
    pub skipped: BTreeMap<String, String>,
    /// With encryption on: the WireGuard peers, by public key.
    pub peers: BTreeMap<Key, PeerSpec>,
    /// With encryption on: the other nodes reached in clear, with the reason.
    pub clear: BTreeMap<String, String>,
    /// Every other node's pod CIDRs, also of nodes left out, except any that overlap
    /// this node's own.
    pub remote: Vec<IpNetwork>,
    /// Of those, the ones of nodes that publish a key: what strict mode takes only
    /// through the device.
    pub keyed: Vec<IpNetwork>,
}

/// Computes the plan.
pub fn plan(nodes: &ItemMap<NodeInfo>, host: &HostView, settings: &PlanSettings) -> Plan {
    let mut out = Plan::default();
    let skip = |out: &mut Plan, name: &str, why: String| {
        out.skipped
            .entry(name.to_owned())
            .and_modify(|w| {
                w.push_str("; ");
                w.push_str(&why);
            })
            .or_insert(why);
    };

    // Pod CIDRs every accepted node may use, after the per-node checks.
    let mut candidates: Vec<(&NodeInfo, IpNetwork)> = Vec::new();
    for node in nodes.values() {
        if !node.problems.is_empty() {
            skip(&mut out, &node.name, node.problems.join("; "));
            continue;
        }
        let own = node.name == settings.node_name;
        for &cidr in &node.pod_cidrs {
            if let Some(why) = cidr_problem(node, cidr, host, settings, own) {
                skip(&mut out, &node.name, why);
            } else {
                candidates.push((node, cidr));
            }
        }
    }
    let overlapping = overlaps(&candidates, &settings.node_name);
    let mut accepted: Vec<(&NodeInfo, IpNetwork)> = Vec::new();
    for (node, cidr) in candidates {
        if let Some(other) = overlapping.get(&(node.name.as_str(), cidr)) {
            skip(
                &mut out,
                &node.name,
                format!("pod CIDR {cidr} overlaps node {other:?}'s"),
            );
        } else {
            accepted.push((node, cidr));
        }
    }

    if let Some(me) = nodes.get(&settings.node_name) {
        out.own_internal_ips = me.internal_ips.clone();
    }
    let own_pod_cidrs: Vec<IpNetwork> = accepted
        .iter()
        .filter(|(n, _)| n.name == settings.node_name)
        .map(|&(_, c)| c)
        .collect();
    let shared_keys = shared_keys(nodes, host);
    for &(node, cidr) in &accepted {
        out.in_cluster.push(cidr);
        if node.name == settings.node_name {
            out.own_pod_cidrs.push(cidr);
            continue;
        }
        if settings.encryption.is_some() && node.key().is_some() {
            out.keyed.push(cidr);
        }
        if let Some(encrypted) = encrypt(
            node,
            host,
            settings,
            &out.own_internal_ips,
            &own_pod_cidrs,
            &shared_keys,
        ) {
            match encrypted {
                Ok((hop, peer)) => {
                    out.peers
                        .entry(peer.public_key)
                        .or_insert(peer)
                        .allowed_ips
                        .push(cidr);
                    if let Some(hop) = hop {
                        out.routes.insert(cidr, hop);
                        continue;
                    }
                    out.clear.insert(
                        node.name.clone(),
                        "this node's public key is not on its Node object yet".to_owned(),
                    );
                }
                Err(why) => {
                    out.clear.insert(node.name.clone(), why);
                }
            }
        }
        let reached = match next_hop(node, cidr, host, &own_pod_cidrs) {
            Ok(via) => Ok(NextHop::Direct(via)),
            Err(NoRoute::BehindGateway { via, gateway }) => tunnel(
                via,
                gateway,
                cidr,
                &out.own_internal_ips,
                &own_pod_cidrs,
                settings,
            ),
            Err(why) => Err(why),
        };
        match reached {
            Ok(hop) => {
                out.routes.insert(cidr, hop);
            }
            Err(why) => skip(&mut out, &node.name, why.to_string()),
        }
    }
    // Every other node's pod CIDRs, also of a node left out (its pods are pods all the
    // same: strict mode sends them nothing in clear), except where they overlap this
    // node's own (which its own pods use).
    // A set beside the list: at thousands of nodes a search of the list per CIDR was
    // most of the plan's time.
    let mut remote = HashSet::new();
    for node in nodes.values().filter(|n| n.name != settings.node_name) {
        for &cidr in &node.pod_cidrs {
            let ours = own_pod_cidrs
                .iter()
                .any(|o| o.contains(cidr.network()) || cidr.contains(o.network()));
            if !ours && remote.insert(cidr) {
                out.remote.push(cidr);
            }
        }
    }
    for (cidr, name, why) in vtep_mac_clashes(&out.routes, &out.own_internal_ips, &accepted) {
        out.routes.remove(&cidr);
        skip(&mut out, &name, why);
    }
    out.in_cluster
        .extend(settings.no_masquerade.iter().copied());
    out
}

/// Public keys that more than one node publishes, or that are this node's own: such
/// nodes are reached in clear (one key is one peer; a copied key would merge them).
fn shared_keys(nodes: &ItemMap<NodeInfo>, host: &HostView) -> BTreeMap<Key, String> {
    let mut seen: BTreeMap<Key, Vec<&str>> = BTreeMap::new();
    for node in nodes.values() {
        if let Some(key) = node.key() {
            seen.entry(key).or_default().push(&node.name);
        }
    }
    seen.into_iter()
        .filter(|(key, names)| {
            names.len() > 1 || host.wireguard.is_some_and(|l| l.public_key == *key)
        })
        .map(|(key, names)| (key, names.join(", ")))
        .collect()
}

/// How `node`'s pod CIDRs are reached when encryption is on: the peer it is (its
/// allowed IPs still empty) and the route through the device (none until this node's
/// key is published), or why it is reached in clear; `None` with encryption off.
fn encrypt(
    node: &NodeInfo,
    host: &HostView,
    settings: &PlanSettings,
    own_internal_ips: &[IpAddr],
    own_pod_cidrs: &[IpNetwork],
    shared_keys: &BTreeMap<Key, String>,
) -> Option<Result<(Option<NextHop>, PeerSpec), String>> {
    settings.encryption.as_ref()?;
    let key = match &node.wireguard_key {
        None => return Some(Err("it publishes no WireGuard key".to_owned())),
        Some(Err(why)) => {
            return Some(Err(format!(
                "its annotation {ANNOTATION} is not a WireGuard key ({why})"
            )));
        }
        Some(Ok(key)) => *key,
    };
    let Some(local) = host.wireguard else {
        return Some(Err(
            "this node's WireGuard device is not ready (see the encryption step)".to_owned(),
        ));
    };

    if let Some(names) = shared_keys.get(&key) {
        return Some(Err(format!(
            "its WireGuard key is also another node's or this node's ({names})"
        )));
    }
    let v4 = underlay_v4(own_internal_ips);
    let family = if v4 { "IPv4" } else { "IPv6" };
    let Some(endpoint) = node.internal_ip(v4) else {
        return Some(Err(format!(
            "no {family} InternalIP to be a WireGuard endpoint (this node's underlay is {family})"
        )));
    };
    let unusable = if host.addresses.contains(&endpoint) {
        Some(NoRoute::OwnAddress(endpoint))
    } else if own_pod_cidrs.iter().any(|c| c.contains(endpoint)) {
        Some(NoRoute::InsideOwnPodCidr(endpoint))
    } else if matches!(host.reach(endpoint), Reach::NoRoute) {
        Some(NoRoute::Unreachable(endpoint))
    } else {
        None
    };
    if let Some(why) = unusable {
        return Some(Err(why.to_string()));
    }
    // Peered from the start (what it sends is taken), but routed through the device
    // only once this node's key is on its Node object.
    let hop = local.published.then_some(NextHop::Encrypted(Encrypted {
        device: local.index,
        endpoint,
    }));
    Some(Ok((
        hop,
        PeerSpec {
            node: node.name.clone(),
            public_key: key,
            endpoint: SocketAddr::new(endpoint, local.port),
            allowed_ips: Vec::new(),
        },
    )))
}

/// Why a node's pod CIDR cannot be used, checked against this host alone.
fn cidr_problem(
    node: &NodeInfo,
    cidr: IpNetwork,
    host: &HostView,
    settings: &PlanSettings,
    own: bool,
) -> Option<String> {
    if !settings.cluster_cidrs.is_empty()
        && !settings.cluster_cidrs.iter().any(|c| {
            c.is_ipv4() == cidr.is_ipv4()
                && c.contains(cidr.network())
                && c.prefix() <= cidr.prefix()
        })
    {
        return Some(format!("pod CIDR {cidr} is outside the cluster CIDRs"));
    }
    // This node's own range holds its bridge's gateway address; any other node's
    // range that holds an address of this host would capture its traffic.
    if let Some(ip) = host.addresses.iter().find(|a| !own && cidr.contains(**a)) {
        return Some(format!("pod CIDR {cidr} holds this host's address {ip}"));
    }
    if let Some(ip) = node.internal_ips.iter().find(|a| cidr.contains(**a)) {
        return Some(format!(
            "pod CIDR {cidr} holds the node's own InternalIP {ip}"
        ));
    }
    None
}

/// The overlapping pod CIDRs, each with a node it overlaps. Two nodes that claim
/// overlapping ranges are both left out (which one is right cannot be told), except
/// this node: its own range is what its pods use, so the other one goes.
fn overlaps<'a>(
    candidates: &[(&'a NodeInfo, IpNetwork)],
    me: &str,
) -> BTreeMap<(&'a str, IpNetwork), String> {
    let mut out = BTreeMap::new();
    for v4 in [true, false] {
        // CIDRs either nest or are disjoint: sorted by start (widest first at a tie),
        // a CIDR overlaps an earlier one exactly when it starts before the widest
        // earlier end, and that widest one is the range holding it.
        let mut sorted: Vec<(u128, u128, &str, IpNetwork)> = candidates
            .iter()
            .filter(|(_, c)| c.is_ipv4() == v4)
            .map(|(n, c)| {
                let (start, end) = bounds(*c);
                (start, end, n.name.as_str(), *c)
            })
            .collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut widest: Option<(u128, &str, IpNetwork)> = None;
        for (start, end, name, cidr) in sorted {
            match widest {
                Some((wend, wname, wcidr)) if start <= wend => {
                    if name != me {
                        out.insert((name, cidr), wname.to_owned());
                    }
                    if wname != me {
                        out.entry((wname, wcidr)).or_insert_with(|| name.to_owned());
                    }
                }
                _ => widest = Some((end, name, cidr)),
            }
        }
    }
    out
}

/// Why another node's pod CIDR gets no route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRoute {
    /// The node has no InternalIP of the CIDR's family.
    #[error("no {family} InternalIP to route {cidr} through")]
    NoInternalIp {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The pod CIDR.
        cidr: IpNetwork,
    },
    /// Its InternalIP is one of ours.
    #[error("InternalIP {0} is one of this host's addresses")]
    OwnAddress(IpAddr),
    /// Its InternalIP lies in our pod CIDR.
    #[error("InternalIP {0} is inside this node's pod CIDR")]
    InsideOwnPodCidr(IpAddr),
    /// Its InternalIP is behind a router.
    #[error(
        "InternalIP {via} is reached through the gateway {gateway}, not on this node's link \
         (routing pod CIDRs to node addresses needs the nodes on one L2 segment; \
         --overlay vxlan encapsulates to such nodes)"
    )]
    BehindGateway {
        /// The InternalIP.
        via: IpAddr,
        /// The gateway this host would use.
        gateway: IpAddr,
    },
    /// No route at all to its InternalIP.
    #[error("no route to InternalIP {0}")]
    Unreachable(IpAddr),
    /// Its InternalIP is behind a router, and this node cannot encapsulate to it.
    #[error(
        "InternalIP is behind a router and this node has no {family} {what} to be a VXLAN \
         endpoint with"
    )]
    NoLocalVtep {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// `InternalIP` or `pod CIDR`.
        what: &'static str,
    },
}

/// The tunnel to a node whose InternalIP `via` is behind `gateway`, when the overlay is
/// on and this node can be a VTEP of the family (an InternalIP and a pod CIDR of it).
fn tunnel(
    via: IpAddr,
    gateway: IpAddr,
    cidr: IpNetwork,
    own_internal_ips: &[IpAddr],
    own_pod_cidrs: &[IpNetwork],
    settings: &PlanSettings,
) -> Result<NextHop, NoRoute> {
    if !settings.overlay.as_ref().is_some_and(|o| o.enabled) {
        return Err(NoRoute::BehindGateway { via, gateway });
    }
    let family = if cidr.is_ipv4() { "IPv4" } else { "IPv6" };
    if !own_internal_ips
        .iter()
        .any(|ip| ip.is_ipv4() == cidr.is_ipv4())
    {
        return Err(NoRoute::NoLocalVtep {
            family,
            what: "InternalIP",
        });
    }
    if !own_pod_cidrs.iter().any(|c| c.is_ipv4() == cidr.is_ipv4()) {
        return Err(NoRoute::NoLocalVtep {
            family,
            what: "pod CIDR",
        });
    }
    Ok(NextHop::Tunnel(Tunnel {
        underlay: via,
        vtep: cidr.network(),
        mac: vtep_mac(via),
    }))
}

/// Tunnels whose VTEP MAC another tunnel or this node already has (IPv6 MACs are a
/// 40-bit hash: rare, but then frames would go to the wrong node): every such peer is
/// left out, `(pod CIDR, node, why)`.
fn vtep_mac_clashes(
    routes: &BTreeMap<IpNetwork, NextHop>,
    own_internal_ips: &[IpAddr],
    accepted: &[(&NodeInfo, IpNetwork)],
) -> Vec<(IpNetwork, String, String)> {
    let node_of = |cidr: &IpNetwork| {
        accepted
            .iter()
            .find(|(_, c)| c == cidr)
            .map_or_else(String::new, |(n, _)| n.name.clone())
    };
    let mut seen: BTreeMap<(bool, [u8; 6]), Vec<IpNetwork>> = BTreeMap::new();
    for (cidr, hop) in routes {
        if let NextHop::Tunnel(t) = hop {
            seen.entry((cidr.is_ipv6(), t.mac.0))
                .or_default()
                .push(*cidr);
        }
    }
    let own: Vec<(bool, [u8; 6])> = own_internal_ips
        .iter()
        .map(|ip| (ip.is_ipv6(), vtep_mac(*ip).0))
        .collect();
    let mut out = Vec::new();
    for (key, cidrs) in seen {
        if cidrs.len() > 1 || own.contains(&key) {
            for cidr in &cidrs {
                out.push((
                    *cidr,
                    node_of(cidr),
                    format!(
                        "its VTEP MAC {} is also another node's or this node's: not encapsulated",
                        MacAddr(key.1)
                    ),
                ));
            }
        }
    }
    out
}

/// The node address to route `cidr` through, or why there is none.
fn next_hop(
    node: &NodeInfo,
    cidr: IpNetwork,
    host: &HostView,
    own_pod_cidrs: &[IpNetwork],
) -> Result<IpAddr, NoRoute> {
    let family = if cidr.is_ipv4() { "IPv4" } else { "IPv6" };
    let via = node
        .internal_ip(cidr.is_ipv4())
        .ok_or(NoRoute::NoInternalIp { family, cidr })?;
    if host.addresses.contains(&via) {
        return Err(NoRoute::OwnAddress(via));
    }
    if own_pod_cidrs.iter().any(|c| c.contains(via)) {
        return Err(NoRoute::InsideOwnPodCidr(via));
    }
    match host.reach(via) {
        Reach::OnLink => Ok(via),
        Reach::Gateway(gateway) => Err(NoRoute::BehindGateway { via, gateway }),
        Reach::NoRoute => Err(NoRoute::Unreachable(via)),
    }
}

/// Everything that shapes the desired state besides the nodes and the host: the
/// agent's options, read once.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// What shapes the routes.
    pub plan: PlanSettings,
    /// `--mtu`, when set.
    pub mtu: Option<u32>,
    /// What shapes the network config.
    pub conflist: ConflistSettings,
    /// NetworkPolicy: the size (address ranges) from which a peer of pods is shared
    /// (`--policy-shared-peer-ranges`); `None`: the default.
    pub policy_shared_peer_ranges: Option<usize>,
    /// The WireGuard device's name, also with encryption off (a device of the agent's
    /// left from before is then deleted).
    pub encryption_device: String,
}

/// This node's network config as it should be on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// The pod MTU in it.
    pub mtu: u32,
    /// Why that MTU.
    pub mtu_why: String,
    /// Whether portmap is chained in it.
    pub portmap: bool,
}

/// The whole desired state of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Pod CIDRs, routes, the in-cluster set and the skipped nodes.
    pub plan: Plan,
    /// The network config; `None` until this node has a usable pod CIDR (no config is
    /// written before, so the runtime reports the network not ready).
    pub config: Option<NetworkConfig>,
    /// The VXLAN devices the tunnels need (none when no peer is encapsulated).
    pub overlay: Vec<OverlayDevice>,
    /// What each policy tier wants of the kernel, or what it waits for.
    pub policy: Pipeline,
}

/// Computes the whole desired state from a snapshot of the stores, this host and the
/// settings.
pub fn desired(snapshot: &Snapshot, host: &HostState, settings: &Settings) -> Desired {
    let nodes = &*snapshot.nodes;
    let plan = plan(nodes, &host.view, &settings.plan);
    let overlay = settings
        .plan
        .overlay
        .as_ref()
        .filter(|o| o.enabled)
        .map(|o| overlay_devices(&plan, host, o))
        .unwrap_or_default();
    let config = (!plan.own_pod_cidrs.is_empty()).then(|| {
        let (mtu, mtu_why) = match settings.mtu {
            Some(mtu) => (mtu, "set by --mtu".to_owned()),
            None => {
                let (mtu, why) = host::choose_mtu(host, &plan.own_internal_ips);
                let (vxlan_mtu, vxlan_why) = encapsulated_mtu(mtu, why.clone(), &overlay);
                match encrypted_mtu(mtu, &why, &plan) {
                    Some((wg_mtu, wg_why)) if wg_mtu < vxlan_mtu => (wg_mtu, wg_why),
                    _ => (vxlan_mtu, vxlan_why),
                }
            }
        };
        let conflist = ConflistSettings {
            portmap: host.portmap_installed,
            bandwidth: host.bandwidth_installed,
            ..settings.conflist.clone()
        };
        NetworkConfig {
            bytes: conflist::render(&plan.own_pod_cidrs, mtu, &conflist),
            mtu,
            mtu_why,
            portmap: host.portmap_installed,
        }
    });
    let policy = pipeline::compile(
        &snapshot.policy,
        CompileContext {
            node: &settings.plan.node_name,
            records: &host.pod_records,
            share_from: settings.policy_shared_peer_ranges.unwrap_or(SHARE_FROM),
            nodes,
        },
    );
    Desired {
        plan,
        config,
        overlay,
        policy,
    }
}

/// The pod MTU once some peers are encapsulated: the uplink's minus the largest
/// overhead in use (50 over an IPv4 underlay, 70 over IPv6), so that a full-size pod
/// packet fits every tunnel; unchanged while no peer is.
fn encapsulated_mtu(mtu: u32, why: String, overlay: &[OverlayDevice]) -> (u32, String) {
    let Some(device) = overlay.iter().max_by_key(|d| overhead(Some(d.local))) else {
        return (mtu, why);
    };
    let cut = overhead(Some(device.local));
    let family = if device.is_ipv6() { "IPv6" } else { "IPv4" };
    (
        mtu.saturating_sub(cut),
        format!("{why}, minus {cut} for VXLAN over {family} (some nodes are encapsulated)"),
    )
}

/// The pod MTU while some peers are encrypted: the uplink's minus WireGuard's overhead
/// over the underlay the peers' endpoints use (60 over IPv4, 80 over IPv6); `None`
/// while no peer is.
fn encrypted_mtu(mtu: u32, why: &str, plan: &Plan) -> Option<(u32, String)> {
    let endpoint = plan
        .peers
        .values()
        .map(|p| p.endpoint.ip())
        .max_by_key(|ip| encryption::overhead(*ip))?;
    let cut = encryption::overhead(endpoint);
    let family = if endpoint.is_ipv6() { "IPv6" } else { "IPv4" };
    Some((
        mtu.saturating_sub(cut),
        format!("{why}, minus {cut} for WireGuard over {family} (some nodes are encrypted)"),
    ))
}

/// One device per family that has an encapsulated peer.
fn overlay_devices(
    plan: &Plan,
    host: &HostState,
    settings: &OverlaySettings,
) -> Vec<OverlayDevice> {
    let mut out = Vec::new();
    for v6 in [false, true] {
        if !plan
            .routes
            .iter()
            .any(|(c, h)| c.is_ipv6() == v6 && matches!(h, NextHop::Tunnel(_)))
        {
            continue;
        }
        // The plan made tunnels of this family only with both of these.
        let Some(local) = plan.own_internal_ips.iter().find(|ip| ip.is_ipv6() == v6) else {
            continue;
        };
        let Some(own_cidr) = plan.own_pod_cidrs.iter().find(|c| c.is_ipv6() == v6) else {
            continue;
        };
        let uplink_mtu = host
            .address_mtus
            .iter()
            .find(|(a, _, _)| a == local)
            .map_or_else(|| host::choose_mtu(host, &[*local]).0, |(_, m, _)| *m);
        out.push(OverlayDevice {
            name: settings.device_name(v6),
            vni: settings.vni,
            port: settings.port,
            local: *local,
            uplink: host.address_indexes.get(local).copied(),
            mac: vtep_mac(*local),
            vtep: own_cidr.network(),
            mtu: uplink_mtu.saturating_sub(overhead(Some(*local))),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostRoute;

    fn nodes_only(nodes: ItemMap<NodeInfo>) -> Snapshot {
        Snapshot {
            nodes: std::sync::Arc::new(nodes),
            policy: pipeline::PolicyInputs::default(),
        }
    }

    fn node(name: &str, cidrs: &[&str], ips: &[&str]) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            wireguard_key: None,
            pod_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            internal_ips: ips.iter().map(|c| c.parse().unwrap()).collect(),
            problems: Vec::new(),
            ..NodeInfo::default()
        }
    }

    fn map(nodes: Vec<NodeInfo>) -> ItemMap<NodeInfo> {
        crate::store::item_map(nodes.into_iter().map(|n| (n.name.clone(), n)))
    }

    /// A host on 198.18.0.0/24 and fd00:18::/64 with a default route via .1.
    fn host(own: &[&str]) -> HostView {
        HostView {
            addresses: own.iter().map(|a| a.parse().unwrap()).collect(),
            routes: vec![
                HostRoute {
                    dst: "198.18.0.0/24".parse().unwrap(),
                    gw: None,
                },
                HostRoute {
                    dst: "fd00:18::/64".parse().unwrap(),
                    gw: None,
                },
                HostRoute {
                    dst: "0.0.0.0/0".parse().unwrap(),
                    gw: Some("198.18.0.1".parse().unwrap()),
                },
            ],
            wireguard: None,
        }
    }

    fn settings() -> PlanSettings {
        PlanSettings {
            node_name: "n1".into(),
            ..PlanSettings::default()
        }
    }

    fn three() -> Vec<NodeInfo> {
        vec![
            node(
                "n1",
                &["10.244.1.0/24", "fd00:244:0:1::/64"],
                &["198.18.0.11", "fd00:18::11"],
            ),
            node(
                "n2",
                &["10.244.2.0/24", "fd00:244:0:2::/64"],
                &["198.18.0.12", "fd00:18::12"],
            ),
            node(
                "n3",
                &["10.244.3.0/24", "fd00:244:0:3::/64"],
                &["198.18.0.13", "fd00:18::13"],
            ),
        ]
    }

    fn route(plan: &Plan, dst: &str) -> Option<String> {
        plan.routes
            .get(&dst.parse().unwrap())
            .map(ToString::to_string)
    }

    #[test]
    fn every_other_node_gets_a_route_per_family() {
        let p = plan(
            &map(three()),
            &host(&["198.18.0.11", "fd00:18::11"]),
            &settings(),
        );
        assert_eq!(
            p.own_pod_cidrs,
            vec![
                "10.244.1.0/24".parse::<IpNetwork>().unwrap(),
                "fd00:244:0:1::/64".parse().unwrap()
            ]
        );
        assert_eq!(p.routes.len(), 4, "{p:?}");
        assert_eq!(route(&p, "10.244.2.0/24").as_deref(), Some("198.18.0.12"));
        assert_eq!(
            route(&p, "fd00:244:0:3::/64").as_deref(),
            Some("fd00:18::13")
        );
        assert_eq!(p.in_cluster.len(), 6);
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    }

    #[test]
    fn a_node_behind_a_gateway_is_skipped_with_the_reason() {
        let mut nodes = three();
        nodes[2].internal_ips = vec!["203.0.113.7".parse().unwrap()];
        let p = plan(&map(nodes), &host(&["198.18.0.11"]), &settings());
        assert_eq!(route(&p, "10.244.3.0/24"), None);
        let why = &p.skipped["n3"];
        assert!(why.contains("gateway 198.18.0.1"), "{why}");
        assert!(why.contains("no IPv6 InternalIP"), "{why}");
        // Its pod CIDRs are still the cluster's: traffic to them is not masqueraded.
        assert!(p.in_cluster.contains(&"10.244.3.0/24".parse().unwrap()));
    }

    #[test]
    fn a_node_claiming_this_hosts_address_or_range_is_skipped() {
        let mut nodes = three();
        nodes[1].internal_ips = vec!["198.18.0.11".parse().unwrap()];
        nodes[2].pod_cidrs = vec!["198.18.0.0/25".parse().unwrap()];
        let p = plan(&map(nodes), &host(&["198.18.0.11"]), &settings());
        assert!(
            p.skipped["n2"].contains("one of this host's addresses"),
            "{:?}",
            p.skipped
        );
        assert!(
            p.skipped["n3"].contains("holds this host's address"),
            "{:?}",
            p.skipped
        );
        assert!(!p.in_cluster.contains(&"198.18.0.0/25".parse().unwrap()));
        assert_eq!(p.routes.len(), 0, "{:?}", p.routes);
    }

    #[test]
    fn overlapping_claims_are_left_out_and_ours_wins() {
        let mut nodes = three();
        // n2 claims a range holding ours; n3 and n4 claim the same range.
        nodes[1].pod_cidrs = vec!["10.244.0.0/16".parse().unwrap()];
        nodes.push(node("n4", &["10.244.3.0/24"], &["198.18.0.14"]));
        let p = plan(&map(nodes), &host(&["198.18.0.11"]), &settings());
        assert!(p.own_pod_cidrs.contains(&"10.244.1.0/24".parse().unwrap()));
        assert!(
            p.skipped["n2"].contains("overlaps node \"n1\""),
            "{:?}",
            p.skipped
        );
        assert!(p.skipped["n3"].contains("overlaps"), "{:?}", p.skipped);
        assert!(p.skipped["n4"].contains("overlaps"), "{:?}", p.skipped);
        assert!(!p.skipped.contains_key("n1"));
        assert_eq!(route(&p, "10.244.3.0/24"), None);
        // IPv6 of n3 is fine and still routed.
        assert_eq!(
            route(&p, "fd00:244:0:3::/64").as_deref(),
            Some("fd00:18::13")
        );
    }

    #[test]
    fn this_nodes_range_may_hold_its_own_gateway_address() {
        let p = plan(
            &map(three()),
            &host(&["198.18.0.11", "10.244.1.1", "fd00:244:0:1::1"]),
            &settings(),
        );
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
        assert_eq!(p.own_pod_cidrs.len(), 2);
    }

    #[test]
    fn a_node_with_problems_is_skipped_whole() {
        let mut nodes = three();
        nodes[2].problems = vec!["spec.podCIDRs entry \"x\": bad".into()];
        let p = plan(&map(nodes), &host(&["198.18.0.11"]), &settings());
        assert!(p.skipped["n3"].contains("bad"));
        assert!(!p.routes.keys().any(|d| d.to_string().contains(":3::")));
        assert_eq!(route(&p, "10.244.2.0/24").as_deref(), Some("198.18.0.12"));
    }

    #[test]
    fn cluster_cidrs_bound_what_is_accepted() {
        let mut nodes = three();
        nodes[2].pod_cidrs = vec!["172.16.0.0/24".parse().unwrap()];
        let s = PlanSettings {
            cluster_cidrs: vec![
                "10.244.0.0/16".parse().unwrap(),
                "fd00:244::/48".parse().unwrap(),
            ],
            no_masquerade: vec!["192.0.2.0/24".parse().unwrap()],
            ..settings()
        };
        let p = plan(&map(nodes), &host(&["198.18.0.11"]), &s);
        assert!(p.skipped["n3"].contains("outside the cluster CIDRs"));
        assert!(p.in_cluster.contains(&"192.0.2.0/24".parse().unwrap()));
    }

    #[test]
    fn before_the_controller_assigns_cidrs_there_is_nothing_to_do() {
        let nodes = vec![node("n1", &[], &["198.18.0.11"])];
        let p = plan(&map(nodes), &host(&["198.18.0.11"]), &settings());
        assert!(p.own_pod_cidrs.is_empty());
        assert!(p.routes.is_empty());
    }

    #[test]
    fn five_thousand_nodes_plan_in_one_pass() {
        let mut nodes = vec![node("n1", &["10.0.0.0/24"], &["198.18.0.11"])];
        let mut host = host(&["198.18.0.11"]);
        host.routes.push(HostRoute {
            dst: "100.64.0.0/16".parse().unwrap(),
            gw: None,
        });
        for i in 1..5000u32 {
            nodes.push(node(
                &format!("node-{i}"),
                &[&format!("10.{}.{}.0/24", i / 256, i % 256)],
                &[&format!("100.64.{}.{}", i / 250, i % 250 + 1)],
            ));
        }
        let p = plan(&map(nodes), &host, &settings());
        assert_eq!(p.routes.len(), 4999, "{:?}", p.skipped.iter().next());
    }

    fn whole_settings() -> Settings {
        Settings {
            plan: settings(),
            mtu: None,
            conflist: ConflistSettings {
                network_name: "pods".into(),
                bridge: "cni0".into(),
                ipam_data_dir: None,
                portmap: false,
                bandwidth: false,
                pod_record_dir: None,
            },
            policy_shared_peer_ranges: None,
            encryption_device: String::new(),
        }
    }

    fn host_state(portmap: bool) -> HostState {
        HostState {
            view: host(&["198.18.0.11", "fd00:18::11"]),
            address_mtus: vec![
                ("198.18.0.11".parse().unwrap(), 1450, "ul0".into()),
                ("fd00:18::11".parse().unwrap(), 1450, "ul0".into()),
            ],
            portmap_installed: portmap,
            bandwidth_installed: portmap,
            ..HostState::default()
        }
    }

    #[test]
    fn the_desired_state_holds_the_config_with_its_mtu_and_portmap() {
        let d = desired(
            &nodes_only(map(three())),
            &host_state(true),
            &whole_settings(),
        );
        let config = d.config.expect("a config");
        assert_eq!(config.mtu, 1450);
        assert!(config.mtu_why.contains("ul0"), "{}", config.mtu_why);
        assert!(config.portmap);
        let json: serde_json::Value = serde_json::from_slice(&config.bytes).unwrap();
        assert_eq!(json["name"], "pods");
        assert_eq!(json["plugins"][0]["mtu"], 1450);
        assert_eq!(json["plugins"][1]["type"], "portmap");
        assert_eq!(json["plugins"][2]["type"], "bandwidth");
        assert_eq!(d.plan.routes.len(), 4);

        // --mtu wins; without portmap installed it is not chained.
        let s = Settings {
            mtu: Some(1400),
            ..whole_settings()
        };
        let config = desired(&nodes_only(map(three())), &host_state(false), &s)
            .config
            .expect("a config");
        assert_eq!(
            (config.mtu, config.mtu_why.as_str()),
            (1400, "set by --mtu")
        );
        let json: serde_json::Value = serde_json::from_slice(&config.bytes).unwrap();
        assert_eq!(json["plugins"][1]["type"], "loopback");
    }

    fn overlay_on() -> PlanSettings {
        PlanSettings {
            overlay: Some(OverlaySettings {
                enabled: true,
                vni: 4097,
                port: 4789,
                device_prefix: "cni-vx".into(),
            }),
            ..settings()
        }
    }

    #[test]
    fn a_node_behind_a_gateway_is_encapsulated_when_the_overlay_is_on() {
        let mut nodes = three();
        nodes[2].internal_ips = vec![
            "203.0.113.7".parse().unwrap(),
            "fd00:18::13".parse().unwrap(),
        ];
        let p = plan(
            &map(nodes),
            &host(&["198.18.0.11", "fd00:18::11"]),
            &overlay_on(),
        );
        let hop = p.routes[&"10.244.3.0/24".parse().unwrap()];
        assert_eq!(
            hop,
            NextHop::Tunnel(Tunnel {
                underlay: "203.0.113.7".parse().unwrap(),
                vtep: "10.244.3.0".parse().unwrap(),
                mac: vtep_mac("203.0.113.7".parse().unwrap()),
            })
        );
        // Per family: its IPv6 InternalIP is on the link, so IPv6 stays direct.
        assert_eq!(
            route(&p, "fd00:244:0:3::/64").as_deref(),
            Some("fd00:18::13")
        );
        assert_eq!(route(&p, "10.244.2.0/24").as_deref(), Some("198.18.0.12"));
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
        // Unreachable stays skipped: there is no underlay path to send UDP on.
        let mut h = host(&["198.18.0.11"]);
        h.routes.retain(|r| r.gw.is_none());
        let mut nodes = three();
        nodes[2].internal_ips = vec!["203.0.113.7".parse().unwrap()];
        let p = plan(&map(nodes), &h, &overlay_on());
        assert!(
            p.skipped["n3"].contains("no route to InternalIP"),
            "{:?}",
            p.skipped
        );
    }

    #[test]
    fn without_an_own_internal_ip_of_the_family_there_is_no_tunnel() {
        let mut nodes = three();
        nodes[0].internal_ips = vec!["198.18.0.11".parse().unwrap()];
        nodes[2].internal_ips = vec![
            "203.0.113.7".parse().unwrap(),
            "fd00:99::13".parse().unwrap(),
        ];
        let mut h = host(&["198.18.0.11"]);
        h.routes.push(HostRoute {
            dst: "::/0".parse().unwrap(),
            gw: Some("fd00:18::1".parse().unwrap()),
        });
        let p = plan(&map(nodes), &h, &overlay_on());
        assert!(matches!(
            p.routes[&"10.244.3.0/24".parse().unwrap()],
            NextHop::Tunnel(_)
        ));
        assert!(
            p.skipped["n3"].contains("no IPv6 InternalIP to be a VXLAN endpoint"),
            "{:?}",
            p.skipped
        );
    }

    #[test]
    fn the_pod_mtu_drops_by_the_largest_overhead_in_use() {
        let mut nodes = three();
        nodes[2].internal_ips = vec!["203.0.113.7".parse().unwrap()];
        let s = Settings {
            plan: overlay_on(),
            ..whole_settings()
        };
        let mut h = host_state(false);
        h.address_indexes.insert("198.18.0.11".parse().unwrap(), 2);
        let d = desired(&nodes_only(map(nodes.clone())), &h, &s);
        let config = d.config.expect("a config");
        assert_eq!(config.mtu, 1400, "1450 - 50: {}", config.mtu_why);
        assert!(
            config.mtu_why.contains("minus 50 for VXLAN over IPv4"),
            "{}",
            config.mtu_why
        );
        assert_eq!(d.overlay.len(), 1);
        let dev = &d.overlay[0];
        assert_eq!(
            (
                dev.name.as_str(),
                dev.mtu,
                dev.uplink,
                dev.vtep.to_string().as_str()
            ),
            ("cni-vx4", 1400, Some(2), "10.244.1.0")
        );
        // An IPv6 tunnel too: 70 off.
        nodes[2].internal_ips.push("fd00:99::13".parse().unwrap());
        h.view.routes.push(HostRoute {
            dst: "::/0".parse().unwrap(),
            gw: Some("fd00:18::1".parse().unwrap()),
        });
        let d = desired(&nodes_only(map(nodes.clone())), &h, &s);
        assert_eq!(d.config.expect("a config").mtu, 1380);
        assert_eq!(d.overlay.len(), 2);
        // Nobody encapsulated: unchanged, no device.
        let d = desired(&nodes_only(map(three())), &h, &s);
        assert_eq!(d.config.expect("a config").mtu, 1450);
        assert!(d.overlay.is_empty());
    }

    #[test]
    fn no_config_until_this_node_has_a_pod_cidr() {
        let nodes = vec![node("n1", &[], &["198.18.0.11"])];
        let d = desired(
            &nodes_only(map(nodes)),
            &host_state(true),
            &whole_settings(),
        );
        assert_eq!(d.config, None);
    }

    #[test]
    fn the_desired_state_holds_each_policy_tier_and_a_waiting_one_holds_back_nothing() {
        use crate::policy::model::tests::{cluster, policy};
        use crate::policy::network_policy::{self, WAITING};
        use crate::policy::pipeline::{PolicyInputs, Stage, Tier};
        use std::sync::Arc;
        let (mut pods, namespaces) = cluster();
        // x/a runs on n1, and the API has no address of it yet: its pod record has.
        Arc::make_mut(pods.get_mut("x/a").unwrap()).ips.clear();
        let policies: ItemMap<_> = [policy("x", "deny", serde_json::json!({"podSelector": {}}))]
            .into_iter()
            .collect();
        let mut snapshot = nodes_only(map(three()));
        snapshot.policy = PolicyInputs {
            network_policy: Stage::Ready(network_policy::Snapshot {
                pods: Arc::new(pods),
                namespaces: Arc::new(namespaces),
                policies: Arc::new(policies),
            }),
            ..PolicyInputs::default()
        };
        let mut host = host_state(true);
        let recorded: IpAddr = "10.244.0.77".parse().unwrap();
        host.pod_records.insert(recorded, "x/a".into());
        let d = desired(&snapshot, &host, &whole_settings());
        let want = d
            .policy
            .network_policy
            .ready()
            .expect("the tier is compiled");
        assert!(
            want.compiled.ingress.contains_key(&recorded),
            "x/deny isolates x/a at its recorded address: {want:?}"
        );
        assert!(d.policy.waiting().is_empty());
        assert_eq!(d.plan.routes.len(), 4);

        // The tier's view is not complete: it waits; the routes and the config do not.
        snapshot.policy.network_policy = Stage::Waiting(WAITING.to_owned());
        let d = desired(&snapshot, &host, &whole_settings());
        assert_eq!(
            d.policy.waiting(),
            vec![(Tier::NetworkPolicy, WAITING.to_owned())]
        );
        assert!(!d.policy.any_ready());
        assert!(d.config.is_some());
        assert_eq!(d.plan.routes.len(), 4);
    }

    fn key(n: u8) -> Key {
        Key([n; 32])
    }

    fn keyed(mut node: NodeInfo, n: u8) -> NodeInfo {
        node.wireguard_key = Some(Ok(key(n)));
        node
    }

    fn encryption_on(strict: bool) -> PlanSettings {
        PlanSettings {
            encryption: Some(EncryptionSettings {
                strict,
                ..EncryptionSettings::default()
            }),
            ..overlay_on()
        }
    }

    /// This node with its device ready (index 9) and its key published or not.
    fn wg_host(own: &[&str], published: bool) -> HostView {
        HostView {
            wireguard: Some(crate::encryption::LocalEncryption {
                index: 9,
                public_key: key(1),
                port: 51830,
                published,
            }),
            ..host(own)
        }
    }

    fn encrypted(device: u32, endpoint: &str) -> NextHop {
        NextHop::Encrypted(Encrypted {
            device,
            endpoint: endpoint.parse().unwrap(),
        })
    }

    #[test]
    fn nodes_that_publish_a_key_are_peers_whose_pod_cidrs_go_through_the_device() {
        // n2 publishes a key, n3 does not; n4 is behind a router (VXLAN without
        // encryption) and publishes one.
        let mut nodes = three();
        nodes[0] = keyed(nodes[0].clone(), 1);
        nodes[1] = keyed(nodes[1].clone(), 2);
        nodes.push(keyed(node("n4", &["10.244.4.0/24"], &["203.0.113.4"]), 4));
        let p = plan(
            &map(nodes),
            &wg_host(&["198.18.0.11", "fd00:18::11"], true),
            &encryption_on(false),
        );
        // n2: both families through the device, one peer with both CIDRs, endpoint its
        // IPv4 InternalIP (this node's underlay is IPv4).
        assert_eq!(
            p.routes[&"10.244.2.0/24".parse().unwrap()],
            encrypted(9, "198.18.0.12")
        );
        assert_eq!(
            p.routes[&"fd00:244:0:2::/64".parse().unwrap()],
            encrypted(9, "198.18.0.12")
        );
        let peer = &p.peers[&key(2)];
        assert_eq!(peer.node, "n2");
        assert_eq!(peer.endpoint, "198.18.0.12:51830".parse().unwrap());
        assert_eq!(
            peer.allowed_ips,
            vec![
                "10.244.2.0/24".parse::<IpNetwork>().unwrap(),
                "fd00:244:0:2::/64".parse().unwrap()
            ]
        );
        // n4 behind a gateway is encrypted too, not encapsulated in VXLAN.
        assert_eq!(
            p.routes[&"10.244.4.0/24".parse().unwrap()],
            encrypted(9, "203.0.113.4")
        );
        // n3 without a key: as before, in clear, and said so.
        assert_eq!(route(&p, "10.244.3.0/24").as_deref(), Some("198.18.0.13"));
        assert!(
            p.clear["n3"].contains("publishes no WireGuard key"),
            "{:?}",
            p.clear
        );
        assert_eq!(p.peers.len(), 2);
        assert_eq!(p.keyed.len(), 3, "n2's two CIDRs and n4's: {:?}", p.keyed);
        assert_eq!(p.remote.len(), 5);
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    }

    #[test]
    fn until_this_nodes_key_is_published_peers_are_set_but_routes_stay_clear() {
        let mut nodes = three();
        nodes[1] = keyed(nodes[1].clone(), 2);
        let p = plan(
            &map(nodes),
            &wg_host(&["198.18.0.11", "fd00:18::11"], false),
            &encryption_on(false),
        );
        assert_eq!(route(&p, "10.244.2.0/24").as_deref(), Some("198.18.0.12"));
        assert!(p.peers.contains_key(&key(2)), "{:?}", p.peers);
        assert!(p.clear["n2"].contains("not on its Node object yet"));
        // Without a device at all (no WireGuard in this kernel): no peers, clear.
        let mut nodes = three();
        nodes[1] = keyed(nodes[1].clone(), 2);
        let p = plan(
            &map(nodes),
            &host(&["198.18.0.11", "fd00:18::11"]),
            &encryption_on(true),
        );
        assert!(p.peers.is_empty());
        assert_eq!(route(&p, "10.244.2.0/24").as_deref(), Some("198.18.0.12"));
        assert!(
            p.clear["n2"].contains("device is not ready"),
            "{:?}",
            p.clear
        );
        // Strict mode still knows n2 publishes a key: its traffic must come encrypted.
        assert_eq!(p.keyed.len(), 2);
    }

    #[test]
    fn a_changed_key_changes_the_peer_and_a_removed_node_leaves_the_peers() {
        let mut nodes = three();
        nodes[1] = keyed(nodes[1].clone(), 2);
        nodes[2] = keyed(nodes[2].clone(), 3);
        let h = wg_host(&["198.18.0.11", "fd00:18::11"], true);
        let before = plan(&map(nodes.clone()), &h, &encryption_on(false));
        nodes[1] = keyed(nodes[1].clone(), 7);
        let after = plan(&map(nodes.clone()), &h, &encryption_on(false));
        assert!(!after.peers.contains_key(&key(2)));
        assert_eq!(
            after.peers[&key(7)].allowed_ips,
            before.peers[&key(2)].allowed_ips
        );
        assert_eq!(after.peers[&key(3)], before.peers[&key(3)], "n3 untouched");
        // Renumbered: the endpoint moves.
        nodes[1].internal_ips[0] = "198.18.0.42".parse().unwrap();
        let moved = plan(&map(nodes.clone()), &h, &encryption_on(false));
        assert_eq!(
            moved.peers[&key(7)].endpoint,
            "198.18.0.42:51830".parse().unwrap()
        );
        nodes.remove(1);
        let gone = plan(&map(nodes), &h, &encryption_on(false));
        assert_eq!(gone.peers.keys().copied().collect::<Vec<_>>(), [key(3)]);
    }

    #[test]
    fn a_bad_or_shared_key_is_reached_in_clear_with_the_reason() {
        let mut nodes = three();
        nodes[1].wireguard_key = Some(Err("not base64".into()));
        nodes[2] = keyed(nodes[2].clone(), 1); // this node's own key
        let p = plan(
            &map(nodes),
            &wg_host(&["198.18.0.11", "fd00:18::11"], true),
            &encryption_on(false),
        );
        assert!(p.peers.is_empty(), "{:?}", p.peers);
        assert!(p.clear["n2"].contains("not a WireGuard key (not base64)"));
        assert!(
            p.clear["n3"].contains("also another node's"),
            "{:?}",
            p.clear
        );
        assert_eq!(route(&p, "10.244.3.0/24").as_deref(), Some("198.18.0.13"));
    }

    #[test]
    fn with_encryption_off_nothing_changes() {
        let mut nodes = three();
        nodes[1] = keyed(nodes[1].clone(), 2);
        let p = plan(
            &map(nodes),
            &wg_host(&["198.18.0.11", "fd00:18::11"], true),
            &settings(),
        );
        assert!(p.peers.is_empty() && p.clear.is_empty() && p.keyed.is_empty());
        assert_eq!(route(&p, "10.244.2.0/24").as_deref(), Some("198.18.0.12"));
    }

    #[test]
    fn strict_mode_covers_the_pod_cidrs_of_left_out_nodes_but_never_this_nodes() {
        let mut nodes = three();
        // n3 is left out (no route to it): its pods are still another node's.
        nodes[2].internal_ips = vec!["203.0.113.7".parse().unwrap()];
        // n4 claims a range holding this node's: left out, and never strict's business.
        nodes.push(node("n4", &["10.244.0.0/16"], &["198.18.0.14"]));
        let mut h = host(&["198.18.0.11"]);
        h.routes.retain(|r| r.gw.is_none());
        let p = plan(&map(nodes), &h, &encryption_on(true));
        assert!(p.skipped.contains_key("n3") && p.skipped.contains_key("n4"));
        assert!(
            p.remote.contains(&"10.244.3.0/24".parse().unwrap()),
            "{:?}",
            p.remote
        );
        assert!(
            !p.remote.contains(&"10.244.0.0/16".parse().unwrap()),
            "{:?}",
            p.remote
        );
        assert!(
            !p.remote
                .iter()
                .any(|r| r.contains("10.244.1.1".parse().unwrap()))
        );
    }

    #[test]
    fn the_pod_mtu_drops_by_wireguards_overhead_or_the_overlays_where_lower() {
        let s = |mtu| Settings {
            plan: encryption_on(false),
            mtu,
            ..whole_settings()
        };
        let mut h = host_state(false);
        h.view.wireguard = wg_host(&[], true).wireguard;
        let mut nodes = three();
        nodes[1] = keyed(nodes[1].clone(), 2);
        let d = desired(&nodes_only(map(nodes.clone())), &h, &s(None));
        let config = d.config.expect("a config");
        assert_eq!(config.mtu, 1390, "1450 - 60: {}", config.mtu_why);
        assert!(
            config.mtu_why.contains("minus 60 for WireGuard over IPv4"),
            "{}",
            config.mtu_why
        );
        // An explicit --mtu is kept.
        let config = desired(&nodes_only(map(nodes.clone())), &h, &s(Some(1500)))
            .config
            .expect("a config");
        assert_eq!(config.mtu, 1500);
        // An IPv6 underlay: 80.
        let mut v6 = nodes.clone();
        for n in &mut v6 {
            n.internal_ips.retain(IpAddr::is_ipv6);
        }
        let d = desired(&nodes_only(map(v6)), &h, &s(None));
        assert_eq!(d.config.expect("a config").mtu, 1370);
        // No peer encrypted: the uplink's, as before.
        let d = desired(&nodes_only(map(three())), &h, &s(None));
        assert_eq!(d.config.expect("a config").mtu, 1450);
    }
}
