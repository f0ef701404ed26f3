//! Operator tools: `inspect` (cluster file, kubeconfig, running service), `simulate`, the metric
//! docs and the Grafana dashboard against a live `/metrics`, the README's "Operating it"
//! examples, and readable logs.
//!
//! Expected values are computed from the API objects (YAML/JSON) alone, never by asking the code
//! under test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use device_numa_extender::app::Service;
use device_numa_extender::cluster::report::cluster_report;
use device_numa_extender::ops::inspect::load_cluster_file;
use device_numa_extender::ops::simulate::{Simulation, cluster_yaml, simulate};
use device_numa_extender::scheduler::ScoringConfig;
use device_numa_extender::sync::file_source::ClusterFile;
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::support::service::{Http, serve_args};
use crate::support::{FakeApiServer, Kind};

const TIMEOUT: Duration = Duration::from_secs(60);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn example_cluster() -> PathBuf {
    root().join("examples/cluster.yaml")
}

/// Runs the binary (cwd: the repository), returning (exit success, stdout, stderr).
fn run_binary(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_device-numa-extender"))
        .args(args)
        .current_dir(root())
        .env_remove("KUBECONFIG")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .expect("run the binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The binary's output, failing the test if it exits non-zero.
fn run_ok(args: &[&str]) -> String {
    let (ok, stdout, stderr) = run_binary(args);
    assert!(ok, "device-numa-extender {args:?} failed:\n{stderr}");
    stdout
}

/// `run_ok` on the blocking pool, so an in-process server on this runtime keeps serving.
async fn run_ok_async(args: Vec<String>) -> String {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_ok(&args)
    })
    .await
    .expect("binary task")
}

fn yaml_docs(text: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).expect("valid YAML");
    let mut out = Vec::new();
    for d in docs.into_iter().filter(|d| !d.is_null()) {
        match d.get("items").and_then(Value::as_array) {
            Some(items) if d["kind"].as_str().is_some_and(|k| k.ends_with("List")) => {
                out.extend(items.iter().cloned())
            }
            _ => out.push(d),
        }
    }
    out
}

fn kind_of(d: &Value) -> &str {
    d["kind"].as_str().unwrap_or("")
}

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Bytes of a Kubernetes quantity as the objects write GPU memory (`80Gi`, `512Mi`, `1024`).
fn bytes(q: &str) -> i64 {
    for (suffix, mult) in [
        ("Ki", 1i64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
    ] {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<i64>().expect("integer quantity") * mult;
        }
    }
    q.parse()
        .unwrap_or_else(|_| panic!("unexpected quantity {q:?}"))
}

fn int(q: &str) -> i64 {
    q.parse()
        .unwrap_or_else(|_| panic!("unexpected integer quantity {q:?}"))
}

/// A GPU as the objects describe it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Gpu {
    healthy: bool,
    core: i64,
    memory: i64,
    ratio: i64,
    holders: BTreeSet<String>,
    used_core: i64,
    used_memory: i64,
    used_ratio: i64,
}

/// (node, minor) → GPU, from Device objects and the `device-allocated` annotations of assigned,
/// non-terminal pods. A minor only an annotation names appears with `healthy: false` and no
/// capacity.
fn gpus_from_objects(docs: &[Value]) -> BTreeMap<(String, i64), Gpu> {
    let mut out: BTreeMap<(String, i64), Gpu> = BTreeMap::new();
    for d in docs.iter().filter(|d| kind_of(d) == "Device") {
        let node = s(d, "/metadata/name").to_string();
        for e in d["spec"]["devices"].as_array().into_iter().flatten() {
            if e["type"] != "gpu" {
                continue;
            }
            let minor = e["minor"].as_i64().expect("minor");
            let healthy = e["health"].as_bool().unwrap_or(false);
            let r = &e["resources"];
            let gpu = out.entry((node.clone(), minor)).or_default();
            gpu.healthy = healthy;
            if healthy {
                gpu.core = int(s(r, "/koordinator.sh~1gpu-core"));
                gpu.memory = bytes(s(r, "/koordinator.sh~1gpu-memory"));
                gpu.ratio = int(s(r, "/koordinator.sh~1gpu-memory-ratio"));
            }
        }
    }
    for p in docs.iter().filter(|d| kind_of(d) == "Pod") {
        let node = s(p, "/spec/nodeName");
        let phase = s(p, "/status/phase");
        let ann = s(
            p,
            "/metadata/annotations/scheduling.koordinator.sh~1device-allocated",
        );
        if node.is_empty() || phase == "Succeeded" || phase == "Failed" || ann.is_empty() {
            continue;
        }
        let holder = format!(
            "{}/{}",
            p["metadata"]["namespace"].as_str().unwrap_or("default"),
            s(p, "/metadata/name")
        );
        let alloc: Value = serde_json::from_str(ann).expect("annotation JSON");
        for a in alloc["gpu"].as_array().into_iter().flatten() {
            let gpu = out
                .entry((node.to_string(), a["minor"].as_i64().expect("minor")))
                .or_default();
            gpu.holders.insert(holder.clone());
            let r = &a["resources"];
            let get = |k: &str| r.get(k).and_then(Value::as_str);
            gpu.used_core += get("koordinator.sh/gpu-core").map_or(0, int);
            gpu.used_memory += get("koordinator.sh/gpu-memory").map_or(0, bytes);
            gpu.used_ratio += get("koordinator.sh/gpu-memory-ratio").map_or(0, int);
        }
    }
    out
}

/// node → (pod key → cpuset as written) from the `resource-status` annotations of assigned,
/// non-terminal pods; every node with a NodeResourceTopology is present (maybe empty).
fn cpusets_from_objects(docs: &[Value]) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for d in docs.iter().filter(|d| kind_of(d) == "NodeResourceTopology") {
        out.entry(s(d, "/metadata/name").to_string()).or_default();
    }
    for p in docs.iter().filter(|d| kind_of(d) == "Pod") {
        let node = s(p, "/spec/nodeName");
        let phase = s(p, "/status/phase");
        let ann = s(
            p,
            "/metadata/annotations/scheduling.koordinator.sh~1resource-status",
        );
        if node.is_empty() || phase == "Succeeded" || phase == "Failed" || ann.is_empty() {
            continue;
        }
        let status: Value = serde_json::from_str(ann).expect("resource-status JSON");
        let cpuset = status["cpuset"].as_str().unwrap_or("").to_string();
        let key = format!(
            "{}/{}",
            p["metadata"]["namespace"].as_str().unwrap_or("default"),
            s(p, "/metadata/name")
        );
        out.entry(node.to_string()).or_default().insert(key, cpuset);
    }
    out
}

/// node → (pod key → cpuset) as `inspect -o json` reports it, for nodes with CPU columns.
fn cpusets_from_view(view: &Value) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for n in view["nodes"].as_array().expect("nodes") {
        if n["cpus"].is_null() {
            continue;
        }
        let holders = n["cpus"]["holders"]
            .as_array()
            .expect("cpu holders")
            .iter()
            .map(|h| {
                (
                    h["pod"].as_str().unwrap().to_string(),
                    h["cpuset"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        out.insert(n["name"].as_str().unwrap().to_string(), holders);
    }
    out
}

/// (node, minor) → (healthy, holders) as `inspect -o json` reports it.
fn gpus_from_view(view: &Value) -> BTreeMap<(String, i64), (bool, BTreeSet<String>)> {
    let mut out = BTreeMap::new();
    for n in view["nodes"].as_array().expect("nodes") {
        for g in n["gpus"].as_array().expect("gpus") {
            let holders = g["holders"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h["pod"].as_str().unwrap().to_string())
                .collect();
            out.insert(
                (
                    n["name"].as_str().unwrap().to_string(),
                    g["minor"].as_i64().unwrap(),
                ),
                (g["healthy"].as_bool().unwrap(), holders),
            );
        }
    }
    out
}

#[test]
fn inspect_shows_every_gpu_with_its_holders_and_marks_the_unhealthy_one() {
    let text = std::fs::read_to_string(example_cluster()).unwrap();
    let want = gpus_from_objects(&yaml_docs(&text));
    assert!(
        want.values().any(|g| !g.healthy),
        "the example has a sick GPU"
    );
    assert!(want.values().any(|g| g.holders.len() == 1));

    let json: Value = serde_json::from_str(&run_ok(&[
        "inspect",
        "--cluster-file",
        "examples/cluster.yaml",
        "-o",
        "json",
    ]))
    .expect("inspect -o json is JSON");
    let got = gpus_from_view(&json);
    let want_view: BTreeMap<_, _> = want
        .iter()
        .map(|(k, g)| (k.clone(), (g.healthy, g.holders.clone())))
        .collect();
    assert_eq!(got, want_view);
    let unhealthy = want.values().filter(|g| !g.healthy).count() as u64;
    assert_eq!(json["summary"]["gpus"]["unhealthy"], json!(unhealthy));
    assert_eq!(json["summary"]["gpus"]["total"], json!(want.len() as u64));
    // CPU columns: exactly the nodes with an NRT, each cpuset with its holder.
    let want_cpus = cpusets_from_objects(&yaml_docs(&text));
    assert!(
        want_cpus
            .values()
            .any(|h| h.values().any(|c| !c.is_empty())),
        "the example cluster has running cpuset pods"
    );
    assert_eq!(cpusets_from_view(&json), want_cpus);

    // The table: one row per GPU under its node, holders on it, the sick one marked.
    let table = run_ok(&["inspect", "--cluster-file", "examples/cluster.yaml"]);
    assert!(
        !table.contains('\x1b'),
        "no colour when stdout is not a terminal"
    );
    let mut node = String::new();
    let mut in_gpu_table = false;
    let mut rows: BTreeMap<(String, i64), String> = BTreeMap::new();
    for line in table.lines() {
        if let Some(rest) = line.strip_prefix("NODE ") {
            node = rest.split_whitespace().next().unwrap().to_string();
            continue;
        }
        let t = line.trim_start();
        if t.starts_with("GPU ") {
            in_gpu_table = true;
            continue;
        }
        if t.starts_with("RDMA ") || t.starts_with("FPGA ") || line.is_empty() {
            in_gpu_table = false;
        }
        if in_gpu_table
            && let Some(minor) = t.split_whitespace().next().and_then(|m| m.parse().ok())
        {
            rows.insert((node.clone(), minor), line.to_string());
        }
    }
    for (key, gpu) in &want {
        let row = rows
            .get(key)
            .unwrap_or_else(|| panic!("no table row for {key:?}:\n{table}"));
        for h in &gpu.holders {
            assert!(row.contains(h.as_str()), "{key:?} row lacks {h}: {row}");
        }
        assert_eq!(row.contains("UNHEALTHY"), !gpu.healthy, "{row}");
    }
    assert!(table.contains(&format!("{unhealthy} unhealthy")), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_json_matches_the_service_debug_nodes_and_server_mode() {
    let path = example_cluster();
    let svc = Service::start(
        serve_args(&["--cluster-file", path.to_str().unwrap()]),
        None,
    )
    .await
    .expect("service starts");
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    let (status, served) = http.get("/debug/nodes").await;
    assert_eq!(status, 200, "{served}");

    let file_json: Value = serde_json::from_str(
        &run_ok_async(
            [
                "inspect",
                "--cluster-file",
                "examples/cluster.yaml",
                "-o",
                "json",
            ]
            .map(String::from)
            .to_vec(),
        )
        .await,
    )
    .unwrap();
    assert_eq!(
        file_json, served,
        "inspect --cluster-file vs GET /debug/nodes"
    );

    let url = format!("http://{}", svc.addr);
    let server_json: Value = serde_json::from_str(
        &run_ok_async(
            ["inspect", "--server", &url, "-o", "json"]
                .map(String::from)
                .to_vec(),
        )
        .await,
    )
    .unwrap();
    assert_eq!(server_json, served, "inspect --server");

    // --node narrows, on both sides; an unknown name is an error, not an empty table.
    let (_, one) = http.get("/debug/nodes?nodes=gpu-node-2").await;
    let one_cli: Value = serde_json::from_str(
        &run_ok_async(
            [
                "inspect",
                "--cluster-file",
                "examples/cluster.yaml",
                "--node",
                "gpu-node-2",
                "-o",
                "json",
            ]
            .map(String::from)
            .to_vec(),
        )
        .await,
    )
    .unwrap();
    assert_eq!(one, one_cli);
    assert_eq!(one["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(one["summary"]["gpus"]["unhealthy"], 1);
    let (status, missing) = http.get("/debug/nodes?nodes=gpu-node-2,nope").await;
    assert_eq!(status, 404, "{missing}");
    assert!(missing["error"].as_str().unwrap().contains("nope"));
    let (ok, _, stderr) = tokio::task::spawn_blocking(|| {
        run_binary(&[
            "inspect",
            "--cluster-file",
            "examples/cluster.yaml",
            "--node",
            "nope",
        ])
    })
    .await
    .unwrap();
    assert!(!ok && stderr.contains("nope"), "{stderr}");
    let (ok, _, stderr) = tokio::task::spawn_blocking(move || {
        run_binary(&["inspect", "--server", &url, "--node", "gpu-node-2,nope"])
    })
    .await
    .unwrap();
    assert!(
        !ok && stderr.contains("404") && stderr.contains("not in the cluster: nope"),
        "{stderr}"
    );
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_kubeconfig_against_the_fake_api_server_equals_the_cluster_file() {
    let fake = FakeApiServer::new();
    let text = std::fs::read_to_string(example_cluster()).unwrap();
    for doc in yaml_docs(&text) {
        let kind = match kind_of(&doc) {
            "Node" => Kind::Node,
            "Pod" => Kind::Pod,
            "Device" => Kind::Device,
            "NodeResourceTopology" => Kind::NodeResourceTopology,
            other => panic!("unexpected kind {other} in the example"),
        };
        fake.create(kind, doc).expect("create");
    }
    let served = fake.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    served.write_kubeconfig(&kubeconfig).unwrap();

    let from_kube = run_ok_async(vec![
        "inspect".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "-o".into(),
        "json".into(),
    ])
    .await;
    let from_file = run_ok_async(
        [
            "inspect",
            "--cluster-file",
            "examples/cluster.yaml",
            "-o",
            "json",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    let (a, b): (Value, Value) = (
        serde_json::from_str(&from_kube).unwrap(),
        serde_json::from_str(&from_file).unwrap(),
    );
    assert_eq!(a, b);
    // One list per kind, and no watch: a one-shot tool must not hang on a stream.
    let watches = fake
        .requests()
        .iter()
        .filter_map(|r| r.rbac())
        .filter(|r| r.verb == "watch")
        .count();
    assert_eq!(watches, 0, "inspect opened watches");
    // The tables agree too.
    let table_kube = run_ok_async(vec![
        "inspect".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
    ])
    .await;
    let table_file = run_ok_async(
        ["inspect", "--cluster-file", "examples/cluster.yaml"]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert_eq!(table_kube, table_file);
}

async fn simulate_example(pods: &str) -> Simulation {
    let cluster = std::fs::read_to_string(example_cluster()).unwrap();
    simulate(
        &cluster,
        "examples/cluster.yaml",
        pods,
        "pods.yaml",
        ScoringConfig::default(),
    )
    .await
    .expect("simulate runs")
}

fn pod_doc(name: &str, limits: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "ml"},
           "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}})
}

fn pods_text(pods: &[Value]) -> String {
    json!({"apiVersion": "v1", "kind": "List", "items": pods}).to_string()
}

/// Hand-computed on examples/cluster.yaml (3 × 8 A100 80Gi over 2 NUMA nodes, gpu-node-2 minor
/// 5 unhealthy; gpu-node-0 holds 2 whole + a 50% share, gpu-node-1 holds 4 whole + a 50% share;
/// least-allocated scoring).
#[tokio::test]
async fn simulate_places_whole_and_shared_pods_and_says_why_one_fits_nowhere() {
    let pods = [
        // 8 whole GPUs: gpu-node-0 has 2 of its 8 nvidia.com/gpu requested already, and
        // cpu-node-0 and the four numa-* CPU nodes have none (kube-scheduler's own fit); gpu-node-1 has 32+4 of 64 CPUs taken,
        // so 32 more do not fit; gpu-node-2 passes that but has only 7 healthy GPUs.
        pod_doc("train-8", json!({"cpu": "32", "nvidia.com/gpu": "8"})),
        // 4 whole: only gpu-node-0 (GPUs 3-7 whole-free) and gpu-node-2 (0-4, 6, 7) have 4;
        // gpu-node-2 is the least allocated; NUMA node 0 holds 0-3 (NUMA 1 has only 3 healthy).
        pod_doc("train-4", json!({"cpu": "16", "nvidia.com/gpu": "4"})),
        // Half a GPU: gpu-node-0 now has the most memory-ratio free (550 of 800, against 350 of
        // 800 and 300 of 700). Its single-numa-node policy puts the pod's CPU on the less
        // allocated NUMA node 1 (GPUs 4-7), and the share follows it there: GPU 4, the first
        // whole-free card of that NUMA node.
        pod_doc(
            "infer-half",
            json!({"cpu": "2", "koordinator.sh/gpu-memory-ratio": "50"}),
        ),
        // No device needs: kube-scheduler's fit alone; extender scores are all 0, so the first
        // node by name that fits: cpu-node-0.
        pod_doc("web", json!({"cpu": "1"})),
    ];
    let sim = simulate_example(&pods_text(&pods)).await;
    let p = &sim.report.placements;
    assert_eq!(p.len(), 4);

    assert_eq!(p[0].pod, "ml/train-8");
    assert_eq!(p[0].node, None);
    let reasons: BTreeMap<&str, u64> = p[0].reasons.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        reasons,
        BTreeMap::from([
            ("Insufficient nvidia.com/gpu", 6),
            ("Insufficient cpu", 1),
            (
                "insufficient gpu devices: only 7 healthy gpus, pod asks 8",
                1
            ),
        ])
    );
    assert_eq!(
        p[0].message.as_deref(),
        Some(
            "0/8 nodes are available: 1 Insufficient cpu, 1 insufficient gpu devices: only 7 healthy gpus, pod asks 8, 6 Insufficient nvidia.com/gpu."
        )
    );

    let minors = |i: usize| -> Vec<i32> { p[i].devices["gpu"].iter().map(|d| d.minor).collect() };
    assert_eq!(p[1].node.as_deref(), Some("gpu-node-2"));
    assert_eq!(minors(1), vec![0, 1, 2, 3]);
    assert_eq!(p[2].node.as_deref(), Some("gpu-node-0"));
    assert_eq!(minors(2), vec![4]);
    assert_eq!(
        p[2].devices["gpu"][0].resources["koordinator.sh/gpu-memory"],
        40 << 30
    );
    assert_eq!(p[3].node.as_deref(), Some("cpu-node-0"));
    assert!(p[3].devices.is_empty());

    // Before/after from the objects: 4 + 0.5 GPUs more in use.
    let g = &sim.report;
    assert_eq!(g.after.gpus.whole_free, g.before.gpus.whole_free - 5);
    assert_eq!(
        g.after.gpu_memory_bytes.used - g.before.gpu_memory_bytes.used,
        (4 * 80 + 40) << 30
    );
    assert_eq!(g.after, sim.after.summary);
}

/// The Linux CPU list form, parsed here (not by the crate).
fn cpu_ids(list: &str) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => {
                out.insert(part.parse::<u32>().unwrap());
            }
        }
    }
    out
}

/// LSR pods through `simulate`, judged from the example objects alone: each gets exactly its
/// CPU count, none of them reserved or held by a running pod or an earlier placement on that
/// node; on a SingleNUMANode node the cpuset sits on one NUMA node and the GPU with it.
#[tokio::test]
async fn simulate_gives_lsr_pods_disjoint_cpusets_aligned_with_their_gpus() {
    let lsr = |name: &str, limits: Value| {
        let mut d = pod_doc(name, limits);
        d["metadata"]["labels"] = json!({"koordinator.sh/qosClass": "LSR"});
        d
    };
    let pods = [
        lsr("db-0", json!({"cpu": "8", "memory": "16Gi"})),
        lsr("db-1", json!({"cpu": "8", "memory": "16Gi"})),
        lsr(
            "gpu-lsr-0",
            json!({"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "1"}),
        ),
        lsr(
            "gpu-lsr-1",
            json!({"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "1"}),
        ),
    ];
    let sim = simulate_example(&pods_text(&pods)).await;
    let docs = yaml_docs(&std::fs::read_to_string(example_cluster()).unwrap());
    // node → CPUs nobody may get: held by running pods, or reserved in the NRT's annotations.
    let mut taken: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for (node, holders) in cpusets_from_objects(&docs) {
        let set = taken.entry(node).or_default();
        for c in holders.values() {
            set.extend(cpu_ids(c));
        }
    }
    // node → (cpu → NUMA id), node → policy, (node, GPU minor) → NUMA id.
    let mut numa_of: BTreeMap<String, BTreeMap<u32, u64>> = BTreeMap::new();
    let mut single_numa: BTreeSet<String> = BTreeSet::new();
    let mut gpu_numa: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for d in &docs {
        let name = s(d, "/metadata/name").to_string();
        match kind_of(d) {
            "NodeResourceTopology" => {
                let topo: Value = serde_json::from_str(s(
                    d,
                    "/metadata/annotations/node.koordinator.sh~1cpu-topology",
                ))
                .expect("cpu-topology JSON");
                let m = numa_of.entry(name.clone()).or_default();
                for c in topo["detail"].as_array().unwrap() {
                    m.insert(
                        c["id"].as_u64().unwrap() as u32,
                        c["node"].as_u64().unwrap(),
                    );
                }
                for key in [
                    "kubelet.koordinator.sh~1cpu-manager-policy",
                    "node.koordinator.sh~1reservation",
                ] {
                    if let Ok(v) =
                        serde_json::from_str::<Value>(s(d, &format!("/metadata/annotations/{key}")))
                        && let Some(r) = v["reservedCPUs"].as_str()
                    {
                        taken.entry(name.clone()).or_default().extend(cpu_ids(r));
                    }
                }
                let policy_attribute = d["attributes"].as_array().into_iter().flatten().any(|a| {
                    a["name"] == "topologyManagerPolicy" && a["value"] == "single-numa-node"
                });
                if policy_attribute
                    || d["topologyPolicies"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|p| p.as_str().is_some_and(|p| p.starts_with("SingleNUMANode")))
                {
                    single_numa.insert(name);
                }
            }
            "Node"
                if s(
                    d,
                    "/metadata/labels/node.koordinator.sh~1numa-topology-policy",
                ) == "SingleNUMANode" =>
            {
                single_numa.insert(name);
            }
            "Device" => {
                for e in d["spec"]["devices"].as_array().into_iter().flatten() {
                    if e["type"] == "gpu" {
                        gpu_numa.insert(
                            (name.clone(), e["minor"].as_i64().unwrap()),
                            e["topology"]["nodeID"].as_i64().unwrap_or(-1),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    let mut aligned_checked = 0;
    for p in &sim.report.placements {
        let node = p
            .node
            .clone()
            .unwrap_or_else(|| panic!("{} placed nowhere: {p:?}", p.pod));
        let cpus = cpu_ids(p.cpuset.as_deref().expect("an LSR pod gets a cpuset"));
        assert_eq!(cpus.len(), 8, "{p:?}");
        let held = taken.entry(node.clone()).or_default();
        assert!(
            cpus.is_disjoint(held),
            "{} got {cpus:?} on {node}, where {held:?} are taken",
            p.pod
        );
        held.extend(&cpus);
        if single_numa.contains(&node) {
            let numas: BTreeSet<u64> = cpus.iter().map(|c| numa_of[&node][c]).collect();
            assert_eq!(numas.len(), 1, "{} spans NUMA nodes {numas:?}", p.pod);
            for d in p.devices.get("gpu").into_iter().flatten() {
                assert_eq!(
                    gpu_numa[&(node.clone(), i64::from(d.minor))] as u64,
                    *numas.first().unwrap(),
                    "{}: GPU {} is not on the cpuset's NUMA node",
                    p.pod,
                    d.minor
                );
                aligned_checked += 1;
            }
        }
    }
    assert!(
        aligned_checked >= 1,
        "no GPU+cpuset pod landed on a SingleNUMANode node: {:?}",
        sim.report.placements
    );
}

#[derive(Debug, Clone)]
enum Ask {
    Whole(u8),
    Ratio(u8),
    CoreRatio(u8, u8),
    Memory(u8),
}

fn ask() -> impl Strategy<Value = Ask> {
    prop_oneof![
        (1u8..=4).prop_map(Ask::Whole),
        prop::sample::select(vec![10u8, 25, 50, 75, 100]).prop_map(Ask::Ratio),
        (
            prop::sample::select(vec![10u8, 50, 100]),
            prop::sample::select(vec![25u8, 50])
        )
            .prop_map(|(c, r)| Ask::CoreRatio(c, r)),
        (1u8..=80).prop_map(Ask::Memory),
    ]
}

fn ask_pod(i: usize, a: &Ask) -> Value {
    let limits = match a {
        Ask::Whole(n) => json!({"cpu": "1", "nvidia.com/gpu": n.to_string()}),
        Ask::Ratio(r) => json!({"cpu": "1", "koordinator.sh/gpu-memory-ratio": r.to_string()}),
        Ask::CoreRatio(c, r) => json!({"cpu": "1", "koordinator.sh/gpu-core": c.to_string(),
                                       "koordinator.sh/gpu-memory-ratio": r.to_string()}),
        Ask::Memory(g) => json!({"cpu": "1", "koordinator.sh/gpu-memory": format!("{g}Gi")}),
    };
    pod_doc(&format!("p{i}"), limits)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever is asked, the resulting cluster never holds more of a GPU than it has, nothing
    /// new lands on the unhealthy GPU, and `--output-cluster` loaded back shows exactly the
    /// "after" view.
    #[test]
    fn simulate_never_over_allocates_and_its_output_cluster_loads_back_the_same(
        asks in prop::collection::vec(ask(), 1..14)
    ) {
        let pods: Vec<Value> = asks.iter().enumerate().map(|(i, a)| ask_pod(i, a)).collect();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let sim = rt.block_on(simulate_example(&pods_text(&pods)));

        let gpus = gpus_from_objects(&sim.cluster_objects);
        for ((node, minor), g) in &gpus {
            let placed_here: Vec<&String> =
                g.holders.iter().filter(|h| h.starts_with("ml/p")).collect();
            if !placed_here.is_empty() {
                prop_assert!(g.healthy, "{placed_here:?} placed on unhealthy/absent {node}/{minor}");
            }
            if g.healthy {
                prop_assert!(g.used_core <= g.core, "{node}/{minor} core {g:?}");
                prop_assert!(g.used_memory <= g.memory, "{node}/{minor} memory {g:?}");
                prop_assert!(g.used_ratio <= g.ratio, "{node}/{minor} ratio {g:?}");
            }
        }
        // Every placement shows up as a bound, annotated pod in the output (and only those).
        for (i, p) in sim.report.placements.iter().enumerate() {
            let doc = sim
                .cluster_objects
                .iter()
                .find(|d| kind_of(d) == "Pod" && s(d, "/metadata/name") == format!("p{i}"))
                .expect("simulated pod in the output");
            prop_assert_eq!(p.node.as_deref().unwrap_or(""), s(doc, "/spec/nodeName"));
            let holds = gpus.values().any(|g| g.holders.contains(&format!("ml/p{i}")));
            prop_assert_eq!(holds, !p.devices.is_empty());
        }

        let reloaded = load_cluster_file(
            ClusterFile::parse(&cluster_yaml(&sim.cluster_objects).unwrap(), "out.yaml").unwrap(),
        );
        prop_assert_eq!(&cluster_report(&reloaded.cluster, &[]), &sim.after);
        prop_assert_eq!(&sim.report.after, &sim.after.summary);
    }
}

#[tokio::test]
async fn simulate_output_cluster_chains_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("after.yaml");
    let report: Value = serde_json::from_str(
        &run_ok_async(vec![
            "simulate".into(),
            "--cluster-file".into(),
            "examples/cluster.yaml".into(),
            "--pods".into(),
            "examples/pending-pods.yaml".into(),
            "--output-cluster".into(),
            out.display().to_string(),
            "-o".into(),
            "json".into(),
        ])
        .await,
    )
    .unwrap();
    let view: Value = serde_json::from_str(
        &run_ok_async(vec![
            "inspect".into(),
            "--cluster-file".into(),
            out.display().to_string(),
            "-o".into(),
            "json".into(),
        ])
        .await,
    )
    .unwrap();
    assert_eq!(view["summary"], report["after"]);
    // Chained: the same pods again on the result land on the remaining capacity.
    let again: Value = serde_json::from_str(
        &run_ok_async(vec![
            "simulate".into(),
            "--cluster-file".into(),
            out.display().to_string(),
            "--pods".into(),
            "examples/pending-pods.yaml".into(),
            "-o".into(),
            "json".into(),
        ])
        .await,
    )
    .unwrap();
    assert_eq!(again["before"], report["after"]);
}

// ---- metrics and dashboard ------------------------------------------------------------------

/// A cluster file that also makes the sync count an invalid object and a bad Device entry.
fn metrics_cluster(dir: &Path) -> PathBuf {
    let mut text = std::fs::read_to_string(example_cluster()).unwrap();
    text.push_str(
        "\n---\napiVersion: v1\nkind: Pod\nmetadata: {namespace: ml, uid: uid-nameless}\n\
         spec: {nodeName: gpu-node-0, containers: []}\n\
         ---\napiVersion: scheduling.koordinator.sh/v1alpha1\nkind: Device\n\
         metadata: {name: bad-node}\n\
         spec: {devices: [{type: gpu, health: true, resources: {koordinator.sh/gpu-core: '100'}}]}\n\
         ---\napiVersion: topology.node.k8s.io/v1alpha2\nkind: NodeResourceTopology\n\
         metadata: {name: bad-nrt-node, annotations: {node.koordinator.sh/cpu-topology: 'not json'}}\n\
         zones: []\n",
    );
    let path = dir.join("cluster.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn example_request(name: &str) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(root().join("examples/requests").join(name)).unwrap(),
    )
    .unwrap()
}

/// A live `/metrics` after every verb ran once (and a bind failed, and a request was malformed),
/// with per-node metrics on.
async fn live_metrics() -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = metrics_cluster(dir.path());
    let svc = Service::start(
        serve_args(&[
            "--cluster-file",
            path.to_str().unwrap(),
            "--per-node-metrics",
        ]),
        None,
    )
    .await
    .expect("service starts");
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    let filter = example_request("filter.json");
    let (status, _) = http.post("/filter", &filter).await;
    assert_eq!(status, 200);
    http.post("/prioritize", &example_request("prioritize.json"))
        .await;
    let (_, bound) = http.post("/bind", &example_request("bind.json")).await;
    assert_eq!(bound["Error"], "", "{bound}");
    let (_, failed) = http
        .post(
            "/bind",
            &json!({"PodName": "nope", "PodNamespace": "ml", "PodUID": "u", "Node": "gpu-node-0"}),
        )
        .await;
    assert_ne!(failed["Error"], "");
    http.post(
        "/preempt",
        &json!({"Pod": filter["Pod"], "NodeNameToMetaVictims": {"gpu-node-0": {"Pods": [{"UID": "uid-ml-train-a-0"}]}}}),
    )
    .await;
    let (status, _) = http
        .send(
            "POST",
            "/filter",
            Some("application/json"),
            b"{not json".to_vec(),
        )
        .await;
    assert_eq!(status, 400);
    let (status, body) = http.get("/metrics").await;
    assert_eq!(status, 200);
    svc.shutdown().await.unwrap();
    body.as_str().expect("text metrics").to_string()
}

/// Family names from `# TYPE` lines.
fn exported_families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Sample names (`x_bucket`, `x_sum`, `x_count` included).
fn exported_samples(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exported_metric_is_documented_and_every_documented_one_exported() {
    let text = live_metrics().await;
    let exported = exported_families(&text);
    let docs = std::fs::read_to_string(root().join("docs/metrics.md")).unwrap();
    let documented: BTreeSet<String> = docs
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("dne_"))
        .map(str::to_owned)
        .collect();
    assert!(documented.len() > 20, "{documented:?}");
    let undocumented: Vec<_> = exported.difference(&documented).collect();
    let missing: Vec<_> = documented.difference(&exported).collect();
    assert!(
        undocumented.is_empty(),
        "exported but not in docs/metrics.md: {undocumented:?}"
    );
    assert!(
        missing.is_empty(),
        "documented but not exported: {missing:?}"
    );
    // The capacity gauges agree with the example: one unhealthy GPU, per node too.
    assert!(
        text.lines()
            .any(|l| l == r#"dne_devices{state="unhealthy",type="gpu"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"dne_node_devices{node="gpu-node-2",state="unhealthy",type="gpu"} 1"#));
}

/// Metric names a PromQL expression reads: identifiers outside label matchers, ranges, strings
/// and grouping clauses, that are not functions or keywords.
fn promql_metrics(expr: &str) -> BTreeSet<String> {
    // Aggregation operators can be followed by `by (...)` before their `(`.
    const KEYWORDS: [&str; 24] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "and",
        "or",
        "unless",
        "inf",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    let mut skip_group = false;
    while i < chars.len() {
        let c = chars[i];
        let close = match c {
            '{' => Some('}'),
            '[' => Some(']'),
            '"' => Some('"'),
            '(' if skip_group => Some(')'),
            _ => None,
        };
        if let Some(close) = close {
            skip_group = false;
            i += 1;
            while i < chars.len() && chars[i] != close {
                i += 1;
            }
            i += 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j] == ' ' {
                j += 1;
            }
            let is_call = chars.get(j) == Some(&'(');
            if KEYWORDS.contains(&word.as_str()) {
                skip_group = matches!(
                    word.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                );
            } else if !is_call {
                out.insert(word);
            }
            continue;
        }
        if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        i += 1;
    }
    out
}

#[test]
fn promql_metric_extraction_handles_the_shapes_the_dashboard_uses() {
    assert_eq!(
        promql_metrics(
            r#"histogram_quantile(0.99, sum by (le, verb) (rate(dne_x_bucket{job=~"$job"}[$__rate_interval])))"#
        ),
        BTreeSet::from(["dne_x_bucket".to_string()])
    );
    assert_eq!(promql_metrics("vector(0.002)"), BTreeSet::new());
    assert_eq!(
        promql_metrics("a / on (node) group_left b > 0.3"),
        BTreeSet::from(["a".to_string(), "b".to_string()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_queries_only_metrics_the_service_exports() {
    let text = live_metrics().await;
    let samples = exported_samples(&text);
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("deploy/grafana/device-numa-extender.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let chart_copy = std::fs::read(
        root().join("charts/device-numa-extender/dashboards/device-numa-extender.json"),
    )
    .unwrap();
    assert_eq!(
        chart_copy,
        std::fs::read(root().join("deploy/grafana/device-numa-extender.json")).unwrap(),
        "the chart's copy of the dashboard drifted"
    );
    let mut exprs: Vec<String> = Vec::new();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    if k == "expr"
                        && let Some(e) = v.as_str()
                    {
                        out.push(e.to_string());
                    }
                    walk(v, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&dashboard["panels"], &mut exprs);
    assert!(exprs.len() >= 15, "{exprs:?}");
    let mut used = BTreeSet::new();
    for e in &exprs {
        let names = promql_metrics(e);
        assert!(
            !names.is_empty() || e.starts_with("vector("),
            "query reads no metric: {e}"
        );
        used.extend(names);
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["query"].as_str()
            && let Some(rest) = q.strip_prefix("label_values(")
        {
            used.insert(rest.split([',', ')']).next().unwrap().trim().to_string());
        }
    }
    let unknown: Vec<_> = used.difference(&samples).collect();
    assert!(
        unknown.is_empty(),
        "dashboard queries metrics the service does not export: {unknown:?}"
    );
    for needed in [
        "dne_http_request_duration_seconds_bucket",
        "dne_sync_phase",
        "dne_relists_total",
        "dne_watch_errors_total",
        "dne_devices",
        "dne_binds_total",
    ] {
        assert!(used.contains(needed), "the dashboard has no {needed} panel");
    }
}

// ---- README and logs ------------------------------------------------------------------------

/// Every ```console block of the README's "Operating it" section is a command and its real
/// output.
#[test]
fn readme_operating_examples_are_the_real_output() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split("## Operating it")
        .nth(1)
        .expect("README has an 'Operating it' section");
    let section = section.split("\n## ").next().unwrap();
    let mut blocks = 0;
    for block in section.split("```console\n").skip(1) {
        let block = block.split("\n```").next().unwrap();
        let (command, expected) = block.split_once('\n').unwrap_or((block, ""));
        let args: Vec<&str> = command
            .strip_prefix("$ device-numa-extender ")
            .unwrap_or_else(|| panic!("block does not start with a command: {command}"))
            .split_whitespace()
            .collect();
        let got = run_ok(&args);
        for line in got.lines() {
            assert!(
                line.chars().count() <= 80,
                "wider than 80 columns: {line:?}"
            );
        }
        assert_eq!(
            got.trim_end(),
            expected.trim_end(),
            "README output of `{command}` is stale; the real output is:\n{got}"
        );
        blocks += 1;
    }
    assert!(blocks >= 2, "expected the inspect and simulate examples");
}

#[tokio::test]
async fn logs_to_a_file_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_device-numa-extender"))
        .args([
            "serve",
            "--cluster-file",
            "examples/cluster.yaml",
            "--listen",
            &addr,
        ])
        .args(["--shutdown-delay", "0s", "--log-format", "text"])
        .current_dir(root())
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("serving") {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never logged 'serving': {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(text.contains("offline mode"), "{text}");
    assert!(
        !text.contains('\x1b'),
        "escape sequences in a log file: {text:?}"
    );
}

fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_results_rejections_and_capacity_gauges_match_the_objects() {
    let path = example_cluster();
    let svc = Service::start(
        serve_args(&["--cluster-file", path.to_str().unwrap()]),
        None,
    )
    .await
    .expect("service starts");
    let http = Http::new(svc.addr);
    http.wait_ready(TIMEOUT).await;
    let nodes = ["cpu-node-0", "gpu-node-0", "gpu-node-1", "gpu-node-2"];
    let ask =
        |limits: Value| json!({"Pod": pod_doc("x", limits), "NodeNames": nodes, "Nodes": null});
    // 8 whole GPUs: no GPU node has 8 (healthy and free); the CPU node has no Device object
    // and advertises no GPU, so it does not serve the pod either (issue 36 §6).
    let (_, eight) = http
        .post("/filter", &ask(json!({"nvidia.com/gpu": "8"})))
        .await;
    assert_eq!(eight["NodeNames"], json!([]), "{eight}");
    assert_eq!(
        eight["FailedAndUnresolvableNodes"]["cpu-node-0"],
        "node has no Device object and does not advertise nvidia.com/gpu"
    );
    // gpu-core without memory is an invalid request: every node is unresolvable.
    let (_, invalid) = http
        .post("/filter", &ask(json!({"koordinator.sh/gpu-core": "50"})))
        .await;
    assert_eq!(
        invalid["FailedAndUnresolvableNodes"]
            .as_object()
            .unwrap()
            .len(),
        4
    );
    // A CPU request is placed, not passed through: the example's GPU nodes have a NUMA
    // policy (single-numa-node), which applies to any pod asking for CPU. A pod asking for
    // nothing CPU- or device-related passes through.
    http.post("/filter", &ask(json!({"cpu": "1"}))).await;
    http.post("/filter", &ask(json!({}))).await;
    let (_, text) = http.get("/metrics").await;
    let text = text.as_str().unwrap();
    let counter = |series: &str| sample(text, series);
    assert_eq!(counter(r#"dne_filter_results_total{result="fits"}"#), 1.0);
    assert_eq!(
        counter(r#"dne_filter_results_total{result="fits_nowhere"}"#),
        1.0
    );
    assert_eq!(
        counter(r#"dne_filter_results_total{result="invalid_request"}"#),
        1.0
    );
    assert_eq!(
        counter(r#"dne_filter_results_total{result="pass_through"}"#),
        1.0
    );
    assert_eq!(
        counter(r#"dne_filter_rejected_nodes_total{reason="insufficient_gpu"}"#),
        3.0
    );
    assert_eq!(
        counter(r#"dne_filter_rejected_nodes_total{reason="device_not_advertised"}"#),
        1.0
    );
    assert_eq!(
        counter(r#"dne_filter_rejected_nodes_total{reason="invalid_request"}"#),
        4.0
    );

    // Capacity, from the objects alone.
    let gpus = gpus_from_objects(&yaml_docs(&std::fs::read_to_string(&path).unwrap()));
    let healthy = gpus.values().filter(|g| g.healthy);
    let (total, used): (i64, i64) =
        healthy.fold((0, 0), |(t, u), g| (t + g.memory, u + g.used_memory));
    assert_eq!(counter("dne_gpu_memory_total_bytes"), total as f64);
    assert_eq!(counter("dne_gpu_memory_used_bytes"), used as f64);
    let whole_free = gpus
        .values()
        .filter(|g| g.healthy && g.holders.is_empty())
        .count();
    assert_eq!(
        counter(r#"dne_devices{state="whole_free",type="gpu"}"#),
        whole_free as f64
    );
    assert!(
        !text.contains("dne_node_"),
        "per-node series only with --per-node-metrics"
    );
    svc.shutdown().await.unwrap();
}
