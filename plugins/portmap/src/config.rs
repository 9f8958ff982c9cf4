//! The portmap plugin's configuration: the reference's keys and defaults,
//! `runtimeConfig.portMappings`, and the container addresses taken from
//! `prevResult`. Every mistake is a code-7 error naming the key and value.

use std::net::IpAddr;

use cni_firewall::Backend;
use cni_firewall::hostport::{DEFAULT_MARK_BIT, Mapping, Protocol, Snat};
use cni_protocol::config::canonicalize_keys;
use cni_protocol::{CniError, CniResult};
use ipnetwork::IpNetwork;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// The parsed configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `runtimeConfig.portMappings`.
    pub mappings: Vec<Mapping>,
    /// `snat`, `markMasqBit`, `externalSetMarkChain`, `masqAll`.
    pub snat: Snat,
    /// `backend`, or `None` for the reference's default choice.
    pub backend: Option<Backend>,
    /// `conditionsV4`.
    pub conditions_v4: Vec<String>,
    /// `conditionsV6`.
    pub conditions_v6: Vec<String>,
    /// Whether `externalSetMarkChain` was given (an iptables-only option, also
    /// with `snat: false`).
    pub external_chain_set: bool,
}

/// Every key the plugin reads. Go matches JSON keys ignoring case, and
/// runtimes rely on it: containerd sends `portMappings` entries as
/// `{"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}`.
const KNOWN_KEYS: &[&str] = &[
    "snat",
    "masqAll",
    "markMasqBit",
    "externalSetMarkChain",
    "conditionsV4",
    "conditionsV6",
    "backend",
    "runtimeConfig",
    "portMappings",
    "hostPort",
    "containerPort",
    "protocol",
    "hostIP",
];

/// A member's value: absent (or `null`, as in Go); `T` when the JSON has the type the
/// plugin wants; else the JSON text of what came instead, so that the error can name
/// the key and show the value.
#[derive(Debug, Default)]
enum Member<T> {
    #[default]
    Absent,
    Valid(T),
    Wrong(String),
}

impl<'de, T: FromJson> Deserialize<'de> for Member<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Member::from_json)
    }
}

impl<T: FromJson> Member<T> {
    fn from_json(value: Value) -> Self {
        if value.is_null() {
            return Member::Absent;
        }
        match T::from_json(value) {
            Ok(valid) => Member::Valid(valid),
            Err(other) => Member::Wrong(other.to_string()),
        }
    }
}

/// A type a member's JSON value may have: the value taken as it is when it has
/// that JSON type, else given back.
trait FromJson: Sized {
    fn from_json(value: Value) -> Result<Self, Value>;
}

impl FromJson for bool {
    fn from_json(value: Value) -> Result<Self, Value> {
        value.as_bool().ok_or(value)
    }
}

/// An integer, as Go's decoder reads one into an `int`.
impl FromJson for i64 {
    fn from_json(value: Value) -> Result<Self, Value> {
        value.as_i64().ok_or(value)
    }
}

impl FromJson for String {
    fn from_json(value: Value) -> Result<Self, Value> {
        match value {
            Value::String(s) => Ok(s),
            other => Err(other),
        }
    }
}

impl<T: FromJson> FromJson for Vec<Member<T>> {
    fn from_json(value: Value) -> Result<Self, Value> {
        match value {
            Value::Array(items) => Ok(items.into_iter().map(Member::from_json).collect()),
            other => Err(other),
        }
    }
}

impl<T> Member<T> {
    /// `None` when absent, the value when it has the right type, else a code-7 error
    /// that `message` words from the JSON that came.
    fn or_refuse(self, message: impl FnOnce(&str) -> String) -> Result<Option<T>, CniError> {
        match self {
            Member::Absent => Ok(None),
            Member::Valid(value) => Ok(Some(value)),
            Member::Wrong(json) => Err(CniError::invalid_config(message(&json))),
        }
    }

    /// [`Member::or_refuse`] for a value that must be there: absent is refused as `null`.
    fn required(self, message: impl FnOnce(&str) -> String) -> Result<T, CniError> {
        match self {
            Member::Absent => Err(CniError::invalid_config(message("null"))),
            Member::Valid(value) => Ok(value),
            Member::Wrong(json) => Err(CniError::invalid_config(message(&json))),
        }
    }
}

/// A struct of members, read from a JSON object only (serde also reads a struct from an
/// array).
#[derive(Debug)]
struct Object<T>(T);

impl<T: DeserializeOwned> FromJson for Object<T> {
    fn from_json(value: Value) -> Result<Self, Value> {
        // Every member is read whatever its type, so reading an object does not fail.
        match value.as_object().map(T::deserialize) {
            Some(Ok(valid)) => Ok(Object(valid)),
            _ => Err(value),
        }
    }
}

/// The plugin's keys. A value of the wrong type is read too ([`Member`]), and refused
/// with the key's name by [`Config::parse`].
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawConf {
    snat: Member<bool>,
    #[serde(rename = "masqAll")]
    masq_all: Member<bool>,
    #[serde(rename = "markMasqBit")]
    mark_masq_bit: Member<i64>,
    #[serde(rename = "externalSetMarkChain")]
    external_set_mark_chain: Member<String>,
    #[serde(rename = "conditionsV4")]
    conditions_v4: Member<Vec<Member<String>>>,
    #[serde(rename = "conditionsV6")]
    conditions_v6: Member<Vec<Member<String>>>,
    backend: Member<String>,
    /// Not an object: no mappings (the config parser refuses such a `runtimeConfig`
    /// before the plugin sees it).
    #[serde(rename = "runtimeConfig")]
    runtime_config: Member<Object<RawRuntimeConfig>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawRuntimeConfig {
    #[serde(rename = "portMappings")]
    port_mappings: Member<Vec<Member<Object<RawMapping>>>>,
}

/// One `runtimeConfig.portMappings` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawMapping {
    #[serde(rename = "hostPort")]
    host_port: Member<i64>,
    #[serde(rename = "containerPort")]
    container_port: Member<i64>,
    protocol: Member<String>,
    #[serde(rename = "hostIP")]
    host_ip: Member<String>,
}

/// `key`, a list of strings; empty when absent.
fn strings(member: Member<Vec<Member<String>>>, key: &str) -> Result<Vec<String>, CniError> {
    let refuse = |json: &str| format!("{key} must be a list of strings, not {json}");
    member
        .or_refuse(refuse)?
        .unwrap_or_default()
        .into_iter()
        .map(|item| item.required(refuse))
        .collect()
}

/// The error for a `markMasqBit` (shown as `json`) that is not a mark bit.
fn bad_mark_bit(json: &str) -> CniError {
    CniError::invalid_config(format!(
        "MasqMarkBit must be between 0 and 31 (markMasqBit is {json})"
    ))
}

/// Which backend a condition list is written for: iptables conditions start
/// with `-` or `!` (`-d`, `-m`, `! -s`), nft ones never do (the reference's
/// rule).
fn backend_of_conditions(conditions: &[String]) -> Option<Backend> {
    let first = conditions.first().filter(|c| !c.is_empty())?;
    if first.starts_with('-') || first.starts_with('!') {
        Some(Backend::Iptables)
    } else {
        Some(Backend::Nftables)
    }
}

/// `key` (`hostPort` or `containerPort`) of mapping `index`: 1-65535.
fn port(member: Member<i64>, key: &str, index: usize) -> Result<u16, CniError> {
    let what = if key == "hostPort" {
        "host"
    } else {
        "container"
    };
    let path = format!("runtimeConfig.portMappings[{index}].{key}");
    let n = member.required(|json| format!("{path} must be a port number, not {json}"))?;
    u16::try_from(n).ok().filter(|p| *p != 0).ok_or_else(|| {
        CniError::invalid_config(format!(
            "Invalid {what} port number: {n} ({path} must be 1-65535)"
        ))
    })
}

fn mapping(entry: RawMapping, index: usize) -> Result<Mapping, CniError> {
    let path = format!("runtimeConfig.portMappings[{index}]");
    let protocol = entry
        .protocol
        .or_refuse(|json| format!("{path}.protocol must be a string, not {json}"))?
        .filter(|p| !p.is_empty())
        .map_or(Ok(Protocol::Tcp), |p| {
            Protocol::parse(&p).ok_or_else(|| {
                CniError::invalid_config(format!("{path}.protocol {p:?} is not tcp, udp or sctp"))
            })
        })?;
    let host_ip = entry
        .host_ip
        .or_refuse(|json| format!("{path}.hostIP must be a string, not {json}"))?
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpAddr>().map_err(|_| {
                CniError::invalid_config(format!("{path}.hostIP {s:?} is not an IP address"))
            })
        })
        .transpose()?;
    Ok(Mapping {
        host_port: port(entry.host_port, "hostPort", index)?,
        container_port: port(entry.container_port, "containerPort", index)?,
        protocol,
        host_ip,
    })
}

/// `runtimeConfig.portMappings`, empty when absent.
fn mappings(runtime_config: Member<Object<RawRuntimeConfig>>) -> Result<Vec<Mapping>, CniError> {
    let Member::Valid(Object(runtime_config)) = runtime_config else {
        return Ok(Vec::new());
    };
    let list = runtime_config
        .port_mappings
        .or_refuse(|json| format!("runtimeConfig.portMappings must be a list, not {json}"))?;
    list.unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, entry)| {
            let Object(entry) = entry.required(|json| {
                format!("runtimeConfig.portMappings[{i}] must be an object, not {json}")
            })?;
            mapping(entry, i)
        })
        .collect()
}

impl Config {
    /// Parses the plugin's keys from the whole config.
    pub fn parse(raw: &Value) -> Result<Self, CniError> {
        let mut raw = raw.clone();
        if let Some(obj) = raw.as_object_mut() {
            // prevResult is the previous plugin's, not ours to rename in.
            obj.remove("prevResult");
        }
        canonicalize_keys(&mut raw, KNOWN_KEYS);
        // A config that is not an object holds none of our keys.
        let raw = Object::<RawConf>::from_json(raw).map_or_else(|_| RawConf::default(), |o| o.0);
        let flag = |member: Member<bool>, key: &str| {
            member.or_refuse(|json| format!("{key} must be true or false, not {json}"))
        };
        let snat_on = flag(raw.snat, "snat")?.unwrap_or(true);
        let masq_all = flag(raw.masq_all, "masqAll")?.unwrap_or(false);
        let mark_bit = match raw.mark_masq_bit {
            Member::Absent => None,
            Member::Valid(n) if (0..=31).contains(&n) => Some(n as u8),
            Member::Valid(n) => return Err(bad_mark_bit(&n.to_string())),
            Member::Wrong(json) => return Err(bad_mark_bit(&json)),
        };
        let external_chain_set = !matches!(raw.external_set_mark_chain, Member::Absent);
        let bad_chain =
            |json: &str| format!("externalSetMarkChain must be a chain name, not {json}");
        let external = match raw.external_set_mark_chain.or_refuse(bad_chain)? {
            Some(s) if s.is_empty() || s.contains(char::is_whitespace) => {
                return Err(CniError::invalid_config(bad_chain(
                    &Value::String(s).to_string(),
                )));
            }
            other => other,
        };
        if mark_bit.is_some() && external.is_some() {
            return Err(CniError::invalid_config(
                "Cannot specify externalSetMarkChain and markMasqBit",
            ));
        }
        let snat = match (snat_on, external) {
            (false, _) => Snat::Off,
            (true, Some(chain)) => Snat::External { chain, masq_all },
            (true, None) => Snat::Mark {
                mark_bit: mark_bit.unwrap_or(DEFAULT_MARK_BIT),
                masq_all,
            },
        };
        let conditions_v4 = strings(raw.conditions_v4, "conditionsV4")?;
        let conditions_v6 = strings(raw.conditions_v6, "conditionsV6")?;
        let backend = raw
            .backend
            .or_refuse(|json| format!("backend must be \"iptables\" or \"nftables\", not {json}"))?
            .map(|s| {
                s.parse::<Backend>().map_err(|_| {
                    CniError::invalid_config(format!(
                        "unrecognized backend {s:?} (backend must be \"iptables\" or \"nftables\")"
                    ))
                })
            })
            .transpose()?;
        let config = Config {
            external_chain_set,
            mappings: mappings(raw.runtime_config)?,
            snat,
            backend,
            conditions_v4,
            conditions_v6,
        };
        config.check_backend_keys()?;
        // nft conditions are nft source text, which only `nft` compiles; this
        // plugin speaks netlink, and refuses them rather than ignore them.
        if let Some((_, key)) = config
            .backend_options()
            .into_iter()
            .find(|(b, key)| *b == Backend::Nftables && key.starts_with("conditions"))
        {
            return Err(CniError::invalid_config(format!(
                "{key} with nftables conditions is not supported; use \"backend\": \"iptables\" with iptables conditions"
            )));
        }
        Ok(config)
    }

    /// The options that belong to one backend, by the backend they name.
    fn backend_options(&self) -> Vec<(Backend, &'static str)> {
        let mut out = Vec::new();
        if self.external_chain_set {
            out.push((Backend::Iptables, "externalSetMarkChain"));
        }
        for (conditions, key) in [
            (&self.conditions_v4, "conditionsV4"),
            (&self.conditions_v6, "conditionsV6"),
        ] {
            if let Some(backend) = backend_of_conditions(conditions) {
                out.push((backend, key));
            }
        }
        out
    }

    /// Refuses options of the other backend than the one named (the
    /// reference's check); without `backend`, the options decide it.
    fn check_backend_keys(&self) -> Result<(), CniError> {
        let Some(backend) = self.backend else {
            return Ok(());
        };
        let wrong: Vec<&str> = self
            .backend_options()
            .into_iter()
            .filter(|(b, _)| *b != backend)
            .map(|(_, key)| key)
            .collect();
        if wrong.is_empty() {
            return Ok(());
        }
        let other = match backend {
            Backend::Iptables => Backend::Nftables,
            Backend::Nftables => Backend::Iptables,
        };
        Err(CniError::invalid_config(format!(
            "{backend} backend was requested but configuration contains {other}-specific options {wrong:?}"
        )))
    }

    /// The backend to use: `backend`, else the one the options are written
    /// for, else the reference's default (iptables unless only nftables works).
    pub fn backend(&self) -> Backend {
        self.backend
            .or_else(|| self.backend_options().first().map(|(b, _)| *b))
            .unwrap_or_else(Backend::detect)
    }

    /// The conditions for a container address of `ip`'s family.
    pub fn conditions(&self, ip: IpAddr) -> &[String] {
        if ip.is_ipv4() {
            &self.conditions_v4
        } else {
            &self.conditions_v6
        }
    }
}

/// The container's first IPv4 and first IPv6 address from `prevResult`,
/// skipping addresses of interfaces that are not `ifname` in a sandbox (the
/// reference's choice).
pub fn container_addresses(prev: &CniResult, ifname: &str) -> Vec<IpNetwork> {
    let mut v4 = None;
    let mut v6 = None;
    for ip in &prev.ips {
        let slot = if ip.address.is_ipv4() {
            &mut v4
        } else {
            &mut v6
        };
        if slot.is_some() {
            continue;
        }
        if let Some(iface) = ip.interface.and_then(|i| prev.interfaces.get(i))
            && (iface.name != ifname || iface.sandbox.is_empty())
        {
            continue;
        }
        *slot = Some(ip.address);
    }
    v4.into_iter().chain(v6).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_protocol::ErrorCode;
    use serde_json::json;

    fn parse(raw: Value) -> Result<Config, CniError> {
        Config::parse(&raw)
    }

    #[test]
    fn defaults_are_the_references() {
        let c = parse(json!({"name": "n", "type": "portmap"})).unwrap();
        assert_eq!(
            c.snat,
            Snat::Mark {
                mark_bit: 13,
                masq_all: false
            }
        );
        assert!(c.mappings.is_empty());
        assert_eq!(c.backend, None);
    }

    #[test]
    fn keys_match_ignoring_case_as_in_go() {
        let c = parse(json!({"SNAT": false, "RuntimeConfig": {"PortMappings": [
            {"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}
        ]}}))
        .unwrap();
        assert_eq!(c.snat, Snat::Off);
        assert_eq!(c.mappings.len(), 1);
        assert_eq!(c.mappings[0].host_port, 8080);
        assert_eq!(c.mappings[0].host_ip, None);
    }

    #[test]
    fn mappings_are_parsed() {
        let c = parse(json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "TCP"},
            {"hostPort": 53, "containerPort": 5353, "protocol": "udp", "hostIP": "fd00::1"},
            {"hostPort": 9, "containerPort": 9}
        ]}}))
        .unwrap();
        assert_eq!(c.mappings.len(), 3);
        assert_eq!(c.mappings[0].protocol, Protocol::Tcp);
        assert_eq!(c.mappings[1].host_ip, Some("fd00::1".parse().unwrap()));
        assert_eq!(c.mappings[2].protocol, Protocol::Tcp);
    }

    #[test]
    fn mistakes_are_code_7_and_name_the_key() {
        for (raw, words) in [
            (json!({"markMasqBit": 32}), "markMasqBit is 32"),
            (
                json!({"markMasqBit": 1, "externalSetMarkChain": "X"}),
                "Cannot specify externalSetMarkChain and markMasqBit",
            ),
            (json!({"snat": "yes"}), "snat must be true or false"),
            (json!({"backend": "pf"}), "unrecognized backend \"pf\""),
            (
                json!({"runtimeConfig": {"portMappings": [{"hostPort": 0, "containerPort": 80}]}}),
                "Invalid host port number: 0",
            ),
            (
                json!({"runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 70000}]}}),
                "portMappings[0].containerPort must be 1-65535",
            ),
            (
                json!({"runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}]}}),
                "protocol \"icmp\" is not tcp, udp or sctp",
            ),
            (
                json!({"runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 80, "hostIP": "x"}]}}),
                "hostIP \"x\" is not an IP address",
            ),
            (
                json!({"backend": "nftables", "conditionsV4": ["-d", "1.2.3.4"]}),
                "configuration contains iptables-specific options [\"conditionsV4\"]",
            ),
            (
                json!({"conditionsV6": "x"}),
                "conditionsV6 must be a list of strings",
            ),
        ] {
            let e = parse(raw.clone()).expect_err(&raw.to_string());
            assert_eq!(e.code, ErrorCode::INVALID_NETWORK_CONFIG, "{raw}");
            assert!(e.msg.contains(words), "{raw}: {}", e.msg);
        }
    }

    #[test]
    fn conditions_choose_the_backend() {
        let raw = json!({"conditionsV4": ["-d", "10.0.0.1"]});
        let c = parse(raw.clone()).unwrap();
        assert_eq!(c.backend(), Backend::Iptables);
        let e = parse(json!({"conditionsV4": ["ip daddr 10.0.0.1"]})).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_NETWORK_CONFIG);
        assert!(e.msg.contains("conditionsV4"), "{}", e.msg);
    }

    #[test]
    fn container_addresses_skip_host_interfaces() {
        let prev = CniResult::parse(
            &json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "cni0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/x"}],
            "ips": [
                {"address": "10.0.0.1/24", "interface": 0},
                {"address": "10.0.0.5/24", "interface": 2},
                {"address": "10.0.0.6/24", "interface": 2},
                {"address": "fd00::5/64", "interface": 2}
            ]
            }),
            "1.0.0",
        )
        .unwrap();
        let got = container_addresses(&prev, "eth0");
        assert_eq!(
            got,
            vec![
                "10.0.0.5/24".parse::<IpNetwork>().unwrap(),
                "fd00::5/64".parse().unwrap()
            ]
        );
    }
}
