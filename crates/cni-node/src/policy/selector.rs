//! Label selectors as NetworkPolicy uses them (`matchLabels` and `matchExpressions`
//! with `In`, `NotIn`, `Exists`, `DoesNotExist`), read defensively: a selector the
//! agent cannot read exactly is an error the caller decides about, never a guess.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Unreadable;

/// Labels of an object.
pub type Labels = BTreeMap<String, String>;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Requirement {
    /// `key` has one of the values (`matchLabels` entries are `In` with one value).
    In(String, Vec<String>),
    /// `key` is absent or has none of the values.
    NotIn(String, Vec<String>),
    /// `key` is present.
    Exists(String),
    /// `key` is absent.
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &Labels) -> bool {
        match self {
            Self::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Self::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Self::Exists(key) => labels.contains_key(key),
            Self::DoesNotExist(key) => !labels.contains_key(key),
        }
    }
}

/// A label selector: every requirement must hold; no requirement selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector(pub Vec<Requirement>);

impl Selector {
    /// Whether `labels` are selected.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.0.iter().all(|r| r.matches(labels))
    }

    /// Whether it selects everything.
    pub fn is_everything(&self) -> bool {
        self.0.is_empty()
    }

    /// Reads a `LabelSelector` object; `null` or `{}` select everything.
    pub fn parse(value: &Value) -> Result<Self, Unreadable> {
        let object = match value {
            Value::Null => return Ok(Self::default()),
            Value::Object(object) => object,
            other => return Err(Unreadable::of_type("the selector", "an object", other)),
        };
        let mut requirements = Vec::new();
        match object.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (key, value) in labels {
                    let Some(text) = value.as_str() else {
                        return Err(Unreadable::of_type(
                            format!("matchLabels {key:?}"),
                            "a string",
                            value,
                        ));
                    };
                    let value = text;
                    requirements.push(Requirement::In(key.clone(), vec![value.to_owned()]));
                }
            }
            Some(other) => {
                return Err(Unreadable::of_type("matchLabels", "an object", other));
            }
        }
        match object.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(expressions)) => {
                for e in expressions {
                    requirements.push(expression(e)?);
                }
            }
            Some(other) => {
                return Err(Unreadable::of_type("matchExpressions", "a list", other));
            }
        }
        requirements.sort();
        requirements.dedup();
        Ok(Self(requirements))
    }
}

fn expression(e: &Value) -> Result<Requirement, Unreadable> {
    let key = e
        .get("key")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| Unreadable::NoKey(super::short(e)))?
        .to_owned();
    let values: Vec<String> = match e.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(values)) => values
            .iter()
            .map(|v| {
                v.as_str().map(str::to_owned).ok_or_else(|| {
                    Unreadable::of_type(format!("matchExpression {key:?}'s value"), "a string", v)
                })
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(Unreadable::of_type(
                format!("matchExpression {key:?}'s values"),
                "a list",
                other,
            ));
        }
    };
    let operator = e.get("operator").and_then(Value::as_str).unwrap_or("");
    let requirement = match operator {
        "In" | "NotIn" if values.is_empty() => {
            return Err(Unreadable::Operator {
                key,
                operator: operator.to_owned(),
                why: "needs at least one value",
            });
        }
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            return Err(Unreadable::Operator {
                key,
                operator: operator.to_owned(),
                why: "takes no values",
            });
        }
        "In" => Requirement::In(key, sorted(values)),
        "NotIn" => Requirement::NotIn(key, sorted(values)),
        "Exists" => Requirement::Exists(key),
        "DoesNotExist" => Requirement::DoesNotExist(key),
        other => {
            return Err(Unreadable::Operator {
                key,
                operator: other.to_owned(),
                why: "is an unknown operator",
            });
        }
    };
    Ok(requirement)
}

fn sorted(mut values: Vec<String>) -> Vec<String> {
    values.sort();
    values.dedup();
    values
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(v: Value) -> Selector {
        Selector::parse(&v).unwrap()
    }

    #[test]
    fn empty_and_null_select_everything() {
        assert!(sel(json!({})).matches(&labels(&[])));
        assert!(sel(Value::Null).is_everything());
    }

    #[test]
    fn match_labels_and_every_operator() {
        let s = sel(json!({
            "matchLabels": {"pod": "a"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["web", "api"]},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "team", "operator": "Exists"},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        }));
        let ok = labels(&[("pod", "a"), ("tier", "api"), ("team", "x")]);
        assert!(s.matches(&ok));
        for bad in [
            labels(&[("pod", "b"), ("tier", "api"), ("team", "x")]),
            labels(&[("pod", "a"), ("tier", "db"), ("team", "x")]),
            labels(&[
                ("pod", "a"),
                ("tier", "api"),
                ("team", "x"),
                ("env", "prod"),
            ]),
            labels(&[("pod", "a"), ("tier", "api")]),
            labels(&[("pod", "a"), ("tier", "api"), ("team", "x"), ("legacy", "")]),
        ] {
            assert!(!s.matches(&bad), "{bad:?}");
        }
        // NotIn holds for an absent key.
        assert!(
            sel(
                json!({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["p"]}]})
            )
            .matches(&labels(&[]))
        );
    }

    #[test]
    fn malformed_selectors_are_errors_naming_the_part() {
        for (v, want) in [
            (json!("x"), "not an object"),
            (json!({"matchLabels": {"a": 1}}), "matchLabels \"a\""),
            (json!({"matchLabels": []}), "matchLabels is not an object"),
            (json!({"matchExpressions": {}}), "not a list"),
            (
                json!({"matchExpressions": [{"operator": "Exists"}]}),
                "without a key",
            ),
            (
                json!({"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1"]}]}),
                "unknown operator",
            ),
            (
                json!({"matchExpressions": [{"key": "k", "operator": "In"}]}),
                "at least one value",
            ),
            (
                json!({"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["v"]}]}),
                "takes no values",
            ),
            (
                json!({"matchExpressions": [{"key": "k", "operator": "In", "values": [1]}]}),
                "not a string",
            ),
        ] {
            let e = Selector::parse(&v).unwrap_err().to_string();
            assert!(e.contains(want), "{v}: {e}");
        }
    }
}
