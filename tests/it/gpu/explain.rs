//! Pending pods explain themselves (issue 39 part 3): when filter leaves a pod no node, each
//! refused node's reason says what the pod asks and the node lacks, in words kube-scheduler
//! folds across nodes ("50 insufficient gpu devices: …" stays one line). Each reason class
//! against a node built to show it; the expected words are worked out from the objects here.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::*;
use crate::numa::{koord_nrt, lsr_pod};
use crate::support::service;

/// A running pod on `node` holding `percent` of GPU `minor` (core, memory ratio and the bytes
/// of an 80Gi card).
fn share_holder(name: &str, node: &str, minor: i32, percent: u32) -> Value {
    let bytes = 80u64 * (1 << 30) * u64::from(percent) / 100;
    let annotation = json!({"gpu": [{"minor": minor, "resources": {
        "koordinator.sh/gpu-core": percent.to_string(),
        "koordinator.sh/gpu-memory": bytes.to_string(),
        RATIO: percent.to_string()}}]})
    .to_string();
    service::pod(
        "ml",
        name,
        &format!("uid-{name}"),
        ratio(percent),
        Some(node),
        Some(&annotation),
    )
}

fn failed(filter: &Value, node: &str) -> String {
    filter["FailedNodes"][node]
        .as_str()
        .or_else(|| filter["FailedAndUnresolvableNodes"][node].as_str())
        .unwrap_or_else(|| panic!("{node} not refused: {filter}"))
        .to_string()
}

fn passing(filter: &Value) -> Vec<String> {
    serde_json::from_value(filter["NodeNames"].clone()).unwrap_or_default()
}

/// A share no card holds, with too little free on the node in all; the same share where three
/// cards together hold it (fragmentation); bytes of GPU memory; whole GPUs. One filter call
/// sees all four nodes, refuses each, and says why in the pod's terms.
#[tokio::test]
async fn each_gpu_shortfall_is_said_in_the_pods_terms() {
    let fake = FakeApiServer::new();
    // short: one card, 60 % held: 40 % free, and the node has nothing else.
    add_gpu_node(&fake, "short", 1, &[]);
    fake.create(Kind::Pod, share_holder("s0", "short", 0, 60))
        .unwrap();
    // frag: three cards, each 70 % held: 90 % free in all, 30 % on any one card.
    add_gpu_node(&fake, "frag", 3, &[]);
    for m in 0..3 {
        fake.create(Kind::Pod, share_holder(&format!("f{m}"), "frag", m, 70))
            .unwrap();
    }
    // whole: four cards, two held whole.
    add_gpu_node(&fake, "whole", 4, &[]);
    fake.create(
        Kind::Pod,
        service::pod(
            "ml",
            "w",
            "uid-w",
            whole_gpus(2),
            Some("whole"),
            Some(&service::whole_gpus(&[0, 1])),
        ),
    )
    .unwrap();
    let env = Env::start(&fake, &[]).await;
    let nodes = ["short", "frag", "whole"];

    let half = pending("half", ratio(50));
    let f = env.filter(&half, &["short", "frag"]).await;
    assert!(passing(&f).is_empty(), "{f}");
    assert_eq!(
        failed(&f, "short"),
        "insufficient gpu devices: largest free gpu-memory-ratio on one card 40-49 of 100, pod asks 50"
    );
    assert_eq!(
        failed(&f, "frag"),
        "insufficient gpu devices: fragmented, 3 cards partly free, largest free gpu-memory-ratio on one card 30-39 of 100, pod asks 50"
    );

    // 16Gi of GPU memory: `short`'s card has 32Gi free (fits), `frag`'s cards 24Gi each
    // (fit): only a bigger ask is refused. 40Gi: the 32Gi free on `short` is the 32-40Gi band
    // (powers of two, cut at the ask).
    let memory = pending("mem", json!({"koordinator.sh/gpu-memory": "40Gi"}));
    let f = env.filter(&memory, &["short", "frag"]).await;
    assert!(passing(&f).is_empty(), "{f}");
    assert_eq!(
        failed(&f, "short"),
        "insufficient gpu devices: largest free gpu-memory on one card 32-40Gi, pod asks 40Gi"
    );
    assert_eq!(
        failed(&f, "frag"),
        "insufficient gpu devices: fragmented, 3 cards partly free, largest free gpu-memory on one card 16-32Gi, pod asks 40Gi"
    );

    let four = pending("four", whole_gpus(4));
    let f = env.filter(&four, &nodes).await;
    assert!(passing(&f).is_empty(), "{f}");
    assert_eq!(
        failed(&f, "whole"),
        "insufficient gpu devices: 2 whole gpus free, pod asks 4"
    );
    assert_eq!(
        failed(&f, "frag"),
        "insufficient gpu devices: only 3 healthy gpus, pod asks 4"
    );
    let f = env
        .filter(&pending("three", whole_gpus(3)), &["frag"])
        .await;
    assert_eq!(
        failed(&f, "frag"),
        "insufficient gpu devices: no whole gpu free, pod asks 3"
    );

    // More than any card or node has: the node's own size, since freeing cannot help.
    let f = env
        .filter(
            &pending("huge", json!({"koordinator.sh/gpu-memory": "100Gi"})),
            &["short"],
        )
        .await;
    assert_eq!(
        failed(&f, "short"),
        "insufficient gpu devices: largest gpu-memory of any card 80Gi, pod asks 100Gi"
    );
    let f = env
        .filter(&pending("eight", whole_gpus(8)), &["whole"])
        .await;
    assert_eq!(
        failed(&f, "whole"),
        "insufficient gpu devices: only 4 healthy gpus, pod asks 8"
    );

    // Where a node passes, kube-scheduler shows nothing: the reasons stay the allocator's own
    // (no node is read twice for words nobody sees).
    let f = env.filter(&half, &["short", "whole"]).await;
    assert_eq!(passing(&f), vec!["whole"], "{f}");
    assert_eq!(failed(&f, "short"), "insufficient gpu devices");
    env.svc.shutdown().await.unwrap();
}

/// kube-scheduler counts identical reasons across nodes: 60 nodes of two classes whose free
/// capacity differs within a band give two distinct reasons, not 60.
#[tokio::test]
async fn a_class_of_nodes_folds_into_one_reason() {
    let fake = FakeApiServer::new();
    let mut names = Vec::new();
    for i in 0..60 {
        let name = format!("n{i:02}");
        add_gpu_node(&fake, &name, 2, &[]);
        // Held 61..=65 % (free 35..=39 %) on both cards for the first 40 nodes, 85 % for the rest.
        let held = if i < 40 { 61 + (i % 5) as u32 } else { 85 };
        for m in 0..2 {
            fake.create(
                Kind::Pod,
                share_holder(&format!("h{i}-{m}"), &name, m, held),
            )
            .unwrap();
        }
        names.push(name);
    }
    let env = Env::start(&fake, &[]).await;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let f = env.filter(&pending("half", ratio(50)), &refs).await;
    assert!(passing(&f).is_empty(), "{f}");
    let distinct: BTreeSet<String> = refs.iter().map(|n| failed(&f, n)).collect();
    assert_eq!(
        distinct,
        BTreeSet::from([
            "insufficient gpu devices: fragmented, 2 cards partly free, largest free gpu-memory-ratio on one card 30-39 of 100, pod asks 50".to_string(),
            "insufficient gpu devices: largest free gpu-memory-ratio on one card 10-19 of 100, pod asks 50".to_string(),
        ])
    );
    env.svc.shutdown().await.unwrap();
}

/// Four GPUs free, two on each NUMA node, for a pod asking four on one NUMA node; and a cpuset
/// larger than the free CPUs.
#[tokio::test]
async fn numa_and_cpu_shortfalls_name_the_pods_ask() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("split")).unwrap();
    // 2 NUMA nodes × 4 cores × 2 threads; GPUs 0,1 on NUMA 0 and 2,3 on NUMA 1.
    fake.create(
        Kind::NodeResourceTopology,
        koord_nrt("split", 2, 4, "None", &[]),
    )
    .unwrap();
    fake.create(Kind::Device, service::gpu_device("split", 4, 2, &[]))
        .unwrap();
    let env = Env::start(&fake, &[]).await;

    let mut gpus = lsr_pod("aligned", 2, whole_gpus(4));
    gpus["metadata"]["annotations"] = json!({
        "scheduling.koordinator.sh/numa-topology-spec": r#"{"numaTopologyPolicy":"SingleNUMANode"}"#});
    let f = env.filter(&gpus, &["split"]).await;
    assert!(passing(&f).is_empty(), "{f}");
    let why = failed(&f, "split");
    assert!(
        why.ends_with(
            ": 4 whole gpus free over 2 NUMA nodes, at most 2 on one, pod asks 4 (SingleNUMANode)"
        ),
        "{why}"
    );

    // 16 CPUs: one cpuset of 12 takes most; 8 more are not free.
    let twelve = lsr_pod("twelve", 12, json!({}));
    fake.create(Kind::Pod, twelve.clone()).unwrap();
    env.bind(&twelve, "split").await.unwrap();
    let f = env
        .filter(&lsr_pod("eight", 8, json!({})), &["split"])
        .await;
    assert!(passing(&f).is_empty(), "{f}");
    assert_eq!(
        failed(&f, "split"),
        "insufficient free cpus: pod asks 8 cpus"
    );
    env.svc.shutdown().await.unwrap();
}
