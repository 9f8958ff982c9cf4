//! How the reconciler is woken: API watches and host notifications say "something
//! changed", the reconciler waits for that or for its next deadline (the resync, or a
//! retry after a failure). Changes that arrive while a reconciliation runs collapse
//! into one more pass, so a burst of events costs one reconciliation, not one each.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Why [`Wake::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// Something changed since the last wait.
    Changed,
    /// The deadline passed with no change.
    Deadline,
    /// The agent is stopping.
    Stop,
}

#[derive(Debug, Default)]
struct State {
    changed: bool,
    stopping: bool,
}

/// A coalescing wake-up between the watches and the reconciler.
#[derive(Debug, Default)]
pub struct Wake {
    state: Mutex<State>,
    cond: Condvar,
}

impl Wake {
    /// Something changed.
    pub fn notify(&self) {
        self.lock().changed = true;
        self.cond.notify_one();
    }

    /// The agent is stopping: every wait returns [`Woken::Stop`] from now on.
    pub fn stop(&self) {
        self.lock().stopping = true;
        self.cond.notify_all();
    }

    /// Waits for a change, the stop, or `deadline`, whichever comes first; a change
    /// is taken (the next wait waits for a new one).
    pub fn wait_until(&self, deadline: Instant) -> Woken {
        let mut state = self.lock();
        loop {
            if state.stopping {
                return Woken::Stop;
            }
            if state.changed {
                state.changed = false;
                return Woken::Changed;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Woken::Deadline;
            }
            state = self
                .cond
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// [`Wake::wait_until`] `timeout` from now.
    pub fn wait(&self, timeout: Duration) -> Woken {
        self.wait_until(Instant::now() + timeout)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn changes_coalesce_and_are_taken_once() {
        let wake = Wake::default();
        wake.notify();
        wake.notify();
        assert_eq!(wake.wait(Duration::from_secs(5)), Woken::Changed);
        assert_eq!(wake.wait(Duration::from_millis(10)), Woken::Deadline);
    }

    #[test]
    fn a_change_from_another_thread_wakes_a_waiter() {
        let wake = Arc::new(Wake::default());
        let other = Arc::clone(&wake);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            other.notify();
        });
        assert_eq!(wake.wait(Duration::from_secs(30)), Woken::Changed);
        t.join().unwrap();
    }

    #[test]
    fn stop_wins_over_changes_and_stays() {
        let wake = Wake::default();
        wake.notify();
        wake.stop();
        assert_eq!(wake.wait(Duration::from_secs(5)), Woken::Stop);
        assert_eq!(wake.wait(Duration::from_secs(5)), Woken::Stop);
    }
}
