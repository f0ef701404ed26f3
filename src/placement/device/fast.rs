//! Filter and prioritize at cluster scale: the same answers as [`super::allocate::fit_with`]'s
//! feasibility and [`super::score::score_node`], computed on a node's fixed-size
//! [`DeviceIndexRef`] (plain slices) instead of string-keyed resource maps.
//!
//! Filter and prioritize visit every candidate node (5,000 in the budget) for every pod, while
//! bind allocates on one. So bind keeps the full allocator, which also chooses the minors, and
//! the read-only verbs ask only "does it fit" and "how well": whether at least `count` devices
//! of each type can each hold the per-device request, which is exactly when the topology-tree
//! and default allocators succeed (both take any `count` capable devices; topology only ranks
//! them). Requests this module cannot answer exactly (joint allocation, resource names outside
//! [`INDEX_DIMS`]) get no [`FastRequest`], and nodes whose devices cannot be indexed get no
//! index: callers use the full allocator for both. A property test holds the two paths equal.

use crate::model::device::{DeviceType, GPU_MEMORY, GPU_MEMORY_RATIO};
use crate::model::quantity::Quantity;

use super::allocate::{FitError, insufficient};
use super::index::{DeviceIndexRef, DimVec, INDEX_DIMS, TypeSums, dim_of};
use super::request::PodDeviceRequest;
use super::score::{DeviceScoring, ScoringStrategy};
use crate::placement::arith::div;
use crate::placement::cpu::{MAX_NUMA_NODES, NumaMask};

const NDIMS: usize = INDEX_DIMS.len();

/// Per-dimension milli-units of a request (128-bit: a request is checked, never indexed).
type NeedVec = [i128; NDIMS];

/// One device type's request in fixed-size form.
#[derive(Clone, Debug)]
struct TypeRequest {
    device_type: DeviceType,
    per_device: NeedVec,
    has: [bool; NDIMS],
    /// `per_device` in whole units rounded up (the score's "requested").
    per_device_units: NeedVec,
    count: usize,
}

/// Device types one request can name (gpu, rdma, fpga, and one more for safety); a request
/// with more goes to the full allocator.
const MAX_TYPES: usize = 4;

/// A pod's device request prepared for the fast path, once per verb call.
#[derive(Clone, Debug)]
pub struct FastRequest {
    types: Vec<TypeRequest>,
    /// (dimension, weight) of every scoring weight that names an indexed dimension.
    weights: Vec<(usize, i128)>,
    strategy: ScoringStrategy,
}

impl FastRequest {
    /// `None` when the request needs the full allocator (joint allocation, or resource names
    /// the index does not carry).
    pub fn new(req: &PodDeviceRequest, cfg: &DeviceScoring) -> Option<Self> {
        // Hints (device selectors, VFs) are the full allocator's.
        if req.joint.is_some() || !req.hints.is_empty() || req.types.len() > MAX_TYPES {
            return None;
        }
        let mut types = Vec::with_capacity(req.types.len());
        for (t, r) in &req.types {
            let mut per_device = [0i128; NDIMS];
            let mut has = [false; NDIMS];
            for (name, q) in &r.per_device {
                let d = dim_of(name)?;
                per_device[d] = q.milli();
                has[d] = true;
            }
            types.push(TypeRequest {
                device_type: t.clone(),
                per_device,
                has,
                per_device_units: per_device.map(units),
                count: r.count,
            });
        }
        let weights = cfg
            .weights
            .0
            .iter()
            .filter_map(|(name, w)| dim_of(name).map(|d| (d, i128::from(*w))))
            .collect();
        Some(FastRequest {
            types,
            weights,
            strategy: cfg.strategy,
        })
    }
}

/// Whole units rounded up, as `Quantity::value()`: in 64-bit hardware division whenever the
/// value fits (128-bit division is a slow library call).
#[inline]
fn units(milli: i128) -> i128 {
    match i64::try_from(milli) {
        Ok(m) => i128::from(m.div_euclid(1000) + i64::from(m.rem_euclid(1000) != 0)),
        Err(_) => Quantity::from_milli(milli).value() as i128,
    }
}

const MEM: usize = 1;
const RATIO: usize = 2;

/// What one device must hold for `r`, in filled form for a GPU with `total_mem` milli-bytes of
/// memory (both memory dimensions, converted with that size, as `fill_gpu_memory` records
/// them); `None` when no device of that size can hold it (`capable_of` is false).
#[inline]
fn need_for(gpu: bool, r: &TypeRequest, total_mem: i64) -> Option<Need> {
    let mut need = r.per_device;
    let mut has = r.has;
    if gpu {
        debug_assert_eq!(INDEX_DIMS[MEM], GPU_MEMORY);
        debug_assert_eq!(INDEX_DIMS[RATIO], GPU_MEMORY_RATIO);
        // `fill_gpu_memory` reads the total with `value()` and fails without a positive one.
        let total = units(i128::from(total_mem));
        if total <= 0 {
            return None;
        }
        match (has[MEM], has[RATIO]) {
            (true, false) => {
                let bytes = units(need[MEM]) as i64;
                let ratio = (bytes as f64 / total as f64 * 100.0) as i64;
                need[RATIO] = i128::from(ratio) * 1000;
                has[RATIO] = true;
            }
            (false, true) => {
                let ratio = units(need[RATIO]);
                let bytes = match (i64::try_from(ratio), i64::try_from(total)) {
                    (Ok(r), Ok(t)) => match r.checked_mul(t) {
                        Some(p) => i128::from(p / 100),
                        None => ratio * total / 100,
                    },
                    _ => ratio * total / 100,
                };
                if i64::try_from(bytes).is_err() {
                    return None;
                }
                need[MEM] = bytes * 1000;
                has[MEM] = true;
            }
            _ => {}
        }
    }
    Some((need, has))
}

/// What one device must hold, and in which dimensions (see [`need_for`]).
type Need = (NeedVec, [bool; NDIMS]);

/// Whether `avail` (a device's total or free) covers `need` in every requested dimension.
#[inline]
fn fits(need: &NeedVec, has: &[bool; NDIMS], avail: &DimVec) -> bool {
    (0..NDIMS).all(|d| !has[d] || i128::from(avail[d]) >= need[d])
}

/// Does the pod fit this node's devices? Same answer (and reason) as `fit_with(.., &[], ..)`
/// on a node with a `Device` object.
pub fn feasible(index: DeviceIndexRef<'_>, req: &FastRequest) -> Result<(), FitError> {
    feasible_within(index, req, None)
}

/// The checks of [`feasible`] no free capacity changes: too few devices could ever hold the
/// request (unresolvable), or a malformed holding blocks the node.
pub fn structure(index: DeviceIndexRef<'_>, req: &FastRequest) -> Result<(), FitError> {
    capacity(index, req).base
}

/// [`feasible`] using only devices on the NUMA nodes of `allowed` (devices of unknown NUMA
/// node always count): the same answer as `fit_on_numa(.., &[], .., allowed)`, which GPU + CPU
/// alignment asks once per NUMA hint. The structural checks still look at every device.
pub fn feasible_within(
    index: DeviceIndexRef<'_>,
    req: &FastRequest,
    allowed: Option<NumaMask>,
) -> Result<(), FitError> {
    capacity(index, req).within(req, allowed)
}

/// A node's answer to [`feasible_within`] for every NUMA mask at once, from one pass over its
/// devices: GPU + CPU alignment asks one mask per NUMA hint, and every mask's answer is a sum
/// of per-NUMA counts.
#[derive(Clone, Debug)]
pub struct Capacity {
    /// The structural or blocked error, which no mask changes.
    base: Result<(), FitError>,
    /// Per request type: devices that can hold one unit now, in all ...
    free: [u16; MAX_TYPES],
    /// ... of unknown NUMA node (every mask admits them) ...
    anywhere: [u16; MAX_TYPES],
    /// ... and per NUMA id a mask can name.
    by_numa: [[u16; MAX_NUMA_NODES]; MAX_TYPES],
}

impl Capacity {
    /// `feasible_within(index, req, allowed)` for the node and request this was built from.
    pub fn within(&self, req: &FastRequest, allowed: Option<NumaMask>) -> Result<(), FitError> {
        self.base.clone()?;
        for (i, r) in req.types.iter().enumerate() {
            let n = match allowed {
                None => self.free[i],
                Some(mask) => (0..MAX_NUMA_NODES)
                    .filter(|id| mask.contains(*id as u32))
                    .map(|id| self.by_numa[i][id])
                    .fold(self.anywhere[i], u16::saturating_add),
            };
            if usize::from(n) < r.count {
                return Err(insufficient(&r.device_type, false));
            }
        }
        Ok(())
    }
}

/// One pass per type counts both the devices that could hold one request unit when empty
/// (structural, `fit_on_numa`'s first check) and those that can now, per NUMA node.
pub fn capacity(index: DeviceIndexRef<'_>, req: &FastRequest) -> Capacity {
    let mut out = Capacity {
        base: Ok(()),
        free: [0; MAX_TYPES],
        anywhere: [0; MAX_TYPES],
        by_numa: [[0; MAX_NUMA_NODES]; MAX_TYPES],
    };
    for (i, r) in req.types.iter().enumerate() {
        let gpu = r.device_type == DeviceType::Gpu;
        // The need depends on a device only through its memory size (GPUs), which the
        // devices of a node nearly always share: computed once per distinct size.
        let mut memo: Option<(i64, Option<Need>)> = None;
        let mut need_of = |total_mem: i64| match memo {
            Some((size, need)) if size == total_mem || !gpu => need,
            _ => {
                let need = need_for(gpu, r, total_mem);
                memo = Some((total_mem, need));
                need
            }
        };
        let mut capable_total = 0usize;
        for g in index.totals(&r.device_type) {
            if let Some((need, has)) = need_of(g.total_mem)
                && fits(&need, &has, &g.dims)
            {
                capable_total += usize::from(g.count);
            }
        }
        if capable_total < r.count {
            out.base = Err(insufficient(&r.device_type, true));
            return out;
        }
        for g in index.frees(&r.device_type) {
            let Some((need, has)) = need_of(g.total_mem) else {
                continue;
            };
            if !fits(&need, &has, &g.dims) {
                continue;
            }
            out.free[i] = out.free[i].saturating_add(g.count);
            match g.numa {
                None => out.anywhere[i] = out.anywhere[i].saturating_add(g.count),
                Some(id) if (id as usize) < MAX_NUMA_NODES => {
                    let c = &mut out.by_numa[i][id as usize];
                    *c = c.saturating_add(g.count);
                }
                // A NUMA id no mask can name: counted only without a restriction.
                Some(_) => {}
            }
        }
    }
    if index.blocked {
        out.base = Err(FitError::new(
            crate::placement::FitReason::MalformedDeviceAllocation,
            false,
        ));
    }
    out
}

/// The node's device score in 0..=100, as `score_node` on a node with a `Device` object (a
/// node without one scores 0), from the index's per-type sums.
pub fn score(index: DeviceIndexRef<'_>, req: &FastRequest) -> i64 {
    let mut sum = 0i64;
    let mut n = 0i64;
    for r in &req.types {
        sum += score_dims(req, &r.per_device_units, &index.sums(&r.device_type));
        n += 1;
    }
    if n == 0 { 0 } else { (sum / n).clamp(0, 100) }
}

/// `DeviceScoring::score` over whole-unit vectors.
fn score_dims(req: &FastRequest, request: &NeedVec, sums: &TypeSums) -> i64 {
    let (mut sum, mut weight_sum) = (0i128, 0i128);
    for &(d, w) in &req.weights {
        let capacity = i128::from(sums.total[d]);
        if capacity <= 0 {
            continue;
        }
        let f = i128::from(sums.free[d]);
        let used = if f <= capacity {
            capacity - f.max(0)
        } else {
            0
        };
        let requested = used + request[d].max(0);
        // As `DeviceScoring::score`: fragmentation's GPU score is the full scorer's (the read
        // path never asks this for it), other types spread.
        let s = match req.strategy {
            ScoringStrategy::LeastAllocated | ScoringStrategy::Fragmentation
                if requested > capacity =>
            {
                0
            }
            ScoringStrategy::LeastAllocated | ScoringStrategy::Fragmentation => {
                div((capacity - requested) * 100, capacity)
            }
            ScoringStrategy::MostAllocated => div(requested.min(capacity) * 100, capacity),
        };
        sum += s * w;
        weight_sum += w;
    }
    if weight_sum == 0 {
        return 0;
    }
    div(sum, weight_sum).clamp(0, 100) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::devices::{
        DeviceLedger, DeviceSlot, EntryState, NodeDevices, RecordedAllocation,
    };
    use crate::model::device::{
        DeviceResources, DeviceTopology, FPGA, GPU_CORE, GPU_SHARED, NVIDIA_GPU, RDMA,
    };
    use crate::model::ids::PodUid;
    use crate::placement::device::allocate::{fit_on_numa, fit_with};
    use crate::placement::device::index::DeviceIndex;
    use crate::placement::device::request::parse_device_request;
    use crate::placement::device::score::score_node;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn slot(t: &DeviceType, minor: i32, healthy: bool, mem_gi: i64, numa: i32) -> DeviceSlot {
        let total: DeviceResources = if !healthy {
            DeviceResources::new()
        } else if *t == DeviceType::Gpu {
            [
                (GPU_CORE.to_string(), Quantity::from_units(100)),
                (GPU_MEMORY.to_string(), Quantity::from_units(mem_gi << 30)),
                (GPU_MEMORY_RATIO.to_string(), Quantity::from_units(100)),
            ]
            .into_iter()
            .collect()
        } else {
            let name = if *t == DeviceType::Rdma { RDMA } else { FPGA };
            [(name.to_string(), Quantity::from_units(100))]
                .into_iter()
                .collect()
        };
        DeviceSlot {
            minor,
            id: format!("{t}-{minor}"),
            healthy,
            total,
            topology: Some(DeviceTopology {
                socket_id: numa,
                node_id: numa,
                pcie_id: format!("pci{}", minor / 2),
                bus_id: String::new(),
            }),
            ..Default::default()
        }
    }

    /// Requests as a pod would write them (resource name, quantity).
    fn arb_request() -> impl Strategy<Value = Vec<(&'static str, String)>> {
        prop_oneof![
            (1u32..=6).prop_map(|n| vec![(NVIDIA_GPU, n.to_string())]),
            (1u32..=100).prop_map(|r| vec![(GPU_MEMORY_RATIO, r.to_string())]),
            (1u32..=48).prop_map(|g| vec![(GPU_MEMORY, format!("{g}Gi"))]),
            ((1u32..=100), (1u32..=100)).prop_map(|(c, r)| vec![
                (GPU_CORE, c.to_string()),
                (GPU_MEMORY_RATIO, r.to_string())
            ]),
            ((2u32..=4), (1u32..=60)).prop_map(|(n, r)| vec![
                (GPU_SHARED, n.to_string()),
                (GPU_MEMORY_RATIO, (n * r).to_string())
            ]),
            (1u32..=100).prop_map(|r| vec![(RDMA, r.to_string())]),
            (1u32..=3).prop_map(|n| vec![(FPGA, (n * 100).to_string())]),
            ((1u32..=2), (1u32..=100))
                .prop_map(|(n, r)| vec![(NVIDIA_GPU, n.to_string()), (RDMA, r.to_string())]),
        ]
    }

    fn parse(pairs: &[(&str, String)]) -> crate::placement::device::request::PodDeviceRequest {
        let map: BTreeMap<String, Quantity> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity::parse(v).unwrap()))
            .collect();
        parse_device_request(&map, None).unwrap().unwrap()
    }

    proptest! {
        /// The 64-bit shortcut rounds exactly like `Quantity::value()`.
        #[test]
        fn units_matches_quantity_value(m in any::<i128>()) {
            prop_assert_eq!(units(m), Quantity::from_milli(m).value() as i128);
        }
    }

    /// The index the snapshot publishes for this ledger (indexed dimensions only here).
    fn index_of(ledger: &DeviceLedger) -> DeviceIndex {
        ledger.device_index().expect("indexed dims only")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// The fast path gives exactly the full allocator's feasibility (and reason) and the
        /// full scorer's score, on random layouts, occupancies and malformed entries.
        #[test]
        fn fast_path_equals_full_allocator_and_scorer(
            gpus in proptest::collection::vec((any::<bool>(), prop_oneof![Just(16i64), Just(40), Just(80)]), 0..10),
            // NUMA ids per GPU: by position, or one no mask can name (17), or unknown (-1).
            odd_numa in proptest::collection::vec(prop_oneof![Just(None), Just(Some(17i32)), Just(Some(-1i32))], 10),
            nics in proptest::collection::vec(any::<bool>(), 0..3),
            fpgas in 0usize..3,
            occupants in proptest::collection::vec(arb_request(), 0..12),
            malformed in any::<bool>(),
            probes in proptest::collection::vec(arb_request(), 1..6),
            most_allocated in any::<bool>(),
            deleted in any::<bool>(),
        ) {
            let mut slots = Vec::new();
            for (i, (sick, mem)) in gpus.iter().enumerate() {
                let healthy = !(*sick && i % 3 == 0);
                let numa = odd_numa[i].unwrap_or((i / 4) as i32);
                slots.push((DeviceType::Gpu, slot(&DeviceType::Gpu, i as i32, healthy, *mem, numa)));
            }
            for (i, healthy) in nics.iter().enumerate() {
                slots.push((DeviceType::Rdma, slot(&DeviceType::Rdma, i as i32, *healthy, 0, i as i32)));
            }
            for i in 0..fpgas {
                slots.push((DeviceType::Fpga, slot(&DeviceType::Fpga, i as i32, true, 0, 0)));
            }
            let mut cfg = DeviceScoring::default();
            if most_allocated {
                cfg.strategy = ScoringStrategy::MostAllocated;
            }
            let mut ledger = DeviceLedger::new();
            ledger.set_devices(Some(NodeDevices::from_slots(slots)));
            for (i, o) in occupants.iter().enumerate() {
                let req = parse(o);
                if let Ok(a) = fit_with(&ledger, &req, &[], &cfg) {
                    ledger.record(PodUid::new(format!("p{i}")), RecordedAllocation::Allocated(a), EntryState::Committed);
                }
                // Every read in between must see the change (the index is rebuilt per change).
                if let Some(fr) = FastRequest::new(&parse(&probes[0]), &cfg) {
                    prop_assert_eq!(
                        feasible(index_of(&ledger).as_ref(), &fr),
                        fit_with(&ledger, &parse(&probes[0]), &[], &cfg).map(|_| ())
                    );
                }
            }
            if malformed {
                ledger.record(PodUid::new("bad"), RecordedAllocation::Malformed { reason: "x".into() }, EntryState::Committed);
            }
            if deleted {
                // No Device object: no index (the snapshot says "missing"), and the full
                // scorer gives such a node 0, as the snapshot path does.
                ledger.set_devices(None);
                prop_assert!(ledger.device_index().is_none());
                for p in &probes {
                    prop_assert_eq!(score_node(&ledger, &parse(p), &cfg), 0);
                }
                return Ok(());
            }
            let index = index_of(&ledger);
            for p in &probes {
                let req = parse(p);
                let fast = FastRequest::new(&req, &cfg).expect("no joint or foreign names here");
                prop_assert_eq!(
                    feasible(index.as_ref(), &fast),
                    fit_with(&ledger, &req, &[], &cfg).map(|_| ()),
                    "request {:?}", p
                );
                prop_assert_eq!(score(index.as_ref(), &fast), score_node(&ledger, &req, &cfg), "request {:?}", p);
                // Restricted to each NUMA subset (GPU + CPU alignment asks one per hint).
                for mask in 0u16..8 {
                    let mask = NumaMask(mask);
                    prop_assert_eq!(
                        feasible_within(index.as_ref(), &fast, Some(mask)),
                        fit_on_numa(&ledger, &req, &[], &cfg, Some(mask)).map(|_| ()),
                        "request {:?} within NUMA mask {:?}", p, mask
                    );
                }
            }
        }
    }

    #[test]
    fn joint_requests_and_foreign_dims_defer_to_the_full_allocator() {
        let cfg = DeviceScoring::default();
        let mut ann = BTreeMap::new();
        ann.insert(
            crate::model::device::DEVICE_JOINT_ALLOCATE.to_string(),
            r#"{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}"#.to_string(),
        );
        let map: BTreeMap<String, Quantity> = [
            (NVIDIA_GPU.to_string(), Quantity::from_units(1)),
            (RDMA.to_string(), Quantity::from_units(1)),
        ]
        .into_iter()
        .collect();
        let joint = parse_device_request(&map, Some(&ann)).unwrap().unwrap();
        assert!(FastRequest::new(&joint, &cfg).is_none());

        let mut odd = slot(&DeviceType::Gpu, 0, true, 80, 0);
        odd.total
            .insert("example.com/gpu-bandwidth".into(), Quantity::from_units(5));
        let mut ledger = DeviceLedger::new();
        ledger.set_devices(Some(NodeDevices::from_slots([(DeviceType::Gpu, odd)])));
        let fr = FastRequest::new(&parse(&[(NVIDIA_GPU, "1".into())]), &cfg).unwrap();
        assert!(FastRequest::new(&parse(&[(NVIDIA_GPU, "1".into())]), &cfg).is_some());
        assert!(
            ledger.device_index().is_none(),
            "a foreign dimension is not indexed"
        );
        let _ = fr;
    }
}
