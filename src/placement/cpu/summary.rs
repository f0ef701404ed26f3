//! [`CpuSummary`]: a fixed-size per-node CPU summary for filter at cluster scale, and
//! [`fast_feasible`], which answers "does this pod fit" from it exactly as [`super::place()`]
//! would, without building a cpuset.
//!
//! The summary is the node's [`NumaStats`] (per NUMA: free CPUs, free whole-core CPUs, free
//! cores, the same three with every pod gone, cpu and memory allocatable and used, the
//! exclusivity flags; node totals) plus its policies. `Copy`, no heap, built once per ledger
//! change by the caller; nothing here reads a ledger.
//!
//! Exactness rests on two facts proved in `hints` and `split`: the NUMA split succeeds exactly
//! when a mask's availabilities cover the need, and the accumulator always fills a need from
//! a pool that holds it. The only case left to [`super::place()`] is device alignment (the
//! device callback needs the device ledger), for which `fast_feasible` returns `None`. A
//! property test holds the two equal on generated nodes.

use super::hints::{Demand, Goal, NumaStats};
use super::place::{Decision, choose_hint, demand, placement_score};
use super::policy::resolve;
use super::{
    CpuScoring, FitError, NodeCpuBindPolicy, NodeCpuView, NumaMask, NumaPolicy, PodCpuRequest,
};

/// A node's CPU/NUMA state reduced to what feasibility needs. `repr(C)`, policies before the
/// large table, for the reason [`NumaStats`] gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct CpuSummary {
    pub bind_policy: NodeCpuBindPolicy,
    pub numa_policy: NumaPolicy,
    pub stats: NumaStats,
}

impl CpuSummary {
    pub fn new(view: &NodeCpuView<'_>) -> Self {
        CpuSummary {
            stats: NumaStats::from_view(view),
            bind_policy: view.bind_policy,
            numa_policy: view.numa_policy,
        }
    }
}

/// `place`'s decision, from the summary. `None` when only `place` can answer: a NUMA policy
/// applies, the pod also asks for devices (`has_devices`) and no `devices` callback is given.
/// Inside: `Ok(None)` when nothing CPU/NUMA-related applies to the pod; with the decision, the
/// request in the units it was decided in (the score reads it).
fn summary_decision(
    summary: &CpuSummary,
    req: &PodCpuRequest,
    has_devices: bool,
    devices: Option<&mut dyn FnMut(NumaMask) -> bool>,
    scoring: &CpuScoring,
    goal: Goal,
) -> Option<Result<Option<(Decision, Demand)>, FitError>> {
    let stats = &summary.stats;
    let res = match resolve(
        summary.bind_policy,
        summary.numa_policy,
        usize::from(stats.cpus_per_core),
        req,
        has_devices,
    ) {
        Err(e) => return Some(Err(e)),
        Ok(None) => return Some(Ok(None)),
        Ok(Some(res)) => res,
    };
    if devices.is_none() && has_devices && res.numa_policy != NumaPolicy::None && stats.len > 0 {
        return None;
    }
    let d = demand(&res, req, stats);
    // Scores do not change feasibility, but they rank the non-preferred hints, and the
    // failure reason names the best of those (exclusivity or not): same scoring as place.
    Some(choose_hint(stats, &res, &d, devices, scoring, goal).map(|decision| Some((decision, d))))
}

/// A decision's CPU score, `score_or_zero`'s way: 0 when the pod does not fit.
fn score_of(
    summary: &CpuSummary,
    decision: Result<Option<(Decision, Demand)>, FitError>,
    scoring: &CpuScoring,
) -> Option<i64> {
    match decision {
        Ok(None) => None,
        Ok(Some((decision, d))) => Some(placement_score(&summary.stats, decision, &d, scoring)),
        Err(_) => Some(0),
    }
}

/// `Some(r)` where `r == place(view, req, devices, _).map(|_| ())` for the view the summary
/// was built from; `None` when only `place` can answer (a NUMA policy applies and the pod
/// also asks for devices, so the device callback decides the hint).
pub fn fast_feasible(
    summary: &CpuSummary,
    req: &PodCpuRequest,
    has_devices: bool,
    scoring: &CpuScoring,
) -> Option<Result<(), FitError>> {
    summary_decision(summary, req, has_devices, None, scoring, Goal::AnyFit).map(|r| r.map(|_| ()))
}

/// The case [`fast_feasible`] leaves to `place`: a pod whose devices must be aligned.
/// `Ok(affinity)` where `place(view, req, Some(devices), scoring)` is `Ok(_)`: `affinity` is
/// the mask of a preferred hint (one where `devices` answered yes; not necessarily the one
/// `place` would pick), or `place`'s own affinity when no hint is preferred (`None` when no
/// placement or no NUMA restriction applies); the same error otherwise. `devices` answers
/// "do the pod's devices fit within this NUMA mask", as `place`'s callback does.
pub fn fast_aligned(
    summary: &CpuSummary,
    req: &PodCpuRequest,
    devices: &mut dyn FnMut(NumaMask) -> bool,
    scoring: &CpuScoring,
) -> Result<Option<NumaMask>, FitError> {
    // With a callback the summary always answers.
    let decision = summary_decision(summary, req, true, Some(devices), scoring, Goal::AnyFit)
        .unwrap_or(Ok(None));
    Ok(match decision? {
        None | Some((Decision::NodeLevel, _)) => None,
        Some((Decision::Numa(members), _)) => Some(summary.stats.mask_of(members)),
    })
}

/// `score_or_zero(view, req, Some(devices), scoring)` for the view the summary was built
/// from: [`fast_score`]'s missing case (devices aligned under a NUMA policy).
pub fn fast_aligned_score(
    summary: &CpuSummary,
    req: &PodCpuRequest,
    devices: &mut dyn FnMut(NumaMask) -> bool,
    scoring: &CpuScoring,
) -> Option<i64> {
    let decision = summary_decision(summary, req, true, Some(devices), scoring, Goal::Best)
        .unwrap_or(Ok(None));
    score_of(summary, decision, scoring)
}

/// `Some(s)` where `s == score_or_zero(view, req, devices, scoring)` for the view the summary
/// was built from (`s` is `None` when nothing CPU/NUMA-related applies, `Some(0)` when the pod
/// does not fit); `None` when only `place` can answer (NUMA policy plus devices).
pub fn fast_score(
    summary: &CpuSummary,
    req: &PodCpuRequest,
    has_devices: bool,
    scoring: &CpuScoring,
) -> Option<Option<i64>> {
    summary_decision(summary, req, has_devices, None, scoring, Goal::Best)
        .map(|decision| score_of(summary, decision, scoring))
}
