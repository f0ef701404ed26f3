//! The HTTP surface: the axum routers, their middleware (body limit, timeout, concurrency
//! limit, per-request metrics and logs), the extender verbs, the probes, and the verb
//! listener's TLS ([`tls`]).
//!
//! Two routers: [`verb_router`] (the verbs and `/debug`, the listener kube-scheduler calls, TLS
//! and client certificates when configured) and [`probe_router`] (`/healthz`, `/readyz`,
//! `/metrics`, plain HTTP, for kubelet and Prometheus). [`router`] is both on one listener.
//!
//! Handlers parse and answer; scheduling decisions live in [`verbs`] (reads only) and
//! [`crate::bind`] (the one place that commits). Nothing here talks to the API server directly.

pub(crate) mod admission;
pub(crate) mod debug;
pub mod handlers;
pub mod input;
pub(crate) mod listener;
pub(crate) mod probes;
pub(crate) mod tls;
pub(crate) mod webhook;

use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::metrics::Metrics;
use crate::scheduler::Scheduler;

/// Settings of the HTTP surface.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Prefix for the verbs, e.g. `/gpu` (empty for none). Probes stay at the root.
    pub path_prefix: String,
    pub request_timeout: Duration,
    pub max_concurrency: usize,
    /// Bodies are read whole, within a deadline and a shared byte budget, before they take
    /// one of `max_concurrency` slots.
    pub bodies: admission::BodyLimits,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            path_prefix: String::new(),
            request_timeout: Duration::from_secs(10),
            max_concurrency: 256,
            bodies: admission::BodyLimits::default(),
        }
    }
}

/// Shared state of every handler: the scheduling core, and what only HTTP needs.
#[derive(Clone)]
pub struct AppState {
    pub scheduler: Scheduler,
    /// The largest request body read.
    pub body_limit: usize,
}

/// Normalises a user-supplied prefix: `gpu/` → `/gpu`, `/` → ``.
pub fn normalize_prefix(prefix: &str) -> String {
    let trimmed = prefix.trim().trim_matches('/');
    if trimmed.is_empty() {
        String::new()
    } else {
        format!("/{trimmed}")
    }
}

/// The verbs (under the prefix) and `/debug`: what only the scheduler may call.
pub fn verb_router(state: AppState, config: &HttpConfig) -> Router {
    let verbs = verbs(config, &state.scheduler.metrics);
    with_fallbacks(verbs).with_state(state)
}

/// `/healthz`, `/readyz` and `/metrics`: for kubelet and Prometheus, never the verbs.
pub fn probe_router(state: AppState) -> Router {
    with_fallbacks(probes()).with_state(state)
}

/// Verbs, `/debug` and probes on one listener (when no `--probe-address` is given).
pub fn router(state: AppState, config: &HttpConfig) -> Router {
    let verbs = verbs(config, &state.scheduler.metrics);
    with_fallbacks(probes().merge(verbs)).with_state(state)
}

fn probes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(probes::metrics))
}

fn verbs(config: &HttpConfig, metrics: &Metrics) -> Router<AppState> {
    let prefix = normalize_prefix(&config.path_prefix);
    Router::new()
        .route(&format!("{prefix}/filter"), post(handlers::filter))
        .route(&format!("{prefix}/prioritize"), post(handlers::prioritize))
        .route(&format!("{prefix}/bind"), post(handlers::bind))
        .route(&format!("{prefix}/preempt"), post(handlers::preempt))
        .route("/debug/nodes", get(debug::debug_nodes))
        .route("/debug/nodes/{name}", get(debug::debug_node))
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
            config.max_concurrency.max(1),
        ))
        // Outside the concurrency limit: a body is in memory before it takes a slot.
        .layer(middleware::from_fn_with_state(
            admission::BodyAdmission::new(config.bodies.clone(), metrics.clone()),
            admission::admit,
        ))
        .layer(middleware::from_fn_with_state(
            (config.request_timeout, metrics.clone()),
            timeout,
        ))
}

fn with_fallbacks(router: Router<AppState>) -> Router<AppState> {
    // After the merges: it applies to the routes registered so far.
    router
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
}

/// Answers a JSON 503 when a request outlives `--request-timeout` (also while queued behind
/// the concurrency limit), instead of tower's empty-bodied error.
pub(crate) async fn timeout(
    State((limit, metrics)): State<(Duration, Metrics)>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_string();
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            let verb = path.rsplit('/').next().unwrap_or("unknown");
            let verb = match verb {
                "filter" | "prioritize" | "bind" | "preempt" => verb,
                _ => "other",
            };
            metrics.requests.with_label_values(&[verb, "timeout"]).inc();
            tracing::warn!(path, timeout = ?limit, "request timed out");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(serde_json::json!({
                    "error": format!("request to {path} timed out after {limit:?} (--request-timeout)")
                })),
            )
                .into_response()
        }
    }
}

async fn not_found(request: Request) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(serde_json::json!({
            "error": format!("no route for {} {}", request.method(), request.uri().path())
        })),
    )
        .into_response()
}

/// A known path with the wrong method: a JSON 405 like every other rejection, instead of
/// axum's empty body.
async fn method_not_allowed(request: Request) -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        axum::Json(serde_json::json!({
            "error": format!("method {} is not allowed on {}", request.method(), request.uri().path())
        })),
    )
        .into_response()
}
