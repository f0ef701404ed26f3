//! The pod fence: whether the pod cache may be missing binds another writer completed, and
//! the takeover window after a start or a change of leader (see [`PodFence::pods_current`]).
//! Everything the fence decides by (how often it was raised, the raise count a pod (re)list
//! began under, whether one is listing) lives here, under one lock, so a raise is ordered
//! against the start of the list that lifts it.
//!
//! Owns nothing else of readiness: the pod kind's sync progress is `super::progress`'s; it
//! tells the fence when a pod (re)list begins, ends or errors.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::BootInstant;
use crate::metrics::Metrics;

#[derive(Default)]
struct Epochs {
    /// How many times the fence was raised.
    raised: u64,
    /// The raise count seen when the latest pod (re)list began.
    relist_epoch: u64,
    /// Between a pod (re)list's `Init` and its `InitDone`.
    relisting: bool,
    /// A pod list has begun at least once (before that, the first list lifts any raise).
    listed: bool,
}

pub(super) struct PodFence {
    epochs: Mutex<Epochs>,
    /// True while the pod cache may be missing binds that other writers completed: after this
    /// replica became leader, or after a pod watch error, until a relist that began afterwards
    /// has been applied. Binds refuse to decide meanwhile.
    fenced: AtomicBool,
    /// How long a binding the previous leader sent may still land after this replica becomes
    /// leader ([`crate::scheduler::bind::PodApi::binding_deadline`]; 0 = none).
    window_nanos: AtomicU64,
    /// The end of the current takeover window as [`BootInstant`] nanoseconds (0: none).
    until: AtomicU64,
    /// Asks the pod watcher to start over with a fresh list.
    relist: tokio::sync::Notify,
    metrics: Metrics,
}

impl PodFence {
    pub(super) fn new(metrics: Metrics) -> Self {
        PodFence {
            epochs: Mutex::new(Epochs::default()),
            fenced: AtomicBool::new(false),
            window_nanos: AtomicU64::new(0),
            until: AtomicU64::new(0),
            relist: tokio::sync::Notify::new(),
            metrics,
        }
    }

    pub(super) fn set_takeover_window(&self, window: Duration) {
        self.window_nanos.store(
            u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// A start or a new leadership term: opens the takeover window and raises the fence.
    pub(super) fn begin_takeover(&self, why: &'static str) {
        let window = self.window_nanos.load(Ordering::SeqCst);
        if window > 0 {
            let until = BootInstant::now().as_nanos().saturating_add(window);
            self.until.store(until, Ordering::SeqCst);
        }
        self.raise(&mut self.epochs.lock(), why);
    }

    /// A pod (re)list began: it lifts every raise seen so far, once applied.
    pub(super) fn relist_began(&self) {
        let mut e = self.epochs.lock();
        e.relist_epoch = e.raised;
        e.relisting = true;
        e.listed = true;
    }

    /// A pod (re)list was applied: the fence lifts if no raise came after it began.
    pub(super) fn relist_applied(&self) {
        let mut e = self.epochs.lock();
        e.relisting = false;
        if e.relist_epoch == e.raised && self.fenced.swap(false, Ordering::SeqCst) {
            tracing::info!("pod cache current again: a relist begun after the fence was applied");
        }
    }

    /// The pod watch failed: a gap other writers' binds may have fallen into. An error while
    /// a relist begun after the latest raise is still listing (a list page failed) opens no
    /// new gap: the list kube's watcher retries is still read after that raise, so it still
    /// lifts it. Raising again would restart that very list, and a list that keeps failing
    /// would then restart without backoff.
    pub(super) fn watch_error(&self) {
        let mut e = self.epochs.lock();
        let relist_covers_it = e.relisting && e.relist_epoch == e.raised;
        if !relist_covers_it {
            self.raise(&mut e, "watch_error");
        }
    }

    /// Raises the fence and, unless no pod list has begun yet (the first will begin after
    /// the raise anyway), asks the pod watcher to relist. Under the epochs lock, which orders
    /// it against [`Self::relist_began`].
    fn raise(&self, e: &mut Epochs, why: &'static str) {
        e.raised += 1;
        self.fenced.store(true, Ordering::SeqCst);
        self.metrics.pod_fences.with_label_values(&[why]).inc();
        if e.listed {
            tracing::info!(
                reason = why,
                "pod cache fenced: binds wait for a fresh pod relist"
            );
            self.relist.notify_one();
        }
    }

    /// Whether the pod cache holds every bind completed before the last fence: binds decide
    /// only then. A failover or a pod watch gap could otherwise hide another writer's pods
    /// from this replica and let it hand out what they hold.
    ///
    /// After a takeover that is not enough: the previous leader checked its leadership before
    /// each write, but a binding it sent just before losing the Lease can still be applied by
    /// the API server until that request's own deadline (`?timeout=`, and kube's client may
    /// resend a 504'd binding once: [`crate::scheduler::bind::PodApi::binding_deadline`]),
    /// after this replica's first relist. Its pod is not written meanwhile, so the binding's
    /// resourceVersion precondition does not stop it. So for the takeover window binds wait,
    /// and when it has passed the fence is raised once more: only a relist begun after every
    /// such binding has landed (or never will) lifts it. Residual window: a previous leader
    /// that stalls for longer than the Lease between its leadership check and the send (a
    /// frozen VM) sends a binding no timer here can see; only a fence the API server enforces
    /// would close that.
    pub(super) fn pods_current(&self) -> bool {
        let until = self.until.load(Ordering::SeqCst);
        if until != 0 {
            if BootInstant::now().as_nanos() < until {
                return false;
            }
            if self
                .until
                .compare_exchange(until, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                self.raise(&mut self.epochs.lock(), "takeover_window");
            }
        }
        !self.fenced.load(Ordering::SeqCst)
    }

    /// Resolves when the pod watcher should drop its stream and start over with a list.
    pub(super) async fn relist_requested(&self) {
        self.relist.notified().await
    }

    /// Ends the current takeover window now, as if its time had passed: tests order events
    /// around the window's end instead of sleeping past it.
    #[cfg(test)]
    pub(super) fn expire_takeover_window(&self) {
        let _ = self
            .until
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u != 0).then_some(1)
            });
    }
}
