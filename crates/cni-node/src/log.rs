//! The agent's log: one line per event on stderr, where the container runtime collects
//! it (`kubectl logs`): an RFC 3339 UTC time, a level, the message.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Turns debug lines on.
pub fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

fn line(level: &str, message: &str) {
    let text = format!(
        "{} {level:<5} {message}\n",
        cni_protocol::log::rfc3339_utc(SystemTime::now())
    );
    // One write per line, so lines from two threads never interleave.
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Something the operator wants to know happened.
pub fn info(message: &str) {
    line("info", message);
}

/// Something is wrong but the agent carries on.
pub fn warn(message: &str) {
    line("warn", message);
}

/// Something failed.
pub fn error(message: &str) {
    line("error", message);
}

/// Detail, with `--verbose` only.
pub fn debug(message: &str) {
    if VERBOSE.load(Ordering::Relaxed) {
        line("debug", message);
    }
}
