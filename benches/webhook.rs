//! The admission webhook under load: the real service (in-process, on the example cluster) with
//! `--webhook-listen` over TLS, driven by keep-alive HTTPS clients in this process.
//!
//! Reports, per number of concurrent connections (1, 8, 64), for a review that is routed (a GPU
//! pod of the default scheduler: a JSON patch comes back), one that is not (a plain pod), and
//! the baseline of the same run (`GET /healthz` on the same listener: TLS, HTTP and the
//! listener's limits, no review): p50, p99 and max latency (client side: send → last response
//! byte), requests per second, and the ratio of each review's p50 to the baseline's. The
//! webhook's `timeoutSeconds` in the chart is 5 s; the max column is what to hold against it.
//!
//! Bounded: a fixed request count per connection and a time cap per phase, loopback only.
//! Run: `cargo bench --bench webhook` (see BENCHMARKS.md).

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use tokio_rustls::TlsConnector;

use device_numa_extender::app::Service;

const CONNECTIONS: [usize; 3] = [1, 8, 64];
/// Requests per connection and case (fewer per connection as connections grow).
const REQUESTS_TOTAL: usize = 4_000;
const PHASE_CAP: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug)]
enum Case {
    Healthz,
    Routed,
    Plain,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Healthz => "baseline (GET /healthz)",
            Case::Routed => "review: GPU pod, routed",
            Case::Plain => "review: plain pod",
        }
    }
}

fn review(limits: serde_json::Value) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "ml",
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:ml:job-controller", "groups": ["system:serviceaccounts"]},
                "object": {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"generateName": "train-", "namespace": "ml",
                                 "labels": {"app": "train", "job-name": "train"},
                                 "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(512)}},
                    "spec": {
                        "schedulerName": "default-scheduler",
                        "containers": [
                            {"name": "main", "image": "registry.example/train:1",
                             "resources": {"limits": limits.clone(), "requests": limits}},
                            {"name": "sidecar", "image": "registry.example/log:1",
                             "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}}
                        ],
                        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
                    }
                },
                "oldObject": null,
                "dryRun": false,
                "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
            }
        }))
        .expect("a JSON value serializes"),
    )
}

struct Certs {
    dir: tempfile::TempDir,
    ca: CertificateDer<'static>,
}

fn certificates() -> Certs {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, "bench CA");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).unwrap();
    Certs {
        dir,
        ca: ca.der().clone(),
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr, tls: &TlsConnector) -> Sender {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let stream = tls
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn one(sender: &mut Sender, case: Case, routed: &Bytes, plain: &Bytes) -> Duration {
    let (method, path, body) = match case {
        Case::Healthz => ("GET", "/healthz", Bytes::new()),
        Case::Routed => ("POST", "/mutate-pods", routed.clone()),
        Case::Plain => ("POST", "/mutate-pods", plain.clone()),
    };
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    sender.ready().await.unwrap();
    let started = Instant::now();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let took = started.elapsed();
    assert!(status.is_success(), "{case:?}: {status} {body:?}");
    if matches!(case, Case::Routed) {
        assert!(
            body.windows(9).any(|w| w == b"JSONPatch"),
            "a routed review carries a patch"
        );
    }
    took
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let certs = certificates();
        let cert = certs.dir.path().join("tls.crt");
        let key = certs.dir.path().join("tls.key");
        let cluster = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/cluster.yaml");
        let args = support::service::serve_args(&[
            "--cluster-file",
            cluster,
            "--webhook-listen",
            "127.0.0.1:0",
            "--webhook-tls-cert-file",
            cert.to_str().unwrap(),
            "--webhook-tls-key-file",
            key.to_str().unwrap(),
            "--max-connections",
            "1024",
        ]);
        let svc = Service::start(args, None).await.expect("service starts");
        let addr = svc.webhook_addr.expect("the webhook listens");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(certs.ca.clone()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tls = TlsConnector::from(Arc::new(config));
        let routed = review(json!({"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}));
        let plain = review(json!({"cpu": "8", "memory": "64Gi"}));

        println!(
            "webhook under load: {REQUESTS_TOTAL} requests per case and connection count, keep-alive HTTPS, loopback"
        );
        println!(
            "{:>5}  {:<26} {:>9} {:>9} {:>9} {:>10} {:>12}",
            "conns", "case", "p50 ms", "p99 ms", "max ms", "req/s", "p50/baseline"
        );
        for conns in CONNECTIONS {
            let mut baseline_p50 = None;
            for case in [Case::Healthz, Case::Routed, Case::Plain] {
                let per_conn = REQUESTS_TOTAL / conns;
                let started = Instant::now();
                let mut tasks = Vec::new();
                for _ in 0..conns {
                    let (tls, routed, plain) = (tls.clone(), routed.clone(), plain.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut sender = connect(addr, &tls).await;
                        let mut times = Vec::with_capacity(per_conn);
                        let phase = Instant::now();
                        for _ in 0..per_conn {
                            if phase.elapsed() > PHASE_CAP {
                                break;
                            }
                            times.push(one(&mut sender, case, &routed, &plain).await);
                        }
                        times
                    }));
                }
                let mut times = Vec::new();
                for t in tasks {
                    times.extend(t.await.unwrap());
                }
                let wall = started.elapsed();
                times.sort();
                let p50 = percentile(&times, 0.5);
                let base = *baseline_p50.get_or_insert(p50);
                println!(
                    "{:>5}  {:<26} {:>9.3} {:>9.3} {:>9.3} {:>10.0} {:>12.2}",
                    conns,
                    case.name(),
                    p50.as_secs_f64() * 1e3,
                    percentile(&times, 0.99).as_secs_f64() * 1e3,
                    times.last().unwrap().as_secs_f64() * 1e3,
                    times.len() as f64 / wall.as_secs_f64(),
                    p50.as_secs_f64() / base.as_secs_f64(),
                );
            }
        }
        svc.shutdown().await.unwrap();
    });
}
