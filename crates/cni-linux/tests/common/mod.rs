//! Harness for root tests: every test body runs on its own thread inside a
//! fresh, empty network namespace, so the machine's netns is never touched
//! and everything the test creates vanishes with the thread.

#![allow(dead_code)] // each test binary uses a different subset

use std::net::IpAddr;

use cni_linux::{NetNs, Netlink};
use ipnetwork::IpNetwork;
use nix::sched::{CloneFlags, unshare};

/// True if the test may run. Without root: a skip locally, a failure under CI=true.
pub fn require_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: needs root (CAP_NET_ADMIN); CI=true makes a missing privilege a failure");
    }
    eprintln!("skipping {test}: needs root");
    false
}

/// Runs `body` with a netlink handle in a private netns ("host" of the test).
pub fn in_private_netns<F>(test: &str, body: F)
where
    F: FnOnce(Netlink) + Send,
{
    if !require_root(test) {
        return;
    }
    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            let nl = Netlink::connect().expect("netlink in private netns");
            body(nl);
        });
        if let Err(panic) = worker.join() {
            std::panic::resume_unwind(panic);
        }
    });
}

/// Creates another empty netns (a "pod") that lives as long as the returned handle.
pub fn new_netns() -> NetNs {
    std::thread::spawn(|| {
        unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
        NetNs::current().expect("open own netns")
    })
    .join()
    .expect("netns thread")
}

/// `s` as a network; panics if it is not one.
pub fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}

/// `s` as an address; panics if it is not one.
pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The index of the link `name`; panics if there is none.
pub fn index_of(nl: &Netlink, name: &str) -> u32 {
    nl.require_link(name).unwrap().index
}
