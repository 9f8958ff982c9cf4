//! Running one plugin command the way a runtime does, and looking at what came back.
//!
//! The plugin runs inside the test's "host" namespace (`ip netns exec <host> <binary>`),
//! never in the machine's root namespace, with an environment that holds only `PATH` and
//! the `CNI_*` variables the test chose: a stray `CNI_ARGS` or `CNI_NETNS_OVERRIDE` from
//! the machine must not change what a test observes.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::bins::{bin_dir, plugin_path};
use crate::netns::Netns;

/// How long one plugin call may take before the test fails. Generous: it bounds a hang
/// (e.g. a lock never released), it does not measure speed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Builder for one plugin invocation. With [`Plugin::new`], `CNI_PATH` defaults to
/// [`bin_dir`]; every other variable is unset until a method sets it.
#[derive(Debug, Clone)]
pub struct Plugin<'a> {
    binary: PathBuf,
    host: &'a Netns,
    env: BTreeMap<String, String>,
    stdin: Vec<u8>,
    timeout: Duration,
}

impl<'a> Plugin<'a> {
    /// Plugin binary `name` from [`bin_dir`] (e.g. `"loopback"`), to run inside `host`.
    pub fn new(name: &str, host: &'a Netns) -> Self {
        let dir = bin_dir().to_string_lossy().into_owned();
        Self::at(&plugin_path(name), host).cni_path(&dir)
    }

    /// Any executable, to run inside `host` like a plugin, with no variable set (not even
    /// `CNI_PATH`). The harness tests itself this way with `env`, `cat` and `sh`.
    pub fn at(binary: &Path, host: &'a Netns) -> Self {
        Self {
            binary: binary.to_path_buf(),
            host,
            env: BTreeMap::new(),
            stdin: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// `CNI_COMMAND` (any text, so tests can send unknown or empty commands).
    #[must_use]
    pub fn command(self, command: &str) -> Self {
        self.env("CNI_COMMAND", command)
    }

    /// `CNI_CONTAINERID`.
    #[must_use]
    pub fn container_id(self, id: &str) -> Self {
        self.env("CNI_CONTAINERID", id)
    }

    /// `CNI_NETNS`.
    #[must_use]
    pub fn netns(self, path: &str) -> Self {
        self.env("CNI_NETNS", path)
    }

    /// `CNI_IFNAME`.
    #[must_use]
    pub fn ifname(self, ifname: &str) -> Self {
        self.env("CNI_IFNAME", ifname)
    }

    /// `CNI_PATH` (replacing the default [`bin_dir`]).
    #[must_use]
    pub fn cni_path(self, path: &str) -> Self {
        self.env("CNI_PATH", path)
    }

    /// `CNI_ARGS`.
    #[must_use]
    pub fn cni_args(self, args: &str) -> Self {
        self.env("CNI_ARGS", args)
    }

    /// The usual ADD/DEL/CHECK trio: container id, pod netns path and ifname.
    #[must_use]
    pub fn attachment(self, container_id: &str, pod: &Netns, ifname: &str) -> Self {
        self.container_id(container_id)
            .netns(pod.path_str())
            .ifname(ifname)
    }

    /// Any environment variable.
    #[must_use]
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Removes a variable set earlier (or the default `CNI_PATH`).
    #[must_use]
    pub fn unset(mut self, key: &str) -> Self {
        self.env.remove(key);
        self
    }

    /// Raw stdin bytes (for malformed input).
    #[must_use]
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.stdin = bytes.into();
        self
    }

    /// Stdin from a JSON value (the network config).
    #[must_use]
    pub fn config(self, config: &Value) -> Self {
        self.stdin(config.to_string())
    }

    /// Overrides [`DEFAULT_TIMEOUT`].
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs the plugin and waits for it. Panics only if it cannot be started or runs past
    /// the timeout; any exit status is returned for the test to judge.
    pub fn run(&self) -> Outcome {
        let invocation = self.describe();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.host.name()])
            .arg(&self.binary)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(&self.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {invocation}: {e}"));

        // Feed stdin and drain both pipes on their own threads: a plugin that does not read
        // stdin (VERSION) or writes a lot must not dead-lock against us.
        let input = self.stdin.clone();
        let mut pipe_in = child.stdin.take();
        let writer = thread::spawn(move || {
            if let Some(pipe) = pipe_in.as_mut() {
                // A plugin may exit without reading: EPIPE here is not an error of ours.
                let _ = pipe.write_all(&input);
            }
        });
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());

        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(1);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("timed out after {:?}: {invocation}", self.timeout);
                }
                Err(e) => panic!("waiting for {invocation}: {e}"),
            }
        };
        let _ = writer.join();
        Outcome {
            status,
            stdout: join_text(stdout),
            stderr: join_text(stderr),
            invocation,
        }
    }

    /// Shell-like rendering of the call, for failure messages.
    fn describe(&self) -> String {
        let vars: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
        format!(
            "{} ip netns exec {} {} <<< {}",
            vars.join(" "),
            self.host.name(),
            self.binary.display(),
            String::from_utf8_lossy(&self.stdin)
        )
    }
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        buf
    })
}

fn join_text(handle: thread::JoinHandle<Vec<u8>>) -> String {
    String::from_utf8_lossy(&handle.join().unwrap_or_default()).into_owned()
}

/// What one plugin call returned. `Display` prints all of it, for assertion messages.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Exit status.
    pub status: ExitStatus,
    /// Everything written to stdout (result or error JSON), unmodified.
    pub stdout: String,
    /// Everything written to stderr (logs).
    pub stderr: String,
    /// The call, rendered for messages.
    pub invocation: String,
}

impl Outcome {
    /// Exit code; `None` if the plugin died from a signal (e.g. an abort).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Exit code 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Stdout parsed as exactly one JSON value (trailing garbage or a second object is an
    /// error: runtimes parse stdout as a single document). Panics with the whole outcome.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}):\n{self}"))
    }

    /// Panics unless the exit code is 0.
    #[track_caller]
    pub fn assert_success(&self) -> &Self {
        assert!(self.success(), "expected success:\n{self}");
        self
    }

    /// Panics unless the exit code is 0 and nothing was printed on stdout (what the spec
    /// asks of a successful DEL, CHECK, STATUS and GC).
    #[track_caller]
    pub fn assert_success_silent(&self) -> &Self {
        self.assert_success();
        assert!(self.stdout.is_empty(), "expected empty stdout:\n{self}");
        self
    }

    /// Panics if the exit code is 0.
    #[track_caller]
    pub fn assert_failure(&self) -> &Self {
        assert!(!self.success(), "expected failure:\n{self}");
        self
    }

    /// Stdout as an error object (a JSON object with a `code`), if it is one.
    pub fn error(&self) -> Option<Value> {
        let value: Value = serde_json::from_str(&self.stdout).ok()?;
        value.get("code")?;
        Some(value)
    }

    /// The `code` of the error JSON on stdout.
    pub fn error_code(&self) -> Option<u64> {
        self.error()?.get("code")?.as_u64()
    }

    /// The `msg` of the error JSON on stdout.
    pub fn error_msg(&self) -> Option<String> {
        Some(self.error()?.get("msg")?.as_str()?.to_owned())
    }

    /// The `details` of the error JSON on stdout.
    pub fn error_details(&self) -> Option<String> {
        Some(self.error()?.get("details")?.as_str()?.to_owned())
    }

    /// Panics unless the call failed with exactly this code and message, the error being
    /// the only thing on stdout. Returns the error object for further checks.
    #[track_caller]
    pub fn assert_error(&self, code: u64, msg: &str) -> Value {
        self.assert_failure();
        let error = self.json();
        assert_eq!(
            (
                error.get("code").and_then(Value::as_u64),
                error.get("msg").and_then(Value::as_str)
            ),
            (Some(code), Some(msg)),
            "unexpected error:\n{self}"
        );
        error
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  call:   {}", self.invocation)?;
        writeln!(f, "  status: {}", self.status)?;
        writeln!(f, "  stdout: {}", self.stdout)?;
        write!(f, "  stderr: {}", self.stderr)
    }
}
