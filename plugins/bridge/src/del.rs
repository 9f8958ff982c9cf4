//! DEL: best effort and idempotent. Removes the container interface (when the netns
//! still exists), releases IPAM, and removes masquerade and spoof-check rules, which
//! are found by the attachment's names, so they go even when the netns is gone.

use crate::config::BridgeConf;
use crate::errors::{Errors, chain, firewall_error, linux_error};
use crate::links::{delete_link, runtime};
use cni_firewall::{macspoof, masq};
use cni_linux::{NetNs, Netlink};
use cni_protocol::failpoint::hit;
use cni_protocol::log;
use cni_protocol::{CniError, Command, Request};

/// Runs DEL, collecting every failure and reporting them together.
pub fn delete_attachment(req: &Request, conf: &BridgeConf) -> Result<(), CniError> {
    let (id, ifname) = (req.args.container_id.as_str(), req.args.ifname.as_str());
    let mut errors = Errors::default();
    hit("bridge/del/start")?;
    if !req.args.netns.is_empty() {
        note(
            &mut errors,
            delete_container_link(&req.args.netns, ifname),
            || format!("deleted {ifname} in the pod (if it was there)"),
        );
        hit("bridge/del/link")?;
    }
    if conf.is_layer3() {
        note(&mut errors, req.ipam(Command::Del), || {
            format!("released the addresses through {}", req.config.ipam_type)
        });
        hit("bridge/del/ipam")?;
    }
    if conf.macspoofchk {
        note(
            &mut errors,
            macspoof::teardown(id, ifname).map_err(firewall_error),
            || "removed the spoof-check rules".to_string(),
        );
        hit("bridge/del/macspoof")?;
    }
    if conf.is_layer3() && conf.ip_masq {
        note(
            &mut errors,
            masq::teardown(&conf.network, ifname, id).map_err(firewall_error),
            || "removed the masquerade rules".to_string(),
        );
        hit("bridge/del/masq")?;
    }
    errors.into_result()
}

/// Records one DEL step's outcome: logs what was removed, or keeps the error.
fn note(errors: &mut Errors, outcome: Result<(), CniError>, done: impl FnOnce() -> String) {
    if outcome.is_ok() {
        log::info(&done());
    }
    errors.note(outcome);
}

fn delete_container_link(netns: &str, ifname: &str) -> Result<(), CniError> {
    let ns = match NetNs::open(netns) {
        // The runtime may delete the netns before DEL; the veth died with it.
        Err(cni_linux::Error::NetnsNotFound { .. }) => return Ok(()),
        other => other.map_err(|e| {
            CniError::internal(format!("failed to open netns {netns:?}: {}", chain(&e)))
        })?,
    };
    runtime()?.block_on(async {
        let pod = Netlink::connect_in(&ns).map_err(linux_error)?;
        delete_link(&pod, ifname).await
    })
}
