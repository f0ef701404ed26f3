//! Victims the extender's `preempt` proposes on a node where kube-scheduler's own do not make
//! room for the pod (issue 38 §2).
//!
//! kube-scheduler picks victims by its own filters and node totals: for a pod asking for half a
//! GPU it may pick two pods on two different cards, whose removal frees enough in total and on
//! no single card. The extender then has two choices: drop the node (what it did before), or
//! answer other victims on it. This module finds them: the fewest pods, then those of the lowest
//! priorities, whose removal lets the extender's full decision place the pod *and* keeps
//! kube-scheduler's own resource fit passing (`scheduler::kube_fit`): kube-scheduler v1.37 evicts
//! an extender's victims as they are, so a set that frees the card but not the CPU would evict
//! pods for nothing.
//!
//! Rules:
//! - only pods of lower priority than the preemptor (kube-scheduler's rule), on the node, holding
//!   something the pod can use (a device of a type it asks for, a cpuset when it wants CPU
//!   placement): never a victim whose removal frees nothing the preemptor can use;
//! - the fewest PodDisruptionBudget violations first (counted as kube-scheduler counts its own,
//!   `cluster::budgets`; the answer carries the count, which kube-scheduler ranks nodes by), then
//!   the fewest victims, then the lowest highest priority among them, then the lowest sum of
//!   priorities, then pod UIDs (deterministic);
//! - bounded: sets of at most [`MAX_VICTIMS`] pods and [`SEARCH_BUDGET`] decisions per node; a
//!   node where that finds nothing is dropped, as before.
//!
//! Not modelled: in-tree filters other than the resource fit (affinity, ports): only nodes where
//! kube-scheduler's victims do not work get other victims, so where those filters needed its
//! victims the node was lost anyway.
//!
//! Pure over a node's cached state (the caller holds its lock): decides, never writes.

use super::config::ScoringConfig;
use super::decide;
use super::kube_fit::node_resources_fit;
use super::needs::PodNeeds;
use crate::cluster::NodeState;
use crate::cluster::budgets::DisruptionBudgets;
use crate::cluster::pod::{PodCpus, PodDevices, PodRecord};
use crate::model::ids::PodUid;
use crate::model::requests::Requests;

/// The largest victim set tried.
pub const MAX_VICTIMS: usize = 4;
/// Victim sets tried per node at most (each one full decision under the node's lock).
pub const SEARCH_BUDGET: usize = 256;

/// Whether removing `pod` can free something `needs` uses.
fn frees_something(pod: &PodRecord, needs: &PodNeeds) -> bool {
    let devices = needs
        .devices
        .as_ref()
        .is_some_and(|req| match &pod.devices {
            PodDevices::Allocated(a) => a.0.keys().any(|t| req.types.contains_key(t)),
            PodDevices::Unannotated(held) => held.types.keys().any(|t| req.types.contains_key(t)),
            PodDevices::None | PodDevices::Malformed(_) => false,
        });
    let cpus = needs.wants_cpu_placement() && matches!(pod.cpus, PodCpus::Allocated(_));
    devices || cpus
}

/// The best victim set on `node` for a pod of priority `priority` with `needs` (the extender's
/// decision) and `requests` (kube-scheduler's resource fit), with the PodDisruptionBudgets it
/// violates (counted as kube-scheduler counts them), or `None` within the bounds.
pub fn fewest_victims(
    node: &NodeState,
    needs: &PodNeeds,
    scoring: &ScoringConfig,
    priority: i32,
    requests: &Requests,
    budgets: &DisruptionBudgets,
) -> Option<(Vec<PodUid>, usize)> {
    let record = node.node.as_ref()?;
    // kube-scheduler checks the names the node advertises (and refuses those it does not, which
    // a pod it proposed victims for cannot be asking for in-tree).
    let counted = |name: &str| record.allocatable.contains_key(name);
    let mut pool: Vec<&PodRecord> = node
        .pods
        .values()
        .map(|p| p.as_ref())
        .filter(|p| p.priority < priority && frees_something(p, needs))
        .collect();
    pool.sort_by(|a, b| a.priority.cmp(&b.priority).then_with(|| a.uid.cmp(&b.uid)));
    // (violations, size, highest priority, sum of priorities): sets of every size compete, a
    // larger set without a violation beating a smaller one with (kube-scheduler ranks nodes by
    // violations first, and reprieves violating victims first on a node).
    type Key = (usize, usize, i32, i64);
    let mut best: Option<(Key, Vec<PodUid>)> = None;
    let mut tries = 0usize;
    'sizes: for size in 1..=MAX_VICTIMS.min(pool.len()) {
        if best
            .as_ref()
            .is_some_and(|((violations, ..), _)| *violations == 0)
        {
            break;
        }
        let mut picks: Vec<usize> = (0..size).collect();
        loop {
            if tries == SEARCH_BUDGET {
                break 'sizes;
            }
            tries += 1;
            let set: Vec<PodUid> = picks.iter().map(|i| pool[*i].uid.clone()).collect();
            let fits = decide::decide_on_node(Some(node), needs, &set, scoring).is_ok()
                && node_resources_fit(node, requests, &set, counted).is_ok();
            if fits {
                let chosen: Vec<&PodRecord> = picks.iter().map(|i| pool[*i]).collect();
                let key = (
                    budgets.violations(&chosen),
                    size,
                    chosen.iter().map(|p| p.priority).max().unwrap_or(0),
                    chosen.iter().map(|p| i64::from(p.priority)).sum(),
                );
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, set));
                }
            }
            if !next_combination(&mut picks, pool.len()) {
                break;
            }
        }
    }
    best.map(|((violations, ..), set)| (set, violations))
}

/// Advances `picks` (strictly increasing indices below `n`) to the next combination in
/// lexicographic order; false after the last.
fn next_combination(picks: &mut [usize], n: usize) -> bool {
    let k = picks.len();
    for i in (0..k).rev() {
        if picks[i] < n - k + i {
            picks[i] += 1;
            for j in i + 1..k {
                picks[j] = picks[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_are_every_subset_of_a_size_once_in_order() {
        let mut picks = vec![0, 1];
        let mut seen = vec![picks.clone()];
        while next_combination(&mut picks, 4) {
            seen.push(picks.clone());
        }
        assert_eq!(
            seen,
            vec![
                vec![0, 1],
                vec![0, 2],
                vec![0, 3],
                vec![1, 2],
                vec![1, 3],
                vec![2, 3]
            ]
        );
        let mut one = vec![0];
        let mut count = 1;
        while next_combination(&mut one, 5) {
            count += 1;
        }
        assert_eq!(count, 5);
    }
}
