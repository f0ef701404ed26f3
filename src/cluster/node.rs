//! One node's state ([`NodeState`]: its Node record, pods, device and CPU ledgers) and the
//! entry that holds it behind its own lock ([`NodeEntry`]); the facts it publishes to the read
//! snapshot and its debug JSON.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::Serialize;

use super::cpus::{CpuLedger, RecordedCpus};
use super::devices::{
    DeviceHoldings, DeviceLedger, EntryState, FreeMap, NodeDevices, RecordedAllocation,
};
use super::pod::PodRecord;
use super::records::{CpuAmplificationRatio, NodeRecord, TopologyRecord};
use super::snapshot::{CpuFacts, DeviceFacts, NodeSummary, PartitionFacts, Unusable};
use crate::model::device::DeviceAllocations;
use crate::model::ids::PodUid;
use crate::model::resource_names::ResourceNameSet;
use crate::placement::cpu::{Amplification, AmplifiedCpu};
use crate::placement::device::partition::NodePartitions;
use crate::placement::device::request::PodDeviceRequest;

/// Everything known about one node. Guarded by the node's own lock. A clone is a private
/// what-if copy (see [`Self::hold`]): nothing publishes it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NodeState {
    /// The Node object; `None` until it arrives or after it is deleted.
    pub node: Option<NodeRecord>,
    /// Shared with the NRT sync's store (one copy per NRT).
    pub topology: Option<Arc<TopologyRecord>>,
    /// Device totals (from the Device object) and who holds what (by pod UID). Written only
    /// by the caches (`cluster`): the sync's events, and a bind's [`ClusterState::assume`] and
    /// its release; read through [`Self::device_ledger`].
    ///
    /// [`ClusterState::assume`]: super::ClusterState::assume
    #[serde(skip)]
    pub(super) devices: DeviceLedger,
    /// CPU topology (from the NRT and labels) and who holds which CPUs (by pod UID); written
    /// as [`Self::devices`] is, read through [`Self::cpu_ledger`].
    #[serde(skip)]
    pub(super) cpus: CpuLedger,
    /// Assigned, non-terminal pods on this node, by UID. The records are shared with the pod
    /// sync's store (one copy per pod).
    pub pods: BTreeMap<PodUid, Arc<PodRecord>>,
    /// The CPU requests (millicores) of pods a bind assumed here, until the watch lists them
    /// in `pods`: the amplification check counts them while their ledger entry is assumed.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) assumed_cpu_milli: BTreeMap<PodUid, i64>,
    /// The managed resource names some DeviceClass maps to DRA (KEP-5004), the same on every
    /// node: where the Node does not advertise one, kube-scheduler serves it through DRA.
    #[serde(skip)]
    pub dra_extended: ResourceNameSet,
    /// The cluster-wide version of this state's last change (see [`super::snapshot`]).
    #[serde(skip)]
    pub(super) version: u64,
    /// Set (under this lock, while the map's write lock is held) when the entry is removed
    /// from the map. A writer that looked the entry up before that and locked it after must
    /// not write here: its write would be lost with the entry. See [`ClusterState::gc`].
    #[serde(skip)]
    pub(super) dead: bool,
}

impl NodeState {
    /// Who holds which devices here.
    pub fn device_ledger(&self) -> &DeviceLedger {
        &self.devices
    }

    /// Who holds which CPUs here.
    pub fn cpu_ledger(&self) -> &CpuLedger {
        &self.cpus
    }

    /// Records a bind's decision as assumed in every ledger, with one instant: the twin of
    /// [`Self::remove_if_assumed_at`]. `cpu_milli`: the pod's CPU request, which the
    /// amplification check counts until the watch lists the pod here.
    pub(super) fn record_assumed(
        &mut self,
        uid: &PodUid,
        devices: Option<DeviceAllocations>,
        cpus: Option<RecordedCpus>,
        cpu_milli: i64,
        at: std::time::Instant,
    ) {
        if let Some(allocation) = devices {
            self.devices.record(
                uid.clone(),
                RecordedAllocation::Allocated(allocation),
                EntryState::Assumed { at },
            );
        }
        if let Some(recorded) = cpus {
            self.cpus
                .record(uid.clone(), recorded, EntryState::Assumed { at });
        }
        if cpu_milli > 0 {
            self.assumed_cpu_milli.insert(uid.clone(), cpu_milli);
        }
    }

    /// Records, on a private copy of the state, what a pod that is not bound yet would hold:
    /// filter decides a pod against the capacity held for nominated pods this way
    /// (`crate::scheduler::nominated`). The entries read as assumed now.
    pub fn hold(
        &mut self,
        uid: &PodUid,
        devices: Option<DeviceAllocations>,
        cpus: Option<RecordedCpus>,
        cpu_milli: i64,
    ) {
        self.record_assumed(uid, devices, cpus, cpu_milli, std::time::Instant::now());
    }

    /// The ledgers, writable, for tests that build a node's state by hand.
    #[cfg(test)]
    pub(crate) fn ledgers_for_test(
        &mut self,
    ) -> (
        &mut DeviceLedger,
        &mut CpuLedger,
        &mut BTreeMap<PodUid, i64>,
    ) {
        (
            &mut self.devices,
            &mut self.cpus,
            &mut self.assumed_cpu_milli,
        )
    }
    /// The node's facts for the read snapshot: its cached CPU summary and a freshly built
    /// device index.
    pub fn summary(&self) -> NodeSummary {
        let (devices, slots, sums, partitions) = match self.devices.devices() {
            None => (
                DeviceFacts::Missing {
                    held: !self.devices.is_empty(),
                    advertised: self.node.as_ref().map(|n| n.deviceless_advertised),
                },
                Vec::new(),
                Default::default(),
                None,
            ),
            Some(node_devices) => {
                // One free map for the index and the partition facts.
                let free = self.devices.free(&[]);
                let node_partitions = self.devices.partitions();
                let honor = node_partitions.honor;
                let partitions = self.partition_facts(node_devices, &free, node_partitions);
                match self.devices.device_index_from(&free) {
                    None => (
                        DeviceFacts::Unindexed,
                        Vec::new(),
                        Default::default(),
                        partitions,
                    ),
                    Some(index) => (
                        DeviceFacts::Indexed {
                            blocked: index.blocked,
                            ranges: index.ranges,
                            honors_partitions: honor,
                        },
                        index.groups,
                        index.sums,
                        partitions,
                    ),
                }
            }
        };
        let cpu = CpuFacts {
            constrains_plain_pods: self.cpus.constrains_plain_pods(),
            amplification: self.amplification(&[]),
            bind_policy: self.cpus.bind_policy(),
            summary: self.cpus.summary().map_err(|u| Unusable {
                reason: u.reason,
                unresolvable: u.unresolvable,
            }),
        };
        let free_cpu_milli = self.node.as_ref().map(|n| {
            n.allocatable_milli_cpu()
                .saturating_sub(self.requested_milli_cpu(&[]))
        });
        NodeSummary::new(
            devices,
            slots,
            sums,
            partitions,
            self.dra_served(),
            cpu,
            free_cpu_milli,
        )
    }

    /// Whether plain pods (no cpuset wish, no NUMA policy) must be checked here: the node
    /// forces a bind policy or a NUMA policy, or amplifies its CPU.
    pub fn checks_plain_pods(&self) -> bool {
        self.cpus.constrains_plain_pods()
            || self
                .node
                .as_ref()
                .is_some_and(|n| !n.cpu_amplification.is_off())
    }

    /// Places the pods holding devices of unknown identity (issue 36 §4): a bound pod that asks
    /// for managed devices and carries no annotation holds that much capacity, on cards nobody
    /// recorded. Its entry is placed, in UID order, where the device allocator would put it
    /// against everything known (so the node has exactly that much less), from the current
    /// state alone (a restarted replica places it identically). One that no longer fits makes
    /// the node's devices unallocatable, as a malformed annotation does: the node is then
    /// over-committed and nothing it offers can be trusted. Without a Device object there is
    /// nothing to place: device plugins own such a node.
    pub(super) fn place_unknown_holders(&mut self) {
        if self.devices.unknown().is_empty() {
            return;
        }
        self.devices.remove_unknown_entries();
        if self.devices.devices().is_none() {
            return;
        }
        let unknown: Vec<(PodUid, Arc<PodDeviceRequest>)> = self
            .devices
            .unknown()
            .iter()
            .map(|(uid, req)| (uid.clone(), Arc::clone(req)))
            .collect();
        let scoring = crate::placement::device::score::DeviceScoring::default();
        for (uid, request) in unknown {
            let entry = match crate::placement::device::allocate::fit_with(
                &self.devices,
                &request,
                &[],
                &scoring,
            ) {
                Ok(allocations) if allocations.is_empty() => continue,
                Ok(allocations) => RecordedAllocation::Allocated(allocations),
                Err(e) => RecordedAllocation::Malformed {
                    reason: format!(
                        "pod holds devices of unknown identity (no device-allocated annotation) beyond what is free: {e}"
                    ),
                },
            };
            self.devices.record(uid, entry, EntryState::Committed);
        }
    }

    /// The node's CPU under its amplification ratio, with `ignore`'s pods (preemption victims)
    /// gone: allocatable from the Node, the CPU requests of the pods here and of those a bind
    /// assumed here, and the CPUs cpusets hold.
    pub fn amplification(&self, ignore: &[PodUid]) -> Amplification {
        let Some(node) = &self.node else {
            return Amplification::Off;
        };
        let ratio = match &node.cpu_amplification {
            CpuAmplificationRatio::Off => return Amplification::Off,
            CpuAmplificationRatio::Invalid(_) => return Amplification::Invalid,
            CpuAmplificationRatio::Ratio(r) => *r,
        };
        let requested = self.requested_milli_cpu(ignore);
        let cpuset_cpus = if ignore.is_empty() {
            self.cpus.allocated().len()
        } else {
            self.cpus.allocated_without(ignore).len()
        };
        Amplification::On(AmplifiedCpu::new(
            ratio,
            node.allocatable_milli_cpu(),
            requested,
            cpuset_cpus,
        ))
    }

    /// The CPU (millicores) the pods here request, with those a bind assumed here and not
    /// yet listed, `ignore`'s pods (preemption victims) left out.
    pub fn requested_milli_cpu(&self, ignore: &[PodUid]) -> i64 {
        let listed: i64 = self
            .pods
            .iter()
            .filter(|(uid, _)| !ignore.contains(uid))
            .map(|(_, pod)| pod.requests.get("cpu").map_or(0, |q| q.milli_value()))
            .fold(0, i64::saturating_add);
        let assumed: i64 = self
            .assumed_cpu_milli
            .iter()
            // A listed pod's record is dropped here when the watch lists it (`record_pod`);
            // one whose bind was rolled back or released has no assumed entry left.
            .filter(|(uid, _)| {
                !ignore.contains(uid)
                    && matches!(self.entry_state(uid), Some(EntryState::Assumed { .. }))
            })
            .map(|(_, milli)| *milli)
            .fold(0, i64::saturating_add);
        listed.saturating_add(assumed)
    }

    /// The partition step's facts for the read verbs, on a node with GPUs and a partition
    /// table or a policy that honours one. `None` elsewhere: there a pod's own
    /// `gpu-partition-spec` meets no table.
    fn partition_facts(
        &self,
        devices: &NodeDevices,
        free: &FreeMap,
        node: NodePartitions,
    ) -> Option<Arc<PartitionFacts>> {
        use crate::placement::device::allocate::{healthy_gpus, used_gpus};
        if node.table.is_none() && !node.honor {
            return None;
        }
        let gpu = crate::model::device::DeviceType::Gpu;
        let memory = crate::model::device::GPU_MEMORY;
        Some(Arc::new(PartitionFacts {
            used: used_gpus(devices, free, &self.devices),
            total: healthy_gpus(devices.slots(&gpu)),
            exact: devices
                .slots(&gpu)
                .all(|s| !s.healthy || s.total.contains_key(memory)),
            node,
        }))
    }

    /// Everything known about the node as JSON, ledger included (for `/debug/nodes`).
    pub fn debug_json(&self, now: std::time::Instant) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = v.as_object_mut() {
            map.insert(
                "devices".into(),
                serde_json::to_value(self.devices.debug_view(now)).unwrap_or_default(),
            );
            map.insert(
                "cpus".into(),
                serde_json::to_value(self.cpus.debug_view()).unwrap_or_default(),
            );
        }
        v
    }

    /// Assumed entries (device or CPU) older than `ttl`: one pod UID, one lifecycle, whichever
    /// ledgers it holds something in.
    pub fn assumed_older_than(
        &self,
        now: std::time::Instant,
        ttl: std::time::Duration,
    ) -> Vec<(PodUid, std::time::Instant)> {
        let mut out = self.devices.assumed_older_than(now, ttl);
        for c in self.cpus.assumed_older_than(now, ttl) {
            if !out.contains(&c) {
                out.push(c);
            }
        }
        out
    }

    /// The state of `uid`'s entry, whichever ledger holds it (both share one `at`).
    pub fn entry_state(&self, uid: &PodUid) -> Option<EntryState> {
        self.devices
            .get(uid)
            .map(|e| e.state)
            .or_else(|| self.cpus.get(uid).map(|e| e.state))
    }

    /// Whether any ledger of this node holds `uid` as committed (seen bound here by the watch).
    pub fn holds_committed(&self, uid: &PodUid) -> bool {
        let committed = |s: Option<EntryState>| s == Some(EntryState::Committed);
        committed(self.devices.get(uid).map(|e| e.state))
            || committed(self.cpus.get(uid).map(|e| e.state))
    }

    /// Removes `uid`'s entries in every ledger, only if they are still the ones assumed at `at`.
    pub(super) fn remove_if_assumed_at(&mut self, uid: &PodUid, at: std::time::Instant) -> bool {
        let d = self.devices.remove_if_assumed_at(uid, at);
        let c = self.cpus.remove_if_assumed_at(uid, at);
        if d || c {
            self.assumed_cpu_milli.remove(uid);
        }
        d || c
    }

    /// Drops `uid`'s assumed entries in every ledger (a failed bind); committed ones stay.
    #[cfg(test)]
    pub(crate) fn remove_assumed(&mut self, uid: &PodUid) {
        if matches!(
            self.devices.get(uid).map(|e| e.state),
            Some(EntryState::Assumed { .. })
        ) {
            self.devices.remove(uid);
        }
        if matches!(
            self.cpus.get(uid).map(|e| e.state),
            Some(EntryState::Assumed { .. })
        ) {
            self.cpus.remove(uid);
        }
        self.assumed_cpu_milli.remove(uid);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.node.is_none()
            && self.topology.is_none()
            && self.devices.devices().is_none()
            && self.devices.is_empty()
            && self.cpus.is_empty()
            && self.pods.is_empty()
            && self.assumed_cpu_milli.is_empty()
            && self.devices.dra().is_empty()
    }

    /// The managed names kube-scheduler serves through DRA on this node (KEP-5004): mapped by
    /// a DeviceClass and not advertised by the Node (all of them while no Node is cached).
    pub fn dra_served(&self) -> ResourceNameSet {
        match &self.node {
            Some(n) => self.dra_extended.without(n.advertised),
            None => self.dra_extended,
        }
    }
}

/// A node's state behind its own lock, named.
#[derive(Debug)]
pub struct NodeEntry {
    pub name: Arc<str>,
    state: RwLock<NodeState>,
}

impl NodeEntry {
    /// An empty node state for `name`.
    pub(super) fn new(name: &str, dra_extended: ResourceNameSet) -> Self {
        NodeEntry {
            name: Arc::from(name),
            state: RwLock::new(NodeState {
                dra_extended,
                ..NodeState::default()
            }),
        }
    }

    pub fn read(&self) -> parking_lot::RwLockReadGuard<'_, NodeState> {
        self.state.read()
    }
    /// Private to the caches: every write goes through [`ClusterState`], which publishes it
    /// to the read snapshot.
    pub(super) fn write(&self) -> parking_lot::RwLockWriteGuard<'_, NodeState> {
        self.state.write()
    }
}
