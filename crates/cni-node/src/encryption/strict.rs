//! The strict mode's rules as the agent asks for them (`--encryption-strict`): the
//! rules themselves live in `cni_firewall::strict_encryption`; this adapts the call
//! behind a trait, so the reconciler is tested without a firewall.

pub use cni_firewall::strict_encryption::StrictPolicy;

use crate::error::{Error, Result};

/// The strict table: a trait so the reconciler is tested without a firewall.
pub trait StrictRules: Send {
    /// Makes the table hold `policy`; whether anything changed.
    fn sync(&self, policy: &StrictPolicy) -> Result<bool>;
    /// Removes the table (strict mode off); whether it was there.
    fn remove(&self) -> Result<bool>;
}

/// The real table, over nf_tables.
#[derive(Debug, Default)]
pub struct Table;

impl StrictRules for Table {
    fn sync(&self, policy: &StrictPolicy) -> Result<bool> {
        cni_firewall::strict_encryption::sync(policy).map_err(Error::Strict)
    }
    fn remove(&self) -> Result<bool> {
        cni_firewall::strict_encryption::remove().map_err(Error::Strict)
    }
}
