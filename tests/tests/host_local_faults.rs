//! Disk faults under `host-local`: a read-only data directory, a full
//! file system, foreign or corrupt files in the network directory, and symlinks planted
//! where a reservation, `last_reserved_ip.N` or `lock` would go.
//!
//! What every case must show: a clear CNI error naming the file and the cause (or the
//! fault is tolerated where the reference tolerates it, which the test says), nothing
//! half-written (no temp file, no reservation of the failed ADD), and the next ADD after
//! the fault is fixed succeeds.
//!
//! Read-only and full file systems are made in a private mount namespace ([`MountNs`]):
//! a read-only bind mount of the data directory (root ignores file modes, so `chmod`
//! would prove nothing) and a 64 KiB tmpfs. The machine's own mounts are never touched.

mod host_local_support;

use std::collections::BTreeMap;
use std::path::Path;

use cni_blackbox::{TempDir, require_root, unique_name};
use host_local_support::*;
use serde_json::json;

/// Sorted names in a directory (empty if it cannot be read).
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|read| {
            read.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn read_only_data_dir_gives_clear_errors_and_recovers() {
    if !require_root() {
        return;
    }
    let data = TempDir::new("hl-ro");
    let name = unique_name("hl");
    let config = dual_stack(&name, Some("1.1.0"), &data);
    let first = addresses(&attach(ours(), "ADD", &config, "c0", "eth0"));
    let before = state(&data, &name);

    let ns = MountNs::new(
        "mount --bind \"$1\" \"$1\"\nmount -o remount,bind,ro \"$1\"",
        &[data.path()],
    );
    let inside = |command: &str, id: &str| {
        attach_prefixed(&ns.prefix(), ours(), command, &config, id, "eth0", &[])
    };

    // ADD: the reservation cannot be written; the error names the address and the cause.
    let out = inside("ADD", "c1");
    let msg = out.error_msg().unwrap_or_default();
    assert_eq!(out.error_code(), Some(999), "{out}");
    let dir = data.path().join(&name);
    assert_eq!(
        msg,
        format!(
            "failed to allocate for range 0: write reservation {}: Read-only file system (os error 30)",
            dir.join("10.9.0.3").display()
        ),
        "{out}"
    );
    // DEL and GC cannot remove, and say so; STATUS reports the store unavailable (50).
    let del = inside("DEL", "c0");
    assert!(
        del.error_msg()
            .is_some_and(|m| m.contains("Read-only file system") && m.contains("10.9.0.2")),
        "{del}"
    );
    let gc = network_command_prefixed(&ns.prefix(), ours(), "GC", &config, &[]);
    assert!(
        gc.error_msg()
            .is_some_and(|m| m.contains("Read-only file system")),
        "{gc}"
    );
    let status = network_command_prefixed(&ns.prefix(), ours(), "STATUS", &config, &[]);
    assert_eq!(status.error_code(), Some(50), "{status}");
    assert!(
        status
            .error_msg()
            .is_some_and(|m| m.contains("Read-only file system")),
        "{status}"
    );
    // A network whose directory does not exist yet cannot be created.
    let other = unique_name("hl");
    let fresh = dual_stack(&other, Some("1.1.0"), &data);
    let out = attach_prefixed(&ns.prefix(), ours(), "ADD", &fresh, "c1", "eth0", &[]);
    assert_eq!(
        out.error_msg().unwrap_or_default(),
        format!(
            "mkdir {}: Read-only file system (os error 30)",
            data.path().join(&other).display()
        ),
        "{out}"
    );
    // Nothing changed on disk, nothing half-written.
    assert_eq!(state(&data, &name), before);
    assert!(!data.path().join(&other).exists());

    // Fixed (the bind mount goes): the same ADD and DEL succeed.
    ns.sh("umount \"$1\"", &[data.path()]);
    let second = addresses(&inside("ADD", "c1"));
    assert_eq!(second, ["10.9.0.3/24", "fd00:9::3/64"]);
    assert_ne!(first, second);
    inside("DEL", "c0").assert_success_silent();
    let owners: Vec<String> = reservations(&data, &name).into_values().collect();
    assert_eq!(owners, ["c1\r\neth0", "c1\r\neth0"]);
    assert!(temp_files(&data, &name).is_empty());
}

#[test]
fn full_file_system_fails_add_cleanly_and_recovers() {
    if !require_root() {
        return;
    }
    let data = TempDir::new("hl-full");
    let name = unique_name("hl");
    let config = dual_stack(&name, Some("1.1.0"), &data);
    // 64 KiB: 16 pages, and every reservation or cursor file holds one.
    let ns = MountNs::new(
        "mount -t tmpfs -o size=64k cnibb-hl-full \"$1\"",
        &[data.path()],
    );
    let dir = ns.inside(&data.path().join(&name));
    let add = |id: &str| attach_prefixed(&ns.prefix(), ours(), "ADD", &config, id, "eth0", &[]);

    let mut added = Vec::new();
    let failed = loop {
        assert!(added.len() < 32, "a 64 KiB tmpfs never filled up");
        let id = format!("c{}", added.len());
        let out = add(&id);
        if !out.success() {
            break (id, out);
        }
        added.push((id, addresses(&out)));
    };
    let (failed_id, out) = failed;
    assert!(added.len() >= 2, "too few ADDs fit: {added:?}\n{out}");
    assert_eq!(out.error_code(), Some(999), "{out}");
    let msg = out.error_msg().unwrap_or_default();
    assert!(
        msg.starts_with("failed to allocate for range ")
            && msg.contains(": write reservation ")
            && msg.ends_with(": No space left on device (os error 28)"),
        "{out}"
    );
    // Every reservation on disk is whole and belongs to a successful ADD; the failed
    // container holds none (a set reserved before the failing one was rolled back).
    let on_disk = cni_blackbox::ipam::reservations(&dir);
    let mut expected = BTreeMap::new();
    for (id, ips) in &added {
        for ip in ips {
            let addr = ip.split('/').next().unwrap_or_default().to_owned();
            expected.insert(addr, format!("{id}\r\neth0"));
        }
    }
    assert_eq!(on_disk, expected, "failed ADD of {failed_id}: {out}");
    let names = names_in(&dir);
    assert!(
        names.iter().all(|n| !n.starts_with('.')),
        "temp files left: {names:?}"
    );
    // STATUS answers 50 once not even one more byte fits (the failed ADD may have
    // rolled back a page's worth: fill that first).
    ns.sh("cat /dev/zero > \"$1/filler\" || true", &[data.path()]);
    let status = network_command_prefixed(&ns.prefix(), ours(), "STATUS", &config, &[]);
    assert_eq!(status.error_code(), Some(50), "{status}");
    assert!(
        status
            .error_msg()
            .is_some_and(|m| m.contains("No space left on device")),
        "{status}"
    );
    ns.sh("rm \"$1/filler\"", &[data.path()]);

    // Fixed (space freed by a DEL, which needs none): the failed container's ADD works.
    let (freed, _) = &added[0];
    attach_prefixed(&ns.prefix(), ours(), "DEL", &config, freed, "eth0", &[])
        .assert_success_silent();
    assert_eq!(addresses(&add(&failed_id)).len(), 2);
    assert!(names_in(&dir).iter().all(|n| !n.starts_with('.')));
}

#[test]
fn foreign_and_corrupt_files_are_tolerated_like_the_reference() {
    let data = TempDir::new("hl-foreign");
    let name = unique_name("hl");
    let config = single(&name, "1.1.0", &data, "10.12.0.0/24");
    let dir = data.path().join(&name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let outside = data.path().join("outside");
    std::fs::write(&outside, "c1\r\neth0").expect("write");
    // Garbage bytes: a reservation of nobody we know.
    std::fs::write(
        dir.join("10.12.0.2"),
        [0xff, 0x00, 0xfe, b'\r', b'\n', 0x80],
    )
    .expect("write");
    // A directory, a symlink and a FIFO under addresses' names: not reservations, not
    // followed, not opened for long, and not handed out.
    std::fs::create_dir(dir.join("10.12.0.3")).expect("mkdir");
    std::os::unix::fs::symlink(&outside, dir.join("10.12.0.4")).expect("symlink");
    nix::unistd::mkfifo(
        &dir.join("10.12.0.5"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .expect("mkfifo");
    // A huge (sparse) file: never read into memory, not anyone's reservation.
    let huge = std::fs::File::create(dir.join("10.12.0.6")).expect("create");
    huge.set_len(1 << 30).expect("set_len");
    drop(huge);
    // A legacy id-only reservation, one outside every range, and a garbage cursor.
    std::fs::write(dir.join("10.12.0.7"), "legacy").expect("write");
    std::fs::write(dir.join("192.0.2.1"), "c1\r\neth0").expect("write");
    std::fs::write(dir.join("198.51.100.1"), "stranger\r\neth0").expect("write");
    std::fs::write(dir.join("last_reserved_ip.0"), "not an address\0\u{7f}").expect("write");

    // The cursor is ignored (start of the range) and every planted name is skipped. The
    // reservation outside the range is c1's own, but in no range set, so it is no
    // duplicate (as in the reference, whose guard only looks inside the set).
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "c1", "eth0")),
        ["10.12.0.8/24"]
    );
    attach(ours(), "CHECK", &config, "c1", "eth0").assert_success_silent();
    network_command(ours(), "STATUS", &config).assert_success_silent();
    // A requested address held by a foreign object is "not available", like a taken one.
    attach_with(ours(), "ADD", &config, "c2", "eth0", &[("CNI_ARGS", "IP=10.12.0.4")])
        .assert_error(
            999,
            "failed to allocate for range 0: requested IP address 10.12.0.4 is not available in range set 10.12.0.1-10.12.0.254",
        );
    // A DEL whose prevResult names the foreign objects leaves them alone and does not
    // hang on the FIFO; it releases by owner: c1's address and its out-of-range file.
    let mut del = config.clone();
    del["prevResult"] = json!({"cniVersion": "1.1.0", "ips": [
        {"address": "10.12.0.3/24"}, {"address": "10.12.0.4/24"},
        {"address": "10.12.0.5/24"}, {"address": "10.12.0.6/24"},
    ]});
    attach(ours(), "DEL", &del, "c1", "eth0").assert_success_silent();
    attach(ours(), "DEL", &config, "legacy", "eth0").assert_success_silent();
    // GC releases reservations of unknown owners (the garbage one, the stranger's) and
    // leaves the foreign objects.
    let mut gc = config.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "c9", "ifname": "eth0"}]);
    network_command(ours(), "GC", &gc).assert_success_silent();
    assert_eq!(
        names_in(&dir),
        [
            "10.12.0.3",
            "10.12.0.4",
            "10.12.0.5",
            "10.12.0.6",
            "boot.json",
            "last_reserved_ip.0",
            "lock"
        ]
    );
    assert_eq!(std::fs::read(&outside).expect("read"), b"c1\r\neth0");
    assert_eq!(
        std::fs::read(dir.join("last_reserved_ip.0")).expect("read"),
        b"10.12.0.8"
    );
    // The next ADD skips them again.
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "c1", "eth0")),
        ["10.12.0.9/24"]
    );
    assert!(temp_files(&data, &name).is_empty());
}

#[test]
fn lock_must_be_a_regular_file_and_cursor_faults_cost_only_order() {
    let data = TempDir::new("hl-lockfault");
    let name = unique_name("hl");
    let config = single(&name, "1.0.0", &data, "10.13.0.0/24");
    let dir = data.path().join(&name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let outside = data.path().join("outside");
    std::fs::write(&outside, "").expect("write");
    let lock = dir.join("lock");
    let refused = format!(
        "unsafe path {}: the lock must be a regular file (found a symlink, directory or other file)",
        lock.display()
    );
    type Plant = fn(&Path, &Path);
    let plants: [(&str, Plant); 3] = [
        ("symlink", |lock, outside| {
            std::os::unix::fs::symlink(outside, lock).expect("symlink");
        }),
        ("directory", |lock, _| {
            std::fs::create_dir(lock).expect("mkdir")
        }),
        ("fifo", |lock, _| {
            nix::unistd::mkfifo(lock, nix::sys::stat::Mode::from_bits_truncate(0o600))
                .expect("mkfifo");
        }),
    ];
    for (what, plant) in plants {
        plant(&lock, &outside);
        for command in ["ADD", "DEL", "CHECK"] {
            let out = attach(ours(), command, &config, "c1", "eth0");
            assert_eq!(
                (out.error_code(), out.error_msg()),
                (Some(999), Some(refused.clone())),
                "{what} as lock, {command}: {out}"
            );
        }
        assert!(reservations(&data, &name).is_empty(), "{what}");
        assert!(temp_files(&data, &name).is_empty(), "{what}");
        // Fixed: the next ADD succeeds and makes a regular lock file.
        if std::fs::symlink_metadata(&lock).is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir(&lock).expect("rmdir");
        } else {
            std::fs::remove_file(&lock).expect("rm");
        }
        attach(ours(), "ADD", &config, "c1", "eth0").assert_success();
        attach(ours(), "DEL", &config, "c1", "eth0").assert_success_silent();
        assert!(std::fs::symlink_metadata(&lock).is_ok_and(|m| m.is_file()));
        std::fs::remove_file(&lock).expect("rm");
    }
    assert_eq!(std::fs::read(&outside).expect("read"), b"");

    std::fs::remove_file(dir.join("last_reserved_ip.0")).expect("rm");
    // A directory where last_reserved_ip.0 goes: the ADD still succeeds (the cursor only
    // orders round-robin; the reference fails here and keeps the reservation it made),
    // the reservation is whole and no temp file is left.
    std::fs::create_dir(dir.join("last_reserved_ip.0")).expect("mkdir");
    let out = attach(ours(), "ADD", &config, "c1", "eth0");
    assert_eq!(addresses(&out), ["10.13.0.2/24"]);
    assert!(
        out.stderr.contains("could not record the last reserved ip"),
        "{out}"
    );
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "c2", "eth0")),
        ["10.13.0.3/24"]
    );
    assert!(temp_files(&data, &name).is_empty());
    std::fs::remove_dir(dir.join("last_reserved_ip.0")).expect("rmdir");
    // Fixed: the cursor is written again.
    assert_eq!(
        addresses(&attach(ours(), "ADD", &config, "c3", "eth0")),
        ["10.13.0.4/24"]
    );
    assert_eq!(
        std::fs::read(dir.join("last_reserved_ip.0")).expect("read"),
        b"10.13.0.4"
    );
}
