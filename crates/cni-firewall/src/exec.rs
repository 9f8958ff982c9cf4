//! Running the firewall tools (`iptables-restore`, `iptables-save`).
//!
//! Programs are started with an argument vector, never through a shell, and
//! rules travel on stdin so that no user-supplied text is ever interpreted by a
//! shell. The child inherits the calling *thread's* network namespace, which
//! is what lets callers (and the tests) act on a namespace they entered.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// Where the tools live on common distributions. Runtimes often start
/// plugins with a minimal PATH that lacks the sbin directories, so these are
/// searched after PATH.
const FALLBACK_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// Finds `program` in PATH, then in [`FALLBACK_DIRS`].
pub(crate) fn locate(program: &str) -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    from_path
        .into_iter()
        .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Runs `program` with `args`, feeding `stdin` if given, and returns its
/// stdout. `target` says what the call works on (for error messages).
///
/// A missing program is reported as [`Error::ProgramNotFound`] so that
/// teardown paths can treat "tool not installed" as "nothing to remove".
pub(crate) fn run(
    program: &str,
    args: &[&str],
    stdin: Option<&[u8]>,
    target: &str,
) -> Result<String> {
    let path = locate(program).ok_or_else(|| Error::ProgramNotFound {
        program: program.to_owned(),
        searched: FALLBACK_DIRS.join(":"),
    })?;
    let spawn_err = |cause| Error::Spawn {
        program: program.to_owned(),
        target: target.to_owned(),
        cause,
    };
    let child = Command::new(&path)
        .args(args)
        // Error texts are matched ("No such file or directory"); keep them
        // untranslated.
        .env("LC_ALL", "C")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;

    let (output, written) = cni_protocol::process::wait_feeding(child, stdin.unwrap_or_default());
    let output = output.map_err(spawn_err)?;
    if !output.status.success() {
        return Err(Error::Command {
            program: program.to_owned(),
            target: target.to_owned(),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    // A broken pipe only matters if the program claimed success anyway.
    written.map_err(spawn_err)?;
    String::from_utf8(output.stdout).map_err(|e| Error::Parse {
        program: program.to_owned(),
        target: target.to_owned(),
        detail: format!("stdout is not UTF-8: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_programs_outside_path() {
        // `sh` exists on every system we build on; the fallback list must
        // find it even when PATH does not help.
        assert!(locate("sh").is_some());
        assert!(locate("surely-not-a-program-cni").is_none());
    }

    #[test]
    fn run_returns_stdout_and_feeds_stdin() {
        let out = run("cat", &[], Some(b"rules\n"), "test").unwrap();
        assert_eq!(out, "rules\n");
    }

    #[test]
    fn run_reports_stderr_and_status() {
        let err = run("ls", &["/surely/not/there"], None, "table x").unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("ls failed on table x (exit status: "),
            "{text}"
        );
        assert!(text.contains("/surely/not/there"), "{text}");
    }

    #[test]
    fn run_reports_missing_program() {
        let err = run("surely-not-a-program-cni", &[], None, "x").unwrap_err();
        assert!(matches!(err, Error::ProgramNotFound { .. }));
    }
}
