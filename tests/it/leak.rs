//! Issue 11: assumed allocations must not hold capacity after their pod is gone. Each test
//! runs with the default `--assume-ttl` (5 min), so the TTL expiry cannot be what frees the
//! capacity: a relist, the prompt probe or a retried bind must. Every wait is a hang guard
//! (poll until true, fail after [`GUARD`]), never a timing.

use std::time::Duration;

use serde_json::{Value, json};

use crate::gpu::{
    Env, Fault, Faults, HeldBind, add_gpu_node, annotation_of, bind_across_pod_watch_outage,
    faulty_client, node_of, pending, pod_watch_up, uid, whole_gpus,
};
use crate::support::{FakeApiServer, Kind, WriteFault, WriteOp};

const GUARD: Duration = Duration::from_secs(60);

async fn start(nodes: &[&str], pods: &[&Value]) -> (Env, Faults) {
    start_flags(nodes, pods, &[]).await
}

async fn start_flags(nodes: &[&str], pods: &[&Value], flags: &[&str]) -> (Env, Faults) {
    let fake = FakeApiServer::new();
    for n in nodes {
        add_gpu_node(&fake, n, 1, &[]);
    }
    for p in pods {
        fake.create(Kind::Pod, (*p).clone()).unwrap();
    }
    let (client, faults) = faulty_client(&fake);
    (Env::start_with(&fake, client, flags).await, faults)
}

/// Polls filter until it offers `node` to `pod`.
async fn until_offered(env: &Env, pod: &Value, node: &str) {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let f = env.filter(pod, &[node]).await;
        if f["NodeNames"]
            .as_array()
            .is_some_and(|n| n.iter().any(|x| x == node))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{node} never offered again: {f}; ledger {}",
            env.ledger(node).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn assumed_state(env: &Env, node: &str, pod: &Value) -> Value {
    env.ledger(node).await["entries"][uid(pod)]["state"].clone()
}

/// Path 1: a bind succeeds, the pod stream then has a gap (watch down, history compacted),
/// and the pod is deleted inside it. No event for it ever arrives; the relist's list (taken
/// after the bind finished) does not hold it, so `InitDone` releases the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_deleted_in_a_watch_gap_after_a_successful_bind_is_released_at_relist() {
    let lost = pending("lost", whole_gpus(1));
    let next = pending("next", whole_gpus(1));
    let (env, faults) = start(&["n1"], &[&lost, &next]).await;
    bind_across_pod_watch_outage(&env, &faults, &lost, "n1")
        .await
        .unwrap();
    assert_eq!(assumed_state(&env, "n1", &lost).await, "assumed");
    let f = env.filter(&next, &["n1"]).await;
    assert_eq!(
        f["NodeNames"],
        serde_json::json!([]),
        "the GPU looked free: {f}"
    );

    env.fake.delete(Kind::Pod, "ml", "lost").unwrap();
    env.fake.compact();
    pod_watch_up(&env.fake);

    until_offered(&env, &next, "n1").await;
    assert_eq!(
        env.metric("dne_assumed_released_total", "path=\"relist\"")
            .await,
        1.0
    );
    assert_eq!(env.metric("dne_assumed_expired_total", "").await, 0.0);
    env.bind(&next, "n1").await.unwrap();
    env.wait_committed("n1", &uid(&next)).await;
    env.svc.shutdown().await.unwrap();
}

/// Path 2: the binding fails and the pod cannot be read back (ambiguous: kept held on
/// purpose), then the still-pending pod is deleted. The service watches only assigned pods,
/// so no event says so: the prompt probe finds the pod gone and releases the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pod_deleted_after_an_ambiguous_failure_is_released_by_the_probe() {
    let p = pending("p", whole_gpus(1));
    let next = pending("next", whole_gpus(1));
    let (env, faults) = start(&["n1"], &[&p, &next]).await;
    faults.push(Fault::RefuseBindingThenReads(1));
    let err = env.bind(&p, "n1").await.unwrap_err();
    assert!(err.contains("create the binding"), "{err}");
    assert_eq!(faults.pending(), 0, "the faults were not hit");
    assert_eq!(assumed_state(&env, "n1", &p).await, "assumed");
    env.fake.delete(Kind::Pod, "ml", "p").unwrap();

    until_offered(&env, &next, "n1").await;
    assert_eq!(
        env.metric("dne_assumed_released_total", "path=\"probe\"")
            .await,
        1.0
    );
    env.svc.shutdown().await.unwrap();
}

/// Path 2, pod still pending: nothing of ours is on it (the annotations travel only inside
/// the binding), and the entry is held while the binding may still land: the pod unchanged
/// since it was sent. Once the pod changes (kube-scheduler records the failure on it) the
/// probe releases the entry (issue 22 §1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pod_after_an_ambiguous_failure_is_released_once_it_changes() {
    let p = pending("p", whole_gpus(1));
    let next = pending("next", whole_gpus(1));
    let (env, faults) = start(&["n1"], &[&p, &next]).await;
    faults.push(Fault::RefuseBindingThenReads(1));
    env.bind(&p, "n1").await.unwrap_err();
    assert_eq!(
        annotation_of(&env.fake, &p),
        None,
        "an annotation landed without the binding"
    );
    assert_eq!(assumed_state(&env, "n1", &p).await, "assumed");
    crate::gpu::record_failed_attempt(&env.fake, "p");
    until_offered(&env, &next, "n1").await;
    assert_eq!(
        annotation_of(&env.fake, &p),
        None,
        "our annotation stayed on an unbound pod"
    );
    assert_eq!(node_of(&env.fake, &p), None);
    env.svc.shutdown().await.unwrap();
}

/// Path 2, with the API server unreadable for longer than the four prompt probes (1, 2, 4,
/// 8 s): probing goes on every 8 s instead of waiting for the 5-minute TTL, and the fifth
/// probe resolves the entry (the pod is unbound: our annotation goes, the GPU is offered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probing_outlasts_an_unreadable_api_server() {
    let p = pending("p", whole_gpus(1));
    let next = pending("next", whole_gpus(1));
    let (env, faults) = start(&["n1"], &[&p, &next]).await;
    // The read-back and the first four probes fail.
    faults.push(Fault::RefuseBindingThenReads(5));
    env.bind(&p, "n1").await.unwrap_err();
    assert_eq!(assumed_state(&env, "n1", &p).await, "assumed");
    until_offered(&env, &next, "n1").await;
    assert_eq!(faults.pending(), 0, "the failing reads were not all used");
    assert_eq!(
        env.metric("dne_assumed_released_total", "path=\"probe\"")
            .await,
        1.0
    );
    assert_eq!(env.metric("dne_assumed_expired_total", "").await, 0.0);
    assert_eq!(annotation_of(&env.fake, &p), None);
    env.svc.shutdown().await.unwrap();
}

/// A watch that lags without failing (no error, no relist: its events are held back by the
/// API server): a bind succeeds, its pod is deleted, and neither event arrives. The entry's
/// binding returned, so after the confirmation grace the probe reads the pod, finds it gone
/// and releases it, long before the TTL; when the events finally arrive they change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_watch_cannot_hold_a_deleted_pods_gpu_until_the_ttl() {
    let lost = pending("lost", whole_gpus(1));
    let next = pending("next", whole_gpus(1));
    let (env, _) = start(&["n1"], &[&lost, &next]).await;
    let relists = env.metric("dne_relists_total", "kind=\"pods\"").await;
    env.fake.hold_watch_events(Kind::Pod);
    env.bind(&lost, "n1").await.unwrap();
    assert_eq!(assumed_state(&env, "n1", &lost).await, "assumed");
    env.fake.delete(Kind::Pod, "ml", "lost").unwrap();

    until_offered(&env, &next, "n1").await;
    assert_eq!(
        env.metric("dne_assumed_released_total", "path=\"probe\"")
            .await,
        1.0
    );
    assert_eq!(
        env.metric("dne_relists_total", "kind=\"pods\"").await,
        relists,
        "released by a relist, not by the probe"
    );
    // The held events are the bind's update (which commits the GPU again for a moment) and
    // the deletion: bind `next` only once both are applied. A sentinel pod created after them
    // arrives after them on the same watch; once the cache holds it, they are applied.
    let cached = env.metric("dne_cached_objects", "kind=\"pods\"").await;
    env.fake.release_watch_events(Kind::Pod);
    let sentinel = crate::support::service::pod(
        "ml",
        "sentinel",
        "uid-sentinel",
        json!({}),
        Some("elsewhere"),
        None,
    );
    env.fake.create(Kind::Pod, sentinel).unwrap();
    let deadline = tokio::time::Instant::now() + GUARD;
    while env.metric("dne_cached_objects", "kind=\"pods\"").await != cached + 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held events were never applied"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.bind(&next, "n1").await.unwrap();
    env.wait_committed("n1", &uid(&next)).await;
    let ledger = env.ledger("n1").await;
    assert!(ledger["entries"][uid(&lost)].is_null(), "{ledger}");
    env.svc.shutdown().await.unwrap();
}

/// Path 3: after an ambiguous failure on n1, kube-scheduler retries the pod on n2. While the
/// pod is unchanged since the n1 binding was sent, that binding may still land: the retry is
/// refused (never two holds, never a GPU handed out from under a late binding). Once the pod
/// changes, the retry resolves the held n1 entry first: it neither fails nor holds twice,
/// and n1's GPU is offered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_bind_to_another_node_after_an_ambiguous_failure_resolves_the_first() {
    let p = pending("p", whole_gpus(1));
    let other = pending("other", whole_gpus(1));
    let (env, faults) = start(&["n1", "n2"], &[&p, &other]).await;
    faults.push(Fault::RefuseBindingThenReads(1));
    env.bind(&p, "n1").await.unwrap_err();
    let err = env.bind(&p, "n2").await.unwrap_err();
    assert!(err.contains("may still land"), "{err}");
    crate::gpu::record_failed_attempt(&env.fake, "p");
    env.bind(&p, "n2").await.unwrap();
    assert_eq!(node_of(&env.fake, &p).as_deref(), Some("n2"));
    env.wait_committed("n2", &uid(&p)).await;
    until_offered(&env, &other, "n1").await;
    let n1 = env.ledger("n1").await;
    assert!(n1["entries"][uid(&p)].is_null(), "{n1}");
    // Released once, by the retry or (if it came first) by the probe.
    let released = env
        .metric("dne_assumed_released_total", "path=\"retry\"")
        .await
        + env
            .metric("dne_assumed_released_total", "path=\"probe\"")
            .await;
    assert_eq!(released, 1.0);
    env.bind(&other, "n1").await.unwrap();
    env.svc.shutdown().await.unwrap();
}

/// An ambiguous entry is not released by a relist: the pod's absence from the list proves
/// nothing, because a binding that outlived its timeout can still land. Here it does land
/// after the relist; the GPU must have stayed held throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_never_releases_an_ambiguous_entry_whose_binding_lands_late() {
    let p = pending("p", whole_gpus(1));
    let q = pending("q", whole_gpus(1));
    // A minute of request timeout: the API server's deadline for the binding, within which
    // it may land (longer than the hang guard, so no stall can outrun it).
    let (env, _faults) = start_flags(&["n1"], &[&p, &q], &["--request-timeout", "60s"]).await;
    // The binding's answer is lost while the write stays in flight. The read-back and every
    // probe see the pod unbound at the binding's resourceVersion: it may still land, so it is
    // held; only a relist could (wrongly) release it.
    env.fake
        .push_write_fault(WriteOp::PodBinding, WriteFault::LandsLate(11));
    env.bind(&p, "n1").await.unwrap_err();
    assert_eq!(assumed_state(&env, "n1", &p).await, "assumed");
    // The operator sees it in the age gauge.
    let deadline = tokio::time::Instant::now() + GUARD;
    while env.metric("dne_assumed_entries", "age=\"lt_").await != 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gauge never showed the entry"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Force a relist of pods: streams dropped while re-watching fails once, the RV moved on
    // (nothing of the bind was written), history compacted past it → 410 → list.
    let relists = env.metric("dne_relists_total", "kind=\"pods\"").await;
    env.fake.fail_watch_start(Kind::Pod, 500, 1);
    env.fake.close_watches();
    env.fake
        .create(Kind::Node, crate::support::service::node("n9"))
        .unwrap();
    env.fake.compact();
    let deadline = tokio::time::Instant::now() + GUARD;
    while env.metric("dne_relists_total", "kind=\"pods\"").await <= relists {
        assert!(tokio::time::Instant::now() < deadline, "no relist happened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        env.fake.wait_for_watches(Kind::Pod, 1, GUARD).await,
        "the pod watch never reopened after the relist"
    );
    assert_eq!(
        assumed_state(&env, "n1", &p).await,
        "assumed",
        "released by a relist"
    );
    assert!(
        env.bind(&q, "n1")
            .await
            .unwrap_err()
            .contains("cannot place")
    );

    // The late binding lands: the pod runs on n1 with our minors, counted.
    env.fake.land_late_write(11);
    let deadline = tokio::time::Instant::now() + GUARD;
    while env.fake.late_write_outcome(11).is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the late binding never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(env.fake.late_write_outcome(11), Some(201));
    assert!(
        annotation_of(&env.fake, &p).is_some(),
        "the binding carries our annotation"
    );
    env.wait_committed("n1", &uid(&p)).await;
    assert!(
        env.bind(&q, "n1")
            .await
            .unwrap_err()
            .contains("cannot place")
    );
    assert_eq!(env.metric("dne_assumed_released_total", "").await, 0.0);
    let deadline = tokio::time::Instant::now() + GUARD;
    while env.metric("dne_assumed_entries", "").await != 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gauge still counts a committed entry"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.svc.shutdown().await.unwrap();
}

/// Path 3, the other way round: the ambiguous binding to n1 did land (its answer and the
/// read-back were lost). The retry to n2 sees the pod bound on n1: it keeps n1's entry (the
/// pod holds that GPU), refuses, and holds nothing on n2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_bind_after_an_ambiguous_failure_that_landed_keeps_the_first() {
    let p = pending("p", whole_gpus(1));
    let other = pending("other", whole_gpus(1));
    let (env, faults) = start(&["n1", "n2"], &[&p, &other]).await;
    faults.push(Fault::LoseBindingAnswerAndNextRead);
    env.bind(&p, "n1").await.unwrap_err();
    let err = env.bind(&p, "n2").await.unwrap_err();
    assert!(err.contains("already bound to node n1"), "{err}");
    env.wait_committed("n1", &uid(&p)).await;
    let n2 = env.ledger("n2").await;
    assert!(n2["entries"][uid(&p)].is_null(), "{n2}");
    assert!(
        env.bind(&other, "n1")
            .await
            .unwrap_err()
            .contains("cannot place")
    );
    assert_eq!(env.metric("dne_assumed_released_total", "").await, 0.0);
    env.svc.shutdown().await.unwrap();
}

/// Forces a pod relist: a write the pod watch does not see (a pending pod) moves the
/// resourceVersion past the watch's, the history is compacted and the streams dropped, so the
/// resumed watch gets 410 and relists.
fn force_pod_relist(fake: &FakeApiServer) {
    let filler = format!("filler-{}", fake.current_rv());
    fake.create(Kind::Pod, pending(&filler, serde_json::json!({"cpu": "1"})))
        .unwrap();
    fake.compact();
    fake.close_watches();
}

/// A bind that finishes after a relist's `Init` while its list was already read (the pod is
/// not in it, unbound at the snapshot) must not be released at that `InitDone`: the list
/// proves nothing about a binding that landed after it was taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_finishing_after_the_relist_began_is_not_released_by_it() {
    let p = pending("p", whole_gpus(1));
    let q = pending("q", whole_gpus(1));
    let (env, faults) = start(&["n1"], &[&p, &q]).await;
    // The bind decides before the relist (a bind deciding during it is fenced) and its
    // patch is held until the relist's list snapshot is taken.
    let first = HeldBind::start(&env, &faults, &p, "n1").await;
    let listed = std::sync::Arc::new(tokio::sync::Notify::new());
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    faults.push(Fault::HoldPodList {
        listed: listed.clone(),
        release: release.clone(),
    });
    force_pod_relist(&env.fake);
    tokio::time::timeout(GUARD, listed.notified())
        .await
        .expect("the relist's list was never requested");
    // The list snapshot (p pending, so not in it) is taken; the answer is held while the
    // bind finishes.
    first.finish().await.unwrap();
    release.notify_one();
    env.wait_committed("n1", &uid(&p)).await;
    assert_eq!(env.metric("dne_assumed_released_total", "").await, 0.0);
    assert!(
        env.bind(&q, "n1")
            .await
            .unwrap_err()
            .contains("cannot place")
    );
    env.svc.shutdown().await.unwrap();
}

/// A bind still writing (slow patch) when a relist completes is not released by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_in_flight_during_a_relist_is_not_released_by_it() {
    let p = pending("p", whole_gpus(1));
    let q = pending("q", whole_gpus(1));
    let (env, faults) = start(&["n1"], &[&p, &q]).await;
    let first = HeldBind::start(&env, &faults, &p, "n1").await;
    let deadline = tokio::time::Instant::now() + GUARD;
    let relists = env.metric("dne_relists_total", "kind=\"pods\"").await;
    force_pod_relist(&env.fake);
    while env.metric("dne_relists_total", "kind=\"pods\"").await <= relists {
        assert!(tokio::time::Instant::now() < deadline, "no relist happened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        env.fake.wait_for_watches(Kind::Pod, 1, GUARD).await,
        "the pod watch never reopened after the relist"
    );
    assert_eq!(
        assumed_state(&env, "n1", &p).await,
        "assumed",
        "released in flight"
    );
    first.finish().await.unwrap();
    env.wait_committed("n1", &uid(&p)).await;
    assert_eq!(env.metric("dne_assumed_released_total", "").await, 0.0);
    env.svc.shutdown().await.unwrap();
}
