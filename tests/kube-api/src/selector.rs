//! Label and field selectors, parsed and applied as the API server does
//! (k8s.io/apimachinery's `labels.Parse` and `fields.ParseSelector`), and the
//! [`Filter`] a list or watch request makes of them and its path's namespace.

use std::collections::BTreeMap;

use crate::kind::Kind;
use crate::store::Object;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One term of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        let number = |v: &String| v.parse::<i64>().ok();
        match self.op {
            Op::Equals | Op::In => value.is_some_and(|v| self.values.contains(v)),
            Op::NotEquals | Op::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Op::Exists => value.is_some(),
            Op::DoesNotExist => value.is_none(),
            Op::GreaterThan | Op::LessThan => {
                let (Some(have), Some(want)) = (value.and_then(number), number(&self.values[0]))
                else {
                    return false;
                };
                if self.op == Op::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

/// A label selector: every requirement must hold (a comma is AND).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Identifier(String),
    /// `!` before a key.
    Not,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    In,
    NotIn,
    Open,
    Close,
    Comma,
}

fn lex(text: &str) -> Vec<Token> {
    let special = |c: char| c.is_whitespace() || "!=,()<>".contains(c);
    let mut tokens = Vec::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if c.is_whitespace() {
            rest = &rest[c.len_utf8()..];
            continue;
        }
        let (token, len) = match c {
            '!' if rest.starts_with("!=") => (Token::NotEquals, 2),
            '!' => (Token::Not, 1),
            '=' if rest.starts_with("==") => (Token::DoubleEquals, 2),
            '=' => (Token::Equals, 1),
            '>' => (Token::GreaterThan, 1),
            '<' => (Token::LessThan, 1),
            '(' => (Token::Open, 1),
            ')' => (Token::Close, 1),
            ',' => (Token::Comma, 1),
            _ => {
                let len = rest.find(special).unwrap_or(rest.len());
                let word = &rest[..len];
                let token = match word {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Identifier(word.to_owned()),
                };
                (token, len)
            }
        };
        tokens.push(token);
        rest = &rest[len..];
    }
    tokens
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    /// A key; `in` and `notin` are keys too where a key is expected.
    fn key(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Token::Identifier(key)) => Ok(key),
            Some(Token::In) => Ok("in".into()),
            Some(Token::NotIn) => Ok("notin".into()),
            other => Err(format!("found {other:?}, expected: identifier")),
        }
    }

    /// A single value: an identifier, or nothing (`k=` means the empty value).
    fn value(&mut self) -> Result<String, String> {
        match self.peek() {
            Some(Token::Identifier(_) | Token::In | Token::NotIn) => self.key(),
            None | Some(Token::Comma) => Ok(String::new()),
            other => Err(format!("found {other:?}, expected: identifier")),
        }
    }

    /// `(a,b,...)`; `()` is the set of the empty value, as the API server reads it.
    fn set(&mut self) -> Result<Vec<String>, String> {
        if self.next() != Some(Token::Open) {
            return Err("expected '(' after in/notin".into());
        }
        let mut values = Vec::new();
        loop {
            let value = match self.peek() {
                Some(Token::Identifier(_) | Token::In | Token::NotIn) => self.key()?,
                _ => String::new(),
            };
            values.push(value);
            match self.next() {
                Some(Token::Comma) => {}
                Some(Token::Close) => return Ok(values),
                other => return Err(format!("found {other:?}, expected: ',' or ')'")),
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        if self.peek() == Some(&Token::Not) {
            self.next();
            let key = self.key()?;
            return Ok(Requirement {
                key,
                op: Op::DoesNotExist,
                values: Vec::new(),
            });
        }
        let key = self.key()?;
        let op = match self.peek() {
            None | Some(Token::Comma) => {
                return Ok(Requirement {
                    key,
                    op: Op::Exists,
                    values: Vec::new(),
                });
            }
            Some(Token::Equals | Token::DoubleEquals) => Op::Equals,
            Some(Token::NotEquals) => Op::NotEquals,
            Some(Token::In) => Op::In,
            Some(Token::NotIn) => Op::NotIn,
            Some(Token::GreaterThan) => Op::GreaterThan,
            Some(Token::LessThan) => Op::LessThan,
            Some(other) => return Err(format!("found {other:?}, expected an operator")),
        };
        self.next();
        let values = match op {
            Op::In | Op::NotIn => self.set()?,
            Op::GreaterThan | Op::LessThan => {
                let value = self.value()?;
                if value.parse::<i64>().is_err() {
                    return Err(format!(
                        "for 'gt', 'lt' operators, the value must be an integer, got {value:?}"
                    ));
                }
                vec![value]
            }
            _ => vec![self.value()?],
        };
        Ok(Requirement { key, op, values })
    }
}

impl LabelSelector {
    /// Parses the `labelSelector` parameter: `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
    /// `k notin (a,b)`, `k`, `!k`, `k>1`, `k<1`, joined by commas. The error text is
    /// what a 400 answer says.
    pub fn parse(text: &str) -> Result<Self, String> {
        let tokens = lex(text);
        let mut parser = Parser { tokens, at: 0 };
        let mut requirements = Vec::new();
        if parser.peek().is_none() {
            return Ok(Self(requirements));
        }
        loop {
            requirements.push(
                parser
                    .requirement()
                    .map_err(|e| format!("unable to parse requirement: {e}"))?,
            );
            match parser.next() {
                None => return Ok(Self(requirements)),
                Some(Token::Comma) if parser.peek().is_some() => {}
                other => {
                    return Err(format!(
                        "unable to parse requirement: found {other:?} after a requirement, expected: ','"
                    ));
                }
            }
        }
    }

    /// Whether `labels` satisfy every requirement (the empty selector matches all).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| r.matches(labels))
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A field selector: `field=value`, `field==value`, `field!=value`, joined by commas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// Splits on commas not escaped with a backslash, and unescapes `\,`, `\=`, `\\`.
fn split_terms(text: &str) -> Vec<String> {
    let mut terms = vec![String::new()];
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next()
                    && let Some(term) = terms.last_mut()
                {
                    if !matches!(next, ',' | '=' | '\\' | '!') {
                        term.push('\\');
                    }
                    // Keep an escaped '=' or '!' from being read as an operator.
                    term.push(if matches!(next, '=' | '!') {
                        escape_mark(next)
                    } else {
                        next
                    });
                }
            }
            ',' => terms.push(String::new()),
            c => {
                if let Some(term) = terms.last_mut() {
                    term.push(c);
                }
            }
        }
    }
    terms
}

/// Private-use stand-ins for escaped operator characters while a term is split.
fn escape_mark(c: char) -> char {
    if c == '=' { '\u{E000}' } else { '\u{E001}' }
}

fn unmark(text: &str) -> String {
    text.replace('\u{E000}', "=").replace('\u{E001}', "!")
}

impl FieldSelector {
    /// Parses the `fieldSelector` parameter and checks its fields against what `kind`
    /// supports; the error text is what a 400 answer says.
    pub fn parse(text: &str, kind: Kind) -> Result<Self, String> {
        let mut terms = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self(terms));
        }
        for term in split_terms(text) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{text}'; can't understand '{}'",
                    unmark(&term)
                ));
            };
            let field = unmark(field.trim());
            if !kind.selectable_fields().contains(&field.as_str()) {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field, equal, unmark(value)));
        }
        Ok(Self(terms))
    }

    /// Whether `object`'s fields satisfy every term.
    pub fn matches(&self, object: &Object) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            (object.field(field).unwrap_or_default() == value) == *equal
        })
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a list or watch request selects: a namespace from its path, and its selectors.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// The namespace in the request's path, if any.
    pub namespace: Option<String>,
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Filter {
    /// Whether `object` is selected.
    pub fn matches(&self, object: &Object) -> bool {
        self.namespace
            .as_ref()
            .is_none_or(|ns| *ns == object.namespace)
            && self.labels.matches(&object.labels)
            && self.fields.matches(object)
    }

    /// Whether it has selectors beyond the path's namespace (a list then has no
    /// `remainingItemCount`, as the API server's).
    pub fn has_selectors(&self) -> bool {
        !self.labels.is_empty() || !self.fields.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn selects(selector: &str, pairs: &[(&str, &str)]) -> bool {
        LabelSelector::parse(selector)
            .unwrap_or_else(|e| panic!("{selector:?}: {e}"))
            .matches(&labels(pairs))
    }

    #[test]
    fn label_selector_operators() {
        let web = [("app", "web"), ("tier", "front"), ("gen", "3")];
        assert!(selects("", &web));
        assert!(selects("app=web", &web));
        assert!(selects("app==web", &web));
        assert!(!selects("app=db", &web));
        assert!(selects("app!=db", &web));
        assert!(selects("missing!=x", &web), "!= matches an absent label");
        assert!(selects("app in (db,web)", &web));
        assert!(selects("app in(web)", &web));
        assert!(!selects("app in (db)", &web));
        assert!(!selects("missing in (x)", &web));
        assert!(selects("app notin (db, cache)", &web));
        assert!(
            selects("missing notin (x)", &web),
            "notin matches an absent label"
        );
        assert!(!selects("app notin (web)", &web));
        assert!(selects("tier", &web));
        assert!(!selects("missing", &web));
        assert!(selects("!missing", &web));
        assert!(selects(" ! missing ", &web));
        assert!(!selects("!app", &web));
        assert!(selects("gen>2", &web) && !selects("gen>3", &web) && selects("gen<4", &web));
        assert!(selects("app=web,tier in (front),!missing", &web));
        assert!(!selects("app=web,tier=back", &web));
        assert!(selects("app.kubernetes.io/name notin (x)", &web));
        assert!(selects("empty=", &[("empty", "")]));
        assert!(selects("empty in ()", &[("empty", "")]));
    }

    #[test]
    fn label_selector_syntax_errors() {
        for bad in [
            "app=web,",
            ",app",
            "app in web",
            "app in (web",
            "app=(x)",
            "a b",
            "gen>x",
            "=x",
            "!",
        ] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn what_kube_rs_prints_parses_back() {
        // kube-core's Expression::to_string, as watcher::Config::labels_from sends it.
        let text = "app in (a,b),tier notin (x),!legacy";
        assert!(selects(text, &[("app", "b"), ("tier", "y")]));
        assert!(!selects(text, &[("app", "b"), ("legacy", "")]));
    }

    fn pod(name: &str, namespace: &str, node: &str) -> Object {
        let value = serde_json::json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node},
        });
        let mut store = crate::store::Store::default();
        store.apply(Kind::Pod, value).unwrap();
        (**store.get(Kind::Pod, namespace, name).unwrap()).clone()
    }

    #[test]
    fn field_selectors() {
        let p = pod("web-0", "shop", "node-1");
        let sel = |text: &str| FieldSelector::parse(text, Kind::Pod).unwrap().matches(&p);
        assert!(sel(""));
        assert!(sel("spec.nodeName=node-1"));
        assert!(sel("spec.nodeName==node-1"));
        assert!(!sel("spec.nodeName!=node-1"));
        assert!(sel("metadata.namespace=shop,metadata.name=web-0"));
        assert!(sel("metadata.namespace!=default"));
        assert!(sel("spec.hostNetwork=false"));
        assert!(sel("status.phase="));
        assert!(!sel("metadata.name=web-0,spec.nodeName=node-2"));
        assert_eq!(
            FieldSelector::parse("spec.nodeName=x", Kind::Namespace),
            Err("field label not supported: spec.nodeName".into())
        );
        assert_eq!(
            FieldSelector::parse("metadata.namespace=x", Kind::Node),
            Err("field label not supported: metadata.namespace".into())
        );
        assert!(FieldSelector::parse("metadata.name", Kind::Pod).is_err());
        let escaped = FieldSelector::parse(r"metadata.name=a\,b", Kind::Pod).unwrap();
        assert_eq!(
            escaped.0,
            [("metadata.name".to_owned(), true, "a,b".to_owned())]
        );
        let escaped = FieldSelector::parse(r"metadata.name=a\=b", Kind::Pod).unwrap();
        assert_eq!(
            escaped.0,
            [("metadata.name".to_owned(), true, "a=b".to_owned())]
        );
    }
}
