//! Issue 37: bind decides on the pod kube-scheduler sent with filter in the same scheduling
//! cycle instead of reading it (`scheduler::bind::sent`). The fake API server records every
//! request, so "no read" is the server's word, not the extender's; the binding's
//! resourceVersion precondition (which the fake enforces as the real API server does) is what
//! makes a stale copy safe, and each test changes the pod between filter and bind in one way.

use serde_json::{Value, json};

use super::*;
use crate::support::FakeApiServer;
use crate::support::fake_apiserver::Kind;

/// The pod as the API server stores it (with its resourceVersion), as kube-scheduler sends it.
fn created(fake: &FakeApiServer, pod: Value) -> Value {
    fake.create(Kind::Pod, pod).expect("pod created")
}

/// The API server requests since the last clear, as `METHOD path` (query left out).
fn requests(fake: &FakeApiServer) -> Vec<String> {
    fake.requests()
        .into_iter()
        .filter(|r| r.path.contains("/pods"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

fn reads_of(fake: &FakeApiServer, pod: &Value) -> usize {
    let path = format!("/api/v1/namespaces/ml/pods/{}", name(pod));
    requests(fake)
        .iter()
        .filter(|r| **r == format!("GET {path}"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_after_filter_decides_on_the_pod_filter_saw_and_reads_nothing() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 2, &[]);
    let env = Env::start(&fake, &[]).await;
    let pod = created(&fake, pending("p", whole_gpus(1)));
    assert!(pod["metadata"]["resourceVersion"].is_string(), "{pod}");

    let f = env.filter(&pod, &["n1"]).await;
    assert_eq!(f["NodeNames"], json!(["n1"]), "{f}");
    let kept = || env.svc.state.scheduler.binder.sent_pods().len();
    assert_eq!(kept(), 1, "filter kept the pod it was sent");
    fake.clear_requests();
    env.bind(&pod, "n1").await.unwrap();
    assert_eq!(kept(), 0, "the bind took it");

    assert_eq!(reads_of(&fake, &pod), 0, "{:?}", requests(&fake));
    assert_eq!(
        requests(&fake),
        vec!["POST /api/v1/namespaces/ml/pods/p/binding".to_string()],
        "one write, nothing else"
    );
    assert_eq!(node_of(&fake, &pod).as_deref(), Some("n1"));
    assert!(
        annotation_of(&fake, &pod).is_some(),
        "the allocation is on the pod"
    );
    assert_eq!(
        env.metric("dne_bind_reads_total", "source=\"filter\"")
            .await,
        1.0
    );
    assert_eq!(
        env.metric("dne_bind_reads_total", "source=\"api\"").await,
        0.0
    );
    env.svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_without_a_filter_before_it_reads_the_pod() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 2, &[]);
    let env = Env::start(&fake, &[]).await;
    let pod = created(&fake, pending("p", whole_gpus(1)));
    fake.clear_requests();
    env.bind(&pod, "n1").await.unwrap();
    assert_eq!(reads_of(&fake, &pod), 1, "{:?}", requests(&fake));
    assert_eq!(node_of(&fake, &pod).as_deref(), Some("n1"));
    env.svc.shutdown().await.unwrap();
}

/// A change that leaves what the pod asks for alone (a label; kube-scheduler's PreBind
/// writes and nominations are alike): the binding's precondition fails, the pod is read, and
/// the same decision is bound under the fresh resourceVersion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_changed_after_filter_is_read_again_and_bound_if_it_asks_the_same() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 2, &[]);
    let env = Env::start(&fake, &[]).await;
    let pod = created(&fake, pending("p", whole_gpus(1)));
    env.filter(&pod, &["n1"]).await;
    fake.patch_merge(
        Kind::Pod,
        "ml",
        "p",
        json!({"metadata": {"labels": {"changed": "after-filter"}}}),
    )
    .unwrap();
    fake.clear_requests();
    env.bind(&pod, "n1").await.unwrap();

    let binding = "POST /api/v1/namespaces/ml/pods/p/binding".to_string();
    let read = "GET /api/v1/namespaces/ml/pods/p".to_string();
    assert_eq!(
        requests(&fake),
        vec![binding.clone(), read, binding],
        "refused, read, bound"
    );
    let stored = fake.get(Kind::Pod, "ml", "p").unwrap();
    assert_eq!(stored["spec"]["nodeName"], "n1");
    assert_eq!(stored["metadata"]["labels"]["changed"], "after-filter");
    assert!(annotation_of(&fake, &pod).is_some());
    assert_eq!(env.metric("dne_bind_patch_conflicts_total", "").await, 1.0);
    assert_eq!(env.metric("dne_bind_pod_changed_total", "").await, 0.0);
    env.svc.shutdown().await.unwrap();
}

/// A change of what the pod asks for between filter and bind: the decision was made for the
/// old pod, so nothing is written and the allocation is released; kube-scheduler retries with
/// the new pod, and that bind (which reads it) allocates what it asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_asks_for_something_else_after_filter_is_not_bound_with_the_old_decision() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 4, &[]);
    let env = Env::start(&fake, &[]).await;
    let pod = created(&fake, pending("p", whole_gpus(1)));
    env.filter(&pod, &["n1"]).await;
    let two = json!({"requests": whole_gpus(2), "limits": whole_gpus(2)});
    fake.patch_merge(
        Kind::Pod,
        "ml",
        "p",
        json!({"spec": {"containers": [{"name": "main", "image": "app:1", "resources": two.clone()}]}}),
    )
    .unwrap();
    let stored = fake.get(Kind::Pod, "ml", "p").unwrap();
    assert_eq!(
        stored["spec"]["containers"][0]["resources"], two,
        "the patch changed the request: {stored}"
    );

    let err = env.bind(&pod, "n1").await.unwrap_err();
    assert!(err.contains("changed what it asks for"), "{err}");
    assert_eq!(node_of(&fake, &pod), None, "nothing written");
    assert_eq!(annotation_of(&fake, &pod), None);
    assert!(
        env.ledger("n1").await["entries"][uid(&pod)].is_null(),
        "the old decision is released"
    );
    assert_eq!(env.metric("dne_bind_pod_changed_total", "").await, 1.0);

    // kube-scheduler's retry: the bind reads the new pod and allocates two GPUs.
    env.bind(&pod, "n1").await.unwrap();
    let allocated = annotation_of(&fake, &pod).expect("allocated");
    assert_eq!(gpu_shares(&allocated).len(), 2, "{allocated}");
    env.svc.shutdown().await.unwrap();
}

/// A retry after an attempt whose outcome is unknown must judge that attempt on the live pod:
/// the copy filter kept is not used, whatever it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_while_an_earlier_attempt_holds_an_allocation_reads_the_pod() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 2, &[]);
    let env = Env::start(&fake, &[]).await;
    let pod = created(&fake, pending("p", whole_gpus(1)));
    env.filter(&pod, &["n1"]).await;
    // The first binding answers 503: it may have been applied, its allocation stays held.
    fake.fail_writes(Kind::Pod, 503, 1);
    env.bind(&pod, "n1").await.unwrap_err();
    assert!(
        !env.ledger("n1").await["entries"][uid(&pod)].is_null(),
        "held"
    );

    env.filter(&pod, &["n1"]).await;
    fake.clear_requests();
    let _ = env.bind(&pod, "n1").await;
    assert!(reads_of(&fake, &pod) >= 1, "{:?}", requests(&fake));
    env.svc.shutdown().await.unwrap();
}

/// A pod another writer bound here after filter, and the pod watch committed: the copy filter
/// kept still says unbound, so it is not used; the read finds the pod bound with its allocation
/// and the bind answers "already bound", writing nothing and deciding nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_watch_saw_bound_here_after_filter_is_read_not_decided_again() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 2, &[]);
    let env = Env::start(&fake, &[]).await;
    let pod = created(&fake, pending("p", whole_gpus(1)));
    env.filter(&pod, &["n1"]).await;
    let allocated = crate::support::service::whole_gpus(&[0]);
    fake.patch_merge(
        Kind::Pod,
        "ml",
        "p",
        json!({"metadata": {"annotations": {"scheduling.koordinator.sh/device-allocated": allocated}}}),
    )
    .unwrap();
    fake.bind_pod("ml", "p", "n1").unwrap();
    let mut committed = false;
    for _ in 0..500 {
        if env.ledger("n1").await["entries"][uid(&pod)]["state"] == json!("committed") {
            committed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        committed,
        "the watch never committed the other writer's bind"
    );
    fake.clear_requests();
    env.bind(&pod, "n1").await.unwrap();
    assert_eq!(
        requests(&fake),
        vec!["GET /api/v1/namespaces/ml/pods/p".to_string()],
        "read, nothing written"
    );
    assert_eq!(
        env.metric("dne_binds_total", "outcome=\"already_bound\"")
            .await,
        1.0
    );
    env.svc.shutdown().await.unwrap();
}
