//! The fragmentation benchmark (issue 39): a production GPU-sharing workload's shape replayed
//! through the extender and a modelled stock kube-scheduler, reporting how much of the
//! cluster's GPU capacity each scoring strategy allocates as demand grows past capacity.
//!
//! The cluster and the workload follow Alibaba's `cluster-trace-gpu-v2023` "openb" trace
//! (Weng et al., ATC '23; `../shared/reference/fragmentation.md`): 1,213 GPU nodes, 6,212
//! GPUs; pods drawn at random (with replacement, one seed per arrival order) from the trace's
//! pod shapes until the GPU demand that *arrived* reaches 130 % of the cluster's GPUs, each
//! tried once in arrival order (the paper's "workload inflation"). The tables below are
//! aggregates computed from the trace's CSV files (node classes by GPUs, cores and GiB; pod
//! shapes by GPU ask, cores and GiB rounded, the most common covering ≥ 95 % of each class,
//! weighted to the class's share of pods); no row of the trace is committed (it has no
//! license). `REPLAY_TRACE=<openb_pod_list_default.csv>` draws from the trace's own pods
//! instead (fetch github.com/alibaba/clusterdata, `cluster-trace-gpu-v2023/csv/`).
//!
//! Every pod goes through `device_numa_extender::ops::replay::KubeScheduler` (kube-scheduler
//! v1.37's node sampling, in-tree fit and scores, extender weight, random tie-break) and the
//! service's own filter, prioritize and bind (offline, in memory).
//!
//! Run: `cargo bench --bench trace_replay` (see BENCHMARKS.md). Environment:
//! `REPLAY_SEEDS` (default 5), `REPLAY_STRATEGIES` (default
//! `least-allocated,most-allocated,fragmentation`), `REPLAY_PERCENTAGE`
//! (`percentageOfNodesToScore`, default 0: kube-scheduler's adaptive default),
//! `REPLAY_WEIGHT` (the extender's weight, default the chart's 200), `REPLAY_ROUTE_ALL=1`
//! (send CPU-only pods to the extender too).

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};

use device_numa_extender::model::pod::Pod;
use device_numa_extender::ops::inspect::load_cluster_file;
use device_numa_extender::ops::replay::{KubeScheduler, Outcome};
use device_numa_extender::scheduler::ScoringFlags;
use device_numa_extender::scheduler::bind::OfflinePodApi;
use device_numa_extender::sync::file_source::ClusterFile;

/// GPU nodes of the trace: (GPUs, CPU cores, memory GiB, nodes).
const NODE_CLASSES: &[(i64, i64, i64, usize)] = &[
    (1, 8, 32, 19),
    (1, 8, 60, 3),
    (1, 128, 1024, 2),
    (2, 8, 60, 2),
    (2, 16, 120, 107),
    (2, 64, 256, 22),
    (2, 104, 512, 387),
    (4, 32, 128, 28),
    (4, 48, 368, 9),
    (4, 96, 384, 17),
    (8, 64, 256, 7),
    (8, 82, 336, 1),
    (8, 96, 384, 549),
    (8, 96, 768, 21),
    (8, 128, 768, 39),
];

/// A pod's GPU ask: milli-GPUs of one card (< 1000), or whole cards (multiples of 1000), or 0.
#[derive(Clone, Copy, Debug)]
struct Shape {
    gpu_milli: i64,
    cores: i64,
    gib: i64,
}

/// One pod shape of a class: (GPU milli, cores, GiB, pods of the trace).
type ShapeRow = (i64, i64, i64, u32);

/// Pod classes of the trace: (pods in the class, its shapes).
const POD_CLASSES: &[(u32, &[ShapeRow])] = &[
    // CPU only.
    (
        1088,
        &[
            (0, 12, 56, 364),
            (0, 32, 48, 284),
            (0, 8, 30, 163),
            (0, 15, 50, 120),
            (0, 16, 50, 95),
            (0, 11, 56, 11),
        ],
    ),
    // A share of one GPU.
    (
        3078,
        &[
            (810, 3, 5, 1047),
            (470, 12, 46, 388),
            (470, 8, 30, 360),
            (650, 12, 46, 237),
            (320, 4, 22, 111),
            (230, 4, 30, 84),
            (320, 4, 15, 78),
            (590, 3, 5, 75),
            (320, 8, 30, 72),
            (550, 4, 10, 72),
            (160, 4, 15, 53),
            (460, 6, 6, 51),
            (370, 4, 10, 45),
            (320, 4, 30, 43),
            (810, 4, 10, 31),
            (460, 6, 12, 29),
            (230, 4, 22, 26),
            (220, 4, 15, 24),
            (320, 1, 2, 22),
            (160, 6, 22, 20),
            (220, 8, 30, 19),
            (480, 4, 22, 18),
            (230, 8, 30, 18),
            (460, 6, 18, 18),
        ],
    ),
    // One whole GPU.
    (
        3911,
        &[
            (1000, 11, 48, 857),
            (1000, 11, 47, 534),
            (1000, 3, 5, 470),
            (1000, 19, 63, 255),
            (1000, 10, 41, 195),
            (1000, 12, 46, 161),
            (1000, 12, 24, 158),
            (1000, 16, 57, 158),
            (1000, 16, 32, 108),
            (1000, 8, 16, 104),
            (1000, 4, 24, 104),
            (1000, 12, 16, 101),
            (1000, 14, 57, 93),
            (1000, 24, 91, 84),
            (1000, 11, 76, 65),
            (1000, 8, 32, 55),
            (1000, 12, 76, 51),
            (1000, 12, 15, 44),
            (1000, 8, 33, 41),
            (1000, 4, 31, 40),
            (1000, 15, 79, 36),
            (1000, 16, 64, 33),
        ],
    ),
    (
        16,
        &[
            (2000, 16, 65, 7),
            (2000, 6, 64, 3),
            (2000, 30, 157, 3),
            (2000, 17, 42, 2),
            (2000, 14, 59, 1),
        ],
    ),
    (
        15,
        &[(4000, 32, 129, 9), (4000, 32, 128, 3), (4000, 60, 313, 3)],
    ),
    (
        44,
        &[
            (8000, 88, 320, 18),
            (8000, 64, 257, 18),
            (8000, 120, 720, 3),
            (8000, 64, 256, 3),
        ],
    ),
];

/// Where shapes are drawn from: the tables, or the trace's own pods.
enum Source {
    /// (shape, weight) with weights summing to 1.
    Tables(Vec<(Shape, f64)>),
    Trace(Vec<Shape>),
}

impl Source {
    fn load() -> Source {
        if let Ok(path) = std::env::var("REPLAY_TRACE") {
            let text = std::fs::read_to_string(&path).expect("REPLAY_TRACE readable");
            let mut lines = text.lines();
            let header: Vec<&str> = lines.next().expect("header").split(',').collect();
            let col = |n: &str| header.iter().position(|h| *h == n).expect(n);
            let (cpu, mem, num, milli) = (
                col("cpu_milli"),
                col("memory_mib"),
                col("num_gpu"),
                col("gpu_milli"),
            );
            let shapes = lines
                .map(|l| l.split(',').collect::<Vec<_>>())
                .map(|f| {
                    let n: i64 = f[num].parse().unwrap_or(0);
                    let m: i64 = f[milli].parse().unwrap_or(0);
                    Shape {
                        gpu_milli: if n == 1 && m < 1000 { m } else { n * 1000 },
                        // Whole cores and GiB, as the tables (the extender's requests).
                        cores: (f[cpu].parse::<i64>().unwrap_or(0) + 500) / 1000,
                        gib: (f[mem].parse::<i64>().unwrap_or(0) + 512) / 1024,
                    }
                })
                .collect();
            return Source::Trace(shapes);
        }
        let pods: u32 = POD_CLASSES.iter().map(|c| c.0).sum();
        let mut out = Vec::new();
        for (class_pods, shapes) in POD_CLASSES {
            let listed: u32 = shapes.iter().map(|s| s.3).sum();
            for (gpu_milli, cores, gib, n) in *shapes {
                let weight =
                    f64::from(*class_pods) / f64::from(pods) * f64::from(*n) / f64::from(listed);
                out.push((
                    Shape {
                        gpu_milli: *gpu_milli,
                        cores: *cores,
                        gib: *gib,
                    },
                    weight,
                ));
            }
        }
        Source::Tables(out)
    }

    fn draw(&self, rng: &mut Xoshiro256PlusPlus) -> Shape {
        match self {
            Source::Trace(all) => all[rng.random_range(0..all.len())],
            Source::Tables(weighted) => {
                let mut x: f64 = rng.random_range(0.0..1.0);
                for (s, w) in weighted {
                    if x < *w {
                        return *s;
                    }
                    x -= w;
                }
                weighted.last().expect("shapes").0
            }
        }
    }
}

fn cluster(seed: u64) -> (String, Vec<Arc<str>>, i64) {
    let mut classes: Vec<(i64, i64, i64)> = NODE_CLASSES
        .iter()
        .flat_map(|(g, c, m, n)| std::iter::repeat_n((*g, *c, *m), *n))
        .collect();
    // Names carry no class: kube-scheduler lists nodes by name.
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x6e6f646573);
    for i in (1..classes.len()).rev() {
        classes.swap(i, rng.random_range(0..=i));
    }
    let mut docs: Vec<Value> = Vec::new();
    let mut names = Vec::new();
    let mut gpus_total = 0;
    for (i, (gpus, cores, gib)) in classes.iter().enumerate() {
        let name = format!("openb-node-{i:04}");
        gpus_total += gpus;
        docs.push(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name},
            "status": {"allocatable": {
                "cpu": cores.to_string(), "memory": format!("{gib}Gi"), "pods": "110",
                "nvidia.com/gpu": gpus.to_string()}}
        }));
        let devices: Vec<Value> = (0..*gpus)
            .map(|m| {
                json!({"type": "gpu", "id": format!("GPU-{name}-{m}"), "minor": m, "health": true,
                "resources": {"koordinator.sh/gpu-core": "100",
                    "koordinator.sh/gpu-memory": "32Gi",
                    "koordinator.sh/gpu-memory-ratio": "100"}})
            })
            .collect();
        docs.push(json!({
            "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
            "metadata": {"name": name}, "spec": {"devices": devices}
        }));
        names.push(Arc::from(name.as_str()));
    }
    // One JSON List: a multi-document YAML file stops at 1,024 documents (the parser's budget).
    let text = serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": docs}))
        .expect("json");
    (text, names, gpus_total)
}

fn pod(i: usize, s: &Shape) -> Pod {
    let mut requests = serde_json::Map::new();
    requests.insert("cpu".into(), json!(s.cores.to_string()));
    requests.insert("memory".into(), json!(format!("{}Gi", s.gib)));
    if s.gpu_milli >= 1000 {
        requests.insert(
            "nvidia.com/gpu".into(),
            json!((s.gpu_milli / 1000).to_string()),
        );
    } else if s.gpu_milli > 0 {
        let percent = (s.gpu_milli / 10).max(1).to_string();
        requests.insert("koordinator.sh/gpu-core".into(), json!(percent));
        requests.insert("koordinator.sh/gpu-memory-ratio".into(), json!(percent));
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i:05}"), "namespace": "replay", "uid": format!("uid-{i:05}")},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}
    }))
    .expect("pod")
}

/// The GPU demand (milli-GPUs) a pod asks for, as `pod` writes it (whole percents).
fn demand(s: &Shape) -> i64 {
    if s.gpu_milli >= 1000 || s.gpu_milli == 0 {
        s.gpu_milli
    } else {
        (s.gpu_milli / 10).max(1) * 10
    }
}

struct Checkpoint {
    arrived_percent: u32,
    allocated_milli: i64,
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn replay(
    strategy: &str,
    seed: u64,
    source: &Source,
    percentage: u32,
    weight: i64,
    route_all: bool,
) -> (Vec<Checkpoint>, i64, usize) {
    let (text, names, gpus) = cluster(seed);
    let capacity = gpus * 1000;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut arrivals = Vec::new();
    let mut arrived = 0;
    while arrived < capacity * 130 / 100 {
        let s = source.draw(&mut rng);
        arrived += demand(&s);
        arrivals.push(s);
    }
    let pods: Vec<Pod> = arrivals
        .iter()
        .enumerate()
        .map(|(i, s)| pod(i, s))
        .collect();
    let file = ClusterFile::parse(&text, "replay").expect("cluster");
    let api = Arc::new(OfflinePodApi::new(pods.iter().cloned()));
    let scoring = device_numa_extender::scheduler::ScoringConfig::from_flags(&ScoringFlags {
        device_strategy: strategy,
        ..ScoringFlags::DEFAULT
    })
    .expect("strategy");
    let state = load_cluster_file(file).into_scheduler(api, scoring);
    let mut kube = KubeScheduler::new(percentage, weight, route_all);
    // The tie-break draws from its own stream, so strategies see the same arrivals.
    let mut ties = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x7469657321);
    let mut random = |n: u64| ties.random_range(0..n);
    let (mut arrived, mut allocated, mut bound) = (0i64, 0i64, 0usize);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut checkpoints = Vec::new();
    let mut next = 100u32;
    for (p, s) in pods.iter().zip(&arrivals) {
        match kube.schedule(&state, &names, p, &mut random).await {
            Outcome::Bound(_) => {
                allocated += demand(s);
                bound += 1;
            }
            Outcome::Unschedulable(reason) => {
                let class = if s.gpu_milli == 0 {
                    "cpu-only"
                } else if s.gpu_milli < 1000 {
                    "share"
                } else {
                    "whole"
                };
                *reasons.entry(format!("{class}: {reason}")).or_default() += 1;
            }
        }
        arrived += demand(s);
        while next <= 130 && arrived * 100 >= capacity * i64::from(next) {
            checkpoints.push(Checkpoint {
                arrived_percent: next,
                allocated_milli: allocated,
            });
            next += 10;
        }
    }
    // The ledger must agree with the count: every allocated milli-GPU is held on some card.
    let held = ledger_gpu_milli(&state);
    assert_eq!(
        held, allocated,
        "{strategy} seed {seed}: ledger holds {held}, placements {allocated}"
    );
    if std::env::var("REPLAY_REASONS").is_ok_and(|v| v == "1") {
        for (reason, n) in &reasons {
            println!("    {n:>6} {reason}");
        }
    }
    (checkpoints, capacity, bound)
}

/// GPU capacity the caches record as held, summed over every card (milli-GPUs, from the
/// gpu-core percent every allocation carries).
fn ledger_gpu_milli(state: &device_numa_extender::scheduler::Scheduler) -> i64 {
    let report = device_numa_extender::cluster::report::cluster_report(&state.cluster, &[]);
    report.summary.gpu_core_percent.used * 10
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let seeds: u64 = env("REPLAY_SEEDS", 5);
    let percentage: u32 = env("REPLAY_PERCENTAGE", 0);
    let weight: i64 = env("REPLAY_WEIGHT", 200);
    let route_all = std::env::var("REPLAY_ROUTE_ALL").is_ok_and(|v| v == "1");
    let strategies: String = env(
        "REPLAY_STRATEGIES",
        "least-allocated,most-allocated,fragmentation".to_string(),
    );
    let source = Source::load();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    println!(
        "trace replay: {} · percentageOfNodesToScore {} · extender weight {weight} · route all {route_all}",
        if matches!(source, Source::Trace(_)) {
            "the trace's own pods"
        } else {
            "the trace's shape tables"
        },
        if percentage == 0 {
            "default (adaptive)".to_string()
        } else {
            percentage.to_string()
        }
    );
    // strategy -> percent -> per-seed allocation ratio
    let mut table: BTreeMap<String, BTreeMap<u32, Vec<(f64, f64)>>> = BTreeMap::new();
    for strategy in strategies.split(',').map(str::trim) {
        for seed in 0..seeds {
            let started = std::time::Instant::now();
            let (points, capacity, bound) = runtime.block_on(replay(
                strategy, seed, &source, percentage, weight, route_all,
            ));
            let line: Vec<String> = points
                .iter()
                .map(|c| {
                    let ratio = c.allocated_milli as f64 / capacity as f64;
                    let idle = (capacity - c.allocated_milli) as f64 / 1000.0;
                    table
                        .entry(strategy.to_string())
                        .or_default()
                        .entry(c.arrived_percent)
                        .or_default()
                        .push((ratio, idle));
                    format!(
                        "{}%: {:.1}% ({:.0} idle)",
                        c.arrived_percent,
                        ratio * 100.0,
                        idle
                    )
                })
                .collect();
            println!(
                "  {strategy:<16} seed {seed}: {} · {bound} pods bound · {:.1} s",
                line.join(" · "),
                started.elapsed().as_secs_f64()
            );
        }
    }
    println!();
    println!(
        "| strategy | arrived | GPUs allocated (mean of seeds) | idle GPUs (mean) | per seed |"
    );
    println!("|---|---|---|---|---|");
    for (strategy, by_percent) in &table {
        for (percent, runs) in by_percent {
            let n = runs.len() as f64;
            let ratio = runs.iter().map(|r| r.0).sum::<f64>() / n;
            let idle = runs.iter().map(|r| r.1).sum::<f64>() / n;
            let each: Vec<String> = runs.iter().map(|r| format!("{:.1}", r.0 * 100.0)).collect();
            println!(
                "| {strategy} | {percent} % | {:.1} % | {idle:.0} | {} |",
                ratio * 100.0,
                each.join(", ")
            );
        }
    }
}
