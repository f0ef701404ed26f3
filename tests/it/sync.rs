//! Force-synced bootstrap against the fake API server: writes racing the initial list pages,
//! relists after a 410, and kinds arriving out of order all end in the cache a fresh
//! bootstrap builds (DESIGN.md §2).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::support::service::{
    self, Http, cache_counts, eventually_equal, fresh_snapshot, wait_for_all_watches, whole_gpus,
};
use crate::support::{FakeApiServer, Kind};

const TIMEOUT: Duration = Duration::from_secs(30);

fn gpu_pod(name: &str, uid: &str, node: &str, minors: &[i32]) -> Value {
    service::pod(
        "default",
        name,
        uid,
        json!({"nvidia.com/gpu": minors.len().to_string()}),
        Some(node),
        Some(&whole_gpus(minors)),
    )
}

fn cpu_pod(name: &str, uid: &str, node: &str) -> Value {
    service::pod(
        "default",
        name,
        uid,
        json!({"cpu": "100m"}),
        Some(node),
        None,
    )
}

fn readyz_kind(body: &Value, kind: &str, field: &str) -> u64 {
    body["kinds"][kind][field].as_u64().unwrap_or(0)
}

async fn wait_readyz(http: &Http, what: &str, mut cond: impl FnMut(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let (_, body) = http.get("/readyz").await;
        if cond(&body) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_during_the_initial_list_pages_end_in_the_fresh_bootstrap_cache() {
    const PODS: usize = 1100; // three pages of 500
    let fake = FakeApiServer::new();
    for n in ["n0", "n1", "n2"] {
        fake.create(Kind::Node, service::node(n)).unwrap();
        fake.create(Kind::Device, service::gpu_device(n, 8, 4, &[]))
            .unwrap();
        fake.create(Kind::NodeResourceTopology, service::nrt(n))
            .unwrap();
    }
    fake.create_many(
        Kind::Pod,
        (0..PODS).map(|i| {
            let node = format!("n{}", i % 3);
            if i < 48 {
                gpu_pod(
                    &format!("p{i:04}"),
                    &format!("uid-p{i}"),
                    &node,
                    &[(i / 3 % 8) as i32],
                )
            } else {
                cpu_pod(&format!("p{i:04}"), &format!("uid-p{i}"), &node)
            }
        }),
    )
    .unwrap();
    // Every pod list page waits at a gate the test opens one page at a time: each burst
    // below lands between two pages by construction, not within a delay.
    fake.hold_lists(Kind::Pod);

    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);

    // Burst 1: the first page's request has arrived but its snapshot is not taken yet.
    service::eventually(TIMEOUT, "the first pod list request", || {
        fake.held_lists(Kind::Pod) == 1
    })
    .await;
    fake.delete(Kind::Pod, "default", "p0001").unwrap();
    fake.create(Kind::Pod, gpu_pod("q-early", "uid-q-early", "n1", &[7]))
        .unwrap();
    fake.set_pod_phase("default", "p0002", "Succeeded").unwrap();
    fake.pass_lists(Kind::Pod, 1);

    // Burst 2: between page 1 and page 2 (page 1 listed, pages 2-3 come from its snapshot).
    wait_readyz(&http, "the first page to be buffered", |b| {
        readyz_kind(b, "pods", "listing") >= 500
    })
    .await;
    // Already listed: deleted, modified (devices changed), recreated under a new UID.
    fake.delete(Kind::Pod, "default", "p0003").unwrap();
    fake.patch_merge(
        Kind::Pod,
        "default",
        "p0004",
        json!({"metadata": {"annotations": {
            "scheduling.koordinator.sh/device-allocated": whole_gpus(&[5, 6])}}}),
    )
    .unwrap();
    fake.delete(Kind::Pod, "default", "p0005").unwrap();
    fake.create(Kind::Pod, gpu_pod("p0005", "uid-p5-again", "n0", &[3]))
        .unwrap();
    // Not listed yet (page 3): deleted, made terminal, given a malformed annotation.
    fake.delete(Kind::Pod, "default", "p1050").unwrap();
    fake.set_pod_phase("default", "p1051", "Failed").unwrap();
    fake.patch_merge(
        Kind::Pod,
        "default",
        "p1052",
        json!({"metadata": {"annotations": {
            "scheduling.koordinator.sh/device-allocated": "{not json"}}}),
    )
    .unwrap();
    // Other kinds change too while pods are still listing.
    fake.create(Kind::Node, service::node("n3")).unwrap();
    fake.create(Kind::Device, service::gpu_device("n3", 4, 2, &[1]))
        .unwrap();
    fake.delete(Kind::NodeResourceTopology, "", "n2").unwrap();
    fake.create(Kind::Pod, cpu_pod("q-mid", "uid-q-mid", "n3"))
        .unwrap();
    fake.pass_lists(Kind::Pod, 1);

    // Burst 3: between page 2 and page 3.
    wait_readyz(&http, "the second page to be buffered", |b| {
        readyz_kind(b, "pods", "listing") >= 1000
    })
    .await;
    fake.delete(Kind::Pod, "default", "p1099").unwrap();
    fake.delete(Kind::Pod, "default", "p0000").unwrap();
    fake.replace(
        Kind::Device,
        service::gpu_device("n0", 8, 4, &[0, 1]), // two GPUs turn unhealthy
    )
    .unwrap();
    fake.delete(Kind::Node, "", "n2").unwrap();

    // Page 3 is still held: the writes above raced the list, not followed it.
    let (status, body) = http.get("/readyz").await;
    assert_eq!(status, 503, "the pod list is not complete: {body}");
    fake.release_lists(Kind::Pod);
    http.wait_ready(TIMEOUT).await;
    wait_for_all_watches(&fake, TIMEOUT).await;

    let want = fresh_snapshot(&fake, &[]).await;
    eventually_equal(&svc.state.scheduler.cluster, &want, TIMEOUT).await;

    // Spot checks, so an empty or wrong "fresh" cache cannot pass by accident.
    let counts = cache_counts(&svc.state.scheduler.cluster);
    // 7 gone (deleted or terminal), p0005 recreated, q-early and q-mid new.
    assert_eq!(counts.pods, PODS - 7 + 2, "{counts:?}");
    assert_eq!((counts.nodes, counts.devices, counts.topologies), (3, 4, 2));
    let snap = svc.state.scheduler.cluster.debug_dump();
    assert!(
        snap["n1"]["devices"]["entries"]["uid-q-early"].is_object(),
        "{}",
        snap["n1"]
    );
    assert!(snap["n0"]["devices"]["entries"]["uid-p5-again"].is_object());
    assert!(snap["n2"]["devices"]["entries"]["uid-p5"].is_null());
    assert!(snap["n2"]["pods"]["uid-p1052"].is_object());
    assert_eq!(
        snap["n2"]["devices"]["blocked_by_malformed_entries"], true,
        "{}",
        snap["n2"]["devices"]
    );
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_after_410_replaces_gone_and_recreated_objects_without_losing_readiness() {
    let fake = FakeApiServer::new();
    for n in ["n0", "n1", "n2", "n3"] {
        fake.create(Kind::Node, service::node(n)).unwrap();
        fake.create(Kind::Device, service::gpu_device(n, 8, 4, &[]))
            .unwrap();
        fake.create(Kind::NodeResourceTopology, service::nrt(n))
            .unwrap();
    }
    fake.create(Kind::Pod, gpu_pod("holder", "uid-holder-1", "n1", &[0, 1]))
        .unwrap();
    fake.create(Kind::Pod, gpu_pod("gone", "uid-gone", "n1", &[2]))
        .unwrap();
    fake.create(Kind::Pod, gpu_pod("stays", "uid-stays", "n0", &[0]))
        .unwrap();
    fake.create(Kind::Pod, cpu_pod("on-n3", "uid-on-n3", "n3"))
        .unwrap();

    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    let before = http.wait_ready(TIMEOUT).await;
    wait_for_all_watches(&fake, TIMEOUT).await;

    // Watch /readyz throughout: a relist must never make it fail.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let poller = {
        let (http, stop, failures) = (http.clone(), stop.clone(), failures.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let (status, body) = http.get("/readyz").await;
                if status != 200 {
                    failures.lock().push(body);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    // Hold re-watches back until every change below is made (invisible to the watches), then
    // compact past them: each re-watch gets the in-stream 410 and must relist.
    for kind in service::WATCHED {
        fake.hold_watches(kind);
    }
    fake.close_watches();
    fake.delete(Kind::Pod, "default", "gone").unwrap();
    fake.delete(Kind::Pod, "default", "holder").unwrap();
    fake.create(Kind::Pod, gpu_pod("holder", "uid-holder-2", "n1", &[4, 5]))
        .unwrap();
    fake.delete(Kind::Pod, "default", "on-n3").unwrap();
    for kind in [Kind::Node, Kind::Device, Kind::NodeResourceTopology] {
        fake.delete(kind, "", "n3").unwrap();
    }
    // Recreated under the same name with a new UID and different content.
    fake.delete(Kind::Node, "", "n2").unwrap();
    let mut n2 = service::node("n2");
    n2["metadata"]["labels"]["pool"] = json!("b");
    fake.create(Kind::Node, n2).unwrap();
    fake.delete(Kind::Device, "", "n0").unwrap();
    fake.create(Kind::Device, service::gpu_device("n0", 8, 4, &[7]))
        .unwrap();
    fake.create(Kind::Pod, gpu_pod("new", "uid-new", "n2", &[3]))
        .unwrap();
    fake.compact();
    for kind in service::WATCHED {
        fake.release_watches(kind);
    }

    for kind in ["nodes", "pods", "devices", "noderesourcetopologies"] {
        let was = readyz_kind(&before, kind, "relists");
        wait_readyz(&http, &format!("{kind} to relist"), |b| {
            readyz_kind(b, kind, "relists") > was && b["kinds"][kind]["phase"] == "synced"
        })
        .await;
    }
    wait_for_all_watches(&fake, TIMEOUT).await;
    let want = fresh_snapshot(&fake, &[]).await;
    eventually_equal(&svc.state.scheduler.cluster, &want, TIMEOUT).await;

    stop.store(true, Ordering::SeqCst);
    poller.await.unwrap();
    assert!(
        failures.lock().is_empty(),
        "/readyz failed during the relist: {:?}",
        failures.lock().first()
    );

    let snap = svc.state.scheduler.cluster.debug_dump();
    let entries = &snap["n1"]["devices"]["entries"];
    assert!(
        entries["uid-holder-1"].is_null(),
        "old holder released: {entries}"
    );
    assert!(entries["uid-gone"].is_null(), "{entries}");
    let alloc = entries["uid-holder-2"]["allocation"].as_str().unwrap_or("");
    assert!(
        alloc.contains("\"minor\":4") && alloc.contains("\"minor\":5"),
        "new holder recorded with its new devices: {entries}"
    );
    let gpus = &snap["n1"]["devices"]["types"]["gpu"];
    for minor in ["0", "1", "2"] {
        assert_eq!(
            gpus[minor]["used"],
            json!({}),
            "minor {minor} freed: {gpus}"
        );
    }
    assert!(!snap.contains_key("n3"), "n3 is gone entirely");
    assert_eq!(snap["n2"]["node"]["labels"]["pool"], "b");
    assert_eq!(snap["n0"]["devices"]["types"]["gpu"]["7"]["healthy"], false);
    svc.shutdown().await.unwrap();
}

/// The pod watch can deliver a pod before its node's Device and NRT: its allocation is kept
/// and counted against the devices once they arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_before_its_device_and_nrt_keeps_its_allocation() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("n0")).unwrap();
    fake.create(Kind::Pod, gpu_pod("early", "uid-early", "n0", &[0, 1]))
        .unwrap();
    // Bootstrap order: the Device and NRT lists are held back, so pods apply first.
    fake.create(Kind::Device, service::gpu_device("n0", 8, 4, &[]))
        .unwrap();
    fake.create(Kind::NodeResourceTopology, service::nrt("n0"))
        .unwrap();
    fake.hold_lists(Kind::Device);
    fake.hold_lists(Kind::NodeResourceTopology);

    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    let body = wait_readyz(&http, "pods to sync before devices", |b| {
        b["kinds"]["pods"]["phase"] == "synced"
    })
    .await;
    assert_ne!(
        body["kinds"]["devices"]["phase"], "synced",
        "the test needs pods first: {body}"
    );
    let snap = svc.state.scheduler.cluster.debug_dump();
    let n0 = &snap["n0"];
    assert_eq!(n0["devices"]["device_object_present"], false, "{n0}");
    assert!(
        n0["devices"]["entries"]["uid-early"]["allocation"].is_string(),
        "{n0}"
    );
    assert_eq!(
        n0["devices"]["types"]["gpu"]["0"]["used"]["koordinator.sh/gpu-core"], "100",
        "recorded use is kept with no Device yet: {n0}"
    );
    assert!(n0["topology"].is_null());

    fake.release_lists(Kind::Device);
    fake.release_lists(Kind::NodeResourceTopology);
    http.wait_ready(TIMEOUT).await;
    let snap = svc.state.scheduler.cluster.debug_dump();
    let gpus = &snap["n0"]["devices"]["types"]["gpu"];
    for minor in ["0", "1"] {
        assert_eq!(gpus[minor]["present"], true, "{gpus}");
        assert_eq!(
            gpus[minor]["used"]["koordinator.sh/gpu-core"], "100",
            "{gpus}"
        );
        assert_eq!(gpus[minor]["free"], json!({}), "nothing left: {gpus}");
    }
    assert_eq!(gpus["2"]["used"], json!({}), "{gpus}");
    assert!(snap["n0"]["topology"].is_object());

    // And the allocation is effective: eight whole GPUs no longer fit, six do.
    let ask = |n: usize| {
        service::pod(
            "ml",
            &format!("ask{n}"),
            &format!("uid-ask{n}"),
            json!({"nvidia.com/gpu": n.to_string()}),
            None,
            None,
        )
    };
    let (_, r) = http
        .post("/filter", &service::extender_args(&ask(8), &["n0"]))
        .await;
    assert_eq!(r["NodeNames"], json!([]), "{r}");
    let (_, r) = http
        .post("/filter", &service::extender_args(&ask(6), &["n0"]))
        .await;
    assert_eq!(r["NodeNames"], json!(["n0"]), "{r}");
    svc.shutdown().await.unwrap();
}

/// The same, live: the Device and NRT are created only after the service is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_created_after_its_pod_counts_the_recorded_use() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("n0")).unwrap();
    fake.create(Kind::Pod, gpu_pod("early", "uid-early", "n0", &[2]))
        .unwrap();
    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    wait_for_all_watches(&fake, TIMEOUT).await;
    let snap = svc.state.scheduler.cluster.debug_dump();
    assert!(
        snap["n0"]["devices"]["entries"]["uid-early"]["allocation"].is_string(),
        "{}",
        snap["n0"]
    );

    fake.create(Kind::Device, service::gpu_device("n0", 4, 2, &[]))
        .unwrap();
    fake.create(Kind::NodeResourceTopology, service::nrt("n0"))
        .unwrap();
    let cluster = svc.state.scheduler.cluster.clone();
    service::eventually(TIMEOUT, "the Device and NRT to arrive", || {
        let s = cluster.debug_dump();
        s["n0"]["devices"]["device_object_present"] == true && s["n0"]["topology"].is_object()
    })
    .await;
    let snap = svc.state.scheduler.cluster.debug_dump();
    let gpu2 = &snap["n0"]["devices"]["types"]["gpu"]["2"];
    assert_eq!(gpu2["used"]["koordinator.sh/gpu-core"], "100", "{gpu2}");
    assert_eq!(gpu2["free"], json!({}), "nothing left: {gpu2}");
    let want = fresh_snapshot(&fake, &[]).await;
    eventually_equal(&svc.state.scheduler.cluster, &want, TIMEOUT).await;
    svc.shutdown().await.unwrap();
}
