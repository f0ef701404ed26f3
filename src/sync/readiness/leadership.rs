//! Leadership as this replica knows it: the flag, and the deadline by which it lapses unless
//! renewed (on the suspend-counting clock). `crate::leader` is its only writer, through
//! [`super::Readiness`], which raises the pod fence in the same step when leadership is gained.
//!
//! Owns no other readiness concept: gaining leadership *reports* it (the fence is not here).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::BootInstant;

pub(super) struct Leadership {
    leader: AtomicBool,
    /// When leadership lapses unless renewed, as [`BootInstant`] nanoseconds (0: no deadline,
    /// as when following the scheduler's Lease). Checked on every [`Self::is_leader`], so a
    /// leader whose election task is stalled, or whose machine was suspended, stops writing
    /// on time anyway.
    until: AtomicU64,
    /// Wakes [`Self::lost`] when the flag changes.
    changed: tokio::sync::watch::Sender<()>,
}

impl Leadership {
    /// Leader until told otherwise: a process without leader election is the binder.
    pub(super) fn new() -> Self {
        Leadership {
            leader: AtomicBool::new(true),
            until: AtomicU64::new(0),
            changed: tokio::sync::watch::Sender::new(()),
        }
    }

    /// Sets the flag; true when this makes the replica leader (it was not).
    pub(super) fn set(&self, leader: bool) -> bool {
        let was = self.leader.swap(leader, Ordering::SeqCst);
        if !leader {
            self.until.store(0, Ordering::SeqCst);
        }
        self.changed.send_replace(());
        leader && !was
    }

    /// Leadership confirmed until `until`; true when the previous deadline had already
    /// passed (another replica may have held the lease meanwhile). Does not set the flag.
    pub(super) fn renew(&self, until: BootInstant) -> bool {
        let previous = self.until.swap(until.as_nanos(), Ordering::SeqCst);
        previous != 0 && BootInstant::now().as_nanos() >= previous
    }

    pub(super) fn is_leader(&self) -> bool {
        if !self.leader.load(Ordering::SeqCst) {
            return false;
        }
        let until = self.until.load(Ordering::SeqCst);
        until == 0 || BootInstant::now().as_nanos() < until
    }

    /// Resolves once this replica is not the leader: the flag cleared, or the renewal
    /// deadline passed (on the suspend-counting clock).
    pub(super) async fn lost(&self) {
        let mut changed = self.changed.subscribe();
        loop {
            if !self.is_leader() {
                return;
            }
            let until = self.until.load(Ordering::SeqCst);
            let left = (until != 0).then(|| {
                BootInstant::from_nanos(until).saturating_duration_since(BootInstant::now())
            });
            tokio::select! {
                _ = changed.changed() => {}
                // Past a suspend, the sleep may overrun; is_leader above re-reads the clock.
                _ = tokio::time::sleep(left.unwrap_or(Duration::MAX / 4)), if left.is_some() => {}
            }
        }
    }
}
