//! The command line: a handful of long options, parsed by hand (no parser crate is worth
//! its weight here). `--opt value` and `--opt=value` are both accepted.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::InstallError;

/// `--help` text.
pub const USAGE: &str = "\
Usage: cni-installer [OPTIONS]

Installs the cni-plugins-rs binaries (bridge, host-local, loopback, portmap, bandwidth: one multi-call
executable, installed as hard links of one file) into a CNI bin directory. The file is
written beside its targets and each name is renamed over its target, so a plugin that
is running at that moment keeps running. Names that already are that file are left
alone; one of ours that is newer is not replaced unless --allow-downgrade is given;
anything else (the reference Go plugins, an unknown file) is replaced.

Options:
  --source DIR        where the binaries to install are
                      (default: the directory holding cni-installer)
  --dest DIR          the CNI bin directory to install into (default: /opt/cni/bin)
  --allow-downgrade   replace cni-plugins-rs binaries that are newer than these
  --conflist FILE     also write FILE (a .conflist, .conf or .json network config)
                      into the conf dir, atomically, under its own file name
  --conf-dir DIR      the CNI conf directory for --conflist (default: /etc/cni/net.d)
  --sleep-forever     after installing, sleep until SIGTERM or SIGINT, then exit 0
                      (the main container of a DaemonSet, which has no shell)
  --version           print the version and build commit
  --help              print this help
";

/// What was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `--help`.
    Help,
    /// `--version`.
    Version,
    /// Install.
    Run(Options),
}

/// Options of an installation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `--source`; None means the installer's own directory.
    pub source: Option<PathBuf>,
    /// `--dest`.
    pub dest: PathBuf,
    /// `--allow-downgrade`.
    pub allow_downgrade: bool,
    /// `--conflist`.
    pub conflist: Option<PathBuf>,
    /// `--conf-dir`.
    pub conf_dir: PathBuf,
    /// `--sleep-forever`.
    pub sleep_forever: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            source: None,
            dest: PathBuf::from("/opt/cni/bin"),
            allow_downgrade: false,
            conflist: None,
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            sleep_forever: false,
        }
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, InstallError> {
    let usage = InstallError::Usage;
    let mut options = Options::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let text = arg
            .to_str()
            .ok_or_else(|| usage(format!("unknown argument {arg:?}")))?;
        let (flag, inline) = match text.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(OsString::from(value))),
            _ => (text, None),
        };
        let takes_value = matches!(flag, "--source" | "--dest" | "--conflist" | "--conf-dir");
        if !takes_value && inline.is_some() {
            return Err(usage(format!("{flag} takes no value")));
        }
        let mut value = || -> Result<PathBuf, InstallError> {
            let value = match inline.clone() {
                Some(v) => v,
                None => args
                    .next()
                    .ok_or_else(|| usage(format!("{flag} needs a value")))?,
            };
            if value.is_empty() {
                return Err(usage(format!("{flag} needs a non-empty value")));
            }
            Ok(PathBuf::from(value))
        };
        match flag {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" => return Ok(Command::Version),
            "--source" => options.source = Some(value()?),
            "--dest" => options.dest = value()?,
            "--conflist" => options.conflist = Some(value()?),
            "--conf-dir" => options.conf_dir = value()?,
            "--allow-downgrade" => options.allow_downgrade = true,
            "--sleep-forever" => options.sleep_forever = true,
            other => return Err(usage(format!("unknown argument {other:?}"))),
        }
    }
    Ok(Command::Run(options))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<Command, String> {
        parse(args.iter().map(OsString::from)).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_the_standard_cni_dirs() {
        assert_eq!(parse_strs(&[]), Ok(Command::Run(Options::default())));
        let defaults = Options::default();
        assert_eq!(defaults.dest, PathBuf::from("/opt/cni/bin"));
        assert_eq!(defaults.conf_dir, PathBuf::from("/etc/cni/net.d"));
    }

    #[test]
    fn every_option_in_both_spellings() {
        let want = Command::Run(Options {
            source: Some("/src".into()),
            dest: "/host/opt/cni/bin".into(),
            allow_downgrade: true,
            conflist: Some("/cfg/10-net.conflist".into()),
            conf_dir: "/host/etc/cni/net.d".into(),
            sleep_forever: true,
        });
        let spaced = parse_strs(&[
            "--source",
            "/src",
            "--dest",
            "/host/opt/cni/bin",
            "--allow-downgrade",
            "--conflist",
            "/cfg/10-net.conflist",
            "--conf-dir",
            "/host/etc/cni/net.d",
            "--sleep-forever",
        ]);
        let inline = parse_strs(&[
            "--source=/src",
            "--dest=/host/opt/cni/bin",
            "--allow-downgrade",
            "--conflist=/cfg/10-net.conflist",
            "--conf-dir=/host/etc/cni/net.d",
            "--sleep-forever",
        ]);
        assert_eq!(spaced, Ok(want.clone()));
        assert_eq!(inline, Ok(want));
    }

    #[test]
    fn help_and_version_win() {
        assert_eq!(parse_strs(&["--dest", "/x", "--help"]), Ok(Command::Help));
        assert_eq!(parse_strs(&["-h"]), Ok(Command::Help));
        assert_eq!(parse_strs(&["--version"]), Ok(Command::Version));
    }

    #[test]
    fn bad_command_lines_are_refused_with_a_reason() {
        for (args, want) in [
            (&["--dest"][..], "--dest needs a value"),
            (&["--dest="], "--dest needs a non-empty value"),
            (&["--force"], "unknown argument \"--force\""),
            (&["install"], "unknown argument \"install\""),
            (&["--sleep-forever=yes"], "--sleep-forever takes no value"),
        ] {
            assert_eq!(parse_strs(args), Err(want.to_owned()), "{args:?}");
        }
    }
}
