//! Network namespace handles. The only place in the crate that calls
//! `setns`: work that must happen inside a netns (creating a netlink socket,
//! writing a sysctl) runs on a short-lived thread, so no long-lived thread
//! ever changes namespace.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::fcntl::FlockArg;
use nix::sched::{CloneFlags, setns};
use nix::sys::stat::fstat;
use nix::sys::statfs::{NSFS_MAGIC, fstatfs};

use crate::error::{Error, Result};

/// The calling thread's own netns. `/proc/self` would name the thread-group
/// leader's namespace, which differs once a thread has unshared or setns'ed.
const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// An open network namespace; the namespace stays alive while this exists.
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
}

impl NetNs {
    /// Opens the netns at `path` (e.g. `/var/run/netns/x` or `/proc/<pid>/ns/net`).
    ///
    /// Opened without blocking (a FIFO given as a netns would block a plain open until
    /// someone writes to it) and checked on the descriptor, which is then used for all
    /// the work: a path swapped after the check cannot redirect it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = path.as_ref().to_path_buf();
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
            .open(&path);
        let file = match opened {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::NetnsNotFound { path });
            }
            Err(source) => return Err(Error::NetnsOpen { path, source }),
        };
        if !is_netns_file(&file, &path)? {
            return Err(Error::NotNetns { path });
        }
        Ok(Self { file, path })
    }

    /// Opens the netns at `path` for a container: like [`NetNs::open`], and refused
    /// with [`Error::SameNetns`] when it is the calling thread's own namespace (unless
    /// `allow_own`), judged on the opened descriptor.
    pub fn open_container(path: impl AsRef<Path>, allow_own: bool) -> Result<Self> {
        let ns = Self::open(path)?;
        if !allow_own && ns.is_current()? {
            return Err(Error::SameNetns {
                path: ns.path.clone(),
            });
        }
        Ok(ns)
    }

    /// Opens the netns of the calling thread.
    ///
    /// Its [`path`](Self::path) is `/proc/thread-self/ns/net`, which names
    /// whatever netns the *reading* thread is in: use the handle, not the path.
    pub fn current() -> Result<Self> {
        Self::open(THREAD_NETNS)
    }

    /// The path this netns was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a fresh thread that has entered this netns, and returns its result.
    ///
    /// The thread ends with `f`, so the namespace switch never leaks to other
    /// work. A panic in `f` is propagated to the caller.
    pub fn run<F, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        std::thread::scope(|scope| {
            let worker = std::thread::Builder::new()
                .name("netns".into())
                .spawn_scoped(scope, || {
                    setns(&self.file, CloneFlags::CLONE_NEWNET).map_err(|source| Error::Setns {
                        path: self.path.clone(),
                        source,
                    })?;
                    Ok(f())
                })
                .map_err(|source| Error::NetnsThread {
                    path: self.path.clone(),
                    source,
                })?;
            match worker.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Takes an exclusive advisory lock on the namespace itself (flock(2) on its nsfs
    /// inode, which every opener of the namespace shares), held until the guard drops.
    /// It serializes read-modify-write steps of concurrent plugin runs on shared state
    /// of the namespace without creating a lock file anywhere. The handle becomes the
    /// guard: a lock belongs to the open file, which must be the guard's alone.
    pub fn lock(self) -> Result<NetNsLock> {
        // The plain call rather than `Flock`: the guard only has to close the file,
        // which releases the lock, and the plugins' binary has a size budget.
        #[allow(deprecated)]
        let locked = nix::fcntl::flock(self.file.as_raw_fd(), FlockArg::LockExclusive);
        match locked {
            Ok(()) => Ok(NetNsLock { _file: self.file }),
            Err(source) => Err(Error::NetnsLock {
                path: self.path,
                source,
            }),
        }
    }

    /// True when the calling thread is in this netns.
    pub fn is_current(&self) -> Result<bool> {
        self.same_as(&Self::current()?)
    }

    /// True when both handles refer to the same namespace.
    pub fn same_as(&self, other: &NetNs) -> Result<bool> {
        Ok(self.identity()? == other.identity()?)
    }

    /// Namespaces are equal iff their nsfs inodes are (device, inode) equal.
    fn identity(&self) -> Result<(u64, u64)> {
        let st = fstat(&self.file).map_err(|source| Error::NetnsStat {
            path: self.path.clone(),
            source,
        })?;
        #[allow(clippy::useless_conversion)] // field widths differ between targets
        Ok((u64::from(st.st_dev), u64::from(st.st_ino)))
    }
}

/// An exclusive lock on a network namespace, from [`NetNs::lock`]; released on drop.
pub struct NetNsLock {
    _file: File,
}

impl std::fmt::Debug for NetNsLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NetNsLock")
    }
}

/// The CNI error for a failed open of a container's netns at `path`: the plugin's
/// own netns is code 8 with the reference's words, anything else says what could not
/// be opened and why.
pub fn container_netns_error(e: Error, path: &str) -> cni_protocol::CniError {
    use cni_protocol::Context as _;
    match e {
        Error::SameNetns { .. } => {
            cni_protocol::CniError::new(cni_protocol::ErrorCode::INVALID_NETNS, e.to_string())
        }
        e => match Err::<(), _>(e).with_context(|| format!("failed to open netns {path:?}")) {
            Err(cni) => cni,
            Ok(()) => cni_protocol::CniError::internal(format!("failed to open netns {path:?}")),
        },
    }
}

/// A netns file lives on nsfs. Other namespace types share nsfs; opened through
/// `/proc/<pid>/ns/*` the fd links to `<type>:[<inode>]`, which tells them apart,
/// while a bind mount (`/var/run/netns/x`) links to its path, and `setns` with
/// CLONE_NEWNET refuses any other type later.
fn is_netns_file(file: &File, path: &Path) -> Result<bool> {
    let fs = fstatfs(file).map_err(|source| Error::NetnsStat {
        path: path.to_path_buf(),
        source,
    })?;
    if fs.filesystem_type() != NSFS_MAGIC {
        return Ok(false);
    }
    let fd_link = format!("/proc/thread-self/fd/{}", file.as_raw_fd());
    let target = std::fs::read_link(fd_link).map_err(|source| Error::NetnsOpen {
        path: path.to_path_buf(),
        source,
    })?;
    let target = target.to_string_lossy();
    let names_other_type = !target.starts_with('/') && !target.starts_with("net:[");
    Ok(!names_other_type)
}

impl AsFd for NetNs {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl AsRawFd for NetNs {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
