//! The real binary, black-box: offline from the example cluster file answering the example
//! requests, online against the fake API server through a kubeconfig, and graceful SIGTERM
//! (`/readyz` fails first, then the process exits 0).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::service::{self, Http};
use crate::support::{FakeApiServer, Kind};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A child process killed on drop (test failure included), its log printed when failing.
pub(crate) struct Running {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
    pub(crate) addr: SocketAddr,
}

impl Running {
    pub(crate) fn start(args: &[&str]) -> Running {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("extender.log");
        let out = std::fs::File::create(&log).expect("log file");
        let addr = free_port();
        let listen = addr.to_string();
        let child = Command::new(env!("CARGO_BIN_EXE_device-numa-extender"))
            .arg("serve")
            // Long enough that no poll can miss it: `terminate` ends it with a second SIGTERM
            // once it has seen the 503.
            .args(["--listen", &listen, "--shutdown-delay", "120s"])
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .expect("start the binary");
        Running {
            child,
            log,
            _dir: dir,
            addr,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    /// Polls until the process exits; fails the test after `timeout`.
    async fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "still running {timeout:?} after SIGTERM:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- extender log ----\n{}", self.log());
        }
    }
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

pub(crate) async fn wait_ready(http: &Http, p: &mut Running) -> Value {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if let Some((200, body)) = http.try_get("/readyz").await {
            return body;
        }
        if let Some(status) = p.child.try_wait().expect("try_wait") {
            panic!(
                "the binary exited with {status} before becoming ready:\n{}",
                p.log()
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready after {TIMEOUT:?}:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGTERM: `/readyz` fails during `--shutdown-delay` (120 s here); a second SIGTERM, sent
/// once the 503 was seen, ends the delay; the process exits 0. Orderings, with hang guards.
pub(crate) async fn terminate(http: &Http, p: &mut Running) {
    p.sigterm();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        match http.try_get("/readyz").await {
            Some((503, body)) => {
                assert!(
                    body["reasons"].to_string().contains("shutting down"),
                    "{body}"
                );
                break;
            }
            Some((200, _)) => {}
            other => panic!(
                "/readyz must answer 503 during the shutdown delay, got {other:?}:\n{}",
                p.log()
            ),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz still 200 {TIMEOUT:?} after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p.sigterm();
    let status = p.wait_exit(TIMEOUT).await;
    assert!(status.success(), "exit status {status}:\n{}", p.log());
}

fn example_requests() -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/requests");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .expect("examples/requests")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let body = serde_json::from_slice(&std::fs::read(&p).unwrap()).expect("example JSON");
            (name, body)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_serves_the_example_cluster_file_and_answers_the_example_requests() {
    let mut p = Running::start(&["--cluster-file", "examples/cluster.yaml"]);
    let http = Http::new(p.addr);
    let ready = wait_ready(&http, &mut p).await;
    assert_eq!(ready["kinds"]["devices"]["phase"], "synced", "{ready}");

    let requests = example_requests();
    assert!(
        requests.len() >= 5,
        "{:?}",
        requests.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    // Filters and prioritizes first, binds last (a bind changes what fits).
    let verb = |name: &str| name.split(['-', '.']).next().unwrap_or("").to_string();
    let mut ordered = requests.clone();
    ordered.sort_by_key(|(name, _)| verb(name) == "bind");
    for (name, body) in &ordered {
        let path = format!("/{}", verb(name));
        let (status, r) = http.post(&path, body).await;
        assert_eq!(status, 200, "{name}: {r}");
        let candidates: Vec<&str> = body["NodeNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        match verb(name).as_str() {
            "filter" => {
                assert_eq!(r["Error"], "", "{name}: {r}");
                let passing: Vec<&str> = r["NodeNames"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{name}: {r}"))
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                assert!(!passing.is_empty(), "{name}: some node fits: {r}");
                for node in &candidates {
                    let answered = passing.contains(node) as u8
                        + r["FailedNodes"].get(node).is_some() as u8
                        + r["FailedAndUnresolvableNodes"].get(node).is_some() as u8;
                    assert_eq!(answered, 1, "{name}: {node} answered exactly once: {r}");
                }
            }
            "prioritize" => {
                // Relative to the lowest score, which is left out: every listed score inside
                // the extender API's 1..=10, and no listed host at the lowest score.
                assert!(!candidates.is_empty(), "{name}: names mode");
                let added = crate::support::service::scores_as_added(&r, &candidates);
                let (lo, hi) = added.iter().fold((i64::MAX, i64::MIN), |(lo, hi), (_, s)| {
                    (lo.min(*s), hi.max(*s))
                });
                assert!(hi - lo <= 10 && lo == 0 && hi <= 10, "{name}: {r}");
                assert!(added.iter().any(|(_, s)| *s == 0), "{name}: {r}");
                assert!(
                    r.as_array().unwrap().iter().all(|s| s["Score"] != 0),
                    "{name}: {r}"
                );
            }
            "bind" => assert_eq!(r, serde_json::json!({"Error": ""}), "{name}"),
            other => panic!("unexpected example {name} ({other})"),
        }
    }
    terminate(&http, &mut p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_bootstraps_from_a_kubeconfig_and_stops_on_sigterm() {
    let fake = FakeApiServer::new();
    for n in ["n0", "n1"] {
        fake.create(Kind::Node, service::node(n)).unwrap();
        fake.create(Kind::Device, service::gpu_device(n, 8, 4, &[]))
            .unwrap();
        fake.create(Kind::NodeResourceTopology, service::nrt(n))
            .unwrap();
    }
    fake.create(
        Kind::Pod,
        service::pod(
            "ml",
            "holder",
            "uid-holder",
            serde_json::json!({"nvidia.com/gpu": "1"}),
            Some("n0"),
            Some(&service::whole_gpus(&[0])),
        ),
    )
    .unwrap();
    let served = fake.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    served.write_kubeconfig(&kubeconfig).unwrap();

    let mut p = Running::start(&["--kubeconfig", kubeconfig.to_str().unwrap()]);
    let http = Http::new(p.addr);
    let ready = wait_ready(&http, &mut p).await;
    for kind in ["nodes", "pods", "devices", "noderesourcetopologies"] {
        assert_eq!(ready["kinds"][kind]["phase"], "synced", "{ready}");
    }
    assert_eq!(ready["kinds"]["pods"]["cached"], 1, "{ready}");
    let (status, node) = http.get("/debug/nodes/n0").await;
    assert_eq!(status, 200);
    assert!(
        node["state"]["devices"]["entries"]["uid-holder"].is_object(),
        "{node}"
    );
    terminate(&http, &mut p).await;
}
