//! NUMA hint generation, the kubelet-style merge with device hints, and the BestEffort /
//! Restricted / SingleNUMANode decisions (koordinator `pkg/scheduler/frameworkext/topologymanager`, a clone of the kubelet's topology manager).
//!
//! Works on [`NumaStats`], a fixed-size per-NUMA table built once per node view (and kept by
//! the filter summary), so enumerating every non-empty NUMA subset is arithmetic on bitmasks:
//! no allocation and no trial cpuset per subset. That is exact, not an approximation: the NUMA
//! split succeeds on a mask exactly when the mask's availabilities sum to the need (see
//! [`super::split::split`]), and the accumulator always finds `q` CPUs in a NUMA node that has
//! `q` eligible free CPUs, so "the trial allocation succeeds" is "the sums cover the need".
//!
//! Where koordinator and the kubelet diverge this follows the kubelet, on purpose:
//! - `preferred` = the mask has the minimum number of NUMA nodes that could hold the request
//!   *by capacity* (kubelet), not by current availability, and Restricted does not mark every
//!   feasible hint preferred (a koordinator quirk). So a request that fits one NUMA node
//!   by capacity but only two right now is rejected by Restricted (resolvable: freeing helps),
//!   and admitted by BestEffort.
//! - device hints (koordinator `deviceshare`): every mask the caller's callback accepts;
//!   preferred = the minimal size among accepted masks.
//! - merge: a merged hint is satisfied only when every provider's mask is the same (the AND of
//!   differing masks is narrower than one of them, which koordinator counts as unsatisfied), so
//!   the cross product collapses to one pass over masks; preferred iff every provider prefers
//!   it and exclusivity does not demote it.
//! - best: preferred beats non-preferred; then fewer NUMA nodes; then the higher NUMA score
//!   (`numaScoringStrategy`); then the lower ids.
//!
//! - a one-NUMA node under SingleNUMANode records its share on NUMA 0 (koordinator records
//!   none there; koordlet then binds to NUMA 0's pool either way) so the ledger's
//!   per-NUMA sums stay complete.
//! - a node that lists no NUMA zones gives no hints: every provider is "don't care" and the
//!   pod is admitted without an affinity, as the kubelet does.
//!
//! Owns no policy resolution (see [`super::policy`]) and chooses no CPUs (see
//! [`super::accumulator`]).

use std::ops::ControlFlow;

use super::score::{self, Amounts};
use super::{
    CpuScoring, FitError, MAX_NUMA_NODES, NodeCpuView, NumaAmplification, NumaId, NumaMask,
    NumaPolicy,
};

/// One NUMA node's counts, independent of any pod. CPU counts fit `u16`: a `CpuSet` holds at
/// most 1,024 CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct NumaStat {
    pub id: u8,
    /// Free = neither allocated nor reserved.
    pub free_cpus: u16,
    /// CPUs of cores whose every hyperthread is free.
    pub free_full_cpus: u16,
    /// Cores with at least one free CPU.
    pub free_cores: u16,
    /// Usable = not reserved (what freeing every pod would leave).
    pub usable_cpus: u16,
    pub usable_full_cpus: u16,
    pub usable_cores: u16,
    /// CPUs held by cpusets (for scoring nodes whose pods have cpusets but no NUMA shares).
    pub allocated_cpus: u16,
    /// Pods confined to this NUMA node hold it (exclusivity "single").
    pub single: bool,
    /// Pods spanning this and other NUMA nodes hold it (exclusivity "shared").
    pub multi: bool,
    pub cpu_milli: i64,
    pub cpu_used_milli: i64,
    pub memory_bytes: i64,
    pub memory_used_bytes: i64,
}

/// Whole-node CPU counts (every CPU of the topology, zones or not).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct CoreCounts {
    pub free_cpus: u16,
    pub free_full_cpus: u16,
    pub free_cores: u16,
    pub usable_cpus: u16,
    pub usable_full_cpus: u16,
    pub usable_cores: u16,
    pub allocated_cpus: u16,
}

/// A node's per-NUMA table plus whole-node counts. Fixed size, `Copy`, no heap.
///
/// `repr(C)`, whole-node fields first: the table has room for [`MAX_NUMA_NODES`] zones but a
/// node uses its first `len` (usually two), so a read touches the first few cache lines of
/// this ~900-byte value, not also its last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct NumaStats {
    /// Zones in use (ascending id), at most [`MAX_NUMA_NODES`].
    pub len: u8,
    pub cpus_per_core: u16,
    pub node: CoreCounts,
    /// The ratios the zones' figures were amplified by; scoring amplifies a cpuset pod's
    /// request and the node's cpuset CPUs by the same.
    pub amplification: NumaAmplification,
    pub zones: [NumaStat; MAX_NUMA_NODES],
}

fn c16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

impl NumaStats {
    /// Zones with an id at or above [`MAX_NUMA_NODES`] cannot be named by a [`NumaMask`] and
    /// are left out (`CpuTopology` already rejects such ids for CPUs).
    pub fn from_view(view: &NodeCpuView<'_>) -> Self {
        let topo = view.topology;
        let free = topo
            .all()
            .difference(&view.allocated)
            .difference(&view.shared_pool)
            .difference(&view.reserved);
        let usable = topo.all().difference(&view.reserved);
        let amp = view.amplification;
        let mut zones = [NumaStat::default(); MAX_NUMA_NODES];
        let mut len = 0usize;
        let mut index_of = [u8::MAX; MAX_NUMA_NODES];
        for (i, z) in view.zones.iter().enumerate() {
            if len == MAX_NUMA_NODES || z.id as usize >= MAX_NUMA_NODES {
                continue;
            }
            let usage = view.usage.get(i).copied().unwrap_or_default();
            let cpus = topo.numa_cpus(z.id);
            let allocated_cpus = c16(cpus.intersection(&view.allocated).len());
            zones[len] = NumaStat {
                id: z.id as u8,
                free_cpus: c16(cpus.intersection(&free).len()),
                usable_cpus: c16(cpus.intersection(&usable).len()),
                allocated_cpus,
                single: usage.single_numa_pods > 0,
                multi: usage.multi_numa_pods > 0,
                cpu_milli: amp.cpu(z.cpu_milli),
                cpu_used_milli: amp.used_cpu(usage.cpu_milli, allocated_cpus),
                memory_bytes: amp.memory(z.memory_bytes),
                memory_used_bytes: usage.memory_bytes,
                ..NumaStat::default()
            };
            index_of[z.id as usize] = len as u8;
            len += 1;
        }
        let mut node = CoreCounts {
            free_cpus: c16(free.len()),
            usable_cpus: c16(usable.len()),
            allocated_cpus: c16(topo.all().intersection(&view.allocated).len()),
            ..CoreCounts::default()
        };
        for core in topo.cores() {
            let total = core.cpus.len();
            let f = core.cpus.intersection(&free).len();
            let u = core.cpus.intersection(&usable).len();
            let full_free = if f == total { f } else { 0 };
            let full_usable = if u == total { u } else { 0 };
            node.free_full_cpus += c16(full_free);
            node.usable_full_cpus += c16(full_usable);
            node.free_cores += u16::from(f > 0);
            node.usable_cores += u16::from(u > 0);
            let idx = index_of.get(core.numa as usize).copied().unwrap_or(u8::MAX);
            if let Some(z) = zones.get_mut(idx as usize) {
                z.free_full_cpus += c16(full_free);
                z.usable_full_cpus += c16(full_usable);
                z.free_cores += u16::from(f > 0);
                z.usable_cores += u16::from(u > 0);
            }
        }
        NumaStats {
            len: len as u8,
            zones,
            node,
            amplification: amp,
            cpus_per_core: c16(topo.cpus_per_core()),
        }
    }

    pub fn zones(&self) -> &[NumaStat] {
        &self.zones[..self.len as usize]
    }

    /// The NUMA ids of the zone indexes set in `members`.
    pub fn mask_of(&self, members: u32) -> NumaMask {
        let mut m = 0u16;
        for (i, z) in self.zones().iter().enumerate() {
            if members & (1 << i) != 0 {
                m |= 1 << z.id;
            }
        }
        NumaMask(m)
    }

    pub fn all_members(&self) -> u32 {
        (1u32 << self.len) - 1
    }
}

/// Which CPUs of a NUMA node count for the pod, and in what unit its cpu is split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuUnit {
    /// No cpuset: millicores of the NUMA node's shared pool.
    Milli,
    /// A cpuset of whole CPUs: any free CPU (no required policy).
    Cpu,
    /// A required SpreadByPCPUs cpuset: one CPU per core with a free CPU.
    CpuOnePerCore,
    /// A required FullPCPUs cpuset: whole free cores (`cpus_per_core` CPUs each).
    Core,
}

/// A pod's request in the units the split and the hints use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    pub unit: CpuUnit,
    /// In `unit`s.
    pub cpu: i64,
    pub memory: i64,
    /// For scoring.
    pub pod_cpu_milli: i64,
}

impl Demand {
    /// Millicores per unit.
    pub fn milli_per_unit(&self, cpus_per_core: u16) -> i64 {
        match self.unit {
            CpuUnit::Milli => 1,
            CpuUnit::Cpu | CpuUnit::CpuOnePerCore => 1000,
            CpuUnit::Core => 1000 * i64::from(cpus_per_core.max(1)),
        }
    }

    fn cpu_units(&self, z: &NumaStat, cpc: u16, capacity: bool) -> i64 {
        let milli = if capacity {
            z.cpu_milli
        } else {
            z.cpu_milli - z.cpu_used_milli
        }
        .max(0);
        let per = self.milli_per_unit(cpc);
        let cpus = |free: u16, usable: u16| i64::from(if capacity { usable } else { free });
        match self.unit {
            CpuUnit::Milli => milli,
            CpuUnit::Cpu => cpus(z.free_cpus, z.usable_cpus).min(milli / per),
            CpuUnit::CpuOnePerCore => cpus(z.free_cores, z.usable_cores).min(milli / per),
            CpuUnit::Core => (cpus(z.free_full_cpus, z.usable_full_cpus) / i64::from(cpc.max(1)))
                .min(milli / per),
        }
    }

    fn memory_units(z: &NumaStat, capacity: bool) -> i64 {
        if capacity {
            z.memory_bytes.max(0)
        } else {
            (z.memory_bytes - z.memory_used_bytes).max(0)
        }
    }
}

/// Per-zone availabilities (or capacities) of one request, in its units.
#[derive(Clone, Copy, Debug)]
pub struct Table {
    pub cpu: [i64; MAX_NUMA_NODES],
    pub memory: [i64; MAX_NUMA_NODES],
}

impl Table {
    pub fn new(stats: &NumaStats, demand: &Demand, capacity: bool) -> Self {
        let mut t = Table {
            cpu: [0; MAX_NUMA_NODES],
            memory: [0; MAX_NUMA_NODES],
        };
        for (i, z) in stats.zones().iter().enumerate() {
            t.cpu[i] = demand.cpu_units(z, stats.cpus_per_core, capacity);
            t.memory[i] = Demand::memory_units(z, capacity);
        }
        t
    }

    /// Whether the members hold `need` of one resource, every member contributing some (a
    /// mask that includes a NUMA node lacking the resource is no hint for it, as koordinator).
    fn covers(amounts: &[i64; MAX_NUMA_NODES], members: u32, need: i64) -> bool {
        if need <= 0 {
            return true;
        }
        let mut sum = 0i64;
        let mut m = members;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            if amounts[i] <= 0 {
                return false;
            }
            sum = sum.saturating_add(amounts[i]);
        }
        sum >= need
    }

    pub fn cpu_fits(&self, members: u32, d: &Demand) -> bool {
        Self::covers(&self.cpu, members, d.cpu)
    }

    pub fn memory_fits(&self, members: u32, d: &Demand) -> bool {
        Self::covers(&self.memory, members, d.memory)
    }

    pub fn fits(&self, members: u32, d: &Demand) -> bool {
        self.cpu_fits(members, d) && self.memory_fits(members, d)
    }

    /// Sum over the members, ignoring the "every member contributes" rule (the BestEffort
    /// all-NUMA fallback splits over every node, contributing or not).
    pub fn sums_cover(&self, members: u32, d: &Demand) -> bool {
        let sum = |a: &[i64; MAX_NUMA_NODES]| -> i64 {
            (0..MAX_NUMA_NODES)
                .filter(|i| members & (1 << i) != 0)
                .map(|i| a[i])
                .fold(0i64, i64::saturating_add)
        };
        sum(&self.cpu) >= d.cpu && sum(&self.memory) >= d.memory
    }
}

/// Every `k`-element subset of `n` zone indexes, ascending (Gosper's hack). `Copy`, no heap.
#[derive(Clone, Copy, Debug)]
pub struct SubsetsOfSize {
    cur: u32,
    limit: u32,
}

impl SubsetsOfSize {
    pub fn new(n: usize, k: usize) -> Self {
        if k == 0 || k > n || n > MAX_NUMA_NODES {
            return SubsetsOfSize { cur: 0, limit: 0 };
        }
        SubsetsOfSize {
            cur: (1u32 << k) - 1,
            limit: 1u32 << n,
        }
    }
}

impl Iterator for SubsetsOfSize {
    type Item = u32;
    fn next(&mut self) -> Option<u32> {
        let m = self.cur;
        if m == 0 || m >= self.limit {
            return None;
        }
        let c = m & m.wrapping_neg();
        let r = m + c;
        self.cur = (((r ^ m) >> 2) / c) | r;
        Some(m)
    }
}

/// What the merge decided for one pod on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// No NUMA-tracked resource is requested or the node lists no NUMA zones: every provider
    /// is "don't care", nothing is aligned (kubelet admits such pods with no affinity).
    DontCare,
    /// The chosen hint (zone indexes).
    Mask { members: u32, preferred: bool },
    /// BestEffort with no satisfiable merged hint: the whole node (kubelet/koordinator
    /// BestEffort falls back to every NUMA node).
    All,
}

/// Categorical reasons (FailedNodes / FailedAndUnresolvableNodes), named as placement uses
/// them; their words and metric classes live in [`crate::placement::fit_error`].
pub mod reason {
    use crate::placement::FitReason;
    pub const CPU_LARGER_THAN_NODE: FitReason = FitReason::CpuLargerThanNode;
    pub const MEMORY_LARGER_THAN_NODE: FitReason = FitReason::MemoryLargerThanNode;
    pub const CPU_LARGER_THAN_NUMA: FitReason = FitReason::CpuLargerThanNuma;
    pub const MEMORY_LARGER_THAN_NUMA: FitReason = FitReason::MemoryLargerThanNuma;
    pub const LARGER_THAN_NUMA: FitReason = FitReason::LargerThanNuma;
    pub const INSUFFICIENT_CPUS: FitReason = FitReason::InsufficientCpus;
    pub const INSUFFICIENT_MEMORY: FitReason = FitReason::InsufficientNumaMemory;
    pub const CPUS_ONE_NUMA: FitReason = FitReason::CpusOnOneNuma;
    pub const MEMORY_ONE_NUMA: FitReason = FitReason::MemoryOnOneNuma;
    pub const CPU_MEMORY_ONE_NUMA: FitReason = FitReason::CpuAndMemoryOnOneNuma;
    pub const NOT_PREFERRED: FitReason = FitReason::NotOnFewestNuma;
    pub const DEVICES_UNALIGNED: FitReason = FitReason::DevicesUnaligned;
    pub const NO_COMMON_NUMA: FitReason = FitReason::NoCommonNuma;
    pub const EXCLUSIVE: FitReason = FitReason::NumaExclusive;
}

fn fail(reason: crate::placement::FitReason, unresolvable: bool) -> FitError {
    FitError::new(reason, unresolvable)
}

#[derive(Clone, Copy, Debug)]
struct Best {
    members: u32,
    size: u32,
    preferred: bool,
    score: i64,
}

/// NUMA score of a hint (`numaScoringStrategy`) over the members' totals, as koordinator's
/// `generateResourceHints` scores it: requested is the members' total less what they have
/// available, and for a required FullPCPUs or SpreadByPCPUs cpuset what a NUMA node has
/// available is at most its eligible free CPUs × 1000 (`trimNUMANodeResources`: whole free
/// cores, or one CPU per core with a free CPU; un-amplified, so on a node that amplifies its
/// CPU the capacity amplification added counts as requested for such a pod).
pub fn hint_score(stats: &NumaStats, members: u32, d: &Demand, scoring: &CpuScoring) -> i64 {
    let (cpu, mem) = scope_amounts(stats, members, Some(d.unit));
    score::score(
        scoring,
        scoring.numa_strategy,
        Amounts {
            pod: d.pod_cpu_milli,
            ..cpu
        },
        Amounts {
            pod: d.memory,
            ..mem
        },
    )
}

/// Allocatable and requested cpu (milli) and memory over the members; a NUMA node's used cpu
/// is the larger of its NUMA shares and its cpuset CPUs (pods with cpusets but no NUMA share),
/// both amplified on a node that amplifies its CPU. With the `unit` of a required cpuset
/// policy, what is not available to it counts as requested ([`hint_score`]); requested beyond
/// the allocatable scores as the allocatable would, so the two forms agree elsewhere.
pub fn scope_amounts(stats: &NumaStats, members: u32, unit: Option<CpuUnit>) -> (Amounts, Amounts) {
    let amp = stats.amplification;
    let mut cpu = Amounts::default();
    let mut mem = Amounts::default();
    for (i, z) in stats.zones().iter().enumerate() {
        if members & (1 << i) == 0 {
            continue;
        }
        let used = z
            .cpu_used_milli
            .max(amp.cpu(i64::from(z.allocated_cpus) * 1000));
        let eligible = match unit {
            Some(CpuUnit::Core) => Some(z.free_full_cpus),
            Some(CpuUnit::CpuOnePerCore) => Some(z.free_cores),
            _ => None,
        };
        cpu.allocatable += z.cpu_milli;
        cpu.requested += match eligible {
            Some(cpus) => z.cpu_milli - (z.cpu_milli - used).max(0).min(i64::from(cpus) * 1000),
            None => used,
        };
        mem.allocatable += z.memory_bytes;
        mem.requested += z.memory_used_bytes;
    }
    (cpu, mem)
}

/// What [`choose`] must find.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goal {
    /// The hint the kubelet's merge picks (placement, scoring): every hint of the winning size
    /// is scored.
    Best,
    /// Whether the pod fits (filter): the first preferred hint found settles it, unscored. The
    /// answer (`Ok` or the error and its reason) is [`Goal::Best`]'s; only which preferred
    /// mask `Ok` names may differ.
    AnyFit,
}

/// Generates the CPU/memory hints of `d` (and the device hints through `devices`), merges
/// them and applies `policy`. `policy` is never `None` here.
pub fn choose(
    stats: &NumaStats,
    d: &Demand,
    policy: NumaPolicy,
    exclusive_required: bool,
    scoring: &CpuScoring,
    mut devices: Option<&mut dyn FnMut(NumaMask) -> bool>,
    goal: Goal,
) -> Result<Choice, FitError> {
    let n = stats.len as usize;
    let requested = d.cpu > 0 || d.memory > 0;
    if n == 0 || policy == NumaPolicy::None || (!requested && devices.is_none()) {
        return Ok(Choice::DontCare);
    }
    let all = stats.all_members();
    let cap = Table::new(stats, d, true);
    if !cap.sums_cover(all, &Demand { memory: 0, ..*d }) {
        return Err(fail(reason::CPU_LARGER_THAN_NODE, true));
    }
    if !cap.sums_cover(all, &Demand { cpu: 0, ..*d }) {
        return Err(fail(reason::MEMORY_LARGER_THAN_NODE, true));
    }
    // The kubelet's "minimum NUMA nodes by capacity": the first capacity-feasible size.
    let min_by_capacity = (1..=n)
        .find(|&k| SubsetsOfSize::new(n, k).any(|m| cap.fits(m, d)))
        .map_or(n as u32 + 1, |k| k as u32);
    let single_only = policy == NumaPolicy::SingleNumaNode;
    if requested && min_by_capacity > n as u32 && policy != NumaPolicy::BestEffort {
        return Err(fail(reason::NO_COMMON_NUMA, true));
    }
    if single_only && requested && min_by_capacity > 1 {
        let cpu_one = SubsetsOfSize::new(n, 1).any(|m| cap.cpu_fits(m, d));
        let mem_one = SubsetsOfSize::new(n, 1).any(|m| cap.memory_fits(m, d));
        let r = match (cpu_one, mem_one) {
            (false, true) => reason::CPU_LARGER_THAN_NUMA,
            (true, false) => reason::MEMORY_LARGER_THAN_NUMA,
            _ => reason::LARGER_THAN_NUMA,
        };
        return Err(fail(r, true));
    }
    let avail = Table::new(stats, d, false);
    let max_size = if single_only { 1 } else { n };
    let mut best: Option<Best> = None;
    let mut device_min: Option<u32> = None;
    let (mut any_cpu, mut any_mem, mut any_both, mut any_joint, mut any_dev) =
        (false, false, false, false, false);
    for k in 1..=max_size {
        let flow = SubsetsOfSize::new(n, k).try_for_each(|m| {
            let cpu_ok = avail.cpu_fits(m, d);
            let mem_ok = avail.memory_fits(m, d);
            any_cpu |= cpu_ok;
            any_mem |= mem_ok;
            let both = cpu_ok && mem_ok;
            any_both |= both;
            let dev_ok = match devices.as_mut() {
                None => true,
                // Until the first device-feasible size is known every mask is asked, so the
                // device "preferred" (minimal size) is right; after that only masks the
                // CPU/memory side can take matter.
                Some(f) if device_min.is_none() || both => {
                    let ok = f(stats.mask_of(m));
                    if ok && device_min.is_none() {
                        device_min = Some(k as u32);
                    }
                    ok
                }
                Some(_) => false,
            };
            any_dev |= dev_ok;
            if !(both && dev_ok) {
                return ControlFlow::Continue(());
            }
            any_joint = true;
            let size = k as u32;
            let demoted = exclusive_required && demotes(stats, m, size);
            let preferred = (!requested || size == min_by_capacity)
                && device_min.is_none_or(|dm| dm == size)
                && !demoted;
            if preferred && goal == Goal::AnyFit {
                // A preferred hint is final (larger sizes never beat it), whichever it is.
                return ControlFlow::Break(m);
            }
            let s = hint_score(stats, m, d, scoring);
            let better = match best {
                None => true,
                Some(b) => {
                    (preferred && !b.preferred)
                        || (preferred == b.preferred
                            && (size < b.size || (size == b.size && s > b.score)))
                }
            };
            if better {
                best = Some(Best {
                    members: m,
                    size,
                    preferred,
                    score: s,
                });
            }
            ControlFlow::Continue(())
        });
        if let ControlFlow::Break(members) = flow {
            return Ok(Choice::Mask {
                members,
                preferred: true,
            });
        }
        // Larger masks can never beat a preferred hint of this size.
        if best.is_some_and(|b| b.preferred) {
            break;
        }
    }
    match (policy, best) {
        (_, Some(b)) if b.preferred => Ok(Choice::Mask {
            members: b.members,
            preferred: true,
        }),
        (NumaPolicy::BestEffort, Some(b)) => Ok(Choice::Mask {
            members: b.members,
            preferred: false,
        }),
        (NumaPolicy::BestEffort, None) => Ok(Choice::All),
        (_, found) => {
            let r = if !any_cpu {
                if single_only {
                    reason::CPUS_ONE_NUMA
                } else {
                    reason::INSUFFICIENT_CPUS
                }
            } else if !any_mem {
                if single_only {
                    reason::MEMORY_ONE_NUMA
                } else {
                    reason::INSUFFICIENT_MEMORY
                }
            } else if !any_both {
                reason::CPU_MEMORY_ONE_NUMA
            } else if !any_joint || !any_dev {
                reason::DEVICES_UNALIGNED
            } else if found.is_some() && exclusive_required && all_demoted(stats, found) {
                reason::EXCLUSIVE
            } else {
                reason::NOT_PREFERRED
            };
            Err(fail(r, false))
        }
    }
}

/// `singleNUMANodeExclusive=Required`: a multi-NUMA hint touching a NUMA node that holds
/// single-NUMA pods, or a single-NUMA hint on a NUMA node that multi-NUMA pods share, is
/// demoted to non-preferred.
fn demotes(stats: &NumaStats, members: u32, size: u32) -> bool {
    stats
        .zones()
        .iter()
        .enumerate()
        .any(|(i, z)| members & (1 << i) != 0 && if size > 1 { z.single } else { z.multi })
}

fn all_demoted(stats: &NumaStats, found: Option<Best>) -> bool {
    found.is_some_and(|b| demotes(stats, b.members, b.size))
}

/// NUMA id of a zone index.
pub fn zone_id(stats: &NumaStats, index: usize) -> NumaId {
    NumaId::from(stats.zones[index].id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets_are_ascending_within_a_size_and_complete() {
        let v: Vec<u32> = SubsetsOfSize::new(4, 2).collect();
        assert_eq!(v, vec![0b0011, 0b0101, 0b0110, 0b1001, 0b1010, 0b1100]);
        let total: usize = (1..=8).map(|k| SubsetsOfSize::new(8, k).count()).sum();
        assert_eq!(total, 255);
        assert_eq!(SubsetsOfSize::new(16, 16).collect::<Vec<_>>(), vec![0xffff]);
        assert_eq!(SubsetsOfSize::new(3, 0).count(), 0);
        assert_eq!(SubsetsOfSize::new(3, 4).count(), 0);
        assert_eq!(SubsetsOfSize::new(1, 1).collect::<Vec<_>>(), vec![1]);
    }
}
