//! The release, its image and the installer on a node, end to end:
//!
//! 1. `deploy/release.sh` builds the static release into a temp dir: the tarball is flat
//!    and holds what it should (the plugins as hard links of one multi-call executable),
//!    its `.sha256`/`.sha512` files verify, `ldd` calls every binary static. (The release profile is the one the release command uses, so a
//!    developer's earlier `deploy/release.sh` makes this build a no-op; a cold build takes
//!    a few minutes on 2 CPUs.)
//! 2. Podman builds `deploy/Containerfile` from the unpacked tarball, offline (`FROM
//!    scratch`, `--pull=never`), into a private storage root.
//! 3. A throwaway "node" directory stands in for the host's `/opt/cni/bin`: it holds the
//!    reference Go `bridge`, `portmap` and `tuning`, and an older build of our `host-local` that is
//!    *running*: an ADD blocked on its network's lock, which this test holds with flock.
//! 4. The image runs as the DaemonSet runs it (read-only root, no capabilities, the node
//!    dir mounted at /host/opt/cni/bin): the install succeeds, although writing into the
//!    running file fails with ETXTBSY; the running ADD still runs its old, now unlinked
//!    binary and, once the lock is released, finishes normally. The installed binaries are
//!    the released ones, hard links of one file, and work (VERSION, the about line, an
//!    ADD); `tuning`, which we do not ship, is untouched;
//!    a second run changes nothing; `--sleep-forever` exits 0 on `podman stop`.
//!
//! Podman runs like in `podman.rs`: in a throwaway netns, in a private mount namespace
//! (/var/lib and /run private), with private containers.conf/storage.conf (vfs, runc,
//! cgroupfs). Drop removes containers, stray processes, new cgroup dirs and the temp dirs.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use cni_blackbox::podman::{
    children_of, cmdline, eventually, hard_limits, missing_cgroup_dirs, pids, require_podman,
    spawn_holder, warn, write,
};
use cni_blackbox::{Netns, Plugin, TempDir, unique_name, workspace_root};
use nix::fcntl::{Flock, FlockArg};
use serde_json::json;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const PLUGINS: [&str; 5] = ["bridge", "host-local", "loopback", "portmap", "bandwidth"];
/// The reference Go plugins (Debian's containernetworking-plugins).
const REFERENCE_DIR: &str = "/usr/lib/cni";
/// Cgroup dirs the cgroupfs manager creates; removed at the end if they were not there.

#[test]
fn release_image_installs_onto_a_node_while_a_plugin_runs() {
    if !require_podman() {
        return;
    }

    // 1. The release.
    let release = Release::build();
    release.check();

    // 2. The image.
    let podman = Podman::new();
    let image = format!("localhost/{}:v{VERSION}", unique_name("cnibb-image"));
    podman.ok(&[
        "build",
        "--pull=never",
        "--network=none",
        "-f",
        &workspace_root()
            .join("deploy/Containerfile")
            .display()
            .to_string(),
        "--build-arg",
        &format!("VERSION={VERSION}"),
        "-t",
        &image,
        &release.context.display().to_string(),
    ]);
    assert_eq!(
        podman.ok(&[
            "image",
            "inspect",
            "--format",
            "{{json .Config.Entrypoint}}",
            &image
        ]),
        r#"["/cni-plugins-rs/cni-installer"]"#
    );
    let version_line = podman.ok(&["run", "--rm", "--network=none", &image, "--version"]);
    assert!(
        version_line.starts_with(&format!(
            "cni-installer v{VERSION} (cni-plugins-rs, commit "
        )),
        "{version_line}"
    );
    let agent_line = podman.ok(&[
        "run",
        "--rm",
        "--network=none",
        "--entrypoint",
        "/cni-plugins-rs/cni-node",
        &image,
        "--version",
    ]);
    assert!(
        agent_line.starts_with(&format!("cni-node v{VERSION} (cni-plugins-rs, commit ")),
        "{agent_line}"
    );

    // 3. The node: reference bridge, portmap and tuning, an older host-local of ours.
    let node = TempDir::new("cnibb-node");
    let bin = node.path().join("opt/cni/bin");
    fs::create_dir_all(&bin).expect("mkdir node bin");
    for name in ["bridge", "portmap", "tuning"] {
        fs::copy(Path::new(REFERENCE_DIR).join(name), bin.join(name)).unwrap_or_else(|e| {
            panic!("copy reference {name} (install containernetworking-plugins): {e}")
        });
    }
    let (older, older_bytes) = older_build(&release.context.join("host-local"));
    fs::write(bin.join("host-local"), &older_bytes).expect("write older host-local");
    set_mode(&bin.join("host-local"), 0o755);
    let tuning_before = fs::read(bin.join("tuning")).expect("read tuning");

    // An ADD with the older host-local, blocked on the network's lock held here.
    let host = Netns::new("cnibb-img-host");
    let pod = Netns::new("cnibb-img-pod");
    let data = node.path().join("var/lib/cni/networks");
    let network = unique_name("cnibb-imgnet");
    fs::create_dir_all(data.join(&network)).expect("mkdir network dir");
    let lock = File::create(data.join(&network).join("lock")).expect("create lock");
    let held = Flock::lock(lock, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("flock");
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": network,
        "ipam": {
            "type": "host-local",
            "dataDir": data.display().to_string(),
            "ranges": [[{"subnet": "10.251.7.0/24"}]],
            "lockTimeout": 500
        }
    });
    let running_path = bin.join("host-local");
    std::thread::scope(|scope| {
        let blocked = scope.spawn(|| {
            node_plugin(&bin, "host-local", &host)
                .command("ADD")
                .attachment("cnibb-running", &pod, "eth0")
                .config(&conf)
                .timeout(Duration::from_secs(600))
                .run()
        });
        // Running, or ended early (then its output says why). A panic in this scope drops
        // `held` (moved in here), so the ADD ends and the scope can join it.
        let started = eventually(Duration::from_secs(60), || {
            match pid_running(&running_path) {
                Some(pid) => Some(Some(pid)),
                None => blocked.is_finished().then_some(None),
            }
        });
        let pid = match started {
            Some(Some(pid)) => pid,
            Some(None) => panic!("the ADD ended before the install: {:?}", blocked.join()),
            None => panic!("{} did not start", running_path.display()),
        };
        // What a plain copy would meet.
        let plain = fs::OpenOptions::new().write(true).open(&running_path);
        assert_eq!(
            plain.err().and_then(|e| e.raw_os_error()),
            Some(nix::libc::ETXTBSY),
            "the running plugin's file should refuse writers"
        );

        // 4. Install, as the DaemonSet's container does.
        let volume = format!("{}:/host/opt/cni/bin", bin.display());
        let installed = podman.ok(&[
            "run",
            "--rm",
            "--network=none",
            "--read-only",
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            "-v",
            &volume,
            &image,
        ]);
        let (new_stamp, _) = stamp_of_about(&about_line(&release.context.join("bridge")));
        for want in [
            format!(
                "/host/opt/cni/bin/bridge: installed {new_stamp}, replacing a binary that is not cni-plugins-rs (e.g. the reference plugin)"
            ),
            format!(
                "/host/opt/cni/bin/host-local: replaced cni-plugins-rs {older} with {new_stamp}"
            ),
            format!("/host/opt/cni/bin/loopback: installed {new_stamp}"),
            format!(
                "/host/opt/cni/bin/portmap: installed {new_stamp}, replacing a binary that is not cni-plugins-rs (e.g. the reference plugin)"
            ),
        ] {
            assert!(
                installed.lines().any(|l| l == want),
                "no {want:?} in:\n{installed}"
            );
        }

        // The old ADD is still running its old binary, unlinked by the rename.
        assert!(
            !blocked.is_finished(),
            "the running ADD ended during the install"
        );
        let exe = fs::read_link(format!("/proc/{pid}/exe")).expect("exe of the running ADD");
        assert_eq!(
            exe.display().to_string(),
            format!("{} (deleted)", running_path.display())
        );
        drop(held);
        let out = blocked.join().expect("ADD thread");
        out.assert_success();
        assert_eq!(
            out.json()["ips"][0]["address"],
            "10.251.7.2/24",
            "the running ADD finished normally:\n{out}"
        );
    });

    // The installed binaries are the released ones, and they work.
    for name in PLUGINS {
        assert_eq!(
            fs::read(bin.join(name)).expect("read installed"),
            fs::read(release.context.join(name)).expect("read released"),
            "{name} is not the released binary"
        );
        let version = node_plugin(&bin, name, &host).command("VERSION").run();
        version.assert_success();
        assert_eq!(version.json()["cniVersion"], "1.1.0", "{name}: {version}");
        let about = about_line(&bin.join(name));
        assert!(
            about.starts_with(&format!(
                "CNI {name} plugin v{VERSION} (cni-plugins-rs, commit "
            )) && about.ends_with("; not the Go reference plugins)"),
            "{name}: {about:?}"
        );
    }
    let second_add = node_plugin(&bin, "host-local", &host)
        .command("ADD")
        .attachment("cnibb-after", &pod, "eth0")
        .config(&conf)
        .run();
    second_add.assert_success();
    assert_eq!(second_add.json()["ips"][0]["address"], "10.251.7.3/24");
    for id in ["cnibb-running", "cnibb-after"] {
        node_plugin(&bin, "host-local", &host)
            .command("DEL")
            .attachment(id, &pod, "eth0")
            .config(&conf)
            .run()
            .assert_success_silent();
    }
    assert_eq!(
        fs::read(bin.join("tuning")).expect("read tuning"),
        tuning_before
    );

    // Idempotent: a second run (a restarted pod) changes nothing.
    let inodes: Vec<u64> = PLUGINS.iter().map(|n| inode(&bin.join(n))).collect();
    assert!(
        inodes.iter().all(|i| *i == inodes[0]),
        "the installed plugins are not hard links of one file: {inodes:?}"
    );
    let volume = format!("{}:/host/opt/cni/bin", bin.display());
    let again = podman.ok(&[
        "run",
        "--rm",
        "--network=none",
        "--read-only",
        "-v",
        &volume,
        &image,
    ]);
    assert_eq!(
        again.matches(": unchanged, v").count(),
        PLUGINS.len(),
        "{again}"
    );
    assert_eq!(
        PLUGINS
            .iter()
            .map(|n| inode(&bin.join(n)))
            .collect::<Vec<_>>(),
        inodes
    );
    let mut names: Vec<String> = fs::read_dir(&bin)
        .expect("read node bin")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "bandwidth",
            "bridge",
            "host-local",
            "loopback",
            "portmap",
            "tuning"
        ]
    );

    // The DaemonSet's container: install, sleep, and exit 0 on SIGTERM (pid 1, no shell).
    let name = unique_name("cnibb-ds");
    podman.ok(&[
        "run",
        "-d",
        "--name",
        &name,
        "--network=none",
        "--read-only",
        "-v",
        &volume,
        &image,
        "--dest",
        "/host/opt/cni/bin",
        "--sleep-forever",
    ]);
    let asleep = eventually(Duration::from_secs(60), || {
        let logs = podman.podman(&["logs", &name]);
        String::from_utf8_lossy(&logs.stdout)
            .contains("installed; sleeping until SIGTERM")
            .then_some(())
    });
    assert!(
        asleep.is_some(),
        "--sleep-forever did not start sleeping: {}",
        podman.ok(&["logs", &name])
    );
    podman.ok(&["stop", "--time", "60", &name]);
    assert_eq!(
        podman.ok(&["inspect", "--format", "{{.State.ExitCode}}", &name]),
        "0",
        "stopped with SIGTERM: {}",
        podman.ok(&["logs", &name])
    );
    assert!(podman.ok(&["logs", &name]).ends_with("SIGTERM: exiting"));
    podman.ok(&["rm", &name]);
    podman.assert_no_strays();
}

#[test]
fn daemonset_runs_this_release_as_the_test_above_does() {
    // The manifest is text for kubectl; these are the lines the image test relies on
    // (the installer as the init container, the agent as the main one, with the flags and
    // the service account rbac.yaml defines), and the image tag, which must follow the
    // workspace version.
    let path = workspace_root().join("deploy/kubernetes/daemonset.yaml");
    let manifest = fs::read_to_string(&path).expect("read daemonset.yaml");
    for want in [
        format!("image: cni-plugins-rs:v{VERSION}"),
        r#"args: ["--dest", "/host/opt/cni/bin"]"#.to_owned(),
        r#"command: ["/cni-plugins-rs/cni-installer"]"#.to_owned(),
        r#"command: ["/cni-plugins-rs/cni-node"]"#.to_owned(),
        "- --cni-conf-dir=/host/etc/cni/net.d".to_owned(),
        "- --cni-bin-dir=/host/opt/cni/bin".to_owned(),
        "fieldPath: spec.nodeName".to_owned(),
        "serviceAccountName: cni-node".to_owned(),
        r#"add: ["NET_ADMIN"]"#.to_owned(),
        "mountPath: /host/opt/cni/bin".to_owned(),
        "path: /opt/cni/bin".to_owned(),
        "hostNetwork: true".to_owned(),
        "readOnlyRootFilesystem: true".to_owned(),
        r#"drop: ["ALL"]"#.to_owned(),
    ] {
        assert!(
            manifest.lines().any(|l| l.trim() == want),
            "{}: no line {want:?}",
            path.display()
        );
    }
}

#[test]
fn daemonset_serves_probes_and_metrics_where_the_kubelet_and_a_scraper_reach_them() {
    // The agent listens on the node's InternalIP (a hostNetwork pod's IP), port 9743:
    // the probes must not ask 127.0.0.1 (nothing listens there then), and the Prometheus
    // annotations name the same port and /metrics.
    let path = workspace_root().join("deploy/kubernetes/daemonset.yaml");
    let manifest = fs::read_to_string(&path).expect("read daemonset.yaml");
    let lines: Vec<&str> = manifest
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    for want in [
        "- --health-addr=$(HOST_IP):9743",
        "- name: HOST_IP",
        "fieldPath: status.hostIP",
        "containerPort: 9743",
        r#"prometheus.io/scrape: "true""#,
        r#"prometheus.io/port: "9743""#,
        "prometheus.io/path: /metrics",
        "path: /readyz",
        "path: /healthz",
    ] {
        assert!(
            lines.contains(&want),
            "{}: no line {want:?}",
            path.display()
        );
    }
    assert_eq!(
        lines.iter().filter(|l| **l == "port: 9743").count(),
        2,
        "{}: both probes on port 9743",
        path.display()
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("host:")),
        "{}: a probe with a host; the agent listens on the pod's (the node's) IP",
        path.display()
    );
}

#[test]
fn rbac_lets_the_agent_read_what_it_watches_patch_nodes_and_nothing_else() {
    // The ClusterRole's rules, flattened to (group, resource) -> verbs: exactly get,
    // list and watch on what the agent watches, patch on nodes (its own Node's WireGuard
    // key annotation), no other resource, no other verb.
    let path = workspace_root().join("deploy/kubernetes/rbac.yaml");
    let manifest = fs::read_to_string(&path).expect("read rbac.yaml");
    let role = manifest
        .split("\n---\n")
        .find(|doc| doc.lines().any(|l| l == "kind: ClusterRole"))
        .expect("a ClusterRole");
    let list = |line: &str, key: &str| -> Option<Vec<String>> {
        let rest = line.trim().trim_start_matches("- ").strip_prefix(key)?;
        let inner = rest.trim().strip_prefix('[')?.strip_suffix(']')?;
        Some(
            inner
                .split(',')
                .map(|s| s.trim().trim_matches('"').to_owned())
                .collect(),
        )
    };
    let mut granted = Vec::new();
    let (mut groups, mut resources) = (Vec::new(), Vec::new());
    for line in role.lines().skip_while(|l| *l != "rules:").skip(1) {
        if let Some(g) = list(line, "apiGroups:") {
            groups = g;
        } else if let Some(r) = list(line, "resources:") {
            resources = r;
        } else if let Some(verbs) = list(line, "verbs:") {
            for group in &groups {
                for resource in &resources {
                    granted.push((group.clone(), resource.clone(), verbs.join(",")));
                }
            }
        } else {
            panic!(
                "{}: a rule line this test does not read: {line:?}",
                path.display()
            );
        }
    }
    granted.sort();
    let mut want: Vec<(String, String, String)> = [
        ("", "namespaces"),
        ("", "nodes"),
        ("", "pods"),
        ("networking.k8s.io", "networkpolicies"),
        ("policy.networking.k8s.io", "clusternetworkpolicies"),
    ]
    .iter()
    .map(|(g, r)| {
        let verbs = if *r == "nodes" {
            "get,list,watch,patch"
        } else {
            "get,list,watch"
        };
        ((*g).to_owned(), (*r).to_owned(), verbs.to_owned())
    })
    .collect();
    want.sort();
    assert_eq!(granted, want, "{}", path.display());
}

// ---------------------------------------------------------------------------------------
// The release
// ---------------------------------------------------------------------------------------

/// The output of `deploy/release.sh` and the tarball unpacked.
struct Release {
    dist: TempDir,
    /// The unpacked tarball: the image's build context.
    context: PathBuf,
    tarball: String,
}

impl Release {
    fn build() -> Self {
        let dist = TempDir::new("cnibb-dist");
        let out = Command::new("bash")
            .arg(workspace_root().join("deploy/release.sh"))
            .arg("--out")
            .arg(dist.path())
            .current_dir(workspace_root())
            .output()
            .expect("run deploy/release.sh");
        assert!(
            out.status.success(),
            "deploy/release.sh failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let tarball = format!("cni-plugins-rs-linux-amd64-v{VERSION}.tgz");
        let context = dist.path().join("context");
        fs::create_dir(&context).expect("mkdir context");
        run_ok(
            Command::new("tar")
                .arg("-xzf")
                .arg(dist.path().join(&tarball))
                .arg("-C")
                .arg(&context),
        );
        Self {
            dist,
            context,
            tarball,
        }
    }

    /// The tarball holds exactly the files it should, flat; the checksum files have the
    /// reference's format and verify; every binary is static.
    fn check(&self) {
        let listing = run_ok(
            Command::new("tar")
                .arg("-tzf")
                .arg(self.dist.path().join(&self.tarball)),
        );
        assert_eq!(
            listing.lines().collect::<Vec<_>>(),
            [
                "./",
                "./LICENSE",
                "./README.md",
                "./bandwidth",
                "./bridge",
                "./cni-installer",
                "./cni-node",
                "./host-local",
                "./loopback",
                "./portmap"
            ]
        );
        for (ext, tool, hex_len) in [("sha256", "sha256sum", 64), ("sha512", "sha512sum", 128)] {
            let file = format!("{}.{ext}", self.tarball);
            let text = fs::read_to_string(self.dist.path().join(&file))
                .unwrap_or_else(|e| panic!("read {file}: {e}"));
            let (hash, name) = text
                .strip_suffix('\n')
                .and_then(|l| l.split_once("  "))
                .unwrap_or_else(|| panic!("{file}: not \"<hash>  <name>\\n\": {text:?}"));
            assert_eq!(name, self.tarball, "{file}");
            assert!(
                hash.len() == hex_len && hash.bytes().all(|b| b.is_ascii_hexdigit()),
                "{file}: {hash:?}"
            );
            run_ok(
                Command::new(tool)
                    .arg("--check")
                    .arg(&file)
                    .current_dir(self.dist.path()),
            );
        }
        // One multi-call executable, stored once: the plugin names are hard links.
        let inodes: Vec<u64> = PLUGINS
            .iter()
            .map(|n| inode(&self.context.join(n)))
            .collect();
        assert!(
            inodes.iter().all(|i| *i == inodes[0]),
            "the released plugins are not hard links of one file: {inodes:?}"
        );
        for name in PLUGINS.iter().chain(&["cni-installer", "cni-node"]) {
            let out = Command::new("ldd")
                .arg(self.context.join(name))
                .output()
                .expect("run ldd");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                text.contains("not a dynamic executable"),
                "{name} is not static: {text}"
            );
        }
    }
}

/// Plugin `name` of the node's bin dir, which is also its `CNI_PATH`.
fn node_plugin<'a>(bin: &Path, name: &str, host: &'a Netns) -> Plugin<'a> {
    Plugin::at(&bin.join(name), host).cni_path(&bin.display().to_string())
}

/// The about line a plugin prints on stderr when `CNI_COMMAND` is unset.
fn about_line(binary: &Path) -> String {
    let out = Command::new(binary)
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", binary.display()));
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// From an about line, the stamp as the installer prints it (`v0.1.0 (commit abc)`) and
/// the commit.
fn stamp_of_about(about: &str) -> (String, String) {
    let commit = about
        .split_once("(cni-plugins-rs, commit ")
        .and_then(|(_, rest)| rest.split_once(';'))
        .map(|(commit, _)| commit.to_owned())
        .unwrap_or_else(|| panic!("no commit in {about:?}"));
    (format!("v{VERSION} (commit {commit})"), commit)
}

/// A copy of `binary` whose stamp says an older version (every digit of ours set to 0,
/// same length, so nothing else in the binary moves): what an earlier release looks like
/// to the installer. Returns the stamp as the installer prints it, and the bytes.
fn older_build(binary: &Path) -> (String, Vec<u8>) {
    let older: String = VERSION
        .chars()
        .map(|c| if c.is_ascii_digit() { '0' } else { c })
        .collect();
    assert_ne!(older, VERSION, "no older version than {VERSION} to fake");
    let mut bytes = fs::read(binary).expect("read released host-local");
    let needle = format!(" v{VERSION} (cni-plugins-rs, commit ");
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .expect("stamp in the released host-local");
    let patched = format!(" v{older} (cni-plugins-rs, commit ");
    bytes[at..at + patched.len()].copy_from_slice(patched.as_bytes());
    let (_, commit) = stamp_of_about(&about_line(binary));
    (format!("v{older} (commit {commit})"), bytes)
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .ino()
}

/// The pid of a process running the executable `path`, if any.
fn pid_running(path: &Path) -> Option<u32> {
    pids()
        .into_iter()
        .find(|pid| fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == path))
}

#[track_caller]
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---------------------------------------------------------------------------------------
// A private podman (the approach of podman.rs, without CNI networks)
// ---------------------------------------------------------------------------------------

/// Podman with private storage, config, /var/lib and /run, in a throwaway netns.
struct Podman {
    /// `sleep` in the private mount namespace; podman runs in its namespace.
    holder: Child,
    host: Netns,
    root: TempDir,
    /// Cgroup dirs of [`CGROUP_PARENTS`] that did not exist before this test.
    new_cgroups: Vec<PathBuf>,
}

impl Podman {
    fn new() -> Self {
        let new_cgroups = missing_cgroup_dirs();
        let host = Netns::new("cnibb-img-podman");
        let root = TempDir::new("cnibb-img-podman");
        for dir in ["graph", "run", "tmp", "net.d", "varlib"] {
            fs::create_dir(root.path().join(dir)).unwrap_or_else(|e| panic!("mkdir {dir}: {e}"));
        }
        let holder = spawn_holder(&root.path().join("varlib"), "cnibb-img-run");
        let podman = Self {
            holder,
            host,
            root,
            new_cgroups,
        };
        let (nofile, nproc) = hard_limits();
        write(
            &podman.dir("containers.conf"),
            &format!(
                r#"[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]

[network]
network_backend = "cni"
network_config_dir = "{netd}"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "{tmp}"
image_copy_tmp_dir = "{tmp}"
"#,
                nofile = nofile.min(1024),
                nproc = nproc.min(4096),
                netd = podman.dir("net.d").display(),
                tmp = podman.dir("tmp").display(),
            ),
        );
        write(
            &podman.dir("storage.conf"),
            &format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                podman.dir("graph").display(),
                podman.dir("run").display()
            ),
        );
        podman
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    /// Runs `podman <args>` in the throwaway netns and the private mount namespace.
    fn podman(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg("--target")
            .arg(self.holder.id().to_string())
            .arg("--mount")
            .arg(format!("--net={}", self.host.path_str()))
            .args(["timeout", "300", "podman"])
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.root.path())
            .env("TMPDIR", self.dir("tmp"))
            .env("CONTAINERS_CONF", self.dir("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir("storage.conf"))
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run podman {args:?}: {e}"))
    }

    /// `podman <args>`, which must succeed; returns its stdout, trimmed.
    #[track_caller]
    fn ok(&self, args: &[&str]) -> String {
        let out = self.podman(args);
        assert!(
            out.status.success(),
            "podman {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Nothing but the holder is left in our mount namespace (conmon exits right after
    /// its container: wait for that, bounded).
    #[track_caller]
    fn assert_no_strays(&self) {
        let gone = eventually(Duration::from_secs(10), || {
            self.strays().is_empty().then_some(())
        });
        let left: Vec<String> = self.strays().into_iter().map(cmdline).collect();
        assert!(gone.is_some(), "processes left after podman rm: {left:?}");
    }

    /// Pids in our private mount namespace other than the holder.
    fn strays(&self) -> Vec<u32> {
        let holder = self.holder.id();
        let Ok(ns) = fs::read_link(format!("/proc/{holder}/ns/mnt")) else {
            return Vec::new();
        };
        pids()
            .into_iter()
            .filter(|&pid| pid != holder)
            .filter(|pid| fs::read_link(format!("/proc/{pid}/ns/mnt")).is_ok_and(|l| l == ns))
            .collect()
    }
}

impl Drop for Podman {
    /// Best effort, never panics: remove the containers, kill what is left in our mount
    /// namespace (and its children), end the namespace, remove new cgroup dirs.
    fn drop(&mut self) {
        let rm = self.podman(&["rm", "--all", "--force", "--time", "0"]);
        if !rm.status.success() {
            warn(&format!(
                "podman rm -af failed: {}",
                String::from_utf8_lossy(&rm.stderr)
            ));
        }
        let strays = self.strays();
        for pid in children_of(&strays).into_iter().chain(strays) {
            warn(&format!("killing stray process {pid}: {}", cmdline(pid)));
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        for dir in &self.new_cgroups {
            // Fails (harmlessly) while something still uses it.
            let _ = fs::remove_dir(dir);
        }
    }
}
