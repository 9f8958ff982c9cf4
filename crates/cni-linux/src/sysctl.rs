//! Kernel parameters under `/proc/sys`. Names are slash-separated paths
//! relative to `/proc/sys` (`net/ipv6/conf/eth0/accept_dad`); dots are kept
//! as they are because interface names may contain them (`cni0.100`).
//! `/proc/sys/net` resolves in the netns of the calling *thread*, hence
//! the `*_in` variants that run on a netns thread.
//!
//! Why `net/<dir>/...` is opened relative to per-thread directory handles rather
//! than by full path: the dentry cache holds one `/proc/sys/net` entry, and one
//! `/proc/sys/net/ipv4` (`ipv6`, `core`, ...) entry, per network namespace, all with
//! the same parent and name, so they share one hash chain and every path walk
//! through them compares against each namespace's entry in turn (under a global
//! lock). With a few hundred pods on a node such a walk costs tens to hundreds of
//! microseconds, and an ADD does several. Below `net/<dir>` the entries belong to
//! one namespace, so a walk from a handle on it costs the same with 10 pods or 1000.
//! See [`NetDirs`] for why a handle is never used for another namespace.

use std::cell::RefCell;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{AtFlags, OFlag, open, openat};
use nix::sys::stat::{Mode, fstatat};

use crate::error::{Error, Result};
use crate::netns::NetNs;

const PROC_SYS: &str = "/proc/sys";

/// The calling thread's namespace directory: its `net` entry always names the netns
/// the thread is in *now* (the link is resolved at each lookup), and a lookup relative
/// to a handle on the directory costs a fraction of a walk of the whole path.
const THREAD_NS_DIR: &str = "/proc/thread-self/ns";

/// Handles on `/proc/sys/net` and `/proc/sys/net/<dir>` opened by one thread, and
/// the network namespace they were opened in (device and inode of its nsfs file).
///
/// Sound reuse: every read or write first compares the thread's current namespace
/// with `netns`, so a thread that moved (setns, unshare) opens new handles. Should
/// `netns` have died meanwhile and its inode number been reused by the namespace
/// the thread is in now, the handles are those of the dead namespace, whose
/// sysctl tables are unregistered: every lookup through them fails (ENOENT) and
/// never reaches another namespace's file, and a failure drops the handles and
/// falls back to the full path. The handles do not keep the namespace alive: they
/// pin only sysctl directory inodes, not the netns.
struct NetDirs {
    netns: (u64, u64),
    net: OwnedFd,
    dirs: Vec<(String, OwnedFd)>,
}

impl NetDirs {
    /// Opens `<rest>` below `net/<dir>`; `None` if it cannot be opened.
    fn open(&mut self, dir: &str, rest: &str, flags: OFlag) -> Option<File> {
        let position = match self.dirs.iter().position(|(d, _)| d == dir) {
            Some(position) => position,
            None => {
                let fd = openat(&self.net, dir, DIR_FLAGS, Mode::empty()).ok()?;
                self.dirs.push((dir.to_owned(), fd));
                self.dirs.len() - 1
            }
        };
        openat(
            &self.dirs[position].1,
            rest,
            flags | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()
        .map(File::from)
    }
}

/// One thread's handles: its namespace directory, and the sysctl directories of the
/// namespace it was last seen in.
#[derive(Default)]
struct ThreadDirs {
    ns_dir: Option<OwnedFd>,
    sysctl: Option<NetDirs>,
}

thread_local! {
    static THREAD_DIRS: RefCell<ThreadDirs> = RefCell::new(ThreadDirs::default());
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_CLOEXEC);

/// Runs `f` on this thread's handles for the netns it is in now. `None` when they
/// cannot be had or `f` gives up; then the handles are dropped and the caller uses
/// the full path (which also reports errors as before: missing, or handles of a
/// namespace that is gone).
fn with_dirs<T>(f: impl FnOnce(&mut NetDirs) -> Option<T>) -> Option<T> {
    THREAD_DIRS.with(|cell| {
        let mut cache = cell.borrow_mut();
        if cache.ns_dir.is_none() {
            let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
            cache.ns_dir = Some(open(THREAD_NS_DIR, flags, Mode::empty()).ok()?);
        }
        let ns_dir = cache.ns_dir.as_ref()?;
        let st = fstatat(ns_dir, "net", AtFlags::empty()).ok()?;
        #[allow(clippy::useless_conversion)] // field widths differ between targets
        let netns = (u64::from(st.st_dev), u64::from(st.st_ino));
        if cache.sysctl.as_ref().is_none_or(|d| d.netns != netns) {
            let net = open(&Path::new(PROC_SYS).join("net"), DIR_FLAGS, Mode::empty()).ok();
            cache.sysctl = net.map(|net| NetDirs {
                netns,
                net,
                dirs: Vec::new(),
            });
        }
        let outcome = f(cache.sysctl.as_mut()?);
        if outcome.is_none() {
            cache.sysctl = None;
        }
        outcome
    })
}

/// Splits `net/<dir>/<rest>` into (`<dir>`, `<rest>`).
fn split_net(name: &str) -> Option<(&str, &str)> {
    let (dir, rest) = name.strip_prefix("net/")?.split_once('/')?;
    (!dir.is_empty() && !rest.is_empty()).then_some((dir, rest))
}

/// Reads a sysctl of the calling thread's netns, without the trailing newline.
pub fn read(name: &str) -> Result<String> {
    let path = full_path(name)?;
    let cached = split_net(name)
        .and_then(|(dir, rest)| with_dirs(|dirs| dirs.open(dir, rest, OFlag::O_RDONLY)));
    match cached {
        Some(file) => read_file(file, &path),
        None => read_path(&path),
    }
}

/// Sets a sysctl of the calling thread's netns, writing only if the value differs.
///
/// Reading first lets a read-only `/proc/sys` pass when the administrator
/// has already set the value.
pub fn write(name: &str, value: &str) -> Result<()> {
    let path = full_path(name)?;
    let write_error = |source| Error::SysctlWrite {
        path: path.clone(),
        value: value.to_owned(),
        source,
    };
    if let Some((dir, rest)) = split_net(name) {
        let cached = with_dirs(|dirs| {
            let current = read_file(dirs.open(dir, rest, OFlag::O_RDONLY)?, &path);
            if current.is_ok_and(|current| current == value) {
                return Some(Ok(()));
            }
            let mut file = dirs.open(dir, rest, OFlag::O_WRONLY)?;
            Some(file.write_all(value.as_bytes()).map_err(write_error))
        });
        if let Some(outcome) = cached {
            return outcome;
        }
    }
    if let Ok(current) = read_path(&path) {
        if current == value {
            return Ok(());
        }
    }
    fs::write(&path, value).map_err(write_error)
}

/// Reads a sysctl inside `netns`.
pub fn read_in(netns: &NetNs, name: &str) -> Result<String> {
    netns.run(|| read(name))?
}

/// Sets a sysctl inside `netns`, writing only if the value differs.
pub fn write_in(netns: &NetNs, name: &str, value: &str) -> Result<()> {
    netns.run(|| write(name, value))?
}

fn read_path(path: &Path) -> Result<String> {
    let file = File::open(path).map_err(|source| Error::SysctlRead {
        path: path.to_path_buf(),
        source,
    })?;
    read_file(file, path)
}

fn read_file(mut file: File, path: &Path) -> Result<String> {
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|source: io::Error| Error::SysctlRead {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(text.trim_end_matches('\n').to_owned())
}

/// Maps a relative sysctl name to its file, refusing anything that could
/// leave `/proc/sys` (names are built from config-supplied interface names).
fn full_path(name: &str) -> Result<PathBuf> {
    let rel = Path::new(name);
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    if name.is_empty() || !plain {
        return Err(Error::InvalidSysctl {
            name: name.to_owned(),
        });
    }
    Ok(Path::new(PROC_SYS).join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_below_proc_sys_verbatim() {
        assert_eq!(
            full_path("net/ipv4/conf/cni0.100/arp_notify").unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/conf/cni0.100/arp_notify")
        );
    }

    #[test]
    fn names_that_escape_are_rejected() {
        for bad in ["", "/etc/passwd", "net/../../etc", "../x", "./net"] {
            assert!(
                matches!(full_path(bad), Err(Error::InvalidSysctl { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn only_names_below_a_net_directory_use_a_handle() {
        assert_eq!(
            split_net("net/ipv6/conf/eth0/accept_dad"),
            Some(("ipv6", "conf/eth0/accept_dad"))
        );
        assert_eq!(
            split_net("net/ipv4/ip_forward"),
            Some(("ipv4", "ip_forward"))
        );
        for other in [
            "kernel/ostype",
            "net/ipv4",
            "net//ip_forward",
            "net/ipv4/",
            "netx/a/b",
        ] {
            assert_eq!(split_net(other), None, "{other:?}");
        }
    }

    #[test]
    fn net_sysctls_are_read_through_this_threads_handles() {
        // On a thread of its own, so the cache starts empty.
        std::thread::spawn(|| {
            let direct = read_path(&full_path("net/ipv4/ip_forward").unwrap()).unwrap();
            assert_eq!(read("net/ipv4/ip_forward").unwrap(), direct);
            THREAD_DIRS.with(|cell| {
                let cache = cell.borrow();
                let handles = cache.sysctl.as_ref().expect("handles opened");
                let st = nix::sys::stat::stat("/proc/thread-self/ns/net").unwrap();
                #[allow(clippy::useless_conversion)] // field widths differ between targets
                let netns = (u64::from(st.st_dev), u64::from(st.st_ino));
                assert_eq!(handles.netns, netns);
                let dirs: Vec<&str> = handles.dirs.iter().map(|(d, _)| d.as_str()).collect();
                assert_eq!(dirs, ["ipv4"]);
            });
            // A name that does not exist drops the handles and reports the full path.
            let err = read("net/ipv4/conf/no-such-if0/arp_notify").unwrap_err();
            assert!(
                err.to_string()
                    .contains("/proc/sys/net/ipv4/conf/no-such-if0"),
                "{err}"
            );
            THREAD_DIRS.with(|cell| assert!(cell.borrow().sysctl.is_none()));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn reads_a_global_sysctl() {
        // Readable by anyone, present on every Linux kernel.
        let value = read("kernel/ostype").unwrap();
        assert_eq!(value, "Linux");
    }

    #[test]
    fn read_of_missing_sysctl_names_the_path() {
        let err = read("net/ipv4/conf/no-such-if0/arp_notify").unwrap_err();
        assert!(err.to_string().contains("no-such-if0"), "{err}");
    }
}
