//! `inspect --pod NS/NAME`: why one pod is pending, and what would make it fit.
//!
//! Asks the scheduling core exactly what the service would answer: kube-scheduler's own
//! resource fit as `simulate` models it, then the extender's filter, whose reasons explain
//! themselves when no node passes (`scheduler::explain`). Then two dry runs, neither of which
//! changes anything:
//! - **preemption**: on each node, kube-scheduler's victim selection (`SelectVictimsOnNode`:
//!   every pod of lower priority out, then reprieved highest priority first while *its own*
//!   resource fit still passes: v1.37 asks no extender in its dry run and does not re-check its
//!   filters after the extender's `preempt` answers), kept only where the extender's `preempt`
//!   verb keeps the victims; PodDisruptionBudgets as kube-scheduler reads them (the pods whose
//!   eviction would violate one are reprieved first, and counted); nodes ranked as
//!   kube-scheduler picks one (fewest violations, then lowest highest-victim priority, then
//!   lowest sum, then fewest victims);
//! - **moves**: the fewest pods on one node whose move elsewhere lets the pod fit there, each
//!   moved pod to a node of its own where it fits now (so no two moves compete for one node).
//!
//! Owns the dry runs and their rendering; decides nothing itself (every fit is the core's).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::simulate::{KubeFit, filter_names, fits_nowhere_message, kube_fit, scheduler_fit};
use crate::model::ids::PodUid;
use crate::model::pod::Pod;
use crate::model::requests::{PodRequests, pod_requests};
use crate::model::wire::{ExtenderPreemptionArgs, MetaPod, MetaVictims};
use crate::scheduler::explain::fit_or_explain;
use crate::scheduler::{PodNeeds, Scheduler, verbs};

/// What `inspect --pod` found for one pod.
#[derive(Clone, Debug, Serialize)]
pub struct PodInspection {
    /// `namespace/name`.
    pub pod: String,
    pub priority: i32,
    /// Nodes where the pod fits now (then nothing below is computed).
    pub fits_on: Vec<String>,
    /// kube-scheduler's message when it fits nowhere: the reasons counted across nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The same reasons, counted across nodes, most nodes first.
    pub reasons: Vec<CountedReason>,
    /// Every refusing node, nearest first: the extender's nodes by how much of the ask they
    /// cover, then kube-scheduler's own refusals.
    pub nearest: Vec<NearNode>,
    /// Nodes where preempting lower-priority pods makes room, best first.
    pub preemption: Vec<Preemption>,
    /// Why no preemption is offered although lower-priority pods hold what the pod needs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemption_note: Option<String>,
    /// The fewest moves that make room on one node, if any plan exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moves: Option<MovePlan>,
    /// Why the pod cannot be placed on any node at all (an invalid request).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<String>,
    /// The pod is not pending: `assigned to <node>`, or its phase when it has finished. Then
    /// nothing else is computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_pending: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CountedReason {
    pub nodes: u64,
    pub reason: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct NearNode {
    pub node: String,
    pub reason: String,
    /// Percent of the pod's binding ask the node covers, where the reason measures one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub covers_percent: Option<u16>,
    /// Who refused: `extender` or `kube-scheduler` (its resource fit).
    pub by: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct Preemption {
    pub node: String,
    pub victims: Vec<Victim>,
    /// The PodDisruptionBudgets evicting `victims` violates (the count `preempt` answers).
    pub pdb_violations: i64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Victim {
    pub pod: String,
    pub priority: i32,
}

#[derive(Clone, Debug, Serialize)]
pub struct MovePlan {
    /// The node the moves free.
    pub node: String,
    pub moves: Vec<Move>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Move {
    pub pod: String,
    pub to: String,
}

/// A node's pods as the dry runs read them.
struct Holder {
    uid: PodUid,
    key: String,
    priority: i32,
    requests: PodRequests,
    /// From the pod object (every pod's: kube-scheduler's budget count reads any victim).
    labels: BTreeMap<String, String>,
}

/// How many nodes (nearest first) the move plan tries.
const MOVE_PLAN_NODES: usize = 8;

/// Inspects `pod` on the caches behind `state`; `pods` are every pod object of the cluster
/// (priorities, and what a moved pod asks).
pub fn inspect_pod(state: &Scheduler, pod: &Pod, pods: &[Pod]) -> PodInspection {
    let key = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let priority = pod.spec.priority.unwrap_or(0);
    let mut out = PodInspection {
        pod: key,
        priority,
        fits_on: Vec::new(),
        message: None,
        reasons: Vec::new(),
        nearest: Vec::new(),
        preemption: Vec::new(),
        preemption_note: None,
        moves: None,
        invalid: None,
        not_pending: None,
    };
    if pod.is_terminal() {
        out.not_pending = Some(format!(
            "finished ({})",
            pod.status.phase.as_deref().unwrap_or("terminal")
        ));
        return out;
    }
    if let Some(node) = pod.node_name() {
        out.not_pending = Some(format!("assigned to {node}"));
        return out;
    }
    let (requests, needs) = match (pod_requests(&pod.spec), state.pod_needs(pod)) {
        (Ok(r), Ok(n)) => (r, n),
        (Err(e), _) => {
            out.invalid = Some(e.to_string());
            return out;
        }
        (_, Err(e)) => {
            out.invalid = Some(e.to_string());
            return out;
        }
    };
    let priorities: BTreeMap<&str, i32> = pods
        .iter()
        .filter_map(|p| Some((p.metadata.uid.as_deref()?, p.spec.priority.unwrap_or(0))))
        .collect();
    let objects: BTreeMap<&str, &Pod> = pods
        .iter()
        .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
        .collect();

    // kube-scheduler's fit, then the extender's filter over the nodes it leaves.
    let KubeFit {
        total,
        candidates,
        refused: kube_refusals,
    } = kube_fit(state, &requests);
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    let mut kube_refused = Vec::new();
    for (node, reason) in kube_refusals {
        *reasons.entry(reason.clone()).or_default() += 1;
        kube_refused.push(NearNode {
            node,
            reason,
            covers_percent: None,
            by: "kube-scheduler",
        });
    }
    let filter = filter_names(state, pod, candidates);
    if !filter.error.is_empty() {
        out.invalid = Some(filter.error);
        return out;
    }
    out.fits_on = filter
        .node_names
        .unwrap_or_default()
        .into_iter()
        .map(Cow::into_owned)
        .collect();
    if !out.fits_on.is_empty() {
        return out;
    }
    let mut resolvable = Vec::new();
    let mut refused = Vec::new();
    for (map, can_help) in [
        (filter.failed_nodes, true),
        (filter.failed_and_unresolvable_nodes, false),
    ] {
        for (node, reason) in map.into_iter().flatten() {
            *reasons.entry(reason.to_string()).or_default() += 1;
            let covers = fit_or_explain(state, &node, &needs, &[])
                .err()
                .and_then(|e| e.met_permille)
                .map(|m| m / 10);
            refused.push(NearNode {
                node: node.to_string(),
                reason: reason.into_owned(),
                covers_percent: covers,
                by: "extender",
            });
            if can_help {
                resolvable.push(node.into_owned());
            }
        }
    }
    out.message = Some(fits_nowhere_message(total, &reasons));
    out.reasons = reasons
        .into_iter()
        .map(|(reason, nodes)| CountedReason { nodes, reason })
        .collect();
    out.reasons
        .sort_by(|a, b| b.nodes.cmp(&a.nodes).then_with(|| a.reason.cmp(&b.reason)));
    refused.sort_by(|a, b| {
        b.covers_percent
            .map_or(-1, i32::from)
            .cmp(&a.covers_percent.map_or(-1, i32::from))
            .then_with(|| a.node.cmp(&b.node))
    });
    let near_order: Vec<String> = refused.iter().map(|n| n.node.clone()).collect();
    refused.extend(kube_refused.iter().cloned());
    out.nearest = refused;

    // Nodes freeing capacity can help: the extender's resolvable refusals and kube-scheduler's.
    let mut helpable: Vec<String> = near_order
        .iter()
        .filter(|n| resolvable.contains(n))
        .cloned()
        .collect();
    helpable.extend(kube_refused.into_iter().map(|n| n.node));

    let fits = |node: &str, ignore: &[PodUid]| -> bool {
        let Some(entry) = state.cluster.node(node) else {
            return false;
        };
        if scheduler_fit(state, &entry.read(), &requests, ignore).is_err() {
            return false;
        }
        fit_or_explain(state, node, &needs, ignore).is_ok()
    };
    let holders = |node: &str| -> Vec<Holder> {
        let Some(entry) = state.cluster.node(node) else {
            return Vec::new();
        };
        let s = entry.read();
        s.pods
            .values()
            .filter(|p| !matches!(p.phase.as_deref(), Some("Succeeded" | "Failed")))
            .map(|p| Holder {
                uid: p.uid.clone(),
                key: p.key.to_string(),
                priority: priorities.get(p.uid.as_str()).copied().unwrap_or(0),
                requests: p.requests.clone(),
                labels: objects
                    .get(p.uid.as_str())
                    .and_then(|o| o.metadata.labels.clone())
                    .unwrap_or_default(),
            })
            .collect()
    };

    // Preemption as kube-scheduler runs it: its dry run proposes victims by its own filters
    // alone (every lower-priority pod out, then reprieved highest priority first while its
    // resource fit still passes; extenders are not asked), and the extender's `preempt` verb
    // keeps the node only if those victims make room. A node where removing them would make
    // room by the extender's measure but kube-scheduler proposes none is counted: the pod's
    // device dimensions are ones kube-scheduler does not count (`ignoredByScheduler`).
    let kube_fits = |node: &str, ignore: &[PodUid]| -> bool {
        state
            .cluster
            .node(node)
            .is_some_and(|e| scheduler_fit(state, &e.read(), &requests, ignore).is_ok())
    };
    let mut unseen_by_kube = 0usize;
    for node in &helpable {
        let mut lower: Vec<Holder> = holders(node)
            .into_iter()
            .filter(|h| h.priority < priority)
            .collect();
        // kube-scheduler's order of importance (higher priority first), then which of them
        // would violate a budget, all evicted: those are reprieved first.
        lower.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.key.cmp(&b.key)));
        let violating: BTreeMap<PodUid, bool> = {
            let named: Vec<(&str, &str, &BTreeMap<String, String>)> = lower
                .iter()
                .map(|h| {
                    let (namespace, name) = h.key.split_once('/').unwrap_or(("", &h.key));
                    (namespace, name, &h.labels)
                })
                .collect();
            let flags = state.cluster.budgets().violating(&named);
            lower.iter().map(|h| h.uid.clone()).zip(flags).collect()
        };
        let violates = |h: &Holder| violating.get(&h.uid).copied().unwrap_or(false);
        let Some(victims) = fewest_to_free(
            &lower,
            |ignore| kube_fits(node, ignore),
            |h| (!violates(h), std::cmp::Reverse(h.priority)),
        ) else {
            let all: Vec<PodUid> = lower.iter().map(|h| h.uid.clone()).collect();
            if !all.is_empty() && fits(node, &all) {
                unseen_by_kube += 1;
            }
            continue;
        };
        let meta = MetaVictims {
            pods: Some(
                victims
                    .iter()
                    .map(|h| MetaPod {
                        uid: h.uid.as_str().to_string(),
                    })
                    .collect(),
            ),
            num_pdb_violations: victims.iter().filter(|h| violates(h)).count() as i64,
        };
        let answer = verbs::preempt(
            state,
            ExtenderPreemptionArgs {
                pod: Some(pod.clone()),
                node_name_to_victims: None,
                node_name_to_meta_victims: Some(BTreeMap::from([(node.clone(), meta)])),
            },
        );
        // The victims the verb answers: kube-scheduler's, or others where those do not make
        // room (`scheduler::victims`), which kube-scheduler then evicts as they are.
        if let Some(chosen) = answer
            .node_name_to_meta_victims
            .and_then(|mut m| m.remove(node))
        {
            // Listed lowest priority first.
            let mut victims: Vec<Victim> = chosen
                .pods
                .iter()
                .flatten()
                .filter_map(|p| lower.iter().find(|h| h.uid.as_str() == p.uid))
                .map(|h| Victim {
                    pod: h.key.clone(),
                    priority: h.priority,
                })
                .collect();
            victims.sort_by(|a, b| a.priority.cmp(&b.priority).then_with(|| a.pod.cmp(&b.pod)));
            out.preemption.push(Preemption {
                node: node.clone(),
                victims,
                pdb_violations: chosen.num_pdb_violations,
            });
        }
    }
    if out.preemption.is_empty() && unseen_by_kube > 0 {
        out.preemption_note = Some(format!(
            "on {unseen_by_kube} node(s) removing lower-priority pods would make room, but kube-scheduler proposes no victims there: the pod asks for device dimensions it does not count (ignoredByScheduler; --gpu-share-totals, README \"Preemption\")"
        ));
    }
    out.preemption.sort_by_key(|p| {
        let prios: Vec<i64> = p.victims.iter().map(|v| i64::from(v.priority)).collect();
        (
            p.pdb_violations,
            prios.iter().copied().max().unwrap_or(i64::MIN),
            prios.iter().sum::<i64>(),
            p.victims.len(),
            p.node.clone(),
        )
    });

    // Moves: any pod, to a node of its own where it fits now.
    for node in helpable.iter().take(MOVE_PLAN_NODES) {
        let all = holders(node);
        // Reprieve the lightest first: the heavy pods are the ones worth moving.
        let Some(moved) = fewest_to_free(&all, |ignore| fits(node, ignore), weight) else {
            continue;
        };
        if out
            .moves
            .as_ref()
            .is_some_and(|plan| plan.moves.len() <= moved.len())
        {
            continue;
        }
        let mut taken: BTreeSet<String> = BTreeSet::from([node.clone()]);
        let mut moves = Vec::new();
        for h in &moved {
            let Some(target) = objects
                .get(h.uid.as_str())
                .and_then(|obj| target_for(state, obj, &taken))
            else {
                break;
            };
            taken.insert(target.clone());
            moves.push(Move {
                pod: h.key.clone(),
                to: target,
            });
        }
        if moves.len() == moved.len() {
            out.moves = Some(MovePlan {
                node: node.clone(),
                moves,
            });
        }
    }
    out
}

/// The GPU and CPU a pod asks, for ordering reprieves (lightest first).
fn weight(h: &Holder) -> (i128, i128) {
    requests_weight(&h.requests)
}

/// GPU percent (100 per whole card of any vendor, the share dimensions as koordinator reads
/// them) and millicores, every name read through the managed-resource table (deprecated names
/// as their current ones).
fn requests_weight(requests: &PodRequests) -> (i128, i128) {
    use crate::model::resource_names::{
        AMD_GPU, GPU_CORE, GPU_MEMORY_RATIO, HYGON_DCU, KOORD_GPU, NVIDIA_GPU, managed,
    };
    let (mut whole, mut percent, mut core, mut ratio) = (0, 0, 0, 0);
    for (name, q) in requests.iter() {
        match managed(name).map_or(name, |(_, r)| r.canonical) {
            NVIDIA_GPU | AMD_GPU | HYGON_DCU => whole += q.milli(),
            KOORD_GPU => percent += q.milli(),
            GPU_CORE => core += q.milli(),
            GPU_MEMORY_RATIO => ratio += q.milli(),
            _ => {}
        }
    }
    let cpu = requests.get("cpu").map_or(0, |q| q.milli());
    (whole * 100 + percent + core.max(ratio), cpu)
}

/// kube-scheduler's victim selection on one node: every holder out; if the pod then fits,
/// holders are reprieved in `order` (smallest first) while it still fits. `None` when removing
/// every holder is not enough, or there is none.
fn fewest_to_free<K: Ord>(
    holders: &[Holder],
    fits: impl Fn(&[PodUid]) -> bool,
    order: impl Fn(&Holder) -> K,
) -> Option<Vec<&Holder>> {
    if holders.is_empty() {
        return None;
    }
    let mut out: Vec<&Holder> = holders.iter().collect();
    let uids = |v: &[&Holder]| v.iter().map(|h| h.uid.clone()).collect::<Vec<_>>();
    if !fits(&uids(&out)) {
        return None;
    }
    let mut tries: Vec<&Holder> = holders.iter().collect();
    tries.sort_by(|a, b| order(a).cmp(&order(b)).then_with(|| a.key.cmp(&b.key)));
    for h in tries {
        let without: Vec<&Holder> = out.iter().copied().filter(|x| x.uid != h.uid).collect();
        if fits(&uids(&without)) {
            out = without;
        }
    }
    (!out.is_empty()).then_some(out)
}

/// A node, outside `taken`, where `pod` fits now (kube-scheduler's fit and the extender's), the
/// first by name.
fn target_for(state: &Scheduler, pod: &Pod, taken: &BTreeSet<String>) -> Option<String> {
    let requests = pod_requests(&pod.spec).ok()?;
    let needs: PodNeeds = state.pod_needs(pod).ok()?;
    state
        .cluster
        .node_names()
        .into_iter()
        .filter(|n| !taken.contains(&**n))
        .find(|n| {
            state.cluster.node(n).is_some_and(|e| {
                let s = e.read();
                s.node.is_some() && scheduler_fit(state, &s, &requests, &[]).is_ok()
            }) && fit_or_explain(state, n, &needs, &[]).is_ok()
        })
        .map(|n| n.to_string())
}

/// The table form (80 columns for the usual reasons).
pub fn render(i: &PodInspection) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = write!(s, "pod {} (priority {})", i.pod, i.priority);
    if let Some(state) = &i.not_pending {
        let _ = writeln!(s, " is not pending: {state}");
        return s;
    }
    if let Some(invalid) = &i.invalid {
        let _ = writeln!(s, " cannot be placed anywhere: {invalid}");
        return s;
    }
    if !i.fits_on.is_empty() {
        let _ = writeln!(
            s,
            " fits now on {} node(s): {}",
            i.fits_on.len(),
            i.fits_on.join(", ")
        );
        return s;
    }
    let _ = writeln!(s, " fits nowhere:");
    // kube-scheduler's message, one counted reason per line.
    let total: u64 = i.reasons.iter().map(|r| r.nodes).sum();
    let _ = writeln!(s, "  0/{total} nodes are available:");
    for r in &i.reasons {
        let _ = writeln!(s, "    {} {}", r.nodes, r.reason);
    }
    let _ = writeln!(s, "\nNEAREST NODES (share of the ask free there)");
    for n in i.nearest.iter().take(5) {
        match n.covers_percent {
            Some(c) => {
                let _ = writeln!(s, "  {} ({c}%): {}", n.node, n.reason);
            }
            None => {
                let _ = writeln!(s, "  {}: {}", n.node, n.reason);
            }
        }
    }
    if i.nearest.len() > 5 {
        let _ = writeln!(s, "  ... {} more", i.nearest.len() - 5);
    }
    let _ = writeln!(s, "\nWOULD FIT IF");
    match i.preemption.first() {
        Some(p) => {
            let _ = match p.pdb_violations {
                0 => writeln!(s, "  preempted on {}:", p.node),
                n => writeln!(
                    s,
                    "  preempted on {} (violating {n} PodDisruptionBudget(s)):",
                    p.node
                ),
            };
            for v in &p.victims {
                let _ = writeln!(s, "    {} (priority {})", v.pod, v.priority);
            }
            if i.preemption.len() > 1 {
                let _ = writeln!(
                    s,
                    "    ({} other node(s) could preempt too)",
                    i.preemption.len() - 1
                );
            }
        }
        None => match &i.preemption_note {
            Some(note) => {
                let _ = writeln!(s, "  preempting: none; {note}");
            }
            None => {
                let _ = writeln!(
                    s,
                    "  preempting: no node frees enough from pods of priority below {}",
                    i.priority
                );
            }
        },
    }
    match &i.moves {
        Some(plan) => {
            let _ = writeln!(
                s,
                "  moved off {} (dry run, nothing is evicted):",
                plan.node
            );
            for m in &plan.moves {
                let _ = writeln!(s, "    {} -> {}", m.pod, m.to);
            }
        }
        None => {
            let _ = writeln!(s, "  moving: no node is freed by moving its pods elsewhere");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests(r: serde_json::Value) -> PodRequests {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "c", "resources": {"requests": r}}]}}))
        .expect("pod");
        crate::model::requests::pod_requests_compact(&pod.spec).expect("requests")
    }

    /// Whole cards weigh alike whatever the vendor, and a deprecated name as its current one.
    #[test]
    fn every_gpu_name_weighs_by_the_managed_table() {
        let one = requests_weight(&requests(serde_json::json!({"nvidia.com/gpu": "1"})));
        assert_eq!(one.0, 100_000);
        for name in ["amd.com/gpu", "dcu.com/gpu"] {
            let w = requests_weight(&requests(serde_json::json!({name: "1"})));
            assert_eq!(w, one, "{name}");
        }
        let half = requests_weight(&requests(serde_json::json!({
            "kubernetes.io/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "40", "cpu": "2"})));
        assert_eq!(half, (50_000, 2_000));
        assert_eq!(
            requests_weight(&requests(serde_json::json!({"kubernetes.io/gpu": "30"}))).0,
            30_000
        );
    }
}
