//! Wires the service together for `serve`: caches, readiness, the sync source (kube or a
//! cluster file), the binder, the HTTP server, and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::bind::{Binder, KubePodApi, OfflinePodApi, PodApi};
use crate::cli::ServeArgs;
use crate::cluster::ClusterState;
use crate::extender::{self, AppState, HttpConfig};
use crate::metrics::Metrics;
use crate::placement::device::score::ScoringConfig;
use crate::sync::file_source::ClusterFile;
use crate::sync::{self, Readiness, SyncContext};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    ClusterFile(#[from] sync::file_source::ClusterFileError),
    #[error("cannot load kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("cannot create the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid scoring flags: {0}")]
    Scoring(#[from] crate::placement::device::score::ScoringConfigError),
    #[error("invalid leader election flags: {0}")]
    LeaderElection(String),
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

async fn kube_client(args: &ServeArgs) -> Result<kube::Client, ServeError> {
    let config = match &args.kubeconfig {
        Some(path) => {
            // KUBECONFIG may list several files (`a:b`), merged in order as kubectl does.
            let mut merged: Option<kube::config::Kubeconfig> = None;
            for part in std::env::split_paths(path.as_os_str()) {
                if part.as_os_str().is_empty() {
                    continue;
                }
                let next = kube::config::Kubeconfig::read_from(&part)
                    .map_err(|e| ServeError::Kubeconfig(format!("{}: {e}", part.display())))?;
                merged = Some(match merged {
                    None => next,
                    Some(acc) => acc
                        .merge(next)
                        .map_err(|e| ServeError::Kubeconfig(format!("{}: {e}", part.display())))?,
                });
            }
            let kubeconfig = merged.ok_or_else(|| {
                ServeError::Kubeconfig(format!("{}: no kubeconfig file given", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| ServeError::Kubeconfig(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ServeError::Kubeconfig(e.to_string()))?,
    };
    Ok(kube::Client::try_from(config)?)
}

/// A signal future: SIGTERM or SIGINT.
pub async fn termination_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Runs the service until a termination signal: /readyz fails at once, the server keeps
/// answering for `--shutdown-delay`, then stops accepting and drains.
pub async fn serve(args: ServeArgs) -> Result<(), ServeError> {
    let service = Service::start(args, None).await?;
    termination_signal().await;
    service.shutdown().await
}

/// A running service: the HTTP server, sync tasks, leader election and housekeeping.
pub struct Service {
    /// The address actually bound (useful with port 0).
    pub addr: SocketAddr,
    pub state: AppState,
    shutdown: CancellationToken,
    shutdown_delay: std::time::Duration,
    server: tokio::task::JoinHandle<Result<(), ServeError>>,
    /// Leader election: stopped (and the lease released) only after the server drained.
    elector: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Service {
    /// Starts everything. `client` overrides `--kubeconfig` (tests pass an in-process client);
    /// `--cluster-file` takes precedence over both.
    pub async fn start(
        args: ServeArgs,
        client: Option<kube::Client>,
    ) -> Result<Service, ServeError> {
        if let Some(crate::leader::LeaderMode::Elect(config)) = args.leader_mode() {
            config.validate().map_err(ServeError::LeaderElection)?;
        }
        let metrics = Metrics::new();
        let cluster = Arc::new(ClusterState::new());
        let readiness = Readiness::new(sync::declared_kinds(), args.max_staleness, metrics.clone());
        let ctx = SyncContext {
            cluster: cluster.clone(),
            readiness: readiness.clone(),
            metrics: metrics.clone(),
        };
        let shutdown = CancellationToken::new();
        let scoring = Arc::new(ScoringConfig::from_flags(
            &args.score_strategy,
            args.score_weights.as_deref(),
        )?);

        let mut elector = None;
        let (pod_api, offline_file): (Arc<dyn PodApi>, Option<ClusterFile>) =
            match &args.cluster_file {
                Some(path) => {
                    let file = ClusterFile::load(path)?;
                    tracing::info!(
                        path = %path.display(),
                        nodes = file.nodes.len(),
                        pods = file.pods.len(),
                        devices = file.devices.len(),
                        topologies = file.topologies.len(),
                        "offline mode: serving from a cluster file"
                    );
                    (Arc::new(OfflinePodApi::new(file.pods.clone())), Some(file))
                }
                None => {
                    let client = match client {
                        Some(c) => c,
                        None => kube_client(&args).await?,
                    };
                    if let Some(mode) = args.leader_mode() {
                        // Not the leader until the first successful acquire.
                        readiness.set_leader(false);
                        let stop = CancellationToken::new();
                        let task = tokio::spawn(crate::leader::run(
                            client.clone(),
                            mode,
                            readiness.clone(),
                            stop.clone(),
                        ));
                        elector = Some((stop, task));
                    }
                    tokio::spawn(sync::run_kube(
                        ctx.clone(),
                        client.clone(),
                        args.insisted_kinds(),
                        shutdown.clone(),
                    ));
                    (Arc::new(KubePodApi::new(client)), None)
                }
            };

        let binder = Arc::new(Binder::new(
            pod_api,
            cluster.clone(),
            readiness.clone(),
            scoring.clone(),
            metrics.clone(),
        ));
        // Assumed allocations no pod watch confirmed (the bind's answer was lost and the pod
        // was never bound) would hold devices forever; drop them after --assume-ttl.
        {
            let binder = binder.clone();
            let ttl = args.assume_ttl;
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let period = (ttl / 4).clamp(
                    std::time::Duration::from_millis(100),
                    std::time::Duration::from_secs(10),
                );
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(period) => { binder.expire_assumed(ttl).await; }
                    }
                }
            });
        }
        let state = AppState {
            scoring,
            cluster: cluster.clone(),
            readiness: readiness.clone(),
            metrics: metrics.clone(),
            binder,
            body_limit: args.body_limit_bytes,
        };
        let http = HttpConfig {
            path_prefix: args.path_prefix.clone(),
            request_timeout: args.request_timeout,
            max_concurrency: args.max_concurrency,
        };
        let app = extender::router(state.clone(), &http);
        let listener =
            TcpListener::bind(args.listen)
                .await
                .map_err(|source| ServeError::Listen {
                    addr: args.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(ServeError::Serve)?;
        tracing::info!(%addr, prefix = %extender::normalize_prefix(&args.path_prefix), "serving");

        if let Some(file) = offline_file {
            // The same sync path as the watchers, after the listener is up so /readyz is
            // observable throughout.
            sync::run_file(&ctx, file);
        }

        let graceful = shutdown.clone();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { graceful.cancelled().await })
                .await
                .map_err(ServeError::Serve)
        });
        Ok(Service {
            addr,
            state,
            shutdown,
            shutdown_delay: args.shutdown_delay,
            server,
            elector,
        })
    }

    /// Fails /readyz, keeps serving for the shutdown delay, then stops and drains, and only
    /// then gives up the lease: a bind still in flight writes while we are the only leader,
    /// and the standby that takes over sees its result instead of allocating the same device.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        tracing::info!(delay = ?self.shutdown_delay, "termination requested: failing /readyz, then stopping");
        self.state.readiness.set_shutting_down();
        tokio::time::sleep(self.shutdown_delay).await;
        self.shutdown.cancel();
        let result = match self.server.await {
            Ok(r) => r,
            Err(e) => Err(ServeError::Serve(std::io::Error::other(e))),
        };
        if let Some((stop, task)) = self.elector {
            stop.cancel();
            let _ = task.await;
        }
        tracing::info!("stopped");
        result
    }
}
