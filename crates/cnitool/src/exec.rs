//! Running one plugin as libcni's `invoke` package does: found in `CNI_PATH`, our whole
//! environment plus the six `CNI_*` variables, the config on stdin; stdout is the result
//! or the error JSON, stderr is passed on.

use cni_protocol::delegate::{exec_with_stdin, find_plugin};
use cni_protocol::{CniError, CniResult, Command, ErrorCode};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

/// The `CNI_*` variables of one call.
#[derive(Debug, Clone, Default)]
pub struct Args<'a> {
    /// `CNI_CONTAINERID` (empty for GC and STATUS).
    pub container_id: &'a str,
    /// `CNI_NETNS`.
    pub netns: &'a str,
    /// `CNI_IFNAME`.
    pub ifname: &'a str,
    /// `CNI_ARGS` as pairs, joined `K=V;K=V`.
    pub plugin_args: &'a [(String, String)],
}

/// Where plugins are looked up and what `CNI_PATH` they are given.
#[derive(Debug, Clone)]
pub struct PluginPath {
    dirs: Vec<PathBuf>,
}

impl PluginPath {
    /// Splits a `CNI_PATH` value as Go's `filepath.SplitList` (empty means no directory).
    pub fn from_env(value: &str) -> Self {
        let dirs = if value.is_empty() {
            Vec::new()
        } else {
            value.split(':').map(PathBuf::from).collect()
        };
        Self { dirs }
    }

    /// The directories, in lookup order.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The value passed as `CNI_PATH` to plugins.
    pub fn joined(&self) -> String {
        let dirs: Vec<String> = self
            .dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect();
        dirs.join(":")
    }

    /// The binary for plugin type `name`.
    pub fn find(&self, name: &str) -> Result<PathBuf, CniError> {
        if self.dirs.is_empty() {
            return Err(CniError::internal("no paths provided"));
        }
        find_plugin(name, &self.dirs)
    }
}

/// Runs `plugin` for `command` with `stdin`; returns its stdout, or the error it reported
/// (its error JSON; else a message built from its stderr and exit status, as libcni does).
pub fn exec_plugin(
    plugin: &Path,
    command: Command,
    args: &Args<'_>,
    path: &PluginPath,
    stdin: &[u8],
) -> Result<Vec<u8>, CniError> {
    let cni_args: Vec<String> = args
        .plugin_args
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    // Stdin is fed, and stdout and stderr drained, concurrently, so that neither a
    // plugin that does not read its stdin nor one that writes much to stderr can block
    // us.
    let output = exec_with_stdin(
        std::process::Command::new(plugin)
            .env("CNI_COMMAND", command.as_str())
            .env("CNI_CONTAINERID", args.container_id)
            .env("CNI_NETNS", args.netns)
            .env("CNI_ARGS", cni_args.join(";"))
            .env("CNI_IFNAME", args.ifname)
            .env("CNI_PATH", path.joined())
            .stderr(Stdio::piped()),
        stdin,
    )?;
    let (status, stdout, stderr) = (output.status, output.stdout, output.stderr);
    if status.success() {
        // libcni passes a successful plugin's stderr on to its own.
        let _ = std::io::stderr().write_all(&stderr);
        return Ok(stdout);
    }
    Err(plugin_error(status, &stdout, &stderr))
}

/// libcni's `pluginErr`: the plugin's error JSON, or what can be said without one.
fn plugin_error(status: ExitStatus, stdout: &[u8], stderr: &[u8]) -> CniError {
    let status = exit_text(status);
    if stdout.is_empty() {
        return if stderr.is_empty() {
            CniError::internal(format!("netplugin failed with no error message: {status}"))
        } else {
            CniError::internal(format!(
                "netplugin failed: {:?}: {status}",
                String::from_utf8_lossy(stderr)
            ))
        };
    }
    let parsed: Result<Value, _> = serde_json::from_slice(stdout);
    match parsed {
        Ok(Value::Object(obj)) => {
            let text = |key: &str| {
                obj.get(key)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let code = obj
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|c| u32::try_from(c).ok())
                .unwrap_or(0);
            CniError::new(ErrorCode(code), text("msg")).with_details(text("details"))
        }
        Ok(_) | Err(_) => CniError::internal(format!(
            "netplugin failed but error parsing its diagnostic message {:?}",
            String::from_utf8_lossy(stdout)
        )),
    }
}

/// Go's text for a failed process: `exit status 1`, `signal: 9`.
fn exit_text(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("signal: {signal}"),
        (None, None) => status.to_string(),
    }
}

/// libcni's `ExecPluginWithResult` after the run: parses the ADD result in its own
/// `cniVersion`, or the config's when it names none.
pub fn parse_result(config_version: &str, stdout: &[u8]) -> Result<CniResult, CniError> {
    let value: Value = serde_json::from_slice(stdout)
        .map_err(|e| CniError::internal(format!("failed to unmarshal raw result: {e}")))?;
    let value = match value {
        Value::Null => Value::Object(serde_json::Map::new()),
        v => v,
    };
    // An empty config version is 0.1.0 in the spec's reading.
    let default = if config_version.is_empty() {
        "0.1.0"
    } else {
        config_version
    };
    CniResult::parse(&value, default)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: i32) -> ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn error_messages_as_libcni() {
        let err = plugin_error(status(1), b"", b"");
        assert_eq!(
            err.msg,
            "netplugin failed with no error message: exit status 1"
        );
        let err = plugin_error(status(2), b"", b"boom\n");
        assert_eq!(err.msg, "netplugin failed: \"boom\\n\": exit status 2");
        let err = plugin_error(
            status(1),
            br#"{"cniVersion":"1.0.0","code":7,"msg":"bad","details":"why"}"#,
            b"",
        );
        assert_eq!(err.code, ErrorCode(7));
        assert_eq!(err.to_string(), "bad; why");
        let err = plugin_error(status(1), b"oops", b"");
        assert_eq!(
            err.msg,
            "netplugin failed but error parsing its diagnostic message \"oops\""
        );
    }

    #[test]
    fn cni_path_is_split_and_joined_with_colons() {
        let path = PluginPath::from_env("/a:/b");
        assert_eq!(path.dirs(), [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(path.joined(), "/a:/b");
        let empty = PluginPath::from_env("");
        assert!(empty.dirs().is_empty());
        assert_eq!(empty.find("bridge").unwrap_err().msg, "no paths provided");
    }

    #[test]
    fn runs_a_program_with_the_cni_variables() {
        let dir = std::env::temp_dir().join(format!("cnitool-exec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("echoenv");
        std::fs::write(
            &script,
            "#!/bin/sh\nprintf '{\"cmd\":\"%s\",\"id\":\"%s\",\"args\":\"%s\",\"path\":\"%s\",\"in\":%s}' \"$CNI_COMMAND\" \"$CNI_CONTAINERID\" \"$CNI_ARGS\" \"$CNI_PATH\" \"$(cat)\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = PluginPath::from_env(&dir.to_string_lossy());
        let found = path.find("echoenv").unwrap();
        let pairs = [("A".to_string(), "1".to_string()), ("B".into(), "2".into())];
        let out = exec_plugin(
            &found,
            Command::Check,
            &Args {
                container_id: "c1",
                netns: "/x",
                ifname: "eth0",
                plugin_args: &pairs,
            },
            &path,
            br#"{"k":1}"#,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(v["cmd"], "CHECK");
        assert_eq!(v["id"], "c1");
        assert_eq!(v["args"], "A=1;B=2");
        assert_eq!(v["path"], dir.to_string_lossy().as_ref());
        assert_eq!(v["in"]["k"], 1);
    }

    #[test]
    fn result_version_defaults_to_the_config_version() {
        let r = parse_result(
            "0.4.0",
            br#"{"ips":[{"version":"4","address":"10.0.0.2/24"}]}"#,
        )
        .unwrap();
        assert_eq!(r.cni_version, "0.4.0");
        let r = parse_result("0.4.0", br#"{"cniVersion":"1.0.0","ips":[]}"#).unwrap();
        assert_eq!(r.cni_version, "1.0.0");
        assert!(
            parse_result("1.0.0", b"nope")
                .unwrap_err()
                .msg
                .starts_with("failed to unmarshal raw result")
        );
    }
}
