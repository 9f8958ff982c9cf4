//! GC: forwards to IPAM, then removes masquerade rules, spoof-check and port-security
//! chains of attachments outside the valid list; keeps going past failures.

use crate::config::BridgeConf;
use cni_protocol::error::internal;
use cni_protocol::failpoint::hit;
use cni_protocol::{CniError, Command, Errors, Request};

/// Runs GC, collecting every failure and reporting them together.
pub fn collect_garbage(req: &Request, conf: &BridgeConf) -> Result<(), CniError> {
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
    errors.note(cni_firewall::masq::gc(&conf.network, &valid).map_err(|e| internal(&e)));
    hit("bridge/gc/masq")?;
    errors.note(cni_firewall::macspoof::gc(&valid).map_err(|e| internal(&e)));
    hit("bridge/gc/macspoof")?;
    errors.note(cni_firewall::port_security::gc(&valid).map_err(|e| internal(&e)));
    hit("bridge/gc/port-security")?;
    errors.into_cni_result()
}
