//! The commit phase: one `pods/binding` carrying the annotations, under the pod's UID and the
//! resourceVersion the decision was made on, written only as the leader; a 409 re-reads and
//! re-sends the same binding; a failure reads the pod back to say whether the binding landed,
//! cannot land, or may still land (see `cluster::assumed`).

use std::collections::BTreeMap;

use super::outcome::{BindError, BindOutcome};
use super::pod_api::ApiError;
use super::{Binder, OWNED_ANNOTATIONS, carries};
use crate::cluster::assumed::SentBinding;
use crate::cluster::snapshot::hash128;
use crate::model::ids::PodUid;
use crate::model::pod::Pod;
use crate::model::wire::ExtenderBindingArgs;
use crate::scheduler::needs::{NeedsInputs, pod_needs};

/// What a failed commit left behind.
pub(super) enum AfterFailure {
    /// Nothing of this bind is on a pod bound to our node (or the pod is gone): undo the
    /// assumed entry.
    NotBound,
    /// The binding may have landed or may still land: keep the allocation held and probe.
    Ambiguous,
}

/// How many 409s on its binding a bind absorbs (each after a fresh read).
const MAX_PATCH_CONFLICTS: usize = 3;

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

impl Binder {
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
    pub(super) async fn commit(
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
        // What the decision was made for, taken from the pod it was made on at the first 409
        // (only then is it needed): a re-read pod must still ask for the same.
        let mut decided_for: Option<Option<u128>> = None;
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
                        let before = *decided_for.get_or_insert_with(|| self.asks(&current));
                        if self.asks(&fresh) != before {
                            self.metrics.bind_pod_changed.inc();
                            return Err((
                                BindError::PodChanged {
                                    pod: pod_key.to_string(),
                                },
                                AfterFailure::NotBound,
                            ));
                        }
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

    /// What `pod` asks of a node, by the read verbs' rule with today's inputs, as a
    /// fingerprint (`None`: an invalid request). Two reads of one pod that ask for the same
    /// compare equal.
    fn asks(&self, pod: &Pod) -> Option<u128> {
        let inputs = NeedsInputs::of(&self.readiness, &self.cluster, &self.scoring);
        pod_needs(pod, inputs).ok().map(|needs| hash128(&needs))
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
}
