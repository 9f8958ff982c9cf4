//! DEL: best effort and idempotent. Removes the container interface (when the netns
//! still exists), releases IPAM, and removes masquerade and spoof-check rules, which
//! are found by the attachment's names, so they go even when the netns is gone.

use crate::common::{delete_link, runtime};
use crate::config::BridgeConf;
use cni_firewall::{macspoof, masq};
use cni_linux::{NetNs, Netlink};
use cni_protocol::error::internal;
use cni_protocol::failpoint::hit;
use cni_protocol::log;
use cni_protocol::{CniError, Command, Context, Errors, Request};

/// Runs DEL, collecting every failure and reporting them together.
pub fn delete_attachment(req: &Request, conf: &BridgeConf) -> Result<(), CniError> {
    let (id, ifname) = (req.args.container_id.as_str(), req.args.ifname.as_str());
    let mut errors = Errors::default();
    hit("bridge/del/start")?;
    if let Some(netns) = req.args.netns_path() {
        note(&mut errors, delete_container_link(netns, ifname), || {
            format!("deleted {ifname} in the pod (if it was there)")
        });
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
            macspoof::teardown(id, ifname).map_err(|e| internal(&e)),
            || "removed the spoof-check rules".to_string(),
        );
        hit("bridge/del/macspoof")?;
    }
    if conf.is_layer3() && conf.ip_masq {
        note(
            &mut errors,
            masq::teardown(&conf.network, ifname, id).map_err(|e| internal(&e)),
            || "removed the masquerade rules".to_string(),
        );
        hit("bridge/del/masq")?;
    }
    errors.into_cni_result()
}

/// Records one DEL step's outcome: logs what was removed, or keeps the error.
fn note(
    errors: &mut Errors<CniError>,
    outcome: Result<(), CniError>,
    done: impl FnOnce() -> String,
) {
    if outcome.is_ok() {
        log::info(&done());
    }
    errors.note(outcome);
}

fn delete_container_link(netns: &str, ifname: &str) -> Result<(), CniError> {
    let ns = match NetNs::open(netns) {
        // The runtime may delete the netns before DEL; the veth died with it.
        Err(cni_linux::Error::NetnsNotFound { .. }) => return Ok(()),
        other => other.with_context(|| format!("failed to open netns {netns:?}"))?,
    };
    runtime()?.block_on(async {
        let pod = Netlink::connect_in(&ns).map_err(|e| internal(&e))?;
        delete_link(&pod, ifname).await
    })
}
