//! `/healthz`, `/readyz`, `/metrics`, `/debug/nodes` and `/debug/nodes/{name}`.

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;

/// Liveness: the process serves HTTP. Deliberately independent of sync state.
pub async fn healthz() -> &'static str {
    "ok"
}

#[derive(serde::Deserialize, Default)]
pub struct ReadyzQuery {
    /// `ok`: a synced standby (ready but for leadership) answers 200 too.
    standby: Option<String>,
}

/// 200 once every required kind's initial list has been applied; 503 with a JSON body naming
/// each kind's phase until then, during shutdown, when stale, or when not the leader.
/// `?standby=ok` leaves leadership out: for pod readiness where nothing routes traffic by it
/// (scheduler mode, whose kube-scheduler calls its own sidecar), so that a synced standby
/// counts as healthy for PodDisruptionBudgets and rollouts. Verbs still serve only the leader.
pub async fn readyz(State(state): State<AppState>, Query(query): Query<ReadyzQuery>) -> Response {
    let report = state.scheduler.readiness.report();
    let standby_ok = match query.standby.as_deref() {
        None => false,
        Some("ok") => true,
        Some(other) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(serde_json::json!({
                    "error": format!("unknown value {other:?} for standby: the only value is \"ok\"")
                })),
            )
                .into_response();
        }
    };
    let status = if report.ready || (standby_ok && report.standby_ready) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    // The report, plus what the requeue signal is doing (`requeue`: on or off, pods waiting
    // for capacity, the last signal), where an operator looking at readiness looks.
    let mut body = serde_json::to_value(&report).unwrap_or_default();
    if let Some(o) = body.as_object_mut() {
        o.insert(
            "requeue".to_string(),
            serde_json::to_value(state.scheduler.requeue.status()).unwrap_or_default(),
        );
    }
    (status, axum::Json(body)).into_response()
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.scheduler.metrics.encode(),
    )
        .into_response()
}

/// What the caches hold for one node, as JSON.
pub async fn debug_node(State(state): State<AppState>, Path(name): Path<String>) -> Response {
    match state.scheduler.cluster.node(&name) {
        Some(entry) => {
            let view = entry.read().debug_json(std::time::Instant::now());
            axum::Json(serde_json::json!({ "name": name, "state": view })).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(
                serde_json::json!({ "error": format!("node {name:?} is not in the cache") }),
            ),
        )
            .into_response(),
    }
}

#[derive(serde::Deserialize)]
pub struct NodesQuery {
    /// Comma-separated node names; all nodes when absent.
    nodes: Option<String>,
}

/// The operator view (`inspect`'s JSON, docs/inspect.md) of every node, or of `?nodes=a,b`;
/// 404 naming the nodes the caches do not hold.
pub async fn debug_nodes(State(state): State<AppState>, Query(q): Query<NodesQuery>) -> Response {
    let names: Vec<String> = q
        .nodes
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    match crate::cluster::report::select(&state.scheduler.cluster, &names) {
        Ok(view) => axum::Json(view).into_response(),
        Err(missing) => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({
                "error": format!("not in the cluster: {}", missing.join(", "))
            })),
        )
            .into_response(),
    }
}
