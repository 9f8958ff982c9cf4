//! The ClusterNetworkPolicy conformance suite of network-policy-api (v0.2.0,
//! `conformance/tests`: 18 standard tests, feature `ClusterNetworkPolicy`, and 6
//! experimental ones, 4 of named ports and 2 of node peers; 92 subtests) as data.
//!
//! Upstream runs every test on one base: five namespaces named
//! `network-policy-conformance-<house>`, labelled `conformance-house: <house>`, each
//! with a StatefulSet of two pods (`<name>-0`, `<name>-1`) labelled the same way; the
//! pods of `forbidden-forrest` (`centaur-*`) are on the host network. Its servers listen
//! on TCP 80 (container port `web`) and 8080, UDP 53 (`dns`) and 5353, SCTP 9003 and
//! 9005; the host-network pods on eight consecutive ports from 34345 ([`HOST_PORTS`]).
//!
//! A test applies its manifests (the [`Case`]'s `manifests`), then runs its subtests in
//! order, each a [`Step`]: the changes it makes (which stay for the later subtests, as
//! upstream never undoes them within a test) and the connections it probes, each with
//! the verdict upstream expects. A probe goes from a client pod to a server pod's
//! address (the `status.podIP` upstream reads: for a host-network pod, its node's);
//! upstream's probes of one family hold for both, but where a subtest builds a
//! `/32` from the first pod address its probes hold for IPv4 only (`ipv6: false`).
//!
//! The policies are written here in our words (rule names included); their selectors,
//! actions, peers, protocols, priorities and order are upstream's.

use std::net::IpAddr;

use serde_json::{Value, json};

/// The namespaces' names are `network-policy-conformance-<house>`.
pub const NAMESPACE_PREFIX: &str = "network-policy-conformance-";

/// The houses (namespaces) and the StatefulSet in each.
pub const HOUSES: [(&str, &str); 5] = [
    ("gryffindor", "harry-potter"),
    ("slytherin", "draco-malfoy"),
    ("hufflepuff", "cedric-diggory"),
    ("ravenclaw", "luna-lovegood"),
    ("forbidden-forrest", "centaur"),
];

/// The house whose pods are on the host network.
pub const HOST_NETWORK_HOUSE: &str = "forbidden-forrest";

/// The ports upstream's host-network pods serve (its default range).
pub const HOST_PORTS: [u16; 8] = [34345, 34346, 34347, 34348, 34349, 34350, 34351, 34352];

/// The namespace name label the API server sets.
const NAME: &str = "kubernetes.io/metadata.name";

/// One change a test makes.
#[derive(Debug, Clone)]
pub enum Action {
    /// Creates or replaces a ClusterNetworkPolicy (its whole object).
    Apply(Value),
    /// Changes the ClusterNetworkPolicy of this name in place.
    Edit(&'static str, Edit),
    /// Creates or replaces the NetworkPolicy `house/name` with this spec.
    NetworkPolicy(&'static str, &'static str, Value),
    /// Deletes the NetworkPolicy `house/name`.
    DeleteNetworkPolicy(&'static str, &'static str),
    /// Sets a house's namespace labels (all of them but the name label, which the API
    /// server keeps).
    NamespaceLabels(&'static str, Vec<(&'static str, &'static str)>),
}

/// A change to a ClusterNetworkPolicy's spec.
#[derive(Debug, Clone)]
pub enum Edit {
    /// Swaps two ingress rules.
    SwapIngress(usize, usize),
    /// Swaps two egress rules.
    SwapEgress(usize, usize),
    /// Replaces an ingress rule's protocols with one named destination port.
    IngressNamedPort(usize, &'static str),
    /// Replaces an egress rule's protocols with one named destination port.
    EgressNamedPort(usize, &'static str),
    /// Sets an ingress rule's action.
    IngressAction(usize, &'static str),
    /// Sets an egress rule's action.
    EgressAction(usize, &'static str),
    /// Sets the priority.
    Priority(u32),
    /// Puts a rule before the egress rules.
    PrependEgress(Value),
}

impl Edit {
    /// Applies the change to a policy object; an error names what the policy lacks.
    pub fn apply(&self, policy: &mut Value) -> Result<(), String> {
        let spec = &mut policy["spec"];
        fn rules<'a>(spec: &'a mut Value, field: &str) -> Result<&'a mut Vec<Value>, String> {
            spec[field]
                .as_array_mut()
                .ok_or_else(|| format!("the policy has no {field} rules"))
        }
        fn rule<'a>(spec: &'a mut Value, field: &str, i: usize) -> Result<&'a mut Value, String> {
            rules(spec, field)?
                .get_mut(i)
                .ok_or_else(|| format!("the policy has no {field} rule {i}"))
        }
        let swap = |list: &mut Vec<Value>, a: usize, b: usize| {
            if a.max(b) < list.len() {
                list.swap(a, b);
                Ok(())
            } else {
                Err(format!("no rules {a} and {b} to swap"))
            }
        };
        match self {
            Edit::SwapIngress(a, b) => swap(rules(spec, "ingress")?, *a, *b),
            Edit::SwapEgress(a, b) => swap(rules(spec, "egress")?, *a, *b),
            Edit::IngressNamedPort(i, name) => {
                rule(spec, "ingress", *i)?["protocols"] = json!([{"destinationNamedPort": name}]);
                Ok(())
            }
            Edit::EgressNamedPort(i, name) => {
                rule(spec, "egress", *i)?["protocols"] = json!([{"destinationNamedPort": name}]);
                Ok(())
            }
            Edit::IngressAction(i, action) => {
                rule(spec, "ingress", *i)?["action"] = json!(action);
                Ok(())
            }
            Edit::EgressAction(i, action) => {
                rule(spec, "egress", *i)?["action"] = json!(action);
                Ok(())
            }
            Edit::Priority(p) => {
                spec["priority"] = json!(p);
                Ok(())
            }
            Edit::PrependEgress(new) => {
                rules(spec, "egress")?.insert(0, new.clone());
                Ok(())
            }
        }
    }
}

/// One connection a subtest probes and the verdict upstream expects.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The client pod (its name: the house follows from it).
    pub from: &'static str,
    /// The server pod, reached at its pod address.
    pub to: &'static str,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: &'static str,
    /// The port.
    pub port: u16,
    /// Whether upstream expects the connection to be made.
    pub allowed: bool,
}

/// A subtest.
#[derive(Debug, Clone)]
pub struct Step {
    /// Upstream's name for it.
    pub name: &'static str,
    /// Its changes, before its probes.
    pub actions: Vec<Action>,
    /// Whether its probes hold for IPv6 too (not where it builds a CIDR from the
    /// first pod address).
    pub ipv6: bool,
    /// The probes, in upstream's order.
    pub probes: Vec<Probe>,
}

/// A conformance test.
#[derive(Debug, Clone)]
pub struct Case {
    /// Upstream's short name.
    pub name: &'static str,
    /// Whether it tests an experimental feature (named ports, node peers).
    pub experimental: bool,
    /// The manifests applied before the first subtest.
    pub manifests: Vec<Action>,
    /// The subtests, in order.
    pub steps: Vec<Step>,
}

/// The house (namespace) of a pod, from its StatefulSet's name.
pub fn house_of(pod: &str) -> Option<&'static str> {
    let (set, _) = pod.rsplit_once('-')?;
    HOUSES.iter().find(|(_, s)| *s == set).map(|(h, _)| *h)
}

/// A house's namespace name.
pub fn namespace(house: &str) -> String {
    format!("{NAMESPACE_PREFIX}{house}")
}

/// Selects a house's namespace by the API server's name label.
fn by_name(house: &str) -> Value {
    json!({"matchLabels": {NAME: namespace(house)}})
}

/// Selects a house's namespace, or its pods, by their `conformance-house` label.
fn by_label(house: &str) -> Value {
    json!({"matchLabels": {"conformance-house": house}})
}

/// A `namespaces` peer or subject.
fn namespaces(selector: Value) -> Value {
    json!({"namespaces": selector})
}

/// A `pods` peer or subject: the house's labelled pods in its labelled namespace.
fn house_pods(house: &str) -> Value {
    json!({"pods": {"namespaceSelector": by_label(house), "podSelector": by_label(house)}})
}

fn tcp(port: u16) -> Value {
    json!({"tcp": {"destinationPort": {"number": port}}})
}

fn udp(port: u16) -> Value {
    json!({"udp": {"destinationPort": {"number": port}}})
}

fn sctp(port: u16) -> Value {
    json!({"sctp": {"destinationPort": {"number": port}}})
}

/// Which way a policy's rules go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Ingress,
    Egress,
}

impl Way {
    fn rules(self) -> &'static str {
        match self {
            Way::Ingress => "ingress",
            Way::Egress => "egress",
        }
    }

    fn peers(self) -> &'static str {
        match self {
            Way::Ingress => "from",
            Way::Egress => "to",
        }
    }
}

/// A rule; `protocols` left out when empty.
fn rule(way: Way, name: &str, action: &str, peers: Value, protocols: &[Value]) -> Value {
    let mut rule = json!({"name": name, "action": action, way.peers(): peers});
    if !protocols.is_empty() {
        rule["protocols"] = json!(protocols);
    }
    rule
}

fn policy(
    name: &str,
    tier: &str,
    priority: u32,
    subject: Value,
    rules: &[(Way, Vec<Value>)],
) -> Value {
    let mut spec = json!({"tier": tier, "priority": priority, "subject": subject});
    for (way, list) in rules {
        spec[way.rules()] = json!(list);
    }
    cni_kube_api::cluster_network_policy(name, spec)
}

/// The rule ladder of upstream's per-protocol tests, for one way, peers by namespace
/// name: everything of `first` accepted, then denied, then (Admin) passed; `second` on
/// `second_ports` denied, then (Admin) passed; `third` on `third_ports` accepted, then
/// everything else of `third` denied. The later rules of a house only matter once a
/// test reorders them.
fn ladder(
    way: Way,
    admin: bool,
    first: &str,
    (second, second_ports): (&str, &[Value]),
    (third, third_ports): (&str, &[Value]),
) -> Vec<Value> {
    let peer = |house: &str| json!([namespaces(by_name(house))]);
    let mut rules = vec![
        rule(way, &format!("accept-{first}"), "Accept", peer(first), &[]),
        rule(way, &format!("deny-{first}"), "Deny", peer(first), &[]),
    ];
    if admin {
        rules.push(rule(
            way,
            &format!("pass-{first}"),
            "Pass",
            peer(first),
            &[],
        ));
    }
    rules.push(rule(
        way,
        &format!("deny-{second}-ports"),
        "Deny",
        peer(second),
        second_ports,
    ));
    if admin {
        rules.push(rule(
            way,
            &format!("pass-{second}-ports"),
            "Pass",
            peer(second),
            second_ports,
        ));
    }
    rules.push(rule(
        way,
        &format!("accept-{third}-ports"),
        "Accept",
        peer(third),
        third_ports,
    ));
    rules.push(rule(
        way,
        &format!("deny-{third}-rest"),
        "Deny",
        peer(third),
        &[],
    ));
    rules
}

/// A policy of one ladder: Admin policies are named and prioritised as upstream's,
/// Baseline ones are all `default` at 10.
fn ladder_policy(
    admin: Option<(&str, u32)>,
    subject: &str,
    ladders: Vec<(Way, Vec<Value>)>,
) -> Action {
    let (name, tier, priority) = match admin {
        Some((name, priority)) => (name, "Admin", priority),
        None => ("default", "Baseline", 10),
    };
    Action::Apply(policy(
        name,
        tier,
        priority,
        namespaces(by_name(subject)),
        &ladders,
    ))
}

fn yes(from: &'static str, to: &'static str, protocol: &'static str, port: u16) -> Probe {
    Probe {
        from,
        to,
        protocol,
        port,
        allowed: true,
    }
}

fn no(from: &'static str, to: &'static str, protocol: &'static str, port: u16) -> Probe {
    Probe {
        from,
        to,
        protocol,
        port,
        allowed: false,
    }
}

fn step(name: &'static str, actions: Vec<Action>, probes: Vec<Probe>) -> Step {
    Step {
        name,
        actions,
        ipv6: true,
        probes,
    }
}

fn edit(policy: &'static str, change: Edit) -> Action {
    Action::Edit(policy, change)
}

/// Upstream's six-subtest shape of the per-protocol tests: accept everything of the
/// first house (rule order respected), accept on the third's ports, deny after swapping
/// accept and deny, deny on the second's ports, pass after swapping (Admin only: pass
/// and the port pass). `probes` holds each subtest's probes.
fn protocol_case(
    name: &'static str,
    policy: &'static str,
    admin: bool,
    ingress: bool,
    manifest: Action,
    probes: [Vec<Probe>; 6],
) -> Case {
    let swap = |a, b| {
        if ingress {
            Edit::SwapIngress(a, b)
        } else {
            Edit::SwapEgress(a, b)
        }
    };
    let way = if ingress { "ingress" } else { "egress" };
    let [accept, accept_port, deny, deny_port, pass, pass_port] = probes;
    let mut steps = vec![
        step(
            leak(format!("accept-{way}: rule order respected")),
            vec![],
            accept,
        ),
        step(
            leak(format!("accept-{way}: at the specified port")),
            vec![],
            accept_port,
        ),
        step(
            leak(format!("deny-{way}: rule order respected")),
            vec![edit(policy, swap(0, 1))],
            deny,
        ),
        step(
            leak(format!("deny-{way}: at the specified port")),
            vec![],
            deny_port,
        ),
    ];
    if admin {
        steps.push(step(
            leak(format!("pass-{way}: rule order respected")),
            vec![edit(policy, swap(0, 2))],
            pass,
        ));
        steps.push(step(
            leak(format!("pass-{way}: at the specified port")),
            vec![edit(policy, swap(3, 4))],
            pass_port,
        ));
    }
    Case {
        name,
        experimental: false,
        manifests: vec![manifest],
        steps,
    }
}

/// Step names are built once per run: leaking them keeps [`Step`] plain data.
fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// The per-protocol tests of one tier (6 of the Admin tier with 6 subtests each, 6 of
/// the Baseline tier with 4).
fn per_protocol(admin: bool) -> Vec<Case> {
    let a = |name, priority| admin.then_some((name, priority));
    let tier = |admin_name: &'static str, baseline_name: &'static str| {
        if admin { admin_name } else { baseline_name }
    };
    let policy = |name: &'static str| if admin { name } else { "default" };
    let (i, e) = (Way::Ingress, Way::Egress);
    vec![
        protocol_case(
            tier("CNPAdminTierIngressSCTP", "CNPBaselineTierIngressSCTP"),
            policy("ingress-sctp"),
            admin,
            true,
            ladder_policy(
                a("ingress-sctp", 5),
                "ravenclaw",
                vec![(
                    i,
                    ladder(
                        i,
                        admin,
                        "gryffindor",
                        ("slytherin", &[sctp(9003)]),
                        ("hufflepuff", &[sctp(9003)]),
                    ),
                )],
            ),
            [
                vec![
                    yes("harry-potter-0", "luna-lovegood-0", "SCTP", 9003),
                    yes("harry-potter-1", "luna-lovegood-0", "SCTP", 9005),
                ],
                vec![
                    yes("cedric-diggory-0", "luna-lovegood-1", "SCTP", 9003),
                    no("cedric-diggory-1", "luna-lovegood-1", "SCTP", 9005),
                ],
                vec![
                    no("harry-potter-0", "luna-lovegood-1", "SCTP", 9003),
                    no("harry-potter-1", "luna-lovegood-1", "SCTP", 9005),
                ],
                vec![
                    no("draco-malfoy-0", "luna-lovegood-0", "SCTP", 9003),
                    yes("draco-malfoy-1", "luna-lovegood-0", "SCTP", 9005),
                ],
                vec![
                    yes("harry-potter-0", "luna-lovegood-1", "SCTP", 9003),
                    yes("harry-potter-1", "luna-lovegood-1", "SCTP", 9005),
                ],
                vec![
                    yes("draco-malfoy-0", "luna-lovegood-0", "SCTP", 9003),
                    yes("draco-malfoy-1", "luna-lovegood-0", "SCTP", 9005),
                ],
            ],
        ),
        protocol_case(
            tier("CNPAdminTierIngressTCP", "CNPBaselineTierIngressTCP"),
            policy("ingress-tcp"),
            admin,
            true,
            ladder_policy(
                a("ingress-tcp", 3),
                "gryffindor",
                vec![(
                    i,
                    ladder(
                        i,
                        admin,
                        "ravenclaw",
                        ("slytherin", &[tcp(80)]),
                        ("hufflepuff", &[tcp(80)]),
                    ),
                )],
            ),
            [
                vec![
                    yes("luna-lovegood-0", "harry-potter-0", "TCP", 80),
                    yes("luna-lovegood-1", "harry-potter-0", "TCP", 8080),
                ],
                vec![
                    yes("cedric-diggory-0", "harry-potter-1", "TCP", 80),
                    no("cedric-diggory-1", "harry-potter-1", "TCP", 8080),
                ],
                vec![
                    no("luna-lovegood-0", "harry-potter-1", "TCP", 80),
                    no("luna-lovegood-1", "harry-potter-1", "TCP", 8080),
                ],
                vec![
                    no("draco-malfoy-0", "harry-potter-0", "TCP", 80),
                    yes("draco-malfoy-1", "harry-potter-0", "TCP", 8080),
                ],
                vec![
                    yes("luna-lovegood-0", "harry-potter-0", "TCP", 80),
                    yes("luna-lovegood-1", "harry-potter-0", "TCP", 8080),
                ],
                vec![
                    yes("draco-malfoy-0", "harry-potter-0", "TCP", 80),
                    yes("draco-malfoy-1", "harry-potter-0", "TCP", 8080),
                ],
            ],
        ),
        protocol_case(
            tier("CNPAdminTierIngressUDP", "CNPBaselineTierIngressUDP"),
            policy("ingress-udp"),
            admin,
            true,
            ladder_policy(
                a("ingress-udp", 4),
                "hufflepuff",
                vec![(
                    i,
                    ladder(
                        i,
                        admin,
                        "ravenclaw",
                        ("slytherin", &[udp(5353)]),
                        ("gryffindor", &[udp(53)]),
                    ),
                )],
            ),
            [
                vec![
                    yes("luna-lovegood-0", "cedric-diggory-0", "UDP", 53),
                    yes("luna-lovegood-1", "cedric-diggory-0", "UDP", 5353),
                ],
                vec![
                    yes("harry-potter-0", "cedric-diggory-1", "UDP", 53),
                    no("harry-potter-1", "cedric-diggory-1", "UDP", 5353),
                ],
                vec![
                    no("luna-lovegood-0", "cedric-diggory-1", "UDP", 53),
                    no("luna-lovegood-1", "cedric-diggory-1", "UDP", 5353),
                ],
                vec![
                    no("draco-malfoy-0", "cedric-diggory-0", "UDP", 5353),
                    yes("draco-malfoy-1", "cedric-diggory-0", "UDP", 53),
                ],
                vec![
                    yes("luna-lovegood-0", "cedric-diggory-1", "UDP", 5353),
                    yes("luna-lovegood-1", "cedric-diggory-1", "UDP", 53),
                ],
                vec![
                    yes("draco-malfoy-0", "cedric-diggory-0", "UDP", 5353),
                    yes("draco-malfoy-1", "cedric-diggory-0", "UDP", 53),
                ],
            ],
        ),
        protocol_case(
            tier("CNPAdminTierEgressSCTP", "CNPBaselineTierEgressSCTP"),
            policy("egress-sctp"),
            admin,
            false,
            ladder_policy(
                a("egress-sctp", 8),
                "ravenclaw",
                vec![(
                    e,
                    ladder(
                        e,
                        admin,
                        "gryffindor",
                        ("slytherin", &[sctp(9003)]),
                        ("hufflepuff", &[sctp(9003)]),
                    ),
                )],
            ),
            [
                vec![
                    yes("luna-lovegood-0", "harry-potter-0", "SCTP", 9003),
                    yes("luna-lovegood-1", "harry-potter-0", "SCTP", 9005),
                ],
                vec![
                    yes("luna-lovegood-0", "cedric-diggory-1", "SCTP", 9003),
                    no("luna-lovegood-1", "cedric-diggory-1", "SCTP", 9005),
                ],
                vec![
                    no("luna-lovegood-0", "harry-potter-1", "SCTP", 9003),
                    no("luna-lovegood-1", "harry-potter-1", "SCTP", 9005),
                ],
                vec![
                    no("luna-lovegood-0", "draco-malfoy-0", "SCTP", 9003),
                    yes("luna-lovegood-1", "draco-malfoy-0", "SCTP", 9005),
                ],
                vec![
                    yes("luna-lovegood-0", "harry-potter-1", "SCTP", 9003),
                    yes("luna-lovegood-1", "harry-potter-1", "SCTP", 9005),
                ],
                vec![
                    yes("luna-lovegood-0", "draco-malfoy-0", "SCTP", 9003),
                    yes("luna-lovegood-1", "draco-malfoy-0", "SCTP", 9005),
                ],
            ],
        ),
        protocol_case(
            tier("CNPAdminTierEgressTCP", "CNPBaselineTierEgressTCP"),
            policy("egress-tcp"),
            admin,
            false,
            ladder_policy(
                a("egress-tcp", 6),
                "gryffindor",
                vec![(
                    e,
                    ladder(
                        e,
                        admin,
                        "ravenclaw",
                        ("slytherin", &[tcp(80)]),
                        ("hufflepuff", &[tcp(8080)]),
                    ),
                )],
            ),
            [
                vec![
                    yes("harry-potter-0", "luna-lovegood-0", "TCP", 80),
                    yes("harry-potter-1", "luna-lovegood-0", "TCP", 8080),
                ],
                vec![
                    yes("harry-potter-0", "cedric-diggory-1", "TCP", 8080),
                    no("harry-potter-1", "cedric-diggory-1", "TCP", 80),
                ],
                vec![
                    no("harry-potter-0", "luna-lovegood-1", "TCP", 80),
                    no("harry-potter-1", "luna-lovegood-1", "TCP", 8080),
                ],
                vec![
                    no("harry-potter-0", "draco-malfoy-0", "TCP", 80),
                    yes("harry-potter-1", "draco-malfoy-0", "TCP", 8080),
                ],
                vec![
                    yes("harry-potter-0", "luna-lovegood-0", "TCP", 80),
                    yes("harry-potter-1", "luna-lovegood-0", "TCP", 8080),
                ],
                vec![
                    yes("harry-potter-0", "draco-malfoy-0", "TCP", 80),
                    yes("harry-potter-1", "draco-malfoy-0", "TCP", 8080),
                ],
            ],
        ),
        protocol_case(
            tier("CNPAdminTierEgressUDP", "CNPBaselineTierEgressUDP"),
            policy("egress-udp"),
            admin,
            false,
            ladder_policy(
                a("egress-udp", 7),
                "hufflepuff",
                vec![(
                    e,
                    ladder(
                        e,
                        admin,
                        "ravenclaw",
                        ("slytherin", &[udp(5353)]),
                        ("gryffindor", &[udp(53)]),
                    ),
                )],
            ),
            [
                vec![
                    yes("cedric-diggory-0", "luna-lovegood-0", "UDP", 53),
                    yes("cedric-diggory-1", "luna-lovegood-0", "UDP", 5353),
                ],
                vec![
                    yes("cedric-diggory-0", "harry-potter-1", "UDP", 53),
                    no("cedric-diggory-1", "harry-potter-1", "UDP", 5353),
                ],
                vec![
                    no("cedric-diggory-0", "luna-lovegood-1", "UDP", 53),
                    no("cedric-diggory-1", "luna-lovegood-1", "UDP", 5353),
                ],
                vec![
                    no("cedric-diggory-0", "draco-malfoy-0", "UDP", 5353),
                    yes("cedric-diggory-1", "draco-malfoy-0", "UDP", 53),
                ],
                vec![
                    yes("cedric-diggory-0", "luna-lovegood-1", "UDP", 5353),
                    yes("cedric-diggory-1", "luna-lovegood-1", "UDP", 53),
                ],
                vec![
                    yes("cedric-diggory-0", "draco-malfoy-0", "UDP", 5353),
                    yes("cedric-diggory-1", "draco-malfoy-0", "UDP", 53),
                ],
            ],
        ),
    ]
}

/// The combined ingress and egress test of one tier (6 or 4 subtests).
fn gress(admin: bool) -> Case {
    let (i, e) = (Way::Ingress, Way::Egress);
    let slytherin = [tcp(80), udp(53), sctp(9003)];
    let manifest = ladder_policy(
        admin.then_some(("gress-rules", 15)),
        "gryffindor",
        vec![
            (
                e,
                ladder(
                    e,
                    admin,
                    "ravenclaw",
                    ("slytherin", &slytherin),
                    ("hufflepuff", &[tcp(8080), udp(5353), sctp(9003)]),
                ),
            ),
            (
                i,
                ladder(
                    i,
                    admin,
                    "ravenclaw",
                    ("slytherin", &slytherin),
                    ("hufflepuff", &[tcp(80), udp(5353), sctp(9003)]),
                ),
            ),
        ],
    );
    let policy = if admin { "gress-rules" } else { "default" };
    let mut steps = vec![
        step(
            "accept-gress across protocols",
            vec![],
            vec![
                yes("harry-potter-0", "luna-lovegood-0", "TCP", 80),
                yes("harry-potter-1", "luna-lovegood-0", "UDP", 53),
                yes("harry-potter-0", "luna-lovegood-0", "SCTP", 9003),
                yes("luna-lovegood-0", "harry-potter-0", "TCP", 80),
                yes("luna-lovegood-1", "harry-potter-0", "UDP", 53),
                yes("luna-lovegood-1", "harry-potter-0", "SCTP", 9003),
            ],
        ),
        step(
            "accept-gress across protocols at the specified ports",
            vec![],
            vec![
                yes("harry-potter-0", "cedric-diggory-1", "TCP", 8080),
                no("harry-potter-1", "cedric-diggory-1", "TCP", 80),
                yes("harry-potter-0", "cedric-diggory-1", "UDP", 5353),
                no("harry-potter-1", "cedric-diggory-1", "UDP", 53),
                yes("harry-potter-0", "cedric-diggory-1", "SCTP", 9003),
                no("harry-potter-1", "cedric-diggory-1", "SCTP", 9005),
                yes("cedric-diggory-0", "harry-potter-1", "TCP", 80),
                no("cedric-diggory-1", "harry-potter-1", "TCP", 8080),
                yes("cedric-diggory-0", "harry-potter-1", "UDP", 5353),
                no("cedric-diggory-1", "harry-potter-1", "UDP", 53),
                yes("cedric-diggory-0", "harry-potter-1", "SCTP", 9003),
                no("cedric-diggory-1", "harry-potter-1", "SCTP", 9005),
            ],
        ),
        step(
            "deny-gress across protocols",
            vec![
                edit(policy, Edit::SwapEgress(0, 1)),
                edit(policy, Edit::SwapIngress(0, 1)),
            ],
            vec![
                no("harry-potter-0", "luna-lovegood-1", "TCP", 80),
                no("harry-potter-1", "luna-lovegood-1", "UDP", 53),
                no("harry-potter-0", "luna-lovegood-1", "SCTP", 9003),
                no("luna-lovegood-0", "harry-potter-1", "TCP", 80),
                no("luna-lovegood-1", "harry-potter-1", "UDP", 53),
                no("luna-lovegood-1", "harry-potter-1", "SCTP", 9003),
            ],
        ),
        step(
            "deny-gress across protocols at the specified ports",
            vec![],
            vec![
                no("harry-potter-0", "draco-malfoy-0", "TCP", 80),
                yes("harry-potter-1", "draco-malfoy-0", "TCP", 8080),
                no("harry-potter-0", "draco-malfoy-0", "UDP", 53),
                yes("harry-potter-1", "draco-malfoy-0", "UDP", 5353),
                no("harry-potter-0", "draco-malfoy-0", "SCTP", 9003),
                yes("harry-potter-1", "draco-malfoy-0", "SCTP", 9005),
                no("draco-malfoy-0", "harry-potter-0", "TCP", 80),
                yes("draco-malfoy-1", "harry-potter-0", "TCP", 8080),
                no("draco-malfoy-0", "harry-potter-0", "UDP", 53),
                yes("draco-malfoy-1", "harry-potter-0", "UDP", 5353),
                no("draco-malfoy-0", "harry-potter-0", "SCTP", 9003),
                yes("draco-malfoy-1", "harry-potter-0", "SCTP", 9005),
            ],
        ),
    ];
    if admin {
        steps.push(step(
            "pass-gress across protocols",
            vec![
                edit(policy, Edit::SwapEgress(0, 2)),
                edit(policy, Edit::SwapIngress(0, 2)),
            ],
            vec![
                yes("harry-potter-0", "luna-lovegood-0", "TCP", 80),
                yes("harry-potter-0", "luna-lovegood-0", "UDP", 5353),
                yes("harry-potter-0", "luna-lovegood-0", "SCTP", 9003),
                yes("luna-lovegood-0", "harry-potter-0", "TCP", 80),
                yes("luna-lovegood-1", "harry-potter-0", "UDP", 53),
                yes("luna-lovegood-1", "harry-potter-0", "SCTP", 9003),
            ],
        ));
        steps.push(step(
            "pass-gress across protocols at the specified ports",
            vec![
                edit(policy, Edit::SwapEgress(3, 4)),
                edit(policy, Edit::SwapIngress(3, 4)),
            ],
            vec![
                yes("harry-potter-0", "draco-malfoy-0", "TCP", 80),
                yes("harry-potter-1", "draco-malfoy-0", "TCP", 8080),
                yes("harry-potter-0", "draco-malfoy-0", "UDP", 53),
                yes("harry-potter-1", "draco-malfoy-0", "UDP", 5353),
                yes("harry-potter-0", "draco-malfoy-0", "SCTP", 9003),
                yes("harry-potter-1", "draco-malfoy-0", "SCTP", 9005),
                yes("draco-malfoy-0", "harry-potter-0", "TCP", 80),
                yes("draco-malfoy-1", "harry-potter-0", "TCP", 8080),
                yes("draco-malfoy-0", "harry-potter-0", "UDP", 53),
                yes("draco-malfoy-1", "harry-potter-0", "UDP", 5353),
                yes("draco-malfoy-0", "harry-potter-0", "SCTP", 9003),
                yes("draco-malfoy-1", "harry-potter-0", "SCTP", 9005),
            ],
        ));
    }
    Case {
        name: if admin {
            "CNPAdminTierGress"
        } else {
            "CNPBaselineTierGress"
        },
        experimental: false,
        manifests: vec![manifest],
        steps,
    }
}

/// The inline CIDR test of one tier: egress of gryffindor accepted to slytherin's pods,
/// everything else denied by `networks`; then two pods' `/32`s accepted first.
fn inline_cidr(admin: bool, ip_of: &dyn Fn(&str) -> IpAddr) -> Case {
    let egress = vec![
        rule(
            Way::Egress,
            "accept-slytherin-pods",
            "Accept",
            json!([house_pods("slytherin")]),
            &[],
        ),
        rule(
            Way::Egress,
            "deny-everywhere",
            "Deny",
            json!([{"networks": ["0.0.0.0/0", "::/0"]}]),
            &[],
        ),
    ];
    let (name, manifest) = if admin {
        let subject = json!({"pods": {"namespaceSelector": by_label("gryffindor"), "podSelector": by_label("gryffindor")}});
        (
            "inline-cidr-as-peers-example",
            policy(
                "inline-cidr-as-peers-example",
                "Admin",
                85,
                subject,
                &[(Way::Egress, egress)],
            ),
        )
    } else {
        (
            "default",
            policy(
                "default",
                "Baseline",
                10,
                namespaces(by_name("gryffindor")),
                &[(Way::Egress, egress)],
            ),
        )
    };
    let all_three = |to: &'static str, allowed: bool| {
        let probe = if allowed { yes } else { no };
        vec![
            probe("harry-potter-1", to, "TCP", 80),
            probe("harry-potter-1", to, "UDP", 53),
            probe("harry-potter-1", to, "SCTP", 9003),
        ]
    };
    let host = |pod: &str| {
        let ip = ip_of(pod);
        format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 })
    };
    let two_pods = rule(
        Way::Egress,
        "accept-two-pods",
        "Accept",
        json!([{"networks": [host("luna-lovegood-0"), host("cedric-diggory-0")]}]),
        &[],
    );
    let deny = [
        all_three("luna-lovegood-0", false),
        all_three("cedric-diggory-0", false),
        all_three("draco-malfoy-0", true),
    ]
    .concat();
    Case {
        name: if admin {
            "CNPAdminTierEgressInlineCIDRPeers"
        } else {
            "CNPBaselineTierEgressInlineCIDRPeers"
        },
        experimental: false,
        manifests: vec![Action::Apply(manifest)],
        steps: vec![
            // One subtest upstream; its namespace relabelling splits it here into three.
            Step {
                name: "deny-egress to cidr peers",
                actions: vec![],
                ipv6: true,
                probes: deny,
            },
            Step {
                name: "deny-egress to cidr peers (slytherin relabelled)",
                actions: vec![Action::NamespaceLabels(
                    "slytherin",
                    vec![("conformance-house", "denied-namespace-label")],
                )],
                ipv6: true,
                probes: all_three("draco-malfoy-0", false),
            },
            Step {
                name: "deny-egress to cidr peers (slytherin's label back)",
                actions: vec![Action::NamespaceLabels(
                    "slytherin",
                    vec![("conformance-house", "slytherin")],
                )],
                ipv6: true,
                probes: all_three("draco-malfoy-0", true),
            },
            Step {
                name: "accept-egress to cidr peers",
                actions: vec![edit(name, Edit::PrependEgress(two_pods))],
                ipv6: false,
                probes: [
                    all_three("luna-lovegood-0", true),
                    all_three("cedric-diggory-0", true),
                    all_three("luna-lovegood-1", false),
                    all_three("cedric-diggory-1", false),
                ]
                .concat(),
            },
        ],
    }
}

/// Gryffindor and slytherin pods both ways, on TCP 80 and 8080.
fn both_ways(allowed: bool) -> Vec<Probe> {
    let probe = if allowed { yes } else { no };
    vec![
        probe("draco-malfoy-0", "harry-potter-0", "TCP", 80),
        probe("draco-malfoy-1", "harry-potter-0", "TCP", 8080),
        probe("harry-potter-0", "draco-malfoy-0", "TCP", 80),
        probe("harry-potter-1", "draco-malfoy-0", "TCP", 8080),
    ]
}

fn priority_case() -> Case {
    let subject = json!({"pods": {"namespaceSelector": by_label("gryffindor"), "podSelector": by_label("gryffindor")}});
    let both = |action: &str| {
        vec![
            (
                Way::Ingress,
                vec![rule(
                    Way::Ingress,
                    &format!("{}-slytherin-in", action.to_lowercase()),
                    action,
                    json!([house_pods("slytherin")]),
                    &[],
                )],
            ),
            (
                Way::Egress,
                vec![rule(
                    Way::Egress,
                    &format!("{}-slytherin-out", action.to_lowercase()),
                    action,
                    json!([house_pods("slytherin")]),
                    &[],
                )],
            ),
        ]
    };
    let deny = both_ways(false);
    Case {
        name: "CNPAdminTierPriorityField",
        experimental: false,
        manifests: vec![
            Action::Apply(policy(
                "priority-50-example",
                "Admin",
                50,
                subject.clone(),
                &both("Deny"),
            )),
            Action::Apply(policy(
                "old-priority-60-new-priority-40-example",
                "Admin",
                60,
                subject.clone(),
                &both("Pass"),
            )),
            Action::Apply(policy("default", "Baseline", 10, subject, &both("Accept"))),
        ],
        steps: vec![
            step(
                "deny from slytherin to gryffindor",
                vec![],
                deny[..2].to_vec(),
            ),
            step(
                "deny to slytherin from gryffindor",
                vec![],
                deny[2..].to_vec(),
            ),
            step(
                "priority 60 to 40: passed on to the Baseline tier both ways",
                vec![edit(
                    "old-priority-60-new-priority-40-example",
                    Edit::Priority(40),
                )],
                both_ways(true),
            ),
        ],
    }
}

fn integration_case() -> Case {
    let slytherin = || json!([namespaces(by_label("slytherin"))]);
    let deny_both = vec![
        (
            Way::Ingress,
            vec![rule(
                Way::Ingress,
                "deny-slytherin-in",
                "Deny",
                slytherin(),
                &[],
            )],
        ),
        (
            Way::Egress,
            vec![rule(
                Way::Egress,
                "deny-slytherin-out",
                "Deny",
                slytherin(),
                &[],
            )],
        ),
    ];
    let subject = namespaces(by_label("gryffindor"));
    let deny = both_ways(false);
    let allow = both_ways(true);
    Case {
        name: "CNPAdminTierIntegration",
        experimental: false,
        manifests: vec![
            Action::Apply(policy(
                "pass-example",
                "Admin",
                10,
                subject.clone(),
                &deny_both,
            )),
            Action::NetworkPolicy(
                "gryffindor",
                "allow-gress-from-to-slytherin-to-gryffindor",
                json!({
                    "podSelector": {},
                    "policyTypes": ["Ingress", "Egress"],
                    "ingress": [{"from": [{"namespaceSelector": by_label("slytherin")}]}],
                    "egress": [{"to": [{"namespaceSelector": by_label("slytherin")}]}],
                }),
            ),
            Action::Apply(policy("default", "Baseline", 10, subject, &deny_both)),
        ],
        steps: vec![
            step(
                "deny from slytherin to gryffindor (Admin)",
                vec![],
                deny[..2].to_vec(),
            ),
            step(
                "deny to slytherin from gryffindor (Admin)",
                vec![],
                deny[2..].to_vec(),
            ),
            step(
                "pass-ingress: the NetworkPolicy decides",
                vec![edit("pass-example", Edit::IngressAction(0, "Pass"))],
                allow[..2].to_vec(),
            ),
            step(
                "pass-egress: the NetworkPolicy decides",
                vec![edit("pass-example", Edit::EgressAction(0, "Pass"))],
                allow[2..].to_vec(),
            ),
            step(
                "pass-ingress: with the NetworkPolicy gone, the Baseline tier decides",
                vec![Action::DeleteNetworkPolicy(
                    "gryffindor",
                    "allow-gress-from-to-slytherin-to-gryffindor",
                )],
                deny[..2].to_vec(),
            ),
            step(
                "pass-egress: with the NetworkPolicy gone, the Baseline tier decides",
                vec![],
                deny[2..].to_vec(),
            ),
        ],
    }
}

/// The 18 standard tests, in upstream's file order: Admin then Baseline.
pub fn standard(ip_of: &dyn Fn(&str) -> IpAddr) -> Vec<Case> {
    let mut cases = vec![inline_cidr(true, ip_of)];
    let admin = per_protocol(true);
    // Upstream's files: egress SCTP, TCP, UDP, the combined test, ingress SCTP, TCP,
    // UDP, integration, priority.
    cases.extend(admin[3..].iter().cloned());
    cases.push(gress(true));
    cases.extend(admin[..3].iter().cloned());
    cases.push(integration_case());
    cases.push(priority_case());
    cases.push(inline_cidr(false, ip_of));
    let baseline = per_protocol(false);
    cases.extend(baseline[3..].iter().cloned());
    cases.push(gress(false));
    cases.extend(baseline[..3].iter().cloned());
    cases
}

fn named_port_case(
    name: &'static str,
    manifest: Action,
    policy: &'static str,
    change: Edit,
    probes: Vec<Probe>,
) -> Case {
    Case {
        name,
        experimental: true,
        manifests: vec![manifest],
        steps: vec![step(
            "accept on a named port",
            vec![edit(policy, change)],
            probes,
        )],
    }
}

fn node_peers(admin: bool) -> Case {
    let p = HOST_PORTS;
    let linux_nodes = || json!({"nodes": {"matchLabels": {"kubernetes.io/os": "linux"}}});
    let everywhere = json!({"networks": ["0.0.0.0/0", "::/0"]});
    let e = Way::Egress;
    if admin {
        let subject = json!({"pods": {"namespaceSelector": by_label("gryffindor"), "podSelector": by_label("gryffindor")}});
        let rules = vec![
            rule(
                e,
                "accept-nodes-tcp",
                "Accept",
                json!([linux_nodes()]),
                &[tcp(p[0])],
            ),
            rule(
                e,
                "pass-nodes-udp",
                "Pass",
                json!([linux_nodes()]),
                &[udp(p[2])],
            ),
            rule(
                e,
                "deny-slytherin-nodes-everywhere",
                "Deny",
                json!([house_pods("slytherin"), linux_nodes(), everywhere]),
                &[],
            ),
        ];
        Case {
            name: "CNPAdminTierEgressNodePeers",
            experimental: true,
            manifests: vec![Action::Apply(policy(
                "node-and-cidr-as-peers-example",
                "Admin",
                75,
                subject,
                &[(e, rules)],
            ))],
            steps: vec![
                step(
                    "accept-egress to node peers",
                    vec![],
                    vec![yes("harry-potter-1", "centaur-1", "TCP", p[0])],
                ),
                step(
                    "pass-egress to node peers",
                    vec![],
                    vec![yes("harry-potter-1", "centaur-1", "UDP", p[2])],
                ),
                step(
                    "deny-egress to node peers",
                    vec![],
                    vec![
                        no("harry-potter-1", "centaur-1", "TCP", p[1]),
                        no("harry-potter-1", "centaur-1", "UDP", p[4]),
                        no("harry-potter-1", "centaur-1", "SCTP", p[6]),
                    ],
                ),
            ],
        }
    } else {
        let range = json!({"tcp": {"destinationPort": {"range": {"start": p[0], "end": p[1]}}}});
        let rules = vec![
            rule(
                e,
                "accept-nodes-tcp-range",
                "Accept",
                json!([linux_nodes()]),
                &[range],
            ),
            rule(
                e,
                "deny-nodes-everywhere",
                "Deny",
                json!([linux_nodes(), everywhere]),
                &[],
            ),
        ];
        Case {
            name: "CNPBaselineTierEgressNodePeers",
            experimental: true,
            manifests: vec![Action::Apply(policy(
                "default",
                "Baseline",
                10,
                namespaces(by_name("gryffindor")),
                &[(e, rules)],
            ))],
            steps: vec![
                step(
                    "accept-egress to node peers",
                    vec![],
                    vec![
                        yes("harry-potter-0", "centaur-1", "TCP", p[0]),
                        yes("harry-potter-1", "centaur-1", "TCP", p[1]),
                    ],
                ),
                step(
                    "deny-egress to node peers",
                    vec![],
                    vec![
                        no("harry-potter-1", "centaur-1", "UDP", p[4]),
                        no("harry-potter-1", "centaur-1", "SCTP", p[6]),
                    ],
                ),
            ],
        }
    }
}

/// The 6 experimental tests, in upstream's file order.
pub fn experimental() -> Vec<Case> {
    let admin = per_protocol(true);
    let baseline = per_protocol(false);
    let manifest = |cases: &[Case], name: &str| {
        cases
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.manifests[0].clone())
            .unwrap_or_else(|| panic!("no case {name}"))
    };
    vec![
        named_port_case(
            "CNPAdminTierEgressNamedPort",
            manifest(&admin, "CNPAdminTierEgressTCP"),
            "egress-tcp",
            Edit::EgressNamedPort(5, "web"),
            vec![
                yes("harry-potter-0", "cedric-diggory-1", "TCP", 80),
                no("harry-potter-1", "cedric-diggory-1", "TCP", 8080),
            ],
        ),
        node_peers(true),
        named_port_case(
            "CNPAdminTierIngressNamedPort",
            manifest(&admin, "CNPAdminTierIngressUDP"),
            "ingress-udp",
            Edit::IngressNamedPort(5, "dns"),
            vec![
                yes("harry-potter-0", "cedric-diggory-1", "UDP", 53),
                no("harry-potter-1", "cedric-diggory-1", "UDP", 5353),
            ],
        ),
        named_port_case(
            "CNPBaselineTierEgressNamedPort",
            manifest(&baseline, "CNPBaselineTierEgressUDP"),
            "default",
            Edit::EgressNamedPort(3, "dns"),
            vec![
                yes("cedric-diggory-0", "harry-potter-1", "UDP", 53),
                no("cedric-diggory-1", "harry-potter-1", "UDP", 5353),
            ],
        ),
        node_peers(false),
        named_port_case(
            "CNPBaselineTierIngressNamedPort",
            manifest(&baseline, "CNPBaselineTierIngressTCP"),
            "default",
            Edit::IngressNamedPort(3, "web"),
            vec![
                yes("cedric-diggory-0", "harry-potter-1", "TCP", 80),
                no("cedric-diggory-1", "harry-potter-1", "TCP", 8080),
            ],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_belong_to_their_statefulsets_house() {
        assert_eq!(house_of("harry-potter-1"), Some("gryffindor"));
        assert_eq!(house_of("centaur-0"), Some(HOST_NETWORK_HOUSE));
        assert_eq!(house_of("nobody-0"), None);
        assert_eq!(
            namespace("ravenclaw"),
            "network-policy-conformance-ravenclaw"
        );
    }

    #[test]
    fn ladders_have_upstreams_shape() {
        let admin = ladder(Way::Ingress, true, "a", ("b", &[tcp(1)]), ("c", &[tcp(2)]));
        let actions: Vec<&str> = admin
            .iter()
            .map(|r| r["action"].as_str().unwrap())
            .collect();
        assert_eq!(
            actions,
            ["Accept", "Deny", "Pass", "Deny", "Pass", "Accept", "Deny"]
        );
        let baseline = ladder(Way::Egress, false, "a", ("b", &[tcp(1)]), ("c", &[tcp(2)]));
        let actions: Vec<&str> = baseline
            .iter()
            .map(|r| r["action"].as_str().unwrap())
            .collect();
        assert_eq!(actions, ["Accept", "Deny", "Deny", "Accept", "Deny"]);
        assert!(baseline[0].get("protocols").is_none() && baseline[0]["to"].is_array());
    }

    #[test]
    fn edits_change_what_they_name_and_refuse_what_is_not_there() {
        let mut p = policy(
            "p",
            "Admin",
            1,
            json!({"namespaces": {}}),
            &[(
                Way::Ingress,
                ladder(Way::Ingress, true, "a", ("b", &[tcp(1)]), ("c", &[tcp(2)])),
            )],
        );
        Edit::SwapIngress(0, 2).apply(&mut p).unwrap();
        assert_eq!(p["spec"]["ingress"][0]["action"], "Pass");
        Edit::IngressNamedPort(5, "web").apply(&mut p).unwrap();
        assert_eq!(
            p["spec"]["ingress"][5]["protocols"],
            json!([{"destinationNamedPort": "web"}])
        );
        Edit::Priority(40).apply(&mut p).unwrap();
        assert_eq!(p["spec"]["priority"], 40);
        assert!(Edit::SwapEgress(0, 1).apply(&mut p).is_err());
        assert!(Edit::SwapIngress(0, 7).apply(&mut p).is_err());
        assert!(Edit::IngressAction(9, "Deny").apply(&mut p).is_err());
    }

    #[test]
    fn the_suite_has_upstreams_24_tests_and_92_subtests() {
        let ip = |_: &str| IpAddr::from([10, 0, 0, 1]);
        let standard = standard(&ip);
        let experimental = experimental();
        assert_eq!((standard.len(), experimental.len()), (18, 6));
        let subtests = |cases: &[Case]| -> usize {
            // Upstream's inline CIDR tests have two subtests; the relabelling splits one.
            cases
                .iter()
                .map(|c| c.steps.len() - if c.name.contains("InlineCIDR") { 2 } else { 0 })
                .sum()
        };
        assert_eq!(subtests(&standard) + subtests(&experimental), 92);
        assert!(standard.iter().all(|c| !c.experimental));
        assert!(experimental.iter().all(|c| c.experimental));
        let mut names: Vec<&str> = standard
            .iter()
            .chain(&experimental)
            .map(|c| c.name)
            .collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 24, "names are unique");
    }
}
