//! Admitting request bodies before they take a concurrency slot: a declared `Content-Length`
//! over `--body-limit-bytes` is refused at once (413); the body is read under
//! `--body-read-timeout`, and every byte it holds is charged to one process-wide byte budget
//! (`--body-budget-bytes`) until the request is answered. So slow bodies never occupy the slots
//! real calls need, and all bodies in flight together never hold more memory than the budget.
//!
//! The budget has two lanes. Bodies that declare at most [`SMALL_BODY_BYTES`] (kube-scheduler's
//! node-name requests: ~100 KB at 5,000 nodes) are charged to a lane of their own, a quarter of
//! the budget (at most 16 MiB); everything else to the rest. The semaphores are fair (FIFO), so
//! with one lane a small call would queue behind large bodies waiting for megabytes; with two,
//! large bodies (an attacker's, or full-Node requests) cannot delay small calls.
//!
//! This module reads bodies and nothing else: it does not parse them (see [`super::input`])
//! and never looks at a route. It must run outside the concurrency limit (the verb router's
//! outermost layer but the request timeout).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;

/// The body limits of one listener (the verbs', the webhook's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyLimits {
    /// One body at most (`--body-limit-bytes`).
    pub max_bytes: usize,
    /// All bodies being read or served at once, together (`--body-budget-bytes`).
    pub budget_bytes: usize,
    /// A body must arrive whole within this long of its head (`--body-read-timeout`).
    pub read_timeout: Duration,
    /// The flag that sets `max_bytes`, named in the 413's message.
    pub limit_flag: &'static str,
}

impl Default for BodyLimits {
    fn default() -> Self {
        BodyLimits {
            max_bytes: 16 * 1024 * 1024,
            budget_bytes: 64 * 1024 * 1024,
            read_timeout: Duration::from_secs(5),
            limit_flag: "--body-limit-bytes",
        }
    }
}

/// Bodies declaring at most this many bytes use the small lane of the budget.
pub const SMALL_BODY_BYTES: usize = 1024 * 1024;

impl BodyLimits {
    /// The budget's small lane (bytes): a quarter, at most 16 MiB.
    pub fn small_lane_bytes(&self) -> usize {
        (self.budget_bytes / 4).min(16 * 1024 * 1024)
    }

    /// Checks the verb listener's flags.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_flags("--body-limit-bytes", "--body-budget-bytes")
    }

    /// Checks the limits; the errors name `limit_flag` and `budget_flag`.
    pub fn validate_flags(&self, limit_flag: &str, budget_flag: &str) -> Result<(), String> {
        let large_lane = self.budget_bytes - self.small_lane_bytes();
        if large_lane < self.max_bytes {
            return Err(format!(
                "{budget_flag} ({}) must leave at least {limit_flag} ({}) once a quarter of it (at most 16 MiB) is set aside for bodies of at most 1 MiB: a body of the largest accepted size could never be admitted",
                self.budget_bytes, self.max_bytes
            ));
        }
        if self.budget_bytes > MAX_BUDGET {
            return Err(format!(
                "{budget_flag} ({}) is over the largest supported budget ({MAX_BUDGET})",
                self.budget_bytes
            ));
        }
        if self.read_timeout.is_zero() {
            return Err("--body-read-timeout must be positive".into());
        }
        Ok(())
    }
}

/// tokio's semaphore holds at most `usize::MAX >> 3` permits; one permit is one byte.
const MAX_BUDGET: usize = 1 << 40;

/// The shared budget and limits; one per process (held in the verb router's middleware).
#[derive(Clone)]
pub struct BodyAdmission {
    limits: BodyLimits,
    /// Bodies declaring more than [`SMALL_BODY_BYTES`], or no length (chunked).
    budget: Arc<Semaphore>,
    /// Bodies declaring at most [`SMALL_BODY_BYTES`].
    small: Arc<Semaphore>,
    metrics: Metrics,
}

impl BodyAdmission {
    pub fn new(limits: BodyLimits, metrics: Metrics) -> Self {
        let small = limits.small_lane_bytes();
        BodyAdmission {
            budget: Arc::new(Semaphore::new(limits.budget_bytes - small)),
            small: Arc::new(Semaphore::new(small)),
            limits,
            metrics,
        }
    }

    fn reject(&self, status: StatusCode, reason: &'static str, message: String) -> Response {
        self.metrics
            .request_bodies_rejected
            .with_label_values(&[reason])
            .inc();
        tracing::debug!(reason, %message, "request body refused");
        // The rest of the body is not read: the connection cannot carry another request, and
        // saying so keeps a pooling client from sending its next one on a closing connection.
        (
            status,
            [(header::CONNECTION, "close")],
            axum::Json(serde_json::json!({ "error": message })),
        )
            .into_response()
    }

    /// Reads the whole body, charging each chunk to the budget before keeping it. Waits for
    /// budget while other bodies hold it (within the read deadline): what is held is what has
    /// arrived, so a declared length alone reserves nothing.
    async fn read(&self, body: Body, declared: Option<u64>) -> Result<(Bytes, Charge), Response> {
        let small = declared.is_some_and(|n| n <= SMALL_BODY_BYTES as u64);
        let lane = if small && self.limits.small_lane_bytes() > 0 {
            &self.small
        } else {
            &self.budget
        };
        let mut charge = Charge {
            permit: None,
            bytes: 0,
            metrics: self.metrics.clone(),
        };
        let mut buffer = BytesMut::new();
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                self.reject(
                    StatusCode::BAD_REQUEST,
                    "read_error",
                    format!("failed to read request body: {e}"),
                )
            })?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers carry nothing we read
            };
            if buffer.len() + data.len() > self.limits.max_bytes {
                return Err(self.too_large("too_large"));
            }
            let permits = lane
                .clone()
                .acquire_many_owned(data.len() as u32)
                .await
                .expect("the budget semaphore is never closed");
            charge.add(permits);
            buffer.extend_from_slice(&data);
        }
        Ok((buffer.freeze(), charge))
    }

    fn too_large(&self, reason: &'static str) -> Response {
        self.reject(
            StatusCode::PAYLOAD_TOO_LARGE,
            reason,
            format!(
                "request body exceeds the limit of {} bytes ({})",
                self.limits.max_bytes, self.limits.limit_flag
            ),
        )
    }
}

/// Budget held by one request's body, returned when the request is answered.
struct Charge {
    permit: Option<OwnedSemaphorePermit>,
    bytes: usize,
    metrics: Metrics,
}

impl Charge {
    fn add(&mut self, permit: OwnedSemaphorePermit) {
        let n = permit.num_permits();
        self.bytes += n;
        self.metrics.request_body_bytes_in_flight.add(n as i64);
        match &mut self.permit {
            Some(held) => held.merge(permit),
            None => self.permit = Some(permit),
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.metrics
            .request_body_bytes_in_flight
            .sub(self.bytes as i64);
    }
}

/// The middleware: admit the body, then run the rest (concurrency limit, handler) with the
/// body in memory, and release its budget when the answer is ready.
pub async fn admit(
    State(admission): State<BodyAdmission>,
    request: Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > admission.limits.max_bytes as u64) {
        return admission.too_large("declared_too_large");
    }
    // While the body arrives the connection counts as not serving a request (the listener may
    // evict it at its cap); the guard ends that on every way out of the read.
    let reading = request
        .extensions()
        .get::<super::listener::BodyPhase>()
        .map(super::listener::BodyPhase::reading);
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(
        admission.limits.read_timeout,
        admission.read(body, declared),
    )
    .await;
    drop(reading);
    let (bytes, charge) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(response)) => return response,
        Err(_) => {
            return admission.reject(
                StatusCode::REQUEST_TIMEOUT,
                "read_timeout",
                format!(
                    "request body did not arrive within {:?} (--body-read-timeout)",
                    admission.limits.read_timeout
                ),
            );
        }
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    drop(charge);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use tower::ServiceExt;

    fn app(limits: BodyLimits, metrics: &Metrics) -> axum::Router {
        echo(BodyAdmission::new(limits, metrics.clone()))
    }

    /// A route answering its body's length, behind `admission`.
    fn echo(admission: BodyAdmission) -> axum::Router {
        axum::Router::new()
            .route(
                "/echo",
                post(|body: Bytes| async move { body.len().to_string() }),
            )
            .layer(axum::middleware::from_fn_with_state(admission, admit))
    }

    fn limits(max: usize, budget: usize) -> BodyLimits {
        BodyLimits {
            max_bytes: max,
            budget_bytes: budget,
            read_timeout: Duration::from_secs(30),
            ..BodyLimits::default()
        }
    }

    async fn text(response: Response) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_before_any_byte_is_read() {
        let metrics = Metrics::new();
        // The body never ends: only the declared length can decide.
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = Body::from_stream(tokio_stream_from(rx));
        let request = Request::post("/echo")
            .header(header::CONTENT_LENGTH, "1000000000")
            .body(body)
            .unwrap();
        let response = app(limits(1024, 4096), &metrics)
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(response.headers()[header::CONNECTION], "close");
        assert!(text(response).await.contains("--body-limit-bytes"));
        let rejected = |r| {
            metrics
                .request_bodies_rejected
                .with_label_values(&[r])
                .get()
        };
        assert_eq!(rejected("declared_too_large"), 1);
    }

    #[tokio::test]
    async fn a_chunked_body_over_the_limit_is_refused_and_its_budget_returned() {
        let metrics = Metrics::new();
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            (0..5).map(|_| Ok(Bytes::from(vec![b'x'; 300]))).collect();
        let request = Request::post("/echo")
            .body(Body::from_stream(futures::stream::iter(chunks)))
            .unwrap();
        let response = app(limits(1024, 4096), &metrics)
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(metrics.request_body_bytes_in_flight.get(), 0);
    }

    #[tokio::test]
    async fn a_body_waits_for_budget_held_by_others_and_is_served_when_it_returns() {
        let metrics = Metrics::new();
        let admission = BodyAdmission::new(limits(1024, 1400), metrics.clone());
        // Other bodies hold the whole budget, both lanes (1050 + 350).
        let held = admission.budget.clone().acquire_many_owned(1050).await;
        let held_small = admission.small.clone().acquire_many_owned(350).await;
        let app = echo(admission);
        let request = Request::post("/echo")
            .body(Body::from(vec![b'y'; 600]))
            .unwrap();
        let pending = tokio::spawn(app.oneshot(request));
        // It cannot finish while the budget is held: the budget is what it waits on.
        tokio::task::yield_now().await;
        assert!(!pending.is_finished());
        drop(held_small);
        drop(held);
        let response = tokio::time::timeout(Duration::from_secs(60), pending)
            .await
            .expect("hang guard")
            .unwrap()
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(text(response).await, "600");
        assert_eq!(metrics.request_body_bytes_in_flight.get(), 0);
    }

    #[tokio::test]
    async fn a_body_that_stops_arriving_is_refused_at_the_read_deadline() {
        let metrics = Metrics::new();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        tx.send(Ok(Bytes::from_static(b"{\"Pod\""))).await.unwrap();
        let request = Request::post("/echo")
            .body(Body::from_stream(tokio_stream_from(rx)))
            .unwrap();
        // The rest of the body never comes, so the outcome does not depend on timing.
        let mut l = limits(1024, 4096);
        l.read_timeout = Duration::from_millis(100);
        let response = app(l, &metrics).oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
        assert!(text(response).await.contains("--body-read-timeout"));
        assert_eq!(
            metrics
                .request_bodies_rejected
                .with_label_values(&["read_timeout"])
                .get(),
            1
        );
        assert_eq!(metrics.request_body_bytes_in_flight.get(), 0);
        drop(tx);
    }

    /// Small bodies have a lane of their own: large bodies holding (or queueing for) all of
    /// theirs cannot delay them. Here the large lane is exhausted and a large body waits in
    /// its FIFO queue; a small one is still read and served.
    #[tokio::test]
    async fn large_bodies_cannot_delay_small_ones() {
        let metrics = Metrics::new();
        let l = limits(4 * 1024 * 1024, 16 * 1024 * 1024);
        assert_eq!(l.small_lane_bytes(), 4 * 1024 * 1024);
        let admission = BodyAdmission::new(l, metrics.clone());
        let held = admission
            .budget
            .clone()
            .acquire_many_owned(12 * 1024 * 1024)
            .await
            .unwrap();
        let app = echo(admission);
        let large = Request::post("/echo")
            .header(header::CONTENT_LENGTH, (2 * 1024 * 1024).to_string())
            .body(Body::from(vec![b'L'; 2 * 1024 * 1024]))
            .unwrap();
        let waiting = tokio::spawn(app.clone().oneshot(large));
        let small = Request::post("/echo")
            .header(header::CONTENT_LENGTH, "3")
            .body(Body::from("abc"))
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(60), app.oneshot(small))
            .await
            .expect("a small body waited behind large ones")
            .unwrap();
        assert_eq!(text(response).await, "3");
        assert!(
            !waiting.is_finished(),
            "the large body had budget after all"
        );
        drop(held);
        let response = tokio::time::timeout(Duration::from_secs(60), waiting)
            .await
            .expect("hang guard")
            .unwrap()
            .unwrap();
        assert_eq!(text(response).await, (2 * 1024 * 1024).to_string());
    }

    #[test]
    fn a_budget_that_cannot_hold_the_largest_body_is_a_flag_error() {
        let err = limits(2048, 1024).validate().unwrap_err();
        assert!(err.contains("--body-budget-bytes"), "{err}");
        // The largest body must fit beside the small lane, not only in the whole budget.
        let err = limits(16 << 20, 16 << 20).validate().unwrap_err();
        assert!(err.contains("at most 1 MiB"), "{err}");
        assert!(limits(16 << 20, 32 << 20).validate().is_ok());
        assert!(BodyLimits::default().validate().is_ok());
    }

    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures::Stream<Item = T> + Send {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
