//! Bootstrap: a fake API server (in this process, served on 127.0.0.1) holding 5,000 Nodes,
//! 150,000 assigned pods (30 per node, ~3 per node holding GPUs by annotation), 5,000 Devices
//! (8 GPUs each) and 5,000 NodeResourceTopologies. Each phase runs in a child process of this
//! binary (re-executed with `--phase`), talking to the fake server over loopback with a
//! kubeconfig, so its time and peak RSS (`VmHWM`) are its own:
//!
//! - `baseline`: list every kind with `kube::Api::list`, 500 per page, into the slim model types
//!   (all four kinds concurrently, as the service's watchers run; pods with the same
//!   assigned-pod field selector);
//! - `service`: `Service::start` to the first `/readyz` 200.
//!
//! `BOOTSTRAP_DRA=1` adds 5,000 ResourceSlices and 50,000 ResourceClaims (`common::dra_objects`);
//! the `baseline` phase does not list them, so compare the service phase across the two runs.
//! Phases alternate for `ROUNDS` rounds; the report takes the best time per phase and the largest
//! peak RSS. Run: `cargo bench --bench bootstrap` (see BENCHMARKS.md).

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

/// The binary's allocator (`src/main.rs`), so the library allocates here as it does in
/// production.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use device_numa_extender::app::Service;
use device_numa_extender::model::device::Device;
use device_numa_extender::model::node::Node;
use device_numa_extender::model::nrt::{NodeResourceTopology, NrtVersion};
use device_numa_extender::model::pod::Pod;
use device_numa_extender::sync::kube_source::ASSIGNED_POD_SELECTOR;
use kube::api::{Api, ListParams};
use serde::de::DeserializeOwned;
use support::{FakeApiServer, Kind};

const NODES: usize = 5_000;
const ROUNDS: usize = 3;
const PAGE: u32 = 500;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let Some(phase) = arg("--phase") {
        let kubeconfig = PathBuf::from(arg("--kubeconfig").expect("--kubeconfig"));
        child(&phase, &kubeconfig);
    } else {
        parent();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// `VmHWM` (peak RSS) and `VmRSS` of this process, in KiB.
fn memory_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

// ---- parent: the fake API server and the report ----------------------------------------------

fn parent() {
    println!("== bootstrap: service start to /readyz vs list+decode baseline ==");
    println!("{}", common::machine());
    let rt = runtime();
    rt.block_on(async {
        let fake = FakeApiServer::new();
        let t = Instant::now();
        let c = common::cluster(NODES, true);
        let counts = (c.nodes.len(), c.pods.len(), c.devices.len(), c.topologies.len());
        let with_devices = c
            .pods
            .iter()
            .filter(|p| p["metadata"]["annotations"].is_object())
            .count();
        fake.create_many(Kind::Node, c.nodes).expect("nodes");
        fake.create_many(Kind::Device, c.devices).expect("devices");
        fake.create_many(Kind::NodeResourceTopology, c.topologies)
            .expect("nrts");
        fake.create_many(Kind::Pod, c.pods).expect("pods");
        // BOOTSTRAP_DRA=1: 5,000 ResourceSlices and 50,000 ResourceClaims beside the cluster.
        if std::env::var("BOOTSTRAP_DRA").is_ok_and(|v| v == "1") {
            let (slices, claims) = common::dra_objects(NODES, 10);
            println!("DRA: {} ResourceSlices, {} ResourceClaims", slices.len(), claims.len());
            fake.create_many(Kind::ResourceSlice, slices).expect("slices");
            fake.create_many(Kind::ResourceClaim, claims).expect("claims");
        }
        println!(
            "fake API server: {} nodes, {} pods ({} with device-allocated), {} Devices, {} NRTs; loaded in {:.1?}, parent RSS {} MiB",
            counts.0,
            counts.1,
            with_devices,
            counts.2,
            counts.3,
            t.elapsed(),
            memory_kib().1 / 1024
        );
        let served = fake.serve().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        served.write_kubeconfig(&kubeconfig).expect("kubeconfig");

        let mut results: Vec<(String, f64, u64)> = Vec::new();
        for round in 0..ROUNDS {
            for phase in ["baseline", "service"] {
                let kc = kubeconfig.clone();
                let out = tokio::task::spawn_blocking(move || run_child(phase, &kc))
                    .await
                    .expect("child");
                println!(
                    "round {round} {phase:<8} {:>7.3} s  peak RSS {:>5} MiB",
                    out.0,
                    out.1 / 1024
                );
                results.push((phase.to_string(), out.0, out.1));
            }
        }
        let best = |p: &str| {
            results
                .iter()
                .filter(|r| r.0 == p)
                .map(|r| r.1)
                .fold(f64::INFINITY, f64::min)
        };
        let peak = |p: &str| {
            results
                .iter()
                .filter(|r| r.0 == p)
                .map(|r| r.2)
                .max()
                .unwrap_or(0)
        };
        let (b, s) = (best("baseline"), best("service"));
        println!("\nbest of {ROUNDS}:");
        println!(
            "  baseline (list+decode, page {PAGE})  {b:>7.3} s  peak RSS {:>5} MiB",
            peak("baseline") / 1024
        );
        println!(
            "  service (start -> /readyz 200)     {s:>7.3} s  peak RSS {:>5} MiB",
            peak("service") / 1024
        );
        println!("  ratio service/baseline            {:>7.2}x", s / b);
        served.stop().await;
    });
}

/// Runs one phase in a child process; returns (seconds, peak RSS KiB).
fn run_child(phase: &str, kubeconfig: &Path) -> (f64, u64) {
    let exe = std::env::current_exe().expect("current exe");
    let out = Command::new(exe)
        .args(["--phase", phase, "--kubeconfig"])
        .arg(kubeconfig)
        .output()
        .expect("spawn child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{phase} child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT from {phase}: {stdout}"));
    let mut secs = 0.0;
    let mut hwm = 0;
    for kv in line.split_whitespace() {
        match kv.split_once('=') {
            Some(("secs", v)) => secs = v.parse().expect("secs"),
            Some(("hwm_kib", v)) => hwm = v.parse().expect("hwm"),
            _ => {}
        }
    }
    (secs, hwm)
}

// ---- children: one phase each -----------------------------------------------------------------

fn child(phase: &str, kubeconfig: &Path) {
    let rt = runtime();
    let (secs, detail) = rt.block_on(async {
        match phase {
            "baseline" => baseline(kubeconfig).await,
            "service" => service(kubeconfig).await,
            other => panic!("unknown phase {other}"),
        }
    });
    let (hwm, rss) = memory_kib();
    println!("RESULT phase={phase} secs={secs:.6} hwm_kib={hwm} rss_kib={rss} {detail}");
}

async fn list_all<K>(api: Api<K>, params: ListParams) -> Vec<K>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = params.limit(PAGE);
    loop {
        let page = api.list(&params).await.expect("list");
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return out,
        }
    }
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

async fn baseline(kubeconfig: &Path) -> (f64, String) {
    let t = Instant::now();
    let client = client(kubeconfig).await;
    let (nodes, pods, devices, nrts) = tokio::join!(
        tokio::spawn(list_all::<Node>(
            Api::all(client.clone()),
            ListParams::default()
        )),
        tokio::spawn(list_all::<Pod>(
            Api::all(client.clone()),
            ListParams::default().fields(ASSIGNED_POD_SELECTOR)
        )),
        tokio::spawn(list_all::<Device>(
            Api::all(client.clone()),
            ListParams::default()
        )),
        tokio::spawn(list_all::<NodeResourceTopology>(
            Api::all_with(client.clone(), &NrtVersion::V1alpha2),
            ListParams::default()
        )),
    );
    let secs = t.elapsed().as_secs_f64();
    let (nodes, pods, devices, nrts) = (
        nodes.expect("nodes"),
        pods.expect("pods"),
        devices.expect("devices"),
        nrts.expect("nrts"),
    );
    assert_eq!(
        (nodes.len(), devices.len(), nrts.len()),
        (NODES, NODES, NODES)
    );
    assert_eq!(pods.len(), NODES * common::PODS_PER_NODE);
    (
        secs,
        format!(
            "nodes={} pods={} devices={} nrts={}",
            nodes.len(),
            pods.len(),
            devices.len(),
            nrts.len()
        ),
    )
}

async fn service(kubeconfig: &Path) -> (f64, String) {
    let kc = kubeconfig.to_str().expect("utf-8 path");
    let t = Instant::now();
    let svc = Service::start(support::service::serve_args(&["--kubeconfig", kc]), None)
        .await
        .expect("service starts");
    let http = support::service::Http::new(svc.addr);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (status, body) = http.get("/readyz").await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "not ready after 600 s: {body}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = t.elapsed().as_secs_f64();
    let nodes = svc.state.scheduler.cluster.node_count();
    assert_eq!(nodes, NODES);
    (secs, format!("nodes={nodes}"))
}
