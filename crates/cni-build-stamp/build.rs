//! Stamps the git commit into the build: `CNI_PLUGINS_RS_COMMIT` for `env!`.
//!
//! Order: the `CNI_PLUGINS_RS_COMMIT` environment variable (for builds from a source
//! tarball, where there is no `.git`), then `git rev-parse --short HEAD`, then "unknown".
//! Cargo reruns this when HEAD moves: the worktree's HEAD file, the branch's ref file
//! and packed-refs (asked from git, which knows where a linked worktree keeps them).

use std::path::{Path, PathBuf};
use std::process::Command;

const OVERRIDE: &str = "CNI_PLUGINS_RS_COMMIT";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed={OVERRIDE}");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = std::env::var(OVERRIDE)
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&dir, &["rev-parse", "--short", "HEAD"]))
        .map(|c| sanitize(&c))
        .unwrap_or_else(|| "unknown".to_owned());
    for file in watched(&dir) {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    println!("cargo:rustc-env={OVERRIDE}={commit}");
}

/// Stdout of `git <args>` run in `dir`, trimmed; None if git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}

/// Files whose change means HEAD may name another commit. Only existing ones: cargo
/// would rerun on every build for a path that does not exist.
fn watched(dir: &Path) -> Vec<PathBuf> {
    let mut refs = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        refs.push(branch);
    }
    refs.iter()
        .filter_map(|r| git(dir, &["rev-parse", "--git-path", r]))
        .map(|p| dir.join(p))
        .filter(|p| p.exists())
        .collect()
}

/// The stamp ends up inside the about line, which installers parse back: keep it to
/// characters that cannot end the commit field early.
fn sanitize(commit: &str) -> String {
    let clean: String = commit
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .take(40)
        .collect();
    if clean.is_empty() {
        "unknown".to_owned()
    } else {
        clean
    }
}
