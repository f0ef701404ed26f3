//! Starting the real service in-process against a fake API server, talking HTTP to it, and
//! fixtures for the objects the service watches.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use device_numa_extender::app::Service;
use device_numa_extender::cli::{Cli, Command, ServeArgs};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::fake_apiserver::FakeApiServer;

/// `serve` flags for tests: loopback, random port, no shutdown delay, plus `extra`.
pub fn serve_args(extra: &[&str]) -> ServeArgs {
    let mut argv = vec![
        "device-numa-extender",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--shutdown-delay",
        "0s",
    ];
    // A fresh fake API server has had no binder before this one, so no binding can still be in
    // flight: starts skip the takeover window (a fresh pod list still lifts the start fence).
    // Tests of leadership and restarts keep the default.
    let elects = extra.iter().any(|f| {
        [
            "--leader-elect",
            "--follow-scheduler-lease",
            "--takeover-window",
        ]
        .iter()
        .any(|flag| f.starts_with(flag))
    });
    if !elects {
        argv.extend_from_slice(&["--takeover-window", "0s"]);
    }
    // Nothing allocates in a fake API server's scheduler memory: a DRA pool is the extender's
    // as soon as its rule is seen. Tests of the hand-over set their own (the last flag wins).
    argv.extend_from_slice(&["--dra-handover-grace", "0s"]);
    argv.extend_from_slice(extra);
    match Cli::try_parse_from(argv).expect("valid test flags").command {
        Command::Serve(args) => *args,
        _ => unreachable!("the argv above is a serve command"),
    }
}

/// Starts the service with the fake API server's in-process client.
pub async fn start(fake: &FakeApiServer, extra: &[&str]) -> Service {
    Service::start(serve_args(extra), Some(fake.client()))
        .await
        .expect("service starts")
}

// ---- a per-service API connection with faults ----------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Up,
    /// Requests never answer (a partition where packets are dropped).
    Hang,
    /// Requests answer 503 at once.
    Fail,
}

#[derive(Clone)]
pub struct Faults {
    state: Arc<Mutex<(Link, Duration)>>,
    /// Lease requests answered by [`Link::Fail`] (so a test can count retries, not time).
    failed_lease_requests: Arc<std::sync::atomic::AtomicUsize>,
    /// While true, bind writes wait before reaching the API server (a test orders events
    /// around a write it knows is in flight), and how many have started waiting.
    hold: Arc<tokio::sync::watch::Sender<bool>>,
    held_writes: Arc<std::sync::atomic::AtomicUsize>,
}

impl Faults {
    pub fn new() -> Self {
        Faults {
            state: Arc::new(Mutex::new((Link::Up, Duration::ZERO))),
            failed_lease_requests: Arc::default(),
            hold: Arc::new(tokio::sync::watch::channel(false).0),
            held_writes: Arc::default(),
        }
    }
    /// Holds this replica's bind writes (as [`Self::set_pod_write_delay`] delays them) until
    /// [`Self::release_writes`]: a write is then in flight for as long as the test says.
    pub fn hold_writes(&self) {
        self.hold.send_replace(true);
    }
    pub fn release_writes(&self) {
        self.hold.send_replace(false);
    }
    /// Bind writes that have reached the hold (whether still held or released since).
    pub fn held_writes(&self) -> usize {
        self.held_writes.load(std::sync::atomic::Ordering::SeqCst)
    }
    pub fn set_link(&self, link: Link) {
        self.state.lock().0 = link;
    }
    /// Delays this replica's bind writes: pod PATCHes and `pods/binding` POSTs (since issue
    /// 22 the binding is the write that carries the annotations).
    pub fn set_pod_write_delay(&self, d: Duration) {
        self.state.lock().1 = d;
    }
    pub fn failed_lease_requests(&self) -> usize {
        self.failed_lease_requests
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A kube client to the fake, in-process like [`FakeApiServer::client`], whose link can be
/// cut or slowed for the one service that uses it (the fake's own knobs hit every client).
pub fn faulty_client(fake: &FakeApiServer, faults: Faults) -> kube::Client {
    let router = fake.router();
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let router = router.clone();
        let faults = faults.clone();
        async move {
            let (link, patch_delay) = *faults.state.lock();
            match link {
                Link::Up => {}
                Link::Hang => futures::future::pending::<()>().await,
                Link::Fail => {
                    if req.uri().path().contains("/leases") {
                        faults
                            .failed_lease_requests
                            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                      "message": "injected", "reason": "ServiceUnavailable", "code": 503});
                    return Ok(http::Response::builder()
                        .status(503)
                        .header("content-type", "application/json")
                        .body(axum::body::Body::from(body.to_string()))
                        .unwrap());
                }
            }
            let bind_write = req.uri().path().contains("/pods/")
                && (req.method() == http::Method::PATCH
                    || (req.method() == http::Method::POST
                        && req.uri().path().ends_with("/binding")));
            if bind_write {
                tokio::time::sleep(patch_delay).await;
                if *faults.hold.borrow() {
                    faults
                        .held_writes
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let _ = faults.hold.subscribe().wait_for(|held| !*held).await;
                }
            }
            router.oneshot(req).await
        }
    });
    kube::Client::new(svc, "default")
}

impl Default for Faults {
    fn default() -> Self {
        Self::new()
    }
}

/// Starts the service on a [`faulty_client`].
pub async fn start_with(fake: &FakeApiServer, faults: &Faults, extra: &[&str]) -> Service {
    Service::start(serve_args(extra), Some(faulty_client(fake, faults.clone())))
        .await
        .expect("service starts")
}

/// A small HTTP/1 client for talking to a service on loopback.
#[derive(Clone)]
pub struct Http {
    client: HttpClient<HttpConnector, Full<Bytes>>,
    pub base: String,
}

impl Http {
    pub fn new(addr: SocketAddr) -> Self {
        Http {
            client: HttpClient::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{addr}"),
        }
    }

    /// Sends a raw request; returns status and the body parsed as JSON (or a JSON string).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> (u16, Value) {
        self.try_send(method, path, content_type, body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// Like [`Http::send`], but a refused or broken connection (a replica that stopped or was
    /// killed) is an `Err` instead of a panic.
    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<(u16, Value), String> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path));
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let req = req.body(Full::new(Bytes::from(body))).expect("request");
        let resp = tokio::time::timeout(Duration::from_secs(30), self.client.request(req))
            .await
            .map_err(|_| "HTTP request timed out".to_string())?
            .map_err(|e| format!("HTTP request: {e}"))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok((status, value))
    }

    /// `POST` that tolerates a dead replica.
    pub async fn try_post(&self, path: &str, body: &Value) -> Result<(u16, Value), String> {
        self.try_send(
            "POST",
            path,
            Some("application/json"),
            body.to_string().into_bytes(),
        )
        .await
    }

    /// `/readyz` status, or `None` when the replica does not answer.
    pub async fn ready_status(&self) -> Option<u16> {
        self.try_send("GET", "/readyz", None, Vec::new())
            .await
            .ok()
            .map(|(status, _)| status)
    }

    /// A GET that reports a connection failure instead of panicking (for polling a process
    /// that is still starting or already gone).
    pub async fn try_get(&self, path: &str) -> Option<(u16, Value)> {
        let req = hyper::Request::builder()
            .uri(format!("{}{}", self.base, path))
            .body(Full::new(Bytes::new()))
            .ok()?;
        let resp = tokio::time::timeout(Duration::from_secs(5), self.client.request(req))
            .await
            .ok()?
            .ok()?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Some((status, value))
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(
            "POST",
            path,
            Some("application/json"),
            body.to_string().into_bytes(),
        )
        .await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send("GET", path, None, Vec::new()).await
    }

    /// Polls `/readyz` until 200, failing the test after `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (status, body) = self.get("/readyz").await;
            if status == 200 {
                return body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not ready after {timeout:?}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Polls `cond` every 20 ms until true, failing the test after `timeout`.
pub async fn eventually<F: FnMut() -> bool>(timeout: Duration, what: &str, mut cond: F) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---- fixtures -------------------------------------------------------------------------------

pub fn node(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}
    })
}

/// A Device with `gpus` 80Gi GPUs, `per_numa` per NUMA node, two per PCIe switch;
/// `unhealthy` minors have `health: false`.
pub fn gpu_device(name: &str, gpus: i32, per_numa: i32, unhealthy: &[i32]) -> Value {
    let devices: Vec<Value> = (0..gpus)
        .map(|m| {
            json!({
                "type": "gpu", "id": format!("GPU-{name}-{m}"), "minor": m,
                "health": !unhealthy.contains(&m),
                "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
                              "koordinator.sh/gpu-memory-ratio": "100"},
                "topology": {"socketID": m / per_numa.max(1), "nodeID": m / per_numa.max(1),
                             "pcieID": format!("pci{}", m / 2), "busID": format!("0000:{:02x}:00.0", m)}
            })
        })
        .collect();
    json!({
        "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
        "metadata": {"name": name}, "spec": {"devices": devices}
    })
}

pub fn nrt(name: &str) -> Value {
    json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": name, "annotations": {
            "node.koordinator.sh/cpu-topology": "{\"detail\":[{\"id\":0,\"core\":0,\"socket\":0,\"node\":0},{\"id\":1,\"core\":1,\"socket\":0,\"node\":0}]}"
        }},
        "zones": [{"name": "node-0", "type": "Node",
                   "resources": [{"name": "cpu", "capacity": "2", "allocatable": "2", "available": "2"}]}]
    })
}

/// A pod requesting `requests` (a JSON object of resource -> quantity), optionally bound to
/// `node` and carrying a `device-allocated` annotation.
pub fn pod(
    ns: &str,
    name: &str,
    uid: &str,
    requests: Value,
    node: Option<&str>,
    allocated: Option<&str>,
) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"schedulerName": "device-numa-scheduler",
                 "containers": [{"name": "main", "image": "app:1",
                                 "resources": {"requests": requests.clone(), "limits": requests}}]},
        "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    if let Some(a) = allocated {
        p["metadata"]["annotations"] = json!({"scheduling.koordinator.sh/device-allocated": a});
    }
    p
}

/// A Node and its Device with `gpus` GPUs over two NUMA nodes; `unhealthy` minors are sick.
pub fn add_gpu_node(fake: &FakeApiServer, name: &str, gpus: i32, unhealthy: &[i32]) {
    fake.create(super::Kind::Node, node(name)).unwrap();
    fake.create(
        super::Kind::Device,
        gpu_device(name, gpus, (gpus / 2).max(1), unhealthy),
    )
    .unwrap();
}

/// A pending pod in namespace `ml` with uid `uid-<name>`.
pub fn pending(name: &str, requests: Value) -> Value {
    pod("ml", name, &format!("uid-{name}"), requests, None, None)
}

/// What kube-scheduler adds to each candidate's total from a prioritize answer, divided by
/// its `weight × 10`: the listed score, or 0 for a host the answer leaves out (v1.37
/// `prioritizeNodes`). The answer lists only hosts whose score is above the lowest one, so
/// tests compare candidates through this, never by the answer's length. Panics on a
/// listed host that was not a candidate, or one listed twice.
pub fn scores_as_added(answer: &Value, candidates: &[&str]) -> Vec<(String, i64)> {
    let listed = answer
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {answer}"));
    let mut seen = std::collections::BTreeSet::new();
    for h in listed {
        let host = h["Host"]
            .as_str()
            .unwrap_or_else(|| panic!("no Host: {answer}"));
        assert!(
            candidates.contains(&host),
            "{host} was not a candidate: {answer}"
        );
        assert!(seen.insert(host), "{host} listed twice: {answer}");
        assert!(h["Score"].is_i64(), "an integer score: {answer}");
    }
    candidates
        .iter()
        .map(|c| {
            let score = listed
                .iter()
                .find(|h| h["Host"] == *c)
                .and_then(|h| h["Score"].as_i64())
                .unwrap_or(0);
            (c.to_string(), score)
        })
        .collect()
}

/// The extender's filter/prioritize body for `pod` over `nodes` (names mode).
pub fn extender_args(pod: &Value, nodes: &[&str]) -> Value {
    json!({"Pod": pod, "Nodes": null, "NodeNames": nodes})
}

/// The extender's bind body.
pub fn binding_args(pod: &Value, node: &str) -> Value {
    json!({
        "PodName": pod["metadata"]["name"], "PodNamespace": pod["metadata"]["namespace"],
        "PodUID": pod["metadata"]["uid"], "Node": node
    })
}

// ---- cache comparison -----------------------------------------------------------------------

/// The kinds a service started with default flags watches, in the fake's terms.
pub const WATCHED: [super::Kind; 4] = [
    super::Kind::Node,
    super::Kind::Pod,
    super::Kind::Device,
    super::Kind::NodeResourceTopology,
];

/// Waits until every watched kind has an open watch: kube's watcher opens it only after
/// `InitDone`, so mutating before this could land in the list instead of the watch.
pub async fn wait_for_all_watches(fake: &FakeApiServer, timeout: Duration) {
    for kind in WATCHED {
        assert!(
            fake.wait_for_watches(kind, 1, timeout).await,
            "no {kind:?} watch opened within {timeout:?}"
        );
    }
}

/// `ClusterState::debug_dump()` as compared between services: everything in the cache is a
/// function of current API state, so nothing is left out.
pub fn comparable(
    snapshot: std::collections::BTreeMap<String, Value>,
) -> std::collections::BTreeMap<String, Value> {
    snapshot
}

/// The cache a fresh service builds from the fake's current state.
pub async fn fresh_snapshot(
    fake: &FakeApiServer,
    extra: &[&str],
) -> std::collections::BTreeMap<String, Value> {
    let svc = start(fake, extra).await;
    Http::new(svc.addr)
        .wait_ready(Duration::from_secs(30))
        .await;
    let snap = comparable(svc.state.scheduler.cluster.debug_dump());
    svc.shutdown().await.expect("fresh service shuts down");
    snap
}

/// A readable account of how two snapshots differ (first few nodes only).
pub fn snapshot_diff(
    got: &std::collections::BTreeMap<String, Value>,
    want: &std::collections::BTreeMap<String, Value>,
) -> String {
    let mut out = String::new();
    let names: std::collections::BTreeSet<&String> = got.keys().chain(want.keys()).collect();
    for name in names
        .into_iter()
        .filter(|n| got.get(*n) != want.get(*n))
        .take(5)
    {
        out.push_str(&format!(
            "\nnode {name}:\n  live:  {}\n  fresh: {}",
            got.get(name).map_or("<absent>".into(), Value::to_string),
            want.get(name).map_or("<absent>".into(), Value::to_string),
        ));
    }
    out
}

/// Waits until the live cache equals `want`, failing with the difference after `timeout`.
pub async fn eventually_equal(
    cluster: &device_numa_extender::cluster::ClusterState,
    want: &std::collections::BTreeMap<String, Value>,
    timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let got = comparable(cluster.debug_dump());
        if &got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "live cache differs from a fresh bootstrap after {timeout:?}:{}",
            snapshot_diff(&got, want)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// What the cache holds, counted per kind (cheap enough for 50,000 pods).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheCounts {
    pub nodes: usize,
    pub pods: usize,
    pub devices: usize,
    pub topologies: usize,
}

pub fn cache_counts(cluster: &device_numa_extender::cluster::ClusterState) -> CacheCounts {
    let mut c = CacheCounts::default();
    for name in cluster.node_names() {
        if let Some(entry) = cluster.node(&name) {
            let s = entry.read();
            c.nodes += usize::from(s.node.is_some());
            c.pods += s.pods.len();
            c.devices += usize::from(s.device_ledger().devices().is_some());
            c.topologies += usize::from(s.topology.is_some());
        }
    }
    c
}

/// The `device-allocated` annotation for whole 80Gi GPUs at `minors`.
pub fn whole_gpus(minors: &[i32]) -> String {
    let entries: Vec<Value> = minors
        .iter()
        .map(|m| {
            json!({"minor": m, "resources": {"koordinator.sh/gpu-core": "100",
                "koordinator.sh/gpu-memory": "80Gi", "koordinator.sh/gpu-memory-ratio": "100"}})
        })
        .collect();
    json!({ "gpu": entries }).to_string()
}
