//! The read verbs' fast path: filter's and prioritize's answers from a node's snapshot view
//! ([`NodeView`]), which equal the full decision's (`decide`) wherever they answer (property
//! tests below) and defer to it (`None`) where they cannot. What aligned decisions share
//! between the nodes of one request is kept in [`AlignedMemo`].

use super::aligned_memo::AlignedMemo;
use super::config::ScoringConfig;
use super::decide::{combine, needs_topology, no_topology_error};
use super::needs::PodNeeds;
use crate::cluster::snapshot::{CpuFacts, DeviceView, NodeView};
use crate::placement::cpu::hints::reason;
use crate::placement::cpu::{
    NumaMask, NumaPolicy, PodCpuRequest, fast_aligned, fast_aligned_score, fast_feasible,
    fast_score,
};
use crate::placement::device::allocate::FitError;
use crate::placement::device::deviceless::deviceless_fit;
use crate::placement::device::dra_served::{DraServes, dra_serves, split_error};
use crate::placement::device::fast::{self as fast_device, FastRequest};
use crate::placement::device::request::PodDeviceRequest;

/// Filter's memo of aligned decisions: the CPU side's affinity or error.
pub type FitMemo = AlignedMemo<Result<Option<NumaMask>, crate::placement::FitError>>;
/// Prioritize's memo of aligned decisions: the CPU score.
pub type ScoreMemo = AlignedMemo<Option<i64>>;

/// Filter's verdict from a node's snapshot view (`None`: the caches know no such node):
/// `Some` exactly as `decide(node, needs, &[], ..)` answers, `None` when only the full
/// decision can (a joint device request, devices the index cannot carry, and the few aligned
/// cases where the summaries cannot name the reason). `shared`: one per request and pod, over
/// every node of the request.
pub fn snapshot_fit(
    node: Option<NodeView<'_>>,
    needs: &PodNeeds,
    fast: Option<&FastRequest>,
    scoring: &ScoringConfig,
    shared: &mut FitMemo,
) -> Option<Result<(), FitError>> {
    if let (Some(n), Some(d)) = (node, &needs.devices) {
        match dra_serves(d.asked, n.dra_served) {
            DraServes::Nothing => {}
            DraServes::Part(dra) => return Some(Err(split_error(dra))),
            // Only the CPU half is ours here: decided in full (rare: a KEP-5004 split).
            DraServes::Everything => return None,
        }
    }
    if partitions_decide(node, needs) {
        return partition_fit(node?, needs, fast?, scoring);
    }
    if let Some(req) = &needs.cpu {
        match cpu_fast_check(node.map(|n| n.cpu), req, needs.devices.is_some(), scoring) {
            Some(Err(e)) => return Some(Err(e)),
            Some(Ok(())) => {}
            None => return aligned_check(node?, needs, fast?, scoring, shared),
        }
    }
    match (&needs.devices, node) {
        (None, _) => Some(Ok(())),
        (Some(d), None) => Some(deviceless_fit(false, None, d.asked)),
        (Some(d), Some(n)) => device_check(n.devices, d, fast?),
    }
}

/// Whether GPU partition rules may decide this pod on this node, which only the full allocator
/// checks: a whole-GPU request on a node that honours its partitions, or from a pod whose
/// `gpu-partition-spec` honours them everywhere. (Where partitions are only preferred, a free
/// partition means free whole GPUs, so the verdict is the general one the index gives.)
#[inline]
fn partitions_decide(node: Option<NodeView<'_>>, needs: &PodNeeds) -> bool {
    let Some(devices) = &needs.devices else {
        return false;
    };
    let whole_gpus = devices
        .get(&crate::model::device::DeviceType::Gpu)
        .is_some_and(|r| !r.shared);
    whole_gpus
        && node.is_some_and(|n| {
            (n.honors_partitions || devices.gpu_partition.is_some())
                && !matches!(n.devices, DeviceView::Missing { .. })
        })
}

/// [`snapshot_fit`] where GPU partition rules decide: `decide_on_node`'s answer for a pod
/// asking for whole GPUs only, whose CPU placement cannot narrow its devices to NUMA nodes
/// (else `None`). As the full allocator: the CPU check, then the device structure (too few
/// capable GPUs, a malformed holding), then the partition step.
fn partition_fit(
    node: NodeView<'_>,
    needs: &PodNeeds,
    fast: &FastRequest,
    scoring: &ScoringConfig,
) -> Option<Result<(), FitError>> {
    use crate::model::device::DeviceType;
    use crate::placement::device::partition::{self, NodePartitions};
    let devices = needs.devices.as_ref()?;
    if devices.types.len() != 1 || devices.joint.is_some() {
        return None;
    }
    let gpu = devices.get(&DeviceType::Gpu)?;
    if let Some(req) = &needs.cpu {
        // No NUMA hint can narrow the devices: no policy from the pod or the node, or no
        // usable topology (the full decision then gives no affinity).
        let unaligned = match &node.cpu.summary {
            Err(_) => true,
            Ok(s) => req.numa_policy == NumaPolicy::None && s.numa_policy == NumaPolicy::None,
        };
        if !unaligned {
            return None;
        }
        // As `decide_on_node`: the CPU decision first (`None`: only the aligned path knows).
        if let Err(e) = cpu_fast_check(Some(node.cpu), req, true, scoring)? {
            return Some(Err(e));
        }
    }
    let DeviceView::Indexed(index) = node.devices else {
        return None;
    };
    if let Err(e) = fast_device::structure(index, fast) {
        return Some(Err(e));
    }
    let spec = devices.gpu_partition.as_ref();
    let chosen = match node.partitions {
        // No table and no policy honouring one: only a pod's spec brought us here.
        None => partition::choose(&NodePartitions::default(), spec, gpu.count, 0, 0),
        Some(facts) if !facts.exact => return None,
        Some(facts) => partition::choose(&facts.node, spec, gpu.count, facts.used, facts.total),
    };
    Some(match chosen {
        Err(e) => Err(e),
        Ok(Some(_)) => Ok(()),
        Ok(None) => fast_device::feasible(index, fast),
    })
}

/// The device half of [`snapshot_fit`] ([`allocate_on`]'s answer).
fn device_check(
    devices: DeviceView<'_>,
    request: &PodDeviceRequest,
    fast: &FastRequest,
) -> Option<Result<(), FitError>> {
    match devices {
        DeviceView::Missing { held, advertised } => {
            Some(deviceless_fit(held, advertised, request.asked))
        }
        DeviceView::Unindexed => None,
        DeviceView::Indexed(index) => Some(fast_device::feasible(index, fast)),
    }
}

/// Filter's CPU check from a node's CPU facts: `Some` when the summary answers (exactly as
/// [`cpu_decision`] would), `None` when only the device-aligned decision can.
fn cpu_fast_check(
    cpu: Option<&CpuFacts>,
    req: &PodCpuRequest,
    has_devices: bool,
    scoring: &ScoringConfig,
) -> Option<Result<(), FitError>> {
    let Some(cpu) = cpu else {
        return Some(if req.cpuset.is_some() {
            Err(no_topology_error())
        } else {
            Ok(())
        });
    };
    // As `cpu_decision`: the amplified CPU first.
    if let Err(e) = cpu
        .amplification
        .check(req.cpu_milli, needs_topology(cpu.bind_policy, req))
    {
        return Some(Err(e));
    }
    // A plain pod (no cpuset wish, no NUMA policy) on a node that forces nothing: nothing to
    // check, and filter must stay cheap for it.
    let plain = req.cpuset.is_none() && req.numa_policy == NumaPolicy::None;
    if plain && !cpu.constrains_plain_pods {
        return Some(Ok(()));
    }
    match &cpu.summary {
        Err(unusable) => Some(if needs_topology(cpu.bind_policy, req) {
            Err(FitError::new(
                unusable.reason.clone(),
                unusable.unresolvable,
            ))
        } else {
            Ok(())
        }),
        Ok(summary) => fast_feasible(summary, req, has_devices, &scoring.cpu),
    }
}

/// Filter's answer when devices must be aligned with the CPUs under a NUMA policy (where
/// [`cpu_fast_check`] defers): the CPU placement with the fast device check per NUMA hint,
/// then the devices within the chosen affinity. `None` where only the full decision can
/// answer or name the reason.
fn aligned_check(
    node: NodeView<'_>,
    needs: &PodNeeds,
    fast: &FastRequest,
    scoring: &ScoringConfig,
    shared: &mut FitMemo,
) -> Option<Result<(), FitError>> {
    let req = needs.cpu.as_ref()?;
    let (DeviceView::Indexed(index), Ok(summary)) = (node.devices, &node.cpu.summary) else {
        return None;
    };
    // Every NUMA hint asks the devices once: one pass over them (per device state, `shared`)
    // answers every mask.
    let (chosen, capacity) = shared.decide_aligned(node.fingerprint, index, fast, |aligned| {
        fast_aligned(summary, req, aligned, &scoring.cpu)
    });
    match chosen {
        Ok(affinity) if capacity.within(fast, affinity).is_ok() => Some(Ok(())),
        Ok(_) => None,
        // As `cpu_decision`: "not aligned" only when the devices fit the node at all.
        Err(e) if e.reason == reason::DEVICES_UNALIGNED => {
            Some(match capacity.within(fast, None) {
                Err(shortage) => Err(shortage),
                Ok(()) => Err(e),
            })
        }
        Err(e) => Some(Err(e)),
    }
}

/// Prioritize's raw 0..=100 score from a node's snapshot view: the device score, the CPU
/// score (`cpu`: the pod asks for CPU placement), or their mean. `None` where only
/// [`full_score`] can answer; equal to it wherever it answers. `shared`: one per request and
/// pod, over every node of the request.
pub fn snapshot_score(
    node: Option<NodeView<'_>>,
    needs: &PodNeeds,
    cpu: Option<&PodCpuRequest>,
    fast: Option<&FastRequest>,
    scoring: &ScoringConfig,
    shared: &mut ScoreMemo,
) -> Option<i64> {
    let Some(node) = node else {
        return Some(0);
    };
    // The aligned CPU score asks the devices per NUMA hint: partition rules decide those.
    if cpu.is_some() && partitions_decide(Some(node), needs) {
        return None;
    }
    let device = match (&needs.devices, node.devices) {
        (None, _) => None,
        (Some(_), DeviceView::Missing { .. }) => Some(0),
        (Some(_), DeviceView::Unindexed) => return None,
        (Some(_), DeviceView::Indexed(index)) => Some(fast_device::score(index, fast?)),
    };
    let cpu = match cpu {
        None => None,
        Some(req) => snapshot_cpu_score(node, req, needs.devices.is_some(), fast, scoring, shared)?,
    };
    Some(combine(device, cpu))
}

/// The CPU score 0..=100 from the summary (inner `None`: no CPU opinion on this node; outer
/// `None`: only the full scorer can answer).
fn snapshot_cpu_score(
    node: NodeView<'_>,
    req: &PodCpuRequest,
    has_devices: bool,
    fast: Option<&FastRequest>,
    scoring: &ScoringConfig,
    shared: &mut ScoreMemo,
) -> Option<Option<i64>> {
    let aligns = has_devices && !matches!(node.devices, DeviceView::Missing { .. });
    let Ok(summary) = &node.cpu.summary else {
        // No usable topology: no CPU opinion (as the full scorer, whose view fails).
        return Some(None);
    };
    if let Some(score) = fast_score(summary, req, aligns, &scoring.cpu) {
        return Some(score);
    }
    if let (true, Some(fr), DeviceView::Indexed(index)) = (aligns, fast, node.devices) {
        let (score, _) = shared.decide_aligned(node.fingerprint, index, fr, |aligned| {
            fast_aligned_score(summary, req, aligned, &scoring.cpu)
        });
        return Some(score);
    }
    None
}

#[cfg(test)]
mod aligned_tests {
    //! Filter's aligned path against the full decision bind makes, on random 2-NUMA nodes.
    use super::*;
    use crate::cluster::NodeState;
    use crate::cluster::cpus::RecordedCpus;
    use crate::cluster::devices::{DeviceSlot, EntryState, NodeDevices, RecordedAllocation};
    use crate::model::cpuset::CpuSet;
    use crate::model::device::{
        DeviceResources, DeviceTopology, DeviceType, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO,
    };
    use crate::model::ids::PodUid;
    use crate::model::pod::Pod;
    use crate::model::quantity::Quantity;
    use crate::placement::cpu::proptests::{Expected, oracle, reference_resolve};
    use crate::placement::cpu::score_or_zero;
    use crate::placement::device::allocate::fit_on_numa;
    use crate::placement::device::allocate::fit_with;
    use crate::placement::device::pod_device_request;
    use crate::placement::device::request::PodDeviceRequest;
    use crate::scheduler::decide::decide_on_node as decide;
    use crate::scheduler::needs::cpu_needs;
    use proptest::prelude::*;
    use serde_json::json;

    /// What a node built by [`node_with_facts`] holds, as the test recorded it: the oracle's
    /// input, never read back from the ledgers under test.
    struct Facts {
        /// Per GPU minor: its NUMA node and the percent of it the holders took.
        gpus: Vec<(u32, u32)>,
        cpusets: Vec<CpuSet>,
    }

    fn node(gpus: i32, gpu_holders: &[(u16, u8)], cpusets: &[(u16, u16)]) -> NodeState {
        node_with_facts(gpus, gpu_holders, cpusets).0
    }

    /// 2 NUMA nodes × 8 cores × 2 threads (NUMA n: CPUs 16n..16n+15), `gpus` GPUs split
    /// evenly over the NUMA nodes.
    fn node_with_facts(
        gpus: i32,
        gpu_holders: &[(u16, u8)],
        cpusets: &[(u16, u16)],
    ) -> (NodeState, Facts) {
        let mut facts = Facts {
            gpus: (0..gpus)
                .map(|m| ((m * 2 / gpus.max(1)) as u32, 0))
                .collect(),
            cpusets: Vec::new(),
        };
        let mut state = NodeState::default();
        state.ledgers_for_test().1.set_nrt(Some(
            crate::cluster::records::two_numa_test_topology()
                .cpu
                .clone(),
        ));
        let slots = (0..gpus).map(|m| {
            let numa = m * 2 / gpus.max(1);
            let total: DeviceResources = [
                (GPU_CORE.to_string(), Quantity::from_units(100)),
                (GPU_MEMORY.to_string(), Quantity::from_units(80 << 30)),
                (GPU_MEMORY_RATIO.to_string(), Quantity::from_units(100)),
            ]
            .into_iter()
            .collect();
            (
                DeviceType::Gpu,
                DeviceSlot {
                    minor: m,
                    id: format!("gpu-{m}"),
                    healthy: true,
                    total,
                    topology: Some(DeviceTopology {
                        socket_id: numa,
                        node_id: numa,
                        pcie_id: format!("pci{}", m / 2),
                        bus_id: String::new(),
                    }),
                    ..Default::default()
                },
            )
        });
        state
            .ledgers_for_test()
            .0
            .set_devices(Some(NodeDevices::from_slots(slots)));
        let scoring = ScoringConfig::default();
        for (i, (mask, ratio)) in gpu_holders.iter().enumerate() {
            let pod = pod(
                &json!({"koordinator.sh/gpu-memory-ratio": ratio.to_string()}),
                None,
            );
            let Ok(Some(req)) = pod_device_request(&pod) else {
                continue;
            };
            if let Ok(a) = fit_on_numa(
                state.device_ledger(),
                &req,
                &[],
                &scoring.device,
                Some(NumaMask(*mask)),
            )
            .or_else(|_| fit_with(state.device_ledger(), &req, &[], &scoring.device))
            {
                for entry in a.0.values().flatten() {
                    facts.gpus[entry.minor as usize].1 += u32::from(*ratio);
                }
                state.ledgers_for_test().0.record(
                    PodUid::new(format!("g{i}")),
                    RecordedAllocation::Allocated(a),
                    EntryState::Committed,
                );
            }
        }
        let mut taken = CpuSet::default();
        for (i, (start, len)) in cpusets.iter().enumerate() {
            let list = format!("{}-{}", start % 32, ((start % 32) + len % 8).min(31));
            let set: CpuSet = list.parse().expect("list");
            if !set.intersection(&taken).is_empty() {
                continue;
            }
            taken = taken.union(&set);
            facts.cpusets.push(set);
            state.ledgers_for_test().1.record(
                PodUid::new(format!("c{i}")),
                RecordedCpus::Allocated(crate::cluster::cpus::CpuAllocation {
                    cpuset: set,
                    numa: Vec::new(),
                    exclusive: crate::placement::cpu::CpuExclusivePolicy::PcpuLevel,
                }),
                EntryState::Committed,
            );
        }
        (state, facts)
    }

    /// The independent oracle's view of the node: the CPU side as placement's reference
    /// `Node` built from the recorded cpusets (every cpuset pod counted on the NUMA nodes it
    /// touches), and whether `want` whole GPUs are free on the NUMA nodes of a mask, counted
    /// from the recorded holdings.
    fn oracle_node(facts: &Facts) -> crate::placement::cpu::tests::Node {
        use crate::placement::cpu::accumulator::synthetic_topology;
        let mut n = crate::placement::cpu::tests::Node::new(
            synthetic_topology(2, 1, 8, 2),
            64 * crate::placement::cpu::tests::GI,
        );
        for set in &facts.cpusets {
            n.hold(&set.to_string());
        }
        n
    }

    fn whole_gpus_free(facts: &Facts, mask: u16, want: u32) -> bool {
        let free = facts
            .gpus
            .iter()
            .filter(|(numa, used)| mask & (1 << numa) != 0 && *used == 0)
            .count();
        free >= want as usize
    }

    fn pod(requests: &serde_json::Value, numa_policy: Option<&str>) -> Pod {
        let mut p = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                "labels": {"koordinator.sh/qosClass": "LSR"}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": requests, "limits": requests}}]}});
        if let Some(policy) = numa_policy {
            p["metadata"]["annotations"] = json!({"scheduling.koordinator.sh/numa-topology-spec":
                json!({"numaTopologyPolicy": policy}).to_string()});
        }
        serde_json::from_value(p).expect("pod")
    }

    /// An LSR pod asking for `gpus` GPUs and `cpus` CPUs under NUMA policy `policy`: its
    /// device request, its needs, and the device request's fast form.
    fn gpu_cpu_pod(
        gpus: u32,
        cpus: u32,
        policy: &str,
    ) -> (PodDeviceRequest, PodNeeds, Option<FastRequest>) {
        let scoring = ScoringConfig::default();
        let pod = pod(
            &json!({"nvidia.com/gpu": gpus.to_string(), "cpu": cpus.to_string(), "memory": "1Gi"}),
            Some(policy),
        );
        let devices = pod_device_request(&pod).expect("valid").expect("devices");
        let cpu = cpu_needs(&pod, true, &scoring).expect("valid");
        let fast = FastRequest::new(&devices, &scoring.device);
        let needs = PodNeeds {
            devices: Some(devices.clone()),
            cpu,
            cpu_request_milli: None,
        };
        (devices, needs, fast)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Independent: the full decision and its CPU score against placement's oracle
        /// (NUMA subsets, raw CPU details, koordinator's scoring formula) with a device model counted
        /// from the holdings this test recorded; a planted bug (device hints never demoting
        /// a wider CPU hint) passed the rest and fails this. Regression only: the snapshot
        /// answer and score equal the full ones (both share `place::decide` and the scorer).
        #[test]
        fn aligned_check_equals_the_full_decision(
            gpus in 0i32..=8,
            gpu_holders in proptest::collection::vec((1u16..=3, prop_oneof![Just(100u8), Just(50)]), 0..8),
            cpusets in proptest::collection::vec((0u16..32, 0u16..8), 0..6),
            want_gpus in 1u32..=4,
            want_cpus in 1u32..=20,
            policy in prop_oneof![Just("BestEffort"), Just("Restricted"), Just("SingleNUMANode")],
        ) {
            let (state, facts) = node_with_facts(gpus, &gpu_holders, &cpusets);
            let scoring = ScoringConfig::default();
            let (devices, needs, fast) = gpu_cpu_pod(want_gpus, want_cpus, policy);
            let full = decide(Some(&state), &needs, &[], &scoring).map(|_| ());
            // The independent oracle judges the full decision and its score.
            let req = needs.cpu.as_ref().expect("cpu needs");
            let reference = oracle_node(&facts);
            let refd = reference_resolve(&reference, req).expect("resolvable");
            let gpus_fit = |mask: u16| whole_gpus_free(&facts, mask, want_gpus);
            let want = oracle(&reference, req, &refd, &scoring.cpu, Some(&gpus_fit));
            // The placement's answer, then the devices under its affinity.
            let (want_fit, want_score) = match want {
                Expected::Numa { mask, score } => (gpus_fit(mask), score),
                Expected::Fails { .. } => (false, 0),
                other => panic!("a NUMA-aligned pod gets a NUMA hint or fails: {other:?}"),
            };
            prop_assert_eq!(full.is_ok(), want_fit, "full decision vs the oracle: {:?} {:?}", full, want);
            // Filter's answer from the node's snapshot view.
            let summary = state.summary();
            let got = snapshot_fit(
                Some(summary.view()),
                &needs,
                fast.as_ref(),
                &scoring,
                &mut FitMemo::default(),
            );
            if full.is_ok() {
                prop_assert!(got.is_some(), "a node that fits is answered from the snapshot");
            }
            if let Some(got) = got {
                prop_assert_eq!(got, full);
            }
            // Prioritize's CPU score on the fast path equals the full placement's.
            let full_score = state.cpu_ledger().with_view(&[], &scoring.cpu, |view| {
                let view = view.ok()?;
                let mut aligned = |mask: NumaMask| {
                    fit_on_numa(state.device_ledger(), &devices, &[], &scoring.device, Some(mask)).is_ok()
                };
                score_or_zero(&view, req, Some(&mut aligned), &scoring.cpu)
            });
            prop_assert_eq!(
                snapshot_cpu_score(
                    summary.view(),
                    req,
                    true,
                    fast.as_ref(),
                    &scoring,
                    &mut ScoreMemo::default()
                ),
                Some(full_score)
            );
            prop_assert_eq!(full_score, Some(want_score), "CPU score vs the oracle");
        }

        /// One request's shared memo over a fleet (nodes drawn from a few device states and
        /// a few CPU states, so both halves repeat in new pairs) answers every node as the
        /// node's own full decision does, and its CPU score as a fresh memo does.
        #[test]
        fn a_shared_aligned_memo_answers_each_node_as_its_own_decision(
            device_states in proptest::collection::vec(
                (0i32..=8, proptest::collection::vec((1u16..=3, prop_oneof![Just(100u8), Just(50)]), 0..8)),
                1..4,
            ),
            cpu_states in proptest::collection::vec(
                proptest::collection::vec((0u16..32, 0u16..8), 0..6),
                1..4,
            ),
            fleet in proptest::collection::vec((0usize..4, 0usize..4), 1..16),
            want_gpus in 1u32..=4,
            want_cpus in 1u32..=20,
            policy in prop_oneof![Just("BestEffort"), Just("Restricted"), Just("SingleNUMANode")],
        ) {
            let scoring = ScoringConfig::default();
            let (_, needs, fast) = gpu_cpu_pod(want_gpus, want_cpus, policy);
            let req = needs.cpu.as_ref().expect("cpu needs");
            let (mut fits, mut scores) = (FitMemo::default(), ScoreMemo::default());
            for (d, c) in fleet {
                let (gpus, holders) = &device_states[d % device_states.len()];
                let state = node(*gpus, holders, &cpu_states[c % cpu_states.len()]);
                let summary = state.summary();
                let full = decide(Some(&state), &needs, &[], &scoring).map(|_| ());
                let got = snapshot_fit(Some(summary.view()), &needs, fast.as_ref(), &scoring, &mut fits);
                if let Some(got) = got {
                    prop_assert_eq!(got, full);
                }
                let own = snapshot_cpu_score(
                    summary.view(), req, true, fast.as_ref(), &scoring, &mut ScoreMemo::default(),
                );
                prop_assert_eq!(
                    snapshot_cpu_score(summary.view(), req, true, fast.as_ref(), &scoring, &mut scores),
                    own
                );
            }
        }
    }

    /// Past its bounds (a fleet of distinct nodes) the memo keeps nothing more and every
    /// answer is still the node's own decision.
    #[test]
    fn the_shared_memo_stays_bounded_and_still_decides_past_its_bounds() {
        use crate::cluster::snapshot::Fingerprint;
        let scoring = ScoringConfig::default();
        let pod = pod(&json!({"nvidia.com/gpu": "1"}), None);
        let devices = pod_device_request(&pod).expect("valid").expect("devices");
        let fast = FastRequest::new(&devices, &scoring.device).expect("indexable");
        let summary = node(4, &[], &[]).summary();
        let DeviceView::Indexed(index) = summary.view().devices else {
            panic!("an indexed node");
        };
        let mut memo = AlignedMemo::<u32>::default();
        for i in 0..200u32 {
            let fingerprint = Fingerprint {
                devices: u128::from(i),
                cpu: u128::from(i),
            };
            let (answer, _) = memo.decide_aligned(fingerprint, index, &fast, |_| i);
            assert_eq!(answer, i);
        }
        assert_eq!(memo.kept(), (64, 64));
        assert_eq!(memo.replayed(), 0);
    }

    /// Nodes whose devices differ but whose CPUs are alike replay the first one's CPU-side
    /// decision where the devices answer alike, and decide again where they do not.
    #[test]
    fn alike_cpus_replay_a_decision_only_for_devices_that_answer_alike() {
        let scoring = ScoringConfig::default();
        let (_, needs, fast) = gpu_cpu_pod(1, 4, "SingleNUMANode");
        let mut fits = FitMemo::default();
        let mut answer = |state: &NodeState| {
            let summary = state.summary();
            snapshot_fit(
                Some(summary.view()),
                &needs,
                fast.as_ref(),
                &scoring,
                &mut fits,
            )
        };
        // 4 GPUs, 2 per NUMA node. Free on both NUMA nodes; then NUMA 0's two held
        // (ratio 100 on mask 1); then all four held: the same CPUs every time.
        let free = node(4, &[], &[]);
        let numa0_held = node(4, &[(1, 100), (1, 100)], &[]);
        let numa0_held_again = node(4, &[(1, 100), (1, 100)], &[]);
        let all_held = node(4, &[(1, 100), (1, 100), (2, 100), (2, 100)], &[]);
        assert_eq!(answer(&free), Some(Ok(())));
        assert_eq!(answer(&numa0_held), Some(Ok(())));
        assert_eq!(answer(&numa0_held_again), Some(Ok(())));
        let full = decide(Some(&all_held), &needs, &[], &scoring).map(|_| ());
        assert!(full.is_err(), "no free GPU: {full:?}");
        assert_eq!(answer(&all_held), Some(full));
        // `free` asked mask {0} (yes) and stopped; `numa0_held` answers no there, so it
        // was decided in full (asking {0}, no; {1}, yes); its twin replays that.
        assert_eq!(fits.replayed(), 1);
    }
}
