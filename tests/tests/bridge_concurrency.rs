//! Many bridge ADDs and DELs at once, as separate processes, on a bridge that does not
//! exist yet: they must converge on one bridge with one gateway address per family, get
//! distinct addresses, all report the one MAC the bridge keeps, and the DELs must leave
//! no veth, reservation or rule behind.

mod bridge_support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};

use bridge_support::Net;
use cni_blackbox::parallel;
use cni_blackbox::{Netns, Outcome, require_root};
use serde_json::json;

const PODS: usize = 50;
/// Processes in flight at once: enough to overlap heavily on a 2-core machine without
/// turning the test into a fork bomb.
const WIDTH: usize = 25;

/// Runs `f` on every pod in parallel and returns the outcomes plus the largest number of
/// calls that were in flight together (to show that they did overlap).
fn overlapping(
    pods: &[Netns],
    f: impl Fn(usize, &Netns) -> Outcome + Sync,
) -> (Vec<Outcome>, usize) {
    let in_flight = AtomicUsize::new(0);
    let peak = AtomicUsize::new(0);
    let outcomes = parallel(pods.len(), WIDTH, |i| {
        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        peak.fetch_max(now, Ordering::SeqCst);
        let out = f(i, &pods[i]);
        in_flight.fetch_sub(1, Ordering::SeqCst);
        out
    });
    (outcomes, peak.load(Ordering::SeqCst))
}

fn fifty_adds_then_fifty_dels(backend: &str) {
    let net = Net::new();
    let pods: Vec<Netns> = (0..PODS).map(|_| net.pod()).collect();
    let conf = net.conf(
        "1.0.0",
        &["10.77.0.0/24", "fd00:77::/64"],
        &json!({
            "isGateway": true,
            "ipMasq": true,
            "ipMasqBackend": backend,
            "macspoofchk": true,
        }),
    );
    assert!(net.bridge_link().is_none());
    let id = |i: usize| format!("ctr-{i}");

    let (adds, peak) = overlapping(&pods, |i, pod| net.run("ADD", &conf, &id(i), pod, "eth0"));
    assert!(peak > 1, "the ADDs did not overlap (peak {peak})");
    for out in &adds {
        out.assert_success();
    }
    let addresses: BTreeSet<String> = adds
        .iter()
        .flat_map(|o| {
            o.json()["ips"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|ip| ip["address"].as_str().map(str::to_owned))
        })
        .collect();
    assert_eq!(addresses.len(), 2 * PODS, "addresses not distinct");

    // One bridge, one gateway address per family, every veth on it.
    assert_eq!(net.bridges(), std::slice::from_ref(&net.bridge));
    assert_eq!(net.bridge_addrs("-4"), ["10.77.0.1/24"]);
    assert_eq!(net.bridge_addrs("-6"), ["fd00:77::1/64"]);
    let veths: BTreeSet<String> = net.host_veths().into_iter().collect();
    let reported: BTreeSet<String> = adds
        .iter()
        .map(|o| {
            o.json()["interfaces"][1]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(veths, reported);
    assert_eq!(veths.len(), PODS);
    let ports = net.host.exec_ok(&["bridge", "-j", "link", "show"]);
    let ports: serde_json::Value = serde_json::from_str(&ports).expect("bridge -j link");
    let on_bridge = ports
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["master"] == json!(net.bridge))
        .count();
    assert_eq!(on_bridge, PODS);
    // Every ADD reports the MAC the bridge keeps: each pins it, and one that wrote back
    // a MAC it read before other ports joined would change it under the earlier pods.
    let bridge_mac = bridge_support::mac_of(&net.host, &net.bridge);
    for (i, out) in adds.iter().enumerate() {
        assert_eq!(
            out.json()["interfaces"][0]["mac"],
            json!(bridge_mac),
            "ADD {i} reported another bridge MAC than the bridge has"
        );
    }
    for (i, pod) in pods.iter().enumerate() {
        let mac = adds[i].json()["interfaces"][2]["mac"].clone();
        assert_eq!(
            bridge_support::mac_of(pod, "eth0"),
            mac.as_str().unwrap_or_default()
        );
    }
    let reservations = net.reservations();
    assert_eq!(reservations.len(), 2 * PODS);
    let owners: BTreeSet<&String> = reservations.values().collect();
    assert_eq!(owners.len(), PODS, "{owners:?}");

    // One masquerade rule set and one spoof check per attachment.
    let rules = format!("{}{}", net.iptables(), net.nft());
    for i in 0..PODS {
        let cid = id(i);
        let masq = if backend == "iptables" {
            format!("id: \\\"{cid}\\\"\" -j CNI-")
        } else {
            format!("id: {cid}\"")
        };
        // Both families.
        assert_eq!(
            rules.matches(&masq).count(),
            2,
            "{cid}: masquerade rules ({masq}):\n{rules}"
        );
        assert_eq!(
            rules
                .matches(&format!("comment \"macspoofchk-{cid}-eth0\""))
                .count(),
            4,
            "{cid}: spoof check"
        );
    }

    let (dels, peak) = overlapping(&pods, |i, pod| net.run("DEL", &conf, &id(i), pod, "eth0"));
    assert!(peak > 1, "the DELs did not overlap (peak {peak})");
    for out in &dels {
        out.assert_success_silent();
    }
    net.assert_nothing_left("after the concurrent DELs");
    for pod in &pods {
        assert!(!bridge_support::has_link(pod, "eth0"));
    }
    // The shared bridge and its gateway addresses stay (other pods may come).
    assert_eq!(net.bridge_addrs("-4"), ["10.77.0.1/24"]);
}

#[test]
fn fifty_concurrent_adds_and_dels_iptables() {
    if !require_root() {
        return;
    }
    fifty_adds_then_fifty_dels("iptables");
}

#[test]
fn fifty_concurrent_adds_and_dels_nftables() {
    if !require_root() {
        return;
    }
    fifty_adds_then_fifty_dels("nftables");
}

/// Fresh bridges, each taking a burst of concurrent layer-2 ADDs: the first ports to join
/// keep changing the bridge's MAC until one ADD pins it, so this is where an ADD that
/// wrote back a MAC read before another port joined would show.
#[test]
fn every_concurrent_add_on_a_new_bridge_reports_the_mac_it_keeps() {
    if !require_root() {
        return;
    }
    const ROUNDS: usize = 20;
    const BURST: usize = 8;
    for round in 0..ROUNDS {
        let net = Net::new();
        let pods: Vec<Netns> = (0..BURST).map(|_| net.pod()).collect();
        let conf = net.conf("1.0.0", &[], &json!({}));
        let (adds, _) = overlapping(&pods, |i, pod| {
            net.run("ADD", &conf, &format!("mac-{i}"), pod, "eth0")
        });
        for out in &adds {
            out.assert_success();
        }
        let bridge_mac = bridge_support::mac_of(&net.host, &net.bridge);
        let reported: BTreeSet<String> = adds
            .iter()
            .map(|o| {
                o.json()["interfaces"][0]["mac"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        assert_eq!(
            reported,
            BTreeSet::from([bridge_mac]),
            "round {round}: the ADDs reported other bridge MACs than the bridge kept"
        );
    }
}
