//! Device scoring, as koordinator's `resourceAllocationScorer`: LeastAllocated (spread, the
//! default) or MostAllocated (bin-pack) over weighted device resources, per device (used to rank
//! minors during allocation) and per node (the extender's prioritize score).
//!
//! Owns the formulas and their configuration parsing. Pure: reads a ledger view, never mutates.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::fragmentation::MixSource;
use super::inventory::DeviceHoldings;
use crate::model::device::{
    DeviceResources, FPGA, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA, canonical_resource_name,
};
use crate::model::quantity::Quantity;

use super::request::PodDeviceRequest;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScoringStrategy {
    /// Prefer devices/nodes with the most free capacity left after placement.
    #[default]
    LeastAllocated,
    /// Prefer devices/nodes that end up most used (bin-pack).
    MostAllocated,
    /// Prefer the GPU and the node where the workload's expected GPU fragmentation grows
    /// least (FGD, [`super::fragmentation`]); other device types score as LeastAllocated.
    Fragmentation,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceScoringError {
    #[error(
        "unknown scoring strategy {0:?}: expected least-allocated, most-allocated or fragmentation"
    )]
    Strategy(String),
    #[error("invalid resource weight {entry:?}: {reason}")]
    Weight { entry: String, reason: String },
    #[error("resource weights must name at least one resource (name=weight,name=weight)")]
    NoWeights,
    #[error(transparent)]
    Mix(#[from] super::fragmentation::MixParseError),
    #[error(
        "--fragmentation-mix applies only with --score-strategy fragmentation (the strategy is {0})"
    )]
    MixWithoutFragmentation(String),
}

impl FromStr for ScoringStrategy {
    type Err = DeviceScoringError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "least-allocated" | "LeastAllocated" => Ok(Self::LeastAllocated),
            "most-allocated" | "MostAllocated" => Ok(Self::MostAllocated),
            "fragmentation" | "Fragmentation" => Ok(Self::Fragmentation),
            other => Err(DeviceScoringError::Strategy(other.to_string())),
        }
    }
}

impl fmt::Display for ScoringStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::LeastAllocated => "least-allocated",
            Self::MostAllocated => "most-allocated",
            Self::Fragmentation => "fragmentation",
        })
    }
}

/// Resources that can be scored: the device dimensions koordinator scores.
const SCORABLE: [&str; 5] = [GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA, FPGA];

/// Resource name -> weight (1..=100), parsed from `name=weight,name=weight`. Bare names such as
/// `gpu-memory` mean `koordinator.sh/gpu-memory`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceWeights(pub BTreeMap<String, i64>);

impl Default for ResourceWeights {
    /// koordinator's defaults since #2507: gpu-core is deliberately not scored.
    fn default() -> Self {
        ResourceWeights(
            [GPU_MEMORY_RATIO, GPU_MEMORY, RDMA, FPGA]
                .into_iter()
                .map(|n| (n.to_string(), 1))
                .collect(),
        )
    }
}

impl FromStr for ResourceWeights {
    type Err = DeviceScoringError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = BTreeMap::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |reason: String| DeviceScoringError::Weight {
                entry: entry.to_string(),
                reason,
            };
            let (name, weight) = entry
                .split_once('=')
                .ok_or_else(|| bad("expected name=weight".into()))?;
            let name = name.trim();
            let qualified = if name.contains('/') {
                canonical_resource_name(name).to_string()
            } else {
                format!("koordinator.sh/{name}")
            };
            if !SCORABLE.contains(&qualified.as_str()) {
                return Err(bad(format!(
                    "{qualified} is not a scorable device resource (one of {})",
                    SCORABLE.join(", ")
                )));
            }
            let w: i64 = weight
                .trim()
                .parse()
                .map_err(|_| bad(format!("weight {:?} is not an integer", weight.trim())))?;
            if !(1..=100).contains(&w) {
                return Err(bad(format!("weight {w} must be between 1 and 100")));
            }
            out.insert(qualified, w);
        }
        if out.is_empty() {
            return Err(DeviceScoringError::NoWeights);
        }
        Ok(ResourceWeights(out))
    }
}

/// How devices and nodes are scored; shared by allocation (minor ranking) and prioritize.
#[derive(Clone, Debug, Default)]
pub struct DeviceScoring {
    pub strategy: ScoringStrategy,
    pub weights: ResourceWeights,
    /// The workload the fragmentation strategy scores against (learned from the pods the
    /// filter sees, unless fixed); unused by the other strategies.
    pub mix: Arc<MixSource>,
}

/// Two scorings are equal when they are configured alike: the mix is state, not configuration.
impl PartialEq for DeviceScoring {
    fn eq(&self, other: &Self) -> bool {
        self.strategy == other.strategy && self.weights == other.weights
    }
}

impl Eq for DeviceScoring {}

impl DeviceScoring {
    /// From CLI flag values; `weights: None` keeps the defaults.
    pub fn from_flags(strategy: &str, weights: Option<&str>) -> Result<Self, DeviceScoringError> {
        Ok(DeviceScoring {
            strategy: strategy.parse()?,
            weights: match weights {
                Some(w) => w.parse()?,
                None => ResourceWeights::default(),
            },
            mix: Arc::default(),
        })
    }

    /// The operator's workload mix (`--fragmentation-mix`) in place of the learned one:
    /// observing pods then changes nothing. An error when the strategy is not fragmentation
    /// (the mix would silently do nothing).
    pub fn with_fixed_mix(mut self, mix: Option<&str>) -> Result<Self, DeviceScoringError> {
        let Some(text) = mix.filter(|t| !t.trim().is_empty()) else {
            return Ok(self);
        };
        if self.strategy != ScoringStrategy::Fragmentation {
            return Err(DeviceScoringError::MixWithoutFragmentation(format!(
                "{:?}",
                self.strategy
            )));
        }
        let mix = super::fragmentation::parse_mix(text)?;
        self.mix = Arc::new(super::fragmentation::MixSource::fixed(mix));
        Ok(self)
    }

    /// `scoreDevice(request, total, free)`: weighted mean over scored resources the device has,
    /// where requested = (total − free) + request. Also used for a node's summed totals.
    pub fn score(
        &self,
        request: &DeviceResources,
        total: &DeviceResources,
        free: &DeviceResources,
    ) -> i64 {
        let v = |m: &DeviceResources, n: &str| {
            i128::from(m.get(n).copied().unwrap_or(Quantity::ZERO).value())
        };
        let (mut sum, mut weight_sum) = (0i128, 0i128);
        for (name, w) in &self.weights.0 {
            let capacity = v(total, name);
            if capacity <= 0 {
                continue;
            }
            let f = v(free, name);
            let used = if f <= capacity {
                capacity - f.max(0)
            } else {
                0
            };
            let requested = used + v(request, name).max(0);
            // Fragmentation ranks GPUs and nodes by its own measure (the allocator and the
            // node scorer ask it); where it is asked this formula, it spreads.
            let s = match self.strategy {
                ScoringStrategy::LeastAllocated | ScoringStrategy::Fragmentation
                    if requested > capacity =>
                {
                    0
                }
                ScoringStrategy::LeastAllocated | ScoringStrategy::Fragmentation => {
                    (capacity - requested) * 100 / capacity
                }
                ScoringStrategy::MostAllocated => requested.min(capacity) * 100 / capacity,
            };
            sum += s * i128::from(*w);
            weight_sum += i128::from(*w);
        }
        if weight_sum == 0 {
            return 0;
        }
        (sum / weight_sum).clamp(0, 100) as i64
    }
}

/// A node's device score in 0..=100: per requested type, the device formula over the summed
/// totals and free of that type's devices with the per-device request; averaged over types
/// (koordinator sums them and normalizes across nodes; for one pod every node sees the same
/// types, so the ranking is the same). A node without a Device object scores 0.
pub fn score_node(
    ledger: &(impl DeviceHoldings + ?Sized),
    req: &PodDeviceRequest,
    cfg: &DeviceScoring,
) -> i64 {
    let Some(devices) = ledger.devices() else {
        return 0;
    };
    // What `ledger.free(&[])` would say per minor, summed, without building the per-minor map:
    // prioritize runs this for every candidate node, and that map's cloned resource names were
    // most of its cost. Free per minor = max(total − used, 0) per name of the total; everything
    // is used while a malformed entry blocks the node.
    let blocked = ledger.blocked(&[]);
    let mut sum = 0i64;
    let mut n = 0i64;
    for (t, r) in &req.types {
        let used = ledger.used().get(t);
        let mut total: BTreeMap<&str, Quantity> = BTreeMap::new();
        let mut free_sum: BTreeMap<&str, Quantity> = BTreeMap::new();
        for slot in devices.slots(t) {
            let slot_used = used.and_then(|m| m.get(&slot.minor));
            for (name, q) in &slot.total {
                let e = total.entry(name.as_str()).or_insert(Quantity::ZERO);
                *e = *e + *q;
                if !blocked {
                    let u = slot_used
                        .and_then(|u| u.get(name))
                        .map_or(0, Quantity::milli);
                    let e = free_sum.entry(name.as_str()).or_insert(Quantity::ZERO);
                    *e = *e + Quantity::from_milli((q.milli() - u).max(0));
                }
            }
        }
        let owned = |m: BTreeMap<&str, Quantity>| -> DeviceResources {
            m.into_iter()
                .filter(|(_, q)| !q.is_zero())
                .map(|(k, q)| (k.to_string(), q))
                .collect()
        };
        sum += cfg.score(&r.per_device, &owned(total), &owned(free_sum));
        n += 1;
    }
    if n == 0 { 0 } else { (sum / n).clamp(0, 100) }
}

/// Scales node scores to the extender range 0..=10: the best node gets 10 (kube-scheduler then
/// multiplies by weight × 10). All-zero stays zero; negatives count as zero.
pub fn normalize_scores(scores: &[i64]) -> Vec<i64> {
    let max = scores.iter().copied().max().unwrap_or(0);
    if max <= 0 {
        return vec![0; scores.len()];
    }
    scores
        .iter()
        .map(|s| (i128::from((*s).max(0)) * 10 / i128::from(max)) as i64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::devices::DeviceLedger;

    fn res(pairs: &[(&str, &str)]) -> DeviceResources {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity::parse(v).unwrap()))
            .collect()
    }

    #[test]
    fn parses_flags() {
        let c = DeviceScoring::from_flags(
            "most-allocated",
            Some("gpu-memory=2, koordinator.sh/rdma=1,kubernetes.io/fpga=3"),
        )
        .unwrap();
        assert_eq!(c.strategy, ScoringStrategy::MostAllocated);
        assert_eq!(c.weights.0[GPU_MEMORY], 2);
        assert_eq!(c.weights.0[FPGA], 3);
        assert_eq!(
            DeviceScoring::from_flags("least-allocated", None).unwrap(),
            DeviceScoring::default()
        );
        for (s, w, needle) in [
            ("spread", None, "spread"),
            ("least-allocated", Some("gpu-memory"), "name=weight"),
            ("least-allocated", Some("cpu=1"), "cpu"),
            ("least-allocated", Some("rdma=0"), "between 1 and 100"),
            ("least-allocated", Some("rdma=x"), "not an integer"),
            ("least-allocated", Some(""), "at least one"),
        ] {
            let e = DeviceScoring::from_flags(s, w).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn device_formulas() {
        let total = res(&[
            (GPU_MEMORY_RATIO, "100"),
            (GPU_MEMORY, "80Gi"),
            (GPU_CORE, "100"),
        ]);
        let free = res(&[
            (GPU_MEMORY_RATIO, "50"),
            (GPU_MEMORY, "40Gi"),
            (GPU_CORE, "100"),
        ]);
        let req = res(&[(GPU_MEMORY_RATIO, "25"), (GPU_MEMORY, "20Gi")]);
        let least = DeviceScoring::default();
        assert_eq!(least.score(&req, &total, &free), 25);
        assert_eq!(least.score(&req, &total, &total), 75);
        let most = DeviceScoring {
            strategy: ScoringStrategy::MostAllocated,
            ..Default::default()
        };
        assert_eq!(most.score(&req, &total, &free), 75);
        // Over capacity scores 0 for least-allocated, 100 for most-allocated.
        let big = res(&[(GPU_MEMORY_RATIO, "80"), (GPU_MEMORY, "60Gi")]);
        assert_eq!(least.score(&big, &total, &free), 0);
        assert_eq!(most.score(&big, &total, &free), 100);
        assert_eq!(
            least.score(&req, &DeviceResources::new(), &DeviceResources::new()),
            0
        );
    }

    #[test]
    fn normalizes_to_extender_range() {
        assert_eq!(normalize_scores(&[50, 100, 0, 25]), vec![5, 10, 0, 2]);
        assert_eq!(normalize_scores(&[0, 0]), vec![0, 0]);
        assert_eq!(normalize_scores(&[-5, 3]), vec![0, 10]);
        assert!(normalize_scores(&[]).is_empty());
    }

    #[test]
    fn node_scores_prefer_emptier_nodes_by_default() {
        use crate::cluster::devices::{DeviceSlot, EntryState, NodeDevices, RecordedAllocation};
        use crate::model::device::{DeviceAllocation, DeviceAllocations, DeviceType};
        use crate::model::ids::PodUid;
        use crate::placement::device::request::parse_device_request;

        let node = || {
            let mut l = DeviceLedger::new();
            l.set_devices(Some(NodeDevices::from_slots((0..2).map(|m| {
                (
                    DeviceType::Gpu,
                    DeviceSlot {
                        minor: m,
                        id: String::new(),
                        healthy: true,
                        total: res(&[
                            (GPU_CORE, "100"),
                            (GPU_MEMORY, "80Gi"),
                            (GPU_MEMORY_RATIO, "100"),
                        ]),
                        topology: None,
                        ..Default::default()
                    },
                )
            }))));
            l
        };
        let empty = node();
        let mut busy = node();
        busy.record(
            PodUid::new("p"),
            RecordedAllocation::Allocated(DeviceAllocations(BTreeMap::from([(
                DeviceType::Gpu,
                vec![DeviceAllocation {
                    minor: 0,
                    resources: res(&[(GPU_MEMORY, "40Gi"), (GPU_MEMORY_RATIO, "50")]),
                    id: String::new(),
                    extension: None,
                }],
            )]))),
            EntryState::Committed,
        );
        let req = parse_device_request(&res(&[(GPU_MEMORY_RATIO, "20")]), None)
            .unwrap()
            .unwrap();
        let least = DeviceScoring::default();
        let most = DeviceScoring {
            strategy: ScoringStrategy::MostAllocated,
            ..Default::default()
        };
        // ratio: (200 - 20) / 200 = 90; memory: 160Gi free of 160Gi -> 100; mean 95.
        assert_eq!(score_node(&empty, &req, &least), 95);
        // ratio: (200 - 70) / 200 = 65; memory: 120/160 = 75; mean 70.
        assert_eq!(score_node(&busy, &req, &least), 70);
        assert!(score_node(&busy, &req, &most) > score_node(&empty, &req, &most));
        assert_eq!(score_node(&DeviceLedger::new(), &req, &least), 0);
        assert_eq!(normalize_scores(&[95, 70]), vec![10, 7]);

        // score_node sums free per minor without `DeviceLedger::free`; it must agree with it,
        // including over-use (clamped at zero), minors no longer present and malformed entries.
        let reference = |ledger: &DeviceLedger, cfg: &DeviceScoring| -> i64 {
            let Some(devices) = ledger.devices() else {
                return 0;
            };
            let free = ledger.free(&[]);
            let (mut sum, mut n) = (0i64, 0i64);
            for (t, r) in &req.types {
                let mut total = DeviceResources::new();
                let mut free_sum = DeviceResources::new();
                for slot in devices.slots(t) {
                    crate::placement::device::inventory::add_resources(&mut total, &slot.total);
                    if let Some(f) = free.get(t).and_then(|m| m.get(&slot.minor)) {
                        crate::placement::device::inventory::add_resources(&mut free_sum, f);
                    }
                }
                sum += cfg.score(&r.per_device, &total, &free_sum);
                n += 1;
            }
            if n == 0 { 0 } else { (sum / n).clamp(0, 100) }
        };
        let alloc = |minor: i32, pairs: &[(&str, &str)]| {
            RecordedAllocation::Allocated(DeviceAllocations(BTreeMap::from([(
                DeviceType::Gpu,
                vec![DeviceAllocation {
                    minor,
                    resources: res(pairs),
                    id: String::new(),
                    extension: None,
                }],
            )])))
        };
        let mut over = busy.clone();
        over.record(
            PodUid::new("q"),
            alloc(0, &[(GPU_CORE, "100"), (GPU_MEMORY, "80Gi")]),
            EntryState::Committed,
        );
        over.record(
            PodUid::new("gone"),
            alloc(7, &[(GPU_CORE, "100")]),
            EntryState::Committed,
        );
        let mut malformed = busy.clone();
        malformed.record(
            PodUid::new("m"),
            RecordedAllocation::Malformed {
                reason: "bad".into(),
            },
            EntryState::Committed,
        );
        for ledger in [&empty, &busy, &over, &malformed, &DeviceLedger::new()] {
            for cfg in [&least, &most] {
                assert_eq!(score_node(ledger, &req, cfg), reference(ledger, cfg));
            }
        }
    }
}
