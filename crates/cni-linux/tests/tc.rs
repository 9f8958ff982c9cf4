//! Root tests of the traffic control client: what it installs, read back by `tc`
//! and compared with the same made by `tc` itself, each in a private netns.

mod common;

use std::process::Command;

use cni_linux::netlink::tc::{
    ACT_STOLEN, EGRESS_REDIRECT, ETH_P_ALL, HANDLE_INGRESS, HANDLE_ROOT, INGRESS_QDISC, Tbf,
};
use cni_linux::{Netlink, VethPair};
use common::{in_private_netns, index_of};
use serde_json::Value;

/// `tc -j <args>` in the calling thread's netns, parsed.
fn tc_json(args: &[&str]) -> Value {
    let out = Command::new("tc")
        .arg("-j")
        .args(args)
        .output()
        .expect("run tc");
    assert!(
        out.status.success(),
        "tc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("tc -j output is JSON")
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().expect("run");
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A veth pair `name`/`name-p`, both up; returns the index of `name`.
fn veth(nl: &Netlink, name: &str) -> u32 {
    let peer = format!("{name}-p");
    nl.create_veth(&VethPair {
        name,
        mtu: None,
        controller: None,
        peer_name: &peer,
        peer_netns: None,
        peer_mac: None,
        peer_mtu: None,
    })
    .unwrap();
    let index = index_of(nl, name);
    nl.set_up(index).unwrap();
    nl.set_up(index_of(nl, &peer)).unwrap();
    index
}

/// What `tc -j` says about one link, without what names the link or counts
/// references and action instances (which differ between two identical setups).
fn normalized(mut v: Value, ifb: &str) -> String {
    fn walk(v: &mut Value, ifb: &str) {
        match v {
            Value::Object(map) => {
                for key in ["dev", "index", "ref", "bind", "refcnt"] {
                    map.remove(key);
                }
                if map.get("to_dev").and_then(Value::as_str) == Some(ifb) {
                    map.insert("to_dev".into(), "IFB".into());
                }
                if let Some(Value::Array(actions)) = map.get_mut("actions") {
                    actions.truncate(1);
                }
                map.values_mut().for_each(|c| walk(c, ifb));
            }
            Value::Array(items) => items.iter_mut().for_each(|c| walk(c, ifb)),
            _ => {}
        }
    }
    walk(&mut v, ifb);
    v.to_string()
}

#[test]
fn tbf_ingress_and_redirect_look_to_tc_as_the_same_made_with_tc() {
    in_private_netns(
        "tbf_ingress_and_redirect_look_to_tc_as_the_same_made_with_tc",
        |nl| {
            // Ours: 8 Mbit/s, a 10000-byte bucket, the reference's 25 ms limit.
            let ours = veth(&nl, "ours");
            nl.create_ifb("ifb-ours", 1400).unwrap();
            let ifb = nl.require_link("ifb-ours").unwrap();
            assert_eq!(
                (ifb.kind.as_deref(), ifb.mtu, ifb.up),
                (Some("ifb"), 1400, true)
            );
            let tbf = Tbf {
                rate: 1_000_000,
                limit: 35_000,
                buffer: 156_250,
                burst: None,
                rate_table: None,
            };
            nl.add_tbf(ours, &tbf).unwrap();
            nl.add_ingress_qdisc(ours).unwrap();
            nl.add_redirect_filter(ours, ifb.index).unwrap();
            nl.add_tbf(ifb.index, &tbf).unwrap();

            // The same with tc.
            let theirs = veth(&nl, "theirs");
            run(
                "ip",
                &[
                    "link",
                    "add",
                    "ifb-theirs",
                    "mtu",
                    "1400",
                    "txqueuelen",
                    "0",
                    "type",
                    "ifb",
                ],
            );
            run("ip", &["link", "set", "ifb-theirs", "up"]);
            let tbf_args = [
                "root",
                "handle",
                "1:",
                "tbf",
                "rate",
                "1000000bps",
                "burst",
                "10000",
                "limit",
                "35000",
            ];
            run(
                "tc",
                &[&["qdisc", "add", "dev", "theirs"][..], &tbf_args].concat(),
            );
            run(
                "tc",
                &[&["qdisc", "add", "dev", "ifb-theirs"][..], &tbf_args].concat(),
            );
            run(
                "tc",
                &[
                    "qdisc", "add", "dev", "theirs", "handle", "ffff:", "ingress",
                ],
            );
            run(
                "tc",
                &[
                    "filter",
                    "add",
                    "dev",
                    "theirs",
                    "parent",
                    "ffff:",
                    "protocol",
                    "all",
                    "prio",
                    "1",
                    "u32",
                    "match",
                    "u32",
                    "0",
                    "0",
                    "flowid",
                    "1:1",
                    "action",
                    "mirred",
                    "egress",
                    "redirect",
                    "dev",
                    "ifb-theirs",
                ],
            );
            // The reference's second action (a redirect whose verdict is "pass", never
            // reached after the first one's "stolen") cannot be written with tc, whose
            // redirect is always "stolen": it is compared on its own below.
            let filters = tc_json(&["filter", "show", "ingress", "dev", "ours"]);
            let node = filters
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["options"]["actions"].is_array())
                .unwrap();
            let second = &node["options"]["actions"][1];
            assert_eq!(second["mirred_action"], "redirect");
            assert_eq!(second["direction"], "egress");
            assert_eq!(second["to_dev"], "ifb-ours");
            assert_eq!(second["control_action"]["type"], "pass");

            for (what, args) in [
                ("qdiscs", vec!["qdisc", "show", "dev"]),
                ("filters", vec!["filter", "show", "ingress", "dev"]),
            ] {
                let mine = normalized(tc_json(&[&args[..], &["ours"]].concat()), "ifb-ours");
                let tcs = normalized(tc_json(&[&args[..], &["theirs"]].concat()), "ifb-theirs");
                assert_eq!(mine, tcs, "{what}");
            }
            let ifb_q = |dev: &str| normalized(tc_json(&["qdisc", "show", "dev", dev]), "");
            assert_eq!(ifb_q("ifb-ours"), ifb_q("ifb-theirs"));
            assert!(ifb_q("ifb-ours").contains(r#""rate":1000000,"burst":10000,"lat":25000"#));
            let links = |dev: &str| {
                let out = Command::new("ip")
                    .args(["-j", "-d", "link", "show", dev])
                    .output()
                    .unwrap();
                let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                (
                    v[0]["mtu"].clone(),
                    v[0]["txqlen"].clone(),
                    v[0]["linkinfo"]["info_kind"].clone(),
                )
            };
            assert_eq!(links("ifb-ours"), links("ifb-theirs"));

            // Our dumps read both the same way.
            let theirs_ifb = index_of(&nl, "ifb-theirs");
            for (link, target) in [(ours, ifb.index), (theirs, theirs_ifb)] {
                let qdiscs = nl.qdiscs(link).unwrap();
                let root = qdiscs.iter().find(|q| q.parent == HANDLE_ROOT).unwrap();
                assert_eq!(root.kind, "tbf");
                let read = root.tbf.as_ref().unwrap();
                assert_eq!(
                    (read.rate, read.limit, read.buffer),
                    (1_000_000, 35_000, 156_250)
                );
                assert!(qdiscs.iter().any(|q| q.parent == HANDLE_INGRESS
                    && q.handle == INGRESS_QDISC
                    && q.kind == "ingress"));
                let filters = nl.filters(link, INGRESS_QDISC).unwrap();
                let node = filters.iter().find(|f| f.redirects_all_to(target)).unwrap();
                assert_eq!((node.priority, node.protocol), (1, ETH_P_ALL));
                assert_eq!(node.class_id, Some(0x10001));
                assert_eq!(node.mirred[0].direction, EGRESS_REDIRECT);
                assert_eq!(node.mirred[0].verdict, ACT_STOLEN);
            }
            let filters = nl.filters(ours, INGRESS_QDISC).unwrap();
            let node = filters
                .iter()
                .find(|f| f.redirects_all_to(ifb.index))
                .unwrap();
            assert_eq!(
                node.mirred.len(),
                2,
                "ours has the reference's second action"
            );
            assert!(
                nl.filters(ours, INGRESS_QDISC)
                    .unwrap()
                    .iter()
                    .all(|f| !f.redirects_all_to(theirs_ifb))
            );

            // One dump of every link's qdiscs holds what the per-link dumps hold.
            let all = nl.all_qdiscs().unwrap();
            for link in [ours, theirs, ifb.index, theirs_ifb] {
                let per_link = nl.qdiscs(link).unwrap();
                assert!(!per_link.is_empty());
                let from_all: Vec<_> = all.iter().filter(|q| q.link == link).cloned().collect();
                assert_eq!(from_all, per_link, "link #{link}");
            }

            // Deleting reads back as gone.
            nl.delete_qdisc(ours, HANDLE_INGRESS).unwrap();
            assert!(
                nl.filters(ours, INGRESS_QDISC).is_err()
                    || nl.filters(ours, INGRESS_QDISC).unwrap().is_empty()
            );
            nl.delete_qdisc(ours, HANDLE_ROOT).unwrap();
            assert!(
                nl.qdiscs(ours)
                    .unwrap()
                    .iter()
                    .all(|q| q.kind != "tbf" && q.kind != "ingress")
            );
            assert!(nl.delete_link_by_name("ifb-ours").unwrap());
            assert!(!nl.delete_link_by_name("ifb-ours").unwrap());
        },
    );
}

#[test]
fn a_rate_above_four_gigabytes_a_second_reads_back_whole() {
    in_private_netns(
        "a_rate_above_four_gigabytes_a_second_reads_back_whole",
        |nl| {
            let link = veth(&nl, "fast");
            let tbf = Tbf {
                rate: 5_000_000_000,
                limit: 125_000_000 + 100_000,
                buffer: 312,
                burst: None,
                rate_table: None,
            };
            nl.add_tbf(link, &tbf).unwrap();
            let read = nl
                .qdiscs(link)
                .unwrap()
                .into_iter()
                .find_map(|q| q.tbf)
                .unwrap();
            assert_eq!(
                (read.rate, read.limit, read.buffer),
                (5_000_000_000, 125_100_000, 312)
            );
            let shown = tc_json(&["qdisc", "show", "dev", "fast"]);
            assert_eq!(shown[0]["options"]["rate"], 5_000_000_000u64);
            // A second root token bucket is refused, not stacked.
            assert!(nl.add_tbf(link, &tbf).unwrap_err().is_exists());
        },
    );
}
