//! The read snapshot: one immutable, cluster-wide view of what filter and prioritize need of
//! every node, so a request over 5,000 candidate nodes takes no per-node lock, clones no
//! `Arc` and allocates nothing per node.
//!
//! Layout: node names are interned to dense indices (one hash map from name to index, shared
//! by every snapshot until the node set changes); per node, fixed-size facts (device
//! [`DeviceFacts`], CPU [`CpuFacts`]) sit in contiguous arrays, [`CHUNK`] nodes to a chunk, and a
//! chunk's device groups sit in one vector that [`DeviceIndexRef`] slices.
//!
//! Publishing: writers change the authoritative per-node state under the node's write lock
//! (`state.rs`), then, still under it, publish that node's new facts here: copy-on-write of
//! the one chunk that holds it, swapped in with `arc-swap` (readers never wait; a reader keeps
//! the snapshot it loaded). Why arc-swap rather than an epoch scheme: readers hold a snapshot
//! for one request and writers publish a few times per bind or pod event, so a reference
//! count per request and a copied chunk (~40 KiB) per publish are cheap, and nothing has to
//! be reclaimed by hand; the crate is already in the dependency graph (axum-server).
//! Publishes are serialized by one mutex, taken under a node lock and never the other way
//! round. Every publish carries the node's version (a cluster-wide counter bumped under the
//! node lock), and a publish older than what the snapshot holds is dropped, so the snapshot
//! converges to the latest state of every node whatever the order in which publishes reach
//! the mutex.
//!
//! Bind keeps deciding under the node write lock against the authoritative ledgers: the
//! snapshot is only a read view. Since bind publishes before it answers, a filter that starts
//! after a bind returned sees that bind.
//!
//! What can interleave, and the test that covers it:
//! - a reader and a publish: the reader keeps the snapshot it loaded, at most one publish
//!   behind (arc-swap);
//! - two writers on one node: serialized by the node lock, published in version order
//!   (`snapshot_converges_under_concurrent_writers_and_build`);
//! - writers on different nodes: serialized by the publish mutex, none lost (same test);
//! - the full build and writers: versions, the later wins, for changed, removed and
//!   compacted-away nodes (`a_build_older_than_a_publish_never_overwrites_it`, deterministic:
//!   it fails when the build ignores versions or tombstones; the concurrent test too);
//! - writes before the snapshot is live, then the build
//!   (`snapshot_equals_a_rebuild_after_any_sequence`, the build anywhere in the sequence);
//! - a node removed (entry collected), compacted away, created again
//!   (`removed_nodes_are_compacted_and_can_return`, and the sequence property);
//! - a bind, then a filter (`gpu::verbs::a_filter_right_after_a_bind_sees_its_allocation`);
//! - relists and watch gaps after bootstrap, through the real sync path
//!   (`sync_prop::cache_after_any_history_equals_a_fresh_bootstrap` checks the snapshot too).
//!
//! This module owns the layout and the publish protocol. It never locks a node and never
//! decides placement.

mod facts;
mod layout;
#[cfg(test)]
mod tests;

pub use facts::*;
pub use layout::{CHUNK, Finder, Found};
use layout::{Chunk, Names};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::{ArcSwap, Guard};
use parking_lot::Mutex;

/// One immutable, cluster-wide read view.
#[derive(Debug, Default)]
pub struct Snapshot {
    names: Arc<Names>,
    chunks: Vec<Arc<Chunk>>,
    /// Positions whose node was removed (the name keeps its index until compaction).
    removed: usize,
}

impl Snapshot {
    /// The node called `name`, if the caches know it.
    #[inline]
    pub fn node(&self, name: &str) -> Option<NodeView<'_>> {
        self.find(name).map(|found| found.view())
    }

    /// The node called `name`, if the caches know it, before its view is built.
    #[inline]
    pub fn find(&self, name: &str) -> Option<Found<'_>> {
        self.found_at(self.names.get(name)? as usize)
    }

    /// A resolver for a request's candidate names, taken in the request's order.
    pub fn finder(&self) -> Finder<'_> {
        Finder {
            snapshot: self,
            next: 0,
            misses: 0,
        }
    }

    #[inline]
    fn found_at(&self, i: usize) -> Option<Found<'_>> {
        let (chunk, pos) = (&*self.chunks[i / CHUNK], i % CHUNK);
        (chunk.present & (1 << pos) != 0).then_some(Found {
            chunk,
            pos,
            index: i,
        })
    }

    /// The owned facts of `name` (tests compare them with a rebuild).
    pub fn summary(&self, name: &str) -> Option<NodeSummary> {
        let i = self.names.get(name)? as usize;
        self.summary_at(i)
    }

    /// How many nodes the snapshot holds.
    pub fn len(&self) -> usize {
        self.names.len() - self.removed
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn version_of(&self, i: usize) -> u64 {
        self.chunks[i / CHUNK].nodes[i % CHUNK].version
    }

    fn summary_at(&self, i: usize) -> Option<NodeSummary> {
        self.chunks[i / CHUNK].summary(i % CHUNK)
    }

    /// A snapshot of exactly `nodes` (name, version, facts), indices in the given order.
    fn from_nodes(nodes: Vec<(Arc<str>, u64, NodeSummary)>) -> Snapshot {
        let mut names = Names::default();
        let mut chunks = Vec::with_capacity(nodes.len().div_ceil(CHUNK));
        let mut chunk = Chunk::new();
        for (i, (name, version, summary)) in nodes.into_iter().enumerate() {
            debug_assert_eq!(names.len(), i);
            names.push(name);
            chunk.push(
                version,
                Some((
                    &summary.devices,
                    &summary.slots,
                    &summary.sums,
                    &summary.partitions,
                    summary.dra_served,
                    &summary.cpu,
                    summary.fingerprint,
                    summary.free_cpu_milli,
                )),
            );
            if chunk.nodes.len() == CHUNK {
                chunks.push(Arc::new(std::mem::replace(&mut chunk, Chunk::new())));
            }
        }
        if !chunk.nodes.is_empty() {
            while chunk.nodes.len() < CHUNK {
                chunk.push(0, None);
            }
            chunks.push(Arc::new(chunk));
        }
        Snapshot {
            names: Arc::new(names),
            chunks,
            removed: 0,
        }
    }

    /// Every present node, with its version, in index order.
    fn present(&self) -> Vec<(Arc<str>, u64, NodeSummary)> {
        self.names
            .names
            .iter()
            .enumerate()
            .filter_map(|(i, name)| {
                self.summary_at(i)
                    .map(|s| (name.clone(), self.version_of(i), s))
            })
            .collect()
    }
}

/// The published snapshot and its writers' protocol.
#[derive(Debug, Default)]
pub struct ReadSnapshots {
    current: ArcSwap<Snapshot>,
    /// Serializes publishes (taken under a node lock; never the other way round).
    publish: Mutex<Tombstones>,
    /// Writers publish once this is set (`ClusterState::build_snapshot` sets it first).
    live: AtomicBool,
    /// The first full build is installed: readers may read.
    built: AtomicBool,
    /// One full build at a time; readers that find no build wait on it.
    build: Mutex<()>,
}

/// The removal versions of the names a compaction dropped, kept only until the full build is
/// installed: that build's readings may be older than such a removal and must not bring the
/// node back. Every other publish of a node arrives in version order (each is made under the
/// node's lock), so after the build nothing needs them.
#[derive(Debug, Default)]
struct Tombstones {
    installed: bool,
    versions: HashMap<Arc<str>, u64, ahash::RandomState>,
}

impl ReadSnapshots {
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::SeqCst)
    }

    pub fn is_built(&self) -> bool {
        self.built.load(Ordering::Acquire)
    }

    pub fn load(&self) -> Guard<Arc<Snapshot>> {
        self.current.load()
    }

    /// Publishes `name`'s facts at `version` (`None`: the node is gone). Dropped when the
    /// snapshot already holds a later version; no new snapshot when nothing changed.
    /// `changed(before, after)` runs when a present node's facts change (`before`: `None` for
    /// a node that was absent), under the publish lock: `super::returns` judges it.
    pub fn publish<R: Default>(
        &self,
        name: &str,
        version: u64,
        summary: Option<NodeSummary>,
        changed: impl FnOnce(Option<&NodeSummary>, &NodeSummary) -> R,
    ) -> R {
        let mut tombstones = self.publish.lock();
        let cur = self.current.load_full();
        let Some(i) = cur.names.get(name) else {
            let Some(summary) = summary else {
                return R::default();
            };
            if tombstones.versions.get(name).is_some_and(|&v| v >= version) {
                return R::default();
            }
            tombstones.versions.remove(name);
            let returned = changed(None, &summary);
            self.current
                .store(Arc::new(appended(&cur, name, version, summary)));
            return returned;
        };
        let i = i as usize;
        if cur.version_of(i) >= version {
            return R::default();
        }
        let (chunk, pos) = (i / CHUNK, i % CHUNK);
        let was_present = cur.chunks[chunk].nodes[pos].devices.is_some();
        if summary.is_none() && !was_present {
            return R::default();
        }
        // Unchanged facts (most pod updates): keep the snapshot. Safe without the new
        // version: one node's publishes arrive in version order (each under the node's
        // lock), and the one full build merges only facts read after this node's last
        // unpublished change.
        let before = cur.summary_at(i);
        if summary.is_some() && before == summary {
            return R::default();
        }
        let returned = summary
            .as_ref()
            .map_or_else(R::default, |s| changed(before.as_ref(), s));
        let mut chunks = cur.chunks.clone();
        chunks[chunk] = Arc::new(cur.chunks[chunk].replaced(pos, version, summary.as_ref()));
        // A name whose position holds nothing was removed before (appends fill their slot).
        let removed = match (was_present, summary.is_some()) {
            (true, false) => cur.removed + 1,
            (false, true) => cur.removed - 1,
            _ => cur.removed,
        };
        let next = Snapshot {
            names: cur.names.clone(),
            chunks,
            removed,
        };
        // Many removed names (node churn): rebuild the name map without them.
        let next = if next.removed > CHUNK.max(next.names.len() / 4) {
            tombstones.remember_removed(&next);
            Snapshot::from_nodes(next.present())
        } else {
            next
        };
        self.current.store(Arc::new(next));
        returned
    }

    /// Installs a full build (`nodes`, read under each node's lock after `live` was set),
    /// keeping whatever writers published meanwhile with a later version.
    pub fn install(&self, nodes: Vec<(Arc<str>, u64, NodeSummary)>) {
        let mut tombstones = self.publish.lock();
        let cur = self.current.load_full();
        let mut merged: HashMap<Arc<str>, (u64, Option<NodeSummary>), ahash::RandomState> =
            HashMap::default();
        for (i, name) in cur.names.names.iter().enumerate() {
            merged.insert(name.clone(), (cur.version_of(i), cur.summary_at(i)));
        }
        tombstones.installed = true;
        for (name, version) in tombstones.versions.drain() {
            merged.insert(name, (version, None));
        }
        for (name, version, summary) in nodes {
            match merged.get(&name) {
                Some((v, _)) if *v >= version => {}
                _ => {
                    merged.insert(name, (version, Some(summary)));
                }
            }
        }
        let mut present: Vec<(Arc<str>, u64, NodeSummary)> = merged
            .into_iter()
            .filter_map(|(name, (v, s))| s.map(|s| (name, v, s)))
            .collect();
        // Name order: candidates usually arrive in node-list order, which this follows.
        present.sort_by(|a, b| a.0.cmp(&b.0));
        self.current.store(Arc::new(Snapshot::from_nodes(present)));
    }

    /// Marks the snapshot live (writers publish from now on); the caller then builds.
    pub fn start_build(&self) -> Option<parking_lot::MutexGuard<'_, ()>> {
        let guard = self.build.lock();
        if self.is_built() {
            return None;
        }
        self.live.store(true, Ordering::SeqCst);
        Some(guard)
    }

    pub fn finish_build(&self, _guard: parking_lot::MutexGuard<'_, ()>) {
        self.built.store(true, Ordering::Release);
    }
}

impl Tombstones {
    /// Keeps the removal versions of the names a compaction drops (until the build).
    fn remember_removed(&mut self, snap: &Snapshot) {
        if self.installed {
            return;
        }
        for (i, name) in snap.names.names.iter().enumerate() {
            let slot = &snap.chunks[i / CHUNK].nodes[i % CHUNK];
            if slot.devices.is_none() {
                self.versions.insert(name.clone(), slot.version);
            }
        }
    }
}

/// `cur` with `name` appended at the next index.
fn appended(cur: &Snapshot, name: &str, version: u64, summary: NodeSummary) -> Snapshot {
    let mut names = (*cur.names).clone();
    let i = names.push(Arc::from(name)) as usize;
    let mut chunks = cur.chunks.clone();
    if i.is_multiple_of(CHUNK) {
        chunks.push(Arc::new(Chunk::empty()));
    }
    let last = chunks.len() - 1;
    chunks[last] = Arc::new(chunks[last].replaced(i % CHUNK, version, Some(&summary)));
    Snapshot {
        names: Arc::new(names),
        chunks,
        removed: cur.removed,
    }
}
