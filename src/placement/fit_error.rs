//! Why a pod does not fit a node: one error for the device and the CPU/NUMA halves, so the
//! scheduler passes either on unchanged.
//!
//! The reason is typed ([`FitReason`]): the text kube-scheduler shows (`FailedNodes`), the
//! metric class (`dne_filter_rejected_nodes_total{reason}`) and whether it is the device or
//! the CPU half are all derived from it here, once. Before, the metric class was recovered
//! from the text by string matching, and a reworded reason silently became `other`.
//!
//! This module owns the words and the classes; it decides nothing.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::model::device::DeviceType;
use crate::model::resource_names::ResourceNameSet;

/// Why a pod does not fit a node (its devices or its CPUs/NUMA nodes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
#[error("{reason}")]
pub struct FitError {
    pub reason: FitReason,
    /// True when freeing resources can never help (no such devices, too few in total, no
    /// topology, policy conflict, SMT misalignment, a request larger than any NUMA node).
    pub unresolvable: bool,
}

impl FitError {
    pub fn new(reason: FitReason, unresolvable: bool) -> FitError {
        FitError {
            reason,
            unresolvable,
        }
    }
}

/// Why a node has no CPU topology the extender can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MissingTopology {
    NoNodeResourceTopology,
    NoCpuTopologyAnnotation,
    NoNumaZones,
}

/// Every reason a pod does not fit a node, with the data its text names. Fixed reasons render
/// to `'static` text, so rejecting a node (or repeating a memoized verdict) does not allocate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FitReason {
    // ---- devices ----
    /// Too few devices of the type are free (or exist at all, when unresolvable).
    InsufficientDevices(DeviceType),
    /// A GPU chosen for the pod is gone or unhealthy (the state changed under the decision).
    NoHealthyGpu {
        minor: i32,
    },
    /// koordinator's reason when the node has no Device object and the pod asks for devices
    /// that the extender must place (the Device-less rule sends other cases elsewhere).
    NoDeviceObject,
    /// The node's Device object is gone while pods there still hold devices.
    DeviceObjectMissing,
    /// A node without a Device object whose Node does not advertise these asked names.
    NotAdvertised(ResourceNameSet),
    /// No Node object in the cache yet.
    NodeNotCached,
    /// A pod on the node has a device allocation that does not parse.
    MalformedDeviceAllocation,
    /// koordinator's joint-allocate rules (GPU with RDMA on one PCIe switch) cannot be met.
    JointAllocate,
    /// Too few virtual functions of the type.
    InsufficientVirtualFunctions(DeviceType),
    /// `requiredTopologyScope`: more than one shared GPU asked.
    MultiSharedGpu,
    /// `requiredTopologyScope`: the GPUs carry no topology.
    MissingGpuTopologyTree,
    /// `requiredTopologyScope`: not enough GPUs within one scope of that depth.
    InsufficientTopologyScopedGpus,
    /// GPU partitions: no free partition of the asked size.
    InsufficientGpuPartition,
    /// GPU partitions: the node has no partition table.
    MissingGpuPartitionTable,
    /// GPU partitions: no partition holds that many GPUs.
    UnsupportedGpuPartitionCount,
    /// kube-scheduler serves these names through DRA on this node, the extender the rest.
    DraSplit(ResourceNameSet),
    // ---- CPUs and NUMA ----
    CpuLargerThanNode,
    MemoryLargerThanNode,
    CpuLargerThanNuma,
    MemoryLargerThanNuma,
    LargerThanNuma,
    InsufficientCpus,
    InsufficientNumaMemory,
    CpusOnOneNuma,
    MemoryOnOneNuma,
    CpuAndMemoryOnOneNuma,
    NotOnFewestNuma,
    DevicesUnaligned,
    NoCommonNuma,
    NumaExclusive,
    /// The node's amplified CPU is exhausted.
    InsufficientAmplifiedCpu,
    /// The node's CPU amplification ratio does not parse.
    InvalidAmplificationRatio,
    /// A required pod bind policy against the node's forced one.
    CpuBindPolicyConflict {
        pod: &'static str,
        node: &'static str,
    },
    /// The pod's NUMA topology policy against the node's.
    NumaPolicyConflict {
        pod: &'static str,
        node: &'static str,
    },
    /// A fractional CPU request where CPUs are bound (by the node or the pod's wish).
    FractionalCpu {
        node_binds: bool,
    },
    /// A required FullPCPUs cpuset whose size is not a multiple of the threads per core.
    CpusNotWholeCores,
    /// No CPU topology to place a cpuset on.
    NoCpuTopology(MissingTopology),
    /// The node's NRT carries a malformed annotation.
    CpuTopologyMalformed {
        annotation: Arc<str>,
    },
    /// A pod on the node has a `resource-status` that does not parse.
    MalformedResourceStatus,
    /// A DRA driver publishes the node's CPUs.
    CpusPublishedByDra {
        drivers: Arc<str>,
    },
    /// The cpuset accumulator produced a set that breaks its own plan (a bug, logged where it
    /// is caught): the node is refused rather than the set used.
    InvalidCpuset,
    /// The pod fits only with what a pod of no lower priority, nominated to this node by
    /// kube-scheduler's preemption, is waiting for (`scheduler::nominated`): held for it.
    HeldForNominated {
        /// `namespace/name` of the first nominated pod the placement would starve.
        pod: Arc<str>,
    },
}

/// The `reason` label values of `dne_filter_rejected_nodes_total`, one per class: a fixed
/// set, so a reason with a minor number in its text cannot grow the series count.
pub const REASON_CLASSES: [&str; 29] = [
    "insufficient_gpu",
    "insufficient_rdma",
    "insufficient_fpga",
    "no_device_object",
    "device_object_missing",
    "device_not_advertised",
    "node_not_cached",
    "malformed_allocation",
    "joint_allocate",
    "invalid_request",
    "insufficient_cpu",
    "insufficient_numa_memory",
    "numa_policy_unmet",
    "numa_devices_unaligned",
    "cpu_request_too_large",
    "cpu_policy_conflict",
    "no_cpu_topology",
    "cpu_topology_unusable",
    "insufficient_amplified_cpu",
    "invalid_amplification_ratio",
    "insufficient_gpu_partition",
    "no_gpu_partition_table",
    "unsupported_gpu_partition_size",
    "insufficient_virtual_functions",
    "gpu_topology_scope_unmet",
    "dra_split",
    "cpus_published_by_dra",
    "held_for_nominated",
    "other",
];

/// The index in [`REASON_CLASSES`] of `invalid_request`: a request that does not parse is
/// refused before any node's reason exists.
pub const INVALID_REQUEST_CLASS: usize = 9;

impl FitReason {
    /// What kube-scheduler shows for the node (`FailedNodes`), koordinator's words where it
    /// has them.
    pub fn text(&self) -> Cow<'static, str> {
        use FitReason::*;
        let fixed: &'static str = match self {
            InsufficientDevices(DeviceType::Gpu) => "insufficient gpu devices",
            InsufficientDevices(DeviceType::Rdma) => "insufficient rdma devices",
            InsufficientDevices(DeviceType::Fpga) => "insufficient fpga devices",
            InsufficientDevices(t) => return format!("insufficient {t} devices").into(),
            NoHealthyGpu { minor } => {
                return format!("no healthy gpu device with minor {minor}").into();
            }
            NoDeviceObject => "node has no Device object",
            DeviceObjectMissing => "device object missing",
            NotAdvertised(names) => {
                return format!(
                    "node has no Device object and does not advertise {}",
                    names.names().collect::<Vec<_>>().join(", ")
                )
                .into();
            }
            NodeNotCached => "node not in the extender's cache yet",
            MalformedDeviceAllocation => "node has a pod with a malformed device allocation",
            JointAllocate => "device joint-allocate rules violation",
            InsufficientVirtualFunctions(t) => {
                return format!("Insufficient {t} VirtualFunctions").into();
            }
            MultiSharedGpu => "node(s) Unsupported Multi-Shared GPU",
            MissingGpuTopologyTree => "node(s) missing GPU Device Topology Tree",
            InsufficientTopologyScopedGpus => "Insufficient Topology Scoped GPU Devices",
            InsufficientGpuPartition => "Insufficient Partitioned GPU Devices",
            MissingGpuPartitionTable => "node(s) missing GPU Partition Table",
            UnsupportedGpuPartitionCount => "node(s) Unsupported number of GPU requests",
            DraSplit(names) => {
                return format!(
                    "kube-scheduler serves {} through DRA on this node (a DeviceClass maps it and the node does not advertise it) and the extender the rest: one pod's devices are not split between two allocators",
                    names.names().collect::<Vec<_>>().join(", ")
                )
                .into();
            }
            CpuLargerThanNode => "cpu request larger than the node",
            MemoryLargerThanNode => "memory request larger than the node's NUMA nodes",
            CpuLargerThanNuma => "cpu request larger than any NUMA node",
            MemoryLargerThanNuma => "memory request larger than any NUMA node",
            LargerThanNuma => "cpu and memory request larger than any NUMA node",
            InsufficientCpus => "insufficient free cpus",
            InsufficientNumaMemory => "insufficient free memory on the NUMA nodes",
            CpusOnOneNuma => "insufficient cpus on one NUMA node",
            MemoryOnOneNuma => "insufficient memory on one NUMA node",
            CpuAndMemoryOnOneNuma => "insufficient cpus and memory on one NUMA node",
            NotOnFewestNuma => "insufficient resources on the fewest NUMA nodes",
            DevicesUnaligned => "devices and cpus not on the same NUMA nodes",
            NoCommonNuma => "no NUMA nodes hold both the cpu and the memory",
            NumaExclusive => "numa exclusivity: every fitting NUMA node is shared",
            InsufficientAmplifiedCpu => "Insufficient amplified cpu",
            InvalidAmplificationRatio => "node(s) invalid CPU amplification ratio",
            CpuBindPolicyConflict { pod, node } => {
                return format!("cpu bind policy conflict: pod {pod}, node {node}").into();
            }
            NumaPolicyConflict { pod, node } => {
                return format!("numa topology policy conflict: pod {pod}, node {node}").into();
            }
            FractionalCpu { node_binds: true } => {
                "fractional cpu request on a node that binds cpus"
            }
            FractionalCpu { node_binds: false } => "cpuset needs an integer cpu request",
            CpusNotWholeCores => "cpu count not a multiple of threads per core",
            NoCpuTopology(MissingTopology::NoNodeResourceTopology) => {
                "node has no CPU topology (no NodeResourceTopology)"
            }
            NoCpuTopology(MissingTopology::NoCpuTopologyAnnotation) => {
                "node has no CPU topology (no cpu-topology annotation)"
            }
            NoCpuTopology(MissingTopology::NoNumaZones) => {
                "node has no CPU topology (no NUMA zones)"
            }
            CpuTopologyMalformed { annotation } => {
                return format!("node CPU topology unusable: malformed {annotation}").into();
            }
            MalformedResourceStatus => "node has a pod with a malformed resource-status",
            CpusPublishedByDra { drivers } => {
                return format!(
                    "DRA driver {drivers} publishes this node's CPUs: the extender gives no cpusets here"
                )
                .into();
            }
            InvalidCpuset => "internal: invalid cpuset",
            HeldForNominated { pod } => {
                return format!(
                    "capacity held for {pod}, nominated to this node by preemption (priority not lower)"
                )
                .into();
            }
        };
        Cow::Borrowed(fixed)
    }

    /// The metric class: an index into [`REASON_CLASSES`].
    pub fn class_index(&self) -> usize {
        use FitReason::*;
        match self {
            InsufficientDevices(DeviceType::Gpu) | NoHealthyGpu { .. } => 0,
            InsufficientDevices(DeviceType::Rdma) => 1,
            InsufficientDevices(DeviceType::Fpga) => 2,
            // `other`: a device type the extender does not know, or its own bug.
            InsufficientDevices(DeviceType::Other(_)) | InvalidCpuset => 28,
            NoDeviceObject => 3,
            DeviceObjectMissing => 4,
            NotAdvertised(_) => 5,
            NodeNotCached => 6,
            MalformedDeviceAllocation => 7,
            JointAllocate => 8,
            InsufficientCpus | CpusOnOneNuma => 10,
            InsufficientNumaMemory | MemoryOnOneNuma => 11,
            CpuAndMemoryOnOneNuma | NotOnFewestNuma | NumaExclusive => 12,
            DevicesUnaligned => 13,
            CpuLargerThanNode | MemoryLargerThanNode | CpuLargerThanNuma | MemoryLargerThanNuma
            | LargerThanNuma | NoCommonNuma => 14,
            CpuBindPolicyConflict { .. }
            | NumaPolicyConflict { .. }
            | FractionalCpu { .. }
            | CpusNotWholeCores => 15,
            NoCpuTopology(_) => 16,
            CpuTopologyMalformed { .. } | MalformedResourceStatus => 17,
            InsufficientAmplifiedCpu => 18,
            InvalidAmplificationRatio => 19,
            InsufficientGpuPartition => 20,
            MissingGpuPartitionTable => 21,
            UnsupportedGpuPartitionCount => 22,
            InsufficientVirtualFunctions(_) => 23,
            MultiSharedGpu | MissingGpuTopologyTree | InsufficientTopologyScopedGpus => 24,
            DraSplit(_) => 25,
            CpusPublishedByDra { .. } => 26,
            HeldForNominated { .. } => 27,
        }
    }

    /// The metric class's label value.
    pub fn class(&self) -> &'static str {
        REASON_CLASSES[self.class_index()]
    }
}

/// Tests assert the words kube-scheduler shows. Test-only on purpose: production code that
/// compared a reason with text would bring back the string matching this type replaced.
#[cfg(test)]
impl PartialEq<&str> for FitReason {
    fn eq(&self, other: &&str) -> bool {
        self.text() == *other
    }
}

impl fmt::Display for FitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of every variant (the compiler's exhaustive match in `class_index` keeps this list
    /// honest only together with this test's count: a new variant must be added here).
    fn every_reason() -> Vec<FitReason> {
        use FitReason::*;
        let names = ResourceNameSet::default();
        vec![
            InsufficientDevices(DeviceType::Gpu),
            InsufficientDevices(DeviceType::Rdma),
            InsufficientDevices(DeviceType::Fpga),
            NoHealthyGpu { minor: 3 },
            NoDeviceObject,
            DeviceObjectMissing,
            NotAdvertised(names),
            NodeNotCached,
            MalformedDeviceAllocation,
            JointAllocate,
            InsufficientVirtualFunctions(DeviceType::Rdma),
            MultiSharedGpu,
            MissingGpuTopologyTree,
            InsufficientTopologyScopedGpus,
            InsufficientGpuPartition,
            MissingGpuPartitionTable,
            UnsupportedGpuPartitionCount,
            DraSplit(names),
            CpuLargerThanNode,
            MemoryLargerThanNode,
            CpuLargerThanNuma,
            MemoryLargerThanNuma,
            LargerThanNuma,
            InsufficientCpus,
            InsufficientNumaMemory,
            CpusOnOneNuma,
            MemoryOnOneNuma,
            CpuAndMemoryOnOneNuma,
            NotOnFewestNuma,
            DevicesUnaligned,
            NoCommonNuma,
            NumaExclusive,
            InsufficientAmplifiedCpu,
            InvalidAmplificationRatio,
            CpuBindPolicyConflict {
                pod: "SpreadByPCPUs",
                node: "FullPCPUsOnly",
            },
            NumaPolicyConflict {
                pod: "SingleNUMANode",
                node: "Restricted",
            },
            FractionalCpu { node_binds: true },
            FractionalCpu { node_binds: false },
            CpusNotWholeCores,
            NoCpuTopology(MissingTopology::NoNodeResourceTopology),
            NoCpuTopology(MissingTopology::NoCpuTopologyAnnotation),
            NoCpuTopology(MissingTopology::NoNumaZones),
            CpuTopologyMalformed {
                annotation: "node.koordinator.sh/cpu-topology".into(),
            },
            MalformedResourceStatus,
            CpusPublishedByDra {
                drivers: "dra.cpu".into(),
            },
            HeldForNominated {
                pod: "ns/preemptor".into(),
            },
        ]
    }

    /// Every reason of a known resource has a class of its own (an operator alerting on
    /// `reason="other"` must not be looking at a whole product half), and its text is not
    /// empty. `other` is left to device types the extender does not know.
    #[test]
    fn every_reason_has_a_class_and_a_text() {
        let all = every_reason();
        for r in &all {
            assert_ne!(r.class(), "other", "{r:?}");
            assert_ne!(r.class(), "invalid_request", "{r:?}");
            assert!(!r.text().is_empty(), "{r:?}");
            // kube-scheduler uses the reason as its event's format string (`Eventf`): a `%`
            // turns into `%!(MISSING)` in the pod's FailedScheduling event.
            assert!(!r.text().contains('%'), "{r:?}");
        }
        let classes: std::collections::BTreeSet<&str> = all.iter().map(FitReason::class).collect();
        // Every class but `invalid_request` (refused before any node) and `other`.
        assert_eq!(classes.len(), REASON_CLASSES.len() - 2, "{classes:?}");
        assert_eq!(REASON_CLASSES[INVALID_REQUEST_CLASS], "invalid_request");
        assert_eq!(
            FitReason::InsufficientDevices(DeviceType::Other("npu".into())).class(),
            "other"
        );
    }

    /// Fixed reasons borrow their text: rejecting a node allocates nothing.
    #[test]
    fn fixed_reasons_do_not_allocate() {
        assert!(matches!(
            FitReason::InsufficientCpus.text(),
            Cow::Borrowed("insufficient free cpus")
        ));
        assert!(matches!(
            FitReason::InsufficientDevices(DeviceType::Gpu).text(),
            Cow::Borrowed(_)
        ));
    }
}
