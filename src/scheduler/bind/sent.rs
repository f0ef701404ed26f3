//! The pods kube-scheduler sent with `filter`, kept by UID so that the bind of the same
//! scheduling cycle decides on that copy instead of reading the pod from the API server.
//!
//! Why it is safe: the binding carries the copy's resourceVersion as a precondition, so a pod
//! changed since kube-scheduler's informer saw it (an annotation, a status write by a PreBind
//! plugin, a nominated node) answers 409, and the commit re-reads it; if the fresh pod asks
//! for something else than the decision was made for, the bind fails and kube-scheduler retries
//! (`commit`). Bind uses a kept copy only when nothing else depends on the pod's current state:
//! no earlier attempt of the pod holds an allocation (resolving it needs the live pod), and
//! DRA does not serve the pod's request on the node (that needs the status kube-scheduler's
//! PreBind writes after filter). Otherwise, and when no copy is kept (another replica
//! filtered, a restart, an eviction from here), bind reads the pod as before.
//!
//! Bounded: at most [`SentPods::CAPACITY`] pods, the oldest dropped first; taking a pod
//! removes it. It holds only unbound pods that passed filter somewhere (only those are bound).
//! Must not decide anything, and must never be read by filter or prioritize.

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;

use crate::model::ids::PodUid;
use crate::model::pod::Pod;

#[derive(Default)]
struct Kept {
    /// Each pod with the number it was kept under.
    by_uid: HashMap<PodUid, (u64, Pod)>,
    /// `(number, uid)` in the order kept; an entry whose number is no longer its pod's (kept
    /// again, or taken) is skipped when it reaches the front.
    order: VecDeque<(u64, PodUid)>,
    next: u64,
}

/// See the module docs.
#[derive(Default)]
pub struct SentPods {
    kept: Mutex<Kept>,
}

impl SentPods {
    /// Far above the binds kube-scheduler has in flight at once (its binding cycles run
    /// while the next pods are scheduled): a few MiB of slim pods at most.
    pub const CAPACITY: usize = 1024;

    /// Keeps the pod filter decided on, replacing an earlier copy of the same UID. A pod
    /// without a UID or resourceVersion, or already bound, is not kept.
    pub fn keep(&self, pod: Pod) {
        let Some(uid) = pod.metadata.uid.as_deref().map(PodUid::new) else {
            return;
        };
        if pod.metadata.resource_version.is_none() || pod.node_name().is_some() {
            return;
        }
        let mut kept = self.kept.lock();
        let n = kept.next;
        kept.next += 1;
        kept.by_uid.insert(uid.clone(), (n, pod));
        kept.order.push_back((n, uid));
        // The queue holds at most twice the capacity: stale entries go as they surface.
        while kept.by_uid.len() > Self::CAPACITY || kept.order.len() > 2 * Self::CAPACITY {
            let Some((n, oldest)) = kept.order.pop_front() else {
                break;
            };
            if kept.by_uid.get(&oldest).is_some_and(|(m, _)| *m == n) {
                kept.by_uid.remove(&oldest);
            }
        }
    }

    /// Takes the kept copy of `uid`, if any.
    pub fn take(&self, uid: &PodUid) -> Option<Pod> {
        self.kept.lock().by_uid.remove(uid).map(|(_, pod)| pod)
    }

    /// How many pods are kept (for tests and `/debug`).
    pub fn len(&self) -> usize {
        self.kept.lock().by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, rv: Option<&str>, node: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.to_string());
        p.metadata.resource_version = rv.map(str::to_string);
        p.spec.node_name = node.map(str::to_string);
        p
    }

    #[test]
    fn keeps_unbound_pods_with_an_identity_and_takes_each_once() {
        let sent = SentPods::default();
        sent.keep(pod("a", Some("1"), None));
        sent.keep(pod("a", Some("2"), None));
        sent.keep(pod("no-rv", None, None));
        sent.keep(pod("bound", Some("1"), Some("n1")));
        assert_eq!(sent.len(), 1);
        let a = sent.take(&PodUid::new("a")).expect("kept");
        assert_eq!(
            a.metadata.resource_version.as_deref(),
            Some("2"),
            "the latest copy"
        );
        assert!(sent.take(&PodUid::new("a")).is_none());
        assert!(sent.is_empty());
    }

    #[test]
    fn holds_at_most_its_capacity_dropping_the_oldest() {
        let sent = SentPods::default();
        for i in 0..SentPods::CAPACITY + 10 {
            sent.keep(pod(&format!("p{i}"), Some("1"), None));
            // One pod filtered again and again stays the newest.
            sent.keep(pod("hot", Some("1"), None));
        }
        assert_eq!(sent.len(), SentPods::CAPACITY);
        assert!(
            sent.take(&PodUid::new("p0")).is_none(),
            "the oldest went first"
        );
        assert!(sent.take(&PodUid::new("hot")).is_some());
        let last = format!("p{}", SentPods::CAPACITY + 9);
        assert!(sent.take(&PodUid::new(&last)).is_some());
    }
}
