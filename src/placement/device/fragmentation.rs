//! GPU fragmentation (Weng et al., "Beware of Fragmentation", USENIX ATC '23): how much of a
//! node's free GPU capacity a workload could not use, how much a placement changes that, and
//! the workload mix the measure is taken against, learned from the pods the extender sees.
//!
//! The measure, in the paper's terms (checked against its simulator's `GetNodePodFrag` and
//! `NodeGpuShareFragAmount`): for one task kind, a node's *fragment* is all of its free GPU
//! capacity when the task cannot run there (too little CPU, no card with the share free, too few
//! wholly free cards) or asks no GPU at all; otherwise it is the free part of the cards the task
//! could not use (cards with less free than its share; partly used cards for whole-GPU tasks).
//! For a workload, the fragments of its kinds weighted by their share of the workload.
//! Fragmentation Gradient Descent places each pod where that expectation grows least.
//!
//! Owns the arithmetic and the mix. Pure: reads no ledger and takes no lock of the caches; the
//! scorer and the allocator bring it a node's free capacity and ask.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::request::PodDeviceRequest;
use crate::model::device::{DeviceResources, DeviceType, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO};
use crate::model::quantity::Quantity;

/// One GPU in milli-GPUs.
pub const MILLI_PER_GPU: i64 = 1000;

/// What a task asks of GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuAsk {
    /// No GPU (a CPU-only task).
    None,
    /// A share of one card, in milli-GPUs (1..=999).
    Share(i64),
    /// This many whole cards.
    Whole(i64),
}

/// A task kind: its CPU request and its GPU ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskShape {
    pub cpu_milli: i64,
    pub gpu: GpuAsk,
}

/// A node's free capacity as the measure reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFree {
    /// Free CPU in millicores; `None` when the node's CPU is not known (then CPU never
    /// blocks a task).
    pub cpu_milli: Option<i64>,
    /// Free milli-GPUs of each healthy card (0..=1000), in minor order.
    pub gpus: Vec<i64>,
}

impl NodeFree {
    fn total(&self) -> i64 {
        self.gpus.iter().map(|g| (*g).max(0)).sum()
    }
}

/// The node's fragment for one task kind, in milli-GPUs (see the module docs).
pub fn task_fragment(node: &NodeFree, task: &TaskShape) -> i64 {
    let total = node.total();
    let cpu_short = node.cpu_milli.is_some_and(|free| free < task.cpu_milli);
    match task.gpu {
        GpuAsk::None => total,
        _ if cpu_short => total,
        GpuAsk::Share(d) => {
            if node.gpus.iter().any(|g| *g >= d) {
                node.gpus
                    .iter()
                    .filter(|g| **g < d)
                    .map(|g| (*g).max(0))
                    .sum()
            } else {
                total
            }
        }
        GpuAsk::Whole(k) => {
            let whole = node.gpus.iter().filter(|g| **g >= MILLI_PER_GPU).count() as i64;
            if whole >= k {
                node.gpus
                    .iter()
                    .filter(|g| **g < MILLI_PER_GPU)
                    .map(|g| (*g).max(0))
                    .sum()
            } else {
                total
            }
        }
    }
}

/// The GPU dimensions a card's fraction is read from.
const CARD_DIMS: [&str; 3] = [GPU_CORE, GPU_MEMORY_RATIO, GPU_MEMORY];

fn fraction_milli(part: Quantity, whole: Quantity, round_up: bool) -> i64 {
    let (part, whole) = (part.milli().max(0), whole.milli());
    let scaled = part * i128::from(MILLI_PER_GPU);
    let v = if round_up {
        (scaled + whole - 1) / whole
    } else {
        scaled / whole
    };
    i64::try_from(v.min(i128::from(MILLI_PER_GPU))).unwrap_or(MILLI_PER_GPU)
}

/// A card's free part in milli-GPUs: its scarcest GPU dimension as a fraction of the card's
/// (0 when the card has none of them).
pub fn card_free_milli(total: &DeviceResources, free: &DeviceResources) -> i64 {
    CARD_DIMS
        .iter()
        .filter_map(|d| {
            let whole = total.get(*d).filter(|q| q.milli() > 0)?;
            Some(fraction_milli(
                free.get(*d).copied().unwrap_or(Quantity::ZERO),
                *whole,
                false,
            ))
        })
        .min()
        .unwrap_or(0)
}

/// [`card_free_milli`] from what is used of the card (free = total − used, never below zero),
/// without building the free map.
pub fn card_free_milli_of_used(total: &DeviceResources, used: Option<&DeviceResources>) -> i64 {
    CARD_DIMS
        .iter()
        .filter_map(|d| {
            let whole = total.get(*d).filter(|q| q.milli() > 0)?;
            let taken = used.and_then(|u| u.get(*d)).map_or(0, Quantity::milli);
            let free = Quantity::from_milli((whole.milli() - taken).max(0));
            Some(fraction_milli(free, *whole, false))
        })
        .min()
        .unwrap_or(0)
}

/// What a per-card ask takes of a card of `total`, in milli-GPUs: its largest GPU dimension
/// as a fraction of the card's, rounded up (0 when it names none the card has).
pub fn ask_milli(need: &DeviceResources, total: &DeviceResources) -> i64 {
    CARD_DIMS
        .iter()
        .filter_map(|d| {
            let whole = total.get(*d).filter(|q| q.milli() > 0)?;
            Some(fraction_milli(need.get(*d).copied()?, *whole, true))
        })
        .max()
        .unwrap_or(0)
}

/// A pod's task kind from its GPU request and CPU request: a share of one card in milli-GPUs
/// on a card of `card_total` (without one, as a fraction of a card from the pod's percentages
/// alone), or whole cards. `None` when the measure cannot read it: no GPU request, a share
/// spread over several cards, or a share by bytes with no card to size it against.
pub fn task_of(
    req: &PodDeviceRequest,
    cpu_milli: i64,
    card_total: Option<&DeviceResources>,
) -> Option<TaskShape> {
    let r = req.get(&DeviceType::Gpu)?;
    let gpu = if !r.shared {
        GpuAsk::Whole(i64::try_from(r.count).ok()?)
    } else if r.count == 1 {
        let percent_card: DeviceResources = [GPU_CORE, GPU_MEMORY_RATIO]
            .into_iter()
            .map(|d| (d.to_string(), Quantity::from_milli(100_000)))
            .collect();
        let d = ask_milli(&r.per_device, card_total.unwrap_or(&percent_card));
        match d {
            0 => return None,
            MILLI_PER_GPU.. => GpuAsk::Whole(1),
            d => GpuAsk::Share(d),
        }
    } else {
        return None;
    };
    Some(TaskShape { cpu_milli, gpu })
}

/// Task kinds with their share of the workload (shares sum to 1; empty: no workload known).
#[derive(Clone, Debug, Default)]
pub struct WorkloadMix {
    kinds: Vec<(TaskShape, f64)>,
    /// Unique to this mix among those built in the process (clones share it; the empty
    /// default is 0): what a score computed against the mix may be remembered by.
    id: u64,
}

/// Two mixes are equal when their kinds and shares are; the id only names one.
impl PartialEq for WorkloadMix {
    fn eq(&self, other: &Self) -> bool {
        self.kinds == other.kinds
    }
}

impl WorkloadMix {
    /// From kinds and non-negative weights (normalized here; non-positive weights dropped).
    pub fn new(kinds: impl IntoIterator<Item = (TaskShape, f64)>) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let kinds: Vec<(TaskShape, f64)> = kinds
            .into_iter()
            .filter(|(_, w)| w.is_finite() && *w > 0.0)
            .collect();
        let sum: f64 = kinds.iter().map(|(_, w)| w).sum();
        WorkloadMix {
            kinds: kinds.into_iter().map(|(k, w)| (k, w / sum)).collect(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// This mix's identity: equal ids, the same kinds and shares (never reused in a process;
    /// an equal mix built again gets another id, which only costs a cache its answers).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// How far the workload moved from `other` to this mix: the total variation distance
    /// between the two, ½ Σ |share here − share there| over every kind of either (0: the
    /// same shares; 1: no kind in common).
    pub fn distance(&self, other: &WorkloadMix) -> f64 {
        let share_in = |mix: &WorkloadMix, kind: &TaskShape| {
            mix.kinds
                .iter()
                .find(|(k, _)| k == kind)
                .map_or(0.0, |(_, w)| *w)
        };
        let here: f64 = self
            .kinds
            .iter()
            .map(|(k, w)| (w - share_in(other, k)).abs())
            .sum();
        let only_there: f64 = other
            .kinds
            .iter()
            .filter(|(k, _)| !self.kinds.iter().any(|(mine, _)| mine == k))
            .map(|(_, w)| w)
            .sum();
        (here + only_there) / 2.0
    }

    pub fn kinds(&self) -> &[(TaskShape, f64)] {
        &self.kinds
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// This mix, or one of only `pod`'s kind while nothing is known yet (the first pod).
    pub fn or_only(self: Arc<Self>, pod: &TaskShape) -> Arc<WorkloadMix> {
        if self.is_empty() {
            Arc::new(WorkloadMix::new([(*pod, 1.0)]))
        } else {
            self
        }
    }

    /// The node's expected fragment for this workload, in milli-GPUs.
    pub fn fragmentation(&self, node: &NodeFree) -> f64 {
        self.kinds
            .iter()
            .map(|(task, share)| share * task_fragment(node, task) as f64)
            .sum()
    }
}

/// What placing a pod on a node does to the node's fragmentation: the change (negative when
/// the pod fills a fragment) and, for a share, the card that changes it least.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Placement {
    pub delta: f64,
    /// Index into [`NodeFree::gpus`] of the chosen card (shares only).
    pub card: Option<usize>,
}

/// The least fragmentation growth over the ways `pod` can be placed on `node`; `None` when it
/// cannot be placed there at all (no card with the share free, too few wholly free cards).
/// Ties between cards go to the lowest index. CPU only lowers the free CPU: which card a share
/// takes never changes what CPU leaves.
pub fn place(mix: &WorkloadMix, node: &NodeFree, pod: &TaskShape) -> Option<Placement> {
    let before = mix.fragmentation(node);
    let mut after = node.clone();
    if let (Some(cpu), true) = (after.cpu_milli.as_mut(), pod.cpu_milli > 0) {
        *cpu = cpu.saturating_sub(pod.cpu_milli);
    }
    match pod.gpu {
        GpuAsk::None => Some(Placement {
            delta: mix.fragmentation(&after) - before,
            card: None,
        }),
        GpuAsk::Whole(k) => {
            let mut left = k;
            for g in after.gpus.iter_mut() {
                if left > 0 && *g >= MILLI_PER_GPU {
                    *g = 0;
                    left -= 1;
                }
            }
            (left == 0).then(|| Placement {
                delta: mix.fragmentation(&after) - before,
                card: None,
            })
        }
        GpuAsk::Share(d) => {
            let mut best: Option<Placement> = None;
            for (i, growth) in share_growth(mix, &after, before, d).into_iter().enumerate() {
                let Some(delta) = growth else {
                    continue;
                };
                // Equal growth (to rounding) keeps the lower card.
                if best.is_none_or(|b| delta < b.delta - TIE) {
                    best = Some(Placement {
                        delta,
                        card: Some(i),
                    });
                }
            }
            best
        }
    }
}

/// Per card of `node` (free CPU already lowered by the pod's), the growth of fragmentation
/// over `before` if a `d` milli-GPU share goes there; `None` for a card with less free.
///
/// One pass per kind, then O(1) per card and kind: a share changes one card, so each kind's
/// count of cards it can use and the free on those it cannot move by that card alone
/// (prioritize runs this on every candidate node).
pub fn share_growth(mix: &WorkloadMix, node: &NodeFree, before: f64, d: i64) -> Vec<Option<f64>> {
    struct KindView {
        /// The least free a card needs for the kind (`None`: the kind uses no GPU).
        threshold: Option<i64>,
        cpu_ok: bool,
        usable: i64,
        unusable_free: i64,
    }
    let views: Vec<KindView> = mix
        .kinds
        .iter()
        .map(|(task, _)| {
            let threshold = match task.gpu {
                GpuAsk::None => None,
                GpuAsk::Share(d) => Some(d),
                GpuAsk::Whole(_) => Some(MILLI_PER_GPU),
            };
            let (mut usable, mut unusable_free) = (0, 0);
            if let Some(t) = threshold {
                for g in &node.gpus {
                    if *g >= t {
                        usable += 1;
                    } else {
                        unusable_free += (*g).max(0);
                    }
                }
            }
            KindView {
                threshold,
                cpu_ok: node.cpu_milli.is_none_or(|free| free >= task.cpu_milli),
                usable,
                unusable_free,
            }
        })
        .collect();
    let total_after = node.total() - d;
    node.gpus
        .iter()
        .map(|&g| {
            if g < d {
                return None;
            }
            let left = g - d;
            let mut after = 0.0;
            for ((task, share), v) in mix.kinds.iter().zip(&views) {
                let fragment = match (v.threshold, v.cpu_ok) {
                    (Some(t), true) => {
                        let usable = v.usable - i64::from(g >= t) + i64::from(left >= t);
                        let unusable = v.unusable_free - if g < t { g.max(0) } else { 0 }
                            + if left < t { left } else { 0 };
                        let needed = match task.gpu {
                            GpuAsk::Whole(k) => k,
                            _ => 1,
                        };
                        if usable >= needed {
                            unusable
                        } else {
                            total_after
                        }
                    }
                    _ => total_after,
                };
                after += share * fragment as f64;
            }
            Some(after - before)
        })
        .collect()
}

/// Growths closer than this (milli-GPUs) are equal: float sums of the same terms in another
/// order must not decide a card.
const TIE: f64 = 1e-7;

/// How many task kinds the learned mix keeps (the rarest goes when a new kind arrives).
pub const MIX_KINDS: usize = 64;
/// How many pod UIDs the learner remembers, so a pod retried many times counts once.
pub const MIX_SEEN: usize = 8192;
/// Observations over which a kind's weight halves: the mix follows the workload of the last
/// few thousand pods.
pub const MIX_HALF_LIFE: f64 = 2000.0;
/// How far the learned mix must move from the published one ([`WorkloadMix::distance`])
/// before it is published. Every pod moves it a little (by ~1/2,900 of the workload at the
/// half-life); publishing each of those would give every request a mix of its own, and
/// prioritize could never reuse a node's score across requests (`scheduler::fragment`).
/// At 1 % a steady workload keeps one mix, and a new one takes over within ~30 of its pods.
pub const MIX_PUBLISH_SHIFT: f64 = 0.01;

/// The mix learned from the pods the extender sees: kinds quantized (whole cores, shares to
/// 10 milli-GPUs), weights decaying so the mix follows the workload. Bounded in memory.
#[derive(Debug)]
struct MixLearner {
    weights: BTreeMap<TaskShape, f64>,
    /// Weight a new observation adds; grows by 1/decay per observation instead of decaying
    /// every weight, and everything is rescaled when it grows large.
    increment: f64,
    decay: f64,
    seen: HashSet<String>,
    seen_order: VecDeque<String>,
}

impl MixLearner {
    fn new() -> Self {
        MixLearner {
            weights: BTreeMap::new(),
            increment: 1.0,
            decay: 0.5f64.powf(1.0 / MIX_HALF_LIFE),
            seen: HashSet::new(),
            seen_order: VecDeque::new(),
        }
    }

    /// Counts `task` once for `uid`; false when the uid was counted already.
    fn observe(&mut self, uid: &str, task: TaskShape) -> bool {
        if !self.seen.insert(uid.to_string()) {
            return false;
        }
        self.seen_order.push_back(uid.to_string());
        if self.seen_order.len() > MIX_SEEN
            && let Some(old) = self.seen_order.pop_front()
        {
            self.seen.remove(&old);
        }
        let task = quantize(task);
        if !self.weights.contains_key(&task) && self.weights.len() >= MIX_KINDS {
            let rarest = self
                .weights
                .iter()
                .min_by(|a, b| a.1.total_cmp(b.1))
                .map(|(k, _)| *k);
            if let Some(k) = rarest {
                self.weights.remove(&k);
            }
        }
        *self.weights.entry(task).or_insert(0.0) += self.increment;
        self.increment /= self.decay;
        if self.increment > 1e100 {
            for w in self.weights.values_mut() {
                *w /= self.increment;
            }
            self.increment = 1.0;
        }
        true
    }

    fn mix(&self) -> WorkloadMix {
        WorkloadMix::new(self.weights.iter().map(|(k, w)| (*k, *w)))
    }
}

/// Whole cores (rounded to nearest), shares to 10 milli-GPUs (1..=99 tenths stay at least 10).
fn quantize(task: TaskShape) -> TaskShape {
    TaskShape {
        cpu_milli: (task.cpu_milli.max(0).saturating_add(500) / 1000) * 1000,
        gpu: match task.gpu {
            GpuAsk::Share(d) => GpuAsk::Share((((d + 5) / 10) * 10).clamp(10, 990)),
            other => other,
        },
    }
}

/// Why an operator's workload mix (`--fragmentation-mix`) does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid workload mix entry {entry:?}: {reason} (expected WEIGHT:cpu=QUANTITY[,gpu=SHARE|CARDS] \
     entries separated by ';', e.g. 60:cpu=4,gpu=0.5;30:cpu=8,gpu=1;10:cpu=2)"
)]
pub struct MixParseError {
    pub entry: String,
    pub reason: String,
}

/// An operator's workload mix: `WEIGHT:cpu=Q[,gpu=G]` per task kind, `;` between kinds. `Q` is a
/// Kubernetes CPU quantity (`4`, `500m`); `G` below 1 is a share of one card (`0.5`, at most
/// three decimals), a whole number at least 1 is that many whole cards; no `gpu` is a CPU-only
/// kind. Weights are relative (normalized), positive and finite.
pub fn parse_mix(text: &str) -> Result<WorkloadMix, MixParseError> {
    let mut kinds = Vec::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let error = |reason: &str| MixParseError {
            entry: entry.to_string(),
            reason: reason.to_string(),
        };
        let (weight, fields) = entry
            .split_once(':')
            .ok_or_else(|| error("no WEIGHT: before the kind"))?;
        let weight: f64 = weight
            .trim()
            .parse()
            .ok()
            .filter(|w: &f64| w.is_finite() && *w > 0.0)
            .ok_or_else(|| error("the weight must be a positive number"))?;
        let (mut cpu, mut gpu) = (None, GpuAsk::None);
        for field in fields.split(',').map(str::trim) {
            match field.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
                Some(("cpu", v)) => {
                    let q = Quantity::parse(v).map_err(|_| error("cpu is not a quantity"))?;
                    let milli = i64::try_from(q.milli()).ok().filter(|m| *m >= 0);
                    cpu = Some(milli.ok_or_else(|| error("cpu out of range"))?);
                }
                Some(("gpu", v)) => {
                    let g: f64 = v
                        .parse()
                        .ok()
                        .filter(|g: &f64| g.is_finite() && *g > 0.0)
                        .ok_or_else(|| error("gpu must be a positive number"))?;
                    gpu = if g < 1.0 {
                        let milli = (g * 1000.0).round();
                        if (milli - g * 1000.0).abs() > 1e-6 {
                            return Err(error("a gpu share has at most three decimals"));
                        }
                        GpuAsk::Share(milli as i64)
                    } else if g.fract() == 0.0 && g <= 1024.0 {
                        GpuAsk::Whole(g as i64)
                    } else {
                        return Err(error("whole gpus must be a whole number"));
                    };
                }
                _ => return Err(error("expected cpu=... and gpu=...")),
            }
        }
        let cpu_milli = cpu.ok_or_else(|| error("no cpu=..."))?;
        kinds.push((TaskShape { cpu_milli, gpu }, weight));
    }
    if kinds.is_empty() {
        return Err(MixParseError {
            entry: text.to_string(),
            reason: "no task kind".into(),
        });
    }
    Ok(WorkloadMix::new(kinds))
}

/// The workload mix every verb scores against: learned from the pods seen (the learner behind
/// a lock) or fixed, and readable without a lock as last published.
#[derive(Debug)]
pub struct MixSource {
    /// `None` for a fixed mix.
    learner: Option<Mutex<MixLearner>>,
    current: ArcSwap<WorkloadMix>,
}

impl Default for MixSource {
    /// A learning source, empty until the first pod.
    fn default() -> Self {
        MixSource {
            learner: Some(Mutex::new(MixLearner::new())),
            current: ArcSwap::from_pointee(WorkloadMix::default()),
        }
    }
}

impl MixSource {
    /// A source fixed to `mix` (the operator's, or a test's): observing never changes it.
    pub fn fixed(mix: WorkloadMix) -> Self {
        MixSource {
            learner: None,
            current: ArcSwap::from_pointee(mix),
        }
    }

    /// Counts a pod's task kind once per UID, and publishes the learned mix when it has moved
    /// at least [`MIX_PUBLISH_SHIFT`] from the published one (a fixed source ignores it).
    pub fn observe(&self, uid: &str, task: TaskShape) {
        let Some(learner) = &self.learner else {
            return;
        };
        let mut learner = learner.lock();
        if learner.observe(uid, task) {
            let learned = learner.mix();
            // Under the learner's lock: no other publish can come between the read and the
            // store.
            let published = self.current.load();
            if published.is_empty() || learned.distance(&published) >= MIX_PUBLISH_SHIFT {
                self.current.store(Arc::new(learned));
            }
        }
    }

    /// The mix as last published.
    pub fn current(&self) -> Arc<WorkloadMix> {
        self.current.load_full()
    }

    /// True when observations change the mix (not [`Self::fixed`]).
    pub fn learns(&self) -> bool {
        self.learner.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn share(cpu: i64, d: i64) -> TaskShape {
        TaskShape {
            cpu_milli: cpu,
            gpu: GpuAsk::Share(d),
        }
    }
    fn whole(cpu: i64, k: i64) -> TaskShape {
        TaskShape {
            cpu_milli: cpu,
            gpu: GpuAsk::Whole(k),
        }
    }
    fn node(cpu: Option<i64>, gpus: &[i64]) -> NodeFree {
        NodeFree {
            cpu_milli: cpu,
            gpus: gpus.to_vec(),
        }
    }

    /// The paper's Figure 3 cases, by hand.
    #[test]
    fn fragment_of_one_task_kind() {
        let n = node(Some(8000), &[1000, 600, 300, 0]);
        // A 500 share uses the 1000 and 600 cards; the 300 card is fragment.
        assert_eq!(task_fragment(&n, &share(1000, 500)), 300);
        // One whole GPU fits; the partly used cards are fragment.
        assert_eq!(task_fragment(&n, &whole(1000, 1)), 900);
        // Two whole GPUs do not fit: everything free is fragment.
        assert_eq!(task_fragment(&n, &whole(1000, 2)), 1900);
        // Too little CPU: everything.
        assert_eq!(task_fragment(&n, &share(9000, 100)), 1900);
        // A CPU-only task uses no GPU: everything.
        assert_eq!(
            task_fragment(
                &n,
                &TaskShape {
                    cpu_milli: 0,
                    gpu: GpuAsk::None
                }
            ),
            1900
        );
        // A 700 share fits only the full card: the other two are fragment.
        assert_eq!(task_fragment(&n, &share(0, 700)), 900);
        // A share larger than any card's free part: everything.
        assert_eq!(
            task_fragment(&node(None, &[600, 300, 0]), &share(0, 700)),
            900
        );
        // CPU unknown never blocks.
        assert_eq!(task_fragment(&node(None, &[400]), &share(1 << 40, 300)), 0);
    }

    /// FGD's choice in the paper's example: a share goes to the card where what is left stays
    /// usable by the workload.
    #[test]
    fn a_share_goes_where_the_remainder_stays_usable() {
        let mix = WorkloadMix::new([(share(0, 500), 1.0)]);
        // 500 on the full card leaves 500 (usable) — on the 700 card it would leave 200 (not).
        let n = node(None, &[700, 1000]);
        let p = place(&mix, &n, &share(0, 500)).unwrap();
        assert_eq!(p.card, Some(1));
        // 700 left on card 0 is usable by a 500 share; card 1 goes 1000 -> 500: no fragment.
        assert_eq!(p.delta, 0.0);
        // A 200 share best-fits the 700 card (leaves 500, usable).
        let p = place(&mix, &n, &share(0, 200)).unwrap();
        assert_eq!(p.card, Some(0));
        // Nowhere to put 800.
        assert_eq!(place(&mix, &node(None, &[700, 300]), &share(0, 800)), None);
        assert_eq!(place(&mix, &node(None, &[1000, 300]), &whole(0, 2)), None);
    }

    #[test]
    fn the_learner_weights_recent_kinds_and_counts_a_pod_once() {
        let source = MixSource::default();
        assert!(source.current().is_empty());
        source.observe("a", share(3200, 470));
        source.observe("a", share(3200, 470));
        source.observe("b", whole(11_000, 1));
        let mix = source.current();
        assert_eq!(mix.kinds().len(), 2);
        // Quantized: 3.2 cores -> 3, 470 stays.
        assert_eq!(mix.kinds()[0].0, share(3000, 470));
        // "b" came later: it weighs a little more.
        assert!(mix.kinds()[1].1 > mix.kinds()[0].1);
        let sum: f64 = mix.kinds().iter().map(|k| k.1).sum();
        assert!((sum - 1.0).abs() < 1e-9);
        // Bounded: many kinds keep at most MIX_KINDS, the newest among them.
        for i in 0..(MIX_KINDS as i64 * 2) {
            source.observe(&format!("p{i}"), share(1000, 10 + 10 * (i % 98)));
        }
        let mix = source.current();
        assert_eq!(mix.kinds().len(), MIX_KINDS);
        // Absurd requests are counted, not overflowed.
        source.observe("huge", share(i64::MAX, 500));
        // A fixed source ignores observations.
        let fixed = MixSource::fixed(WorkloadMix::new([(share(0, 500), 1.0)]));
        fixed.observe("x", whole(0, 8));
        assert_eq!(fixed.current().kinds().len(), 1);
        assert!(!fixed.learns() && source.learns());
    }

    /// The learned mix is published when it has moved at least `MIX_PUBLISH_SHIFT` from the
    /// published one, and only then: a steady workload keeps one mix (one id), a change of
    /// workload replaces it within a few dozen pods.
    #[test]
    fn the_learned_mix_is_published_when_it_moves() {
        let source = MixSource::default();
        for i in 0..3_000 {
            source.observe(&format!("s{i}"), share(4000, 500));
        }
        let steady = source.current();
        assert_eq!(steady.kinds().len(), 1);
        for i in 3_000..6_000 {
            source.observe(&format!("s{i}"), share(4000, 500));
        }
        assert_eq!(
            source.current().id(),
            steady.id(),
            "nothing moved: same mix"
        );
        // A second kind arrives: each pod moves the learned mix by ~1/2,900, so the first
        // does not publish and a few dozen do.
        source.observe("w0", whole(8000, 1));
        assert_eq!(source.current().id(), steady.id());
        let mut published_after = None;
        for i in 1..200 {
            source.observe(&format!("w{i}"), whole(8000, 1));
            if source.current().id() != steady.id() {
                published_after = Some(i + 1);
                break;
            }
        }
        let n = published_after.expect("a new kind is published");
        assert!(
            (20..=40).contains(&n),
            "published after {n} pods of the new kind"
        );
        let moved = source.current();
        assert!(moved.distance(&steady) >= MIX_PUBLISH_SHIFT);
        assert_eq!(moved.kinds().len(), 2);
    }

    proptest! {
        /// The distance from its definition: over every kind of either mix, half the sum of
        /// the absolute differences of the shares (a kind missing from a mix has share 0);
        /// symmetric, 0 from itself, at most 1.
        #[test]
        fn distance_is_total_variation(
            a in proptest::collection::btree_map((0i64..4, 1i64..4), 0.01f64..10.0, 1..6),
            b in proptest::collection::btree_map((0i64..4, 1i64..4), 0.01f64..10.0, 1..6),
        ) {
            let kind = |(c, g): (i64, i64)| whole(c * 1000, g);
            let ma = WorkloadMix::new(a.iter().map(|(k, w)| (kind(*k), *w)));
            let mb = WorkloadMix::new(b.iter().map(|(k, w)| (kind(*k), *w)));
            let (sa, sb): (f64, f64) = (a.values().sum(), b.values().sum());
            let mut keys: Vec<_> = a.keys().chain(b.keys()).copied().collect();
            keys.sort_unstable();
            keys.dedup();
            let oracle = keys
                .iter()
                .map(|k| (a.get(k).map_or(0.0, |w| w / sa) - b.get(k).map_or(0.0, |w| w / sb)).abs())
                .sum::<f64>()
                / 2.0;
            prop_assert!((ma.distance(&mb) - oracle).abs() < 1e-9);
            prop_assert!((mb.distance(&ma) - oracle).abs() < 1e-9);
            prop_assert!(ma.distance(&ma).abs() < 1e-12);
            prop_assert!(oracle <= 1.0 + 1e-9);
        }
    }

    /// The measure from its definition, card by card, written without `task_fragment`: each
    /// free milli-GPU is fragment unless the task can run on the node and could take a slice
    /// of that card.
    fn oracle_fragment(cpu: Option<i64>, gpus: &[i64], task: &TaskShape) -> i64 {
        let runs = cpu.is_none_or(|c| c >= task.cpu_milli)
            && match task.gpu {
                GpuAsk::None => false,
                GpuAsk::Share(d) => gpus.iter().any(|g| *g >= d),
                GpuAsk::Whole(k) => gpus.iter().filter(|g| **g == 1000).count() as i64 >= k,
            };
        let mut fragment = 0;
        for g in gpus {
            let usable_card = match task.gpu {
                GpuAsk::None => false,
                GpuAsk::Share(d) => *g >= d,
                GpuAsk::Whole(_) => *g == 1000,
            };
            if !(runs && usable_card) {
                fragment += g;
            }
        }
        fragment
    }

    fn arb_task() -> impl Strategy<Value = TaskShape> {
        (
            0i64..16_000,
            prop_oneof![
                Just(GpuAsk::None),
                (1i64..1000).prop_map(GpuAsk::Share),
                (1i64..=8).prop_map(GpuAsk::Whole)
            ],
        )
            .prop_map(|(cpu_milli, gpu)| TaskShape { cpu_milli, gpu })
    }

    fn arb_node() -> impl Strategy<Value = NodeFree> {
        (
            proptest::option::of(0i64..32_000),
            proptest::collection::vec(prop_oneof![Just(0i64), Just(1000i64), 0i64..=1000], 0..=8),
        )
            .prop_map(|(cpu_milli, gpus)| NodeFree { cpu_milli, gpus })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The measure agrees with its definition card by card.
        #[test]
        fn fragment_matches_the_definition(n in arb_node(), t in arb_task()) {
            prop_assert_eq!(task_fragment(&n, &t), oracle_fragment(n.cpu_milli, &n.gpus, &t));
        }

        /// `place` is the brute-force minimum over every card (shares) of the oracle's
        /// workload fragmentation after minus before; it never picks a card that cannot hold
        /// the share, and it finds a placement exactly when one exists.
        #[test]
        fn place_is_the_least_growth_over_every_card(
            n in arb_node(),
            pod in arb_task(),
            kinds in proptest::collection::vec((arb_task(), 1u32..100), 1..6),
        ) {
            let mix = WorkloadMix::new(kinds.iter().map(|(k, w)| (*k, f64::from(*w))));
            let total: f64 = kinds.iter().map(|(_, w)| f64::from(*w)).sum();
            let oracle = |cpu: Option<i64>, gpus: &[i64]| -> f64 {
                kinds.iter().map(|(k, w)| f64::from(*w) / total * oracle_fragment(cpu, gpus, k) as f64).sum()
            };
            let cpu_after = n.cpu_milli.map(|c| c - pod.cpu_milli.max(0));
            let before = oracle(n.cpu_milli, &n.gpus);
            let mut options: Vec<(f64, Option<usize>)> = Vec::new();
            match pod.gpu {
                GpuAsk::None => options.push((oracle(cpu_after, &n.gpus) - before, None)),
                GpuAsk::Whole(k) => {
                    let mut after = n.gpus.clone();
                    let mut left = k;
                    for g in after.iter_mut() {
                        if left > 0 && *g == 1000 { *g = 0; left -= 1; }
                    }
                    if left == 0 { options.push((oracle(cpu_after, &after) - before, None)); }
                }
                GpuAsk::Share(d) => {
                    for i in 0..n.gpus.len() {
                        if n.gpus[i] >= d {
                            let mut after = n.gpus.clone();
                            after[i] -= d;
                            options.push((oracle(cpu_after, &after) - before, Some(i)));
                        }
                    }
                }
            }
            let got = place(&mix, &n, &pod);
            prop_assert_eq!(got.is_some(), !options.is_empty());
            if let Some(p) = got {
                let best = options.iter().map(|o| o.0).fold(f64::INFINITY, f64::min);
                prop_assert!((p.delta - best).abs() < 1e-6, "delta {} best {}", p.delta, best);
                if let (GpuAsk::Share(d), Some(i)) = (pod.gpu, p.card) {
                    prop_assert!(n.gpus[i] >= d);
                    // The lowest card among the best.
                    let first = options.iter().find(|o| (o.0 - best).abs() < 1e-6).and_then(|o| o.1);
                    prop_assert_eq!(Some(i), first);
                }
            }
        }
    }

    #[test]
    fn an_operators_mix_parses_into_its_kinds_and_bad_ones_name_the_entry() {
        let mix = parse_mix("60:cpu=4,gpu=0.5; 30:cpu=8,gpu=1;10:cpu=500m").unwrap();
        let kinds: Vec<(TaskShape, f64)> = mix.kinds().to_vec();
        let shape = |cpu_milli, gpu| TaskShape { cpu_milli, gpu };
        assert_eq!(kinds.len(), 3);
        assert!(
            kinds.contains(&(shape(4000, GpuAsk::Share(500)), 0.6)),
            "{kinds:?}"
        );
        assert!(
            kinds.contains(&(shape(8000, GpuAsk::Whole(1)), 0.3)),
            "{kinds:?}"
        );
        assert!(
            kinds.contains(&(shape(500, GpuAsk::None), 0.1)),
            "{kinds:?}"
        );
        for (bad, says) in [
            ("", "no task kind"),
            ("cpu=4", "no WEIGHT"),
            ("0:cpu=4", "positive"),
            ("x:cpu=4", "positive"),
            ("1:gpu=1", "no cpu"),
            ("1:cpu=four", "not a quantity"),
            ("1:cpu=4,gpu=0.0005", "three decimals"),
            ("1:cpu=4,gpu=1.5", "whole number"),
            ("1:cpu=4,mem=1", "expected cpu"),
        ] {
            let e = parse_mix(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(e.contains("e.g. 60:cpu=4"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_fixed_mix_is_the_operators_and_only_with_fragmentation() {
        use crate::placement::device::score::DeviceScoring;
        let scoring = DeviceScoring::from_flags("fragmentation", None)
            .unwrap()
            .with_fixed_mix(Some("1:cpu=4,gpu=0.5"))
            .unwrap();
        let before = scoring.mix.current();
        scoring.mix.observe(
            "uid-1",
            TaskShape {
                cpu_milli: 8000,
                gpu: GpuAsk::Whole(2),
            },
        );
        assert_eq!(
            *scoring.mix.current(),
            *before,
            "a fixed mix learns nothing"
        );
        let e = DeviceScoring::from_flags("least-allocated", None)
            .unwrap()
            .with_fixed_mix(Some("1:cpu=4"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("only with --score-strategy fragmentation"),
            "{e}"
        );
        // Empty is no mix (the chart's default).
        assert!(
            DeviceScoring::from_flags("least-allocated", None)
                .unwrap()
                .with_fixed_mix(Some(""))
                .is_ok()
        );
    }
}
