//! Replacing a file atomically: write a temp file in the target's directory, fsync it,
//! set its mode, rename it over the target, fsync the directory. The installer puts the
//! plugins and its network config in place with it, the node agent its conflist.
//!
//! Why not copy in place: opening a running executable for writing fails with ETXTBSY
//! ("Text file busy"), and truncating a config in place lets a reader see half of it.
//! A rename swaps the directory entry in one step; a process running the old binary
//! keeps its inode until it exits. The temp file is in the same directory because
//! rename does not cross filesystems.
//!
//! The plugins are one multi-call executable installed under several names:
//! [`write_linked`] writes it once and gives each name a hard link of that one file, each
//! name still swapped in by its own atomic rename.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Marks our temp files: `.<name>.cni-installer.<pid>.<nanos>.<count>.tmp`. (Named
/// after the installer, which wrote them first; the node agent's are marked the same,
/// so that either one's leftovers are recognised.)
const TEMP_TAG: &str = ".cni-installer.";

/// Writes `contents` to `dir/name` with `mode`, atomically. On failure the target is
/// untouched and the temp file removed.
pub fn write(dir: &Path, name: &str, contents: &[u8], mode: u32) -> io::Result<()> {
    let temp = temp_path(dir, name);
    let result = write_then_rename(&temp, &dir.join(name), contents, mode).and_then(|()| {
        // The rename is durable once the directory is.
        File::open(dir)?.sync_all()
    });
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

fn write_then_rename(temp: &Path, target: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    write_temp(temp, contents, mode)?;
    fs::rename(temp, target)
}

/// Writes `contents` to the new file `temp` with `mode`, durably.
fn write_temp(temp: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    // 0600 while incomplete: nobody runs or reads a half-written file.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(temp)?;
    file.write_all(contents)?;
    file.set_permissions(Permissions::from_mode(mode))?;
    file.sync_all()
}

/// Writes `contents` once and makes every name in `names` (in `dir`) a hard link of that
/// one file with `mode`, each name replaced atomically (a hard link of the complete,
/// synced file is renamed over it), then syncs the directory. Where the filesystem
/// refuses hard links, that name gets its own copy, written as [`write()`] does. On failure
/// the names not yet replaced are untouched and no temp file is left.
pub fn write_linked(dir: &Path, names: &[&str], contents: &[u8], mode: u32) -> io::Result<()> {
    let Some(first) = names.first() else {
        return Ok(());
    };
    let base = temp_path(dir, first);
    let result = write_temp(&base, contents, mode).and_then(|()| {
        for name in names {
            let temp = temp_path(dir, name);
            let placed = match fs::hard_link(&base, &temp) {
                Ok(()) => fs::rename(&temp, dir.join(name)),
                Err(_) => write_then_rename(&temp, &dir.join(name), contents, mode),
            };
            if placed.is_err() {
                let _ = fs::remove_file(&temp);
            }
            placed?;
        }
        Ok(())
    });
    let _ = fs::remove_file(&base);
    // The renames are durable once the directory is.
    result.and_then(|()| File::open(dir)?.sync_all())
}

/// A temp name unlikely to clash even between two containers that are both pid 1 (and
/// unique within this process).
fn temp_path(dir: &Path, name: &str) -> PathBuf {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(
        ".{name}{TEMP_TAG}{}.{nanos}.{count}.tmp",
        std::process::id()
    ))
}

/// Whether `file_name` is one of our temp files.
fn is_temp(file_name: &str) -> bool {
    file_name.starts_with('.') && file_name.contains(TEMP_TAG) && file_name.ends_with(".tmp")
}

/// Removes temp files an earlier, killed run left in `dir`. Best effort: a leftover
/// temp file is untidy, not harmful (libcni ignores dot files and non-plugin names).
pub fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        if entry.file_name().to_str().is_some_and(is_temp) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A fresh directory under the system temp dir, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Self {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            let path = std::env::temp_dir().join(format!(
                "cni-atomic-file-test-{tag}-{}-{nanos}",
                std::process::id()
            ));
            fs::create_dir(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn writes_a_new_file_with_its_mode_and_no_temp_left() {
        let dir = Dir::new("new");
        write(&dir.0, "bridge", b"new", 0o755).unwrap();
        assert_eq!(fs::read(dir.0.join("bridge")).unwrap(), b"new");
        let mode = fs::metadata(dir.0.join("bridge")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o755);
        assert_eq!(names(&dir.0), ["bridge"]);
    }

    #[test]
    fn replaces_by_rename_so_an_open_old_file_keeps_its_contents() {
        let dir = Dir::new("replace");
        let target = dir.0.join("10-net.conflist");
        fs::write(&target, b"old").unwrap();
        let old_inode = fs::metadata(&target).unwrap().ino();
        // Like a running executable: the old inode stays readable after the swap.
        let held = File::open(&target).unwrap();
        write(&dir.0, "10-net.conflist", b"new contents", 0o644).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new contents");
        assert_ne!(fs::metadata(&target).unwrap().ino(), old_inode);
        assert_eq!(held.metadata().unwrap().ino(), old_inode);
        assert_eq!(
            io::read_to_string(held).unwrap(),
            "old",
            "the open file lost its contents"
        );
        assert_eq!(
            fs::metadata(&target).unwrap().mode() & 0o7777,
            0o644,
            "mode of the new file"
        );
        assert_eq!(names(&dir.0), ["10-net.conflist"]);
    }

    #[test]
    fn a_failed_write_leaves_the_target_and_no_temp() {
        let dir = Dir::new("fail");
        // The target is a non-empty directory: rename cannot replace it.
        fs::create_dir(dir.0.join("bridge")).unwrap();
        fs::write(dir.0.join("bridge/keep"), b"x").unwrap();
        assert!(write(&dir.0, "bridge", b"new", 0o755).is_err());
        assert_eq!(names(&dir.0), ["bridge"]);
        assert_eq!(fs::read(dir.0.join("bridge/keep")).unwrap(), b"x");
        // A missing directory fails before anything is created.
        assert!(write(&dir.0.join("missing"), "bridge", b"new", 0o755).is_err());
    }

    #[test]
    fn linked_names_are_one_file_each_replaced_by_rename() {
        let dir = Dir::new("linked");
        fs::write(dir.0.join("host-local"), b"old").unwrap();
        let held = File::open(dir.0.join("host-local")).unwrap();
        let plugins = ["bridge", "host-local", "loopback"];
        write_linked(&dir.0, &plugins, b"multi", 0o755).unwrap();
        let inodes: Vec<u64> = plugins
            .iter()
            .map(|n| fs::metadata(dir.0.join(n)).unwrap().ino())
            .collect();
        assert!(inodes.iter().all(|i| *i == inodes[0]), "{inodes:?}");
        let meta = fs::metadata(dir.0.join("bridge")).unwrap();
        assert_eq!((meta.nlink(), meta.mode() & 0o7777), (3, 0o755));
        assert_eq!(fs::read(dir.0.join("loopback")).unwrap(), b"multi");
        assert_eq!(io::read_to_string(held).unwrap(), "old");
        assert_eq!(names(&dir.0), plugins);
        // A name that cannot be replaced stops there, with no temp left.
        fs::create_dir(dir.0.join("busy")).unwrap();
        fs::write(dir.0.join("busy/keep"), b"x").unwrap();
        assert!(write_linked(&dir.0, &["busy", "other"], b"new", 0o755).is_err());
        assert_eq!(names(&dir.0), ["bridge", "busy", "host-local", "loopback"]);
    }

    #[test]
    fn stale_temps_are_removed_and_nothing_else() {
        let dir = Dir::new("stale");
        for name in [
            ".bridge.cni-installer.1.123.tmp",
            ".10-net.conflist.cni-installer.7.9.tmp",
            "bridge",
            ".hidden",
            "x.cni-installer.1.2.tmp",
            ".bridge.cni-installer.1.2.tmp.keep",
        ] {
            fs::write(dir.0.join(name), b"").unwrap();
        }
        remove_stale_temps(&dir.0);
        assert_eq!(
            names(&dir.0),
            [
                ".bridge.cni-installer.1.2.tmp.keep",
                ".hidden",
                "bridge",
                "x.cni-installer.1.2.tmp"
            ]
        );
        assert!(is_temp(
            temp_path(Path::new("/d"), "host-local")
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
        ));
    }
}
