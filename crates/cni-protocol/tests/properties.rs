//! Property tests (proptest) of every parser of the CNI protocol crate: network config,
//! `CNI_ARGS`, the `CNI_*` environment, versions, errors, results of every version, the
//! conversions between every pair of supported versions, and the whole dispatcher.
//!
//! The byte- and JSON-level strategies are meant to work as a fuzzer: arbitrary bytes,
//! arbitrary JSON (with keys drawn mostly from the names the parsers look for, in random
//! case) and byte mutations of valid documents go into every parser. Nothing reachable
//! from input may panic, and every refusal must be a CNI error with the spec's code.
//!
//! Case counts: each property runs `PROPTEST_CASES` cases when that is set, else the
//! modest default given below (kept small so the suite stays quick in CI). A longer local
//! run: `PROPTEST_CASES=20000 cargo test -p cni-protocol --test properties --release`.

use cni_protocol::config::canonicalize_keys;
use cni_protocol::dispatch::Outcome;
use cni_protocol::env::{is_valid_identifier, validate_container_id, validate_ifname};
use cni_protocol::version::ResultFamily;
use cni_protocol::{
    CURRENT_VERSION, CmdArgs, CniArgs, CniError, CniResult, Command, Dns, ErrorCode, Interface,
    IpConfig, NetConf, Plugin, Request, Route, SUPPORTED_VERSIONS, Version, dispatch,
};
use ipnetwork::IpNetwork;
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `PROPTEST_CASES` when set (a long local run), else `default`.
fn cases(default: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        // Shrinking a JSON tree can take long; a failing case is still reported whole.
        max_shrink_iters: 2048,
        // Failures are reported with their minimal input; fixed ones become unit tests
        // rather than regression files written into the source tree by CI.
        failure_persistence: None,
        ..Config::default()
    }
}

// ---------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------

/// Every key any parser of this crate looks up, plus a few that look like them.
const KEYS: &[&str] = &[
    "cniVersion",
    "name",
    "type",
    "ipam",
    "dns",
    "args",
    "runtimeConfig",
    "capabilities",
    "prevResult",
    "cni.dev/valid-attachments",
    "cni.dev/attachments",
    "containerID",
    "ifname",
    "interfaces",
    "ips",
    "routes",
    "ip4",
    "ip6",
    "ip",
    "address",
    "gateway",
    "interface",
    "version",
    "dst",
    "gw",
    "mtu",
    "advmss",
    "priority",
    "table",
    "scope",
    "mac",
    "sandbox",
    "socketPath",
    "pciID",
    "nameservers",
    "domain",
    "search",
    "options",
    "code",
    "msg",
    "details",
];

/// Text the parsers give meaning to: versions, addresses, names, and odd numbers' text.
const INTERESTING: &[&str] = &[
    "",
    "0.1.0",
    "0.2.0",
    "0.3.0",
    "0.3.1",
    "0.4.0",
    "1.0.0",
    "1.1.0",
    "0.5.0",
    "1.2.3.4",
    "01.0.0",
    "4294967296.0.0",
    "10.0.0.5/24",
    "10.0.0.5/33",
    "10.0.0.5",
    "10.0.0.1",
    "0.0.0.0/0",
    "::/0",
    "fd00::5/64",
    "fd00::1",
    "::ffff:10.0.0.5/120",
    "::ffff:10.0.0.5/90",
    "::ffff:10.0.0.1",
    "fe80::1%eth0",
    "10.0.0.5/-1",
    "10.0.0.5/+8",
    "net1",
    "x/y",
    "-bad",
    "eth0",
    ".",
    "..",
    "a234567890123456",
    "host-local",
    "bridge",
    "4",
    "6",
    "IgnoreUnknown=1",
    "\u{0}",
    "é",
];

/// A key: mostly a known one (sometimes in another case, as Go matches keys), else
/// arbitrary text.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (prop::sample::select(KEYS), any::<u64>()).prop_map(|(k, bits)| recase(k, bits)),
        1 => re("\\PC{0,8}"),
    ]
}

/// A string strategy from a regex, compiled once (a `&str` strategy recompiles its
/// regex for every value, which dominated the run time).
fn re(pattern: &str) -> proptest::string::RegexGeneratorStrategy<String> {
    proptest::string::string_regex(pattern).expect("valid test regex")
}

/// `text` with the case of its ASCII letters flipped where `bits` says (one bit per
/// character; bits beyond 64 characters leave the rest as is). Half the time unchanged.
fn recase(text: &str, bits: u64) -> String {
    if bits & 1 == 0 {
        return text.to_string();
    }
    text.chars()
        .enumerate()
        .map(|(i, c)| {
            if i < 63 && bits >> (i + 1) & 1 == 1 {
                if c.is_ascii_lowercase() {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            } else {
                c
            }
        })
        .collect()
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(INTERESTING).prop_map(str::to_string),
        1 => re("[0-9a-f:.]{0,20}(/[0-9]{1,3})?"),
        1 => re("\\PC{0,16}"),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::from),
        2 => prop_oneof![
            any::<i64>(),
            -2i64..300,
            Just(i64::from(u32::MAX) + 1),
            Just(i64::MIN),
        ]
        .prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
        4 => text().prop_map(Value::from),
    ]
}

/// Arbitrary JSON: nested objects and arrays whose keys are mostly ones the parsers read.
fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 24, 6, |inner| {
        prop_oneof![
            1 => prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            2 => prop::collection::vec((key(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// `Some(good)` mostly, sometimes absent, sometimes any JSON at all.
fn field<S>(good: S) -> impl Strategy<Value = Option<Value>>
where
    S: Strategy<Value = Value> + 'static,
{
    prop_oneof![
        3 => Just(None),
        12 => good.prop_map(Some),
        1 => json().prop_map(Some),
    ]
}

/// Like [`field`] for keys a parser requires: rarely absent.
fn required<S>(good: S) -> impl Strategy<Value = Option<Value>>
where
    S: Strategy<Value = Value> + 'static,
{
    prop_oneof![
        1 => Just(None),
        30 => good.prop_map(Some),
        2 => json().prop_map(Some),
    ]
}

fn object(fields: Vec<(&'static str, BoxedStrategy<Option<Value>>)>) -> BoxedStrategy<Value> {
    let (names, strategies): (Vec<_>, Vec<_>) = fields.into_iter().unzip();
    (strategies, prop::collection::vec((key(), json()), 0..2))
        .prop_map(move |(values, extra)| {
            let mut map = Map::new();
            for (name, value) in names.iter().zip(values) {
                if let Some(value) = value {
                    map.insert((*name).to_string(), value);
                }
            }
            for (k, v) in extra {
                map.entry(k).or_insert(v);
            }
            Value::Object(map)
        })
        .boxed()
}

fn cidr_text() -> impl Strategy<Value = Value> {
    prop_oneof![
        12 => ip_net().prop_map(|n| Value::from(n.to_string())),
        1 => text().prop_map(Value::from),
    ]
}

fn ip_text() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => ip().prop_map(|a| Value::from(a.to_string())),
        1 => text().prop_map(Value::from),
    ]
}

fn small_int() -> impl Strategy<Value = Value> {
    prop_oneof![0u64..10, any::<u32>().prop_map(u64::from)].prop_map(Value::from)
}

fn string_list() -> impl Strategy<Value = Value> {
    prop::collection::vec(text().prop_map(Value::from), 0..3).prop_map(Value::Array)
}

fn route_json() -> BoxedStrategy<Value> {
    object(vec![
        ("dst", required(cidr_text()).boxed()),
        ("gw", field(ip_text()).boxed()),
        ("mtu", field(small_int()).boxed()),
        ("advmss", field(small_int()).boxed()),
        ("priority", field(small_int()).boxed()),
        ("table", field(any::<i64>().prop_map(Value::from)).boxed()),
        ("scope", field(any::<i64>().prop_map(Value::from)).boxed()),
    ])
}

fn list_of(item: BoxedStrategy<Value>) -> impl Strategy<Value = Value> {
    prop::collection::vec(item, 0..4).prop_map(Value::Array)
}

fn dns_json() -> BoxedStrategy<Value> {
    object(vec![
        ("nameservers", field(string_list()).boxed()),
        ("domain", field(text().prop_map(Value::from)).boxed()),
        ("search", field(string_list()).boxed()),
        ("options", field(string_list()).boxed()),
    ])
}

fn version_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => prop::sample::select(&SUPPORTED_VERSIONS[..]).prop_map(Value::from),
        1 => text().prop_map(Value::from),
    ]
}

/// A JSON value shaped like a result of some version, with random damage.
fn result_json() -> BoxedStrategy<Value> {
    let family = object(vec![
        ("ip", required(cidr_text()).boxed()),
        ("gateway", field(ip_text()).boxed()),
        ("routes", field(list_of(route_json())).boxed()),
    ]);
    let interface = object(vec![
        ("name", field(text().prop_map(Value::from)).boxed()),
        ("mac", field(text().prop_map(Value::from)).boxed()),
        ("mtu", field(small_int()).boxed()),
        ("sandbox", field(text().prop_map(Value::from)).boxed()),
        ("socketPath", field(text().prop_map(Value::from)).boxed()),
        ("pciID", field(text().prop_map(Value::from)).boxed()),
    ]);
    let ip = object(vec![
        (
            "version",
            field(prop::sample::select(&["4", "6"][..]).prop_map(Value::from)).boxed(),
        ),
        ("address", required(cidr_text()).boxed()),
        ("gateway", field(ip_text()).boxed()),
        ("interface", field(small_int()).boxed()),
    ]);
    object(vec![
        ("cniVersion", field(version_value()).boxed()),
        ("interfaces", field(list_of(interface)).boxed()),
        ("ips", field(list_of(ip)).boxed()),
        ("routes", field(list_of(route_json())).boxed()),
        ("dns", field(dns_json()).boxed()),
        ("ip4", field(family.clone()).boxed()),
        ("ip6", field(family).boxed()),
    ])
}

/// A JSON value shaped like a network config (so that parsing gets past the name check
/// and reaches prevResult and the GC list), with random damage.
fn config_json() -> BoxedStrategy<Value> {
    let name = prop_oneof![
        4 => re("[a-zA-Z0-9][a-zA-Z0-9_.-]{0,12}").prop_map(Value::from),
        1 => json(),
    ];
    let attachment = object(vec![
        ("containerID", field(text().prop_map(Value::from)).boxed()),
        ("ifname", field(text().prop_map(Value::from)).boxed()),
    ]);
    let ipam = object(vec![("type", field(text().prop_map(Value::from)).boxed())]);
    object(vec![
        ("cniVersion", field(version_value()).boxed()),
        ("name", field(name).boxed()),
        ("type", field(text().prop_map(Value::from)).boxed()),
        ("ipam", field(ipam).boxed()),
        ("dns", field(dns_json()).boxed()),
        ("prevResult", field(result_json()).boxed()),
        (
            "cni.dev/valid-attachments",
            field(list_of(attachment.clone())).boxed(),
        ),
        ("cni.dev/attachments", field(list_of(attachment)).boxed()),
    ])
}

/// Valid documents the byte mutator starts from.
const SEEDS: &[&str] = &[
    r#"{"cniVersion":"1.1.0","name":"net1","type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.9.0.0/24"}]]}}"#,
    r#"{"cniVersion":"0.2.0","name":"n","type":"bridge","prevResult":{"ip4":{"ip":"10.0.0.2/24","gateway":"10.0.0.1","routes":[{"dst":"0.0.0.0/0"}]},"dns":{}}}"#,
    r#"{"cniVersion":"0.4.0","name":"n","prevResult":{"cniVersion":"0.4.0","interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","sandbox":"/var/run/netns/x"}],"ips":[{"version":"4","address":"10.0.0.2/24","gateway":"10.0.0.1","interface":0}],"routes":[{"dst":"0.0.0.0/0","gw":"10.0.0.1"}],"dns":{"nameservers":["10.0.0.53"]}}}"#,
    r#"{"cniVersion":"1.1.0","name":"n","prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","mtu":1500,"socketPath":"/s","pciID":"0000:00:01.0"}],"ips":[{"address":"fd00::2/64","gateway":"fd00::1","interface":0}],"routes":[{"dst":"::/0","mtu":1400,"advmss":1360,"priority":5,"table":100,"scope":0}]},"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]}"#,
];

/// JSON punctuation and tokens a mutation may splice in.
const TOKENS: &[&str] = &[
    "\"",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "null",
    "true",
    "1e999",
    "-0",
    "\\u0000",
    "\\ud800",
    "{}",
    "[]",
    "\"\"",
    "9999999999999999999999",
];

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Splice(usize, &'static str),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
        (any::<usize>(), prop::sample::select(TOKENS)).prop_map(|(i, t)| Mutation::Splice(i, t)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(seed: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for m in mutations {
        let at = |i: usize, len: usize| if len == 0 { 0 } else { i % (len + 1) };
        match *m {
            Mutation::Flip(i, b) if !bytes.is_empty() => {
                let i = i % bytes.len();
                bytes[i] ^= b;
            }
            Mutation::Insert(i, b) => bytes.insert(at(i, bytes.len()), b),
            Mutation::Delete(i) if !bytes.is_empty() => {
                let i = i % bytes.len();
                bytes.remove(i);
            }
            Mutation::Splice(i, t) => {
                let i = at(i, bytes.len());
                bytes.splice(i..i, t.bytes());
            }
            Mutation::Truncate(i) => bytes.truncate(at(i, bytes.len())),
            _ => {}
        }
    }
    bytes
}

/// Stdin for the config parser: arbitrary bytes, a mutated valid config, or serialized
/// arbitrary / config-shaped JSON.
fn config_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256),
        2 => (prop::sample::select(SEEDS), prop::collection::vec(mutation(), 1..6))
            .prop_map(|(seed, ms)| mutate(seed.as_bytes(), &ms)),
        1 => json().prop_map(|v| v.to_string().into_bytes()),
        3 => config_json().prop_map(|v| v.to_string().into_bytes()),
    ]
}

// ---------------------------------------------------------------------------------------
// Model results for the conversion properties
// ---------------------------------------------------------------------------------------

fn ipv4() -> impl Strategy<Value = Ipv4Addr> {
    any::<u32>().prop_map(Ipv4Addr::from)
}

/// IPv6 outside `::ffff:0:0/96`: the parsers read an IPv4-mapped CIDR as IPv4, as Go
/// does, so such an address does not come back as the same value (by design).
fn ipv6() -> impl Strategy<Value = Ipv6Addr> {
    prop_oneof![
        any::<u128>(),
        (any::<u16>(), any::<u16>()).prop_map(|(net, host)| (0xfd00u128 << 112)
            | (u128::from(net) << 64)
            | u128::from(host)),
    ]
    .prop_map(Ipv6Addr::from)
    .prop_filter("not IPv4-mapped", |a| a.to_ipv4_mapped().is_none())
}

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![ipv4().prop_map(IpAddr::V4), ipv6().prop_map(IpAddr::V6)]
}

/// An address with a prefix, host bits kept, as results carry them.
fn ip_net() -> impl Strategy<Value = IpNetwork> {
    prop_oneof![
        (ipv4(), 0u8..=32).prop_map(|(a, p)| IpNetwork::new(a.into(), p).unwrap()),
        (ipv6(), 0u8..=128).prop_map(|(a, p)| IpNetwork::new(a.into(), p).unwrap()),
    ]
}

fn label() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        re("[a-z0-9:/._-]{1,12}"),
        re("\\PC{1,8}")
    ]
}

fn model_interface() -> impl Strategy<Value = Interface> {
    (
        label(),
        label(),
        prop_oneof![Just(0u32), any::<u32>()],
        label(),
        label(),
        label(),
    )
        .prop_map(|(name, mac, mtu, sandbox, socket_path, pci_id)| Interface {
            name,
            mac,
            mtu,
            sandbox,
            socket_path,
            pci_id,
        })
}

fn model_ip() -> impl Strategy<Value = IpConfig> {
    (
        ip_net(),
        prop::option::of(ip()),
        prop::option::of(0usize..4),
    )
        .prop_map(|(address, gateway, interface)| IpConfig {
            address,
            gateway,
            interface,
        })
}

fn opt_u32() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), any::<u32>()]
}

fn model_route() -> impl Strategy<Value = Route> {
    (
        ip_net(),
        prop::option::of(ip()),
        opt_u32(),
        opt_u32(),
        opt_u32(),
        prop::option::of(any::<i64>()),
        prop::option::of(any::<i64>()),
    )
        .prop_map(|(dst, gw, mtu, advmss, priority, table, scope)| Route {
            dst,
            gw,
            mtu,
            advmss,
            priority,
            table,
            scope,
        })
}

fn model_dns() -> impl Strategy<Value = Dns> {
    let list = || prop::collection::vec(label(), 0..3);
    (list(), label(), list(), list()).prop_map(|(nameservers, domain, search, options)| Dns {
        nameservers,
        domain,
        search,
        options,
    })
}

fn model_result() -> impl Strategy<Value = CniResult> {
    (
        prop::collection::vec(model_interface(), 0..3),
        prop::collection::vec(model_ip(), 0..4),
        prop::collection::vec(model_route(), 0..4),
        prop_oneof![Just(Dns::default()), model_dns()],
    )
        .prop_map(|(interfaces, ips, routes, dns)| CniResult {
            cni_version: CURRENT_VERSION.into(),
            interfaces,
            ips,
            routes,
            dns,
        })
}

/// What a result keeps when printed in `version`'s shape (the spec's conversions):
/// 1.x keeps everything; 0.3.x/0.4.0 drop the 1.1.0 interface fields; 0.1.0/0.2.0 keep
/// the first address of each family (IPv4 first), its gateway, the routes of the
/// families they keep (destination and gateway only) and DNS.
fn project(r: &CniResult, version: &str) -> CniResult {
    let mut out = CniResult {
        cni_version: version.to_string(),
        ..r.clone()
    };
    match ResultFamily::of(version).unwrap() {
        ResultFamily::V100 => {}
        ResultFamily::V040 => {
            for i in &mut out.interfaces {
                i.mtu = 0;
                i.socket_path.clear();
                i.pci_id.clear();
            }
        }
        ResultFamily::V020 => {
            out.interfaces.clear();
            out.ips.clear();
            out.routes.clear();
            for v4 in [true, false] {
                if let Some(ip) = r.ips.iter().find(|ip| ip.address.is_ipv4() == v4) {
                    out.ips.push(IpConfig {
                        interface: None,
                        ..ip.clone()
                    });
                    out.routes.extend(
                        r.routes
                            .iter()
                            .filter(|route| route.dst.is_ipv4() == v4)
                            .map(|route| Route::new(route.dst, route.gw)),
                    );
                }
            }
        }
    }
    out
}

fn rank(family: ResultFamily) -> u8 {
    match family {
        ResultFamily::V020 => 0,
        ResultFamily::V040 => 1,
        ResultFamily::V100 => 2,
    }
}

fn parse_text(text: &str) -> CniResult {
    let value: Value = serde_json::from_str(text).expect("printed results are JSON");
    // A version nobody uses as the default: the printed cniVersion must be what counts.
    CniResult::parse(&value, "9.9.9").expect("printed results parse")
}

// ---------------------------------------------------------------------------------------
// Oracles
// ---------------------------------------------------------------------------------------

/// Codes a parser of untrusted input may answer with: the spec's (1 incompatible
/// version, 2 unsupported field, 3 unknown container, 4 environment, 6 decoding,
/// 7 invalid config) and the reference plugins' catch-all 999.
const INPUT_CODES: &[u32] = &[1, 2, 3, 4, 6, 7, 999];

fn assert_well_formed(err: &CniError, codes: &[u32]) -> Result<(), TestCaseError> {
    prop_assert!(
        codes.contains(&err.code.0),
        "code {} not in {codes:?}: {err:?}",
        err.code
    );
    prop_assert!(!err.msg.is_empty(), "empty message: {err:?}");
    let json = err.to_json("1.1.0");
    let back = CniError::from_json(json.as_bytes());
    prop_assert_eq!(back.as_ref(), Some(err));
    Ok(())
}

/// An independent reading of the reference's `LoadArgs` rules.
fn args_oracle(text: &str, known: &[&str]) -> Result<Vec<(String, String)>, ()> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let mut values = Vec::new();
    let mut unknown = false;
    let mut ignore = false;
    for pair in text.split(';') {
        let (k, v) = pair.split_once('=').ok_or(())?;
        if v.contains('=') {
            return Err(());
        }
        if k == "IgnoreUnknown" {
            ignore = match v.to_ascii_lowercase().as_str() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => return Err(()),
            };
        } else if known.contains(&k) {
            values.push((k.to_string(), v.to_string()));
        } else {
            unknown = true;
        }
    }
    if unknown && !ignore {
        return Err(());
    }
    Ok(values)
}

fn ifname_oracle(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
}

/// A plugin whose ADD returns its prevResult (or a fixed address), so the dispatcher's
/// whole path, printing included, runs on fuzzed input.
struct Echo;

impl Plugin for Echo {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        Ok(req.config.prev_result.clone().unwrap_or_else(|| CniResult {
            ips: vec![IpConfig {
                address: "10.0.0.2/24".parse().unwrap(),
                gateway: None,
                interface: None,
            }],
            ..CniResult::default()
        }))
    }
    fn del(&self, req: &Request) -> Result<(), CniError> {
        req.config.valid_attachments().map(|_| ())
    }
    fn check(&self, _req: &Request) -> Result<(), CniError> {
        Ok(())
    }
}

fn env_value() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        1 => Just(None),
        3 => re("[a-zA-Z0-9][a-zA-Z0-9_.-]{0,15}").prop_map(Some),
        1 => text().prop_map(Some),
        1 => re("[ -~]{0,20}").prop_map(Some),
    ]
}

fn command_text() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        6 => prop::sample::select(&["ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION"][..])
            .prop_map(|c| Some(c.to_string())),
        1 => Just(None),
        1 => re("[A-Za-z]{0,8}").prop_map(Some),
    ]
}

const ENV_NAMES: [&str; 6] = [
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
    "CNI_NETNS_OVERRIDE",
];

fn env_map() -> impl Strategy<Value = HashMap<String, String>> {
    prop::collection::vec(env_value(), ENV_NAMES.len()).prop_map(|values| {
        ENV_NAMES
            .iter()
            .zip(values)
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
            .collect()
    })
}

// ---------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(256))]

    /// Any stdin: a parsed config has a valid name and a version; a refusal is code 6
    /// (not JSON / not an object / wrong type) or 7 (invalid config). prevResult, the GC
    /// list and a typed decode of the parsed config never panic either.
    #[test]
    fn config_parsing_never_panics(bytes in config_bytes()) {
        match NetConf::parse(&bytes) {
            Err(err) => assert_well_formed(&err, &[1, 6, 7])?,
            Ok(mut conf) => {
                prop_assert!(is_valid_identifier(&conf.name), "{:?}", conf.name);
                prop_assert!(!conf.cni_version.is_empty());
                prop_assert!(conf.raw.is_object());
                if let Err(err) = conf.load_prev_result() {
                    assert_well_formed(&err, INPUT_CODES)?;
                }
                if let Err(err) = conf.valid_attachments() {
                    assert_well_formed(&err, &[6, 7])?;
                }
                let _ = conf.decode::<Value>(&["isGateway", "ipam", "subnet"]);
                let _ = conf.decode::<HashMap<String, String>>(&["name"]);
            }
        }
    }

    /// Key matching is case-insensitive at any depth and never drops a value that has
    /// no competing spelling.
    #[test]
    fn canonical_keys_keep_values(value in json()) {
        let mut canon = value.clone();
        canonicalize_keys(&mut canon, KEYS);
        fn count(v: &Value) -> usize {
            match v {
                Value::Object(m) => 1 + m.values().map(count).sum::<usize>(),
                Value::Array(a) => 1 + a.iter().map(count).sum::<usize>(),
                _ => 1,
            }
        }
        prop_assert!(count(&canon) <= count(&value));
        if let Value::Object(map) = &canon {
            for k in map.keys() {
                // A key equal to a known one ignoring case is now spelled exactly so.
                if let Some(known) = KEYS.iter().find(|known| known.eq_ignore_ascii_case(k)) {
                    prop_assert_eq!(k, known);
                }
            }
        }
        // Idempotent.
        let mut twice = canon.clone();
        canonicalize_keys(&mut twice, KEYS);
        prop_assert_eq!(twice, canon);
    }

    /// `CNI_ARGS` of arbitrary text: the reference's rules, checked against an
    /// independent reading of them; errors are code 999 as the reference's are.
    #[test]
    fn cni_args_follow_the_reference_rules(
        text in prop_oneof![
            re("[A-Za-z=;]{0,24}"),
            re("((IP|MAC|IgnoreUnknown|K8S_POD_NAME|ip)=(1|true|TRUE|0|false|x|10\\.0\\.0\\.5|)?;?){0,5}"),
            any::<String>(),
        ],
    ) {
        let known = ["IP", "MAC"];
        let got = CniArgs::parse(&text, &known);
        match (args_oracle(&text, &known), got) {
            (Ok(values), Ok(args)) => {
                for k in known {
                    let last = values.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
                    prop_assert_eq!(args.get(k), last, "{}", k);
                }
                prop_assert_eq!(args.get("IgnoreUnknown"), None);
            }
            (Err(()), Err(err)) => {
                assert_well_formed(&err, &[999])?;
                prop_assert!(err.msg.starts_with("ARGS: "), "{}", err.msg);
            }
            (want, got) => prop_assert!(false, "{text:?}: oracle {want:?}, parser {got:?}"),
        }
    }

    /// `CNI_*` variables: refusals are code 3 or 4 and name every missing variable;
    /// accepted attachment commands carry a valid container id and interface name.
    #[test]
    fn environment_parsing(command in prop::sample::select(&["ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION"][..]), vars in env_map()) {
        let command = Command::parse(command).unwrap();
        let get = |k: &str| vars.get(k).cloned();
        match CmdArgs::from_env(command, get) {
            Ok(args) => {
                prop_assert_eq!(args.command, command);
                if command.targets_attachment() {
                    prop_assert!(is_valid_identifier(&args.container_id));
                    prop_assert!(ifname_oracle(&args.ifname), "{:?}", args.ifname);
                }
                prop_assert!(args.path.iter().all(|p| !p.as_os_str().is_empty()));
            }
            Err(err) => {
                assert_well_formed(&err, &[3, 4])?;
                if err.msg.starts_with("required env variables") {
                    let empty = |k: &str| vars.get(k).is_none_or(String::is_empty);
                    for k in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"] {
                        if err.msg.contains(k) {
                            prop_assert!(empty(k), "{} listed but set", k);
                        }
                    }
                }
            }
        }
    }

    /// Interface names and container ids: the validators agree with the rules.
    #[test]
    fn ifname_and_container_id_rules(name in prop_oneof![text(), re("[ -~]{0,18}"), re("[a-z.:/ ]{0,4}")]) {
        prop_assert_eq!(validate_ifname(&name).is_ok(), ifname_oracle(&name), "{:?}", name);
        match validate_container_id(&name) {
            Ok(()) => prop_assert!(is_valid_identifier(&name)),
            Err(err) => {
                let want = if name.is_empty() { 3 } else { 4 };
                prop_assert_eq!(err.code, ErrorCode(want));
            }
        }
        match Command::parse(&name) {
            Ok(cmd) => prop_assert_eq!(cmd.as_str(), name.as_str()),
            Err(err) => prop_assert_eq!(err.code, ErrorCode(4)),
        }
    }

    /// Versions: parsing arbitrary text never panics, and what parses prints and
    /// parses back to itself; refusals are code 6.
    #[test]
    fn version_parsing(text in prop_oneof![text(), re("[0-9.]{0,12}"), re("[0-9]{1,11}(\\.[0-9]{1,11}){0,3}")]) {
        match Version::parse(&text) {
            Ok(v) => prop_assert_eq!(Version::parse(&v.to_string()).unwrap(), v),
            Err(err) => prop_assert_eq!(err.code, ErrorCode::DECODING_FAILURE),
        }
        if let Err(err) = ResultFamily::of(&text) {
            prop_assert_eq!(err.code, ErrorCode::INCOMPATIBLE_CNI_VERSION);
        }
    }

    /// Error JSON round-trips whatever the text.
    #[test]
    fn error_json_round_trips(code in any::<u32>(), msg in any::<String>(), details in any::<String>(), version in text()) {
        let err = CniError::new(ErrorCode(code), msg).with_details(details);
        let json = err.to_json(&version);
        let value: Value = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(value["cniVersion"].as_str(), Some(version.as_str()));
        prop_assert_eq!(CniError::from_json(json.as_bytes()), Some(err));
    }

    /// A result of any shape, in any default version: parsing never panics, and what
    /// parses prints in every supported version exactly when it can be converted.
    #[test]
    fn result_parsing_never_panics(
        value in prop_oneof![2 => result_json(), 1 => json()],
        default in prop_oneof![prop::sample::select(&SUPPORTED_VERSIONS[..]).prop_map(str::to_string), text()],
    ) {
        match CniResult::parse(&value, &default) {
            Err(err) => assert_well_formed(&err, INPUT_CODES)?,
            Ok(result) => {
                for v in SUPPORTED_VERSIONS {
                    let printed = result.to_json(v);
                    prop_assert_eq!(printed.is_ok(), result.ensure_convertible(v).is_ok(), "{}", v);
                    if let Ok(text) = printed {
                        let back = parse_text(&text);
                        prop_assert_eq!(&back, &project(&result, v), "{}", v);
                    }
                }
            }
        }
    }

    /// Byte mutations of printed results, through the JSON parser and the result parser.
    #[test]
    fn mutated_results_never_panic(r in model_result(), v in prop::sample::select(&SUPPORTED_VERSIONS[..]), ms in prop::collection::vec(mutation(), 1..8)) {
        if let Ok(text) = r.to_json(v) {
            let bytes = mutate(text.as_bytes(), &ms);
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes)
                && let Err(err) = CniResult::parse(&value, v)
            {
                assert_well_formed(&err, INPUT_CODES)?;
            }
        }
    }

}

// The conversion property checks all 49 version pairs per case, and the dispatcher
// property runs the whole pipeline: fewer cases by default.
proptest! {
    #![proptest_config(cases(96))]

    /// Conversion between every pair of supported versions (A to B): printing in A and
    /// parsing gives what A's shape holds; printing that in B and parsing gives what both
    /// shapes hold; within a family (0.1.0/0.2.0, 0.3.0/0.3.1/0.4.0) the text is
    /// identical but for `cniVersion`; and going up a family and back to A gives
    /// A's text byte for byte.
    #[test]
    fn conversions_between_every_pair_of_versions(r in model_result()) {
        for a in SUPPORTED_VERSIONS {
            let fa = ResultFamily::of(a).unwrap();
            let text_a = match r.to_json(a) {
                Ok(t) => t,
                Err(err) => {
                    // Only a result without addresses lacks a 0.1.0/0.2.0 form.
                    prop_assert!(fa == ResultFamily::V020 && r.ips.is_empty(), "{a}: {err:?}");
                    prop_assert_eq!(err.code, ErrorCode::INTERNAL);
                    continue;
                }
            };
            let in_a = parse_text(&text_a);
            prop_assert_eq!(&in_a, &project(&r, a), "print in {} and parse", a);
            for b in SUPPORTED_VERSIONS {
                let fb = ResultFamily::of(b).unwrap();
                let text_b = match in_a.to_json(b) {
                    Ok(t) => t,
                    Err(err) => {
                        prop_assert!(fb == ResultFamily::V020 && in_a.ips.is_empty(), "{a} -> {b}: {err:?}");
                        continue;
                    }
                };
                let in_b = parse_text(&text_b);
                prop_assert_eq!(&in_b, &project(&project(&r, a), b), "{} -> {}", a, b);
                // 1.0.0 is printed as the reference v1.1.1 does (struct order, `dns`
                // always) and 1.1.0 as newer references do (sorted, empty `dns` left
                // out), so only the parsed values of that family must agree.
                if fa == fb && fa != ResultFamily::V100 {
                    prop_assert_eq!(
                        text_b.replacen(&format!("\"cniVersion\": \"{b}\""), &format!("\"cniVersion\": \"{a}\""), 1),
                        text_a.clone(),
                        "{} and {} print alike", a, b
                    );
                }
                if rank(fb) >= rank(fa) {
                    prop_assert_eq!(in_b.to_json(a).unwrap(), text_a.clone(), "{} -> {} -> {}", a, b, a);
                }
            }
        }
    }

    /// The whole dispatcher on fuzzed environment and stdin: never panics; a failure
    /// prints one complete error JSON (code, message, cniVersion) and exits non-zero; a
    /// success prints nothing or a JSON object.
    #[test]
    fn dispatch_answers_every_input(command in command_text(), vars in env_map(), stdin in config_bytes()) {
        let mut vars = vars;
        if let Some(c) = command {
            vars.insert("CNI_COMMAND".into(), c);
        }
        // Never let the fuzzer point CNI_NETNS at a real namespace file of ours.
        vars.remove("CNI_NETNS_OVERRIDE");
        if vars.contains_key("CNI_NETNS") {
            vars.insert("CNI_NETNS".into(), "/nonexistent/netns".into());
        }
        let env = |k: &str| vars.get(k).cloned();
        let Outcome { stdout, stderr, exit_code } =
            dispatch(&Echo, "CNI echo plugin", &env, &mut stdin.as_slice());
        if exit_code == 0 {
            if !stdout.is_empty() {
                let value: Value = serde_json::from_str(&stdout)
                    .map_err(|e| TestCaseError::fail(format!("{e}: {stdout}")))?;
                prop_assert!(value.is_object());
            } else {
                prop_assert!(stderr.is_empty() || vars.get("CNI_COMMAND").is_none_or(String::is_empty));
            }
        } else {
            let value: Value = serde_json::from_str(&stdout)
                .map_err(|e| TestCaseError::fail(format!("{e}: {stdout}")))?;
            prop_assert!(value["code"].as_u64().is_some(), "{}", stdout);
            prop_assert!(value["msg"].as_str().is_some_and(|m| !m.is_empty()), "{}", stdout);
            prop_assert!(value["cniVersion"].is_string(), "{}", stdout);
        }
    }
}
