//! The kube source: API discovery for the optional CRDs, then one kube-runtime watcher per
//! kind, each consumed in order by one task that feeds that kind's [`KindSync`].
//!
//! Watch errors are logged, counted and retried with kube's default backoff; they never end
//! the task. Only shutdown does.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::kind::{Kind, SyncEvent};
use super::readiness::Requirement;
use super::store::{Handler, KindSync};
use crate::model::dra::TaintRuleVersion;
use crate::model::nrt::NrtVersion;

/// Field selector for the pods that hold resources: assigned and not terminal. It is the one
/// kube-scheduler's own pod informer uses for assigned pods.
pub const ASSIGNED_POD_SELECTOR: &str =
    "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed";

/// Field selector for pending pods kube-scheduler nominated to a node (preemptors): not
/// assigned, not terminal, `status.nominatedNodeName` set (a selectable pod field since
/// Kubernetes 1.9). Outside preemption it matches nothing, so this watch costs ~nothing.
pub const NOMINATED_POD_SELECTOR: &str =
    "spec.nodeName=,status.nominatedNodeName!=,status.phase!=Succeeded,status.phase!=Failed";

pub const DEVICE_API_VERSION: &str = "scheduling.koordinator.sh/v1alpha1";

/// What discovery decided: each kind's requirement, and which NRT and DeviceTaintRule
/// versions to watch.
#[derive(Debug, Clone)]
pub struct Discovered {
    pub requirements: BTreeMap<Kind, Requirement>,
    pub nrt_version: NrtVersion,
    pub taint_rule_version: TaintRuleVersion,
}

async fn served(client: &Client, api_version: &str, plural: &str) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(api_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == plural)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Checks which optional CRDs are served; retries transient errors until shutdown.
pub async fn discover(
    client: &Client,
    insisted: &BTreeSet<Kind>,
    shutdown: &CancellationToken,
) -> Option<Discovered> {
    let mut delay = Duration::from_millis(500);
    loop {
        match try_discover(client, insisted).await {
            Ok(d) => {
                log_unwatched(&d);
                return Some(d);
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?delay, "API discovery failed");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// One discovery round, no retry (`inspect --kubeconfig` fails fast instead).
pub async fn try_discover(
    client: &Client,
    insisted: &BTreeSet<Kind>,
) -> Result<Discovered, kube::Error> {
    let mut requirements = BTreeMap::new();
    requirements.insert(Kind::Nodes, Requirement::Required);
    requirements.insert(Kind::Pods, Requirement::Required);
    requirements.insert(Kind::NominatedPods, Requirement::Required);
    requirements.insert(Kind::PodDisruptionBudgets, Requirement::Required);

    let devices = served(client, DEVICE_API_VERSION, "devices").await?;
    requirements.insert(
        Kind::Devices,
        requirement(
            Kind::Devices,
            devices,
            insisted,
            "devices.scheduling.koordinator.sh/v1alpha1 is not served",
        ),
    );

    let mut nrt_version = NrtVersion::V1alpha2;
    let mut nrt = served(
        client,
        &NrtVersion::V1alpha2.api_version(),
        "noderesourcetopologies",
    )
    .await?;
    if !nrt {
        nrt = served(
            client,
            &NrtVersion::V1alpha1.api_version(),
            "noderesourcetopologies",
        )
        .await?;
        if nrt {
            nrt_version = NrtVersion::V1alpha1;
        }
    }
    requirements.insert(
        Kind::NodeResourceTopologies,
        requirement(
            Kind::NodeResourceTopologies,
            nrt,
            insisted,
            "noderesourcetopologies.topology.node.k8s.io (v1alpha2 or v1alpha1) is not served",
        ),
    );
    // DRA: the three kinds together, at the GA version (Kubernetes 1.34+). Older clusters (or
    // the beta versions alone) mean no DRA allocator the extender could meet on v1 objects.
    // One discovery call for the group's four kinds.
    let dra = match client
        .list_api_group_resources(crate::model::dra::DRA_API_VERSION)
        .await
    {
        Ok(list) => list.resources.into_iter().map(|r| r.name).collect(),
        Err(kube::Error::Api(status)) if status.code == 404 => BTreeSet::new(),
        Err(e) => return Err(e),
    };
    for (kind, plural) in [
        (Kind::DeviceClasses, "deviceclasses"),
        (Kind::ResourceSlices, "resourceslices"),
        (Kind::ResourceClaims, "resourceclaims"),
    ] {
        let served = dra.contains(plural);
        requirements.insert(
            kind,
            requirement(
                kind,
                served,
                insisted,
                &format!("{plural}.resource.k8s.io/v1 is not served"),
            ),
        );
    }
    // DeviceTaintRule reached v1 a release after the other kinds: 1.34 and 1.35 serve it at
    // v1alpha3 (gate off by default), 1.36 at v1beta2. Any served version is spoken; with none
    // the extender still keeps off every device a DRA driver publishes (`cluster::dra`), and
    // `/readyz` says so.
    let mut taint_rule_version = TaintRuleVersion::V1;
    let mut taint_rules = dra.contains("devicetaintrules");
    for version in &TaintRuleVersion::ALL[1..] {
        if taint_rules {
            break;
        }
        if served(client, &version.api_version(), "devicetaintrules").await? {
            taint_rules = true;
            taint_rule_version = *version;
        }
    }
    requirements.insert(
        Kind::DeviceTaintRules,
        requirement(
            Kind::DeviceTaintRules,
            taint_rules,
            insisted,
            "devicetaintrules.resource.k8s.io is not served at v1, v1beta2 or v1alpha3 (before 1.37 an alpha or off-by-default beta API: gate DRADeviceTaintRules)",
        ),
    );
    Ok(Discovered {
        requirements,
        nrt_version,
        taint_rule_version,
    })
}

fn requirement(kind: Kind, served: bool, insisted: &BTreeSet<Kind>, why: &str) -> Requirement {
    if served {
        Requirement::Required
    } else if insisted.contains(&kind) {
        Requirement::Unavailable {
            reason: why.to_string(),
        }
    } else {
        Requirement::Disabled {
            reason: format!("{why}; disabled: {}", kind.features()),
        }
    }
}

/// Logs what discovery decided for kinds that are not watched (once, at startup: the
/// periodic rediscovery stays quiet until a CRD appears).
fn log_unwatched(discovered: &Discovered) {
    for (kind, requirement) in &discovered.requirements {
        match requirement {
            Requirement::Unavailable { reason } => {
                tracing::error!(%kind, %reason, "required kind is not served; /readyz will keep failing until its CRD is served")
            }
            Requirement::Disabled { reason } => {
                tracing::warn!(%kind, %reason, "optional kind disabled until its CRD is served")
            }
            _ => {}
        }
    }
}

fn convert<K>(event: watcher::Event<K>) -> SyncEvent<K> {
    match event {
        watcher::Event::Init => SyncEvent::Init,
        watcher::Event::InitApply(o) => SyncEvent::InitApply(o),
        watcher::Event::InitDone => SyncEvent::InitDone,
        watcher::Event::Apply(o) => SyncEvent::Apply(o),
        watcher::Event::Delete(o) => SyncEvent::Delete(o),
    }
}

/// How long a watcher runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchMode {
    /// The service: list, then watch until shutdown, retrying errors with backoff.
    Follow,
    /// One-shot tools (`inspect --kubeconfig`): the same list through the same sync, stopping
    /// at the first `InitDone`, before any watch is opened; the first error ends it.
    ListOnce,
}

/// Spacing of requested restarts (see `run_watcher`): doubling from the minimum while they
/// come within [`RESTART_QUIET`] of each other.
const RESTART_DELAY_MIN: std::time::Duration = std::time::Duration::from_millis(500);
const RESTART_DELAY_MAX: std::time::Duration = std::time::Duration::from_secs(30);
const RESTART_QUIET: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs one kind's watcher into its sync until shutdown (or, with [`WatchMode::ListOnce`],
/// until its first list is applied). Only `ListOnce` returns an error.
pub async fn run_watcher<H>(
    mut sync: KindSync<H>,
    api: Api<H::Object>,
    config: watcher::Config,
    mode: WatchMode,
    shutdown: CancellationToken,
) -> Result<(), String>
where
    H: Handler,
    H::Object: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    <H::Object as Resource>::DynamicType: Clone + Default + Eq + std::hash::Hash + Send + Sync,
{
    let readiness = sync.readiness().clone();
    let start = || {
        let stream = watcher(api.clone(), config.clone());
        match mode {
            WatchMode::Follow => stream.default_backoff().boxed(),
            WatchMode::ListOnce => stream.boxed(),
        }
    };
    let mut stream = start();
    // A fresh watcher starts with a fresh backoff, so restarts are spaced out themselves:
    // a watch that fails right after every successful list must not turn into a hot
    // list-restart loop. Back to the shortest delay after a quiet period.
    let mut restart_delay = RESTART_DELAY_MIN;
    let mut last_restart: Option<tokio::time::Instant> = None;
    loop {
        let item = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = readiness.restart_requested(H::KIND) => {
                let now = tokio::time::Instant::now();
                match last_restart {
                    Some(at) if now.duration_since(at) < RESTART_QUIET => {
                        let wait = restart_delay.saturating_sub(now.duration_since(at));
                        restart_delay = (restart_delay * 2).min(RESTART_DELAY_MAX);
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                    _ => restart_delay = RESTART_DELAY_MIN,
                }
                // A fresh watcher begins with a full list: the relist the fence waits for.
                tracing::info!(kind = %H::KIND, "restarting the watch with a fresh list");
                stream = start();
                last_restart = Some(tokio::time::Instant::now());
                continue;
            }
            item = stream.next() => item,
        };
        match item {
            Some(Ok(event)) => {
                let done = matches!(event, watcher::Event::InitDone);
                sync.handle(convert(event));
                if done && mode == WatchMode::ListOnce {
                    break;
                }
            }
            Some(Err(error)) => {
                if mode == WatchMode::ListOnce {
                    return Err(format!("listing {}: {error}", H::KIND));
                }
                tracing::warn!(kind = %H::KIND, %error, "watch error; retrying with backoff");
                readiness.on_error(H::KIND, error.to_string());
            }
            None => break,
        }
    }
    tracing::debug!(kind = %H::KIND, "watcher stopped");
    Ok(())
}
