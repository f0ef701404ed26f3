//! Assumed entries that the pod watch never confirms expire after `--assume-ttl`.
//!
//! Scenario (faithful to a real outage): the service's pod watch is down (streams closed, new
//! watches refused). A bind succeeds, so its entry is *assumed*. The pod is then deleted and
//! the API server compacts its history before the watch comes back, so the service never
//! sees the pod bound nor its DELETED: the resumed watch gets 410 and relists, and the relist
//! has nothing to say about a pod it never recorded. Only expiry can free the GPU, and it does
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
    let env = Env::start(&fake, &["--assume-ttl", "300ms"]).await;

    // Take the pod watch down and keep it down.
    fake.fail_watch_start(Kind::Pod, 500, 1_000_000);
    fake.close_watches();
    let f = fake.clone();
    service::eventually(WAIT, "the pod watch to close", move || {
        f.open_watches(Kind::Pod) == 0
    })
    .await;

    env.bind(&lost, "n1").await.unwrap();
    let u = uid(&lost);
    let view = env.ledger("n1").await;
    assert_eq!(view["entries"][&u]["state"], "assumed", "{view}");
    // While it is held, the only GPU is taken.
    assert!(
        env.bind(&next, "n1")
            .await
            .unwrap_err()
            .contains("cannot place")
    );

    fake.delete(Kind::Pod, "ml", "lost").unwrap();
    fake.compact();
    fake.fail_watch_start(Kind::Pod, 500, 0);

    let cluster = env.svc.state.cluster.clone();
    let u2 = u.clone();
    service::eventually(WAIT, "the assumed entry to expire", move || {
        cluster.snapshot()["n1"]["devices"]["entries"]
            .get(&u2)
            .is_none()
    })
    .await;
    assert_eq!(env.metric("dne_assumed_expired_total", "").await, 1.0);
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
    let env = Env::start(&fake, &["--assume-ttl", "300ms"]).await;
    fake.fail_watch_start(Kind::Pod, 500, 1_000_000);
    fake.close_watches();
    let f = fake.clone();
    service::eventually(WAIT, "the pod watch to close", move || {
        f.open_watches(Kind::Pod) == 0
    })
    .await;
    env.bind(&running, "n1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let second = env.bind(&next, "n1").await;
    fake.fail_watch_start(Kind::Pod, 500, 0);
    assert!(
        second.is_err(),
        "the only GPU was handed out twice: running={:?} next={:?}",
        annotation_of(&fake, &running),
        annotation_of(&fake, &next)
    );
    assert_eq!(env.metric("dne_assumed_expired_total", "").await, 0.0);
    let view = env.ledger("n1").await;
    assert_eq!(view["entries"][uid(&running)]["state"], "assumed", "{view}");
    env.wait_committed("n1", &uid(&running)).await;
    assert_eq!(env.metric("dne_assumed_expired_total", "").await, 0.0);
    env.svc.shutdown().await.unwrap();
}
