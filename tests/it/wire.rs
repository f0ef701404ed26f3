//! The wire protocol (DESIGN.md §4): golden bodies as kube-scheduler sends them, in both
//! `nodeCacheCapable` modes and with every key lower-cased, answered with PascalCase keys and
//! `null`s; and every class of malformed input rejected with a 4xx JSON error that names the
//! problem, leaving the cache untouched and the service alive.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::service::{self, Http};
use crate::support::{FakeApiServer, Kind};

const TIMEOUT: Duration = Duration::from_secs(30);

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/wire")
        .join(name)
}

fn fixture_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixture_path(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

fn fixture(name: &str) -> Value {
    serde_json::from_slice(&fixture_bytes(name)).expect("fixture is JSON")
}

/// The fake cluster the golden bodies were written against: gpu-a1 with 8 free GPUs, gpu-a2
/// with both GPUs held by batch pods, cpu-07 whose Device has no GPUs.
async fn golden_cluster() -> (FakeApiServer, device_numa_extender::app::Service, Http) {
    let cluster = fixture("cluster.json");
    let fake = FakeApiServer::new();
    for n in cluster["nodes"].as_array().unwrap() {
        fake.create(Kind::Node, n.clone()).unwrap();
    }
    fake.create(Kind::Device, service::gpu_device("gpu-a1", 8, 4, &[]))
        .unwrap();
    fake.create(Kind::Device, service::gpu_device("gpu-a2", 2, 1, &[]))
        .unwrap();
    fake.create(Kind::Device, service::gpu_device("cpu-07", 0, 1, &[]))
        .unwrap();
    for p in cluster["victims"].as_array().unwrap() {
        fake.create(Kind::Pod, p.clone()).unwrap();
    }
    fake.create(Kind::Pod, cluster["pending"].clone()).unwrap();
    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    (fake, svc, http)
}

async fn post_fixture(http: &Http, path: &str, name: &str) -> Value {
    let (status, body) = http
        .send("POST", path, Some("application/json"), fixture_bytes(name))
        .await;
    assert_eq!(status, 200, "{name} -> {path}: {body}");
    body
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    k.sort_unstable();
    k
}

const FILTER_KEYS: [&str; 5] = [
    "Error",
    "FailedAndUnresolvableNodes",
    "FailedNodes",
    "NodeNames",
    "Nodes",
];

async fn golden_round(suffix: &str) {
    let (fake, svc, http) = golden_cluster().await;
    let name = |base: &str| format!("{base}{suffix}.json");

    // Filter, names mode.
    let r = post_fixture(&http, "/filter", &name("filter-names")).await;
    assert_eq!(keys(&r), FILTER_KEYS, "PascalCase keys, none omitted: {r}");
    assert_eq!(r["Nodes"], Value::Null, "{r}");
    assert_eq!(r["NodeNames"], json!(["gpu-a1"]), "{r}");
    assert_eq!(keys(&r["FailedNodes"]), ["gpu-a2"], "{r}");
    assert_eq!(keys(&r["FailedAndUnresolvableNodes"]), ["cpu-07"], "{r}");
    assert_eq!(r["Error"], "", "{r}");

    // Filter, nodes mode: the passing Node objects come back as they were sent.
    let request = fixture(&name("filter-nodes"));
    let r = post_fixture(&http, "/filter", &name("filter-nodes")).await;
    assert_eq!(keys(&r), FILTER_KEYS, "{r}");
    assert_eq!(r["NodeNames"], Value::Null, "{r}");
    let nodes_key = if suffix.is_empty() { "Nodes" } else { "nodes" };
    let sent_a1 = request[nodes_key]["items"][0].clone();
    assert_eq!(sent_a1["metadata"]["name"], "gpu-a1");
    assert_eq!(
        r["Nodes"]["items"],
        json!([sent_a1]),
        "Node objects are echoed verbatim"
    );
    assert!(r["Nodes"]["metadata"].is_object(), "{r}");
    assert_eq!(keys(&r["FailedNodes"]), ["gpu-a2"], "{r}");
    assert_eq!(keys(&r["FailedAndUnresolvableNodes"]), ["cpu-07"], "{r}");

    // Prioritize, both modes: a bare array of {Host, Score}, only the hosts whose score is
    // above the lowest one, shifted by it, every score inside the API's 0..=10.
    for mode in ["prioritize-names", "prioritize-nodes"] {
        let r = post_fixture(&http, "/prioritize", &name(mode)).await;
        let list = r.as_array().unwrap_or_else(|| panic!("{mode}: {r}"));
        let hosts: Vec<&Value> = list.iter().map(|h| &h["Host"]).collect();
        assert_eq!(hosts, [&json!("gpu-a1")], "{mode}: {r}");
        for h in list {
            assert_eq!(keys(h), ["Host", "Score"], "{mode}: {r}");
            let s = h["Score"].as_i64().unwrap_or(-1);
            assert!(
                (1..=10).contains(&s),
                "{mode}: integer above the left-out 0: {r}"
            );
        }
    }

    // Preempt, both modes: only gpu-a2 can be helped by evicting its victim; the answer is
    // always the Meta form.
    let want = json!({"NodeNameToMetaVictims": {"gpu-a2": {
        "Pods": [{"UID": "6a1b2c3d-0000-4000-8000-000000000001"}], "NumPDBViolations": 0}}});
    for mode in ["preempt-names", "preempt-nodes"] {
        let r = post_fixture(&http, "/preempt", &name(mode)).await;
        assert_eq!(r, want, "{mode}");
    }

    // Bind commits on the API server.
    let r = post_fixture(&http, "/bind", &name("bind")).await;
    assert_eq!(r, json!({"Error": ""}));
    let pod = fake.get(Kind::Pod, "ml", "infer-7d9f-x2k").unwrap();
    assert_eq!(pod["spec"]["nodeName"], "gpu-a1");
    assert!(
        pod["metadata"]["annotations"]["scheduling.koordinator.sh/device-allocated"].is_string(),
        "{pod}"
    );
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_bodies_as_kube_scheduler_sends_them() {
    golden_round("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_bodies_with_every_key_lower_cased() {
    golden_round(".lower").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_filter_answer_is_pascal_case_with_nulls() {
    let fake = FakeApiServer::new();
    // The pod list is held for the whole test: the service cannot become ready.
    fake.hold_lists(Kind::Pod);
    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    let r = post_fixture(&http, "/filter", "filter-names.json").await;
    assert_eq!(keys(&r), FILTER_KEYS, "{r}");
    for k in [
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
    ] {
        assert_eq!(r[k], Value::Null, "{r}");
    }
    assert!(
        r["Error"].as_str().unwrap().starts_with("not ready:"),
        "{r}"
    );
    let r = post_fixture(&http, "/bind", "bind.json").await;
    assert_eq!(keys(&r), ["Error"], "{r}");
    svc.shutdown().await.unwrap();
}

/// One malformed request and what the answer must say.
struct Bad {
    what: &'static str,
    path: &'static str,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    says: &'static [&'static str],
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_gets_a_4xx_naming_the_problem_and_changes_nothing() {
    const LIMIT: usize = 64 * 1024;
    let cluster = fixture("cluster.json");
    let fake = FakeApiServer::new();
    for n in cluster["nodes"].as_array().unwrap() {
        fake.create(Kind::Node, n.clone()).unwrap();
    }
    fake.create(Kind::Device, service::gpu_device("gpu-a1", 8, 4, &[]))
        .unwrap();
    for p in cluster["victims"].as_array().unwrap() {
        fake.create(Kind::Pod, p.clone()).unwrap();
    }
    fake.create(Kind::Pod, cluster["pending"].clone()).unwrap();
    let limit = LIMIT.to_string();
    let svc = service::start(&fake, &["--body-limit-bytes", &limit]).await;
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    crate::support::service::wait_for_all_watches(&fake, TIMEOUT).await;

    let filter = fixture_bytes("filter-names.json");
    let bind = fixture_bytes("bind.json");
    let json_ct = Some("application/json");
    let mut wrong_shape_nested = fixture("filter-names.json");
    wrong_shape_nested["Pod"]["spec"]["containers"] = json!("server");
    let mut with_garbage = filter.clone();
    with_garbage.extend_from_slice(b" {\"extra\": 1}");
    let mut huge = fixture("filter-names.json");
    huge["NodeNames"] = json!((0..10_000).map(|i| format!("node-{i}")).collect::<Vec<_>>());
    let cases = vec![
        Bad {
            what: "wrong content type",
            path: "/filter",
            content_type: Some("text/plain"),
            body: filter.clone(),
            status: 415,
            says: &["Content-Type", "application/json", "text/plain"],
        },
        Bad {
            what: "no content type",
            path: "/bind",
            content_type: None,
            body: bind.clone(),
            status: 415,
            says: &["Content-Type"],
        },
        Bad {
            what: "not JSON",
            path: "/filter",
            content_type: json_ct,
            body: b"Pod=infer&Node=gpu-a1".to_vec(),
            status: 400,
            says: &["not valid JSON", "line 1"],
        },
        Bad {
            what: "truncated",
            path: "/filter",
            content_type: json_ct,
            body: filter[..filter.len() / 2].to_vec(),
            status: 400,
            says: &["truncated"],
        },
        Bad {
            what: "empty",
            path: "/bind",
            content_type: json_ct,
            body: Vec::new(),
            status: 400,
            says: &["truncated or empty"],
        },
        Bad {
            what: "wrong shape at the top",
            path: "/filter",
            content_type: json_ct,
            body: br#"{"Pod": {}, "NodeNames": "gpu-a1"}"#.to_vec(),
            status: 422,
            says: &["wrong shape", "NodeNames"],
        },
        Bad {
            what: "wrong shape deep in the pod",
            path: "/prioritize",
            content_type: json_ct,
            body: wrong_shape_nested.to_string().into_bytes(),
            status: 422,
            says: &["wrong shape", "Pod.spec.containers"],
        },
        Bad {
            what: "wrong shape in bind",
            path: "/bind",
            content_type: json_ct,
            body: br#"{"PodName": 3, "PodNamespace": "ml", "PodUID": "u", "Node": "gpu-a1"}"#
                .to_vec(),
            status: 422,
            says: &["wrong shape", "PodName"],
        },
        Bad {
            what: "a JSON array instead of an object",
            path: "/preempt",
            content_type: json_ct,
            body: b"[1, 2]".to_vec(),
            status: 422,
            says: &["wrong shape"],
        },
        Bad {
            what: "trailing garbage",
            path: "/filter",
            content_type: json_ct,
            body: with_garbage,
            status: 400,
            says: &["trailing characters"],
        },
        Bad {
            what: "over --body-limit-bytes",
            path: "/filter",
            content_type: json_ct,
            body: huge.to_string().into_bytes(),
            status: 413,
            says: &["exceeds the limit", "65536", "--body-limit-bytes"],
        },
    ];
    for bad in &cases {
        if bad.what == "over --body-limit-bytes" {
            assert!(bad.body.len() > LIMIT);
        }
        let before = svc.state.scheduler.cluster.debug_dump();
        let (status, body) = http
            .send("POST", bad.path, bad.content_type, bad.body.clone())
            .await;
        assert_eq!(status, bad.status, "{}: {body}", bad.what);
        assert_eq!(keys(&body), ["error"], "{}: a JSON error: {body}", bad.what);
        let message = body["error"].as_str().unwrap_or_default();
        for word in bad.says {
            assert!(
                message.contains(word),
                "{}: the error names {word:?}: {message}",
                bad.what
            );
        }
        assert_eq!(
            svc.state.scheduler.cluster.debug_dump(),
            before,
            "{}: the cache must not change",
            bad.what
        );
        let (status, _) = http.get("/healthz").await;
        assert_eq!(status, 200, "{}: still alive", bad.what);
    }
    assert_eq!(
        fake.get(Kind::Pod, "ml", "infer-7d9f-x2k").unwrap()["spec"]["nodeName"],
        Value::Null,
        "no malformed bind reached the API server"
    );

    for (method, path) in [
        ("GET", "/nope"),
        ("POST", "/filter/extra"),
        ("POST", "/v1/bind"),
    ] {
        let (status, body) = http.send(method, path, json_ct, b"{}".to_vec()).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert_eq!(
            body,
            json!({"error": format!("no route for {method} {path}")}),
            "{method} {path}"
        );
    }

    for (method, path) in [("GET", "/filter"), ("PUT", "/bind"), ("POST", "/readyz")] {
        let (status, body) = http.send(method, path, json_ct, b"{}".to_vec()).await;
        assert_eq!(status, 405, "{method} {path}: {body}");
        assert_eq!(
            body,
            json!({"error": format!("method {method} is not allowed on {path}")}),
            "{method} {path}"
        );
    }

    // Still serving real requests.
    let (status, r) = http.send("POST", "/filter", json_ct, filter.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(r["Error"], "", "{r}");
    svc.shutdown().await.unwrap();
}
