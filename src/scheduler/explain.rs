//! Pending pods explain themselves: when filter leaves a pod no node, each refused node's reason
//! is completed in the pod's own terms ("insufficient gpu devices: largest free gpu-core on one
//! card 40-49 of 100, pod asks 50") before kube-scheduler copies it into the pod's `PodScheduled`
//! condition and `FailedScheduling` event.
//!
//! Owns *when* a reason is explained and which refusals get which words; the GPU arithmetic is
//! `placement::device::shortfall`. It runs only when no candidate passes, the only time
//! kube-scheduler shows the extender's reasons, so a pod that fits pays nothing. It reads each
//! refused node under its read lock once and changes no verdict, no `unresolvable` flag and no
//! metric class: the allocator decided, this only says how far the node was.
//!
//! kube-scheduler folds identical reasons across nodes into one counted line, so every number
//! here is banded or the pod's own: a class of a thousand identical nodes stays one line.

use std::borrow::Cow;

use super::PodNeeds;
use crate::cluster::NodeState;
use crate::model::cpu_policy::NumaPolicy;
use crate::model::device::DeviceType;
use crate::placement::FitReason;
use crate::placement::device::shortfall::{Shortfall, gpu_shortfall, whole_gpus_per_numa};

/// A refused node's reason in the pod's terms, and how near the node came.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explained {
    pub text: Cow<'static, str>,
    /// Thousandths of the pod's binding ask the node covers, when the reason measures one
    /// (GPU shares and whole GPUs): `inspect --pod` ranks the nearest nodes by it.
    pub met_permille: Option<u16>,
}

/// `reason` for `node`, completed with what the pod asks and the node lacks where this module
/// knows how; the reason's own words otherwise.
pub fn explain(node: Option<&NodeState>, needs: &PodNeeds, reason: &FitReason) -> Explained {
    let plain = || Explained {
        text: reason.text(),
        met_permille: None,
    };
    let gpu = needs.devices.as_ref().and_then(|d| d.get(&DeviceType::Gpu));
    let detail = |d: String| Cow::Owned(format!("{}: {d}", reason.text()));
    match reason {
        FitReason::InsufficientDevices(DeviceType::Gpu) => {
            let (Some(node), Some(gpu)) = (node, gpu) else {
                return plain();
            };
            // Where DRA is the cause, the reason says so (trust IV §11: it read as a plain
            // shortage, which an operator resolves by freeing cards, not by the DRA setup).
            let dra = dra_note(node);
            match gpu_shortfall(node.device_ledger(), gpu) {
                Some(Shortfall {
                    detail: d,
                    met_permille,
                }) => Explained {
                    text: detail(match dra {
                        Some(note) => format!("{d}; {note}"),
                        None => d,
                    }),
                    met_permille: Some(met_permille),
                },
                None => match dra {
                    Some(note) => Explained {
                        text: detail(note),
                        met_permille: None,
                    },
                    None => plain(),
                },
            }
        }
        // GPUs and CPUs on one NUMA node: enough whole cards in all, too few on one.
        FitReason::DevicesUnaligned | FitReason::NotOnFewestNuma => {
            let (Some(node), Some(gpu)) = (node, gpu.filter(|g| !g.shared)) else {
                return plain();
            };
            let Some((free, most, over)) = whole_gpus_per_numa(node.device_ledger()) else {
                return plain();
            };
            if free < gpu.count || most >= gpu.count {
                return plain();
            }
            let policy = needs
                .cpu
                .as_ref()
                .map(|c| c.numa_policy)
                .filter(|p| *p != NumaPolicy::None)
                .unwrap_or_else(|| node.cpu_ledger().numa_policy());
            Explained {
                text: detail(format!(
                    "{free} whole gpus free over {over} NUMA nodes, at most {most} on one, pod asks {} ({})",
                    gpu.count,
                    policy.as_str()
                )),
                met_permille: None,
            }
        }
        FitReason::InsufficientCpus | FitReason::InsufficientAmplifiedCpu => match cpus(needs) {
            Some(n) => Explained {
                text: detail(format!("pod asks {n} cpus")),
                met_permille: None,
            },
            None => plain(),
        },
        FitReason::CpusOnOneNuma => match cpus(needs) {
            Some(n) => Explained {
                text: detail(format!("pod asks {n} cpus on one NUMA node")),
                met_permille: None,
            },
            None => plain(),
        },
        _ => plain(),
    }
}

/// The node's GPUs that are not free because of DRA, in words: held by a claim, or published by
/// a DRA driver in a pool that is not the extender's now (its DeviceTaintRule missing or not in
/// effect for the hand-over grace, the node handed to DRA, or no DeviceTaintRule served).
/// Small counts of the node's own cards: identical nodes still fold into one line.
fn dra_note(node: &NodeState) -> Option<String> {
    let ledger = node.device_ledger();
    let gpu = |(t, _): &&(DeviceType, i32)| *t == DeviceType::Gpu;
    let claimed = ledger.dra_blocked().keys().filter(gpu).count();
    let unowned = ledger
        .dra_unowned()
        .keys()
        .filter(gpu)
        .filter(|k| !ledger.dra_blocked().contains_key(*k))
        .count();
    let gpus = |n: usize| {
        if n == 1 {
            "1 gpu".to_string()
        } else {
            format!("{n} gpus")
        }
    };
    let mut parts = Vec::new();
    if claimed > 0 {
        parts.push(format!("{} held by DRA claims", gpus(claimed)));
    }
    if unowned > 0 {
        parts.push(format!(
            "{} published by a DRA driver and not the extender's (no DeviceTaintRule of the extender in effect on their pool, or the node handed to DRA)",
            gpus(unowned)
        ));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// The pod's CPU request as it wrote it: `8`, `2.5`.
fn cpus(needs: &PodNeeds) -> Option<String> {
    let milli = needs.cpu.as_ref()?.cpu_milli;
    if milli <= 0 {
        return None;
    }
    Some(if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        let s = format!("{:.3}", milli as f64 / 1000.0);
        s.trim_end_matches('0').to_string()
    })
}

/// The full decision for `needs` on `node` with `ignore`'s holdings released (preemption
/// victims, pods a plan moves away), explained when it refuses: what `inspect --pod` asks of
/// each node. Takes the node's read lock once.
pub fn fit_or_explain(
    state: &super::Scheduler,
    node: &str,
    needs: &PodNeeds,
    ignore: &[crate::model::ids::PodUid],
) -> Result<(), Explained> {
    let entry = state.cluster.node(node);
    let guard = entry.as_ref().map(|e| e.read());
    match super::decide::decide_on_node(guard.as_deref(), needs, ignore, &state.scoring) {
        Ok(_) => Ok(()),
        Err(e) => Err(explain(guard.as_deref(), needs, &e.reason)),
    }
}
