//! The pod records and pending addresses of NetworkPolicy (`podRecordDir`) at DEL, GC
//! and CHECK. ADD makes them (`add::hold_for_policy`): a record per address of the
//! pod's interface, naming the pod and the container, for the node agent, and the
//! addresses held in the NetworkPolicy table's pending sets until the agent has judged
//! the pod.
//!
//! An address leaves the pending sets only while its record is this container's, and
//! before the record goes: an address released by IPAM may already be another pod's,
//! held pending for that pod, and a DEL retried after a failure must still find what
//! it has to release.

use cni_protocol::pod_record::{self, PodRecord};
use cni_protocol::{CniError, CniResult, Context, Request};
use std::net::IpAddr;
use std::path::Path;

/// DEL: the records of this container and their pending addresses. The addresses are
/// those of `prevResult` when the runtime passes one; without it (no cached result,
/// as after an ADD that never answered) every record made for this container is
/// found by scanning the directory, staged ones included.
pub(crate) fn release(
    req: &Request,
    dir: &Path,
    remove_pending: impl Fn(&[IpAddr]) -> Result<(), CniError>,
) -> Result<(), CniError> {
    let id = req.args.container_id.as_str();
    let context = || format!("failed to remove the pod records in {}", dir.display());
    match &req.config.prev_result {
        Some(prev) => {
            let ips = container_addresses(prev, &req.args.ifname);
            let ours = pod_record::owned(dir, &ips, id).with_context(context)?;
            remove_pending(&ours)?;
            pod_record::remove(dir, &ours, id).with_context(context)
        }
        None => {
            let mine = |r: &PodRecord| r.container_id == id;
            let ours = pod_record::find(dir, mine).with_context(context)?;
            remove_pending(&ours)?;
            pod_record::remove_where(dir, mine).with_context(context)
        }
    }
}

/// GC: the records of containers with no valid attachment, and their pending
/// addresses. A record names no interface, so a container keeps its records while any
/// of its attachments is valid.
pub(crate) fn collect_garbage(
    dir: &Path,
    valid: &[(String, String)],
    remove_pending: impl Fn(&[IpAddr]) -> Result<(), CniError>,
) -> Result<(), CniError> {
    let context = || format!("failed to remove stale pod records in {}", dir.display());
    let stale = |r: &PodRecord| !valid.iter().any(|(id, _)| *id == r.container_id);
    let ips = pod_record::find(dir, stale).with_context(context)?;
    remove_pending(&ips)?;
    pod_record::remove_where(dir, stale).with_context(context)
}

/// CHECK: every address of the pod's interface in `prev` has its record, naming
/// `pod` and this container.
pub(crate) fn check(
    req: &Request,
    dir: &Path,
    pod: &str,
    prev: &CniResult,
) -> Result<(), CniError> {
    let id = req.args.container_id.as_str();
    for ip in container_addresses(prev, &req.args.ifname) {
        let record = pod_record::read(dir, ip).with_context(|| {
            format!("failed to read the pod record of {ip} in {}", dir.display())
        })?;
        record_matches(record, ip, pod, id)
            .with_context(|| format!("CHECK of the pod records in {}", dir.display()))?;
    }
    Ok(())
}

/// How a pod record differs from what CHECK expects.
#[derive(Debug, thiserror::Error)]
enum RecordMismatch {
    #[error(
        "the pod record of {ip} is for {pod} (container {container}), not {want_pod} (container {want_container})"
    )]
    OtherPod {
        ip: IpAddr,
        pod: String,
        container: String,
        want_pod: String,
        want_container: String,
    },
    #[error("there is no pod record of {0}")]
    Missing(IpAddr),
}

/// Whether `record` (of `ip`) names `pod` and the container `id`.
fn record_matches(
    record: Option<pod_record::PodRecord>,
    ip: IpAddr,
    pod: &str,
    id: &str,
) -> Result<(), RecordMismatch> {
    match record {
        Some(r) if r.pod == pod && r.container_id == id => Ok(()),
        Some(r) => Err(RecordMismatch::OtherPod {
            ip,
            pod: r.pod,
            container: r.container_id,
            want_pod: pod.to_owned(),
            want_container: id.to_owned(),
        }),
        None => Err(RecordMismatch::Missing(ip)),
    }
}

/// The addresses `prev` gives the interface `ifname` (or no interface in particular).
fn container_addresses(prev: &CniResult, ifname: &str) -> Vec<IpAddr> {
    let index = prev
        .interfaces
        .iter()
        .position(|i| i.name == ifname && !i.sandbox.is_empty());
    prev.ips
        .iter()
        .filter(|ip| ip.interface.is_none() || ip.interface == index)
        .map(|ip| ip.address.ip())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeSet;
    use std::fs;
    use std::path::PathBuf;

    /// A fresh directory of records, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("cni-bridge-records-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            Self(dir)
        }

        fn names(&self) -> BTreeSet<String> {
            fs::read_dir(&self.0)
                .map(|list| {
                    list.map(|e| e.unwrap().file_name().into_string().unwrap())
                        .collect()
                })
                .unwrap_or_default()
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn record(pod: &str, id: &str) -> PodRecord {
        PodRecord {
            pod: pod.into(),
            container_id: id.into(),
        }
    }

    /// A DEL (or CHECK) request of container `id` on `eth0`, with `prev` as its
    /// prevResult when given.
    fn request(id: &str, prev: Option<&str>) -> Request {
        let json = match prev {
            Some(prev) => {
                format!(r#"{{"cniVersion": "1.0.0", "name": "n", "prevResult": {prev}}}"#)
            }
            None => r#"{"cniVersion": "1.0.0", "name": "n"}"#.to_string(),
        };
        let mut config = cni_protocol::NetConf::parse(json.as_bytes()).unwrap();
        config.load_prev_result().unwrap();
        Request {
            args: cni_protocol::CmdArgs {
                command: cni_protocol::Command::Del,
                container_id: id.into(),
                netns: String::new(),
                ifname: "eth0".into(),
                args: String::new(),
                path: vec![],
                netns_override: false,
            },
            config,
            stdin: json.into_bytes(),
        }
    }

    /// What bridge ADD printed for `eth0` with 10.1.0.2 and fd01::2.
    const PREV: &str = r#"{"cniVersion": "1.0.0",
        "interfaces": [{"name": "br0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/run/netns/p"}],
        "ips": [{"address": "10.1.0.2/24", "interface": 2}, {"address": "fd01::2/64", "interface": 2}]}"#;

    /// A pending set whose removals are recorded, and can be made to fail.
    #[derive(Default)]
    struct Pending {
        held: RefCell<BTreeSet<IpAddr>>,
        fail: RefCell<bool>,
    }

    impl Pending {
        fn holding(ips: &[&str]) -> Self {
            let pending = Self::default();
            pending.held.borrow_mut().extend(ips.iter().map(|i| ip(i)));
            pending
        }

        fn remove(&self, ips: &[IpAddr]) -> Result<(), CniError> {
            if *self.fail.borrow() {
                return Err(CniError::internal("nf_tables said no"));
            }
            self.held.borrow_mut().retain(|i| !ips.contains(i));
            Ok(())
        }

        fn held(&self) -> Vec<String> {
            self.held.borrow().iter().map(ToString::to_string).collect()
        }
    }

    #[test]
    fn del_releases_only_this_containers_records_and_retries_after_a_failure() {
        let dir = Dir::new("del");
        let pending = Pending::holding(&["10.1.0.2", "fd01::2", "10.1.0.9"]);
        pod_record::write(&dir.0, &[ip("10.1.0.2")], &record("a/p", "c1")).unwrap();
        // The IPv6 address was released and is another pod's now, pending for it.
        pod_record::write(&dir.0, &[ip("fd01::2")], &record("a/q", "c2")).unwrap();
        let req = request("c1", Some(PREV));
        *pending.fail.borrow_mut() = true;
        release(&req, &dir.0, |ips| pending.remove(ips)).unwrap_err();
        // Nothing was lost: the retry still finds the record.
        assert_eq!(
            dir.names(),
            BTreeSet::from(["10.1.0.2".into(), "fd01::2".into()])
        );
        *pending.fail.borrow_mut() = false;
        release(&req, &dir.0, |ips| pending.remove(ips)).unwrap();
        assert_eq!(pending.held(), ["10.1.0.9", "fd01::2"]);
        assert_eq!(dir.names(), BTreeSet::from(["fd01::2".into()]));
        // Idempotent, and a DEL of a container that never had records is fine.
        release(&req, &dir.0, |ips| pending.remove(ips)).unwrap();
        release(&request("c9", Some(PREV)), &dir.0, |ips| {
            pending.remove(ips)
        })
        .unwrap();
        assert_eq!(pending.held(), ["10.1.0.9", "fd01::2"]);
        release(&req, &dir.0.join("missing"), |ips| pending.remove(ips)).unwrap();
    }

    #[test]
    fn del_without_prev_result_finds_the_records_of_the_container_staged_or_not() {
        let dir = Dir::new("del-scan");
        let pending = Pending::holding(&["10.1.0.2", "fd01::2", "10.1.0.3"]);
        pod_record::write(&dir.0, &[ip("10.1.0.2")], &record("a/p", "c1")).unwrap();
        // What an ADD killed between holding the address and publishing left.
        fs::write(dir.0.join(".fd01::2.4242"), "a/p\nc1\n").unwrap();
        pod_record::write(&dir.0, &[ip("10.1.0.3")], &record("a/q", "c2")).unwrap();
        release(&request("c1", None), &dir.0, |ips| pending.remove(ips)).unwrap();
        assert_eq!(pending.held(), ["10.1.0.3"]);
        assert_eq!(dir.names(), BTreeSet::from(["10.1.0.3".into()]));
    }

    #[test]
    fn gc_removes_the_records_of_containers_without_a_valid_attachment() {
        let dir = Dir::new("gc");
        let pending = Pending::holding(&["10.1.0.2", "10.1.0.3", "10.1.0.4"]);
        pod_record::write(&dir.0, &[ip("10.1.0.2")], &record("a/p", "c1")).unwrap();
        pod_record::write(&dir.0, &[ip("10.1.0.3")], &record("a/q", "c2")).unwrap();
        fs::write(dir.0.join(".10.1.0.4.77"), "a/r\nc3\n").unwrap();
        fs::write(dir.0.join("not-a-record"), "x").unwrap();
        let valid = [("c2".to_string(), "eth0".to_string())];
        collect_garbage(&dir.0, &valid, |ips| pending.remove(ips)).unwrap();
        assert_eq!(pending.held(), ["10.1.0.3"]);
        assert_eq!(
            dir.names(),
            BTreeSet::from(["10.1.0.3".into(), "not-a-record".into()])
        );
        collect_garbage(&dir.0.join("missing"), &[], |ips| pending.remove(ips)).unwrap();
    }

    #[test]
    fn check_wants_a_record_of_this_pod_and_container_for_each_address() {
        let dir = Dir::new("check");
        let req = request("c1", Some(PREV));
        let prev = req.config.prev_result.clone().unwrap();
        let err = check(&req, &dir.0, "a/p", &prev).unwrap_err();
        assert_eq!(
            err.msg,
            format!(
                "CHECK of the pod records in {}: there is no pod record of 10.1.0.2",
                dir.0.display()
            )
        );
        pod_record::write(&dir.0, &[ip("10.1.0.2")], &record("a/p", "c1")).unwrap();
        pod_record::write(&dir.0, &[ip("fd01::2")], &record("a/q", "c2")).unwrap();
        let err = check(&req, &dir.0, "a/p", &prev).unwrap_err();
        assert_eq!(
            err.msg,
            format!(
                "CHECK of the pod records in {}: the pod record of fd01::2 is for a/q (container \
                 c2), not a/p (container c1)",
                dir.0.display()
            )
        );
        pod_record::write(&dir.0, &[ip("fd01::2")], &record("a/p", "c1")).unwrap();
        check(&req, &dir.0, "a/p", &prev).unwrap();
    }
}
