//! Wires the service together for `serve`: caches, readiness, the sync source (kube or a
//! cluster file), the binder, the HTTP listeners (verbs, optionally over TLS with client
//! certificates; probes on their own port when asked), and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cli::ServeArgs;
use crate::cluster::ClusterState;
use crate::extender::listener::{self, Listener};
use crate::extender::tls::{TlsError, TlsReloader};
use crate::extender::{self, AppState, HttpConfig};
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;
use crate::scheduler::bind::{KubePodApi, OfflinePodApi, PodApi};
use crate::sync::file_source::ClusterFile;
use crate::sync::{self, Readiness, SyncContext};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    ClusterFile(#[from] sync::file_source::ClusterFileError),
    #[error("cannot load kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("cannot register metrics: {0}")]
    Metrics(String),
    #[error("cannot create the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid scoring flags: {0}")]
    Scoring(#[from] crate::scheduler::ScoringError),
    #[error("invalid leader election flags: {0}")]
    LeaderElection(String),
    #[error("invalid listener limits: {0}")]
    Limits(String),
    #[error("invalid TLS files: {0}")]
    Tls(#[from] TlsError),
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

async fn listen_on(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Listen { addr, source })?;
    let local = listener.local_addr().map_err(ServeError::Serve)?;
    Ok((listener, local))
}

async fn kube_client(args: &ServeArgs) -> Result<kube::Client, ServeError> {
    kube_client_from(args.kubeconfig.as_deref()).await
}

/// [`sync::client::kube_client_from`], with `serve`'s errors.
pub async fn kube_client_from(
    kubeconfig: Option<&std::path::Path>,
) -> Result<kube::Client, ServeError> {
    sync::client::kube_client_from(kubeconfig)
        .await
        .map_err(|e| match e {
            sync::client::ClientError::Kubeconfig(m) => ServeError::Kubeconfig(m),
            sync::client::ClientError::Client(e) => ServeError::Client(e),
        })
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
    // Registered before `/readyz` starts failing: a second signal sent by anyone who saw the
    // 503 is never missed.
    let second = second_termination_signal();
    service.shutdown_unless(second).await
}

/// The next SIGTERM or SIGINT from now on (an operator's second Ctrl-C, or a test that saw
/// `/readyz` fail): the listeners are registered when this is called, not when it is awaited.
fn second_termination_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            let recv = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = recv(term) => {},
                _ = recv(int) => {},
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// A running service: the HTTP servers, sync tasks, leader election and housekeeping.
pub struct Service {
    /// The verb listener's address actually bound (useful with port 0).
    pub addr: SocketAddr,
    /// Where `/healthz`, `/readyz` and `/metrics` are served: `--probe-address` as bound, or
    /// `addr` when they share the verb listener.
    pub probe_addr: SocketAddr,
    /// The admission webhook listener's address as bound (with --webhook-listen).
    pub webhook_addr: Option<SocketAddr>,
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
        // Listener and body limits: a bad flag fails the start, before anything listens.
        let verb_limits = args.connection_limits(false);
        let probe_limits = args.connection_limits(true);
        verb_limits
            .validate("--max-connections")
            .and_then(|()| probe_limits.validate("--probe-max-connections"))
            .and_then(|()| args.body_limits().validate())
            .and_then(|()| {
                args.webhook_connection_limits()
                    .validate("--webhook-max-connections")
            })
            .and_then(|()| {
                args.webhook_body_limits()
                    .validate_flags("--webhook-body-limit-bytes", "--webhook-body-budget-bytes")
            })
            .map_err(ServeError::Limits)?;
        let metrics = Metrics::new();
        let cluster = Arc::new(ClusterState::new());
        cluster.set_deviceless_untrusted(args.gpu_share_totals.deviceless_untrusted());
        cluster.configure_dra(
            args.dra_cpu_drivers
                .iter()
                .filter(|d| !d.is_empty())
                .cloned(),
        );
        // Capacity gauges are computed from the caches on each scrape, not per request.
        crate::ops::capacity::register(&metrics, cluster.clone(), args.ops.per_node_metrics)
            .map_err(|e| ServeError::Metrics(e.to_string()))?;
        let readiness = Readiness::new(sync::declared_kinds(), args.max_staleness, metrics.clone());
        // The initial lists are applied without publishing per event; the read snapshot is
        // built once, when every kind is synced, before readiness reports 200.
        {
            let cluster = cluster.clone();
            readiness.on_bootstrap(move || cluster.build_snapshot());
        }
        let ctx = SyncContext {
            cluster: cluster.clone(),
            readiness: readiness.clone(),
            metrics: metrics.clone(),
            allow_dra_extended: args.allow_dra_extended_resources,
            dra_ownership: args.dra_ownership.then_some(args.dra_handover_grace),
            taint_rule_version: Default::default(),
        };
        let shutdown = CancellationToken::new();
        let scoring = args.scoring.config()?;

        let mut elector = None;
        let mut node_status_api: Option<Arc<dyn crate::scheduler::share_totals::NodeStatusApi>> =
            None;
        let requeue = Arc::new(crate::scheduler::Requeue::default());
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
                    let pod_api = KubePodApi::new(client.clone(), args.request_timeout);
                    // Each acquisition, and every start, waits out the bindings a previous
                    // leader or process may still land (issues 22 and 36, fencing;
                    // `Readiness::pods_current`).
                    readiness.set_takeover_window(
                        args.takeover_window
                            .unwrap_or_else(|| pod_api.binding_deadline()),
                    );
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
                    } else {
                        // No election: this process is the only binder from now on, but the
                        // one before it (crashed, or replaced by a rollout) may have a binding
                        // still in flight at the API server (issue 36 §1).
                        readiness.fence_start();
                    }
                    if args.requeue {
                        if args.requeue_interval.is_zero() {
                            return Err(ServeError::Limits(
                                "--requeue-interval must be above zero".to_string(),
                            ));
                        }
                        tokio::spawn(crate::scheduler::requeue::run(
                            requeue.clone(),
                            cluster.clone(),
                            {
                                let readiness = readiness.clone();
                                Arc::new(move || readiness.is_ready())
                            },
                            Arc::new(crate::scheduler::requeue::KubeNodeSignal::new(
                                client.clone(),
                                args.request_timeout,
                            )),
                            crate::scheduler::requeue::RequeueConfig {
                                interval: args.requeue_interval,
                                unknown_after_takeover: args.requeue_after_takeover,
                            },
                            metrics.clone(),
                            shutdown.clone(),
                        ));
                    }
                    if args.dra_ownership {
                        tokio::spawn(crate::scheduler::dra_owner::run(
                            cluster.clone(),
                            readiness.clone(),
                            Arc::new(crate::scheduler::dra_owner::KubeTaintRuleApi::new(
                                client.clone(),
                                args.request_timeout,
                                ctx.taint_rule_version.clone(),
                            )),
                            std::time::Duration::from_secs(1),
                            metrics.clone(),
                            shutdown.clone(),
                        ));
                    }
                    node_status_api = Some(Arc::new(
                        crate::scheduler::share_totals::KubeNodeStatusApi::new(
                            client.clone(),
                            args.request_timeout,
                        ),
                    ));
                    tokio::spawn(sync::run_kube(
                        ctx.clone(),
                        client.clone(),
                        args.insisted_kinds(),
                        args.rediscover_interval,
                        shutdown.clone(),
                    ));
                    (Arc::new(pod_api), None)
                }
            };

        // The share totals' check runs in every mode (a cluster file is checked too); only the
        // kube client writes, and only with `--gpu-share-totals=extender`.
        tokio::spawn(crate::scheduler::share_totals::run(
            args.gpu_share_totals,
            cluster.clone(),
            readiness.clone(),
            node_status_api,
            std::time::Duration::from_secs(1),
            metrics.clone(),
            shutdown.clone(),
        ));
        let scheduler = Scheduler::new(
            cluster.clone(),
            readiness.clone(),
            metrics.clone(),
            pod_api,
            scoring,
            requeue.clone(),
        );
        let scheduler = Scheduler {
            share_totals: args.gpu_share_totals,
            ranking: args.ranking,
            ..scheduler
        };
        let binder = scheduler.binder.clone();
        // Ambiguous binds (a write failed with an unknown outcome) are probed promptly with
        // backoff (issue 11); the gauge of assumed entries by age is refreshed on the same tick.
        {
            let binder = binder.clone();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let tick = std::time::Duration::from_millis(250);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(tick) => {
                            binder.probe_ambiguous().await;
                            binder.update_assumed_gauge();
                        }
                    }
                }
            });
        }
        // Assumed allocations nothing else resolved (no watch confirmation, no relist, no
        // probe verdict) would hold devices forever; ask the API server after --assume-ttl.
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
            scheduler,
            body_limit: args.body_limit_bytes,
        };
        let http = HttpConfig {
            path_prefix: args.path_prefix.clone(),
            request_timeout: args.request_timeout,
            max_concurrency: args.max_concurrency,
            bodies: args.body_limits(),
        };
        // Certificates first: a bad file must fail the start, before anything listens.
        let tls = args
            .tls_files()
            .map(|files| TlsReloader::load(files, metrics.clone()))
            .transpose()?;
        let (listener, addr) = listen_on(args.listen).await?;
        let probe_listener = match args.probe_address {
            Some(probe) => Some(listen_on(probe).await?),
            None => None,
        };
        let probe_addr = probe_listener.as_ref().map_or(addr, |(_, a)| *a);
        // The admission webhook: its certificate loads (or the start fails) before it listens.
        let webhook = match args.webhook() {
            Some((webhook_addr, rule, files)) => {
                if rule.scheduler_name.is_empty()
                    || rule.managed_resources.is_empty() && !rule.cpuset_qos
                {
                    return Err(ServeError::Limits(
                        "the webhook needs a non-empty --webhook-scheduler-name and something to route (--webhook-managed-resources or --webhook-route-cpuset-qos)".to_string(),
                    ));
                }
                let reloader = TlsReloader::load(files, metrics.clone())?;
                let (tcp, bound) = listen_on(webhook_addr).await?;
                tracing::info!(addr = %bound, scheduler = %rule.scheduler_name, resources = rule.managed_resources.len(), cpuset_qos = rule.cpuset_qos, "admission webhook serving (HTTPS)");
                Some((tcp, bound, rule, reloader))
            }
            None => None,
        };
        let webhook_addr = webhook.as_ref().map(|(_, a, _, _)| *a);
        let verb_app = match probe_listener {
            Some(_) => extender::verb_router(state.clone(), &http),
            None => extender::router(state.clone(), &http),
        };
        match &tls {
            Some(t) if !t.requires_client_certificates() => tracing::warn!(
                "TLS without --tls-client-ca-file: any client that reaches --listen may call bind"
            ),
            Some(_) if probe_listener.is_none() => tracing::warn!(
                "client certificates are required on --listen, which also serves the probes: \
                 kubelet probes present none, so set --probe-address"
            ),
            None if !args.listen.ip().is_loopback() => tracing::warn!(
                listen = %args.listen,
                "verbs are served over plain HTTP on a non-loopback address: anything that \
                 reaches it may call bind (see --tls-client-ca-file)"
            ),
            _ => {}
        }
        tracing::info!(
            %addr,
            %probe_addr,
            tls = tls.is_some(),
            client_certificates = tls.as_ref().is_some_and(TlsReloader::requires_client_certificates),
            prefix = %extender::normalize_prefix(&args.path_prefix),
            "serving"
        );

        if let Some(file) = offline_file {
            // The same sync path as the watchers, after the listener is up so /readyz is
            // observable throughout.
            sync::run_file(&ctx, file);
        }

        let verbs = {
            let live = tls.as_ref().map(TlsReloader::live_config);
            if let Some(reloader) = tls {
                tokio::spawn(reloader.run(args.tls_reload_interval, shutdown.clone()));
            }
            let listener_config = Listener {
                name: "verbs",
                router: verb_app,
                limits: verb_limits,
                tls: live,
            };
            tokio::spawn(listener::serve(
                listener,
                listener_config,
                metrics.clone(),
                shutdown.clone(),
            ))
        };
        let webhook = webhook.map(|(tcp, _, rule, reloader)| {
            let live = reloader.live_config();
            tokio::spawn(reloader.run(args.tls_reload_interval, shutdown.clone()));
            let listener_config = Listener {
                name: "webhook",
                router: extender::webhook::router(
                    extender::webhook::WebhookState {
                        rule: Arc::new(rule),
                        metrics: metrics.clone(),
                        body_limit: args.webhook_body_limit_bytes,
                    },
                    &HttpConfig {
                        path_prefix: String::new(),
                        request_timeout: args.request_timeout,
                        max_concurrency: args.max_concurrency,
                        bodies: args.webhook_body_limits(),
                    },
                ),
                limits: args.webhook_connection_limits(),
                tls: Some(live),
            };
            tokio::spawn(listener::serve(
                tcp,
                listener_config,
                metrics.clone(),
                shutdown.clone(),
            ))
        });
        let probes = probe_listener.map(|(tcp, _)| {
            let listener_config = Listener {
                name: "probes",
                router: extender::probe_router(state.clone()),
                limits: probe_limits,
                tls: None,
            };
            tokio::spawn(listener::serve(
                tcp,
                listener_config,
                metrics.clone(),
                shutdown.clone(),
            ))
        });
        let server = tokio::spawn(async move {
            let verbs = verbs.await;
            let probes = match probes {
                Some(p) => p.await,
                None => Ok(Ok(())),
            };
            let webhook = match webhook {
                Some(w) => w.await,
                None => Ok(Ok(())),
            };
            for result in [verbs, probes, webhook] {
                match result {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(ServeError::Serve(e)),
                    Err(e) => return Err(ServeError::Serve(std::io::Error::other(e))),
                }
            }
            Ok(())
        });
        Ok(Service {
            addr,
            probe_addr,
            webhook_addr,
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
        self.shutdown_unless(std::future::pending()).await
    }

    /// [`Self::shutdown`], but `cut_short` ending first ends the shutdown delay early (a
    /// second termination signal: the operator insists).
    pub async fn shutdown_unless(
        self,
        cut_short: impl std::future::Future<Output = ()>,
    ) -> Result<(), ServeError> {
        tracing::info!(delay = ?self.shutdown_delay, "termination requested: failing /readyz, then stopping");
        self.state.scheduler.readiness.set_shutting_down();
        tokio::select! {
            _ = tokio::time::sleep(self.shutdown_delay) => {}
            _ = cut_short => {
                tracing::info!("second termination signal: ending the shutdown delay early");
            }
        }
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
