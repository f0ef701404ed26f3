//! Who may call bind: the verb listener over TLS with client-certificate verification
//! (kube-scheduler's `enableHTTPS` + `tlsConfig`), probes and metrics on their own plain port,
//! certificate rotation through a Secret-style atomic symlink swap, and the loopback-only
//! verb listener of the chart's sidecar mode.
//!
//! Certificates are generated at test time (rcgen); no key is committed. Outcomes are judged
//! from the fake API server (was the pod bound?), from the certificate the server really
//! presented, and from the server's metrics; every wait is a hang guard, not a speed bound.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tokio_rustls::TlsConnector;

use crate::gpu::metric_value;
use crate::support::service::{self, Http};
use crate::support::{FakeApiServer, Kind};

/// Only stops a hang; nothing here is a speed bound.
const HANG_GUARD: Duration = Duration::from_secs(60);

// ---- certificates ----------------------------------------------------------------------------

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate and its key, as PEM, plus the DER the server must present.
struct Leaf {
    cert_pem: String,
    key_pem: String,
    der: Vec<u8>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ca {
            issuer: CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn leaf(&self, common_name: &str, serial: u64, usage: ExtendedKeyUsagePurpose) -> Leaf {
        let mut p =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, common_name);
        p.serial_number = Some(SerialNumber::from_slice(&serial.to_be_bytes()));
        p.extended_key_usages = vec![usage];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    fn server(&self, common_name: &str, serial: u64) -> Leaf {
        self.leaf(common_name, serial, ExtendedKeyUsagePurpose::ServerAuth)
    }

    fn client(&self, common_name: &str) -> Leaf {
        self.leaf(common_name, 7, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

// ---- a Secret volume ---------------------------------------------------------------------------

/// A directory laid out like a mounted Secret: `name -> ..data/name`, `..data -> ..<gen>/`.
/// An update writes a new generation and renames a fresh `..data` symlink over the old one,
/// the atomic swap kubelet does.
struct SecretDir {
    root: tempfile::TempDir,
    generation: u32,
}

impl SecretDir {
    fn new(files: &[(&str, &str)]) -> SecretDir {
        let mut dir = SecretDir {
            root: tempfile::tempdir().unwrap(),
            generation: 0,
        };
        dir.update(files);
        for (name, _) in files {
            std::os::unix::fs::symlink(Path::new("..data").join(name), dir.root.path().join(name))
                .unwrap();
        }
        dir
    }

    fn update(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let generation = format!("..gen{}", self.generation);
        let gen_dir = self.root.path().join(&generation);
        std::fs::create_dir(&gen_dir).unwrap();
        for (name, content) in files {
            std::fs::write(gen_dir.join(name), content).unwrap();
        }
        let tmp = self.root.path().join("..data_tmp");
        std::os::unix::fs::symlink(&generation, &tmp).unwrap();
        std::fs::rename(&tmp, self.root.path().join("..data")).unwrap();
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }
}

fn secret_files<'a>(server: &'a Leaf, client_ca: &'a str) -> [(&'static str, &'a str); 3] {
    [
        ("tls.crt", server.cert_pem.as_str()),
        ("tls.key", server.key_pem.as_str()),
        ("ca.crt", client_ca),
    ]
}

fn tls_flags(secret: &SecretDir) -> Vec<String> {
    let p = |n: &str| secret.path(n).display().to_string();
    vec![
        "--tls-cert-file".into(),
        p("tls.crt"),
        "--tls-key-file".into(),
        p("tls.key"),
        "--tls-client-ca-file".into(),
        p("ca.crt"),
        "--probe-address".into(),
        "127.0.0.1:0".into(),
        "--tls-reload-interval".into(),
        "50ms".into(),
    ]
}

// ---- a TLS client ----------------------------------------------------------------------------

/// Trusts `server_ca`; presents `identity` when given.
fn client_config(server_ca: &Ca, identity: Option<&Leaf>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(server_ca.issuer.der().clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match identity {
        Some(leaf) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// One HTTP/1.1 connection over TLS, kept open across requests.
struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    /// The leaf certificate the server presented in this connection's handshake.
    served: Vec<u8>,
}

async fn connect(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Result<Conn, String> {
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let tls = TlsConnector::from(config)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let served = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.to_vec())
            .ok_or("no server certificate")?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("http handshake: {e}"))?;
        tokio::spawn(connection);
        Ok(Conn { sender, served })
    };
    tokio::time::timeout(HANG_GUARD, attempt)
        .await
        .map_err(|_| "connect hung".to_string())?
}

impl Conn {
    async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let attempt = async {
            self.sender
                .ready()
                .await
                .map_err(|e| format!("connection: {e}"))?;
            let body = body.map(|b| b.to_string()).unwrap_or_default();
            let req = hyper::Request::builder()
                .method(method)
                .uri(path)
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let resp = self
                .sender
                .send_request(req)
                .await
                .map_err(|e| format!("request: {e}"))?;
            let status = resp.status().as_u16();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?
                .to_bytes();
            let value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
            Ok((status, value))
        };
        tokio::time::timeout(HANG_GUARD, attempt)
            .await
            .map_err(|_| "request hung".to_string())?
    }
}

/// Connects and sends one request; any failure along the way is an `Err`.
async fn call(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    connect(addr, config)
        .await?
        .request(method, path, body)
        .await
}

// ---- fixtures ---------------------------------------------------------------------------------

fn cluster() -> (FakeApiServer, Value) {
    let fake = FakeApiServer::new();
    service::add_gpu_node(&fake, "n1", 4, &[]);
    let pod = service::pending("p", json!({"nvidia.com/gpu": "1"}));
    fake.create(Kind::Pod, pod.clone()).unwrap();
    (fake, pod)
}

fn node_of(fake: &FakeApiServer, pod: &Value) -> Option<String> {
    let name = pod["metadata"]["name"].as_str().unwrap();
    let ns = pod["metadata"]["namespace"].as_str().unwrap();
    fake.get(Kind::Pod, ns, name).unwrap()["spec"]["nodeName"]
        .as_str()
        .map(str::to_owned)
}

async fn metric(probes: &Http, name: &str, labels: &str) -> f64 {
    let (status, body) = probes.get("/metrics").await;
    assert_eq!(status, 200, "{body}");
    metric_value(body.as_str().unwrap_or_default(), name, labels)
}

/// Polls the metric until it reaches `at_least` (a hang guard, not a deadline to meet).
async fn wait_metric(probes: &Http, name: &str, labels: &str, at_least: f64) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let v = metric(probes, name, labels).await;
        if v >= at_least {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}{{{labels}}} stayed at {v}, expected >= {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

// ---- tests ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_clients_with_a_certificate_from_the_configured_ca_can_bind() {
    let (fake, pod) = cluster();
    let ca = Ca::new("dne-test-ca");
    let server = ca.server("dne-server", 1);
    let secret = SecretDir::new(&secret_files(&server, &ca.pem()));
    let svc = service::start(&fake, &as_strs(&tls_flags(&secret))).await;
    assert_ne!(svc.addr, svc.probe_addr);
    let probes = Http::new(svc.probe_addr);
    probes.wait_ready(HANG_GUARD).await;
    let bind = service::binding_args(&pod, "n1");

    // No client certificate: refused in the handshake, the bind never reaches a handler.
    let anonymous = call(
        svc.addr,
        client_config(&ca, None),
        "POST",
        "/bind",
        Some(&bind),
    )
    .await;
    assert!(
        anonymous.is_err(),
        "anonymous client got an answer: {anonymous:?}"
    );
    wait_metric(
        &probes,
        "dne_tls_handshake_failures_total",
        "reason=\"no_client_certificate\"",
        1.0,
    )
    .await;

    // A certificate from another CA (even one with the right name): refused too.
    let other_ca = Ca::new("dne-test-ca");
    let foreign = other_ca.client("system:kube-scheduler");
    let foreign_answer = call(
        svc.addr,
        client_config(&ca, Some(&foreign)),
        "POST",
        "/bind",
        Some(&bind),
    )
    .await;
    assert!(
        foreign_answer.is_err(),
        "foreign client got an answer: {foreign_answer:?}"
    );
    wait_metric(
        &probes,
        "dne_tls_handshake_failures_total",
        "reason=\"bad_client_certificate\"",
        1.0,
    )
    .await;

    // Plain HTTP on the TLS port: no HTTP answer at all.
    let plain = Http::new(svc.addr).try_post("/bind", &bind).await;
    assert!(
        plain.is_err() || plain.as_ref().is_ok_and(|(s, _)| *s != 200),
        "{plain:?}"
    );

    assert_eq!(node_of(&fake, &pod), None, "a refused client bound the pod");
    assert_eq!(
        metric(&probes, "dne_http_requests_total", "verb=\"bind\"").await,
        0.0
    );

    // The scheduler's certificate from the configured CA: answers, and the bind happens.
    let scheduler = ca.client("system:kube-scheduler");
    let mut conn = connect(svc.addr, client_config(&ca, Some(&scheduler)))
        .await
        .unwrap();
    assert_eq!(
        conn.served, server.der,
        "the configured serving certificate"
    );
    let (status, answer) = conn.request("POST", "/bind", Some(&bind)).await.unwrap();
    assert_eq!((status, &answer["Error"]), (200, &json!("")), "{answer}");
    assert_eq!(node_of(&fake, &pod).as_deref(), Some("n1"));
    let (status, debug) = conn.request("GET", "/debug/nodes/n1", None).await.unwrap();
    assert_eq!(status, 200, "{debug}");

    // Probes and metrics live on the probe port only, verbs on the verb port only.
    for path in ["/readyz", "/healthz", "/metrics"] {
        let (status, _) = conn.request("GET", path, None).await.unwrap();
        assert_eq!(
            status, 404,
            "{path} must not be served on the verb listener"
        );
    }
    let (status, body) = probes
        .post("/filter", &service::extender_args(&pod, &["n1"]))
        .await;
    assert_eq!(
        status, 404,
        "verbs must not be served on the probe port: {body}"
    );
    let (status, _) = probes.get("/debug/nodes/n1").await;
    assert_eq!(status, 404, "/debug must not be served on the probe port");
    svc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_serve_new_handshakes_and_old_connections_keep_working() {
    let (fake, _pod) = cluster();
    let ca = Ca::new("dne-test-ca");
    let first = ca.server("dne-server-first", 1);
    let mut secret = SecretDir::new(&secret_files(&first, &ca.pem()));
    let svc = service::start(&fake, &as_strs(&tls_flags(&secret))).await;
    let probes = Http::new(svc.probe_addr);
    probes.wait_ready(HANG_GUARD).await;
    let scheduler = ca.client("system:kube-scheduler");
    let trusted = client_config(&ca, Some(&scheduler));

    let mut old = connect(svc.addr, trusted.clone()).await.unwrap();
    assert_eq!(old.served, first.der);
    assert_eq!(
        old.request("GET", "/debug/nodes/n1", None).await.unwrap().0,
        200
    );

    // Rotate: a new serving certificate (new serial and subject), and a client CA bundle that
    // now also trusts a second CA.
    let second = ca.server("dne-server-second", 2);
    assert_ne!(first.der, second.der);
    let ca2 = Ca::new("dne-test-ca-2");
    let bundle = format!("{}{}", ca.pem(), ca2.pem());
    let from_ca2 = client_config(&ca, Some(&ca2.client("system:kube-scheduler")));
    assert!(
        call(svc.addr, from_ca2.clone(), "GET", "/debug/nodes/n1", None)
            .await
            .is_err(),
        "ca2 is not trusted before the rotation"
    );
    secret.update(&secret_files(&second, &bundle));

    // New handshakes get the new certificate once the poll saw it.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let conn = connect(svc.addr, trusted.clone()).await.unwrap();
        if conn.served == second.der {
            break;
        }
        assert_eq!(
            conn.served, first.der,
            "served neither the old nor the new certificate"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metric(
            &probes,
            "dne_tls_certificate_reloads_total",
            "outcome=\"ok\""
        )
        .await,
        1.0
    );
    let (status, _) = call(svc.addr, from_ca2, "GET", "/debug/nodes/n1", None)
        .await
        .unwrap();
    assert_eq!(status, 200, "the reloaded client CA bundle trusts ca2");
    // The connection opened before the rotation still works, on its original session.
    assert_eq!(
        old.request("GET", "/debug/nodes/n1", None).await.unwrap().0,
        200
    );
    assert_eq!(old.served, first.der);

    // A broken update (a key that does not match the certificate) is counted and ignored:
    // the last good certificate keeps serving.
    let third = ca.server("dne-server-third", 3);
    let broken = [
        ("tls.crt", third.cert_pem.as_str()),
        ("tls.key", first.key_pem.as_str()),
        ("ca.crt", bundle.as_str()),
    ];
    secret.update(&broken);
    wait_metric(
        &probes,
        "dne_tls_certificate_reloads_total",
        "outcome=\"error\"",
        1.0,
    )
    .await;
    let mut conn = connect(svc.addr, trusted.clone()).await.unwrap();
    assert_eq!(
        conn.served, second.der,
        "a bad update must not replace the good certificate"
    );
    assert_eq!(
        conn.request("GET", "/debug/nodes/n1", None)
            .await
            .unwrap()
            .0,
        200
    );
    assert_eq!(
        metric(
            &probes,
            "dne_tls_certificate_reloads_total",
            "outcome=\"ok\""
        )
        .await,
        1.0
    );
    svc.shutdown().await.unwrap();
}

#[tokio::test]
async fn unusable_tls_files_fail_the_start_with_the_file_named() {
    let fake = FakeApiServer::new();
    let ca = Ca::new("dne-test-ca");
    let server = ca.server("dne-server", 1);
    let other = ca.server("dne-other", 2);
    let start = |flags: Vec<String>| {
        let fake = fake.clone();
        async move {
            device_numa_extender::app::Service::start(
                service::serve_args(&as_strs(&flags)),
                Some(fake.client()),
            )
            .await
            .err()
            .map(|e| e.to_string())
        }
    };
    let secret = SecretDir::new(&secret_files(&server, &ca.pem()));
    let mut flags = tls_flags(&secret);
    flags[1] = secret.path("missing.crt").display().to_string();
    let err = start(flags)
        .await
        .expect("a missing certificate must fail the start");
    assert!(err.contains("missing.crt"), "{err}");

    let mismatched = SecretDir::new(&[
        ("tls.crt", server.cert_pem.as_str()),
        ("tls.key", other.key_pem.as_str()),
        ("ca.crt", &ca.pem()),
    ]);
    let err = start(tls_flags(&mismatched))
        .await
        .expect("a key of another certificate must fail the start");
    assert!(err.contains("tls.key"), "{err}");

    let bad_ca = SecretDir::new(&[
        ("tls.crt", server.cert_pem.as_str()),
        ("tls.key", server.key_pem.as_str()),
        ("ca.crt", "no certificates here\n"),
    ]);
    let err = start(tls_flags(&bad_ca))
        .await
        .expect("an empty client CA must fail the start");
    assert!(err.contains("ca.crt"), "{err}");
}

/// Sidecar mode: `--listen 127.0.0.1:…` accepts on that address only (127.0.0.2 is loopback
/// too, on Linux, but a different address), while the probe port is reachable as configured.
#[tokio::test]
async fn a_loopback_verb_listener_accepts_on_that_address_only() {
    let (fake, pod) = cluster();
    let svc = service::start(&fake, &["--probe-address", "0.0.0.0:0"]).await;
    assert_eq!(svc.addr.ip().to_string(), "127.0.0.1");
    let other: SocketAddr = ([127, 0, 0, 2], svc.addr.port()).into();
    let refused = tokio::time::timeout(HANG_GUARD, tokio::net::TcpStream::connect(other))
        .await
        .expect("connect hung");
    assert!(refused.is_err(), "the verb port answered on {other}");
    // The probe listener bound to all addresses answers on both.
    for ip in [[127, 0, 0, 1], [127, 0, 0, 2]] {
        let probes = Http::new((ip, svc.probe_addr.port()).into());
        probes.wait_ready(HANG_GUARD).await;
    }
    // And the verbs answer on the loopback address they were bound to.
    let (status, body) = Http::new(svc.addr)
        .post("/filter", &service::extender_args(&pod, &["n1"]))
        .await;
    assert_eq!(status, 200, "{body}");
    svc.shutdown().await.unwrap();
}

/// Issue 27: under TLS the header deadline still holds, for the handshake and for the request
/// head after it (axum-server used to turn it off, so a head trickled over 40 s was answered).
/// Neither attack ever finishes on its own: only the server can end them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_handshake_and_a_trickled_head_are_cut_under_tls() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (fake, _pod) = cluster();
    let ca = Ca::new("dne-test-ca");
    let server = ca.server("dne-server", 1);
    let secret = SecretDir::new(&secret_files(&server, &ca.pem()));
    let mut flags = tls_flags(&secret);
    flags.extend(["--header-read-timeout".to_string(), "1s".to_string()]);
    let svc = service::start(&fake, &as_strs(&flags)).await;
    let probes = Http::new(svc.probe_addr);
    probes.wait_ready(HANG_GUARD).await;

    // A TCP connection that never says ClientHello.
    let mut silent = tokio::net::TcpStream::connect(svc.addr).await.unwrap();
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(HANG_GUARD, silent.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "a stalled handshake was not cut"
    );
    wait_metric(
        &probes,
        "dne_tls_handshake_failures_total",
        "reason=\"timeout\"",
        1.0,
    )
    .await;

    // A trusted client whose request head never completes, one byte every 200 ms.
    let scheduler = ca.client("system:kube-scheduler");
    let tcp = tokio::net::TcpStream::connect(svc.addr).await.unwrap();
    let mut tls = TlsConnector::from(client_config(&ca, Some(&scheduler)))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("a trusted client completes the handshake");
    tls.write_all(b"POST /filter HTTP/1.1\r\n").await.unwrap();
    let cut = tokio::time::timeout(HANG_GUARD, async {
        loop {
            if tls.write_all(b"x").await.is_err() {
                return;
            }
            match tokio::time::timeout(Duration::from_millis(200), tls.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(_)) => panic!("a head that never completed was answered"),
                Err(_) => {}
            }
        }
    })
    .await;
    assert!(cut.is_ok(), "a trickled head was not cut under TLS");
    wait_metric(
        &probes,
        "dne_connections_rejected_total",
        "reason=\"header_timeout\"",
        1.0,
    )
    .await;
}

/// The admission webhook listener (`--webhook-listen`): HTTPS with its own certificate and no
/// client certificate (kube-apiserver presents none), a routed review answered with a JSON
/// patch, a bad body refused with the reason, and the metric of each; no verb on that port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_listener_answers_reviews_over_tls_and_refuses_bad_bodies() {
    let (fake, _) = cluster();
    let ca = Ca::new("webhook CA");
    let leaf = ca.server("localhost", 1);
    let secret = SecretDir::new(&[
        ("tls.crt", leaf.cert_pem.as_str()),
        ("tls.key", leaf.key_pem.as_str()),
    ]);
    let flags = [
        "--webhook-listen".to_string(),
        "127.0.0.1:0".to_string(),
        "--webhook-tls-cert-file".to_string(),
        secret.path("tls.crt").display().to_string(),
        "--webhook-tls-key-file".to_string(),
        secret.path("tls.key").display().to_string(),
    ];
    let svc = service::start(&fake, &as_strs(&flags)).await;
    let addr = svc.webhook_addr.expect("the webhook listens");
    let mut conn = connect(addr, client_config(&ca, None))
        .await
        .expect("a client without a certificate is served");
    assert_eq!(conn.served, leaf.der, "the webhook's own certificate");

    let review = |limits: Value| {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "ml", "operation": "CREATE", "userInfo": {"username": "u"},
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
                           "spec": {"schedulerName": "default-scheduler",
                                    "containers": [{"name": "c", "resources": {"limits": limits}}]}}
            }
        })
    };
    let (status, answer) = conn
        .request(
            "POST",
            "/mutate-pods",
            Some(&review(json!({"nvidia.com/gpu": "1"}))),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["response"]["uid"], "u-1");
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch", "{answer}");
    let (status, answer) = conn
        .request("POST", "/mutate-pods", Some(&review(json!({"cpu": "1"}))))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(answer["response"].get("patch").is_none(), "{answer}");

    let (status, answer) = conn
        .request("POST", "/mutate-pods", Some(&json!({"kind": "Pod"})))
        .await
        .unwrap();
    assert_eq!(status, 400);
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("not an AdmissionReview"),
        "{answer}"
    );
    let (status, _) = conn
        .request("POST", "/filter", Some(&json!({})))
        .await
        .unwrap();
    assert_eq!(status, 404, "no verb on the webhook port");

    let reviews = |result: &str| {
        svc.state
            .scheduler
            .metrics
            .webhook_reviews
            .with_label_values(&[result])
            .get()
    };
    assert_eq!(
        (
            reviews("routed"),
            reviews("not_managed"),
            reviews("bad_request")
        ),
        (1, 1, 1)
    );
    svc.shutdown().await.unwrap();
}

/// Issue 36 §2: the webhook listener under the attacks that starved it and ran it out of
/// memory. Connections that trickle an AdmissionReview body hold no place a complete review
/// needs (at the cap the one whose body began first is evicted, and cut), a body declared over
/// `--webhook-body-limit-bytes` is refused before any of it is read, and the webhook's bodies
/// are charged to a budget of their own. **Before the fix** the fifth connection was refused:
/// every open one counted as serving a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_listener_is_not_starved_by_slow_bodies_nor_filled_by_large_ones() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (fake, _) = cluster();
    let ca = Ca::new("webhook CA");
    let leaf = ca.server("localhost", 1);
    let secret = SecretDir::new(&[
        ("tls.crt", leaf.cert_pem.as_str()),
        ("tls.key", leaf.key_pem.as_str()),
    ]);
    let flags = [
        "--webhook-listen".to_string(),
        "127.0.0.1:0".to_string(),
        "--webhook-tls-cert-file".to_string(),
        secret.path("tls.crt").display().to_string(),
        "--webhook-tls-key-file".to_string(),
        secret.path("tls.key").display().to_string(),
        "--webhook-max-connections".to_string(),
        "4".to_string(),
        "--webhook-body-limit-bytes".to_string(),
        "100000".to_string(),
        // Nothing ends the attack but the server acting on it.
        "--body-read-timeout".to_string(),
        "10m".to_string(),
        "--request-timeout".to_string(),
        "10m".to_string(),
    ];
    let svc = service::start(&fake, &as_strs(&flags)).await;
    let addr = svc.webhook_addr.expect("the webhook listens");
    let metrics = svc.state.scheduler.metrics.clone();
    let in_flight = || metrics.request_body_bytes_in_flight.get();
    let config = client_config(&ca, None);
    // Four connections fill the cap, each with a review head and one byte of its body.
    let mut attackers = Vec::new();
    for n in 1..=4 {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = TlsConnector::from(config.clone())
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .expect("handshake");
        tls.write_all(
            b"POST /mutate-pods HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 50000\r\n\r\n{",
        )
        .await
        .unwrap();
        tls.flush().await.unwrap();
        service::eventually(HANG_GUARD, &format!("{n} bodies being read"), || {
            in_flight() == n
        })
        .await;
        attackers.push(tls);
    }
    // A real review still gets in, and is answered.
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml", "operation": "CREATE", "userInfo": {"username": "u"},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
                       "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        }
    });
    let mut conn = connect(addr, config.clone())
        .await
        .expect("admitted at the cap");
    let (status, answer) = conn
        .request("POST", "/mutate-pods", Some(&review))
        .await
        .expect("answered");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["response"]["patchType"], "JSONPatch", "{answer}");
    let rejected = |reason: &str| {
        metrics
            .connections_rejected
            .with_label_values(&["webhook", reason])
            .get()
    };
    assert_eq!(rejected("max_connections"), 0);
    assert!(rejected("evicted") >= 1);
    // The evicted attacker was cut, unanswered; its budget came back.
    service::eventually(HANG_GUARD, "the evicted body's budget returned", || {
        in_flight() <= 3
    })
    .await;

    // A body declared over the webhook's limit: 413 at once, naming the flag, nothing read.
    drop(attackers);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut big = TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("handshake");
    big.write_all(
        b"POST /mutate-pods HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 15000000\r\n\r\n",
    )
    .await
    .unwrap();
    big.flush().await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(HANG_GUARD, async {
        while !String::from_utf8_lossy(&got).contains("--webhook-body-limit-bytes") {
            match big.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("no answer to a declared length over the limit");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("--webhook-body-limit-bytes"), "{text}");
    svc.shutdown().await.unwrap();
}
