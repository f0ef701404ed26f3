//! Bind: the one place an allocation is decided and committed, and where assumed
//! allocations whose outcome is unknown are probed and released.
//!
//! kube-scheduler runs binds asynchronously and concurrently with later filters, so the
//! allocation is computed here, not in filter: lock the node, allocate against committed +
//! assumed entries, record the result as *assumed* under the pod UID, unlock, patch the pod's
//! annotations with the UID and the resourceVersion of the bind's read as preconditions (a 409
//! re-reads and retries, re-deciding nothing), create the `pods/binding`. A failure whose
//! outcome is known removes the assumed entry; one whose outcome is unknown keeps it held
//! and probes it. The pod watch later replaces the assumed entry with the committed one.
//! Never clear annotations of a pod bound to another node: whatever it carries is what that
//! node's koordlet uses. The lifecycle records live in [`crate::cluster::assumed`].
//!
//! API writes go through [`PodApi`], so the same logic serves the kube client and the
//! offline (cluster file) mode.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use kube::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;

use crate::cluster::assumed::{AssumedPod, Outcome};
use crate::cluster::cpus::RecordedCpus;
use crate::cluster::devices::{EntryState, RecordedAllocation};
use crate::cluster::{ClusterState, NodeState, PodRecord};
use crate::extender::wire::ExtenderBindingArgs;
use crate::fit::{self, PodNeeds};
use crate::metrics::Metrics;
use crate::model::annotations::{DEVICE_ALLOCATED, RESOURCE_STATUS};
use crate::model::device::DeviceAllocations;
use crate::model::ids::PodUid;
use crate::model::koord_cpu::RESOURCE_SPEC;
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
/// pods hold stays counted (koordinator #1186); pods in `ignore` (preemption victims) do not
/// count as holding. The rule depends only on current API state, so
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
        // Preemption victims (`ignore`) count as gone: once they are, the node may hold
        // nothing any more and is left to the device plugins again (issue 9 §1.5).
        let held = node.devices.entries().any(|(uid, _)| !ignore.contains(uid));
        return if !held {
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
                "the annotation patch",
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
        node: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let binding = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": { "name": name, "namespace": namespace, "uid": uid },
                "target": { "apiVersion": "v1", "kind": "Node", "name": node },
            });
            let api = self.api(namespace);
            self.call(
                "the binding",
                api.create_subresource::<_, serde_json::Value>(
                    "binding",
                    name,
                    &PostParams::default(),
                    &binding,
                ),
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
        resource_version: Option<&'a str>,
        annotations: &'a BTreeMap<String, Option<String>>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let result = self.with_pod(namespace, name, uid, |pod| {
            // Offline binds are the only writer and never bump resourceVersions; the check is
            // kept so offline mode refuses what the API server would.
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

/// How many 409s on the annotation patch a bind absorbs (each after a fresh read).
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

/// The keys of `written` whose value the pod still carries as we set it (what a cleanup may
/// remove without touching anyone else's annotation).
fn ours_on(
    pod: &Pod,
    written: &BTreeMap<String, Option<String>>,
) -> BTreeMap<String, Option<String>> {
    written
        .iter()
        .filter(|(k, v)| {
            OWNED_ANNOTATIONS.contains(&k.as_str())
                && v.is_some()
                && pod.annotation(k) == v.as_deref()
        })
        .map(|(k, _)| (k.clone(), None))
        .collect()
}

/// What a read of the pod says about an assumed allocation.
enum Verdict {
    /// Bound to our node with our annotations: keep (the watch commits it).
    BoundHere,
    /// Unbound, still carrying these annotations of ours (at resourceVersion `rv`): remove
    /// them, then release.
    Unbound {
        ours: BTreeMap<String, Option<String>>,
        rv: Option<String>,
    },
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
        None => Verdict::Unbound {
            ours: ours_on(pod, &rec.annotations),
            rv: pod.metadata.resource_version.clone(),
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
        // attempt's held allocation must neither block this one nor be held twice.
        self.resolve_previous_attempt(&uid, pod.as_ref());
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

        match self.commit(args, &pod_key, pod.clone(), &written).await {
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
    fn resolve_previous_attempt(&self, uid: &PodUid, pod: Option<&Pod>) {
        let Some(prev) = self.cluster.assumptions().get(uid) else {
            return;
        };
        let bound_there = pod.is_some_and(|p| {
            p.metadata.uid.as_deref() == Some(uid.as_str())
                && p.node_name() == Some(&*prev.node)
                && !matches!(p.status.phase.as_deref(), Some("Succeeded" | "Failed"))
        });
        if bound_there {
            return;
        }
        if self.cluster.release_assumed(&prev.node, uid, prev.at) {
            tracing::info!(node = %prev.node, pod = %format!("{}/{}", prev.namespace, prev.name), "retried bind: released the previous attempt's held allocation");
            self.released("retry", 1);
        }
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

    /// Writes the annotations (resourceVersion-guarded, retried on conflict), then creates
    /// the binding. On failure, says what the failure left behind.
    async fn commit(
        &self,
        args: &ExtenderBindingArgs,
        pod_key: &str,
        mut current: Pod,
        written: &BTreeMap<String, Option<String>>,
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
        let mut conflicts = 0;
        loop {
            // What we set, plus the removal of any owned annotation the pod carries that this
            // bind does not set (a stale copy would be charged on this node).
            let mut patch = written.clone();
            for key in OWNED_ANNOTATIONS {
                if !patch.contains_key(*key) && current.annotation(key).is_some() {
                    patch.insert(key.to_string(), None);
                }
            }
            if patch.is_empty() {
                break;
            }
            // The resourceVersion of the read this bind decided on: if anyone changed the pod
            // since (bound it elsewhere, annotated it), the API server refuses the patch.
            let rv = current.metadata.resource_version.clone();
            let patched = self
                .write_as_leader(|| {
                    self.api.patch_annotations(
                        &args.pod_namespace,
                        &args.pod_name,
                        &args.pod_uid,
                        rv.as_deref(),
                        &patch,
                    )
                })
                .await;
            let patched = match patched {
                LeaderWrite::Done(result) => result,
                // No binding was sent: whatever the patch did, the pod is not bound by us.
                LeaderWrite::NotLeader | LeaderWrite::LostMidCall => {
                    return Err((BindError::NotLeader, AfterFailure::NotBound));
                }
            };
            match patched {
                Ok(()) => break,
                Err(source) if source.status == Some(409) && conflicts < MAX_PATCH_CONFLICTS => {
                    conflicts += 1;
                    self.metrics.bind_patch_conflicts.inc();
                    tracing::info!(pod = %pod_key, attempt = conflicts, "annotation patch conflicted; re-reading the pod");
                    // Nothing is re-decided: the allocation stays assumed; only the
                    // precondition is refreshed, unless the pod is gone or bound meanwhile.
                    let fresh = self
                        .api
                        .get_pod(&args.pod_namespace, &args.pod_name)
                        .await
                        .map_err(|s| (api_error("read the pod", s), AfterFailure::NotBound))?;
                    let Some(fresh) = fresh else {
                        return Err((
                            BindError::PodNotFound {
                                pod: pod_key.to_string(),
                            },
                            AfterFailure::NotBound,
                        ));
                    };
                    let fresh_uid = fresh.metadata.uid.clone().unwrap_or_default();
                    if fresh_uid != args.pod_uid {
                        return Err((
                            BindError::UidMismatch {
                                pod: pod_key.to_string(),
                                expected: args.pod_uid.clone(),
                                actual: fresh_uid,
                            },
                            AfterFailure::NotBound,
                        ));
                    }
                    if let Some(node) = fresh.node_name() {
                        tracing::warn!(pod = %pod_key, node, "pod was bound while we patched it: leaving its annotations alone");
                        // Our assumed entry goes (release_assumed removes it only while it is
                        // still the one this bind recorded); the pod's own allocation is the
                        // one its binding carried, which the watch commits.
                        let error = if node == args.node {
                            BindError::BoundMeanwhile {
                                pod: pod_key.to_string(),
                                node: node.to_string(),
                            }
                        } else {
                            self.metrics
                                .bound_elsewhere
                                .with_label_values(&["patch"])
                                .inc();
                            BindError::BoundElsewhere {
                                pod: pod_key.to_string(),
                                node: node.to_string(),
                            }
                        };
                        return Err((error, AfterFailure::NotBound));
                    }
                    current = fresh;
                }
                Err(source) => {
                    return Err((
                        api_error("patch annotations", source),
                        AfterFailure::NotBound,
                    ));
                }
            }
        }
        let bound = self
            .write_as_leader(|| {
                self.api.create_binding(
                    &args.pod_namespace,
                    &args.pod_name,
                    &args.pod_uid,
                    &args.node,
                )
            })
            .await;
        let bound = match bound {
            LeaderWrite::Done(result) => result,
            LeaderWrite::NotLeader => return Err((BindError::NotLeader, AfterFailure::NotBound)),
            // The binding may still land: read the pod back, as after any unknown outcome
            // (no longer the leader, that read never writes: the allocation stays held).
            LeaderWrite::LostMidCall => {
                return match self.after_failed_binding(args, pod_key, written).await {
                    None => Ok(BindOutcome::BoundDespiteError),
                    Some(after) => Err((BindError::NotLeader, after)),
                };
            }
        };
        match bound {
            Ok(()) => Ok(BindOutcome::Bound),
            Err(source) => {
                let e = api_error("create the binding", source);
                match self.after_failed_binding(args, pod_key, written).await {
                    None => {
                        tracing::warn!(pod = %pod_key, node = %args.node, error = %e, "the binding failed but took effect: keeping the allocation");
                        Ok(BindOutcome::BoundDespiteError)
                    }
                    Some(after) => Err((e, after)),
                }
            }
        }
    }

    /// A failed binding may still have taken effect (a timeout or lost answer after the API
    /// server committed it), or may still commit later. Rolling back then would leave a pod
    /// running on the node with our minors, uncounted. So read the pod back before undoing
    /// anything. `None` = it is bound here with our annotations: the bind succeeded.
    async fn after_failed_binding(
        &self,
        args: &ExtenderBindingArgs,
        pod_key: &str,
        written: &BTreeMap<String, Option<String>>,
    ) -> Option<AfterFailure> {
        let pod = match self.api.get_pod(&args.pod_namespace, &args.pod_name).await {
            Ok(Some(pod)) => pod,
            // Deleted: nothing runs, nothing to clear.
            Ok(None) => return Some(AfterFailure::NotBound),
            Err(_) => return Some(AfterFailure::Ambiguous),
        };
        if pod.metadata.uid.as_deref() != Some(args.pod_uid.as_str()) {
            // Recreated: the new pod never carried our annotation (the patch was UID-guarded).
            return Some(AfterFailure::NotBound);
        }
        match pod.node_name() {
            Some(node) if node == args.node => {
                if carries(&pod, written) {
                    None
                } else {
                    // Bound here by someone else with another allocation: the watch records
                    // theirs; ours must go, and their annotation must stay.
                    Some(AfterFailure::NotBound)
                }
            }
            Some(node) => {
                // Bound elsewhere (another scheduler, or an earlier attempt of ours that landed
                // late). Whatever it carries is what that node's koordlet uses: clearing it
                // would make that node's ledger forget devices the pod may hold.
                self.metrics
                    .bound_elsewhere
                    .with_label_values(&["binding"])
                    .inc();
                tracing::warn!(pod = %pod_key, node, ours = %args.node, "pod was bound to another node during our bind: leaving its annotations alone");
                Some(AfterFailure::NotBound)
            }
            None => {
                // Unbound, but a binding that outlived its timeout could still land. Remove our
                // annotations under the read's resourceVersion: then a late binding yields a
                // pod holding nothing of ours. If that fails, keep the allocation held.
                let ours = ours_on(&pod, written);
                if ours.is_empty() {
                    return Some(AfterFailure::NotBound);
                }
                let cleared = self
                    .write_as_leader(|| {
                        self.api.patch_annotations(
                            &args.pod_namespace,
                            &args.pod_name,
                            &args.pod_uid,
                            pod.metadata.resource_version.as_deref(),
                            &ours,
                        )
                    })
                    .await;
                match cleared {
                    LeaderWrite::Done(Ok(())) => Some(AfterFailure::NotBound),
                    LeaderWrite::NotLeader | LeaderWrite::LostMidCall => {
                        tracing::warn!(pod = %pod_key, "not the leader: leaving our annotation on the unbound pod and the allocation held until the pod is seen");
                        Some(AfterFailure::Ambiguous)
                    }
                    LeaderWrite::Done(Err(error)) => {
                        self.metrics
                            .binds
                            .with_label_values(&["annotation_cleanup_failed"])
                            .inc();
                        tracing::warn!(pod = %pod_key, %error, "could not clear our annotation from the unbound pod: keeping the allocation held");
                        Some(AfterFailure::Ambiguous)
                    }
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
            Verdict::Unbound { ours, rv } => {
                // A replica that is not the leader does not write; the next leader's bind of
                // this pod removes a stale annotation anyway (issue 9 §1.4).
                if !ours.is_empty()
                    && let LeaderWrite::Done(Err(error)) = self
                        .write_as_leader(|| {
                            self.api.patch_annotations(
                                &rec.namespace,
                                &rec.name,
                                uid.as_str(),
                                rv.as_deref(),
                                &ours,
                            )
                        })
                        .await
                {
                    tracing::info!(pod = %pod_key, %error, "could not clear our annotation from the unbound pod yet; keeping the allocation");
                    self.cluster
                        .assumptions()
                        .probe_failed(uid, rec.at, std::time::Instant::now());
                    return false;
                }
                let released = self.cluster.release_assumed(&rec.node, uid, rec.at);
                if released {
                    tracing::info!(node = %rec.node, pod = %pod_key, path, "released an assumed allocation: pod unbound");
                    self.released(path, 1);
                }
                released
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
    use crate::model::device::{DeviceAllocation, DeviceType, GPU_MEMORY_RATIO};
    use crate::model::quantity::Quantity;

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
