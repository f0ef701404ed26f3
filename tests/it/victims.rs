//! The extender's own preemption victims (issue 38 §2, `scheduler::victims`), against a
//! brute-force oracle written from the API objects alone: on a node whose cards are held by
//! half-card-ish share pods of various priorities, kube-scheduler proposes some victims; where
//! they do not free the preemptor's share on one card, the answer must be the fewest pods of lower
//! priority (then the lowest priorities) that free it on one card *and* leave kube-scheduler's
//! CPU fit passing; where they do, kube-scheduler's own.

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
}

fn cluster(holders: &[Holder]) -> String {
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
    for (i, h) in holders.iter().enumerate() {
        let share = h.share.to_string();
        let allocated = json!({"gpu": [{"minor": h.card, "resources": {
            "koordinator.sh/gpu-core": share, "koordinator.sh/gpu-memory-ratio": share}}]});
        items.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("h{i}"), "namespace": "ns", "uid": format!("uid-{i}"),
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

/// Every subset of the lower-priority pods up to four: the best (fewest, then lowest highest
/// priority, then lowest sum) that fits, as (size, max priority, sum).
fn oracle(holders: &[Holder], priority: i32, ask: i64, cpu: i64) -> Option<(usize, i32, i64)> {
    let lower: Vec<usize> = (0..holders.len())
        .filter(|i| holders[*i].priority < priority)
        .collect();
    let mut best: Option<(usize, i32, i64)> = None;
    for mask in 1u32..(1 << lower.len()) {
        let gone: Vec<usize> = (0..lower.len())
            .filter(|b| mask & (1 << b) != 0)
            .map(|b| lower[b])
            .collect();
        if gone.len() > 4 || !fits(holders, &gone, ask, cpu) {
            continue;
        }
        let key = (
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
    (0..CARDS, 20i64..=60, 1i64..=4, 0i32..4).prop_map(|(card, share, cpu, p)| Holder {
        card,
        share,
        cpu_milli: cpu * 1000,
        priority: p * 10,
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
    ) {
        let priority = priority * 10;
        let cpu = cpu * 1000;
        let file = device_numa_extender::sync::file_source::ClusterFile::parse(&cluster(&holders), "c").unwrap();
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
        match (oracle(&holders, priority, ask, cpu), answered) {
            (None, None) => {}
            (Some(best), Some(got)) => {
                let by: BTreeMap<usize, &Holder> = got.iter().map(|i| (*i, &holders[*i])).collect();
                prop_assert_eq!(by.len(), got.len(), "a victim named twice: {:?}", got);
                prop_assert!(by.values().all(|h| h.priority < priority), "a victim of no lower priority: {:?}", got);
                prop_assert!(fits(&holders, &got, ask, cpu), "the answer does not make room: {:?}", got);
                let key = (
                    got.len(),
                    by.values().map(|h| h.priority).max().unwrap_or(0),
                    by.values().map(|h| i64::from(h.priority)).sum(),
                );
                prop_assert_eq!(key, best, "answer {:?} is not the best", got);
            }
            (best, got) => prop_assert!(false, "oracle {:?}, answer {:?}", best, got),
        }
    }
}
