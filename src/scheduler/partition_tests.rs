//! GPU partition tables through the caches and both read paths. The partition step itself is
//! held to koordinator's own code case for case (`placement::device::partition`); these tests
//! check what surrounds it, against facts the test wrote: on an 8-GPU H100 node (koordinator's
//! built-in table: singles, the pairs 0-1 … 6-7, the halves 0-3 and 4-7, all eight) whole-GPU
//! pods get a listed partition whose GPUs were all free whenever one is, `Honor` refuses them
//! otherwise and `Prefer` falls back, shared GPUs ignore partitions, and filter's snapshot answer
//! is the full decision's.

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::json;

use super::config::ScoringConfig;
use super::decide::decide_on_node;
use super::needs::PodNeeds;
use super::read::{FitMemo, snapshot_fit};
use crate::cluster::devices::{EntryState, NodeDevices, RecordedAllocation};
use crate::cluster::{ClusterState, NodeRecord};
use crate::model::device::{Device, DeviceAllocations, DeviceType};
use crate::model::node::Node;
use crate::model::pod::Pod;
use crate::placement::device::fast::FastRequest;
use crate::placement::device::partition::{INSUFFICIENT, MISSING_TABLE};
use crate::placement::device::pod_device_request;

/// An 8-GPU node: NUMA 0 holds GPUs 0-3, NUMA 1 GPUs 4-7, two per PCIe switch; `unhealthy`
/// minors report `health: false`; `annotations` / `labels` go on the Device.
fn device(unhealthy: &[i32], annotations: serde_json::Value, labels: serde_json::Value) -> Device {
    let devices: Vec<_> = (0..8)
        .map(|m| {
            json!({"type": "gpu", "id": format!("GPU-{m}"), "minor": m,
                "health": !unhealthy.contains(&m),
                "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
                              "koordinator.sh/gpu-memory-ratio": "100"},
                "topology": {"socketID": m / 4, "nodeID": m / 4, "pcieID": format!("pci{}", m / 2)}})
        })
        .collect();
    serde_json::from_value(json!({"metadata": {"name": "n", "annotations": annotations,
        "labels": labels}, "spec": {"devices": devices}}))
    .expect("device")
}

fn node(model: &str, policy: Option<&str>) -> NodeRecord {
    let mut labels = serde_json::Map::new();
    labels.insert("node.koordinator.sh/gpu-model".into(), model.into());
    if let Some(p) = policy {
        labels.insert("node.koordinator.sh/gpu-partition-policy".into(), p.into());
    }
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n", "uid": "u",
        "labels": labels}, "status": {"allocatable": {"cpu": "64"}}}))
    .expect("node");
    NodeRecord::from_node(&n)
}

/// A pod asking for `gpus` whole GPUs (or, `shared`, half of one), with `spec` as its
/// `gpu-partition-spec`.
fn needs(gpus: u32, shared: bool, spec: Option<&str>) -> PodNeeds {
    let requests = if shared {
        json!({"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"})
    } else {
        json!({"nvidia.com/gpu": gpus.to_string()})
    };
    let mut p = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "candidate"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests, "limits": requests}}]}});
    if let Some(s) = spec {
        p["metadata"]["annotations"] = json!({"scheduling.koordinator.sh/gpu-partition-spec": s});
    }
    let pod: Pod = serde_json::from_value(p).expect("pod");
    PodNeeds {
        devices: pod_device_request(&pod).expect("valid"),
        cpu: None,
        cpu_request_milli: None,
    }
}

/// Holds `percent` of GPU `minor` (a committed pod's allocation).
fn hold(cluster: &ClusterState, uid: usize, minor: i32, percent: u8) {
    let alloc = DeviceAllocations::parse_annotation(&format!(
        r#"{{"gpu":[{{"minor":{minor},"resources":{{"koordinator.sh/gpu-core":"{percent}","koordinator.sh/gpu-memory-ratio":"{percent}"}}}}]}}"#
    ))
    .expect("allocation");
    cluster.edit_node_for_test("n", |s| {
        s.ledgers_for_test().0.record(
            crate::model::ids::PodUid::new(format!("h{uid}")),
            RecordedAllocation::Allocated(alloc),
            EntryState::Committed,
        )
    });
}

/// The built-in table's partitions of `n` GPUs: aligned blocks (written here from koordinator's
/// `GPUPartitionIndexOfNVIDIAHopper`, not read from the code under test).
fn hopper_partitions(n: i32) -> Vec<BTreeSet<i32>> {
    if ![1, 2, 4, 8].contains(&n) {
        return Vec::new();
    }
    (0..8 / n).map(|i| (i * n..(i + 1) * n).collect()).collect()
}

fn gpu_minors(d: &super::decide::Decision) -> BTreeSet<i32> {
    d.devices
        .as_ref()
        .and_then(|a| a.0.get(&DeviceType::Gpu))
        .map(|l| l.iter().map(|a| a.minor).collect())
        .unwrap_or_default()
}

/// Where the node's table comes from in [`partitions_are_honoured_preferred_and_answered_alike`].
#[derive(Clone, Copy, Debug)]
enum Source {
    /// An H100 Node: koordinator's built-in table; the policy label on the Node.
    BuiltIn,
    /// An A100 Node whose Device lists [`DEVICE_TABLE`]; the policy label on the Device.
    Device,
    /// An A100 Node, no table.
    Nothing,
}

/// Pairs across PCIe switches and a half across NUMA nodes: nothing the topology rules pick.
const DEVICE_TABLE: &str =
    r#"{"2":[{"minors":[1,2]},{"minors":[5,6]},{"minors":[0,7]}],"4":[{"minors":[2,3,4,5]}]}"#;

fn listed(source: Source, n: i32) -> Vec<BTreeSet<i32>> {
    match source {
        Source::BuiltIn => hopper_partitions(n),
        Source::Device => match n {
            2 => vec![
                BTreeSet::from([1, 2]),
                BTreeSet::from([5, 6]),
                BTreeSet::from([0, 7]),
            ],
            4 => vec![BTreeSet::from([2, 3, 4, 5])],
            _ => Vec::new(),
        },
        Source::Nothing => Vec::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A whole-GPU pod whose size the table lists gets one of its partitions whenever one is
    /// free (all its GPUs healthy and untouched); when none is, `Honor` (the policy label, or
    /// the pod's spec) refuses it with koordinator's reason and `Prefer` places it by the
    /// topology rules. Honoured, a size the table does not list, or a node without a table, is
    /// refused unresolvably. Filter's snapshot answers every case, as the full decision does.
    #[test]
    fn partitions_are_honoured_preferred_and_answered_alike(
        source in prop_oneof![Just(Source::BuiltIn), Just(Source::Device), Just(Source::Nothing)],
        policy in prop_oneof![Just(None), Just(Some("Honor")), Just(Some("Prefer"))],
        holdings in proptest::collection::vec((0i32..8, prop_oneof![Just(100u8), Just(50u8)]), 0..6),
        unhealthy in proptest::collection::btree_set(0i32..8, 0..2),
        gpus in 1u32..=8,
        shared in prop::bool::weighted(0.15),
        spec in prop_oneof![Just(None), Just(Some(r#"{"allocatePolicy":"Restricted"}"#)), Just(Some("{}"))],
    ) {
        let unhealthy: Vec<i32> = unhealthy.into_iter().collect();
        let cluster = ClusterState::new();
        let policy_label = policy.map_or(json!({}), |p| json!({"node.koordinator.sh/gpu-partition-policy": p}));
        let (model, node_policy, device_annotations, device_labels) = match source {
            Source::BuiltIn => ("H100", policy, json!({}), json!({})),
            Source::Device => (
                "A100",
                None,
                json!({"scheduling.koordinator.sh/gpu-partitions": DEVICE_TABLE}),
                policy_label,
            ),
            Source::Nothing => ("A100", policy, json!({}), json!({})),
        };
        cluster.set_node("n", Some(node(model, node_policy)));
        let (devices, problems) =
            NodeDevices::from_device(&device(&unhealthy, device_annotations, device_labels));
        prop_assert!(problems.is_empty(), "{:?}", problems);
        cluster.set_devices("n", Some(devices));
        let mut used = BTreeSet::new();
        for (i, (minor, percent)) in holdings.iter().enumerate() {
            if unhealthy.contains(minor) {
                continue;
            }
            hold(&cluster, i, *minor, *percent);
            used.insert(*minor);
        }
        cluster.build_snapshot();
        let needs = needs(gpus, shared, spec);
        let scoring = ScoringConfig::default();
        let full = cluster
            .edit_node_for_test("n", |s| decide_on_node(Some(s), &needs, &[], &scoring))
            .expect("node");

        // The oracle, from the objects written above.
        let honoured = policy == Some("Honor") || spec.is_some();
        let healthy = 8 - unhealthy.len();
        let free: BTreeSet<i32> = (0..8).filter(|m| !unhealthy.contains(m) && !used.contains(m)).collect();
        let listed = listed(source, gpus as i32);
        let free_partitions: Vec<&BTreeSet<i32>> = listed.iter().filter(|p| p.is_subset(&free)).collect();
        if !shared {
            match &full {
                Ok(d) if !free_partitions.is_empty() => {
                    let got = gpu_minors(d);
                    prop_assert!(listed.contains(&got), "got {:?}, free partitions {:?}", got, free_partitions);
                }
                Ok(d) => prop_assert!(!honoured, "honoured, yet placed on {:?} with no free partition", gpu_minors(d)),
                // Fewer healthy GPUs than asked: the structural rule comes first.
                Err(e) if healthy < gpus as usize => {
                    prop_assert_eq!(e.reason.to_string(), "insufficient gpu devices");
                    prop_assert!(e.unresolvable);
                }
                Err(e) if honoured && matches!(source, Source::Nothing) => {
                    prop_assert_eq!((e.reason.clone(), e.unresolvable), (MISSING_TABLE, true));
                }
                Err(e) if honoured && listed.is_empty() => {
                    prop_assert_eq!(e.reason.to_string(), "node(s) Unsupported number of GPU requests");
                    prop_assert!(e.unresolvable);
                }
                Err(e) if honoured && !free_partitions.is_empty() => {
                    prop_assert!(false, "refused ({}) with a free partition {:?}", e, free_partitions);
                }
                Err(e) if honoured => {
                    prop_assert_eq!((e.reason.clone(), e.unresolvable), (INSUFFICIENT, false), "{:?}", free);
                }
                // Preferred only: refused by the general rules, so fewer free GPUs than asked.
                Err(_) => prop_assert!(free.len() < gpus as usize, "free {:?}", free),
            }
        }
        let snapshot = cluster.read_snapshot();
        let fast = needs.devices.as_ref().and_then(|d| FastRequest::new(d, &scoring.device));
        let answer = snapshot_fit(snapshot.node("n"), &needs, fast.as_ref(), &scoring, &mut FitMemo::default());
        prop_assert_eq!(answer, Some(full.clone().map(|_| ())), "the snapshot answers as the full decision");
    }
}

/// A Device table the node's policy label on the Device honours: a 2-GPU pod takes the listed
/// pair, not the PCIe pair the topology rules would give; a malformed table is reported and the
/// node then has none (on a non-Hopper node, honouring pods are refused unresolvably, others
/// placed as before).
#[test]
fn a_device_table_is_followed_and_a_malformed_one_is_reported() {
    let table = json!({"2": [{"minors": [1, 2], "gpuLinkType": "NVLink", "allocationScore": 1}]})
        .to_string();
    let cluster = ClusterState::new();
    cluster.set_node("n", Some(node("A100", None)));
    let (devices, problems) = NodeDevices::from_device(&device(
        &[],
        json!({"scheduling.koordinator.sh/gpu-partitions": table}),
        json!({"node.koordinator.sh/gpu-partition-policy": "Honor"}),
    ));
    assert!(problems.is_empty(), "{problems:?}");
    cluster.set_devices("n", Some(devices));
    let scoring = ScoringConfig::default();
    let decide = |cluster: &ClusterState, needs: &PodNeeds| {
        cluster
            .edit_node_for_test("n", |s| decide_on_node(Some(s), needs, &[], &scoring))
            .expect("node")
    };
    let two = needs(2, false, None);
    assert_eq!(
        gpu_minors(&decide(&cluster, &two).unwrap()),
        BTreeSet::from([1, 2])
    );
    hold(&cluster, 0, 2, 50);
    let refused = decide(&cluster, &two).unwrap_err();
    assert_eq!(
        (refused.reason, refused.unresolvable),
        (INSUFFICIENT, false)
    );
    let four = decide(&cluster, &needs(4, false, None)).unwrap_err();
    assert!(four.unresolvable, "{four}");

    // The same Device with a table that does not parse.
    let (broken, problems) = NodeDevices::from_device(&device(
        &[],
        json!({"scheduling.koordinator.sh/gpu-partitions": r#"{"2":[{"minors":[1]}]}"#}),
        json!({"node.koordinator.sh/gpu-partition-policy": "Honor"}),
    ));
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].class(), "invalid_partition_table");
    assert!(
        problems[0]
            .to_string()
            .contains("scheduling.koordinator.sh/gpu-partitions")
    );
    let before = cluster
        .edit_node_for_test("n", |s| s.device_ledger().free(&[]))
        .expect("node");
    cluster.set_devices("n", Some(broken));
    let after = cluster
        .edit_node_for_test("n", |s| s.device_ledger().free(&[]))
        .expect("node");
    assert_eq!(before, after, "what pods hold is untouched");
    // No table now: Prefer (the Node has no policy) places as before; a pod spec is refused.
    assert!(decide(&cluster, &two).is_ok());
    let spec = decide(&cluster, &needs(2, false, Some("{}"))).unwrap_err();
    assert_eq!((spec.reason, spec.unresolvable), (MISSING_TABLE, true));
}
