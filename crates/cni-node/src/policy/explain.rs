//! `cni-node explain`: whether the policy tiers let a connection through and, for each
//! direction, which tier, policy and rule decided it (ClusterNetworkPolicy's Admin tier,
//! NetworkPolicy, the Baseline tier, else allowed by default), from the running agent's
//! own view (served on its explain socket, [`crate::explain_socket`]), so an operator
//! sees what the agent enforces, not what the API says now. The Admin and Baseline
//! tiers are read from the tables the datapath loads ([`cluster_compile`], compiled for
//! the node of the pod at that end), NetworkPolicy from its model, which its compile is
//! held to; the names are the verdict counters' and the deny log's. The question
//! travels as `/explain`'s query string, built and read here alone.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::cluster_compile::{self, ClusterCompiled, RuleRef};
use super::cluster_model::{NodePeer, TieredView};
use super::cluster_objects::{Action, ClusterPolicyInfo};
use super::model::{Side, View};
use super::network_policy::Snapshot;
use super::objects::{SCTP, TCP, UDP};
use super::pipeline::Tier;
use crate::error::{Error, Result};
use crate::store::ItemMap;

/// A question: from an address or a pod (`namespace/name`) to a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// Source: an address or `namespace/name`.
    pub from: String,
    /// Destination: an address or `namespace/name`.
    pub to: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// Destination port.
    pub port: u16,
    /// Use the pods' IPv6 addresses (when a pod is named).
    pub ipv6: bool,
    /// The Service address the source connected to, which kube-proxy's DNAT turned
    /// into `to` and `port`: judged as such, so a pod reaching itself this way is
    /// judged (reaching its own address directly is not).
    pub via_service: Option<IpAddr>,
}

impl Question {
    /// The question as `/explain`'s query string: `from=..&to=..&protocol=..&port=..&ipv6=0|1`
    /// and `&via_service=..` when asked.
    pub fn query(&self) -> String {
        let via_service = self
            .via_service
            .map(|s| format!("&via_service={}", percent_encode(&s.to_string())))
            .unwrap_or_default();
        format!(
            "from={}&to={}&protocol={}&port={}&ipv6={}{via_service}",
            percent_encode(&self.from),
            percent_encode(&self.to),
            percent_encode(&self.protocol),
            self.port,
            u8::from(self.ipv6)
        )
    }

    /// The question a query string asks (the protocol TCP unless named); `None` when
    /// `from`, `to` or `port` is missing or a value cannot be read.
    pub fn from_query(query: &str) -> Option<Self> {
        let param = |key: &str| {
            query.split('&').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                (k == key).then(|| percent_decode(v))
            })
        };
        Some(Self {
            from: param("from")?,
            to: param("to")?,
            protocol: param("protocol").unwrap_or_else(|| "TCP".into()),
            port: param("port")?.parse().ok()?,
            ipv6: param("ipv6").is_some_and(|v| v == "1" || v == "true"),
            via_service: match param("via_service") {
                Some(text) => Some(text.parse().ok()?),
                None => None,
            },
        })
    }
}

/// Decodes the `%XX` escapes (and `+` as a space) of a query value.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Encodes a query value (everything but unreserved characters).
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The ClusterNetworkPolicy side of the agent's view: the policies (by name) and the
/// Nodes as `nodes` peers see them. Without it (the kind not watched or not served) the
/// Admin and Baseline tiers hold nothing.
#[derive(Debug, Clone, Copy)]
pub struct ClusterView<'a> {
    /// ClusterNetworkPolicies by name.
    pub policies: &'a ItemMap<ClusterPolicyInfo>,
    /// Nodes by name.
    pub nodes: &'a BTreeMap<String, NodePeer>,
}

/// Who decided one direction, as the tiers' compiled tables and NetworkPolicy say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The tier that decided; `None`: none did, allowed by default.
    pub tier: Option<Tier>,
    /// Whether the direction lets the connection pass.
    pub allowed: bool,
    /// ClusterNetworkPolicy: the policy; NetworkPolicy: the local pod's namespace.
    pub policy: String,
    /// ClusterNetworkPolicy: the rule's name, else `ingress[i]`/`egress[i]`;
    /// NetworkPolicy: `allow` or `default-deny` (as the verdict counters name them).
    pub rule: String,
    /// The `Pass` rules that sent it on: (tier, policy, rule).
    pub passed: Vec<(Tier, String, String)>,
}

/// A rule's name as the verdict chains have it: its `name`, else its place in its list.
pub fn rule_name(policies: &ItemMap<ClusterPolicyInfo>, rule: &RuleRef, ingress: bool) -> String {
    let direction = if ingress { "ingress" } else { "egress" };
    policies
        .get(&*rule.policy)
        .and_then(|p| {
            if ingress {
                p.ingress.get(rule.index)
            } else {
                p.egress.get(rule.index)
            }
        })
        .map(|r| r.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("{direction}[{}]", rule.index))
}

/// Walks one direction of a local pod address `local` with `peer` through the tiers
/// in packet order: the Admin table (as compiled for the pod's node), NetworkPolicy
/// (`side`, the pod's), the Baseline table, then the default.
#[allow(clippy::too_many_arguments)]
pub fn decide(
    compiled: &ClusterCompiled,
    policies: &ItemMap<ClusterPolicyInfo>,
    ingress: bool,
    local: IpAddr,
    peer: IpAddr,
    protocol: u8,
    port: u16,
    namespace: &str,
    side: &Side,
) -> Decided {
    let mut passed = Vec::new();
    for tier in [Tier::Admin, Tier::NetworkPolicy, Tier::Baseline] {
        if tier == Tier::NetworkPolicy {
            if side.isolated_by.is_empty() {
                continue;
            }
            let allowed = side.allowed();
            return Decided {
                tier: Some(tier),
                allowed,
                policy: namespace.to_owned(),
                rule: if allowed { "allow" } else { "default-deny" }.to_owned(),
                passed,
            };
        }
        let Some(found) = compiled.lookup(tier, ingress, local, peer, protocol, port) else {
            continue;
        };
        let rule = rule_name(policies, &found.rule, ingress);
        match found.verdict {
            Action::Pass => passed.push((tier, found.rule.policy.to_string(), rule)),
            verdict => {
                return Decided {
                    tier: Some(tier),
                    allowed: verdict == Action::Accept,
                    policy: found.rule.policy.to_string(),
                    rule,
                    passed,
                };
            }
        }
    }
    Decided {
        tier: None,
        allowed: true,
        policy: String::new(),
        rule: String::new(),
        passed,
    }
}

/// The answer: allowed or not, and the explanation as text; `records` are this node's
/// pod records (address -> pod), as the reconciler sees them. Each direction is walked
/// through the tiers' tables as the datapath of the pod's node loads them.
pub fn explain(
    snapshot: &Snapshot,
    cluster: Option<ClusterView<'_>>,
    records: BTreeMap<IpAddr, String>,
    q: &Question,
) -> Result<(bool, String)> {
    let protocol = match q.protocol.to_ascii_uppercase().as_str() {
        "TCP" => TCP,
        "UDP" => UDP,
        "SCTP" => SCTP,
        _ => return Err(Error::ExplainProtocol(q.protocol.clone())),
    };
    let view = View::with_records(
        &snapshot.pods,
        &snapshot.namespaces,
        &snapshot.policies,
        records,
    );
    let address = |what: &str| -> Result<IpAddr> {
        if let Ok(ip) = what.parse::<IpAddr>() {
            return Ok(ip);
        }
        let pod = snapshot
            .pods
            .get(what)
            .ok_or_else(|| Error::ExplainNoPod(what.to_owned()))?;
        view.ips(pod)
            .into_iter()
            .find(|ip| ip.is_ipv6() == q.ipv6)
            .ok_or_else(|| Error::ExplainNoAddress {
                pod: what.to_owned(),
                family: if q.ipv6 { "IPv6" } else { "IPv4" },
            })
    };
    let (src, dst) = (address(&q.from)?, address(&q.to)?);
    if src.is_ipv4() != dst.is_ipv4() {
        return Err(Error::ExplainFamilies(src, dst));
    }
    if let Some(service) = q.via_service.filter(|s| s.is_ipv4() != dst.is_ipv4()) {
        return Err(Error::ExplainFamilies(service, dst));
    }
    let verdict = match q.via_service {
        Some(_) => view.verdict_through_service(src, dst, protocol, q.port),
        None => view.verdict(src, dst, protocol, q.port),
    };
    let name = |ip: IpAddr| match view.pod_at(ip) {
        Some(pod) => format!("{ip} (pod {})", pod.key()),
        None => format!("{ip} (no pod)"),
    };
    let header = |allowed: bool| {
        let mut text = format!(
            "{}: {} {} -> {} port {}",
            if allowed { "allowed" } else { "denied" },
            q.protocol.to_ascii_uppercase(),
            name(src),
            name(dst),
            q.port
        );
        if let Some(service) = q.via_service {
            text.push_str(&format!(" through Service address {service}"));
        }
        text.push('\n');
        text
    };
    if verdict.same_pod {
        let mut text = header(true);
        text.push_str(
            "a pod reaching its own address is not subject to policy \
             (through a Service address it is: --via-service)\n",
        );
        return Ok((true, text));
    }
    let no_policies = BTreeMap::new();
    let no_nodes = BTreeMap::new();
    let cluster = cluster.unwrap_or(ClusterView {
        policies: &no_policies,
        nodes: &no_nodes,
    });
    let tiered = TieredView::new(&view, cluster.policies, cluster.nodes);
    // The tables of each node a pod of the question runs on, as its agent compiles them.
    let mut compiled: BTreeMap<String, ClusterCompiled> = BTreeMap::new();
    let mut direction = |ingress: bool, side: &Option<Side>| -> Option<(Decided, Side)> {
        let side = side.as_ref()?;
        let (local, peer) = if ingress { (dst, src) } else { (src, dst) };
        let pod = view.pod_at(local)?;
        let tables = compiled
            .entry(pod.node.clone())
            .or_insert_with(|| cluster_compile::compile(&tiered, &pod.node));
        let decided = decide(
            tables,
            cluster.policies,
            ingress,
            local,
            peer,
            protocol,
            q.port,
            &pod.namespace,
            side,
        );
        Some((decided, side.clone()))
    };
    let egress = direction(false, &verdict.egress);
    let ingress = direction(true, &verdict.ingress);
    let allowed = [&egress, &ingress]
        .iter()
        .all(|d| d.as_ref().is_none_or(|(d, _)| d.allowed));
    let mut text = header(allowed);
    for (what, decided) in [
        ("egress of the source", &egress),
        ("ingress of the destination", &ingress),
    ] {
        text.push_str(what);
        text.push_str(": ");
        text.push_str(&describe(decided.as_ref()));
        text.push('\n');
    }
    Ok((allowed, text))
}

/// One direction's line, after its `egress of the source: `.
fn describe(decided: Option<&(Decided, Side)>) -> String {
    let Some((d, side)) = decided else {
        return "not a pod, no policy applies".into();
    };
    let verdict = if d.allowed { "allowed" } else { "denied" };
    let mut text = match d.tier {
        None => "no policy: allowed".to_owned(),
        Some(Tier::NetworkPolicy) => {
            let why = if d.allowed {
                format!(
                    "isolated by {}; allowed by {}",
                    side.isolated_by.join(", "),
                    side.allowed_by.join(", ")
                )
            } else {
                format!(
                    "isolated by {}; none of them allows it",
                    side.isolated_by.join(", ")
                )
            };
            format!(
                "{verdict} by the NetworkPolicy tier (namespace {}, rule {}): {why}",
                d.policy, d.rule
            )
        }
        Some(tier) => format!(
            "{verdict} by the {tier:?} tier: ClusterNetworkPolicy {}, rule {}",
            d.policy, d.rule
        ),
    };
    for (tier, policy, rule) in &d.passed {
        text.push_str(&format!(
            " (passed on by {tier:?} ClusterNetworkPolicy {policy}, rule {rule})"
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::model::View;
    use crate::policy::model::tests::{cluster, policy};
    use serde_json::json;
    use std::sync::Arc;

    #[test]
    fn explains_which_policies_decided() {
        let (pods, namespaces) = cluster();
        let policies: BTreeMap<_, _> = [
            policy("x", "deny", json!({"podSelector": {}})),
            policy("x", "allow-y", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]})),
        ]
        .into_iter()
        .collect();
        let snapshot = Snapshot {
            pods: Arc::new(pods),
            namespaces: Arc::new(namespaces),
            policies: Arc::new(policies),
        };
        let q = |from: &str, to: &str| Question {
            from: from.into(),
            to: to.into(),
            protocol: "tcp".into(),
            port: 80,
            ipv6: false,
            via_service: None,
        };
        let (allowed, text) = explain(&snapshot, None, BTreeMap::new(), &q("y/a", "x/b")).unwrap();
        assert!(allowed, "{text}");
        assert!(text.contains("allowed by x/allow-y"), "{text}");
        let (allowed, text) = explain(&snapshot, None, BTreeMap::new(), &q("z/a", "x/b")).unwrap();
        assert!(!allowed, "{text}");
        assert!(
            text.contains("isolated by x/allow-y, x/deny; none of them allows it"),
            "{text}"
        );
        assert!(
            text.contains("egress of the source: no policy: allowed"),
            "{text}"
        );
        let (allowed, _) =
            explain(&snapshot, None, BTreeMap::new(), &q("192.0.2.1", "x/b")).unwrap();
        assert!(!allowed);
        let e = explain(&snapshot, None, BTreeMap::new(), &q("x/nope", "x/b"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no pod \"x/nope\""), "{e}");
        let e = explain(
            &snapshot,
            None,
            BTreeMap::new(),
            &Question {
                protocol: "icmp".into(),
                ..q("y/a", "x/b")
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown protocol"), "{e}");
    }

    #[test]
    fn a_pod_reaching_itself_is_judged_only_through_a_service_address() {
        let (pods, namespaces) = cluster();
        let deny = [policy("x", "deny", json!({"podSelector": {}}))];
        let allow_self = [
            policy("x", "deny", json!({"podSelector": {}})),
            policy(
                "x",
                "allow-self",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
            ),
        ];
        let snapshot = |policies: &[(String, Arc<crate::policy::objects::PolicyInfo>)]| Snapshot {
            pods: Arc::new(pods.clone()),
            namespaces: Arc::new(namespaces.clone()),
            policies: Arc::new(policies.iter().cloned().collect()),
        };
        let direct = Question {
            from: "x/a".into(),
            to: "x/a".into(),
            protocol: "TCP".into(),
            port: 8080,
            ipv6: false,
            via_service: None,
        };
        let service: IpAddr = "10.96.0.10".parse().unwrap();
        let through = Question {
            via_service: Some(service),
            ..direct.clone()
        };
        let (allowed, text) = explain(&snapshot(&deny), None, BTreeMap::new(), &direct).unwrap();
        assert!(allowed, "{text}");
        assert!(text.contains("not subject to policy"), "{text}");
        let (allowed, text) = explain(&snapshot(&deny), None, BTreeMap::new(), &through).unwrap();
        assert!(!allowed, "{text}");
        assert!(
            text.starts_with(
                "denied: TCP 10.244.0.10 (pod x/a) -> 10.244.0.10 (pod x/a) port 8080 \
                 through Service address 10.96.0.10\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "ingress of the destination: denied by the NetworkPolicy tier (namespace x, \
                 rule default-deny): isolated by x/deny; none of them allows it"
            ),
            "{text}"
        );
        let (allowed, text) =
            explain(&snapshot(&allow_self), None, BTreeMap::new(), &through).unwrap();
        assert!(allowed, "{text}");
        assert!(text.contains("allowed by x/allow-self"), "{text}");
        let e = explain(
            &snapshot(&deny),
            None,
            BTreeMap::new(),
            &Question {
                via_service: Some("fd00::10".parse().unwrap()),
                ..direct
            },
        )
        .unwrap_err();
        assert!(matches!(e, Error::ExplainFamilies(..)), "{e}");
    }

    /// An Admin policy that denies egress to z's pods on TCP 80 (and accepts UDP
    /// there), passes y's ingress from z, and a Baseline policy that denies ingress
    /// from z to every pod on TCP; NetworkPolicy isolates y's ingress.
    fn tiered() -> (Snapshot, ItemMap<ClusterPolicyInfo>) {
        let (pods, namespaces) = cluster();
        let policies: BTreeMap<_, _> = [policy(
            "y",
            "from-x",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}]}]}),
        )]
        .into_iter()
        .collect();
        let snapshot = Snapshot {
            pods: Arc::new(pods),
            namespaces: Arc::new(namespaces),
            policies: Arc::new(policies),
        };
        let z = json!({"namespaces": {"matchLabels": {"ns": "z"}}});
        let cluster: ItemMap<ClusterPolicyInfo> = [
            (
                "guard",
                json!({"tier": "Admin", "priority": 10, "subject": {"namespaces": {}},
                       "egress": [
                           {"name": "no-web-to-z", "action": "Deny", "to": [z],
                            "protocols": [{"tcp": {"destinationPort": {"number": 80}}}]},
                           {"action": "Accept", "to": [z], "protocols": [{"udp": {}}]}],
                       "ingress": [
                           {"name": "z-to-y-decided-below", "action": "Pass", "from": [z]}]}),
            ),
            (
                "floor",
                json!({"tier": "Baseline", "priority": 10, "subject": {"namespaces": {}},
                       "ingress": [
                           {"name": "no-tcp-from-z", "action": "Deny", "from": [z],
                            "protocols": [{"tcp": {"destinationPort": {"range": {"start": 1, "end": 65535}}}}]}]}),
            ),
        ]
        .into_iter()
        .map(|(name, spec)| (name.to_owned(), Arc::new(ClusterPolicyInfo::read(name, &spec))))
        .collect();
        (snapshot, cluster)
    }

    fn ask(from: &str, to: &str, protocol: &str, port: u16) -> Question {
        Question {
            from: from.into(),
            to: to.into(),
            protocol: protocol.into(),
            port,
            ipv6: false,
            via_service: None,
        }
    }

    #[test]
    fn each_direction_names_its_tier_policy_and_rule() {
        let (snapshot, policies) = tiered();
        let nodes = BTreeMap::new();
        let cluster = Some(ClusterView {
            policies: &policies,
            nodes: &nodes,
        });
        let answer = |q: Question| explain(&snapshot, cluster, BTreeMap::new(), &q).unwrap();
        let (allowed, text) = answer(ask("x/a", "z/b", "TCP", 80));
        assert!(!allowed, "{text}");
        assert!(
            text.contains(
                "egress of the source: denied by the Admin tier: ClusterNetworkPolicy guard, \
                 rule no-web-to-z\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("ingress of the destination: no policy: allowed\n"),
            "{text}"
        );
        // An unnamed rule is named by its place.
        let (allowed, text) = answer(ask("x/a", "z/b", "UDP", 53));
        assert!(allowed, "{text}");
        assert!(
            text.contains("allowed by the Admin tier: ClusterNetworkPolicy guard, rule egress[1]"),
            "{text}"
        );
        // Passed by Admin, then NetworkPolicy isolates y's ingress and allows only x.
        let (allowed, text) = answer(ask("z/a", "y/b", "UDP", 53));
        assert!(!allowed, "{text}");
        assert!(
            text.contains(
                "ingress of the destination: denied by the NetworkPolicy tier (namespace y, \
                 rule default-deny): isolated by y/from-x; none of them allows it (passed on \
                 by Admin ClusterNetworkPolicy guard, rule z-to-y-decided-below)"
            ),
            "{text}"
        );
        // Passed by Admin, NetworkPolicy silent on x's ingress: the Baseline decides.
        let (allowed, text) = answer(ask("z/a", "x/b", "TCP", 8080));
        assert!(!allowed, "{text}");
        assert!(
            text.contains(
                "ingress of the destination: denied by the Baseline tier: \
                 ClusterNetworkPolicy floor, rule no-tcp-from-z (passed on by Admin"
            ),
            "{text}"
        );
        // Without the cluster's view only NetworkPolicy speaks.
        let (allowed, text) = explain(
            &snapshot,
            None,
            BTreeMap::new(),
            &ask("z/a", "x/b", "TCP", 8080),
        )
        .unwrap();
        assert!(allowed, "{text}");
    }

    /// Explain's walk through the compiled tables agrees with the tiers' model on every
    /// pair of pods (both nodes, both families), protocol and port.
    #[test]
    fn explain_agrees_with_the_model_on_a_matrix() {
        let (snapshot, policies) = tiered();
        let nodes = BTreeMap::new();
        let cluster = Some(ClusterView {
            policies: &policies,
            nodes: &nodes,
        });
        let view = View::new(&snapshot.pods, &snapshot.namespaces, &snapshot.policies);
        let model = TieredView::new(&view, &policies, &nodes);
        let mut checked = 0;
        for from in snapshot.pods.values() {
            for to in snapshot.pods.values() {
                for ipv6 in [false, true] {
                    for (protocol, number, port) in
                        [("TCP", TCP, 80), ("TCP", TCP, 8080), ("UDP", UDP, 53)]
                    {
                        let q = Question {
                            ipv6,
                            ..ask(&from.key(), &to.key(), protocol, port)
                        };
                        let (allowed, text) =
                            explain(&snapshot, cluster, BTreeMap::new(), &q).unwrap();
                        let pick = |p: &crate::policy::objects::PodInfo| {
                            p.ips
                                .iter()
                                .copied()
                                .find(|ip| ip.is_ipv6() == ipv6)
                                .unwrap()
                        };
                        let want = model.verdict(pick(from), pick(to), number, port);
                        assert_eq!(allowed, want.allowed(), "{q:?}: {text}\n{want:#?}");
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 9 * 9 * 2 * 3);
    }

    #[test]
    fn query_values_round_trip() {
        for text in ["x/a", "fd00::1", "a b&c=d%"] {
            assert_eq!(percent_decode(&percent_encode(text)), text);
        }
        assert_eq!(percent_decode("a%2Fb+c%zz"), "a/b c%zz");
    }

    #[test]
    fn a_question_survives_its_query_string() {
        let q = Question {
            from: "x/a b".into(),
            to: "fd00::1".into(),
            protocol: "UDP".into(),
            port: 53,
            ipv6: true,
            via_service: Some("fd00::10".parse().unwrap()),
        };
        assert_eq!(Question::from_query(&q.query()), Some(q.clone()));
        let plain = Question {
            via_service: None,
            ipv6: false,
            ..q
        };
        assert_eq!(Question::from_query(&plain.query()), Some(plain));
        assert_eq!(Question::from_query("from=a&to=b"), None, "no port");
    }
}
