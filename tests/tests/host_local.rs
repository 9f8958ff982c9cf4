//! Black-box tests of the `host-local` binary: env + stdin in, stdout + exit code and the
//! files under `dataDir` out. host-local never enters a netns, so it runs directly (no
//! `ip netns exec`) with `CNI_NETNS` pointing at a path that does not exist.
//!
//! Interop tests run the reference binary (Debian's containernetworking-plugins 1.1.1,
//! `/usr/lib/cni/host-local`) on the same `dataDir`, in both directions. It supports
//! spec versions up to 1.0.0, so those tests use 1.0.0.
//!
//! Every test has its own `dataDir` (a [`TempDir`], removed on drop). No test sleeps or
//! measures time; lock waits are bounded by `lockTimeout` and the harness' timeout.

mod host_local_support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use cni_blackbox::{Outcome, TempDir, parallel, unique_name};
use host_local_support::*;
use nix::fcntl::{Flock, FlockArg};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------
// Results in every shape
// ---------------------------------------------------------------------------------------

const V020: &str = r#"{
    "cniVersion": "VERSION",
    "ip4": {
        "ip": "10.9.0.2/24",
        "gateway": "10.9.0.1",
        "routes": [
            {
                "dst": "0.0.0.0/0"
            }
        ]
    },
    "ip6": {
        "ip": "fd00:9::2/64",
        "gateway": "fd00:9::1",
        "routes": [
            {
                "dst": "fd00:1::/64",
                "gw": "fd00:9::fe"
            }
        ]
    },
    "dns": {}
}"#;

const V040: &str = r#"{
    "cniVersion": "VERSION",
    "ips": [
        {
            "version": "4",
            "address": "10.9.0.2/24",
            "gateway": "10.9.0.1"
        },
        {
            "version": "6",
            "address": "fd00:9::2/64",
            "gateway": "fd00:9::1"
        }
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0"
        },
        {
            "dst": "fd00:1::/64",
            "gw": "fd00:9::fe"
        }
    ],
    "dns": {}
}"#;

const V100: &str = r#"{
    "cniVersion": "VERSION",
    "ips": [
        {
            "address": "10.9.0.2/24",
            "gateway": "10.9.0.1"
        },
        {
            "address": "fd00:9::2/64",
            "gateway": "fd00:9::1"
        }
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0"
        },
        {
            "dst": "fd00:1::/64",
            "gw": "fd00:9::fe"
        }
    ]
}"#;

#[test]
fn dual_stack_add_in_every_result_shape_byte_exact() {
    // 1.0.0 as the reference v1.1.1 prints it: struct order, `dns` always.
    let v100_dns = format!(
        "{},\n    \"dns\": {{}}\n}}",
        V100.strip_suffix("\n}").expect("V100 ends with a brace")
    );
    let cases: [(Option<&str>, &str, &str); 8] = [
        (None, V020, "0.1.0"),
        (Some("0.1.0"), V020, "0.1.0"),
        (Some("0.2.0"), V020, "0.2.0"),
        (Some("0.3.0"), V040, "0.3.0"),
        (Some("0.3.1"), V040, "0.3.1"),
        (Some("0.4.0"), V040, "0.4.0"),
        (Some("1.0.0"), &v100_dns, "1.0.0"),
        (Some("1.1.0"), V100, "1.1.0"),
    ];
    let reference = reference();
    for (version, template, printed) in cases {
        let data = TempDir::new("hl-shape");
        let name = unique_name("hl");
        let config = dual_stack(&name, version, &data);
        let out = attach(ours(), "ADD", &config, "ctr1", "eth0");
        out.assert_success();
        assert_eq!(
            out.stdout,
            template.replace("VERSION", printed),
            "{version:?}:\n{out}"
        );
        // The same bytes as the reference prints for the same request, in every version
        // it speaks (it stops at 1.0.0).
        if let Some(reference) = reference.as_deref().filter(|_| printed != "1.1.0") {
            let their_data = TempDir::new("hl-shape-ref");
            let theirs = attach(
                reference,
                "ADD",
                &dual_stack(&name, version, &their_data),
                "ctr1",
                "eth0",
            );
            theirs.assert_success();
            assert_eq!(
                out.stdout, theirs.stdout,
                "{version:?}: ours vs the reference"
            );
        }
        // The reference's on-disk layout, byte for byte, plus our one addition: the
        // marker of `releaseOnReboot` (not an address, so the reference never reads it
        // as a reservation).
        let mut files = state(&data, &name);
        let marker = files.remove("boot.json").unwrap_or_default();
        assert!(marker.starts_with(b"{\"bootID\":"), "{version:?}");
        let expected: BTreeMap<String, Vec<u8>> = [
            ("10.9.0.2", &b"ctr1\r\neth0"[..]),
            ("fd00:9::2", b"ctr1\r\neth0"),
            ("last_reserved_ip.0", b"10.9.0.2"),
            ("last_reserved_ip.1", b"fd00:9::2"),
            ("lock", b""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_vec()))
        .collect();
        assert_eq!(files, expected, "{version:?}");
        let mode = |f: &str| {
            std::fs::symlink_metadata(data.path().join(&name).join(f))
                .expect("stat")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("10.9.0.2"), 0o600);
        assert_eq!(mode("last_reserved_ip.1"), 0o600);
        assert_eq!(mode("lock"), 0o750);
        let dir_mode = std::fs::metadata(data.path().join(&name))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o755);
    }
}

#[test]
fn add_errors_and_requested_ips_as_the_reference() {
    let data = TempDir::new("hl-errors");
    let name = unique_name("hl");
    let config = dual_stack(&name, Some("1.1.0"), &data);
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "ctr1", "eth0")),
        ["10.9.0.2/24", "fd00:9::2/64"]
    );
    attach(ours(), "ADD", &config, "ctr1", "eth0").assert_error(
        999,
        "failed to allocate for range 0: 10.9.0.2 has been allocated to ctr1, duplicate allocation is not allowed",
    );
    let with_args = |args: &str, id: &str| {
        attach_with(ours(), "ADD", &config, id, "eth0", &[("CNI_ARGS", args)])
    };
    assert_eq!(
        addresses(&with_args("IP=10.9.0.77", "ctr2")),
        ["10.9.0.77/24", "fd00:9::3/64"]
    );
    with_args("IP=10.9.0.1", "ctr3").assert_error(
        999,
        "failed to allocate for range 0: requested ip 10.9.0.1 is subnet's gateway",
    );
    with_args("IP=10.9.0.77", "ctr3").assert_error(
        999,
        "failed to allocate for range 0: requested IP address 10.9.0.77 is not available in range set 10.9.0.1-10.9.0.254",
    );
    with_args("IP=10.10.0.77", "ctr3")
        .assert_error(999, "failed to allocate all requested IPs: 10.10.0.77");
    with_args("ip=10.9.0.77", "ctr3").assert_error(999, r#"ARGS: unknown args ["ip=10.9.0.77"]"#);
    // Kubernetes' usual CNI_ARGS are accepted. (fd00:9::4 went to the failed
    // 10.10.0.77 attempt above and was released; round robin moves on, as the
    // reference's does.)
    assert_eq!(
        addresses(&with_args(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;IP=10.9.0.78",
            "ctr4"
        )),
        ["10.9.0.78/24", "fd00:9::5/64"]
    );
    // args.cni.ips and runtimeConfig.ips (prefix ignored).
    let mut requested = config.clone();
    requested["args"] = json!({"cni": {"ips": ["fd00:9::99"]}});
    requested["runtimeConfig"] = json!({"ips": ["10.9.0.99/24"]});
    assert_eq!(
        addresses(&attach(ours(), "ADD", &requested, "ctr5", "eth0")),
        ["10.9.0.99/24", "fd00:9::99/64"]
    );
    // Nothing of the failed attempts (ctr3) is left.
    let owners: BTreeSet<String> = reservations(&data, &name).into_values().collect();
    assert!(!owners.iter().any(|o| o.starts_with("ctr3")), "{owners:?}");
    assert_eq!(reservations(&data, &name).len(), 8);
}

#[test]
fn config_validation_messages() {
    let data = TempDir::new("hl-config");
    let cases = [
        (
            json!({"cniVersion": "1.0.0", "name": "n"}),
            "IPAM config missing 'ipam' key",
        ),
        (
            net("n", Some("1.0.0"), &data, json!({})),
            "no IP ranges specified",
        ),
        (
            net(
                "n",
                Some("1.0.0"),
                &data,
                json!({"ranges": [[{"subnet": "10.0.0.0/31"}]]}),
            ),
            "invalid range set 0: Network 10.0.0.0/31 too small to allocate from",
        ),
        (
            net("n", Some("1.0.0"), &data, json!({"subnet": "10.0.0.5/24"})),
            "invalid range set 0: Network has host bits set. For a subnet mask of length 24 the network address is 10.0.0.0",
        ),
        (
            net(
                "n",
                Some("1.0.0"),
                &data,
                json!({"ranges": [[{"subnet": "10.0.0.0/16"}], [{"subnet": "10.0.3.0/24"}]]}),
            ),
            "range set 0 overlaps with 1",
        ),
        (
            net(
                "n",
                Some("0.2.0"),
                &data,
                json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}]]}),
            ),
            "CNI version 0.2.0 does not support more than 1 address per family",
        ),
    ];
    for (config, msg) in cases {
        attach(ours(), "ADD", &config, "c", "eth0").assert_error(999, msg);
    }
    // Config errors make DEL fail too, as in the reference.
    attach(
        ours(),
        "DEL",
        &json!({"cniVersion": "1.0.0", "name": "n"}),
        "c",
        "eth0",
    )
    .assert_error(999, "IPAM config missing 'ipam' key");
}

#[test]
fn legacy_keys_routes_and_resolv_conf() {
    let data = TempDir::new("hl-legacy");
    let resolv = data.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "# test\nnameserver 10.10.0.53\nnameserver fd00::53\ndomain example.test\nsearch a.test b.test\noptions ndots:2\n",
    )
    .expect("write resolv.conf");
    let mut config = load_conf("host-local-legacy.json");
    config["name"] = json!(unique_name("hl"));
    config["ipam"]["dataDir"] = json!(data.path_str());
    config["ipam"]["resolvConf"] = json!(resolv.to_str());
    let out = attach(ours(), "ADD", &config, "ctr1", "eth0");
    out.assert_success();
    assert_eq!(
        out.stdout,
        r#"{
    "cniVersion": "0.4.0",
    "ips": [
        {
            "version": "4",
            "address": "10.10.1.10/16",
            "gateway": "10.10.0.254"
        }
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0"
        },
        {
            "dst": "192.168.0.0/16",
            "gw": "10.10.0.1",
            "mtu": 1400,
            "advmss": 1360,
            "priority": 10,
            "table": 100,
            "scope": 0
        }
    ],
    "dns": {
        "nameservers": [
            "10.10.0.53",
            "fd00::53"
        ],
        "domain": "example.test",
        "search": [
            "a.test",
            "b.test"
        ],
        "options": [
            "ndots:2"
        ]
    }
}"#,
        "{out}"
    );
    // A missing resolvConf fails ADD.
    config["ipam"]["resolvConf"] = json!(data.path().join("missing").to_str());
    let out = attach(ours(), "ADD", &config, "ctr2", "eth0");
    out.assert_failure();
    assert_eq!(out.error_code(), Some(999), "{out}");
}

// ---------------------------------------------------------------------------------------
// DEL, CHECK, STATUS, GC
// ---------------------------------------------------------------------------------------

#[test]
fn del_is_idempotent_needs_no_netns_and_checks_owners() {
    let data = TempDir::new("hl-del");
    let name = unique_name("hl");
    let config = dual_stack(&name, Some("1.0.0"), &data);
    let added = attach(ours(), "ADD", &config, "ctr1", "eth0");
    added.assert_success();
    attach(ours(), "ADD", &config, "ctr2", "eth0").assert_success();
    attach(ours(), "CHECK", &config, "ctr1", "eth0").assert_success_silent();

    // DEL with prevResult: the listed addresses are released directly.
    let mut with_prev = config.clone();
    with_prev["prevResult"] = added.json();
    let dir = ours().parent().and_then(Path::to_str).unwrap_or("/");
    let no_netns = [
        ("CNI_COMMAND", "DEL"),
        ("CNI_CONTAINERID", "ctr1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", dir),
    ];
    run(ours(), &no_netns, &with_prev.to_string()).assert_success_silent();
    let left: Vec<String> = reservations(&data, &name).into_values().collect();
    assert_eq!(left, ["ctr2\r\neth0", "ctr2\r\neth0"]);
    run(ours(), &no_netns, &with_prev.to_string()).assert_success_silent();
    attach(ours(), "DEL", &config, "ctr1", "eth0").assert_success_silent();
    attach(ours(), "CHECK", &config, "ctr1", "eth0").assert_error(
        999,
        "host-local: Failed to find address added by container ctr1",
    );

    // A prevResult naming someone else's address does not release it; ctr2's own
    // reservations are then found by reading the directory.
    let mut wrong = config.clone();
    wrong["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.9.0.3/24"}]});
    attach(ours(), "DEL", &wrong, "ctr9", "eth0").assert_success_silent();
    assert_eq!(reservations(&data, &name).len(), 2);
    attach(ours(), "DEL", &wrong, "ctr2", "eth0").assert_success_silent();
    assert!(reservations(&data, &name).is_empty());
}

#[test]
fn exhausted_30_reports_reference_error_and_status() {
    let data = TempDir::new("hl-exhaust");
    let name = unique_name("hl");
    let config = single(&name, "1.1.0", &data, "10.8.0.0/30");
    network_command(ours(), "STATUS", &config).assert_success_silent();
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "a", "eth0")),
        ["10.8.0.2/30"]
    );
    attach(ours(), "ADD", &config, "b", "eth0").assert_error(
        999,
        "failed to allocate for range 0: no IP addresses available in range set: 10.8.0.1-10.8.0.2",
    );
    network_command(ours(), "STATUS", &config).assert_error(
        50,
        "no IP addresses available in range set: 10.8.0.1-10.8.0.2",
    );
    attach(ours(), "DEL", &config, "a", "eth0").assert_success_silent();
    network_command(ours(), "STATUS", &config).assert_success_silent();
}

#[test]
fn status_fails_when_data_dir_cannot_be_written() {
    let data = TempDir::new("hl-status");
    // A regular file where the data dir should be: nothing can be created under it
    // (a permission check would not stop root).
    let blocked = data.path().join("file");
    std::fs::write(&blocked, "").expect("write");
    let mut config = single(&unique_name("hl"), "1.1.0", &data, "10.8.0.0/24");
    config["ipam"]["dataDir"] = json!(blocked.to_str());
    let out = network_command(ours(), "STATUS", &config);
    out.assert_failure();
    assert_eq!(out.error_code(), Some(50), "{out}");
}

#[test]
fn gc_keeps_exactly_the_valid_attachments() {
    let data = TempDir::new("hl-gc");
    let name = unique_name("hl");
    let config = single(&name, "1.1.0", &data, "10.7.0.0/24");
    for i in 0..10 {
        attach(ours(), "ADD", &config, &format!("ctr{i}"), "eth0").assert_success();
    }
    assert_eq!(reservations(&data, &name).len(), 10);
    let mut gc = config.clone();
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": "ctr1", "ifname": "eth0"},
        {"containerID": "ctr4", "ifname": "eth0"},
        {"containerID": "ctr7", "ifname": "eth0"},
        {"containerID": "ctr8", "ifname": "eth1"},
    ]);
    network_command(ours(), "GC", &gc).assert_success_silent();
    let owners: BTreeSet<String> = reservations(&data, &name).into_values().collect();
    let want: BTreeSet<String> = ["ctr1", "ctr4", "ctr7"]
        .iter()
        .map(|id| format!("{id}\r\neth0"))
        .collect();
    assert_eq!(owners, want);
    let files = state(&data, &name);
    assert!(files.contains_key("lock") && files.contains_key("last_reserved_ip.0"));
    // No valid list at all means nothing is valid.
    network_command(ours(), "GC", &config).assert_success_silent();
    assert!(reservations(&data, &name).is_empty());
}

// ---------------------------------------------------------------------------------------
// Concurrency, locking, crash safety, path safety
// ---------------------------------------------------------------------------------------

fn add_del_many(networks: &[(Value, String)], data: &TempDir, per_network: usize) {
    let total = networks.len() * per_network;
    let job = |i: usize| (&networks[i % networks.len()], format!("ctr{i}"));
    let adds = parallel(total, 16, |i| {
        let ((config, _), id) = job(i);
        attach(ours(), "ADD", config, &id, "eth0")
    });
    for (n, (_, name)) in networks.iter().enumerate() {
        let mut seen = BTreeSet::new();
        for out in adds.iter().skip(n).step_by(networks.len()) {
            let addrs = addresses(out);
            assert_eq!(addrs.len(), 1, "{out}");
            assert!(
                seen.insert(addrs[0].clone()),
                "duplicate {}:\n{out}",
                addrs[0]
            );
        }
        assert_eq!(seen.len(), per_network);
        let files = reservations(data, name);
        assert_eq!(files.len(), per_network, "{name}");
        // Every file is whole and names its owner; owners are distinct.
        let owners: BTreeSet<&String> = files.values().collect();
        assert_eq!(owners.len(), per_network);
        assert!(
            files
                .values()
                .all(|c| c.starts_with("ctr") && c.ends_with("\r\neth0"))
        );
    }
    let dels = parallel(total, 16, |i| {
        let ((config, _), id) = job(i);
        attach(ours(), "DEL", config, &id, "eth0")
    });
    for out in &dels {
        out.assert_success_silent();
    }
    for (_, name) in networks {
        assert!(reservations(data, name).is_empty(), "{name}");
        let temps: Vec<String> = state(data, name)
            .into_keys()
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(temps.is_empty(), "{temps:?}");
    }
}

#[test]
fn two_hundred_concurrent_adds_and_dels_on_one_24() {
    let data = TempDir::new("hl-conc");
    let name = unique_name("hl");
    let config = single(&name, "1.0.0", &data, "10.6.0.0/24");
    add_del_many(&[(config, name)], &data, 200);
}

#[test]
fn concurrent_adds_on_two_networks_sharing_nothing() {
    let data_a = TempDir::new("hl-conc-a");
    let data_b = TempDir::new("hl-conc-b");
    let (a, b) = (unique_name("hla"), unique_name("hlb"));
    // Same subnet, different networks and data dirs: both hand out the same addresses.
    let conf_a = single(&a, "1.0.0", &data_a, "10.5.0.0/24");
    let conf_b = single(&b, "1.0.0", &data_b, "10.5.0.0/24");
    let both = std::thread::scope(|s| {
        let ta = s.spawn(|| add_del_many(&[(conf_a.clone(), a.clone())], &data_a, 200));
        let tb = s.spawn(|| add_del_many(&[(conf_b.clone(), b.clone())], &data_b, 200));
        (ta.join(), tb.join())
    });
    both.0.expect("network a");
    both.1.expect("network b");
}

#[test]
fn lock_wait_is_bounded_with_code_11() {
    let data = TempDir::new("hl-lock");
    let name = unique_name("hl");
    let mut config = single(&name, "1.0.0", &data, "10.4.0.0/24");
    config["ipam"]["lockTimeout"] = json!(0.2);
    // Create the store, then hold its lock from here like a hung plugin would.
    attach(ours(), "ADD", &config, "first", "eth0").assert_success();
    let lock = File::open(data.path().join(&name).join("lock")).expect("open lock");
    let held = Flock::lock(lock, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("flock");
    let out = attach(ours(), "ADD", &config, "second", "eth0");
    out.assert_failure();
    assert_eq!(out.error_code(), Some(11), "{out}");
    attach(ours(), "DEL", &config, "first", "eth0").assert_failure();
    drop(held);
    attach(ours(), "ADD", &config, "second", "eth0").assert_success();
    attach(ours(), "DEL", &config, "first", "eth0").assert_success_silent();
    assert_eq!(reservations(&data, &name).len(), 1);
}

#[test]
fn leftovers_are_never_taken_for_reservations() {
    let data = TempDir::new("hl-crash");
    let name = unique_name("hl");
    let config = single(&name, "1.1.0", &data, "10.3.0.0/24");
    let dir = data.path().join(&name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    // Our temp file from a killed process, and the reference's half-written file.
    std::fs::write(dir.join(".cni-tmp.999999.0.ip"), "dead\r\neth0").expect("write");
    std::fs::write(dir.join("10.3.0.2"), "").expect("write");
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "ctr1", "eth0")),
        ["10.3.0.3/24"]
    );
    let files = state(&data, &name);
    assert!(
        !files.contains_key(".cni-tmp.999999.0.ip"),
        "stale temp removed"
    );
    // GC releases the ownerless empty file.
    let mut gc = config.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "ctr1", "ifname": "eth0"}]);
    network_command(ours(), "GC", &gc).assert_success_silent();
    assert_eq!(
        reservations(&data, &name).into_keys().collect::<Vec<_>>(),
        ["10.3.0.3"]
    );
}

#[test]
fn killed_adds_leave_whole_reservations_or_none() {
    let data = TempDir::new("hl-kill");
    let name = unique_name("hl");
    let config = single(&name, "1.0.0", &data, "10.2.0.0/24");
    let dir = ours()
        .parent()
        .and_then(Path::to_str)
        .unwrap_or("/")
        .to_owned();
    // Kill ADDs at whatever point they have reached; whatever point that is, every
    // reservation left must be whole. (Where the kill lands varies; the check does not.)
    for i in 0..60 {
        let id = format!("killed{i}");
        let mut child = Command::new(ours())
            .env_clear()
            .envs([
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", id.as_str()),
                ("CNI_NETNS", NO_NETNS),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", dir.as_str()),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        if let Some(mut pipe) = child.stdin.take() {
            let _ = pipe.write_all(config.to_string().as_bytes());
        }
        for _ in 0..(i * 37 % 200) {
            std::hint::spin_loop();
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    for (ip, content) in reservations(&data, &name) {
        assert!(
            content.starts_with("killed") && content.ends_with("\r\neth0"),
            "{ip} holds {content:?}"
        );
    }
    // The next ADD works and cleans stale temps.
    attach(ours(), "ADD", &config, "after", "eth0").assert_success();
    assert!(state(&data, &name).keys().all(|n| !n.starts_with('.')));
}

#[test]
fn paths_cannot_escape_data_dir_and_symlinks_are_not_followed() {
    let data = TempDir::new("hl-paths");
    for bad in ["../escape", "a/b", ".."] {
        let config = single(bad, "1.0.0", &data, "10.1.0.0/24");
        let out = attach(ours(), "ADD", &config, "c", "eth0");
        out.assert_failure();
        assert!(
            !data
                .path()
                .parent()
                .map(|p| p.join("escape").exists())
                .unwrap_or(false)
        );
    }
    let name = unique_name("hl");
    let config = single(&name, "1.0.0", &data, "10.1.0.0/24");
    let dir = data.path().join(&name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let outside = data.path().join("outside");
    std::fs::write(&outside, "c\r\neth0").expect("write");
    std::os::unix::fs::symlink(&outside, dir.join("10.1.0.2")).expect("symlink");
    std::os::unix::fs::symlink(&outside, dir.join("last_reserved_ip.0")).expect("symlink");
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "c", "eth0")),
        ["10.1.0.3/24"]
    );
    attach(ours(), "DEL", &config, "c", "eth0").assert_success_silent();
    assert_eq!(std::fs::read(&outside).expect("read"), b"c\r\neth0");
    assert!(
        std::fs::symlink_metadata(dir.join("10.1.0.2"))
            .expect("lstat")
            .file_type()
            .is_symlink()
    );
}

// ---------------------------------------------------------------------------------------
// Switching between the reference binary and ours on one dataDir
// ---------------------------------------------------------------------------------------

#[test]
fn interop_ours_allocates_reference_releases() {
    let Some(reference) = reference() else { return };
    let data = TempDir::new("hl-interop1");
    let name = unique_name("hl");
    let config = dual_stack(&name, Some("1.0.0"), &data);
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "ctr1", "eth0")),
        ["10.9.0.2/24", "fd00:9::2/64"]
    );
    // The reference sees our reservations: CHECK passes, a duplicate ADD is refused, and
    // its round robin continues after our last_reserved_ip.
    attach(&reference, "CHECK", &config, "ctr1", "eth0").assert_success_silent();
    attach(&reference, "ADD", &config, "ctr1", "eth0").assert_error(
        999,
        "failed to allocate for range 0: 10.9.0.2 has been allocated to ctr1, duplicate allocation is not allowed",
    );
    assert_eq!(
        addresses(&attach(&reference, "ADD", &config, "ctr2", "eth0")),
        ["10.9.0.3/24", "fd00:9::3/64"]
    );
    attach(&reference, "DEL", &config, "ctr1", "eth0").assert_success_silent();
    let left: BTreeSet<String> = reservations(&data, &name).into_keys().collect();
    assert_eq!(
        left,
        ["10.9.0.3", "fd00:9::3"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    // And back: ours releases what the reference allocated.
    attach(ours(), "DEL", &config, "ctr2", "eth0").assert_success_silent();
    assert!(reservations(&data, &name).is_empty());
}

#[test]
fn interop_reference_allocates_ours_skips_and_releases() {
    let Some(reference) = reference() else { return };
    let data = TempDir::new("hl-interop2");
    let name = unique_name("hl");
    let config = dual_stack(&name, Some("1.0.0"), &data);
    let theirs = attach(&reference, "ADD", &config, "ctr1", "eth0");
    assert_eq!(addresses(&theirs), ["10.9.0.2/24", "fd00:9::2/64"]);
    attach(ours(), "CHECK", &config, "ctr1", "eth0").assert_success_silent();
    attach(ours(), "ADD", &config, "ctr1", "eth0").assert_error(
        999,
        "failed to allocate for range 0: 10.9.0.2 has been allocated to ctr1, duplicate allocation is not allowed",
    );
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "ctr2", "eth0")),
        ["10.9.0.3/24", "fd00:9::3/64"]
    );
    // Without the reference's last_reserved_ip files we still skip its addresses.
    for f in ["last_reserved_ip.0", "last_reserved_ip.1"] {
        std::fs::remove_file(data.path().join(&name).join(f)).expect("rm cursor");
    }
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "ctr3", "eth0")),
        ["10.9.0.4/24", "fd00:9::4/64"]
    );
    // DEL with the reference's result as prevResult, and without.
    let mut with_prev = config.clone();
    with_prev["prevResult"] = theirs.json();
    attach(ours(), "DEL", &with_prev, "ctr1", "eth0").assert_success_silent();
    attach(ours(), "DEL", &config, "ctr2", "eth0").assert_success_silent();
    let owners: BTreeSet<String> = reservations(&data, &name).into_values().collect();
    assert_eq!(owners, ["ctr3\r\neth0".to_owned()].into_iter().collect());
    attach(&reference, "DEL", &config, "ctr3", "eth0").assert_success_silent();
    assert!(reservations(&data, &name).is_empty());
}

#[test]
fn interop_legacy_id_only_files() {
    let Some(reference) = reference() else { return };
    let data = TempDir::new("hl-interop3");
    let name = unique_name("hl");
    let config = single(&name, "1.0.0", &data, "10.9.0.0/24");
    let dir = data.path().join(&name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    // Pre-2018 reservations hold only the container id.
    std::fs::write(dir.join("10.9.0.2"), "legacy1").expect("write");
    std::fs::write(dir.join("10.9.0.3"), "legacy2").expect("write");
    // Ours: skip them, see them as the container's for CHECK and the duplicate guard.
    attach(ours(), "CHECK", &config, "legacy1", "eth0").assert_success_silent();
    attach(ours(), "ADD", &config, "legacy1", "eth0").assert_error(
        999,
        "failed to allocate for range 0: 10.9.0.2 has been allocated to legacy1, duplicate allocation is not allowed",
    );
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "new1", "eth0")),
        ["10.9.0.4/24"]
    );
    attach(ours(), "DEL", &config, "legacy1", "eth0").assert_success_silent();
    assert!(!dir.join("10.9.0.2").exists());
    // The reference releases the other legacy file and sees ours.
    attach(&reference, "DEL", &config, "legacy2", "eth0").assert_success_silent();
    attach(&reference, "CHECK", &config, "new1", "eth0").assert_success_silent();
    assert_eq!(
        reservations(&data, &name).into_keys().collect::<Vec<_>>(),
        ["10.9.0.4"]
    );
}

/// What a caller sees of one call, comparable across binaries: exit status and either
/// the error (code, msg) or the result's addresses, gateways and routes. (The reference
/// 1.1.1 prints an empty `dns` for 1.0.0 and no `cniVersion` in errors; neither matters
/// to a runtime.)
fn observed(out: &Outcome) -> Value {
    if !out.success() {
        return json!({"code": out.error_code(), "msg": out.error_msg()});
    }
    if out.stdout.is_empty() {
        return json!("ok");
    }
    let v = out.json();
    json!({"ips": v["ips"], "routes": v["routes"]})
}

#[test]
fn same_answers_as_the_reference_for_one_sequence() {
    let Some(reference) = reference() else { return };
    let steps: &[(&str, &str, &str)] = &[
        ("ADD", "ctr1", ""),
        ("ADD", "ctr1", ""),
        ("ADD", "ctr2", "IP=10.9.0.77"),
        ("ADD", "ctr3", "IP=10.9.0.1"),
        ("ADD", "ctr3", "IP=10.9.0.77"),
        ("ADD", "ctr3", "IP=10.10.0.77"),
        ("ADD", "ctr3", "ip=10.9.0.5"),
        ("ADD", "ctr3", "IgnoreUnknown=1;K8S_POD_NAME=x"),
        ("CHECK", "ctr3", ""),
        ("DEL", "ctr1", ""),
        ("DEL", "ctr1", ""),
        ("CHECK", "ctr1", ""),
        ("ADD", "ctr4", ""),
        ("ADD", "ctr1", ""),
        ("DEL", "nobody", ""),
        ("DEL", "ctr2", ""),
        ("ADD", "ctr5", "IP=fd00:9::2"),
        ("ADD", "ctr6", "IP=fd00:9::77"),
    ];
    let run_all = |bin: &Path| {
        let data = TempDir::new("hl-diff");
        let config = dual_stack("hldiff", Some("1.0.0"), &data);
        let answers: Vec<Value> = steps
            .iter()
            .map(|(cmd, id, args)| {
                let extra: Vec<(&str, &str)> = if args.is_empty() {
                    Vec::new()
                } else {
                    vec![("CNI_ARGS", *args)]
                };
                observed(&attach_with(bin, cmd, &config, id, "eth0", &extra))
            })
            .collect();
        (answers, state(&data, "hldiff"))
    };
    let (want, want_files) = run_all(&reference);
    let (got, mut got_files) = run_all(ours());
    // Ours also keeps the marker of `releaseOnReboot`.
    assert!(got_files.remove("boot.json").is_some());
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(g, w, "step {i} {:?}", steps[i]);
    }
    // Same files with the same bytes (the lock is empty in both).
    assert_eq!(got_files, want_files);
}
