//! Installs the cni-plugins-rs plugin binaries onto a node: the entrypoint of the
//! DaemonSet image (`deploy/Containerfile`) and of an unpacked release tarball.
//!
//! - [`cli`]: the command line.
//! - [`cni_atomic_file`] (used here as `atomic`): replacing a file by writing a temp
//!   file beside it and renaming it over the old one, so a plugin that is running from
//!   the old file keeps running (writing into a running executable fails with "Text
//!   file busy"); the plugin names, one multi-call executable, become hard links of one
//!   file, each name renamed into place.
//! - [`plan`]: what to do with each binary: install, leave unchanged, replace, or refuse
//!   a downgrade of one of ours.
//! - [`conflist`]: the optional network config written into the CNI conf dir.
//! - [`wait`]: sleeping until SIGTERM, for a DaemonSet container with no shell.

pub mod cli;
pub mod conflist;
pub mod plan;
pub mod wait;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use cli::{Command, Options};
use cni_atomic_file as atomic;
use plan::{Action, Existing, PLUGINS};

/// Everything that stops an installation.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The command line is wrong.
    #[error("{0}")]
    Usage(String),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file or directory could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A binary to install does not carry our build stamp.
    #[error("{0} is not a cni-plugins-rs binary (it has no build stamp); not installing it")]
    NotOurs(PathBuf),
    /// Installed binaries of ours are newer than the ones to install.
    #[error(
        "refusing to downgrade: {}; pass --allow-downgrade to install anyway; nothing was changed",
        .0.join("; ")
    )]
    Downgrade(Vec<String>),
    /// The network config to install is not one libcni would load.
    #[error("{path}: {reason}")]
    Conflist {
        /// The config file given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Waiting for SIGTERM failed.
    #[error("cannot wait for a signal: {0}")]
    Signal(#[source] nix::Error),
}

/// The whole program: parse `args`, run, report on stdout/stderr, and the exit status
/// (0 done, 1 failed, 2 bad command line).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    let command = match cli::parse(args) {
        Ok(command) => command,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "cni-installer: {e}\nTry 'cni-installer --help'."
            );
            return ExitCode::from(2);
        }
    };
    let result = match command {
        Command::Help => {
            let _ = stdout.write_all(cli::USAGE.as_bytes());
            Ok(())
        }
        Command::Version => {
            let _ = writeln!(stdout, "cni-installer{}", cni_build_stamp::STAMP);
            Ok(())
        }
        Command::Run(options) => run(&options, &mut stdout),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "cni-installer: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Installs the plugins and the conflist as `options` say, reporting each file on `out`;
/// then, with `--sleep-forever`, waits for SIGTERM or SIGINT.
///
/// Every decision is made before anything is written: a refused downgrade or a bad
/// conflist changes nothing.
pub fn run(options: &Options, out: &mut dyn Write) -> Result<(), InstallError> {
    let source = match &options.source {
        Some(dir) => dir.clone(),
        None => default_source()?,
    };
    let mut binaries = Vec::new();
    for name in PLUGINS {
        let path = source.join(name);
        let bytes = std::fs::read(&path).map_err(|source| InstallError::Read {
            path: path.clone(),
            source,
        })?;
        let Some(stamp) = cni_build_stamp::Stamp::find(&bytes) else {
            return Err(InstallError::NotOurs(path));
        };
        let target = options.dest.join(name);
        let existing = match std::fs::read(&target) {
            Ok(old) => Some(old),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(InstallError::Read {
                    path: target,
                    source,
                });
            }
        };
        let action = plan::decide(&bytes, existing.as_deref());
        binaries.push((name, target, bytes, stamp, action));
    }
    let refused: Vec<String> = binaries
        .iter()
        .filter_map(|(_, target, _, stamp, action)| match action {
            Action::Replace(Existing::Ours(old))
                if plan::is_downgrade(old, stamp) && !options.allow_downgrade =>
            {
                Some(format!(
                    "{} is cni-plugins-rs {old}, newer than {stamp}",
                    target.display()
                ))
            }
            _ => None,
        })
        .collect();
    if !refused.is_empty() {
        return Err(InstallError::Downgrade(refused));
    }
    let conflist = match &options.conflist {
        Some(path) => Some(conflist::load(path)?),
        None => None,
    };

    create_dir(&options.dest)?;
    atomic::remove_stale_temps(&options.dest);
    // The plugins are one multi-call executable: names with the same bytes are
    // installed as hard links of one file (a source of separate files, e.g. stand-ins
    // in tests, gets one file per name).
    for group in same_contents(&binaries) {
        let members: Vec<_> = group.iter().map(|&i| &binaries[i]).collect();
        let all_unchanged = members
            .iter()
            .all(|(_, _, _, _, action)| *action == Action::Unchanged);
        if all_unchanged && one_file(members.iter().map(|(_, target, ..)| target.as_path())) {
            for (_, target, _, stamp, _) in &members {
                let _ = writeln!(out, "{}: unchanged, {stamp}", target.display());
            }
            continue;
        }
        let names: Vec<&str> = members.iter().map(|(name, ..)| *name).collect();
        let (_, first_target, bytes, _, _) = members[0];
        atomic::write_linked(&options.dest, &names, bytes, 0o755).map_err(|source| {
            InstallError::Write {
                path: first_target.clone(),
                source,
            }
        })?;
        for (_, target, _, stamp, action) in &members {
            let done = match action {
                Action::Unchanged => {
                    format!("unchanged, {stamp}; now a hard link of the plugins' one file")
                }
                Action::Install => format!("installed {stamp}"),
                Action::Replace(Existing::NotOurs) => format!(
                    "installed {stamp}, replacing a binary that is not cni-plugins-rs (e.g. the reference plugin)"
                ),
                Action::Replace(Existing::Ours(old)) if plan::is_downgrade(old, stamp) => {
                    format!("downgraded cni-plugins-rs {old} to {stamp}")
                }
                Action::Replace(Existing::Ours(old)) => {
                    format!("replaced cni-plugins-rs {old} with {stamp}")
                }
            };
            let _ = writeln!(out, "{}: {done}", target.display());
        }
    }

    if let Some(conflist) = conflist {
        create_dir(&options.conf_dir)?;
        let target = options.conf_dir.join(&conflist.file_name);
        if std::fs::read(&target).is_ok_and(|old| old == conflist.bytes) {
            let _ = writeln!(out, "{}: unchanged", target.display());
        } else {
            atomic::remove_stale_temps(&options.conf_dir);
            atomic::write(
                &options.conf_dir,
                &conflist.file_name,
                &conflist.bytes,
                0o644,
            )
            .map_err(|source| InstallError::Write {
                path: target.clone(),
                source,
            })?;
            let _ = writeln!(out, "{}: written", target.display());
        }
    }

    if options.sleep_forever {
        let termination = wait::Termination::block().map_err(InstallError::Signal)?;
        let _ = writeln!(out, "installed; sleeping until SIGTERM");
        let _ = out.flush();
        let signal = termination.wait().map_err(InstallError::Signal)?;
        let _ = writeln!(out, "{signal}: exiting");
    }
    Ok(())
}

/// The directory holding this executable: in the image and in an unpacked release
/// tarball, the plugins lie beside the installer.
fn default_source() -> Result<PathBuf, InstallError> {
    let exe = std::env::current_exe().map_err(|source| InstallError::Read {
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    Ok(exe
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/")))
}

/// Indices of `binaries` grouped by identical contents, in first-seen order.
fn same_contents<N, T, S, A>(binaries: &[(N, T, Vec<u8>, S, A)]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, (_, _, bytes, _, _)) in binaries.iter().enumerate() {
        match groups.iter_mut().find(|g| binaries[g[0]].2 == *bytes) {
            Some(group) => group.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// Whether all `paths` name one file (the same device and inode).
fn one_file<'a>(mut paths: impl Iterator<Item = &'a std::path::Path>) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let id = |p: &std::path::Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let Some(first) = paths.next().and_then(id) else {
        return false;
    };
    paths.all(|p| id(p) == Some(first))
}

fn create_dir(dir: &std::path::Path) -> Result<(), InstallError> {
    std::fs::create_dir_all(dir).map_err(|source| InstallError::Write {
        path: dir.to_path_buf(),
        source,
    })
}
