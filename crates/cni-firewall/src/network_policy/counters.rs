//! The verdict chains' counters, read from the kernel on their own: what `/metrics`
//! reports per verdict chain, without the [`PolicyTable`](super::PolicyTable) that
//! writes the table (a reader in another thread needs no more than a socket).

use super::*;

/// Each verdict chain's counter (`v-…` -> packets and bytes of the connections it has
/// seen open since it was made), read with one dump of the table's rules in the
/// calling thread's network namespace. No table: none.
pub fn read_verdict_counters() -> Result<BTreeMap<String, (u64, u64)>> {
    let mut nl = Nfnl::open()?;
    if !nl.has_table(NFPROTO_INET, TABLE)? {
        return Ok(BTreeMap::new());
    }
    let rules = match nl.rules_decoding(NFPROTO_INET, TABLE, None, &|chain| {
        valid_verdict_chain(chain)
    }) {
        Ok(rules) => rules,
        // Removed between the two requests.
        Err(e) if is_not_found(&e) => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    Ok(counters_of(&rules))
}

/// The counters of the verdict chains among `rules`.
pub(super) fn counters_of(rules: &[crate::nfnetlink::Rule]) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for rule in rules.iter().filter(|r| valid_verdict_chain(&r.chain)) {
        for e in &rule.exprs {
            if let Expr::Counter { packets, bytes } = e {
                let entry = out.entry(rule.chain.clone()).or_insert((0, 0));
                entry.0 += packets;
                entry.1 += bytes;
            }
        }
    }
    out
}
