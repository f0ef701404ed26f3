//! HTTP load over loopback: the real service (started in-process from a generated cluster file,
//! 5,000 nodes × 8 GPUs, ~30 pods per node) and a baseline axum server that only decodes the
//! same request with the same input path and writes the same response, both driven by a
//! keep-alive hyper client in this process.
//!
//! Reports
//! - filter + prioritize latency at 5,000 nodes, names mode, one pod at a time over one
//!   connection (client-side timing: send → last response byte; plus the server-side mean from
//!   `dne_http_request_duration_seconds` sum/count over the same requests);
//! - per verb (filter, prioritize), at 1,000 and 5,000 candidate nodes, each placement case
//!   against the pass-through request (`no_devices`: same client, same body size) of the same
//!   run, p50 and p99; with a warm verdict memo (the pod shape repeats, as for the replicas of
//!   one Job) and a cold one (emptied before every request: each is its shape's first);
//! - filter throughput at 1,000 candidate nodes with several keep-alive connections for a fixed
//!   time;
//! - ranking: per pod, filter + prioritize under `--ranking=prioritize` against filter alone
//!   under `--ranking=filter` (a second service on the same cluster), at 5,000 candidates;
//! - scaling: on a 20,000-node cluster, the per-node cost ((case − pass-through) / nodes, p50)
//!   at 1,000, 5,000 and 20,000 candidates, cold memo (each request decides its shape's
//!   distinct node states, then looks the rest up) and warm (the lookup alone); and the same
//!   excess split into the cost per node added between sizes and a fixed part per request;
//! - distinct: the per-verb tables at 5,000 candidates on a cluster where no two nodes share a
//!   state, so the within-request memo (one decision per distinct node state) cannot help:
//!   cold, every node is decided; warm, every node is recalled;
//! - nowhere: filter for a pod every node refuses (each refusal explained in the pod's terms,
//!   `scheduler::explain`) against the pass-through and a fitting share at 5,000 candidates,
//!   and the explanation alone timed in-process over the same nodes.
//!
//! Bounded: a fixed request count (and a time cap) per phase, loopback only.
//! Run: `cargo bench --bench http_load` (see BENCHMARKS.md). `HTTP_LOAD_PHASES` (a comma
//! list of `latency`, `verbs`, `throughput`, `ranking`, `scaling`, `distinct`, `nowhere`; default all) runs only
//! those phases.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use common::{Case, PerNodeSplit, extender_body, ms, slashed, summarize};
use device_numa_extender::app::Service;
use device_numa_extender::extender::input::{decode, read_body};
use device_numa_extender::model::wire::{ExtenderArgsRef, ExtenderFilterResult, HostPriority};
use device_numa_extender::scheduler::{explain, relative, verbs};

const NODES: usize = 5_000;
const THROUGHPUT_NODES: usize = 1_000;
/// Sequential filter+prioritize pairs per case and server.
const LATENCY_PAIRS: usize = 400;
/// Cap on each latency phase, whatever the machine does.
const LATENCY_CAP: Duration = Duration::from_secs(30);
const THROUGHPUT_TIME: Duration = Duration::from_secs(5);
const THROUGHPUT_CONNECTIONS: usize = 4;
/// Per-verb ratios: requests per case and verb, interleaved one request at a time over every
/// case and verb.
const VERB_REQUESTS: usize = 300;
/// The scaling row's cluster and candidate counts.
const SCALING_CLUSTER: usize = 20_000;
const SCALING_SIZES: [usize; 3] = [1_000, 5_000, 20_000];
const SCALING_CASES: [Case; 4] = [
    Case::NoDevices,
    Case::SharedGpu,
    Case::Cpuset,
    Case::GpuCpuset,
];

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The binary's allocator, so the service in this process allocates as it does in production.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Whether `HTTP_LOAD_PHASES` selects `phase` (every phase when unset).
fn phase(phase: &str) -> bool {
    std::env::var("HTTP_LOAD_PHASES").map_or(true, |v| v.split(',').any(|p| p.trim() == phase))
}

/// The baseline server's answers, keyed by the `x-bench-case` header: the very responses the
/// service gives for that case, computed once (borrowing from the bodies, which live as long as
/// the bench).
#[derive(Default)]
struct Canned {
    filter: HashMap<String, Arc<ExtenderFilterResult<'static>>>,
    prioritize: HashMap<String, Arc<Vec<HostPriority<'static>>>>,
}

fn case_of(headers: &HeaderMap) -> String {
    headers
        .get("x-bench-case")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

async fn baseline_filter(State(c): State<Arc<Canned>>, headers: HeaderMap, body: Body) -> Response {
    // The service's own decoder, borrowing from the body as the service does.
    let bytes = match read_body(&headers, body, 16 << 20).await {
        Ok(b) => b,
        Err(bad) => return bad.into_response(),
    };
    let args: ExtenderArgsRef = match decode(&bytes) {
        Ok(a) => a,
        Err(bad) => return bad.into_response(),
    };
    std::hint::black_box(&args);
    axum::Json(c.filter[&case_of(&headers)].clone()).into_response()
}

async fn baseline_prioritize(
    State(c): State<Arc<Canned>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // The service's own decoder, borrowing from the body as the service does.
    let bytes = match read_body(&headers, body, 16 << 20).await {
        Ok(b) => b,
        Err(bad) => return bad.into_response(),
    };
    let args: ExtenderArgsRef = match decode(&bytes) {
        Ok(a) => a,
        Err(bad) => return bad.into_response(),
    };
    std::hint::black_box(&args);
    axum::Json(c.prioritize[&case_of(&headers)].clone()).into_response()
}

async fn start_baseline(canned: Canned) -> SocketAddr {
    let app = Router::new()
        .route("/filter", routing::post(baseline_filter))
        .route("/prioritize", routing::post(baseline_prioritize))
        .with_state(Arc::new(canned));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// POSTs and reads the whole answer; returns its status and size.
async fn post(client: &HttpClient, url: &str, case: &str, body: &Bytes) -> (u16, usize) {
    let req = hyper::Request::post(url)
        .header("content-type", "application/json")
        .header("x-bench-case", case)
        .body(Full::new(body.clone()))
        .expect("request");
    let resp = client.request(req).await.expect("response");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, bytes.len())
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .build_http()
}

/// Server-side (count, sum seconds) of `dne_http_request_duration_seconds{verb, outcome="ok"}`.
fn server_metric(state: &device_numa_extender::scheduler::Scheduler, verb: &str) -> (u64, f64) {
    let h = state
        .metrics
        .request_duration
        .with_label_values(&[verb, "ok"]);
    (h.get_sample_count(), h.get_sample_sum())
}

struct Target {
    name: &'static str,
    base: String,
}

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        // `cargo test --benches`: nothing quick to check here.
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    println!("== http_load: service vs parse+write baseline, loopback, keep-alive ==");
    println!("{}", common::machine());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.json");
    let t = Instant::now();
    std::fs::write(&path, common::cluster(NODES, true).to_list_json()).expect("write cluster");
    let path_str = path.to_str().expect("utf-8 path");
    let args = support::service::serve_args(&["--cluster-file", path_str]);
    let svc = Service::start(args, None).await.expect("service starts");
    let http = support::service::Http::new(svc.addr);
    http.wait_ready(Duration::from_secs(120)).await;
    println!(
        "service ready at {} with {NODES} nodes x 8 GPUs, {} pods/node ({:.1?} to generate, load and sync)",
        svc.addr,
        common::PODS_PER_NODE,
        t.elapsed()
    );

    // Canned baseline answers: exactly what the service answers for each case.
    let mut canned = Canned::default();
    let mut bodies = HashMap::new();
    for (nodes, cases) in [
        (NODES, &Case::ALL[..]),
        (THROUGHPUT_NODES, &[Case::SharedGpu][..]),
    ] {
        for case in cases {
            let key = format!("{}@{nodes}", case.label());
            let body: &'static [u8] = Box::leak(extender_body(*case, nodes).into_boxed_slice());
            let args = || decode::<ExtenderArgsRef>(body).expect("body");
            canned.prioritize.insert(
                key.clone(),
                Arc::new(relative::relative_to_lowest(verbs::prioritize(
                    &svc.state.scheduler,
                    args(),
                ))),
            );
            canned.filter.insert(
                key.clone(),
                Arc::new(verbs::filter(&svc.state.scheduler, args())),
            );
            bodies.insert(key, Bytes::from_static(body));
        }
    }
    let baseline_addr = start_baseline(canned).await;
    let targets = [
        Target {
            name: "service",
            base: format!("http://{}", svc.addr),
        },
        Target {
            name: "baseline",
            base: format!("http://{baseline_addr}"),
        },
    ];
    let client = client();

    if phase("latency") {
        latency_phase(&svc, &client, &targets, &bodies).await;
    }
    if phase("verbs") {
        println!(
            "\n-- per verb, each case against the pass-through request ({}) of this run: service, 1 connection, sequential, client-side --",
            Case::NoDevices.label()
        );
        for nodes in [THROUGHPUT_NODES, NODES] {
            for case in Case::ALL {
                bodies
                    .entry(format!("{}@{nodes}", case.label()))
                    .or_insert_with(|| Bytes::from(extender_body(case, nodes)));
            }
            for memo in [Memo::Warm, Memo::Cold(&svc.state.scheduler)] {
                let table =
                    per_verb(&client, &targets[0].base, &bodies, nodes, &Case::ALL, memo).await;
                print_per_verb(nodes, memo, &table);
                if let Memo::Warm = memo {
                    print_memo_bytes(&svc.state.scheduler);
                }
            }
        }
        print_memo(&svc.state.scheduler);
    }
    if phase("throughput") {
        throughput_phase(&client, &targets, &bodies).await;
    }
    if phase("ranking") {
        ranking_phase(&client, &targets[0], path_str, &bodies).await;
    }
    if phase("nowhere") {
        nowhere(&svc, &client, &targets[0].base, &mut bodies).await;
    }
    svc.shutdown().await.expect("shutdown");
    drop(dir);
    if phase("scaling") {
        scaling(&client).await;
    }
    if phase("distinct") {
        distinct(&client).await;
    }
}

/// A pod refused by every node: what its explained refusals cost over HTTP against the
/// pass-through and a share that fits, and the explanations alone, in-process.
async fn nowhere(
    svc: &Service,
    client: &HttpClient,
    base: &str,
    bodies: &mut HashMap<String, Bytes>,
) {
    let cases = [Case::NoDevices, Case::SharedGpu, Case::FitsNowhere];
    for case in cases {
        bodies
            .entry(format!("{}@{NODES}", case.label()))
            .or_insert_with(|| Bytes::from(extender_body(case, NODES)));
    }
    println!(
        "\n-- nowhere: a pod every node refuses, its {NODES} refusals explained (service, 1 connection, client-side) --"
    );
    let table = per_verb(client, base, bodies, NODES, &cases, Memo::Warm).await;
    print_per_verb(NODES, Memo::Warm, &table);
    // The explanations alone: each refused node read once and its reason put in the pod's
    // terms, as filter does when no node passes.
    let state = &svc.state.scheduler;
    let body = extender_body(Case::FitsNowhere, NODES);
    let args = decode::<ExtenderArgsRef>(&body).expect("body");
    let pod = args.pod.clone().expect("pod");
    let needs = state.pod_needs(&pod).expect("needs");
    let answer = verbs::filter(state, decode::<ExtenderArgsRef>(&body).expect("body"));
    let refused: Vec<String> = answer
        .failed_nodes
        .iter()
        .chain(answer.failed_and_unresolvable_nodes.iter())
        .flatten()
        .map(|(n, _)| n.to_string())
        .collect();
    let distinct: std::collections::BTreeSet<String> = answer
        .failed_nodes
        .iter()
        .chain(answer.failed_and_unresolvable_nodes.iter())
        .flatten()
        .map(|(_, r)| r.to_string())
        .collect();
    // The reason filter found (from the memo or the snapshot), as `explain` receives it.
    let reason = device_numa_extender::placement::FitReason::InsufficientDevices(
        device_numa_extender::model::device::DeviceType::Gpu,
    );
    let mut took = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        for n in &refused {
            let entry = state.cluster.node(n);
            let guard = entry.as_ref().map(|e| e.read());
            let words = explain::explain(guard.as_deref(), &needs, &reason);
            std::hint::black_box(&words);
        }
        took.push(t.elapsed());
    }
    let s = summarize(&mut took);
    println!(
        "  explanations alone, in-process, over {} refused nodes ({} distinct reasons in the answer): p50 {} ({:.2} us per node)",
        refused.len(),
        distinct.len(),
        ms(s.p50),
        s.p50.as_secs_f64() * 1e6 / refused.len().max(1) as f64
    );
}

/// The service on `cluster` (a `--cluster-file` in a temporary directory, kept as long as the
/// returned guard), once `/readyz` reports 200.
async fn serve_cluster(cluster: &common::Cluster) -> (Service, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.json");
    std::fs::write(&path, cluster.to_list_json()).expect("write cluster");
    let args =
        support::service::serve_args(&["--cluster-file", path.to_str().expect("utf-8 path")]);
    let svc = Service::start(args, None).await.expect("service starts");
    support::service::Http::new(svc.addr)
        .wait_ready(Duration::from_secs(300))
        .await;
    (svc, dir)
}

/// The per-verb table at `NODES` candidates on a cluster where no two nodes share a state
/// (`common::cluster_of_distinct_holders`): cold, every node is decided; warm, every node is
/// recalled from its per-node slot.
async fn distinct(client: &HttpClient) {
    println!(
        "\n-- distinct nodes: {NODES}-node cluster, no two nodes alike (the within-request memo cannot help), per verb against the pass-through request of this run --"
    );
    let (svc, _dir) = serve_cluster(&common::cluster_of_distinct_holders(NODES)).await;
    let base = format!("http://{}", svc.addr);
    let bodies: HashMap<String, Bytes> = Case::ALL
        .iter()
        .map(|case| {
            (
                format!("{}@{NODES}", case.label()),
                Bytes::from(extender_body(*case, NODES)),
            )
        })
        .collect();
    for memo in [Memo::Warm, Memo::Cold(&svc.state.scheduler)] {
        let table = per_verb(client, &base, &bodies, NODES, &Case::ALL, memo).await;
        print_per_verb(NODES, memo, &table);
        if let Memo::Warm = memo {
            print_memo_bytes(&svc.state.scheduler);
        }
    }
    print_memo(&svc.state.scheduler);
    svc.shutdown().await.expect("shutdown");
}

/// How many candidate nodes the service decided and how many its per-request memo answered
/// (`dne_read_decisions_total`, every request so far).
/// What the verbs' memos keep between requests (`dne_read_memo_bytes`), after a warm table:
/// one memo per placement case's pod shape.
fn print_memo_bytes(state: &device_numa_extender::scheduler::Scheduler) {
    println!(
        "  memos kept after the warm table: filter {:.1} KiB, prioritize {:.1} KiB, fragmentation {:.1} KiB",
        state.memos.filter.bytes() as f64 / 1024.0,
        state.memos.prioritize.bytes() as f64 / 1024.0,
        state.memos.fragmentation.bytes() as f64 / 1024.0
    );
}

fn print_memo(state: &device_numa_extender::scheduler::Scheduler) {
    for verb in ["filter", "prioritize", "fragmentation"] {
        let count = |how: &str| {
            state
                .metrics
                .read_decisions
                .with_label_values(&[verb, how])
                .get()
        };
        println!(
            "  {verb}: candidate nodes decided {}, answered by the memo {}",
            count("decided"),
            count("memo")
        );
    }
}

/// Filter+prioritize pairs per case, service against the baseline server.
async fn latency_phase(
    svc: &Service,
    client: &HttpClient,
    targets: &[Target; 2],
    bodies: &HashMap<String, Bytes>,
) {
    println!(
        "\n-- filter+prioritize latency, {NODES} nodes, names mode, 1 connection, sequential; client-side timing (send -> last byte, both verbs) --"
    );
    // (case, service p50, service p99): each placement case against the pass-through one.
    let mut service_percentiles: Vec<(Case, Duration, Duration)> = Vec::new();
    for case in Case::ALL {
        let key = format!("{}@{NODES}", case.label());
        let body = &bodies[&key];
        let mut results = Vec::new();
        let before = (
            server_metric(&svc.state.scheduler, "filter"),
            server_metric(&svc.state.scheduler, "prioritize"),
        );
        // Alternate blocks so load drifts on the shared machine hit both servers alike.
        let mut samples: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
        let mut sizes = (0, 0);
        for _ in 0..4 {
            for (i, target) in targets.iter().enumerate() {
                let (s, f, p) = latency(client, target, &key, body, LATENCY_PAIRS / 4).await;
                samples[i].extend(s);
                sizes = (f, p);
            }
        }
        let after = (
            server_metric(&svc.state.scheduler, "filter"),
            server_metric(&svc.state.scheduler, "prioritize"),
        );
        for (i, target) in targets.iter().enumerate() {
            results.push((target.name, summarize(&mut samples[i])));
        }
        let mean = |a: (u64, f64), b: (u64, f64)| {
            Duration::from_secs_f64((a.1 - b.1) / ((a.0 - b.0) as f64).max(1.0))
        };
        let (filter_mean, prio_mean) = (mean(after.0, before.0), mean(after.1, before.1));
        println!(
            "{} (body {} B, filter answer {} B, prioritize answer {} B)",
            case.label(),
            body.len(),
            sizes.0,
            sizes.1
        );
        for (name, s) in &results {
            println!("  {name:<8} {s}");
        }
        let (w, b) = (&results[0].1, &results[1].1);
        service_percentiles.push((case, w.p50, w.p99));
        println!(
            "  ratio    mean {:.2}x  p50 {:.2}x  p99 {:.2}x\n  service-side mean (dne_http_request_duration_seconds sum/count): filter {}, prioritize {}",
            w.mean.as_secs_f64() / b.mean.as_secs_f64(),
            w.p50.as_secs_f64() / b.p50.as_secs_f64(),
            w.p99.as_secs_f64() / b.p99.as_secs_f64(),
            ms(filter_mean),
            ms(prio_mean),
        );
    }

    if let Some(&(_, pass_p50, pass_p99)) = service_percentiles
        .iter()
        .find(|(c, _, _)| matches!(c, Case::NoDevices))
    {
        println!(
            "\n-- each case against the pass-through request ({}, no placement needs) of this run, service side --",
            Case::NoDevices.label()
        );
        for (case, p50, p99) in &service_percentiles {
            println!(
                "  {:<14} p50 {:.2}x  p99 {:.2}x",
                case.label(),
                p50.as_secs_f64() / pass_p50.as_secs_f64(),
                p99.as_secs_f64() / pass_p99.as_secs_f64()
            );
        }
    }
}

/// `--ranking=filter` against the default `--ranking=prioritize`, as kube-scheduler calls them
/// per pod: filter then prioritize on the default service (over the same candidates, as
/// [`latency`]), against filter alone on a second service started with `--ranking=filter` on
/// the same cluster file; client-side, alternating blocks.
async fn ranking_phase(
    client: &HttpClient,
    by_prioritize: &Target,
    cluster_file: &str,
    bodies: &HashMap<String, Bytes>,
) {
    println!(
        "\n-- ranking: per pod, filter + prioritize (--ranking=prioritize) against filter alone (--ranking=filter), {NODES} candidates, 1 connection, client-side --"
    );
    let args =
        support::service::serve_args(&["--cluster-file", cluster_file, "--ranking", "filter"]);
    let ranked = Service::start(args, None).await.expect("service starts");
    support::service::Http::new(ranked.addr)
        .wait_ready(Duration::from_secs(120))
        .await;
    let by_filter = Target {
        name: "ranked",
        base: format!("http://{}", ranked.addr),
    };
    let filter_url = format!("{}/filter", by_filter.base);
    for case in Case::ALL {
        let key = format!("{}@{NODES}", case.label());
        let body = &bodies[&key];
        let mut pairs = Vec::new();
        let mut alone = Vec::new();
        let mut answer = 0;
        for _ in 0..4 {
            pairs.extend(
                latency(client, by_prioritize, &key, body, LATENCY_PAIRS / 4)
                    .await
                    .0,
            );
            let cap = Instant::now() + LATENCY_CAP;
            for i in 0..(LATENCY_PAIRS / 4) + LATENCY_PAIRS / 40 {
                let t = Instant::now();
                let (status, size) = post(client, &filter_url, &key, body).await;
                let took = t.elapsed();
                assert_eq!(status, 200, "the ranked service answered an error");
                answer = size;
                if i >= LATENCY_PAIRS / 40 {
                    alone.push(took);
                }
                if Instant::now() > cap {
                    break;
                }
            }
        }
        let (p, f) = (summarize(&mut pairs), summarize(&mut alone));
        println!(
            "{} (ranked filter answer {answer} B)\n  filter+prioritize {p}\n  ranked filter     {f}\n  ratio    mean {:.2}x  p50 {:.2}x  p99 {:.2}x",
            case.label(),
            f.mean.as_secs_f64() / p.mean.as_secs_f64(),
            f.p50.as_secs_f64() / p.p50.as_secs_f64(),
            f.p99.as_secs_f64() / p.p99.as_secs_f64(),
        );
    }
    ranked.shutdown().await.expect("shutdown");
}

/// Filter throughput at `THROUGHPUT_NODES` candidates, service against the baseline server.
async fn throughput_phase(
    client: &HttpClient,
    targets: &[Target; 2],
    bodies: &HashMap<String, Bytes>,
) {
    println!(
        "\n-- filter throughput, {THROUGHPUT_NODES} candidate nodes, shared-GPU pod, {THROUGHPUT_CONNECTIONS} keep-alive connections, {THROUGHPUT_TIME:?} each, client in the same process --"
    );
    let key = format!("{}@{THROUGHPUT_NODES}", Case::SharedGpu.label());
    let body = &bodies[&key];
    let mut rates = [Vec::new(), Vec::new()];
    for _ in 0..2 {
        for (i, target) in targets.iter().enumerate() {
            let r = throughput(client, target, &key, body).await;
            rates[i].push(r);
        }
    }
    for (i, target) in targets.iter().enumerate() {
        let best = rates[i].iter().copied().fold(0.0, f64::max);
        println!(
            "  {:<8} {:>8.0} req/s (runs: {})",
            target.name,
            best,
            rates[i]
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let svc_best = rates[0].iter().copied().fold(0.0, f64::max);
    let base_best = rates[1].iter().copied().fold(0.0, f64::max);
    println!("  service/baseline throughput {:.2}", svc_best / base_best);
}

/// Per (case, verb) latency summaries of one candidate count.
type VerbTable = Vec<(Case, &'static str, common::Summary)>;

/// What the service's verdict memo (`extender::memo`) may know when a request arrives.
#[derive(Clone, Copy)]
enum Memo<'a> {
    /// What earlier requests of the same pod left (every request here repeats its case's pod,
    /// as kube-scheduler does for the replicas of one Job or Deployment).
    Warm,
    /// Nothing: the caches are emptied before every request (outside its timing), so each is
    /// its pod shape's first and only the within-request memo helps.
    Cold(&'a device_numa_extender::scheduler::Scheduler),
}

impl Memo<'_> {
    fn label(self) -> &'static str {
        match self {
            Memo::Warm => "warm memo: the same pod shape as the requests before",
            Memo::Cold(_) => "cold memo: every request a new pod shape",
        }
    }
}

/// Per (case, verb): the client-side latencies of `VERB_REQUESTS` requests
/// over `nodes` candidates, after a warm-up. Interleaved one request at a time (every case and
/// verb, then again, each round rotated by one), so a drift in the machine's load, which on a
/// shared machine comes and goes within seconds, hits every case alike, and no case always
/// follows the same one.
async fn per_verb(
    client: &HttpClient,
    base: &str,
    bodies: &HashMap<String, Bytes>,
    nodes: usize,
    cases: &[Case],
    memo: Memo<'_>,
) -> VerbTable {
    let verbs = ["filter", "prioritize"];
    let requests: Vec<(usize, usize, String, String)> = cases
        .iter()
        .enumerate()
        .flat_map(|(ci, case)| {
            verbs.iter().enumerate().map(move |(vi, verb)| {
                (
                    ci,
                    vi,
                    format!("{}@{nodes}", case.label()),
                    format!("{base}/{verb}"),
                )
            })
        })
        .collect();
    // Warm the connection, allocator and caches.
    for _ in 0..5 {
        for (_, _, key, url) in &requests {
            let (status, _) = post(client, url, key, &bodies[key]).await;
            assert_eq!(status, 200, "{url} {key}");
        }
    }
    let mut samples: HashMap<(usize, usize), Vec<Duration>> = HashMap::new();
    for round in 0..VERB_REQUESTS {
        // Each round starts one request further on, so every request follows every other
        // equally often: what a request leaves behind (its answer's buffers, the allocator's
        // free lists, the caches) weighs on the next, and a fixed order gave each case a fixed
        // predecessor (a case's ratio moved by up to 0.1 with its place in the order).
        for k in 0..requests.len() {
            let (ci, vi, key, url) = &requests[(round + k) % requests.len()];
            if let Memo::Cold(state) = memo {
                state.memos.clear();
            }
            let t = Instant::now();
            let (status, _) = post(client, url, key, &bodies[key]).await;
            let took = t.elapsed();
            assert_eq!(status, 200, "{url} {key}");
            samples.entry((*ci, *vi)).or_default().push(took);
        }
    }
    let mut out = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        for (vi, verb) in verbs.iter().enumerate() {
            let s = samples.get_mut(&(ci, vi)).expect("samples");
            out.push((*case, *verb, summarize(s)));
        }
    }
    out
}

fn print_per_verb(nodes: usize, memo: Memo<'_>, table: &VerbTable) {
    println!("{nodes} nodes, {}:", memo.label());
    for verb in ["filter", "prioritize"] {
        let pass = table
            .iter()
            .find(|(c, v, _)| matches!(c, Case::NoDevices) && *v == verb)
            .map(|(_, _, s)| (s.p50, s.p99))
            .expect("pass-through case measured");
        for (case, _, s) in table.iter().filter(|(_, v, _)| *v == verb) {
            println!(
                "  {verb:<10} {:<14} p50 {:>10} p99 {:>10}   vs pass-through: p50 {:.2}x  p99 {:.2}x",
                case.label(),
                ms(s.p50),
                ms(s.p99),
                s.p50.as_secs_f64() / pass.0.as_secs_f64(),
                s.p99.as_secs_f64() / pass.1.as_secs_f64(),
            );
        }
    }
}

/// The per-node cost at 1,000, 5,000 and 20,000 candidates on one 20,000-node cluster (GPU
/// and cpuset holders only: the same summaries as the full synthetic cluster).
async fn scaling(client: &HttpClient) {
    println!(
        "\n-- scaling: {SCALING_CLUSTER}-node cluster, per-node cost = (case p50 - pass-through p50) / candidates, per verb --"
    );
    let t = Instant::now();
    let (svc, _dir) = serve_cluster(&common::cluster_of_holders(SCALING_CLUSTER)).await;
    println!(
        "service ready with {SCALING_CLUSTER} nodes in {:.1?}",
        t.elapsed()
    );
    let base = format!("http://{}", svc.addr);
    let mut bodies = HashMap::new();
    for nodes in SCALING_SIZES {
        for case in SCALING_CASES {
            bodies.insert(
                format!("{}@{nodes}", case.label()),
                Bytes::from(extender_body(case, nodes)),
            );
        }
    }
    // Cold: each request decides its shape's distinct node states (a fixed number, whatever
    // the candidate count); warm: every node is a memo hit, so this is the lookup alone.
    for memo in [Memo::Cold(&svc.state.scheduler), Memo::Warm] {
        let mut rows: Vec<(usize, VerbTable)> = Vec::new();
        for nodes in SCALING_SIZES {
            rows.push((
                nodes,
                per_verb(client, &base, &bodies, nodes, &SCALING_CASES, memo).await,
            ));
        }
        println!("{}:", memo.label());
        for verb in ["filter", "prioritize"] {
            for case in SCALING_CASES
                .iter()
                .filter(|c| !matches!(c, Case::NoDevices))
            {
                // Case p50 − pass-through p50 at each size, in ns.
                let excess_ns: Vec<f64> = rows
                    .iter()
                    .map(|(_, table)| {
                        let p50 = |c: &Case| {
                            table
                                .iter()
                                .find(|(k, v, _)| k.label() == c.label() && *v == verb)
                                .map(|(_, _, s)| s.p50.as_secs_f64())
                                .expect("measured")
                        };
                        (p50(case) - p50(&Case::NoDevices)) * 1e9
                    })
                    .collect();
                let split = PerNodeSplit::new(&SCALING_SIZES, &excess_ns);
                println!(
                    "  {verb:<10} {:<14} ns/node at {}: {}   (max deviation from their mean {:.0}%)",
                    case.label(),
                    slashed(SCALING_SIZES.iter().map(|n| n.to_string())),
                    slashed(split.per_node.iter().map(|c| format!("{c:.0}"))),
                    split.spread * 100.0
                );
                // The same excess split into a per-request part and a per-node part: the
                // cost per node added between two sizes, and what it leaves at 1,000 nodes.
                // A request's fixed work (its decisions) weighs on the average above at
                // small sizes; a superlinear term would show here as a rising slope.
                println!(
                    "  {:<25} marginal ns/node {}: {}   (fixed per request ~{:.0} us)",
                    "",
                    slashed(
                        SCALING_SIZES
                            .windows(2)
                            .map(|w| format!("{}->{}", w[0], w[1]))
                    ),
                    slashed(split.added.iter().map(|c| format!("{c:.0}"))),
                    split.fixed_us,
                );
            }
        }
        for (nodes, table) in &rows {
            print_per_verb(*nodes, memo, table);
        }
    }
    svc.shutdown().await.expect("shutdown");
}

/// One pod at a time over one keep-alive connection: filter, then prioritize. `key` names the
/// case for the baseline server. Returns the pair timings and the answer sizes.
async fn latency(
    client: &HttpClient,
    target: &Target,
    key: &str,
    body: &Bytes,
    pairs: usize,
) -> (Vec<Duration>, usize, usize) {
    let filter_url = format!("{}/filter", target.base);
    let prio_url = format!("{}/prioritize", target.base);
    let mut out = Vec::with_capacity(pairs);
    let (mut fsize, mut psize) = (0, 0);
    let cap = Instant::now() + LATENCY_CAP;
    for i in 0..pairs + pairs / 10 {
        let t = Instant::now();
        let (s1, n1) = post(client, &filter_url, key, body).await;
        let (s2, n2) = post(client, &prio_url, key, body).await;
        let took = t.elapsed();
        assert_eq!((s1, s2), (200, 200), "{} answered an error", target.name);
        (fsize, psize) = (n1, n2);
        // The first tenth warms the connection, allocator and caches.
        if i >= pairs / 10 {
            out.push(took);
        }
        if Instant::now() > cap {
            break;
        }
    }
    (out, fsize, psize)
}

/// Closed-loop clients on `THROUGHPUT_CONNECTIONS` connections sending filter for
/// `THROUGHPUT_TIME`, after one warm-up request each; returns requests/s.
async fn throughput(client: &HttpClient, target: &Target, key: &str, body: &Bytes) -> f64 {
    let url = format!("{}/filter", target.base);
    let key: Arc<str> = Arc::from(key);
    let done = Arc::new(AtomicU64::new(0));
    for _ in 0..THROUGHPUT_CONNECTIONS {
        post(client, &url, &key, body).await;
    }
    let started = Instant::now();
    let deadline = started + THROUGHPUT_TIME;
    let tasks: Vec<_> = (0..THROUGHPUT_CONNECTIONS)
        .map(|_| {
            let (c, u, b, k, done) = (
                client.clone(),
                url.clone(),
                body.clone(),
                key.clone(),
                done.clone(),
            );
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let (status, _) = post(&c, &u, &k, &b).await;
                    assert_eq!(status, 200);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("load task");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
