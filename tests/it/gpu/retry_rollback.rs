//! Bind failures roll back (ledger and annotation), retries of a finished bind are answered
//! without a second allocation, and a recreated pod is never bound on its old identity.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::support::service;

async fn setup(pods: &[&Value], faulty: bool) -> (Env, Option<Faults>) {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 2, &[]);
    add_gpu_node(&fake, "n2", 2, &[]);
    for p in pods {
        fake.create(Kind::Pod, (*p).clone()).unwrap();
    }
    if faulty {
        let (client, faults) = faulty_client(&fake);
        (Env::start_with(&fake, client, &[]).await, Some(faults))
    } else {
        (Env::start(&fake, &[]).await, None)
    }
}

/// No entry for `uid` anywhere, and no annotation or node on the pod.
async fn assert_rolled_back(env: &Env, pod: &Value) {
    for node in ["n1", "n2"] {
        let view = env.ledger(node).await;
        assert!(
            view["entries"][uid(pod)].is_null(),
            "{node} still holds {}: {view}",
            uid(pod)
        );
        check_capacity(&view).unwrap();
    }
    assert_eq!(
        annotation_of(&env.fake, pod),
        None,
        "the annotation was not cleared"
    );
}

/// A binding refused with a 4xx was not applied and cannot land later: rolled back at once,
/// and a later bind succeeds.
#[tokio::test]
async fn binding_refused_with_a_4xx_rolls_back_and_a_later_bind_succeeds() {
    let p = pending("p", whole_gpus(2));
    let (env, _) = setup(&[&p], false).await;
    env.fake.fail_writes(Kind::Pod, 422, 1);
    let err = env.bind(&p, "n1").await.unwrap_err();
    assert!(err.contains("create the binding"), "{err}");
    assert_rolled_back(&env, &p).await;
    assert_eq!(node_of(&env.fake, &p), None);
    // Both GPUs are free again: the filter passes, the retry binds them.
    let f = env.filter(&p, &["n1"]).await;
    assert_eq!(f["NodeNames"], json!(["n1"]), "{f}");
    env.bind(&p, "n1").await.unwrap();
    env.wait_committed("n1", &uid(&p)).await;
    let a = annotation_of(&env.fake, &p).unwrap();
    assert_eq!(gpu_shares(&a), vec![(0, 100), (1, 100)]);
    env.svc.shutdown().await.unwrap();
}

/// Issue 22 §1: a binding answered 500 may have been applied or may still be: its GPU stays
/// held, and a retry is refused, while the pod is unchanged (the binding's resourceVersion
/// precondition could still match). Once the pod changes (kube-scheduler records the failed
/// attempt on it), the late binding can never land: the hold is released and the retry binds.
#[tokio::test]
async fn binding_answered_5xx_is_held_until_the_pod_changes_then_the_retry_binds() {
    let p = pending("p", whole_gpus(2));
    let (env, faults) = setup(&[&p], true).await;
    let faults = faults.unwrap();
    faults.push(Fault::RefuseBinding);
    let err = env.bind(&p, "n1").await.unwrap_err();
    assert!(err.contains("create the binding"), "{err}");
    assert_eq!(faults.pending(), 0, "the fault was not hit");
    assert_eq!(node_of(&env.fake, &p), None);
    assert_eq!(
        annotation_of(&env.fake, &p),
        None,
        "nothing lands without the binding"
    );
    let f = env.filter(&p, &["n1"]).await;
    assert_eq!(
        f["NodeNames"],
        json!([]),
        "the held GPUs were offered again: {f}"
    );
    let err = env.bind(&p, "n2").await.unwrap_err();
    assert!(err.contains("may still land"), "{err}");
    // kube-scheduler's record of the failure (any write) moves the pod's resourceVersion.
    crate::gpu::record_failed_attempt(&env.fake, "p");
    env.bind(&p, "n1").await.unwrap();
    env.wait_committed("n1", &uid(&p)).await;
    assert!(annotation_of(&env.fake, &p).is_some());
    env.svc.shutdown().await.unwrap();
}

/// The binding commits but its answer is lost (504). The pod now runs on n1 with our minors:
/// they must stay counted and annotated, or the next pod gets the same GPU (reference §4.23:
/// "bind returned an error but actually succeeded").
#[tokio::test]
async fn binding_that_committed_despite_an_error_keeps_its_allocation() {
    let p = pending("p", whole_gpus(1));
    let q = pending("q", whole_gpus(1));
    let r = pending("r", whole_gpus(1));
    let (env, faults) = setup(&[&p, &q, &r], true).await;
    let faults = faults.unwrap();
    faults.push(Fault::LoseBindingAnswer);
    // Read back, the pod is bound here with our annotation: that is a successful bind.
    env.bind(&p, "n1").await.unwrap();
    assert_eq!(faults.pending(), 0, "the fault was not hit");
    assert_eq!(node_of(&env.fake, &p).as_deref(), Some("n1"));
    let a = annotation_of(&env.fake, &p).expect("a bound pod keeps its device annotation");
    let held = gpu_shares(&a);
    env.wait_committed("n1", &uid(&p)).await;
    // Let any late cleanup land before judging.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(annotation_of(&env.fake, &p), Some(a.clone()));
    let view = env.ledger("n1").await;
    assert_eq!(view["entries"][uid(&p)]["state"], "committed", "{view}");
    // The other GPU goes to q, and then n1 is full.
    env.bind(&q, "n1").await.unwrap();
    let qa = gpu_shares(&annotation_of(&env.fake, &q).unwrap());
    assert_ne!(qa[0].0, held[0].0, "q got p's GPU");
    assert!(
        env.bind(&r, "n1")
            .await
            .unwrap_err()
            .contains("cannot place")
    );
    assert_eq!(
        env.metric("dne_binds_total", "outcome=\"bound_despite_error\"")
            .await,
        1.0
    );
    env.svc.shutdown().await.unwrap();
}

/// As above, but the pod cannot even be read back: the bind answers Error, yet the allocation
/// stays assumed and annotated (it may be running there), until the watch confirms it.
#[tokio::test]
async fn binding_with_unknown_outcome_keeps_the_allocation_assumed() {
    let p = pending("p", whole_gpus(2));
    let q = pending("q", whole_gpus(1));
    let (env, faults) = setup(&[&p, &q], true).await;
    let faults = faults.unwrap();
    faults.push(Fault::LoseBindingAnswerAndNextRead);
    let err = env.bind(&p, "n1").await.unwrap_err();
    assert!(err.contains("create the binding"), "{err}");
    assert_eq!(faults.pending(), 0, "the faults were not hit");
    assert_eq!(node_of(&env.fake, &p).as_deref(), Some("n1"));
    assert!(
        annotation_of(&env.fake, &p).is_some(),
        "annotation cleared on a bound pod"
    );
    env.wait_committed("n1", &uid(&p)).await;
    assert!(
        env.bind(&q, "n1")
            .await
            .unwrap_err()
            .contains("cannot place")
    );
    env.svc.shutdown().await.unwrap();
}

#[tokio::test]
async fn retried_bind_of_a_bound_pod_succeeds_once_and_never_moves_it() {
    let p = pending("p", ratio(50));
    let (env, _) = setup(&[&p], false).await;
    env.bind(&p, "n1").await.unwrap();
    env.wait_committed("n1", &uid(&p)).await;
    let before_view = without_timings(env.ledger("n1").await);
    let before = annotation_of(&env.fake, &p);

    // kube-scheduler retries after a timeout: same node → success, nothing allocated twice.
    env.bind(&p, "n1").await.unwrap();
    assert_eq!(without_timings(env.ledger("n1").await), before_view);
    assert_eq!(annotation_of(&env.fake, &p), before);
    assert_eq!(
        env.metric("dne_binds_total", "outcome=\"already_bound\"")
            .await,
        1.0
    );

    // Another node → error, no entry there.
    let err = env.bind(&p, "n2").await.unwrap_err();
    assert!(err.contains("already bound to node n1"), "{err}");
    let n2 = env.ledger("n2").await;
    assert!(n2["entries"].as_object().unwrap().is_empty(), "{n2}");

    // The pod is recreated under the same name (new uid): the old identity must not bind.
    env.fake.delete(Kind::Pod, "ml", "p").unwrap();
    let recreated = service::pod("ml", "p", "uid-p-2", ratio(50), None, None);
    env.fake.create(Kind::Pod, recreated.clone()).unwrap();
    let cluster = env.svc.state.scheduler.cluster.clone();
    service::eventually(WAIT, "the deleted pod's entry to go", || {
        cluster.debug_dump()["n1"]["devices"]["entries"]
            .as_object()
            .is_some_and(|e| e.is_empty())
    })
    .await;
    let err = env.bind(&p, "n2").await.unwrap_err();
    assert!(err.contains("recreated"), "{err}");
    assert_eq!(node_of(&env.fake, &recreated), None);
    assert_eq!(annotation_of(&env.fake, &recreated), None);
    for node in ["n1", "n2"] {
        let v = env.ledger(node).await;
        assert!(v["entries"].as_object().unwrap().is_empty(), "{node}: {v}");
    }
    // The new identity binds normally.
    env.bind(&recreated, "n2").await.unwrap();
    env.wait_committed("n2", "uid-p-2").await;
    env.svc.shutdown().await.unwrap();
}

/// A duplicate bind arriving while the first is still talking to the API server is refused
/// (it must not replace, then roll back, the first attempt's entry); the first one wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_bind_in_flight_is_refused_without_disturbing_the_first() {
    let p = pending("p", whole_gpus(1));
    let (env, faults) = setup(&[&p], true).await;
    // The first bind's commit is held until the duplicate has been answered: an ordering,
    // not a delay the duplicate must beat.
    let release = Arc::new(tokio::sync::Notify::new());
    faults.unwrap().push(Fault::HoldCommit(release.clone()));
    let first = {
        let http = env.http.clone();
        let p = p.clone();
        tokio::spawn(async move { bind(&http, &p, "n1").await })
    };
    let cluster = env.svc.state.scheduler.cluster.clone();
    let u = uid(&p);
    service::eventually(WAIT, "the first bind to assume", || {
        cluster
            .debug_dump()
            .get("n1")
            .map(|n| n["devices"]["entries"][&u]["state"].clone())
            == Some(json!("assumed"))
    })
    .await;
    let err = env.bind(&p, "n1").await.unwrap_err();
    assert!(err.contains("in progress"), "{err}");
    release.notify_one();
    tokio::time::timeout(WAIT, first)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    env.wait_committed("n1", &u).await;
    let view = env.ledger("n1").await;
    assert_eq!(view["entries"].as_object().unwrap().len(), 1, "{view}");
    env.svc.shutdown().await.unwrap();
}
