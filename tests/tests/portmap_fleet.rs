//! Our `portmap` and the reference's (`/usr/lib/cni/portmap`, v1.1.1) on one node at
//! once, on iptables (the reference's only backend): 100 pods, each pod's host ports
//! added by one side and deleted by the other in every combination, 16 calls in flight
//! after the node's first pod.
//! Both share the `CNI-HOSTPORT-*` chains; each must leave the other's rules alone and
//! remove the other's rules of a pod it deletes. Shown: while pods are live, each has its
//! DNAT chain and its jumps; at the end no per-pod chain or jump is left.
//!
//! The pods' addresses come from a made-up `prevResult` (portmap reads nothing else of
//! the pod), so the run measures the firewall side only.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

use cni_blackbox::fleet::{Side, sides};
use cni_blackbox::hostport::dnat_chain;
use cni_blackbox::{Netns, Outcome, Plugin, parallel, require_root};
use serde_json::{Value, json};

const PODS: usize = 100;
const WIDTH: usize = 16;
const REFERENCE: &str = "/usr/lib/cni/portmap";
const NETWORK: &str = "pmfleet";

fn id(i: usize) -> String {
    format!("pmfleet-{i}")
}

fn conf(i: usize, with_prev: bool) -> Value {
    let mut conf = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "portmap",
        "runtimeConfig": {"portMappings": [
            {"hostPort": 20000 + i, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 30000 + i, "containerPort": 53, "protocol": "udp"}
        ]}
    });
    if with_prev {
        conf["prevResult"] = json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/pmfleet"}],
            "ips": [
                {"address": format!("10.77.{}.{}/16", i / 250, i % 250 + 2), "interface": 0},
                {"address": format!("fd00:77::{:x}/64", i + 2), "interface": 0}
            ]
        });
    }
    conf
}

struct Fleet {
    host: Netns,
    problems: Mutex<Vec<String>>,
}

impl Fleet {
    fn call(&self, side: Side, command: &str, i: usize) -> Outcome {
        let plugin = match side {
            Side::Ours => Plugin::new("portmap", &self.host),
            Side::Reference => {
                Plugin::at(Path::new(REFERENCE), &self.host).cni_path("/usr/lib/cni")
            }
        };
        plugin
            .command(command)
            .container_id(&id(i))
            .netns("/var/run/netns/pmfleet")
            .ifname("eth0")
            .config(&conf(i, command == "ADD"))
            .run()
    }

    fn run(&self, command: &str, i: usize) {
        let side = if command == "ADD" {
            sides(i).0
        } else {
            sides(i).1
        };
        let out = self.call(side, command, i);
        if !out.success() {
            self.problems
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(format!("{command} {i} by {side:?}:\n{out}"));
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

    /// The per-pod chains and the pods whose jumps are in `CNI-HOSTPORT-DNAT`, per family.
    fn state(&self) -> Vec<(BTreeSet<String>, BTreeSet<String>)> {
        ["iptables-save", "ip6tables-save"]
            .iter()
            .map(|save| {
                let text = self.host.exec_ok(&[save, "-t", "nat"]);
                let chains = text
                    .lines()
                    .filter_map(|l| l.strip_prefix(":CNI-DN-"))
                    .filter_map(|l| l.split_whitespace().next())
                    .map(|c| format!("CNI-DN-{c}"))
                    .collect();
                let jumps = text
                    .lines()
                    .filter(|l| l.starts_with("-A CNI-HOSTPORT-DNAT"))
                    .filter_map(|l| l.split("-j ").nth(1).map(str::to_owned))
                    .collect();
                (chains, jumps)
            })
            .collect()
    }

    #[track_caller]
    fn assert_live(&self, live: &[usize], phase: &str) {
        let want: BTreeSet<String> = live.iter().map(|&i| dnat_chain(NETWORK, &id(i))).collect();
        for (family, (chains, jumps)) in self.state().into_iter().enumerate() {
            assert_eq!(chains, want, "{phase}: per-pod chains of family {family}");
            assert_eq!(jumps, want, "{phase}: jumped-to chains of family {family}");
        }
    }
}

#[test]
fn ours_and_the_reference_share_a_node_without_leaks() {
    if !require_root() || !Path::new(REFERENCE).exists() {
        return;
    }
    let fleet = Fleet {
        host: Netns::new("cnibb-pmfleet"),
        problems: Mutex::new(Vec::new()),
    };
    let half = PODS / 2;
    // The first pod comes alone, by our side, so that the shared CNI-HOSTPORT-* chains
    // exist as on any node after its first pod: the reference checks for a shared chain
    // and creates it in two steps, so two of its first ADDs at once can fail with
    // "CHAIN_USER_ADD failed (File exists)" (its own race, not a leak of either side).
    assert_eq!(sides(0).0, Side::Ours);
    fleet.run("ADD", 0);
    parallel(half - 1, WIDTH, |i| fleet.run("ADD", i + 1));
    fleet.assert_no_problems("first ADDs");
    fleet.assert_live(&(0..half).collect::<Vec<_>>(), "after the first ADDs");

    // The first half goes while the second half comes.
    parallel(PODS, WIDTH, |k| {
        let i = k / 2;
        if k % 2 == 0 {
            fleet.run("DEL", i);
        } else {
            fleet.run("ADD", half + i);
        }
    });
    fleet.assert_no_problems("DELs racing ADDs");
    fleet.assert_live(&(half..PODS).collect::<Vec<_>>(), "after DELs racing ADDs");

    parallel(half, WIDTH, |i| fleet.run("DEL", half + i));
    fleet.assert_no_problems("last DELs");
    fleet.assert_live(&[], "at the end");
}
