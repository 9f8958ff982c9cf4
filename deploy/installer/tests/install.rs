//! The installer binary against throwaway directories (no root needed): fresh install,
//! idempotence, replacing the reference plugins, refusing a downgrade, replacing a
//! binary that is running, the conflist, and the DaemonSet's sleep mode.
//!
//! The "plugins" installed are small shell scripts that carry a build stamp in a
//! comment: the installer reads stamps from bytes and never runs what it installs. Like
//! the release tarball, the source holds one such file hard-linked under each plugin
//! name, and the installed names must end up as hard links of one file.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const INSTALLER: &str = env!("CARGO_BIN_EXE_cni-installer");
const PLUGINS: [&str; 5] = ["bridge", "host-local", "loopback", "portmap", "bandwidth"];

/// A directory under the system temp dir, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "cni-installer-it-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir(&path).unwrap();
        Self(path)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A stand-in plugin file with the stamp `v<version>`, commit `commit`.
fn fake_plugin(name: &str, version: &str, commit: &str) -> String {
    format!(
        "#!/bin/sh\n# CNI {name} plugin v{version} (cni-plugins-rs, commit {commit}; not the Go reference plugins)\necho {name}\n"
    )
}

/// A source dir laid out like the release tarball: one stand-in (this build's version)
/// hard-linked under every plugin name, like the multi-call executable.
fn source(commit: &str) -> Dir {
    let dir = Dir::new("src");
    let first = dir.join(PLUGINS[0]);
    fs::write(
        &first,
        fake_plugin("multi-call", cni_build_stamp::VERSION, commit),
    )
    .unwrap();
    for name in &PLUGINS[1..] {
        fs::hard_link(&first, dir.join(name)).unwrap();
    }
    dir
}

/// Panics unless the plugin names in `dir` are hard links of one file (and no other
/// name shares it).
#[track_caller]
fn assert_one_file(dir: &Path) {
    let inodes: Vec<u64> = PLUGINS.iter().map(|n| inode(&dir.join(n))).collect();
    assert!(inodes.iter().all(|i| *i == inodes[0]), "{inodes:?}");
    assert_eq!(fs::metadata(dir.join(PLUGINS[0])).unwrap().nlink(), 5);
}

fn install(src: &Dir, dest: &Path, extra: &[&str]) -> Output {
    Command::new(INSTALLER)
        .arg("--source")
        .arg(&src.0)
        .arg("--dest")
        .arg(dest)
        .args(extra)
        .output()
        .unwrap()
}

#[track_caller]
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "installer failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn inode(path: &Path) -> u64 {
    fs::metadata(path).unwrap().ino()
}

#[test]
fn fresh_install_then_second_run_changes_nothing() {
    let src = source("aaaaaaa");
    let host = Dir::new("host");
    let dest = host.join("opt/cni/bin");
    let first = ok(&install(&src, &dest, &[]));
    for name in PLUGINS {
        let path = dest.join(name);
        assert_eq!(fs::read(&path).unwrap(), fs::read(src.join(name)).unwrap());
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        assert!(
            first.contains(&format!(
                "{}: installed v{} (commit aaaaaaa)\n",
                path.display(),
                cni_build_stamp::VERSION
            )),
            "{first}"
        );
    }
    assert_one_file(&dest);
    let inodes: Vec<u64> = PLUGINS.iter().map(|n| inode(&dest.join(n))).collect();
    let second = ok(&install(&src, &dest, &[]));
    assert_eq!(
        second.matches(": unchanged, v").count(),
        PLUGINS.len(),
        "{second}"
    );
    let again: Vec<u64> = PLUGINS.iter().map(|n| inode(&dest.join(n))).collect();
    assert_eq!(inodes, again, "an unchanged file was rewritten");
    let mut names: Vec<String> = fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want = PLUGINS;
    want.sort_unstable();
    assert_eq!(names, want, "no temp files or extras");
}

#[test]
fn separate_copies_of_the_same_file_become_one_file() {
    let src = source("aaaaaaa");
    let dest = Dir::new("dest");
    // An earlier install by copies (e.g. `install -t`), same bytes under each name.
    for name in PLUGINS {
        fs::copy(src.join(name), dest.join(name)).unwrap();
    }
    let out = ok(&install(&src, &dest.0, &[]));
    assert_eq!(
        out.matches("now a hard link of the plugins' one file")
            .count(),
        PLUGINS.len(),
        "{out}"
    );
    assert_one_file(&dest.0);
    // And a source of copies (not links) is still installed as one file.
    let copies = Dir::new("copies");
    for name in PLUGINS {
        fs::copy(src.join(name), copies.join(name)).unwrap();
    }
    let fresh = Dir::new("fresh");
    ok(&install(&copies, &fresh.0, &[]));
    assert_one_file(&fresh.0);
}

#[test]
fn reference_and_unknown_binaries_are_replaced_other_files_kept() {
    let src = source("aaaaaaa");
    let dest = Dir::new("dest");
    fs::write(
        dest.join("bridge"),
        "\x7fELF Go BuildID CNI bridge plugin v1.1.1",
    )
    .unwrap();
    fs::write(dest.join("host-local"), "").unwrap();
    fs::write(dest.join("portmap"), "reference portmap").unwrap();
    fs::write(dest.join("tuning"), "reference tuning").unwrap();
    let out = ok(&install(&src, &dest.0, &[]));
    assert_eq!(
        out.matches("replacing a binary that is not cni-plugins-rs")
            .count(),
        3,
        "{out}"
    );
    for name in PLUGINS {
        assert_eq!(
            fs::read(dest.join(name)).unwrap(),
            fs::read(src.join(name)).unwrap()
        );
    }
    // A plugin we do not ship is not ours to touch.
    assert_eq!(fs::read(dest.join("tuning")).unwrap(), b"reference tuning");
}

#[test]
fn a_newer_installed_version_is_not_downgraded_unless_allowed() {
    let src = source("aaaaaaa");
    let dest = Dir::new("dest");
    let newer = fake_plugin("host-local", "99.0.0", "fffffff");
    fs::write(dest.join("host-local"), &newer).unwrap();
    fs::write(dest.join("bridge"), "reference").unwrap();

    let refused = install(&src, &dest.0, &[]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    let want = format!(
        "cni-installer: error: refusing to downgrade: {} is cni-plugins-rs v99.0.0 (commit fffffff), \
         newer than v{} (commit aaaaaaa); pass --allow-downgrade to install anyway; nothing was changed\n",
        dest.join("host-local").display(),
        cni_build_stamp::VERSION
    );
    assert_eq!(stderr, want);
    // Nothing was changed, not even the files that would have been fine to replace.
    assert_eq!(fs::read_to_string(dest.join("host-local")).unwrap(), newer);
    assert_eq!(
        fs::read_to_string(dest.join("bridge")).unwrap(),
        "reference"
    );
    assert!(!dest.join("loopback").exists());

    let allowed = ok(&install(&src, &dest.0, &["--allow-downgrade"]));
    assert!(
        allowed.contains("downgraded cni-plugins-rs v99.0.0 (commit fffffff) to v"),
        "{allowed}"
    );
    assert_eq!(
        fs::read(dest.join("host-local")).unwrap(),
        fs::read(src.join("host-local")).unwrap()
    );
    assert_one_file(&dest.0);
}

#[test]
fn an_older_or_same_version_of_ours_is_replaced() {
    let src = source("bbbbbbb");
    let dest = Dir::new("dest");
    fs::write(
        dest.join("bridge"),
        fake_plugin("bridge", "0.0.0-alpha", "0000000"),
    )
    .unwrap();
    fs::write(
        dest.join("loopback"),
        fake_plugin("loopback", cni_build_stamp::VERSION, "aaaaaaa"),
    )
    .unwrap();
    let out = ok(&install(&src, &dest.0, &[]));
    assert!(
        out.contains("replaced cni-plugins-rs v0.0.0-alpha (commit 0000000) with"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "replaced cni-plugins-rs v{} (commit aaaaaaa) with",
            cni_build_stamp::VERSION
        )),
        "{out}"
    );
}

#[test]
fn a_running_binary_is_replaced_and_keeps_running() {
    let src = source("aaaaaaa");
    let dest = Dir::new("dest");
    // A real executable stands in for a plugin that is running: /bin/sleep.
    let target = dest.join("host-local");
    fs::copy("/bin/sleep", &target).unwrap();
    let mut running = spawn_fresh(Command::new(&target).arg("600"));
    // What a plain copy meets (the reason for the rename): ETXTBSY, "Text file busy".
    let plain = fs::OpenOptions::new().write(true).open(&target);
    assert_eq!(
        plain.err().and_then(|e| e.raw_os_error()),
        Some(nix::libc::ETXTBSY),
        "the running file should refuse writers"
    );

    let out = install(&src, &dest.0, &[]);
    let still_running = running.try_wait().unwrap().is_none();
    let _ = running.kill();
    let status = running.wait().unwrap();
    let out = ok(&out);
    assert!(still_running, "the running plugin died during the install");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "ended by our kill, not by the install: {status:?}"
    );
    assert!(
        out.contains("replacing a binary that is not cni-plugins-rs"),
        "{out}"
    );
    assert_eq!(
        fs::read(&target).unwrap(),
        fs::read(src.join("host-local")).unwrap()
    );
}

#[test]
fn conflist_is_written_checked_and_left_alone_when_identical() {
    let src = source("aaaaaaa");
    let dest = Dir::new("dest");
    let conf_dir = Dir::new("netd");
    let cfg = Dir::new("cfg");
    let good = cfg.join("10-pods.conflist");
    fs::write(
        &good,
        r#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"bridge"},{"type":"loopback"}]}"#,
    )
    .unwrap();
    let args = [
        "--conflist",
        good.to_str().unwrap(),
        "--conf-dir",
        conf_dir.0.to_str().unwrap(),
    ];
    let first = ok(&install(&src, &dest.0, &args));
    let written = conf_dir.join("10-pods.conflist");
    assert!(
        first.contains(&format!("{}: written\n", written.display())),
        "{first}"
    );
    assert_eq!(fs::read(&written).unwrap(), fs::read(&good).unwrap());
    assert_eq!(
        fs::metadata(&written).unwrap().permissions().mode() & 0o7777,
        0o644
    );
    let second = ok(&install(&src, &dest.0, &args));
    assert!(
        second.contains(&format!("{}: unchanged\n", written.display())),
        "{second}"
    );

    // A broken config stops everything before any write.
    let bad = cfg.join("20-bad.conflist");
    fs::write(&bad, r#"{"name":"bad","plugins":[]}"#).unwrap();
    let fresh = Dir::new("fresh");
    let out = install(
        &src,
        &fresh.0,
        &[
            "--conflist",
            bad.to_str().unwrap(),
            "--conf-dir",
            conf_dir.0.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "cni-installer: error: {}: \"plugins\" must be a non-empty list\n",
            bad.display()
        )
    );
    assert!(!conf_dir.join("20-bad.conflist").exists());
    assert_eq!(
        fs::read_dir(&fresh.0).unwrap().count(),
        0,
        "binaries written"
    );
}

#[test]
fn a_source_that_is_not_ours_is_refused() {
    let src = source("aaaaaaa");
    // Its own file, not through the link (which would change every name).
    fs::remove_file(src.join("loopback")).unwrap();
    fs::write(src.join("loopback"), "\x7fELF reference loopback").unwrap();
    let dest = Dir::new("dest");
    let out = install(&src, &dest.0, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "cni-installer: error: {} is not a cni-plugins-rs binary (it has no build stamp); not installing it\n",
            src.join("loopback").display()
        )
    );
    assert_eq!(fs::read_dir(&dest.0).unwrap().count(), 0);
}

#[test]
fn sleep_forever_installs_then_exits_zero_on_sigterm() {
    let src = source("aaaaaaa");
    let dest = Dir::new("dest");
    let mut child = Command::new(INSTALLER)
        .arg("--source")
        .arg(&src.0)
        .arg("--dest")
        .arg(&dest.0)
        .arg("--sleep-forever")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Blocks until the installer says it sleeps (or exits: then the lines end).
    let seen: Vec<String> = lines
        .by_ref()
        .map_while(Result::ok)
        .take_while(|l| l != "installed; sleeping until SIGTERM")
        .collect();
    assert!(
        dest.join("bridge").exists(),
        "not installed before sleeping: {seen:?}"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited instead of sleeping: {seen:?}"
    );
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(status.success(), "{status:?}");
    assert_eq!(rest, ["SIGTERM: exiting"]);
}

#[test]
fn help_version_and_bad_arguments() {
    let help = Command::new(INSTALLER).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).starts_with("Usage: cni-installer [OPTIONS]"));
    let version = Command::new(INSTALLER).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout),
        format!("cni-installer{}\n", cni_build_stamp::STAMP)
    );
    let bad = Command::new(INSTALLER).arg("--bogus").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&bad.stderr),
        "cni-installer: unknown argument \"--bogus\"\nTry 'cni-installer --help'.\n"
    );
}

/// Spawns a program just written. Another test thread forking at that moment holds
/// the write descriptor until its child execs, and the kernel then refuses to run the
/// file (ETXTBSY): that passes within milliseconds, so wait it out.
fn spawn_fresh(cmd: &mut Command) -> std::process::Child {
    let mut attempts = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) && attempts < 100 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}")),
        }
    }
}
