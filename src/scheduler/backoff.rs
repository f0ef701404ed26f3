//! Per-key backoff for the leader's level-triggered writers (the DeviceTaintRule of each DRA
//! pool, the GPU share totals of each Node): a key whose write failed is not tried again
//! until its wait has passed; each failure in a row doubles the wait, from the writer's tick up
//! to [`MAX_WAIT`]; a success, or the key leaving the plan, forgets it.
//!
//! Why: a writer that plans every tick from the caches retries every failed write every tick.
//! Forty Nodes answering 403 were 155 patches every 8 s, steady (trust IV §7). The requeue
//! signal already doubles its wait up to 30 s; these writers now do too, per key, so one
//! refused node or pool does not slow the others.
//!
//! Hand-written (30 lines): `backon` and kube's watcher backoff drive one retry loop, not a
//! schedule over many keys. Pure: instants in, decisions out; no I/O, no clock of its own.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// The longest wait between two attempts at one key (the requeue signal's too).
pub const MAX_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct KeyedBackoff<K> {
    base: Duration,
    /// Per failing key: when it may be tried again, and its failures in a row.
    keys: HashMap<K, (Instant, u32)>,
}

impl<K: Hash + Eq + Clone> KeyedBackoff<K> {
    /// `base`: the wait after the first failure (the writer's tick).
    pub fn new(base: Duration) -> Self {
        KeyedBackoff {
            base,
            keys: HashMap::new(),
        }
    }

    /// Whether `key` may be written at `now`.
    pub fn ready(&self, key: &K, now: Instant) -> bool {
        self.keys.get(key).is_none_or(|(at, _)| *at <= now)
    }

    /// `key`'s write failed at `now`: returns how long it waits.
    pub fn failed(&mut self, key: K, now: Instant) -> Duration {
        let failures = self.keys.get(&key).map_or(0, |(_, n)| *n);
        let wait = self
            .base
            .saturating_mul(1u32 << failures.min(16))
            .min(MAX_WAIT.max(self.base));
        self.keys
            .insert(key, (now + wait, failures.saturating_add(1)));
        wait
    }

    /// `key`'s write landed: it is tried at once next time.
    pub fn succeeded(&mut self, key: &K) {
        self.keys.remove(key);
    }

    /// Forgets the keys the plan no longer holds.
    pub fn retain(&mut self, mut planned: impl FnMut(&K) -> bool) {
        self.keys.retain(|k, _| planned(k));
    }

    /// Keys backing off now (the writers' gauges).
    pub fn waiting(&self, now: Instant) -> usize {
        self.keys.values().filter(|(at, _)| *at > now).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_in_a_row_doubles_the_wait_up_to_the_cap_and_a_success_forgets() {
        let base = Duration::from_secs(1);
        let mut b = KeyedBackoff::new(base);
        let t0 = Instant::now();
        assert!(b.ready(&"n1", t0));
        let waits: Vec<u64> = (0..8)
            .map(|i| b.failed("n1", t0 + Duration::from_secs(i)).as_secs())
            .collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 30, 30, 30]);
        let last = t0 + Duration::from_secs(7);
        assert!(!b.ready(&"n1", last + Duration::from_secs(29)));
        assert!(b.ready(&"n1", last + Duration::from_secs(30)));
        // Another key is not held back by n1.
        assert!(b.ready(&"n2", last));
        assert_eq!(b.waiting(last), 1);
        b.succeeded(&"n1");
        assert!(b.ready(&"n1", last));
        assert_eq!(b.failed("n1", last), base, "back to the first wait");
        b.retain(|k| *k != "n1");
        assert_eq!(b.waiting(last), 0);
    }

    #[test]
    fn a_tick_longer_than_the_cap_is_the_wait() {
        let mut b = KeyedBackoff::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(b.failed(1, t0), Duration::from_secs(60));
        assert_eq!(b.failed(1, t0), Duration::from_secs(60));
    }
}
