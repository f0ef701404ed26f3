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

    ownership::wait_owned(&env, "n1", true).await;
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
    ownership::wait_owned(&env, "n1", true).await;
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
    // A status left by an earlier attempt on `dra` (kube-scheduler leaves it when that bind
    // failed) does not make `adv` DRA's: found on the real control plane, a pod bound to an
    // advertising node with no device at all.
    let stale = pending("stale", whole_gpus(1));
    fake.create(Kind::Pod, stale.clone()).unwrap();
    fake.patch_merge(
        Kind::Pod,
        "ml",
        "stale",
        json!({"status": {"extendedResourceClaimStatus": {
            "resourceClaimName": "stale-extended-resources-abc",
            "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]
        }}}),
    )
    .unwrap();
    let f = env.filter(&stale, &["adv"]).await;
    assert!(
        names(&f).is_empty(),
        "adv's only GPU is unserved's now: {f}"
    );
    fake.delete(Kind::Pod, "ml", "unserved").unwrap();
    service::eventually(crate::gpu::WAIT, "adv's GPU is free again", || {
        env.svc
            .state
            .scheduler
            .cluster
            .debug_dump()
            .get("adv")
            .is_some_and(|n| {
                n["devices"]["entries"]
                    .as_object()
                    .is_some_and(|e| e.is_empty())
            })
    })
    .await;
    env.bind(&stale, "adv").await.expect("allocated on adv");
    assert!(
        annotation_of(&fake, &stale).is_some(),
        "the device is the extender's there"
    );
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

/// The hand-over (`scheduler::dra_owner`): a device a DRA slice also publishes is the
/// extender's only once its pool's rule exists; a rule deleted by someone else is written
/// again; a node handed to DRA keeps its rule until no pod of the extender's holds a device of
/// the pool, then loses it.
mod ownership {
    use super::*;

    fn rules(fake: &FakeApiServer) -> Vec<Value> {
        fake.list(Kind::DeviceTaintRule)
    }

    pub(super) async fn wait_owned(env: &Env, node: &str, owned: bool) {
        let cluster = env.svc.state.scheduler.cluster.clone();
        service::eventually(
            crate::gpu::WAIT,
            &format!("{node}'s pool owned: {owned}"),
            || {
                cluster.debug_dump().get(node).is_some_and(|n| {
                    n["devices"]["types"]["gpu"].as_object().is_some_and(|m| {
                        m.values()
                            .all(|g| g["dra_pool_not_owned"].is_null() == owned)
                    })
                })
            },
        )
        .await;
    }

    #[tokio::test]
    async fn a_pool_is_the_extenders_only_once_its_rule_is_in_effect() {
        let fake = FakeApiServer::new();
        add_gpu_node(&fake, "n1", 1, &[]);
        fake.create(Kind::ResourceSlice, slice("n1", &[0])).unwrap();
        let one = pending("one", whole_gpus(1));
        fake.create(Kind::Pod, one.clone()).unwrap();
        // The rule cannot be written yet.
        fake.fail_writes(Kind::DeviceTaintRule, 503, 1_000_000);
        let env = Env::start(&fake, &[]).await;
        let f = env.filter(&one, &["n1"]).await;
        assert!(names(&f).is_empty(), "no rule, not the extender's: {f}");
        assert!(env.bind(&one, "n1").await.is_err());
        service::eventually(crate::gpu::WAIT, "a failed rule write is counted", || {
            let text = env.svc.state.scheduler.metrics.encode();
            crate::gpu::metric_value(&text, "dne_dra_taint_rule_writes_total", "result=\"error\"")
                > 0.0
        })
        .await;
        let ledger = env.ledger("n1").await;
        assert_eq!(
            ledger["types"]["gpu"]["0"]["dra_pool_not_owned"],
            json!(format!("{DRIVER}/n1")),
            "{ledger}"
        );

        // Writes work again: the rule lands, and once it is seen the GPU is the extender's.
        fake.fail_writes(Kind::DeviceTaintRule, 503, 0);
        wait_owned(&env, "n1", true).await;
        let written = rules(&fake);
        assert_eq!(written.len(), 1, "{written:?}");
        let rule = &written[0];
        assert_eq!(
            rule["spec"]["deviceSelector"],
            json!({"driver": DRIVER, "pool": "n1"})
        );
        assert_eq!(rule["spec"]["taint"]["effect"], "NoSchedule");
        env.bind(&one, "n1").await.expect("the extender's GPU now");
        env.svc.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn a_deleted_rule_is_recreated_and_waits_out_the_grace_again() {
        let fake = FakeApiServer::new();
        add_gpu_node(&fake, "n1", 1, &[]);
        fake.create(Kind::ResourceSlice, slice("n1", &[0])).unwrap();
        let one = pending("one", whole_gpus(1));
        fake.create(Kind::Pod, one.clone()).unwrap();
        let env = Env::start(&fake, &[]).await;
        wait_owned(&env, "n1", true).await;
        let first = rules(&fake)[0]["metadata"]["uid"].clone();

        // Someone deletes it while its creation is held back: not the extender's meanwhile.
        fake.fail_writes(Kind::DeviceTaintRule, 503, 1_000_000);
        let name = rules(&fake)[0]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        fake.delete(Kind::DeviceTaintRule, "", &name).unwrap();
        wait_owned(&env, "n1", false).await;
        let f = env.filter(&one, &["n1"]).await;
        assert!(names(&f).is_empty(), "{f}");
        fake.fail_writes(Kind::DeviceTaintRule, 503, 0);
        wait_owned(&env, "n1", true).await;
        let again = rules(&fake);
        assert_eq!(again.len(), 1);
        assert_ne!(again[0]["metadata"]["uid"], first, "written anew");
        env.bind(&one, "n1").await.expect("owned again");
        env.svc.shutdown().await.unwrap();
    }

    /// Restart and failover: the rule is an API object with its creation time, so a new
    /// process owns what its predecessor owned as soon as it has listed it, and writes nothing.
    #[tokio::test]
    async fn a_restart_owns_at_once_what_its_predecessor_owned() {
        let fake = FakeApiServer::new();
        add_gpu_node(&fake, "n1", 1, &[]);
        fake.create(Kind::ResourceSlice, slice("n1", &[0])).unwrap();
        let pool = device_numa_extender::cluster::dra::DevicePool {
            driver: DRIVER.into(),
            pool: "n1".into(),
        };
        let mut rule =
            serde_json::to_value(device_numa_extender::scheduler::dra_owner::rule_for(&pool))
                .unwrap();
        rule["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        fake.create(Kind::DeviceTaintRule, rule).unwrap();
        let env = Env::start(&fake, &["--dra-handover-grace", "1h"]).await;
        let ledger = env.ledger("n1").await;
        assert!(
            ledger["types"]["gpu"]["0"]["dra_pool_not_owned"].is_null(),
            "a rule older than the grace is in effect at once: {ledger}"
        );
        let one = pending("one", whole_gpus(1));
        fake.create(Kind::Pod, one.clone()).unwrap();
        env.bind(&one, "n1").await.expect("owned");
        assert_eq!(
            env.metric("dne_dra_taint_rule_writes_total", "op=\"create\"")
                .await,
            0.0
        );
        env.svc.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn a_young_rule_waits_out_the_grace() {
        let fake = FakeApiServer::new();
        add_gpu_node(&fake, "n1", 1, &[]);
        fake.create(Kind::ResourceSlice, slice("n1", &[0])).unwrap();
        let env = Env::start(&fake, &["--dra-handover-grace", "1h"]).await;
        service::eventually(crate::gpu::WAIT, "the rule is written", || {
            rules(&fake).len() == 1
        })
        .await;
        // Written and seen, but an hour is not over: DRA may still have it in memory.
        service::eventually(crate::gpu::WAIT, "the rule is seen", || {
            env.svc
                .state
                .scheduler
                .metrics
                .encode()
                .contains("dne_dra_taint_rules 1")
        })
        .await;
        let ledger = env.ledger("n1").await;
        assert_eq!(
            ledger["types"]["gpu"]["0"]["dra_pool_not_owned"],
            json!(format!("{DRIVER}/n1")),
            "{ledger}"
        );
        env.svc.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn a_node_handed_to_dra_keeps_its_rule_until_no_pod_of_ours_holds_its_devices() {
        let fake = FakeApiServer::new();
        add_gpu_node(&fake, "n1", 2, &[]);
        fake.create(Kind::ResourceSlice, slice("n1", &[0, 1]))
            .unwrap();
        fake.create(Kind::Pod, annotated_holder("ours", "n1", 0))
            .unwrap();
        let one = pending("one", whole_gpus(1));
        fake.create(Kind::Pod, one.clone()).unwrap();
        let env = Env::start(&fake, &[]).await;
        env.wait_committed("n1", "uid-ours").await;
        wait_owned(&env, "n1", true).await;

        fake.patch_merge(
            Kind::Node,
            "",
            "n1",
            json!({"metadata": {"labels": {"device-numa-extender.io/device-owner": "dra"}}}),
        )
        .unwrap();
        wait_owned(&env, "n1", false).await;
        let f = env.filter(&one, &["n1"]).await;
        assert!(names(&f).is_empty(), "handed to DRA: {f}");
        // Our pod still holds GPU 0: the rule stays (ticks pass; it is never deleted).
        let before = env
            .metric("dne_dra_taint_rule_writes_total", "op=\"delete\"")
            .await;
        service::eventually(crate::gpu::WAIT, "a few reconcile ticks", || {
            env.svc
                .state
                .scheduler
                .metrics
                .encode()
                .contains("dne_dra_taint_rules 1")
        })
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        assert_eq!(rules(&fake).len(), 1, "kept while our pod holds a device");
        assert_eq!(
            env.metric("dne_dra_taint_rule_writes_total", "op=\"delete\"")
                .await,
            before
        );
        // It goes: the rule goes.
        fake.delete(Kind::Pod, "ml", "ours").unwrap();
        service::eventually(crate::gpu::WAIT, "the rule is deleted", || {
            rules(&fake).is_empty()
        })
        .await;
        env.svc.shutdown().await.unwrap();
    }
}

/// Trust IV §1 through the service: a slice with `perDeviceNodeSelection` names each GPU's node
/// on the device. A claim allocated and reserved holds both GPUs of n1, so a one-GPU pod is
/// refused there by filter and by bind (before, the join read only the slice-level `nodeName`
/// and bound it to minor 0).
#[tokio::test]
async fn a_per_device_slice_is_joined_on_each_devices_node() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 2, &[]);
    let mut s = slice("n1", &[0, 1]);
    s["spec"].as_object_mut().unwrap().remove("nodeName");
    s["spec"]["perDeviceNodeSelection"] = json!(true);
    for d in s["spec"]["devices"].as_array_mut().unwrap() {
        d["nodeName"] = json!("n1");
    }
    fake.create(Kind::ResourceSlice, s).unwrap();
    let mut both = claim("both", "n1", 0);
    both["status"]["allocation"]["devices"]["results"]
        .as_array_mut()
        .unwrap()
        .push(json!({"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1"}));
    both["status"]["reservedFor"] = json!([{"resource": "pods", "name": "trainer", "uid": "u"}]);
    fake.create(Kind::ResourceClaim, both).unwrap();
    let one = pending("one", whole_gpus(1));
    fake.create(Kind::Pod, one.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;
    ownership::wait_owned(&env, "n1", true).await;
    let f = env.filter(&one, &["n1"]).await;
    assert!(names(&f).is_empty(), "both GPUs are the claim's: {f}");
    // Trust IV §11: the reason kube-scheduler shows names DRA as the cause.
    let reason = f["FailedNodes"]["n1"].as_str().unwrap_or_default();
    assert!(reason.contains("2 gpus held by DRA claims"), "{f}");
    assert!(env.bind(&one, "n1").await.is_err());
    assert_eq!(annotation_of(&fake, &one), None);
    let ledger = env.ledger("n1").await;
    for minor in ["0", "1"] {
        assert_eq!(
            ledger["types"]["gpu"][minor]["dra_claims"],
            json!(["ml/both"]),
            "{ledger}"
        );
    }
    env.svc.shutdown().await.unwrap();
}

/// Trust IV §4 through the service: slices and claims served, DeviceTaintRule not (1.34-1.36
/// by default). No rule can keep DRA off a GPU its driver publishes, so none of them is handed
/// out (before: `/readyz` 200, the kind `disabled` without a word, and the GPU bound); a GPU no
/// driver publishes still is; `/readyz` says what the missing kind costs.
#[tokio::test]
async fn without_device_taint_rules_a_published_gpu_is_never_handed_out() {
    let fake = FakeApiServer::new();
    fake.set_crd_served(Kind::DeviceTaintRule, false);
    add_gpu_node(&fake, "n1", 1, &[]);
    add_gpu_node(&fake, "n2", 1, &[]);
    fake.create(Kind::ResourceSlice, slice("n1", &[0])).unwrap();
    let one = pending("one", whole_gpus(1));
    fake.create(Kind::Pod, one.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;
    let (_, body) = env.http.get("/readyz").await;
    let kind = &body["kinds"]["devicetaintrules"];
    assert_eq!(kind["requirement"], "disabled", "{body}");
    let reason = kind["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("v1beta2") && reason.contains("refused"),
        "names the versions looked for and what it costs: {body}"
    );
    let f = env.filter(&one, &["n1", "n2"]).await;
    assert_eq!(names(&f), vec!["n2".to_string()], "{f}");
    let f = env.filter(&one, &["n1"]).await;
    let reason = f["FailedNodes"]["n1"].as_str().unwrap_or_default();
    assert!(
        reason.contains("1 gpu published by a DRA driver and not the extender's"),
        "the reason names DRA: {f}"
    );
    assert!(env.bind(&one, "n1").await.is_err());
    assert_eq!(annotation_of(&fake, &one), None);
    let ledger = env.ledger("n1").await;
    assert_eq!(
        ledger["types"]["gpu"]["0"]["dra_pool_not_owned"],
        json!(format!("{DRIVER}/n1")),
        "{ledger}"
    );
    env.bind(&one, "n2")
        .await
        .expect("no driver publishes n2's GPU");
    env.svc.shutdown().await.unwrap();
}

/// Trust IV §11: `inspect --kubeconfig --pod` answers as `serve` does. On a node handed to DRA
/// (`device-owner=dra`) whose GPU a DRA driver publishes, filter refuses the pod; `inspect`
/// said "fits now on n1" before (it enforced no ownership), and now says it fits nowhere, with
/// the reason naming DRA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_pod_refuses_where_filter_does_beside_dra() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 1, &[]);
    fake.patch_merge(
        Kind::Node,
        "",
        "n1",
        json!({"metadata": {"labels": {"device-numa-extender.io/device-owner": "dra"}},
               "status": {"allocatable": {"nvidia.com/gpu": "1"}, "capacity": {"nvidia.com/gpu": "1"}}}),
    )
    .unwrap();
    fake.create(Kind::ResourceSlice, slice("n1", &[0])).unwrap();
    let one = pending("one", whole_gpus(1));
    fake.create(Kind::Pod, one.clone()).unwrap();
    let served = fake.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    served.write_kubeconfig(&kubeconfig).unwrap();
    let found = crate::pending::inspect_pod_online(kubeconfig, "ml/one").await;
    assert_eq!(found["fits_on"], json!([]), "{found}");
    let reasons = found["reasons"].to_string();
    assert!(
        reasons.contains("published by a DRA driver and not the extender's"),
        "{found}"
    );

    // And the service refuses it likewise.
    let env = Env::start(&fake, &[]).await;
    let f = env.filter(&one, &["n1"]).await;
    assert!(names(&f).is_empty(), "{f}");
    env.svc.shutdown().await.unwrap();
}

/// `inspect` names the claim that holds a GPU, from a cluster file with DRA objects in it
/// (through the same sync handlers as the service).
#[test]
fn inspect_names_the_claim_that_holds_a_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.json");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        service::node("n1"),
        service::gpu_device("n1", 2, 1, &[]),
        slice("n1", &[0, 1]),
        claim("dra-0", "n1", 1),
    ]});
    std::fs::write(&file, list.to_string()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_device-numa-extender"))
        .args(["inspect", "--cluster-file"])
        .arg(&file)
        .args(["-o", "json"])
        .output()
        .expect("run the binary");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let view: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let gpus = &view["nodes"][0]["gpus"];
    assert_eq!(gpus[0]["holders"], json!([]), "{view}");
    assert_eq!(gpus[1]["holders"][0]["pod"], "claim ml/dra-0", "{view}");
    assert_eq!(gpus[1]["holders"][0]["entry"], "dra-claim", "{view}");
    assert_eq!(gpus[1]["state"], "full", "{view}");
}
