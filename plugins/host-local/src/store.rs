//! The on-disk store, byte-compatible with the reference's `disk` backend, so a node can
//! switch between its binary and ours with reservations intact:
//!
//! ```text
//! <dataDir>/<network>/                  directory, 0755
//! <dataDir>/<network>/lock              empty, flock(2) target, 0750 (as the reference)
//! <dataDir>/<network>/<ip>              "<container id>\r\n<ifname>", 0600
//!                                       (legacy files hold only "<container id>")
//! <dataDir>/<network>/last_reserved_ip.<set index>   "<ip>", 0600
//! <dataDir>/<network>/boot.json         ours only: see [`crate::reboot`]
//! ```
//!
//! Where we differ is crash safety. The reference creates `<ip>` with `O_EXCL` and then
//! writes it, so a killed plugin can leave an empty reservation nobody owns. We write the
//! reservation whole into a temp file first and publish it with link(2), which fails with
//! `EEXIST` rather than replace a reservation. Temp files are named `.cni-tmp.*`: they
//! never parse as an address, and since they only exist while their creator holds the
//! lock, any one seen under the lock is stale and is removed.
//!
//! `last_reserved_ip.N` is rewritten in place, as the reference does, when it is a
//! regular file with one link: one write at offset 0, then a truncate if the new address
//! is shorter. Replacing it with a new file and rename(2) instead would delete an inode
//! on every ADD, and ext4's inode allocator skips recently deleted inodes one by one, so
//! every later file creation in the directory (each ADD's reservation) got slower with
//! the number of pods started in the last minutes. The cursor only orders round-robin
//! allocation, and every reader holds the lock, so the one thing the in-place write
//! gives up is harmless: a crash in the middle of it can leave an address that is wrong
//! or unparsable, which restarts or shifts round-robin order. A cursor that is missing, a
//! symlink, shared with another name or anything but a regular file is replaced with
//! rename(2) as before, never written through.
//!
//! Every step that changes the directory passes a failpoint named
//! `host-local/<command>/<step>` ([`cni_protocol::failpoint`], debug builds only), so tests
//! can kill or fail a command between any two of its file operations.
//!
//! State files are opened with `O_NOFOLLOW`; the network directory must be a real
//! directory, not a symlink, and the network name a single path component.
//!
//! Foreign objects in the directory are tolerated the way the reference tolerates them,
//! and never followed or emptied: a symlink, FIFO, directory or file larger than
//! [`MAX_STATE_FILE`] under an address's name is no reservation of anyone (DEL and GC
//! leave it alone) and its address is not handed out (link(2) fails with `EEXIST`, as
//! the reference's `O_EXCL` create does). A small regular file with unexpected content is
//! a reservation of an unknown owner: skipped by ADD, released by GC. An unparsable or
//! foreign `last_reserved_ip.N` only restarts round-robin order; a failure to replace it
//! after a reservation is published is logged and does not fail the ADD. `lock` must be
//! a regular file (not a symlink, FIFO or directory), or every command fails with an
//! error naming it.

use crate::error::{Error, Result};
use crate::range::parse_ip;
use cni_protocol::{Attachment, Errors};
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;
use std::collections::{BTreeMap, HashSet};
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::net::IpAddr;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// Prefix of the round-robin cursor files.
pub const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
/// Name of the lock file.
pub const LOCK_FILE: &str = "lock";
/// Prefix of our temp files: a leading dot keeps them from parsing as an address.
pub const TEMP_PREFIX: &str = ".cni-tmp.";

/// Largest state file read: a reservation is `<container id>\r\n<ifname>`, far below
/// this; anything bigger is a foreign file, and is not read into memory.
pub const MAX_STATE_FILE: usize = 64 * 1024;

/// The reference's separator between container id and ifname in a reservation.
const LINE_BREAK: &str = "\r\n";

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn temp_name(kind: &str) -> String {
    format!(
        "{TEMP_PREFIX}{}.{}.{kind}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// One network's state directory.
#[derive(Debug)]
pub struct Store {
    /// The command being served (`add`, `del`, ...): names this store's failpoints.
    command: &'static str,
    dir: PathBuf,
    /// The directory, opened without following a symlink; reservations are read relative
    /// to it (openat), which also saves a path walk per file in a 10,000-file scan.
    dir_fd: OwnedFd,
    /// The directory as the held descriptor names it (`/proc/self/fd/<n>`): every file
    /// is created, linked, renamed and removed through it, so a directory swapped for
    /// another after the open cannot redirect a write. [`Store::dir`] without `/proc`.
    at: PathBuf,
}

/// A reservation file found in the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The address it reserves.
    pub ip: IpAddr,
    /// The file name as found (normally the address's canonical text).
    pub name: String,
}

/// How a reservation's content relates to an attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// `<id>\r\n<ifname>`.
    Exact,
    /// Legacy `<id>` only.
    Legacy,
    /// Someone else.
    Other,
}

/// Compares reservation content with (id, ifname) like the reference: whole content,
/// whitespace-trimmed, against `<trimmed id>\r\n<ifname>`, else against `<trimmed id>`.
pub fn owner_of(content: &str, id: &str, ifname: &str) -> Owner {
    let content = content.trim();
    let id = id.trim();
    match content.strip_prefix(id) {
        Some("") => Owner::Legacy,
        Some(rest) if rest.strip_prefix(LINE_BREAK) == Some(ifname) => Owner::Exact,
        _ => Owner::Other,
    }
}

/// The content of a reservation of (id, ifname).
pub fn reservation_content(id: &str, ifname: &str) -> String {
    format!("{}{LINE_BREAK}{ifname}", id.trim())
}

fn nofollow() -> i32 {
    OFlag::O_NOFOLLOW.bits() | OFlag::O_CLOEXEC.bits()
}

/// Below this many reservations a scan reads them on one thread.
const PARALLEL_SCAN_MIN: usize = 512;

/// Reads a small state file; `path` is for messages. `None` when it is bigger than
/// [`MAX_STATE_FILE`] or not a regular file's content (a directory).
fn read_all(mut file: File, path: &Path) -> Result<Option<String>> {
    // Reservations are ~70 bytes: one read usually returns all of it, and a short read
    // of a regular file means end of file, which saves the second read(2).
    let mut buf = vec![0u8; 256];
    let mut len = 0;
    loop {
        let n = match file.read(&mut buf[len..]) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(nix::libc::EISDIR) => return Ok(None),
            // A FIFO opened O_NONBLOCK with a writer that has not written yet.
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(Error::io("read", path, e)),
        };
        len += n;
        if len > MAX_STATE_FILE {
            return Ok(None);
        }
        if n == 0 || len < buf.len() {
            break;
        }
        buf.resize((buf.len() * 2).min(MAX_STATE_FILE + 1), 0);
    }
    buf.truncate(len);
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// Removes `path`; `shown` names it in an error.
fn remove_if_present(path: &Path, shown: &Path) -> Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("remove", shown, e)),
    }
}

/// Creates `path` exclusively (mode 0600) with `content`, replacing a stale leftover of
/// the same name (only called under the lock, where every temp file is stale). A failed
/// write leaves no file behind. Errors are bare: callers say what the file was for.
/// Returns the file, still open, for [`crate::reboot::stamp_file`].
fn write_new(path: &Path, content: &[u8]) -> std::io::Result<File> {
    let create = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nofollow())
            .open(path)
    };
    let mut file = match create() {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            create()
        }
        other => other,
    }?;
    if let Err(e) = file.write_all(content) {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(file)
}

impl Store {
    /// Opens (creating it, mode 0755) the state directory of `network` under `data_dir`.
    pub fn open(data_dir: &Path, network: &str) -> Result<Self> {
        // The dispatcher already restricts names to [a-zA-Z0-9][a-zA-Z0-9_.-]*; this
        // keeps the store safe on its own: one normal component, never `..`.
        let single = Path::new(network)
            .components()
            .eq([std::path::Component::Normal(network.as_ref())]);
        if network.is_empty() || !single || network.contains('\0') {
            return Err(Error::UnsafePath {
                path: data_dir.join(network),
                reason: "network name must be a single path component",
            });
        }
        let dir = data_dir.join(network);
        DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .map_err(|e| Error::io("mkdir", &dir, e))?;
        let dir_fd = match nix::fcntl::open(
            &dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {
                return Err(Error::UnsafePath {
                    path: dir,
                    reason: "network state directory is a symlink or not a directory",
                });
            }
            Err(e) => return Err(Error::io("open", &dir, e.into())),
        };
        let through_fd = PathBuf::from(format!("/proc/self/fd/{}", dir_fd.as_raw_fd()));
        let at = if through_fd.is_dir() {
            through_fd
        } else {
            dir.clone()
        };
        Ok(Self {
            command: "store",
            dir,
            dir_fd,
            at,
        })
    }

    /// Names the command this store serves, for its failpoints.
    #[must_use]
    pub fn for_command(mut self, command: &'static str) -> Self {
        self.command = command;
        self
    }

    /// Passes failpoint `host-local/<command>/<step>`.
    pub fn step(&self, step: &str) -> Result<()> {
        cni_protocol::failpoint::hit(&format!("host-local/{}/{step}", self.command))
            .map_err(Error::Injected)
    }

    /// The network's state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// File `name` of the directory this store opened, to act on (see `at`); messages
    /// name `dir().join(name)`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.at.join(name)
    }

    /// Takes the network's exclusive lock, waiting at most `timeout`.
    ///
    /// Uncontended, this is one non-blocking flock(2). Contended, a helper thread blocks
    /// in flock(2) (so we are woken as soon as the holder lets go, rather than polling)
    /// while we wait for it with a deadline. If the deadline passes the helper is left
    /// blocked; when it gets the lock later, its send fails and the lock is dropped at
    /// once, and process exit ends it anyway.
    pub fn lock(&self, timeout: Duration) -> Result<Locked<'_>> {
        let path = self.dir.join(LOCK_FILE);
        let through = self.file(LOCK_FILE);
        let foreign = |path: &Path| Error::UnsafePath {
            path: path.to_path_buf(),
            reason: "the lock must be a regular file (found a symlink, directory or other file)",
        };
        // The reference creates the lock O_RDONLY|O_CREAT with mode 0750. O_NONBLOCK
        // keeps a FIFO planted as `lock` from blocking the open.
        let fd = match nix::fcntl::open(
            &through,
            OFlag::O_RDONLY
                | OFlag::O_CREAT
                | OFlag::O_NOFOLLOW
                | OFlag::O_NONBLOCK
                | OFlag::O_NOCTTY
                | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o750),
        ) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ELOOP | nix::errno::Errno::EISDIR) => {
                return Err(foreign(&path));
            }
            Err(e) => return Err(Error::io("open", &path, e.into())),
        };
        let file = File::from(fd);
        let is_file = file
            .metadata()
            .map_err(|e| Error::io("stat", &path, e))?
            .is_file();
        if !is_file {
            return Err(foreign(&path));
        }
        let busy = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(self.locked(lock)),
            Err((file, nix::errno::Errno::EWOULDBLOCK)) => file,
            Err((_, e)) => return Err(Error::io("flock", &path, e.into())),
        };
        let timed_out = || Error::LockTimeout {
            path: path.clone(),
            seconds: timeout.as_secs_f64(),
        };
        if timeout.is_zero() {
            return Err(timed_out());
        }
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut file = busy;
            let result = loop {
                match Flock::lock(file, FlockArg::LockExclusive) {
                    Err((f, nix::errno::Errno::EINTR)) => file = f,
                    other => break other.map_err(|(_, e)| e),
                }
            };
            let _ = tx.send(result);
        });
        match rx.recv_timeout(timeout) {
            Ok(Ok(lock)) => Ok(self.locked(lock)),
            Ok(Err(e)) => Err(Error::io("flock", &path, e.into())),
            Err(_) => Err(timed_out()),
        }
    }

    fn locked(&self, lock: Flock<File>) -> Locked<'_> {
        Locked {
            store: self,
            temp: None,
            boot: None,
            previous: BTreeMap::new(),
            _lock: lock,
        }
    }

    /// Lists reservation files: regular files whose name is an address, sorted by name
    /// (the reference walks in lexical order, which decides which duplicate it names).
    /// With `clean`, stale temp files are removed on the way (only valid under the lock).
    pub fn scan(&self, clean: bool) -> Result<Vec<Entry>> {
        let read = std::fs::read_dir(&self.at).map_err(|e| Error::io("readdir", &self.dir, e))?;
        let own = format!("{TEMP_PREFIX}{}.", std::process::id());
        let mut entries = Vec::new();
        for item in read {
            let item = item.map_err(|e| Error::io("readdir", &self.dir, e))?;
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(TEMP_PREFIX) {
                // Ours (this pid) may be in use; any other one seen under the lock is a
                // dead process's leftover.
                if clean && !name.starts_with(&own) {
                    // Best effort: a temp we cannot remove is still not a reservation.
                    let _ = std::fs::remove_file(item.path());
                }
                continue;
            }
            let Some(ip) = parse_ip(name) else { continue };
            if !item.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            entries.push(Entry {
                ip,
                name: name.to_string(),
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    /// Reads state file `name` of this directory without following a symlink;
    /// `Ok(None)` when it does not exist or is a foreign object rather than a state file
    /// (a symlink, directory or FIFO, or bigger than [`MAX_STATE_FILE`]).
    pub fn read(&self, name: &str) -> Result<Option<String>> {
        // O_NONBLOCK: opening a FIFO planted under this name must not wait for a writer.
        let flags = OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        match nix::fcntl::openat(&self.dir_fd, name, flags, Mode::empty()) {
            Ok(fd) => read_all(File::from(fd), &self.dir.join(name)),
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ELOOP) => Ok(None),
            Err(e) => Err(Error::io("open", self.dir.join(name), e.into())),
        }
    }

    /// Reads the owner relation of every entry to (id, ifname) and returns the entries
    /// (id, ifname) owns, in listing order. Unreadable files are skipped, as the
    /// reference does (they cannot be shown to belong to anyone). Large directories are
    /// read by several threads: this read is what every dynamic ADD and every DEL
    /// without prevResult costs.
    pub fn owned_by<'e>(
        &self,
        entries: &'e [Entry],
        id: &str,
        ifname: &str,
    ) -> Vec<(&'e Entry, Owner)> {
        let check = |chunk: &'e [Entry]| -> Vec<(&'e Entry, Owner)> {
            chunk
                .iter()
                .filter_map(|e| match self.read(&e.name) {
                    Ok(Some(content)) => Some((e, owner_of(&content, id, ifname))),
                    _ => None,
                })
                .filter(|(_, o)| *o != Owner::Other)
                .collect()
        };
        if entries.len() < PARALLEL_SCAN_MIN {
            return check(entries);
        }
        // Asked only here: the answer costs reading the cgroup files.
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(8);
        if threads < 2 {
            return check(entries);
        }
        let size = entries.len().div_ceil(threads);
        std::thread::scope(|s| {
            let handles: Vec<_> = entries
                .chunks(size)
                .map(|chunk| s.spawn(move || check(chunk)))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        })
    }

    /// Checks that the directory accepts new files (STATUS): create and remove a temp.
    pub fn probe_writable(&self) -> Result<()> {
        let path = self.file(&temp_name("probe"));
        // One byte, not an empty file: a full file system still creates empty files but
        // cannot take a reservation's content.
        write_new(&path, b"\n").map_err(|e| Error::io("write in", &self.dir, e))?;
        self.step("probe-written")?;
        remove_if_present(&path, &self.dir)?;
        Ok(())
    }
}

/// The store with its lock held; every change to reservations goes through here.
#[derive(Debug)]
pub struct Locked<'a> {
    store: &'a Store,
    /// The whole reservation, written before it is published; kept across failed
    /// link attempts (taken addresses), removed once linked.
    temp: Option<(PathBuf, String)>,
    /// The current boot id, stamped on every reservation made (see [`crate::reboot`]);
    /// `None` when releasing on reboot is off or the boot id is unknown.
    boot: Option<String>,
    /// Reservations released because they were made before this boot: address file
    /// name → owner, so their owners get the same address back.
    previous: BTreeMap<String, String>,
    _lock: Flock<File>,
}

impl Drop for Locked<'_> {
    /// Removes the temp reservation before the lock is released (fields drop after this).
    fn drop(&mut self) {
        if let Some((path, _)) = self.temp.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Locked<'_> {
    /// File `name`, to act on (through the held descriptor).
    fn path(&self, name: &str) -> PathBuf {
        self.store.file(name)
    }

    /// The store this lock is held on.
    pub fn store(&self) -> &Store {
        self.store
    }

    /// Stamps reservations made from now on with boot id `boot`, and remembers the
    /// owners of the reservations released as older than this boot.
    pub fn set_boot(&mut self, boot: String, previous: BTreeMap<String, String>) {
        self.boot = Some(boot);
        self.previous = previous;
    }

    /// The addresses (id, ifname), or legacy id, held before this boot, in name order.
    pub fn previous_addresses(&self, id: &str, ifname: &str) -> Vec<IpAddr> {
        self.previous
            .iter()
            .filter(|(_, owner)| owner_of(owner, id, ifname) != Owner::Other)
            .filter_map(|(name, _)| parse_ip(name))
            .collect()
    }

    /// See [`Store::scan`]; stale temp files are cleaned.
    pub fn scan(&self) -> Result<Vec<Entry>> {
        self.store.scan(true)
    }

    /// The content of reservation `name`, `None` when it does not exist or is foreign.
    pub fn read(&self, name: &str) -> Result<Option<String>> {
        self.store.read(name)
    }

    /// See [`Store::owned_by`].
    pub fn owned_by<'e>(
        &self,
        entries: &'e [Entry],
        id: &str,
        ifname: &str,
    ) -> Vec<(&'e Entry, Owner)> {
        self.store.owned_by(entries, id, ifname)
    }

    /// Reserves `ip` for (id, ifname): links the whole temp reservation to `<ip>`.
    /// `Ok(false)` when the address is taken. On success records it as the last
    /// reserved address of range set `set_index`. On error nothing is reserved.
    pub fn reserve(
        &mut self,
        ip: IpAddr,
        id: &str,
        ifname: &str,
        set_index: usize,
    ) -> Result<bool> {
        let content = reservation_content(id, ifname);
        let target = self.path(&ip.to_string());
        let shown = self.store.dir.join(ip.to_string());
        if self.temp.as_ref().is_none_or(|(_, c)| *c != content) {
            if let Some((old, _)) = self.temp.take() {
                let _ = std::fs::remove_file(old);
            }
            let path = self.path(&temp_name("ip"));
            let file = write_new(&path, content.as_bytes())
                .map_err(|e| Error::io("write reservation", &shown, e))?;
            if let Some(boot) = &self.boot {
                crate::reboot::stamp_file(&file, boot);
            }
            self.temp = Some((path, content));
            self.store.step("temp-written")?;
        }
        let Some((temp, _)) = &self.temp else {
            unreachable!("temp reservation written above")
        };
        match std::fs::hard_link(temp, &target) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(Error::io("link", &shown, e)),
        }
        if let Err(e) = self.store.step("linked") {
            // Nothing half-done: the reservation goes again (the temp stays for reuse and
            // goes with the lock).
            let _ = std::fs::remove_file(&target);
            return Err(e);
        }
        // One inode per reservation, like the reference's files: the temp name goes now
        // and the next reservation writes its own.
        if let Some((temp, _)) = self.temp.take() {
            let _ = std::fs::remove_file(temp);
        }
        // The cursor only orders round-robin: failing to move it (a full file system, a
        // directory planted under its name) costs that order, not the reservation.
        if let Err(e) = self.set_last_reserved(set_index, ip) {
            eprintln!("host-local: could not record the last reserved ip: {e}");
            cni_protocol::log::info(&format!("could not record the last reserved ip: {e}"));
        }
        if let Err(e) = self.store.step("cursor-moved") {
            let _ = std::fs::remove_file(&target);
            return Err(e);
        }
        Ok(true)
    }

    /// Records `ip` in `last_reserved_ip.<set_index>`: in place when it is a regular
    /// file with one link, otherwise replaced with rename(2) (see the module docs).
    fn set_last_reserved(&self, set_index: usize, ip: IpAddr) -> Result<()> {
        let name = format!("{LAST_RESERVED_PREFIX}{set_index}");
        let content = ip.to_string();
        self.store.step("cursor-writing")?;
        if self.rewrite_in_place(&name, content.as_bytes()) {
            return Ok(());
        }
        self.replace(&name, content.as_bytes(), "cursor-temp-written")
    }

    /// Overwrites the existing small state file `name` in place; `false` (nothing
    /// changed, or a failed write the caller's replace can still fix) when it is not a
    /// regular file with exactly one link, or cannot be opened or written.
    fn rewrite_in_place(&self, name: &str, content: &[u8]) -> bool {
        // O_NONBLOCK: a FIFO planted under this name must not block the open.
        let flags = OFlag::O_WRONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        let Ok(fd) = nix::fcntl::openat(&self.store.dir_fd, name, flags, Mode::empty()) else {
            return false;
        };
        let file = File::from(fd);
        let Ok(meta) = file.metadata() else {
            return false;
        };
        if !meta.is_file() || meta.nlink() != 1 || meta.len() > MAX_STATE_FILE as u64 {
            return false;
        }
        // New content first, then the truncate: a crash between them leaves a longer
        // text (the old one's tail), never an empty cursor.
        file.write_all_at(content, 0).is_ok()
            && (meta.len() <= content.len() as u64 || file.set_len(content.len() as u64).is_ok())
    }

    /// Replaces state file `name` with `content` atomically (temp file, rename), passing
    /// failpoint `step` in between.
    pub fn replace(&self, name: &str, content: &[u8], step: &str) -> Result<()> {
        let target = self.path(name);
        let shown = self.store.dir.join(name);
        let temp = self.path(&temp_name("state"));
        write_new(&temp, content).map_err(|e| Error::io("write", &shown, e))?;
        if let Err(e) = self.store.step(step) {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
        std::fs::rename(&temp, &target).map_err(|e| {
            let _ = std::fs::remove_file(&temp);
            Error::io("rename", &shown, e)
        })
    }

    /// The last address reserved in range set `set_index`. Unreadable or unparsable
    /// cursors only cost round-robin order, so they are logged and ignored.
    pub fn last_reserved(&self, set_index: usize) -> Option<IpAddr> {
        match self.read(&format!("{LAST_RESERVED_PREFIX}{set_index}")) {
            Ok(text) => text.and_then(|t| parse_ip(t.trim())),
            Err(e) => {
                eprintln!("Error retrieving last reserved ip: {e}");
                None
            }
        }
    }

    /// Removes reservation `name`; `Ok(false)` if it was already gone.
    pub fn release(&self, name: &str) -> Result<bool> {
        let removed = remove_if_present(&self.path(name), &self.store.dir.join(name))?;
        if removed {
            self.store.step("released")?;
        }
        Ok(removed)
    }

    /// Passes failpoint `host-local/<command>/<step>`.
    pub fn step(&self, step: &str) -> Result<()> {
        self.store.step(step)
    }

    /// Removes `<ip>` if (id, ifname) owns it, exactly or in legacy form.
    pub fn release_if_owned(&self, ip: IpAddr, id: &str, ifname: &str) -> Result<bool> {
        let name = ip.to_string();
        match self.read(&name)? {
            Some(content) if owner_of(&content, id, ifname) != Owner::Other => self.release(&name),
            _ => Ok(false),
        }
    }

    /// Releases every reservation of (id, ifname) found by reading the whole directory;
    /// legacy id-only files are released only when no exact match exists (reference
    /// `ReleaseByID`). Keeps going past failures. Returns how many were released.
    pub fn release_by_owner(&self, id: &str, ifname: &str) -> Result<usize> {
        let entries = self.scan()?;
        let owned = self.store.owned_by(&entries, id, ifname);
        let exact = owned.iter().any(|(_, o)| *o == Owner::Exact);
        let wanted = if exact { Owner::Exact } else { Owner::Legacy };
        let names = owned
            .iter()
            .filter(|(_, o)| *o == wanted)
            .map(|(entry, _)| entry.name.as_str());
        self.release_each(names, Errors::default())
    }

    /// Releases every named reservation, keeping going past failures; `errors` already
    /// met are reported with the new ones. Returns how many were released.
    fn release_each<'n>(
        &self,
        names: impl IntoIterator<Item = &'n str>,
        mut errors: Errors<Error>,
    ) -> Result<usize> {
        let mut released = 0;
        for name in names {
            match self.release(name) {
                Ok(true) => released += 1,
                Ok(false) => {}
                Err(e) => errors.push(e),
            }
        }
        errors.into_result_all(Error::Many).map(|()| released)
    }

    /// Whether (id, ifname), or legacy id, owns any reservation (reference `FindByID`).
    pub fn owns_any(&self, id: &str, ifname: &str) -> Result<bool> {
        let entries = self.scan()?;
        Ok(!self.store.owned_by(&entries, id, ifname).is_empty())
    }

    /// GC: releases every reservation whose owner is not a valid attachment. A legacy
    /// (id-only) reservation stays if any valid attachment has that id. `lock`,
    /// `last_reserved_ip.*` and other non-address names are never touched. Keeps going
    /// past failures and reports them all at the end.
    pub fn gc(&self, valid: &[Attachment]) -> Result<usize> {
        let pairs: HashSet<(&str, &str)> = valid
            .iter()
            .map(|a| (a.container_id.trim(), a.ifname.as_str()))
            .collect();
        let ids: HashSet<&str> = valid.iter().map(|a| a.container_id.trim()).collect();
        let mut errors = Errors::default();
        let mut stale = Vec::new();
        for entry in self.scan()? {
            let content = match self.read(&entry.name) {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let content = content.trim();
            let keep = match content.split_once(LINE_BREAK) {
                Some((id, ifname)) => pairs.contains(&(id, ifname)),
                None => ids.contains(content),
            };
            if !keep {
                stale.push(entry.name);
            }
        }
        self.release_each(stale.iter().map(String::as_str), errors)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh directory under the system temp dir, removed on drop.
    pub(crate) struct TempDir(pub PathBuf);

    impl TempDir {
        pub(crate) fn new(tag: &str) -> Self {
            static N: AtomicU64 = AtomicU64::new(0);
            let path = std::env::temp_dir().join(format!(
                "hl-unit-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn owner_matching_like_the_reference() {
        assert_eq!(owner_of("c1\r\neth0", "c1", "eth0"), Owner::Exact);
        assert_eq!(owner_of(" c1\r\neth0\n", " c1 ", "eth0"), Owner::Exact);
        assert_eq!(owner_of("c1", "c1", "eth0"), Owner::Legacy);
        assert_eq!(owner_of("c1\n", "c1", "eth0"), Owner::Legacy);
        assert_eq!(owner_of("c1\r\neth1", "c1", "eth0"), Owner::Other);
        assert_eq!(owner_of("c10\r\neth0", "c1", "eth0"), Owner::Other);
        assert_eq!(owner_of("", "c1", "eth0"), Owner::Other);
        assert_eq!(reservation_content(" c1 ", "eth0"), "c1\r\neth0");
    }

    #[test]
    fn layout_modes_and_contents() {
        let tmp = TempDir::new("layout");
        let store = Store::open(&tmp.0, "net1").unwrap();
        let mut locked = store.lock(Duration::from_secs(1)).unwrap();
        assert!(locked.reserve(ip("10.0.0.2"), "ctr1", "eth0", 0).unwrap());
        assert!(!locked.reserve(ip("10.0.0.2"), "ctr2", "eth0", 0).unwrap());
        assert!(locked.reserve(ip("fd00::2"), "ctr1", "eth0", 1).unwrap());
        drop(locked);
        let dir = tmp.0.join("net1");
        assert_eq!(
            names(&dir),
            [
                "10.0.0.2",
                "fd00::2",
                "last_reserved_ip.0",
                "last_reserved_ip.1",
                "lock"
            ]
        );
        assert_eq!(
            std::fs::read(dir.join("10.0.0.2")).unwrap(),
            b"ctr1\r\neth0"
        );
        assert_eq!(
            std::fs::read(dir.join("last_reserved_ip.1")).unwrap(),
            b"fd00::2"
        );
        let mode = |n: &str| std::fs::metadata(dir.join(n)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode("10.0.0.2"), 0o600);
        assert_eq!(mode("last_reserved_ip.0"), 0o600);
        assert_eq!(mode("lock") & 0o700, 0o700);
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777 & !0o022,
            0o755
        );
    }

    #[test]
    fn scan_skips_non_addresses_and_cleans_stale_temps() {
        let tmp = TempDir::new("scan");
        let store = Store::open(&tmp.0, "n").unwrap();
        let dir = store.dir().to_path_buf();
        for name in [
            "10.0.0.9",
            "10.0.0.10",
            "fd00::3",
            "last_reserved_ip.0",
            "junk",
        ] {
            std::fs::write(dir.join(name), "x").unwrap();
        }
        std::fs::create_dir(dir.join("10.0.0.77")).unwrap();
        std::fs::write(dir.join(".cni-tmp.1.2.ip"), "c\r\neth0").unwrap();
        let unlocked: Vec<String> = store
            .scan(false)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(unlocked, ["10.0.0.10", "10.0.0.9", "fd00::3"]);
        assert!(dir.join(".cni-tmp.1.2.ip").exists());
        let locked = store.lock(Duration::from_secs(1)).unwrap();
        assert_eq!(locked.scan().unwrap().len(), 3);
        assert!(!dir.join(".cni-tmp.1.2.ip").exists());
    }

    #[test]
    fn release_by_owner_prefers_exact_then_legacy() {
        let tmp = TempDir::new("release");
        let store = Store::open(&tmp.0, "n").unwrap();
        let dir = store.dir().to_path_buf();
        std::fs::write(dir.join("10.0.0.2"), "c1\r\neth0").unwrap();
        std::fs::write(dir.join("10.0.0.3"), "c1").unwrap();
        std::fs::write(dir.join("10.0.0.4"), "c1\r\neth1").unwrap();
        std::fs::write(dir.join("10.0.0.5"), "c2\r\neth0").unwrap();
        let locked = store.lock(Duration::from_secs(1)).unwrap();
        assert!(locked.owns_any("c1", "eth0").unwrap());
        assert_eq!(locked.release_by_owner("c1", "eth0").unwrap(), 1);
        assert!(!dir.join("10.0.0.2").exists() && dir.join("10.0.0.3").exists());
        // No exact match left: the legacy file goes.
        assert_eq!(locked.release_by_owner("c1", "eth0").unwrap(), 1);
        assert!(!dir.join("10.0.0.3").exists());
        assert_eq!(locked.release_by_owner("c1", "eth0").unwrap(), 0);
        assert!(
            !locked
                .release_if_owned(ip("10.0.0.5"), "c1", "eth0")
                .unwrap()
        );
        assert!(
            locked
                .release_if_owned(ip("10.0.0.5"), "c2", "eth0")
                .unwrap()
        );
        assert!(
            !locked
                .release_if_owned(ip("10.0.0.5"), "c2", "eth0")
                .unwrap()
        );
        assert!(dir.join("10.0.0.4").exists());
    }

    #[test]
    fn gc_keeps_valid_and_legacy_ids() {
        let tmp = TempDir::new("gc");
        let store = Store::open(&tmp.0, "n").unwrap();
        let dir = store.dir().to_path_buf();
        std::fs::write(dir.join("10.0.0.2"), "a\r\neth0").unwrap();
        std::fs::write(dir.join("10.0.0.3"), "a\r\neth1").unwrap();
        std::fs::write(dir.join("10.0.0.4"), "b").unwrap();
        std::fs::write(dir.join("10.0.0.5"), "c").unwrap();
        std::fs::write(dir.join("10.0.0.6"), "").unwrap();
        std::fs::write(dir.join("last_reserved_ip.0"), "10.0.0.6").unwrap();
        let locked = store.lock(Duration::from_secs(1)).unwrap();
        let valid = [
            Attachment {
                container_id: "a".into(),
                ifname: "eth0".into(),
            },
            Attachment {
                container_id: "b".into(),
                ifname: "eth0".into(),
            },
        ];
        assert_eq!(locked.gc(&valid).unwrap(), 3);
        drop(locked);
        assert_eq!(
            names(&dir),
            ["10.0.0.2", "10.0.0.4", "last_reserved_ip.0", "lock"]
        );
    }

    #[test]
    fn symlinks_are_not_followed() {
        let tmp = TempDir::new("symlink");
        let outside = tmp.0.join("outside");
        std::fs::write(&outside, "c1\r\neth0").unwrap();
        let store = Store::open(&tmp.0, "n").unwrap();
        let dir = store.dir().to_path_buf();
        std::os::unix::fs::symlink(&outside, dir.join("10.0.0.2")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("last_reserved_ip.0")).unwrap();
        let mut locked = store.lock(Duration::from_secs(1)).unwrap();
        assert!(
            locked.scan().unwrap().is_empty(),
            "a symlink is no reservation"
        );
        assert_eq!(
            locked.read("10.0.0.2").unwrap(),
            None,
            "a symlink is not read"
        );
        assert_eq!(locked.last_reserved(0), None);
        // Publishing replaces the cursor symlink itself, never writes through it.
        assert!(locked.reserve(ip("10.0.0.3"), "c", "eth0", 0).unwrap());
        drop(locked);
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "c1\r\neth0");
        assert!(
            !std::fs::symlink_metadata(dir.join("last_reserved_ip.0"))
                .unwrap()
                .is_symlink()
        );
        // A network directory that is a symlink is refused.
        std::os::unix::fs::symlink(&tmp.0, tmp.0.join("linked")).unwrap();
        assert!(matches!(
            Store::open(&tmp.0, "linked"),
            Err(Error::UnsafePath { .. })
        ));
        for bad in ["..", ".", "a/b", ""] {
            assert!(
                matches!(Store::open(&tmp.0, bad), Err(Error::UnsafePath { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn cursor_is_rewritten_in_place() {
        use std::os::unix::fs::MetadataExt;
        let tmp = TempDir::new("cursor");
        let store = Store::open(&tmp.0, "n").unwrap();
        let cursor = store.dir().join("last_reserved_ip.0");
        let mut locked = store.lock(Duration::from_secs(1)).unwrap();
        assert!(locked.reserve(ip("10.0.0.100"), "a", "eth0", 0).unwrap());
        let inode = std::fs::metadata(&cursor).unwrap().ino();
        // Shorter than what it replaces (the old tail is cut off), then longer.
        for (next, who) in [("10.0.0.2", "b"), ("10.0.0.250", "c")] {
            assert!(locked.reserve(ip(next), who, "eth0", 0).unwrap());
            assert_eq!(std::fs::read(&cursor).unwrap(), next.as_bytes());
            assert_eq!(
                std::fs::metadata(&cursor).unwrap().ino(),
                inode,
                "no new inode per reservation"
            );
        }
        assert_eq!(locked.last_reserved(0), Some(ip("10.0.0.250")));
    }

    #[test]
    fn cursor_sharing_its_inode_is_replaced_not_written_through() {
        use std::os::unix::fs::MetadataExt;
        let tmp = TempDir::new("cursor-link");
        let store = Store::open(&tmp.0, "n").unwrap();
        let dir = store.dir().to_path_buf();
        let other = tmp.0.join("other");
        std::fs::write(&other, "10.0.0.77").unwrap();
        std::fs::hard_link(&other, dir.join("last_reserved_ip.0")).unwrap();
        let mut locked = store.lock(Duration::from_secs(1)).unwrap();
        assert!(locked.reserve(ip("10.0.0.3"), "c", "eth0", 0).unwrap());
        drop(locked);
        assert_eq!(std::fs::read(&other).unwrap(), b"10.0.0.77");
        let cursor = dir.join("last_reserved_ip.0");
        assert_eq!(std::fs::read(&cursor).unwrap(), b"10.0.0.3");
        assert_eq!(std::fs::metadata(&cursor).unwrap().nlink(), 1);
        assert_eq!(std::fs::metadata(&cursor).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn lock_wait_is_bounded() {
        let tmp = TempDir::new("lock");
        let store = Store::open(&tmp.0, "n").unwrap();
        let held = store.lock(Duration::from_secs(1)).unwrap();
        let other = Store::open(&tmp.0, "n").unwrap();
        let err = other.lock(Duration::from_millis(50)).unwrap_err();
        assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
        assert!(matches!(
            other.lock(Duration::ZERO),
            Err(Error::LockTimeout { .. })
        ));
        drop(held);
        // A waiter is woken as soon as the holder lets go.
        let held = store.lock(Duration::from_secs(1)).unwrap();
        let waiter = std::thread::spawn(move || other.lock(Duration::from_secs(60)).map(|_| ()));
        drop(held);
        waiter.join().unwrap().unwrap();
    }

    #[test]
    fn probe_and_temp_cleanup_after_use() {
        let tmp = TempDir::new("probe");
        let store = Store::open(&tmp.0, "n").unwrap();
        store.probe_writable().unwrap();
        let mut locked = store.lock(Duration::from_secs(1)).unwrap();
        assert!(locked.reserve(ip("10.0.0.2"), "c", "eth0", 0).unwrap());
        assert!(locked.reserve(ip("10.0.0.3"), "d", "eth0", 1).unwrap());
        drop(locked);
        assert!(
            names(store.dir())
                .iter()
                .all(|n| !n.starts_with(TEMP_PREFIX))
        );
        use std::os::unix::fs::MetadataExt;
        let links = std::fs::metadata(store.dir().join("10.0.0.2"))
            .unwrap()
            .nlink();
        assert_eq!(links, 1, "each reservation is its own file");
        assert_eq!(
            std::fs::read(store.dir().join("10.0.0.3")).unwrap(),
            b"d\r\neth0"
        );
    }
}
