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
//!
//! It also knows the tiers of ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`,
//! network-policy-api v0.2.0), written from that API's type documentation and its
//! overview page, when built with [`Oracle::with_cluster_network_policies`] (which reads
//! Nodes too). Each direction of a connection is judged tier by tier, and the verdict
//! says which tier, policy and rule decided ([`Decision`]), for verdict accounting:
//!
//! - Admin tier, then NetworkPolicy (a pod it isolates in that direction gets its
//!   answer there, allowed or not), then Baseline, then the default: allowed;
//! - within a tier, policies by `priority` (0-1000, lower first); the API leaves two
//!   policies of one priority to the implementation: this oracle takes them by name;
//! - a policy applies to the pods its `subject` selects (`namespaces`, or `pods`:
//!   namespace and pod selectors both); within it the rules of the direction are tried in
//!   order and the first that matches decides: `Accept` and `Deny` end the evaluation
//!   of that direction, `Pass` skips the rest of the tier (its lower-priority policies
//!   included) and goes on with the next one; a policy with no rules for a direction
//!   leaves it alone (no implicit isolation);
//! - a rule matches when one of its peers holds the address at the other end and, when
//!   it has `protocols`, one of them holds the protocol and port (`tcp`, `udp`, `sctp`
//!   with a `destinationPort` number or inclusive range, all its ports without one;
//!   `destinationNamedPort`: a named container port of the destination pod, of the
//!   connection's protocol); a rule without `protocols` matches all traffic, ICMP too;
//! - peers: `namespaces` (every pod of them), `pods` (namespace and pod selectors);
//!   egress also `networks` (CIDRs, which hold pod and node addresses like any other),
//!   `nodes` (the `status.addresses` of the Nodes selected) and `domainNames`, which this
//!   oracle does not resolve: it matches nothing;
//! - a peer (or protocol entry) with no field the oracle knows (an ingress peer with only
//!   `networks` is one) makes its rule fail closed: an `Accept` rule matches nothing, a
//!   `Deny` or `Pass` rule becomes a rule that denies all traffic;
//! - hostNetwork pods are never subjects nor `pods`/`namespaces` peers (their addresses
//!   are their node's, which `nodes` and `networks` peers can hold);
//! - a pod reaching its own pod address is not judged, and a pod still accepts its own
//!   node (kubelet probes) whatever the tiers say, as for NetworkPolicy above (upstream
//!   leaves the second open);
//! - an egress `Accept` only decides the source's side: the destination's ingress is
//!   judged on its own.

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

/// Which end of a connection a pod is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// The destination: its ingress.
    Ingress,
    /// The source: its egress.
    Egress,
}

/// The pods a ClusterNetworkPolicy applies to (never hostNetwork ones).
#[derive(Debug, Clone)]
enum Subject {
    /// Every pod of the namespaces selected.
    Namespaces(Selector),
    /// The pods selected in the namespaces selected.
    Pods {
        namespaces: Selector,
        pods: Selector,
    },
}

#[derive(Debug, Clone)]
enum ClusterPeer {
    Namespaces(Selector),
    Pods {
        namespaces: Selector,
        pods: Selector,
    },
    Networks(Vec<Block>),
    Nodes(Selector),
    /// Not resolved by the oracle: matches nothing.
    DomainNames,
}

#[derive(Debug, Clone)]
enum ClusterProtocol {
    /// `tcp`, `udp` or `sctp`, with or without a destination port.
    Port(Port),
    /// `destinationNamedPort`.
    Named(String),
}

#[derive(Debug, Clone)]
struct ClusterRule {
    name: String,
    action: Action,
    peers: Vec<ClusterPeer>,
    /// `None`: all traffic.
    protocols: Option<Vec<ClusterProtocol>>,
    /// A peer or protocol entry has no field the oracle knows: the rule fails closed.
    unknown: bool,
}

#[derive(Debug, Clone)]
struct ClusterPolicy {
    name: String,
    tier: Tier,
    priority: u32,
    subject: Subject,
    ingress: Vec<ClusterRule>,
    egress: Vec<ClusterRule>,
}

#[derive(Debug, Clone)]
struct Node {
    labels: Labels,
    /// The addresses of `status.addresses` (host names left out).
    addresses: Vec<IpAddr>,
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
    /// The NetworkPolicies isolating it in this direction (empty: not isolated).
    pub isolated_by: Vec<String>,
    /// Those of them with a rule that allows the connection.
    pub allowed_by: Vec<String>,
    /// Which tier decided, and how.
    pub decided: Decision,
}

impl Direction {
    /// Whether this direction lets the connection pass.
    pub fn allows(&self) -> bool {
        self.decided.allowed
    }
}

/// A tier of the evaluation, in its order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// ClusterNetworkPolicies of `tier: Admin`.
    Admin,
    /// The namespaces' NetworkPolicies.
    NetworkPolicy,
    /// ClusterNetworkPolicies of `tier: Baseline`.
    Baseline,
    /// Nothing decided: allowed.
    #[default]
    Default,
}

/// A ClusterNetworkPolicy rule's `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Allowed (for this direction).
    Accept,
    /// Dropped.
    Deny,
    /// On to the next tier.
    Pass,
}

/// A ClusterNetworkPolicy rule that matched a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleMatch {
    /// The policy's name.
    pub policy: String,
    /// Its tier (Admin or Baseline).
    pub tier: Tier,
    /// Its priority.
    pub priority: u32,
    /// The rule's index in the policy's `ingress` or `egress` list.
    pub index: usize,
    /// The rule's `name` (`""` when it has none).
    pub name: String,
    /// Its action as written.
    pub action: Action,
    /// The rule has a peer or protocol entry with no field the oracle knows: an
    /// `Accept` rule then matches nothing, so this is a `Deny` or `Pass` rule that
    /// denied (whatever its action says).
    pub failed_closed: bool,
}

/// Who decided one direction of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The tier that decided.
    pub tier: Tier,
    /// Whether this direction lets the connection pass.
    pub allowed: bool,
    /// The ClusterNetworkPolicy rule that decided (Admin and Baseline tiers).
    pub rule: Option<RuleMatch>,
    /// The NetworkPolicy tier's answer: the policies that allowed it when allowed, the
    /// policies that isolate the pod when denied.
    pub network_policies: Vec<String>,
    /// The `Pass` rules that sent it on, in the order they matched.
    pub passed: Vec<RuleMatch>,
}

impl Default for Decision {
    fn default() -> Self {
        Self {
            tier: Tier::Default,
            allowed: true,
            rule: None,
            network_policies: Vec::new(),
            passed: Vec::new(),
        }
    }
}

impl Decision {
    /// Why, in a few words.
    pub fn why(&self) -> String {
        let verb = if self.allowed { "allowed" } else { "denied" };
        let mut text = match (&self.rule, self.tier) {
            (Some(rule), _) => format!(
                "{verb} by {:?} rule {} ({:?}{}) of {:?} policy {} (priority {})",
                rule.action,
                rule.index,
                rule.name,
                if rule.failed_closed {
                    ", failed closed"
                } else {
                    ""
                },
                rule.tier,
                rule.policy,
                rule.priority
            ),
            (None, Tier::NetworkPolicy) => {
                format!("{verb} by NetworkPolicies {:?}", self.network_policies)
            }
            (None, tier) => format!("{verb} by the {tier:?} tier"),
        };
        for pass in &self.passed {
            text.push_str(&format!(
                ", after Pass rule {} of {}",
                pass.index, pass.policy
            ));
        }
        text
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

    /// The decision that drops the connection, for verdict accounting: the source's
    /// egress when it denies (the source's side judges it first), else the destination's
    /// ingress when that denies and is judged; `None` when the connection passes.
    pub fn denied_by(&self) -> Option<&Decision> {
        if self.same_pod {
            return None;
        }
        fn denies(side: &Option<Direction>) -> Option<&Decision> {
            side.as_ref()
                .map(|d| &d.decided)
                .filter(|decided| !decided.allowed)
        }
        denies(&self.egress).or_else(|| denies(&self.ingress).filter(|_| !self.from_its_node))
    }

    /// Why, in a few words.
    pub fn why(&self) -> String {
        if self.same_pod {
            return "same pod".into();
        }
        let side = |what: &str, side: &Option<Direction>| match side {
            None => format!("{what}: no pod"),
            Some(d) if d.decided.tier != Tier::NetworkPolicy && d.decided.tier != Tier::Default => {
                format!("{what} of {}: {}", d.pod, d.decided.why())
            }
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
    nodes: Vec<Node>,
    /// In evaluation order: tier, priority, name.
    cluster_policies: Vec<ClusterPolicy>,
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

    /// Reads Pods, Namespaces, Nodes, NetworkPolicies and ClusterNetworkPolicies as the
    /// API server returns them, for judging with the tiers. An object the API server
    /// would have refused is an error naming it.
    pub fn with_cluster_network_policies<'a>(
        pods: impl IntoIterator<Item = &'a Value>,
        namespaces: impl IntoIterator<Item = &'a Value>,
        nodes: impl IntoIterator<Item = &'a Value>,
        network_policies: impl IntoIterator<Item = &'a Value>,
        cluster_network_policies: impl IntoIterator<Item = &'a Value>,
    ) -> Result<Self, String> {
        let mut oracle = Self::new(pods, namespaces, network_policies)?;
        for node in nodes {
            oracle.nodes.push(read_node(node)?);
        }
        for policy in cluster_network_policies {
            oracle.cluster_policies.push(read_cluster_policy(policy)?);
        }
        oracle
            .cluster_policies
            .sort_by(|a, b| (a.tier, a.priority, &a.name).cmp(&(b.tier, b.priority, &b.name)));
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
            egress: source.map(|pod| self.direction(pod, Way::Egress, &connection(to))),
            ingress: destination.map(|pod| self.direction(pod, Way::Ingress, &connection(from))),
        }
    }

    fn direction(&self, pod: &Pod, way: Way, connection: &Connection<'_>) -> Direction {
        let mut direction = Direction {
            pod: pod.key.clone(),
            ..Direction::default()
        };
        for policy in &self.policies {
            let rules = match way {
                Way::Ingress => policy.ingress.as_deref(),
                Way::Egress => policy.egress.as_deref(),
            };
            let Some(rules) = rules else {
                continue;
            };
            if policy.namespace != pod.namespace || !policy.pods.selects(&pod.labels) {
                continue;
            }
            direction.isolated_by.push(policy.key.clone());
            if rules
                .iter()
                .any(|r| self.rule_allows(&policy.namespace, r, connection))
            {
                direction.allowed_by.push(policy.key.clone());
            }
        }
        direction.decided = self.decide(pod, way, connection, &direction);
        direction
    }

    /// The tiers, in order, for one direction of `pod` whose NetworkPolicy side is
    /// `network`.
    fn decide(
        &self,
        pod: &Pod,
        way: Way,
        connection: &Connection<'_>,
        network: &Direction,
    ) -> Decision {
        let mut passed = Vec::new();
        if let Some(decided) = self.cluster_tier(Tier::Admin, pod, way, connection, &mut passed) {
            return decided;
        }
        if !network.isolated_by.is_empty() {
            let allowed = !network.allowed_by.is_empty();
            return Decision {
                tier: Tier::NetworkPolicy,
                allowed,
                rule: None,
                network_policies: if allowed {
                    network.allowed_by.clone()
                } else {
                    network.isolated_by.clone()
                },
                passed,
            };
        }
        if let Some(decided) = self.cluster_tier(Tier::Baseline, pod, way, connection, &mut passed)
        {
            return decided;
        }
        Decision {
            passed,
            ..Decision::default()
        }
    }

    /// The decision of one ClusterNetworkPolicy tier, `None` when it has none (no rule
    /// matched, or a `Pass` rule did: that one is added to `passed`).
    fn cluster_tier(
        &self,
        tier: Tier,
        pod: &Pod,
        way: Way,
        connection: &Connection<'_>,
        passed: &mut Vec<RuleMatch>,
    ) -> Option<Decision> {
        let policies = self
            .cluster_policies
            .iter()
            .filter(|p| p.tier == tier && self.subject_holds(&p.subject, pod));
        for policy in policies {
            let rules = match way {
                Way::Ingress => &policy.ingress,
                Way::Egress => &policy.egress,
            };
            for (index, rule) in rules.iter().enumerate() {
                let matched = if rule.unknown {
                    // Fail closed: an Accept matches nothing, a Deny or Pass denies all.
                    rule.action != Action::Accept
                } else {
                    self.cluster_rule_matches(rule, connection)
                };
                if !matched {
                    continue;
                }
                let found = RuleMatch {
                    policy: policy.name.clone(),
                    tier,
                    priority: policy.priority,
                    index,
                    name: rule.name.clone(),
                    action: rule.action,
                    failed_closed: rule.unknown,
                };
                let allowed = match (rule.unknown, rule.action) {
                    (true, _) | (false, Action::Deny) => false,
                    (false, Action::Accept) => true,
                    (false, Action::Pass) => {
                        passed.push(found);
                        return None;
                    }
                };
                return Some(Decision {
                    tier,
                    allowed,
                    rule: Some(found),
                    network_policies: Vec::new(),
                    passed: std::mem::take(passed),
                });
            }
        }
        None
    }

    fn namespace_labels(&self, namespace: &str) -> &Labels {
        static NONE: Labels = Labels::new();
        self.namespaces.get(namespace).unwrap_or(&NONE)
    }

    fn subject_holds(&self, subject: &Subject, pod: &Pod) -> bool {
        match subject {
            Subject::Namespaces(namespaces) => {
                namespaces.selects(self.namespace_labels(&pod.namespace))
            }
            Subject::Pods { namespaces, pods } => {
                namespaces.selects(self.namespace_labels(&pod.namespace))
                    && pods.selects(&pod.labels)
            }
        }
    }

    fn cluster_rule_matches(&self, rule: &ClusterRule, connection: &Connection<'_>) -> bool {
        let peer = rule.peers.iter().any(|peer| match peer {
            ClusterPeer::Namespaces(namespaces) => self
                .pod_at(connection.peer)
                .is_some_and(|p| namespaces.selects(self.namespace_labels(&p.namespace))),
            ClusterPeer::Pods { namespaces, pods } => {
                self.pod_at(connection.peer).is_some_and(|p| {
                    namespaces.selects(self.namespace_labels(&p.namespace))
                        && pods.selects(&p.labels)
                })
            }
            ClusterPeer::Networks(blocks) => blocks.iter().any(|b| b.holds(connection.peer)),
            ClusterPeer::Nodes(nodes) => self
                .nodes
                .iter()
                .any(|n| nodes.selects(&n.labels) && n.addresses.contains(&connection.peer)),
            ClusterPeer::DomainNames => false,
        });
        peer && rule
            .protocols
            .as_ref()
            .is_none_or(|protocols| protocols.iter().any(|p| connection.on_cluster(p)))
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
                Ports::Named(name) => self.to_named_port(name),
            }
    }

    /// Whether it goes to the destination pod's container port `name`.
    fn to_named_port(&self, name: &str) -> bool {
        self.named
            .iter()
            .any(|c| c.name == name && c.protocol == self.protocol && c.number == self.port)
    }

    fn on_cluster(&self, entry: &ClusterProtocol) -> bool {
        match entry {
            ClusterProtocol::Port(port) => self.on(port),
            ClusterProtocol::Named(name) => self.to_named_port(name),
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

fn read_node(node: &Value) -> Result<Node, String> {
    let metadata = &node["metadata"];
    text(metadata, "name")?;
    let addresses = node["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.get("address").and_then(Value::as_str))
        .filter_map(|a| a.parse().ok())
        .collect();
    Ok(Node {
        labels: labels(metadata)?,
        addresses,
    })
}

fn read_cluster_policy(policy: &Value) -> Result<ClusterPolicy, String> {
    let name = text(&policy["metadata"], "name")?.to_owned();
    let spec = &policy["spec"];
    let tier = match spec["tier"].as_str() {
        Some("Admin") => Tier::Admin,
        Some("Baseline") => Tier::Baseline,
        _ => return Err(format!("{name}: tier {}", spec["tier"])),
    };
    let priority = spec["priority"]
        .as_u64()
        .filter(|p| *p <= 1000)
        .and_then(|p| u32::try_from(p).ok())
        .ok_or_else(|| format!("{name}: priority {}", spec["priority"]))?;
    let subject = &spec["subject"];
    let given = |value: &Value, field: &str| value.get(field).filter(|v| !v.is_null()).cloned();
    let subject = match (given(subject, "namespaces"), given(subject, "pods")) {
        (Some(namespaces), None) => {
            Subject::Namespaces(Selector::read(&namespaces, "subject.namespaces")?)
        }
        (None, Some(pods)) => Subject::Pods {
            namespaces: Selector::read(&pods["namespaceSelector"], "namespaceSelector")?,
            pods: Selector::read(&pods["podSelector"], "podSelector")?,
        },
        _ => {
            return Err(format!(
                "{name}: a subject is one of namespaces or pods: {subject}"
            ));
        }
    };
    let rules = |field: &str, peers: &str, way: Way| -> Result<Vec<ClusterRule>, String> {
        spec[field]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, rule)| {
                read_cluster_rule(rule, peers, way).map_err(|e| format!("{name} {field}[{i}]: {e}"))
            })
            .collect()
    };
    Ok(ClusterPolicy {
        ingress: rules("ingress", "from", Way::Ingress)?,
        egress: rules("egress", "to", Way::Egress)?,
        name,
        tier,
        priority,
        subject,
    })
}

fn read_cluster_rule(rule: &Value, peers_field: &str, way: Way) -> Result<ClusterRule, String> {
    let action = match rule["action"].as_str() {
        Some("Accept") => Action::Accept,
        Some("Deny") => Action::Deny,
        Some("Pass") => Action::Pass,
        _ => return Err(format!("action {}", rule["action"])),
    };
    let mut unknown = false;
    let mut peers = Vec::new();
    let listed = rule[peers_field]
        .as_array()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| format!("{peers_field} is not a list of peers"))?;
    for peer in listed {
        match read_cluster_peer(peer, way)? {
            Some(peer) => peers.push(peer),
            None => unknown = true,
        }
    }
    let protocols = match rule.get("protocols").filter(|v| !v.is_null()) {
        None => None,
        Some(list) => {
            let mut protocols = Vec::new();
            for entry in list
                .as_array()
                .ok_or_else(|| format!("protocols is not a list: {list}"))?
            {
                match read_cluster_protocol(entry)? {
                    Some(protocol) => protocols.push(protocol),
                    None => unknown = true,
                }
            }
            Some(protocols)
        }
    };
    Ok(ClusterRule {
        name: rule["name"].as_str().unwrap_or_default().to_owned(),
        action,
        peers,
        protocols,
        unknown,
    })
}

/// A peer, or `None` for one with no field the oracle knows for this direction.
fn read_cluster_peer(peer: &Value, way: Way) -> Result<Option<ClusterPeer>, String> {
    let mut known = Vec::new();
    let fields: &[&str] = match way {
        Way::Ingress => &["namespaces", "pods"],
        Way::Egress => &["namespaces", "pods", "networks", "nodes", "domainNames"],
    };
    for field in fields {
        let Some(value) = peer.get(*field).filter(|v| !v.is_null()) else {
            continue;
        };
        known.push(match *field {
            "namespaces" => ClusterPeer::Namespaces(Selector::read(value, "namespaces")?),
            "pods" => ClusterPeer::Pods {
                namespaces: Selector::read(&value["namespaceSelector"], "namespaceSelector")?,
                pods: Selector::read(&value["podSelector"], "podSelector")?,
            },
            "networks" => ClusterPeer::Networks(
                value
                    .as_array()
                    .ok_or_else(|| format!("networks is not a list: {value}"))?
                    .iter()
                    .map(|cidr| Block::read(cidr.as_str().unwrap_or_default()))
                    .collect::<Result<_, _>>()?,
            ),
            "nodes" => ClusterPeer::Nodes(Selector::read(value, "nodes")?),
            _ => ClusterPeer::DomainNames,
        });
    }
    match known.len() {
        0 => Ok(None),
        1 => Ok(known.pop()),
        _ => Err(format!("a peer sets more than one field: {peer}")),
    }
}

/// A protocol entry, or `None` for one with no field the oracle knows.
fn read_cluster_protocol(entry: &Value) -> Result<Option<ClusterProtocol>, String> {
    let mut known = Vec::new();
    for (field, protocol) in [("tcp", "TCP"), ("udp", "UDP"), ("sctp", "SCTP")] {
        let Some(value) = entry.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        let number = |v: &Value| {
            v.as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
        };
        let port = &value["destinationPort"];
        let ports = match (&port["number"], &port["range"]) {
            (Value::Null, Value::Null) if port.is_null() => Ports::All,
            (n, Value::Null) => {
                let n = number(n).ok_or_else(|| format!("destinationPort {port}"))?;
                Ports::Numbers(n, n)
            }
            (Value::Null, range) => match (number(&range["start"]), number(&range["end"])) {
                (Some(start), Some(end)) if start <= end => Ports::Numbers(start, end),
                _ => return Err(format!("destinationPort {port}")),
            },
            _ => return Err(format!("destinationPort with number and range: {port}")),
        };
        known.push(ClusterProtocol::Port(Port {
            protocol: protocol.to_owned(),
            ports,
        }));
    }
    if let Some(name) = entry.get("destinationNamedPort").filter(|v| !v.is_null()) {
        let name = name
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("destinationNamedPort {name}"))?;
        known.push(ClusterProtocol::Named(name.to_owned()));
    }
    match known.len() {
        0 => Ok(None),
        1 => Ok(known.pop()),
        _ => Err(format!(
            "a protocol entry sets more than one field: {entry}"
        )),
    }
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

    // ClusterNetworkPolicy tiers, on the world above plus its two nodes.

    fn cnp(name: &str, tier: &str, priority: u32, rest: Value) -> Value {
        let mut spec = json!({"tier": tier, "priority": priority});
        for (k, v) in rest.as_object().unwrap() {
            spec[k] = v.clone();
        }
        json!({"metadata": {"name": name}, "spec": spec})
    }

    fn node(name: &str, zone: &str, ip: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"zone": zone, "kubernetes.io/os": "linux"}},
               "status": {"addresses": [{"type": "InternalIP", "address": ip},
                                        {"type": "Hostname", "address": name}]}})
    }

    fn tiered(policies: &[Value], cluster: &[Value]) -> Oracle {
        let base = world(&[]);
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
        let nodes = [
            node("node-1", "a", "192.0.2.1"),
            node("node-2", "b", "192.0.2.2"),
        ];
        let oracle =
            Oracle::with_cluster_network_policies(&pods, &namespaces, &nodes, policies, cluster)
                .unwrap();
        assert_eq!(base.pods.len(), oracle.pods.len());
        oracle
    }

    const WEB: &str = "10.0.1.5";
    const DB: &str = "10.0.2.6";
    const PROBE: &str = "10.0.1.7";

    fn judge(o: &Oracle, from: &str, to: &str, protocol: &str, port: u16) -> Verdict {
        o.verdict(ip(from), ip(to), protocol, port)
    }

    fn ingress_of(v: &Verdict) -> Decision {
        v.ingress
            .as_ref()
            .expect("a destination pod")
            .decided
            .clone()
    }

    fn egress_of(v: &Verdict) -> Decision {
        v.egress.as_ref().expect("a source pod").decided.clone()
    }

    fn from_team(action: &str, team: &str) -> Value {
        json!({"action": action, "from": [{"namespaces": {"matchLabels": {"team": team}}}]})
    }

    fn shop_ingress(rules: Value) -> Value {
        json!({"subject": {"namespaces": {"matchLabels": {"team": "shop"}}}, "ingress": rules})
    }

    #[test]
    fn tiers_go_admin_then_network_policy_then_baseline_then_allowed() {
        let baseline = cnp(
            "guard",
            "Baseline",
            5,
            shop_ingress(json!([from_team("Deny", "ops")])),
        );
        let o = tiered(&[], std::slice::from_ref(&baseline));
        let v = judge(&o, PROBE, DB, "TCP", 80);
        assert!(!v.allowed(), "{}", v.why());
        let d = ingress_of(&v);
        assert_eq!(
            (d.tier, d.rule.as_ref().unwrap().policy.as_str()),
            (Tier::Baseline, "guard")
        );
        // Nothing selects the probe's egress: the default.
        assert_eq!(egress_of(&v), Decision::default());

        // A NetworkPolicy isolating db decides for db, before the Baseline tier.
        let np = policy(
            "shop",
            "db-from-ops",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}]}]}),
        );
        let o = tiered(std::slice::from_ref(&np), std::slice::from_ref(&baseline));
        let v = judge(&o, PROBE, DB, "TCP", 80);
        assert!(v.allowed(), "{}", v.why());
        assert_eq!(ingress_of(&v).tier, Tier::NetworkPolicy);
        assert_eq!(ingress_of(&v).network_policies, ["shop/db-from-ops"]);
        assert!(
            !judge(&o, PROBE, WEB, "TCP", 80).allowed(),
            "web is not isolated"
        );
        let v = judge(&o, WEB, DB, "TCP", 80);
        assert!(!v.allowed());
        assert_eq!(
            ingress_of(&v).tier,
            Tier::NetworkPolicy,
            "isolated, not allowed: final"
        );

        // The Admin tier comes first, whichever way.
        let admin_deny = cnp(
            "no-ops",
            "Admin",
            900,
            shop_ingress(json!([from_team("Deny", "ops")])),
        );
        let o = tiered(std::slice::from_ref(&np), &[baseline.clone(), admin_deny]);
        let v = judge(&o, PROBE, DB, "TCP", 80);
        assert_eq!((v.allowed(), ingress_of(&v).tier), (false, Tier::Admin));
        let admin_accept = cnp(
            "ops-in",
            "Admin",
            900,
            shop_ingress(json!([from_team("Accept", "ops")])),
        );
        let deny_all = policy("shop", "deny-all", json!({"podSelector": {}}));
        let o = tiered(&[deny_all], &[baseline, admin_accept]);
        let v = judge(&o, PROBE, DB, "TCP", 80);
        assert_eq!((v.allowed(), ingress_of(&v).tier), (true, Tier::Admin));
        let v = judge(&o, WEB, DB, "TCP", 80);
        assert_eq!(
            (v.allowed(), ingress_of(&v).tier),
            (false, Tier::NetworkPolicy)
        );
    }

    #[test]
    fn priorities_lower_first_and_ties_by_name() {
        let deny = |name: &str, priority| {
            cnp(
                name,
                "Admin",
                priority,
                shop_ingress(json!([from_team("Deny", "ops")])),
            )
        };
        let accept = |name: &str, priority| {
            cnp(
                name,
                "Admin",
                priority,
                shop_ingress(json!([from_team("Accept", "ops")])),
            )
        };
        let decided = |cluster: &[Value]| {
            let v = judge(&tiered(&[], cluster), PROBE, DB, "TCP", 80);
            (v.allowed(), ingress_of(&v).rule.unwrap().policy)
        };
        assert_eq!(
            decided(&[deny("a", 20), accept("b", 10)]),
            (true, "b".into())
        );
        assert_eq!(
            decided(&[deny("a", 0), accept("b", 1000)]),
            (false, "a".into())
        );
        assert_eq!(
            decided(&[accept("b", 10), deny("a", 10)]),
            (false, "a".into())
        );
        assert_eq!(
            decided(&[accept("a", 10), deny("b", 10)]),
            (true, "a".into())
        );
        // Baseline comes after Admin whatever the numbers.
        let late_admin = deny("z", 1000);
        let early_baseline = cnp(
            "b",
            "Baseline",
            0,
            shop_ingress(json!([from_team("Accept", "ops")])),
        );
        assert_eq!(decided(&[early_baseline, late_admin]), (false, "z".into()));
    }

    #[test]
    fn rules_are_tried_in_order_and_the_first_match_decides() {
        let rules = json!([
            {"name": "web-port", "action": "Accept", "from": [{"namespaces": {"matchLabels": {"team": "ops"}}}],
             "protocols": [{"tcp": {"destinationPort": {"number": 80}}}]},
            {"name": "rest", "action": "Deny", "from": [{"namespaces": {"matchLabels": {"team": "ops"}}}]},
            {"name": "never", "action": "Accept", "from": [{"namespaces": {}}]},
        ]);
        let o = tiered(&[], &[cnp("order", "Admin", 1, shop_ingress(rules))]);
        let v = judge(&o, PROBE, DB, "TCP", 80);
        let rule = ingress_of(&v).rule.unwrap();
        assert_eq!(
            (v.allowed(), rule.index, rule.name.as_str()),
            (true, 0, "web-port")
        );
        let v = judge(&o, PROBE, DB, "TCP", 81);
        let rule = ingress_of(&v).rule.unwrap();
        assert_eq!(
            (v.allowed(), rule.index, rule.action),
            (false, 1, Action::Deny)
        );
        let v = judge(&o, WEB, DB, "UDP", 53);
        assert_eq!((v.allowed(), ingress_of(&v).rule.unwrap().index), (true, 2));
    }

    #[test]
    fn pass_skips_the_rest_of_its_tier() {
        let pass = cnp(
            "delegate",
            "Admin",
            1,
            shop_ingress(json!([from_team("Pass", "ops")])),
        );
        let deny = cnp(
            "strict",
            "Admin",
            2,
            shop_ingress(json!([from_team("Deny", "ops")])),
        );
        let o = tiered(&[], &[pass.clone(), deny.clone()]);
        let v = judge(&o, PROBE, DB, "TCP", 80);
        let d = ingress_of(&v);
        assert!(v.allowed(), "{}", v.why());
        assert_eq!(d.tier, Tier::Default);
        assert_eq!(d.passed.len(), 1);
        assert_eq!(
            (d.passed[0].policy.as_str(), d.passed[0].action),
            ("delegate", Action::Pass)
        );
        // On to NetworkPolicy, then Baseline.
        let baseline = cnp(
            "floor",
            "Baseline",
            1,
            shop_ingress(json!([from_team("Deny", "ops")])),
        );
        let o = tiered(&[], &[pass.clone(), deny.clone(), baseline.clone()]);
        let v = judge(&o, PROBE, DB, "TCP", 80);
        let d = ingress_of(&v);
        assert_eq!(
            (v.allowed(), d.tier, d.passed.len()),
            (false, Tier::Baseline, 1),
            "{}",
            v.why()
        );
        assert_eq!(d.passed[0].policy, "delegate");
        let np = policy("shop", "open", json!({"podSelector": {}, "ingress": [{}]}));
        let v = judge(
            &tiered(&[np], &[pass, deny, baseline]),
            PROBE,
            DB,
            "TCP",
            80,
        );
        assert_eq!(
            (v.allowed(), ingress_of(&v).tier),
            (true, Tier::NetworkPolicy)
        );
        // A Baseline Pass goes on to the default.
        let o = tiered(
            &[],
            &[cnp(
                "b",
                "Baseline",
                1,
                shop_ingress(json!([from_team("Pass", "ops"), from_team("Deny", "ops")])),
            )],
        );
        let v = judge(&o, PROBE, DB, "TCP", 80);
        assert_eq!((v.allowed(), ingress_of(&v).tier), (true, Tier::Default));
    }

    #[test]
    fn subjects_are_namespaces_or_pods_never_host_network_pods() {
        let everything = json!([{"action": "Deny", "to": [{"networks": ["0.0.0.0/0", "::/0"]}]}]);
        let by_pods = cnp(
            "web-out",
            "Admin",
            1,
            json!({
                "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}},
                "egress": everything,
            }),
        );
        let o = tiered(&[], &[by_pods]);
        assert!(!judge(&o, WEB, PROBE, "TCP", 80).allowed());
        assert!(judge(&o, DB, PROBE, "TCP", 80).allowed());
        // ops/agent has app=web but is on the host network: its traffic is its node's.
        let v = judge(&o, "192.0.2.2", PROBE, "TCP", 80);
        assert!(v.egress.is_none() && v.allowed(), "{}", v.why());
        let by_namespace = cnp(
            "ops-out",
            "Admin",
            1,
            json!({
                "subject": {"namespaces": {"matchLabels": {"team": "ops"}}},
                "egress": everything,
            }),
        );
        let o = tiered(&[], &[by_namespace]);
        assert!(!judge(&o, PROBE, WEB, "TCP", 80).allowed());
        assert!(judge(&o, WEB, PROBE, "TCP", 80).allowed());
        assert!(judge(&o, "192.0.2.2", WEB, "TCP", 80).allowed());
    }

    #[test]
    fn peers_namespaces_pods_networks_and_nodes() {
        let web_egress = |rules: Value| {
            cnp(
                "web-out",
                "Admin",
                1,
                json!({
                    "subject": {"pods": {"namespaceSelector": {"matchLabels": {"team": "shop"}},
                                         "podSelector": {"matchLabels": {"app": "web"}}}},
                    "egress": rules,
                }),
            )
        };
        let denied = |rule: Value, to: &str| {
            !judge(
                &tiered(&[], &[web_egress(json!([rule]))]),
                WEB,
                to,
                "TCP",
                80,
            )
            .allowed()
        };
        let ns =
            json!({"action": "Deny", "to": [{"namespaces": {"matchLabels": {"audit": "yes"}}}]});
        assert!(denied(ns.clone(), PROBE) && !denied(ns, DB));
        let pods = json!({"action": "Deny", "to": [{"pods": {"namespaceSelector": {},
                                                          "podSelector": {"matchLabels": {"tier": "data"}}}}]});
        assert!(denied(pods.clone(), DB) && !denied(pods, PROBE));
        // Networks hold pod addresses (and any other).
        let net =
            json!({"action": "Deny", "to": [{"networks": ["10.0.2.0/24", "198.51.100.0/24"]}]});
        assert!(denied(net.clone(), DB) && !denied(net.clone(), PROBE));
        assert!(denied(net, "198.51.100.9"));
        // Nodes: their status addresses, not the pods on them.
        let nodes = json!({"action": "Deny", "to": [{"nodes": {"matchLabels": {"zone": "b"}}}]});
        assert!(denied(nodes.clone(), "192.0.2.2"));
        assert!(!denied(nodes.clone(), "192.0.2.1"));
        assert!(!denied(nodes, DB), "db runs on node-2 but is not node-2");
        let all_nodes = json!({"action": "Deny", "to": [{"nodes": {}}]});
        assert!(denied(all_nodes.clone(), "192.0.2.1") && denied(all_nodes, "192.0.2.2"));
        // The host-network pod is no pod peer, whatever its labels.
        let web_pods = json!({"action": "Deny", "to": [{"pods": {"namespaceSelector": {},
                                                             "podSelector": {"matchLabels": {"app": "web"}}}}]});
        assert!(!denied(web_pods.clone(), "192.0.2.2"));
        let ops =
            json!({"action": "Deny", "to": [{"namespaces": {"matchLabels": {"team": "ops"}}}]});
        assert!(!denied(ops, "192.0.2.2"));
        // Domain names are not resolved: they match nothing.
        let o = tiered(
            &[],
            &[web_egress(json!([
                {"action": "Accept", "to": [{"domainNames": ["*.example.com"]}]},
                {"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]},
            ]))],
        );
        let v = judge(&o, WEB, "203.0.113.7", "TCP", 443);
        assert_eq!((v.allowed(), egress_of(&v).rule.unwrap().index), (false, 1));
        // Ingress peers: a pod peer and a namespace peer.
        let o = tiered(
            &[],
            &[cnp(
                "db-in",
                "Admin",
                1,
                json!({
                    "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}},
                    "ingress": [{"action": "Deny", "from": [
                        {"pods": {"namespaceSelector": {"matchLabels": {"team": "shop"}}, "podSelector": {"matchLabels": {"app": "web"}}}},
                    ]}],
                }),
            )],
        );
        assert!(!judge(&o, WEB, DB, "TCP", 80).allowed());
        assert!(judge(&o, PROBE, DB, "TCP", 80).allowed());
        assert!(judge(&o, "192.0.2.3", DB, "TCP", 80).allowed());
    }

    #[test]
    fn protocols_ports_ranges_and_named_ports() {
        let o = tiered(
            &[],
            &[cnp(
                "ports",
                "Admin",
                1,
                shop_ingress(json!([
                    {"action": "Deny", "from": [{"namespaces": {}}], "protocols": [
                        {"tcp": {"destinationPort": {"number": 80}}},
                        {"udp": {"destinationPort": {"range": {"start": 50, "end": 60}}}},
                        {"destinationNamedPort": "http"},
                        {"sctp": {}},
                    ]},
                ])),
            )],
        );
        let denied = |protocol: &str, port: u16| !judge(&o, PROBE, DB, protocol, port).allowed();
        assert!(denied("TCP", 80) && !denied("TCP", 81) && !denied("UDP", 80));
        assert!(denied("UDP", 50) && denied("UDP", 60) && !denied("UDP", 61) && !denied("UDP", 49));
        assert!(denied("TCP", 8080), "http is TCP 8080 on db");
        assert!(!denied("UDP", 8080));
        assert!(
            denied("SCTP", 1) && denied("SCTP", 65535),
            "sctp without a port: all"
        );
        assert!(!denied("ICMP", 0));
        // The named port is the destination's: to an address with no pod it matches nothing.
        let o = tiered(
            &[],
            &[cnp(
                "named",
                "Admin",
                1,
                json!({
                    "subject": {"namespaces": {}},
                    "egress": [{"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}],
                                "protocols": [{"destinationNamedPort": "dns"}]}],
                }),
            )],
        );
        assert!(!judge(&o, WEB, DB, "UDP", 53).allowed());
        assert!(judge(&o, WEB, DB, "TCP", 53).allowed());
        assert!(judge(&o, WEB, "198.51.100.1", "UDP", 53).allowed());
        // No protocols: all traffic, ICMP too.
        let o = tiered(
            &[],
            &[cnp(
                "all",
                "Admin",
                1,
                shop_ingress(json!([from_team("Deny", "ops")])),
            )],
        );
        assert!(!judge(&o, PROBE, DB, "ICMP", 0).allowed());
        assert!(!judge(&o, PROBE, DB, "SCTP", 9).allowed());
    }

    #[test]
    fn peers_and_protocols_it_does_not_know_fail_closed() {
        let unknown = json!([{"somethingNewer": {}}]);
        let rule = |action: &str| json!({"action": action, "from": unknown});
        // Accept: matches nothing, so the Baseline's deny holds.
        let floor = cnp(
            "floor",
            "Baseline",
            1,
            shop_ingress(json!([from_team("Deny", "ops")])),
        );
        let o = tiered(
            &[],
            &[
                cnp("open", "Admin", 1, shop_ingress(json!([rule("Accept")]))),
                floor,
            ],
        );
        let v = judge(&o, PROBE, DB, "TCP", 80);
        assert_eq!((v.allowed(), ingress_of(&v).tier), (false, Tier::Baseline));
        assert!(judge(&o, WEB, DB, "TCP", 80).allowed());
        // Deny and Pass: deny all, every peer and port.
        for action in ["Deny", "Pass"] {
            let o = tiered(
                &[],
                &[cnp(
                    "closed",
                    "Admin",
                    1,
                    shop_ingress(json!([rule(action)])),
                )],
            );
            for (from, protocol, port) in [
                (PROBE, "TCP", 80),
                (WEB, "UDP", 53),
                ("203.0.113.1", "ICMP", 0),
            ] {
                let v = judge(&o, from, DB, protocol, port);
                let rule = ingress_of(&v).rule.unwrap();
                assert!(!v.allowed() && rule.failed_closed, "{action}: {}", v.why());
            }
        }
        // Networks is no ingress peer; an unknown protocol entry closes the rule too.
        let o = tiered(
            &[],
            &[cnp(
                "in-net",
                "Admin",
                1,
                shop_ingress(json!([
                    {"action": "Deny", "from": [{"networks": ["198.51.100.0/24"]}]},
                ])),
            )],
        );
        assert!(!judge(&o, PROBE, DB, "TCP", 80).allowed());
        let o = tiered(
            &[],
            &[cnp(
                "proto",
                "Admin",
                1,
                shop_ingress(json!([
                    {"action": "Pass", "from": [{"namespaces": {"matchLabels": {"team": "nobody"}}}],
                     "protocols": [{"icmp": {"type": 8}}]},
                ])),
            )],
        );
        assert!(!judge(&o, PROBE, DB, "TCP", 80).allowed());
        // A known peer next to an unknown one does not save the rule.
        let o = tiered(
            &[],
            &[cnp(
                "mixed",
                "Admin",
                1,
                shop_ingress(json!([
                    {"action": "Accept", "from": [{"namespaces": {}}, {"somethingNewer": {}}]},
                    {"action": "Deny", "from": [{"namespaces": {}}]},
                ])),
            )],
        );
        assert!(!judge(&o, PROBE, DB, "TCP", 80).allowed());
    }

    #[test]
    fn its_own_address_and_its_node_are_not_judged() {
        let o = tiered(
            &[],
            &[cnp(
                "shut",
                "Admin",
                1,
                json!({
                    "subject": {"namespaces": {}},
                    "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]},
                                {"action": "Deny", "from": [{"somethingNewer": {}}]}],
                    "egress": [{"action": "Deny", "to": [{"networks": ["0.0.0.0/0", "::/0"]}]}],
                }),
            )],
        );
        assert!(judge(&o, WEB, "fd00::1:5", "TCP", 80).allowed());
        assert!(judge(&o, "192.0.2.1", WEB, "TCP", 80).allowed(), "its node");
        assert!(
            !judge(&o, "192.0.2.2", WEB, "TCP", 80).allowed(),
            "another node"
        );
        assert!(!judge(&o, PROBE, WEB, "TCP", 80).allowed());
    }

    #[test]
    fn an_egress_accept_leaves_the_destinations_ingress_to_judge() {
        let out = cnp(
            "web-out",
            "Admin",
            1,
            json!({
                "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}},
                "egress": [{"action": "Accept", "to": [{"namespaces": {}}]}],
            }),
        );
        let into = cnp(
            "db-in",
            "Baseline",
            1,
            json!({
                "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}},
                "ingress": [{"action": "Deny", "from": [{"namespaces": {"matchLabels": {"team": "shop"}}}]}],
            }),
        );
        let v = judge(&tiered(&[], &[out, into]), WEB, DB, "TCP", 80);
        assert!(!v.allowed(), "{}", v.why());
        assert_eq!(
            (egress_of(&v).allowed, egress_of(&v).tier),
            (true, Tier::Admin)
        );
        assert_eq!(
            (ingress_of(&v).allowed, ingress_of(&v).tier),
            (false, Tier::Baseline)
        );
    }

    #[test]
    fn the_dropping_decision_is_the_sources_egress_first() {
        let out = cnp(
            "web-out",
            "Admin",
            7,
            json!({
                "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}},
                "egress": [{"name": "no-db", "action": "Deny", "to": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}}]}],
            }),
        );
        let into = cnp(
            "db-in",
            "Baseline",
            3,
            json!({
                "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}},
                "ingress": [{"name": "nobody", "action": "Deny", "from": [{"namespaces": {}}]}],
            }),
        );
        let o = tiered(&[], &[out, into]);
        let rule = |v: &Verdict| {
            let rule = v.denied_by().and_then(|d| d.rule.clone()).expect("a rule");
            (rule.policy, rule.tier, rule.priority, rule.index, rule.name)
        };
        let both = judge(&o, WEB, DB, "TCP", 80);
        assert_eq!(
            rule(&both),
            ("web-out".into(), Tier::Admin, 7, 0, "no-db".into())
        );
        let ingress_only = judge(&o, PROBE, DB, "TCP", 80);
        assert_eq!(
            rule(&ingress_only),
            ("db-in".into(), Tier::Baseline, 3, 0, "nobody".into())
        );
        assert!(
            judge(&o, "192.0.2.2", DB, "TCP", 80).denied_by().is_none(),
            "its node"
        );
        assert!(judge(&o, DB, WEB, "TCP", 80).denied_by().is_none());
        let np = world(&[policy("shop", "deny", json!({"podSelector": {}}))]);
        let v = np.verdict(ip(PROBE), ip(DB), "TCP", 1);
        assert_eq!(
            v.denied_by().map(|d| d.network_policies.clone()),
            Some(vec!["shop/deny".to_owned()])
        );
    }

    #[test]
    fn network_policies_alone_decide_as_before() {
        let o = world(&[policy("shop", "deny", json!({"podSelector": {}}))]);
        let v = o.verdict(ip(PROBE), ip(DB), "TCP", 1);
        assert_eq!(ingress_of(&v).tier, Tier::NetworkPolicy);
        assert_eq!(ingress_of(&v).network_policies, ["shop/deny"]);
        assert_eq!(egress_of(&v), Decision::default());
    }

    #[test]
    fn what_the_api_server_refuses_is_an_error() {
        let read = |policy: Value| {
            let nothing: [Value; 0] = [];
            Oracle::with_cluster_network_policies(&nothing, &nothing, &nothing, &nothing, &[policy])
        };
        let ok = shop_ingress(json!([from_team("Deny", "ops")]));
        assert!(read(cnp("ok", "Admin", 1000, ok.clone())).is_ok());
        assert!(read(cnp("tier", "Developer", 1, ok.clone())).is_err());
        assert!(read(cnp("high", "Admin", 1001, ok)).is_err());
        assert!(
            read(cnp(
                "both",
                "Admin",
                1,
                json!({"subject": {"namespaces": {}, "pods": {"podSelector": {}}}})
            ))
            .is_err()
        );
        assert!(read(cnp("none", "Admin", 1, json!({"subject": {}}))).is_err());
        assert!(
            read(cnp(
                "two",
                "Admin",
                1,
                shop_ingress(json!([
                    {"action": "Deny", "from": [{"namespaces": {}, "pods": {"podSelector": {}}}]}
                ]))
            ))
            .is_err()
        );
        assert!(
            read(cnp(
                "empty",
                "Admin",
                1,
                shop_ingress(json!([{"action": "Deny", "from": []}]))
            ))
            .is_err()
        );
        assert!(
            read(cnp(
                "verb",
                "Admin",
                1,
                shop_ingress(json!([from_team("Allow", "ops")]))
            ))
            .is_err()
        );
        assert!(read(cnp("range", "Admin", 1, shop_ingress(json!([
            {"action": "Deny", "from": [{"namespaces": {}}],
             "protocols": [{"tcp": {"destinationPort": {"range": {"start": 90, "end": 80}}}}]}
        ])))).is_err());
    }
}
