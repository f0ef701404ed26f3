//! GPU share totals on Nodes, so that a pod asking for a share of a GPU can preempt through a
//! stock kube-scheduler (issue 38).
//!
//! kube-scheduler's preemption dry run runs only its own filters and keeps only nodes where
//! removing lower-priority pods changes their verdict. While the share dimensions
//! (`koordinator.sh/gpu-core`, `gpu-memory`, `gpu-memory-ratio`) are `ignoredByScheduler`, a
//! share pod "fits" every node in-tree, every victim is reprieved, and the extender's `preempt`
//! is never asked. When each node's `status.allocatable` carries the sums over its healthy GPUs
//! (what koord-manager's `gpudeviceresource` plugin writes from the `Device` object) and the
//! scheduler's extender stanza stops ignoring those names, NodeResourcesFit counts share pods by
//! node totals: a full node refuses the pod, the dry run proposes victims by totals, and the
//! extender's `preempt` decides per card which of those candidates work.
//!
//! Who writes the totals is the operator's choice ([`ShareTotals`], `--gpu-share-totals`):
//! nobody (the default: share pods cannot preempt, and readiness says so), koord-manager (the
//! extender checks every node and reports those that do not match), or the extender itself: the
//! leader patches `status.capacity` and `status.allocatable` of the three names on every node
//! whose totals differ. Both, because of what kubelet v1.37 does with extended resources it
//! does not manage (`nodestatus.MachineInfo`): it keeps them in `capacity`, sets `allocatable`
//! from `capacity`, and deletes from `allocatable` any not in `capacity`; and when the node was
//! recreated it zeroes them all (`reconcileExtendedResource`), which the next pass writes back.
//!
//! Rules:
//! - a node's wanted total of a name is the sum of that resource over the healthy GPUs of its
//!   `Device` object, as koord-manager computes it; a node without a `Device` object (or without
//!   GPUs) wants none;
//! - on a node without a `Device` object, the share names are never taken for a device
//!   plugin's while koord-manager or the extender writes them
//!   (`ClusterState::set_deviceless_untrusted`, [`ShareTotals::deviceless_untrusted`]): the
//!   totals there are stale (trust IV §6: a share pod was bound to such a node, with no GPU,
//!   right after its Device was deleted, with or without the take-back write failing);
//! - totals are taken back (written 0) only on a node where this process wrote them: a
//!   Device-less node's names are someone else's capacity otherwise (a device plugin's, which
//!   kubelet restores; trust IV §8: the extender fought kubelet every pass). After a restart
//!   stale totals the previous leader wrote stay on a Device-less node; kube-scheduler counts
//!   them, the extender's filter refuses the node (not advertised by a device plugin);
//! - a name some DeviceClass maps to DRA (KEP-5004) is never written: advertising it would take
//!   the node away from DRA for that name;
//! - totals are compared as quantities, never as text.
//!
//! What can interleave, and the test that covers it:
//! - a Device change (a card turns unhealthy, a card is added) or its deletion: the next tick
//!   plans from the cache and patches the node
//!   (`tests::totals_are_the_healthy_gpus_sums_and_only_differences_are_written`);
//! - a patch fails or its answer is lost: counted (`dne_share_totals_writes_total{result}`),
//!   and the node waits out a per-node backoff (`scheduler::backoff`: the tick, doubled per
//!   failure in a row, at most 30 s; `dne_share_totals_backoff_nodes`) before it is planned
//!   again from the cache, which the watch updates when a write did land
//!   (`tests::a_failed_write_is_retried_and_counted`, `tests::refused_writes_back_off_per_node`);
//! - kubelet (or anyone) overwrites the totals: the Node event updates the cache and the next
//!   tick writes them back (level-triggered; the same test as a failed write);
//! - two replicas: only the synced leader writes; every replica checks and reports.
//!
//! This module decides only what Nodes should advertise; it never decides placement.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::backoff::KeyedBackoff;
use crate::cluster::{ClusterState, NodeState};
use crate::metrics::Metrics;
use crate::model::device::{DeviceType, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO};
use crate::model::quantity::Quantity;
use crate::model::resource_names::ResourceNameSet;
use crate::sync::Readiness;

/// Who keeps the GPU share totals on Nodes (`--gpu-share-totals`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ShareTotals {
    /// Nobody: kube-scheduler ignores the share names, and share pods cannot preempt.
    #[default]
    Ignored,
    /// koord-manager writes them; the extender checks every node and reports mismatches.
    KoordManager,
    /// The extender's leader writes them (RBAC: `patch` on `nodes/status`).
    Extender,
}

impl ShareTotals {
    /// Whether kube-scheduler is configured to count the share names (the chart's stanza
    /// follows the same value).
    pub fn counted_by_scheduler(self) -> bool {
        self != ShareTotals::Ignored
    }

    /// The names whose Node totals come from `Device` objects in this mode, which the
    /// Device-less rule must never take for a device plugin's
    /// (`ClusterState::set_deviceless_untrusted`): the share names, unless nobody writes them.
    pub fn deviceless_untrusted(self) -> ResourceNameSet {
        match self {
            ShareTotals::Ignored => ResourceNameSet::default(),
            _ => ResourceNameSet::of(SHARE_NAMES),
        }
    }
}

/// The share names whose node totals kube-scheduler counts when they are advertised.
pub const SHARE_NAMES: [&str; 3] = [GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO];

/// Per name of [`SHARE_NAMES`], in milli-units.
pub type Totals = [i128; 3];

/// Names of [`SHARE_NAMES`] with the totals to write for them.
pub type Writes = Vec<(&'static str, Quantity)>;

/// One node whose advertised totals differ from its GPUs'.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub node: String,
    /// The names to write and their wanted totals (0 for a name to take back).
    pub write: Writes,
    /// The node has no `Device` object: the write takes back totals this process wrote.
    pub take_back: bool,
}

/// What a node should advertise: the sums over the healthy GPUs of its `Device` object
/// (zeros without one).
pub fn wanted(node: &NodeState) -> Totals {
    let mut totals = [0i128; 3];
    let Some(devices) = node.device_ledger().devices() else {
        return totals;
    };
    for slot in devices.slots(&DeviceType::Gpu).filter(|s| s.healthy) {
        for (i, name) in SHARE_NAMES.iter().enumerate() {
            if let Some(q) = slot.total.get(*name) {
                totals[i] = totals[i].saturating_add(q.milli());
            }
        }
    }
    totals
}

/// The writes that make `node`'s advertised totals its GPUs' ([`wanted`]): a positive total
/// must be advertised as it is; a zero one must not be advertised positive (absent is fine:
/// kube-scheduler refuses a request for a name a node does not advertise). Names in `dra`
/// (served through DRA) are left alone. A node without a `Device` object is written only when
/// `wrote_here` (this process wrote its totals: they are the extender's to take back; anyone
/// else's are left alone). `None` when nothing needs writing, or the Node object is not cached.
pub fn mismatch(
    name: &str,
    node: &NodeState,
    dra: ResourceNameSet,
    wrote_here: bool,
) -> Option<Mismatch> {
    let record = node.node.as_ref()?;
    let take_back = node.device_ledger().devices().is_none();
    if take_back && !wrote_here {
        return None;
    }
    let wanted = wanted(node);
    let write: Writes = SHARE_NAMES
        .iter()
        .zip(wanted)
        .filter(|(share, _)| dra.and(ResourceNameSet::of([**share])).is_empty())
        .filter(|(share, total)| {
            let current = record
                .allocatable
                .get(**share)
                .map(|q| Quantity::parse(q).map(|q| q.milli()));
            match current {
                // Unparseable: kube-scheduler could not read it either; write it.
                Some(Err(_)) => true,
                Some(Ok(have)) => have != *total && (*total > 0 || have > 0),
                None => *total > 0,
            }
        })
        .map(|(share, total)| (*share, Quantity::from_milli(total)))
        .collect();
    (!write.is_empty()).then(|| Mismatch {
        node: name.to_string(),
        write,
        take_back,
    })
}

/// Every cached node whose advertised totals differ from its GPUs', by node name; `wrote`:
/// the nodes whose totals this process wrote (see [`mismatch`]).
pub fn plan(cluster: &ClusterState, wrote: &HashSet<String>) -> Vec<Mismatch> {
    let mut names = cluster.node_names();
    names.sort_unstable();
    names
        .iter()
        .filter_map(|name| {
            let entry = cluster.node(name)?;
            let state = entry.read();
            mismatch(name, &state, state.dra_extended, wrote.contains(&**name))
        })
        .collect()
}

/// The writer's memory between passes: the nodes it wrote totals on (the only Device-less
/// nodes it may take them back from) and the nodes backing off after failed writes.
pub struct Writer {
    wrote: HashSet<String>,
    backoff: KeyedBackoff<String>,
}

impl Writer {
    /// `tick`: how often [`run`] checks (the first wait after a failure).
    pub fn new(tick: Duration) -> Self {
        Writer {
            wrote: HashSet::new(),
            backoff: KeyedBackoff::new(tick),
        }
    }
}

/// The write behind [`reconcile`] (the Kubernetes client in `serve`; tests record the calls).
pub trait NodeStatusApi: Send + Sync {
    /// Sets `names` to their quantities in the node's `status.capacity` and
    /// `status.allocatable`, leaving every other entry as it is.
    fn patch_totals<'a>(
        &'a self,
        node: &'a str,
        totals: &'a [(&'static str, Quantity)],
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// A JSON merge patch of the node's status subresource: only the named entries change.
pub struct KubeNodeStatusApi {
    client: kube::Client,
    timeout: Duration,
}

impl KubeNodeStatusApi {
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        KubeNodeStatusApi { client, timeout }
    }
}

/// The merge patch that sets `totals` in both `capacity` and `allocatable`.
pub fn status_patch(totals: &[(&'static str, Quantity)]) -> serde_json::Value {
    let list: serde_json::Map<String, serde_json::Value> = totals
        .iter()
        .map(|(name, q)| (name.to_string(), serde_json::Value::String(q.to_string())))
        .collect();
    serde_json::json!({"status": {"capacity": list, "allocatable": list}})
}

impl NodeStatusApi for KubeNodeStatusApi {
    fn patch_totals<'a>(
        &'a self,
        node: &'a str,
        totals: &'a [(&'static str, Quantity)],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let api: kube::Api<k8s_openapi::api::core::v1::Node> =
                kube::Api::all(self.client.clone());
            let patch = kube::api::Patch::Merge(status_patch(totals));
            let params = kube::api::PatchParams::default();
            let call = api.patch_status(node, &params, &patch);
            match tokio::time::timeout(self.timeout, call).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {:?}", self.timeout)),
            }
        })
    }
}

/// One pass at `now`: the mismatched nodes now, and (when `api` is given: the extender writes,
/// and this replica is the synced leader) a patch for each that is not backing off. Returns the
/// nodes still mismatched after it (those whose write failed or waits, or all of them without
/// `api`).
pub async fn reconcile(
    cluster: &ClusterState,
    api: Option<&dyn NodeStatusApi>,
    metrics: &Metrics,
    writer: &mut Writer,
    now: Instant,
) -> Vec<Mismatch> {
    let planned = plan(cluster, &writer.wrote);
    let Some(api) = api else {
        return planned;
    };
    writer
        .backoff
        .retain(|n| planned.iter().any(|m| &m.node == n));
    let mut left = Vec::new();
    for m in planned {
        if !writer.backoff.ready(&m.node, now) {
            left.push(m);
            continue;
        }
        let result = api.patch_totals(&m.node, &m.write).await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics
            .share_totals_writes
            .with_label_values(&[outcome])
            .inc();
        match result {
            Ok(()) => {
                let totals: Vec<String> = m.write.iter().map(|(n, q)| format!("{n}={q}")).collect();
                tracing::info!(node = %m.node, totals = %totals.join(","), "GPU share totals written to the Node's status");
                writer.backoff.succeeded(&m.node);
                if m.take_back {
                    writer.wrote.remove(&m.node);
                } else {
                    writer.wrote.insert(m.node.clone());
                }
            }
            Err(error) => {
                let wait = writer.backoff.failed(m.node.clone(), now);
                tracing::warn!(node = %m.node, %error, retry_in = ?wait, "writing the Node's GPU share totals failed; retried after a backoff");
                left.push(m);
            }
        }
    }
    metrics
        .share_totals_backoff_nodes
        .set(i64::try_from(writer.backoff.waiting(now)).unwrap_or(i64::MAX));
    left
}

/// What readiness reports (not failing it) for `mode` with `mismatched` nodes: why share pods
/// cannot preempt, or on how many nodes kube-scheduler refuses them or counts wrong totals.
pub fn warning(mode: ShareTotals, mismatched: &[Mismatch]) -> Option<String> {
    let names = SHARE_NAMES.join(", ");
    match mode {
        ShareTotals::Ignored => Some(format!(
            "pods asking for a GPU share cannot preempt: kube-scheduler ignores {names} \
             (--gpu-share-totals=ignored; README \"Preemption\")"
        )),
        _ if mismatched.is_empty() => None,
        _ => {
            let first: Vec<&str> = mismatched.iter().take(3).map(|m| m.node.as_str()).collect();
            let writer = match mode {
                ShareTotals::KoordManager => "koord-manager is expected to write them",
                _ => "the extender's writes have not landed yet",
            };
            Some(format!(
                "{} node(s) do not advertise their GPUs' {names} totals ({}{}): kube-scheduler \
                 refuses pods asking for a share there or preempts by wrong totals; {writer}",
                mismatched.len(),
                first.join(", "),
                if mismatched.len() > first.len() {
                    ", …"
                } else {
                    ""
                },
            ))
        }
    }
}

/// Checks (and with [`ShareTotals::Extender`], as the synced leader, writes) every `interval`;
/// publishes the mismatched nodes' count and readiness's warning.
pub async fn run(
    mode: ShareTotals,
    cluster: Arc<ClusterState>,
    readiness: Arc<Readiness>,
    api: Option<Arc<dyn NodeStatusApi>>,
    interval: Duration,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    readiness.set_warning("gpu-share-totals", warning(mode, &[]));
    if mode == ShareTotals::Ignored {
        return;
    }
    // What the last pass saw: the caches' version and whether it wrote. The same again is
    // skipped (a pass reads every node under its lock) unless writes failed: they are retried.
    let mut last: Option<(u64, bool)> = None;
    let mut left: Vec<Mismatch> = Vec::new();
    let mut state = Writer::new(interval);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        if !readiness.all_synced() {
            continue;
        }
        let writer = api
            .as_deref()
            .filter(|_| mode == ShareTotals::Extender && readiness.is_leader());
        let seen = (cluster.last_version(), writer.is_some());
        if last == Some(seen) && (left.is_empty() || writer.is_none()) {
            continue;
        }
        last = Some(seen);
        left = reconcile(&cluster, writer, &metrics, &mut state, Instant::now()).await;
        metrics
            .share_totals_mismatched_nodes
            .set(i64::try_from(left.len()).unwrap_or(i64::MAX));
        readiness.set_warning("gpu-share-totals", warning(mode, &left));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::records::NodeRecord;
    use crate::model::node::Node;
    use parking_lot::Mutex;
    use serde_json::{Value, json};

    /// A Node (allocatable `advertised`) and, when `cards` is given, a Device object of GPUs
    /// with 80 GiB each and health per entry.
    fn node_objects(name: &str, advertised: Value, cards: Option<&[bool]>) -> Vec<Value> {
        let mut allocatable = json!({"cpu": "64", "memory": "256Gi"});
        for (k, v) in advertised.as_object().unwrap() {
            allocatable[k] = v.clone();
        }
        let mut items = vec![json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name}, "status": {"allocatable": allocatable}})];
        if let Some(cards) = cards {
            let devices: Vec<Value> = cards
                .iter()
                .enumerate()
                .map(|(m, healthy)| {
                    json!({"type": "gpu", "id": format!("{name}-{m}"), "minor": m,
                    "health": healthy, "resources": {"koordinator.sh/gpu-core": "100",
                    "koordinator.sh/gpu-memory": "80Gi", "koordinator.sh/gpu-memory-ratio": "100"}})
                })
                .collect();
            items.push(
                json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
                "metadata": {"name": name}, "spec": {"devices": devices}}),
            );
        }
        items
    }

    fn cluster(items: Vec<Value>) -> Arc<ClusterState> {
        let text = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
        let file = crate::sync::file_source::ClusterFile::parse(&text, "c").unwrap();
        crate::ops::inspect::load_cluster_file(file).cluster
    }

    /// The watch's view after someone set `allocatable` on the node.
    fn set_allocatable(cluster: &ClusterState, name: &str, allocatable: Value) {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name},
            "status": {"allocatable": allocatable}}))
        .unwrap();
        cluster.set_node(name, Some(NodeRecord::from_node(&node)));
    }

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap()
    }

    #[test]
    fn totals_are_the_healthy_gpus_sums_and_only_differences_are_written() {
        let c = cluster(
            [
                // Three healthy cards of four, nothing advertised: all three names written.
                node_objects("fresh", json!({}), Some(&[true, true, false, true])),
                // Advertised already, in another spelling of the same quantities: nothing.
                node_objects(
                    "same",
                    json!({"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory": "171798691840",
                        "koordinator.sh/gpu-memory-ratio": "200000m"}),
                    Some(&[true, true]),
                ),
                // One card turned unhealthy since koord-manager wrote: the totals follow it.
                node_objects(
                    "sick",
                    json!({"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory": "160Gi",
                        "koordinator.sh/gpu-memory-ratio": "200"}),
                    Some(&[true, false]),
                ),
                // No Device object, stale totals this process wrote: taken back to 0.
                node_objects("gone", json!({"koordinator.sh/gpu-core": "800"}), None),
                // No Device object, totals this process never wrote (a device plugin's):
                // left alone (trust IV §8).
                node_objects("plugin", json!({"koordinator.sh/gpu-core": "800"}), None),
                // No Device object and nothing advertised (a CPU node): nothing to write.
                node_objects("cpu", json!({}), None),
                // Unparseable: written.
                node_objects(
                    "garbled",
                    json!({"koordinator.sh/gpu-core": "lots", "koordinator.sh/gpu-memory": "80Gi",
                        "koordinator.sh/gpu-memory-ratio": "100"}),
                    Some(&[true]),
                ),
            ]
            .concat(),
        );
        let plan = plan(&c, &HashSet::from(["gone".to_string()]));
        let by_node = |n: &str| plan.iter().find(|m| m.node == n).map(|m| m.write.clone());
        assert_eq!(
            by_node("fresh"),
            Some(vec![
                (GPU_CORE, q("300")),
                (GPU_MEMORY, q("240Gi")),
                (GPU_MEMORY_RATIO, q("300"))
            ])
        );
        assert_eq!(by_node("same"), None);
        assert_eq!(
            by_node("sick"),
            Some(vec![
                (GPU_CORE, q("100")),
                (GPU_MEMORY, q("80Gi")),
                (GPU_MEMORY_RATIO, q("100"))
            ])
        );
        assert_eq!(by_node("gone"), Some(vec![(GPU_CORE, q("0"))]));
        assert!(plan.iter().find(|m| m.node == "gone").unwrap().take_back);
        assert_eq!(by_node("plugin"), None);
        assert_eq!(by_node("cpu"), None);
        assert_eq!(by_node("garbled"), Some(vec![(GPU_CORE, q("100"))]));
        assert_eq!(plan.len(), 4);
    }

    #[test]
    fn a_name_served_through_dra_is_never_written() {
        let c = cluster(node_objects("n", json!({}), Some(&[true])));
        let entry = c.node("n").unwrap();
        let state = entry.read();
        let all = mismatch("n", &state, ResourceNameSet::default(), false).unwrap();
        assert_eq!(all.write.len(), 3);
        let dra = ResourceNameSet::of([GPU_MEMORY]);
        let some = mismatch("n", &state, dra, false).unwrap();
        assert_eq!(
            some.write.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            vec![GPU_CORE, GPU_MEMORY_RATIO]
        );
    }

    #[test]
    fn the_patch_sets_capacity_and_allocatable_and_nothing_else() {
        let patch = status_patch(&[(GPU_CORE, q("300")), (GPU_MEMORY, q("240Gi"))]);
        let list =
            json!({"koordinator.sh/gpu-core": "300", "koordinator.sh/gpu-memory": "257698037760"});
        assert_eq!(
            patch,
            json!({"status": {"capacity": list, "allocatable": list}})
        );
    }

    /// Records the patches; fails the first `fail` calls.
    #[derive(Default)]
    struct Recorded {
        calls: Mutex<Vec<(String, Writes)>>,
        fail: Mutex<usize>,
    }

    impl NodeStatusApi for Recorded {
        fn patch_totals<'a>(
            &'a self,
            node: &'a str,
            totals: &'a [(&'static str, Quantity)],
        ) -> BoxFuture<'a, Result<(), String>> {
            Box::pin(async move {
                self.calls.lock().push((node.to_string(), totals.to_vec()));
                let mut fail = self.fail.lock();
                if *fail > 0 {
                    *fail -= 1;
                    return Err("503 Service Unavailable".into());
                }
                Ok(())
            })
        }
    }

    /// A write that fails is counted, left mismatched, and made again on the next pass; once
    /// the watch brings the written totals back there is nothing to write; when someone
    /// overwrites them (kubelet after a re-registration), they are written again.
    #[tokio::test]
    async fn a_failed_write_is_retried_and_counted() {
        let c = cluster(node_objects("n", json!({}), Some(&[true, true])));
        let metrics = Metrics::new();
        let api = Recorded {
            fail: Mutex::new(1),
            ..Default::default()
        };
        let mut w = Writer::new(Duration::from_secs(1));
        let t0 = Instant::now();
        let later = |s: u64| t0 + Duration::from_secs(s);
        let left = reconcile(&c, Some(&api), &metrics, &mut w, t0).await;
        assert_eq!(left.len(), 1);
        assert_eq!(
            metrics
                .share_totals_writes
                .with_label_values(&["error"])
                .get(),
            1
        );
        assert_eq!(
            warning(ShareTotals::Extender, &left)
                .unwrap()
                .split(' ')
                .next(),
            Some("1")
        );
        // Backing off: not written again within the tick.
        let left = reconcile(&c, Some(&api), &metrics, &mut w, t0).await;
        assert_eq!((left.len(), api.calls.lock().len()), (1, 1));
        assert_eq!(metrics.share_totals_backoff_nodes.get(), 1);
        let left = reconcile(&c, Some(&api), &metrics, &mut w, later(1)).await;
        assert!(left.is_empty());
        assert_eq!(metrics.share_totals_backoff_nodes.get(), 0);
        assert_eq!(
            metrics.share_totals_writes.with_label_values(&["ok"]).get(),
            1
        );
        assert_eq!(api.calls.lock().len(), 2);
        // The watch: the written totals are in the Node now.
        let written = json!({"cpu": "64", "koordinator.sh/gpu-core": "200",
            "koordinator.sh/gpu-memory": "160Gi", "koordinator.sh/gpu-memory-ratio": "200"});
        set_allocatable(&c, "n", written);
        assert!(
            reconcile(&c, Some(&api), &metrics, &mut w, later(2))
                .await
                .is_empty()
        );
        assert_eq!(
            api.calls.lock().len(),
            2,
            "nothing written when nothing differs"
        );
        // Overwritten by someone else: written again.
        set_allocatable(
            &c,
            "n",
            json!({"cpu": "64", "koordinator.sh/gpu-core": "0"}),
        );
        reconcile(&c, Some(&api), &metrics, &mut w, later(3)).await;
        let calls = api.calls.lock();
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[2].1.len(), 3);
        assert!(warning(ShareTotals::Extender, &[]).is_none());
    }

    /// Without a writer (koord-manager's mode, or a standby), the check reports and writes
    /// nothing; the default mode always warns that share pods cannot preempt.
    #[tokio::test]
    async fn the_check_alone_reports_and_the_default_warns() {
        let c = cluster(
            [
                node_objects("a", json!({}), Some(&[true])),
                node_objects("b", json!({}), Some(&[true])),
            ]
            .concat(),
        );
        let mut w = Writer::new(Duration::from_secs(1));
        let left = reconcile(&c, None, &Metrics::new(), &mut w, Instant::now()).await;
        assert_eq!(left.len(), 2);
        let w = warning(ShareTotals::KoordManager, &left).unwrap();
        assert!(
            w.starts_with("2 node(s)") && w.contains("(a, b)") && w.contains("koord-manager"),
            "{w}"
        );
        let w = warning(ShareTotals::Ignored, &[]).unwrap();
        assert!(w.contains("cannot preempt"), "{w}");
        assert!(!ShareTotals::Ignored.counted_by_scheduler());
        assert!(ShareTotals::KoordManager.counted_by_scheduler());
    }

    /// Trust IV §7: 40 nodes, every write refused (403). One patch per node per backoff, not
    /// per tick: over two minutes of one-second ticks, 8 attempts per node (0, 1, 3, 7, 15,
    /// 31, 61, 91 s), against 120 before.
    #[tokio::test]
    async fn refused_writes_back_off_per_node() {
        let items: Vec<Value> = (0..40)
            .flat_map(|i| node_objects(&format!("n{i:02}"), json!({}), Some(&[true])))
            .collect();
        let c = cluster(items);
        let metrics = Metrics::new();
        let api = Recorded {
            fail: Mutex::new(usize::MAX),
            ..Default::default()
        };
        let mut w = Writer::new(Duration::from_secs(1));
        let t0 = Instant::now();
        for s in 0..120 {
            let left = reconcile(
                &c,
                Some(&api),
                &metrics,
                &mut w,
                t0 + Duration::from_secs(s),
            )
            .await;
            assert_eq!(left.len(), 40);
        }
        assert_eq!(api.calls.lock().len(), 40 * 8);
        assert_eq!(metrics.share_totals_backoff_nodes.get(), 40);
    }

    /// Trust IV §6 and §8 end to end on the caches: with the extender writing totals, a node
    /// whose Device object is deleted keeps its (stale) totals until the take-back lands, and
    /// a share pod is never served there meanwhile; the take-back is written because this
    /// process wrote the totals, and a Device-less node's device-plugin totals are never
    /// written.
    #[tokio::test]
    async fn a_deleted_device_s_stale_totals_serve_no_share_pod() {
        let c = cluster(
            [
                node_objects("n", json!({}), Some(&[true, true])),
                node_objects(
                    "plugin",
                    json!({"koordinator.sh/gpu-memory-ratio": "100"}),
                    None,
                ),
            ]
            .concat(),
        );
        c.set_deviceless_untrusted(ShareTotals::Extender.deviceless_untrusted());
        let metrics = Metrics::new();
        let api = Recorded::default();
        let mut w = Writer::new(Duration::from_secs(1));
        let t0 = Instant::now();
        reconcile(&c, Some(&api), &metrics, &mut w, t0).await;
        set_allocatable(
            &c,
            "n",
            json!({"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory": "160Gi",
                "koordinator.sh/gpu-memory-ratio": "200"}),
        );
        // The Device object goes; the Node still says 200.
        c.set_devices("n", None);
        let entry = c.node("n").unwrap();
        let advertised = entry.read().node.as_ref().unwrap().deviceless_advertised;
        assert!(
            crate::placement::device::deviceless::deviceless_fit(
                false,
                Some(advertised),
                ResourceNameSet::of([GPU_MEMORY_RATIO])
            )
            .is_err(),
            "the Device-less rule does not take the extender's stale totals for a device plugin's"
        );
        drop(entry);
        let left = reconcile(&c, Some(&api), &metrics, &mut w, t0).await;
        assert!(left.is_empty());
        let calls = api.calls.lock();
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(calls[1].0, "n");
        assert!(calls[1].1.iter().all(|(_, q)| q.milli() == 0), "{calls:?}");
        assert!(
            calls.iter().all(|(n, _)| n != "plugin"),
            "a device plugin's totals are never written: {calls:?}"
        );
    }
}
