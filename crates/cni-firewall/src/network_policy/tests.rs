use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn allow(first: &str, last: &str, protocols: (u8, u8), ports: (u16, u16)) -> Allow {
    Allow {
        first: ip(first),
        last: ip(last),
        protocols,
        ports,
    }
}

fn profile(boxes: &[Allow]) -> Profile {
    Profile {
        allow: boxes.to_vec(),
        ..Profile::default()
    }
}

fn peer(set: &str, protocols: (u8, u8), ports: (u16, u16)) -> PeerRule {
    PeerRule {
        set: set.into(),
        protocols,
        ports,
    }
}

/// [`state`] with a shared peer set that the ingress profile allows on TCP 8080
/// and everything.
fn state_with_peers() -> PolicyState {
    let mut s = state();
    s.peer_sets.insert(
        "pp01".into(),
        [ip("10.9.0.1"), ip("10.9.0.2"), ip("fd09::1")].into(),
    );
    s.peer_sets.insert("pp02".into(), [ip("10.9.1.1")].into());
    let p = s.ingress_profiles.get_mut("aa11").unwrap();
    p.peers = vec![
        peer("pp01", (6, 6), (8080, 8080)),
        peer("pp02", (0, 255), (0, 65535)),
    ];
    s
}

/// Two pods, one ingress and one egress profile.
fn state() -> PolicyState {
    let mut s = PolicyState::default();
    s.ingress_profiles.insert(
        "aa11".into(),
        profile(&[
            allow("10.1.0.0", "10.1.0.255", (6, 6), (80, 81)),
            allow("10.2.0.7", "10.2.0.7", (0, 255), (0, 65535)),
            allow("fd00::", "fd00::ffff", (17, 17), (53, 53)),
        ]),
    );
    s.egress_profiles.insert(
        "bb22".into(),
        profile(&[allow("10.0.0.0", "10.255.255.255", (6, 6), (443, 443))]),
    );
    s.ingress.insert(ip("10.1.0.2"), "aa11".into());
    s.ingress.insert(ip("fd00::2"), "aa11".into());
    s.egress.insert(ip("10.1.0.2"), "bb22".into());
    s
}

fn describe(b: &Batch) -> Vec<String> {
    b.describe().into_iter().map(str::to_owned).collect()
}

#[test]
fn boxes_print_as_nft_elements() {
    assert_eq!(
        allow("10.1.0.0", "10.1.0.255", (6, 6), (80, 81)).to_string(),
        "10.1.0.0-10.1.0.255 . 6 . 80-81"
    );
    assert_eq!(
        Allow::all_traffic(ip("fd00::1"), ip("fd00::1")).to_string(),
        "fd00::1 . 0-255 . 0-65535"
    );
}

#[test]
fn box_keys_round_trip_in_nft_layout() {
    let a = allow("10.0.0.0", "10.0.0.255", (6, 6), (80, 81));
    let e = box_element(&a);
    // As nft sends `10.0.0.0-10.0.0.255 . 6 . 80-81`.
    assert_eq!(e.key, [10, 0, 0, 0, 6, 0, 0, 0, 0, 80, 0, 0]);
    assert_eq!(
        e.key_end.as_deref(),
        Some(&[10, 0, 0, 255, 6, 0, 0, 0, 0, 81, 0, 0][..])
    );
    assert_eq!(decode_box(&e, Family::V4), Some(a.clone()));
    assert_eq!(decode_box(&e, Family::V6), None);
    let b = allow("fd00::", "fd00::ff", (0, 255), (0, 65535));
    let e = box_element(&b);
    assert_eq!(e.key.len(), 24);
    assert_eq!(decode_box(&e, Family::V6), Some(b));
    let single = Element {
        key_end: None,
        ..box_element(&a)
    };
    assert_eq!(
        decode_box(&single, Family::V4),
        Some(allow("10.0.0.0", "10.0.0.0", (6, 6), (80, 80)))
    );
}

#[test]
fn overlapping_boxes_are_refused_naming_both() {
    let mut s = state();
    s.ingress_profiles
        .get_mut("aa11")
        .unwrap()
        .allow
        .push(allow("10.1.0.200", "10.1.1.5", (0, 255), (81, 90)));
    let e = normalize(&s).unwrap_err().to_string();
    assert_eq!(
        e,
        "invalid network policy state: ingress profile \"aa11\": boxes 10.1.0.0-10.1.0.255 . 6 . 80-81 and 10.1.0.200-10.1.1.5 . 0-255 . 81-90 overlap"
    );
    // Adjacent, or apart in one field only, is no overlap.
    let mut s = state();
    s.ingress_profiles.get_mut("aa11").unwrap().allow.extend([
        allow("10.1.0.0", "10.1.0.255", (6, 6), (82, 90)),
        allow("10.1.0.0", "10.1.0.255", (17, 17), (80, 81)),
        allow("10.1.1.0", "10.1.1.0", (6, 6), (80, 81)),
        allow("fd00::1:0", "fd00::1:0", (17, 17), (53, 53)),
    ]);
    normalize(&s).unwrap();
    // The same box twice overlaps itself.
    let mut s = state();
    let dup = s.egress_profiles["bb22"].allow[0].clone();
    s.egress_profiles.get_mut("bb22").unwrap().allow.push(dup);
    assert!(normalize(&s).unwrap_err().to_string().contains("overlap"));
}

/// A change to a valid state.
type Edit = fn(&mut PolicyState);

#[test]
fn bad_boxes_names_and_references_are_refused() {
    let cases: Vec<(Edit, &str)> = vec![
        (
            |s| {
                s.ingress_profiles
                    .get_mut("aa11")
                    .unwrap()
                    .allow
                    .push(allow("10.9.0.0", "fd00::9", (6, 6), (1, 1)))
            },
            "box 10.9.0.0-fd00::9 . 6 . 1 mixes IPv4 and IPv6",
        ),
        (
            |s| {
                s.ingress_profiles
                    .get_mut("aa11")
                    .unwrap()
                    .allow
                    .push(allow("10.9.0.9", "10.9.0.1", (6, 6), (1, 1)))
            },
            "ends before it starts (addresses)",
        ),
        (
            |s| {
                s.ingress_profiles
                    .get_mut("aa11")
                    .unwrap()
                    .allow
                    .push(allow("10.9.0.1", "10.9.0.1", (6, 6), (9, 1)))
            },
            "ends before it starts (ports)",
        ),
        (
            |s| {
                s.egress_profiles
                    .insert("Bad-Name".into(), Profile::default());
            },
            "egress profile \"Bad-Name\": a profile name is 1 to 32 characters of [a-z0-9]",
        ),
        (
            |s| {
                s.egress_profiles.insert("a".repeat(33), Profile::default());
            },
            "a profile name is 1 to 32 characters",
        ),
        (
            |s| {
                s.egress_profiles.insert(String::new(), Profile::default());
            },
            "a profile name is 1 to 32 characters",
        ),
        (
            |s| {
                s.egress.insert(ip("10.1.0.9"), "aa11".into());
            },
            "egress of pod 10.1.0.9: its profile \"aa11\" does not exist",
        ),
    ];
    for (change, words) in cases {
        let mut s = state();
        change(&mut s);
        let e = normalize(&s).unwrap_err();
        assert!(matches!(e, Error::InvalidPolicy { .. }), "{e:?}");
        assert!(e.to_string().contains(words), "{e} lacks {words:?}");
    }
    assert!(valid_name(&"0".repeat(32)));
}

#[test]
fn the_same_state_sends_nothing() {
    let held = normalize(&state()).unwrap();
    assert!(diff(&held, &state(), &[]).unwrap().is_none());
    // Box order does not matter.
    let mut s = state();
    s.ingress_profiles.get_mut("aa11").unwrap().allow.reverse();
    assert!(diff(&held, &s, &[]).unwrap().is_none());
}

/// From any of these states to any other, the diff's edits turn the held state
/// into the wanted one (and no diff means they are the same).
#[test]
fn edits_make_the_held_state_the_wanted_one() {
    let mut states = vec![PolicyState::default(), state(), state_with_peers()];
    let mut p = state_with_peers();
    p.peer_sets.get_mut("pp01").unwrap().insert(ip("10.9.0.7"));
    p.ingress_profiles.get_mut("aa11").unwrap().peers.pop();
    p.peer_sets.remove("pp02");
    states.push(p);
    let mut s = state();
    s.ingress.insert(ip("fd00::9"), "aa11".into());
    s.egress.remove(&ip("10.1.0.2"));
    states.push(s.clone());
    s.ingress_profiles.insert("cc33".into(), profile(&[]));
    s.ingress.insert(ip("10.1.0.2"), "cc33".into());
    states.push(s.clone());
    s.ingress_profiles.remove("aa11");
    s.ingress.retain(|_, p| p != "aa11");
    s.egress_profiles.get_mut("bb22").unwrap().allow[0].ports = (1, 2);
    states.push(s);
    for from in &states {
        for to in &states {
            let mut have = normalize(from).unwrap();
            match diff(&have, to, &[]).unwrap() {
                None => assert_eq!(have, normalize(to).unwrap()),
                Some((_, _, edits)) => {
                    edits.apply(&mut have);
                    assert_eq!(have, normalize(to).unwrap());
                }
            }
        }
    }
}

#[test]
fn pods_may_only_name_profiles_that_stay() {
    let have = normalize(&state()).unwrap();
    // Left as it was, but its profile goes.
    let mut s = state();
    s.egress_profiles.clear();
    let e = diff(&have, &s, &[]).unwrap_err().to_string();
    assert!(
        e.contains("egress of pod 10.1.0.2: its profile \"bb22\" does not exist"),
        "{e}"
    );
    // Moved to a profile that does not exist.
    let mut s = state();
    s.ingress.insert(ip("fd00::2"), "zz99".into());
    let e = diff(&have, &s, &[]).unwrap_err().to_string();
    assert!(
        e.contains("ingress of pod fd00::2: its profile \"zz99\" does not exist"),
        "{e}"
    );
}

#[test]
fn a_new_pod_is_one_small_transaction_with_its_resolution_in_it() {
    let have = normalize(&state()).unwrap();
    let mut s = state();
    s.ingress.insert(ip("10.1.0.3"), "aa11".into());
    let (b, c, _) = diff(&have, &s, &[ip("10.1.0.3")]).unwrap().unwrap();
    assert_eq!(
        describe(&b),
        [
            "add element inet cni_node_policy ingress4 (1 element)",
            "add element inet cni_node_policy pending4 (1 element)",
            "delete element inet cni_node_policy pending4 (1 element)",
        ]
    );
    assert_eq!(
        c,
        Changes {
            pods_added: 1,
            pending_resolved: 1,
            messages: 3,
            bytes: c.bytes,
            ..Changes::default()
        }
    );
}

#[test]
fn new_profiles_come_before_their_pods_removed_ones_after() {
    let have = normalize(&state()).unwrap();
    let mut s = state();
    s.ingress_profiles.remove("aa11");
    s.ingress_profiles.insert(
        "cc33".into(),
        profile(&[allow("10.3.0.0", "10.3.0.255", (6, 6), (22, 22))]),
    );
    s.ingress.insert(ip("10.1.0.2"), "cc33".into());
    s.ingress.insert(ip("fd00::2"), "cc33".into());
    let (b, c, _) = diff(&have, &s, &[]).unwrap().unwrap();
    let t = "inet cni_node_policy";
    assert_eq!(
        describe(&b),
        [
            format!("add set {t} ingress-cc33-v4"),
            format!("add element {t} ingress-cc33-v4 (1 element)"),
            format!("add set {t} ingress-cc33-v6"),
            format!("add chain {t} ingress-cc33"),
            format!("add rule {t} ingress-cc33"),
            format!("add rule {t} ingress-cc33"),
            format!("add rule {t} ingress-cc33"),
            format!("delete element {t} ingress4 (1 element)"),
            format!("add element {t} ingress4 (1 element)"),
            format!("delete element {t} ingress6 (1 element)"),
            format!("add element {t} ingress6 (1 element)"),
            format!("delete chain {t} ingress-aa11"),
            format!("delete set {t} ingress-aa11-v4"),
            format!("delete set {t} ingress-aa11-v6"),
        ]
    );
    assert_eq!(
        (
            c.profiles_added,
            c.profiles_removed,
            c.pods_added,
            c.pods_removed
        ),
        (1, 1, 2, 2)
    );
}

#[test]
fn boxes_compare_in_any_order() {
    let boxes = state().ingress_profiles["aa11"].allow.clone();
    let held: BTreeSet<Allow> = boxes.iter().cloned().collect();
    let mut reversed = boxes.clone();
    reversed.reverse();
    assert!(is_sorted(&boxes) && !is_sorted(&reversed));
    assert!(same_boxes(&held, &boxes));
    assert!(same_boxes(&held, &reversed));
    let mut other = boxes.clone();
    other[0].ports = (80, 82);
    assert!(!same_boxes(&held, &other));
    assert!(!same_boxes(&held, &boxes[1..]));
    let mut overlapping = boxes.clone();
    overlapping.push(allow("10.1.0.9", "10.1.0.9", (6, 6), (80, 80)));
    let what = || "ingress profile \"aa11\"".to_string();
    assert!(check_boxes(&overlapping, &what).is_err(), "unsorted");
    overlapping.sort();
    assert!(check_boxes(&overlapping, &what).is_err(), "sorted");
}

#[test]
fn a_big_set_that_loses_elements_is_made_anew() {
    let mut s = state();
    let boxes: Vec<Allow> = (0..=REBUILD_ABOVE as u8)
        .map(|i| Allow {
            first: format!("10.7.{i}.0").parse().unwrap(),
            last: format!("10.7.{i}.9").parse().unwrap(),
            protocols: (6, 6),
            ports: (80, 80),
        })
        .collect();
    s.ingress_profiles.get_mut("aa11").unwrap().allow = boxes.clone();
    let have = normalize(&s).unwrap();
    // One more: added as an element.
    let mut more = s.clone();
    let mut bigger = boxes.clone();
    bigger.push(Allow {
        first: "10.8.0.0".parse().unwrap(),
        last: "10.8.0.0".parse().unwrap(),
        protocols: (6, 6),
        ports: (80, 80),
    });
    more.ingress_profiles.get_mut("aa11").unwrap().allow = bigger;
    let (b, _, _) = diff(&have, &more, &[]).unwrap().unwrap();
    assert_eq!(
        describe(&b),
        ["add element inet cni_node_policy ingress-aa11-v4 (1 element)"]
    );
    // One less: the IPv4 set is made anew, the IPv6 set is left alone.
    let mut less = s.clone();
    less.ingress_profiles.get_mut("aa11").unwrap().allow = boxes[1..].to_vec();
    let (b, c, _) = diff(&have, &less, &[]).unwrap().unwrap();
    let kept = REBUILD_ABOVE;
    assert_eq!(
        describe(&b),
        [
            "flush chain inet cni_node_policy ingress-aa11".to_owned(),
            "delete set inet cni_node_policy ingress-aa11-v4".to_owned(),
            "add set inet cni_node_policy ingress-aa11-v4".to_owned(),
            format!("add element inet cni_node_policy ingress-aa11-v4 ({kept} elements)"),
            "add rule inet cni_node_policy ingress-aa11".to_owned(),
            "add rule inet cni_node_policy ingress-aa11".to_owned(),
            "add rule inet cni_node_policy ingress-aa11".to_owned(),
        ]
    );
    assert_eq!(
        (c.profiles_changed, c.boxes_added, c.boxes_removed),
        (1, kept, kept + 1)
    );
}

#[test]
fn changed_boxes_are_changed_in_place() {
    let have = normalize(&state()).unwrap();
    let mut s = state();
    let p = s.ingress_profiles.get_mut("aa11").unwrap();
    p.allow[0].ports = (80, 82);
    let (b, c, _) = diff(&have, &s, &[]).unwrap().unwrap();
    assert_eq!(
        describe(&b),
        [
            "delete element inet cni_node_policy ingress-aa11-v4 (1 element)",
            "add element inet cni_node_policy ingress-aa11-v4 (1 element)",
        ]
    );
    assert_eq!(
        (c.profiles_changed, c.boxes_added, c.boxes_removed),
        (1, 1, 1)
    );
}

#[test]
fn a_fresh_table_has_its_fixed_part_first_and_carries_pending_over() {
    let want = normalize(&state()).unwrap();
    let pending = [(ip("10.1.0.9"), Some("ns/new".to_owned()))].into();
    let (b, c) = fresh(&want, 7, true, &pending).unwrap();
    let ops = describe(&b);
    let t = "inet cni_node_policy";
    let mut fixed = vec![format!("delete table {t}"), format!("add table {t}")];
    for map in ["ingress", "egress"] {
        for family in ["4", "6"] {
            fixed.push(format!("add map {t} {map}{family}"));
        }
    }
    for tier in ["admin", "baseline"] {
        for map in ["ingress", "egress"] {
            for family in ["4", "6"] {
                fixed.push(format!("add map {t} {tier}-{map}{family}"));
            }
        }
    }
    fixed.extend([
        format!("add set {t} pending4"),
        format!("add set {t} pending6"),
        format!("add chain {t} forward"),
        format!("add chain {t} input"),
        format!("add chain {t} baseline-egress"),
        format!("add chain {t} baseline-ingress"),
        format!("add chain {t} np-egress"),
        format!("add chain {t} np-ingress"),
        format!("add chain {t} judge-egress"),
        format!("add chain {t} judge-ingress"),
    ]);
    assert_eq!(ops[..fixed.len()], fixed);
    assert_eq!(
        ops.last().unwrap(),
        &format!("add element {t} pending4 (1 element)")
    );
    assert!(c.created);
    assert_eq!((c.profiles_added, c.pods_added, c.boxes_added), (2, 3, 4));
}

/// An address is released for the pod it was made pending for: not for another
/// pod the agent still believes holds it (an address handed on).
#[test]
fn pending_addresses_are_released_for_their_own_pod() {
    let pending: BTreeMap<IpAddr, Option<String>> = [
        (ip("10.1.0.5"), Some("ns/b".to_owned())),
        (ip("10.1.0.6"), None),
        (ip("10.1.0.7"), Some("ns/c".to_owned())),
        (ip("10.1.0.8"), Some(pod_tag(&"x".repeat(300)))),
    ]
    .into();
    let judged: BTreeMap<IpAddr, String> = [
        (ip("10.1.0.5"), "ns/a".to_owned()),
        (ip("10.1.0.6"), "ns/d".to_owned()),
        (ip("10.1.0.8"), "x".repeat(300)),
    ]
    .into();
    assert_eq!(
        releasable(&pending, &judged),
        [ip("10.1.0.6"), ip("10.1.0.8")]
    );
    let mut judged = judged;
    judged.insert(ip("10.1.0.5"), "ns/b".into());
    assert_eq!(releasable(&pending, &judged).len(), 3);
}

#[test]
fn long_pod_names_are_cut_to_what_a_comment_holds() {
    assert_eq!(pod_tag("ns/pod"), "ns/pod");
    let long = format!("ns/{}", "é".repeat(150));
    let tag = pod_tag(&long);
    assert!(tag.len() < 160 && tag.contains("... sha512:"), "{tag}");
    assert_eq!(tag, pod_tag(&long));
    assert_ne!(tag, pod_tag(&format!("{long}x")));
    let mut b = Batch::new();
    b.add_elements(
        NFPROTO_INET,
        TABLE,
        PENDING4,
        &[pending_element(ip("10.0.0.1"), Some(&long))],
    )
    .unwrap();
}

#[test]
fn base_chains_judge_both_directions_in_forward_and_egress_only_in_input() {
    let forward = base_rules(Base::Forward);
    let input = base_rules(Base::Input);
    assert_eq!(forward.len(), 9);
    assert_eq!(input.len(), 6);
    let jumps = |rules: &[Vec<Expr>]| -> Vec<Expr> {
        rules
            .iter()
            .filter_map(|r| r.last())
            .filter(|e| {
                matches!(
                    e,
                    Expr::Immediate {
                        data: crate::nfnetlink::Data::Verdict {
                            code: VERDICT_JUMP,
                            ..
                        },
                        ..
                    }
                )
            })
            .cloned()
            .collect()
    };
    assert_eq!(
        jumps(&forward),
        [
            verdict(VERDICT_JUMP, Some("judge-egress")),
            verdict(VERDICT_JUMP, Some("judge-ingress"))
        ]
    );
    assert_eq!(jumps(&input), [verdict(VERDICT_JUMP, Some("judge-egress"))]);
    // Each direction: Admin, then NetworkPolicy, then Baseline, by `goto`.
    let vmaps = |fixed: Fixed| -> Vec<String> {
        fixed
            .rules()
            .iter()
            .filter_map(|r| match r.last() {
                Some(Expr::Lookup {
                    dreg: Some(_), set, ..
                }) => Some(set.clone()),
                Some(Expr::Immediate {
                    data:
                        crate::nfnetlink::Data::Verdict {
                            code: VERDICT_GOTO,
                            chain: Some(chain),
                        },
                    ..
                }) => Some(format!("goto {chain}")),
                _ => None,
            })
            .collect()
    };
    let d = Direction::Egress;
    assert_eq!(
        vmaps(Fixed::Judge(d)),
        ["admin-egress4", "admin-egress6", "goto np-egress"]
    );
    assert_eq!(
        vmaps(Fixed::NetworkPolicy(d)),
        ["egress4", "egress6", "goto baseline-egress"]
    );
    assert_eq!(
        vmaps(Fixed::Baseline(Direction::Ingress)),
        ["baseline-ingress4", "baseline-ingress6"]
    );
}

/// Verdict chains count new connections, log only drops and only with the deny log
/// on, and read back as they were written, whatever their counters hold.
#[test]
fn verdict_chains_count_log_and_read_back() {
    let log = DenyLog {
        group: 7,
        per_second: 10,
    };
    for (action, log, rules) in [
        (VerdictAction::Accept, None, 2),
        (VerdictAction::Drop, None, 2),
        (VerdictAction::Drop, Some(log), 3),
        (VerdictAction::ToNetworkPolicy(Direction::Ingress), None, 2),
    ] {
        let mut written = verdict_rules("v-ab12", action, log);
        assert_eq!(written.len(), rules);
        assert!(matches!(written[0].last(), Some(Expr::Counter { .. })));
        for e in written.iter_mut().flatten() {
            if let Expr::Counter { packets, bytes } = e {
                (*packets, *bytes) = (3, 180);
            }
        }
        let refs: Vec<&Vec<Expr>> = written.iter().collect();
        assert_eq!(decode_verdict_rules("v-ab12", &refs), Some((action, log)));
        assert_eq!(
            decode_verdict_rules("v-ab13", &refs).is_some(),
            log.is_none()
        );
        let rules: Vec<crate::nfnetlink::Rule> = written
            .iter()
            .enumerate()
            .map(|(i, exprs)| crate::nfnetlink::Rule {
                chain: "v-ab12".into(),
                handle: i as u64,
                comment: None,
                exprs: exprs.clone(),
            })
            .collect();
        assert_eq!(
            counters::counters_of(&rules),
            [("v-ab12".to_owned(), (3, 180))].into()
        );
    }
}

/// A tier profile: its row (verdict map and chain) after the verdict chains its boxes
/// go to, then its maps of peers and its chain, then the pods; taken out the other way
/// round.
#[test]
fn a_tier_profile_comes_after_its_verdict_chains_and_before_its_pods() {
    let mut s = state();
    s.verdict_chains
        .insert("v-deny".into(), VerdictAction::Drop);
    s.verdict_chains.insert(
        "v-pass".into(),
        VerdictAction::ToNetworkPolicy(Direction::Egress),
    );
    s.admin.egress_rows.insert(
        "r7".into(),
        TierRow {
            boxes: vec![
                TierBox {
                    protocols: (6, 6),
                    ports: (22, 22),
                    chain: "v-deny".into(),
                },
                TierBox {
                    protocols: (6, 6),
                    ports: (80, 80),
                    chain: "v-pass".into(),
                },
            ],
        },
    );
    s.admin.egress_profiles.insert(
        "cc33".into(),
        Arc::new(TierProfile {
            peers: [(ip("10.5.0.9"), "r7".into())].into(),
            ranges: [TierRange {
                first: ip("10.5.0.0"),
                last: ip("10.5.0.255"),
                row: "r7".into(),
            }]
            .into(),
        }),
    );
    s.admin.egress.insert(ip("10.1.0.2"), "cc33".into());
    let have = normalize(&state()).unwrap();
    let (b, c, edits) = diff(&have, &s, &[]).unwrap().unwrap();
    let t = "inet cni_node_policy";
    assert_eq!(
        describe(&b),
        [
            format!("add chain {t} v-deny"),
            format!("add rule {t} v-deny"),
            format!("add rule {t} v-deny"),
            format!("add chain {t} v-pass"),
            format!("add rule {t} v-pass"),
            format!("add rule {t} v-pass"),
            format!("add map {t} admin-egress-row-r7-keys"),
            format!("add element {t} admin-egress-row-r7-keys (2 elements)"),
            format!("add chain {t} admin-egress-row-r7"),
            format!("add rule {t} admin-egress-row-r7"),
            format!("add rule {t} admin-egress-row-r7"),
            format!("add map {t} admin-egress-cc33-peers4"),
            format!("add map {t} admin-egress-cc33-ranges4"),
            format!("add element {t} admin-egress-cc33-peers4 (1 element)"),
            format!("add element {t} admin-egress-cc33-ranges4 (1 element)"),
            format!("add map {t} admin-egress-cc33-peers6"),
            format!("add map {t} admin-egress-cc33-ranges6"),
            format!("add chain {t} admin-egress-cc33"),
            format!("add rule {t} admin-egress-cc33"),
            format!("add rule {t} admin-egress-cc33"),
            format!("add rule {t} admin-egress-cc33"),
            format!("add rule {t} admin-egress-cc33"),
            format!("add rule {t} admin-egress-cc33"),
            format!("add element {t} admin-egress4 (1 element)"),
        ]
    );
    assert_eq!(
        (
            c.verdict_chains_added,
            c.tier_profiles_added,
            c.tier_boxes_added,
            c.tier_pods_added,
            c.tier_rows_added,
            c.tier_peers_added,
        ),
        (2, 1, 2, 1, 1, 2)
    );
    let mut held = have.clone();
    edits.apply(&mut held);
    assert_eq!(held, normalize(&s).unwrap());
    // The deny log on: the drop's chain is written again, nothing else.
    let mut logged = s.clone();
    logged.deny_log = Some(DenyLog {
        group: 1,
        per_second: 5,
    });
    let (b, c, _) = diff(&held, &logged, &[]).unwrap().unwrap();
    assert_eq!(
        describe(&b),
        [
            format!("flush chain {t} v-deny"),
            format!("add rule {t} v-deny"),
            format!("add rule {t} v-deny"),
            format!("add rule {t} v-deny"),
        ]
    );
    assert_eq!(c.verdict_chains_changed, 1);
    // And all of it gone: the pod, the profile, then the chains.
    let (b, _, _) = diff(&held, &state(), &[]).unwrap().unwrap();
    assert_eq!(
        describe(&b),
        [
            format!("delete element {t} admin-egress4 (1 element)"),
            format!("delete chain {t} admin-egress-cc33"),
            format!("delete set {t} admin-egress-cc33-peers4"),
            format!("delete set {t} admin-egress-cc33-ranges4"),
            format!("delete set {t} admin-egress-cc33-peers6"),
            format!("delete set {t} admin-egress-cc33-ranges6"),
            format!("delete chain {t} admin-egress-row-r7"),
            format!("delete set {t} admin-egress-row-r7-keys"),
            format!("delete chain {t} v-deny"),
            format!("delete chain {t} v-pass"),
        ]
    );
}

/// A tier profile's peers that move to another row are each taken out of the profile's
/// map and put back; the row they left is removed once no peer goes to it, after the
/// peers have moved, and the new one added before.
#[test]
fn peers_moving_to_another_row_are_elements_out_and_in() {
    let mut s = state();
    s.verdict_chains
        .insert("v-deny".into(), VerdictAction::Drop);
    s.verdict_chains
        .insert("v-accept".into(), VerdictAction::Accept);
    let row = |chain: &str| TierRow {
        boxes: vec![TierBox {
            protocols: (6, 6),
            ports: (80, 80),
            chain: chain.into(),
        }],
    };
    s.baseline.ingress_rows.insert("r1".into(), row("v-deny"));
    s.baseline.ingress_profiles.insert(
        "p1".into(),
        Arc::new(TierProfile {
            peers: [
                (ip("10.1.0.5"), "r1".into()),
                (ip("10.1.0.6"), "r1".into()),
                (ip("fd00::6"), "r1".into()),
            ]
            .into(),
            ranges: BTreeSet::new(),
        }),
    );
    s.baseline.ingress.insert(ip("10.1.0.2"), "p1".into());
    let held = normalize(&s).unwrap();
    let mut moved = s.clone();
    moved.baseline.ingress_rows.remove("r1");
    moved
        .baseline
        .ingress_rows
        .insert("r2".into(), row("v-accept"));
    let peers = &mut Arc::make_mut(moved.baseline.ingress_profiles.get_mut("p1").unwrap()).peers;
    peers.remove(&ip("fd00::6"));
    for peer in peers.values_mut() {
        *peer = "r2".into();
    }
    let (b, c, edits) = diff(&held, &moved, &[]).unwrap().unwrap();
    let t = "inet cni_node_policy";
    assert_eq!(
        describe(&b),
        [
            format!("add map {t} baseline-ingress-row-r2-keys"),
            format!("add element {t} baseline-ingress-row-r2-keys (1 element)"),
            format!("add chain {t} baseline-ingress-row-r2"),
            format!("add rule {t} baseline-ingress-row-r2"),
            format!("delete element {t} baseline-ingress-p1-peers4 (2 elements)"),
            format!("add element {t} baseline-ingress-p1-peers4 (2 elements)"),
            format!("delete element {t} baseline-ingress-p1-peers6 (1 element)"),
            format!("delete chain {t} baseline-ingress-row-r1"),
            format!("delete set {t} baseline-ingress-row-r1-keys"),
        ]
    );
    assert_eq!(
        (
            c.tier_rows_added,
            c.tier_rows_removed,
            c.tier_profiles_changed,
            c.tier_peers_removed,
            c.tier_peers_added
        ),
        (1, 1, 1, 3, 2)
    );
    let mut after = held.clone();
    edits.apply(&mut after);
    assert_eq!(after, normalize(&moved).unwrap());
    // A row that goes to a verdict chain the tier may not use is refused.
    let mut wrong = moved.clone();
    wrong.verdict_chains.insert(
        "v-pass".into(),
        VerdictAction::ToNetworkPolicy(Direction::Ingress),
    );
    wrong
        .baseline
        .ingress_rows
        .insert("r2".into(), row("v-pass"));
    assert!(normalize(&wrong).is_err());
}

/// What a tier may send where: a Pass of the other direction, or in the Baseline
/// tier, is refused, as is a box going to no chain.
#[test]
fn tier_boxes_go_only_to_chains_their_tier_may_use() {
    let base = || {
        let mut s = PolicyState::default();
        s.verdict_chains.insert(
            "v-pass".into(),
            VerdictAction::ToNetworkPolicy(Direction::Egress),
        );
        s
    };
    let with = |tier: ClusterTier, direction: Direction, chain: &str| {
        let mut s = base();
        let t = match tier {
            ClusterTier::Admin => &mut s.admin,
            ClusterTier::Baseline => &mut s.baseline,
        };
        let rows = match direction {
            Direction::Ingress => &mut t.ingress_rows,
            Direction::Egress => &mut t.egress_rows,
        };
        rows.insert(
            "r1".into(),
            TierRow {
                boxes: vec![TierBox {
                    protocols: (0, 255),
                    ports: (0, 65535),
                    chain: chain.into(),
                }],
            },
        );
        normalize(&s)
    };
    assert!(with(ClusterTier::Admin, Direction::Egress, "v-pass").is_ok());
    for (tier, direction, chain) in [
        (ClusterTier::Admin, Direction::Ingress, "v-pass"),
        (ClusterTier::Baseline, Direction::Egress, "v-pass"),
        (ClusterTier::Admin, Direction::Egress, "v-none"),
    ] {
        let e = with(tier, direction, chain).unwrap_err().to_string();
        assert!(
            e.contains("no verdict chain this tier and direction may use"),
            "{e}"
        );
    }
    let mut s = base();
    s.verdict_chains
        .insert("x-bad".into(), VerdictAction::Accept);
    assert!(
        normalize(&s)
            .unwrap_err()
            .to_string()
            .contains("verdict chain \"x-bad\"")
    );
    let mut s = base();
    s.baseline.ingress.insert(ip("10.0.0.2"), "nope".into());
    let e = normalize(&s).unwrap_err().to_string();
    assert!(e.contains("baseline ingress of pod 10.0.0.2"), "{e}");
    // A profile's peer goes to a row of its own tier and direction.
    let mut s = base();
    s.admin.ingress_profiles.insert(
        "p1".into(),
        Arc::new(TierProfile {
            peers: [(ip("10.0.0.3"), "r1".into())].into(),
            ranges: BTreeSet::new(),
        }),
    );
    let e = normalize(&s).unwrap_err().to_string();
    assert!(
        e.contains("peer 10.0.0.3 goes to row \"r1\", which does not exist"),
        "{e}"
    );
}

#[test]
fn profile_chains_accept_or_return_then_drop() {
    let ingress = profile_rules(Direction::Ingress, "aa11", &[], None);
    let egress = profile_rules(Direction::Egress, "aa11", &[], None);
    assert_eq!(ingress.len(), 3);
    assert_eq!(ingress[0].last(), Some(&verdict(VERDICT_ACCEPT, None)));
    assert_eq!(egress[1].last(), Some(&verdict(VERDICT_RETURN, None)));
    assert_eq!(egress[2], [verdict(VERDICT_DROP, None)]);
    assert_eq!(
        Direction::parse_chain("egress-aa11"),
        Some((Direction::Egress, "aa11"))
    );
    assert_eq!(Direction::parse_chain("egress-"), None);
    assert_eq!(Direction::parse_chain("forward"), None);
}

#[test]
fn peer_rules_read_back_as_they_were_written() {
    let rules = [
        peer("pp01", (6, 6), (8080, 8080)),
        peer("pp01", (6, 17), (8080, 8090)),
        peer("pp01", (0, 255), (53, 53)),
        peer("pp01", (17, 17), (0, 65535)),
        peer("pp01", (0, 255), (0, 65535)),
    ];
    for direction in DIRECTIONS {
        for family in FAMILIES {
            for rule in &rules {
                let allowed = allowed_verdict(direction, None);
                let exprs = peer_rule(direction, family, rule, &allowed);
                assert_eq!(
                    decode_peer_rule(direction, family, &exprs, &allowed).as_ref(),
                    Some(rule)
                );
                let other = match family {
                    Family::V4 => Family::V6,
                    Family::V6 => Family::V4,
                };
                assert_eq!(decode_peer_rule(direction, other, &exprs, &allowed), None);
            }
        }
    }
    // A whole chain: own sets, the peer rules per family, drop.
    let peers = sorted_peers(&rules);
    let chain = profile_rules(Direction::Egress, "aa11", &peers, None);
    assert_eq!(chain.len(), 2 + 2 * peers.len() + 1);
    let refs: Vec<&Vec<Expr>> = chain.iter().collect();
    assert_eq!(
        decode_profile_rules(Direction::Egress, "aa11", &refs),
        Some((peers.clone(), None))
    );
    // With verdict chains: read back with them.
    let verdicts = ProfileVerdicts {
        allow: "v-a1".into(),
        deny: "v-d1".into(),
    };
    let counted = profile_rules(Direction::Ingress, "aa11", &peers, Some(&verdicts));
    let counted_refs: Vec<&Vec<Expr>> = counted.iter().collect();
    assert_eq!(
        decode_profile_rules(Direction::Ingress, "aa11", &counted_refs),
        Some((peers.clone(), Some(verdicts)))
    );
    assert_eq!(
        decode_profile_rules(Direction::Ingress, "aa11", &refs),
        None
    );
    // Out of order, or a rule missing: not ours.
    let mut swapped = refs.clone();
    swapped.swap(2, 4);
    swapped.swap(3, 5);
    assert_eq!(
        decode_profile_rules(Direction::Egress, "aa11", &swapped),
        None
    );
    let mut short = refs.clone();
    short.remove(3);
    assert_eq!(
        decode_profile_rules(Direction::Egress, "aa11", &short),
        None
    );
}

#[test]
fn a_peer_rule_needs_its_set() {
    let mut s = state_with_peers();
    assert!(normalize(&s).is_ok());
    s.peer_sets.remove("pp02");
    let e = normalize(&s).unwrap_err().to_string();
    assert!(e.contains("its peer set \"pp02\" does not exist"), "{e}");
    let mut s = state_with_peers();
    s.peer_sets.insert("Bad".into(), BTreeSet::new());
    let e = normalize(&s).unwrap_err().to_string();
    assert!(e.contains("peer set \"Bad\""), "{e}");
}

#[test]
fn peer_sets_come_before_the_rules_that_use_them_and_go_after() {
    let t = "inet cni_node_policy";
    let have = normalize(&state()).unwrap();
    let (b, c, _) = diff(&have, &state_with_peers(), &[]).unwrap().unwrap();
    let d = describe(&b);
    assert_eq!(
        d[..6],
        [
            format!("add set {t} peer-pp01-v4"),
            format!("add element {t} peer-pp01-v4 (2 elements)"),
            format!("add set {t} peer-pp01-v6"),
            format!("add element {t} peer-pp01-v6 (1 element)"),
            format!("add set {t} peer-pp02-v4"),
            format!("add element {t} peer-pp02-v4 (1 element)"),
        ]
    );
    assert_eq!(d[7], format!("flush chain {t} ingress-aa11"));
    assert_eq!(d.len(), 8 + 2 + 4 + 1, "{d:?}");
    assert_eq!((c.peer_sets_added, c.peer_addresses_added), (2, 4));
    // And back: the chain is written again first, then the sets go.
    let have = normalize(&state_with_peers()).unwrap();
    let (b, c, _) = diff(&have, &state(), &[]).unwrap().unwrap();
    let d = describe(&b);
    assert_eq!(d[0], format!("flush chain {t} ingress-aa11"));
    assert_eq!(
        d[d.len() - 4..],
        [
            format!("delete set {t} peer-pp01-v4"),
            format!("delete set {t} peer-pp01-v6"),
            format!("delete set {t} peer-pp02-v4"),
            format!("delete set {t} peer-pp02-v6"),
        ]
    );
    assert_eq!(c.peer_sets_removed, 2);
}

#[test]
fn a_pod_joining_a_peer_set_is_one_element() {
    let have = normalize(&state_with_peers()).unwrap();
    let mut s = state_with_peers();
    s.peer_sets.get_mut("pp01").unwrap().insert(ip("10.9.0.3"));
    s.peer_sets.get_mut("pp01").unwrap().remove(&ip("fd09::1"));
    let (b, c, _) = diff(&have, &s, &[]).unwrap().unwrap();
    assert_eq!(
        describe(&b),
        [
            "add element inet cni_node_policy peer-pp01-v4 (1 element)",
            "delete element inet cni_node_policy peer-pp01-v6 (1 element)",
        ]
    );
    assert_eq!((c.peer_addresses_added, c.peer_addresses_removed), (1, 1));
    // Peer rules in another order are the same profile.
    let mut s = state_with_peers();
    s.ingress_profiles.get_mut("aa11").unwrap().peers.reverse();
    assert!(diff(&have, &s, &[]).unwrap().is_none());
}
