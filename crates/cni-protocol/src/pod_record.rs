//! Pod records: how the bridge plugin tells the node agent, at ADD, which Kubernetes
//! pod a new address belongs to, before kubelet posts the address to the API (seconds
//! later). The runtime passes the pod's namespace and name in `CNI_ARGS`
//! (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`); the plugin writes one small file per address
//! into a directory the agent watches, and removes it at DEL.
//!
//! A record is a file named after the address, holding `namespace/name` and the
//! container id on two lines; it is written atomically (a temp file renamed into
//! place), so a reader sees a whole record or none.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write as _};
use std::net::IpAddr;
use std::path::Path;

/// One record: the pod an address belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRecord {
    /// `namespace/name`.
    pub pod: String,
    /// The container (sandbox) id of the attachment.
    pub container_id: String,
}

/// Writes records for `ips` into `dir` (created if missing).
pub fn write(dir: &Path, ips: &[IpAddr], record: &PodRecord) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let text = format!("{}\n{}\n", record.pod, record.container_id);
    for ip in ips {
        let name = ip.to_string();
        let temp = dir.join(format!(".{name}.{}", std::process::id()));
        let mut file = fs::File::create(&temp)?;
        let written = file
            .write_all(text.as_bytes())
            .and_then(|()| file.sync_data());
        if let Err(e) = written.and_then(|()| fs::rename(&temp, dir.join(&name))) {
            let _ = fs::remove_file(&temp);
            return Err(e);
        }
    }
    Ok(())
}

/// Removes the records of `ips` made for `container_id` (another container's record
/// of a reused address is left alone); absent records are fine.
pub fn remove(dir: &Path, ips: &[IpAddr], container_id: &str) -> io::Result<()> {
    for ip in ips {
        let path = dir.join(ip.to_string());
        match fs::read_to_string(&path) {
            Ok(text) if parse(&text).is_some_and(|r| r.container_id == container_id) => {
                match fs::remove_file(&path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Every record in `dir` (none when it does not exist); unreadable entries are skipped.
pub fn read_all(dir: &Path) -> BTreeMap<IpAddr, PodRecord> {
    let Ok(entries) = fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let ip: IpAddr = e.file_name().to_str()?.parse().ok()?;
            let text = fs::read_to_string(e.path()).ok()?;
            Some((ip, parse(&text)?))
        })
        .collect()
}

fn parse(text: &str) -> Option<PodRecord> {
    let mut lines = text.lines();
    let pod = lines.next()?.trim();
    let container_id = lines.next()?.trim();
    let (namespace, name) = pod.split_once('/')?;
    if namespace.is_empty() || name.is_empty() || container_id.is_empty() {
        return None;
    }
    Some(PodRecord {
        pod: pod.to_owned(),
        container_id: container_id.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_read_and_removed_per_container() {
        let dir = std::env::temp_dir().join(format!("cni-pod-records-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let ips: Vec<IpAddr> = vec!["10.244.1.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        let record = PodRecord {
            pod: "x/a".into(),
            container_id: "c1".into(),
        };
        write(&dir, &ips, &record).unwrap();
        fs::write(dir.join("garbage"), "x").unwrap();
        fs::write(dir.join("10.0.0.1"), "no-slash\nc\n").unwrap();
        let all = read_all(&dir);
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[&ips[1]], record);
        // Another container's DEL leaves the record alone.
        remove(&dir, &ips, "c2").unwrap();
        assert_eq!(read_all(&dir).len(), 2);
        remove(&dir, &ips, "c1").unwrap();
        remove(&dir, &ips, "c1").unwrap();
        assert!(read_all(&dir).is_empty());
        assert!(read_all(&dir.join("missing")).is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
