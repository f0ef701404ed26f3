//! The cpuset accumulator (koordinator `cpu_accumulator.go`): which free CPUs a pod gets,
//! packing or spreading per [`NumaAllocateStrategy`], preferring whole NUMA nodes, then whole
//! sockets, then whole cores, with koordinator's two passes per stage ("with exclusivity",
//! which for a spread also offers one CPU per core, then "without").
//!
//! koordinator's code is the authority, not a summary of it: every case of
//! koordinator v1.7.0's `cpu_accumulator_test.go` this accumulator's inputs can express is a
//! test here (`koord_cases`). Where a summary was silent or misleading and the code differed: the
//! fallback orders by the free CPUs *left after what earlier stages took* (not the free set the
//! pod started from; it inverted MostAllocated and LeastAllocated there), and it takes
//! round-robin across cores for FullPCPUs too; the spread stages' first pass (one CPU per core)
//! runs for every pod, not only for pods that ask for exclusivity; and the "with exclusivity"
//! passes also avoid the cores / NUMA nodes this pod has already taken.
//!
//! Owns the choice of CPUs from an already-filtered free set; it must not decide policy
//! (required policies restrict the free set *before* it is called, see [`eligible`]) and never
//! looks outside the free set it is given, so reserved and allocated CPUs can never come out.

use super::topology::CpuTopology;
use super::{CpuBindPolicy, CpuExclusivePolicy, NumaAllocateStrategy, NumaId};
use crate::model::cpuset::{CpuId, CpuSet};

/// The CPUs a pod may take under its (possibly required) bind policy: for a required
/// FullPCPUs policy only CPUs of cores whose every hyperthread is free; for a required
/// SpreadByPCPUs policy the lowest free CPU of each core; otherwise every free CPU.
pub fn eligible(topo: &CpuTopology, free: CpuSet, policy: CpuBindPolicy, required: bool) -> CpuSet {
    if !required {
        return free;
    }
    let mut out = CpuSet::new();
    for core in topo.cores() {
        let f = core.cpus.intersection(&free);
        match policy {
            CpuBindPolicy::FullPcpus => {
                if !core.cpus.is_empty() && f == core.cpus {
                    out = out.union(&f);
                }
            }
            CpuBindPolicy::SpreadByPcpus => {
                if let Some(c) = f.first() {
                    out.insert(c);
                }
            }
        }
    }
    out
}

/// What the accumulator is asked for.
#[derive(Clone, Copy, Debug)]
pub struct Ask {
    pub need: usize,
    pub policy: CpuBindPolicy,
    pub strategy: NumaAllocateStrategy,
    pub exclusive: CpuExclusivePolicy,
    /// Held CPUs whose holder asked for PCPULevel exclusivity.
    pub pcpu_exclusive: CpuSet,
    /// Held CPUs whose holder asked for NUMANodeLevel exclusivity.
    pub numa_exclusive: CpuSet,
}

/// Takes `ask.need` CPUs out of `free`; `None` when `free` has fewer. Deterministic.
pub fn take_cpus(topo: &CpuTopology, free: CpuSet, ask: &Ask) -> Option<CpuSet> {
    let free = free.intersection(&topo.all());
    if ask.need == 0 {
        return Some(CpuSet::new());
    }
    if free.len() < ask.need {
        return None;
    }
    let acc = Acc {
        topo,
        free,
        ask,
        numas: numa_sockets(topo),
    };
    let full_cores = ask.policy == CpuBindPolicy::FullPcpus || topo.cpus_per_core() == 1;
    let taken = if full_cores {
        acc.full_pcpus()
    } else {
        acc.spread_by_pcpus()
    };
    let taken = match taken {
        Some(t) if t.len() == ask.need => t,
        Some(t) => acc.fallback(t),
        None => acc.fallback(CpuSet::new()),
    };
    (taken.len() == ask.need).then_some(taken)
}

/// (NUMA id, its socket) pairs, ascending NUMA id. A NUMA node's socket is its first CPU's.
fn numa_sockets(topo: &CpuTopology) -> Vec<(NumaId, u32)> {
    topo.numa_ids()
        .map(|n| {
            let socket = topo
                .numa_cpus(n)
                .first()
                .and_then(|c| topo.cpu(c))
                .map_or(0, |d| d.socket);
            (n, socket)
        })
        .collect()
}

struct Acc<'a> {
    topo: &'a CpuTopology,
    free: CpuSet,
    ask: &'a Ask,
    numas: Vec<(NumaId, u32)>,
}

impl Acc<'_> {
    /// A sort key for a free count under the strategy: MostAllocated packs (fewest free first),
    /// LeastAllocated spreads (most free first).
    fn by_strategy(&self, free: usize) -> i64 {
        match self.ask.strategy {
            NumaAllocateStrategy::MostAllocated => free as i64,
            NumaAllocateStrategy::LeastAllocated => -(free as i64),
        }
    }

    /// CPUs of fully free cores inside `region`, in core order ((socket, core) ascending),
    /// hyperthreads ascending within a core.
    fn full_core_cpus(&self, region: CpuSet) -> Vec<CpuId> {
        let mut out = Vec::new();
        for core in self.topo.cores() {
            if !core.cpus.is_empty()
                && core.cpus.is_subset(&self.free)
                && core.cpus.is_subset(&region)
            {
                out.extend(core.cpus.iter());
            }
        }
        out
    }

    /// Free CPUs of `region` in spread order: the first free CPU of every core (core order),
    /// then the second, and so on.
    fn spread_cpus(&self, region: CpuSet) -> Vec<CpuId> {
        let per_core: Vec<Vec<CpuId>> = self
            .topo
            .cores()
            .iter()
            .map(|c| {
                c.cpus
                    .intersection(&self.free)
                    .intersection(&region)
                    .iter()
                    .collect()
            })
            .filter(|v: &Vec<CpuId>| !v.is_empty())
            .collect();
        round_robin(&per_core)
    }

    fn numa_is_exclusive(&self, numa: NumaId) -> bool {
        !self
            .topo
            .numa_cpus(numa)
            .is_disjoint(&self.ask.numa_exclusive)
    }

    /// NUMA ids ordered by (`count` per strategy, `socket_count` of its socket per strategy,
    /// id): koordinator's `freeCPUsInNode` order.
    fn order_numas_by(
        &self,
        count: impl Fn(NumaId) -> usize,
        socket_count: impl Fn(u32) -> usize,
    ) -> Vec<(NumaId, usize)> {
        let mut v: Vec<(NumaId, u32, usize)> =
            self.numas.iter().map(|&(n, s)| (n, s, count(n))).collect();
        v.sort_by_key(|&(n, s, c)| (self.by_strategy(c), self.by_strategy(socket_count(s)), n));
        v.into_iter().map(|(n, _, c)| (n, c)).collect()
    }

    fn order_sockets(&self, count: impl Fn(u32) -> usize) -> Vec<u32> {
        let mut v: Vec<(u32, usize)> = self.topo.sockets().map(|s| (s, count(s))).collect();
        v.sort_by_key(|&(s, c)| (self.by_strategy(c), s));
        v.into_iter().map(|(s, _)| s).collect()
    }

    /// Path A (FullPCPUs, or no SMT): a whole NUMA node's worth of whole cores, else a
    /// socket's, else whole sockets plus whole cores. Returns what it took (maybe short).
    fn full_pcpus(&self) -> Option<CpuSet> {
        let need = self.ask.need;
        if need <= self.topo.cpus_per_numa() {
            let exclusive_pass = self.ask.exclusive == CpuExclusivePolicy::NumaNodeLevel;
            for exclusive in [true, false] {
                if exclusive && !exclusive_pass {
                    continue;
                }
                let lists: Vec<(NumaId, Vec<CpuId>)> = self
                    .numas
                    .iter()
                    .filter(|&&(n, _)| !(exclusive && self.numa_is_exclusive(n)))
                    .map(|&(n, _)| (n, self.full_core_cpus(self.topo.numa_cpus(n))))
                    .collect();
                let len_of = |n: NumaId| offered_len(&lists, n);
                // The socket tie-break counts what the pass admits (`freeCoresInNode`).
                let admitted = if exclusive {
                    self.free
                        .difference(&self.excluded(&CpuSet::new(), false, true))
                } else {
                    self.free
                };
                let socket_admitted =
                    |s: u32| self.topo.socket_cpus(s).intersection(&admitted).len();
                let order = self.order_numas_by(len_of, socket_admitted);
                if let Some(taken) = first_holding(&lists, order.into_iter().map(|(n, _)| n), need)
                {
                    return Some(taken);
                }
            }
        }
        if need <= self.topo.cpus_per_socket() {
            let lists: Vec<(u32, Vec<CpuId>)> = self
                .topo
                .sockets()
                .map(|s| (s, self.full_core_cpus(self.topo.socket_cpus(s))))
                .collect();
            let order = self.order_sockets(|s| offered_len(&lists, s));
            if let Some(taken) = first_holding(&lists, order, need) {
                return Some(taken);
            }
        }
        // No single NUMA node or socket holds it: whole sockets' free cores, largest first,
        // whenever they fit; then whole cores from the set-aside sockets, smallest first.
        let mut lists: Vec<(u32, Vec<CpuId>)> = self
            .topo
            .sockets()
            .map(|s| (s, self.full_core_cpus(self.topo.socket_cpus(s))))
            .collect();
        lists.sort_by_key(|(s, l)| (std::cmp::Reverse(l.len()), *s));
        let mut taken = CpuSet::new();
        let mut aside = Vec::new();
        for (s, list) in lists {
            if !list.is_empty() && list.len() <= need - taken.len() {
                taken = taken.union(&list.iter().copied().collect());
            } else {
                aside.push((s, list));
            }
        }
        aside.sort_by_key(|(s, l)| (l.len(), *s));
        let per_core = self.topo.cpus_per_core();
        for (_, list) in aside {
            for core in list.chunks(per_core) {
                if need - taken.len() < per_core {
                    break;
                }
                if core.len() <= need - taken.len() {
                    for &c in core {
                        taken.insert(c);
                    }
                }
            }
        }
        Some(taken)
    }

    /// Path B (spread, SMT): one NUMA node, else one socket. koordinator's two passes
    /// (`freeCPUsInNode` / `freeCPUsInSocket` with `filterExclusive` true, then false): the
    /// first offers one CPU per core and leaves out CPUs the pod's exclusivity avoids, so a
    /// region that can give every CPU its own core wins over one that cannot; the second
    /// offers every free CPU, round-robin across cores. NUMA nodes are ordered by the CPUs the
    /// pass admits (then their socket's, then id), sockets by the length of what they offer.
    fn spread_by_pcpus(&self) -> Option<CpuSet> {
        let need = self.ask.need;
        if need <= self.topo.cpus_per_numa() {
            for first_pass in [true, false] {
                let usable = if first_pass {
                    self.free
                        .difference(&self.excluded(&CpuSet::new(), true, true))
                } else {
                    self.free
                };
                let offer = |region: CpuSet| {
                    if first_pass {
                        self.one_per_core(region.intersection(&usable))
                    } else {
                        self.spread_cpus(region.intersection(&usable))
                    }
                };
                let lists: Vec<(NumaId, Vec<CpuId>)> = self
                    .numas
                    .iter()
                    .map(|&(n, _)| (n, offer(self.topo.numa_cpus(n))))
                    .collect();
                let order = self.order_numas_by(
                    |n| self.topo.numa_cpus(n).intersection(&usable).len(),
                    |s| self.topo.socket_cpus(s).intersection(&usable).len(),
                );
                if let Some(taken) = first_holding(&lists, order.into_iter().map(|(n, _)| n), need)
                {
                    return Some(taken);
                }
            }
        }
        if need <= self.topo.cpus_per_socket() {
            for first_pass in [true, false] {
                let usable = if first_pass {
                    self.free
                        .difference(&self.excluded(&CpuSet::new(), true, false))
                } else {
                    self.free
                };
                let lists: Vec<(u32, Vec<CpuId>)> = self
                    .topo
                    .sockets()
                    .map(|s| {
                        let region = self.topo.socket_cpus(s).intersection(&usable);
                        let list = if first_pass {
                            self.one_per_core(region)
                        } else {
                            self.spread_cpus(region)
                        };
                        (s, list)
                    })
                    .collect();
                let order = self.order_sockets(|s| offered_len(&lists, s));
                if let Some(taken) = first_holding(&lists, order, need) {
                    return Some(taken);
                }
            }
        }
        None
    }

    /// The first free CPU of every core of `region`, in core order (koordinator's
    /// `extractCPU` over ascending CPU ids).
    fn one_per_core(&self, region: CpuSet) -> Vec<CpuId> {
        self.topo
            .cores()
            .iter()
            .filter_map(|c| c.cpus.intersection(&region).first())
            .collect()
    }

    /// The CPUs koordinator's "with exclusivity" passes leave out, for a pod that asks for
    /// exclusivity: with PCPULevel (`pcpu`), every CPU of a core an exclusive holder or this
    /// pod (`taken`) has a CPU of; with NUMANodeLevel (`numa`), every CPU of such a NUMA node.
    fn excluded(&self, taken: &CpuSet, pcpu: bool, numa: bool) -> CpuSet {
        let mut out = CpuSet::new();
        match self.ask.exclusive {
            CpuExclusivePolicy::PcpuLevel if pcpu => {
                let held = self.ask.pcpu_exclusive.union(taken);
                for core in self.topo.cores() {
                    if !core.cpus.is_disjoint(&held) {
                        out = out.union(&core.cpus);
                    }
                }
            }
            CpuExclusivePolicy::NumaNodeLevel if numa => {
                let held = self.ask.numa_exclusive.union(taken);
                for &(n, _) in &self.numas {
                    let cpus = self.topo.numa_cpus(n);
                    if !cpus.is_disjoint(&held) {
                        out = out.union(&cpus);
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// Path C (both policies; koordinator's last stage, `freeCPUs` + `spreadCPUs`): tops
    /// `taken` up to the need from every core with a free CPU, in two passes (first leaving
    /// out what the pod's exclusivity avoids, counting the cores and NUMA nodes it has taken
    /// so far, then everything). Within a pass cores are ordered to stay in the socket already
    /// used, then per strategy by the socket's and the NUMA node's free CPUs *left* (after what
    /// was taken), then partially free cores first (so whole cores stay whole for others),
    /// then ids; CPUs are taken round-robin across that order, whatever the bind policy.
    fn fallback(&self, taken: CpuSet) -> CpuSet {
        let mut out = taken;
        for first_pass in [true, false] {
            if out.len() >= self.ask.need {
                break;
            }
            let remaining = self.free.difference(&out);
            let usable = if first_pass {
                remaining.difference(&self.excluded(&out, true, true))
            } else {
                remaining
            };
            let socket_free = |s: u32| self.topo.socket_cpus(s).intersection(&usable).len();
            let numa_free = |n: NumaId| self.topo.numa_cpus(n).intersection(&usable).len();
            let mut cores: Vec<(FallbackKey, Vec<CpuId>)> = Vec::new();
            for core in self.topo.cores() {
                let f: Vec<CpuId> = core.cpus.intersection(&usable).iter().collect();
                if f.is_empty() {
                    continue;
                }
                cores.push((
                    (
                        std::cmp::Reverse(
                            self.topo.socket_cpus(core.socket).intersection(&out).len(),
                        ),
                        self.by_strategy(socket_free(core.socket)),
                        self.by_strategy(numa_free(core.numa)),
                        f.len(),
                        core.socket,
                        core.core,
                    ),
                    f,
                ));
            }
            cores.sort_by_key(|c| c.0);
            let order = round_robin(&cores.into_iter().map(|c| c.1).collect::<Vec<_>>());
            for c in order {
                if out.len() >= self.ask.need {
                    break;
                }
                out.insert(c);
            }
        }
        out
    }
}

/// Fallback order of a core: (CPUs already picked in its socket (descending), socket free per
/// strategy, NUMA free per strategy, its free CPUs (ascending: partially used cores first),
/// socket, core).
type FallbackKey = (std::cmp::Reverse<usize>, i64, i64, usize, u32, u32);

/// The first element of every list, then the second, and so on.
/// How many CPUs region `key` offers (0 when it offers none).
fn offered_len<K: PartialEq>(lists: &[(K, Vec<CpuId>)], key: K) -> usize {
    lists
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(0, |(_, l)| l.len())
}

/// The first region, in `order`, whose offer holds the request: the first `need` CPUs it
/// offers (`need` ≥ 1: `take_cpus` answers 0 itself). The one loop of every path and pass.
fn first_holding<K: PartialEq>(
    lists: &[(K, Vec<CpuId>)],
    order: impl IntoIterator<Item = K>,
    need: usize,
) -> Option<CpuSet> {
    order.into_iter().find_map(|key| {
        let (_, list) = lists.iter().find(|(k, _)| *k == key)?;
        (list.len() >= need).then(|| list[..need].iter().copied().collect())
    })
}

fn round_robin(lists: &[Vec<CpuId>]) -> Vec<CpuId> {
    let longest = lists.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::with_capacity(lists.iter().map(Vec::len).sum());
    for i in 0..longest {
        for l in lists {
            if let Some(&c) = l.get(i) {
                out.push(c);
            }
        }
    }
    out
}

/// Test and bench topologies: koordinator's test helper layout (CPU ids sequential, the
/// hyperthreads of a core adjacent; sockets × NUMA nodes per socket × cores per NUMA node ×
/// threads per core).
pub fn synthetic_topology(
    sockets: u32,
    numa_per_socket: u32,
    cores_per_numa: u32,
    threads: u32,
) -> CpuTopology {
    let mut details = Vec::new();
    let mut id = 0;
    for s in 0..sockets {
        for n in 0..numa_per_socket {
            for c in 0..cores_per_numa {
                for _ in 0..threads {
                    details.push(super::CpuDetail {
                        id,
                        // Core ids restart per socket, as Linux numbers them.
                        core: n * cores_per_numa + c,
                        socket: s,
                        numa: s * numa_per_socket + n,
                    });
                    id += 1;
                }
            }
        }
    }
    // Sizes come from the callers' constants, all far below the CpuSet and NUMA limits.
    CpuTopology::new(details).unwrap_or_else(|e| panic!("synthetic topology: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        s.parse().unwrap()
    }

    fn ask(need: usize, policy: CpuBindPolicy, strategy: NumaAllocateStrategy) -> Ask {
        Ask {
            need,
            policy,
            strategy,
            exclusive: CpuExclusivePolicy::None,
            pcpu_exclusive: CpuSet::new(),
            numa_exclusive: CpuSet::new(),
        }
    }

    fn take(topo: &CpuTopology, allocated: &str, a: Ask) -> String {
        let free = topo.all().difference(&set(allocated));
        take_cpus(topo, free, &a).map_or("none".into(), |s| s.to_string())
    }

    use CpuBindPolicy::{FullPcpus, SpreadByPcpus};
    use NumaAllocateStrategy::{LeastAllocated, MostAllocated};

    // Vectors from koordinator's cpu_accumulator_test.go.
    #[test]
    fn full_pcpus_within_one_numa_node_packs_or_spreads() {
        let t = synthetic_topology(2, 2, 4, 2);
        assert_eq!(
            take(&t, "0-5,16-23", ask(6, FullPcpus, MostAllocated)),
            "24-29"
        );
        assert_eq!(
            take(&t, "0-5,16-23", ask(6, FullPcpus, LeastAllocated)),
            "8-13"
        );
        assert_eq!(
            take(&t, "0-3,8-11", ask(4, FullPcpus, MostAllocated)),
            "4-7"
        );
        assert_eq!(
            take(&t, "0-3,8-11", ask(4, FullPcpus, LeastAllocated)),
            "16-19"
        );
    }

    #[test]
    fn full_pcpus_beyond_one_numa_node_takes_a_socket_then_whole_cores() {
        let t = synthetic_topology(2, 2, 4, 2);
        for s in [MostAllocated, LeastAllocated] {
            assert_eq!(take(&t, "0-5,16-23", ask(12, FullPcpus, s)), "6-15,24-25");
        }
        let t = synthetic_topology(2, 1, 4, 2);
        for s in [MostAllocated, LeastAllocated] {
            assert_eq!(take(&t, "0,1", ask(8, FullPcpus, s)), "8-15");
            assert_eq!(take(&t, "", ask(12, FullPcpus, s)), "0-11");
        }
    }

    #[test]
    fn full_pcpus_falls_back_to_a_socket() {
        let t = synthetic_topology(2, 2, 2, 2);
        assert_eq!(
            take(&t, "0,2,4,8,12", ask(4, FullPcpus, MostAllocated)),
            "10-11,14-15"
        );
    }

    #[test]
    fn spread_order_is_round_robin_across_cores() {
        let t = synthetic_topology(2, 2, 4, 2);
        let a = Acc {
            topo: &t,
            free: t.all(),
            ask: &ask(32, SpreadByPcpus, MostAllocated),
            numas: numa_sockets(&t),
        };
        let order = a.spread_cpus(t.all());
        let expected: Vec<CpuId> = (0..32).step_by(2).chain((1..32).step_by(2)).collect();
        assert_eq!(order, expected);
        // Spreading within one NUMA node: one thread per core first.
        assert_eq!(
            take(&t, "", ask(4, SpreadByPcpus, MostAllocated)),
            "0,2,4,6"
        );
        assert_eq!(take(&t, "", ask(6, SpreadByPcpus, MostAllocated)), "0-4,6");
    }

    #[test]
    fn fallback_fills_every_cpu_and_stays_inside_free() {
        let t = synthetic_topology(2, 2, 4, 2);
        for p in [FullPcpus, SpreadByPcpus] {
            for s in [MostAllocated, LeastAllocated] {
                assert_eq!(take(&t, "0-3", ask(28, p, s)), "4-31");
                assert_eq!(take(&t, "0-3", ask(29, p, s)), "none");
            }
        }
    }

    #[test]
    fn required_restrictions() {
        let t = synthetic_topology(1, 1, 4, 2);
        let free = t.all().difference(&set("0,3"));
        assert_eq!(eligible(&t, free, FullPcpus, true).to_string(), "4-7");
        assert_eq!(
            eligible(&t, free, SpreadByPcpus, true).to_string(),
            "1-2,4,6"
        );
        assert_eq!(eligible(&t, free, SpreadByPcpus, false), free);
    }

    #[test]
    fn exclusivity_is_a_preference() {
        let t = synthetic_topology(1, 2, 2, 2);
        // NUMA 0 (0-3) holds a NUMANodeLevel CPU: an exclusive pod goes to NUMA 1 even when
        // packing would choose NUMA 0, and still fits when only NUMA 0 has room.
        let mut a = ask(2, FullPcpus, MostAllocated);
        a.exclusive = CpuExclusivePolicy::NumaNodeLevel;
        a.numa_exclusive = set("0");
        assert_eq!(take(&t, "0-1", a), "4-5");
        assert_eq!(take(&t, "0-1,4-7", a), "2-3");
        // PCPULevel: avoid the core whose sibling an exclusive pod holds.
        let mut a = ask(1, SpreadByPcpus, MostAllocated);
        a.exclusive = CpuExclusivePolicy::PcpuLevel;
        a.pcpu_exclusive = set("0");
        assert_eq!(take(&t, "0", a), "2");
        assert_eq!(take(&t, "0,2-7", a), "1");
    }
}
