//! Property tests (proptest) of host-local's range arithmetic, its allocator over a real
//! (temporary, file-backed) store, and its config loader.
//!
//! - Ranges: canonicalisation against an independent model of the reference's rules
//!   (defaults, "too small" for /31, /32, /127, /128, host bits, rangeStart/rangeEnd,
//!   gateway), containment, capacity, and the round-robin iterator (each allocatable
//!   address exactly once, in order, from the cursor), IPv4 and IPv6.
//! - Range sets: accepted exactly when their ranges are disjoint.
//! - Allocator: random sequences of dynamic ADDs, requested addresses, repeated ADDs of
//!   one attachment and releases, on one or two range sets, checked step by step against
//!   a model: an address is never outside its range, the gateway, or already reserved;
//!   ADD fails exactly when a set is full; a refused request leaves the store as it was.
//! - Config: `IpamConfig::load` on arbitrary and config-shaped JSON and `CNI_ARGS`.
//!
//! Needs no root: the store lives in a temporary directory. `PROPTEST_CASES` overrides
//! the default case counts below (kept small so the suite stays quick in CI).

use cni_host_local::allocator::{self, Attachment};
use cni_host_local::config::IpamConfig;
use cni_host_local::range::{Range, RangeSet, RangeSpec, from_u128, to_u128};
use cni_host_local::store::{LAST_RESERVED_PREFIX, LOCK_FILE, Store};
use cni_protocol::NetConf;
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

fn cases(default: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        // Failures are reported with their minimal input; fixed ones become unit tests
        // rather than regression files written into the source tree by CI.
        failure_persistence: None,
        ..Config::default()
    }
}

/// A directory under the system temp dir, removed on drop (also when a case fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "hl-prop-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------
// The model of one range
// ---------------------------------------------------------------------------------------

/// Address width of the family.
fn width(v4: bool) -> u8 {
    if v4 { 32 } else { 128 }
}

/// The last address of the subnet (the IPv4 broadcast).
fn last_of(network: u128, prefix: u8, v4: bool) -> u128 {
    let host_bits = u32::from(width(v4) - prefix);
    let hosts = if host_bits == 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    network | hosts
}

/// How one endpoint (or the gateway) of a generated range is written.
#[derive(Debug, Clone)]
enum Point {
    /// Not set: the default applies.
    Unset,
    /// The subnet's network address plus this many (taken modulo the subnet size).
    FromStart(u128),
    /// The subnet's last address minus this many (modulo the subnet size).
    FromEnd(u128),
    /// Any address of either family.
    Any(IpAddr),
    /// Text that is no address.
    Garbage(String),
}

impl Point {
    fn text(&self, network: u128, prefix: u8, v4: bool) -> Option<String> {
        let last = last_of(network, prefix, v4);
        let size = (last - network).checked_add(1);
        let wrap = |n: u128| size.map_or(n, |s| n % s);
        match self {
            Point::Unset => None,
            Point::FromStart(n) => Some(from_u128(network + wrap(*n), v4).to_string()),
            Point::FromEnd(n) => Some(from_u128(last - wrap(*n), v4).to_string()),
            Point::Any(ip) => Some(ip.to_string()),
            Point::Garbage(t) => Some(t.clone()),
        }
    }
}

fn point() -> impl Strategy<Value = Point> {
    prop_oneof![
        6 => Just(Point::Unset),
        3 => (0u128..6).prop_map(Point::FromStart),
        3 => (0u128..6).prop_map(Point::FromEnd),
        1 => any::<u128>().prop_map(Point::FromStart),
        1 => any::<u32>().prop_map(|n| Point::Any(IpAddr::from(n.to_be_bytes()))),
        1 => any::<u128>().prop_map(|n| Point::Any(IpAddr::from(n.to_be_bytes()))),
        1 => "[0-9a-f:.]{0,12}".prop_map(Point::Garbage),
    ]
}

/// A generated range: family, network (host bits possibly set), prefix, endpoints.
#[derive(Debug, Clone)]
struct GenRange {
    v4: bool,
    base: u128,
    prefix: u8,
    host_bits: bool,
    start: Point,
    end: Point,
    gateway: Point,
}

impl GenRange {
    fn network(&self) -> u128 {
        let w = u32::from(width(self.v4));
        let p = u32::from(self.prefix);
        let mask = if p == 0 {
            0
        } else {
            (u128::MAX << (128 - p)) >> (128 - w)
        };
        self.base & mask
    }

    /// The subnet text, with host bits when asked (and the prefix leaves room).
    fn subnet_text(&self) -> String {
        let network = self.network();
        let ip = if self.host_bits && network != self.base {
            self.base
        } else {
            network
        };
        format!("{}/{}", from_u128(ip, self.v4), self.prefix)
    }

    fn spec(&self) -> RangeSpec {
        let (n, p, v4) = (self.network(), self.prefix, self.v4);
        RangeSpec {
            subnet: Some(self.subnet_text()),
            range_start: self.start.text(n, p, v4),
            range_end: self.end.text(n, p, v4),
            gateway: self.gateway.text(n, p, v4),
        }
    }
}

/// Prefixes, weighted to the edges: /0, /30-/32 and /126-/128 and everything between.
fn gen_range() -> impl Strategy<Value = GenRange> {
    let v4_prefix = prop_oneof![3 => 24u8..=32, 1 => 0u8..=32, 2 => 29u8..=32];
    let v6_prefix =
        prop_oneof![3 => 118u8..=128, 1 => 0u8..=128, 2 => 125u8..=128, 1 => Just(64u8)];
    let v4 = (any::<u32>(), v4_prefix).prop_map(|(b, p)| (true, u128::from(b), p));
    let v6 = (any::<u128>(), v6_prefix).prop_map(|(b, p)| (false, b, p));
    (
        prop_oneof![v4, v6],
        prop::bool::weighted(0.1),
        point(),
        point(),
        point(),
    )
        .prop_map(
            |((v4, base, prefix), host_bits, start, end, gateway)| GenRange {
                v4,
                base,
                prefix,
                host_bits,
                start,
                end,
                gateway,
            },
        )
}

/// The model's answer for one range: `Err(())` when the reference refuses it, else
/// (start, end, gateway) as numbers and the gateway's family.
fn model_range(g: &GenRange) -> Result<(u128, u128, IpAddr), ()> {
    let spec = g.spec();
    let v4 = g.v4;
    if g.prefix > width(v4) - 2 {
        return Err(());
    }
    if g.host_bits && g.network() != g.base {
        return Err(());
    }
    let network = g.network();
    let last = last_of(network, g.prefix, v4);
    let parse = |t: &Option<String>| -> Result<Option<IpAddr>, ()> {
        match t.as_deref() {
            None | Some("") => Ok(None),
            Some(t) => t
                .parse::<IpAddr>()
                .map(|ip| match ip {
                    IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
                    ip => ip,
                })
                .map(Some)
                .map_err(|_| ()),
        }
    };
    let in_subnet =
        |ip: IpAddr| ip.is_ipv4() == v4 && to_u128(ip) >= network && to_u128(ip) <= last;
    let gateway = parse(&spec.gateway)?.unwrap_or(from_u128(network + 1, v4));
    let mut start = network + 1;
    let mut end = if v4 { last - 1 } else { last };
    if let Some(s) = parse(&spec.range_start)? {
        if !in_subnet(s) {
            return Err(());
        }
        start = to_u128(s);
    }
    if let Some(e) = parse(&spec.range_end)? {
        if !in_subnet(e) || to_u128(e) < start {
            return Err(());
        }
        end = to_u128(e);
    }
    // A rangeStart past the default end (the IPv4 broadcast) leaves no range at all.
    if start > end {
        return Err(());
    }
    Ok((start, end, gateway))
}

/// The allocatable addresses of a small set, by brute force.
fn allocatable(set: &RangeSet) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for r in &set.0 {
        for n in to_u128(r.start)..=to_u128(r.end) {
            let ip = from_u128(n, r.is_v4());
            if ip != r.gateway {
                out.push(ip);
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Range sets and the allocator model
// ---------------------------------------------------------------------------------------

/// A set of 1-3 ranges cut from one small subnet (so that they may or may not overlap),
/// IPv4 (/26-/30) or IPv6 (/122-/126).
fn small_set(v4: bool) -> impl Strategy<Value = Vec<RangeSpec>> {
    let prefix = if v4 { 26u8..=30 } else { 122u8..=126 };
    (
        any::<u128>(),
        prefix,
        prop::collection::vec((any::<u16>(), any::<u16>(), point()), 1..=3),
    )
        .prop_map(move |(base, prefix, cuts)| {
            let g = GenRange {
                v4,
                base: if v4 {
                    base & u128::from(u32::MAX)
                } else {
                    base
                },
                prefix,
                host_bits: false,
                start: Point::Unset,
                end: Point::Unset,
                gateway: Point::Unset,
            };
            let network = g.network();
            let last = last_of(network, prefix, v4);
            let size = last - network + 1;
            let mut specs = Vec::new();
            for (a, b, gateway) in cuts {
                let (a, b) = (u128::from(a) % size, u128::from(b) % size);
                let (lo, hi) = (a.min(b), a.max(b));
                // Keep the ranges off the network address and the IPv4 broadcast, as
                // defaults would.
                let lo = lo.max(1);
                let hi = if v4 { hi.min(size - 2) } else { hi };
                let (lo, hi) = (lo.min(hi), hi.max(lo));
                specs.push(RangeSpec {
                    subnet: Some(g.subnet_text()),
                    range_start: Some(from_u128(network + lo, v4).to_string()),
                    range_end: Some(from_u128(network + hi, v4).to_string()),
                    gateway: gateway.text(network, prefix, v4),
                });
            }
            specs
        })
}

#[derive(Debug, Clone)]
enum Op {
    /// ADD of a new attachment, no address requested.
    Add,
    /// ADD of a new attachment requesting the n-th address of the subnet of set `set`
    /// (may be outside the ranges, the gateway, or taken).
    Request { set: usize, nth: u16 },
    /// ADD requesting an address of no set at all.
    RequestForeign,
    /// A second ADD by the n-th attachment holding addresses.
    Again(usize),
    /// Release of the n-th held address.
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => Just(Op::Add),
        4 => (0usize..2, any::<u16>()).prop_map(|(set, nth)| Op::Request { set, nth }),
        1 => Just(Op::RequestForeign),
        1 => any::<usize>().prop_map(Op::Again),
        3 => any::<usize>().prop_map(Op::Release),
    ]
}

/// Names in the network directory other than reservations (must be only the lock and
/// round-robin cursors once the lock is dropped: no temp file left behind).
fn stray_files(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n != LOCK_FILE && !n.starts_with(LAST_RESERVED_PREFIX) && n.parse::<IpAddr>().is_err()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Config-shaped JSON for the loader
// ---------------------------------------------------------------------------------------

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        prop::sample::select(
            &[
                "10.0.0.0/24",
                "10.0.0.0/31",
                "fd00::/64",
                "fd00::/127",
                "10.0.0.5",
                "fd00::5",
                "::ffff:10.0.0.5",
                "",
                "x",
                "/tmp/hl-prop-nonexistent",
                "1.1.0",
                "0.2.0",
            ][..]
        )
        .prop_map(Value::from),
        "\\PC{0,10}".prop_map(Value::from),
    ]
}

fn json_any() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(
                        &[
                            "subnet",
                            "rangeStart",
                            "rangeEnd",
                            "gateway",
                            "ranges",
                            "routes",
                            "dst",
                            "gw",
                            "dataDir",
                            "resolvConf",
                            "lockTimeout",
                            "ips",
                            "ipRanges",
                            "cni",
                            "type",
                            "Subnet",
                            "RANGES",
                        ][..]
                    )
                    .prop_map(str::to_string),
                    inner
                ),
                0..5
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn ipam_json() -> impl Strategy<Value = Value> {
    let range = (
        prop_oneof![3 => gen_range().prop_map(|g| Value::from(g.subnet_text())), 1 => json_leaf()],
        prop::option::of(json_leaf()),
        prop::option::of(json_leaf()),
        prop::option::of(json_leaf()),
    )
        .prop_map(|(subnet, start, end, gw)| {
            let mut o = serde_json::Map::new();
            o.insert("subnet".into(), subnet);
            for (k, v) in [("rangeStart", start), ("rangeEnd", end), ("gateway", gw)] {
                if let Some(v) = v {
                    o.insert(k.into(), v);
                }
            }
            Value::Object(o)
        });
    let ranges = prop::collection::vec(prop::collection::vec(range, 0..3), 0..3);
    (
        prop_oneof![3 => ranges.prop_map(|r| json!(r)), 1 => json_any()],
        prop::option::of(json_any()),
        prop::option::of(prop_oneof![
            json_leaf(),
            (0.0f64..2.0).prop_map(Value::from)
        ]),
        prop::option::of(json_any()),
        prop::sample::select(&["0.2.0", "0.4.0", "1.1.0", ""][..]),
    )
        .prop_map(|(ranges, routes, lock, extra, version)| {
            let mut ipam = json!({"type": "host-local", "ranges": ranges,
                "dataDir": "/tmp/hl-prop-nonexistent"});
            if let Some(r) = routes {
                ipam["routes"] = r;
            }
            if let Some(l) = lock {
                ipam["lockTimeout"] = l;
            }
            let mut conf =
                json!({"cniVersion": version, "name": "net", "type": "bridge", "ipam": ipam});
            if let Some(Value::Object(extra)) = extra {
                for (k, v) in extra {
                    conf["ipam"][k] = v;
                }
            }
            conf
        })
}

// ---------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(256))]

    /// Canonicalisation agrees with the model; an accepted range lies in its subnet with
    /// start <= end; containment, capacity and the defaults follow.
    #[test]
    fn range_canonicalisation(g in gen_range()) {
        let got = Range::canonicalize(&g.spec());
        match (model_range(&g), got) {
            (Err(()), Err(e)) => prop_assert!(!e.to_string().is_empty()),
            (Ok((start, end, gateway)), Ok(r)) => {
                prop_assert_eq!(r.is_v4(), g.v4);
                prop_assert_eq!(to_u128(r.subnet.network()), g.network());
                prop_assert_eq!(r.subnet.prefix(), g.prefix);
                prop_assert_eq!((to_u128(r.start), to_u128(r.end), r.gateway), (start, end, gateway));
                prop_assert!(r.subnet.contains(r.start) && r.subnet.contains(r.end));
                prop_assert!(start <= end);
                let last = last_of(g.network(), g.prefix, g.v4);
                if matches!(g.start, Point::Unset) {
                    prop_assert_eq!(start, g.network() + 1, "network address never allocatable by default");
                }
                if matches!(g.end, Point::Unset) && g.v4 {
                    prop_assert_eq!(end, last - 1, "broadcast never allocatable by default");
                }
                let gw_in = r.contains(r.gateway);
                prop_assert_eq!(r.capacity(), (end - start).saturating_add(1) - u128::from(gw_in));
                // Containment at the edges, one step out, and in the other family.
                for n in [start, end, start.wrapping_sub(1), end.wrapping_add(1), g.network(), last] {
                    let max = if g.v4 { u128::from(u32::MAX) } else { u128::MAX };
                    if n > max {
                        continue;
                    }
                    let ip = from_u128(n, g.v4);
                    prop_assert_eq!(r.contains(ip), start <= n && n <= end, "{}", ip);
                    prop_assert!(!r.contains(from_u128(n & u128::from(u32::MAX), !g.v4)));
                }
            }
            (want, got) => prop_assert!(false, "{:?}: model {want:?}, got {got:?}", g.spec()),
        }
    }

    /// Arbitrary text in every field never panics.
    #[test]
    fn range_parsing_of_any_text(
        subnet in prop::option::of(prop_oneof![
            "[0-9a-f:./]{0,24}", "\\PC{0,12}",
            "(::ffff:)?[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}/[0-9]{1,3}",
        ]),
        start in prop::option::of("[0-9a-f:.]{0,20}"),
        end in prop::option::of("[0-9a-f:.]{0,20}"),
        gateway in prop::option::of("\\PC{0,8}"),
    ) {
        let spec = RangeSpec { subnet, range_start: start, range_end: end, gateway };
        if let Ok(r) = Range::canonicalize(&spec) {
            prop_assert!(to_u128(r.start) <= to_u128(r.end), "{spec:?} -> {r:?}");
            let _ = r.capacity();
        }
    }

    /// The round-robin iterator yields every allocatable address of a small set exactly
    /// once: after the cursor when it is in the set (ending with it), else from the first
    /// range's start; gateways are never yielded.
    #[test]
    fn iteration_covers_each_address_once(
        specs in prop::bool::ANY.prop_flat_map(small_set),
        cursor in prop::option::of(any::<u16>()),
        beyond in any::<bool>(),
    ) {
        let Ok(set) = RangeSet::canonicalize(&specs) else { return Ok(()) };
        let all = allocatable(&set);
        let last = cursor.map(|n| {
            if beyond || all.is_empty() {
                // A cursor outside the set (another subnet) restarts at the start.
                from_u128(to_u128(set.0[0].end).wrapping_add(u128::from(n) + 300) & if set.is_v4() { u128::from(u32::MAX) } else { u128::MAX }, set.is_v4())
            } else {
                all[usize::from(n) % all.len()]
            }
        });
        let walked: Vec<IpAddr> = set.iter_from(last).map(|(ip, _)| ip).take(all.len() + 2).collect();
        let unique: HashSet<&IpAddr> = walked.iter().collect();
        prop_assert_eq!(unique.len(), walked.len(), "duplicates in {:?}", walked);
        prop_assert_eq!(walked.len(), all.len());
        prop_assert_eq!(set.capacity(), all.len() as u128);
        for ip in &walked {
            prop_assert!(set.allocatable(*ip), "{} not allocatable", ip);
        }
        // The set's addresses in range order, rotated to start after the cursor when
        // it lies in the set; gateways left out.
        let mut order: Vec<IpAddr> = Vec::new();
        for r in &set.0 {
            for n in to_u128(r.start)..=to_u128(r.end) {
                order.push(from_u128(n, r.is_v4()));
            }
        }
        if let Some(at) = last.and_then(|c| order.iter().position(|ip| *ip == c)) {
            order.rotate_left(at + 1);
        }
        let want: Vec<IpAddr> = order.into_iter().filter(|ip| set.allocatable(*ip)).collect();
        prop_assert_eq!(walked, want);
    }

    /// A set is accepted exactly when its ranges do not overlap; overlap is symmetric.
    #[test]
    fn range_sets_refuse_overlaps(specs in prop::bool::ANY.prop_flat_map(small_set)) {
        let Ok(ranges) = specs.iter().map(Range::canonicalize).collect::<Result<Vec<Range>, _>>() else {
            return Ok(());
        };
        let mut disjoint = true;
        for (i, a) in ranges.iter().enumerate() {
            for b in &ranges[i + 1..] {
                let meet = to_u128(a.start) <= to_u128(b.end) && to_u128(b.start) <= to_u128(a.end);
                prop_assert_eq!(a.overlaps(b), meet);
                prop_assert_eq!(b.overlaps(a), meet);
                disjoint &= !meet;
            }
        }
        prop_assert_eq!(RangeSet::canonicalize(&specs).is_ok(), disjoint);
    }

    /// The config loader on arbitrary and config-shaped JSON and CNI_ARGS: never panics,
    /// refusals are CNI errors; accepted configs hold only canonical, disjoint sets.
    #[test]
    fn config_loading_never_panics(
        conf in prop_oneof![3 => ipam_json(), 1 => json_any()],
        args in prop_oneof![
            Just(String::new()),
            "IP=[0-9a-f:.]{0,16}",
            "(IgnoreUnknown=1;)?(IP=10\\.0\\.0\\.[0-9]{1,3}|K8S_POD_NAME=x|[A-Z=;]{0,6})",
        ],
    ) {
        let text = conf.to_string();
        let Ok(net) = NetConf::parse(text.as_bytes()) else { return Ok(()) };
        match IpamConfig::load(&net, &args) {
            Ok(cfg) => {
                prop_assert!(!cfg.range_sets.is_empty());
                for set in &cfg.range_sets {
                    prop_assert!(set.0.iter().all(|r| to_u128(r.start) <= to_u128(r.end)));
                }
            }
            Err(e) => {
                let err = cni_protocol::CniError::from(e);
                prop_assert!(!err.msg.is_empty());
            }
        }
    }
}

proptest! {
    // Each case runs up to 40 ADD/DEL steps against files: fewer cases by default.
    #![proptest_config(cases(48))]

    /// The allocator against a model, on one or two range sets (IPv4, IPv6 or both).
    #[test]
    fn allocator_matches_the_model(
        first in prop::bool::ANY.prop_flat_map(small_set),
        second in prop::option::of(prop::bool::ANY.prop_flat_map(small_set)),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let Ok(first) = RangeSet::canonicalize(&first) else { return Ok(()) };
        let mut sets = vec![first];
        if let Some(second) = second.and_then(|s| RangeSet::canonicalize(&s).ok())
            && !sets[0].overlaps(&second)
        {
            sets.push(second);
        }
        let tmp = TempDir::new();
        let store = Store::open(&tmp.0, "net").unwrap();
        // Model: per set, reserved address -> owner.
        let mut model: Vec<BTreeMap<IpAddr, String>> = vec![BTreeMap::new(); sets.len()];
        let capacity: Vec<usize> = sets.iter().map(|s| allocatable(s).len()).collect();
        let mut next_id = 0;
        for op in ops {
            let mut locked = store.lock(Duration::from_secs(5)).unwrap();
            let before = model.clone();
            let full = (0..sets.len()).any(|i| model[i].len() >= capacity[i]);
            let (id, requested, expect_ok) = match &op {
                Op::Add => {
                    next_id += 1;
                    (format!("c{next_id}"), Vec::new(), !full)
                }
                Op::Request { set, nth } => {
                    next_id += 1;
                    let r = &sets[set % sets.len()].0[0];
                    let network = to_u128(r.subnet.network());
                    let size = last_of(network, r.subnet.prefix(), r.is_v4()) - network + 1;
                    let ip = from_u128(network + u128::from(*nth) % size, r.is_v4());
                    // The address goes to the first set holding it; the others allocate.
                    let expect_ok = match sets.iter().position(|s| s.contains(ip)) {
                        None => false,
                        Some(home) => {
                            sets[home].allocatable(ip)
                                && !model[home].contains_key(&ip)
                                && (0..sets.len())
                                    .filter(|i| *i != home)
                                    .all(|i| model[i].len() < capacity[i])
                        }
                    };
                    (format!("c{next_id}"), vec![ip], expect_ok)
                }
                Op::RequestForeign => {
                    next_id += 1;
                    // Documentation addresses; in the rare case a random set holds one,
                    // the step is skipped.
                    let ip: IpAddr = if sets[0].is_v4() { "192.0.2.77".parse().unwrap() } else { "2001:db8::77".parse().unwrap() };
                    if sets.iter().any(|s| s.contains(ip)) {
                        continue;
                    }
                    (format!("c{next_id}"), vec![ip], false)
                }
                Op::Again(n) => {
                    let owners: BTreeSet<&String> = model.iter().flat_map(|m| m.values()).collect();
                    let Some(id) = owners.iter().nth(n % owners.len().max(1)) else { continue };
                    ((*id).clone(), Vec::new(), false)
                }
                Op::Release(n) => {
                    let held: Vec<(usize, IpAddr)> = model.iter().enumerate()
                        .flat_map(|(i, m)| m.keys().map(move |ip| (i, *ip))).collect();
                    if held.is_empty() {
                        continue;
                    }
                    let (i, ip) = held[n % held.len()];
                    prop_assert!(locked.release(&ip.to_string()).unwrap());
                    model[i].remove(&ip);
                    continue;
                }
            };
            let who = Attachment { id: &id, ifname: "eth0" };
            match allocator::allocate(&mut locked, &sets, &requested, who) {
                Ok(got) => {
                    prop_assert!(expect_ok, "{op:?} succeeded: {got:?}; model {model:?}");
                    prop_assert_eq!(got.len(), sets.len());
                    for (i, (set, cfg)) in sets.iter().zip(&got).enumerate() {
                        let ip = cfg.address.ip();
                        let range = set.range_for(ip);
                        prop_assert!(range.is_some(), "{} outside {}", ip, set);
                        let range = range.unwrap();
                        prop_assert!(ip != range.gateway, "gateway {} handed out", ip);
                        prop_assert!(to_u128(range.start) <= to_u128(ip) && to_u128(ip) <= to_u128(range.end));
                        prop_assert_eq!(cfg.address.prefix(), range.subnet.prefix());
                        prop_assert_eq!(cfg.gateway, Some(range.gateway));
                        prop_assert!(!model[i].contains_key(&ip), "{} handed out twice", ip);
                        if let Some(want) = requested.first().filter(|r| set.contains(**r)) {
                            prop_assert_eq!(ip, *want, "requested address not honoured");
                        }
                        model[i].insert(ip, id.clone());
                    }
                }
                Err(e) => {
                    prop_assert!(!expect_ok, "{op:?} refused: {e}; model {model:?}");
                    prop_assert_eq!(&model, &before);
                }
            }
            // The store holds exactly the model's reservations, with their owners.
            let on_disk: BTreeMap<IpAddr, String> = locked.scan().unwrap().into_iter()
                .map(|e| {
                    let content = locked.read(&e.name).unwrap().unwrap_or_default();
                    let owner = content.split("\r\n").next().unwrap_or_default().to_string();
                    (e.ip, owner)
                })
                .collect();
            let want: BTreeMap<IpAddr, String> = model.iter().flat_map(|m| m.clone()).collect();
            prop_assert_eq!(on_disk, want, "after {:?}", op);
            drop(locked);
            prop_assert_eq!(stray_files(store.dir()), Vec::<String>::new());
        }
        // Exhaustion is exact: fill every set, then one more ADD fails.
        let mut locked = store.lock(Duration::from_secs(5)).unwrap();
        while (0..sets.len()).all(|i| model[i].len() < capacity[i]) {
            next_id += 1;
            let id = format!("fill{next_id}");
            let got = allocator::allocate(&mut locked, &sets, &[], Attachment { id: &id, ifname: "eth0" });
            prop_assert!(got.is_ok(), "{:?} with room left: {model:?}", got);
            for (i, cfg) in got.unwrap().iter().enumerate() {
                prop_assert!(model[i].insert(cfg.address.ip(), id.clone()).is_none());
            }
        }
        let full = allocator::allocate(&mut locked, &sets, &[], Attachment { id: "last", ifname: "eth0" });
        prop_assert!(full.is_err(), "ADD on a full set succeeded: {:?}", full);
    }
}
