//! Assumed entries that the pod watch never confirms expire after `--assume-ttl`.
//!
//! Scenario (faithful to a real outage): a bind decides, then the service's pod watch goes
//! down (streams closed, new watches refused) before the bind completes. It succeeds, so its
//! entry is *assumed*. The pod is then deleted and
//! the API server compacts its history before the watch comes back, so the service never
//! sees the pod bound nor its DELETED. While the watch stays down no relist can release it
//! (`tests/it/leak.rs` covers the relist path): only expiry can free the GPU, and it does
//! once the API server confirms the pod is gone.

use std::time::Duration;

use super::*;
use crate::support::service;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconfirmed_assumed_entry_expires_and_is_counted() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 1, &[]);
    let lost = pending("lost", whole_gpus(1));
    let next = pending("next", whole_gpus(1));
    fake.create_many(Kind::Pod, [lost.clone(), next.clone()])
        .unwrap();
    let (client, faults) = faulty_client(&fake);
    let env = Env::start_with(&fake, client, &["--assume-ttl", "300ms"]).await;

    // The bind decides, then the pod watch goes down (and stays down) before it completes.
    bind_across_pod_watch_outage(&env, &faults, &lost, "n1")
        .await
        .unwrap();
    let u = uid(&lost);
    let view = env.ledger("n1").await;
    assert_eq!(view["entries"][&u]["state"], "assumed", "{view}");
    // While it is held, the only GPU is taken (filter reads the ledger bind decides on;
    // binds themselves are fenced while the pod watch is down).
    assert_eq!(env.filter(&next, &["n1"]).await["NodeNames"], json!([]));

    // Deleted while the watch is still down: no relist can happen (watch starts and lists
    // fail), so only the expiry can free the GPU.
    fake.delete(Kind::Pod, "ml", "lost").unwrap();
    let cluster = env.svc.state.scheduler.cluster.clone();
    let u2 = u.clone();
    service::eventually(WAIT, "the assumed entry to expire", move || {
        cluster.debug_dump()["n1"]["devices"]["entries"]
            .get(&u2)
            .is_none()
    })
    .await;
    assert_eq!(env.metric("dne_assumed_expired_total", "").await, 1.0);
    assert_eq!(
        env.metric("dne_assumed_released_total", "path=\"ttl\"")
            .await,
        1.0
    );
    fake.compact();
    pod_watch_up(&fake);
    assert!(
        fake.wait_for_watches(Kind::Pod, 1, Duration::from_secs(20))
            .await,
        "the pod watch never came back"
    );

    // The GPU is free again; a confirmed bind is committed and never expires.
    env.bind(&next, "n1").await.unwrap();
    env.wait_committed("n1", &uid(&next)).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    let view = env.ledger("n1").await;
    assert_eq!(view["entries"][uid(&next)]["state"], "committed", "{view}");
    assert_eq!(env.metric("dne_assumed_expired_total", "").await, 1.0);
    env.svc.shutdown().await.unwrap();
}

/// Age alone must not expire an entry: during a pod-watch outage longer than `--assume-ttl`
/// a bound, running pod is never confirmed either, and dropping its entry would hand its GPU
/// out again. Once the watch is back, the entry is committed, never expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_during_a_watch_outage_must_not_free_a_gpu_in_use() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 1, &[]);
    let running = pending("running", whole_gpus(1));
    let next = pending("next", whole_gpus(1));
    fake.create_many(Kind::Pod, [running.clone(), next.clone()])
        .unwrap();
    let (client, faults) = faulty_client(&fake);
    let env = Env::start_with(&fake, client, &["--assume-ttl", "300ms"]).await;
    bind_across_pod_watch_outage(&env, &faults, &running, "n1")
        .await
        .unwrap();
    // Past the TTL: the periodic expiry has had its chances, and one more pass that finds
    // every entry too old runs now, deterministically. Neither may free the GPU: the API
    // server says the pod is bound here.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let expired = env
        .svc
        .state
        .scheduler
        .binder
        .expire_assumed(Duration::ZERO)
        .await;
    assert_eq!(expired, 0, "a bound pod's entry was expired");
    // Filter reads the same ledger as bind (binds themselves are fenced during the outage).
    let offered = env.filter(&next, &["n1"]).await;
    assert_eq!(
        offered["NodeNames"],
        json!([]),
        "the only GPU looked free again: running={:?}",
        annotation_of(&fake, &running)
    );
    assert_eq!(env.metric("dne_assumed_expired_total", "").await, 0.0);
    let view = env.ledger("n1").await;
    assert_eq!(view["entries"][uid(&running)]["state"], "assumed", "{view}");
    pod_watch_up(&fake);
    env.wait_committed("n1", &uid(&running)).await;
    assert_eq!(env.metric("dne_assumed_expired_total", "").await, 0.0);
    env.svc.shutdown().await.unwrap();
}
