//! Table-driven tests that report every failing row, not just the first.
//!
//! A protocol table has a dozen rows; when a plugin regresses, knowing that three rows
//! fail (and which) says more than the first panic. Each row's own panic message is
//! printed as usual by the panic hook; the summary at the end names the failed rows.

use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `check` on every case; panics afterwards if any case panicked, listing them.
pub fn check_cases<C: Debug>(cases: &[C], check: impl Fn(&C)) {
    let failed: Vec<String> = cases
        .iter()
        .filter(|case| catch_unwind(AssertUnwindSafe(|| check(case))).is_err())
        .map(|case| format!("  {case:?}"))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} cases failed (their messages are above):\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_cases_run_and_failures_are_reported() {
        let ran = std::cell::Cell::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            check_cases(&[1, 2, 3, 4], |n| {
                ran.set(ran.get() + 1);
                assert!(n % 2 == 1, "even");
            });
        }));
        assert_eq!(ran.get(), 4);
        let message = result.expect_err("two cases fail");
        let text = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(text.starts_with("2 of 4 cases failed"), "{text}");
    }

    #[test]
    fn passing_cases_do_not_panic() {
        check_cases(&["a", "b"], |s| assert_eq!(s.len(), 1));
    }
}
