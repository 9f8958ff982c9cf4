use super::*;

#[test]
fn sockets_are_kept_until_the_last_guard_goes() {
    let kept = || KEPT.lock().map(|k| k.sockets.len()).unwrap_or(usize::MAX);
    let outer = keep_sockets();
    let inner = keep_sockets();
    let nl = Nfnl::open().expect("a NETLINK_NETFILTER socket");
    let before = kept();
    drop(nl);
    // Other tests of this process may park sockets meanwhile: at least ours.
    assert!(kept() > before);
    drop(inner);
    assert!(kept() > before, "another guard is still alive");
    drop(outer);
    assert_eq!(kept(), 0);
}

#[test]
fn udata_comment_round_trips() {
    let u = udata_comment("abc").unwrap();
    assert_eq!(u, vec![0, 4, b'a', b'b', b'c', 0]);
    assert_eq!(parse_udata_comment(&u).as_deref(), Some("abc"));
    // Another TLV first, as a newer nft might add.
    let mut two = vec![1, 2, 9, 9];
    two.extend_from_slice(&u);
    assert_eq!(parse_udata_comment(&two).as_deref(), Some("abc"));
    assert_eq!(parse_udata_comment(&[0, 9, b'x']), None);
    assert_eq!(parse_udata_comment(&[]), None);
    assert!(udata_comment(&"x".repeat(255)).is_err());
}

#[test]
fn batch_frames_messages() {
    let mut b = Batch::new();
    b.add_table(NFPROTO_INET, "t", None).unwrap();
    b.delete_rule(NFPROTO_INET, "t", "c", 7);
    assert_eq!(b.len(), 2);
    let (bytes, ops) = b.finish();
    let msgs: Vec<_> = messages(&bytes).map(|m| m.unwrap()).collect();
    let types: Vec<u16> = msgs.iter().map(|m| m.ty).collect();
    assert_eq!(types, vec![0x10, 0x0a00, 0x0a08, 0x11]);
    // Batch begin: family unspec, res_id nftables in network order.
    assert_eq!(msgs[0].payload, &[0, 0, 0, 10]);
    assert_eq!(msgs[1].flags, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE);
    assert_eq!(
        ops.iter().map(|(_, w)| w.as_str()).collect::<Vec<_>>(),
        vec!["add table inet t", "delete rule inet t c handle 7"]
    );
    let handle = attr(&msgs[2].payload[4..], NFTA_RULE_HANDLE).unwrap();
    assert_eq!(handle, 7u64.to_be_bytes());
}

#[test]
fn expressions_round_trip_through_the_wire_format() {
    let exprs = vec![
        Expr::Meta {
            key: META_NFPROTO,
            dreg: REG_1,
        },
        Expr::Cmp {
            sreg: REG_1,
            op: CMP_EQ,
            data: vec![2],
        },
        Expr::Payload {
            dreg: REG_1,
            base: BASE_NETWORK,
            offset: 16,
            len: 4,
        },
        Expr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            len: 4,
            mask: vec![0xf0, 0, 0, 0],
            xor: vec![0; 4],
        },
        Expr::Immediate {
            dreg: REG_VERDICT,
            data: Data::Verdict {
                code: VERDICT_GOTO,
                chain: Some("masq_checks".into()),
            },
        },
        Expr::Masq { flags: 0 },
        Expr::Ct {
            key: 0,
            dreg: REG_1,
        },
        Expr::Byteorder {
            sreg: 9,
            dreg: 9,
            op: 1,
            len: 1,
            size: 2,
        },
        Expr::Counter {
            packets: 3,
            bytes: 180,
        },
        Expr::Counter {
            packets: 0,
            bytes: 0,
        },
        Expr::Limit {
            rate: 10,
            unit: 1,
            burst: 5,
        },
        Expr::Log {
            prefix: "v-0123".into(),
            group: 7,
        },
    ];
    let mut b = Batch::new();
    b.add_rule(NFPROTO_INET, "t", "c", &exprs, Some("hi"))
        .unwrap();
    let (bytes, _) = b.finish();
    let msg = messages(&bytes).nth(1).unwrap().unwrap();
    // A dump carries the handle too; add one to reuse the parser.
    let mut payload = msg.payload.to_vec();
    let mut w = Writer::default();
    w.attr(NFTA_RULE_HANDLE, &5u64.to_be_bytes());
    payload.extend_from_slice(w.as_bytes());
    let rule = parse_rule(&payload).unwrap();
    assert_eq!(rule.exprs, exprs);
    assert_eq!(rule.comment.as_deref(), Some("hi"));
    assert_eq!(rule.chain, "c");
    assert_eq!(rule.handle, 5);
    assert_eq!(rule.jump_target(), Some("masq_checks"));
}

/// Random bytes, and random bytes inside well-formed framing, through
/// every decoder: no panic, no endless loop.
#[test]
fn random_input_is_survived() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..3000 {
        let len = (next() % 160) as usize;
        let junk: Vec<u8> = (0..len).map(|_| (next() % 7) as u8 * 0x11).collect();
        let _ = messages(&junk).count();
        let _ = parse_rule(&junk);
        let _ = parse_expr(&junk);
        let _ = parse_udata_comment(&junk);
        // Junk as the expressions of an otherwise valid rule.
        let mut w = Writer::default();
        w.attr_str(NFTA_RULE_CHAIN, "c");
        w.attr(NFTA_RULE_HANDLE, &1u64.to_be_bytes());
        w.attr(NFTA_RULE_EXPRESSIONS, &junk);
        w.attr(NFTA_RULE_USERDATA, &junk);
        let mut payload = vec![1, 0, 0, 0];
        payload.extend_from_slice(w.as_bytes());
        assert!(parse_rule(&payload).is_some());
    }
}

#[test]
fn garbage_never_panics() {
    for len in 0..64 {
        let junk: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
        let _ = messages(&junk).count();
        let _ = parse_rule(&junk);
        let _ = parse_expr(&junk);
        let _ = parse_udata_comment(&junk);
    }
    assert!(messages(&[20, 0, 0, 0, 1]).next().unwrap().is_err());
    // Attributes claiming a length shorter than their header end the
    // walk instead of looping on the spot.
    assert_eq!(attrs(&[0, 0, 1, 0, 9, 9, 9, 9]).count(), 0);
    assert_eq!(attr(&[2, 0, 1, 0], 5), None);
    assert_eq!(
        parse_expr(&[0, 0, 1, 0, 0, 0, 2, 0]),
        Expr::Other(String::new())
    );
}

/// A set-element dump as the kernel sent it (captured by `tests/fuzz/capture-seeds.sh`
/// from a port-security set of two elements).
#[test]
fn a_real_set_element_dump_decodes() {
    let datagram = include_bytes!("../../../../tests/fuzz/seeds/nftables/set-element-dump");
    let elements: Vec<Element> = messages(datagram)
        .map_while(std::result::Result::ok)
        .flat_map(|m| sets::parse_elements(m.payload))
        .collect();
    assert_eq!(elements.len(), 2, "{elements:?}");
    for e in &elements {
        assert_eq!(e.key.len(), 32);
        assert!(e.key.starts_with(b"vethA\0"));
        assert_eq!(
            e.comment.as_deref(),
            Some("156492b196ad91ce0e8bd807 ctrA eth0")
        );
    }
}

#[test]
fn errnos_are_explained() {
    assert!(explain(libc::ENOENT).starts_with("the table, chain or rule does not exist"));
    assert!(explain(libc::EPERM).contains("CAP_NET_ADMIN"));
}
