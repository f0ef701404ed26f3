//! The verdict memo of filter and prioritize. For a fixed pod, a node's answer from the read
//! snapshot is a function of the node facts the decision reads, so nodes whose facts have
//! equal fingerprints (`cluster::snapshot::Fingerprint`) share one decision. Two levels:
//!
//! - **Within a request.** A GPU fleet is mostly alike nodes in a few occupancy states: over
//!   5,000 candidates a request then decides a few hundred times instead of 5,000.
//! - **Across requests of the same pod shape** ([`MemoCache`]). kube-scheduler places the
//!   replicas of a Job or Deployment one after the other, each asking the same of every node,
//!   and between two of them a bind changes one node. The memo of a shape (a 128-bit
//!   fingerprint of the pod's [`PodNeeds`](crate::scheduler::PodNeeds), which is all the decision
//!   reads of the pod) is kept for the next request of that shape, so on a fleet where no two
//!   nodes are alike the second replica on decides only the nodes that changed. A changed
//!   node has a new fingerprint and misses, so nothing is ever invalidated by hand.
//!
//! Below both, a decision for a new key of a pod whose devices must be NUMA-aligned with its
//! CPUs reuses the halves it shares with earlier nodes of the request (`scheduler::shared`).
//!
//! The key holds only the parts the decision reads: the device fingerprint when the pod asks
//! for devices, the CPU fingerprint when it needs CPU placement. So a GPU pod's verdicts are
//! shared by nodes whose CPUs differ.
//!
//! Lookups go first to the node's own slot (by its dense snapshot index: the key and answer
//! it had in the last request of the shape), then to the table of all keys. On a fleet of
//! distinct nodes the table holds one entry per node, and probing it at random cost more than
//! reading the slots in candidate order (library bench, warm, distinct nodes: 1.61–1.67× →
//! 1.34–1.47× of decode+encode). Slots are filled only once the table outgrows
//! [`SMALL_TABLE`] keys: a small table answers from cache as fast. A slot is only a hint of
//! where to look: it answers only a node whose key equals the one it stores, and the answer
//! is a function of the key, so a slot stays right even when a rebuild of the snapshot's name
//! map gives its index to another node (that node's key differs, or its answer is the same).
//!
//! Bounds: [`SHAPES`] shapes per verb, least recently used dropped; a shape's table is
//! emptied when it outgrows its limit (stale fingerprints of changed nodes pile up).
//! In debug builds every hit is decided again and compared, so every test that runs filter or
//! prioritize also checks that the key covers what the decision reads.
//!
//! What can interleave, and the test that covers it:
//! - a publish (sync event, bind) between two requests of one shape: the changed node's new
//!   fingerprint misses and is decided afresh
//!   (`gpu::verbs::a_filter_right_after_a_bind_sees_its_allocation` repeats one pod around a
//!   bind; every hit in a debug build is also decided again and compared, in every test);
//! - a publish during a request: the request reads the one snapshot it loaded, whose facts and
//!   fingerprints were published together, so what it remembers is true of those facts;
//! - two concurrent requests of one shape: each takes its own table, the larger is kept
//!   (`of_two_concurrent_requests_of_a_shape_the_larger_table_is_kept`);
//! - requests of different shapes: never share a table
//!   (`a_shape_remembers_answers_across_requests_and_shapes_do_not_mix`; a mutation that
//!   ignores the shape fails six integration tests through the debug check).
//!
//! This module owns the memo tables only: no placement logic, no I/O; its one lock is held
//! to take a table out and put it back, never while deciding.

use std::fmt::Debug;

use hashbrown::HashTable;
use parking_lot::Mutex;

use crate::cluster::snapshot::{Fingerprint, Found, NodeView};

/// Pod shapes whose memo a verb keeps between requests.
pub const SHAPES: usize = 4;

/// Up to this many keys a memo answers from its table alone, without per-node slots. Debug
/// builds (every test) always fill slots, so the slot path, the more intricate one, is what
/// the tests' small clusters exercise and check.
const SMALL_TABLE: usize = if cfg!(debug_assertions) {
    0
} else {
    RELEASE_SMALL_TABLE
};

/// [`SMALL_TABLE`] in release builds (what production runs).
const RELEASE_SMALL_TABLE: usize = 256;

/// A memo table: `(device key, CPU key)` to the answer.
type Table<V> = HashTable<((u128, u128), V)>;

/// Per node index of a snapshot's name map: the key and answer last seen at that index.
type ByIndex<V> = Vec<Option<((u128, u128), V)>>;

/// What of a node's CPU a decision reads, and so what of it the memo's key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuRead {
    /// Nothing: nodes that differ only in CPU share an answer.
    Nothing,
    /// The CPU facts (topology, cpusets held): their fingerprint.
    Facts,
    /// Only the free CPU (allocatable less requested, `NodeView::free_cpu_milli`), which no
    /// fingerprint covers: the amount itself (the fragmentation measure reads this alone).
    FreeMilli,
}

impl CpuRead {
    /// [`CpuRead::Facts`] when `reads_facts`, else [`CpuRead::Nothing`].
    pub fn facts_if(reads_facts: bool) -> Self {
        if reads_facts {
            CpuRead::Facts
        } else {
            CpuRead::Nothing
        }
    }
}

/// The memo of one request. `V`: the verdict (filter) or raw score (prioritize).
pub struct Memo<V> {
    /// The pod shape's fingerprint (the key in [`MemoCache`]).
    shape: u128,
    reads_devices: bool,
    reads_cpu: CpuRead,
    table: Table<V>,
    /// Looked at before `table`: a node whose key is unchanged since the last request of this
    /// shape is answered by reading its own slot (candidates mostly come in index order, so
    /// these reads are sequential), not by a random probe into a table of every node state.
    by_index: ByIndex<V>,
    lookups: u32,
    hits: u32,
    /// Nodes answered from the snapshot, memo or not (the metric's total).
    answered: u64,
    /// [`SMALL_TABLE`]; a test sets the release value in a debug build.
    small_table: usize,
}

/// The table's hash of a key: the fingerprints are already uniform, so their low bits do.
fn hash_of(key: &(u128, u128)) -> u64 {
    (key.0 ^ key.1) as u64
}

impl<V: Clone + PartialEq + Debug> Memo<V> {
    /// An empty memo for decisions that read the node's device facts (`reads_devices`) and/or
    /// its CPU (`reads_cpu`), for pods of shape `shape`.
    pub fn new(shape: u128, reads_devices: bool, reads_cpu: CpuRead) -> Self {
        Memo {
            shape,
            reads_devices,
            reads_cpu,
            table: HashTable::new(),
            by_index: Vec::new(),
            lookups: 0,
            hits: 0,
            answered: 0,
            small_table: SMALL_TABLE,
        }
    }

    /// This memo with another small-table threshold (tests: the release value in a debug
    /// build, so the table-only path is tested too).
    #[cfg(test)]
    fn with_small_table(mut self, small_table: usize) -> Self {
        self.small_table = small_table;
        self
    }

    /// The answer for a candidate: from the memo or `decide` when the snapshot holds it,
    /// `decide(None)` (an unknown node, never memoized) when not.
    pub fn answer<'s>(
        &mut self,
        node: Option<Found<'s>>,
        decide: impl Fn(Option<NodeView<'s>>) -> V,
    ) -> V {
        let Some(found) = node else {
            return decide(None);
        };
        self.answered += 1;
        let key = self.key_of(found.fingerprint(), found.free_cpu_milli());
        let i = found.index();
        if let Some(Some((known_key, known))) = self.by_index.get(i)
            && *known_key == key
        {
            let known = known.clone();
            return self.recalled(known, || decide(Some(found.view())));
        }
        let answer = self.by_key(key, || decide(Some(found.view())));
        // A small table stays in cache and answers as fast as a slot: filling slots would only
        // cost (a request over a periodic fleet would write every node's slot, every time).
        if self.table.len() > self.small_table {
            if self.by_index.len() <= i {
                self.by_index.resize_with(i + 1, || None);
            }
            self.by_index[i] = Some((key, answer.clone()));
        }
        answer
    }

    /// The answer for a node with fingerprint `fingerprint` and free CPU `free_cpu_milli`: a
    /// previous node's with the same key (in this request or an earlier one of the same
    /// shape), or `decide()`'s.
    pub fn get_or_decide(
        &mut self,
        fingerprint: Fingerprint,
        free_cpu_milli: Option<i64>,
        decide: impl FnOnce() -> V,
    ) -> V {
        self.by_key(self.key_of(fingerprint, free_cpu_milli), decide)
    }

    /// The parts of the node's facts the decision reads.
    fn key_of(&self, fingerprint: Fingerprint, free_cpu_milli: Option<i64>) -> (u128, u128) {
        (
            if self.reads_devices {
                fingerprint.devices
            } else {
                0
            },
            match self.reads_cpu {
                CpuRead::Nothing => 0,
                CpuRead::Facts => fingerprint.cpu,
                // One-to-one: an amount in the low 64 bits, unknown above them.
                CpuRead::FreeMilli => free_cpu_milli.map_or(u128::MAX, |m| u128::from(m as u64)),
            },
        )
    }

    fn by_key(&mut self, key: (u128, u128), decide: impl FnOnce() -> V) -> V {
        let hash = hash_of(&key);
        if let Some((_, known)) = self.table.find(hash, |(k, _)| *k == key) {
            let known = known.clone();
            return self.recalled(known, decide);
        }
        self.lookups += 1;
        let answer = decide();
        self.table
            .insert_unique(hash, (key, answer.clone()), hash_of_entry);
        answer
    }

    /// Counts a remembered answer, and in debug builds decides again and compares: every test
    /// that repeats a decision checks that the key covers what the decision reads.
    fn recalled(&mut self, known: V, decide: impl FnOnce() -> V) -> V {
        self.lookups += 1;
        self.hits += 1;
        if cfg!(debug_assertions) {
            assert_eq!(
                known,
                decide(),
                "nodes with equal fingerprints got different answers"
            );
        }
        known
    }

    /// `(lookups, hits)` in this request.
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

/// The memos one verb keeps between requests: the tables of its [`SHAPES`] most recent pod
/// shapes. A request takes its shape's table out ([`MemoCache::take`]) and gives it back when
/// done ([`MemoCache::give_back`]); two concurrent requests of one shape each get a table, and
/// the larger one is kept.
pub struct MemoCache<V> {
    /// Most recently used last.
    shapes: Mutex<Vec<Kept<V>>>,
}

/// A shape's memo between requests.
struct Kept<V> {
    shape: u128,
    table: Table<V>,
    by_index: ByIndex<V>,
}

impl<V> Kept<V> {
    fn bytes(&self) -> usize {
        self.table.allocation_size()
            + self.by_index.capacity() * std::mem::size_of::<Option<((u128, u128), V)>>()
    }
}

impl<V> Default for MemoCache<V> {
    fn default() -> Self {
        MemoCache {
            shapes: Mutex::new(Vec::with_capacity(SHAPES + 1)),
        }
    }
}

impl<V: Clone + PartialEq + Debug> MemoCache<V> {
    /// One request's use of the memo, the sequence both read verbs follow: the shape's memo
    /// taken, `f` answering every node through it, its hits and decisions counted for `verb`,
    /// then given back (kept unless its table outgrew `limit`) and the bytes kept reported.
    pub fn with_memo<R>(
        &self,
        (shape, reads_devices, reads_cpu): (u128, bool, CpuRead),
        limit: usize,
        metrics: &crate::metrics::Metrics,
        verb: &'static str,
        f: impl FnOnce(&mut Memo<V>) -> R,
    ) -> R {
        let mut memo = self.take(shape, reads_devices, reads_cpu);
        let out = f(&mut memo);
        memo.record(metrics, verb);
        let kept = self.give_back(memo, limit);
        metrics.set_memo_bytes(verb, kept);
        out
    }

    /// The memo for a request of shape `shape`: the shape's kept memo, or an empty one.
    pub fn take(&self, shape: u128, reads_devices: bool, reads_cpu: CpuRead) -> Memo<V> {
        let mut memo = Memo::new(shape, reads_devices, reads_cpu);
        let kept = {
            let mut shapes = self.shapes.lock();
            let i = shapes.iter().position(|k| k.shape == shape);
            i.map(|i| shapes.remove(i))
        };
        if let Some(kept) = kept {
            memo.table = kept.table;
            memo.by_index = kept.by_index;
        }
        memo
    }

    /// Keeps `memo` as its shape's, the most recently used, unless its table holds more than
    /// `limit` entries (then the shape starts empty next time). Returns the bytes the kept
    /// memos now hold ([`MemoCache::bytes`]).
    pub fn give_back(&self, memo: Memo<V>, limit: usize) -> usize {
        let mut shapes = self.shapes.lock();
        if memo.table.len() <= limit {
            let kept = Kept {
                shape: memo.shape,
                table: memo.table,
                by_index: memo.by_index,
            };
            let other = shapes
                .iter()
                .position(|k| k.shape == kept.shape)
                .map(|i| shapes.remove(i));
            // A concurrent request of the same shape may have given its memo back first.
            match other {
                Some(other) if other.table.len() > kept.table.len() => shapes.push(other),
                _ => shapes.push(kept),
            }
            if shapes.len() > SHAPES {
                shapes.remove(0);
            }
        }
        shapes.iter().map(Kept::bytes).sum()
    }

    /// The bytes the kept memos hold: their tables' and slots' allocations (an answer's own
    /// heap text, a rare owned rejection reason, not counted).
    pub fn bytes(&self) -> usize {
        self.shapes.lock().iter().map(Kept::bytes).sum()
    }

    /// Shapes kept (tests).
    pub fn shapes(&self) -> usize {
        self.shapes.lock().len()
    }

    /// Forgets every shape (benches measure a pod shape's first request with it).
    pub fn clear(&self) {
        self.shapes.lock().clear();
    }
}

/// The verbs' memo caches, shared by every request.
#[derive(Default)]
pub struct ReadMemos {
    pub filter: MemoCache<Option<Result<(), crate::placement::device::allocate::FitError>>>,
    pub prioritize: MemoCache<Option<i64>>,
    /// Prioritize's under the fragmentation strategy (`scheduler::fragment`): its own shapes,
    /// keyed by the workload mix too, so that a cpuset pod's two scores (the measure, and the
    /// usual score breaking its ties) do not evict each other.
    pub fragmentation: MemoCache<Option<i64>>,
}

impl ReadMemos {
    /// Forgets every shape of every verb.
    pub fn clear(&self) {
        self.filter.clear();
        self.prioritize.clear();
        self.fragmentation.clear();
    }
}

/// How many entries a shape's table may keep over a snapshot of `nodes` nodes: every node
/// twice over (changed nodes leave their old fingerprints behind), and some room on small
/// clusters.
pub fn table_limit(nodes: usize) -> usize {
    2 * nodes + 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(devices: u128, cpu: u128) -> Fingerprint {
        Fingerprint { devices, cpu }
    }

    #[test]
    fn equal_keys_share_a_decision_and_only_the_read_parts_count() {
        let mut memo = Memo::new(0, true, CpuRead::Nothing);
        let mut decided = 0;
        for cpu in 0..10u128 {
            let v = memo.get_or_decide(fp(7, cpu), None, || {
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
        assert_eq!(memo.get_or_decide(fp(8, 0), None, || 5), 5);
        assert_eq!(memo.stats(), (11, 9));
    }

    #[test]
    fn both_parts_are_the_key_when_both_are_read() {
        let mut memo = Memo::new(0, true, CpuRead::Facts);
        assert_eq!(memo.get_or_decide(fp(1, 2), None, || 1), 1);
        assert_eq!(memo.get_or_decide(fp(1, 3), None, || 2), 2);
        assert_eq!(memo.get_or_decide(fp(2, 2), None, || 3), 3);
        assert_eq!(memo.get_or_decide(fp(1, 2), None, || 1), 1);
        assert_eq!(memo.stats(), (4, 1));
    }

    /// Keyed by free CPU, nodes whose facts are equal but whose free CPU differs do not share
    /// an answer, nodes that differ only in CPU facts do, and an unknown free CPU is a key of
    /// its own (not the same as any amount).
    #[test]
    fn free_cpu_is_the_cpu_key_when_only_free_cpu_is_read() {
        let mut memo = Memo::new(0, true, CpuRead::FreeMilli);
        assert_eq!(memo.get_or_decide(fp(1, 2), Some(4000), || 1), 1);
        assert_eq!(memo.get_or_decide(fp(1, 3), Some(4000), || 1), 1);
        assert_eq!(memo.get_or_decide(fp(1, 2), Some(3000), || 2), 2);
        assert_eq!(memo.get_or_decide(fp(1, 2), None, || 3), 3);
        assert_eq!(memo.get_or_decide(fp(1, 2), Some(-1), || 4), 4);
        assert_eq!(memo.get_or_decide(fp(2, 2), Some(4000), || 5), 5);
        assert_eq!(memo.stats(), (6, 1));
    }

    #[test]
    fn a_shape_remembers_answers_across_requests_and_shapes_do_not_mix() {
        let cache = MemoCache::default();
        let mut first = cache.take(1, true, CpuRead::Facts);
        for i in 0..100u128 {
            assert_eq!(first.get_or_decide(fp(i, i), None, || i), i);
        }
        assert_eq!(first.stats(), (100, 0));
        cache.give_back(first, table_limit(100));
        // The same shape again: every node answered from the first request.
        let mut again = cache.take(1, true, CpuRead::Facts);
        for i in 0..100u128 {
            assert_eq!(again.get_or_decide(fp(i, i), None, || i), i);
        }
        assert_eq!(again.stats(), (100, 100));
        cache.give_back(again, table_limit(100));
        // Another shape starts empty: its answers are its own.
        let mut other = cache.take(2, true, CpuRead::Facts);
        assert_eq!(other.get_or_decide(fp(1, 1), None, || 7), 7);
        assert_eq!(other.stats(), (1, 0));
    }

    #[test]
    fn the_cache_keeps_the_most_recent_shapes_and_drops_oversized_tables() {
        let cache = MemoCache::default();
        for shape in 0..(SHAPES as u128 + 2) {
            let mut memo = cache.take(shape, true, CpuRead::Nothing);
            memo.get_or_decide(fp(shape, 0), None, || shape);
            cache.give_back(memo, 10);
        }
        assert_eq!(cache.shapes(), SHAPES);
        // The oldest shapes were dropped: shape 0 starts empty, the newest does not.
        assert_eq!(cache.take(0, true, CpuRead::Nothing).stats(), (0, 0));
        let newest_shape = SHAPES as u128 + 1;
        let mut newest = cache.take(newest_shape, true, CpuRead::Nothing);
        newest.get_or_decide(fp(newest_shape, 0), None, || newest_shape);
        assert_eq!(newest.stats(), (1, 1));
        // A table over the limit is not kept.
        let mut big = cache.take(99, true, CpuRead::Nothing);
        for i in 0..11u128 {
            big.get_or_decide(fp(i, 0), None, || i);
        }
        cache.give_back(big, 10);
        let mut fresh = cache.take(99, true, CpuRead::Nothing);
        fresh.get_or_decide(fp(0, 0), None, || 0);
        assert_eq!(fresh.stats(), (1, 0));
    }

    #[test]
    fn the_cache_reports_the_bytes_it_keeps() {
        let entry = std::mem::size_of::<((u128, u128), u128)>();
        let cache = MemoCache::default();
        assert_eq!(cache.bytes(), 0);
        let mut memo = cache.take(1, true, CpuRead::Nothing);
        for i in 0..100u128 {
            memo.get_or_decide(fp(i, 0), None, || i);
        }
        let kept = cache.give_back(memo, 1000);
        assert_eq!(kept, cache.bytes());
        // At least the 100 entries, at most what a doubling table (and its control bytes)
        // can hold for them.
        assert!(
            kept >= 100 * entry,
            "{kept} bytes for 100 entries of {entry}"
        );
        assert!(
            kept <= 256 * (entry + 1) + 64,
            "{kept} bytes for 100 entries of {entry}"
        );
        // A table dropped for its size is not counted.
        let mut big = cache.take(2, true, CpuRead::Nothing);
        for i in 0..20u128 {
            big.get_or_decide(fp(i, 0), None, || i);
        }
        assert_eq!(cache.give_back(big, 10), kept);
        cache.clear();
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn of_two_concurrent_requests_of_a_shape_the_larger_table_is_kept() {
        let cache = MemoCache::default();
        let mut a = cache.take(5, true, CpuRead::Nothing);
        let mut b = cache.take(5, true, CpuRead::Nothing);
        for i in 0..3u128 {
            a.get_or_decide(fp(i, 0), None, || i);
        }
        b.get_or_decide(fp(9, 0), None, || 9);
        cache.give_back(a, 100);
        cache.give_back(b, 100);
        let mut next = cache.take(5, true, CpuRead::Nothing);
        for i in 0..3u128 {
            next.get_or_decide(fp(i, 0), None, || i);
        }
        assert_eq!(next.stats(), (3, 3));
        assert_eq!(
            cache.shapes(),
            0,
            "the table is out while a request holds it"
        );
    }

    /// The release build's path: up to [`SMALL_TABLE`] keys the memo answers from its table
    /// alone and fills no per-node slot; past it, slots. Judged against the GPU count each
    /// node was given (not a re-decision), over two requests, at the release threshold and
    /// at the debug one.
    #[test]
    fn the_small_table_answers_alone_and_slots_start_past_it() {
        use crate::cluster::ClusterState;
        use crate::cluster::snapshot::DeviceView;
        use crate::model::device::{Device, DeviceType};

        let device = |gpus: u32| {
            let devices: Vec<_> = (0..gpus)
                .map(|m| {
                    serde_json::json!({"type": "gpu", "id": format!("GPU-{m}"), "minor": m,
                    "health": true, "resources": {"koordinator.sh/gpu-core": "100",
                    "koordinator.sh/gpu-memory": "80Gi", "koordinator.sh/gpu-memory-ratio": "100"}})
                })
                .collect();
            let d: Device = serde_json::from_value(
                serde_json::json!({"metadata": {"name": "n"}, "spec": {"devices": devices}}),
            )
            .expect("device");
            crate::cluster::devices::NodeDevices::from_device(&d).0
        };
        // 600 nodes: node i has 1 + i % kinds GPUs, so `kinds` distinct fingerprints.
        let gpus_of = |i: u32, kinds: u32| 1 + i % kinds;
        let decide = |view: Option<NodeView<'_>>| match view.map(|v| v.devices) {
            Some(DeviceView::Indexed(index)) => index
                .totals(&DeviceType::Gpu)
                .iter()
                .map(|g| u32::from(g.count))
                .sum::<u32>(),
            other => panic!("an indexed node: {other:?}"),
        };
        for (kinds, threshold, slots_expected) in [
            (40, RELEASE_SMALL_TABLE, false),
            (300, RELEASE_SMALL_TABLE, true),
            (40, 0, true),
        ] {
            let cluster = ClusterState::new();
            cluster.build_snapshot();
            for i in 0..600u32 {
                cluster.set_devices(&format!("n{i:04}"), Some(device(gpus_of(i, kinds))));
            }
            let snapshot = cluster.read_snapshot();
            let cache = MemoCache::default();
            for request in 0..2 {
                let mut memo = cache
                    .take(1, true, CpuRead::Nothing)
                    .with_small_table(threshold);
                let mut finder = snapshot.finder();
                for i in 0..600u32 {
                    let found = finder.find(&format!("n{i:04}"));
                    assert_eq!(
                        memo.answer(found, decide),
                        gpus_of(i, kinds),
                        "kinds {kinds} threshold {threshold} request {request} node {i}"
                    );
                }
                assert_eq!(
                    !memo.by_index.is_empty(),
                    slots_expected,
                    "kinds {kinds} threshold {threshold}: slots {}",
                    memo.by_index.len()
                );
                let (lookups, hits) = memo.stats();
                assert_eq!(lookups, 600);
                // The first request decides each fingerprint once; the second none.
                let first_hits = 600 - kinds;
                assert_eq!(hits, if request == 0 { first_hits } else { 600 });
                cache.give_back(memo, table_limit(600));
            }
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "equal fingerprints")]
    fn debug_builds_catch_a_key_that_misses_what_the_decision_reads() {
        let mut memo = Memo::new(0, true, CpuRead::Nothing);
        memo.get_or_decide(fp(1, 1), None, || 1);
        memo.get_or_decide(fp(1, 2), None, || 2);
    }
}
