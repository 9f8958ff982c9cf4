//! Locating (and first building) the plugin binaries under test.
//!
//! `cargo test` builds only what the test crate depends on, and the black-box crate must
//! not depend on the plugins (it tests their binaries, not their libraries). So the first
//! test that needs a binary runs `cargo build` for the plugin packages (and cnitool), once per
//! test process. If that fails, each package is built on its own, so that the tests of
//! the plugins that do compile still run (the others' tests fail with the compiler output). Cargo itself reports where it put the executables (JSON messages), which
//! keeps `CARGO_TARGET_DIR` and `build.target-dir` settings working.
//!
//! `CNI_BLACKBOX_BIN_DIR=<dir>` skips the build and tests the binaries in `<dir>` instead,
//! e.g. the reference Go plugins, to check what the tests themselves assume.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Binary names (as `type` in a config) and the packages that build them; `cnitool` (the
/// runtime-side tool, not a plugin) is built alongside so its tests find it in the same dir.
pub const PLUGINS: [(&str, &str); 4] = [
    ("loopback", "cni-loopback"),
    ("host-local", "cni-host-local"),
    ("bridge", "cni-bridge"),
    ("cnitool", "cnitool"),
];

/// The workspace root (this crate lives in `<root>/tests`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The directory holding `loopback`, `host-local` and `bridge`: what tests pass as
/// `CNI_PATH`. Builds them on first use; panics (in every test that asks) if no plugin
/// could be built.
pub fn bin_dir() -> &'static Path {
    &built().dir
}

/// Full path of one plugin binary. Panics with the compiler's output if that plugin did
/// not build.
pub fn plugin_path(name: &str) -> PathBuf {
    let built = built();
    if let Some(error) = built.failed.get(name) {
        panic!("plugin {name:?} did not build:\n{error}");
    }
    built.dir.join(name)
}

/// Outcome of the one-time build.
#[derive(Debug)]
struct Built {
    dir: PathBuf,
    /// Plugins whose package failed to build, with cargo's output.
    failed: BTreeMap<&'static str, String>,
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Result<Built, String>> = OnceLock::new();
    match BUILT.get_or_init(locate) {
        Ok(built) => built,
        Err(e) => panic!("{e}"),
    }
}

fn locate() -> Result<Built, String> {
    if let Some(dir) = std::env::var_os("CNI_BLACKBOX_BIN_DIR") {
        return Ok(Built {
            dir: PathBuf::from(dir),
            failed: BTreeMap::new(),
        });
    }
    let all: Vec<(&'static str, &'static str)> = PLUGINS.to_vec();
    let combined_error = match build(&all) {
        Ok(dir) => {
            return Ok(Built {
                dir,
                failed: BTreeMap::new(),
            });
        }
        Err(e) => e,
    };
    // Plugins are developed side by side: one that does not compile yet must not take the
    // others' tests down with it. Build them one by one to see which are usable.
    let mut dir = None;
    let mut failed = BTreeMap::new();
    for plugin in all {
        match build(&[plugin]) {
            Ok(d) => dir = Some(d),
            Err(e) => {
                failed.insert(plugin.0, e);
            }
        }
    }
    match dir {
        Some(dir) => Ok(Built { dir, failed }),
        None => Err(combined_error),
    }
}

/// `cargo build --bins -p <package>...`; returns the directory of the executables.
fn build(plugins: &[(&str, &str)]) -> Result<PathBuf, String> {
    // Same cargo as the one running us (cargo sets CARGO for the processes it runs).
    let cargo = std::env::var_os("CARGO")
        .or_else(|| option_env!("CARGO").map(Into::into))
        .unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--bins",
        "--message-format=json-render-diagnostics",
    ])
    .current_dir(workspace_root());
    for (_, package) in plugins {
        cmd.args(["-p", package]);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the plugins failed ({}): {cmd:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut dir: Option<PathBuf> = None;
    for (name, _) in plugins {
        let exe = executable_of(&stdout, name)
            .ok_or_else(|| format!("cargo build reported no executable named {name:?}"))?;
        let parent = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        match &dir {
            None => dir = Some(parent),
            Some(d) if *d == parent => {}
            Some(d) => {
                return Err(format!(
                    "plugin binaries landed in different dirs: {} and {}",
                    d.display(),
                    parent.display()
                ));
            }
        }
    }
    dir.ok_or_else(|| "no plugins configured".to_owned())
}

/// Finds the `executable` of the bin target `name` in cargo's JSON message stream.
fn executable_of(messages: &str, name: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executable_is_taken_from_the_matching_artifact_only() {
        let messages = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"cni_protocol"},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"bridge"},"executable":"/t/debug/bridge"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
            "\n",
        );
        assert_eq!(
            executable_of(messages, "bridge"),
            Some(PathBuf::from("/t/debug/bridge"))
        );
        assert_eq!(executable_of(messages, "loopback"), None);
        assert_eq!(executable_of(messages, "cni_protocol"), None);
    }
}
