//! Device allocation: which minors a pod gets on one node, following koordinator's
//! `AutopilotAllocator` (GPU topology tree, scored default allocator, joint allocation) and
//! `fillGPUTotalMem`.
//!
//! Owns the choice only. It reads a node through [`DeviceHoldings::free`] (a copy, with
//! preemption victims released) and returns the allocation; recording it is the caller's job,
//! under the node's lock. Deterministic: every tie is broken by scope ID or minor ascending.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use crate::model::device::{
    DeviceAllocation, DeviceAllocationExtension, DeviceAllocations, DeviceResources, DeviceType,
    FPGA, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA, VirtualFunction,
};
use crate::model::gpu_partition::GpuPartitionSpec;
use crate::model::ids::PodUid;
use crate::model::quantity::Quantity;
use crate::placement::cpu::{NumaId, NumaMask};

use super::inventory::{DeviceHoldings, DeviceSlot, FreeMap, NodeDevices, fits_in};
use super::partition::{self, NodePartitions};
use super::request::{
    AllocateStrategy, DeviceTypeRequest, ExclusivePolicy, HintSelector, JointScope,
    PodDeviceRequest,
};
use super::score::DeviceScoring;

pub use crate::placement::{FitError, FitReason};

/// "insufficient <type> devices".
pub(crate) fn insufficient(t: &DeviceType, unresolvable: bool) -> FitError {
    FitError::new(FitReason::InsufficientDevices(t.clone()), unresolvable)
}

/// [`fit_with`] using the default scoring (LeastAllocated), for the tests.
#[cfg(test)]
pub fn fit(
    ledger: &(impl DeviceHoldings + ?Sized),
    req: &PodDeviceRequest,
    ignore: &[PodUid],
) -> Result<DeviceAllocations, FitError> {
    fit_with(ledger, req, ignore, &DeviceScoring::default())
}

/// Allocates devices for `req` on the ledger's node, treating the recorded allocations of
/// `ignore` (preemption victims) as released. The ledger is not modified.
pub fn fit_with(
    ledger: &(impl DeviceHoldings + ?Sized),
    req: &PodDeviceRequest,
    ignore: &[PodUid],
    cfg: &DeviceScoring,
) -> Result<DeviceAllocations, FitError> {
    fit_on_numa(ledger, req, ignore, cfg, None)
}

/// Whether a device may be used under a NUMA restriction: devices on a NUMA node of `allowed`,
/// and devices whose NUMA node is unknown (no topology, `nodeID` −1), which constrain nothing,
/// as the kubelet's device manager gives no hint for them.
pub fn on_numa(slot: &DeviceSlot, allowed: Option<NumaMask>) -> bool {
    match (allowed, &slot.topology) {
        (None, _) | (_, None) => true,
        (Some(mask), Some(tp)) => tp.node_id < 0 || mask.contains(tp.node_id as NumaId),
    }
}

/// [`fit_with`] using only devices on the NUMA nodes of `allowed` (GPU + CPU alignment:
/// `None` = no restriction). The structural checks still look at every device, so a request
/// the whole node could hold stays resolvable under a narrower mask.
pub fn fit_on_numa(
    ledger: &(impl DeviceHoldings + ?Sized),
    req: &PodDeviceRequest,
    ignore: &[PodUid],
    cfg: &DeviceScoring,
    allowed: Option<NumaMask>,
) -> Result<DeviceAllocations, FitError> {
    let Some(devices) = ledger.devices() else {
        return Err(FitError::new(FitReason::NoDeviceObject, true));
    };
    let req = &*by_strategy(req, devices)?;
    // Structural checks first: they do not depend on what is used.
    for (t, r) in &req.types {
        let capable = devices
            .slots(t)
            .filter(|s| capable_of(t, s, r, &s.total))
            .count();
        if capable < r.count {
            return Err(insufficient(t, true));
        }
    }
    if ledger.blocked(ignore) {
        return Err(FitError::new(FitReason::MalformedDeviceAllocation, false));
    }
    // A VF is asked for: the node must offer VFs of the type at all (koordinator `Prepare`).
    for t in req.types.keys() {
        let wants_vf = req.hints.get(t).is_some_and(|h| h.vf_selector.is_some());
        if wants_vf && !devices.slots(t).any(|s| !s.vf_groups.is_empty()) {
            return Err(FitError::new(
                FitReason::InsufficientVirtualFunctions(t.clone()),
                true,
            ));
        }
    }
    // VFs are allocated by the default allocator (RDMA, FPGA), not koordinator's GPU one.
    let vfs: BTreeMap<DeviceType, VfNeed> = req
        .types
        .keys()
        .filter(|t| **t != DeviceType::Gpu)
        .filter_map(|t| {
            let selector = req.hints.get(t)?.vf_selector.as_ref()?;
            Some((
                t.clone(),
                VfNeed {
                    selector,
                    in_use: ledger.vfs_in_use(t, ignore),
                },
            ))
        })
        .collect();
    let free = ledger.free(ignore);
    // `exclusivePolicy: PCIeLevel`: the PCIe switches none of whose devices of the type is in
    // use (koordinator's `filterFreeDevicesByPCIe`; see `exclusive_pcies`).
    let exclusive: BTreeMap<&DeviceType, BTreeSet<&str>> = req
        .hints
        .iter()
        .filter(|(t, h)| h.exclusive == Some(ExclusivePolicy::PcieLevel) && req.get(t).is_some())
        .map(|(t, _)| (t, exclusive_pcies(devices, t, &free)))
        .collect();
    let whole_gpus = req.get(&DeviceType::Gpu).is_some_and(|r| !r.shared);
    let partitions = whole_gpus.then(|| Partitions {
        node: ledger.partitions(),
        spec: req.gpu_partition.as_ref(),
        used: used_gpus(devices, &free, ledger),
    });
    let view = View {
        free,
        cfg,
        partitions,
        slots: devices
            .types()
            .map(|t| {
                let selector = req.hints.get(t).and_then(|h| h.selector.as_ref());
                let pcies = exclusive.get(t);
                (
                    t.clone(),
                    devices
                        .slots(t)
                        .filter(|s| on_numa(s, allowed))
                        .filter(|s| selector.is_none_or(|sel| sel.matches(&s.labels)))
                        .filter(|s| {
                            pcies.is_none_or(|p| {
                                s.topology
                                    .as_ref()
                                    .is_some_and(|tp| p.contains(tp.pcie_id.as_str()))
                            })
                        })
                        .collect(),
                )
            })
            .collect(),
        vfs,
        gpu_required_level: req
            .hints
            .get(&DeviceType::Gpu)
            .and_then(|h| h.required_scope_level),
    };

    let mut chosen: BTreeMap<DeviceType, Vec<i32>> = BTreeMap::new();
    if let Some(joint) = &req.joint {
        let mut types = joint.device_types.iter();
        if let Some(primary) = types.next()
            && let Some(pr) = req.get(primary)
        {
            let minors = view.allocate(primary, pr, None)?;
            let pcies = view.pcies(primary, &minors);
            chosen.insert(primary.clone(), minors);
            for secondary in types {
                let Some(sr) = req.get(secondary) else {
                    continue;
                };
                let minors = if *secondary == DeviceType::Gpu {
                    // koordinator's GPU allocator ignores PCIe preferences.
                    view.allocate(secondary, sr, None)?
                } else {
                    let desired = match joint.required_scope {
                        Some(JointScope::SamePcie) => sr.count.max(pcies.len()),
                        None => sr.count,
                    };
                    let pref = Preference {
                        pcies: &pcies,
                        max: sr.count.max(pcies.len()),
                    };
                    view.default_allocate(secondary, sr, desired, Some(pref))
                        .ok_or_else(|| insufficient(secondary, false))?
                };
                if joint.required_scope == Some(JointScope::SamePcie)
                    && view.pcies(secondary, &minors) != pcies
                {
                    return Err(FitError::new(FitReason::JointAllocate, false));
                }
                chosen.insert(secondary.clone(), minors);
            }
        }
    }
    for (t, r) in &req.types {
        if !chosen.contains_key(t) {
            chosen.insert(t.clone(), view.allocate(t, r, None)?);
        }
    }

    let mut out = BTreeMap::new();
    for (t, minors) in chosen {
        let Some(r) = req.get(&t) else { continue };
        let mut list = Vec::new();
        for minor in minors {
            let Some(slot) = devices.slot(&t, minor) else {
                continue;
            };
            let resources = if t == DeviceType::Gpu {
                fill_gpu_memory(&r.per_device, slot)
                    .ok_or_else(|| FitError::new(FitReason::NoHealthyGpu { minor }, false))?
            } else {
                r.per_device.clone()
            };
            let extension = view.vfs.get(&t).map(|need| {
                let vf = need.free_vf(slot).ok_or_else(|| {
                    FitError::new(FitReason::InsufficientVirtualFunctions(t.clone()), false)
                })?;
                Ok::<_, FitError>(DeviceAllocationExtension {
                    vfs: vec![VirtualFunction {
                        // koordinator writes `minor` only when non-zero (`omitempty`).
                        minor: vf.minor.filter(|m| *m != 0),
                        bus_id: vf.bus_id.clone(),
                    }],
                    ..Default::default()
                })
            });
            list.push(DeviceAllocation {
                minor,
                resources,
                id: slot.id.clone(),
                extension: extension.transpose()?,
            });
        }
        list.sort_by_key(|a| a.minor);
        out.insert(t, list);
    }
    Ok(DeviceAllocations(out))
}

/// Whether a device could hold the per-device request given `avail` (its total or its free).
/// GPUs must report their memory size: koordinator's `fillGPUTotalMem` fails without it, so
/// such a GPU is never a candidate rather than a late error.
fn capable_of(
    t: &DeviceType,
    slot: &DeviceSlot,
    r: &DeviceTypeRequest,
    avail: &DeviceResources,
) -> bool {
    if !slot.healthy || avail.is_empty() {
        return false;
    }
    if *t == DeviceType::Gpu {
        // Check the filled form (both memory dimensions): recording it must never push either
        // dimension past capacity, even when other pods used the other form.
        match fill_gpu_memory(&r.per_device, slot) {
            Some(filled) => fits_in(&filled, avail),
            None => false,
        }
    } else {
        fits_in(&r.per_device, avail)
    }
}

/// `fillGPUTotalMem`: carry both memory forms, converted with the chosen minor's total bytes.
/// `None` when the device does not report its memory.
pub fn fill_gpu_memory(per_gpu: &DeviceResources, slot: &DeviceSlot) -> Option<DeviceResources> {
    let total = slot.total.get(GPU_MEMORY)?.value();
    if total <= 0 {
        return None;
    }
    let mut out = per_gpu.clone();
    match (per_gpu.get(GPU_MEMORY), per_gpu.get(GPU_MEMORY_RATIO)) {
        (Some(bytes), None) => {
            // Floating point and truncation, exactly as koordinator's memoryBytesToRatio.
            let ratio = (bytes.value() as f64 / total as f64 * 100.0) as i64;
            out.insert(GPU_MEMORY_RATIO.into(), Quantity::from_units(ratio));
        }
        (None, Some(ratio)) => {
            let bytes = i128::from(ratio.value()) * i128::from(total) / 100;
            out.insert(
                GPU_MEMORY.into(),
                Quantity::from_units(i64::try_from(bytes).ok()?),
            );
        }
        _ => {}
    }
    Some(out)
}

/// PCIe switches to prefer, and how many devices to take at most.
#[derive(Clone, Copy)]
struct Preference<'a> {
    pcies: &'a BTreeSet<String>,
    max: usize,
}

struct View<'a> {
    free: FreeMap,
    cfg: &'a DeviceScoring,
    slots: BTreeMap<DeviceType, Vec<&'a DeviceSlot>>,
    /// Set for a whole-GPU request: the partition step comes first.
    partitions: Option<Partitions<'a>>,
    /// The types whose devices must each give the pod a VF.
    vfs: BTreeMap<DeviceType, VfNeed<'a>>,
    /// A GPU hint's `requiredTopologyScope` level: the GPUs must share a scope at least that
    /// deep (node 1, NUMA node 2, PCIe switch 3, device 4), and the topology rules cannot be
    /// bypassed.
    gpu_required_level: Option<u8>,
}

/// koordinator's `DefaultDeviceHandler.CalcDesiredRequestsAndCount` for RDMA/FPGA with an
/// `allocateStrategy` hint (a request of whole devices, above 100 and a multiple of it, keeps
/// its own count): `ApplyForAll` takes every device of the type (every one the hint's selector
/// matches), each with the pod's request, and is unresolvable where there is none;
/// `RequestsAsCount` takes as many devices as the request's quantity, 1 each, or 100 each with
/// `exclusivePolicy: DeviceLevel`.
fn by_strategy<'r>(
    req: &'r PodDeviceRequest,
    devices: &NodeDevices,
) -> Result<Cow<'r, PodDeviceRequest>, FitError> {
    let mut out = Cow::Borrowed(req);
    for (t, hint) in &req.hints {
        let (Some(strategy), Some(r)) = (hint.strategy, req.get(t)) else {
            continue;
        };
        let name = match t {
            DeviceType::Rdma => RDMA,
            DeviceType::Fpga => FPGA,
            _ => continue,
        };
        let value = r.total.get(name).map_or(0, |q| q.value());
        if value > 100 && value % 100 == 0 {
            continue;
        }
        let (count, per_device) = match strategy {
            AllocateStrategy::ApplyForAll => {
                let count = match &hint.selector {
                    None => devices.slots(t).filter(|s| !s.total.is_empty()).count(),
                    Some(sel) => devices.slots(t).filter(|s| sel.matches(&s.labels)).count(),
                };
                if count == 0 {
                    return Err(insufficient(t, true));
                }
                (count, value)
            }
            AllocateStrategy::RequestsAsCount => {
                let whole = hint.exclusive == Some(ExclusivePolicy::DeviceLevel);
                (
                    usize::try_from(value).unwrap_or(0),
                    if whole { 100 } else { 1 },
                )
            }
        };
        let changed = out.to_mut();
        if let Some(r) = changed.types.get_mut(t) {
            r.count = count;
            r.per_device =
                DeviceResources::from([(name.to_string(), Quantity::from_units(per_device))]);
        }
    }
    Ok(out)
}

/// The PCIe switches of type `t`'s devices on which every device of the type is free, for
/// `exclusivePolicy: PCIeLevel`. (koordinator computes this set in `nodeDevice.filter` and
/// then drops it: `minors.Intersection(..)` returns a new set that is never used, so its
/// policy has no effect. This project applies it.)
fn exclusive_pcies<'d>(
    devices: &'d NodeDevices,
    t: &DeviceType,
    free: &FreeMap,
) -> BTreeSet<&'d str> {
    let mut clean: BTreeMap<&str, bool> = BTreeMap::new();
    for s in devices.slots(t) {
        let Some(tp) = &s.topology else { continue };
        let untouched = free.get(t).and_then(|f| f.get(&s.minor)) == Some(&s.total) || !s.healthy;
        *clean.entry(tp.pcie_id.as_str()).or_insert(true) &= untouched;
    }
    clean
        .into_iter()
        .filter(|(_, c)| *c)
        .map(|(p, _)| p)
        .collect()
}

/// A `vfSelector` hint: the VF groups it matches, and the VFs other pods hold per minor.
struct VfNeed<'a> {
    selector: &'a HintSelector,
    in_use: BTreeMap<i32, BTreeSet<String>>,
}

impl VfNeed<'_> {
    /// koordinator's `allocateVF`: the free VF with the lowest bus ID among the device's
    /// groups the selector matches.
    fn free_vf<'s>(&self, slot: &'s DeviceSlot) -> Option<&'s VirtualFunction> {
        let held = self.in_use.get(&slot.minor);
        slot.vf_groups
            .iter()
            .filter(|g| self.selector.matches(&g.labels))
            .flat_map(|g| &g.vfs)
            .filter(|vf| !held.is_some_and(|h| h.contains(&vf.bus_id)))
            .min_by(|a, b| a.bus_id.cmp(&b.bus_id))
    }
}

/// What the partition step reads.
struct Partitions<'a> {
    node: NodePartitions,
    spec: Option<&'a GpuPartitionSpec>,
    /// Bit `m` for each GPU anything is allocated from (koordinator's `deviceUsed`).
    used: u64,
}

/// Bit `m` for each healthy GPU `m` (koordinator's `deviceTotal` without zero devices).
pub(crate) fn healthy_gpus<'s>(slots: impl Iterator<Item = &'s DeviceSlot>) -> u64 {
    slots
        .filter(|s| s.healthy && !s.total.is_empty())
        .filter(|s| (0..=partition::MAX_MINOR as i32).contains(&s.minor))
        .fold(0u64, |acc, s| acc | 1 << s.minor)
}

/// GPUs anything is allocated from: a present GPU whose free differs from its total (holdings
/// of preemption victims released), and a minor pods hold that the Device does not list.
pub(crate) fn used_gpus(
    devices: &NodeDevices,
    free: &FreeMap,
    ledger: &(impl DeviceHoldings + ?Sized),
) -> u64 {
    let bit = |m: i32| {
        if (0..=partition::MAX_MINOR as i32).contains(&m) {
            1u64 << m
        } else {
            0
        }
    };
    let gpu_free = free.get(&DeviceType::Gpu);
    let mut used = devices
        .slots(&DeviceType::Gpu)
        .filter(|s| s.healthy && gpu_free.and_then(|f| f.get(&s.minor)) != Some(&s.total))
        .fold(0, |acc, s| acc | bit(s.minor));
    for minor in ledger
        .used()
        .get(&DeviceType::Gpu)
        .into_iter()
        .flat_map(|m| m.keys())
    {
        if devices.slot(&DeviceType::Gpu, *minor).is_none() {
            used |= bit(*minor);
        }
    }
    used
}

struct Candidate<'a> {
    slot: &'a DeviceSlot,
    score: i64,
}

impl<'a> View<'a> {
    fn free_of(&self, t: &DeviceType, minor: i32) -> Option<&DeviceResources> {
        self.free.get(t)?.get(&minor)
    }

    /// Devices that can take the per-device request now, ascending by minor, with their score.
    fn candidates(&self, t: &DeviceType, r: &DeviceTypeRequest) -> Vec<Candidate<'a>> {
        let mut out = self.scored_candidates(t, r);
        if let Some(growth) = self.fragmentation_growth(t, r) {
            for c in &mut out {
                c.score = growth.get(&c.slot.minor).copied().unwrap_or(i64::MIN);
            }
        }
        out
    }

    /// Under the fragmentation strategy, for a share of one GPU: per minor that can take it,
    /// the negated growth of the workload's fragmentation (thousandths of a milli-GPU) if the
    /// share goes there, so the best card scores highest. `None` elsewhere (whole GPUs all
    /// leave the same: any wholly free card).
    fn fragmentation_growth(
        &self,
        t: &DeviceType,
        r: &DeviceTypeRequest,
    ) -> Option<BTreeMap<i32, i64>> {
        use super::fragmentation::{GpuAsk, NodeFree, TaskShape, ask_milli, card_free_milli};
        if self.cfg.strategy != super::score::ScoringStrategy::Fragmentation
            || *t != DeviceType::Gpu
            || !r.shared
            || r.count != 1
        {
            return None;
        }
        let empty = DeviceResources::new();
        let healthy: Vec<&DeviceSlot> = self
            .slots
            .get(t)?
            .iter()
            .copied()
            .filter(|s| s.healthy)
            .collect();
        // The share in milli-GPUs on the first card that can carry its filled form (the
        // cards of one node are alike; the measure assumes one size).
        let d = healthy.iter().find_map(|s| {
            fill_gpu_memory(&r.per_device, s).map(|filled| ask_milli(&filled, &s.total))
        })?;
        let node = NodeFree {
            // Which card takes the share never changes what CPU is left.
            cpu_milli: None,
            gpus: healthy
                .iter()
                .map(|s| card_free_milli(&s.total, self.free_of(t, s.minor).unwrap_or(&empty)))
                .collect(),
        };
        let task = TaskShape {
            cpu_milli: 0,
            gpu: GpuAsk::Share(d.max(1)),
        };
        let mix = self.cfg.mix.current().or_only(&task);
        let before = mix.fragmentation(&node);
        let growth = super::fragmentation::share_growth(&mix, &node, before, d.max(1));
        Some(
            healthy
                .iter()
                .zip(growth)
                .filter_map(|(s, g)| Some((s.minor, -(g? * 1000.0).round() as i64)))
                .collect(),
        )
    }

    /// [`Self::candidates`] with the configured formula's score.
    fn scored_candidates(&self, t: &DeviceType, r: &DeviceTypeRequest) -> Vec<Candidate<'a>> {
        let empty = DeviceResources::new();
        self.slots
            .get(t)
            .into_iter()
            .flatten()
            .filter(|slot| {
                self.vfs
                    .get(t)
                    .is_none_or(|need| need.free_vf(slot).is_some())
            })
            .filter_map(|slot| {
                let free = self.free_of(t, slot.minor).unwrap_or(&empty);
                capable_of(t, slot, r, free).then(|| Candidate {
                    slot,
                    score: self.cfg.score(&r.per_device, &slot.total, free),
                })
            })
            .collect()
    }

    fn pcies(&self, t: &DeviceType, minors: &[i32]) -> BTreeSet<String> {
        self.slots
            .get(t)
            .into_iter()
            .flatten()
            .filter(|s| minors.contains(&s.minor))
            .filter_map(|s| s.topology.as_ref().map(|tp| tp.pcie_id.clone()))
            .collect()
    }

    fn partly_used(&self, t: &DeviceType, slot: &DeviceSlot) -> bool {
        slot.healthy && self.free_of(t, slot.minor) != Some(&slot.total)
    }

    fn allocate(
        &self,
        t: &DeviceType,
        r: &DeviceTypeRequest,
        pref: Option<Preference<'_>>,
    ) -> Result<Vec<i32>, FitError> {
        if *t == DeviceType::Gpu
            && let Some(p) = &self.partitions
        {
            // koordinator's partition step, ahead of the topology rules: `Some` the
            // partition, `None` left to them (Prefer), `Err` an honoured rule.
            let total = healthy_gpus(self.slots.get(t).into_iter().flatten().copied());
            if let Some(minors) = partition::choose(&p.node, p.spec, r.count, p.used, total)? {
                return Ok(minors);
            }
        }
        if *t == DeviceType::Gpu
            && let Some(level) = self.gpu_required_level
        {
            // koordinator's `allocateByDeviceTopology` with a required scope: its failures are
            // the answer (no fall-back to the default allocator).
            if r.shared && r.count > 1 {
                return Err(FitError::new(FitReason::MultiSharedGpu, true));
            }
            return match self.gpu_tree(t, r, level) {
                None => Err(FitError::new(FitReason::MissingGpuTopologyTree, true)),
                Some(None) => Err(FitError::new(
                    FitReason::InsufficientTopologyScopedGpus,
                    false,
                )),
                Some(Some(minors)) => Ok(minors),
            };
        }
        let found = if *t == DeviceType::Gpu && !(r.shared && r.count > 1) {
            match self.gpu_tree(t, r, 0) {
                Some(result) => result,
                None => self.default_allocate(t, r, r.count, pref),
            }
        } else {
            // Multi-card shared GPU requests skip the tree ("Unsupported Multi-Shared GPU" is
            // suppressed in koordinator and falls through to the default allocator).
            self.default_allocate(t, r, r.count, pref)
        };
        found.ok_or_else(|| insufficient(t, false))
    }

    /// The topology tree (node → NUMA node → PCIe switch). `None` when some GPU lacks topology
    /// (no tree: use the default allocator); `Some(None)` when the tree finds no fit.
    /// Only scopes at level `min_level` or deeper may hold the GPUs (0: any).
    fn gpu_tree(
        &self,
        t: &DeviceType,
        r: &DeviceTypeRequest,
        min_level: u8,
    ) -> Option<Option<Vec<i32>>> {
        let slots = self.slots.get(t)?;
        if slots.iter().any(|s| s.topology.is_none()) {
            return None;
        }
        let cands = self.candidates(t, r);
        // Scopes in a fixed order: root, then NUMA nodes ascending, each followed by its PCIe
        // switches ascending. Each scope is (level, members).
        let mut numa: BTreeMap<i32, BTreeMap<&str, Vec<&DeviceSlot>>> = BTreeMap::new();
        for s in slots {
            if let Some(tp) = &s.topology {
                numa.entry(tp.node_id)
                    .or_default()
                    .entry(tp.pcie_id.as_str())
                    .or_default()
                    .push(s);
            }
        }
        // koordinator's `cumulativeNotEmpties`: one for each scope along the path that has a
        // used GPU (not the number of used GPUs).
        let used_in = |members: &[&DeviceSlot]| -> usize {
            usize::from(members.iter().any(|s| self.partly_used(t, s)))
        };
        let all: Vec<&DeviceSlot> = slots.to_vec();
        let root_used = used_in(&all);
        // (level, cumulative used along the path, member minors)
        let mut scopes: Vec<(u8, usize, BTreeSet<i32>)> =
            vec![(1, root_used, all.iter().map(|s| s.minor).collect())];
        for pcies in numa.values() {
            let numa_members: Vec<&DeviceSlot> = pcies.values().flatten().copied().collect();
            let numa_cum = root_used + used_in(&numa_members);
            scopes.push((2, numa_cum, numa_members.iter().map(|s| s.minor).collect()));
            for members in pcies.values() {
                scopes.push((
                    3,
                    numa_cum + used_in(members),
                    members.iter().map(|s| s.minor).collect(),
                ));
            }
        }
        let mut best: Option<((u8, usize, i64), Vec<i32>)> = None;
        for (level, cumulative, members) in scopes.into_iter().filter(|s| s.0 >= min_level) {
            let inside: Vec<&Candidate> = cands
                .iter()
                .filter(|c| members.contains(&c.slot.minor))
                .collect();
            if inside.len() < r.count {
                continue;
            }
            let (minors, score) = if r.shared {
                // Best score, lowest minor on ties (candidates are ascending by minor).
                let mut top = inside[0];
                for c in &inside[1..] {
                    if c.score > top.score {
                        top = c;
                    }
                }
                (vec![top.slot.minor], top.score)
            } else {
                (
                    inside.iter().take(r.count).map(|c| c.slot.minor).collect(),
                    0,
                )
            };
            let key = (level, cumulative, score);
            // Strictly better only: the earlier scope in the fixed order wins ties.
            if best.as_ref().is_none_or(|(k, _)| key > *k) {
                best = Some((key, minors));
            }
        }
        Some(best.map(|(_, m)| m))
    }

    /// koordinator's `defaultAllocateDevices`: score descending, minor ascending; with preferred
    /// PCIe switches, round-robin across them first. Takes at least `desired` and at most
    /// `pref.max` devices.
    fn default_allocate(
        &self,
        t: &DeviceType,
        r: &DeviceTypeRequest,
        desired: usize,
        pref: Option<Preference<'_>>,
    ) -> Option<Vec<i32>> {
        let mut cands = self.candidates(t, r);
        cands.sort_by(|a, b| b.score.cmp(&a.score).then(a.slot.minor.cmp(&b.slot.minor)));
        let max = pref.map_or(desired, |p| p.max.max(desired));
        let ordered: Vec<i32> = match pref {
            Some(p) if !p.pcies.is_empty() => {
                let mut groups: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
                let mut rest = Vec::new();
                for c in &cands {
                    match &c.slot.topology {
                        Some(tp) if p.pcies.contains(&tp.pcie_id) => groups
                            .entry(tp.pcie_id.as_str())
                            .or_default()
                            .push(c.slot.minor),
                        _ => rest.push(c.slot.minor),
                    }
                }
                let mut out = Vec::new();
                let depth = groups.values().map(Vec::len).max().unwrap_or(0);
                for i in 0..depth {
                    for g in groups.values() {
                        if let Some(m) = g.get(i) {
                            out.push(*m);
                        }
                    }
                }
                out.extend(rest);
                out
            }
            _ => cands.iter().map(|c| c.slot.minor).collect(),
        };
        let picked: Vec<i32> = ordered.into_iter().take(max).collect();
        (picked.len() >= desired).then_some(picked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::devices::{DeviceLedger, EntryState, NodeDevices, RecordedAllocation};
    use crate::model::device::{DeviceTopology, FPGA, GPU_CORE, GPU_SHARED, NVIDIA_GPU, RDMA};
    use crate::placement::device::request::parse_device_request;
    use crate::placement::device::score::ScoringStrategy;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    /// A GPU with 100 core / 100 ratio / `mem_gi` GiB.
    fn gpu(
        minor: i32,
        numa: i32,
        pcie: &str,
        healthy: bool,
        mem_gi: i64,
    ) -> (DeviceType, DeviceSlot) {
        let total = if healthy {
            DeviceResources::from([
                (GPU_CORE.to_string(), q("100")),
                (GPU_MEMORY.to_string(), Quantity::from_units(mem_gi << 30)),
                (GPU_MEMORY_RATIO.to_string(), q("100")),
            ])
        } else {
            DeviceResources::new()
        };
        (
            DeviceType::Gpu,
            DeviceSlot {
                minor,
                id: format!("GPU-{minor}"),
                healthy,
                total,
                topology: Some(DeviceTopology {
                    socket_id: -1,
                    node_id: numa,
                    pcie_id: pcie.to_string(),
                    bus_id: String::new(),
                }),
                ..Default::default()
            },
        )
    }
    fn nic(
        t: DeviceType,
        name: &str,
        minor: i32,
        numa: i32,
        pcie: &str,
    ) -> (DeviceType, DeviceSlot) {
        (
            t,
            DeviceSlot {
                minor,
                id: format!("{name}-{minor}"),
                healthy: true,
                total: DeviceResources::from([(name.to_string(), q("100"))]),
                topology: Some(DeviceTopology {
                    socket_id: -1,
                    node_id: numa,
                    pcie_id: pcie.to_string(),
                    bus_id: String::new(),
                }),
                ..Default::default()
            },
        )
    }
    fn ledger(slots: Vec<(DeviceType, DeviceSlot)>) -> DeviceLedger {
        let mut l = DeviceLedger::new();
        l.set_devices(Some(NodeDevices::from_slots(slots)));
        l
    }
    /// 8 GPUs: NUMA 0 = pcie a (0,1), b (2,3); NUMA 1 = pcie c (4,5), d (6,7).
    fn eight() -> Vec<(DeviceType, DeviceSlot)> {
        (0..8)
            .map(|m| gpu(m, m / 4, ["a", "b", "c", "d"][(m / 2) as usize], true, 80))
            .collect()
    }
    fn request(pairs: &[(&str, &str)], ann: &[(&str, &str)]) -> PodDeviceRequest {
        let r = pairs.iter().map(|(k, v)| (k.to_string(), q(v))).collect();
        let a: BTreeMap<String, String> = ann
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse_device_request(&r, Some(&a)).unwrap().unwrap()
    }
    fn minors(a: &DeviceAllocations, t: &DeviceType) -> Vec<i32> {
        a.0.get(t)
            .map(|l| l.iter().map(|x| x.minor).collect())
            .unwrap_or_default()
    }
    fn take(l: &mut DeviceLedger, uid: &str, pairs: &[(&str, &str)]) -> DeviceAllocations {
        let a = fit(l, &request(pairs, &[]), &[]).unwrap();
        l.record(
            PodUid::new(uid),
            RecordedAllocation::Allocated(a.clone()),
            EntryState::Committed,
        );
        a
    }

    #[test]
    fn numa_restriction_excludes_devices_elsewhere_but_not_unknown_ones() {
        let l = ledger(eight());
        let cfg = DeviceScoring::default();
        let one = request(&[(NVIDIA_GPU, "1")], &[]);
        let a = fit_on_numa(&l, &one, &[], &cfg, Some(NumaMask::single(1))).unwrap();
        assert_eq!(minors(&a, &DeviceType::Gpu), vec![4]);
        let four = request(&[(NVIDIA_GPU, "4")], &[]);
        let a = fit_on_numa(&l, &four, &[], &cfg, Some(NumaMask::single(1))).unwrap();
        assert_eq!(minors(&a, &DeviceType::Gpu), vec![4, 5, 6, 7]);
        let five = request(&[(NVIDIA_GPU, "5")], &[]);
        let e = fit_on_numa(&l, &five, &[], &cfg, Some(NumaMask::single(0))).unwrap_err();
        assert!(!e.unresolvable, "the whole node could hold it: {e:?}");
        assert!(fit_on_numa(&l, &five, &[], &cfg, Some(NumaMask(0b11))).is_ok());
        // Unknown NUMA (no topology, nodeID -1) is allowed under any mask.
        let mut unknown = gpu(0, -1, "a", true, 80);
        let no_topo = {
            let mut g = gpu(1, 0, "a", true, 80);
            g.1.topology = None;
            g
        };
        unknown.1.minor = 0;
        let l = ledger(vec![unknown, no_topo]);
        let two = request(&[(NVIDIA_GPU, "2")], &[]);
        assert!(fit_on_numa(&l, &two, &[], &cfg, Some(NumaMask::single(3))).is_ok());
    }

    #[test]
    fn whole_gpus_stay_inside_one_pcie_switch_then_numa_node() {
        let mut l = ledger(eight());
        // Minor 0 busy: a 2-GPU pod avoids switch a, and prefers switch b (same NUMA node as the
        // used card: topological bin-pack) over c and d.
        take(&mut l, "p0", &[(NVIDIA_GPU, "1")]);
        let a = take(&mut l, "p1", &[(NVIDIA_GPU, "2")]);
        assert_eq!(minors(&a, &DeviceType::Gpu), vec![2, 3]);
        // 4 GPUs: NUMA 0 has only 1 free, so NUMA 1 entirely.
        let a = fit(&l, &request(&[(NVIDIA_GPU, "4")], &[]), &[]).unwrap();
        assert_eq!(minors(&a, &DeviceType::Gpu), vec![4, 5, 6, 7]);
        // 5 GPUs span NUMA nodes: the first five free minors.
        let a = fit(&l, &request(&[(NVIDIA_GPU, "5")], &[]), &[]).unwrap();
        assert_eq!(minors(&a, &DeviceType::Gpu), vec![1, 4, 5, 6, 7]);
        assert_eq!(
            fit(&l, &request(&[(NVIDIA_GPU, "6")], &[]), &[]).unwrap_err(),
            FitError::new(FitReason::InsufficientDevices(DeviceType::Gpu), false)
        );
        assert!(
            fit(&l, &request(&[(NVIDIA_GPU, "9")], &[]), &[])
                .unwrap_err()
                .unresolvable
        );
    }

    #[test]
    fn whole_gpu_allocation_fills_memory_and_id() {
        let l = ledger(eight());
        let a = fit(&l, &request(&[(NVIDIA_GPU, "1")], &[]), &[]).unwrap();
        assert_eq!(
            a.to_annotation(),
            r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"80Gi","koordinator.sh/gpu-memory-ratio":"100"},"id":"GPU-0"}]}"#
        );
    }

    #[test]
    fn memory_is_filled_in_both_forms_from_the_chosen_minor() {
        // Heterogeneous cards: minor 0 has 16Gi, minor 1 has 80Gi.
        let l = ledger(vec![gpu(0, 0, "a", true, 16), gpu(1, 0, "a", true, 80)]);
        let a = fit(&l, &request(&[(GPU_MEMORY, "20Gi")], &[]), &[]).unwrap();
        let e = &a.0[&DeviceType::Gpu][0];
        assert_eq!(e.minor, 1);
        assert_eq!(e.resources[GPU_MEMORY_RATIO], q("25"));
        assert!(
            !e.resources.contains_key(GPU_CORE),
            "core only when requested"
        );
        let a = fit(&l, &request(&[(GPU_MEMORY_RATIO, "50")], &[]), &[]).unwrap();
        let e = &a.0[&DeviceType::Gpu][0];
        let total = if e.minor == 0 { 16 } else { 80 };
        assert_eq!(
            e.resources[GPU_MEMORY],
            Quantity::from_units((total << 30) / 2)
        );
        // Truncating float conversion, as koordinator: 30Gi of 80Gi = 37.5% -> 37.
        let a = fit(
            &l,
            &request(&[(GPU_CORE, "10"), (GPU_MEMORY, "30Gi")], &[]),
            &[],
        )
        .unwrap();
        let e = &a.0[&DeviceType::Gpu][0];
        assert_eq!(
            (
                e.minor,
                e.resources[GPU_MEMORY_RATIO],
                e.resources[GPU_CORE]
            ),
            (1, q("37"), q("10"))
        );
        assert!(
            a.to_annotation()
                .contains(r#""koordinator.sh/gpu-memory":"30Gi""#)
        );
    }

    /// Fragmentation keeps a card whole when the workload asks whole cards: a share fills the
    /// partly used card, where least-allocated would break the free one.
    #[test]
    fn fragmentation_fills_the_partly_used_card_the_workload_cannot_use() {
        use crate::placement::device::fragmentation::{GpuAsk, MixSource, TaskShape, WorkloadMix};
        let mut l = ledger(vec![gpu(0, 0, "a", true, 80), gpu(1, 0, "a", true, 80)]);
        let held = fit(
            &ledger(vec![gpu(1, 0, "a", true, 80)]),
            &request(&[(GPU_MEMORY_RATIO, "50")], &[]),
            &[],
        )
        .unwrap();
        l.record(
            PodUid::new("s"),
            RecordedAllocation::Allocated(held),
            EntryState::Committed,
        );
        let ask = request(&[(GPU_MEMORY_RATIO, "50")], &[]);
        let whole_gpus = |gpu| DeviceScoring {
            strategy: ScoringStrategy::Fragmentation,
            mix: std::sync::Arc::new(MixSource::fixed(WorkloadMix::new([(
                TaskShape { cpu_milli: 0, gpu },
                1.0,
            )]))),
            ..DeviceScoring::default()
        };
        let fgd = fit_with(&l, &ask, &[], &whole_gpus(GpuAsk::Whole(1))).unwrap();
        assert_eq!(minors(&fgd, &DeviceType::Gpu), vec![1]);
        let spread = fit(&l, &ask, &[]).unwrap();
        assert_eq!(minors(&spread, &DeviceType::Gpu), vec![0]);
        // A workload of 60 % shares: card 1's 50 % is fragment either way, card 0 going to
        // 50 % makes it one too; filling card 1 grows nothing.
        let fgd = fit_with(&l, &ask, &[], &whole_gpus(GpuAsk::Share(600))).unwrap();
        assert_eq!(minors(&fgd, &DeviceType::Gpu), vec![1]);
    }

    #[test]
    fn shared_requests_bin_pack_onto_partly_used_cards() {
        let most = DeviceScoring {
            strategy: ScoringStrategy::MostAllocated,
            ..Default::default()
        };
        let mut l = ledger(vec![
            gpu(0, 0, "a", true, 80),
            gpu(1, 0, "a", true, 80),
            gpu(2, 1, "b", true, 80),
        ]);
        let first = fit_with(&l, &request(&[(GPU_MEMORY_RATIO, "30")], &[]), &[], &most).unwrap();
        assert_eq!(minors(&first, &DeviceType::Gpu), vec![0]);
        l.record(
            PodUid::new("s1"),
            RecordedAllocation::Allocated(first),
            EntryState::Committed,
        );
        let second = fit_with(&l, &request(&[(GPU_MEMORY_RATIO, "30")], &[]), &[], &most).unwrap();
        assert_eq!(
            minors(&second, &DeviceType::Gpu),
            vec![0],
            "onto the partly used card"
        );
        // Default (LeastAllocated) still stays on the busier PCIe switch but spreads across cards.
        let spread = fit(&l, &request(&[(GPU_MEMORY_RATIO, "30")], &[]), &[]).unwrap();
        assert_eq!(minors(&spread, &DeviceType::Gpu), vec![1]);
        // A single-card switch that is partly used wins under both strategies.
        let mut l = ledger(vec![gpu(0, 0, "a", true, 80), gpu(1, 1, "b", true, 80)]);
        l.record(
            PodUid::new("s"),
            RecordedAllocation::Allocated(
                fit(
                    &ledger(vec![gpu(1, 1, "b", true, 80)]),
                    &request(&[(GPU_MEMORY_RATIO, "20")], &[]),
                    &[],
                )
                .unwrap(),
            ),
            EntryState::Committed,
        );
        let a = fit(&l, &request(&[(GPU_MEMORY_RATIO, "50")], &[]), &[]).unwrap();
        assert_eq!(minors(&a, &DeviceType::Gpu), vec![1]);
        // A whole card no longer fits there.
        let a = fit(&l, &request(&[(NVIDIA_GPU, "1")], &[]), &[]).unwrap();
        assert_eq!(minors(&a, &DeviceType::Gpu), vec![0]);
    }

    #[test]
    fn unhealthy_cards_are_never_chosen() {
        let mut slots = eight();
        for m in [0, 2, 3] {
            slots[m] = gpu(m as i32, 0, ["a", "b"][m / 2], false, 80);
        }
        let l = ledger(slots);
        let a = fit(&l, &request(&[(NVIDIA_GPU, "5")], &[]), &[]).unwrap();
        assert_eq!(minors(&a, &DeviceType::Gpu), vec![1, 4, 5, 6, 7]);
        let a = fit(&l, &request(&[(GPU_MEMORY_RATIO, "10")], &[]), &[]).unwrap();
        assert_ne!(minors(&a, &DeviceType::Gpu), vec![0]);
        let e = fit(&l, &request(&[(NVIDIA_GPU, "6")], &[]), &[]).unwrap_err();
        assert!(e.unresolvable, "only 5 healthy GPUs exist");
    }

    #[test]
    fn multi_card_gpu_shared_splits_evenly() {
        let mut l = ledger(eight());
        take(&mut l, "busy", &[(GPU_MEMORY_RATIO, "50")]);
        let a = fit(
            &l,
            &request(&[(GPU_SHARED, "4"), (GPU_MEMORY, "160Gi")], &[]),
            &[],
        )
        .unwrap();
        let list = &a.0[&DeviceType::Gpu];
        assert_eq!(list.len(), 4);
        let ms: BTreeSet<i32> = list.iter().map(|e| e.minor).collect();
        assert_eq!(ms.len(), 4, "distinct cards");
        assert!(!ms.contains(&0), "least-allocated avoids the busy card");
        for e in list {
            assert_eq!(e.resources[GPU_MEMORY], q("40Gi"));
            assert_eq!(e.resources[GPU_MEMORY_RATIO], q("50"));
        }
    }

    #[test]
    fn rdma_and_fpga_use_the_default_allocator() {
        let mut l = ledger(vec![
            nic(DeviceType::Rdma, RDMA, 0, 0, "a"),
            nic(DeviceType::Rdma, RDMA, 1, 1, "b"),
            nic(DeviceType::Fpga, FPGA, 0, 0, "a"),
        ]);
        let a = take(&mut l, "r1", &[(RDMA, "1"), (FPGA, "50")]);
        assert_eq!(
            a.to_annotation(),
            r#"{"fpga":[{"minor":0,"resources":{"koordinator.sh/fpga":"50"},"id":"koordinator.sh/fpga-0"}],"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"koordinator.sh/rdma-0"}]}"#
        );
        // LeastAllocated: the next 1% goes to the untouched NIC.
        let a = fit(&l, &request(&[(RDMA, "1")], &[]), &[]).unwrap();
        assert_eq!(minors(&a, &DeviceType::Rdma), vec![1]);
        let a = fit(&l, &request(&[(RDMA, "200")], &[]), &[]);
        assert_eq!(a.unwrap_err().reason, "insufficient rdma devices");
        assert!(
            fit(&l, &request(&[(FPGA, "200")], &[]), &[])
                .unwrap_err()
                .unresolvable
        );
        let e = fit(&ledger(eight()), &request(&[(RDMA, "1")], &[]), &[]).unwrap_err();
        assert!(e.unresolvable && e.reason == "insufficient rdma devices");
    }

    #[test]
    fn joint_same_pcie() {
        let mut slots = eight();
        slots.push(nic(DeviceType::Rdma, RDMA, 0, 0, "b"));
        slots.push(nic(DeviceType::Rdma, RDMA, 1, 1, "c"));
        slots.push(nic(DeviceType::Rdma, RDMA, 2, 1, "d"));
        let l = ledger(slots);
        let joint = [(
            crate::model::device::DEVICE_JOINT_ALLOCATE,
            r#"{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}"#,
        )];
        // 2 GPUs in one switch (a) -> NIC must be on a; there is none.
        let e = fit(&l, &request(&[(NVIDIA_GPU, "2"), (RDMA, "1")], &joint), &[]).unwrap_err();
        assert_eq!(e.reason, "device joint-allocate rules violation");
        // 4 GPUs on c+d -> one NIC per switch, raised to 2 NICs.
        let mut l2 = l.clone();
        take(&mut l2, "x", &[(NVIDIA_GPU, "2")]);
        take(&mut l2, "y", &[(NVIDIA_GPU, "2")]);
        let a = fit(
            &l2,
            &request(&[(NVIDIA_GPU, "4"), (RDMA, "1")], &joint),
            &[],
        )
        .unwrap();
        assert_eq!(minors(&a, &DeviceType::Gpu), vec![4, 5, 6, 7]);
        assert_eq!(minors(&a, &DeviceType::Rdma), vec![1, 2]);
        // Without a required scope the NIC is best-effort on the GPUs' switches.
        let soft = [(
            crate::model::device::DEVICE_JOINT_ALLOCATE,
            r#"{"deviceTypes":["gpu","rdma"]}"#,
        )];
        let a = fit(&l, &request(&[(NVIDIA_GPU, "2"), (RDMA, "1")], &soft), &[]).unwrap();
        assert_eq!(minors(&a, &DeviceType::Rdma).len(), 1);
    }

    #[test]
    fn preemption_ignore_releases_victims_only_in_the_view() {
        let mut l = ledger(vec![gpu(0, 0, "a", true, 80)]);
        take(&mut l, "victim", &[(NVIDIA_GPU, "1")]);
        let before = l.used().clone();
        assert!(fit(&l, &request(&[(NVIDIA_GPU, "1")], &[]), &[]).is_err());
        let a = fit(
            &l,
            &request(&[(NVIDIA_GPU, "1")], &[]),
            &[PodUid::new("victim")],
        )
        .unwrap();
        assert_eq!(minors(&a, &DeviceType::Gpu), vec![0]);
        assert_eq!(l.used(), &before);
    }

    #[test]
    fn no_device_object_and_malformed_entries() {
        let mut l = DeviceLedger::new();
        let e = fit(&l, &request(&[(NVIDIA_GPU, "1")], &[]), &[]).unwrap_err();
        assert!(e.unresolvable);
        l.set_devices(Some(NodeDevices::from_slots(eight())));
        l.record(
            PodUid::new("m"),
            RecordedAllocation::Malformed { reason: "x".into() },
            EntryState::Committed,
        );
        let e = fit(&l, &request(&[(NVIDIA_GPU, "1")], &[]), &[]).unwrap_err();
        assert!(!e.unresolvable && e.reason.to_string().contains("malformed"));
        assert!(fit(&l, &request(&[(NVIDIA_GPU, "1")], &[]), &[PodUid::new("m")]).is_ok());
    }

    #[test]
    fn gpus_without_topology_use_the_default_allocator() {
        let mut slots = eight();
        for (_, s) in &mut slots {
            s.topology = None;
        }
        let mut l = ledger(slots);
        take(&mut l, "a", &[(NVIDIA_GPU, "1")]);
        let a = fit(&l, &request(&[(NVIDIA_GPU, "3")], &[]), &[]).unwrap();
        assert_eq!(minors(&a, &DeviceType::Gpu), vec![1, 2, 3]);
    }

    /// A VF group: its labels and its VFs' bus IDs.
    type Group<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);

    /// An RDMA NIC `minor` (PCIe `pci{minor}`) with `labels` and VF groups.
    fn nic_with_vfs(
        minor: i32,
        labels: &[(&str, &str)],
        groups: &[Group<'_>],
    ) -> (DeviceType, DeviceSlot) {
        let owned = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let (t, mut slot) = nic(DeviceType::Rdma, RDMA, minor, 0, &format!("pci{minor}"));
        slot.labels = owned(labels);
        slot.vf_groups = groups
            .iter()
            .map(|(l, vfs)| crate::placement::device::inventory::VfGroup {
                labels: owned(l),
                vfs: vfs
                    .iter()
                    .enumerate()
                    .map(|(i, b)| crate::model::device::VirtualFunction {
                        minor: Some(i as i32),
                        bus_id: b.to_string(),
                    })
                    .collect(),
            })
            .collect();
        (t, slot)
    }

    fn vfs_of(a: &DeviceAllocations) -> Vec<(i32, String)> {
        a.0.get(&DeviceType::Rdma)
            .into_iter()
            .flatten()
            .flat_map(|x| {
                x.extension
                    .iter()
                    .flat_map(|e| &e.vfs)
                    .map(move |vf| (x.minor, vf.bus_id.clone()))
            })
            .collect()
    }

    /// koordinator's `allocateVF`: each allocated NIC gives the pod the free VF with the lowest
    /// bus ID among the groups the `vfSelector` matches; VFs other pods hold (their
    /// `device-allocated` `extension.vfs`) are never given twice; a NIC with none left is
    /// passed over; a node without VFs at all is unresolvable.
    #[test]
    fn vf_selectors_allocate_distinct_vfs() {
        let general: &[(&str, &str)] = &[("type", "general")];
        let fast: &[(&str, &str)] = &[("type", "fast")];
        let mut l = ledger(vec![
            nic_with_vfs(
                0,
                &[],
                &[
                    (general, &["0000:3d:00.5", "0000:3d:00.2"]),
                    (fast, &["0000:3d:01.0"]),
                ],
            ),
            nic_with_vfs(1, &[], &[(general, &["0000:4d:00.2"])]),
        ]);
        let hint = |sel: &str| {
            request(
                &[(RDMA, "50")],
                &[(crate::model::device::DEVICE_ALLOCATE_HINT, sel)],
            )
        };
        let general_vf = hint(r#"{"rdma":{"vfSelector":{"matchLabels":{"type":"general"}}}}"#);
        let mut taken = Vec::new();
        for i in 0..3 {
            let a = fit(&l, &general_vf, &[]).expect("a general VF is left");
            let got = vfs_of(&a);
            assert_eq!(got.len(), 1, "{a:?}");
            assert!(!taken.contains(&got[0].1), "VF {} given twice", got[0].1);
            taken.push(got[0].1.clone());
            l.record(
                PodUid::new(format!("p{i}")),
                RecordedAllocation::Allocated(a),
                EntryState::Committed,
            );
        }
        // The NICs in score order (LeastAllocated: the emptier first), each giving its lowest
        // free general VF: NIC 0's first, NIC 1's only one, then NIC 0's second.
        assert_eq!(taken, vec!["0000:3d:00.2", "0000:4d:00.2", "0000:3d:00.5"]);
        // NIC 0 is full; NIC 1 has room but no general VF left.
        let e = fit(&l, &general_vf, &[]).unwrap_err();
        assert_eq!(
            (e.reason.text().as_ref(), e.unresolvable),
            ("insufficient rdma devices", false)
        );
        // A victim's VF comes back for preemption.
        let a = fit(&l, &general_vf, &[PodUid::new("p1")]).expect("p1's VF is free again");
        assert_eq!(vfs_of(&a), vec![(1, "0000:4d:00.2".to_string())]);
        // Another group is matched separately; the written VF carries its minor (omitted when 0).
        let fresh = ledger(vec![nic_with_vfs(
            0,
            &[],
            &[(general, &["0000:3d:00.2"]), (fast, &["0000:3d:01.0"])],
        )]);
        let fast_vf = fit(
            &fresh,
            &hint(r#"{"rdma":{"vfSelector":{"matchLabels":{"type":"fast"}}}}"#),
            &[],
        )
        .expect("the fast VF");
        assert_eq!(vfs_of(&fast_vf), vec![(0, "0000:3d:01.0".to_string())]);
        assert!(
            fast_vf
                .to_annotation()
                .contains(r#""vfs":[{"busID":"0000:3d:01.0"}]"#),
            "{}",
            fast_vf.to_annotation()
        );

        // No VF groups on any NIC of the node.
        let plain = ledger(vec![nic(DeviceType::Rdma, RDMA, 0, 0, "pci0")]);
        let e = fit(&plain, &hint(r#"{"rdma":{"vfSelector":{}}}"#), &[]).unwrap_err();
        assert_eq!(
            (e.reason.text().as_ref(), e.unresolvable),
            ("Insufficient rdma VirtualFunctions", true)
        );
        // Without a vfSelector, no VF is taken.
        assert!(vfs_of(&fit(&plain, &hint(r#"{"rdma":{}}"#), &[]).unwrap()).is_empty());
    }

    /// A `selector` hint allocates only devices whose labels match; matching none is a
    /// shortage on this node, not an invalid request.
    #[test]
    fn device_selectors_pick_matching_devices() {
        let l = ledger(vec![
            nic_with_vfs(0, &[("zone", "a")], &[]),
            nic_with_vfs(1, &[("zone", "b")], &[]),
        ]);
        let pick = |sel: &str| {
            fit(
                &l,
                &request(
                    &[(RDMA, "100")],
                    &[(crate::model::device::DEVICE_ALLOCATE_HINT, sel)],
                ),
                &[],
            )
        };
        let b = pick(r#"{"rdma":{"selector":{"matchLabels":{"zone":"b"}}}}"#).unwrap();
        assert_eq!(minors(&b, &DeviceType::Rdma), vec![1]);
        let not_a = pick(r#"{"rdma":{"selector":{"matchExpressions":[{"key":"zone","operator":"NotIn","values":["a"]}]}}}"#).unwrap();
        assert_eq!(minors(&not_a, &DeviceType::Rdma), vec![1]);
        let e = pick(r#"{"rdma":{"selector":{"matchLabels":{"zone":"c"}}}}"#).unwrap_err();
        assert_eq!(
            (e.reason.text().as_ref(), e.unresolvable),
            ("insufficient rdma devices", false)
        );
    }

    /// `allocateStrategy`: `ApplyForAll` takes every NIC (every one the selector matches),
    /// `RequestsAsCount` as many NICs as the quantity, 1 % each or whole with `DeviceLevel`;
    /// a request of whole NICs keeps its own count.
    #[test]
    fn allocate_strategies_set_the_device_count() {
        use crate::model::device::DEVICE_ALLOCATE_HINT as HINT;
        let l = ledger(vec![
            nic_with_vfs(0, &[("zone", "a")], &[]),
            nic_with_vfs(1, &[("zone", "b")], &[]),
            nic_with_vfs(2, &[("zone", "b")], &[]),
        ]);
        let place = |q: &str, hint: &str| fit(&l, &request(&[(RDMA, q)], &[(HINT, hint)]), &[]);
        let all = place("10", r#"{"rdma":{"allocateStrategy":"ApplyForAll"}}"#).unwrap();
        assert_eq!(minors(&all, &DeviceType::Rdma), vec![0, 1, 2]);
        assert!(
            all.0[&DeviceType::Rdma]
                .iter()
                .all(|a| a.resources[RDMA] == q("10"))
        );
        let zone_b = place(
            "10",
            r#"{"rdma":{"allocateStrategy":"ApplyForAll","selector":{"matchLabels":{"zone":"b"}}}}"#,
        )
        .unwrap();
        assert_eq!(minors(&zone_b, &DeviceType::Rdma), vec![1, 2]);
        let none = place(
            "10",
            r#"{"rdma":{"allocateStrategy":"ApplyForAll","selector":{"matchLabels":{"zone":"c"}}}}"#,
        )
        .unwrap_err();
        assert!(none.unresolvable, "{none}");
        let two = place("2", r#"{"rdma":{"allocateStrategy":"RequestsAsCount"}}"#).unwrap();
        assert_eq!(two.0[&DeviceType::Rdma].len(), 2);
        assert!(
            two.0[&DeviceType::Rdma]
                .iter()
                .all(|a| a.resources[RDMA] == q("1"))
        );
        let whole = place(
            "2",
            r#"{"rdma":{"allocateStrategy":"RequestsAsCount","exclusivePolicy":"DeviceLevel"}}"#,
        )
        .unwrap();
        assert!(
            whole.0[&DeviceType::Rdma]
                .iter()
                .all(|a| a.resources[RDMA] == q("100"))
        );
        assert!(
            place("4", r#"{"rdma":{"allocateStrategy":"RequestsAsCount"}}"#)
                .unwrap_err()
                .unresolvable
        );
        let multiple = place("200", r#"{"rdma":{"allocateStrategy":"RequestsAsCount"}}"#).unwrap();
        assert_eq!(
            multiple.0[&DeviceType::Rdma].len(),
            2,
            "200 % is two whole NICs"
        );
    }

    /// `exclusivePolicy: PCIeLevel`: only NICs on PCIe switches none of whose NICs is in use.
    #[test]
    fn pcie_exclusive_keeps_to_untouched_switches() {
        use crate::model::device::DEVICE_ALLOCATE_HINT as HINT;
        let mut l = ledger(vec![
            nic(DeviceType::Rdma, RDMA, 0, 0, "pci-a"),
            nic(DeviceType::Rdma, RDMA, 1, 0, "pci-a"),
            nic(DeviceType::Rdma, RDMA, 2, 0, "pci-b"),
        ]);
        let used = fit(&l, &request(&[(RDMA, "10")], &[]), &[]).unwrap();
        let held = minors(&used, &DeviceType::Rdma)[0];
        l.record(
            PodUid::new("p"),
            RecordedAllocation::Allocated(used),
            EntryState::Committed,
        );
        let exclusive = request(
            &[(RDMA, "10")],
            &[(HINT, r#"{"rdma":{"exclusivePolicy":"PCIeLevel"}}"#)],
        );
        let got = minors(&fit(&l, &exclusive, &[]).unwrap(), &DeviceType::Rdma);
        let switch_of = |m: i32| if m < 2 { "pci-a" } else { "pci-b" };
        assert_ne!(
            switch_of(got[0]),
            switch_of(held),
            "held {held}, got {got:?}"
        );
    }

    /// `requiredTopologyScope` (GPUs): the GPUs must share a scope at least that deep; the
    /// answer is the topology allocator's, without the default allocator behind it.
    #[test]
    fn required_topology_scope_keeps_gpus_together() {
        use crate::model::device::DEVICE_ALLOCATE_HINT as HINT;
        // NUMA 0: a (0,1), b (2,3); NUMA 1: c (4,5), d (6,7). GPUs 0, 2, 4 and 6 held.
        let mut l = ledger(eight());
        for (i, m) in [0, 2, 4, 6].into_iter().enumerate() {
            let one = request(&[(NVIDIA_GPU, "1")], &[]);
            let mut a = fit(&l, &one, &[]).unwrap();
            a.0.get_mut(&DeviceType::Gpu).unwrap()[0].minor = m;
            l.record(
                PodUid::new(format!("h{i}")),
                RecordedAllocation::Allocated(a),
                EntryState::Committed,
            );
        }
        let two = |scope: &str| {
            fit(
                &l,
                &request(
                    &[(NVIDIA_GPU, "2")],
                    &[(
                        HINT,
                        &format!(r#"{{"gpu":{{"requiredTopologyScope":"{scope}"}}}}"#),
                    )],
                ),
                &[],
            )
        };
        let e = two("PCIe").unwrap_err();
        assert_eq!(
            (e.reason.text().as_ref(), e.unresolvable),
            ("Insufficient Topology Scoped GPU Devices", false)
        );
        let numa = minors(&two("NUMANode").unwrap(), &DeviceType::Gpu);
        assert!(numa == vec![1, 3] || numa == vec![5, 7], "{numa:?}");
        assert!(two("Node").is_ok());
    }

    /// Every case koordinator's own GPU topology allocator answered
    /// (`allocateByDeviceTopology` with its own scorer; tests/koord-compat/accumulator/gputree:
    /// seeded random 2-8 GPU nodes over NUMA nodes and PCIe switches, untouched, whole and
    /// partly held GPUs, whole and shared requests, both strategies), replayed through
    /// `fit_with`. Whole-GPU requests: the same GPUs, every case. Shared requests: the same GPU,
    /// except where koordinator's tree scores a device with its free and total swapped
    /// (`allocator_gpu.go` passes `scoreDevice(request, free, total)` to
    /// `scoreDevice(request, total, free)`): there every partly held GPU scores 0
    /// (LeastAllocated) or 100 (MostAllocated), so it takes the first candidate of the best
    /// scope, where this project takes the best-scoring one. Each excused case must be one: a
    /// partly held GPU involved, koordinator's GPU at least as good by the swapped formula and
    /// ours strictly better by the right one, both written out here from koordinator's
    /// `scoreDevice` (never `DeviceScoring::score`, the code under test: with it, a ranking bug
    /// among partly held GPUs would be excused). The excused cases are pinned (35 of 3,000, 20
    /// of them with the two GPUs on different PCIe switches), so a new one fails.
    #[test]
    fn koordinators_gpu_tree_agrees_but_for_its_swapped_device_score() {
        #[derive(serde::Deserialize)]
        struct Gpu {
            minor: i32,
            numa: i32,
            pcie: String,
            used: i64,
        }
        #[derive(serde::Deserialize)]
        struct Case {
            gpus: Vec<Gpu>,
            count: usize,
            #[serde(default)]
            share: i64,
            strategy: String,
            #[serde(default)]
            minors: Option<Vec<i32>>,
            #[serde(default)]
            reason: String,
        }
        const MEMORY_PER_PERCENT: i64 = (80i64 << 30) / 100;
        let resources = |percent: i64| {
            DeviceResources::from([
                (GPU_CORE.to_string(), Quantity::from_units(percent)),
                (GPU_MEMORY_RATIO.to_string(), Quantity::from_units(percent)),
                (
                    GPU_MEMORY.to_string(),
                    Quantity::from_units(MEMORY_PER_PERCENT * percent),
                ),
            ])
        };
        let cases = include_str!("../../../tests/koord-compat/gputree-cases.jsonl");
        let (mut total, mut same, mut swapped_score, mut other_switch) = (0, 0, 0, 0);
        for (i, line) in cases.lines().enumerate() {
            let c: Case = serde_json::from_str(line).expect("case");
            let slots = c.gpus.iter().map(|g| {
                let (t, mut slot) = gpu(g.minor, g.numa, &g.pcie, true, 80);
                slot.total = resources(100);
                (t, slot)
            });
            let mut l = ledger(slots.collect());
            for g in c.gpus.iter().filter(|g| g.used > 0) {
                l.record(
                    PodUid::new(format!("holder-{}", g.minor)),
                    RecordedAllocation::Allocated(DeviceAllocations(BTreeMap::from([(
                        DeviceType::Gpu,
                        vec![DeviceAllocation {
                            minor: g.minor,
                            resources: resources(g.used),
                            id: String::new(),
                            extension: None,
                        }],
                    )]))),
                    EntryState::Committed,
                );
            }
            let (per, shared) = if c.share > 0 {
                (c.share, true)
            } else {
                (100, false)
            };
            let req = PodDeviceRequest {
                types: BTreeMap::from([(
                    DeviceType::Gpu,
                    DeviceTypeRequest {
                        total: resources(per * c.count as i64),
                        per_device: resources(per),
                        count: c.count,
                        shared,
                    },
                )]),
                joint: None,
                gpu_partition: None,
                hints: BTreeMap::new(),
                asked: Default::default(),
            };
            let cfg = DeviceScoring {
                strategy: match c.strategy.as_str() {
                    "MostAllocated" => ScoringStrategy::MostAllocated,
                    _ => ScoringStrategy::LeastAllocated,
                },
                ..DeviceScoring::default()
            };
            let got = fit_with(&l, &req, &[], &cfg).map(|a| minors(&a, &DeviceType::Gpu));
            let want = c.minors.clone().map(|mut m| {
                m.sort_unstable();
                m
            });
            total += 1;
            match (&got, &want) {
                (Ok(g), Some(w)) if g == w => same += 1,
                (Err(_), None) => {
                    assert!(!c.reason.is_empty(), "case {i}: {line}");
                    same += 1;
                }
                (Ok(g), Some(w)) if shared && g.len() == 1 && w.len() == 1 => {
                    // Only the device score may tell them apart: by the correct formula ours
                    // scores at least as well, by koordinator's swapped one its GPU does, and
                    // a partly held GPU is involved (untouched ones score alike either way).
                    let gpu_of = |m: i32| c.gpus.iter().find(|g| g.minor == m).expect("gpu");
                    let (ours, theirs) = (gpu_of(g[0]), gpu_of(w[0]));
                    // koordinator's `scoreDevice(request, total, free)` as it should be called,
                    // written from its formula (all three dimensions carry the same percentage,
                    // so one is the weighted mean): requested = held + asked, of 100.
                    let score = |g: &Gpu| {
                        let requested = g.used + per;
                        match cfg.strategy {
                            ScoringStrategy::LeastAllocated if requested > 100 => 0,
                            ScoringStrategy::LeastAllocated => 100 - requested,
                            ScoringStrategy::MostAllocated => requested.min(100),
                            ScoringStrategy::Fragmentation => unreachable!("koordinator has none"),
                        }
                    };
                    // koordinator's `scoreDevice(request, free, total)` into `(request, total,
                    // free)`, written out: capacity = free; requested = the request when the
                    // GPU is untouched, else all of its free.
                    let swapped = |g: &Gpu| {
                        let free = 100 - g.used;
                        let requested = if g.used == 0 { per } else { free };
                        match cfg.strategy {
                            ScoringStrategy::LeastAllocated => (free - requested) * 100 / free,
                            ScoringStrategy::MostAllocated => requested * 100 / free,
                            ScoringStrategy::Fragmentation => unreachable!("koordinator has none"),
                        }
                    };
                    assert!(
                        score(ours) > score(theirs),
                        "case {i}: ours does not score better: {line}"
                    );
                    assert!(
                        swapped(theirs) >= swapped(ours),
                        "case {i}: not the swap: {line}"
                    );
                    assert!(theirs.used > 0 || ours.used > 0, "case {i}: {line}");
                    swapped_score += 1;
                    if ours.pcie != theirs.pcie {
                        other_switch += 1;
                    }
                }
                _ => panic!(
                    "case {i}: ours {got:?}, koordinator {want:?} ({}): {line}",
                    c.reason
                ),
            }
        }
        assert_eq!(total, 3000);
        assert_eq!(same + swapped_score, total);
        assert_eq!(
            (swapped_score, other_switch),
            (35, 20),
            "the excused cases changed: a ranking change, not koordinator's swap"
        );
        eprintln!(
            "koordinator's GPU tree: {total} cases, {same} the same, {swapped_score} differ by its swapped device score"
        );
    }

    /// koordinator's own deviceshare allocator cases (koordinator v1.7.0,
    /// `pkg/scheduler/plugins/deviceshare/device_allocator_test.go`): `Test_allocateGPU`,
    /// `Test_allocateGPUWithLeastAllocatedScorer`, `Test_nodeDevice_allocateGPUWithMostAllocatedScorer`,
    /// `Test_allocateGPUWithUnhealthyInstance`, `Test_allocateRDMA`: their devices (no topology,
    /// as there), holders and requests, and koordinator's answer (minor and resources, GPU
    /// memory filled from the device's size, as its `fillGPUTotalMem`).
    #[test]
    fn koordinators_deviceshare_cases_agree() {
        fn gpu8(minor: i32, healthy: bool) -> (DeviceType, DeviceSlot) {
            let (t, mut s) = gpu(minor, 0, "", healthy, 8);
            s.topology = None;
            (t, s)
        }
        fn rdma(minor: i32) -> (DeviceType, DeviceSlot) {
            let (t, mut s) = nic(DeviceType::Rdma, RDMA, minor, 0, "");
            s.topology = None;
            (t, s)
        }
        fn hold(l: &mut DeviceLedger, uid: &str, annotation: &str) {
            l.record(
                PodUid::new(uid),
                RecordedAllocation::Allocated(
                    DeviceAllocations::parse_annotation(annotation).unwrap(),
                ),
                EntryState::Committed,
            );
        }
        fn answer(a: &DeviceAllocations, t: &DeviceType) -> Vec<(i32, Vec<(String, String)>)> {
            a.0.get(t)
                .map(|l| {
                    l.iter()
                        .map(|x| {
                            let mut r: Vec<(String, String)> = x
                                .resources
                                .iter()
                                .map(|(k, v)| (k.clone(), v.milli().to_string()))
                                .collect();
                            r.sort();
                            (x.minor, r)
                        })
                        .collect()
                })
                .unwrap_or_default()
        }
        let half = |minor: i32| {
            (
                minor,
                vec![
                    (GPU_CORE.to_string(), q("50").milli().to_string()),
                    (GPU_MEMORY.to_string(), q("4Gi").milli().to_string()),
                    (GPU_MEMORY_RATIO.to_string(), q("50").milli().to_string()),
                ],
            )
        };
        let full = r#"{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"100"}"#;
        let halfj = r#"{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"4Gi","koordinator.sh/gpu-memory-ratio":"50"}"#;

        // Test_allocateGPU: both GPUs held whole by a preemptible pod. (koordinator's test hands
        // the allocator core, memory and ratio at once, past the request validation that
        // refuses that combination in a pod, here too; core and ratio ask for the same, and
        // memory is filled from the device.)
        let mut l = ledger(vec![gpu8(1, true), gpu8(2, true)]);
        hold(
            &mut l,
            "victim",
            &format!(
                r#"{{"gpu":[{{"minor":1,"resources":{full}}},{{"minor":2,"resources":{full}}}]}}"#
            ),
        );
        let req = request(&[(GPU_CORE, "50"), (GPU_MEMORY_RATIO, "50")], &[]);
        let a = fit(&l, &req, &[PodUid::new("victim")]).unwrap();
        assert_eq!(
            answer(&a, &DeviceType::Gpu),
            vec![half(1)],
            "Test_allocateGPU"
        );

        // Test_allocateGPUWithLeastAllocatedScorer: minors 1, 2 half used.
        let mut l = ledger((1..=4).map(|m| gpu8(m, true)).collect());
        hold(
            &mut l,
            "p",
            &format!(
                r#"{{"gpu":[{{"minor":1,"resources":{halfj}}},{{"minor":2,"resources":{halfj}}}]}}"#
            ),
        );
        let req = request(&[(GPU_CORE, "50"), (GPU_MEMORY_RATIO, "50")], &[]);
        let least = DeviceScoring {
            strategy: ScoringStrategy::LeastAllocated,
            ..Default::default()
        };
        let a = fit_with(&l, &req, &[], &least).unwrap();
        assert_eq!(
            answer(&a, &DeviceType::Gpu),
            vec![half(3)],
            "Test_allocateGPUWithLeastAllocatedScorer"
        );

        // Test_nodeDevice_allocateGPUWithMostAllocatedScorer: minors 3, 4 half used.
        let mut l = ledger((1..=4).map(|m| gpu8(m, true)).collect());
        hold(
            &mut l,
            "p",
            &format!(
                r#"{{"gpu":[{{"minor":3,"resources":{halfj}}},{{"minor":4,"resources":{halfj}}}]}}"#
            ),
        );
        let most = DeviceScoring {
            strategy: ScoringStrategy::MostAllocated,
            ..Default::default()
        };
        let a = fit_with(&l, &req, &[], &most).unwrap();
        assert_eq!(
            answer(&a, &DeviceType::Gpu),
            vec![half(3)],
            "Test_nodeDevice_allocateGPUWithMostAllocatedScorer"
        );

        // Test_allocateGPUWithUnhealthyInstance: minor 1 has no resources (unhealthy).
        let l = ledger(vec![gpu8(1, false), gpu8(2, true)]);
        let req = request(&[(GPU_CORE, "50"), (GPU_MEMORY_RATIO, "50")], &[]);
        let a = fit(&l, &req, &[]).unwrap();
        assert_eq!(
            answer(&a, &DeviceType::Gpu),
            vec![half(2)],
            "Test_allocateGPUWithUnhealthyInstance"
        );

        // Test_allocateRDMA: both NICs held whole by a preemptible pod.
        let mut l = ledger(vec![rdma(1), rdma(2)]);
        hold(
            &mut l,
            "victim",
            r#"{"rdma":[{"minor":1,"resources":{"koordinator.sh/rdma":"100"}},{"minor":2,"resources":{"koordinator.sh/rdma":"100"}}]}"#,
        );
        let a = fit(&l, &request(&[(RDMA, "50")], &[]), &[PodUid::new("victim")]).unwrap();
        assert_eq!(
            answer(&a, &DeviceType::Rdma),
            vec![(1, vec![(RDMA.to_string(), q("50").milli().to_string())])],
            "Test_allocateRDMA"
        );
    }

    #[test]
    fn output_is_deterministic() {
        let mut l = ledger(eight());
        take(&mut l, "a", &[(GPU_MEMORY_RATIO, "30")]);
        let r = request(&[(GPU_SHARED, "2"), (GPU_MEMORY_RATIO, "60")], &[]);
        let first = fit(&l, &r, &[]).unwrap().to_annotation();
        for _ in 0..10 {
            assert_eq!(fit(&l.clone(), &r, &[]).unwrap().to_annotation(), first);
        }
    }

    // ---- property tests against a brute-force model ----

    #[derive(Debug, Clone)]
    enum Req {
        Whole(u8),
        Ratio(u8),
        Mem(u8),
        Shared(u8, u8),
    }
    impl Req {
        fn pairs(&self) -> Vec<(String, String)> {
            match self {
                Req::Whole(n) => vec![(NVIDIA_GPU.into(), n.to_string())],
                Req::Ratio(r) => vec![(GPU_MEMORY_RATIO.into(), r.to_string())],
                Req::Mem(g) => vec![(GPU_MEMORY.into(), format!("{g}Gi"))],
                Req::Shared(n, r) => vec![
                    (GPU_SHARED.into(), n.to_string()),
                    (
                        GPU_MEMORY_RATIO.into(),
                        (u32::from(*n) * u32::from(*r)).to_string(),
                    ),
                ],
            }
        }
        fn parse(&self) -> PodDeviceRequest {
            let r = self.pairs().into_iter().map(|(k, v)| (k, q(&v))).collect();
            parse_device_request(&r, None).unwrap().unwrap()
        }
    }
    fn arb_req() -> impl Strategy<Value = Req> {
        prop_oneof![
            (1u8..=5).prop_map(Req::Whole),
            (1u8..=100).prop_map(Req::Ratio),
            (1u8..=40).prop_map(Req::Mem),
            ((2u8..=4), (1u8..=60)).prop_map(|(n, r)| Req::Shared(n, r)),
        ]
    }
    /// One GPU as the test describes it: minor, NUMA node, PCIe switch, healthy, memory GiB.
    type GpuFact = (i32, i32, String, bool, i64);

    fn arb_layout() -> impl Strategy<Value = Vec<GpuFact>> {
        (1usize..=16, 1i32..=4, 1usize..=4)
            .prop_flat_map(|(n, numas, per_numa)| {
                (
                    Just((n, numas, per_numa)),
                    proptest::collection::vec((any::<bool>(), any::<bool>(), 0u8..8, 0u8..4), n),
                )
            })
            .prop_map(|((_, numas, per_numa), gpus)| {
                gpus.into_iter()
                    .enumerate()
                    .map(|(i, (sick, small, numa, pcie))| {
                        let numa = i32::from(numa) % numas;
                        let pcie = format!("pci{numa}-{}", usize::from(pcie) % per_numa);
                        // ~1 in 8 GPUs unhealthy (both flags + a bit of the numa draw).
                        let healthy = !(sick && small && numa == 0);
                        (i as i32, numa, pcie, healthy, if small { 16 } else { 40 })
                    })
                    .collect()
            })
    }

    fn slots_of(facts: &[GpuFact]) -> Vec<(DeviceType, DeviceSlot)> {
        facts
            .iter()
            .map(|(minor, numa, pcie, healthy, mem)| gpu(*minor, *numa, pcie, *healthy, *mem))
            .collect()
    }

    /// A `Quantity` string in milli-units, read here without the crate's parser: an integer
    /// with an optional binary or decimal suffix (all the annotations hold).
    fn milli(q: &str) -> i128 {
        let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
        let (digits, suffix) = q.split_at(split);
        let n: i128 = digits.parse().unwrap_or_else(|_| panic!("quantity {q:?}"));
        let scale: i128 = match suffix {
            "" => 1000,
            "m" => 1,
            "k" => 1_000_000,
            "M" => 1_000_000_000,
            "G" => 1_000_000_000_000,
            "Ki" => 1000 << 10,
            "Mi" => 1000 << 20,
            "Gi" => 1000 << 30,
            "Ti" => 1000 << 40,
            _ => panic!("quantity {q:?}: unexpected suffix"),
        };
        n * scale
    }

    /// The capacity model: what every recorded pod holds, summed per (minor, resource) in
    /// milli-units from its `device-allocated` annotation as koordlet would read it (plain
    /// JSON), never from the ledger.
    fn held_by_annotations(
        annotations: &BTreeMap<PodUid, String>,
    ) -> BTreeMap<(i64, String), i128> {
        let mut held = BTreeMap::new();
        for a in annotations.values() {
            let v: serde_json::Value = serde_json::from_str(a).expect("annotation JSON");
            for entry in v["gpu"].as_array().expect("gpu list") {
                let minor = entry["minor"].as_i64().expect("minor");
                for (name, q) in entry["resources"].as_object().expect("resources") {
                    *held.entry((minor, name.clone())).or_default() +=
                        milli(q.as_str().expect("quantity string"));
                }
            }
        }
        held
    }

    /// Nothing held beyond a GPU's capacity, nothing on an unhealthy or absent GPU.
    fn assert_model_within_capacity(
        facts: &[GpuFact],
        held: &BTreeMap<(i64, String), i128>,
    ) -> Result<(), TestCaseError> {
        for ((minor, name), amount) in held {
            let gpu = facts.iter().find(|f| i64::from(f.0) == *minor);
            let Some((_, _, _, true, mem_gi)) = gpu else {
                return Err(TestCaseError::fail(format!(
                    "{name} held on unhealthy or absent GPU {minor}"
                )));
            };
            let cap: i128 = match name.as_str() {
                GPU_CORE | GPU_MEMORY_RATIO => 100 * 1000,
                GPU_MEMORY => (i128::from(*mem_gi) << 30) * 1000,
                other => return Err(TestCaseError::fail(format!("unexpected resource {other}"))),
            };
            prop_assert!(
                *amount <= cap,
                "GPU {minor} {name}: held {amount} > capacity {cap} (milli)"
            );
        }
        Ok(())
    }

    /// The allocation's annotation carries what the request asked, read from the test's own
    /// description of it (never the parsed request): whole GPUs as that many distinct cards at
    /// 100 % core and memory; a ratio as that ratio on one card; GPU memory as those bytes on
    /// one card; a shared ask as that many cards at that ratio each. Capacity sums pass an
    /// allocator that records less than it hands out; this does not.
    fn assert_carries_the_ask(r: &Req, annotation: &str) -> Result<(), TestCaseError> {
        let v: serde_json::Value = serde_json::from_str(annotation).expect("annotation JSON");
        let entries = v["gpu"].as_array().expect("gpu list");
        let minors: BTreeSet<i64> = entries.iter().filter_map(|e| e["minor"].as_i64()).collect();
        let each = |name: &str| -> Vec<i128> {
            entries
                .iter()
                .map(|e| e["resources"][name].as_str().map_or(0, milli))
                .collect()
        };
        let (cards, per_card): (usize, Vec<(&str, i128)>) = match r {
            Req::Whole(n) => (
                usize::from(*n),
                vec![(GPU_CORE, 100_000), (GPU_MEMORY_RATIO, 100_000)],
            ),
            Req::Ratio(p) => (1, vec![(GPU_MEMORY_RATIO, i128::from(*p) * 1000)]),
            Req::Mem(g) => (1, vec![(GPU_MEMORY, (i128::from(*g) << 30) * 1000)]),
            Req::Shared(n, p) => (
                usize::from(*n),
                vec![(GPU_MEMORY_RATIO, i128::from(*p) * 1000)],
            ),
        };
        prop_assert_eq!(
            (entries.len(), minors.len()),
            (cards, cards),
            "{:?} recorded as {}",
            r,
            annotation
        );
        for (name, want) in per_card {
            prop_assert!(
                each(name).iter().all(|got| *got == want),
                "{:?}: every card must carry {} {} (milli), recorded {}",
                r,
                want,
                name,
                annotation
            );
        }
        Ok(())
    }

    /// Brute force from the model: healthy GPUs nothing holds any of.
    fn model_whole_free(facts: &[GpuFact], held: &BTreeMap<(i64, String), i128>) -> usize {
        facts
            .iter()
            .filter(|f| {
                f.3 && !held
                    .iter()
                    .any(|((m, _), a)| *m == i64::from(f.0) && *a > 0)
            })
            .count()
    }

    /// Brute force from the model for shares: how many healthy GPUs surely take one card of
    /// `r` on top of what the annotations hold (ratio and memory within capacity, the one the
    /// pod does not name filled in proportion and rounded up, so this never demands a fit
    /// that rounding could refuse).
    fn model_cards_that_take(
        facts: &[GpuFact],
        held: &BTreeMap<(i64, String), i128>,
        r: &Req,
    ) -> usize {
        let up = |a: i128, b: i128| (a + b - 1) / b;
        let held_of = |m: i32, name: &str| {
            held.get(&(i64::from(m), name.to_string()))
                .copied()
                .unwrap_or(0)
        };
        facts
            .iter()
            .filter(|(minor, _, _, healthy, mem_gi)| {
                let mem = (i128::from(*mem_gi) << 30) * 1000;
                let (ratio, bytes) = match r {
                    Req::Ratio(p) | Req::Shared(_, p) => {
                        let p = i128::from(*p);
                        (p * 1000, up(mem * p, 100))
                    }
                    Req::Mem(g) => {
                        let b = (i128::from(*g) << 30) * 1000;
                        (up(b * 100, mem) * 1000, b)
                    }
                    Req::Whole(_) => (100_000, mem),
                };
                *healthy
                    && held_of(*minor, GPU_MEMORY_RATIO) + ratio <= 100_000
                    && held_of(*minor, GPU_MEMORY) + bytes <= mem
                    && held_of(*minor, GPU_CORE) <= 100_000
            })
            .count()
    }

    /// The ledger's own bookkeeping (a regression check of `used`, not the oracle).
    fn assert_within_capacity(l: &DeviceLedger) -> Result<(), TestCaseError> {
        let devices = l.devices().unwrap();
        for (t, by_minor) in l.used() {
            for (minor, used) in by_minor {
                let slot = devices.slot(t, *minor);
                prop_assert!(
                    slot.is_some_and(|s| s.healthy),
                    "allocation on unhealthy/absent {minor}"
                );
                let total = &slot.unwrap().total;
                for (name, u) in used {
                    let cap = total.get(name).copied().unwrap_or(Quantity::ZERO);
                    prop_assert!(
                        *u <= cap,
                        "minor {minor} {name}: used {u:?} > total {cap:?}"
                    );
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Independent: the capacity model sums what every recorded pod holds from its
        /// `device-allocated` annotation (plain JSON, quantities read by the test) and judges
        /// capacity, the whole-GPU brute force (fits exactly when enough cards are free) and
        /// the share brute force (a share that surely fits is never refused) by it; every
        /// allocation must carry what was asked. Planted bugs each of these catches: the ledger
        /// counting only a pod's first device (passed the ledger's own checks); a share
        /// recorded 10 % short (passed every capacity sum); shares refused on any partly held
        /// GPU (passed the whole-GPU-only brute force).
        /// Regression only: the ledger's `used` within its totals, removal restoring state.
        #[test]
        fn never_over_capacity_complete_for_whole_gpus_and_removal_restores(
            layout in arb_layout(),
            reqs in proptest::collection::vec(arb_req(), 1..24),
            remove_order in proptest::collection::vec(any::<proptest::sample::Index>(), 24),
            strategy in prop_oneof![
                Just(ScoringStrategy::LeastAllocated),
                Just(ScoringStrategy::MostAllocated),
                Just(ScoringStrategy::Fragmentation),
            ],
            mix in proptest::collection::vec((1i64..1000, 1u32..10), 0..4),
        ) {
            // Every strategy only ranks the devices that can take the ask: the oracles hold
            // for each (fragmentation with a workload of random shares, or none yet).
            use crate::placement::device::fragmentation::{GpuAsk, MixSource, TaskShape, WorkloadMix};
            let cfg = DeviceScoring {
                strategy,
                mix: std::sync::Arc::new(MixSource::fixed(WorkloadMix::new(mix.iter().map(|(d, w)| {
                    (TaskShape { cpu_milli: 0, gpu: GpuAsk::Share(*d) }, f64::from(*w))
                })))),
                ..DeviceScoring::default()
            };
            let fit = |l: &DeviceLedger, r: &PodDeviceRequest, ignore: &[PodUid]| fit_with(l, r, ignore, &cfg);
            let mut l = ledger(slots_of(&layout));
            let mut history = vec![(l.free(&[]), l.used().clone())];
            let mut recorded = Vec::new();
            // The oracle's input: every recorded pod's annotation.
            let mut annotations: BTreeMap<PodUid, String> = BTreeMap::new();
            for (i, r) in reqs.iter().enumerate() {
                let parsed = r.parse();
                let res = fit(&l, &parsed, &[]);
                let held = held_by_annotations(&annotations);
                match r {
                    Req::Whole(n) => {
                        let model = model_whole_free(&layout, &held);
                        prop_assert_eq!(res.is_ok(), model >= usize::from(*n),
                            "whole-GPU fit disagrees with brute force ({} free, asked {})", model, n);
                    }
                    Req::Ratio(_) | Req::Mem(_) | Req::Shared(..) => {
                        let cards = if let Req::Shared(n, _) = r { usize::from(*n) } else { 1 };
                        let model = model_cards_that_take(&layout, &held, r);
                        prop_assert!(res.is_ok() || model < cards,
                            "{:?} refused ({:?}) although {} GPUs surely take it", r, res.as_ref().err(), model);
                    }
                }
                if let Ok(a) = res {
                    let gpus = &a.0[&DeviceType::Gpu];
                    let ms: BTreeSet<i32> = gpus.iter().map(|e| e.minor).collect();
                    prop_assert_eq!(ms.len(), parsed.types[&DeviceType::Gpu].count);
                    let uid = PodUid::new(format!("p{i}"));
                    assert_carries_the_ask(r, &a.to_annotation())?;
                    annotations.insert(uid.clone(), a.to_annotation());
                    l.record(uid.clone(), RecordedAllocation::Allocated(a), EntryState::Committed);
                    assert_model_within_capacity(&layout, &held_by_annotations(&annotations))?;
                    assert_within_capacity(&l)?;
                    recorded.push(uid);
                    history.push((l.free(&[]), l.used().clone()));
                }
            }
            // Removing the last entry restores the previous state exactly.
            if let Some(last) = recorded.last().cloned() {
                let mut l2 = l.clone();
                l2.remove(&last);
                let prev = &history[history.len() - 2];
                prop_assert_eq!(&l2.free(&[]), &prev.0);
                prop_assert_eq!(l2.used(), &prev.1);
            }
            // Removing everything in any order restores the empty state exactly.
            for idx in remove_order {
                if recorded.is_empty() { break; }
                let uid = recorded.remove(idx.index(recorded.len()));
                l.remove(&uid);
                assert_within_capacity(&l)?;
            }
            for uid in recorded { l.remove(&uid); }
            prop_assert_eq!(&l.free(&[]), &history[0].0);
            prop_assert!(l.used().is_empty());
        }
    }
}
