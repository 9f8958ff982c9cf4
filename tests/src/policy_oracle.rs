//! NetworkPolicy (`networking.k8s.io/v1`) written a second time, from the Kubernetes
//! documentation alone, as the expectation of the NetworkPolicy tests: it shares no code
//! with the agent (nothing of `cni_node`), so a mistake in the agent's reading of the
//! objects or in its selectors cannot hide in the expectation too.
//!
//! It reads the objects as the API server stores them (`serde_json::Value`): Pods
//! (labels, `spec.hostNetwork`, containers' named ports, `status.podIPs`,
//! `status.hostIPs`), Namespaces (labels) and NetworkPolicies, and answers whether a
//! connection from an address (a pod's or any other) to a pod's address, on a protocol
//! and port, may pass. What it follows, from the concepts page and the API reference:
//!
//! - a pod is isolated for a direction once any policy of its namespace selects it with
//!   that direction in `policyTypes`; `policyTypes` left out (or empty) means Ingress,
//!   plus Egress when the policy has egress rules;
//! - an isolated direction allows what any rule of any of those policies allows (they
//!   add up); a connection needs the source pod's egress and the destination pod's
//!   ingress;
//! - a rule's missing or empty `from`/`to` matches every peer, missing or empty `ports`
//!   every port; a peer is a `podSelector` (pods of the policy's namespace), a
//!   `namespaceSelector` (every pod of those namespaces), both (the pods of those
//!   namespaces), or an `ipBlock` (its `cidr` less its `except`s);
//! - a port is a number, a range (`endPort`) or a name, which names a container port of
//!   the destination pod with the same protocol; the protocol defaults to TCP;
//! - label selectors: `matchLabels` and `matchExpressions` (`In`, `NotIn`, `Exists`,
//!   `DoesNotExist`) all hold; an empty selector selects everything;
//! - hostNetwork pods: the documentation leaves them to the plugin, between two
//!   choices; ours is the one where they are never selected (neither as the policy's
//!   pods nor as selector peers) and their traffic is their node's;
//! - a pod cannot block access to itself, and a pod isolated for ingress still accepts
//!   connections from its node (`status.hostIPs`). The concepts page also says traffic
//!   *to* the node is always allowed, while its isolation section lets an egress-isolated
//!   pod reach only what its egress rules allow; this follows the isolation section (as
//!   the agent's documentation does): a pod's egress to its node is judged.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::Value;

/// Labels of an object.
type Labels = BTreeMap<String, String>;

/// A label selector: every term must hold.
#[derive(Debug, Clone, Default)]
struct Selector {
    terms: Vec<Term>,
}

#[derive(Debug, Clone)]
enum Term {
    /// The label has one of the values (`matchLabels` entries, `In`).
    OneOf(String, Vec<String>),
    /// The label is missing or has none of the values.
    NoneOf(String, Vec<String>),
    Present(String),
    Absent(String),
}

impl Selector {
    fn read(value: &Value, at: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        let object = match value {
            Value::Null => return Ok(Self::default()),
            Value::Object(object) => object,
            other => return Err(format!("{at} is not an object: {other}")),
        };
        if let Some(labels) = object.get("matchLabels").filter(|v| !v.is_null()) {
            for (key, value) in labels
                .as_object()
                .ok_or_else(|| format!("{at}.matchLabels is not an object"))?
            {
                let value = value
                    .as_str()
                    .ok_or_else(|| format!("{at}.matchLabels.{key} is not a string"))?;
                terms.push(Term::OneOf(key.clone(), vec![value.to_owned()]));
            }
        }
        if let Some(expressions) = object.get("matchExpressions").filter(|v| !v.is_null()) {
            for e in expressions
                .as_array()
                .ok_or_else(|| format!("{at}.matchExpressions is not a list"))?
            {
                let key = text(e, "key")?.to_owned();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|l| l.iter().filter_map(Value::as_str).map(str::to_owned))
                    .into_iter()
                    .flatten()
                    .collect();
                terms.push(match text(e, "operator")? {
                    "In" if !values.is_empty() => Term::OneOf(key, values),
                    "NotIn" if !values.is_empty() => Term::NoneOf(key, values),
                    "Exists" if values.is_empty() => Term::Present(key),
                    "DoesNotExist" if values.is_empty() => Term::Absent(key),
                    other => return Err(format!("{at}: operator {other} with values {values:?}")),
                });
            }
        }
        Ok(Self { terms })
    }

    fn selects(&self, labels: &Labels) -> bool {
        self.terms.iter().all(|term| match term {
            Term::OneOf(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Term::NoneOf(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Term::Present(key) => labels.contains_key(key),
            Term::Absent(key) => !labels.contains_key(key),
        })
    }
}

/// An address block: the addresses whose first `prefix` bits are `base`'s.
#[derive(Debug, Clone, Copy)]
struct Block {
    base: IpAddr,
    prefix: u32,
}

impl Block {
    fn read(text: &str) -> Result<Self, String> {
        let (address, prefix) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not a CIDR"))?;
        let base: IpAddr = address
            .parse()
            .map_err(|_| format!("{text:?} is not a CIDR"))?;
        let prefix: u32 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= width(base))
            .ok_or_else(|| format!("{text:?} is not a CIDR"))?;
        Ok(Self { base, prefix })
    }

    fn holds(&self, ip: IpAddr) -> bool {
        if ip.is_ipv4() != self.base.is_ipv4() {
            return false;
        }
        let differing = bits(ip) ^ bits(self.base);
        // The bits past the prefix may differ.
        differing.checked_shr(width(ip) - self.prefix).unwrap_or(0) == 0
    }
}

fn width(ip: IpAddr) -> u32 {
    if ip.is_ipv4() { 32 } else { 128 }
}

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

#[derive(Debug, Clone)]
enum Peer {
    /// Pods: of the policy's namespace when `namespaces` is `None`; every pod of them
    /// when `pods` is `None`.
    Pods {
        namespaces: Option<Selector>,
        pods: Option<Selector>,
    },
    Addresses {
        block: Block,
        except: Vec<Block>,
    },
}

#[derive(Debug, Clone)]
enum Ports {
    All,
    Numbers(u16, u16),
    Named(String),
}

#[derive(Debug, Clone)]
struct Port {
    protocol: String,
    ports: Ports,
}

#[derive(Debug, Clone)]
struct Rule {
    /// `None`: every peer.
    peers: Option<Vec<Peer>>,
    /// `None`: every port of every protocol.
    ports: Option<Vec<Port>>,
}

#[derive(Debug, Clone)]
struct Policy {
    key: String,
    namespace: String,
    pods: Selector,
    /// The ingress rules when the policy isolates ingress.
    ingress: Option<Vec<Rule>>,
    /// The egress rules when it isolates egress.
    egress: Option<Vec<Rule>>,
}

#[derive(Debug, Clone)]
struct ContainerPort {
    name: String,
    protocol: String,
    number: u16,
}

#[derive(Debug, Clone)]
struct Pod {
    key: String,
    namespace: String,
    labels: Labels,
    host_network: bool,
    addresses: Vec<IpAddr>,
    node_addresses: Vec<IpAddr>,
    ports: Vec<ContainerPort>,
}

/// One direction of a connection, as the pod at that end sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Direction {
    /// The pod (`namespace/name`).
    pub pod: String,
    /// The policies isolating it in this direction (empty: not isolated).
    pub isolated_by: Vec<String>,
    /// Those of them with a rule that allows the connection.
    pub allowed_by: Vec<String>,
}

impl Direction {
    /// Whether this direction lets the connection pass.
    pub fn allows(&self) -> bool {
        self.isolated_by.is_empty() || !self.allowed_by.is_empty()
    }
}

/// The oracle's judgement of one connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Source and destination are one pod: not judged.
    pub same_pod: bool,
    /// The source is the destination pod's node: its ingress is not judged.
    pub from_its_node: bool,
    /// The source pod's egress, when the source is a pod.
    pub egress: Option<Direction>,
    /// The destination pod's ingress, when the destination is a pod.
    pub ingress: Option<Direction>,
}

impl Verdict {
    /// Whether the connection passes.
    pub fn allowed(&self) -> bool {
        self.same_pod
            || (self.egress.as_ref().is_none_or(Direction::allows)
                && (self.from_its_node || self.ingress.as_ref().is_none_or(Direction::allows)))
    }

    /// Why, in a few words.
    pub fn why(&self) -> String {
        if self.same_pod {
            return "same pod".into();
        }
        let side = |what: &str, side: &Option<Direction>| match side {
            None => format!("{what}: no pod"),
            Some(d) if d.isolated_by.is_empty() => format!("{what} of {}: not isolated", d.pod),
            Some(d) => format!(
                "{what} of {}: isolated by {:?}, allowed by {:?}",
                d.pod, d.isolated_by, d.allowed_by
            ),
        };
        format!(
            "{}; {}{}",
            side("egress", &self.egress),
            side("ingress", &self.ingress),
            if self.from_its_node {
                " (from its node: allowed)"
            } else {
                ""
            }
        )
    }
}

/// The objects of a cluster, read for judging connections.
#[derive(Debug, Clone, Default)]
pub struct Oracle {
    pods: Vec<Pod>,
    namespaces: BTreeMap<String, Labels>,
    policies: Vec<Policy>,
}

impl Oracle {
    /// Reads Pods, Namespaces and NetworkPolicies as the API server returns them. An
    /// object the API server would have refused is an error naming it.
    pub fn new<'a>(
        pods: impl IntoIterator<Item = &'a Value>,
        namespaces: impl IntoIterator<Item = &'a Value>,
        policies: impl IntoIterator<Item = &'a Value>,
    ) -> Result<Self, String> {
        let mut oracle = Self::default();
        for ns in namespaces {
            let name = text(&ns["metadata"], "name")?.to_owned();
            let labels = labels(&ns["metadata"])?;
            oracle.namespaces.insert(name, labels);
        }
        for pod in pods {
            let pod = read_pod(pod)?;
            oracle.pods.push(pod);
        }
        for policy in policies {
            let policy = read_policy(policy)?;
            oracle.policies.push(policy);
        }
        oracle.policies.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(oracle)
    }

    /// The pod (not hostNetwork) that has `ip`.
    fn pod_at(&self, ip: IpAddr) -> Option<&Pod> {
        self.pods
            .iter()
            .find(|p| !p.host_network && p.addresses.contains(&ip))
    }

    /// Judges a connection from `from` to `to` on `protocol` (`TCP`, `UDP`, `SCTP`)
    /// port `port`.
    pub fn verdict(&self, from: IpAddr, to: IpAddr, protocol: &str, port: u16) -> Verdict {
        let source = self.pod_at(from);
        let destination = self.pod_at(to);
        let named: &[ContainerPort] = destination.map_or(&[], |p| &p.ports);
        let connection = |peer: IpAddr| Connection {
            peer,
            protocol,
            port,
            named,
        };
        Verdict {
            same_pod: matches!((source, destination), (Some(a), Some(b)) if a.key == b.key),
            from_its_node: destination.is_some_and(|p| p.node_addresses.contains(&from)),
            egress: source.map(|pod| self.direction(pod, |p| p.egress.as_deref(), connection(to))),
            ingress: destination
                .map(|pod| self.direction(pod, |p| p.ingress.as_deref(), connection(from))),
        }
    }

    fn direction(
        &self,
        pod: &Pod,
        rules_of: impl Fn(&Policy) -> Option<&[Rule]>,
        connection: Connection<'_>,
    ) -> Direction {
        let mut direction = Direction {
            pod: pod.key.clone(),
            ..Direction::default()
        };
        for policy in &self.policies {
            let Some(rules) = rules_of(policy) else {
                continue;
            };
            if policy.namespace != pod.namespace || !policy.pods.selects(&pod.labels) {
                continue;
            }
            direction.isolated_by.push(policy.key.clone());
            if rules
                .iter()
                .any(|r| self.rule_allows(&policy.namespace, r, &connection))
            {
                direction.allowed_by.push(policy.key.clone());
            }
        }
        direction
    }

    fn rule_allows(&self, namespace: &str, rule: &Rule, connection: &Connection<'_>) -> bool {
        let peer = rule.peers.as_ref().is_none_or(|peers| {
            peers
                .iter()
                .any(|p| self.peer_is(namespace, p, connection.peer))
        });
        let port = rule
            .ports
            .as_ref()
            .is_none_or(|ports| ports.iter().any(|p| connection.on(p)));
        peer && port
    }

    fn peer_is(&self, namespace: &str, peer: &Peer, ip: IpAddr) -> bool {
        match peer {
            Peer::Addresses { block, except } => {
                block.holds(ip) && !except.iter().any(|e| e.holds(ip))
            }
            Peer::Pods { namespaces, pods } => self.pod_at(ip).is_some_and(|pod| {
                let in_namespace = match namespaces {
                    None => pod.namespace == namespace,
                    Some(selector) => selector.selects(
                        self.namespaces
                            .get(&pod.namespace)
                            .unwrap_or(&Labels::new()),
                    ),
                };
                in_namespace && pods.as_ref().is_none_or(|s| s.selects(&pod.labels))
            }),
        }
    }
}

/// A connection as one rule sees it: the address at the other end, the protocol and
/// port, and the destination pod's container ports.
struct Connection<'a> {
    peer: IpAddr,
    protocol: &'a str,
    port: u16,
    named: &'a [ContainerPort],
}

impl Connection<'_> {
    fn on(&self, entry: &Port) -> bool {
        entry.protocol == self.protocol
            && match &entry.ports {
                Ports::All => true,
                Ports::Numbers(first, last) => (*first..=*last).contains(&self.port),
                Ports::Named(name) => self.named.iter().any(|c| {
                    c.name == *name && c.protocol == self.protocol && c.number == self.port
                }),
            }
    }
}

fn text<'a>(object: &'a Value, field: &str) -> Result<&'a str, String> {
    object
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{field} is not a string in {object}"))
}

fn labels(metadata: &Value) -> Result<Labels, String> {
    let mut labels = Labels::new();
    if let Some(map) = metadata.get("labels").filter(|v| !v.is_null()) {
        for (key, value) in map
            .as_object()
            .ok_or_else(|| format!("labels are not an object: {map}"))?
        {
            let value = value
                .as_str()
                .ok_or_else(|| format!("label {key} is not a string"))?;
            labels.insert(key.clone(), value.to_owned());
        }
    }
    Ok(labels)
}

/// The `ip` fields of a list (`podIPs`, `hostIPs`), or else the single field.
fn addresses(status: &Value, list: &str, single: &str) -> Result<Vec<IpAddr>, String> {
    let mut texts: Vec<&str> = status
        .get(list)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("ip").and_then(Value::as_str))
        .collect();
    if texts.is_empty() {
        texts.extend(status.get(single).and_then(Value::as_str));
    }
    texts
        .into_iter()
        .map(|t| t.parse().map_err(|_| format!("{t:?} is not an address")))
        .collect()
}

fn protocol_of(entry: &Value) -> Result<String, String> {
    match entry.get("protocol") {
        None | Some(Value::Null) => Ok("TCP".into()),
        Some(Value::String(p)) if matches!(p.as_str(), "TCP" | "UDP" | "SCTP") => Ok(p.clone()),
        Some(other) => Err(format!("protocol {other}")),
    }
}

fn read_pod(pod: &Value) -> Result<Pod, String> {
    let metadata = &pod["metadata"];
    let namespace = text(metadata, "namespace")?.to_owned();
    let name = text(metadata, "name")?;
    let status = &pod["status"];
    // A pod that has finished has given its address back.
    let finished = matches!(status["phase"].as_str(), Some("Succeeded" | "Failed"));
    let mut ports = Vec::new();
    for container in pod["spec"]["containers"].as_array().into_iter().flatten() {
        for port in container["ports"].as_array().into_iter().flatten() {
            let Some(name) = port.get("name").and_then(Value::as_str) else {
                continue;
            };
            let number = port["containerPort"]
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .ok_or_else(|| format!("containerPort of {name}: {port}"))?;
            ports.push(ContainerPort {
                name: name.to_owned(),
                protocol: protocol_of(port)?,
                number,
            });
        }
    }
    Ok(Pod {
        key: format!("{namespace}/{name}"),
        labels: labels(metadata)?,
        namespace,
        host_network: pod["spec"]["hostNetwork"].as_bool().unwrap_or(false),
        addresses: if finished {
            Vec::new()
        } else {
            addresses(status, "podIPs", "podIP")?
        },
        node_addresses: addresses(status, "hostIPs", "hostIP")?,
        ports,
    })
}

fn read_policy(policy: &Value) -> Result<Policy, String> {
    let namespace = text(&policy["metadata"], "namespace")?.to_owned();
    let key = format!("{namespace}/{}", text(&policy["metadata"], "name")?);
    let spec = &policy["spec"];
    let rules_given = |field: &str| spec[field].as_array().is_some_and(|l| !l.is_empty());
    let types: Vec<&str> = match spec["policyTypes"].as_array() {
        Some(types) if !types.is_empty() => types
            .iter()
            .map(|t| match t.as_str() {
                Some(t @ ("Ingress" | "Egress")) => Ok(t),
                _ => Err(format!("{key}: policyTypes holds {t}")),
            })
            .collect::<Result<_, _>>()?,
        _ if rules_given("egress") => vec!["Ingress", "Egress"],
        _ => vec!["Ingress"],
    };
    let rules = |field: &str, peers: &str| -> Result<Vec<Rule>, String> {
        spec[field]
            .as_array()
            .into_iter()
            .flatten()
            .map(|rule| read_rule(rule, peers).map_err(|e| format!("{key} {field}: {e}")))
            .collect()
    };
    Ok(Policy {
        pods: Selector::read(&spec["podSelector"], "podSelector")?,
        ingress: types
            .contains(&"Ingress")
            .then(|| rules("ingress", "from"))
            .transpose()?,
        egress: types
            .contains(&"Egress")
            .then(|| rules("egress", "to"))
            .transpose()?,
        key,
        namespace,
    })
}

fn read_rule(rule: &Value, peers_field: &str) -> Result<Rule, String> {
    let non_empty = |field: &str| rule[field].as_array().filter(|l| !l.is_empty());
    let peers = non_empty(peers_field)
        .map(|list| list.iter().map(read_peer).collect::<Result<Vec<_>, _>>())
        .transpose()?;
    let ports = non_empty("ports")
        .map(|list| list.iter().map(read_port).collect::<Result<Vec<_>, _>>())
        .transpose()?;
    Ok(Rule { peers, ports })
}

fn read_peer(peer: &Value) -> Result<Peer, String> {
    let given = |field: &str| peer.get(field).filter(|v| !v.is_null());
    if let Some(block) = given("ipBlock") {
        if given("podSelector").is_some() || given("namespaceSelector").is_some() {
            return Err(format!("ipBlock beside a selector: {peer}"));
        }
        let cidr = Block::read(text(block, "cidr")?)?;
        let except = block["except"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| Block::read(e.as_str().unwrap_or_default()))
            .collect::<Result<_, _>>()?;
        return Ok(Peer::Addresses {
            block: cidr,
            except,
        });
    }
    let pods = given("podSelector")
        .map(|s| Selector::read(s, "podSelector"))
        .transpose()?;
    let namespaces = given("namespaceSelector")
        .map(|s| Selector::read(s, "namespaceSelector"))
        .transpose()?;
    if pods.is_none() && namespaces.is_none() {
        return Err(format!("a peer with neither selector nor ipBlock: {peer}"));
    }
    Ok(Peer::Pods { namespaces, pods })
}

fn read_port(entry: &Value) -> Result<Port, String> {
    let number = |v: &Value| v.as_u64().and_then(|n| u16::try_from(n).ok());
    let ports = match (&entry["port"], &entry["endPort"]) {
        (Value::Null, Value::Null) => Ports::All,
        (Value::String(name), Value::Null) => Ports::Named(name.clone()),
        (first, Value::Null) => {
            let n = number(first).ok_or_else(|| format!("port {first}"))?;
            Ports::Numbers(n, n)
        }
        (first, last) => match (number(first), number(last)) {
            (Some(first), Some(last)) if first <= last => Ports::Numbers(first, last),
            _ => return Err(format!("port {first} to endPort {last}")),
        },
    };
    Ok(Port {
        protocol: protocol_of(entry)?,
        ports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, labels: Value, ips: &[&str], node: &str) -> Value {
        json!({
            "metadata": {"namespace": ns, "name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "ports": [
                {"name": "http", "containerPort": 8080},
                {"name": "dns", "containerPort": 53, "protocol": "UDP"},
            ]}]},
            "status": {
                "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
                "hostIPs": [{"ip": node}],
            },
        })
    }

    fn namespace(name: &str, labels: Value) -> Value {
        json!({"metadata": {"name": name, "labels": labels}})
    }

    fn policy(ns: &str, name: &str, spec: Value) -> Value {
        json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn world(policies: &[Value]) -> Oracle {
        let pods = [
            pod(
                "shop",
                "web",
                json!({"app": "web"}),
                &["10.0.1.5", "fd00::1:5"],
                "192.0.2.1",
            ),
            pod(
                "shop",
                "db",
                json!({"app": "db", "tier": "data"}),
                &["10.0.2.6"],
                "192.0.2.2",
            ),
            pod(
                "ops",
                "probe",
                json!({"app": "probe"}),
                &["10.0.1.7"],
                "192.0.2.1",
            ),
            {
                let mut host = pod(
                    "ops",
                    "agent",
                    json!({"app": "web"}),
                    &["192.0.2.2"],
                    "192.0.2.2",
                );
                host["spec"]["hostNetwork"] = json!(true);
                host
            },
        ];
        let namespaces = [
            namespace("shop", json!({"team": "shop"})),
            namespace("ops", json!({"team": "ops", "audit": "yes"})),
        ];
        Oracle::new(&pods, &namespaces, policies).unwrap()
    }

    #[test]
    fn without_policies_everything_passes_and_default_deny_isolates_its_namespace() {
        let open = world(&[]);
        assert!(
            open.verdict(ip("10.0.1.7"), ip("10.0.2.6"), "TCP", 1)
                .allowed()
        );
        let closed = world(&[policy("shop", "deny", json!({"podSelector": {}}))]);
        let v = closed.verdict(ip("10.0.1.7"), ip("10.0.2.6"), "TCP", 1);
        assert!(!v.allowed(), "{}", v.why());
        assert_eq!(v.ingress.unwrap().isolated_by, ["shop/deny"]);
        // Its egress is not isolated, the pod itself and its node are never judged.
        assert!(
            closed
                .verdict(ip("10.0.2.6"), ip("10.0.1.7"), "TCP", 1)
                .allowed()
        );
        assert!(
            closed
                .verdict(ip("10.0.1.5"), ip("fd00::1:5"), "TCP", 1)
                .allowed()
        );
        assert!(
            closed
                .verdict(ip("192.0.2.2"), ip("10.0.2.6"), "TCP", 1)
                .allowed()
        );
        assert!(
            !closed
                .verdict(ip("192.0.2.1"), ip("10.0.2.6"), "TCP", 1)
                .allowed()
        );
    }

    #[test]
    fn policy_types_default_from_the_rules_present() {
        let egress_only = policy(
            "shop",
            "e",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}),
        );
        let o = world(&[egress_only]);
        // Ingress isolated by default too, with no rule: nothing in.
        assert!(
            !o.verdict(ip("10.0.1.7"), ip("10.0.1.5"), "TCP", 80)
                .allowed()
        );
        assert!(
            o.verdict(ip("10.0.1.5"), ip("10.0.1.7"), "UDP", 53)
                .allowed()
        );
        assert!(
            !o.verdict(ip("10.0.1.5"), ip("10.0.1.7"), "TCP", 53)
                .allowed()
        );
        let empty_egress = policy("shop", "e", json!({"podSelector": {}, "egress": []}));
        let o = world(&[empty_egress]);
        assert!(
            o.verdict(ip("10.0.1.5"), ip("10.0.1.7"), "TCP", 80)
                .allowed()
        );
    }

    #[test]
    fn selectors_peers_and_ports() {
        let p = policy(
            "shop",
            "db",
            json!({
                "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["data"]}]},
                "ingress": [
                    {"from": [{"namespaceSelector": {"matchExpressions": [{"key": "audit", "operator": "Exists"}]},
                               "podSelector": {"matchLabels": {"app": "probe"}}}],
                     "ports": [{"port": "http"}]},
                    {"from": [{"podSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]}}],
                     "ports": [{"port": 5000, "endPort": 5010}]},
                    {"from": [{"ipBlock": {"cidr": "192.0.2.0/24", "except": ["192.0.2.1/32"]}}]},
                ],
            }),
        );
        let o = world(&[p]);
        let db = ip("10.0.2.6");
        assert!(o.verdict(ip("10.0.1.7"), db, "TCP", 8080).allowed());
        assert!(!o.verdict(ip("10.0.1.7"), db, "UDP", 8080).allowed());
        assert!(
            !o.verdict(ip("10.0.1.7"), db, "TCP", 5005).allowed(),
            "ops is not shop"
        );
        assert!(o.verdict(ip("10.0.1.5"), db, "TCP", 5010).allowed());
        assert!(!o.verdict(ip("10.0.1.5"), db, "TCP", 5011).allowed());
        // The hostNetwork pod is its node's address: the ipBlock only.
        assert!(o.verdict(ip("192.0.2.3"), db, "SCTP", 9).allowed());
        assert!(!o.verdict(ip("192.0.2.1"), db, "SCTP", 9).allowed());
    }

    #[test]
    fn host_network_pods_are_never_selected() {
        let p = policy(
            "ops",
            "all",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        );
        let o = world(&[p]);
        let v = o.verdict(ip("192.0.2.2"), ip("10.0.1.5"), "TCP", 80);
        assert!(v.egress.is_none() && v.allowed(), "{}", v.why());
        assert!(
            !o.verdict(ip("10.0.1.7"), ip("10.0.1.5"), "TCP", 80)
                .allowed()
        );
    }

    #[test]
    fn cidrs_hold_their_prefix_only() {
        let block = Block::read("10.0.1.4/30").unwrap();
        assert!(block.holds(ip("10.0.1.7")) && !block.holds(ip("10.0.1.8")));
        assert!(Block::read("::/0").unwrap().holds(ip("fd00::1")));
        assert!(!Block::read("::/0").unwrap().holds(ip("10.0.0.1")));
        assert!(Block::read("0.0.0.0/0").unwrap().holds(ip("10.0.0.1")));
        assert!(Block::read("10.0.0.0/33").is_err());
    }
}
