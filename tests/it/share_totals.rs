//! `--gpu-share-totals` against the fake API server: the leader writes each node's GPU share
//! totals into the Node's status (and only there), follows a Device change, takes its own totals
//! back when a Device object goes (and never writes a Device-less node's totals it did not
//! write: a device plugin's), is granted every call it makes by the chart's table, and the
//! default mode says in readiness that share pods cannot preempt.

use std::time::Duration;

use device_numa_extender::api_calls::{
    API_CALLS, DRA_OWNERSHIP_API_CALLS, REQUEUE_API_CALLS, SHARE_TOTALS_API_CALLS,
};
use serde_json::{Value, json};

use crate::support::service::{self, Http, eventually};
use crate::support::{FakeApiServer, Kind};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The node's `status.<field>.<name>`, as text.
fn status_of(fake: &FakeApiServer, node: &str, field: &str, name: &str) -> Option<String> {
    let n = fake.get(Kind::Node, "", node)?;
    n["status"][field][name].as_str().map(str::to_string)
}

fn warnings(ready: &Value) -> Vec<String> {
    ready["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `/readyz` until its warnings satisfy `done`, failing the test after [`TIMEOUT`].
async fn wait_warnings(http: &Http, what: &str, done: impl Fn(&[String]) -> bool) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let (_, ready) = http.get("/readyz").await;
        if done(&warnings(&ready)) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {ready}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extender_writes_share_totals_and_follows_the_devices() {
    let fake = FakeApiServer::new();
    // Eight cards, minor 7 sick: 700 of gpu-core and ratio, 7 × 80Gi of memory.
    service::add_gpu_node(&fake, "gpu", 8, &[7]);
    fake.create(Kind::NodeResourceTopology, service::nrt("gpu"))
        .unwrap();
    // A node without a Device object advertising a total this process never wrote (a device
    // plugin's, or a predecessor's): never written (trust IV §8), never trusted (§6).
    let mut stale = service::node("stale");
    stale["status"]["allocatable"]["koordinator.sh/gpu-core"] = json!("800");
    fake.create(Kind::Node, stale).unwrap();
    // A CPU node: nothing to write.
    fake.create(Kind::Node, service::node("cpu")).unwrap();

    let svc = service::start(&fake, &["--gpu-share-totals=extender"]).await;
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    eventually(TIMEOUT, "the GPU node's totals written", || {
        status_of(&fake, "gpu", "allocatable", "koordinator.sh/gpu-core").as_deref() == Some("700")
    })
    .await;
    let memory = (7u64 * 80 * (1 << 30)).to_string();
    for field in ["capacity", "allocatable"] {
        assert_eq!(
            status_of(&fake, "gpu", field, "koordinator.sh/gpu-core").as_deref(),
            Some("700")
        );
        assert_eq!(
            status_of(&fake, "gpu", field, "koordinator.sh/gpu-memory-ratio").as_deref(),
            Some("700")
        );
        assert_eq!(
            status_of(&fake, "gpu", field, "koordinator.sh/gpu-memory").as_deref(),
            Some(memory.as_str())
        );
    }
    // Everything else in the status is as it was.
    assert_eq!(
        status_of(&fake, "gpu", "allocatable", "cpu").as_deref(),
        Some("64")
    );
    assert_eq!(
        status_of(&fake, "cpu", "allocatable", "koordinator.sh/gpu-core"),
        None
    );

    // A card heals: the totals follow the Device object.
    fake.replace(Kind::Device, service::gpu_device("gpu", 8, 4, &[]))
        .unwrap();
    eventually(TIMEOUT, "the totals follow the healed card", || {
        status_of(&fake, "gpu", "allocatable", "koordinator.sh/gpu-core").as_deref() == Some("800")
    })
    .await;
    // Someone overwrites them (a kubelet re-registering): written back.
    fake.patch_merge(
        Kind::Node,
        "",
        "gpu",
        json!({"status": {"allocatable": {"koordinator.sh/gpu-core": "0"}}}),
    )
    .unwrap();
    eventually(TIMEOUT, "the overwritten total written back", || {
        status_of(&fake, "gpu", "allocatable", "koordinator.sh/gpu-core").as_deref() == Some("800")
    })
    .await;
    let (_, ready) = http.get("/readyz").await;
    assert!(
        warnings(&ready).is_empty(),
        "every node advertises its totals: {ready}"
    );
    // Three passes wrote the GPU node; none touched the Device-less node.
    assert_eq!(
        status_of(&fake, "stale", "allocatable", "koordinator.sh/gpu-core").as_deref(),
        Some("800"),
        "a Device-less node's totals the extender never wrote are left alone"
    );
    // And a share pod is never served there (the Device-less rule does not trust them).
    let share = service::pending("share", json!({"koordinator.sh/gpu-memory-ratio": "50"}));
    let (_, f) = http
        .post("/filter", &service::extender_args(&share, &["stale"]))
        .await;
    assert!(
        f["FailedAndUnresolvableNodes"]["stale"].is_string(),
        "refused on a node with no Device object: {f}"
    );

    // The GPU node's Device object goes: the totals this process wrote are taken back.
    fake.delete(Kind::Device, "", "gpu").unwrap();
    eventually(TIMEOUT, "its own totals taken back", || {
        status_of(&fake, "gpu", "allocatable", "koordinator.sh/gpu-core").as_deref() == Some("0")
    })
    .await;

    // Every call is granted by the chart's tables, and the status writes were made.
    let granted = |group: &str, resource: &str, verb: &str| {
        API_CALLS
            .iter()
            .chain(REQUEUE_API_CALLS)
            .chain(DRA_OWNERSHIP_API_CALLS)
            .chain(SHARE_TOTALS_API_CALLS)
            .any(|c| c.group == group && c.resource == resource && c.verbs.contains(&verb))
    };
    let seen = fake.rbac_requests();
    for r in &seen {
        assert!(granted(&r.group, &r.resource, &r.verb), "{r:?} not granted");
    }
    assert!(
        seen.iter()
            .any(|r| r.resource == "nodes/status" && r.verb == "patch"),
        "{seen:#?}"
    );
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_nothing_is_written_and_readiness_says_share_pods_cannot_preempt() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "gpu", 2, &[]);
    fake.create(Kind::NodeResourceTopology, service::nrt("gpu"))
        .unwrap();
    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    let ready = http.wait_ready(TIMEOUT).await;
    assert!(
        warnings(&ready)
            .iter()
            .any(|w| w.contains("cannot preempt")),
        "{ready}"
    );
    svc.shutdown().await.unwrap();
    assert!(
        !fake
            .rbac_requests()
            .iter()
            .any(|r| r.resource == "nodes/status"),
        "nothing written by default"
    );
    assert_eq!(
        status_of(&fake, "gpu", "allocatable", "koordinator.sh/gpu-core"),
        None
    );
}

/// koord-manager's mode writes nothing and reports the nodes that do not advertise their
/// totals, until they do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn koord_managers_mode_reports_nodes_without_totals() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "gpu", 2, &[]);
    fake.create(Kind::NodeResourceTopology, service::nrt("gpu"))
        .unwrap();
    let svc = service::start(&fake, &["--gpu-share-totals=koord-manager"]).await;
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    wait_warnings(&http, "a warning naming the node", |w| {
        w.iter()
            .any(|w| w.starts_with("1 node(s)") && w.contains("gpu"))
    })
    .await;
    let mismatched = || {
        svc.state
            .scheduler
            .metrics
            .share_totals_mismatched_nodes
            .get()
    };
    assert_eq!(mismatched(), 1);
    // koord-manager writes them: the warning goes.
    fake.patch_merge(
        Kind::Node,
        "",
        "gpu",
        json!({"status": {"allocatable": {"koordinator.sh/gpu-core": "200",
            "koordinator.sh/gpu-memory": "160Gi", "koordinator.sh/gpu-memory-ratio": "200"}}}),
    )
    .unwrap();
    wait_warnings(&http, "no warning", |w| w.is_empty()).await;
    assert_eq!(mismatched(), 0);
    assert!(
        !fake
            .rbac_requests()
            .iter()
            .any(|r| r.resource == "nodes/status"),
        "koord-manager's mode writes nothing"
    );
    svc.shutdown().await.unwrap();
}
