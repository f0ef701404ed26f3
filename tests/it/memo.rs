//! Property: filter and prioritize over many candidates, which decide once per distinct node
//! state (`extender::memo`), answer every node exactly as a request naming that node alone,
//! which decides it afresh (on a state whose memo caches are empty). Clusters are drawn from a
//! few node templates, so most nodes share a state with another and the memo is hit; a few
//! nodes are unique. The same request again is answered wholly from the memo the first one
//! left (the pod shape's), with the same verdicts.
//!
//! Prioritize scores are scaled against the best candidate, so they are checked differently:
//! every memo hit is decided again and compared inside the service in debug builds (which this
//! test binary is), and nodes of one template must get one score. The memo must also be used:
//! `dne_read_decisions_total{how="memo"}` grows.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{Value, json};

use device_numa_extender::extender::input::decode;
use device_numa_extender::model::wire::ExtenderArgsRef;
use device_numa_extender::ops::inspect::load_cluster_file;
use device_numa_extender::scheduler::Scheduler;
use device_numa_extender::scheduler::ScoringConfig;
use device_numa_extender::scheduler::bind::OfflinePodApi;
use device_numa_extender::scheduler::verbs;
use device_numa_extender::sync::file_source::ClusterFile;

use crate::support::service;

/// What a node template holds: GPUs over two NUMA nodes (minors `0..gpus/2` on NUMA 0), whole
/// GPUs held, half of one GPU held, and cores (of 4 per NUMA node) held by cpuset pods.
#[derive(Clone, Debug)]
struct Template {
    gpus: i32,
    whole: Vec<i32>,
    shared: Option<i32>,
    /// Per NUMA node, whole cores held by one LSR pod each.
    cores: [u32; 2],
}

fn template() -> impl Strategy<Value = Template> {
    (
        prop_oneof![Just(2), Just(4)],
        any::<u8>(),
        any::<u8>(),
        0u32..4,
        0u32..4,
    )
        .prop_map(|(gpus, whole_bits, shared, c0, c1)| {
            let whole: Vec<i32> = (0..gpus).filter(|m| whole_bits & (1 << m) != 0).collect();
            let shared = i32::from(shared % 8);
            let shared = (shared < gpus && !whole.contains(&shared)).then_some(shared);
            Template {
                gpus,
                whole,
                shared,
                cores: [c0, c1],
            }
        })
}

impl Template {
    /// The same holdings with the GPUs mirrored across the NUMA nodes (minor `m` becomes
    /// `gpus-1-m`) and the cores kept: the same device sums and CPU state, but the free GPUs on
    /// the other NUMA node, which only an aligned decision can tell apart.
    fn mirrored(&self) -> Template {
        let mirror = |m: i32| self.gpus - 1 - m;
        Template {
            gpus: self.gpus,
            whole: self.whole.iter().map(|&m| mirror(m)).collect(),
            shared: self.shared.map(mirror),
            cores: self.cores,
        }
    }

    /// The same cores held, and every GPU: the same CPU state as this template, with devices
    /// that answer every NUMA mask "no", so a GPU + CPU pod's aligned decision on this CPU
    /// state gets other answers than on the template (`scheduler::shared` must not replay it).
    fn gpus_all_held(&self) -> Template {
        Template {
            gpus: self.gpus,
            whole: (0..self.gpus).collect(),
            shared: None,
            cores: self.cores,
        }
    }
}

/// 2 NUMA nodes × 4 cores × 2 threads; NUMA `n` holds CPUs `8n .. 8n+7`.
fn nrt(name: &str) -> Value {
    let detail: Vec<Value> = (0..16u32)
        .map(|id| json!({"id": id, "core": id / 2, "socket": id / 8, "node": id / 8}))
        .collect();
    let zones: Vec<Value> = (0..2)
        .map(|n| {
            json!({"name": format!("node-{n}"), "type": "Node", "resources": [
                {"name": "cpu", "capacity": "8", "allocatable": "8", "available": "8"},
                {"name": "memory", "capacity": "64Gi", "allocatable": "64Gi", "available": "64Gi"}]})
        })
        .collect();
    json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": name, "annotations": {
            "node.koordinator.sh/cpu-topology": json!({"detail": detail}).to_string()}},
        "topologyPolicies": ["None"],
        "zones": zones,
    })
}

fn node_objects(name: &str, t: &Template) -> (Vec<Value>, Vec<Value>) {
    let mut pods = Vec::new();
    let push = |pods: &mut Vec<Value>, requests: Value, annotations: Value, lsr: bool| {
        let j = pods.len();
        let mut pod = service::pod(
            "team",
            &format!("{name}-p{j}"),
            &format!("uid-{name}-{j}"),
            requests,
            Some(name),
            None,
        );
        pod["metadata"]["annotations"] = annotations;
        if lsr {
            pod["metadata"]["labels"] = json!({"koordinator.sh/qosClass": "LSR"});
        }
        pods.push(pod);
    };
    for &m in &t.whole {
        push(
            &mut pods,
            json!({"nvidia.com/gpu": "1", "cpu": "1"}),
            json!({"scheduling.koordinator.sh/device-allocated": service::whole_gpus(&[m])}),
            false,
        );
    }
    if let Some(m) = t.shared {
        let allocated = json!({"gpu": [{"minor": m, "resources": {
            "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory": "40Gi",
            "koordinator.sh/gpu-memory-ratio": "50"}}]})
        .to_string();
        push(
            &mut pods,
            json!({"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}),
            json!({"scheduling.koordinator.sh/device-allocated": allocated}),
            false,
        );
    }
    for (numa, &cores) in t.cores.iter().enumerate() {
        for core in 0..cores {
            let first = numa as u32 * 8 + core * 2;
            let status = json!({"cpuset": format!("{}-{}", first, first + 1)}).to_string();
            push(
                &mut pods,
                json!({"cpu": "2", "memory": "1Gi"}),
                json!({"scheduling.koordinator.sh/resource-status": status}),
                true,
            );
        }
    }
    let objects = vec![
        service::node(name),
        service::gpu_device(name, t.gpus, t.gpus / 2, &[]),
        nrt(name),
    ];
    (objects, pods)
}

fn state_of(nodes: &[(String, Template)]) -> Scheduler {
    fn typed<T: serde::de::DeserializeOwned>(v: Vec<Value>) -> Vec<T> {
        v.into_iter()
            .map(|o| serde_json::from_value(o).expect("fixture decodes"))
            .collect()
    }
    let (mut n, mut d, mut t, mut p) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (name, template) in nodes {
        let (objects, pods) = node_objects(name, template);
        let mut objects = objects.into_iter();
        n.push(objects.next().unwrap());
        d.push(objects.next().unwrap());
        t.push(objects.next().unwrap());
        p.extend(pods);
    }
    let loaded = load_cluster_file(ClusterFile {
        nodes: typed(n),
        pods: typed(p),
        devices: d,
        topologies: typed(t),
        ..Default::default()
    });
    assert!(loaded.readiness.is_ready());
    loaded.into_scheduler(
        Arc::new(OfflinePodApi::new(Vec::new())),
        ScoringConfig::default(),
    )
}

/// The pending pods the property schedules.
fn pending(case: usize) -> Value {
    let (requests, lsr, single_numa) = match case {
        0 => (
            json!({"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}),
            false,
            false,
        ),
        1 => (json!({"nvidia.com/gpu": "1"}), false, false),
        2 => (json!({"nvidia.com/gpu": "2", "cpu": "2"}), false, false),
        3 => (json!({"cpu": "4", "memory": "2Gi"}), true, false),
        4 => (json!({"nvidia.com/gpu": "1", "cpu": "4"}), true, true),
        _ => (json!({"cpu": "6", "memory": "1Gi"}), true, true),
    };
    let mut pod = service::pending("pending", requests);
    if lsr {
        pod["metadata"]["labels"] = json!({"koordinator.sh/qosClass": "LSR"});
    }
    if single_numa {
        pod["metadata"]["annotations"] = json!({
            "scheduling.koordinator.sh/numa-topology-spec":
                r#"{"numaTopologyPolicy":"SingleNUMANode"}"#
        });
    }
    pod
}

/// Each candidate's filter verdict: `None` when it passes, else its reason (and whether it is
/// unresolvable).
fn filter_verdicts(state: &Scheduler, pod: &Value, names: &[&str]) -> Vec<Option<(String, bool)>> {
    let body = serde_json::to_vec(&service::extender_args(pod, names)).unwrap();
    let args: ExtenderArgsRef = decode(&body).expect("valid body");
    let out = verbs::filter(state, args);
    assert!(out.error.is_empty(), "{}", out.error);
    let passing = out.node_names.unwrap_or_default();
    let failed = out.failed_nodes.unwrap_or_default();
    let unresolvable = out.failed_and_unresolvable_nodes.unwrap_or_default();
    names
        .iter()
        .map(|n| {
            if passing.iter().any(|p| p == n) {
                None
            } else if let Some(r) = failed.get(*n) {
                Some((r.to_string(), false))
            } else {
                let r = unresolvable.get(*n).expect("every candidate is answered");
                Some((r.to_string(), true))
            }
        })
        .collect()
}

fn memo_hits(state: &Scheduler, verb: &str) -> u64 {
    state
        .metrics
        .read_decisions
        .with_label_values(&[verb, "memo"])
        .get()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn many_candidates_get_the_answers_each_gets_alone(
        templates in prop::collection::vec(template(), 1..4),
        unique in prop::collection::vec(template(), 0..3),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 8..24),
        case in 0usize..6,
    ) {
        // Templates, then their mirrors (pairs of states with equal sums), then their CPU
        // twins with every GPU held.
        let drawn: Vec<Template> = templates
            .iter()
            .cloned()
            .chain(templates.iter().map(Template::mirrored))
            .chain(templates.iter().map(Template::gpus_all_held))
            .collect();
        let mut nodes: Vec<(String, Template, usize)> = picks
            .iter()
            .enumerate()
            .map(|(i, pick)| {
                let k = pick.index(drawn.len());
                (format!("node-{i:02}"), drawn[k].clone(), k)
            })
            .collect();
        for (j, t) in unique.into_iter().enumerate() {
            nodes.push((format!("unique-{j}"), t, drawn.len() + j));
        }
        let state = state_of(
            &nodes.iter().map(|(n, t, _)| (n.clone(), t.clone())).collect::<Vec<_>>(),
        );
        let names: Vec<&str> = nodes.iter().map(|(n, _, _)| n.as_str()).collect();
        let pod = pending(case);

        let together = filter_verdicts(&state, &pod, &names);
        for (i, name) in names.iter().enumerate() {
            // Empty memo caches: the node is decided, not recalled from `together`.
            let afresh = Scheduler { memos: Default::default(), ..state.clone() };
            let alone = filter_verdicts(&afresh, &pod, &[name]);
            // A node refused in both answers the same way; its words may carry the pod's terms
            // ("<reason>: <what is missing>") only in the answer where no node passes, the
            // only one kube-scheduler shows (`scheduler::explain`).
            let explained_alike = match (&together[i], &alone[0]) {
                (Some((a, ua)), Some((b, ub))) => {
                    ua == ub
                        && (a == b
                            || b.strip_prefix(a.as_str()).is_some_and(|d| d.starts_with(": "))
                            || a.strip_prefix(b.as_str()).is_some_and(|d| d.starts_with(": ")))
                }
                (a, b) => a == b,
            };
            prop_assert!(
                explained_alike,
                "node {}: {:?} together, {:?} alone",
                name,
                together[i],
                alone[0]
            );
        }
        // The same pod again: every node recalled from the first request, same verdicts.
        let hits_before = memo_hits(&state, "filter");
        prop_assert_eq!(&filter_verdicts(&state, &pod, &names), &together);
        prop_assert_eq!(memo_hits(&state, "filter") - hits_before, names.len() as u64);
        // The gauge shows what the kept memo holds: at least one entry per node state.
        let kept = state.metrics.read_memo_bytes.with_label_values(&["filter"]).get();
        prop_assert_eq!(kept, state.memos.filter.bytes() as i64);
        prop_assert!(kept > 0, "a kept memo holds {} bytes", kept);
        // Nodes of one template share a state, so the memo answered all but one of each.
        let templates_used: std::collections::BTreeSet<usize> =
            nodes.iter().map(|(_, _, k)| *k).collect();
        prop_assert!(
            memo_hits(&state, "filter") >= (nodes.len() - templates_used.len()) as u64,
            "filter memo hits {} over {} nodes of {} templates",
            memo_hits(&state, "filter"), nodes.len(), templates_used.len()
        );

        let body = serde_json::to_vec(&service::extender_args(&pod, &names)).unwrap();
        let scores = verbs::prioritize(&state, decode::<ExtenderArgsRef>(&body).unwrap());
        for (a, (_, _, ka)) in scores.iter().zip(&nodes) {
            for (b, (_, _, kb)) in scores.iter().zip(&nodes) {
                if ka == kb {
                    prop_assert_eq!(a.score, b.score, "{} and {}", a.host, b.host);
                }
            }
        }
    }
}
