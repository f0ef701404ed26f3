//! In-process fake Kubernetes API server that speaks the real list/watch protocol to the real
//! `kube::Client` (DESIGN.md §6; rust-stack.md §2–§3 for the semantics it reproduces).
//!
//! State model, mirroring etcd + the apiserver watch cache:
//! * one global resourceVersion counter (u64, rendered as a string); every effective write
//!   bumps it and appends `(rv, type, object, previous object)` to that kind's event log;
//! * watches replay the log from their `resourceVersion` and then receive live events, all
//!   pushed under the same lock, so no event is lost or duplicated between replay and live;
//! * a compaction floor: a watch from an RV below it gets an in-stream `ERROR` 410 (what a real
//!   server sends, and the only 410 form that makes kube's watcher relist), and continue tokens
//!   minted below it answer an HTTP 410 on the list.
//!
//! Usage:
//! ```ignore
//! let fake = FakeApiServer::new();
//! fake.create(Kind::Node, json!({"metadata": {"name": "n1"}}))?;
//! let pods: kube::Api<Pod> = kube::Api::all(fake.client()); // in-process, no port
//! // ... start the code under test; kube's watcher opens its watch only once it is polled
//! // past InitDone, so drive it in a task and wait before mutating:
//! assert!(fake.wait_for_watches(Kind::Pod, 1, Duration::from_secs(5)).await);
//! fake.set_pod_phase("default", "p", "Succeeded")?;
//! // Black-box runs of the binary:
//! let served = fake.serve().await;
//! served.write_kubeconfig(dir.path().join("kubeconfig"))?; // --kubeconfig <that path>
//! ```
//!
//! Known deviations from a real API server (kept deliberately small):
//! * `labelSelector` is accepted and ignored (the extender only uses field selectors).
//! * `application/strategic-merge-patch+json` is applied as a JSON merge patch: lists are
//!   replaced, not merged by key. Server-side apply (`apply-patch+yaml`) answers 415.
//! * No spec/status split: `PUT`/`PATCH` on the main resource also change `status`, and the
//!   `status` subresource accepts whole-object changes. No admission, defaulting or validation
//!   beyond identity fields; no graceful deletion or finalizers (DELETE removes immediately).
//! * A client-supplied `metadata.uid` on create is kept (tests want deterministic uids); a real
//!   server always assigns a fresh one.
//! * A watch without `resourceVersion` (or with "0") starts with synthetic `ADDED` events for
//!   the current state, as a real server does; `sendInitialEvents=true` adds the
//!   `k8s.io/initial-events-end` bookmark. A `resourceVersion` newer than the current one is
//!   not rejected (a real server waits up to 3 s and then answers "Too large resource version").
//! * List `resourceVersion`/`resourceVersionMatch` parameters are ignored: every first page is
//!   a consistent read at the current RV (kube's default `MostRecent` semantic).
//! * No-op writes (the stored object would not change) neither bump the RV nor emit an event,
//!   which *is* real behaviour, but may surprise a test that waits for an event.
//! * Fault knobs that fail writes apply only to HTTP requests, never to the Rust-side helpers
//!   used for test setup. Per-verb faults ([`FakeApiServer::push_write_fault`]) can also apply a
//!   write and then lose its answer (error status, cut connection, or a hang past the client's
//!   patience), which a real server does on an etcd timeout or a dropped connection.

mod handlers;
mod patch;
mod selector;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};

/// The kinds the extender touches. The first entry of [`Kind::versions`] is the storage
/// (preferred) version; objects are stored with that `apiVersion` and rewritten when served
/// through another version (NodeResourceTopology v1alpha1), standing in for conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Node,
    Pod,
    Device,
    NodeResourceTopology,
    Lease,
    DeviceClass,
    ResourceSlice,
    ResourceClaim,
    DeviceTaintRule,
    PodDisruptionBudget,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Node,
        Kind::Pod,
        Kind::Device,
        Kind::NodeResourceTopology,
        Kind::Lease,
        Kind::DeviceClass,
        Kind::ResourceSlice,
        Kind::ResourceClaim,
        Kind::DeviceTaintRule,
        Kind::PodDisruptionBudget,
    ];

    fn idx(self) -> usize {
        self as usize
    }

    /// API group; "" is the core group.
    pub fn group(self) -> &'static str {
        match self {
            Kind::Node | Kind::Pod => "",
            Kind::Device => "scheduling.koordinator.sh",
            Kind::NodeResourceTopology => "topology.node.k8s.io",
            Kind::Lease => "coordination.k8s.io",
            Kind::DeviceClass
            | Kind::ResourceSlice
            | Kind::ResourceClaim
            | Kind::DeviceTaintRule => "resource.k8s.io",
            Kind::PodDisruptionBudget => "policy",
        }
    }

    pub fn versions(self) -> &'static [&'static str] {
        match self {
            Kind::Node | Kind::Pod | Kind::Lease | Kind::PodDisruptionBudget => &["v1"],
            Kind::DeviceClass
            | Kind::ResourceSlice
            | Kind::ResourceClaim
            | Kind::DeviceTaintRule => &["v1"],
            Kind::Device => &["v1alpha1"],
            Kind::NodeResourceTopology => &["v1alpha2", "v1alpha1"],
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            Kind::Node => "nodes",
            Kind::Pod => "pods",
            Kind::Device => "devices",
            Kind::NodeResourceTopology => "noderesourcetopologies",
            Kind::Lease => "leases",
            Kind::DeviceClass => "deviceclasses",
            Kind::ResourceSlice => "resourceslices",
            Kind::ResourceClaim => "resourceclaims",
            Kind::DeviceTaintRule => "devicetaintrules",
            Kind::PodDisruptionBudget => "poddisruptionbudgets",
        }
    }

    pub fn kind_name(self) -> &'static str {
        match self {
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Device => "Device",
            Kind::NodeResourceTopology => "NodeResourceTopology",
            Kind::Lease => "Lease",
            Kind::DeviceClass => "DeviceClass",
            Kind::ResourceSlice => "ResourceSlice",
            Kind::ResourceClaim => "ResourceClaim",
            Kind::DeviceTaintRule => "DeviceTaintRule",
            Kind::PodDisruptionBudget => "PodDisruptionBudget",
        }
    }

    pub fn namespaced(self) -> bool {
        matches!(
            self,
            Kind::Pod | Kind::Lease | Kind::ResourceClaim | Kind::PodDisruptionBudget
        )
    }

    /// `apiVersion` for a given version of this kind's group.
    pub fn api_version_for(self, version: &str) -> String {
        if self.group().is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group(), version)
        }
    }

    /// Storage `apiVersion`.
    pub fn api_version(self) -> String {
        self.api_version_for(self.versions()[0])
    }

    /// For `kube::Api<DynamicObject>` on the CRD kinds, at a given served version.
    pub fn api_resource_at(self, version: &str) -> kube::core::ApiResource {
        let gvk = kube::core::GroupVersionKind::gvk(self.group(), version, self.kind_name());
        kube::core::ApiResource::from_gvk_with_plural(&gvk, self.plural())
    }

    /// [`Kind::api_resource_at`] the storage version.
    pub fn api_resource(self) -> kube::core::ApiResource {
        self.api_resource_at(self.versions()[0])
    }

    fn lookup(group: &str, version: &str, plural: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.group() == group && k.plural() == plural && k.versions().contains(&version))
    }
}

/// A Kubernetes `Status` failure, returned both over HTTP (as the body) and by the Rust-side
/// helpers so tests can assert on the same codes the client would see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
        }
    }

    pub fn bad_request(msg: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", msg)
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::new(422, "Invalid", msg)
    }

    pub fn not_found(kind: Kind, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", resource_label(kind)),
        )
    }

    pub fn conflict(resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {resource} {name:?}: {why}"),
        )
    }

    pub fn expired(msg: impl Into<String>) -> Self {
        Self::new(410, "Expired", msg)
    }

    /// Maps an injected HTTP status to the reason a real server would use with it.
    pub fn injected(code: u16) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            410 => "Expired",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "Unknown",
        };
        Self::new(code, reason, format!("injected failure ({code})"))
    }

    /// The `Status` object a real API server sends.
    pub fn to_status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

fn resource_label(kind: Kind) -> String {
    if kind.group().is_empty() {
        kind.plural().to_string()
    } else {
        format!("{}.{}", kind.plural(), kind.group())
    }
}

/// One HTTP request as the server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: Option<String>,
}

/// RBAC attributes of a resource request: what a ClusterRole rule must grant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RbacRequest {
    /// API group, "" for core.
    pub group: String,
    /// Resource, with the subresource when there is one, e.g. `pods/binding`.
    pub resource: String,
    /// RBAC verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
}

impl RecordedRequest {
    /// RBAC attributes, or `None` for non-resource URLs (`/version`, discovery), which the
    /// default `system:discovery` role grants to every authenticated user.
    pub fn rbac(&self) -> Option<RbacRequest> {
        let handlers::Route::Resource(r) = handlers::parse_route(&self.path) else {
            return None;
        };
        let watch = handlers::parse_query(&self.query)
            .get("watch")
            .is_some_and(|w| handlers::truthy(w));
        let verb = match (self.method.as_str(), r.name.is_some()) {
            ("GET", _) if watch => "watch",
            ("GET", true) => "get",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            _ => return None,
        };
        let resource = match &r.sub {
            Some(sub) => format!("{}/{sub}", r.kind.plural()),
            None => r.kind.plural().to_string(),
        };
        Some(RbacRequest {
            group: r.kind.group().to_string(),
            resource,
            verb: verb.to_string(),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed write. `prev` is the state before it; watches with a field selector need both
/// to decide between ADDED / MODIFIED / DELETED, exactly as the apiserver's cacheWatcher does.
pub(crate) struct LogEntry {
    pub(crate) rv: u64,
    pub(crate) ty: EventType,
    pub(crate) obj: Arc<Value>,
    pub(crate) prev: Option<Arc<Value>>,
}

pub(crate) enum WatchMsg {
    Event(Arc<LogEntry>),
    /// Synthetic ADDED for the initial state of a watch without a resourceVersion.
    Initial(Arc<Value>),
    /// The `k8s.io/initial-events-end` bookmark of a `sendInitialEvents` watch.
    InitialEnd(u64),
    Bookmark(u64),
    Close,
}

type Key = (String, String);

/// The writes a [`WriteFault`] can hit: the two a bind makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WriteOp {
    /// `PATCH` of a pod (main resource or `status`).
    PodPatch,
    /// `POST pods/{name}/binding`.
    PodBinding,
}

/// One injected failure of a [`WriteOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteFault {
    /// No fault: this write goes through (to aim a later fault at the n-th write).
    Pass,
    /// Refused before anything is applied, answering this status (409, 429, 500, ...).
    Refuse(u16),
    /// Applied, then answered with this error status: the client cannot tell it took effect.
    AppliedThenStatus(u16),
    /// Applied, then the connection is cut after the headers (the body never arrives).
    AppliedThenDrop,
    /// Applied, then the answer is held this long (past the client's timeout) before a 504.
    /// (At most this long: [`FakeApiServer::end_hanging_answers`] ends it earlier.)
    AppliedThenHang(Duration),
    /// The answer is lost at once (500) while the write stays in flight, and is applied only
    /// when [`FakeApiServer::land_late_write`] is called with this id: its preconditions are
    /// checked then, against the state at that moment, as a real API server whose storage
    /// write commits late. Like a real one, it gives the request up at the deadline of its
    /// `timeout` query parameter: landed after that, it is not applied.
    LandsLate(u64),
    /// Never answered and never applied (an API server that accepted the connection and then
    /// hangs before writing anything); the client must give up on its own.
    NeverAnswers,
}

impl WriteFault {
    /// A short label for fault counters.
    pub fn class(&self) -> String {
        match self {
            WriteFault::Pass => "pass".into(),
            WriteFault::Refuse(c) => format!("refuse_{c}"),
            WriteFault::AppliedThenStatus(c) => format!("applied_then_{c}"),
            WriteFault::AppliedThenDrop => "applied_then_drop".into(),
            WriteFault::AppliedThenHang(_) => "applied_then_hang".into(),
            WriteFault::LandsLate(_) => "lands_late".into(),
            WriteFault::NeverAnswers => "never_answers".into(),
        }
    }
}

struct Snapshot {
    rv: u64,
    items: Vec<Arc<Value>>,
}

#[derive(Default)]
struct KindState {
    objects: BTreeMap<Key, Arc<Value>>,
    log: VecDeque<Arc<LogEntry>>,
    watchers: HashMap<u64, mpsc::UnboundedSender<WatchMsg>>,
    /// Watches outside the test's scripts (the nominated-pod stream: `handlers::scripted`),
    /// not counted by [`FakeApiServer::open_watches`].
    pub(crate) unscripted: std::collections::HashSet<u64>,
    not_served: bool,
    list_pages_since_arm: usize,
    fail_list_page: Option<(usize, u16)>,
    list_delay: Duration,
    watch_delay: Duration,
    fail_writes: Option<(u16, usize)>,
    fail_watch_start: Option<(u16, usize)>,
    fail_lists: Option<(u16, usize)>,
    /// While `Some`, events for open watch streams are kept here instead of sent (a watch that
    /// lags behind etcd); [`FakeApiServer::release_watch_events`] sends them in order.
    held_events: Option<Vec<Arc<LogEntry>>>,
    /// While `Some`, list requests (every page) wait here: see [`FakeApiServer::hold_lists`].
    list_gate: Option<Arc<Gate>>,
    /// While `Some`, watch requests wait here: see [`FakeApiServer::hold_watches`].
    watch_gate: Option<Arc<Gate>>,
}

/// Holds requests until the test lets them through: an ordering a test waits for, where a
/// delay would be a window a loaded machine can miss.
pub(crate) struct Gate {
    passes: tokio::sync::Semaphore,
    waiting: AtomicU64,
}

impl Gate {
    fn new() -> Arc<Self> {
        Arc::new(Gate {
            passes: tokio::sync::Semaphore::new(0),
            waiting: AtomicU64::new(0),
        })
    }

    /// Waits for a pass (or for the gate to be opened for good).
    pub(crate) async fn wait(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        if let Ok(permit) = self.passes.acquire().await {
            permit.forget();
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Inner {
    rv: u64,
    floor: u64,
    kinds: [KindState; Kind::ALL.len()],
    snapshots: BTreeMap<u64, Arc<Snapshot>>,
    next_id: u64,
    bookmark_interval: Duration,
    requests: Vec<RecordedRequest>,
    write_faults: BTreeMap<WriteOp, VecDeque<WriteFault>>,
    fault_hits: BTreeMap<String, u64>,
}

/// Continue-token snapshots kept at most; older ones answer 410 like an expired token.
const MAX_SNAPSHOTS: usize = 256;

/// Process-wide so uids stay unique even across several fake servers in one test binary.
static UID_COUNTER: AtomicU64 = AtomicU64::new(1);

fn fresh_uid() -> String {
    let n = UID_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("fa4e0000-0000-4000-8000-{n:012x}")
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(field)).and_then(Value::as_str)
}

/// `metadata` as a mutable map, creating it (or replacing a non-object) as needed.
fn meta_mut(obj: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    let map = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("object must be a JSON object"))?;
    let m = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    m.as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata must be an object"))
}

impl Inner {
    fn ks(&mut self, kind: Kind) -> &mut KindState {
        &mut self.kinds[kind.idx()]
    }

    fn key(kind: Kind, ns: &str, name: &str) -> Key {
        let ns = if kind.namespaced() { ns } else { "" };
        (ns.to_string(), name.to_string())
    }

    /// Commits a write: bumps the RV, stamps it, stores, logs and fans out to watches.
    fn commit(&mut self, kind: Kind, key: Key, ty: EventType, mut obj: Value) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        if let Ok(m) = meta_mut(&mut obj) {
            m.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        let obj = Arc::new(obj);
        let ks = &mut self.kinds[kind.idx()];
        let prev = if ty == EventType::Deleted {
            ks.objects.remove(&key)
        } else {
            ks.objects.insert(key, obj.clone())
        };
        let entry = Arc::new(LogEntry {
            rv,
            ty,
            obj: obj.clone(),
            prev,
        });
        ks.log.push_back(entry.clone());
        if let Some(held) = ks.held_events.as_mut() {
            held.push(entry);
            return obj;
        }
        // A send fails only when the watch task is gone; drop it so open_watches stays exact.
        ks.watchers
            .retain(|_, tx| tx.send(WatchMsg::Event(entry.clone())).is_ok());
        obj
    }

    fn create(
        &mut self,
        kind: Kind,
        path_ns: Option<&str>,
        mut obj: Value,
        from_http: bool,
    ) -> Result<Arc<Value>, ApiError> {
        normalize_type(kind, &mut obj)?;
        let m = meta_mut(&mut obj)?;
        if from_http && m.get("resourceVersion").is_some_and(|v| !v.is_null()) {
            // etcd3 storage refuses this with an internal error, not a validation error.
            return Err(ApiError::new(
                500,
                "InternalError",
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let mut name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            match m.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => {
                    name = format!(
                        "{prefix}{:05x}",
                        UID_COUNTER.fetch_add(1, Ordering::Relaxed)
                    );
                    m.insert("name".into(), Value::String(name.clone()));
                }
                _ => {
                    return Err(ApiError::invalid(
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            }
        }
        let ns = if kind.namespaced() {
            let body_ns = m
                .get("namespace")
                .and_then(Value::as_str)
                .map(str::to_string);
            let ns = match (path_ns, body_ns) {
                (Some(p), Some(b)) if !b.is_empty() && p != b => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                (Some(p), _) => p.to_string(),
                (None, Some(b)) if !b.is_empty() => b,
                (None, _) => "default".to_string(),
            };
            m.insert("namespace".into(), Value::String(ns.clone()));
            ns
        } else {
            // The real server clears the namespace of cluster-scoped objects.
            m.remove("namespace");
            String::new()
        };
        if m.get("uid")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            m.insert("uid".into(), Value::String(fresh_uid()));
        }
        if m.get("creationTimestamp").is_none_or(Value::is_null) {
            m.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
        }
        let key = Self::key(kind, &ns, &name);
        if self.ks(kind).objects.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", resource_label(kind)),
            ));
        }
        Ok(self.commit(kind, key, EventType::Added, obj))
    }

    /// Read-modify-write with the same guards as the real server's GuaranteedUpdate: identity
    /// fields cannot change, a `metadata.resourceVersion` left in the new object is a
    /// precondition, and a no-op write returns the stored object without a new RV.
    fn update_with(
        &mut self,
        kind: Kind,
        ns: &str,
        name: &str,
        resource: &str,
        f: impl FnOnce(&mut Value) -> Result<(), ApiError>,
    ) -> Result<Arc<Value>, ApiError> {
        let key = Self::key(kind, ns, name);
        let old = self
            .ks(kind)
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        let mut new = (*old).clone();
        f(&mut new)?;
        normalize_type(kind, &mut new)?;
        let old_rv = meta_str(&old, "resourceVersion").unwrap_or("").to_string();
        let old_uid = meta_str(&old, "uid").unwrap_or("").to_string();
        let old_created = meta(&old).and_then(|m| m.get("creationTimestamp")).cloned();
        let m = meta_mut(&mut new)?;
        if m.get("name").and_then(Value::as_str) != Some(name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object does not match the name on the URL ({name:?})"
            )));
        }
        if kind.namespaced() {
            match m.get("namespace").and_then(Value::as_str) {
                Some(n) if n == ns => {}
                None | Some("") => {
                    m.insert("namespace".into(), Value::String(ns.to_string()));
                }
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
            }
        } else {
            m.remove("namespace");
        }
        match m.get("uid").and_then(Value::as_str) {
            Some(u) if !u.is_empty() && u != old_uid => {
                return Err(ApiError::conflict(
                    resource,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {u}, UID in object meta: {old_uid}"
                    ),
                ));
            }
            _ => {
                m.insert("uid".into(), Value::String(old_uid));
            }
        }
        match m.get("resourceVersion").and_then(Value::as_str) {
            Some(rv) if !rv.is_empty() && rv != old_rv => {
                return Err(ApiError::conflict(
                    resource,
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                ));
            }
            _ => {
                m.insert("resourceVersion".into(), Value::String(old_rv));
            }
        }
        // creationTimestamp is owned by the server.
        match old_created {
            Some(c) => m.insert("creationTimestamp".into(), c),
            None => m.remove("creationTimestamp"),
        };
        if new == *old {
            return Ok(old);
        }
        Ok(self.commit(kind, key, EventType::Modified, new))
    }

    fn delete(
        &mut self,
        kind: Kind,
        ns: &str,
        name: &str,
        preconditions: Option<&Value>,
        grace_seconds: Option<i64>,
    ) -> Result<Arc<Value>, ApiError> {
        let key = Self::key(kind, ns, name);
        let old = self
            .ks(kind)
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        if let Some(p) = preconditions {
            for field in ["uid", "resourceVersion"] {
                if let Some(want) = p.get(field).and_then(Value::as_str) {
                    let have = meta_str(&old, field).unwrap_or("");
                    if want != have {
                        return Err(ApiError::conflict(
                            &resource_label(kind),
                            name,
                            &format!(
                                "Precondition failed: {field} in precondition: {want}, {field} in object meta: {have}"
                            ),
                        ));
                    }
                }
            }
        }
        let bound = old
            .get("spec")
            .and_then(|s| s.get("nodeName"))
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        if kind == Kind::Pod && bound && grace_seconds.is_some_and(|g| g > 0) {
            // Graceful: mark it and let it linger (still holding what it holds) until the final
            // delete. A second graceful delete of a terminating pod changes nothing.
            if meta(&old).is_some_and(|m| m.get("deletionTimestamp").is_some_and(|d| !d.is_null()))
            {
                return Ok(old);
            }
            let mut marked = (*old).clone();
            let m = meta_mut(&mut marked)?;
            m.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
            m.insert(
                "deletionGracePeriodSeconds".into(),
                json!(grace_seconds.unwrap_or(0)),
            );
            return Ok(self.commit(kind, key, EventType::Modified, marked));
        }
        // The DELETED event carries the last state stamped with the deletion's RV, like etcd.
        Ok(self.commit(kind, key, EventType::Deleted, (*old).clone()))
    }

    fn bind(&mut self, ns: &str, name: &str, binding: &Value) -> Result<Arc<Value>, ApiError> {
        if let Some(bname) = meta_str(binding, "name")
            && bname != name
        {
            return Err(ApiError::bad_request(
                "name in URL does not match name in Binding object",
            ));
        }
        let target = binding
            .get("target")
            .and_then(|t| t.get("name"))
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ApiError::invalid("target.name: Required value"))?
            .to_string();
        let uid_pre = meta_str(binding, "uid")
            .filter(|u| !u.is_empty())
            .map(str::to_string);
        let rv_pre = meta_str(binding, "resourceVersion")
            .filter(|r| !r.is_empty())
            .map(str::to_string);
        let annotations = meta(binding).and_then(|m| m.get("annotations")).cloned();
        self.update_with(Kind::Pod, ns, name, "pods/binding", |pod| {
            if let Some(want) = &uid_pre {
                let have = meta_str(pod, "uid").unwrap_or("");
                if want != have {
                    return Err(ApiError::conflict(
                        "pods/binding",
                        name,
                        &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {have}"),
                    ));
                }
            }
            // As the real BindingREST: the Binding's resourceVersion is a precondition on the
            // pod (storage.Preconditions), checked in the same guaranteed update.
            if let Some(want) = &rv_pre {
                let have = meta_str(pod, "resourceVersion").unwrap_or("");
                if want != have {
                    return Err(ApiError::conflict(
                        "pods/binding",
                        name,
                        &format!("Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {have}"),
                    ));
                }
            }
            if meta(pod).is_some_and(|m| m.get("deletionTimestamp").is_some_and(|d| !d.is_null())) {
                return Err(ApiError::conflict("pods/binding", name, "pod is being deleted, cannot be assigned to a host"));
            }
            if let Some(node) = pod
                .get("spec")
                .and_then(|s| s.get("nodeName"))
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                return Err(ApiError::conflict(
                    "pods/binding",
                    name,
                    &format!("pod {name} is already assigned to node {node:?}"),
                ));
            }
            let Value::Object(p) = pod else {
                return Err(ApiError::invalid("stored pod is not an object"));
            };
            let spec = p.entry("spec").or_insert_with(|| json!({}));
            if let Value::Object(s) = spec {
                s.insert("nodeName".into(), Value::String(target.clone()));
            }
            if let Some(Value::Object(ann)) = &annotations {
                let m = meta_mut(pod)?;
                let dst = m.entry("annotations").or_insert_with(|| json!({}));
                if let Value::Object(d) = dst {
                    d.extend(ann.clone());
                }
            }
            set_pod_scheduled(pod);
            Ok(())
        })
    }

    fn fail_write(&mut self, kind: Kind) -> Option<ApiError> {
        let ks = self.ks(kind);
        let (code, left) = ks.fail_writes.as_mut()?;
        let code = *code;
        *left -= 1;
        if *left == 0 {
            ks.fail_writes = None;
        }
        Some(ApiError::injected(code))
    }
}

/// What the binding REST handler does besides setting nodeName.
fn set_pod_scheduled(pod: &mut Value) {
    let Value::Object(p) = pod else { return };
    let status = p.entry("status").or_insert_with(|| json!({}));
    let Value::Object(s) = status else { return };
    let conds = s.entry("conditions").or_insert_with(|| json!([]));
    let Value::Array(c) = conds else { return };
    let cond = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now_rfc3339()});
    match c
        .iter_mut()
        .find(|x| x.get("type").and_then(Value::as_str) == Some("PodScheduled"))
    {
        Some(existing) => *existing = cond,
        None => c.push(cond),
    }
}

/// Stamps the storage apiVersion/kind, rejecting an object of another kind.
fn normalize_type(kind: Kind, obj: &mut Value) -> Result<(), ApiError> {
    let map = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("object must be a JSON object"))?;
    if let Some(k) = map.get("kind").and_then(Value::as_str)
        && k != kind.kind_name()
    {
        return Err(ApiError::bad_request(format!(
            "kind {k:?} does not match the expected kind {:?}",
            kind.kind_name()
        )));
    }
    map.insert("kind".into(), Value::String(kind.kind_name().into()));
    map.insert("apiVersion".into(), Value::String(kind.api_version()));
    Ok(())
}

/// A stopped server's address, held by a listener that refuses service until
/// [`FakeApiServer::serve_again`].
pub struct Outage {
    pub addr: SocketAddr,
    blocker: Option<tokio::task::JoinHandle<()>>,
}

/// The fake server. Cheap to clone: every clone shares the same state.
#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<Mutex<Inner>>,
    /// Answers currently held back by [`WriteFault::AppliedThenHang`].
    hanging: Arc<AtomicU64>,
    /// Ends every answer [`WriteFault::AppliedThenHang`] holds now (see
    /// [`Self::end_hanging_answers`]).
    pub(crate) end_hangs: Arc<tokio::sync::Notify>,
    /// Writes in flight under [`WriteFault::LandsLate`], by id.
    pub(crate) late: Arc<Mutex<HashMap<u64, LateWrite>>>,
}

/// A [`WriteFault::LandsLate`] write: what lands it, and how it ended (its HTTP status).
#[derive(Default)]
pub(crate) struct LateWrite {
    pub(crate) land: Arc<tokio::sync::Notify>,
    /// The write reached the server (its fault was consumed).
    pub(crate) arrived: bool,
    /// The name of the object it writes (the pod, for a binding), once it arrived.
    pub(crate) pod: Option<String>,
    pub(crate) outcome: Option<u16>,
}

impl Default for FakeApiServer {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeApiServer {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                rv: 1,
                floor: 0,
                kinds: Default::default(),
                snapshots: BTreeMap::new(),
                next_id: 1,
                bookmark_interval: Duration::from_secs(30),
                requests: Vec::new(),
                write_faults: BTreeMap::new(),
                fault_hits: BTreeMap::new(),
            })),
            hanging: Arc::new(AtomicU64::new(0)),
            end_hangs: Arc::default(),
            late: Arc::default(),
        }
    }

    /// The axum router; also a tower `Service`, so `kube::Client::new(router, "default")`
    /// talks to it in-process.
    pub fn router(&self) -> axum::Router {
        handlers::router(self.clone())
    }

    /// A kube client wired to the router in-process. Needs a running Tokio runtime (kube wraps
    /// the service in a `Buffer`). No retry layer, unlike a client built from a Config.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.router(), "default")
    }

    /// Serves on an ephemeral 127.0.0.1 port.
    pub async fn serve(&self) -> ServedApi {
        self.serve_at(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("bind 127.0.0.1:0")
    }

    /// Serves on a given address, e.g. the port of an earlier [`ServedApi`] to simulate the API
    /// server coming back after an outage.
    pub async fn serve_at(&self, addr: SocketAddr) -> std::io::Result<ServedApi> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let router = self.router();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(ServedApi {
            addr,
            fake: self.clone(),
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// Serves again on the outage's address after [`ServedApi::stop_for_outage`] (releasing
    /// the listener that held it), retrying while the port is still held by the old
    /// listener's last connections (hang guard: 30 s).
    pub async fn serve_again(&self, outage: Outage) -> ServedApi {
        let addr = outage.addr;
        if let Some(blocker) = outage.blocker {
            blocker.abort();
            // Aborted, its listener is dropped once the task has finished.
            let _ = blocker.await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match self.serve_at(addr).await {
                Ok(s) => return s,
                Err(e) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "cannot serve on {addr} again: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    // ---- Rust-side writes for test setup (never subject to fault knobs) ----

    /// Creates an object; the namespace comes from `metadata.namespace` ("default" if absent).
    pub fn create(&self, kind: Kind, obj: Value) -> Result<Value, ApiError> {
        let mut g = self.inner.lock();
        g.create(kind, None, obj, false).map(|o| (*o).clone())
    }

    /// Stores an object as given, without filling in a uid or creationTimestamp: what a broken
    /// aggregated API server or conversion webhook might serve (hostile-data tests). Still
    /// gets a resourceVersion and an ADDED event.
    pub fn create_verbatim(&self, kind: Kind, mut obj: Value) -> Result<Value, ApiError> {
        normalize_type(kind, &mut obj)?;
        let name = meta_str(&obj, "name")
            .ok_or_else(|| ApiError::invalid("metadata.name: Required value"))?
            .to_string();
        let ns = meta_str(&obj, "namespace").unwrap_or("default").to_string();
        let key = Inner::key(kind, &ns, &name);
        let mut g = self.inner.lock();
        if g.ks(kind).objects.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{name:?} already exists"),
            ));
        }
        Ok((*g.commit(kind, key, EventType::Added, obj)).clone())
    }

    /// Bulk create under one lock acquisition; each object still gets its own RV and event,
    /// like a burst of real creates. Returns how many were created; stops at the first error.
    pub fn create_many(
        &self,
        kind: Kind,
        objs: impl IntoIterator<Item = Value>,
    ) -> Result<usize, ApiError> {
        let mut g = self.inner.lock();
        let mut n = 0;
        for obj in objs {
            g.create(kind, None, obj, false)?;
            n += 1;
        }
        Ok(n)
    }

    /// Replaces an object (PUT semantics, including the resourceVersion precondition when the
    /// object carries one).
    pub fn replace(&self, kind: Kind, obj: Value) -> Result<Value, ApiError> {
        let ns = meta_str(&obj, "namespace").unwrap_or("default").to_string();
        let name = meta_str(&obj, "name")
            .ok_or_else(|| ApiError::invalid("metadata.name: Required value"))?
            .to_string();
        let mut g = self.inner.lock();
        g.update_with(kind, &ns, &name, &resource_label(kind), |cur| {
            *cur = obj;
            Ok(())
        })
        .map(|o| (*o).clone())
    }

    pub fn patch_merge(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        patch: Value,
    ) -> Result<Value, ApiError> {
        let mut g = self.inner.lock();
        g.update_with(kind, ns, name, &resource_label(kind), |cur| {
            patch::merge_patch(cur, &patch);
            Ok(())
        })
        .map(|o| (*o).clone())
    }

    pub fn patch_json(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        patch: Value,
    ) -> Result<Value, ApiError> {
        let mut g = self.inner.lock();
        g.update_with(kind, ns, name, &resource_label(kind), |cur| {
            patch::json_patch(cur, &patch)
        })
        .map(|o| (*o).clone())
    }

    /// Deletes immediately (no graceful deletion); `ns` is ignored for cluster-scoped kinds.
    pub fn delete(&self, kind: Kind, ns: &str, name: &str) -> Result<Value, ApiError> {
        let mut g = self.inner.lock();
        g.delete(kind, ns, name, None, None).map(|o| (*o).clone())
    }

    /// Graceful pod deletion: a bound pod gets `deletionTimestamp` (MODIFIED) and stays until
    /// [`FakeApiServer::finish_deletion`]; an unbound one is removed at once. Returns the stored
    /// (terminating) or last object.
    pub fn delete_graceful(
        &self,
        ns: &str,
        name: &str,
        grace_seconds: i64,
    ) -> Result<Value, ApiError> {
        let mut g = self.inner.lock();
        g.delete(Kind::Pod, ns, name, None, Some(grace_seconds.max(1)))
            .map(|o| (*o).clone())
    }

    /// The kubelet's final delete of a terminating pod (or an immediate delete of any pod).
    pub fn finish_deletion(&self, ns: &str, name: &str) -> Result<Value, ApiError> {
        let mut g = self.inner.lock();
        g.delete(Kind::Pod, ns, name, None, Some(0))
            .map(|o| (*o).clone())
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        let g = self.inner.lock();
        g.kinds[kind.idx()]
            .objects
            .get(&Inner::key(kind, ns, name))
            .map(|o| (**o).clone())
    }

    /// All objects of a kind, ordered by (namespace, name).
    pub fn list(&self, kind: Kind) -> Vec<Value> {
        let g = self.inner.lock();
        g.kinds[kind.idx()]
            .objects
            .values()
            .map(|o| (**o).clone())
            .collect()
    }

    pub fn count(&self, kind: Kind) -> usize {
        self.inner.lock().kinds[kind.idx()].objects.len()
    }

    pub fn set_pod_phase(&self, ns: &str, name: &str, phase: &str) -> Result<Value, ApiError> {
        self.patch_merge(Kind::Pod, ns, name, json!({"status": {"phase": phase}}))
    }

    /// Binds like `POST pods/{name}/binding` would (409 if already bound).
    pub fn bind_pod(&self, ns: &str, name: &str, node: &str) -> Result<Value, ApiError> {
        let binding = json!({"metadata": {"name": name}, "target": {"kind": "Node", "name": node}});
        let mut g = self.inner.lock();
        g.bind(ns, name, &binding).map(|o| (*o).clone())
    }

    /// The current (latest committed) resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.inner.lock().rv
    }

    /// Events `(rv, "ADDED"|"MODIFIED"|"DELETED", object)` still in the log of a kind.
    pub fn event_log(&self, kind: Kind) -> Vec<(u64, &'static str, Value)> {
        let g = self.inner.lock();
        g.kinds[kind.idx()]
            .log
            .iter()
            .map(|e| (e.rv, handlers::event_name(e.ty), (*e.obj).clone()))
            .collect()
    }

    // ---- fault knobs ----

    /// Simulates an absent CRD (or its return): the group/version leaves discovery and every
    /// endpoint of the kind answers 404 NotFound. Open watches are closed when it goes away.
    pub fn set_crd_served(&self, kind: Kind, served: bool) {
        let mut g = self.inner.lock();
        let ks = g.ks(kind);
        ks.not_served = !served;
        if !served {
            for (_, tx) in ks.watchers.drain() {
                let _ = tx.send(WatchMsg::Close);
            }
        }
    }

    /// Ends every open watch stream now (clients see a normal end of stream and re-watch from
    /// their last RV).
    pub fn close_watches(&self) {
        let mut g = self.inner.lock();
        for ks in g.kinds.iter_mut() {
            for (_, tx) in ks.watchers.drain() {
                let _ = tx.send(WatchMsg::Close);
            }
        }
    }

    /// Raises the compaction floor to the current RV: watches resuming from an older RV get
    /// the in-stream 410, older continue tokens expire, and the event logs are trimmed.
    pub fn compact(&self) {
        let mut g = self.inner.lock();
        let floor = g.rv;
        g.floor = floor;
        for ks in g.kinds.iter_mut() {
            while ks.log.front().is_some_and(|e| e.rv <= floor) {
                ks.log.pop_front();
            }
        }
        g.snapshots.retain(|_, s| s.rv >= floor);
    }

    pub fn compaction_floor(&self) -> u64 {
        self.inner.lock().floor
    }

    /// One-shot: counting from this call, the `nth_page`-th (1-based) list request of the kind
    /// answers `http_status` with a Status body.
    pub fn fail_list_page(&self, kind: Kind, nth_page: usize, http_status: u16) {
        let mut g = self.inner.lock();
        let ks = g.ks(kind);
        ks.list_pages_since_arm = 0;
        ks.fail_list_page = Some((nth_page.max(1), http_status));
    }

    pub fn set_list_delay(&self, kind: Kind, delay: Duration) {
        self.inner.lock().ks(kind).list_delay = delay;
    }

    pub fn set_watch_delay(&self, kind: Kind, delay: Duration) {
        self.inner.lock().ks(kind).watch_delay = delay;
    }

    /// From now on every list request (page) of the kind waits at a gate until
    /// [`Self::pass_lists`] lets it through or [`Self::release_lists`] opens the gate.
    pub fn hold_lists(&self, kind: Kind) {
        self.inner
            .lock()
            .ks(kind)
            .list_gate
            .get_or_insert_with(Gate::new);
    }

    /// Lets `n` held (or future) list requests of the kind through.
    pub fn pass_lists(&self, kind: Kind, n: usize) {
        if let Some(g) = &self.inner.lock().ks(kind).list_gate {
            g.passes.add_permits(n);
        }
    }

    /// Opens the kind's list gate for good: held requests go on, new ones are not held.
    pub fn release_lists(&self, kind: Kind) {
        if let Some(g) = self.inner.lock().ks(kind).list_gate.take() {
            g.passes.close();
        }
    }

    /// List requests of the kind waiting at its gate now.
    pub fn held_lists(&self, kind: Kind) -> u64 {
        let g = self.inner.lock().ks(kind).list_gate.clone();
        g.map_or(0, |g| g.waiting.load(Ordering::SeqCst))
    }

    /// [`Self::hold_lists`] for watch requests: a watch (re)start of the kind waits until
    /// [`Self::release_watches`].
    pub fn hold_watches(&self, kind: Kind) {
        self.inner
            .lock()
            .ks(kind)
            .watch_gate
            .get_or_insert_with(Gate::new);
    }

    pub fn release_watches(&self, kind: Kind) {
        if let Some(g) = self.inner.lock().ks(kind).watch_gate.take() {
            g.passes.close();
        }
    }

    /// Watch requests of the kind waiting at its gate now.
    pub fn held_watches(&self, kind: Kind) -> u64 {
        let g = self.inner.lock().ks(kind).watch_gate.clone();
        g.map_or(0, |g| g.waiting.load(Ordering::SeqCst))
    }

    /// The next `count` HTTP writes of the kind (create, update, patch, delete, and for pods
    /// also bindings and status writes) answer `http_status`.
    pub fn fail_writes(&self, kind: Kind, http_status: u16, count: usize) {
        self.inner.lock().ks(kind).fail_writes = (count > 0).then_some((http_status, count));
    }

    /// Queues a fault for the next HTTP write of `op` (faults of one op are used in order, one
    /// per request). Rust-side helpers never consume them.
    pub fn push_write_fault(&self, op: WriteOp, fault: WriteFault) {
        self.inner
            .lock()
            .write_faults
            .entry(op)
            .or_default()
            .push_back(fault);
    }

    /// Drops every queued, not yet used [`WriteFault`]; returns how many there were.
    pub fn clear_write_faults(&self) -> usize {
        let mut g = self.inner.lock();
        let n = g.write_faults.values().map(VecDeque::len).sum();
        g.write_faults.clear();
        n
    }

    /// Queued [`WriteFault`]s not used yet.
    pub fn pending_write_faults(&self) -> usize {
        self.inner
            .lock()
            .write_faults
            .values()
            .map(VecDeque::len)
            .sum()
    }

    /// How many [`WriteFault`]s were used, by `"{op:?}/{class}"`.
    pub fn write_fault_hits(&self) -> BTreeMap<String, u64> {
        self.inner.lock().fault_hits.clone()
    }

    /// Lands the [`WriteFault::LandsLate`] write `id` (now, or as soon as it arrives).
    pub fn land_late_write(&self, id: u64) {
        let land = self.late.lock().entry(id).or_default().land.clone();
        land.notify_one();
    }

    /// How the [`WriteFault::LandsLate`] write `id` ended: its HTTP status once landed
    /// (2xx: applied; 409: a precondition failed; 504: past its deadline), `None` before.
    pub fn late_write_outcome(&self, id: u64) -> Option<u16> {
        self.late.lock().get(&id).and_then(|w| w.outcome)
    }

    /// The object (pod) the [`WriteFault::LandsLate`] write `id` writes, once it arrived.
    pub fn late_write_pod(&self, id: u64) -> Option<String> {
        self.late.lock().get(&id).and_then(|w| w.pod.clone())
    }

    /// Whether the [`WriteFault::LandsLate`] write `id` reached the server.
    pub fn late_write_arrived(&self, id: u64) -> bool {
        self.late.lock().get(&id).is_some_and(|w| w.arrived)
    }

    /// Ends every answer [`WriteFault::AppliedThenHang`] holds back now (they answer 504 at
    /// once): a test ends a hang when its ordering is done, not after a duration.
    pub fn end_hanging_answers(&self) {
        self.end_hangs.notify_waiters();
    }

    /// Answers currently held back by [`WriteFault::AppliedThenHang`].
    pub fn hanging_answers(&self) -> u64 {
        self.hanging.load(Ordering::SeqCst)
    }

    pub(crate) fn take_write_fault(&self, op: WriteOp) -> Option<WriteFault> {
        let mut g = self.inner.lock();
        let fault = g.write_faults.get_mut(&op)?.pop_front()?;
        *g.fault_hits
            .entry(format!("{op:?}/{}", fault.class()))
            .or_default() += 1;
        Some(fault)
    }

    /// The next `count` watch requests of the kind answer `http_status` as an HTTP error (kube's
    /// watcher then retries the same RV: `WatchStartFailed`).
    pub fn fail_watch_start(&self, kind: Kind, http_status: u16, count: usize) {
        self.inner.lock().ks(kind).fail_watch_start = (count > 0).then_some((http_status, count));
    }

    /// The next `count` list requests (pages) of the kind answer `http_status` (an API server
    /// that cannot reach etcd); zero stops failing them.
    pub fn fail_lists(&self, kind: Kind, http_status: u16, count: usize) {
        self.inner.lock().ks(kind).fail_lists = (count > 0).then_some((http_status, count));
    }

    /// Interval of periodic BOOKMARKs for watches started after this call; zero disables them.
    /// The default is 30 s.
    pub fn set_bookmark_interval(&self, interval: Duration) {
        self.inner.lock().bookmark_interval = interval;
    }

    /// Open watch streams of `kind` stop receiving events (they stay open, no error, no
    /// bookmarks): a watch lagging behind the API server's store. Writes still apply, lists see
    /// them, and a watch started meanwhile replays them from history.
    pub fn hold_watch_events(&self, kind: Kind) {
        let mut g = self.inner.lock();
        let ks = g.ks(kind);
        if ks.held_events.is_none() {
            ks.held_events = Some(Vec::new());
        }
    }

    /// Ends [`Self::hold_watch_events`]: the held events go out in order.
    pub fn release_watch_events(&self, kind: Kind) {
        let mut g = self.inner.lock();
        let ks = g.ks(kind);
        for entry in ks.held_events.take().unwrap_or_default() {
            ks.watchers
                .retain(|_, tx| tx.send(WatchMsg::Event(entry.clone())).is_ok());
        }
    }

    /// Sends a BOOKMARK with the current RV on every open watch that allows bookmarks (not on
    /// kinds whose events are held: a bookmark past them would let a resumed watch skip them).
    pub fn send_bookmarks(&self) {
        let mut g = self.inner.lock();
        let rv = g.rv;
        for ks in g.kinds.iter_mut().filter(|ks| ks.held_events.is_none()) {
            ks.watchers
                .retain(|_, tx| tx.send(WatchMsg::Bookmark(rv)).is_ok());
        }
    }

    // ---- observation ----

    /// Open watch streams of a kind (over all versions and namespaces).
    /// Open watches of the kind that the test's scripts apply to (for pods: the assigned-pod
    /// stream, not the nominated one; see `handlers::scripted`).
    pub fn open_watches(&self, kind: Kind) -> usize {
        let mut g = self.inner.lock();
        let ks = g.ks(kind);
        ks.watchers.retain(|_, tx| !tx.is_closed());
        let unscripted = &ks.unscripted;
        ks.watchers
            .keys()
            .filter(|id| !unscripted.contains(id))
            .count()
    }

    /// Waits until at least `n` watches of the kind are open; false on timeout.
    pub async fn wait_for_watches(&self, kind: Kind, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.open_watches(kind) >= n {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.inner.lock().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.inner.lock().requests.clear();
    }

    /// Distinct RBAC attributes of every resource request seen so far.
    pub fn rbac_requests(&self) -> BTreeSet<RbacRequest> {
        self.inner
            .lock()
            .requests
            .iter()
            .filter_map(RecordedRequest::rbac)
            .collect()
    }
}

/// A fake served over TCP. Dropping it stops accepting connections and ends open watches.
pub struct ServedApi {
    pub addr: SocketAddr,
    fake: FakeApiServer,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ServedApi {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig with one context pointing at this server over plain http, no auth.
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: fake\n  cluster:\n    server: {url}\n\
             users:\n\
             - name: fake\n  user: {{}}\n\
             contexts:\n\
             - name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\n",
            url = self.url()
        )
    }

    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    /// Stops the server and waits until the listener is closed. Like dropping it, this also
    /// ends open watch streams, including in-process ones (the streams cannot tell which
    /// transport they are on).
    pub async fn stop(mut self) {
        self.shutdown_now();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }

    /// An outage: stops serving (open watches end, every new connection is closed at once)
    /// and returns what [`FakeApiServer::serve_again`] needs later. State is kept. The port
    /// stays bound during the outage, by a listener that drops every connection: otherwise
    /// another test's server (tests run in parallel) could be given the freed port, and the
    /// clients would reconnect to it instead of failing.
    pub async fn stop_for_outage(self) -> (FakeApiServer, Outage) {
        let fake = self.fake.clone();
        let addr = self.addr;
        self.stop().await;
        let blocker = match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => Some(tokio::spawn(async move {
                while let Ok((conn, _)) = listener.accept().await {
                    drop(conn);
                }
            })),
            // Taken in the moment between the two: serve_again waits for it.
            Err(_) => None,
        };
        (fake, Outage { addr, blocker })
    }

    fn shutdown_now(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            // Streams first: graceful shutdown waits for in-flight responses to finish.
            self.fake.close_watches();
            let _ = tx.send(());
        }
    }
}

impl Drop for ServedApi {
    fn drop(&mut self) {
        self.shutdown_now();
    }
}
