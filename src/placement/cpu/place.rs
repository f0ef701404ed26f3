//! [`place`]: the one decision for one pod on one node that filter, prioritize, preempt and
//! bind all ask (koordinator nodenumaresource `Filter`, `Reserve`, `Score`): resolve the policies, choose the NUMA hint (aligned with
//! the pod's devices when a NUMA policy applies), split the request over it and pick the
//! cpuset, and score the result.
//!
//! Unlike koordinator, a pod that only *prefers* a cpuset is checked here too (koordinator
//! skips the check in Filter on NUMA-None nodes and fails later in Reserve).
//! Pure and deterministic; callers lock, record and report.

use super::accumulator::{Ask, eligible, take_cpus};
use super::hints::{self, Choice, CpuUnit, Demand, Goal, NumaStats, Table, reason};
use super::policy::{Resolved, resolve};
use super::score::{self, Amounts};
use super::split::split;
use super::{
    CpuBindPolicy, CpuPlacement, CpuScoring, FitError, NodeCpuView, NumaMask, NumaPolicy,
    NumaShare, PodCpuRequest,
};
use crate::model::cpuset::CpuSet;

fn fail(reason: crate::placement::FitReason, unresolvable: bool) -> FitError {
    FitError::new(reason, unresolvable)
}

/// Decide for one pod on one node: `Ok(None)` = nothing CPU/NUMA-related to do here (the pod
/// has no cpuset wish, the node forces no bind policy, and no NUMA policy applies);
/// `Ok(Some(placement))` = the cpuset and/or NUMA shares, the NUMA affinity for the devices,
/// and the score; `Err` = does not fit (`unresolvable` when freeing pods can never help).
///
/// `devices`, when the pod also asks for devices: whether the device request can be met
/// using only devices on the NUMA nodes of a mask. Consulted only when a NUMA policy applies;
/// the returned `affinity` then restricts the device allocation.
pub fn place(
    view: &NodeCpuView<'_>,
    req: &PodCpuRequest,
    devices: Option<&mut dyn FnMut(NumaMask) -> bool>,
    scoring: &CpuScoring,
) -> Result<Option<CpuPlacement>, FitError> {
    let cpc = view.topology.cpus_per_core();
    let Some(res) = resolve(
        view.bind_policy,
        view.numa_policy,
        cpc,
        req,
        devices.is_some(),
    )?
    else {
        return Ok(None);
    };
    let stats = NumaStats::from_view(view);
    let d = demand(&res, req, &stats);
    let decision = choose_hint(&stats, &res, &d, devices, scoring, Goal::Best)?;
    let score = placement_score(&stats, decision, &d, scoring);
    match decision {
        Decision::NodeLevel => node_level(view, &res, score).map(Some),
        Decision::Numa(members) => numa_level(view, &stats, &res, &d, members, score).map(Some),
    }
}

/// Where the pod's CPU/NUMA needs are met: the whole node (no NUMA policy, or nothing for
/// it to align), or the NUMA nodes of a hint (zone indexes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    NodeLevel,
    Numa(u32),
}

/// Feasibility and the hint, from the counts alone (shared by `place` and the summary).
pub(crate) fn choose_hint(
    stats: &NumaStats,
    res: &Resolved,
    d: &Demand,
    devices: Option<&mut dyn FnMut(NumaMask) -> bool>,
    scoring: &CpuScoring,
    goal: Goal,
) -> Result<Decision, FitError> {
    let choice = match res.numa_policy {
        NumaPolicy::None => Choice::DontCare,
        policy => hints::choose(
            stats,
            d,
            policy,
            res.exclusive_required,
            scoring,
            devices,
            goal,
        )?,
    };
    match choice {
        Choice::DontCare => node_level_fits(stats, res).map(|()| Decision::NodeLevel),
        Choice::Mask { members, .. } => Ok(Decision::Numa(members)),
        Choice::All => {
            let all = stats.all_members();
            let avail = Table::new(stats, d, false);
            if !avail.sums_cover(all, &Demand { memory: 0, ..*d }) {
                Err(fail(reason::INSUFFICIENT_CPUS, false))
            } else if !avail.sums_cover(all, &Demand { cpu: 0, ..*d }) {
                Err(fail(reason::INSUFFICIENT_MEMORY, false))
            } else {
                Ok(Decision::Numa(all))
            }
        }
    }
}

/// The prioritize score (koordinator nodenumaresource `scoring.go`) with the operator's node `scoringStrategy`, as
/// koordinator does: over the whole node, or over the chosen NUMA nodes when a hint applies
/// (`numaScoringStrategy` only ranks hints). A NUMA node's used cpu is the larger of its NUMA
/// shares and its cpuset CPUs, so cpuset pods without NUMA shares count too. On a node that
/// amplifies its CPU, every figure is amplified as koordinator's `scoreWithAmplifiedCPUs` and
/// `calculateAllocatableAndRequested` amplify them: the allocatable, the CPUs cpusets hold
/// and a cpuset pod's own request ([`demand`]).
pub(crate) fn placement_score(
    stats: &NumaStats,
    decision: Decision,
    d: &Demand,
    scoring: &CpuScoring,
) -> i64 {
    let members = match decision {
        Decision::NodeLevel => stats.all_members(),
        Decision::Numa(m) => m,
    };
    let (mut cpu, mem) = hints::scope_amounts(stats, members, None);
    if decision == Decision::NodeLevel {
        let amp = stats.amplification;
        if stats.len == 0 {
            // No NUMA zones: the node's usable CPUs themselves are the allocatable.
            cpu.allocatable = amp.cpu(i64::from(stats.node.usable_cpus) * 1000);
        }
        cpu.requested = cpu
            .requested
            .max(amp.cpu(i64::from(stats.node.allocated_cpus) * 1000));
    }
    score::score(
        scoring,
        scoring.node_strategy,
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

/// `place` for prioritize: the score, 0 when the trial fails (koordinator nodenumaresource `Score`), `None` when
/// nothing CPU/NUMA-related applies.
pub fn score_or_zero(
    view: &NodeCpuView<'_>,
    req: &PodCpuRequest,
    devices: Option<&mut dyn FnMut(NumaMask) -> bool>,
    scoring: &CpuScoring,
) -> Option<i64> {
    match place(view, req, devices, scoring) {
        Ok(p) => p.map(|p| p.score),
        Err(_) => Some(0),
    }
}

/// The request in split units (whole cores for a required FullPCPUs cpuset). The split takes
/// the request as asked; only the scores see a cpuset pod's cpu amplified (koordinator's
/// `getResourceOptions` amplifies `requests`, `allocateResourcesByHint` splits
/// `originalRequests`).
pub(crate) fn demand(res: &Resolved, req: &PodCpuRequest, stats: &NumaStats) -> Demand {
    let cpus_per_core = stats.cpus_per_core;
    let pod_cpu_milli = req.cpu_milli.max(0);
    let (unit, cpu) = match res.cpuset {
        None => (CpuUnit::Milli, req.cpu_milli.max(0)),
        Some(plan) => {
            let cpus = i64::try_from(plan.cpus).unwrap_or(i64::MAX);
            match (plan.policy, plan.required) {
                (CpuBindPolicy::FullPcpus, true) => {
                    (CpuUnit::Core, cpus / i64::from(cpus_per_core.max(1)))
                }
                (CpuBindPolicy::SpreadByPcpus, true) => (CpuUnit::CpuOnePerCore, cpus),
                _ => (CpuUnit::Cpu, cpus),
            }
        }
    };
    Demand {
        unit,
        cpu,
        memory: req.memory_bytes.max(0),
        pod_cpu_milli: if res.cpuset.is_some() {
            stats.amplification.cpu(pod_cpu_milli)
        } else {
            pod_cpu_milli
        },
    }
}

/// Whole-node cpuset feasibility from counts (no NUMA policy in force): `Ok` or the reason.
pub(crate) fn node_level_fits(stats: &NumaStats, res: &Resolved) -> Result<(), FitError> {
    let Some(plan) = res.cpuset else {
        return Ok(());
    };
    let n = &stats.node;
    let (free, usable) = match (plan.policy, plan.required) {
        (CpuBindPolicy::FullPcpus, true) => (n.free_full_cpus, n.usable_full_cpus),
        (CpuBindPolicy::SpreadByPcpus, true) => (n.free_cores, n.usable_cores),
        _ => (n.free_cpus, n.usable_cpus),
    };
    if plan.cpus > usize::from(usable) {
        return Err(fail(reason::CPU_LARGER_THAN_NODE, true));
    }
    if plan.cpus > usize::from(free) {
        return Err(fail(reason::INSUFFICIENT_CPUS, false));
    }
    Ok(())
}

fn free_cpus(view: &NodeCpuView<'_>) -> CpuSet {
    view.topology
        .all()
        .difference(&view.allocated)
        .difference(&view.shared_pool)
        .difference(&view.reserved)
}

fn ask(view: &NodeCpuView<'_>, res: &Resolved, need: usize) -> Option<Ask> {
    res.cpuset.map(|plan| Ask {
        need,
        policy: plan.policy,
        strategy: view.strategy,
        exclusive: plan.exclusive,
        pcpu_exclusive: view.pcpu_exclusive,
        numa_exclusive: view.numa_exclusive,
    })
}

fn node_level(
    view: &NodeCpuView<'_>,
    res: &Resolved,
    score: i64,
) -> Result<CpuPlacement, FitError> {
    let mut cpuset = CpuSet::new();
    if let (Some(plan), Some(a)) = (res.cpuset, ask(view, res, res.cpuset.map_or(0, |p| p.cpus))) {
        let pool = eligible(view.topology, free_cpus(view), plan.policy, plan.required);
        cpuset = take_cpus(view.topology, pool, &a)
            .ok_or_else(|| fail(reason::INSUFFICIENT_CPUS, false))?;
        verify(view, res, cpuset)?;
    }
    Ok(CpuPlacement {
        cpuset,
        numa: Vec::new(),
        score,
        affinity: None,
    })
}

pub(crate) fn numa_level(
    view: &NodeCpuView<'_>,
    stats: &NumaStats,
    res: &Resolved,
    demand: &Demand,
    members: u32,
    score: i64,
) -> Result<CpuPlacement, FitError> {
    let cpc = stats.cpus_per_core;
    let d = *demand;
    let avail = Table::new(stats, &d, false);
    let cpu_split =
        split(&avail.cpu, members, d.cpu).ok_or_else(|| fail(reason::INSUFFICIENT_CPUS, false))?;
    let mem_split = split(&avail.memory, members, d.memory)
        .ok_or_else(|| fail(reason::INSUFFICIENT_MEMORY, false))?;
    let milli_per_unit = d.milli_per_unit(cpc);
    let cpus_per_unit = match d.unit {
        CpuUnit::Core => usize::from(cpc.max(1)),
        _ => 1,
    };
    let mut cpuset = CpuSet::new();
    let mut numa = Vec::new();
    let pool = res
        .cpuset
        .map(|plan| eligible(view.topology, free_cpus(view), plan.policy, plan.required));
    for (i, z) in stats.zones().iter().enumerate() {
        if members & (1 << i) == 0 {
            continue;
        }
        let units = cpu_split[i];
        if let Some(pool) = pool
            && units > 0
        {
            let need = usize::try_from(units).unwrap_or(usize::MAX) * cpus_per_unit;
            let region = pool.intersection(&view.topology.numa_cpus(z.id.into()));
            let a = ask(view, res, need).ok_or_else(|| fail(reason::INSUFFICIENT_CPUS, false))?;
            let got = take_cpus(view.topology, region, &a)
                .ok_or_else(|| fail(reason::INSUFFICIENT_CPUS, false))?;
            cpuset = cpuset.union(&got);
        }
        let share = NumaShare {
            numa: hints::zone_id(stats, i),
            cpu_milli: units * milli_per_unit,
            memory_bytes: mem_split[i],
        };
        if share.cpu_milli > 0 || share.memory_bytes > 0 {
            numa.push(share);
        }
    }
    if res.cpuset.is_some() {
        verify(view, res, cpuset)?;
    }
    Ok(CpuPlacement {
        cpuset,
        numa,
        score,
        affinity: Some(stats.mask_of(members)),
    })
}

/// The last line of the promise (koordinator `cpu_accumulator.go`): the set has the size asked, holds
/// no allocated or reserved CPU, and honours a required policy. A failure here is a bug in
/// the accumulator; it is reported as a non-fit rather than handed out.
fn verify(view: &NodeCpuView<'_>, res: &Resolved, set: CpuSet) -> Result<(), FitError> {
    let Some(plan) = res.cpuset else {
        return Ok(());
    };
    let ok_size = set.len() == plan.cpus;
    let ok_free = set.is_subset(&free_cpus(view));
    let ok_policy = !plan.required
        || view.topology.cores().iter().all(|core| {
            let n = core.cpus.intersection(&set).len();
            match plan.policy {
                CpuBindPolicy::FullPcpus => n == 0 || n == core.cpus.len(),
                CpuBindPolicy::SpreadByPcpus => n <= 1,
            }
        });
    if ok_size && ok_free && ok_policy {
        Ok(())
    } else {
        tracing::error!(
            cpuset = %set,
            cpus = plan.cpus,
            ok_size,
            ok_free,
            ok_policy,
            "cpuset accumulator produced an invalid set; refusing it"
        );
        Err(fail(crate::placement::FitReason::InvalidCpuset, false))
    }
}
