//! Throwaway network namespaces, made with `ip netns add` and removed on drop.
//!
//! Named namespaces (rather than unshare'd ones held by a process) are what runtimes and
//! the reference test suites use: they give a stable path for `CNI_NETNS`, and `ip netns
//! exec` lets any command (the plugin, `ip`, `cat /proc/sys/...`) run inside them.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, PoisonError};

use crate::names::unique_name;

/// Where `ip netns add` bind-mounts namespaces (`NETNS_RUN_DIR`).
pub const NETNS_RUN_DIR: &str = "/var/run/netns";

static ADD_LOCK: Mutex<()> = Mutex::new(());

/// A named network namespace that is deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
    deleted: bool,
}

impl Netns {
    /// Creates `<prefix>-<pid>-<n>`. Panics when `ip netns add` fails (no root, no
    /// iproute2): a test that asked for a namespace cannot do anything useful without it.
    pub fn new(prefix: &str) -> Self {
        let name = unique_name(prefix);
        let out = {
            // The first `ip netns add` on a machine turns /var/run/netns into a shared
            // mount of itself; several doing that at once (parallel tests on a fresh CI
            // machine) can stack mounts and hide namespaces made a moment earlier (Debian
            // bug #949235; newer iproute2 takes a lock, serializing here costs nothing).
            let _serialized = ADD_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
            run(Command::new("ip").args(["netns", "add", &name]))
        };
        assert!(
            out.status.success(),
            "ip netns add {name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let path = Path::new(NETNS_RUN_DIR).join(&name);
        Self {
            name,
            path,
            deleted: false,
        }
    }

    /// The name given to `ip netns`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/var/run/netns/<name>`: what a runtime passes as `CNI_NETNS`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// [`Self::path`] as text, for env vars and expected JSON (names are ASCII).
    pub fn path_str(&self) -> &str {
        self.path.to_str().unwrap_or_default()
    }

    /// Runs `argv` inside the namespace (`ip netns exec <name> argv...`) with the
    /// caller's environment, and returns its output whatever the exit status.
    pub fn exec(&self, argv: &[&str]) -> Output {
        assert!(!argv.is_empty(), "Netns::exec needs a command");
        run(Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(argv))
    }

    /// Like [`Self::exec`] but panics unless the command exits 0; returns its stdout.
    pub fn exec_ok(&self, argv: &[&str]) -> String {
        let out = self.exec(argv);
        assert!(
            out.status.success(),
            "in netns {}: {argv:?} failed ({}): {}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Deletes the namespace now, for tests of "the netns is already gone".
    /// Panics if that fails, since the test would then not test what it says.
    pub fn delete(mut self) {
        let out = run(Command::new("ip").args(["netns", "delete", &self.name]));
        assert!(
            out.status.success(),
            "ip netns delete {} failed: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        self.deleted = true;
    }
}

impl Drop for Netns {
    /// Best effort and silent on success; never panics (a panic while unwinding from a
    /// failed assertion would abort the whole test binary).
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let result = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .output();
        let problem = match result {
            Ok(out) if out.status.success() => return,
            Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            Err(e) => e.to_string(),
        };
        let _ = writeln!(
            std::io::stderr(),
            "warning: could not delete netns {}: {problem}",
            self.name
        );
    }
}

/// Runs a helper command, turning "could not start it" into a panic that says which.
pub(crate) fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}
