//! Talking to `nft` (for the MAC spoof check): reading rule sets as JSON and
//! applying transactions.
//!
//! Rules are deleted by handle, and handles are only visible in listings, so
//! every change starts with a JSON listing (`nft -j list ...`). A whole change
//! is then sent as one `nft -j -f -` run: nft applies a file as a single
//! kernel transaction, so concurrent plugin processes never see half of a
//! change.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::exec;

const NFT: &str = "nft";

/// A chain as listed by `nft -j`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chain {
    pub(crate) name: String,
}

/// A rule as listed by `nft -j`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rule {
    pub(crate) chain: String,
    pub(crate) handle: u64,
    pub(crate) comment: Option<String>,
    /// The rule's statements in nft's JSON schema, compared structurally.
    pub(crate) expr: Vec<Value>,
}

impl Rule {
    /// Target of the rule's `jump`/`goto` statement, if any.
    pub(crate) fn jump_target(&self) -> Option<&str> {
        self.expr.iter().find_map(|stmt| {
            ["jump", "goto"]
                .iter()
                .find_map(|verb| stmt.get(verb)?.get("target")?.as_str())
        })
    }
}

/// Chains and rules of one `nft -j list` answer.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Listing {
    pub(crate) chains: Vec<Chain>,
    pub(crate) rules: Vec<Rule>,
}

impl Listing {
    pub(crate) fn has_chain(&self, name: &str) -> bool {
        self.chains.iter().any(|c| c.name == name)
    }

    pub(crate) fn rules_in<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a Rule> + 'a {
        self.rules.iter().filter(move |r| r.chain == chain)
    }
}

/// Parses the JSON printed by `nft -j list ...`.
pub(crate) fn parse_listing(json: &str, target: &str) -> Result<Listing> {
    let bad = |detail: String| Error::Parse {
        program: NFT.into(),
        target: target.into(),
        detail,
    };
    let root: Value = serde_json::from_str(json).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let items = root
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no \"nftables\" array".into()))?;
    let mut listing = Listing::default();
    for item in items {
        if let Some(chain) = item.get("chain") {
            let name = chain
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("chain without name: {chain}")))?;
            listing.chains.push(Chain { name: name.into() });
        } else if let Some(rule) = item.get("rule") {
            let chain = rule.get("chain").and_then(Value::as_str);
            let handle = rule.get("handle").and_then(Value::as_u64);
            let (Some(chain), Some(handle)) = (chain, handle) else {
                return Err(bad(format!("rule without chain or handle: {rule}")));
            };
            listing.rules.push(Rule {
                chain: chain.into(),
                handle,
                comment: rule.get("comment").and_then(Value::as_str).map(Into::into),
                expr: rule
                    .get("expr")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            });
        }
    }
    Ok(listing)
}

/// `nft` says this when the listed table or chain does not exist.
fn is_not_found(err: &Error) -> bool {
    matches!(err, Error::Command { stderr, .. } if stderr.contains("No such file or directory"))
}

/// Lists `object` (e.g. `["table", "inet", "t"]`); `None` when it does not
/// exist.
pub(crate) fn list(object: &[&str]) -> Result<Option<Listing>> {
    let target = object.join(" ");
    let mut args = vec!["-j", "list"];
    args.extend_from_slice(object);
    match exec::run(NFT, &args, None, &target) {
        Ok(out) => parse_listing(&out, &target).map(Some),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Applies a JSON command batch as one transaction.
pub(crate) fn apply_json(batch: &Value, target: &str) -> Result<()> {
    let text = batch.to_string();
    exec::run(NFT, &["-j", "-f", "-"], Some(text.as_bytes()), target).map(drop)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Captured from nft 1.0.6: `nft -j list table inet cni_plugins_masquerade`
    /// after a setup of two attachments.
    pub(crate) const MASQ_TABLE_JSON: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "cni_plugins_masquerade", "handle": 1}}, {"chain": {"family": "inet", "table": "cni_plugins_masquerade", "name": "masq_checks", "handle": 1}}, {"chain": {"family": "inet", "table": "cni_plugins_masquerade", "name": "postrouting", "handle": 2, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}}, {"rule": {"family": "inet", "table": "cni_plugins_masquerade", "chain": "masq_checks", "handle": 6, "comment": "e47d63df51ce7720-2a2f354c438bf177, net: nftnet, if: eth1, id: ctrG", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "10.77.0.2"}}, {"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": {"prefix": {"addr": "10.77.0.0", "len": 24}}}}, {"masquerade": null}]}}, {"rule": {"family": "inet", "table": "cni_plugins_masquerade", "chain": "masq_checks", "handle": 7, "comment": "e47d63df51ce7720-2a2f354c438bf177, net: nftnet, if: eth1, id: ctrG", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip6", "field": "saddr"}}, "right": "fd00:77::2"}}, {"match": {"op": "!=", "left": {"payload": {"protocol": "ip6", "field": "daddr"}}, "right": {"prefix": {"addr": "fd00:77::", "len": 64}}}}, {"masquerade": null}]}}, {"rule": {"family": "inet", "table": "cni_plugins_masquerade", "chain": "masq_checks", "handle": 11, "comment": "e47d63df51ce7720-0123456789abcdef, net: nftnet, if: eth0, id: other", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "10.77.0.3"}}, {"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": {"prefix": {"addr": "10.77.0.0", "len": 24}}}}, {"masquerade": null}]}}, {"rule": {"family": "inet", "table": "cni_plugins_masquerade", "chain": "postrouting", "handle": 8, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": {"prefix": {"addr": "224.0.0.0", "len": 4}}}}, {"return": null}]}}, {"rule": {"family": "inet", "table": "cni_plugins_masquerade", "chain": "postrouting", "handle": 9, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip6", "field": "daddr"}}, "right": {"prefix": {"addr": "ff00::", "len": 8}}}}, {"return": null}]}}, {"rule": {"family": "inet", "table": "cni_plugins_masquerade", "chain": "postrouting", "handle": 10, "expr": [{"goto": {"target": "masq_checks"}}]}}]}"#;

    #[test]
    fn parses_captured_listing() {
        let l = parse_listing(MASQ_TABLE_JSON, "t").unwrap();
        assert_eq!(
            l.chains,
            vec![
                Chain {
                    name: "masq_checks".into()
                },
                Chain {
                    name: "postrouting".into()
                }
            ]
        );
        assert_eq!(l.rules.len(), 6);
        let handles: Vec<u64> = l.rules_in("masq_checks").map(|r| r.handle).collect();
        assert_eq!(handles, vec![6, 7, 11]);
        assert_eq!(
            l.rules[0].comment.as_deref(),
            Some("e47d63df51ce7720-2a2f354c438bf177, net: nftnet, if: eth1, id: ctrG")
        );
        assert_eq!(l.rules[3].comment, None);
        assert_eq!(l.rules[5].jump_target(), Some("masq_checks"));
        assert_eq!(l.rules[0].jump_target(), None);
        assert!(l.has_chain("postrouting"));
        assert!(!l.has_chain("nope"));
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_listing("not json", "t").is_err());
        assert!(parse_listing("{}", "t").is_err());
        let e = parse_listing(r#"{"nftables":[{"rule":{"chain":"x"}}]}"#, "table x").unwrap_err();
        assert!(
            e.to_string()
                .contains("unexpected output from nft (table x)"),
            "{e}"
        );
    }

    #[test]
    fn not_found_is_recognised() {
        let e = Error::Command {
            program: "nft".into(),
            target: "t".into(),
            status: "exit status: 1".into(),
            stderr: "Error: No such file or directory\nlist table inet x\n".into(),
        };
        assert!(is_not_found(&e));
        assert!(!is_not_found(&Error::UnknownBackend("x".into())));
    }
}
