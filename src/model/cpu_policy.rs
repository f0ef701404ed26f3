//! The CPU and NUMA policy vocabulary koordinator's annotations and labels speak, and the
//! shapes they carry (a CPU's place in the topology, a NUMA share): plain data that `model`
//! parses into and `placement` decides on. Nothing here decides anything.

use crate::model::cpuset::CpuId;

/// A NUMA node id (`node-<id>` zones, `cpu-topology` `node` field).
pub type NumaId = u32;

/// The largest number of NUMA nodes a node may have for hint enumeration (kubelet's default
/// `max-allowable-numa-nodes` is 8; subsets are bitmasks of this width).
pub const MAX_NUMA_NODES: usize = 16;

/// How a pod's CPUs are bound (`resource-spec` `requiredCPUBindPolicy` /
/// `preferredCPUBindPolicy`, after `Default` is resolved to the configured default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CpuBindPolicy {
    /// Whole physical cores (all hyperthreads of a core).
    FullPcpus,
    /// One hyperthread per physical core where possible.
    SpreadByPcpus,
}

/// A node-forced bind policy (label `node.koordinator.sh/cpu-bind-policy`, or kubelet static
/// with `full-pcpus-only`): applies to every pod with a CPU request on that node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum NodeCpuBindPolicy {
    #[default]
    None,
    FullPcpusOnly,
    SpreadByPcpus,
}

/// `preferredCPUExclusivePolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CpuExclusivePolicy {
    #[default]
    None,
    /// Avoid physical cores already holding a PCPULevel CPU.
    PcpuLevel,
    /// Avoid NUMA nodes already holding a NUMANodeLevel CPU.
    NumaNodeLevel,
}

/// A NUMA topology policy, of the node (label or NRT) or of the pod (`numa-topology-spec`).
/// Every unknown string, and `None`, means [`NumaPolicy::None`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum NumaPolicy {
    #[default]
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

impl NumaPolicy {
    /// The name koordinator's labels and the NRT use.
    pub fn as_str(self) -> &'static str {
        match self {
            NumaPolicy::None => "None",
            NumaPolicy::BestEffort => "BestEffort",
            NumaPolicy::Restricted => "Restricted",
            NumaPolicy::SingleNumaNode => "SingleNUMANode",
        }
    }
}

/// `numa-topology-spec` `singleNUMANodeExclusive`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum NumaExclusive {
    /// Defaults to Required only when the pod set a NUMA policy itself (koordinator `apis/extension/numa_aware.go`).
    #[default]
    Unset,
    Required,
    Preferred,
}

/// Accumulator order (`node.koordinator.sh/numa-allocate-strategy`): pack onto the fullest
/// NUMA node / socket first, or spread onto the emptiest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum NumaAllocateStrategy {
    MostAllocated,
    #[default]
    LeastAllocated,
}

/// One entry of `numaNodeResources`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NumaShare {
    pub numa: NumaId,
    pub cpu_milli: i64,
    pub memory_bytes: i64,
}

/// One logical CPU, as koordlet's `node.koordinator.sh/cpu-topology` `detail` entry gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CpuDetail {
    pub id: CpuId,
    /// The physical core id within its socket.
    pub core: u32,
    pub socket: u32,
    pub numa: NumaId,
}
