//! What a bind answers: its success kinds ([`BindOutcome`]) and its failures ([`BindError`],
//! one variant per reason kube-scheduler and the operator must tell apart, each with a metric
//! class).

use super::pod_api::ApiError;

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
    /// The binding got a 409 and the re-read pod asks for something else than the decision
    /// was made for (its requests, annotations or policy changed since kube-scheduler sent
    /// it): nothing is written; kube-scheduler retries with the new pod.
    #[error(
        "pod {pod} changed what it asks for while this bind decided: nothing written, retry with the new pod"
    )]
    PodChanged { pod: String },
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
    /// kube-scheduler and the extender disagree on who serves the pod's device requests on
    /// this node (KEP-5004): the pod's status and the cached DeviceClasses say different
    /// things, or split one pod between them. Nothing is allocated; kube-scheduler retries.
    #[error("pod {pod} on node {node}: {reason}")]
    DraServes {
        pod: String,
        node: String,
        reason: String,
    },
    #[error("a bind of pod {pod} is already in progress")]
    InProgress { pod: String },
    #[error("not the leader: binds are served by the leader replica")]
    NotLeader,
    #[error(
        "the pod cache is catching up (after a start or a leader change, or a pod watch error): retry shortly"
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

impl BindError {
    /// Short label for metrics.
    pub fn class(&self) -> &'static str {
        match self {
            BindError::InvalidRequest(_) => "invalid_request",
            BindError::PodNotFound { .. } => "pod_not_found",
            BindError::UidMismatch { .. } => "uid_mismatch",
            BindError::BoundElsewhere { .. } => "bound_elsewhere",
            BindError::BoundMeanwhile { .. } => "bound_meanwhile",
            BindError::PodChanged { .. } => "pod_changed",
            BindError::PreviousBindingPending { .. } => "previous_binding_pending",
            BindError::BoundWithoutAllocation { .. } => "bound_without_allocation",
            BindError::DoesNotFit { .. } => "does_not_fit",
            BindError::InvalidRequestResources { .. } => "invalid_resources",
            BindError::DraServes { .. } => "dra_serves",
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
