//! Pieces of a private Podman installation shared by the suites that run Podman (the CNI
//! backend suite and the image/installer suite): the mount-namespace holder that gives
//! Podman its own /var/lib and /run, the ulimits it may ask for, the cgroup dirs it may
//! create, and the process-tree walk their cleanup uses.

use std::fs;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::require_root;

/// Cgroup dirs the cgroupfs manager creates; suites remove them at the end if they were
/// not there before.
pub const CGROUP_PARENTS: [&str; 2] = ["libpod_parent/conmon", "libpod_parent"];

/// A cleanup problem, reported on stderr (cleanup never panics).
pub fn warn(message: &str) {
    let _ = writeln!(std::io::stderr(), "warning: {message}");
}

/// Writes a file or panics naming it.
pub fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Starts `sleep infinity` in a new mount namespace (propagation slave: nothing mounted
/// in it reaches the machine) where /var/lib is `varlib` and /run is an empty tmpfs
/// named `run_label`. Returns once the mounts are in place.
pub fn spawn_holder(varlib: &Path, run_label: &str) -> Child {
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "slave", "--", "sh", "-c"])
        .arg(
            "mount --bind \"$1\" /var/lib && \
             mount -t tmpfs -o mode=0755,size=64m \"$2\" /run && \
             echo ready && exec sleep infinity",
        )
        .arg("sh")
        .arg(varlib)
        .arg(run_label)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run unshare (util-linux)");
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = BufReader::new(stdout).read_line(&mut line);
    }
    if line.trim() != "ready" {
        let _ = child.kill();
        let out = child.wait_with_output().ok();
        panic!(
            "private mount namespace not set up: {:?}",
            out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        );
    }
    child
}

/// Hard limits of open files and processes (from /proc/self/limits), which podman's
/// default ulimits must not exceed.
pub fn hard_limits() -> (u64, u64) {
    let text = fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let hard = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l[name.len()..].split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(u64::MAX)
    };
    (hard("Max open files"), hard("Max processes"))
}

/// Cgroup dirs of [`CGROUP_PARENTS`] (in every v1 controller, or the v2 root) that do
/// not exist yet.
pub fn missing_cgroup_dirs() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut roots = vec![base.to_path_buf()];
    if let Ok(entries) = fs::read_dir(base) {
        roots.extend(entries.filter_map(Result::ok).map(|e| e.path()));
    }
    roots
        .iter()
        .flat_map(|root| CGROUP_PARENTS.iter().map(move |p| root.join(p)))
        .filter(|p| !p.exists())
        .collect()
}

/// Every pid in /proc.
pub fn pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Every descendant of `parents` (the containers conmon started).
pub fn children_of(parents: &[u32]) -> Vec<u32> {
    let mut found: Vec<u32> = Vec::new();
    let mut frontier: Vec<u32> = parents.to_vec();
    while !frontier.is_empty() {
        let next: Vec<u32> = pids()
            .into_iter()
            .filter(|pid| {
                let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                // "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    .is_some_and(|ppid| frontier.contains(&ppid))
            })
            .filter(|pid| !found.contains(pid))
            .collect();
        found.extend(&next);
        frontier = next;
    }
    found
}

/// A process's command line, for messages.
pub fn cmdline(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Repeats `probe` until it returns `Some`, for at most `limit` (a bound on waiting, not
/// a measurement).
pub fn eventually<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether `podman` is installed (tests/run-all.sh installs it).
pub fn podman_available() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        Command::new("podman")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// For a test that runs Podman: false (skip) without root outside CI; panics when
/// Podman is missing.
#[track_caller]
pub fn require_podman() -> bool {
    if !require_root() {
        return false;
    }
    assert!(
        podman_available(),
        "podman is not installed; tests/run-all.sh installs it (apt-get install podman runc busybox-static)"
    );
    true
}
