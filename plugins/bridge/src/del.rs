//! DEL: best effort and idempotent. Removes the container interface (when the netns
//! still exists), the pod records and their pending addresses, releases IPAM, and
//! removes masquerade and spoof-check rules, which are found by the attachment's
//! names, so they go even when the netns is gone.

use crate::common::{delete_link, joined};
use crate::config::BridgeConf;
use crate::effects::remove_pending;
use crate::records;
use cni_firewall::{macspoof, masq, port_security};
use cni_linux::{NetNs, Netlink};
use cni_protocol::error::internal;
use cni_protocol::failpoint::hit;
use cni_protocol::log;
use cni_protocol::{CniError, Command, Errors, Request};

/// Runs DEL, collecting every failure and reporting them together.
///
/// Deleting the veth is most of a DEL's time, spent in the kernel; releasing the
/// addresses and removing the rules do not depend on it, so they run beside it
/// (the masquerade teardown on a thread of its own, as it waits on firewall tools).
pub fn delete_attachment(req: &Request, conf: &BridgeConf) -> Result<(), CniError> {
    let (id, ifname) = (req.args.container_id.as_str(), req.args.ifname.as_str());
    hit("bridge/del/start")?;
    let masq_needed = conf.is_layer3() && conf.ip_masq;
    // Netfilter sockets are closed once the veth is gone (see keep_sockets): closing
    // one sooner would make the deletion of the veth's host end wait for nf_tables.
    let sockets = cni_firewall::keep_sockets();
    let (link, records, ipam, spoof, portsec, masq) = std::thread::scope(|scope| {
        let link = req.args.netns_path().map(|netns| {
            let allow_own = req.args.netns_override;
            scope.spawn(move || delete_container_link(netns, allow_own, ifname))
        });
        let masq = masq_needed.then(|| {
            scope.spawn(|| masq::teardown(&conf.network, ifname, id).map_err(|e| internal(&e)))
        });
        // Before IPAM releases the addresses: once released, an address may be another
        // pod's, pending for it.
        let records = conf
            .pod_record_dir
            .as_deref()
            .map(|dir| records::release(req, dir, remove_pending));
        let ipam = conf.is_layer3().then(|| req.ipam(Command::Del));
        let spoof = conf
            .macspoofchk
            .then(|| macspoof::teardown(id, ifname).map_err(|e| internal(&e)));
        let portsec = conf
            .port_security
            .then(|| port_security::teardown(id, ifname).map_err(|e| internal(&e)));
        (
            link.map(joined),
            records,
            ipam,
            spoof,
            portsec,
            masq.map(joined),
        )
    });
    drop(sockets);
    let mut errors = Errors::default();
    if let Some(outcome) = link {
        note(&mut errors, outcome, || {
            format!("deleted {ifname} in the pod (if it was there)")
        });
        hit("bridge/del/link")?;
    }
    if let Some(outcome) = records {
        note(&mut errors, outcome, || {
            "removed the pod records and their pending addresses".to_string()
        });
        hit("bridge/del/pod-records")?;
    }
    if let Some(outcome) = ipam {
        note(&mut errors, outcome, || {
            format!("released the addresses through {}", req.config.ipam_type)
        });
        hit("bridge/del/ipam")?;
    }
    if let Some(outcome) = spoof {
        note(&mut errors, outcome, || {
            "removed the spoof-check rules".to_string()
        });
        hit("bridge/del/macspoof")?;
    }
    if let Some(outcome) = portsec {
        note(&mut errors, outcome, || {
            "removed the port-security rules".to_string()
        });
        hit("bridge/del/port-security")?;
    }
    if let Some(outcome) = masq {
        note(&mut errors, outcome, || {
            "removed the masquerade rules".to_string()
        });
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

fn delete_container_link(netns: &str, allow_own: bool, ifname: &str) -> Result<(), CniError> {
    let ns = match NetNs::open_container(netns, allow_own) {
        // The runtime may delete the netns before DEL; the veth died with it.
        Err(cni_linux::Error::NetnsNotFound { .. }) => return Ok(()),
        other => other.map_err(|e| cni_linux::netns::container_netns_error(e, netns))?,
    };
    let pod = Netlink::connect_in(&ns).map_err(|e| internal(&e))?;
    delete_link(&pod, ifname)
}
