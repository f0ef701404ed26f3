//! `inspect`: where the view comes from, and printing it.
//!
//! Every source ends in the service's own code: a cluster file is replayed through
//! [`crate::sync::run_file`] and a kubeconfig is listed once through the service's watchers and
//! handlers ([`crate::sync::list_kube_once`]), each into a fresh [`ClusterState`]; a running
//! service is asked for `GET /debug/nodes`, which serves [`crate::cluster::report::cluster_report`] of its
//! live caches. This module never parses API objects itself.

use std::io::{IsTerminal, Write};
use std::sync::Arc;

use super::OpsError;
use super::args::{InspectArgs, InspectFormat};
use super::{pending, render};
use crate::cluster::ClusterState;
use crate::cluster::report::ClusterReport;
use crate::metrics::Metrics;
use crate::model::pod::Pod;
use crate::scheduler::bind::{OfflinePodApi, PodApi};
use crate::scheduler::{Scheduler, ScoringConfig};
use crate::sync::Kind;
use crate::sync::file_source::{ClusterFile, fill_identity};
use crate::sync::{self, Readiness, SyncContext};

/// Caches filled by one of the offline sources.
pub struct Loaded {
    pub cluster: Arc<ClusterState>,
    pub readiness: Arc<Readiness>,
    pub metrics: Metrics,
}

impl Loaded {
    fn new() -> Self {
        let metrics = Metrics::new();
        Loaded {
            cluster: Arc::new(ClusterState::new()),
            readiness: Readiness::new(sync::declared_kinds(), None, metrics.clone()),
            metrics,
        }
    }

    /// The offline tools report a DeviceClass that maps a managed name to DRA (metrics, log)
    /// but decide anyway: they show what the service would, which the flag makes ready.
    /// `dra_ownership` as `serve` would enforce it on the same source (trust IV §11: a node
    /// handed to DRA, or a pool whose rule is not in effect, refuses in `inspect` as in
    /// `filter`).
    pub fn context(&self, dra_ownership: Option<std::time::Duration>) -> SyncContext {
        SyncContext {
            cluster: self.cluster.clone(),
            readiness: self.readiness.clone(),
            metrics: self.metrics.clone(),
            allow_dra_extended: true,
            dra_ownership,
            taint_rule_version: Default::default(),
        }
    }

    /// The scheduling core over these caches, binding through `api` (`simulate`, and tests
    /// that drive the verbs without a server).
    pub fn into_scheduler(self, api: Arc<dyn PodApi>, scoring: ScoringConfig) -> Scheduler {
        Scheduler::new(
            self.cluster,
            self.readiness,
            self.metrics,
            api,
            scoring,
            Default::default(),
        )
    }
}

/// A parsed cluster file replayed through the service's file sync.
pub fn load_cluster_file(file: ClusterFile) -> Loaded {
    let loaded = Loaded::new();
    // `serve --cluster-file` enforces no ownership either (no rule can be written there).
    sync::run_file(&loaded.context(None), file);
    loaded
}

/// One list of every kind through the service's watchers and handlers (no watch).
pub async fn load_kube(client: &kube::Client) -> Result<Loaded, OpsError> {
    let loaded = Loaded::new();
    // `serve`'s defaults: `--dra-ownership` on, `--dra-handover-grace 30s`.
    let ownership = Some(std::time::Duration::from_secs(30));
    sync::list_kube_once(&loaded.context(ownership), client, &Default::default())
        .await
        .map_err(OpsError::List)?;
    Ok(loaded)
}

/// The view a running service serves at `GET /debug/nodes`.
pub async fn fetch_server(url: &str, nodes: &[String]) -> Result<ClusterReport, OpsError> {
    let server = |message: String| OpsError::Server {
        url: url.to_string(),
        message,
    };
    let uri: http::Uri = url.parse().map_err(|e| server(format!("not a URL: {e}")))?;
    // kube's client is already in the binary: plain HTTP or HTTPS to any URL, no auth.
    let client =
        kube::Client::try_from(kube::Config::new(uri)).map_err(|e| server(e.to_string()))?;
    let mut path = "/debug/nodes".to_string();
    if !nodes.is_empty() {
        path.push_str("?nodes=");
        path.push_str(&nodes.join(","));
    }
    let request = http::Request::get(path)
        .body(kube::client::Body::from(Vec::new()))
        .map_err(|e| server(e.to_string()))?;
    let response = client
        .send(request)
        .await
        .map_err(|e| server(e.to_string()))?;
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map_err(|e| server(format!("reading the answer: {e}")))?
        .to_bytes();
    if !status.is_success() {
        // The service answers errors as `{"error": "..."}`; show that, not the raw body.
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error")?.as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        return Err(server(format!("{status}: {message}")));
    }
    serde_json::from_slice(&body).map_err(|e| server(format!("unexpected answer: {e}")))
}

/// The view for `args`' source, restricted to `args.nodes`.
pub async fn view(args: &InspectArgs) -> Result<ClusterReport, OpsError> {
    if let Some(url) = &args.server {
        return fetch_server(url, &args.nodes).await;
    }
    let loaded = match &args.cluster_file {
        Some(path) => load_cluster_file(ClusterFile::load(path)?),
        None => {
            let client = crate::sync::client::kube_client_from(args.kubeconfig.as_deref())
                .await
                .map_err(|e| OpsError::Client(e.to_string()))?;
            load_kube(&client).await?
        }
    };
    select(&loaded.cluster, &args.nodes)
}

/// The view of `nodes` (all when empty); naming a node the caches do not hold is an error.
pub fn select(cluster: &ClusterState, nodes: &[String]) -> Result<ClusterReport, OpsError> {
    crate::cluster::report::select(cluster, nodes).map_err(OpsError::UnknownNodes)
}

/// Colour only for a terminal, and never with `NO_COLOR` set (<https://no-color.org>).
pub fn use_color(stream_is_terminal: bool) -> bool {
    stream_is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Renders `view` in `format`.
pub fn render(
    view: &ClusterReport,
    format: InspectFormat,
    color: bool,
) -> Result<String, OpsError> {
    match format {
        InspectFormat::Json => {
            let mut s =
                serde_json::to_string_pretty(view).map_err(|e| OpsError::Encode(e.to_string()))?;
            s.push('\n');
            Ok(s)
        }
        InspectFormat::Table => Ok(render::cluster(view, false, color)),
        InspectFormat::Wide => Ok(render::cluster(view, true, color)),
    }
}

/// The cluster's caches and every pod object, for `inspect --pod`: the pods of the cluster
/// file or the cluster, and those of `--pods`.
async fn load_with_pods(args: &InspectArgs) -> Result<(Loaded, Vec<Pod>), OpsError> {
    let (loaded, mut pods) = match &args.cluster_file {
        Some(path) => {
            let file = ClusterFile::load(path)?;
            let pods = file.pods.clone();
            (load_cluster_file(file), pods)
        }
        None => {
            let client = crate::sync::client::kube_client_from(args.kubeconfig.as_deref())
                .await
                .map_err(|e| OpsError::Client(e.to_string()))?;
            let loaded = load_kube(&client).await?;
            (loaded, list_pods(client).await?)
        }
    };
    if let Some(path) = &args.pods {
        pods.extend(ClusterFile::load(path)?.pods);
    }
    // The identity the file sync gives a cluster file's pods (API pods have theirs).
    for p in &mut pods {
        fill_identity(&mut p.metadata, Kind::Pods);
    }
    Ok((loaded, pods))
}

/// Every pod of the cluster, in pages of 500 as the service's own lists are read (one unpaged
/// list of a large cluster is one huge answer the API server must build at once).
async fn list_pods(client: kube::Client) -> Result<Vec<Pod>, OpsError> {
    let api = kube::Api::<Pod>::all(client);
    let mut pods = Vec::new();
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| OpsError::List(e.to_string()))?;
        pods.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(pods),
        }
    }
}

/// `inspect --pod NAMESPACE/NAME`.
async fn run_pod(args: &InspectArgs, key: &str) -> Result<String, OpsError> {
    let error = |message: &str| OpsError::Pod {
        key: key.to_string(),
        message: message.to_string(),
    };
    let (ns, name) = key
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        .ok_or_else(|| error("expected NAMESPACE/NAME"))?;
    let (loaded, pods) = load_with_pods(args).await?;
    let pod = pods
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref().unwrap_or("default") == ns
                && p.metadata.name.as_deref() == Some(name)
        })
        .cloned()
        .ok_or_else(|| error("no such pod in the cluster (or in --pods)"))?;
    let api = Arc::new(OfflinePodApi::new(pods.iter().cloned()));
    let mut state = loaded.into_scheduler(api, ScoringConfig::default());
    state.share_totals = args.gpu_share_totals;
    state
        .cluster
        .set_deviceless_untrusted(args.gpu_share_totals.deviceless_untrusted());
    let found = pending::inspect_pod(&state, &pod, &pods);
    match args.output {
        InspectFormat::Json => {
            let mut s = serde_json::to_string_pretty(&found)
                .map_err(|e| OpsError::Encode(e.to_string()))?;
            s.push('\n');
            Ok(s)
        }
        InspectFormat::Table | InspectFormat::Wide => Ok(pending::render(&found)),
    }
}

/// The `inspect` command.
pub async fn run(args: InspectArgs) -> Result<(), OpsError> {
    if let Some(key) = &args.pod {
        let out = run_pod(&args, key).await?;
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(out.as_bytes()).map_err(OpsError::Io)?;
        return stdout.flush().map_err(OpsError::Io);
    }
    let view = view(&args).await?;
    let out = render(
        &view,
        args.output,
        use_color(std::io::stdout().is_terminal()),
    )?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes()).map_err(OpsError::Io)?;
    stdout.flush().map_err(OpsError::Io)
}
