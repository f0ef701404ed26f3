//! The lifecycle of assumed allocations, whatever is assumed: which pod UIDs have a bind in
//! flight, and for each allocation a bind recorded as *assumed* in a node's ledgers, the pod
//! it belongs to, what the bind wrote on it and how the bind ended.
//!
//! This module owns that bookkeeping and the ordering it relies on. It never touches a
//! ledger (ClusterState does, under the node lock, keyed by the entry's `at`), never calls
//! the network and never decides placement. Lock order: a node lock may be held while this
//! module's lock is taken, never the other way round.
//!
//! An assumed entry ends in one of these ways: the pod watch commits it (the ledger entry
//! turns `Committed`; the record here is pruned later), the bind rolls it back, or it is
//! *released* — by a relist, by the prompt probe of an ambiguous bind, by a retried bind of
//! the same UID, or by the `--assume-ttl` expiry.
//!
//! # Releasing at a relist (issue 11)
//!
//! The pod watch lists assigned, non-terminal pods. When it relists, kube-runtime's watcher
//! (ListWatch strategy, `ListSemantic::MostRecent`: a consistent read) hands the consumer
//! `Event::Init` and only issues the list request when the consumer polls for the next event,
//! so the list is served after the pod sync took its [`Assumptions::relist_mark`]. Every bind
//! that *finished* before that mark — meaning its binding call returned success, or a read
//! showed the pod bound to our node with our annotations — had its binding in etcd before the
//! list was read. Such a pod, if it still exists, is assigned and not terminal, is in the
//! list. So when it is absent (or listed on another node), the pod is gone, finished or
//! elsewhere, and the entry can be released at `InitDone`. A bind whose binding landed after
//! the list's resourceVersion cannot be one of these: its binding call had not returned yet
//! when the mark was taken, so its sequence number is later than the mark.
//!
//! "Finished" must mean the binding call *returned*, not that it was sent: a binding that is
//! still on the wire when the mark is taken may commit after the list is read.
//!
//! An *ambiguous* bind (the binding failed with an unknown outcome and the pod could not be
//! read back, or our annotation could not be removed from the still-unbound pod) may still
//! land at any later time — a request that outlived its timeout can commit afterwards. Its
//! absence from a list proves nothing: it is never released by a relist on its own. The
//! prompt probe ([`Outcome::Ambiguous`], backoff [`PROBE_BACKOFF`], then every last interval
//! until it is resolved) resolves it: when it
//! sees the pod bound here with our annotations, the entry becomes [`Outcome::Bound`] with a
//! fresh sequence number, so only a relist whose mark is *later* than that probe may release
//! it; when it sees the pod gone, recreated, elsewhere, or unbound where our binding can no
//! longer land (next section), the probe releases it itself.
//!
//! # A binding that may still land (issue 22)
//!
//! The allocation travels *inside* the binding (its `metadata.annotations`, which the API
//! server merges into the pod in the same write as `spec.nodeName`), under the pod's UID and the
//! resourceVersion of the read the bind decided on. So a pod never carries an allocation
//! without the node it was decided for, and a binding whose answer never came can land only
//! while the pod is unchanged: any write to the pod (kube-scheduler's own failure status, a
//! retry's binding, another writer) moves its resourceVersion and fences the late binding out.
//! [`SentBinding`] records that precondition and the API server's deadline for the request;
//! an allocation is held while its binding may still land: the pod is unbound at that very
//! resourceVersion and the deadline has not passed.
//!
//! # Probing binds the watch does not confirm
//!
//! A bind whose binding returned success is normally committed by the pod watch within
//! moments. If [`CONFIRM_GRACE`] passes without that, its pod is read like an ambiguous one's:
//! gone, finished, recreated or elsewhere releases the entry; bound here with our annotations
//! keeps it and checks again after [`RECHECK_BOUND`]. Safe for the same reason as the ambiguous
//! probe (a read of the current pod, under the UID); it frees capacity a stalled or lagging
//! watch would otherwise hold until the next relist or the `--assume-ttl` expiry.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::model::ids::PodUid;

/// Delays between the prompt probes of an ambiguous bind; after the last one it is probed
/// every last interval until resolved (a failed read or a failed annotation clean-up must not
/// leave it to the `--assume-ttl` expiry).
pub const PROBE_BACKOFF: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// How long a bind whose binding returned may wait for the pod watch's confirmation before
/// its pod is read.
pub const CONFIRM_GRACE: Duration = Duration::from_secs(10);

/// After a read found the pod bound here with our annotations, when to read it again if the
/// watch still has not confirmed it.
pub const RECHECK_BOUND: Duration = Duration::from_secs(30);

/// The delay before probe number `probes` (0-based) of an ambiguous bind.
fn backoff(probes: usize) -> Duration {
    PROBE_BACKOFF
        .get(probes)
        .or(PROBE_BACKOFF.last())
        .copied()
        .unwrap_or(Duration::from_secs(8))
}

/// How the bind behind an assumed allocation ended, as far as we know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The bind is still writing.
    Writing,
    /// The binding call returned success, or a read showed the pod bound to our node with our
    /// annotations, at sequence `seq` (compared with relist marks). If the pod watch has not
    /// confirmed it by `next_probe`, the pod is read.
    Bound { seq: u64, next_probe: Instant },
    /// We cannot tell whether the binding landed or will land; the pod is read at
    /// `next_probe`, after `probes` reads that could not resolve it.
    Ambiguous { probes: usize, next_probe: Instant },
}

/// A binding that was sent: what would let it land late.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentBinding {
    /// The resourceVersion precondition it carried (`None`: the read had none, as in offline
    /// files; then only the deadline fences it).
    pub resource_version: Option<String>,
    /// After this the API server has given the request up (its `timeout` plus a margin): it
    /// cannot land any more.
    pub may_land_until: Instant,
}

impl SentBinding {
    /// Whether the binding may still land on a pod read unbound at `resource_version`.
    pub fn may_still_land(&self, resource_version: Option<&str>, now: Instant) -> bool {
        let unchanged = match (&self.resource_version, resource_version) {
            (Some(sent), Some(seen)) => sent == seen,
            // Without a precondition (or a version to compare) only the deadline tells.
            _ => true,
        };
        unchanged && now < self.may_land_until
    }
}

/// The pod behind an assumed allocation.
#[derive(Clone, Debug)]
pub struct AssumedPod {
    pub namespace: String,
    pub name: String,
    pub node: Arc<str>,
    /// The ledger entries' `EntryState::Assumed::at`: identifies this bind's entries.
    pub at: Instant,
    /// The annotations this bind wrote or meant to write (`None` = removed).
    pub annotations: BTreeMap<String, Option<String>>,
    pub outcome: Outcome,
    /// The last binding this bind sent, once sent.
    pub binding: Option<SentBinding>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Orders bind completions against relist marks.
    seq: u64,
    in_flight: HashSet<PodUid>,
    pods: HashMap<PodUid, AssumedPod>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Assumptions {
    inner: Mutex<Inner>,
}

/// Marks a pod UID as having a bind in flight until dropped.
pub struct InFlight<'a> {
    owner: &'a Assumptions,
    uid: PodUid,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.owner.inner.lock().in_flight.remove(&self.uid);
    }
}

impl Assumptions {
    /// Starts a bind of `uid`; `None` when one is already in flight (a duplicate must not
    /// replace, then roll back, the first attempt's entry).
    pub fn begin(&self, uid: &PodUid) -> Option<InFlight<'_>> {
        if !self.inner.lock().in_flight.insert(uid.clone()) {
            return None;
        }
        Some(InFlight {
            owner: self,
            uid: uid.clone(),
        })
    }

    pub fn is_in_flight(&self, uid: &PodUid) -> bool {
        self.inner.lock().in_flight.contains(uid)
    }

    /// Records the pod behind a freshly assumed allocation (replacing any earlier attempt's).
    pub fn record(&self, uid: PodUid, pod: AssumedPod) {
        self.inner.lock().pods.insert(uid, pod);
    }

    pub fn get(&self, uid: &PodUid) -> Option<AssumedPod> {
        self.inner.lock().pods.get(uid).cloned()
    }

    /// Forgets `uid`'s record if it is still the one assumed at `at`.
    pub fn forget(&self, uid: &PodUid, at: Instant) {
        let mut inner = self.inner.lock();
        if inner.pods.get(uid).is_some_and(|p| p.at == at) {
            inner.pods.remove(uid);
        }
    }

    /// The bind assumed at `at` is about to send `binding`.
    pub fn binding_sent(&self, uid: &PodUid, at: Instant, binding: SentBinding) {
        let mut inner = self.inner.lock();
        if let Some(p) = inner.pods.get_mut(uid).filter(|p| p.at == at) {
            p.binding = Some(binding);
        }
    }

    /// The bind assumed at `at` finished: `bound` when its binding returned success (or the
    /// pod was read back bound here with our annotations), else its outcome is ambiguous.
    pub fn finish(&self, uid: &PodUid, at: Instant, bound: bool, now: Instant) {
        let mut inner = self.inner.lock();
        inner.seq += 1;
        let seq = inner.seq;
        if let Some(p) = inner.pods.get_mut(uid).filter(|p| p.at == at) {
            p.outcome = if bound {
                Outcome::Bound {
                    seq,
                    next_probe: now + CONFIRM_GRACE,
                }
            } else {
                Outcome::Ambiguous {
                    probes: 0,
                    next_probe: now + backoff(0),
                }
            };
        }
    }

    /// A read (probe or expiry) saw the pod bound to our node with our annotations: read it
    /// again after [`RECHECK_BOUND`] if the watch still has not confirmed it.
    pub fn confirm_bound(&self, uid: &PodUid, at: Instant, now: Instant) {
        let mut inner = self.inner.lock();
        inner.seq += 1;
        let seq = inner.seq;
        if let Some(p) = inner.pods.get_mut(uid).filter(|p| p.at == at) {
            p.outcome = Outcome::Bound {
                seq,
                next_probe: now + RECHECK_BOUND,
            };
        }
    }

    /// A probe could not resolve the entry (the read failed, or our annotation could not be
    /// removed yet): schedules the next one.
    pub fn probe_failed(&self, uid: &PodUid, at: Instant, now: Instant) {
        let mut inner = self.inner.lock();
        if let Some(p) = inner.pods.get_mut(uid).filter(|p| p.at == at) {
            match p.outcome {
                Outcome::Ambiguous { probes, .. } => {
                    let probes = probes + 1;
                    p.outcome = Outcome::Ambiguous {
                        probes,
                        next_probe: now + backoff(probes),
                    };
                }
                Outcome::Bound { seq, .. } => {
                    p.outcome = Outcome::Bound {
                        seq,
                        next_probe: now + backoff(PROBE_BACKOFF.len()),
                    };
                }
                Outcome::Writing => {}
            }
        }
    }

    /// Entries whose next probe is due (ambiguous, or bound but unconfirmed past the grace),
    /// skipping UIDs with a bind in flight.
    pub fn due_probes(&self, now: Instant) -> Vec<(PodUid, AssumedPod)> {
        let inner = self.inner.lock();
        inner
            .pods
            .iter()
            .filter(|(uid, p)| {
                !inner.in_flight.contains(*uid)
                    && match p.outcome {
                        Outcome::Ambiguous { next_probe, .. }
                        | Outcome::Bound { next_probe, .. } => next_probe <= now,
                        Outcome::Writing => false,
                    }
            })
            .map(|(u, p)| (u.clone(), p.clone()))
            .collect()
    }

    /// Called when the pod sync receives a relist's `Init`, before the list is requested.
    pub fn relist_mark(&self) -> u64 {
        let mut inner = self.inner.lock();
        inner.seq += 1;
        inner.seq
    }

    /// Entries a relist with `mark` may judge: bound before the mark, no bind in flight.
    pub fn relist_candidates(&self, mark: u64) -> Vec<(PodUid, AssumedPod)> {
        let inner = self.inner.lock();
        inner
            .pods
            .iter()
            .filter(|(uid, p)| {
                !inner.in_flight.contains(*uid)
                    && matches!(p.outcome, Outcome::Bound { seq, .. } if seq < mark)
            })
            .map(|(u, p)| (u.clone(), p.clone()))
            .collect()
    }

    /// Keeps only the records `keep` accepts (pruning committed or rolled-back ones).
    pub fn retain(&self, mut keep: impl FnMut(&PodUid, &AssumedPod) -> bool) {
        self.inner.lock().pods.retain(|u, p| keep(u, p));
    }

    /// Every record (for pruning outside the lock).
    pub fn snapshot(&self) -> Vec<(PodUid, AssumedPod)> {
        self.inner
            .lock()
            .pods
            .iter()
            .map(|(u, p)| (u.clone(), p.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(at: Instant) -> AssumedPod {
        AssumedPod {
            namespace: "ns".into(),
            name: "p".into(),
            node: Arc::from("n"),
            at,
            annotations: BTreeMap::new(),
            outcome: Outcome::Writing,
            binding: None,
        }
    }

    #[test]
    fn a_sent_binding_may_land_only_on_the_unchanged_pod_before_its_deadline() {
        let now = Instant::now();
        let sent = SentBinding {
            resource_version: Some("7".into()),
            may_land_until: now + Duration::from_secs(10),
        };
        assert!(sent.may_still_land(Some("7"), now));
        assert!(
            !sent.may_still_land(Some("8"), now),
            "fenced by the precondition"
        );
        assert!(
            !sent.may_still_land(Some("7"), now + Duration::from_secs(10)),
            "past the deadline"
        );
        let unguarded = SentBinding {
            resource_version: None,
            ..sent
        };
        assert!(
            unguarded.may_still_land(Some("8"), now),
            "no precondition: only the deadline"
        );
        assert!(!unguarded.may_still_land(None, now + Duration::from_secs(11)));
    }

    #[test]
    fn relist_judges_only_binds_finished_before_its_mark() {
        let a = Assumptions::default();
        let now = Instant::now();
        let (early, late, writing, ambiguous) = (
            PodUid::new("early"),
            PodUid::new("late"),
            PodUid::new("writing"),
            PodUid::new("ambiguous"),
        );
        for u in [&early, &late, &writing, &ambiguous] {
            a.record(u.clone(), pod(now));
        }
        let _guard = a.begin(&writing).unwrap();
        a.finish(&early, now, true, now);
        a.finish(&ambiguous, now, false, now);
        let mark = a.relist_mark();
        a.finish(&late, now, true, now);
        let c: Vec<_> = a.relist_candidates(mark).into_iter().map(|c| c.0).collect();
        assert_eq!(c, vec![early.clone()]);
        // A probe that confirms the ambiguous one makes it eligible for *later* relists only.
        a.confirm_bound(&ambiguous, now, now);
        assert_eq!(a.relist_candidates(mark).len(), 1);
        let mark2 = a.relist_mark();
        let mut c: Vec<_> = a
            .relist_candidates(mark2)
            .into_iter()
            .map(|c| c.0)
            .collect();
        c.sort();
        assert_eq!(c, vec![ambiguous, early, late]);
    }

    #[test]
    fn probes_back_off_then_continue_at_the_last_interval_and_skip_binds_in_flight() {
        let a = Assumptions::default();
        let t0 = Instant::now();
        let u = PodUid::new("u");
        a.record(u.clone(), pod(t0));
        a.finish(&u, t0, false, t0);
        assert!(a.due_probes(t0).is_empty());
        let mut t = t0;
        let last = *PROBE_BACKOFF.last().unwrap();
        for d in PROBE_BACKOFF.into_iter().chain([last, last, last]) {
            assert!(
                a.due_probes(t + d - Duration::from_millis(1)).is_empty(),
                "not due before +{d:?}"
            );
            t += d;
            assert_eq!(a.due_probes(t).len(), 1, "probe due at +{d:?}");
            {
                let _g = a.begin(&u).unwrap();
                assert!(a.due_probes(t).is_empty(), "in flight: not probed");
            }
            a.probe_failed(&u, t0, t);
        }
        assert!(a.begin(&u).is_some());
    }

    #[test]
    fn a_bound_entry_the_watch_does_not_confirm_is_probed_after_the_grace() {
        let a = Assumptions::default();
        let t0 = Instant::now();
        let u = PodUid::new("u");
        a.record(u.clone(), pod(t0));
        assert!(
            a.due_probes(t0 + Duration::from_secs(3600)).is_empty(),
            "a bind still writing is never probed"
        );
        a.finish(&u, t0, true, t0);
        assert!(
            a.due_probes(t0 + CONFIRM_GRACE - Duration::from_millis(1))
                .is_empty()
        );
        let t = t0 + CONFIRM_GRACE;
        assert_eq!(a.due_probes(t).len(), 1);
        // The read found it bound here: checked again only after RECHECK_BOUND.
        a.confirm_bound(&u, t0, t);
        assert!(
            a.due_probes(t + RECHECK_BOUND - Duration::from_millis(1))
                .is_empty()
        );
        assert_eq!(a.due_probes(t + RECHECK_BOUND).len(), 1);
        // A failed read retries at the last backoff interval.
        a.probe_failed(&u, t0, t + RECHECK_BOUND);
        assert_eq!(
            a.due_probes(t + RECHECK_BOUND + *PROBE_BACKOFF.last().unwrap())
                .len(),
            1
        );
    }
}
