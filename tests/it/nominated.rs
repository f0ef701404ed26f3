//! Capacity held for a preemptor while its victims go (issue 38 §2, `scheduler::nominated`):
//! a pod kube-scheduler nominated to a node (`status.nominatedNodeName`, not bound) keeps what
//! it waits for from every pod of no higher priority, as kube-scheduler's own filters keep it
//! (`addGENominatedPods`: priority ≥ the filtered pod's, never the pod itself).
//!
//! Offline (a cluster file through the service's file sync) for the rules; against the fake
//! API server for the second pod watch: its selector, a nomination arriving, cleared, and
//! the nominee bound (each seen as the watch sees it: ADDED, DELETED as the pod stops matching).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use device_numa_extender::extender::input::decode;
use device_numa_extender::model::wire::{ExtenderArgsRef, ExtenderBindingArgs};
use device_numa_extender::ops::inspect::load_cluster_file;
use device_numa_extender::scheduler::bind::OfflinePodApi;
use device_numa_extender::scheduler::{Scheduler, ScoringConfig, verbs};
use device_numa_extender::sync::file_source::ClusterFile;

use crate::support::Kind;
use crate::support::service::{self, Http};

const TIMEOUT: Duration = Duration::from_secs(30);
const WHOLE_GPU: &str = r#"{"gpu":[{"minor":MINOR,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"80Gi","koordinator.sh/gpu-memory-ratio":"100"}}]}"#;

fn whole(minor: i32) -> String {
    WHOLE_GPU.replace("MINOR", &minor.to_string())
}

/// A pod in `ml` with `priority`, asking `requests`.
fn pod(name: &str, priority: i32, requests: Value) -> Value {
    let mut p = service::pending(name, requests);
    p["spec"]["priority"] = json!(priority);
    p
}

/// A bound pod holding GPU `minor` whole.
fn holder(name: &str, priority: i32, minor: i32) -> Value {
    let mut p = service::pod(
        "ml",
        name,
        &format!("uid-{name}"),
        json!({"nvidia.com/gpu": "1"}),
        Some("n"),
        Some(&whole(minor)),
    );
    p["spec"]["priority"] = json!(priority);
    p
}

fn one_gpu(name: &str, priority: i32) -> Value {
    pod(name, priority, json!({"nvidia.com/gpu": "1"}))
}

fn half_gpu(name: &str, priority: i32) -> Value {
    pod(
        name,
        priority,
        json!({"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}),
    )
}

fn nominated(mut p: Value, node: &str) -> Value {
    p["status"]["nominatedNodeName"] = json!(node);
    p
}

/// Node `n` with two GPUs and `pods`, loaded through the file sync.
fn offline(pods: &[Value]) -> Scheduler {
    let mut items = vec![service::node("n"), service::gpu_device("n", 2, 1, &[])];
    items.extend(pods.iter().cloned());
    let text = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    let file = ClusterFile::parse(&text, "cluster").unwrap();
    let api = Arc::new(OfflinePodApi::new(file.pods.clone()));
    load_cluster_file(file).into_scheduler(api, ScoringConfig::default())
}

/// Filter's verdict for `pod` on `n`: `Ok` when it passes, else the reason's text.
fn verdict(state: &Scheduler, pod: &Value) -> Result<(), String> {
    let body = serde_json::to_vec(&service::extender_args(pod, &["n"])).unwrap();
    let args: ExtenderArgsRef = decode(&body).expect("valid body");
    let out = verbs::filter(state, args);
    assert!(out.error.is_empty(), "{}", out.error);
    if out.node_names.unwrap_or_default().iter().any(|n| n == "n") {
        return Ok(());
    }
    let failed = out.failed_nodes.unwrap_or_default();
    let unresolvable = out.failed_and_unresolvable_nodes.unwrap_or_default();
    assert!(
        !unresolvable.contains_key("n"),
        "a held node is resolvable: {unresolvable:?}"
    );
    Err(failed.get("n").expect("a reason for n").to_string())
}

fn held(v: Result<(), String>) -> bool {
    matches!(&v, Err(r) if r.contains("capacity held for ml/pre"))
}

/// The live service's filter verdict for `pod` on `n`: `Ok` when it passes, else the reason.
async fn live_verdict(http: &Http, pod: &Value) -> Result<(), String> {
    let (status, out) = http
        .post("/filter", &service::extender_args(pod, &["n"]))
        .await;
    assert_eq!(status, 200, "{out}");
    if out["NodeNames"]
        .as_array()
        .is_some_and(|a| a.iter().any(|n| n == "n"))
    {
        Ok(())
    } else {
        Err(out["FailedNodes"]["n"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }
}

/// Polls [`live_verdict`] until `want` holds (hang guard [`TIMEOUT`]): the ordering point
/// "the watch has been applied".
async fn until_verdict(
    http: &Http,
    what: &str,
    pod: &Value,
    want: fn(&Result<(), String>) -> bool,
) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let v = live_verdict(http, pod).await;
        if want(&v) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {v:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// kube-scheduler gives up on the node: `ml/name` loses its nomination (it stops matching the
/// nominated-pod watch's selector, which the watch says as a deletion).
fn clear_nomination(fake: &crate::support::FakeApiServer, name: &str) {
    let mut cleared = fake.get(Kind::Pod, "ml", name).unwrap();
    cleared["status"]
        .as_object_mut()
        .unwrap()
        .remove("nominatedNodeName");
    fake.replace(Kind::Pod, cleared).unwrap();
}

#[test]
fn a_nominated_pod_keeps_its_card_from_pods_of_no_higher_priority() {
    // GPU 0 held by a pod nobody preempts; GPU 1 free (its victim is gone); `pre` (priority
    // 100) nominated to n waits for it.
    let state = offline(&[
        holder("keeper", 1000, 0),
        nominated(one_gpu("pre", 100), "n"),
    ]);
    for (pod, is_held) in [
        (half_gpu("low", 0), true),
        (one_gpu("low-whole", 99), true),
        // kube-scheduler's rule is ≥: an equal priority waits too.
        (half_gpu("equal", 100), true),
        (half_gpu("higher", 101), false),
    ] {
        let v = verdict(&state, &pod);
        assert_eq!(
            held(v.clone()),
            is_held,
            "{}: {v:?}",
            pod["metadata"]["name"]
        );
        if !is_held {
            assert_eq!(v, Ok(()));
        }
    }
    // The nominee is never held against itself.
    assert_eq!(verdict(&state, &one_gpu("pre", 100)), Ok(()));
    // A pod that asks for no device is not the extender's to hold.
    assert_eq!(verdict(&state, &pod("cpu", 0, json!({"cpu": "1"}))), Ok(()));
}

#[test]
fn what_the_nominee_leaves_free_stays_free_to_others() {
    // Two free cards; the nominee takes one: a lower-priority pod still fits on the other,
    // and a second whole-card pod of lower priority too, but not a two-card one.
    let state = offline(&[nominated(one_gpu("pre", 100), "n")]);
    assert_eq!(verdict(&state, &half_gpu("low", 0)), Ok(()));
    assert_eq!(verdict(&state, &one_gpu("low-whole", 0)), Ok(()));
    let two = pod("two", 0, json!({"nvidia.com/gpu": "2"}));
    assert!(held(verdict(&state, &two)), "{:?}", verdict(&state, &two));
}

#[test]
fn while_the_victims_hold_the_card_the_nominee_holds_nothing_more() {
    // Both cards held; `pre` cannot fit until its victim goes: the third pod is refused for
    // the cards being full, not for a hold (nothing is held twice).
    let state = offline(&[
        holder("keeper", 1000, 0),
        holder("victim", 0, 1),
        nominated(one_gpu("pre", 100), "n"),
    ]);
    let v = verdict(&state, &half_gpu("low", 0));
    assert!(
        matches!(&v, Err(r) if !held(v.clone()) && r.contains("insufficient gpu")),
        "{v:?}"
    );
}

#[test]
fn a_nomination_elsewhere_or_of_a_bound_pod_holds_nothing_here() {
    let mut bound = holder("pre", 100, 1);
    bound["status"]["nominatedNodeName"] = json!("n");
    for pods in [
        vec![
            holder("keeper", 1000, 0),
            nominated(one_gpu("pre", 100), "m"),
        ],
        // Bound (spec.nodeName set): counted by its annotation, not by its nomination.
        vec![holder("keeper", 1000, 0), bound],
    ] {
        let state = offline(&pods);
        assert!(state.cluster.nominations().on_node("n").is_empty());
        let v = verdict(&state, &half_gpu("low", 0));
        assert!(!held(v.clone()), "{v:?}");
    }
}

#[tokio::test]
async fn a_nominee_whose_bind_is_in_flight_is_counted_once() {
    // The extender bound `pre` (its ledger holds it) while the watch still shows it pending
    // and nominated: counted by the ledger, not held a second time. (`scheduler::nominated`
    // skips a nominee the ledger holds; the ledger, keyed by UID, would not count it twice
    // either: this pins the outcome, whichever guard gives it.)
    let pre = nominated(one_gpu("pre", 100), "n");
    let state = offline(std::slice::from_ref(&pre));
    assert_eq!(verdict(&state, &one_gpu("low", 0)), Ok(()));
    assert_eq!(verdict(&state, &pre), Ok(()));
    let args: ExtenderBindingArgs =
        serde_json::from_value(service::binding_args(&pre, "n")).unwrap();
    state.binder.bind(&args).await.expect("bind");
    assert!(
        !state.cluster.nominations().on_node("n").is_empty(),
        "offline, no watch takes the nomination back"
    );
    // One card left: a lower-priority whole-card pod fits (were `pre` counted twice, it
    // would be held).
    assert_eq!(verdict(&state, &one_gpu("low", 0)), Ok(()));
    let two = pod("two", 0, json!({"nvidia.com/gpu": "2"}));
    let v = verdict(&state, &two);
    assert!(
        matches!(&v, Err(r) if !held(v.clone()) && r.contains("insufficient gpu")),
        "{v:?}"
    );
}

/// The live path: the second pod watch sees a nomination arrive as the victim goes, its
/// clearing, and the nominee bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nominated_pod_watch_follows_preemption_as_it_happens() {
    let fake = crate::support::FakeApiServer::new();
    service::add_gpu_node(&fake, "n", 2, &[]);
    fake.create(Kind::Pod, holder("keeper", 1000, 0)).unwrap();
    fake.create(Kind::Pod, holder("victim", 0, 1)).unwrap();
    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    service::wait_for_all_watches(&fake, TIMEOUT).await;
    let filter = |pod: Value| {
        let http = &http;
        async move { live_verdict(http, &pod).await }
    };
    let until = |what: &'static str, pod: Value, want: fn(&Result<(), String>) -> bool| {
        let http = &http;
        async move { until_verdict(http, what, &pod, want).await }
    };
    let third = half_gpu("third", 0);

    // Preemption: kube-scheduler nominates `pre`, then deletes its victim.
    fake.create(Kind::Pod, nominated(one_gpu("pre", 100), "n"))
        .unwrap();
    fake.delete(Kind::Pod, "ml", "victim").unwrap();
    until("the victim's card held for pre", third.clone(), |v| {
        held(v.clone())
    })
    .await;
    assert_eq!(filter(half_gpu("higher", 200)).await, Ok(()));
    assert_eq!(filter(one_gpu("pre", 100)).await, Ok(()));

    // The nomination cleared (kube-scheduler gave up on the node): the pod stops matching the
    // watch's selector, which the watch says as a deletion.
    clear_nomination(&fake, "pre");
    until("the hold released", third.clone(), |v| v.is_ok()).await;

    // Nominated again, then bound with the card: held, then counted by its annotation.
    let mut again = fake.get(Kind::Pod, "ml", "pre").unwrap();
    again["status"]["nominatedNodeName"] = json!("n");
    fake.replace(Kind::Pod, again).unwrap();
    until("held again", third.clone(), |v| held(v.clone())).await;
    let mut bound = fake.get(Kind::Pod, "ml", "pre").unwrap();
    bound["spec"]["nodeName"] = json!("n");
    bound["status"] = json!({"phase": "Running"});
    bound["metadata"]["annotations"] =
        json!({"scheduling.koordinator.sh/device-allocated": whole(1)});
    fake.replace(Kind::Pod, bound).unwrap();
    until(
        "the bound nominee counted by its annotation",
        third,
        |v| matches!(v, Err(r) if r.contains("insufficient gpu")),
    )
    .await;
    let (_, ready) = http.get("/readyz").await;
    assert!(
        ready["kinds"]["nominatedpods"].is_object(),
        "readiness reports the nominated-pod watch: {ready}"
    );
}

/// A pod refused for a nominee's hold waits in kube-scheduler's unschedulable pool; no fact of
/// the node changes when the nomination clears, so the hold's end is a capacity return of its
/// own, and the requeue signal retries the waiting pod (one Node annotation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleared_nomination_requeues_the_pods_its_hold_refused() {
    use device_numa_extender::scheduler::requeue::REQUEUE_ANNOTATION;
    let fake = crate::support::FakeApiServer::new();
    service::add_gpu_node(&fake, "n", 2, &[]);
    fake.create(Kind::Pod, holder("keeper", 1000, 0)).unwrap();
    fake.create(Kind::Pod, nominated(one_gpu("pre", 100), "n"))
        .unwrap();
    let flags = [
        "--requeue-interval",
        "50ms",
        "--requeue-after-takeover",
        "0s",
    ];
    let svc = service::start(&fake, &flags).await;
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    service::wait_for_all_watches(&fake, TIMEOUT).await;

    // The free card is held for `pre`: the third pod is refused and remembered as waiting.
    let third = half_gpu("third", 0);
    until_verdict(&http, "never held", &third, |v| held(v.clone())).await;
    let (_, ready) = http.get("/readyz").await;
    assert_eq!(ready["requeue"]["waiting_pods"], 1, "{ready}");
    let annotated = |fake: &crate::support::FakeApiServer| {
        fake.get(Kind::Node, "", "n").is_some_and(|n| {
            n["metadata"]["annotations"][REQUEUE_ANNOTATION]
                .as_str()
                .is_some()
        })
    };
    assert!(!annotated(&fake), "nothing returned while the hold stands");

    // kube-scheduler gives up on the node: the nomination clears, and the waiting pod is
    // signalled on the node whose hold ended.
    clear_nomination(&fake, "pre");
    service::eventually(TIMEOUT, "the requeue annotation on n", || annotated(&fake)).await;
    assert_eq!(
        svc.state
            .scheduler
            .metrics
            .requeue_signals
            .with_label_values(&["written"])
            .get(),
        1
    );
    svc.shutdown().await.unwrap();
}
