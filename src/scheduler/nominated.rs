//! Capacity held for nominated pods. When kube-scheduler's preemption evicts victims for a
//! pod, it nominates the node (`status.nominatedNodeName`) and waits for them to go; until
//! the pod binds, its own filters count it on that node for every pod of no higher priority
//! (`addGENominatedPods`: priority ≥ the filtered pod's, never the pod itself). It cannot do
//! that for what the extender places (cards, shares, cpusets): this module does, so a third
//! pod arriving while the victims terminate does not take the card they free.
//!
//! The rule, on a private copy of the node's state: each nominated pod of no lower priority,
//! in UID order, is decided as bind would decide it and held where it fits now (one whose
//! victims still hold its capacity fits nowhere yet, and holds nothing: neither does the third
//! pod fit then); a nominated pod the ledgers already hold (bound, the watch not caught up) is
//! skipped, so its entry is not decided again (nor moved to another card on the copy).
//! The filtered pod must then fit on what is left. Decides only; reads the caches, never
//! writes them, and costs one atomic load per request while nobody is nominated.

use super::Scheduler;
use super::decide::decide_on_node;
use super::needs::PodNeeds;
use super::write_back;
use crate::cluster::cpus::RecordedCpus;
use crate::model::ids::PodUid;
use crate::model::pod::Pod;
use crate::placement::device::allocate::FitError;
use crate::placement::fit_error::FitReason;

/// Whether `pod` (of `needs`) still fits `node` once the capacity of the pods nominated there
/// is held. `Ok` when nothing is nominated there for it to respect.
pub(super) fn respect_nominated(
    state: &Scheduler,
    node: &str,
    pod: &Pod,
    needs: &PodNeeds,
) -> Result<(), FitError> {
    let nominations = state.cluster.nominations();
    if nominations.is_empty() {
        return Ok(());
    }
    let uid = pod.metadata.uid.as_deref().map(PodUid::new);
    let priority = pod.spec.priority.unwrap_or(0);
    let ahead: Vec<_> = nominations
        .on_node(node)
        .into_iter()
        .filter(|n| n.priority >= priority && Some(&n.uid) != uid.as_ref())
        .collect();
    if ahead.is_empty() {
        return Ok(());
    }
    let Some(entry) = state.cluster.node(node) else {
        return Ok(());
    };
    let mut held = entry.read().clone();
    let mut holding = Vec::new();
    for nominee in &ahead {
        if held.entry_state(&nominee.uid).is_some() {
            continue;
        }
        let Ok(nominee_needs) = state.pod_needs(&nominee.pod) else {
            continue;
        };
        if nominee_needs.is_none() {
            continue;
        }
        let Ok(decision) = decide_on_node(Some(&held), &nominee_needs, &[], &state.scoring) else {
            continue;
        };
        let cpus = match (&decision.cpu, &nominee_needs.cpu) {
            (Some(placement), Some(req)) if write_back::resource_status(placement).is_some() => {
                Some(RecordedCpus::Allocated(write_back::recorded_cpus(
                    placement, req,
                )))
            }
            _ => None,
        };
        if decision.devices.is_none() && cpus.is_none() {
            continue;
        }
        held.hold(
            &nominee.uid,
            decision.devices,
            cpus,
            write_back::cpu_request_milli(&nominee.pod),
        );
        holding.push(nominee);
    }
    let Some(first) = holding.first() else {
        return Ok(());
    };
    match decide_on_node(Some(&held), needs, &[], &state.scoring) {
        Ok(_) => Ok(()),
        Err(_) => Err(FitError::new(
            FitReason::HeldForNominated {
                pod: first.key.shared(),
            },
            false,
        )),
    }
}
