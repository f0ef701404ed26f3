//! What each read-only verb decides, from views of the caches. Filter and prioritize decide on
//! the cluster's read snapshot (`cluster::snapshot`: no node lock, no allocation per node),
//! falling back to the full decision under the node's read lock for the rare node or request
//! the summaries cannot answer; preempt, which must release victims' allocations, always
//! decides in full. None of them mutates the caches.
//!
//! Device policy for nodes (koordinator `pkg/scheduler/plugins/deviceshare/plugin.go`, koordinator #1594):
//! - a node without a `Device` object passes device filtering: its devices, if any, are
//!   managed by the kubelet's device plugins, which kube-scheduler's own resource fit checks;
//! - unless pods on it hold device allocations: then its `Device` is missing (deleted, or not
//!   yet arrived) and nothing is allocatable until it returns (resolvable: koordlet recreates
//!   it), while what its pods hold stays counted;
//! - when the Device CRD is not served at all, device filtering is off.
//!
//! CPU/NUMA placement (`crate::scheduler`) runs for pods that ask for a cpuset or a NUMA policy, and
//! for any pod with a CPU request on a node that forces a bind policy or has a NUMA policy;
//! when the NodeResourceTopology CRD is not served it is off. Prioritize combines the two raw
//! 0–100 scores (device score, CPU/NUMA score) as their mean when the pod asks for both (the
//! CPU score only when the pod itself asks for CPU placement), then scales the best node to 10.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use super::Scheduler;
use super::memo::{CpuRead, table_limit};
use super::needs::pod_needs;
use super::ranking::Ranking;
use super::{PodNeeds, decide, explain, read};
use crate::cluster::returns::ResourceKinds;
use crate::cluster::snapshot::{Fingerprint, hash128};
use crate::model::ids::PodUid;
use crate::model::requests::pod_requests;
use crate::model::wire::{
    ExtenderArgsRef, ExtenderFilterResult, ExtenderPreemptionArgs, ExtenderPreemptionResult,
    HostPriority, MetaPod, MetaVictims, NodeList,
};
use crate::placement::device::allocate::FitError;
use crate::placement::device::fast::FastRequest;
use crate::placement::device::score::normalize_scores;
use crate::placement::fit_error::{FitReason, INVALID_REQUEST_CLASS, REASON_CLASSES};

/// Does the pod fit `name` (CPU/NUMA and devices), decided in full on the node's locked state
/// with `ignore`'s allocations released (preempt, and nodes the snapshot cannot answer).
fn full_fit(
    state: &Scheduler,
    name: &str,
    needs: &PodNeeds,
    ignore: &[PodUid],
) -> Result<(), FitError> {
    let entry = state.cluster.node(name);
    let guard = entry.as_ref().map(|e| e.read());
    decide::decide_on_node(guard.as_deref(), needs, ignore, &state.scoring).map(|_| ())
}

/// Filter: the subset of candidates that fit, and a categorical reason for every other one.
/// Names mode: the answer's names are the request's, moved (they borrow from the body).
pub fn filter<'a>(state: &Scheduler, mut args: ExtenderArgsRef<'a>) -> ExtenderFilterResult<'a> {
    let Some(pod) = args.pod.take() else {
        return ExtenderFilterResult::error("filter request has no Pod");
    };
    let mut failed = BTreeMap::new();
    let mut unresolvable = BTreeMap::new();
    // For the filter metrics: what this request found, and its rejections per reason class
    // (taken from the typed reasons, before they become text).
    let mut result = "pass_through";
    let mut tally = [0u64; REASON_CLASSES.len()];
    // Names mode: move the names into the answer instead of copying them.
    let nodes_mode = args.nodes_mode();
    let candidates: Vec<Cow<'a, str>> = args.take_candidates();
    let needs = pod_needs(&pod, state.needs_inputs());
    let mut passing: Vec<Cow<'a, str>> = match &needs {
        // No device or CPU needs: pass through untouched and cheaply (a routed pod's CPU
        // still joins the fragmentation strategy's workload mix).
        Ok(needs) if needs.is_none() => {
            super::fragment::observe(&pod, needs, &state.scoring, &state.metrics);
            candidates
        }
        Err(invalid) => {
            result = "invalid_request";
            // The text echoes the pod's own values; kube-scheduler formats its event with the
            // reason as the format string, where a `%` would garble it.
            let reason = invalid.to_string().replace('%', " percent");
            tally[INVALID_REQUEST_CLASS] += candidates.len() as u64;
            for name in candidates {
                unresolvable.insert(name, Cow::Owned(reason.clone()));
            }
            Vec::new()
        }
        Ok(needs) => {
            super::fragment::observe(&pod, needs, &state.scoring, &state.metrics);
            let fast = needs
                .devices
                .as_ref()
                .and_then(|req| FastRequest::new(req, &state.scoring.device));
            // Read before the snapshot: a capacity return published after it is replayed to
            // the requeue signal if this pod ends up rejected everywhere (`crate::scheduler::requeue`).
            let returns_seen = state.cluster.capacity_returns().generation();
            // One snapshot for the whole request: no node lock, no allocation per node; one
            // decision per distinct node state that no earlier request of this pod shape
            // decided (`memo`).
            let snapshot = state.cluster.read_snapshot();
            let mut finder = snapshot.finder();
            // What this request's aligned decisions share between nodes (`aligned_memo`); a
            // cell, since the memo may run a decision twice (debug builds check a hit).
            let aligned = RefCell::new(read::FitMemo::default());
            let mut passing = Vec::with_capacity(candidates.len());
            // Rejections are collected, then sorted into the maps at once: candidate lists
            // usually come sorted, which makes that one linear pass.
            let (mut rejected, mut hopeless) = (Vec::new(), Vec::new());
            let shape = (
                hash128(&needs),
                needs.devices.is_some(),
                CpuRead::facts_if(needs.cpu.is_some()),
            );
            let limit = table_limit(snapshot.len());
            state
                .memos
                .filter
                .with_memo(shape, limit, &state.metrics, "filter", |memo| {
                    for name in candidates {
                        let verdict = memo
                            .answer(finder.find(&name), |view| {
                                let aligned = &mut aligned.borrow_mut();
                                read::snapshot_fit(
                                    view,
                                    needs,
                                    fast.as_ref(),
                                    &state.scoring,
                                    aligned,
                                )
                            })
                            .unwrap_or_else(|| full_fit(state, &name, needs, &[]));
                        match verdict {
                            Ok(()) => passing.push(name),
                            Err(e) => {
                                tally[e.reason.class_index()] += 1;
                                if e.unresolvable {
                                    hopeless.push((name, e.reason));
                                } else {
                                    rejected.push((name, e.reason));
                                }
                            }
                        }
                    }
                });
            // What preemption nominated a pod to is held for it, as kube-scheduler's own
            // filters hold it (`nominated`); one atomic load while nobody is nominated.
            if !state.cluster.nominations().is_empty() {
                passing.retain(|name| {
                    match super::nominated::respect_nominated(state, name, &pod, needs) {
                        Ok(()) => true,
                        Err(e) => {
                            tally[e.reason.class_index()] += 1;
                            rejected.push((name.clone(), e.reason));
                            false
                        }
                    }
                });
            }
            // kube-scheduler shows the reasons only when no node passes: then, and only then,
            // each says what the pod asks and the node lacks (`explain`).
            // Nodes of one state get one explanation (a class of a thousand identical nodes
            // is read once): keyed by the snapshot's fingerprint, which covers every fact a
            // verdict reads, and so the cards, health and NUMA layout the words are made of.
            let mut explained: HashMap<Fingerprint, Cow<'static, str>> = HashMap::new();
            let mut words = |list: Vec<(Cow<'a, str>, FitReason)>| {
                let explaining = passing.is_empty();
                BTreeMap::from_iter(list.into_iter().map(|(name, reason)| {
                    if !explaining {
                        return (name, reason.text());
                    }
                    let explain_now = || {
                        let entry = state.cluster.node(&name);
                        let guard = entry.as_ref().map(|e| e.read());
                        explain::explain(guard.as_deref(), needs, &reason).text
                    };
                    let text = match snapshot.find(&name).map(|f| f.fingerprint()) {
                        Some(key) => explained.entry(key).or_insert_with(explain_now).clone(),
                        None => explain_now(),
                    };
                    (name, text)
                }))
            };
            failed = words(rejected);
            unresolvable = words(hopeless);
            result = if passing.is_empty() {
                "fits_nowhere"
            } else {
                "fits"
            };
            if let Some(uid) = pod
                .metadata
                .uid
                .as_deref()
                .filter(|_| state.requeue.is_enabled())
                .map(PodUid::new)
            {
                if passing.is_empty() && !(failed.is_empty() && unresolvable.is_empty()) {
                    state
                        .requeue
                        .rejected(&state.cluster, uid, waits_for(needs), returns_seen);
                } else if !passing.is_empty() {
                    state.requeue.admitted(&uid);
                }
            }
            passing
        }
    };
    // `--ranking=filter`: only the nodes prioritize would score best pass (`ranking`).
    if state.ranking == Ranking::Filter
        && passing.len() > 1
        && let Some(scores) = needs.as_ref().ok().and_then(|n| scores(state, &passing, n))
    {
        let removed = super::ranking::retain_best(&mut passing, &scores);
        if removed > 0 {
            state.metrics.filter_ranked_out.inc_by(removed as u64);
        }
    }
    record_filter(state, result, &tally);
    // The bind of this scheduling cycle decides on this copy (`bind::sent`); only a pod that
    // fits somewhere is bound.
    if !passing.is_empty() {
        state.binder.keep_sent(pod);
    }
    if nodes_mode {
        let nodes = args.nodes.unwrap_or_default();
        let passing: std::collections::HashSet<&str> = passing.iter().map(|n| &**n).collect();
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

/// The kinds of capacity a pod rejected for lack of room waits for: what it asks for.
fn waits_for(needs: &PodNeeds) -> ResourceKinds {
    let devices = needs.devices.as_ref().map_or(ResourceKinds::empty(), |d| {
        d.types.keys().fold(ResourceKinds::empty(), |k, t| {
            k.union(ResourceKinds::of_device(t))
        })
    });
    if needs.cpu.is_some() {
        devices.union(ResourceKinds::CPU)
    } else {
        devices
    }
}

/// Counts the filter's result and its rejections by reason class: one counter update per
/// class the request met (not one label lookup per rejected node).
fn record_filter(state: &Scheduler, result: &str, tally: &[u64; REASON_CLASSES.len()]) {
    state
        .metrics
        .filter_results
        .with_label_values(&[result])
        .inc();
    for (class, n) in REASON_CLASSES.iter().zip(tally) {
        if *n > 0 {
            state
                .metrics
                .filter_rejected_nodes
                .with_label_values(&[class])
                .inc_by(*n);
        }
    }
}

/// Prioritize: one integer score 0..=10 per candidate node, best node 10. The answer's hosts
/// are the request's names, moved (they borrow from the body).
pub fn prioritize<'a>(state: &Scheduler, mut args: ExtenderArgsRef<'a>) -> Vec<HostPriority<'a>> {
    let names = args.take_candidates();
    let scores = args
        .pod
        .as_ref()
        .and_then(|p| pod_needs(p, state.needs_inputs()).ok())
        .and_then(|needs| scores(state, &names, &needs));
    // No scores: no opinion, every host 0.
    let scores = scores.unwrap_or_else(|| vec![0; names.len()]);
    names
        .into_iter()
        .zip(scores)
        .map(|(host, score)| HostPriority { host, score })
        .collect()
}

/// Prioritize's scores for `names` (0..=10, the best 10, one per name in order), or `None`
/// when the pod leaves the extender no opinion: no device or CPU placement needs and no
/// fragmentation score (an invalid request never gets here: filter rejected it). Filter
/// ranks with the same scores (`--ranking=filter`), so both modes rank alike.
fn scores(state: &Scheduler, names: &[Cow<'_, str>], needs: &PodNeeds) -> Option<Vec<i64>> {
    let fragmentation = super::fragment::applies(needs, &state.scoring);
    if !(needs.devices.is_some() || needs.wants_cpu_placement() || fragmentation) {
        return None;
    }
    if fragmentation {
        // Fragmentation measures every candidate against one mix, outside the memo (its answer
        // depends on the mix and the free CPU, which fingerprints do not cover); a pod that
        // asks for CPU placement breaks its ties by the usual (memoized) score.
        let usual = needs
            .wants_cpu_placement()
            .then(|| usual_raw(state, names, needs));
        let raw = super::fragment::prioritize_raw(state, names, needs, usual.as_deref());
        return Some(super::fragment::normalize(&raw));
    }
    Some(normalize_scores(&usual_raw(state, names, needs)))
}

/// Prioritize's raw scores (0..=100) by the configured formulas: the snapshot, the memo, and
/// the full scorer where they cannot answer.
fn usual_raw(state: &Scheduler, names: &[Cow<'_, str>], needs: &PodNeeds) -> Vec<i64> {
    let fast = needs
        .devices
        .as_ref()
        .and_then(|req| FastRequest::new(req, &state.scoring.device));
    let cpu_req = needs.cpu.as_ref().filter(|_| needs.wants_cpu_placement());
    let snapshot = state.cluster.read_snapshot();
    let mut finder = snapshot.finder();
    let aligned = RefCell::new(read::ScoreMemo::default());
    let shape = (
        hash128(needs),
        needs.devices.is_some(),
        CpuRead::facts_if(cpu_req.is_some()),
    );
    let limit = table_limit(snapshot.len());
    let raw: Vec<i64> =
        state
            .memos
            .prioritize
            .with_memo(shape, limit, &state.metrics, "prioritize", |memo| {
                names
                    .iter()
                    .map(|name| {
                        memo.answer(finder.find(name), |view| {
                            let aligned = &mut aligned.borrow_mut();
                            read::snapshot_score(
                                view,
                                needs,
                                cpu_req,
                                fast.as_ref(),
                                &state.scoring,
                                aligned,
                            )
                        })
                        .unwrap_or_else(|| {
                            let entry = state.cluster.node(name);
                            let guard = entry.as_ref().map(|e| e.read());
                            decide::full_score(guard.as_deref(), needs, cpu_req, &state.scoring)
                        })
                    })
                    .collect()
            });
    raw
}

/// Preempt: keep the candidate nodes where removing the proposed victims lets the pod fit,
/// victims in the order given (kube-scheduler reads the first as the highest priority).
pub fn preempt(state: &Scheduler, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult {
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
    let needs = match args
        .pod
        .as_ref()
        .map(|p| pod_needs(p, state.needs_inputs()))
    {
        Some(Ok(needs)) if !needs.is_none() => needs,
        Some(Ok(_)) => {
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
    // Where kube-scheduler's victims do not make room (a share freed across cards, not on one),
    // the fewest others that do, which its own resource fit still passes (`victims`).
    let pod = args.pod.as_ref();
    let priority = pod.and_then(|p| p.spec.priority).unwrap_or(0);
    let requests = pod.and_then(|p| pod_requests(&p.spec).ok());
    candidates.retain(|node, victims| {
        let ignore: Vec<PodUid> = victims
            .pods
            .iter()
            .flatten()
            .map(|p| PodUid::new(&p.uid))
            .collect();
        let outcome = |o: &str| {
            state
                .metrics
                .preempt_candidates
                .with_label_values(&[o])
                .inc()
        };
        if full_fit(state, node, &needs, &ignore).is_ok() {
            outcome("kept");
            return true;
        }
        let others = requests.as_ref().and_then(|requests| {
            let entry = state.cluster.node(node)?;
            let guard = entry.read();
            super::victims::fewest_victims(
                &guard,
                &needs,
                &state.scoring,
                priority,
                requests,
                state.cluster.budgets(),
            )
        });
        match others {
            Some((set, violations)) => {
                tracing::debug!(%node, kube = ?ignore, extender = ?set, violations, "preempt: kube-scheduler's victims do not make room here; others do");
                victims.num_pdb_violations = violations as i64;
                victims.pods = Some(
                    set.into_iter()
                        .map(|uid| MetaPod {
                            uid: uid.as_str().to_string(),
                        })
                        .collect(),
                );
                outcome("replaced");
                true
            }
            None => {
                outcome("dropped");
                false
            }
        }
    });
    ExtenderPreemptionResult {
        node_name_to_meta_victims: Some(candidates),
    }
}
