//! A node in the middle of an upgrade: our bridge + host-local and the
//! reference's (`/usr/lib/cni`, plugins v1.1.1) serve the same network at the same time,
//! on one bridge, one IPAM `dataDir` and one set of masquerade rules, with pods added by
//! one and deleted by the other in every combination.
//!
//! 200 pods, 400 calls, 16 in flight at once: 100 ADDs, then 100 DELs of those racing 100
//! more ADDs, then the last 100 DELs. Half the ADDs and half the DELs are the reference's.
//! Shown: every ADD succeeds with addresses that no other live pod has, each recorded in
//! a reservation file naming that pod; the pod's interface carries exactly them; and at
//! the end no reservation, host veth, pod interface or masquerade rule is left.
//!
//! The reference speaks at most cniVersion 1.0.0 and has only the iptables masquerade
//! backend, so the config is 1.0.0 without `ipMasqBackend` (our default is iptables, as the
//! reference's). Both host-locals serialize on `flock` of `<dataDir>/<network>/lock`.

mod bridge_support;

use std::collections::BTreeMap;
use std::sync::Mutex;

use bridge_support::{Net, global_addrs, has_link, reference_available};
use cni_blackbox::fleet::{Side, sides};
use cni_blackbox::{Netns, Outcome, parallel, require_root};
use serde_json::{Value, json};

const PODS: usize = 200;
/// Calls in flight at once.
const WIDTH: usize = 16;
const V4: &str = "10.78.0.0/16";
const V6: &str = "fd00:78::/64";

fn id(i: usize) -> String {
    format!("fleet-{i}")
}

/// The shared state of the run: which addresses live pods hold, and duplicates seen.
struct Fleet {
    net: Net,
    conf: Value,
    pods: Vec<Netns>,
    /// address → pod index, for pods whose ADD returned and whose DEL has not started.
    live: Mutex<BTreeMap<String, usize>>,
    /// Every problem seen by a worker (checked after each phase, so all are reported).
    problems: Mutex<Vec<String>>,
}

impl Fleet {
    fn call(&self, side: Side, command: &str, i: usize) -> Outcome {
        let pod = &self.pods[i];
        match side {
            Side::Ours => self.net.run(command, &self.conf, &id(i), pod, "eth0"),
            Side::Reference => self
                .net
                .run_reference(command, &self.conf, &id(i), pod, "eth0"),
        }
    }

    fn problem(&self, text: String) {
        self.problems
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(text);
    }

    /// ADD of pod `i`, then: its addresses are new among live pods, each has a
    /// reservation file naming the pod, and the pod's eth0 carries exactly them.
    fn add(&self, i: usize) {
        let side = sides(i).0;
        let out = self.call(side, "ADD", i);
        if !out.success() {
            self.problem(format!("ADD {i} by {side:?} failed:\n{out}"));
            return;
        }
        let result = out.json();
        let addresses: Vec<String> = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str().map(str::to_owned))
            .collect();
        if addresses.len() != 2 {
            self.problem(format!(
                "ADD {i} by {side:?}: not one address per family:\n{out}"
            ));
        }
        {
            let mut live = self
                .live
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for cidr in &addresses {
                if let Some(other) = live.insert(cidr.clone(), i) {
                    self.problem(format!(
                        "duplicate address {cidr}: pod {i} ({side:?}) and live pod {other}"
                    ));
                }
            }
        }
        let reservations = self.net.reservations();
        for cidr in &addresses {
            let ip = cidr.split('/').next().unwrap_or_default();
            let expected = format!("{}\r\neth0", id(i));
            if reservations.get(ip) != Some(&expected) {
                self.problem(format!(
                    "ADD {i} by {side:?}: reservation of {ip} is {:?}, not {expected:?}",
                    reservations.get(ip)
                ));
            }
        }
        let mut on_eth0 = global_addrs(&self.pods[i], "-4", "eth0");
        on_eth0.extend(global_addrs(&self.pods[i], "-6", "eth0"));
        let mut reported = addresses;
        on_eth0.sort();
        reported.sort();
        if on_eth0 != reported {
            self.problem(format!(
                "ADD {i} by {side:?}: eth0 has {on_eth0:?}, the result says {reported:?}"
            ));
        }
    }

    /// DEL of pod `i`; its addresses leave the live set first (once the DEL has started,
    /// host-local may hand them out again before the DEL returns).
    fn del(&self, i: usize) {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|_, owner| *owner != i);
        let side = sides(i).1;
        let out = self.call(side, "DEL", i);
        if !out.success() || !out.stdout.is_empty() {
            self.problem(format!("DEL {i} by {side:?} failed:\n{out}"));
        }
    }

    #[track_caller]
    fn assert_no_problems(&self, phase: &str) {
        let problems = self
            .problems
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert!(
            problems.is_empty(),
            "{phase}: {} problems:\n{}",
            problems.len(),
            problems.join("\n")
        );
    }

    /// The reservation files are exactly the live pods' addresses, named for them, and
    /// the host has one veth and one masquerade rule per family per live pod.
    #[track_caller]
    fn assert_state_is_live_set(&self, phase: &str) {
        let live = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let expected: BTreeMap<String, String> = live
            .iter()
            .map(|(cidr, i)| {
                let ip = cidr.split('/').next().unwrap_or_default().to_owned();
                (ip, format!("{}\r\neth0", id(*i)))
            })
            .collect();
        assert_eq!(self.net.reservations(), expected, "{phase}: reservations");
        let pods = live.len() / 2;
        assert_eq!(self.net.host_veths().len(), pods, "{phase}: host veths");
        let rules = self.net.iptables();
        let jumps = rules
            .lines()
            .filter(|l| l.starts_with("-A POSTROUTING") && l.contains("-j CNI-"))
            .count();
        assert_eq!(jumps, 2 * pods, "{phase}: masquerade jumps:\n{rules}");
    }
}

#[test]
fn mixed_fleet_of_ours_and_the_reference_on_one_network() {
    if !require_root() || !reference_available() {
        return;
    }
    let net = Net::new();
    let conf = net.conf(
        "1.0.0",
        &[V4, V6],
        &json!({"isGateway": true, "ipMasq": true}),
    );
    let fleet = Fleet {
        pods: (0..PODS).map(|_| net.pod()).collect(),
        net,
        conf,
        live: Mutex::new(BTreeMap::new()),
        problems: Mutex::new(Vec::new()),
    };
    let half = PODS / 2;

    // Phase 1: the first half comes up, half by each side. The first pod comes alone, by
    // our side, as on a real node whose first pod is up before the next ones come: the
    // reference creates the bridge's gateway address and its masquerade chains by a check
    // and an add in two steps, so two of its first ADDs at once can fail on each other
    // (its own race, not a leak). Our own first ADDs racing on a new bridge are shown by
    // the bridge concurrency suite.
    assert_eq!(sides(0).0, Side::Ours);
    fleet.add(0);
    parallel(half - 1, WIDTH, |i| fleet.add(i + 1));
    fleet.assert_no_problems("first ADDs");
    fleet.assert_state_is_live_set("after the first ADDs");

    // Phase 2: the first half goes away while the second half comes up.
    parallel(PODS, WIDTH, |k| {
        // Interleaved: DEL 0, ADD 100, DEL 1, ADD 101, ...
        let i = k / 2;
        if k % 2 == 0 {
            fleet.del(i);
        } else {
            fleet.add(half + i);
        }
    });
    fleet.assert_no_problems("DELs racing ADDs");
    fleet.assert_state_is_live_set("after the DELs racing ADDs");

    // Phase 3: the rest goes away.
    parallel(half, WIDTH, |i| fleet.del(half + i));
    fleet.assert_no_problems("last DELs");
    fleet.assert_state_is_live_set("at the end");
    fleet.net.assert_nothing_left("at the end");
    let rules = fleet.net.iptables();
    assert!(!rules.contains(":CNI-"), "masquerade chains left:\n{rules}");
    let left: Vec<usize> = (0..PODS)
        .filter(|&i| has_link(&fleet.pods[i], "eth0"))
        .collect();
    assert!(left.is_empty(), "pods that still have eth0: {left:?}");
}
