//! Readiness: whether the service may serve scheduling verbs (`/readyz`), composed of what
//! each part owns:
//! - each kind's sync progress and the one "settled" rule ([`progress`]);
//! - leadership and its lease deadline ([`leadership`], written by `crate::leader` only);
//! - the pod fence and the takeover window ([`fence`]), told of pod (re)lists and of
//!   leadership gained here, so binds never decide on a pod cache that may miss a binding;
//! - shutdown, the configuration refusal and the bootstrap hook (here: a flag each).
//!
//! The set of kinds is decided once at startup and never grows, so "all synced" can never be
//! true over an empty or partial set (koordinator #3125's gate hazard). A kind becomes synced
//! when its handler has *applied* its first `InitDone`, and stays synced across relists.

mod fence;
mod leadership;
mod progress;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

use super::kind::Kind;
use crate::clock::BootInstant;
use crate::metrics::Metrics;
use fence::PodFence;
use leadership::Leadership;
use progress::Progress;

/// How a kind takes part in readiness.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "requirement")]
pub enum Requirement {
    /// Not decided yet: API discovery for this kind's CRD has not answered.
    Discovering,
    /// Watched and waited for.
    Required,
    /// CRD not served and not insisted on: not watched, features off.
    Disabled { reason: String },
    /// Insisted on (`--require-kinds`) but not served: readiness can never be reached.
    Unavailable { reason: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Pending,
    Listing,
    Synced,
}

/// Why `/readyz` is or is not 200, as JSON.
#[derive(Debug, Serialize)]
pub struct ReadinessReport {
    pub ready: bool,
    /// Ready but for leadership: synced, snapshot built, not shutting down. What
    /// `/readyz?standby=ok` answers 200 for (scheduler mode's pod readiness, where no Service
    /// routes by it and a PodDisruptionBudget must count a synced standby as healthy).
    pub standby_ready: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// What an operator should know that does not stop scheduling ([`Readiness::set_warning`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Binds wait (answer "retry shortly") until a fresh pod relist lands, after a leader
    /// change or a pod watch error ([`Readiness::pods_current`]). Filter and prioritize still
    /// serve, so this does not fail readiness; it tells an operator why binds are refused.
    pub binds_wait_for_pod_relist: bool,
    pub kinds: BTreeMap<Kind, KindReport>,
}

#[derive(Debug, Serialize)]
pub struct KindReport {
    #[serde(flatten)]
    pub requirement: Requirement,
    pub phase: Phase,
    pub replayed: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub listing: u64,
    pub relists: u64,
    pub cached: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

pub struct Readiness {
    progress: Progress,
    leadership: Leadership,
    fence: PodFence,
    shutting_down: AtomicBool,
    started: Instant,
    bootstrap_recorded: AtomicBool,
    /// Runs once, when every kind is first synced, before readiness is reported: builds what
    /// the verbs read (the cluster's read snapshot).
    on_bootstrap: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Why the cluster's configuration makes this service refuse to schedule (a DeviceClass
    /// moving a managed resource name to DRA: `sync::dra`); `refused` mirrors `is_some` for
    /// the verbs' hot check.
    refusal: Mutex<Option<String>>,
    refused: AtomicBool,
    /// What an operator should know that does not stop scheduling (by topic, so each owner
    /// replaces only its own): reported, never failing readiness.
    warnings: Mutex<BTreeMap<&'static str, String>>,
    metrics: Metrics,
}

impl Readiness {
    /// `kinds` is the fixed set decided at startup; kinds absent from it are not reported.
    /// Nodes, both pod watches and PodDisruptionBudgets are always required, whatever the
    /// caller passes.
    pub fn new(
        mut kinds: BTreeMap<Kind, Requirement>,
        max_staleness: Option<Duration>,
        metrics: Metrics,
    ) -> Arc<Self> {
        for always in [
            Kind::Nodes,
            Kind::Pods,
            Kind::NominatedPods,
            Kind::PodDisruptionBudgets,
        ] {
            kinds.insert(always, Requirement::Required);
        }
        Arc::new(Readiness {
            progress: Progress::new(kinds, max_staleness, metrics.clone()),
            leadership: Leadership::new(),
            fence: PodFence::new(metrics.clone()),
            shutting_down: AtomicBool::new(false),
            started: Instant::now(),
            bootstrap_recorded: AtomicBool::new(false),
            on_bootstrap: Mutex::new(None),
            refusal: Mutex::new(None),
            refused: AtomicBool::new(false),
            warnings: Mutex::new(BTreeMap::new()),
            metrics,
        })
    }

    // ---- sync progress ([`progress`]) ----

    /// Settles a kind's requirement once discovery has answered. Only kinds declared at
    /// construction can be set: the set of kinds never grows.
    pub fn set_requirement(&self, kind: Kind, requirement: Requirement) {
        self.progress.set_requirement(kind, requirement);
        self.check_bootstrap();
    }

    pub fn requirement(&self, kind: Kind) -> Option<Requirement> {
        self.progress.requirement(kind)
    }

    pub fn is_enabled(&self, kind: Kind) -> bool {
        matches!(self.requirement(kind), Some(Requirement::Required))
    }

    pub fn on_init(&self, kind: Kind) {
        self.progress.on_init(kind);
        if kind == Kind::Pods {
            self.fence.relist_began();
        }
    }

    /// Once per buffered object: an atomic add, and the lock only when an error is pending.
    /// A kind's events (this, `on_error`, ...) come from its one sync task, in order.
    pub fn on_init_apply(&self, kind: Kind) {
        self.progress.on_init_apply(kind);
    }

    /// Called by the kind's handler *after* it applied the diff of a completed (re)list.
    pub fn on_init_done(&self, kind: Kind, replayed: u64, cached: u64) {
        self.progress.on_init_done(kind, replayed, cached);
        if kind == Kind::Pods {
            self.fence.relist_applied();
        }
        self.check_bootstrap();
    }

    pub fn on_applied(&self, kind: Kind, cached: u64) {
        self.progress.on_applied(kind, cached);
    }

    pub fn on_error(&self, kind: Kind, message: String) {
        self.progress.on_error(kind, message);
        if kind == Kind::Pods {
            self.fence.watch_error();
        }
    }

    /// Every required kind has applied its first `InitDone` and no insisted-on kind is missing.
    pub fn all_synced(&self) -> bool {
        self.progress.all_settled()
    }

    /// Kinds the caches are still waiting for (for the verbs' `Error` text).
    pub fn waiting_for(&self) -> Vec<Kind> {
        self.progress.unsettled()
    }

    /// Resolves when `kind`'s watcher should drop its stream and start over with a list (only
    /// the pod fence asks, of the pod watcher).
    pub async fn restart_requested(&self, kind: Kind) {
        if kind == Kind::Pods {
            self.fence.relist_requested().await
        } else {
            std::future::pending().await
        }
    }

    // ---- bootstrap ----

    /// Once every kind is first synced: runs the bootstrap hook, then records bootstrap as
    /// complete (readiness waits for this).
    fn check_bootstrap(&self) {
        if self.bootstrap_recorded.load(Ordering::SeqCst) || !self.all_synced() {
            return;
        }
        let hook = self.on_bootstrap.lock().take();
        if let Some(hook) = hook {
            hook();
        }
        if !self.bootstrap_recorded.swap(true, Ordering::SeqCst) {
            let secs = self.started.elapsed().as_secs_f64();
            self.metrics.bootstrap_duration.set(secs);
            tracing::info!(
                seconds = secs,
                "bootstrap complete: every required kind is synced"
            );
        }
    }

    /// Sets what runs once every kind is first synced, before readiness can be reported.
    pub fn on_bootstrap(&self, hook: impl FnOnce() + Send + 'static) {
        *self.on_bootstrap.lock() = Some(Box::new(hook));
    }

    // ---- shutdown and refusal ----

    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Sets (or clears) the warning on `topic`: reported by `/readyz` (and `/debug`) whether
    /// ready or not, never a reason to refuse.
    pub fn set_warning(&self, topic: &'static str, warning: Option<String>) {
        let mut warnings = self.warnings.lock();
        let changed = match warning {
            Some(w) => warnings.insert(topic, w.clone()).as_ref() != Some(&w),
            None => warnings.remove(topic).is_some(),
        };
        if changed && let Some(w) = warnings.get(topic) {
            tracing::warn!(topic, warning = %w, "readiness warning");
        }
    }

    /// Sets (or clears) the configuration refusal: while set, not ready, with this reason.
    pub fn set_refusal(&self, reason: Option<String>) {
        let mut r = self.refusal.lock();
        self.refused.store(reason.is_some(), Ordering::SeqCst);
        *r = reason;
    }

    // ---- leadership ([`leadership`]) and the pod fence ([`fence`]) ----

    /// Sets the takeover window: after becoming leader, binds wait this long (and then for a
    /// relist begun afterwards) because a binding the previous leader sent may land that late.
    pub fn set_takeover_window(&self, window: Duration) {
        self.fence.set_takeover_window(window);
    }

    /// Becoming leader raises the pod fence: the previous leader's last binds may not have
    /// reached this replica's pod watch yet, or may not even have landed (see
    /// [`Self::pods_current`]).
    pub fn set_leader(&self, leader: bool) {
        if self.leadership.set(leader) {
            self.fence.begin_takeover("became_leader");
        }
    }

    /// Leadership was (re)confirmed: it lapses at `until` unless confirmed again. A lapse
    /// that is followed by a renewal counts as becoming leader again (the pod fence is raised):
    /// while it had lapsed another replica may have held the lease and bound pods.
    pub fn set_leader_until(&self, until: BootInstant) {
        let lapsed = self.leadership.renew(until);
        self.set_leader(true);
        if lapsed {
            self.fence.begin_takeover("became_leader");
        }
    }

    /// A process start is a takeover too, whatever the leader mode: the previous process (a
    /// crashed replica, or the one a rollout replaced) may have sent bindings that the API
    /// server applies after this one's first list. Called once at start when no leader
    /// election will call [`Self::set_leader`]; with one, gaining the lease does the same.
    pub fn fence_start(&self) {
        self.fence.begin_takeover("started");
    }

    /// Resolves once this replica is not the leader: the flag cleared, or the renewal
    /// deadline passed (on the suspend-counting clock). Bind races its API writes against it.
    pub async fn leadership_lost(&self) {
        self.leadership.lost().await
    }

    pub fn is_leader(&self) -> bool {
        self.leadership.is_leader()
    }

    /// Whether the pod cache holds every bind completed before the last fence: binds decide
    /// only then ([`fence`] says why, and what the takeover window adds).
    pub fn pods_current(&self) -> bool {
        self.fence.pods_current()
    }

    #[cfg(test)]
    fn expire_takeover_window(&self) {
        self.fence.expire_takeover_window();
    }

    // ---- the composition ----

    /// Ready to serve scheduling verbs: synced, not shutting down, leader.
    /// Every verb call asks this, so it decides without building the report's strings and
    /// maps; the same conditions as [`Self::report`], which runs only when not ready.
    pub fn is_ready(&self) -> bool {
        !self.shutting_down.load(Ordering::SeqCst)
            && !self.refused.load(Ordering::SeqCst)
            && self.is_leader()
            && self.bootstrap_recorded.load(Ordering::SeqCst)
            && self.progress.all_current(Instant::now())
    }

    /// Why scheduling verbs must not decide now, or `None` when they may.
    pub fn not_ready_reason(&self) -> Option<String> {
        if self.is_ready() {
            return None;
        }
        let report = self.report();
        (!report.ready).then(|| format!("not ready: {}", report.reasons.join("; ")))
    }

    pub fn report(&self) -> ReadinessReport {
        let now = Instant::now();
        let binds_wait_for_pod_relist = !self.pods_current();
        let mut reasons = Vec::new();
        if self.shutting_down.load(Ordering::SeqCst) {
            reasons.push("shutting down".to_string());
        }
        if let Some(refusal) = self.refusal.lock().clone() {
            reasons.push(refusal);
        }
        let problems = self.progress.problems(now);
        if !problems.waiting.is_empty() {
            reasons.push(format!("waiting for {}", problems.waiting.join(", ")));
        }
        reasons.extend(problems.reasons);
        if !self.bootstrap_recorded.load(Ordering::SeqCst) && reasons.is_empty() {
            reasons.push("building the read snapshot".to_string());
        }
        // Everything but leadership: what a standby needs to take over at once.
        let standby_ready = reasons.is_empty();
        if !self.is_leader() {
            reasons.push("not the leader".to_string());
        }
        ReadinessReport {
            ready: reasons.is_empty(),
            standby_ready,
            reasons,
            warnings: self.warnings.lock().values().cloned().collect(),
            binds_wait_for_pod_relist,
            kinds: self.progress.reports(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kinds every readiness requires, whatever it is built with.
    const ALWAYS: [Kind; 4] = [
        Kind::Nodes,
        Kind::Pods,
        Kind::NominatedPods,
        Kind::PodDisruptionBudgets,
    ];

    fn readiness(kinds: &[(Kind, Requirement)]) -> Arc<Readiness> {
        Readiness::new(kinds.iter().cloned().collect(), None, Metrics::new())
    }

    #[test]
    fn ready_only_after_every_required_kind_applied_init_done() {
        let r = readiness(&[
            (Kind::Nodes, Requirement::Required),
            (Kind::Pods, Requirement::Required),
            (
                Kind::Devices,
                Requirement::Disabled {
                    reason: "CRD not served".into(),
                },
            ),
        ]);
        assert!(!r.is_ready());
        r.on_init(Kind::Nodes);
        r.on_init_done(Kind::Nodes, 3, 3);
        assert!(!r.is_ready());
        assert_eq!(
            r.waiting_for(),
            vec![Kind::Pods, Kind::NominatedPods, Kind::PodDisruptionBudgets]
        );
        r.on_init(Kind::Pods);
        r.on_init_apply(Kind::Pods);
        assert!(!r.is_ready(), "listing is not synced");
        r.on_init_done(Kind::Pods, 1, 1);
        assert!(!r.is_ready(), "the nominated pods are a required list too");
        for kind in [Kind::NominatedPods, Kind::PodDisruptionBudgets] {
            r.on_init(kind);
            r.on_init_done(kind, 0, 0);
        }
        assert!(r.is_ready());
        // A later relist never flips readiness back.
        r.on_init(Kind::Pods);
        assert!(r.is_ready());
        r.set_shutting_down();
        assert!(!r.is_ready());
        assert!(r.not_ready_reason().unwrap().contains("shutting down"));
    }

    #[test]
    fn unavailable_required_kind_blocks_readiness_forever() {
        let r = readiness(&[
            (Kind::Nodes, Requirement::Required),
            (
                Kind::Devices,
                Requirement::Unavailable {
                    reason: "CRD not served".into(),
                },
            ),
        ]);
        for kind in ALWAYS {
            r.on_init(kind);
            r.on_init_done(kind, 0, 0);
        }
        assert!(!r.is_ready());
        assert!(
            r.not_ready_reason()
                .unwrap()
                .contains("devices required but unavailable")
        );
    }

    #[test]
    fn kind_index_is_the_position_in_all() {
        for (i, kind) in Kind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), i);
        }
    }

    #[test]
    fn listing_counts_buffered_objects_and_clears_staleness() {
        let r = Readiness::new(BTreeMap::new(), Some(Duration::ZERO), Metrics::new());
        for kind in ALWAYS {
            r.on_init(kind);
            r.on_init_done(kind, 0, 0);
        }
        r.on_error(Kind::Pods, "connection refused".into());
        std::thread::sleep(Duration::from_millis(5));
        assert!(!r.is_ready());
        r.on_init(Kind::Pods);
        r.on_error(Kind::Pods, "connection refused".into());
        std::thread::sleep(Duration::from_millis(5));
        assert!(!r.is_ready());
        r.on_init_apply(Kind::Pods);
        r.on_init_apply(Kind::Pods);
        assert!(r.is_ready(), "a listed object clears staleness");
        assert_eq!(r.report().kinds[&Kind::Pods].listing, 2);
        assert_eq!(r.report().kinds[&Kind::Nodes].listing, 0);
        r.on_init_done(Kind::Pods, 2, 2);
        assert_eq!(r.report().kinds[&Kind::Pods].listing, 0);
    }

    #[test]
    fn empty_kind_set_is_never_ready_by_accident() {
        let r = readiness(&[]);
        assert!(!r.is_ready());
        assert_eq!(r.waiting_for(), ALWAYS.to_vec());
    }

    /// Issue 27: leadership lapses at its renewal deadline on its own (no task has to clear
    /// the flag), wakes whoever waits on it, and a renewal after a lapse fences the pod cache
    /// as a new leadership does (another replica may have bound pods meanwhile).
    #[tokio::test]
    async fn a_lapsed_renewal_deadline_ends_leadership_and_a_late_renewal_fences_pods() {
        let r = readiness(&[]);
        for kind in ALWAYS {
            r.on_init(kind);
            r.on_init_done(kind, 0, 0);
        }
        r.set_leader_until(BootInstant::now() + Duration::from_secs(3600));
        assert!(r.is_leader() && r.is_ready());
        assert!(r.pods_current(), "a renewal in time raises no fence");

        let waiter = {
            let r = r.clone();
            tokio::spawn(async move { r.leadership_lost().await })
        };
        // A deadline already passed: not the leader, though nobody called set_leader(false).
        r.set_leader_until(BootInstant::now());
        assert!(!r.is_leader() && !r.is_ready());
        tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("leadership_lost never resolved")
            .unwrap();

        // Renewed after the lapse: leader again, and binds wait for a fresh pod relist.
        r.set_leader_until(BootInstant::now() + Duration::from_secs(3600));
        assert!(r.is_leader());
        assert!(
            !r.pods_current(),
            "a renewal after a lapse must fence the pod cache"
        );
    }

    #[test]
    fn not_leader_is_not_ready() {
        let r = readiness(&[]);
        r.set_leader(false);
        assert!(
            !r.report().standby_ready,
            "a standby still syncing is not standby-ready"
        );
        for kind in ALWAYS {
            r.on_init(kind);
            r.on_init_done(kind, 0, 0);
        }
        assert!(!r.is_ready());
        let report = r.report();
        assert!(!report.ready && report.standby_ready, "{report:?}");
        r.set_leader(true);
        assert!(r.is_ready());
        r.set_shutting_down();
        assert!(
            !r.report().standby_ready,
            "a standby shutting down is not standby-ready"
        );
    }

    #[test]
    fn a_takeover_waits_out_the_previous_leaders_bindings_then_needs_a_relist() {
        let r = readiness(&[]);
        r.on_init(Kind::Pods);
        r.on_init_done(Kind::Pods, 0, 0);
        // A window no descheduled thread outlasts; its end is an event of the test.
        r.set_takeover_window(Duration::from_secs(3600));
        r.set_leader(false);
        r.set_leader(true);
        // A relist inside the window does not lift the fence: a binding the previous leader
        // sent may still be applied after it.
        r.on_init(Kind::Pods);
        r.on_init_done(Kind::Pods, 0, 0);
        assert!(!r.pods_current(), "inside the takeover window");
        r.expire_takeover_window();
        assert!(
            !r.pods_current(),
            "the window has ended, but no relist has begun since"
        );
        assert!(r.report().binds_wait_for_pod_relist);
        r.on_init(Kind::Pods);
        r.on_init_done(Kind::Pods, 0, 0);
        assert!(r.pods_current(), "a relist begun after the window lifts it");
        let fences = |why: &str| r.metrics.pod_fences.with_label_values(&[why]).get();
        assert_eq!((fences("became_leader"), fences("takeover_window")), (1, 1));
        // Staying leader opens no new window.
        r.set_leader(true);
        assert!(r.pods_current());
    }

    /// Issue 36 §1: without a leader mode a start is fenced too: the first list does not lift
    /// the fence while the window lasts (a binding the previous process sent may land after
    /// it); a relist begun after the window does.
    #[test]
    fn a_start_without_a_leader_mode_waits_out_the_previous_process() {
        let r = readiness(&[]);
        r.set_takeover_window(Duration::from_secs(3600));
        r.fence_start();
        assert!(r.is_leader(), "no leader mode: the process is the binder");
        r.on_init(Kind::Pods);
        r.on_init_done(Kind::Pods, 0, 0);
        assert!(!r.pods_current(), "inside the window after the start");
        r.expire_takeover_window();
        assert!(
            !r.pods_current(),
            "no relist has begun since the window ended"
        );
        r.on_init(Kind::Pods);
        r.on_init_done(Kind::Pods, 0, 0);
        assert!(r.pods_current());
        let fences = |why: &str| r.metrics.pod_fences.with_label_values(&[why]).get();
        assert_eq!((fences("started"), fences("takeover_window")), (1, 1));
    }

    #[test]
    fn pod_fence_holds_until_a_relist_begun_after_it_is_applied() {
        let r = readiness(&[]);
        assert!(r.pods_current(), "no fence before anything happened");
        r.set_leader(false);
        // Becoming leader before the first list began: that list clears the fence.
        r.set_leader(true);
        assert!(!r.pods_current());
        r.on_init(Kind::Pods);
        r.on_init_done(Kind::Pods, 0, 0);
        assert!(r.pods_current(), "the first list began after the fence");

        // A pod watch error during steady state fences; only a relist begun after it lifts
        // the fence.
        r.on_error(Kind::Pods, "watch dropped".into());
        assert!(!r.pods_current());
        assert!(
            r.report().binds_wait_for_pod_relist,
            "the readiness report shows the fence"
        );
        r.on_init(Kind::Pods);
        // A list page failing inside that relist opens no new gap (the retried list is still
        // read after the fence) and must not raise it again: that restarted the list at once,
        // a hot loop while lists kept failing.
        r.on_error(Kind::Pods, "list page failed".into());
        assert!(!r.pods_current());
        r.on_init_done(Kind::Pods, 0, 0);
        assert!(r.pods_current(), "the relist began after the fence");
        assert!(!r.report().binds_wait_for_pod_relist);

        // Becoming leader in the middle of a relist: that relist began before the fence.
        r.on_init(Kind::Pods);
        r.set_leader(false);
        r.set_leader(true);
        r.on_init_done(Kind::Pods, 0, 0);
        assert!(
            !r.pods_current(),
            "that relist began before the leadership gain"
        );
        r.on_init(Kind::Pods);
        r.on_init_done(Kind::Pods, 0, 0);
        assert!(r.pods_current());

        // Errors of other kinds do not fence binds; staying leader does not either.
        r.on_error(Kind::Nodes, "x".into());
        r.set_leader(true);
        assert!(r.pods_current());
        // Losing and regaining leadership does.
        r.set_leader(false);
        r.set_leader(true);
        assert!(!r.pods_current());
    }

    #[tokio::test]
    async fn a_fence_after_the_first_list_asks_the_pod_watcher_to_relist() {
        let r = readiness(&[]);
        r.on_init(Kind::Pods);
        r.on_init_done(Kind::Pods, 0, 0);
        r.on_error(Kind::Pods, "gone".into());
        // The request is kept until the watcher asks (Notify stores one permit); a hang here
        // means no restart was requested.
        tokio::time::timeout(
            std::time::Duration::from_secs(60),
            r.restart_requested(Kind::Pods),
        )
        .await
        .expect("a relist was requested");
    }

    #[test]
    fn staleness_bound_fails_readiness_while_errors_continue() {
        let r = Readiness::new(
            [(Kind::Nodes, Requirement::Required)].into_iter().collect(),
            Some(Duration::ZERO),
            Metrics::new(),
        );
        for kind in ALWAYS {
            r.on_init(kind);
            r.on_init_done(kind, 0, 0);
        }
        r.on_error(Kind::Nodes, "connection refused".into());
        std::thread::sleep(Duration::from_millis(5));
        assert!(!r.is_ready());
        r.on_applied(Kind::Nodes, 0);
        assert!(r.is_ready(), "a healthy event clears staleness");
    }
}
