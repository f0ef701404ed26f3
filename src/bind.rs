//! Bind: the one place an allocation is decided and committed, and where assumed
//! allocations whose outcome is unknown are probed and released.
//!
//! kube-scheduler runs binds asynchronously and concurrently with later filters, so the
//! allocation is computed here, not in filter: lock the node, allocate against committed +
//! assumed entries, record the result as *assumed* under the pod UID, unlock, and commit it in
//! **one write**: the `pods/binding`, carrying the annotations (the API server merges a
//! Binding's `metadata.annotations` into the pod in the same write as `spec.nodeName`), with
//! the UID and the resourceVersion of the bind's read as preconditions (a 409 re-reads and
//! retries, re-deciding nothing). So a pod never carries an allocation decided for another
//! node, and a binding whose answer was lost can land later only on the unchanged pod: the
//! allocation stays held exactly while that is possible (see [`crate::cluster::assumed`]).
//! A failure whose outcome is known removes the assumed entry; one whose outcome is unknown
//! keeps it held and probes it. The pod watch later replaces the assumed entry with the
//! committed one. A decision never replaces a committed entry. Never clear annotations of a
//! pod bound to another node: whatever it carries is what that node's koordlet uses.
//!
//! API writes go through [`PodApi`], so the same logic serves the kube client and the
//! offline (cluster file) mode.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use kube::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;

use crate::cluster::assumed::{AssumedPod, Outcome, SentBinding};
use crate::cluster::cpus::RecordedCpus;
use crate::cluster::devices::{EntryState, RecordedAllocation};
use crate::cluster::{ClusterState, PodRecord};
use crate::fit::{self, PodNeeds};
use crate::metrics::Metrics;
use crate::model::annotations::{DEVICE_ALLOCATED, RESOURCE_STATUS};
use crate::model::ids::PodUid;
use crate::model::koord_cpu::RESOURCE_SPEC;
use crate::model::pod::Pod;
use crate::model::wire::ExtenderBindingArgs;
use crate::placement::device::pod_device_request;
use crate::placement::device::score::ScoringConfig;
use crate::sync::{Kind, Readiness};

/// An API call failed.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status when the server answered, e.g. 409.
    pub status: Option<u16>,
    pub message: String,
}

impl From<kube::Error> for ApiError {
    fn from(e: kube::Error) -> Self {
        match &e {
            kube::Error::Api(s) => ApiError {
                status: Some(s.code),
                message: s.message.clone(),
            },
            _ => ApiError {
                status: None,
                message: e.to_string(),
            },
        }
    }
}

/// The API writes bind needs. Implemented for the kube client and for offline mode.
pub trait PodApi: Send + Sync {
    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, ApiError>>;
    /// Merge-patches annotations (`None` removes one), with the pod UID and, when given, the
    /// resourceVersion as preconditions (409 when either no longer matches).
    fn patch_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        annotations: &'a BTreeMap<String, Option<String>>,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
    /// Creates `pods/binding` with the pod UID and, when given, the resourceVersion as
    /// preconditions, carrying `annotations`, which the API server merges into the pod in the
    /// same write as `spec.nodeName` (409 when a precondition fails or the pod is bound).
    fn create_binding<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        node: &'a str,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
    /// The longest the API server may take to apply a binding we sent (its deadline for the
    /// request): past it, a binding whose answer never came can no longer land.
    fn binding_deadline(&self) -> std::time::Duration;
    /// True when a pod watch will confirm binds; false when bind must commit itself (offline).
    fn confirmed_by_watch(&self) -> bool;
}

pub struct KubePodApi {
    client: kube::Client,
    /// How long one call may wait for the API server's answer.
    timeout: std::time::Duration,
}

impl KubePodApi {
    /// Calls through `client`, each given up after `request_timeout` plus a second without an
    /// answer. The kube client sets no read timeout (its watches are long reads), and a bind
    /// runs detached from its request, so without this a hung API server would keep the bind,
    /// its assumed allocation and the pod's in-flight slot forever. The extra second lets the
    /// request's own timeout answer the scheduler first. A call given up is an error without a
    /// status, like a lost answer: bind treats it as possibly applied.
    pub fn new(client: kube::Client, request_timeout: std::time::Duration) -> Self {
        KubePodApi {
            client,
            timeout: request_timeout + std::time::Duration::from_secs(1),
        }
    }

    fn api(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(ApiError {
                status: None,
                message: format!(
                    "no answer from the API server to {what} within {:?}",
                    self.timeout
                ),
            }),
        }
    }
}

impl PodApi for KubePodApi {
    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, ApiError>> {
        Box::pin(async move {
            self.call("get the pod", self.api(namespace).get_opt(name))
                .await
        })
    }

    fn patch_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        annotations: &'a BTreeMap<String, Option<String>>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            // A merge patch carrying metadata.uid / metadata.resourceVersion is checked by the
            // API server against the stored object: optimistic concurrency.
            let mut meta = serde_json::json!({ "uid": uid, "annotations": annotations });
            if let Some(rv) = resource_version {
                meta["resourceVersion"] = serde_json::Value::String(rv.to_string());
            }
            let patch = serde_json::json!({ "metadata": meta });
            let api = self.api(namespace);
            self.call(
                "the annotation removal patch",
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?;
            Ok(())
        })
    }

    fn create_binding<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        node: &'a str,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let mut meta = serde_json::json!({ "name": name, "namespace": namespace, "uid": uid });
            if let Some(rv) = resource_version {
                meta["resourceVersion"] = serde_json::Value::String(rv.to_string());
            }
            if !annotations.is_empty() {
                meta["annotations"] = serde_json::json!(annotations);
            }
            let binding = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": meta,
                "target": { "apiVersion": "v1", "kind": "Node", "name": node },
            });
            let body = serde_json::to_vec(&binding).map_err(|e| ApiError {
                status: None,
                message: format!("cannot encode the binding: {e}"),
            })?;
            let mut request =
                kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/pods"))
                    .create_subresource("binding", name, &PostParams::default(), body)
                    .map_err(|e| ApiError {
                        status: None,
                        message: format!("cannot build the binding request: {e}"),
                    })?;
            // The API server gives the request up at our own deadline, so a binding whose
            // answer we never got cannot land later than `binding_deadline` after sending.
            let uri = request.uri().to_string();
            let sep = if uri.contains('?') { '&' } else { '?' };
            *request.uri_mut() = format!("{uri}{sep}timeout={}s", self.timeout.as_secs().max(1))
                .parse()
                .map_err(|e| ApiError {
                    status: None,
                    message: format!("cannot build the binding request: {e}"),
                })?;
            self.call(
                "the binding",
                self.client.request::<serde_json::Value>(request),
            )
            .await?;
            Ok(())
        })
    }

    fn binding_deadline(&self) -> std::time::Duration {
        // kube's client retries a 429/503/504 within the call, so the binding may be sent
        // again up to `timeout` after the first send; the server gives each send up `timeout`
        // after it arrived.
        self.timeout * 2
    }

    fn confirmed_by_watch(&self) -> bool {
        true
    }
}

/// Offline mode: the cluster file's pods (assigned or not) in memory; binds change only memory.
pub struct OfflinePodApi {
    pods: Mutex<BTreeMap<(String, String), Pod>>,
}

impl OfflinePodApi {
    pub fn new(pods: impl IntoIterator<Item = Pod>) -> Self {
        let pods = pods
            .into_iter()
            .filter_map(|p| {
                let ns = p
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into());
                let name = p.metadata.name.clone()?;
                Some(((ns, name), p))
            })
            .collect();
        OfflinePodApi {
            pods: Mutex::new(pods),
        }
    }
}

impl OfflinePodApi {
    /// Runs `f` on the stored pod, as the API server would after its UID precondition.
    fn with_pod<R>(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        f: impl FnOnce(&mut Pod) -> Result<R, ApiError>,
    ) -> Result<R, ApiError> {
        let mut pods = self.pods.lock();
        let pod = pods
            .get_mut(&(namespace.to_string(), name.to_string()))
            .ok_or_else(|| ApiError {
                status: Some(404),
                message: format!("pod {namespace}/{name} not found"),
            })?;
        if pod.metadata.uid.as_deref() != Some(uid) {
            return Err(ApiError {
                status: Some(409),
                message: "uid precondition failed".into(),
            });
        }
        let result = f(pod)?;
        // Every write moves a (numeric) resourceVersion on, as on an API server, so a
        // precondition taken before it fails after it.
        if let Some(rv) = &mut pod.metadata.resource_version
            && let Ok(n) = rv.parse::<u64>()
        {
            *rv = (n + 1).to_string();
        }
        Ok(result)
    }
}

impl PodApi for OfflinePodApi {
    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, ApiError>> {
        let pod = self
            .pods
            .lock()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned();
        Box::pin(async move { Ok(pod) })
    }

    fn patch_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        annotations: &'a BTreeMap<String, Option<String>>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let result = self.with_pod(namespace, name, uid, |pod| {
            // The check is kept so offline mode refuses what the API server would.
            if let (Some(want), Some(have)) = (resource_version, &pod.metadata.resource_version)
                && want != have
            {
                return Err(ApiError {
                    status: Some(409),
                    message: "resourceVersion precondition failed".into(),
                });
            }
            let target = pod
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            for (k, v) in annotations {
                match v {
                    Some(v) => target.insert(k.clone(), v.clone()),
                    None => target.remove(k),
                };
            }
            Ok(())
        });
        Box::pin(async move { result })
    }

    fn create_binding<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        node: &'a str,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let result = self.with_pod(namespace, name, uid, |pod| {
            if let (Some(want), Some(have)) = (resource_version, &pod.metadata.resource_version)
                && want != have
            {
                return Err(ApiError {
                    status: Some(409),
                    message: "resourceVersion precondition failed".into(),
                });
            }
            if let Some(existing) = pod.node_name() {
                return Err(ApiError {
                    status: Some(409),
                    message: format!("pod is already assigned to node {existing}"),
                });
            }
            pod.spec.node_name = Some(node.to_string());
            let target = pod
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            for (k, v) in annotations {
                target.insert(k.clone(), v.clone());
            }
            Ok(())
        });
        Box::pin(async move { result })
    }

    fn binding_deadline(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    fn confirmed_by_watch(&self) -> bool {
        false
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindOutcome {
    Bound,
    /// A retry of a bind that already succeeded.
    AlreadyBound,
    /// The binding call failed, but reading the pod back showed it bound here with our
    /// allocation (the API server committed it and the answer was lost).
    BoundDespiteError,
}

impl BindOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            BindOutcome::Bound => "bound",
            BindOutcome::AlreadyBound => "already_bound",
            BindOutcome::BoundDespiteError => "bound_despite_error",
        }
    }
}

/// What a failed commit left behind.
enum AfterFailure {
    /// Nothing of this bind is on a pod bound to our node (or the pod is gone): undo the
    /// assumed entry.
    NotBound,
    /// The binding may have landed or may still land: keep the allocation held and probe.
    Ambiguous,
}

/// The pod annotations this service owns, whichever ledger writes them. A bind that does not
/// set one of them removes it from the pod (a stale copy would be charged on the new node),
/// and read-backs compare exactly these. `resource-spec` is not here: it is the pod's own
/// request, which a bind may only complete (the node's forced bind policy), never remove.
pub const OWNED_ANNOTATIONS: &[&str] = &[DEVICE_ALLOCATED, RESOURCE_STATUS];

/// How many 409s on its binding a bind absorbs (each after a fresh read).
const MAX_PATCH_CONFLICTS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("invalid bind request: {0}")]
    InvalidRequest(String),
    #[error("pod {pod} not found")]
    PodNotFound { pod: String },
    #[error("pod {pod} has uid {actual}, not {expected}: it was recreated")]
    UidMismatch {
        pod: String,
        expected: String,
        actual: String,
    },
    #[error("pod {pod} is already bound to node {node}")]
    BoundElsewhere { pod: String, node: String },
    /// Bound to this very node by another write (another scheduler, an old leader, an earlier
    /// attempt of ours that landed late) after this bind read the pod: its allocation is the
    /// one that write carries, never one decided here.
    #[error(
        "pod {pod} was bound to node {node} by another write while this bind decided: nothing written, its allocation is the one it was bound with"
    )]
    BoundMeanwhile { pod: String, node: String },
    /// An earlier attempt's binding of this pod has no known outcome and may still land (the
    /// pod is unchanged since it was sent and the API server's deadline has not passed):
    /// deciding again now could hold the pod's devices on two nodes, or let its first binding
    /// land on devices handed to another pod.
    #[error(
        "an earlier binding of pod {pod} to node {node} may still land (the pod is unchanged since it was sent): retry shortly"
    )]
    PreviousBindingPending { pod: String, node: String },
    #[error(
        "pod {pod} is bound to node {node} without a device allocation it needs: not a bind of ours"
    )]
    BoundWithoutAllocation { pod: String, node: String },
    #[error("cannot place pod {pod} on node {node}: {reason}")]
    DoesNotFit {
        pod: String,
        node: String,
        reason: String,
    },
    #[error("invalid device request of pod {pod}: {reason}")]
    InvalidRequestResources { pod: String, reason: String },
    #[error("a bind of pod {pod} is already in progress")]
    InProgress { pod: String },
    #[error("not the leader: binds are served by the leader replica")]
    NotLeader,
    #[error(
        "the pod cache is catching up (relist after a leader change or a pod watch error): retry shortly"
    )]
    CacheNotCurrent,
    #[error("internal error during bind: {0}")]
    Internal(String),
    #[error("failed to {step} for pod {pod}: {source}")]
    Api {
        step: &'static str,
        pod: String,
        #[source]
        source: ApiError,
    },
}

/// What reading the pod back after a failed binding showed.
enum ReadBack {
    /// Bound to our node with our annotations: the binding landed, its answer was lost.
    Succeeded,
    /// Our binding has not landed and never will: the pod is gone, recreated, bound by another
    /// write (`bound_to`), or changed since the binding's resourceVersion.
    NotBound { bound_to: Option<String> },
    /// It may still land, or the read failed: keep the allocation held and probe.
    Ambiguous,
}

/// A re-read of the pod after a refused write.
enum ReRead {
    Unbound(Box<Pod>),
    /// Bound (anywhere): the pod as read.
    Bound(Box<Pod>),
}

/// How long past the API server's deadline for a binding request we still treat it as able
/// to land: etcd's commit of a request the server already gave up on, and clock slack.
const BINDING_LANDING_MARGIN: std::time::Duration = std::time::Duration::from_secs(5);

/// How an API write of bind's ended, as the leader ([`Binder::write_as_leader`]).
enum LeaderWrite<T> {
    /// Sent and answered (or given up by the call's own timeout).
    Done(Result<T, ApiError>),
    /// Not sent: this replica is not the leader.
    NotLeader,
    /// Sent, then abandoned when leadership was lost: its outcome is unknown.
    LostMidCall,
}

impl BindError {
    /// Short label for metrics.
    pub fn class(&self) -> &'static str {
        match self {
            BindError::InvalidRequest(_) => "invalid_request",
            BindError::PodNotFound { .. } => "pod_not_found",
            BindError::UidMismatch { .. } => "uid_mismatch",
            BindError::BoundElsewhere { .. } => "bound_elsewhere",
            BindError::BoundMeanwhile { .. } => "bound_meanwhile",
            BindError::PreviousBindingPending { .. } => "previous_binding_pending",
            BindError::BoundWithoutAllocation { .. } => "bound_without_allocation",
            BindError::DoesNotFit { .. } => "does_not_fit",
            BindError::InvalidRequestResources { .. } => "invalid_resources",
            BindError::InProgress { .. } => "in_progress",
            BindError::NotLeader => "not_leader",
            BindError::CacheNotCurrent => "cache_not_current",
            BindError::Internal(_) => "internal",
            BindError::Api {
                step: "read the pod",
                ..
            } => "api_get_error",
            BindError::Api {
                step: "patch annotations",
                ..
            } => "api_patch_error",
            BindError::Api { .. } => "api_binding_error",
        }
    }
}

/// Whether the pod carries exactly what a bind wrote: every set key with our value, every
/// removed key absent.
fn carries(pod: &Pod, written: &BTreeMap<String, Option<String>>) -> bool {
    written
        .iter()
        .all(|(k, v)| pod.annotation(k) == v.as_deref())
}

/// What a read of the pod says about an assumed allocation.
enum Verdict {
    /// Bound to our node with our annotations: keep (the watch commits it).
    BoundHere,
    /// Unbound, and the bind's binding may still land on it (the pod is at the binding's
    /// resourceVersion and the request's deadline has not passed): keep it held.
    MayStillLand,
    /// Gone, recreated, finished, bound here by someone else, or (`elsewhere`) bound to another
    /// node: release ours, touch nothing on the pod.
    Release { elsewhere: bool },
}

fn judge(uid: &PodUid, rec: &AssumedPod, pod: Option<&Pod>) -> Verdict {
    let Some(pod) = pod.filter(|p| p.metadata.uid.as_deref() == Some(uid.as_str())) else {
        return Verdict::Release { elsewhere: false };
    };
    if matches!(pod.status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return Verdict::Release { elsewhere: false };
    }
    match pod.node_name() {
        Some(node) if node == &*rec.node => {
            if carries(pod, &rec.annotations) {
                Verdict::BoundHere
            } else {
                Verdict::Release { elsewhere: false }
            }
        }
        Some(_) => Verdict::Release { elsewhere: true },
        // Our annotations only ever land with our binding: an unbound pod carries none of
        // them, so there is nothing to clean up.
        None => match &rec.binding {
            Some(sent)
                if sent.may_still_land(
                    pod.metadata.resource_version.as_deref(),
                    std::time::Instant::now(),
                ) =>
            {
                Verdict::MayStillLand
            }
            _ => Verdict::Release { elsewhere: false },
        },
    }
}

pub struct Binder {
    api: Arc<dyn PodApi>,
    cluster: Arc<ClusterState>,
    readiness: Arc<Readiness>,
    scoring: Arc<ScoringConfig>,
    metrics: Metrics,
}

impl Binder {
    pub fn new(
        api: Arc<dyn PodApi>,
        cluster: Arc<ClusterState>,
        readiness: Arc<Readiness>,
        scoring: Arc<ScoringConfig>,
        metrics: Metrics,
    ) -> Self {
        Binder {
            api,
            cluster,
            readiness,
            scoring,
            metrics,
        }
    }

    fn released(&self, path: &str, n: usize) {
        if n > 0 {
            self.metrics
                .assumed_released
                .with_label_values(&[path])
                .inc_by(n as u64);
        }
    }

    pub async fn bind(&self, args: &ExtenderBindingArgs) -> Result<BindOutcome, BindError> {
        for (field, value) in [
            ("PodName", &args.pod_name),
            ("PodNamespace", &args.pod_namespace),
            ("PodUID", &args.pod_uid),
            ("Node", &args.node),
        ] {
            if value.is_empty() {
                return Err(BindError::InvalidRequest(format!("{field} is empty")));
            }
        }
        let pod_key = format!("{}/{}", args.pod_namespace, args.pod_name);
        let uid = PodUid::new(&args.pod_uid);
        let assumptions = self.cluster.assumptions();
        let Some(_in_flight) = assumptions.begin(&uid) else {
            return Err(BindError::InProgress { pod: pod_key });
        };

        let pod = self
            .api
            .get_pod(&args.pod_namespace, &args.pod_name)
            .await
            .map_err(|source| BindError::Api {
                step: "read the pod",
                pod: pod_key.clone(),
                source,
            })?;
        // kube-scheduler retries a pod whose bind failed, perhaps to another node: an earlier
        // attempt's held allocation must neither block this one nor be held twice, and while
        // its binding may still land this one must wait.
        self.resolve_previous_attempt(&uid, pod.as_ref(), &pod_key)?;
        let pod = pod.ok_or_else(|| BindError::PodNotFound {
            pod: pod_key.clone(),
        })?;
        let actual_uid = pod.metadata.uid.clone().unwrap_or_default();
        if actual_uid != args.pod_uid {
            return Err(BindError::UidMismatch {
                pod: pod_key,
                expected: args.pod_uid.clone(),
                actual: actual_uid,
            });
        }
        let request = if self.readiness.is_enabled(Kind::Devices) {
            pod_device_request(&pod).map_err(|reason| BindError::InvalidRequestResources {
                pod: pod_key.clone(),
                reason,
            })?
        } else {
            None
        };
        let needs = PodNeeds {
            devices: request,
            cpu: fit::cpu_needs(
                &pod,
                self.readiness.is_enabled(Kind::NodeResourceTopologies),
                &self.scoring,
            )
            .map_err(|reason| BindError::InvalidRequestResources {
                pod: pod_key.clone(),
                reason,
            })?,
        };
        if let Some(bound) = pod.node_name() {
            if bound != args.node {
                return Err(BindError::BoundElsewhere {
                    pod: pod_key,
                    node: bound.to_string(),
                });
            }
            // A retry of our own successful bind carries our annotation. Bound here without
            // one while we would have allocated something, it is someone else's bind, and
            // answering success would report an allocation that does not exist (DESIGN §3).
            let needs_allocation = !needs.is_none()
                && self.cluster.node(&args.node).is_some_and(|e| {
                    match fit::decide(
                        Some(&e.read()),
                        &needs,
                        std::slice::from_ref(&uid),
                        &self.scoring,
                    ) {
                        Ok(d) => {
                            d.devices.is_some()
                                || d.cpu.as_ref().and_then(fit::resource_status).is_some()
                        }
                        Err(_) => true,
                    }
                });
            if needs_allocation
                && !OWNED_ANNOTATIONS
                    .iter()
                    .any(|k| pod.annotation(k).is_some())
            {
                return Err(BindError::BoundWithoutAllocation {
                    pod: pod_key,
                    node: bound.to_string(),
                });
            }
            return Ok(BindOutcome::AlreadyBound);
        }

        // Decide and record under the node's write lock, so concurrent binds on this node see
        // each other's assumed entries. The lock is released before any API call. A node no
        // object names has no entry: nothing to allocate, and none is created.
        let mut written: BTreeMap<String, Option<String>> = BTreeMap::new();
        let mut assumed_at = None;
        if !needs.is_none() {
            let decided =
                self.cluster.with_existing_node(
                    &args.node,
                    |state| -> Result<Option<std::time::Instant>, BindError> {
                        // Checked under the node lock, right before deciding: a fence raised after
                        // this point only concerns binds that decide after it.
                        if !self.readiness.pods_current() {
                            return Err(BindError::CacheNotCurrent);
                        }
                        // The pod watch committed this pod here after our read (another
                        // writer bound it): a decision would replace that allocation with
                        // ours, and the conflict that follows would then release it. Never
                        // let a decision replace a committed entry (issue 22).
                        if state.holds_committed(&uid) {
                            return Err(BindError::BoundMeanwhile {
                                pod: pod_key.clone(),
                                node: args.node.clone(),
                            });
                        }
                        let decision = fit::decide(Some(state), &needs, &[], &self.scoring)
                            .map_err(|e| BindError::DoesNotFit {
                                pod: pod_key.clone(),
                                node: args.node.clone(),
                                reason: e.reason.into_owned(),
                            })?;
                        // One instant for every ledger: one pod UID, one assumed-entry lifecycle.
                        let at = std::time::Instant::now();
                        let mut assumed = false;
                        if let Some(allocation) = decision.devices {
                            written.insert(
                                DEVICE_ALLOCATED.to_string(),
                                Some(allocation.to_annotation()),
                            );
                            state.devices.record(
                                uid.clone(),
                                RecordedAllocation::Allocated(allocation),
                                EntryState::Assumed { at },
                            );
                            assumed = true;
                        }
                        if let (Some(placement), Some(req)) = (&decision.cpu, &needs.cpu)
                            && let Some(status) = fit::resource_status(placement)
                        {
                            written.insert(RESOURCE_STATUS.to_string(), Some(status));
                            if let Some(spec) = fit::resource_spec_write_back(
                                &pod,
                                placement,
                                req,
                                state.cpus.bind_policy(),
                            ) {
                                written.insert(RESOURCE_SPEC.to_string(), Some(spec));
                            }
                            state.cpus.record(
                                uid.clone(),
                                RecordedCpus::Allocated(fit::recorded_cpus(placement, req)),
                                EntryState::Assumed { at },
                            );
                            assumed = true;
                        }
                        if !assumed {
                            return Ok(None);
                        }
                        // Lock order: node, then the assumptions.
                        assumptions.record(
                            uid.clone(),
                            AssumedPod {
                                namespace: args.pod_namespace.clone(),
                                name: args.pod_name.clone(),
                                node: Arc::from(args.node.as_str()),
                                at,
                                annotations: written.clone(),
                                outcome: Outcome::Writing,
                                binding: None,
                            },
                        );
                        Ok(Some(at))
                    },
                );
            // A node no object names: the decision on no state (a cpuset pod cannot go there).
            let decided = decided.or_else(|| {
                fit::decide(None, &needs, &[], &self.scoring)
                    .err()
                    .map(|e| {
                        Err(BindError::DoesNotFit {
                            pod: pod_key.clone(),
                            node: args.node.clone(),
                            reason: e.reason.into_owned(),
                        })
                    })
            });
            match decided {
                None | Some(Ok(None)) => {}
                Some(Ok(Some(at))) => assumed_at = Some(at),
                Some(Err(e)) => return Err(e),
            }
        }

        match self
            .commit(args, &pod_key, pod.clone(), &written, assumed_at)
            .await
        {
            Ok(outcome) => {
                // Only now, with the binding call returned, may a relist judge this entry.
                if let Some(at) = assumed_at {
                    assumptions.finish(&uid, at, true, std::time::Instant::now());
                }
                if !self.api.confirmed_by_watch() {
                    let mut bound = pod;
                    bound.spec.node_name = Some(args.node.clone());
                    let ann = bound
                        .metadata
                        .annotations
                        .get_or_insert_with(Default::default);
                    for (k, v) in written {
                        match v {
                            Some(v) => ann.insert(k, v),
                            None => ann.remove(&k),
                        };
                    }
                    if let Some(record) = PodRecord::from_pod(&bound) {
                        self.cluster.upsert_pod(None, &record);
                        tracing::info!(pod = %pod_key, node = %args.node, "offline mode: bind recorded in memory only");
                    }
                }
                Ok(outcome)
            }
            Err((e, AfterFailure::NotBound)) => {
                if let Some(at) = assumed_at {
                    self.cluster.release_assumed(&args.node, &uid, at);
                }
                Err(e)
            }
            Err((e, AfterFailure::Ambiguous)) => {
                // The pod may be running on the node with our minors, or become so: keep the
                // entry (the pod watch commits it, the probe or a relist resolves it).
                tracing::warn!(pod = %pod_key, node = %args.node, error = %e, "cannot tell whether the failed bind took effect: keeping the allocation held and probing");
                if let Some(at) = assumed_at {
                    assumptions.finish(&uid, at, false, std::time::Instant::now());
                }
                Err(e)
            }
        }
    }

    /// Resolves an earlier attempt's held allocation for this UID against the retry's read:
    /// kept only while the pod is bound where that attempt put it.
    fn resolve_previous_attempt(
        &self,
        uid: &PodUid,
        pod: Option<&Pod>,
        pod_key: &str,
    ) -> Result<(), BindError> {
        let Some(prev) = self.cluster.assumptions().get(uid) else {
            return Ok(());
        };
        let pod = pod.filter(|p| p.metadata.uid.as_deref() == Some(uid.as_str()));
        let bound_there = pod.is_some_and(|p| {
            p.node_name() == Some(&*prev.node)
                && !matches!(p.status.phase.as_deref(), Some("Succeeded" | "Failed"))
        });
        if bound_there {
            return Ok(());
        }
        // Unbound and unchanged since the earlier binding was sent: it may still land.
        if let (Some(pod), Some(sent)) = (pod, &prev.binding)
            && pod.node_name().is_none()
            && !matches!(prev.outcome, Outcome::Bound { .. })
            && sent.may_still_land(
                pod.metadata.resource_version.as_deref(),
                std::time::Instant::now(),
            )
        {
            return Err(BindError::PreviousBindingPending {
                pod: pod_key.to_string(),
                node: prev.node.to_string(),
            });
        }
        if self.cluster.release_assumed(&prev.node, uid, prev.at) {
            tracing::info!(node = %prev.node, pod = %format!("{}/{}", prev.namespace, prev.name), "retried bind: released the previous attempt's held allocation");
            self.released("retry", 1);
        }
        Ok(())
    }

    /// Runs one of bind's API writes as the leader: refused before it is sent when this
    /// replica is not the leader (or its lease lapsed), and abandoned as soon as leadership is
    /// lost while it waits for its answer. An abandoned write may still be applied by the API
    /// server; callers treat it like an answer that never came.
    /// `call` makes the write only once leadership was checked.
    async fn write_as_leader<T, F: Future<Output = Result<T, ApiError>>>(
        &self,
        call: impl FnOnce() -> F,
    ) -> LeaderWrite<T> {
        if !self.readiness.is_leader() {
            return LeaderWrite::NotLeader;
        }
        tokio::select! {
            biased;
            result = call() => LeaderWrite::Done(result),
            _ = self.readiness.leadership_lost() => {
                self.metrics.binds_fenced.inc();
                tracing::warn!("leadership lost during a bind's API write: abandoned it; its outcome is unknown");
                LeaderWrite::LostMidCall
            }
        }
    }

    /// Commits the decision in one write: the `pods/binding`, carrying the annotations
    /// (which the API server merges into the pod with `spec.nodeName`), under the pod's UID and
    /// the resourceVersion of the read this bind decided on. A 409 re-reads the pod and, if it
    /// is still unbound, sends the same binding under the fresh resourceVersion (nothing is
    /// re-decided). Owned annotations this bind does not set, if the pod carries any, are
    /// removed by a patch first (a binding can add annotations, not remove them). On failure,
    /// says what the failure left behind.
    async fn commit(
        &self,
        args: &ExtenderBindingArgs,
        pod_key: &str,
        mut current: Pod,
        written: &BTreeMap<String, Option<String>>,
        assumed_at: Option<std::time::Instant>,
    ) -> Result<BindOutcome, (BindError, AfterFailure)> {
        // A replica that lost leadership since the request arrived must not write.
        if !self.readiness.is_leader() {
            return Err((BindError::NotLeader, AfterFailure::NotBound));
        }
        let api_error = |step: &'static str, source: ApiError| BindError::Api {
            step,
            pod: pod_key.to_string(),
            source,
        };
        // Stale owned annotations (another writer's, or an older version's that patched
        // before binding): removed first, under the read's resourceVersion, then re-read for
        // the resourceVersion the binding carries. Ours only ever land with a binding.
        let removals: BTreeMap<String, Option<String>> = OWNED_ANNOTATIONS
            .iter()
            .filter(|k| !written.contains_key(**k) && current.annotation(k).is_some())
            .map(|k| (k.to_string(), None))
            .collect();
        if !removals.is_empty() {
            let removed = self
                .write_as_leader(|| {
                    self.api.patch_annotations(
                        &args.pod_namespace,
                        &args.pod_name,
                        &args.pod_uid,
                        current.metadata.resource_version.as_deref(),
                        &removals,
                    )
                })
                .await;
            match removed {
                LeaderWrite::Done(Ok(())) => {}
                LeaderWrite::Done(Err(source)) => {
                    if source.status == Some(409) {
                        self.metrics.bind_patch_conflicts.inc();
                    }
                    return Err((
                        api_error("patch annotations", source),
                        AfterFailure::NotBound,
                    ));
                }
                LeaderWrite::NotLeader | LeaderWrite::LostMidCall => {
                    return Err((BindError::NotLeader, AfterFailure::NotBound));
                }
            }
            current = match self.reread(args, pod_key).await {
                Ok(ReRead::Unbound(fresh)) => *fresh,
                Ok(ReRead::Bound(pod)) => {
                    let node = pod.node_name().unwrap_or_default();
                    return Err((
                        self.bound_meanwhile(args, pod_key, node, "patch"),
                        AfterFailure::NotBound,
                    ));
                }
                Err(e) => return Err((e, AfterFailure::NotBound)),
            };
        }
        let sets: BTreeMap<String, String> = written
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
            .collect();
        let mut conflicts = 0;
        // A re-read after a 409 that found the pod bound: judged as the read-back, not read
        // again.
        let mut bound_read = None;
        loop {
            let rv = current.metadata.resource_version.clone();
            let sent = SentBinding {
                resource_version: rv.clone(),
                may_land_until: std::time::Instant::now()
                    + self.api.binding_deadline()
                    + BINDING_LANDING_MARGIN,
            };
            if let Some(at) = assumed_at {
                self.cluster.assumptions().binding_sent(
                    &PodUid::new(&args.pod_uid),
                    at,
                    sent.clone(),
                );
            }
            let bound = self
                .write_as_leader(|| {
                    self.api.create_binding(
                        &args.pod_namespace,
                        &args.pod_name,
                        &args.pod_uid,
                        rv.as_deref(),
                        &args.node,
                        &sets,
                    )
                })
                .await;
            let source = match bound {
                LeaderWrite::Done(Ok(())) => return Ok(BindOutcome::Bound),
                LeaderWrite::NotLeader => {
                    return Err((BindError::NotLeader, AfterFailure::NotBound));
                }
                // The binding may still land: read the pod back, as after any unknown outcome
                // (no longer the leader, that read never writes).
                LeaderWrite::LostMidCall => {
                    return match self
                        .after_failed_binding(args, pod_key, written, &sent, None)
                        .await
                    {
                        ReadBack::Succeeded => Ok(BindOutcome::BoundDespiteError),
                        ReadBack::NotBound { .. } => {
                            Err((BindError::NotLeader, AfterFailure::NotBound))
                        }
                        ReadBack::Ambiguous => Err((BindError::NotLeader, AfterFailure::Ambiguous)),
                    };
                }
                LeaderWrite::Done(Err(source)) => source,
            };
            if source.status == Some(409) && conflicts < MAX_PATCH_CONFLICTS {
                // Refused, not applied: the pod changed since our read (its resourceVersion),
                // or is bound already. Re-read: retry the same binding on an unbound pod.
                conflicts += 1;
                self.metrics.bind_patch_conflicts.inc();
                tracing::info!(pod = %pod_key, attempt = conflicts, "binding conflicted; re-reading the pod");
                match self.reread(args, pod_key).await {
                    Ok(ReRead::Unbound(fresh)) => {
                        current = *fresh;
                        continue;
                    }
                    Ok(ReRead::Bound(pod)) => bound_read = Some(*pod),
                    Err(e) => return Err((e, AfterFailure::NotBound)),
                }
            }
            // A 4xx is a refusal: nothing was applied, and the request is finished, so it can
            // never land. A 5xx, a timeout or a lost answer may have been applied, or may be.
            let refused = source.status.is_some_and(|s| (400..500).contains(&s));
            let sent = if refused {
                let expired = SentBinding {
                    may_land_until: std::time::Instant::now(),
                    ..sent
                };
                if let Some(at) = assumed_at {
                    self.cluster.assumptions().binding_sent(
                        &PodUid::new(&args.pod_uid),
                        at,
                        expired.clone(),
                    );
                }
                expired
            } else {
                sent
            };
            let e = api_error("create the binding", source);
            return match self
                .after_failed_binding(args, pod_key, written, &sent, bound_read.take())
                .await
            {
                ReadBack::Succeeded => {
                    tracing::warn!(pod = %pod_key, node = %args.node, error = %e, "the binding failed but took effect: keeping the allocation");
                    Ok(BindOutcome::BoundDespiteError)
                }
                // Bound by another write: say so truthfully, and where.
                ReadBack::NotBound {
                    bound_to: Some(node),
                } => Err((
                    self.bound_meanwhile(args, pod_key, &node, "binding"),
                    AfterFailure::NotBound,
                )),
                ReadBack::NotBound { bound_to: None } => Err((e, AfterFailure::NotBound)),
                // Refused: whatever the read could not tell, our binding did not land.
                ReadBack::Ambiguous if refused => Err((e, AfterFailure::NotBound)),
                ReadBack::Ambiguous => Err((e, AfterFailure::Ambiguous)),
            };
        }
    }

    /// The error for a pod found bound by another write during this bind: on this node it
    /// was bound meanwhile (its allocation is the one it was bound with); elsewhere it is
    /// counted in `dne_bind_found_bound_elsewhere_total{stage}`.
    fn bound_meanwhile(
        &self,
        args: &ExtenderBindingArgs,
        pod_key: &str,
        node: &str,
        stage: &str,
    ) -> BindError {
        tracing::warn!(pod = %pod_key, node, ours = %args.node, "pod was bound by another write during our bind: leaving its annotations alone");
        if node == args.node {
            BindError::BoundMeanwhile {
                pod: pod_key.to_string(),
                node: node.to_string(),
            }
        } else {
            self.metrics
                .bound_elsewhere
                .with_label_values(&[stage])
                .inc();
            BindError::BoundElsewhere {
                pod: pod_key.to_string(),
                node: node.to_string(),
            }
        }
    }

    /// Reads the pod again after a refused write: still ours to bind (unbound, same UID), or
    /// bound by someone (where), or gone / recreated (an error).
    async fn reread(&self, args: &ExtenderBindingArgs, pod_key: &str) -> Result<ReRead, BindError> {
        let fresh = self
            .api
            .get_pod(&args.pod_namespace, &args.pod_name)
            .await
            .map_err(|source| BindError::Api {
                step: "read the pod",
                pod: pod_key.to_string(),
                source,
            })?;
        let Some(fresh) = fresh else {
            return Err(BindError::PodNotFound {
                pod: pod_key.to_string(),
            });
        };
        let fresh_uid = fresh.metadata.uid.clone().unwrap_or_default();
        if fresh_uid != args.pod_uid {
            return Err(BindError::UidMismatch {
                pod: pod_key.to_string(),
                expected: args.pod_uid.clone(),
                actual: fresh_uid,
            });
        }
        Ok(match fresh.node_name() {
            Some(_) => ReRead::Bound(Box::new(fresh)),
            None => ReRead::Unbound(Box::new(fresh)),
        })
    }

    /// A failed binding may still have taken effect (a timeout or lost answer after the API
    /// server committed it), or may still commit later. Rolling back then would leave a pod
    /// running on the node with our minors, uncounted. So read the pod back before undoing
    /// anything. `read`: the pod as just read after the failure, if it was.
    async fn after_failed_binding(
        &self,
        args: &ExtenderBindingArgs,
        pod_key: &str,
        written: &BTreeMap<String, Option<String>>,
        sent: &SentBinding,
        read: Option<Pod>,
    ) -> ReadBack {
        let read = match read {
            Some(pod) => Ok(Some(pod)),
            None => self.api.get_pod(&args.pod_namespace, &args.pod_name).await,
        };
        let pod = match read {
            Ok(Some(pod)) => pod,
            // Deleted: nothing runs, nothing to clear.
            Ok(None) => return ReadBack::NotBound { bound_to: None },
            Err(_) => return ReadBack::Ambiguous,
        };
        if pod.metadata.uid.as_deref() != Some(args.pod_uid.as_str()) {
            // Recreated: the binding's UID precondition can never match the new pod.
            return ReadBack::NotBound { bound_to: None };
        }
        match pod.node_name() {
            // Ours landed (the answer was lost).
            Some(node) if node == args.node && carries(&pod, written) => ReadBack::Succeeded,
            // Bound by another write, here with another allocation (the watch records theirs)
            // or elsewhere (another scheduler, an earlier attempt of ours that landed late):
            // ours can no longer land, and whatever the pod carries is its node's.
            Some(node) => ReadBack::NotBound {
                bound_to: Some(node.to_string()),
            },
            None => {
                if sent.may_still_land(
                    pod.metadata.resource_version.as_deref(),
                    std::time::Instant::now(),
                ) {
                    // Unbound at the very resourceVersion our binding carried: it may still
                    // land (with our annotations, on our node). Hold the allocation until the
                    // pod changes or the API server's deadline for the request passes.
                    tracing::warn!(pod = %pod_key, node = %args.node, "the binding's outcome is unknown and it may still land: keeping the allocation held");
                    ReadBack::Ambiguous
                } else {
                    // The pod changed since (or the deadline passed): the binding's
                    // resourceVersion precondition can never match again.
                    ReadBack::NotBound { bound_to: None }
                }
            }
        }
    }

    /// Acts on a read of an assumed allocation's pod; true when the allocation was released.
    async fn settle(&self, uid: &PodUid, rec: &AssumedPod, pod: Option<&Pod>, path: &str) -> bool {
        let pod_key = format!("{}/{}", rec.namespace, rec.name);
        match judge(uid, rec, pod) {
            Verdict::BoundHere => {
                self.cluster
                    .assumptions()
                    .confirm_bound(uid, rec.at, std::time::Instant::now());
                false
            }
            Verdict::Release { elsewhere } => {
                if elsewhere {
                    self.metrics
                        .bound_elsewhere
                        .with_label_values(&["probe"])
                        .inc();
                }
                let released = self.cluster.release_assumed(&rec.node, uid, rec.at);
                if released {
                    tracing::info!(node = %rec.node, pod = %pod_key, path, elsewhere, "released an assumed allocation: pod gone, finished or elsewhere");
                    self.released(path, 1);
                }
                released
            }
            Verdict::MayStillLand => {
                tracing::info!(pod = %pod_key, node = %rec.node, "the pod is unbound but our binding may still land: keeping the allocation held");
                self.cluster
                    .assumptions()
                    .probe_failed(uid, rec.at, std::time::Instant::now());
                false
            }
        }
    }

    /// Probes assumed entries whose next probe is due: ambiguous binds (1, 2, 4, 8 s after the
    /// failure, then every 8 s until resolved) and binds whose binding returned but which the
    /// pod watch has not confirmed within `CONFIRM_GRACE` (see `cluster::assumed`); returns
    /// how many were released.
    pub async fn probe_ambiguous(&self) -> usize {
        let now = std::time::Instant::now();
        let mut released = 0;
        for (uid, rec) in self.cluster.assumptions().due_probes(now) {
            // Committed by the watch (the binding landed) or rolled back meanwhile: nothing
            // left to probe.
            let still_assumed = self.cluster.node(&rec.node).is_some_and(|e| {
                matches!(e.read().entry_state(&uid), Some(EntryState::Assumed { at }) if at == rec.at)
            });
            if !still_assumed {
                self.cluster.assumptions().forget(&uid, rec.at);
                continue;
            }
            match self.api.get_pod(&rec.namespace, &rec.name).await {
                Ok(pod) => {
                    if self.settle(&uid, &rec, pod.as_ref(), "probe").await {
                        released += 1;
                    }
                }
                Err(error) => {
                    tracing::debug!(pod_uid = %uid, %error, "cannot probe an ambiguous bind yet");
                    self.cluster.assumptions().probe_failed(
                        &uid,
                        rec.at,
                        std::time::Instant::now(),
                    );
                }
            }
        }
        released
    }

    /// Sets `dne_assumed_entries{age}`: the recorded assumptions whose ledger entry is still
    /// assumed (proportional to binds awaiting confirmation, not to the number of nodes).
    pub fn update_assumed_gauge(&self) {
        let now = std::time::Instant::now();
        let mut buckets = [0i64; 4];
        for (uid, rec) in self.cluster.assumptions().snapshot() {
            let still_assumed = self.cluster.node(&rec.node).is_some_and(|e| {
                matches!(e.read().entry_state(&uid), Some(EntryState::Assumed { at }) if at == rec.at)
            });
            if !still_assumed {
                continue;
            }
            let at = rec.at;
            let age = now.saturating_duration_since(at).as_secs();
            let i = match age {
                0..10 => 0,
                10..60 => 1,
                60..300 => 2,
                _ => 3,
            };
            buckets[i] += 1;
        }
        for (label, n) in crate::metrics::ASSUMED_AGE_BUCKETS.iter().zip(buckets) {
            self.metrics
                .assumed_entries
                .with_label_values(&[label])
                .set(n);
        }
    }

    /// Drops assumed entries that nothing resolved within `ttl`; returns how many.
    ///
    /// Age alone is not proof: during a pod-watch outage longer than `ttl` a bound, running pod
    /// is never confirmed either, and dropping its entry would hand its devices out again. So
    /// each candidate's pod is read from the API server first: it is kept while the pod is
    /// bound to that node with our annotations and not terminal, and also when the read fails
    /// (checked again next round). An entry whose bind is still in flight is never expired:
    /// its writes may be slow, and dropping it would let a concurrent bind hand out the same
    /// devices (issue 9 §1.2).
    pub async fn expire_assumed(&self, ttl: std::time::Duration) -> usize {
        let now = std::time::Instant::now();
        let candidates: Vec<_> = self
            .cluster
            .assumed_entries()
            .into_iter()
            .filter(|(_, _, at)| now.saturating_duration_since(*at) >= ttl)
            .collect();
        self.cluster.prune_assumptions();
        let assumptions = self.cluster.assumptions();
        let mut expired = 0;
        for (node, uid, at) in candidates {
            if assumptions.is_in_flight(&uid) {
                tracing::debug!(%node, pod_uid = %uid, "old assumed allocation still has its bind in flight; keeping it");
                continue;
            }
            let released = match assumptions.get(&uid).filter(|p| p.at == at) {
                // No pod to ask about (an entry no bind of this process recorded).
                None => {
                    let released = self.cluster.release_assumed(&node, &uid, at);
                    self.released("ttl", usize::from(released));
                    released
                }
                Some(rec) => match self.api.get_pod(&rec.namespace, &rec.name).await {
                    Err(error) => {
                        tracing::debug!(%node, pod_uid = %uid, %error, "cannot confirm an old assumed allocation; keeping it");
                        continue;
                    }
                    Ok(pod) => {
                        let released = self.settle(&uid, &rec, pod.as_ref(), "ttl").await;
                        if !released
                            && assumptions
                                .get(&uid)
                                .is_some_and(|p| matches!(p.outcome, Outcome::Bound { .. }))
                        {
                            tracing::warn!(%node, pod = %format!("{}/{}", rec.namespace, rec.name), "assumed allocation unconfirmed by the pod watch, but the pod is bound here: keeping it");
                        }
                        released
                    }
                },
            };
            if released {
                tracing::warn!(%node, pod_uid = %uid, "assumed allocation expired without bind confirmation");
                expired += 1;
            }
        }
        if expired > 0 {
            self.metrics.assumed_expired.inc_by(expired as u64);
        }
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::NodeState;
    use crate::fit::allocate_on;
    use crate::model::device::DeviceAllocations;
    use crate::model::device::{DeviceAllocation, DeviceType, GPU_MEMORY_RATIO};
    use crate::model::quantity::Quantity;
    use crate::placement::device::request::PodDeviceRequest;

    fn gpu_request() -> PodDeviceRequest {
        let requests = crate::model::requests::Requests::from([(
            "nvidia.com/gpu".to_string(),
            Quantity::from_milli(1000),
        )]);
        crate::placement::device::request::parse_device_request(&requests, None)
            .expect("valid")
            .expect("needs a GPU")
    }

    /// Issue 9 §1.5: a node without a Device object whose only holders are the proposed
    /// victims is passable once they are gone (preempt must account for them).
    #[test]
    fn deviceless_node_is_passable_once_its_holders_are_victims() {
        let mut node = NodeState::default();
        let holder = PodUid::new("holder");
        node.devices.record(
            holder.clone(),
            RecordedAllocation::Allocated(DeviceAllocations(BTreeMap::from([(
                DeviceType::Gpu,
                vec![DeviceAllocation {
                    minor: 0,
                    resources: BTreeMap::from([(
                        GPU_MEMORY_RATIO.to_string(),
                        Quantity::from_milli(100_000),
                    )]),
                    id: String::new(),
                    extension: None,
                }],
            )]))),
            EntryState::Committed,
        );
        let req = gpu_request();
        let scoring = ScoringConfig::default();
        let blocked = allocate_on(Some(&node), &req, &[], &scoring).unwrap_err();
        assert_eq!(blocked.reason, "device object missing");
        assert!(!blocked.unresolvable);
        assert_eq!(
            allocate_on(Some(&node), &req, &[holder], &scoring).map_err(|e| e.reason),
            Ok(None)
        );
        let other = PodUid::new("someone-else");
        assert!(allocate_on(Some(&node), &req, &[other], &scoring).is_err());
    }
}
