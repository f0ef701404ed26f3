//! Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's LeaseLock does it:
//! get, then create or update with the observed resourceVersion as precondition, so two
//! contenders can never both win the same term. A holder's lease counts as expired only when
//! *we* have seen no renewal for `lease_duration` (local observation time, immune to clock
//! skew between nodes).
//!
//! Two modes:
//! - `Elect`: contend for our own Lease (standalone replicas).
//! - `Follow`: never write; we are "leader" while the sidecar kube-scheduler's own Lease is
//!   held by an identity of our pod (`<pod-name>_<uuid>`), so the extender that serves binds is
//!   the one beside the active scheduler.
//!
//! Leadership only flips readiness; the caches stay synced on standbys so a failover needs no
//! bootstrap. Kept hand-written rather than using kube-lease-manager, which renews through
//! server-side apply and strategic-merge patches (more RBAC, and semantics our fake API server
//! would have to emulate) where plain optimistic-concurrency updates suffice.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

use crate::clock::BootInstant;
use crate::sync::Readiness;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's rule: `lease_duration > renew_deadline > retry_period > 0`. A renew
    /// deadline at or past the lease duration lets a standby take over while the old leader
    /// still serves.
    pub fn validate(&self) -> Result<(), String> {
        if self.retry_period.is_zero() {
            return Err("--leader-elect-retry-period must be positive".into());
        }
        if self.renew_deadline <= self.retry_period {
            return Err(format!(
                "--leader-elect-renew-deadline ({:?}) must be longer than --leader-elect-retry-period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "--leader-elect-lease-duration ({:?}) must be longer than --leader-elect-renew-deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        Ok(())
    }

    /// `leaseDurationSeconds` to write: rounded *up*, so standbys (which trust the field)
    /// never wait less than our renew deadline assumes.
    fn lease_duration_seconds(&self) -> i32 {
        self.lease_duration
            .as_secs_f64()
            .ceil()
            .clamp(1.0, i32::MAX as f64) as i32
    }
}

#[derive(Clone, Debug)]
pub enum LeaderMode {
    Elect(LeaseConfig),
    /// Follow the named kube-scheduler Lease (`name`, `namespace`, `identity` = our pod name).
    Follow(LeaseConfig),
}

/// What we last saw of the lease, and when we saw it change.
struct Observation {
    holder: Option<String>,
    renew: Option<String>,
    at: BootInstant,
}

struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    observed: Option<Observation>,
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl Elector {
    fn observe(&mut self, lease: &Lease) {
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone();
        let renew = spec.renew_time.as_ref().map(|t| t.0.to_string());
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|o| o.holder != holder || o.renew != renew);
        if changed {
            self.observed = Some(Observation {
                holder,
                renew,
                at: BootInstant::now(),
            });
        }
    }

    fn lease_duration_of(&self, lease: &Lease) -> Duration {
        lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(s as u64))
            .unwrap_or(self.cfg.lease_duration)
    }

    fn held_by_other_and_valid(&self, lease: &Lease) -> bool {
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .unwrap_or("");
        if holder.is_empty() || holder == self.cfg.identity {
            return false;
        }
        self.observed
            .as_ref()
            .is_some_and(|o| o.at.elapsed() < self.lease_duration_of(lease))
    }

    /// One client-go `tryAcquireOrRenew`. Ok(true) = we hold the lease now.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let duration_secs = self.cfg.lease_duration_seconds();
        let Some(current) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        self.observe(&current);
        if self.held_by_other_and_valid(&current) {
            return Ok(false);
        }
        let mut next = current.clone();
        let spec = next.spec.get_or_insert_with(Default::default);
        let was_ours = spec.holder_identity.as_deref() == Some(self.cfg.identity.as_str());
        if !was_ours {
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.cfg.identity.clone());
        spec.lease_duration_seconds = Some(duration_secs);
        spec.renew_time = Some(now());
        // `next` carries the resourceVersion we read: a concurrent writer makes this a 409.
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &next)
            .await
        {
            Ok(updated) => {
                self.observe(&updated);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Follow mode: does the scheduler Lease name one of our identities, and is it live?
    async fn scheduler_holder_is_us(&mut self) -> Result<bool, kube::Error> {
        let Some(lease) = self.api.get_opt(&self.cfg.name).await? else {
            return Ok(false);
        };
        self.observe(&lease);
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .unwrap_or("");
        let ours = holder == self.cfg.identity
            || holder
                .strip_prefix(self.cfg.identity.as_str())
                .is_some_and(|rest| rest.starts_with('_'));
        let live = self
            .observed
            .as_ref()
            .is_some_and(|o| o.at.elapsed() < self.lease_duration_of(&lease));
        Ok(ours && live)
    }
}

/// Sets leadership; `until` (elect mode) is when it lapses unless renewed again, checked on
/// every write whether or not this task runs again by then.
fn set_leader(readiness: &Readiness, leader: bool, until: Option<BootInstant>, identity: &str) {
    if readiness.is_leader() != leader {
        if leader {
            tracing::info!(identity, "became leader: serving scheduling verbs");
        } else {
            tracing::warn!(
                identity,
                "not the leader: /readyz fails, verbs answer Error; caches stay synced"
            );
        }
    }
    match (leader, until) {
        (true, Some(until)) => readiness.set_leader_until(until),
        _ => readiness.set_leader(leader),
    }
}

/// Runs leader election until `stop`; releases the lease on the way out when we hold it.
///
/// Leadership is kept only while the last successful renewal *started* less than
/// `renew_deadline` ago. Every attempt is bounded by what is left of that deadline and the
/// pause between attempts never sleeps past it, so a leader whose API requests hang steps
/// down on time, before a standby (which waits `lease_duration` from when *it* saw that
/// renewal, which can only be later than the attempt's start) may take over.
pub async fn run(
    client: kube::Client,
    mode: LeaderMode,
    readiness: Arc<Readiness>,
    stop: CancellationToken,
) {
    let (cfg, follow) = match mode {
        LeaderMode::Elect(c) => (c, false),
        LeaderMode::Follow(c) => (c, true),
    };
    set_leader(&readiness, false, None, &cfg.identity);
    let mut elector = Elector {
        api: Api::namespaced(client, &cfg.namespace),
        cfg: cfg.clone(),
        observed: None,
    };
    // Start of the last attempt that confirmed us as holder, while we still are the leader.
    let mut last_renewed: Option<BootInstant> = None;
    loop {
        let started = BootInstant::now();
        let deadline = last_renewed.map(|t| t + cfg.renew_deadline);
        let budget = deadline.map_or(cfg.lease_duration, |d| d.saturating_duration_since(started));
        let attempt = async {
            if follow {
                elector.scheduler_holder_is_us().await
            } else {
                elector.try_acquire_or_renew().await
            }
        };
        let result = match tokio::time::timeout(budget, attempt).await {
            Ok(Ok(held)) => Ok(held),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {budget:?}")),
        };
        let leader = match result {
            Ok(true) => {
                last_renewed = Some(started);
                true
            }
            Ok(false) => {
                // Someone else holds it: the renew-deadline grace below is for a holder only,
                // not for a replica that already lost.
                last_renewed = None;
                false
            }
            Err(error) => {
                tracing::warn!(%error, lease = %cfg.name, "lease request failed");
                // Keep leadership only while still inside the renew deadline.
                let keep = last_renewed.is_some_and(|t| t.elapsed() < cfg.renew_deadline);
                if !keep {
                    last_renewed = None;
                }
                keep
            }
        };
        let until = match (follow, last_renewed) {
            (false, Some(t)) => Some(t + cfg.renew_deadline),
            _ => None,
        };
        set_leader(&readiness, leader, until, &cfg.identity);
        let pause = match last_renewed {
            Some(t) => cfg
                .retry_period
                .min((t + cfg.renew_deadline).saturating_duration_since(BootInstant::now())),
            None => cfg.retry_period,
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
    }
    if !follow && readiness.is_leader() {
        readiness.set_leader(false);
        let released = tokio::time::timeout(cfg.renew_deadline, release(&elector)).await;
        match released {
            Ok(Ok(())) => tracing::info!(identity = %cfg.identity, "released the lease"),
            Ok(Err(error)) => tracing::warn!(
                %error,
                "could not release the lease; a standby takes over when it expires"
            ),
            Err(_) => tracing::warn!(
                "releasing the lease timed out; a standby takes over when it expires"
            ),
        }
    }
}

/// Gives the lease up on shutdown so a standby takes over at once, as client-go's
/// `ReleaseOnCancel` does.
async fn release(elector: &Elector) -> Result<(), kube::Error> {
    if let Some(mut lease) = elector.api.get_opt(&elector.cfg.name).await? {
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() == Some(elector.cfg.identity.as_str()) {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(now());
            elector
                .api
                .replace(&elector.cfg.name, &PostParams::default(), &lease)
                .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(lease: u64, renew: u64, retry: u64) -> LeaseConfig {
        LeaseConfig {
            name: "l".into(),
            namespace: "default".into(),
            identity: "a".into(),
            lease_duration: Duration::from_millis(lease),
            renew_deadline: Duration::from_millis(renew),
            retry_period: Duration::from_millis(retry),
        }
    }

    #[test]
    fn timings_must_nest() {
        assert!(cfg(15_000, 10_000, 2_000).validate().is_ok());
        assert!(cfg(2_000, 1_000, 100).validate().is_ok());
        assert!(cfg(10_000, 10_000, 2_000).validate().is_err());
        assert!(cfg(5_000, 10_000, 2_000).validate().is_err());
        assert!(cfg(15_000, 2_000, 2_000).validate().is_err());
        assert!(cfg(15_000, 10_000, 0).validate().is_err());
    }

    #[test]
    fn lease_seconds_round_up() {
        // 1.5 s written as 1 s would let a standby take over 200 ms before a leader with a
        // 1.2 s renew deadline stops.
        assert_eq!(cfg(1_500, 1_200, 100).lease_duration_seconds(), 2);
        assert_eq!(cfg(2_000, 1_000, 100).lease_duration_seconds(), 2);
        assert_eq!(cfg(300, 200, 100).lease_duration_seconds(), 1);
    }
}
