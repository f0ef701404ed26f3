//! `inspect --pod` (issue 39 part 3): the nodes nearest to fitting, what each lacks, and what
//! would make the pod fit — the victims preemption would take and the fewest moves — each
//! answer then made true (the objects changed as it says) and the pod placed by `simulate`.
//!
//! The cluster is built here and every expectation is worked out from its objects.

use serde_json::{Value, json};

use device_numa_extender::ops::simulate::simulate;
use device_numa_extender::scheduler::ScoringConfig;

use crate::support::service;

/// A node with four 80Gi GPUs (two per NUMA node), advertised to kube-scheduler as
/// `nvidia.com/gpu` by the device plugin.
fn gpu_node(name: &str) -> [Value; 2] {
    let mut node = service::node(name);
    node["status"]["allocatable"]["nvidia.com/gpu"] = json!("4");
    [node, service::gpu_device(name, 4, 2, &[])]
}

/// Whole GPUs asked by `nvidia.com/gpu` (kube-scheduler counts them) or by koordinator's ratio
/// (100 per card, `ignoredByScheduler`: left to the extender).
fn cards(n: usize, counted: bool) -> Value {
    if counted {
        json!({"nvidia.com/gpu": n.to_string()})
    } else {
        json!({"koordinator.sh/gpu-memory-ratio": (100 * n).to_string()})
    }
}

/// A running pod of `priority` on `node` holding `minors` whole.
fn holder(name: &str, node: &str, minors: &[i32], priority: i32, counted: bool) -> Value {
    let mut p = service::pod(
        "ml",
        name,
        &format!("uid-{name}"),
        cards(minors.len(), counted),
        Some(node),
        Some(&service::whole_gpus(minors)),
    );
    p["spec"]["priority"] = json!(priority);
    p["status"] = json!({"phase": "Running"});
    p
}

fn pending(priority: i32) -> Value {
    let mut p = service::pending("big", cards(4, true));
    p["spec"]["priority"] = json!(priority);
    p
}

/// a: two pods of 2 counted GPUs each (priorities -10 and 5); b: one of priority 50 holding all
/// four, counted; c and d: one pod of priority 1000 holding two by ratio, two free.
fn cluster(extra: &[Value], without: &[&str]) -> String {
    let mut items: Vec<Value> = ["a", "b", "c", "d"]
        .iter()
        .flat_map(|n| gpu_node(n))
        .collect();
    items.extend([
        holder("low-1", "a", &[0, 1], -10, true),
        holder("low-2", "a", &[2, 3], 5, true),
        holder("mid", "b", &[0, 1, 2, 3], 50, true),
        holder("c-hold", "c", &[0, 1], 1000, false),
        holder("d-hold", "d", &[0, 1], 1000, false),
    ]);
    items.retain(|i| {
        !without.contains(&i["metadata"]["name"].as_str().unwrap_or_default()) || i["kind"] != "Pod"
    });
    items.extend(extra.iter().cloned());
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

fn inspect(dir: &std::path::Path, cluster_text: &str, pods_text: &str) -> Value {
    inspect_with(dir, cluster_text, pods_text, &[])
}

fn inspect_with(
    dir: &std::path::Path,
    cluster_text: &str,
    pods_text: &str,
    extra: &[&str],
) -> Value {
    let cluster_path = dir.join("cluster.json");
    let pods_path = dir.join("pods.json");
    std::fs::write(&cluster_path, cluster_text).unwrap();
    std::fs::write(&pods_path, pods_text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_device-numa-extender"))
        .args(["inspect", "--cluster-file"])
        .arg(&cluster_path)
        .arg("--pods")
        .arg(&pods_path)
        .args(["--pod", "ml/big", "-o", "json"])
        .args(extra)
        .env_remove("KUBECONFIG")
        .output()
        .expect("run the binary");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("inspect --pod -o json is JSON")
}

fn list(pods: &[Value]) -> String {
    json!({"apiVersion": "v1", "kind": "List", "items": pods}).to_string()
}

/// Where `simulate` puts the pod on `cluster_text`, if anywhere.
async fn placed_on(cluster_text: &str, pod: &Value) -> Option<String> {
    let sim = simulate(
        cluster_text,
        "cluster.json",
        &list(std::slice::from_ref(pod)),
        "pods.json",
        ScoringConfig::default(),
    )
    .await
    .expect("simulate runs");
    sim.report.placements[0].node.clone()
}

#[tokio::test]
async fn inspect_pod_names_the_nearest_nodes_and_what_would_make_it_fit() {
    let dir = tempfile::tempdir().unwrap();
    let big = pending(10);
    let text = cluster(&[], &[]);
    let got = inspect(dir.path(), &text, &list(std::slice::from_ref(&big)));
    assert_eq!(got["pod"], "ml/big");
    assert_eq!(got["fits_on"], json!([]), "{got:#}");

    // c and d have 2 of the 4 asked free (50 %): the extender's refusals, nearest first; a and b
    // have every advertised GPU requested: kube-scheduler's own.
    let nearest: Vec<(String, String, Value, String)> = got["nearest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node"].as_str().unwrap().to_string(),
                n["reason"].as_str().unwrap().to_string(),
                n["covers_percent"].clone(),
                n["by"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let two = "insufficient gpu devices: 2 whole gpus free, pod asks 4";
    let kube = "Insufficient nvidia.com/gpu";
    let row =
        |n: &str, r: &str, c: Value, by: &str| (n.to_string(), r.to_string(), c, by.to_string());
    assert_eq!(
        nearest,
        vec![
            row("c", two, json!(50), "extender"),
            row("d", two, json!(50), "extender"),
            row("a", kube, Value::Null, "kube-scheduler"),
            row("b", kube, Value::Null, "kube-scheduler"),
        ],
        "{got:#}"
    );
    // kube-scheduler's histogram: "N reason" strings in byte order ('I' before 'i').
    assert_eq!(
        got["message"],
        format!("0/4 nodes are available: 2 {kube}, 2 {two}."),
    );

    // Preemption: on a, both pods are below priority 10 and kube-scheduler's own fit needs both
    // gone (each frees 2 counted GPUs); on b the holder outranks the pod; on c and d too.
    assert_eq!(
        got["preemption"],
        json!([{"node": "a", "pdb_violations": 0, "victims": [
            {"pod": "ml/low-1", "priority": -10}, {"pod": "ml/low-2", "priority": 5}]}]),
        "{got:#}"
    );
    // Made true: without the victims the pod lands on a.
    let preempted = cluster(&[], &["low-1", "low-2"]);
    assert_eq!(placed_on(&preempted, &big).await.as_deref(), Some("a"));
    assert_eq!(placed_on(&text, &big).await, None);

    // Moves: one pod, c's holder to d (the nearest node first; d's holder to c would do too).
    assert_eq!(
        got["moves"],
        json!({"node": "c", "moves": [{"pod": "ml/c-hold", "to": "d"}]}),
        "{got:#}"
    );
    // Made true: c's holder rebound to d's two free GPUs; the pod lands on c.
    let moved = cluster(&[holder("c-hold", "d", &[2, 3], 1000, false)], &["c-hold"]);
    assert_eq!(placed_on(&moved, &big).await.as_deref(), Some("c"));

    // At priority 0 only a's low-1 (-10) is below the pod, and it frees 2 of the 4 asked.
    let got = inspect(dir.path(), &text, &list(&[pending(0)]));
    assert_eq!(got["preemption"], json!([]), "{got:#}");
    assert!(got.get("preemption_note").is_none(), "{got:#}");

    // The same GPUs asked by ratio, which kube-scheduler does not count: removing a's pods
    // would make room, but its dry run proposes no victims (issue 38), and inspect says so.
    let mut by_ratio = service::pending("big", cards(4, false));
    by_ratio["spec"]["priority"] = json!(10);
    let got = inspect(dir.path(), &text, &list(&[by_ratio]));
    assert_eq!(got["preemption"], json!([]), "{got:#}");
    let note = got["preemption_note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("on 1 node(s) removing lower-priority pods would make room"),
        "{got:#}"
    );
}

/// PodDisruptionBudgets as kube-scheduler reads them: on node a (two pods of 2 counted GPUs, the
/// pod asks 2), kube-scheduler reprieves the higher priority first and evicts low-1; with a
/// budget protecting low-1 it reprieves low-1 first (a violating victim) and evicts low-2; with
/// both protected it evicts one and counts the violation.
#[tokio::test]
async fn inspect_pod_reprieves_budget_protected_victims_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut two = service::pending("big", cards(2, true));
    two["spec"]["priority"] = json!(10);
    let pdb = |name: &str, app: &str| {
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}})
    };
    let labeled = |name: &str, minors: &[i32], priority: i32, app: &str| {
        let mut p = holder(name, "a", minors, priority, true);
        p["metadata"]["labels"] = json!({"app": app});
        p
    };
    let victims_on_a = |extra: &[Value]| {
        let mut items = extra.to_vec();
        // c and d full, by pods that outrank the pod: only a can make room.
        items.push(holder("c-more", "c", &[2, 3], 1000, false));
        items.push(holder("d-more", "d", &[2, 3], 1000, false));
        items.push(labeled("low-1", &[0, 1], -10, "one"));
        items.push(labeled("low-2", &[2, 3], 5, "two"));
        let text = cluster(&items, &["low-1", "low-2"]);
        let got = inspect(dir.path(), &text, &list(std::slice::from_ref(&two)));
        let a = got["preemption"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["node"] == "a")
            .cloned()
            .unwrap_or_else(|| panic!("no preemption on a: {got:#}"));
        let pods: Vec<String> = a["victims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["pod"].as_str().unwrap().to_string())
            .collect();
        (pods, a["pdb_violations"].as_i64().unwrap())
    };
    assert_eq!(victims_on_a(&[]), (vec!["ml/low-1".to_string()], 0));
    assert_eq!(
        victims_on_a(&[pdb("one", "one")]),
        (vec!["ml/low-2".to_string()], 0)
    );
    assert_eq!(
        victims_on_a(&[pdb("one", "one"), pdb("two", "two")]),
        (vec!["ml/low-1".to_string()], 1)
    );
}

/// With the GPU share totals advertised and counted (`--gpu-share-totals`, README
/// "Preemption"), kube-scheduler's dry run proposes victims for a pod asking by ratio, and
/// inspect shows them where before it could only say that none would be proposed.
#[tokio::test]
async fn inspect_pod_with_share_totals_counted_shows_the_victims() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = service::node("e");
    node["status"]["allocatable"]["koordinator.sh/gpu-memory-ratio"] = json!("400");
    let items = vec![
        node,
        service::gpu_device("e", 4, 2, &[]),
        holder("low-1", "e", &[0, 1], -10, false),
        holder("low-2", "e", &[2, 3], 5, false),
    ];
    let text = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    let mut by_ratio = service::pending("big", cards(2, false));
    by_ratio["spec"]["priority"] = json!(10);
    let pods = list(&[by_ratio]);
    // Ignored (the default): removing a pod would make room, but none is proposed.
    let got = inspect(dir.path(), &text, &pods);
    assert_eq!(got["preemption"], json!([]), "{got:#}");
    assert!(
        got["preemption_note"]
            .as_str()
            .is_some_and(|n| n.contains("--gpu-share-totals")),
        "{got:#}"
    );
    // Counted: kube-scheduler reprieves low-2 (priority 5) and proposes low-1 (-10), whose two
    // cards the extender then finds free for the pod.
    let got = inspect_with(
        dir.path(),
        &text,
        &pods,
        &["--gpu-share-totals", "extender"],
    );
    assert_eq!(
        got["preemption"],
        json!([{"node": "e", "pdb_violations": 0, "victims": [{"pod": "ml/low-1", "priority": -10}]}]),
        "{got:#}"
    );
    assert!(got.get("preemption_note").is_none(), "{got:#}");
}

/// `simulate --gpu-share-totals`: with the share names counted, kube-scheduler's resource fit
/// refuses a node whose advertised totals are short, whatever its cards hold; ignored (the
/// default), the extender alone decides.
#[tokio::test]
async fn simulate_counts_share_totals_as_the_deployment_does() {
    use device_numa_extender::ops::simulate::simulate_as;
    use device_numa_extender::scheduler::share_totals::ShareTotals;
    // Four free cards, but the Node advertises one card's ratio.
    let mut node = service::node("e");
    node["status"]["allocatable"]["koordinator.sh/gpu-memory-ratio"] = json!("100");
    let text = json!({"apiVersion": "v1", "kind": "List",
        "items": [node, service::gpu_device("e", 4, 2, &[])]})
    .to_string();
    let pod = service::pending("big", cards(2, false));
    let run = |mode| {
        let (text, pods) = (text.clone(), list(std::slice::from_ref(&pod)));
        async move {
            simulate_as(
                &text,
                "c.json",
                &pods,
                "p.json",
                ScoringConfig::default(),
                mode,
            )
            .await
            .expect("simulate runs")
            .report
            .placements
            .remove(0)
        }
    };
    assert_eq!(run(ShareTotals::Ignored).await.node.as_deref(), Some("e"));
    let counted = run(ShareTotals::Extender).await;
    assert_eq!(counted.node, None, "{counted:?}");
    let text = serde_json::to_string(&counted).unwrap();
    assert!(
        text.contains("Insufficient koordinator.sh/gpu-memory-ratio"),
        "{text}"
    );
}

/// Against a cluster (`--kubeconfig`, the fake API server holding the same objects), the
/// answer equals the cluster file's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_pod_through_a_kubeconfig_equals_the_cluster_file() {
    use crate::support::{FakeApiServer, Kind};
    let dir = tempfile::tempdir().unwrap();
    let big = pending(10);
    let text = cluster(&[], &[]);
    let from_file = inspect(dir.path(), &text, &list(std::slice::from_ref(&big)));

    let fake = FakeApiServer::new();
    let parsed: Value = serde_json::from_str(&text).unwrap();
    for item in parsed["items"].as_array().unwrap().iter().chain([&big]) {
        let kind = match item["kind"].as_str().unwrap() {
            "Node" => Kind::Node,
            "Pod" => Kind::Pod,
            "Device" => Kind::Device,
            other => panic!("unexpected kind {other}"),
        };
        fake.create(kind, item.clone()).expect("create");
    }
    let served = fake.serve().await;
    let kubeconfig = dir.path().join("kubeconfig");
    served.write_kubeconfig(&kubeconfig).unwrap();
    let from_kube = inspect_pod_online(kubeconfig, "ml/big").await;
    assert_eq!(from_kube, from_file);
    assert_eq!(from_kube["preemption"][0]["node"], "a", "{from_kube:#}");

    // A running pod is not pending: said, and nothing computed for it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_device-numa-extender"))
        .args(["inspect", "--cluster-file"])
        .arg(dir.path().join("cluster.json"))
        .args(["--pod", "ml/low-1"])
        .env_remove("KUBECONFIG")
        .output()
        .expect("run the binary");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "pod ml/low-1 (priority -10) is not pending: assigned to a\n"
    );

    // A name that is not there, or not NAMESPACE/NAME, is an error that says so.
    for (arg, says) in [
        ("ml/absent", "no such pod"),
        ("big", "expected NAMESPACE/NAME"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_device-numa-extender"))
            .args(["inspect", "--cluster-file"])
            .arg(dir.path().join("cluster.json"))
            .args(["--pod", arg])
            .env_remove("KUBECONFIG")
            .output()
            .expect("run the binary");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(says),
            "{arg}: {stderr}"
        );
    }
}

/// `inspect --kubeconfig <kubeconfig> --pod <pod> -o json` run as the binary (off the async
/// runtime: the fake API server it asks runs on it), its JSON answer.
pub(crate) async fn inspect_pod_online(kubeconfig: std::path::PathBuf, pod: &str) -> Value {
    let pod = pod.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_device-numa-extender"))
            .args(["inspect", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--pod", &pod, "-o", "json"])
            .env_remove("KUBECONFIG")
            .output()
            .expect("run the binary")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("inspect --pod -o json is JSON")
}
