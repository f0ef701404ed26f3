//! The full decision: the combined device + CPU/NUMA decision for one pod on one node, shared by filter,
//! prioritize, preempt and bind so all four agree.
//!
//! Order: the CPU/NUMA decision first (`placement::cpu::place`), with a callback that runs the
//! device allocator restricted to a NUMA mask so the chosen NUMA hint is one the devices can
//! also use; then the devices, restricted to the chosen affinity. With no NUMA policy the two
//! are chosen independently (koordinator's topology manager aligns only under a policy).
//!
//! It decides on a locked [`NodeState`]: for bind and preempt, and for any node the read
//! verbs' snapshot answers (`super::read`, which must equal this wherever it answers, by its
//! property tests) defer. Never mutates anything (bind hands the result to
//! `ClusterState::assume`) and never talks to the network.

use super::config::ScoringConfig;
use super::needs::PodNeeds;
use crate::cluster::NodeState;
use crate::model::device::DeviceAllocations;
use crate::model::ids::PodUid;
use crate::placement::cpu::hints::reason;
use crate::placement::cpu::{
    CpuPlacement, NodeCpuBindPolicy, NumaMask, PodCpuRequest, place, score_or_zero,
};
use crate::placement::device::allocate::{FitError, fit_on_numa, fit_with};
use crate::placement::device::deviceless::deviceless_fit;
use crate::placement::device::dra_served::{DraServes, dra_serves, split_error};
use crate::placement::device::request::PodDeviceRequest;
use crate::placement::device::score::score_node;
use crate::placement::fit_error::{FitReason, MissingTopology};

/// The decision for one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    pub devices: Option<DeviceAllocations>,
    pub cpu: Option<CpuPlacement>,
}

/// Whether a node without usable CPU data must reject the pod: it asks for a cpuset, or the
/// node forces a bind policy on every pod with a CPU request (koordinator: "invalid CPU
/// topology" for any pod that would be bound).
#[inline]
pub(super) fn needs_topology(bind_policy: NodeCpuBindPolicy, req: &PodCpuRequest) -> bool {
    req.cpuset.is_some() || (bind_policy != NodeCpuBindPolicy::None && req.cpu_milli > 0)
}

#[inline]
pub(super) fn no_topology_error() -> FitError {
    FitError::new(
        FitReason::NoCpuTopology(MissingTopology::NoNodeResourceTopology),
        true,
    )
}

/// Whether `devices` fit `node` using only devices on the NUMA nodes of `mask`.
fn devices_fit_within(
    node: &NodeState,
    devices: &PodDeviceRequest,
    ignore: &[PodUid],
    scoring: &ScoringConfig,
    mask: Option<NumaMask>,
) -> bool {
    fit_on_numa(node.device_ledger(), devices, ignore, &scoring.device, mask).is_ok()
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
            Err(no_topology_error())
        } else {
            Ok(None)
        };
    };
    // koordinator checks the node's amplified CPU before any topology (plugin.go `Filter`).
    node.amplification(ignore).check(
        req.cpu_milli,
        needs_topology(node.cpu_ledger().bind_policy(), req),
    )?;
    node.cpu_ledger()
        .with_view(ignore, &scoring.cpu, |view| match view {
            Err(unusable) => {
                if needs_topology(node.cpu_ledger().bind_policy(), req) {
                    Err(FitError::new(unusable.reason, unusable.unresolvable))
                } else {
                    Ok(None)
                }
            }
            Ok(view) => {
                let mut aligned = |mask: NumaMask| {
                    devices
                        .is_some_and(|d| devices_fit_within(node, d, ignore, scoring, Some(mask)))
                };
                let callback: Option<&mut dyn FnMut(NumaMask) -> bool> =
                    if devices.is_some() && node.device_ledger().devices().is_some() {
                        Some(&mut aligned)
                    } else {
                        None
                    };
                place(&view, req, callback, &scoring.cpu).map_err(|e| {
                    // "Not aligned" only when the devices fit somewhere on the node at all;
                    // otherwise the device shortage is the reason an operator must see.
                    if e.reason == reason::DEVICES_UNALIGNED
                        && let Some(d) = devices
                        && let Err(shortage) =
                            fit_on_numa(node.device_ledger(), d, ignore, &scoring.device, None)
                    {
                        return shortage;
                    }
                    e
                })
            }
        })
}

/// The full decision (bind and preempt): CPU first, then devices within its affinity.
pub fn decide_on_node(
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

/// The device policy for one node, shared by filter, preempt and bind:
/// `Ok(None)` = nothing to allocate here, `Ok(Some)` = the allocation, `Err` = no fit.
/// Requests kube-scheduler serves through DRA here are decided by [`dra_serves`] first
/// (KEP-5004: none of the pod's devices are ours then, or the node is refused). A node without a Device object is decided by [`deviceless_fit`] (issue 36 §6). The rule depends only on
/// current API state, so a restarted or standby replica decides exactly as a long-running one.
pub fn allocate_on(
    node: Option<&NodeState>,
    req: &PodDeviceRequest,
    ignore: &[PodUid],
    scoring: &ScoringConfig,
) -> Result<Option<DeviceAllocations>, FitError> {
    let Some(node) = node else {
        return deviceless_fit(false, None, req.asked).map(|()| None);
    };
    match dra_serves(req.asked, node.dra_served()) {
        DraServes::Nothing => {}
        DraServes::Everything => return Ok(None),
        DraServes::Part(dra) => return Err(split_error(dra)),
    }
    if node.device_ledger().devices().is_none() {
        // Preemption victims (`ignore`) count as gone: once they are, the node may hold
        // nothing any more and is left to the device plugins again.
        let held = node
            .device_ledger()
            .entries()
            .any(|(uid, _)| !ignore.contains(uid));
        let advertised = node.node.as_ref().map(|n| n.deviceless_advertised);
        return deviceless_fit(held, advertised, req.asked).map(|()| None);
    }
    fit_with(node.device_ledger(), req, ignore, &scoring.device).map(Some)
}

/// [`allocate_on`] with an optional NUMA restriction.
fn allocate_devices(
    node: Option<&NodeState>,
    req: &PodDeviceRequest,
    ignore: &[PodUid],
    scoring: &ScoringConfig,
    affinity: Option<NumaMask>,
) -> Result<Option<DeviceAllocations>, FitError> {
    match (node, affinity) {
        (Some(n), Some(mask))
            if n.device_ledger().devices().is_some()
                && dra_serves(req.asked, n.dra_served()) == DraServes::Nothing =>
        {
            fit_on_numa(n.device_ledger(), req, ignore, &scoring.device, Some(mask)).map(Some)
        }
        _ => allocate_on(node, req, ignore, scoring),
    }
}

/// Device and CPU scores into one: their mean when both apply.
#[inline]
pub(super) fn combine(device: Option<i64>, cpu: Option<i64>) -> i64 {
    match (device, cpu) {
        (Some(d), Some(c)) => (d + c) / 2,
        (Some(s), None) | (None, Some(s)) => s,
        (None, None) => 0,
    }
}

/// Prioritize's raw score from the locked node state: the full scorers.
pub fn full_score(
    node: Option<&NodeState>,
    needs: &PodNeeds,
    cpu: Option<&PodCpuRequest>,
    scoring: &ScoringConfig,
) -> i64 {
    let Some(node) = node else {
        return 0;
    };
    let cpu = cpu.and_then(|req| full_cpu_score(node, req, needs.devices.as_ref(), scoring));
    let device = needs
        .devices
        .as_ref()
        .map(|req| score_node(node.device_ledger(), req, &scoring.device));
    combine(device, cpu)
}

/// The CPU score 0..=100 by a full placement (`None`: no CPU opinion on this node). A trial
/// failure after a passing filter scores 0 (koordinator nodenumaresource `Score`).
pub fn full_cpu_score(
    node: &NodeState,
    req: &PodCpuRequest,
    devices: Option<&PodDeviceRequest>,
    scoring: &ScoringConfig,
) -> Option<i64> {
    node.cpu_ledger().with_view(&[], &scoring.cpu, |view| {
        let view = view.ok()?;
        let mut aligned = |mask: NumaMask| {
            devices.is_some_and(|d| devices_fit_within(node, d, &[], scoring, Some(mask)))
        };
        let callback: Option<&mut dyn FnMut(NumaMask) -> bool> =
            if devices.is_some() && node.device_ledger().devices().is_some() {
                Some(&mut aligned)
            } else {
                None
            };
        score_or_zero(&view, req, callback, &scoring.cpu)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::NodeState;
    use crate::cluster::devices::{EntryState, RecordedAllocation};
    use crate::model::device::DeviceAllocations;
    use crate::model::device::{DeviceAllocation, DeviceType, GPU_MEMORY_RATIO};
    use crate::model::quantity::Quantity;
    use crate::placement::device::request::PodDeviceRequest;
    use std::collections::BTreeMap;

    fn gpu_request() -> PodDeviceRequest {
        let requests = crate::model::requests::Requests::from([(
            "nvidia.com/gpu".to_string(),
            Quantity::from_milli(1000),
        )]);
        crate::placement::device::request::parse_device_request(&requests, None)
            .expect("valid")
            .expect("needs a GPU")
    }

    /// A node without a Device object whose only holders are the proposed
    /// victims is passable once they are gone (preempt must account for them).
    #[test]
    fn deviceless_node_is_passable_once_its_holders_are_victims() {
        let mut node = NodeState::default();
        // Its device plugin advertises the GPUs (else no GPU pod passes at all: issue 36 §6).
        node.node = Some(crate::cluster::NodeRecord::from_node(
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n"},
                "status": {"allocatable": {"nvidia.com/gpu": "1"}}
            }))
            .unwrap(),
        ));
        let holder = PodUid::new("holder");
        node.ledgers_for_test().0.record(
            holder.clone(),
            RecordedAllocation::Allocated(DeviceAllocations(BTreeMap::from([(
                DeviceType::Gpu,
                vec![DeviceAllocation {
                    minor: 0,
                    resources: BTreeMap::from([(
                        GPU_MEMORY_RATIO.to_string(),
                        Quantity::from_milli(100_000),
                    )]),
                    id: String::new(),
                    extension: None,
                }],
            )]))),
            EntryState::Committed,
        );
        let req = gpu_request();
        let scoring = ScoringConfig::default();
        let blocked = allocate_on(Some(&node), &req, &[], &scoring).unwrap_err();
        assert_eq!(blocked.reason, "device object missing");
        assert!(!blocked.unresolvable);
        assert_eq!(
            allocate_on(Some(&node), &req, &[holder], &scoring).map_err(|e| e.reason),
            Ok(None)
        );
        let other = PodUid::new("someone-else");
        assert!(allocate_on(Some(&node), &req, &[other], &scoring).is_err());
    }
}
