//! Per-node device state: what the node's `Device` object offers ([`NodeDevices`]) and what pods
//! hold ([`DeviceLedger`]).
//!
//! The ledger is keyed by pod UID and every entry remembers exactly what it added, so a replace
//! or remove subtracts the recorded contribution, never what an annotation says now. Used is
//! derived from recorded entries only. This module is pure data: it never locks, never talks
//! to the network, and never decides placement (that is `placement::device`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::device::{
    Device, DeviceAllocations, DeviceResources, DeviceTopology, DeviceType,
    canonicalize_resource_names,
};
use crate::model::ids::PodUid;
use crate::model::quantity::Quantity;

/// `acc += other`, dropping zero entries so equal contents compare equal.
pub fn add_resources(acc: &mut DeviceResources, other: &DeviceResources) {
    for (name, q) in other {
        let e = acc.entry(name.clone()).or_insert(Quantity::ZERO);
        *e = *e + *q;
    }
    acc.retain(|_, q| !q.is_zero());
}

/// `acc -= other`, clamped at zero (an entry never goes negative), dropping zero entries.
pub fn sub_resources(acc: &mut DeviceResources, other: &DeviceResources) {
    for (name, q) in other {
        if let Some(e) = acc.get_mut(name) {
            *e = Quantity::from_milli((e.milli() - q.milli()).max(0));
        }
    }
    acc.retain(|_, q| !q.is_zero());
}

/// Whether every requested dimension is available (a missing dimension counts as zero).
pub fn fits_in(request: &DeviceResources, free: &DeviceResources) -> bool {
    request
        .iter()
        .all(|(name, q)| free.get(name).copied().unwrap_or(Quantity::ZERO) >= *q)
}

/// One device of one type on a node, as its `Device` entry described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSlot {
    pub minor: i32,
    /// `spec.devices[].id`; copied into allocations.
    pub id: String,
    /// False for `health=false` and for entries whose resources did not parse.
    pub healthy: bool,
    /// Capacity; empty when unhealthy so nothing can ever be allocated from it.
    pub total: DeviceResources,
    pub topology: Option<DeviceTopology>,
}

/// What a node's `Device` object offers, per placeable type, per minor (ascending).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeDevices {
    types: BTreeMap<DeviceType, BTreeMap<i32, DeviceSlot>>,
}

/// A `Device` entry that could not be used as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceProblem {
    #[error("spec.devices[{index}] ({device_type}) has no minor; entry ignored")]
    MissingMinor {
        device_type: DeviceType,
        index: usize,
    },
    #[error("spec.devices[{index}] ({device_type}) has negative minor {minor}; entry ignored")]
    NegativeMinor {
        device_type: DeviceType,
        index: usize,
        minor: i32,
    },
    #[error(
        "spec.devices[{index}] ({device_type}) repeats minor {minor}; the first entry is kept, this one ignored"
    )]
    DuplicateMinor {
        device_type: DeviceType,
        index: usize,
        minor: i32,
    },
    #[error(
        "spec.devices[{index}] ({device_type} minor {minor}) resource {resource}={value:?} is invalid ({reason}); device treated as unhealthy"
    )]
    InvalidResource {
        device_type: DeviceType,
        index: usize,
        minor: i32,
        resource: String,
        value: String,
        reason: String,
    },
}

impl DeviceProblem {
    /// Short label for metrics.
    pub fn class(&self) -> &'static str {
        match self {
            DeviceProblem::MissingMinor { .. } => "missing_minor",
            DeviceProblem::NegativeMinor { .. } => "negative_minor",
            DeviceProblem::DuplicateMinor { .. } => "duplicate_minor",
            DeviceProblem::InvalidResource { .. } => "invalid_resource",
        }
    }
}

impl NodeDevices {
    /// Builds the node's device table. Unknown types are skipped (not placeable). Bad entries are
    /// reported and ignored rather than failing the whole object, so one bad GPU does not hide
    /// the others.
    pub fn from_device(device: &Device) -> (NodeDevices, Vec<DeviceProblem>) {
        let mut types: BTreeMap<DeviceType, BTreeMap<i32, DeviceSlot>> = BTreeMap::new();
        let mut problems = Vec::new();
        for (index, info) in device.spec.devices.iter().enumerate() {
            let device_type = info.device_type.clone();
            if !device_type.is_known() {
                continue;
            }
            let minor = match info.minor {
                None => {
                    problems.push(DeviceProblem::MissingMinor { device_type, index });
                    continue;
                }
                Some(m) if m < 0 => {
                    problems.push(DeviceProblem::NegativeMinor {
                        device_type,
                        index,
                        minor: m,
                    });
                    continue;
                }
                Some(m) => m,
            };
            let by_minor = types.entry(device_type.clone()).or_default();
            if by_minor.contains_key(&minor) {
                problems.push(DeviceProblem::DuplicateMinor {
                    device_type,
                    index,
                    minor,
                });
                continue;
            }
            let mut healthy = info.health;
            let mut total = DeviceResources::new();
            for (name, value) in info.resources.iter().flatten() {
                match Quantity::parse(value) {
                    Ok(q) if q.milli() >= 0 => {
                        total.insert(name.clone(), q);
                    }
                    bad => {
                        let reason = match bad {
                            Err(e) => e.to_string(),
                            Ok(_) => "negative".to_string(),
                        };
                        problems.push(DeviceProblem::InvalidResource {
                            device_type: device_type.clone(),
                            index,
                            minor,
                            resource: name.clone(),
                            value: value.clone(),
                            reason,
                        });
                        healthy = false;
                    }
                }
            }
            let mut total = canonicalize_resource_names(total);
            total.retain(|_, q| !q.is_zero());
            if !healthy {
                total.clear();
            }
            by_minor.insert(
                minor,
                DeviceSlot {
                    minor,
                    id: info.id.clone().unwrap_or_default(),
                    healthy,
                    total,
                    topology: info.topology.clone(),
                },
            );
        }
        types.retain(|_, m| !m.is_empty());
        (NodeDevices { types }, problems)
    }

    /// Builds directly from slots (tests, offline fixtures). Later duplicates are ignored.
    pub fn from_slots(slots: impl IntoIterator<Item = (DeviceType, DeviceSlot)>) -> Self {
        let mut types: BTreeMap<DeviceType, BTreeMap<i32, DeviceSlot>> = BTreeMap::new();
        for (t, s) in slots {
            types.entry(t).or_default().entry(s.minor).or_insert(s);
        }
        NodeDevices { types }
    }

    pub fn types(&self) -> impl Iterator<Item = &DeviceType> {
        self.types.keys()
    }
    /// Devices of a type in ascending minor order.
    pub fn slots(&self, t: &DeviceType) -> impl Iterator<Item = &DeviceSlot> {
        self.types.get(t).into_iter().flat_map(|m| m.values())
    }
    pub fn slot(&self, t: &DeviceType, minor: i32) -> Option<&DeviceSlot> {
        self.types.get(t)?.get(&minor)
    }
    pub fn minors(&self, t: &DeviceType) -> BTreeSet<i32> {
        self.slots(t).map(|s| s.minor).collect()
    }
    pub fn has_type(&self, t: &DeviceType) -> bool {
        self.types.contains_key(t)
    }
}

/// What a pod is recorded as holding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordedAllocation {
    Allocated(DeviceAllocations),
    /// The pod's annotation did not parse: we cannot know what it holds, so the whole node is
    /// treated as used until the entry is replaced or removed.
    Malformed {
        reason: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryState {
    /// Recorded by our bind, not yet confirmed by the pod watch.
    Assumed { at: Instant },
    /// Seen on an assigned pod by the pod watch.
    Committed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerEntry {
    pub allocation: RecordedAllocation,
    pub state: EntryState,
}

/// Used resources per type, per minor.
pub type UsedMap = BTreeMap<DeviceType, BTreeMap<i32, DeviceResources>>;
/// Free resources per placeable type, per minor present in the node's devices.
pub type FreeMap = BTreeMap<DeviceType, BTreeMap<i32, DeviceResources>>;

/// One node's device accounting.
#[derive(Clone, Debug, Default)]
pub struct DeviceLedger {
    devices: Option<NodeDevices>,
    entries: BTreeMap<PodUid, LedgerEntry>,
    used: UsedMap,
    malformed: usize,
    /// Fixed-size per-minor totals and free, built on first read after a change: filter and
    /// prioritize read it for every candidate node and must not rebuild string-keyed maps.
    /// Every mutation resets it.
    index: std::sync::OnceLock<Arc<LedgerIndex>>,
}

/// The resource dimensions the fast placement path understands, by index.
pub const INDEX_DIMS: [&str; 5] = [
    crate::model::device::GPU_CORE,
    crate::model::device::GPU_MEMORY,
    crate::model::device::GPU_MEMORY_RATIO,
    crate::model::device::RDMA,
    crate::model::device::FPGA,
];

/// Milli-units per dimension of [`INDEX_DIMS`].
pub type DimVec = [i128; INDEX_DIMS.len()];

/// Position of a resource name in [`INDEX_DIMS`].
pub fn dim_of(name: &str) -> Option<usize> {
    INDEX_DIMS.iter().position(|d| *d == name)
}

/// One minor in the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotIndex {
    pub minor: i32,
    pub healthy: bool,
    pub total: DimVec,
    pub free: DimVec,
    /// True when the total carries a resource outside [`INDEX_DIMS`] (the fast path then
    /// defers to the full allocator for this node).
    pub has_other_dims: bool,
    /// The total map is empty (unhealthy devices have an empty total).
    pub total_empty: bool,
    /// The free map is empty.
    pub free_empty: bool,
    /// The device's NUMA node (`topology.nodeID`); `None` when unknown, which every NUMA
    /// restriction admits (as `allocate::on_numa` does).
    pub numa: Option<u32>,
}

/// A ledger's state in fixed-size form, per device type in `NodeDevices` order.
#[derive(Clone, Debug, Default)]
pub struct LedgerIndex {
    pub blocked: bool,
    /// Some device reports a resource outside [`INDEX_DIMS`].
    pub other_dims: bool,
    pub types: Vec<(DeviceType, Vec<SlotIndex>)>,
}

impl LedgerIndex {
    pub fn slots(&self, t: &DeviceType) -> &[SlotIndex] {
        self.types
            .iter()
            .find(|(k, _)| k == t)
            .map(|(_, v)| v.as_slice())
            .unwrap_or(&[])
    }
}

fn dims(r: &DeviceResources) -> (DimVec, bool) {
    let mut out = [0i128; INDEX_DIMS.len()];
    let mut other = false;
    for (name, q) in r {
        match dim_of(name) {
            Some(d) => out[d] = q.milli(),
            None => other = true,
        }
    }
    (out, other)
}

fn apply(used: &mut UsedMap, allocs: &DeviceAllocations, add: bool) {
    for (t, list) in &allocs.0 {
        let by_minor = used.entry(t.clone()).or_default();
        for a in list {
            let r = by_minor.entry(a.minor).or_default();
            if add {
                add_resources(r, &a.resources);
            } else {
                sub_resources(r, &a.resources);
            }
            if r.is_empty() {
                by_minor.remove(&a.minor);
            }
        }
        if by_minor.is_empty() {
            used.remove(t);
        }
    }
}

impl DeviceLedger {
    pub fn new() -> Self {
        Self::default()
    }

    /// `None` means the Device object is gone: nothing is allocatable, recorded use is kept
    /// (koordinator #1186: dropping it double-allocated once koordlet recreated the object).
    pub fn set_devices(&mut self, devices: Option<NodeDevices>) {
        self.devices = devices;
        self.index = Default::default();
    }

    /// The fixed-size view of totals and free (as `free(&[])` computes them), cached until the
    /// next change.
    pub fn index(&self) -> Arc<LedgerIndex> {
        self.index
            .get_or_init(|| {
                let Some(devices) = &self.devices else {
                    return Arc::new(LedgerIndex::default());
                };
                let free = self.free(&[]);
                let types: Vec<(DeviceType, Vec<SlotIndex>)> = devices
                    .types()
                    .map(|t| {
                        let slots = devices
                            .slots(t)
                            .map(|slot| {
                                let (total, other_total) = dims(&slot.total);
                                let slot_free = free.get(t).and_then(|m| m.get(&slot.minor));
                                let (free_dims, other_free) = slot_free
                                    .map(dims)
                                    .unwrap_or(([0; INDEX_DIMS.len()], false));
                                SlotIndex {
                                    minor: slot.minor,
                                    healthy: slot.healthy,
                                    total,
                                    free: free_dims,
                                    has_other_dims: other_total || other_free,
                                    total_empty: slot.total.is_empty(),
                                    free_empty: slot_free.is_none_or(|f| f.is_empty()),
                                    numa: slot
                                        .topology
                                        .as_ref()
                                        .and_then(|t| u32::try_from(t.node_id).ok()),
                                }
                            })
                            .collect();
                        (t.clone(), slots)
                    })
                    .collect();
                let other_dims = types
                    .iter()
                    .any(|(_, slots)| slots.iter().any(|s| s.has_other_dims));
                Arc::new(LedgerIndex {
                    blocked: self.malformed > 0,
                    other_dims,
                    types,
                })
            })
            .clone()
    }
    pub fn devices(&self) -> Option<&NodeDevices> {
        self.devices.as_ref()
    }

    /// Records (or replaces) a pod's allocation, returning the previous entry. Replacing first
    /// subtracts exactly what the previous entry added, which makes replays idempotent.
    pub fn record(
        &mut self,
        uid: PodUid,
        allocation: RecordedAllocation,
        state: EntryState,
    ) -> Option<LedgerEntry> {
        self.index = Default::default();
        let previous = self.remove(&uid);
        match &allocation {
            RecordedAllocation::Allocated(a) => apply(&mut self.used, a, true),
            RecordedAllocation::Malformed { .. } => self.malformed += 1,
        }
        self.entries.insert(uid, LedgerEntry { allocation, state });
        previous
    }

    /// Removes a pod's entry, subtracting what it recorded. Removing an absent pod is a no-op.
    pub fn remove(&mut self, uid: &PodUid) -> Option<LedgerEntry> {
        self.index = Default::default();
        let entry = self.entries.remove(uid)?;
        match &entry.allocation {
            RecordedAllocation::Allocated(a) => apply(&mut self.used, a, false),
            RecordedAllocation::Malformed { .. } => {
                self.malformed = self.malformed.saturating_sub(1)
            }
        }
        Some(entry)
    }

    pub fn get(&self, uid: &PodUid) -> Option<&LedgerEntry> {
        self.entries.get(uid)
    }
    pub fn entries(&self) -> impl Iterator<Item = (&PodUid, &LedgerEntry)> {
        self.entries.iter()
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Assumed entries older than `ttl`, with the instant each was assumed.
    pub fn assumed_older_than(&self, now: Instant, ttl: Duration) -> Vec<(PodUid, Instant)> {
        self.entries
            .iter()
            .filter_map(|(uid, e)| match e.state {
                EntryState::Assumed { at } if now.saturating_duration_since(at) >= ttl => {
                    Some((uid.clone(), at))
                }
                _ => None,
            })
            .collect()
    }

    /// Removes `uid`'s entry only if it is still the one assumed at `at` (not committed by the
    /// watch or re-assumed by a later bind in the meantime). True when removed.
    pub fn remove_if_assumed_at(&mut self, uid: &PodUid, at: Instant) -> bool {
        let same = matches!(
            self.entries.get(uid).map(|e| e.state),
            Some(EntryState::Assumed { at: a }) if a == at
        );
        if same {
            self.remove(uid);
        }
        same
    }

    /// Removes assumed entries older than `ttl` (a bind whose pod update never arrived).
    pub fn expire_assumed(&mut self, now: Instant, ttl: Duration) -> Vec<PodUid> {
        let expired: Vec<PodUid> = self
            .entries
            .iter()
            .filter(|(_, e)| match e.state {
                EntryState::Assumed { at } => now.saturating_duration_since(at) >= ttl,
                EntryState::Committed => false,
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &expired {
            self.remove(uid);
        }
        expired
    }

    /// Used per type and minor, over every recorded allocation (including minors that are absent
    /// or unhealthy now, and unknown types).
    pub fn used(&self) -> &UsedMap {
        &self.used
    }

    /// Whether the recorded use of `(t, minor)` exceeds its healthy capacity in some dimension
    /// (pods' annotations overcommit it). Minors the Device object lacks, and unhealthy ones
    /// (no capacity by design), are not overcommitted.
    fn is_overcommitted(&self, t: &DeviceType, minor: i32) -> bool {
        let (Some(slot), Some(used)) = (
            self.devices.as_ref().and_then(|d| d.slot(t, minor)),
            self.used.get(t).and_then(|m| m.get(&minor)),
        ) else {
            return false;
        };
        slot.healthy
            && used
                .iter()
                .any(|(name, q)| slot.total.get(name).is_some_and(|cap| q > cap))
    }

    /// The minors of `alloc` that are overcommitted now: `(type, minor)`.
    pub fn overcommitted_by(&self, alloc: &DeviceAllocations) -> Vec<(DeviceType, i32)> {
        alloc
            .0
            .iter()
            .flat_map(|(t, list)| list.iter().map(move |a| (t, a.minor)))
            .filter(|(t, m)| self.is_overcommitted(t, *m))
            .map(|(t, m)| (t.clone(), m))
            .collect()
    }

    /// Every overcommitted minor of the node (checked when its Device object changes: pods
    /// may have arrived first).
    pub fn overcommitted(&self) -> Vec<(DeviceType, i32)> {
        self.used
            .iter()
            .flat_map(|(t, minors)| minors.keys().map(move |m| (t, *m)))
            .filter(|(t, m)| self.is_overcommitted(t, *m))
            .map(|(t, m)| (t.clone(), m))
            .collect()
    }
    /// Whether a malformed entry currently blocks the whole node.
    pub fn has_malformed(&self) -> bool {
        self.malformed > 0
    }

    /// Free per placeable type and minor, treating the entries of `ignore` as released
    /// (preemption victims). Computed on copies; the ledger is not touched. A malformed entry
    /// that is not ignored makes every device count as fully used.
    pub fn free(&self, ignore: &[PodUid]) -> FreeMap {
        let mut out = FreeMap::new();
        let Some(devices) = &self.devices else {
            return out;
        };
        let mut released = UsedMap::new();
        let mut malformed = self.malformed;
        let mut seen = BTreeSet::new();
        for uid in ignore {
            if !seen.insert(uid) {
                continue;
            }
            match self.entries.get(uid).map(|e| &e.allocation) {
                Some(RecordedAllocation::Allocated(a)) => apply(&mut released, a, true),
                Some(RecordedAllocation::Malformed { .. }) => {
                    malformed = malformed.saturating_sub(1)
                }
                None => {}
            }
        }
        let blocked = malformed > 0;
        let empty = DeviceResources::new();
        for t in devices.types() {
            let by_minor = out.entry(t.clone()).or_default();
            for slot in devices.slots(t) {
                let mut free = DeviceResources::new();
                if !blocked {
                    free = slot.total.clone();
                    let used = self.used.get(t).and_then(|m| m.get(&slot.minor));
                    let rel = released.get(t).and_then(|m| m.get(&slot.minor));
                    // Filter and bind call this per node: clone `used` only when victims are
                    // released from it.
                    match (used, rel) {
                        (Some(used), Some(rel)) => {
                            let mut used = used.clone();
                            sub_resources(&mut used, rel);
                            sub_resources(&mut free, &used);
                        }
                        (Some(used), None) => sub_resources(&mut free, used),
                        (None, _) => sub_resources(&mut free, &empty),
                    }
                }
                by_minor.insert(slot.minor, free);
            }
        }
        out
    }

    /// A serializable snapshot for debug endpoints.
    pub fn debug_view(&self, now: Instant) -> LedgerView {
        let free = self.free(&[]);
        let mut types: BTreeMap<String, BTreeMap<i32, MinorView>> = BTreeMap::new();
        if let Some(devices) = &self.devices {
            for t in devices.types() {
                let m = types.entry(t.to_string()).or_default();
                for s in devices.slots(t) {
                    m.insert(
                        s.minor,
                        MinorView {
                            id: s.id.clone(),
                            present: true,
                            healthy: s.healthy,
                            total: render(&s.total),
                            used: BTreeMap::new(),
                            free: free
                                .get(t)
                                .and_then(|f| f.get(&s.minor))
                                .map(render)
                                .unwrap_or_default(),
                        },
                    );
                }
            }
        }
        for (t, by_minor) in &self.used {
            let m = types.entry(t.to_string()).or_default();
            for (minor, used) in by_minor {
                m.entry(*minor)
                    .or_insert_with(|| MinorView {
                        id: String::new(),
                        present: false,
                        healthy: false,
                        total: BTreeMap::new(),
                        used: BTreeMap::new(),
                        free: BTreeMap::new(),
                    })
                    .used = render(used);
            }
        }
        let entries = self
            .entries
            .iter()
            .map(|(uid, e)| {
                let (state, assumed_for_ms) = match e.state {
                    EntryState::Assumed { at } => (
                        "assumed",
                        Some(now.saturating_duration_since(at).as_millis()),
                    ),
                    EntryState::Committed => ("committed", None),
                };
                let (allocation, malformed) = match &e.allocation {
                    RecordedAllocation::Allocated(a) => (Some(a.to_annotation()), None),
                    RecordedAllocation::Malformed { reason } => (None, Some(reason.clone())),
                };
                (
                    uid.to_string(),
                    EntryView {
                        state,
                        assumed_for_ms,
                        allocation,
                        malformed,
                    },
                )
            })
            .collect();
        LedgerView {
            device_object_present: self.devices.is_some(),
            blocked_by_malformed_entries: self.has_malformed(),
            types,
            entries,
        }
    }
}

fn render(r: &DeviceResources) -> BTreeMap<String, String> {
    r.iter()
        .map(|(k, q)| {
            let v = if k == crate::model::device::GPU_MEMORY {
                crate::model::device::format_bytes(*q)
            } else {
                q.to_string()
            };
            (k.clone(), v)
        })
        .collect()
}

#[derive(Debug, Clone, Serialize)]
pub struct LedgerView {
    pub device_object_present: bool,
    pub blocked_by_malformed_entries: bool,
    pub types: BTreeMap<String, BTreeMap<i32, MinorView>>,
    pub entries: BTreeMap<String, EntryView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MinorView {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// False for minors that only appear in recorded allocations.
    pub present: bool,
    pub healthy: bool,
    pub total: BTreeMap<String, String>,
    pub used: BTreeMap<String, String>,
    pub free: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EntryView {
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assumed_for_ms: Option<u128>,
    /// The recorded allocation in annotation form.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocation: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub malformed: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device::{
        DeviceAllocation, DeviceInfo, DeviceSpec, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO,
    };

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }
    fn gpu_info(minor: Option<i32>, health: bool, mem: &str) -> DeviceInfo {
        DeviceInfo {
            device_type: DeviceType::Gpu,
            labels: None,
            id: Some(format!("GPU-{minor:?}")),
            minor,
            module_id: None,
            health,
            resources: Some(BTreeMap::from([
                (GPU_CORE.to_string(), "100".to_string()),
                ("kubernetes.io/gpu-memory".to_string(), mem.to_string()),
                (GPU_MEMORY_RATIO.to_string(), "100".to_string()),
            ])),
            topology: None,
            vf_groups: vec![],
        }
    }
    fn device(infos: Vec<DeviceInfo>) -> Device {
        Device {
            metadata: Default::default(),
            spec: DeviceSpec { devices: infos },
        }
    }
    fn alloc(minor: i32, ratio: &str) -> RecordedAllocation {
        RecordedAllocation::Allocated(DeviceAllocations(BTreeMap::from([(
            DeviceType::Gpu,
            vec![DeviceAllocation {
                minor,
                resources: DeviceResources::from([
                    (GPU_MEMORY_RATIO.to_string(), q(ratio)),
                    (GPU_MEMORY.to_string(), q("1Gi")),
                ]),
                id: String::new(),
                extension: None,
            }],
        )])))
    }
    fn ledger() -> DeviceLedger {
        let (nd, problems) = NodeDevices::from_device(&device(vec![
            gpu_info(Some(0), true, "16Gi"),
            gpu_info(Some(1), true, "16Gi"),
        ]));
        assert!(problems.is_empty());
        let mut l = DeviceLedger::new();
        l.set_devices(Some(nd));
        l
    }

    #[test]
    fn from_device_reports_bad_entries() {
        let mut bad = gpu_info(Some(3), true, "16Gi");
        bad.resources
            .as_mut()
            .unwrap()
            .insert(GPU_CORE.into(), "lots".into());
        let (nd, problems) = NodeDevices::from_device(&device(vec![
            gpu_info(Some(0), true, "16Gi"),
            gpu_info(None, true, "16Gi"),
            gpu_info(Some(0), true, "32Gi"),
            gpu_info(Some(1), false, "16Gi"),
            gpu_info(Some(-2), true, "16Gi"),
            bad,
            gpu_info(Some(70), true, "16Gi"),
        ]));
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(matches!(
            problems[0],
            DeviceProblem::MissingMinor { index: 1, .. }
        ));
        assert!(matches!(
            problems[1],
            DeviceProblem::DuplicateMinor { minor: 0, .. }
        ));
        assert!(problems[3].to_string().contains("koordinator.sh/gpu-core"));
        assert_eq!(
            nd.minors(&DeviceType::Gpu),
            BTreeSet::from([0, 1, 3, 70]),
            "minors above 63 are fine"
        );
        let g0 = nd.slot(&DeviceType::Gpu, 0).unwrap();
        assert_eq!(
            g0.total[GPU_MEMORY],
            q("16Gi"),
            "first duplicate kept, deprecated name mapped"
        );
        assert!(nd.slot(&DeviceType::Gpu, 1).unwrap().total.is_empty());
        assert!(!nd.slot(&DeviceType::Gpu, 3).unwrap().healthy);
    }

    #[test]
    fn record_replace_remove_is_exact_and_idempotent() {
        let mut l = ledger();
        let empty = l.free(&[]);
        let uid = PodUid::new("a");
        l.record(uid.clone(), alloc(0, "50"), EntryState::Committed);
        let once = l.free(&[]);
        l.record(uid.clone(), alloc(0, "50"), EntryState::Committed);
        assert_eq!(l.free(&[]), once, "replaying the same record is a no-op");
        assert_eq!(once[&DeviceType::Gpu][&0][GPU_MEMORY_RATIO], q("50"));
        // Replace with a different allocation: the old one is subtracted exactly.
        l.record(uid.clone(), alloc(1, "30"), EntryState::Committed);
        assert_eq!(
            l.free(&[])[&DeviceType::Gpu][&0],
            empty[&DeviceType::Gpu][&0]
        );
        assert_eq!(l.free(&[])[&DeviceType::Gpu][&1][GPU_MEMORY_RATIO], q("70"));
        assert!(l.remove(&uid).is_some());
        assert!(l.remove(&uid).is_none());
        assert_eq!(l.free(&[]), empty);
        assert!(l.used().is_empty());
    }

    #[test]
    fn ignore_releases_without_mutating() {
        let mut l = ledger();
        l.record(PodUid::new("a"), alloc(0, "100"), EntryState::Committed);
        let before = l.used().clone();
        let f = l.free(&[PodUid::new("a"), PodUid::new("a"), PodUid::new("nope")]);
        assert_eq!(f[&DeviceType::Gpu][&0][GPU_MEMORY_RATIO], q("100"));
        assert_eq!(l.used(), &before);
        assert!(!l.free(&[])[&DeviceType::Gpu][&0].contains_key(GPU_MEMORY_RATIO));
    }

    #[test]
    fn malformed_entries_block_the_whole_node_until_replaced() {
        let mut l = ledger();
        let uid = PodUid::new("m");
        l.record(
            uid.clone(),
            RecordedAllocation::Malformed {
                reason: "bad json".into(),
            },
            EntryState::Committed,
        );
        assert!(
            l.free(&[])
                .values()
                .flat_map(|m| m.values())
                .all(|f| f.is_empty())
        );
        assert!(!l.free(std::slice::from_ref(&uid))[&DeviceType::Gpu][&0].is_empty());
        let v = serde_json::to_value(l.debug_view(Instant::now())).unwrap();
        assert_eq!(v["blocked_by_malformed_entries"], true);
        assert_eq!(v["entries"]["m"]["malformed"], "bad json");
        l.record(uid.clone(), alloc(0, "10"), EntryState::Committed);
        assert!(!l.has_malformed());
        assert_eq!(
            l.free(&[])[&DeviceType::Gpu][&1][GPU_MEMORY_RATIO],
            q("100")
        );
    }

    #[test]
    fn device_deletion_keeps_used_and_absent_minors_stay_counted() {
        let mut l = ledger();
        l.record(PodUid::new("a"), alloc(0, "60"), EntryState::Committed);
        l.record(PodUid::new("b"), alloc(9, "60"), EntryState::Committed);
        l.set_devices(None);
        assert!(l.free(&[]).is_empty());
        assert_eq!(l.used()[&DeviceType::Gpu].len(), 2);
        // Device comes back with minor 0 unhealthy: still counted, free empty, never negative.
        let (nd, _) = NodeDevices::from_device(&device(vec![
            gpu_info(Some(0), false, "16Gi"),
            gpu_info(Some(1), true, "16Gi"),
        ]));
        l.set_devices(Some(nd));
        let f = l.free(&[]);
        assert!(f[&DeviceType::Gpu][&0].is_empty());
        assert_eq!(f[&DeviceType::Gpu][&1][GPU_MEMORY_RATIO], q("100"));
        let v = serde_json::to_value(l.debug_view(Instant::now())).unwrap();
        assert_eq!(v["types"]["gpu"]["9"]["present"], false);
        assert_eq!(
            v["types"]["gpu"]["9"]["used"]["koordinator.sh/gpu-memory-ratio"],
            "60"
        );
    }

    #[test]
    fn expire_assumed_only_drops_old_assumed_entries() {
        let mut l = ledger();
        let t0 = Instant::now();
        l.record(
            PodUid::new("old"),
            alloc(0, "10"),
            EntryState::Assumed { at: t0 },
        );
        l.record(PodUid::new("c"), alloc(0, "10"), EntryState::Committed);
        let later = t0 + Duration::from_secs(60);
        l.record(
            PodUid::new("new"),
            alloc(0, "10"),
            EntryState::Assumed { at: later },
        );
        let gone = l.expire_assumed(later, Duration::from_secs(30));
        assert_eq!(gone, vec![PodUid::new("old")]);
        assert_eq!(l.len(), 2);
        assert_eq!(l.used()[&DeviceType::Gpu][&0][GPU_MEMORY_RATIO], q("20"));
    }
}
