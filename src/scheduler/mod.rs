//! The scheduling core: what both front ends (the HTTP service, and the operator tools
//! `inspect` / `simulate`) call, over the caches. One [`Scheduler`] holds the caches, the
//! scoring configuration ([`config`]), the binder and the read memos; the front ends translate
//! their input into its calls and never decide anything themselves.
//!
//! The pieces, in the order a request meets them (see `ARCHITECTURE.md`):
//! - [`needs`]: what a pod asks of a node, once per request;
//! - [`read`]: filter's and prioritize's answers from the read snapshot (no node lock), with
//!   the per-request [`aligned_memo`] and the cross-request verdict [`memo`];
//! - [`decide`]: the full decision on a locked node (bind, preempt, and any node the snapshot
//!   cannot answer). **The GPU is chosen in [`decide::allocate_on`]** (device policy, then
//!   `placement::device::allocate`), **the cpuset in [`decide::cpu_decision`]** (then
//!   `placement::cpu::place`);
//! - [`verbs`]: filter, prioritize and preempt over many candidate nodes;
//! - [`nominated`]: filter holds the capacity of pods kube-scheduler nominated to a node;
//! - [`explain`]: a refused node's reason in the pod's own terms, when no node passes;
//! - [`relative`]: prioritize's answer as kube-scheduler reads it, without the hosts that
//!   score alike;
//! - [`ranking`]: where the ranking goes (`--ranking`): prioritize's scores, or filter passing
//!   only the best-scoring nodes;
//! - [`bind`]: the one place an allocation is committed, in named phases;
//! - [`write_back`]: the koordinator annotations a CPU placement is written as;
//! - [`requeue`]: the pods filter rejected everywhere and the signal that retries them;
//! - the leader's background writers, level-triggered from the caches: [`dra_owner`] (the
//!   DeviceTaintRules that keep DRA off the devices the extender owns) and [`share_totals`]
//!   (the GPU share totals on Nodes), each failing key held back by [`backoff`].
//!
//! Must never speak HTTP (the wire types it takes are plain data from `model::wire`) or import
//! `extender`, `ops` or `app`.

mod aligned_memo;
#[cfg(test)]
mod amplified_tests;
pub mod backoff;
pub mod bind;
mod config;
mod decide;
pub mod dra_owner;
pub mod explain;
mod fragment;
pub mod kube_fit;
mod memo;
mod needs;
mod nominated;
#[cfg(test)]
mod partition_tests;
pub mod ranking;
mod read;
pub mod relative;
pub mod requeue;
pub mod share_totals;
pub mod verbs;
mod victims;
mod write_back;

use std::sync::Arc;

pub use bind::{BindError, BindOutcome, Binder};
pub use config::{CpuScoringError, ScoringConfig, ScoringError, ScoringFlags};
pub use decide::allocate_on;
pub use memo::ReadMemos;
pub use needs::PodNeeds;
pub use requeue::Requeue;

use crate::cluster::ClusterState;
use crate::metrics::Metrics;
use crate::sync::Readiness;

/// The scheduling core of one process: the caches it decides on, the scoring it decides with,
/// the binder that commits, the read verbs' memos and the requeue registry. Cloning is cheap
/// (every part is shared).
#[derive(Clone)]
pub struct Scheduler {
    pub cluster: Arc<ClusterState>,
    pub readiness: Arc<Readiness>,
    pub metrics: Metrics,
    pub binder: Arc<Binder>,
    pub scoring: Arc<ScoringConfig>,
    /// Filter's and prioritize's verdict memos, kept between requests of one pod shape.
    pub memos: Arc<ReadMemos>,
    /// Pods filter rejected everywhere, for the requeue signal ([`requeue`]).
    pub requeue: Arc<Requeue>,
    /// Whether kube-scheduler counts the GPU share names (`--gpu-share-totals`): what the
    /// operator tools' model of it (`ops::simulate::scheduler_fit`) counts.
    pub share_totals: share_totals::ShareTotals,
    /// Where the ranking goes: prioritize's scores, or filter's answer (`--ranking`).
    pub ranking: ranking::Ranking,
}

impl Scheduler {
    /// What deriving a pod's needs reads from the caches now ([`needs::pod_needs`]).
    /// What `pod` asks of a node, as every verb reads it (the operator tools ask too).
    pub fn pod_needs(
        &self,
        pod: &crate::model::pod::Pod,
    ) -> Result<PodNeeds, needs::InvalidRequest> {
        needs::pod_needs(pod, self.needs_inputs())
    }

    pub(crate) fn needs_inputs(&self) -> needs::NeedsInputs<'_> {
        needs::NeedsInputs::of(&self.readiness, &self.cluster, &self.scoring)
    }

    /// A scheduler over `cluster`, binding through `api`.
    pub fn new(
        cluster: Arc<ClusterState>,
        readiness: Arc<Readiness>,
        metrics: Metrics,
        api: Arc<dyn bind::PodApi>,
        scoring: ScoringConfig,
        requeue: Arc<Requeue>,
    ) -> Self {
        let scoring = Arc::new(scoring);
        let binder = Arc::new(Binder::new(
            api,
            cluster.clone(),
            readiness.clone(),
            scoring.clone(),
            metrics.clone(),
        ));
        Scheduler {
            cluster,
            readiness,
            metrics,
            binder,
            scoring,
            memos: Default::default(),
            requeue,
            share_totals: Default::default(),
            ranking: Default::default(),
        }
    }
}
