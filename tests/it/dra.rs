//! Beside Kubernetes' own device allocator (DRA): a device a ResourceClaim holds is never
//! handed out by filter, bind or preempt; a claim released is capacity returned; a
//! DeviceClass that takes over a managed resource name fails `/readyz` unless the split is
//! intended, and then the extender allocates nothing for what kube-scheduler serves through
//! DRA; a CPU driver's slices keep cpusets off their node. Every fact here is written from
//! the API objects (slices name GPUs by UUID, as NVIDIA's driver does).

use serde_json::{Value, json};

use crate::gpu::{DEVICE_ALLOCATED, Env, annotation_of, gpu_shares, whole_gpus};
use crate::support::service::{self, add_gpu_node, pending};
use crate::support::{FakeApiServer, Kind};

const DRIVER: &str = "gpu.nvidia.com";

/// The slice NVIDIA's driver would publish for `node`'s GPUs `minors` (the UUIDs
/// `service::gpu_device` gives them).
fn slice(node: &str, minors: &[i32]) -> Value {
    let devices: Vec<Value> = minors
        .iter()
        .map(|m| {
            json!({"name": format!("gpu-{m}"), "attributes": {
                "uuid": {"string": format!("GPU-{node}-{m}")},
                "index": {"int": m}
            }})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{DRIVER}")},
        "spec": {"driver": DRIVER, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "nodeName": node, "devices": devices}
    })
}

/// A claim kube-scheduler allocated `node`'s `gpu-<minor>` to.
fn claim(name: &str, node: &str, minor: i32) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": node, "device": format!("gpu-{minor}")}
        ]}}}
    })
}

fn names(filter: &Value) -> Vec<String> {
    serde_json::from_value(filter["NodeNames"].clone()).unwrap_or_default()
}

/// A holder of minor `minor` on `node` by annotation (a low-priority koordinator pod).
fn annotated_holder(name: &str, node: &str, minor: i32) -> Value {
    let annotation = json!({"gpu": [{"minor": minor, "resources": {
        "koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
        "koordinator.sh/gpu-memory-ratio": "100"}}]})
    .to_string();
    service::pod(
        "ml",
        name,
        &format!("uid-{name}"),
        whole_gpus(1),
        Some(node),
        Some(&annotation),
    )
}

#[tokio::test]
async fn a_gpu_a_claim_holds_is_never_handed_out_by_filter_bind_or_preempt() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 2, &[]);
    fake.create(Kind::ResourceSlice, slice("n1", &[0, 1]))
        .unwrap();
    fake.create(Kind::ResourceClaim, claim("dra-0", "n1", 0))
        .unwrap();
    let low = annotated_holder("low", "n1", 1);
    let one = pending("one", whole_gpus(1));
    let two = pending("two", whole_gpus(2));
    fake.create_many(Kind::Pod, [low, one.clone(), two.clone()])
        .unwrap();
    let env = Env::start(&fake, &[]).await;
    env.wait_committed("n1", "uid-low").await;

    // Filter: GPU 1 is held by an annotation, GPU 0 by the claim.
    let f = env.filter(&one, &["n1"]).await;
    assert!(names(&f).is_empty(), "{f}");
    // Bind decides against the same ledger.
    assert!(env.bind(&one, "n1").await.is_err());
    assert_eq!(annotation_of(&fake, &one), None);

    // Preempt: evicting the annotated holder frees one GPU, never the claim's: a pod asking
    // two has no candidate here, one asking one keeps its victim.
    let meta = json!({"Pods": [{"UID": "uid-low"}], "NumPDBViolations": 0});
    for (pod, kept) in [(&two, false), (&one, true)] {
        let args = json!({"Pod": pod, "NodeNameToMetaVictims": {"n1": meta}});
        let (status, out) = env.http.post("/preempt", &args).await;
        assert_eq!(status, 200, "{out}");
        let want = if kept { json!({"n1": meta}) } else { json!({}) };
        assert_eq!(
            out["NodeNameToMetaVictims"], want,
            "{}",
            pod["metadata"]["name"]
        );
    }

    // `/debug` (and `inspect`) show the claim as the holder of GPU 0.
    let ledger = env.ledger("n1").await;
    assert_eq!(
        ledger["types"]["gpu"]["0"]["dra_claims"],
        json!(["ml/dra-0"]),
        "{ledger}"
    );
    assert_eq!(ledger["types"]["gpu"]["0"]["free"], json!({}), "{ledger}");

    // The claim lets go: GPU 0 is the extender's again.
    fake.delete(Kind::ResourceClaim, "ml", "dra-0").unwrap();
    service::eventually(crate::gpu::WAIT, "the claim's release is seen", || {
        env.svc
            .state
            .scheduler
            .cluster
            .debug_dump()
            .get("n1")
            .is_some_and(|n| n["devices"]["types"]["gpu"]["0"]["dra_claims"].is_null())
    })
    .await;
    env.bind(&one, "n1").await.expect("GPU 0 is free now");
    let shares = gpu_shares(&annotation_of(&fake, &one).unwrap());
    assert_eq!(shares.iter().map(|s| s.0).collect::<Vec<_>>(), vec![0]);
    env.svc.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_claim_allocated_after_a_bind_is_counted_as_a_conflict() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 1, &[]);
    fake.create(Kind::ResourceSlice, slice("n1", &[0])).unwrap();
    fake.create(Kind::Pod, annotated_holder("held", "n1", 0))
        .unwrap();
    let env = Env::start(&fake, &[]).await;
    env.wait_committed("n1", "uid-held").await;
    assert_eq!(env.metric("dne_dra_conflicts_total", "").await, 0.0);
    fake.create(Kind::ResourceClaim, claim("late", "n1", 0))
        .unwrap();
    service::eventually(crate::gpu::WAIT, "the conflict is counted", || {
        let text = env.svc.state.scheduler.metrics.encode();
        crate::gpu::metric_value(&text, "dne_dra_conflicts_total", "") == 1.0
    })
    .await;
    env.svc.shutdown().await.unwrap();
}

fn gpu_class(name: &str, extended: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}],
                 "extendedResourceName": extended}
    })
}

#[tokio::test]
async fn a_class_that_takes_a_managed_name_fails_readiness_unless_the_split_is_intended() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 1, &[]);
    fake.create(Kind::DeviceClass, gpu_class("gpus", "nvidia.com/gpu"))
        .unwrap();
    let svc =
        device_numa_extender::app::Service::start(service::serve_args(&[]), Some(fake.client()))
            .await
            .unwrap();
    let http = service::Http::new(svc.addr);
    service::eventually(crate::gpu::WAIT, "readyz names the class", || {
        let why = svc
            .state
            .scheduler
            .readiness
            .not_ready_reason()
            .unwrap_or_default();
        why.contains("DeviceClass gpus maps nvidia.com/gpu")
            && why.contains("--allow-dra-extended-resources")
    })
    .await;
    let (status, body) = http.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    // The class goes: ready.
    fake.delete(Kind::DeviceClass, "", "gpus").unwrap();
    http.wait_ready(crate::gpu::WAIT).await;
    svc.shutdown().await.unwrap();
}

#[tokio::test]
async fn where_kube_scheduler_serves_a_request_through_dra_the_extender_allocates_nothing() {
    let fake = FakeApiServer::new();
    // `dra` does not advertise nvidia.com/gpu: kube-scheduler serves it from the class there.
    add_gpu_node(&fake, "dra", 1, &[]);
    add_gpu_node(&fake, "adv", 1, &[]);
    fake.patch_merge(
        Kind::Node,
        "",
        "adv",
        json!({"status": {"allocatable": {"nvidia.com/gpu": "1"}}}),
    )
    .unwrap();
    fake.create(Kind::DeviceClass, gpu_class("gpus", "nvidia.com/gpu"))
        .unwrap();
    let served = pending("served", whole_gpus(1));
    let unserved = pending("unserved", whole_gpus(1));
    let mixed = pending(
        "mixed",
        json!({"nvidia.com/gpu": "1", "koordinator.sh/rdma": "100"}),
    );
    fake.create_many(Kind::Pod, [served.clone(), unserved.clone(), mixed.clone()])
        .unwrap();
    let env = Env::start(&fake, &["--allow-dra-extended-resources"]).await;
    assert_eq!(
        env.metric("dne_dra_extended_resource_classes", "").await,
        1.0
    );

    // Filter: both nodes pass (DRA's own filter judges `dra`); a pod split between the two
    // allocators is refused where DRA would serve part of it.
    let f = env.filter(&served, &["dra", "adv"]).await;
    assert_eq!(names(&f), vec!["dra", "adv"], "{f}");
    let f = env.filter(&mixed, &["dra"]).await;
    assert!(
        f["FailedAndUnresolvableNodes"]["dra"]
            .as_str()
            .is_some_and(|r| r.contains("nvidia.com/gpu through DRA")),
        "{f}"
    );

    // Bind on `dra` with kube-scheduler's claim in the pod's status: bound, nothing allocated.
    fake.patch_merge(
        Kind::Pod,
        "ml",
        "served",
        json!({"status": {"extendedResourceClaimStatus": {
            "resourceClaimName": "served-extended-resources-abc",
            "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]
        }}}),
    )
    .unwrap();
    env.bind(&served, "dra")
        .await
        .expect("bound without allocation");
    assert_eq!(annotation_of(&fake, &served), None);
    let bound = fake.get(Kind::Pod, "ml", "served").unwrap();
    assert_eq!(bound["spec"]["nodeName"], "dra");
    assert!(bound["metadata"]["annotations"][DEVICE_ALLOCATED].is_null());

    // Without it, kube-scheduler did not serve it through DRA: refused, nothing written.
    let e = env.bind(&unserved, "dra").await.unwrap_err();
    assert!(e.contains("did not serve it through DRA"), "{e}");
    assert!(fake.get(Kind::Pod, "ml", "unserved").unwrap()["spec"]["nodeName"].is_null());
    // On the node that advertises it, the extender allocates as always.
    env.bind(&unserved, "adv")
        .await
        .expect("the extender's node");
    assert!(annotation_of(&fake, &unserved).is_some());
    env.svc.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_node_whose_cpus_a_dra_driver_publishes_gets_no_cpuset() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("n1")).unwrap();
    fake.create(Kind::NodeResourceTopology, service::nrt("n1"))
        .unwrap();
    let cpuset = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "lse", "namespace": "ml", "uid": "uid-lse",
                     "labels": {"koordinator.sh/qosClass": "LSE"}},
        "spec": {"schedulerName": "device-numa-scheduler", "containers": [{"name": "main",
                 "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}]},
        "status": {"phase": "Pending"}
    });
    fake.create(Kind::Pod, cpuset.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;
    let f = env.filter(&cpuset, &["n1"]).await;
    assert_eq!(names(&f), vec!["n1"], "{f}");
    fake.create(
        Kind::ResourceSlice,
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "n1-cpu"},
            "spec": {"driver": "dra.cpu", "pool": {"name": "n1"}, "nodeName": "n1",
                     "devices": [{"name": "cpudevnuma000", "attributes": {"numaNodeID": {"int": 0}}}]}
        }),
    )
    .unwrap();
    service::eventually(crate::gpu::WAIT, "the CPU driver's slice is seen", || {
        env.svc
            .state
            .scheduler
            .cluster
            .debug_dump()
            .get("n1")
            .is_some_and(|n| !n["devices"]["dra"]["cpu_drivers"].is_null())
    })
    .await;
    let f = env.filter(&cpuset, &["n1"]).await;
    assert!(
        f["FailedAndUnresolvableNodes"]["n1"]
            .as_str()
            .is_some_and(|r| r.contains("DRA driver dra.cpu publishes this node's CPUs")),
        "{f}"
    );
    env.svc.shutdown().await.unwrap();
}
