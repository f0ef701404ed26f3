//! Per-node CPU/NUMA state: what the node's NRT and labels say ([`NrtCpuInfo`], parsed in
//! `cluster::nrt`; [`NodeCpuLabels`]) and what pods hold ([`CpuLedger`]), beside the device ledger and under
//! the same node lock.
//!
//! The ledger is keyed by pod UID and every entry remembers exactly what its pod's
//! `resource-status` said, so a replace or remove subtracts the recorded contribution, never
//! what an annotation says now. Everything derived (CPU reference counts, per-NUMA sums, NUMA
//! single/multi pod counts) is recomputed from the recorded entries, so it cannot drift.
//! Entries are kept whether or not the node's CPU topology is known yet (koordinator drops
//! allocations seen before the NRT, `resource_manager.go`; we validate them when it comes).
//!
//! Pure data: it never locks, never talks to the network and never decides placement (that
//! is `placement::cpu`); it builds the [`NodeCpuView`] placement decides on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

use super::ledger::{Entries, Entry, EntryState};
use crate::model::cpuset::{CpuId, CpuSet};
use crate::model::ids::PodUid;
use crate::model::koord_cpu::ResourceStatus;
use crate::model::quantity::Quantity;
use crate::placement::cpu::{
    CpuExclusivePolicy, CpuScoreStrategy, CpuScoring, CpuSummary, CpuTopology, NodeCpuBindPolicy,
    NodeCpuView, NumaAllocateStrategy, NumaId, NumaPolicy, NumaShare, NumaUsage, NumaZone,
};
use crate::placement::fit_error::{FitReason, MissingTopology};

pub use super::nrt::{NrtCpuInfo, NrtProblem};

pub use super::records::NodeCpuLabels;

/// What a pod is recorded as holding, from its `resource-status` (and the exclusivity of its
/// `resource-spec`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuAllocation {
    pub cpuset: CpuSet,
    pub numa: Vec<NumaShare>,
    pub exclusive: CpuExclusivePolicy,
}

impl CpuAllocation {
    pub fn status(&self) -> ResourceStatus {
        ResourceStatus {
            cpuset: self.cpuset,
            numa: self.numa.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordedCpus {
    Allocated(CpuAllocation),
    /// The pod's `resource-status` did not parse: which CPUs it holds is unknown, so the node
    /// takes no cpuset or NUMA-bound pod until the entry is replaced or removed.
    Malformed {
        reason: String,
    },
}

/// A pod's CPU entry.
pub type CpuEntry = Entry<RecordedCpus>;

/// Why placement cannot use a node's CPUs right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuUnusable {
    pub reason: FitReason,
    /// No topology (or a malformed one): only koordlet fixing the NRT helps, not preemption.
    pub unresolvable: bool,
}

/// Derived from the entries: recomputed on every change (and on copies, with victims left
/// out, for preemption).
#[derive(Clone, Debug, Default)]
struct Derived {
    refcount: BTreeMap<CpuId, u32>,
    allocated: CpuSet,
    pcpu_exclusive: CpuSet,
    numa_exclusive: CpuSet,
    /// Per NUMA id mentioned by any entry or zone.
    usage: BTreeMap<NumaId, NumaUsage>,
    /// Per NUMA id: the NUMA shares of pods without a cpuset, which koordlet runs in that NUMA
    /// node's shared pool (the CPUs no cpuset holds). A new cpuset must leave the pool that many
    /// CPUs.
    shared_pool_milli: BTreeMap<NumaId, i64>,
    /// The free CPUs kept for those pools (see [`NodeCpuView::shared_pool`]).
    shared_pool: CpuSet,
    malformed: usize,
}

/// One node's CPU accounting.
#[derive(Clone, Debug, Default)]
pub struct CpuLedger {
    nrt: Option<Arc<NrtCpuInfo>>,
    labels: NodeCpuLabels,
    entries: Entries<RecordedCpus>,
    derived: Derived,
    /// DRA drivers publishing this node's CPUs: no cpusets while any does.
    dra_cpu_drivers: Vec<Arc<str>>,
    /// `usage` in `zones` order for the view (so building a view copies nothing).
    zone_usage: Vec<NumaUsage>,
    /// Filter's fixed-size summary, built on first read after a change (filter reads it for
    /// every candidate node). Every mutation resets it.
    summary: std::sync::OnceLock<Result<CpuSummary, CpuUnusable>>,
    /// Entries changed by [`Self::record_deferred`]/[`Self::remove_deferred`] since the last
    /// derivation: [`Self::finish_deferred`] derives before the node's lock is released.
    stale: bool,
}

impl CpuLedger {
    pub fn new() -> Self {
        Self::default()
    }

    /// The NRT's CPU information; `None` when the NRT is deleted (entries are kept).
    pub fn set_nrt(&mut self, nrt: Option<Arc<NrtCpuInfo>>) {
        self.nrt = nrt;
        self.refresh();
    }

    /// The DRA drivers that publish this node's CPUs (`--dra-cpu-drivers`): while any does,
    /// the extender gives no cpusets here (two allocators pinning one node's CPUs would hand
    /// out the same cores).
    pub fn set_dra_cpu_drivers(&mut self, drivers: Vec<Arc<str>>) {
        if self.dra_cpu_drivers != drivers {
            self.dra_cpu_drivers = drivers;
            self.summary = Default::default();
        }
    }

    pub fn set_labels(&mut self, labels: NodeCpuLabels) {
        self.labels = labels;
        self.summary = Default::default();
    }

    /// Filter's summary of the current state (no victims), cached until the next change.
    pub fn summary(&self) -> Result<CpuSummary, CpuUnusable> {
        self.summary
            .get_or_init(|| {
                self.with_view(&[], &CpuScoring::default(), |v| {
                    v.map(|v| CpuSummary::new(&v))
                })
            })
            .clone()
    }

    /// Why cpuset pods cannot land here, `None` when they can.
    pub fn usable_error(&self) -> Option<String> {
        self.usable().err().map(|e| e.reason.to_string())
    }

    pub fn nrt(&self) -> Option<&NrtCpuInfo> {
        self.nrt.as_deref()
    }
    pub fn labels(&self) -> &NodeCpuLabels {
        &self.labels
    }

    /// The node-forced bind policy: the label, or kubelet static with full-pcpus-only.
    pub fn bind_policy(&self) -> NodeCpuBindPolicy {
        if self.labels.bind_policy == NodeCpuBindPolicy::FullPcpusOnly
            || self.nrt.as_ref().is_some_and(|n| n.kubelet_full_pcpus_only)
        {
            NodeCpuBindPolicy::FullPcpusOnly
        } else {
            self.labels.bind_policy
        }
    }

    /// The node's NUMA policy: a non-empty label wins over the NRT.
    pub fn numa_policy(&self) -> NumaPolicy {
        self.labels
            .numa_policy
            .or(self.nrt.as_ref().map(|n| n.policy))
            .unwrap_or_default()
    }

    /// Whether the node changes anything for a pod without cpuset wish or NUMA policy.
    pub fn constrains_plain_pods(&self) -> bool {
        self.bind_policy() != NodeCpuBindPolicy::None || self.numa_policy() != NumaPolicy::None
    }

    /// Records (or replaces) a pod's allocation, returning the previous entry. Replacing
    /// releases exactly what the previous entry recorded.
    pub fn record(
        &mut self,
        uid: PodUid,
        allocation: RecordedCpus,
        state: EntryState,
    ) -> Option<CpuEntry> {
        let previous = self.record_deferred(uid, allocation, state);
        self.refresh();
        previous
    }

    /// [`Self::record`] without deriving the node's usage: a batch of records derives it
    /// once, with [`Self::finish_deferred`], before anything reads the ledger (the caller
    /// holds the node's lock throughout).
    pub(super) fn record_deferred(
        &mut self,
        uid: PodUid,
        allocation: RecordedCpus,
        state: EntryState,
    ) -> Option<CpuEntry> {
        let previous = self.entries.insert(uid, allocation, state);
        self.stale = true;
        previous
    }

    /// [`Self::remove`] without deriving; see [`Self::record_deferred`].
    pub(super) fn remove_deferred(&mut self, uid: &PodUid) -> Option<CpuEntry> {
        let e = self.entries.remove(uid)?;
        self.stale = true;
        Some(e)
    }

    /// Derives what the deferred records changed (nothing when none did).
    pub(super) fn finish_deferred(&mut self) {
        if self.stale {
            self.refresh();
        }
    }

    /// Removes a pod's entry. Removing an absent pod is a no-op.
    pub fn remove(&mut self, uid: &PodUid) -> Option<CpuEntry> {
        let e = self.entries.remove(uid)?;
        self.refresh();
        Some(e)
    }

    pub fn get(&self, uid: &PodUid) -> Option<&CpuEntry> {
        self.entries.get(uid)
    }
    pub fn entries(&self) -> impl Iterator<Item = (&PodUid, &CpuEntry)> {
        self.entries.iter()
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Assumed entries older than `ttl`, with the instant each was assumed.
    pub fn assumed_older_than(
        &self,
        now: std::time::Instant,
        ttl: std::time::Duration,
    ) -> Vec<(PodUid, std::time::Instant)> {
        self.entries.assumed_older_than(now, ttl)
    }

    /// Removes `uid`'s entry only if it is still the one assumed at `at`.
    pub fn remove_if_assumed_at(&mut self, uid: &PodUid, at: std::time::Instant) -> bool {
        let same = self.entries.is_assumed_at(uid, at);
        if same {
            self.remove(uid);
        }
        same
    }

    /// CPUs held per CPU id (reference count), over every recorded entry.
    pub fn refcounts(&self) -> &BTreeMap<CpuId, u32> {
        &self.derived.refcount
    }
    /// Sums per NUMA id over every recorded entry.
    pub fn numa_usage(&self) -> &BTreeMap<NumaId, NumaUsage> {
        &self.derived.usage
    }
    pub fn allocated(&self) -> CpuSet {
        self.derived.allocated
    }

    /// NUMA node `zone` as NUMA placement counts it on a node whose Node amplifies its cpu or
    /// memory (`NumaStats::from_view`'s arithmetic: totals × the ratios, the CPUs cpusets hold
    /// there counted amplified in `used_cpu_milli`); `None` when nothing is amplified. For the
    /// reports (`/debug/nodes`, `inspect`).
    pub fn amplified_zone(&self, zone: &NumaZone, used_cpu_milli: i64) -> Option<AmplifiedZone> {
        let amp = self.labels.amplification;
        if amp.is_off() {
            return None;
        }
        let held = self
            .nrt
            .as_deref()
            .and_then(|n| n.topology.as_deref())
            .map_or(0, |t| {
                t.numa_cpus(zone.id)
                    .intersection(&self.derived.allocated)
                    .len()
            });
        Some(AmplifiedZone {
            cpu_milli: amp.cpu(zone.cpu_milli),
            used_cpu_milli: amp.used_cpu(used_cpu_milli, u16::try_from(held).unwrap_or(u16::MAX)),
            memory_bytes: amp.memory(zone.memory_bytes),
        })
    }
    /// The CPUs held by every entry but `ignore`'s (preemption victims).
    pub fn allocated_without(&self, ignore: &[PodUid]) -> CpuSet {
        self.entries
            .iter()
            .filter(|(uid, _)| !ignore.contains(uid))
            .filter_map(|(_, e)| match &e.allocation {
                RecordedCpus::Allocated(a) => Some(a.cpuset),
                RecordedCpus::Malformed { .. } => None,
            })
            .fold(CpuSet::default(), |all, c| all.union(&c))
    }
    pub fn has_malformed(&self) -> bool {
        self.derived.malformed > 0
    }

    fn topology(&self) -> Option<&CpuTopology> {
        self.nrt.as_ref()?.topology.as_deref()
    }

    fn derive<'a>(&self, entries: impl Iterator<Item = &'a CpuEntry>) -> Derived {
        let topology = self.topology();
        let mut d = Derived::default();
        for e in entries {
            let a = match &e.allocation {
                RecordedCpus::Allocated(a) => a,
                RecordedCpus::Malformed { .. } => {
                    d.malformed += 1;
                    continue;
                }
            };
            for cpu in a.cpuset.iter() {
                *d.refcount.entry(cpu).or_default() += 1;
            }
            d.allocated = d.allocated.union(&a.cpuset);
            match a.exclusive {
                CpuExclusivePolicy::PcpuLevel => {
                    d.pcpu_exclusive = d.pcpu_exclusive.union(&a.cpuset)
                }
                CpuExclusivePolicy::NumaNodeLevel => {
                    d.numa_exclusive = d.numa_exclusive.union(&a.cpuset)
                }
                CpuExclusivePolicy::None => {}
            }
            // The NUMA nodes the pod is bound to: its cpuset's (when the map is known) and
            // its shares' — also for pods without a cpuset (koordinator counts cpuset pods
            // only: a koordinator quirk).
            let mut numas: BTreeSet<NumaId> = a.numa.iter().map(|s| s.numa).collect();
            if let Some(t) = topology {
                numas.extend(a.cpuset.iter().filter_map(|c| t.cpu(c).map(|d| d.numa)));
            }
            for s in &a.numa {
                let u = d.usage.entry(s.numa).or_default();
                u.cpu_milli = u.cpu_milli.saturating_add(s.cpu_milli);
                u.memory_bytes = u.memory_bytes.saturating_add(s.memory_bytes);
                if a.cpuset.is_empty() {
                    let pool = d.shared_pool_milli.entry(s.numa).or_default();
                    *pool = pool.saturating_add(s.cpu_milli);
                }
            }
            // One NUMA node's CPUs are counted once, whoever holds them : a
            // cpuset's CPUs on a NUMA node its shares do not cover (a pod with no
            // `numaNodeResources`, as written on nodes without a NUMA policy) count against
            // that node's NUMA-bound capacity too.
            if let Some(t) = topology {
                let mut uncovered: BTreeMap<NumaId, i64> = BTreeMap::new();
                for cpu in a.cpuset.iter() {
                    if let Some(detail) = t.cpu(cpu)
                        && !a.numa.iter().any(|s| s.numa == detail.numa)
                    {
                        *uncovered.entry(detail.numa).or_default() += 1000;
                    }
                }
                for (numa, milli) in uncovered {
                    let u = d.usage.entry(numa).or_default();
                    u.cpu_milli = u.cpu_milli.saturating_add(milli);
                }
            }
            let multi = numas.len() > 1;
            for n in numas {
                let u = d.usage.entry(n).or_default();
                if multi {
                    u.multi_numa_pods += 1;
                } else {
                    u.single_numa_pods += 1;
                }
            }
        }
        // Keep each NUMA node's shared pool big enough for the NUMA shares of the pods that
        // run in it (no cpuset): as many of its free CPUs as those shares need (rounded up)
        // are not handed to a new cpuset. Which ones does not matter; the highest ids go.
        if let (Some(t), Some(nrt)) = (topology, self.nrt.as_deref()) {
            for (numa, milli) in &d.shared_pool_milli {
                let keep = usize::try_from(milli.saturating_add(999) / 1000).unwrap_or(0);
                let free = t
                    .numa_cpus(*numa)
                    .difference(&d.allocated)
                    .difference(&nrt.reserved);
                let ids: Vec<CpuId> = free.iter().collect();
                for cpu in ids.iter().rev().take(keep) {
                    d.shared_pool.insert(*cpu);
                }
            }
        }
        d
    }

    fn refresh(&mut self) {
        self.stale = false;
        self.summary = Default::default();
        self.derived = self.derive(self.entries.values());
        self.zone_usage = self.zones_usage(&self.derived);
    }

    fn zones_usage(&self, d: &Derived) -> Vec<NumaUsage> {
        self.nrt
            .iter()
            .flat_map(|n| n.zones.iter())
            .map(|z| d.usage.get(&z.id).copied().unwrap_or_default())
            .collect()
    }

    /// Why cpuset (and NUMA-bound) placement cannot use this node, or `Ok` with its topology.
    fn usable(&self) -> Result<(&NrtCpuInfo, &CpuTopology), CpuUnusable> {
        if !self.dra_cpu_drivers.is_empty() {
            let drivers: Vec<&str> = self.dra_cpu_drivers.iter().map(|d| &**d).collect();
            return Err(CpuUnusable {
                reason: FitReason::CpusPublishedByDra {
                    drivers: drivers.join(", ").into(),
                },
                unresolvable: true,
            });
        }
        let Some(nrt) = self.nrt.as_deref() else {
            return Err(CpuUnusable {
                reason: FitReason::NoCpuTopology(MissingTopology::NoNodeResourceTopology),
                unresolvable: true,
            });
        };
        if let Some(p) = nrt.problems.first() {
            return Err(CpuUnusable {
                reason: FitReason::CpuTopologyMalformed {
                    annotation: p.annotation.to_string().into(),
                },
                unresolvable: true,
            });
        }
        let Some(topology) = nrt.topology.as_deref() else {
            return Err(CpuUnusable {
                reason: FitReason::NoCpuTopology(MissingTopology::NoCpuTopologyAnnotation),
                unresolvable: true,
            });
        };
        if nrt.zones.is_empty() {
            return Err(CpuUnusable {
                reason: FitReason::NoCpuTopology(MissingTopology::NoNumaZones),
                unresolvable: true,
            });
        }
        Ok((nrt, topology))
    }

    /// Calls `f` with the view placement decides on, treating the entries of `ignore`
    /// (preemption victims) as released. Computed on copies; the ledger is not touched.
    /// `Err` when the node cannot take cpuset pods: no or malformed topology (unresolvable),
    /// or a pod whose `resource-status` did not parse (resolvable: it may go).
    pub fn with_view<R>(
        &self,
        ignore: &[PodUid],
        scoring: &CpuScoring,
        f: impl FnOnce(Result<NodeCpuView<'_>, CpuUnusable>) -> R,
    ) -> R {
        let (nrt, topology) = match self.usable() {
            Ok(x) => x,
            Err(e) => return f(Err(e)),
        };
        let strategy = self.labels.strategy.unwrap_or(match scoring.numa_strategy {
            CpuScoreStrategy::MostAllocated => NumaAllocateStrategy::MostAllocated,
            CpuScoreStrategy::LeastAllocated => NumaAllocateStrategy::LeastAllocated,
        });
        let victims = ignore.iter().any(|u| self.entries.contains_key(u));
        let owned;
        let (d, usage): (&Derived, std::borrow::Cow<'_, [NumaUsage]>) = if victims {
            owned = self.derive(
                self.entries
                    .iter()
                    .filter(|(u, _)| !ignore.contains(u))
                    .map(|(_, e)| e),
            );
            let usage = self.zones_usage(&owned);
            (&owned, usage.into())
        } else {
            (&self.derived, self.zone_usage.as_slice().into())
        };
        if d.malformed > 0 {
            return f(Err(CpuUnusable {
                reason: FitReason::MalformedResourceStatus,
                unresolvable: false,
            }));
        }
        f(Ok(NodeCpuView {
            topology,
            reserved: nrt.reserved,
            shared_pool: d.shared_pool,
            allocated: d.allocated,
            pcpu_exclusive: d.pcpu_exclusive,
            numa_exclusive: d.numa_exclusive,
            zones: &nrt.zones,
            usage: &usage,
            bind_policy: self.bind_policy(),
            numa_policy: self.numa_policy(),
            strategy,
            amplification: self.labels.amplification,
        }))
    }

    /// Things worth a human's attention that do not block the node: allocations that do not
    /// match the (possibly later-arrived) topology.
    pub fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .nrt
            .iter()
            .flat_map(|n| n.problems.iter().map(|p| p.message.clone()))
            .collect();
        for (cpu, n) in &self.derived.refcount {
            if *n > 1 {
                out.push(format!("cpu {cpu} is held by {n} pods"));
            }
        }
        if let Some(nrt) = self.nrt.as_deref() {
            let known: BTreeSet<NumaId> = nrt.zones.iter().map(|z| z.id).collect();
            for (uid, e) in self.entries.iter() {
                let RecordedCpus::Allocated(a) = &e.allocation else {
                    out.push(format!("pod {uid}: malformed resource-status"));
                    continue;
                };
                if let Some(t) = nrt.topology.as_deref() {
                    let outside = a.cpuset.difference(&t.all());
                    if !outside.is_empty() {
                        out.push(format!(
                            "pod {uid} holds cpus {outside} that are not in the CPU topology"
                        ));
                    }
                }
                let on_reserved = a.cpuset.intersection(&nrt.reserved);
                if !on_reserved.is_empty() {
                    out.push(format!("pod {uid} holds reserved cpus {on_reserved}"));
                }
                for s in &a.numa {
                    if !known.contains(&s.numa) {
                        out.push(format!(
                            "pod {uid} holds resources on NUMA node {} that has no zone",
                            s.numa
                        ));
                    }
                }
            }
        }
        out
    }

    /// A serializable snapshot for `/debug/nodes` (no timings, so two replicas compare equal).
    pub fn debug_view(&self) -> CpuLedgerView {
        let topology = self.nrt.as_ref().map(|n| TopologyView {
            cpus: n.topology.as_ref().map(|t| t.all().to_string()),
            cores: n.topology.as_ref().map(|t| t.cores().len()),
            sockets: n.topology.as_ref().map(|t| t.sockets().count()),
            numa_nodes: n.topology.as_ref().map(|t| t.numa_ids().count()),
            cpus_per_core: n.topology.as_ref().map(|t| t.cpus_per_core()),
            reserved: n.reserved.to_string(),
            kubelet_full_pcpus_only: n.kubelet_full_pcpus_only,
            nrt_numa_policy: format!("{:?}", n.policy),
        });
        let mut free_per_numa = BTreeMap::new();
        if let Some(nrt) = self.nrt.as_deref() {
            for (z, u) in nrt.zones.iter().zip(&self.zone_usage) {
                let cpus = nrt.topology.as_deref().map(|t| {
                    t.numa_cpus(z.id)
                        .difference(&nrt.reserved)
                        .difference(&self.derived.allocated)
                        .to_string()
                });
                let amplified = self
                    .amplified_zone(z, u.cpu_milli)
                    .map(|a| AmplifiedNumaView {
                        allocatable_cpu: Quantity::from_milli(a.cpu_milli.into()).to_string(),
                        allocatable_memory: crate::model::device::format_bytes(
                            Quantity::from_units(a.memory_bytes),
                        ),
                        used_cpu: Quantity::from_milli(a.used_cpu_milli.into()).to_string(),
                    });
                free_per_numa.insert(
                    z.id,
                    NumaView {
                        amplified,
                        free_cpus: cpus,
                        allocatable_cpu: Quantity::from_milli(z.cpu_milli.into()).to_string(),
                        allocatable_memory: crate::model::device::format_bytes(
                            Quantity::from_units(z.memory_bytes),
                        ),
                        used_cpu: Quantity::from_milli(u.cpu_milli.into()).to_string(),
                        used_memory: crate::model::device::format_bytes(Quantity::from_units(
                            u.memory_bytes,
                        )),
                        single_numa_pods: u.single_numa_pods,
                        multi_numa_pods: u.multi_numa_pods,
                    },
                );
            }
        }
        let allocated_by_pod = self
            .entries
            .iter()
            .map(|(uid, e)| {
                let state = match e.state {
                    EntryState::Assumed { .. } => "assumed",
                    EntryState::Committed => "committed",
                };
                let (status, exclusive, malformed) = match &e.allocation {
                    RecordedCpus::Allocated(a) => (
                        Some(a.status().to_annotation()),
                        Some(format!("{:?}", a.exclusive)),
                        None,
                    ),
                    RecordedCpus::Malformed { reason } => (None, None, Some(reason.clone())),
                };
                (
                    uid.to_string(),
                    CpuEntryView {
                        state,
                        resource_status: status,
                        exclusive,
                        malformed,
                    },
                )
            })
            .collect();
        CpuLedgerView {
            topology,
            bind_policy: format!("{:?}", self.bind_policy()),
            numa_policy: format!("{:?}", self.numa_policy()),
            allocate_strategy: self.labels.strategy.map(|s| format!("{s:?}")),
            usable: self.usable().err().map(|e| e.reason.to_string()),
            allocated: self.derived.allocated.to_string(),
            allocated_by_pod,
            free_per_numa,
            problems: self.problems(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CpuLedgerView {
    /// `None` without an NRT.
    pub topology: Option<TopologyView>,
    pub bind_policy: String,
    pub numa_policy: String,
    pub allocate_strategy: Option<String>,
    /// Why cpuset pods cannot land here (`null` when they can).
    pub usable: Option<String>,
    pub allocated: String,
    pub allocated_by_pod: BTreeMap<String, CpuEntryView>,
    pub free_per_numa: BTreeMap<NumaId, NumaView>,
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TopologyView {
    pub cpus: Option<String>,
    pub cores: Option<usize>,
    pub sockets: Option<usize>,
    pub numa_nodes: Option<usize>,
    pub cpus_per_core: Option<usize>,
    pub reserved: String,
    pub kubelet_full_pcpus_only: bool,
    pub nrt_numa_policy: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct NumaView {
    pub free_cpus: Option<String>,
    pub allocatable_cpu: String,
    pub allocatable_memory: String,
    pub used_cpu: String,
    pub used_memory: String,
    pub single_numa_pods: u32,
    pub multi_numa_pods: u32,
    /// On a node that amplifies its CPU (or memory): the same figures as NUMA placement counts
    /// them (koordinator's `amplifyNUMANodeResources`; cpuset CPUs counted amplified).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amplified: Option<AmplifiedNumaView>,
}

/// One NUMA node's figures under the Node's amplification ratios ([`CpuLedger::amplified_zone`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmplifiedZone {
    pub cpu_milli: i64,
    pub used_cpu_milli: i64,
    pub memory_bytes: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AmplifiedNumaView {
    pub allocatable_cpu: String,
    pub allocatable_memory: String,
    pub used_cpu: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct CpuEntryView {
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclusive: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub malformed: Option<String>,
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::cluster::devices::{DeviceSlot, NodeDevices};
    use crate::cluster::{ClusterState, PodRecord, TopologyRecord};
    use crate::model::device::{DeviceType, GPU_CORE};
    use crate::model::koord_cpu::{
        self, CPU_BIND_POLICY_LABEL, CPU_TOPOLOGY, KUBELET_CPU_MANAGER_POLICY, NODE_RESERVATION,
        NUMA_ALLOCATE_STRATEGY_LABEL, NUMA_TOPOLOGY_POLICY_LABEL, POD_CPU_ALLOCS,
        SYSTEM_QOS_RESOURCE,
    };
    use crate::model::nrt::NodeResourceTopology;
    use crate::model::pod::Pod;
    use serde_json::json;

    /// `numas` NUMA nodes on one socket, `cores` cores each, 2 threads; ids sequential with
    /// the two threads of a core adjacent.
    pub(in crate::cluster) fn topology_json(numas: u32, cores: u32) -> String {
        let mut detail = Vec::new();
        for n in 0..numas {
            for c in 0..cores {
                for t in 0..2 {
                    let core = n * cores + c;
                    detail.push(json!({"id": core * 2 + t, "core": core, "socket": 0, "node": n}));
                }
            }
        }
        json!({ "detail": detail }).to_string()
    }

    fn nrt(numas: u32, cores: u32, annotations: &[(&str, &str)]) -> TopologyRecord {
        let mut ann: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ann.entry(CPU_TOPOLOGY.into())
            .or_insert_with(|| topology_json(numas, cores));
        let zones: Vec<_> = (0..numas)
            .map(|n| {
                json!({"name": format!("node-{n}"), "type": "Node", "resources": [
                    {"name": "cpu", "capacity": cores * 2, "allocatable": cores * 2, "available": 1},
                    {"name": "memory", "capacity": "64Gi", "allocatable": "64Gi", "available": "1"}]})
            })
            .collect();
        let obj: NodeResourceTopology = serde_json::from_value(json!({
            "metadata": {"name": "n1", "uid": "t", "annotations": ann},
            "topologyPolicies": ["SingleNUMANodePodLevel"],
            "zones": zones,
        }))
        .unwrap();
        TopologyRecord::from_nrt(&obj)
    }

    fn pod(uid: &str, node: &str, status: Option<&str>, phase: &str) -> PodRecord {
        let mut ann = serde_json::Map::new();
        if let Some(s) = status {
            ann.insert(RESOURCE_STATUS_KEY.into(), s.into());
        }
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "d", "uid": uid, "annotations": ann},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase},
        }))
        .unwrap();
        PodRecord::from_pod(&p).unwrap()
    }

    const RESOURCE_STATUS_KEY: &str = koord_cpu::RESOURCE_STATUS;

    fn view_of(
        cluster: &ClusterState,
        node: &str,
    ) -> Result<(String, Vec<NumaUsage>), CpuUnusable> {
        let entry = cluster.node(node).expect("node entry");
        let s = entry.read();
        s.cpus.with_view(&[], &CpuScoring::default(), |v| {
            v.map(|v| (v.allocated.to_string(), v.usage.to_vec()))
        })
    }

    #[test]
    fn pod_before_nrt_is_kept_and_validated_when_it_comes() {
        let c = ClusterState::new();
        let a = pod(
            "a",
            "n1",
            Some(
                r#"{"cpuset":"0-3","numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"4Gi"}}]}"#,
            ),
            "Running",
        );
        let far = pod("far", "n1", Some(r#"{"cpuset":"100-101"}"#), "Running");
        c.upsert_pod(None, &a);
        c.upsert_pod(None, &far);
        let err = view_of(&c, "n1").unwrap_err();
        assert!(
            err.unresolvable && err.reason.to_string().contains("no CPU topology"),
            "{err:?}"
        );
        assert_eq!(
            c.node("n1").unwrap().read().cpus.allocated().to_string(),
            "0-3,100-101"
        );

        c.set_topology("n1", Some(nrt(2, 4, &[])));
        let (allocated, usage) = view_of(&c, "n1").unwrap();
        assert_eq!(allocated, "0-3,100-101", "kept across the NRT's arrival");
        assert_eq!(usage[0].cpu_milli, 4000);
        assert_eq!(usage[0].memory_bytes, 4 << 30);
        assert_eq!(usage[0].single_numa_pods, 1);
        assert_eq!(usage[1], NumaUsage::default());
        let problems = c.node("n1").unwrap().read().cpus.problems();
        assert!(
            problems
                .iter()
                .any(|p| p.contains("far") && p.contains("100-101")),
            "{problems:?}"
        );
        // NRT deleted: topology gone, entries stay.
        c.set_topology("n1", None);
        assert_eq!(c.node("n1").unwrap().read().cpus.len(), 2);
    }

    #[test]
    fn release_on_terminal_delete_unassign_and_removed_annotation() {
        let c = ClusterState::new();
        c.set_topology("n1", Some(nrt(2, 4, &[])));
        let status = r#"{"cpuset":"0-3"}"#;
        let held = |c: &ClusterState| view_of(c, "n1").unwrap().0;

        let a = pod("a", "n1", Some(status), "Running");
        c.upsert_pod(None, &a);
        assert_eq!(held(&c), "0-3");
        // Terminal phase.
        c.upsert_pod(Some(&a), &pod("a", "n1", Some(status), "Succeeded"));
        assert_eq!(held(&c), "");
        // Delete.
        c.upsert_pod(None, &a);
        c.remove_pod(&a);
        assert_eq!(held(&c), "");
        // Unassign (multi-scheduler): the pod moves to no node.
        c.upsert_pod(None, &a);
        let mut unassigned = a.clone();
        unassigned.node = None;
        c.upsert_pod(Some(&a), &unassigned);
        assert_eq!(held(&c), "");
        // Annotation removed externally (koordinator keeps it; we release).
        c.upsert_pod(None, &a);
        c.upsert_pod(Some(&a), &pod("a", "n1", None, "Running"));
        assert_eq!(held(&c), "");
        assert!(c.node("n1").unwrap().read().cpus.is_empty());
    }

    #[test]
    fn update_is_release_then_add_of_exactly_the_recorded_contribution() {
        let c = ClusterState::new();
        c.set_topology("n1", Some(nrt(2, 4, &[])));
        let one = pod(
            "a",
            "n1",
            Some(
                r#"{"cpuset":"0-3","numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"2Gi"}}]}"#,
            ),
            "Running",
        );
        let two = pod(
            "a",
            "n1",
            Some(r#"{"cpuset":"8-9,12","numaNodeResources":[{"node":1,"resources":{"cpu":"3"}}]}"#),
            "Running",
        );
        let other = pod("b", "n1", Some(r#"{"cpuset":"2-3"}"#), "Running");
        c.upsert_pod(None, &other);
        c.upsert_pod(None, &one);
        c.upsert_pod(Some(&one), &one);
        {
            let e = c.node("n1").unwrap();
            let s = e.read();
            assert_eq!(
                s.cpus.refcounts().get(&2),
                Some(&2),
                "overlap counted twice"
            );
            assert_eq!(s.cpus.refcounts().get(&0), Some(&1), "replay is idempotent");
        }
        c.upsert_pod(Some(&one), &two);
        let (allocated, usage) = view_of(&c, "n1").unwrap();
        assert_eq!(allocated, "2-3,8-9,12");
        // Pod b's cpuset (no `numaNodeResources`) counts against NUMA 0 too: one NUMA node's
        // CPUs are counted once, whoever holds them.
        assert_eq!(usage[0].cpu_milli, 2000);
        assert_eq!(usage[0].memory_bytes, 0);
        assert_eq!(usage[1].cpu_milli, 3000);
        assert_eq!(usage[1].single_numa_pods, 1);
        assert_eq!(usage[0].single_numa_pods, 1, "pod b on NUMA 0");
        let e = c.node("n1").unwrap();
        let s = e.read();
        assert_eq!(s.cpus.refcounts().get(&2), Some(&1));
        assert_eq!(s.cpus.refcounts().get(&0), None);
        // Victims are released on a copy only.
        let freed = s
            .cpus
            .with_view(&[PodUid::new("b")], &CpuScoring::default(), |v| {
                v.unwrap().allocated.to_string()
            });
        assert_eq!(freed, "8-9,12");
        assert_eq!(s.cpus.allocated().to_string(), "2-3,8-9,12");
    }

    /// The NUMA shared pools, both directions, on 2 NUMA nodes of 8 CPUs: (a) a cpuset written without
    /// `numaNodeResources` (as on nodes without a NUMA policy) counts against its NUMA node's
    /// capacity for NUMA-bound shares; (b) a new cpuset leaves a NUMA node's shared pool the
    /// CPUs that the NUMA shares of pods without a cpuset need there.
    #[test]
    fn a_numa_nodes_cpus_are_counted_once_whoever_holds_them() {
        let c = ClusterState::new();
        c.set_topology("n1", Some(nrt(2, 4, &[])));
        // (a) All 8 of NUMA 0's CPUs in one cpuset
        // with no NUMA shares.
        let numa0 = view_of_numa(&c, "n1");
        c.upsert_pod(
            None,
            &pod(
                "held",
                "n1",
                Some(&format!(r#"{{"cpuset":"{numa0}"}}"#)),
                "Running",
            ),
        );
        let (_, usage) = view_of(&c, "n1").unwrap();
        assert_eq!(
            usage[0].cpu_milli, 8000,
            "NUMA 0 is full for NUMA-bound shares"
        );
        assert_eq!(usage[1].cpu_milli, 0);

        // (b) NUMA 1's whole pool backs a 7.5-CPU share of a pod without a cpuset: 8 CPUs
        // are kept for that pool; a new cpuset may take none of them.
        let d = ClusterState::new();
        d.set_topology("n1", Some(nrt(2, 4, &[])));
        d.upsert_pod(
            None,
            &pod(
                "ls",
                "n1",
                Some(r#"{"numaNodeResources":[{"node":1,"resources":{"cpu":"7500m"}}]}"#),
                "Running",
            ),
        );
        let e = d.node("n1").unwrap();
        let s = e.read();
        let (free, pool) = s.cpus.with_view(&[], &CpuScoring::default(), |v| {
            let v = v.unwrap();
            let free = v
                .topology
                .all()
                .difference(&v.allocated)
                .difference(&v.shared_pool)
                .difference(&v.reserved);
            (free, v.shared_pool)
        });
        let numa1 = s.cpus.with_view(&[], &CpuScoring::default(), |v| {
            v.unwrap().topology.numa_cpus(1)
        });
        assert_eq!(pool, numa1, "all of NUMA 1 is kept for its shared pool");
        assert!(free.is_disjoint(&numa1), "{free}");
        assert_eq!(free.len(), 8, "NUMA 0 stays free for cpusets");
        // Without the share pod the pool is given back.
        let freed = s
            .cpus
            .with_view(&[PodUid::new("ls")], &CpuScoring::default(), |v| {
                v.unwrap().shared_pool
            });
        assert!(freed.is_empty(), "{freed}");
    }

    /// NUMA 0's CPUs as a cpu list, from the node's topology.
    fn view_of_numa(c: &ClusterState, node: &str) -> String {
        let e = c.node(node).unwrap();
        let s = e.read();
        s.cpus.with_view(&[], &CpuScoring::default(), |v| {
            v.unwrap().topology.numa_cpus(0).to_string()
        })
    }

    #[test]
    fn multi_numa_pods_and_reserved_cpus() {
        let c = ClusterState::new();
        c.set_topology(
            "n1",
            Some(nrt(
                2,
                4,
                &[
                    (KUBELET_CPU_MANAGER_POLICY, r#"{"policy":"static","options":{"full-pcpus-only":"true"},"reservedCPUs":"0"}"#),
                    (POD_CPU_ALLOCS, r#"[{"uid":"k","cpuset":"1","managedByKubelet":true}]"#),
                    (NODE_RESERVATION, r#"{"reservedCPUs":"8"}"#),
                    (SYSTEM_QOS_RESOURCE, r#"{"cpuset":"15"}"#),
                ],
            )),
        );
        c.upsert_pod(
            None,
            &pod("wide", "n1", Some(r#"{"cpuset":"6-9"}"#), "Running"),
        );
        let e = c.node("n1").unwrap();
        let s = e.read();
        let (reserved, zones, usage, bind) = s.cpus.with_view(&[], &CpuScoring::default(), |v| {
            let v = v.unwrap();
            (
                v.reserved.to_string(),
                v.zones.to_vec(),
                v.usage.to_vec(),
                v.bind_policy,
            )
        });
        assert_eq!(reserved, "0-1,8,15", "all four sources");
        assert_eq!(zones[0].cpu_milli, 6000, "8 CPUs minus 0,1");
        assert_eq!(zones[1].cpu_milli, 6000, "8 CPUs minus 8,15");
        assert_eq!(usage[0].multi_numa_pods, 1);
        assert_eq!(usage[1].multi_numa_pods, 1);
        assert_eq!(
            bind,
            NodeCpuBindPolicy::FullPcpusOnly,
            "kubelet static + full-pcpus-only"
        );
        assert_eq!(s.cpus.numa_policy(), NumaPolicy::SingleNumaNode);
    }

    #[test]
    fn labels_override_the_nrt_and_none_means_none() {
        let mut l = CpuLedger::new();
        l.set_nrt(Some(nrt(2, 4, &[]).cpu));
        assert_eq!(l.numa_policy(), NumaPolicy::SingleNumaNode);
        let labels = |pairs: &[(&str, &str)]| {
            NodeCpuLabels::from_labels(
                &pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        l.set_labels(labels(&[(NUMA_TOPOLOGY_POLICY_LABEL, "Restricted")]));
        assert_eq!(l.numa_policy(), NumaPolicy::Restricted);
        l.set_labels(labels(&[(NUMA_TOPOLOGY_POLICY_LABEL, "None")]));
        assert_eq!(l.numa_policy(), NumaPolicy::None);
        l.set_labels(labels(&[(NUMA_TOPOLOGY_POLICY_LABEL, "")]));
        assert_eq!(
            l.numa_policy(),
            NumaPolicy::SingleNumaNode,
            "empty label = unset"
        );
        l.set_labels(labels(&[
            (CPU_BIND_POLICY_LABEL, "SpreadByPCPUs"),
            (NUMA_ALLOCATE_STRATEGY_LABEL, "MostAllocated"),
        ]));
        assert_eq!(l.bind_policy(), NodeCpuBindPolicy::SpreadByPcpus);
        let s = l.with_view(&[], &CpuScoring::default(), |v| v.unwrap().strategy);
        assert_eq!(s, NumaAllocateStrategy::MostAllocated);
    }

    /// Every malformed NRT annotation class makes that node unusable for cpusets, is reported
    /// with its class, and leaves the node's device ledger and the other nodes untouched.
    #[test]
    fn malformed_nrt_annotations_block_only_cpusets_on_that_node() {
        let cases: &[(&str, &str, &str, &str)] = &[
            (CPU_TOPOLOGY, "{not json", "cpu-topology", "bad_json"),
            (
                CPU_TOPOLOGY,
                r#"{"detail":[{"id":5000,"core":0,"socket":0,"node":0}]}"#,
                "cpu-topology",
                "out_of_range",
            ),
            (
                CPU_TOPOLOGY,
                r#"{"detail":[{"id":1,"core":0,"socket":0,"node":0},{"id":1,"core":1,"socket":0,"node":0}]}"#,
                "cpu-topology",
                "duplicate_cpu",
            ),
            (
                CPU_TOPOLOGY,
                r#"{"detail":[{"id":1,"socket":0,"node":0}]}"#,
                "cpu-topology",
                "missing_field",
            ),
            (
                KUBELET_CPU_MANAGER_POLICY,
                r#"{"policy":"static","reservedCPUs":"-1"}"#,
                "cpu-manager-policy",
                "negative",
            ),
            (
                NODE_RESERVATION,
                r#"{"reservedCPUs":"-3"}"#,
                "reservation",
                "negative",
            ),
            (POD_CPU_ALLOCS, r#"{"a":1}"#, "pod-cpu-allocs", "bad_json"),
            (
                SYSTEM_QOS_RESOURCE,
                r#"{"cpuset":"x"}"#,
                "system-qos-resource",
                "bad_cpu_list",
            ),
        ];
        for (key, value, annotation, problem) in cases {
            let c = ClusterState::new();
            let gpu = DeviceSlot {
                minor: 0,
                id: "g0".into(),
                healthy: true,
                total: [(GPU_CORE.to_string(), Quantity::from_units(100))].into(),
                topology: None,
                ..Default::default()
            };
            c.set_devices(
                "n1",
                Some(NodeDevices::from_slots([(DeviceType::Gpu, gpu)])),
            );
            c.set_topology("n2", Some(nrt(2, 4, &[])));
            let devices_before = c.node("n1").unwrap().read().devices.free(&[]);
            let other_before = c.debug_dump()["n2"].clone();

            let record = nrt(2, 4, &[(key, value)]);
            assert_eq!(record.cpu.problems.len(), 1, "{key}={value}");
            assert_eq!(
                record.cpu.problems[0].annotation, *annotation,
                "{key}={value}"
            );
            assert_eq!(record.cpu.problems[0].problem, *problem, "{key}={value}");
            c.set_topology("n1", Some(record));

            let err = view_of(&c, "n1").unwrap_err();
            assert!(
                err.unresolvable && err.reason.to_string().contains(annotation),
                "{err:?}"
            );
            assert_eq!(
                c.node("n1").unwrap().read().devices.free(&[]),
                devices_before
            );
            assert_eq!(c.debug_dump()["n2"], other_before);
            assert!(view_of(&c, "n2").is_ok());
        }
    }

    #[test]
    fn the_cluster_counts_nodes_that_constrain_plain_pods() {
        let c = ClusterState::new();
        let node = |labels: &[(&str, &str)]| crate::cluster::NodeRecord {
            uid: "u".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            allocatable: Default::default(),
            cpu_amplification: Default::default(),
            numa_amplification: Default::default(),
            advertised: Default::default(),
            deviceless_advertised: Default::default(),
        };
        assert_eq!(c.cpu_constraining_nodes(), 0);
        c.set_topology("n1", Some(nrt(2, 4, &[])));
        assert_eq!(c.cpu_constraining_nodes(), 1, "SingleNUMANode from the NRT");
        c.set_topology("n1", Some(nrt(2, 4, &[])));
        assert_eq!(c.cpu_constraining_nodes(), 1, "a replay counts once");
        c.set_node("n1", Some(node(&[(NUMA_TOPOLOGY_POLICY_LABEL, "None")])));
        assert_eq!(c.cpu_constraining_nodes(), 0, "the label overrides the NRT");
        c.set_node(
            "n2",
            Some(node(&[(CPU_BIND_POLICY_LABEL, "FullPCPUsOnly")])),
        );
        assert_eq!(
            c.cpu_constraining_nodes(),
            1,
            "forced bind policy, no NRT needed"
        );
        c.set_node("n1", None);
        assert_eq!(c.cpu_constraining_nodes(), 2);
        c.set_topology("n1", None);
        c.set_node("n2", None);
        assert_eq!(c.cpu_constraining_nodes(), 0);
        // A CPU amplification ratio above 1 (or one that does not parse) checks plain pods too.
        let amplified = |value: &str| crate::cluster::NodeRecord {
            cpu_amplification: crate::cluster::records::CpuAmplificationRatio::from_annotation(
                Some(value),
            ),
            ..node(&[])
        };
        c.set_node("n3", Some(amplified(r#"{"cpu":1.5}"#)));
        assert_eq!(c.cpu_constraining_nodes(), 1, "amplified CPU");
        c.set_node("n3", Some(amplified(r#"{"cpu":1}"#)));
        assert_eq!(
            c.cpu_constraining_nodes(),
            0,
            "a ratio of 1 changes nothing"
        );
        c.set_node("n3", Some(amplified("1.5")));
        assert_eq!(
            c.cpu_constraining_nodes(),
            1,
            "an invalid ratio refuses pods"
        );
        c.set_node("n3", None);
        assert_eq!(c.cpu_constraining_nodes(), 0);
        assert_eq!(c.node_count(), 0, "entries collected");
    }

    #[test]
    fn malformed_resource_status_blocks_cpusets_until_it_goes() {
        let c = ClusterState::new();
        c.set_topology("n1", Some(nrt(1, 2, &[])));
        let bad = pod("bad", "n1", Some(r#"{"cpuset":"zz"}"#), "Running");
        c.upsert_pod(None, &bad);
        let err = view_of(&c, "n1").unwrap_err();
        assert!(!err.unresolvable, "preempting the pod helps: {err:?}");
        let e = c.node("n1").unwrap();
        let ok = e
            .read()
            .cpus
            .with_view(&[PodUid::new("bad")], &CpuScoring::default(), |v| v.is_ok());
        assert!(ok, "released as a victim");
        c.remove_pod(&bad);
        assert!(view_of(&c, "n1").is_ok());
    }

    #[test]
    fn assumed_entries_share_one_lifecycle_with_devices() {
        let c = ClusterState::new();
        c.set_topology("n1", Some(nrt(1, 2, &[])));
        let e = c.node_or_create("n1");
        let at = std::time::Instant::now();
        let uid = PodUid::new("p");
        {
            let mut s = e.write();
            s.cpus.record(
                uid.clone(),
                RecordedCpus::Allocated(CpuAllocation {
                    cpuset: "0-1".parse().unwrap(),
                    numa: vec![],
                    exclusive: CpuExclusivePolicy::None,
                }),
                EntryState::Assumed { at },
            );
            let old = s.assumed_older_than(at, std::time::Duration::ZERO);
            assert_eq!(old, vec![(uid.clone(), at)], "CPU-only pods expire too");
            assert_eq!(s.entry_state(&uid), Some(EntryState::Assumed { at }));
            assert!(s.remove_if_assumed_at(&uid, at));
            assert!(s.cpus.is_empty());
        }
        // The watch replaces an assumed entry with the committed one.
        let p = pod("p", "n1", Some(r#"{"cpuset":"0-1"}"#), "Running");
        e.write().cpus.record(
            uid.clone(),
            RecordedCpus::Malformed { reason: "x".into() },
            EntryState::Assumed { at },
        );
        c.upsert_pod(None, &p);
        assert_eq!(e.read().entry_state(&uid), Some(EntryState::Committed));
        e.write().remove_assumed(&uid);
        assert_eq!(
            e.read().cpus.allocated().to_string(),
            "0-1",
            "committed stays"
        );
    }
}
