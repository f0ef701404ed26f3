//! NUMA-aware CPU placement (koordinator `NodeNUMAResource` semantics, `pkg/scheduler/plugins/nodenumaresource`):
//! the view types placement decides on, and (in submodules) the cpuset accumulator, the NUMA
//! split, hint generation and merge, and the NUMA policies.
//!
//! Entry points: [`place()`] (one pod on one node: cpuset, NUMA shares, device affinity, score),
//! [`score_or_zero`] for prioritize, and the filter fast path [`CpuSummary`] +
//! [`fast_feasible`] / [`fast_score`], held equal to `place` by a property test.
//!
//! | module | owns |
//! |---|---|
//! | `policy` | node × pod policy resolution and its unresolvable reasons |
//! | `hints` | per-NUMA counts, subset enumeration, hint merge with devices, NUMA policies |
//! | `split` | the NUMA split of a request over a hint |
//! | `accumulator` | which free CPUs a cpuset gets |
//! | `score` | LeastAllocated / MostAllocated |
//! | `amplified` | the node-level check under a CPU amplification ratio, and what the ratios multiply at NUMA level |
//! | `place`, `summary` | the entry points |
//!
//! Pure and deterministic. Placement owns these view types; `cluster` builds them from its
//! ledgers and `model` parses the annotations that feed them. Nothing here locks, allocates
//! per NUMA subset, or talks to the network.

pub mod accumulator;
pub(crate) mod amplified;
#[cfg(test)]
mod amplified_cases;
pub(crate) mod classify;
pub(crate) mod hints;
#[cfg(test)]
mod koord_cases;
pub(crate) mod place;
pub(crate) mod policy;
pub(crate) mod score;
pub(crate) mod split;
pub(crate) mod summary;
pub(crate) mod topology;

#[cfg(test)]
pub(crate) mod proptests;
#[cfg(test)]
pub(crate) mod tests;

pub use amplified::{Amplification, AmplifiedCpu, NumaAmplification, Ratio};
pub use place::{place, score_or_zero};
pub use summary::{CpuSummary, fast_aligned, fast_aligned_score, fast_feasible, fast_score};
pub use topology::{CpuDetail, CpuTopology, TopologyError};

pub use crate::model::cpu_policy::{
    CpuBindPolicy, CpuExclusivePolicy, MAX_NUMA_NODES, NodeCpuBindPolicy, NumaAllocateStrategy,
    NumaExclusive, NumaId, NumaPolicy, NumaShare,
};
use crate::model::cpuset::CpuSet;

/// A set of NUMA node ids as a bitmask (bit `i` = NUMA node `i`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct NumaMask(pub u16);

impl NumaMask {
    pub fn single(id: NumaId) -> Self {
        NumaMask(1 << id)
    }
    pub fn contains(self, id: NumaId) -> bool {
        (id as usize) < MAX_NUMA_NODES && self.0 & (1 << id) != 0
    }
    pub fn count(self) -> u32 {
        self.0.count_ones()
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    pub fn and(self, other: NumaMask) -> NumaMask {
        NumaMask(self.0 & other.0)
    }
    /// Ids ascending.
    pub fn ids(self) -> impl Iterator<Item = NumaId> {
        (0..MAX_NUMA_NODES as NumaId).filter(move |i| self.contains(*i))
    }
}

impl std::fmt::Debug for NumaMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.ids()).finish()
    }
}

/// Node-level and NUMA-level scoring strategy (koordinator `scoringStrategy` /
/// `numaScoringStrategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CpuScoreStrategy {
    #[default]
    LeastAllocated,
    MostAllocated,
}

/// Scoring configuration for CPU/NUMA placement (service flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuScoring {
    pub node_strategy: CpuScoreStrategy,
    pub numa_strategy: CpuScoreStrategy,
    /// Weights of cpu and memory in both scorers.
    pub cpu_weight: i64,
    pub memory_weight: i64,
    /// The policy for pods that ask for a cpuset without saying which (`Default`).
    pub default_bind_policy: CpuBindPolicy,
}

impl Default for CpuScoring {
    fn default() -> Self {
        CpuScoring {
            node_strategy: CpuScoreStrategy::LeastAllocated,
            numa_strategy: CpuScoreStrategy::LeastAllocated,
            cpu_weight: 1,
            memory_weight: 1,
            default_bind_policy: CpuBindPolicy::FullPcpus,
        }
    }
}

/// Allocatable cpu and memory of one NUMA node, reserved CPUs already subtracted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NumaZone {
    pub id: NumaId,
    pub cpu_milli: i64,
    pub memory_bytes: i64,
}

/// What one NUMA node has handed out (sum over the pods' `numaNodeResources`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NumaUsage {
    pub cpu_milli: i64,
    pub memory_bytes: i64,
    /// Pods whose cpuset or NUMA shares are confined to this NUMA node only. Count pods with
    /// NUMA shares but no cpuset too: koordinator counts only cpuset pods (a koordinator quirk), which
    /// lets an exclusive pod land beside a NUMA-bound shared-pool pod.
    pub single_numa_pods: u32,
    /// Pods whose cpuset or NUMA shares span this and other NUMA nodes.
    pub multi_numa_pods: u32,
}

/// Everything placement needs to know about one node's CPUs, with any preemption victims
/// already released by the caller. Built by `cluster` from its ledger; `Copy`-cheap apart
/// from the shared topology.
#[derive(Clone, Debug)]
pub struct NodeCpuView<'a> {
    pub topology: &'a CpuTopology,
    /// Never handed out: kubelet reserved, kubelet-static pods, node reservation, exclusive
    /// system QoS (koordinator `topology_options.go`).
    pub reserved: CpuSet,
    /// CPUs held by some pod's cpuset (reference count ≥ 1 = taken; MaxRefCount is 1).
    pub allocated: CpuSet,
    /// Free CPUs kept for NUMA nodes' shared pools: the NUMA shares of pods without a cpuset
    /// run there, so a new cpuset must not take them. Not free, but usable: the
    /// pods holding those shares may go.
    pub shared_pool: CpuSet,
    /// Held CPUs whose holder asked for PCPULevel exclusivity.
    pub pcpu_exclusive: CpuSet,
    /// Held CPUs whose holder asked for NUMANodeLevel exclusivity.
    pub numa_exclusive: CpuSet,
    /// Per NUMA node, ascending id.
    pub zones: &'a [NumaZone],
    /// Same order and length as `zones`.
    pub usage: &'a [NumaUsage],
    pub bind_policy: NodeCpuBindPolicy,
    pub numa_policy: NumaPolicy,
    pub strategy: NumaAllocateStrategy,
    /// The Node's amplification ratios as NUMA placement applies them (`Default`: none).
    pub amplification: NumaAmplification,
}

/// A pod's cpuset wish, from its QoS class and `resource-spec` (node-independent part).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpusetWish {
    pub policy: CpuBindPolicy,
    /// `requiredCPUBindPolicy` was set: the policy is a constraint, not a preference.
    pub required: bool,
    pub exclusive: CpuExclusivePolicy,
}

/// A pod's CPU/NUMA request, independent of any node (the output of classification).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct PodCpuRequest {
    /// Effective pod cpu request in millicores (Kubernetes `PodRequests`).
    pub cpu_milli: i64,
    pub memory_bytes: i64,
    /// Set when the pod itself qualifies for a cpuset (LSE/LSR with prod priority and a
    /// FullPCPUs/SpreadByPCPUs policy). A fractional CPU request with a wish is rejected by
    /// classification already, so `cpu_milli` is a multiple of 1000 here.
    pub cpuset: Option<CpusetWish>,
    /// `numa-topology-spec` `numaTopologyPolicy` (None when absent or unknown).
    pub numa_policy: NumaPolicy,
    pub numa_exclusive: NumaExclusive,
}

/// The decision for one pod on one node.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CpuPlacement {
    /// Empty when the pod gets no cpuset.
    pub cpuset: CpuSet,
    /// Per-NUMA share (`resource-status` `numaNodeResources`), ascending id; empty when no NUMA
    /// policy applies.
    pub numa: Vec<NumaShare>,
    /// Node score 0..=100 for prioritize.
    pub score: i64,
    /// The NUMA nodes the pod is aligned to when a NUMA policy applies (the chosen hint):
    /// the caller restricts the pod's device allocation to them. `None` when no NUMA policy
    /// applies (devices are then chosen independently) or the node lists no NUMA zones.
    pub affinity: Option<NumaMask>,
}

pub use crate::placement::FitError;
