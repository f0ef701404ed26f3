//! The four extender verbs: parse, gate on readiness, delegate, answer, and record metrics.
//!
//! Every logical failure is HTTP 200 with `Error` set (kube-scheduler discards non-200
//! bodies); only malformed input gets a 4xx.

use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::input::{BadRequest, decode, read_body, read_json};
use crate::model::wire::{
    ExtenderArgsRef, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
    ExtenderPreemptionArgs, ExtenderPreemptionResult, HostPriority,
};
use crate::scheduler::{relative, verbs};

/// How a verb call ended, for the metric label.
#[derive(Clone, Copy)]
pub enum Outcome {
    Ok,
    Error,
    NotReady,
    BadRequest,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::NotReady => "not_ready",
            Outcome::BadRequest => "bad_request",
        }
    }
}

fn record(state: &AppState, verb: &str, outcome: Outcome, started: Instant) {
    let elapsed = started.elapsed().as_secs_f64();
    state
        .scheduler
        .metrics
        .requests
        .with_label_values(&[verb, outcome.as_str()])
        .inc();
    state
        .scheduler
        .metrics
        .request_duration
        .with_label_values(&[verb, outcome.as_str()])
        .observe(elapsed);
}

/// Answers a malformed request: its 4xx, logged and counted.
fn reject(state: &AppState, verb: &'static str, started: Instant, bad: BadRequest) -> Response {
    tracing::warn!(verb, class = bad.class, error = %bad.message, "rejected malformed request");
    record(state, verb, Outcome::BadRequest, started);
    bad.into_response()
}

/// Why the service cannot answer yet, counted as such; `None` when ready.
fn not_ready_reason(state: &AppState, verb: &'static str, started: Instant) -> Option<String> {
    let reason = state.scheduler.readiness.not_ready_reason()?;
    record(state, verb, Outcome::NotReady, started);
    tracing::debug!(verb, reason, "answering not ready");
    Some(reason)
}

/// A verb whose request is owned and whose decision may await (bind, preempt).
async fn run<Req, Res, F>(
    state: AppState,
    headers: HeaderMap,
    body: Body,
    verb: &'static str,
    not_ready: impl FnOnce(String) -> Res,
    handle: F,
) -> Response
where
    Req: DeserializeOwned,
    Res: Serialize,
    F: AsyncFnOnce(&AppState, Req) -> (Res, Outcome),
{
    let started = Instant::now();
    let request: Req = match read_json(&headers, body, state.body_limit).await {
        Ok(r) => r,
        Err(bad) => return reject(&state, verb, started, bad),
    };
    if let Some(reason) = not_ready_reason(&state, verb, started) {
        return axum::Json(not_ready(reason)).into_response();
    }
    let (response, outcome) = handle(&state, request).await;
    record(&state, verb, outcome, started);
    // Bind and preempt answer a few bytes (or a victims map much smaller than the request).
    json_response(&response, 1024)
}

/// A verb decided synchronously on a request that borrows from the body's `bytes` (filter,
/// prioritize: node names are slices of the body, and so are the answer's), kept alive until
/// the answer is serialized. Same checks, order and answers as [`run`].
fn respond<'a, Req, Res>(
    state: &AppState,
    headers: &HeaderMap,
    bytes: &'a [u8],
    verb: &'static str,
    started: Instant,
    not_ready: impl FnOnce(String) -> Res,
    handle: impl FnOnce(&AppState, Req) -> (Res, Outcome),
) -> Response
where
    Req: Deserialize<'a>,
    Res: Serialize,
{
    let request: Req = match decode(bytes) {
        Ok(r) => r,
        Err(bad) => return reject(state, verb, started, bad),
    };
    if let Some(reason) = not_ready_reason(state, verb, started) {
        return axum::Json(not_ready(reason)).into_response();
    }
    let (response, outcome) = handle(state, request);
    record(state, verb, outcome, started);
    json_response(&response, reply_capacity(headers, state.body_limit))
}

/// A reply for a request of this size: filter and prioritize answer about one entry per
/// candidate node, so the request's length (plus half) holds the reply without regrowing.
fn reply_capacity(headers: &HeaderMap, limit: usize) -> usize {
    let request = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    (request + request / 2).clamp(256, limit)
}

/// `value` as a JSON response, serialized straight into one buffer of `capacity` bytes.
fn json_response<T: Serialize>(value: &T, capacity: usize) -> Response {
    let mut buf = Vec::with_capacity(capacity);
    match serde_json::to_writer(&mut buf, value) {
        Ok(()) => (
            [(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            )],
            buf,
        )
            .into_response(),
        // Our own answer types always serialize; if one ever does not, say so as JSON.
        Err(e) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(serde_json::json!({ "error": format!("failed to encode the answer: {e}") })),
        )
            .into_response(),
    }
}

pub async fn filter(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let (verb, started) = ("filter", Instant::now());
    let bytes = match read_body(&headers, body, state.body_limit).await {
        Ok(b) => b,
        Err(bad) => return reject(&state, verb, started, bad),
    };
    respond(
        &state,
        &headers,
        &bytes,
        verb,
        started,
        ExtenderFilterResult::error,
        |s, args: ExtenderArgsRef| {
            let result = verbs::filter(&s.scheduler, args);
            let outcome = if result.error.is_empty() {
                Outcome::Ok
            } else {
                Outcome::Error
            };
            (result, outcome)
        },
    )
}

pub async fn prioritize(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let (verb, started) = ("prioritize", Instant::now());
    let bytes = match read_body(&headers, body, state.body_limit).await {
        Ok(b) => b,
        Err(bad) => return reject(&state, verb, started, bad),
    };
    // A prioritize error is dropped silently by kube-scheduler; an empty list means "no
    // opinion", so not-ready answers that rather than an error object of the wrong shape.
    respond(
        &state,
        &headers,
        &bytes,
        verb,
        started,
        |_| Vec::<HostPriority>::new(),
        |s, args: ExtenderArgsRef| {
            // kube-scheduler ranks the short answer exactly as the full one (see `relative`).
            let scores = verbs::prioritize(&s.scheduler, args);
            (relative::relative_to_lowest(scores), Outcome::Ok)
        },
    )
}

pub async fn bind(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    run(
        state,
        headers,
        body,
        "bind",
        |error| ExtenderBindingResult { error },
        async |s, args: ExtenderBindingArgs| {
            // Run the bind as its own task: if the request times out or the client goes away,
            // the bind still either completes or rolls back instead of stopping halfway with
            // an assumed entry or a patched annotation left behind. The task counts its own
            // outcome, so a bind that outlives its request is still in the metrics.
            let (binder, metrics, task_args) = (s.scheduler.binder.clone(), s.scheduler.metrics.clone(), args.clone());
            let task = tokio::spawn(async move {
                let started = Instant::now();
                let result = binder.bind(&task_args).await;
                metrics.bind_duration.observe(started.elapsed().as_secs_f64());
                let outcome = match &result {
                    Ok(outcome) => outcome.as_str(),
                    Err(e) => {
                        tracing::warn!(pod = %format!("{}/{}", task_args.pod_namespace, task_args.pod_name), node = %task_args.node, error = %e, "bind failed");
                        e.class()
                    }
                };
                metrics.binds.with_label_values(&[outcome]).inc();
                result
            });
            let result = match task.await {
                Ok(result) => result,
                // The task panicked: it counted nothing.
                Err(join) => {
                    let e = crate::scheduler::bind::BindError::Internal(join.to_string());
                    s.scheduler.metrics.binds.with_label_values(&[e.class()]).inc();
                    Err(e)
                }
            };
            match result {
                Ok(_) => (ExtenderBindingResult::default(), Outcome::Ok),
                Err(e) => (ExtenderBindingResult { error: e.to_string() }, Outcome::Error),
            }
        },
    )
    .await
}

pub async fn preempt(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    // The preemption result has no Error field: not ready means "no candidate node".
    run(
        state,
        headers,
        body,
        "preempt",
        |_| ExtenderPreemptionResult {
            node_name_to_meta_victims: Some(Default::default()),
        },
        async |s, args: ExtenderPreemptionArgs| (verbs::preempt(&s.scheduler, args), Outcome::Ok),
    )
    .await
}
