//! When a kernel function returned, from a return probe (a kprobe event of tracefs) in a
//! tracing instance of its own, on `CLOCK_MONOTONIC`: a benchmark can time a change by
//! when the kernel finished making it, where a poll that reads the result back would
//! add up to one whole read to the figure.
//!
//! Needs root and a kernel with kprobe events (Debian's stock kernel has them); the
//! probe and the instance are removed when the value is dropped.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

/// Where tracefs is, or is mounted.
const TRACEFS: &str = "/sys/kernel/tracing";

/// The returns of one kernel function.
#[derive(Debug)]
pub struct ReturnProbe {
    /// The instance's directory.
    instance: PathBuf,
    /// `group/event` of the probe.
    event: String,
}

impl ReturnProbe {
    /// A return probe on `function` (a function of the kernel or of a loaded module);
    /// the error says why there is none (no tracefs, no kprobe events, no such
    /// function).
    pub fn on(function: &str) -> Result<Self, String> {
        let root = Path::new(TRACEFS);
        if !root.join("kprobe_events").exists() {
            let mounted = Command::new("mount")
                .args(["-t", "tracefs", "nodev", TRACEFS])
                .status()
                .map_err(|e| format!("mount tracefs: {e}"))?;
            if !mounted.success() || !root.join("kprobe_events").exists() {
                return Err(format!("no kprobe events in {TRACEFS}"));
            }
        }
        let group = format!("cni_bench_{}", std::process::id());
        let name = format!("{function}_return");
        append(
            &root.join("kprobe_events"),
            &format!("r:{group}/{name} {function}\n"),
        )?;
        let probe = Self {
            instance: root.join("instances").join(&group),
            event: format!("{group}/{name}"),
        };
        std::fs::create_dir(&probe.instance)
            .map_err(|e| format!("{}: {e}", probe.instance.display()))?;
        // The clock `Instant` reads (the default, "local", is another one).
        write(&probe.instance.join("trace_clock"), "mono")?;
        write(
            &probe
                .instance
                .join("events")
                .join(&probe.event)
                .join("enable"),
            "1",
        )?;
        Ok(probe)
    }

    /// Each return recorded so far, in order, as a `CLOCK_MONOTONIC` time.
    pub fn returns(&self) -> Result<Vec<Duration>, String> {
        let path = self.instance.join("trace");
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (_, name) = self.event.split_once('/').unwrap_or(("", &self.event));
        Ok(returns_in(&text, name))
    }
}

impl Drop for ReturnProbe {
    fn drop(&mut self) {
        let enable = self
            .instance
            .join("events")
            .join(&self.event)
            .join("enable");
        let _ = write(&enable, "0");
        let _ = std::fs::remove_dir(&self.instance);
        let _ = append(
            &Path::new(TRACEFS).join("kprobe_events"),
            &format!("-:{}\n", self.event),
        );
    }
}

/// The times of the events `name` in the text of a tracing instance's `trace`: each
/// line is the task, the CPU, flags, the time in seconds and `name:`.
fn returns_in(trace: &str, name: &str) -> Vec<Duration> {
    let tag = format!(": {name}:");
    trace
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (before, _) = line.split_once(&tag)?;
            let seconds: f64 = before.split_whitespace().last()?.parse().ok()?;
            Duration::try_from_secs_f64(seconds).ok()
        })
        .collect()
}

/// Now on `CLOCK_MONOTONIC`, the clock of `Instant` and of the probe's times.
pub fn monotonic_now() -> Duration {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(Duration::from)
        .unwrap_or_else(|e| panic!("clock_gettime(CLOCK_MONOTONIC): {e}"))
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("{}: {e}", path.display()))
}

/// kprobe_events is appended to: a plain write would remove every other probe.
fn append(path: &Path, line: &str) -> Result<(), String> {
    OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .map_err(|e| format!("{}: {line:?}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_times_of_the_named_events_are_read_and_nothing_else() {
        let trace = "\
# tracer: nop
#
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
#              | |         |   |||||     |         |
        cni-node-345     [001] .....   812.000250: wg_set_device_return: (genl_family_rcv_msg_doit+0xe4/0x150 [wireguard]) <- wg_set_device
     kworker/0:1-12      [000] .....   812.500000: other_return: (x) <- other
        cni-node-345     [000] d....   813.123456: wg_set_device_return: (genl_family_rcv_msg_doit+0xe4/0x150) <- wg_set_device
";
        let times = returns_in(trace, "wg_set_device_return");
        assert_eq!(times.len(), 2);
        assert!(times[0].abs_diff(Duration::from_micros(812_000_250)) < Duration::from_micros(1));
        assert!(times[1].abs_diff(Duration::from_micros(813_123_456)) < Duration::from_micros(1));
    }
}
