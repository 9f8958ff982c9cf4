//! Root tests of netns handles and of sysctls written inside a netns.

mod common;

use cni_linux::{Error, NetNs, Netlink, sysctl};
use common::{in_private_netns, new_netns};

#[test]
fn open_reports_missing_and_non_netns_paths() {
    let err = NetNs::open("/nonexistent/netns/x").unwrap_err();
    assert!(matches!(err, Error::NetnsNotFound { .. }), "{err:?}");
    for not_netns in ["/proc/self/stat", "/proc/self/ns/mnt", "/proc/self/ns/uts"] {
        let err = NetNs::open(not_netns).unwrap_err();
        assert!(
            matches!(err, Error::NotNetns { .. }),
            "{not_netns}: {err:?}"
        );
    }
    assert!(NetNs::open("/proc/self/ns/net").is_ok());
}

#[test]
fn run_enters_the_netns_and_identity_compares() {
    in_private_netns("run_enters_the_netns_and_identity_compares", |_nl| {
        let here = NetNs::current().unwrap();
        let pod = new_netns();
        assert!(here.is_current().unwrap());
        assert!(!pod.is_current().unwrap());
        assert!(!pod.same_as(&here).unwrap());

        let inside = pod.run(|| NetNs::current().unwrap()).unwrap();
        assert!(inside.same_as(&pod).unwrap());
        assert!(
            here.is_current().unwrap(),
            "the caller's thread must not move"
        );
    });
}

#[test]
fn sysctl_is_written_inside_the_target_netns_only() {
    in_private_netns("sysctl_is_written_inside_the_target_netns_only", |nl| {
        let pod = new_netns();
        let in_pod = Netlink::connect_in(&pod).unwrap();
        in_pod
            .create_veth_pair_local("eth0", "eth0peer", None)
            .unwrap();

        let name = "net/ipv4/conf/eth0/arp_notify";
        assert_eq!(sysctl::read_in(&pod, name).unwrap(), "0");
        sysctl::write_in(&pod, name, "1").unwrap();
        assert_eq!(sysctl::read_in(&pod, name).unwrap(), "1");
        // Same value again: no write is attempted, still fine.
        sysctl::write_in(&pod, name, "1").unwrap();

        // The test's own netns has no eth0, so the file is not there.
        assert!(nl.link_by_name("eth0").unwrap().is_none());
        assert!(matches!(sysctl::read(name), Err(Error::SysctlRead { .. })));
        let err = sysctl::write_in(&pod, "net/ipv4/conf/missing0/arp_notify", "1").unwrap_err();
        assert!(matches!(err, Error::SysctlWrite { .. }), "{err:?}");
    });
}

#[test]
fn sysctl_write_skips_when_value_already_set() {
    in_private_netns("sysctl_write_skips_when_value_already_set", |_nl| {
        // A fresh netns starts with forwarding off; setting it twice must work.
        sysctl::write("net/ipv4/ip_forward", "1").unwrap();
        assert_eq!(sysctl::read("net/ipv4/ip_forward").unwrap(), "1");
        sysctl::write("net/ipv4/ip_forward", "1").unwrap();
    });
}

#[test]
fn sysctl_write_on_a_read_only_proc_sys_passes_only_when_already_set() {
    in_private_netns(
        "sysctl_write_on_a_read_only_proc_sys_passes_only_when_already_set",
        |_nl| {
            use nix::sched::{CloneFlags, unshare};
            let name = "net/ipv4/ip_forward";
            sysctl::write(name, "1").unwrap();
            // A mount namespace of this thread alone (its children, the `mount`s
            // below, start in it), detached from the machine's, with /proc/sys
            // bound read-only over itself.
            unshare(CloneFlags::CLONE_NEWNS).expect("unshare(CLONE_NEWNS)");
            for args in [
                &["--make-rprivate", "/"][..],
                &["--bind", "/proc/sys", "/proc/sys"],
                &["-o", "remount,bind,ro", "/proc/sys"],
            ] {
                let status = std::process::Command::new("mount")
                    .args(args)
                    .status()
                    .expect("run mount");
                assert!(status.success(), "mount {args:?}: {status}");
            }
            sysctl::write(name, "1").expect("the value is already right");
            let err = sysctl::write(name, "0").unwrap_err();
            assert!(matches!(err, Error::SysctlWrite { .. }), "{err:?}");
            assert_eq!(
                err.errno(),
                Some(nix::errno::Errno::EROFS as i32),
                "{err:?}"
            );
            assert_eq!(sysctl::read(name).unwrap(), "1");
        },
    );
}

#[test]
fn a_netns_lock_holds_off_a_lock_through_any_other_handle_of_the_namespace() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    let held = NetNs::open("/proc/self/ns/net").unwrap().lock().unwrap();
    let taken = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let other = NetNs::open("/proc/self/ns/net").unwrap();
            let _lock = other.lock().unwrap();
            taken.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !taken.load(Ordering::SeqCst),
            "a second handle took the lock while the first held it"
        );
        drop(held);
        waiter.join().unwrap();
    });
    assert!(taken.load(Ordering::SeqCst));
    // Released on drop: it can be taken again.
    drop(NetNs::open("/proc/self/ns/net").unwrap().lock().unwrap());
}
