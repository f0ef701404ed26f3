//! `simulate`: the what-if. Each pending pod, in file order, goes through the service's real
//! filter → prioritize → bind (offline [`OfflinePodApi`], memory only), and lands where a
//! kube-scheduler with `percentageOfNodesToScore: 100` would put it: among the nodes that pass,
//! the highest extender score, ties to the first name.
//!
//! What kube-scheduler itself checks before calling the extender is modelled only as far as it
//! decides device placement: NodeResourcesFit over the pod's requests against the Node's
//! allocatable minus the requests of the pods already on it (pod count included), with the
//! resources the shipped scheduler configs mark `ignoredByScheduler` (`koordinator.sh/*`,
//! `huawei.com/npu-*`) left to the extender. Taints, affinity, ports and other plugins' scores
//! are not simulated.
//!
//! This module orchestrates the verbs and reports; it never decides a placement itself.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::OpsError;
use super::args::{SimulateArgs, SimulateFormat};
use super::inspect::load_cluster_file;
use super::render;
use crate::cluster::NodeState;
use crate::cluster::pod::{PodCpus, PodDevices};
use crate::cluster::report::{ClusterReport, Summary, cluster_report};
use crate::model::device::{GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO};
use crate::model::ids::PodUid;
use crate::model::pod::Pod;
use crate::model::requests::{Requests, pod_requests};
use crate::model::wire::{ExtenderArgsRef, ExtenderBindingArgs};
use crate::scheduler::bind::{OfflinePodApi, PodApi};
use crate::scheduler::share_totals::{SHARE_NAMES, ShareTotals};
use crate::scheduler::verbs;
use crate::scheduler::{Scheduler, ScoringConfig};
use crate::sync::Kind;
use crate::sync::file_source::{ClusterFile, documents, fill_identity};

/// One device of a placed pod's allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedDevice {
    pub minor: i32,
    /// Resource name -> amount in whole units (bytes for memory).
    pub resources: BTreeMap<String, i64>,
}

/// Where one pod went, or why it went nowhere.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// `namespace/name`.
    pub pod: String,
    /// The chosen node; `null` when the pod fits nowhere (or was skipped).
    pub node: Option<String>,
    /// The extender's score (0-10) of the chosen node.
    pub score: Option<i64>,
    /// Per device type, the devices allocated (empty for pods without device requests).
    pub devices: BTreeMap<String, Vec<AllocatedDevice>>,
    /// The cpuset bound (Linux list form), as written to `resource-status`; absent when the pod
    /// got none.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cpuset: Option<String>,
    /// NUMA nodes the pod's CPU and memory were bound to (`numaNodeResources`); empty when no
    /// NUMA policy applied.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub numa: Vec<u32>,
    /// Why nodes were rejected: reason -> number of nodes (empty when placed).
    pub reasons: BTreeMap<String, u64>,
    /// kube-scheduler-style one-liner for a pod that fits nowhere or was skipped.
    pub message: Option<String>,
}

/// The whole run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub before: Summary,
    pub placements: Vec<Placement>,
    pub after: Summary,
}

/// A run's results: the report, the full view after, and the resulting cluster's objects.
pub struct Simulation {
    pub report: Report,
    pub after: ClusterReport,
    /// The cluster file's objects with the placed pods added (bound and annotated) — what
    /// `--output-cluster` writes.
    pub cluster_objects: Vec<Value>,
}

/// Resources the shipped scheduler configs leave to the extender (`ignoredByScheduler`).
fn ignored_by_scheduler(resource: &str) -> bool {
    resource.starts_with("koordinator.sh/") || resource.starts_with("huawei.com/npu-")
}

/// kube-scheduler's NodeResourcesFit, as far as simulate models it (see the module docs): the
/// shipped configs' counted names, the GPU share names too when their totals are counted
/// (`--gpu-share-totals`). `ignore`'s pods count as gone (preemption victims, pods a plan
/// moves away).
pub(super) fn scheduler_fit(
    state: &Scheduler,
    node: &NodeState,
    requests: &Requests,
    ignore: &[PodUid],
) -> Result<(), String> {
    let shares_counted = state.share_totals.counted_by_scheduler();
    crate::scheduler::kube_fit::node_resources_fit(node, requests, ignore, |r| {
        !ignored_by_scheduler(r) || (shares_counted && SHARE_NAMES.contains(&r))
    })
}

/// What kube-scheduler's own filters leave for the extender, as far as `simulate` models them.
pub(super) struct KubeFit {
    /// Nodes kube-scheduler knows (a Node object).
    pub total: usize,
    /// Those its resource fit passes: the extender's candidates.
    pub candidates: Vec<Cow<'static, str>>,
    /// Those it refuses, with its reason, in name order.
    pub refused: Vec<(String, String)>,
}

/// kube-scheduler's resource fit ([`scheduler_fit`]) on every node with a Node object.
pub(super) fn kube_fit(state: &Scheduler, requests: &Requests) -> KubeFit {
    let mut out = KubeFit {
        total: 0,
        candidates: Vec::new(),
        refused: Vec::new(),
    };
    for node in state.cluster.node_names() {
        let Some(entry) = state.cluster.node(&node) else {
            continue;
        };
        let verdict = {
            let s = entry.read();
            if s.node.is_none() {
                continue;
            }
            scheduler_fit(state, &s, requests, &[])
        };
        out.total += 1;
        match verdict {
            Ok(()) => out.candidates.push(Cow::Owned(node.to_string())),
            Err(reason) => out.refused.push((node.to_string(), reason)),
        }
    }
    out
}

/// The extender's filter over `candidates` (names mode), as kube-scheduler would ask it.
pub(super) fn filter_names(
    state: &Scheduler,
    pod: &Pod,
    candidates: Vec<Cow<'static, str>>,
) -> crate::model::wire::ExtenderFilterResult<'static> {
    verbs::filter(
        state,
        ExtenderArgsRef {
            pod: Some(pod.clone()),
            nodes: None,
            node_names: Some(candidates),
        },
    )
}

/// kube-scheduler's message for a pod no node takes (v1.37 `FitError.Error`): `0/4 nodes are
/// available: 1 Insufficient nvidia.com/gpu, 3 insufficient gpu devices.`, each reason with its
/// node count, the `"N reason"` strings in byte order as Go's `sort.Strings` leaves them.
pub(super) fn fits_nowhere_message(total: usize, reasons: &BTreeMap<String, u64>) -> String {
    let mut parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    if parts.is_empty() {
        format!("0/{total} nodes are available.")
    } else {
        format!("0/{total} nodes are available: {}.", parts.join(", "))
    }
}

fn pod_key(pod: &Pod) -> (String, String) {
    (
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

fn is_pod(doc: &Value) -> bool {
    doc.get("kind").and_then(Value::as_str) == Some("Pod")
}

fn doc_key(doc: &Value) -> (String, String) {
    let s = |p: &str| doc.pointer(p).and_then(Value::as_str).map(str::to_owned);
    (
        s("/metadata/namespace").unwrap_or_else(|| "default".into()),
        s("/metadata/name").unwrap_or_default(),
    )
}

/// Runs the simulation on texts already read (`cluster_path`/`pods_path` name them in errors),
/// kube-scheduler modelled with the GPU share names ignored (the chart's default).
pub async fn simulate(
    cluster_text: &str,
    cluster_path: &str,
    pods_text: &str,
    pods_path: &str,
    scoring: ScoringConfig,
) -> Result<Simulation, OpsError> {
    simulate_as(
        cluster_text,
        cluster_path,
        pods_text,
        pods_path,
        scoring,
        ShareTotals::Ignored,
    )
    .await
}

/// [`simulate`] with kube-scheduler counting the GPU share names as `share_totals` says
/// (`--gpu-share-totals`).
pub async fn simulate_as(
    cluster_text: &str,
    cluster_path: &str,
    pods_text: &str,
    pods_path: &str,
    scoring: ScoringConfig,
    share_totals: ShareTotals,
) -> Result<Simulation, OpsError> {
    let file = ClusterFile::parse(cluster_text, cluster_path)?;
    let cluster_docs = documents(cluster_text, cluster_path)?;
    let pods_file = ClusterFile::parse(pods_text, pods_path)?;
    let pod_docs: Vec<Value> = documents(pods_text, pods_path)?
        .into_iter()
        .filter(is_pod)
        .collect();

    let mut pending: Vec<(Pod, Value)> = Vec::new();
    for (mut pod, doc) in pods_file.pods.into_iter().zip(pod_docs) {
        fill_identity(&mut pod.metadata, Kind::Pods);
        pending.push((pod, doc));
    }

    // The offline API holds every pod; a pods-file pod replaces a cluster pod of the same name.
    let api = Arc::new(OfflinePodApi::new(
        file.pods
            .iter()
            .cloned()
            .chain(pending.iter().map(|(p, _)| p.clone())),
    ));
    let mut state = load_cluster_file(file).into_scheduler(api.clone(), scoring);
    state.share_totals = share_totals;
    state
        .cluster
        .set_deviceless_untrusted(share_totals.deviceless_untrusted());
    let before = cluster_report(&state.cluster, &[]).summary;

    let mut placements = Vec::new();
    let mut placed: BTreeSet<(String, String)> = BTreeSet::new();
    for (pod, _) in &pending {
        let (ns, name) = pod_key(pod);
        placements.push(place(&state, pod, &ns, &name).await);
        if placements.last().is_some_and(|p| p.node.is_some()) {
            placed.insert((ns, name));
        }
    }

    let after = cluster_report(&state.cluster, &[]);
    let report = Report {
        before,
        placements,
        after: after.summary,
    };

    // The resulting cluster: the input's objects, each simulated pod as the offline API now
    // holds it (bound and annotated by the real bind) in place of or after them.
    let mut simulated: BTreeMap<(String, String), Value> = BTreeMap::new();
    for (pod, doc) in &pending {
        let (ns, name) = pod_key(pod);
        let mut doc = doc.clone();
        if placed.contains(&(ns.clone(), name.clone()))
            && let Ok(Some(now)) = api.get_pod(&ns, &name).await
        {
            apply_binding(&mut doc, &now);
        }
        if let Some(uid) = &pod.metadata.uid {
            doc["metadata"]["uid"] = Value::String(uid.clone());
        }
        simulated.insert((ns, name), doc);
    }
    let mut cluster_objects = Vec::new();
    for doc in cluster_docs {
        if is_pod(&doc)
            && let Some(replacement) = simulated.remove(&doc_key(&doc))
        {
            cluster_objects.push(replacement);
            continue;
        }
        cluster_objects.push(doc);
    }
    for (pod, _) in &pending {
        if let Some(doc) = simulated.remove(&pod_key(pod)) {
            cluster_objects.push(doc);
        }
    }
    Ok(Simulation {
        report,
        after,
        cluster_objects,
    })
}

/// Copies what the bind wrote (node and annotations) onto the pod's original object.
fn apply_binding(doc: &mut Value, pod: &Pod) {
    if !doc.get("spec").is_some_and(Value::is_object) {
        doc["spec"] = Value::Object(Default::default());
    }
    if let Some(node) = pod.node_name() {
        doc["spec"]["nodeName"] = Value::String(node.to_string());
    }
    if let Some(annotations) = &pod.metadata.annotations {
        if !doc["metadata"]
            .get("annotations")
            .is_some_and(Value::is_object)
        {
            doc["metadata"]["annotations"] = Value::Object(Default::default());
        }
        for (k, v) in annotations {
            doc["metadata"]["annotations"][k] = Value::String(v.clone());
        }
    }
}

/// One pod through filter, prioritize and bind.
async fn place(state: &Scheduler, pod: &Pod, ns: &str, name: &str) -> Placement {
    let key = format!("{ns}/{name}");
    let mut placement = Placement {
        pod: key.clone(),
        node: None,
        score: None,
        devices: BTreeMap::new(),
        cpuset: None,
        numa: Vec::new(),
        reasons: BTreeMap::new(),
        message: None,
    };
    if pod.node_name().is_some() || pod.is_terminal() {
        placement.message = Some("skipped: already assigned or finished".into());
        return placement;
    }
    let requests = match pod_requests(&pod.spec) {
        Ok(r) => r,
        Err(e) => {
            placement.message = Some(format!("skipped: invalid resources: {e}"));
            return placement;
        }
    };
    let KubeFit {
        total,
        candidates,
        refused,
    } = kube_fit(state, &requests);
    for (_, reason) in refused {
        *placement.reasons.entry(reason).or_default() += 1;
    }
    let filter = filter_names(state, pod, candidates);
    if !filter.error.is_empty() {
        placement.message = Some(format!("filter error: {}", filter.error));
        return placement;
    }
    for reason in filter
        .failed_nodes
        .iter()
        .flatten()
        .chain(filter.failed_and_unresolvable_nodes.iter().flatten())
        .map(|(_, r)| r)
    {
        *placement.reasons.entry(reason.to_string()).or_default() += 1;
    }
    let passing = filter.node_names.unwrap_or_default();
    if passing.is_empty() {
        placement.message = Some(fits_nowhere_message(total, &placement.reasons));
        return placement;
    }
    let scores = verbs::prioritize(
        state,
        ExtenderArgsRef {
            pod: Some(pod.clone()),
            nodes: None,
            node_names: Some(passing),
        },
    );
    // Highest score; equal scores go to the first name (the candidates are sorted).
    let mut best: Option<(&str, i64)> = None;
    for h in &scores {
        if best.is_none_or(|(n, s)| h.score > s || (h.score == s && &*h.host < n)) {
            best = Some((&*h.host, h.score));
        }
    }
    let Some((node, score)) = best.map(|(n, s)| (n.to_string(), s)) else {
        placement.message = Some("prioritize returned no nodes".into());
        return placement;
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let bind = state
        .binder
        .bind(&ExtenderBindingArgs {
            pod_name: name.to_string(),
            pod_namespace: ns.to_string(),
            pod_uid: uid.clone(),
            node: node.clone(),
        })
        .await;
    if let Err(e) = bind {
        placement.message = Some(format!("bind failed: {e}"));
        return placement;
    }
    placement.reasons.clear();
    placement.node = Some(node.clone());
    placement.score = Some(score);
    if let Some(entry) = state.cluster.node(&node) {
        let s = entry.read();
        if let Some(record) = s.pods.get(&PodUid::new(&uid))
            && let PodCpus::Allocated(c) = &record.cpus
        {
            placement.cpuset = (!c.cpuset.is_empty()).then(|| c.cpuset.to_string());
            placement.numa = c.numa.iter().map(|n| n.numa).collect();
        }
        if let Some(record) = s.pods.get(&PodUid::new(&uid))
            && let PodDevices::Allocated(a) = &record.devices
        {
            for (t, list) in &a.0 {
                let devices = list
                    .iter()
                    .map(|d| AllocatedDevice {
                        minor: d.minor,
                        resources: d
                            .resources
                            .iter()
                            .map(|(k, q)| (k.clone(), q.value()))
                            .collect(),
                    })
                    .collect();
                placement.devices.insert(t.to_string(), devices);
            }
        }
    }
    placement
}

/// `gpu 0,1` for whole devices; `gpu 2 (40Gi, core 0%)` for shares; then the cpuset and the
/// NUMA nodes bound, if any.
fn devices_text(p: &Placement) -> String {
    let mut parts = Vec::new();
    for (t, list) in &p.devices {
        let minors: Vec<String> = list.iter().map(|d| d.minor.to_string()).collect();
        let whole = list.iter().all(|d| {
            d.resources.get(GPU_MEMORY_RATIO).is_none_or(|r| *r >= 100)
                && !d
                    .resources
                    .keys()
                    .any(|k| k.ends_with("/rdma") || k.ends_with("/fpga"))
        });
        let mut s = format!("{t} {}", minors.join(","));
        if !whole && let Some(d) = list.first() {
            let mem = d.resources.get(GPU_MEMORY).map(|m| render::bytes(*m));
            let mut detail = Vec::new();
            if let Some(m) = mem {
                let each = if list.len() > 1 { " each" } else { "" };
                detail.push(format!("{m}{each}"));
            }
            if let Some(c) = d.resources.get(GPU_CORE) {
                detail.push(format!("core {c}%"));
            }
            for (k, v) in &d.resources {
                if k.ends_with("/rdma") || k.ends_with("/fpga") {
                    detail.push(format!("{v}%"));
                }
            }
            if !detail.is_empty() {
                s.push_str(&format!(" ({})", detail.join(", ")));
            }
        }
        parts.push(s);
    }
    if let Some(c) = &p.cpuset {
        parts.push(format!("cpuset {c}"));
    }
    if !p.numa.is_empty() {
        let ids: Vec<String> = p.numa.iter().map(u32::to_string).collect();
        parts.push(format!("NUMA {}", ids.join(",")));
    }
    if parts.is_empty() {
        "no devices".to_string()
    } else {
        parts.join("; ")
    }
}

/// The report as text: one line per pod, then the summaries before and after.
pub fn render_report(report: &Report) -> String {
    let mut out = String::new();
    let width = report
        .placements
        .iter()
        .map(|p| p.pod.len())
        .max()
        .unwrap_or(3)
        .max(3);
    for p in &report.placements {
        match &p.node {
            Some(node) => out.push_str(&format!(
                "{:width$}  -> {node}: {}\n",
                p.pod,
                devices_text(p)
            )),
            // One reason per line: readable on a narrow terminal (JSON has the one-liner).
            None if !p.reasons.is_empty() => {
                let total: u64 = p.reasons.values().sum();
                out.push_str(&format!(
                    "{:width$}  -> nowhere: 0/{total} nodes are available:\n",
                    p.pod
                ));
                let mut by_count: Vec<(&String, &u64)> = p.reasons.iter().collect();
                by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
                for (reason, n) in by_count {
                    out.push_str(&format!("{:width$}       {n} {reason}\n", ""));
                }
            }
            None => out.push_str(&format!(
                "{:width$}  -> nowhere: {}\n",
                p.pod,
                p.message.as_deref().unwrap_or("")
            )),
        }
    }
    out.push('\n');
    render::summary(&mut out, "BEFORE", &report.before);
    out.push('\n');
    render::summary(&mut out, "AFTER", &report.after);
    out
}

/// The objects as a multi-document YAML cluster file.
pub fn cluster_yaml(objects: &[Value]) -> Result<String, OpsError> {
    let mut out = String::from("# Written by device-numa-extender simulate --output-cluster.\n");
    for o in objects {
        let doc = serde_saphyr::to_string(o).map_err(|e| OpsError::Encode(e.to_string()))?;
        out.push_str("---\n");
        out.push_str(&doc);
        if !doc.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

/// The `simulate` command.
pub async fn run(args: SimulateArgs) -> Result<(), OpsError> {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).map_err(|source| OpsError::Read {
            path: p.display().to_string(),
            source,
        })
    };
    let cluster_text = read(&args.cluster_file)?;
    let pods_text = read(&args.pods)?;
    let scoring = args.scoring.config()?;
    let sim = simulate_as(
        &cluster_text,
        &args.cluster_file.display().to_string(),
        &pods_text,
        &args.pods.display().to_string(),
        scoring,
        args.gpu_share_totals,
    )
    .await?;
    if let Some(path) = &args.output_cluster {
        std::fs::write(path, cluster_yaml(&sim.cluster_objects)?).map_err(|source| {
            OpsError::Write {
                path: path.display().to_string(),
                source,
            }
        })?;
    }
    let text = match args.output {
        SimulateFormat::Table => render_report(&sim.report),
        SimulateFormat::Json => {
            let mut s = serde_json::to_string_pretty(&sim.report)
                .map_err(|e| OpsError::Encode(e.to_string()))?;
            s.push('\n');
            s
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes()).map_err(OpsError::Io)?;
    stdout.flush().map_err(OpsError::Io)
}
