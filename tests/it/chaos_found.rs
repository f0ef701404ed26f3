//! Defects the chaos suite found, each reduced to a deterministic test against the fake API
//! server's per-verb write faults. Each failed before its fix landed.

use serde_json::json;

use crate::gpu::{Env, annotation_of, node_of};
use crate::support::service;
use crate::support::{FakeApiServer, Kind};

/// Chaos seed 3942192151155041054, step 231: a pod ended up bound to `gpu-a` (Device object
/// deleted, so nothing to allocate there) carrying `gpu-b`'s minors in its
/// `device-allocated` annotation. Reduced: the annotation patch of a bind to n1 applies but
/// its answer is lost, so the bind fails and the annotation stays on the pending pod; the
/// retried bind to a Device-less node allocates nothing and leaves it. koordlet on n2 would
/// then expose n1's minors, and once n2's Device appears those minors are charged there.
///
/// Since issue 22 the allocation travels inside the binding, so a bind of ours never leaves an
/// annotation on a pending pod; an older version (which patched before binding) or another
/// writer still can, so the pending pod here starts with n1's minors on it.
#[tokio::test]
async fn bind_that_allocates_nothing_removes_a_stale_annotation() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 2, &[]);
    // No Device: the device plugin that advertises its GPUs owns it.
    let mut n2 = service::node("n2");
    n2["status"]["allocatable"]["nvidia.com/gpu"] = json!("2");
    fake.create(Kind::Node, n2).unwrap();
    let stale = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"80Gi","koordinator.sh/gpu-memory-ratio":"100"}}]}"#;
    let p = service::pod(
        "ml",
        "p",
        "uid-p",
        json!({"nvidia.com/gpu": "1"}),
        None,
        Some(stale),
    );
    fake.create(Kind::Pod, p.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;
    assert!(annotation_of(&fake, &p).is_some());

    env.bind(&p, "n2").await.unwrap();
    assert_eq!(node_of(&fake, &p).as_deref(), Some("n2"));
    assert_eq!(
        annotation_of(&fake, &p),
        None,
        "a pod bound to n2 with nothing allocated must not keep n1's minors"
    );
    env.svc.shutdown().await.unwrap();
}

/// Chaos seed 8371440133105718596, step 40: `OVER-ALLOCATION on gpu-b gpu/1` (and gpu/2). A
/// failing list page during a forced relist left the standby's pod watch down (kube's watcher
/// backs off before listing again); the leader was then SIGTERMed, the standby took over at
/// once and bound two pods onto the GPUs the old leader had just given a third pod, which its
/// stale cache had never seen. Reduced to one replica: its pod watch cannot restart, and
/// meanwhile another binder (the old leader, or another scheduler) binds a pod holding the
/// node's only GPU. A bind now must not hand out that GPU again: while a kind's watch is known
/// to be down, the cache is not a safe base for a new allocation.
#[tokio::test]
async fn bind_refuses_while_the_pod_watch_is_down() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 1, &[]);
    let p = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, p.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;
    service::wait_for_all_watches(&fake, std::time::Duration::from_secs(30)).await;

    // The pod watch breaks and cannot come back for now.
    fake.fail_watch_start(Kind::Pod, 500, 1_000_000);
    fake.close_watches();
    // Meanwhile the old leader binds a pod onto the node's only GPU.
    fake.create(
        Kind::Pod,
        service::pod(
            "ml",
            "other",
            "uid-other",
            json!({"nvidia.com/gpu": "1"}),
            Some("n1"),
            Some(&service::whole_gpus(&[0])),
        ),
    )
    .unwrap();
    // The bind comes once the service knows the watch is down (its fence is raised when the
    // watcher reports the failed restart), as in the test below: an ordering, not a race
    // between the cut and the bind.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while env
        .metric("dne_pod_fences_total", "reason=\"watch_error\"")
        .await
        < 1.0
    {
        assert!(tokio::time::Instant::now() < deadline, "no fence raised");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    let result = env.bind(&p, "n1").await;
    let holders: Vec<String> = fake
        .list(Kind::Pod)
        .into_iter()
        .filter(|pod| pod["spec"]["nodeName"] == "n1")
        .filter_map(|pod| {
            pod["metadata"]["annotations"]["scheduling.koordinator.sh/device-allocated"]
                .as_str()
                .map(|_| pod["metadata"]["name"].as_str().unwrap_or("").to_string())
        })
        .collect();
    assert!(
        result.is_err() && holders == vec!["other".to_string()],
        "GPU 0 handed out twice: bind {result:?}, holders {holders:?}"
    );
    fake.fail_watch_start(Kind::Pod, 500, 0);
    env.svc.shutdown().await.unwrap();
}

/// The fence behind the fix above, observed from outside: while the pod watch and the relist
/// it asks for both fail, a bind is refused with a "catching up" error, counted as
/// `dne_binds_total{outcome="cache_not_current"}`, and the fence as
/// `dne_pod_fences_total{reason="watch_error"}`; once lists and watches work again the relist
/// lifts the fence and the same bind succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_binds_are_refused_counted_and_resume_after_the_relist() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 1, &[]);
    let p = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, p.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;
    // Only the start's fence (issue 36 §1), lifted by the first list.
    assert_eq!(env.metric("dne_pod_fences_total", "").await, 1.0);
    assert_eq!(
        env.metric("dne_pod_fences_total", "reason=\"started\"")
            .await,
        1.0
    );

    crate::gpu::pod_watch_down(&fake).await;
    // The fence is raised when the watcher reports its failed restart: wait for that.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while env
        .metric("dne_pod_fences_total", "reason=\"watch_error\"")
        .await
        < 1.0
    {
        assert!(tokio::time::Instant::now() < deadline, "no fence raised");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let err = env.bind(&p, "n1").await.unwrap_err();
    assert!(err.contains("catching up"), "{err}");
    assert_eq!(
        env.metric("dne_binds_total", "outcome=\"cache_not_current\"")
            .await,
        1.0
    );
    assert_eq!(node_of(&fake, &p), None, "a fenced bind wrote to the pod");

    crate::gpu::pod_watch_up(&fake);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match env.bind(&p, "n1").await {
            Ok(()) => break,
            Err(e) => assert!(
                e.contains("catching up") && tokio::time::Instant::now() < deadline,
                "the bind never resumed: {e}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(node_of(&fake, &p).as_deref(), Some("n1"));
    env.svc.shutdown().await.unwrap();
}

/// Found by CI on a clean clone: the fence restarts the pod watcher with a list, and an error
/// during that list raised the fence again, which restarted the list at once: a pod list that
/// keeps failing became a hot loop (100 % CPU, lists as fast as the API server answers). Now
/// an error inside a relist that began after the fence leaves it to kube's own backoff, and
/// requested restarts are spaced out. After several failed lists: still one fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_pod_list_does_not_spin_the_fence() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 1, &[]);
    let env = Env::start(&fake, &[]).await;
    fake.clear_requests();
    crate::gpu::pod_watch_down(&fake).await;
    // Wait (hang-guarded, no time window) until the relist's list has failed several times;
    // each failure used to raise the fence again.
    let pod_lists = || {
        fake.requests()
            .iter()
            .filter(|r| {
                r.method == "GET" && r.path.ends_with("/pods") && !r.query.contains("watch=true")
            })
            .count()
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while pod_lists() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod list was not retried"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let fences = env
        .metric("dne_pod_fences_total", "reason=\"watch_error\"")
        .await;
    crate::gpu::pod_watch_up(&fake);
    assert_eq!(
        fences, 1.0,
        "the fence was raised again by its own relist's errors"
    );
    // And it recovers: the relist lifts the fence, binds decide again.
    let p = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, p.clone()).unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while let Err(e) = env.bind(&p, "n1").await {
        assert!(
            e.contains("catching up") && tokio::time::Instant::now() < deadline,
            "{e}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    env.svc.shutdown().await.unwrap();
}
