//! The combined device + CPU/NUMA decision for one pod on one node, shared by filter,
//! prioritize, preempt and bind so all four agree.
//!
//! Order: the CPU/NUMA decision first (`placement::cpu::place`), with a callback that runs the
//! device allocator restricted to a NUMA mask so the chosen NUMA hint is one the devices can
//! also use; then the devices, restricted to the chosen affinity. With no NUMA policy the two
//! are chosen independently (koordinator's topology manager aligns only under a policy).
//!
//! Reads a locked [`NodeState`]; never mutates it (bind records the result itself) and never
//! talks to the network.

use crate::cluster::NodeState;
use crate::cluster::cpus::{CpuAllocation, CpuLedger};
use crate::model::device::DeviceAllocations;
use crate::model::ids::PodUid;
use crate::model::koord_cpu::{self, ResourceSpec, ResourceStatus};
use crate::model::pod::Pod;
use crate::placement::cpu::classify::classify;
use crate::placement::cpu::hints::reason;
use crate::placement::cpu::{
    CpuBindPolicy, CpuExclusivePolicy, CpuPlacement, NodeCpuBindPolicy, NumaMask, NumaPolicy,
    PodCpuRequest, fast_feasible, fast_score, place, score_or_zero,
};
use crate::placement::device::allocate::{FitError, fit_on_numa};
use crate::placement::device::request::PodDeviceRequest;
use crate::placement::device::score::ScoringConfig;

/// What a pod asks of a node, computed once per request.
#[derive(Clone, Debug, Default)]
pub struct PodNeeds {
    /// `None` when the pod needs no devices (or device placement is off).
    pub devices: Option<PodDeviceRequest>,
    /// `None` when CPU placement is off (no NRT CRD) or the pod requests neither cpu nor
    /// memory and asks for no cpuset or NUMA policy.
    pub cpu: Option<PodCpuRequest>,
}

impl PodNeeds {
    /// Nothing to decide anywhere: the verbs pass the pod through.
    pub fn is_none(&self) -> bool {
        self.devices.is_none() && self.cpu.is_none()
    }

    /// The pod itself asks for CPU placement (a cpuset wish or a NUMA policy): only then does
    /// the CPU score join prioritize (plain CPU is kube-scheduler's own NodeResourcesFit).
    pub fn wants_cpu_placement(&self) -> bool {
        self.cpu
            .as_ref()
            .is_some_and(|c| c.cpuset.is_some() || c.numa_policy != NumaPolicy::None)
    }
}

/// The CPU half of [`PodNeeds`]: classification, or an error that makes every node
/// unresolvable (it names the annotation or the fractional request).
pub fn cpu_needs(
    pod: &Pod,
    enabled: bool,
    scoring: &ScoringConfig,
) -> Result<Option<PodCpuRequest>, String> {
    if !enabled {
        return Ok(None);
    }
    let req = classify(pod, scoring.cpu.default_bind_policy).map_err(|e| e.to_string())?;
    let nothing = req.cpu_milli <= 0
        && req.memory_bytes <= 0
        && req.cpuset.is_none()
        && req.numa_policy == NumaPolicy::None;
    Ok((!nothing).then_some(req))
}

/// The decision for one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    pub devices: Option<DeviceAllocations>,
    pub cpu: Option<CpuPlacement>,
}

fn cpu_error(e: crate::placement::cpu::CpuFitError) -> FitError {
    FitError {
        reason: e.reason,
        unresolvable: e.unresolvable,
    }
}

/// Whether a node without usable CPU data must reject the pod: it asks for a cpuset, or the
/// node forces a bind policy on every pod with a CPU request (koordinator: "invalid CPU
/// topology" for any pod that would be bound).
fn needs_topology(ledger: &CpuLedger, req: &PodCpuRequest) -> bool {
    req.cpuset.is_some() || (ledger.bind_policy() != NodeCpuBindPolicy::None && req.cpu_milli > 0)
}

fn no_topology_error(ledger: Option<&CpuLedger>) -> FitError {
    FitError {
        reason: ledger
            .and_then(|l| l.usable_error())
            .unwrap_or_else(|| "node has no CPU topology (no NodeResourceTopology)".into()),
        unresolvable: true,
    }
}

/// The CPU/NUMA placement on `node`, with `ignore`'s allocations released.
pub fn cpu_decision(
    node: Option<&NodeState>,
    req: &PodCpuRequest,
    devices: Option<&PodDeviceRequest>,
    ignore: &[PodUid],
    scoring: &ScoringConfig,
) -> Result<Option<CpuPlacement>, FitError> {
    let Some(node) = node else {
        return if req.cpuset.is_some() {
            Err(no_topology_error(None))
        } else {
            Ok(None)
        };
    };
    node.cpus
        .with_view(ignore, &scoring.cpu, |view| match view {
            Err(unusable) => {
                if needs_topology(&node.cpus, req) {
                    Err(FitError {
                        reason: unusable.reason,
                        unresolvable: unusable.unresolvable,
                    })
                } else {
                    Ok(None)
                }
            }
            Ok(view) => {
                let mut aligned = |mask: NumaMask| {
                    devices.is_some_and(|d| {
                        fit_on_numa(&node.devices, d, ignore, scoring, Some(mask)).is_ok()
                    })
                };
                let callback: Option<&mut dyn FnMut(NumaMask) -> bool> =
                    if devices.is_some() && node.devices.devices().is_some() {
                        Some(&mut aligned)
                    } else {
                        None
                    };
                place(&view, req, callback, &scoring.cpu).map_err(|e| {
                    // "Not aligned" only when the devices fit somewhere on the node at all;
                    // otherwise the device shortage is the reason an operator must see.
                    if e.reason == reason::DEVICES_UNALIGNED
                        && let Some(d) = devices
                        && let Err(shortage) = fit_on_numa(&node.devices, d, ignore, scoring, None)
                    {
                        return shortage;
                    }
                    cpu_error(e)
                })
            }
        })
}

/// The full decision (bind and preempt): CPU first, then devices within its affinity.
pub fn decide(
    node: Option<&NodeState>,
    needs: &PodNeeds,
    ignore: &[PodUid],
    scoring: &ScoringConfig,
) -> Result<Decision, FitError> {
    let cpu = match &needs.cpu {
        Some(req) => cpu_decision(node, req, needs.devices.as_ref(), ignore, scoring)?,
        None => None,
    };
    let affinity = cpu.as_ref().and_then(|p| p.affinity);
    let devices = match &needs.devices {
        None => None,
        Some(d) => allocate_devices(node, d, ignore, scoring, affinity)?,
    };
    Ok(Decision { devices, cpu })
}

/// `bind::allocate_on` with an optional NUMA restriction.
fn allocate_devices(
    node: Option<&NodeState>,
    req: &PodDeviceRequest,
    ignore: &[PodUid],
    scoring: &ScoringConfig,
    affinity: Option<NumaMask>,
) -> Result<Option<DeviceAllocations>, FitError> {
    match (node, affinity) {
        (Some(n), Some(mask)) if n.devices.devices().is_some() => {
            fit_on_numa(&n.devices, req, ignore, scoring, Some(mask)).map(Some)
        }
        _ => crate::bind::allocate_on(node, req, ignore, scoring),
    }
}

/// Filter's CPU check from the node's cached summary: `Some` when it answers (exactly as
/// [`cpu_decision`] would), `None` when only the full decision can (device alignment).
pub fn cpu_fast_check(
    node: Option<&NodeState>,
    req: &PodCpuRequest,
    has_devices: bool,
    scoring: &ScoringConfig,
) -> Option<Result<(), FitError>> {
    let Some(node) = node else {
        return Some(if req.cpuset.is_some() {
            Err(no_topology_error(None))
        } else {
            Ok(())
        });
    };
    // A plain pod (no cpuset wish, no NUMA policy) on a node that forces nothing: nothing to
    // check, and filter must stay cheap for it.
    let plain = req.cpuset.is_none() && req.numa_policy == NumaPolicy::None;
    if plain && !node.cpus.constrains_plain_pods() {
        return Some(Ok(()));
    }
    match node.cpus.summary() {
        Err(unusable) => Some(if needs_topology(&node.cpus, req) {
            Err(FitError {
                reason: unusable.reason,
                unresolvable: unusable.unresolvable,
            })
        } else {
            Ok(())
        }),
        Ok(summary) => {
            fast_feasible(&summary, req, has_devices, &scoring.cpu).map(|r| r.map_err(cpu_error))
        }
    }
}

/// Prioritize's CPU score 0..=100 (`None`: no CPU opinion on this node). A trial failure
/// after a passing filter scores 0 (reference §4.16).
pub fn cpu_score(
    node: Option<&NodeState>,
    req: &PodCpuRequest,
    devices: Option<&PodDeviceRequest>,
    scoring: &ScoringConfig,
) -> Option<i64> {
    let node = node?;
    let aligns = devices.is_some() && node.devices.devices().is_some();
    // The cached summary answers unless devices must be aligned under a NUMA policy (equal to
    // the full scorer: `placement::cpu::proptests`).
    if let Ok(summary) = node.cpus.summary()
        && let Some(score) = fast_score(&summary, req, aligns, &scoring.cpu)
    {
        return score;
    }
    node.cpus.with_view(&[], &scoring.cpu, |view| {
        let view = view.ok()?;
        let mut aligned = |mask: NumaMask| {
            devices.is_some_and(|d| fit_on_numa(&node.devices, d, &[], scoring, Some(mask)).is_ok())
        };
        let callback: Option<&mut dyn FnMut(NumaMask) -> bool> =
            if devices.is_some() && node.devices.devices().is_some() {
                Some(&mut aligned)
            } else {
                None
            };
        score_or_zero(&view, req, callback, &scoring.cpu)
    })
}

/// What bind records in the CPU ledger for a placement.
pub fn recorded_cpus(placement: &CpuPlacement, req: &PodCpuRequest) -> CpuAllocation {
    CpuAllocation {
        cpuset: placement.cpuset,
        numa: placement.numa.clone(),
        exclusive: if placement.cpuset.is_empty() {
            CpuExclusivePolicy::None
        } else {
            req.cpuset.map_or(CpuExclusivePolicy::None, |w| w.exclusive)
        },
    }
}

/// The `resource-status` value for a placement (`None` when it binds nothing).
pub fn resource_status(placement: &CpuPlacement) -> Option<String> {
    let status = ResourceStatus {
        cpuset: placement.cpuset,
        numa: placement.numa.clone(),
    };
    (!status.is_empty()).then(|| status.to_annotation())
}

/// The §1.8 `resource-spec` write-back for a placement with a cpuset (`None`: unchanged).
pub fn resource_spec_write_back(
    pod: &Pod,
    placement: &CpuPlacement,
    req: &PodCpuRequest,
    node_policy: NodeCpuBindPolicy,
) -> Option<String> {
    if placement.cpuset.is_empty() {
        return None;
    }
    let forced = match node_policy {
        NodeCpuBindPolicy::FullPcpusOnly => Some(CpuBindPolicy::FullPcpus),
        NodeCpuBindPolicy::SpreadByPcpus => Some(CpuBindPolicy::SpreadByPcpus),
        NodeCpuBindPolicy::None => None,
    };
    let effective = forced.or(req.cpuset.map(|w| w.policy))?;
    let current: Option<ResourceSpec> = pod
        .annotation(koord_cpu::RESOURCE_SPEC)
        .and_then(|s| koord_cpu::parse_resource_spec(s).ok());
    koord_cpu::resource_spec_write_back(current.as_ref(), forced, effective)
}

/// Why the CPU scoring flags are invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuScoringError {
    #[error("unknown CPU scoring strategy {0:?}: expected least-allocated or most-allocated")]
    Strategy(String),
    #[error("invalid CPU score weight {entry:?}: expected cpu=N,memory=N with N >= 0")]
    Weight { entry: String },
    #[error("CPU score weights must not all be zero")]
    NoWeights,
    #[error("unknown default CPU bind policy {0:?}: expected FullPCPUs or SpreadByPCPUs")]
    BindPolicy(String),
}

/// The CPU scoring configuration from the `--cpu-score-*`, `--numa-score-strategy` and
/// `--default-cpu-bind-policy` flags.
pub fn cpu_scoring_from_flags(
    node_strategy: &str,
    numa_strategy: &str,
    weights: Option<&str>,
    default_bind_policy: &str,
) -> Result<crate::placement::cpu::CpuScoring, CpuScoringError> {
    use crate::placement::cpu::{CpuScoreStrategy, CpuScoring};
    let strategy = |s: &str| match s.trim() {
        "least-allocated" | "LeastAllocated" => Ok(CpuScoreStrategy::LeastAllocated),
        "most-allocated" | "MostAllocated" => Ok(CpuScoreStrategy::MostAllocated),
        other => Err(CpuScoringError::Strategy(other.to_string())),
    };
    let mut out = CpuScoring {
        node_strategy: strategy(node_strategy)?,
        numa_strategy: strategy(numa_strategy)?,
        ..CpuScoring::default()
    };
    if let Some(w) = weights {
        for entry in w.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || CpuScoringError::Weight {
                entry: entry.to_string(),
            };
            let (name, value) = entry.split_once('=').ok_or_else(bad)?;
            let value: i64 = value.trim().parse().map_err(|_| bad())?;
            if value < 0 {
                return Err(bad());
            }
            match name.trim() {
                "cpu" => out.cpu_weight = value,
                "memory" => out.memory_weight = value,
                _ => return Err(bad()),
            }
        }
        if out.cpu_weight == 0 && out.memory_weight == 0 {
            return Err(CpuScoringError::NoWeights);
        }
    }
    out.default_bind_policy = match default_bind_policy.trim() {
        "FullPCPUs" => CpuBindPolicy::FullPcpus,
        "SpreadByPCPUs" => CpuBindPolicy::SpreadByPcpus,
        other => return Err(CpuScoringError::BindPolicy(other.to_string())),
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::cpu::CpuScoreStrategy;

    #[test]
    fn cpu_scoring_flags() {
        let s = cpu_scoring_from_flags(
            "most-allocated",
            "least-allocated",
            Some("cpu=2,memory=0"),
            "SpreadByPCPUs",
        )
        .unwrap();
        assert_eq!(s.node_strategy, CpuScoreStrategy::MostAllocated);
        assert_eq!((s.cpu_weight, s.memory_weight), (2, 0));
        assert_eq!(s.default_bind_policy, CpuBindPolicy::SpreadByPcpus);
        for (a, b, w, p) in [
            ("x", "least-allocated", None, "FullPCPUs"),
            (
                "least-allocated",
                "least-allocated",
                Some("gpu=1"),
                "FullPCPUs",
            ),
            (
                "least-allocated",
                "least-allocated",
                Some("cpu=-1"),
                "FullPCPUs",
            ),
            (
                "least-allocated",
                "least-allocated",
                Some("cpu=0,memory=0"),
                "FullPCPUs",
            ),
            ("least-allocated", "least-allocated", None, "Default"),
        ] {
            assert!(
                cpu_scoring_from_flags(a, b, w, p).is_err(),
                "{a} {b} {w:?} {p}"
            );
        }
    }
}
