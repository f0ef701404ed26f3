//! Device ownership beside DRA: the leader keeps one `NoSchedule` DeviceTaintRule on every
//! DRA driver pool that publishes devices of a node's `Device` object (so kube-scheduler's DRA
//! allocator never picks them), and takes it away only when no pod's annotation holds one of
//! the pool's devices and the node is handed to DRA (or no `Device` entry joins the pool any
//! more).
//!
//! The rule it protects (README "Beside DRA"; enforced in `cluster::devices` by the join):
//! a device both allocators can see is the extender's only while its pool's rule has existed
//! for `--dra-handover-grace` (kube-scheduler has seen the rule, and whatever it allocated in
//! memory before has reached its claim's status and this cache) and no claim holds it. Until
//! then, and when the rule is deleted by someone else (until it is back and in effect again),
//! the device is not free for the extender. The reverse hand-over: the rule is deleted only
//! once no annotation holds a device of the pool, so DRA never picks a device a pod of ours
//! holds.
//!
//! What can interleave, and the test that covers it (`tests/it/dra.rs`):
//! - DRA allocates a device in memory (Reserve) before the rule exists: its claim's status
//!   arrives within the grace, and the device is counted as the claim's from then on
//!   (`a_pool_is_the_extenders_only_once_its_rule_is_in_effect`);
//! - a claim tolerating the taint (or allocated before the rule) holds a device of an owned
//!   pool: counted as held, never handed out (`a_gpu_a_claim_holds_is_never_handed_out…`);
//! - the rule is deleted by someone else: not owned at once, recreated on the next tick, in
//!   effect after the grace (`a_deleted_rule_is_recreated_and_waits_out_the_grace_again`);
//! - restart or failover: rules are API objects with their creation time; a new leader owns
//!   what its predecessor owned as soon as it has listed them (same test, restart);
//! - a write fails or its answer is lost: counted (`dne_dra_taint_rule_writes_total`) and
//!   retried after a per-pool backoff (`scheduler::backoff`: the tick, doubled per failure in
//!   a row, at most 30 s; pools waiting in `dne_dra_taint_rule_backoff_pools`); a create that
//!   landed answers 409 then, which is success (the name is a function of the pool);
//! - someone edits the extender's rule (its label, taint or selector) so that it is no longer
//!   the extender's by form, under the extender's name: it is reconciled by name, never
//!   created again (each create would answer 409 and loop): reported once per change (an error
//!   log, `dne_dra_defaced_rules`), and the pool stays not the extender's until the rule is
//!   deleted (the next tick then writes it anew)
//!   (`tests::an_edited_rule_is_reported_never_recreated_in_a_loop`);
//! - a standby or a replica still syncing writes nothing; a new leader (or a restarted process)
//!   deletes no rule until its pod cache is current (`Readiness::pods_current`): a binding the
//!   previous binder may still land could hold a device of the pool
//!   (`tests::no_rule_is_deleted_while_the_pod_cache_may_miss_a_binding`).
//!
//! This module decides only which rules should exist; it never decides placement.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::backoff::KeyedBackoff;
use crate::cluster::ClusterState;
use crate::cluster::dra::{DevicePool, RULE_NAME_PREFIX};
use crate::metrics::Metrics;
use crate::model::dra::{
    DeviceTaint, DeviceTaintRule, DeviceTaintRuleSpec, DeviceTaintSelector, MANAGED_BY,
    MANAGED_BY_LABEL, OWNED_TAINT_KEY, TaintRuleVersion,
};
use crate::sync::{Kind, Readiness};

/// The writes behind [`run`] (the Kubernetes client in `serve`; tests record the calls).
pub trait TaintRuleApi: Send + Sync {
    fn create<'a>(&'a self, rule: &'a DeviceTaintRule) -> BoxFuture<'a, Result<(), String>>;
    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), String>>;
}

pub struct KubeTaintRuleApi {
    client: kube::Client,
    timeout: Duration,
    /// The version discovery found served (`v1`, or `v1beta2`/`v1alpha3` before 1.37).
    version: Arc<parking_lot::RwLock<TaintRuleVersion>>,
}

impl KubeTaintRuleApi {
    pub fn new(
        client: kube::Client,
        timeout: Duration,
        version: Arc<parking_lot::RwLock<TaintRuleVersion>>,
    ) -> Self {
        KubeTaintRuleApi {
            client,
            timeout,
            version,
        }
    }

    fn api(&self) -> kube::Api<DeviceTaintRule> {
        let version = *self.version.read();
        kube::Api::all_with(self.client.clone(), &version)
    }
}

impl TaintRuleApi for KubeTaintRuleApi {
    fn create<'a>(&'a self, rule: &'a DeviceTaintRule) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let api = self.api();
            let params = kube::api::PostParams::default();
            let call = api.create(&params, rule);
            match tokio::time::timeout(self.timeout, call).await {
                Ok(Ok(_)) => Ok(()),
                // The name is a function of the pool: it is ours, written by an earlier try.
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {:?}", self.timeout)),
            }
        })
    }
    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let api = self.api();
            let params = kube::api::DeleteParams::default();
            let call = api.delete(name, &params);
            match tokio::time::timeout(self.timeout, call).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {:?}", self.timeout)),
            }
        })
    }
}

/// The extender's rule for `pool`, named after it: `dne-owned-` and a stable 64-bit FNV-1a
/// hash of `driver/pool` (a pool name may be longer than a name allows, and any replica must
/// arrive at the same name).
pub fn rule_for(pool: &DevicePool) -> DeviceTaintRule {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{}/{}", pool.driver, pool.pool).bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut rule = DeviceTaintRule::default();
    rule.metadata.name = Some(format!("{RULE_NAME_PREFIX}{hash:016x}"));
    rule.metadata.labels = Some([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())].into());
    rule.spec = DeviceTaintRuleSpec {
        device_selector: Some(DeviceTaintSelector {
            driver: Some(pool.driver.to_string()),
            pool: Some(pool.pool.to_string()),
            device: None,
        }),
        taint: DeviceTaint {
            key: OWNED_TAINT_KEY.to_string(),
            value: "extender".to_string(),
            effect: "NoSchedule".to_string(),
        },
    };
    rule
}

/// The reconciler's memory between ticks: which pools back off after failed writes, and
/// which edited rules were already reported.
pub struct Reconciler {
    backoff: KeyedBackoff<DevicePool>,
    reported: BTreeSet<Arc<str>>,
}

impl Reconciler {
    /// `tick`: how often [`run`] reconciles (the first wait after a failure).
    pub fn new(tick: Duration) -> Self {
        Reconciler {
            backoff: KeyedBackoff::new(tick),
            reported: BTreeSet::new(),
        }
    }

    /// One reconciliation at `now`: the writes that make the extender's rules what the caches
    /// want. `may_delete`: the pod cache holds every binding a previous binder may still land
    /// (`Readiness::pods_current`); until then a pool "no pod of ours holds" may hold one the
    /// cache has not seen, so rules are only created. Returns `(created, deleted)` pools.
    pub async fn reconcile(
        &mut self,
        cluster: &ClusterState,
        api: &dyn TaintRuleApi,
        metrics: &Metrics,
        may_delete: bool,
        now: Instant,
    ) -> (Vec<DevicePool>, Vec<DevicePool>) {
        let plan = cluster.dra_ownership_plan();
        let mut created = Vec::new();
        let mut deleted = Vec::new();
        let have: BTreeSet<&DevicePool> = plan.rules.keys().collect();
        let mut defaced = BTreeSet::new();
        for pool in plan.wanted.iter().filter(|p| !have.contains(p)) {
            let rule = rule_for(pool);
            let name: Arc<str> = Arc::from(rule.metadata.name.as_deref().unwrap_or_default());
            if plan.defaced.contains(&name) {
                // Its name is taken by a rule that is not ours by form any more: creating would
                // answer 409 every tick. Report it once; the pool stays not ours.
                if !self.reported.contains(&name) {
                    tracing::error!(%pool, rule = %name, "the extender's DeviceTaintRule was edited (its managed-by label, taint or selector changed): the pool's devices are not handed out until it is deleted, after which the extender writes it anew");
                }
                defaced.insert(name);
                continue;
            }
            if !self.backoff.ready(pool, now) {
                continue;
            }
            let result = api.create(&rule).await;
            count(metrics, "create", &result);
            match result {
                Ok(()) => {
                    tracing::info!(%pool, rule = %name, "DRA pool taken by the extender: DeviceTaintRule written; its devices are the extender's once the hand-over grace has passed");
                    self.backoff.succeeded(pool);
                    created.push(pool.clone());
                }
                Err(error) => {
                    let wait = self.backoff.failed(pool.clone(), now);
                    tracing::warn!(%pool, %error, retry_in = ?wait, "writing the extender's DeviceTaintRule failed; retried after a backoff")
                }
            }
        }
        for (pool, name) in plan.rules.iter().filter(|_| may_delete) {
            if plan.wanted.contains(pool) || plan.in_use.contains(pool) {
                continue;
            }
            if !self.backoff.ready(pool, now) {
                continue;
            }
            let result = api.delete(name).await;
            count(metrics, "delete", &result);
            match result {
                Ok(()) => {
                    tracing::info!(%pool, rule = %name, "DRA pool handed to DRA: no pod of the extender's holds its devices; DeviceTaintRule deleted");
                    self.backoff.succeeded(pool);
                    deleted.push(pool.clone());
                }
                Err(error) => {
                    let wait = self.backoff.failed(pool.clone(), now);
                    tracing::warn!(%pool, %error, retry_in = ?wait, "deleting the extender's DeviceTaintRule failed; retried after a backoff")
                }
            }
        }
        // A pool neither to create nor to delete any more waits for nothing.
        self.backoff.retain(|p| {
            (plan.wanted.contains(p) && !plan.rules.contains_key(p))
                || (plan.rules.contains_key(p) && !plan.wanted.contains(p))
        });
        self.reported = defaced;
        metrics.dra_taint_rules.set(plan.rules.len() as i64);
        metrics.dra_defaced_rules.set(self.reported.len() as i64);
        metrics
            .dra_taint_rule_backoff_pools
            .set(self.backoff.waiting(now) as i64);
        (created, deleted)
    }
}

fn count(metrics: &Metrics, op: &str, result: &Result<(), String>) {
    let outcome = if result.is_ok() { "ok" } else { "error" };
    metrics
        .dra_taint_rule_writes
        .with_label_values(&[op, outcome])
        .inc();
}

/// Reconciles every `interval` while this replica is the synced leader and DeviceTaintRules
/// are served, and recomputes the nodes whose pools came into the extender's hands on time.
pub async fn run(
    cluster: Arc<ClusterState>,
    readiness: Arc<Readiness>,
    api: Arc<dyn TaintRuleApi>,
    interval: Duration,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let mut next_effective: Option<SystemTime> = None;
    let mut reconciler = Reconciler::new(interval);
    loop {
        let wait = next_effective
            .and_then(|at| at.duration_since(SystemTime::now()).ok())
            .map_or(interval, |d| d.min(interval));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        next_effective = cluster.refresh_dra_ownership();
        if !readiness.is_enabled(Kind::DeviceTaintRules)
            || !readiness.is_leader()
            || !readiness.all_synced()
        {
            continue;
        }
        reconciler
            .reconcile(
                &cluster,
                api.as_ref(),
                &metrics,
                readiness.pods_current(),
                Instant::now(),
            )
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    /// Records the writes.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<String>>);

    impl TaintRuleApi for Recorded {
        fn create<'a>(&'a self, rule: &'a DeviceTaintRule) -> BoxFuture<'a, Result<(), String>> {
            let name = rule.metadata.name.clone().unwrap_or_default();
            Box::pin(async move {
                self.0.lock().push(format!("create {name}"));
                Ok(())
            })
        }
        fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), String>> {
            Box::pin(async move {
                self.0.lock().push(format!("delete {name}"));
                Ok(())
            })
        }
    }

    /// A node handed to DRA whose pool still carries the extender's rule, and no pod of ours
    /// seen there: the rule goes only once the pod cache is current.
    #[tokio::test]
    async fn no_rule_is_deleted_while_the_pod_cache_may_miss_a_binding() {
        use crate::cluster::dra::RuleRecord;
        let (cluster, pool, _) = one_gpu_pool(true);
        let rule = rule_for(&pool);
        let name = rule.metadata.name.clone().unwrap();
        cluster.set_device_taint_rule(&name, RuleRecord::from_rule(&rule));

        let api = Recorded::default();
        let metrics = Metrics::new();
        let mut r = Reconciler::new(Duration::from_secs(1));
        let now = Instant::now();
        let (created, deleted) = r.reconcile(&cluster, &api, &metrics, false, now).await;
        assert!(
            created.is_empty() && deleted.is_empty(),
            "{:?}",
            api.0.lock()
        );
        let (_, deleted) = r.reconcile(&cluster, &api, &metrics, true, now).await;
        assert_eq!(deleted, vec![pool]);
        assert_eq!(*api.0.lock(), vec![format!("delete {name}")]);
    }

    /// Trust IV §3: kubelet wipes the node's slices (every kubelet start, and 30 s after a
    /// driver deregisters) while a pod of ours holds minor 0. The rule stays, however often the
    /// slice goes and comes back; only when the pod is gone (and the pool no longer published)
    /// is it deleted. Before the fix the rule was deleted within a tick of the wipe.
    #[tokio::test]
    async fn a_slice_wipe_never_deletes_the_rule_under_a_pod_of_ours() {
        use crate::cluster::dra::RuleRecord;
        use crate::cluster::pod::PodRecord;
        let (cluster, pool, record) = one_gpu_pool(false);
        let rule = rule_for(&pool);
        let name = rule.metadata.name.clone().unwrap();
        cluster.set_device_taint_rule(&name, RuleRecord::from_rule(&rule));
        let pod: crate::model::pod::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "uid-p",
                "annotations": {"scheduling.koordinator.sh/device-allocated":
                    r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100","koordinator.sh/gpu-memory":"80Gi"}}]}"#}},
            "spec": {"nodeName": "n1"}
        }))
        .unwrap();
        let pod = PodRecord::from_pod(&pod).unwrap();
        cluster.upsert_pod(None, &pod);

        let api = Recorded::default();
        let metrics = Metrics::new();
        let mut r = Reconciler::new(Duration::from_secs(1));
        let now = Instant::now();
        for _ in 0..3 {
            cluster.set_resource_slice("s", None);
            let (created, deleted) = r.reconcile(&cluster, &api, &metrics, true, now).await;
            assert!(
                created.is_empty() && deleted.is_empty(),
                "{:?}",
                api.0.lock()
            );
            cluster.set_resource_slice("s", Some(record.clone()));
            let (created, deleted) = r.reconcile(&cluster, &api, &metrics, true, now).await;
            assert!(
                created.is_empty() && deleted.is_empty(),
                "{:?}",
                api.0.lock()
            );
        }
        // Wiped for good and the pod gone: nothing holds the pool, the rule goes.
        cluster.set_resource_slice("s", None);
        cluster.remove_pod(&pod);
        let (_, deleted) = r.reconcile(&cluster, &api, &metrics, true, now).await;
        assert_eq!(deleted, vec![pool]);
    }

    /// A recorder whose writes all fail.
    #[derive(Default)]
    struct Refused(Mutex<usize>);

    impl TaintRuleApi for Refused {
        fn create<'a>(&'a self, _: &'a DeviceTaintRule) -> BoxFuture<'a, Result<(), String>> {
            Box::pin(async move {
                *self.0.lock() += 1;
                Err("403 forbidden".to_string())
            })
        }
        fn delete<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), String>> {
            Box::pin(async move {
                *self.0.lock() += 1;
                Err("403 forbidden".to_string())
            })
        }
    }

    /// n1 (handed to DRA when `to_dra`) with one GPU that pool `d/n1` publishes (slice `s`,
    /// returned), ownership on with no grace, no rule yet.
    fn one_gpu_pool(to_dra: bool) -> (ClusterState, DevicePool, crate::cluster::dra::SliceRecord) {
        use crate::cluster::NodeRecord;
        use crate::cluster::dra::SliceRecord;
        let cluster = ClusterState::new();
        let labels = if to_dra {
            serde_json::json!({crate::model::dra::DEVICE_OWNER_LABEL: "dra"})
        } else {
            serde_json::json!({})
        };
        let node: crate::model::node::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "uid": "u", "labels": labels}
        }))
        .unwrap();
        cluster.set_node("n1", Some(NodeRecord::from_node(&node)));
        let device: crate::model::device::Device = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "spec": {"devices": [{"type": "gpu", "id": "GPU-a", "minor": 0, "health": true,
                "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100",
                              "koordinator.sh/gpu-memory": "80Gi"}}]}
        }))
        .unwrap();
        let (devices, _) = crate::cluster::devices::NodeDevices::from_device(&device);
        cluster.set_devices_shared("n1", Some(Arc::new(devices)));
        let slice: crate::model::dra::ResourceSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s"},
            "spec": {"driver": "d", "pool": {"name": "n1"}, "nodeName": "n1",
                     "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}}}]}
        }))
        .unwrap();
        let record = SliceRecord::from_slice(&slice).0;
        cluster.set_resource_slice("s", Some(record.clone()));
        cluster.set_dra_ownership(Some(Duration::ZERO));
        let pool = DevicePool {
            driver: Arc::from("d"),
            pool: Arc::from("n1"),
        };
        (cluster, pool, record)
    }

    /// Trust IV §9: someone removes the managed-by label from the extender's rule. It is no
    /// longer the extender's by form, but its name is: no create is sent (each answered 409,
    /// taken for success, every second, before), the pool stays not owned, and it is reported
    /// in the gauge. Deleted: written anew.
    #[tokio::test]
    async fn an_edited_rule_is_reported_never_recreated_in_a_loop() {
        let (cluster, pool, _) = one_gpu_pool(false);
        let mut rule = rule_for(&pool);
        let name = rule.metadata.name.clone().unwrap();
        rule.metadata.labels = None;
        assert!(crate::cluster::dra::RuleRecord::from_rule(&rule).is_none());
        cluster.set_defaced_taint_rule(&name, true);

        let api = Recorded::default();
        let metrics = Metrics::new();
        let mut r = Reconciler::new(Duration::from_secs(1));
        let now = Instant::now();
        for i in 0..5 {
            let (created, _) = r
                .reconcile(&cluster, &api, &metrics, true, now + Duration::from_secs(i))
                .await;
            assert!(created.is_empty(), "{:?}", api.0.lock());
        }
        assert!(api.0.lock().is_empty(), "{:?}", api.0.lock());
        assert_eq!(metrics.dra_defaced_rules.get(), 1);
        let n1 = cluster.node("n1").unwrap();
        assert!(
            !n1.read().device_ledger().dra_unowned().is_empty(),
            "the pool is not the extender's"
        );
        cluster.set_defaced_taint_rule(&name, false);
        let (created, _) = r.reconcile(&cluster, &api, &metrics, true, now).await;
        assert_eq!(created, vec![pool]);
        assert_eq!(metrics.dra_defaced_rules.get(), 0);
    }

    /// Trust IV §7 for rules: a refused create is retried after the tick, then 2, 4, … up to
    /// 30 s (one write per backoff, not one per tick), counted in the gauge.
    #[tokio::test]
    async fn a_refused_write_backs_off_per_pool() {
        let (cluster, _, _) = one_gpu_pool(false);
        let api = Refused::default();
        let metrics = Metrics::new();
        let mut r = Reconciler::new(Duration::from_secs(1));
        let t0 = Instant::now();
        // One tick a second for two minutes.
        for s in 0..120 {
            r.reconcile(&cluster, &api, &metrics, true, t0 + Duration::from_secs(s))
                .await;
        }
        // Attempts at 0, 1, 3, 7, 15, 31, 61, 91: 8, not 120.
        assert_eq!(*api.0.lock(), 8);
        assert_eq!(metrics.dra_taint_rule_backoff_pools.get(), 1);
    }

    #[test]
    fn a_pools_rule_has_one_name_whoever_writes_it() {
        let pool = DevicePool {
            driver: Arc::from("gpu.nvidia.com"),
            pool: Arc::from("node-a"),
        };
        let a = rule_for(&pool);
        let b = rule_for(&pool.clone());
        assert_eq!(a.metadata.name, b.metadata.name);
        let name = a.metadata.name.clone().unwrap();
        assert!(name.starts_with("dne-owned-") && name.len() == "dne-owned-".len() + 16);
        let other = rule_for(&DevicePool {
            driver: Arc::from("gpu.nvidia.com"),
            pool: Arc::from("node-b"),
        });
        assert_ne!(other.metadata.name, a.metadata.name);
        // What the watch reads back is the extender's rule for that pool.
        let back = crate::cluster::dra::RuleRecord::from_rule(&a).expect("ours");
        assert_eq!(back.pool, pool);
    }
}
