//! The requeue signal (`device_numa_extender::scheduler::requeue`): capacity returning on a node is seen
//! through the real sync path, a pod filter rejected everywhere is remembered, and one Node
//! annotation is written for all of them; nothing is written without a waiting pod, nor with
//! `--requeue false`. kube-scheduler's side (that the annotation requeues the pods) is proved
//! against the real one in `tests/e2e/requeue_test.go`.

use std::time::Duration;

use device_numa_extender::app::Service;
use device_numa_extender::cluster::returns::ResourceKinds;
use device_numa_extender::scheduler::requeue::REQUEUE_ANNOTATION;
use serde_json::{Value, json};

use crate::support::service::{self, Http, wait_for_all_watches};
use crate::support::{FakeApiServer, Kind};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Starts the service on `fake` with `extra` flags, ready and watching every kind.
async fn started(fake: &FakeApiServer, extra: &[&str]) -> (Service, Http) {
    let svc = service::start(fake, extra).await;
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    wait_for_all_watches(fake, TIMEOUT).await;
    (svc, http)
}

/// Signal flags for these tests: rounds every 50 ms, and no "waiting pods unknown" window
/// after start, so only remembered pods make a write.
const SIGNAL: [&str; 4] = [
    "--requeue-interval",
    "50ms",
    "--requeue-after-takeover",
    "0s",
];

fn node_patches(fake: &FakeApiServer) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.starts_with("/api/v1/nodes/"))
        .count()
}

/// Polls filter until it answers `passes` for `pod` on `node` (hang guard [`TIMEOUT`]): the
/// ordering point "the cache has applied the change".
async fn until_filter(http: &Http, pod: &Value, node: &str, passes: bool, what: &str) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while filter_passes(http, pod, node).await != passes {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn gpu_pod(name: &str) -> Value {
    service::pending(name, json!({"nvidia.com/gpu": "1"}))
}

async fn filter_passes(http: &Http, pod: &Value, node: &str) -> bool {
    let (status, r) = http
        .post("/filter", &service::extender_args(pod, &[node]))
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["Error"], "", "{r}");
    r["NodeNames"]
        .as_array()
        .is_some_and(|names| names.iter().any(|n| n == node))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_turning_healthy_writes_one_signal_for_every_waiting_pod() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 2, &[0, 1]);
    let (svc, http) = started(&fake, &SIGNAL).await;

    // Twenty pods find no healthy GPU anywhere: each is remembered as waiting.
    let pods: Vec<Value> = (0..20).map(|i| gpu_pod(&format!("p{i}"))).collect();
    for pod in &pods {
        assert!(!filter_passes(&http, pod, "n1").await);
    }
    let (_, ready) = http.get("/readyz").await;
    assert_eq!(ready["requeue"]["enabled"], true, "{ready}");
    assert_eq!(ready["requeue"]["waiting_pods"], 20, "{ready}");
    assert_eq!(node_patches(&fake), 0, "nothing returned yet");

    // One GPU turns healthy: one annotation on n1, for all twenty.
    fake.replace(Kind::Device, service::gpu_device("n1", 2, 1, &[1]))
        .unwrap();
    service::eventually(TIMEOUT, "the requeue annotation on n1", || {
        fake.get(Kind::Node, "", "n1").is_some_and(|n| {
            n["metadata"]["annotations"][REQUEUE_ANNOTATION]
                .as_str()
                .is_some_and(|v| v.contains("gpu"))
        })
    })
    .await;
    let metrics = &svc.state.scheduler.metrics;
    assert_eq!(
        metrics
            .requeue_signals
            .with_label_values(&["written"])
            .get(),
        1
    );
    assert_eq!(node_patches(&fake), 1, "one write for twenty waiting pods");
    assert!(metrics.capacity_returns.with_label_values(&["gpu"]).get() >= 1);
    let (_, ready) = http.get("/readyz").await;
    assert_eq!(ready["requeue"]["last_signal"]["node"], "n1", "{ready}");

    // The retried pod fits now and is forgotten; the others still wait.
    assert!(filter_passes(&http, &pods[0], "n1").await);
    let (_, ready) = http.get("/readyz").await;
    assert_eq!(ready["requeue"]["waiting_pods"], 19, "{ready}");
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_signal_without_a_waiting_pod_and_none_when_turned_off() {
    // Capacity returns, but nobody waits: counted, not written.
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 2, &[0, 1]);
    let (svc, _http) = started(&fake, &SIGNAL).await;
    fake.replace(Kind::Device, service::gpu_device("n1", 2, 1, &[]))
        .unwrap();
    let metrics = svc.state.scheduler.metrics.clone();
    service::eventually(TIMEOUT, "the return judged", || {
        metrics
            .requeue_signals
            .with_label_values(&["no_waiting_pods"])
            .get()
            >= 1
    })
    .await;
    assert_eq!(node_patches(&fake), 0);
    svc.shutdown().await.unwrap();

    // Turned off: a rejected pod is not remembered and the return writes nothing. The filter
    // that passes after the return is the ordering point: the cache has applied it, and no
    // signal task exists to act on it.
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 2, &[0, 1]);
    let (svc, http) = started(&fake, &["--requeue", "false"]).await;
    let pod = gpu_pod("p");
    assert!(!filter_passes(&http, &pod, "n1").await);
    let (_, ready) = http.get("/readyz").await;
    assert_eq!(ready["requeue"]["enabled"], false, "{ready}");
    assert_eq!(ready["requeue"]["waiting_pods"], 0, "{ready}");
    fake.replace(Kind::Device, service::gpu_device("n1", 2, 1, &[]))
        .unwrap();
    until_filter(&http, &pod, "n1", true, "the healed GPUs in the cache").await;
    assert_eq!(node_patches(&fake), 0);
    svc.shutdown().await.unwrap();
}

/// What counts as capacity returning, through the real sync path: GPUs turning healthy and a
/// holder going away do; GPUs turning sick and a bind taking a GPU do not. Collected by hand
/// (`--requeue false` starts no signal task that would take the returns first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_returns_are_what_frees_room_and_nothing_else() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 2, &[]);
    let (svc, http) = started(&fake, &["--requeue", "false"]).await;
    let returns = svc.state.scheduler.cluster.capacity_returns();
    returns.enable();
    let gpu_returned = |taken: &std::collections::BTreeMap<std::sync::Arc<str>, ResourceKinds>| {
        taken
            .get("n1")
            .is_some_and(|k| k.intersects(ResourceKinds::GPU))
    };
    let whole = gpu_pod("whole");

    // Both GPUs turn sick: less room. Ordering point: the filter sees it.
    fake.replace(Kind::Device, service::gpu_device("n1", 2, 1, &[0, 1]))
        .unwrap();
    until_filter(&http, &whole, "n1", false, "sick GPUs in the cache").await;
    assert!(!gpu_returned(&returns.take()), "sick GPUs are no return");

    // One heals: a return.
    fake.replace(Kind::Device, service::gpu_device("n1", 2, 1, &[1]))
        .unwrap();
    service::eventually(TIMEOUT, "the healed GPU as a return", || {
        gpu_returned(&returns.take())
    })
    .await;

    // A bind takes it: no return.
    fake.create(Kind::Pod, whole.clone()).unwrap();
    let (_, r) = http
        .post("/bind", &service::binding_args(&whole, "n1"))
        .await;
    assert_eq!(r["Error"], "", "{r}");
    assert!(!gpu_returned(&returns.take()), "a bind is no return");
    until_filter(
        &http,
        &gpu_pod("other"),
        "n1",
        false,
        "the bound pod in the cache",
    )
    .await;
    assert!(
        !gpu_returned(&returns.take()),
        "its confirmation is no return"
    );

    // Its holder goes away (a deletion the extender sees; kube-scheduler would too, but
    // the same path serves holders released by an expired assumption): a return.
    fake.delete(Kind::Pod, "ml", "whole").unwrap();
    service::eventually(TIMEOUT, "the released GPU as a return", || {
        gpu_returned(&returns.take())
    })
    .await;
    svc.shutdown().await.unwrap();
}

/// CPUs: a cpuset holder going away is a CPU return; its bind is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_cpuset_is_a_cpu_return() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("n1")).unwrap();
    fake.create(
        Kind::NodeResourceTopology,
        crate::numa::koord_nrt("n1", 1, 2, "None", &[]),
    )
    .unwrap();
    let (svc, http) = started(&fake, &["--requeue", "false"]).await;
    let returns = svc.state.scheduler.cluster.capacity_returns();
    returns.enable();
    let cpu_returned = |taken: &std::collections::BTreeMap<std::sync::Arc<str>, ResourceKinds>| {
        taken
            .get("n1")
            .is_some_and(|k| k.intersects(ResourceKinds::CPU))
    };
    // The holder takes all four CPUs.
    let holder = crate::numa::lsr_pod("holder", 4, json!({}));
    fake.create(Kind::Pod, holder.clone()).unwrap();
    let (_, r) = http
        .post("/bind", &service::binding_args(&holder, "n1"))
        .await;
    assert_eq!(r["Error"], "", "{r}");
    let other = crate::numa::lsr_pod("other", 2, json!({}));
    until_filter(&http, &other, "n1", false, "the held cpuset in the cache").await;
    assert!(
        !cpu_returned(&returns.take()),
        "a cpuset bound is no return"
    );

    fake.delete(Kind::Pod, "ml", "holder").unwrap();
    service::eventually(TIMEOUT, "the released cpuset as a CPU return", || {
        cpu_returned(&returns.take())
    })
    .await;
    until_filter(&http, &other, "n1", true, "the freed CPUs in the cache").await;
    svc.shutdown().await.unwrap();
}
