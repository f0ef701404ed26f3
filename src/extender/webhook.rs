//! The admission webhook (`serve --webhook-listen`): `POST /mutate-pods` answers kube-apiserver's
//! `AdmissionReview` for pod creations, setting `spec.schedulerName` to the extender's scheduler
//! on pods the routing rule claims (`placement::routing`), so no device or cpuset pod is scheduled
//! by a scheduler that knows nothing of device shares or cpusets.
//!
//! Why a listener of `serve`, not a subcommand: the answer needs no cache, leader or API
//! call, only the rule, so every replica answers (a standby too) from the same process and
//! configuration as the extender, on the same hardened listener (`super::listener`: connection
//! caps, header and body deadlines), without a second Deployment to run and upgrade in step.
//! TLS only: kube-apiserver calls webhooks over HTTPS and verifies the serving certificate
//! against the configuration's `caBundle`.
//!
//! Bad input never panics and never half-answers: a body that is not an `AdmissionReview`
//! gets a 400 naming the problem (kube-apiserver then applies the configuration's
//! `failurePolicy`); a review whose pod cannot be decoded is denied with the decoder's message.
//! Anything that is not a pod creation is allowed unchanged.
//!
//! This module translates HTTP to the rule and back; the rule decides.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

use super::input::read_body;
use crate::metrics::Metrics;
use crate::model::pod::Pod;
use crate::placement::routing::{Rename, Routing, RoutingRule};

/// The webhook's path (the chart's `MutatingWebhookConfiguration` points here).
pub const MUTATE_PODS_PATH: &str = "/mutate-pods";

#[derive(Clone)]
pub struct WebhookState {
    pub rule: Arc<RoutingRule>,
    pub metrics: Metrics,
    pub body_limit: usize,
}

/// The webhook listener's routes: `/mutate-pods`, and `/healthz` for the connection check.
/// `/mutate-pods` has the verbs' protections with the webhook's own limits (issue 36 §2): its
/// body is read whole under `http.bodies` (a size sized to an AdmissionReview, a read deadline,
/// a byte budget of its own) before it takes one of `http.max_concurrency` slots, and the
/// answer comes within `http.request_timeout` (a 503 at worst, which kube-apiserver turns into
/// the configuration's failurePolicy).
pub fn router(state: WebhookState, http: &super::HttpConfig) -> Router {
    let reviews = Router::new()
        .route(MUTATE_PODS_PATH, post(mutate_pods))
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
            http.max_concurrency.max(1),
        ))
        .layer(axum::middleware::from_fn_with_state(
            super::admission::BodyAdmission::new(http.bodies.clone(), state.metrics.clone()),
            super::admission::admit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            (http.request_timeout, state.metrics.clone()),
            super::timeout,
        ));
    reviews
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .fallback(|request: axum::extract::Request| async move {
            (
                StatusCode::NOT_FOUND,
                axum::Json(serde_json::json!({
                    "error": format!("no route for {} {} on the webhook listener (POST {MUTATE_PODS_PATH})", request.method(), request.uri().path())
                })),
            )
        })
        .with_state(state)
}

/// Why a body got no review back.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadReview {
    #[error("the body is not an AdmissionReview: {0}")]
    NotAReview(String),
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("unsupported AdmissionReview apiVersion {0:?}: admission.k8s.io/v1 only")]
    Version(String),
}

/// Answers one review body: `Ok((review, result))` (`result`: one of
/// `crate::metrics::WEBHOOK_RESULTS`), or why there is no review to answer.
pub fn review(
    rule: &RoutingRule,
    body: &[u8],
) -> Result<(AdmissionReview<DynamicObject>, &'static str), BadReview> {
    let review = match serde_json::from_slice::<AdmissionReview<DynamicObject>>(body) {
        Ok(review) => review,
        Err(e) => return Err(why_not_a_review(body, e)),
    };
    if review.types.api_version != "admission.k8s.io/v1" {
        return Err(version_error(&review.types.api_version));
    }
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| BadReview::NoRequest)?;
    let response = AdmissionResponse::from(&request);
    let is_pod_create = request.kind.group.is_empty()
        && request.kind.kind == "Pod"
        && request.operation == Operation::Create
        && request.sub_resource.as_deref().unwrap_or("").is_empty();
    let Some(object) = request.object.as_ref().filter(|_| is_pod_create) else {
        return Ok((response.into_review(), "not_a_pod_creation"));
    };
    let pod: Pod = match serde_json::to_value(object).and_then(serde_json::from_value) {
        Ok(pod) => pod,
        Err(e) => {
            let why = format!("device-numa-extender cannot decode the pod to route it: {e}");
            return Ok((response.deny(why).into_review(), "denied_undecodable_pod"));
        }
    };
    let with_ops = |response: AdmissionResponse, ops: Vec<serde_json::Value>| {
        let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
            .expect("well-formed JSON patch operations");
        response.with_patch(patch).expect("a JSON patch serializes")
    };
    let renamed_note = |renames: &[Rename]| {
        let names: std::collections::BTreeSet<String> = renames
            .iter()
            .map(|r| format!("{} to {}", r.from, r.to))
            .collect();
        format!(
            "renamed koordinator's deprecated resource names ({}): kube-scheduler cannot route them to the extender",
            names.into_iter().collect::<Vec<_>>().join(", ")
        )
    };
    let (response, result) = match rule.route(&pod) {
        Routing::Route { why, renames } => {
            let mut ops = vec![serde_json::json!(
                { "op": "add", "path": "/spec/schedulerName", "value": rule.scheduler_name }
            )];
            ops.extend(renames.iter().map(Rename::patch_op));
            let mut response = with_ops(response, ops);
            response.audit_annotations.insert(
                "routed".to_string(),
                format!("schedulerName set to {}: {why}", rule.scheduler_name),
            );
            if !renames.is_empty() {
                response.warnings = Some(vec![renamed_note(&renames)]);
            }
            (response, "routed")
        }
        Routing::AlreadyRouted { renames } if renames.is_empty() => (response, "already_routed"),
        Routing::AlreadyRouted { renames } => {
            let mut response = with_ops(response, renames.iter().map(Rename::patch_op).collect());
            response.warnings = Some(vec![renamed_note(&renames)]);
            (response, "renamed")
        }
        Routing::NotManaged => (response, "not_managed"),
        Routing::OtherScheduler { scheduler, why } => {
            let mut response = response;
            response.warnings = Some(vec![format!(
                "{why} but names scheduler {scheduler:?}: its device shares and cpusets are not tracked by device-numa-extender ({})",
                rule.scheduler_name
            )]);
            (response, "other_scheduler")
        }
        Routing::PresetNode { node, why } => (
            response.deny(format!(
                "device-numa-extender: {why} but sets spec.nodeName={node:?}: such a pod reaches no scheduler, so no device or cpuset is allocated to it and the extender cannot see what it holds. Leave spec.nodeName empty and pin the node with a nodeSelector on kubernetes.io/hostname instead; to run such pods anyway, leave their namespace out of the webhook's namespaceSelector (the chart's webhook.namespaceSelector)"
            )),
            "denied_preset_node_name",
        ),
    };
    Ok((response.into_review(), result))
}

/// Why a body that does not decode is refused: its version when it names another one (older
/// API servers send v1beta1), else the decoder's reason. Decodes the body again, on this
/// failure path only.
fn why_not_a_review(body: &[u8], decode: serde_json::Error) -> BadReview {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(rename = "apiVersion", default)]
        api_version: String,
    }
    match serde_json::from_slice::<Head>(body) {
        Ok(head) if head.api_version.is_empty() => {
            BadReview::NotAReview("it has no apiVersion".to_string())
        }
        Ok(head) if head.api_version != "admission.k8s.io/v1" => version_error(&head.api_version),
        _ => BadReview::NotAReview(decode.to_string()),
    }
}

fn version_error(api_version: &str) -> BadReview {
    if api_version.is_empty() {
        BadReview::NotAReview("it has no apiVersion".to_string())
    } else {
        BadReview::Version(api_version.to_string())
    }
}

async fn mutate_pods(
    State(state): State<WebhookState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let count = |result: &str| {
        state
            .metrics
            .webhook_reviews
            .with_label_values(&[result])
            .inc();
    };
    let bytes = match read_body(&headers, body, state.body_limit).await {
        Ok(b) => b,
        Err(bad) => {
            count("bad_request");
            return bad.into_response();
        }
    };
    match review(&state.rule, &bytes) {
        Ok((review, result)) => {
            count(result);
            axum::Json(review).into_response()
        }
        Err(e) => {
            count("bad_request");
            tracing::warn!(error = %e, "webhook: bad AdmissionReview");
            (
                StatusCode::BAD_REQUEST,
                axum::Json(serde_json::json!({ "error": e.to_string() })),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> RoutingRule {
        RoutingRule {
            scheduler_name: "device-numa-scheduler".into(),
            managed_resources: ["nvidia.com/gpu".to_string()].into(),
            cpuset_qos: false,
        }
    }

    fn body(object: serde_json::Value, operation: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "ml",
                "operation": operation,
                "userInfo": {"username": "admin"},
                "object": object,
                "dryRun": false
            }
        }))
        .unwrap()
    }

    fn gpu_pod(scheduler: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        })
    }

    fn answer(b: &[u8]) -> (serde_json::Value, &'static str) {
        let (review, result) = review(&rule(), b).unwrap();
        (serde_json::to_value(review).unwrap(), result)
    }

    #[test]
    fn a_gpu_pod_of_the_default_scheduler_is_routed_with_a_json_patch() {
        let (v, result) = answer(&body(gpu_pod("default-scheduler"), "CREATE"));
        assert_eq!(result, "routed");
        let r = &v["response"];
        assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(r["allowed"], true);
        assert_eq!(r["patchType"], "JSONPatch");
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(v["kind"], "AdmissionReview");
        // kube-core writes the bytes as a JSON array, which Go's decoder takes for a []byte
        // as it takes base64 (the real-control-plane scenario proves kube-apiserver applies it).
        let bytes: Vec<u8> = serde_json::from_value(r["patch"].clone()).expect("patch bytes");
        let ops: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            ops,
            serde_json::json!([{"op": "add", "path": "/spec/schedulerName", "value": "device-numa-scheduler"}])
        );
    }

    #[test]
    fn other_pods_and_operations_pass_unchanged() {
        let plain =
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}});
        for (object, op, want) in [
            (plain, "CREATE", "not_managed"),
            (gpu_pod("default-scheduler"), "UPDATE", "not_a_pod_creation"),
            (gpu_pod("device-numa-scheduler"), "CREATE", "already_routed"),
        ] {
            let (v, result) = answer(&body(object, op));
            assert_eq!(result, want);
            assert_eq!(v["response"]["allowed"], true, "{v}");
            assert!(v["response"].get("patch").is_none(), "{v}");
        }
        let (v, result) = answer(&body(gpu_pod("volcano"), "CREATE"));
        assert_eq!(result, "other_scheduler");
        assert_eq!(v["response"]["allowed"], true);
        assert!(
            v["response"]["warnings"][0]
                .as_str()
                .unwrap()
                .contains("volcano")
        );
    }

    fn patch_ops(v: &serde_json::Value) -> serde_json::Value {
        let bytes: Vec<u8> =
            serde_json::from_value(v["response"]["patch"].clone()).expect("patch bytes");
        serde_json::from_slice(&bytes).unwrap()
    }

    /// Issue 36 §3: a pod asking for a deprecated name is routed and gets the current name.
    #[test]
    fn deprecated_names_are_routed_and_renamed() {
        let rule = RoutingRule {
            managed_resources: crate::placement::routing::default_managed_resources(),
            ..rule()
        };
        let pod = serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"kubernetes.io/gpu-memory-ratio": "50"}}}]}
        });
        let (answer, result) = review(&rule, &body(pod.clone(), "CREATE")).unwrap();
        let v = serde_json::to_value(answer).unwrap();
        assert_eq!(result, "routed");
        assert_eq!(
            patch_ops(&v),
            serde_json::json!([
                {"op": "add", "path": "/spec/schedulerName", "value": "device-numa-scheduler"},
                {"op": "move", "from": "/spec/containers/0/resources/limits/kubernetes.io~1gpu-memory-ratio",
                 "path": "/spec/containers/0/resources/limits/koordinator.sh~1gpu-memory-ratio"}
            ])
        );
        assert!(
            v["response"]["warnings"][0]
                .as_str()
                .unwrap()
                .contains("kubernetes.io/gpu-memory-ratio to koordinator.sh/gpu-memory-ratio"),
            "{v}"
        );
        // Already the extender's: renamed only.
        let mut ours = pod;
        ours["spec"]["schedulerName"] = "device-numa-scheduler".into();
        let (answer, result) = review(&rule, &body(ours, "CREATE")).unwrap();
        let v = serde_json::to_value(answer).unwrap();
        assert_eq!(result, "renamed");
        assert_eq!(patch_ops(&v).as_array().unwrap().len(), 1, "{v}");
    }

    /// Issue 36 §4: a managed pod with a preset nodeName is denied, and the message says why
    /// and how to opt out.
    #[test]
    fn a_managed_pod_with_a_preset_node_name_is_denied() {
        let mut pod = gpu_pod("default-scheduler");
        pod["spec"]["nodeName"] = "gpu-1".into();
        let (v, result) = answer(&body(pod, "CREATE"));
        assert_eq!(result, "denied_preset_node_name");
        assert_eq!(v["response"]["allowed"], false);
        let message = v["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("spec.nodeName=\"gpu-1\"") && message.contains("namespaceSelector"),
            "{message}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        /// Any bytes: an answer or a reason, never a panic.
        #[test]
        fn any_body_is_answered_or_refused(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = review(&rule(), &bytes);
        }

        /// A well-formed review (an object with metadata, as kube-apiserver always sends)
        /// whose pod spec and status are any JSON shape: answered (allowed, routed, or denied
        /// with the decoder's reason), never a panic and never a 400.
        #[test]
        fn any_pod_shape_is_answered(spec in json_value(3), status in json_value(1)) {
            let object = serde_json::json!({"metadata": {"name": "p"}, "spec": spec, "status": status});
            let answered = review(&rule(), &body(object, "CREATE"));
            proptest::prop_assert!(answered.is_ok(), "{:?}", answered.err());
        }
    }

    fn json_value(depth: u32) -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            prop_oneof![
                Just("nvidia.com/gpu".to_string()),
                Just("default-scheduler".to_string()),
                Just("1".to_string()),
                "[a-z/.]{0,12}",
            ]
            .prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(depth, 32, 4, |inner| {
            let keys = prop_oneof![
                Just("metadata".to_string()),
                Just("spec".to_string()),
                Just("containers".to_string()),
                Just("initContainers".to_string()),
                Just("resources".to_string()),
                Just("limits".to_string()),
                Just("requests".to_string()),
                Just("schedulerName".to_string()),
                Just("labels".to_string()),
                "[a-z]{1,6}",
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map(keys, inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn bad_bodies_get_a_reason_never_a_panic() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"".to_vec(), "not an AdmissionReview"),
            (b"{".to_vec(), "not an AdmissionReview"),
            (b"[]".to_vec(), "not an AdmissionReview"),
            (b"\xff\xfe".to_vec(), "not an AdmissionReview"),
            (br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(), "no request"),
            (br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#.to_vec(), "apiVersion"),
            (br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"}}"#.to_vec(), "not an AdmissionReview"),
        ];
        for (b, want) in cases {
            let e = review(&rule(), &b).unwrap_err();
            assert!(
                e.to_string().contains(want),
                "{:?}: {e}",
                String::from_utf8_lossy(&b)
            );
        }
        // A pod whose spec is not an object: denied, with the decoder's reason.
        let (v, result) = answer(&body(
            serde_json::json!({"metadata": {"name": "p"}, "spec": "nope"}),
            "CREATE",
        ));
        assert_eq!(result, "denied_undecodable_pod");
        assert_eq!(v["response"]["allowed"], false);
        assert!(
            v["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains("cannot decode"),
            "{v}"
        );
    }
}
