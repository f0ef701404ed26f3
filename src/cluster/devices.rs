//! Per-node device state: what pods hold ([`DeviceLedger`]) against what the node's `Device`
//! object offers ([`NodeDevices`], a placement type re-exported here).
//!
//! The ledger is keyed by pod UID and every entry remembers exactly what it added, so a replace
//! or remove subtracts the recorded contribution, never what an annotation says now. Used is
//! derived from recorded entries only. This module is pure data: it never locks, never talks
//! to the network, and never decides placement (that is `placement::device`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::dra::{DevicePool, NodeDraHoldings};
use super::ledger::{Entries, Entry};
use crate::model::device::{DeviceAllocations, DeviceResources, DeviceType};
use crate::model::dra::DeviceIdentity;
use crate::model::ids::PodUid;
use crate::model::quantity::Quantity;
use crate::placement::device::index::DeviceIndex;
pub use crate::placement::device::inventory::{
    DeviceHoldings, DevicePartitions, DeviceProblem, DeviceSlot, FreeMap, NodeDevices,
    NodeGpuLabels, UsedMap, add_resources, effective_partitions, fits_in, sub_resources,
};
use crate::placement::device::partition::NodePartitions;
use crate::placement::device::request::PodDeviceRequest;

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

pub use super::ledger::EntryState;

/// A pod's device entry.
pub type LedgerEntry = Entry<RecordedAllocation>;

/// One node's device accounting.
#[derive(Clone, Debug, Default)]
pub struct DeviceLedger {
    /// Shared with the Device sync's store (one copy per Device object).
    devices: Option<Arc<NodeDevices>>,
    entries: Entries<RecordedAllocation>,
    used: UsedMap,
    malformed: usize,
    /// What the Node's labels say of GPU partitions (its built-in table and policy).
    gpu_labels: NodeGpuLabels,
    /// Bound pods asking for managed devices without an annotation, by UID: each holds that
    /// much capacity of unknown identity. Their entries are placed by
    /// `NodeState::place_unknown_holders` after every write, from the current state alone.
    unknown: BTreeMap<PodUid, Arc<PodDeviceRequest>>,
    /// What Kubernetes' own allocator (DRA) holds here, by identity (`cluster::dra`).
    dra: NodeDraHoldings,
    /// The slots a DRA claim holds (their identity is one `dra` holds), with the claims: never
    /// free for the extender, whatever the annotations say. Derived from `devices` and `dra`.
    dra_blocked: BTreeMap<(DeviceType, i32), BTreeSet<Arc<str>>>,
    /// The slots a DRA slice also publishes whose pool is not the extender's now (no rule of
    /// its in effect, or the node handed to DRA): not free for the extender either.
    dra_unowned: BTreeMap<(DeviceType, i32), DevicePool>,
    /// The pools the `Device` entries join to, with the joined slots: published now (`true`),
    /// or only remembered after their slices went (`false`, `NodeDraHoldings::former`).
    dra_pools: BTreeMap<DevicePool, (bool, Vec<(DeviceType, i32)>)>,
}

/// One DRA pool a node's `Device` entries join to ([`DeviceLedger::joined_pools`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinedPool {
    pub pool: DevicePool,
    /// A slice publishes it now (else it is only remembered, `NodeDraHoldings::former`).
    pub published: bool,
    /// An annotation holds one of its joined devices.
    pub in_use: bool,
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
        self.set_devices_shared(devices.map(Arc::new));
    }

    /// [`Self::set_devices`] with a shared copy (the Device sync's record).
    pub fn set_devices_shared(&mut self, devices: Option<Arc<NodeDevices>>) {
        self.devices = devices;
        self.join_dra();
    }

    /// What DRA claims hold on this node now.
    pub fn set_dra(&mut self, holdings: NodeDraHoldings) {
        self.dra = holdings;
        self.join_dra();
    }

    pub fn dra(&self) -> &NodeDraHoldings {
        &self.dra
    }

    /// The slots a DRA pool publishes that the extender does not own now, with the pool.
    pub fn dra_unowned(&self) -> &BTreeMap<(DeviceType, i32), DevicePool> {
        &self.dra_unowned
    }

    /// The slots DRA claims hold, with the claims.
    pub fn dra_blocked(&self) -> &BTreeMap<(DeviceType, i32), BTreeSet<Arc<str>>> {
        &self.dra_blocked
    }

    /// The join (README "Beside DRA"): a `Device` entry is held by DRA when one of its
    /// identities (`id` as UUID or PCI address, `topology.busID`) is one a claim holds. Any
    /// type: GPUs join by UUID or bus ID, RDMA and FPGA by bus ID.
    ///
    /// With ownership enforced, a slot DRA also publishes is the extender's only while its
    /// pool is `owned` (the extender's DeviceTaintRule keeps DRA off it, in effect for the
    /// hand-over grace); otherwise it is not free for the extender either.
    fn join_dra(&mut self) {
        self.dra_blocked.clear();
        self.dra_unowned.clear();
        self.dra_pools.clear();
        let Some(devices) = &self.devices else {
            return;
        };
        if self.dra.held.is_empty() && self.dra.published.is_empty() && self.dra.former.is_empty() {
            return;
        }
        for t in devices.types() {
            for slot in devices.slots(t) {
                let ids = DeviceIdentity::of_koord_device(
                    &slot.id,
                    slot.topology.as_ref().map(|t| t.bus_id.as_str()),
                );
                for id in ids {
                    if let Some(claims) = self.dra.held.get(&id) {
                        self.dra_blocked
                            .entry((t.clone(), slot.minor))
                            .or_default()
                            .extend(claims.iter().cloned());
                    }
                    // Every pool that publishes it: one GPU may be in a GPU driver's pool and a
                    // VFIO driver's, and each pool needs the extender's rule.
                    for pool in self.dra.published.get(&id).into_iter().flatten() {
                        let (published, slots) = self.dra_pools.entry(pool.clone()).or_default();
                        *published = true;
                        slots.push((t.clone(), slot.minor));
                        if self.dra.enforced && !self.dra.owned.contains(pool) {
                            self.dra_unowned
                                .entry((t.clone(), slot.minor))
                                .or_insert_with(|| pool.clone());
                        }
                    }
                    for pool in self.dra.former.get(&id).into_iter().flatten() {
                        let (_, slots) = self.dra_pools.entry(pool.clone()).or_default();
                        slots.push((t.clone(), slot.minor));
                    }
                }
            }
        }
    }

    /// The DRA pools this node's `Device` entries join to, with whether a slice publishes
    /// them now (not only remembered) and whether an annotation holds one of the joined
    /// devices (see `ClusterState::dra_ownership_plan`).
    pub fn joined_pools(&self) -> impl Iterator<Item = JoinedPool> + '_ {
        self.dra_pools.iter().map(|(p, (published, slots))| {
            let in_use = slots.iter().any(|(t, m)| {
                self.used
                    .get(t)
                    .and_then(|u| u.get(m))
                    .is_some_and(|r| !r.is_empty())
            });
            JoinedPool {
                pool: p.clone(),
                published: *published,
                in_use,
            }
        })
    }

    /// The Node's GPU partition labels (built-in table, policy); default without a Node.
    pub fn set_gpu_labels(&mut self, labels: NodeGpuLabels) {
        self.gpu_labels = labels;
    }

    pub fn gpu_labels(&self) -> NodeGpuLabels {
        self.gpu_labels
    }

    /// The fixed-size view of totals and free (as `free(&[])` computes them) that filter and
    /// prioritize read; `None` without a `Device` object or when the devices cannot be
    /// indexed exactly (the full allocator answers then).
    pub fn device_index(&self) -> Option<DeviceIndex> {
        self.device_index_from(&self.free(&[]))
    }

    /// [`Self::device_index`] from `free`, which must be `self.free(&[])` (computed once by a
    /// caller that needs it too).
    pub fn device_index_from(&self, free: &FreeMap) -> Option<DeviceIndex> {
        DeviceIndex::build(self.devices.as_ref()?, free, self.malformed > 0)
    }

    pub fn devices(&self) -> Option<&NodeDevices> {
        self.devices.as_deref()
    }

    /// Records (or replaces) a pod's allocation, returning the previous entry. Replacing first
    /// subtracts exactly what the previous entry added, which makes replays idempotent.
    pub fn record(
        &mut self,
        uid: PodUid,
        allocation: RecordedAllocation,
        state: EntryState,
    ) -> Option<LedgerEntry> {
        let previous = self.remove(&uid);
        match &allocation {
            RecordedAllocation::Allocated(a) => apply(&mut self.used, a, true),
            RecordedAllocation::Malformed { .. } => self.malformed += 1,
        }
        self.entries.insert(uid, allocation, state);
        previous
    }

    /// Notes a pod holding devices of unknown identity (its entry is placed later).
    pub fn set_unknown(&mut self, uid: PodUid, request: Arc<PodDeviceRequest>) {
        self.unknown.insert(uid, request);
    }

    /// The pod holds no devices of unknown identity (any more). Its entry is left as is.
    pub fn clear_unknown(&mut self, uid: &PodUid) {
        self.unknown.remove(uid);
    }

    /// Pods holding devices of unknown identity, by UID.
    pub fn unknown(&self) -> &BTreeMap<PodUid, Arc<PodDeviceRequest>> {
        &self.unknown
    }

    /// Removes the placed entries of every unknown-identity holder (before they are placed
    /// again, or before a recorded allocation is judged against the known holders alone).
    pub fn remove_unknown_entries(&mut self) {
        let uids: Vec<PodUid> = self.unknown.keys().cloned().collect();
        for uid in uids {
            self.remove(&uid);
        }
    }

    /// Removes a pod's entry, subtracting what it recorded. Removing an absent pod is a no-op.
    pub fn remove(&mut self, uid: &PodUid) -> Option<LedgerEntry> {
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
        self.entries.assumed_older_than(now, ttl)
    }

    /// Removes `uid`'s entry only if it is still the one assumed at `at` (not committed by the
    /// watch or re-assumed by a later bind in the meantime). True when removed.
    pub fn remove_if_assumed_at(&mut self, uid: &PodUid, at: Instant) -> bool {
        let same = self.entries.is_assumed_at(uid, at);
        if same {
            self.remove(uid);
        }
        same
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

    /// The minors a DRA claim holds that pods' annotations hold too: one device handed out by
    /// both allocators (what the ownership rule exists to prevent; counted when seen).
    pub fn dra_conflicts(&self) -> Vec<(DeviceType, i32)> {
        self.dra_blocked
            .keys()
            .filter(|(t, m)| {
                self.used
                    .get(t)
                    .and_then(|u| u.get(m))
                    .is_some_and(|r| !r.is_empty())
            })
            .cloned()
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
                let key = (t.clone(), slot.minor);
                let held_by_dra =
                    self.dra_blocked.contains_key(&key) || self.dra_unowned.contains_key(&key);
                if !blocked && !held_by_dra {
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

    /// One device's entry in [`Self::free`] with nothing released, without building the map
    /// (a unit test holds the two equal): zero when the node is blocked by a malformed entry,
    /// the device is held or not owned beside DRA, or all of it is used.
    pub fn free_amount(&self, t: &DeviceType, minor: i32, name: &str) -> Quantity {
        let Some(slot) = self.devices.as_ref().and_then(|d| d.slot(t, minor)) else {
            return Quantity::ZERO;
        };
        let key = (t.clone(), minor);
        if self.malformed > 0
            || self.dra_blocked.contains_key(&key)
            || self.dra_unowned.contains_key(&key)
        {
            return Quantity::ZERO;
        }
        let total = slot.total.get(name).copied().unwrap_or(Quantity::ZERO);
        let used = self
            .used
            .get(t)
            .and_then(|m| m.get(&minor))
            .and_then(|u| u.get(name))
            .copied()
            .unwrap_or(Quantity::ZERO);
        Quantity::from_milli((total.milli() - used.milli()).max(0))
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
                            dra_claims: self
                                .dra_blocked
                                .get(&(t.clone(), s.minor))
                                .into_iter()
                                .flatten()
                                .map(|c| c.to_string())
                                .collect(),
                            dra_pool_not_owned: self
                                .dra_unowned
                                .get(&(t.clone(), s.minor))
                                .map(|p| p.to_string()),
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
                        dra_claims: Vec::new(),
                        dra_pool_not_owned: None,
                    })
                    .used = render(used);
            }
        }
        let entries = self
            .entries
            .iter()
            .map(|(uid, e)| {
                let (state, assumed_for_ms) = match e.state {
                    _ if self.unknown.contains_key(uid) => ("unknown-identity", None),
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
            dra: self.dra.clone(),
        }
    }
}

impl DeviceHoldings for DeviceLedger {
    fn devices(&self) -> Option<&NodeDevices> {
        DeviceLedger::devices(self)
    }
    fn free(&self, ignore: &[PodUid]) -> FreeMap {
        DeviceLedger::free(self, ignore)
    }
    fn free_amount(&self, t: &DeviceType, minor: i32, name: &str) -> Quantity {
        DeviceLedger::free_amount(self, t, minor, name)
    }
    fn blocked(&self, ignore: &[PodUid]) -> bool {
        self.malformed > 0
            && self.entries.iter().any(|(uid, e)| {
                matches!(e.allocation, RecordedAllocation::Malformed { .. })
                    && !ignore.contains(uid)
            })
    }
    fn used(&self) -> &UsedMap {
        DeviceLedger::used(self)
    }
    fn vfs_in_use(&self, t: &DeviceType, ignore: &[PodUid]) -> BTreeMap<i32, BTreeSet<String>> {
        let mut out: BTreeMap<i32, BTreeSet<String>> = BTreeMap::new();
        for (uid, entry) in self.entries.iter() {
            if ignore.contains(uid) {
                continue;
            }
            let RecordedAllocation::Allocated(a) = &entry.allocation else {
                continue;
            };
            for alloc in a.0.get(t).into_iter().flatten() {
                for vf in alloc.extension.iter().flat_map(|e| &e.vfs) {
                    out.entry(alloc.minor)
                        .or_default()
                        .insert(vf.bus_id.clone());
                }
            }
        }
        out
    }
    fn partitions(&self) -> NodePartitions {
        match &self.devices {
            Some(d) => effective_partitions(d, self.gpu_labels),
            None => NodePartitions::default(),
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
    /// What DRA holds on this node, by device identity, and the DRA drivers that publish its
    /// CPUs (`cluster::dra`).
    #[serde(skip_serializing_if = "NodeDraHoldings::is_empty")]
    pub dra: NodeDraHoldings,
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
    /// The DRA claims (`namespace/name`) holding this device: it is not free for the extender.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dra_claims: Vec<String>,
    /// A DRA pool publishes this device and the extender does not own the pool now (no
    /// DeviceTaintRule of its in effect, or the node is handed to DRA): not free for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dra_pool_not_owned: Option<String>,
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
        Device, DeviceAllocation, DeviceInfo, DeviceSpec, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO,
    };
    use crate::model::quantity::Quantity;

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
        assert_free_amounts_are_free(&l);
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

    /// `free_amount` is each device's entry of `free(&[])`, zero where absent: over every
    /// device, every resource its capacity names, and one it does not.
    fn assert_free_amounts_are_free(l: &DeviceLedger) {
        let free = l.free(&[]);
        let devices = l.devices().expect("a Device");
        let mut checked = 0;
        for t in devices.types() {
            for slot in devices.slots(t) {
                for name in slot
                    .total
                    .keys()
                    .map(String::as_str)
                    .chain(["example.com/none"])
                {
                    let want = free
                        .get(t)
                        .and_then(|m| m.get(&slot.minor))
                        .and_then(|r| r.get(name))
                        .copied()
                        .unwrap_or(Quantity::ZERO);
                    assert_eq!(
                        l.free_amount(t, slot.minor, name),
                        want,
                        "{t} {} {name}",
                        slot.minor
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 0);
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
        assert_free_amounts_are_free(&l);
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
        let old = l.assumed_older_than(later, Duration::from_secs(30));
        assert_eq!(old, vec![(PodUid::new("old"), t0)]);
        for (uid, at) in old {
            assert!(l.remove_if_assumed_at(&uid, at));
        }
        assert_eq!(l.len(), 2);
        assert_eq!(l.used()[&DeviceType::Gpu][&0][GPU_MEMORY_RATIO], q("20"));
    }

    /// The join by PCI address: an RDMA entry whose `id` is its bus ID (and a GPU by its
    /// `topology.busID` in NVML's 8-digit form) is held by the claim whose slice names that
    /// address; ownership blocks a published slot whose pool is not owned; a slot no slice
    /// publishes is untouched.
    #[test]
    fn dra_holdings_join_any_device_type_by_bus_id() {
        use crate::cluster::dra::{DevicePool, NodeDraHoldings};
        let device: Device = serde_json::from_value(serde_json::json!({"spec": {"devices": [
            {"type": "gpu", "id": "GPU-x", "minor": 0, "health": true,
             "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100", "koordinator.sh/gpu-memory": "80Gi"},
             "topology": {"busID": "00000000:3B:00.0"}},
            {"type": "gpu", "id": "GPU-y", "minor": 1, "health": true,
             "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100", "koordinator.sh/gpu-memory": "80Gi"}},
            {"type": "rdma", "id": "0000:3d:00.0", "minor": 0, "health": true,
             "resources": {"koordinator.sh/rdma": "100"}}
        ]}}))
        .unwrap();
        let (nd, problems) = NodeDevices::from_device(&device);
        assert!(problems.is_empty(), "{problems:?}");
        let mut ledger = DeviceLedger::new();
        ledger.set_devices(Some(nd));
        let pool = DevicePool {
            driver: Arc::from("d"),
            pool: Arc::from("p"),
        };
        let claim: BTreeSet<Arc<str>> = [Arc::from("ns/c")].into();
        let gpu_bus = DeviceIdentity::pci_bus_id("0000:3b:00.0").unwrap();
        let nic_bus = DeviceIdentity::pci_bus_id("3d:00.0").unwrap();
        ledger.set_dra(NodeDraHoldings {
            held: [(nic_bus.clone(), claim.clone())].into(),
            published: [
                (nic_bus, [pool.clone()].into()),
                (gpu_bus.clone(), [pool.clone()].into()),
            ]
            .into(),
            owned: [pool.clone()].into(),
            enforced: true,
            ..Default::default()
        });
        let free = ledger.free(&[]);
        assert!(
            free[&DeviceType::Rdma][&0].is_empty(),
            "the claim holds the NIC"
        );
        assert!(!free[&DeviceType::Gpu][&0].is_empty(), "owned and unheld");
        assert!(
            !free[&DeviceType::Gpu][&1].is_empty(),
            "published by nobody"
        );
        assert_free_amounts_are_free(&ledger);
        // The pool is no longer the extender's: its published GPU is not free either.
        let mut holdings = ledger.dra().clone();
        holdings.owned.clear();
        ledger.set_dra(holdings);
        let free = ledger.free(&[]);
        assert!(free[&DeviceType::Gpu][&0].is_empty());
        assert!(!free[&DeviceType::Gpu][&1].is_empty());
        assert_free_amounts_are_free(&ledger);
        assert_eq!(
            ledger.joined_pools().collect::<Vec<_>>(),
            vec![JoinedPool {
                pool: pool.clone(),
                published: true,
                in_use: false
            }]
        );

        // Trust IV §2: the same GPU in a second driver's pool (a VFIO driver). Owning the
        // first pool is not enough: the second must carry the rule too, and until it is the
        // extender's the GPU is not free.
        let vfio = DevicePool {
            driver: Arc::from("vfio.example.com"),
            pool: Arc::from("p"),
        };
        let mut holdings = ledger.dra().clone();
        holdings.owned = [pool.clone()].into();
        holdings
            .published
            .get_mut(&gpu_bus)
            .unwrap()
            .insert(vfio.clone());
        ledger.set_dra(holdings.clone());
        assert!(ledger.free(&[])[&DeviceType::Gpu][&0].is_empty());
        let pools: Vec<DevicePool> = ledger.joined_pools().map(|j| j.pool).collect();
        assert_eq!(
            pools,
            vec![pool.clone(), vfio.clone()],
            "both pools want a rule"
        );
        holdings.owned.insert(vfio.clone());
        ledger.set_dra(holdings.clone());
        assert!(!ledger.free(&[])[&DeviceType::Gpu][&0].is_empty());

        // Trust IV §3: the slices are gone (a kubelet restart), the pools remembered: the
        // GPU is the extender's (no slice for DRA to allocate from), and both pools stay
        // joined so their rules stay while a pod of ours holds the GPU.
        let mut holdings = NodeDraHoldings {
            enforced: true,
            ..Default::default()
        };
        holdings
            .former
            .insert(gpu_bus, [pool.clone(), vfio.clone()].into());
        ledger.set_dra(holdings);
        assert!(!ledger.free(&[])[&DeviceType::Gpu][&0].is_empty());
        let joined: Vec<JoinedPool> = ledger.joined_pools().collect();
        assert_eq!(joined.len(), 2);
        assert!(joined.iter().all(|j| !j.published && !j.in_use));
    }
}
