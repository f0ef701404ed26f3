//! Every error-path metric is asserted somewhere (issue 9 §3); the ones no other test covers are
//! asserted here, each by provoking its failure through the HTTP API or the fake API server's
//! fault knobs and reading `/metrics` as an operator would; `not_leader` and `internal` by
//! calling the bind handler over an in-memory pod API that takes leadership away on the bind's
//! pod read, or panics in the binding call (the fake server has no hook at those points).
//! RELIABILITY.md maps every metric to the test that asserts it.

use std::time::Duration;

use serde_json::json;

use crate::gpu::{Env, annotation_of, metric_value};
use crate::support::service::{self, Http};
use crate::support::{FakeApiServer, Kind, WriteFault, WriteOp};

const GUARD: Duration = Duration::from_secs(60);

async fn metric(http: &Http, name: &str, labels: &str) -> f64 {
    let (status, body) = http.get("/metrics").await;
    assert_eq!(status, 200);
    metric_value(body.as_str().unwrap_or_default(), name, labels)
}

/// `dne_http_requests_total` for a verb and outcome (labels may come in any order).
async fn requests(http: &Http, verb: &str, outcome: &str) -> f64 {
    let (_, body) = http.get("/metrics").await;
    body.as_str()
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("dne_http_requests_total{"))
        .filter(|l| {
            l.contains(&format!("verb=\"{verb}\"")) && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum()
}

/// A 1-GPU node `n1`, a pending pod `p` asking for it, and the service with
/// `--request-timeout request_timeout`. Requests the test expects to be answered get a
/// timeout no loaded machine reaches; only requests meant to time out get a short one.
async fn one_gpu_and_a_pending_pod(
    request_timeout: &str,
) -> (FakeApiServer, serde_json::Value, Env) {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 1, &[]);
    let p = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, p.clone()).unwrap();
    let env = Env::start(&fake, &["--request-timeout", request_timeout]).await;
    (fake, p, env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_outcomes_bad_request_not_ready_error_and_timeout_are_counted() {
    let (fake, p, env) = one_gpu_and_a_pending_pod("600s").await;

    // bad_request: not JSON.
    let (status, _) = env
        .http
        .send(
            "POST",
            "/filter",
            Some("application/json"),
            b"{not json".to_vec(),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(requests(&env.http, "filter", "bad_request").await, 1.0);

    // error: a bind that fails logically is HTTP 200 with Error set.
    let ghost = service::pending("ghost", json!({"nvidia.com/gpu": "1"}));
    assert!(
        env.bind(&ghost, "n1")
            .await
            .unwrap_err()
            .contains("not found")
    );
    assert_eq!(requests(&env.http, "bind", "error").await, 1.0);
    assert_eq!(
        metric(&env.http, "dne_binds_total", "outcome=\"pod_not_found\"").await,
        1.0
    );
    env.svc.shutdown().await.unwrap();

    // timeout: the binding applies but its answer hangs past a 1 s --request-timeout (only
    // this request, and the probes, which no timeout applies to, go to this service).
    let env = Env::start(&fake, &["--request-timeout", "1s"]).await;
    fake.push_write_fault(
        WriteOp::PodBinding,
        WriteFault::AppliedThenHang(Duration::from_secs(3)),
    );
    let (status, body) = env
        .http
        .post("/bind", &service::binding_args(&p, "n1"))
        .await;
    assert_eq!(status, 503, "{body}");
    assert!(body.to_string().contains("timed out"), "{body}");
    assert_eq!(requests(&env.http, "bind", "timeout").await, 1.0);
    // The detached bind still ends: the binding "failed" (given up, or its late 504) but the
    // read-back finds the pod bound here with our annotations, so the allocation stays, and
    // the bind task counts its outcome although the timeout dropped the request handler.
    let deadline = tokio::time::Instant::now() + GUARD;
    while fake.hanging_answers() > 0
        || env.ledger("n1").await["entries"]["uid-p"].is_null()
        || metric(
            &env.http,
            "dne_binds_total",
            "outcome=\"bound_despite_error\"",
        )
        .await
            != 1.0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the detached bind never ended, or its outcome was never counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.svc.shutdown().await.unwrap();

    // not_ready: a required kind whose CRD is not served keeps the service unready.
    let fake = FakeApiServer::new();
    fake.set_crd_served(Kind::Device, false);
    let svc = service::start(&fake, &["--require-kinds", "devices"]).await;
    let http = Http::new(svc.addr);
    let (status, f) = http
        .post("/filter", &service::extender_args(&p, &["n1"]))
        .await;
    assert_eq!(status, 200);
    assert!(
        f["Error"]
            .as_str()
            .unwrap_or_default()
            .contains("not ready"),
        "{f}"
    );
    assert_eq!(requests(&http, "filter", "not_ready").await, 1.0);
    svc.shutdown().await.unwrap();
}

/// A write the API server never answers does not hold the bind's assumed GPU forever (the
/// kube client sets no read timeout): the bind gives the call up after
/// `--request-timeout` plus a second; the binding's outcome is then unknown, so its GPU is
/// held until the API server's deadline for it (the same timeout, sent as the request's
/// `timeout`) has passed, then released, and a retry binds the pod. The hang outlasts the
/// guard, so without the bind's own timeout the entry would never go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_gives_up_on_an_api_write_that_never_answers() {
    // Long enough for the retried bind at the end to be answered on a loaded machine; the
    // test waits about twice this.
    let (fake, p, env) = one_gpu_and_a_pending_pod("5s").await;
    fake.push_write_fault(WriteOp::PodBinding, WriteFault::NeverAnswers);
    let (status, body) = env
        .http
        .post("/bind", &service::binding_args(&p, "n1"))
        .await;
    assert_eq!(status, 503, "the request itself times out first: {body}");
    let deadline = tokio::time::Instant::now() + GUARD;
    while !env.ledger("n1").await["entries"]["uid-p"].is_null() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the detached bind still holds its GPU: the hung patch was never given up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        fake.get(Kind::Pod, "ml", "p").unwrap()["spec"]["nodeName"].is_null(),
        "a bind that gave up did not bind the pod"
    );
    env.bind(&p, "n1").await.expect("a retried bind succeeds");
    env.svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bind_failure_class_is_counted() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 1, &[]);
    service::add_gpu_node(&fake, "n2", 1, &[]);
    let mk = |name: &str, r: serde_json::Value| {
        let p = service::pending(name, r);
        fake.create(Kind::Pod, p.clone()).unwrap();
        p
    };
    let one = || json!({"nvidia.com/gpu": "1"});
    let elsewhere = mk("elsewhere", one());
    fake.bind_pod("ml", "elsewhere", "n2").unwrap();
    let two = mk("two", json!({"nvidia.com/gpu": "2"}));
    let invalid = mk("invalid", json!({"koordinator.sh/gpu-core": "50"}));
    // A pending pod left with a `resource-status` by an older writer: the bind removes it
    // before its binding (a binding cannot remove an annotation).
    let patched = mk("patched", one());
    fake.patch_merge(
        Kind::Pod,
        "ml",
        "patched",
        json!({"metadata": {"annotations": {"scheduling.koordinator.sh/resource-status": "{}"}}}),
    )
    .unwrap();
    let refused = mk("refused", one());
    let cleanup = mk("cleanup", one());
    let env = Env::start(&fake, &[]).await;
    let class =
        async |c: &str| metric(&env.http, "dne_binds_total", &format!("outcome=\"{c}\"")).await;

    let mut empty = service::binding_args(&two, "n1");
    empty["PodName"] = json!("");
    let (_, r) = env.http.post("/bind", &empty).await;
    assert!(
        r["Error"]
            .as_str()
            .unwrap_or_default()
            .contains("PodName is empty"),
        "{r}"
    );
    assert_eq!(class("invalid_request").await, 1.0);

    let mut wrong_uid = two.clone();
    wrong_uid["metadata"]["uid"] = json!("uid-someone-else");
    assert!(
        env.bind(&wrong_uid, "n1")
            .await
            .unwrap_err()
            .contains("recreated")
    );
    assert_eq!(class("uid_mismatch").await, 1.0);

    assert!(
        env.bind(&elsewhere, "n1")
            .await
            .unwrap_err()
            .contains("already bound")
    );
    assert_eq!(class("bound_elsewhere").await, 1.0);

    assert!(
        env.bind(&two, "n1")
            .await
            .unwrap_err()
            .contains("cannot place")
    );
    assert_eq!(class("does_not_fit").await, 1.0);

    assert!(
        env.bind(&invalid, "n1")
            .await
            .unwrap_err()
            .contains("invalid device request")
    );
    assert_eq!(class("invalid_resources").await, 1.0);

    fake.push_write_fault(WriteOp::PodPatch, WriteFault::Refuse(500));
    assert!(
        env.bind(&patched, "n1")
            .await
            .unwrap_err()
            .contains("patch annotations")
    );
    assert_eq!(class("api_patch_error").await, 1.0);

    // A 4xx refusal: nothing applied, the bind rolls back at once.
    fake.push_write_fault(WriteOp::PodBinding, WriteFault::Refuse(422));
    assert!(
        env.bind(&refused, "n1")
            .await
            .unwrap_err()
            .contains("create the binding")
    );
    assert_eq!(class("api_binding_error").await, 1.0);

    // A 5xx: the outcome is unknown and the pod is unchanged, so the binding may still land:
    // the GPU is held (issue 22). kube-scheduler records the failure on the pod, which fences
    // the binding out; the probe (issue 11) then releases n1's GPU.
    fake.push_write_fault(WriteOp::PodBinding, WriteFault::Refuse(500));
    assert!(env.bind(&cleanup, "n1").await.is_err());
    assert_eq!(fake.pending_write_faults(), 0, "every fault was used");
    assert_eq!(class("api_binding_error").await, 2.0);
    assert_eq!(
        annotation_of(&fake, &cleanup),
        None,
        "nothing lands without the binding"
    );
    crate::gpu::record_failed_attempt(&fake, "cleanup");
    let deadline = tokio::time::Instant::now() + GUARD;
    while metric(&env.http, "dne_assumed_released_total", "path=\"probe\"").await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ambiguous bind was never probed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    env.svc.shutdown().await.unwrap();
}

/// A duplicate of a bind still in flight (its binding's answer hangs until the test ends it,
/// after the duplicate was answered) is refused and counted. The request timeout is far
/// beyond the guard, so only the orderings decide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_of_a_bind_in_flight_is_refused_and_counted() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 1, &[]);
    let slow = service::pending("slow", json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, slow.clone()).unwrap();
    let env = Env::start(&fake, &["--request-timeout", "600s"]).await;
    fake.push_write_fault(
        WriteOp::PodBinding,
        WriteFault::AppliedThenHang(Duration::from_secs(600)),
    );
    let http = env.http.clone();
    let first_args = service::binding_args(&slow, "n1");
    let first = tokio::spawn(async move { http.post("/bind", &first_args).await });
    let deadline = tokio::time::Instant::now() + GUARD;
    while fake.hanging_answers() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first bind never reached its binding"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let dup = env.bind(&slow, "n1").await.unwrap_err();
    assert!(dup.contains("already in progress"), "{dup}");
    assert_eq!(
        metric(&env.http, "dne_binds_total", "outcome=\"in_progress\"").await,
        1.0
    );
    fake.end_hanging_answers();
    let _ = tokio::time::timeout(GUARD, first)
        .await
        .expect("first bind ends");
    env.svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relists_and_watch_errors_are_counted_per_kind() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 1, &[]);
    let env = Env::start(&fake, &[]).await;
    service::wait_for_all_watches(&fake, GUARD).await;
    let relists = metric(&env.http, "dne_relists_total", "kind=\"pods\"").await;
    assert!(relists >= 1.0, "the first list counts");
    // A forced 410: watches cut, a write they miss, then compaction past it, so resuming from
    // their last RV gets the in-stream 410 and must relist. Repeated in case a watch
    // reconnected before the write (then it saw it live and needs no relist).
    let deadline = tokio::time::Instant::now() + GUARD;
    let mut n = 0;
    while metric(&env.http, "dne_relists_total", "kind=\"pods\"").await <= relists {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no relist after a 410"
        );
        fake.close_watches();
        n += 1;
        fake.create(
            Kind::Pod,
            service::pending(&format!("filler-{n}"), json!({})),
        )
        .unwrap();
        fake.compact();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A watch that cannot start is an error of that kind.
    let errors = metric(&env.http, "dne_watch_errors_total", "kind=\"devices\"").await;
    fake.fail_watch_start(Kind::Device, 500, 1);
    fake.close_watches();
    while metric(&env.http, "dne_watch_errors_total", "kind=\"devices\"").await <= errors {
        assert!(
            tokio::time::Instant::now() < deadline,
            "watch error not counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_objects_are_counted_and_skipped() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 1, &[]);
    // Served without a uid (a broken aggregated API or webhook): unusable, skipped.
    let mut dev = service::gpu_device("n2", 1, 1, &[]);
    dev["metadata"]["uid"] = serde_json::Value::Null;
    fake.create_verbatim(Kind::Device, dev).unwrap();
    fake.create(Kind::Node, service::node("n2")).unwrap();
    let env = Env::start(&fake, &[]).await;
    assert_eq!(
        metric(
            &env.http,
            "dne_invalid_objects_total",
            "kind=\"devices\",reason=\"missing metadata.uid\""
        )
        .await,
        1.0,
        "the uid-less Device is counted"
    );
    // Skipped, not fatal: n1 works, n2 has no Device in the cache.
    assert_eq!(env.ledger("n2").await["device_object_present"], false);
    let p = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, p.clone()).unwrap();
    env.bind(&p, "n1").await.unwrap();
    env.svc.shutdown().await.unwrap();
}

/// What [`FaultyPodApi`] does wrong.
enum Fault {
    /// On the bind's read of its pod, takes this replica's leadership away: as if the lease
    /// were lost between the request's arrival and the decision.
    LosesLeadershipOnRead(std::sync::Arc<device_numa_extender::sync::Readiness>),
    /// Panics in the binding call, after the annotations were written: a bug in the bind
    /// task, the one way to reach `dne_binds_total{outcome="internal"}`.
    PanicsOnBinding,
    /// On the bind's read of its pod, the lease's renewal deadline is set to now: as if the
    /// election task had not run again since (stalled, or the machine was suspended). The
    /// leader flag itself stays set.
    LeaseLapsesOnRead(std::sync::Arc<device_numa_extender::sync::Readiness>),
    /// Applies the annotation patch, then takes leadership away before it answers.
    LosesLeadershipOnPatch(std::sync::Arc<device_numa_extender::sync::Readiness>),
    /// The binding call never answers; `started` is notified when it was sent.
    BindingHangs {
        started: std::sync::Arc<tokio::sync::Notify>,
    },
    /// The first read of the pod answers this older copy (the read raced a write another
    /// writer made); later reads answer the stored pod.
    StaleFirstRead(parking_lot::Mutex<Option<device_numa_extender::model::pod::Pod>>),
    /// Like `StaleFirstRead`, and the pod watch delivers the stored (bound) pod to `cluster`
    /// (set after the state is built) just as the binding arrives.
    StaleReadThenWatchCommitsOnBinding {
        stale: parking_lot::Mutex<Option<device_numa_extender::model::pod::Pod>>,
        cluster: std::sync::OnceLock<std::sync::Arc<device_numa_extender::cluster::ClusterState>>,
    },
}

/// A `PodApi` that serves and writes the stored pods (offline) with one [`Fault`], and counts
/// the writes it gets. The fake API server has no hook at these points.
struct FaultyPodApi {
    inner: device_numa_extender::scheduler::bind::OfflinePodApi,
    fault: Fault,
    writes: std::sync::atomic::AtomicUsize,
}

impl device_numa_extender::scheduler::bind::PodApi for FaultyPodApi {
    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> futures::future::BoxFuture<
        'a,
        Result<
            Option<device_numa_extender::model::pod::Pod>,
            device_numa_extender::scheduler::bind::ApiError,
        >,
    > {
        match &self.fault {
            Fault::LosesLeadershipOnRead(readiness) => readiness.set_leader(false),
            Fault::LeaseLapsesOnRead(readiness) => {
                readiness.set_leader_until(device_numa_extender::clock::BootInstant::now())
            }
            Fault::StaleFirstRead(stale)
            | Fault::StaleReadThenWatchCommitsOnBinding { stale, .. } => {
                if let Some(pod) = stale.lock().take() {
                    return Box::pin(async move { Ok(Some(pod)) });
                }
            }
            _ => {}
        }
        self.inner.get_pod(namespace, name)
    }
    fn patch_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        annotations: &'a std::collections::BTreeMap<String, Option<String>>,
    ) -> futures::future::BoxFuture<'a, Result<(), device_numa_extender::scheduler::bind::ApiError>>
    {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let patch =
            self.inner
                .patch_annotations(namespace, name, uid, resource_version, annotations);
        match &self.fault {
            Fault::LosesLeadershipOnPatch(readiness) => Box::pin(async move {
                let result = patch.await;
                readiness.set_leader(false);
                result
            }),
            _ => patch,
        }
    }
    fn create_binding<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        node: &'a str,
        annotations: &'a std::collections::BTreeMap<String, String>,
    ) -> futures::future::BoxFuture<'a, Result<(), device_numa_extender::scheduler::bind::ApiError>>
    {
        if let Fault::PanicsOnBinding = self.fault {
            panic!("injected: a bug in the bind task");
        }
        if let Fault::StaleReadThenWatchCommitsOnBinding { cluster, .. } = &self.fault {
            use futures::FutureExt;
            let stored = self
                .inner
                .get_pod(namespace, name)
                .now_or_never()
                .expect("the offline pod API answers at once")
                .unwrap()
                .unwrap();
            let record = device_numa_extender::cluster::PodRecord::from_pod(&stored).unwrap();
            cluster.get().unwrap().upsert_pod(None, &record);
        }

        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Fault::BindingHangs { started } = &self.fault {
            let started = started.clone();
            return Box::pin(async move {
                started.notify_one();
                futures::future::pending().await
            });
        }
        self.inner
            .create_binding(namespace, name, uid, resource_version, node, annotations)
    }
    fn binding_deadline(&self) -> std::time::Duration {
        // As a live API server's: a binding whose answer never came may land for a while.
        Duration::from_secs(3600)
    }
    fn confirmed_by_watch(&self) -> bool {
        false
    }
}

/// A service state over one node `n1` with 2 GPUs, no pods on it, whose pod API is a
/// [`FaultyPodApi`] storing `pod` with the fault `fault(readiness)`.
fn two_gpus_over_a_faulty_api(
    pod: &serde_json::Value,
    fault: impl FnOnce(std::sync::Arc<device_numa_extender::sync::Readiness>) -> Fault,
) -> (
    device_numa_extender::extender::AppState,
    std::sync::Arc<FaultyPodApi>,
) {
    use device_numa_extender::ops::inspect::load_cluster_file;
    use device_numa_extender::scheduler::ScoringConfig;
    use device_numa_extender::scheduler::bind::OfflinePodApi;
    use device_numa_extender::sync::file_source::ClusterFile;

    let loaded = load_cluster_file(ClusterFile {
        nodes: vec![serde_json::from_value(service::node("n1")).unwrap()],
        pods: Vec::new(),
        devices: vec![service::gpu_device("n1", 2, 1, &[])],
        topologies: Vec::new(),
        ..Default::default()
    });
    assert!(
        loaded.readiness.is_ready(),
        "{:?}",
        loaded.readiness.not_ready_reason()
    );
    // A resourceVersion, as an API server's pods have (the offline API moves it on each write).
    let mut pod = pod.clone();
    if pod["metadata"]["resourceVersion"].is_null() {
        pod["metadata"]["resourceVersion"] = serde_json::json!("1");
    }
    let api = std::sync::Arc::new(FaultyPodApi {
        inner: OfflinePodApi::new([serde_json::from_value(pod).unwrap()]),
        fault: fault(loaded.readiness.clone()),
        writes: std::sync::atomic::AtomicUsize::new(0),
    });
    let state = device_numa_extender::extender::AppState {
        scheduler: loaded.into_scheduler(api.clone(), ScoringConfig::default()),
        body_limit: 1 << 20,
    };
    (state, api)
}

/// Binds `pod` to `node` through the bind handler (as the HTTP route does, without HTTP);
/// the answer's `Error`.
async fn bind_through_the_handler(
    state: &device_numa_extender::extender::AppState,
    pod: &serde_json::Value,
    node: &str,
) -> String {
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    let body = axum::body::Body::from(service::binding_args(pod, node).to_string());
    let answer = device_numa_extender::extender::handlers::bind(
        axum::extract::State(state.clone()),
        headers,
        body,
    )
    .await;
    let answer: serde_json::Value = serde_json::from_slice(
        &axum::body::to_bytes(answer.into_body(), 1 << 20)
            .await
            .unwrap(),
    )
    .unwrap();
    answer["Error"].as_str().unwrap_or_default().to_string()
}

/// Filter's passing nodes for a pod asking for both of `n1`'s GPUs.
fn passing_for_both_gpus(state: &device_numa_extender::extender::AppState) -> Vec<String> {
    use device_numa_extender::extender::input::decode;
    use device_numa_extender::model::wire::ExtenderArgsRef;
    use device_numa_extender::scheduler::verbs;

    let both = service::pending("q", json!({"nvidia.com/gpu": "2"}));
    let body = serde_json::to_vec(&service::extender_args(&both, &["n1"])).unwrap();
    let result = verbs::filter(&state.scheduler, decode::<ExtenderArgsRef>(&body).unwrap());
    result
        .node_names
        .unwrap_or_default()
        .into_iter()
        .map(|n| n.into_owned())
        .collect()
}

fn binds_counted(state: &device_numa_extender::extender::AppState, outcome: &str) -> u64 {
    state
        .scheduler
        .metrics
        .binds
        .with_label_values(&[outcome])
        .get()
}

/// A bind whose replica loses leadership after the request was admitted writes nothing,
/// gives back the GPU its decision assumed, and counts `dne_binds_total{outcome="not_leader"}`.
/// (Over HTTP a standby answers "not ready" before bind runs, so only this interleaving
/// reaches that outcome.)
#[tokio::test]
async fn a_bind_that_loses_leadership_midway_writes_nothing_and_counts_not_leader() {
    use std::sync::atomic::Ordering;

    // The pending pod asks for one of n1's two GPUs.
    let pod = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    let (state, api) = two_gpus_over_a_faulty_api(&pod, Fault::LosesLeadershipOnRead);
    let error = bind_through_the_handler(&state, &pod, "n1").await;
    assert!(error.contains("not the leader"), "answer's error: {error}");
    assert_eq!(
        api.writes.load(Ordering::SeqCst),
        0,
        "a replica that is not the leader wrote"
    );
    assert_eq!(binds_counted(&state, "not_leader"), 1);
    assert_eq!(binds_counted(&state, "bound"), 0);
    // Nothing stays assumed: a pod asking for both GPUs still fits `n1`.
    assert_eq!(passing_for_both_gpus(&state), vec!["n1"]);
}

/// A bind task that panics after writing the pod's annotations answers an error naming an
/// internal error and counts `dne_binds_total{outcome="internal"}`. Its outcome is unknown,
/// so the GPU it assumed stays held (never handed out twice) until the expiry reads the pod,
/// finds it unbound, and releases it: the panic leaks nothing for good.
#[tokio::test]
async fn a_bind_task_that_panics_counts_internal_and_holds_its_gpu_until_expiry() {
    let pod = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    let (state, api) = two_gpus_over_a_faulty_api(&pod, |_| Fault::PanicsOnBinding);
    let error = bind_through_the_handler(&state, &pod, "n1").await;
    assert!(error.contains("internal error"), "answer's error: {error}");
    assert_eq!(binds_counted(&state, "internal"), 1);
    assert_eq!(binds_counted(&state, "bound"), 0);
    assert!(
        passing_for_both_gpus(&state).is_empty(),
        "the panicked bind's GPU was handed out again while its outcome is unknown"
    );
    // Expiry (any age) asks the API: the pod is not bound, but unchanged since the binding
    // was about to be sent, so it may still take it: held. Once the pod changes, released.
    assert_eq!(
        state.scheduler.binder.expire_assumed(Duration::ZERO).await,
        0
    );
    touch(&api, &pod).await;
    assert_eq!(
        state.scheduler.binder.expire_assumed(Duration::ZERO).await,
        1
    );
    assert_eq!(passing_for_both_gpus(&state), vec!["n1"]);
}

/// The stored pod's node, as the (offline) API holds it.
async fn stored_node(api: &FaultyPodApi, pod: &serde_json::Value) -> Option<String> {
    use device_numa_extender::scheduler::bind::PodApi;
    let name = pod["metadata"]["name"].as_str().unwrap();
    let namespace = pod["metadata"]["namespace"].as_str().unwrap();
    let stored = api.inner.get_pod(namespace, name).await.unwrap().unwrap();
    stored.node_name().map(str::to_string)
}

/// Issue 27: leadership is checked before every write, not once per bind. A replica that
/// loses it between the annotation patch and the binding never sends the binding, counts
/// `not_leader`, and gives the GPU back (nothing of ours can land: no binding was sent).
#[tokio::test]
async fn leadership_lost_after_the_patch_sends_no_binding() {
    use std::sync::atomic::Ordering;

    // A stale `resource-status` (an older writer's) that this bind removes before binding:
    // the one bind with two writes.
    let mut pod = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    pod["metadata"]["annotations"] =
        json!({"scheduling.koordinator.sh/resource-status": "{\"cpuset\":\"0\"}"});
    let (state, api) = two_gpus_over_a_faulty_api(&pod, Fault::LosesLeadershipOnPatch);
    let error = bind_through_the_handler(&state, &pod, "n1").await;
    assert!(error.contains("not the leader"), "answer's error: {error}");
    assert_eq!(
        api.writes.load(Ordering::SeqCst),
        1,
        "only the patch was sent"
    );
    assert_eq!(stored_node(&api, &pod).await, None, "a binding was sent");
    assert_eq!(binds_counted(&state, "not_leader"), 1);
    assert_eq!(passing_for_both_gpus(&state), vec!["n1"]);
}

/// Issue 27: a lease whose renewal deadline passed stops writes even though the election
/// task never ran again to clear the leader flag (stalled, or a suspended machine, which
/// the suspend-counting clock sees).
#[tokio::test]
async fn a_lapsed_lease_stops_writes_without_the_election_task() {
    use std::sync::atomic::Ordering;

    let pod = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    let (state, api) = two_gpus_over_a_faulty_api(&pod, Fault::LeaseLapsesOnRead);
    let error = bind_through_the_handler(&state, &pod, "n1").await;
    assert!(error.contains("not the leader"), "answer's error: {error}");
    assert_eq!(
        api.writes.load(Ordering::SeqCst),
        0,
        "a lapsed leader wrote"
    );
    assert_eq!(binds_counted(&state, "not_leader"), 1);
    assert!(
        !state.scheduler.readiness.is_ready(),
        "a lapsed leader answered ready"
    );
}

/// Issue 27: a binding in flight when leadership is lost is abandoned at once rather than
/// waited out (here it would never answer). Its outcome is unknown, so the GPU stays held
/// (never handed out twice) until the pod is read: the expiry then finds it unbound and, no
/// longer the leader, releases it without writing.
#[tokio::test]
async fn a_binding_in_flight_is_abandoned_when_leadership_is_lost_and_its_gpu_held() {
    let pod = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let (state, api) = two_gpus_over_a_faulty_api(&pod, |_| Fault::BindingHangs {
        started: started.clone(),
    });
    let bind = {
        let state = state.clone();
        let pod = pod.clone();
        tokio::spawn(async move { bind_through_the_handler(&state, &pod, "n1").await })
    };
    tokio::time::timeout(Duration::from_secs(60), started.notified())
        .await
        .expect("the binding was never sent");
    state.scheduler.readiness.set_leader(false);
    let error = tokio::time::timeout(Duration::from_secs(60), bind)
        .await
        .expect("the bind waited out a binding that never answers")
        .unwrap();
    assert!(error.contains("not the leader"), "answer's error: {error}");
    assert_eq!(state.scheduler.metrics.binds_fenced.get(), 1);
    assert_eq!(stored_node(&api, &pod).await, None);
    assert!(
        passing_for_both_gpus(&state).is_empty(),
        "the abandoned binding's GPU was handed out while it could still land"
    );
    // Unchanged, the pod could still take that binding: the expiry keeps the GPU held.
    assert_eq!(
        state.scheduler.binder.expire_assumed(Duration::ZERO).await,
        0
    );
    assert!(passing_for_both_gpus(&state).is_empty());
    // Once the pod changes, the binding's resourceVersion precondition can never match: the
    // expiry (no longer the leader, it writes nothing) releases it.
    touch(&api, &pod).await;
    assert_eq!(
        state.scheduler.binder.expire_assumed(Duration::ZERO).await,
        1
    );
    assert_eq!(passing_for_both_gpus(&state), vec!["n1"]);
}

/// Another write to the stored pod (kube-scheduler recording a failed attempt, say): it moves
/// the resourceVersion on.
async fn touch(api: &FaultyPodApi, pod: &serde_json::Value) {
    use device_numa_extender::scheduler::bind::PodApi;
    let annotations = std::collections::BTreeMap::from([(
        "example.com/touched".to_string(),
        Some("1".to_string()),
    )]);
    api.inner
        .patch_annotations(
            pod["metadata"]["namespace"].as_str().unwrap(),
            pod["metadata"]["name"].as_str().unwrap(),
            pod["metadata"]["uid"].as_str().unwrap(),
            None,
            &annotations,
        )
        .await
        .unwrap();
}

/// Issue 22 §2: the pod is bound to this node by another write (another scheduler, an old
/// leader, a late attempt of ours) after the bind read it unbound, and the pod watch commits it
/// here before the bind decides. Before the fix the decision replaced that committed entry with
/// an assumed one, the resourceVersion-guarded patch got 409, the re-read found the pod on this
/// node, the bind reported it "bound elsewhere" and released the entry: the pod's GPU was gone
/// from the ledger and the next pod was given it. Now the decision refuses to replace a
/// committed entry, writes nothing, and the pod keeps its GPU.
#[tokio::test]
async fn a_pod_bound_here_while_the_bind_decides_keeps_its_committed_gpu() {
    use device_numa_extender::cluster::PodRecord;
    use std::sync::atomic::Ordering;

    // What the other writer left: bound to n1 holding minor 0, at a newer resourceVersion.
    let mut bound = service::pod(
        "default",
        "p",
        "uid-p",
        json!({"nvidia.com/gpu": "1"}),
        Some("n1"),
        Some(&service::whole_gpus(&[0])),
    );
    bound["metadata"]["resourceVersion"] = json!("2");
    // What the bind read just before: the same pod, unbound.
    let mut stale = service::pod(
        "default",
        "p",
        "uid-p",
        json!({"nvidia.com/gpu": "1"}),
        None,
        None,
    );
    stale["metadata"]["resourceVersion"] = json!("1");
    let stale_pod = serde_json::from_value(stale.clone()).unwrap();
    let (state, api) = two_gpus_over_a_faulty_api(&bound, move |_| {
        Fault::StaleFirstRead(parking_lot::Mutex::new(Some(stale_pod)))
    });
    // The pod watch delivered the other writer's bind.
    let bound_pod: device_numa_extender::model::pod::Pod =
        serde_json::from_value(bound.clone()).unwrap();
    state
        .scheduler
        .cluster
        .upsert_pod(None, &PodRecord::from_pod(&bound_pod).unwrap());
    assert!(
        passing_for_both_gpus(&state).is_empty(),
        "the committed pod holds one of the two GPUs"
    );

    let error = bind_through_the_handler(&state, &stale, "n1").await;
    assert!(
        error.contains("by another write"),
        "answer's error: {error}"
    );
    // The committed GPU is still held: a pod asking for both GPUs does not fit.
    assert!(
        passing_for_both_gpus(&state).is_empty(),
        "the committed pod's GPU was released: the next pod would be given it"
    );
    assert_eq!(api.writes.load(Ordering::SeqCst), 0, "the bind wrote");
    assert_eq!(binds_counted(&state, "bound_meanwhile"), 1);
    assert_eq!(
        state
            .scheduler
            .metrics
            .bound_elsewhere
            .with_label_values(&["patch"])
            .get(),
        0,
        "a pod bound to this node is not bound elsewhere"
    );
    assert_eq!(stored_node(&api, &bound).await.as_deref(), Some("n1"));
}

/// Issue 22 §2, the other order: the watch commits the other writer's bind after this bind
/// decided (its assumed entry is replaced by the committed one) and as its binding is refused
/// (409, the resourceVersion moved). The re-read finds the pod on *this* node: counted as
/// `bound_meanwhile`, not "bound elsewhere", and releasing the bind's own entry leaves the
/// committed one alone.
#[tokio::test]
async fn a_pod_bound_here_while_the_bind_commits_keeps_its_committed_gpu() {
    // The other writer's allocation: half of GPU minor 1 (ours would be a whole GPU).
    let theirs = r#"{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}"#;
    let mut bound = service::pod(
        "default",
        "p",
        "uid-p",
        json!({"nvidia.com/gpu": "1"}),
        Some("n1"),
        Some(theirs),
    );
    bound["metadata"]["resourceVersion"] = json!("2");
    let mut stale = service::pod(
        "default",
        "p",
        "uid-p",
        json!({"nvidia.com/gpu": "1"}),
        None,
        None,
    );
    stale["metadata"]["resourceVersion"] = json!("1");
    let stale_pod = serde_json::from_value(stale.clone()).unwrap();
    let (state, api) =
        two_gpus_over_a_faulty_api(&bound, move |_| Fault::StaleReadThenWatchCommitsOnBinding {
            stale: parking_lot::Mutex::new(Some(stale_pod)),
            cluster: std::sync::OnceLock::new(),
        });
    let Fault::StaleReadThenWatchCommitsOnBinding { cluster, .. } = &api.fault else {
        unreachable!()
    };
    cluster.set(state.scheduler.cluster.clone()).ok().unwrap();
    assert_eq!(
        passing_for_both_gpus(&state),
        vec!["n1"],
        "nothing held yet"
    );

    let error = bind_through_the_handler(&state, &stale, "n1").await;
    assert!(
        error.contains("by another write"),
        "answer's error: {error}"
    );
    assert_eq!(binds_counted(&state, "bound_meanwhile"), 1);
    assert_eq!(binds_counted(&state, "bound_elsewhere"), 0);
    assert_eq!(
        state
            .scheduler
            .metrics
            .bound_elsewhere
            .with_label_values(&["patch"])
            .get(),
        0
    );
    assert!(
        passing_for_both_gpus(&state).is_empty(),
        "the committed pod's GPU share was released"
    );
}
