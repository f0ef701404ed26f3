//! NUMA-aware CPU placement end to end: the real service over HTTP against the fake API
//! server and the real kube client. Checks read the API server's pods and parse the
//! annotations from first principles (their JSON and the Linux CPU list form), never through
//! the service's own types.
//!
//! Every wait has a timeout that only stops a hang.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::gpu::{Env, metric_value};
use crate::support::service::{self, Http};
use crate::support::{FakeApiServer, Kind};

const WAIT: Duration = Duration::from_secs(60);
const RESOURCE_STATUS: &str = "scheduling.koordinator.sh/resource-status";
const DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";

/// A koordlet-style NRT: `numas` NUMA nodes on one socket each with `cores` 2-thread cores;
/// CPU ids sequential with a core's threads adjacent (so NUMA `n` holds
/// `n*cores*2 .. (n+1)*cores*2`). `policy` goes to `topologyPolicies`.
pub(crate) fn koord_nrt(
    name: &str,
    numas: u32,
    cores: u32,
    policy: &str,
    extra: &[(&str, &str)],
) -> Value {
    let mut detail = Vec::new();
    for n in 0..numas {
        for c in 0..cores {
            for t in 0..2 {
                let core = n * cores + c;
                detail.push(json!({"id": core * 2 + t, "core": core, "socket": n, "node": n}));
            }
        }
    }
    let mut annotations = serde_json::Map::new();
    annotations.insert(
        "node.koordinator.sh/cpu-topology".into(),
        json!({ "detail": detail }).to_string().into(),
    );
    annotations.insert(
        "kubelet.koordinator.sh/cpu-manager-policy".into(),
        r#"{"policy":"none"}"#.into(),
    );
    for (k, v) in extra {
        annotations.insert(k.to_string(), v.to_string().into());
    }
    let zones: Vec<Value> = (0..numas)
        .map(|n| {
            let cpus = (cores * 2).to_string();
            json!({"name": format!("node-{n}"), "type": "Node", "resources": [
                {"name": "cpu", "capacity": cpus, "allocatable": cpus, "available": cpus},
                {"name": "memory", "capacity": "64Gi", "allocatable": "64Gi", "available": "64Gi"}]})
        })
        .collect();
    json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": name, "annotations": annotations},
        "topologyPolicies": [policy],
        "zones": zones,
    })
}

/// A pending LSR pod asking for `cpu` CPUs (and `extra` resources), requests = limits.
pub(crate) fn lsr_pod(name: &str, cpu: u32, extra: Value) -> Value {
    let mut requests = json!({"cpu": cpu.to_string(), "memory": "8Gi"});
    if let (Some(r), Some(e)) = (requests.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    let mut p = service::pending(name, requests);
    p["metadata"]["labels"] = json!({"koordinator.sh/qosClass": "LSR"});
    p
}

/// The Linux CPU list form, parsed independently of the service.
fn cpu_list(s: &str) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => {
                out.insert(part.parse::<u32>().unwrap());
            }
        }
    }
    out
}

fn annotation(fake: &FakeApiServer, name: &str, key: &str) -> Option<String> {
    let p = fake.get(Kind::Pod, "ml", name)?;
    p["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_owned)
}

/// One `numaNodeResources` entry: NUMA id and its resources.
type NumaEntry = (u64, serde_json::Map<String, Value>);

/// The `resource-status` annotation checked for exactly the shape koordlet decodes:
/// an object with only `cpuset` (string) and `numaNodeResources` (list of `{node: int,
/// resources: {name: quantity string}}`). Returns (cpus, [(numa, resources)]).
fn koordlet_status(text: &str) -> (BTreeSet<u32>, Vec<NumaEntry>) {
    let v: Value = serde_json::from_str(text).expect("resource-status is JSON");
    let obj = v.as_object().expect("resource-status is an object");
    for key in obj.keys() {
        assert!(
            key == "cpuset" || key == "numaNodeResources",
            "unexpected field {key} in {text}"
        );
    }
    let cpus = obj
        .get("cpuset")
        .map(|c| cpu_list(c.as_str().expect("cpuset is a string")))
        .unwrap_or_default();
    let mut numa = Vec::new();
    for e in obj
        .get("numaNodeResources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let node = e["node"].as_u64().expect("node is an unsigned integer");
        let resources = e["resources"]
            .as_object()
            .expect("resources is a map")
            .clone();
        for (k, q) in &resources {
            assert!(q.is_string(), "{k} must be a quantity string: {text}");
        }
        numa.push((node, resources));
    }
    (cpus, numa)
}

async fn debug_cpus(http: &Http, node: &str) -> Value {
    let (status, body) = http.get(&format!("/debug/nodes/{node}")).await;
    assert_eq!(status, 200, "{body}");
    body["state"]["cpus"].clone()
}

/// A 2-NUMA node under SingleNUMANode with 4 GPUs (minors 0-1 on NUMA 0, 2-3 on NUMA 1),
/// NUMA 0's GPUs held by a running pod; its CPUs all free (CPU alone would pick NUMA 0).
fn aligned_cluster(fake: &FakeApiServer) -> Value {
    let mut node = service::node("n");
    node["metadata"]["labels"]["node.koordinator.sh/numa-topology-policy"] =
        json!("SingleNUMANode");
    fake.create(Kind::Node, node).unwrap();
    fake.create(Kind::Device, service::gpu_device("n", 4, 2, &[]))
        .unwrap();
    fake.create(
        Kind::NodeResourceTopology,
        koord_nrt("n", 2, 8, "None", &[]),
    )
    .unwrap();
    fake.create(
        Kind::Pod,
        service::pod(
            "ml",
            "holder",
            "uid-holder",
            json!({"nvidia.com/gpu": "2"}),
            Some("n"),
            Some(&service::whole_gpus(&[0, 1])),
        ),
    )
    .unwrap();
    let pod = lsr_pod("aligned", 8, json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, pod.clone()).unwrap();
    pod
}

/// Filter passes `n`, bind succeeds, and the pod's annotations (read back from the API
/// server, parsed as koordlet does) put the 8 CPUs and the GPU on NUMA 1.
async fn place_and_check_alignment(fake: &FakeApiServer, http: &Http, pod: &Value) {
    let (status, f) = http
        .post("/filter", &service::extender_args(pod, &["n"]))
        .await;
    assert_eq!(status, 200, "{f}");
    assert_eq!(f["NodeNames"], json!(["n"]), "{f}");
    crate::gpu::bind(http, pod, "n")
        .await
        .expect("bind succeeds");

    let status = annotation(fake, "aligned", RESOURCE_STATUS).expect("resource-status written");
    let (cpus, numa) = koordlet_status(&status);
    assert_eq!(cpus.len(), 8, "{status}");
    assert!(
        cpus.iter().all(|c| (16..32).contains(c)),
        "cpuset on NUMA 1 (CPUs 16-31): {status}"
    );
    assert_eq!(numa.len(), 1, "{status}");
    assert_eq!(numa[0].0, 1, "{status}");
    assert_eq!(numa[0].1["cpu"], json!("8"), "{status}");
    assert_eq!(numa[0].1["memory"], json!("8Gi"), "{status}");

    let devices = annotation(fake, "aligned", DEVICE_ALLOCATED).expect("device-allocated");
    let d: Value = serde_json::from_str(&devices).unwrap();
    let minors: Vec<u64> = d["gpu"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["minor"].as_u64().unwrap())
        .collect();
    assert_eq!(minors.len(), 1, "{devices}");
    assert!(minors[0] == 2 || minors[0] == 3, "GPU on NUMA 1: {devices}");
    assert_eq!(
        fake.get(Kind::Pod, "ml", "aligned").unwrap()["spec"]["nodeName"],
        "n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_and_cpuset_land_on_the_numa_node_of_the_free_gpus() {
    let fake = FakeApiServer::new();
    let pod = aligned_cluster(&fake);
    let env = Env::start(&fake, &[]).await;
    place_and_check_alignment(&fake, &env.http, &pod).await;
}

/// The same through the real binary, bootstrapped from a kubeconfig against the fake API
/// server served over TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_aligns_gpu_and_cpuset_against_the_fake_api_server() {
    let fake = FakeApiServer::new();
    let pod = aligned_cluster(&fake);
    let served = fake.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    served.write_kubeconfig(&kubeconfig).unwrap();
    // A fresh fake API server: no binder ran before this process, so no takeover window.
    let mut p = crate::binary::Running::start(&[
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--takeover-window",
        "0s",
    ]);
    let http = Http::new(p.addr);
    crate::binary::wait_ready(&http, &mut p).await;
    place_and_check_alignment(&fake, &http, &pod).await;
    crate::binary::terminate(&http, &mut p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cpuset_binds_never_share_a_cpu() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("big")).unwrap();
    // 64 CPUs: 2 NUMA nodes x 16 cores x 2 threads, no NUMA policy.
    fake.create(
        Kind::NodeResourceTopology,
        koord_nrt("big", 2, 16, "None", &[]),
    )
    .unwrap();
    let env = Env::start(&fake, &[]).await;
    let pods: Vec<Value> = (0..64)
        .map(|i| {
            let mut p = lsr_pod(&format!("x{i}"), 4, json!({}));
            p["spec"]["containers"][0]["resources"] = json!({
                "requests": {"cpu": "4"}, "limits": {"cpu": "4"}});
            p["metadata"]["annotations"] = json!({
                "scheduling.koordinator.sh/resource-spec":
                    r#"{"preferredCPUBindPolicy":"FullPCPUs","preferredCPUExclusivePolicy":"PCPULevel"}"#});
            p
        })
        .collect();
    for p in &pods {
        fake.create(Kind::Pod, p.clone()).unwrap();
    }
    let results = tokio::time::timeout(
        WAIT,
        futures::future::join_all(pods.iter().map(|p| env.bind(p, "big"))),
    )
    .await
    .expect("binds finish");
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(
        ok,
        16,
        "{:?}",
        results
            .iter()
            .filter(|r| r.is_err())
            .take(3)
            .collect::<Vec<_>>()
    );

    // From the API server alone: every bound pod has a 4-CPU cpuset, no CPU twice.
    let mut seen = BTreeSet::new();
    let mut bound = 0;
    for p in fake.list(Kind::Pod) {
        if p["spec"]["nodeName"] != "big" {
            assert!(
                p["metadata"]["annotations"][RESOURCE_STATUS].is_null(),
                "an unbound pod carries no cpuset: {p}"
            );
            continue;
        }
        bound += 1;
        let status = p["metadata"]["annotations"][RESOURCE_STATUS]
            .as_str()
            .expect("bound pod has resource-status");
        let (cpus, _) = koordlet_status(status);
        assert_eq!(cpus.len(), 4, "{status}");
        for c in cpus {
            assert!(c < 64, "{status}");
            assert!(seen.insert(c), "cpu {c} in two cpusets");
        }
    }
    assert_eq!(bound, 16);
    assert_eq!(seen.len(), 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rebuilds_the_same_cpu_ledger_and_a_relist_frees_a_deleted_pods_cpus() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("n")).unwrap();
    fake.create(
        Kind::NodeResourceTopology,
        koord_nrt(
            "n",
            2,
            4,
            "SingleNUMANodePodLevel",
            &[(
                "node.koordinator.sh/reservation",
                r#"{"reservedCPUs":"0-1"}"#,
            )],
        ),
    )
    .unwrap();
    let env = Env::start(&fake, &[]).await;
    let pods: Vec<Value> = (0..3)
        .map(|i| lsr_pod(&format!("r{i}"), 4, json!({})))
        .collect();
    for p in &pods {
        fake.create(Kind::Pod, p.clone()).unwrap();
        env.bind(p, "n").await.expect("bind");
    }
    // 16 CPUs minus 2 reserved: three 4-CPU pods fit (single NUMA each), a fourth does not.
    let cluster = env.svc.state.scheduler.cluster.clone();
    service::eventually(WAIT, "all three committed", || {
        let snap = cluster.debug_dump();
        let by_pod = &snap["n"]["cpus"]["allocated_by_pod"];
        (0..3).all(|i| by_pod[format!("uid-r{i}")]["state"] == "committed")
    })
    .await;
    let before = debug_cpus(&env.http, "n").await;
    let held = cpu_list(before["allocated"].as_str().unwrap());
    assert_eq!(held.len(), 12, "{before}");
    assert!(
        !held.contains(&0) && !held.contains(&1),
        "reserved never handed out: {before}"
    );

    // A restart rebuilds exactly the same CPU ledger from the API server.
    env.svc.shutdown().await.expect("shutdown");
    let env = Env::start(&fake, &[]).await;
    let after = debug_cpus(&env.http, "n").await;
    assert_eq!(after, before);

    // A watch gap: the pod is deleted while the watches are down and the log is compacted,
    // so the pod watch must relist; the diff frees its CPUs.
    let (_, ready) = env.http.get("/readyz").await;
    let relists = ready["kinds"]["pods"]["relists"].as_u64().unwrap_or(0);
    // Re-watches are held until the deletion is compacted away.
    for kind in service::WATCHED {
        fake.hold_watches(kind);
    }
    fake.close_watches();
    fake.delete(Kind::Pod, "ml", "r1").unwrap();
    fake.compact();
    for kind in service::WATCHED {
        fake.release_watches(kind);
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, ready) = env.http.get("/readyz").await;
        if ready["kinds"]["pods"]["relists"].as_u64().unwrap_or(0) > relists
            && ready["kinds"]["pods"]["phase"] == "synced"
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pods never relisted: {ready}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cluster = env.svc.state.scheduler.cluster.clone();
    service::eventually(WAIT, "r1's CPUs released", || {
        cluster.debug_dump()["n"]["cpus"]["allocated_by_pod"]["uid-r1"].is_null()
    })
    .await;
    let r1 = koordlet_status(&annotation_in(&before, "uid-r1")).0;
    let now = cpu_list(
        debug_cpus(&env.http, "n").await["allocated"]
            .as_str()
            .unwrap(),
    );
    assert!(
        now.is_disjoint(&r1),
        "r1's cpus {r1:?} free again, held now {now:?}"
    );
    assert_eq!(now.len(), 8);
    // And a new pod can take them, once binds are allowed again: the watch gap fenced the pod
    // cache, and a relist begun after the latest fence must lift it. `/readyz` can already
    // say "synced" from an earlier relist when a later watch error fenced again (seen once in
    // CI: the bind was refused with "retry shortly", which is kube-scheduler's cue to retry).
    let readiness = env.svc.state.scheduler.readiness.clone();
    service::eventually(WAIT, "the pod fence lifted", || readiness.pods_current()).await;
    let next = lsr_pod("r3", 4, json!({}));
    fake.create(Kind::Pod, next.clone()).unwrap();
    env.bind(&next, "n").await.expect("freed CPUs are bindable");
    env.svc.shutdown().await.expect("shutdown");
}

fn annotation_in(debug: &Value, uid: &str) -> String {
    debug["allocated_by_pod"][uid]["resource_status"]
        .as_str()
        .unwrap_or_else(|| panic!("{uid} in {debug}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_nrt_annotations_are_counted_and_block_only_that_node() {
    let fake = FakeApiServer::new();
    let cases = [
        (
            "bad-json",
            "node.koordinator.sh/cpu-topology",
            "{nope",
            "bad_json",
        ),
        (
            "out-of-range",
            "node.koordinator.sh/cpu-topology",
            r#"{"detail":[{"id":4096,"core":0,"socket":0,"node":0}]}"#,
            "out_of_range",
        ),
        (
            "duplicate",
            "node.koordinator.sh/cpu-topology",
            r#"{"detail":[{"id":0,"core":0,"socket":0,"node":0},{"id":0,"core":1,"socket":0,"node":0}]}"#,
            "duplicate_cpu",
        ),
        (
            "missing",
            "node.koordinator.sh/cpu-topology",
            r#"{"detail":[{"id":0,"socket":0,"node":0}]}"#,
            "missing_field",
        ),
        (
            "negative",
            "kubelet.koordinator.sh/cpu-manager-policy",
            r#"{"policy":"static","reservedCPUs":"-1"}"#,
            "negative",
        ),
    ];
    for (name, key, value, _) in &cases {
        service::add_gpu_node(&fake, name, 2, &[]);
        fake.create(
            Kind::NodeResourceTopology,
            koord_nrt(name, 2, 4, "None", &[(key, value)]),
        )
        .unwrap();
    }
    service::add_gpu_node(&fake, "good", 2, &[]);
    fake.create(
        Kind::NodeResourceTopology,
        koord_nrt("good", 2, 4, "None", &[]),
    )
    .unwrap();
    let env = Env::start(&fake, &[]).await;

    let (_, metrics) = env.http.get("/metrics").await;
    let text = metrics.as_str().unwrap_or_default();
    for (name, key, _, problem) in &cases {
        let short = key.rsplit('/').next().unwrap();
        assert!(
            metric_value(
                text,
                "dne_nrt_problems_total",
                &format!("annotation=\"{short}\",problem=\"{problem}\"")
            ) >= 1.0,
            "{name}: {problem} not counted:\n{text}"
        );
    }
    let names: Vec<&str> = cases.iter().map(|c| c.0).chain(["good"]).collect();
    let cpuset = lsr_pod("c", 2, json!({}));
    let f = env.filter(&cpuset, &names).await;
    assert_eq!(f["NodeNames"], json!(["good"]), "{f}");
    for (name, ..) in &cases {
        let reason = f["FailedAndUnresolvableNodes"][name].as_str().unwrap_or("");
        assert!(reason.contains("unusable"), "{name}: {f}");
    }
    // The device ledger of a blocked node is untouched: a GPU pod still fits everywhere.
    let gpu = service::pending("g", json!({"nvidia.com/gpu": "2"}));
    let f = env.filter(&gpu, &names).await;
    assert_eq!(f["NodeNames"].as_array().unwrap().len(), names.len(), "{f}");
    let d = crate::gpu::ledger(&env.http, "bad-json").await;
    assert_eq!(d["device_object_present"], true, "{d}");
    env.svc.shutdown().await.expect("shutdown");
}

/// Preempt releases the victims' CPUs (not only their devices) in its scratch copy: on an
/// 8-CPU node whose CPUs two LSR pods hold, a 4-CPU LSR pod fits once one of them is a
/// victim, not with a victim that holds nothing there; and preempt changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempt_releases_the_victims_cpus() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("small")).unwrap();
    fake.create(
        Kind::NodeResourceTopology,
        koord_nrt("small", 1, 4, "None", &[]),
    )
    .unwrap();
    for (name, cpus) in [("v1", "0-3"), ("v2", "4-7")] {
        let mut p = service::pod(
            "ml",
            name,
            &format!("uid-{name}"),
            json!({"cpu": "4", "memory": "8Gi"}),
            Some("small"),
            None,
        );
        p["metadata"]["labels"] = json!({"koordinator.sh/qosClass": "LSR"});
        p["metadata"]["annotations"] = json!({
            RESOURCE_STATUS: json!({"cpuset": cpus}).to_string()
        });
        fake.create(Kind::Pod, p).unwrap();
    }
    let env = Env::start(&fake, &[]).await;
    let pod = lsr_pod("hi", 4, json!({}));
    fake.create(Kind::Pod, pod.clone()).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while debug_cpus(&env.http, "small").await["allocated"] != "0-7" {
        assert!(tokio::time::Instant::now() < deadline, "CPUs never held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let f = env.filter(&pod, &["small"]).await;
    assert_eq!(f["NodeNames"], json!([]), "every CPU is held: {f}");

    let meta = |uids: &[&str]| {
        let pods: Vec<Value> = uids.iter().map(|u| json!({"UID": u})).collect();
        json!({"Pods": pods, "NumPDBViolations": 0})
    };
    for (victims, kept) in [
        (vec!["uid-v1"], true),
        (vec!["uid-v2", "uid-v1"], true),
        (vec!["uid-nobody"], false),
    ] {
        let args = json!({"Pod": pod, "NodeNameToMetaVictims": {"small": meta(&victims)}});
        let (status, out) = env.http.post("/preempt", &args).await;
        assert_eq!(status, 200, "{out}");
        let want = if kept {
            json!({"small": meta(&victims)})
        } else {
            json!({})
        };
        assert_eq!(out["NodeNameToMetaVictims"], want, "victims {victims:?}");
    }
    assert_eq!(
        debug_cpus(&env.http, "small").await["allocated"],
        "0-7",
        "preempt only looks"
    );
    env.svc.shutdown().await.unwrap();
}

/// A pod already bound to `node` with this `resource-status` (as an earlier bind wrote it).
fn bound_with_status(name: &str, node: &str, status: &str, qos: &str) -> Value {
    let mut p = service::pod(
        "ml",
        name,
        &format!("uid-{name}"),
        json!({"cpu": "1"}),
        Some(node),
        None,
    );
    p["metadata"]["labels"] = json!({"koordinator.sh/qosClass": qos});
    p["metadata"]["annotations"] = json!({ RESOURCE_STATUS: status });
    p
}

/// Issue 22 §4: one NUMA node's CPUs are counted once, whoever holds them. 2 NUMA nodes of 8
/// CPUs (0-7, 8-15), no node NUMA policy.
/// (a) NUMA 0 is wholly held by a cpuset written without `numaNodeResources` (as the extender
/// writes on nodes without a NUMA policy): an LS pod with a pod-level SingleNUMANode policy
/// must get NUMA 1, not NUMA 0's empty shared pool.
/// (b) NUMA 1's whole pool backs an LS pod's NUMA share: a new cpuset may not take NUMA 1's
/// CPUs (koordlet would give the LS pod an empty shared pool): a 4-CPU cpuset lands in NUMA 0's
/// 6 free CPUs, and another 4-CPU one, with 2 left there, does not fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_numa_nodes_cpus_are_promised_once_to_cpusets_and_shares() {
    let fake = FakeApiServer::new();
    // (a) runs under both NUMA strategies: node a-most packs, a-least spreads.
    let nodes = [
        ("a-most", Some("MostAllocated")),
        ("a-least", Some("LeastAllocated")),
        ("b", None),
    ];
    for (node, strategy) in nodes {
        let mut n = service::node(node);
        if let Some(s) = strategy {
            n["metadata"]["labels"]["node.koordinator.sh/numa-allocate-strategy"] = json!(s);
        }
        fake.create(Kind::Node, n).unwrap();
        fake.create(
            Kind::NodeResourceTopology,
            koord_nrt(node, 2, 4, "None", &[]),
        )
        .unwrap();
    }
    for node in ["a-most", "a-least"] {
        let held = bound_with_status(&format!("held-{node}"), node, r#"{"cpuset":"0-7"}"#, "LSR");
        fake.create(Kind::Pod, held).unwrap();
    }
    fake.create(
        Kind::Pod,
        bound_with_status(
            "share",
            "b",
            r#"{"numaNodeResources":[{"node":1,"resources":{"cpu":"8"}}]}"#,
            "LS",
        ),
    )
    .unwrap();
    fake.create(
        Kind::Pod,
        bound_with_status("two", "b", r#"{"cpuset":"0-1"}"#, "LSR"),
    )
    .unwrap();
    let env = Env::start(&fake, &[]).await;

    // (a)
    for node in ["a-most", "a-least"] {
        let name = format!("ls-{node}");
        let mut ls = service::pending(&name, json!({"cpu": "4", "memory": "4Gi"}));
        ls["metadata"]["labels"] = json!({"koordinator.sh/qosClass": "LS"});
        ls["metadata"]["annotations"] = json!({
            "scheduling.koordinator.sh/numa-topology-spec": r#"{"numaTopologyPolicy":"SingleNUMANode"}"#});
        fake.create(Kind::Pod, ls.clone()).unwrap();
        env.bind(&ls, node).await.unwrap();
        let status = annotation(&fake, &name, RESOURCE_STATUS).unwrap();
        let (cpus, numas) = koordlet_status(&status);
        assert!(cpus.is_empty(), "an LS pod gets no cpuset: {cpus:?}");
        let got: Vec<u64> = numas.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            got,
            vec![1],
            "{node}: NUMA 0's CPUs are all in a cpuset: {numas:?}"
        );
    }

    // (b)
    let four = lsr_pod("four", 4, json!({}));
    fake.create(Kind::Pod, four.clone()).unwrap();
    env.bind(&four, "b").await.unwrap();
    let (cpus, _) = koordlet_status(&annotation(&fake, "four", RESOURCE_STATUS).unwrap());
    assert_eq!(cpus.len(), 4);
    assert!(
        cpus.iter().all(|c| (2..8).contains(c)),
        "the cpuset took NUMA 1's shared pool or another cpuset's CPUs: {cpus:?}"
    );
    // NUMA 0 has 2 CPUs left, NUMA 1's 8 are the LS pod's pool: 4 more do not fit.
    let more = lsr_pod("more", 4, json!({}));
    fake.create(Kind::Pod, more.clone()).unwrap();
    let err = env.bind(&more, "b").await.unwrap_err();
    assert!(
        err.contains("cannot place") || err.contains("insufficient"),
        "{err}"
    );
    env.svc.shutdown().await.unwrap();
}

/// A koordlet-style NRT for koordinator's test topology `buildCPUTopologyForTest(sockets,
/// nodesPerSocket, coresPerNode, 2)`: CPU ids sequential, a core's two threads adjacent.
fn koord_test_nrt(name: &str, sockets: u32, per_socket: u32, cores: u32) -> Value {
    let mut detail = Vec::new();
    let mut core = 0;
    for s in 0..sockets {
        for n in 0..per_socket {
            let numa = s * per_socket + n;
            for _ in 0..cores {
                for t in 0..2 {
                    detail
                        .push(json!({"id": core * 2 + t, "core": core, "socket": s, "node": numa}));
                }
                core += 1;
            }
        }
    }
    let zones: Vec<Value> = (0..sockets * per_socket)
        .map(|n| {
            let cpus = (cores * 2).to_string();
            json!({"name": format!("node-{n}"), "type": "Node", "resources": [
                {"name": "cpu", "capacity": cpus, "allocatable": cpus, "available": cpus},
                {"name": "memory", "capacity": "64Gi", "allocatable": "64Gi", "available": "64Gi"}]})
        })
        .collect();
    json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": name, "annotations": {
            "node.koordinator.sh/cpu-topology": json!({ "detail": detail }).to_string(),
            "kubelet.koordinator.sh/cpu-manager-policy": r#"{"policy":"none"}"#}},
        "topologyPolicies": ["None"],
        "zones": zones,
    })
}

/// The four cases of koordinator v1.7.0's `cpu_accumulator_test.go` this accumulator used to
/// get wrong (issue 23), now through the whole service: the held CPUs come from running pods'
/// `resource-status`, the strategy from the node's label, the policy from the pod's
/// `resource-spec`; the cpuset bind writes must be koordinator's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn koordinators_accumulator_cases_hold_through_bind() {
    struct Through {
        name: &'static str,
        topology: (u32, u32, u32),
        strategy: &'static str,
        held: &'static str,
        held_spec: Option<&'static str>,
        need: u32,
        spec: &'static str,
        want: &'static str,
    }
    let cases = [
        Through {
            name: "full/most: allocate with the most spread cpus",
            topology: (2, 2, 2),
            strategy: "MostAllocated",
            held: "0,2,4,8,10,12",
            held_spec: None,
            need: 6,
            spec: r#"{"preferredCPUBindPolicy":"FullPCPUs"}"#,
            want: "5-7,13-15",
        },
        Through {
            name: "full/least: allocate with the less spread cpus 2",
            topology: (2, 2, 2),
            strategy: "LeastAllocated",
            held: "0,2,4,8,10,12",
            held_spec: None,
            need: 6,
            spec: r#"{"preferredCPUBindPolicy":"FullPCPUs"}"#,
            want: "1,3,6-7,14-15",
        },
        Through {
            name: "spread/most: allocate cpus on full-free socket",
            topology: (2, 1, 4),
            strategy: "MostAllocated",
            held: "0-3",
            held_spec: None,
            need: 4,
            spec: r#"{"preferredCPUBindPolicy":"SpreadByPCPUs"}"#,
            want: "8,10,12,14",
        },
        Through {
            name: "exclusive: allocate cpus on full-free socket with PCPULevel",
            topology: (2, 1, 4),
            strategy: "MostAllocated",
            held: "0,2",
            held_spec: Some(r#"{"preferredCPUExclusivePolicy":"PCPULevel"}"#),
            need: 4,
            spec: r#"{"preferredCPUBindPolicy":"SpreadByPCPUs","preferredCPUExclusivePolicy":"PCPULevel"}"#,
            want: "8,10,12,14",
        },
    ];
    let fake = FakeApiServer::new();
    for (i, c) in cases.iter().enumerate() {
        let node = format!("k{i}");
        let mut n = service::node(&node);
        n["metadata"]["labels"]["node.koordinator.sh/numa-allocate-strategy"] = json!(c.strategy);
        fake.create(Kind::Node, n).unwrap();
        let (s, per, cores) = c.topology;
        fake.create(
            Kind::NodeResourceTopology,
            koord_test_nrt(&node, s, per, cores),
        )
        .unwrap();
        let mut held = bound_with_status(
            &format!("held-{i}"),
            &node,
            &json!({ "cpuset": c.held }).to_string(),
            "LSR",
        );
        if let Some(spec) = c.held_spec {
            held["metadata"]["annotations"]["scheduling.koordinator.sh/resource-spec"] =
                json!(spec);
        }
        fake.create(Kind::Pod, held).unwrap();
    }
    let env = Env::start(&fake, &[]).await;
    for (i, c) in cases.iter().enumerate() {
        let node = format!("k{i}");
        let name = format!("pod-{i}");
        let mut pod = lsr_pod(&name, c.need, json!({}));
        pod["spec"]["containers"][0]["resources"] = json!({
            "requests": {"cpu": c.need.to_string()}, "limits": {"cpu": c.need.to_string()}});
        pod["metadata"]["annotations"] = json!({"scheduling.koordinator.sh/resource-spec": c.spec});
        fake.create(Kind::Pod, pod.clone()).unwrap();
        env.bind(&pod, &node)
            .await
            .unwrap_or_else(|e| panic!("{}: bind: {e}", c.name));
        let status = annotation(&fake, &name, RESOURCE_STATUS)
            .unwrap_or_else(|| panic!("{}: no resource-status", c.name));
        let (cpus, _) = koordlet_status(&status);
        assert_eq!(cpus, cpu_list(c.want), "{}: {status}", c.name);
    }
    env.svc.shutdown().await.unwrap();
}

/// Issue 23 §5: koordinator's CPU amplification check (`filterAmplifiedCPUs`). Node `amp`
/// has 16 CPUs amplified 1.5× (allocatable 24 CPUs) and a plain pod requesting 6 bound there.
/// A GPU + 4-CPU cpuset pod is bound with its binding held: while its entry is assumed, and
/// again once the watch lists it, the node has 24 − (6 + 4 − 4 + 4 × 1.5) = 12 CPUs left for
/// a plain pod: 12 fit, 12.5 are "Insufficient amplified cpu". (Not counting the assumed pod
/// would let 12.5 through; counting it twice once listed would refuse 12.) Node `bad` carries a
/// ratio that does not parse: unresolvable for any pod with a CPU request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amplified_cpu_counts_cpusets_amplified_and_assumed_binds_once() {
    use crate::gpu::{HeldBind, faulty_client, uid};
    const RATIO: &str = "node.koordinator.sh/resource-amplification-ratio";
    let fake = FakeApiServer::new();
    for (name, ratio) in [("amp", r#"{"cpu":1.5}"#), ("bad", r#"{"cpu":"x"}"#)] {
        let mut node = service::node(name);
        node["metadata"]["annotations"] = json!({ RATIO: ratio });
        node["status"]["allocatable"]["cpu"] = json!("24");
        fake.create(Kind::Node, node).unwrap();
        // 2 NUMA nodes × 4 cores × 2 threads = 16 CPUs.
        fake.create(
            Kind::NodeResourceTopology,
            koord_nrt(name, 2, 4, "None", &[]),
        )
        .unwrap();
        fake.create(Kind::Device, service::gpu_device(name, 2, 1, &[]))
            .unwrap();
    }
    let plain_bound = service::pod(
        "ml",
        "plain-bound",
        "uid-plain-bound",
        json!({"cpu": "6"}),
        Some("amp"),
        None,
    );
    fake.create(Kind::Pod, plain_bound).unwrap();
    let (client, faults) = faulty_client(&fake);
    let env = Env::start_with(&fake, client, &[]).await;

    let plain = |name: &str, cpu: &str| {
        let mut p = service::pending(name, json!({"cpu": cpu, "memory": "1Gi"}));
        p["metadata"]["labels"] = json!({"koordinator.sh/qosClass": "LS"});
        fake.create(Kind::Pod, p.clone()).unwrap();
        p
    };
    let (fits, too_big) = (plain("fits", "12"), plain("too-big", "12500m"));
    let check = |body: Value, fits_amp: bool| {
        let passed: Vec<&str> = body["NodeNames"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert_eq!(passed.contains(&"amp"), fits_amp, "{body}");
        if !fits_amp {
            assert_eq!(
                body["FailedNodes"]["amp"], "Insufficient amplified cpu: pod asks 12.5 cpus",
                "{body}"
            );
        }
        assert_eq!(
            body["FailedAndUnresolvableNodes"]["bad"], "node(s) invalid CPU amplification ratio",
            "{body}"
        );
    };

    let gpu_cpuset = lsr_pod("gpu-cpuset", 4, json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, gpu_cpuset.clone()).unwrap();
    let held = HeldBind::start(&env, &faults, &gpu_cpuset, "amp").await;
    check(env.filter(&fits, &["amp", "bad"]).await, true);
    check(env.filter(&too_big, &["amp", "bad"]).await, false);

    held.finish().await.expect("the bind lands");
    env.wait_committed("amp", &uid(&gpu_cpuset)).await;
    let status = annotation(&fake, "gpu-cpuset", RESOURCE_STATUS).expect("resource-status");
    assert_eq!(koordlet_status(&status).0.len(), 4, "{status}");
    check(env.filter(&fits, &["amp", "bad"]).await, true);
    check(env.filter(&too_big, &["amp", "bad"]).await, false);
}
