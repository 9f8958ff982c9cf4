//! The effects of ADD outside netlink, behind a small trait: the IPAM delegate, the
//! masquerade and MAC spoof-check rules, the container's sysctls, and the pod records
//! and pending addresses of NetworkPolicy. [`System`] is
//! the real implementation (the IPAM plugin, the firewall, and sysctl writes on a
//! thread inside the pod's netns); the unit tests use the fake in `fake.rs`, so a
//! failure at each of these steps can be tested without root.
//!
//! IPAM and masquerade do not depend on the links, so [`System`] starts them on their
//! own threads ([`Pending`]) while ADD goes on with netlink; the fake runs them inline,
//! which keeps its call order deterministic.

use cni_firewall::port_security::{self, Port};
use cni_firewall::{Backend, macspoof, masq, network_policy};
use cni_linux::{MacAddr, NetNs, sysctl};
use cni_protocol::error::internal;
use cni_protocol::pod_record::{self, PodRecord};
use cni_protocol::{CniError, CniResult, Command, Context, Request};
use ipnetwork::IpNetwork;
use std::net::IpAddr;
use std::panic::resume_unwind;
use std::path::Path;
use std::thread::JoinHandle;

/// Work started by ADD and taken up later: already finished, or running on a thread.
#[derive(Debug)]
pub(crate) enum Pending<T> {
    Done(T),
    Running(JoinHandle<T>),
}

impl<T: Send + 'static> Pending<T> {
    /// Runs `work` on a new thread; if no thread can be started, `unstarted` says why.
    fn spawn(
        name: &str,
        work: impl FnOnce() -> T + Send + 'static,
        unstarted: impl FnOnce(std::io::Error) -> T,
    ) -> Self {
        match std::thread::Builder::new().name(name.into()).spawn(work) {
            Ok(handle) => Self::Running(handle),
            Err(e) => Self::Done(unstarted(e)),
        }
    }

    /// The outcome, once the work is done; a panic in it carries on here.
    pub(crate) fn wait(self) -> T {
        match self {
            Self::Done(outcome) => outcome,
            Self::Running(handle) => handle.join().unwrap_or_else(|panic| resume_unwind(panic)),
        }
    }

    /// Waits for the work only so that nothing runs behind a rollback; its outcome
    /// (even a panic) no longer matters.
    pub(crate) fn settle(self) {
        if let Self::Running(handle) = self {
            let _ = handle.join();
        }
    }
}

/// What ADD does besides links, addresses and routes.
pub(crate) trait Effects {
    /// Runs the IPAM plugin's ADD.
    fn ipam_add(&self, req: &Request) -> Result<CniResult, CniError>;
    /// Starts the IPAM plugin's ADD; by default runs it at once.
    fn start_ipam_add(&self, req: &Request) -> Pending<Result<CniResult, CniError>> {
        Pending::Done(self.ipam_add(req))
    }
    /// Runs the IPAM plugin's DEL.
    fn ipam_del(&self, req: &Request) -> Result<(), CniError>;
    fn macspoof_setup(
        &self,
        container_id: &str,
        ifname: &str,
        host_veth: &str,
        container_mac: Option<MacAddr>,
    ) -> Result<(), CniError>;
    fn macspoof_teardown(&self, container_id: &str, ifname: &str) -> Result<(), CniError>;
    /// Puts the pod of `port` in the `portSecurity` sets.
    fn port_security_setup(&self, port: &PortSecurity) -> Result<(), CniError>;
    /// Starts [`Effects::port_security_setup`]; by default runs it at once.
    fn start_port_security_setup(&self, port: PortSecurity) -> Pending<Result<(), CniError>> {
        Pending::Done(self.port_security_setup(&port))
    }
    fn port_security_teardown(&self, container_id: &str, ifname: &str) -> Result<(), CniError>;
    fn masq_setup(
        &self,
        backend: Backend,
        network: &str,
        ifname: &str,
        container_id: &str,
        nets: &[IpNetwork],
    ) -> Result<(), CniError>;
    /// Starts [`Effects::masq_setup`]; by default runs it at once.
    fn start_masq_setup(
        &self,
        backend: Backend,
        network: &str,
        ifname: &str,
        container_id: &str,
        nets: Vec<IpNetwork>,
    ) -> Pending<Result<(), CniError>> {
        Pending::Done(self.masq_setup(backend, network, ifname, container_id, &nets))
    }
    fn masq_teardown(
        &self,
        network: &str,
        ifname: &str,
        container_id: &str,
    ) -> Result<(), CniError>;
    /// The per-interface sysctls of the container end, written inside `pod_ns`.
    fn container_sysctls(
        &self,
        pod_ns: &NetNs,
        ifname: &str,
        settings: ContainerSysctls,
    ) -> Result<(), CniError>;
    /// Writes the pod records of `ips` into `dir`, not yet visible to the node agent.
    fn pod_record_stage(
        &self,
        dir: &Path,
        ips: &[IpAddr],
        record: &PodRecord,
    ) -> Result<(), CniError>;
    /// Makes the staged pod records of `ips` visible to the node agent.
    fn pod_record_publish(&self, dir: &Path, ips: &[IpAddr]) -> Result<(), CniError>;
    /// Removes the pod records of `ips` made for `container_id`, published or staged.
    fn pod_record_remove(
        &self,
        dir: &Path,
        ips: &[IpAddr],
        container_id: &str,
    ) -> Result<(), CniError>;
    /// Holds `ips` of `pod` (`namespace/name`) in the NetworkPolicy table's pending
    /// sets; whether the table exists (without it, nothing is held).
    fn pending_add(&self, ips: &[IpAddr], pod: &str) -> Result<bool, CniError>;
    /// Takes `ips` out of the pending sets; absent ones, or no table, are fine.
    fn pending_remove(&self, ips: &[IpAddr]) -> Result<(), CniError>;
}

/// The real effects: the IPAM binary, the firewall tools, the kernel's sysctls.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct System;

impl Effects for System {
    fn ipam_add(&self, req: &Request) -> Result<CniResult, CniError> {
        req.ipam_add()
    }

    fn start_ipam_add(&self, req: &Request) -> Pending<Result<CniResult, CniError>> {
        let req = req.clone();
        Pending::spawn(
            "ipam",
            move || req.ipam_add(),
            // No thread: a real internal failure (999), with the OS's cause.
            |e| Err(e).context("failed to start the IPAM plugin"),
        )
    }

    fn ipam_del(&self, req: &Request) -> Result<(), CniError> {
        req.ipam(Command::Del)
    }

    fn macspoof_setup(
        &self,
        container_id: &str,
        ifname: &str,
        host_veth: &str,
        container_mac: Option<MacAddr>,
    ) -> Result<(), CniError> {
        macspoof::setup(container_id, ifname, host_veth, container_mac)
            .context("failed to setup spoof-check")
    }

    fn macspoof_teardown(&self, container_id: &str, ifname: &str) -> Result<(), CniError> {
        macspoof::teardown(container_id, ifname).map_err(|e| internal(&e))
    }

    fn port_security_setup(&self, port: &PortSecurity) -> Result<(), CniError> {
        port_security::setup(&port.port()).context("failed to set up port security")
    }

    fn start_port_security_setup(&self, port: PortSecurity) -> Pending<Result<(), CniError>> {
        Pending::spawn(
            "port-security",
            move || Self.port_security_setup(&port),
            |e| Err(e).context("failed to start the port-security setup"),
        )
    }

    fn port_security_teardown(&self, container_id: &str, ifname: &str) -> Result<(), CniError> {
        port_security::teardown(container_id, ifname).map_err(|e| internal(&e))
    }

    fn masq_setup(
        &self,
        backend: Backend,
        network: &str,
        ifname: &str,
        container_id: &str,
        nets: &[IpNetwork],
    ) -> Result<(), CniError> {
        masq::setup(backend, network, ifname, container_id, nets).map_err(|e| internal(&e))
    }

    fn start_masq_setup(
        &self,
        backend: Backend,
        network: &str,
        ifname: &str,
        container_id: &str,
        nets: Vec<IpNetwork>,
    ) -> Pending<Result<(), CniError>> {
        let (network, ifname, id) = (
            network.to_owned(),
            ifname.to_owned(),
            container_id.to_owned(),
        );
        Pending::spawn(
            "masq",
            move || Self.masq_setup(backend, &network, &ifname, &id, &nets),
            |e| Err(e).context("failed to start the masquerade setup"),
        )
    }

    fn masq_teardown(
        &self,
        network: &str,
        ifname: &str,
        container_id: &str,
    ) -> Result<(), CniError> {
        masq::teardown(network, ifname, container_id).map_err(|e| internal(&e))
    }

    fn container_sysctls(
        &self,
        pod_ns: &NetNs,
        ifname: &str,
        settings: ContainerSysctls,
    ) -> Result<(), CniError> {
        pod_ns
            .run(|| container_sysctls(sysctl::write, ifname, settings))
            .map_err(|e| internal(&e))?
    }

    fn pod_record_stage(
        &self,
        dir: &Path,
        ips: &[IpAddr],
        record: &PodRecord,
    ) -> Result<(), CniError> {
        pod_record::stage(dir, ips, record)
            .with_context(|| format!("failed to write the pod records in {}", dir.display()))
    }

    fn pod_record_publish(&self, dir: &Path, ips: &[IpAddr]) -> Result<(), CniError> {
        pod_record::publish(dir, ips)
            .with_context(|| format!("failed to publish the pod records in {}", dir.display()))
    }

    fn pod_record_remove(
        &self,
        dir: &Path,
        ips: &[IpAddr],
        container_id: &str,
    ) -> Result<(), CniError> {
        pod_record::remove(dir, ips, container_id)
            .with_context(|| format!("failed to remove the pod records in {}", dir.display()))
    }

    fn pending_add(&self, ips: &[IpAddr], pod: &str) -> Result<bool, CniError> {
        network_policy::add_pending(ips, Some(pod))
            .context("failed to hold the pod's addresses in the NetworkPolicy table's pending sets")
    }

    fn pending_remove(&self, ips: &[IpAddr]) -> Result<(), CniError> {
        remove_pending(ips)
    }
}

/// Takes `ips` out of the NetworkPolicy table's pending sets (for DEL and GC, which
/// call it directly); absent ones, or no table, are fine.
pub(crate) fn remove_pending(ips: &[IpAddr]) -> Result<(), CniError> {
    network_policy::remove_pending(ips)
        .context("failed to take addresses out of the NetworkPolicy table's pending sets")
}

/// The attachment `portSecurity` protects, owned so that it can be handed to a thread.
#[derive(Debug, Clone)]
pub(crate) struct PortSecurity {
    pub(crate) container_id: String,
    pub(crate) ifname: String,
    pub(crate) host_veth: String,
    pub(crate) mac: MacAddr,
    pub(crate) addresses: Vec<std::net::IpAddr>,
}

impl PortSecurity {
    pub(crate) fn port(&self) -> Port<'_> {
        Port {
            container_id: &self.container_id,
            ifname: &self.ifname,
            host_veth: &self.host_veth,
            mac: self.mac,
            addresses: &self.addresses,
        }
    }
}

/// What the container end's sysctls are set from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ContainerSysctls {
    /// `enabledad`.
    pub(crate) enable_dad: bool,
    /// The attachment has an IPv6 address.
    pub(crate) has_v6: bool,
    /// `acceptRouterAdvertisements`: when false, the interface takes no router
    /// advertisement (no route, no SLAAC address), IPv4-only networks included.
    pub(crate) accept_ra: bool,
    /// `portSecurity`: the link-local address must be the EUI-64 one the rules allow.
    pub(crate) eui64_link_local: bool,
}

/// The container end's sysctls, each written with `write`. The real `write` runs on a
/// thread inside the pod netns: per-interface sysctls resolve there.
pub(crate) fn container_sysctls(
    write: impl Fn(&str, &str) -> cni_linux::Result<()>,
    ifname: &str,
    settings: ContainerSysctls,
) -> Result<(), CniError> {
    let ContainerSysctls {
        enable_dad,
        has_v6,
        accept_ra,
        eui64_link_local,
    } = settings;
    if eui64_link_local {
        // Before the link comes up: the link-local address is generated then, and
        // the rules allow only the one derived from the MAC. Mode 0 is EUI-64,
        // whatever a stable secret or the netns default would choose.
        match write(&format!("net/ipv6/conf/{ifname}/addr_gen_mode"), "0") {
            Err(cni_linux::Error::SysctlWrite { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            other => other.with_context(|| {
                format!("failed to set EUI-64 address generation on {ifname:?} for portSecurity")
            })?,
        }
    }
    if !accept_ra {
        // Before the link comes up, so no advertisement is ever taken. A kernel
        // without IPv6 has no such file and nothing to protect.
        for (key, value) in [("accept_ra", "0"), ("autoconf", "0")] {
            match write(&format!("net/ipv6/conf/{ifname}/{key}"), value) {
                Err(cni_linux::Error::SysctlWrite { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                other => other.with_context(|| {
                    format!("failed to turn off router advertisements on {ifname:?} ({key})")
                })?,
            }
        }
    }
    // DAD makes pods wait 1-2 s for addresses nobody else can own on a fresh veth.
    if enable_dad {
        let _ = write(&format!("net/ipv6/conf/{ifname}/enhanced_dad"), "1");
        let _ = write(&format!("net/ipv6/conf/{ifname}/accept_dad"), "1");
    } else {
        let _ = write(&format!("net/ipv6/conf/{ifname}/accept_dad"), "0");
    }
    if has_v6 {
        for dev in ["lo", ifname] {
            write(&format!("net/ipv6/conf/{dev}/disable_ipv6"), "0")
                .with_context(|| format!("failed to enable IPv6 on {dev:?}"))?;
        }
        // Keep addresses when the link goes down and up again.
        let _ = write(&format!("net/ipv6/conf/{ifname}/keep_addr_on_down"), "1");
    }
    Ok(())
}
