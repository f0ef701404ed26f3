//! Leader election / HA: two replicas against one fake API server. Exactly one serves binds,
//! standbys keep synced caches, failover (graceful, partition, SIGKILL) hands over within the
//! lease timing, and no GPU is allocated twice across a failover. Follow mode only reads the
//! scheduler's Lease. Durations are short (lease 2 s, renew deadline 1 s, retry 100 ms).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use device_numa_extender::api_calls::LEADER_ELECTION_API_CALLS;
use device_numa_extender::app::Service;
use serde_json::{Value, json};

use crate::support::service::{self, Faults, Http, Link};
use crate::support::{FakeApiServer, Kind};

const LEASE: Duration = Duration::from_secs(2);
const RENEW_DEADLINE: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_millis(100);
const GPUS: i32 = 4;

fn elect_flags(identity: &str) -> Vec<String> {
    [
        "--leader-elect",
        "--leader-elect-identity",
        identity,
        "--leader-elect-lease-duration",
        "2s",
        "--leader-elect-renew-deadline",
        "1s",
        "--leader-elect-retry-period",
        "100ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// One node with `GPUS` GPUs and `pods` pending one-GPU pods `p0..`.
fn cluster(pods: usize) -> (FakeApiServer, Vec<Value>) {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, service::node("n1")).unwrap();
    fake.create(Kind::Device, service::gpu_device("n1", GPUS, 2, &[]))
        .unwrap();
    fake.create(Kind::NodeResourceTopology, service::nrt("n1"))
        .unwrap();
    let pending: Vec<Value> = (0..pods)
        .map(|i| {
            let p = service::pod(
                "ml",
                &format!("p{i}"),
                &format!("uid-p{i}"),
                json!({"nvidia.com/gpu": "1"}),
                None,
                None,
            );
            fake.create(Kind::Pod, p.clone()).unwrap();
            p
        })
        .collect();
    (fake, pending)
}

// ---- observations ---------------------------------------------------------------------------

async fn ready(http: &Http) -> bool {
    http.ready_status().await == Some(200)
}

/// Waits until exactly one of `https` is ready; returns its index.
async fn wait_one_leader(https: &[&Http], timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let mut leaders = Vec::new();
        for (i, h) in https.iter().enumerate() {
            if ready(h).await {
                leaders.push(i);
            }
        }
        assert!(
            leaders.len() <= 1,
            "two replicas ready at once: {leaders:?}"
        );
        if let [one] = leaders[..] {
            return one;
        }
        assert!(Instant::now() < deadline, "no leader after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long until `http` answers `/readyz` 200, polling every 10 ms; panics after `limit`.
async fn time_to_ready(http: &Http, limit: Duration) -> Duration {
    let start = Instant::now();
    while !ready(http).await {
        assert!(start.elapsed() < limit, "standby not ready after {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

/// The GPU minors named by every pod's device-allocated annotation, per node.
fn allocated_minors(fake: &FakeApiServer) -> BTreeMap<String, Vec<(String, i64)>> {
    let mut out: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    for pod in fake.list(Kind::Pod) {
        let Some(a) =
            pod["metadata"]["annotations"]["scheduling.koordinator.sh/device-allocated"].as_str()
        else {
            continue;
        };
        let name = pod["metadata"]["name"].as_str().unwrap().to_string();
        let parsed: Value = serde_json::from_str(a).unwrap();
        for d in parsed["gpu"].as_array().into_iter().flatten() {
            out.entry(name.clone())
                .or_default()
                .push(("gpu".into(), d["minor"].as_i64().unwrap()));
        }
    }
    out
}

/// No GPU minor appears in two pods' annotations, and bound pods never exceed the GPUs.
fn assert_no_double_allocation(fake: &FakeApiServer) -> usize {
    let minors = allocated_minors(fake);
    let mut seen: BTreeMap<i64, String> = BTreeMap::new();
    for (pod, list) in &minors {
        for (_, m) in list {
            if let Some(other) = seen.insert(*m, pod.clone()) {
                panic!("GPU minor {m} allocated to both {other} and {pod}: {minors:?}");
            }
        }
    }
    let bound: Vec<Value> = fake
        .list(Kind::Pod)
        .into_iter()
        .filter(|p| p["spec"]["nodeName"].is_string())
        .collect();
    assert!(
        bound.len() <= GPUS as usize,
        "{} one-GPU pods bound on {GPUS} GPUs",
        bound.len()
    );
    for p in &bound {
        let name = p["metadata"]["name"].as_str().unwrap();
        assert!(
            minors.contains_key(name),
            "{name} bound without a device annotation"
        );
    }
    bound.len()
}

/// Every lease request is covered by the leader-election RBAC table.
fn assert_lease_rbac(fake: &FakeApiServer) {
    let lease_calls: Vec<_> = fake
        .rbac_requests()
        .into_iter()
        .filter(|r| r.resource.starts_with("leases"))
        .collect();
    assert!(!lease_calls.is_empty(), "no lease requests recorded");
    for r in &lease_calls {
        assert!(
            LEADER_ELECTION_API_CALLS.iter().any(|c| c.group == r.group
                && c.resource == r.resource
                && c.verbs.contains(&r.verb.as_str())),
            "lease request {r:?} is not in LEADER_ELECTION_API_CALLS"
        );
    }
}

fn bind_error(resp: &Result<(u16, Value), String>) -> Option<String> {
    match resp {
        Ok((200, v)) if v["Error"] == "" => None,
        Ok((_, v)) => Some(v["Error"].as_str().unwrap_or(&v.to_string()).to_string()),
        Err(e) => Some(e.clone()),
    }
}

// ---- tests ----------------------------------------------------------------------------------

#[tokio::test]
async fn exactly_one_replica_is_ready_and_binds_while_standby_stays_synced() {
    let (fake, pods) = cluster(2);
    let a = service::start(&fake, &as_strs(&elect_flags("a"))).await;
    let b = service::start(&fake, &as_strs(&elect_flags("b"))).await;
    let (ha, hb) = (Http::new(a.addr), Http::new(b.addr));
    let leader = wait_one_leader(&[&ha, &hb], Duration::from_secs(10)).await;
    let (lh, sh) = if leader == 0 { (&ha, &hb) } else { (&hb, &ha) };
    let holder = fake
        .get(Kind::Lease, "default", "device-numa-extender")
        .unwrap();
    assert_eq!(
        holder["spec"]["holderIdentity"],
        if leader == 0 { "a" } else { "b" }
    );

    // The standby: 503, and "not the leader" is the only reason (its caches are synced).
    let (status, report) = sh.get("/readyz").await;
    assert_eq!(status, 503, "{report}");
    assert_eq!(report["reasons"], json!(["not the leader"]), "{report}");
    for kind in ["nodes", "pods", "devices"] {
        assert_eq!(report["kinds"][kind]["phase"], "synced", "{report}");
    }
    let (_, err) = sh
        .post("/bind", &service::binding_args(&pods[0], "n1"))
        .await;
    assert!(
        err["Error"].as_str().unwrap().contains("not the leader"),
        "{err}"
    );
    assert!(fake.get(Kind::Pod, "ml", "p0").unwrap()["spec"]["nodeName"].is_null());

    let (status, ok) = lh
        .post("/bind", &service::binding_args(&pods[0], "n1"))
        .await;
    assert_eq!((status, &ok["Error"]), (200, &json!("")), "{ok}");

    // Both caches see the bind through their watches and agree.
    let (ca, cb) = (a.state.cluster.clone(), b.state.cluster.clone());
    service::eventually(Duration::from_secs(5), "equal committed snapshots", || {
        let sa = ca.snapshot();
        sa == cb.snapshot() && sa["n1"]["devices"]["entries"]["uid-p0"]["state"] == "committed"
    })
    .await;
    assert_lease_rbac(&fake);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn graceful_shutdown_hands_over_well_within_the_lease_duration() {
    let (fake, pods) = cluster(1);
    let a = service::start(&fake, &as_strs(&elect_flags("a"))).await;
    let ha = Http::new(a.addr);
    ha.wait_ready(Duration::from_secs(10)).await;
    let b = service::start(&fake, &as_strs(&elect_flags("b"))).await;
    let hb = Http::new(b.addr);
    // b synced but standing by.
    service::eventually(Duration::from_secs(5), "b synced", || {
        b.state.readiness.all_synced()
    })
    .await;
    assert!(!ready(&hb).await);

    let start = Instant::now();
    a.shutdown().await.unwrap();
    let lease = fake
        .get(Kind::Lease, "default", "device-numa-extender")
        .unwrap();
    assert!(
        lease["spec"]["holderIdentity"].as_str().unwrap_or("") != "a",
        "lease not released: {lease}"
    );
    let took = start.elapsed() + time_to_ready(&hb, LEASE * 2).await;
    assert!(took < LEASE / 2, "handover took {took:?}");
    let (status, ok) = hb
        .post("/bind", &service::binding_args(&pods[0], "n1"))
        .await;
    assert_eq!((status, &ok["Error"]), (200, &json!("")), "{ok}");
    assert_lease_rbac(&fake);
    b.shutdown().await.unwrap();
}

/// The leader's link to the API server hangs (no error, no answer). It must stop serving
/// within its renew deadline, before the standby may take over at lease expiry.
#[tokio::test]
async fn partitioned_leader_steps_down_before_the_standby_takes_over() {
    let (fake, _pods) = cluster(0);
    let (fa, fb) = (Faults::new(), Faults::new());
    let a = service::start_with(&fake, &fa, &as_strs(&elect_flags("a"))).await;
    let ha = Http::new(a.addr);
    ha.wait_ready(Duration::from_secs(10)).await;
    let b = service::start_with(&fake, &fb, &as_strs(&elect_flags("b"))).await;
    let hb = Http::new(b.addr);

    fa.set_link(Link::Hang);
    let cut = Instant::now();
    let mut a_down = None;
    let mut b_up = None;
    while cut.elapsed() < LEASE * 3 && (a_down.is_none() || b_up.is_none()) {
        let (ra, rb) = (ready(&ha).await, ready(&hb).await);
        assert!(!(ra && rb), "both ready {:?} after the cut", cut.elapsed());
        if !ra && a_down.is_none() {
            a_down = Some(cut.elapsed());
        }
        if rb && b_up.is_none() {
            b_up = Some(cut.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a_down = a_down.expect("partitioned leader never stopped serving");
    let b_up = b_up.expect("standby never took over");
    assert!(
        a_down <= RENEW_DEADLINE + RETRY * 3,
        "old leader served for {a_down:?} without renewing"
    );
    assert!(
        a_down < b_up,
        "old leader down at {a_down:?}, new up at {b_up:?}"
    );
    assert!(b_up <= LEASE + RETRY * 5, "takeover took {b_up:?}");
    fa.set_link(Link::Up);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Sampling both `/readyz` every ~20 ms while they contend (start-up, lease write errors, a
/// graceful handover and a restart): never both ready.
#[tokio::test]
async fn contention_never_makes_both_ready() {
    let (fake, _pods) = cluster(0);
    let a = service::start(&fake, &as_strs(&elect_flags("a"))).await;
    let b = service::start(&fake, &as_strs(&elect_flags("b"))).await;
    let (ha, hb) = (Http::new(a.addr), Http::new(b.addr));
    let sample = |ha: Http, hb: Http, for_: Duration| async move {
        let start = Instant::now();
        let mut ready_samples = 0;
        while start.elapsed() < for_ {
            let (ra, rb) = tokio::join!(ready(&ha), ready(&hb));
            assert!(!(ra && rb), "both ready at {:?}", start.elapsed());
            ready_samples += usize::from(ra || rb);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ready_samples
    };
    assert!(sample(ha.clone(), hb.clone(), Duration::from_secs(2)).await > 0);
    // Lease writes fail for a while: the leader keeps going within its renew deadline or
    // steps down; nobody else may take over meanwhile.
    fake.fail_writes(Kind::Lease, 500, 5);
    sample(ha.clone(), hb.clone(), Duration::from_secs(2)).await;
    // Hand over and come back: a new `a` contends with the leader `b`.
    a.shutdown().await.unwrap();
    let a = service::start(&fake, &as_strs(&elect_flags("a"))).await;
    let ha = Http::new(a.addr);
    assert!(sample(ha.clone(), hb.clone(), Duration::from_secs(2)).await > 0);
    assert_lease_rbac(&fake);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Binds of one-GPU pods go to both replicas all the time (like a scheduler behind a
/// Service) while the leader shuts down mid-stream, its last bind's annotation write slow.
/// The standby answers Error; after the handover the new leader fills the node; no GPU twice.
#[tokio::test]
async fn no_double_allocation_across_graceful_failover() {
    let (fake, pods) = cluster(10);
    let (fa, fb) = (Faults::new(), Faults::new());
    let a = service::start_with(&fake, &fa, &as_strs(&elect_flags("a"))).await;
    let ha = Http::new(a.addr);
    ha.wait_ready(Duration::from_secs(10)).await;
    let b = service::start_with(&fake, &fb, &as_strs(&elect_flags("b"))).await;
    let hb = Http::new(b.addr);
    service::eventually(Duration::from_secs(5), "b synced", || {
        b.state.readiness.all_synced()
    })
    .await;

    let stream = |ha: Http, hb: Http, pods: Vec<Value>, for_: Duration| async move {
        let start = Instant::now();
        let mut successes = 0usize;
        let mut pending: Vec<Value> = pods;
        while start.elapsed() < for_ && !pending.is_empty() {
            let pod = pending.remove(0);
            let body = service::binding_args(&pod, "n1");
            let (ra, rb) = tokio::join!(ha.try_post("/bind", &body), hb.try_post("/bind", &body));
            let (ea, eb) = (bind_error(&ra), bind_error(&rb));
            assert!(
                ea.is_some() || eb.is_some(),
                "both replicas bound {}: {ra:?} {rb:?}",
                pod["metadata"]["name"]
            );
            if ea.is_none() || eb.is_none() {
                successes += 1;
            } else if ea
                .iter()
                .chain(eb.iter())
                .all(|e| !e.contains("cannot place"))
            {
                // Nobody could answer (failover in progress): the scheduler retries later.
                pending.push(pod);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        successes
    };
    let first = stream(
        ha.clone(),
        hb.clone(),
        pods[..2].to_vec(),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(first, 2);

    // a's next bind is slow to write its annotation; a shuts down while it is in flight, and
    // binds keep coming to both replicas.
    fa.set_pod_patch_delay(Duration::from_millis(600));
    let slow = {
        let (ha, body) = (ha.clone(), service::binding_args(&pods[2], "n1"));
        tokio::spawn(async move { ha.try_post("/bind", &body).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let shutdown = tokio::spawn(a.shutdown());
    let rest = stream(ha.clone(), hb.clone(), pods[3..].to_vec(), LEASE * 4).await;
    let slow = slow.await.unwrap();
    shutdown.await.unwrap().unwrap();

    let bound = assert_no_double_allocation(&fake);
    let slow_ok = usize::from(bind_error(&slow).is_none());
    assert!(
        first + slow_ok + rest <= GPUS as usize,
        "{first}+{slow_ok}+{rest} successful binds on {GPUS} GPUs"
    );
    assert_eq!(bound, GPUS as usize, "the new leader did not fill the node");
    assert!(ready(&hb).await);
    assert_lease_rbac(&fake);
    b.shutdown().await.unwrap();
}

// ---- follow mode ----------------------------------------------------------------------------

fn scheduler_lease(holder: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "renewTime": "2030-01-01T00:00:00.000000Z", "leaseTransitions": 0}
    })
}

fn set_scheduler_holder(fake: &FakeApiServer, holder: &str) {
    fake.patch_merge(
        Kind::Lease,
        "kube-system",
        "kube-scheduler",
        json!({"spec": {"holderIdentity": holder}}),
    )
    .unwrap();
}

fn follow_flags(pod: &str) -> Vec<String> {
    [
        "--follow-scheduler-lease",
        "kube-scheduler",
        "--leader-elect-lease-namespace",
        "kube-system",
        "--leader-elect-identity",
        pod,
        "--leader-elect-retry-period",
        "100ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[tokio::test]
async fn follow_mode_tracks_the_scheduler_lease_and_never_writes_it() {
    let (fake, _pods) = cluster(0);
    fake.create(
        Kind::Lease,
        scheduler_lease("sched-a_5f1c2d3e-0000-4000-8000-000000000001"),
    )
    .unwrap();
    let a = service::start(&fake, &as_strs(&follow_flags("sched-a"))).await;
    let ha = Http::new(a.addr);
    ha.wait_ready(Duration::from_secs(10)).await;

    // Another scheduler pod (a prefix of ours is not us) wins: we stop serving.
    set_scheduler_holder(&fake, "sched-ab_5f1c2d3e-0000-4000-8000-000000000002");
    service::eventually(
        Duration::from_secs(2),
        "not ready after the holder moved",
        || !a.state.readiness.is_leader(),
    )
    .await;
    let (status, report) = ha.get("/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(report["reasons"], json!(["not the leader"]), "{report}");

    // Back to us.
    set_scheduler_holder(&fake, "sched-a_5f1c2d3e-0000-4000-8000-000000000003");
    ha.wait_ready(Duration::from_secs(2)).await;

    let lease_requests: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/leases"))
        .collect();
    assert!(!lease_requests.is_empty());
    assert!(
        lease_requests.iter().all(|r| r.method == "GET"),
        "follow mode wrote the scheduler lease: {lease_requests:?}"
    );
    assert_lease_rbac(&fake);
    a.shutdown().await.unwrap();
    let lease = fake
        .get(Kind::Lease, "kube-system", "kube-scheduler")
        .unwrap();
    assert_eq!(
        lease["spec"]["holderIdentity"], "sched-a_5f1c2d3e-0000-4000-8000-000000000003",
        "shutdown must not release a lease we only follow"
    );
}

/// After the scheduler lease moved to another pod, a failing lease read must not make us
/// leader again (the renew-deadline grace is for a holder, not for a replica that lost).
#[tokio::test]
async fn follow_mode_stays_not_ready_when_reads_fail_after_losing() {
    let (fake, _pods) = cluster(0);
    fake.create(Kind::Lease, scheduler_lease("sched-a_1"))
        .unwrap();
    let faults = Faults::new();
    let a = service::start_with(&fake, &faults, &as_strs(&follow_flags("sched-a"))).await;
    let ha = Http::new(a.addr);
    ha.wait_ready(Duration::from_secs(10)).await;
    set_scheduler_holder(&fake, "sched-b_2");
    service::eventually(Duration::from_secs(2), "not leader", || {
        !a.state.readiness.is_leader()
    })
    .await;
    faults.set_link(Link::Fail);
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(800) {
        assert!(
            !a.state.readiness.is_leader(),
            "leader again {:?} after losing, on a failed read",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    faults.set_link(Link::Up);
    a.shutdown().await.unwrap();
}

// ---- real processes: SIGKILL the leader -----------------------------------------------------

/// A child `serve` process, killed when dropped (also when a test fails).
struct Replica {
    child: std::process::Child,
    http: Http,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn_replica(kubeconfig: &Path, identity: &str, log: &Path) -> Replica {
    let port = free_port();
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--shutdown-delay".into(),
        "0s".into(),
        "--log-level".into(),
        "info".into(),
    ];
    args.extend(elect_flags(identity));
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_device-numa-extender"))
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("spawn the extender binary");
    Replica {
        child,
        http: Http::new(([127, 0, 0, 1], port).into()),
    }
}

#[tokio::test]
async fn sigkilled_leader_is_replaced_within_lease_duration_and_nothing_is_allocated_twice() {
    let (fake, pods) = cluster(10);
    let served = fake.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    served.write_kubeconfig(&kubeconfig).unwrap();
    let mut replicas = vec![
        spawn_replica(&kubeconfig, "a", &dir.path().join("a.log")),
        spawn_replica(&kubeconfig, "b", &dir.path().join("b.log")),
    ];
    let https: Vec<Http> = replicas.iter().map(|r| r.http.clone()).collect();
    let leader = wait_one_leader(&[&https[0], &https[1]], Duration::from_secs(20)).await;
    let standby = 1 - leader;
    // Standby synced: its only reason is leadership.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let report = https[standby]
            .try_send("GET", "/readyz", None, Vec::new())
            .await
            .map(|(_, r)| r);
        if report
            .as_ref()
            .is_ok_and(|r| r["reasons"] == json!(["not the leader"]))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "standby not synced: {report:?}\n{}",
            std::fs::read_to_string(dir.path().join(["a.log", "b.log"][standby])).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Two binds through the leader, the standby refusing each.
    let mut successes = 0;
    for pod in &pods[..2] {
        let body = service::binding_args(pod, "n1");
        let rs = https[standby].try_post("/bind", &body).await;
        assert!(
            bind_error(&rs).unwrap().contains("not the leader"),
            "{rs:?}"
        );
        let rl = https[leader].try_post("/bind", &body).await;
        assert_eq!(bind_error(&rl), None, "{rl:?}");
        successes += 1;
    }

    // SIGKILL the leader: no release. Keep binding through both.
    replicas[leader].child.kill().unwrap();
    replicas[leader].child.wait().unwrap();
    let killed = Instant::now();
    let mut took = None;
    let mut pending: Vec<Value> = pods[2..].to_vec();
    while killed.elapsed() < LEASE * 5 && !pending.is_empty() {
        let pod = pending.remove(0);
        let body = service::binding_args(&pod, "n1");
        let (r0, r1) = tokio::join!(
            https[0].try_post("/bind", &body),
            https[1].try_post("/bind", &body)
        );
        let (e0, e1) = (bind_error(&r0), bind_error(&r1));
        assert!(e0.is_some() || e1.is_some(), "both bound: {r0:?} {r1:?}");
        if e0.is_none() || e1.is_none() {
            successes += 1;
            took.get_or_insert(killed.elapsed());
        } else if [&e0, &e1]
            .iter()
            .all(|e| !e.as_ref().unwrap().contains("cannot place"))
        {
            pending.push(pod);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = took.expect("no bind succeeded after the kill");
    assert!(
        took <= LEASE + RETRY * 5,
        "the standby served its first bind {took:?} after the kill"
    );
    let bound = assert_no_double_allocation(&fake);
    assert!(
        successes <= GPUS as usize,
        "{successes} binds on {GPUS} GPUs"
    );
    assert_eq!(bound, GPUS as usize);
    drop(replicas);
    served.stop().await;
}

#[tokio::test]
async fn inconsistent_lease_timings_are_refused_at_start() {
    let fake = FakeApiServer::new();
    let args = service::serve_args(&[
        "--leader-elect",
        "--leader-elect-lease-duration",
        "1s",
        "--leader-elect-renew-deadline",
        "1s",
    ]);
    let err = Service::start(args, Some(fake.client()))
        .await
        .err()
        .expect("renew deadline = lease duration must be refused");
    assert!(err.to_string().contains("renew-deadline"), "{err}");
}
