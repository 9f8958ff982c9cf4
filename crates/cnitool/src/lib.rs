//! cnitool: attach a network namespace to a CNI network by hand, as a container runtime
//! would through libcni. Command-compatible with the CNI project's Go cnitool
//! (`cnitool add|check|del|gc|status <network> <netns>`), and sharing libcni's result
//! cache, so attachments made by a runtime can be checked and deleted here and the other
//! way round.
//!
//! - [`cli`]: the command line and help texts.
//! - [`config`]: finding and parsing the network's config as libcni does.
//! - [`network`]: the list operations (plugin order, stdin, prevResult, GC, STATUS).
//! - [`exec`]: running one plugin.
//! - [`cache`]: libcni's result cache files.

pub mod cache;
pub mod cli;
pub mod config;
pub mod error;
pub mod exec;
pub mod network;

pub use error::Error;

use cli::{Invocation, Operation, Request};
use network::{Cni, GcAttachment, RuntimeConf};
use serde_json::{Map, Value};
use sha2::{Digest, Sha512};
use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

/// Where network configs are read from when `NETCONFPATH` is not set.
pub const DEFAULT_NET_DIR: &str = "/etc/cni/net.d";

/// The process entry point: runs the command line and maps the outcome to an exit code
/// (0, or 1 with `Error: <message>` on stderr, as the Go tool).
pub fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    let args: Result<Vec<String>, OsString> = args.map(OsString::into_string).collect();
    let outcome = match args {
        Ok(args) => run(&args, &|key| std::env::var(key).ok()),
        Err(bad) => Err(Error::Usage(format!("argument {bad:?} is not valid UTF-8"))),
    };
    match outcome {
        Ok(stdout) => {
            let mut out = std::io::stdout().lock();
            if out
                .write_all(stdout.as_bytes())
                .and_then(|()| out.flush())
                .is_err()
            {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "Error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one command line with the environment given by `env`; returns what goes to
/// stdout (the ADD result, or a help text).
pub fn run(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<String, Error> {
    let request = match cli::parse(args)? {
        Invocation::Help(text) => return Ok(text),
        Invocation::Run(request) => request,
    };
    let var = |key: &str| env(key).unwrap_or_default();
    let net_dir = match var("NETCONFPATH") {
        d if d.is_empty() => PathBuf::from(DEFAULT_NET_DIR),
        d => PathBuf::from(d),
    };
    let list = config::load(&net_dir, &request.network)?;
    let capability_args = parse_capability_args(&var("CAP_ARGS"))?;
    let args = parse_cni_args(&var("CNI_ARGS"))?;
    let ifname = request
        .ifname
        .clone()
        .filter(|i| !i.is_empty())
        .or_else(|| env("CNI_IFNAME").filter(|i| !i.is_empty()))
        .unwrap_or_else(|| "eth0".to_string());
    let cache_dir = match var("CNI_CACHE_DIR") {
        d if d.is_empty() => PathBuf::from(cache::DEFAULT_CACHE_DIR),
        d => PathBuf::from(d),
    };
    let cni = Cni {
        path: exec::PluginPath::from_env(&var("CNI_PATH")),
        cache_dir,
    };
    let netns = if request.netns.is_empty() {
        String::new()
    } else {
        absolute(&request.netns)?
    };
    let rt = RuntimeConf {
        container_id: container_id(&netns),
        netns,
        ifname,
        args,
        capability_args,
    };
    match request.operation {
        Operation::Add => {
            let result = cni.add(&list, &rt)?;
            // Printed in its own version, 4-space indented, no newline: as `result.Print()`.
            result
                .to_json(&result.cni_version)
                .map_err(|source| Error::Plugin {
                    plugin: list
                        .plugins
                        .last()
                        .map(config::PluginConfig::description)
                        .unwrap_or_default(),
                    command: "add",
                    source,
                })
        }
        Operation::Check => cni.check(&list, &rt).map(|()| String::new()),
        Operation::Del => cni.del(&list, &rt).map(|()| String::new()),
        Operation::Status => cni.status(&list).map(|()| String::new()),
        Operation::Gc => {
            let valid = valid_attachments(&request, &rt.ifname)?;
            cni.gc(&list, valid.as_deref()).map(|()| String::new())
        }
    }
}

/// The attachments `--valid` and `--valid-netns` name; `None` when neither was given.
fn valid_attachments(request: &Request, ifname: &str) -> Result<Option<Vec<GcAttachment>>, Error> {
    if !request.has_valid_list() {
        return Ok(None);
    }
    let mut valid: Vec<GcAttachment> = request
        .valid
        .iter()
        .map(|(id, ifname)| GcAttachment {
            container_id: id.clone(),
            ifname: ifname.clone(),
        })
        .collect();
    for netns in &request.valid_netns {
        valid.push(GcAttachment {
            container_id: container_id(&absolute(netns)?),
            ifname: ifname.to_string(),
        });
    }
    Ok(Some(valid))
}

/// The Go tool's container id for a netns path: `cnitool-` and the first 20 hex digits
/// (10 bytes) of the SHA-512 of the absolute path.
pub fn container_id(netns: &str) -> String {
    let digest = Sha512::digest(netns.as_bytes());
    let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("cnitool-{hex}")
}

/// Go's `filepath.Abs`: joined to the working directory if relative, then cleaned
/// lexically (no symlinks resolved), so the id matches the Go tool's for the same text.
pub fn absolute(path: &str) -> Result<String, Error> {
    let joined = if Path::new(path).is_absolute() {
        PathBuf::from(path)
    } else {
        std::env::current_dir()
            .map_err(|e| Error::Environment(format!("cannot resolve {path:?}: {e}")))?
            .join(path)
    };
    let mut parts: Vec<String> = Vec::new();
    for component in joined.components() {
        match component {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// `CNI_ARGS` as the Go tool splits it: `K=V` pairs separated by `;`, neither side empty.
pub fn parse_cni_args(text: &str) -> Result<Vec<(String, String)>, Error> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(';')
        .map(|pair| match pair.split('=').collect::<Vec<_>>()[..] {
            [k, v] if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(Error::Environment(format!(
                "invalid CNI_ARGS pair {pair:?}"
            ))),
        })
        .collect()
}

/// `CAP_ARGS`: a JSON object, empty when unset.
pub fn parse_capability_args(text: &str) -> Result<Map<String, Value>, Error> {
    if text.is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(Value::Null) => Ok(Map::new()),
        Ok(other) => Err(Error::Environment(format!(
            "CAP_ARGS must be a JSON object, got {other}"
        ))),
        Err(e) => Err(Error::Environment(format!("invalid CAP_ARGS: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_id_is_the_go_tools() {
        // printf /var/run/netns/test | sha512sum | cut -c1-20
        assert_eq!(
            container_id("/var/run/netns/test"),
            "cnitool-7b8a61d5d8e94d07cbe4"
        );
        assert_eq!(
            container_id("/var/run/netns/pod1"),
            "cnitool-bea13e247008fe5f4a37"
        );
    }

    #[test]
    fn paths_are_made_absolute_and_clean_like_go() {
        assert_eq!(
            absolute("/var/run/netns/../netns//x/.").unwrap(),
            "/var/run/netns/x"
        );
        assert_eq!(absolute("/..").unwrap(), "/");
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            absolute("a/b").unwrap(),
            format!("{}/a/b", cwd.display()).replace("//", "/")
        );
    }

    #[test]
    fn cni_args_as_the_go_tool() {
        assert_eq!(
            parse_cni_args("A=1;B=two").unwrap(),
            [("A".into(), "1".into()), ("B".into(), "two".into())]
        );
        assert!(parse_cni_args("").unwrap().is_empty());
        for (text, pair) in [
            ("A", "A"),
            ("A=", "A="),
            ("=1", "=1"),
            ("A=1=2", "A=1=2"),
            ("A=1;", ""),
        ] {
            assert_eq!(
                parse_cni_args(text).unwrap_err().to_string(),
                format!("invalid CNI_ARGS pair {pair:?}"),
                "{text}"
            );
        }
    }

    #[test]
    fn capability_args_must_be_an_object() {
        let caps = parse_capability_args(r#"{"portMappings":[{"hostPort":80}]}"#).unwrap();
        assert!(caps.contains_key("portMappings"));
        assert!(parse_capability_args("").unwrap().is_empty());
        assert!(parse_capability_args("[1]").is_err());
        assert!(parse_capability_args("{").is_err());
    }

    #[test]
    fn configuration_errors_come_before_environment_errors() {
        let env = |key: &str| match key {
            "NETCONFPATH" => Some("/nonexistent-cnitool-dir".to_string()),
            "CNI_ARGS" => Some("bad".to_string()),
            _ => None,
        };
        let args: Vec<String> = ["add", "net", "/x"].map(String::from).to_vec();
        assert_eq!(
            run(&args, &env).unwrap_err().to_string(),
            "no net configurations found in /nonexistent-cnitool-dir"
        );
        let help: Vec<String> = vec!["--help".into()];
        assert!(run(&help, &env).unwrap().starts_with("CNI Tool"));
    }
}
