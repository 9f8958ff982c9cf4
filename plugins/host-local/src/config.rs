//! host-local's configuration: the keys the reference reads (legacy single range,
//! `ranges`, `routes`, `dataDir`, `resolvConf`, runtime `ipRanges`/`ips`, `args.cni.ips`,
//! `CNI_ARGS` `IP=`), with its canonicalisation order, defaults and messages
//! (reference `allocator.LoadIPAMConfig`), plus our two additions:
//!
//! `ipam.lockTimeout` (number, seconds, fractions allowed, default 30): how long ADD,
//! DEL, CHECK and GC wait for the network's lock before failing with code 11 ("try
//! again later"); `0` means do not wait at all. The reference waits forever.
//!
//! `ipam.releaseOnReboot` (bool, default true): reservations made before the current
//! boot are released ([`crate::reboot`]); off for a `dataDir` not on the node's own disk.

use crate::error::{Error, Result};
use crate::range::{RangeSet, RangeSpec, parse_ip};
use cni_protocol::result::parse_route;
use cni_protocol::{CniArgs, NetConf, Route, Version};
use serde::Deserialize;
use serde_json::Value;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Where reservations live when `dataDir` is not set.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// How long ADD/DEL/CHECK/GC wait for the network's lock when `lockTimeout` is not set.
/// The reference waits forever (plugins#561: thousands of plugins queued behind one hung
/// holder); past this we answer code 11 so the runtime retries later.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// Every key our config types read, in canonical spelling: Go matches JSON keys to struct
/// fields case-insensitively, so these are matched the same way at any depth.
pub const KNOWN_KEYS: &[&str] = &[
    "ipam",
    "subnet",
    "rangeStart",
    "rangeEnd",
    "gateway",
    "ranges",
    "routes",
    "dataDir",
    "resolvConf",
    "lockTimeout",
    "releaseOnReboot",
    "runtimeConfig",
    "ipRanges",
    "ips",
    "args",
    "cni",
];

#[derive(Debug, Default, Deserialize)]
struct RawRange {
    #[serde(default)]
    subnet: Option<String>,
    #[serde(rename = "rangeStart", default)]
    range_start: Option<String>,
    #[serde(rename = "rangeEnd", default)]
    range_end: Option<String>,
    #[serde(default)]
    gateway: Option<String>,
}

impl From<RawRange> for RangeSpec {
    fn from(r: RawRange) -> Self {
        RangeSpec {
            subnet: r.subnet,
            range_start: r.range_start,
            range_end: r.range_end,
            gateway: r.gateway,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct RawIpam {
    #[serde(default)]
    subnet: Option<String>,
    #[serde(rename = "rangeStart", default)]
    range_start: Option<String>,
    #[serde(rename = "rangeEnd", default)]
    range_end: Option<String>,
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    ranges: Option<Vec<Vec<RawRange>>>,
    #[serde(default)]
    routes: Option<Vec<Value>>,
    #[serde(rename = "dataDir", default)]
    data_dir: Option<String>,
    #[serde(rename = "resolvConf", default)]
    resolv_conf: Option<String>,
    #[serde(rename = "lockTimeout", default)]
    lock_timeout: Option<f64>,
    #[serde(rename = "releaseOnReboot", default)]
    release_on_reboot: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct RawRuntime {
    #[serde(rename = "ipRanges", default)]
    ip_ranges: Option<Vec<Vec<RawRange>>>,
    #[serde(default)]
    ips: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
struct RawCniArgs {
    #[serde(default)]
    ips: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
struct RawArgs {
    #[serde(default)]
    cni: Option<RawCniArgs>,
}

#[derive(Debug, Default, Deserialize)]
struct RawNet {
    #[serde(default)]
    ipam: Option<RawIpam>,
    #[serde(rename = "runtimeConfig", default)]
    runtime_config: Option<RawRuntime>,
    #[serde(default)]
    args: Option<RawArgs>,
}

/// The validated configuration of one invocation.
#[derive(Debug, Clone)]
pub struct IpamConfig {
    /// Network name (the state directory's name).
    pub name: String,
    /// Range sets in final order: runtime `ipRanges`, the legacy range, then `ranges`.
    pub range_sets: Vec<RangeSet>,
    /// `ipam.routes`, returned verbatim.
    pub routes: Vec<Route>,
    /// State root.
    pub data_dir: PathBuf,
    /// `resolvConf` file, if any.
    pub resolv_conf: Option<PathBuf>,
    /// Requested addresses, deduplicated, in source order (CNI_ARGS, args, runtimeConfig).
    pub requested: Vec<IpAddr>,
    /// Bound on waiting for the network lock.
    pub lock_timeout: Duration,
    /// `releaseOnReboot` (default true): reservations made before the current boot are
    /// released (see [`crate::reboot`]).
    pub release_on_reboot: bool,
}

/// A requested address: `ip` or `ip/prefix` (the prefix is ignored, as the reference's
/// `ip.IP` type does; we accept it from every source).
fn parse_requested(text: &str) -> Option<IpAddr> {
    let ip = text.split_once('/').map_or(text, |(ip, _)| ip);
    parse_ip(ip.trim())
}

fn range_sets(raw: Vec<Vec<RawRange>>) -> Vec<Vec<RangeSpec>> {
    raw.into_iter()
        .map(|set| set.into_iter().map(RangeSpec::from).collect())
        .collect()
}

impl IpamConfig {
    /// Loads and validates the config of `conf` with `CNI_ARGS` text `cni_args`, in the
    /// reference's order, so the first error reported is the one it would report.
    pub fn load(conf: &NetConf, cni_args: &str) -> Result<Self> {
        let raw: RawNet = conf.decode(KNOWN_KEYS).map_err(Error::Decode)?;
        let ipam = raw.ipam.ok_or(Error::MissingIpam)?;

        let mut requested: Vec<IpAddr> = Vec::new();
        let mut request = |ip: IpAddr| {
            if !requested.contains(&ip) {
                requested.push(ip);
            }
        };
        if !cni_args.is_empty() {
            let args = CniArgs::parse(cni_args, &["IP"])?;
            if let Some(text) = args.get("IP") {
                let ip = parse_requested(text).ok_or_else(|| {
                    Error::Invalid(format!(
                        "ARGS: error parsing value of pair \"IP={text}\": invalid IP address: {text}"
                    ))
                })?;
                request(ip);
            }
        }
        let arg_ips = raw.args.and_then(|a| a.cni).and_then(|c| c.ips);
        for text in arg_ips.unwrap_or_default() {
            request(
                parse_requested(&text)
                    .ok_or_else(|| Error::Invalid(format!("invalid IP address: {text}")))?,
            );
        }
        let runtime = raw.runtime_config.unwrap_or_default();
        for text in runtime.ips.unwrap_or_default() {
            request(
                parse_requested(&text)
                    .ok_or_else(|| Error::Invalid(format!("invalid IP address {text}")))?,
            );
        }

        // Legacy single range first, then runtime ipRanges before everything.
        let mut specs: Vec<Vec<RangeSpec>> = Vec::new();
        if let Some(runtime_ranges) = runtime.ip_ranges {
            specs.extend(range_sets(runtime_ranges));
        }
        if ipam.subnet.as_deref().is_some_and(|s| !s.is_empty()) {
            specs.push(vec![RangeSpec {
                subnet: ipam.subnet,
                range_start: ipam.range_start,
                range_end: ipam.range_end,
                gateway: ipam.gateway,
            }]);
        }
        specs.extend(range_sets(ipam.ranges.unwrap_or_default()));
        if specs.is_empty() {
            return Err(Error::Invalid("no IP ranges specified".into()));
        }

        let mut sets = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let set = RangeSet::canonicalize(spec)
                .map_err(|e| Error::Invalid(format!("invalid range set {i}: {e}")))?;
            sets.push(set);
        }
        let v4 = sets.iter().filter(|s| s.is_v4()).count();
        if v4 > 1 || sets.len() - v4 > 1 {
            let old = Version::parse(&conf.cni_version)
                .map(|v| v < Version::new(0, 3, 0))
                .unwrap_or(true);
            if old {
                let text = conf
                    .raw
                    .get("cniVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                return Err(Error::Invalid(format!(
                    "CNI version {text} does not support more than 1 address per family"
                )));
            }
        }
        for (i, a) in sets.iter().enumerate() {
            for (j, b) in sets.iter().enumerate().skip(i + 1) {
                if a.overlaps(b) {
                    return Err(Error::Invalid(format!("range set {i} overlaps with {j}")));
                }
            }
        }

        let routes = ipam
            .routes
            .unwrap_or_default()
            .iter()
            .map(parse_route)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Error::Decode)?;
        let data_dir = ipam
            .data_dir
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| DEFAULT_DATA_DIR.to_string());
        let lock_timeout = match ipam.lock_timeout {
            None => DEFAULT_LOCK_TIMEOUT,
            Some(secs) => Duration::try_from_secs_f64(secs).map_err(|_| {
                Error::Invalid(format!(
                    "lockTimeout must be a non-negative number of seconds, got {secs}"
                ))
            })?,
        };
        Ok(Self {
            name: conf.name.clone(),
            range_sets: sets,
            routes,
            data_dir: PathBuf::from(data_dir),
            resolv_conf: ipam
                .resolv_conf
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            requested,
            lock_timeout,
            release_on_reboot: ipam.release_on_reboot.unwrap_or(true),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn load(config: &Value, args: &str) -> Result<IpamConfig> {
        let conf = NetConf::parse(config.to_string().as_bytes()).unwrap();
        IpamConfig::load(&conf, args)
    }

    fn load_err(config: &Value, args: &str) -> String {
        load(config, args).unwrap_err().to_string()
    }

    fn net(ipam: &Value) -> Value {
        json!({"cniVersion": "1.0.0", "name": "n", "ipam": ipam})
    }

    #[test]
    fn defaults() {
        let c = load(
            &net(&json!({"type": "host-local", "subnet": "10.1.0.0/16"})),
            "",
        )
        .unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/cni/networks"));
        assert_eq!(c.lock_timeout, DEFAULT_LOCK_TIMEOUT);
        assert_eq!(c.range_sets.len(), 1);
        assert_eq!(c.range_sets[0].to_string(), "10.1.0.1-10.1.255.254");
        assert!(c.requested.is_empty() && c.routes.is_empty() && c.resolv_conf.is_none());
    }

    #[test]
    fn order_of_range_sets_and_case_insensitive_keys() {
        let c = load(
            &json!({
                "cniVersion": "0.4.0", "name": "n",
                "RuntimeConfig": {"IPRanges": [[{"Subnet": "10.3.0.0/24"}]]},
                "IPAM": {
                    "Subnet": "10.1.0.0/24", "RangeStart": "10.1.0.10", "Gateway": "10.1.0.254",
                    "Ranges": [[{"subnet": "10.2.0.0/24"}], [{"subnet": "fd00::/64"}]],
                    "DataDir": "/tmp/x", "LockTimeout": 2.5,
                    "Routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.0.0.0/8", "gw": "10.1.0.1", "mtu": 1400, "advmss": 1360, "priority": 5, "table": 100, "scope": 0}]
                }
            }),
            "",
        )
        .unwrap();
        let texts: Vec<String> = c.range_sets.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "10.3.0.1-10.3.0.254",
                "10.1.0.10-10.1.0.254",
                "10.2.0.1-10.2.0.254",
                "fd00::1-fd00::ffff:ffff:ffff:ffff"
            ]
        );
        assert_eq!(c.range_sets[1].0[0].gateway.to_string(), "10.1.0.254");
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.lock_timeout, Duration::from_millis(2500));
        assert_eq!(c.routes.len(), 2);
        let r = &c.routes[1];
        assert_eq!(
            (r.mtu, r.advmss, r.priority, r.table, r.scope),
            (1400, 1360, 5, Some(100), Some(0))
        );
    }

    #[test]
    fn requested_ips_from_all_three_sources() {
        let c = load(
            &json!({
                "cniVersion": "1.0.0", "name": "n",
                "args": {"cni": {"ips": ["10.1.0.7", "10.1.0.5"]}},
                "runtimeConfig": {"ips": ["fd00::9/64", "::ffff:10.1.0.8"]},
                "ipam": {"ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "fd00::/64"}]]}
            }),
            "IgnoreUnknown=1;K8S_POD_NAME=x;IP=10.1.0.5",
        )
        .unwrap();
        let texts: Vec<String> = c.requested.iter().map(ToString::to_string).collect();
        assert_eq!(texts, ["10.1.0.5", "10.1.0.7", "fd00::9", "10.1.0.8"]);
    }

    #[test]
    fn reference_messages() {
        let one = |ipam: Value| load_err(&net(&ipam), "");
        assert_eq!(
            load_err(&json!({"cniVersion": "1.0.0", "name": "n"}), ""),
            "IPAM config missing 'ipam' key"
        );
        assert_eq!(one(json!({"type": "host-local"})), "no IP ranges specified");
        assert_eq!(
            one(json!({"ranges": [[{"subnet": "10.0.0.0/24"}], []]})),
            "invalid range set 1: empty range set"
        );
        assert_eq!(
            one(json!({"ranges": [[{"subnet": "10.0.0.0/31"}]]})),
            "invalid range set 0: Network 10.0.0.0/31 too small to allocate from"
        );
        assert_eq!(
            one(json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]})),
            "invalid range set 0: mixed address families"
        );
        assert_eq!(
            one(json!({"ranges": [[{"subnet": "10.0.0.0/16"}], [{"subnet": "10.0.1.0/24"}]]})),
            "range set 0 overlaps with 1"
        );
        assert_eq!(
            one(
                json!({"subnet": "10.0.0.0/24", "ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "10.0.0.0/25"}]]})
            ),
            "range set 0 overlaps with 2"
        );
        assert_eq!(
            one(json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.1"}]]})),
            "invalid range set 0: RangeStart 10.0.1.1 not in network 10.0.0.0/24"
        );
        assert_eq!(
            load_err(
                &json!({"cniVersion": "0.2.0", "name": "n", "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}]]}}),
                ""
            ),
            "CNI version 0.2.0 does not support more than 1 address per family"
        );
        assert_eq!(
            load_err(
                &json!({"name": "n", "ipam": {"ranges": [[{"subnet": "fd01::/64"}], [{"subnet": "fd00::/64"}]]}}),
                ""
            ),
            "CNI version  does not support more than 1 address per family"
        );
        // Dual-stack is fine for 0.2.0: one per family.
        assert!(
            load(
                &json!({"cniVersion": "0.2.0", "name": "n", "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]}}),
                ""
            )
            .is_ok()
        );
        let ranges = json!({"ranges": [[{"subnet": "10.0.0.0/24"}]]});
        assert_eq!(
            load_err(&net(&ranges), "ip=10.0.0.5"),
            r#"ARGS: unknown args ["ip=10.0.0.5"]"#
        );
        assert_eq!(
            load_err(&net(&ranges), "IP=10.0.0.x"),
            r#"ARGS: error parsing value of pair "IP=10.0.0.x": invalid IP address: 10.0.0.x"#
        );
        assert_eq!(
            load_err(
                &json!({"cniVersion": "1.0.0", "name": "n", "args": {"cni": {"ips": ["bad"]}}, "ipam": ranges.clone()}),
                ""
            ),
            "invalid IP address: bad"
        );
        assert_eq!(
            load_err(
                &net(&json!({"ranges": [[{"subnet": "10.0.0.0/24"}]], "lockTimeout": -1})),
                ""
            ),
            "lockTimeout must be a non-negative number of seconds, got -1"
        );
        assert!(load(&net(&json!({"ranges": "x"})), "").is_err());
    }

    #[test]
    fn args_error_keeps_protocol_code() {
        let conf = NetConf::parse(
            net(&json!({"subnet": "10.0.0.0/24"}))
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        let err = IpamConfig::load(&conf, "FOO=bar").unwrap_err();
        let cni = cni_protocol::CniError::from(err);
        assert_eq!(
            (cni.code.0, cni.msg.as_str()),
            (999, r#"ARGS: unknown args ["FOO=bar"]"#)
        );
    }
}
