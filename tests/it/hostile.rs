//! Hostile but well-formed cluster data (issue 9 §3): Devices with thousands of entries,
//! duplicate, missing and negative minors, huge and negative quantities; pods whose
//! annotations overcommit a minor, carry thousands of entries, huge or negative quantities or no
//! JSON at all; CPU ids out of range in topology and cpusets. Each bad Device entry and bad
//! annotation is counted in a metric, nothing panics, the bad node blocks what it must, and
//! the other node is untouched (read through `/metrics` and `/debug`, as an operator would).

use serde_json::{Value, json};

use crate::gpu::{Env, metric_value};
use crate::support::service;
use crate::support::{FakeApiServer, Kind};

const GPU: &str = r#"{"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi", "koordinator.sh/gpu-memory-ratio": "100"}"#;

fn gpu_entry(minor: Value, resources: Value) -> Value {
    json!({"type": "gpu", "id": format!("GPU-{minor}"), "minor": minor, "health": true, "resources": resources})
}

fn hostile_device() -> Value {
    let full: Value = serde_json::from_str(GPU).unwrap();
    let mut devices: Vec<Value> = (0..3000)
        .map(|m| gpu_entry(json!(m), full.clone()))
        .collect();
    devices.push(gpu_entry(json!(5), full.clone())); // duplicate minor
    devices.push(json!({"type": "gpu", "health": true, "resources": full.clone()})); // no minor
    devices.push(gpu_entry(json!(-3), full.clone())); // negative minor
    devices.push(gpu_entry(
        json!(4000),
        json!({"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "-80Gi", "koordinator.sh/gpu-memory-ratio": "100"}),
    ));
    devices.push(gpu_entry(
        json!(4001),
        json!({"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "999999999999999999999999999999Ei", "koordinator.sh/gpu-memory-ratio": "100"}),
    ));
    json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
           "metadata": {"name": "bad"}, "spec": {"devices": devices}})
}

fn whole(minor: i64) -> Value {
    json!({"minor": minor, "resources": serde_json::from_str::<Value>(GPU).unwrap()})
}

fn holder(name: &str, node: &str, annotation: &str) -> Value {
    service::pod(
        "ml",
        name,
        &format!("uid-{name}"),
        json!({"nvidia.com/gpu": "1"}),
        Some(node),
        Some(annotation),
    )
}

async fn metric(env: &Env, name: &str, labels: &str) -> f64 {
    let (status, body) = env.http.get("/metrics").await;
    assert_eq!(status, 200);
    metric_value(body.as_str().unwrap_or_default(), name, labels)
}

fn entries(ledger: &Value) -> Vec<String> {
    ledger["entries"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_cluster_data_is_counted_never_panics_and_leaves_other_nodes_alone() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "good", 2, &[]);
    fake.create(Kind::Node, service::node("bad")).unwrap();
    fake.create(Kind::Device, hostile_device()).unwrap();
    let mut nrt = service::nrt("bad");
    nrt["metadata"]["annotations"]["node.koordinator.sh/cpu-topology"] = json!(
        "{\"detail\":[{\"id\":4294967296,\"core\":-1,\"socket\":0,\"node\":0},{\"id\":-7,\"core\":0,\"socket\":0,\"node\":99999}]}"
    );
    fake.create(Kind::NodeResourceTopology, nrt).unwrap();
    fake.create(Kind::NodeResourceTopology, service::nrt("good"))
        .unwrap();

    let whole0 = json!({"gpu": [whole(0)]}).to_string();
    let many = json!({"gpu": (0..2000).map(whole).collect::<Vec<_>>()}).to_string();
    let negative =
        json!({"gpu": [{"minor": 1, "resources": {"koordinator.sh/gpu-memory-ratio": "-100"}}]})
            .to_string();
    let huge = json!({"gpu": [{"minor": 2, "resources": {"koordinator.sh/gpu-memory": "999999999999999999999999999999Ei"}}]})
        .to_string();
    let mut cpus = holder("cpus", "bad", &json!({"gpu": [whole(7)]}).to_string());
    cpus["metadata"]["annotations"]["scheduling.koordinator.sh/resource-status"] =
        json!("{\"cpuset\":\"0-999999,4294967296\"}");
    for p in [
        holder("over-1", "bad", &whole0), // two pods on one whole GPU: overcommitted
        holder("over-2", "bad", &whole0),
        holder("many", "bad", &many),
        holder("negative", "bad", &negative),
        holder("huge", "bad", &huge),
        holder("garbage", "bad", "{not json"),
        cpus,
        holder("fine", "good", &json!({"gpu": [whole(0)]}).to_string()),
    ] {
        fake.create(Kind::Pod, p).unwrap();
    }

    // Bootstrap through all of it: no panic, ready.
    let env = Env::start(&fake, &[]).await;
    assert_eq!(env.http.get("/healthz").await.0, 200);

    // Counted, per problem class.
    for problem in [
        "duplicate_minor",
        "missing_minor",
        "negative_minor",
        "invalid_resource",
        // Two pods' parseable annotations on one whole GPU.
        "overcommitted",
    ] {
        assert!(
            metric(
                &env,
                "dne_device_problems_total",
                &format!("problem=\"{problem}\"")
            )
            .await
                >= 1.0,
            "{problem} not counted"
        );
    }
    // negative, huge and garbage annotations are unusable; `many` and the overcommit parse.
    assert!(metric(&env, "dne_malformed_annotations_total", "").await >= 3.0);

    // The good node is untouched: its one pod, and a new bind gets the other GPU.
    let good = env.ledger("good").await;
    assert_eq!(entries(&good), vec!["uid-fine".to_string()], "{good}");
    let p = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, p.clone()).unwrap();
    let f = env.filter(&p, &["good", "bad"]).await;
    assert_eq!(f["NodeNames"], json!(["good"]), "{f}");
    // The bad node, with unparseable annotations on it, counts every device as used.
    assert!(f["FailedNodes"]["bad"].is_string(), "{f}");
    env.bind(&p, "good").await.unwrap();
    let a = crate::gpu::annotation_of(&fake, &p).expect("annotated");
    assert_eq!(crate::gpu::gpu_shares(&a), vec![(1, 100)], "{a}");

    // The debug view of the bad node answers (no panic rendering it).
    let (status, bad) = env.http.get("/debug/nodes/bad").await;
    assert_eq!(status, 200);
    assert_eq!(
        bad["state"]["devices"]["blocked_by_malformed_entries"], true,
        "blocked"
    );

    // Once the unusable pods are gone, the bad node places again, never on the overcommitted
    // minor 0 or on the minors `many` holds.
    for name in ["negative", "huge", "garbage"] {
        fake.delete(Kind::Pod, "ml", name).unwrap();
    }
    let q = service::pending("q", json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, q.clone()).unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let f = env.filter(&q, &["bad"]).await;
        if f["NodeNames"] == json!(["bad"]) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "bad never unblocked: {f}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    env.bind(&q, "bad").await.unwrap();
    let a = crate::gpu::annotation_of(&fake, &q).expect("annotated");
    let minor = crate::gpu::gpu_shares(&a)[0].0;
    assert!(
        minor >= 2000,
        "q got minor {minor}, which `many` or the overcommit holds: {a}"
    );
    assert_ne!(minor, 5, "the duplicated minor must not be trusted");

    // The good node is still exactly its pods, and the watches still work.
    env.wait_committed("good", "uid-p").await;
    let good = env.ledger("good").await;
    assert_eq!(
        entries(&good),
        vec!["uid-fine".to_string(), "uid-p".to_string()],
        "{good}"
    );
    env.svc.shutdown().await.unwrap();
}
