//! Force-synced bootstrap: sources (kube watchers, or a cluster file) feed one ordered stream
//! per kind into buffer-and-diff ([`store`]), whose handlers ([`handlers`]) apply to the
//! caches, and [`readiness`] records when every required kind has applied its first list.

pub(crate) mod client;
pub(crate) mod dra;
pub mod file_source;
pub(crate) mod handlers;
pub(crate) mod kind;
pub mod kube_source;
pub(crate) mod readiness;
pub(crate) mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use kind::{Kind, SyncEvent};
pub use readiness::{Readiness, Requirement};

use crate::cluster::ClusterState;
use crate::metrics::Metrics;
use dra::{DeviceClassHandler, DeviceTaintRuleHandler, ResourceClaimHandler, ResourceSliceHandler};
use file_source::{ClusterFile, fill_identity};
use handlers::{
    BudgetHandler, DeviceHandler, NodeHandler, NominationHandler, PodHandler, TopologyHandler,
};
use kube_source::WatchMode;
use store::KindSync;

/// The kinds declared at startup: every kind, with the optional ones awaiting discovery.
pub fn declared_kinds() -> BTreeMap<Kind, Requirement> {
    Kind::ALL
        .into_iter()
        .map(|k| {
            let r = if k.is_optional() {
                Requirement::Discovering
            } else {
                Requirement::Required
            };
            (k, r)
        })
        .collect()
}

/// Everything a sync task needs.
#[derive(Clone)]
pub struct SyncContext {
    pub cluster: Arc<ClusterState>,
    pub readiness: Arc<Readiness>,
    pub metrics: Metrics,
    /// `--allow-dra-extended-resources` (see `sync::dra`).
    pub allow_dra_extended: bool,
    /// `--dra-ownership` on: its hand-over grace (`--dra-handover-grace`); enforced from
    /// discovery on, DeviceTaintRules served or not (see `scheduler::dra_owner`): without
    /// them no pool is ever the extender's, so a device a DRA driver publishes is never
    /// handed out.
    pub dra_ownership: Option<Duration>,
    /// The DeviceTaintRule version discovery found served (`scheduler::dra_owner` writes at
    /// it).
    pub taint_rule_version: Arc<parking_lot::RwLock<crate::model::dra::TaintRuleVersion>>,
}

impl SyncContext {
    fn sync<H: store::Handler>(&self, handler: H) -> KindSync<H> {
        KindSync::new(handler, self.readiness.clone(), self.metrics.clone())
    }

    fn device_class_handler(&self) -> DeviceClassHandler {
        DeviceClassHandler::new(
            self.cluster.clone(),
            self.readiness.clone(),
            self.metrics.clone(),
            self.allow_dra_extended,
        )
    }
}

/// Discovers the optional CRDs, then runs one watcher task per required kind until shutdown.
///
/// An optional kind whose CRD is not served at startup is looked for again every
/// `rediscover` : when its CRD appears, its watcher starts and `/readyz` waits for
/// its first list as at startup. A CRD removed while running keeps its kind's last state: the
/// watch fails, is retried and counted (`dne_watch_errors_total`), and `--max-staleness`
/// fails readiness if set.
pub async fn run_kube(
    ctx: SyncContext,
    client: Client,
    insisted: BTreeSet<Kind>,
    rediscover: Duration,
    shutdown: CancellationToken,
) {
    let Some(discovered) = kube_source::discover(&client, &insisted, &shutdown).await else {
        return;
    };
    let rediscover = Rediscover {
        every: rediscover,
        insisted,
    };
    let _ = run_kinds(
        &ctx,
        &client,
        &discovered,
        WatchMode::Follow,
        Some(rediscover),
        shutdown,
    )
    .await;
}

/// Looking again for optional CRDs that were not served.
struct Rediscover {
    every: Duration,
    insisted: BTreeSet<Kind>,
}

/// One list of each kind through the very same watchers, sync and handlers as the service,
/// stopping once every kind's list is applied (no watch): what `inspect --kubeconfig` shows is
/// what a service bootstrapping now would hold. Fails on the first API error.
pub async fn list_kube_once(
    ctx: &SyncContext,
    client: &Client,
    insisted: &BTreeSet<Kind>,
) -> Result<(), String> {
    let discovered = kube_source::try_discover(client, insisted)
        .await
        .map_err(|e| format!("API discovery failed: {e}"))?;
    run_kinds(
        ctx,
        client,
        &discovered,
        WatchMode::ListOnce,
        None,
        CancellationToken::new(),
    )
    .await
}

async fn run_kinds(
    ctx: &SyncContext,
    client: &Client,
    discovered: &kube_source::Discovered,
    mode: WatchMode,
    rediscover: Option<Rediscover>,
    shutdown: CancellationToken,
) -> Result<(), String> {
    for (kind, requirement) in &discovered.requirements {
        ctx.readiness.set_requirement(*kind, requirement.clone());
    }
    // Enforced whether DeviceTaintRules are served or not: with no rule, no pool is the
    // extender's (a cluster on 1.34-1.35 without the gate keeps its DRA devices DRA's).
    ctx.cluster.set_dra_ownership(ctx.dra_ownership);
    let enabled = |k: Kind| matches!(discovered.requirements.get(&k), Some(Requirement::Required));
    let mut tasks = JoinSet::new();
    let mut watching = BTreeSet::new();
    for kind in Kind::ALL {
        if enabled(kind) {
            spawn_watcher(&mut tasks, ctx, client, discovered, kind, mode, &shutdown);
            watching.insert(kind);
        }
    }
    let mut rediscover = rediscover.filter(|_| watching.len() < Kind::ALL.len());
    loop {
        let tick = async {
            match &rediscover {
                Some(r) => tokio::time::sleep(r.every).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            joined = tasks.join_next() => match joined {
                None => return Ok(()),
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => return Err(e),
                Some(Err(join)) => return Err(format!("sync task failed: {join}")),
            },
            _ = tick => {
                let Some(r) = &rediscover else { continue };
                // Errors are retried at the next tick; the kinds already watched go on.
                let Ok(found) = kube_source::try_discover(client, &r.insisted).await else {
                    continue;
                };
                for kind in Kind::ALL {
                    if watching.contains(&kind)
                        || !matches!(found.requirements.get(&kind), Some(Requirement::Required))
                    {
                        continue;
                    }
                    tracing::info!(%kind, "its CRD is served now: watching it; /readyz waits for its first list");
                    ctx.readiness.set_requirement(kind, Requirement::Required);
                    spawn_watcher(&mut tasks, ctx, client, &found, kind, mode, &shutdown);
                    watching.insert(kind);
                }
                if watching.len() == Kind::ALL.len() {
                    rediscover = None;
                }
            }
        }
    }
}

/// Starts `kind`'s watcher in `tasks`.
fn spawn_watcher(
    tasks: &mut JoinSet<Result<(), String>>,
    ctx: &SyncContext,
    client: &Client,
    discovered: &kube_source::Discovered,
    kind: Kind,
    mode: WatchMode,
    shutdown: &CancellationToken,
) {
    match kind {
        Kind::Nodes => tasks.spawn(kube_source::run_watcher(
            ctx.sync(NodeHandler(ctx.cluster.clone())),
            Api::all(client.clone()),
            watcher::Config::default(),
            mode,
            shutdown.clone(),
        )),
        Kind::Pods => tasks.spawn(kube_source::run_watcher(
            ctx.sync(PodHandler::new(ctx.cluster.clone(), ctx.metrics.clone())),
            Api::all(client.clone()),
            // Keep the default ListWatch strategy and MostRecent (consistent) lists: releasing
            // assumed entries at InitDone relies on both (see `cluster::assumed`).
            watcher::Config::default().fields(kube_source::ASSIGNED_POD_SELECTOR),
            mode,
            shutdown.clone(),
        )),
        Kind::NominatedPods => tasks.spawn(kube_source::run_watcher(
            ctx.sync(NominationHandler(ctx.cluster.clone())),
            Api::all(client.clone()),
            watcher::Config::default().fields(kube_source::NOMINATED_POD_SELECTOR),
            mode,
            shutdown.clone(),
        )),
        Kind::PodDisruptionBudgets => tasks.spawn(kube_source::run_watcher(
            ctx.sync(BudgetHandler(ctx.cluster.clone())),
            Api::all(client.clone()),
            watcher::Config::default(),
            mode,
            shutdown.clone(),
        )),
        Kind::Devices => tasks.spawn(kube_source::run_watcher(
            ctx.sync(DeviceHandler::new(ctx.cluster.clone(), ctx.metrics.clone())),
            Api::all(client.clone()),
            watcher::Config::default(),
            mode,
            shutdown.clone(),
        )),
        Kind::NodeResourceTopologies => tasks.spawn(kube_source::run_watcher(
            ctx.sync(TopologyHandler::new(
                ctx.cluster.clone(),
                ctx.metrics.clone(),
            )),
            Api::all_with(client.clone(), &discovered.nrt_version),
            watcher::Config::default(),
            mode,
            shutdown.clone(),
        )),
        Kind::DeviceTaintRules => {
            // Enforced from discovery on (`run_kinds`): until the first list is applied the
            // node's pools are not owned, and readiness waits for that list anyway.
            *ctx.taint_rule_version.write() = discovered.taint_rule_version;
            tasks.spawn(kube_source::run_watcher(
                ctx.sync(DeviceTaintRuleHandler::new(
                    ctx.cluster.clone(),
                    ctx.metrics.clone(),
                )),
                Api::all_with(client.clone(), &discovered.taint_rule_version),
                watcher::Config::default(),
                mode,
                shutdown.clone(),
            ))
        }
        Kind::DeviceClasses => tasks.spawn(kube_source::run_watcher(
            ctx.sync(ctx.device_class_handler()),
            Api::all(client.clone()),
            watcher::Config::default(),
            mode,
            shutdown.clone(),
        )),
        Kind::ResourceSlices => tasks.spawn(kube_source::run_watcher(
            ctx.sync(ResourceSliceHandler::new(
                ctx.cluster.clone(),
                ctx.metrics.clone(),
            )),
            Api::all(client.clone()),
            watcher::Config::default(),
            mode,
            shutdown.clone(),
        )),
        Kind::ResourceClaims => tasks.spawn(kube_source::run_watcher(
            ctx.sync(ResourceClaimHandler::new(
                ctx.cluster.clone(),
                ctx.metrics.clone(),
            )),
            Api::all(client.clone()),
            watcher::Config::default(),
            mode,
            shutdown.clone(),
        )),
    };
}

/// Replays a cluster file through the same sync path. Every kind is required offline: the
/// file *is* the cluster, and a kind with no objects is simply an empty list.
pub fn run_file(ctx: &SyncContext, file: ClusterFile) {
    for kind in Kind::ALL {
        ctx.readiness.set_requirement(kind, Requirement::Required);
    }
    fn replay<H: store::Handler>(mut sync: KindSync<H>, objects: Vec<H::Object>) {
        sync.handle(SyncEvent::Init);
        for o in objects {
            sync.handle(SyncEvent::InitApply(o));
        }
        sync.handle(SyncEvent::InitDone);
    }
    let ClusterFile {
        mut nodes,
        mut pods,
        devices,
        mut topologies,
        mut device_classes,
        mut resource_slices,
        mut resource_claims,
        mut device_taint_rules,
        mut disruption_budgets,
        ignored,
    } = file;
    if ignored > 0 {
        tracing::info!(
            ignored,
            "cluster file: ignoring documents of kinds this service does not watch"
        );
    }
    for n in &mut nodes {
        fill_identity(&mut n.metadata, Kind::Nodes);
    }
    for p in &mut pods {
        fill_identity(&mut p.metadata, Kind::Pods);
    }
    for t in &mut topologies {
        fill_identity(&mut t.metadata, Kind::NodeResourceTopologies);
    }
    for c in &mut device_classes {
        fill_identity(&mut c.metadata, Kind::DeviceClasses);
    }
    for s in &mut resource_slices {
        fill_identity(&mut s.metadata, Kind::ResourceSlices);
    }
    for c in &mut resource_claims {
        fill_identity(&mut c.metadata, Kind::ResourceClaims);
    }
    for r in &mut device_taint_rules {
        fill_identity(&mut r.metadata, Kind::DeviceTaintRules);
    }
    for b in &mut disruption_budgets {
        fill_identity(&mut b.metadata, Kind::PodDisruptionBudgets);
    }
    // Only assigned, non-terminal pods go through the pod sync, and only pending nominated
    // ones through the nominations, as with the live selectors.
    let (assigned, pending): (Vec<_>, Vec<_>) = pods
        .into_iter()
        .filter(|p| !p.is_terminal())
        .partition(|p| p.node_name().is_some());
    let nominated: Vec<_> = pending
        .into_iter()
        .filter(|p| {
            p.status
                .nominated_node_name
                .as_deref()
                .is_some_and(|n| !n.is_empty())
        })
        .collect();
    let device_handler = DeviceHandler::new(ctx.cluster.clone(), ctx.metrics.clone());
    let devices = device_handler.decode_values(devices);
    replay(ctx.sync(NodeHandler(ctx.cluster.clone())), nodes);
    replay(ctx.sync(device_handler), devices);
    replay(
        ctx.sync(TopologyHandler::new(
            ctx.cluster.clone(),
            ctx.metrics.clone(),
        )),
        topologies,
    );
    // DRA before pods, as devices are: the ledgers know what claims hold when pods arrive.
    replay(ctx.sync(ctx.device_class_handler()), device_classes);
    // Offline nothing writes rules: ownership is not enforced, the file's rules are recorded.
    replay(
        ctx.sync(DeviceTaintRuleHandler::new(
            ctx.cluster.clone(),
            ctx.metrics.clone(),
        )),
        device_taint_rules,
    );
    replay(
        ctx.sync(ResourceSliceHandler::new(
            ctx.cluster.clone(),
            ctx.metrics.clone(),
        )),
        resource_slices,
    );
    replay(
        ctx.sync(ResourceClaimHandler::new(
            ctx.cluster.clone(),
            ctx.metrics.clone(),
        )),
        resource_claims,
    );
    replay(
        ctx.sync(PodHandler::new(ctx.cluster.clone(), ctx.metrics.clone())),
        assigned,
    );
    replay(ctx.sync(NominationHandler(ctx.cluster.clone())), nominated);
    replay(
        ctx.sync(BudgetHandler(ctx.cluster.clone())),
        disruption_budgets,
    );
}
