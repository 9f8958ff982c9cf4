//! Reservations made before the current boot are released by themselves (`ipam`
//! key `releaseOnReboot`, on by default).
//!
//! No pod network namespace survives a reboot, but the files under `dataDir` do, so
//! without help a range fills up with the reservations of dead pods and a container
//! restarted under the same id meets "duplicate allocation is not allowed". What makes a
//! reservation stale is not its age but that it existed during an earlier boot, so that
//! is what we record, with the kernel's boot id (`/proc/sys/kernel/random/boot_id`, a
//! random UUID per boot), never with file times: the clock can be wrong at boot (no RTC,
//! RTC drift) and be stepped later, which would make a reservation made early in this
//! boot look older than the boot itself.
//!
//! Two records, both invisible to the reference binary's reading and writing (it only
//! reads the content of files whose names it looks up, and compares it whole):
//!
//! - **Stamp**: an extended attribute `user.cni.boot_id` on a reservation file, holding
//!   the id of a boot during which that file existed. Our ADD stamps the temp file
//!   before publishing it with link(2), so a reservation is never seen unstamped or
//!   wrongly stamped. The stamp lives and dies with the inode: the reference never
//!   rewrites a reservation (it creates new files with `O_EXCL`), and a file it creates
//!   has no stamp.
//! - **Marker** `boot.json` in the network directory: `{"bootID": <id>, "released":
//!   {<address>: <owner>}}`, the boot during which the directory was last swept and what
//!   that sweep released (at most [`MAX_REMEMBERED`] bytes of them, so the file stays
//!   small; owners beyond that get a round-robin address on re-ADD).
//!
//! The **sweep** runs under the network lock on ADD (before an address is chosen) and on
//! GC, once per boot: when the marker names another boot (or is missing), every
//! reservation is looked at:
//! - stamped with another boot id: it existed during an earlier boot, so its pod is gone:
//!   released (its owner remembered in the marker, so a re-ADD of the same container id
//!   and ifname gets the same address back where it is still free);
//! - stamped with this boot id: kept;
//! - not stamped (made by the reference binary, or by us with the key off, or before we
//!   were installed): made either before the reboot or in this boot before our first
//!   run, which nothing sound can tell apart, so it is **kept**, and stamped with this
//!   boot id (true: it exists now). It is then released after the next reboot.
//!
//! Then the marker is written. STATUS, which does not take the lock, counts reservations
//! the sweep would release as free.
//!
//! Limits: a reservation the reference binary makes is only stamped by our next sweep,
//! so one it made before a reboot is released one reboot late, never early. The file
//! system must support user extended attributes (ext4, xfs, btrfs, tmpfs since Linux
//! 6.6, overlayfs on those); where it does not, nothing is ever stamped and nothing is
//! released (a `dataDir` on tmpfs needs none of this). Copying a data directory with its
//! attributes (`cp -a`) into a new boot carries the old stamps, and those reservations
//! are then released, as the copied pods are gone too.

use crate::error::{Error, Result};
use crate::store::{Entry, Locked, Store};
use cni_protocol::Errors;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::Path;

/// Where the kernel publishes the boot id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
/// The extended attribute holding a reservation's boot id.
pub const STAMP: &str = "user.cni.boot_id";
/// The marker file in the network directory (not an address, so the reference and every
/// reader of reservations skip it).
pub const MARKER: &str = "boot.json";
/// At most this many bytes of released owners are remembered, which keeps the marker
/// (read by every ADD) small and far below the largest state file we read.
pub const MAX_REMEMBERED: usize = 16 * 1024;

/// The current boot id, `None` if it cannot be read (then nothing is stamped or swept).
pub fn current_boot_id() -> Option<String> {
    let text = std::fs::read_to_string(BOOT_ID_PATH).ok()?;
    let id = text.trim();
    let plausible = !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    plausible.then(|| id.to_owned())
}

/// A reservation file's stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stamp {
    /// No stamp: not made by us with this feature on, and not swept since.
    None,
    /// Existed during this boot.
    Boot(String),
    /// Cannot tell (no extended attributes here, a value we did not write, the file
    /// vanished): treated as current.
    Unknown,
}

/// Reads the stamp of `path` (not following a symlink).
pub fn stamp_of(path: &Path) -> Stamp {
    let mut buf = [0u8; 64];
    match rustix::fs::lgetxattr(path, STAMP, &mut buf[..]) {
        Ok(len) => match std::str::from_utf8(&buf[..len]) {
            Ok(id) => Stamp::Boot(id.to_owned()),
            Err(_) => Stamp::Unknown,
        },
        Err(rustix::io::Errno::NODATA) => Stamp::None,
        Err(_) => Stamp::Unknown,
    }
}

/// Stamps an open file with `boot`. Best effort: unstamped reservations are only ever
/// kept, so a file system without extended attributes costs the feature, not safety.
pub fn stamp_file(file: &File, boot: &str) {
    let _ = rustix::fs::fsetxattr(
        file,
        STAMP,
        boot.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    );
}

fn stamp_path(path: &Path, boot: &str) {
    let _ = rustix::fs::lsetxattr(
        path,
        STAMP,
        boot.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    );
}

/// The marker's content.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// The boot during which the directory was last swept.
    #[serde(rename = "bootID")]
    pub boot_id: String,
    /// What that sweep released: address file name → owner (`<id>\r\n<ifname>`).
    #[serde(default)]
    pub released: BTreeMap<String, String>,
}

/// The marker, `None` if missing or unreadable (then the directory is swept).
pub fn marker(store: &Store) -> Option<Marker> {
    let text = store.read(MARKER).ok()??;
    serde_json::from_str(&text).ok()
}

/// Whether the sweep would release `entry` in boot `boot`.
fn is_stale(store: &Store, entry: &Entry, boot: &str) -> bool {
    matches!(stamp_of(&store.file(&entry.name)), Stamp::Boot(b) if b != boot)
}

/// Sweeps the directory (see the module docs) unless it was already swept during boot
/// `boot`. Returns the owners of what the last sweep of this boot released. Keeps going
/// past failures and reports them together; the marker is only written when none
/// happened, so the next command sweeps again.
pub fn sweep(locked: &Locked<'_>, boot: &str) -> Result<BTreeMap<String, String>> {
    if let Some(marker) = marker(locked.store()).filter(|m| m.boot_id == boot) {
        return Ok(marker.released);
    }
    let mut released = BTreeMap::new();
    let mut remembered = 0;
    let mut released_count = 0;
    let mut errors = Errors::default();
    for entry in locked.scan()? {
        let path = locked.store().file(&entry.name);
        match stamp_of(&path) {
            Stamp::Boot(b) if b != boot => {
                let owner = locked.read(&entry.name).ok().flatten();
                match locked.release(&entry.name) {
                    Ok(_) => {
                        released_count += 1;
                        let owner = owner.map(|o| o.trim().to_owned()).unwrap_or_default();
                        // Name, owner, quotes, colon, comma and the escaped \r\n.
                        let size = entry.name.len() + owner.len() + 8;
                        if !owner.is_empty() && remembered + size <= MAX_REMEMBERED {
                            remembered += size;
                            released.insert(entry.name, owner);
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
            Stamp::None => stamp_path(&path, boot),
            Stamp::Boot(_) | Stamp::Unknown => {}
        }
    }
    if released_count > 0 {
        cni_protocol::log::info(&format!(
            "released {released_count} reservations made before boot {boot}"
        ));
    }
    errors.into_result_all(Error::Many)?;
    let marker = Marker {
        boot_id: boot.to_owned(),
        released,
    };
    let text = serde_json::to_string(&marker).unwrap_or_default();
    locked.replace(MARKER, text.as_bytes(), "marker-temp-written")?;
    locked.step("swept")?;
    Ok(marker.released)
}

/// Prepares a locked store for ADD or GC: sweeps it and sets what reservations are
/// stamped with. A sweep that failed is reported by GC (`strict`) and only logged by ADD,
/// which can still serve from what is left.
pub fn prepare(locked: &mut Locked<'_>, strict: bool) -> Result<()> {
    let Some(boot) = current_boot_id() else {
        return Ok(());
    };
    let previous = match sweep(locked, &boot) {
        Ok(previous) => previous,
        Err(Error::Injected(e)) => return Err(Error::Injected(e)),
        Err(e) if strict => return Err(e),
        Err(e) => {
            eprintln!("host-local: releasing reservations made before this boot: {e}");
            BTreeMap::new()
        }
    };
    locked.set_boot(boot, previous);
    Ok(())
}

/// The reservations among `entries` that a sweep in boot `boot` would release (STATUS,
/// without the lock: advice).
pub fn stale_names(store: &Store, entries: &[Entry], boot: &str) -> HashSet<String> {
    if marker(store).is_some_and(|m| m.boot_id == boot) {
        return HashSet::new();
    }
    entries
        .iter()
        .filter(|e| is_stale(store, e, boot))
        .map(|e| e.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::TempDir;
    use std::time::Duration;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn sweep_releases_only_what_existed_in_an_earlier_boot() {
        let tmp = TempDir::new("sweep");
        let store = Store::open(&tmp.0, "n").unwrap();
        let dir = store.dir().to_path_buf();
        // Boot A: two of ours, stamped as they are made.
        let mut locked = store.lock(Duration::from_secs(1)).unwrap();
        assert!(sweep(&locked, "A").unwrap().is_empty());
        locked.set_boot("A".into(), BTreeMap::new());
        assert!(
            locked
                .reserve("10.0.0.2".parse().unwrap(), "c1", "eth0", 0)
                .unwrap()
        );
        assert!(
            locked
                .reserve("10.0.0.3".parse().unwrap(), "c2", "eth0", 0)
                .unwrap()
        );
        drop(locked);
        assert_eq!(stamp_of(&dir.join("10.0.0.2")), Stamp::Boot("A".into()));
        // The reference's file: unstamped.
        std::fs::write(dir.join("10.0.0.4"), "r1\r\neth0").unwrap();
        let entries = store.scan(false).unwrap();
        assert!(
            stale_names(&store, &entries, "A").is_empty(),
            "swept in boot A"
        );

        // Boot B, as STATUS sees it before any sweep: ours of boot A are stale.
        let locked = store.lock(Duration::from_secs(1)).unwrap();
        assert_eq!(
            stale_names(&store, &entries, "B"),
            HashSet::from(["10.0.0.2".into(), "10.0.0.3".into()])
        );
        let released = sweep(&locked, "B").unwrap();
        assert_eq!(
            released,
            BTreeMap::from([
                ("10.0.0.2".to_owned(), "c1\r\neth0".to_owned()),
                ("10.0.0.3".to_owned(), "c2\r\neth0".to_owned()),
            ])
        );
        assert_eq!(
            names(&dir),
            ["10.0.0.4", "boot.json", "last_reserved_ip.0", "lock"]
        );
        // The unstamped one is kept and now carries boot B; a second sweep in B is a
        // no-op that returns the same owners.
        assert_eq!(stamp_of(&dir.join("10.0.0.4")), Stamp::Boot("B".into()));
        assert_eq!(sweep(&locked, "B").unwrap(), released);
        let marker = marker(&store).unwrap();
        assert_eq!(marker.boot_id, "B");
        drop(locked);

        // Boot C: the reference's file existed in B, so it goes now.
        let locked = store.lock(Duration::from_secs(1)).unwrap();
        assert_eq!(sweep(&locked, "C").unwrap().len(), 1);
        assert_eq!(names(&dir), ["boot.json", "last_reserved_ip.0", "lock"]);
    }

    #[test]
    fn remembered_owners_are_bounded() {
        let tmp = TempDir::new("bounded");
        let store = Store::open(&tmp.0, "n").unwrap();
        let mut locked = store.lock(Duration::from_secs(1)).unwrap();
        locked.set_boot("A".into(), BTreeMap::new());
        let long_id = "x".repeat(200);
        for i in 0..300u32 {
            let ip = std::net::IpAddr::from([10, 0, (i / 250) as u8, (i % 250) as u8 + 2]);
            assert!(
                locked
                    .reserve(ip, &format!("{long_id}{i}"), "eth0", 0)
                    .unwrap()
            );
        }
        let released = sweep(&locked, "B").unwrap();
        assert!(!released.is_empty() && released.len() < 300);
        assert!(store.scan(false).unwrap().is_empty(), "all 300 released");
        let size = std::fs::metadata(store.dir().join(MARKER)).unwrap().len();
        assert!(size as usize <= MAX_REMEMBERED + 100, "{size}");
        assert_eq!(marker(&store).unwrap().released, released);
    }

    #[test]
    fn previous_owners_are_matched_like_del() {
        let tmp = TempDir::new("previous");
        let store = Store::open(&tmp.0, "n").unwrap();
        let mut locked = store.lock(Duration::from_secs(1)).unwrap();
        locked.set_boot(
            "B".into(),
            BTreeMap::from([
                ("10.0.0.2".to_owned(), "c1\r\neth0".to_owned()),
                ("10.0.0.3".to_owned(), "c1\r\neth1".to_owned()),
                ("fd00::2".to_owned(), "c1".to_owned()),
            ]),
        );
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(
            locked.previous_addresses("c1", "eth0"),
            [ip("10.0.0.2"), ip("fd00::2")]
        );
        assert!(locked.previous_addresses("c2", "eth0").is_empty());
    }
}
