//! The network configuration on stdin: the keys every plugin shares, Go-style
//! case-insensitive key matching, and typed decoding of a plugin's own keys.

use crate::env::is_valid_identifier;
use crate::error::{CniError, ErrorCode};
use crate::result::CniResult;
use ipnetwork::IpNetwork;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Keys every plugin understands, in their canonical spelling.
pub const COMMON_KEYS: &[&str] = &[
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
];

/// An attachment named in a GC request's valid list.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attachment {
    /// Container id.
    pub container_id: String,
    /// Interface name inside the container.
    pub ifname: String,
}

/// The parsed network configuration.
#[derive(Debug, Clone)]
pub struct NetConf {
    /// `cniVersion`; absent means 0.1.0.
    pub cni_version: String,
    /// Network name.
    pub name: String,
    /// Plugin type.
    pub plugin_type: String,
    /// `ipam.type`, empty when there is none.
    pub ipam_type: String,
    /// `prevResult`, parsed and held in the 1.x model.
    pub prev_result: Option<CniResult>,
    /// The whole config with known keys in canonical spelling.
    pub raw: Value,
}

impl NetConf {
    /// Parses stdin bytes: JSON object (code 6 otherwise) with a valid `name` (code 7).
    pub fn parse(bytes: &[u8]) -> Result<Self, CniError> {
        let mut raw: Value = serde_json::from_slice(bytes).map_err(|e| {
            CniError::new(
                ErrorCode::DECODING_FAILURE,
                format!("error unmarshall network config: {e}"),
            )
        })?;
        if !raw.is_object() {
            return Err(CniError::new(
                ErrorCode::DECODING_FAILURE,
                "error unmarshall network config: not a JSON object",
            ));
        }
        canonicalize_keys(&mut raw, COMMON_KEYS);
        let text = |key: &str| {
            raw.get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let name = text("name");
        if name.is_empty() {
            return Err(CniError::new(
                ErrorCode::INVALID_NETWORK_CONFIG,
                "missing network name",
            ));
        }
        if !is_valid_identifier(&name) {
            return Err(CniError::new(
                ErrorCode::INVALID_NETWORK_CONFIG,
                "invalid characters found in network name",
            )
            .with_details(name));
        }
        let mut cni_version = text("cniVersion");
        if cni_version.is_empty() {
            cni_version = "0.1.0".into();
        }
        let ipam_type = raw
            .get("ipam")
            .map(|ipam| {
                let mut ipam = ipam.clone();
                canonicalize_keys(&mut ipam, &["type"]);
                ipam.get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            })
            .unwrap_or_default();
        Ok(Self {
            plugin_type: text("type"),
            ipam_type,
            prev_result: None,
            name,
            cni_version,
            raw,
        })
    }

    /// Parses `prevResult` (in the config's version unless it names its own).
    pub fn load_prev_result(&mut self) -> Result<(), CniError> {
        self.prev_result = match self.raw.get("prevResult") {
            None | Some(Value::Null) => None,
            Some(v) => Some(CniResult::parse(v, &self.cni_version).map_err(|e| {
                CniError::new(e.code, format!("could not parse prevResult: {}", e.msg))
            })?),
        };
        Ok(())
    }

    /// The GC valid list: `cni.dev/valid-attachments`, else the older `cni.dev/attachments`;
    /// absent means no attachment is valid.
    pub fn valid_attachments(&self) -> Result<Vec<Attachment>, CniError> {
        let list = self
            .raw
            .get("cni.dev/valid-attachments")
            .or_else(|| self.raw.get("cni.dev/attachments"));
        let Some(list) = list.filter(|v| !v.is_null()) else {
            return Ok(Vec::new());
        };
        let items = list.as_array().ok_or_else(|| {
            CniError::new(
                ErrorCode::DECODING_FAILURE,
                "cni.dev/valid-attachments must be a list",
            )
        })?;
        items
            .iter()
            .map(|item| {
                let mut item = item.clone();
                canonicalize_keys(&mut item, &["containerID", "ifname"]);
                let field = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_string);
                match (field("containerID"), field("ifname")) {
                    (Some(container_id), Some(ifname)) => Ok(Attachment {
                        container_id,
                        ifname,
                    }),
                    _ => Err(CniError::new(
                        ErrorCode::DECODING_FAILURE,
                        format!("invalid entry in cni.dev/valid-attachments: {item}"),
                    )),
                }
            })
            .collect()
    }

    /// Decodes the whole config into a plugin's own type, matching `known` keys at any
    /// depth case-insensitively (as Go's decoder does). On failure the error is the
    /// decoder's text; plugins add their own prefix.
    pub fn decode<T: DeserializeOwned>(&self, known: &[&str]) -> Result<T, String> {
        let mut value = self.raw.clone();
        canonicalize_keys(&mut value, known);
        serde_json::from_value(value).map_err(|e| e.to_string())
    }
}

/// Renames, at every depth, object keys that equal one of `known` ignoring ASCII case to
/// that spelling. When several spellings of one key appear, the last one wins, like Go.
pub fn canonicalize_keys(value: &mut Value, known: &[&str]) {
    match value {
        Value::Object(map) => {
            let old = std::mem::take(map);
            let mut renamed = Map::with_capacity(old.len());
            for (key, mut child) in old {
                canonicalize_keys(&mut child, known);
                let key = if known.contains(&key.as_str()) {
                    key
                } else {
                    known
                        .iter()
                        .find(|k| k.eq_ignore_ascii_case(&key))
                        .map_or(key, |k| (*k).to_string())
                };
                renamed.insert(key, child);
            }
            *map = renamed;
        }
        Value::Array(items) => items.iter_mut().for_each(|v| canonicalize_keys(v, known)),
        _ => {}
    }
}

/// Parses `ip/prefix` keeping host bits (like Go's `ParseCIDR` + IP); an IPv4-mapped IPv6
/// address becomes IPv4, as Go does.
pub fn parse_cidr(text: &str) -> Option<IpNetwork> {
    let (ip, prefix) = text.split_once('/')?;
    let ip: std::net::IpAddr = ip.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) if prefix >= 96 => IpNetwork::new(v4.into(), prefix - 96).ok(),
            _ => IpNetwork::new(ip, prefix).ok(),
        },
        v4 => IpNetwork::new(v4, prefix).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn parse_errors_have_reference_codes() {
        let cases: [(&str, u32, &str); 5] = [
            ("{", 6, "error unmarshall network config: "),
            ("[]", 6, "error unmarshall network config: "),
            ("{}", 7, "missing network name"),
            (r#"{"name": ""}"#, 7, "missing network name"),
            (
                r#"{"name": "x/y"}"#,
                7,
                "invalid characters found in network name",
            ),
        ];
        for (input, code, msg) in cases {
            let err = NetConf::parse(input.as_bytes()).unwrap_err();
            assert_eq!(err.code.0, code, "{input}");
            assert!(err.msg.starts_with(msg), "{input}: {}", err.msg);
        }
        assert_eq!(
            NetConf::parse(br#"{"name": "x/y"}"#).unwrap_err().details,
            "x/y"
        );
    }

    #[test]
    fn defaults_and_case_insensitive_keys() {
        let conf = NetConf::parse(
            br#"{"NAME": "net1", "Type": "bridge", "IPAM": {"TYPE": "host-local"}}"#,
        )
        .unwrap();
        assert_eq!(conf.name, "net1");
        assert_eq!(conf.cni_version, "0.1.0");
        assert_eq!(conf.plugin_type, "bridge");
        assert_eq!(conf.ipam_type, "host-local");
    }

    #[test]
    fn last_spelling_wins() {
        let mut v: Value =
            serde_json::from_str(r#"{"isGateway": false, "ISGATEWAY": true}"#).unwrap();
        canonicalize_keys(&mut v, &["isGateway"]);
        assert_eq!(v, serde_json::json!({"isGateway": true}));
    }

    #[test]
    fn decode_plugin_keys() {
        #[derive(Deserialize)]
        struct Conf {
            #[serde(rename = "isGateway", default)]
            is_gateway: bool,
            #[serde(rename = "runtimeConfig", default)]
            runtime_config: Value,
        }
        let conf =
            NetConf::parse(br#"{"name": "n", "IsGateway": true, "RuntimeConfig": {"mac": "x"}}"#)
                .unwrap();
        let c: Conf = conf.decode(&["isGateway", "runtimeConfig"]).unwrap();
        assert!(c.is_gateway);
        assert_eq!(c.runtime_config["mac"], "x");
        let bad = NetConf::parse(br#"{"name": "n", "isGateway": "yes"}"#).unwrap();
        assert!(bad.decode::<Conf>(&["isGateway"]).is_err());
    }

    #[test]
    fn gc_attachments_from_either_key() {
        let conf = NetConf::parse(
            br#"{"name": "n", "cni.dev/attachments": [{"containerID": "a", "ifname": "eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(
            conf.valid_attachments().unwrap(),
            vec![Attachment {
                container_id: "a".into(),
                ifname: "eth0".into()
            }]
        );
        let both = NetConf::parse(
            br#"{"name": "n", "cni.dev/valid-attachments": [], "cni.dev/attachments": [{"containerID": "a", "ifname": "eth0"}]}"#,
        )
        .unwrap();
        assert!(both.valid_attachments().unwrap().is_empty());
        assert!(
            NetConf::parse(br#"{"name": "n"}"#)
                .unwrap()
                .valid_attachments()
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn prev_result_parsed_in_config_version() {
        let mut conf = NetConf::parse(
            br#"{"name": "n", "cniVersion": "0.2.0", "prevResult": {"ip4": {"ip": "10.0.0.2/24"}}}"#,
        )
        .unwrap();
        conf.load_prev_result().unwrap();
        assert_eq!(
            conf.prev_result.unwrap().ips[0].address.to_string(),
            "10.0.0.2/24"
        );
    }

    #[test]
    fn cidr_parsing() {
        assert_eq!(
            parse_cidr("10.0.0.5/24").unwrap().to_string(),
            "10.0.0.5/24"
        );
        assert_eq!(
            parse_cidr("::ffff:10.0.0.5/120").unwrap().to_string(),
            "10.0.0.5/24"
        );
        assert!(parse_cidr("10.0.0.5").is_none());
        assert!(parse_cidr("10.0.0.5/33").is_none());
    }
}
