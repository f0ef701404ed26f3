//! Issue 22 §1: a binding that lands *late*, after the client gave up and kube-scheduler
//! retried. The fake API server holds the write ([`WriteFault::LandsLate`]) and applies it
//! when the test says, with its preconditions checked then, as a real API server whose storage
//! write commits late.
//!
//! Every outcome is judged from the API objects alone, by [`violations`], written from
//! koordinator's annotation format and the Device objects (not the crate's parsers or ledgers):
//! a bound pod that asks for GPUs carries a `device-allocated` annotation; its minors exist on
//! its node's Device; no minor of a node is given more than 100 % of its cores. No wait here is
//! a timing: each is an ordering the test waits for, with a hang guard.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::gpu::{Env, Fault, faulty_client, name, node_of, uid, whole_gpus};
use crate::support::service::{self, eventually};
use crate::support::{FakeApiServer, Kind, WriteFault, WriteOp};

const GUARD: Duration = Duration::from_secs(60);
const DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";

/// A Device whose GPUs have the given minors (whole GPUs, 100 cores each).
fn device_with_minors(node: &str, minors: &[i64]) -> Value {
    let devices: Vec<Value> = minors
        .iter()
        .map(|m| {
            json!({"type": "gpu", "id": format!("GPU-{node}-{m}"), "minor": m, "health": true,
                   "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
                                 "koordinator.sh/gpu-memory-ratio": "100"}})
        })
        .collect();
    json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
           "metadata": {"name": node}, "spec": {"devices": devices}})
}

/// n1 with GPU minor 0, n2 with GPU minor 5: an allocation decided for one node names a minor
/// the other does not have.
fn cluster(pods: &[&Value]) -> FakeApiServer {
    let fake = FakeApiServer::new();
    for (node, minors) in [("n1", [0]), ("n2", [5])] {
        fake.create(Kind::Node, service::node(node)).unwrap();
        fake.create(Kind::Device, device_with_minors(node, &minors))
            .unwrap();
    }
    for p in pods {
        fake.create(Kind::Pod, (*p).clone()).unwrap();
    }
    fake
}

/// What the API objects say is wrong: every GPU pod bound to a node must carry an allocation
/// of minors that node has, and no minor may be given more than its 100 cores.
fn violations(fake: &FakeApiServer) -> Vec<String> {
    let mut minors_of: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for d in fake.list(Kind::Device) {
        let node = d["metadata"]["name"].as_str().unwrap().to_string();
        let minors = d["spec"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|x| x["minor"].as_i64())
            .collect();
        minors_of.insert(node, minors);
    }
    let mut cores: BTreeMap<(String, i64), i64> = BTreeMap::new();
    let mut found = Vec::new();
    for p in fake.list(Kind::Pod) {
        let (Some(node), pod) = (p["spec"]["nodeName"].as_str(), name(&p)) else {
            continue;
        };
        let asks_gpu = p["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| !c["resources"]["requests"]["nvidia.com/gpu"].is_null());
        let Some(annotation) = p["metadata"]["annotations"][DEVICE_ALLOCATED].as_str() else {
            if asks_gpu {
                found.push(format!(
                    "{pod} on {node} asks for a GPU but carries no allocation"
                ));
            }
            continue;
        };
        let parsed: Value = serde_json::from_str(annotation).unwrap();
        for gpu in parsed["gpu"].as_array().into_iter().flatten() {
            let minor = gpu["minor"].as_i64().unwrap();
            if !minors_of.get(node).is_some_and(|m| m.contains(&minor)) {
                found.push(format!(
                    "{pod} on {node} holds GPU minor {minor}, which {node} does not have (decided for another node)"
                ));
            }
            let core: i64 = gpu["resources"]["koordinator.sh/gpu-core"]
                .as_str()
                .map(|c| c.parse().unwrap())
                .unwrap_or(100);
            *cores.entry((node.to_string(), minor)).or_default() += core;
        }
    }
    for ((node, minor), used) in cores {
        if used > 100 {
            found.push(format!(
                "{node} GPU minor {minor} is given {used}% of its cores"
            ));
        }
    }
    found
}

async fn start(fake: &FakeApiServer) -> (Env, crate::gpu::Faults) {
    let (client, faults) = faulty_client(fake);
    // A long request timeout: the fake gives a late write up at its `timeout`, as a real API
    // server does, and the test must land it well within that.
    let env = Env::start_with(fake, client, &["--request-timeout", "60s"]).await;
    (env, faults)
}

/// 22 §1a and §1b: x's binding to n1 loses its answer and stays in flight. kube-scheduler
/// retries x on n2, and the late n1 binding lands while the retry is writing; y then asks for
/// n1. Before the fix the retry released x's n1 GPU at once and the late binding landed x on
/// n1 without its annotation (or with the one decided for n2), so y was given x's GPU. Now the
/// allocation travels inside the binding, so x lands on n1 with n1's minor, and the retry (and
/// y) are refused while the late binding may still land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_that_lands_after_the_retry_never_doubles_a_gpu() {
    let x = service::pending("x", whole_gpus(1));
    let y = service::pending("y", whole_gpus(1));
    let fake = cluster(&[&x, &y]);
    let (env, faults) = start(&fake).await;

    fake.push_write_fault(WriteOp::PodBinding, WriteFault::LandsLate(1));
    let err = env.bind(&x, "n1").await.unwrap_err();
    assert!(err.contains("create the binding"), "{err}");
    assert_eq!(node_of(&fake, &x), None, "the late binding landed early");

    // The retry to n2; if it writes, its write is held until the late n1 binding has landed.
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    faults.push(Fault::HoldCommit(release.clone()));
    let retry = {
        let (http, x) = (env.http.clone(), x.clone());
        tokio::spawn(async move { crate::gpu::bind(&http, &x, "n2").await })
    };
    eventually(GUARD, "the retry answered or reached its write", || {
        retry.is_finished() || faults.pending() == 0
    })
    .await;
    fake.land_late_write(1);
    eventually(GUARD, "the late binding landed", || {
        fake.late_write_outcome(1).is_some()
    })
    .await;
    release.notify_one();
    let retried = tokio::time::timeout(GUARD, retry).await.unwrap().unwrap();
    // y asks for n1 now: n1's only GPU is x's (held while its binding could land, then
    // committed). Judged first from the API objects alone.
    let y_on_n1 = env.bind(&y, "n1").await;
    assert_eq!(
        violations(&fake),
        Vec::<String>::new(),
        "retry: {retried:?}, y on n1: {y_on_n1:?}"
    );
    assert!(
        y_on_n1.as_ref().is_err_and(|e| e.contains("cannot place")),
        "{y_on_n1:?}"
    );
    assert!(
        retried
            .as_ref()
            .is_err_and(|e| e.contains("may still land")),
        "the retry bound while the first binding could still land: {retried:?}"
    );
    assert_eq!(
        fake.late_write_outcome(1),
        Some(201),
        "the late binding was applied"
    );
    assert_eq!(node_of(&fake, &x).as_deref(), Some("n1"));
    env.wait_committed("n1", &uid(&x)).await;
    assert!(
        env.bind(&y, "n1")
            .await
            .unwrap_err()
            .contains("cannot place")
    );
    env.bind(&y, "n2").await.unwrap();
    assert_eq!(violations(&fake), Vec::<String>::new());
    env.svc.shutdown().await.unwrap();
}

/// 22 §1, the fence: once the pod changes after the binding was sent (kube-scheduler records
/// the failed attempt on it), the late binding's resourceVersion precondition can never
/// match: the hold is released without waiting for the request's deadline, the retry binds
/// elsewhere, and when the late binding finally arrives it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_binding_whose_pod_changed_is_fenced_out_and_its_hold_released() {
    let x = service::pending("x", whole_gpus(1));
    let y = service::pending("y", whole_gpus(1));
    let fake = cluster(&[&x, &y]);
    let (env, _faults) = start(&fake).await;

    fake.push_write_fault(WriteOp::PodBinding, WriteFault::LandsLate(7));
    env.bind(&x, "n1").await.unwrap_err();
    let err = env.bind(&x, "n2").await.unwrap_err();
    assert!(err.contains("may still land"), "{err}");

    fake.patch_merge(
        Kind::Pod,
        "ml",
        "x",
        json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}]}}),
    )
    .unwrap();
    // The probe sees the pod changed: n1's GPU is offered again (to y).
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let f = env.filter(&y, &["n1"]).await;
        if f["NodeNames"] == json!(["n1"]) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hold was never released: {f}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.bind(&x, "n2").await.unwrap();
    env.bind(&y, "n1").await.unwrap();

    fake.land_late_write(7);
    eventually(GUARD, "the late binding arrived", || {
        fake.late_write_outcome(7).is_some()
    })
    .await;
    assert_eq!(
        fake.late_write_outcome(7),
        Some(409),
        "the fenced binding was applied"
    );
    assert_eq!(node_of(&fake, &x).as_deref(), Some("n2"));
    assert_eq!(violations(&fake), Vec::<String>::new());
    env.svc.shutdown().await.unwrap();
}
