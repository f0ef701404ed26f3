//! Leader election / HA: two replicas against one fake API server. Exactly one serves binds,
//! standbys keep synced caches, failover (graceful, partition, SIGKILL) hands over in the
//! right order (the old leader stops before the new one starts; a graceful handover goes
//! through the released Lease, not its expiry), and no GPU is allocated twice across a
//! failover. Follow mode only reads the scheduler's Lease. Lease timings (see [`elect_flags`])
//! let failovers by expiry happen within seconds while a spurious re-election would need a
//! stall of several seconds; no test asserts how quickly anything happens: every wait is a
//! [`HANG_GUARD`] that only stops a hung test.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use device_numa_extender::api_calls::LEADER_ELECTION_API_CALLS;
use device_numa_extender::app::Service;
use serde_json::{Value, json};

use crate::support::service::{self, Faults, Http, Link};
use crate::support::{FakeApiServer, Kind, WriteFault, WriteOp};

const GPUS: i32 = 4;
/// Only stops a hung test; never a bound the code must meet.
const HANG_GUARD: Duration = Duration::from_secs(60);
/// Samples taken while checking that two replicas are never ready at once (~20 ms apart).
const SAMPLES: usize = 100;

/// Lease 10 s, renew deadline 8 s: a leader loses its lease only after 8 s without a renewal,
/// which no scheduling delay on a loaded test machine reaches, so no test sees a spurious
/// re-election; a failover by expiry takes up to 10 s. Tests where failover is not the
/// subject use [`STEADY`].
fn elect_flags(identity: &str) -> Vec<String> {
    elect_flags_with(identity, "10s", "8s")
}

/// A lease that never lapses within a test: leadership changes only by a graceful handover.
const STEADY: (&str, &str) = ("1h", "30s");

fn elect_flags_with(identity: &str, lease: &str, renew_deadline: &str) -> Vec<String> {
    [
        "--leader-elect",
        "--leader-elect-identity",
        identity,
        "--leader-elect-lease-duration",
        lease,
        "--leader-elect-renew-deadline",
        renew_deadline,
        "--leader-elect-retry-period",
        "100ms",
        // Each takeover waits out twice this (the bindings a previous leader may still land)
        // before binding: short, so the tests do not wait out the 10 s default twice.
        "--request-timeout",
        "3s",
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

/// Binds through `http`, retrying while a new leader waits out the bindings its predecessor
/// may still land (`cache_not_current`), as kube-scheduler retries a failed bind.
async fn bind_after_takeover(http: &Http, body: &Value) -> (u16, Value) {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let (status, answer) = http.post("/bind", body).await;
        if !answer["Error"]
            .as_str()
            .is_some_and(|e| e.contains("catching up"))
        {
            return (status, answer);
        }
        assert!(Instant::now() < deadline, "still catching up: {answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

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

/// Binds `pods[..3]` to n1 through `http`, retrying while binds are refused for now (not ready,
/// fenced after a start or a takeover); a "cannot place" answer fails the test.
async fn fill_three_gpus(http: &Http, pods: &[Value]) {
    let deadline = Instant::now() + 2 * HANG_GUARD;
    for pod in &pods[..3] {
        loop {
            let r = http
                .try_post("/bind", &service::binding_args(pod, "n1"))
                .await;
            match bind_error(&r) {
                None => break,
                Some(e) => assert!(
                    Instant::now() < deadline && !e.contains("cannot place"),
                    "{e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
    let steady = |id| elect_flags_with(id, STEADY.0, STEADY.1);
    let a = service::start(&fake, &as_strs(&steady("a"))).await;
    let b = service::start(&fake, &as_strs(&steady("b"))).await;
    let (ha, hb) = (Http::new(a.addr), Http::new(b.addr));
    let leader = wait_one_leader(&[&ha, &hb], HANG_GUARD).await;
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

    let (status, ok) = bind_after_takeover(lh, &service::binding_args(&pods[0], "n1")).await;
    assert_eq!((status, &ok["Error"]), (200, &json!("")), "{ok}");
    // Becoming leader fenced the leader's pod cache once; the bind above went through, so the
    // relist lifted it, and /readyz says so. The standby never became leader.
    let became_leader = |svc: &Service| {
        svc.state
            .scheduler
            .metrics
            .pod_fences
            .with_label_values(&["became_leader"])
            .get()
    };
    let (leader_svc, standby_svc) = if leader == 0 { (&a, &b) } else { (&b, &a) };
    assert_eq!(became_leader(leader_svc), 1);
    assert_eq!(became_leader(standby_svc), 0);
    let (_, report) = lh.get("/readyz").await;
    assert_eq!(report["binds_wait_for_pod_relist"], false, "{report}");

    // Both caches see the bind through their watches and agree.
    let (ca, cb) = (
        a.state.scheduler.cluster.clone(),
        b.state.scheduler.cluster.clone(),
    );
    service::eventually(HANG_GUARD, "equal committed snapshots", || {
        let sa = ca.debug_dump();
        sa == cb.debug_dump() && sa["n1"]["devices"]["entries"]["uid-p0"]["state"] == "committed"
    })
    .await;
    assert_lease_rbac(&fake);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A graceful shutdown releases the Lease and the standby takes it from the release. The
/// lease lasts an hour, so within the test an expiry cannot explain the takeover: the standby
/// becoming ready at all shows the handover went through the release.
#[tokio::test]
async fn graceful_shutdown_hands_over_through_the_released_lease_not_its_expiry() {
    let (fake, pods) = cluster(1);
    let a = service::start(&fake, &as_strs(&elect_flags_with("a", STEADY.0, STEADY.1))).await;
    let ha = Http::new(a.addr);
    ha.wait_ready(HANG_GUARD).await;
    let b = service::start(&fake, &as_strs(&elect_flags_with("b", STEADY.0, STEADY.1))).await;
    let hb = Http::new(b.addr);
    // b synced but standing by.
    service::eventually(HANG_GUARD, "b synced", || {
        b.state.scheduler.readiness.all_synced()
    })
    .await;
    assert!(!ready(&hb).await);

    a.shutdown().await.unwrap();
    let lease = fake
        .get(Kind::Lease, "default", "device-numa-extender")
        .unwrap();
    assert!(
        lease["spec"]["holderIdentity"].as_str().unwrap_or("") != "a",
        "lease not released: {lease}"
    );
    hb.wait_ready(HANG_GUARD).await;
    let lease = fake
        .get(Kind::Lease, "default", "device-numa-extender")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "b", "{lease}");
    let (status, ok) = bind_after_takeover(&hb, &service::binding_args(&pods[0], "n1")).await;
    assert_eq!((status, &ok["Error"]), (200, &json!("")), "{ok}");
    assert_lease_rbac(&fake);
    b.shutdown().await.unwrap();
}

/// The leader's link to the API server hangs (no error, no answer). It must stop serving
/// (at its renew deadline) before the standby takes over (at lease expiry): judged by the
/// order of observations, each sample reading `a` before `b`, never by how long either took.
#[tokio::test]
async fn partitioned_leader_steps_down_before_the_standby_takes_over() {
    let (fake, _pods) = cluster(0);
    let (fa, fb) = (Faults::new(), Faults::new());
    let a = service::start_with(&fake, &fa, &as_strs(&elect_flags("a"))).await;
    let ha = Http::new(a.addr);
    ha.wait_ready(HANG_GUARD).await;
    let b = service::start_with(&fake, &fb, &as_strs(&elect_flags("b"))).await;
    let hb = Http::new(b.addr);

    fa.set_link(Link::Hang);
    let deadline = Instant::now() + HANG_GUARD;
    let mut a_down = None;
    let mut b_up = None;
    let mut sample = 0usize;
    while a_down.is_none() || b_up.is_none() {
        assert!(
            Instant::now() < deadline,
            "hang guard: a stopped at sample {a_down:?}, b started at sample {b_up:?}"
        );
        // Sequential on purpose: within a sample, a is observed before b.
        let ra = ready(&ha).await;
        let rb = ready(&hb).await;
        assert!(!(ra && rb), "both ready at sample {sample} after the cut");
        if !ra && a_down.is_none() {
            a_down = Some(sample);
        }
        if ra {
            assert!(
                a_down.is_none(),
                "the partitioned leader came back at sample {sample}"
            );
        }
        if rb && b_up.is_none() {
            b_up = Some(sample);
        }
        sample += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (a_down, b_up) = (a_down.unwrap(), b_up.unwrap());
    assert!(
        a_down <= b_up,
        "the new leader was ready (sample {b_up}) before the old one stopped (sample {a_down})"
    );
    fa.set_link(Link::Up);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Sampling both `/readyz` (~20 ms apart) while they contend (start-up, lease write errors, a
/// graceful handover and a restart): never both ready. Each phase takes at least [`SAMPLES`]
/// samples, and the phases that must end with a leader sample until they saw one.
#[tokio::test]
async fn contention_never_makes_both_ready() {
    let (fake, _pods) = cluster(0);
    let a = service::start(&fake, &as_strs(&elect_flags("a"))).await;
    let b = service::start(&fake, &as_strs(&elect_flags("b"))).await;
    let (ha, hb) = (Http::new(a.addr), Http::new(b.addr));
    let sample = |ha: Http, hb: Http, until_a_leader: bool| async move {
        let deadline = Instant::now() + HANG_GUARD;
        let mut ready_samples = 0;
        let mut taken = 0;
        while taken < SAMPLES || (until_a_leader && ready_samples == 0) {
            assert!(
                Instant::now() < deadline,
                "hang guard: no leader in {taken} samples"
            );
            let (ra, rb) = tokio::join!(ready(&ha), ready(&hb));
            assert!(!(ra && rb), "both ready at sample {taken}");
            ready_samples += usize::from(ra || rb);
            taken += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ready_samples
    };
    assert!(sample(ha.clone(), hb.clone(), true).await > 0);
    // Lease writes fail for a while: the leader keeps going within its renew deadline or
    // steps down; nobody else may take over meanwhile.
    fake.fail_writes(Kind::Lease, 500, 5);
    sample(ha.clone(), hb.clone(), false).await;
    // Hand over and come back: a new `a` contends with the leader `b`.
    a.shutdown().await.unwrap();
    let a = service::start(&fake, &as_strs(&elect_flags("a"))).await;
    let ha = Http::new(a.addr);
    assert!(sample(ha.clone(), hb.clone(), true).await > 0);
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
    ha.wait_ready(HANG_GUARD).await;
    let b = service::start_with(&fake, &fb, &as_strs(&elect_flags("b"))).await;
    let hb = Http::new(b.addr);
    service::eventually(HANG_GUARD, "b synced", || {
        b.state.scheduler.readiness.all_synced()
    })
    .await;

    // Sends every pod's bind to both replicas until each pod is bound or cannot be placed.
    let stream = |ha: Http, hb: Http, pods: Vec<Value>| async move {
        let deadline = Instant::now() + HANG_GUARD;
        let mut successes = 0usize;
        let mut pending: Vec<Value> = pods;
        while !pending.is_empty() {
            assert!(
                Instant::now() < deadline,
                "hang guard: {} pods never got a bind answer",
                pending.len()
            );
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
    let first = stream(ha.clone(), hb.clone(), pods[..2].to_vec()).await;
    assert_eq!(first, 2);

    // a's next bind is held writing its binding; a shuts down while it is in flight (an
    // ordering the test makes, not a delay it hopes outlasts the steps), and binds keep
    // coming to both replicas.
    fa.hold_writes();
    let slow = {
        let (ha, body) = (ha.clone(), service::binding_args(&pods[2], "n1"));
        tokio::spawn(async move { ha.try_post("/bind", &body).await })
    };
    service::eventually(HANG_GUARD, "a's binding write is in flight", || {
        fa.held_writes() >= 1
    })
    .await;
    let readiness_a = a.state.scheduler.readiness.clone();
    let shutdown = tokio::spawn(a.shutdown());
    service::eventually(HANG_GUARD, "a is shutting down", || {
        readiness_a
            .report()
            .reasons
            .iter()
            .any(|r| r == "shutting down")
    })
    .await;
    fa.release_writes();
    let rest = stream(ha.clone(), hb.clone(), pods[3..].to_vec()).await;
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
    ha.wait_ready(HANG_GUARD).await;

    // Another scheduler pod (a prefix of ours is not us) wins: we stop serving.
    set_scheduler_holder(&fake, "sched-ab_5f1c2d3e-0000-4000-8000-000000000002");
    service::eventually(HANG_GUARD, "not ready after the holder moved", || {
        !a.state.scheduler.readiness.is_leader()
    })
    .await;
    let (status, report) = ha.get("/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(report["reasons"], json!(["not the leader"]), "{report}");
    // The chart's scheduler-mode pod readiness: a synced standby is healthy (so a
    // PodDisruptionBudget counts it), while the verbs still serve only the leader.
    let (status, report) = ha.get("/readyz?standby=ok").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["standby_ready"], true, "{report}");
    let (status, report) = ha.get("/readyz?standby=yes").await;
    assert_eq!(status, 400, "{report}");
    assert!(
        report["error"].as_str().unwrap().contains("standby"),
        "{report}"
    );

    // Back to us.
    set_scheduler_holder(&fake, "sched-a_5f1c2d3e-0000-4000-8000-000000000003");
    ha.wait_ready(HANG_GUARD).await;

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
    ha.wait_ready(HANG_GUARD).await;
    set_scheduler_holder(&fake, "sched-b_2");
    service::eventually(HANG_GUARD, "not leader", || {
        !a.state.scheduler.readiness.is_leader()
    })
    .await;
    // Counted in failed lease reads, not in time: after each of them, still not the leader.
    let before = faults.failed_lease_requests();
    faults.set_link(Link::Fail);
    let deadline = Instant::now() + HANG_GUARD;
    while faults.failed_lease_requests() < before + 5 {
        assert!(
            !a.state.scheduler.readiness.is_leader(),
            "leader again after {} failed lease reads, having lost",
            faults.failed_lease_requests() - before
        );
        assert!(
            Instant::now() < deadline,
            "hang guard: the lease is not being read"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!a.state.scheduler.readiness.is_leader());
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
    spawn_replica_with(kubeconfig, identity, log, &[])
}

fn spawn_replica_with(kubeconfig: &Path, identity: &str, log: &Path, extra: &[&str]) -> Replica {
    // `extra` overrides a flag elect_flags sets (clap refuses a flag given twice).
    let mut elect = elect_flags(identity);
    for flag in extra.iter().filter(|f| f.starts_with("--")) {
        if let Some(at) = elect.iter().position(|f| f == flag) {
            elect.drain(at..at + 2);
        }
    }
    let mut args: Vec<&str> = elect.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    spawn_serve(kubeconfig, log, &args)
}

/// A `serve` process with exactly `flags` beyond the kubeconfig, listener and logs: no leader
/// election unless they ask for it.
fn spawn_serve(kubeconfig: &Path, log: &Path, flags: &[&str]) -> Replica {
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
    args.extend(flags.iter().map(|s| s.to_string()));
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
async fn sigkilled_leader_is_replaced_by_the_standby_and_nothing_is_allocated_twice() {
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
    let leader = wait_one_leader(&[&https[0], &https[1]], HANG_GUARD).await;
    let standby = 1 - leader;
    // Standby synced: its only reason is leadership.
    let deadline = Instant::now() + HANG_GUARD;
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
        let (_, rl) = bind_after_takeover(&https[leader], &body).await;
        assert_eq!(rl["Error"], json!(""), "{rl}");
        successes += 1;
    }

    // SIGKILL the leader: no release. Keep binding through both.
    replicas[leader].child.kill().unwrap();
    replicas[leader].child.wait().unwrap();
    let deadline = Instant::now() + HANG_GUARD;
    let mut served_after_kill = 0;
    let mut pending: Vec<Value> = pods[2..].to_vec();
    while !pending.is_empty() {
        assert!(
            Instant::now() < deadline,
            "hang guard: {} pods never got a bind answer after the kill",
            pending.len()
        );
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
            served_after_kill += 1;
            assert!(
                e0.is_none() == (standby == 0),
                "a bind succeeded on the killed replica: {r0:?} {r1:?}"
            );
        } else if [&e0, &e1]
            .iter()
            .all(|e| !e.as_ref().unwrap().contains("cannot place"))
        {
            pending.push(pod);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served_after_kill > 0, "no bind succeeded after the kill");
    let lease = fake
        .get(Kind::Lease, "default", "device-numa-extender")
        .unwrap();
    assert_eq!(
        lease["spec"]["holderIdentity"],
        ["a", "b"][standby],
        "the standby holds the lease: {lease}"
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

/// Issue 22 §5, fencing: the leader sends a binding, the API server applies it only later, and
/// meanwhile the leader is SIGKILLed and the standby takes over. The new leader's pod cache
/// cannot show a binding that has not landed, and the binding's resourceVersion precondition
/// does not stop it (nothing else writes that pod). The new leader must not give away what it
/// claims: it waits out the bindings the old leader can still land (twice `--request-timeout`
/// after taking over), then relists. Without that wait the new leader binds another pod to the
/// same GPU and the late binding lands on top.
#[tokio::test]
async fn a_binding_the_old_leader_sent_that_lands_after_the_takeover_is_never_given_away() {
    // n1 has 4 GPUs: three pods fill three of them, x and y both want the fourth.
    let (fake, pods) = cluster(5);
    let served = fake.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    served.write_kubeconfig(&kubeconfig).unwrap();
    // The old leader's binding carries `?timeout=` 10 s: the API server may apply it until
    // then, well after the standby takes over (lease 4 s; renew deadline 3 s, the stall a
    // spurious re-election before the kill would need).
    let flags = [
        "--request-timeout",
        "10s",
        "--leader-elect-lease-duration",
        "4s",
        "--leader-elect-renew-deadline",
        "3s",
    ];
    let mut replicas = [
        spawn_replica_with(&kubeconfig, "a", &dir.path().join("a.log"), &flags),
        spawn_replica_with(&kubeconfig, "b", &dir.path().join("b.log"), &flags),
    ];
    let https: Vec<Http> = replicas.iter().map(|r| r.http.clone()).collect();
    let leader = wait_one_leader(&[&https[0], &https[1]], HANG_GUARD).await;
    let standby = 1 - leader;
    let bind = |i: usize, pod: &Value| {
        let http = https[i].clone();
        let body = service::binding_args(pod, "n1");
        async move { http.try_post("/bind", &body).await }
    };
    // Fill three GPUs through the leader (retrying while it is still fenced after taking the
    // lease).
    fill_three_gpus(&https[leader], &pods).await;
    // x's binding reaches the API server, which answers 500 at once and applies it later.
    let (x, y) = (&pods[3], &pods[4]);
    fake.push_write_fault(WriteOp::PodBinding, WriteFault::LandsLate(1));
    let r = bind(leader, x).await;
    assert!(bind_error(&r).is_some(), "x's binding answered: {r:?}");
    assert!(fake.late_write_arrived(1));
    replicas[leader].child.kill().unwrap();
    replicas[leader].child.wait().unwrap();

    // The standby takes over. Its first bind of y is answered before x's binding lands.
    let deadline = Instant::now() + HANG_GUARD;
    let first = loop {
        let r = bind(standby, y).await;
        match bind_error(&r) {
            Some(e) if e.contains("not the leader") => {
                assert!(Instant::now() < deadline, "the standby never took over");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other,
        }
    };
    // Now x's binding lands, still inside the API server's deadline for it.
    fake.land_late_write(1);
    let deadline = Instant::now() + HANG_GUARD;
    while fake.late_write_outcome(1).is_none() {
        assert!(Instant::now() < deadline, "the late binding never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        fake.late_write_outcome(1),
        Some(201),
        "x's late binding must land for this test to mean anything"
    );
    // y keeps being retried, as kube-scheduler would, until the new leader answers for good.
    let mut last = first;
    let deadline = Instant::now() + 2 * HANG_GUARD;
    while let Some(e) = &last {
        if e.contains("cannot place") || e.contains("does not fit") {
            break;
        }
        assert!(Instant::now() < deadline, "y never got a final answer: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        last = bind_error(&bind(standby, y).await);
    }
    let bound = assert_no_double_allocation(&fake);
    assert_eq!(bound, 4, "x and the three fillers hold the four GPUs");
    let y_now = fake.get(Kind::Pod, "ml", "p4").unwrap();
    assert!(y_now["spec"]["nodeName"].is_null(), "y was bound: {y_now}");
}

/// Issue 36 §1: a single replica without leader election, restarted while a binding it sent is
/// still in flight at the API server. The new process's first list shows x unbound; it must not
/// give x's GPU to y before x's binding has landed or can no longer land. Every start is a
/// takeover: it waits out the previous process's bindings (`--takeover-window`, by default twice
/// `--request-timeout`) and then for a pod list begun afterwards. **Before the fix** (no fence
/// without a leader mode; reproduced with `--takeover-window 0s`): y was bound to the GPU x's
/// binding claims.
#[tokio::test]
async fn a_restart_without_leader_election_never_gives_away_a_binding_still_in_flight() {
    let (fake, pods) = cluster(5);
    let served = fake.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    served.write_kubeconfig(&kubeconfig).unwrap();
    // The binding carries `?timeout=` 10 s: the API server may apply it until then, well after
    // the restarted process has listed.
    let flags = ["--request-timeout", "10s"];
    let mut first = spawn_serve(&kubeconfig, &dir.path().join("first.log"), &flags);
    let bind = |http: &Http, pod: &Value| {
        let http = http.clone();
        let body = service::binding_args(pod, "n1");
        async move { http.try_post("/bind", &body).await }
    };
    // Fill three GPUs (retrying while the start fence holds binds, or not yet ready).
    fill_three_gpus(&first.http, &pods).await;
    // x's binding reaches the API server, which answers 500 at once and applies it later.
    let (x, y) = (&pods[3], &pods[4]);
    fake.push_write_fault(WriteOp::PodBinding, WriteFault::LandsLate(1));
    let r = bind(&first.http, x).await;
    assert!(bind_error(&r).is_some(), "x's binding answered: {r:?}");
    assert!(fake.late_write_arrived(1));
    first.child.kill().unwrap();
    first.child.wait().unwrap();

    // The same Deployment's next process: no leader mode, so nothing but the start fence
    // stands between its first list (x unbound) and y.
    let second = spawn_serve(&kubeconfig, &dir.path().join("second.log"), &flags);
    let deadline = Instant::now() + HANG_GUARD;
    let answered = loop {
        let r = bind(&second.http, y).await;
        let up = r.is_ok();
        match bind_error(&r) {
            // Not listening yet, or not synced yet: no decision was made.
            Some(e) if !up || e.contains("not ready") => {
                assert!(Instant::now() < deadline, "never ready: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other,
        }
    };
    assert!(
        answered
            .as_deref()
            .is_some_and(|e| e.contains("catching up")),
        "the restarted process decided y before x's binding could land: {answered:?}"
    );
    // Now x's binding lands, still inside the API server's deadline for it.
    fake.land_late_write(1);
    let deadline = Instant::now() + HANG_GUARD;
    while fake.late_write_outcome(1).is_none() {
        assert!(Instant::now() < deadline, "the late binding never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        fake.late_write_outcome(1),
        Some(201),
        "x's late binding must land for this test to mean anything"
    );
    // y keeps being retried, as kube-scheduler would, until the process answers for good.
    let mut last = answered;
    let deadline = Instant::now() + 2 * HANG_GUARD;
    while let Some(e) = &last {
        if e.contains("cannot place") || e.contains("does not fit") {
            break;
        }
        assert!(Instant::now() < deadline, "y never got a final answer: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        last = bind_error(&bind(&second.http, y).await);
    }
    let bound = assert_no_double_allocation(&fake);
    assert_eq!(bound, 4, "x and the three fillers hold the four GPUs");
    let y_now = fake.get(Kind::Pod, "ml", "p4").unwrap();
    assert!(y_now["spec"]["nodeName"].is_null(), "y was bound: {y_now}");
}
