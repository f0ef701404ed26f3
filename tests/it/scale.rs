//! Bootstrap at scale through the real kube watcher and the fake API server: 5,000 nodes,
//! 50,000 pods, 5,000 Devices and 5,000 NRTs. Prints the time to ready; the budget itself
//! (DESIGN.md §5) is measured by the benchmarks, never asserted here. About 11 s in a debug
//! build (5 s of it to ready); see the time with `cargo test --test it scale -- --nocapture`.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::service::{self, Http, cache_counts, whole_gpus};
use crate::support::{FakeApiServer, Kind};

const NODES: usize = 5_000;
const PODS: usize = 50_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_5000_nodes_50000_pods() {
    let fake = FakeApiServer::new();
    let name = |i: usize| format!("node-{i:05}");
    fake.create_many(Kind::Node, (0..NODES).map(|i| service::node(&name(i))))
        .unwrap();
    fake.create_many(
        Kind::Device,
        (0..NODES).map(|i| service::gpu_device(&name(i), 8, 4, &[])),
    )
    .unwrap();
    fake.create_many(
        Kind::NodeResourceTopology,
        (0..NODES).map(|i| service::nrt(&name(i))),
    )
    .unwrap();
    // Ten pods per node; the first of each holds one GPU.
    fake.create_many(
        Kind::Pod,
        (0..PODS).map(|i| {
            let node = name(i % NODES);
            let slot = i / NODES;
            let gpu = (slot == 0).then(|| whole_gpus(&[0]));
            service::pod(
                &format!("ns-{}", i % 50),
                &format!("pod-{i:06}"),
                &format!("uid-{i:06}"),
                json!({"cpu": "1", "nvidia.com/gpu": if gpu.is_some() { "1" } else { "0" }}),
                Some(&node),
                gpu.as_deref(),
            )
        }),
    )
    .unwrap();

    let started = Instant::now();
    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    let ready = http.wait_ready(Duration::from_secs(600)).await;
    let elapsed = started.elapsed();
    eprintln!(
        "bootstrap of {NODES} nodes, {PODS} pods, {NODES} Devices, {NODES} NRTs: ready in {elapsed:.2?} (debug build)"
    );
    let counts = cache_counts(&svc.state.scheduler.cluster);
    assert_eq!(
        counts,
        service::CacheCounts {
            nodes: NODES,
            pods: PODS,
            devices: NODES,
            topologies: NODES,
        }
    );
    assert_eq!(ready["kinds"]["pods"]["cached"], PODS);
    assert_eq!(ready["kinds"]["pods"]["replayed"], PODS);
    let snap = svc.state.scheduler.cluster.debug_dump();
    assert_eq!(
        snap[&name(7)]["devices"]["types"]["gpu"]["0"]["used"]["koordinator.sh/gpu-core"],
        "100"
    );
    svc.shutdown().await.unwrap();
}
