//! The multi-call binary and in-process delegation.
//!
//! All plugins ship as one executable, installed under each plugin's name (hard links or
//! copies); [`run_multicall`] picks the plugin from the name it was started as. When a
//! plugin delegates (IPAM) and the file `CNI_PATH` resolves the delegate's name to is
//! this very executable (same device and inode as `/proc/self/exe`), exec'ing it would
//! only start this same program again as that plugin; [`resolve`] recognises that case
//! and [`run`] runs the plugin's dispatcher in-process instead, with exactly what the
//! child would have seen: the process environment with `CNI_COMMAND` replaced, the same
//! stdin bytes, and its stdout and exit status interpreted as the child's would be.
//! Anything else in `CNI_PATH` (the reference's binary, a copy of ours, an older install
//! replaced since we started) is exec'd as before.
//!
//! Nothing here changes process-wide state after start-up: the registry is set once by
//! `main`, the environment is read, never written, and the delegate's log lines are
//! scoped to the calling thread, so a delegate may run on any thread.

use crate::dispatch::{self, Nesting, Outcome, Plugin, panic_error};
use crate::env::Command;
use crate::error::CniError;
use crate::version::CURRENT_VERSION;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::process::ExitCode;
use std::sync::OnceLock;

/// A plugin built into this executable: its name (as installed, and as a config's
/// `type`) and its handlers.
#[derive(Clone, Copy)]
pub struct Builtin {
    /// The plugin's name.
    pub name: &'static str,
    /// Its command handlers.
    pub plugin: &'static (dyn Plugin + Sync),
}

impl std::fmt::Debug for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builtin").field("name", &self.name).finish()
    }
}

static BUILTINS: OnceLock<&'static [Builtin]> = OnceLock::new();

/// Declares which plugins this executable can run in-process. The first call wins;
/// returns whether this one did.
pub fn register(builtins: &'static [Builtin]) -> bool {
    BUILTINS.set(builtins).is_ok()
}

/// The registered plugin called `name`.
pub fn builtin(name: &str) -> Option<&'static Builtin> {
    BUILTINS.get()?.iter().find(|b| b.name == name)
}

/// A file's identity: (device, inode) of what `path` names, symlinks followed.
pub fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The identity of the running executable (it cannot change while we run, so it is
/// looked up once). `None` without `/proc`: then everything is exec'd.
fn own_identity() -> Option<(u64, u64)> {
    static OWN: OnceLock<Option<(u64, u64)>> = OnceLock::new();
    *OWN.get_or_init(|| identity(Path::new("/proc/self/exe")))
}

/// The plugin to run in-process for delegate `name`, found at `path` in `CNI_PATH`: the
/// registered plugin of that name when `path` is this executable, else `None` (exec it).
/// Exec'ing this executable as `path` would run exactly that plugin, since the
/// multi-call `main` picks it by the name it is started as, which is `name`.
pub fn resolve(name: &str, path: &Path) -> Option<&'static Builtin> {
    resolve_against(name, path, own_identity()?)
}

fn resolve_against(name: &str, path: &Path, own: (u64, u64)) -> Option<&'static Builtin> {
    let builtin = builtin(name)?;
    (identity(path)? == own && exec_would_run(path)).then_some(builtin)
}

/// Whether exec'ing `path` would start it: it has an execute bit and its file system
/// is not mounted `noexec`. Otherwise the delegate is exec'd, and fails as exec fails,
/// rather than run in-process behind the mount's back.
fn exec_would_run(path: &Path) -> bool {
    use nix::sys::statvfs::{FsFlags, statvfs};
    use std::os::unix::fs::PermissionsExt as _;
    let executable = std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
    let noexec = statvfs(path).map_or(true, |fs| fs.flags().contains(FsFlags::ST_NOEXEC));
    executable && !noexec
}

/// Runs `builtin` for `command` in this process, as an exec of it would run: the
/// process environment with `CNI_COMMAND` replaced, `stdin` as its input. A panic
/// anywhere in it becomes the error JSON the child's `main` would have printed.
pub fn run(builtin: &Builtin, command: Command, stdin: &[u8]) -> Outcome {
    let env = |key: &str| {
        if key == "CNI_COMMAND" {
            Some(command.as_str().to_owned())
        } else {
            std::env::var(key).ok()
        }
    };
    let _running = crate::delegate::running(builtin.name);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        dispatch::dispatch_as(
            builtin.plugin,
            builtin.name,
            builtin.name,
            &env,
            &mut &stdin[..],
            Nesting::InProcess,
        )
    }))
    .unwrap_or_else(|panic| Outcome::failure(&panic_error(panic.as_ref()), CURRENT_VERSION));
    if !outcome.stderr.is_empty() {
        // The child's stderr is ours.
        let _ = std::io::stderr().write_all(outcome.stderr.as_bytes());
    }
    outcome
}

/// The `main` of the multi-call binary: runs the registered plugin named like the
/// executable was started (the last component of `argv[0]`), after registering them
/// all for in-process delegation. Any other name is refused with a message naming the
/// accepted ones (and an error JSON on stdout when a runtime asked for a command).
pub fn run_multicall(builtins: &'static [Builtin], about: fn(&str) -> String) -> ExitCode {
    register(builtins);
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(builtin) = builtins.iter().find(|b| b.name == name) {
        return dispatch::run(builtin.plugin, &about(builtin.name));
    }
    let message = unknown_name_message(&name, builtins);
    let _ = writeln!(std::io::stderr(), "{message}");
    if std::env::var_os("CNI_COMMAND").is_some_and(|c| !c.is_empty()) {
        let json = CniError::internal(message).to_json(CURRENT_VERSION);
        let _ = std::io::stdout().write_all(json.as_bytes());
    }
    ExitCode::from(1)
}

/// What the multi-call binary says when started under a name it does not know.
fn unknown_name_message(name: &str, builtins: &[Builtin]) -> String {
    let names: Vec<&str> = builtins.iter().map(|b| b.name).collect();
    format!(
        "this is the cni-plugins-rs multi-call binary, started as {name:?}: run it under one \
         of the plugin names {} (a hard link, copy or symlink of it named so)",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::Request;
    use crate::result::{CniResult, IpConfig};
    use std::path::PathBuf;

    /// An IPAM-like plugin whose behaviour the config's `name` picks.
    struct Fake;

    impl Plugin for Fake {
        fn add(&self, req: &Request) -> Result<CniResult, CniError> {
            match req.config.name.as_str() {
                "panic" => panic!("fake bug"),
                "fail" => Err(CniError::new(crate::ErrorCode(11), "no addresses left")
                    .with_details("range full")),
                _ => Ok(CniResult {
                    ips: vec![IpConfig {
                        address: "10.1.2.3/24".parse().unwrap(),
                        gateway: None,
                        interface: None,
                    }],
                    ..CniResult::default()
                }),
            }
        }
        fn del(&self, _req: &Request) -> Result<(), CniError> {
            Ok(())
        }
        fn check(&self, _req: &Request) -> Result<(), CniError> {
            Err(CniError::internal("check failed"))
        }
    }

    static BUILTINS: [Builtin; 1] = [Builtin {
        name: "fake-ipam",
        plugin: &Fake,
    }];

    /// A fresh directory next to the test executable (same filesystem, so hard links
    /// to it work), removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Self {
            let exe = std::env::current_exe().unwrap();
            let dir = exe
                .parent()
                .unwrap()
                .join(format!("inproc-test-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn only_a_registered_name_at_this_very_file_runs_in_process() {
        register(&BUILTINS);
        let own = own_identity().expect("/proc/self/exe");
        assert_eq!(identity(&std::env::current_exe().unwrap()), Some(own));
        let dir = Dir::new("identity");
        let exe = std::env::current_exe().unwrap();
        std::fs::hard_link(&exe, dir.0.join("fake-ipam")).unwrap();
        std::fs::hard_link(&exe, dir.0.join("other")).unwrap();
        std::os::unix::fs::symlink(&exe, dir.0.join("via-symlink")).unwrap();
        let copy = Dir::new("copy");
        std::fs::copy(&exe, copy.0.join("fake-ipam")).unwrap();

        let hit = resolve("fake-ipam", &dir.0.join("fake-ipam")).map(|b| b.name);
        assert_eq!(hit, Some("fake-ipam"));
        // Same file, unregistered name: the exec'd binary would refuse it, so exec it.
        assert!(resolve("other", &dir.0.join("other")).is_none());
        // A copy is another file (it may be another build): exec'd.
        assert!(resolve("fake-ipam", &copy.0.join("fake-ipam")).is_none());
        // Registered name, but the file is someone else's.
        assert!(resolve("fake-ipam", Path::new("/usr/bin/true")).is_none());
        assert!(resolve("fake-ipam", &dir.0.join("missing")).is_none());
        // A symlink is followed, as exec follows it.
        assert!(resolve_against("fake-ipam", &dir.0.join("via-symlink"), own).is_some());
        assert!(builtin("fake-ipam").is_some() && builtin("nope").is_none());
    }

    #[test]
    fn unknown_names_are_refused_with_the_accepted_ones() {
        let message = unknown_name_message("cni-plugins-rs", &BUILTINS);
        assert!(message.contains("\"cni-plugins-rs\""), "{message}");
        assert!(message.contains("plugin names fake-ipam"), "{message}");
    }

    fn config(name: &str) -> Vec<u8> {
        format!(r#"{{"cniVersion": "0.4.0", "name": "{name}", "ipam": {{"type": "fake-ipam"}}}}"#)
            .into_bytes()
    }

    #[test]
    fn in_process_outcomes_are_the_childs() {
        // CNI_PATH and the other variables come from the process environment, as for a
        // child; this test binary's environment has none, so they are checked first.
        let missing = run(&BUILTINS[0], Command::Add, &config("ok"));
        assert_eq!(missing.exit_code, 1);
        assert!(
            missing.stdout.contains("required env variables"),
            "{missing:?}"
        );
    }

    #[test]
    fn in_process_results_and_errors_pass_through_like_exec() {
        // The delegate path end to end, without the environment: dispatch directly.
        let env = |key: &str| match key {
            "CNI_COMMAND" => Some("ADD".to_owned()),
            "CNI_CONTAINERID" => Some("c1".to_owned()),
            "CNI_NETNS" => Some("/nonexistent/netns".to_owned()),
            "CNI_IFNAME" => Some("eth0".to_owned()),
            "CNI_PATH" => Some("/x".to_owned()),
            _ => None,
        };
        let outcome = |name: &str| {
            dispatch::dispatch_as(
                &Fake,
                "fake-ipam",
                "",
                &env,
                &mut config(name).as_slice(),
                Nesting::InProcess,
            )
        };
        let ok = crate::delegate::interpret_outcome(&outcome("ok")).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&ok).unwrap();
        assert_eq!(value["ips"][0]["address"], "10.1.2.3/24");
        let err = crate::delegate::interpret_outcome(&outcome("fail")).unwrap_err();
        assert_eq!(
            (err.code.0, err.msg.as_str(), err.details.as_str()),
            (11, "no addresses left", "range full")
        );
        let panicked = crate::delegate::interpret_outcome(&outcome("panic")).unwrap_err();
        assert_eq!(
            (panicked.code.0, panicked.msg.as_str()),
            (999, "internal error: fake bug")
        );
        let silent = Outcome {
            stdout: " \n".into(),
            stderr: String::new(),
            exit_code: 2,
        };
        assert_eq!(
            crate::delegate::interpret_outcome(&silent).unwrap_err().msg,
            "netplugin failed with no error message: exit status: 2"
        );
    }
}
