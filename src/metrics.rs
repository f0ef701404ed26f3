//! The prometheus registry: one `Metrics` per process (tests make their own), held in state.
//!
//! Every failure path in the service increments something here. This module owns metric names
//! and labels only; it never decides anything.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// HTTP requests per verb and outcome (`ok`, `error`, `not_ready`, `bad_request`, ...).
    pub requests: IntCounterVec,
    pub request_duration: HistogramVec,
    /// 0 = pending, 1 = listing, 2 = synced, -1 = disabled.
    pub sync_phase: IntGaugeVec,
    pub cached_objects: IntGaugeVec,
    pub relists: IntCounterVec,
    pub watch_errors: IntCounterVec,
    pub events_applied: IntCounterVec,
    pub bootstrap_duration: Gauge,
    /// Objects the sync rejected as unusable (missing uid, bad Device entries, ...).
    pub invalid_objects: IntCounterVec,
    pub binds: IntCounterVec,
    pub bind_duration: Histogram,
    pub assumed_expired: IntCounter,
    pub malformed_annotations: IntCounterVec,
    pub device_problems: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("dne".into()), None).expect("static prefix");
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.expect("static metric definition");
                registry
                    .register(Box::new(m.clone()))
                    .expect("unique metric name");
                m
            }};
        }
        let latency_buckets = vec![
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            2.5, 5.0,
        ];
        Metrics {
            requests: reg!(IntCounterVec::new(
                Opts::new(
                    "http_requests_total",
                    "Extender HTTP requests by verb and outcome."
                ),
                &["verb", "outcome"]
            )),
            request_duration: reg!(HistogramVec::new(
                HistogramOpts::new(
                    "http_request_duration_seconds",
                    "Extender HTTP request latency by verb and outcome."
                )
                .buckets(latency_buckets.clone()),
                &["verb", "outcome"]
            )),
            sync_phase: reg!(IntGaugeVec::new(
                Opts::new(
                    "sync_phase",
                    "Sync phase per kind: -1 disabled, 0 pending, 1 listing, 2 synced."
                ),
                &["kind"]
            )),
            cached_objects: reg!(IntGaugeVec::new(
                Opts::new("cached_objects", "Objects held in the cache per kind."),
                &["kind"]
            )),
            relists: reg!(IntCounterVec::new(
                Opts::new("relists_total", "Full (re)lists started per kind."),
                &["kind"]
            )),
            watch_errors: reg!(IntCounterVec::new(
                Opts::new(
                    "watch_errors_total",
                    "List/watch errors per kind (retried with backoff)."
                ),
                &["kind"]
            )),
            events_applied: reg!(IntCounterVec::new(
                Opts::new(
                    "events_applied_total",
                    "Changes applied to the caches per kind and event (add, update, delete, noop)."
                ),
                &["kind", "event"]
            )),
            bootstrap_duration: reg!(Gauge::new(
                "bootstrap_duration_seconds",
                "Seconds from start until every required kind was synced."
            )),
            invalid_objects: reg!(IntCounterVec::new(
                Opts::new(
                    "invalid_objects_total",
                    "Objects ignored as unusable, per kind and reason."
                ),
                &["kind", "reason"]
            )),
            binds: reg!(IntCounterVec::new(
                Opts::new("binds_total", "Bind attempts by outcome."),
                &["outcome"]
            )),
            bind_duration: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "bind_duration_seconds",
                    "Bind latency including API round trips."
                )
                .buckets(latency_buckets)
            )),
            assumed_expired: reg!(IntCounter::new(
                "assumed_expired_total",
                "Assumed allocations dropped because no bind confirmation arrived in time."
            )),
            malformed_annotations: reg!(IntCounterVec::new(
                Opts::new(
                    "malformed_annotations_total",
                    "Pod allocation annotations that could not be parsed (counted conservatively)."
                ),
                &["annotation"]
            )),
            device_problems: reg!(IntCounterVec::new(
                Opts::new(
                    "device_problems_total",
                    "Device CR entries ignored, by problem."
                ),
                &["problem"]
            )),
            registry,
        }
    }

    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
