//! GPU / device-sharing end-to-end tests: the real service, over HTTP, against the fake API
//! server (and the real binary in offline mode). Shared helpers live here; each submodule is
//! one theme.
//!
//! Every wait has a timeout: HTTP calls (30 s in [`Http`]), `eventually`, and the joins of
//! concurrent bursts.

mod bind_read;
mod concurrency;
mod defects;
mod expiry;
mod explain;
mod offline;
mod restart;
mod retry_rollback;
mod verbs;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use device_numa_extender::app::Service;
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::support::service::{self, Http};
use crate::support::{FakeApiServer, Kind};

pub const DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";
pub const RATIO: &str = "koordinator.sh/gpu-memory-ratio";
pub const WAIT: Duration = Duration::from_secs(10);

/// A running service against a fake API server.
pub struct Env {
    pub fake: FakeApiServer,
    pub svc: Service,
    pub http: Http,
}

impl Env {
    /// Starts the service with the fake's in-process client, waits for `/readyz` and for the
    /// pod watch to be open (koordinator #3113: synced is not the same as watching).
    pub async fn start(fake: &FakeApiServer, extra: &[&str]) -> Env {
        Self::start_with(fake, fake.client(), extra).await
    }

    pub async fn start_with(fake: &FakeApiServer, client: kube::Client, extra: &[&str]) -> Env {
        let svc = Service::start(service::serve_args(extra), Some(client))
            .await
            .expect("service starts");
        let http = Http::new(svc.addr);
        http.wait_ready(WAIT).await;
        assert!(
            fake.wait_for_watches(Kind::Pod, 1, WAIT).await,
            "the pod watch never opened"
        );
        Env {
            fake: fake.clone(),
            svc,
            http,
        }
    }

    /// Binds over HTTP: `Ok` when `Error` is empty, else the error text.
    pub async fn bind(&self, pod: &Value, node: &str) -> Result<(), String> {
        bind(&self.http, pod, node).await
    }

    /// `/debug/nodes/{node}` → `state.devices` (the ledger view), `Null` if the node is unknown.
    pub async fn ledger(&self, node: &str) -> Value {
        ledger(&self.http, node).await
    }

    pub async fn filter(&self, pod: &Value, nodes: &[&str]) -> Value {
        let (status, body) = self
            .http
            .post("/filter", &service::extender_args(pod, nodes))
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Waits until the pod watch has turned the uid's entry on `node` into `committed`.
    pub async fn wait_committed(&self, node: &str, uid: &str) {
        let cluster = self.svc.state.scheduler.cluster.clone();
        service::eventually(WAIT, &format!("{uid} committed on {node}"), || {
            cluster
                .debug_dump()
                .get(node)
                .map(|n| n["devices"]["entries"][uid]["state"].clone())
                == Some(json!("committed"))
        })
        .await;
    }

    /// The value of a counter (summed over label sets whose rendering contains `labels`).
    pub async fn metric(&self, name: &str, labels: &str) -> f64 {
        let (status, body) = self.http.get("/metrics").await;
        assert_eq!(status, 200);
        metric_value(body.as_str().unwrap_or_default(), name, labels)
    }
}

/// Takes the service's pod watch down and keeps it down (new watch starts and lists answer
/// 500: the pod-cache fence makes the service relist at once) until [`pod_watch_up`].
pub async fn pod_watch_down(fake: &FakeApiServer) {
    fake.fail_watch_start(Kind::Pod, 500, 1_000_000);
    fake.fail_lists(Kind::Pod, 500, 1_000_000);
    fake.close_watches();
    let f = fake.clone();
    service::eventually(WAIT, "the pod watch to close", move || {
        f.open_watches(Kind::Pod) == 0
    })
    .await;
}

/// Ends [`pod_watch_down`]: watch starts and lists succeed again.
pub fn pod_watch_up(fake: &FakeApiServer) {
    fake.fail_watch_start(Kind::Pod, 500, 0);
    fake.fail_lists(Kind::Pod, 500, 0);
}

/// A bind that *decides* while the pod watch is up and *completes* while it is down, so the
/// service never sees the pod bound: its entry stays assumed. (A bind that would decide during
/// a known pod-watch gap is refused by the pod-cache fence, so this is the only way a bind
/// meets a gap.) The commit write (the binding) is held until the watch is down, then released.
/// `faults` must belong to the client the service was started with.
pub async fn bind_across_pod_watch_outage(
    env: &Env,
    faults: &Faults,
    pod: &Value,
    node: &str,
) -> Result<(), String> {
    let held = HeldBind::start(env, faults, pod, node).await;
    pod_watch_down(&env.fake).await;
    held.finish().await
}

/// A bind whose commit write (the binding) the API server holds: it has decided and recorded its
/// assumed entry (waited for), and is still in flight until [`HeldBind::finish`].
/// `faults` must belong to the client the service was started with.
pub struct HeldBind {
    release: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl HeldBind {
    pub async fn start(env: &Env, faults: &Faults, pod: &Value, node: &str) -> HeldBind {
        let release = Arc::new(tokio::sync::Notify::new());
        faults.push(Fault::HoldCommit(release.clone()));
        let task = {
            let http = env.http.clone();
            let (pod, node) = (pod.clone(), node.to_string());
            tokio::spawn(async move { bind(&http, &pod, &node).await })
        };
        let cluster = env.svc.state.scheduler.cluster.clone();
        let u = uid(pod);
        service::eventually(WAIT, "the bind to record its assumed entry", || {
            cluster
                .debug_dump()
                .get(node)
                .map(|n| n["devices"]["entries"][&u]["state"].clone())
                == Some(json!("assumed"))
        })
        .await;
        HeldBind { release, task }
    }

    /// Lets the write through and returns the bind's answer.
    pub async fn finish(self) -> Result<(), String> {
        self.release.notify_one();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the held bind never answered")
            .expect("the bind task panicked")
    }
}

pub async fn bind(http: &Http, pod: &Value, node: &str) -> Result<(), String> {
    let (status, body) = http.post("/bind", &service::binding_args(pod, node)).await;
    assert_eq!(status, 200, "bind answers 200 even on failure: {body}");
    match body["Error"].as_str() {
        Some("") => Ok(()),
        Some(e) => Err(e.to_string()),
        None => panic!("bind result without Error field: {body}"),
    }
}

pub async fn ledger(http: &Http, node: &str) -> Value {
    let (status, body) = http.get(&format!("/debug/nodes/{node}")).await;
    match status {
        200 => body["state"]["devices"].clone(),
        404 => Value::Null,
        s => panic!("/debug/nodes/{node} answered {s}: {body}"),
    }
}

pub fn metric_value(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        // Label values may contain spaces ("missing metadata.uid"): the value is the last token.
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let base = series.split('{').next().unwrap_or("");
            base == name && series.contains(labels)
        })
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

pub use crate::support::service::{add_gpu_node, pending};

pub fn whole_gpus(n: u32) -> Value {
    json!({"nvidia.com/gpu": n.to_string()})
}

pub fn ratio(r: u32) -> Value {
    json!({RATIO: r.to_string()})
}

pub fn uid(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().unwrap().to_string()
}

pub fn name(pod: &Value) -> String {
    pod["metadata"]["name"].as_str().unwrap().to_string()
}

/// The pod's `device-allocated` annotation in the fake API server.
pub fn annotation_of(fake: &FakeApiServer, pod: &Value) -> Option<String> {
    let p = fake.get(Kind::Pod, "ml", &name(pod))?;
    p["metadata"]["annotations"][DEVICE_ALLOCATED]
        .as_str()
        .map(str::to_owned)
}

/// What kube-scheduler does to a pod whose bind failed (it records the failure on it): any
/// write, which moves the pod's resourceVersion on and so fences out a late binding sent
/// before it (issue 22).
pub fn record_failed_attempt(fake: &FakeApiServer, name: &str) {
    fake.patch_merge(
        Kind::Pod,
        "ml",
        name,
        json!({"metadata": {"annotations": {"example.com/scheduling-failed": "1"}}}),
    )
    .expect("the failure is recorded on the pod");
}

pub fn node_of(fake: &FakeApiServer, pod: &Value) -> Option<String> {
    let p = fake.get(Kind::Pod, "ml", &name(pod))?;
    p["spec"]["nodeName"].as_str().map(str::to_owned)
}

/// `(minor, memory ratio)` of every gpu entry of an annotation.
pub fn gpu_shares(annotation: &str) -> Vec<(i64, i64)> {
    let v: Value = serde_json::from_str(annotation).expect("annotation is JSON");
    v["gpu"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let minor = e["minor"].as_i64().expect("minor");
            let r = e["resources"][RATIO]
                .as_str()
                .and_then(|s| s.parse().ok())
                .expect("ratio recorded");
            (minor, r)
        })
        .collect()
}

/// Checks a ledger view (`LedgerView` JSON) never puts more than 100% of a GPU on one minor,
/// counted both from the per-minor `used` and from the recorded entries.
pub fn check_capacity(view: &Value) -> Result<(), String> {
    let mut from_entries: BTreeMap<i64, i64> = BTreeMap::new();
    for (uid, e) in view["entries"].as_object().into_iter().flatten() {
        if let Some(a) = e["allocation"].as_str() {
            for (minor, r) in gpu_shares(a) {
                *from_entries.entry(minor).or_default() += r;
            }
        } else if e["malformed"].is_null() {
            return Err(format!(
                "entry {uid} has neither allocation nor malformed: {e}"
            ));
        }
    }
    for (minor, sum) in &from_entries {
        if *sum > 100 {
            return Err(format!("minor {minor}: entries hold {sum}% > 100%: {view}"));
        }
    }
    for (minor, m) in view["types"]["gpu"].as_object().into_iter().flatten() {
        let used: i64 = m["used"][RATIO]
            .as_str()
            .map(|s| s.parse().expect("ratio"))
            .unwrap_or(0);
        if used > 100 {
            return Err(format!("minor {minor}: used {used}% > 100%"));
        }
        let minor: i64 = minor.parse().expect("minor key");
        let want = from_entries.get(&minor).copied().unwrap_or(0);
        if used != want {
            return Err(format!(
                "minor {minor}: used {used}% but entries add up to {want}%"
            ));
        }
    }
    Ok(())
}

/// Drops the time-dependent fields of a debug view so two caches can be compared.
pub fn without_timings(mut v: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("assumed_for_ms");
                m.values_mut().for_each(walk);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

// ---- API faults the fake's knobs cannot express ------------------------------------------

/// One fault, consumed by the first request it applies to.
#[derive(Clone, Debug)]
pub enum Fault {
    /// `POST pods/{name}/binding` answers 500 without doing anything.
    RefuseBinding,
    /// The binding is applied, then the answer is lost: the client sees 504 (what a real API
    /// server answers when a request outlives its timeout while the write may still commit).
    LoseBindingAnswer,
    /// [`Fault::LoseBindingAnswer`], and the next read of the pod fails too (the API server
    /// is briefly unreachable), so the binder cannot tell whether the binding took effect.
    LoseBindingAnswerAndNextRead,
    /// `GET pods/{name}` answers 503.
    RefuseRead,
    /// Right before the bind's commit write of a pod (its first write: the binding, which
    /// carries the annotations, or a stale-annotation removal before it), another scheduler
    /// binds the pod to this node.
    BindElsewhereBeforeCommit(String),
    /// The bind's commit write of a pod waits until the notify fires (an API server that is
    /// slow for as long as the test needs).
    HoldCommit(Arc<tokio::sync::Notify>),
    /// Right before the bind's commit write of a pod applies, another scheduler annotates the
    /// pod with `annotation` and binds it to `node` (our bind's read is then stale).
    AnnotateAndBindElsewhereBeforeCommit { node: String, annotation: String },
    /// Right before the bind's commit write of a pod applies, something else changes the pod
    /// (an unrelated annotation): only our resourceVersion precondition is stale.
    TouchBeforeCommit,
    /// `POST pods/{name}/binding` answers 500 without doing anything, and the next `reads`
    /// reads of that pod answer 503: the binder cannot tell what happened.
    RefuseBindingThenReads(usize),
    /// `GET pods/{name}` of this pod answers 503.
    RefuseReadOf(String),
    /// The next cluster-wide pod list is served (its snapshot taken), `listed` is notified,
    /// and the answer is held back until `release` fires: writes in between are not in it.
    HoldPodList {
        listed: Arc<tokio::sync::Notify>,
        release: Arc<tokio::sync::Notify>,
    },
}

#[derive(Clone)]
pub struct Faults {
    fake: FakeApiServer,
    queue: Arc<Mutex<Vec<Fault>>>,
}

impl Faults {
    pub fn push(&self, fault: Fault) {
        self.queue.lock().push(fault);
    }
    pub fn pending(&self) -> usize {
        self.queue.lock().len()
    }
}

/// A kube client to the fake with a fault-injecting layer in front of it.
pub fn faulty_client(fake: &FakeApiServer) -> (kube::Client, Faults) {
    let faults = Faults {
        fake: fake.clone(),
        queue: Arc::new(Mutex::new(Vec::new())),
    };
    let router = fake
        .router()
        .layer(axum::middleware::from_fn_with_state(faults.clone(), inject));
    (kube::Client::new(router, "default"), faults)
}

fn status(code: u16, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": "InternalError", "code": code});
    (
        axum::http::StatusCode::from_u16(code).unwrap(),
        axum::Json(body),
    )
        .into_response()
}

async fn inject(State(faults): State<Faults>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    // /api/v1/namespaces/{ns}/pods/{name}[/binding]
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let pod = match parts.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name, rest @ ..] => Some((
            ns.to_string(),
            name.to_string(),
            rest.first().copied() == Some("binding"),
        )),
        _ => None,
    };
    let is_pod_list = method == axum::http::Method::GET
        && parts.as_slice() == ["api", "v1", "pods"]
        && !request.uri().query().unwrap_or("").contains("watch=");
    if is_pod_list {
        let fault = {
            let mut q = faults.queue.lock();
            let pos = q
                .iter()
                .position(|f| matches!(f, Fault::HoldPodList { .. }));
            pos.map(|i| q.remove(i))
        };
        if let Some(Fault::HoldPodList { listed, release }) = fault {
            let response = next.run(request).await;
            listed.notify_one();
            release.notified().await;
            return response;
        }
    }
    let Some((ns, name, is_binding)) = pod else {
        return next.run(request).await;
    };
    let is_patch = method == axum::http::Method::PATCH && !is_binding;
    let is_bind = method == axum::http::Method::POST && is_binding;
    // A bind's writes: the binding (carrying the annotations), or a removal patch before it.
    let is_commit = is_patch || is_bind;
    let is_read = method == axum::http::Method::GET && !is_binding;
    let fault = {
        let mut q = faults.queue.lock();
        let pos = q.iter().position(|f| match f {
            Fault::RefuseBinding
            | Fault::LoseBindingAnswer
            | Fault::LoseBindingAnswerAndNextRead => is_bind,
            Fault::RefuseRead => is_read,
            Fault::RefuseReadOf(n) => is_read && *n == name,
            Fault::RefuseBindingThenReads(_) => is_bind,
            Fault::HoldPodList { .. } => false,
            Fault::BindElsewhereBeforeCommit(_)
            | Fault::HoldCommit(_)
            | Fault::AnnotateAndBindElsewhereBeforeCommit { .. }
            | Fault::TouchBeforeCommit => is_commit,
        });
        pos.map(|i| q.remove(i))
    };
    match fault {
        None => next.run(request).await,
        Some(Fault::RefuseBinding) => status(500, "injected: binding refused"),
        Some(Fault::LoseBindingAnswer) => {
            let response = next.run(request).await;
            assert!(
                response.status().is_success(),
                "binding should have applied"
            );
            status(
                504,
                "injected: the binding committed but its answer was lost",
            )
        }
        Some(Fault::LoseBindingAnswerAndNextRead) => {
            let response = next.run(request).await;
            assert!(
                response.status().is_success(),
                "binding should have applied"
            );
            faults.push(Fault::RefuseRead);
            status(
                504,
                "injected: the binding committed but its answer was lost",
            )
        }
        Some(Fault::RefuseRead) => status(503, "injected: API server unavailable"),
        Some(Fault::BindElsewhereBeforeCommit(node)) => {
            faults
                .fake
                .bind_pod(&ns, &name, &node)
                .expect("the competing bind succeeds");
            next.run(request).await
        }
        Some(Fault::HoldCommit(release)) => {
            release.notified().await;
            next.run(request).await
        }
        Some(Fault::AnnotateAndBindElsewhereBeforeCommit { node, annotation }) => {
            faults
                .fake
                .patch_merge(
                    Kind::Pod,
                    &ns,
                    &name,
                    json!({"metadata": {"annotations": {DEVICE_ALLOCATED: annotation}}}),
                )
                .expect("the competing scheduler annotates the pod");
            faults
                .fake
                .bind_pod(&ns, &name, &node)
                .expect("the competing bind succeeds");
            next.run(request).await
        }
        Some(Fault::TouchBeforeCommit) => {
            faults
                .fake
                .patch_merge(
                    Kind::Pod,
                    &ns,
                    &name,
                    // A new value each time, so every touch is a real write (new RV).
                    json!({"metadata": {"annotations": {
                        "example.com/touched": faults.fake.current_rv().to_string()
                    }}}),
                )
                .expect("the unrelated write succeeds");
            next.run(request).await
        }
        Some(Fault::RefuseBindingThenReads(reads)) => {
            for _ in 0..reads {
                faults.push(Fault::RefuseReadOf(name.clone()));
            }
            status(500, "injected: binding failed, outcome unknown")
        }
        Some(Fault::RefuseReadOf(_)) => status(503, "injected: API server unavailable"),
        Some(Fault::HoldPodList { .. }) => unreachable!("matched only on pod lists"),
    }
}
