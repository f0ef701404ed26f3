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
//! What can interleave, and the test that covers it (unit tests below; `tests/it/requeue.rs`
//! through the real sync path; `tests/e2e/requeue_test.go` against kube-scheduler itself):
//! - a return with nobody waiting: counted `no_waiting_pods`, nothing written
//!   (`only_the_leader_writes_and_only_for_a_wanted_kind`, `no_signal_without_a_waiting_pod…`);
//! - a rejection, then a return of its kind: one write for all waiting pods
//!   (`a_gpu_turning_healthy_writes_one_signal_for_every_waiting_pod`, the e2e scenario); a return
//!   of another kind: nothing;
//! - filter decides on a snapshot loaded before a return, and remembers the pod only after the
//!   task took that return: the return is replayed (`a_rejection_decided_before_a_taken_return…`);
//! - the write fails (5xx, 403, no answer): counted `failed`, the returns recorded again and
//!   retried after `interval`, doubled for every failure in a row up to 30 s
//!   (`a_failed_write_is_retried_and_a_gone_node_skipped`, `failed_writes_back_off`); a write that
//!   landed although its answer was lost is retried anyway: a second annotation, one more retry
//!   of the waiting pods, nothing worse;
//! - the node is deleted before the write: the next node that returned (same test);
//! - this replica is a standby, or loses leadership: `not_leader`, nothing written (same test as
//!   the first); after it becomes the ready leader (start, takeover), pods rejected before are
//!   unknown to it, so for `unknown_after_takeover` every return is signalled
//!   (`after_a_takeover_returns_are_signalled_without_a_remembered_pod`);
//! - the signal lands while kube-scheduler has the pod in flight: kube-scheduler records events
//!   that arrive during a scheduling cycle and requeues the pod when the cycle fails (its own
//!   in-flight tracking); the e2e scenario lands signals while pods are being retried.
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

    /// One pass over the remembered pods, expired ones dropped: how many want any of `kinds`,
    /// how many are remembered, and every kind any of them waits for.
    fn census(&self, kinds: ResourceKinds, now: Instant) -> Census {
        let mut waiting = self.waiting.lock();
        waiting.retain(|_, (_, at)| now.duration_since(*at) < WAITING_TTL);
        let mut census = Census {
            remembered: waiting.len(),
            ..Census::default()
        };
        for (wants, _) in waiting.values() {
            census.wanting += usize::from(wants.intersects(kinds));
            census.kinds = census.kinds.union(*wants);
        }
        census
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

#[derive(Debug, Default)]
struct Census {
    wanting: usize,
    remembered: usize,
    kinds: ResourceKinds,
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The signal task's settings.
#[derive(Clone, Copy, Debug)]
pub struct RequeueConfig {
    /// Returns gather this long before one write; also the least time between two writes.
    pub interval: Duration,
    /// After this replica becomes the ready leader (at start, or a takeover), for this long a
    /// return is signalled even with no remembered waiting pod: pods the previous leader (or
    /// this process before a restart) rejected wait in kube-scheduler's queue unknown to us,
    /// until kube-scheduler's own retry (`podMaxInUnschedulablePodsDuration`, 5 minutes by
    /// default) sends them through filter again.
    pub unknown_after_takeover: Duration,
}

/// Runs the signal until `stop`: see the module docs. `may_write`: this replica is the ready
/// leader (`Readiness::is_ready` in `serve`). Enables collection in the caches and remembering
/// in `requeue` first.
pub async fn run(
    requeue: Arc<Requeue>,
    cluster: Arc<ClusterState>,
    may_write: Arc<dyn Fn() -> bool + Send + Sync>,
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
    // Failed writes in a row: each doubles the wait before the next attempt (see
    // [`retry_wait`]), so an API server refusing the patch (RBAC missing, an outage) is not
    // asked once per interval forever.
    let mut failures = 0u32;
    // When this replica last became the ready leader (sampled every interval).
    let mut leading_since: Option<Instant> = None;
    let sample = |leading_since: &mut Option<Instant>| {
        let now_ready = may_write();
        match (now_ready, *leading_since) {
            (true, None) => *leading_since = Some(Instant::now()),
            (false, Some(_)) => *leading_since = None,
            _ => {}
        }
        now_ready
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = returns.changed() => {}
            _ = tokio::time::sleep(config.interval) => {
                sample(&mut leading_since);
                metrics.requeue_waiting_pods.set(gauge(requeue.waiting.lock().len()));
                continue;
            }
        }
        // Let a burst of returns (a Device with eight GPUs turning healthy, a node's pods
        // finishing together) become one write; also spaces writes by `interval`, and by the
        // backoff after failed writes.
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(retry_wait(config.interval, failures)) => {}
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
        let census = requeue.census(kinds, now);
        metrics.requeue_waiting_pods.set(gauge(census.remembered));
        let leading = sample(&mut leading_since);
        let unknown = leading_since
            .is_some_and(|since| now.duration_since(since) < config.unknown_after_takeover);
        let result = if !leading {
            // Only the ready leader writes; a standby's caches see the same returns, and the
            // leader signals for them.
            "not_leader"
        } else if census.wanting == 0 && !unknown {
            "no_waiting_pods"
        } else {
            sequence += 1;
            let waiting_kinds = if unknown { kinds } else { census.kinds };
            signal_one(
                &requeue,
                &*signal,
                &nodes,
                waiting_kinds,
                census.wanting,
                sequence,
            )
            .await
        };
        metrics.requeue_signals.with_label_values(&[result]).inc();
        if result == "failed" {
            // Try again after the backoff: the pods still wait.
            failures = failures.saturating_add(1);
            for (node, node_kinds) in &nodes {
                returns.record(node, *node_kinds);
            }
        } else {
            failures = 0;
        }
    }
}

/// The longest wait between two attempts after failed writes. kube-scheduler retries the
/// waiting pods itself within 5 minutes, so a longer backoff would only add to the wait once the
/// API server answers again.
pub const MAX_RETRY_WAIT: Duration = Duration::from_secs(30);

/// How long returns gather before the next attempt: `interval`, doubled for every failed write
/// in a row, at most [`MAX_RETRY_WAIT`] (never less than `interval`).
fn retry_wait(interval: Duration, failures: u32) -> Duration {
    let doubled = interval.saturating_mul(1u32 << failures.min(16));
    doubled.min(MAX_RETRY_WAIT.max(interval))
}

/// Writes one signal on a node where a wanted kind returned; the next one if that node is
/// gone. Returns the result label.
async fn signal_one(
    requeue: &Requeue,
    signal: &dyn NodeSignal,
    nodes: &std::collections::BTreeMap<Arc<str>, ResourceKinds>,
    waiting_kinds: ResourceKinds,
    wanting: usize,
    sequence: u64,
) -> &'static str {
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
                tracing::info!(%node, kinds = %node_kinds, waiting_pods = wanting, "capacity returned: requeue signal written");
                *requeue.last.lock() = Some((node.to_string(), *node_kinds, Instant::now()));
                return "written";
            }
            Err(SignalError::NodeGone(_)) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "requeue signal failed; retrying after a backoff");
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

#[cfg(test)]
mod tests {
    //! The signal task's decisions against a recording `NodeSignal`: the interleavings of
    //! returns, rejections, leadership and API answers listed in the module docs.
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Answers each call with the next scripted result (then `Ok`), recording the node.
    #[derive(Default)]
    struct Script {
        answers: Mutex<VecDeque<Result<(), SignalError>>>,
        calls: Mutex<Vec<String>>,
        /// When each call came, on tokio's clock (virtual under `start_paused`).
        at: Mutex<Vec<tokio::time::Instant>>,
        called: tokio::sync::Notify,
    }

    impl NodeSignal for Script {
        fn annotate<'a>(
            &'a self,
            node: &'a str,
            annotation: &'a str,
            value: &'a str,
        ) -> BoxFuture<'a, Result<(), SignalError>> {
            assert_eq!(annotation, REQUEUE_ANNOTATION);
            assert!(!value.is_empty());
            self.calls.lock().push(node.to_string());
            self.at.lock().push(tokio::time::Instant::now());
            let answer = self.answers.lock().pop_front().unwrap_or(Ok(()));
            self.called.notify_one();
            Box::pin(async move { answer })
        }
    }

    struct Harness {
        requeue: Arc<Requeue>,
        cluster: Arc<ClusterState>,
        leader: Arc<AtomicBool>,
        script: Arc<Script>,
        metrics: Metrics,
        stop: CancellationToken,
    }

    impl Harness {
        async fn start(unknown_after_takeover: Duration) -> Harness {
            Self::start_with(unknown_after_takeover, Duration::from_millis(5)).await
        }

        async fn start_with(unknown_after_takeover: Duration, interval: Duration) -> Harness {
            let h = Harness {
                requeue: Arc::default(),
                cluster: Arc::new(ClusterState::new()),
                leader: Arc::new(AtomicBool::new(true)),
                script: Arc::default(),
                metrics: Metrics::new(),
                stop: CancellationToken::new(),
            };
            let leader = h.leader.clone();
            tokio::spawn(run(
                h.requeue.clone(),
                h.cluster.clone(),
                Arc::new(move || leader.load(Ordering::SeqCst)),
                h.script.clone(),
                RequeueConfig {
                    interval,
                    unknown_after_takeover,
                },
                h.metrics.clone(),
                h.stop.clone(),
            ));
            // The task enables collection first thing.
            while !h.cluster.capacity_returns().is_enabled() {
                tokio::task::yield_now().await;
            }
            h
        }

        fn count(&self, result: &str) -> u64 {
            self.metrics
                .requeue_signals
                .with_label_values(&[result])
                .get()
        }

        /// Waits until `result` has been counted `n` times (hang guard: the test's timeout).
        async fn until(&self, result: &str, n: u64) {
            while self.count(result) < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }

        fn reject(&self, uid: &str, kinds: ResourceKinds) {
            let generation = self.cluster.capacity_returns().generation();
            self.requeue
                .rejected(&self.cluster, PodUid::new(uid), kinds, generation);
        }
    }

    const HANG_GUARD: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_failed_write_is_retried_and_a_gone_node_skipped() {
        tokio::time::timeout(HANG_GUARD, async {
            let h = Harness::start(Duration::ZERO).await;
            h.reject("p", ResourceKinds::GPU);
            h.script.answers.lock().extend([
                Err(SignalError::Failed {
                    node: "a".into(),
                    message: "503".into(),
                }),
                Err(SignalError::NodeGone("a".into())),
            ]);
            h.cluster.capacity_returns().record("a", ResourceKinds::GPU);
            h.cluster.capacity_returns().record("b", ResourceKinds::GPU);
            h.until("written", 1).await;
            assert_eq!(h.count("failed"), 1);
            // a (503), then a again (gone) and b: retried after the failure, the next node after
            // the gone one.
            assert_eq!(*h.script.calls.lock(), ["a", "a", "b"]);
            assert_eq!(h.requeue.status().last_signal.unwrap().node, "b");
            h.stop.cancel();
        })
        .await
        .expect("hang guard");
    }

    /// Failed writes in a row back off: each wait before the next attempt doubles, up to
    /// `MAX_RETRY_WAIT`, and a success starts again from the interval. On tokio's paused clock,
    /// so the waits are exact and nothing depends on the machine's speed.
    #[tokio::test(start_paused = true)]
    async fn failed_writes_back_off() {
        tokio::time::timeout(Duration::from_secs(3600), async {
            let interval = Duration::from_secs(1);
            let h = Harness::start_with(Duration::ZERO, interval).await;
            h.reject("p", ResourceKinds::GPU);
            let failed = || {
                Err(SignalError::Failed {
                    node: "a".into(),
                    message: "403".into(),
                })
            };
            h.script.answers.lock().extend((0..7).map(|_| failed()));
            h.cluster.capacity_returns().record("a", ResourceKinds::GPU);
            h.until("written", 1).await;
            assert_eq!(h.count("failed"), 7);
            let at = h.script.at.lock().clone();
            let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
            // After 1, 2, ... 7 failures: 2, 4, 8, 16, then capped at 30 s.
            let want: Vec<Duration> = [2, 4, 8, 16, 30, 30, 30]
                .into_iter()
                .map(Duration::from_secs)
                .collect();
            assert_eq!(gaps.len(), want.len(), "{gaps:?}");
            for (gap, want) in gaps.iter().zip(&want) {
                assert!(
                    *gap >= *want && *gap < *want + interval,
                    "gaps {gaps:?}, want {want:?}"
                );
            }
            // A success resets the backoff: the next return is written after one interval.
            let before = tokio::time::Instant::now();
            h.cluster.capacity_returns().record("a", ResourceKinds::GPU);
            h.until("written", 2).await;
            let last = *h.script.at.lock().last().unwrap();
            assert!(last - before < interval * 2, "{:?}", last - before);
            assert_eq!(retry_wait(interval, 40), MAX_RETRY_WAIT);
            assert_eq!(
                retry_wait(Duration::from_secs(60), 3),
                Duration::from_secs(60)
            );
            h.stop.cancel();
        })
        .await
        .expect("hang guard");
    }

    #[tokio::test]
    async fn only_the_leader_writes_and_only_for_a_wanted_kind() {
        tokio::time::timeout(HANG_GUARD, async {
            let h = Harness::start(Duration::ZERO).await;
            let returns = h.cluster.capacity_returns();
            // Nobody waits: counted, not written.
            returns.record("a", ResourceKinds::GPU);
            h.until("no_waiting_pods", 1).await;
            // A pod waits for CPUs; GPUs return: not its kind.
            h.reject("p", ResourceKinds::CPU);
            returns.record("a", ResourceKinds::GPU);
            h.until("no_waiting_pods", 2).await;
            // A standby never writes.
            h.leader.store(false, Ordering::SeqCst);
            returns.record("a", ResourceKinds::CPU);
            h.until("not_leader", 1).await;
            assert!(h.script.calls.lock().is_empty());
            // The leader again, CPUs return: written.
            h.leader.store(true, Ordering::SeqCst);
            returns.record("a", ResourceKinds::CPU);
            h.until("written", 1).await;
            assert_eq!(*h.script.calls.lock(), ["a"]);
            h.stop.cancel();
        })
        .await
        .expect("hang guard");
    }

    #[tokio::test]
    async fn after_a_takeover_returns_are_signalled_without_a_remembered_pod() {
        tokio::time::timeout(HANG_GUARD, async {
            let h = Harness::start(Duration::from_secs(3600)).await;
            h.cluster.capacity_returns().record("a", ResourceKinds::GPU);
            h.until("written", 1).await;
            assert_eq!(h.count("no_waiting_pods"), 0);
            h.stop.cancel();
        })
        .await
        .expect("hang guard");
    }

    #[test]
    fn a_rejection_decided_before_a_taken_return_replays_it() {
        let cluster = ClusterState::new();
        let requeue = Requeue::default();
        requeue
            .enabled
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let returns = cluster.capacity_returns();
        returns.enable();
        // Filter reads the generation, then loads its snapshot (GPUs still sick) ...
        let seen = returns.generation();
        // ... the GPUs heal and the signal task takes the return, finding nobody waiting ...
        returns.record("n1", ResourceKinds::GPU);
        assert_eq!(returns.take().len(), 1);
        // ... then filter remembers the pod it rejected on the stale snapshot: the return is
        // recorded again, so the next round signals it.
        requeue.rejected(&cluster, PodUid::new("p"), ResourceKinds::GPU, seen);
        let again = returns.take();
        assert_eq!(again.get("n1"), Some(&ResourceKinds::GPU));
        // A rejection decided on a current snapshot replays nothing.
        requeue.rejected(
            &cluster,
            PodUid::new("q"),
            ResourceKinds::GPU,
            returns.generation(),
        );
        assert!(returns.take().is_empty());
    }
}
