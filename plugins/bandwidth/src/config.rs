//! The bandwidth plugin's configuration: the four limits (`ingressRate`,
//! `ingressBurst`, `egressRate`, `egressBurst`, in bits per second and bits) from the
//! config itself or from `runtimeConfig.bandwidth`, their validation, and the token
//! bucket parameters the reference computes from them, and our own caps on the burst
//! the runtime passes (`maxBurst`, `maxBurstMs`). Pure: no kernel, no files.

use cni_linux::netlink::tc::Tbf;
use cni_protocol::CniError;
use cni_protocol::config::canonicalize_keys;
use serde_json::Value;
use sha2::{Digest, Sha512};

/// The four keys, in both places they may appear.
const LIMIT_KEYS: [&str; 4] = ["ingressRate", "ingressBurst", "egressRate", "egressBurst"];

/// The reference's queueing latency of every token bucket.
pub const LATENCY_MS: u32 = 25;

/// Microseconds per second (the kernel's `TIME_UNITS_PER_SEC`).
const USEC_PER_SEC: f64 = 1_000_000.0;

/// A rate and its burst for one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Bits per second.
    pub rate: u64,
    /// Bits.
    pub burst: u64,
}

/// The smallest `maxBurst`: one 1500-byte packet, less than which a token bucket
/// never lets a full-size packet through.
pub const MIN_MAX_BURST: u64 = 1500 * 8;

/// The largest `maxBurstMs`: a minute, far beyond any cap worth having.
pub const MAX_MAX_BURST_MS: u64 = 60_000;

/// How many packets of the veth's MTU a burst derived from `maxBurstMs` holds at
/// least, so that a slow pod's bucket still passes back-to-back full-size packets.
pub const MIN_BURST_PACKETS: u64 = 4;

/// Our caps on the burst that `runtimeConfig.bandwidth` passes (containerd passes
/// 2^32-1 bits, CRI-O nearly 4 GB, with every annotation). Not the reference's keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BurstCap {
    /// `maxBurst`: at most this many bits.
    pub bits: Option<u64>,
    /// `maxBurstMs`: at most what the direction's rate sends in this many
    /// milliseconds, but never less than [`MIN_BURST_PACKETS`] packets of the MTU.
    pub millis: Option<u64>,
}

impl BurstCap {
    /// The burst `shape` gets on a link of `mtu` bytes: the smaller of its own and
    /// every cap; a shape under every cap is kept as it is.
    pub fn apply(&self, shape: Shape, mtu: u32) -> Shape {
        let mut burst = shape.burst;
        if let Some(bits) = self.bits {
            burst = burst.min(bits);
        }
        if let Some(ms) = self.millis {
            let floor = MIN_BURST_PACKETS * u64::from(mtu.max(1500)) * 8;
            let at_rate =
                u64::try_from(u128::from(shape.rate) * u128::from(ms) / 1000).unwrap_or(u64::MAX);
            burst = burst.min(at_rate.max(floor));
        }
        Shape { burst, ..shape }
    }
}

/// What the plugin is asked to limit; `None` for a direction without a limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Traffic into the pod (a token bucket on the host end of its veth).
    pub ingress: Option<Shape>,
    /// Traffic out of the pod (redirected to an ifb device with a token bucket).
    pub egress: Option<Shape>,
    /// The caps still to apply to both shapes (set only when they came from
    /// `runtimeConfig.bandwidth`), which need the veth's MTU.
    pub cap: BurstCap,
}

impl Limits {
    /// Whether nothing is limited.
    pub fn is_empty(&self) -> bool {
        self.ingress.is_none() && self.egress.is_none()
    }

    /// The limits to install on a veth of `mtu` bytes: the caps applied.
    pub fn for_mtu(&self, mtu: u32) -> Limits {
        Limits {
            ingress: self.ingress.map(|s| self.cap.apply(s, mtu)),
            egress: self.egress.map(|s| self.cap.apply(s, mtu)),
            cap: BurstCap::default(),
        }
    }
}

/// Reads our `maxBurst` and `maxBurstMs` from the top of the config.
fn parse_cap(conf: &Value) -> Result<BurstCap, CniError> {
    let read = |key: &str, min: u64, max: u64, unit: &str| -> Result<Option<u64>, CniError> {
        match conf.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(CniError::invalid_config(format!(
                    "failed to parse network configuration: {key} must be a whole number of \
                     {unit} from {min} to {max}, not {v}"
                ))),
            },
        }
    };
    Ok(BurstCap {
        // The top is the largest burst the 4 GB rule lets through.
        bits: read(
            "maxBurst",
            MIN_MAX_BURST,
            u64::from(u32::MAX) * 8 - 1,
            "bits (one 1500-byte packet to just under 4 GB)",
        )?,
        millis: read("maxBurstMs", 1, MAX_MAX_BURST_MS, "milliseconds")?,
    })
}

/// One direction's two keys as read, before validation.
#[derive(Debug, Clone, Copy, Default)]
struct Raw {
    rate: u64,
    burst: u64,
}

/// Reads the limits from the config. The config's own keys win over
/// `runtimeConfig.bandwidth` as soon as one of them is present (even 0), as in the
/// reference, where they fill one embedded entry that replaces the runtime's.
/// `maxBurst` and `maxBurstMs` cap only what the runtime passes: a burst in the
/// config itself is the operator's own choice for every pod and is used as written.
pub fn parse(raw: &Value) -> Result<Limits, CniError> {
    let cap = parse_cap(raw)?;
    let mut conf = raw.clone();
    canonicalize_keys(&mut conf, &["runtimeConfig", "bandwidth"]);
    canonicalize_keys(&mut conf, &LIMIT_KEYS);
    let present = |obj: &Value| {
        LIMIT_KEYS
            .iter()
            .any(|k| !obj.get(*k).unwrap_or(&Value::Null).is_null())
    };
    let (source, prefix) = if present(&conf) {
        (conf.clone(), "")
    } else {
        match conf.get("runtimeConfig").and_then(|r| r.get("bandwidth")) {
            None | Some(Value::Null) => return Ok(Limits::default()),
            Some(b @ Value::Object(_)) => (b.clone(), "runtimeConfig.bandwidth."),
            Some(other) => {
                return Err(CniError::invalid_config(format!(
                    "failed to parse network configuration: runtimeConfig.bandwidth must be an object, not {other}"
                )));
            }
        }
    };
    let read = |key: &str| -> Result<u64, CniError> {
        match source.get(key) {
            None | Some(Value::Null) => Ok(0),
            Some(v) => v.as_u64().ok_or_else(|| {
                CniError::invalid_config(format!(
                    "failed to parse network configuration: {prefix}{key} must be a whole \
                     number of bits from 0 to 18446744073709551615, not {v}"
                ))
            }),
        }
    };
    let ingress = Raw {
        rate: read("ingressRate")?,
        burst: read("ingressBurst")?,
    };
    let egress = Raw {
        rate: read("egressRate")?,
        burst: read("egressBurst")?,
    };
    Ok(Limits {
        ingress: validate(ingress, prefix, "ingress")?,
        egress: validate(egress, prefix, "egress")?,
        cap: if prefix.is_empty() {
            BurstCap::default()
        } else {
            cap
        },
    })
}

/// The reference's rules (a rate needs a burst and the other way round, a burst under
/// 4 GB), worded as the reference words them and naming the keys, and two of ours:
/// a rate under 8 bit/s or a burst under 8 bits is 0 bytes to the kernel, which the
/// reference finds out only after it made the ifb device and the ingress qdisc.
fn validate(raw: Raw, prefix: &str, direction: &str) -> Result<Option<Shape>, CniError> {
    let rate_key = format!("{prefix}{direction}Rate");
    let burst_key = format!("{prefix}{direction}Burst");
    let refuse = |msg: String| Err(CniError::invalid_config(msg));
    match (raw.rate, raw.burst) {
        (0, 0) => Ok(None),
        (rate, 0) => refuse(format!(
            "if rate is set, burst must also be set ({rate_key} is {rate}, {burst_key} is not set)"
        )),
        (0, burst) => refuse(format!(
            "if burst is set, rate must also be set ({burst_key} is {burst}, {rate_key} is not set)"
        )),
        (_, burst) if burst / 8 >= u64::from(u32::MAX) => refuse(format!(
            "burst cannot be more than 4GB ({burst_key} is {burst} bits)"
        )),
        (rate, _) if rate < 8 => refuse(format!(
            "{rate_key} is {rate}: a rate must be at least 8 bits per second (one byte)"
        )),
        (_, burst) if burst < 8 => refuse(format!(
            "{burst_key} is {burst}: a burst must be at least 8 bits (one byte)"
        )),
        (rate, burst) => Ok(Some(Shape { rate, burst })),
    }
}

/// Go's conversion of a float64 to uint32 on amd64 (through int64, then truncated),
/// which the reference's arithmetic relies on for out-of-range values.
fn go_u32(value: f64) -> u32 {
    value as i64 as u32
}

/// The token bucket the reference installs for `shape`, with the scheduler's
/// `ticks_per_usec` (see `cni_linux::netlink::tc::psched_ticks_per_usec`): rate in
/// bytes per second, buffer = burst / rate in ticks, limit = rate × 25 ms + burst.
pub fn token_bucket(shape: Shape, ticks_per_usec: f64) -> Tbf {
    let rate = shape.rate / 8;
    // Validation keeps the burst under 4 GB, so this never truncates.
    let burst = u32::try_from(shape.burst / 8).unwrap_or(u32::MAX);
    let usecs = go_u32(f64::from(burst) * USEC_PER_SEC / rate as f64);
    let buffer = go_u32(f64::from(usecs) * ticks_per_usec);
    let latency_usec = USEC_PER_SEC * (f64::from(LATENCY_MS) / 1000.0);
    let limit = go_u32(rate as f64 * latency_usec / USEC_PER_SEC).wrapping_add(burst);
    Tbf {
        rate,
        limit,
        buffer,
        burst: None,
        rate_table: None,
    }
}

/// The ifb device of an attachment: `bwp` and the first 12 hex digits of the
/// SHA-512 of network name and container ID, as the reference names it.
pub fn ifb_name(network: &str, container_id: &str) -> String {
    let digest = Sha512::digest(format!("{network}{container_id}").as_bytes());
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{IFB_PREFIX}{hex}")
}

/// What every ifb device of the plugin is named with.
pub const IFB_PREFIX: &str = "bwp";

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn limits(v: Value) -> Result<Limits, String> {
        parse(&v).map_err(|e| {
            assert_eq!(e.code, cni_protocol::ErrorCode::INVALID_NETWORK_CONFIG);
            e.msg
        })
    }

    const MBIT8: Shape = Shape {
        rate: 8_000_000,
        burst: 80_000,
    };

    #[test]
    fn limits_come_from_the_config_or_else_from_the_runtime() {
        let conf = json!({"ingressRate": 8_000_000, "ingressBurst": 80_000});
        assert_eq!(
            limits(conf).unwrap(),
            Limits {
                ingress: Some(MBIT8),
                ..Limits::default()
            }
        );
        let runtime = json!({"runtimeConfig": {"bandwidth": {"egressRate": 8_000_000, "egressBurst": 80_000}}});
        assert_eq!(
            limits(runtime).unwrap(),
            Limits {
                egress: Some(MBIT8),
                ..Limits::default()
            }
        );
        // One key of the config, even 0, replaces the whole runtime entry.
        let both = json!({"egressRate": 0, "runtimeConfig": {"bandwidth": {"egressRate": 8, "egressBurst": 80}}});
        assert!(limits(both).unwrap().is_empty());
        // Keys match ignoring case, as Go's decoder matches them.
        let cased = json!({"RuntimeConfig": {"Bandwidth": {"IngressRate": 8_000_000, "ingressburst": 80_000}}});
        assert_eq!(limits(cased).unwrap().ingress, Some(MBIT8));
        assert!(limits(json!({})).unwrap().is_empty());
        assert!(limits(json!({"runtimeConfig": {}})).unwrap().is_empty());
        assert!(
            limits(json!({"runtimeConfig": {"bandwidth": null}}))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn mistakes_are_refused_naming_the_key() {
        let cases = [
            (
                json!({"ingressRate": 1000}),
                "if rate is set, burst must also be set (ingressRate is 1000, ingressBurst is not set)",
            ),
            (
                json!({"egressBurst": 1000}),
                "if burst is set, rate must also be set (egressBurst is 1000, egressRate is not set)",
            ),
            (
                json!({"runtimeConfig": {"bandwidth": {"egressRate": 1000, "egressBurst": 34_359_738_360u64}}}),
                "burst cannot be more than 4GB (runtimeConfig.bandwidth.egressBurst is 34359738360 bits)",
            ),
            (
                json!({"ingressRate": 7, "ingressBurst": 80}),
                "ingressRate is 7: a rate must be at least 8 bits per second (one byte)",
            ),
            (
                json!({"ingressRate": 8, "ingressBurst": 7}),
                "ingressBurst is 7: a burst must be at least 8 bits (one byte)",
            ),
            (
                json!({"ingressRate": -1, "ingressBurst": 8}),
                "failed to parse network configuration: ingressRate must be a whole number of bits from 0 to 18446744073709551615, not -1",
            ),
            (
                json!({"egressRate": 1.5}),
                "failed to parse network configuration: egressRate must be a whole number of bits from 0 to 18446744073709551615, not 1.5",
            ),
            (
                json!({"egressRate": "8M"}),
                "failed to parse network configuration: egressRate must be a whole number of bits from 0 to 18446744073709551615, not \"8M\"",
            ),
            (
                json!({"runtimeConfig": {"bandwidth": 5}}),
                "failed to parse network configuration: runtimeConfig.bandwidth must be an object, not 5",
            ),
        ];
        for (conf, want) in cases {
            assert_eq!(limits(conf.clone()).unwrap_err(), want, "{conf}");
        }
        // Just under 4 GB is fine.
        let max = json!({"ingressRate": 8, "ingressBurst": 34_359_738_359u64});
        assert!(limits(max).is_ok());
    }

    /// containerd's runtime config for the annotations `10M` both ways.
    fn containerd_10m(extra: Value) -> Value {
        let mut conf = json!({"runtimeConfig": {"bandwidth": {
            "ingressRate": 10_000_000, "ingressBurst": u64::from(u32::MAX),
            "egressRate": 10_000_000, "egressBurst": u64::from(u32::MAX),
        }}});
        if let (Some(c), Some(e)) = (conf.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        conf
    }

    fn bursts(conf: Value, mtu: u32) -> (u64, u64) {
        let l = limits(conf).unwrap().for_mtu(mtu);
        (l.ingress.unwrap().burst, l.egress.unwrap().burst)
    }

    #[test]
    fn without_a_cap_the_runtimes_burst_is_kept() {
        let huge = u64::from(u32::MAX);
        assert_eq!(bursts(containerd_10m(json!({})), 1500), (huge, huge));
    }

    #[test]
    fn max_burst_caps_the_runtimes_burst() {
        let conf = containerd_10m(json!({"maxBurst": 200_000}));
        assert_eq!(bursts(conf, 1500), (200_000, 200_000));
        // A smaller burst from the runtime stays as it is.
        let small = json!({"maxBurst": 200_000, "runtimeConfig": {"bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 80_000}}});
        assert_eq!(limits(small).unwrap().for_mtu(1500).ingress, Some(MBIT8));
    }

    #[test]
    fn max_burst_ms_caps_at_the_rate_with_a_floor_of_packets() {
        // 20 ms of 10 Mbit/s.
        let conf = containerd_10m(json!({"maxBurstMs": 20}));
        assert_eq!(bursts(conf.clone(), 1500), (200_000, 200_000));
        // 20 ms of 1 Mbit/s is under 4 packets: the floor, of the veth's MTU.
        let slow = json!({"maxBurstMs": 20, "runtimeConfig": {"bandwidth": {"egressRate": 1_000_000, "egressBurst": 4_294_967_295u64}}});
        let floor = |mtu: u64| MIN_BURST_PACKETS * mtu * 8;
        assert_eq!(
            limits(slow.clone())
                .unwrap()
                .for_mtu(1500)
                .egress
                .unwrap()
                .burst,
            floor(1500)
        );
        assert_eq!(
            limits(slow).unwrap().for_mtu(9000).egress.unwrap().burst,
            floor(9000)
        );
        // Both keys: the smaller cap.
        let both = containerd_10m(json!({"maxBurstMs": 20, "maxBurst": 100_000}));
        assert_eq!(bursts(both, 1500), (100_000, 100_000));
        // 40 Gbit/s for a minute does not overflow.
        let fast = json!({"maxBurstMs": 60_000, "runtimeConfig": {"bandwidth": {"ingressRate": 40_000_000_000u64, "ingressBurst": 80_000}}});
        assert_eq!(
            limits(fast).unwrap().for_mtu(1500).ingress.unwrap().burst,
            80_000
        );
    }

    #[test]
    fn a_burst_in_the_config_itself_is_not_capped() {
        let conf = json!({"maxBurst": 20_000, "maxBurstMs": 1, "ingressRate": 8_000_000, "ingressBurst": 80_000});
        assert_eq!(limits(conf).unwrap().for_mtu(1500).ingress, Some(MBIT8));
    }

    #[test]
    fn bad_caps_are_refused_naming_the_key() {
        let bits = "failed to parse network configuration: maxBurst must be a whole number of bits (one 1500-byte packet to just under 4 GB) from 12000 to 34359738359, not";
        let ms = "failed to parse network configuration: maxBurstMs must be a whole number of milliseconds from 1 to 60000, not";
        let cases = [
            (json!({"maxBurst": -1}), format!("{bits} -1")),
            (json!({"maxBurst": "1M"}), format!("{bits} \"1M\"")),
            (json!({"maxBurst": 1.5}), format!("{bits} 1.5")),
            (json!({"maxBurst": 11_999}), format!("{bits} 11999")),
            (
                json!({"maxBurst": 34_359_738_360u64}),
                format!("{bits} 34359738360"),
            ),
            (json!({"maxBurstMs": 0}), format!("{ms} 0")),
            (json!({"maxBurstMs": 60_001}), format!("{ms} 60001")),
            (json!({"maxBurstMs": true}), format!("{ms} true")),
        ];
        for (conf, want) in cases {
            // Refused with or without limits, so a mistake shows on the first ADD.
            assert_eq!(limits(conf.clone()).unwrap_err(), want, "{conf}");
        }
        assert!(limits(json!({"maxBurst": 12_000, "maxBurstMs": 60_000})).is_ok());
        assert!(limits(json!({"maxBurst": 34_359_738_359u64})).is_ok());
    }

    #[test]
    fn token_buckets_have_the_reference_parameters() {
        // tc shows the reference's bucket for 8 Mbit/s and 80000 bits as
        // "rate 8Mbit burst 10000b lat 25ms": 10 ms of 1 MB/s in 1/64 µs ticks.
        let tbf = token_bucket(MBIT8, 15.625);
        assert_eq!(
            (tbf.rate, tbf.limit, tbf.buffer),
            (1_000_000, 35_000, 156_250)
        );
        assert_eq!((tbf.burst, tbf.rate_table), (None, None));
        // 40 Gbit/s: the rate needs 64 bits; a 1 MB burst is 25 µs.
        let fast = token_bucket(
            Shape {
                rate: 40_000_000_000,
                burst: 8_000_000,
            },
            15.625,
        );
        assert_eq!(
            (fast.rate, fast.limit, fast.buffer),
            (5_000_000_000, 126_000_000, 3_125)
        );
        // containerd's burst (2^32 - 1 bits) at 10 Mbit/s: 429 s, 6.7e9 ticks, which
        // wraps in 32 bits as in the reference.
        let huge = token_bucket(
            Shape {
                rate: 10_000_000,
                burst: u64::from(u32::MAX),
            },
            15.625,
        );
        assert_eq!(huge.buffer, 2_415_919_079);
        // At 1 byte/s and a burst near 4 GB the microseconds overflow 32 bits and
        // wrap, as the reference's do.
        let slow = token_bucket(
            Shape {
                rate: 8,
                burst: 34_359_738_352,
            },
            15.625,
        );
        assert_eq!(slow.rate, 1);
        assert_eq!(slow.limit, 4_294_967_294);
        assert_eq!(
            slow.buffer,
            go_u32(f64::from(go_u32(4_294_967_294.0 * 1e6)) * 15.625)
        );
    }

    #[test]
    fn ifb_names_are_the_reference_hash() {
        // Made by the reference for network "net1" and container "ctr1".
        assert_eq!(ifb_name("net1", "ctr1"), "bwp85373d34c684");
        assert_eq!(ifb_name("net1", "ctr1").len(), 15);
        assert_ne!(ifb_name("net1", "ctr2"), ifb_name("net1", "ctr1"));
    }
}
