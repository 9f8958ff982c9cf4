//! Policy: the tiers a packet meets in order and the kinds that fill them
//! ([`pipeline`]), one module per kind ([`network_policy`]: its store, readiness and
//! compile), and the kernel side ([`datapath`]).
//!
//! NetworkPolicy's parts: the objects it is read from ([`objects`], [`selector`]), its
//! meaning ([`model`], which `explain` and the tests use), what the kernel must hold on
//! this node ([`compile`]), and the operator's question ([`explain`]).
//!
//! ClusterNetworkPolicy's parts ([`cluster_network_policy`]: its store and whether the
//! API serves it): the objects ([`cluster_objects`]) and the tiers' meaning
//! ([`cluster_model`]), what each tier holds per local pod ([`cluster_compile`]), and
//! the profiles the datapath loads into the tiers' verdict maps
//! ([`cluster_network_policy::compile`]).
//!
//! What each verdict of the kernel's table is accounted to ([`verdicts`]): the names of
//! the chains that count and log verdicts, read by `/metrics` and the deny log.

pub mod cluster_compile;
pub mod cluster_model;
pub mod cluster_network_policy;
pub mod cluster_objects;
pub mod compile;
pub mod datapath;
pub mod explain;
pub mod model;
pub mod network_policy;
pub mod objects;
pub mod pipeline;
pub mod selector;
pub mod verdicts;

use serde_json::Value;

use crate::logging::short;

/// Why a part of a Pod or a NetworkPolicy cannot be read exactly (the part then
/// matches nothing, or isolates, never opens).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    /// A field of the wrong JSON type.
    #[error("{field} is not {expected}: {value}")]
    Type {
        /// The field.
        field: String,
        /// What it should be.
        expected: &'static str,
        /// What it is, cut short.
        value: String,
    },
    /// A matchExpression without a key.
    #[error("a matchExpression without a key: {0}")]
    NoKey(String),
    /// A matchExpression whose operator and values do not go together.
    #[error("matchExpression {key:?} {operator} {why}")]
    Operator {
        /// The key.
        key: String,
        /// The operator as given.
        operator: String,
        /// What is wrong.
        why: &'static str,
    },
    /// Not a CIDR.
    #[error("{0:?} is not a CIDR")]
    Cidr(String),
    /// An `except` of the other family.
    #[error("except {0:?} is not of the cidr's family")]
    ExceptFamily(String),
    /// A protocol NetworkPolicy does not name.
    #[error("unknown protocol {0:?}")]
    Protocol(String),
    /// Not a port number.
    #[error("{field} {value} is not a port")]
    Port {
        /// `port` or `endPort`.
        field: &'static str,
        /// What it is, cut short.
        value: String,
    },
    /// `endPort` below `port`.
    #[error("endPort {end} is below port {start}")]
    EndBelowStart {
        /// `port`.
        start: u16,
        /// `endPort`.
        end: u16,
    },
    /// A combination the API does not allow.
    #[error("{0}")]
    Shape(&'static str),
    /// Inside a selector.
    #[error("{selector}: {inner}")]
    Selector {
        /// `podSelector` or `namespaceSelector`.
        selector: &'static str,
        /// What is wrong inside it.
        inner: Box<Unreadable>,
    },
}

impl Unreadable {
    /// A field of the wrong type.
    pub fn of_type(field: impl Into<String>, expected: &'static str, value: &Value) -> Self {
        Self::Type {
            field: field.into(),
            expected,
            value: short(value),
        }
    }
}

/// Runs `here` on this thread and `there` on a thread named `name` beside it, and
/// returns both results: a compile then waits for the slower part instead of both.
/// Where the process can start no thread, `there` runs after `here`. A panic in
/// `there` goes on in the caller.
pub(crate) fn beside<A, B: Send>(
    name: &str,
    here: impl FnOnce() -> A,
    there: impl Fn() -> B + Sync,
) -> (A, B) {
    std::thread::scope(|scope| {
        match std::thread::Builder::new()
            .name(name.to_owned())
            .spawn_scoped(scope, &there)
        {
            Ok(handle) => {
                let here = here();
                let there = handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (here, there)
            }
            Err(_) => (here(), there()),
        }
    })
}
