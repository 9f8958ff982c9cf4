//! Privilege gate for the root-only tests.
//!
//! Locally a developer without root should still be able to run `cargo test` and get the
//! unit tests, so root tests skip with a message. Under `CI=true` a skip would turn a
//! broken CI machine into a green run, so a missing privilege is a failure there.

use std::io::Write as _;

/// True when the environment says we run in CI (`CI=true`, also `1`, any case).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Returns true when the test may go on (we are root).
///
/// Not root: under CI this panics; otherwise it prints a skip message naming the test and
/// returns false, and the test should `return`.
pub fn require_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_owned();
    assert!(
        !in_ci(),
        "{test}: needs root (network namespaces), and CI=true forbids skipping; \
         run tests/run-all.sh as root"
    );
    // Straight to the stderr handle, not eprintln!: the test harness captures the macros'
    // output of passing tests, and a skip must stay visible.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: needs root (network namespaces); run as root or via tests/run-all.sh"
    );
    false
}
