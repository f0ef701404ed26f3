//! The prometheus registry: one `Metrics` per process (tests make their own), held in state.
//!
//! Every failure path in the service increments something here. This module owns metric names
//! and labels only; it never decides anything.

use std::sync::Arc;

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The process's metrics: a handle to one [`MetricSet`], cheap to clone (one reference count;
/// axum clones the state, and so this, for every request).
#[derive(Clone)]
pub struct Metrics(Arc<MetricSet>);

impl std::ops::Deref for Metrics {
    type Target = MetricSet;
    fn deref(&self) -> &MetricSet {
        &self.0
    }
}

/// Every metric family, registered in `registry`.
pub struct MetricSet {
    pub registry: Registry,
    /// HTTP requests per verb and outcome (`ok`, `error`, `not_ready`, `bad_request`, ...).
    pub requests: IntCounterVec,
    pub request_duration: HistogramVec,
    /// Verb-listener TLS: certificate reloads by outcome (`ok`, `error`: old one kept) and
    /// connections refused in the handshake by reason (`no_client_certificate`, ...).
    pub tls_reloads: IntCounterVec,
    pub tls_handshake_failures: IntCounterVec,
    /// 0 = pending, 1 = listing, 2 = synced, -1 = disabled.
    pub sync_phase: IntGaugeVec,
    pub cached_objects: IntGaugeVec,
    pub relists: IntCounterVec,
    /// Pod-cache fences raised (binds wait for a fresh relist), by reason.
    pub pod_fences: IntCounterVec,
    pub watch_errors: IntCounterVec,
    pub events_applied: IntCounterVec,
    pub bootstrap_duration: Gauge,
    /// Objects the sync rejected as unusable (missing uid, bad Device entries, ...).
    pub invalid_objects: IntCounterVec,
    pub binds: IntCounterVec,
    pub bind_duration: Histogram,
    /// Filter: candidate nodes rejected, by class
    /// ([`crate::placement::fit_error::REASON_CLASSES`], derived from the typed reason).
    pub filter_rejected_nodes: IntCounterVec,
    /// Filter: requests by what they found (`fits`, `fits_nowhere`, `pass_through`, `invalid_request`).
    pub filter_results: IntCounterVec,
    /// Filter with `--ranking=filter`: fitting nodes left out because others score better.
    pub filter_ranked_out: IntCounter,
    /// Filter and prioritize: candidate nodes answered from the read snapshot, by `verb` and
    /// `how` (`decided`, or `memo`: a candidate with equal facts was decided for the same pod
    /// shape, in this request or a recent one).
    pub read_decisions: IntCounterVec,
    /// Bytes the verbs' memos keep between requests (`verb`), as of the last request.
    pub read_memo_bytes: IntGaugeVec,
    pub assumed_expired: IntCounter,
    /// Assumed allocations released, by path: `relist`, `probe`, `retry`, `ttl`.
    pub assumed_released: IntCounterVec,
    /// Assumed ledger entries by age bucket (`lt_10s`, `lt_1m`, `lt_5m`, `ge_5m`).
    pub assumed_entries: IntGaugeVec,
    /// 409s on bind's resourceVersion-guarded writes (the binding, or a stale-annotation
    /// removal); a binding's is retried after a fresh read.
    pub bind_patch_conflicts: IntCounter,
    /// Where each bind read its pod (`source`): `filter` (the copy kube-scheduler sent with
    /// filter in the same scheduling cycle, no API call) or `api` (a GET).
    pub bind_reads: IntCounterVec,
    /// Binds whose binding got a 409 and whose re-read pod asked for something else than the
    /// decision was made for: failed, for kube-scheduler to retry.
    pub bind_pod_changed: IntCounter,
    /// Binds that found the pod bound to another node mid-bind (`stage`: patch, binding,
    /// probe); the pod's annotations were left alone.
    pub bound_elsewhere: IntCounterVec,
    /// Sync events that break the list/watch protocol, per kind and error; ignored.
    pub sync_protocol_errors: IntCounterVec,
    pub malformed_annotations: IntCounterVec,
    pub device_problems: IntCounterVec,
    /// DRA objects (or parts of them) that could not be used, by problem.
    pub dra_problems: IntCounterVec,
    /// Devices seen held by a DRA claim and by pods' annotations at once, per sighting.
    pub dra_conflicts: IntCounter,
    /// DRA claims with an allocation (`state="allocated"`), and allocated devices no slice
    /// names (`state="unresolved"`).
    pub dra_claims: IntGaugeVec,
    /// DeviceClasses that map a resource name the extender manages to DRA (KEP-5004).
    pub dra_extended_resource_classes: IntGauge,
    /// The extender's DeviceTaintRule writes, by `op` (create, delete) and `result`.
    pub dra_taint_rule_writes: IntCounterVec,
    /// The extender's DeviceTaintRules in the cache (DRA pools it owns or is taking).
    pub dra_taint_rules: IntGauge,
    /// Rules under the extender's names edited out of its form (reported, never recreated).
    pub dra_defaced_rules: IntGauge,
    /// DRA pools whose rule write failed and waits out its backoff.
    pub dra_taint_rule_backoff_pools: IntGauge,
    /// Nodes whose share-totals write failed and waits out its backoff.
    pub share_totals_backoff_nodes: IntGauge,
    pub share_totals_writes: IntCounterVec,
    pub preempt_candidates: IntCounterVec,
    pub share_totals_mismatched_nodes: IntGauge,
    /// Task kinds in the fragmentation strategy's workload mix (learned or the operator's).
    pub fragmentation_mix_kinds: IntGauge,
    /// NRT CPU annotations and zones that could not be used, by annotation and problem.
    pub nrt_problems: IntCounterVec,
    /// Connections per listener (`verbs`, `probes`): open now, accepted, refused or cut off
    /// by a limit (`reason`: [`CONNECTION_REJECTIONS`]), and closed by housekeeping
    /// ([`CONNECTION_CLOSES`]).
    /// Bind API writes abandoned because leadership was lost while they waited.
    pub binds_fenced: IntCounter,
    pub connections_open: IntGaugeVec,
    pub connections_accepted: IntCounterVec,
    pub connections_rejected: IntCounterVec,
    pub connections_closed: IntCounterVec,
    /// Bytes of request bodies being read or served, charged to `--body-budget-bytes`.
    pub request_body_bytes_in_flight: IntGauge,
    /// Request bodies refused before a handler saw them, by reason
    /// ([`BODY_REJECTIONS`]).
    pub request_bodies_rejected: IntCounterVec,
    /// Nodes whose capacity of a kind (`gpu`, `rdma`, `fpga`, `cpu`) grew, as the requeue
    /// signal took them (`crate::scheduler::requeue`).
    pub capacity_returns: IntCounterVec,
    /// Requeue signals by result ([`REQUEUE_RESULTS`]).
    pub requeue_signals: IntCounterVec,
    /// Pods the extender rejected everywhere and still remembers as waiting for capacity.
    pub requeue_waiting_pods: IntGauge,
    /// Admission webhook reviews by result ([`WEBHOOK_RESULTS`]).
    pub webhook_reviews: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        Self::build().with_series_at_zero()
    }

    fn build() -> Self {
        Metrics(Arc::new(MetricSet::register()))
    }
}

impl MetricSet {
    fn register() -> Self {
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
        MetricSet {
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
            tls_reloads: reg!(IntCounterVec::new(
                Opts::new(
                    "tls_certificate_reloads_total",
                    "Changes of the TLS certificate files by outcome (error: previous certificate kept)."
                ),
                &["outcome"]
            )),
            tls_handshake_failures: reg!(IntCounterVec::new(
                Opts::new(
                    "tls_handshake_failures_total",
                    "Verb-listener connections that failed the TLS handshake, by reason."
                ),
                &["reason"]
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
            pod_fences: reg!(IntCounterVec::new(
                Opts::new(
                    "pod_fences_total",
                    "Times binds were held until a fresh pod relist, by reason (became_leader, started, takeover_window, watch_error)."
                ),
                &["reason"]
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
            filter_rejected_nodes: reg!(IntCounterVec::new(
                Opts::new(
                    "filter_rejected_nodes_total",
                    "Candidate nodes filter rejected, by reason class."
                ),
                &["reason"]
            )),
            filter_results: reg!(IntCounterVec::new(
                Opts::new(
                    "filter_results_total",
                    "Filter requests by result: fits (some node passed), fits_nowhere, pass_through (no device needs), invalid_request."
                ),
                &["result"]
            )),
            filter_ranked_out: reg!(IntCounter::new(
                "filter_ranked_out_nodes_total",
                "Fitting nodes filter left out because others score better (--ranking=filter)."
            )),
            read_decisions: reg!(IntCounterVec::new(
                Opts::new(
                    "read_decisions_total",
                    "Candidate nodes filter and prioritize answered from the read snapshot, by verb and how: decided, or memo (a candidate with equal facts was decided for the same pod shape, in this request or a recent one)."
                ),
                &["verb", "how"]
            )),
            read_memo_bytes: reg!(IntGaugeVec::new(
                Opts::new(
                    "read_memo_bytes",
                    "Bytes the verdict memos of filter and prioritize keep between requests (tables and per-node slots of the last pod shapes), by verb, as of the verb's last request."
                ),
                &["verb"]
            )),
            assumed_expired: reg!(IntCounter::new(
                "assumed_expired_total",
                "Assumed allocations dropped because no bind confirmation arrived in time."
            )),
            assumed_released: reg!(IntCounterVec::new(
                Opts::new(
                    "assumed_released_total",
                    "Assumed allocations released because their pod is gone, unbound or elsewhere, by path (relist, probe, retry, ttl)."
                ),
                &["path"]
            )),
            assumed_entries: reg!(IntGaugeVec::new(
                Opts::new(
                    "assumed_entries",
                    "Assumed (not yet watch-confirmed) allocations by age bucket."
                ),
                &["age"]
            )),
            bind_patch_conflicts: reg!(IntCounter::new(
                "bind_patch_conflicts_total",
                "409 Conflicts on the bind's resourceVersion-guarded writes: the binding that carries its annotations (retried after a fresh read), or the removal of a stale annotation before it."
            )),
            bind_reads: reg!(IntCounterVec::new(
                Opts::new(
                    "bind_reads_total",
                    "Where binds read their pod: filter (the copy kube-scheduler sent with filter in the same cycle, no API call) or api (a GET)."
                ),
                &["source"]
            )),
            bind_pod_changed: reg!(IntCounter::new(
                "bind_pod_changed_total",
                "Binds whose binding got a 409 and whose re-read pod asked for something else than the decision was made for; failed for kube-scheduler to retry."
            )),
            bound_elsewhere: reg!(IntCounterVec::new(
                Opts::new(
                    "bind_found_bound_elsewhere_total",
                    "Pods found bound to another node during a bind or probe; their annotations were left alone."
                ),
                &["stage"]
            )),
            sync_protocol_errors: reg!(IntCounterVec::new(
                Opts::new(
                    "sync_protocol_errors_total",
                    "Sync events that break the list/watch protocol (ignored), per kind and error."
                ),
                &["kind", "error"]
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
            dra_problems: reg!(IntCounterVec::new(
                Opts::new(
                    "dra_problems_total",
                    "ResourceSlice devices and ResourceClaim results left out of the DRA join, by problem (malformed, device_named_twice, device_without_identity)."
                ),
                &["problem"]
            )),
            dra_conflicts: reg!(IntCounter::new(
                "dra_conflicts_total",
                "Devices seen held by a DRA claim and by pods' device-allocated annotations at once (both allocators handed them out), per sighting."
            )),
            dra_claims: reg!(IntGaugeVec::new(
                Opts::new(
                    "dra_claims",
                    "DRA ResourceClaims with an allocation (state=allocated), and allocated devices that no ResourceSlice names (state=unresolved)."
                ),
                &["state"]
            )),
            dra_extended_resource_classes: reg!(IntGauge::new(
                "dra_extended_resource_classes",
                "DeviceClasses whose extendedResourceName is a resource name the extender manages (KEP-5004): kube-scheduler serves it through DRA on nodes that do not advertise it."
            )),
            dra_taint_rule_writes: reg!(IntCounterVec::new(
                Opts::new(
                    "dra_taint_rule_writes_total",
                    "The extender's DeviceTaintRule writes (keeping DRA off the pools it owns), by op (create, delete) and result (ok, error)."
                ),
                &["op", "result"]
            )),
            dra_taint_rules: reg!(IntGauge::new(
                "dra_taint_rules",
                "The extender's DeviceTaintRules in its cache: DRA driver pools it owns or is taking over."
            )),
            dra_defaced_rules: reg!(IntGauge::new(
                "dra_defaced_rules",
                "DeviceTaintRules under the extender's names that were edited out of its form (managed-by label, taint or selector): their pools' devices are not handed out until the rule is deleted; never recreated over."
            )),
            dra_taint_rule_backoff_pools: reg!(IntGauge::new(
                "dra_taint_rule_backoff_pools",
                "DRA pools whose DeviceTaintRule write failed and that wait out a backoff (the tick, doubled per failure in a row, at most 30 s) before the next attempt."
            )),
            share_totals_backoff_nodes: reg!(IntGauge::new(
                "share_totals_backoff_nodes",
                "Nodes whose GPU share totals write failed and that wait out a backoff (the tick, doubled per failure in a row, at most 30 s) before the next attempt."
            )),
            preempt_candidates: reg!(IntCounterVec::new(
                Opts::new(
                    "preempt_candidates_total",
                    "Candidate nodes of preempt requests, by outcome: kept (kube-scheduler's victims make room), replaced (they do not; the extender answered the fewest others that do), dropped (nothing within the search's bounds does)."
                ),
                &["outcome"]
            )),
            share_totals_writes: reg!(IntCounterVec::new(
                Opts::new(
                    "share_totals_writes_total",
                    "Writes of a Node's GPU share totals (koordinator.sh/gpu-core, gpu-memory, gpu-memory-ratio in status.capacity and allocatable) by the extender (--gpu-share-totals=extender), by result (ok, error)."
                ),
                &["result"]
            )),
            share_totals_mismatched_nodes: reg!(IntGauge::new(
                "share_totals_mismatched_nodes",
                "Nodes whose advertised GPU share totals differ from the sums over their Device object's healthy GPUs, as of the last check (--gpu-share-totals=koord-manager or extender; after the extender's writes)."
            )),
            fragmentation_mix_kinds: reg!(IntGauge::new(
                "fragmentation_mix_kinds",
                "Task kinds in the workload mix the fragmentation strategy measures against (learned from the pods filter sees, or --fragmentation-mix); 0 until a pod is seen, and under other strategies."
            )),
            nrt_problems: reg!(IntCounterVec::new(
                Opts::new(
                    "nrt_problems_total",
                    "NodeResourceTopology CPU annotations or zones that could not be used (the node takes no cpuset pods), by annotation and problem."
                ),
                &["annotation", "problem"]
            )),
            binds_fenced: reg!(IntCounter::new(
                "bind_writes_abandoned_total",
                "Bind API writes abandoned because this replica lost leadership while they waited for an answer (their outcome is unknown; the allocation stays held until the pod is seen)."
            )),
            connections_open: reg!(IntGaugeVec::new(
                Opts::new("connections_open", "Open connections per listener."),
                &["listener"]
            )),
            connections_accepted: reg!(IntCounterVec::new(
                Opts::new(
                    "connections_accepted_total",
                    "Connections accepted per listener."
                ),
                &["listener"]
            )),
            connections_rejected: reg!(IntCounterVec::new(
                Opts::new(
                    "connections_rejected_total",
                    "Connections refused or cut off by a listener limit, by listener and reason (max_connections, evicted, header_timeout, header_too_large, tls_handshake, accept_error)."
                ),
                &["listener", "reason"]
            )),
            connections_closed: reg!(IntCounterVec::new(
                Opts::new(
                    "connections_closed_total",
                    "Connections closed by the server's housekeeping, by listener and reason (idle_timeout, max_age, shutdown)."
                ),
                &["listener", "reason"]
            )),
            request_body_bytes_in_flight: reg!(IntGauge::new(
                "request_body_bytes_in_flight",
                "Bytes of request bodies being read or served, charged to --body-budget-bytes."
            )),
            request_bodies_rejected: reg!(IntCounterVec::new(
                Opts::new(
                    "request_bodies_rejected_total",
                    "Request bodies refused before a handler saw them, by reason (declared_too_large, too_large, read_timeout, read_error)."
                ),
                &["reason"]
            )),
            capacity_returns: reg!(IntCounterVec::new(
                Opts::new(
                    "capacity_returns_total",
                    "Nodes whose free capacity of a kind (gpu, rdma, fpga, cpu) grew, as the requeue signal took them."
                ),
                &["kind"]
            )),
            requeue_signals: reg!(IntCounterVec::new(
                Opts::new(
                    "requeue_signals_total",
                    "Requeue signals (one Node annotation write makes kube-scheduler retry every pod the extender rejected), by result (written, no_waiting_pods, not_leader, node_gone, failed)."
                ),
                &["result"]
            )),
            requeue_waiting_pods: reg!(IntGauge::new(
                "requeue_waiting_pods",
                "Pods the extender rejected on every candidate node and remembers as waiting for capacity (forgotten when they fit, or after 15 minutes)."
            )),
            webhook_reviews: reg!(IntCounterVec::new(
                Opts::new(
                    "webhook_reviews_total",
                    "Admission webhook reviews by result (routed, already_routed, not_managed, other_scheduler, not_a_pod_creation, denied_undecodable_pod, bad_request)."
                ),
                &["result"]
            )),
            registry,
        }
    }
}

impl Metrics {
    /// Creates the series of every known label value at 0, so `rate()` and `absent()`-based
    /// alerts work before the first event, and every documented family is always exported.
    fn with_series_at_zero(self) -> Self {
        for kind in [
            "nodes",
            "pods",
            "devices",
            "noderesourcetopologies",
            "deviceclasses",
            "resourceslices",
            "resourceclaims",
            "devicetaintrules",
        ] {
            self.relists.with_label_values(&[kind]);
            self.watch_errors.with_label_values(&[kind]);
            self.cached_objects.with_label_values(&[kind]);
            self.sync_protocol_errors
                .with_label_values(&[kind, "init_done_without_init"]);
        }
        for reason in crate::placement::fit_error::REASON_CLASSES {
            self.filter_rejected_nodes.with_label_values(&[reason]);
        }
        for result in FILTER_RESULTS {
            self.filter_results.with_label_values(&[result]);
        }
        for verb in ["filter", "prioritize", "fragmentation"] {
            for how in ["decided", "memo"] {
                self.read_decisions.with_label_values(&[verb, how]);
            }
            self.read_memo_bytes.with_label_values(&[verb]);
        }
        self.malformed_annotations
            .with_label_values(&["device-allocated"]);
        for problem in [
            "malformed",
            "device_named_twice",
            "device_without_identity",
            "device_without_node",
        ] {
            self.dra_problems.with_label_values(&[problem]);
        }
        for state in ["allocated", "unresolved"] {
            self.dra_claims.with_label_values(&[state]);
        }
        for op in ["create", "delete"] {
            for result in ["ok", "error"] {
                self.dra_taint_rule_writes.with_label_values(&[op, result]);
            }
        }
        for outcome in ["ok", "error"] {
            self.share_totals_writes.with_label_values(&[outcome]);
        }
        for outcome in ["kept", "replaced", "dropped"] {
            self.preempt_candidates.with_label_values(&[outcome]);
        }
        for outcome in ["ok", "error"] {
            self.tls_reloads.with_label_values(&[outcome]);
        }
        for (_, kind) in crate::cluster::returns::ResourceKinds::LABELED {
            self.capacity_returns.with_label_values(&[kind]);
        }
        for result in WEBHOOK_RESULTS {
            self.webhook_reviews.with_label_values(&[result]);
        }
        for result in REQUEUE_RESULTS {
            self.requeue_signals.with_label_values(&[result]);
        }
        for listener in ["verbs", "probes"] {
            self.connections_open.with_label_values(&[listener]);
            self.connections_accepted.with_label_values(&[listener]);
            for reason in CONNECTION_REJECTIONS {
                self.connections_rejected
                    .with_label_values(&[listener, reason]);
            }
            for reason in CONNECTION_CLOSES {
                self.connections_closed
                    .with_label_values(&[listener, reason]);
            }
        }
        for reason in BODY_REJECTIONS {
            self.request_bodies_rejected.with_label_values(&[reason]);
        }
        for reason in TLS_HANDSHAKE_FAILURES {
            self.tls_handshake_failures.with_label_values(&[reason]);
        }
        for path in ["relist", "probe", "retry", "ttl"] {
            self.assumed_released.with_label_values(&[path]);
        }
        for age in ASSUMED_AGE_BUCKETS {
            self.assumed_entries.with_label_values(&[age]);
        }
        for reason in ["became_leader", "started", "takeover_window", "watch_error"] {
            self.pod_fences.with_label_values(&[reason]);
        }
        for stage in ["patch", "binding", "probe"] {
            self.bound_elsewhere.with_label_values(&[stage]);
        }
        for source in ["filter", "api"] {
            self.bind_reads.with_label_values(&[source]);
        }
        self
    }

    /// `dne_read_memo_bytes{verb}`: what `verb`'s memos keep now.
    pub fn set_memo_bytes(&self, verb: &str, bytes: usize) {
        self.read_memo_bytes
            .with_label_values(&[verb])
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
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

/// Why a request body was not admitted (`extender::admission`); the `reason` label of
/// `dne_request_bodies_rejected_total`, every value pre-registered.
pub const BODY_REJECTIONS: &[&str] = &[
    "declared_too_large",
    "too_large",
    "read_timeout",
    "read_error",
];

/// Label values of `dne_tls_handshake_failures_total{reason}`.
/// Why a listener refused or cut off a connection.
pub const CONNECTION_REJECTIONS: [&str; 6] = [
    "max_connections",
    "evicted",
    "header_timeout",
    "header_too_large",
    "tls_handshake",
    "accept_error",
];

/// Why the server's housekeeping closed a connection.
pub const CONNECTION_CLOSES: [&str; 3] = ["idle_timeout", "max_age", "shutdown"];

pub const TLS_HANDSHAKE_FAILURES: [&str; 6] = [
    "timeout",
    "no_client_certificate",
    "bad_client_certificate",
    "not_tls",
    "handshake",
    "io",
];

/// Label values of `dne_assumed_entries{age}`, youngest first.
pub const ASSUMED_AGE_BUCKETS: [&str; 4] = ["lt_10s", "lt_1m", "lt_5m", "ge_5m"];

/// Label values of `dne_webhook_reviews_total{result}`.
pub const WEBHOOK_RESULTS: [&str; 9] = [
    "routed",
    "already_routed",
    // Already the extender's, with deprecated resource names renamed.
    "renamed",
    // A managed pod that presets spec.nodeName (issue 36 §4).
    "denied_preset_node_name",
    "not_managed",
    "other_scheduler",
    "not_a_pod_creation",
    "denied_undecodable_pod",
    "bad_request",
];

/// Label values of `dne_requeue_signals_total{result}`.
pub const REQUEUE_RESULTS: [&str; 5] = [
    "written",
    "no_waiting_pods",
    "not_leader",
    "node_gone",
    "failed",
];

/// Label values of `dne_filter_results_total{result}`.
pub const FILTER_RESULTS: [&str; 4] = ["fits", "fits_nowhere", "pass_through", "invalid_request"];
