//! JSON as the reference plugins print it (4-space indentation, no trailing newline)
//! and as Go's decoder names its types in errors.

use serde::Serialize;
use serde_json::Value;

/// Pretty-prints a value with 4-space indentation, as Go's `json.MarshalIndent(v, "", "    ")`.
pub fn to_pretty(value: &impl Serialize) -> String {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    value
        .serialize(&mut ser)
        .expect("serializing an in-memory JSON value cannot fail");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// Sorts object keys at every level, as Go does when it marshals a `map[string]interface{}`.
pub fn sort_keys(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

/// The JSON type of a value in the words of Go's decoder errors (`cannot unmarshal
/// number into ...`): `null`, `bool`, `number`, `string`, `array`, `object`.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn four_space_indent_no_newline() {
        assert_eq!(
            to_pretty(&json!({"a": [1], "b": {}})),
            "{\n    \"a\": [\n        1\n    ],\n    \"b\": {}\n}"
        );
    }

    #[test]
    fn sorts_nested_keys() {
        let sorted = sort_keys(json!({"b": {"z": 1, "a": 2}, "a": [{"y": 1, "x": 2}]}));
        assert_eq!(
            serde_json::to_string(&sorted).unwrap(),
            r#"{"a":[{"x":2,"y":1}],"b":{"a":2,"z":1}}"#
        );
    }
}
