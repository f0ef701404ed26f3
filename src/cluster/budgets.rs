//! PodDisruptionBudgets, as preemption reads them: which pods a budget covers and how many of
//! them may still be disrupted. `preempt` counts the budgets a victim set would violate exactly
//! as kube-scheduler v1.37 counts its own (`FilterVictimsWithPDBViolation`), so the extender's
//! own victims (`crate::scheduler::victims`) avoid protected pods where others do, and the
//! answer carries the count kube-scheduler ranks candidate nodes by.
//!
//! Only the index and the count live here; nothing here chooses victims.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::{Selector, SelectorExt};
use parking_lot::RwLock;

use super::pod::PodRecord;
use crate::model::ids::ObjectKey;

/// One budget, reduced to what the count reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    pub key: ObjectKey,
    pub namespace: String,
    /// `None` when the selector is missing, empty or does not parse: such a budget covers no
    /// pod (kube-scheduler: "a PDB with a nil or empty selector matches nothing", and an invalid
    /// one "does not match the pod").
    selector: Option<Selector>,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i32,
    /// `status.disruptedPods`' names: evictions the API server already processed, not counted
    /// again.
    disrupted: BTreeSet<String>,
}

impl Budget {
    pub fn from_pdb(pdb: &PodDisruptionBudget) -> Option<Self> {
        let meta = &pdb.metadata;
        let name = meta.name.as_deref().filter(|n| !n.is_empty())?;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let selector = pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .and_then(|s| Selector::try_from(s).ok())
            .filter(|s| !s.selects_all());
        let status = pdb.status.as_ref();
        Some(Budget {
            key: ObjectKey::namespaced(&namespace, name),
            namespace,
            selector,
            disruptions_allowed: status.map_or(0, |s| s.disruptions_allowed),
            disrupted: status
                .and_then(|s| s.disrupted_pods.as_ref())
                .map(|d| d.keys().cloned().collect())
                .unwrap_or_default(),
        })
    }

    fn covers(&self, namespace: &str, name: &str, labels: &BTreeMap<String, String>) -> bool {
        self.namespace == namespace
            && !labels.is_empty()
            && self.selector.as_ref().is_some_and(|s| s.matches(labels))
            && !self.disrupted.contains(name)
    }
}

/// The budgets by namespace. Written by the PDB sync only; read by `preempt`.
#[derive(Debug, Default)]
pub struct DisruptionBudgets {
    by_namespace: RwLock<HashMap<String, BTreeMap<ObjectKey, Arc<Budget>>>>,
}

impl DisruptionBudgets {
    pub fn set(&self, budget: Arc<Budget>) {
        self.by_namespace
            .write()
            .entry(budget.namespace.clone())
            .or_default()
            .insert(budget.key.clone(), budget);
    }

    pub fn remove(&self, budget: &Budget) {
        let mut map = self.by_namespace.write();
        if let Some(budgets) = map.get_mut(&budget.namespace) {
            budgets.remove(&budget.key);
            if budgets.is_empty() {
                map.remove(&budget.namespace);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.by_namespace.read().values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_namespace.read().is_empty()
    }

    /// How many of `victims` evicting them all would violate a budget for, counted as
    /// kube-scheduler counts its own: the pods in order of importance (higher priority first;
    /// ties by key, where kube-scheduler looks at start times the caches do not keep), then
    /// [`Self::violating`].
    pub fn violations(&self, victims: &[&PodRecord]) -> usize {
        if self.is_empty() {
            return 0;
        }
        let mut ordered: Vec<&PodRecord> = victims.to_vec();
        ordered.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.key.cmp(&b.key)));
        let pods: Vec<(&str, &str, &BTreeMap<String, String>)> = ordered
            .iter()
            .map(|p| {
                let (namespace, name) = p.key.split();
                (namespace, name, &p.labels)
            })
            .collect();
        self.violating(&pods).into_iter().filter(|v| *v).count()
    }

    /// Which of `pods` (`(namespace, name, labels)`, in kube-scheduler's order: most important
    /// first) would violate a budget if all were evicted (kube-scheduler's
    /// `FilterVictimsWithPDBViolation`): each takes one disruption from every budget covering
    /// it, in the budgets' order, until one goes below zero (then the pod violates, and the
    /// budgets after it are not charged for it).
    pub fn violating(&self, pods: &[(&str, &str, &BTreeMap<String, String>)]) -> Vec<bool> {
        let map = self.by_namespace.read();
        let mut allowed: HashMap<&ObjectKey, i32> = HashMap::new();
        pods.iter()
            .map(|(namespace, name, labels)| {
                let Some(budgets) = map.get(*namespace) else {
                    return false;
                };
                for budget in budgets.values() {
                    if !budget.covers(namespace, name, labels) {
                        continue;
                    }
                    let left = allowed
                        .entry(&budget.key)
                        .or_insert(budget.disruptions_allowed);
                    *left -= 1;
                    if *left < 0 {
                        return true;
                    }
                }
                false
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn budget(name: &str, selector: serde_json::Value, allowed: i32, disrupted: &[&str]) -> Budget {
        let disrupted: serde_json::Map<String, serde_json::Value> = disrupted
            .iter()
            .map(|p| (p.to_string(), json!("2026-01-01T00:00:00Z")))
            .collect();
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"selector": selector},
            "status": {"disruptionsAllowed": allowed, "disruptedPods": disrupted,
                "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0},
        }))
        .unwrap();
        Budget::from_pdb(&pdb).unwrap()
    }

    fn pod(name: &str, priority: i32, labels: &[(&str, &str)]) -> PodRecord {
        let pod: crate::model::pod::Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                "labels": labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "annotations": {"scheduling.koordinator.sh/device-allocated":
                    r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory-ratio":"50"}}]}"#}},
            "spec": {"nodeName": "n", "priority": priority},
        }))
        .unwrap();
        PodRecord::from_pod(&pod).unwrap()
    }

    #[test]
    fn a_budget_is_charged_once_per_covered_pod_and_violated_below_zero() {
        let b = DisruptionBudgets::default();
        b.set(Arc::new(budget(
            "web",
            json!({"matchLabels": {"app": "web"}}),
            1,
            &[],
        )));
        let (w1, w2, other) = (
            pod("w1", 10, &[("app", "web")]),
            pod("w2", 5, &[("app", "web")]),
            pod("o", 1, &[("app", "db")]),
        );
        assert_eq!(b.violations(&[&w1]), 0);
        assert_eq!(b.violations(&[&w1, &w2]), 1);
        assert_eq!(b.violations(&[&w1, &other]), 0);
        // A pod already in disruptedPods is not charged again.
        b.set(Arc::new(budget(
            "web",
            json!({"matchLabels": {"app": "web"}}),
            1,
            &["w1"],
        )));
        assert_eq!(b.violations(&[&w1, &w2]), 0);
    }

    #[test]
    fn empty_missing_or_foreign_selectors_cover_nothing() {
        let b = DisruptionBudgets::default();
        b.set(Arc::new(budget("all", json!({}), 0, &[])));
        let mut none = budget("none", json!({}), 0, &[]);
        none.key = ObjectKey::namespaced("ml", "none");
        b.set(Arc::new(none));
        let mut elsewhere = budget("x", json!({"matchLabels": {"app": "web"}}), 0, &[]);
        elsewhere.namespace = "other".into();
        elsewhere.key = ObjectKey::namespaced("other", "x");
        b.set(Arc::new(elsewhere));
        let w = pod("w", 1, &[("app", "web")]);
        assert_eq!(b.violations(&[&w]), 0);
        // An unlabeled pod is covered by nothing, whatever the selector.
        b.set(Arc::new(budget(
            "exprs",
            json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
            0,
            &[],
        )));
        assert_eq!(b.violations(&[&pod("bare", 1, &[])]), 0);
        assert_eq!(b.violations(&[&pod("db", 1, &[("app2", "x")])]), 1);
        b.remove(&budget("exprs", json!({}), 0, &[]));
        assert_eq!(b.violations(&[&pod("db", 1, &[("app2", "x")])]), 0);
        assert_eq!(b.len(), 3);
    }

    #[test]
    fn a_pod_stops_at_the_first_budget_it_violates() {
        // kube-scheduler's loop returns at the first violated budget: the budgets after it are
        // not charged for that pod.
        let b = DisruptionBudgets::default();
        b.set(Arc::new(budget(
            "a",
            json!({"matchLabels": {"app": "web"}}),
            0,
            &[],
        )));
        b.set(Arc::new(budget(
            "b",
            json!({"matchLabels": {"tier": "x"}}),
            1,
            &[],
        )));
        let both = pod("both", 9, &[("app", "web"), ("tier", "x")]);
        let tier = pod("tier", 1, &[("tier", "x")]);
        // `both` violates `a` and leaves `b` uncharged, so `tier` still has its one.
        assert_eq!(b.violations(&[&both, &tier]), 1);
    }
}
