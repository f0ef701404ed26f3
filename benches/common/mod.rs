//! Shared by the benches: one deterministic synthetic cluster (nodes × 8 GPUs with realistic
//! partial occupancy, ~30 pods per node), the extender request bodies, and small statistics
//! helpers. Included with `mod common;` next to `#[path = "../tests/support/mod.rs"] mod support;`.
#![allow(dead_code)]

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::service;

pub const GPUS_PER_NODE: i32 = 8;
pub const PODS_PER_NODE: usize = 30;

pub fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

/// What the pods of node `i` hold, in minors: `whole` GPUs 0..whole held by one pod each, and
/// optionally half of GPU `whole` held by a shared pod. Every tenth node is full.
///
/// Over the cluster: ~42% of GPUs held, ~1/3 of nodes with a half-used GPU, 10% of nodes full;
/// a 2-GPU request fails on ~1/4 of the nodes, a shared one on ~1/10.
pub fn occupancy(i: usize) -> (i32, bool) {
    if i % 10 == 9 {
        return (GPUS_PER_NODE, false);
    }
    let whole = (i % 7) as i32;
    (whole, i.is_multiple_of(3) && whole < GPUS_PER_NODE)
}

fn whole_annotation(minor: i32) -> String {
    json!({"gpu": [{"minor": minor, "resources": {
        "koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
        "koordinator.sh/gpu-memory-ratio": "100"}}]})
    .to_string()
}

fn shared_annotation(minor: i32) -> String {
    json!({"gpu": [{"minor": minor, "resources": {
        "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory": "40Gi",
        "koordinator.sh/gpu-memory-ratio": "50"}}]})
    .to_string()
}

/// Each node's CPUs: 2 NUMA nodes (one socket each) × 16 cores × 2 threads = 64 CPUs, a core's
/// threads adjacent (NUMA `n` holds CPUs `32n .. 32n+31`), as koordlet reports them in
/// `node.koordinator.sh/cpu-topology`; no NUMA policy (pods may ask for one themselves).
pub fn nrt(name: &str) -> Value {
    let mut detail = Vec::new();
    for core in 0..32u32 {
        for t in 0..2 {
            detail.push(
                json!({"id": core * 2 + t, "core": core, "socket": core / 16, "node": core / 16}),
            );
        }
    }
    let zones: Vec<Value> = (0..2)
        .map(|n| {
            json!({"name": format!("node-{n}"), "type": "Node", "resources": [
                {"name": "cpu", "capacity": "32", "allocatable": "32", "available": "32"},
                {"name": "memory", "capacity": "256Gi", "allocatable": "256Gi", "available": "256Gi"}]})
        })
        .collect();
    json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": name, "annotations": {
            "node.koordinator.sh/cpu-topology": json!({"detail": detail}).to_string(),
            "kubelet.koordinator.sh/cpu-manager-policy": r#"{"policy":"none"}"#
        }},
        "topologyPolicies": ["None"],
        "zones": zones,
    })
}

/// How many 4-CPU LSR pods (2 whole cores each) node `i` runs, on NUMA node `i % 2` from its
/// first core up: 0 to 4 (up to half of that NUMA node).
pub fn lsr_pods(i: usize) -> usize {
    i % 5
}

/// The `PODS_PER_NODE` assigned, running pods of node `i`: the device holders of
/// [`occupancy`] first, then the LSR cpuset holders of [`lsr_pods`], then CPU-only pods.
pub fn node_pods(i: usize) -> Vec<Value> {
    let node = node_name(i);
    let (whole, shared) = occupancy(i);
    let mut pods = Vec::with_capacity(PODS_PER_NODE);
    let ns = format!("team-{}", i % 50);
    // `cpuset`: an LSR pod holding that cpuset (`resource-status`).
    let mut push =
        |j: usize, requests: Value, allocated: Option<String>, cpuset: Option<String>| {
            let name = format!("{node}-p{j:02}");
            let uid = format!("uid-{i:05}-{j:02}");
            let mut pod = service::pod(
                &ns,
                &name,
                &uid,
                requests,
                Some(&node),
                allocated.as_deref(),
            );
            if let Some(cpuset) = cpuset {
                pod["metadata"]["labels"] = json!({"koordinator.sh/qosClass": "LSR"});
                pod["metadata"]["annotations"]["scheduling.koordinator.sh/resource-status"] =
                    json!(json!({"cpuset": cpuset}).to_string());
            }
            pods.push(pod);
        };
    let mut j = 0;
    for minor in 0..whole {
        push(
            j,
            json!({"nvidia.com/gpu": "1", "cpu": "8", "memory": "32Gi"}),
            Some(whole_annotation(minor)),
            None,
        );
        j += 1;
    }
    if shared {
        push(
            j,
            json!({"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50", "cpu": "4"}),
            Some(shared_annotation(whole)),
            None,
        );
        j += 1;
    }
    let first_core = (i % 2) * 16;
    for k in 0..lsr_pods(i) {
        let core = first_core + 2 * k;
        let cpuset = format!("{}-{}", core * 2, core * 2 + 3);
        push(j, json!({"cpu": "4", "memory": "8Gi"}), None, Some(cpuset));
        j += 1;
    }
    while j < PODS_PER_NODE {
        push(j, json!({"cpu": "500m", "memory": "1Gi"}), None, None);
        j += 1;
    }
    pods
}

/// Every object of a cluster of `nodes` nodes, by kind.
pub struct Cluster {
    pub nodes: Vec<Value>,
    pub devices: Vec<Value>,
    pub topologies: Vec<Value>,
    pub pods: Vec<Value>,
}

pub fn cluster(nodes: usize, with_pods: bool) -> Cluster {
    let mut c = Cluster {
        nodes: Vec::with_capacity(nodes),
        devices: Vec::with_capacity(nodes),
        topologies: Vec::with_capacity(nodes),
        pods: Vec::with_capacity(if with_pods { nodes * PODS_PER_NODE } else { 0 }),
    };
    for i in 0..nodes {
        let name = node_name(i);
        // H100s: whole-GPU pods consult koordinator's built-in partition table (preferred,
        // not honoured, unless the pod asks: `Case::PartitionedGpus`).
        let mut node = service::node(&name);
        node["metadata"]["labels"]["node.koordinator.sh/gpu-model"] = json!("H100");
        c.nodes.push(node);
        c.devices
            .push(service::gpu_device(&name, GPUS_PER_NODE, 4, &[]));
        c.topologies.push(nrt(&name));
        if with_pods {
            c.pods.extend(node_pods(i));
        }
    }
    c
}

/// [`cluster`] with only the pods that hold something (GPUs or a cpuset): the same node
/// summaries (what filter and prioritize read), without the CPU-only filler pods, so a
/// 20,000-node cluster loads in seconds (the scaling row).
pub fn cluster_of_holders(nodes: usize) -> Cluster {
    let mut c = cluster(nodes, false);
    for i in 0..nodes {
        c.pods.extend(node_pods(i).into_iter().filter(|p| {
            p["metadata"]["annotations"]
                .as_object()
                .is_some_and(|a| !a.is_empty())
        }));
    }
    c
}

/// [`cluster_of_holders`] with every node's state its own: node `i`'s GPUs have `i` MiB more
/// memory than 80 GiB and its NUMA nodes `i` MiB more memory than 256 GiB, so no two nodes
/// share device or CPU facts. The worst case for the verbs' per-request memo, which decides
/// once per distinct node state.
pub fn cluster_of_distinct_holders(nodes: usize) -> Cluster {
    let mut c = cluster_of_holders(nodes);
    for (i, device) in c.devices.iter_mut().enumerate() {
        for d in device["spec"]["devices"].as_array_mut().expect("devices") {
            d["resources"]["koordinator.sh/gpu-memory"] = json!(format!("{}Mi", 80 * 1024 + i));
        }
    }
    for (i, nrt) in c.topologies.iter_mut().enumerate() {
        for zone in nrt["zones"].as_array_mut().expect("zones") {
            for r in zone["resources"].as_array_mut().expect("resources") {
                if r["name"] == "memory" {
                    let q = json!(format!("{}Mi", 256 * 1024 + i));
                    for field in ["capacity", "allocatable", "available"] {
                        r[field] = q.clone();
                    }
                }
            }
        }
    }
    c
}

impl Cluster {
    /// One `kind: List` with every object, for `--cluster-file`.
    pub fn to_list_json(&self) -> Vec<u8> {
        let items: Vec<&Value> = self
            .nodes
            .iter()
            .chain(&self.devices)
            .chain(&self.topologies)
            .chain(&self.pods)
            .collect();
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": items}))
            .expect("serialize cluster")
    }
}

/// The pods the benches schedule: pending, unassigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// Half a GPU (gpu-core 50, gpu-memory-ratio 50).
    SharedGpu,
    /// Two whole GPUs (`nvidia.com/gpu: 2`).
    TwoGpus,
    /// CPU and memory only: no placement needs (the pass-through request).
    NoDevices,
    /// An LSR pod with 8 CPUs: an exclusive whole-core cpuset.
    Cpuset,
    /// An LSR pod with 1 GPU and 8 CPUs asking for SingleNUMANode (`numa-topology-spec`): the
    /// GPU and the cpuset on one NUMA node.
    GpuCpuset,
    /// Two whole GPUs that must be an NVLink partition (`gpu-partition-spec`, BestEffort).
    PartitionedGpus,
    /// 100Gi of GPU memory on one card, more than any card has: refused everywhere, so every
    /// node's reason is explained (`scheduler::explain`). Not in [`Case::ALL`].
    FitsNowhere,
}

impl Case {
    pub const ALL: [Case; 6] = [
        Case::SharedGpu,
        Case::TwoGpus,
        Case::NoDevices,
        Case::Cpuset,
        Case::GpuCpuset,
        Case::PartitionedGpus,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Case::SharedGpu => "shared_gpu",
            Case::TwoGpus => "two_gpus",
            Case::NoDevices => "no_devices",
            Case::Cpuset => "lsr_cpuset_8",
            Case::GpuCpuset => "gpu_cpuset_8",
            Case::PartitionedGpus => "two_gpus_partitioned",
            Case::FitsNowhere => "fits_nowhere",
        }
    }

    pub fn pending_pod(self, name: &str, uid: &str) -> Value {
        let requests = match self {
            Case::SharedGpu => json!({"koordinator.sh/gpu-core": "50",
                "koordinator.sh/gpu-memory-ratio": "50", "cpu": "4", "memory": "16Gi"}),
            Case::TwoGpus | Case::PartitionedGpus => {
                json!({"nvidia.com/gpu": "2", "cpu": "16", "memory": "64Gi"})
            }
            Case::NoDevices => json!({"cpu": "2", "memory": "4Gi"}),
            Case::Cpuset => json!({"cpu": "8", "memory": "16Gi"}),
            Case::GpuCpuset => json!({"nvidia.com/gpu": "1", "cpu": "8", "memory": "16Gi"}),
            Case::FitsNowhere => {
                json!({"koordinator.sh/gpu-memory": "100Gi", "cpu": "4", "memory": "16Gi"})
            }
        };
        let mut pod = service::pod("bench", name, uid, requests, None, None);
        if matches!(self, Case::Cpuset | Case::GpuCpuset) {
            pod["metadata"]["labels"] = json!({"koordinator.sh/qosClass": "LSR"});
        }
        if matches!(self, Case::GpuCpuset) {
            pod["metadata"]["annotations"] = json!({
                "scheduling.koordinator.sh/numa-topology-spec":
                    r#"{"numaTopologyPolicy":"SingleNUMANode"}"#
            });
        }
        if matches!(self, Case::PartitionedGpus) {
            pod["metadata"]["annotations"] = json!({
                "scheduling.koordinator.sh/gpu-partition-spec": r#"{"allocatePolicy":"BestEffort"}"#
            });
        }
        pod
    }
}

/// The names-mode filter/prioritize body for `case` over the first `nodes` nodes.
///
/// Candidates come in the cluster's listing order, as a single-zone kube-scheduler hands them
/// over. `BENCH_CANDIDATE_ORDER=strided` sends them in a stride permutation instead (node
/// `i * 7919 mod n`): no candidate follows its predecessor in the listing, the worst case for
/// the service's in-order name resolution (`cluster::snapshot::Finder`).
pub fn extender_body(case: Case, nodes: usize) -> Vec<u8> {
    let strided = std::env::var("BENCH_CANDIDATE_ORDER").is_ok_and(|v| v == "strided");
    // 7919 is prime and larger than 1, so for any `nodes` it does not divide, `i * 7919 mod
    // nodes` visits every index once.
    assert!(
        !strided || !nodes.is_multiple_of(7919),
        "stride must be coprime with {nodes}"
    );
    let names: Vec<String> = (0..nodes)
        .map(|i| node_name(if strided { i * 7919 % nodes } else { i }))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let body = |case: Case, pad: usize| {
        let mut pod = case.pending_pod("pending", "uid-pending");
        pod["metadata"]["annotations"][PAD_ANNOTATION] = json!("x".repeat(pad));
        serde_json::to_vec(&service::extender_args(&pod, &names)).expect("serialize body")
    };
    // Every case's body as long as the longest, so the ratios compare requests of the same
    // size. At 5,000 nodes the bodies are near 64 KiB over loopback, where it matters: with
    // bodies 200 bytes apart, the one case over 64 KiB (GPU + CPUs) took ~0.05 ms longer
    // client-side while the service spent the same time on it as on the shared-GPU pod.
    let longest = Case::ALL
        .iter()
        .map(|c| body(*c, 0).len())
        .max()
        .expect("cases");
    body(case, longest - body(case, 0).len())
}

/// An annotation no decision reads, padding every case's body to the same length.
pub const PAD_ANNOTATION: &str = "bench.example.com/pad";

/// A placement case's excess over the pass-through request at several candidate counts,
/// split the way the scaling rows of `http_load` and `placement` report it.
pub struct PerNodeSplit {
    /// The issue's per-node cost at each size: excess / candidates, in ns.
    pub per_node: Vec<f64>,
    /// The largest deviation of `per_node` from its mean, as a fraction of the mean.
    pub spread: f64,
    /// The cost per node added between two consecutive sizes, in ns: flat when there is no
    /// superlinear term.
    pub added: Vec<f64>,
    /// What the first slope leaves at the smallest size: the fixed part per request, in µs.
    pub fixed_us: f64,
}

impl PerNodeSplit {
    /// `excess_ns[i]`: case p50 − pass-through p50 at `sizes[i]` candidates, in ns (at least
    /// two sizes, ascending).
    pub fn new(sizes: &[usize], excess_ns: &[f64]) -> Self {
        let per_node: Vec<f64> = excess_ns
            .iter()
            .zip(sizes)
            .map(|(e, n)| e / *n as f64)
            .collect();
        let mean = per_node.iter().sum::<f64>() / per_node.len() as f64;
        let spread = per_node
            .iter()
            .map(|c| (c - mean).abs() / mean.abs().max(f64::EPSILON))
            .fold(0.0, f64::max);
        let added: Vec<f64> = (1..sizes.len())
            .map(|i| (excess_ns[i] - excess_ns[i - 1]) / (sizes[i] - sizes[i - 1]) as f64)
            .collect();
        let fixed_us = (excess_ns[0] - added[0] * sizes[0] as f64) / 1e3;
        PerNodeSplit {
            per_node,
            spread,
            added,
            fixed_us,
        }
    }
}

/// `a / b / c`.
pub fn slashed(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(" / ")
}

/// Percentiles of a sample, nearest-rank.
pub struct Summary {
    pub n: usize,
    pub mean: Duration,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
}

pub fn summarize(samples: &mut [Duration]) -> Summary {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_unstable();
    let n = samples.len();
    let at = |q: f64| samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    let total: Duration = samples.iter().sum();
    Summary {
        n,
        mean: total / n as u32,
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        max: samples[n - 1],
    }
}

pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={:<6} mean={:>10} p50={:>10} p90={:>10} p99={:>10} max={:>10}",
            self.n,
            ms(self.mean),
            ms(self.p50),
            ms(self.p90),
            ms(self.p99),
            ms(self.max)
        )
    }
}

/// The machine, for the report.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} CPUs available, {model}")
}

/// DRA beside the synthetic cluster (`PLACEMENT_DRA=1`, `BOOTSTRAP_DRA=1`): one ResourceSlice per
/// node publishing its 8 GPUs by the UUIDs its Device gives them (so every GPU joins), and
/// `claims_per_node` claims per node: on a node that is not full the first holds GPU 7 (free in
/// `occupancy`), the rest are pending (no allocation).
pub fn dra_objects(nodes: usize, claims_per_node: usize) -> (Vec<Value>, Vec<Value>) {
    let mut slices = Vec::with_capacity(nodes);
    let mut claims = Vec::with_capacity(nodes * claims_per_node);
    for i in 0..nodes {
        let node = node_name(i);
        let devices: Vec<Value> = (0..GPUS_PER_NODE)
            .map(|m| {
                json!({"name": format!("gpu-{m}"), "attributes": {
                    "uuid": {"string": format!("GPU-{node}-{m}")},
                    "resource.kubernetes.io/pciBusID": {"string": format!("0000:{:02x}:00.0", m)},
                    "index": {"int": m}}})
            })
            .collect();
        slices.push(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-gpu.nvidia.com"), "uid": format!("slice-{i:05}")},
            "spec": {"driver": "gpu.nvidia.com", "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "nodeName": node, "devices": devices}
        }));
        for c in 0..claims_per_node {
            let mut claim = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": format!("claim-{i:05}-{c:02}"), "namespace": "dra",
                             "uid": format!("claim-{i:05}-{c:02}")},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
            });
            if c == 0 && i % 10 != 9 {
                claim["status"] = json!({"allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": "gpu-7"}
                ]}}});
            }
            claims.push(claim);
        }
    }
    (slices, claims)
}
