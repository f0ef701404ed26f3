//! Issue 23 §3: GPU partition tables end to end, the real service over HTTP against the fake
//! API server. Checks read the pods' `device-allocated` annotations from the API server and
//! parse them here; the expected partitions are koordinator's built-in Hopper table (pairs
//! 0-1 … 6-7, halves 0-3 and 4-7), written out in the test.

use serde_json::{Value, json};

use crate::gpu::{Env, annotation_of, gpu_shares, name};
use crate::support::service;
use crate::support::{FakeApiServer, Kind};

fn h100(fake: &FakeApiServer, node: &str, policy: Option<&str>) {
    let mut n = service::node(node);
    n["metadata"]["labels"]["node.koordinator.sh/gpu-model"] = json!("H100");
    if let Some(p) = policy {
        n["metadata"]["labels"]["node.koordinator.sh/gpu-partition-policy"] = json!(p);
    }
    fake.create(Kind::Node, n).unwrap();
    fake.create(Kind::Device, service::gpu_device(node, 8, 4, &[]))
        .unwrap();
}

/// A bound pod holding whole GPUs `minors` on `node`.
fn holding(pod: &str, node: &str, minors: &[i32]) -> Value {
    let gpus: Vec<Value> = minors
        .iter()
        .map(|m| {
            json!({"minor": m, "resources": {"koordinator.sh/gpu-core": "100",
            "koordinator.sh/gpu-memory-ratio": "100", "koordinator.sh/gpu-memory": "80Gi"}})
        })
        .collect();
    service::pod(
        "ml",
        pod,
        &format!("uid-{pod}"),
        json!({"nvidia.com/gpu": minors.len().to_string()}),
        Some(node),
        Some(&json!({ "gpu": gpus }).to_string()),
    )
}

fn minors_of(fake: &FakeApiServer, pod: &Value) -> Vec<i64> {
    let mut m: Vec<i64> = gpu_shares(&annotation_of(fake, pod).expect("device-allocated"))
        .into_iter()
        .map(|(minor, _)| minor)
        .collect();
    m.sort_unstable();
    m
}

/// GPUs 1 and 5 are held on both H100 nodes, so no half (0-3, 4-7) is free though six GPUs
/// are. A 4-GPU pod is refused where the Node honours partitions and placed by the topology
/// rules where it only prefers them; a 2-GPU pod takes the pair 2-3 (of the free pairs 2-3 and
/// 6-7, the first that breaks no more partitions). A pod with a `gpu-partition-spec` is
/// refused, unresolvably, on a node without a table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_gpu_pods_follow_the_hopper_partitions() {
    let fake = FakeApiServer::new();
    h100(&fake, "honor", Some("Honor"));
    h100(&fake, "prefer", None);
    fake.create(Kind::Node, service::node("plain")).unwrap();
    fake.create(Kind::Device, service::gpu_device("plain", 8, 4, &[]))
        .unwrap();
    for node in ["honor", "prefer"] {
        fake.create(Kind::Pod, holding(&format!("held-{node}"), node, &[1, 5]))
            .unwrap();
    }
    let env = Env::start(&fake, &[]).await;

    let four = service::pending("four", json!({"nvidia.com/gpu": "4"}));
    fake.create(Kind::Pod, four.clone()).unwrap();
    let f = env.filter(&four, &["honor", "prefer"]).await;
    assert_eq!(f["NodeNames"], json!(["prefer"]), "{f}");
    assert_eq!(
        f["FailedNodes"]["honor"], "Insufficient Partitioned GPU Devices",
        "{f}"
    );
    env.bind(&four, "prefer")
        .await
        .expect("placed by the topology rules");
    assert_eq!(minors_of(&fake, &four).len(), 4);

    let two = service::pending("two", json!({"nvidia.com/gpu": "2"}));
    fake.create(Kind::Pod, two.clone()).unwrap();
    env.bind(&two, "honor").await.expect("a free pair");
    assert_eq!(minors_of(&fake, &two), vec![2, 3], "{}", name(&two));

    let mut spec = service::pending("spec", json!({"nvidia.com/gpu": "2"}));
    spec["metadata"]["annotations"] = json!({"scheduling.koordinator.sh/gpu-partition-spec": r#"{"allocatePolicy":"Restricted"}"#});
    fake.create(Kind::Pod, spec.clone()).unwrap();
    let f = env.filter(&spec, &["honor", "plain"]).await;
    assert_eq!(f["NodeNames"], json!(["honor"]), "{f}");
    assert_eq!(
        f["FailedAndUnresolvableNodes"]["plain"], "node(s) missing GPU Partition Table",
        "{f}"
    );

    // The operator's view: the table, its policy and which partitions are free.
    let (status, report) = env.http.get("/debug/nodes?nodes=honor").await;
    assert_eq!(status, 200, "{report}");
    let p = &report["nodes"][0]["gpu_partitions"];
    assert_eq!(p["source"], "builtin-hopper", "{report}");
    assert_eq!(p["policy"], "Honor", "{report}");
    let pairs = p["sizes"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["gpus"] == 2))
        .expect("pairs");
    let free: Vec<&Value> = pairs["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["free"] == true)
        .map(|r| &r["minors"])
        .collect();
    assert_eq!(free, vec![&json!([6, 7])], "{pairs}");
}
