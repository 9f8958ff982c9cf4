//! The cases of `network_policy.rs` as data: the upstream e2e suite's
//! (kubernetes `test/e2e/network/netpol/network_policy.go`: 42 TCP, 3 UDP; its 3 SCTP
//! cases need an SCTP kernel), then endPort and dual-stack ipBlock cases of our own.
//!
//! A case is a list of steps; a step is the changes it makes (policies applied,
//! replaced or deleted, pod and namespace labels set). After each step the whole
//! matrix must equal the model. Upstream names the ports and protocols a step probes;
//! here every step probes everything (TCP and UDP, 80 and 81, both families), so those
//! are not part of the data.
//!
//! The upstream policies are written as their helpers build them:
//! `SetSpecIngressRules(...)` sets `policyTypes: [Ingress]` and the rules,
//! `SetSpecEgressRules(...)` adds `Egress`; a pod selector built from a label map is
//! `matchLabels`. Upstream's ipBlock cases take the server pod's `status.podIP` (the
//! first address, IPv4 here) and a `/4` around it ("makeLargeCIDRForIP").

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

/// A case: its name (upstream's, or ours) and its steps.
#[derive(Debug, Clone)]
pub struct Case {
    /// What upstream calls it (`udp:` for the UDP suite's), or what it tests.
    pub name: &'static str,
    /// Each step's changes.
    pub steps: Vec<Vec<Action>>,
}

/// The namespace name label the API server sets.
const NAME: &str = "kubernetes.io/metadata.name";

fn case(name: &'static str, steps: Vec<Vec<Action>>) -> Case {
    Case { name, steps }
}

fn policy(namespace: &'static str, name: &'static str, spec: Value) -> Action {
    Action::Policy(namespace, name, spec)
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
    let except_b = egress(
        pod("a"),
        json!([{"to": [{"ipBlock": {"cidr": large_cidr(xb), "except": [host(xb)]}}]}]),
    );
    vec![
        case(
            "should support a 'default-deny-ingress' policy",
            vec![vec![policy(
                "x",
                "deny-ingress",
                ingress(json!({}), json!([])),
            )]],
        ),
        case(
            "should support a 'default-deny-all' policy",
            vec![vec![policy(
                "x",
                "deny-all",
                json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []}),
            )]],
        ),
        case(
            "should enforce policy to allow traffic from pods within server namespace based on PodSelector",
            vec![vec![policy(
                "x",
                "x-a-allows-x-b",
                ingress(pod("a"), json!([{"from": [{"podSelector": pod("b")}]}])),
            )]],
        ),
        case(
            "should enforce policy to allow ingress traffic for a target",
            vec![vec![
                policy("x", "deny-all", ingress(json!({}), json!([]))),
                policy(
                    "x",
                    "allow-all-to-a",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"podSelector": {}, "namespaceSelector": {}}]}]),
                    ),
                ),
            ]],
        ),
        case(
            "should enforce policy to allow ingress traffic from pods in all namespaces",
            vec![vec![policy(
                "x",
                "allow-from-another-ns",
                ingress(
                    pod("a"),
                    json!([{"from": [{"namespaceSelector": {"matchLabels": {}}}]}]),
                ),
            )]],
        ),
        case(
            "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
            vec![vec![policy(
                "x",
                "allow-client-a-via-ns-selector",
                ingress(
                    pod("a"),
                    json!([{"from": [{"namespaceSelector": ns("y")}]}]),
                ),
            )]],
        ),
        case(
            "should enforce policy based on PodSelector with MatchExpressions",
            vec![vec![policy(
                "x",
                "x-a-allows-x-b",
                ingress(
                    pod("a"),
                    json!([{"from": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b"]}]}}]}]),
                ),
            )]],
        ),
        case(
            "should enforce policy based on NamespaceSelector with MatchExpressions",
            vec![vec![policy(
                "x",
                "allow-ns-y-match-selector",
                ingress(
                    pod("a"),
                    json!([{"from": [{"namespaceSelector": {"matchExpressions": [{"key": NAME, "operator": "In", "values": ["y"]}]}}]}]),
                ),
            )]],
        ),
        case(
            "should enforce policy based on PodSelector or NamespaceSelector",
            vec![vec![policy(
                "x",
                "allow-ns-y-match-selector",
                ingress(
                    pod("a"),
                    json!([{"from": [{"namespaceSelector": not_x}, {"podSelector": pod("b")}]}]),
                ),
            )]],
        ),
        case(
            "should enforce policy based on PodSelector and NamespaceSelector",
            vec![vec![policy(
                "x",
                "allow-ns-y-podselector-and-nsselector",
                ingress(
                    pod("a"),
                    json!([{"from": [{"namespaceSelector": not_x, "podSelector": pod("b")}]}]),
                ),
            )]],
        ),
        case(
            "should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
            vec![vec![policy(
                "x",
                "allow-ns-y-z-pod-b-c",
                ingress(
                    pod("a"),
                    json!([{"from": [{
                        "namespaceSelector": not_x,
                        "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b", "c"]}]},
                    }]}]),
                ),
            )]],
        ),
        case(
            "should enforce policy based on any PodSelectors",
            vec![vec![policy(
                "x",
                "allow-ns-x-pod-b-c",
                ingress(
                    pod("a"),
                    json!([{"from": [{"podSelector": pod("b")}, {"podSelector": pod("c")}]}]),
                ),
            )]],
        ),
        case(
            "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
            vec![vec![policy(
                "x",
                "allow-ns-y-pod-a-via-namespace-pod-selector",
                ingress(
                    pod("a"),
                    json!([{"from": [{"namespaceSelector": ns("y"), "podSelector": pod("a")}]}]),
                ),
            )]],
        ),
        case(
            "should enforce policy based on Ports",
            vec![vec![policy(
                "x",
                "allow-client-a-via-ns-selector",
                allow_81_from_y.clone(),
            )]],
        ),
        case(
            "should enforce multiple, stacked policies with overlapping podSelectors",
            vec![
                vec![policy(
                    "x",
                    "allow-client-a-via-ns-selector",
                    allow_81_from_y,
                )],
                vec![policy(
                    "x",
                    "allow-client-a-via-ns-selector-80",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": ns("y")}], "ports": [{"port": 80, "protocol": "TCP"}]}]),
                    ),
                )],
            ],
        ),
        case(
            "should support allow-all policy",
            vec![vec![policy(
                "x",
                "allow-all",
                ingress(json!({"matchLabels": {}}), json!([{}])),
            )]],
        ),
        case(
            "should allow ingress access on one named port",
            vec![vec![policy(
                "x",
                "allow-all",
                ingress(
                    json!({"matchLabels": {}}),
                    json!([{"ports": [{"port": "serve-81-tcp"}]}]),
                ),
            )]],
        ),
        case(
            "should allow ingress access from namespace on one named port",
            vec![vec![policy(
                "x",
                "allow-client-a-via-ns-selector-80",
                ingress(
                    pod("a"),
                    json!([{"from": [{"namespaceSelector": ns("y")}], "ports": [{"port": "serve-80-tcp", "protocol": "TCP"}]}]),
                ),
            )]],
        ),
        case(
            "should allow egress access on one named port",
            vec![vec![policy(
                "x",
                "allow-egress",
                egress(
                    json!({"matchLabels": {}}),
                    json!([{"ports": [{"port": "serve-80-tcp"}]}]),
                ),
            )]],
        ),
        case(
            "should enforce updated policy",
            vec![
                vec![policy(
                    "x",
                    "allow-all-mutate-to-deny-all",
                    ingress(json!({"matchLabels": {}}), json!([{}])),
                )],
                vec![policy(
                    "x",
                    "allow-all-mutate-to-deny-all",
                    ingress(json!({"matchLabels": {}}), json!([])),
                )],
            ],
        ),
        case(
            "should allow ingress access from updated namespace",
            vec![
                vec![policy(
                    "x",
                    "allow-client-a-via-ns-selector",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"namespaceSelector": {"matchLabels": {"ns2": "updated"}}}]}]),
                    ),
                )],
                vec![Action::NamespaceLabels(
                    "y",
                    vec![("ns", "y"), ("ns2", "updated")],
                )],
            ],
        ),
        case(
            "should allow ingress access from updated pod",
            vec![
                vec![policy(
                    "x",
                    "allow-client-a-via-pod-selector",
                    ingress(
                        pod("a"),
                        json!([{"from": [{"podSelector": {"matchLabels": {"pod": "b", "pod2": "updated"}}}]}]),
                    ),
                )],
                vec![Action::PodLabels(
                    "x",
                    "b",
                    vec![("pod", "b"), ("pod2", "updated")],
                )],
            ],
        ),
        case(
            "should deny ingress from pods on other namespaces",
            vec![vec![policy(
                "x",
                "deny-empty-policy",
                ingress(
                    json!({}),
                    json!([{"from": [{"podSelector": {"matchLabels": {}}}]}]),
                ),
            )]],
        ),
        case(
            "should deny ingress access to updated pod",
            vec![
                vec![policy(
                    "x",
                    "deny-ingress-via-label-selector",
                    ingress(json!({"matchLabels": {"target": "isolated"}}), json!([])),
                )],
                vec![Action::PodLabels(
                    "x",
                    "a",
                    vec![("pod", "a"), ("target", "isolated")],
                )],
            ],
        ),
        case(
            "should deny egress from pods based on PodSelector",
            vec![vec![policy(
                "x",
                "deny-egress-pod-a",
                egress(pod("a"), json!([])),
            )]],
        ),
        case(
            "should deny egress from all pods in a namespace",
            vec![vec![policy(
                "x",
                "deny-egress-ns-x",
                egress(json!({}), json!([])),
            )]],
        ),
        case(
            "should work with Ingress, Egress specified together",
            vec![vec![policy(
                "x",
                "allow-client-a-via-pod-selector",
                json!({
                    "podSelector": pod("a"),
                    "policyTypes": ["Egress", "Ingress"],
                    "ingress": [{"from": [{"podSelector": pod("b")}]}],
                    "egress": [{"ports": [{"port": 80}]}],
                }),
            )]],
        ),
        case(
            "should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)",
            vec![vec![
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
            ]],
        ),
        case(
            "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
            vec![vec![policy(
                "x",
                "allow-to-ns-y-pod-a",
                egress(
                    pod("a"),
                    json!([{"to": [{"namespaceSelector": ns("y"), "podSelector": pod("a")}]}]),
                ),
            )]],
        ),
        case(
            "should enforce ingress policy allowing any port traffic to a server on a specific protocol",
            vec![vec![policy(
                "x",
                "allow-ingress-by-proto",
                ingress(pod("a"), json!([{"ports": [{"protocol": "TCP"}]}])),
            )]],
        ),
        case(
            "should enforce multiple ingress policies with ingress allow-all policy taking precedence",
            vec![
                vec![policy(
                    "x",
                    "allow-ingress-port-80",
                    ingress(
                        json!({"matchLabels": {}}),
                        json!([{"ports": [{"port": 80}]}]),
                    ),
                )],
                vec![policy(
                    "x",
                    "allow-ingress",
                    ingress(json!({"matchLabels": {}}), json!([{}])),
                )],
            ],
        ),
        case(
            "should enforce multiple egress policies with egress allow-all policy taking precedence",
            vec![
                vec![policy(
                    "x",
                    "allow-egress-port-80",
                    egress(
                        json!({"matchLabels": {}}),
                        json!([{"ports": [{"port": 80}]}]),
                    ),
                )],
                vec![policy(
                    "x",
                    "allow-egress",
                    egress(json!({"matchLabels": {}}), json!([{}])),
                )],
            ],
        ),
        case(
            "should stop enforcing policies after they are deleted",
            vec![
                vec![policy(
                    "x",
                    "deny-all",
                    json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []}),
                )],
                vec![Action::DeletePolicy("x", "deny-all")],
            ],
        ),
        case(
            "should allow egress access to server in CIDR block",
            vec![vec![policy(
                "x",
                "allow-client-a-via-cidr-egress-rule",
                egress(pod("a"), json!([{"to": [{"ipBlock": {"cidr": host(yb)}}]}])),
            )]],
        ),
        case(
            "should enforce except clause while egress access to server in CIDR block",
            vec![vec![policy(
                "x",
                "allow-client-a-via-cidr-egress-rule",
                except_b.clone(),
            )]],
        ),
        case(
            "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed",
            vec![
                vec![policy("x", "allow-client-a-via-cidr-egress-rule", except_b)],
                vec![policy(
                    "x",
                    "allow-client-a-via-cidr-egress-rule",
                    egress(pod("a"), json!([{"to": [{"ipBlock": {"cidr": host(xb)}}]}])),
                )],
            ],
        ),
        case(
            "should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector",
            vec![
                vec![policy(
                    "x",
                    "allow-egress-for-target",
                    egress(pod("a"), json!([{}])),
                )],
                vec![policy(
                    "x",
                    "deny-ingress-via-label-selector",
                    ingress(pod("a"), json!([])),
                )],
            ],
        ),
        case(
            "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP",
            vec![vec![
                policy("x", "deny-ingress", ingress(json!({}), json!([]))),
                policy(
                    "x",
                    "allow-only-sctp-ingress-on-port-81",
                    ingress(
                        pod("a"),
                        json!([{"ports": [{"port": 81, "protocol": "SCTP"}]}]),
                    ),
                ),
            ]],
        ),
        case(
            "should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP",
            vec![vec![policy(
                "x",
                "allow-only-sctp-ingress-on-port-80",
                ingress(
                    pod("a"),
                    json!([{"ports": [{"port": 80, "protocol": "SCTP"}]}]),
                ),
            )]],
        ),
        case(
            "should not allow access by TCP when a policy specifies only UDP",
            vec![vec![policy(
                "x",
                "allow-only-udp-ingress-on-port-81",
                ingress(
                    pod("a"),
                    json!([{"ports": [{"port": 81, "protocol": "UDP"}]}]),
                ),
            )]],
        ),
        case(
            "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label",
            vec![vec![policy(
                "x",
                "allow-client-a-via-ns-selector-for-immutable-ns-label",
                ingress(
                    pod("a"),
                    json!([{"from": [{"namespaceSelector": ns("y")}]}]),
                ),
            )]],
        ),
        case(
            "should enforce policy based on NamespaceSelector with MatchExpressions using default ns label",
            vec![vec![policy(
                "x",
                "allow-ns-y-match-selector-for-immutable-ns-label",
                egress(
                    pod("a"),
                    json!([{"to": [{"namespaceSelector": {"matchExpressions": [{"key": NAME, "operator": "NotIn", "values": ["y"]}]}}]}]),
                ),
            )]],
        ),
    ]
}

/// Upstream's 3 UDP cases.
pub fn upstream_udp() -> Vec<Case> {
    vec![
        case(
            "udp: should support a 'default-deny-ingress' policy",
            vec![vec![policy("x", "deny-all", ingress(json!({}), json!([])))]],
        ),
        case(
            "udp: should enforce policy based on Ports",
            vec![vec![policy(
                "x",
                "allow-ingress-on-port-81-ns-x",
                ingress(
                    pod("a"),
                    json!([{"from": [{"namespaceSelector": ns("y")}], "ports": [{"port": 81, "protocol": "UDP"}]}]),
                ),
            )]],
        ),
        case(
            "udp: should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
            vec![vec![policy(
                "x",
                "allow-ns-y-pod-a-via-namespace-pod-selector",
                ingress(
                    pod("a"),
                    json!([{"from": [{"namespaceSelector": ns("y"), "podSelector": pod("a")}]}]),
                ),
            )]],
        ),
    ]
}

/// Ours: port ranges (`endPort`), which upstream tests only through API validation,
/// and ipBlocks of both families.
pub fn ours(ip_of: &dyn Fn(&str) -> (IpAddr, IpAddr)) -> Vec<Case> {
    let (yb4, yb6) = ip_of("y/b");
    vec![
        case(
            "endPort: ingress on a TCP range covering both servers' ports",
            vec![vec![policy(
                "x",
                "tcp-80-to-81",
                ingress(
                    pod("a"),
                    json!([{"ports": [{"protocol": "TCP", "port": 80, "endPort": 81}]}]),
                ),
            )]],
        ),
        case(
            "endPort: a UDP range ending between the servers' ports, for a whole namespace",
            vec![vec![policy(
                "y",
                "udp-1-to-80",
                ingress(
                    json!({}),
                    json!([{"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP", "port": 1, "endPort": 80}]}]),
                ),
            )]],
        ),
        case(
            "endPort: egress on a TCP range starting at 81 beside a single UDP port",
            vec![vec![policy(
                "z",
                "egress-ranges",
                egress(
                    pod("b"),
                    json!([{"ports": [
                        {"protocol": "TCP", "port": 81, "endPort": 65535},
                        {"protocol": "UDP", "port": 80},
                    ]}]),
                ),
            )]],
        ),
        case(
            "endPort: a one-port range and a named port of the other protocol, from one namespace",
            vec![vec![policy(
                "z",
                "one-port-and-named",
                ingress(
                    pod("c"),
                    json!([{"from": [{"namespaceSelector": ns("x")}], "ports": [
                        {"protocol": "TCP", "port": 80, "endPort": 80},
                        {"protocol": "UDP", "port": "serve-81-udp"},
                    ]}]),
                ),
            )]],
        ),
        case(
            "endPort: a range widened by an update",
            vec![
                vec![policy(
                    "x",
                    "widened",
                    ingress(
                        json!({}),
                        json!([{"ports": [{"protocol": "TCP", "port": 79, "endPort": 80}]}]),
                    ),
                )],
                vec![policy(
                    "x",
                    "widened",
                    ingress(
                        json!({}),
                        json!([{"ports": [{"protocol": "TCP", "port": 79, "endPort": 81}]}]),
                    ),
                )],
            ],
        ),
        case(
            "ipBlock of both families: egress to one pod's IPv4 and IPv6 addresses",
            vec![vec![policy(
                "x",
                "to-y-b-both-families",
                egress(
                    pod("a"),
                    json!([{"to": [{"ipBlock": {"cidr": host(yb4)}}, {"ipBlock": {"cidr": host(yb6)}}]}]),
                ),
            )]],
        ),
        case(
            "ipBlock of both families with except: node 1's pods by IPv4, node 2's by IPv6",
            vec![vec![policy(
                "z",
                "blocks-with-holes",
                ingress(
                    pod("c"),
                    json!([{"from": [
                        {"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.2.0/24"]}},
                        {"ipBlock": {"cidr": "fd00:244::/48", "except": ["fd00:244:0:1::/64"]}},
                    ]}]),
                ),
            )]],
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
}
