//! Each kind's sync progress: its requirement (decided by discovery), its phase, what its
//! latest (re)list replayed, and whether its watch has been failing for too long. The one rule
//! for "this kind lets the service be ready" is [`KindState::settled`].
//!
//! Owns nothing else of readiness: the pod fence is told about pod (re)lists by the facade
//! (`super::Readiness`), and leadership and shutdown are not kinds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{KindReport, Phase, Requirement};
use crate::metrics::Metrics;
use crate::sync::Kind;

/// A watch that errored and then kept quiet this long is assumed reconnected: kube's watcher
/// backs off at most 30 s between attempts, so a still-failing watch errors more often.
const ERROR_QUIET_PERIOD: Duration = Duration::from_secs(65);

#[derive(Debug)]
struct KindState {
    requirement: Requirement,
    phase: Phase,
    /// Objects applied by the latest completed (re)list.
    replayed: u64,
    relists: u64,
    cached: u64,
    first_error_unhealthy: Option<Instant>,
    last_error: Option<Instant>,
    last_error_message: Option<String>,
}

impl KindState {
    /// The one rule: a required kind is settled once its first `InitDone` is applied (and
    /// stays so across relists); a disabled one is settled; one still discovering, or
    /// insisted on but unavailable, never is.
    fn settled(&self) -> bool {
        match self.requirement {
            Requirement::Required => self.phase == Phase::Synced,
            Requirement::Disabled { .. } => true,
            Requirement::Unavailable { .. } | Requirement::Discovering => false,
        }
    }
}

/// Per kind, what `on_init_apply` touches, so buffering an object takes no lock.
#[derive(Default)]
struct ListingCounter {
    /// Objects buffered by the (re)list in progress.
    listing: AtomicU64,
    /// `first_error_unhealthy` is set: the next healthy event must take the lock to clear it.
    unhealthy: AtomicBool,
}

/// Why the kinds keep the service from being ready, for the report.
pub(super) struct KindProblems {
    /// Kinds not settled yet (not the unavailable ones).
    pub waiting: Vec<&'static str>,
    /// Unavailable kinds and failing watches, each a sentence.
    pub reasons: Vec<String>,
}

pub(super) struct Progress {
    kinds: Mutex<BTreeMap<Kind, KindState>>,
    /// Indexed by `Kind::index`.
    listing: [ListingCounter; Kind::ALL.len()],
    max_staleness: Option<Duration>,
    metrics: Metrics,
}

fn phase_gauge(requirement: &Requirement) -> i64 {
    match requirement {
        Requirement::Required | Requirement::Discovering => 0,
        _ => -1,
    }
}

impl Progress {
    pub(super) fn new(
        kinds: BTreeMap<Kind, Requirement>,
        max_staleness: Option<Duration>,
        metrics: Metrics,
    ) -> Self {
        let kinds = kinds
            .into_iter()
            .map(|(kind, requirement)| {
                metrics
                    .sync_phase
                    .with_label_values(&[kind.as_str()])
                    .set(phase_gauge(&requirement));
                (
                    kind,
                    KindState {
                        requirement,
                        phase: Phase::Pending,
                        replayed: 0,
                        relists: 0,
                        cached: 0,
                        first_error_unhealthy: None,
                        last_error: None,
                        last_error_message: None,
                    },
                )
            })
            .collect();
        Progress {
            kinds: Mutex::new(kinds),
            listing: Default::default(),
            max_staleness,
            metrics,
        }
    }

    pub(super) fn set_requirement(&self, kind: Kind, requirement: Requirement) {
        if let Some(k) = self.kinds.lock().get_mut(&kind) {
            if k.phase == Phase::Pending {
                self.metrics
                    .sync_phase
                    .with_label_values(&[kind.as_str()])
                    .set(phase_gauge(&requirement));
            }
            k.requirement = requirement;
        }
    }

    pub(super) fn requirement(&self, kind: Kind) -> Option<Requirement> {
        self.kinds.lock().get(&kind).map(|k| k.requirement.clone())
    }

    fn counter(&self, kind: Kind) -> &ListingCounter {
        &self.listing[kind.index()]
    }

    /// Clears the staleness clock; the caller holds the kinds lock.
    fn healthy(&self, kind: Kind, k: &mut KindState) {
        k.first_error_unhealthy = None;
        self.counter(kind).unhealthy.store(false, Ordering::Relaxed);
    }

    pub(super) fn on_init(&self, kind: Kind) {
        let mut kinds = self.kinds.lock();
        if let Some(k) = kinds.get_mut(&kind) {
            k.relists += 1;
            self.counter(kind).listing.store(0, Ordering::Relaxed);
            if k.phase == Phase::Pending {
                k.phase = Phase::Listing;
                self.metrics
                    .sync_phase
                    .with_label_values(&[kind.as_str()])
                    .set(1);
            }
            self.healthy(kind, k);
        }
        self.metrics
            .relists
            .with_label_values(&[kind.as_str()])
            .inc();
    }

    /// Once per buffered object: an atomic add, and the lock only when an error is pending.
    pub(super) fn on_init_apply(&self, kind: Kind) {
        let counter = self.counter(kind);
        counter.listing.fetch_add(1, Ordering::Relaxed);
        if counter.unhealthy.load(Ordering::Relaxed)
            && let Some(k) = self.kinds.lock().get_mut(&kind)
        {
            self.healthy(kind, k);
        }
    }

    pub(super) fn on_init_done(&self, kind: Kind, replayed: u64, cached: u64) {
        if let Some(k) = self.kinds.lock().get_mut(&kind) {
            k.phase = Phase::Synced;
            k.replayed = replayed;
            self.counter(kind).listing.store(0, Ordering::Relaxed);
            k.cached = cached;
            self.healthy(kind, k);
        }
        self.metrics
            .sync_phase
            .with_label_values(&[kind.as_str()])
            .set(2);
    }

    pub(super) fn on_applied(&self, kind: Kind, cached: u64) {
        if let Some(k) = self.kinds.lock().get_mut(&kind) {
            k.cached = cached;
            self.healthy(kind, k);
        }
    }

    pub(super) fn on_error(&self, kind: Kind, message: String) {
        let now = Instant::now();
        if let Some(k) = self.kinds.lock().get_mut(&kind) {
            let quiet = k
                .last_error
                .is_none_or(|t| now.duration_since(t) > ERROR_QUIET_PERIOD);
            if k.first_error_unhealthy.is_none() || quiet {
                k.first_error_unhealthy = Some(now);
            }
            self.counter(kind).unhealthy.store(true, Ordering::Relaxed);
            k.last_error = Some(now);
            k.last_error_message = Some(message);
        }
        self.metrics
            .watch_errors
            .with_label_values(&[kind.as_str()])
            .inc();
    }

    /// Every kind settled ([`KindState::settled`]).
    pub(super) fn all_settled(&self) -> bool {
        self.kinds.lock().values().all(KindState::settled)
    }

    /// Every kind settled and no watch failing for longer than `--max-staleness`.
    pub(super) fn all_current(&self, now: Instant) -> bool {
        self.kinds
            .lock()
            .values()
            .all(|k| k.settled() && self.stale_for(k, now).is_none())
    }

    /// The kinds not settled ([`KindState::settled`]).
    pub(super) fn unsettled(&self) -> Vec<Kind> {
        self.kinds
            .lock()
            .iter()
            .filter(|(_, k)| !k.settled())
            .map(|(kind, _)| *kind)
            .collect()
    }

    /// How long a kind's watch has been failing, when that exceeds `--max-staleness`.
    fn stale_for(&self, k: &KindState, now: Instant) -> Option<Duration> {
        let (bound, since, last) = (self.max_staleness?, k.first_error_unhealthy?, k.last_error?);
        let unhealthy = now.duration_since(since);
        (now.duration_since(last) <= ERROR_QUIET_PERIOD && unhealthy > bound).then_some(unhealthy)
    }

    /// What keeps the kinds from letting the service be ready, in words.
    pub(super) fn problems(&self, now: Instant) -> KindProblems {
        let kinds = self.kinds.lock();
        let waiting = kinds
            .iter()
            .filter(|(_, k)| {
                !k.settled() && !matches!(k.requirement, Requirement::Unavailable { .. })
            })
            .map(|(kind, _)| kind.as_str())
            .collect();
        let mut reasons = Vec::new();
        for (kind, k) in kinds.iter() {
            if let Requirement::Unavailable { reason } = &k.requirement {
                reasons.push(format!("{kind} required but unavailable: {reason}"));
            }
            if let (Some(unhealthy), Some(bound)) = (self.stale_for(k, now), self.max_staleness) {
                reasons.push(format!(
                    "{kind} watch unhealthy for {}s (max staleness {}s)",
                    unhealthy.as_secs(),
                    bound.as_secs()
                ));
            }
        }
        KindProblems { waiting, reasons }
    }

    pub(super) fn reports(&self) -> BTreeMap<Kind, KindReport> {
        self.kinds
            .lock()
            .iter()
            .map(|(kind, k)| {
                (
                    *kind,
                    KindReport {
                        requirement: k.requirement.clone(),
                        phase: k.phase,
                        replayed: k.replayed,
                        listing: self.counter(*kind).listing.load(Ordering::Relaxed),
                        relists: k.relists,
                        cached: k.cached,
                        last_error: k.last_error_message.clone(),
                    },
                )
            })
            .collect()
    }
}
