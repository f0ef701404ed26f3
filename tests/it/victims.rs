//! The extender's own preemption victims (issue 38 §2, `scheduler::victims`), against a
//! brute-force oracle written from the API objects alone: on a node whose cards are held by
//! half-card-ish share pods of various priorities, kube-scheduler proposes some victims; where
//! they do not free the preemptor's share on one card, the answer must be the fewest pods of lower
//! priority (then the lowest priorities) that free it on one card *and* leave kube-scheduler's
//! CPU fit passing; where they do, kube-scheduler's own. PodDisruptionBudgets cover some holders
//! (one label group each, a number of disruptions allowed per group): the answer must violate the
//! fewest first, and carry that count as `NumPDBViolations`.

use std::collections::BTreeMap;

use device_numa_extender::model::wire::ExtenderPreemptionArgs;
use device_numa_extender::scheduler::{ScoringConfig, verbs};
use proptest::prelude::*;
use serde_json::{Value, json};

const CARDS: usize = 3;
const NODE_CPU_MILLI: i64 = 16_000;

/// A pod on the node: its card, its share of that card (hundredths), its CPU and priority.
#[derive(Clone, Debug)]
struct Holder {
    card: usize,
    share: i64,
    cpu_milli: i64,
    priority: i32,
    /// The label group (`app: g<n>`) a budget may cover; `None`: unlabeled.
    group: Option<usize>,
}

/// Label groups, and disruptions each group's budget allows (`None`: no budget for it).
const GROUPS: usize = 3;

fn cluster(holders: &[Holder], budgets: &[Option<i32>]) -> String {
    let devices: Vec<Value> = (0..CARDS)
        .map(|m| {
            json!({"type": "gpu", "id": format!("GPU-{m}"), "minor": m, "health": true,
            "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
                "koordinator.sh/gpu-memory-ratio": "100"}})
        })
        .collect();
    let mut items = vec![
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": format!("{NODE_CPU_MILLI}m"), "memory": "256Gi", "pods": "110"}}}),
        json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
            "metadata": {"name": "n"}, "spec": {"devices": devices}}),
    ];
    for (g, allowed) in budgets.iter().enumerate() {
        if let Some(allowed) = allowed {
            items.push(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": format!("g{g}"), "namespace": "ns"},
                "spec": {"selector": {"matchLabels": {"app": format!("g{g}")}}},
                "status": {"disruptionsAllowed": allowed, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}}));
        }
    }
    for (i, h) in holders.iter().enumerate() {
        let share = h.share.to_string();
        let allocated = json!({"gpu": [{"minor": h.card, "resources": {
            "koordinator.sh/gpu-core": share, "koordinator.sh/gpu-memory-ratio": share}}]});
        items.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("h{i}"), "namespace": "ns", "uid": format!("uid-{i}"),
                "labels": h.group.map(|g| json!({"app": format!("g{g}")})).unwrap_or(json!({})),
                "annotations": {"scheduling.koordinator.sh/device-allocated": allocated.to_string()}},
            "spec": {"nodeName": "n", "priority": h.priority, "containers": [{"name": "c", "resources": {"requests": {
                "cpu": format!("{}m", h.cpu_milli), "koordinator.sh/gpu-core": share.clone(),
                "koordinator.sh/gpu-memory-ratio": share}}}]},
            "status": {"phase": "Running"}}));
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// Whether the preemptor (a share of `ask` on one card, `cpu` millicores) fits once `gone` are
/// removed: some card's held shares leave `ask` free, and the node's CPU requests leave `cpu`.
fn fits(holders: &[Holder], gone: &[usize], ask: i64, cpu: i64) -> bool {
    let stays = |i: &usize| !gone.contains(i);
    let card_ok = (0..CARDS).any(|c| {
        let held: i64 = (0..holders.len())
            .filter(stays)
            .filter(|i| holders[*i].card == c)
            .map(|i| holders[i].share)
            .sum();
        100 - held >= ask
    });
    let used: i64 = (0..holders.len())
        .filter(stays)
        .map(|i| holders[i].cpu_milli)
        .sum();
    card_ok && used + cpu <= NODE_CPU_MILLI
}

/// The budgets `gone` violates: per covered group, the pods beyond what its budget allows.
fn violations(holders: &[Holder], budgets: &[Option<i32>], gone: &[usize]) -> usize {
    (0..GROUPS)
        .map(|g| {
            let Some(allowed) = budgets[g] else { return 0 };
            let taken = gone
                .iter()
                .filter(|i| holders[**i].group == Some(g))
                .count() as i32;
            (taken - allowed).max(0) as usize
        })
        .sum()
}

/// Every subset of the lower-priority pods up to four: the best (fewest budget violations, then
/// fewest pods, then lowest highest priority, then lowest sum) that fits, as (violations, size,
/// max priority, sum).
fn oracle(
    holders: &[Holder],
    budgets: &[Option<i32>],
    priority: i32,
    ask: i64,
    cpu: i64,
) -> Option<(usize, usize, i32, i64)> {
    let lower: Vec<usize> = (0..holders.len())
        .filter(|i| holders[*i].priority < priority)
        .collect();
    let mut best: Option<(usize, usize, i32, i64)> = None;
    for mask in 1u32..(1 << lower.len()) {
        let gone: Vec<usize> = (0..lower.len())
            .filter(|b| mask & (1 << b) != 0)
            .map(|b| lower[b])
            .collect();
        if gone.len() > 4 || !fits(holders, &gone, ask, cpu) {
            continue;
        }
        let key = (
            violations(holders, budgets, &gone),
            gone.len(),
            gone.iter().map(|i| holders[*i].priority).max().unwrap_or(0),
            gone.iter().map(|i| i64::from(holders[*i].priority)).sum(),
        );
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    }
    best
}

fn holder() -> impl Strategy<Value = Holder> {
    (
        0..CARDS,
        20i64..=60,
        1i64..=4,
        0i32..4,
        proptest::option::of(0..GROUPS),
    )
        .prop_map(|(card, share, cpu, p, group)| Holder {
            card,
            share,
            cpu_milli: cpu * 1000,
            priority: p * 10,
            group,
        })
}

/// Holders whose shares fit their cards (at most 100 per card).
fn holders() -> impl Strategy<Value = Vec<Holder>> {
    proptest::collection::vec(holder(), 3..=10).prop_map(|hs| {
        let mut per_card = [0i64; CARDS];
        hs.into_iter()
            .filter(|h| {
                let ok = per_card[h.card] + h.share <= 100;
                if ok {
                    per_card[h.card] += h.share;
                }
                ok
            })
            .collect()
    })
}

proptest! {
    // Many draws need no preemption at all (a card already has the share free): rejected.
    #![proptest_config(ProptestConfig { max_global_rejects: 20_000, ..ProptestConfig::with_cases(128) })]

    #[test]
    fn preempt_answers_the_fewest_lowest_victims_that_free_one_card(
        holders in holders(),
        ask in 40i64..=100,
        cpu in 1i64..=8,
        priority in 1i32..=4,
        kube_order in proptest::collection::vec(any::<u16>(), 10),
        budgets in proptest::collection::vec(proptest::option::of(0i32..=1), GROUPS),
    ) {
        let priority = priority * 10;
        let cpu = cpu * 1000;
        let file = device_numa_extender::sync::file_source::ClusterFile::parse(&cluster(&holders, &budgets), "c").unwrap();
        let api = std::sync::Arc::new(device_numa_extender::scheduler::bind::OfflinePodApi::new(file.pods.clone()));
        let state = device_numa_extender::ops::inspect::load_cluster_file(file)
            .into_scheduler(api, ScoringConfig::default());
        // kube-scheduler's proposal, by node totals: lower-priority pods in some order until
        // the freed shares add up to the ask and its CPU fit passes (it never proposes pods of
        // no lower priority, nor a set after which its own resource fit fails). Often spread
        // over cards: the case the extender must mend.
        let mut lower: Vec<usize> = (0..holders.len()).filter(|i| holders[*i].priority < priority).collect();
        lower.sort_by_key(|i| kube_order[*i]);
        let used: i64 = holders.iter().map(|h| h.cpu_milli).sum();
        let free_total: i64 = (CARDS as i64) * 100 - holders.iter().map(|h| h.share).sum::<i64>();
        let mut proposed = Vec::new();
        let (mut freed_share, mut freed_cpu) = (0, 0);
        for i in lower {
            if free_total + freed_share >= ask && used - freed_cpu + cpu <= NODE_CPU_MILLI {
                break;
            }
            proposed.push(i);
            freed_share += holders[i].share;
            freed_cpu += holders[i].cpu_milli;
        }
        prop_assume!(!proposed.is_empty());
        prop_assume!(free_total + freed_share >= ask && used - freed_cpu + cpu <= NODE_CPU_MILLI);
        proposed.sort_unstable();
        let share = ask.to_string();
        let args: ExtenderPreemptionArgs = serde_json::from_value(json!({
            "Pod": {"metadata": {"name": "hi", "namespace": "ns", "uid": "uid-hi"},
                "spec": {"priority": priority, "containers": [{"name": "c", "resources": {"requests": {
                    "cpu": format!("{cpu}m"), "koordinator.sh/gpu-core": share.clone(),
                    "koordinator.sh/gpu-memory-ratio": share}}}]}},
            "NodeNameToMetaVictims": {"n": {"Pods": proposed.iter().map(|i| json!({"UID": format!("uid-{i}")})).collect::<Vec<_>>(),
                "NumPDBViolations": 0}},
        })).unwrap();
        let out = serde_json::to_value(verbs::preempt(&state, args)).unwrap();
        let answered_violations = out["NodeNameToMetaVictims"]["n"]["NumPDBViolations"].as_u64();
        let answered: Option<Vec<usize>> = out["NodeNameToMetaVictims"]["n"]["Pods"].as_array().map(|pods| {
            pods.iter()
                .map(|p| p["UID"].as_str().unwrap().trim_start_matches("uid-").parse().unwrap())
                .collect()
        });
        if fits(&holders, &proposed, ask, cpu) {
            // kube-scheduler's victims work: kept as they are.
            let mut got = answered.expect("the node is kept");
            got.sort_unstable();
            prop_assert_eq!(got, proposed);
            return Ok(());
        }
        match (oracle(&holders, &budgets, priority, ask, cpu), answered) {
            (None, None) => {}
            (Some(best), Some(got)) => {
                let by: BTreeMap<usize, &Holder> = got.iter().map(|i| (*i, &holders[*i])).collect();
                prop_assert_eq!(by.len(), got.len(), "a victim named twice: {:?}", got);
                prop_assert!(by.values().all(|h| h.priority < priority), "a victim of no lower priority: {:?}", got);
                prop_assert!(fits(&holders, &got, ask, cpu), "the answer does not make room: {:?}", got);
                let key = (
                    violations(&holders, &budgets, &got),
                    got.len(),
                    by.values().map(|h| h.priority).max().unwrap_or(0),
                    by.values().map(|h| i64::from(h.priority)).sum(),
                );
                prop_assert_eq!(key, best, "answer {:?} is not the best", got);
                prop_assert_eq!(answered_violations, Some(key.0 as u64), "the answer's count");
            }
            (best, got) => prop_assert!(false, "oracle {:?}, answer {:?}", best, got),
        }
    }
}

/// The live path: budgets come from the PDB watch (policy/v1), and a change to one changes the
/// next answer. kube-scheduler proposes a victim that does not free half a card; either 60 %
/// holder would, and the one a budget protects is avoided (without budgets the tie goes to the
/// lower UID, the protected one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempt_avoids_a_victim_a_disruption_budget_protects() {
    use crate::support::service::{self, Http};
    use crate::support::{FakeApiServer, Kind};
    use std::time::Duration;
    const TIMEOUT: Duration = Duration::from_secs(30);

    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n", 2, &[]);
    let holder = |name: &str, minor: i32, share: i64, app: &str| {
        let s = share.to_string();
        let allocated = json!({"gpu": [{"minor": minor, "resources": {
            "koordinator.sh/gpu-core": s, "koordinator.sh/gpu-memory-ratio": s}}]});
        let mut p = service::pod(
            "ml",
            name,
            &format!("uid-{name}"),
            json!({"koordinator.sh/gpu-core": s, "koordinator.sh/gpu-memory-ratio": s}),
            Some("n"),
            Some(&allocated.to_string()),
        );
        p["metadata"]["labels"] = json!({"app": app});
        p["spec"]["priority"] = json!(0);
        p
    };
    // Card 0: `a` (60, protected); card 1: `b` (60, unprotected) and `c` (30).
    for p in [
        holder("a", 0, 60, "protected"),
        holder("b", 1, 60, "free"),
        holder("c", 1, 30, "free"),
    ] {
        fake.create(Kind::Pod, p).unwrap();
    }
    let pdb = |allowed: i32| {
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "protected", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "protected"}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}})
    };
    fake.create(Kind::PodDisruptionBudget, pdb(0)).unwrap();
    let svc = service::start(&fake, &[]).await;
    let http = Http::new(svc.addr);
    let ready = http.wait_ready(TIMEOUT).await;
    assert_eq!(
        ready["kinds"]["poddisruptionbudgets"]["cached"], 1,
        "{ready}"
    );
    let mut preemptor = service::pending(
        "hi",
        json!({"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}),
    );
    preemptor["spec"]["priority"] = json!(100);
    // kube-scheduler's proposal: `c` alone, which leaves 40 free on card 1: no room for 50.
    let args = json!({"Pod": preemptor,
        "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "uid-c"}], "NumPDBViolations": 0}}});
    let answer = |out: &Value| {
        let v = &out["NodeNameToMetaVictims"]["n"];
        let pods: Vec<String> = v["Pods"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|p| p["UID"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default();
        (pods, v["NumPDBViolations"].as_i64())
    };
    let (_, out) = http.post("/preempt", &args).await;
    assert_eq!(answer(&out), (vec!["uid-b".to_string()], Some(0)), "{out}");

    // Now `b` is protected too (allowed 0) and `a`'s budget allows one: `a` is the one.
    let mut b = fake.get(Kind::Pod, "ml", "b").unwrap();
    b["metadata"]["labels"] = json!({"app": "also-protected"});
    fake.replace(Kind::Pod, b).unwrap();
    let mut second = pdb(0);
    second["metadata"]["name"] = json!("also");
    second["spec"]["selector"]["matchLabels"]["app"] = json!("also-protected");
    fake.create(Kind::PodDisruptionBudget, second).unwrap();
    let mut loosened = fake
        .get(Kind::PodDisruptionBudget, "ml", "protected")
        .unwrap();
    loosened["status"]["disruptionsAllowed"] = json!(1);
    fake.replace(Kind::PodDisruptionBudget, loosened).unwrap();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let (_, out) = http.post("/preempt", &args).await;
        if answer(&out) == (vec!["uid-a".to_string()], Some(0)) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{out}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Both protected, no allowance left anywhere: still one victim, and the answer says it
    // violates a budget.
    let mut tight = fake
        .get(Kind::PodDisruptionBudget, "ml", "protected")
        .unwrap();
    tight["status"]["disruptionsAllowed"] = json!(0);
    fake.replace(Kind::PodDisruptionBudget, tight).unwrap();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let (_, out) = http.post("/preempt", &args).await;
        let (pods, violations) = answer(&out);
        if violations == Some(1) {
            assert_eq!(pods.len(), 1, "{out}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{out}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
