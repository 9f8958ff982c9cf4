//! The command dispatcher: from (environment, stdin) to (stdout, exit status), running
//! the reference's pre-checks in its order and calling the plugin's handler.

use crate::config::NetConf;
use crate::delegate;
use crate::env::{CmdArgs, Command};
use crate::error::{CniError, ErrorCode};
use crate::log;
use crate::result::CniResult;
use crate::version::{CURRENT_VERSION, SUPPORTED_VERSIONS, Version, incompatible};
use std::any::Any;
use std::io::{Read, Write as _};
use std::os::unix::fs::MetadataExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

/// One invocation as a plugin handler sees it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The `CNI_*` variables.
    pub args: CmdArgs,
    /// The parsed config.
    pub config: NetConf,
    /// The config bytes as received, passed unchanged to delegates.
    pub stdin: Vec<u8>,
}

impl Request {
    /// Runs the configured IPAM plugin for ADD.
    pub fn ipam_add(&self) -> Result<CniResult, CniError> {
        delegate::delegate_add(
            &self.config.ipam_type,
            &self.args.path,
            &self.stdin,
            &self.config.cni_version,
        )
    }

    /// Runs the configured IPAM plugin for DEL, CHECK, STATUS or GC.
    pub fn ipam(&self, command: Command) -> Result<(), CniError> {
        delegate::delegate(
            command,
            &self.config.ipam_type,
            &self.args.path,
            &self.stdin,
        )
    }
}

/// A CNI plugin: one handler per command. STATUS and GC succeed by default.
pub trait Plugin {
    /// ADD: create the attachment and return its result.
    fn add(&self, req: &Request) -> Result<CniResult, CniError>;
    /// DEL: release the attachment; must succeed when it is already gone.
    fn del(&self, req: &Request) -> Result<(), CniError>;
    /// CHECK: verify the attachment against `prevResult`.
    fn check(&self, req: &Request) -> Result<(), CniError>;
    /// STATUS: whether ADD can be served.
    fn status(&self, _req: &Request) -> Result<(), CniError> {
        Ok(())
    }
    /// GC: release what belongs to attachments outside the valid list.
    fn gc(&self, _req: &Request) -> Result<(), CniError> {
        Ok(())
    }
}

/// What an invocation prints and how it exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Text for stdout.
    pub stdout: String,
    /// Text for stderr.
    pub stderr: String,
    /// Process exit status.
    pub exit_code: u8,
}

impl Outcome {
    fn success(stdout: String) -> Self {
        Self {
            stdout,
            stderr: String::new(),
            exit_code: 0,
        }
    }

    pub(crate) fn failure(err: &CniError, cni_version: &str) -> Self {
        Self {
            stdout: err.to_json(cni_version),
            stderr: String::new(),
            exit_code: 1,
        }
    }
}

/// The VERSION answer, compact with a trailing newline like the reference.
pub fn version_json() -> String {
    let value =
        serde_json::json!({"cniVersion": CURRENT_VERSION, "supportedVersions": SUPPORTED_VERSIONS});
    format!("{value}\n")
}

/// Runs one invocation. `env` reads variables; `stdin` is read only when the command needs it.
pub fn dispatch<P: Plugin + ?Sized>(
    plugin: &P,
    about: &str,
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
) -> Outcome {
    dispatch_as(plugin, &program_name(), about, env, stdin, Nesting::Process)
}

/// Whether an invocation is the process's own command or one run in-process for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nesting {
    /// The process's command: it starts and finishes the operator's log.
    Process,
    /// A delegate run in-process: it logs under its own name through the caller's log,
    /// on the calling thread only, and leaves the caller's command log alone.
    InProcess,
}

/// [`dispatch`] as plugin `name` (the name logged).
pub(crate) fn dispatch_as<P: Plugin + ?Sized>(
    plugin: &P,
    name: &str,
    about: &str,
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    nesting: Nesting,
) -> Outcome {
    // The process's own plugin heads the delegation chain (in-process delegates
    // are marked by `inproc::run`).
    let _running = matches!(nesting, Nesting::Process).then(|| crate::delegate::running(name));
    let command_text = env("CNI_COMMAND").unwrap_or_default();
    if command_text.is_empty() {
        let versions = SUPPORTED_VERSIONS.join(", ");
        return Outcome {
            stdout: String::new(),
            stderr: format!("{about}\nCNI protocol versions supported: {versions}\n"),
            exit_code: 0,
        };
    }
    let args = match Command::parse(&command_text).and_then(|cmd| CmdArgs::from_env(cmd, env)) {
        Ok(args) => args,
        Err(err) => return Outcome::failure(&err, CURRENT_VERSION),
    };
    if args.command == Command::Version {
        return Outcome::success(version_json());
    }
    let mut bytes = Vec::new();
    if let Err(e) = stdin.read_to_end(&mut bytes) {
        let err = CniError::new(
            ErrorCode::IO_FAILURE,
            format!("error reading from stdin: {e}"),
        );
        return Outcome::failure(&err, CURRENT_VERSION);
    }
    let mut config = match NetConf::parse(&bytes) {
        Ok(config) => config,
        Err(err) => return Outcome::failure(&err, &declared_version(&bytes)),
    };
    let version = config.cni_version.clone();
    let prepared = check_version(args.command, &version)
        .and_then(|()| check_netns(&args))
        .and_then(|()| config.load_prev_result());
    if let Err(err) = prepared {
        return Outcome::failure(&err, &version);
    }
    // Dropped on every return below, ending a nested command's log scope.
    let _log_scope = match (log::Settings::resolve(&config.raw, env), nesting) {
        (None, _) => None,
        (Some(settings), Nesting::Process) => {
            log::start(settings, name, &args);
            None
        }
        // Same config and environment as the caller: the caller's settings are ours.
        (Some(_), Nesting::InProcess) => Some(log::enter_nested(name, &args)),
    };
    let req = Request {
        args,
        config,
        stdin: bytes,
    };
    // A panic in a handler is a bug, but the runtime still gets a whole error JSON in the
    // config's version (the handler's own undo steps run as the panic unwinds through it).
    let handled = catch_unwind(AssertUnwindSafe(|| match req.args.command {
        Command::Add => plugin.add(&req).and_then(|result| result.to_json(&version)),
        Command::Del => plugin.del(&req).map(|()| String::new()),
        Command::Check => plugin.check(&req).map(|()| String::new()),
        Command::Status => plugin.status(&req).map(|()| String::new()),
        Command::Gc => plugin.gc(&req).map(|()| String::new()),
        Command::Version => Ok(version_json()),
    }))
    .unwrap_or_else(|panic| Err(panic_error(panic.as_ref())));
    match handled {
        Ok(stdout) => {
            if req.args.command == Command::Add && log::enabled(log::Level::Info) {
                log::result(&compact(&stdout));
            }
            log::finish(None);
            Outcome::success(stdout)
        }
        Err(err) => {
            log::finish(Some((err.code.0, &err.to_string())));
            Outcome::failure(&err, &version)
        }
    }
}

/// The name this binary was started as (`bridge`, `host-local`), for the log.
fn program_name() -> String {
    std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

/// Pretty-printed JSON on one line, for the log.
fn compact(json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(json)
        .map_or_else(|_| json.to_string(), |v| v.to_string())
}

/// The code-999 error reported for a panic, with the panic's message.
pub fn panic_error(payload: &(dyn Any + Send)) -> CniError {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    CniError::internal(format!("internal error: {text}"))
}

/// The `cniVersion` a config declares, for errors about a config that failed to parse.
fn declared_version(bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .unwrap_or_else(|| CURRENT_VERSION.to_string())
}

/// The reference's per-command version gates.
fn check_version(command: Command, config_version: &str) -> Result<(), CniError> {
    let minimum = match command {
        Command::Add | Command::Del => {
            return if SUPPORTED_VERSIONS.contains(&config_version) {
                Ok(())
            } else {
                Err(incompatible(config_version))
            };
        }
        Command::Check => Version::new(0, 4, 0),
        Command::Status | Command::Gc => Version::new(1, 1, 0),
        Command::Version => return Ok(()),
    };
    let name = command.as_str();
    let parsed = Version::parse(config_version)?;
    if parsed < minimum {
        return Err(CniError::new(
            ErrorCode::INCOMPATIBLE_CNI_VERSION,
            format!("config version does not allow {name}"),
        ));
    }
    if parsed > Version::parse(CURRENT_VERSION)? {
        return Err(CniError::new(
            ErrorCode::INCOMPATIBLE_CNI_VERSION,
            format!("plugin version does not allow {name}"),
        ));
    }
    Ok(())
}

/// Refuses to work on the plugin's own netns (a recycled `/proc/<pid>/ns/net` once made
/// loopback take down the host's `lo`). Done before any work, unlike the reference.
fn check_netns(args: &CmdArgs) -> Result<(), CniError> {
    let Some(netns) = args.netns_path() else {
        return Ok(());
    };
    if args.netns_override || !args.command.targets_attachment() {
        return Ok(());
    }
    let ours = std::fs::metadata("/proc/thread-self/ns/net")
        .or_else(|_| std::fs::metadata("/proc/self/ns/net"));
    let (Ok(ours), Ok(theirs)) = (ours, std::fs::metadata(netns)) else {
        // Unopenable paths are the handler's business (DEL treats them as gone).
        return Ok(());
    };
    if (ours.dev(), ours.ino()) == (theirs.dev(), theirs.ino()) {
        return Err(CniError::new(
            ErrorCode::INVALID_NETNS,
            "plugin's netns and netns from CNI_NETNS should not be the same",
        ));
    }
    Ok(())
}

/// The `main` of a plugin binary: dispatches with the process environment and stdin,
/// prints the outcome and returns the exit status.
pub fn run<P: Plugin + ?Sized>(plugin: &P, about: &str) -> ExitCode {
    #[cfg(panic = "abort")]
    install_abort_reporter();
    let env = |name: &str| std::env::var(name).ok();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        dispatch(plugin, about, &env, &mut std::io::stdin().lock())
    }))
    .unwrap_or_else(|panic| Outcome::failure(&panic_error(panic.as_ref()), CURRENT_VERSION));
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(outcome.stderr.as_bytes());
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_all(outcome.stdout.as_bytes())
        .and_then(|()| stdout.flush());
    if written.is_err() {
        // The runtime closed our stdout; nothing more can be told to it.
        return ExitCode::from(outcome.exit_code.max(1));
    }
    ExitCode::from(outcome.exit_code)
}

/// In a build that aborts on panic nothing unwinds to the dispatcher, so the hook itself
/// answers the runtime with a whole, flushed error JSON before the process dies.
#[cfg(panic = "abort")]
fn install_abort_reporter() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let err = panic_error(info.payload());
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(err.to_json(CURRENT_VERSION).as_bytes());
        let _ = stdout.flush();
        default_hook(info);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::IpConfig;
    use std::collections::HashMap;

    struct Fake;

    impl Plugin for Fake {
        fn add(&self, req: &Request) -> Result<CniResult, CniError> {
            if req.config.name == "panic" {
                panic!("handler bug");
            }
            if req.config.name == "fail" {
                return Err(CniError::internal("handler failed"));
            }
            Ok(CniResult {
                ips: vec![IpConfig {
                    address: "10.0.0.2/24".parse().unwrap(),
                    gateway: None,
                    interface: None,
                }],
                ..CniResult::default()
            })
        }
        fn del(&self, _req: &Request) -> Result<(), CniError> {
            Ok(())
        }
        fn check(&self, _req: &Request) -> Result<(), CniError> {
            Ok(())
        }
    }

    fn run_with(vars: &[(&str, &str)], stdin: &str) -> Outcome {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = move |k: &str| map.get(k).cloned();
        dispatch(&Fake, "CNI fake plugin 0.1.0", &env, &mut stdin.as_bytes())
    }

    fn attach_env(cmd: &'static str) -> Vec<(&'static str, &'static str)> {
        vec![
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "ctr"),
            ("CNI_NETNS", "/nonexistent/netns"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]
    }

    fn error_of(outcome: &Outcome) -> (u64, String) {
        let v: serde_json::Value = serde_json::from_str(&outcome.stdout).unwrap();
        (
            v["code"].as_u64().unwrap(),
            v["msg"].as_str().unwrap().to_string(),
        )
    }

    #[test]
    fn version_needs_no_stdin() {
        let out = run_with(&[("CNI_COMMAND", "VERSION")], "");
        assert_eq!(
            out.stdout,
            "{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.1.0\",\"0.2.0\",\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}\n"
        );
        assert_eq!(out.exit_code, 0);
    }

    #[test]
    fn about_on_empty_command() {
        let out = run_with(&[], "");
        assert_eq!((out.exit_code, out.stdout.as_str()), (0, ""));
        assert!(out.stderr.contains(
            "CNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"
        ));
    }

    #[test]
    fn prechecks_table() {
        let cases: [(&str, &str, u64, &str); 9] = [
            (
                "ADD",
                "{",
                6,
                "error unmarshall network config: EOF while parsing an object at line 1 column 1",
            ),
            (
                "ADD",
                r#"{"cniVersion": "1.0.0"}"#,
                7,
                "missing network name",
            ),
            (
                "ADD",
                r#"{"cniVersion": "0.5.0", "name": "n"}"#,
                1,
                "incompatible CNI versions",
            ),
            (
                "DEL",
                r#"{"cniVersion": "0.5.0", "name": "n"}"#,
                1,
                "incompatible CNI versions",
            ),
            (
                "CHECK",
                r#"{"cniVersion": "0.3.1", "name": "n"}"#,
                1,
                "config version does not allow CHECK",
            ),
            (
                "CHECK",
                r#"{"cniVersion": "2.0.0", "name": "n"}"#,
                1,
                "plugin version does not allow CHECK",
            ),
            (
                "CHECK",
                r#"{"cniVersion": "x.y", "name": "n"}"#,
                6,
                r#"invalid version "x.y": "x" is not a number"#,
            ),
            (
                "ADD",
                r#"{"cniVersion": "1.0.0", "name": "fail"}"#,
                999,
                "handler failed",
            ),
            (
                "ADD",
                r#"{"cniVersion": "1.0.0", "name": "n", "prevResult": {"ips": 3}}"#,
                999,
                "could not parse prevResult: failed to parse result: ips must be a list, got 3",
            ),
        ];
        for (cmd, stdin, code, msg) in cases {
            let out = run_with(&attach_env(cmd), stdin);
            assert_eq!(out.exit_code, 1, "{cmd} {stdin}");
            assert_eq!(error_of(&out), (code, msg.to_string()), "{cmd} {stdin}");
        }
        for cmd in ["STATUS", "GC"] {
            let out = run_with(
                &[("CNI_COMMAND", cmd), ("CNI_PATH", "/x")],
                r#"{"cniVersion": "1.0.0", "name": "n"}"#,
            );
            assert_eq!(
                error_of(&out),
                (1, format!("config version does not allow {cmd}"))
            );
            let ok = run_with(
                &[("CNI_COMMAND", cmd), ("CNI_PATH", "/x")],
                r#"{"cniVersion": "1.1.0", "name": "n"}"#,
            );
            assert_eq!((ok.exit_code, ok.stdout.as_str()), (0, ""));
        }
    }

    #[test]
    fn a_panicking_handler_answers_with_error_json_in_the_config_version() {
        let out = run_with(
            &attach_env("ADD"),
            r#"{"cniVersion": "0.4.0", "name": "panic"}"#,
        );
        assert_eq!(out.exit_code, 1);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["code"], 999);
        assert_eq!(v["msg"], "internal error: handler bug");
    }

    #[test]
    fn errors_carry_config_version() {
        let out = run_with(
            &attach_env("ADD"),
            r#"{"cniVersion": "0.5.0", "name": "n"}"#,
        );
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["cniVersion"], "0.5.0");
        let unnamed = run_with(&attach_env("ADD"), r#"{"cniVersion": "0.4.0"}"#);
        let v: serde_json::Value = serde_json::from_str(&unnamed.stdout).unwrap();
        assert_eq!(
            (v["code"].as_u64(), v["cniVersion"].as_str()),
            (Some(7), Some("0.4.0"))
        );
        let env_err = run_with(&[("CNI_COMMAND", "ADD")], "");
        let v: serde_json::Value = serde_json::from_str(&env_err.stdout).unwrap();
        assert_eq!(
            (v["code"].as_u64(), v["cniVersion"].as_str()),
            (Some(4), Some("1.1.0"))
        );
    }

    #[test]
    fn add_prints_result_in_config_version() {
        let out = run_with(
            &attach_env("ADD"),
            r#"{"cniVersion": "0.2.0", "name": "n"}"#,
        );
        assert_eq!(out.exit_code, 0, "{}", out.stdout);
        assert!(out.stdout.contains("\"ip4\""));
        let out = run_with(&attach_env("ADD"), r#"{"name": "n"}"#);
        assert!(
            out.stdout.contains("\"cniVersion\": \"0.1.0\""),
            "{}",
            out.stdout
        );
    }

    #[test]
    fn own_netns_rejected_before_work_unless_overridden() {
        let mut vars = attach_env("ADD");
        vars[2] = ("CNI_NETNS", "/proc/self/ns/net");
        let out = run_with(&vars, r#"{"cniVersion": "1.0.0", "name": "n"}"#);
        assert_eq!(
            error_of(&out),
            (
                8,
                "plugin's netns and netns from CNI_NETNS should not be the same".into()
            )
        );
        vars.push(("CNI_NETNS_OVERRIDE", "1"));
        assert_eq!(
            run_with(&vars, r#"{"cniVersion": "1.0.0", "name": "n"}"#).exit_code,
            0
        );
    }
}
