//! Every Kubernetes API call the service makes is in `api_calls::API_CALLS`, the table the
//! chart's ClusterRole is generated from: a call missing there is a 403 in a real cluster.

use std::time::Duration;

use device_numa_extender::api_calls::{API_CALLS, DRA_OWNERSHIP_API_CALLS, REQUEUE_API_CALLS};
use serde_json::json;

use crate::support::service::{self, Http, wait_for_all_watches};
use crate::support::{FakeApiServer, Kind, RbacRequest};

const TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_a_bootstrap_and_bind_is_granted_by_api_calls() {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 8, &[]);
    fake.create(Kind::NodeResourceTopology, service::nrt("n1"))
        .unwrap();
    let pending = service::pending("p", json!({"nvidia.com/gpu": "2"}));
    fake.create(Kind::Pod, pending.clone()).unwrap();
    // A pending pod left with a `resource-status` by an older writer, which this bind (no
    // cpuset) must remove: the one case where bind patches the pod before its binding.
    fake.patch_merge(
        Kind::Pod,
        "ml",
        "p",
        json!({"metadata": {"annotations": {"scheduling.koordinator.sh/resource-status": "{\"cpuset\":\"0-1\"}"}}}),
    )
    .unwrap();

    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    wait_for_all_watches(&fake, TIMEOUT).await;
    let (_, r) = http
        .post("/bind", &service::binding_args(&pending, "n1"))
        .await;
    assert_eq!(r["Error"], "", "{r}");
    // A relist too, so every list/watch path has been exercised after a 410, and wait until
    // every kind has listed again. Watches resuming at the current RV are valid after a
    // compaction, so: end the streams while re-watching fails, move the RV on, compact past
    // where every watcher stands; the next re-watch is then a 410 and a relist.
    let mark = fake.requests().len();
    for kind in [
        Kind::Node,
        Kind::Pod,
        Kind::Device,
        Kind::NodeResourceTopology,
    ] {
        fake.fail_watch_start(kind, 500, 1);
    }
    fake.close_watches();
    fake.create(Kind::Node, service::node("n2")).unwrap();
    fake.compact();
    let relisted = |group: &str, resource: &str| {
        fake.requests()[mark..].iter().any(|r| {
            r.rbac().is_some_and(|r| {
                (r.group.as_str(), r.resource.as_str(), r.verb.as_str())
                    == (group, resource, "list")
            })
        })
    };
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let kinds = [
        ("", "nodes"),
        ("", "pods"),
        ("scheduling.koordinator.sh", "devices"),
        ("topology.node.k8s.io", "noderesourcetopologies"),
    ];
    while !kinds.iter().all(|(g, r)| relisted(g, r)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every kind relisted after the compaction: {:#?}",
            &fake.requests()[mark..]
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_for_all_watches(&fake, TIMEOUT).await;
    svc.shutdown().await.unwrap();

    // The service runs with --requeue (the default): its calls are granted too.
    let granted = |r: &RbacRequest| {
        API_CALLS
            .iter()
            .chain(REQUEUE_API_CALLS)
            .chain(DRA_OWNERSHIP_API_CALLS)
            .any(|c| {
                c.group == r.group && c.resource == r.resource && c.verbs.contains(&r.verb.as_str())
            })
    };
    let seen = fake.rbac_requests();
    let missing: Vec<&RbacRequest> = seen.iter().filter(|r| !granted(r)).collect();
    assert!(missing.is_empty(), "not in API_CALLS: {missing:#?}");
    // The run really exercised the interesting calls (so an empty log cannot pass).
    for (group, resource, verb) in [
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods/binding", "create"),
        ("scheduling.koordinator.sh", "devices", "watch"),
        ("topology.node.k8s.io", "noderesourcetopologies", "watch"),
    ] {
        let want = RbacRequest {
            group: group.into(),
            resource: resource.into(),
            verb: verb.into(),
        };
        assert!(seen.contains(&want), "{want:?} not seen in {seen:#?}");
    }
    assert!(
        seen.iter()
            .any(|r| r.resource == "pods" && r.verb == "patch"),
        "the bind removes the stale annotation: {seen:#?}"
    );
    let bound = fake.get(Kind::Pod, "ml", "p").unwrap();
    assert_eq!(bound["spec"]["nodeName"], "n1");
    let annotations = &bound["metadata"]["annotations"];
    assert!(
        annotations["scheduling.koordinator.sh/device-allocated"].is_string(),
        "{bound}"
    );
    assert!(
        annotations["scheduling.koordinator.sh/resource-status"].is_null(),
        "{bound}"
    );
}
