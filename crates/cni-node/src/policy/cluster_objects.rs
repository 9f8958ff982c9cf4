//! ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`, network-policy-api
//! v0.2.0) read defensively into [`ClusterPolicyInfo`]: what cannot be read becomes a
//! problem of the policy, named once in the log, never a failed list or a panic, and
//! is read the way the API defines failing closed:
//!
//! - a rule with a peer or protocol entry the agent cannot read (no field it knows, a
//!   field of the wrong shape, a selector or CIDR it cannot parse), or whose peer list
//!   cannot be read, *fails closed*: as an `Accept` rule it matches nothing, as a `Deny`
//!   or `Pass` rule it matches all traffic and denies it;
//! - a rule whose `action` cannot be read is a `Deny` that fails closed;
//! - a policy whose `tier`, `priority` or `subject` cannot be read is placed first (the
//!   Admin tier, priority 0) over every pod, with each of its `Accept` rules matching
//!   nothing and each `Pass` rule denying instead: it can only close, never open.
//!
//! `domainNames` peers are read but resolve to nothing: the agent does not snoop DNS,
//! so such a peer matches no address (it is only allowed in `Accept` rules, so this
//! closes).

use ipnetwork::IpNetwork;
use serde_json::Value;

use super::objects::{SCTP, SlimClusterNetworkPolicy, TCP, UDP, parse_cidr};
use super::pipeline::Tier;
use super::selector::Selector;
use crate::logging::short;
use crate::store::Watched;

/// The highest priority the API allows.
pub const MAX_PRIORITY: u32 = 1000;

/// A rule's `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Allowed for this direction (the other end's side is judged on its own).
    Accept,
    /// Dropped.
    Deny,
    /// The rest of this tier is skipped; the next tier judges.
    Pass,
}

/// Which pods a policy applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// Every pod of the namespaces selected.
    Namespaces(Selector),
    /// The pods selected in the namespaces selected.
    Pods {
        /// The namespaces.
        namespaces: Selector,
        /// The pods in them.
        pods: Selector,
    },
}

/// One entry of a rule's `from` or `to`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClusterPeer {
    /// Every pod of the namespaces selected.
    Namespaces(Selector),
    /// The pods selected in the namespaces selected.
    Pods {
        /// The namespaces.
        namespaces: Selector,
        /// The pods in them.
        pods: Selector,
    },
    /// Any address in one of the CIDRs (pod and node addresses too); egress only.
    Networks(Vec<IpNetwork>),
    /// The addresses of the Nodes selected; egress only.
    Nodes(Selector),
    /// Domain names: not resolved by the agent, they match nothing.
    DomainNames,
}

/// Which destination ports of one protocol an entry of `protocols` matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterPort {
    /// Every port of `protocol`, or `first..=last` of it.
    Numbers {
        /// IP protocol number.
        protocol: u8,
        /// The first port.
        first: u16,
        /// The last port (inclusive).
        last: u16,
    },
    /// A named container port of the destination pod, of the connection's protocol.
    Named(String),
}

/// One ingress or egress rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRule {
    /// The rule's `name` (`""` when it has none).
    pub name: String,
    /// What it does when it matches.
    pub action: Action,
    /// The peers; one of them must hold the address at the other end.
    pub peers: Vec<ClusterPeer>,
    /// `None`: all traffic. `Some(list)`: one entry must match.
    pub protocols: Option<Vec<ClusterPort>>,
    /// Something of it could not be read: as an `Accept` it matches nothing, as a
    /// `Deny` or `Pass` it matches everything and denies.
    pub failed_closed: bool,
}

/// What the agent keeps of one ClusterNetworkPolicy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPolicyInfo {
    /// `metadata.name`.
    pub name: String,
    /// Admin or Baseline.
    pub tier: Tier,
    /// 0 to [`MAX_PRIORITY`], lower first.
    pub priority: u32,
    /// The pods it applies to.
    pub subject: Subject,
    /// Ingress rules, in order.
    pub ingress: Vec<ClusterRule>,
    /// Egress rules, in order.
    pub egress: Vec<ClusterRule>,
    /// What could not be read, each making the policy stricter, never looser.
    pub problems: Vec<String>,
}

impl ClusterPolicyInfo {
    /// Reads a watched ClusterNetworkPolicy.
    pub fn from_slim(policy: &SlimClusterNetworkPolicy) -> Self {
        Self::read(
            policy.metadata.name.as_deref().unwrap_or_default(),
            &policy.spec,
        )
    }

    /// Reads a policy's `spec`.
    pub fn read(name: &str, spec: &Value) -> Self {
        let mut problems = Vec::new();
        let null = Value::Null;
        let field = |name: &str| spec.get(name).unwrap_or(&null);
        let tier = match field("tier").as_str() {
            Some("Admin") => Some(Tier::Admin),
            Some("Baseline") => Some(Tier::Baseline),
            _ => {
                problems.push(format!(
                    "tier {} is neither Admin nor Baseline",
                    short(field("tier"))
                ));
                None
            }
        };
        let priority = match field("priority")
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p <= MAX_PRIORITY)
        {
            Some(priority) => Some(priority),
            None => {
                problems.push(format!(
                    "priority {} is not 0 to {MAX_PRIORITY}",
                    short(field("priority"))
                ));
                None
            }
        };
        let subject = match read_subject(field("subject")) {
            Ok(subject) => Some(subject),
            Err(why) => {
                problems.push(format!("subject: {why}"));
                None
            }
        };
        let header_readable = tier.is_some() && priority.is_some() && subject.is_some();
        if !header_readable {
            problems.push(
                "it is placed first (Admin tier, priority 0) over every pod, its Accept rules \
                 matching nothing and its Pass rules denying"
                    .to_owned(),
            );
        }
        let mut info = Self {
            name: name.to_owned(),
            tier: tier.filter(|_| header_readable).unwrap_or(Tier::Admin),
            priority: priority.filter(|_| header_readable).unwrap_or(0),
            subject: subject
                .filter(|_| header_readable)
                .unwrap_or_else(|| Subject::Namespaces(Selector::default())),
            ingress: Vec::new(),
            egress: Vec::new(),
            problems,
        };
        info.ingress = info.rules(field("ingress"), "ingress", "from", false);
        info.egress = info.rules(field("egress"), "egress", "to", true);
        if !header_readable {
            for rule in info.ingress.iter_mut().chain(info.egress.iter_mut()) {
                match rule.action {
                    Action::Accept => rule.failed_closed = true,
                    Action::Pass => rule.action = Action::Deny,
                    Action::Deny => {}
                }
            }
        }
        info
    }

    fn rules(
        &mut self,
        value: &Value,
        field: &str,
        peers_field: &str,
        egress: bool,
    ) -> Vec<ClusterRule> {
        let list = match value {
            Value::Null => return Vec::new(),
            Value::Array(list) => list,
            other => {
                // Rules that cannot be read at all: one rule denying all traffic, as a
                // rule with an unknown peer would.
                self.problems.push(format!(
                    "{field} is not a list: {}; it denies all traffic",
                    short(other)
                ));
                return vec![ClusterRule {
                    name: String::new(),
                    action: Action::Deny,
                    peers: Vec::new(),
                    protocols: None,
                    failed_closed: true,
                }];
            }
        };
        list.iter()
            .enumerate()
            .map(|(i, rule)| self.rule(rule, &format!("{field}[{i}]"), peers_field, egress))
            .collect()
    }

    fn rule(&mut self, rule: &Value, at: &str, peers_field: &str, egress: bool) -> ClusterRule {
        let mut failed = Vec::new();
        let null = Value::Null;
        let action = match rule.get("action").and_then(Value::as_str) {
            Some("Accept") => Action::Accept,
            Some("Deny") => Action::Deny,
            Some("Pass") => Action::Pass,
            _ => {
                failed.push(format!(
                    "action {} is not Accept, Deny or Pass; it is a Deny",
                    short(rule.get("action").unwrap_or(&null))
                ));
                Action::Deny
            }
        };
        let name = match rule.get("name").unwrap_or(&null) {
            Value::Null => String::new(),
            Value::String(name) => name.clone(),
            other => {
                // Only for observability: a problem, not a reason to fail closed.
                self.problems
                    .push(format!("{at}.name is not a string: {}", short(other)));
                String::new()
            }
        };
        let mut peers = Vec::new();
        match rule.get(peers_field).unwrap_or(&null) {
            Value::Array(list) if !list.is_empty() => {
                for (i, entry) in list.iter().enumerate() {
                    match read_peer(entry, egress) {
                        Ok(peer) => peers.push(peer),
                        Err(why) => failed.push(format!("{peers_field}[{i}]: {why}")),
                    }
                }
            }
            other => failed.push(format!(
                "{peers_field} is not a list of peers: {}",
                short(other)
            )),
        }
        let protocols = match rule.get("protocols").unwrap_or(&null) {
            Value::Null => None,
            Value::Array(list) => {
                let mut protocols = Vec::new();
                for (i, entry) in list.iter().enumerate() {
                    match read_protocol(entry) {
                        Ok(protocol) => protocols.push(protocol),
                        Err(why) => failed.push(format!("protocols[{i}]: {why}")),
                    }
                }
                Some(protocols)
            }
            other => {
                failed.push(format!("protocols is not a list: {}", short(other)));
                Some(Vec::new())
            }
        };
        let failed_closed = !failed.is_empty();
        if failed_closed {
            let effect = match action {
                Action::Accept => "the rule matches nothing",
                Action::Deny | Action::Pass => "the rule denies all traffic",
            };
            self.problems
                .push(format!("{at}: {}; {effect}", failed.join("; ")));
        }
        ClusterRule {
            name,
            action,
            peers,
            protocols,
            failed_closed,
        }
    }
}

fn given<'a>(object: &'a Value, field: &str) -> Option<&'a Value> {
    object.get(field).filter(|v| !v.is_null())
}

fn selector(value: &Value, what: &str) -> Result<Selector, String> {
    Selector::parse(value).map_err(|e| format!("{what}: {e}"))
}

fn pods_selectors(value: &Value) -> Result<(Selector, Selector), String> {
    if !value.is_object() {
        return Err(format!("pods is not an object: {}", short(value)));
    }
    let null = Value::Null;
    Ok((
        selector(
            value.get("namespaceSelector").unwrap_or(&null),
            "namespaceSelector",
        )?,
        selector(value.get("podSelector").unwrap_or(&null), "podSelector")?,
    ))
}

fn read_subject(value: &Value) -> Result<Subject, String> {
    match (given(value, "namespaces"), given(value, "pods")) {
        (Some(namespaces), None) => Ok(Subject::Namespaces(selector(namespaces, "namespaces")?)),
        (None, Some(pods)) => {
            let (namespaces, pods) = pods_selectors(pods)?;
            Ok(Subject::Pods { namespaces, pods })
        }
        _ => Err(format!(
            "not exactly one of namespaces and pods: {}",
            short(value)
        )),
    }
}

fn read_peer(entry: &Value, egress: bool) -> Result<ClusterPeer, String> {
    if !entry.is_object() {
        return Err(format!("not an object: {}", short(entry)));
    }
    let fields: &[&str] = if egress {
        &["namespaces", "pods", "networks", "nodes", "domainNames"]
    } else {
        &["namespaces", "pods"]
    };
    let mut known = Vec::new();
    for field in fields {
        if let Some(value) = given(entry, field) {
            known.push((*field, value));
        }
    }
    let [(field, value)] = known.as_slice() else {
        return Err(format!(
            "not exactly one field known for this direction: {}",
            short(entry)
        ));
    };
    Ok(match *field {
        "namespaces" => ClusterPeer::Namespaces(selector(value, "namespaces")?),
        "pods" => {
            let (namespaces, pods) = pods_selectors(value)?;
            ClusterPeer::Pods { namespaces, pods }
        }
        "networks" => {
            let list = value
                .as_array()
                .filter(|l| !l.is_empty())
                .ok_or_else(|| format!("networks is not a list of CIDRs: {}", short(value)))?;
            let mut networks = Vec::new();
            for cidr in list {
                let text = cidr
                    .as_str()
                    .ok_or_else(|| format!("a network is not a string: {}", short(cidr)))?;
                networks.push(parse_cidr(text).map_err(|e| e.to_string())?);
            }
            ClusterPeer::Networks(networks)
        }
        "nodes" => ClusterPeer::Nodes(selector(value, "nodes")?),
        _ => ClusterPeer::DomainNames,
    })
}

fn read_protocol(entry: &Value) -> Result<ClusterPort, String> {
    if !entry.is_object() {
        return Err(format!("not an object: {}", short(entry)));
    }
    let mut known = Vec::new();
    for (field, protocol) in [("tcp", TCP), ("udp", UDP), ("sctp", SCTP)] {
        if let Some(value) = given(entry, field) {
            known.push(read_ports(value, protocol).map_err(|e| format!("{field}: {e}")));
        }
    }
    if let Some(name) = given(entry, "destinationNamedPort") {
        known.push(
            name.as_str()
                .filter(|n| !n.is_empty())
                .map(|n| ClusterPort::Named(n.to_owned()))
                .ok_or_else(|| format!("destinationNamedPort is not a name: {}", short(name))),
        );
    }
    match known.len() {
        1 => known.remove(0),
        _ => Err(format!(
            "not exactly one of tcp, udp, sctp and destinationNamedPort: {}",
            short(entry)
        )),
    }
}

fn read_ports(value: &Value, protocol: u8) -> Result<ClusterPort, String> {
    // Every port, 0 too (a protocol entry without a port matches all its traffic).
    let all = ClusterPort::Numbers {
        protocol,
        first: 0,
        last: u16::MAX,
    };
    if !value.is_object() {
        return Err(format!("not an object: {}", short(value)));
    }
    let Some(port) = given(value, "destinationPort") else {
        return Ok(all);
    };
    let number = |v: &Value| {
        v.as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n > 0)
    };
    let (first, last) = match (given(port, "number"), given(port, "range")) {
        (Some(n), None) => {
            let n = number(n).ok_or_else(|| format!("number {} is not a port", short(n)))?;
            (n, n)
        }
        (None, Some(range)) => {
            let start = range.get("start").and_then(number);
            let end = range.get("end").and_then(number);
            match (start, end) {
                (Some(start), Some(end)) if start <= end => (start, end),
                _ => return Err(format!("range {} is not a port range", short(range))),
            }
        }
        _ => {
            return Err(format!(
                "destinationPort is not exactly one of number and range: {}",
                short(port)
            ));
        }
    };
    Ok(ClusterPort::Numbers {
        protocol,
        first,
        last,
    })
}

impl Watched for SlimClusterNetworkPolicy {
    const KIND: &'static str = "ClusterNetworkPolicy";
    type Item = ClusterPolicyInfo;

    fn read(&self) -> Option<(String, ClusterPolicyInfo)> {
        let info = ClusterPolicyInfo::from_slim(self);
        (!info.name.is_empty()).then(|| (info.name.clone(), info))
    }

    fn key(&self) -> Option<String> {
        self.metadata.name.clone().filter(|n| !n.is_empty())
    }

    fn problems(item: &ClusterPolicyInfo) -> &[String] {
        &item.problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(ingress: Value, egress: Value) -> Value {
        json!({
            "tier": "Admin", "priority": 5,
            "subject": {"namespaces": {"matchLabels": {"a": "b"}}},
            "ingress": ingress, "egress": egress,
        })
    }

    #[test]
    fn a_readable_policy_is_read_whole() {
        let info = ClusterPolicyInfo::read(
            "p",
            &spec(
                json!([{"name": "in", "action": "Pass", "from": [{"pods": {
                    "namespaceSelector": {}, "podSelector": {"matchLabels": {"x": "y"}}}}],
                    "protocols": [{"tcp": {"destinationPort": {"range": {"start": 80, "end": 90}}}},
                                  {"destinationNamedPort": "http"}, {"udp": {}}]}]),
                json!([{"action": "Deny", "to": [{"networks": ["10.0.0.0/8"]}, {"nodes": {}},
                    {"domainNames": ["example.org"]}]}]),
            ),
        );
        assert!(info.problems.is_empty(), "{:?}", info.problems);
        assert_eq!((info.tier, info.priority), (Tier::Admin, 5));
        let rule = &info.ingress[0];
        assert_eq!((rule.name.as_str(), rule.action), ("in", Action::Pass));
        assert_eq!(
            rule.protocols.as_deref().unwrap(),
            [
                ClusterPort::Numbers {
                    protocol: TCP,
                    first: 80,
                    last: 90
                },
                ClusterPort::Named("http".into()),
                ClusterPort::Numbers {
                    protocol: UDP,
                    first: 0,
                    last: u16::MAX
                },
            ]
        );
        assert_eq!(info.egress[0].peers.len(), 3);
        assert!(!info.egress[0].failed_closed);
    }

    #[test]
    fn an_unknown_or_unreadable_peer_fails_the_rule_closed_with_one_problem() {
        let info = ClusterPolicyInfo::read(
            "p",
            &spec(
                // `networks` is not an ingress peer.
                json!([{"action": "Accept", "from": [{"networks": ["0.0.0.0/0"]}]},
                       {"action": "Deny", "from": [{"somethingNew": {}}]}]),
                json!([{"action": "Pass", "to": [{"networks": ["not a cidr"]}]},
                       {"action": "Accept", "to": [{"namespaces": {}}],
                        "protocols": [{"icmp": {}}]}]),
            ),
        );
        assert!(
            info.ingress
                .iter()
                .chain(&info.egress)
                .all(|r| r.failed_closed)
        );
        assert_eq!(info.problems.len(), 4, "{:?}", info.problems);
        assert!(info.problems[0].contains("matches nothing"));
        assert!(info.problems[1].contains("denies all traffic"));
    }

    #[test]
    fn a_policy_whose_header_cannot_be_read_can_only_close() {
        let mut spec = spec(
            json!([{"action": "Accept", "from": [{"namespaces": {}}]},
                   {"action": "Pass", "from": [{"namespaces": {}}]}]),
            json!([{"action": "Deny", "to": [{"namespaces": {}}]}]),
        );
        spec["tier"] = json!("Middle");
        let info = ClusterPolicyInfo::read("p", &spec);
        assert_eq!((info.tier, info.priority), (Tier::Admin, 0));
        assert_eq!(info.subject, Subject::Namespaces(Selector::default()));
        assert!(info.ingress[0].failed_closed);
        assert_eq!(info.ingress[1].action, Action::Deny);
        assert_eq!(info.egress[0].action, Action::Deny);
        assert!(!info.egress[0].failed_closed);
        assert_eq!(info.problems.len(), 2);
    }

    #[test]
    fn hostile_shapes_never_panic() {
        for spec in [
            json!(null),
            json!(7),
            json!({"tier": 1, "priority": -1, "subject": [], "ingress": {}, "egress": "x"}),
            json!({"tier": "Admin", "priority": 99999, "subject": {"pods": 1},
                   "ingress": [1, {"action": "Accept", "from": 1, "protocols": {}}],
                   "egress": [{"action": "Deny", "to": [{"networks": []}],
                               "protocols": [{"tcp": {"destinationPort": {"number": 0}}}]}]}),
        ] {
            let info = ClusterPolicyInfo::read("p", &spec);
            assert!(!info.problems.is_empty());
            assert!(
                info.ingress
                    .iter()
                    .chain(&info.egress)
                    .all(|r| r.failed_closed || r.action == Action::Deny)
            );
        }
    }
}
