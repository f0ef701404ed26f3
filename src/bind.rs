//! Bind: the one place an allocation is decided and committed.
//!
//! kube-scheduler runs binds asynchronously and concurrently with later filters, so the
//! allocation is computed here, not in filter: lock the node, allocate against committed +
//! assumed entries, record the result as *assumed* under the pod UID, unlock, patch the pod's
//! annotations, create the `pods/binding`. Any failure removes the assumed entry. The pod
//! watch later replaces the assumed entry with the committed one.
//!
//! API writes go through [`PodApi`], so the same logic serves the kube client and the
//! offline (cluster file) mode.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use kube::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;

use crate::cluster::devices::{EntryState, RecordedAllocation};
use crate::cluster::{ClusterState, NodeState, PodRecord};
use crate::extender::wire::ExtenderBindingArgs;
use crate::metrics::Metrics;
use crate::model::annotations::DEVICE_ALLOCATED;
use crate::model::device::DeviceAllocations;
use crate::model::ids::PodUid;
use crate::model::pod::Pod;
use crate::placement::device::allocate::{FitError, fit_with};
use crate::placement::device::pod_device_request;
use crate::placement::device::request::PodDeviceRequest;
use crate::placement::device::score::ScoringConfig;
use crate::sync::{Kind, Readiness};

/// The device policy for one node, shared by filter, preempt and bind:
/// `Ok(None)` = nothing to allocate here, `Ok(Some)` = the allocation, `Err` = no fit.
///
/// A node without a Device object is left to the kubelet's device plugins (koordinator #1594)
/// unless pods on it hold koordinator device allocations: then its Device object is missing
/// (deleted, or not yet arrived) and nothing is allocatable until it is back, while what those
/// pods hold stays counted (koordinator #1186). The rule depends only on current API state, so
/// a restarted or standby replica decides exactly as a long-running one.
pub fn allocate_on(
    node: Option<&NodeState>,
    req: &PodDeviceRequest,
    ignore: &[PodUid],
    scoring: &ScoringConfig,
) -> Result<Option<DeviceAllocations>, FitError> {
    let Some(node) = node else {
        return Ok(None);
    };
    if node.devices.devices().is_none() {
        return if node.devices.is_empty() {
            Ok(None)
        } else {
            Err(FitError {
                reason: "device object missing".into(),
                unresolvable: false,
            })
        };
    }
    fit_with(&node.devices, req, ignore, scoring).map(Some)
}

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
    /// Merge-patches annotations (`None` removes one), with the pod UID as precondition.
    fn patch_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        annotations: &'a BTreeMap<String, Option<String>>,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
    /// Creates `pods/binding` with the pod UID as precondition.
    fn create_binding<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        node: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
    /// True when a pod watch will confirm binds; false when bind must commit itself (offline).
    fn confirmed_by_watch(&self) -> bool;
}

pub struct KubePodApi {
    client: kube::Client,
}

impl KubePodApi {
    pub fn new(client: kube::Client) -> Self {
        KubePodApi { client }
    }
    fn api(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

impl PodApi for KubePodApi {
    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, ApiError>> {
        Box::pin(async move { Ok(self.api(namespace).get_opt(name).await?) })
    }

    fn patch_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        annotations: &'a BTreeMap<String, Option<String>>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let patch =
                serde_json::json!({ "metadata": { "uid": uid, "annotations": annotations } });
            self.api(namespace)
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            Ok(())
        })
    }

    fn create_binding<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        node: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let binding = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": { "name": name, "namespace": namespace, "uid": uid },
                "target": { "apiVersion": "v1", "kind": "Node", "name": node },
            });
            self.api(namespace)
                .create_subresource::<_, serde_json::Value>(
                    "binding",
                    name,
                    &PostParams::default(),
                    &binding,
                )
                .await?;
            Ok(())
        })
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
        f(pod)
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
        annotations: &'a BTreeMap<String, Option<String>>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let result = self.with_pod(namespace, name, uid, |pod| {
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
        node: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let result = self.with_pod(namespace, name, uid, |pod| {
            if let Some(existing) = pod.node_name() {
                return Err(ApiError {
                    status: Some(409),
                    message: format!("pod is already assigned to node {existing}"),
                });
            }
            pod.spec.node_name = Some(node.to_string());
            Ok(())
        });
        Box::pin(async move { result })
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

/// What a failed commit left behind.
enum AfterFailure {
    /// The pod is bound to the requested node with our annotation: the bind succeeded.
    BoundAnyway,
    /// The pod could not be read back: it may or may not be bound.
    Unknown,
    /// The pod is not on the requested node (or gone): undo the assumed entry.
    NotBound { clear_annotation: bool },
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

impl BindError {
    /// Short label for metrics.
    pub fn class(&self) -> &'static str {
        match self {
            BindError::InvalidRequest(_) => "invalid_request",
            BindError::PodNotFound { .. } => "pod_not_found",
            BindError::UidMismatch { .. } => "uid_mismatch",
            BindError::BoundElsewhere { .. } => "bound_elsewhere",
            BindError::DoesNotFit { .. } => "does_not_fit",
            BindError::InvalidRequestResources { .. } => "invalid_resources",
            BindError::InProgress { .. } => "in_progress",
            BindError::NotLeader => "not_leader",
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

pub struct Binder {
    api: Arc<dyn PodApi>,
    cluster: Arc<ClusterState>,
    readiness: Arc<Readiness>,
    scoring: Arc<ScoringConfig>,
    metrics: Metrics,
    /// Pod UIDs with a bind in flight: a duplicate (kube-scheduler retrying after a timeout)
    /// must not replace, then roll back, the first attempt's assumed entry.
    in_flight: Mutex<std::collections::BTreeSet<PodUid>>,
    /// Which pod each assumed entry belongs to, so expiry can ask the API server about it.
    assumed: Mutex<std::collections::HashMap<PodUid, AssumedPod>>,
}

/// The pod behind an assumed ledger entry.
#[derive(Clone, Debug)]
struct AssumedPod {
    namespace: String,
    name: String,
    node: String,
    /// The entry's `EntryState::Assumed::at`: identifies this bind's entry.
    at: std::time::Instant,
}

/// Removes the pod from the in-flight set however the bind ends.
struct InFlight<'a> {
    set: &'a Mutex<std::collections::BTreeSet<PodUid>>,
    uid: PodUid,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.set.lock().remove(&self.uid);
    }
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
            in_flight: Mutex::new(Default::default()),
            assumed: Mutex::new(Default::default()),
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
        if !self.in_flight.lock().insert(uid.clone()) {
            return Err(BindError::InProgress { pod: pod_key });
        }
        let _guard = InFlight {
            set: &self.in_flight,
            uid: uid.clone(),
        };

        let pod = self
            .api
            .get_pod(&args.pod_namespace, &args.pod_name)
            .await
            .map_err(|source| BindError::Api {
                step: "read the pod",
                pod: pod_key.clone(),
                source,
            })?
            .ok_or_else(|| BindError::PodNotFound {
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
        if let Some(bound) = pod.node_name() {
            return if bound == args.node {
                Ok(BindOutcome::AlreadyBound)
            } else {
                Err(BindError::BoundElsewhere {
                    pod: pod_key,
                    node: bound.to_string(),
                })
            };
        }
        let request = if self.readiness.is_enabled(Kind::Devices) {
            pod_device_request(&pod).map_err(|reason| BindError::InvalidRequestResources {
                pod: pod_key.clone(),
                reason,
            })?
        } else {
            None
        };

        // Decide and record under the node's write lock, so concurrent binds on this node see
        // each other's assumed entries. The lock is released before any API call.
        let mut annotations: BTreeMap<String, Option<String>> = BTreeMap::new();
        let mut assumed = false;
        if let Some(req) = &request {
            let entry = self.cluster.node_or_create(&args.node);
            let mut state = entry.write();
            let allocation = allocate_on(Some(&state), req, &[], &self.scoring).map_err(|e| {
                BindError::DoesNotFit {
                    pod: pod_key.clone(),
                    node: args.node.clone(),
                    reason: e.reason,
                }
            })?;
            if let Some(allocation) = allocation {
                annotations.insert(
                    DEVICE_ALLOCATED.to_string(),
                    Some(allocation.to_annotation()),
                );
                let at = std::time::Instant::now();
                state.devices.record(
                    uid.clone(),
                    RecordedAllocation::Allocated(allocation),
                    EntryState::Assumed { at },
                );
                // Lock order: node, then the assumed map (expiry never holds both).
                self.assumed.lock().insert(
                    uid.clone(),
                    AssumedPod {
                        namespace: args.pod_namespace.clone(),
                        name: args.pod_name.clone(),
                        node: args.node.clone(),
                        at,
                    },
                );
                assumed = true;
            }
        }
        let mut outcome = BindOutcome::Bound;
        if let Err(e) = self.commit(args, &pod_key, &annotations).await {
            match self.after_failed_commit(&e, args, &annotations).await {
                AfterFailure::BoundAnyway => {
                    tracing::warn!(pod = %pod_key, node = %args.node, error = %e, "the binding failed but took effect: keeping the allocation");
                    outcome = BindOutcome::BoundDespiteError;
                }
                AfterFailure::Unknown => {
                    // The pod may be running on the node with our minors: keep the assumed
                    // entry (the pod watch commits it, or it expires) and the annotation.
                    tracing::warn!(pod = %pod_key, node = %args.node, error = %e, "cannot tell whether the failed binding took effect: keeping the allocation assumed");
                    return Err(e);
                }
                AfterFailure::NotBound { clear_annotation } => {
                    if assumed {
                        self.roll_back(&args.node, &uid);
                    }
                    if clear_annotation && !annotations.is_empty() {
                        self.clear_annotation(args, &pod_key).await;
                    }
                    return Err(e);
                }
            }
        }
        if !self.api.confirmed_by_watch() {
            let mut bound = pod.clone();
            bound.spec.node_name = Some(args.node.clone());
            let ann = bound
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            ann.extend(annotations.into_iter().filter_map(|(k, v)| Some((k, v?))));
            if let Some(record) = PodRecord::from_pod(&bound) {
                self.cluster.upsert_pod(None, &record);
                tracing::info!(pod = %pod_key, node = %args.node, "offline mode: bind recorded in memory only");
            }
        }
        Ok(outcome)
    }

    /// A failed binding may still have taken effect (a timeout or lost answer after the API
    /// server committed it). Rolling back then would leave a pod running on the node with our
    /// minors, uncounted, and clearing its annotation would hide them from koordlet too: the
    /// next bind would hand out the same GPU. So read the pod back before undoing anything.
    async fn after_failed_commit(
        &self,
        error: &BindError,
        args: &ExtenderBindingArgs,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> AfterFailure {
        if !matches!(
            error,
            BindError::Api {
                step: "create the binding",
                ..
            }
        ) {
            return AfterFailure::NotBound {
                clear_annotation: false,
            };
        }
        let pod = match self.api.get_pod(&args.pod_namespace, &args.pod_name).await {
            Ok(Some(pod)) => pod,
            // Deleted: nothing runs, nothing to clear.
            Ok(None) => {
                return AfterFailure::NotBound {
                    clear_annotation: false,
                };
            }
            Err(_) => return AfterFailure::Unknown,
        };
        if pod.metadata.uid.as_deref() != Some(args.pod_uid.as_str()) {
            // Recreated: the new pod never carried our annotation (the patch was UID-guarded).
            return AfterFailure::NotBound {
                clear_annotation: false,
            };
        }
        match pod.node_name() {
            Some(node) if node == args.node => {
                let ours = annotations
                    .get(DEVICE_ALLOCATED)
                    .and_then(|v| v.as_deref())
                    .is_none_or(|v| pod.annotation(DEVICE_ALLOCATED) == Some(v));
                if ours {
                    AfterFailure::BoundAnyway
                } else {
                    // Bound here by someone else with another allocation: the watch records
                    // theirs; ours must go, and their annotation must stay.
                    AfterFailure::NotBound {
                        clear_annotation: false,
                    }
                }
            }
            // Unbound, or bound elsewhere: it must not keep an allocation for our node.
            _ => AfterFailure::NotBound {
                clear_annotation: true,
            },
        }
    }

    async fn commit(
        &self,
        args: &ExtenderBindingArgs,
        pod_key: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> Result<(), BindError> {
        // A replica that lost leadership since the request arrived must not write.
        if !self.readiness.is_leader() {
            return Err(BindError::NotLeader);
        }
        if !annotations.is_empty() {
            self.api
                .patch_annotations(
                    &args.pod_namespace,
                    &args.pod_name,
                    &args.pod_uid,
                    annotations,
                )
                .await
                .map_err(|source| BindError::Api {
                    step: "patch annotations",
                    pod: pod_key.to_string(),
                    source,
                })?;
        }
        self.api
            .create_binding(
                &args.pod_namespace,
                &args.pod_name,
                &args.pod_uid,
                &args.node,
            )
            .await
            .map_err(|source| BindError::Api {
                step: "create the binding",
                pod: pod_key.to_string(),
                source,
            })
    }

    /// Drops our assumed entry, unless the pod watch already confirmed the pod (a bind that
    /// succeeded although its answer was lost must stay counted).
    fn roll_back(&self, node: &str, uid: &PodUid) {
        if let Some(entry) = self.cluster.node(node) {
            let mut state = entry.write();
            if matches!(
                state.devices.get(uid).map(|e| e.state),
                Some(EntryState::Assumed { .. })
            ) {
                state.devices.remove(uid);
            }
        }
    }

    /// Best effort: a pod left unbound must not carry an allocation for a node it is not on,
    /// or another scheduler binding it elsewhere would hand koordlet wrong minors.
    async fn clear_annotation(&self, args: &ExtenderBindingArgs, pod_key: &str) {
        let mut clear = BTreeMap::new();
        clear.insert(DEVICE_ALLOCATED.to_string(), None);
        if let Err(error) = self
            .api
            .patch_annotations(&args.pod_namespace, &args.pod_name, &args.pod_uid, &clear)
            .await
        {
            self.metrics
                .binds
                .with_label_values(&["annotation_cleanup_failed"])
                .inc();
            tracing::warn!(pod = %pod_key, %error, "could not clear the device annotation after a failed bind");
        }
    }

    /// Drops assumed entries that no pod watch confirmed within `ttl`; returns how many.
    ///
    /// Age alone is not proof: during a pod-watch outage longer than `ttl` a bound, running pod
    /// is never confirmed either, and dropping its entry would hand its devices out again. So
    /// each candidate's pod is read from the API server first: it is kept while the pod is
    /// bound to that node and not terminal, and also when the read fails (checked again next
    /// round). Only a pod that is gone, recreated, unbound, elsewhere or finished is expired.
    pub async fn expire_assumed(&self, ttl: std::time::Duration) -> usize {
        let now = std::time::Instant::now();
        let mut candidates = Vec::new();
        for name in self.cluster.node_names() {
            if let Some(entry) = self.cluster.node(&name) {
                let old = entry.read().devices.assumed_older_than(now, ttl);
                candidates.extend(old.into_iter().map(|(uid, at)| (name.clone(), uid, at)));
            }
        }
        self.forget_settled_assumptions();
        let mut expired = 0;
        for (node, uid, at) in candidates {
            let pod = self
                .assumed
                .lock()
                .get(&uid)
                .filter(|p| p.at == at)
                .cloned();
            if let Some(pod) = &pod {
                match self.api.get_pod(&pod.namespace, &pod.name).await {
                    Err(error) => {
                        tracing::debug!(%node, pod_uid = %uid, %error, "cannot confirm an old assumed allocation; keeping it");
                        continue;
                    }
                    Ok(Some(p))
                        if p.metadata.uid.as_deref() == Some(uid.as_str())
                            && p.node_name() == Some(node.as_ref())
                            && !matches!(
                                p.status.phase.as_deref(),
                                Some("Succeeded" | "Failed")
                            ) =>
                    {
                        tracing::warn!(%node, pod = %format!("{}/{}", pod.namespace, pod.name), "assumed allocation unconfirmed by the pod watch, but the pod is bound here: keeping it");
                        continue;
                    }
                    Ok(_) => {}
                }
            }
            let removed = self
                .cluster
                .node(&node)
                .is_some_and(|e| e.write().devices.remove_if_assumed_at(&uid, at));
            if removed {
                tracing::warn!(%node, pod_uid = %uid, "assumed allocation expired without bind confirmation");
                expired += 1;
            }
            let mut assumed = self.assumed.lock();
            if assumed.get(&uid).is_some_and(|p| p.at == at) {
                assumed.remove(&uid);
            }
        }
        if expired > 0 {
            self.metrics.assumed_expired.inc_by(expired as u64);
        }
        expired
    }

    /// Drops the pod keys of assumed entries that were committed, rolled back or replaced.
    fn forget_settled_assumptions(&self) {
        let snapshot: Vec<(PodUid, AssumedPod)> = self
            .assumed
            .lock()
            .iter()
            .map(|(u, p)| (u.clone(), p.clone()))
            .collect();
        let settled: Vec<(PodUid, std::time::Instant)> = snapshot
            .into_iter()
            .filter(|(uid, p)| {
                let state = self
                    .cluster
                    .node(&p.node)
                    .and_then(|e| e.read().devices.get(uid).map(|e| e.state));
                !matches!(state, Some(EntryState::Assumed { at }) if at == p.at)
            })
            .map(|(uid, p)| (uid, p.at))
            .collect();
        let mut assumed = self.assumed.lock();
        for (uid, at) in settled {
            if assumed.get(&uid).is_some_and(|p| p.at == at) {
                assumed.remove(&uid);
            }
        }
    }
}
