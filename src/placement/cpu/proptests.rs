//! Property tests of [`super::place`] and [`super::fast_feasible`] / [`super::fast_score`].
//!
//! **Independent oracles** (written from the view's raw fields and the specification, calling
//! none of the placement code): the brute-force feasibility checks and [`oracle`], which
//! enumerates every NUMA subset, counts eligible CPUs per NUMA node from the raw `CpuDetail`s,
//! applies the documented hint rules and scores with koordinator's formula written
//! out again. It judges the outcome (fits, fails, unresolvable), the chosen NUMA hint and the
//! score of `place` and the summary's score. A planted bug, `hint_score` ranking hints with
//! the node strategy instead of `numaScoringStrategy`, passed every comparison here before
//! the oracle (both sides share `hint_score`) and fails it now.
//!
//! **Regression checks only** (both sides share `resolve`, `NumaStats`, `decide` and the
//! scorer): summary == `place`, summary score == `score_or_zero`.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::accumulator::synthetic_topology;
use super::tests::{GI, Node};
use super::*;

/// A tiny deterministic generator so one `u64` seed describes a whole node and pod (proptest
/// then shrinks the seed's neighbourhood poorly, but reports it for replay).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

fn gen_node(r: &mut Rng) -> Node {
    let topo = synthetic_topology(
        1 + r.below(2) as u32,
        1 + r.below(2) as u32,
        1 + r.below(4) as u32,
        1 + r.below(2) as u32,
    );
    let mut node = Node::new(topo, (4 + r.below(12) as i64) * GI);
    let busy = r.below(80);
    let mut allocated = CpuSet::new();
    let mut reserved = CpuSet::new();
    for c in node.topo.all().iter() {
        if r.chance(busy) {
            allocated.insert(c);
        } else if r.chance(8) {
            reserved.insert(c);
        }
    }
    node.reserved = reserved;
    // Zone allocatable excludes reserved CPUs, as the ledger builds it.
    for z in node.zones.iter_mut() {
        z.cpu_milli -= node.topo.numa_cpus(z.id).intersection(&reserved).len() as i64 * 1000;
    }
    for (i, z) in node.zones.clone().iter().enumerate() {
        let held = node.topo.numa_cpus(z.id).intersection(&allocated).len() as i64 * 1000;
        let shared = if r.chance(30) {
            r.below(4000) as i64
        } else {
            0
        };
        node.usage[i].cpu_milli = held + shared;
        // The ledger keeps free CPUs of the NUMA node for its shares (a shared pool): as many
        // as the shares need, when that many are free.
        let free: Vec<u32> = node
            .topo
            .numa_cpus(z.id)
            .difference(&allocated)
            .difference(&reserved)
            .iter()
            .collect();
        let keep = usize::try_from((shared + 999) / 1000).unwrap_or(0);
        if keep <= free.len() {
            for c in &free[..keep] {
                node.shared_pool.insert(*c);
            }
        }
        node.usage[i].memory_bytes = r.below(z.memory_bytes as u64 + 1) as i64;
        node.usage[i].single_numa_pods = u32::from(r.chance(20));
        node.usage[i].multi_numa_pods = u32::from(r.chance(20));
    }
    node.allocated = allocated;
    for c in allocated.iter() {
        if r.chance(20) {
            node.pcpu_exclusive.insert(c);
        }
        if r.chance(20) {
            node.numa_exclusive.insert(c);
        }
    }
    node.bind_policy = r.pick(&[
        NodeCpuBindPolicy::None,
        NodeCpuBindPolicy::None,
        NodeCpuBindPolicy::FullPcpusOnly,
        NodeCpuBindPolicy::SpreadByPcpus,
    ]);
    node.numa_policy = r.pick(&[
        NumaPolicy::None,
        NumaPolicy::BestEffort,
        NumaPolicy::Restricted,
        NumaPolicy::SingleNumaNode,
    ]);
    node.strategy = r.pick(&[
        NumaAllocateStrategy::MostAllocated,
        NumaAllocateStrategy::LeastAllocated,
    ]);
    // koord-manager's amplification ratio on some nodes (issue 38 §3).
    if r.chance(30) {
        node.amplification = NumaAmplification {
            cpu: Ratio::above_one(r.pick(&[1.5, 2.0, 1.33, 3.0])),
            memory: if r.chance(30) {
                Ratio::above_one(1.2)
            } else {
                None
            },
        };
    }
    node
}

fn gen_pod(r: &mut Rng) -> PodCpuRequest {
    let cpus = r.below(11) as i64;
    let cpu_milli = if r.chance(15) {
        cpus * 1000 + 500
    } else {
        cpus * 1000
    };
    let cpuset = (r.chance(70) && cpu_milli % 1000 == 0).then(|| CpusetWish {
        policy: r.pick(&[CpuBindPolicy::FullPcpus, CpuBindPolicy::SpreadByPcpus]),
        required: r.chance(50),
        exclusive: r.pick(&[
            CpuExclusivePolicy::None,
            CpuExclusivePolicy::PcpuLevel,
            CpuExclusivePolicy::NumaNodeLevel,
        ]),
    });
    PodCpuRequest {
        cpu_milli,
        memory_bytes: r.below(10) as i64 * GI / 2,
        cpuset,
        numa_policy: r.pick(&[
            NumaPolicy::None,
            NumaPolicy::None,
            NumaPolicy::BestEffort,
            NumaPolicy::Restricted,
            NumaPolicy::SingleNumaNode,
        ]),
        numa_exclusive: r.pick(&[
            NumaExclusive::Unset,
            NumaExclusive::Required,
            NumaExclusive::Preferred,
        ]),
    }
}

fn gen_scoring(r: &mut Rng) -> CpuScoring {
    let strategies = [
        CpuScoreStrategy::LeastAllocated,
        CpuScoreStrategy::MostAllocated,
    ];
    CpuScoring {
        node_strategy: r.pick(&strategies),
        numa_strategy: r.pick(&strategies),
        cpu_weight: r.below(4) as i64,
        memory_weight: r.below(4) as i64,
        default_bind_policy: CpuBindPolicy::FullPcpus,
    }
}

/// The reference's own reading of the policies. `None` = the pair conflicts (or the request
/// is malformed for a cpuset): unresolvable.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RefDemand {
    /// (policy, required, cpus) of the cpuset, if any.
    cpuset: Option<(CpuBindPolicy, bool, usize)>,
    numa: NumaPolicy,
    exclusive_required: bool,
}

pub(crate) fn reference_resolve(node: &Node, req: &PodCpuRequest) -> Option<RefDemand> {
    let threads = {
        let mut per_core: BTreeMap<(u32, u32), usize> = BTreeMap::new();
        for d in node.topo.cpus() {
            *per_core.entry((d.socket, d.core)).or_default() += 1;
        }
        node.topo.cpus().len() / per_core.len()
    };
    let forced = match node.bind_policy {
        NodeCpuBindPolicy::None => None,
        NodeCpuBindPolicy::FullPcpusOnly => Some(CpuBindPolicy::FullPcpus),
        NodeCpuBindPolicy::SpreadByPcpus => Some(CpuBindPolicy::SpreadByPcpus),
    };
    let mut cpuset = None;
    if req.cpu_milli > 0 && (forced.is_some() || req.cpuset.is_some()) {
        if req.cpu_milli % 1000 != 0 {
            return None;
        }
        let (policy, required) = match (forced, req.cpuset) {
            (Some(f), Some(w)) if w.required && w.policy != f => return None,
            (Some(f), _) => (f, true),
            (None, Some(w)) => (w.policy, w.required),
            (None, None) => return None,
        };
        let cpus = (req.cpu_milli / 1000) as usize;
        if required && policy == CpuBindPolicy::FullPcpus && !cpus.is_multiple_of(threads) {
            return None;
        }
        cpuset = Some((policy, required, cpus));
    }
    let numa = match (req.numa_policy, node.numa_policy) {
        (NumaPolicy::None, n) => n,
        (p, NumaPolicy::None) => p,
        (p, n) if p == n => p,
        _ => return None,
    };
    let exclusive_required = match req.numa_exclusive {
        NumaExclusive::Required => true,
        NumaExclusive::Preferred => false,
        NumaExclusive::Unset => req.numa_policy != NumaPolicy::None,
    };
    Some(RefDemand {
        cpuset,
        numa,
        exclusive_required,
    })
}

/// Eligible free CPUs among `cpus` for the cpuset (counted from raw details).
pub(crate) fn eligible_count(
    node: &Node,
    cpus: CpuSet,
    policy: CpuBindPolicy,
    required: bool,
) -> usize {
    let free = cpus
        .difference(&node.allocated)
        .difference(&node.shared_pool)
        .difference(&node.reserved);
    if !required {
        return free.len();
    }
    let mut cores: BTreeMap<(u32, u32), (usize, usize)> = BTreeMap::new();
    for d in node.topo.cpus() {
        let e = cores.entry((d.socket, d.core)).or_default();
        e.0 += 1;
        if free.contains(d.id) {
            e.1 += 1;
        }
    }
    // Cores are confined to `cpus` here: every core of a NUMA node lies in it.
    let in_scope = |k: &(u32, u32)| {
        node.topo
            .cpus()
            .iter()
            .any(|d| (d.socket, d.core) == *k && cpus.contains(d.id))
    };
    cores
        .iter()
        .filter(|(k, _)| in_scope(k))
        .map(|(_, &(total, f))| match policy {
            CpuBindPolicy::FullPcpus if f == total => total,
            CpuBindPolicy::FullPcpus => 0,
            CpuBindPolicy::SpreadByPcpus => usize::from(f > 0),
        })
        .sum()
}

fn check_cpuset_shape(node: &Node, d: &RefDemand, p: &CpuPlacement) -> Result<(), TestCaseError> {
    let taken = node
        .allocated
        .union(&node.reserved)
        .union(&node.shared_pool);
    prop_assert!(
        p.cpuset.is_disjoint(&taken),
        "{} overlaps held/reserved/shared pool",
        p.cpuset
    );
    prop_assert!(p.cpuset.is_subset(&node.topo.all()));
    match d.cpuset {
        None => prop_assert!(p.cpuset.is_empty()),
        Some((policy, required, cpus)) => {
            prop_assert_eq!(p.cpuset.len(), cpus);
            if required {
                let mut per_core: BTreeMap<(u32, u32), (usize, usize)> = BTreeMap::new();
                for c in node.topo.cpus() {
                    let e = per_core.entry((c.socket, c.core)).or_default();
                    e.0 += 1;
                    e.1 += usize::from(p.cpuset.contains(c.id));
                }
                for (k, (total, got)) in per_core {
                    match policy {
                        CpuBindPolicy::FullPcpus => {
                            prop_assert!(got == 0 || got == total, "core {:?} split", k)
                        }
                        CpuBindPolicy::SpreadByPcpus => prop_assert!(got <= 1, "core {:?}", k),
                    }
                }
            }
        }
    }
    Ok(())
}

/// What the specification says `place` must answer, computed by [`oracle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expected {
    /// Nothing CPU/NUMA-related to decide (`Ok(None)`).
    Nothing,
    /// Does not fit; `unresolvable` when freeing pods can never help.
    Fails { unresolvable: bool },
    /// Fits at node level (no NUMA hint): the score.
    NodeLevel { score: i64 },
    /// Fits on the NUMA nodes of `mask` (bit = NUMA id): the score.
    Numa { mask: u16, score: i64 },
}

/// koordinator's scoring rule (`scoring.go`), written out again: per resource with a positive
/// allocatable and a positive weight, LeastAllocated `(alloc − used)·100 / alloc` (0 when
/// over), MostAllocated `min(used, alloc)·100 / alloc`, with `used` = requested + the pod;
/// the node score is the weighted mean, integer division throughout.
fn spec_score(
    strategy: CpuScoreStrategy,
    scoring: &CpuScoring,
    cpu: (i64, i64, i64),
    mem: (i64, i64, i64),
) -> i64 {
    let (mut num, mut den) = (0i128, 0i128);
    for (w, (alloc, requested, pod)) in [(scoring.cpu_weight, cpu), (scoring.memory_weight, mem)] {
        if alloc <= 0 || w <= 0 {
            continue;
        }
        let (alloc, used) = (alloc as i128, requested.max(0) as i128 + pod.max(0) as i128);
        let s = match strategy {
            CpuScoreStrategy::LeastAllocated if used > alloc => 0,
            CpuScoreStrategy::LeastAllocated => (alloc - used) * 100 / alloc,
            CpuScoreStrategy::MostAllocated => used.min(alloc) * 100 / alloc,
        };
        num += w as i128 * s;
        den += w as i128;
    }
    if den == 0 { 0 } else { (num / den) as i64 }
}

/// The CPU ids of NUMA node `numa`, read from the raw details.
fn raw_numa_cpus(node: &Node, numa: NumaId) -> CpuSet {
    let mut s = CpuSet::new();
    for d in node.topo.cpus() {
        if d.numa == numa {
            s.insert(d.id);
        }
    }
    s
}

/// The independent oracle for [`place`] without devices, from the raw node, the reference's
/// own policy reading and the specification (koordinator nodenumaresource and the deviations the
/// `hints` module documents: "preferred" = the fewest NUMA nodes that could hold the request
/// *by capacity*; Restricted admits only preferred hints; exclusivity demotes; the best hint
/// is preferred first, then fewest NUMA nodes, then the highest `numaScoringStrategy` score,
/// then the lowest ids; BestEffort falls back to every NUMA node). It enumerates every NUMA
/// subset and counts eligible CPUs per NUMA node from the CPU details; it calls none of
/// `resolve`, `NumaStats`, `Table`, `choose`, `decide`, `placement_score` or `score`.
///
/// `devices`, when the pod also asks for devices: whether they fit on the NUMA nodes of a mask
/// (bit = NUMA id), judged by the caller's own model. Device hints are the masks it accepts,
/// preferred at the fewest NUMA nodes it accepts; a merged hint must satisfy both sides.
pub(crate) fn oracle(
    node: &Node,
    req: &PodCpuRequest,
    d: &RefDemand,
    scoring: &CpuScoring,
    devices: Option<&dyn Fn(u16) -> bool>,
) -> Expected {
    let threads = node.topo.cpus().len()
        / node
            .topo
            .cpus()
            .iter()
            .map(|c| (c.socket, c.core))
            .collect::<std::collections::BTreeSet<_>>()
            .len();
    let numa_active = d.numa != NumaPolicy::None
        && (req.cpu_milli > 0 || req.memory_bytes > 0 || devices.is_some());
    if d.cpuset.is_none() && !numa_active {
        return Expected::Nothing;
    }
    let n = node.zones.len();
    let zone_cpus: Vec<CpuSet> = node
        .zones
        .iter()
        .map(|z| raw_numa_cpus(node, z.id))
        .collect();
    let amp_cpu = |x: i64| amplify(node.amplification.cpu, x);
    let cap_cpu = |i: usize| amp_cpu(node.zones[i].cpu_milli);
    let cap_mem = |i: usize| amplify(node.amplification.memory, node.zones[i].memory_bytes);
    // A NUMA node's used cpu counts its NUMA shares or its cpuset CPUs, whichever is larger;
    // the CPUs cpusets hold count amplified (`getAvailableNUMANodeResources`: shares − cpuset
    // CPUs + their amplified size, when the shares cover them).
    let held_milli = |i: usize| zone_cpus[i].intersection(&node.allocated).len() as i64 * 1000;
    let used_cpu_shares = |i: usize| {
        let (held, shares) = (held_milli(i), node.usage[i].cpu_milli);
        if held > 0 && shares >= held {
            shares - held + amp_cpu(held)
        } else {
            shares
        }
    };
    let used_cpu = |i: usize| used_cpu_shares(i).max(amp_cpu(held_milli(i)));
    // A cpuset pod's request counts amplified in the scores (`getResourceOptions`).
    let pod_cpu = if d.cpuset.is_some() {
        amp_cpu(req.cpu_milli.max(0))
    } else {
        req.cpu_milli
    };
    let amounts = |members: &[usize]| {
        let cpu_alloc: i64 = members.iter().map(|&i| cap_cpu(i)).sum();
        let cpu_req: i64 = members.iter().map(|&i| used_cpu(i)).sum();
        let mem_alloc: i64 = members.iter().map(|&i| cap_mem(i)).sum();
        let mem_req: i64 = members.iter().map(|&i| node.usage[i].memory_bytes).sum();
        (
            (cpu_alloc, cpu_req, pod_cpu),
            (mem_alloc, mem_req, req.memory_bytes),
        )
    };
    // A hint's NUMA score (`generateResourceHints`): requested = total − available, where a
    // required cpuset policy caps a NUMA node's available cpu at its eligible free CPUs × 1000
    // (`trimNUMANodeResources`).
    let hint_amounts = |members: &[usize]| {
        let (mut cpu, mut mem) = ((0, 0, pod_cpu), (0, 0, req.memory_bytes));
        for &i in members {
            let mut available = (cap_cpu(i) - used_cpu(i)).max(0);
            if let Some((policy, true, _)) = d.cpuset {
                available =
                    available.min(eligible_count(node, zone_cpus[i], policy, true) as i64 * 1000);
            }
            cpu.0 += cap_cpu(i);
            cpu.1 += cap_cpu(i) - available;
            mem.0 += cap_mem(i);
            mem.1 += cap_mem(i) - (cap_mem(i) - node.usage[i].memory_bytes).max(0);
        }
        (cpu, mem)
    };
    if d.numa == NumaPolicy::None || n == 0 {
        // Node level: the cpuset comes from the whole node.
        if let Some((policy, required, cpus)) = d.cpuset {
            let usable = {
                let mut held_free = node.clone();
                // Were every pod gone: no cpuset held, no share keeping a pool.
                held_free.allocated = CpuSet::new();
                held_free.shared_pool = CpuSet::new();
                eligible_count(&held_free, node.topo.all(), policy, required)
            };
            if usable < cpus {
                return Expected::Fails { unresolvable: true };
            }
            if eligible_count(node, node.topo.all(), policy, required) < cpus {
                return Expected::Fails {
                    unresolvable: false,
                };
            }
        }
        let all: Vec<usize> = (0..n).collect();
        let (mut cpu, mem) = amounts(&all);
        cpu.1 = cpu.1.max(amp_cpu(node.allocated.len() as i64 * 1000));
        return Expected::NodeLevel {
            score: spec_score(scoring.node_strategy, scoring, cpu, mem),
        };
    }
    // Per NUMA node: what the pod could get now and what it could get were every pod gone,
    // in the split's unit (whole cores for a required FullPCPUs cpuset).
    let units = |i: usize, capacity: bool| -> (i64, i64) {
        let milli = if capacity {
            cap_cpu(i)
        } else {
            cap_cpu(i) - used_cpu_shares(i)
        }
        .max(0);
        let mem = if capacity {
            cap_mem(i)
        } else {
            cap_mem(i) - node.usage[i].memory_bytes
        }
        .max(0);
        let cpu = match d.cpuset {
            None => milli,
            Some((policy, required, _)) => {
                let mut scope = node.clone();
                if capacity {
                    scope.allocated = CpuSet::new();
                    scope.shared_pool = CpuSet::new();
                }
                let cpus = eligible_count(&scope, zone_cpus[i], policy, required) as i64;
                let per = if required && policy == CpuBindPolicy::FullPcpus {
                    threads as i64
                } else {
                    1
                };
                (cpus / per).min(milli / (1000 * per))
            }
        };
        (cpu, mem)
    };
    let cpu_need = match d.cpuset {
        None => req.cpu_milli.max(0),
        Some((CpuBindPolicy::FullPcpus, true, cpus)) => (cpus / threads) as i64,
        Some((_, _, cpus)) => cpus as i64,
    };
    let mem_need = req.memory_bytes.max(0);
    // A subset holds one resource when every member has some and the sum covers the need.
    let holds = |members: &[usize], capacity: bool, which: usize, need: i64| {
        need <= 0
            || (members.iter().all(|&i| {
                let u = units(i, capacity);
                (if which == 0 { u.0 } else { u.1 }) > 0
            }) && members
                .iter()
                .map(|&i| {
                    let u = units(i, capacity);
                    if which == 0 { u.0 } else { u.1 }
                })
                .sum::<i64>()
                >= need)
    };
    let fits = |members: &[usize], capacity: bool| {
        holds(members, capacity, 0, cpu_need) && holds(members, capacity, 1, mem_need)
    };
    let subsets: Vec<Vec<usize>> = (1u32..(1 << n))
        .map(|bits| (0..n).filter(|i| bits & (1 << i) != 0).collect())
        .collect();
    let mask_of = |members: &[usize]| {
        members
            .iter()
            .fold(0u16, |m, &i| m | (1u16 << node.zones[i].id))
    };
    let all: Vec<usize> = (0..n).collect();
    let total = |capacity: bool, which: usize| -> i64 {
        all.iter()
            .map(|&i| {
                let u = units(i, capacity);
                if which == 0 { u.0 } else { u.1 }
            })
            .sum()
    };
    if total(true, 0) < cpu_need || total(true, 1) < mem_need {
        return Expected::Fails { unresolvable: true };
    }
    let min_by_capacity = subsets.iter().filter(|s| fits(s, true)).map(Vec::len).min();
    let single = d.numa == NumaPolicy::SingleNumaNode;
    match min_by_capacity {
        None if d.numa != NumaPolicy::BestEffort => return Expected::Fails { unresolvable: true },
        Some(k) if single && k > 1 => return Expected::Fails { unresolvable: true },
        _ => {}
    }
    let demoted = |members: &[usize]| {
        d.exclusive_required
            && members.iter().any(|&i| {
                if members.len() > 1 {
                    node.usage[i].single_numa_pods > 0
                } else {
                    node.usage[i].multi_numa_pods > 0
                }
            })
    };
    let considered = |s: &&Vec<usize>| !single || s.len() == 1;
    let device_ok = |s: &[usize]| devices.is_none_or(|f| f(mask_of(s)));
    let device_min = subsets
        .iter()
        .filter(considered)
        .filter(|s| device_ok(s))
        .map(Vec::len)
        .min();
    // (preferred, size, hint score, mask): the best is the greatest under
    // preferred ↑, size ↓, score ↑, mask ↓.
    let best = subsets
        .iter()
        .filter(considered)
        .filter(|s| fits(s, false) && device_ok(s))
        .map(|s| {
            let preferred = Some(s.len()) == min_by_capacity
                && (devices.is_none() || Some(s.len()) == device_min)
                && !demoted(s);
            let (cpu, mem) = hint_amounts(s);
            let hint = spec_score(scoring.numa_strategy, scoring, cpu, mem);
            (preferred, s.clone(), hint)
        })
        .max_by(|a, b| {
            (
                a.0,
                std::cmp::Reverse(a.1.len()),
                a.2,
                std::cmp::Reverse(mask_of(&a.1)),
            )
                .cmp(&(
                    b.0,
                    std::cmp::Reverse(b.1.len()),
                    b.2,
                    std::cmp::Reverse(mask_of(&b.1)),
                ))
        });
    let chosen = match best {
        Some((preferred, s, _)) if preferred || d.numa == NumaPolicy::BestEffort => s,
        None if d.numa == NumaPolicy::BestEffort => {
            // Every NUMA node, contributing or not: the sums must cover the request.
            // The devices are then the caller's to allocate under that affinity: `place`
            // does not ask them here.
            if total(false, 0) < cpu_need || total(false, 1) < mem_need {
                return Expected::Fails {
                    unresolvable: false,
                };
            }
            all
        }
        _ => {
            return Expected::Fails {
                unresolvable: false,
            };
        }
    };
    let (cpu, mem) = amounts(&chosen);
    Expected::Numa {
        mask: mask_of(&chosen),
        score: spec_score(scoring.node_strategy, scoring, cpu, mem),
    }
}

/// koordinator's `extension.Amplify`, `ceil(x × ratio)`, for one of the node's ratios
/// (`amplifyNUMANodeResources`), written out again.
fn amplify(ratio: Option<Ratio>, x: i64) -> i64 {
    match ratio {
        Some(r) if x != 0 => (x as f64 * r.get()).ceil() as i64,
        _ => x,
    }
}

/// What NUMA node `i` has left of its amplified cpu and memory, its cpuset CPUs counted
/// amplified when its shares cover them (`getAvailableNUMANodeResources`).
fn zone_left(node: &Node, i: usize) -> (i64, i64) {
    let z = node.zones[i];
    let u = node.usage[i];
    let held = raw_numa_cpus(node, z.id)
        .intersection(&node.allocated)
        .len() as i64
        * 1000;
    let cpu_used = if held > 0 && u.cpu_milli >= held {
        u.cpu_milli - held + amplify(node.amplification.cpu, held)
    } else {
        u.cpu_milli
    };
    (
        (amplify(node.amplification.cpu, z.cpu_milli) - cpu_used).max(0),
        (amplify(node.amplification.memory, z.memory_bytes) - u.memory_bytes).max(0),
    )
}

/// `place`'s answer in the oracle's terms.
fn observed(got: &Result<Option<CpuPlacement>, FitError>) -> Expected {
    match got {
        Ok(None) => Expected::Nothing,
        Err(e) => Expected::Fails {
            unresolvable: e.unresolvable,
        },
        Ok(Some(p)) => match p.affinity {
            None => Expected::NodeLevel { score: p.score },
            Some(m) => Expected::Numa {
                mask: m.0,
                score: p.score,
            },
        },
    }
}

fn check(seed: u64) -> Result<(), TestCaseError> {
    let mut r = Rng(seed | 1);
    let node = gen_node(&mut r);
    let req = gen_pod(&mut r);
    let scoring = gen_scoring(&mut r);
    let got = place(&node.view(), &req, None, &scoring);

    // The summary agrees with place whenever it answers, and it always answers without
    // devices.
    let summary = CpuSummary::new(&node.view());
    let fast = fast_feasible(&summary, &req, false, &scoring);
    prop_assert_eq!(fast, Some(got.clone().map(|_| ())), "summary vs place");
    prop_assert_eq!(
        fast_score(&summary, &req, false, &scoring),
        Some(score_or_zero(&node.view(), &req, None, &scoring)),
        "summary score vs place"
    );

    let Some(d) = reference_resolve(&node, &req) else {
        prop_assert!(got.as_ref().is_err_and(|e| e.unresolvable), "{:?}", got);
        return Ok(());
    };
    // The independent oracle: outcome, hint and score, for `place` and for the summary.
    let want = oracle(&node, &req, &d, &scoring, None);
    prop_assert_eq!(observed(&got), want, "place vs the oracle: {:?}", got);
    let want_score = match want {
        Expected::Nothing => None,
        Expected::Fails { .. } => Some(0),
        Expected::NodeLevel { score } | Expected::Numa { score, .. } => Some(score),
    };
    prop_assert_eq!(
        fast_score(&summary, &req, false, &scoring),
        Some(want_score),
        "summary score vs the oracle"
    );
    let p = match &got {
        Ok(Some(p)) => p,
        Ok(None) => {
            prop_assert!(d.cpuset.is_none());
            prop_assert!(
                d.numa == NumaPolicy::None || (req.cpu_milli == 0 && req.memory_bytes == 0)
            );
            return Ok(());
        }
        Err(_) => {
            // Feasibility is checked by the brute force below.
            &CpuPlacement::default()
        }
    };
    if got.as_ref().is_ok_and(|p| p.is_some()) {
        check_cpuset_shape(&node, &d, p)?;
        if d.numa != NumaPolicy::None {
            let total_cpu: i64 = p.numa.iter().map(|s| s.cpu_milli).sum();
            let total_mem: i64 = p.numa.iter().map(|s| s.memory_bytes).sum();
            prop_assert_eq!(total_cpu, req.cpu_milli);
            prop_assert_eq!(total_mem, req.memory_bytes);
            for s in &p.numa {
                let i = node.zones.iter().position(|z| z.id == s.numa).unwrap();
                let (cpu_left, memory_left) = zone_left(&node, i);
                prop_assert!(s.cpu_milli <= cpu_left);
                prop_assert!(s.memory_bytes <= memory_left);
                prop_assert!(p.affinity.is_some_and(|m| m.contains(s.numa)));
                // The cpuset's CPUs on this NUMA node match its share.
                if d.cpuset.is_some() {
                    let on = p.cpuset.intersection(&node.topo.numa_cpus(s.numa)).len() as i64;
                    prop_assert_eq!(on * 1000, s.cpu_milli);
                }
            }
        }
        if d.numa == NumaPolicy::SingleNumaNode {
            prop_assert!(
                p.affinity.is_some_and(|m| m.count() == 1),
                "{:?}",
                p.affinity
            );
            prop_assert!(p.numa.len() <= 1);
            let on_one = node
                .topo
                .numa_ids()
                .any(|n| p.cpuset.is_subset(&node.topo.numa_cpus(n)));
            prop_assert!(on_one, "{} spans NUMA nodes", p.cpuset);
        }
        prop_assert!((0..=100).contains(&p.score));
    }

    // Brute-force feasibility.
    let cpu_need = req.cpu_milli.max(0);
    let mem_need = req.memory_bytes.max(0);
    let fits_numa = |i: usize| -> bool {
        let z = node.zones[i];
        let (cpu_left, memory_left) = zone_left(&node, i);
        let cpu_ok = match d.cpuset {
            Some((policy, required, cpus)) => {
                eligible_count(&node, node.topo.numa_cpus(z.id), policy, required) >= cpus
                    && cpu_left >= cpus as i64 * 1000
            }
            // Nothing asked is always there, even on an over-committed NUMA node.
            None => cpu_need == 0 || cpu_left >= cpu_need,
        };
        cpu_ok && (mem_need == 0 || memory_left >= mem_need)
    };
    match d.numa {
        NumaPolicy::None => {
            if let Some((policy, required, cpus)) = d.cpuset {
                let n = eligible_count(&node, node.topo.all(), policy, required);
                prop_assert_eq!(got.is_ok(), n >= cpus, "node-level brute force {}", n);
            }
        }
        NumaPolicy::SingleNumaNode => {
            // With exclusivity Required a NUMA node shared by multi-NUMA pods is demoted.
            let exists = (0..node.zones.len()).any(|i| {
                fits_numa(i) && !(d.exclusive_required && node.usage[i].multi_numa_pods > 0)
            });
            prop_assert_eq!(got.is_ok(), exists, "single-NUMA brute force: {:?}", got);
        }
        NumaPolicy::BestEffort | NumaPolicy::Restricted => {
            if got.is_err() && d.numa == NumaPolicy::BestEffort {
                // BestEffort only fails when the whole node cannot hold it.
                let threads = node.topo.cpus().len() as i64
                    / node
                        .topo
                        .cpus()
                        .iter()
                        .map(|c| (c.socket, c.core))
                        .collect::<std::collections::BTreeSet<_>>()
                        .len() as i64;
                let total_cpu: i64 = node
                    .zones
                    .iter()
                    .enumerate()
                    .map(|(i, z)| {
                        let free_milli = zone_left(&node, i).0;
                        match d.cpuset {
                            Some((policy, required, _)) => {
                                let eligible = eligible_count(
                                    &node,
                                    node.topo.numa_cpus(z.id),
                                    policy,
                                    required,
                                ) as i64;
                                // A required FullPCPUs share is whole cores per NUMA node.
                                let step = if required && policy == CpuBindPolicy::FullPcpus {
                                    threads
                                } else {
                                    1
                                };
                                eligible.min(free_milli / 1000 / step * step) * 1000
                            }
                            None => free_milli,
                        }
                    })
                    .sum();
                let total_mem: i64 = (0..node.zones.len()).map(|i| zone_left(&node, i).1).sum();
                prop_assert!(
                    total_cpu < cpu_need || total_mem < mem_need,
                    "BestEffort rejected a node that holds it: {:?}",
                    got
                );
            }
            if got.is_err() && d.numa == NumaPolicy::Restricted && !d.exclusive_required {
                // Restricted must admit whenever one NUMA node fits it (the preferred size
                // is then 1, by capacity).
                let one = (0..node.zones.len()).any(fits_numa);
                prop_assert!(!one, "Restricted rejected a single-NUMA fit: {:?}", got);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn place_agrees_with_the_brute_force_and_the_summary(seed in any::<u64>()) {
        check(seed)?;
    }

    /// Pods placed one after another, each recorded before the next: no CPU is ever in two
    /// cpusets, none is reserved, and the summary keeps agreeing.
    #[test]
    fn sequential_placements_never_share_a_cpu(seed in any::<u64>()) {
        let mut r = Rng(seed | 1);
        let mut node = gen_node(&mut r);
        let scoring = CpuScoring::default();
        let mut held: Vec<CpuSet> = Vec::new();
        for _ in 0..6 {
            let req = gen_pod(&mut r);
            let got = place(&node.view(), &req, None, &scoring);
            let fast = fast_feasible(&CpuSummary::new(&node.view()), &req, false, &scoring);
            prop_assert_eq!(fast, Some(got.clone().map(|_| ())));
            if let Ok(Some(p)) = got {
                prop_assert!(p.cpuset.is_disjoint(&node.reserved));
                for h in &held {
                    prop_assert!(p.cpuset.is_disjoint(h));
                }
                for s in &p.numa {
                    let i = node.zones.iter().position(|z| z.id == s.numa).unwrap();
                    node.usage[i].cpu_milli += s.cpu_milli;
                    node.usage[i].memory_bytes += s.memory_bytes;
                }
                if p.numa.is_empty() {
                    // Node-level cpuset: account its CPUs per NUMA node as the ledger would.
                    for (i, z) in node.zones.clone().iter().enumerate() {
                        node.usage[i].cpu_milli +=
                            node.topo.numa_cpus(z.id).intersection(&p.cpuset).len() as i64 * 1000;
                    }
                }
                node.allocated = node.allocated.union(&p.cpuset);
                held.push(p.cpuset);
            }
        }
    }

    /// With devices: the summary steps aside under a NUMA policy, and otherwise agrees; the
    /// chosen affinity is one the callback accepted.
    #[test]
    fn device_alignment_honours_the_callback(seed in any::<u64>()) {
        let mut r = Rng(seed | 1);
        let node = gen_node(&mut r);
        let req = gen_pod(&mut r);
        let ok_masks = r.next() as u16;
        let mut cb = |m: NumaMask| m.0 & !ok_masks == 0;
        let got = place(&node.view(), &req, Some(&mut cb), &CpuScoring::default());
        let fast = fast_feasible(&CpuSummary::new(&node.view()), &req, true, &CpuScoring::default());
        if let Some(f) = fast {
            prop_assert_eq!(f, got.clone().map(|_| ()));
        }
        if let Ok(Some(p)) = &got
            && let Some(a) = p.affinity
            && let Some(d) = reference_resolve(&node, &req)
            && d.numa != NumaPolicy::BestEffort
        {
            prop_assert!(a.0 & ok_masks == a.0, "affinity {:?} not accepted", a);
        }
        // The independent oracle, with the same device hints.
        if let Some(d) = reference_resolve(&node, &req) {
            let accepted = |m: u16| m & !ok_masks == 0;
            let want = oracle(&node, &req, &d, &CpuScoring::default(), Some(&accepted));
            prop_assert_eq!(observed(&got), want, "place with devices vs the oracle: {:?}", got);
        }
    }
}

#[test]
fn summary_is_small_and_flat() {
    // The read path copies these into a contiguous snapshot; keep an eye on the size.
    assert!(
        std::mem::size_of::<CpuSummary>() <= 1024,
        "{}",
        std::mem::size_of::<CpuSummary>()
    );
}

/// The generator must reach every outcome class, or the properties above prove little.
#[test]
fn generator_covers_every_outcome() {
    let mut counts: BTreeMap<(String, &'static str), usize> = BTreeMap::new();
    for seed in 1..4000u64 {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let node = gen_node(&mut r);
        let req = gen_pod(&mut r);
        let outcome = match place(&node.view(), &req, None, &CpuScoring::default()) {
            Ok(None) => "none",
            Ok(Some(p)) if !p.cpuset.is_empty() => "cpuset",
            Ok(Some(_)) => "shares",
            Err(e) if e.unresolvable => "unresolvable",
            Err(_) => "failed",
        };
        let policy = reference_resolve(&node, &req)
            .map_or("conflict".to_string(), |d| format!("{:?}", d.numa));
        *counts.entry((policy, outcome)).or_default() += 1;
    }
    for policy in ["None", "BestEffort", "Restricted", "SingleNumaNode"] {
        for outcome in ["cpuset", "failed", "unresolvable"] {
            let n = counts
                .get(&(policy.to_string(), outcome))
                .copied()
                .unwrap_or(0);
            assert!(n >= 5, "{policy}/{outcome}: {n} cases; all: {counts:?}");
        }
    }
}
