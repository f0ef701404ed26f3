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

mod commit;
mod outcome;
mod pod_api;
mod probe;
mod sent;

pub use outcome::{BindError, BindOutcome};
pub use pod_api::{ApiError, KubePodApi, OfflinePodApi, PodApi};
pub use sent::SentPods;

use std::collections::BTreeMap;
use std::sync::Arc;

use super::config::ScoringConfig;
use super::decide::{Decision, decide_on_node};
use super::needs::{NeedsInputs, PodNeeds, pod_needs};
use super::write_back;
use crate::cluster::NodeState;
use crate::cluster::assumed::Outcome;
use crate::cluster::cpus::RecordedCpus;
use crate::cluster::{Assumption, ClusterState, PodRecord};
use crate::metrics::Metrics;
use crate::model::annotations::{DEVICE_ALLOCATED, RESOURCE_STATUS};
use crate::model::ids::PodUid;
use crate::model::koord_cpu::RESOURCE_SPEC;
use crate::model::pod::Pod;
use crate::model::resource_names::ResourceNameSet;
use crate::model::wire::ExtenderBindingArgs;
use crate::placement::device::dra_served::{DraServes, dra_serves, split_error};
use crate::placement::device::request::PodDeviceRequest;
use crate::sync::Readiness;
use commit::AfterFailure;

/// The pod annotations this service owns, whichever ledger writes them. A bind that does not
/// set one of them removes it from the pod (a stale copy would be charged on the new node),
/// and read-backs compare exactly these. `resource-spec` is not here: it is the pod's own
/// request, which a bind may only complete (the node's forced bind policy), never remove.
pub const OWNED_ANNOTATIONS: &[&str] = &[DEVICE_ALLOCATED, RESOURCE_STATUS];

/// Whether the pod carries exactly what a bind wrote: every set key with our value, every
/// removed key absent.
fn carries(pod: &Pod, written: &BTreeMap<String, Option<String>>) -> bool {
    written
        .iter()
        .all(|(k, v)| pod.annotation(k) == v.as_deref())
}

/// The pod a bind request names, checked for empty fields.
struct Target<'a> {
    args: &'a ExtenderBindingArgs,
    /// `namespace/name`, for errors and logs.
    key: String,
    uid: PodUid,
}

impl<'a> Target<'a> {
    fn of(args: &'a ExtenderBindingArgs) -> Result<Self, BindError> {
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
        Ok(Target {
            args,
            key: format!("{}/{}", args.pod_namespace, args.pod_name),
            uid: PodUid::new(&args.pod_uid),
        })
    }
}

/// What phase 2 recorded: the annotations the binding carries (`None` values are removals)
/// and the instant the allocation was assumed at (`None`: it holds nothing).
#[derive(Default)]
struct Assumed {
    written: BTreeMap<String, Option<String>>,
    at: Option<std::time::Instant>,
}

/// The one service that binds: see the module docs.
pub struct Binder {
    api: Arc<dyn PodApi>,
    cluster: Arc<ClusterState>,
    readiness: Arc<Readiness>,
    scoring: Arc<ScoringConfig>,
    metrics: Metrics,
    /// The pods filter saw, for the bind of the same scheduling cycle ([`sent`]).
    sent: SentPods,
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
            sent: SentPods::default(),
        }
    }

    /// Filter leaves the pod kube-scheduler sent it here, for its bind ([`sent`]). Only
    /// against an API server, which checks the binding's resourceVersion: offline a read costs
    /// nothing, and hand-written requests may give one UID and resourceVersion two contents.
    pub fn keep_sent(&self, pod: Pod) {
        if self.api.confirmed_by_watch() {
            self.sent.keep(pod);
        }
    }

    /// The pods kept for their binds (tests).
    pub fn sent_pods(&self) -> &SentPods {
        &self.sent
    }

    fn released(&self, path: &str, n: usize) {
        if n > 0 {
            self.metrics
                .assumed_released
                .with_label_values(&[path])
                .inc_by(n as u64);
        }
    }

    /// Binds the pod in four phases, each its own function: [`Self::read`] (the pod and what
    /// it needs, after resolving an earlier attempt's held allocation), [`Self::decide_and_assume`]
    /// (under the node's write lock), [`Self::commit`] (the one binding write) and
    /// [`Self::settle`] (what the commit's answer means for the assumed entry). A pod that is
    /// already bound is answered from what it carries ([`Self::answer_bound`]).
    pub async fn bind(&self, args: &ExtenderBindingArgs) -> Result<BindOutcome, BindError> {
        let target = Target::of(args)?;
        let Some(_in_flight) = self.cluster.assumptions().begin(&target.uid) else {
            return Err(BindError::InProgress { pod: target.key });
        };
        let (pod, needs) = self.read(&target).await?;
        if let Some(bound) = pod.node_name() {
            return self.answer_bound(&target, &pod, &needs, bound);
        }
        let assumed = self.decide_and_assume(&target, &pod, &needs)?;
        let committed = self
            .commit(args, &target.key, pod.clone(), &assumed.written, assumed.at)
            .await;
        self.settle(&target, pod, assumed, committed)
    }

    /// Phase 1: reads the pod, resolves an earlier attempt's held allocation against that
    /// read, checks it is the pod kube-scheduler meant, and says what it needs.
    async fn read(&self, target: &Target<'_>) -> Result<(Pod, PodNeeds), BindError> {
        // The copy filter kept, when nothing this bind decides depends on the pod's current
        // state (see `sent`): no earlier attempt holds an allocation, the pod watch has not
        // seen it bound here (a retry of a bind that succeeded is answered from the live pod),
        // and DRA serves nothing of it here. A 409 on the binding re-reads it.
        if let Some(pod) = self.sent.take(&target.uid)
            && self.cluster.assumptions().get(&target.uid).is_none()
            && self.fresh_on(&target.args.node, &target.uid)
            && let Ok((pod, needs)) = self.needs_of(target, pod)
        {
            self.metrics.bind_reads.with_label_values(&["filter"]).inc();
            return Ok((pod, needs));
        }
        self.metrics.bind_reads.with_label_values(&["api"]).inc();
        let args = target.args;
        let pod = self
            .api
            .get_pod(&args.pod_namespace, &args.pod_name)
            .await
            .map_err(|source| BindError::Api {
                step: "read the pod",
                pod: target.key.clone(),
                source,
            })?;
        // kube-scheduler retries a pod whose bind failed, perhaps to another node: an earlier
        // attempt's held allocation must neither block this one nor be held twice, and while
        // its binding may still land this one must wait.
        self.resolve_previous_attempt(&target.uid, pod.as_ref(), &target.key)?;
        let pod = pod.ok_or_else(|| BindError::PodNotFound {
            pod: target.key.clone(),
        })?;
        self.needs_of(target, pod)
    }

    /// Checks `pod` is the one kube-scheduler meant and says what it needs on the target node.
    fn needs_of(&self, target: &Target<'_>, pod: Pod) -> Result<(Pod, PodNeeds), BindError> {
        let args = target.args;
        let actual_uid = pod.metadata.uid.clone().unwrap_or_default();
        if actual_uid != args.pod_uid {
            return Err(BindError::UidMismatch {
                pod: target.key.clone(),
                expected: args.pod_uid.clone(),
                actual: actual_uid,
            });
        }
        let invalid = |e: super::needs::InvalidRequest| BindError::InvalidRequestResources {
            pod: target.key.clone(),
            reason: e.to_string(),
        };
        // The read verbs' derivation, then what kube-scheduler serves through DRA taken out.
        let needs = pod_needs(
            &pod,
            NeedsInputs::of(&self.readiness, &self.cluster, &self.scoring),
        )
        .map_err(invalid)?;
        let devices = self.without_dra_served(target, &pod, needs.devices)?;
        Ok((pod, PodNeeds { devices, ..needs }))
    }

    /// Whether a pod's bind on `node` can decide on the copy filter kept: the node holds no
    /// committed allocation of the pod, and DRA serves none of the names the extender
    /// manages there (no request depends on the status kube-scheduler's PreBind writes).
    fn fresh_on(&self, node: &str, uid: &PodUid) -> bool {
        self.cluster.node(node).is_none_or(|n| {
            let state = n.read();
            !state.holds_committed(uid) && state.dra_served().is_empty()
        })
    }

    /// The pod's device request less what kube-scheduler serves through DRA (KEP-5004), by
    /// the one rule (`dra_serves`) on this node, checked against the pod's status: where DRA
    /// serves all of it here, the pod's `extendedResourceClaimStatus` (written by
    /// kube-scheduler's PreBind, before this bind) must say so, and the extender allocates no
    /// device for it; where the status says so but the node advertises the names, the status
    /// is an earlier attempt's on another node (kube-scheduler leaves it when a bind fails),
    /// and the extender allocates as anywhere. Where DRA would serve part of the pod, or the
    /// classes say DRA and the status does not, nothing is decided: kube-scheduler retries.
    fn without_dra_served(
        &self,
        target: &Target<'_>,
        pod: &Pod,
        devices: Option<PodDeviceRequest>,
    ) -> Result<Option<PodDeviceRequest>, BindError> {
        let Some(req) = devices else {
            return Ok(None);
        };
        let refuse = |reason: String| BindError::DraServes {
            pod: target.key.clone(),
            node: target.args.node.clone(),
            reason,
        };
        let by_status = pod
            .dra_extended_resources()
            .map(|(_, names)| ResourceNameSet::of(names))
            .unwrap_or_default();
        let by_cache = self
            .cluster
            .node(&target.args.node)
            .map(|n| n.read().dra_served())
            .unwrap_or_default();
        match dra_serves(req.asked, by_cache) {
            DraServes::Nothing => Ok(Some(req)),
            DraServes::Part(dra) => Err(refuse(split_error(dra).reason.to_string())),
            DraServes::Everything if by_status.covers(req.asked) => Ok(None),
            DraServes::Everything => Err(refuse(format!(
                "a DeviceClass maps {} to DRA and the node does not advertise it, but kube-scheduler did not serve it through DRA (no extendedResourceClaimStatus)",
                req.asked.names().collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// A pod already bound: a retry of our own successful bind (it carries our annotations),
    /// or someone else's bind, which must not be reported as an allocation that does not exist.
    fn answer_bound(
        &self,
        target: &Target<'_>,
        pod: &Pod,
        needs: &PodNeeds,
        bound: &str,
    ) -> Result<BindOutcome, BindError> {
        if bound != target.args.node {
            return Err(BindError::BoundElsewhere {
                pod: target.key.clone(),
                node: bound.to_string(),
            });
        }
        // A retry of our own successful bind carries our annotation. Bound here without one
        // while we would have allocated something, it is someone else's bind, and answering
        // success would report an allocation that does not exist.
        let needs_allocation = !needs.is_none()
            && self.cluster.node(bound).is_some_and(|e| {
                match decide_on_node(
                    Some(&e.read()),
                    needs,
                    std::slice::from_ref(&target.uid),
                    &self.scoring,
                ) {
                    Ok(d) => {
                        d.devices.is_some()
                            || d.cpu
                                .as_ref()
                                .and_then(write_back::resource_status)
                                .is_some()
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
                pod: target.key.clone(),
                node: bound.to_string(),
            });
        }
        Ok(BindOutcome::AlreadyBound)
    }

    /// Phase 2: decides against the authoritative ledgers and records the result as assumed,
    /// under the node's write lock, so concurrent binds on this node see each other's
    /// assumed entries. The lock is released before any API call. A node no object names has
    /// no entry: nothing to allocate, and none is created.
    fn decide_and_assume(
        &self,
        target: &Target<'_>,
        pod: &Pod,
        needs: &PodNeeds,
    ) -> Result<Assumed, BindError> {
        let mut assumed = Assumed::default();
        if needs.is_none() {
            return Ok(assumed);
        }
        let node = &target.args.node;
        let does_not_fit = |e: crate::placement::FitError| BindError::DoesNotFit {
            pod: target.key.clone(),
            node: node.clone(),
            reason: e.reason.to_string(),
        };
        let decided = self.cluster.assume(node, &target.uid, |state| {
            // Checked under the node lock, right before deciding: a fence raised after this
            // point only concerns binds that decide after it.
            if !self.readiness.pods_current() {
                return Err(BindError::CacheNotCurrent);
            }
            // The pod watch committed this pod here after our read (another writer bound it):
            // a decision would replace that allocation with ours, and the conflict that
            // follows would then release it. Never let a decision replace a committed entry.
            if state.holds_committed(&target.uid) {
                return Err(BindError::BoundMeanwhile {
                    pod: target.key.clone(),
                    node: node.clone(),
                });
            }
            let decision =
                decide_on_node(Some(state), needs, &[], &self.scoring).map_err(does_not_fit)?;
            Ok(self.assumption(target, pod, needs, state, decision, &mut assumed.written))
        });
        match decided {
            Some(result) => result.map(|at| Assumed { at, ..assumed }),
            // A node no object names: the decision on no state (a cpuset pod cannot go there).
            None => match decide_on_node(None, needs, &[], &self.scoring) {
                Ok(_) => Ok(assumed),
                Err(e) => Err(does_not_fit(e)),
            },
        }
    }

    /// What `decision` assumes on the node ([`crate::cluster::ClusterState::assume`] records
    /// it), and the annotations it is written as, into `written`; `None` when it holds
    /// nothing. Runs under the node's write lock, reading the state.
    fn assumption(
        &self,
        target: &Target<'_>,
        pod: &Pod,
        needs: &PodNeeds,
        state: &NodeState,
        decision: Decision,
        written: &mut BTreeMap<String, Option<String>>,
    ) -> Option<Assumption> {
        let devices = decision.devices;
        if let Some(allocation) = &devices {
            written.insert(
                DEVICE_ALLOCATED.to_string(),
                Some(allocation.to_annotation()),
            );
        }
        let mut cpus = None;
        if let (Some(placement), Some(req)) = (&decision.cpu, &needs.cpu)
            && let Some(status) = write_back::resource_status(placement)
        {
            written.insert(RESOURCE_STATUS.to_string(), Some(status));
            if let Some(spec) = write_back::resource_spec_write_back(
                pod,
                placement,
                req,
                state.cpu_ledger().bind_policy(),
            ) {
                written.insert(RESOURCE_SPEC.to_string(), Some(spec));
            }
            cpus = Some(RecordedCpus::Allocated(write_back::recorded_cpus(
                placement, req,
            )));
        }
        if devices.is_none() && cpus.is_none() {
            return None;
        }
        // Until the watch lists the pod here, the amplification check counts its CPU request
        // from this record (while the entries stay assumed).
        let cpu_milli = write_back::cpu_request_milli(pod);
        Some(Assumption {
            devices,
            cpus,
            cpu_milli,
            namespace: target.args.pod_namespace.clone(),
            name: target.args.pod_name.clone(),
            annotations: written.clone(),
        })
    }

    /// Phase 4: what the commit's answer means for the assumed entry. Success: a relist may
    /// judge it now (and offline, where no watch confirms, the bind is recorded in memory).
    /// A known failure: released. An unknown outcome: kept held and probed (the pod may be
    /// running on the node with our minors, or become so).
    fn settle(
        &self,
        target: &Target<'_>,
        pod: Pod,
        assumed: Assumed,
        committed: Result<BindOutcome, (BindError, AfterFailure)>,
    ) -> Result<BindOutcome, BindError> {
        let (args, uid) = (target.args, &target.uid);
        match committed {
            Ok(outcome) => {
                // Only now, with the binding call returned, may a relist judge this entry.
                if let Some(at) = assumed.at {
                    self.cluster
                        .assumptions()
                        .finish(uid, at, true, std::time::Instant::now());
                }
                if !self.api.confirmed_by_watch() {
                    self.record_offline(target, pod, assumed.written);
                }
                Ok(outcome)
            }
            Err((e, AfterFailure::NotBound)) => {
                if let Some(at) = assumed.at {
                    self.cluster.release_assumed(&args.node, uid, at);
                }
                Err(e)
            }
            Err((e, AfterFailure::Ambiguous)) => {
                tracing::warn!(pod = %target.key, node = %args.node, error = %e, "cannot tell whether the failed bind took effect: keeping the allocation held and probing");
                if let Some(at) = assumed.at {
                    self.cluster
                        .assumptions()
                        .finish(uid, at, false, std::time::Instant::now());
                }
                Err(e)
            }
        }
    }

    /// Offline mode (no pod watch): the bound pod, as the binding made it, into the caches.
    fn record_offline(
        &self,
        target: &Target<'_>,
        mut bound: Pod,
        written: BTreeMap<String, Option<String>>,
    ) {
        bound.spec.node_name = Some(target.args.node.clone());
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
            tracing::info!(pod = %target.key, node = %target.args.node, "offline mode: bind recorded in memory only");
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
}
