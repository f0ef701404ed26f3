//! A stock kube-scheduler (v1.37, default profile) around the extender, for replays: which
//! nodes it would send, how it would weigh the extender's scores against its own, and which
//! node it would pick. The fragmentation benchmark (`benches/trace_replay.rs`) places every
//! arriving pod through it; `simulate`'s simpler model (all nodes, extender score only, ties
//! by name) stays what it documents.
//!
//! Modelled from `pkg/scheduler` of k8s.io/kubernetes v1.37.2 (read, not ported):
//! - `schedule_one.go` `numFeasibleNodesToFind` and `findNodesThatPassFilters`: the in-tree
//!   filters run from a rotating start until enough feasible nodes are found (adaptive
//!   `percentageOfNodesToScore` when unset, never fewer than 100); the start then moves past
//!   every node processed;
//! - in-tree Filter: NodeResourcesFit over cpu, memory, pods and extended resources not marked
//!   `ignoredByScheduler` (`simulate`'s model);
//! - in-tree Score, default weights: NodeResourcesFit `LeastAllocated` over cpu and memory
//!   (weight 1 each), NodeResourcesBalancedAllocation (the v1.37 form: half of the balance
//!   with the pod, relative to without it), each plugin weight 1. TaintToleration,
//!   NodeAffinity, PodTopologySpread, InterPodAffinity and ImageLocality score every node alike
//!   in a cluster without taints, affinities, spread constraints or images, so they are left
//!   out (a constant changes no choice);
//! - extenders: a pod is sent only when it asks for a managed resource (or every pod, with
//!   `route_all`); the extender's score counts `score × weight × 10`;
//! - `selectHost`: the highest total; ties broken uniformly at random, as its reservoir
//!   sampling does.
//!
//! Never decides a device or CPU placement itself: the verbs and the binder do.

use std::borrow::Cow;
use std::sync::Arc;

use crate::model::pod::Pod;
use crate::model::quantity::Quantity;
use crate::model::requests::{Requests, pod_requests};
use crate::model::resource_names::managed;
use crate::model::wire::{ExtenderArgsRef, ExtenderBindingArgs};
use crate::scheduler::Scheduler;
use crate::scheduler::verbs;

/// kube-scheduler's `minFeasibleNodesToFind`.
const MIN_FEASIBLE_NODES: usize = 100;
/// kube-scheduler's `minFeasibleNodesPercentageToFind`.
const MIN_FEASIBLE_PERCENTAGE: usize = 5;

/// `numFeasibleNodesToFind`: how many feasible nodes kube-scheduler looks for before scoring.
/// `percentage` 0 is the adaptive default.
pub fn num_feasible_nodes_to_find(percentage: u32, all_nodes: usize) -> usize {
    if all_nodes < MIN_FEASIBLE_NODES {
        return all_nodes;
    }
    let mut pct = percentage as usize;
    if pct == 0 {
        pct = 50usize
            .saturating_sub(all_nodes / 125)
            .max(MIN_FEASIBLE_PERCENTAGE);
    }
    (all_nodes * pct / 100).max(MIN_FEASIBLE_NODES)
}

/// `leastRequestedScore` averaged over cpu and memory (weights 1): 0..=100.
pub fn least_allocated_score(requested: [i64; 2], allocatable: [i64; 2]) -> i64 {
    let (mut sum, mut weights) = (0i64, 0i64);
    for (r, a) in requested.iter().zip(allocatable) {
        if a == 0 {
            continue;
        }
        sum += if *r > a { 0 } else { (a - r) * 100 / a };
        weights += 1;
    }
    if weights == 0 { 0 } else { sum / weights }
}

fn balance(requested: [i64; 2], allocatable: [i64; 2]) -> i64 {
    let fractions: Vec<f64> = requested
        .iter()
        .zip(allocatable)
        .filter(|(_, a)| *a != 0)
        .map(|(r, a)| (*r as f64 / a as f64).min(1.0))
        .collect();
    let std = if fractions.len() == 2 {
        ((fractions[0] - fractions[1]) / 2.0).abs()
    } else {
        0.0
    };
    ((1.0 - std) * 100.0) as i64
}

/// `balancedResourceScorer` (v1.37) over cpu and memory: 50 + (50 + with − without) / 2.
pub fn balanced_allocation_score(
    requested: [i64; 2],
    allocated: [i64; 2],
    allocatable: [i64; 2],
) -> i64 {
    50 + (50 + balance(requested, allocatable) - balance(allocated, allocatable)) / 2
}

/// The scheduler's side of a replay: its configuration and its rotating start.
#[derive(Clone, Debug)]
pub struct KubeScheduler {
    /// `percentageOfNodesToScore`; 0 is the adaptive default.
    pub percentage: u32,
    /// The extender stanza's `weight` (the chart's is 200).
    pub extender_weight: i64,
    /// Send every pod to the extender, not only those asking for a managed resource.
    pub route_all: bool,
    next_start: usize,
}

/// Where one pod went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Bound(String),
    /// No feasible node (in-tree or extender); the text is the first reason seen.
    Unschedulable(String),
}

impl KubeScheduler {
    pub fn new(percentage: u32, extender_weight: i64, route_all: bool) -> Self {
        KubeScheduler {
            percentage,
            extender_weight,
            route_all,
            next_start: 0,
        }
    }

    /// One scheduling cycle for `pod` over `nodes` (kube-scheduler's node order), bound through
    /// the extender's binder; `random(n)` is uniform in `0..n` (the tie-break).
    pub async fn schedule(
        &mut self,
        state: &Scheduler,
        nodes: &[Arc<str>],
        pod: &Pod,
        random: &mut dyn FnMut(u64) -> u64,
    ) -> Outcome {
        let requests = match pod_requests(&pod.spec) {
            Ok(r) => r,
            Err(e) => return Outcome::Unschedulable(format!("invalid resources: {e}")),
        };
        let want = num_feasible_nodes_to_find(self.percentage, nodes.len());
        let mut feasible: Vec<Cow<'static, str>> = Vec::with_capacity(want);
        let mut processed = 0;
        let mut first_reason = None;
        for i in 0..nodes.len() {
            if feasible.len() >= want {
                break;
            }
            processed += 1;
            let name = &nodes[(self.next_start + i) % nodes.len()];
            let verdict = state.cluster.node(name).map_or_else(
                || Err("node not found".to_string()),
                |entry| super::simulate::scheduler_fit(state, &entry.read(), &requests, &[]),
            );
            match verdict {
                Ok(()) => feasible.push(Cow::Owned(name.to_string())),
                Err(reason) => {
                    first_reason.get_or_insert(reason);
                }
            }
        }
        if !nodes.is_empty() {
            self.next_start = (self.next_start + processed) % nodes.len();
        }
        let interested = self.route_all || requests.keys().any(|k| managed(k).is_some());
        let (passing, extender): (Vec<String>, Vec<i64>) = if interested {
            let filtered = super::simulate::filter_names(state, pod, feasible);
            if let Some((_, reason)) = filtered
                .failed_nodes
                .iter()
                .flatten()
                .chain(filtered.failed_and_unresolvable_nodes.iter().flatten())
                .next()
            {
                first_reason.get_or_insert(reason.to_string());
            }
            let passing = filtered.node_names.unwrap_or_default();
            let names: Vec<String> = passing.iter().map(|n| n.to_string()).collect();
            let scores = verbs::prioritize(
                state,
                ExtenderArgsRef {
                    pod: Some(pod.clone()),
                    nodes: None,
                    node_names: Some(passing),
                },
            );
            let scores = scores.iter().map(|h| h.score).collect();
            (names, scores)
        } else {
            let names: Vec<String> = feasible.iter().map(|n| n.to_string()).collect();
            let zeros = vec![0; names.len()];
            (names, zeros)
        };
        if passing.is_empty() {
            return Outcome::Unschedulable(first_reason.unwrap_or_else(|| "no nodes".into()));
        }
        // selectHost: the highest total, reservoir sampling among ties.
        let (mut best, mut best_score, mut ties) = (0usize, i64::MIN, 0u64);
        for (i, name) in passing.iter().enumerate() {
            let total = self.in_tree_score(state, name, &requests)
                + extender[i] * self.extender_weight * 10;
            if total > best_score {
                (best, best_score, ties) = (i, total, 1);
            } else if total == best_score {
                ties += 1;
                if random(ties) == 0 {
                    best = i;
                }
            }
        }
        let node = passing[best].clone();
        let bound = state
            .binder
            .bind(&ExtenderBindingArgs {
                pod_name: pod.metadata.name.clone().unwrap_or_default(),
                pod_namespace: pod
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
                pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
                node: node.clone(),
            })
            .await;
        match bound {
            Ok(_) => Outcome::Bound(node),
            Err(e) => Outcome::Unschedulable(format!("bind failed: {e}")),
        }
    }

    /// NodeResourcesFit (LeastAllocated) + NodeResourcesBalancedAllocation for the pod on
    /// `name`, over cpu (millicores) and memory (bytes).
    fn in_tree_score(&self, state: &Scheduler, name: &str, requests: &Requests) -> i64 {
        let Some(entry) = state.cluster.node(name) else {
            return 0;
        };
        let node = entry.read();
        let Some(record) = &node.node else {
            return 0;
        };
        let quantity = |name: &str| {
            record
                .allocatable
                .get(name)
                .and_then(|v| Quantity::parse(v).ok())
                .unwrap_or(Quantity::ZERO)
        };
        let allocatable = [quantity("cpu").milli_value(), quantity("memory").value()];
        let mut allocated = [0i64; 2];
        for pod in node.pods.values() {
            allocated[0] += pod.requests.get("cpu").map_or(0, Quantity::milli_value);
            allocated[1] += pod.requests.get("memory").map_or(0, Quantity::value);
        }
        let own = [
            requests.get("cpu").map_or(0, Quantity::milli_value),
            requests.get("memory").map_or(0, Quantity::value),
        ];
        let requested = [allocated[0] + own[0], allocated[1] + own[1]];
        least_allocated_score(requested, allocatable)
            + balanced_allocation_score(requested, allocated, allocatable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figures worked from kube-scheduler's formulas by hand.
    #[test]
    fn feasible_nodes_as_kube_scheduler_counts_them() {
        assert_eq!(num_feasible_nodes_to_find(0, 50), 50);
        // 1,213 nodes: 50 − 9 = 41 % → 497.
        assert_eq!(num_feasible_nodes_to_find(0, 1213), 497);
        // 5,000 nodes: 50 − 40 = 10 % → 500.
        assert_eq!(num_feasible_nodes_to_find(0, 5000), 500);
        // 15,000 nodes: the 5 % floor → 750.
        assert_eq!(num_feasible_nodes_to_find(0, 15_000), 750);
        assert_eq!(num_feasible_nodes_to_find(100, 1213), 1213);
        // Never fewer than 100.
        assert_eq!(num_feasible_nodes_to_find(1, 1213), 100);
    }

    #[test]
    fn in_tree_scores_as_kube_scheduler_computes_them() {
        // Half the CPU and a quarter of the memory left: (50 + 25) / 2.
        assert_eq!(least_allocated_score([2000, 3], [4000, 4]), 37);
        assert_eq!(least_allocated_score([5000, 1], [4000, 4]), 37);
        // Balanced before (0.5, 0.5) and after (0.75, 0.25): 50 + (50 + 75 − 100) / 2 = 62.
        assert_eq!(
            balanced_allocation_score([3000, 1], [2000, 2], [4000, 4]),
            62
        );
        // Unchanged balance: 75.
        assert_eq!(
            balanced_allocation_score([2000, 2], [1000, 1], [4000, 4]),
            75
        );
    }
}
