//! The fragmentation strategy at the node level: prioritize's raw score on a locked node, its
//! normalization to the extender's 0-10, and the filter's observation of the workload mix.
//! Reads a node's free GPUs (its device ledger) and free CPU (its Node and pods), and asks
//! [`crate::placement::device::fragmentation`]; never mutates anything.

use super::config::ScoringConfig;
use super::needs::PodNeeds;
use crate::cluster::NodeState;
use crate::model::device::DeviceType;
use crate::model::pod::Pod;
use crate::placement::device::fragmentation::{NodeFree, card_free_milli, place, task_of};
use crate::placement::device::score::ScoringStrategy;

/// A raw score at or below this: the pod cannot be measured or placed on the node (no
/// `Device` object, no card that takes it); it normalizes to 0.
pub const UNMEASURED: i64 = i64::MIN / 4;

/// The CPU score (0..=100) breaks ties between equal fragmentation growths.
const CPU_TIE_BREAK: i64 = 128;

/// Whether the fragmentation strategy scores this pod's nodes: the strategy is on and the pod
/// asks for whole GPUs or a share of one (a share spread over several cards is scored as
/// LeastAllocated).
pub fn applies(needs: &PodNeeds, scoring: &ScoringConfig) -> bool {
    scoring.device.strategy == ScoringStrategy::Fragmentation
        && needs
            .devices
            .as_ref()
            .and_then(|d| d.get(&DeviceType::Gpu))
            .is_some_and(|r| !r.shared || r.count == 1)
}

/// The node's free capacity as the measure reads it, and the size of its first healthy card.
fn node_free(node: &NodeState) -> Option<(NodeFree, crate::model::device::DeviceResources)> {
    let ledger = node.device_ledger();
    let devices = ledger.devices()?;
    let free = ledger.free(&[]);
    let empty = Default::default();
    let gpu_free = free.get(&DeviceType::Gpu);
    let healthy: Vec<_> = devices
        .slots(&DeviceType::Gpu)
        .filter(|s| s.healthy)
        .collect();
    let card = healthy.first()?.total.clone();
    let gpus = healthy
        .iter()
        .map(|s| {
            card_free_milli(
                &s.total,
                gpu_free.and_then(|f| f.get(&s.minor)).unwrap_or(&empty),
            )
        })
        .collect();
    let cpu_milli = node
        .node
        .as_ref()
        .map(|n| n.allocatable_milli_cpu() - node.requested_milli_cpu(&[]));
    Some((NodeFree { cpu_milli, gpus }, card))
}

/// Prioritize's raw score where [`applies`]: the growth of the workload's expected
/// fragmentation if the pod goes here (its best card for a share), negated so that higher is
/// better, in tenths of a milli-GPU, scaled to leave room for the CPU score (`cpu`, 0..=100)
/// as a tie-break; [`UNMEASURED`] when the node cannot take it or has no `Device` object.
pub fn raw_score(
    node: &NodeState,
    needs: &PodNeeds,
    scoring: &ScoringConfig,
    cpu: Option<i64>,
) -> i64 {
    let Some(req) = needs.devices.as_ref() else {
        return UNMEASURED;
    };
    let Some((free, card)) = node_free(node) else {
        return UNMEASURED;
    };
    let Some(task) = task_of(req, needs.cpu_request_milli.unwrap_or(0), Some(&card)) else {
        return UNMEASURED;
    };
    let mix = scoring.device.mix.current().or_only(&task);
    match place(&mix, &free, &task) {
        None => UNMEASURED,
        Some(p) => {
            let growth = (p.delta * 10.0).round().clamp(-1e12, 1e12) as i64;
            (-growth) * CPU_TIE_BREAK + cpu.unwrap_or(0).clamp(0, 100)
        }
    }
}

/// The extender's 0-10 from raw fragmentation scores: the least growth among the nodes gets
/// 10, the most 0, the rest in proportion (the whole range for every pod, however small the
/// differences); unmeasured nodes 0; all equal, 0 (no opinion).
pub fn normalize(raw: &[i64]) -> Vec<i64> {
    let measured = || raw.iter().copied().filter(|r| *r > UNMEASURED);
    let (Some(lo), Some(hi)) = (measured().min(), measured().max()) else {
        return vec![0; raw.len()];
    };
    if lo == hi {
        return vec![0; raw.len()];
    }
    raw.iter()
        .map(|r| {
            if *r <= UNMEASURED {
                0
            } else {
                (i128::from(*r - lo) * 10 / i128::from(hi - lo)) as i64
            }
        })
        .collect()
}

/// Filter's part: the pod's task kind joins the learned workload mix (once per pod).
pub fn observe(pod: &Pod, needs: &PodNeeds, scoring: &ScoringConfig) {
    if scoring.device.strategy != ScoringStrategy::Fragmentation {
        return;
    }
    let (Some(uid), Some(req)) = (pod.metadata.uid.as_deref(), needs.devices.as_ref()) else {
        return;
    };
    if let Some(task) = task_of(req, needs.cpu_request_milli.unwrap_or(0), None) {
        scoring.device.mix.observe(uid, task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_uses_the_whole_range() {
        assert_eq!(normalize(&[-500, -100, -300]), vec![0, 10, 5]);
        assert_eq!(normalize(&[7, 7]), vec![0, 0]);
        assert_eq!(normalize(&[UNMEASURED, 5, 1]), vec![0, 10, 0]);
        assert_eq!(normalize(&[UNMEASURED]), vec![0]);
        assert!(normalize(&[]).is_empty());
    }
}
