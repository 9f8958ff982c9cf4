//! ADD: bridge, veth pair, port settings, IPAM, container addresses and routes,
//! gateway addresses, masquerade. All-or-nothing: every step that creates something
//! records how to undo it, and a failure undoes them in reverse before returning.

use crate::common::{delete_link, fail, mac_text, open_netns};
use crate::config::BridgeConf;
use crate::effects::{ContainerSysctls, Effects, Pending, PortSecurity, System};
use crate::gateway::{self, CONTAINER_IF_INDEX, Gateways};
use crate::links::Links;
use cni_firewall::macspoof::ContainerMac as _;
use cni_linux::{
    AddressOptions, Family, Link, NetNs, Netlink, OPER_UP_DELAYS, Route as KernelRoute, VethPair,
};
use cni_protocol::error::{chain, internal};
use cni_protocol::failpoint::hit;
use cni_protocol::log;
use cni_protocol::pod_record::PodRecord;
use cni_protocol::{CniError, CniResult, Context, Interface, Request};
use ipnetwork::IpNetwork;
use std::io::Read;
use std::net::IpAddr;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::path::Path;
use std::time::Duration;

/// How many random host-side veth names to try before giving up on clashes.
const VETH_NAME_ATTEMPTS: usize = 10;

/// How long IPv6 addresses may stay tentative (the reference's limit).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Something ADD created, and so must remove if a later step fails.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Undo {
    /// The container end of the veth (its host peer goes with it).
    ContainerLink,
    /// The IPAM reservation.
    Ipam,
    /// The MAC spoof-check chains.
    MacSpoof,
    /// The port-security rules.
    PortSecurity,
    /// The masquerade rules.
    Masq,
    /// The pod records of these addresses (`podRecordDir`).
    PodRecord(Vec<IpAddr>),
    /// These addresses in the NetworkPolicy table's pending sets.
    PodPending(Vec<IpAddr>),
}

/// What ADD has done so far: the undo steps, and the work still running beside it,
/// which a rollback waits for before undoing anything.
#[derive(Debug, Default)]
struct Progress {
    undo: Vec<Undo>,
    ipam: Option<Pending<Result<CniResult, CniError>>>,
    masq: Option<Pending<Result<(), CniError>>>,
    port_security: Option<Pending<Result<(), CniError>>>,
}

impl Progress {
    /// Waits for whatever still runs; returns the undo steps.
    fn settle(mut self) -> Vec<Undo> {
        if let Some(masq) = self.masq.take() {
            masq.settle();
        }
        if let Some(port_security) = self.port_security.take() {
            port_security.settle();
        }
        if let Some(ipam) = self.ipam.take() {
            ipam.settle();
        }
        self.undo
    }
}

/// Runs ADD; on failure, undoes what this invocation created. A panic midway (a bug:
/// nothing reachable from input should panic) undoes it too, then carries on unwinding
/// so the dispatcher reports it.
pub fn add_attachment(req: &Request, conf: &BridgeConf) -> Result<CniResult, CniError> {
    if !conf.is_layer3() {
        // A layer-2 result has no address, which 0.1.0/0.2.0 cannot express: refuse
        // before creating anything rather than after, as the reference does.
        CniResult::default().ensure_convertible(&req.config.cni_version)?;
    }
    let pod_ns = open_netns(&req.args)?;
    let mut progress = Progress::default();
    hit("bridge/add/start")?;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let host = Netlink::connect().map_err(|e| internal(&e))?;
        let pod = Netlink::connect_in(&pod_ns).map_err(|e| internal(&e))?;
        add(req, conf, &pod_ns, &host, &pod, &System, &mut progress)
    }));
    match outcome {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(e)) => {
            let undo = progress.settle();
            rollback_in(req, conf, &pod_ns, undo);
            Err(e)
        }
        Err(panic) => {
            let undo = progress.settle();
            // On new sockets: the ones the panic unwound through are not trusted again.
            rollback_in(req, conf, &pod_ns, undo);
            resume_unwind(panic)
        }
    }
}

/// Undoes `steps` in `pod_ns`, on a new netlink connection.
fn rollback_in(req: &Request, conf: &BridgeConf, pod_ns: &NetNs, steps: Vec<Undo>) {
    let pod = Netlink::connect_in(pod_ns).map_err(|e| internal(&e));
    rollback(req, conf, pod.as_ref(), &System, steps);
}

/// The steps of ADD, on `host` and `pod` (the netns `pod_ns`). Everything it creates
/// that a failure must undo is recorded in `progress` first.
fn add(
    req: &Request,
    conf: &BridgeConf,
    pod_ns: &NetNs,
    host: &impl Links,
    pod: &impl Links,
    fx: &impl Effects,
    progress: &mut Progress,
) -> Result<CniResult, CniError> {
    let ifname = req.args.ifname.as_str();
    if pod
        .link_by_name(ifname)
        .map_err(|e| internal(&e))?
        .is_some()
    {
        return Err(fail(format!(
            "container interface {ifname:?} already exists in {}",
            req.args.netns
        )));
    }
    if conf.is_layer3() {
        // The reservation needs none of the links: it runs beside them. Registered
        // before the start: a failed IPAM ADD must still be followed by its DEL.
        progress.undo.push(Undo::Ipam);
        hit("bridge/add/ipam-before")?;
        progress.ipam = Some(fx.start_ipam_add(req));
    }
    let bridge = ensure_bridge(host, conf)?;
    let host_veth = create_veth(host, pod_ns, conf, bridge.index, ifname, &mut progress.undo)?;
    setup_port(host, conf, &host_veth, true)?;
    let bridge = pin_bridge_mac(host, &bridge.name)?;
    hit("bridge/add/bridge-mac")?;
    let container = pod.require_link(ifname).map_err(|e| internal(&e))?;
    let mut result = CniResult {
        cni_version: req.config.cni_version.clone(),
        interfaces: vec![
            Interface {
                name: bridge.name.clone(),
                mac: mac_text(&bridge),
                ..Interface::default()
            },
            Interface {
                name: host_veth.name.clone(),
                mac: mac_text(&host_veth),
                ..Interface::default()
            },
            Interface {
                name: ifname.to_string(),
                mac: mac_text(&container),
                sandbox: req.args.netns.clone(),
                ..Interface::default()
            },
        ],
        ..CniResult::default()
    };
    if conf.macspoofchk {
        progress.undo.push(Undo::MacSpoof);
        hit("bridge/add/macspoof-before")?;
        fx.macspoof_setup(
            &req.args.container_id,
            ifname,
            &host_veth.name,
            container.mac,
        )?;
        hit("bridge/add/macspoof-after")?;
    }
    if let Some(ipam) = progress.ipam.take() {
        let ipam = ipam.wait()?;
        hit("bridge/add/ipam-after")?;
        if ipam.ips.is_empty() {
            return Err(CniError::internal("IPAM plugin returned missing IP config"));
        }
        result.ips = ipam.ips;
        result.routes = ipam.routes;
        result.dns = ipam.dns;
        let gateways = gateway::apply(&mut result, conf)?;
        if conf.port_security {
            // Beside the container's sysctls and addresses; waited for before its link
            // comes up, so the port forwards nothing of the pod's until the pod is in
            // the sets.
            let mac = container
                .mac
                .container_mac()
                .with_context(|| format!("cannot protect {ifname:?} with portSecurity"))?;
            let port = PortSecurity {
                container_id: req.args.container_id.clone(),
                ifname: ifname.to_owned(),
                host_veth: host_veth.name.clone(),
                mac,
                addresses: container_addresses(&result),
            };
            progress.undo.push(Undo::PortSecurity);
            hit("bridge/add/port-security-before")?;
            progress.port_security = Some(fx.start_port_security_setup(port));
        }
        if let (Some(dir), Some(pod)) = (&conf.pod_record_dir, &conf.pod) {
            hold_for_policy(req, fx, dir, pod, &result, &mut progress.undo)?;
        }
        prepare_container(pod_ns, pod, fx, conf, ifname, container.index, &result)?;
        if let Some(pending) = progress.port_security.take() {
            pending.wait()?;
            hit("bridge/add/port-security-after")?;
        }
        bring_up_container(pod, ifname, container.index, &result)?;
        if conf.is_gateway {
            setup_gateways(host, conf, &bridge, &gateways, &mut result)?;
        }
        if conf.ip_masq {
            // Beside the wait for the port, but after every step a config can make fail:
            // a failed ADD must not leave even an empty nat table behind.
            progress.undo.push(Undo::Masq);
            hit("bridge/add/masq-before")?;
            let nets: Vec<IpNetwork> = result.ips.iter().map(|ip| ip.address).collect();
            progress.masq = Some(fx.start_masq_setup(
                conf.masq_backend(),
                &conf.network,
                ifname,
                &req.args.container_id,
                nets,
            ));
        }
    } else if !conf.disable_container_interface {
        pod.set_up(container.index)
            .with_context(|| format!("failed to set {ifname:?} up"))?;
        hit("bridge/add/container-up")?;
    }
    // Joining the bridge can change the port's MAC; the bridge's is pinned above.
    let host_veth = if conf.disable_container_interface {
        host.require_link(&host_veth.name)
            .map_err(|e| internal(&e))?
    } else {
        // A port that is not forwarding yet drops the pod's first packets (plugins#463).
        let port = host
            .wait_oper_up(host_veth.index, &OPER_UP_DELAYS)
            .context("bridge port in error state")?;
        hit("bridge/add/port-forwarding")?;
        port
    };
    result.interfaces[1].mac = mac_text(&host_veth);
    if let Some(masq) = progress.masq.take() {
        masq.wait()?;
        log::info(&format!(
            "added masquerade rules ({:?}) for {:?}",
            conf.masq_backend(),
            result.ips.iter().map(|ip| ip.address).collect::<Vec<_>>()
        ));
        hit("bridge/add/masq-after")?;
    }
    if let Some(dns) = &conf.dns {
        result.dns = dns.clone();
    }
    hit("bridge/add/done")?;
    Ok(result)
}

/// Undoes `steps` in reverse, logging what could not be undone. `pod` is the
/// connection to the pod's netns, if one could be made.
fn rollback(
    req: &Request,
    conf: &BridgeConf,
    pod: Result<&impl Links, &CniError>,
    fx: &impl Effects,
    steps: Vec<Undo>,
) {
    let (id, ifname) = (req.args.container_id.as_str(), req.args.ifname.as_str());
    for step in steps.into_iter().rev() {
        let outcome = match step {
            Undo::ContainerLink => match pod {
                Ok(pod) => delete_link(pod, ifname),
                Err(e) => Err(e.clone()),
            },
            Undo::Ipam => fx.ipam_del(req),
            Undo::MacSpoof => fx.macspoof_teardown(id, ifname),
            Undo::PortSecurity => fx.port_security_teardown(id, ifname),
            Undo::Masq => fx.masq_teardown(&conf.network, ifname, id),
            Undo::PodRecord(ref ips) => conf
                .pod_record_dir
                .as_deref()
                .map_or(Ok(()), |dir| fx.pod_record_remove(dir, ips, id)),
            Undo::PodPending(ref ips) => fx.pending_remove(ips),
        };
        match outcome {
            Ok(()) => log::info(&format!("rolled back {step:?} after a failed ADD")),
            Err(e) => {
                log::info(&format!("failed to roll back {step:?}: {e}"));
                eprintln!("bridge: undoing {step:?} after a failed ADD: {e}");
            }
        }
    }
}

/// The addresses IPAM gave the container's interface.
fn container_addresses(result: &CniResult) -> Vec<IpAddr> {
    result
        .ips
        .iter()
        .filter(|ip| ip.interface == Some(CONTAINER_IF_INDEX))
        .map(|ip| ip.address.ip())
        .collect()
}

/// Tells the node agent which pod the new addresses belong to, and holds them in
/// the NetworkPolicy table's pending sets (when it exists) until the agent has judged
/// the pod. Before the pod's link comes up, so that not even its first packet passes
/// unjudged. The records are staged, the addresses held, then the records published:
/// the agent, woken by a record, releases addresses that are already pending, and an
/// ADD killed in between leaves a staged record by which DEL or GC find them.
fn hold_for_policy(
    req: &Request,
    fx: &impl Effects,
    dir: &Path,
    pod: &str,
    result: &CniResult,
    undo: &mut Vec<Undo>,
) -> Result<(), CniError> {
    let ips = container_addresses(result);
    let record = PodRecord {
        pod: pod.to_owned(),
        container_id: req.args.container_id.clone(),
    };
    undo.push(Undo::PodRecord(ips.clone()));
    hit("bridge/add/pod-record-before")?;
    fx.pod_record_stage(dir, &ips, &record)?;
    hit("bridge/add/pod-record-staged")?;
    undo.push(Undo::PodPending(ips.clone()));
    let held = fx.pending_add(&ips, pod)?;
    hit("bridge/add/pod-pending")?;
    fx.pod_record_publish(dir, &ips)?;
    hit("bridge/add/pod-record")?;
    log::info(&format!(
        "recorded {ips:?} as pod {pod} in {}{}",
        dir.display(),
        if held {
            ", pending the node agent's NetworkPolicy verdict"
        } else {
            " (no NetworkPolicy table: nothing held pending)"
        }
    ));
    Ok(())
}

/// Sets the bridge's MAC to its current value. An explicitly set MAC stops the bridge
/// adopting its lowest port's MAC as ports come and go, which churns ARP caches and
/// conntrack. Done once a port is attached (the reference does it in gateway mode
/// only; we do it in layer-2 mode too): pinned on an empty bridge, the kernel keeps
/// a zero bridge id and leaves the bridge's state unknown.
///
/// Returns the bridge as it is now: its MAC no longer changes as ports come and go.
fn pin_bridge_mac(host: &impl Links, name: &str) -> Result<Link, CniError> {
    // Read and write are one step under the namespace lock. Otherwise an ADD that read
    // the MAC before another port joined could write that stale MAC back after a
    // concurrent ADD had pinned and reported the new one, whose CHECK then fails.
    let _lock = host.lock_namespace().map_err(|e| internal(&e))?;
    let bridge = host.require_link(name).map_err(|e| internal(&e))?;
    if let Some(mac) = bridge.mac {
        host.set_mac(bridge.index, mac)
            .context("could not set bridge's mac")?;
    }
    Ok(bridge)
}

/// Creates the bridge or takes the existing one; concurrent ADDs converge on one bridge.
fn ensure_bridge(host: &impl Links, conf: &BridgeConf) -> Result<Link, CniError> {
    let name = conf.bridge.as_str();
    let context = format!("failed to create bridge {name:?}");
    let refuse = |e: String| fail(format!("{context}: {e}"));
    let lookup = || {
        host.link_by_name(name)
            .with_context(|| format!("{context}: could not lookup {name:?}"))
    };
    // Every ADD but a node's first finds the bridge: look before creating.
    let bridge = match lookup()? {
        Some(bridge) => bridge,
        None => {
            let mtu = (conf.mtu != 0).then_some(conf.mtu);
            match host.create_bridge(name, mtu, conf.wants_vlan_filtering()) {
                Ok(()) => {}
                // A concurrent ADD created it first.
                Err(e) if e.is_exists() => {}
                // The answer of kernels built without bridge VLAN filtering.
                Err(e) if e.is_unsupported() && conf.wants_vlan_filtering() => {
                    return Err(refuse(format!(
                        "could not add {name:?}: {} (vlan and vlanTrunk need a kernel with bridge VLAN filtering)",
                        chain(&e),
                    )));
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("{context}: could not add {name:?}"));
                }
            };
            hit("bridge/add/bridge-created")?;
            lookup()?.ok_or_else(|| refuse(format!("could not lookup {name:?}: link not found")))?
        }
    };
    if bridge.kind.as_deref() != Some("bridge") {
        return Err(refuse(format!(
            "{name:?} already exists but is not a bridge"
        )));
    }
    if conf.promisc_mode && !bridge.promisc {
        host.set_promisc(bridge.index, true)
            .with_context(|| format!("{context}: could not set promiscuous mode on {name:?}"))?;
        hit("bridge/add/bridge-promisc")?;
    }
    // Router advertisements must not configure the bridge; absent IPv6 is fine.
    let _ = host.write_sysctl(&format!("net/ipv6/conf/{name}/accept_ra"), "0");
    hit("bridge/add/bridge-sysctl")?;
    if !bridge.up {
        host.set_up(bridge.index)
            .with_context(|| format!("{context}: failed to set {name:?} up"))?;
    }
    hit("bridge/add/bridge-up")?;
    Ok(bridge)
}

/// `veth` + 8 random hex digits, like the reference.
fn random_veth_name() -> Result<String, CniError> {
    let mut bytes = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("failed to generate random veth name")?;
    Ok(format!("veth{:08x}", u32::from_be_bytes(bytes)))
}

/// Creates the pair in one request: host end on the bridge, container end in the pod
/// under its final name. Retries only on a clash of the random host-side name.
fn create_veth(
    host: &impl Links,
    pod_ns: &NetNs,
    conf: &BridgeConf,
    bridge_index: u32,
    ifname: &str,
    undo: &mut Vec<Undo>,
) -> Result<Link, CniError> {
    let mtu = (conf.mtu != 0).then_some(conf.mtu);
    for _ in 0..VETH_NAME_ATTEMPTS {
        let name = random_veth_name()?;
        let pair = VethPair {
            name: &name,
            mtu,
            controller: Some(bridge_index),
            peer_name: ifname,
            peer_netns: Some(pod_ns),
            peer_mac: conf.mac,
            peer_mtu: mtu,
        };
        match host.create_veth(&pair) {
            Ok(()) => {
                // Registered at once: the pair exists from here on, whatever fails next.
                undo.push(Undo::ContainerLink);
                log::info(&format!(
                    "created veth {name} on bridge {} with peer {ifname} in the pod",
                    conf.bridge
                ));
                hit("bridge/add/veth-created")?;
                return host.require_link(&name).map_err(|e| internal(&e));
            }
            Err(e) if e.is_exists() => {
                if host
                    .link_by_name(&name)
                    .map_err(|e| internal(&e))?
                    .is_some()
                {
                    continue;
                }
                return Err(fail(format!(
                    "container veth name ({ifname:?}) peer provided ({name:?}) already exists"
                )));
            }
            Err(e) => return Err(e).context("failed to make veth pair"),
        }
    }
    Err(fail(format!(
        "failed to make veth pair: no free host-side name after {VETH_NAME_ATTEMPTS} attempts"
    )))
}

/// Bridge-port settings of a host-side veth: sysctls, hairpin, isolation, VLANs, up.
fn setup_port(
    host: &impl Links,
    conf: &BridgeConf,
    port: &Link,
    container_port: bool,
) -> Result<(), CniError> {
    let name = port.name.as_str();
    let _ = host.write_sysctl(&format!("net/ipv6/conf/{name}/accept_ra"), "0");
    hit("bridge/add/port-sysctl")?;
    let hairpin = container_port && conf.hairpin_mode;
    let hairpin_context = || format!("failed to setup hairpin mode for {name}");
    if container_port {
        // One request for both flags; should the kernel refuse it, one each says which.
        if host
            .set_port_flags(port.index, hairpin, conf.port_isolation)
            .is_err()
        {
            host.set_port_hairpin(port.index, hairpin)
                .with_context(hairpin_context)?;
            host.set_port_isolated(port.index, conf.port_isolation)
                .with_context(|| format!("failed to set isolated on for {name}"))?;
        }
        hit("bridge/add/port-flags")?;
    } else {
        host.set_port_hairpin(port.index, hairpin)
            .with_context(hairpin_context)?;
        hit("bridge/add/port-hairpin")?;
    }
    setup_vlans(host, conf, port)?;
    host.set_up(port.index)
        .with_context(|| format!("failed to set {name:?} up"))?;
    hit("bridge/add/port-up")
}

fn setup_vlans(host: &impl Links, conf: &BridgeConf, port: &Link) -> Result<(), CniError> {
    let name = port.name.as_str();
    let trunk = conf.vlan_trunk.as_deref().unwrap_or_default();
    if conf.has_vlans() && !conf.preserve_default_vlan {
        let existing = host.port_vlans(port.index).map_err(|e| internal(&e))?;
        for entry in existing {
            host.del_port_vlan(port.index, entry.vid)
                .with_context(|| format!("failed to remove default vlan on interface {name:?}"))?;
            hit("bridge/add/port-vlan-removed")?;
        }
    }
    let tag_context = || format!("failed to setup vlan tag on interface {name:?}");
    if conf.vlan != 0 {
        host.add_port_vlan(port.index, conf.vlan, true, true)
            .with_context(tag_context)?;
        hit("bridge/add/port-vlan")?;
    }
    for vid in trunk {
        host.add_port_vlan(port.index, *vid, false, false)
            .with_context(tag_context)?;
        hit("bridge/add/port-vlan-trunk")?;
    }
    if conf.vlan == 0 && !trunk.is_empty() {
        host.add_port_vlan(port.index, 1, true, true)
            .with_context(|| {
                format!("failed to setup default native vlan tag on interface {name:?}")
            })?;
        hit("bridge/add/port-vlan-native")?;
    }
    Ok(())
}

/// Sysctls and addresses inside the container, its link still down.
fn prepare_container(
    pod_ns: &NetNs,
    pod: &impl Links,
    fx: &impl Effects,
    conf: &BridgeConf,
    ifname: &str,
    index: u32,
    result: &CniResult,
) -> Result<(), CniError> {
    let has_v6 = result.ips.iter().any(|ip| ip.address.is_ipv6());
    fx.container_sysctls(
        pod_ns,
        ifname,
        ContainerSysctls {
            enable_dad: conf.enable_dad,
            has_v6,
            accept_ra: conf.accept_router_advertisements,
            eui64_link_local: conf.port_security,
        },
    )?;
    // Gratuitous ARP on link up and MAC change, so neighbours learn the pod at once.
    // Over netlink rather than /proc/sys/net: see `Netlink::set_arp_notify`.
    let _ = pod.set_arp_notify(index);
    hit("bridge/add/container-sysctls")?;
    for ip in result
        .ips
        .iter()
        .filter(|ip| ip.interface == Some(CONTAINER_IF_INDEX))
    {
        // With DAD as the pod's sysctls say (off unless `enabledad`).
        pod.add_address(index, ip.address, AddressOptions::default())
            .with_context(|| format!("failed to add IP addr {} to {ifname:?}", ip.address))?;
        hit("bridge/add/container-address")?;
    }
    Ok(())
}

/// Link up, DAD settling and routes inside the container.
fn bring_up_container(
    pod: &impl Links,
    ifname: &str,
    index: u32,
    result: &CniResult,
) -> Result<(), CniError> {
    pod.set_up(index)
        .with_context(|| format!("failed to set {ifname:?} UP"))?;
    hit("bridge/add/container-up")?;
    let family_gateway = |v4: bool| {
        result
            .ips
            .iter()
            .filter(|ip| ip.address.is_ipv4() == v4)
            .find_map(|ip| ip.gateway)
    };
    if family_gateway(false).is_some() {
        pod.wait_addresses_settled(index, SETTLE_TIMEOUT)
            .with_context(|| format!("failed to settle addresses for {ifname:?}"))?;
        hit("bridge/add/container-settled")?;
    }
    let mut installed: Vec<KernelRoute> = Vec::new();
    for r in &result.routes {
        let gw = r.gw.or_else(|| family_gateway(r.dst.is_ipv4()));
        let route = KernelRoute {
            gw,
            oif: Some(index),
            metric: (r.priority != 0).then_some(r.priority),
            table: r.table.and_then(|t| u32::try_from(t).ok()),
            scope: r.scope.and_then(|s| u8::try_from(s).ok()),
            mtu: (r.mtu != 0).then_some(r.mtu),
            advmss: (r.advmss != 0).then_some(r.advmss),
            ..KernelRoute::new(r.dst)
        };
        // The reference fails with EEXIST when IPAM and isDefaultGateway both yield the
        // same default route; installing it once is what the user meant.
        if installed.contains(&route) {
            continue;
        }
        pod.add_route(&route).with_context(|| {
            let via = gw.map_or_else(|| "<nil>".to_string(), |g| g.to_string());
            format!("failed to add route '{} via {via} dev {ifname}'", r.dst)
        })?;
        installed.push(route);
        hit("bridge/add/container-route")?;
    }
    Ok(())
}

/// Puts the gateway addresses on the bridge (or the VLAN gateway interface) and
/// turns on forwarding for each family that has one.
fn setup_gateways(
    host: &impl Links,
    conf: &BridgeConf,
    bridge: &Link,
    gateways: &Gateways,
    result: &mut CniResult,
) -> Result<(), CniError> {
    for (nets, family, forwarding) in [
        (&gateways.v4, Family::V4, "net/ipv4/ip_forward"),
        (&gateways.v6, Family::V6, "net/ipv6/conf/all/forwarding"),
    ] {
        if nets.is_empty() {
            continue;
        }
        for gw in nets {
            let target = if conf.vlan != 0 {
                let link = ensure_vlan_gateway(host, conf, bridge)?;
                if !result.interfaces.iter().any(|i| i.name == link.name) {
                    result.interfaces.push(Interface {
                        name: link.name.clone(),
                        mac: mac_text(&link),
                        ..Interface::default()
                    });
                }
                link
            } else {
                bridge.clone()
            };
            ensure_addr(host, &target, *gw, conf.force_address).map_err(|e| {
                let what = if conf.vlan != 0 {
                    "failed to set vlan interface for bridge with addr"
                } else {
                    "failed to set bridge addr"
                };
                fail(format!("{what}: {}", e.msg))
            })?;
            hit("bridge/add/gateway-address")?;
        }
        // Asked over netlink first: a node's forwarding is nearly always on already,
        // and a lookup under /proc/sys/net costs more the more pods the node has.
        // Should netlink not answer, the sysctl is read and written as before.
        if !host.forwarding(family).unwrap_or(false) {
            host.write_sysctl(forwarding, "1")
                .context("failed to enable forwarding")?;
        }
        hit("bridge/add/gateway-forwarding")?;
    }
    Ok(())
}

/// The reference's `ensureAddr`: keep an identical address, refuse (or with
/// `forceAddress` replace) a conflicting one, tolerate a concurrent identical add.
///
/// Unlike the reference, an IPv6 gateway address is added without duplicate address
/// detection (IFA_F_NODAD), so that the first pod reaches it at once instead of after
/// the bridge's DAD (one to two seconds, during which the address is tentative and
/// answers nothing). The address is this network's own: the gateway of its IPAM range,
/// on the bridge (or VLAN gateway interface) that carries that range. An address that
/// is already there is never touched, whatever its flags.
fn ensure_addr(host: &impl Links, link: &Link, gw: IpNetwork, force: bool) -> Result<(), CniError> {
    let name = link.name.as_str();
    let family = Family::of(gw.ip());
    let existing = host
        .addresses(link.index, Some(family))
        .map_err(|e| internal(&e))?;
    if existing.iter().any(|a| a.ip == gw) {
        return Ok(());
    }
    for a in &existing {
        let conflict = gw.is_ipv4() || a.ip.contains(gw.ip()) || gw.contains(a.ip.ip());
        if !conflict {
            continue;
        }
        if !force {
            return Err(fail(format!(
                "{name:?} already has an IP address different from {gw}"
            )));
        }
        host.del_address(link.index, a.ip)
            .map_err(|e| internal(&e))?;
    }
    match host.add_address(link.index, gw, AddressOptions::NO_DAD) {
        Ok(()) => {}
        Err(e) if e.is_exists() => {}
        Err(e) => {
            return Err(e)
                .with_context(|| format!("could not add IP address {} to {name:?}", gw.ip()));
        }
    }
    Ok(())
}

/// The `<bridge>.<vlan>` gateway interface: one end of a host-local veth pair whose
/// other end is a bridge port in the VLAN. Shared by all pods of the VLAN.
fn ensure_vlan_gateway(
    host: &impl Links,
    conf: &BridgeConf,
    bridge: &Link,
) -> Result<Link, CniError> {
    let name = format!("{}.{}", conf.bridge, conf.vlan);
    let context = "failed to create vlan interface";
    if let Some(link) = host.link_by_name(&name).map_err(|e| internal(&e))? {
        return Ok(link);
    }
    let port_name = random_veth_name()?;
    let mtu = (conf.mtu != 0).then_some(conf.mtu);
    let pair = VethPair {
        name: &port_name,
        mtu,
        controller: Some(bridge.index),
        peer_name: &name,
        peer_netns: None,
        peer_mac: None,
        peer_mtu: mtu,
    };
    match host.create_veth(&pair) {
        Ok(()) => {
            hit("bridge/add/vlan-gateway-created")?;
            let port = host.require_link(&port_name).map_err(|e| internal(&e))?;
            setup_port(host, conf, &port, false)?;
        }
        // Another ADD of the same VLAN created it first.
        Err(e) if e.is_exists() => {}
        Err(e) => return Err(e).context(context),
    }
    let link = host.require_link(&name).context(context)?;
    let _ = host.write_sysctl(&format!("net/ipv6/conf/{name}/accept_ra"), "0");
    host.set_up(link.index).context(context)?;
    hit("bridge/add/vlan-gateway-up")?;
    Ok(link)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Fake, Namespace, link};
    use std::collections::{BTreeMap, BTreeSet};

    const BRIDGE: &str = "br-unit";

    fn request(json: &str) -> Request {
        let config = cni_protocol::NetConf::parse(json.as_bytes()).unwrap();
        Request {
            args: cni_protocol::CmdArgs {
                command: cni_protocol::Command::Add,
                container_id: "ctr-unit".into(),
                netns: "/proc/self/ns/net".into(),
                ifname: "eth0".into(),
                args: K8S_ARGS.into(),
                path: vec![],
                netns_override: false,
            },
            config,
            stdin: json.as_bytes().to_vec(),
        }
    }

    /// What containerd passes for a pod.
    const K8S_ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=unit;K8S_POD_NAME=pod-a;K8S_POD_INFRA_CONTAINER_ID=ctr-unit;K8S_POD_UID=4f0e";

    /// A world whose host already has the bridge, up, as an earlier ADD left it.
    fn world(conf: &BridgeConf) -> (Fake, Fake) {
        let (host, pod) = Fake::pair();
        let index = host.next_index();
        host.with_world(|w| {
            let mut bridge = link(index, BRIDGE, "bridge");
            bridge.up = true;
            bridge.promisc = conf.promisc_mode;
            bridge.vlan_filtering = Some(conf.wants_vlan_filtering());
            w.host.links.insert(index, bridge);
            w.host
                .sysctls
                .insert(format!("net/ipv6/conf/{BRIDGE}/accept_ra"), "0".into());
        });
        (host, pod)
    }

    /// ADD against the fake, undone on failure as `add_attachment` does.
    fn run_add(
        req: &Request,
        conf: &BridgeConf,
        host: &Fake,
        pod: &Fake,
    ) -> Result<CniResult, CniError> {
        // Only handed to the fake, which never enters it.
        let pod_ns = NetNs::open("/proc/self/ns/net").unwrap();
        let mut progress = Progress::default();
        match add(req, conf, &pod_ns, host, pod, host, &mut progress) {
            Ok(result) => Ok(result),
            Err(e) => {
                rollback(req, conf, Ok(pod), host, progress.settle());
                Err(e)
            }
        }
    }

    const LAYER2_CONFIGS: [&str; 3] = [
        r#"{"cniVersion": "1.0.0", "name": "unit", "type": "bridge", "bridge": "br-unit",
            "vlan": 100, "vlanTrunk": [{"id": 200}, {"minID": 300, "maxID": 301}],
            "hairpinMode": true}"#,
        r#"{"cniVersion": "1.0.0", "name": "unit", "type": "bridge", "bridge": "br-unit",
            "promiscMode": true, "portIsolation": true, "mtu": 1400}"#,
        r#"{"cniVersion": "1.0.0", "name": "unit", "type": "bridge", "bridge": "br-unit",
            "vlanTrunk": [{"id": 7}], "runtimeConfig": {"mac": "02:00:00:00:00:42"}}"#,
    ];

    #[test]
    fn a_failure_at_each_step_of_add_leaves_the_namespaces_as_they_were() {
        for json in LAYER2_CONFIGS {
            let req = request(json);
            let conf = BridgeConf::load(&req).unwrap();
            let (host, pod) = world(&conf);
            host.fail_at(None);
            run_add(&req, &conf, &host, &pod).unwrap();
            let steps = host.log().len();
            let mut failed_adds = 0;
            for n in 0..steps {
                let (host, pod) = world(&conf);
                let before = host.snapshot();
                host.fail_at(Some(n));
                let outcome = run_add(&req, &conf, &host, &pod);
                let log = host.log();
                let failed = log.iter().find(|c| c.starts_with('!')).unwrap();
                match outcome {
                    Err(e) => {
                        failed_adds += 1;
                        assert_eq!(host.snapshot(), before, "{json}: failure at {failed}: {e}");
                        // The kernel's answer and errno reach the user.
                        assert!(
                            e.msg.contains("Operation not permitted (os error 1)"),
                            "{failed}: {e}"
                        );
                    }
                    // Only the best-effort accept_ra writes may fail without failing ADD,
                    // and the request for both port flags, which are then set one by one.
                    Ok(_) => assert!(
                        ["!host:write_sysctl", "!host:set_port_flags"].contains(&failed.as_str()),
                        "{json}: {log:?}"
                    ),
                }
            }
            assert!(
                failed_adds >= 10,
                "{json}: only {failed_adds} of {steps} steps"
            );
        }
    }

    #[test]
    fn layer2_add_makes_the_port_and_container_link_it_reports() {
        let req = request(LAYER2_CONFIGS[0]);
        let conf = BridgeConf::load(&req).unwrap();
        let (host, pod) = world(&conf);
        let result = run_add(&req, &conf, &host, &pod).unwrap();
        let (host_ns, pod_ns): (Namespace, Namespace) = host.snapshot();
        let bridge = host_ns.links.values().find(|l| l.name == BRIDGE).unwrap();
        let port = host_ns
            .links
            .values()
            .find(|l| l.kind.as_deref() == Some("veth"))
            .unwrap();
        let container = pod_ns.links.values().find(|l| l.name == "eth0").unwrap();
        assert_eq!(port.controller, Some(bridge.index));
        assert_eq!(port.peer_index, Some(container.index));
        assert!(port.up && container.up);
        assert_eq!(port.bridge_port.map(|p| p.hairpin), Some(true));
        let vids: Vec<(u16, bool, bool)> = host_ns.vlans[&port.index]
            .iter()
            .map(|v| (v.vid, v.pvid, v.untagged))
            .collect();
        // The default VLAN 1 is gone; the access VLAN is native, the trunk tagged.
        assert_eq!(
            vids,
            [
                (100, true, true),
                (200, false, false),
                (300, false, false),
                (301, false, false)
            ]
        );
        let names: Vec<&str> = result.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, [BRIDGE, port.name.as_str(), "eth0"]);
        assert_eq!(result.interfaces[2].sandbox, "/proc/self/ns/net");
        assert_eq!(result.interfaces[2].mac, container.mac.unwrap().to_string());
        assert!(result.ips.is_empty());
    }

    #[test]
    fn add_steps_run_in_order() {
        let req = request(LAYER2_CONFIGS[1]);
        let conf = BridgeConf::load(&req).unwrap();
        let (host, pod) = world(&conf);
        host.fail_at(None);
        run_add(&req, &conf, &host, &pod).unwrap();
        assert_eq!(
            host.log(),
            [
                "pod:link_by_name",
                "host:link_by_name",
                "host:write_sysctl",
                "host:create_veth",
                "host:require_link",
                "host:write_sysctl",
                "host:set_port_flags",
                "host:set_up",
                "host:require_link",
                "host:set_mac",
                "pod:require_link",
                "pod:set_up",
                "host:wait_oper_up",
            ]
        );
    }

    #[test]
    fn an_existing_container_interface_is_refused_and_kept() {
        let req = request(LAYER2_CONFIGS[1]);
        let conf = BridgeConf::load(&req).unwrap();
        let (host, pod) = world(&conf);
        let index = host.next_index();
        host.with_world(|w| w.pod.links.insert(index, link(index, "eth0", "dummy")));
        let before = host.snapshot();
        let e = run_add(&req, &conf, &host, &pod).unwrap_err();
        assert!(
            e.msg
                .contains("container interface \"eth0\" already exists"),
            "{e}"
        );
        assert_eq!(host.snapshot(), before);
    }

    #[test]
    fn a_name_taken_on_the_host_by_something_else_than_a_bridge_is_refused() {
        let req = request(LAYER2_CONFIGS[1]);
        let conf = BridgeConf::load(&req).unwrap();
        let (host, pod) = Fake::pair();
        let index = host.next_index();
        host.with_world(|w| w.host.links.insert(index, link(index, BRIDGE, "dummy")));
        let before = host.snapshot();
        let e = run_add(&req, &conf, &host, &pod).unwrap_err();
        assert_eq!(
            e.msg,
            "failed to create bridge \"br-unit\": \"br-unit\" already exists but is not a bridge"
        );
        assert_eq!(host.snapshot(), before);
    }

    #[test]
    fn gateway_address_is_kept_refused_or_forced_like_the_reference() {
        let (host, _) = Fake::pair();
        let bridge = link(1, BRIDGE, "bridge");
        host.with_world(|w| w.host.links.insert(1, bridge.clone()));
        let gw: IpNetwork = "10.9.0.1/24".parse().unwrap();
        let other: IpNetwork = "10.8.0.1/24".parse().unwrap();
        let on_bridge =
            || -> Vec<IpNetwork> { host.snapshot().0.addresses.iter().map(|a| a.ip).collect() };
        ensure_addr(&host, &bridge, gw, false).unwrap();
        // A second ADD of the same network keeps it.
        ensure_addr(&host, &bridge, gw, false).unwrap();
        assert_eq!(on_bridge(), [gw]);
        let e = ensure_addr(&host, &bridge, other, false).unwrap_err();
        assert_eq!(
            e.msg,
            "\"br-unit\" already has an IP address different from 10.8.0.1/24"
        );
        assert_eq!(on_bridge(), [gw]);
        ensure_addr(&host, &bridge, other, true).unwrap();
        assert_eq!(on_bridge(), [other]);
        // IPv6 gateways of other subnets live side by side.
        let v6a: IpNetwork = "fd00:1::1/64".parse().unwrap();
        let v6b: IpNetwork = "fd00:2::1/64".parse().unwrap();
        ensure_addr(&host, &bridge, v6a, false).unwrap();
        ensure_addr(&host, &bridge, v6b, false).unwrap();
        assert_eq!(on_bridge(), [other, v6a, v6b]);
    }

    #[test]
    fn an_ipv6_gateway_skips_dad_and_an_existing_address_is_left_alone() {
        let (host, _) = Fake::pair();
        let bridge = link(1, BRIDGE, "bridge");
        host.with_world(|w| w.host.links.insert(1, bridge.clone()));
        let v6: IpNetwork = "fd00:1::1/64".parse().unwrap();
        let v4: IpNetwork = "10.9.0.1/24".parse().unwrap();
        ensure_addr(&host, &bridge, v6, false).unwrap();
        ensure_addr(&host, &bridge, v4, false).unwrap();
        let flags = |ip: IpNetwork| {
            let on_bridge = host.snapshot().0.addresses;
            let a = on_bridge.iter().find(|a| a.ip == ip).copied();
            a.map(|a| (a.skips_dad(), a.flags))
        };
        assert_eq!(flags(v6).map(|f| f.0), Some(true), "usable at once");
        assert_eq!(flags(v4), Some((false, 0)), "IPv4 has no DAD");
        // Present already (an older plugin's, or another tool's): kept as it is.
        let kept: IpNetwork = "fd00:2::1/64".parse().unwrap();
        host.with_world(|w| {
            w.host.addresses.push(cni_linux::Address {
                ip: kept,
                index: 1,
                scope: 0,
                flags: 0x80,
            })
        });
        host.fail_at(None);
        ensure_addr(&host, &bridge, kept, false).unwrap();
        assert_eq!(flags(kept), Some((false, 0x80)));
        assert_eq!(host.log(), ["host:addresses"]);
    }

    /// Dual-stack layer 3 with every external effect ADD has: IPAM, the gateway on
    /// the bridge, forwarding, default routes, masquerade, the spoof check, port
    /// security, and the pod records and pending addresses of NetworkPolicy.
    const LAYER3: &str = r#"{"cniVersion": "1.0.0", "name": "unit", "type": "bridge",
        "bridge": "br-unit", "isGateway": true, "isDefaultGateway": true,
        "ipMasq": true, "ipMasqBackend": "nftables", "macspoofchk": true,
        "portSecurity": true, "podRecordDir": "/run/unit-records",
        "ipam": {"type": "host-local",
                 "ranges": [[{"subnet": "10.77.0.0/24"}], [{"subnet": "fd77::/64"}]]}}"#;

    fn net(text: &str) -> IpNetwork {
        text.parse().unwrap()
    }

    fn ip(text: &str) -> std::net::IpAddr {
        text.parse().unwrap()
    }

    /// What host-local hands out first for [`LAYER3`]'s ranges.
    fn host_local_result() -> CniResult {
        let ip = |address: &str, gateway: &str| cni_protocol::IpConfig {
            address: net(address),
            gateway: Some(ip(gateway)),
            interface: None,
        };
        CniResult {
            cni_version: "1.0.0".into(),
            ips: vec![ip("10.77.0.2/24", "10.77.0.1"), ip("fd77::2/64", "fd77::1")],
            ..CniResult::default()
        }
    }

    /// The layer-3 world: the bridge exists (see [`world`]), the pod has `lo` with IPv6
    /// on as a new netns has, and IPAM has addresses to give. With `earlier_add`, the
    /// bridge also has the gateway addresses and forwarding is on, as an earlier ADD of
    /// this network leaves them: those are shared by every attachment, so a failed ADD
    /// leaves them (as the reference does), and only then is "as before" exact.
    fn world_l3(conf: &BridgeConf, earlier_add: bool) -> (Fake, Fake) {
        let (host, pod) = world(conf);
        let lo = host.next_index();
        host.with_world(|w| {
            w.ipam = Some(host_local_result());
            w.host.pending = Some(BTreeSet::new());
            w.pod.links.insert(lo, link(lo, "lo", "loopback"));
            w.pod
                .sysctls
                .insert("net/ipv6/conf/lo/disable_ipv6".into(), "0".into());
            if earlier_add {
                let bridge = w.host.links.values().find(|l| l.name == BRIDGE).unwrap();
                for gw in ["10.77.0.1/24", "fd77::1/64"] {
                    w.host.addresses.push(cni_linux::Address {
                        ip: net(gw),
                        index: bridge.index,
                        scope: 0,
                        flags: 0,
                    });
                }
                for forwarding in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"] {
                    w.host.sysctls.insert(forwarding.into(), "1".into());
                }
            }
        });
        (host, pod)
    }

    #[test]
    fn a_failure_at_each_step_of_a_layer3_add_leaves_no_link_address_reservation_or_rule() {
        let req = request(LAYER3);
        let conf = BridgeConf::load(&req).unwrap();
        let (host, pod) = world_l3(&conf, true);
        host.fail_at(None);
        run_add(&req, &conf, &host, &pod).unwrap();
        let calls = host.log();
        // The port's rules, the pod records and the pending addresses exist before the
        // pod's link comes up; the records are published once the addresses are pending.
        let at = |effect: &str| calls.iter().position(|c| c == effect);
        assert!(
            at("host:port_security_setup") < at("pod:set_up"),
            "{calls:?}"
        );
        assert!(
            at("host:pod_record_stage") < at("host:pending_add")
                && at("host:pending_add") < at("host:pod_record_publish")
                && at("host:pod_record_publish") < at("pod:set_up"),
            "{calls:?}"
        );
        for effect in [
            "host:macspoof_setup",
            "host:port_security_setup",
            "host:pod_record_stage",
            "host:pending_add",
            "host:pod_record_publish",
            "host:ipam_add",
            "host:masq_setup",
            "pod:write_sysctl",
            "pod:add_address",
            "pod:add_route",
            "host:write_sysctl",
        ] {
            assert!(calls.iter().any(|c| c == effect), "{effect}: {calls:?}");
        }
        let mut failed_adds = 0;
        for (n, call) in calls.iter().enumerate() {
            let (host, pod) = world_l3(&conf, true);
            let before = host.snapshot();
            host.fail_at(Some(n));
            let outcome = run_add(&req, &conf, &host, &pod);
            let log = host.log();
            let failed = log.iter().find(|c| c.starts_with('!')).unwrap();
            assert_eq!(&failed[1..], call, "the same calls up to the failure");
            match outcome {
                Err(e) => {
                    failed_adds += 1;
                    assert_eq!(host.snapshot(), before, "failure at {failed}: {e}");
                    let (_, step) = failed.split_once(':').unwrap();
                    assert!(
                        e.msg.contains(&format!("injected failure: {step}"))
                            && e.msg.contains("Operation not permitted (os error 1)"),
                        "{failed}: {e}"
                    );
                }
                // Only the best-effort sysctl writes may fail without failing ADD, and the
                // request for both port flags, which are then set one by one.
                Ok(_) => assert!(
                    failed.ends_with(":write_sysctl")
                        || failed.ends_with(":set_arp_notify")
                        || failed.ends_with(":set_port_flags"),
                    "{log:?}"
                ),
            }
        }
        // All but the five best-effort sysctl writes (accept_ra of the bridge and the
        // port; accept_dad, arp_notify (over netlink) and keep_addr_on_down in the pod) and the port
        // flags' combined request.
        assert_eq!(failed_adds, calls.len() - 6, "{calls:?}");
    }

    #[test]
    fn a_failed_layer3_add_on_a_new_network_leaves_only_the_shared_gateway() {
        let req = request(LAYER3);
        let conf = BridgeConf::load(&req).unwrap();
        let (host, pod) = world_l3(&conf, false);
        host.fail_at(None);
        run_add(&req, &conf, &host, &pod).unwrap();
        let calls = host.log().len();
        for n in 0..calls {
            let (host, pod) = world_l3(&conf, false);
            let (host_before, pod_before) = host.snapshot();
            host.fail_at(Some(n));
            if run_add(&req, &conf, &host, &pod).is_ok() {
                continue;
            }
            let (host_after, pod_after) = host.snapshot();
            assert_eq!(pod_after, pod_before, "{:?}", host.log());
            assert_eq!(host_after.links, host_before.links);
            assert_eq!(host_after.vlans, host_before.vlans);
            assert_eq!(host_after.routes, host_before.routes);
            assert!(host_after.reservations.is_empty() && host_after.rules.is_empty());
            assert!(host_after.pod_records.is_empty(), "{:?}", host.log());
            assert_eq!(
                host_after.pending,
                Some(BTreeSet::new()),
                "{:?}",
                host.log()
            );
            // What may stay is what every attachment of the network shares.
            for a in &host_after.addresses {
                assert!(
                    [net("10.77.0.1/24"), net("fd77::1/64")].contains(&a.ip),
                    "{a:?}"
                );
            }
            for (key, value) in &host_after.sysctls {
                if host_before.sysctls.get(key) != Some(value) {
                    assert!(key.contains("forward") && value == "1", "{key}");
                }
            }
        }
    }

    #[test]
    fn layer3_add_records_what_the_reference_would() {
        let req = request(LAYER3);
        let conf = BridgeConf::load(&req).unwrap();
        let (host, pod) = world_l3(&conf, false);
        let result = run_add(&req, &conf, &host, &pod).unwrap();
        let (host_ns, pod_ns) = host.snapshot();
        let bridge = host_ns.links.values().find(|l| l.name == BRIDGE).unwrap();
        let port = host_ns
            .links
            .values()
            .find(|l| l.kind.as_deref() == Some("veth"))
            .unwrap();
        let eth0 = pod_ns.links.values().find(|l| l.name == "eth0").unwrap();

        // The result: three interfaces, both addresses on the container's, and a
        // default route per family via the gateway.
        let names: Vec<&str> = result.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, [BRIDGE, port.name.as_str(), "eth0"]);
        assert_eq!(result.interfaces[0].mac, bridge.mac.unwrap().to_string());
        assert_eq!(result.interfaces[2].mac, eth0.mac.unwrap().to_string());
        let ips: Vec<(IpNetwork, Option<std::net::IpAddr>, Option<usize>)> = result
            .ips
            .iter()
            .map(|i| (i.address, i.gateway, i.interface))
            .collect();
        assert_eq!(
            ips,
            [
                (net("10.77.0.2/24"), Some(ip("10.77.0.1")), Some(2)),
                (net("fd77::2/64"), Some(ip("fd77::1")), Some(2)),
            ]
        );
        assert_eq!(
            result.routes,
            [
                cni_protocol::Route::new(net("0.0.0.0/0"), Some(ip("10.77.0.1"))),
                cni_protocol::Route::new(net("::/0"), Some(ip("fd77::1"))),
            ]
        );

        // The host: the gateways on the bridge, forwarding on, the reservation and
        // the rules of this attachment.
        let on = |ns: &Namespace, index: u32| -> Vec<IpNetwork> {
            ns.addresses
                .iter()
                .filter(|a| a.index == index)
                .map(|a| a.ip)
                .collect()
        };
        assert_eq!(
            on(&host_ns, bridge.index),
            [net("10.77.0.1/24"), net("fd77::1/64")]
        );
        assert!(on(&host_ns, port.index).is_empty());
        // The IPv6 gateway is usable at once (no DAD); the pod's addresses get DAD as
        // its sysctls say.
        let no_dad: Vec<IpNetwork> = host_ns
            .addresses
            .iter()
            .chain(&pod_ns.addresses)
            .filter(|a| a.skips_dad())
            .map(|a| a.ip)
            .collect();
        assert_eq!(no_dad, [net("fd77::1/64")]);
        assert_eq!(host_ns.sysctls["net/ipv4/ip_forward"], "1");
        assert_eq!(host_ns.sysctls["net/ipv6/conf/all/forwarding"], "1");
        assert_eq!(
            host_ns.reservations["ctr-unit"],
            [net("10.77.0.2/24"), net("fd77::2/64")]
        );
        let mac = eth0.mac.unwrap();
        let rules: Vec<&str> = host_ns.rules.iter().map(String::as_str).collect();
        assert_eq!(
            rules,
            [
                "macspoof ctr-unit eth0 iif ".to_string()
                    + &port.name
                    + &format!(" ether saddr != {mac} drop"),
                "masq ctr-unit eth0 unit Nftables saddr 10.77.0.2 masquerade".into(),
                "masq ctr-unit eth0 unit Nftables saddr fd77::2 masquerade".into(),
                format!(
                    "portsec ctr-unit eth0 iif {} from {mac} [10.77.0.2, fd77::2]",
                    port.name
                ),
            ]
        );

        // The pod records and the pending addresses, for the node agent.
        let record = || ("unit/pod-a".to_string(), "ctr-unit".to_string(), true);
        assert_eq!(
            host_ns.pod_records,
            BTreeMap::from([(ip("10.77.0.2"), record()), (ip("fd77::2"), record())])
        );
        assert_eq!(
            host_ns.pending,
            Some(BTreeSet::from([ip("10.77.0.2"), ip("fd77::2")]))
        );

        // The pod: both addresses on eth0, up, IPv6 on, and the default routes; with
        // portSecurity, the link-local address its rules allow.
        assert!(eth0.up && port.up);
        assert_eq!(pod_ns.sysctls["net/ipv6/conf/eth0/addr_gen_mode"], "0");
        assert_eq!(
            on(&pod_ns, eth0.index),
            [net("10.77.0.2/24"), net("fd77::2/64")]
        );
        assert_eq!(pod_ns.sysctls["net/ipv6/conf/eth0/disable_ipv6"], "0");
        assert_eq!(pod_ns.sysctls["net/ipv6/conf/eth0/accept_dad"], "0");
        assert_eq!(pod_ns.sysctls["net/ipv6/conf/eth0/accept_ra"], "0");
        assert_eq!(pod_ns.sysctls["net/ipv6/conf/eth0/autoconf"], "0");
        assert_eq!(pod_ns.sysctls["net/ipv4/conf/eth0/arp_notify"], "1");
        let routes: Vec<(IpNetwork, Option<std::net::IpAddr>, Option<u32>)> =
            pod_ns.routes.iter().map(|r| (r.dst, r.gw, r.oif)).collect();
        assert_eq!(
            routes,
            [
                (net("0.0.0.0/0"), Some(ip("10.77.0.1")), Some(eth0.index)),
                (net("::/0"), Some(ip("fd77::1")), Some(eth0.index)),
            ]
        );
    }

    #[test]
    fn without_pod_record_dir_or_pod_args_nothing_is_recorded_or_held() {
        let without_dir = LAYER3.replace(r#""podRecordDir": "/run/unit-records","#, "");
        for (json, args) in [
            (without_dir.as_str(), K8S_ARGS),
            (LAYER3, "IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID=x"),
        ] {
            let mut req = request(json);
            req.args.args = args.into();
            let conf = BridgeConf::load(&req).unwrap();
            let (host, pod) = world_l3(&conf, false);
            host.fail_at(None);
            run_add(&req, &conf, &host, &pod).unwrap();
            let calls = host.log();
            assert!(
                !calls
                    .iter()
                    .any(|c| c.contains("pod_record") || c.contains("pending")),
                "{calls:?}"
            );
            let (host_ns, _) = host.snapshot();
            assert!(host_ns.pod_records.is_empty());
            assert_eq!(host_ns.pending, Some(BTreeSet::new()));
        }
    }

    #[test]
    fn without_the_policy_table_the_records_are_still_written() {
        let req = request(LAYER3);
        let conf = BridgeConf::load(&req).unwrap();
        let (host, pod) = world_l3(&conf, false);
        host.with_world(|w| w.host.pending = None);
        run_add(&req, &conf, &host, &pod).unwrap();
        let (host_ns, _) = host.snapshot();
        assert_eq!(host_ns.pending, None);
        assert_eq!(
            host_ns.pod_records.keys().copied().collect::<Vec<_>>(),
            [ip("10.77.0.2"), ip("fd77::2")]
        );
        assert!(host_ns.pod_records.values().all(|r| r.2));
    }

    #[test]
    fn a_failed_add_takes_back_the_records_and_pending_addresses_before_the_reservation() {
        let req = request(LAYER3);
        let conf = BridgeConf::load(&req).unwrap();
        let (host, pod) = world_l3(&conf, true);
        host.fail_at(None);
        run_add(&req, &conf, &host, &pod).unwrap();
        // Fail the first call after the records are published.
        let n = host
            .log()
            .iter()
            .position(|c| c == "host:pod_record_publish")
            .unwrap()
            + 1;
        let (host, pod) = world_l3(&conf, true);
        let before = host.snapshot();
        host.fail_at(Some(n));
        run_add(&req, &conf, &host, &pod).unwrap_err();
        assert_eq!(host.snapshot(), before);
        let log = host.log();
        let at = |effect: &str| log.iter().position(|c| c == effect).unwrap();
        // Undone in reverse: the addresses leave the pending sets, then their records,
        // and only then is the reservation released (so no other pod can have them yet).
        assert!(
            at("host:pending_remove") < at("host:pod_record_remove")
                && at("host:pod_record_remove") < at("host:ipam_del"),
            "{log:?}"
        );
    }
}
