//! What every verdict of the policy table is accounted to. The datapath sends each
//! decided verdict through a chain of its own that counts new connections (and, with the
//! deny log on, logs denied ones with the chain's name as the log prefix); this module
//! names those chains for what decided there (tier, policy, rule, action), so the
//! kernel's counters become `/metrics` series and a logged packet becomes a line naming
//! the policy and rule. The datapath fills the names at every apply; `/metrics` and the
//! deny log read them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use sha2::Digest as _;

use super::pipeline::Tier;

/// Whether traffic goes into or out of the local pod the verdict is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// To the local pod.
    Ingress,
    /// From the local pod.
    Egress,
}

impl Direction {
    /// `ingress` or `egress`, as in labels and log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }
}

/// What a verdict chain does to the packets sent to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Let through (for its direction: the other end's side is judged on its own).
    Accept,
    /// Dropped.
    Deny,
    /// Handed to the next tier (ClusterNetworkPolicy's `Pass`).
    Pass,
}

impl Verdict {
    /// `accept`, `deny` or `pass`, as in labels and log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accept => "accept",
            Self::Deny => "deny",
            Self::Pass => "pass",
        }
    }
}

/// What one verdict chain stands for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VerdictOrigin {
    /// The tier that decided.
    pub tier: Tier,
    /// ClusterNetworkPolicy: the policy's name. NetworkPolicy: the namespace of the
    /// local pod (its policies decide together, so verdicts are counted per namespace).
    pub policy: String,
    /// ClusterNetworkPolicy: the rule's `name`, else `ingress[i]`/`egress[i]` (its index
    /// in the policy's list). NetworkPolicy: `allow` or `default-deny`.
    pub rule: String,
    /// The direction judged.
    pub direction: Direction,
    /// What happened.
    pub verdict: Verdict,
}

impl VerdictOrigin {
    /// The name of the chain that stands for this origin: `v-` and 24 hex digits of a
    /// hash of the origin, so the same origin has the same chain in every run (a table
    /// left by a previous run is adopted as is) and the name fits nftables' log prefix.
    pub fn chain(&self) -> String {
        let key = format!(
            "{:?}\0{}\0{}\0{}\0{}",
            self.tier,
            self.policy,
            self.rule,
            self.direction.as_str(),
            self.verdict.as_str()
        );
        let digest = sha2::Sha256::digest(key.as_bytes());
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        format!("v-{hex}")
    }
}

impl fmt::Display for VerdictOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} {} {} {} {}",
            self.tier,
            self.policy,
            self.rule,
            self.direction.as_str(),
            self.verdict.as_str()
        )
    }
}

/// Verdict chain name -> what it stands for, as of the datapath's last apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerdictNames {
    by_chain: BTreeMap<String, VerdictOrigin>,
}

impl VerdictNames {
    /// The names of `origins`.
    pub fn new(origins: impl IntoIterator<Item = VerdictOrigin>) -> Self {
        Self {
            by_chain: origins.into_iter().map(|o| (o.chain(), o)).collect(),
        }
    }

    /// What the chain `chain` (or a log prefix that is a chain's name) stands for.
    pub fn origin(&self, chain: &str) -> Option<&VerdictOrigin> {
        self.by_chain.get(chain)
    }

    /// Every chain and its origin, by chain name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &VerdictOrigin)> {
        self.by_chain.iter().map(|(c, o)| (c.as_str(), o))
    }

    /// How many chains.
    pub fn len(&self) -> usize {
        self.by_chain.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_chain.is_empty()
    }
}

/// The names, shared between the reconciler (which replaces them at every apply) and
/// the readers (`/metrics`, the deny log).
pub type SharedVerdictNames = Arc<Mutex<VerdictNames>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(rule: &str, verdict: Verdict) -> VerdictOrigin {
        VerdictOrigin {
            tier: Tier::Admin,
            policy: "deny-metadata".into(),
            rule: rule.into(),
            direction: Direction::Egress,
            verdict,
        }
    }

    #[test]
    fn chain_names_are_stable_short_and_distinct() {
        let a = origin("egress[0]", Verdict::Deny);
        let b = origin("egress[0]", Verdict::Accept);
        assert_eq!(a.chain(), origin("egress[0]", Verdict::Deny).chain());
        assert_ne!(a.chain(), b.chain());
        // nftables' log prefix holds 127 bytes, a chain name 255.
        assert_eq!(a.chain().len(), 26);
        let names = VerdictNames::new([a.clone(), b]);
        assert_eq!(names.origin(&a.chain()), Some(&a));
        assert_eq!(names.len(), 2);
        assert!(names.origin("v-000000000000000000000000").is_none());
    }
}
