//! `--ranking=filter` against `--ranking=prioritize`, two services on one cluster: filter's
//! answer in filter mode must be exactly the fitting nodes that kube-scheduler, reading the
//! prioritize mode's filter and prioritize answers, would rank best by our score (what it adds
//! to each candidate's total, `scores_as_added`). Also: the stanza's missing prioritize is not
//! needed for pods without an opinion, and an unranked prioritize call still answers.

use serde_json::{Value, json};

use super::gpu::*;
use crate::support::service::{self, scores_as_added};
use crate::support::{FakeApiServer, Kind};

fn names(filter: &Value) -> Vec<String> {
    serde_json::from_value(filter["NodeNames"].clone()).unwrap_or_default()
}

/// What kube-scheduler adds to each candidate's total from `env`'s prioritize answer.
async fn prioritize(env: &Env, pod: &Value, candidates: &[&str]) -> Vec<(String, i64)> {
    let (status, answer) = env
        .http
        .post("/prioritize", &service::extender_args(pod, candidates))
        .await;
    assert_eq!(status, 200, "{answer}");
    scores_as_added(&answer, candidates)
}

/// A GPU pod holding `shares` (minor, gpu-memory-ratio) on `node`.
fn holder(name: &str, node: &str, shares: &[(i32, u32)]) -> Value {
    let entries: Vec<Value> = shares
        .iter()
        .map(|(minor, r)| {
            json!({"minor": minor, "resources": {"koordinator.sh/gpu-core": r.to_string(),
                   "koordinator.sh/gpu-memory-ratio": r.to_string()}})
        })
        .collect();
    let total: u32 = shares.iter().map(|(_, r)| r).sum();
    service::pod(
        "ml",
        name,
        &format!("uid-{name}"),
        json!({"koordinator.sh/gpu-core": total.to_string(),
               "koordinator.sh/gpu-memory-ratio": total.to_string()}),
        Some(node),
        Some(&json!({ "gpu": entries }).to_string()),
    )
}

/// A seeded generator (no dependency on the test order or the machine).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[tokio::test]
async fn filter_ranking_passes_exactly_the_nodes_prioritize_ranks_best() {
    let fake = FakeApiServer::new();
    // 24 nodes of 4 GPUs; occupancy drawn per GPU (a third of the nodes left empty), so scores
    // repeat (empty nodes) and differ (partly used ones) as on a real cluster.
    let mut rng = Lcg(37);
    let mut nodes = Vec::new();
    let mut holders = Vec::new();
    for n in 0..24 {
        let node = format!("n{n:02}");
        add_gpu_node(&fake, &node, 4, &[]);
        if n % 3 != 0 {
            let shares: Vec<(i32, u32)> = (0..4)
                .filter_map(|minor| {
                    let used = [0u32, 25, 50, 100][rng.next(4) as usize];
                    (used > 0).then_some((minor, used))
                })
                .collect();
            if !shares.is_empty() {
                holders.push(holder(&format!("h{n}"), &node, &shares));
            }
        }
        nodes.push(node);
    }
    fake.create_many(Kind::Pod, holders).unwrap();
    let by_filter = Env::start(&fake, &["--ranking=filter"]).await;
    let by_prioritize = Env::start(&fake, &[]).await;
    let candidates: Vec<&str> = nodes.iter().map(String::as_str).collect();

    let pods = [
        pending("whole", whole_gpus(1)),
        pending("two", whole_gpus(2)),
        pending("half", ratio(50)),
        pending("quarter", ratio(25)),
        pending("big-share", ratio(75)),
        // No device needs: no opinion, every candidate passes in both modes.
        pending("plain", json!({"cpu": "1"})),
    ];
    let mut ranked_out = 0;
    for pod in &pods {
        let all = by_prioritize.filter(pod, &candidates).await;
        let fitting = names(&all);
        let fitting_refs: Vec<&str> = fitting.iter().map(String::as_str).collect();
        let added = prioritize(&by_prioritize, pod, &fitting_refs).await;
        let best = added.iter().map(|(_, s)| *s).max();
        let expected: Vec<String> = added
            .iter()
            .filter(|(_, s)| Some(*s) == best)
            .map(|(h, _)| h.clone())
            .collect();

        let ranked = by_filter.filter(pod, &candidates).await;
        assert_eq!(names(&ranked), expected, "{}: {ranked}", name(pod));
        // The rejections are the same in both modes: ranking only leaves out fitting nodes.
        assert_eq!(ranked["FailedNodes"], all["FailedNodes"], "{}", name(pod));
        assert_eq!(
            ranked["FailedAndUnresolvableNodes"],
            all["FailedAndUnresolvableNodes"],
            "{}",
            name(pod)
        );
        ranked_out += fitting.len() - expected.len();
        if name(pod) == "plain" {
            assert_eq!(expected.len(), candidates.len());
        }
    }
    // The cluster is built so that ranking leaves nodes out (else the test proves little).
    assert!(ranked_out > 0);
    assert_eq!(
        by_filter
            .metric("dne_filter_ranked_out_nodes_total", "")
            .await as usize,
        ranked_out
    );

    // A scheduler still configured with prioritizeVerb: prioritize answers on the ranked
    // nodes, which all score alike, so nothing changes their order.
    let pod = &pods[0];
    let ranked = names(&by_filter.filter(pod, &candidates).await);
    let ranked_refs: Vec<&str> = ranked.iter().map(String::as_str).collect();
    let added = prioritize(&by_filter, pod, &ranked_refs).await;
    assert!(added.iter().all(|(_, s)| *s == added[0].1), "{added:?}");

    by_filter.svc.shutdown().await.unwrap();
    by_prioritize.svc.shutdown().await.unwrap();
}
