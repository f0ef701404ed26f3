//! The fragmentation strategy at the node level: prioritize's raw score on a locked node, its
//! normalization to the extender's 0-10, and the filter's observation of the workload mix.
//! Reads a node's free GPUs and free CPU (from the read snapshot, or its ledgers under the
//! node's lock where the snapshot cannot say), and asks
//! [`crate::placement::device::fragmentation`]; remembers its answers in its own memo
//! (`ReadMemos::fragmentation`) and changes nothing else.

use std::borrow::Cow;
use std::cell::RefCell;

use super::Scheduler;
use super::config::ScoringConfig;
use super::memo::{CpuRead, table_limit};
use super::needs::PodNeeds;
use crate::cluster::NodeState;
use crate::cluster::snapshot::{DeviceView, NodeView, hash128};
use crate::metrics::Metrics;
use crate::model::device::DeviceResources;
use crate::model::device::DeviceType;
use crate::model::pod::Pod;
use crate::model::quantity::Quantity;
use crate::placement::device::fragmentation::WorkloadMix;
use crate::placement::device::fragmentation::{
    GpuAsk, MILLI_PER_GPU, NodeFree, TaskShape, card_free_milli_of_used, place, task_of,
};
use crate::placement::device::index::{DimVec, INDEX_DIMS};
use crate::placement::device::score::ScoringStrategy;

/// A raw score at or below this: the pod cannot be measured or placed on the node (no
/// `Device` object, no card that takes it); it normalizes to 0.
pub const UNMEASURED: i64 = i64::MIN / 4;

/// Room below the growth for each tie-break (both 0..=100): how packed the node's GPUs end
/// up, then the usual score of a pod that asks for CPU placement.
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
    use crate::placement::device::inventory::DeviceHoldings;
    let ledger = node.device_ledger();
    let devices = ledger.devices()?;
    // Free per card as `ledger.free(&[])` would give it, without building that map
    // (prioritize runs this on every candidate): nothing is free while a malformed entry
    // blocks the node.
    let blocked = ledger.blocked(&[]);
    let used = ledger.used().get(&DeviceType::Gpu);
    let mut card = None;
    let mut gpus = Vec::new();
    for slot in devices.slots(&DeviceType::Gpu).filter(|s| s.healthy) {
        card.get_or_insert(&slot.total);
        gpus.push(if blocked {
            0
        } else {
            card_free_milli_of_used(&slot.total, used.and_then(|u| u.get(&slot.minor)))
        });
    }
    let card = card?.clone();
    let cpu_milli = node.node.as_ref().map(|n| {
        n.allocatable_milli_cpu()
            .saturating_sub(node.requested_milli_cpu(&[]))
    });
    Some((NodeFree { cpu_milli, gpus }, card))
}

/// Prioritize's raw score where [`applies`]: the growth of the workload's expected
/// fragmentation if the pod goes here (its best card for a share), negated so that higher is
/// better, in tenths of a milli-GPU, scaled to leave room for two tie-breaks ([`packed`], then
/// the usual score of a pod that asks for CPU placement, added by [`prioritize_raw`]);
/// [`UNMEASURED`] when the node cannot take the pod or has no `Device` object (a GPU pod).
pub fn raw_score(node: &NodeState, needs: &PodNeeds, mix: &WorkloadMix) -> i64 {
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
    score_of(mix, &free, &task)
}

/// The raw score of `task` on a node whose free capacity is `free`.
fn score_of(mix: &WorkloadMix, free: &NodeFree, task: &TaskShape) -> i64 {
    let learned;
    let mix = if mix.is_empty() {
        learned = WorkloadMix::new([(*task, 1.0)]);
        &learned
    } else {
        mix
    };
    match place(mix, free, task) {
        None => UNMEASURED,
        Some(p) => {
            let growth = (p.delta * 10.0).round().clamp(-1e12, 1e12) as i64;
            ((-growth) * TIE_BREAK + packed(free, task)) * TIE_BREAK
        }
    }
}

/// Prioritize's raw scores where [`applies`], one mix for the whole request: from the read
/// snapshot, under the node's lock where the snapshot cannot answer (devices it does not
/// index, cards of different sizes). `usual`: per name, the configured formulas' score
/// (0..=100), the last tie-break, for a pod that asks for CPU placement.
///
/// A node's measure reads its device facts and its free CPU, the pod and the mix: nodes alike
/// in both are measured once (`scheduler::memo`, keyed by the device fingerprint and the free
/// CPU), and the answers are kept for the next request of the same pod shape against the
/// same published mix ([`WorkloadMix::id`]), which a steady workload keeps
/// (`MIX_PUBLISH_SHIFT`). Debug builds measure every remembered node again and compare.
pub fn prioritize_raw(
    state: &Scheduler,
    names: &[Cow<'_, str>],
    needs: &PodNeeds,
    usual: Option<&[i64]>,
) -> Vec<i64> {
    let mix = state.scoring.device.mix.current();
    let snapshot = state.cluster.read_snapshot();
    let mut finder = snapshot.finder();
    // A cell: the memo may measure a node twice (debug builds check a hit).
    let scratch = RefCell::new(Scratch::default());
    let shape = (hash128(&(needs, mix.id())), true, CpuRead::FreeMilli);
    let limit = table_limit(snapshot.len());
    state
        .memos
        .fragmentation
        .with_memo(shape, limit, &state.metrics, "fragmentation", |memo| {
            names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let raw = memo
                        .answer(finder.find(name), |view| {
                            snapshot_raw(view?, needs, &mix, &mut scratch.borrow_mut())
                        })
                        .unwrap_or_else(|| {
                            let entry = state.cluster.node(name);
                            let guard = entry.as_ref().map(|e| e.read());
                            match guard.as_deref() {
                                None => UNMEASURED,
                                Some(node) => raw_score(node, needs, &mix),
                            }
                        });
                    let tie = usual.and_then(|u| u.get(i).copied());
                    if raw <= UNMEASURED {
                        raw
                    } else {
                        raw + tie.unwrap_or(0).clamp(0, 100)
                    }
                })
                .collect()
        })
}

/// What measuring nodes from the snapshot reuses between nodes of one request: the free
/// capacity's buffer, and the pod's task kind per card size (few sizes in a fleet).
#[derive(Default)]
struct Scratch {
    free: NodeFree,
    tasks: Vec<(DimVec, Option<TaskShape>)>,
}

/// The raw score from the node's published facts, exactly as [`raw_score`] gives it from its
/// ledgers; `None` where only the ledgers can say.
fn snapshot_raw(
    view: NodeView<'_>,
    needs: &PodNeeds,
    mix: &WorkloadMix,
    scratch: &mut Scratch,
) -> Option<i64> {
    let Scratch { free, tasks } = scratch;
    let card = match snapshot_free(view, needs, free)? {
        Free::Unmeasured => return Some(UNMEASURED),
        Free::Node(card) => card,
    };
    let task = match tasks.iter().find(|(c, _)| *c == card) {
        Some((_, task)) => *task,
        None => {
            let task = task_on(needs, card_resources(&card).as_ref());
            tasks.push((card, task));
            task
        }
    };
    Some(match task {
        None => UNMEASURED,
        Some(task) => score_of(mix, free, &task),
    })
}

/// What the snapshot says of a node's free capacity for the measure.
enum Free {
    /// The free capacity is in the caller's buffer; the size of the node's cards (zero: no
    /// GPUs).
    Node(DimVec),
    /// The pod cannot be measured here (a GPU pod on a node without GPUs it could use).
    Unmeasured,
}

const CORE: usize = 0;
const MEM: usize = 1;
const RATIO: usize = 2;

/// The node's free capacity from its published facts, into `free`, exactly as [`node_free`]
/// reads it from the ledgers; `None` where only the ledgers can say (devices the index cannot
/// carry, cards of different sizes).
fn snapshot_free(view: NodeView<'_>, needs: &PodNeeds, free: &mut NodeFree) -> Option<Free> {
    debug_assert_eq!(INDEX_DIMS[CORE], crate::model::device::GPU_CORE);
    debug_assert_eq!(INDEX_DIMS[MEM], crate::model::device::GPU_MEMORY);
    debug_assert_eq!(INDEX_DIMS[RATIO], crate::model::device::GPU_MEMORY_RATIO);
    free.gpus.clear();
    free.cpu_milli = None;
    let no_gpus = || {
        if needs.devices.is_none() {
            Free::Node(DimVec::default())
        } else {
            Free::Unmeasured
        }
    };
    let index = match view.devices {
        DeviceView::Missing { .. } => return Some(no_gpus()),
        DeviceView::Unindexed => return None,
        DeviceView::Indexed(index) => index,
    };
    let totals = index.totals(&DeviceType::Gpu);
    let Some(first) = totals.first() else {
        return Some(no_gpus());
    };
    if totals.iter().any(|t| t.dims != first.dims) {
        return None;
    }
    let card = first.dims;
    let cards: usize = totals.iter().map(|t| usize::from(t.count)).sum();
    if !index.blocked {
        for group in index.frees(&DeviceType::Gpu) {
            let milli = [CORE, MEM, RATIO]
                .into_iter()
                .filter(|d| card[*d] > 0)
                .map(|d| {
                    let part = i128::from(group.dims[d].clamp(0, card[d]));
                    (part * i128::from(MILLI_PER_GPU) / i128::from(card[d])) as i64
                })
                .min()
                .unwrap_or(0);
            free.gpus
                .extend(std::iter::repeat_n(milli, usize::from(group.count)));
        }
    }
    let len = cards.max(free.gpus.len());
    free.gpus.resize(len, 0);
    free.cpu_milli = view.free_cpu_milli;
    Some(Free::Node(card))
}

/// A card's size as resources (what [`task_of`] reads), from its index dimensions; `None` for
/// a node without cards.
fn card_resources(card: &DimVec) -> Option<DeviceResources> {
    if card.iter().all(|d| *d == 0) {
        return None;
    }
    Some(
        [CORE, MEM, RATIO]
            .into_iter()
            .filter(|d| card[*d] > 0)
            .map(|d| {
                (
                    INDEX_DIMS[d].to_string(),
                    Quantity::from_milli(i128::from(card[d])),
                )
            })
            .collect(),
    )
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
    // Only the highest LEVELS distinct growths score above 0: keep those (descending) in one
    // pass instead of sorting every candidate's.
    const LEVELS: usize = 11;
    let mut top: Vec<i64> = Vec::with_capacity(LEVELS + 1);
    for &r in raw.iter().filter(|r| **r > UNMEASURED) {
        if top.len() == LEVELS && top.last().is_some_and(|last| r < *last) {
            continue;
        }
        if let Err(at) = top.binary_search_by(|l| r.cmp(l)) {
            top.insert(at, r);
            top.truncate(LEVELS);
        }
    }
    if top.len() < 2 {
        return vec![0; raw.len()];
    }
    raw.iter()
        .map(|r| match top.iter().position(|l| l == r) {
            Some(rank) if *r > UNMEASURED => 10 - rank as i64,
            _ => 0,
        })
        .collect()
}

/// Filter's part: the pod's task kind joins the learned workload mix (once per pod).
pub fn observe(pod: &Pod, needs: &PodNeeds, scoring: &ScoringConfig, metrics: &Metrics) {
    if scoring.device.strategy != ScoringStrategy::Fragmentation {
        return;
    }
    let publish = || {
        let kinds = scoring.device.mix.current().kinds().len();
        metrics
            .fragmentation_mix_kinds
            .set(i64::try_from(kinds).unwrap_or(i64::MAX));
    };
    let Some(uid) = pod.metadata.uid.as_deref() else {
        return publish();
    };
    let task = match &needs.devices {
        Some(req) => task_of(req, needs.cpu_request_milli.unwrap_or(0), None),
        None => task_on(needs, None),
    };
    if let Some(task) = task {
        scoring.device.mix.observe(uid, task);
    }
    publish();
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    /// A node with `cards` GPUs (one unhealthy when `sick`, one card size or two), the holders'
    /// shares per card (percent; 100 a whole card), one holder with a malformed annotation
    /// when `malformed`, and plain pods' CPU requests.
    fn cluster(
        cards: usize,
        sick: bool,
        mixed_sizes: bool,
        held: &[(usize, u32)],
        malformed: bool,
        plain_cpu: &[u32],
    ) -> String {
        let devices: Vec<Value> = (0..cards)
            .map(|m| {
                let mem = if mixed_sizes && m == 0 { "40Gi" } else { "80Gi" };
                json!({"type": "gpu", "id": format!("GPU-{m}"), "minor": m,
                    "health": !(sick && m == cards - 1),
                    "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": mem,
                        "koordinator.sh/gpu-memory-ratio": "100"}})
            })
            .collect();
        let mut items = vec![
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": cards.to_string()}}}),
            json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
                "metadata": {"name": "n"}, "spec": {"devices": devices}}),
        ];
        let pod = |i: usize, cpu: u32, annotation: Option<String>| {
            let mut meta =
                json!({"name": format!("p{i}"), "namespace": "ns", "uid": format!("u{i}")});
            if let Some(a) = annotation {
                meta["annotations"] = json!({"scheduling.koordinator.sh/device-allocated": a});
            }
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeName": "n", "containers": [{"name": "c",
                    "resources": {"requests": {"cpu": cpu.to_string()}}}]},
                "status": {"phase": "Running"}})
        };
        for (i, (card, percent)) in held.iter().enumerate() {
            let minor = card % cards;
            let a = json!({"gpu": [{"minor": minor, "resources": {
                "koordinator.sh/gpu-core": percent.to_string(),
                "koordinator.sh/gpu-memory-ratio": percent.to_string()}}]});
            items.push(pod(i, 2, Some(a.to_string())));
        }
        if malformed {
            items.push(pod(90, 1, Some("{not json".into())));
        }
        for (i, cpu) in plain_cpu.iter().enumerate() {
            items.push(pod(100 + i, *cpu, None));
        }
        json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
    }

    /// Filter's observation publishes the mix's size: two kinds of pod seen, two kinds.
    #[test]
    fn observing_pods_publishes_the_mix_size() {
        let state = fragmentation_state(&cluster(2, false, false, &[], false, &[]));
        assert_eq!(state.metrics.fragmentation_mix_kinds.get(), 0);
        let asks = [
            json!({"cpu": "4", "koordinator.sh/gpu-memory-ratio": "50"}),
            json!({"cpu": "8", "nvidia.com/gpu": "1"}),
            json!({"cpu": "4", "koordinator.sh/gpu-memory-ratio": "50"}),
        ];
        for (i, requests) in asks.iter().enumerate() {
            let pod: Pod = serde_json::from_value(
                json!({"metadata": {"name": format!("p{i}"), "namespace": "ns", "uid": format!("u{i}")},
                "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}}),
            )
            .unwrap();
            let needs = state.pod_needs(&pod).unwrap();
            observe(&pod, &needs, &state.scoring, &state.metrics);
        }
        assert_eq!(state.metrics.fragmentation_mix_kinds.get(), 2);
    }

    /// Two nodes alike in their GPUs (two cards, one half used) and unlike in free CPU (the
    /// second's plain pods leave 6 of 64 cores free), scored with a learning mix.
    fn two_nodes_state() -> Scheduler {
        let node = |name: &str| {
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "2"}}})
        };
        let device = |name: &str| {
            let cards: Vec<Value> = (0..2)
                .map(|m| json!({"type": "gpu", "id": format!("{name}-{m}"), "minor": m, "health": true,
                    "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
                        "koordinator.sh/gpu-memory-ratio": "100"}}))
                .collect();
            json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
                "metadata": {"name": name}, "spec": {"devices": cards}})
        };
        let pod = |name: &str, node: &str, cpu: &str, allocated: Option<Value>| {
            let mut meta = json!({"name": name, "namespace": "ns", "uid": name});
            if let Some(a) = allocated {
                meta["annotations"] =
                    json!({"scheduling.koordinator.sh/device-allocated": a.to_string()});
            }
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeName": node, "containers": [{"name": "c",
                    "resources": {"requests": {"cpu": cpu}}}]},
                "status": {"phase": "Running"}})
        };
        let half = json!({"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "50",
            "koordinator.sh/gpu-memory-ratio": "50"}}]});
        let items = vec![
            node("a"),
            node("b"),
            device("a"),
            device("b"),
            pod("ha", "a", "2", Some(half.clone())),
            pod("hb", "b", "2", Some(half)),
            pod("plain", "b", "56", None),
        ];
        fragmentation_state(
            &json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
        )
    }

    /// The scheduler of the cluster file `text`, scoring with the fragmentation strategy and a
    /// learning mix.
    fn fragmentation_state(text: &str) -> Scheduler {
        let file = crate::sync::file_source::ClusterFile::parse(text, "c").unwrap();
        let api = std::sync::Arc::new(crate::scheduler::bind::OfflinePodApi::new(
            file.pods.clone(),
        ));
        let scoring = ScoringConfig::from_flags(&super::super::ScoringFlags {
            device_strategy: "fragmentation",
            ..super::super::ScoringFlags::DEFAULT
        })
        .unwrap();
        crate::ops::inspect::load_cluster_file(file).into_scheduler(api, scoring)
    }

    /// Prioritize's raw scores for `requests` on nodes a and b, once through the memo as the
    /// verb runs it and once with every memo emptied first.
    fn raw_twice(state: &Scheduler, requests: Value) -> (Vec<i64>, Vec<i64>) {
        let needs = needs_of(state, requests);
        assert!(applies(&needs, &state.scoring));
        let names = [Cow::Borrowed("a"), Cow::Borrowed("b")];
        let kept = prioritize_raw(state, &names, &needs, None);
        state.memos.clear();
        let fresh = prioritize_raw(state, &names, &needs, None);
        (kept, fresh)
    }

    /// The memo's key holds the free CPU: nodes alike in their devices but not in free CPU are
    /// measured apart (b cannot run the workload's 8-core whole-GPU pods, so a whole GPU taken
    /// there removes fragment; on a it leaves the half card as it was), and a request after the mix moves is measured against the new mix,
    /// not answered from the old one's memo.
    #[test]
    fn the_measure_is_remembered_by_free_cpu_and_mix() {
        let state = two_nodes_state();
        let mix = &state.scoring.device.mix;
        for i in 0..50 {
            mix.observe(
                &format!("w{i}"),
                TaskShape {
                    cpu_milli: 8000,
                    gpu: GpuAsk::Whole(1),
                },
            );
        }
        let share = json!({"cpu": "1", "nvidia.com/gpu": "1"});
        let (kept, fresh) = raw_twice(&state, share.clone());
        assert_eq!(kept, fresh);
        assert_ne!(kept[0], kept[1], "free CPU tells the nodes apart: {kept:?}");
        // Remembered: the same shape and mix again answers from the memo, and equally.
        let before = state
            .metrics
            .read_decisions
            .with_label_values(&["fragmentation", "memo"])
            .get();
        let needs = needs_of(&state, share.clone());
        let again = prioritize_raw(
            &state,
            &[Cow::Borrowed("a"), Cow::Borrowed("b")],
            &needs,
            None,
        );
        assert_eq!(again, fresh);
        let after = state
            .metrics
            .read_decisions
            .with_label_values(&["fragmentation", "memo"])
            .get();
        assert_eq!(after - before, 2, "both nodes answered from the memo");
        // The workload turns to small shares: the mix is republished and the measure follows.
        let old = mix.current().id();
        for i in 0..400 {
            mix.observe(
                &format!("s{i}"),
                TaskShape {
                    cpu_milli: 1000,
                    gpu: GpuAsk::Share(300),
                },
            );
        }
        assert_ne!(mix.current().id(), old);
        let (kept_after, fresh_after) = raw_twice(&state, share);
        assert_eq!(kept_after, fresh_after);
        assert_ne!(kept_after, kept, "the new mix measures differently");
    }

    fn needs_of(state: &Scheduler, requests: Value) -> PodNeeds {
        let pod: Pod = serde_json::from_value(
            json!({"metadata": {"name": "x", "namespace": "ns", "uid": "x"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}}),
        )
        .unwrap();
        super::super::needs::pod_needs(&pod, state.needs_inputs()).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// The snapshot's free capacity is the ledgers': every raw score the snapshot path
        /// gives equals the one the node's locked state gives, for every kind of pod, on
        /// nodes with holders, unhealthy and malformed cards, plain pods and mixed sizes.
        #[test]
        fn the_snapshot_measures_what_the_ledgers_measure(
            cards in 1usize..=8,
            sick in any::<bool>(),
            mixed_sizes in any::<bool>(),
            held in proptest::collection::vec((0usize..8, prop_oneof![Just(100u32), 5u32..95]), 0..10),
            malformed in proptest::bool::weighted(0.1),
            plain_cpu in proptest::collection::vec(1u32..24, 0..4),
            ask in prop_oneof![
                (1u32..100).prop_map(|p| json!({"cpu": "3", "koordinator.sh/gpu-core": p.to_string(), "koordinator.sh/gpu-memory-ratio": p.to_string()})),
                (1u32..=3).prop_map(|k| json!({"cpu": "11", "nvidia.com/gpu": k.to_string()})),
                (1u32..40).prop_map(|c| json!({"cpu": c.to_string()})),
            ],
            kinds in proptest::collection::vec((1i64..1000, 0i64..40_000), 0..4),
        ) {
            let text = cluster(cards, sick, mixed_sizes, &held, malformed, &plain_cpu);
            let file = crate::sync::file_source::ClusterFile::parse(&text, "c").unwrap();
            let api = std::sync::Arc::new(crate::scheduler::bind::OfflinePodApi::new(file.pods.clone()));
            let scoring = ScoringConfig::from_flags(&super::super::ScoringFlags {
            device_strategy: "fragmentation",
            ..super::super::ScoringFlags::DEFAULT
        }).unwrap();
            for (i, (d, cpu)) in kinds.iter().enumerate() {
                scoring.device.mix.observe(&format!("k{i}"), TaskShape { cpu_milli: *cpu, gpu: GpuAsk::Share(*d) });
            }
            let state = crate::ops::inspect::load_cluster_file(file).into_scheduler(api, scoring);
            let needs = needs_of(&state, ask);
            prop_assume!(applies(&needs, &state.scoring));
            let mix = state.scoring.device.mix.current();
            let snapshot = state.cluster.read_snapshot();
            let view = snapshot.find("n").map(|f| f.view()).unwrap();
            let entry = state.cluster.node("n").unwrap();
            let node = entry.read();
            let full = raw_score(&node, &needs, &mix);
            let mut free = NodeFree { cpu_milli: None, gpus: vec![7; 3] };
            match snapshot_free(view, &needs, &mut free) {
                None => prop_assert!(mixed_sizes, "only mixed card sizes need the ledgers"),
                Some(Free::Unmeasured) => prop_assert_eq!(full, UNMEASURED),
                Some(Free::Node(card)) => {
                    let got = match task_on(&needs, card_resources(&card).as_ref()) {
                        None => UNMEASURED,
                        Some(task) => score_of(&mix, &free, &task),
                    };
                    prop_assert_eq!(got, full);
                }
            }
        }
    }

    /// Ranks by definition: every distinct measured score sorted, best first; a node gets
    /// 10 minus its score's rank, at least 0; unmeasured nodes 0; fewer than two distinct
    /// scores, 0 everywhere.
    fn normalize_by_sorting(raw: &[i64]) -> Vec<i64> {
        let mut levels: Vec<i64> = raw.iter().copied().filter(|r| *r > UNMEASURED).collect();
        levels.sort_unstable_by(|a, b| b.cmp(a));
        levels.dedup();
        if levels.len() < 2 {
            return vec![0; raw.len()];
        }
        raw.iter()
            .map(|r| match levels.iter().position(|l| l == r) {
                Some(rank) if *r > UNMEASURED => (10 - rank as i64).max(0),
                _ => 0,
            })
            .collect()
    }

    proptest! {
        #[test]
        fn normalization_is_the_rank_of_each_growth(
            raw in proptest::collection::vec(
                prop_oneof![Just(UNMEASURED), Just(UNMEASURED - 3), -40i64..40, any::<i64>()],
                0..60,
            ),
        ) {
            prop_assert_eq!(normalize(&raw), normalize_by_sorting(&raw));
        }
    }

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
