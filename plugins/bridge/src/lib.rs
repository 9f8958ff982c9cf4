//! The bridge plugin: a Linux bridge on the host, a veth pair per container with one
//! end on the bridge, addresses from an IPAM plugin, gateway addresses, masquerade,
//! VLANs and the MAC spoof check — and all of it undone on failure or DEL.
//!
//! Every step of ADD, CHECK, DEL and GC passes a failpoint named
//! `bridge/<command>/<step>` (`cni_protocol::failpoint`, live in debug builds only), so
//! the black-box tests can kill or fail the plugin at each step in turn.

mod add;
mod check;
mod common;
pub mod config;
mod del;
mod effects;
#[cfg(test)]
mod fake;
pub mod gateway;
mod gc;
mod links;
mod records;

use cni_protocol::{CniError, CniResult, Command, Plugin, Request};
use config::BridgeConf;

/// The bridge plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bridge;

impl Plugin for Bridge {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        add::add_attachment(req, &BridgeConf::load(req)?)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        del::delete_attachment(req, &BridgeConf::load(req)?)
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        check::check_attachment(req, &BridgeConf::load(req)?)
    }

    fn status(&self, req: &Request) -> Result<(), CniError> {
        let conf = BridgeConf::load(req)?;
        if conf.port_security && !cni_firewall::port_security::available() {
            return Err(CniError::new(
                cni_protocol::ErrorCode::PLUGIN_NOT_AVAILABLE,
                "portSecurity needs nf_tables, which does not answer on this node",
            ));
        }
        if conf.is_layer3() {
            req.ipam(Command::Status)
        } else {
            Ok(())
        }
    }

    /// Removes the pod records of containers outside the valid list, forwards GC to
    /// IPAM, then removes masquerade rules, spoof-check and
    /// port-security chains of attachments outside the valid list; keeps going past
    /// failures.
    fn gc(&self, req: &Request) -> Result<(), CniError> {
        gc::collect_garbage(req, &BridgeConf::load(req)?)
    }
}
