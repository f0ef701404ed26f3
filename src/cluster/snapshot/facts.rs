//! One node's facts as the read verbs see them: what is published ([`NodeSummary`]: device
//! facts, CPU facts, score sums), the borrowed views built from a snapshot ([`NodeView`],
//! [`DeviceView`]), and the fingerprints the verbs' memos key decisions by.

use std::sync::Arc;

use crate::model::resource_names::ResourceNameSet;
use crate::placement::cpu::{Amplification, CpuSummary, NodeCpuBindPolicy};
use crate::placement::device::index::{DeviceIndexRef, GroupRanges, NodeSums, SlotGroup};
use crate::placement::device::partition::NodePartitions;

/// What filter and prioritize know of a node's devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceFacts {
    /// No `Device` object. `held`: pods still hold device allocations here (then nothing is
    /// allocatable until it returns; otherwise device plugins own the node's devices).
    /// `advertised`: the managed names the Node's allocatable offers (`None`: no Node object
    /// in the cache).
    Missing {
        held: bool,
        advertised: Option<ResourceNameSet>,
    },
    /// Devices the fixed-size index cannot carry exactly: the full allocator answers.
    Unindexed,
    /// Indexed: per device type, a range of the chunk's slots. `honors_partitions`: whole-GPU
    /// requests must keep to the node's GPU partitions (only the full allocator checks them).
    Indexed {
        blocked: bool,
        ranges: GroupRanges,
        honors_partitions: bool,
    },
}

impl DeviceFacts {
    /// Whether whole-GPU requests must keep to the node's GPU partition table here.
    #[inline]
    pub fn honors_partitions(&self) -> bool {
        matches!(
            self,
            DeviceFacts::Indexed {
                honors_partitions: true,
                ..
            }
        )
    }
}

/// Why cpuset pods cannot land on a node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Unusable {
    pub reason: crate::placement::FitReason,
    pub unresolvable: bool,
}

/// What the read verbs know of a node's CPUs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CpuFacts {
    /// The node forces a bind policy or has a NUMA policy (plain pods are placed too).
    pub constrains_plain_pods: bool,
    /// The CPU amplification check's figures (`Off` on most nodes).
    pub amplification: Amplification,
    pub bind_policy: NodeCpuBindPolicy,
    /// The summary of the current state, or why there is none.
    pub summary: Result<CpuSummary, Unusable>,
}

impl CpuFacts {
    /// What a chunk position without a node holds: never read (`Slot::devices` says no node
    /// is there), but present, so a node's CPU facts need no `Option` to be checked on every
    /// lookup.
    pub(super) fn absent() -> Self {
        static ABSENT: std::sync::LazyLock<CpuFacts> = std::sync::LazyLock::new(|| CpuFacts {
            constrains_plain_pods: false,
            amplification: Amplification::Off,
            bind_policy: NodeCpuBindPolicy::None,
            summary: Err(Unusable {
                reason: crate::placement::FitReason::NodeNotCached,
                unresolvable: true,
            }),
        });
        ABSENT.clone()
    }
}

/// What the read verbs need to answer the GPU partition step: the node's table and policy, and
/// which GPUs are used and healthy (a bit per minor, as the full allocator computes them).
/// Published for nodes with a table or a policy that honours one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PartitionFacts {
    pub node: NodePartitions,
    pub used: u64,
    pub total: u64,
    /// Every healthy GPU reports its memory. Where one does not, the full allocator may fail
    /// late (filling the memory of a chosen GPU), so only it answers.
    pub exact: bool,
}

/// A node's devices as the read verbs see them.
#[derive(Clone, Copy, Debug)]
pub enum DeviceView<'a> {
    Missing {
        held: bool,
        advertised: Option<ResourceNameSet>,
    },
    Unindexed,
    Indexed(DeviceIndexRef<'a>),
}

/// One node in a snapshot.
#[derive(Clone, Copy, Debug)]
pub struct NodeView<'a> {
    pub devices: DeviceView<'a>,
    /// [`DeviceFacts::honors_partitions`].
    pub honors_partitions: bool,
    /// Where the node honours partitions: the facts the partition step reads (`None`: only the
    /// full allocator can answer).
    pub partitions: Option<&'a PartitionFacts>,
    pub cpu: &'a CpuFacts,
    /// The managed names kube-scheduler serves through DRA here (KEP-5004).
    pub dra_served: ResourceNameSet,
    /// Of `devices` and `cpu`: decisions that share parts between nodes key them by it.
    pub fingerprint: Fingerprint,
    /// [`NodeSummary::free_cpu_milli`].
    pub free_cpu_milli: Option<i64>,
}

/// 128-bit fingerprints of a node's device facts (with its groups and sums) and of its CPU
/// facts, taken when the facts are published. Filter and prioritize decide once per distinct
/// fingerprint of what the pod's decision reads, within a request and across the requests of
/// one pod shape (`scheduler::memo`), because a node's verdict is a function of its facts
/// alone.
///
/// Equal facts always have equal fingerprints (derived `Hash` over every field the views
/// expose). Unequal facts collide with probability ~2⁻¹²⁸ per pair: two independently keyed
/// 64-bit hashes, keys drawn at random per process, so a collision cannot be engineered from
/// outside. Even then the verbs only advise: bind decides again under the node lock against
/// the ledgers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    pub devices: u128,
    pub cpu: u128,
}

impl Fingerprint {
    pub(super) fn of(
        devices: &DeviceFacts,
        slots: &[SlotGroup],
        sums: &NodeSums,
        partitions: Option<&PartitionFacts>,
        dra_served: ResourceNameSet,
        cpu: &CpuFacts,
    ) -> Self {
        Fingerprint {
            devices: hash128(&(devices, slots, sums, partitions, dra_served)),
            cpu: hash128(cpu),
        }
    }
}

/// Two 64-bit hashes under independent random keys, fixed for the process: the fingerprints'
/// hash (and the verbs' pod-shape key), collision-resistant in the sense [`Fingerprint`] gives.
pub fn hash128<T: std::hash::Hash>(value: &T) -> u128 {
    static KEYS: std::sync::OnceLock<(ahash::RandomState, ahash::RandomState)> =
        std::sync::OnceLock::new();
    let (a, b) = KEYS.get_or_init(|| (ahash::RandomState::new(), ahash::RandomState::new()));
    (u128::from(a.hash_one(value)) << 64) | u128::from(b.hash_one(value))
}

/// One node's facts, owned: what a writer publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSummary {
    pub(super) devices: DeviceFacts,
    /// The node's slots; `devices`' ranges index this.
    pub(super) slots: Vec<SlotGroup>,
    pub(super) sums: NodeSums,
    pub(super) partitions: Option<Arc<PartitionFacts>>,
    pub(super) cpu: CpuFacts,
    /// The managed names kube-scheduler serves through DRA here (`NodeState::dra_served`).
    pub(super) dra_served: ResourceNameSet,
    /// A function of the six fields above.
    pub(super) fingerprint: Fingerprint,
    /// The Node's allocatable CPU less what the pods here request (millicores; `None`: no Node
    /// object). Not in the fingerprint: only the fragmentation score reads it, which no memo
    /// keyed by fingerprints answers.
    pub(super) free_cpu_milli: Option<i64>,
}

impl NodeSummary {
    /// A node's facts, fingerprinted. `cluster::state` builds them from a node's ledgers
    /// (`NodeState::summary`); this module only lays them out and publishes them.
    pub fn new(
        devices: DeviceFacts,
        slots: Vec<SlotGroup>,
        sums: NodeSums,
        partitions: Option<Arc<PartitionFacts>>,
        dra_served: ResourceNameSet,
        cpu: CpuFacts,
        free_cpu_milli: Option<i64>,
    ) -> Self {
        NodeSummary {
            free_cpu_milli,
            fingerprint: Fingerprint::of(
                &devices,
                &slots,
                &sums,
                partitions.as_deref(),
                dra_served,
                &cpu,
            ),
            devices,
            slots,
            sums,
            partitions,
            cpu,
            dra_served,
        }
    }

    /// The view of this summary (tests compare views of published and rebuilt summaries).
    pub fn view(&self) -> NodeView<'_> {
        NodeView {
            devices: device_view(&self.devices, &self.slots, &self.sums),
            honors_partitions: self.devices.honors_partitions(),
            partitions: self.partitions.as_deref(),
            cpu: &self.cpu,
            dra_served: self.dra_served,
            fingerprint: self.fingerprint,
            free_cpu_milli: self.free_cpu_milli,
        }
    }
}

#[inline]
pub(super) fn device_view<'a>(
    facts: &DeviceFacts,
    slots: &'a [SlotGroup],
    sums: &'a NodeSums,
) -> DeviceView<'a> {
    match *facts {
        DeviceFacts::Missing { held, advertised } => DeviceView::Missing { held, advertised },
        DeviceFacts::Unindexed => DeviceView::Unindexed,
        DeviceFacts::Indexed {
            blocked, ranges, ..
        } => DeviceView::Indexed(DeviceIndexRef::over(slots, blocked, &ranges, sums)),
    }
}
