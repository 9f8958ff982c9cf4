//! JSON text as the reference plugins print it, so tests can compare stdout byte for byte.
//!
//! Go's `json.MarshalIndent(v, "", "    ")` (used for results and errors) differs from
//! compact JSON in whitespace only, plus two details reproduced here: `<`, `>`, `&`, U+2028
//! and U+2029 inside strings are written as `\u003c`-style escapes, and there is no
//! trailing newline. Key order is whatever order the value holds (serde_json's
//! `preserve_order` is on in this workspace), so expected values are written in the order
//! the reference prints: struct order for 0.x results, sorted for 1.x (see [`sorted`]).

use serde_json::Value;
use serde_json::ser::{PrettyFormatter, Serializer};

/// `value` rendered like Go's `json.MarshalIndent(value, "", "    ")`.
pub fn go_pretty(value: &Value) -> String {
    let mut out = Vec::new();
    let mut ser = Serializer::with_formatter(&mut out, PrettyFormatter::with_indent(b"    "));
    serde::Serialize::serialize(value, &mut ser)
        .unwrap_or_else(|e| panic!("serializing a serde_json::Value cannot fail: {e}"));
    let text = String::from_utf8(out).unwrap_or_default();
    // These characters can only occur inside strings, so replacing them everywhere is
    // exactly Go's HTML-safe string escaping.
    text.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// A copy of `value` with the keys of every object sorted, as Go prints a map (the
/// 1.0.0/1.1.0 results go through a map in the reference).
pub fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), sorted(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn go_pretty_matches_marshal_indent_output() {
        // Text as printed by the reference loopback plugin, key order kept.
        let value = json!({
            "code": 4,
            "msg": "a <b> & c",
            "details": "",
            "list": [{"x": 1}, []],
            "empty": {}
        });
        let expected = "{\n    \"code\": 4,\n    \"msg\": \"a \\u003cb\\u003e \\u0026 c\",\n    \
                        \"details\": \"\",\n    \"list\": [\n        {\n            \"x\": 1\n        },\n        \
                        []\n    ],\n    \"empty\": {}\n}";
        assert_eq!(go_pretty(&value), expected);
    }

    #[test]
    fn sorted_orders_nested_keys() {
        let value = json!({"b": [{"z": 1, "a": 2}], "a": {"d": 1, "c": 2}});
        assert_eq!(
            serde_json::to_string(&sorted(&value)).unwrap(),
            r#"{"a":{"c":2,"d":1},"b":[{"a":2,"z":1}]}"#
        );
    }
}
