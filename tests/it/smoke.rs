//! The service against the fake API server, end to end in one process: bootstrap, readiness,
//! a filter → prioritize → bind round trip, and the watch confirming the bind.

use std::time::Duration;

use serde_json::json;

use crate::support::service::{self, Http};
use crate::support::{FakeApiServer, Kind};

#[tokio::test]
async fn bootstrap_then_filter_prioritize_bind() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 8, &[]);
    fake.create(Kind::NodeResourceTopology, service::nrt("n1"))
        .unwrap();
    let pending = service::pending("p", json!({"nvidia.com/gpu": "2"}));
    fake.create(Kind::Pod, pending.clone()).unwrap();

    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    let ready = http.wait_ready(Duration::from_secs(10)).await;
    assert_eq!(ready["kinds"]["devices"]["phase"], "synced");

    let (status, filtered) = http
        .post("/filter", &service::extender_args(&pending, &["n1"]))
        .await;
    assert_eq!(status, 200);
    assert_eq!(filtered["NodeNames"], json!(["n1"]), "{filtered}");
    let (_, scores) = http
        .post("/prioritize", &service::extender_args(&pending, &["n1"]))
        .await;
    // One candidate: its score is the lowest one, which the answer leaves out.
    assert_eq!(scores, json!([]));
    let (status, bound) = http
        .post("/bind", &service::binding_args(&pending, "n1"))
        .await;
    assert_eq!((status, &bound["Error"]), (200, &json!("")), "{bound}");

    let pod = fake.get(Kind::Pod, "ml", "p").unwrap();
    assert_eq!(pod["spec"]["nodeName"], "n1");
    let annotation = pod["metadata"]["annotations"]["scheduling.koordinator.sh/device-allocated"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        annotation.contains("\"minor\":0") && annotation.contains("\"minor\":1"),
        "{annotation}"
    );

    // The pod watch confirms the assumed entry.
    let cluster = svc.state.scheduler.cluster.clone();
    service::eventually(
        Duration::from_secs(5),
        "the watch to commit the bind",
        || cluster.debug_dump()["n1"]["devices"]["entries"]["uid-p"]["state"] == "committed",
    )
    .await;
    svc.shutdown().await.unwrap();
}
