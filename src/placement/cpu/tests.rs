//! Table tests of [`super::place`]: policies, hints and merge, GPU alignment, 8-NUMA nodes.

use super::accumulator::synthetic_topology;
use super::*;

pub(crate) const GI: i64 = 1 << 30;

/// An owned node for building [`NodeCpuView`]s in tests.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub topo: CpuTopology,
    pub zones: Vec<NumaZone>,
    pub usage: Vec<NumaUsage>,
    pub reserved: CpuSet,
    pub allocated: CpuSet,
    /// Free CPUs kept for NUMA nodes' shared pools (see [`NodeCpuView::shared_pool`]).
    pub shared_pool: CpuSet,
    pub pcpu_exclusive: CpuSet,
    pub numa_exclusive: CpuSet,
    pub bind_policy: NodeCpuBindPolicy,
    pub numa_policy: NumaPolicy,
    pub strategy: NumaAllocateStrategy,
    pub amplification: NumaAmplification,
}

impl Node {
    /// Zones sized from the topology (1 CPU = 1000m, `mem_per_numa` each), nothing used.
    pub fn new(topo: CpuTopology, mem_per_numa: i64) -> Self {
        let zones: Vec<NumaZone> = topo
            .numa_ids()
            .map(|id| NumaZone {
                id,
                cpu_milli: topo.numa_cpus(id).len() as i64 * 1000,
                memory_bytes: mem_per_numa,
            })
            .collect();
        let usage = vec![NumaUsage::default(); zones.len()];
        Node {
            topo,
            zones,
            usage,
            reserved: CpuSet::new(),
            allocated: CpuSet::new(),
            shared_pool: CpuSet::new(),
            pcpu_exclusive: CpuSet::new(),
            numa_exclusive: CpuSet::new(),
            bind_policy: NodeCpuBindPolicy::None,
            numa_policy: NumaPolicy::None,
            strategy: NumaAllocateStrategy::MostAllocated,
            amplification: NumaAmplification::default(),
        }
    }

    pub fn view(&self) -> NodeCpuView<'_> {
        NodeCpuView {
            topology: &self.topo,
            reserved: self.reserved,
            shared_pool: self.shared_pool,
            allocated: self.allocated,
            pcpu_exclusive: self.pcpu_exclusive,
            numa_exclusive: self.numa_exclusive,
            zones: &self.zones,
            usage: &self.usage,
            bind_policy: self.bind_policy,
            numa_policy: self.numa_policy,
            strategy: self.strategy,
            amplification: self.amplification,
        }
    }

    /// Marks `cpus` as held by a cpuset pod, with matching NUMA usage.
    pub fn hold(&mut self, cpus: &str) {
        let set: CpuSet = cpus.parse().unwrap();
        self.allocated = self.allocated.union(&set);
        let mut touched = 0;
        for (i, z) in self.zones.iter().enumerate() {
            let n = self.topo.numa_cpus(z.id).intersection(&set).len() as i64;
            if n > 0 {
                self.usage[i].cpu_milli += n * 1000;
                touched += 1;
            }
        }
        for (i, z) in self.zones.iter().enumerate() {
            if !self.topo.numa_cpus(z.id).is_disjoint(&set) {
                if touched > 1 {
                    self.usage[i].multi_numa_pods += 1;
                } else {
                    self.usage[i].single_numa_pods += 1;
                }
            }
        }
    }
}

pub(crate) fn cpuset_pod(cpus: i64, policy: CpuBindPolicy, required: bool) -> PodCpuRequest {
    PodCpuRequest {
        cpu_milli: cpus * 1000,
        memory_bytes: GI,
        cpuset: Some(CpusetWish {
            policy,
            required,
            exclusive: CpuExclusivePolicy::None,
        }),
        numa_policy: NumaPolicy::None,
        numa_exclusive: NumaExclusive::Unset,
    }
}

fn place_on(node: &Node, req: &PodCpuRequest) -> Result<Option<CpuPlacement>, FitError> {
    place(&node.view(), req, None, &CpuScoring::default())
}

fn two_numa() -> Node {
    // 1 socket, 2 NUMA nodes × 4 cores × 2 threads: NUMA 0 = 0-7, NUMA 1 = 8-15.
    Node::new(synthetic_topology(1, 2, 4, 2), 16 * GI)
}

#[test]
fn plain_pods_and_policy_free_nodes_are_untouched() {
    let node = two_numa();
    let plain = PodCpuRequest {
        cpu_milli: 1500,
        memory_bytes: GI,
        ..Default::default()
    };
    assert_eq!(place_on(&node, &plain), Ok(None));
}

#[test]
fn cpuset_without_numa_policy_is_checked_in_filter_too() {
    let mut node = two_numa();
    node.hold("0-13");
    // Preferred-only FullPCPUs pod: koordinator would not check it in Filter (koordinator nodenumaresource `Filter`).
    let req = cpuset_pod(4, CpuBindPolicy::FullPcpus, false);
    let e = place_on(&node, &req).unwrap_err();
    assert_eq!(e.reason, "insufficient free cpus");
    assert!(!e.unresolvable);
    let req = cpuset_pod(2, CpuBindPolicy::FullPcpus, false);
    let p = place_on(&node, &req).unwrap().unwrap();
    assert_eq!(p.cpuset.to_string(), "14-15");
    assert!(p.numa.is_empty());
    assert_eq!(p.affinity, None);
    let too_big = cpuset_pod(17, CpuBindPolicy::FullPcpus, false);
    assert!(place_on(&node, &too_big).unwrap_err().unresolvable);
}

#[test]
fn reserved_cpus_are_never_handed_out() {
    let mut node = two_numa();
    node.reserved = "0-1".parse().unwrap();
    let p = place_on(&node, &cpuset_pod(14, CpuBindPolicy::SpreadByPcpus, false))
        .unwrap()
        .unwrap();
    assert_eq!(p.cpuset.to_string(), "2-15");
    let e = place_on(&node, &cpuset_pod(15, CpuBindPolicy::SpreadByPcpus, false)).unwrap_err();
    assert_eq!(e.reason, "cpu request larger than the node");
    assert!(e.unresolvable);
}

#[test]
fn required_full_pcpus_counts_whole_free_cores_only() {
    let mut node = two_numa();
    // One thread of every core but the last on NUMA 1 is taken.
    node.hold("0,2,4,6,8,10,12");
    let req = cpuset_pod(2, CpuBindPolicy::FullPcpus, true);
    assert_eq!(
        place_on(&node, &req).unwrap().unwrap().cpuset.to_string(),
        "14-15"
    );
    let e = place_on(&node, &cpuset_pod(4, CpuBindPolicy::FullPcpus, true)).unwrap_err();
    assert_eq!(e.reason, "insufficient free cpus");
    assert!(!e.unresolvable);
    // Preferred only: fits on the half-free cores.
    let p = place_on(&node, &cpuset_pod(4, CpuBindPolicy::FullPcpus, false))
        .unwrap()
        .unwrap();
    assert_eq!(p.cpuset.len(), 4);
}

#[test]
fn single_numa_node_places_on_one_numa_and_records_its_share() {
    let mut node = two_numa();
    node.numa_policy = NumaPolicy::SingleNumaNode;
    node.hold("0-3");
    let p = place_on(&node, &cpuset_pod(4, CpuBindPolicy::FullPcpus, true))
        .unwrap()
        .unwrap();
    // MostAllocated packs onto NUMA 0 (4 free) rather than NUMA 1 (8 free)... but the NUMA
    // hint score (LeastAllocated by default) ranks the emptier NUMA 1 first.
    assert_eq!(p.affinity, Some(NumaMask::single(1)));
    assert_eq!(p.cpuset.to_string(), "8-11");
    assert_eq!(
        p.numa,
        vec![NumaShare {
            numa: 1,
            cpu_milli: 4000,
            memory_bytes: GI
        }]
    );
    let most = CpuScoring {
        numa_strategy: CpuScoreStrategy::MostAllocated,
        ..CpuScoring::default()
    };
    let p = place(
        &node.view(),
        &cpuset_pod(4, CpuBindPolicy::FullPcpus, true),
        None,
        &most,
    )
    .unwrap()
    .unwrap();
    assert_eq!(p.affinity, Some(NumaMask::single(0)));
    assert_eq!(p.cpuset.to_string(), "4-7");
}

/// A request that fits only across two NUMA nodes right now (each has 4 free of 8): Restricted
/// and SingleNUMANode reject (resolvable: it fits one NUMA node by capacity), BestEffort admits.
#[test]
fn fits_only_across_two_numa_nodes() {
    let mut node = two_numa();
    node.hold("0-3");
    node.hold("8-11");
    let req = cpuset_pod(6, CpuBindPolicy::FullPcpus, true);
    node.numa_policy = NumaPolicy::SingleNumaNode;
    let e = place_on(&node, &req).unwrap_err();
    assert_eq!(e.reason, "insufficient cpus on one NUMA node");
    assert!(!e.unresolvable);
    node.numa_policy = NumaPolicy::Restricted;
    let e = place_on(&node, &req).unwrap_err();
    assert_eq!(e.reason, "insufficient resources on the fewest NUMA nodes");
    assert!(!e.unresolvable);
    node.numa_policy = NumaPolicy::BestEffort;
    let p = place_on(&node, &req).unwrap().unwrap();
    assert_eq!(p.affinity, Some(NumaMask(0b11)));
    assert_eq!(p.cpuset.len(), 6);
    assert_eq!(p.numa.iter().map(|s| s.cpu_milli).sum::<i64>(), 6000);
    assert_eq!(p.numa.iter().map(|s| s.memory_bytes).sum::<i64>(), GI);
    // The split is by whole cores: 2 cores on one NUMA node, 1 on the other.
    let mut per_numa: Vec<i64> = p.numa.iter().map(|s| s.cpu_milli).collect();
    per_numa.sort();
    assert_eq!(per_numa, vec![2000, 4000]);
}

/// Larger than any NUMA node by capacity: SingleNUMANode can never take it (unresolvable);
/// Restricted prefers the 2-NUMA hint (kubelet: minimal size by capacity is 2) and admits.
#[test]
fn larger_than_any_numa_node() {
    let mut node = two_numa();
    let req = cpuset_pod(10, CpuBindPolicy::FullPcpus, true);
    node.numa_policy = NumaPolicy::SingleNumaNode;
    let e = place_on(&node, &req).unwrap_err();
    assert_eq!(e.reason, "cpu request larger than any NUMA node");
    assert!(e.unresolvable);
    node.numa_policy = NumaPolicy::Restricted;
    let p = place_on(&node, &req).unwrap().unwrap();
    assert_eq!(p.affinity, Some(NumaMask(0b11)));
    assert_eq!(p.cpuset.len(), 10);
    let huge = cpuset_pod(18, CpuBindPolicy::FullPcpus, true);
    let e = place_on(&node, &huge).unwrap_err();
    assert_eq!(e.reason, "cpu request larger than the node");
    assert!(e.unresolvable);
}

#[test]
fn memory_counts_per_numa_node_for_pods_without_cpusets() {
    let mut node = two_numa();
    node.numa_policy = NumaPolicy::SingleNumaNode;
    node.usage[0].memory_bytes = 12 * GI;
    let req = PodCpuRequest {
        cpu_milli: 1500,
        memory_bytes: 8 * GI,
        ..Default::default()
    };
    let p = place_on(&node, &req).unwrap().unwrap();
    assert!(p.cpuset.is_empty());
    assert_eq!(
        p.numa,
        vec![NumaShare {
            numa: 1,
            cpu_milli: 1500,
            memory_bytes: 8 * GI
        }]
    );
    node.usage[1].memory_bytes = 12 * GI;
    let e = place_on(&node, &req).unwrap_err();
    assert_eq!(e.reason, "insufficient memory on one NUMA node");
    let e = place_on(
        &node,
        &PodCpuRequest {
            memory_bytes: 17 * GI,
            ..req
        },
    )
    .unwrap_err();
    assert_eq!(e.reason, "memory request larger than any NUMA node");
    assert!(e.unresolvable);
}

#[test]
fn exclusive_pods_avoid_shared_numa_nodes() {
    let mut node = two_numa();
    // A pod spans both NUMA nodes (one CPU each).
    node.hold("0,8");
    let mut req = cpuset_pod(2, CpuBindPolicy::FullPcpus, false);
    req.numa_policy = NumaPolicy::SingleNumaNode; // pod-set: exclusivity defaults to Required
    let e = place_on(&node, &req).unwrap_err();
    assert_eq!(
        e.reason,
        "numa exclusivity: every fitting NUMA node is shared"
    );
    assert!(!e.unresolvable);
    req.numa_exclusive = NumaExclusive::Preferred;
    assert!(place_on(&node, &req).unwrap().is_some());
    // Node-set policy only: exclusivity is not required.
    req.numa_exclusive = NumaExclusive::Unset;
    req.numa_policy = NumaPolicy::None;
    node.numa_policy = NumaPolicy::SingleNumaNode;
    assert!(place_on(&node, &req).unwrap().is_some());
}

/// GPU alignment: free GPUs only on NUMA 1. Under every NUMA policy the cpuset lands on
/// NUMA 1; with NUMA policy None the callback is never consulted.
#[test]
fn cpuset_follows_the_gpus() {
    for policy in [
        NumaPolicy::SingleNumaNode,
        NumaPolicy::Restricted,
        NumaPolicy::BestEffort,
    ] {
        let mut node = two_numa();
        node.numa_policy = policy;
        let mut asked = Vec::new();
        let mut gpus = |m: NumaMask| {
            asked.push(m);
            m.contains(1)
        };
        let p = place(
            &node.view(),
            &cpuset_pod(4, CpuBindPolicy::FullPcpus, true),
            Some(&mut gpus),
            &CpuScoring::default(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.affinity, Some(NumaMask::single(1)), "{policy:?}");
        assert!(
            p.cpuset.is_subset(&node.topo.numa_cpus(1)),
            "{policy:?}: {}",
            p.cpuset
        );
        assert_eq!(p.numa.len(), 1);
        assert_eq!(p.numa[0].numa, 1);
        assert!(asked.contains(&NumaMask::single(0)));
    }
    let node = two_numa();
    let mut called = false;
    let mut gpus = |_: NumaMask| {
        called = true;
        true
    };
    let p = place(
        &node.view(),
        &cpuset_pod(4, CpuBindPolicy::FullPcpus, true),
        Some(&mut gpus),
        &CpuScoring::default(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(p.affinity, None);
    assert!(!called);
}

#[test]
fn gpus_that_need_two_numa_nodes_pull_the_pod_across() {
    // Devices fit only on both NUMA nodes together; CPUs fit on one. Restricted: the device
    // provider prefers size 2, the CPU provider size 1 → no merged preferred hint → reject.
    // BestEffort admits on both.
    let mut node = two_numa();
    let req = cpuset_pod(4, CpuBindPolicy::FullPcpus, true);
    node.numa_policy = NumaPolicy::Restricted;
    let mut both = |m: NumaMask| m.count() == 2;
    let e = place(&node.view(), &req, Some(&mut both), &CpuScoring::default()).unwrap_err();
    assert!(!e.unresolvable);
    node.numa_policy = NumaPolicy::BestEffort;
    let p = place(&node.view(), &req, Some(&mut both), &CpuScoring::default())
        .unwrap()
        .unwrap();
    assert_eq!(p.affinity, Some(NumaMask(0b11)));
    node.numa_policy = NumaPolicy::SingleNumaNode;
    let e = place(&node.view(), &req, Some(&mut both), &CpuScoring::default()).unwrap_err();
    assert_eq!(e.reason, "devices and cpus not on the same NUMA nodes");
}

#[test]
fn devices_only_pod_gets_an_affinity() {
    let mut node = two_numa();
    node.numa_policy = NumaPolicy::SingleNumaNode;
    let req = PodCpuRequest::default();
    let mut gpus = |m: NumaMask| m == NumaMask::single(1);
    let p = place(&node.view(), &req, Some(&mut gpus), &CpuScoring::default())
        .unwrap()
        .unwrap();
    assert_eq!(p.affinity, Some(NumaMask::single(1)));
    assert!(p.cpuset.is_empty() && p.numa.is_empty());
}

/// 8 NUMA nodes (255 subsets). Free room: 2 CPUs on every NUMA node but 7, which has 8.
#[test]
fn eight_numa_nodes() {
    let mut node = Node::new(synthetic_topology(2, 4, 4, 2), 16 * GI);
    for n in 0..7 {
        let base = n * 8;
        node.hold(&format!("{}-{}", base, base + 5));
    }
    node.numa_policy = NumaPolicy::SingleNumaNode;
    let p = place_on(&node, &cpuset_pod(8, CpuBindPolicy::FullPcpus, true))
        .unwrap()
        .unwrap();
    assert_eq!(p.affinity, Some(NumaMask::single(7)));
    assert_eq!(p.cpuset.to_string(), "56-63");
    node.hold("56-57");
    // 8 CPUs now fit on no single NUMA node; BestEffort takes the narrowest pair holding
    // them: NUMA 7 (6 free) with one 2-free node; Restricted rejects; SingleNUMANode too.
    node.numa_policy = NumaPolicy::BestEffort;
    let p = place_on(&node, &cpuset_pod(8, CpuBindPolicy::FullPcpus, true))
        .unwrap()
        .unwrap();
    assert_eq!(p.affinity.map(|m| m.count()), Some(2));
    assert!(p.affinity.is_some_and(|m| m.contains(7)));
    assert_eq!(p.cpuset.len(), 8);
    node.numa_policy = NumaPolicy::Restricted;
    assert!(
        !place_on(&node, &cpuset_pod(8, CpuBindPolicy::FullPcpus, true))
            .unwrap_err()
            .unresolvable
    );
    // 40 CPUs: needs every NUMA node's free cores (7×2 + 6 = 20 < 40) → resolvable failure;
    // 20 fits exactly across all eight under BestEffort.
    node.numa_policy = NumaPolicy::BestEffort;
    let p = place_on(&node, &cpuset_pod(20, CpuBindPolicy::FullPcpus, true))
        .unwrap()
        .unwrap();
    assert_eq!(p.affinity, Some(NumaMask(0xff)));
    assert_eq!(p.cpuset.len(), 20);
    let e = place_on(&node, &cpuset_pod(40, CpuBindPolicy::FullPcpus, true)).unwrap_err();
    assert!(!e.unresolvable);
}

#[test]
fn scores_least_and_most_allocated() {
    let mut node = two_numa();
    node.hold("0-7");
    let req = cpuset_pod(4, CpuBindPolicy::FullPcpus, false);
    // Node level, LeastAllocated: cpu (16000-8000-4000)/16000 = 25; memory (32-0-1)/32 → 96.
    let p = place_on(&node, &req).unwrap().unwrap();
    assert_eq!(p.score, (25 + 96) / 2);
    let most = CpuScoring {
        node_strategy: CpuScoreStrategy::MostAllocated,
        ..CpuScoring::default()
    };
    let p = place(&node.view(), &req, None, &most).unwrap().unwrap();
    // cpu 75, memory 1/32 → 3.
    assert_eq!(p.score, (75 + 3) / 2);
    // A failing trial scores 0 for prioritize.
    node.hold("8-15");
    assert_eq!(score_or_zero(&node.view(), &req, None, &most), Some(0));
    assert_eq!(
        score_or_zero(&node.view(), &PodCpuRequest::default(), None, &most),
        None
    );
}

/// Hint merge on a 4-NUMA node (4 CPUs = 2 cores each) for a 6-CPU whole-core pod, which needs
/// two NUMA nodes by capacity: exclusivity demotes pairs touching NUMA nodes that single-NUMA
/// pods hold, then the NUMA score and the lowest ids decide.
#[test]
fn hint_merge_table_on_four_numa_nodes() {
    let most = CpuScoring {
        numa_strategy: CpuScoreStrategy::MostAllocated,
        ..CpuScoring::default()
    };
    let mut req = cpuset_pod(6, CpuBindPolicy::FullPcpus, true);
    req.numa_policy = NumaPolicy::Restricted;
    let run = |node: &Node, req: &PodCpuRequest, scoring: &CpuScoring| {
        place(&node.view(), req, None, scoring).map(|p| p.and_then(|p| p.affinity))
    };
    let mut node = Node::new(synthetic_topology(2, 2, 2, 2), 16 * GI);
    node.hold("0-3"); // NUMA 0 full, held by a single-NUMA pod
    // Equal scores among the free pairs: the lowest ids win.
    assert_eq!(
        run(&node, &req, &CpuScoring::default()),
        Ok(Some(NumaMask(0b0110)))
    );
    node.hold("4-5"); // NUMA 1 half held by another single-NUMA pod
    // Not demoted (Preferred): MostAllocated ranks the fuller pair {1,2} first.
    req.numa_exclusive = NumaExclusive::Preferred;
    assert_eq!(run(&node, &req, &most), Ok(Some(NumaMask(0b0110))));
    // Required: {1,2} and {1,3} touch NUMA 1's single-NUMA pod and are demoted; {2,3} wins.
    req.numa_exclusive = NumaExclusive::Required;
    assert_eq!(run(&node, &req, &most), Ok(Some(NumaMask(0b1100))));
    // BestEffort admits a demoted hint when nothing else fits.
    node.hold("12-13");
    req.numa_policy = NumaPolicy::BestEffort;
    let got = run(&node, &req, &most).unwrap().unwrap();
    assert_eq!(got.count(), 2);
    req.numa_policy = NumaPolicy::Restricted;
    let e = run(&node, &req, &most).unwrap_err();
    assert_eq!(
        e.reason,
        "numa exclusivity: every fitting NUMA node is shared"
    );
    assert!(!e.unresolvable);
}
