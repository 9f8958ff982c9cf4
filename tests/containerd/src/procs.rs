//! Processes and cgroups the fixture must find and end: containerd, its shims (by mount
//! namespace) and the sandbox processes (by cgroup parent), which outlive their shims.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

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

/// The mount namespace of `pid` (`mnt:[inode]`), if the process exists.
pub fn mount_ns(pid: u32) -> Option<PathBuf> {
    fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()
}

/// Pids other than `except` that live in mount namespace `ns`.
pub fn in_mount_ns(ns: &Path, except: u32) -> Vec<u32> {
    pids()
        .into_iter()
        .filter(|&pid| pid != except)
        .filter(|&pid| mount_ns(pid).is_some_and(|n| n == ns))
        .collect()
}

/// `/proc/<pid>/cmdline` with spaces, for messages.
pub fn cmdline(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            String::from_utf8_lossy(&b)
                .replace('\0', " ")
                .trim()
                .to_owned()
        })
        .unwrap_or_default()
}

/// Whether `pid` still exists (and is not a zombie waiting for its parent).
pub fn alive(pid: u32) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // "pid (comm) state ...": comm may hold spaces, so look after the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state != "Z")
}

/// Sends `signal` to `pid`, ignoring "no such process".
pub fn signal(pid: u32, signal: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(raw), signal);
    }
}

/// SIGKILL to `pid`, ignoring "no such process".
pub fn kill_pid(pid: u32) {
    signal(pid, Signal::SIGKILL);
}

/// Mount points of every cgroup hierarchy (v1 controllers and the v2 tree).
pub fn cgroup_roots() -> Vec<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            // "... mountpoint options - fstype source superoptions"
            let (before, after) = line.split_once(" - ")?;
            let fstype = after.split_whitespace().next()?;
            (fstype == "cgroup" || fstype == "cgroup2")
                .then(|| before.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .collect()
}

/// `<root>/<parent>` in every hierarchy, and every cgroup below them, deepest first.
pub fn cgroups_under(parent: &str) -> Vec<PathBuf> {
    let relative = parent.trim_start_matches('/');
    let mut found = Vec::new();
    for root in cgroup_roots() {
        let top = root.join(relative);
        if top.is_dir() {
            collect_dirs(&top, &mut found);
        }
    }
    found
}

fn collect_dirs(dir: &Path, found: &mut Vec<PathBuf>) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), found);
            }
        }
    }
    found.push(dir.to_path_buf());
}

/// Pids in the cgroups under `parent`, in any hierarchy.
pub fn cgroup_pids(parent: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = cgroups_under(parent)
        .iter()
        .flat_map(|dir| {
            fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Kills what `find` returns until it returns nothing alive, for at most `limit`.
/// Returns what was still alive at the end.
pub fn kill_until_gone(limit: Duration, find: impl Fn() -> Vec<u32>) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    loop {
        let living: Vec<u32> = find().into_iter().filter(|&p| alive(p)).collect();
        if living.is_empty() || Instant::now() >= deadline {
            return living;
        }
        for &pid in &living {
            kill_pid(pid);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Removes the cgroups under `parent` (deepest first); returns those that remain.
pub fn remove_cgroups(parent: &str) -> Vec<PathBuf> {
    for dir in cgroups_under(parent) {
        // A cgroup dir holds only control files, which rmdir ignores; it fails (and we
        // report it below) while a process is still inside.
        let _ = fs::remove_dir(&dir);
    }
    cgroups_under(parent)
}
