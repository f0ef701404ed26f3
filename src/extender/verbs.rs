//! What each read-only verb decides, from views of the caches. Filter, prioritize and preempt
//! never mutate the caches: they take node read locks and compute on copies.
//!
//! Device policy for nodes (reference koord-deviceshare §2.6, koordinator #1594):
//! - a node without a `Device` object passes device filtering: its devices, if any, are
//!   managed by the kubelet's device plugins, which kube-scheduler's own resource fit checks;
//! - unless pods on it hold device allocations: then its `Device` is missing (deleted, or not
//!   yet arrived) and nothing is allocatable until it returns (resolvable: koordlet recreates
//!   it), while what its pods hold stays counted;
//! - when the Device CRD is not served at all, device filtering is off.

use std::collections::BTreeMap;

use super::AppState;
use super::wire::{
    ExtenderArgs, ExtenderFilterResult, ExtenderPreemptionArgs, ExtenderPreemptionResult,
    HostPriority, MetaPod, MetaVictims, NodeList,
};
use crate::cluster::NodeState;
use crate::model::ids::PodUid;
use crate::model::pod::Pod;
use crate::placement::device::allocate::FitError;
use crate::placement::device::fast::{self, FastRequest};
use crate::placement::device::pod_device_request;
use crate::placement::device::request::PodDeviceRequest;
use crate::placement::device::score::{normalize_scores, score_node};
use crate::sync::Kind;

/// The pod's device request: `Ok(None)` when it needs no devices (or device placement is off).
pub fn device_request(state: &AppState, pod: &Pod) -> Result<Option<PodDeviceRequest>, String> {
    if !state.readiness.is_enabled(Kind::Devices) {
        return Ok(None);
    }
    pod_device_request(pod)
}

/// Does the pod's device request fit this node, with `ignore`'s allocations released?
/// Without victims, the cached fixed-size index answers (same result as the full allocator,
/// see `placement::device::fast`); otherwise the full allocator does.
pub fn device_fit(
    state: &AppState,
    node: Option<&NodeState>,
    req: &PodDeviceRequest,
    fast: Option<&FastRequest>,
    ignore: &[PodUid],
) -> Result<(), FitError> {
    if let (Some(n), Some(fr), true) = (node, fast, ignore.is_empty())
        && n.devices.devices().is_some()
        && let Some(verdict) = fast::feasible(&n.devices, fr)
    {
        return verdict;
    }
    crate::bind::allocate_on(node, req, ignore, &state.scoring).map(|_| ())
}

/// Filter: the subset of candidates that fit, and a categorical reason for every other one.
pub fn filter(state: &AppState, mut args: ExtenderArgs) -> ExtenderFilterResult {
    let Some(pod) = args.pod.take() else {
        return ExtenderFilterResult::error("filter request has no Pod");
    };
    let mut failed = BTreeMap::new();
    let mut unresolvable = BTreeMap::new();
    // Names mode: move the names into the answer instead of copying them.
    let nodes_mode = args.nodes_mode();
    let candidates: Vec<String> = match args.node_names.take() {
        Some(names) => names,
        None => args
            .candidate_names()
            .into_iter()
            .map(str::to_owned)
            .collect(),
    };
    let passing: Vec<String> = match device_request(state, &pod) {
        // No device needs: pass through untouched and cheaply.
        Ok(None) => candidates,
        Err(reason) => {
            for name in candidates {
                unresolvable.insert(name, reason.clone());
            }
            Vec::new()
        }
        Ok(Some(req)) => {
            let fast = FastRequest::new(&req, &state.scoring);
            let verdicts: Vec<_> = candidates
                .iter()
                .map(|name| {
                    let entry = state.cluster.node(name);
                    let guard = entry.as_ref().map(|e| e.read());
                    device_fit(state, guard.as_deref(), &req, fast.as_ref(), &[])
                })
                .collect();
            let mut passing = Vec::with_capacity(candidates.len());
            for (name, verdict) in candidates.into_iter().zip(verdicts) {
                match verdict {
                    Ok(()) => passing.push(name),
                    Err(e) if e.unresolvable => {
                        unresolvable.insert(name, e.reason);
                    }
                    Err(e) => {
                        failed.insert(name, e.reason);
                    }
                }
            }
            passing
        }
    };
    if nodes_mode {
        let nodes = args.nodes.unwrap_or_default();
        let passing: std::collections::HashSet<&str> = passing.iter().map(String::as_str).collect();
        let items = nodes
            .items
            .into_iter()
            .filter(|n| passing.contains(n.name.as_str()))
            .collect();
        ExtenderFilterResult {
            nodes: Some(NodeList {
                metadata: nodes.metadata,
                items,
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

/// Prioritize: one integer score 0..=10 per candidate node, best node 10.
pub fn prioritize(state: &AppState, args: &ExtenderArgs) -> Vec<HostPriority> {
    let names = args.candidate_names();
    let req = match args.pod.as_ref().map(|p| device_request(state, p)) {
        Some(Ok(Some(req))) => req,
        // No device needs (or an invalid request, which filter already rejected): no opinion.
        _ => {
            return names
                .into_iter()
                .map(|host| HostPriority {
                    host: host.to_owned(),
                    score: 0,
                })
                .collect();
        }
    };
    let fast = FastRequest::new(&req, &state.scoring);
    let raw: Vec<i64> = names
        .iter()
        .map(|name| match state.cluster.node(name) {
            Some(entry) => {
                let node = entry.read();
                fast.as_ref()
                    .and_then(|fr| fast::score(&node.devices, fr))
                    .unwrap_or_else(|| score_node(&node.devices, &req, &state.scoring))
            }
            None => 0,
        })
        .collect();
    names
        .into_iter()
        .zip(normalize_scores(&raw))
        .map(|(host, score)| HostPriority {
            host: host.to_owned(),
            score,
        })
        .collect()
}

/// Preempt: keep the candidate nodes where removing the proposed victims lets the pod fit,
/// victims in the order given (kube-scheduler reads the first as the highest priority).
pub fn preempt(state: &AppState, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult {
    let mut candidates: BTreeMap<String, MetaVictims> = BTreeMap::new();
    if let Some(meta) = args.node_name_to_meta_victims {
        candidates = meta;
    } else if let Some(full) = args.node_name_to_victims {
        for (node, victims) in full {
            let pods = victims
                .pods
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| p.metadata.uid.map(|uid| MetaPod { uid }))
                .collect();
            candidates.insert(
                node,
                MetaVictims {
                    pods: Some(pods),
                    num_pdb_violations: victims.num_pdb_violations,
                },
            );
        }
    }
    // kube-scheduler rejects a node with no victims; never return one.
    candidates.retain(|_, v| v.pods.as_ref().is_some_and(|p| !p.is_empty()));
    let req = match args.pod.as_ref().map(|p| device_request(state, p)) {
        Some(Ok(Some(req))) => req,
        Some(Ok(None)) => {
            return ExtenderPreemptionResult {
                node_name_to_meta_victims: Some(candidates),
            };
        }
        // No pod or an invalid request: preemption cannot help anywhere.
        _ => {
            return ExtenderPreemptionResult {
                node_name_to_meta_victims: Some(BTreeMap::new()),
            };
        }
    };
    candidates.retain(|node, victims| {
        let ignore: Vec<PodUid> = victims
            .pods
            .iter()
            .flatten()
            .map(|p| PodUid::new(&p.uid))
            .collect();
        let entry = state.cluster.node(node);
        let guard = entry.as_ref().map(|e| e.read());
        device_fit(state, guard.as_deref(), &req, None, &ignore).is_ok()
    });
    ExtenderPreemptionResult {
        node_name_to_meta_victims: Some(candidates),
    }
}
