//! The fragmentation strategy at the node level: prioritize's raw score on a locked node, its
//! normalization to the extender's 0-10, and the filter's observation of the workload mix.
//! Reads a node's free GPUs (its device ledger) and free CPU (its Node and pods), and asks
//! [`crate::placement::device::fragmentation`]; never mutates anything.

use super::config::ScoringConfig;
use super::needs::PodNeeds;
use crate::cluster::NodeState;
use crate::model::device::DeviceResources;
use crate::model::device::DeviceType;
use crate::model::pod::Pod;
use crate::placement::device::fragmentation::{
    GpuAsk, MILLI_PER_GPU, NodeFree, TaskShape, card_free_milli, place, task_of,
};
use crate::placement::device::score::ScoringStrategy;

/// A raw score at or below this: the pod cannot be measured or placed on the node (no
/// `Device` object, no card that takes it); it normalizes to 0.
pub const UNMEASURED: i64 = i64::MIN / 4;

/// Room below the growth for each tie-break (both 0..=100): how packed the node's GPUs end
/// up, then the CPU score of a pod that asks for CPU placement.
const TIE_BREAK: i64 = 128;

/// Whether the fragmentation strategy scores this pod's nodes: the strategy is on and the pod
/// asks for whole GPUs or a share of one (a share spread over several cards is scored as
/// LeastAllocated), or for no device but some CPU (a pod routed here by `routeAllPods`: its
/// CPU can strand a node's GPUs).
pub fn applies(needs: &PodNeeds, scoring: &ScoringConfig) -> bool {
    if scoring.device.strategy != ScoringStrategy::Fragmentation {
        return false;
    }
    match &needs.devices {
        Some(d) => d
            .get(&DeviceType::Gpu)
            .is_some_and(|r| !r.shared || r.count == 1),
        None => needs.cpu_request_milli.is_some_and(|c| c > 0),
    }
}

/// The pod's task kind on a node whose first card is `card` (`None`: no GPUs there).
fn task_on(needs: &PodNeeds, card: Option<&DeviceResources>) -> Option<TaskShape> {
    let cpu_milli = needs.cpu_request_milli.unwrap_or(0);
    match &needs.devices {
        Some(req) => task_of(req, cpu_milli, Some(card?)),
        None => Some(TaskShape {
            cpu_milli,
            gpu: GpuAsk::None,
        }),
    }
}

/// The node's free capacity as the measure reads it, and the size of its first healthy card.
fn node_free(node: &NodeState) -> Option<(NodeFree, DeviceResources)> {
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
/// better, in tenths of a milli-GPU, scaled to leave room for two tie-breaks ([`packed`], then
/// the CPU score `cpu`, 0..=100); [`UNMEASURED`] when the node cannot take the pod or has no
/// `Device` object (a GPU pod).
pub fn raw_score(
    node: &NodeState,
    needs: &PodNeeds,
    scoring: &ScoringConfig,
    cpu: Option<i64>,
) -> i64 {
    let (free, card) = match node_free(node) {
        Some((free, card)) => (free, Some(card)),
        // No GPUs to strand: a CPU-only pod fragments nothing here.
        None if needs.devices.is_none() => (
            NodeFree {
                cpu_milli: None,
                gpus: Vec::new(),
            },
            None,
        ),
        None => return UNMEASURED,
    };
    let Some(task) = task_on(needs, card.as_ref()) else {
        return UNMEASURED;
    };
    let mix = scoring.device.mix.current().or_only(&task);
    match place(&mix, &free, &task) {
        None => UNMEASURED,
        Some(p) => {
            let growth = (p.delta * 10.0).round().clamp(-1e12, 1e12) as i64;
            ((-growth) * TIE_BREAK + packed(&free, &task)) * TIE_BREAK
                + cpu.unwrap_or(0).clamp(0, 100)
        }
    }
}

/// The first tie-break between equal growths, 0..=100: how much of the node's GPU capacity
/// is used once the pod is placed (a node without GPUs counts as full: a CPU-only pod strands
/// nothing there). Packing where the measure sees no difference keeps whole nodes whole for
/// the pods that need them; measured by the trace replay (BENCHMARKS.md).
fn packed(free: &NodeFree, task: &TaskShape) -> i64 {
    let total = free.gpus.len() as i64 * MILLI_PER_GPU;
    if total == 0 {
        return 100;
    }
    let asked = match task.gpu {
        GpuAsk::None => 0,
        GpuAsk::Share(d) => d,
        GpuAsk::Whole(k) => k * MILLI_PER_GPU,
    };
    let left = (free.gpus.iter().sum::<i64>() - asked).clamp(0, total);
    100 - left * 100 / total
}

/// The extender's 0-10 from raw fragmentation scores, by rank: the nodes with the least
/// growth get 10, those with the next distinct growth 9, and so on down to 0 (unmeasured nodes
/// 0; all equal, 0: no opinion). kube-scheduler adds `score × weight × 10` to its own scores
/// and takes the best total, so at the chart's weight the nodes it chooses among are exactly
/// the least-growth ones, its own scores breaking their ties; a proportional scale would
/// lump every node within a tenth of the range with the best.
pub fn normalize(raw: &[i64]) -> Vec<i64> {
    let mut levels: Vec<i64> = raw.iter().copied().filter(|r| *r > UNMEASURED).collect();
    levels.sort_unstable_by(|a, b| b.cmp(a));
    levels.dedup();
    if levels.len() < 2 {
        return vec![0; raw.len()];
    }
    raw.iter()
        .map(|r| match levels.binary_search_by(|l| r.cmp(l)) {
            Ok(rank) if *r > UNMEASURED => 10 - (rank as i64).min(10),
            _ => 0,
        })
        .collect()
}

/// Filter's part: the pod's task kind joins the learned workload mix (once per pod).
pub fn observe(pod: &Pod, needs: &PodNeeds, scoring: &ScoringConfig) {
    if scoring.device.strategy != ScoringStrategy::Fragmentation {
        return;
    }
    let Some(uid) = pod.metadata.uid.as_deref() else {
        return;
    };
    let task = match &needs.devices {
        Some(req) => task_of(req, needs.cpu_request_milli.unwrap_or(0), None),
        None => task_on(needs, None),
    };
    if let Some(task) = task {
        scoring.device.mix.observe(uid, task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_ranks_the_growths() {
        assert_eq!(normalize(&[-500, -100, -300, -100]), vec![8, 10, 9, 10]);
        assert_eq!(normalize(&[7, 7]), vec![0, 0]);
        assert_eq!(normalize(&[UNMEASURED, 5, 1]), vec![0, 10, 9]);
        // Eleven distinct levels and more: the eleventh and below are 0.
        let many: Vec<i64> = (0..15).collect();
        let scores = normalize(&many);
        assert_eq!(scores[14], 10);
        assert_eq!(scores[5], 1);
        assert_eq!(&scores[..5], &[0; 5]);
        assert_eq!(normalize(&[UNMEASURED]), vec![0]);
        assert!(normalize(&[]).is_empty());
    }
}
