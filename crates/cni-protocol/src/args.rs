//! `CNI_ARGS` (`K=V;K2=V2`) parsing with the reference's `IgnoreUnknown` rule.

use crate::error::CniError;
use crate::version::go_quoted_list;

/// The recognised keys' values of one `CNI_ARGS` string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
}

impl CniArgs {
    /// Parses `text`, accepting only the keys in `known` (matched case-sensitively, like
    /// the reference's Go field names) plus `IgnoreUnknown`. Unknown keys are an error
    /// unless `IgnoreUnknown` is true.
    pub fn parse(text: &str, known: &[&str]) -> Result<Self, CniError> {
        let mut pairs = Vec::new();
        let mut unknown = Vec::new();
        let mut ignore_unknown = false;
        if text.is_empty() {
            return Ok(Self { pairs });
        }
        for pair in text.split(';') {
            let parts: Vec<&str> = pair.split('=').collect();
            let [key, value] = parts[..] else {
                return Err(CniError::internal(format!("ARGS: invalid pair {pair:?}")));
            };
            if key == "IgnoreUnknown" {
                ignore_unknown = parse_bool(value)
                    .ok_or_else(|| CniError::internal(format!("ARGS: error parsing value of pair {pair:?}: boolean unmarshal error: invalid input {value}")))?;
            } else if known.contains(&key) {
                pairs.push((key.to_string(), value.to_string()));
            } else {
                unknown.push(pair.to_string());
            }
        }
        if !unknown.is_empty() && !ignore_unknown {
            return Err(CniError::internal(format!(
                "ARGS: unknown args {}",
                go_quoted_list(&unknown)
            )));
        }
        Ok(Self { pairs })
    }

    /// The value of `key`, the last one when repeated.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The reference's `UnmarshallableBool`: `1`/`true`, `0`/`false`, any case.
fn parse_bool(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "true" => Some(true),
        "0" | "false" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let cases: [(&str, Result<Option<&str>, &str>); 9] = [
            ("", Ok(None)),
            ("IP=10.0.0.5", Ok(Some("10.0.0.5"))),
            (
                "IgnoreUnknown=1;K8S_POD_NAME=x;IP=10.0.0.5",
                Ok(Some("10.0.0.5")),
            ),
            ("K8S_POD_NAME=x;IgnoreUnknown=true", Ok(None)),
            ("FOO=bar", Err(r#"ARGS: unknown args ["FOO=bar"]"#)),
            (
                "ip=1.2.3.4;X=y",
                Err(r#"ARGS: unknown args ["ip=1.2.3.4" "X=y"]"#),
            ),
            (
                "FOO=bar;IgnoreUnknown=0",
                Err(r#"ARGS: unknown args ["FOO=bar"]"#),
            ),
            ("IP=1;", Err(r#"ARGS: invalid pair """#)),
            ("A=b=c", Err(r#"ARGS: invalid pair "A=b=c""#)),
        ];
        for (text, want) in cases {
            let got = CniArgs::parse(text, &["IP"]);
            match want {
                Ok(ip) => assert_eq!(got.unwrap().get("IP"), ip, "{text}"),
                Err(msg) => assert_eq!(got.unwrap_err().msg, msg, "{text}"),
            }
        }
        assert!(CniArgs::parse("IgnoreUnknown=maybe", &[]).is_err());
    }
}
