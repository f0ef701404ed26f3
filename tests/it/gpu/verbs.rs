//! Filter and preempt semantics through HTTP: health, missing and deleted Device objects,
//! malformed annotations, invalid requests, and victims that do or do not free a GPU.

use serde_json::{Value, json};

use super::*;
use crate::support::service;

fn whole_annotation(minors: &[i32]) -> String {
    let entries: Vec<Value> = minors
        .iter()
        .map(|m| {
            json!({"minor": m, "resources": {"koordinator.sh/gpu-core": "100",
                   "koordinator.sh/gpu-memory": "80Gi", RATIO: "100"}})
        })
        .collect();
    json!({ "gpu": entries }).to_string()
}

/// A running pod on `node` holding `minors` whole.
fn holder(name: &str, node: &str, minors: &[i32]) -> Value {
    service::pod(
        "ml",
        name,
        &format!("uid-{name}"),
        whole_gpus(minors.len() as u32),
        Some(node),
        Some(&whole_annotation(minors)),
    )
}

fn names(filter: &Value) -> Vec<String> {
    serde_json::from_value(filter["NodeNames"].clone()).unwrap_or_default()
}

fn reason<'a>(filter: &'a Value, map: &str, node: &str) -> Option<&'a str> {
    filter[map][node].as_str()
}

#[tokio::test]
async fn unhealthy_gpus_are_never_chosen() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "u", 4, &[1, 3]);
    add_gpu_node(&fake, "dead", 2, &[0, 1]);
    let pods: Vec<Value> = (0..4)
        .map(|i| pending(&format!("p{i}"), whole_gpus(1)))
        .collect();
    fake.create_many(Kind::Pod, pods.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;

    let f = env.filter(&pods[0], &["u", "dead"]).await;
    assert_eq!(names(&f), vec!["u"], "{f}");
    assert!(
        reason(&f, "FailedNodes", "dead").is_some()
            || reason(&f, "FailedAndUnresolvableNodes", "dead").is_some(),
        "{f}"
    );
    assert!(env.bind(&pods[0], "dead").await.is_err());

    let mut minors = Vec::new();
    for p in &pods {
        if env.bind(p, "u").await.is_ok() {
            minors.extend(
                gpu_shares(&annotation_of(&fake, p).unwrap())
                    .into_iter()
                    .map(|s| s.0),
            );
        }
    }
    minors.sort();
    assert_eq!(minors, vec![0, 2], "only the healthy minors are handed out");
    let two = pending("two", whole_gpus(2));
    let f = env.filter(&two, &["u"]).await;
    assert!(names(&f).is_empty(), "{f}");
    env.svc.shutdown().await.unwrap();
}

/// A node without a Device object whose Node advertises what the pod asks (a device plugin
/// registered `nvidia.com/gpu`): its device plugin owns it, so the pod passes and binds
/// without an annotation.
#[tokio::test]
async fn node_without_a_device_object_serves_what_it_advertises_without_an_annotation() {
    let fake = FakeApiServer::new();
    let mut plain = service::node("plain");
    plain["status"]["allocatable"]["nvidia.com/gpu"] = json!("4");
    fake.create(Kind::Node, plain).unwrap();
    let p = pending("p", whole_gpus(1));
    fake.create(Kind::Pod, p.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;
    let f = env.filter(&p, &["plain"]).await;
    assert_eq!(names(&f), vec!["plain"], "{f}");
    env.bind(&p, "plain").await.unwrap();
    assert_eq!(node_of(&fake, &p).as_deref(), Some("plain"));
    assert_eq!(
        annotation_of(&fake, &p),
        None,
        "the kubelet's device plugin owns this node"
    );
    let cluster = env.svc.state.scheduler.cluster.clone();
    let u = uid(&p);
    service::eventually(WAIT, "the bound pod to be seen", || {
        cluster.debug_dump()["plain"]["pods"].get(&u).is_some()
    })
    .await;
    let view = env.ledger("plain").await;
    assert!(view["entries"].as_object().unwrap().is_empty(), "{view}");
    env.svc.shutdown().await.unwrap();
}

/// Issue 36 §6: a GPU-share pod offered a CPU-only node (no Device object, nothing advertised)
/// while the GPU nodes are full. Before the fix filter passed it ("left to device plugins") and
/// bind put the pod there, where kubelet runs it without a GPU. Now filter (fast path and full
/// decision alike), preempt and bind all refuse it, unresolvably, naming what is missing; a
/// node that advertises only whole GPUs does not serve a share either.
#[tokio::test]
async fn a_device_pod_is_never_placed_on_a_node_that_does_not_advertise_its_devices() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "gpu", 1, &[]);
    fake.create(Kind::Node, service::node("cpu-only")).unwrap();
    let mut whole_only = service::node("whole-only");
    whole_only["status"]["allocatable"]["nvidia.com/gpu"] = json!("8");
    fake.create(Kind::Node, whole_only).unwrap();
    fake.create(Kind::Pod, holder("full", "gpu", &[0])).unwrap();
    let share = pending(
        "share",
        json!({"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "100"}),
    );
    fake.create(Kind::Pod, share.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;
    env.wait_committed("gpu", "uid-full").await;

    let f = env.filter(&share, &["gpu", "cpu-only", "whole-only"]).await;
    assert!(names(&f).is_empty(), "{f}");
    for node in ["cpu-only", "whole-only"] {
        assert_eq!(
            reason(&f, "FailedAndUnresolvableNodes", node),
            Some(
                "node has no Device object and does not advertise koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio"
            ),
            "{f}"
        );
    }
    assert!(reason(&f, "FailedNodes", "gpu").is_some(), "{f}");
    assert_eq!(
        env.metric(
            "dne_filter_rejected_nodes_total",
            "reason=\"device_not_advertised\""
        )
        .await,
        2.0
    );

    // Bind re-decides on its own and refuses too.
    let e = env.bind(&share, "cpu-only").await.unwrap_err();
    assert!(e.contains("does not advertise"), "{e}");
    assert_eq!(node_of(&fake, &share), None);

    // Preempt: no victim makes the node advertise a GPU.
    let args = json!({
        "Pod": share,
        "NodeNameToVictims": null,
        "NodeNameToMetaVictims": {"cpu-only": {"Pods": [], "NumPDBViolations": 0}}
    });
    let (status, out) = env.http.post("/preempt", &args).await;
    assert_eq!(status, 200);
    assert_eq!(out, json!({"NodeNameToMetaVictims": {}}), "{out}");

    // The same node advertising the share names (koord-manager's node resource controller)
    // serves the pod through its device plugins.
    let mut advertised = service::node("cpu-only");
    advertised["status"]["allocatable"]["koordinator.sh/gpu-core"] = json!("100");
    advertised["status"]["allocatable"]["koordinator.sh/gpu-memory-ratio"] = json!("100");
    fake.replace(Kind::Node, advertised).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let f = env.filter(&share, &["cpu-only"]).await;
        if names(&f) == ["cpu-only"] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never passed: {f}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    env.svc.shutdown().await.unwrap();
}

/// koordinator #1186: deleting the Device must not free what pods hold; the node fails
/// resolvably until it comes back, and then the held GPU stays held.
#[tokio::test]
async fn deleted_device_object_fails_resolvably_and_keeps_the_used_ledger() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 2, &[]);
    let a = pending("a", whole_gpus(1));
    let b = pending("b", whole_gpus(1));
    let two = pending("two", whole_gpus(2));
    fake.create_many(Kind::Pod, [a.clone(), b.clone(), two.clone()])
        .unwrap();
    let env = Env::start(&fake, &[]).await;
    env.bind(&a, "n1").await.unwrap();
    env.wait_committed("n1", &uid(&a)).await;
    let held = gpu_shares(&annotation_of(&fake, &a).unwrap())[0].0;

    fake.delete(Kind::Device, "", "n1").unwrap();
    let cluster = env.svc.state.scheduler.cluster.clone();
    service::eventually(WAIT, "the Device deletion to be applied", || {
        cluster.debug_dump()["n1"]["devices"]["device_object_present"] == false
    })
    .await;
    let f = env.filter(&b, &["n1"]).await;
    assert!(names(&f).is_empty(), "{f}");
    let why = reason(&f, "FailedNodes", "n1").unwrap_or_else(|| panic!("not resolvable: {f}"));
    assert!(why.contains("device object missing"), "{why}");
    assert!(env.bind(&b, "n1").await.is_err());
    let view = env.ledger("n1").await;
    assert_eq!(view["entries"][uid(&a)]["state"], "committed", "{view}");
    assert_eq!(
        view["types"]["gpu"][held.to_string()]["used"][RATIO],
        "100",
        "{view}"
    );

    fake.create(Kind::Device, service::gpu_device("n1", 2, 1, &[]))
        .unwrap();
    service::eventually(WAIT, "the Device to return", || {
        cluster.debug_dump()["n1"]["devices"]["device_object_present"] == true
    })
    .await;
    let f = env.filter(&two, &["n1"]).await;
    assert!(
        names(&f).is_empty(),
        "a's GPU must still count as used: {f}"
    );
    env.bind(&b, "n1").await.unwrap();
    let got = gpu_shares(&annotation_of(&fake, &b).unwrap())[0].0;
    assert_ne!(got, held);
    env.svc.shutdown().await.unwrap();
}

#[tokio::test]
async fn malformed_annotation_blocks_the_node_until_its_pod_goes() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 4, &[]);
    add_gpu_node(&fake, "n2", 4, &[]);
    let bad = service::pod(
        "ml",
        "bad",
        "uid-bad",
        whole_gpus(1),
        Some("n1"),
        Some("{not json"),
    );
    fake.create(Kind::Pod, bad).unwrap();
    let p = pending("p", ratio(10));
    fake.create(Kind::Pod, p.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;

    let f = env.filter(&p, &["n1", "n2"]).await;
    assert_eq!(names(&f), vec!["n2"], "{f}");
    assert!(reason(&f, "FailedNodes", "n1").is_some(), "{f}");
    assert_eq!(env.ledger("n1").await["blocked_by_malformed_entries"], true);
    assert!(
        env.bind(&p, "n1")
            .await
            .unwrap_err()
            .contains("cannot place")
    );
    assert!(env.metric("dne_malformed_annotations_total", "").await >= 1.0);

    fake.delete(Kind::Pod, "ml", "bad").unwrap();
    let cluster = env.svc.state.scheduler.cluster.clone();
    service::eventually(WAIT, "the malformed pod to be forgotten", || {
        cluster.debug_dump()["n1"]["devices"]["blocked_by_malformed_entries"] == false
    })
    .await;
    let f = env.filter(&p, &["n1", "n2"]).await;
    assert_eq!(names(&f), vec!["n1", "n2"], "{f}");
    env.bind(&p, "n1").await.unwrap();
    env.svc.shutdown().await.unwrap();
}

#[tokio::test]
async fn invalid_requests_are_unresolvable_everywhere_and_change_nothing() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 2, &[]);
    add_gpu_node(&fake, "n2", 2, &[]);
    fake.create(Kind::Node, service::node("plain")).unwrap();
    fake.create(Kind::Pod, holder("h", "n1", &[0])).unwrap();
    let over = pending("over", json!({RATIO: "150"}));
    let mixed = pending(
        "mixed",
        json!({"nvidia.com/gpu": "1", "koordinator.sh/gpu-core": "50"}),
    );
    fake.create_many(Kind::Pod, [over.clone(), mixed.clone()])
        .unwrap();
    let env = Env::start(&fake, &[]).await;
    env.wait_committed("n1", "uid-h").await;
    let before = without_timings(
        serde_json::to_value(env.svc.state.scheduler.cluster.debug_dump()).unwrap(),
    );

    for (pod, names_in_reason) in [
        (&over, vec!["koordinator.sh/gpu-memory-ratio"]),
        (&mixed, vec!["nvidia.com/gpu", "koordinator.sh/gpu-core"]),
    ] {
        let f = env.filter(pod, &["n1", "n2", "plain"]).await;
        assert!(names(&f).is_empty(), "{f}");
        assert_eq!(
            f["Error"], "",
            "a bad pod is a filter result, not an error: {f}"
        );
        for node in ["n1", "n2", "plain"] {
            let why = reason(&f, "FailedAndUnresolvableNodes", node)
                .unwrap_or_else(|| panic!("{node} missing from FailedAndUnresolvableNodes: {f}"));
            for n in &names_in_reason {
                assert!(why.contains(n), "{node}: reason {why:?} does not name {n}");
            }
        }
        let (_, scores) = env
            .http
            .post("/prioritize", &service::extender_args(pod, &["n1", "n2"]))
            .await;
        // Every candidate scores alike (no opinion): nothing differs, nothing is listed.
        assert_eq!(scores, json!([]));
        let err = env.bind(pod, "n2").await.unwrap_err();
        assert!(err.contains("invalid device request"), "{err}");
        assert_eq!(node_of(&fake, pod), None);
        assert_eq!(annotation_of(&fake, pod), None);
    }
    let after = without_timings(
        serde_json::to_value(env.svc.state.scheduler.cluster.debug_dump()).unwrap(),
    );
    assert_eq!(before, after, "invalid requests changed the cache");
    env.svc.shutdown().await.unwrap();
}

/// Two nodes, both GPUs held on each. p1's victims hold GPUs; p2's victim holds none.
async fn preempt_env() -> (Env, Value) {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "p1", 2, &[]);
    add_gpu_node(&fake, "p2", 2, &[]);
    fake.create_many(
        Kind::Pod,
        [
            holder("v1", "p1", &[0]),
            holder("v2", "p1", &[1]),
            holder("w", "p2", &[0, 1]),
            service::pod(
                "ml",
                "cpu",
                "uid-cpu",
                json!({"cpu": "1"}),
                Some("p2"),
                None,
            ),
        ],
    )
    .unwrap();
    let preemptor = pending("hi", whole_gpus(1));
    fake.create(Kind::Pod, preemptor.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;
    for (n, u) in [("p1", "uid-v1"), ("p1", "uid-v2"), ("p2", "uid-w")] {
        env.wait_committed(n, u).await;
    }
    let f = env.filter(&preemptor, &["p1", "p2"]).await;
    assert!(names(&f).is_empty(), "both nodes are full: {f}");
    (env, preemptor)
}

fn meta(uids: &[&str]) -> Value {
    let pods: Vec<Value> = uids.iter().map(|u| json!({"UID": u})).collect();
    json!({"Pods": pods, "NumPDBViolations": 1})
}

#[tokio::test]
async fn preempt_keeps_only_nodes_whose_victims_free_a_gpu_in_meta_mode() {
    let (env, preemptor) = preempt_env().await;
    let args = json!({
        "Pod": preemptor,
        "NodeNameToVictims": null,
        "NodeNameToMetaVictims": {"p1": meta(&["uid-v2", "uid-v1"]), "p2": meta(&["uid-cpu"])}
    });
    let (status, out) = env.http.post("/preempt", &args).await;
    assert_eq!(status, 200);
    assert_eq!(
        out,
        json!({"NodeNameToMetaVictims": {"p1": meta(&["uid-v2", "uid-v1"])}})
    );

    // One victim on p1 is enough for one GPU; not for two.
    let two = pending("two", whole_gpus(2));
    for (pod, victims, kept) in [
        (&preemptor, vec!["uid-v1"], true),
        (&two, vec!["uid-v1"], false),
        (&two, vec!["uid-v1", "uid-v2"], true),
        (&two, vec!["uid-cpu", "uid-v2", "uid-nobody"], false),
    ] {
        let args = json!({"Pod": pod, "NodeNameToMetaVictims": {"p1": meta(&victims)}});
        let (_, out) = env.http.post("/preempt", &args).await;
        let want = if kept {
            json!({"p1": meta(&victims)})
        } else {
            json!({})
        };
        assert_eq!(
            out["NodeNameToMetaVictims"],
            want,
            "{} with {victims:?}",
            name(pod)
        );
    }
    // Preempt only looks: the victims still hold their GPUs.
    let view = env.ledger("p1").await;
    assert_eq!(view["entries"].as_object().unwrap().len(), 2, "{view}");
    env.svc.shutdown().await.unwrap();
}

#[tokio::test]
async fn preempt_accepts_full_victim_pods_and_answers_meta_victims() {
    let (env, preemptor) = preempt_env().await;
    let pod = |n: &str| env.fake.get(Kind::Pod, "ml", n).unwrap();
    let full = |names: &[&str]| {
        let pods: Vec<Value> = names.iter().map(|n| pod(n)).collect();
        json!({"Pods": pods, "NumPDBViolations": 1})
    };
    let args = json!({
        "Pod": preemptor,
        "NodeNameToVictims": {"p1": full(&["v2", "v1"]), "p2": full(&["cpu"])},
        "NodeNameToMetaVictims": null
    });
    let (status, out) = env.http.post("/preempt", &args).await;
    assert_eq!(status, 200);
    assert_eq!(
        out,
        json!({"NodeNameToMetaVictims": {"p1": meta(&["uid-v2", "uid-v1"])}})
    );
    env.svc.shutdown().await.unwrap();
}

/// Issue 8: filter and prioritize read the read snapshot, which bind publishes before it
/// answers. With the pod watch held (so no confirmation can arrive), a filter and a
/// prioritize issued right after a bind returned must already see that bind's GPU.
#[tokio::test]
async fn a_filter_right_after_a_bind_sees_its_allocation() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n", 2, &[]);
    add_gpu_node(&fake, "m", 2, &[]);
    let first = pending("first", whole_gpus(1));
    let second = pending("second", whole_gpus(2));
    fake.create_many(Kind::Pod, vec![first.clone(), second.clone()])
        .unwrap();
    let env = Env::start(&fake, &[]).await;
    env.fake.hold_watch_events(Kind::Pod);

    let before = env.filter(&second, &["n", "m"]).await;
    assert_eq!(names(&before), vec!["n", "m"], "{before}");
    env.bind(&first, "n").await.unwrap();
    // Nothing but the bind itself can have changed the caches: its entry is still assumed.
    assert_eq!(
        env.ledger("n").await["entries"][uid(&first)]["state"],
        json!("assumed")
    );
    let after = env.filter(&second, &["n", "m"]).await;
    assert_eq!(names(&after), vec!["m"], "{after}");
    assert_eq!(
        reason(&after, "FailedNodes", "n"),
        Some("insufficient gpu devices"),
        "{after}"
    );
    let (status, scores) = env
        .http
        .post("/prioritize", &service::extender_args(&first, &["n", "m"]))
        .await;
    assert_eq!(status, 200, "{scores}");
    let added = service::scores_as_added(&scores, &["n", "m"]);
    let score = |host: &str| added.iter().find(|(h, _)| h == host).map(|(_, s)| *s);
    assert!(
        score("m") > score("n"),
        "the emptier node ranks first after the bind: {scores}"
    );
    env.fake.release_watch_events(Kind::Pod);
    env.svc.shutdown().await.unwrap();
}

/// Issue 36 §4: a pod bound without an annotation (a preset `spec.nodeName`, another scheduler)
/// that asks for a GPU holds one nobody recorded. Before, the ledger counted it as nothing, and
/// the next pods were given every GPU of the node. Now it counts as one GPU of unknown identity,
/// where the allocator would put it: `inspect`'s view names it, the gauge counts it, and only
/// the rest of the node is handed out; when the pod goes, the GPU comes back.
#[tokio::test]
async fn a_pod_bound_without_an_annotation_holds_capacity_of_unknown_identity() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 2, &[]);
    let preset = service::pod(
        "ml",
        "preset",
        "uid-preset",
        whole_gpus(1),
        Some("n1"),
        None,
    );
    fake.create(Kind::Pod, preset.clone()).unwrap();
    let two = pending("two", whole_gpus(2));
    let one = pending("one", whole_gpus(1));
    let another = pending("another", whole_gpus(1));
    fake.create_many(Kind::Pod, [two.clone(), one.clone(), another.clone()])
        .unwrap();
    let env = Env::start(&fake, &[]).await;

    let f = env.filter(&two, &["n1"]).await;
    assert!(
        names(&f).is_empty(),
        "two GPUs offered while one is held: {f}"
    );
    let view = env.ledger("n1").await;
    assert!(view["entries"].get("uid-preset").is_some(), "{view}");
    assert_eq!(
        env.metric("dne_device_holders_unknown_identity", "").await,
        1.0
    );
    let report = device_numa_extender::cluster::report::cluster_report(
        &env.svc.state.scheduler.cluster,
        &[],
    );
    let n1 = report.nodes.iter().find(|n| n.name == "n1").unwrap();
    assert_eq!(n1.unknown_identity, vec!["ml/preset".to_string()]);
    let held: Vec<&str> = n1
        .gpus
        .iter()
        .flat_map(|g| g.holders.iter())
        .filter(|h| h.entry == "unknown-identity")
        .map(|h| h.pod.as_str())
        .collect();
    assert_eq!(held, ["ml/preset"]);

    // The other GPU is handed out once; nothing is left for a third.
    env.bind(&one, "n1").await.unwrap();
    let e = env.bind(&another, "n1").await.unwrap_err();
    assert!(e.contains("insufficient"), "{e}");
    let minors: Vec<(i64, i64)> = gpu_shares(&annotation_of(&fake, &one).unwrap());
    assert_eq!(minors.len(), 1);

    // The unknown holder goes: its GPU comes back.
    fake.delete(Kind::Pod, "ml", "preset").unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let f = env.filter(&another, &["n1"]).await;
        if names(&f) == ["n1"] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never freed: {f}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        env.metric("dne_device_holders_unknown_identity", "").await,
        0.0
    );
    env.svc.shutdown().await.unwrap();
}
