//! Paths and sizes that someone other than the runtime controls. The plugins run as root;
//! the operator's log location may be in a directory others can write. Each test plants
//! what an attacker could and checks that the plugin neither writes where it should not
//! nor hangs, and still does its job.

mod bridge_support;

use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bridge_support::Net;
use cni_blackbox::{TempDir, plugin_path, require_root};
use serde_json::json;

/// Runs loopback ADD in a fresh netns with the operator's log at `log`, under `umask`,
/// bounded by 10 s; returns whether it succeeded and how long it took.
fn loopback_add_logging_to(log: &Path, umask: &str) -> (bool, Duration) {
    let loopback = plugin_path("loopback");
    let net = Net::new();
    let pod = net.pod();
    let started = Instant::now();
    let out = Command::new("timeout")
        .arg("10")
        .args(["ip", "netns", "exec", net.host.name(), "sh", "-c"])
        .arg(format!("umask {umask} && exec \"$0\" < \"$1\""))
        .arg(&loopback)
        .arg({
            let conf = net.data.path().join("loopback.json");
            std::fs::write(
                &conf,
                json!({"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}).to_string(),
            )
            .expect("write config");
            conf
        })
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "hostile-log")
        .env("CNI_NETNS", pod.path())
        .env("CNI_IFNAME", "lo")
        .env("CNI_PATH", "/nonexistent")
        .env("CNI_RS_LOG_FILE", log)
        .output()
        .expect("run loopback");
    (out.status.success(), started.elapsed())
}

#[test]
fn the_log_does_not_follow_planted_symlinks() {
    if !require_root() {
        return;
    }
    let dir = TempDir::new("cnibb-hostile-log");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "root's file\n").expect("write victim");
    let log = dir.path().join("cni.log");
    symlink(&victim, &log).expect("plant symlink");
    let (ok, _) = loopback_add_logging_to(&log, "022");
    assert!(ok, "the command failed because of its log");
    assert_eq!(
        std::fs::read_to_string(&victim).expect("read victim"),
        "root's file\n",
        "the log was appended through a symlink"
    );

    // A dangling symlink: nothing is created where it points.
    let target = dir.path().join("created-elsewhere");
    let dangling = dir.path().join("dangling.log");
    symlink(&target, &dangling).expect("plant dangling symlink");
    let (ok, _) = loopback_add_logging_to(&dangling, "022");
    assert!(ok, "the command failed because of its log");
    assert!(
        !target.exists(),
        "the log created a file through a dangling symlink"
    );
}

#[test]
fn a_fifo_as_the_log_neither_blocks_nor_fails_the_command() {
    if !require_root() {
        return;
    }
    let dir = TempDir::new("cnibb-hostile-fifo");
    let fifo = dir.path().join("cni.log");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let (ok, took) = loopback_add_logging_to(&fifo, "022");
    assert!(ok, "the command failed or hung (took {took:?})");
    assert!(
        took < Duration::from_secs(5),
        "the log blocked for {took:?}"
    );
}

#[test]
fn a_new_log_is_the_owners_alone_whatever_the_umask() {
    if !require_root() {
        return;
    }
    let dir = TempDir::new("cnibb-hostile-umask");
    let log = dir.path().join("cni.log");
    let (ok, _) = loopback_add_logging_to(&log, "000");
    assert!(ok);
    let mode = std::fs::metadata(&log)
        .expect("the log was written")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "log mode {:o}", mode & 0o777);
}

/// `ipam.type` naming the plugin that is running (or a chain back to it) is refused with
/// a CNI error, in-process (the multi-call binary) and across exec'd processes alike;
/// before, the in-process case overflowed the stack (exit 134, no JSON).
#[test]
fn delegation_back_to_a_running_plugin_is_refused() {
    if !require_root() {
        return;
    }
    cni_blackbox::bin_dir();
    let net = Net::new();
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "selfdelegation",
        "type": "bridge",
        "bridge": net.bridge,
        "ipam": {"type": "bridge"}
    });
    // A copy of the executable is another file: the delegate is exec'd.
    let copies = TempDir::new("cnibb-hostile-copies");
    std::fs::copy(plugin_path("bridge"), copies.path().join("bridge")).expect("copy bridge");
    for cni_path in [
        cni_blackbox::bin_dir().to_path_buf(),
        copies.path().to_path_buf(),
    ] {
        let pod = net.pod();
        let started = Instant::now();
        let out = net
            .plugin("ADD", &conf)
            .cni_path(&cni_path.display().to_string())
            .attachment("hostile-loop", &pod, "eth0")
            .run();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}: took {:?}",
            cni_path.display(),
            started.elapsed()
        );
        assert_eq!(out.code(), Some(1), "{}: {out}", cni_path.display());
        assert_eq!(out.error_code(), Some(7), "{}: {out}", cni_path.display());
        assert!(
            out.error_msg().unwrap_or_default().contains("would loop"),
            "{out}"
        );
        assert!(
            net.host_veths().is_empty(),
            "veths left: {:?}",
            net.host_veths()
        );
    }
}

/// A FIFO as `CNI_NETNS` is a clear error at once (a plain open would wait for a
/// writer forever); the plugin's own netns (here through a symlink) is refused with
/// code 8, and DEL does not touch the host link that `CNI_IFNAME` names.
#[test]
fn cni_netns_must_be_another_network_namespace() {
    if !require_root() {
        return;
    }
    // Built before anything is timed.
    cni_blackbox::bin_dir();
    let net = Net::new();
    let conf = net.conf("1.0.0", &["10.64.0.0/24"], &json!({}));
    let dir = TempDir::new("cnibb-hostile-netns");
    let fifo = dir.path().join("netns");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    for command in ["ADD", "CHECK", "DEL"] {
        let started = Instant::now();
        let out = net
            .plugin(command, &conf)
            .container_id("hostile-fifo")
            .netns(&fifo.display().to_string())
            .ifname("eth0")
            .run();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{command} with a FIFO took {:?}",
            started.elapsed()
        );
        if command != "DEL" {
            assert_eq!(out.code(), Some(1), "{command}: {out}");
            assert!(
                out.error_msg()
                    .unwrap_or_default()
                    .contains("not a network namespace"),
                "{command}: {out}"
            );
        }
    }
    assert!(net.host_veths().is_empty(), "{:?}", net.host_veths());

    // The host's own netns, named through a symlink, with a host link as CNI_IFNAME.
    net.host.exec_ok(&[
        "ip", "link", "add", "victim0", "type", "veth", "peer", "name", "victim1",
    ]);
    let own = dir.path().join("own-netns");
    symlink(net.host.path(), &own).expect("symlink");
    for (plugin, command) in [("bridge", "DEL"), ("bridge", "ADD"), ("loopback", "DEL")] {
        let out = cni_blackbox::Plugin::new(plugin, &net.host)
            .command(command)
            .container_id("hostile-own")
            .netns(&own.display().to_string())
            .ifname("victim0")
            .config(&conf)
            .run();
        assert_eq!(out.error_code(), Some(8), "{plugin} {command}: {out}");
        assert!(
            cni_blackbox::kernel::link(&net.host, "victim0").is_some(),
            "{plugin} {command} deleted the host's victim0"
        );
    }
}

/// A 300-character container ID makes the iptables comments of the bridge's masquerade
/// and of portmap longer than iptables keeps (255): GC still tells a valid attachment's
/// rules from a stale one's, and removes the stale ones.
#[test]
fn long_container_ids_are_still_found_by_gc() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let id = format!("c{}", "0123456789".repeat(30));
    let conf = net.conf(
        "1.1.0",
        &["10.65.0.0/24"],
        &json!({"isGateway": true, "ipMasq": true, "ipMasqBackend": "iptables"}),
    );
    let pod = net.pod();
    let added = net.run("ADD", &conf, &id, &pod, "eth0");
    added.assert_success();
    let portmap = |command: &str, extra: serde_json::Value| {
        let mut conf = json!({
            "cniVersion": "1.1.0",
            "name": net.name,
            "type": "portmap",
            "backend": "iptables",
            "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80}]},
        });
        bridge_support::merge(&mut conf, &extra);
        let plugin = cni_blackbox::Plugin::new("portmap", &net.host)
            .command(command)
            .config(&conf);
        if command == "GC" {
            plugin.run()
        } else {
            plugin.attachment(&id, &pod, "eth0").run()
        }
    };
    portmap("ADD", json!({"prevResult": added.json()})).assert_success();
    let per_container = || -> Vec<String> {
        net.iptables()
            .lines()
            .filter(|l| l.starts_with(":CNI-") && !l.starts_with(":CNI-HOSTPORT-"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(per_container().len(), 2, "{}", net.iptables());

    // GC with the attachment valid keeps everything; without it, nothing is left.
    let valid = json!({"cni.dev/valid-attachments": [{"containerID": id, "ifname": "eth0"}]});
    let mut gc_conf = conf.clone();
    bridge_support::merge(&mut gc_conf, &valid);
    net.plugin("GC", &gc_conf).run().assert_success();
    portmap("GC", valid).assert_success();
    assert_eq!(
        per_container().len(),
        2,
        "GC removed a valid attachment's rules"
    );

    let none = json!({"cni.dev/valid-attachments": []});
    let mut gc_conf = conf.clone();
    bridge_support::merge(&mut gc_conf, &none);
    net.plugin("GC", &gc_conf).run().assert_success();
    portmap("GC", none).assert_success();
    assert_eq!(per_container(), Vec::<String>::new(), "{}", net.iptables());
    // The jumps went with the chains.
    let text = net.iptables();
    assert!(
        !text.contains(&id[..40]),
        "rules of the container left:\n{text}"
    );
}

/// Sizes: a container ID longer than the documented limit is refused at ADD before
/// anything is reserved (a 70,000-character one used to get an address its DEL could
/// never release), and `resolvConf` reads only a small regular file (`/dev/zero` used to
/// be read for a gigabyte).
#[test]
fn oversized_inputs_are_refused_and_leave_nothing() {
    if !require_root() {
        return;
    }
    cni_blackbox::bin_dir();
    let net = Net::new();
    let conf = net.conf("1.0.0", &["10.66.0.0/24"], &json!({}));
    let pod = net.pod();
    let huge = format!("c{}", "x".repeat(70_000));
    let out = net.run("ADD", &conf, &huge, &pod, "eth0");
    assert_eq!(out.error_code(), Some(4), "{out}");
    assert!(
        out.error_msg().unwrap_or_default().contains("at most 1024"),
        "{out}"
    );
    assert!(net.reservations().is_empty(), "{:?}", net.reservations());
    assert!(net.host_veths().is_empty());

    let mut zero = conf.clone();
    zero["ipam"]["resolvConf"] = json!("/dev/zero");
    let started = Instant::now();
    let out = net.run("ADD", &zero, "hostile-resolv", &pod, "eth0");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.code(), Some(1), "{out}");
    assert!(
        out.error_msg().unwrap_or_default().contains("/dev/zero"),
        "{out}"
    );
    assert!(net.reservations().is_empty(), "{:?}", net.reservations());
    assert!(net.host_veths().is_empty(), "{:?}", net.host_veths());
}

/// A `CNI_PATH` directory mounted `noexec` is honoured by in-process delegation: the
/// IPAM delegate found there is this very executable, but exec would refuse it, so the
/// ADD fails as it would with separate binaries, and leaves nothing.
#[test]
fn a_noexec_cni_path_is_not_run_in_process() {
    if !require_root() {
        return;
    }
    let bins = cni_blackbox::bin_dir();
    let net = Net::new();
    let pod = net.pod();
    let noexec = TempDir::new("cnibb-hostile-noexec");
    let conf = net.conf("1.0.0", &["10.67.0.0/24"], &json!({}));
    let script =
        r#"mount --bind "$1" "$2" && mount -o remount,bind,noexec "$2" && exec "$1/bridge""#;
    let mut child = Command::new("ip")
        .args(["netns", "exec", net.host.name()])
        .args([
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(bins)
        .arg(noexec.path())
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "hostile-noexec")
        .env("CNI_NETNS", pod.path())
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", noexec.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run bridge");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(conf.to_string().as_bytes())
            .expect("write config");
    }
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "ADD ran a delegate from a noexec mount: {stdout}"
    );
    assert!(
        stdout.contains("ermission denied"),
        "not the error exec gives: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(net.reservations().is_empty(), "{:?}", net.reservations());
    assert!(net.host_veths().is_empty(), "{:?}", net.host_veths());
}

/// host-local works on the network directory it opened: a directory swapped in under
/// the same path while an ADD waits for the network's lock does not receive the
/// reservation (every file is reached through the held descriptor).
#[test]
fn a_swapped_network_directory_does_not_redirect_host_local() {
    if !require_root() {
        return;
    }
    use nix::fcntl::{Flock, FlockArg};
    cni_blackbox::bin_dir();
    let net = Net::new();
    let pod = net.pod();
    let network = "swapnet";
    let dir = net.data.path().join(network);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let lock_file = std::fs::File::create(dir.join("lock")).expect("lock file");
    let held = Flock::lock(lock_file, FlockArg::LockExclusive).expect("flock");
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": network,
        "type": "bridge",
        "ipam": {
            "type": "host-local",
            "dataDir": net.data.path_str(),
            "lockTimeout": 30,
            "ranges": [[{"subnet": "10.69.0.0/24"}]]
        }
    });
    let add = std::thread::scope(|scope| {
        let running = scope.spawn(|| {
            cni_blackbox::Plugin::new("host-local", &net.host)
                .command("ADD")
                .attachment("hostile-swap", &pod, "eth0")
                .config(&conf)
                .run()
        });
        // The ADD has opened the directory and waits for the lock: it holds the lock
        // file open (bounded wait, not a guess of how long that takes).
        let lock = dir.join("lock");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !process_has_open("host-local", &lock) {
            assert!(
                Instant::now() < deadline,
                "the ADD never opened {}",
                lock.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let moved = net.data.path().join("swapnet.moved");
        std::fs::rename(&dir, &moved).expect("move the directory away");
        std::fs::create_dir(&dir).expect("a new directory in its place");
        drop(held);
        running.join().expect("ADD thread")
    });
    add.assert_success();
    let moved = net.data.path().join("swapnet.moved");
    let listing = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(
        moved.join("10.69.0.2").exists(),
        "the reservation is not in the directory the ADD opened: {:?}; new one: {:?}\n{add}",
        listing(&moved),
        listing(&dir)
    );
    let leaked: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        leaked.is_empty(),
        "written into the swapped-in directory: {leaked:?}"
    );
}

/// Whether a process named `comm` has `path` open. By name, not "any other process":
/// a child of this test between fork and exec still holds this test's descriptors.
fn process_has_open(comm: &str, path: &Path) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs
        .filter_map(Result::ok)
        .filter(|p| {
            std::fs::read_to_string(p.path().join("comm")).is_ok_and(|c| c.trim_end() == comm)
        })
        .filter_map(|p| std::fs::read_dir(p.path().join("fd")).ok())
        .flatten()
        .filter_map(Result::ok)
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
}
