//! A restarted service rebuilds the same ledger from the API server alone.

use std::collections::BTreeMap;

use serde_json::Value;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rebuilds_the_same_ledger_on_every_node() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 8, &[]);
    add_gpu_node(&fake, "n2", 4, &[2]);
    add_gpu_node(&fake, "n3", 2, &[]);
    let requests = [
        whole_gpus(1),
        whole_gpus(2),
        ratio(30),
        ratio(50),
        serde_json::json!({"koordinator.sh/gpu-memory": "20Gi"}),
        serde_json::json!({"koordinator.sh/gpu-core": "50", RATIO: "50"}),
    ];
    let pods: Vec<Value> = (0..36)
        .map(|i| pending(&format!("m{i:02}"), requests[i % requests.len()].clone()))
        .collect();
    fake.create_many(Kind::Pod, pods.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;

    let nodes = ["n1", "n2", "n3"];
    let mut bound = Vec::new();
    for (i, p) in pods.iter().enumerate() {
        let node = nodes[i % 3];
        if env.bind(p, node).await.is_ok() {
            bound.push((node, uid(p)));
        }
    }
    assert!(
        bound.len() >= 12,
        "too few binds to be interesting: {}",
        bound.len()
    );
    for (node, u) in &bound {
        env.wait_committed(node, u).await;
    }
    // Some churn the new service must also agree on.
    env.fake.delete(Kind::Pod, "ml", &name(&pods[0])).ok();
    env.fake
        .set_pod_phase("ml", &name(&pods[1]), "Succeeded")
        .ok();
    let cluster = env.svc.state.scheduler.cluster.clone();
    let (u0, u1) = (uid(&pods[0]), uid(&pods[1]));
    crate::support::service::eventually(WAIT, "churn applied", || {
        let s = cluster.debug_dump();
        s.values().all(|n| {
            n["devices"]["entries"].get(&u0).is_none() && n["devices"]["entries"].get(&u1).is_none()
        })
    })
    .await;

    let fresh = Env::start(&fake, &[]).await;
    for node in nodes {
        let (_, old) = env.http.get(&format!("/debug/nodes/{node}")).await;
        let (_, new) = fresh.http.get(&format!("/debug/nodes/{node}")).await;
        let (old, new) = (without_timings(old), without_timings(new));
        assert_eq!(old, new, "{node}: ledger differs after a restart");
        check_capacity(&new["state"]["devices"]).unwrap();
        let entries = new["state"]["devices"]["entries"].as_object().unwrap();
        assert!(entries.values().all(|e| e["state"] == "committed"));
    }
    // The restarted service allocates around what is held, never on top of it. Which GPUs
    // are held is read from the API server's pods alone (live pods on n1 and their
    // annotations), so the expected outcome does not come from the code under test.
    let held = held_ratio_per_minor(&fake, "n1");
    let free: Vec<i64> = (0..8)
        .filter(|m| held.get(m).is_none_or(|r| *r == 0))
        .collect();
    assert!(
        !held.is_empty() && !free.is_empty(),
        "setup must leave n1 partly used and one GPU free: held {held:?}"
    );
    let extra = pending("late", whole_gpus(1));
    fresh.fake.create(Kind::Pod, extra.clone()).unwrap();
    let result = fresh.bind(&extra, "n1").await;
    assert_eq!(
        result,
        Ok(()),
        "a whole GPU is free on n1 ({free:?}): the bind must succeed"
    );
    fresh.wait_committed("n1", &uid(&extra)).await;
    let annotation = annotation_of(&fake, &extra).expect("the bind annotated the pod");
    let minors: Vec<i64> = gpu_shares(&annotation).iter().map(|(m, _)| *m).collect();
    assert_eq!(minors.len(), 1, "{annotation}");
    assert!(
        free.contains(&minors[0]),
        "the late pod got minor {} which others hold: {held:?}",
        minors[0]
    );
    check_capacity(&fresh.ledger("n1").await).unwrap();
    fresh.svc.shutdown().await.unwrap();
    env.svc.shutdown().await.unwrap();
}

/// GPU memory ratio held per minor on `node` by its live pods (bound there, not terminal),
/// from their `device-allocated` annotations in the fake API server.
fn held_ratio_per_minor(fake: &FakeApiServer, node: &str) -> BTreeMap<i64, i64> {
    let mut held = BTreeMap::new();
    for pod in fake.list(Kind::Pod) {
        let phase = pod["status"]["phase"].as_str().unwrap_or("");
        if pod["spec"]["nodeName"] != node || matches!(phase, "Succeeded" | "Failed") {
            continue;
        }
        if let Some(a) = pod["metadata"]["annotations"][DEVICE_ALLOCATED].as_str() {
            for (minor, ratio) in gpu_shares(a) {
                *held.entry(minor).or_default() += ratio;
            }
        }
    }
    held
}
