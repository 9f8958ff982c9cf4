//! The network configuration on stdin: the keys every plugin shares, Go-style
//! case-insensitive key matching, and typed decoding of a plugin's own keys.

use crate::env::validate_network_name;
use crate::error::{CniError, ErrorCode};
use crate::json::json_kind;
use crate::result::CniResult;
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
        check_common_types(&raw)?;
        let text = |key: &str| {
            raw.get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let name = text("name");
        validate_network_name(&name)?;
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
    /// absent means no attachment is valid (and the operator's log says so).
    pub fn valid_attachments(&self) -> Result<Vec<Attachment>, CniError> {
        let list = self
            .raw
            .get("cni.dev/valid-attachments")
            .or_else(|| self.raw.get("cni.dev/attachments"));
        let Some(list) = list.filter(|v| !v.is_null()) else {
            // Some tools send GC without any list: every attachment is then stale.
            crate::log::info(&format!(
                "GC without cni.dev/valid-attachments: releasing everything on network {}",
                self.name
            ));
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
    /// depth case-insensitively and treating `null` members as absent (as Go's decoder
    /// does). On failure the error names the offending key by its path
    /// (`ipam.ranges[0][0].subnet: invalid type: ...`), code 6; plugins add their own
    /// prefix.
    pub fn decode<T: DeserializeOwned>(&self, known: &[&str]) -> Result<T, CniError> {
        let mut value = self.raw.clone();
        canonicalize_keys(&mut value, known);
        drop_null_members(&mut value);
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let msg = if path == "." {
                inner.to_string()
            } else {
                format!("{path}: {inner}")
            };
            CniError::new(ErrorCode::DECODING_FAILURE, msg)
        })
    }
}

/// Refuses common keys of the wrong JSON type (code 6, key named) instead of reading them
/// as absent: `"cniVersion": 1` must not silently mean 0.1.0. `null` is absent, as in Go.
fn check_common_types(raw: &Value) -> Result<(), CniError> {
    let wrong = |path: &str, value: &Value, want: &str| {
        let prefix = if path == "cniVersion" {
            "decoding version from network config"
        } else {
            "error unmarshall network config"
        };
        Err(CniError::new(
            ErrorCode::DECODING_FAILURE,
            format!(
                "{prefix}: json: cannot unmarshal {} into Go struct field .{path} of type {want}",
                json_kind(value)
            ),
        ))
    };
    let member = |parent: &Value, key: &str| parent.get(key).filter(|v| !v.is_null()).cloned();
    for key in ["cniVersion", "name", "type"] {
        if let Some(v) = member(raw, key).filter(|v| !v.is_string()) {
            return wrong(key, &v, "string");
        }
    }
    for key in [
        "ipam",
        "dns",
        "args",
        "runtimeConfig",
        "capabilities",
        "prevResult",
    ] {
        if let Some(v) = member(raw, key).filter(|v| !v.is_object()) {
            return wrong(key, &v, "object");
        }
    }
    if let Some(mut ipam) = member(raw, "ipam") {
        canonicalize_keys(&mut ipam, &["type"]);
        if let Some(v) = member(&ipam, "type").filter(|v| !v.is_string()) {
            return wrong("ipam.type", &v, "string");
        }
    }
    if let Some(caps) = member(raw, "capabilities").and_then(|c| c.as_object().cloned()) {
        for (name, v) in &caps {
            if !v.is_boolean() && !v.is_null() {
                return wrong(&format!("capabilities.{name}"), v, "bool");
            }
        }
    }
    if let Some(mut dns) = member(raw, "dns") {
        canonicalize_keys(&mut dns, &["nameservers", "domain", "search", "options"]);
        if let Some(v) = member(&dns, "domain").filter(|v| !v.is_string()) {
            return wrong("dns.domain", &v, "string");
        }
        for key in ["nameservers", "search", "options"] {
            let Some(v) = member(&dns, key) else { continue };
            let strings = v
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string));
            if !strings {
                return wrong(&format!("dns.{key}"), &v, "[]string");
            }
        }
    }
    Ok(())
}

/// Removes object members whose value is `null`, at every depth: Go's decoder leaves the
/// field at its zero value for them, serde would refuse them for non-`Option` fields.
fn drop_null_members(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_null_members);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_null_members),
        _ => {}
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

pub use crate::ip::parse_cidr;

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
    fn common_keys_of_the_wrong_type_are_refused_by_name() {
        let cases: [(&str, &str); 9] = [
            (
                r#"{"cniVersion": 1, "name": "n"}"#,
                "decoding version from network config: json: cannot unmarshal number into Go struct field .cniVersion of type string",
            ),
            (
                r#"{"name": 5}"#,
                "error unmarshall network config: json: cannot unmarshal number into Go struct field .name of type string",
            ),
            (r#"{"name": "n", "Type": true}"#, ".type of type string"),
            (
                r#"{"name": "n", "ipam": "host-local"}"#,
                ".ipam of type object",
            ),
            (
                r#"{"name": "n", "ipam": {"TYPE": 7}}"#,
                ".ipam.type of type string",
            ),
            (
                r#"{"name": "n", "dns": {"nameservers": "x"}}"#,
                ".dns.nameservers of type []string",
            ),
            (
                r#"{"name": "n", "dns": {"search": [1]}}"#,
                ".dns.search of type []string",
            ),
            (
                r#"{"name": "n", "capabilities": {"mac": "yes"}}"#,
                ".capabilities.mac of type bool",
            ),
            (
                r#"{"name": "n", "prevResult": []}"#,
                "cannot unmarshal array into Go struct field .prevResult of type object",
            ),
        ];
        for (input, msg) in cases {
            let err = NetConf::parse(input.as_bytes()).unwrap_err();
            assert_eq!(err.code, ErrorCode::DECODING_FAILURE, "{input}");
            assert!(err.msg.contains(msg), "{input}: {}", err.msg);
        }
        let nulls = NetConf::parse(
            br#"{"name": "n", "cniVersion": null, "ipam": null, "dns": {"domain": null}}"#,
        )
        .unwrap();
        assert_eq!(nulls.cni_version, "0.1.0");
    }

    #[test]
    fn decode_names_the_bad_key_and_ignores_nulls() {
        #[derive(Debug, Deserialize)]
        struct Conf {
            #[serde(rename = "isGateway", default)]
            _is_gateway: bool,
            #[serde(default)]
            _ipam: Option<Ipam>,
        }
        #[derive(Debug, Deserialize)]
        struct Ipam {
            #[serde(default)]
            _ranges: Vec<Vec<String>>,
        }
        let null = NetConf::parse(br#"{"name": "n", "isGateway": null}"#).unwrap();
        assert!(null.decode::<Conf>(&["isGateway"]).is_ok());
        let bad = NetConf::parse(br#"{"name": "n", "ISGATEWAY": "yes"}"#).unwrap();
        let err = bad.decode::<Conf>(&["isGateway"]).unwrap_err();
        assert_eq!(err.code, ErrorCode::DECODING_FAILURE);
        assert!(
            err.msg.starts_with("isGateway: invalid type: string"),
            "{err}"
        );
        let nested = NetConf::parse(br#"{"name": "n", "_ipam": {"_ranges": [["a", 5]]}}"#).unwrap();
        let err = nested.decode::<Conf>(&[]).unwrap_err();
        assert!(
            err.msg.starts_with("_ipam._ranges[0][1]: invalid type"),
            "{err}"
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
