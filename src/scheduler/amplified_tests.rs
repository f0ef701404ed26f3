//! The CPU amplification check (koordinator `filterAmplifiedCPUs`) through the caches' write
//! API and both read paths, against an oracle that recomputes it from the objects the test
//! wrote: the Node's allocatable and ratio, each pod's CPU request and cpuset, the binds it
//! assumed and the victims it names. The oracle's arithmetic is integer (ratios exact in
//! binary, so koordinator's float `ceil` is exact too) and reads no ledger.

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::json;

use super::config::ScoringConfig;
use super::decide::decide_on_node;
use super::needs::{PodNeeds, cpu_needs};
use super::read::{FitMemo, snapshot_fit};
use crate::cluster::devices::{EntryState, RecordedAllocation};
use crate::cluster::{ClusterState, NodeRecord, PodRecord, TopologyRecord};
use crate::model::device::DeviceAllocations;
use crate::model::ids::PodUid;
use crate::model::node::Node;
use crate::model::pod::Pod;
use crate::placement::cpu::amplified::{INSUFFICIENT, INVALID_RATIO};

/// The annotation's text and, when it amplifies, the ratio as `num / den`.
const RATIOS: [(&str, Option<(i64, i64)>); 7] = [
    (r#"{"cpu":1.5}"#, Some((3, 2))),
    (r#"{"cpu":1.25,"memory":2}"#, Some((5, 4))),
    (r#"{"cpu":2}"#, Some((2, 1))),
    (r#"{"cpu":3}"#, Some((3, 1))),
    (r#"{"cpu":1}"#, None),
    (r#"{"memory":1.5}"#, None),
    (r#"{"cpu":"1.5"}"#, None),
];
/// The entry of [`RATIOS`] that does not parse.
const INVALID: usize = 6;

fn topology() -> TopologyRecord {
    crate::cluster::records::two_numa_test_topology()
}

fn node(ratio: usize, allocatable_milli: i64, bind_policy: Option<&str>) -> NodeRecord {
    let mut labels = serde_json::Map::new();
    if let Some(p) = bind_policy {
        labels.insert("node.koordinator.sh/cpu-bind-policy".into(), p.into());
    }
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n", "uid": "node-uid",
        "labels": labels,
        "annotations": {"node.koordinator.sh/resource-amplification-ratio": RATIOS[ratio].0}},
        "status": {"allocatable": {"cpu": format!("{allocatable_milli}m"), "memory": "128Gi"}}}))
    .expect("node");
    NodeRecord::from_node(&n)
}

/// A pod on node `n` requesting `cpu_milli` (split over two containers, so the request is a
/// sum), holding `cpuset` when given.
fn listed(uid: &str, cpu_milli: i64, cpuset: Option<&str>, phase: &str) -> PodRecord {
    let mut annotations = serde_json::Map::new();
    if let Some(c) = cpuset {
        annotations.insert(
            "scheduling.koordinator.sh/resource-status".into(),
            json!({"cpuset": c}).to_string().into(),
        );
    }
    let half = cpu_milli / 2;
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": annotations},
        "spec": {"nodeName": "n", "containers": [
            {"name": "a", "resources": {"requests": {"cpu": format!("{half}m")}}},
            {"name": "b", "resources": {"requests": {"cpu": format!("{}m", cpu_milli - half)}}}]},
        "status": {"phase": phase}}))
    .expect("pod");
    PodRecord::from_pod(&p).expect("record")
}

/// The pod being scheduled: a plain LS pod, or an LSR pod asking for a cpuset of whole CPUs.
fn candidate(cpu_milli: i64, cpuset: bool) -> PodNeeds {
    let qos = if cpuset { "LSR" } else { "LS" };
    let requests = json!({"cpu": format!("{cpu_milli}m"), "memory": "1Gi"});
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "candidate",
            "labels": {"koordinator.sh/qosClass": qos}},
        "spec": {"containers": [{"name": "c",
            "resources": {"requests": requests, "limits": requests}}]}}))
    .expect("pod");
    PodNeeds {
        devices: None,
        cpu: cpu_needs(&pod, true, &ScoringConfig::default()).expect("valid"),
        cpu_request_milli: None,
    }
}

#[derive(Clone, Debug)]
struct Holder {
    cpu_milli: i64,
    /// First CPU and length of its cpuset (kept only when it overlaps no earlier one).
    cpuset: Option<(u8, u8)>,
    running: bool,
    /// A victim of the preemption being evaluated.
    victim: bool,
}

#[derive(Clone, Debug)]
enum Assumed {
    /// Assumed and still waiting for the watch.
    Pending,
    /// The watch listed it afterwards (it must count once).
    Listed,
    /// The bind failed and rolled it back (it must not count).
    RolledBack,
}

fn holder() -> impl Strategy<Value = Holder> {
    (
        (0i64..=40).prop_map(|c| c * 250),
        proptest::option::of((0u8..32, 1u8..=6)),
        prop::bool::weighted(0.85),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(cpu_milli, cpuset, running, victim)| Holder {
            cpu_milli,
            cpuset,
            running,
            victim,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    /// Filter's verdict on an amplified node (full decision, with and without victims, and
    /// the snapshot's fast answer) is koordinator's: "Insufficient amplified cpu" exactly when
    /// the pod's request (× the ratio for a cpuset) exceeds the allocatable left after the
    /// requests of the pods here and of the binds assumed here, with the CPUs cpusets hold
    /// counted × the ratio when the requests cover them; "invalid CPU amplification ratio"
    /// for any pod with a CPU request when the annotation does not parse.
    #[test]
    fn amplified_filter_is_koordinators_arithmetic(
        ratio in 0usize..RATIOS.len(),
        allocatable_cpus in 8i64..=96,
        bind_policy in proptest::option::of(Just("FullPCPUsOnly")),
        holders in proptest::collection::vec(holder(), 0..10),
        assumed in proptest::collection::vec(
            ((0i64..=16).prop_map(|c| c * 500), prop_oneof![
                Just(Assumed::Pending), Just(Assumed::Listed), Just(Assumed::RolledBack)]),
            0..4,
        ),
        want_cpus in 0i64..=16,
        cpuset in any::<bool>(),
        fractional in any::<bool>(),
    ) {
        let allocatable_milli = allocatable_cpus * 1000;
        let cluster = ClusterState::new();
        cluster.set_topology("n", Some(topology()));
        cluster.set_node("n", Some(node(ratio, allocatable_milli, bind_policy)));

        // The oracle's inputs, kept as written.
        let mut requested = 0i64;
        let mut requested_without_victims = 0i64;
        let mut held: BTreeSet<u8> = BTreeSet::new();
        let mut held_without_victims: BTreeSet<u8> = BTreeSet::new();
        let mut victims = Vec::new();
        for (i, h) in holders.iter().enumerate() {
            let uid = format!("h{i}");
            let set = h.cpuset.and_then(|(start, len)| {
                let cpus: BTreeSet<u8> = (start..(start + len).min(32)).collect();
                cpus.is_disjoint(&held).then_some(cpus)
            });
            let list = set.as_ref().map(|s| {
                s.iter().map(u8::to_string).collect::<Vec<_>>().join(",")
            });
            let phase = if h.running { "Running" } else { "Succeeded" };
            cluster.upsert_pod(None, &listed(&uid, h.cpu_milli, list.as_deref(), phase));
            if !h.running {
                continue;
            }
            requested += h.cpu_milli;
            if let Some(s) = &set {
                held.extend(s);
            }
            if h.victim {
                victims.push(PodUid::new(uid));
            } else {
                requested_without_victims += h.cpu_milli;
                if let Some(s) = &set {
                    held_without_victims.extend(s);
                }
            }
        }
        // Binds assumed here as `bind` records them: a GPU share assumed, the pod's CPU
        // request remembered until the watch lists it.
        for (i, (cpu_milli, fate)) in assumed.iter().enumerate() {
            let uid = PodUid::new(format!("a{i}"));
            let alloc = DeviceAllocations::parse_annotation(
                r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory-ratio":"10"}}]}"#,
            )
            .expect("allocation");
            cluster.edit_node_for_test("n", |s| {
                s.ledgers_for_test().0.record(
                    uid.clone(),
                    RecordedAllocation::Allocated(alloc),
                    EntryState::Assumed { at: std::time::Instant::now() },
                );
                s.ledgers_for_test().2.insert(uid.clone(), *cpu_milli);
            });
            match fate {
                Assumed::Pending => {}
                Assumed::Listed => {
                    cluster.upsert_pod(None, &listed(uid.as_str(), *cpu_milli, None, "Running"));
                }
                Assumed::RolledBack => {
                    cluster.edit_node_for_test("n", |s| s.remove_assumed(&uid));
                }
            }
            if !matches!(fate, Assumed::RolledBack) {
                requested += cpu_milli;
                requested_without_victims += cpu_milli;
            }
        }
        cluster.build_snapshot();

        let want_milli = want_cpus * 1000 + if fractional && !cpuset { 500 } else { 0 };
        let needs = candidate(want_milli, cpuset);
        let scoring = ScoringConfig::default();
        // The oracle: koordinator's filterAmplifiedCPUs over the written objects.
        let bound = cpuset || (bind_policy.is_some() && want_milli > 0);
        let oracle = |requested: i64, held: usize| -> Option<(crate::placement::FitReason, bool)> {
            if want_milli == 0 {
                return None;
            }
            if ratio == INVALID {
                return Some((INVALID_RATIO, true));
            }
            let (num, den) = RATIOS[ratio].1?;
            let amplify = |x: i64| (x * num + den - 1) / den;
            let allocated = held as i64 * 1000;
            let requested = if allocated > 0 && requested >= allocated {
                requested - allocated + amplify(allocated)
            } else {
                requested
            };
            let pod = if bound { amplify(want_milli) } else { want_milli };
            (pod > allocatable_milli - requested).then_some((INSUFFICIENT, false))
        };
        let judge = |got: &Result<(), crate::placement::FitError>,
                     want: Option<(crate::placement::FitReason, bool)>|
         -> Result<(), String> {
            match (got, want.clone()) {
                (Err(e), Some((reason, unresolvable)))
                    if e.reason == reason && e.unresolvable == unresolvable => Ok(()),
                (Ok(()), None) => Ok(()),
                (Err(e), None)
                    if e.reason != INSUFFICIENT && e.reason != INVALID_RATIO => Ok(()),
                _ => Err(format!("got {got:?}, koordinator {want:?}")),
            }
        };

        let full = cluster
            .edit_node_for_test("n", |s| decide_on_node(Some(s), &needs, &[], &scoring).map(|_| ()))
            .expect("node");
        prop_assert_eq!(judge(&full, oracle(requested, held.len())), Ok(()));
        let snapshot = cluster.read_snapshot();
        let fast = snapshot_fit(snapshot.node("n"), &needs, None, &scoring, &mut FitMemo::default());
        prop_assert_eq!(fast, Some(full), "the snapshot answers as the full decision");
        let with_victims = cluster
            .edit_node_for_test("n", |s| {
                decide_on_node(Some(s), &needs, &victims, &scoring).map(|_| ())
            })
            .expect("node");
        prop_assert_eq!(
            judge(&with_victims, oracle(requested_without_victims, held_without_victims.len())),
            Ok(()),
            "victims {:?}", victims
        );
    }
}

/// Capacity returns (what requeues waiting pods) see amplified CPU come back: a pod leaving an
/// amplified node, its ratio lowered, or an invalid ratio fixed. Nothing is returned when
/// the amplified CPU only shrinks.
#[test]
fn amplified_cpu_coming_back_is_a_capacity_return() {
    use crate::cluster::returns::ResourceKinds;
    let cluster = ClusterState::new();
    cluster.capacity_returns().enable();
    cluster.set_topology("n", Some(topology()));
    cluster.set_node("n", Some(node(0, 24_000, None)));
    cluster.build_snapshot();
    let returned = |cluster: &ClusterState| {
        cluster
            .capacity_returns()
            .take()
            .get("n")
            .copied()
            .unwrap_or_default()
            .intersects(ResourceKinds::CPU)
    };
    returned(&cluster);
    let pod = listed("p", 4_000, None, "Running");
    cluster.upsert_pod(None, &pod);
    assert!(!returned(&cluster), "a new pod takes CPU");
    cluster.remove_pod(&pod);
    assert!(returned(&cluster), "its CPU came back");
    cluster.set_node("n", Some(node(3, 24_000, None)));
    assert!(
        returned(&cluster),
        "ratio 1.5 → 3: each NUMA node's amplified cpu grows (a NUMA-bound pod without a cpuset fits more)"
    );
    cluster.set_node("n", Some(node(2, 24_000, None)));
    assert!(returned(&cluster), "ratio 3 → 2");
    cluster.set_node("n", Some(node(INVALID, 24_000, None)));
    assert!(!returned(&cluster), "an invalid ratio refuses everything");
    cluster.set_node("n", Some(node(0, 24_000, None)));
    assert!(returned(&cluster), "the ratio fixed");
    cluster.set_node("n", Some(node(4, 24_000, None)));
    assert!(returned(&cluster), "no amplification any more");
}

/// Issue 38 §3: the Node's ratio reaches NUMA placement through the caches (Node → labels →
/// view), on both read paths. A SingleNUMANode node of two 16-CPU NUMA nodes: a NUMA-bound pod
/// without a cpuset asking 20 CPUs fits on one NUMA node only once each is amplified to 24
/// CPUs (koordinator's `amplifyNUMANodeResources`), and a 4-CPU cpuset already there counts 6.
#[test]
fn numa_placement_sees_the_amplified_numa_nodes() {
    let decide = |ratio: &str, held: Option<&str>, want_milli: i64| {
        let cluster = ClusterState::new();
        cluster.set_topology("n", Some(topology()));
        let n: Node = serde_json::from_value(json!({"metadata": {"name": "n", "uid": "node-uid",
            "labels": {"node.koordinator.sh/numa-topology-policy": "SingleNUMANode"},
            "annotations": {"node.koordinator.sh/resource-amplification-ratio": ratio}},
            "status": {"allocatable": {"cpu": "96", "memory": "128Gi"}}}))
        .expect("node");
        cluster.set_node("n", Some(NodeRecord::from_node(&n)));
        if let Some(cpus) = held {
            let status = format!(
                r#"{{"cpuset":"{cpus}","numaNodeResources":[{{"node":0,"resources":{{"cpu":"4"}}}},{{"node":1,"resources":{{"cpu":"4"}}}}]}}"#
            );
            let raw: Pod = serde_json::from_value(json!({
                "metadata": {"name": "holder", "namespace": "ns", "uid": "holder",
                    "annotations": {"scheduling.koordinator.sh/resource-status": status}},
                "spec": {"nodeName": "n", "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "8"}}}]},
                "status": {"phase": "Running"}}))
            .expect("pod");
            cluster.upsert_pod(None, &PodRecord::from_pod(&raw).expect("record"));
        }
        cluster.build_snapshot();
        let needs = candidate(want_milli, false);
        let scoring = ScoringConfig::default();
        let full = cluster
            .edit_node_for_test("n", |s| {
                decide_on_node(Some(s), &needs, &[], &scoring).map(|_| ())
            })
            .expect("node");
        let snapshot = cluster.read_snapshot();
        let fast = snapshot_fit(
            snapshot.node("n"),
            &needs,
            None,
            &scoring,
            &mut FitMemo::default(),
        );
        assert_eq!(
            fast,
            Some(full.clone()),
            "the snapshot answers as the full decision"
        );
        full.is_ok()
    };
    assert!(
        !decide(r#"{"cpu":1}"#, None, 20_000),
        "16 CPUs per NUMA node"
    );
    assert!(decide(r#"{"cpu":1.5}"#, None, 20_000), "24 amplified");
    assert!(!decide(r#"{"cpu":1.5}"#, None, 24_001));
    // 0-3 and 16-19 held by a cpuset (4 CPUs per NUMA node, shares of 4 each): 24 − 6 = 18 left.
    assert!(decide(r#"{"cpu":1.5}"#, Some("0-3,16-19"), 18_000));
    assert!(
        !decide(r#"{"cpu":1.5}"#, Some("0-3,16-19"), 18_001),
        "the cpuset counts amplified"
    );
    assert!(decide(r#"{"cpu":1}"#, Some("0-3,16-19"), 12_000));
    assert!(!decide(r#"{"cpu":1}"#, Some("0-3,16-19"), 12_001));
}

/// `inspect` and `/debug/nodes` show each NUMA node as NUMA placement counts it.
#[test]
fn the_report_shows_each_numa_node_amplified() {
    let cluster = ClusterState::new();
    cluster.set_topology("n", Some(topology()));
    let report = |cluster: &ClusterState| {
        let r = crate::cluster::report::cluster_report(cluster, &["n".to_string()]);
        serde_json::to_value(&r.nodes[0].cpus).expect("json")
    };
    cluster.set_node("n", Some(node(1, 40_000, None)));
    cluster.upsert_pod(None, &listed("h", 4_000, Some("0-3"), "Running"));
    let r = report(&cluster);
    // {"cpu":1.25,"memory":2}: 16 CPUs → 20, 64Gi → 128Gi; the 4-CPU cpuset has no NUMA
    // share here (its resource-status names only the cpuset), so nothing is used.
    assert_eq!(
        r["numa"][0]["amplified"]["cpu_milli"]["total"], 20_000,
        "{r}"
    );
    assert_eq!(
        r["numa"][0]["amplified"]["memory_bytes"]["total"],
        128i64 << 30,
        "{r}"
    );
    assert_eq!(r["numa"][0]["cpu_milli"]["total"], 16_000, "{r}");
    // The text report's NUMA rows show the same (0 of 20 CPUs, 0 of 128Gi).
    let text = crate::ops::render::cluster(
        &crate::cluster::report::cluster_report(&cluster, &["n".to_string()]),
        false,
        false,
    );
    assert!(text.contains("0/20") && text.contains("0/128Gi"), "{text}");
    cluster.set_node("n", Some(node(4, 40_000, None)));
    assert!(
        report(&cluster)["numa"][0].get("amplified").is_none(),
        "ratio 1: none"
    );
}
