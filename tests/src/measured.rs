//! Figures that tests measure (a convergence, a latency, a gap, a process's peak memory),
//! recorded so that a green run shows them.
//!
//! Tests assert only generous "it happened" bounds; what they measured is worth seeing
//! all the same. [`record`] prints one `measured: <what> = <value> <unit>` line (shown by
//! `cargo test` only for a failing test or with `--nocapture`) and, when
//! `CNI_RS_MEASURED` names a file, appends `<test binary>\t<what>\t<value>\t<unit>` to
//! it; the test command points it at a file and prints the lines at the end of the run.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::time::Duration;

/// Records that a test measured `value` (in `unit`) for `what` (words that say what it
/// is, e.g. "NetworkPolicy matrix converged after a policy change").
pub fn record(what: &str, value: f64, unit: &str) {
    println!("measured: {what} = {value:.3} {unit}");
    let Some(path) = std::env::var_os("CNI_RS_MEASURED") else {
        return;
    };
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| {
            s.rsplit_once('-')
                .map_or(s.clone(), |(name, _hash)| name.to_owned())
        })
        .unwrap_or_default();
    // One write per line with O_APPEND: lines of tests running at once do not interleave.
    let line = format!(
        "{binary}\t{}\t{value:.3}\t{unit}\n",
        what.replace(['\t', '\n'], " ")
    );
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(line.as_bytes());
    }
}

/// [`record`] for a duration, in milliseconds.
pub fn record_duration(what: &str, took: Duration) {
    record(what, took.as_secs_f64() * 1000.0, "ms");
}

/// A `kB` field of `/proc/<pid>/status` (`"VmHWM:"` for the peak RSS, `"VmRSS:"`,
/// `"Threads:"`), or 0 when the process or the field is gone.
pub fn process_status(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The peak resident set of a process in KiB (`VmHWM`), or 0 when it is gone.
pub fn peak_rss_kib(pid: u32) -> u64 {
    process_status(pid, "VmHWM:")
}
