//! Property: whatever sequence of object changes, dropped watches and compactions (forced
//! relists) the service lives through, once things are quiet its cache equals the cache a
//! fresh service bootstraps from the final API state.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::support::service::{
    self, Http, eventually_equal, fresh_snapshot, wait_for_all_watches, whole_gpus,
};
use crate::support::{FakeApiServer, Kind};

const NODES: usize = 4;
const PODS: usize = 8;
const TIMEOUT: Duration = Duration::from_secs(30);
/// A hang guard, not a bound: a relist after a 410 waits out kube's backoff (about a second,
/// more on a loaded machine, and backoffs grow with repeated failures), so convergence is
/// polled for up to a minute. A real failure then costs a minute per shrink step, which
/// `max_shrink_iters` bounds.
const QUIESCENCE: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
enum Annotation {
    None,
    Gpus(Vec<i32>),
    Malformed(&'static str),
}

impl Annotation {
    fn value(&self) -> Value {
        match self {
            Annotation::None => Value::Null,
            Annotation::Gpus(m) => json!(whole_gpus(m)),
            Annotation::Malformed(s) => json!(s),
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    UpsertNode {
        node: usize,
        rev: u8,
    },
    DeleteNode(usize),
    UpsertDevice {
        node: usize,
        gpus: i32,
        unhealthy: Vec<i32>,
    },
    DeleteDevice(usize),
    UpsertNrt {
        node: usize,
        cpus: u8,
    },
    DeleteNrt(usize),
    /// Creates the pod, or deletes and recreates it under a new UID when it exists.
    CreatePod {
        pod: usize,
        node: Option<usize>,
        annotation: Annotation,
    },
    DeletePod(usize),
    Annotate {
        pod: usize,
        annotation: Annotation,
    },
    Terminate {
        pod: usize,
        phase: &'static str,
    },
    Bind {
        pod: usize,
        node: usize,
    },
    CloseWatches,
    CompactAndClose,
    Pause(u64),
}

fn annotation() -> impl Strategy<Value = Annotation> {
    prop_oneof![
        2 => Just(Annotation::None),
        4 => proptest::collection::btree_set(0..8i32, 1..3)
            .prop_map(|m| Annotation::Gpus(m.into_iter().collect())),
        2 => prop_oneof![
            Just("{not json"),
            Just("[]"),
            Just(r#"{"gpu": 3}"#),
            Just(r#"{"gpu":[{"minor":"x"}]}"#),
            Just(""),
            Just("null"),
        ]
        .prop_map(Annotation::Malformed),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let node = 0..NODES;
    let pod = 0..PODS;
    prop_oneof![
        3 => (node.clone(), any::<u8>()).prop_map(|(node, rev)| Op::UpsertNode { node, rev }),
        1 => node.clone().prop_map(Op::DeleteNode),
        3 => (node.clone(), 0..9i32, proptest::collection::vec(0..8i32, 0..2))
            .prop_map(|(node, gpus, unhealthy)| Op::UpsertDevice { node, gpus, unhealthy }),
        1 => node.clone().prop_map(Op::DeleteDevice),
        2 => (node.clone(), 1..16u8).prop_map(|(node, cpus)| Op::UpsertNrt { node, cpus }),
        1 => node.clone().prop_map(Op::DeleteNrt),
        5 => (pod.clone(), proptest::option::weighted(0.8, node.clone()), annotation())
            .prop_map(|(pod, node, annotation)| Op::CreatePod { pod, node, annotation }),
        2 => pod.clone().prop_map(Op::DeletePod),
        3 => (pod.clone(), annotation()).prop_map(|(pod, annotation)| Op::Annotate { pod, annotation }),
        2 => (pod.clone(), prop_oneof![Just("Succeeded"), Just("Failed")])
            .prop_map(|(pod, phase)| Op::Terminate { pod, phase }),
        2 => (pod, node).prop_map(|(pod, node)| Op::Bind { pod, node }),
        1 => Just(Op::CloseWatches),
        1 => Just(Op::CompactAndClose),
        2 => (0..30u64).prop_map(Op::Pause),
    ]
}

fn node_name(i: usize) -> String {
    format!("n{i}")
}

fn pod_name(i: usize) -> String {
    format!("p{i}")
}

/// Applies one change to the fake. Changes that do not apply to the current state (deleting
/// what is not there, binding a bound pod) are API errors a real client would see too, and are
/// skipped.
async fn apply(fake: &FakeApiServer, op: &Op, uid_seq: &mut u32) {
    match op {
        Op::UpsertNode { node, rev } => {
            let mut n = service::node(&node_name(*node));
            n["metadata"]["labels"]["rev"] = json!(rev.to_string());
            if fake.replace(Kind::Node, n.clone()).is_err() {
                fake.create(Kind::Node, n).unwrap();
            }
        }
        Op::DeleteNode(node) => {
            let _ = fake.delete(Kind::Node, "", &node_name(*node));
        }
        Op::UpsertDevice {
            node,
            gpus,
            unhealthy,
        } => {
            let d = service::gpu_device(&node_name(*node), *gpus, 4, unhealthy);
            if fake.replace(Kind::Device, d.clone()).is_err() {
                fake.create(Kind::Device, d).unwrap();
            }
        }
        Op::DeleteDevice(node) => {
            let _ = fake.delete(Kind::Device, "", &node_name(*node));
        }
        Op::UpsertNrt { node, cpus } => {
            let mut t = service::nrt(&node_name(*node));
            t["zones"][0]["resources"][0]["capacity"] = json!(cpus.to_string());
            if fake.replace(Kind::NodeResourceTopology, t.clone()).is_err() {
                fake.create(Kind::NodeResourceTopology, t).unwrap();
            }
        }
        Op::DeleteNrt(node) => {
            let _ = fake.delete(Kind::NodeResourceTopology, "", &node_name(*node));
        }
        Op::CreatePod {
            pod,
            node,
            annotation,
        } => {
            let name = pod_name(*pod);
            let _ = fake.delete(Kind::Pod, "default", &name);
            *uid_seq += 1;
            let mut p = service::pod(
                "default",
                &name,
                &format!("uid-{name}-{uid_seq}"),
                json!({"nvidia.com/gpu": "1"}),
                node.map(node_name).as_deref(),
                None,
            );
            let ann = annotation.value();
            if !ann.is_null() {
                p["metadata"]["annotations"] =
                    json!({"scheduling.koordinator.sh/device-allocated": ann});
            }
            fake.create(Kind::Pod, p).unwrap();
        }
        Op::DeletePod(pod) => {
            let _ = fake.delete(Kind::Pod, "default", &pod_name(*pod));
        }
        Op::Annotate { pod, annotation } => {
            let _ = fake.patch_merge(
                Kind::Pod,
                "default",
                &pod_name(*pod),
                json!({"metadata": {"annotations": {
                    "scheduling.koordinator.sh/device-allocated": annotation.value()}}}),
            );
        }
        Op::Terminate { pod, phase } => {
            let _ = fake.set_pod_phase("default", &pod_name(*pod), phase);
        }
        Op::Bind { pod, node } => {
            let _ = fake.bind_pod("default", &pod_name(*pod), &node_name(*node));
        }
        Op::CloseWatches => fake.close_watches(),
        Op::CompactAndClose => {
            fake.compact();
            fake.close_watches();
        }
        Op::Pause(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
    }
}

async fn run_case(setup: Vec<Op>, live: Vec<Op>) {
    let fake = FakeApiServer::new();
    let mut uid_seq = 0;
    for op in &setup {
        apply(&fake, op, &mut uid_seq).await;
    }
    let svc = service::start(&fake, &[]).await;
    Http::new(svc.addr).wait_ready(TIMEOUT).await;
    wait_for_all_watches(&fake, TIMEOUT).await;
    for op in &live {
        apply(&fake, op, &mut uid_seq).await;
    }
    let want = fresh_snapshot(&fake, &[]).await;
    eventually_equal(&svc.state.scheduler.cluster, &want, QUIESCENCE).await;
    // The read snapshot, built at bootstrap and published to by every live event and relist
    // since, equals one rebuilt from the caches now.
    assert_eq!(svc.state.scheduler.cluster.check_snapshot(), Ok(()));
    svc.shutdown().await.unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 16,
        // Every case runs two services, and a failing one waits out QUIESCENCE: keep
        // shrinking bounded.
        max_shrink_iters: 12,
        ..ProptestConfig::default()
    })]

    #[test]
    fn cache_after_any_history_equals_a_fresh_bootstrap(
        setup in proptest::collection::vec(op(), 0..25),
        live in proptest::collection::vec(op(), 1..60),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run_case(setup, live));
    }
}
