//! The probe router's handlers: `/healthz`, `/readyz` and `/metrics` (plain HTTP, for kubelet
//! and Prometheus). The `/debug` views are [`super::debug`]'s.

use axum::extract::{Query, State};
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
