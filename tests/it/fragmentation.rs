//! The fragmentation strategy through `simulate` (the service's filter, prioritize and bind,
//! offline): the decisions it changes, worked out by hand from the cluster below.
//!
//! Two GPU nodes (2 cards, 32 CPUs each) and a CPU-only node; pods placed in order. What the
//! workload mix holds is what filter has seen so far (learned online).

use device_numa_extender::ops::simulate::{Simulation, simulate};
use device_numa_extender::scheduler::{ScoringConfig, ScoringFlags};
use serde_json::{Value, json};

fn cluster() -> String {
    let gpu_node = |name: &str| {
        let devices: Vec<Value> = (0..2)
            .map(|m| {
                json!({"type": "gpu", "id": format!("GPU-{name}-{m}"), "minor": m, "health": true,
                    "resources": {"koordinator.sh/gpu-core": "100",
                        "koordinator.sh/gpu-memory": "16Gi",
                        "koordinator.sh/gpu-memory-ratio": "100"}})
            })
            .collect();
        [
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110",
                    "nvidia.com/gpu": "2"}}}),
            json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
                "metadata": {"name": name}, "spec": {"devices": devices}}),
        ]
    };
    let mut items: Vec<Value> = Vec::new();
    items.extend(gpu_node("gpu-a"));
    items.extend(gpu_node("gpu-b"));
    items.push(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "z-cpu"},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}}),
    );
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

fn pod(name: &str, requests: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}})
}

fn half(name: &str) -> Value {
    pod(
        name,
        json!({"cpu": "2", "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}),
    )
}

async fn run(strategy: &str, pods: &[Value]) -> Simulation {
    let scoring = ScoringConfig::from_flags(&ScoringFlags {
        device_strategy: strategy,
        ..ScoringFlags::DEFAULT
    })
    .expect("scoring");
    let pods = json!({"apiVersion": "v1", "kind": "List", "items": pods}).to_string();
    simulate(&cluster(), "cluster.json", &pods, "pods.json", scoring)
        .await
        .expect("simulate runs")
}

/// (node, first minor) of each pod's placement.
fn placed(s: &Simulation) -> Vec<(Option<String>, Option<i32>)> {
    s.report
        .placements
        .iter()
        .map(|p| {
            (
                p.node.clone(),
                p.devices
                    .get("gpu")
                    .and_then(|d| d.first())
                    .map(|d| d.minor),
            )
        })
        .collect()
}

/// A second half-GPU pod fills the card the first one broke: any other card it broke would be
/// left half free, a fragment for the whole-GPU pods the workload has shown. Least-allocated
/// spreads it onto an untouched node instead.
#[tokio::test]
async fn a_share_fills_the_broken_card_where_spreading_breaks_another() {
    let pods = [
        pod("whole-1", json!({"cpu": "2", "nvidia.com/gpu": "1"})),
        half("half-1"),
        half("half-2"),
    ];
    let fgd = placed(&run("fragmentation", &pods).await);
    // whole-1 and half-1: every node grows alike (ties go to the first name in simulate).
    let (half1, half2) = (&fgd[1], &fgd[2]);
    assert!(half1.0.is_some() && half1.1.is_some(), "{fgd:?}");
    assert_eq!(half2, half1, "half-2 shares half-1's card: {fgd:?}");
    let spread = placed(&run("least-allocated", &pods).await);
    assert_ne!(spread[2], spread[1], "least-allocated spreads: {spread:?}");
}

/// A CPU-only pod goes where it strands no GPU. It fits gpu-b (gpu-a has 28 CPUs left) and
/// z-cpu; on gpu-b it would leave 2 CPUs, too few for the whole-GPU pods the workload has
/// shown (4 each), stranding both cards. Without an opinion from the extender (least-allocated
/// has none for it) simulate takes the first name that fits: gpu-b.
#[tokio::test]
async fn a_cpu_only_pod_goes_where_it_strands_no_gpu() {
    let pods = [
        pod("whole-1", json!({"cpu": "4", "nvidia.com/gpu": "1"})),
        pod("cpu-1", json!({"cpu": "30"})),
    ];
    let fgd = placed(&run("fragmentation", &pods).await);
    assert_eq!(fgd[1].0.as_deref(), Some("z-cpu"), "{fgd:?}");
    let spread = placed(&run("least-allocated", &pods).await);
    assert_eq!(spread[1].0.as_deref(), Some("gpu-b"), "{spread:?}");
}
