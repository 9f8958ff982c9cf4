//! Property tests (proptest) of the bridge plugin's config loading: arbitrary JSON with
//! the bridge's keys (in any case, with values of any type and range) and arbitrary
//! `CNI_ARGS` never panic; refusals are CNI errors; what is accepted holds only valid
//! values (VLAN ids, trunk lists, MTU, flag combinations); and valid trunk lists come out
//! as exactly the VLANs they name.
//!
//! `PROPTEST_CASES` overrides the default case count (kept small for CI).

use cni_bridge::config::BridgeConf;
use cni_protocol::{CmdArgs, Command, NetConf, Request};
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

fn cases(default: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

const KEYS: &[&str] = &[
    "bridge",
    "isGateway",
    "isDefaultGateway",
    "forceAddress",
    "ipMasq",
    "ipMasqBackend",
    "mtu",
    "hairpinMode",
    "promiscMode",
    "vlan",
    "vlanTrunk",
    "preserveDefaultVlan",
    "macspoofchk",
    "enabledad",
    "disableContainerInterface",
    "portIsolation",
    "dns",
    "args",
    "runtimeConfig",
    "ipam",
];

fn recase(text: &str, bits: u64) -> String {
    if bits & 1 == 0 {
        return text.to_string();
    }
    text.chars()
        .enumerate()
        .map(|(i, c)| {
            if i < 63 && bits >> (i + 1) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect()
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop_oneof![
            -2i64..4100,
            any::<i64>(),
            Just(4094),
            Just(4095),
            Just(i64::from(u32::MAX) + 1)
        ]
        .prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        prop::sample::select(
            &[
                "",
                "br0",
                "cni0",
                "iptables",
                "nftables",
                "ebtables",
                "aa:bb:cc:dd:ee:ff",
                "AA:BB:CC:DD:EE:FF",
                "aa:bb:cc:dd:ee",
                "zz",
                "10.0.0.1",
                "host-local",
                "true",
            ][..]
        )
        .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ]
}

fn any_json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 20, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(
                        &[
                            "minID",
                            "maxID",
                            "id",
                            "mac",
                            "cni",
                            "nameservers",
                            "domain",
                            "search",
                            "options",
                            "type",
                            "x",
                        ][..]
                    )
                    .prop_map(str::to_string),
                    inner
                ),
                0..4
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Integers with the edges of VLAN ids, MTUs and the integer types weighted up.
fn edge_int() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => prop::sample::select(&[
            -1, 0, 1, 2, 4093, 4094, 4095, 65535, 65536, 4_294_967_295, 4_294_967_296, i64::MIN,
            i64::MAX,
        ][..]),
        3 => 0i64..4100,
        1 => any::<i64>(),
    ]
}

fn trunk_entry() -> impl Strategy<Value = Value> {
    let id = || prop::option::of(edge_int());
    (id(), id(), id()).prop_map(|(min, max, id)| {
        let mut o = Map::new();
        for (k, v) in [("minID", min), ("maxID", max), ("id", id)] {
            if let Some(v) = v {
                o.insert(k.into(), v.into());
            }
        }
        Value::Object(o)
    })
}

/// A value for `key` that is mostly of the right type, sometimes anything.
fn value_for(key: &'static str) -> BoxedStrategy<Value> {
    let mac = || {
        prop::sample::select(
            &[
                "",
                "aa:bb:cc:dd:ee:ff",
                "02:00:00:00:00:01",
                "AA:BB:CC:DD:EE:FF",
                "aa:bb:cc",
                "zz",
            ][..],
        )
        .prop_map(Value::from)
    };
    let strings = || prop::collection::vec("[a-z0-9.:]{0,8}".prop_map(Value::from), 0..3);
    let good: BoxedStrategy<Value> = match key {
        "bridge" => prop_oneof![Just(String::new()), "[a-z0-9]{1,15}", "\\PC{0,16}"]
            .prop_map(Value::from)
            .boxed(),
        "ipMasqBackend" => prop::sample::select(&["iptables", "nftables", "", "ebtables"][..])
            .prop_map(Value::from)
            .boxed(),
        "mtu" | "vlan" => edge_int().prop_map(Value::from).boxed(),
        "vlanTrunk" => prop::collection::vec(
            prop_oneof![4 => trunk_entry(), 1 => Just(Value::Null)],
            0..4,
        )
        .prop_map(Value::Array)
        .boxed(),
        "dns" => (prop::option::of(strings()), "[a-z.]{0,8}", prop::option::of(strings()))
            .prop_map(|(ns, domain, search)| json!({"nameservers": ns, "domain": domain, "search": search}))
            .boxed(),
        "args" => mac().prop_map(|mac| json!({"cni": {"mac": mac}})).boxed(),
        "runtimeConfig" => mac().prop_map(|mac| json!({"mac": mac})).boxed(),
        "ipam" => prop_oneof![Just(json!({"type": "host-local"})), any_json()].boxed(),
        _ => any::<bool>().prop_map(Value::from).boxed(),
    };
    prop_oneof![12 => good, 1 => any_json()].boxed()
}

fn config() -> impl Strategy<Value = Value> {
    let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = KEYS
        .iter()
        .map(|k| {
            prop::option::weighted(0.3, (any::<u64>(), value_for(k)))
                .prop_map(move |kv| kv.map(|(bits, v)| (recase(k, bits), v)))
                .boxed()
        })
        .collect();
    (
        fields,
        prop::sample::select(&["0.3.1", "1.0.0", "1.1.0"][..]),
    )
        .prop_map(|(fields, version)| {
            let mut o = Map::new();
            o.insert("cniVersion".into(), version.into());
            o.insert("name".into(), "net".into());
            o.insert("type".into(), "bridge".into());
            for (k, v) in fields.into_iter().flatten() {
                o.insert(k, v);
            }
            Value::Object(o)
        })
}

fn request(conf: &Value, cni_args: &str) -> Option<Request> {
    let bytes = conf.to_string().into_bytes();
    let config = NetConf::parse(&bytes).ok()?;
    Some(Request {
        args: CmdArgs {
            command: Command::Add,
            container_id: "c".into(),
            netns: String::new(),
            ifname: "eth0".into(),
            args: cni_args.into(),
            path: vec![],
            netns_override: false,
        },
        config,
        stdin: bytes,
    })
}

proptest! {
    #![proptest_config(cases(256))]

    /// Any config and CNI_ARGS: no panic; a refusal is a CNI error (6/7 for decoding or
    /// invalid values, 999 for the reference's own checks); an accepted config is valid.
    #[test]
    fn config_loading_never_panics(
        conf in prop_oneof![4 => config(), 1 => any_json()],
        cni_args in prop_oneof![
            Just(String::new()),
            "MAC=[0-9a-fA-F:]{0,20}",
            "(IgnoreUnknown=(1|0|x);)?(MAC=[0-9a-f:]{0,17}|K8S_POD_NAME=p|[A-Z=;]{0,6})",
        ],
    ) {
        let Some(req) = request(&conf, &cni_args) else { return Ok(()) };
        match BridgeConf::load(&req) {
            Err(err) => {
                prop_assert!([6, 7, 999].contains(&err.code.0), "{err:?}");
                prop_assert!(!err.msg.is_empty());
            }
            Ok(c) => {
                prop_assert!(!c.bridge.is_empty());
                prop_assert!(c.vlan <= 4094);
                if let Some(trunk) = &c.vlan_trunk {
                    prop_assert!(trunk.iter().all(|v| (1..=4094).contains(v)));
                    prop_assert!(trunk.windows(2).all(|w| w[0] < w[1]), "{trunk:?}");
                }
                prop_assert!(!(c.hairpin_mode && c.promisc_mode));
                prop_assert!(!c.is_default_gateway || c.is_gateway);
                prop_assert!(!(c.disable_container_interface && c.is_layer3()));
                let _ = c.masq_backend();
                let _ = (c.has_vlans(), c.wants_vlan_filtering());
            }
        }
    }

    /// `vlan` is accepted exactly in 0..=4094 and `mtu` exactly in 0..=u32::MAX, and
    /// both come out unchanged.
    #[test]
    fn vlan_and_mtu_ranges(vlan in edge_int(), mtu in edge_int()) {
        let load = |key: &str, n: i64| {
            let conf = json!({"cniVersion": "1.1.0", "name": "net", "type": "bridge", key: n});
            BridgeConf::load(&request(&conf, "").unwrap())
        };
        match load("vlan", vlan) {
            Ok(c) => {
                prop_assert!((0..=4094).contains(&vlan), "{vlan} accepted");
                prop_assert_eq!(i64::from(c.vlan), vlan);
            }
            Err(e) => prop_assert!(!(0..=4094).contains(&vlan), "{vlan}: {e:?}"),
        }
        match load("mtu", mtu) {
            Ok(c) => {
                prop_assert!(u32::try_from(mtu).is_ok(), "{mtu} accepted");
                prop_assert_eq!(i64::from(c.mtu), mtu);
            }
            Err(e) => prop_assert!(u32::try_from(mtu).is_err(), "{mtu}: {e:?}"),
        }
    }

    /// Valid trunk entries give exactly the union of the VLANs they name.
    #[test]
    fn trunk_lists_are_the_union_of_their_entries(
        entries in prop::collection::vec(
            prop_oneof![
                (1u16..=4094).prop_map(|id| (None, Some(id))),
                (1u16..=4094, 0u16..40).prop_map(|(min, len)| (Some((min, min.saturating_add(len).min(4094))), None)),
                (1u16..=4094, 0u16..40, 1u16..=4094).prop_map(|(min, len, id)| (Some((min, min.saturating_add(len).min(4094))), Some(id))),
            ],
            1..5,
        ),
    ) {
        let mut want = BTreeSet::new();
        let list: Vec<Value> = entries
            .iter()
            .map(|(range, id)| {
                let mut o = Map::new();
                if let Some((min, max)) = range {
                    want.extend(*min..=*max);
                    o.insert("minID".into(), (*min).into());
                    o.insert("maxID".into(), (*max).into());
                }
                if let Some(id) = id {
                    want.insert(*id);
                    o.insert("id".into(), (*id).into());
                }
                Value::Object(o)
            })
            .collect();
        let conf = json!({"cniVersion": "1.1.0", "name": "net", "type": "bridge", "vlanTrunk": list});
        let req = request(&conf, "").unwrap();
        let c = BridgeConf::load(&req).unwrap();
        prop_assert_eq!(c.vlan_trunk, Some(want.into_iter().collect::<Vec<u16>>()));
    }
}
