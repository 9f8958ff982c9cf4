//! The operator's log: an opt-in file, never stdout, recording each command with its
//! container, what the plugin created or removed and how long each step took, so that
//! "why has this pod no network" can be answered after the fact.
//!
//! Turned on by the config key `"log": {"file": "<path>", "level": "info"}` (at the top
//! of a plugin's config, so an IPAM plugin given the same config logs too) or by the
//! environment (`CNI_RS_LOG_FILE`, `CNI_RS_LOG_LEVEL`, which win over the config).
//! Levels: `error` (failed commands only), `info` (every command, its outcome and
//! duration, and what was created or removed; the default), `debug` (also every step
//! with the time since the previous one). Each record is one line, written with one
//! `write(2)` to a file opened with `O_APPEND`, so concurrent plugins never interleave
//! inside a line. A log that cannot be opened is skipped: logging never fails a command.
//!
//! An IPAM plugin run in-process by the multi-call binary (see `crate::inproc`) logs
//! through the caller's logger but under its own identity, start time and outcome, set
//! for the calling thread only ([`enter_nested`]), so its lines read as the exec'd
//! plugin's would (with the caller's pid) and the caller's command log is neither
//! restarted nor finished by it.

use crate::env::CmdArgs;
use serde_json::Value;
use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How much is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Failed commands only.
    Error,
    /// Every command and every effect.
    Info,
    /// Also every step with its timing.
    Debug,
}

impl Level {
    fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "error" => Some(Self::Error),
            "info" | "" => Some(Self::Info),
            "debug" => Some(Self::Debug),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Info => "info",
            Self::Debug => "debug",
        }
    }
}

/// Where and how much to log, from the config and the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The log file.
    pub file: PathBuf,
    /// The most detailed level written.
    pub level: Level,
}

impl Settings {
    /// The settings, or `None` when logging is off. The environment wins over the
    /// config's `log` object; an unknown level means `info`.
    pub fn resolve(config: &Value, env: &dyn Fn(&str) -> Option<String>) -> Option<Self> {
        let log = config.get("log");
        let from_config = |key: &str| {
            log.and_then(|l| l.get(key))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let file = env("CNI_RS_LOG_FILE")
            .filter(|f| !f.is_empty())
            .or_else(|| from_config("file").filter(|f| !f.is_empty()))?;
        let level = env("CNI_RS_LOG_LEVEL")
            .or_else(|| from_config("level"))
            .and_then(|l| Level::parse(&l))
            .unwrap_or(Level::Info);
        Some(Self {
            file: file.into(),
            level,
        })
    }
}

/// The process's log, once configured.
#[derive(Debug)]
struct Logger {
    settings: Settings,
    /// `plugin=… cmd=… container=… ifname=…`, put on every line.
    context: String,
    started: Instant,
    last_step: Mutex<Instant>,
    /// The log file, opened at the first record (`None`: it cannot be used).
    file: OnceLock<Option<std::fs::File>>,
}

/// Opens the operator's log for appending, once per process, and keeps it only if it is
/// a regular file: the path may be in a directory others can write, so a symlink is not
/// followed, a FIFO or device cannot block or swallow the command (`O_NONBLOCK`, then the
/// type check), and a file created here is the owner's alone (0600). A log that cannot
/// be opened is skipped: it never fails or delays the command.
fn open_log(path: &std::path::Path) -> Option<std::fs::File> {
    use nix::libc;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    file.metadata().ok()?.file_type().is_file().then_some(file)
}

static LOGGER: OnceLock<Logger> = OnceLock::new();

/// The identity and clock of a command run in-process on this thread, nested in the
/// process's own command.
#[derive(Debug)]
struct Scope {
    context: String,
    started: Instant,
    last_step: Instant,
}

thread_local! {
    static NESTED: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

/// While alive, this thread's records carry a nested command's identity, duration and
/// step clock; dropping it restores the enclosing one.
#[derive(Debug)]
#[must_use = "the nested scope ends when the guard is dropped"]
pub struct NestedGuard {
    previous: Option<Scope>,
}

impl Drop for NestedGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        NESTED.with(|nested| *nested.borrow_mut() = previous);
    }
}

/// Starts a nested command (an in-process delegate) on this thread: the process's log
/// settings are kept (the delegate resolves the same ones from the same config and
/// environment); its lines carry `plugin` and `args` until the guard is dropped.
pub fn enter_nested(plugin: &str, args: &CmdArgs) -> NestedGuard {
    let now = Instant::now();
    let scope = Scope {
        context: context_of(plugin, args),
        started: now,
        last_step: now,
    };
    NestedGuard {
        previous: NESTED.with(|nested| nested.borrow_mut().replace(scope)),
    }
}

/// `plugin=… cmd=… container=… ifname=… netns=…`.
fn context_of(plugin: &str, args: &CmdArgs) -> String {
    let mut context = format!("plugin={} cmd={}", quote(plugin), args.command.as_str());
    for (key, value) in [
        ("container", &args.container_id),
        ("ifname", &args.ifname),
        ("netns", &args.netns),
    ] {
        if !value.is_empty() {
            let _ = write!(context, " {key}={}", quote(value));
        }
    }
    context
}

/// Turns logging on for this process (the first call wins), with the invocation's
/// identity put on every line.
pub fn start(settings: Settings, plugin: &str, args: &CmdArgs) {
    let context = context_of(plugin, args);
    let now = Instant::now();
    let _ = LOGGER.set(Logger {
        settings,
        context,
        started: now,
        last_step: Mutex::new(now),
        file: OnceLock::new(),
    });
}

/// Whether records of `level` are written.
pub fn enabled(level: Level) -> bool {
    LOGGER.get().is_some_and(|l| level <= l.settings.level)
}

/// Logs an effect or event (`created veth veth1234 on cni0`) at `info`.
pub fn info(message: &str) {
    record(Level::Info, message, "");
}

/// Logs an event at `debug` (e.g. which way a delegate was run).
pub fn debug(message: &str) {
    record(Level::Debug, message, "");
}

/// Logs a command's result (compact JSON) at `info`.
pub fn result(json: &str) {
    record(Level::Info, "result", &format!(" result={}", quote(json)));
}

/// Logs a step at `debug`, with the milliseconds since the previous step (or the start).
pub fn step(name: &str) {
    let Some(logger) = LOGGER.get().filter(|_| enabled(Level::Debug)) else {
        return;
    };
    let now = Instant::now();
    let nested_since = NESTED.with(|nested| {
        nested.borrow_mut().as_mut().map(|scope| {
            let since = now.duration_since(scope.last_step);
            scope.last_step = now;
            since
        })
    });
    let since = if let Some(since) = nested_since {
        since
    } else {
        let mut last = logger
            .last_step
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let since = now.duration_since(*last);
        *last = now;
        since
    };
    let extra = format!(" step={} after_ms={:.3}", quote(name), ms(since));
    record(Level::Debug, "step", &extra);
}

/// Logs the end of the command: `ok` at `info`, a failure (code and message) at `error`,
/// with the whole duration.
pub fn finish(failure: Option<(u32, &str)>) {
    let Some(logger) = LOGGER.get() else {
        return;
    };
    let started = NESTED
        .with(|nested| nested.borrow().as_ref().map(|scope| scope.started))
        .unwrap_or(logger.started);
    let took = format!(" duration_ms={:.3}", ms(started.elapsed()));
    match failure {
        None => record(Level::Info, "ok", &took),
        Some((code, msg)) => record(
            Level::Error,
            "failed",
            &format!(" code={code} error={}{took}", quote(msg)),
        ),
    }
}

fn record(level: Level, message: &str, extra: &str) {
    let Some(logger) = LOGGER.get().filter(|_| enabled(level)) else {
        return;
    };
    let line = NESTED.with(|nested| {
        let nested = nested.borrow();
        let context = nested
            .as_ref()
            .map_or(&logger.context, |scope| &scope.context);
        format!(
            "{} pid={} level={} {context} msg={}{extra}\n",
            rfc3339_utc(SystemTime::now()),
            std::process::id(),
            level.as_str(),
            quote(message),
        )
    });
    if let Some(mut file) = logger
        .file
        .get_or_init(|| open_log(&logger.settings.file))
        .as_ref()
    {
        let _ = file.write_all(line.as_bytes());
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A value as logfmt prints it: bare when it is a plain word, else JSON-quoted.
fn quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'=' && b != b'\\');
    if plain {
        text.to_string()
    } else {
        Value::from(text).to_string()
    }
}

/// `2026-11-23T03:55:01.123Z`.
pub fn rfc3339_utc(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn settings_from_config_and_environment() {
        let none = |_: &str| None;
        assert_eq!(Settings::resolve(&json!({"name": "n"}), &none), None);
        let conf = json!({"log": {"file": "/var/log/cni.log", "level": "debug"}});
        assert_eq!(
            Settings::resolve(&conf, &none),
            Some(Settings {
                file: "/var/log/cni.log".into(),
                level: Level::Debug
            })
        );
        let env = |k: &str| match k {
            "CNI_RS_LOG_FILE" => Some("/tmp/x.log".to_string()),
            "CNI_RS_LOG_LEVEL" => Some("ERROR".to_string()),
            _ => None,
        };
        assert_eq!(
            Settings::resolve(&conf, &env),
            Some(Settings {
                file: "/tmp/x.log".into(),
                level: Level::Error
            })
        );
        let odd = json!({"log": {"file": "/l", "level": "loud"}});
        assert_eq!(
            Settings::resolve(&odd, &none).map(|s| s.level),
            Some(Level::Info)
        );
        assert_eq!(Settings::resolve(&json!({"log": {"file": 3}}), &none), None);
    }

    #[test]
    fn values_are_quoted_only_when_needed() {
        assert_eq!(quote("eth0"), "eth0");
        assert_eq!(quote("/var/run/netns/a"), "/var/run/netns/a");
        assert_eq!(quote("two words"), "\"two words\"");
        assert_eq!(quote("a=b"), "\"a=b\"");
        assert_eq!(quote(""), "\"\"");
    }

    #[test]
    fn timestamps_are_utc_rfc3339() {
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1_795_405_501_123);
        assert_eq!(rfc3339_utc(t), "2026-11-23T03:45:01.123Z");
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
