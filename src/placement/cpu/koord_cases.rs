//! koordinator's own accumulator cases, as the authority for [`super::accumulator`]: every case
//! of `pkg/scheduler/plugins/nodenumaresource/cpu_accumulator_test.go` at koordinator v1.7.0
//! (`github.com/koordinator-sh/koordinator@v1.7.0`, the newest release the Go module proxy
//! serves here) that this accumulator's inputs can express: `TestTakeFullPCPUs`,
//! `TestTakeFullPCPUsWithNUMALeastAllocated`, `TestTakeSpreadByPCPUs`,
//! `TestTakeSpreadByPCPUsWithNUMALeastAllocated`, `TestCPUSpreadByPCPUs*` (the spread order) and
//! `TestTakeCPUsWithExclusivePolicy`. Left out: `TestTakeCPUsWithMaxRefCount` and
//! `TestTakeCPUsSortByRefCount` (CPU reference counts > 1, which koordinator uses for
//! reservations; this project never shares a cpuset CPU) and `TestTakePreferredCPUs`
//! (reservation-preferred CPUs). Each case keeps koordinator's name; the expected cpuset is
//! koordinator's.
//!
//! The helper topology is koordinator's `buildCPUTopologyForTest` (sockets × NUMA nodes per
//! socket × cores per NUMA node × threads per core, CPU ids sequential, a core's threads
//! adjacent), which [`super::accumulator::synthetic_topology`] builds.
//!
//! And a seeded random differential: `tests/koord-compat/accumulator` (a Go module pinned to
//! koordinator v1.7.0 and its Kubernetes 1.28) calls koordinator's own `takeCPUs` on 3,000
//! random topologies, holdings (with holders' exclusive policies) and requests, and records its
//! answers in `tests/koord-compat/accumulator-cases.jsonl`; `scripts/test.sh` records them again
//! and fails if the file differs, and [`koordinators_recorded_answers_agree`] replays them here.

use super::accumulator::{Ask, synthetic_topology, take_cpus};
use super::{CpuBindPolicy, CpuExclusivePolicy, NumaAllocateStrategy};
use crate::model::cpuset::CpuSet;

use CpuBindPolicy::{FullPcpus, SpreadByPcpus};
use NumaAllocateStrategy::{LeastAllocated, MostAllocated};

/// One koordinator case.
struct Case {
    name: &'static str,
    /// `buildCPUTopologyForTest(sockets, nodesPerSocket, coresPerNode, cpusPerCore)`.
    topology: (u32, u32, u32, u32),
    allocated: &'static str,
    /// The holders' exclusive policy of the allocated CPUs (`TestTakeCPUsWithExclusivePolicy`;
    /// `None` elsewhere).
    held: CpuExclusivePolicy,
    need: usize,
    policy: CpuBindPolicy,
    strategy: NumaAllocateStrategy,
    exclusive: CpuExclusivePolicy,
    want: &'static str,
}

const fn case(
    name: &'static str,
    topology: (u32, u32, u32, u32),
    allocated: &'static str,
    need: usize,
    policy: CpuBindPolicy,
    strategy: NumaAllocateStrategy,
    want: &'static str,
) -> Case {
    Case {
        name,
        topology,
        allocated,
        held: CpuExclusivePolicy::None,
        need,
        policy,
        strategy,
        exclusive: CpuExclusivePolicy::None,
        want,
    }
}

/// A `TestTakeCPUsWithExclusivePolicy` row (NUMAMostAllocated): `held` is the holders'
/// exclusive policy of the allocated CPUs, `exclusive` the pod's.
#[allow(clippy::too_many_arguments)] // one koordinator table row, field for field
const fn exclusive(
    name: &'static str,
    topology: (u32, u32, u32, u32),
    allocated: &'static str,
    held: CpuExclusivePolicy,
    policy: CpuBindPolicy,
    exclusive: CpuExclusivePolicy,
    need: usize,
    want: &'static str,
) -> Case {
    Case {
        held,
        exclusive,
        ..case(name, topology, allocated, need, policy, MostAllocated, want)
    }
}

use CpuExclusivePolicy::{NumaNodeLevel, PcpuLevel};

const CASES: &[Case] = &[
    // TestTakeFullPCPUs (NUMAMostAllocated)
    case(
        "full/most: allocate on non-NUMA node",
        (1, 1, 4, 2),
        "",
        2,
        FullPcpus,
        MostAllocated,
        "0-1",
    ),
    case(
        "full/most: with allocated cpus",
        (1, 1, 4, 2),
        "0-1",
        2,
        FullPcpus,
        MostAllocated,
        "2-3",
    ),
    case(
        "full/most: allocate whole socket",
        (2, 1, 4, 2),
        "",
        8,
        FullPcpus,
        MostAllocated,
        "0-7",
    ),
    case(
        "full/most: allocate across socket",
        (2, 1, 4, 2),
        "",
        12,
        FullPcpus,
        MostAllocated,
        "0-11",
    ),
    case(
        "full/most: allocate whole socket with partially-allocated socket",
        (2, 1, 4, 2),
        "0-1",
        8,
        FullPcpus,
        MostAllocated,
        "8-15",
    ),
    case(
        "full/most: allocate in the smallest idle socket",
        (2, 2, 4, 2),
        "0-5,16-23",
        6,
        FullPcpus,
        MostAllocated,
        "24-29",
    ),
    case(
        "full/most: allocate the most of CPUs on the same socket",
        (2, 2, 4, 2),
        "0-5,16-23",
        12,
        FullPcpus,
        MostAllocated,
        "6-15,24-25",
    ),
    case(
        "full/most: allocate from first socket",
        (2, 2, 4, 2),
        "0-3,8-11",
        4,
        FullPcpus,
        MostAllocated,
        "4-7",
    ),
    case(
        "full/most: allocate with less spread cpus",
        (2, 2, 2, 2),
        "0,2,4,8,12",
        4,
        FullPcpus,
        MostAllocated,
        "10-11,14-15",
    ),
    case(
        "full/most: allocate with the most spread cpus",
        (2, 2, 2, 2),
        "0,2,4,8,10,12",
        6,
        FullPcpus,
        MostAllocated,
        "5-7,13-15",
    ),
    case(
        "full/most: allocate with the most spread cpus on the smallest idle cpus socket",
        (2, 2, 2, 2),
        "0,2,4,8-10,12",
        6,
        FullPcpus,
        MostAllocated,
        "6-7,11,13-15",
    ),
    // TestTakeFullPCPUsWithNUMALeastAllocated
    case(
        "full/least: allocate on non-NUMA node",
        (1, 1, 4, 2),
        "",
        2,
        FullPcpus,
        LeastAllocated,
        "0-1",
    ),
    case(
        "full/least: with allocated cpus",
        (1, 1, 4, 2),
        "0-1",
        2,
        FullPcpus,
        LeastAllocated,
        "2-3",
    ),
    case(
        "full/least: allocate whole socket",
        (2, 1, 4, 2),
        "",
        8,
        FullPcpus,
        LeastAllocated,
        "0-7",
    ),
    case(
        "full/least: allocate across socket",
        (2, 1, 4, 2),
        "",
        12,
        FullPcpus,
        LeastAllocated,
        "0-11",
    ),
    case(
        "full/least: allocate whole socket with partially-allocated socket",
        (2, 1, 4, 2),
        "0-1",
        8,
        FullPcpus,
        LeastAllocated,
        "8-15",
    ),
    case(
        "full/least: allocate in the most idle socket",
        (2, 2, 4, 2),
        "0-5,16-23",
        6,
        FullPcpus,
        LeastAllocated,
        "8-13",
    ),
    case(
        "full/least: allocate the most of CPUs on the same socket",
        (2, 2, 4, 2),
        "0-5,16-23",
        12,
        FullPcpus,
        LeastAllocated,
        "6-15,24-25",
    ),
    case(
        "full/least: allocate from second socket",
        (2, 2, 4, 2),
        "0-3,8-11",
        4,
        FullPcpus,
        LeastAllocated,
        "16-19",
    ),
    case(
        "full/least: allocate with less spread cpus",
        (2, 2, 2, 2),
        "0,2,4,8,12",
        4,
        FullPcpus,
        LeastAllocated,
        "10-11,14-15",
    ),
    case(
        "full/least: allocate with the less spread cpus 2",
        (2, 2, 2, 2),
        "0,2,4,8,10,12",
        6,
        FullPcpus,
        LeastAllocated,
        "1,3,6-7,14-15",
    ),
    case(
        "full/least: allocate with the most spread cpus on the most idle cpus socket 3",
        (2, 2, 4, 2),
        "0,2,4,8-10,12",
        6,
        FullPcpus,
        LeastAllocated,
        "16-21",
    ),
    // TestTakeSpreadByPCPUs (NUMAMostAllocated)
    case(
        "spread/most: allocate on non-NUMA node",
        (1, 1, 4, 2),
        "",
        4,
        SpreadByPcpus,
        MostAllocated,
        "0,2,4,6",
    ),
    case(
        "spread/most: allocate satisfied the partially-allocated socket",
        (2, 1, 4, 2),
        "0,2",
        4,
        SpreadByPcpus,
        MostAllocated,
        "1,3-4,6",
    ),
    case(
        "spread/most: allocate cpus on full-free socket",
        (2, 1, 4, 2),
        "0-3",
        4,
        SpreadByPcpus,
        MostAllocated,
        "8,10,12,14",
    ),
    case(
        "spread/most: allocate most of CPUs in the same socket and overlapped-cores",
        (2, 1, 4, 2),
        "0,2",
        6,
        SpreadByPcpus,
        MostAllocated,
        "1,3-7",
    ),
    // TestTakeSpreadByPCPUsWithNUMALeastAllocated
    case(
        "spread/least: allocate on non-NUMA node",
        (1, 1, 4, 2),
        "",
        4,
        SpreadByPcpus,
        LeastAllocated,
        "0,2,4,6",
    ),
    case(
        "spread/least: allocate satisfied the partially-allocated socket",
        (2, 1, 4, 2),
        "0,2",
        4,
        SpreadByPcpus,
        LeastAllocated,
        "8,10,12,14",
    ),
    case(
        "spread/least: allocate cpus on full-free socket",
        (2, 1, 4, 2),
        "0-3",
        4,
        SpreadByPcpus,
        LeastAllocated,
        "8,10,12,14",
    ),
    case(
        "spread/least: allocate most of CPUs in the same socket and overlapped-cores",
        (2, 1, 4, 2),
        "0,2",
        6,
        SpreadByPcpus,
        LeastAllocated,
        "8-12,14",
    ),
    // TestTakeCPUsWithExclusivePolicy (NUMAMostAllocated; held CPUs PCPULevel unless named)
    exclusive(
        "exclusive: allocate cpus on full-free socket with PCPULevel",
        (2, 1, 4, 2),
        "0,2",
        PcpuLevel,
        SpreadByPcpus,
        PcpuLevel,
        4,
        "8,10,12,14",
    ),
    exclusive(
        "exclusive: allocate overlapped cpus with PCPULevel",
        (2, 1, 4, 2),
        "",
        PcpuLevel,
        SpreadByPcpus,
        PcpuLevel,
        10,
        "0-4,6,8,10,12,14",
    ),
    exclusive(
        "exclusive: allocate cpus on large-size partially-allocated socket with PCPULevel",
        (2, 1, 8, 2),
        "0,2",
        PcpuLevel,
        SpreadByPcpus,
        PcpuLevel,
        4,
        "4,6,8,10",
    ),
    exclusive(
        "exclusive: allocate cpus with none exclusive policy",
        (2, 1, 8, 2),
        "0,2",
        PcpuLevel,
        SpreadByPcpus,
        CpuExclusivePolicy::None,
        4,
        "1,3-4,6",
    ),
    exclusive(
        "exclusive: allocate cpus on full-free socket with NUMANodeLevel",
        (2, 1, 4, 2),
        "0,2",
        NumaNodeLevel,
        SpreadByPcpus,
        NumaNodeLevel,
        4,
        "8,10,12,14",
    ),
    exclusive(
        "exclusive: allocate cpus on partially-allocated socket without NUMANodeLevel",
        (2, 1, 4, 2),
        "0,2",
        NumaNodeLevel,
        SpreadByPcpus,
        CpuExclusivePolicy::None,
        4,
        "1,3-4,6",
    ),
    exclusive(
        "exclusive: allocate cpus on full-free socket with NUMANodeLevel with PCPUs",
        (2, 1, 4, 2),
        "0,2",
        NumaNodeLevel,
        FullPcpus,
        NumaNodeLevel,
        4,
        "8-11",
    ),
    exclusive(
        "exclusive: allocate cpus on partially-allocated socket without NUMANodeLevel with PCPUs",
        (2, 1, 4, 2),
        "0,2",
        NumaNodeLevel,
        FullPcpus,
        CpuExclusivePolicy::None,
        4,
        "4-7",
    ),
];

fn run(c: &Case) -> String {
    let (s, n, cores, t) = c.topology;
    let topo = synthetic_topology(s, n, cores, t);
    let allocated: CpuSet = c.allocated.parse().expect("case cpuset");
    let free = topo.all().difference(&allocated);
    let (mut pcpu_exclusive, mut numa_exclusive) = (CpuSet::new(), CpuSet::new());
    match c.held {
        PcpuLevel => pcpu_exclusive = allocated,
        NumaNodeLevel => numa_exclusive = allocated,
        CpuExclusivePolicy::None => {}
    }
    let ask = Ask {
        need: c.need,
        policy: c.policy,
        strategy: c.strategy,
        exclusive: c.exclusive,
        pcpu_exclusive,
        numa_exclusive,
    };
    take_cpus(&topo, free, &ask).map_or_else(|| "none".to_string(), |s| s.to_string())
}

#[test]
fn every_koordinator_accumulator_case_agrees() {
    let mut disagree = Vec::new();
    for c in CASES {
        let want: CpuSet = c.want.parse().expect("case cpuset");
        let got = run(c);
        if got != want.to_string() {
            disagree.push(format!("{}: koordinator {}, ours {got}", c.name, want));
        }
    }
    assert!(
        disagree.is_empty(),
        "{} of {} koordinator cases disagree:\n{}",
        disagree.len(),
        CASES.len(),
        disagree.join("\n")
    );
}

/// One recorded answer of koordinator's own accumulator (`tests/koord-compat/accumulator`).
#[derive(serde::Deserialize)]
struct Recorded {
    topology: [u32; 4],
    allocated: String,
    held_pcpu_level: String,
    held_numa_node_level: String,
    need: usize,
    policy: String,
    exclusive: String,
    strategy: String,
    answer: String,
    #[serde(default)]
    error: Option<String>,
}

/// The seeded random differential: every case koordinator v1.7.0's `takeCPUs` answered
/// (recorded by `tests/koord-compat/accumulator`, which calls koordinator's code itself) is
/// replayed through this accumulator, which must choose the same CPUs, or refuse where it
/// refused (229 of the 3,300 are refusals: the recorder's last 300 ask for more than is free).
#[test]
fn koordinators_recorded_answers_agree() {
    const RECORDED: &str = include_str!("../../../tests/koord-compat/accumulator-cases.jsonl");
    let (mut cases, mut refused) = (0, 0);
    let mut disagree = Vec::new();
    for line in RECORDED.lines().filter(|l| !l.trim().is_empty()) {
        let r: Recorded = serde_json::from_str(line).expect("a recorded case");
        let [s, n, c, t] = r.topology;
        let topo = synthetic_topology(s, n, c, t);
        let set = |s: &str| -> CpuSet { s.parse().expect("recorded cpuset") };
        let ask = Ask {
            need: r.need,
            policy: match r.policy.as_str() {
                "FullPCPUs" => FullPcpus,
                "SpreadByPCPUs" => SpreadByPcpus,
                other => panic!("recorded policy {other}"),
            },
            strategy: match r.strategy.as_str() {
                "MostAllocated" => MostAllocated,
                "LeastAllocated" => LeastAllocated,
                other => panic!("recorded strategy {other}"),
            },
            exclusive: match r.exclusive.as_str() {
                "PCPULevel" => PcpuLevel,
                "NUMANodeLevel" => NumaNodeLevel,
                _ => CpuExclusivePolicy::None,
            },
            pcpu_exclusive: set(&r.held_pcpu_level),
            numa_exclusive: set(&r.held_numa_node_level),
        };
        let free = topo.all().difference(&set(&r.allocated));
        let ours = take_cpus(&topo, free, &ask).map(|s| s.to_string());
        let theirs = r.error.is_none().then(|| set(&r.answer).to_string());
        cases += 1;
        refused += usize::from(theirs.is_none());
        if ours != theirs {
            disagree.push(format!("{line}\n  koordinator {theirs:?}, ours {ours:?}"));
        }
    }
    assert!(cases >= 1000, "only {cases} recorded cases");
    // The recorder's last cases ask for more than is free: refusals must be among them, or a
    // refusal where koordinator answers (or the reverse) would never be tried.
    assert!(
        refused >= 200,
        "only {refused} refusals among the recorded cases"
    );
    assert!(
        disagree.is_empty(),
        "{} of {cases} recorded koordinator answers disagree ({refused} refusals among the cases); first:\n{}",
        disagree.len(),
        disagree
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
