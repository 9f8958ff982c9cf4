//! The bridge plugin: a Linux bridge on the host, a veth pair per container with one
//! end on the bridge, addresses from an IPAM plugin, gateway addresses, masquerade,
//! VLANs and the MAC spoof check — and all of it undone on failure or DEL.
//!
//! Every step of ADD, CHECK, DEL and GC passes a failpoint named
//! `bridge/<command>/<step>` (`cni_protocol::failpoint`, live in debug builds only), so
//! the black-box tests can kill or fail the plugin at each step in turn.

mod add;
mod check;
pub mod config;
mod del;
pub mod gateway;

use cni_protocol::failpoint::hit;
use cni_protocol::{CniError, CniResult, Command, Plugin, Request};
use config::BridgeConf;

/// The bridge plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bridge;

impl Plugin for Bridge {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        add::run(req, &BridgeConf::load(req)?)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        del::run(req, &BridgeConf::load(req)?)
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        check::run(req, &BridgeConf::load(req)?)
    }

    fn status(&self, req: &Request) -> Result<(), CniError> {
        let conf = BridgeConf::load(req)?;
        if conf.is_layer3() {
            req.ipam(Command::Status)
        } else {
            Ok(())
        }
    }

    /// Forwards GC to IPAM, then removes masquerade rules and spoof-check chains of
    /// attachments outside the valid list; keeps going past failures.
    fn gc(&self, req: &Request) -> Result<(), CniError> {
        let conf = BridgeConf::load(req)?;
        let valid: Vec<(String, String)> = req
            .config
            .valid_attachments()?
            .into_iter()
            .map(|a| (a.container_id, a.ifname))
            .collect();
        let mut errors = Errors::default();
        hit("bridge/gc/start")?;
        if conf.is_layer3() {
            errors.note(req.ipam(Command::Gc));
            hit("bridge/gc/ipam")?;
        }
        errors.note(cni_firewall::masq::gc(&conf.network, &valid).map_err(firewall_error));
        hit("bridge/gc/masq")?;
        errors.note(cni_firewall::macspoof::gc(&valid).map_err(firewall_error));
        hit("bridge/gc/macspoof")?;
        errors.into_result()
    }
}

/// Failures collected by best-effort work (DEL, GC, rollback), reported together.
#[derive(Debug, Default)]
pub(crate) struct Errors(Vec<CniError>);

impl Errors {
    pub(crate) fn note(&mut self, result: Result<(), CniError>) {
        if let Err(e) = result {
            self.0.push(e);
        }
    }

    pub(crate) fn into_result(self) -> Result<(), CniError> {
        match self.0.len() {
            0 => Ok(()),
            // A single error keeps its code (a delegate's error passes through unchanged).
            1 => Err(self.0.into_iter().next().expect("one error")),
            _ => {
                let text: Vec<String> = self.0.iter().map(ToString::to_string).collect();
                Err(CniError::internal(text.join("; ")))
            }
        }
    }
}

pub(crate) fn linux_error(e: cni_linux::Error) -> CniError {
    CniError::internal(chain(&e))
}

/// `e` followed by its causes, `: `-separated. cni-linux keeps the kernel's answer
/// (`File exists`, `Operation not supported`, ...) as the error's source, so printing
/// only the top level would tell the user what failed but never why.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

pub(crate) fn firewall_error(e: cni_firewall::Error) -> CniError {
    CniError::internal(e.to_string())
}

/// Starts the current-thread runtime the netlink calls run on.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, CniError> {
    cni_linux::runtime().map_err(|e| CniError::internal(format!("failed to start runtime: {e}")))
}
