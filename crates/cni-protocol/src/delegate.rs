//! Delegation to another plugin (IPAM): find it in `CNI_PATH`, run it with our
//! environment and the full config on stdin, pass its errors through unchanged.
//! When the file found is this very executable, the delegate runs in-process
//! (`crate::inproc`) and its outcome is read exactly as a child's would be.

use crate::dispatch::Outcome;
use crate::env::Command;
use crate::error::CniError;
use crate::inproc;
use crate::result::CniResult;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

/// Finds plugin `name` in the `CNI_PATH` directories: the first regular file of that name.
pub fn find_plugin(name: &str, path: &[PathBuf]) -> Result<PathBuf, CniError> {
    if name.is_empty() {
        return Err(CniError::internal("no plugin name provided"));
    }
    if name.contains(std::path::MAIN_SEPARATOR) {
        return Err(CniError::internal(format!("invalid plugin name: {name}")));
    }
    path.iter()
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.metadata().is_ok_and(|m| m.is_file()))
        .ok_or_else(|| {
            let dirs: Vec<String> = path.iter().map(|p| p.display().to_string()).collect();
            CniError::internal(format!(
                "failed to find plugin {name:?} in path [{}]",
                dirs.join(" ")
            ))
        })
}

/// Runs `plugin` for `command` with the config on stdin; our environment is inherited
/// with `CNI_COMMAND` replaced, and its stderr goes to ours. Returns its stdout, or the
/// error it printed.
pub fn exec_plugin(command: Command, plugin: &Path, stdin: &[u8]) -> Result<Vec<u8>, CniError> {
    exec_plugin_in_chain(command, plugin, stdin, "")
}

/// [`exec_plugin`], telling the child which plugins run above it ([`CHAIN_VAR`]).
fn exec_plugin_in_chain(
    command: Command,
    plugin: &Path,
    stdin: &[u8],
    chain: &str,
) -> Result<Vec<u8>, CniError> {
    let mut cmd = std::process::Command::new(plugin);
    if chain.is_empty() {
        cmd.env_remove(CHAIN_VAR);
    } else {
        cmd.env(CHAIN_VAR, chain);
    }
    cmd.env("CNI_COMMAND", command.as_str())
        .stderr(Stdio::inherit());
    let output = exec_with_stdin(&mut cmd, stdin)?;
    interpret(output.status.success(), &output.status, output.stdout)
}

/// Runs a plugin executable, as delegation and cnitool do: `command` (the plugin's
/// path, its environment and where its stderr goes, as the caller set them) is started,
/// retried while its file is busy being installed, and fed `stdin` while its stdout
/// (and stderr, if piped) is collected. A plugin may exit without reading all of stdin;
/// its answer is what counts, so a broken pipe is not an error.
pub fn exec_with_stdin(
    command: &mut std::process::Command,
    stdin: &[u8],
) -> Result<Output, CniError> {
    command.stdin(Stdio::piped()).stdout(Stdio::piped());
    let spawned = crate::process::spawn_retrying(command);
    let program = Path::new(command.get_program()).display();
    let child = spawned.map_err(|e| CniError::internal(format!("failed to run {program}: {e}")))?;
    let (output, _written) = crate::process::wait_feeding(child, stdin);
    output.map_err(|e| CniError::internal(format!("failed to wait for {program}: {e}")))
}

/// Reads a delegate's answer from its success, exit status (for the message when it
/// failed silently) and stdout, the same way for a child and an in-process run.
fn interpret(
    success: bool,
    status: &dyn std::fmt::Display,
    stdout: Vec<u8>,
) -> Result<Vec<u8>, CniError> {
    if success {
        return Ok(stdout);
    }
    if stdout.iter().all(u8::is_ascii_whitespace) {
        return Err(CniError::internal(format!(
            "netplugin failed with no error message: {status}"
        )));
    }
    Err(CniError::from_json(&stdout).unwrap_or_else(|| {
        CniError::internal(format!(
            "netplugin failed but error parsing its diagnostic message {:?}",
            String::from_utf8_lossy(&stdout)
        ))
    }))
}

/// Reads an in-process run's outcome as [`exec_plugin`] reads a child that printed
/// `stdout` and exited with `exit_code` (`exit status: N`, as `ExitStatus` shows it).
pub(crate) fn interpret_outcome(outcome: &Outcome) -> Result<Vec<u8>, CniError> {
    let status = format!("exit status: {}", outcome.exit_code);
    interpret(
        outcome.exit_code == 0,
        &status,
        outcome.stdout.clone().into_bytes(),
    )
}

/// The environment variable that tells an exec'd delegate which plugins are running
/// above it (comma-separated names), so that a loop is seen across processes too.
pub const CHAIN_VAR: &str = "CNI_RS_DELEGATION_CHAIN";

/// Plugins running in this process: its own and in-process delegates (which may run
/// on other threads than the plugin that called them, so this is per process).
static RUNNING: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn running_list() -> std::sync::MutexGuard<'static, Vec<String>> {
    RUNNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Marks `name` as running in this process until the guard is dropped.
pub(crate) fn running(name: &str) -> RunningGuard {
    running_list().push(name.to_owned());
    RunningGuard(name.to_owned())
}

/// See [`running`].
#[derive(Debug)]
pub(crate) struct RunningGuard(String);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        let mut list = running_list();
        if let Some(i) = list.iter().rposition(|n| *n == self.0) {
            list.remove(i);
        }
    }
}

/// The plugins above a delegate about to run: those of the processes that exec'd this
/// one, then those running in this one.
fn chain() -> Vec<String> {
    let mut chain: Vec<String> = std::env::var(CHAIN_VAR)
        .unwrap_or_default()
        .split(',')
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    chain.extend(running_list().iter().cloned());
    chain
}

/// A delegate that is already running above itself would delegate again, forever (in
/// this process: until the stack overflows).
fn refuse_loop(name: &str, chain: &[String]) -> Result<(), CniError> {
    if !chain.iter().any(|n| n == name) {
        return Ok(());
    }
    Err(CniError::invalid_config(format!(
        "delegating to {name:?} would loop: {} is already running ({} -> {name}); \
             check ipam.type",
        name,
        chain.join(" -> ")
    )))
}

/// Runs delegate `name`, found at `plugin`: in-process when `plugin` is this executable
/// and `name` one of its plugins, else exec'd. Says which in the operator's log.
pub fn run_plugin(
    command: Command,
    name: &str,
    plugin: &Path,
    stdin: &[u8],
) -> Result<Vec<u8>, CniError> {
    let cmd = command.as_str();
    let chain = chain();
    refuse_loop(name, &chain)?;
    if let Some(builtin) = inproc::resolve(name, plugin) {
        let outcome = inproc::run(builtin, command, stdin);
        crate::log::info(&format!(
            "IPAM {name} {cmd} ran in-process ({} is this executable)",
            plugin.display()
        ));
        return interpret_outcome(&outcome);
    }
    crate::log::debug(&format!("IPAM {name} {cmd} exec'd: {}", plugin.display()));
    exec_plugin_in_chain(command, plugin, stdin, &chain.join(","))
}

/// Runs delegate `name` for ADD and parses its result (in `config_version` unless it says otherwise).
pub fn delegate_add(
    name: &str,
    path: &[PathBuf],
    stdin: &[u8],
    config_version: &str,
) -> Result<CniResult, CniError> {
    let plugin = find_plugin(name, path)?;
    let out = run_plugin(Command::Add, name, &plugin, stdin)?;
    let value: serde_json::Value = serde_json::from_slice(&out)
        .map_err(|e| CniError::internal(format!("failed to parse result of {name}: {e}")))?;
    CniResult::parse(&value, config_version)
}

/// Runs delegate `name` for a command without a result (DEL, CHECK, STATUS, GC).
pub fn delegate(
    command: Command,
    name: &str,
    path: &[PathBuf],
    stdin: &[u8],
) -> Result<(), CniError> {
    let plugin = find_plugin(name, path)?;
    run_plugin(command, name, &plugin, stdin).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_lookup_errors() {
        assert_eq!(
            find_plugin("", &[]).unwrap_err().msg,
            "no plugin name provided"
        );
        assert_eq!(
            find_plugin("a/b", &[]).unwrap_err().msg,
            "invalid plugin name: a/b"
        );
        let err = find_plugin(
            "nope",
            &[
                PathBuf::from("/nonexistent1"),
                PathBuf::from("/nonexistent2"),
            ],
        )
        .unwrap_err();
        assert_eq!(
            err.msg,
            r#"failed to find plugin "nope" in path [/nonexistent1 /nonexistent2]"#
        );
    }

    #[test]
    fn finds_regular_files_only() {
        // /usr/bin/true exists everywhere; a directory of the same name must be skipped.
        let found = find_plugin("true", &[PathBuf::from("/"), PathBuf::from("/usr/bin")]).unwrap();
        assert_eq!(found, PathBuf::from("/usr/bin/true"));
    }

    #[test]
    fn delegate_errors_pass_through_and_success_returns_stdout() {
        let out = exec_plugin(Command::Add, Path::new("/usr/bin/true"), b"{}").unwrap();
        assert!(out.is_empty());
        let err = exec_plugin(Command::Add, Path::new("/usr/bin/false"), b"{}").unwrap_err();
        assert!(
            err.msg
                .starts_with("netplugin failed with no error message"),
            "{}",
            err.msg
        );
    }
}
