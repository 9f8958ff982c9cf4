//! The end-of-run check of the test command (`tests/host-state.sh`) catches what a test
//! could leave behind: it is run in a throwaway netns (and a private `/run/netns`, so
//! other tests' namespaces come and go unseen) over directories of its own, and must
//! report a stray veth, an address, a firewall table and a file, and pass again once
//! they are gone.

use std::path::Path;
use std::process::{Command, Output};

use cni_blackbox::{Netns, TempDir, require_root, workspace_root};

/// `tests/host-state.sh <verb> <file>` inside `ns`, with `dirs` as the watched
/// directories and an empty private `/run/netns`.
fn host_state(ns: &Netns, verb: &str, file: &Path, dirs: &Path) -> Output {
    let script = workspace_root().join("tests/host-state.sh");
    Command::new("ip")
        .args(["netns", "exec", ns.name(), "unshare", "--mount", "sh", "-c"])
        .arg(r#"mount -t tmpfs none /run/netns && exec "$0" "$1" "$2""#)
        .arg(&script)
        .arg(verb)
        .arg(file)
        .env("HOST_STATE_DIRS", dirs)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()))
}

#[test]
fn the_end_of_run_check_reports_what_a_test_left() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("cnibb-hoststate");
    let dir = TempDir::new("cnibb-hoststate");
    let watched = dir.path().join("watched");
    std::fs::create_dir(&watched).expect("mkdir watched");
    let snapshot = dir.path().join("snapshot");
    let taken = host_state(&ns, "snapshot", &snapshot, &watched);
    assert!(taken.status.success(), "{taken:?}");
    let same = host_state(&ns, "compare", &snapshot, &watched);
    assert!(same.status.success(), "nothing changed yet: {same:?}");

    // What a careless test might leave.
    ns.exec_ok(&[
        "ip", "link", "add", "stray0", "type", "veth", "peer", "name", "stray1",
    ]);
    ns.exec_ok(&["ip", "addr", "add", "10.99.99.1/24", "dev", "stray0"]);
    ns.exec_ok(&["nft", "add", "table", "inet", "leftover"]);
    std::fs::write(watched.join("leftover.conflist"), "{}").expect("write leftover");
    let changed = host_state(&ns, "compare", &snapshot, &watched);
    let report = String::from_utf8_lossy(&changed.stdout);
    assert_eq!(changed.status.code(), Some(1), "{changed:?}");
    for needle in [
        "+stray0",
        "+stray1",
        "10.99.99.1/24",
        "+table inet leftover",
        "leftover.conflist",
    ] {
        assert!(
            report.contains(needle),
            "{needle:?} not reported:\n{report}"
        );
    }

    ns.exec_ok(&["ip", "link", "del", "stray0"]);
    ns.exec_ok(&["nft", "delete", "table", "inet", "leftover"]);
    std::fs::remove_file(watched.join("leftover.conflist")).expect("remove leftover");
    let again = host_state(&ns, "compare", &snapshot, &watched);
    assert!(
        again.status.success(),
        "all gone, yet: {}",
        String::from_utf8_lossy(&again.stdout)
    );
}
