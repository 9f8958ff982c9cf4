//! The portmap plugin's configuration: the reference's keys and defaults,
//! `runtimeConfig.portMappings`, and the container addresses taken from
//! `prevResult`. Every mistake is a code-7 error naming the key and value.

use std::net::IpAddr;

use cni_firewall::Backend;
use cni_firewall::hostport::{DEFAULT_MARK_BIT, Mapping, Protocol, Snat};
use cni_protocol::config::canonicalize_keys;
use cni_protocol::{CniError, CniResult};
use ipnetwork::IpNetwork;
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

fn bool_key(raw: &Value, key: &str) -> Result<Option<bool>, CniError> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(CniError::invalid_config(format!(
            "{key} must be true or false, not {other}"
        ))),
    }
}

fn strings_key(raw: &Value, key: &str) -> Result<Vec<String>, CniError> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str().map(str::to_owned).ok_or_else(|| {
                    CniError::invalid_config(format!("{key} must be a list of strings, not {item}"))
                })
            })
            .collect(),
        Some(other) => Err(CniError::invalid_config(format!(
            "{key} must be a list of strings, not {other}"
        ))),
    }
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

fn port(entry: &Value, key: &str, index: usize) -> Result<u16, CniError> {
    let value = entry.get(key).unwrap_or(&Value::Null);
    let what = if key == "hostPort" {
        "host"
    } else {
        "container"
    };
    match value.as_i64() {
        Some(n) if (1..=65535).contains(&n) => Ok(n as u16),
        Some(n) => Err(CniError::invalid_config(format!(
            "Invalid {what} port number: {n} (runtimeConfig.portMappings[{index}].{key} must be 1-65535)"
        ))),
        None => Err(CniError::invalid_config(format!(
            "runtimeConfig.portMappings[{index}].{key} must be a port number, not {value}"
        ))),
    }
}

fn mapping(entry: &Value, index: usize) -> Result<Mapping, CniError> {
    if !entry.is_object() {
        return Err(CniError::invalid_config(format!(
            "runtimeConfig.portMappings[{index}] must be an object, not {entry}"
        )));
    }
    let protocol = match entry.get("protocol") {
        None | Some(Value::Null) => Protocol::Tcp,
        Some(Value::String(p)) if p.is_empty() => Protocol::Tcp,
        Some(Value::String(p)) => Protocol::parse(p).ok_or_else(|| {
            CniError::invalid_config(format!(
                "runtimeConfig.portMappings[{index}].protocol {p:?} is not tcp, udp or sctp"
            ))
        })?,
        Some(other) => {
            return Err(CniError::invalid_config(format!(
                "runtimeConfig.portMappings[{index}].protocol must be a string, not {other}"
            )));
        }
    };
    let host_ip = match entry.get("hostIP") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(s.parse::<IpAddr>().map_err(|_| {
            CniError::invalid_config(format!(
                "runtimeConfig.portMappings[{index}].hostIP {s:?} is not an IP address"
            ))
        })?),
        Some(other) => {
            return Err(CniError::invalid_config(format!(
                "runtimeConfig.portMappings[{index}].hostIP must be a string, not {other}"
            )));
        }
    };
    Ok(Mapping {
        host_port: port(entry, "hostPort", index)?,
        container_port: port(entry, "containerPort", index)?,
        protocol,
        host_ip,
    })
}

/// `runtimeConfig.portMappings`, empty when absent.
fn mappings(raw: &Value) -> Result<Vec<Mapping>, CniError> {
    let Some(list) = raw
        .get("runtimeConfig")
        .and_then(|rc| rc.get("portMappings"))
        .filter(|v| !v.is_null())
    else {
        return Ok(Vec::new());
    };
    let items = list.as_array().ok_or_else(|| {
        CniError::invalid_config(format!(
            "runtimeConfig.portMappings must be a list, not {list}"
        ))
    })?;
    items
        .iter()
        .enumerate()
        .map(|(i, entry)| mapping(entry, i))
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
        let raw = &raw;
        let snat_on = bool_key(raw, "snat")?.unwrap_or(true);
        let masq_all = bool_key(raw, "masqAll")?.unwrap_or(false);
        let mark_bit = match raw.get("markMasqBit") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_i64() {
                Some(n) if (0..=31).contains(&n) => Some(n as u8),
                _ => {
                    return Err(CniError::invalid_config(format!(
                        "MasqMarkBit must be between 0 and 31 (markMasqBit is {v})"
                    )));
                }
            },
        };
        let external = match raw.get("externalSetMarkChain") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && !s.contains(char::is_whitespace) => {
                Some(s.clone())
            }
            Some(other) => {
                return Err(CniError::invalid_config(format!(
                    "externalSetMarkChain must be a chain name, not {other}"
                )));
            }
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
        let conditions_v4 = strings_key(raw, "conditionsV4")?;
        let conditions_v6 = strings_key(raw, "conditionsV6")?;
        let backend = match raw.get("backend") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.parse::<Backend>().map_err(|_| {
                CniError::invalid_config(format!(
                    "unrecognized backend {s:?} (backend must be \"iptables\" or \"nftables\")"
                ))
            })?),
            Some(other) => {
                return Err(CniError::invalid_config(format!(
                    "backend must be \"iptables\" or \"nftables\", not {other}"
                )));
            }
        };
        let config = Config {
            external_chain_set: raw
                .get("externalSetMarkChain")
                .is_some_and(|v| !v.is_null()),
            mappings: mappings(raw)?,
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
