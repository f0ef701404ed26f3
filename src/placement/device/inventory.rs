//! What a node's `Device` object offers ([`NodeDevices`], per type and minor) and the
//! read-only interface the allocator and scorer use to see what pods hold on it
//! ([`DeviceHoldings`]).
//!
//! Placement owns these views: the caches (`cluster::devices::DeviceLedger`) implement
//! [`DeviceHoldings`] and build them, placement only reads them. Pure data: nothing here locks,
//! talks to the network or decides placement.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::partition::{NodePartitions, PartitionTable, TableError, TableSource};
use crate::model::device::{
    Device, DeviceResources, DeviceTopology, DeviceType, VirtualFunction,
    canonicalize_resource_names,
};
use crate::model::gpu_partition::{GPU_PARTITIONS, honors_partitions, parse_partition_table};
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceSlot {
    pub minor: i32,
    /// `spec.devices[].id`; copied into allocations.
    pub id: String,
    /// False for `health=false` and for entries whose resources did not parse.
    pub healthy: bool,
    /// Capacity; empty when unhealthy so nothing can ever be allocated from it.
    pub total: DeviceResources,
    pub topology: Option<DeviceTopology>,
    /// The entry's `labels` (a pod's `device-allocate-hint` selector matches them).
    pub labels: BTreeMap<String, String>,
    /// SR-IOV VF groups (`vfGroups`): a pod whose hint has a `vfSelector` gets one VF of a
    /// matching group on each device of the type.
    pub vf_groups: Vec<VfGroup>,
}

/// One `vfGroups` entry: its labels and VFs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VfGroup {
    pub labels: BTreeMap<String, String>,
    pub vfs: Vec<VirtualFunction>,
}

/// What a node's `Device` object offers, per placeable type, per minor (ascending).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeDevices {
    types: BTreeMap<DeviceType, BTreeMap<i32, DeviceSlot>>,
    /// The Device's GPU partition table (`scheduling.koordinator.sh/gpu-partitions`).
    partitions: DevicePartitions,
}

/// A Device's own GPU partition table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DevicePartitions {
    /// No annotation (or an empty one).
    #[default]
    None,
    /// The table, and whether the Device's `gpu-partition-policy` label says `Honor`.
    Table {
        table: Arc<PartitionTable>,
        honor: bool,
    },
    /// The annotation cannot be used: the node falls back to the built-in table its Node's
    /// labels select, if any (koordinator ignores a table it cannot decode).
    Invalid(TableError),
}

impl DevicePartitions {
    fn from_device(device: &Device) -> Self {
        let raw = device
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GPU_PARTITIONS))
            .filter(|v| !v.is_empty());
        let Some(raw) = raw else {
            return DevicePartitions::None;
        };
        match parse_partition_table(raw)
            .map_err(TableError::from)
            .and_then(|t| PartitionTable::new(&t))
        {
            Ok(table) => DevicePartitions::Table {
                table: Arc::new(table),
                honor: honors_partitions(device.metadata.labels.as_ref()),
            },
            Err(e) => DevicePartitions::Invalid(e),
        }
    }
}

/// What a Node's labels say of GPU partitions: koordinator's built-in Hopper table applies
/// (GPU model H100/H800/H20, vendor NVIDIA or unset) and the Node's policy label honours it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeGpuLabels {
    pub builtin_hopper: bool,
    pub honor: bool,
}

impl NodeGpuLabels {
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Self {
        NodeGpuLabels {
            builtin_hopper: crate::model::gpu_partition::has_builtin_hopper_table(labels),
            honor: honors_partitions(Some(labels)),
        }
    }
}

/// The partitions a node's GPUs are allocated by: its Device's table if it has a valid one
/// (with the Device's policy), else the built-in one its Node's labels select (with the Node's
/// policy), else none (koordinator `GPUAllocator.Allocate`).
pub fn effective_partitions(devices: &NodeDevices, labels: NodeGpuLabels) -> NodePartitions {
    match &devices.partitions {
        DevicePartitions::Table { table, honor } => NodePartitions {
            table: Some((table.clone(), TableSource::Device)),
            honor: *honor,
        },
        DevicePartitions::None | DevicePartitions::Invalid(_) => NodePartitions {
            table: labels
                .builtin_hopper
                .then(|| (PartitionTable::hopper(), TableSource::BuiltInHopper)),
            honor: labels.honor,
        },
    }
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
    #[error("annotation {GPU_PARTITIONS} ignored: {0}")]
    PartitionTable(TableError),
}

impl DeviceProblem {
    /// Short label for metrics.
    pub fn class(&self) -> &'static str {
        match self {
            DeviceProblem::MissingMinor { .. } => "missing_minor",
            DeviceProblem::NegativeMinor { .. } => "negative_minor",
            DeviceProblem::DuplicateMinor { .. } => "duplicate_minor",
            DeviceProblem::InvalidResource { .. } => "invalid_resource",
            DeviceProblem::PartitionTable(_) => "invalid_partition_table",
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
                    labels: info.labels.clone().unwrap_or_default(),
                    vf_groups: info
                        .vf_groups
                        .iter()
                        .map(|g| VfGroup {
                            labels: g.labels.clone().unwrap_or_default(),
                            vfs: g.vfs.clone(),
                        })
                        .collect(),
                },
            );
        }
        types.retain(|_, m| !m.is_empty());
        let partitions = DevicePartitions::from_device(device);
        if let DevicePartitions::Invalid(e) = &partitions {
            problems.push(DeviceProblem::PartitionTable(e.clone()));
        }
        (NodeDevices { types, partitions }, problems)
    }

    /// The Device's own partition table.
    pub fn partitions(&self) -> &DevicePartitions {
        &self.partitions
    }

    /// With a partition table (tests, offline fixtures).
    pub fn with_partitions(mut self, partitions: DevicePartitions) -> Self {
        self.partitions = partitions;
        self
    }

    /// Builds directly from slots (tests, offline fixtures). Later duplicates are ignored.
    pub fn from_slots(slots: impl IntoIterator<Item = (DeviceType, DeviceSlot)>) -> Self {
        let mut types: BTreeMap<DeviceType, BTreeMap<i32, DeviceSlot>> = BTreeMap::new();
        for (t, s) in slots {
            types.entry(t).or_default().entry(s.minor).or_insert(s);
        }
        NodeDevices {
            types,
            partitions: DevicePartitions::None,
        }
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

/// Used resources per type, per minor.
pub type UsedMap = BTreeMap<DeviceType, BTreeMap<i32, DeviceResources>>;
/// Free resources per placeable type, per minor present in the node's devices.
pub type FreeMap = BTreeMap<DeviceType, BTreeMap<i32, DeviceResources>>;

/// What the full allocator and scorer read of one node: the devices its `Device` object
/// offers and what pods hold. Implemented by the caches' ledger; never mutated through here.
pub trait DeviceHoldings {
    /// `None` when the node has no `Device` object.
    fn devices(&self) -> Option<&NodeDevices>;
    /// Free per placeable type and minor, with the holdings of `ignore` (preemption victims)
    /// released. A copy.
    fn free(&self, ignore: &[PodUid]) -> FreeMap;
    /// One device's free amount of one resource, with nothing released: its entry in
    /// [`Self::free`], zero when absent.
    fn free_amount(&self, t: &DeviceType, minor: i32, name: &str) -> Quantity {
        self.free(&[])
            .get(t)
            .and_then(|m| m.get(&minor))
            .and_then(|r| r.get(name))
            .copied()
            .unwrap_or(Quantity::ZERO)
    }
    /// Whether a malformed holding outside `ignore` blocks every device of the node.
    fn blocked(&self, ignore: &[PodUid]) -> bool;
    /// Used per type and minor over every holding.
    fn used(&self) -> &UsedMap;
    /// The GPU partitions allocations follow ([`effective_partitions`]).
    fn partitions(&self) -> NodePartitions;
    /// Per minor of type `t`, the bus IDs of the VFs holdings outside `ignore` have.
    fn vfs_in_use(&self, t: &DeviceType, ignore: &[PodUid]) -> BTreeMap<i32, BTreeSet<String>>;
}
