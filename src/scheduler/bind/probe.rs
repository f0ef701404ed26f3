//! Settling assumed allocations whose outcome is unknown: read the pod, judge it
//! ([`judge`]: bound here with our annotations, may still land, or release), and the periodic
//! probes and expiry the service runs.

use super::{Binder, carries};
use crate::cluster::assumed::{AssumedPod, Outcome};
use crate::cluster::devices::EntryState;
use crate::model::ids::PodUid;
use crate::model::pod::Pod;

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

impl Binder {
    /// Acts on a read of an assumed allocation's pod; true when the allocation was released.
    async fn act_on_read(
        &self,
        uid: &PodUid,
        rec: &AssumedPod,
        pod: Option<&Pod>,
        path: &str,
    ) -> bool {
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
                    if self.act_on_read(&uid, &rec, pod.as_ref(), "probe").await {
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
    /// devices.
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
                        let released = self.act_on_read(&uid, &rec, pod.as_ref(), "ttl").await;
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
