//! The README's one-command demo (`tests/demo.sh`), run as a new user runs it: it must
//! succeed and leave no namespace, link or state file behind.
//!
//! The script builds the binaries itself (`cargo build`, a no-op once the harness has
//! built them) and makes its own host and pod namespaces; its temporary directory goes
//! under a `TMPDIR` this test owns, so "nothing left" is checked exactly.

use std::collections::BTreeSet;
use std::process::Command;

use cni_blackbox::{TempDir, bin_dir, require_root, workspace_root};

/// Names of the named network namespaces on the machine.
fn netns_names() -> BTreeSet<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip netns list: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn demo_runs_and_leaves_nothing_behind() {
    if !require_root() {
        return;
    }
    // Build through the harness first, so a compile error is reported as such.
    let _ = bin_dir();
    let tmp = TempDir::new("cnibb-demo-tmp");
    let before = netns_names();
    let script = workspace_root().join("tests/demo.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("TMPDIR", tmp.path())
        // Not a sudo session: build as whoever runs the tests.
        .env_remove("SUDO_USER")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}",
        script.display(),
        out.status
    );
    let pings = stdout
        .lines()
        .filter(|l| l.contains(" -> ") && l.ends_with(": ok"))
        .count();
    assert_eq!(
        pings, 4,
        "pod-to-pod and gateway pings, v4 and v6:\n{stdout}"
    );
    for step in [
        "\"cniVersion\": \"1.1.0\"",
        "CHECK ok",
        "STATUS ok",
        "still attached",
        "no cache entry and no IP reservation left",
    ] {
        assert!(stdout.contains(step), "no {step:?} in:\n{stdout}");
    }

    let left: Vec<String> = netns_names()
        .difference(&before)
        .filter(|n| n.starts_with("cnidemo-"))
        .cloned()
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    let files: Vec<_> = std::fs::read_dir(tmp.path())
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(files.is_empty(), "temporary files left: {files:?}");
    let bridge_in_root = Command::new("ip")
        .args(["link", "show", "cnidemo0"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        !bridge_in_root,
        "the demo bridge reached the machine's netns"
    );
}
