//! The libcni driver (`tests/interop/libcni-driver`): built once per test process with
//! `go build` against Debian's libcni sources, and run inside a test's host netns. Shared
//! by the suites that drive attachments through the real runtime-side library
//! (`libcni.rs`, `cnitool.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use cni_blackbox::{Netns, Outcome, workspace_root};

/// The driver binary, built once per test process with `go build` (offline: GOPATH is
/// Debian's /usr/share/gocode, no modules) into cargo's scratch dir for this test crate.
pub fn driver() -> &'static Path {
    static DRIVER: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match DRIVER.get_or_init(build_driver) {
        Ok(path) => path,
        Err(e) => panic!("{e}"),
    }
}

fn build_driver() -> Result<PathBuf, String> {
    let source = workspace_root().join("tests/interop/libcni-driver");
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let out = scratch.join("libcni-driver");
    let gocache = scratch.join("go-build-cache");
    let result = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&source)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", scratch)
        .env("GOPATH", "/usr/share/gocode")
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOENV", "off")
        .env("GOCACHE", &gocache)
        .env("CGO_ENABLED", "0")
        .output()
        .map_err(|e| {
            format!("cannot run `go build` for the libcni driver ({e}); install golang-go and golang-github-appc-cni-dev (tests/run-all.sh does)")
        })?;
    if !result.status.success() {
        return Err(format!(
            "go build of {} failed ({}):\n{}",
            source.display(),
            result.status,
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    Ok(out)
}

/// Runs the driver inside `host` (`ip netns exec <host> timeout 120 driver <args>`) with
/// only PATH from our environment, like the plugin runner of the harness.
pub fn run_driver(host: &Netns, args: &[String]) -> Outcome {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", host.name(), "timeout", "120"])
        .arg(driver())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    let invocation = format!(
        "ip netns exec {} {} {}",
        host.name(),
        driver().display(),
        args.iter()
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start {invocation}: {e}"));
    Outcome {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        invocation,
    }
}
