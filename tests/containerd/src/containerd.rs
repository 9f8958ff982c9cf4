//! A private containerd with the CRI plugin pointed at our plugin binaries.
//!
//! Isolation, so that a test never meets the machine's containerd, CNI cache or network:
//! - a throwaway "host" netns ([`Netns`]) in which containerd runs (entered with
//!   `nsenter --net=`, not `ip netns exec`, which would remount /sys and hide the cgroup
//!   mounts runc needs): our bridge, the veths and the masquerade rules live there;
//! - a private mount namespace held by a `sleep` ((the `holder` field)) with a tmpfs
//!   on /run (containerd 1.6 hard-codes /run/containerd for shim sockets and runc state)
//!   and on /var/lib (go-cni's result cache in /var/lib/cni): the pod netns pins, rootfs
//!   overlays and shim sockets all die with that namespace;
//! - its own root, state, socket and `opt` dir in a [`TempDir`], which also holds the
//!   copied plugins (`bin_dir`), the CNI `conf_dir`, the `conf_template` and the
//!   host-local `dataDir` the tests inspect;
//! - sandboxes under a cgroup parent of the fixture's own, so that Drop finds the sandbox
//!   processes (killing the shims does not end them) and removes the cgroups.
//!
//! The sandbox image is `FROM scratch` with busybox-static, built by Podman into a private
//! storage root and imported with `ctr -n k8s.io images import`: nothing is pulled.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cni_blackbox::{Netns, TempDir, bin_dir, kernel, unique_ifname, unique_name};

use crate::cri::Cri;
use crate::procs;

/// The network name in the conflist; host-local keeps its files under `<dataDir>/<NETWORK>`.
pub const NETWORK: &str = "cnibb-k8s";
/// The sandbox ("pause") image, built locally.
pub const SANDBOX_IMAGE: &str = "localhost/cnibb-pause:latest";
/// Bound on containerd becoming ready (it is ready in about a second here).
const START_LIMIT: Duration = Duration::from_secs(60);

/// A running private containerd and its CRI client. Dropping it ends every process it
/// started and removes its cgroups, mounts (with the mount namespace), netns and files.
#[derive(Debug)]
pub struct Containerd {
    /// Holds the private mount namespace.
    holder: Child,
    daemon: Option<Child>,
    cri: Option<Cri>,
    cgroup_parent: String,
    bridge: String,
    // Dropped after the processes are gone (field order): the netns, then the files.
    host: Netns,
    dir: TempDir,
}

impl Containerd {
    /// Starts containerd with the conflist template `template` (a Go template; `@DATADIR@`
    /// is replaced by the host-local `dataDir`, `@BRIDGE@` by a bridge name unique to
    /// this fixture, so that the machine can be checked for it afterwards), imports the sandbox image and connects
    /// the CRI client. NetworkReady is false until [`Cri::update_pod_cidr`].
    pub fn start(template: &str) -> Self {
        Self::start_with(Some(template))
    }

    /// Starts containerd with no `conf_template`: the conflist must come from elsewhere
    /// (the node agent writes it into [`Containerd::conf_dir`]), as on a CRI-O node or a
    /// containerd node that kubelet never hands a pod CIDR.
    pub fn start_without_template() -> Self {
        Self::start_with(None)
    }

    fn start_with(template: Option<&str>) -> Self {
        let host = Netns::new("cnibb-ctrd");
        // containerd's streaming server listens on 127.0.0.1.
        host.exec_ok(&["ip", "link", "set", "lo", "up"]);
        let dir = TempDir::new("cnibb-ctrd");
        for sub in [
            "bin", "net.d", "ipam", "root", "state", "opt", "tmp", "image",
        ] {
            fs::create_dir(dir.path().join(sub)).unwrap_or_else(|e| panic!("mkdir {sub}: {e}"));
        }
        let holder = spawn_holder();
        let mut fixture = Self {
            holder,
            daemon: None,
            cri: None,
            cgroup_parent: format!("/{}", unique_name("cnibb-ctrd")),
            bridge: unique_ifname("cnibb"),
            host,
            dir,
        };
        fixture.install_plugins();
        fixture.write_config(template);
        fixture.start_daemon();
        fixture.import_sandbox_image();
        fixture
    }

    /// The CRI client.
    pub fn cri(&self) -> &Cri {
        self.cri
            .as_ref()
            .unwrap_or_else(|| panic!("containerd is not running"))
    }

    /// The test's host netns, where containerd runs the plugins.
    pub fn host(&self) -> &Netns {
        &self.host
    }

    /// The bridge named in the conflist.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// The cgroup parent every sandbox gets (cgroupfs path).
    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }

    /// containerd's CNI `conf_dir`.
    pub fn conf_dir(&self) -> PathBuf {
        self.path("net.d")
    }

    /// containerd's CNI `bin_dir` (our plugins).
    pub fn plugin_dir(&self) -> PathBuf {
        self.path("bin")
    }

    /// host-local's `dataDir` (networks live in subdirectories named after them).
    pub fn ipam_dir(&self) -> PathBuf {
        self.path("ipam")
    }

    /// A path for the test's own files, removed with the fixture.
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.path(name)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn path_str(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// host-local's reservations of [`NETWORK`]: address -> `<id>\r\n<ifname>`.
    pub fn reservations(&self) -> BTreeMap<String, String> {
        cni_blackbox::ipam::reservations(&self.path("ipam").join(NETWORK))
    }

    /// The conflist containerd rendered from the template, if any.
    pub fn rendered_conflist(&self) -> Option<serde_json::Value> {
        let text = fs::read_to_string(self.path("net.d/10-containerd-net.conflist")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Links in the host netns whose peer is in another netns: the host ends of pod
    /// veths (a test's own links within the host netns do not count).
    pub fn host_veths(&self) -> Vec<String> {
        kernel::links(&self.host)
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l.get("link_netnsid").is_some())
            .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
            .filter(|n| n != "lo" && *n != self.bridge)
            .collect()
    }

    /// containerd's log so far (for failure messages).
    pub fn log(&self) -> String {
        fs::read_to_string(self.path("containerd.log")).unwrap_or_default()
    }

    /// The plugins containerd may run: our five as shipped, one copy of the multi-call
    /// binary hard-linked under each name (so the bridge runs host-local in-process).
    /// `bin_dir` must hold `loopback` even though the conflist's own loopback entry is
    /// optional, because containerd sets up each pod's `lo` with it too.
    fn install_plugins(&self) {
        let first = self.path("bin").join("bridge");
        let from = bin_dir().join("bridge");
        fs::copy(&from, &first).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
        for plugin in ["host-local", "loopback", "portmap", "bandwidth"] {
            fs::hard_link(&first, self.path("bin").join(plugin))
                .unwrap_or_else(|e| panic!("link {plugin} to {}: {e}", first.display()));
        }
    }

    fn write_config(&self, template: Option<&str>) {
        let template_line = match template {
            Some(template) => {
                write(
                    &self.path("template.json"),
                    &template
                        .replace("@DATADIR@", &self.path_str("ipam"))
                        .replace("@BRIDGE@", &self.bridge),
                );
                format!("conf_template = \"{}\"", self.path_str("template.json"))
            }
            None => String::new(),
        };
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{dir}/containerd.sock"

[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{netd}"
    max_conf_num = 1
    {template_line}
"#,
            root = self.path_str("root"),
            state = self.path_str("state"),
            dir = self.dir.path_str(),
            opt = self.path_str("opt"),
            bin = self.path_str("bin"),
            netd = self.path_str("net.d"),
        );
        write(&self.path("config.toml"), &config);
    }

    /// A command run inside the private mount namespace and the host netns.
    fn inside(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg("--target")
            .arg(self.holder.id().to_string())
            .arg("--mount")
            .arg(format!("--net={}", self.host.path_str()))
            .arg("--")
            .arg(program)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("TMPDIR", self.path("tmp"))
            .stdin(Stdio::null());
        cmd
    }

    fn start_daemon(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("containerd.log"))
            .unwrap_or_else(|e| panic!("containerd.log: {e}"));
        let err = log
            .try_clone()
            .unwrap_or_else(|e| panic!("containerd.log: {e}"));
        let mut cmd = self.inside("containerd");
        cmd.arg("--config")
            .arg(self.path("config.toml"))
            .stdout(log)
            .stderr(err);
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start containerd (apt-get install containerd): {e}")
        });
        self.daemon = Some(child);
        let socket = self.path("containerd.sock");
        let deadline = Instant::now() + START_LIMIT;
        let mut last = String::from("socket not created");
        loop {
            if let Some(Ok(Some(status))) = self.daemon.as_mut().map(Child::try_wait) {
                panic!("containerd exited ({status}):\n{}", self.log());
            }
            if socket.exists() {
                match Cri::connect(&socket).and_then(|cri| Ok((cri.status()?, cri))) {
                    Ok((status, cri)) if status.runtime_ready => {
                        self.cri = Some(cri);
                        return;
                    }
                    Ok(_) => last = "RuntimeReady is false".to_owned(),
                    Err(e) => last = e,
                }
            }
            assert!(
                Instant::now() < deadline,
                "containerd not ready after {START_LIMIT:?}: {last}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops containerd (SIGTERM, as systemd would on a restart) and starts it again
    /// with the same config; shims and sandboxes keep running meanwhile.
    pub fn restart(&mut self) {
        self.cri = None;
        if let Some(mut daemon) = self.daemon.take() {
            procs::signal(daemon.id(), nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            while matches!(daemon.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        self.start_daemon();
    }

    /// Builds the sandbox image with Podman (private storage, in our mount namespace)
    /// and imports it into containerd's `k8s.io` namespace.
    fn import_sandbox_image(&self) {
        let context = self.path("image");
        fs::copy("/bin/busybox", context.join("busybox"))
            .unwrap_or_else(|e| panic!("copy /bin/busybox (apt-get install busybox-static): {e}"));
        write(
            &context.join("Containerfile"),
            "FROM scratch\nCOPY busybox /bin/busybox\n\
             ENTRYPOINT [\"/bin/busybox\", \"sleep\", \"2147483647\"]\n",
        );
        // Podman's CNI backend takes a lock file in its network config directory even for
        // a build without a network: a private containers.conf and directory keep it (and
        // anything else of Podman's) out of the machine's /etc/cni/net.d.
        fs::create_dir(self.path("podman-net.d"))
            .unwrap_or_else(|e| panic!("mkdir podman-net.d: {e}"));
        write(
            &self.path("containers.conf"),
            &format!(
                "[network]\nnetwork_backend = \"cni\"\nnetwork_config_dir = \"{}\"\n\n\
                 [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\n\
                 events_logger = \"none\"\ntmp_dir = \"{}\"\n",
                self.path_str("podman-net.d"),
                self.path_str("tmp")
            ),
        );
        let podman_args = [
            "--network-config-dir".to_owned(),
            self.path_str("podman-net.d"),
            "--root".to_owned(),
            self.path_str("podman-root"),
            "--runroot".to_owned(),
            self.path_str("podman-run"),
            "--storage-driver".to_owned(),
            "vfs".to_owned(),
            "--cgroup-manager".to_owned(),
            "cgroupfs".to_owned(),
            "--events-backend".to_owned(),
            "none".to_owned(),
            "--tmpdir".to_owned(),
            self.path_str("tmp"),
        ];
        let tarball = self.path_str("pause.tar");
        let context_str = context.display().to_string();
        let steps: [(&str, Vec<&str>); 3] = [
            (
                "podman",
                vec![
                    "build",
                    "--network",
                    "none",
                    "-t",
                    SANDBOX_IMAGE,
                    "-f",
                    "Containerfile",
                    &context_str,
                ],
            ),
            ("podman", vec!["save", "-o", &tarball, SANDBOX_IMAGE]),
            ("ctr", vec!["-n", "k8s.io", "images", "import", &tarball]),
        ];
        for (program, args) in steps {
            let mut cmd = self.inside(program);
            if program == "podman" {
                cmd.env("CONTAINERS_CONF", self.path("containers.conf"))
                    .args(&podman_args)
                    .current_dir(&context);
            } else {
                cmd.arg("--address").arg(self.path("containerd.sock"));
            }
            cmd.args(&args);
            let out = output(&mut cmd);
            assert!(
                out.status.success(),
                "{program} {args:?} failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Processes left in the fixture's cgroup parent (sandbox processes).
    pub fn sandbox_processes(&self) -> Vec<u32> {
        procs::cgroup_pids(&self.cgroup_parent)
            .into_iter()
            .filter(|&p| procs::alive(p))
            .collect()
    }

    /// Pids in the private mount namespace other than the holder: containerd and shims.
    fn daemons(&self) -> Vec<u32> {
        procs::mount_ns(self.holder.id())
            .map(|ns| procs::in_mount_ns(&ns, self.holder.id()))
            .unwrap_or_default()
    }

    /// Shim processes (`containerd-shim-runc-v2`) now running for this containerd.
    pub fn shims(&self) -> Vec<u32> {
        self.daemons()
            .into_iter()
            .filter(|&p| procs::cmdline(p).contains("containerd-shim"))
            .collect()
    }
}

impl Drop for Containerd {
    /// Best effort, never panics: containerd, shims and sandbox processes are killed,
    /// the holder ends the mount namespace (and every mount in it), the cgroups go;
    /// then the netns and directory guards remove the rest.
    fn drop(&mut self) {
        self.cri = None;
        if let Some(mut daemon) = self.daemon.take() {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        let parent = self.cgroup_parent.clone();
        let holder = self.holder.id();
        let ns = procs::mount_ns(holder);
        let left = procs::kill_until_gone(Duration::from_secs(10), || {
            let mut pids = procs::cgroup_pids(&parent);
            if let Some(ns) = &ns {
                pids.extend(procs::in_mount_ns(ns, holder));
            }
            pids
        });
        for pid in left {
            warn(&format!(
                "process {pid} survived SIGKILL: {}",
                procs::cmdline(pid)
            ));
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        for dir in procs::remove_cgroups(&parent) {
            warn(&format!("could not remove cgroup {}", dir.display()));
        }
    }
}

/// Starts `sleep` in a new mount namespace (propagation private: nothing mounted in it
/// reaches the machine) with fresh tmpfs mounts on /run and /var/lib. Returns once they
/// are in place.
fn spawn_holder() -> Child {
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(
            "mount -t tmpfs -o mode=0755,size=64m cnibb-ctrd-run /run && \
             mount -t tmpfs -o mode=0755,size=64m cnibb-ctrd-varlib /var/lib && \
             echo ready && exec sleep 2147483647",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run unshare (util-linux): {e}"));
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = BufReader::new(stdout).read_line(&mut line);
    }
    if line.trim() != "ready" {
        let _ = child.kill();
        let out = child.wait_with_output().ok();
        panic!(
            "private mount namespace not set up: {:?}",
            out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        );
    }
    child
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn warn(message: &str) {
    let _ = writeln!(std::io::stderr(), "warning: {message}");
}

/// Runs `ping -c 1` from inside the network namespace of process `pid` (a sandbox) to
/// `address`, retrying for up to `limit` (neighbour and IPv6 address setup are
/// asynchronous); returns ping's output of the last attempt on failure.
pub fn ping_from(pid: u32, address: &str, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let out = output(
            Command::new("nsenter")
                .arg(format!("--net=/proc/{pid}/ns/net"))
                .args(["--", "ping", "-c", "1", "-W", "2", address]),
        );
        if out.status.success() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
