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

/// Runs `f(0..n)` on `width` threads at once (each call typically starts one plugin
/// process), so up to `width` calls overlap. Results come back in index order.
pub fn parallel<T: Send>(n: usize, width: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<Option<T>>> =
        std::sync::Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..width {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let r = f(i);
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every index ran"))
        .collect()
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
