//! The real binary in offline mode (`serve --cluster-file`): a bind is recorded in memory and
//! later filters and scores see it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::service::Http;

/// Kills the child however the test ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn example(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(path)
}

fn request(path: &str) -> Value {
    let text = std::fs::read_to_string(example(path)).expect("example request");
    serde_json::from_str(&text).expect("example request is JSON")
}

fn scores(v: &Value) -> Vec<(String, i64)> {
    v.as_array()
        .expect("prioritize answers a list")
        .iter()
        .map(|h| {
            (
                h["Host"].as_str().unwrap().to_string(),
                h["Score"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn offline_binary_bind_is_seen_by_later_filters_and_scores() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_device-numa-extender"))
        .args(["serve", "--cluster-file"])
        .arg(example("cluster.yaml"))
        .args(["--listen", &addr, "--shutdown-delay", "0s"])
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("spawn the binary");
    let _guard = Killed(child);
    let http = Http::new(addr.parse().unwrap());
    // The HTTP client panics on connection refused; poll the port first.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(&addr).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the binary never listened: {}",
            std::fs::read_to_string(log.path()).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    http.wait_ready(Duration::from_secs(10)).await;

    let filter = request("requests/filter.json");
    let prioritize = request("requests/prioritize.json");
    let bind = request("requests/bind.json");
    let uid = bind["PodUID"].as_str().unwrap().to_string();
    // The same pod asking for 7 whole GPUs: gpu-node-2 has exactly 7 healthy ones.
    let mut seven = filter.clone();
    seven["Pod"]["spec"]["containers"][0]["resources"] =
        json!({"requests": {"nvidia.com/gpu": "7"}, "limits": {"nvidia.com/gpu": "7"}});

    let (_, f_before) = http.post("/filter", &filter).await;
    let (_, s_before) = http.post("/prioritize", &prioritize).await;
    let (_, seven_before) = http.post("/filter", &seven).await;
    assert!(
        seven_before["NodeNames"]
            .as_array()
            .unwrap()
            .contains(&json!("gpu-node-2")),
        "{seven_before}"
    );
    let (_, node_before) = http.get("/debug/nodes/gpu-node-2").await;
    assert!(
        node_before["state"]["devices"]["entries"]
            .as_object()
            .unwrap()
            .is_empty(),
        "{node_before}"
    );

    let (status, bound) = http.post("/bind", &bind).await;
    assert_eq!((status, &bound["Error"]), (200, &json!("")), "{bound}");

    let (_, node_after) = http.get("/debug/nodes/gpu-node-2").await;
    let entry = &node_after["state"]["devices"]["entries"][&uid];
    let allocation = entry["allocation"]
        .as_str()
        .unwrap_or_else(|| panic!("{node_after}"));
    let shares = super::gpu_shares(allocation);
    assert_eq!(shares.len(), 1, "{allocation}");
    assert_eq!(shares[0].1, 50, "{allocation}");
    assert_ne!(shares[0].0, 5, "minor 5 is unhealthy");
    super::check_capacity(&node_after["state"]["devices"]).unwrap();

    // The shared filter still passes gpu-node-2 (plenty left) but its score drops; the
    // seven-GPU request no longer fits there.
    let (_, f_after) = http.post("/filter", &filter).await;
    assert_eq!(f_after["NodeNames"], f_before["NodeNames"], "{f_after}");
    let (_, s_after) = http.post("/prioritize", &prioritize).await;
    let score = |s: &[(String, i64)], node: &str| s.iter().find(|(h, _)| h == node).unwrap().1;
    let (before, after) = (scores(&s_before), scores(&s_after));
    // Scores are normalised to the best node (gpu-node-2 stays 10), so the half-used GPU
    // shows as gpu-node-0 gaining on it.
    assert!(
        score(&after, "gpu-node-0") > score(&before, "gpu-node-0"),
        "the bind did not change the scores: {before:?} → {after:?}"
    );
    let (_, seven_after) = http.post("/filter", &seven).await;
    assert!(
        !seven_after["NodeNames"]
            .as_array()
            .unwrap()
            .contains(&json!("gpu-node-2")),
        "{seven_after}"
    );
    assert!(
        seven_after["FailedNodes"]["gpu-node-2"].is_string(),
        "{seven_after}"
    );

    // A retried bind is a success that allocates nothing more.
    let (_, again) = http.post("/bind", &bind).await;
    assert_eq!(again["Error"], "", "{again}");
    let (_, node_again) = http.get("/debug/nodes/gpu-node-2").await;
    assert_eq!(
        node_again["state"]["devices"]["entries"],
        node_after["state"]["devices"]["entries"]
    );
}
