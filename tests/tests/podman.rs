//! Our plugins under Podman 4.3's CNI backend, the way a Podman user deploys them:
//! `network_backend = "cni"`, our binaries first in `cni_plugin_dirs`, a conflist with
//! our `bridge` + `host-local` and `portmap`, then the reference `firewall` and `tuning`.
//!
//! Isolation. Podman would build its bridge, veths and iptables rules in the netns it
//! runs in, and keep state under /var/lib and /run. So every podman command runs
//! - in a throwaway host netns (`nsenter --net=<host>`): bridge, veths and rules live
//!   there and vanish with it;
//! - in a private mount namespace held by a `sleep` process we start (`unshare --mount`,
//!   propagation slave), in which /var/lib is a bind mount of a temp dir and /run is a
//!   fresh tmpfs: libcni's result cache (/var/lib/cni), containers/image's blob cache
//!   (/var/lib/containers/cache), runc's state (/run/runc) and podman's container netns
//!   files (/run/netns) never reach the machine; the mounts podman makes (netns pins,
//!   shm) die with that namespace;
//! - with a private containers.conf (CONTAINERS_CONF, also handed to conmon and its
//!   cleanup command) and storage.conf (graphroot/runroot in the temp dir, vfs driver).
//!
//! The image is a busybox-static rootfs imported with `podman import` (nothing is
//! pulled). Drop removes the containers (`podman rm -af`), kills anything left in the
//! private mount namespace (conmon) and its children, kills the holder, removes cgroup
//! dirs podman created, then the netns and temp dir guards remove the rest, also when
//! a test fails. The podman tests of this file run one at a time.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cni_blackbox::hostport::{NODE_V4, NODE_V6, client_on_uplink};
use cni_blackbox::podman::{
    children_of, cmdline, eventually, hard_limits, missing_cgroup_dirs, pids, require_podman,
    spawn_holder, warn, write,
};
use cni_blackbox::{Netns, TempDir, bin_dir, kernel, unique_ifname, unique_name};

/// The reference plugins (portmap, firewall, tuning; also Go bridge/host-local, which
/// must lose to ours).
const REFERENCE_DIR: &str = "/usr/lib/cni";
/// The image every container runs.
const IMAGE: &str = "localhost/cnibb-busybox:latest";
/// Busybox applets linked into the image's /bin.
const APPLETS: [&str; 12] = [
    "sh", "ping", "ip", "nc", "httpd", "sleep", "cat", "ls", "wget", "echo", "sysctl", "ps",
];
/// Served by busybox httpd in the published-port test.
const PAGE: &str = "hello from a cnibb container\n";

// ---------------------------------------------------------------------------------------
// The podman environment
// ---------------------------------------------------------------------------------------

/// Podman tests share the machine's cgroup tree (`libpod_parent`) and are heavy: one at a
/// time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A private podman installation running inside a throwaway host netns and a private
/// mount namespace, with one CNI network of ours. Everything goes away on drop.
struct Podman {
    _serial: MutexGuard<'static, ()>,
    /// `sleep` in the private mount namespace; podman runs in its namespace.
    holder: Child,
    host: Netns,
    root: TempDir,
    network: String,
    bridge: String,
    /// Cgroup dirs of [`CGROUP_PARENTS`] that did not exist before this test.
    new_cgroups: Vec<PathBuf>,
}

impl Podman {
    /// A podman with one network of ours whose conflist says `cni_version`.
    fn new(cni_version: &str) -> Self {
        Self::with_portmap_backend(cni_version, None)
    }

    /// [`Podman::new`] with portmap's `backend` set (`None`: its default).
    fn with_portmap_backend(cni_version: &str, backend: Option<&str>) -> Self {
        let serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let new_cgroups = missing_cgroup_dirs();
        let host = Netns::new("cnibb-pm-host");
        let root = TempDir::new("cnibb-podman");
        for dir in ["graph", "run", "tmp", "net.d", "data", "varlib", "rootfs"] {
            fs::create_dir(root.path().join(dir)).unwrap_or_else(|e| panic!("mkdir {dir}: {e}"));
        }
        let holder = spawn_holder(&root.path().join("varlib"), "cnibb-podman-run");
        let podman = Self {
            _serial: serial,
            holder,
            host,
            root,
            network: unique_name("cnibb-pmnet"),
            bridge: unique_ifname("pmbr"),
            new_cgroups,
        };
        podman.write_configs(cni_version, backend);
        podman.import_image();
        podman
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    fn dir_str(&self, name: &str) -> String {
        self.dir(name).display().to_string()
    }

    /// containers.conf, storage.conf and the network's conflist.
    fn write_configs(&self, cni_version: &str, portmap_backend: Option<&str>) {
        let (nofile, nproc) = hard_limits();
        let containers_conf = format!(
            r#"[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]

[network]
network_backend = "cni"
cni_plugin_dirs = ["{ours}", "{REFERENCE_DIR}"]
network_config_dir = "{netd}"
default_network = "{network}"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "{tmp}"
image_copy_tmp_dir = "{tmp}"
"#,
            nofile = nofile.min(1024),
            nproc = nproc.min(4096),
            ours = bin_dir().display(),
            netd = self.dir_str("net.d"),
            network = self.network,
            tmp = self.dir_str("tmp"),
        );
        write(&self.dir("containers.conf"), &containers_conf);
        let storage_conf = format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            self.dir_str("graph"),
            self.dir_str("run")
        );
        write(&self.dir("storage.conf"), &storage_conf);

        // Podman's own default CNI network, with our bridge and host-local.
        let mut portmap =
            serde_json::json!({"type": "portmap", "capabilities": {"portMappings": true}});
        if let Some(backend) = portmap_backend {
            portmap["backend"] = serde_json::json!(backend);
        }
        let conflist = serde_json::json!({
            "cniVersion": cni_version,
            "name": self.network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": true,
                    "ipMasq": true,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": self.dir_str("data"),
                        "ranges": [
                            [{"subnet": "10.89.3.0/24", "gateway": "10.89.3.1"}],
                            [{"subnet": "fd89:3::/64", "gateway": "fd89:3::1"}]
                        ],
                        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]
                    }
                },
                portmap,
                {"type": "firewall", "backend": "iptables"},
                {"type": "tuning"}
            ]
        });
        write(
            &self.dir("net.d").join(format!("{}.conflist", self.network)),
            &serde_json::to_string_pretty(&conflist).unwrap_or_default(),
        );
    }

    /// A rootfs with busybox-static and its applets, imported as [`IMAGE`].
    fn import_image(&self) {
        let rootfs = self.dir("rootfs");
        for dir in ["bin", "etc", "proc", "sys", "dev", "tmp", "www"] {
            fs::create_dir_all(rootfs.join(dir)).unwrap_or_else(|e| panic!("mkdir {dir}: {e}"));
        }
        fs::copy("/bin/busybox", rootfs.join("bin/busybox"))
            .unwrap_or_else(|e| panic!("copy /bin/busybox (install busybox-static): {e}"));
        for applet in APPLETS {
            symlink("busybox", rootfs.join("bin").join(applet))
                .unwrap_or_else(|e| panic!("symlink {applet}: {e}"));
        }
        write(&rootfs.join("www/index.html"), PAGE);
        let tarball = self.dir("rootfs.tar");
        let tar = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tarball)
            .arg(".")
            .output()
            .expect("run tar");
        assert!(tar.status.success(), "tar: {tar:?}");
        self.ok(&["import", &tarball.display().to_string(), IMAGE]);
    }

    /// Runs `podman <args>` in the host netns and the private mount namespace.
    fn podman(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("nsenter");
        cmd.arg("--target")
            .arg(self.holder.id().to_string())
            .arg("--mount")
            .arg(format!("--net={}", self.host.path_str()))
            .args(["timeout", "120", "podman"])
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.root.path())
            .env("TMPDIR", self.dir("tmp"))
            .env("CONTAINERS_CONF", self.dir("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir("storage.conf"))
            .stdin(Stdio::null());
        cmd.output()
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

    /// `podman run -d` on our network; returns the full container id.
    #[track_caller]
    fn run(&self, name: &str, extra: &[&str], command: &[&str]) -> String {
        let mut args = vec!["run", "-d", "--name", name, "--network", &self.network];
        args.extend_from_slice(extra);
        args.push(IMAGE);
        args.extend_from_slice(command);
        self.ok(&args)
    }

    /// The container's IPv4 and IPv6 address on our network, as podman saw them in the
    /// CNI result.
    #[track_caller]
    fn addresses(&self, name: &str) -> (String, String) {
        let format = format!(
            "{{{{with index .NetworkSettings.Networks \"{}\"}}}}{{{{.IPAddress}}}} {{{{.GlobalIPv6Address}}}}{{{{end}}}}",
            self.network
        );
        let text = self.ok(&["inspect", "--format", &format, name]);
        let mut parts = text.split_whitespace().map(str::to_owned);
        match (parts.next(), parts.next()) {
            (Some(v4), Some(v6)) => (v4, v6),
            _ => panic!("no addresses of {name} on {}: {text:?}", self.network),
        }
    }

    /// `ip -> content` of host-local's reservation files.
    fn reservations(&self) -> BTreeMap<String, String> {
        cni_blackbox::ipam::reservations(&self.dir("data").join(&self.network))
    }

    /// Links in the host netns other than `lo` and our bridge.
    fn host_veths(&self) -> Vec<String> {
        kernel::links(&self.host)
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
            .filter(|n| n != "lo" && *n != self.bridge)
            .collect()
    }

    /// Entries of libcni's result cache (inside the private /var/lib).
    fn cni_cache_entries(&self) -> Vec<String> {
        fs::read_dir(self.dir("varlib").join("cni/results"))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// After `podman rm`: no reservation, veth, cache entry or firewall rule is left for
    /// the containers `ids` with addresses `ips`.
    #[track_caller]
    fn assert_nothing_left(&self, ids: &[&str], ips: &[&str]) {
        assert_eq!(
            self.reservations(),
            BTreeMap::new(),
            "reservations after rm"
        );
        assert_eq!(self.host_veths(), Vec::<String>::new(), "veths after rm");
        assert_eq!(
            self.cni_cache_entries(),
            Vec::<String>::new(),
            "libcni cache"
        );
        let mut needles: Vec<&str> = ids.to_vec();
        needles.extend_from_slice(ips);
        for save in ["iptables-save", "ip6tables-save"] {
            let text = self.host.exec_ok(&[save]);
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let hit = needles.iter().find(|n| line.contains(*n));
                assert!(
                    hit.is_none(),
                    "{save} still mentions {hit:?}:\n{line}\n{text}"
                );
                if let Some(chain) = line.strip_prefix(':') {
                    let chain = chain.split_whitespace().next().unwrap_or_default();
                    assert!(
                        !chain.starts_with("CNI-")
                            || chain.starts_with("CNI-HOSTPORT-")
                            || ["CNI-FORWARD", "CNI-ADMIN"].contains(&chain),
                        "per-container chain {chain} left ({save}):\n{text}"
                    );
                }
            }
        }
        let nft = self.host.exec(&["nft", "list", "ruleset"]);
        let text = String::from_utf8_lossy(&nft.stdout);
        let hit = needles.iter().find(|n| text.contains(*n));
        assert!(hit.is_none(), "nft ruleset still mentions {hit:?}:\n{text}");
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

    /// Pids in our private mount namespace other than the holder: conmon and whatever
    /// podman left running.
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

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

#[test]
fn two_containers_get_our_addresses_and_ping_each_other() {
    if !require_podman() {
        return;
    }
    let podman = Podman::new("1.0.0");
    let (a, b) = (unique_name("cnibb-a"), unique_name("cnibb-b"));
    let id_a = podman.run(&a, &[], &["sleep", "600"]);
    let id_b = podman.run(&b, &[], &["sleep", "600"]);
    let (a4, a6) = podman.addresses(&a);
    let (b4, b6) = podman.addresses(&b);

    // host-local (ours) handed out the first two addresses of each range, and its files
    // name the container and interface, as the reference writes them.
    let want = BTreeMap::from([
        (a4.clone(), format!("{id_a}\r\neth0")),
        (a6.clone(), format!("{id_a}\r\neth0")),
        (b4.clone(), format!("{id_b}\r\neth0")),
        (b6.clone(), format!("{id_b}\r\neth0")),
    ]);
    assert_eq!(podman.reservations(), want);
    let mut v4 = vec![a4.clone(), b4.clone()];
    v4.sort();
    assert_eq!(v4, ["10.89.3.2", "10.89.3.3"]);

    // The bridge that ran is ours: it sets keep_addr_on_down on the pod's interface for
    // IPv6 (reference plugins ≥ 1.7.0 do; Debian's 1.1.1 in /usr/lib/cni does not).
    assert_eq!(
        podman.ok(&[
            "exec",
            &a,
            "cat",
            "/proc/sys/net/ipv6/conf/eth0/keep_addr_on_down"
        ]),
        "1",
        "the bridge found first in cni_plugin_dirs was not ours"
    );

    // Both host veths hang on our bridge, which holds both gateways.
    assert_eq!(podman.host_veths().len(), 2, "{:?}", podman.host_veths());
    let gateways = kernel::addr_cidrs(&podman.host, &podman.bridge);
    for gw in ["10.89.3.1/24", "fd89:3::1/64"] {
        assert!(
            gateways.iter().any(|g| g == gw),
            "{gw} not on bridge: {gateways:?}"
        );
    }

    for (from, to) in [(&a, &b4), (&b, &a4), (&a, &b6), (&b, &a6)] {
        let out = podman.podman(&["exec", from, "ping", "-c", "1", "-W", "5", to]);
        assert!(
            out.status.success(),
            "{from} cannot ping {to}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    podman.ok(&["rm", "--force", "--time", "0", &a, &b]);
    podman.assert_nothing_left(&[&id_a, &id_b], &[&a4, &a6, &b4, &b6]);
    podman.assert_no_strays();
}

/// `podman run --publish` through our portmap on `backend`: the published port answers
/// on the bridge's and the uplink's addresses, from the host, from a client beside the
/// node and from the container itself (hairpin), over IPv4 and IPv6; stop and start run
/// DEL and ADD; `rm` leaves nothing.
fn published_port_reaches_the_container(backend: &str) {
    if !require_podman() {
        return;
    }
    const HOST_PORT: &str = "18080";
    let podman = Podman::with_portmap_backend("0.4.0", Some(backend));
    let client = client_on_uplink(&podman.host);
    let web = unique_name("cnibb-web");
    let id = podman.run(
        &web,
        &["--publish", &format!("{HOST_PORT}:80")],
        &["httpd", "-f", "-p", "80", "-h", "/www"],
    );
    let (ip4, ip6) = podman.addresses(&web);

    // portmap chained after our bridge got our result: a DNAT to our address.
    let rules = match backend {
        "iptables" => podman.host.exec_ok(&["iptables-save", "-t", "nat"]),
        _ => podman
            .host
            .exec_ok(&["nft", "list", "table", "ip", "cni_hostport"]),
    };
    assert!(
        rules.contains(&format!("{ip4}:80")),
        "{backend}: no DNAT to {ip4}:80:\n{rules}"
    );

    // bash's /dev/tcp is the client outside the container: the static busybox's wget
    // crashes outside its image.
    let fetch_from = |ns: &Netns, target: &str| {
        let script = format!(
            "exec 3<>/dev/tcp/{target}/{HOST_PORT} && \
             printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"
        );
        let get = || ns.exec(&["timeout", "5", "bash", "-c", &script]);
        eventually(Duration::from_secs(15), || {
            let out = get();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.status.success() && text.starts_with("HTTP/1.")).then_some(text)
        })
        .map(|response| {
            response
                .split_once("\r\n\r\n")
                .map(|(_, body)| body.to_owned())
                .unwrap_or_default()
        })
        .unwrap_or_else(|| {
            let last = get();
            panic!(
                "{backend}: nothing answered on {target} port {HOST_PORT}: {}{}\ncontainer: {}\nrules: {}",
                String::from_utf8_lossy(&last.stdout),
                String::from_utf8_lossy(&last.stderr),
                podman.ok(&["exec", &web, "sh", "-c", "ip addr; ip route; ps"]),
                rules,
            )
        })
    };
    let fetch = |target: &str| fetch_from(&podman.host, target);
    assert_eq!(fetch("10.89.3.1"), PAGE);
    assert_eq!(fetch("fd89:3::1"), PAGE, "over IPv6");
    assert_eq!(fetch_from(&client, NODE_V4), PAGE, "from a client");
    assert_eq!(
        fetch_from(&client, NODE_V6),
        PAGE,
        "from a client over IPv6"
    );
    let hairpin = podman.ok(&[
        "exec",
        &web,
        "wget",
        "-q",
        "-O",
        "-",
        &format!("http://{NODE_V4}:{HOST_PORT}/index.html"),
    ]);
    assert_eq!(hairpin, PAGE.trim_end(), "from the container itself");
    drop(client);

    // Stop runs CNI DEL (podman or conmon's cleanup command, both with our config), start
    // runs ADD again.
    podman.ok(&["stop", "--time", "0", &web]);
    assert_eq!(
        podman.reservations(),
        BTreeMap::new(),
        "stopped container kept its addresses"
    );
    podman.ok(&["start", &web]);
    let (again4, again6) = podman.addresses(&web);
    assert_eq!(
        podman.reservations().len(),
        2,
        "{:?}",
        podman.reservations()
    );
    assert_eq!(fetch("10.89.3.1"), PAGE, "after restart");

    podman.ok(&["rm", "--force", "--time", "0", &web]);
    podman.assert_nothing_left(&[&id], &[&ip4, &ip6, &again4, &again6]);
    podman.assert_no_strays();
}

#[test]
fn published_port_reaches_the_container_through_our_portmap_on_iptables() {
    published_port_reaches_the_container("iptables");
}

#[test]
fn published_port_reaches_the_container_through_our_portmap_on_nftables() {
    published_port_reaches_the_container("nftables");
}
