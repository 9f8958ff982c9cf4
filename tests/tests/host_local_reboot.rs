//! Reservations made before a reboot are released by themselves (`releaseOnReboot`,
//! on by default).
//!
//! A reboot is simulated by running our binary in a private mount namespace
//! ([`MountNs`]) where a file of ours is bound over `/proc/sys/kernel/random/boot_id`;
//! writing a new id into that file is a reboot as far as host-local can tell (the boot id
//! is all it reads: no clock, no uptime). The reference binary (`/usr/lib/cni/host-local`,
//! which knows nothing of boots) runs beside it on the same data directory.
//!
//! What the sequence shows: reservations of the previous boot are released on the first
//! ADD (STATUS turns from 50 to 0 before that), a re-ADD with the same container id gets
//! its old address instead of a duplicate-allocation error, and reservations made in the
//! current boot stay, whether ours or the reference's; the reference's own reservations
//! made after our last sweep of a boot are released one reboot late, never early (the
//! documented limit); with `releaseOnReboot: false` nothing is released.

mod host_local_support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use cni_blackbox::{Outcome, TempDir, require_root, unique_name};
use host_local_support::*;
use serde_json::{Value, json};

/// A "node" whose boot id we choose: our binary runs in a mount namespace where
/// `boot_id` is bound over the kernel's.
struct Node {
    boot_id: PathBuf,
    ns: MountNs,
    _dir: TempDir,
}

impl Node {
    fn new(first_boot: &str) -> Self {
        let dir = TempDir::new("hl-boot");
        let boot_id = dir.path().join("boot_id");
        std::fs::write(&boot_id, format!("{first_boot}\n")).expect("write boot id");
        let ns = MountNs::new(
            "mount --bind \"$1\" /proc/sys/kernel/random/boot_id",
            &[&boot_id],
        );
        Self {
            boot_id,
            ns,
            _dir: dir,
        }
    }

    /// A reboot, as host-local sees it: a new boot id (written in place, so the bind
    /// mount shows it).
    fn reboot(&self, boot: &str) {
        std::fs::write(&self.boot_id, format!("{boot}\n")).expect("write boot id");
    }

    fn attach(&self, command: &str, config: &Value, id: &str) -> Outcome {
        attach_prefixed(&self.ns.prefix(), ours(), command, config, id, "eth0", &[])
    }

    fn status(&self, config: &Value) -> Outcome {
        network_command_prefixed(&self.ns.prefix(), ours(), "STATUS", config, &[])
    }
}

const BOOT_A: &str = "0a0a0a0a-0000-4000-8000-00000000000a";
const BOOT_B: &str = "0b0b0b0b-0000-4000-8000-00000000000b";
const BOOT_C: &str = "0c0c0c0c-0000-4000-8000-00000000000c";
const BOOT_D: &str = "0d0d0d0d-0000-4000-8000-00000000000d";

/// Address → owner id of the network's reservations.
fn owners(data: &TempDir, name: &str) -> BTreeMap<String, String> {
    reservations(data, name)
        .into_iter()
        .map(|(ip, content)| {
            let id = content.split("\r\n").next().unwrap_or_default().to_owned();
            (ip, id)
        })
        .collect()
}

fn expect(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(ip, id)| ((*ip).to_owned(), (*id).to_owned()))
        .collect()
}

#[test]
fn reservations_of_a_previous_boot_are_released_and_current_ones_stay() {
    if !require_root() {
        return;
    }
    let Some(reference) = reference() else { return };
    let data = TempDir::new("hl-reboot");
    let name = unique_name("hl");
    // A /29: five addresses, .2 to .6. Ours speaks 1.1.0 (STATUS); the reference 1.0.0;
    // both share the network and its directory.
    let config = single(&name, "1.1.0", &data, "10.14.0.0/29");
    let mut for_reference = config.clone();
    for_reference["cniVersion"] = json!("1.0.0");
    let full = "no IP addresses available in range set: 10.14.0.1-10.14.0.6";
    let node = Node::new(BOOT_A);

    // Boot A: four of ours, one of the reference's (made after our sweep of boot A).
    for (i, id) in ["c1", "c2", "c3", "c4"].iter().enumerate() {
        let got = addresses(&node.attach("ADD", &config, id));
        assert_eq!(got, [format!("10.14.0.{}/29", i + 2)]);
    }
    assert_eq!(
        addresses(&attach(&reference, "ADD", &for_reference, "r1", "eth0")),
        ["10.14.0.6/29"]
    );
    node.status(&config).assert_error(50, full);
    node.attach("DEL", &config, "c4").assert_success_silent();

    // Reboot into B. The reference runs first and takes the free address: a reservation
    // of this boot. The range is full on disk, but STATUS already counts the three of
    // boot A as free.
    node.reboot(BOOT_B);
    assert_eq!(
        addresses(&attach(&reference, "ADD", &for_reference, "r2", "eth0")),
        ["10.14.0.5/29"]
    );
    node.status(&config).assert_success_silent();
    // The first ADD releases boot A's reservations; the same container id gets its old
    // address back, not "duplicate allocation is not allowed".
    assert_eq!(
        addresses(&node.attach("ADD", &config, "c1")),
        ["10.14.0.2/29"]
    );
    assert_eq!(
        owners(&data, &name),
        expect(&[
            ("10.14.0.2", "c1"),
            ("10.14.0.5", "r2"),
            ("10.14.0.6", "r1")
        ]),
        "r2 (this boot) stays; r1 (the reference's, never seen by us in boot A) stays"
    );
    // More in boot B, ours and the reference's; then the range is full again.
    assert_eq!(
        addresses(&node.attach("ADD", &config, "n1")),
        ["10.14.0.3/29"]
    );
    assert_eq!(
        addresses(&attach(&reference, "ADD", &for_reference, "r3", "eth0")),
        ["10.14.0.4/29"]
    );
    node.status(&config).assert_error(50, full);
    node.attach("ADD", &config, "c2")
        .assert_error(999, &format!("failed to allocate for range 0: {full}"));
    // Nothing of this boot is released, however often we run.
    node.attach("CHECK", &config, "n1").assert_success_silent();
    attach(&reference, "CHECK", &for_reference, "c1", "eth0").assert_success_silent();
    let boot_b = expect(&[
        ("10.14.0.2", "c1"),
        ("10.14.0.3", "n1"),
        ("10.14.0.4", "r3"),
        ("10.14.0.5", "r2"),
        ("10.14.0.6", "r1"),
    ]);
    assert_eq!(owners(&data, &name), boot_b);

    // Reboot into C: everything that existed in boot B goes, except r3, which the
    // reference made after our sweep of boot B (kept: it could as well be of boot C).
    node.reboot(BOOT_C);
    node.status(&config).assert_success_silent();
    assert_eq!(
        addresses(&node.attach("ADD", &config, "n1")),
        ["10.14.0.3/29"],
        "n1 gets its old address back"
    );
    assert_eq!(
        owners(&data, &name),
        expect(&[("10.14.0.3", "n1"), ("10.14.0.4", "r3")])
    );
    // The reference still reads and writes the directory: it releases ours and its own.
    attach(&reference, "DEL", &for_reference, "n1", "eth0").assert_success_silent();
    attach(&reference, "DEL", &for_reference, "r3", "eth0").assert_success_silent();
    assert!(reservations(&data, &name).is_empty());
    assert!(temp_files(&data, &name).is_empty());

    // Turned off: after a reboot nothing is released, as with the reference.
    let mut off = config.clone();
    off["ipam"]["releaseOnReboot"] = json!(false);
    assert_eq!(addresses(&node.attach("ADD", &off, "x1")), ["10.14.0.4/29"]);
    node.reboot(BOOT_D);
    node.attach("ADD", &off, "x1").assert_error(
        999,
        "failed to allocate for range 0: 10.14.0.4 has been allocated to x1, duplicate allocation is not allowed",
    );
    network_command_prefixed(&node.ns.prefix(), ours(), "GC", &off, &[]).assert_success_silent();
    assert!(
        reservations(&data, &name).is_empty(),
        "GC with no valid list"
    );
}

#[test]
fn gc_after_a_reboot_releases_the_previous_boot_and_keeps_valid_attachments() {
    if !require_root() {
        return;
    }
    let data = TempDir::new("hl-reboot-gc");
    let name = unique_name("hl");
    let config = dual_stack(&name, Some("1.1.0"), &data);
    let node = Node::new(BOOT_A);
    for id in ["old1", "old2"] {
        assert_eq!(addresses(&node.attach("ADD", &config, id)).len(), 2);
    }
    node.reboot(BOOT_B);
    assert_eq!(addresses(&node.attach("ADD", &config, "new1")).len(), 2);
    assert_eq!(
        reservations(&data, &name).len(),
        2,
        "boot A's four released"
    );
    // A GC whose valid list still names a pod of boot A (it cannot be running) keeps only
    // what exists in this boot.
    let mut gc = config.clone();
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": "new1", "ifname": "eth0"},
        {"containerID": "old1", "ifname": "eth0"},
    ]);
    node.reboot(BOOT_C);
    network_command_prefixed(&node.ns.prefix(), ours(), "GC", &gc, &[]).assert_success_silent();
    assert!(
        reservations(&data, &name).is_empty(),
        "new1 existed in boot B: released in boot C"
    );
    let marker: Value = serde_json::from_slice(
        &std::fs::read(data.path().join(&name).join("boot.json")).expect("marker"),
    )
    .expect("marker JSON");
    assert_eq!(marker["bootID"], BOOT_C);
    assert_eq!(marker["released"]["10.9.0.4"], "new1\r\neth0");
}

/// A boot id of our own making, distinct per (round, boot).
fn boot_id(round: usize, boot: usize) -> String {
    format!("{round:08x}-0000-4000-8000-{boot:012x}")
}

#[test]
fn add_killed_at_every_step_of_the_sweep_then_del_or_gc_cleans_up() {
    if !require_root() {
        return;
    }
    let node = Node::new(&boot_id(0, 0));
    // One round: boot 1 with two old dual-stack pods, reboot, then `run` in boot 2.
    let round = |n: usize, run: &dyn Fn(&Value, &TempDir, &str)| {
        let data = TempDir::new("hl-reboot-fp");
        let name = unique_name("hl");
        let config = dual_stack(&name, Some("1.1.0"), &data);
        node.reboot(&boot_id(n, 1));
        for id in ["old1", "old2"] {
            assert_eq!(addresses(&node.attach("ADD", &config, id)).len(), 2);
        }
        node.reboot(&boot_id(n, 2));
        run(&config, &data, &name);
    };
    let steps = std::cell::RefCell::new(Vec::new());
    round(0, &|config, data, _| {
        let trace = data.path().join("trace");
        let trace_var = trace.to_str().unwrap_or_default().to_owned();
        attach_prefixed(
            &node.ns.prefix(),
            ours(),
            "ADD",
            config,
            "new1",
            "eth0",
            &[("CNI_RS_FAILPOINT_TRACE", &trace_var)],
        )
        .assert_success();
        let text = std::fs::read_to_string(&trace).unwrap_or_default();
        std::fs::remove_file(&trace).expect("rm trace");
        steps.borrow_mut().extend(text.lines().map(str::to_owned));
    });
    let steps = steps.into_inner();
    let sweep: Vec<&str> = steps
        .iter()
        .map(String::as_str)
        .take_while(|s| !s.starts_with("host-local/add/temp-written"))
        .collect();
    assert_eq!(
        sweep,
        [
            "host-local/add/locked",
            "host-local/add/released",
            "host-local/add/released",
            "host-local/add/released",
            "host-local/add/released",
            "host-local/add/marker-temp-written",
            "host-local/add/swept",
        ],
        "failpoints exist only in debug builds"
    );
    for n in 1..=sweep.len() {
        for cleanup in ["DEL", "GC"] {
            let context = format!("ADD killed at {} (#{n}), then {cleanup}", steps[n - 1]);
            round(n, &|config, data, name| {
                let kill = format!("host-local:kill@{n}");
                let out = attach_prefixed(
                    &node.ns.prefix(),
                    ours(),
                    "ADD",
                    config,
                    "new1",
                    "eth0",
                    &[("CNI_RS_FAILPOINT", &kill)],
                );
                assert!(
                    std::os::unix::process::ExitStatusExt::signal(&out.status) == Some(9),
                    "{context}: not killed\n{out}"
                );
                if cleanup == "DEL" {
                    node.attach("DEL", config, "new1").assert_success_silent();
                } else {
                    network_command_prefixed(&node.ns.prefix(), ours(), "GC", config, &[])
                        .assert_success_silent();
                    assert!(reservations(data, name).is_empty(), "{context}");
                }
                assert!(temp_files(data, name).is_empty(), "{context}");
                // The next ADD finishes the sweep and succeeds: only its own two are left.
                assert_eq!(
                    addresses(&node.attach("ADD", config, "new1")).len(),
                    2,
                    "{context}"
                );
                let left: Vec<String> = reservations(data, name).into_values().collect();
                assert_eq!(left, ["new1\r\neth0", "new1\r\neth0"], "{context}");
            });
        }
    }
}
