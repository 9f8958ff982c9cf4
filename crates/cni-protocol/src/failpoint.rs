//! Failpoints: named steps at which a debug build can be made to die (SIGKILL) or fail,
//! so tests can prove that a command interrupted or failing at any step leaves nothing
//! behind once DEL or GC has run. Every step is also a `debug` record of the operator's
//! log; release builds keep only that.
//!
//! Driven by two environment variables, read once per process:
//! - `CNI_RS_FAILPOINT_TRACE=<file>` appends the name of every failpoint passed to the file,
//!   one per line, so a test can learn a command's steps from a clean run.
//! - `CNI_RS_FAILPOINT=<scope>:<action>@<n>` triggers at the `n`-th (1-based) failpoint of
//!   that scope passed by the process. The scope is the text of a failpoint's name before
//!   its first `/` (the plugin's name, so a delegated IPAM plugin that inherits the variable
//!   does not trigger on the caller's count); `action` is `kill`, `error` or `panic` (the
//!   last proves that a panic mid-command still runs the command's undo steps).
//!
//! A delegate run in-process by the multi-call binary (`crate::inproc`) shares the
//! caller's process, environment and counters, and its steps keep their own scope, so
//! `host-local:<action>@<n>` still picks host-local's n-th step. `error` and `panic` give
//! the caller the same error JSON a child would have printed; `kill` kills the whole
//! process (the caller's command dies at that step, which DEL or GC must recover from
//! like any crash), where an exec'd child's death is reported by the caller as
//! "netplugin failed with no error message" and undone.

use crate::error::CniError;

/// Passes the step `name` (`<scope>/<step>`): logs it (at `debug`, with the time since
/// the previous step), records it when tracing, then dies or returns an error if this is
/// the configured failpoint. Failpoints never trigger in release builds.
#[inline]
pub fn hit(name: &str) -> Result<(), CniError> {
    crate::log::step(name);
    #[cfg(debug_assertions)]
    {
        armed::hit(name)
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = name;
        Ok(())
    }
}

/// What a configured failpoint does.
#[cfg(debug_assertions)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Kill,
    Error,
    Panic,
}

/// A parsed `CNI_RS_FAILPOINT` value.
#[cfg(debug_assertions)]
#[derive(Debug, Clone, PartialEq, Eq)]
struct Trigger {
    scope: String,
    action: Action,
    nth: usize,
}

#[cfg(debug_assertions)]
impl Trigger {
    fn parse(text: &str) -> Option<Self> {
        let (scope, rest) = text.split_once(':')?;
        let (action, nth) = rest.split_once('@')?;
        let action = match action {
            "kill" => Action::Kill,
            "error" => Action::Error,
            "panic" => Action::Panic,
            _ => return None,
        };
        let nth = nth.parse().ok().filter(|n| *n > 0)?;
        Some(Self {
            scope: scope.to_string(),
            action,
            nth,
        })
    }
}

/// The scope of a failpoint name: the plugin part before the first `/`.
#[cfg(debug_assertions)]
fn scope_of(name: &str) -> &str {
    name.split_once('/').map_or(name, |(scope, _)| scope)
}

#[cfg(debug_assertions)]
mod armed {
    use super::{Action, Trigger, scope_of};
    use crate::error::CniError;
    use std::io::Write as _;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Settings {
        trace: Option<std::path::PathBuf>,
        trigger: Option<Trigger>,
    }

    fn settings() -> &'static Settings {
        static SETTINGS: OnceLock<Settings> = OnceLock::new();
        SETTINGS.get_or_init(|| Settings {
            trace: std::env::var_os("CNI_RS_FAILPOINT_TRACE").map(Into::into),
            trigger: std::env::var("CNI_RS_FAILPOINT")
                .ok()
                .and_then(|t| Trigger::parse(&t)),
        })
    }

    pub(super) fn hit(name: &str) -> Result<(), CniError> {
        static PASSED: AtomicUsize = AtomicUsize::new(0);
        let settings = settings();
        if let Some(path) = &settings.trace {
            // One write(2) per line on an O_APPEND file keeps lines whole across threads
            // and processes.
            if let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = file.write_all(format!("{name}\n").as_bytes());
            }
        }
        let Some(trigger) = &settings.trigger else {
            return Ok(());
        };
        if scope_of(name) != trigger.scope {
            return Ok(());
        }
        if PASSED.fetch_add(1, Ordering::SeqCst) + 1 != trigger.nth {
            return Ok(());
        }
        match trigger.action {
            Action::Kill => {
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
                // SIGKILL cannot be caught; if raise failed, dying is still the contract.
                std::process::abort()
            }
            Action::Error => Err(CniError::internal(format!("failpoint {name} triggered"))),
            Action::Panic => panic!("failpoint {name} triggered"),
        }
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn trigger_parsing() {
        assert_eq!(
            Trigger::parse("bridge:kill@3"),
            Some(Trigger {
                scope: "bridge".into(),
                action: Action::Kill,
                nth: 3
            })
        );
        assert_eq!(
            Trigger::parse("host-local:error@1").map(|t| t.action),
            Some(Action::Error)
        );
        assert_eq!(
            Trigger::parse("bridge:panic@2").map(|t| t.action),
            Some(Action::Panic)
        );
        for bad in [
            "",
            "bridge",
            "bridge:kill",
            "bridge:kill@0",
            "bridge:stop@1",
            "b:kill@x",
        ] {
            assert_eq!(Trigger::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn scope_is_the_plugin_part() {
        assert_eq!(scope_of("bridge/add/veth"), "bridge");
        assert_eq!(scope_of("loopback"), "loopback");
    }

    #[test]
    fn unarmed_hit_passes() {
        assert_eq!(hit("test/never-armed"), Ok(()));
    }
}
