//! Concurrent binds onto one node never over-allocate (DESIGN §3: decide and record under the
//! node write lock), with and without pods going away while the binds run.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;

use super::*;
use crate::support::service;

/// Polls the in-process cache while binds run and remembers the first over-allocation and
/// the largest number of entries seen on `node`.
struct Monitor {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(Option<String>, usize)>,
}

impl Monitor {
    fn start(env: &Env, node: &'static str) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let cluster = env.svc.state.scheduler.cluster.clone();
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut violation = None;
            let mut max_entries = 0;
            loop {
                let done = flag.load(Ordering::SeqCst);
                if let Some(n) = cluster.debug_dump().get(node) {
                    let view = &n["devices"];
                    max_entries =
                        max_entries.max(view["entries"].as_object().map_or(0, |e| e.len()));
                    if violation.is_none()
                        && let Err(e) = check_capacity(view)
                    {
                        violation = Some(e);
                    }
                }
                if done {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (violation, max_entries)
        });
        Monitor { stop, task }
    }

    async fn finish(self) -> (Option<String>, usize) {
        self.stop.store(true, Ordering::SeqCst);
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("monitor stops")
            .expect("monitor does not panic")
    }
}

/// Fires one bind per pod at once; returns each pod's result, in pod order.
async fn bind_all(env: &Env, pods: &[Value], node: &str) -> Vec<Result<(), String>> {
    let handles: Vec<_> = pods
        .iter()
        .map(|p| {
            let http = env.http.clone();
            let p = p.clone();
            let node = node.to_string();
            tokio::spawn(async move { bind(&http, &p, &node).await })
        })
        .collect();
    let joined = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(handles))
        .await
        .expect("64 binds finish within 60 s");
    joined.into_iter().map(|r| r.expect("bind task")).collect()
}

async fn burst(requests: Value, expect_bound: usize, max_pods_per_gpu: usize) {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 8, &[]);
    let pods: Vec<Value> = (0..64)
        .map(|i| pending(&format!("p{i:02}"), requests.clone()))
        .collect();
    fake.create_many(Kind::Pod, pods.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;
    let monitor = Monitor::start(&env, "n1");

    let results = bind_all(&env, &pods, "n1").await;

    let mut bound = Vec::new();
    for (pod, result) in pods.iter().zip(&results) {
        match result {
            Ok(()) => {
                assert_eq!(node_of(&fake, pod).as_deref(), Some("n1"));
                bound.push(pod.clone());
            }
            Err(e) => {
                assert!(
                    e.contains("cannot place"),
                    "{}: unexpected error {e}",
                    name(pod)
                );
                assert_eq!(
                    node_of(&fake, pod),
                    None,
                    "{} failed but is bound",
                    name(pod)
                );
                assert_eq!(
                    annotation_of(&fake, pod),
                    None,
                    "{} failed but annotated",
                    name(pod)
                );
            }
        }
    }
    assert_eq!(bound.len(), expect_bound, "{results:?}");

    // What the API server holds: every bound pod one GPU, no GPU over its share.
    let mut per_minor: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for pod in &bound {
        let a = annotation_of(&fake, pod).expect("bound pods carry the allocation");
        let shares = gpu_shares(&a);
        assert_eq!(shares.len(), 1, "{a}");
        per_minor.entry(shares[0].0).or_default().push(shares[0].1);
    }
    for (minor, shares) in &per_minor {
        assert!(
            shares.len() <= max_pods_per_gpu,
            "minor {minor}: {shares:?}"
        );
        assert!(
            shares.iter().sum::<i64>() <= 100,
            "minor {minor}: {shares:?}"
        );
    }
    assert_eq!(per_minor.len(), 8, "all 8 GPUs used: {per_minor:?}");

    // The ledger: exactly the bound pods, committed once the watch catches up.
    for pod in &bound {
        env.wait_committed("n1", &uid(pod)).await;
    }
    let view = env.ledger("n1").await;
    let entries: BTreeSet<&str> = view["entries"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let want: Vec<String> = bound.iter().map(uid).collect();
    let want: BTreeSet<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(entries, want);
    check_capacity(&view).unwrap();
    let (violation, max_entries) = monitor.finish().await;
    assert_eq!(violation, None, "over-allocation observed during the burst");
    assert!(
        max_entries <= expect_bound,
        "{max_entries} entries at some point"
    );
    assert_eq!(
        env.metric("dne_binds_total", "outcome=\"bound\"").await,
        expect_bound as f64
    );
    env.svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_whole_gpu_binds_on_eight_gpus_bind_exactly_eight() {
    burst(whole_gpus(1), 8, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_shared_binds_put_at_most_three_thirty_percent_pods_per_gpu() {
    burst(ratio(30), 24, 3).await;
}

/// Binds race with pods being deleted and finishing. At quiescence the ledger holds exactly the
/// bound, non-terminal pods, nothing is over capacity, and it equals a fresh bootstrap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binds_racing_deletes_and_completions_converge_to_a_fresh_bootstrap() {
    let fake = FakeApiServer::new();
    add_gpu_node(&fake, "n1", 8, &[]);
    let mut pods: Vec<Value> = (0..48)
        .map(|i| pending(&format!("s{i:02}"), ratio(30)))
        .collect();
    pods.extend((0..16).map(|i| pending(&format!("w{i:02}"), whole_gpus(1))));
    fake.create_many(Kind::Pod, pods.clone()).unwrap();
    let env = Env::start(&fake, &[]).await;
    let monitor = Monitor::start(&env, "n1");

    // Churn: as pods get bound, delete every other one and mark the rest Succeeded (the pod
    // watch sees both as DELETED), and delete a few pending pods mid-flight too.
    let done = Arc::new(AtomicBool::new(false));
    let churn = {
        let fake = fake.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut touched = BTreeSet::new();
            let mut n = 0usize;
            while !done.load(Ordering::SeqCst) {
                for p in fake.list(Kind::Pod) {
                    let name = p["metadata"]["name"].as_str().unwrap().to_string();
                    if touched.contains(&name) || touched.len() >= 30 {
                        continue;
                    }
                    let bound = p["spec"]["nodeName"].is_string();
                    n += 1;
                    if bound && n.is_multiple_of(2) {
                        let _ = fake.delete(Kind::Pod, "ml", &name);
                    } else if bound {
                        let _ = fake.set_pod_phase("ml", &name, "Succeeded");
                    } else if n.is_multiple_of(7) {
                        let _ = fake.delete(Kind::Pod, "ml", &name);
                    } else {
                        continue;
                    }
                    touched.insert(name);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            touched.len()
        })
    };

    // Two rounds, so binds after the churn freed capacity land too.
    let first = bind_all(&env, &pods, "n1").await;
    let retry: Vec<Value> = pods
        .iter()
        .zip(&first)
        .filter(|(p, r)| r.is_err() && fake.get(Kind::Pod, "ml", &name(p)).is_some())
        .map(|(p, _)| p.clone())
        .collect();
    let second = bind_all(&env, &retry, "n1").await;
    done.store(true, Ordering::SeqCst);
    let touched = tokio::time::timeout(WAIT, churn).await.unwrap().unwrap();
    assert!(touched > 0, "the churn never ran");
    let bound_total = first.iter().chain(&second).filter(|r| r.is_ok()).count();
    assert!(
        bound_total > 8,
        "churn should have let more than 8 pods bind: {bound_total}"
    );

    // What should be held: bound, non-terminal pods in the API server, with their annotation.
    let expected = || -> BTreeMap<String, String> {
        fake.list(Kind::Pod)
            .into_iter()
            .filter(|p| p["spec"]["nodeName"] == "n1" && p["status"]["phase"] != "Succeeded")
            .map(|p| {
                let a = p["metadata"]["annotations"][DEVICE_ALLOCATED]
                    .as_str()
                    .expect("bound by us, so annotated")
                    .to_string();
                (p["metadata"]["uid"].as_str().unwrap().to_string(), a)
            })
            .collect()
    };
    let want = expected();
    let mut per_minor: BTreeMap<i64, i64> = BTreeMap::new();
    for a in want.values() {
        for (m, r) in gpu_shares(a) {
            *per_minor.entry(m).or_default() += r;
        }
    }
    assert!(
        per_minor.values().all(|r| *r <= 100),
        "API state over capacity: {per_minor:?}"
    );

    let cluster = env.svc.state.scheduler.cluster.clone();
    let held = || -> BTreeMap<String, String> {
        cluster.debug_dump()["n1"]["devices"]["entries"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, e)| e["state"] == "committed")
            .map(|(u, e)| {
                (
                    u.clone(),
                    e["allocation"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    };
    service::eventually(
        WAIT,
        "the ledger to hold exactly the live bound pods",
        || {
            held() == want
                && cluster.debug_dump()["n1"]["devices"]["entries"]
                    .as_object()
                    .unwrap()
                    .len()
                    == want.len()
        },
    )
    .await;
    let (violation, _) = monitor.finish().await;
    assert_eq!(violation, None, "over-allocation observed during the churn");

    let fresh = Env::start(&fake, &[]).await;
    let old = without_timings(env.svc.state.scheduler.cluster.debug_dump()["n1"].clone());
    let new = without_timings(fresh.svc.state.scheduler.cluster.debug_dump()["n1"].clone());
    assert_eq!(old, new, "the live cache drifted from a fresh bootstrap");
    check_capacity(&new["devices"]).unwrap();
    fresh.svc.shutdown().await.unwrap();
    env.svc.shutdown().await.unwrap();
}
