//! Regression tests for the over-allocation defects of issue 9 §1, one per defect, each
//! against the fake API server and the real kube client.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::support::service;

async fn start(nodes: &[&str], pods: &[&Value]) -> (Env, Faults) {
    let fake = FakeApiServer::new();
    for n in nodes {
        add_gpu_node(&fake, n, 1, &[]);
    }
    for p in pods {
        fake.create(Kind::Pod, (*p).clone()).unwrap();
    }
    let (client, faults) = faulty_client(&fake);
    (Env::start_with(&fake, client, &[]).await, faults)
}

/// A one-GPU annotation for minor 0 as another scheduler would write it.
const THEIRS: &str = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"80Gi","koordinator.sh/gpu-memory-ratio":"100"}}]}"#;

/// §1.1: between our read and our commit another scheduler binds the pod to n2 with its own
/// allocation. The old UID-only patch overwrote their annotation with n1's minors and, after
/// the binding's 409, cleared it: n2's ledger then forgot a GPU the pod really holds. Now the
/// annotations travel only inside our binding, under the resourceVersion of our read: it is
/// refused, the fresh read shows the pod bound, and the bind stops without touching the pod.
#[tokio::test]
async fn stale_read_never_overwrites_or_clears_a_pod_bound_elsewhere() {
    let p = pending("p", whole_gpus(1));
    let (env, faults) = start(&["n1", "n2"], &[&p]).await;
    faults.push(Fault::AnnotateAndBindElsewhereBeforeCommit {
        node: "n2".into(),
        annotation: THEIRS.into(),
    });
    let err = env.bind(&p, "n1").await.unwrap_err();
    assert_eq!(faults.pending(), 0, "the fault was not hit");
    assert_eq!(node_of(&env.fake, &p).as_deref(), Some("n2"));
    assert_eq!(
        annotation_of(&env.fake, &p).as_deref(),
        Some(THEIRS),
        "their annotation was overwritten or cleared"
    );
    assert!(err.contains("already bound to node n2"), "{err}");
    env.wait_committed("n2", &uid(&p)).await;
    let n2 = env.ledger("n2").await;
    assert_eq!(
        gpu_shares(n2["entries"][uid(&p)]["allocation"].as_str().unwrap()),
        vec![(0, 100)]
    );
    let n1 = env.ledger("n1").await;
    assert!(n1["entries"][uid(&p)].is_null(), "{n1}");
    assert_eq!(env.metric("dne_bind_patch_conflicts_total", "").await, 1.0);
    assert_eq!(
        env.metric("dne_bind_found_bound_elsewhere_total", "stage=\"binding\"")
            .await,
        1.0
    );
    env.svc.shutdown().await.unwrap();
}

/// §1.1: a conflict that is only a stale resourceVersion (someone else touched the pod) is
/// retried after a fresh read, without re-deciding the allocation.
#[tokio::test]
async fn patch_conflict_is_retried_with_a_fresh_read() {
    let p = pending("p", whole_gpus(1));
    let (env, faults) = start(&["n1"], &[&p]).await;
    faults.push(Fault::TouchBeforeCommit);
    env.bind(&p, "n1").await.unwrap();
    assert_eq!(faults.pending(), 0, "the fault was not hit");
    env.wait_committed("n1", &uid(&p)).await;
    let a = annotation_of(&env.fake, &p).expect("annotated");
    assert_eq!(gpu_shares(&a), vec![(0, 100)]);
    let pod = env.fake.get(Kind::Pod, "ml", "p").unwrap();
    assert!(
        pod["metadata"]["annotations"]["example.com/touched"].is_string(),
        "the unrelated write was lost: {pod}"
    );
    assert_eq!(env.metric("dne_bind_patch_conflicts_total", "").await, 1.0);
    env.svc.shutdown().await.unwrap();
}

/// §1.1 (issue 22 §1b): another scheduler binds the pod to n2 just before our binding: ours
/// gets 409. Our annotations travel only inside our binding, so the pod on n2 carries nothing
/// decided for n1 (with the old patch-then-bind it carried n1's minors on n2); n1 holds
/// nothing, and the answer says where the pod went.
#[tokio::test]
async fn pod_bound_elsewhere_before_our_binding_carries_nothing_of_ours() {
    let p = pending("p", whole_gpus(1));
    let (env, faults) = start(&["n1", "n2"], &[&p]).await;
    faults.push(Fault::BindElsewhereBeforeCommit("n2".into()));
    let err = env.bind(&p, "n1").await.unwrap_err();
    assert!(err.contains("already bound to node n2"), "{err}");
    assert_eq!(node_of(&env.fake, &p).as_deref(), Some("n2"));
    assert_eq!(
        annotation_of(&env.fake, &p),
        None,
        "an allocation decided for n1 is on a pod bound to n2"
    );
    let n1 = env.ledger("n1").await;
    assert!(n1["entries"][uid(&p)].is_null(), "{n1}");
    assert_eq!(
        env.metric("dne_bind_found_bound_elsewhere_total", "stage=\"binding\"")
            .await,
        1.0
    );
    env.svc.shutdown().await.unwrap();
}

/// §1.2: with slow API calls, the expiry must not drop the entry of a bind still in flight
/// (the old code read the pod, saw it unbound and expired it: a concurrent bind then got the
/// same GPU).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_never_drops_an_entry_whose_bind_is_in_flight() {
    let p = pending("p", whole_gpus(1));
    let q = pending("q", whole_gpus(1));
    let (env, faults) = start(&["n1"], &[&p, &q]).await;
    let first = HeldBind::start(&env, &faults, &p, "n1").await;
    // Every assumed entry is "too old" for a zero TTL.
    let expired = env
        .svc
        .state
        .scheduler
        .binder
        .expire_assumed(Duration::ZERO)
        .await;
    assert_eq!(expired, 0, "an in-flight bind's entry was expired");
    let err = env.bind(&q, "n1").await.unwrap_err();
    assert!(
        err.contains("cannot place"),
        "the GPU was handed out twice: {err}"
    );
    first.finish().await.unwrap();
    env.wait_committed("n1", &uid(&p)).await;
    env.svc.shutdown().await.unwrap();
}

/// §1.4: a pod whose manifest carries a `device-allocated` annotation (copied from a running
/// pod) and that needs no devices here is bound with the annotation removed in the same
/// patch; otherwise n1 would be charged someone else's minors.
#[tokio::test]
async fn bind_that_allocates_nothing_removes_a_stale_annotation() {
    let p = service::pod("ml", "p", "uid-p", json!({"cpu": "1"}), None, Some(THEIRS));
    let q = pending("q", whole_gpus(1));
    let (env, _) = start(&["n1"], &[&p, &q]).await;
    env.bind(&p, "n1").await.unwrap();
    assert_eq!(annotation_of(&env.fake, &p), None, "stale annotation kept");
    let cluster = env.svc.state.scheduler.cluster.clone();
    service::eventually(WAIT, "the pod to be seen on n1", || {
        cluster.debug_dump()["n1"]["pods"].get("uid-p").is_some()
    })
    .await;
    let n1 = env.ledger("n1").await;
    assert!(n1["entries"]["uid-p"].is_null(), "{n1}");
    // The GPU is still free.
    env.bind(&q, "n1").await.unwrap();
    env.svc.shutdown().await.unwrap();
}

/// §1.5: a pod already bound to this node without our annotation, while it needs a GPU we
/// would have allocated, is someone else's bind: not a success.
#[tokio::test]
async fn already_bound_without_our_annotation_is_not_a_success() {
    let p = service::pod("ml", "p", "uid-p", whole_gpus(1), Some("n1"), None);
    let (env, _) = start(&["n1"], &[&p]).await;
    let err = env.bind(&p, "n1").await.unwrap_err();
    assert!(err.contains("without a device allocation"), "{err}");
    assert_eq!(
        env.metric("dne_binds_total", "outcome=\"already_bound\"")
            .await,
        0.0
    );
    env.svc.shutdown().await.unwrap();
}

/// §1.5: a bind naming a node nothing else knows must not leave a node entry behind that no
/// event will ever collect. Since issue 36 §6 such a bind of a device pod is refused before any
/// write (resolvably: the Node may not have reached the cache yet), since nothing says the node
/// has the device.
#[tokio::test]
async fn failed_bind_to_an_unknown_node_leaves_no_node_entry() {
    let p = pending("p", whole_gpus(1));
    let (env, faults) = start(&["n1"], &[&p]).await;
    faults.push(Fault::RefuseBinding);
    let err = env.bind(&p, "ghost").await.unwrap_err();
    assert!(
        err.contains("node not in the extender's cache yet"),
        "{err}"
    );
    assert_eq!(faults.pending(), 1, "a write was attempted");
    assert_eq!(node_of(&env.fake, &p), None);
    assert_eq!(
        env.ledger("ghost").await,
        Value::Null,
        "an entry was left for ghost"
    );
    assert!(
        !env.svc
            .state
            .scheduler
            .cluster
            .node_names()
            .iter()
            .any(|n| &**n == "ghost")
    );
    env.svc.shutdown().await.unwrap();
}

/// §1.1: a pod that keeps changing under us is not bound blind: after three conflicts the
/// bind gives up and rolls back (kube-scheduler retries it).
#[tokio::test]
async fn persistent_patch_conflicts_give_up_and_roll_back() {
    let p = pending("p", whole_gpus(1));
    let (env, faults) = start(&["n1"], &[&p]).await;
    for _ in 0..4 {
        faults.push(Fault::TouchBeforeCommit);
    }
    let err = env.bind(&p, "n1").await.unwrap_err();
    assert!(err.contains("create the binding"), "{err}");
    assert!(err.contains("Precondition failed"), "{err}");
    assert_eq!(faults.pending(), 0, "every conflict was retried");
    assert_eq!(env.metric("dne_bind_patch_conflicts_total", "").await, 3.0);
    assert_eq!(annotation_of(&env.fake, &p), None);
    assert_eq!(node_of(&env.fake, &p), None);
    let n1 = env.ledger("n1").await;
    assert!(n1["entries"][uid(&p)].is_null(), "{n1}");
    env.bind(&p, "n1").await.unwrap();
    env.svc.shutdown().await.unwrap();
}

/// §1.5: preempt on a node without a Device object whose pods hold device allocations: with
/// those pods as victims the node holds nothing any more and is passable (left to the device
/// plugins, as filter treats such a node); with another pod as victim it stays blocked.
#[tokio::test]
async fn preempt_on_a_deviceless_node_accounts_for_the_victims() {
    let fake = FakeApiServer::new();
    // Its device plugin advertises the GPU (issue 36 §6: else no GPU pod passes at all).
    let mut bare = service::node("bare");
    bare["status"]["allocatable"]["nvidia.com/gpu"] = json!("1");
    fake.create(Kind::Node, bare).unwrap();
    add_gpu_node(&fake, "n1", 1, &[]);
    let holder = service::pod(
        "ml",
        "holder",
        "uid-holder",
        whole_gpus(1),
        Some("bare"),
        Some(THEIRS),
    );
    let bystander = service::pod(
        "ml",
        "cpu",
        "uid-cpu",
        json!({"cpu": "1"}),
        Some("bare"),
        None,
    );
    let preemptor = pending("hi", whole_gpus(1));
    fake.create_many(Kind::Pod, [holder, bystander, preemptor.clone()])
        .unwrap();
    let env = Env::start(&fake, &[]).await;
    env.wait_committed("bare", "uid-holder").await;
    let f = env.filter(&preemptor, &["bare"]).await;
    assert_eq!(f["FailedNodes"]["bare"], "device object missing", "{f}");
    let meta = |uids: &[&str]| {
        let pods: Vec<Value> = uids.iter().map(|u| json!({"UID": u})).collect();
        json!({"Pods": pods, "NumPDBViolations": 0})
    };
    for (victims, kept) in [(vec!["uid-holder"], true), (vec!["uid-cpu"], false)] {
        let args = json!({"Pod": preemptor, "NodeNameToMetaVictims": {"bare": meta(&victims)}});
        let (status, out) = env.http.post("/preempt", &args).await;
        assert_eq!(status, 200, "{out}");
        let want = if kept {
            json!({"bare": meta(&victims)})
        } else {
            json!({})
        };
        assert_eq!(out["NodeNameToMetaVictims"], want, "victims {victims:?}");
    }
    env.svc.shutdown().await.unwrap();
}
