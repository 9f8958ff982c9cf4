//! The cases of `network_policy.rs` as data: the upstream e2e suite's
//! (kubernetes `test/e2e/network/netpol/network_policy.go`: 42 TCP, 3 UDP, 3 SCTP), then
//! endPort and dual-stack ipBlock cases of our own.
//!
//! A case is a list of steps; a step is the changes it makes (policies applied,
//! replaced or deleted, pod and namespace labels set) and upstream's truth tables for
//! it. After each step the whole matrix (every protocol, port and family) must equal
//! the model; the truth tables check the model itself, on the pods the upstream case
//! creates and the protocol and port it probes.
//!
//! The upstream policies are written as its helpers build them:
//! `SetSpecIngressRules(...)` sets `policyTypes: [Ingress]` and the rules,
//! `SetSpecEgressRules(...)` adds `Egress`; a pod selector built from a label map is
//! `matchLabels`. Its ipBlock cases take the server pod's `status.podIP` (the first
//! address, IPv4 here) and the `/4` around it (`makeLargeCIDRForIP`), and their truth
//! tables hold for IPv4 only. A truth table starts with every pair allowed; its
//! expectations apply in order, each overriding the pairs it names (`*` any pod, `x`
//! any pod of namespace x, `x/a` one pod); a pod's pair with itself is not judged.

use std::net::IpAddr;

use serde_json::{Value, json};

/// One change a step makes.
#[derive(Debug, Clone)]
pub enum Action {
    /// Creates or replaces `namespace/name` with this spec.
    Policy(&'static str, &'static str, Value),
    /// Deletes `namespace/name`.
    DeletePolicy(&'static str, &'static str),
    /// Sets a pod's labels (all of them).
    PodLabels(
        &'static str,
        &'static str,
        Vec<(&'static str, &'static str)>,
    ),
    /// Sets a namespace's labels (all of them but `kubernetes.io/metadata.name`,
    /// which the API server keeps).
    NamespaceLabels(&'static str, Vec<(&'static str, &'static str)>),
}

/// One expectation of a truth table: the pairs from `from` to `to` are (not) allowed.
#[derive(Debug, Clone)]
pub struct Expect {
    /// `*`, a namespace or `namespace/pod`.
    pub from: &'static str,
    /// Likewise.
    pub to: &'static str,
    /// Allowed or not.
    pub allowed: bool,
}

impl Expect {
    fn covers(pattern: &str, pod: &str) -> bool {
        pattern == "*"
            || pattern == pod
            || pod
                .split_once('/')
                .is_some_and(|(namespace, _)| namespace == pattern)
    }
}

/// A truth table: what upstream expects on one protocol and port.
#[derive(Debug, Clone)]
pub struct Check {
    /// `TCP` or `UDP`.
    pub protocol: &'static str,
    /// The port.
    pub port: u16,
    /// Whether the table holds for IPv4.
    pub ipv4: bool,
    /// Whether it holds for IPv6 (not for upstream's ipBlocks of the first pod
    /// address).
    pub ipv6: bool,
    /// The expectations, in order.
    pub expect: Vec<Expect>,
}

impl Check {
    /// Whether the table allows `from` to `to` (`namespace/pod` both).
    pub fn allows(&self, from: &str, to: &str) -> bool {
        self.expect
            .iter()
            .rev()
            .find(|e| Expect::covers(e.from, from) && Expect::covers(e.to, to))
            .is_none_or(|e| e.allowed)
    }
}

/// One step of a case.
#[derive(Debug, Clone)]
pub struct Step {
    /// Its changes.
    pub actions: Vec<Action>,
    /// Upstream's truth tables after them.
    pub checks: Vec<Check>,
}

/// A case: its name (upstream's, or ours), the pods its truth tables cover, its steps.
#[derive(Debug, Clone)]
pub struct Case {
    /// What upstream calls it (`udp:` for the UDP suite's), or what it tests.
    pub name: String,
    /// The pods upstream creates for it (`namespace/pod`): its truth tables speak of
    /// these only.
    pub pods: Vec<&'static str>,
    /// The steps.
    pub steps: Vec<Step>,
}

/// Every pod of the matrix.
pub const ALL_PODS: [&str; 9] = [
    "x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c",
];

/// The namespace name label the API server sets.
const NAME: &str = "kubernetes.io/metadata.name";

fn case(name: impl Into<String>, pods: &[&'static str], steps: Vec<Step>) -> Case {
    Case {
        name: name.into(),
        pods: pods.to_vec(),
        steps,
    }
}

fn step(actions: Vec<Action>, checks: Vec<Check>) -> Step {
    Step { actions, checks }
}

fn policy(namespace: &'static str, name: &'static str, spec: Value) -> Action {
    Action::Policy(namespace, name, spec)
}

fn tcp(port: u16, expect: Vec<Expect>) -> Check {
    Check {
        protocol: "TCP",
        port,
        ipv4: true,
        ipv6: true,
        expect,
    }
}

fn udp(port: u16, expect: Vec<Expect>) -> Check {
    Check {
        protocol: "UDP",
        port,
        ipv4: true,
        ipv6: true,
        expect,
    }
}

/// A table that holds for IPv4 only.
fn v4(check: Check) -> Check {
    Check {
        ipv6: false,
        ..check
    }
}

/// A table that holds for IPv6 only.
fn v6(check: Check) -> Check {
    Check {
        ipv4: false,
        ..check
    }
}

fn deny(from: &'static str, to: &'static str) -> Expect {
    Expect {
        from,
        to,
        allowed: false,
    }
}

fn allow(from: &'static str, to: &'static str) -> Expect {
    Expect {
        from,
        to,
        allowed: true,
    }
}

/// `{pod: <name>}` as a selector.
fn pod(name: &str) -> Value {
    json!({"matchLabels": {"pod": name}})
}

/// A namespace selector of one namespace by its name label.
fn ns(name: &str) -> Value {
    json!({"matchLabels": {NAME: name}})
}

/// A policy that isolates `selector`'s ingress and allows `rules`.
fn ingress(selector: Value, rules: Value) -> Value {
    json!({"podSelector": selector, "policyTypes": ["Ingress"], "ingress": rules})
}

/// A policy that isolates `selector`'s egress and allows `rules`.
fn egress(selector: Value, rules: Value) -> Value {
    json!({"podSelector": selector, "policyTypes": ["Egress"], "egress": rules})
}

fn deny_all() -> Value {
    json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []})
}

/// The `/4` around an address (upstream's "large CIDR").
fn large_cidr(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{}.0.0.0/4", v4.octets()[0] & 0xf0),
        IpAddr::V6(v6) => format!("{:x}::/4", v6.segments()[0] & 0xf000),
    }
}

/// A host CIDR of an address.
fn host(ip: IpAddr) -> String {
    format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 })
}

/// Upstream's 42 TCP cases, in its order.
pub fn upstream_tcp(ip_of: &dyn Fn(&str) -> (IpAddr, IpAddr)) -> Vec<Case> {
    let (yb, _) = ip_of("y/b");
    let (xb, _) = ip_of("x/b");
    let not_x = json!({"matchExpressions": [{"key": NAME, "operator": "NotIn", "values": ["x"]}]});
    let allow_81_from_y = ingress(
        pod("a"),
        json!([{"from": [{"namespaceSelector": ns("y")}], "ports": [{"port": 81, "protocol": "TCP"}]}]),
    );
    let from_y_only = || vec![deny("x", "x/a"), allow("y", "x/a"), deny("z", "x/a")];
    let except_b = egress(
        pod("a"),
        json!([{"to": [{"ipBlock": {"cidr": large_cidr(xb), "except": [host(xb)]}}]}]),
    );
    vec![
        case(
            "should support a 'default-deny-ingress' policy",
            &["x/a", "x/b", "y/a", "y/b"],
            vec![step(
                vec![policy("x", "deny-ingress", ingress(json!({}), json!([])))],
                vec![tcp(80, vec![deny("*", "x")])],
            )],
        ),
        case(
            "should support a 'default-deny-all' policy",
            &["x/a", "x/b", "y/a"],
            vec![step(
                vec![policy("x", "deny-all", deny_all())],
                vec![tcp(80, vec![deny("*", "x"), deny("x", "*")])],
            )],
        ),
        case(
            "should enforce policy to allow traffic from pods within server namespace based on PodSelector",
            &["x/a", "x/b", "x/c", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "x-a-allows-x-b",
                    ingress(pod("a"), json!([{"from": [{"podSelector": pod("b")}]}])),
                )],
                vec![tcp(80, vec![deny("*", "x/a"), allow("x/b", "x/a")])],
            )],
        ),
        case(
            "should enforce policy to allow ingress traffic for a target",
            &["x/a", "x/b", "y/a"],
            vec![step(
                vec![
                    policy("x", "deny-all", ingress(json!({}), json!([]))),
                    policy(
                        "x",
                        "allow-all-to-a",
                        ingress(
                            pod("a"),
                            json!([{"from": [{"podSelector": {}, "namespaceSelector": {}}]}]),
                        ),
                    ),
                ],
                vec![tcp(80, vec![allow("*", "x/a"), deny("*", "x/b")])],
            )],
        ),
        case(
            "should enforce policy to allow ingress traffic from pods in all namespaces",
            &["x/a", "x/b", "y/a", "z/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-from-another-ns",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": {"matchLabels": {}}}]}]),
                    ),
                )],
                vec![tcp(80, vec![])],
            )],
        ),
        case(
            "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
            &["x/a", "x/b", "y/a", "z/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-client-a-via-ns-selector",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": ns("y")}]}]),
                    ),
                )],
                vec![tcp(80, vec![deny("x", "x/a"), deny("z", "x/a")])],
            )],
        ),
        case(
            "should enforce policy based on PodSelector with MatchExpressions",
            &["x/a", "x/b", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "x-a-allows-x-b",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b"]}]}}]}]),
                    ),
                )],
                vec![tcp(80, vec![deny("*", "x/a"), allow("x/b", "x/a")])],
            )],
        ),
        case(
            "should enforce policy based on NamespaceSelector with MatchExpressions",
            &["x/a", "x/b", "y/a", "z/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-ns-y-match-selector",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": {"matchExpressions": [{"key": NAME, "operator": "In", "values": ["y"]}]}}]}]),
                    ),
                )],
                vec![tcp(80, vec![deny("x", "x/a"), deny("z", "x/a")])],
            )],
        ),
        case(
            "should enforce policy based on PodSelector or NamespaceSelector",
            &["x/a", "x/b", "x/c", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-ns-y-match-selector",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": not_x}, {"podSelector": pod("b")}]}]),
                    ),
                )],
                vec![tcp(80, vec![deny("x/a", "x/a"), deny("x/c", "x/a")])],
            )],
        ),
        case(
            "should enforce policy based on PodSelector and NamespaceSelector",
            &["x/a", "x/b", "y/a", "y/b", "z/b"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-ns-y-podselector-and-nsselector",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": not_x, "podSelector": pod("b")}]}]),
                    ),
                )],
                vec![tcp(
                    80,
                    vec![deny("*", "x/a"), allow("y/b", "x/a"), allow("z/b", "x/a")],
                )],
            )],
        ),
        case(
            "should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
            &["x/a", "x/b", "y/a", "y/b", "y/c"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-ns-y-z-pod-b-c",
                    ingress(
                        pod("a"),
                        json!([{"from": [{
                            "namespaceSelector": not_x,
                            "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b", "c"]}]},
                        }]}]),
                    ),
                )],
                vec![tcp(80, vec![deny("x", "x/a"), deny("y/a", "x/a")])],
            )],
        ),
        case(
            "should enforce policy based on any PodSelectors",
            &["x/a", "x/b", "x/c"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-ns-x-pod-b-c",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"podSelector": pod("b")}, {"podSelector": pod("c")}]}]),
                    ),
                )],
                vec![tcp(
                    80,
                    vec![deny("*", "x/a"), allow("x/b", "x/a"), allow("x/c", "x/a")],
                )],
            )],
        ),
        case(
            "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
            &["x/a", "x/b", "y/a", "y/b", "z/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-ns-y-pod-a-via-namespace-pod-selector",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": ns("y"), "podSelector": pod("a")}]}]),
                    ),
                )],
                vec![tcp(80, vec![deny("*", "x/a"), allow("y/a", "x/a")])],
            )],
        ),
        case(
            "should enforce policy based on Ports",
            &["x/a", "x/b", "y/a", "y/b", "z/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-client-a-via-ns-selector",
                    allow_81_from_y.clone(),
                )],
                vec![tcp(81, from_y_only())],
            )],
        ),
        case(
            "should enforce multiple, stacked policies with overlapping podSelectors",
            &["x/a", "x/b", "y/a", "y/b", "z/a"],
            vec![
                step(
                    vec![policy(
                        "x",
                        "allow-client-a-via-ns-selector",
                        allow_81_from_y,
                    )],
                    vec![tcp(81, from_y_only()), tcp(80, vec![deny("*", "x/a")])],
                ),
                step(
                    vec![policy(
                        "x",
                        "allow-client-a-via-ns-selector-80",
                        ingress(
                            pod("a"),
                            json!([{"from": [{"namespaceSelector": ns("y")}], "ports": [{"port": 80, "protocol": "TCP"}]}]),
                        ),
                    )],
                    vec![tcp(80, from_y_only())],
                ),
            ],
        ),
        case(
            "should support allow-all policy",
            &["x/a", "x/b", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-all",
                    ingress(json!({"matchLabels": {}}), json!([{}])),
                )],
                vec![tcp(80, vec![]), tcp(81, vec![])],
            )],
        ),
        case(
            "should allow ingress access on one named port",
            &["x/a", "x/b", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-all",
                    ingress(
                        json!({"matchLabels": {}}),
                        json!([{"ports": [{"port": "serve-81-tcp"}]}]),
                    ),
                )],
                vec![tcp(81, vec![]), tcp(80, vec![deny("*", "x")])],
            )],
        ),
        case(
            "should allow ingress access from namespace on one named port",
            &["x/a", "x/b", "y/a", "z/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-client-a-via-ns-selector-80",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": ns("y")}], "ports": [{"port": "serve-80-tcp", "protocol": "TCP"}]}]),
                    ),
                )],
                vec![
                    tcp(80, vec![deny("x", "x/a"), deny("z", "x/a")]),
                    tcp(81, vec![deny("*", "x/a")]),
                ],
            )],
        ),
        case(
            "should allow egress access on one named port",
            &["x/a", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-egress",
                    egress(
                        json!({"matchLabels": {}}),
                        json!([{"ports": [{"port": "serve-80-tcp"}]}]),
                    ),
                )],
                vec![tcp(80, vec![]), tcp(81, vec![deny("x", "*")])],
            )],
        ),
        case(
            "should enforce updated policy",
            &["x/a", "y/a"],
            vec![
                step(
                    vec![policy(
                        "x",
                        "allow-all-mutate-to-deny-all",
                        ingress(json!({"matchLabels": {}}), json!([{}])),
                    )],
                    vec![tcp(81, vec![])],
                ),
                step(
                    vec![policy(
                        "x",
                        "allow-all-mutate-to-deny-all",
                        ingress(json!({"matchLabels": {}}), json!([])),
                    )],
                    vec![tcp(81, vec![deny("*", "x")])],
                ),
            ],
        ),
        case(
            "should allow ingress access from updated namespace",
            &["x/a", "y/a"],
            vec![
                step(
                    vec![policy(
                        "x",
                        "allow-client-a-via-ns-selector",
                        ingress(
                            pod("a"),
                            json!([{"from": [{"namespaceSelector": {"matchLabels": {"ns2": "updated"}}}]}]),
                        ),
                    )],
                    vec![tcp(80, vec![deny("*", "x/a")])],
                ),
                step(
                    vec![Action::NamespaceLabels(
                        "y",
                        vec![("ns", "y"), ("ns2", "updated")],
                    )],
                    vec![tcp(80, vec![deny("*", "x/a"), allow("y", "*")])],
                ),
            ],
        ),
        case(
            "should allow ingress access from updated pod",
            &["x/a", "x/b"],
            vec![
                step(
                    vec![policy(
                        "x",
                        "allow-client-a-via-pod-selector",
                        ingress(
                            pod("a"),
                            json!([{"from": [{"podSelector": {"matchLabels": {"pod": "b", "pod2": "updated"}}}]}]),
                        ),
                    )],
                    vec![tcp(80, vec![deny("*", "x/a")])],
                ),
                step(
                    vec![Action::PodLabels(
                        "x",
                        "b",
                        vec![("pod", "b"), ("pod2", "updated")],
                    )],
                    vec![tcp(80, vec![deny("*", "x/a"), allow("x/b", "x/a")])],
                ),
            ],
        ),
        case(
            "should deny ingress from pods on other namespaces",
            &["x/a", "x/b", "y/a", "z/a"],
            vec![step(
                vec![policy(
                    "x",
                    "deny-empty-policy",
                    ingress(
                        json!({}),
                        json!([{"from": [{"podSelector": {"matchLabels": {}}}]}]),
                    ),
                )],
                vec![tcp(80, vec![deny("y", "x"), deny("z", "x")])],
            )],
        ),
        case(
            "should deny ingress access to updated pod",
            &["x/a", "y/a"],
            vec![
                step(
                    vec![policy(
                        "x",
                        "deny-ingress-via-label-selector",
                        ingress(json!({"matchLabels": {"target": "isolated"}}), json!([])),
                    )],
                    vec![tcp(80, vec![])],
                ),
                step(
                    vec![Action::PodLabels(
                        "x",
                        "a",
                        vec![("pod", "a"), ("target", "isolated")],
                    )],
                    vec![tcp(80, vec![deny("*", "x/a")])],
                ),
            ],
        ),
        case(
            "should deny egress from pods based on PodSelector",
            &["x/a", "x/b", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "deny-egress-pod-a",
                    egress(pod("a"), json!([])),
                )],
                vec![tcp(80, vec![deny("x/a", "*")])],
            )],
        ),
        case(
            "should deny egress from all pods in a namespace",
            &["x/a", "x/b", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "deny-egress-ns-x",
                    egress(json!({}), json!([])),
                )],
                vec![tcp(80, vec![deny("x", "*")])],
            )],
        ),
        case(
            "should work with Ingress, Egress specified together",
            &["x/a", "x/b", "x/c", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-client-a-via-pod-selector",
                    json!({
                        "podSelector": pod("a"),
                        "policyTypes": ["Egress", "Ingress"],
                        "ingress": [{"from": [{"podSelector": pod("b")}]}],
                        "egress": [{"ports": [{"port": 80}]}],
                    }),
                )],
                vec![
                    tcp(80, vec![deny("*", "x/a"), allow("x/b", "x/a")]),
                    tcp(
                        81,
                        vec![deny("*", "x/a"), deny("x/a", "*"), allow("x/b", "x/a")],
                    ),
                ],
            )],
        ),
        case(
            "should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)",
            &["x/a", "y/a", "y/b"],
            vec![step(
                vec![
                    policy(
                        "x",
                        "allow-to-ns-y-pod-a",
                        egress(
                            pod("a"),
                            json!([{"to": [{"namespaceSelector": ns("y"), "podSelector": pod("a")}]}]),
                        ),
                    ),
                    policy(
                        "y",
                        "allow-from-xa-on-ya-match-selector",
                        ingress(
                            pod("a"),
                            json!([{"from": [{"namespaceSelector": ns("x"), "podSelector": pod("a")}]}]),
                        ),
                    ),
                    policy(
                        "y",
                        "allow-from-xa-on-yb-match-selector",
                        ingress(
                            pod("b"),
                            json!([{"from": [{"namespaceSelector": ns("x"), "podSelector": pod("a")}]}]),
                        ),
                    ),
                ],
                vec![tcp(
                    80,
                    vec![
                        deny("x/a", "*"),
                        deny("*", "y/a"),
                        allow("x/a", "y/a"),
                        deny("*", "y/b"),
                    ],
                )],
            )],
        ),
        case(
            "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
            &["x/a", "y/a", "y/b"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-to-ns-y-pod-a",
                    egress(
                        pod("a"),
                        json!([{"to": [{"namespaceSelector": ns("y"), "podSelector": pod("a")}]}]),
                    ),
                )],
                vec![tcp(80, vec![deny("x/a", "*"), allow("x/a", "y/a")])],
            )],
        ),
        case(
            "should enforce ingress policy allowing any port traffic to a server on a specific protocol",
            &["x/a", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-ingress-by-proto",
                    ingress(pod("a"), json!([{"ports": [{"protocol": "TCP"}]}])),
                )],
                vec![tcp(80, vec![]), udp(80, vec![deny("*", "x/a")])],
            )],
        ),
        case(
            "should enforce multiple ingress policies with ingress allow-all policy taking precedence",
            &["x/a", "y/a"],
            vec![
                step(
                    vec![policy(
                        "x",
                        "allow-ingress-port-80",
                        ingress(
                            json!({"matchLabels": {}}),
                            json!([{"ports": [{"port": 80}]}]),
                        ),
                    )],
                    vec![tcp(81, vec![deny("*", "x")])],
                ),
                step(
                    vec![policy(
                        "x",
                        "allow-ingress",
                        ingress(json!({"matchLabels": {}}), json!([{}])),
                    )],
                    vec![tcp(81, vec![])],
                ),
            ],
        ),
        case(
            "should enforce multiple egress policies with egress allow-all policy taking precedence",
            &["x/a", "y/a"],
            vec![
                step(
                    vec![policy(
                        "x",
                        "allow-egress-port-80",
                        egress(
                            json!({"matchLabels": {}}),
                            json!([{"ports": [{"port": 80}]}]),
                        ),
                    )],
                    vec![tcp(81, vec![deny("x", "*")])],
                ),
                step(
                    vec![policy(
                        "x",
                        "allow-egress",
                        egress(json!({"matchLabels": {}}), json!([{}])),
                    )],
                    vec![tcp(81, vec![])],
                ),
            ],
        ),
        case(
            "should stop enforcing policies after they are deleted",
            &["x/a", "y/a"],
            vec![
                step(
                    vec![policy("x", "deny-all", deny_all())],
                    vec![tcp(80, vec![deny("x", "*"), deny("*", "x")])],
                ),
                step(
                    vec![Action::DeletePolicy("x", "deny-all")],
                    vec![tcp(80, vec![])],
                ),
            ],
        ),
        case(
            "should allow egress access to server in CIDR block",
            &["x/a", "y/a", "y/b"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-client-a-via-cidr-egress-rule",
                    egress(pod("a"), json!([{"to": [{"ipBlock": {"cidr": host(yb)}}]}])),
                )],
                vec![v4(tcp(80, vec![deny("x/a", "*"), allow("x/a", "y/b")]))],
            )],
        ),
        case(
            "should enforce except clause while egress access to server in CIDR block",
            &["x/a", "x/b", "x/c"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-client-a-via-cidr-egress-rule",
                    except_b.clone(),
                )],
                vec![v4(tcp(80, vec![deny("x/a", "x/b")]))],
            )],
        ),
        case(
            "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed",
            &["x/a", "x/b", "x/c"],
            vec![
                step(
                    vec![policy("x", "allow-client-a-via-cidr-egress-rule", except_b)],
                    vec![v4(tcp(80, vec![deny("x/a", "x/b")]))],
                ),
                step(
                    vec![policy(
                        "x",
                        "allow-client-a-via-cidr-egress-rule",
                        egress(pod("a"), json!([{"to": [{"ipBlock": {"cidr": host(xb)}}]}])),
                    )],
                    vec![v4(tcp(80, vec![deny("x/a", "*"), allow("x/a", "x/b")]))],
                ),
            ],
        ),
        case(
            "should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector",
            &["x/a", "x/b", "y/a"],
            vec![
                step(
                    vec![policy(
                        "x",
                        "allow-egress-for-target",
                        egress(pod("a"), json!([{}])),
                    )],
                    vec![tcp(80, vec![])],
                ),
                step(
                    vec![policy(
                        "x",
                        "deny-ingress-via-label-selector",
                        ingress(pod("a"), json!([])),
                    )],
                    vec![tcp(80, vec![deny("*", "x/a")])],
                ),
            ],
        ),
        case(
            "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP",
            &["x/a", "y/a"],
            vec![step(
                vec![
                    policy("x", "deny-ingress", ingress(json!({}), json!([]))),
                    policy(
                        "x",
                        "allow-only-sctp-ingress-on-port-81",
                        ingress(
                            pod("a"),
                            json!([{"ports": [{"port": 81, "protocol": "SCTP"}]}]),
                        ),
                    ),
                ],
                vec![tcp(81, vec![deny("*", "x")])],
            )],
        ),
        case(
            "should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP",
            &["x/a", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-only-sctp-ingress-on-port-80",
                    ingress(
                        pod("a"),
                        json!([{"ports": [{"port": 80, "protocol": "SCTP"}]}]),
                    ),
                )],
                vec![tcp(81, vec![deny("*", "x/a")])],
            )],
        ),
        case(
            "should not allow access by TCP when a policy specifies only UDP",
            &["x/a", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-only-udp-ingress-on-port-81",
                    ingress(
                        pod("a"),
                        json!([{"ports": [{"port": 81, "protocol": "UDP"}]}]),
                    ),
                )],
                vec![tcp(81, vec![deny("*", "x/a")])],
            )],
        ),
        case(
            "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label",
            &["x/a", "x/b", "y/a", "z/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-client-a-via-ns-selector-for-immutable-ns-label",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": ns("y")}]}]),
                    ),
                )],
                vec![tcp(80, vec![deny("x", "x/a"), deny("z", "x/a")])],
            )],
        ),
        case(
            "should enforce policy based on NamespaceSelector with MatchExpressions using default ns label",
            &["x/a", "x/b", "y/a", "z/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-ns-y-match-selector-for-immutable-ns-label",
                    egress(
                        pod("a"),
                        json!([{"to": [{"namespaceSelector": {"matchExpressions": [{"key": NAME, "operator": "NotIn", "values": ["y"]}]}}]}]),
                    ),
                )],
                vec![tcp(80, vec![deny("x/a", "y")])],
            )],
        ),
    ]
}

/// Upstream's 3 UDP cases.
pub fn upstream_udp() -> Vec<Case> {
    upstream_per_protocol("UDP")
}

/// Upstream's 3 SCTP cases. Their truth tables are SCTP's: the model is checked
/// against them on any kernel, the matrix probes TCP and UDP only.
pub fn upstream_sctp() -> Vec<Case> {
    upstream_per_protocol("SCTP")
}

/// The three cases upstream runs for UDP and again for SCTP, the same but for the
/// protocol.
fn upstream_per_protocol(protocol: &'static str) -> Vec<Case> {
    let check = |port: u16, expect: Vec<Expect>| Check {
        protocol,
        port,
        ipv4: true,
        ipv6: true,
        expect,
    };
    let name = |what: &str| format!("{}: {what}", protocol.to_lowercase());
    vec![
        case(
            name("should support a 'default-deny-ingress' policy"),
            &["x/a", "x/b", "y/a", "y/b"],
            vec![step(
                vec![policy("x", "deny-all", ingress(json!({}), json!([])))],
                vec![check(80, vec![deny("*", "x")])],
            )],
        ),
        case(
            name("should enforce policy based on Ports"),
            &["x/a", "x/b", "y/a", "z/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-ingress-on-port-81-ns-x",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": ns("y")}], "ports": [{"port": 81, "protocol": protocol}]}]),
                    ),
                )],
                vec![check(81, vec![deny("x", "x/a"), deny("z", "x/a")])],
            )],
        ),
        case(
            name(
                "should enforce policy to allow traffic only from a pod in a different namespace \
                 based on PodSelector and NamespaceSelector",
            ),
            &["x/a", "x/b", "y/a"],
            vec![step(
                vec![policy(
                    "x",
                    "allow-ns-y-pod-a-via-namespace-pod-selector",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": ns("y"), "podSelector": pod("a")}]}]),
                    ),
                )],
                vec![check(80, vec![deny("*", "x/a"), allow("y/a", "x/a")])],
            )],
        ),
    ]
}

/// Ours: port ranges (`endPort`), which upstream tests only through API validation,
/// and ipBlocks of both families. Their truth tables cover all nine pods; the last
/// one's rests on where the pods run (x/a, x/c, y/b, z/a and z/c on node 1, the
/// others on node 2).
pub fn ours(ip_of: &dyn Fn(&str) -> (IpAddr, IpAddr)) -> Vec<Case> {
    let (yb4, yb6) = ip_of("y/b");
    vec![
        case(
            "endPort: ingress on a TCP range covering both servers' ports",
            &ALL_PODS,
            vec![step(
                vec![policy(
                    "x",
                    "tcp-80-to-81",
                    ingress(
                        pod("a"),
                        json!([{"ports": [{"protocol": "TCP", "port": 80, "endPort": 81}]}]),
                    ),
                )],
                vec![
                    tcp(80, vec![]),
                    tcp(81, vec![]),
                    udp(80, vec![deny("*", "x/a")]),
                    udp(81, vec![deny("*", "x/a")]),
                ],
            )],
        ),
        case(
            "endPort: a UDP range ending between the servers' ports, for a whole namespace",
            &ALL_PODS,
            vec![step(
                vec![policy(
                    "y",
                    "udp-1-to-80",
                    ingress(
                        json!({}),
                        json!([{"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP", "port": 1, "endPort": 80}]}]),
                    ),
                )],
                vec![
                    udp(80, vec![]),
                    udp(81, vec![deny("*", "y")]),
                    tcp(80, vec![deny("*", "y")]),
                ],
            )],
        ),
        case(
            "endPort: egress on a TCP range starting at 81 beside a single UDP port",
            &ALL_PODS,
            vec![step(
                vec![policy(
                    "z",
                    "egress-ranges",
                    egress(
                        pod("b"),
                        json!([{"ports": [
                            {"protocol": "TCP", "port": 81, "endPort": 65535},
                            {"protocol": "UDP", "port": 80},
                        ]}]),
                    ),
                )],
                vec![
                    tcp(80, vec![deny("z/b", "*")]),
                    tcp(81, vec![]),
                    udp(80, vec![]),
                    udp(81, vec![deny("z/b", "*")]),
                ],
            )],
        ),
        case(
            "endPort: a one-port range and a named port of the other protocol, from one namespace",
            &ALL_PODS,
            vec![step(
                vec![policy(
                    "z",
                    "one-port-and-named",
                    ingress(
                        pod("c"),
                        json!([{"from": [{"namespaceSelector": ns("x")}], "ports": [
                            {"protocol": "TCP", "port": 80, "endPort": 80},
                            {"protocol": "UDP", "port": "serve-81-udp"},
                        ]}]),
                    ),
                )],
                vec![
                    tcp(80, vec![deny("*", "z/c"), allow("x", "z/c")]),
                    tcp(81, vec![deny("*", "z/c")]),
                    udp(80, vec![deny("*", "z/c")]),
                    udp(81, vec![deny("*", "z/c"), allow("x", "z/c")]),
                ],
            )],
        ),
        case(
            "endPort: a range widened by an update",
            &ALL_PODS,
            vec![
                step(
                    vec![policy(
                        "x",
                        "widened",
                        ingress(
                            json!({}),
                            json!([{"ports": [{"protocol": "TCP", "port": 79, "endPort": 80}]}]),
                        ),
                    )],
                    vec![
                        tcp(80, vec![]),
                        tcp(81, vec![deny("*", "x")]),
                        udp(80, vec![deny("*", "x")]),
                    ],
                ),
                step(
                    vec![policy(
                        "x",
                        "widened",
                        ingress(
                            json!({}),
                            json!([{"ports": [{"protocol": "TCP", "port": 79, "endPort": 81}]}]),
                        ),
                    )],
                    vec![tcp(81, vec![]), udp(81, vec![deny("*", "x")])],
                ),
            ],
        ),
        case(
            "ipBlock of both families: egress to one pod's IPv4 and IPv6 addresses",
            &ALL_PODS,
            vec![step(
                vec![policy(
                    "x",
                    "to-y-b-both-families",
                    egress(
                        pod("a"),
                        json!([{"to": [{"ipBlock": {"cidr": host(yb4)}}, {"ipBlock": {"cidr": host(yb6)}}]}]),
                    ),
                )],
                vec![
                    tcp(80, vec![deny("x/a", "*"), allow("x/a", "y/b")]),
                    udp(81, vec![deny("x/a", "*"), allow("x/a", "y/b")]),
                ],
            )],
        ),
        case(
            "ipBlock of both families with except: node 1's pods by IPv4, node 2's by IPv6",
            &ALL_PODS,
            vec![step(
                vec![policy(
                    "z",
                    "blocks-with-holes",
                    ingress(
                        pod("c"),
                        json!([{"from": [
                            {"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.2.0/24"]}},
                            {"ipBlock": {"cidr": "fd00:244::/48", "except": ["fd00:244:0:1::/64"]}},
                        ]}]),
                    ),
                )],
                vec![
                    v4(tcp(
                        80,
                        vec![
                            deny("*", "z/c"),
                            allow("x/a", "z/c"),
                            allow("x/c", "z/c"),
                            allow("y/b", "z/c"),
                            allow("z/a", "z/c"),
                        ],
                    )),
                    v6(udp(
                        81,
                        vec![
                            deny("*", "z/c"),
                            allow("x/b", "z/c"),
                            allow("y/a", "z/c"),
                            allow("y/c", "z/c"),
                            allow("z/b", "z/c"),
                        ],
                    )),
                ],
            )],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_cidrs_are_the_slash_4_around_the_address() {
        assert_eq!(large_cidr("10.244.1.5".parse().unwrap()), "0.0.0.0/4");
        assert_eq!(large_cidr("198.18.0.1".parse().unwrap()), "192.0.0.0/4");
        assert_eq!(large_cidr("fd00:244::5".parse().unwrap()), "f000::/4");
        assert_eq!(host("fd00::1".parse().unwrap()), "fd00::1/128");
    }

    #[test]
    fn truth_tables_apply_their_expectations_in_order() {
        let check = tcp(
            80,
            vec![deny("*", "x/a"), allow("y", "x/a"), deny("y/b", "x")],
        );
        assert!(!check.allows("z/a", "x/a"));
        assert!(check.allows("y/a", "x/a"));
        assert!(!check.allows("y/b", "x/a"));
        assert!(!check.allows("y/b", "x/c"));
        assert!(check.allows("z/a", "y/a"));
        assert!(check.allows("x/b", "x/c"));
    }
}
