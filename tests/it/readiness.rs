//! `/readyz` and the verbs' not-ready answers while a kind's initial list is slow, and the
//! readiness of absent optional CRDs (DESIGN.md §2).

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::service::{self, Http, cache_counts};
use crate::support::{FakeApiServer, Kind};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A pending pod asking for one whole GPU, used to probe the verbs.
fn probe_pod() -> Value {
    service::pod(
        "ml",
        "probe",
        "uid-probe",
        json!({"nvidia.com/gpu": "1"}),
        None,
        None,
    )
}

/// Before readiness every verb answers 200 with its not-ready shape, never a decision.
async fn assert_verbs_not_ready(http: &Http, waiting_for: &str) {
    let pod = probe_pod();
    let (status, body) = http
        .post("/filter", &service::extender_args(&pod, &["n0"]))
        .await;
    assert_eq!(status, 200, "{body}");
    let error = body["Error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("not ready:") && error.contains(waiting_for),
        "filter before readiness: {body}"
    );
    assert_eq!(
        body["NodeNames"],
        Value::Null,
        "no decision before readiness"
    );

    let (status, body) = http.post("/bind", &service::binding_args(&pod, "n0")).await;
    assert_eq!(status, 200, "{body}");
    let error = body["Error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("not ready:") && error.contains(waiting_for),
        "bind before readiness: {body}"
    );

    let (status, body) = http
        .post("/prioritize", &service::extender_args(&pod, &["n0"]))
        .await;
    assert_eq!((status, body), (200, json!([])), "prioritize: no opinion");

    let preempt = json!({"Pod": pod, "NodeNameToVictims": null,
        "NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": "uid-p0"}], "NumPDBViolations": 0}}});
    let (status, body) = http.post("/preempt", &preempt).await;
    assert_eq!(
        (status, body),
        (200, json!({"NodeNameToMetaVictims": {}})),
        "preempt: no candidates"
    );
}

/// Polls `/readyz` until `done(body)` holds (hang guard [`TIMEOUT`]); returns that body.
async fn readyz_until(http: &Http, what: &str, mut done: impl FnMut(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let (_, body) = http.get("/readyz").await;
        if done(&body) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {TIMEOUT:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `/readyz` until 200, checking every 503 body on the way with `check(body, counts
/// taken just before the request)`. Returns the counts taken right after the flip, and every
/// `(phase, listing)` the slow kind showed.
async fn watch_readiness_flip(
    http: &Http,
    svc: &device_numa_extender::app::Service,
    kind: &str,
    mut check: impl FnMut(&Value, service::CacheCounts),
) -> (service::CacheCounts, Vec<(String, u64)>) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let mut seen = Vec::new();
    loop {
        let before = cache_counts(&svc.state.scheduler.cluster);
        let (status, body) = http.get("/readyz").await;
        if status == 200 {
            // The flip happens only after the diff is applied: everything is in the cache now.
            return (cache_counts(&svc.state.scheduler.cluster), seen);
        }
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["ready"], false, "{body}");
        // Every kind applied, the read snapshot still being built: the one 503 after them.
        if body["reasons"] == json!(["building the read snapshot"]) {
            assert_eq!(body["kinds"][kind]["phase"], "synced", "{body}");
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let phase = body["kinds"][kind]["phase"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(
            phase == "pending" || phase == "listing",
            "{kind} is not synced yet, so its phase is pending or listing: {body}"
        );
        let reasons = body["reasons"].to_string();
        assert!(
            reasons.contains("waiting for") && reasons.contains(kind),
            "the 503 body names the kind it waits for: {body}"
        );
        let listing = body["kinds"][kind]["listing"].as_u64().unwrap_or(0);
        check(&body, before);
        if seen.last() != Some(&(phase.clone(), listing)) {
            seen.push((phase, listing));
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready after {TIMEOUT:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_the_last_page_of_a_slowly_paginated_kind() {
    // kube's watcher pages at 500: 1,234 pods are three pages, each delayed.
    const PODS: usize = 1234;
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("n0")).unwrap();
    fake.create_many(
        Kind::Pod,
        (0..PODS).map(|i| {
            service::pod(
                "default",
                &format!("p{i:04}"),
                &format!("uid-p{i}"),
                json!({"cpu": "100m"}),
                Some("n0"),
                None,
            )
        }),
    )
    .unwrap();
    // Every page waits at a gate the test opens one page at a time.
    fake.hold_lists(Kind::Pod);

    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    assert_verbs_not_ready(&http, "pods").await;
    let (status, body) = http.get("/readyz").await;
    assert_eq!(status, 503, "the first page is held: {body}");

    // After each page but the last, the 503 body shows the list progressing, and nothing of
    // the first list is applied before InitDone.
    let pages = PODS.div_ceil(500);
    for page in 1..pages {
        fake.pass_lists(Kind::Pod, 1);
        let body = readyz_until(&http, &format!("page {page} buffered"), |b| {
            b["kinds"]["pods"]["listing"].as_u64().unwrap_or(0) as usize >= 500 * page
        })
        .await;
        let listing = body["kinds"]["pods"]["listing"].as_u64().unwrap_or(0) as usize;
        assert!(listing < PODS, "{body}");
        assert_eq!(body["kinds"]["pods"]["phase"], "listing", "{body}");
        assert_eq!(
            cache_counts(&svc.state.scheduler.cluster).pods,
            0,
            "pods applied before InitDone: {body}"
        );
    }
    fake.release_lists(Kind::Pod);

    let (at_flip, _) = watch_readiness_flip(&http, &svc, "pods", |body, before| {
        let listing = body["kinds"]["pods"]["listing"].as_u64().unwrap_or(0);
        // Until the last page is buffered nothing of the first list may be applied (the
        // counts were taken before the request, so the list was at most this far then).
        if (listing as usize) < PODS {
            assert_eq!(before.pods, 0, "pods applied before InitDone: {body}");
        }
    })
    .await;
    assert_eq!(
        at_flip.pods, PODS,
        "every pod is cached the moment /readyz flips"
    );
    assert_eq!(at_flip.nodes, 1);

    let (_, body) = http.get("/readyz").await;
    assert_eq!(body["kinds"]["pods"]["phase"], "synced");
    assert_eq!(body["kinds"]["pods"]["replayed"], PODS);
    assert_eq!(body["kinds"]["pods"]["cached"], PODS);
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_a_delayed_list() {
    const DEVICES: usize = 300;
    let fake = FakeApiServer::new();
    fake.create_many(
        Kind::Node,
        (0..DEVICES).map(|i| service::node(&format!("n{i:03}"))),
    )
    .unwrap();
    fake.create_many(
        Kind::Device,
        (0..DEVICES).map(|i| service::gpu_device(&format!("n{i:03}"), 8, 4, &[])),
    )
    .unwrap();
    // The Device list is held until the test has seen the 503 it causes.
    fake.hold_lists(Kind::Device);

    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    assert_verbs_not_ready(&http, "devices").await;
    let body = readyz_until(&http, "the Device list to be held", |_| {
        fake.held_lists(Kind::Device) >= 1
    })
    .await;
    assert_eq!(body["ready"], false, "{body}");
    assert_ne!(body["kinds"]["devices"]["phase"], "synced", "{body}");
    assert_eq!(cache_counts(&svc.state.scheduler.cluster).devices, 0);
    fake.release_lists(Kind::Device);
    let (at_flip, _) = watch_readiness_flip(&http, &svc, "devices", |body, before| {
        if body["kinds"]["devices"]["listing"].as_u64().unwrap_or(0) == 0 {
            assert_eq!(before.devices, 0, "devices applied before InitDone: {body}");
        }
    })
    .await;
    assert_eq!(
        at_flip.devices, DEVICES,
        "all Devices cached when /readyz flips"
    );
    assert_eq!(at_flip.nodes, DEVICES);
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absent_optional_crd_is_disabled_and_named() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("n0")).unwrap();
    fake.set_crd_served(Kind::Device, false);

    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    let body = http.wait_ready(TIMEOUT).await;
    let devices = &body["kinds"]["devices"];
    assert_eq!(devices["requirement"], "disabled", "{body}");
    let reason = devices["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("devices.scheduling.koordinator.sh") && reason.contains("not served"),
        "the reason names the missing CRD: {body}"
    );
    assert!(
        reason.contains("disabled:"),
        "and what is switched off: {body}"
    );
    assert_eq!(body["kinds"]["noderesourcetopologies"]["phase"], "synced");
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insisted_on_absent_crd_keeps_readyz_failing() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("n0")).unwrap();
    fake.set_crd_served(Kind::Device, false);

    let svc = service::start(&fake, &["--require-kinds", "devices"]).await;
    let http = Http::new(svc.addr);
    // Wait until everything that can sync has, then check it still is not ready.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let body = loop {
        let (status, body) = http.get("/readyz").await;
        assert_eq!(
            status, 503,
            "never ready without the insisted-on kind: {body}"
        );
        if ["nodes", "pods", "noderesourcetopologies"]
            .iter()
            .all(|k| body["kinds"][k]["phase"] == "synced")
        {
            break body;
        }
        assert!(tokio::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        body["kinds"]["devices"]["requirement"], "unavailable",
        "{body}"
    );
    let reasons = body["reasons"].to_string();
    assert!(
        reasons.contains("devices required but unavailable"),
        "the 503 body names the missing kind: {body}"
    );
    // Still failing a while later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = http.get("/readyz").await;
    assert_eq!(status, 503);
    assert_verbs_not_ready(&http, "devices").await;
    svc.shutdown().await.unwrap();
}

/// Issue 22 §3: an optional CRD installed after the extender started is found by the periodic
/// rediscovery, watched, and gates `/readyz` on its first list as at startup; then its objects
/// decide binds (before: `disabled` forever, and a GPU pod bound with no allocation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optional_crd_installed_later_is_watched_and_used() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("n1")).unwrap();
    fake.set_crd_served(Kind::Device, false);
    let p = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, p.clone()).unwrap();

    let svc = service::start(&fake, &["--rediscover-interval", "100ms"]).await;
    let http = Http::new(svc.addr);
    let body = http.wait_ready(TIMEOUT).await;
    assert_eq!(
        body["kinds"]["devices"]["requirement"], "disabled",
        "{body}"
    );

    // The CRD is installed and koordlet publishes n1's Device.
    fake.set_crd_served(Kind::Device, true);
    fake.create(Kind::Device, service::gpu_device("n1", 2, 1, &[]))
        .unwrap();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let (status, body) = http.get("/readyz").await;
        let devices = &body["kinds"]["devices"];
        if status == 200 && devices["requirement"] == "required" && devices["phase"] == "synced" {
            assert_eq!(devices["replayed"], 1, "{body}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the CRD installed later was never watched: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, r) = http.post("/bind", &service::binding_args(&p, "n1")).await;
    assert_eq!(r["Error"], "", "{r}");
    let bound = fake.get(Kind::Pod, "ml", "p").unwrap();
    assert!(
        bound["metadata"]["annotations"]["scheduling.koordinator.sh/device-allocated"].is_string(),
        "the GPU pod was bound without an allocation from the Device: {bound}"
    );
    svc.shutdown().await.unwrap();
}
