//! Harness shared by the root test binaries: every test body runs on a thread
//! inside a fresh network namespace, and the tools it runs (iptables, nft)
//! inherit that namespace, so the machine's own rules are never touched.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::Write;
use std::process::{Command, Stdio};

use ipnetwork::IpNetwork;
use nix::sched::{CloneFlags, unshare};

/// True when we may run; under `CI=true` a missing privilege is a failure.
pub fn privileged() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "root tests need root (CI=true forbids skipping)"
    );
    eprintln!("skipping: root tests need root");
    false
}

/// Runs `f` on a thread inside a private network namespace.
pub fn in_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// PATH for the tools the tests call: the test process's own first (so a
/// child run with the legacy variant verifies with the legacy tools, as the
/// library under test finds them there too), then the sbin directories.
pub fn tool_path() -> String {
    let inherited = std::env::var("PATH").unwrap_or_default();
    format!("{inherited}:/usr/sbin:/usr/bin:/sbin:/bin")
}

/// Runs a tool and returns its stdout; fails the test if it fails.
pub fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("PATH", tool_path())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a tool with `input` on its stdin; fails the test if it fails.
pub fn feed(program: &str, args: &[&str], input: &str) {
    let mut child = Command::new(program)
        .args(args)
        .env("PATH", tool_path())
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{input}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The rule and user-chain lines of the nat table.
pub fn nat_rules(save: &str) -> Vec<String> {
    sh(save, &["-t", "nat"])
        .lines()
        .filter(|l| l.starts_with("-A") || l.starts_with(":CNI-"))
        .map(str::to_owned)
        .collect()
}

pub fn ruleset() -> String {
    sh("nft", &["list", "ruleset"])
}

pub fn ips(list: &[&str]) -> Vec<IpNetwork> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}
