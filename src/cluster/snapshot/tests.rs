//! The snapshot against the authoritative state: after any sequence of sync events and
//! binds (with the full build at any point, or concurrently with writers), the published
//! snapshot equals one rebuilt from every node's locked state.
use super::layout::same_name;
use super::*;
use crate::cluster::devices::{EntryState, NodeDevices, RecordedAllocation};
use crate::cluster::{ClusterState, NodeRecord, NodeState, PodRecord, TopologyRecord};
use crate::model::device::{Device, DeviceAllocations};
use crate::model::ids::PodUid;
use crate::model::node::Node;
use crate::model::nrt::NodeResourceTopology;
use crate::model::pod::Pod;
use crate::placement::device::index::dim_of;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde_json::json;
use std::collections::BTreeMap;

fn node_name(i: u8) -> String {
    format!("node-{i:03}")
}

/// A koordlet `Device` object with `gpus` GPUs (NUMA node = minor / 4).
fn device(gpus: u8) -> NodeDevices {
    let devices: Vec<_> = (0..gpus)
        .map(|m| {
            json!({"type": "gpu", "id": format!("GPU-{m}"), "minor": m, "health": true,
            "topology": {"socketID": 0, "nodeID": m / 4, "pcieID": format!("p{}", m / 2)},
            "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
                          "koordinator.sh/gpu-memory-ratio": "100"}})
        })
        .collect();
    let d: Device =
        serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": {"devices": devices}}))
            .expect("device");
    NodeDevices::from_device(&d).0
}

/// A 2-NUMA, 8-CPU koordlet NRT; `policy` is its topology policy.
fn nrt(policy: &str) -> TopologyRecord {
    let detail: Vec<_> = (0..8)
        .map(|id| json!({"id": id, "core": id / 2, "socket": 0, "node": id / 4}))
        .collect();
    let zones: Vec<_> = (0..2)
        .map(|z| {
            json!({"name": format!("node-{z}"), "type": "Node", "resources": [
            {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"},
            {"name": "memory", "capacity": "8Gi", "allocatable": "8Gi", "available": "8Gi"}]})
        })
        .collect();
    let obj: NodeResourceTopology = serde_json::from_value(json!({
        "metadata": {"name": "n", "annotations": {
            "node.koordinator.sh/cpu-topology": json!({"detail": detail}).to_string()}},
        "topologyPolicies": [policy], "zones": zones}))
    .expect("nrt");
    TopologyRecord::from_nrt(&obj)
}

fn node_object(bind_policy: Option<&str>) -> NodeRecord {
    let mut labels = serde_json::Map::new();
    if let Some(p) = bind_policy {
        labels.insert("node.koordinator.sh/cpu-bind-policy".into(), p.into());
    }
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n", "uid": "u",
        "labels": labels}, "status": {"allocatable": {"cpu": "8"}}}))
    .expect("node");
    NodeRecord::from_node(&n)
}

/// An assigned pod as the pod watch sees it: a GPU share and/or a cpuset by annotation.
fn pod(uid: u8, node: u8, gpu: Option<(u8, u8)>, cpus: Option<&str>, phase: &str) -> PodRecord {
    let mut ann = serde_json::Map::new();
    if let Some((minor, ratio)) = gpu {
        ann.insert(
            "scheduling.koordinator.sh/device-allocated".into(),
            json!({"gpu": [{
            "minor": minor, "resources": {"koordinator.sh/gpu-memory-ratio": ratio.to_string()}}]})
            .to_string()
            .into(),
        );
    }
    if let Some(c) = cpus {
        ann.insert(
            "scheduling.koordinator.sh/resource-status".into(),
            json!({"cpuset": c}).to_string().into(),
        );
    }
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("p{uid}"), "namespace": "ns", "uid": format!("uid-{uid}"),
            "annotations": ann},
        "spec": {"nodeName": node_name(node), "containers": [{"name": "c"}]},
        "status": {"phase": phase}}))
    .expect("pod");
    PodRecord::from_pod(&p).expect("record")
}

#[derive(Clone, Debug)]
enum Op {
    Device(u8, Option<u8>),
    Topology(u8, Option<&'static str>),
    Node(u8, Option<Option<&'static str>>),
    Pod {
        uid: u8,
        node: u8,
        gpu: Option<(u8, u8)>,
        cpus: Option<&'static str>,
        phase: &'static str,
    },
    DeletePod(u8),
    /// A bind: assume a GPU share on a node under its lock, as `bind` does.
    Bind(u8, u8, u8),
    /// A failed bind rolls its assumed entry back.
    Rollback(u8, u8),
    Build,
}

fn op(nodes: u8) -> impl Strategy<Value = Op> {
    let n = 0..nodes;
    prop_oneof![
        (n.clone(), proptest::option::of(0u8..=8)).prop_map(|(i, g)| Op::Device(i, g)),
        (
            n.clone(),
            proptest::option::of(prop_oneof![Just("None"), Just("SingleNUMANodePodLevel")])
        )
            .prop_map(|(i, p)| Op::Topology(i, p)),
        (
            n.clone(),
            proptest::option::of(proptest::option::of(Just("FullPCPUs")))
        )
            .prop_map(|(i, p)| Op::Node(i, p)),
        (
            0u8..40,
            n.clone(),
            proptest::option::of((0u8..8, prop_oneof![Just(100u8), Just(50), Just(30)])),
            proptest::option::of(prop_oneof![Just("0-1"), Just("4-7"), Just("2")]),
            prop_oneof![Just("Running"), Just("Running"), Just("Succeeded")]
        )
            .prop_map(|(uid, node, gpu, cpus, phase)| Op::Pod {
                uid,
                node,
                gpu,
                cpus,
                phase
            }),
        (0u8..40).prop_map(Op::DeletePod),
        (n.clone(), 40u8..60, 0u8..8).prop_map(|(i, u, m)| Op::Bind(i, u, m)),
        (n, 40u8..60).prop_map(|(i, u)| Op::Rollback(i, u)),
        Just(Op::Build),
    ]
}

/// Applies `op` through the caches' write API, as the sync handlers and bind do.
fn apply(cluster: &ClusterState, pods: &mut BTreeMap<u8, PodRecord>, op: &Op) {
    match op {
        Op::Device(i, gpus) => {
            cluster.set_devices(&node_name(*i), gpus.map(device));
        }
        Op::Topology(i, policy) => cluster.set_topology(&node_name(*i), policy.map(nrt)),
        Op::Node(i, obj) => cluster.set_node(&node_name(*i), obj.map(node_object)),
        Op::Pod {
            uid,
            node,
            gpu,
            cpus,
            phase,
        } => {
            let new = pod(*uid, *node, *gpu, *cpus, phase);
            cluster.upsert_pod(pods.get(uid), &new);
            pods.insert(*uid, new);
        }
        Op::DeletePod(uid) => {
            if let Some(old) = pods.remove(uid) {
                cluster.remove_pod(&old);
            }
        }
        Op::Bind(i, uid, minor) => {
            let alloc = DeviceAllocations::parse_annotation(&format!(
                r#"{{"gpu":[{{"minor":{minor},"resources":{{"koordinator.sh/gpu-memory-ratio":"20"}}}}]}}"#
            ))
            .expect("allocation");
            cluster.with_existing_node(&node_name(*i), |s| {
                s.devices.record(
                    PodUid::new(format!("bind-{uid}")),
                    RecordedAllocation::Allocated(alloc),
                    EntryState::Assumed {
                        at: std::time::Instant::now(),
                    },
                )
            });
        }
        Op::Rollback(i, uid) => {
            cluster.with_existing_node(&node_name(*i), |s| {
                s.remove_assumed(&PodUid::new(format!("bind-{uid}")))
            });
        }
        Op::Build => cluster.build_snapshot(),
    }
}

/// A pod as the ops described it.
struct ModelPod {
    node: u8,
    gpu: Option<(u8, u8)>,
    cpus: Option<&'static str>,
    running: bool,
}

/// The raw facts the ops gave each node, kept by the test itself: the independent
/// oracle's input.
#[derive(Default)]
struct Model {
    gpus: BTreeMap<u8, u8>,
    topology: BTreeMap<u8, &'static str>,
    pods: BTreeMap<u8, ModelPod>,
    /// Assumed binds: (node, uid) → minor, 20 % each.
    binds: BTreeMap<(u8, u8), u8>,
}

impl Model {
    fn apply(&mut self, cluster: &ClusterState, op: &Op) {
        match op {
            Op::Device(i, g) => {
                match g {
                    Some(g) => self.gpus.insert(*i, *g),
                    None => self.gpus.remove(i),
                };
            }
            Op::Topology(i, p) => {
                match p {
                    Some(p) => self.topology.insert(*i, p),
                    None => self.topology.remove(i),
                };
            }
            Op::Pod {
                uid,
                node,
                gpu,
                cpus,
                phase,
            } => {
                let pod = ModelPod {
                    node: *node,
                    gpu: *gpu,
                    cpus: *cpus,
                    running: *phase == "Running",
                };
                self.pods.insert(*uid, pod);
            }
            Op::DeletePod(uid) => {
                self.pods.remove(uid);
            }
            // Bind records only on a node the caches already hold.
            Op::Bind(i, uid, minor) => {
                if cluster.with_existing_node(&node_name(*i), |_| ()).is_some() {
                    self.binds.insert((*i, *uid), *minor);
                }
            }
            Op::Rollback(i, uid) => {
                self.binds.remove(&(*i, *uid));
            }
            Op::Node(..) | Op::Build => {}
        }
    }

    /// Per GPU of node `i`: (free `gpu-memory-ratio`, NUMA node), from the holdings of
    /// running pods and assumed binds, summed here.
    fn gpu_frees(&self, i: u8) -> Option<Vec<(i64, u32)>> {
        let g = *self.gpus.get(&i)?;
        let mut used = vec![0i64; usize::from(g)];
        let pods = self.pods.values().filter(|p| p.node == i && p.running);
        for (minor, ratio) in pods.filter_map(|p| p.gpu) {
            if let Some(u) = used.get_mut(usize::from(minor)) {
                *u += i64::from(ratio);
            }
        }
        for (_, minor) in self.binds.iter().filter(|((n, _), _)| *n == i) {
            if let Some(u) = used.get_mut(usize::from(*minor)) {
                *u += 20;
            }
        }
        Some(
            (0..g)
                .map(|m| ((100 - used[usize::from(m)]).max(0), u32::from(m / 4)))
                .collect(),
        )
    }

    /// Per NUMA node of node `i` (CPU n on NUMA n / 4): (free CPUs, CPUs in cpusets).
    fn cpu_counts(&self, i: u8) -> Option<[(u16, u16); 2]> {
        self.topology.get(&i)?;
        let mut held = [false; 8];
        let pods = self.pods.values().filter(|p| p.node == i && p.running);
        for list in pods.filter_map(|p| p.cpus) {
            let (a, b) = list.split_once('-').unwrap_or((list, list));
            let (a, b) = (a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap());
            held[a..=b].iter_mut().for_each(|h| *h = true);
        }
        let on = |z: usize| held[4 * z..4 * z + 4].iter().filter(|h| **h).count() as u16;
        Some([(4 - on(0), on(0)), (4 - on(1), on(1))])
    }

    /// What the published snapshot says of node `i` against the facts; `Err` names the
    /// difference.
    fn check(&self, cluster: &ClusterState, i: u8) -> Result<(), String> {
        let snapshot = cluster.read_snapshot();
        let name = node_name(i);
        let view = snapshot.node(&name);
        let Some(view) = view else {
            if self.gpus.contains_key(&i) || self.topology.contains_key(&i) {
                return Err(format!("{name}: missing, though it has a Device or an NRT"));
            }
            return Ok(());
        };
        let ratio = dim_of(crate::model::device::GPU_MEMORY_RATIO).expect("indexed");
        match (self.gpu_frees(i), view.devices) {
            (None, DeviceView::Missing { held, .. }) => {
                let holds = self
                    .pods
                    .values()
                    .any(|p| p.node == i && p.running && p.gpu.is_some())
                    || self.binds.keys().any(|(n, _)| *n == i);
                if held != holds {
                    return Err(format!("{name}: held {held}, the facts {holds}"));
                }
            }
            (Some(want), DeviceView::Indexed(index)) => {
                let gpu = crate::model::device::DeviceType::Gpu;
                let mut got: Vec<(i64, u32)> = Vec::new();
                for group in index.frees(&gpu) {
                    for _ in 0..group.count {
                        got.push((group.dims[ratio], group.numa.expect("NUMA known")));
                    }
                }
                // Groups carry milli-units.
                let mut want_sorted: Vec<(i64, u32)> =
                    want.iter().map(|(r, numa)| (r * 1000, *numa)).collect();
                want_sorted.sort_unstable();
                got.sort_unstable();
                if got != want_sorted {
                    return Err(format!(
                        "{name}: free GPUs {got:?}, the facts {want_sorted:?}"
                    ));
                }
                let sums = index.sums(&gpu);
                let free: i64 = want.iter().map(|w| w.0).sum();
                if sums.free[ratio] != free || sums.total[ratio] != 100 * want.len() as i64 {
                    return Err(format!("{name}: sums {sums:?}, the facts free {free}"));
                }
            }
            (want, got) => {
                return Err(format!("{name}: devices {got:?}, the facts {want:?}"));
            }
        }
        if let Some(want) = self.cpu_counts(i) {
            let summary = view
                .cpu
                .summary
                .as_ref()
                .map_err(|e| format!("{name}: no CPU summary with an NRT: {e:?}"))?;
            let got: Vec<(u16, u16)> = summary
                .stats
                .zones()
                .iter()
                .map(|z| (z.free_cpus, z.allocated_cpus))
                .collect();
            if got != want {
                return Err(format!(
                    "{name}: CPUs (free, held) {got:?}, the facts {want:?}"
                ));
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Sequential: any sequence, with the full build anywhere (or first read) in it.
    ///
    /// Independent: [`Model`] keeps the raw facts of every op and recomputes what the
    /// snapshot must say of each node (presence, each GPU's free share and NUMA node, the
    /// sums, free and held CPUs per NUMA node) with its own arithmetic; a planted bug
    /// (the ledger counting an assumed bind's share twice) passed the rebuild comparison and fails
    /// this. Regression only: `check_snapshot` (published == `NodeState::summary` rebuilt,
    /// the same function on both sides) proves publication and versioning.
    #[test]
    fn snapshot_equals_a_rebuild_after_any_sequence(
        ops in proptest::collection::vec(op(70), 1..250),
    ) {
        let cluster = ClusterState::new();
        let mut pods = BTreeMap::new();
        let mut model = Model::default();
        for op in &ops {
            apply(&cluster, &mut pods, op);
            model.apply(&cluster, op);
            if cluster.snapshot_built() {
                prop_assert_eq!(cluster.check_snapshot(), Ok(()), "after {:?}", op);
                for i in 0..70 {
                    prop_assert_eq!(model.check(&cluster, i), Ok(()), "after {:?}", op);
                }
            }
        }
        prop_assert_eq!(cluster.check_snapshot(), Ok(()));
        cluster.build_snapshot();
        for i in 0..70 {
            prop_assert_eq!(model.check(&cluster, i), Ok(()));
        }
    }

    /// Capacity returns (`super::returns`, what the requeue signal acts on) miss no growth:
    /// after every op on a live snapshot, whenever [`Model`]'s raw facts say a node can now
    /// hold something it could not before, that node's return names the kind. For GPUs: for
    /// some share `t`, more GPUs have at least `t` free (any single- or multi-GPU request of
    /// `t` per GPU that did not fit may fit now), or a Device appeared with free GPUs; for
    /// CPUs: some NUMA node has more free CPUs, or an NRT appeared. A return with no growth
    /// is allowed (a spare retry); a missed one would leave a pod waiting minutes. It found
    /// one: a retried bind that moves a 20 % share from a 60 %-free GPU to a full one keeps
    /// the sum, the largest free and the per-NUMA count, yet makes a second GPU 80 % free
    /// (an 8-GPU request of 80 % each fits now); judged on those alone it was missed.
    #[test]
    fn capacity_returns_miss_no_growth(
        ops in proptest::collection::vec(op(6), 1..200),
    ) {
        let cluster = ClusterState::new();
        cluster.capacity_returns().enable();
        let mut pods = BTreeMap::new();
        let mut model = Model::default();
        for op in &ops {
            let live = cluster.snapshot_built();
            let before: Vec<_> = (0..6).map(|i| (model.gpu_frees(i), model.cpu_counts(i))).collect();
            apply(&cluster, &mut pods, op);
            model.apply(&cluster, op);
            let taken = cluster.capacity_returns().take();
            if !live {
                continue;
            }
            for i in 0..6u8 {
                let returned = taken
                    .get(node_name(i).as_str())
                    .copied()
                    .unwrap_or_default();
                let (gpu_before, cpu_before) = &before[usize::from(i)];
                let gpu_grew = match (gpu_before, model.gpu_frees(i)) {
                    (Some(old), Some(new)) => (1..=100).any(|t| {
                        new.iter().filter(|(f, _)| *f >= t).count()
                            > old.iter().filter(|(f, _)| *f >= t).count()
                    }),
                    (None, Some(new)) => new.iter().any(|(f, _)| *f > 0),
                    _ => false,
                };
                prop_assert!(
                    !gpu_grew || returned.intersects(super::super::returns::ResourceKinds::GPU),
                    "{}: GPUs {:?} -> {:?} after {:?}, returned {:?}",
                    node_name(i), gpu_before, model.gpu_frees(i), op, returned
                );
                let cpu_grew = match (cpu_before, model.cpu_counts(i)) {
                    (Some(old), Some(new)) => old.iter().zip(new.iter()).any(|(o, n)| n.0 > o.0),
                    (None, Some(_)) => true,
                    _ => false,
                };
                prop_assert!(
                    !cpu_grew || returned.intersects(super::super::returns::ResourceKinds::CPU),
                    "{}: CPUs {:?} -> {:?} after {:?}, returned {:?}",
                    node_name(i), cpu_before, model.cpu_counts(i), op, returned
                );
            }
        }
    }

    /// The in-order resolver answers what a linear search of the interned names answers,
    /// for candidates in any order: runs in listing order (its guess holds), jumps, repeats,
    /// unknown names and names one byte longer or shorter than a known one.
    #[test]
    fn finder_answers_like_a_linear_search_in_any_order(
        ops in proptest::collection::vec(op(70), 0..120),
        runs in proptest::collection::vec((0u8..80, 1u8..12, any::<bool>()), 0..30),
    ) {
        let cluster = ClusterState::new();
        cluster.build_snapshot();
        // Listed in name order first, as a bootstrap lists them, so runs follow indices.
        for i in 0..70u8 {
            cluster.set_devices(&node_name(i), Some(device(2)));
        }
        let mut pods = BTreeMap::new();
        for op in &ops {
            apply(&cluster, &mut pods, op);
        }
        let snapshot = cluster.read_snapshot();
        let mut queries: Vec<String> = Vec::new();
        for (start, len, junk) in runs {
            queries.extend((start..start.saturating_add(len)).map(node_name));
            if junk {
                queries.extend(["node-00".into(), format!("{}0", node_name(start)), String::new()]);
            }
        }
        let mut finder = snapshot.finder();
        for name in &queries {
            let linear = snapshot.names.names.iter().position(|n| **n == **name);
            // A position holds a node when its slot has facts (not the presence bits).
            let present = |i: usize| snapshot.chunks[i / CHUNK].nodes[i % CHUNK].devices.is_some();
            let expected = linear.filter(|&i| present(i));
            prop_assert_eq!(finder.find(name).map(|f| f.index()), expected, "{}", name);
            prop_assert_eq!(snapshot.find(name).map(|f| f.index()), expected, "{}", name);
        }
    }
}

/// Concurrent: writers on overlapping nodes while the full build runs and after it; at
/// quiescence the snapshot equals the rebuild.
#[test]
fn snapshot_converges_under_concurrent_writers_and_build() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for round in 0..24 {
        let cluster = Arc::new(ClusterState::new());
        let per_thread: Vec<Vec<Op>> = (0..3)
            .map(|_| {
                proptest::collection::vec(op(40), 200)
                    .new_tree(&mut runner)
                    .expect("ops")
                    .current()
                    .into_iter()
                    .filter(|o| !matches!(o, Op::Build | Op::Pod { .. } | Op::DeletePod(_)))
                    .collect()
            })
            .collect();
        let start = Arc::new(std::sync::Barrier::new(4));
        let mut handles = Vec::new();
        for ops in per_thread {
            let (c, s) = (cluster.clone(), start.clone());
            handles.push(std::thread::spawn(move || {
                let mut pods = BTreeMap::new();
                s.wait();
                for op in &ops {
                    apply(&c, &mut pods, op);
                }
            }));
        }
        start.wait();
        cluster.build_snapshot();
        for h in handles {
            h.join().expect("writer");
        }
        assert_eq!(cluster.check_snapshot(), Ok(()), "round {round}");
    }
}

/// The build's race, made deterministic: the build reads a node, a writer then changes it
/// and publishes, and only then is the build installed. The newer publish must win, for
/// a changed node, a removed node, and a node compacted away meanwhile.
#[test]
fn a_build_older_than_a_publish_never_overwrites_it() {
    let summary_with = |gpus: Option<u8>| {
        let mut state = NodeState::default();
        state.devices.set_devices(gpus.map(device));
        state.summary()
    };
    let (old, new) = (summary_with(None), summary_with(Some(2)));
    assert_ne!(old, new);
    let snapshots = ReadSnapshots::default();
    let building = snapshots.start_build().expect("first build");
    assert!(snapshots.is_live());
    // Read by the build at version 1 ...
    let read: Vec<_> = ["changed", "removed"]
        .into_iter()
        .map(|n| (Arc::from(n), 1, old.clone()))
        .chain((0..100u8).map(|i| (Arc::from(node_name(i).as_str()), 1, old.clone())))
        .collect();
    // ... then written and published at version 2, before the build is installed.
    snapshots.publish("changed", 2, Some(new.clone()), |_, _| ());
    snapshots.publish("removed", 2, Some(new.clone()), |_, _| ());
    snapshots.publish("removed", 3, None, |_, _| ());
    for i in 0..100u8 {
        // Published, then removed: enough removals to compact the names away.
        snapshots.publish(&node_name(i), 2, Some(new.clone()), |_, _| ());
        snapshots.publish(&node_name(i), 3, None, |_, _| ());
    }
    assert!(
        snapshots.load().names.len() < 102,
        "the removed names were compacted before the install"
    );
    snapshots.install(read);
    snapshots.finish_build(building);
    let snapshot = snapshots.load();
    assert_eq!(snapshot.summary("changed"), Some(new));
    assert_eq!(snapshot.summary("removed"), None);
    for i in 0..100u8 {
        assert_eq!(snapshot.summary(&node_name(i)), None, "{}", node_name(i));
    }
    assert_eq!(snapshot.len(), 1);
}

/// Node churn: removed names are compacted away, and a name that comes back is found.
#[test]
fn same_name_is_byte_equality() {
    let names: [&[u8]; 9] = [
        b"",
        b"n",
        b"node-1",
        b"node-2",
        b"gpu-node-01234",
        b"gpu-node-01235",
        b"xpu-node-01234",
        b"gpu-node-0123",
        b"gpu-node-012345",
    ];
    for a in names {
        for b in names {
            assert_eq!(same_name(a, b), a == b, "{a:?} vs {b:?}");
        }
    }
}

#[test]
fn removed_nodes_are_compacted_and_can_return() {
    let cluster = ClusterState::new();
    cluster.build_snapshot();
    for i in 0..120u8 {
        cluster.set_devices(&node_name(i), Some(device(2)));
    }
    for i in 0..100u8 {
        cluster.set_devices(&node_name(i), None);
    }
    assert_eq!(cluster.check_snapshot(), Ok(()));
    let snapshot = cluster.read_snapshot();
    assert_eq!(snapshot.len(), 20);
    assert!(
        snapshot.names.names.len() < 120,
        "removed names were compacted: {} names kept",
        snapshot.names.names.len()
    );
    assert!(snapshot.node(&node_name(5)).is_none());
    drop(snapshot);
    cluster.set_devices(&node_name(5), Some(device(1)));
    assert_eq!(cluster.check_snapshot(), Ok(()));
    assert!(cluster.read_snapshot().node(&node_name(5)).is_some());
}
