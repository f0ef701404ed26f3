//! How a snapshot lays nodes out: [`CHUNK`] consecutive nodes to a chunk, structure of arrays
//! ([`Chunk`]), node names interned to dense indices ([`Names`]) and resolved in request order
//! ([`Finder`]); a node found in a snapshot ([`Found`]).

use std::sync::Arc;

use crate::model::resource_names::ResourceNameSet;

use super::Snapshot;
use super::facts::*;
use crate::placement::device::index::{NodeSums, SlotGroup};

/// Nodes per chunk: the unit a publish copies.
pub const CHUNK: usize = 32;
// A chunk's presence bits are one `u32`.
const _: () = assert!(CHUNK <= u32::BITS as usize);

/// A node found in a snapshot: its fingerprint costs one load, its view is built on demand
/// (the verbs' memo answers most nodes from the fingerprint alone).
#[derive(Clone, Copy, Debug)]
pub struct Found<'a> {
    pub(super) chunk: &'a Chunk,
    pub(super) pos: usize,
    pub(super) index: usize,
}

impl<'a> Found<'a> {
    /// The node's dense index in the snapshot's name map (a rebuild of the map, after node
    /// churn, may give it to another node).
    #[inline]
    pub fn index(&self) -> usize {
        self.index
    }

    #[inline]
    pub fn fingerprint(&self) -> Fingerprint {
        self.chunk.fingerprints[self.pos]
    }

    /// [`NodeView::free_cpu_milli`], without building the view.
    #[inline]
    pub fn free_cpu_milli(&self) -> Option<i64> {
        self.chunk.nodes[self.pos].free_cpu_milli
    }

    #[inline]
    pub fn view(&self) -> NodeView<'a> {
        self.chunk
            .view(self.pos)
            .expect("found only where the chunk holds a node")
    }
}

/// One node's place in a chunk: what every read of the node touches first, kept small so
/// the nodes of a chunk share cache lines (CPU facts and score sums live in their own
/// arrays, read only by the pods that need them).
#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    /// The version of the state these facts were built from (0: never published).
    pub(super) version: u64,
    /// `None`: no such node (removed, or a position not yet used).
    pub(super) devices: Option<DeviceFacts>,
    /// `(start, len)` of this node's device groups in the chunk's `slots`; the ranges in its
    /// `DeviceFacts` are relative to `start`.
    pub(super) slots: (u32, u32),
    /// The managed names kube-scheduler serves through DRA here.
    pub(super) dra_served: ResourceNameSet,
    /// [`NodeSummary::free_cpu_milli`].
    pub(super) free_cpu_milli: Option<i64>,
}

/// One node's published facts, borrowed, as a chunk stores them: devices, device groups,
/// score sums, partition facts, CPU facts, fingerprint, free CPU.
pub(super) type SlotFacts<'a> = (
    &'a DeviceFacts,
    &'a [SlotGroup],
    &'a NodeSums,
    &'a Option<Arc<PartitionFacts>>,
    ResourceNameSet,
    &'a CpuFacts,
    Fingerprint,
    Option<i64>,
);

/// [`CHUNK`] consecutive nodes, structure of arrays.
#[derive(Clone, Debug)]
pub(super) struct Chunk {
    /// Bit `pos` set: a node is at `pos` (`nodes[pos].devices` is `Some`). A lookup answered
    /// by the verbs' memo reads this and the fingerprint, and no `Slot`.
    pub(super) present: u32,
    pub(super) nodes: Vec<Slot>,
    /// Per position; a placeholder where `nodes` has none (`Slot::devices` alone says whether
    /// a node is there, so a lookup reads no ~1 KiB CPU entry it does not need).
    pub(super) cpus: Vec<CpuFacts>,
    /// Per position (zero where absent).
    pub(super) sums: Vec<NodeSums>,
    /// Per position (zero where absent).
    pub(super) fingerprints: Vec<Fingerprint>,
    /// Per position: the partition facts of nodes that honour GPU partitions.
    pub(super) partitions: Vec<Option<Arc<PartitionFacts>>>,
    /// Every node's device groups, node after node.
    pub(super) slots: Vec<SlotGroup>,
}

impl Chunk {
    pub(super) fn new() -> Self {
        Chunk {
            present: 0,
            nodes: Vec::with_capacity(CHUNK),
            cpus: Vec::with_capacity(CHUNK),
            sums: Vec::with_capacity(CHUNK),
            fingerprints: Vec::with_capacity(CHUNK),
            partitions: Vec::with_capacity(CHUNK),
            slots: Vec::new(),
        }
    }

    pub(super) fn empty() -> Self {
        let mut chunk = Chunk::new();
        while chunk.nodes.len() < CHUNK {
            chunk.push(0, None);
        }
        chunk
    }

    pub(super) fn node_slots(&self, slot: &Slot) -> &[SlotGroup] {
        let (start, len) = (slot.slots.0 as usize, slot.slots.1 as usize);
        &self.slots[start..start + len]
    }

    #[inline]
    pub(super) fn view(&self, pos: usize) -> Option<NodeView<'_>> {
        let slot = &self.nodes[pos];
        let devices = slot.devices.as_ref()?;
        Some(NodeView {
            devices: device_view(devices, self.node_slots(slot), &self.sums[pos]),
            honors_partitions: devices.honors_partitions(),
            partitions: self.partitions[pos].as_deref(),
            cpu: &self.cpus[pos],
            dra_served: slot.dra_served,
            fingerprint: self.fingerprints[pos],
            free_cpu_milli: slot.free_cpu_milli,
        })
    }

    /// The owned summary at `pos`.
    pub(super) fn summary(&self, pos: usize) -> Option<NodeSummary> {
        let slot = &self.nodes[pos];
        Some(NodeSummary {
            devices: slot.devices?,
            slots: self.node_slots(slot).to_vec(),
            sums: self.sums[pos],
            partitions: self.partitions[pos].clone(),
            cpu: self.cpus[pos].clone(),
            dra_served: slot.dra_served,
            fingerprint: self.fingerprints[pos],
            free_cpu_milli: slot.free_cpu_milli,
        })
    }

    /// This chunk with position `pos` replaced.
    pub(super) fn replaced(
        &self,
        pos: usize,
        version: u64,
        summary: Option<&NodeSummary>,
    ) -> Chunk {
        let mut out = Chunk {
            present: 0,
            nodes: Vec::with_capacity(CHUNK),
            cpus: Vec::with_capacity(CHUNK),
            sums: Vec::with_capacity(CHUNK),
            fingerprints: Vec::with_capacity(CHUNK),
            partitions: Vec::with_capacity(CHUNK),
            slots: Vec::with_capacity(self.slots.len() + summary.map_or(0, |s| s.slots.len())),
        };
        for (p, old) in self.nodes.iter().enumerate() {
            if p == pos {
                out.push(
                    version,
                    summary.map(|s| {
                        (
                            &s.devices,
                            &s.slots[..],
                            &s.sums,
                            &s.partitions,
                            s.dra_served,
                            &s.cpu,
                            s.fingerprint,
                            s.free_cpu_milli,
                        )
                    }),
                );
            } else {
                let facts = match (&old.devices, &self.cpus[p]) {
                    (Some(d), c) => Some((
                        d,
                        self.node_slots(old),
                        &self.sums[p],
                        &self.partitions[p],
                        old.dra_served,
                        c,
                        self.fingerprints[p],
                        old.free_cpu_milli,
                    )),
                    _ => None,
                };
                out.push(old.version, facts);
            }
        }
        out
    }

    pub(super) fn push(&mut self, version: u64, facts: Option<SlotFacts<'_>>) {
        let start = self.slots.len() as u32;
        match facts {
            None => {
                self.nodes.push(Slot {
                    version,
                    devices: None,
                    slots: (start, 0),
                    dra_served: ResourceNameSet::default(),
                    free_cpu_milli: None,
                });
                self.cpus.push(CpuFacts::absent());
                self.sums.push(NodeSums::default());
                self.fingerprints.push(Fingerprint::default());
                self.partitions.push(None);
            }
            Some((d, slots, sums, partitions, dra_served, c, fingerprint, free_cpu_milli)) => {
                self.present |= 1 << self.nodes.len();
                self.slots.extend_from_slice(slots);
                self.nodes.push(Slot {
                    version,
                    devices: Some(*d),
                    slots: (start, slots.len() as u32),
                    dra_served,
                    free_cpu_milli,
                });
                self.cpus.push(c.clone());
                self.sums.push(*sums);
                self.fingerprints.push(fingerprint);
                self.partitions.push(partitions.clone());
            }
        }
    }
}

/// Name to dense index, shared by snapshots until the node set changes. The table holds only
/// indices (4 bytes a bucket) and the names sit in one arena, so a lookup's probes stay in a
/// few dozen KiB of cache instead of chasing one heap key per candidate.
#[derive(Clone, Debug, Default)]
pub(super) struct Names {
    pub(super) hasher: ahash::RandomState,
    pub(super) table: hashbrown::HashTable<u32>,
    pub(super) arena: String,
    /// `(offset, len)` in `arena` per index.
    pub(super) spans: Vec<(u32, u32)>,
    /// The same names, owned (rebuilds and tombstones).
    pub(super) names: Vec<Arc<str>>,
}

impl Names {
    #[inline]
    pub(super) fn get(&self, name: &str) -> Option<u32> {
        let hash = self.hasher.hash_one(name);
        self.table
            .find(hash, |&i| self.holds(i as usize, name))
            .copied()
    }

    /// Whether index `i` holds `name`: one comparison against the arena, no hash.
    #[inline]
    pub(super) fn holds(&self, i: usize, name: &str) -> bool {
        self.spans.get(i).is_some_and(|&(offset, len)| {
            let stored = &self.arena.as_bytes()[offset as usize..(offset + len) as usize];
            same_name(stored, name.as_bytes())
        })
    }

    pub(super) fn len(&self) -> usize {
        self.names.len()
    }

    /// Appends `name` (not present) at the next index.
    pub(super) fn push(&mut self, name: Arc<str>) -> u32 {
        let i = self.names.len() as u32;
        let offset = self.arena.len() as u32;
        self.arena.push_str(&name);
        self.spans.push((offset, name.len() as u32));
        let hash = self.hasher.hash_one(&*name);
        let (arena, spans, hasher) = (&self.arena, &self.spans, &self.hasher);
        self.table.insert_unique(hash, i, |&j| {
            let (offset, len) = spans[j as usize];
            hasher.hash_one(&arena[offset as usize..(offset + len) as usize])
        });
        self.names.push(name);
        i
    }
}

/// Resolves the candidate names of one request, in the request's order.
///
/// Indices follow the node names' order at the full build (the order the API server lists
/// them in), nodes added later after them. kube-scheduler builds its own node list from the
/// same listing, also appending later nodes, and hands its candidates over in that list's
/// order within a zone, in runs of consecutive nodes (its parallel filter works through
/// chunks of the list). So while candidates come in order, each name is first compared with
/// the name at the index after the last one resolved, and hashed only when that guess is
/// wrong: one short comparison where the hash and probe cost a cache miss. Once two guesses in
/// a row were wrong (zones interleaved, or any other order), it stops guessing, because a
/// guess also makes each lookup wait for the one before it; it guesses again as soon as a
/// hashed name turns out to be the next index. The answers are the same for any order: names
/// are unique, so the name at the guessed index is the one the hash would find (debug builds
/// check it).
pub struct Finder<'s> {
    pub(super) snapshot: &'s Snapshot,
    pub(super) next: usize,
    /// Wrong guesses in a row (in-order names reset it).
    pub(super) misses: u8,
}

impl<'s> Finder<'s> {
    /// Wrong guesses in a row after which `find` stops guessing.
    const GIVE_UP: u8 = 2;

    /// The node called `name`, like [`Snapshot::find`].
    #[inline]
    pub fn find(&mut self, name: &str) -> Option<Found<'s>> {
        let names = &self.snapshot.names;
        let i = if self.misses < Self::GIVE_UP && names.holds(self.next, name) {
            debug_assert_eq!(names.get(name), Some(self.next as u32));
            self.misses = 0;
            self.next
        } else {
            let i = names.get(name)? as usize;
            self.misses = if i == self.next {
                0
            } else {
                self.misses.saturating_add(1)
            };
            i
        };
        self.next = i + 1;
        self.snapshot.found_at(i)
    }
}

/// `a == b`, deciding most unequal node names without a `memcmp` call: names of one fleet
/// share their prefix and length ("gpu-node-01234"), so their last 8 bytes are compared first,
/// as one integer.
#[inline]
pub(super) fn same_name(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if let (Some(a_tail), Some(b_tail)) = (a.last_chunk::<8>(), b.last_chunk::<8>())
        && a_tail != b_tail
    {
        return false;
    }
    a == b
}
