//! The workspace's `rust-version` (`[workspace.package]` in Cargo.toml, inherited by
//! every member) is a promise: "this builds with that Rust". It holds only if no
//! dependency needs a newer one, so every package in the resolved graph for this host is
//! checked against it (`cargo metadata`), and the README's prerequisite line must name the
//! same version.

use std::process::Command;

use cni_blackbox::{cargo, workspace_root};
use serde_json::Value;

/// `1.85` or `1.85.0` as comparable numbers (a missing part is 0).
fn version(text: &str) -> Option<(u64, u64, u64)> {
    let mut parts = text.trim().split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next().unwrap_or(Some(0))?;
    let patch = parts.next().unwrap_or(Some(0))?;
    parts.next().is_none().then_some((major, minor, patch))
}

/// The host's target triple, from the rustc beside the cargo that runs us (`rustc -vV`).
fn host_triple() -> String {
    let cargo = std::path::PathBuf::from(cargo());
    let beside = cargo.with_file_name("rustc");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| {
        if beside.is_file() {
            beside.into_os_string()
        } else {
            "rustc".into()
        }
    });
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {rustc:?} -vV: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .unwrap_or_else(|| panic!("{rustc:?} -vV names no host"))
        .trim()
        .to_owned()
}

/// `cargo metadata` of the workspace for this host: offline (the dependencies are
/// fetched by the time tests run; those of other platforms may not be, so the graph is
/// the one built here).
fn metadata() -> Value {
    let out = Command::new(cargo())
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &host_triple()])
        .current_dir(workspace_root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo metadata: {e}"));
    assert!(
        out.status.success(),
        "cargo metadata failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("cargo metadata: {e}"))
}

/// The workspace members' `rust-version` (they all inherit the workspace's); panics if a
/// member has none or they differ.
fn workspace_rust_version(metadata: &Value) -> String {
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut seen = std::collections::BTreeMap::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        if members.contains(&package["id"].as_str().unwrap_or_default()) {
            let name = package["name"].as_str().unwrap_or_default().to_owned();
            let v = package["rust_version"]
                .as_str()
                .unwrap_or_else(|| panic!("workspace member {name} has no rust-version"))
                .to_owned();
            seen.insert(name, v);
        }
    }
    let versions: std::collections::BTreeSet<&String> = seen.values().collect();
    assert_eq!(
        versions.len(),
        1,
        "the workspace members disagree on rust-version: {seen:?}"
    );
    versions.into_iter().next().cloned().unwrap_or_default()
}

#[test]
fn no_dependency_needs_a_newer_rust_than_the_workspace_says() {
    let metadata = metadata();
    let ours = workspace_rust_version(&metadata);
    let ours_v = version(&ours).unwrap_or_else(|| panic!("rust-version {ours:?} is no version"));
    let members: Vec<&Value> = metadata["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let mut newer = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        if members.contains(&&package["id"]) {
            continue;
        }
        let Some(theirs) = package["rust_version"].as_str() else {
            continue;
        };
        let needs = version(theirs).unwrap_or_else(|| {
            panic!("{}: rust-version {theirs:?} is no version", package["name"])
        });
        if needs > ours_v {
            newer.push((
                needs,
                format!(
                    "{} {} needs Rust {theirs}",
                    package["name"].as_str().unwrap_or_default(),
                    package["version"].as_str().unwrap_or_default()
                ),
            ));
        }
    }
    newer.sort();
    assert!(
        newer.is_empty(),
        "the workspace says rust-version = \"{ours}\" (Cargo.toml, [workspace.package]), but:\n{}\n\
         raise it to at least {}",
        newer
            .iter()
            .map(|(_, line)| line.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        newer
            .last()
            .map(|((a, b, c), _)| format!("{a}.{b}.{c}"))
            .unwrap_or_default()
    );
}

#[test]
fn the_readme_names_the_workspace_rust_version() {
    let ours = workspace_rust_version(&metadata());
    let readme = std::fs::read_to_string(workspace_root().join("README.md"))
        .unwrap_or_else(|e| panic!("read README.md: {e}"));
    let want = format!("Rust {ours} or newer");
    assert!(
        readme.contains(&want),
        "README.md's prerequisites do not say {want:?} (Cargo.toml's rust-version)"
    );
}

#[test]
fn versions_compare_by_number() {
    assert_eq!(version("1.85"), Some((1, 85, 0)));
    assert_eq!(version("1.85.0"), version("1.85"));
    assert!(version("1.89") > version("1.88.9"));
    assert!(version("1.100") > version("1.99"));
    assert_eq!(version("1.x"), None);
    assert_eq!(version("1.2.3.4"), None);
}
