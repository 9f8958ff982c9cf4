//! Locating (and first building) the plugin binaries under test.
//!
//! `cargo test` builds only what the test crate depends on, and the black-box crate must
//! not depend on the plugins (it tests their binaries, not their libraries). So the first
//! test that needs a binary runs `cargo build` for the multi-call plugin binary and
//! cnitool, once per test process, then lays them out as they ship: a directory
//! (`<target>/<profile>/cni-bin/`) in which `bridge`, `host-local`, `loopback`, `portmap` and `bandwidth` are hard
//! links of the one multi-call executable, plus `cnitool` and the node agent `cni-node`. If the combined build fails,
//! each package is built on its own, so that the tests that can still run do (the others
//! fail with the compiler output). Cargo itself reports where it put the executables (JSON
//! messages), which keeps `CARGO_TARGET_DIR` and `build.target-dir` settings working.
//!
//! `CNI_BLACKBOX_BIN_DIR=<dir>` skips the build and tests the binaries in `<dir>` instead,
//! e.g. the reference Go plugins, to check what the tests themselves assume.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Names in the binary directory (plugin names as `type` in a config, and `cnitool`), each
/// with the package and bin target that provides it. The five plugins are one
/// executable; `cnitool` (the runtime-side tool, not a plugin) is built alongside so its
/// tests find it in the same dir.
pub const PLUGINS: [(&str, &str, &str); 7] = [
    ("loopback", "cni-plugins", MULTICALL),
    ("portmap", "cni-plugins", MULTICALL),
    ("bandwidth", "cni-plugins", MULTICALL),
    ("host-local", "cni-plugins", MULTICALL),
    ("bridge", "cni-plugins", MULTICALL),
    ("cnitool", "cnitool", "cnitool"),
    ("cni-node", "cni-node", "cni-node"),
];

/// The bin target of the multi-call plugin executable.
pub const MULTICALL: &str = "cni-plugins-rs";

/// The subdirectory of cargo's output directory that holds the shipped layout.
const LAYOUT_DIR: &str = "cni-bin";

/// The workspace root (this crate lives in `<root>/tests`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The cargo to run: the one running us (cargo sets `CARGO` for the processes it runs,
/// and for the compiler), else `cargo` on `PATH`.
pub fn cargo() -> std::ffi::OsString {
    std::env::var_os("CARGO")
        .or_else(|| option_env!("CARGO").map(Into::into))
        .unwrap_or_else(|| "cargo".into())
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

/// The multi-call executable itself, as cargo built it (the file the plugin names in
/// [`bin_dir`] are hard links of); with `CNI_BLACKBOX_BIN_DIR`, that dir's `bridge`
/// (ours, if the dir holds our release). Panics if it did not build.
pub fn multicall_path() -> PathBuf {
    let built = built();
    if let Some(error) = built.failed.get("bridge") {
        panic!("the multi-call plugin binary did not build:\n{error}");
    }
    built
        .multicall
        .clone()
        .unwrap_or_else(|| built.dir.join("bridge"))
}

/// Outcome of the one-time build.
#[derive(Debug)]
struct Built {
    dir: PathBuf,
    /// The multi-call executable cargo built (`None` with `CNI_BLACKBOX_BIN_DIR`).
    multicall: Option<PathBuf>,
    /// Names whose package failed to build, with cargo's output.
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
            multicall: None,
            failed: BTreeMap::new(),
        });
    }
    let all: Vec<(&'static str, &'static str, &'static str)> = PLUGINS.to_vec();
    let (executables, failed) = match build(&all) {
        Ok(executables) => (executables, BTreeMap::new()),
        Err(combined_error) => {
            // One package that does not compile must not take the other's tests down
            // with it: build them one by one to see which are usable.
            let mut executables = BTreeMap::new();
            let mut failed = BTreeMap::new();
            let mut packages: Vec<&str> = all.iter().map(|(_, package, _)| *package).collect();
            packages.dedup();
            for package in packages {
                let names: Vec<_> = all.iter().filter(|p| p.1 == package).copied().collect();
                match build(&names) {
                    Ok(found) => executables.extend(found),
                    Err(e) => {
                        for (name, _, _) in names {
                            failed.insert(name, e.clone());
                        }
                    }
                }
            }
            if executables.is_empty() {
                return Err(combined_error);
            }
            (executables, failed)
        }
    };
    let out_dir = executables
        .values()
        .next()
        .and_then(|exe| exe.parent())
        .map(Path::to_path_buf)
        .ok_or_else(|| "cargo reported no executables".to_owned())?;
    let dir = out_dir.join(LAYOUT_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (name, exe) in &executables {
        place_link(exe, &dir, name)?;
    }
    Ok(Built {
        dir,
        multicall: executables.get("bridge").cloned(),
        failed,
    })
}

/// Makes `dir/name` a hard link of `exe`, atomically and safely while other test
/// processes do the same: kept when it already is one, else a uniquely named link is
/// renamed over it (so `dir/name` is always either the old file or the new, never
/// missing or half written). Falls back to a copy where hard links are refused.
fn place_link(exe: &Path, dir: &Path, name: &str) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    let target = dir.join(name);
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    if id(&target).is_some() && id(&target) == id(exe) {
        return Ok(());
    }
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let temp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    if std::fs::hard_link(exe, &temp).is_err() {
        std::fs::copy(exe, &temp)
            .map_err(|e| format!("cannot copy {} to {}: {e}", exe.display(), temp.display()))?;
    }
    std::fs::rename(&temp, &target).map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        format!(
            "cannot rename {} to {}: {e}",
            temp.display(),
            target.display()
        )
    })
}

/// `cargo build --bins -p <package>...`; returns where each name's executable is.
fn build(
    plugins: &[(&'static str, &str, &str)],
) -> Result<BTreeMap<&'static str, PathBuf>, String> {
    let mut cmd = Command::new(cargo());
    cmd.args([
        "build",
        "--bins",
        "--message-format=json-render-diagnostics",
    ])
    .current_dir(workspace_root());
    // What cargo tells the test binary about its own package: build scripts that watch
    // these (ring's watches CARGO_MANIFEST_DIR) would otherwise rerun, and everything
    // after them rebuild, each time a build from a shell follows a test run.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_EXE_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
            ]
            .contains(&key.as_ref())
        {
            cmd.env_remove(key.as_ref());
        }
    }
    let mut packages: Vec<&str> = plugins.iter().map(|(_, package, _)| *package).collect();
    packages.dedup();
    for package in packages {
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
    let mut found = BTreeMap::new();
    for (name, _, target) in plugins {
        let exe = executable_of(&stdout, target)
            .ok_or_else(|| format!("cargo build reported no executable named {target:?}"))?;
        found.insert(*name, exe);
    }
    Ok(found)
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
