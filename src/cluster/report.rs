//! The operator's view of the caches: per node, every device (GPU, RDMA, FPGA) with its
//! health, topology, use and holders, and a cluster summary.
//!
//! This is the one place the view is computed. `inspect` (from a cluster file, a kubeconfig or
//! a running service), `simulate`'s before/after summaries, `GET /debug/nodes` and the capacity
//! gauges all call [`cluster_report`] / [`node_view`] on a [`ClusterState`], so they can never
//! disagree. It only reads (node read locks, one node at a time) and never decides placement.
//!
//! The JSON shape is documented in `docs/inspect.md` and is stable: fields are only added.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::devices::{EntryState, RecordedAllocation};
use super::{ClusterState, NodeState};
use crate::model::device::{
    DeviceResources, DeviceType, FPGA, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA,
};
use crate::model::quantity::Quantity;

/// Used and total of one resource, in whole units (bytes for memory, percent otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub used: i64,
    pub total: i64,
}

impl Usage {
    fn add(&mut self, other: Usage) {
        self.used = self.used.saturating_add(other.used);
        self.total = self.total.saturating_add(other.total);
    }
}

/// How much of a device is taken, as the scheduler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceState {
    /// Nothing allocated on it.
    WholeFree,
    /// Something allocated, something of every dimension left.
    PartlyUsed,
    /// Some dimension (memory, core, share) is used up, or the node is blocked by a malformed
    /// allocation annotation.
    Full,
    /// `health: false` (or unparseable resources): zero capacity; holders stay counted.
    Unhealthy,
    /// Not in the node's Device object, but recorded in a pod's allocation.
    Absent,
}

impl DeviceState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceState::WholeFree => "whole_free",
            DeviceState::PartlyUsed => "partly_used",
            DeviceState::Full => "full",
            DeviceState::Unhealthy => "unhealthy",
            DeviceState::Absent => "absent",
        }
    }
}

/// One pod's share of one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// `namespace/name`; empty when only the ledger knows the pod (an assumed bind whose pod the
    /// watch has not shown yet).
    pub pod: String,
    pub uid: String,
    /// `committed` (seen on the pod by the watch), `assumed` (recorded by a bind, unconfirmed),
    /// `unknown-identity` (a pod without an annotation, counted where the allocator would put
    /// it: the card it really uses is not known), `dra-claim` (`pod` names a DRA ResourceClaim
    /// holding the whole device) or `dra-not-owned` (`pod` names the DRA pool that publishes
    /// it, which the extender does not own now: README "Beside DRA").
    pub entry: String,
    /// GPU only.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub core_percent: Option<i64>,
    /// GPU only.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub memory_bytes: Option<i64>,
    /// RDMA and FPGA only: `koordinator.sh/rdma` / `koordinator.sh/fpga`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub share_percent: Option<i64>,
    /// The SR-IOV VFs (bus IDs) the pod holds on this device (`extension.vfs`).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub vfs: Vec<String>,
}

/// One device of one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReport {
    pub minor: i32,
    pub id: String,
    pub state: DeviceState,
    pub healthy: bool,
    /// NUMA node from the Device topology; `null` when unknown.
    pub numa: Option<i32>,
    /// PCIe switch (`pcieID`); `null` when unknown.
    pub pcie: Option<String>,
    /// GPU only: `koordinator.sh/gpu-core`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub core_percent: Option<Usage>,
    /// GPU only: `koordinator.sh/gpu-memory` in bytes.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub memory_bytes: Option<Usage>,
    /// GPU only: `koordinator.sh/gpu-memory-ratio`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub memory_ratio_percent: Option<Usage>,
    /// RDMA and FPGA only.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub share_percent: Option<Usage>,
    /// Pods holding part of it, by pod key then uid.
    pub holders: Vec<Holder>,
}

/// Everything about one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    pub name: String,
    /// The Node object is in the cache.
    pub node_object: bool,
    /// The koordinator Device object is in the cache.
    pub device_object: bool,
    /// Pods whose `device-allocated` annotation did not parse: while any is on the node, every
    /// device counts as fully used.
    pub blocked_by: Vec<String>,
    /// Pods (or UIDs) holding devices of unknown identity here: bound, asking for managed
    /// devices, without a `device-allocated` annotation. Their holdings are listed as
    /// `unknown-identity` entries where the allocator would place them.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub unknown_identity: Vec<String>,
    pub gpus: Vec<DeviceReport>,
    pub rdma: Vec<DeviceReport>,
    pub fpga: Vec<DeviceReport>,
    /// The GPU partition table whole-GPU requests follow here; absent when there is none.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub gpu_partitions: Option<PartitionReport>,
    /// CPUs from the node's NodeResourceTopology: free per NUMA node, cpusets and who holds
    /// them, reserved. `null` when the node has no NRT.
    pub cpus: Option<CpuReport>,
}

/// A node's GPU partitions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionReport {
    /// `device` (the Device's `gpu-partitions`), `builtin-hopper` (koordinator's table for
    /// H100/H800/H20 nodes) or `none` (honoured, but the node has no table).
    pub source: String,
    /// `Honor` (a whole-GPU request no free partition holds fails) or `Prefer` (it falls back
    /// to the topology rules). A pod's `gpu-partition-spec` honours partitions anyway.
    pub policy: String,
    /// Why the Device's own table was ignored, if it was.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub invalid: Option<String>,
    /// Per size (GPU count), the partitions in the order they are tried.
    pub sizes: Vec<PartitionSize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionSize {
    pub gpus: usize,
    pub partitions: Vec<PartitionRow>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRow {
    pub minors: Vec<i32>,
    pub allocation_score: i64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ring_bus_bandwidth: Option<String>,
    /// Every GPU of it is healthy and nothing is allocated from any.
    pub free: bool,
}

/// The partitions view of one node; `None` when whole-GPU requests follow no table and no
/// policy honours one, and the Device's table (if any) is valid.
fn partition_view(state: &NodeState) -> Option<PartitionReport> {
    use crate::cluster::devices::{DeviceHoldings, DevicePartitions};
    use crate::placement::device::partition::TableSource;
    let ledger = &state.devices;
    let devices = ledger.devices()?;
    let invalid = match devices.partitions() {
        DevicePartitions::Invalid(e) => Some(e.to_string()),
        _ => None,
    };
    let effective = ledger.partitions();
    if effective.table.is_none() && !effective.honor && invalid.is_none() {
        return None;
    }
    let free = ledger.free(&[]);
    let gpu_free = free.get(&DeviceType::Gpu);
    let whole = |minor: i32| {
        devices
            .slot(&DeviceType::Gpu, minor)
            .is_some_and(|s| s.healthy && gpu_free.and_then(|f| f.get(&minor)) == Some(&s.total))
    };
    let (source, sizes) = match &effective.table {
        None => ("none", Vec::new()),
        Some((table, source)) => (
            match source {
                TableSource::Device => "device",
                TableSource::BuiltInHopper => "builtin-hopper",
            },
            table
                .sizes()
                .map(|(gpus, groups)| PartitionSize {
                    gpus,
                    partitions: groups
                        .iter()
                        .flat_map(|g| &g.partitions)
                        .map(|p| PartitionRow {
                            minors: p.minors.clone(),
                            allocation_score: p.allocation_score,
                            ring_bus_bandwidth: p.ring_bus_bandwidth.map(|q| q.to_string()),
                            free: p.minors.iter().all(|m| whole(*m)),
                        })
                        .collect(),
                })
                .collect(),
        ),
    };
    Some(PartitionReport {
        source: source.to_string(),
        policy: if effective.honor { "Honor" } else { "Prefer" }.to_string(),
        invalid,
        sizes,
    })
}

/// The CPU half of a node: what koordlet's NRT says and what pods hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuReport {
    /// Every CPU of the node (Linux list form); `null` when the `cpu-topology` annotation is
    /// absent or malformed.
    pub cpus: Option<String>,
    /// Never handed out: kubelet reserved, kubelet-static pods, node reservation, system QoS.
    pub reserved: String,
    /// Held by some pod's cpuset.
    pub allocated: String,
    /// The node's effective NUMA policy (`None`, `BestEffort`, `Restricted`, `SingleNUMANode`).
    pub numa_policy: String,
    /// Why cpuset pods cannot land here; `null` when they can.
    pub unusable: Option<String>,
    /// The CPU amplification ratio's check (`node.koordinator.sh/resource-amplification-ratio`
    /// above 1, or one that does not parse); absent on nodes that do not amplify.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub amplification: Option<AmplificationReport>,
    /// One row per NUMA node (NRT zone), by id.
    pub numa: Vec<NumaCpuView>,
    /// Pods holding a cpuset or NUMA shares here, by pod key then uid.
    pub holders: Vec<CpuHolder>,
}

/// A node's CPU under its amplification ratio, as filter checks it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AmplificationReport {
    /// The CPU ratio as the annotation gives it; `null` when the annotation does not parse.
    pub ratio: Option<String>,
    /// Why the annotation does not parse (every pod with a CPU request is refused here).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub invalid: Option<String>,
    /// The Node's allocatable CPU (already amplified by koord-manager), milli-CPUs.
    pub allocatable_milli: i64,
    /// What a pod without a cpuset may still request here: allocatable less the pods'
    /// requests, with the CPUs cpusets hold counted × the ratio (a cpuset pod needs its CPUs ×
    /// the ratio of it). `null` when the annotation does not parse.
    pub free_milli: Option<i64>,
}

/// The amplification view of one node; `None` when it does not amplify its CPU.
fn amplification_view(state: &NodeState) -> Option<AmplificationReport> {
    use crate::cluster::records::CpuAmplificationRatio;
    let node = state.node.as_ref()?;
    let (ratio, invalid) = match &node.cpu_amplification {
        CpuAmplificationRatio::Off => return None,
        CpuAmplificationRatio::Ratio(r) => (Some(r.get().to_string()), None),
        CpuAmplificationRatio::Invalid(e) => (None, Some(e.clone())),
    };
    let free_milli = match state.amplification(&[]) {
        crate::placement::cpu::Amplification::On(a) => Some(a.free_milli),
        _ => None,
    };
    Some(AmplificationReport {
        ratio,
        invalid,
        allocatable_milli: node.allocatable_milli_cpu(),
        free_milli,
    })
}

/// One NUMA node: free CPUs and what its pods' `numaNodeResources` take of its allocatable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaCpuView {
    pub id: u32,
    /// CPUs of this NUMA node neither reserved nor in a cpuset; `null` without a topology.
    pub free_cpus: Option<String>,
    /// milli-CPUs.
    pub cpu_milli: Usage,
    pub memory_bytes: Usage,
    /// On a node whose Node amplifies its cpu or memory: the same two as NUMA placement counts
    /// them (totals × the ratios, cpuset CPUs counted amplified in `used`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub amplified: Option<AmplifiedNuma>,
}

/// A NUMA node's figures under the Node's amplification ratios.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AmplifiedNuma {
    pub cpu_milli: Usage,
    pub memory_bytes: Usage,
}

/// One pod's CPU entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuHolder {
    /// `namespace/name`; empty when only the ledger knows the pod.
    pub pod: String,
    pub uid: String,
    /// `committed` or `assumed`.
    pub entry: String,
    /// Linux list form; empty for a pod with NUMA shares but no cpuset.
    pub cpuset: String,
    /// `PCPULevel`, `NUMANodeLevel` or `None`.
    pub exclusive: String,
    /// NUMA ids the pod has shares on.
    pub numa: Vec<u32>,
    /// Set when the pod's `resource-status` did not parse (the node takes no cpuset pod).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub malformed: Option<String>,
}

/// The CPU view of one node; `None` without an NRT.
fn cpu_view(state: &NodeState) -> Option<CpuReport> {
    use crate::cluster::cpus::RecordedCpus;
    let ledger = &state.cpus;
    let nrt = ledger.nrt()?;
    let allocated = ledger.allocated();
    let usage = ledger.numa_usage();
    let numa = nrt
        .zones
        .iter()
        .map(|z| {
            let used = usage.get(&z.id).copied().unwrap_or_default();
            let amplified = ledger
                .amplified_zone(z, used.cpu_milli)
                .map(|a| AmplifiedNuma {
                    cpu_milli: Usage {
                        used: a.used_cpu_milli,
                        total: a.cpu_milli,
                    },
                    memory_bytes: Usage {
                        used: used.memory_bytes,
                        total: a.memory_bytes,
                    },
                });
            NumaCpuView {
                amplified,
                id: z.id,
                free_cpus: nrt.topology.as_deref().map(|t| {
                    t.numa_cpus(z.id)
                        .difference(&nrt.reserved)
                        .difference(&allocated)
                        .to_string()
                }),
                cpu_milli: Usage {
                    used: used.cpu_milli,
                    total: z.cpu_milli,
                },
                memory_bytes: Usage {
                    used: used.memory_bytes,
                    total: z.memory_bytes,
                },
            }
        })
        .collect();
    let mut holders: Vec<CpuHolder> = ledger
        .entries()
        .map(|(uid, e)| {
            let pod = state
                .pods
                .get(uid)
                .map(|p| p.key.to_string())
                .unwrap_or_default();
            let entry = match e.state {
                EntryState::Assumed { .. } => "assumed",
                EntryState::Committed => "committed",
            }
            .to_string();
            match &e.allocation {
                RecordedCpus::Allocated(a) => CpuHolder {
                    pod,
                    uid: uid.to_string(),
                    entry,
                    cpuset: a.cpuset.to_string(),
                    exclusive: format!("{:?}", a.exclusive),
                    numa: a.numa.iter().map(|n| n.numa).collect(),
                    malformed: None,
                },
                RecordedCpus::Malformed { reason } => CpuHolder {
                    pod,
                    uid: uid.to_string(),
                    entry,
                    cpuset: String::new(),
                    exclusive: String::new(),
                    numa: Vec::new(),
                    malformed: Some(reason.clone()),
                },
            }
        })
        .collect();
    holders.sort_by(|a, b| (&a.pod, &a.uid).cmp(&(&b.pod, &b.uid)));
    Some(CpuReport {
        cpus: nrt.topology.as_deref().map(|t| t.all().to_string()),
        reserved: nrt.reserved.to_string(),
        allocated: allocated.to_string(),
        numa_policy: ledger.numa_policy().as_str().to_string(),
        unusable: ledger.usable_error(),
        amplification: amplification_view(state),
        numa,
        holders,
    })
}

/// Device counts by state over the present devices of one type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCounts {
    pub total: u64,
    pub whole_free: u64,
    pub partly_used: u64,
    pub full: u64,
    pub unhealthy: u64,
}

impl StateCounts {
    fn count(&mut self, state: DeviceState) {
        match state {
            DeviceState::WholeFree => self.whole_free += 1,
            DeviceState::PartlyUsed => self.partly_used += 1,
            DeviceState::Full => self.full += 1,
            DeviceState::Unhealthy => self.unhealthy += 1,
            // Not a device of the node: shown per node, not counted.
            DeviceState::Absent => return,
        }
        self.total += 1;
    }
}

/// The cluster summary line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub nodes: u64,
    pub gpus: StateCounts,
    /// Over healthy GPUs (an unhealthy GPU has no capacity; what its pods hold is shown per node).
    pub gpu_memory_bytes: Usage,
    pub gpu_core_percent: Usage,
    /// GPU memory still free on partly used GPUs: capacity only a shared request can use.
    pub fragmentation_bytes: i64,
    pub rdma: StateCounts,
    pub fpga: StateCounts,
    /// Pods holding devices of unknown identity (bound, asking for managed devices, no
    /// annotation): counted where the allocator would place them (issue 36 §4).
    #[serde(skip_serializing_if = "is_zero_u64", default)]
    pub unknown_identity_holders: u64,
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// The whole view: summary and one entry per node, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterReport {
    pub summary: Summary,
    pub nodes: Vec<NodeReport>,
}

fn amount(r: Option<&DeviceResources>, name: &str) -> i64 {
    r.and_then(|r| r.get(name))
        .copied()
        .unwrap_or(Quantity::ZERO)
        .value()
}

fn usage(total: &DeviceResources, used: Option<&DeviceResources>, name: &str) -> Usage {
    Usage {
        used: amount(used, name),
        total: amount(Some(total), name),
    }
}

/// The view of one node, from its cached state.
pub fn node_view(name: &str, state: &NodeState) -> NodeReport {
    let ledger = &state.devices;
    let devices = ledger.devices();
    let free = ledger.free(&[]);
    let used = ledger.used();
    let blocked = ledger.has_malformed();

    let mut rows: BTreeMap<DeviceType, BTreeMap<i32, DeviceReport>> = BTreeMap::new();
    let gpu_like = |t: &DeviceType| matches!(t, DeviceType::Gpu);
    let share_name = |t: &DeviceType| match t {
        DeviceType::Rdma => RDMA,
        _ => FPGA,
    };
    if let Some(devices) = devices {
        for t in [DeviceType::Gpu, DeviceType::Rdma, DeviceType::Fpga] {
            for slot in devices.slots(&t) {
                let key = (t.clone(), slot.minor);
                // Held by a DRA claim, or published by a DRA pool the extender does not own:
                // wholly used as far as the extender is concerned (its free is empty).
                let dra = ledger.dra_blocked().contains_key(&key)
                    || ledger.dra_unowned().contains_key(&key);
                let slot_used = if dra {
                    Some(&slot.total)
                } else {
                    used.get(&t).and_then(|m| m.get(&slot.minor))
                };
                let slot_free = free.get(&t).and_then(|m| m.get(&slot.minor));
                let state = if !slot.healthy {
                    DeviceState::Unhealthy
                } else if slot_used.is_none_or(|u| u.is_empty()) && !blocked {
                    DeviceState::WholeFree
                } else if slot.total.keys().any(|dim| amount(slot_free, dim) <= 0) {
                    DeviceState::Full
                } else {
                    DeviceState::PartlyUsed
                };
                let topology = slot.topology.as_ref();
                let (core, memory, ratio, share) = if gpu_like(&t) {
                    (
                        Some(usage(&slot.total, slot_used, GPU_CORE)),
                        Some(usage(&slot.total, slot_used, GPU_MEMORY)),
                        Some(usage(&slot.total, slot_used, GPU_MEMORY_RATIO)),
                        None,
                    )
                } else {
                    (
                        None,
                        None,
                        None,
                        Some(usage(&slot.total, slot_used, share_name(&t))),
                    )
                };
                rows.entry(t.clone()).or_default().insert(
                    slot.minor,
                    DeviceReport {
                        minor: slot.minor,
                        id: slot.id.clone(),
                        state,
                        healthy: slot.healthy,
                        numa: topology.map(|t| t.node_id).filter(|n| *n >= 0),
                        pcie: topology
                            .map(|t| t.pcie_id.clone())
                            .filter(|p| !p.is_empty()),
                        core_percent: core,
                        memory_bytes: memory,
                        memory_ratio_percent: ratio,
                        share_percent: share,
                        holders: Vec::new(),
                    },
                );
            }
        }
    }

    let mut blocked_by = Vec::new();
    let pod_name = |uid: &crate::model::ids::PodUid| {
        state
            .pods
            .get(uid)
            .map(|p| p.key.to_string())
            .unwrap_or_else(|| uid.to_string())
    };
    let mut unknown_identity: Vec<String> = ledger.unknown().keys().map(pod_name).collect();
    unknown_identity.sort();
    for (uid, entry) in ledger.entries() {
        let pod = state
            .pods
            .get(uid)
            .map(|p| p.key.to_string())
            .unwrap_or_default();
        let entry_state = match entry.state {
            _ if ledger.unknown().contains_key(uid) => "unknown-identity",
            EntryState::Assumed { .. } => "assumed",
            EntryState::Committed => "committed",
        };
        let allocations = match &entry.allocation {
            RecordedAllocation::Allocated(a) => a,
            RecordedAllocation::Malformed { .. } => {
                blocked_by.push(if pod.is_empty() {
                    uid.to_string()
                } else {
                    pod.clone()
                });
                continue;
            }
        };
        for (t, list) in &allocations.0 {
            if !matches!(t, DeviceType::Gpu | DeviceType::Rdma | DeviceType::Fpga) {
                continue;
            }
            for a in list {
                let row = rows
                    .entry(t.clone())
                    .or_default()
                    .entry(a.minor)
                    .or_insert_with(|| absent_row(t, a.minor, used));
                let r = Some(&a.resources);
                row.holders.push(Holder {
                    pod: pod.clone(),
                    uid: uid.to_string(),
                    entry: entry_state.to_string(),
                    core_percent: gpu_like(t).then(|| amount(r, GPU_CORE)),
                    memory_bytes: gpu_like(t).then(|| amount(r, GPU_MEMORY)),
                    share_percent: (!gpu_like(t)).then(|| amount(r, share_name(t))),
                    vfs: a
                        .extension
                        .iter()
                        .flat_map(|e| &e.vfs)
                        .map(|vf| vf.bus_id.clone())
                        .collect(),
                });
            }
        }
    }
    // What DRA holds, and what it publishes that the extender does not own now, as holders.
    let dra_holder = |pod: String, entry: &str| Holder {
        pod,
        uid: String::new(),
        entry: entry.to_string(),
        core_percent: None,
        memory_bytes: None,
        share_percent: None,
        vfs: Vec::new(),
    };
    for ((t, minor), claims) in ledger.dra_blocked() {
        if let Some(row) = rows.get_mut(t).and_then(|r| r.get_mut(minor)) {
            for c in claims {
                row.holders
                    .push(dra_holder(format!("claim {c}"), "dra-claim"));
            }
        }
    }
    for ((t, minor), pool) in ledger.dra_unowned() {
        if let Some(row) = rows.get_mut(t).and_then(|r| r.get_mut(minor)) {
            row.holders
                .push(dra_holder(format!("DRA pool {pool}"), "dra-not-owned"));
        }
    }
    blocked_by.sort();
    let mut take = |t: DeviceType| -> Vec<DeviceReport> {
        let mut list: Vec<DeviceReport> =
            rows.remove(&t).unwrap_or_default().into_values().collect();
        for d in &mut list {
            d.holders
                .sort_by(|a, b| (&a.pod, &a.uid).cmp(&(&b.pod, &b.uid)));
        }
        list
    };
    NodeReport {
        name: name.to_string(),
        node_object: state.node.is_some(),
        device_object: devices.is_some(),
        blocked_by,
        unknown_identity,
        gpus: take(DeviceType::Gpu),
        rdma: take(DeviceType::Rdma),
        fpga: take(DeviceType::Fpga),
        gpu_partitions: partition_view(state),
        cpus: cpu_view(state),
    }
}

/// A minor only an allocation names (the Device object lost it, or never had it).
fn absent_row(t: &DeviceType, minor: i32, used: &crate::cluster::devices::UsedMap) -> DeviceReport {
    let none = DeviceResources::new();
    let slot_used = used.get(t).and_then(|m| m.get(&minor));
    let gpu = matches!(t, DeviceType::Gpu);
    let share = if matches!(t, DeviceType::Rdma) {
        RDMA
    } else {
        FPGA
    };
    DeviceReport {
        minor,
        id: String::new(),
        state: DeviceState::Absent,
        healthy: false,
        numa: None,
        pcie: None,
        core_percent: gpu.then(|| usage(&none, slot_used, GPU_CORE)),
        memory_bytes: gpu.then(|| usage(&none, slot_used, GPU_MEMORY)),
        memory_ratio_percent: gpu.then(|| usage(&none, slot_used, GPU_MEMORY_RATIO)),
        share_percent: (!gpu).then(|| usage(&none, slot_used, share)),
        holders: Vec::new(),
    }
}

/// Adds one node to a summary.
pub fn add_to_summary(summary: &mut Summary, node: &NodeReport) {
    summary.nodes += 1;
    summary.unknown_identity_holders += node.unknown_identity.len() as u64;
    for g in &node.gpus {
        summary.gpus.count(g.state);
        if g.healthy {
            summary
                .gpu_memory_bytes
                .add(g.memory_bytes.unwrap_or_default());
            summary
                .gpu_core_percent
                .add(g.core_percent.unwrap_or_default());
        }
        if g.state == DeviceState::PartlyUsed {
            let m = g.memory_bytes.unwrap_or_default();
            summary.fragmentation_bytes = summary
                .fragmentation_bytes
                .saturating_add((m.total - m.used).max(0));
        }
    }
    for d in &node.rdma {
        summary.rdma.count(d.state);
    }
    for d in &node.fpga {
        summary.fpga.count(d.state);
    }
}

/// The summary of a list of node views.
pub fn summarize<'a>(nodes: impl IntoIterator<Item = &'a NodeReport>) -> Summary {
    let mut s = Summary::default();
    for n in nodes {
        add_to_summary(&mut s, n);
    }
    s
}

/// The view of `nodes` (all when empty); `Err` lists the named nodes the caches do not hold.
pub fn select(cluster: &ClusterState, nodes: &[String]) -> Result<ClusterReport, Vec<String>> {
    let view = cluster_report(cluster, nodes);
    let missing: Vec<String> = nodes
        .iter()
        .filter(|n| !view.nodes.iter().any(|v| &v.name == *n))
        .cloned()
        .collect();
    if missing.is_empty() {
        Ok(view)
    } else {
        Err(missing)
    }
}

/// The view of every cached node (or only those named in `only`, when it is not empty), by name.
/// Names asked for but not cached are left out; the caller reports them.
pub fn cluster_report(cluster: &ClusterState, only: &[String]) -> ClusterReport {
    let nodes: Vec<NodeReport> = cluster
        .node_names()
        .into_iter()
        .filter(|n| only.is_empty() || only.iter().any(|o| o.as_str() == &**n))
        .filter_map(|name| {
            let entry = cluster.node(&name)?;
            let state = entry.read();
            Some(node_view(&name, &state))
        })
        .collect();
    ClusterReport {
        summary: summarize(&nodes),
        nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device::DeviceAllocations;
    use crate::model::ids::PodUid;
    use crate::ops::inspect::load_cluster_file;
    use crate::sync::file_source::ClusterFile;

    const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {allocatable: {cpu: "8"}}
---
apiVersion: scheduling.koordinator.sh/v1alpha1
kind: Device
metadata: {name: n1}
spec:
  devices:
  - {type: gpu, id: g0, minor: 0, health: true, topology: {nodeID: 0, pcieID: p0},
     resources: {koordinator.sh/gpu-core: "100", koordinator.sh/gpu-memory: 16Gi, koordinator.sh/gpu-memory-ratio: "100"}}
  - {type: gpu, id: g1, minor: 1, health: false,
     resources: {koordinator.sh/gpu-core: "100", koordinator.sh/gpu-memory: 16Gi, koordinator.sh/gpu-memory-ratio: "100"}}
"#;

    fn share(minor: i32, ratio: u32) -> RecordedAllocation {
        let json = format!(
            r#"{{"gpu":[{{"minor":{minor},"resources":{{"koordinator.sh/gpu-memory-ratio":"{ratio}","koordinator.sh/gpu-memory":"{}Mi"}}}}]}}"#,
            16 * 1024 * ratio / 100
        );
        RecordedAllocation::Allocated(DeviceAllocations::parse_annotation(&json).unwrap())
    }

    fn view_after(f: impl FnOnce(&mut NodeState)) -> NodeReport {
        let loaded = load_cluster_file(ClusterFile::parse(CLUSTER, "t.yaml").unwrap());
        loaded.cluster.with_existing_node("n1", f).expect("node n1");
        cluster_report(&loaded.cluster, &[]).nodes.remove(0)
    }

    #[test]
    fn states_topology_and_assumed_holders() {
        let v = view_after(|s| {
            s.devices.record(
                PodUid::new("u-assumed"),
                share(0, 50),
                EntryState::Assumed {
                    at: std::time::Instant::now(),
                },
            );
            // Only an allocation names minor 7.
            s.devices
                .record(PodUid::new("u-gone"), share(7, 10), EntryState::Committed);
        });
        let g = |m: i32| v.gpus.iter().find(|d| d.minor == m).unwrap();
        assert_eq!(g(0).state, DeviceState::PartlyUsed);
        assert_eq!((g(0).numa, g(0).pcie.as_deref()), (Some(0), Some("p0")));
        assert_eq!(g(0).holders.len(), 1);
        let h = &g(0).holders[0];
        assert_eq!(
            (h.pod.as_str(), h.uid.as_str(), h.entry.as_str()),
            ("", "u-assumed", "assumed")
        );
        assert_eq!(h.memory_bytes, Some(8 << 30));
        assert_eq!(g(1).state, DeviceState::Unhealthy);
        assert_eq!((g(1).numa, g(1).pcie.clone()), (None, None));
        assert_eq!(g(7).state, DeviceState::Absent);
        let s = summarize([&v]);
        assert_eq!(
            (s.gpus.total, s.gpus.partly_used, s.gpus.unhealthy),
            (2, 1, 1),
            "absent minors are not devices of the node"
        );
        assert_eq!(s.fragmentation_bytes, 8 << 30);
        assert_eq!(
            s.gpu_memory_bytes,
            Usage {
                used: 8 << 30,
                total: 16 << 30
            }
        );
        let table = crate::ops::render::cluster(
            &ClusterReport {
                summary: s,
                nodes: vec![v.clone()],
            },
            false,
            false,
        );
        assert!(table.contains("uid:u-assumed [assumed]"), "{table}");
        assert!(table.contains("UNHEALTHY"), "{table}");
    }

    #[test]
    fn a_malformed_allocation_blocks_every_device_of_its_node() {
        let v = view_after(|s| {
            s.devices.record(
                PodUid::new("u-bad"),
                RecordedAllocation::Malformed {
                    reason: "not JSON".into(),
                },
                EntryState::Committed,
            );
        });
        assert_eq!(v.blocked_by, vec!["u-bad".to_string()]);
        assert_eq!(v.gpus[0].state, DeviceState::Full);
        assert_eq!(v.gpus[1].state, DeviceState::Unhealthy);
    }

    #[test]
    fn one_whole_gpu_is_full_and_a_free_one_whole_free() {
        let v = view_after(|s| {
            s.devices
                .record(PodUid::new("u"), share(0, 100), EntryState::Committed);
        });
        assert_eq!(v.gpus[0].state, DeviceState::Full);
        let v = view_after(|_| {});
        assert_eq!(v.gpus[0].state, DeviceState::WholeFree);
        assert!(v.cpus.is_none(), "a node without an NRT has no CPU columns");
    }
}
