//! The node agent's VXLAN overlay, for real: two underlay segments (bridges in the
//! underlay namespace) joined by a router namespace that has no route to any pod CIDR,
//! dual-stack nodes on both, the built `cni-node` on each. Nodes on one segment route
//! to each other directly; across the router they encapsulate. Pods attached through
//! `cnitool` reach each other in both families with their own addresses, a ping with
//! DF at the pod MTU crosses the overlay, and the overlay follows an InternalIP change,
//! a node moving to the other segment, a deleted node, a device deleted or set down by
//! hand, each kind of entry of the devices deleted by hand (through the neighbour
//! notification alone: no resync runs) and an agent SIGKILLed and started again (pinged
//! every 10 ms meanwhile), while a VXLAN device of someone else's stays as it was. Times
//! are recorded, not asserted tightly (the bounds only catch what is plainly broken).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cni_blackbox::cluster::{
    Cluster, PROTO, WITHOUT_RESYNC, node_name, pod_cidr_v4, pod_cidr_v6, wait,
};
use cni_blackbox::connections::{tcp_pair, tcp_throughput};
use cni_blackbox::measured::record_duration;
use cni_blackbox::segments::{
    Place, ROUTER_B_V4, ROUTER_B_V6, b_v4, df_ping, node_at, on_a, on_b, segment_a_routes,
    two_segments,
};
use cni_blackbox::underlay::{address, source_seen};
use cni_blackbox::{Netns, require_root};

/// The underlay MTU; the pod MTU is this minus 70 while IPv6 peers are encapsulated.
const MTU: u32 = 1500;

/// The first address of a pod CIDR: a node's VTEP address.
fn vtep(cidr: &str) -> String {
    cidr.split('/').next().unwrap_or_default().to_owned()
}

/// The routes node `m` should have ("dst via gw"): direct to nodes on its segment,
/// via their VTEP address to the others.
fn expected(places: &BTreeMap<u8, Place>) -> impl Fn(u8) -> BTreeSet<String> + '_ {
    move |m| {
        let Some(mine) = places.get(&m) else {
            return BTreeSet::new();
        };
        let mut out = BTreeSet::new();
        for (&o, place) in places {
            if o == m {
                continue;
            }
            let (v4, v6) = if place.segment == mine.segment {
                (place.v4.clone(), place.v6.clone())
            } else {
                (vtep(&pod_cidr_v4(o)), vtep(&pod_cidr_v6(o)))
            };
            out.insert(format!("{} via {v4}", pod_cidr_v4(o)));
            out.insert(format!("{} via {v6}", pod_cidr_v6(o)));
        }
        out
    }
}

/// The output device of each of the agent's routes in `ns`, by destination.
fn route_devices(ns: &Netns) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for family in ["-4", "-6"] {
        for line in ns
            .exec_ok(&["ip", family, "route", "show", "proto", PROTO])
            .lines()
        {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let (Some(dst), Some(at)) = (words.first(), words.iter().position(|w| *w == "dev"))
                && let Some(dev) = words.get(at + 1)
            {
                out.insert((*dst).to_owned(), (*dev).to_owned());
            }
        }
    }
    out
}

/// `bridge fdb show dev <dev>` lines (none when the device is missing).
fn fdb(ns: &Netns, dev: &str) -> String {
    let out = ns.exec(&["bridge", "fdb", "show", "dev", dev]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip neigh show dev <dev>` (none when the device is missing).
fn neighbours(ns: &Netns, dev: &str) -> String {
    let out = ns.exec(&["ip", "neigh", "show", "dev", dev]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A link's index in `ns`, if it exists.
fn ifindex(ns: &Netns, dev: &str) -> Option<u32> {
    let out = ns.exec(&["ip", "-o", "link", "show", dev]);
    String::from_utf8_lossy(&out.stdout)
        .split(':')
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Pings `to` from `from` every 10 ms `count` times; the longest run of lost replies,
/// in ms, and how many arrived.
fn ping_gap(from: &Netns, to: IpAddr, count: u32) -> std::process::Child {
    let family = if to.is_ipv4() { "-4" } else { "-6" };
    Command::new("ip")
        .args([
            "netns",
            "exec",
            from.name(),
            "ping",
            family,
            "-n",
            "-i",
            "0.01",
        ])
        .args(["-W", "1", "-c", &count.to_string()])
        .arg(to.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("ping: {e}"))
}

fn longest_gap_ms(child: std::process::Child, count: u32) -> (u32, usize) {
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("ping: {e}"));
    let seqs: BTreeSet<u32> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split("icmp_seq=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    let mut longest = 0;
    let mut run = 0;
    for seq in 1..=count {
        if seqs.contains(&seq) {
            run = 0;
        } else {
            run += 1;
            longest = longest.max(run);
        }
    }
    (longest * 10, seqs.len())
}

#[test]
fn nodes_behind_a_router_are_reached_through_vxlan_and_the_overlay_follows_every_change() {
    if !require_root() {
        return;
    }
    let started = Instant::now();
    let (mut cluster, router, mut places) = two_segments(&[1, 2], &[3, 4], MTU);
    // Someone else's VXLAN device on node 1, with an entry of its own.
    let n1 = &cluster.hosts[0].ns;
    n1.exec_ok(&[
        "ip",
        "link",
        "add",
        "fvx0",
        "type",
        "vxlan",
        "id",
        "4242",
        "dstport",
        "4790",
        "local",
        "198.18.0.11",
        "nolearning",
    ]);
    n1.exec_ok(&["ip", "link", "set", "fvx0", "up"]);
    n1.exec_ok(&[
        "bridge",
        "fdb",
        "add",
        "0a:00:00:00:42:01",
        "dev",
        "fvx0",
        "dst",
        "198.18.0.99",
        "self",
        "permanent",
    ]);
    let foreign_before = (ifindex(n1, "fvx0"), fdb(n1, "fvx0"));
    for (n, place) in &places {
        cluster.api.apply_node(node_at(*n, place));
    }
    let kubeconfig = cluster.kubeconfig.clone();
    for host in &mut cluster.hosts {
        // No resync during the test: every repair below is woken by the API or by the
        // host's notifications (link for the devices, neighbour for their entries).
        host.resync_secs = WITHOUT_RESYNC;
        host.start_agent(&kubeconfig);
    }
    cluster.wait_for_conflists();
    let took = cluster.wait_for_routes(Duration::from_secs(10), expected(&places));
    eprintln!("start: every node had its direct and tunnel routes after {took:?}");

    // Direct pairs are not encapsulated; pairs across the router are.
    for host in &cluster.hosts {
        let devices = route_devices(&host.ns);
        let mine = places[&host.n].segment;
        for (o, place) in &places {
            if *o == host.n {
                continue;
            }
            for (cidr, tunnel_dev) in [(pod_cidr_v4(*o), "cni-vx4"), (pod_cidr_v6(*o), "cni-vx6")] {
                let dev = devices.get(&cidr).cloned().unwrap_or_default();
                if place.segment == mine {
                    assert!(
                        !dev.starts_with("cni-vx"),
                        "node {} {cidr}: dev {dev}",
                        host.n
                    );
                } else {
                    assert_eq!(dev, tunnel_dev, "node {} {cidr}", host.n);
                }
            }
        }
    }
    // The devices as documented: VNI 4097, the IANA port, no learning, outer UDP
    // checksums computed (what keeps NAT and offloads from breaking them).
    for (dev, checksums) in [("cni-vx4", "udpcsum"), ("cni-vx6", "noudp6zerocsumtx")] {
        let detail = cluster.hosts[0]
            .ns
            .exec_ok(&["ip", "-d", "link", "show", dev]);
        for want in ["vxlan id 4097 ", "dstport 4789 ", "nolearning", checksums] {
            assert!(detail.contains(want), "{dev}: no {want:?} in {detail}");
        }
    }
    let metrics = cluster.hosts[0]
        .health("/metrics")
        .unwrap_or_else(|e| panic!("/metrics: {e}"));
    for family in ["ipv4", "ipv6"] {
        let line = format!("cni_node_tunnel_peers{{family=\"{family}\"}} 2");
        assert!(
            metrics.body.contains(&line),
            "no {line:?} in\n{}",
            metrics.body
        );
    }
    let router_routes = router.exec_ok(&["ip", "route"]) + &router.exec_ok(&["ip", "-6", "route"]);
    assert!(
        !router_routes.contains("10.244.") && !router_routes.contains("fd00:244"),
        "the router knows no pod CIDR: {router_routes}"
    );

    // The pod MTU leaves room for VXLAN over IPv6 (70), on every node.
    let pod_mtu = MTU - 70;
    for host in &cluster.hosts {
        wait(Duration::from_secs(5), "the lowered pod MTU", || {
            host.conflist()
                .is_some_and(|c| c["plugins"][0]["mtu"] == pod_mtu)
        })
        .unwrap_or_else(|e| panic!("node {}: {e}: {:?}", host.n, host.conflist()));
    }
    for n in 1..=4 {
        cluster.host(n).add_pod();
    }
    cluster.check_pod_to_pod();
    let (p1, p3) = (&cluster.hosts[0].pods[0], &cluster.hosts[2].pods[0]);
    df_ping(&p1.ns, p3.v4, pod_mtu - 28).unwrap_or_else(|e| panic!("{e}"));
    df_ping(&p1.ns, p3.v6, pod_mtu - 48).unwrap_or_else(|e| panic!("{e}"));
    df_ping(&p3.ns, p1.v6, pod_mtu - 48).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "pods: both families across the router with their own addresses, DF ping at MTU {pod_mtu} \
         ({:?} since start)",
        started.elapsed()
    );

    // The checksum trap (masqueraded traffic that enters VXLAN got bad outer UDP
    // checksums before kernel 5.7) does not apply: with every packet to the IPv4 device
    // masqueraded on node 1, as a kube-proxy SNAT path would, UDP and TCP still cross
    // and arrive from node 1's VTEP address.
    let n1 = &cluster.hosts[0].ns;
    n1.exec_ok(&["nft", "add", "table", "ip", "ovl_csum_test"]);
    n1.exec_ok(&[
        "nft",
        "add chain ip ovl_csum_test post { type nat hook postrouting priority srcnat; }",
    ]);
    n1.exec_ok(&[
        "nft",
        "add rule ip ovl_csum_test post oifname \"cni-vx4\" masquerade",
    ]);
    let seen = source_seen(&p1.ns, &p3.ns, p3.v4).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        seen.to_string(),
        vtep(&pod_cidr_v4(1)),
        "masqueraded to the VTEP"
    );
    let (_, p99, _) = request_response(&p1.ns, &p3.ns, p3.v4, 200);
    df_ping(&p1.ns, p3.v4, pod_mtu - 28).unwrap_or_else(|e| panic!("{e}"));
    n1.exec_ok(&["nft", "delete", "table", "ip", "ovl_csum_test"]);
    eprintln!(
        "masqueraded into VXLAN: UDP seen from {seen}, 200 TCP round trips (p99 {p99:.0} µs), \
         DF ping at the MTU"
    );

    // SIGKILL both ends' agents and start them again, pinging every 10 ms meanwhile.
    let (p1_ns, p3_v4) = (cluster.hosts[0].pods[0].ns.name().to_owned(), p3.v4);
    let index_before = ifindex(&cluster.hosts[0].ns, "cni-vx4");
    let count = 200;
    let pinger = ping_gap(&cluster.hosts[0].pods[0].ns, p3_v4, count);
    std::thread::sleep(Duration::from_millis(300));
    for n in [1, 3] {
        cluster.host(n).kill_agent();
    }
    for n in [1, 3] {
        cluster.host(n).start_agent(&kubeconfig);
    }
    let (gap, received) = longest_gap_ms(pinger, count);
    eprintln!(
        "SIGKILL + restart of nodes 1 and 3: {received}/{count} pings from {p1_ns} answered, \
         longest gap {gap} ms"
    );
    assert!(
        gap <= 100,
        "a gap of {gap} ms in the overlay across a restart"
    );
    assert_eq!(
        ifindex(&cluster.hosts[0].ns, "cni-vx4"),
        index_before,
        "the device was adopted, not made again"
    );

    // The IPv4 device deleted by hand, the IPv6 one set down: back, with their entries.
    let n1 = cluster.hosts[0].ns.name().to_owned();
    // The agent idle first, so that only the notifications of these changes can wake it.
    cluster.hosts[0].wait_until_quiet(Duration::from_secs(1));
    let t = Instant::now();
    cluster.hosts[0]
        .ns
        .exec_ok(&["ip", "link", "del", "cni-vx4"]);
    cluster.hosts[0]
        .ns
        .exec_ok(&["ip", "link", "set", "cni-vx6", "down"]);
    cluster.wait_for_routes(Duration::from_secs(5), expected(&places));
    wait(Duration::from_secs(5), "the devices' entries", || {
        let ns = &cluster.hosts[0].ns;
        let permanent = |text: String| {
            text.lines()
                .filter(|l| l.to_lowercase().contains("permanent"))
                .count()
        };
        permanent(fdb(ns, "cni-vx4")) == 2 && permanent(neighbours(ns, "cni-vx6")) == 2
    })
    .unwrap_or_else(|e| panic!("{e}: {}", cluster.hosts[0].agent_log()));
    eprintln!(
        "device deleted / set down by hand on {n1}: routes and entries back after {:?}",
        t.elapsed()
    );
    record_duration(
        "link notification: VXLAN devices deleted / set down by hand, back with routes and \
         entries",
        t.elapsed(),
    );
    cluster.check_pod_to_pod();

    // An FDB entry and a neighbour entry of the IPv4 device deleted by hand: the host's
    // notification of the deletion brings them back (no resync runs in this test).
    let ns = &cluster.hosts[0].ns;
    let permanent_line = |text: String| {
        text.lines()
            .find(|l| l.to_lowercase().contains("permanent"))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no permanent entry in:\n{text}"))
    };
    let fdb_line = permanent_line(fdb(ns, "cni-vx4"));
    let neigh_line = permanent_line(neighbours(ns, "cni-vx4"));
    let words: Vec<&str> = fdb_line.split_whitespace().collect();
    let dst = words
        .iter()
        .position(|w| *w == "dst")
        .and_then(|i| words.get(i + 1))
        .unwrap_or_else(|| panic!("no dst in {fdb_line:?}"));
    let neigh_ip = neigh_line.split_whitespace().next().unwrap_or_default();
    cluster.hosts[0].wait_until_quiet(Duration::from_secs(1));
    let t = Instant::now();
    ns.exec_ok(&[
        "bridge", "fdb", "del", words[0], "dev", "cni-vx4", "dst", dst,
    ]);
    ns.exec_ok(&["ip", "neigh", "del", neigh_ip, "dev", "cni-vx4"]);
    wait(
        Duration::from_secs(10),
        "the entries deleted by hand",
        || {
            fdb(ns, "cni-vx4").contains(&fdb_line)
                && neighbours(ns, "cni-vx4").contains(&neigh_line)
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: fdb {}\nneighbours {}\n{}",
            fdb(ns, "cni-vx4"),
            neighbours(ns, "cni-vx4"),
            cluster.hosts[0].agent_log()
        )
    });
    eprintln!(
        "FDB and neighbour entries deleted by hand on {n1}: back after {:?}",
        t.elapsed()
    );
    record_duration(
        "neighbour notification: VXLAN FDB and neighbour entries deleted by hand, back",
        t.elapsed(),
    );

    // Node 3's InternalIP changes: the tunnel entries follow.
    let new_v4 = "198.19.0.33";
    address(&cluster.host(3).ns, new_v4, "24");
    places.insert(
        3,
        Place {
            v4: new_v4.to_owned(),
            ..on_b(3)
        },
    );
    let t = Instant::now();
    cluster.api.apply_node(node_at(3, &places[&3]));
    wait(
        Duration::from_secs(5),
        "node 1's FDB entry to the new address",
        || {
            let entries = fdb(&cluster.hosts[0].ns, "cni-vx4");
            entries.contains(&format!("dst {new_v4} self permanent"))
                && !entries.contains(&format!("dst {} ", b_v4(3)))
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {}", fdb(&cluster.hosts[0].ns, "cni-vx4")));
    eprintln!(
        "InternalIP change: node 1's FDB entry moved after {:?}",
        t.elapsed()
    );
    cluster.check_pod_to_pod();

    // Node 4 moves to segment A: direct to nodes 1 and 2, encapsulated to node 3; and
    // back (IPv6 routes switch to the tunnel in place only with a host route around the
    // replacement).
    for to in [on_a(4), on_b(4)] {
        let segment = to.segment;
        let t = Instant::now();
        move_node(&mut cluster, &mut places, 4, to);
        let took = cluster.wait_for_routes(Duration::from_secs(5), expected(&places));
        eprintln!(
            "node 4 moved to segment {segment}: every node switched between direct and tunnel \
             after {:?} (routes {took:?} after the last node agreed)",
            t.elapsed()
        );
        cluster.check_pod_to_pod();
    }

    // Nodes 3 and 4 are deleted: nothing of them stays; nodes 1 and 2 need no overlay
    // any more.
    let t = Instant::now();
    cluster.api.delete_node(&node_name(3));
    cluster.api.delete_node(&node_name(4));
    places.remove(&3);
    places.remove(&4);
    let mac3 = "0a:58:c6:13:00:21";
    for n in [1, 2] {
        let host = cluster.host(n);
        wait(Duration::from_secs(10), "node 3 gone", || {
            let routes = host.our_routes();
            !routes
                .iter()
                .any(|r| r.starts_with("10.244.3.") || r.starts_with("fd00:244:0:3:"))
                && !fdb(&host.ns, "cni-vx4").contains(mac3)
                && !neighbours(&host.ns, "cni-vx4").contains("10.244.3.0")
                && !neighbours(&host.ns, "cni-vx6").contains("fd00:244:0:3::")
                && !routes.iter().any(|r| r.starts_with("10.244.4."))
        })
        .unwrap_or_else(|e| panic!("node {n}: {e}: {}", host.agent_log()));
    }
    eprintln!(
        "nodes 3 and 4 deleted: no route, FDB or neighbour entry of node 3 left after {:?}",
        t.elapsed()
    );
    wait(Duration::from_secs(10), "node 1's devices gone", || {
        ifindex(&cluster.hosts[0].ns, "cni-vx4").is_none()
            && ifindex(&cluster.hosts[0].ns, "cni-vx6").is_none()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    wait(Duration::from_secs(10), "the full pod MTU again", || {
        cluster.hosts[0]
            .conflist()
            .is_some_and(|c| c["plugins"][0]["mtu"] == MTU)
    })
    .unwrap_or_else(|e| panic!("{e}"));

    let foreign_after = (
        ifindex(&cluster.hosts[0].ns, "fvx0"),
        fdb(&cluster.hosts[0].ns, "fvx0"),
    );
    assert_eq!(
        foreign_after, foreign_before,
        "the foreign VXLAN device was touched"
    );
    // Every change above went in at the first try: no step failed on nodes 1 and 2
    // (IPv6 direct to tunnel included, which the kernel refuses without the host route).
    for n in [1, 2] {
        let log = cluster.host(n).agent_log();
        assert!(!log.contains("ERROR"), "node {n}:\n{log}");
    }
    eprintln!("whole test: {:?}", started.elapsed());
}

/// Each kind of entry the agent writes into its VXLAN devices (an FDB entry: the peer's
/// VTEP MAC to its underlay address; a permanent neighbour entry: the peer's VTEP address
/// to that MAC), deleted by hand on its own, comes back through the neighbour
/// notification of its deletion: the agent keeps its devices' entries in memory and reads
/// them again only after such a notification or at a resync, and no resync runs here.
#[test]
fn neighbour_notification_a_vxlan_fdb_or_neighbour_entry_deleted_by_hand_is_back() {
    if !require_root() {
        return;
    }
    let (mut cluster, _router, places) = two_segments(&[1], &[3], MTU);
    for (n, place) in &places {
        cluster.api.apply_node(node_at(*n, place));
    }
    let kubeconfig = cluster.kubeconfig.clone();
    for host in &mut cluster.hosts {
        host.resync_secs = WITHOUT_RESYNC;
        host.start_agent(&kubeconfig);
    }
    cluster.wait_for_routes(Duration::from_secs(20), expected(&places));
    let host = &cluster.hosts[0];
    for (dev, kind) in [
        ("cni-vx4", "FDB"),
        ("cni-vx4", "neighbour"),
        ("cni-vx6", "FDB"),
        ("cni-vx6", "neighbour"),
    ] {
        let entries = || {
            if kind == "FDB" {
                fdb(&host.ns, dev)
            } else {
                neighbours(&host.ns, dev)
            }
        };
        let permanent = || {
            entries()
                .lines()
                .find(|l| l.to_lowercase().contains("permanent"))
                .map(str::to_owned)
        };
        wait(Duration::from_secs(10), "the entry written", || {
            permanent().is_some()
        })
        .unwrap_or_else(|e| panic!("{dev} {kind}: {e}:\n{}", entries()));
        let line = permanent().unwrap_or_default();
        let words: Vec<&str> = line.split_whitespace().collect();
        host.wait_until_quiet(Duration::from_secs(1));
        let t = Instant::now();
        if kind == "FDB" {
            let dst = words
                .iter()
                .position(|w| *w == "dst")
                .and_then(|i| words.get(i + 1))
                .unwrap_or_else(|| panic!("no dst in {line:?}"));
            host.ns
                .exec_ok(&["bridge", "fdb", "del", words[0], "dev", dev, "dst", dst]);
        } else {
            host.ns
                .exec_ok(&["ip", "neigh", "del", words[0], "dev", dev]);
        }
        wait(Duration::from_secs(10), "the entry deleted by hand", || {
            entries().contains(&line)
        })
        .unwrap_or_else(|e| {
            panic!(
                "{dev} {kind} entry {line:?}: {e} (--resync-interval 3600: only the \
                 neighbour notification can act); now:\n{}\nagent log:\n{}",
                entries(),
                host.agent_log()
            )
        });
        eprintln!(
            "{dev} {kind} entry deleted by hand: back after {:?}",
            t.elapsed()
        );
        record_duration(
            &format!("neighbour notification: a {kind} entry of {dev} deleted by hand, back"),
            t.elapsed(),
        );
    }
}

/// Moves node `n` to the segment of `to`. Its Node object changes first (its agent
/// sees it); then its port moves to the other bridge and its addresses and routes are
/// swapped. Its agent's API connections left from the address that goes away: the
/// agent ends them when the address is removed and makes them again from the new one,
/// so it keeps following the API (the next move needs that) without a restart.
fn move_node(cluster: &mut Cluster, places: &mut BTreeMap<u8, Place>, n: u8, to: Place) {
    let from = places.get(&n).cloned().unwrap_or_else(|| on_a(n));
    let seen = |log: &str| log.matches(&format!("local {}, MTU", to.v4)).count();
    let before = seen(&cluster.host(n).agent_log());
    places.insert(n, to.clone());
    cluster.api.apply_node(node_at(n, &to));
    let host = cluster.host(n);
    wait(
        Duration::from_secs(5),
        "the agent sees its new address",
        || seen(&host.agent_log()) > before,
    )
    .unwrap_or_else(|e| panic!("{e}: {}", host.agent_log()));
    let (bridge, gw4, gw6) = if to.segment == 'A' {
        ("ulbr", "198.18.0.1", "fd00:18::1")
    } else {
        ("ulbr2", ROUTER_B_V4, ROUTER_B_V6)
    };
    let port = format!("node{n}");
    cluster
        .underlay
        .exec_ok(&["ip", "link", "set", &port, "nomaster"]);
    cluster
        .underlay
        .exec_ok(&["ip", "link", "set", &port, "master", bridge]);
    let ns = &cluster.host(n).ns;
    if from.segment == 'A' {
        ns.exec(&["ip", "route", "del", "198.19.0.0/24"]);
        ns.exec(&["ip", "-6", "route", "del", "fd00:19::/64"]);
    }
    let (v4, v6) = (format!("{}/24", from.v4), format!("{}/64", from.v6));
    ns.exec_ok(&["ip", "addr", "del", &v4, "dev", "ul0"]);
    ns.exec_ok(&["ip", "addr", "del", &v6, "dev", "ul0"]);
    address(ns, &to.v4, "24");
    address(ns, &to.v6, "64");
    ns.exec_ok(&["ip", "route", "replace", "default", "via", gw4]);
    ns.exec_ok(&["ip", "-6", "route", "replace", "default", "via", gw6]);
    if to.segment == 'A' {
        segment_a_routes(ns);
    }
}

/// `count` one-byte requests, each answered with one byte, from `from` to `to`: the
/// round trips' p50, p99 and max in microseconds.
fn request_response(from: &Netns, to: &Netns, ip: IpAddr, count: usize) -> (f64, f64, f64) {
    let (mut client, mut server) = tcp_pair(from.path(), to.path(), ip);
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        while server.read_exact(&mut byte).is_ok() {
            if server.write_all(&byte).is_err() {
                break;
            }
        }
    });
    let mut rtts = Vec::with_capacity(count);
    let mut byte = [1u8; 1];
    for _ in 0..count {
        let t = Instant::now();
        client
            .write_all(&byte)
            .unwrap_or_else(|e| panic!("request: {e}"));
        client
            .read_exact(&mut byte)
            .unwrap_or_else(|e| panic!("response: {e}"));
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(client);
    let _ = echo.join();
    rtts.sort_by(f64::total_cmp);
    let at = |p: usize| rtts[(rtts.len() * p / 100).min(rtts.len() - 1)];
    (at(50), at(99), rtts[rtts.len() - 1])
}

/// The traffic benchmark (`tests/bench/overlay-traffic.sh` runs it): pod to pod TCP
/// throughput (one stream) and request/response latency, from a pod on node 1 to a
/// pod on node 2 (same segment: direct) and to a pod on node 3 (behind the router:
/// VXLAN), both families, in one run. Ignored in the suite: it measures, it checks
/// nothing the test above does not.
#[test]
#[ignore = "a benchmark: tests/bench/overlay-traffic.sh"]
fn traffic_direct_and_encapsulated() {
    if !require_root() {
        return;
    }
    let secs: u64 = std::env::var("OVERLAY_TRAFFIC_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let (mut cluster, _router, places) = two_segments(&[1, 2], &[3], MTU);
    for (n, place) in &places {
        cluster.api.apply_node(node_at(*n, place));
    }
    let kubeconfig = cluster.kubeconfig.clone();
    for host in &mut cluster.hosts {
        host.start_agent(&kubeconfig);
    }
    cluster.wait_for_conflists();
    cluster.wait_for_routes(Duration::from_secs(10), expected(&places));
    for host in &cluster.hosts {
        wait(Duration::from_secs(5), "the lowered pod MTU", || {
            host.conflist()
                .is_some_and(|c| c["plugins"][0]["mtu"] == MTU - 70)
        })
        .unwrap_or_else(|e| panic!("node {}: {e}", host.n));
    }
    for n in 1..=3 {
        cluster.host(n).add_pod();
    }
    cluster.check_pod_to_pod();
    let from = &cluster.hosts[0].pods[0];
    for (path, to) in [
        ("direct", &cluster.hosts[1].pods[0]),
        ("vxlan", &cluster.hosts[2].pods[0]),
    ] {
        for (family, ip) in [("ipv4", to.v4), ("ipv6", to.v6)] {
            let gbps = tcp_throughput(from.ns.path(), to.ns.path(), ip, secs) / 1e9;
            let (p50, p99, max) = request_response(&from.ns, &to.ns, ip, 5_000);
            println!(
                "overlay-traffic path={path} family={family} pod_mtu={} tcp_gbit_s={gbps:.2} \
                 rr_p50_us={p50:.1} rr_p99_us={p99:.1} rr_max_us={max:.1}",
                MTU - 70
            );
        }
    }
}
