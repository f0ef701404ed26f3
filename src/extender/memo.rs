//! The per-request memo of filter and prioritize: within one request the pod is fixed, so a
//! node's answer from the read snapshot is a function of the node facts the decision reads,
//! and nodes whose facts have equal fingerprints (`cluster::snapshot::Fingerprint`) share one
//! decision. A GPU fleet is mostly alike nodes in a few occupancy states: over 5,000
//! candidates a request then decides a few hundred times instead of 5,000.
//!
//! The key holds only the parts the decision reads: the device fingerprint when the pod asks
//! for devices, the CPU fingerprint when it needs CPU placement. So a GPU pod's verdicts are
//! shared by nodes whose CPUs differ.
//!
//! It gives up when the nodes are mostly distinct (fewer than one hit in eight after the
//! first [`PROBATION`] lookups): the worst case costs those probes and inserts, then nothing.
//! In debug builds every hit is decided again and compared, so every test that runs filter or
//! prioritize also checks that the key covers what the decision reads.
//!
//! This module owns the memo table only: no placement logic, no locks, no I/O.

use std::fmt::Debug;

use hashbrown::HashTable;

use crate::cluster::snapshot::{Fingerprint, Found, NodeView};

/// Lookups before the memo judges its hit rate.
pub const PROBATION: u32 = 1024;

/// The memo of one request. `V`: the verdict (filter) or raw score (prioritize).
pub struct Memo<V> {
    reads_devices: bool,
    reads_cpu: bool,
    table: HashTable<((u128, u128), V)>,
    lookups: u32,
    hits: u32,
    enabled: bool,
    /// Nodes answered from the snapshot, memo or not (the metric's total).
    answered: u64,
}

/// The table's hash of a key: the fingerprints are already uniform, so their low bits do.
fn hash_of(key: &(u128, u128)) -> u64 {
    (key.0 ^ key.1) as u64
}

impl<V: Clone + PartialEq + Debug> Memo<V> {
    /// A memo for decisions that read the node's device facts (`reads_devices`) and/or its CPU
    /// facts (`reads_cpu`).
    pub fn new(reads_devices: bool, reads_cpu: bool) -> Self {
        Memo {
            reads_devices,
            reads_cpu,
            table: HashTable::new(),
            lookups: 0,
            hits: 0,
            enabled: true,
            answered: 0,
        }
    }

    /// The answer for a candidate: from the memo or `decide` when the snapshot holds it,
    /// `decide(None)` (an unknown node, never memoized) when not.
    pub fn answer<'s>(
        &mut self,
        node: Option<Found<'s>>,
        decide: impl Fn(Option<NodeView<'s>>) -> V,
    ) -> V {
        match node {
            Some(found) => {
                self.answered += 1;
                self.get_or_decide(found.fingerprint(), || decide(Some(found.view())))
            }
            None => decide(None),
        }
    }

    /// The answer for a node with fingerprint `fingerprint`: a previous node's with the same
    /// key, or `decide()`'s.
    pub fn get_or_decide(&mut self, fingerprint: Fingerprint, decide: impl FnOnce() -> V) -> V {
        if !self.enabled {
            return decide();
        }
        let key = (
            if self.reads_devices {
                fingerprint.devices
            } else {
                0
            },
            if self.reads_cpu { fingerprint.cpu } else { 0 },
        );
        let hash = hash_of(&key);
        self.lookups += 1;
        if let Some((_, known)) = self.table.find(hash, |(k, _)| *k == key) {
            self.hits += 1;
            let known = known.clone();
            if cfg!(debug_assertions) {
                assert_eq!(
                    known,
                    decide(),
                    "nodes with equal fingerprints got different answers"
                );
            }
            return known;
        }
        let answer = decide();
        if self.lookups >= PROBATION && self.hits < self.lookups / 8 {
            // Mostly distinct nodes: stop paying for probes and inserts.
            self.enabled = false;
            self.table = HashTable::new();
            return answer;
        }
        self.table
            .insert_unique(hash, (key, answer.clone()), hash_of_entry);
        answer
    }

    /// `(lookups, hits)` so far, counting only while the memo is on.
    pub fn stats(&self) -> (u32, u32) {
        (self.lookups, self.hits)
    }

    /// Adds this request's answers from the snapshot to `dne_read_decisions_total{verb}`,
    /// split into decided and memo hits.
    pub fn record(&self, metrics: &crate::metrics::Metrics, verb: &str) {
        let hits = u64::from(self.hits);
        let counter = |how: &str| metrics.read_decisions.with_label_values(&[verb, how]);
        counter("memo").inc_by(hits);
        counter("decided").inc_by(self.answered - hits);
    }
}

fn hash_of_entry<V>(entry: &((u128, u128), V)) -> u64 {
    hash_of(&entry.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(devices: u128, cpu: u128) -> Fingerprint {
        Fingerprint { devices, cpu }
    }

    #[test]
    fn equal_keys_share_a_decision_and_only_the_read_parts_count() {
        let mut memo = Memo::new(true, false);
        let mut decided = 0;
        for cpu in 0..10u128 {
            let v = memo.get_or_decide(fp(7, cpu), || {
                decided += 1;
                42
            });
            assert_eq!(v, 42);
        }
        // Debug builds decide again on every hit to check the memo; count the misses only.
        let expected = if cfg!(debug_assertions) { 10 } else { 1 };
        assert_eq!(decided, expected);
        assert_eq!(memo.stats(), (10, 9));
        // A different device fingerprint is a different key.
        assert_eq!(memo.get_or_decide(fp(8, 0), || 5), 5);
        assert_eq!(memo.stats(), (11, 9));
    }

    #[test]
    fn both_parts_are_the_key_when_both_are_read() {
        let mut memo = Memo::new(true, true);
        assert_eq!(memo.get_or_decide(fp(1, 2), || 1), 1);
        assert_eq!(memo.get_or_decide(fp(1, 3), || 2), 2);
        assert_eq!(memo.get_or_decide(fp(2, 2), || 3), 3);
        assert_eq!(memo.get_or_decide(fp(1, 2), || 1), 1);
        assert_eq!(memo.stats(), (4, 1));
    }

    #[test]
    fn distinct_nodes_switch_the_memo_off_after_probation() {
        let mut memo = Memo::new(true, true);
        for i in 0..u128::from(PROBATION) + 10 {
            assert_eq!(memo.get_or_decide(fp(i, i), || i), i);
        }
        // Off after PROBATION lookups: later calls are not counted, and answers stay right.
        assert_eq!(memo.stats(), (PROBATION, 0));
        assert_eq!(memo.get_or_decide(fp(3, 3), || 99), 99);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "equal fingerprints")]
    fn debug_builds_catch_a_key_that_misses_what_the_decision_reads() {
        let mut memo = Memo::new(true, false);
        memo.get_or_decide(fp(1, 1), || 1);
        memo.get_or_decide(fp(1, 2), || 2);
    }
}
