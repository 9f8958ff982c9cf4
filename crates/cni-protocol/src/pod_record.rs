//! Pod records: how the bridge plugin tells the node agent, at ADD, which Kubernetes
//! pod a new address belongs to, before kubelet posts the address to the API (seconds
//! later). The runtime passes the pod's namespace and name in `CNI_ARGS`
//! (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`); the plugin writes one small file per address
//! into a directory the agent watches, and removes it at DEL.
//!
//! A record is a file named after the address, holding `namespace/name` and the
//! container id on two lines; it is written atomically (a temp file renamed into
//! place), so a reader sees a whole record or none.
//!
//! The plugin writes in two steps: it *stages* the records (whole files under a
//! hidden name, `.<address>.<pid>`, which [`read_all`] skips), holds the addresses in
//! the NetworkPolicy table's pending sets, then *publishes* the records (renames them
//! into place). So the agent, woken by a record, always finds the addresses already
//! pending when it releases them; and an ADD killed in between leaves a staged record
//! that DEL and GC find by its container id ([`find`], [`remove_where`]).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// One record: the pod an address belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRecord {
    /// `namespace/name`.
    pub pod: String,
    /// The container (sandbox) id of the attachment.
    pub container_id: String,
}

/// Writes records for `ips` into `dir` (created if missing): [`stage`] then
/// [`publish`].
pub fn write(dir: &Path, ips: &[IpAddr], record: &PodRecord) -> io::Result<()> {
    stage(dir, ips, record)?;
    publish(dir, ips).inspect_err(|_| {
        for ip in ips {
            let _ = fs::remove_file(staged_path(dir, *ip));
        }
    })
}

/// Writes whole records for `ips` into `dir` (created if missing) under this
/// process's hidden names, where [`read_all`] does not see them yet; on failure, the
/// one being written is removed.
///
/// Not synced to disk: a record serves the agent of the same boot, which reads it
/// from the page cache, and a reboot ends the pods it names (a record cut short by a
/// crash is one [`read_all`] skips). On a disk rather than tmpfs, a sync made every
/// ADD wait milliseconds for the disk.
pub fn stage(dir: &Path, ips: &[IpAddr], record: &PodRecord) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let text = format!("{}\n{}\n", record.pod, record.container_id);
    for ip in ips {
        let temp = staged_path(dir, *ip);
        let written = fs::File::create(&temp).and_then(|mut file| file.write_all(text.as_bytes()));
        if let Err(e) = written {
            let _ = fs::remove_file(&temp);
            return Err(e);
        }
    }
    Ok(())
}

/// Renames the records this process staged for `ips` into place, one at a time.
pub fn publish(dir: &Path, ips: &[IpAddr]) -> io::Result<()> {
    for ip in ips {
        fs::rename(staged_path(dir, *ip), dir.join(ip.to_string()))?;
    }
    Ok(())
}

/// Where this process stages the record of `ip`.
fn staged_path(dir: &Path, ip: IpAddr) -> PathBuf {
    dir.join(format!(".{ip}.{}", std::process::id()))
}

/// The record of `ip` in `dir`, if there is a readable one.
pub fn read(dir: &Path, ip: IpAddr) -> io::Result<Option<PodRecord>> {
    match fs::read_to_string(dir.join(ip.to_string())) {
        Ok(text) => Ok(parse(&text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Those of `ips` whose published record was made for `container_id`.
pub fn owned(dir: &Path, ips: &[IpAddr], container_id: &str) -> io::Result<Vec<IpAddr>> {
    let mut owned = Vec::new();
    for ip in ips {
        if read(dir, *ip)?.is_some_and(|r| r.container_id == container_id) {
            owned.push(*ip);
        }
    }
    Ok(owned)
}

/// Removes the records of `ips` made for `container_id`, published or staged by this
/// process (another container's record of a reused address is left alone); absent
/// records are fine.
pub fn remove(dir: &Path, ips: &[IpAddr], container_id: &str) -> io::Result<()> {
    for ip in ips {
        for path in [dir.join(ip.to_string()), staged_path(dir, *ip)] {
            match fs::read_to_string(&path) {
                Ok(text) if parse(&text).is_some_and(|r| r.container_id == container_id) => {
                    remove_file(&path)?;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The addresses of every record in `dir`, published or staged (by any process),
/// that `pred` picks: what an ADD killed midway left, or records of attachments that
/// are gone. In directory order; an address with both a published and a staged
/// record is there twice.
pub fn find(dir: &Path, pred: impl Fn(&PodRecord) -> bool) -> io::Result<Vec<IpAddr>> {
    Ok(entries(dir)?
        .into_iter()
        .filter(|(_, _, record)| pred(record))
        .map(|(ip, _, _)| ip)
        .collect())
}

/// Removes every record in `dir`, published or staged (by any process), that `pred`
/// picks; keeps going past a failure and returns the first.
pub fn remove_where(dir: &Path, pred: impl Fn(&PodRecord) -> bool) -> io::Result<()> {
    let mut first = None;
    for (_, path, record) in entries(dir)? {
        if pred(&record)
            && let Err(e) = remove_file(&path)
        {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Every readable record in `dir`, published (`<address>`) or staged
/// (`.<address>.<pid>`), with its path; none when `dir` does not exist.
fn entries(dir: &Path) -> io::Result<Vec<(IpAddr, PathBuf, PodRecord)>> {
    let list = match fs::read_dir(dir) {
        Ok(list) => list,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in list {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let address = match name.strip_prefix('.') {
            Some(staged) => staged.rsplit_once('.').map_or("", |(ip, _)| ip),
            None => name.as_str(),
        };
        let Ok(ip) = address.parse::<IpAddr>() else {
            continue;
        };
        let path = entry.path();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            // Published over, or removed, since the listing.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if let Some(record) = parse(&text) {
            found.push((ip, path, record));
        }
    }
    Ok(found)
}

fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
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

    #[test]
    fn staged_records_are_found_by_container_but_not_read_until_published() {
        use std::collections::BTreeSet;
        let dir = std::env::temp_dir().join(format!("cni-pod-staged-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mine: Vec<IpAddr> = vec!["10.244.1.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        let theirs: Vec<IpAddr> = vec!["10.244.1.6".parse().unwrap()];
        let record = |id: &str| PodRecord {
            pod: "x/a".into(),
            container_id: id.into(),
        };
        write(&dir, &theirs, &record("c2")).unwrap();
        stage(&dir, &mine, &record("c1")).unwrap();
        // Staged: invisible to the agent, found by container id, not "owned" yet.
        assert_eq!(read_all(&dir).keys().collect::<Vec<_>>(), [&theirs[0]]);
        let found = |id: &str| -> BTreeSet<IpAddr> {
            find(&dir, |r| r.container_id == id)
                .unwrap()
                .into_iter()
                .collect()
        };
        assert_eq!(found("c1"), mine.iter().copied().collect());
        assert!(owned(&dir, &mine, "c1").unwrap().is_empty());
        assert_eq!(read(&dir, mine[0]).unwrap(), None);
        // Another process's staged record (an ADD killed midway) is found too.
        fs::write(dir.join(".10.244.1.7.999999"), "x/b\nc3\n").unwrap();
        fs::write(dir.join(".fd00::7.1"), "x/b\nc3\n").unwrap();
        let c3: Vec<IpAddr> = vec!["10.244.1.7".parse().unwrap(), "fd00::7".parse().unwrap()];
        assert_eq!(found("c3"), c3.iter().copied().collect());
        publish(&dir, &mine).unwrap();
        assert_eq!(read_all(&dir).len(), 3);
        assert_eq!(read(&dir, mine[1]).unwrap(), Some(record("c1")));
        assert_eq!(owned(&dir, &[mine[0], theirs[0]], "c1").unwrap(), [mine[0]]);
        // Staged by this process and never published: `remove` takes it too.
        stage(&dir, &[theirs[0]], &record("c4")).unwrap();
        remove(&dir, &theirs, "c4").unwrap();
        assert!(find(&dir, |r| r.container_id == "c4").unwrap().is_empty());
        assert_eq!(read(&dir, theirs[0]).unwrap(), Some(record("c2")));
        // GC: everything but c2's goes, published or staged.
        remove_where(&dir, |r| r.container_id != "c2").unwrap();
        let left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["10.244.1.6"]);
        assert!(find(&dir.join("missing"), |_| true).unwrap().is_empty());
        remove_where(&dir.join("missing"), |_| true).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
