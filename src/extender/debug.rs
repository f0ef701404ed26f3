//! `/debug/nodes` and `/debug/nodes/{name}`: what the caches hold, for operators, on the verb
//! listener (behind its TLS and client certificates when configured). Reads only.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::AppState;

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
