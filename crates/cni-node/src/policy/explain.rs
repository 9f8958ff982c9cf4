//! `cni-node explain`: whether NetworkPolicy lets a connection through and which
//! policies decided it, from the running agent's own view (served on its explain
//! socket, [`crate::explain_socket`]), so an operator sees what the agent enforces, not
//! what the API says now. The question travels as `/explain`'s query string, built and
//! read here alone.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::model::{Side, View};
use super::network_policy::Snapshot;
use super::objects::{SCTP, TCP, UDP};
use crate::error::{Error, Result};

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

/// The answer: allowed or not, and the explanation as text; `records` are this node's
/// pod records (address -> pod), as the reconciler sees them.
pub fn explain(
    snapshot: &Snapshot,
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
    let allowed = verdict.allowed();
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
    if verdict.same_pod {
        text.push_str(
            "a pod reaching its own address is not subject to policy \
             (through a Service address it is: --via-service)\n",
        );
        return Ok((allowed, text));
    }
    let side = |text: &mut String, what: &str, side: &Option<Side>| match side {
        None => text.push_str(&format!("{what}: not a pod, no policy applies\n")),
        Some(s) if s.isolated_by.is_empty() => {
            text.push_str(&format!("{what}: no policy selects it, not isolated\n"));
        }
        Some(s) if s.allowed_by.is_empty() => text.push_str(&format!(
            "{what}: isolated by {}; none of them allows it\n",
            s.isolated_by.join(", ")
        )),
        Some(s) => text.push_str(&format!(
            "{what}: isolated by {}; allowed by {}\n",
            s.isolated_by.join(", "),
            s.allowed_by.join(", ")
        )),
    };
    side(&mut text, "egress of the source", &verdict.egress);
    side(&mut text, "ingress of the destination", &verdict.ingress);
    Ok((allowed, text))
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let (allowed, text) = explain(&snapshot, BTreeMap::new(), &q("y/a", "x/b")).unwrap();
        assert!(allowed, "{text}");
        assert!(text.contains("allowed by x/allow-y"), "{text}");
        let (allowed, text) = explain(&snapshot, BTreeMap::new(), &q("z/a", "x/b")).unwrap();
        assert!(!allowed, "{text}");
        assert!(
            text.contains("isolated by x/allow-y, x/deny; none of them allows it"),
            "{text}"
        );
        assert!(
            text.contains("egress of the source: no policy selects it"),
            "{text}"
        );
        let (allowed, _) = explain(&snapshot, BTreeMap::new(), &q("192.0.2.1", "x/b")).unwrap();
        assert!(!allowed);
        let e = explain(&snapshot, BTreeMap::new(), &q("x/nope", "x/b"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no pod \"x/nope\""), "{e}");
        let e = explain(
            &snapshot,
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
        let snapshot = |policies: &[(String, crate::policy::objects::PolicyInfo)]| Snapshot {
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
        let (allowed, text) = explain(&snapshot(&deny), BTreeMap::new(), &direct).unwrap();
        assert!(allowed, "{text}");
        assert!(text.contains("not subject to policy"), "{text}");
        let (allowed, text) = explain(&snapshot(&deny), BTreeMap::new(), &through).unwrap();
        assert!(!allowed, "{text}");
        assert!(
            text.starts_with(
                "denied: TCP 10.244.0.10 (pod x/a) -> 10.244.0.10 (pod x/a) port 8080 \
                 through Service address 10.96.0.10\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("ingress of the destination: isolated by x/deny; none of them allows it"),
            "{text}"
        );
        let (allowed, text) = explain(&snapshot(&allow_self), BTreeMap::new(), &through).unwrap();
        assert!(allowed, "{text}");
        assert!(text.contains("allowed by x/allow-self"), "{text}");
        let e = explain(
            &snapshot(&deny),
            BTreeMap::new(),
            &Question {
                via_service: Some("fd00::10".parse().unwrap()),
                ..direct
            },
        )
        .unwrap_err();
        assert!(matches!(e, Error::ExplainFamilies(..)), "{e}");
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
