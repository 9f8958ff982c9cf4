//! CRI-O calls CHECK right after every ADD: on a busy bridge (dual-stack, masquerade, 20
//! live pods at any time, 4 calls in flight) 200 ADDs each followed by CHECK must give 200
//! successful CHECKs, every pod's DEL included.

mod bridge_support;

use std::sync::Mutex;

use bridge_support::Net;
use cni_blackbox::{Netns, parallel, require_root};
use serde_json::json;

const PODS: usize = 200;
const LIVE: usize = 20;
const WIDTH: usize = 4;

#[test]
fn check_right_after_add_never_fails_on_a_healthy_pod() {
    if !require_root() {
        return;
    }
    let net = Net::new();
    let conf = net.conf(
        "1.0.0",
        &["10.68.0.0/24", "fd00:68::/64"],
        &json!({"isGateway": true, "isDefaultGateway": true, "ipMasq": true}),
    );
    let pods: Vec<Netns> = (0..PODS).map(|_| net.pod()).collect();
    let failures = Mutex::new(Vec::new());
    let fail = |what: String| {
        failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(what);
    };
    // In waves of LIVE pods: add and check each, then delete the wave, so the bridge
    // always carries other pods being added, checked and deleted alongside.
    for wave in (0..PODS).collect::<Vec<_>>().chunks(LIVE) {
        parallel(wave.len(), WIDTH, |k| {
            let i = wave[k];
            let id = format!("check-{i}");
            let added = net.run("ADD", &conf, &id, &pods[i], "eth0");
            if !added.success() {
                fail(format!("ADD {i}:\n{added}"));
                return;
            }
            let mut with_prev = conf.clone();
            with_prev["prevResult"] = added.json();
            let checked = net.run("CHECK", &with_prev, &id, &pods[i], "eth0");
            if !checked.success() {
                fail(format!("CHECK {i} right after its ADD:\n{checked}"));
            }
        });
        parallel(wave.len(), WIDTH, |k| {
            let i = wave[k];
            let out = net.run("DEL", &conf, &format!("check-{i}"), &pods[i], "eth0");
            if !out.success() {
                fail(format!("DEL {i}:\n{out}"));
            }
        });
    }
    let failures = failures
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(
        failures.is_empty(),
        "{} of {PODS} pods failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    net.assert_nothing_left("after every pod's DEL");
}
