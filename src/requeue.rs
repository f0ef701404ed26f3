//! Prompt requeue: when capacity returns on a node, make kube-scheduler retry the pods the
//! extender rejected, instead of leaving them in its unschedulable pool until an unrelated
//! cluster event or `podMaxInUnschedulablePodsDuration` (5 minutes by default).
//!
//! Why a Node annotation. kube-scheduler v1.37 puts the fake plugin name `Extender` in the
//! unschedulable plugins of a pod an extender filtered nodes out for (`schedule_one.go`,
//! kubernetes#122019), and registers that name for every cluster event with no queueing hint
//! (`framework/runtime/framework.go`, `defaultEnqueueExtension`): any event it watches moves
//! every such pod to the backoff or active queue. A Node's annotations changing is one
//! (`framework.NodeSchedulingPropertiesChange` → `UpdateNodeAnnotation`). So one merge patch
//! of one annotation ([`REQUEUE_ANNOTATION`]) on a node whose capacity returned retries every
//! waiting pod at once: the write count does not grow with the number of pending pods.
//! Patching each waiting pod instead would cost one write per pod, and a koordinator
//! `Device` or NRT update is not an event kube-scheduler watches at all.
//!
//! What is written, and when:
//! - the caches record which kinds of capacity grew on which node
//!   (`crate::cluster::returns`);
//! - filter records the pods it rejected on every candidate, with the kinds they ask for
//!   ([`Requeue::rejected`]), and forgets a pod that fits ([`Requeue::admitted`]);
//! - the signal task ([`run`]) waits for a return, lets returns gather for `interval`, and
//!   writes once if a remembered pod wants a kind that returned and this replica is the ready
//!   leader: at most one write per `interval`, whatever the churn.
//!
//! This module decides only whether to signal; it never decides placement.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::cluster::ClusterState;
use crate::cluster::returns::ResourceKinds;
use crate::metrics::Metrics;
use crate::model::ids::PodUid;
use crate::sync::Readiness;

/// The Node annotation the signal writes: when capacity last returned there, and of what.
pub const REQUEUE_ANNOTATION: &str = "device-numa-extender.io/capacity-returned";

/// How long a rejected pod is remembered without being filtered again. kube-scheduler retries
/// an unschedulable pod at least every `podMaxInUnschedulablePodsDuration` (5 minutes by
/// default), and every retry the extender rejects renews the entry; a pod bound or deleted
/// meanwhile is forgotten after this.
pub const WAITING_TTL: Duration = Duration::from_secs(15 * 60);

/// At most this many waiting pods are remembered; beyond it new ones are not (counted in the
/// gauge as the cap), so a flood of rejected pods cannot grow memory without bound.
pub const MAX_WAITING: usize = 100_000;

/// Writes the signal: the API call behind [`run`] (the Kubernetes client in `serve`; tests
/// record the calls).
pub trait NodeSignal: Send + Sync {
    /// Merge-patches `annotation: value` onto `node`.
    fn annotate<'a>(
        &'a self,
        node: &'a str,
        annotation: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<(), SignalError>>;
}

#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("node {0} is gone")]
    NodeGone(String),
    #[error("annotating node {node} failed: {message}")]
    Failed { node: String, message: String },
}

/// Patches Nodes through the Kubernetes API (`patch` on `nodes`, in `crate::api_calls`).
pub struct KubeNodeSignal {
    client: kube::Client,
    timeout: Duration,
}

impl KubeNodeSignal {
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        KubeNodeSignal { client, timeout }
    }
}

impl NodeSignal for KubeNodeSignal {
    fn annotate<'a>(
        &'a self,
        node: &'a str,
        annotation: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<(), SignalError>> {
        Box::pin(async move {
            use kube::api::{Api, Patch, PatchParams};
            let api: Api<crate::model::node::Node> = Api::all(self.client.clone());
            let patch = serde_json::json!({ "metadata": { "annotations": { annotation: value } } });
            let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
            let call = api.patch(node, &params, &patch);
            match tokio::time::timeout(self.timeout, call).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(kube::Error::Api(status))) if status.code == 404 => {
                    Err(SignalError::NodeGone(node.to_string()))
                }
                Ok(Err(e)) => Err(SignalError::Failed {
                    node: node.to_string(),
                    message: e.to_string(),
                }),
                Err(_) => Err(SignalError::Failed {
                    node: node.to_string(),
                    message: format!("no answer within {:?}", self.timeout),
                }),
            }
        })
    }
}

/// What an operator sees of the signal (`/readyz` body, logs).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RequeueStatus {
    pub enabled: bool,
    pub waiting_pods: usize,
    /// The last signal written: node, kinds, and how long ago (milliseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_signal: Option<LastSignal>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct LastSignal {
    pub node: String,
    pub kinds: String,
    pub ago_ms: u128,
}

/// The pods waiting for capacity and the signal's state.
#[derive(Debug, Default)]
pub struct Requeue {
    enabled: std::sync::atomic::AtomicBool,
    waiting: Mutex<HashMap<PodUid, (ResourceKinds, Instant)>>,
    last: Mutex<Option<(String, ResourceKinds, Instant)>>,
}

impl Requeue {
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Filter rejected `uid` on every candidate; it asks for `kinds`. `generation`: the
    /// capacity-return generation read before the snapshot filter decided on: a return
    /// recorded since may have been taken before this pod was remembered, so it is replayed.
    pub fn rejected(
        &self,
        cluster: &ClusterState,
        uid: PodUid,
        kinds: ResourceKinds,
        generation: u64,
    ) {
        if !self.is_enabled() || kinds.is_empty() {
            return;
        }
        {
            let mut waiting = self.waiting.lock();
            if waiting.len() < MAX_WAITING || waiting.contains_key(&uid) {
                waiting.insert(uid, (kinds, Instant::now()));
            }
        }
        let returns = cluster.capacity_returns();
        if returns.generation() != generation {
            returns.replay(kinds);
        }
    }

    /// `uid` fits somewhere (or was bound): it no longer waits.
    pub fn admitted(&self, uid: &PodUid) {
        if self.is_enabled() {
            self.waiting.lock().remove(uid);
        }
    }

    /// Remembered pods that want any of `kinds`, after dropping expired ones.
    fn wanting(&self, kinds: ResourceKinds, now: Instant) -> usize {
        let mut waiting = self.waiting.lock();
        waiting.retain(|_, (_, at)| now.duration_since(*at) < WAITING_TTL);
        waiting
            .values()
            .filter(|(wants, _)| wants.intersects(kinds))
            .count()
    }

    pub fn status(&self) -> RequeueStatus {
        RequeueStatus {
            enabled: self.is_enabled(),
            waiting_pods: self.waiting.lock().len(),
            last_signal: self
                .last
                .lock()
                .as_ref()
                .map(|(node, kinds, at)| LastSignal {
                    node: node.clone(),
                    kinds: kinds.to_string(),
                    ago_ms: at.elapsed().as_millis(),
                }),
        }
    }
}

/// The signal task's settings.
#[derive(Clone, Copy, Debug)]
pub struct RequeueConfig {
    /// Returns gather this long before one write; also the least time between two writes.
    pub interval: Duration,
}

/// Runs the signal until `stop`: see the module docs. Enables collection in the caches and
/// remembering in `requeue` first.
pub async fn run(
    requeue: Arc<Requeue>,
    cluster: Arc<ClusterState>,
    readiness: Arc<Readiness>,
    signal: Arc<dyn NodeSignal>,
    config: RequeueConfig,
    metrics: Metrics,
    stop: CancellationToken,
) {
    requeue
        .enabled
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let returns = cluster.capacity_returns();
    returns.enable();
    let mut sequence = 0u64;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = returns.changed() => {}
        }
        // Let a burst of returns (a Device with eight GPUs turning healthy, a node's pods
        // finishing together) become one write; also spaces writes by `interval`.
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(config.interval) => {}
        }
        let nodes = returns.take();
        if nodes.is_empty() {
            continue;
        }
        let mut kinds = ResourceKinds::empty();
        for node_kinds in nodes.values() {
            kinds = kinds.union(*node_kinds);
            for label in node_kinds.labels() {
                metrics.capacity_returns.with_label_values(&[label]).inc();
            }
        }
        let now = Instant::now();
        let wanting = requeue.wanting(kinds, now);
        metrics
            .requeue_waiting_pods
            .set(i64::try_from(requeue.waiting.lock().len()).unwrap_or(i64::MAX));
        let result = if wanting == 0 {
            "no_waiting_pods"
        } else if !readiness.is_ready() {
            // Only the ready leader writes; a standby's caches see the same returns, and the
            // leader signals for them (or its own filter rejections will, after a takeover).
            "not_leader"
        } else {
            sequence += 1;
            signal_one(&requeue, &*signal, &nodes, kinds, wanting, sequence).await
        };
        metrics.requeue_signals.with_label_values(&[result]).inc();
        if result == "failed" {
            // Try again after the next interval: the pods still wait.
            for (node, node_kinds) in &nodes {
                returns.record(node, *node_kinds);
            }
        }
    }
}

/// Writes one signal on a node where a wanted kind returned; the next one if that node is
/// gone. Returns the result label.
async fn signal_one(
    requeue: &Requeue,
    signal: &dyn NodeSignal,
    nodes: &std::collections::BTreeMap<Arc<str>, ResourceKinds>,
    kinds_wanted: ResourceKinds,
    wanting: usize,
    sequence: u64,
) -> &'static str {
    let waiting_kinds = requeue
        .waiting
        .lock()
        .values()
        .fold(ResourceKinds::empty(), |k, (w, _)| k.union(*w));
    let candidates = nodes
        .iter()
        .filter(|(_, k)| k.intersects(waiting_kinds))
        .take(3);
    let mut result = "node_gone";
    for (node, node_kinds) in candidates {
        // Unique per write, so the annotation always changes (an unchanged value is no event).
        let value = format!("{} {} #{sequence}", humantime_now(), node_kinds);
        match signal.annotate(node, REQUEUE_ANNOTATION, &value).await {
            Ok(()) => {
                tracing::info!(%node, kinds = %node_kinds, waiting_pods = wanting, returned = %kinds_wanted, "capacity returned: requeue signal written");
                *requeue.last.lock() = Some((node.to_string(), *node_kinds, Instant::now()));
                return "written";
            }
            Err(SignalError::NodeGone(_)) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "requeue signal failed; retrying after the interval");
                result = "failed";
                break;
            }
        }
    }
    result
}

/// Wall-clock time as RFC 3339 (UTC, milliseconds), for the annotation's reader.
fn humantime_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    k8s_openapi::jiff::Timestamp::from_millisecond(i64::try_from(now.as_millis()).unwrap_or(0))
        .map(|t| t.to_string())
        .unwrap_or_else(|_| now.as_millis().to_string())
}
