//! Shared pieces of the host-local black-box tests (`host_local*.rs`): the binaries
//! (ours, built once, and the reference), running them with env + stdin, config
//! builders, readers of the state directory, and [`MountNs`], a private mount namespace
//! in which the plugin runs over a read-only, full or otherwise doctored file system
//! without the machine seeing any of it.
//!
//! Each test file includes this with `mod host_local_support;`; not every file uses
//! every helper.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cni_blackbox::{Outcome, TempDir, in_ci, workspace_root};
use serde_json::{Value, json};

/// A netns path that does not exist: host-local must not care.
pub const NO_NETNS: &str = "/var/run/netns/cni-host-local-test-none";
/// The reference binary the interop tests run.
pub const REFERENCE: &str = "/usr/lib/cni/host-local";
/// Bounds a hung plugin; it measures nothing.
pub const TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// Running the binary
// ---------------------------------------------------------------------------------------

/// Our `host-local`: from `CNI_BLACKBOX_BIN_DIR` if set, else the harness's build (the
/// multi-call binary under the name `host-local`).
pub fn ours() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| cni_blackbox::plugin_path("host-local"))
}

/// The reference binary, or `None` (skip) when it is not installed; under CI a missing
/// reference is a failure.
pub fn reference() -> Option<PathBuf> {
    let path = PathBuf::from(REFERENCE);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        !in_ci(),
        "{REFERENCE} missing: install containernetworking-plugins"
    );
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {REFERENCE} not installed (apt-get install containernetworking-plugins)"
    );
    None
}

/// One invocation: `vars` on top of a clean environment (only `PATH` inherited).
pub fn run(bin: &Path, vars: &[(&str, &str)], stdin: &str) -> Outcome {
    run_prefixed(&[], bin, vars, stdin)
}

/// [`run`] with `prefix` (a program and its arguments, e.g. `nsenter ... --`) started
/// in the plugin's place, which then executes the plugin.
pub fn run_prefixed(prefix: &[String], bin: &Path, vars: &[(&str, &str)], stdin: &str) -> Outcome {
    let mut cmd = match prefix.split_first() {
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(bin);
            cmd
        }
        None => Command::new(bin),
    };
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(vars.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let described: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    let invocation = format!(
        "{} {} {} <<< {stdin}",
        described.join(" "),
        prefix.join(" "),
        bin.display()
    );
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("start {invocation}: {e}"));
    if let Some(mut pipe) = child.stdin.take() {
        let _ = pipe.write_all(stdin.as_bytes());
    }
    // Output is small (one JSON object), so reading after exit cannot dead-lock; the
    // loop only bounds a hang.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if child.try_wait().expect("wait").is_some() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if child.try_wait().expect("wait").is_none() {
        let _ = child.kill();
        panic!("timed out: {invocation}");
    }
    let out = child.wait_with_output().expect("collect output");
    Outcome {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        invocation,
    }
}

/// ADD/DEL/CHECK of one attachment.
pub fn attach(bin: &Path, command: &str, config: &Value, id: &str, ifname: &str) -> Outcome {
    attach_with(bin, command, config, id, ifname, &[])
}

pub fn attach_with(
    bin: &Path,
    command: &str,
    config: &Value,
    id: &str,
    ifname: &str,
    extra: &[(&str, &str)],
) -> Outcome {
    attach_prefixed(&[], bin, command, config, id, ifname, extra)
}

/// [`attach_with`] started through `prefix` (see [`run_prefixed`]).
pub fn attach_prefixed(
    prefix: &[String],
    bin: &Path,
    command: &str,
    config: &Value,
    id: &str,
    ifname: &str,
    extra: &[(&str, &str)],
) -> Outcome {
    let dir = bin.parent().and_then(Path::to_str).unwrap_or("/");
    let mut vars = vec![
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", id),
        ("CNI_NETNS", NO_NETNS),
        ("CNI_IFNAME", ifname),
        ("CNI_PATH", dir),
    ];
    vars.extend_from_slice(extra);
    run_prefixed(prefix, bin, &vars, &config.to_string())
}

/// STATUS or GC (no attachment variables).
pub fn network_command(bin: &Path, command: &str, config: &Value) -> Outcome {
    network_command_with(bin, command, config, &[])
}

/// [`network_command`] with extra variables.
pub fn network_command_with(
    bin: &Path,
    command: &str,
    config: &Value,
    extra: &[(&str, &str)],
) -> Outcome {
    network_command_prefixed(&[], bin, command, config, extra)
}

/// [`network_command_with`] started through `prefix` (see [`run_prefixed`]).
pub fn network_command_prefixed(
    prefix: &[String],
    bin: &Path,
    command: &str,
    config: &Value,
    extra: &[(&str, &str)],
) -> Outcome {
    let dir = bin.parent().and_then(Path::to_str).unwrap_or("/");
    let mut vars = vec![("CNI_COMMAND", command), ("CNI_PATH", dir)];
    vars.extend_from_slice(extra);
    run_prefixed(prefix, bin, &vars, &config.to_string())
}

// ---------------------------------------------------------------------------------------
// Configs and state
// ---------------------------------------------------------------------------------------

/// A network config: `ipam` gets `dataDir` set to `data`.
pub fn net(name: &str, version: Option<&str>, data: &TempDir, mut ipam: Value) -> Value {
    ipam["type"] = json!("host-local");
    ipam["dataDir"] = json!(data.path_str());
    let mut config = json!({"name": name, "type": "host-local", "ipam": ipam});
    if let Some(v) = version {
        config["cniVersion"] = json!(v);
    }
    config
}

/// A dual-stack config: 10.9.0.0/24 + fd00:9::/64 with two routes.
pub fn dual_stack(name: &str, version: Option<&str>, data: &TempDir) -> Value {
    let conf = load_conf("host-local-dualstack.json");
    net(name, version, data, conf["ipam"].clone())
}

pub fn single(name: &str, version: &str, data: &TempDir, subnet: &str) -> Value {
    net(
        name,
        Some(version),
        data,
        json!({"ranges": [[{"subnet": subnet}]]}),
    )
}

pub fn load_conf(file: &str) -> Value {
    let path = workspace_root().join("conf").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// File name → content of the network's state directory.
pub fn state(data: &TempDir, name: &str) -> BTreeMap<String, Vec<u8>> {
    let dir = data.path().join(name);
    let Ok(read) = std::fs::read_dir(&dir) else {
        return BTreeMap::new();
    };
    read.map(|e| {
        let e = e.expect("dir entry");
        let content = if e.file_type().expect("type").is_file() {
            std::fs::read(e.path()).expect("read state file")
        } else {
            Vec::new()
        };
        (e.file_name().to_string_lossy().into_owned(), content)
    })
    .collect()
}

/// Only the reservation files (names that parse as addresses).
pub fn reservations(data: &TempDir, name: &str) -> BTreeMap<String, String> {
    cni_blackbox::ipam::reservations(&data.path().join(name))
}

pub fn addresses(outcome: &Outcome) -> Vec<String> {
    outcome.assert_success();
    outcome.json()["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("no ips:\n{outcome}"))
        .iter()
        .map(|ip| ip["address"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Names of the state directory's temp files (ours start with `.cni-tmp.`).
pub fn temp_files(data: &TempDir, name: &str) -> Vec<String> {
    state(data, name)
        .into_keys()
        .filter(|n| n.starts_with('.'))
        .collect()
}

// ---------------------------------------------------------------------------------------
// A private mount namespace
// ---------------------------------------------------------------------------------------

/// A mount namespace of our own, held by a `sleep` process: mounts made in it (a small
/// tmpfs, a read-only bind mount, a file bound over `/proc/sys/kernel/random/boot_id`)
/// are seen only by processes entered into it with [`MountNs::prefix`], never by the
/// machine (propagation private). Dropping it kills the holder, and the namespace and
/// its mounts go with it.
pub struct MountNs {
    holder: Child,
}

impl MountNs {
    /// Starts the namespace and runs `setup` (a `sh -c` script, `$1`... = `args`) in it
    /// before the holder sleeps; panics with the script's stderr if it fails.
    pub fn new(setup: &str, args: &[&Path]) -> Self {
        let script = format!("{setup}\necho ready\nexec sleep infinity");
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-ec"])
            .arg(&script)
            .arg("sh")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run unshare (util-linux)");
        let mut line = String::new();
        if let Some(stdout) = holder.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        if line.trim() != "ready" {
            let _ = holder.kill();
            let out = holder.wait_with_output().ok();
            panic!(
                "private mount namespace not set up ({setup}): {:?}",
                out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
            );
        }
        Self { holder }
    }

    /// What runs a program inside the namespace: `nsenter` (which, entering only a mount
    /// namespace, executes the program in its own place, so its exit status is the
    /// program's).
    pub fn prefix(&self) -> Vec<String> {
        vec![
            "nsenter".into(),
            "-t".into(),
            self.holder.id().to_string(),
            "-m".into(),
            "--".into(),
        ]
    }

    /// Runs a shell script inside the namespace; panics if it fails.
    pub fn sh(&self, script: &str, args: &[&Path]) {
        let out = Command::new("nsenter")
            .args(["-t", &self.holder.id().to_string(), "-m", "--", "sh", "-ec"])
            .arg(script)
            .arg("sh")
            .args(args)
            .output()
            .expect("run nsenter (util-linux)");
        assert!(
            out.status.success(),
            "in the mount namespace, {script} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `path` as seen from inside the namespace (through the holder's root), to read
    /// what the plugin left there.
    pub fn inside(&self, path: &Path) -> PathBuf {
        let relative = path.strip_prefix("/").unwrap_or(path);
        PathBuf::from(format!("/proc/{}/root", self.holder.id())).join(relative)
    }
}

impl Drop for MountNs {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}
