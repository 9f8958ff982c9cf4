//! GC: removes the pod records (and their pending addresses) of containers outside the
//! valid list, forwards to IPAM, then removes masquerade rules, spoof-check and
//! port-security chains of attachments outside it; keeps going past failures.

use crate::config::BridgeConf;
use crate::effects::remove_pending;
use crate::records;
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
    if let Some(dir) = &conf.pod_record_dir {
        errors.note(records::collect_garbage(dir, &valid, remove_pending));
        hit("bridge/gc/pod-records")?;
    }
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
