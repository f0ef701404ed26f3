//! The chaos suite (issue 9 §2, issue 11): a seeded, randomized workload of pod churn, device
//! changes, watch faults, write faults (refused and lost answers), SIGKILLs and leader
//! failovers, against the fake API server and two leader-elected replicas of the real binary,
//! judged after every event by an independent checker. See RELIABILITY.md.
//!
//! * `cargo test --test chaos` runs the short run (300 events, a fresh seed, printed).
//! * `CHAOS_SEED=<n>` replays a seed; `CHAOS_EVENTS=<n>` sets the length; the long run is
//!   `CHAOS_EVENTS=20000 cargo test --test chaos chaos_run -- --nocapture`.
//! * `CHAOS_ENFORCE_RELEASE=1` also enforces issue 11's end-of-run release check (see
//!   [`driver::ENFORCE_RELEASE_AFTER_DELETE`]); `CHAOS_DEVICE_DELETE=1` also deletes Devices
//!   (see [`driver::STALE_ANNOTATION_FIXED`]); `CHAOS_BIND_IN_WATCH_GAPS=1` schedules during
//!   watch gaps (see [`driver::BIND_IN_WATCH_GAPS_FIXED`]). These gates are all on now; the
//!   variables remain so a seed recorded with a gate off can still be described.
//! * `CHAOS_LOG_LEVEL=info` runs the replicas at that log level (default `warn`): the dump of
//!   the first violation then shows every decision about the pods involved.

#[path = "../support/mod.rs"]
mod support;

mod checker;
mod driver;
mod prng;
mod replica;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_run() {
    let seed = env_u64("CHAOS_SEED").unwrap_or_else(prng::fresh_seed);
    let events = env_u64("CHAOS_EVENTS").unwrap_or(300);
    let enforce_release = driver::ENFORCE_RELEASE_AFTER_DELETE
        || std::env::var("CHAOS_ENFORCE_RELEASE").is_ok_and(|v| v == "1");
    let device_delete = driver::STALE_ANNOTATION_FIXED
        || std::env::var("CHAOS_DEVICE_DELETE").is_ok_and(|v| v == "1");
    let bind_in_watch_gaps = driver::BIND_IN_WATCH_GAPS_FIXED
        || std::env::var("CHAOS_BIND_IN_WATCH_GAPS").is_ok_and(|v| v == "1");
    println!(
        "chaos: seed={seed} events={events} enforce_release={enforce_release} device_delete={device_delete} bind_in_watch_gaps={bind_in_watch_gaps} (CHAOS_SEED={seed} replays)"
    );
    let cfg = driver::Config {
        seed,
        events,
        enforce_release,
        device_delete,
        bind_in_watch_gaps,
    };
    let d = driver::Driver::start(&cfg).await;
    let report = d.run(cfg.events, cfg.device_delete).await;
    let text = report.render();
    println!("{text}");
    assert!(
        report.violations.is_empty(),
        "chaos found {} violations (seed {seed}):\n{text}",
        report.violations.len()
    );
    // The run must have exercised what it claims to: a run that never binds, judges no
    // allocation or cpuset, or never kills a leader proves nothing.
    let unmet = report.unmet_minimums();
    assert!(
        unmet.is_empty(),
        "the run did not exercise {unmet:?} (seed {seed}):\n{text}"
    );
}

// ---- the checker can fail: each invariant on a hand-made violation --------------------------

mod checker_self_test {
    use serde_json::{Value, json};

    use super::checker::*;

    fn device(node: &str, gpus: &[(i64, bool)]) -> Value {
        let devices: Vec<Value> = gpus
            .iter()
            .map(|(m, h)| {
                json!({"type": "gpu", "minor": m, "health": h,
                "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
                              "koordinator.sh/gpu-memory-ratio": "100"}})
            })
            .collect();
        json!({"metadata": {"name": node}, "spec": {"devices": devices}})
    }

    fn pod(name: &str, node: &str, alloc: Option<&str>, cpuset: Option<&str>) -> Value {
        let mut ann = serde_json::Map::new();
        if let Some(a) = alloc {
            ann.insert(DEVICE_ALLOCATED.into(), json!(a));
        }
        if let Some(c) = cpuset {
            ann.insert(
                RESOURCE_STATUS.into(),
                json!(json!({"cpuset": c}).to_string()),
            );
        }
        json!({"metadata": {"name": name, "uid": format!("u-{name}"), "annotations": ann},
               "spec": {"nodeName": node}, "status": {"phase": "Running"}})
    }

    const HALF: &str = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}"#;
    const WHOLE1: &str = r#"{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"80Gi","koordinator.sh/gpu-memory-ratio":"100"}}]}"#;
    const WHOLE0: &str = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"80Gi","koordinator.sh/gpu-memory-ratio":"100"}}]}"#;

    #[test]
    fn quantities_and_cpu_lists_parse() {
        assert_eq!(parse_quantity("80Gi"), Some(80 * 1000 * (1 << 30)));
        assert_eq!(parse_quantity("100"), Some(100_000));
        assert_eq!(parse_quantity("500m"), Some(500));
        assert_eq!(parse_quantity("1.5"), Some(1500));
        assert_eq!(parse_quantity("2k"), Some(2_000_000));
        assert_eq!(parse_quantity("x"), None);
        assert_eq!(
            parse_cpu_list("0-2,5").unwrap(),
            [0, 1, 2, 5].into_iter().collect()
        );
        assert!(parse_cpu_list("3-1").is_err());
    }

    #[test]
    fn two_halves_fit_and_a_third_share_is_an_over_allocation() {
        let mut c = Checker::default();
        let f = c.observe_devices(&[device("n", &[(0, true)])], &["n".into()]);
        c.check(
            1,
            &[
                pod("a", "n", Some(HALF), None),
                pod("b", "n", Some(HALF), None),
            ],
            &f,
        );
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        c.check(
            2,
            &[
                pod("a", "n", Some(HALF), None),
                pod("b", "n", Some(HALF), None),
                pod("c", "n", Some(HALF), None),
            ],
            &f,
        );
        assert!(
            c.violations.iter().any(|v| v.contains("OVER-ALLOCATION")),
            "{:?}",
            c.violations
        );
    }

    /// Invariant 5: within capacity is not enough; what is recorded must be what was asked.
    #[test]
    fn an_allocation_short_of_the_ask_is_a_violation() {
        let asking = |name: &str, alloc: &str, requests: Value| {
            let mut p = pod(name, "n", Some(alloc), None);
            p["spec"]["containers"] = json!([{"name": "c", "resources": {"requests": requests}}]);
            p
        };
        let mut c = Checker::default();
        let f = c.observe_devices(&[device("n", &[(0, true), (1, true)])], &["n".into()]);
        let ok = [
            asking(
                "half",
                HALF,
                json!({"koordinator.sh/gpu-memory-ratio": "50"}),
            ),
            asking("old-name", WHOLE1, json!({"kubernetes.io/gpu": "100"})),
        ];
        c.check(1, &ok, &f);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        // Two GPUs asked, one recorded (within capacity, so invariant 1 is silent).
        let mut c = Checker::default();
        let f = c.observe_devices(&[device("n", &[(0, true), (1, true)])], &["n".into()]);
        c.check(
            1,
            &[asking("two", WHOLE0, json!({"nvidia.com/gpu": "2"}))],
            &f,
        );
        assert!(
            c.violations
                .iter()
                .any(|v| v.contains("cards: asked 2000, recorded 1000")),
            "{:?}",
            c.violations
        );
        // 60 % asked, 50 % recorded.
        let mut c = Checker::default();
        let f = c.observe_devices(&[device("n", &[(0, true)])], &["n".into()]);
        let short = asking(
            "short",
            HALF,
            json!({"koordinator.sh/gpu-memory-ratio": "60"}),
        );
        c.check(1, &[short], &f);
        assert!(
            c.violations
                .iter()
                .any(|v| v.contains("asked 60000, recorded 50000")),
            "{:?}",
            c.violations
        );
    }

    /// Invariant 6: per NUMA node, the holders' `numaNodeResources` fit the NRT zone.
    #[test]
    fn a_numa_node_over_its_zone_is_a_violation() {
        let nrt = json!({"metadata": {"name": "n"}, "zones": [
            {"name": "node-0", "type": "Node", "resources": [
                {"name": "cpu", "capacity": "8", "allocatable": "8", "available": "8"}]}]});
        let numa = |name: &str, cpu: &str| {
            let mut p = pod(name, "n", None, None);
            p["metadata"]["annotations"][RESOURCE_STATUS] = json!(
                json!({"numaNodeResources": [{"node": 0, "resources": {"cpu": cpu}}]}).to_string()
            );
            p
        };
        let mut c = Checker::default();
        c.observe_topologies(&[nrt]);
        let f = c.observe_devices(&[], &[]);
        c.check(1, &[numa("a", "4"), numa("b", "4")], &f);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        assert_eq!(c.numa_allocations_seen, 2);
        c.check(2, &[numa("a", "4"), numa("b", "4"), numa("c", "1")], &f);
        assert!(
            c.violations
                .iter()
                .any(|v| v.contains("NUMA OVER-ALLOCATION on n NUMA node 0 cpu: 9000 > 8000")),
            "{:?}",
            c.violations
        );
    }

    #[test]
    fn terminal_pods_release_and_terminating_pods_hold() {
        let mut c = Checker::default();
        let f = c.observe_devices(&[device("n", &[(0, true)])], &["n".into()]);
        let mut done = pod("a", "n", Some(WHOLE0), None);
        done["status"]["phase"] = json!("Succeeded");
        c.check(1, &[done, pod("b", "n", Some(WHOLE0), None)], &f);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        let mut terminating = pod("a", "n", Some(WHOLE0), None);
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        c.check(2, &[terminating, pod("b", "n", Some(WHOLE0), None)], &f);
        assert!(!c.violations.is_empty());
    }

    #[test]
    fn a_new_allocation_on_an_unhealthy_or_removed_minor_is_a_violation() {
        let mut c = Checker::default();
        c.observe_devices(&[device("n", &[(0, true), (1, true)])], &["n".into()]);
        let f = c.observe_devices(&[device("n", &[(0, false)])], &["n".into()]);
        assert!(f.minors.contains(&("n".into(), "gpu".into(), 0)));
        assert!(
            f.minors.contains(&("n".into(), "gpu".into(), 1)),
            "a removed minor"
        );
        c.check(1, &[pod("a", "n", Some(WHOLE0), None)], &f);
        assert!(
            c.violations
                .iter()
                .any(|v| v.contains("unhealthy or absent")),
            "{:?}",
            c.violations
        );
        // Seen once, judged once: an allocation that predates the fault is not re-judged.
        let n = c.violations.len();
        c.check(2, &[pod("a", "n", Some(WHOLE0), None)], &f);
        assert_eq!(c.violations.len(), n);
        // Missing Device object.
        let mut c = Checker::default();
        let f = c.observe_devices(&[], &["n".into()]);
        c.check(1, &[pod("a", "n", Some(WHOLE0), None)], &f);
        assert!(
            c.violations
                .iter()
                .any(|v| v.contains("Device object was missing"))
        );
    }

    #[test]
    fn overlapping_cpusets_are_a_violation() {
        let mut c = Checker::default();
        let f = c.observe_devices(&[], &[]);
        c.check(
            1,
            &[
                pod("a", "n", None, Some("0-3")),
                pod("b", "n", None, Some("4-7")),
                pod("c", "m", None, Some("0-3")),
            ],
            &f,
        );
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        c.check(
            2,
            &[
                pod("a", "n", None, Some("0-3")),
                pod("b", "n", None, Some("3,8")),
            ],
            &f,
        );
        assert!(
            c.violations.iter().any(|v| v.contains("CPU 3")),
            "{:?}",
            c.violations
        );
    }

    #[test]
    fn a_cpuset_of_the_wrong_size_or_outside_the_topology_is_a_violation() {
        let mut c = Checker::default();
        let nrt = json!({"metadata": {"name": "n", "annotations": {
            "node.koordinator.sh/cpu-topology":
                r#"{"detail":[{"id":0,"core":0,"socket":0,"node":0},{"id":1,"core":0,"socket":0,"node":0},{"id":2,"core":1,"socket":0,"node":0},{"id":3,"core":1,"socket":0,"node":0}]}"#
        }}});
        c.observe_topologies(&[nrt]);
        let f = c.observe_devices(&[], &[]);
        let with_cpu = |mut p: Value, cpu: &str| {
            p["spec"]["containers"] = json!([{"resources": {"requests": {"cpu": cpu}}}]);
            p
        };
        c.check(1, &[with_cpu(pod("a", "n", None, Some("0-1")), "2")], &f);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        c.check(2, &[with_cpu(pod("a", "n", None, Some("0-2")), "2")], &f);
        assert!(
            c.violations.iter().any(|v| v.contains("asked for 2 CPUs")),
            "{:?}",
            c.violations
        );
        c.violations.clear();
        c.check(3, &[with_cpu(pod("a", "n", None, Some("3-4")), "2")], &f);
        assert!(
            c.violations.iter().any(|v| v.contains("CPU 4")),
            "{:?}",
            c.violations
        );
    }

    #[test]
    fn the_cpu_ledger_comparison_finds_missing_wrong_and_stale_entries() {
        let pods = [pod("a", "n", None, Some("0-3"))];
        let held = cpuset_holdings(&pods)["n"].clone();
        let entry = |state: &str, cpuset: &str| json!({"state": state, "resource_status": json!({"cpuset": cpuset}).to_string()});
        let view = |entries: Value| json!({"state": {"cpus": {"allocated_by_pod": entries}}});
        let good = view(json!({"u-a": entry("committed", "0-3")}));
        let d = compare_cpu_ledger("n", &good, &held);
        assert!(d.problems.is_empty() && d.stale_assumed.is_empty(), "{d:?}");
        let missing = view(json!({}));
        assert!(!compare_cpu_ledger("n", &missing, &held).problems.is_empty());
        let wrong = view(json!({"u-a": entry("committed", "0-2,4")}));
        assert!(!compare_cpu_ledger("n", &wrong, &held).problems.is_empty());
        let stale =
            view(json!({"u-a": entry("committed", "0-3"), "u-gone": entry("assumed", "4-7")}));
        let d = compare_cpu_ledger("n", &stale, &held);
        assert!(d.problems.is_empty(), "{d:?}");
        assert_eq!(d.stale_assumed.len(), 1, "{d:?}");
    }

    #[test]
    fn the_ledger_comparison_finds_missing_extra_and_stale_entries() {
        let (holding, _) = Checker::holdings(&[pod("a", "n", Some(WHOLE0), None)]);
        let held = holding["n"].clone();
        let good = json!({"state": {"devices": {
            "entries": {"u-a": {"state": "committed", "allocation": WHOLE0}},
            "types": {"gpu": {"0": {"used": {"koordinator.sh/gpu-core": "100",
                "koordinator.sh/gpu-memory": "80Gi", "koordinator.sh/gpu-memory-ratio": "100"}},
                "1": {"used": {}}}}}}});
        let d = compare_ledger("n", &good, &held, &Default::default());
        assert!(d.problems.is_empty() && d.stale_assumed.is_empty(), "{d:?}");
        let missing = json!({"state": {"devices": {"entries": {}, "types": {}}}});
        assert!(
            !compare_ledger("n", &missing, &held, &Default::default())
                .problems
                .is_empty()
        );
        let stale = json!({"state": {"devices": {
            "entries": {"u-a": {"state": "committed", "allocation": WHOLE0},
                        "u-gone": {"state": "assumed", "allocation": HALF}},
            "types": {"gpu": {"0": {"used": {"koordinator.sh/gpu-core": "100",
                "koordinator.sh/gpu-memory": "120Gi", "koordinator.sh/gpu-memory-ratio": "150"}}}}}}});
        let d = compare_ledger("n", &stale, &held, &Default::default());
        assert!(d.problems.is_empty(), "{d:?}");
        assert_eq!(d.stale_assumed.len(), 1, "{d:?}");
        let wrong_used = json!({"state": {"devices": {
            "entries": {"u-a": {"state": "committed", "allocation": WHOLE0}},
            "types": {"gpu": {"0": {"used": {}}}}}}});
        assert!(
            !compare_ledger("n", &wrong_used, &held, &Default::default())
                .problems
                .is_empty()
        );
    }

    #[test]
    fn prng_is_deterministic() {
        let mut a = super::prng::Rng::new(7);
        let mut b = super::prng::Rng::new(7);
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
    }
}

// ---- the minimums can fail: a report that misses one names it --------------------------------

mod minimums_self_test {
    use super::driver::{EVENT_LABELS, Report, plan};
    use super::prng::Rng;

    fn full_report() -> Report {
        let mut r = Report {
            enabled: EVENT_LABELS.to_vec(),
            allocations_seen: 3,
            cpusets_seen: 2,
            ..Report::default()
        };
        for label in EVENT_LABELS {
            r.events.insert(label, 1);
            r.effects.insert(label, 1);
        }
        r.numa_allocations_seen = 1;
        r.cycles.insert("bound".into(), 5);
        r.fault_hits.insert("binding".into(), 1);
        r.late_writes.insert("applied".into(), 1);
        r
    }

    #[test]
    fn a_report_that_exercised_everything_meets_the_minimums() {
        assert_eq!(full_report().unmet_minimums(), Vec::<String>::new());
    }

    #[test]
    fn each_missing_minimum_is_named() {
        let mut r = full_report();
        for kill in [
            "sigkill_leader_failover",
            "sigkill_leader_restart",
            "sigterm_leader",
            "sigkill_both",
        ] {
            r.events.remove(kill);
        }
        r.cpusets_seen = 0;
        r.late_writes.clear();
        // Drawn, but nothing to act on (no sick GPU to heal).
        r.effects.remove("device_healthy");
        let unmet = r.unmet_minimums();
        for want in [
            "event class sigterm_leader never drawn",
            "no leader kills or terminations",
            "no cpusets judged",
            "no late-landing writes",
            "event class device_healthy never took effect",
        ] {
            assert!(
                unmet.iter().any(|u| u == want),
                "{want} missing from {unmet:?}"
            );
        }
        assert_eq!(unmet.len(), 8, "{unmet:?}");
    }

    #[test]
    fn the_plan_draws_every_enabled_class_even_in_a_short_run() {
        let mut weights: Vec<u32> = vec![1; EVENT_LABELS.len()];
        weights[0] = 1000;
        weights[1] = 1000;
        weights[5] = 0;
        for seed in 1..50 {
            let schedule = plan(&mut Rng::new(seed), 60, &weights);
            assert_eq!(schedule.len(), 60);
            for (class, w) in weights.iter().enumerate() {
                assert_eq!(
                    schedule.contains(&class),
                    *w > 0,
                    "seed {seed} class {class}"
                );
            }
        }
    }
}
