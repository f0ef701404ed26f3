//! Pods kube-scheduler nominated to a node and has not bound yet: preemptors waiting for their
//! victims to go (`status.nominatedNodeName` on a pod with no `spec.nodeName`). Filter holds
//! their capacity for them (`crate::scheduler::nominated`), as kube-scheduler's own filters do
//! with `addGENominatedPods`.
//!
//! Only the index lives here: who is nominated where, with the pod as the API holds it (its
//! needs are decided by the scheduler, from the configuration of the moment). Nothing here
//! reads a ledger or decides a fit.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

use crate::model::ids::{ObjectKey, PodUid};
use crate::model::pod::Pod;

/// One pending pod with a nominated node, as the nominated-pod watch decodes it.
#[derive(Clone, Debug)]
pub struct NominatedPod {
    pub uid: PodUid,
    pub key: ObjectKey,
    /// `status.nominatedNodeName`; `None` when the pod is no longer a pending nominee (bound
    /// meanwhile, finished, or its nomination cleared): the index forgets it.
    pub node: Option<Arc<str>>,
    /// `spec.priority`, 0 when unset (kube-scheduler's `PodPriority`).
    pub priority: i32,
    /// The pod, for its needs.
    pub pod: Arc<Pod>,
}

impl NominatedPod {
    /// `None` when the pod has no UID or name (unusable, as for every kind).
    pub fn from_pod(pod: &Pod) -> Option<Self> {
        let meta = &pod.metadata;
        let uid = meta.uid.as_deref().filter(|u| !u.is_empty())?;
        let name = meta.name.as_deref().filter(|n| !n.is_empty())?;
        let namespace = meta.namespace.as_deref().unwrap_or("default");
        let pending = pod.node_name().is_none() && !pod.is_terminal();
        let node = pod
            .status
            .nominated_node_name
            .as_deref()
            .filter(|n| pending && !n.is_empty())
            .map(Arc::from);
        Some(NominatedPod {
            uid: PodUid::new(uid),
            key: ObjectKey::namespaced(namespace, name),
            node,
            priority: pod.spec.priority.unwrap_or(0),
            pod: Arc::new(pod.clone()),
        })
    }
}

#[derive(Debug, Default)]
struct Index {
    by_uid: HashMap<PodUid, Arc<NominatedPod>>,
    by_node: HashMap<Arc<str>, BTreeMap<PodUid, Arc<NominatedPod>>>,
}

/// Nominated pods by node. Written by the nominated-pod sync only; read by filter.
#[derive(Debug, Default)]
pub struct Nominations {
    index: RwLock<Index>,
    /// `by_uid.len()`, so filter skips the lock entirely while nobody is nominated (always,
    /// outside preemption).
    count: AtomicUsize,
}

impl Nominations {
    /// Records `pod`'s nomination, replacing any earlier one; a pod with no node is forgotten.
    pub fn set(&self, pod: Arc<NominatedPod>) {
        let mut index = self.index.write();
        Self::forget_locked(&mut index, &pod.uid);
        if let Some(node) = pod.node.clone() {
            index
                .by_node
                .entry(node)
                .or_default()
                .insert(pod.uid.clone(), pod.clone());
            index.by_uid.insert(pod.uid.clone(), pod);
        }
        self.count.store(index.by_uid.len(), Ordering::Release);
    }

    pub fn forget(&self, uid: &PodUid) {
        let mut index = self.index.write();
        Self::forget_locked(&mut index, uid);
        self.count.store(index.by_uid.len(), Ordering::Release);
    }

    fn forget_locked(index: &mut Index, uid: &PodUid) {
        let Some(old) = index.by_uid.remove(uid) else {
            return;
        };
        if let Some(node) = &old.node
            && let Some(pods) = index.by_node.get_mut(node)
        {
            pods.remove(uid);
            if pods.is_empty() {
                index.by_node.remove(node);
            }
        }
    }

    /// Whether any pod is nominated anywhere (one atomic load).
    pub fn is_empty(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }

    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// The pods nominated to `node`, in UID order.
    pub fn on_node(&self, node: &str) -> Vec<Arc<NominatedPod>> {
        if self.is_empty() {
            return Vec::new();
        }
        self.index
            .read()
            .by_node
            .get(node)
            .map(|pods| pods.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every nomination, by node (for `/debug` and tests).
    pub fn all(&self) -> BTreeMap<Arc<str>, Vec<ObjectKey>> {
        self.index
            .read()
            .by_node
            .iter()
            .map(|(node, pods)| (node.clone(), pods.values().map(|p| p.key.clone()).collect()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, node_name: Option<&str>, nominated: Option<&str>, phase: &str) -> Pod {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"priority": 7},
            "status": {"phase": phase},
        }))
        .unwrap();
        p.spec.node_name = node_name.map(str::to_owned);
        p.status.nominated_node_name = nominated.map(str::to_owned);
        p
    }

    #[test]
    fn only_pending_pods_with_a_nominated_node_are_indexed() {
        let n = Nominations::default();
        let a = NominatedPod::from_pod(&pod("a", None, Some("n1"), "Pending")).unwrap();
        assert_eq!(a.priority, 7);
        n.set(Arc::new(a));
        for (uid, node_name, nominated, phase) in [
            ("b", Some("n1"), Some("n1"), "Pending"),
            ("c", None, None, "Pending"),
            ("d", None, Some(""), "Pending"),
            ("e", None, Some("n1"), "Failed"),
        ] {
            n.set(Arc::new(
                NominatedPod::from_pod(&pod(uid, node_name, nominated, phase)).unwrap(),
            ));
        }
        assert_eq!(n.len(), 1);
        let on = n.on_node("n1");
        assert_eq!(on.len(), 1);
        assert_eq!(on[0].uid, PodUid::new("a"));
        assert!(n.on_node("n2").is_empty());
    }

    #[test]
    fn a_moved_nomination_leaves_its_old_node_and_a_cleared_one_is_forgotten() {
        let n = Nominations::default();
        let set = |nominated: Option<&str>| {
            n.set(Arc::new(
                NominatedPod::from_pod(&pod("a", None, nominated, "Pending")).unwrap(),
            ))
        };
        set(Some("n1"));
        set(Some("n2"));
        assert!(n.on_node("n1").is_empty());
        assert_eq!(n.on_node("n2").len(), 1);
        assert_eq!(n.all().len(), 1);
        set(None);
        assert!(n.is_empty());
        assert!(n.all().is_empty());
        set(Some("n1"));
        n.forget(&PodUid::new("a"));
        assert!(n.is_empty() && n.on_node("n1").is_empty());
    }
}
