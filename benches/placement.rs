//! Library-level placement benches (no HTTP): filter and prioritize over 5,000 nodes × 8 GPUs
//! in names mode, each measured as the server does it (decode the body, decide, serialize the
//! answer), next to the baseline of only decoding the same body and serializing the same
//! answer; and bind's allocate+record under the node lock, plus a whole bind against an
//! in-memory `PodApi` (no API round trips).
//!
//! Criterion reports means; budgets are about p99, so after the criterion groups this binary
//! also samples each case and prints percentiles and the ratio to the baseline, both measured
//! in this run. Run: `cargo bench --bench placement` (see BENCHMARKS.md).
//!
//! The `numa` group runs first and needs no cluster: `place` and `fast_feasible` for one
//! cpuset pod on one node (2 and 8 NUMA nodes, including the 255-subset worst case), the
//! summary build, and `fast_feasible` over 5,000 summaries. Run only it with
//! `PLACEMENT_NUMA_ONLY=1 cargo bench --bench placement -- numa`. The `pod_decode` group (also
//! before the cluster) decodes one watch event's pod with and without its managed fields.
//!
//! `PLACEMENT_DRA=1` adds DRA beside the cluster: a ResourceSlice per node and 10 claims per
//! node, one holding a GPU (the read path with DRA objects present).
//! `PLACEMENT_CLUSTER=distinct` runs everything on a cluster where no two nodes share a state
//! (the per-request memo's worst case); `--bench none` skips criterion, leaving percentiles;
//! `PLACEMENT_CASES` (comma-separated case labels) picks the percentile cases.
//!
//! `PLACEMENT_SCALING=1` instead times the verbs alone (decode and encode untimed) at 1,000,
//! 5,000 and 20,000 candidates of a 20,000-node cluster, warm and cold memo, and splits each
//! case's excess over the pass-through into a cost per node and a fixed part per request.
//! `PLACEMENT_LOOP=warm|cold` runs one verb alone for one case in a steady loop, to profile:
//! `PLACEMENT_LOOP=cold perf record target/release/deps/placement-* --bench none` (filter at
//! 1,000 candidates; `PLACEMENT_LOOP_VERB=prioritize`, `PLACEMENT_LOOP_NODES=5000`).
//! `PLACEMENT_SCORE_STRATEGY=fragmentation` decides with that device strategy throughout.
//! `PLACEMENT_PREEMPT=1` times the GPU share totals' pass and preempt's victim search (issue 38).

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

/// The binary's allocator (`src/main.rs`), so the library allocates here as it does in
/// production.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use futures::future::BoxFuture;

use common::{Case, PerNodeSplit, extender_body, slashed, summarize};
use device_numa_extender::cluster::{Assumption, ClusterState};
use device_numa_extender::extender::input::decode;
use device_numa_extender::metrics::Metrics;
use device_numa_extender::model::cpuset::CpuSet;
use device_numa_extender::model::device::DEVICE_ALLOCATED;
use device_numa_extender::model::ids::PodUid;
use device_numa_extender::model::pod::Pod;
use device_numa_extender::model::wire::{ExtenderArgsRef, ExtenderFilterResult, HostPriority};
use device_numa_extender::placement::cpu::accumulator::synthetic_topology;
use device_numa_extender::placement::cpu::{
    CpuBindPolicy, CpuExclusivePolicy, CpuScoring, CpuSummary, CpuTopology, CpusetWish,
    NodeCpuBindPolicy, NodeCpuView, NumaAllocateStrategy, NumaExclusive, NumaMask, NumaPolicy,
    NumaUsage, NumaZone, PodCpuRequest, fast_feasible, place,
};
use device_numa_extender::placement::device::pod_device_request;
use device_numa_extender::placement::device::request::PodDeviceRequest;
use device_numa_extender::scheduler::allocate_on;
use device_numa_extender::scheduler::bind::{ApiError, PodApi};
use device_numa_extender::scheduler::verbs;
use device_numa_extender::scheduler::{Scheduler, ScoringConfig, ScoringFlags};
use device_numa_extender::sync::file_source::ClusterFile;
use device_numa_extender::sync::{self, Readiness, SyncContext};

const NODES: usize = 5_000;

/// A `PodApi` that answers from memory and writes nowhere: bind minus the API round trips.
/// `confirmed_by_watch` is true, as in the live service, so bind only records an assumed entry.
struct MemoryPodApi {
    pods: BTreeMap<String, Pod>,
}

impl PodApi for MemoryPodApi {
    fn get_pod<'a>(
        &'a self,
        _namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, ApiError>> {
        let pod = self.pods.get(name).cloned();
        Box::pin(async move { Ok(pod) })
    }
    fn patch_annotations<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
        _uid: &'a str,
        _resource_version: Option<&'a str>,
        annotations: &'a BTreeMap<String, Option<String>>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        black_box(annotations);
        Box::pin(async { Ok(()) })
    }
    fn create_binding<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
        _uid: &'a str,
        _resource_version: Option<&'a str>,
        _node: &'a str,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        black_box(annotations);
        Box::pin(async { Ok(()) })
    }
    fn binding_deadline(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    fn confirmed_by_watch(&self) -> bool {
        true
    }
}

fn pod_of(case: Case, name: &str, uid: &str) -> Pod {
    serde_json::from_value(case.pending_pod(name, uid)).expect("pod decodes")
}

/// The synthetic cluster, replayed through the offline sync path, behind a ready `Scheduler`.
fn state(nodes: usize) -> Scheduler {
    // PLACEMENT_CLUSTER=distinct: no two nodes alike (`common::cluster_of_distinct_holders`),
    // the per-request memo's worst case.
    let c = if std::env::var("PLACEMENT_CLUSTER").is_ok_and(|v| v == "distinct") {
        common::cluster_of_distinct_holders(nodes)
    } else {
        common::cluster(nodes, true)
    };
    fn typed<T: serde::de::DeserializeOwned>(v: Vec<serde_json::Value>) -> Vec<T> {
        v.into_iter()
            .map(|o| serde_json::from_value(o).expect("fixture decodes"))
            .collect()
    }
    let mut file = ClusterFile {
        nodes: typed(c.nodes),
        pods: typed(c.pods),
        devices: c.devices,
        topologies: typed(c.topologies),
        ..Default::default()
    };
    // PLACEMENT_DRA=1: a ResourceSlice per node (every GPU joined) and 10 claims per node, one
    // of them holding a GPU (`common::dra_objects`).
    if std::env::var("PLACEMENT_DRA").is_ok_and(|v| v == "1") {
        let (slices, claims) = common::dra_objects(nodes, 10);
        file.resource_slices = typed(slices);
        file.resource_claims = typed(claims);
    }
    let metrics = Metrics::new();
    let cluster = Arc::new(ClusterState::new());
    let readiness = Readiness::new(sync::declared_kinds(), None, metrics.clone());
    let ctx = SyncContext {
        cluster: cluster.clone(),
        readiness: readiness.clone(),
        metrics: metrics.clone(),
        allow_dra_extended: false,
        dra_ownership: None,
        taint_rule_version: Default::default(),
    };
    sync::run_file(&ctx, file);
    assert!(readiness.is_ready(), "{:?}", readiness.not_ready_reason());
    let pods = Case::ALL
        .iter()
        .map(|case| {
            let name = format!("bind-{}", case.label());
            let pod = pod_of(*case, &name, &format!("uid-{name}"));
            (name, pod)
        })
        .collect();
    Scheduler::new(
        cluster,
        readiness,
        metrics,
        Arc::new(MemoryPodApi { pods }),
        scoring_from_env(),
        Default::default(),
    )
}

/// `PLACEMENT_SCORE_STRATEGY` (a `--score-strategy` value, e.g. `fragmentation`): the device
/// scoring the cluster decides with; the default scoring without it.
fn scoring_from_env() -> ScoringConfig {
    match std::env::var("PLACEMENT_SCORE_STRATEGY") {
        Ok(strategy) => ScoringConfig::from_flags(&ScoringFlags {
            device_strategy: Box::leak(strategy.into_boxed_str()),
            ..ScoringFlags::DEFAULT
        })
        .expect("PLACEMENT_SCORE_STRATEGY is a --score-strategy value"),
        Err(_) => ScoringConfig::default(),
    }
}

// ---- the server's work per request, and the baseline --------------------------------------

fn filter(state: &Scheduler, body: &[u8]) -> Vec<u8> {
    let args: ExtenderArgsRef = decode(body).expect("valid body");
    serde_json::to_vec(&verbs::filter(state, args)).expect("serialize")
}

fn prioritize(state: &Scheduler, body: &[u8]) -> Vec<u8> {
    let args: ExtenderArgsRef = decode(body).expect("valid body");
    serde_json::to_vec(&verbs::prioritize(state, args)).expect("serialize")
}

/// The answers of one case, computed once: the baseline serializes exactly these.
struct Answers<'a> {
    filter: ExtenderFilterResult<'a>,
    prioritize: Vec<HostPriority<'a>>,
}

fn answers<'a>(state: &Scheduler, body: &'a [u8]) -> Answers<'a> {
    Answers {
        filter: verbs::filter(state, decode(body).expect("valid body")),
        prioritize: verbs::prioritize(state, decode(body).expect("valid body")),
    }
}

/// Baseline: decode the same body, serialize a response of the same size (the same one).
fn baseline_filter(answers: &Answers, body: &[u8]) -> Vec<u8> {
    let args: ExtenderArgsRef = decode(body).expect("valid body");
    black_box(&args);
    serde_json::to_vec(&answers.filter).expect("serialize")
}

fn baseline_prioritize(answers: &Answers, body: &[u8]) -> Vec<u8> {
    let args: ExtenderArgsRef = decode(body).expect("valid body");
    black_box(&args);
    serde_json::to_vec(&answers.prioritize).expect("serialize")
}

// ---- bind -----------------------------------------------------------------------------------

/// A node with room for both device cases (1 whole GPU used of 8, no shared one).
const BIND_NODE: &str = "node-00001";

fn device_request(case: Case) -> PodDeviceRequest {
    pod_device_request(&pod_of(case, "x", "x"))
        .expect("valid")
        .expect("needs devices")
}

/// Bind's critical section: lock the node, allocate against committed + assumed, record the
/// assumed entry and its assumption (and render the annotation) through the caches' one
/// `assume`, publish the node to the read snapshot. [`undo`] it outside the timed region.
fn allocate_record(state: &Scheduler, req: &PodDeviceRequest, uid: &PodUid) -> Instant {
    let at = state
        .cluster
        .assume(BIND_NODE, uid, |node| {
            let allocation = allocate_on(Some(node), req, &[], &state.scoring)
                .expect("fits")
                .expect("node has devices");
            let annotation = allocation.to_annotation();
            Ok::<_, ()>(Some(Assumption {
                devices: Some(allocation),
                cpus: None,
                cpu_milli: 0,
                namespace: "bench".into(),
                name: uid.to_string(),
                annotations: [(DEVICE_ALLOCATED.to_string(), Some(annotation))].into(),
            }))
        })
        .expect("bind node")
        .expect("decided")
        .expect("holds devices");
    black_box(at)
}

fn undo(state: &Scheduler, uid: &PodUid, at: Instant) {
    assert!(state.cluster.release_assumed(BIND_NODE, uid, at));
}

/// [`undo`] for a whole bind: its assumption says when it assumed.
fn undo_bind(state: &Scheduler, uid: &PodUid) {
    let at = state.cluster.assumptions().get(uid).expect("assumed").at;
    undo(state, uid, at);
}

fn bind_args(case: Case) -> device_numa_extender::model::wire::ExtenderBindingArgs {
    let name = format!("bind-{}", case.label());
    device_numa_extender::model::wire::ExtenderBindingArgs {
        pod_uid: format!("uid-{name}"),
        pod_name: name,
        pod_namespace: "bench".into(),
        node: BIND_NODE.into(),
    }
}

// ---- criterion ------------------------------------------------------------------------------

fn benches(c: &mut Criterion, state: &Scheduler, rt: &tokio::runtime::Runtime) {
    let mut g = c.benchmark_group(format!("placement_{NODES}_nodes"));
    g.sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    // PLACEMENT_CASES=shared_gpu,gpu_cpuset_8 picks cases (by label; default all).
    let picked = |case: &Case| {
        std::env::var("PLACEMENT_CASES").map_or(true, |v| v.split(',').any(|c| c == case.label()))
    };
    for case in Case::ALL.into_iter().filter(picked) {
        let body = extender_body(case, NODES);
        let ans = answers(state, &body);
        g.throughput(Throughput::Elements(NODES as u64));
        g.bench_function(format!("filter/{}", case.label()), |b| {
            b.iter(|| filter(state, black_box(&body)))
        });
        g.bench_function(format!("prioritize/{}", case.label()), |b| {
            b.iter(|| prioritize(state, black_box(&body)))
        });
        g.bench_function(format!("baseline_filter/{}", case.label()), |b| {
            b.iter(|| baseline_filter(&ans, black_box(&body)))
        });
        g.bench_function(format!("baseline_prioritize/{}", case.label()), |b| {
            b.iter(|| baseline_prioritize(&ans, black_box(&body)))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("bind");
    g.sample_size(50).measurement_time(Duration::from_secs(3));
    for case in [Case::SharedGpu, Case::TwoGpus, Case::PartitionedGpus] {
        let uid = PodUid::new(format!("uid-bind-{}", case.label()));
        let req = device_request(case);
        g.bench_function(format!("allocate_record/{}", case.label()), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    let at = allocate_record(state, &req, &uid);
                    total += t.elapsed();
                    undo(state, &uid, at);
                }
                total
            })
        });
        let args = bind_args(case);
        g.bench_function(format!("bind_in_memory/{}", case.label()), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    rt.block_on(state.binder.bind(&args)).expect("binds");
                    total += t.elapsed();
                    undo_bind(state, &uid);
                }
                total
            })
        });
    }
    g.finish();
}

// ---- NUMA hints and cpusets (pure placement, no cluster) --------------------------------------

/// An owned node for [`NodeCpuView`]s: `sockets × numa_per_socket × cores × 2` CPUs, each NUMA
/// node with 16 GiB, `held` CPUs of every NUMA node held by a single-NUMA cpuset pod.
struct NumaNode {
    topo: CpuTopology,
    zones: Vec<NumaZone>,
    usage: Vec<NumaUsage>,
    allocated: CpuSet,
    policy: NumaPolicy,
}

impl NumaNode {
    fn new(
        sockets: u32,
        numa_per_socket: u32,
        cores: u32,
        held: usize,
        policy: NumaPolicy,
    ) -> Self {
        let topo = synthetic_topology(sockets, numa_per_socket, cores, 2);
        let mut allocated = CpuSet::new();
        let mut zones = Vec::new();
        let mut usage = Vec::new();
        for id in topo.numa_ids().collect::<Vec<_>>() {
            let cpus = topo.numa_cpus(id);
            for c in cpus.iter().take(held) {
                allocated.insert(c);
            }
            zones.push(NumaZone {
                id,
                cpu_milli: cpus.len() as i64 * 1000,
                memory_bytes: 16 << 30,
            });
            usage.push(NumaUsage {
                cpu_milli: held as i64 * 1000,
                memory_bytes: 0,
                single_numa_pods: u32::from(held > 0),
                multi_numa_pods: 0,
            });
        }
        NumaNode {
            topo,
            zones,
            usage,
            allocated,
            policy,
        }
    }

    fn view(&self) -> NodeCpuView<'_> {
        NodeCpuView {
            topology: &self.topo,
            reserved: CpuSet::new(),
            shared_pool: CpuSet::new(),
            allocated: self.allocated,
            pcpu_exclusive: CpuSet::new(),
            numa_exclusive: CpuSet::new(),
            zones: &self.zones,
            usage: &self.usage,
            bind_policy: NodeCpuBindPolicy::None,
            numa_policy: self.policy,
            strategy: NumaAllocateStrategy::MostAllocated,
            amplification: Default::default(),
        }
    }
}

fn lsr_pod(cpus: i64) -> PodCpuRequest {
    PodCpuRequest {
        cpu_milli: cpus * 1000,
        memory_bytes: 8 << 30,
        cpuset: Some(CpusetWish {
            policy: CpuBindPolicy::FullPcpus,
            required: true,
            exclusive: CpuExclusivePolicy::None,
        }),
        numa_policy: NumaPolicy::None,
        numa_exclusive: NumaExclusive::Unset,
    }
}

/// `numa/...`: one pod on one node. The 8-NUMA "all subsets" cases hold 12 of 16 CPUs on every
/// NUMA node, so an 8-CPU pod fits no single NUMA node and no preferred hint exists: all 255
/// subsets are enumerated before BestEffort settles on a pair and Restricted rejects.
/// A bound GPU pod as a watch event carries it: the annotations bind writes, and the managed
/// fields of its creator (the spec tree) and of the binding.
const WATCHED_POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bench-00042","namespace":"bench","uid":"5f0c1d9e-6a8b-4c4e-9a51-0d2f3b4c5d6e","resourceVersion":"123456","creationTimestamp":"2026-12-07T01:00:00Z","labels":{"app":"bench"},"annotations":{"scheduling.koordinator.sh/device-allocated":"{\"gpu\":[{\"minor\":3,\"resources\":{\"koordinator.sh/gpu-core\":\"50\",\"koordinator.sh/gpu-memory\":\"40Gi\",\"koordinator.sh/gpu-memory-ratio\":\"50\"}}]}"},"managedFields":[{"manager":"e2e.test","operation":"Update","apiVersion":"v1","time":"2026-12-07T01:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"main\"}":{".":{},"f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:resources":{".":{},"f:limits":{".":{},"f:cpu":{},"f:koordinator.sh/gpu-memory-ratio":{},"f:memory":{}},"f:requests":{".":{},"f:cpu":{},"f:koordinator.sh/gpu-memory-ratio":{},"f:memory":{}}},"f:terminationMessagePath":{},"f:terminationMessagePolicy":{}}},"f:dnsPolicy":{},"f:enableServiceLinks":{},"f:restartPolicy":{},"f:schedulerName":{},"f:securityContext":{},"f:terminationGracePeriodSeconds":{}}}},{"manager":"device-numa-extender","operation":"Update","apiVersion":"v1","subresource":"binding","time":"2026-12-07T01:00:01Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:annotations":{".":{},"f:scheduling.koordinator.sh/device-allocated":{}}}}}]},"spec":{"containers":[{"name":"main","image":"app:1","resources":{"limits":{"cpu":"1","koordinator.sh/gpu-memory-ratio":"50","memory":"1Gi"},"requests":{"cpu":"1","koordinator.sh/gpu-memory-ratio":"50","memory":"1Gi"}},"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"IfNotPresent"}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","schedulerName":"device-numa-scheduler","nodeName":"node-00042","securityContext":{},"enableServiceLinks":true,"priority":0},"status":{"phase":"Pending","conditions":[{"type":"PodScheduled","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-12-07T01:00:01Z"}],"qosClass":"Burstable"}}"#;

/// The same slim pod with `metadata` decoded as k8s-openapi's `ObjectMeta` decodes it (what
/// `Pod` did before `model::pod::lean_meta`): the baseline of the `pod_decode` group.
#[derive(serde::Deserialize)]
struct PodWithFullMeta {
    #[serde(default)]
    #[allow(dead_code)]
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    #[serde(default)]
    #[allow(dead_code)]
    spec: device_numa_extender::model::pod::PodSpec,
    #[serde(default)]
    #[allow(dead_code)]
    status: device_numa_extender::model::pod::PodStatus,
}

/// Decoding one watch event's pod: the service's `Pod` (managed fields skipped) against the
/// same type with the full `ObjectMeta`, in one run.
fn pod_decode_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("pod_decode");
    g.throughput(Throughput::Bytes(WATCHED_POD.len() as u64));
    g.bench_function("lean_meta", |b| {
        b.iter(|| black_box(serde_json::from_str::<Pod>(black_box(WATCHED_POD)).unwrap()))
    });
    g.bench_function("full_meta", |b| {
        b.iter(|| {
            black_box(serde_json::from_str::<PodWithFullMeta>(black_box(WATCHED_POD)).unwrap())
        })
    });
    g.finish();
}

fn numa_benches(c: &mut Criterion) {
    let scoring = CpuScoring::default();
    let mut g = c.benchmark_group("numa");
    g.sample_size(50)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let cases = [
        (
            "2numa_single_fit",
            NumaNode::new(1, 2, 8, 4, NumaPolicy::SingleNumaNode),
            8,
        ),
        (
            "8numa_single_fit",
            NumaNode::new(2, 4, 8, 0, NumaPolicy::SingleNumaNode),
            8,
        ),
        (
            "8numa_all_subsets_besteffort",
            NumaNode::new(2, 4, 8, 12, NumaPolicy::BestEffort),
            8,
        ),
        (
            "8numa_all_subsets_restricted",
            NumaNode::new(2, 4, 8, 12, NumaPolicy::Restricted),
            8,
        ),
        (
            "8numa_no_numa_policy",
            NumaNode::new(2, 4, 8, 12, NumaPolicy::None),
            8,
        ),
    ];
    for (name, node, cpus) in &cases {
        let req = lsr_pod(*cpus);
        let view = node.view();
        g.bench_function(format!("place/{name}"), |b| {
            b.iter(|| black_box(place(black_box(&view), &req, None, &scoring)))
        });
        let summary = CpuSummary::new(&view);
        g.bench_function(format!("fast_feasible/{name}"), |b| {
            b.iter(|| black_box(fast_feasible(black_box(&summary), &req, false, &scoring)))
        });
    }
    let (_, node, cpus) = &cases[2];
    let view = node.view();
    let req = lsr_pod(*cpus);
    g.bench_function("place_with_devices/8numa_all_subsets_besteffort", |b| {
        b.iter(|| {
            // Devices only on NUMA nodes 6 and 7.
            let mut gpus = |m: NumaMask| m.0 & !0b1100_0000 == 0;
            black_box(place(black_box(&view), &req, Some(&mut gpus), &scoring))
        })
    });
    g.bench_function("summary_build/8numa", |b| {
        b.iter(|| black_box(CpuSummary::new(black_box(&view))))
    });
    // Filter's shape: one pod against 5,000 2-NUMA summaries.
    let nodes: Vec<NumaNode> = (0..64)
        .map(|i| NumaNode::new(1, 2, 16, i % 12, NumaPolicy::SingleNumaNode))
        .collect();
    let summaries: Vec<CpuSummary> = (0..NODES)
        .map(|i| CpuSummary::new(&nodes[i % nodes.len()].view()))
        .collect();
    let req = lsr_pod(8);
    g.throughput(Throughput::Elements(NODES as u64));
    g.bench_function(format!("fast_feasible_{NODES}_nodes/2numa_single"), |b| {
        b.iter(|| {
            summaries
                .iter()
                .filter(|s| matches!(fast_feasible(s, &req, false, &scoring), Some(Ok(()))))
                .count()
        })
    });
    g.finish();
}

// ---- percentiles and ratios -----------------------------------------------------------------

fn sample(n: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..n / 10 {
        f();
    }
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn percentiles(state: &Scheduler, rt: &tokio::runtime::Runtime) {
    println!("\n== placement percentiles, {NODES} nodes x 8 GPUs, names mode, library level ==");
    println!("{}", common::machine());
    println!("(filter+prioritize = decode + decide + serialize, both verbs, one pod)");
    // PLACEMENT_CASES=shared_gpu,gpu_cpuset_8 picks cases (by label; default all).
    let picked = |case: &Case| {
        std::env::var("PLACEMENT_CASES").map_or(true, |v| v.split(',').any(|c| c == case.label()))
    };
    for case in Case::ALL.into_iter().filter(picked) {
        let body = extender_body(case, NODES);
        let ans = answers(state, &body);
        let passing = ans.filter.node_names.as_ref().map_or(0, Vec::len);
        // Interleave the three so drifts in machine load hit all alike. Warm: the pod shape
        // repeats, so the verdict memo remembers the last request's answers; cold: the memo
        // caches are emptied (untimed) before each request, which then decides every distinct
        // node state.
        let mut warm = Vec::new();
        let mut cold = Vec::new();
        let mut base = Vec::new();
        for _ in 0..10 {
            warm.extend(sample(40, || {
                black_box(filter(state, &body));
                black_box(prioritize(state, &body));
            }));
            for _ in 0..40 {
                state.memos.clear();
                let t = Instant::now();
                black_box(filter(state, &body));
                black_box(prioritize(state, &body));
                cold.push(t.elapsed());
            }
            base.extend(sample(40, || {
                black_box(baseline_filter(&ans, &body));
                black_box(baseline_prioritize(&ans, &body));
            }));
        }
        let b = summarize(&mut base);
        println!(
            "{:<11} body={:>7} B passing={:>5}\n  baseline  {b}",
            case.label(),
            body.len(),
            passing,
        );
        for (label, samples) in [("warm memo", &mut warm), ("cold memo", &mut cold)] {
            let w = summarize(samples);
            println!(
                "  {label} {w}\n  ratio     mean {:.2}x  p50 {:.2}x  p99 {:.2}x",
                w.mean.as_secs_f64() / b.mean.as_secs_f64(),
                w.p50.as_secs_f64() / b.p50.as_secs_f64(),
                w.p99.as_secs_f64() / b.p99.as_secs_f64(),
            );
        }
    }
    println!("\n== bind without API round trips (in-memory PodApi) ==");
    for case in [Case::SharedGpu, Case::TwoGpus, Case::PartitionedGpus] {
        let uid = PodUid::new(format!("uid-bind-{}", case.label()));
        let req = device_request(case);
        let mut ar = Vec::new();
        let mut full = Vec::new();
        let args = bind_args(case);
        for _ in 0..2_000 {
            let t = Instant::now();
            let at = allocate_record(state, &req, &uid);
            ar.push(t.elapsed());
            undo(state, &uid, at);
            let t = Instant::now();
            rt.block_on(state.binder.bind(&args)).expect("binds");
            full.push(t.elapsed());
            undo_bind(state, &uid);
        }
        println!(
            "{:<11}\n  allocate+record {}\n  whole bind      {}",
            case.label(),
            summarize(&mut ar),
            summarize(&mut full)
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo test --benches` runs bench binaries with --test: only check they start.
    let quick = args.iter().any(|a| a == "--test" || a == "--list");
    let mut c = Criterion::default().configure_from_args();
    numa_benches(&mut c);
    pod_decode_benches(&mut c);
    // PLACEMENT_NUMA_ONLY=1 stops after the pure NUMA group (no 5,000-node cluster to build).
    if std::env::var("PLACEMENT_NUMA_ONLY").is_ok_and(|v| v == "1") {
        c.final_summary();
        return;
    }
    // PLACEMENT_SCALING=1: the verbs alone at 1,000 / 5,000 / 20,000 candidates, then stop.
    if std::env::var("PLACEMENT_SCALING").is_ok_and(|v| v == "1") {
        let state = std::thread::spawn(|| state(SCALING_NODES))
            .join()
            .expect("build the cluster");
        verb_scaling(&state);
        return;
    }
    let started = Instant::now();
    // Build the caches on another thread, as the service's sync tasks do: glibc gives each
    // thread its own malloc arena, and measuring on the arena fragmented by building 150,000
    // pod records made every allocation (baseline included) several times slower than in the
    // service, where requests mostly run on other arenas (see BENCHMARKS.md).
    let state = std::thread::spawn(|| state(NODES))
        .join()
        .expect("build the cluster");
    eprintln!("cluster of {NODES} nodes built in {:?}", started.elapsed());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    if std::env::var("PLACEMENT_LOOP").is_ok() {
        profile_loop(&state);
        return;
    }
    if std::env::var("PLACEMENT_PREEMPT").is_ok_and(|v| v == "1") {
        preempt_costs(&state);
        return;
    }
    benches(&mut c, &state, &rt);
    c.final_summary();
    // PLACEMENT_PERCENTILES=0 skips the percentile pass (e.g. when filtering criterion benches).
    let percentiles_on = std::env::var("PLACEMENT_PERCENTILES").map_or(true, |v| v != "0");
    if !quick && percentiles_on {
        percentiles(&state, &rt);
    }
}

// ---- the verbs alone: scaling and a loop to profile -----------------------------------------

/// The cluster of the scaling section, and its candidate counts.
const SCALING_NODES: usize = 20_000;
const SCALING_SIZES: [usize; 3] = [1_000, 5_000, SCALING_NODES];

/// The cases `PLACEMENT_CASES` picks (comma-separated labels), `default` without it.
fn picked_cases(default: &[Case]) -> Vec<Case> {
    match std::env::var("PLACEMENT_CASES") {
        Ok(v) => Case::ALL
            .into_iter()
            .filter(|c| v.split(',').any(|l| l == c.label()))
            .collect(),
        Err(_) => default.to_vec(),
    }
}

/// The time of filter (`filter`) or prioritize alone on `body` (decode before, drop after:
/// untimed), after emptying that verb's memo when `cold`.
fn time_verb(state: &Scheduler, body: &[u8], filter: bool, cold: bool) -> Duration {
    let args: ExtenderArgsRef = decode(body).expect("valid body");
    match (cold, filter) {
        (true, true) => state.memos.filter.clear(),
        (true, false) => state.memos.prioritize.clear(),
        (false, _) => {}
    }
    if filter {
        timed(|| verbs::filter(state, args))
    } else {
        timed(|| verbs::prioritize(state, args))
    }
}

/// How long `f` takes; its answer is dropped after the clock stops.
fn timed<T>(f: impl FnOnce() -> T) -> Duration {
    let t = Instant::now();
    let answer = black_box(f());
    let took = t.elapsed();
    drop(answer);
    took
}

/// The verbs alone (no decode, no encode, no HTTP) at 1,000, 5,000 and 20,000 candidates of
/// a 20,000-node cluster, warm and cold memo: the per-node cost ((case − pass-through) / n,
/// p50), the cost added per node between sizes, and the fixed part per request. Over HTTP
/// the same split is noisier (`http_load`'s scaling phase); here it says what the decisions
/// themselves cost. Cases interleave request by request, so drifts hit all alike.
fn verb_scaling(state: &Scheduler) {
    println!("\n== the verbs alone, {SCALING_NODES}-node cluster, names mode, p50 ==");
    println!("{}", common::machine());
    let cases = picked_cases(&[Case::NoDevices, Case::SharedGpu, Case::GpuCpuset]);
    let rounds = 200;
    for filter in [true, false] {
        let verb = if filter { "filter" } else { "prioritize" };
        for cold in [false, true] {
            // p50 per case and size.
            let mut p50 = vec![[Duration::ZERO; SCALING_SIZES.len()]; cases.len()];
            for (s, &n) in SCALING_SIZES.iter().enumerate() {
                let bodies: Vec<Vec<u8>> = cases.iter().map(|c| extender_body(*c, n)).collect();
                let mut samples = vec![Vec::with_capacity(rounds); cases.len()];
                for round in 0..rounds + rounds / 10 {
                    for (c, body) in bodies.iter().enumerate() {
                        let took = time_verb(state, body, filter, cold);
                        if round >= rounds / 10 {
                            samples[c].push(took);
                        }
                    }
                }
                for (c, samples) in samples.iter_mut().enumerate() {
                    p50[c][s] = summarize(samples).p50;
                }
            }
            let memo = if cold { "cold" } else { "warm" };
            println!("{verb}, {memo} memo (p50 at {SCALING_SIZES:?} candidates)");
            let base = cases.iter().position(|c| *c == Case::NoDevices);
            for (c, case) in cases.iter().enumerate() {
                let us = |d: Duration| d.as_secs_f64() * 1e6;
                let times = slashed(p50[c].iter().map(|d| format!("{:.1}", us(*d))));
                let mut line = format!("  {:<13} {times} us", case.label());
                if let (Some(b), false) = (base, *case == Case::NoDevices) {
                    let excess_ns: Vec<f64> = (0..SCALING_SIZES.len())
                        .map(|s| (us(p50[c][s]) - us(p50[b][s])) * 1e3)
                        .collect();
                    let split = PerNodeSplit::new(&SCALING_SIZES, &excess_ns);
                    let ns = |v: &[f64]| slashed(v.iter().map(|p| format!("{p:.1}")));
                    line += &format!(
                        "  per node {} ns (±{:.0} %)  added per node {} ns  fixed ~{:.1} us",
                        ns(&split.per_node),
                        split.spread * 100.0,
                        ns(&split.added),
                        split.fixed_us,
                    );
                }
                println!("{line}");
            }
        }
    }
}

/// `PLACEMENT_PREEMPT=1`: what issue 38's additions cost on the 5,000-node cluster: one pass
/// of the GPU share totals' check over every node (`share_totals::plan`, the work the writer
/// repeats after each change), and `preempt` on a full node (eight 1-GPU holders) where
/// kube-scheduler's one victim does not make room, so the extender searches others: a 2-GPU
/// pod (found at the ninth decision) and a 9-GPU pod (no set works: every set of up to four
/// holders is decided, 162 decisions). p50 and p99 of the verb alone.
fn preempt_costs(state: &Scheduler) {
    use device_numa_extender::model::wire::ExtenderPreemptionArgs;
    use device_numa_extender::scheduler::share_totals;
    println!("\n== issue 38: share totals pass and preempt's victim search, {NODES} nodes ==");
    println!("{}", common::machine());
    let mut passes: Vec<Duration> = (0..20)
        .map(|_| timed(|| share_totals::plan(&state.cluster, &Default::default())))
        .collect();
    let p = summarize(&mut passes);
    println!(
        "  share totals pass over {NODES} nodes: p50 {}  p99 {}",
        common::ms(p.p50),
        common::ms(p.p99)
    );
    let full = common::node_name(9);
    let victim = {
        let entry = state.cluster.node(&full).expect("node 9");
        let guard = entry.read();
        guard
            .pods
            .keys()
            .next()
            .expect("node 9 holds pods")
            .as_str()
            .to_string()
    };
    for gpus in [2, 9] {
        let pod = serde_json::json!({"metadata": {"name": "hi", "namespace": "ml", "uid": "uid-hi"},
            "spec": {"priority": 1000, "containers": [{"name": "c", "resources": {"requests": {
                "cpu": "1", "nvidia.com/gpu": gpus.to_string()}}}]}});
        let body = serde_json::json!({"Pod": pod, "NodeNameToMetaVictims": {
            full.clone(): {"Pods": [{"UID": victim.clone()}], "NumPDBViolations": 0}}});
        let mut samples: Vec<Duration> = (0..200)
            .map(|_| {
                let args: ExtenderPreemptionArgs =
                    serde_json::from_value(body.clone()).expect("preempt args");
                timed(|| verbs::preempt(state, args))
            })
            .collect();
        let p = summarize(&mut samples);
        println!(
            "  preempt, {gpus}-GPU pod, kube-scheduler's one victim too few: p50 {}  p99 {}",
            common::ms(p.p50),
            common::ms(p.p99)
        );
    }
    victim_search_worst_case();
}

/// The victim search's worst case (issue 38's note): on each candidate node sixteen half-card
/// holders of lower priority and no set of up to four that makes room, so every node spends
/// the whole search budget (`SEARCH_BUDGET` decisions); kube-scheduler may send up to 100
/// candidates in one `preempt`. Each holder is covered by a PodDisruptionBudget too.
fn victim_search_worst_case() {
    use device_numa_extender::model::wire::ExtenderPreemptionArgs;
    use device_numa_extender::ops::inspect::load_cluster_file;
    use device_numa_extender::scheduler::bind::OfflinePodApi;
    const WORST_NODES: usize = 100;
    let mut items = Vec::new();
    let mut meta = serde_json::Map::new();
    for n in 0..WORST_NODES {
        let node = format!("w{n}");
        items.push(
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}),
        );
        let devices: Vec<serde_json::Value> = (0..8)
            .map(|m| serde_json::json!({"type": "gpu", "id": format!("GPU-{node}-{m}"), "minor": m, "health": true,
                "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
                    "koordinator.sh/gpu-memory-ratio": "100"}}))
            .collect();
        items.push(
            serde_json::json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
            "metadata": {"name": node}, "spec": {"devices": devices}}),
        );
        for h in 0..16 {
            let allocated = serde_json::json!({"gpu": [{"minor": h / 2, "resources": {
                "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}}]});
            items.push(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{node}-h{h}"), "namespace": "ml", "uid": format!("uid-{node}-{h}"),
                    "labels": {"app": format!("a{}", h % 4)},
                    "annotations": {DEVICE_ALLOCATED: allocated.to_string()}},
                "spec": {"nodeName": node, "priority": h % 3, "containers": [{"name": "c", "resources": {"requests": {
                    "cpu": "1", "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}}}]},
                "status": {"phase": "Running"}}));
        }
        meta.insert(
            node.clone(),
            serde_json::json!({"Pods": [{"UID": format!("uid-{node}-0")}], "NumPDBViolations": 0}),
        );
    }
    for a in 0..4 {
        items.push(serde_json::json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": format!("a{a}"), "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": format!("a{a}")}}},
            "status": {"disruptionsAllowed": 1, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}}));
    }
    let text = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    let file = ClusterFile::parse(&text, "worst").expect("cluster");
    let api = Arc::new(OfflinePodApi::new(file.pods.clone()));
    let state = load_cluster_file(file).into_scheduler(api, ScoringConfig::default());
    // Four whole cards: four victims free at most two (every card holds two halves), so no set
    // makes room, and every decision runs the allocator over the node's cards.
    let pod = serde_json::json!({"metadata": {"name": "hi", "namespace": "ml", "uid": "uid-hi"},
        "spec": {"priority": 1000, "containers": [{"name": "c", "resources": {"requests": {
            "cpu": "1", "koordinator.sh/gpu-memory-ratio": "400"}}}]}});
    for nodes in [1, WORST_NODES] {
        let picked: serde_json::Map<String, serde_json::Value> = meta
            .iter()
            .take(nodes)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let body = serde_json::json!({"Pod": pod, "NodeNameToMetaVictims": picked});
        let mut samples: Vec<Duration> = (0..20)
            .map(|_| {
                let args: ExtenderPreemptionArgs =
                    serde_json::from_value(body.clone()).expect("preempt args");
                timed(|| {
                    let out = verbs::preempt(&state, args);
                    assert!(
                        out.node_name_to_meta_victims
                            .as_ref()
                            .is_some_and(|m| m.is_empty()),
                        "no node can make room"
                    );
                    out
                })
            })
            .collect();
        let p = summarize(&mut samples);
        println!(
            "  preempt, worst case (16 holders, no set of 4 works, search budget spent), {nodes} node(s): p50 {}  p99 {}",
            common::ms(p.p50),
            common::ms(p.p99)
        );
    }
}

/// `PLACEMENT_LOOP=warm|cold`: filter alone (decode untimed but run), for the picked cases
/// (default GPU + CPUs) at 1,000 candidates, `PLACEMENT_LOOP_ITERS` times (default 40,000):
/// a steady loop to record with `perf record` and compare warm against cold.
fn profile_loop(state: &Scheduler) {
    let cold = std::env::var("PLACEMENT_LOOP").is_ok_and(|v| v == "cold");
    let iters: u32 = std::env::var("PLACEMENT_LOOP_ITERS").map_or(40_000, |v| {
        v.parse().expect("PLACEMENT_LOOP_ITERS is a count")
    });
    let filter = std::env::var("PLACEMENT_LOOP_VERB").map_or(true, |v| v != "prioritize");
    let candidates: usize = std::env::var("PLACEMENT_LOOP_NODES").map_or(1_000, |v| {
        v.parse().expect("PLACEMENT_LOOP_NODES is a count")
    });
    for case in picked_cases(&[Case::GpuCpuset]) {
        let body = extender_body(case, candidates);
        let t = Instant::now();
        for _ in 0..iters {
            black_box(time_verb(state, &body, filter, cold));
        }
        println!(
            "{} {}: {:?} per request (decode included)",
            case.label(),
            if cold { "cold" } else { "warm" },
            t.elapsed() / iters
        );
    }
}
