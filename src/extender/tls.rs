//! TLS for the verb listener: the serving certificate and key, and the CA that client
//! certificates must chain to, loaded from PEM files into a rustls `ServerConfig`, and reloaded
//! when the files change.
//!
//! Who may call `/bind` is decided here and only here: with a client CA configured, a
//! connection whose certificate does not verify against it never completes its handshake, so
//! no request of it reaches a handler. This module must not look at requests, and it never
//! fails a running server: a bad new certificate is logged and counted, and the last good
//! configuration keeps serving.
//!
//! Rotation: Kubernetes updates a Secret volume by swapping a symlink (`..data`) atomically, so
//! the files' *content* is compared on every poll (mtimes of symlinked files are unreliable).
//! New handshakes use the new configuration; established connections keep theirs until
//! `--max-connection-age` closes them (the listener, [`super::listener`], owns connections).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// The PEM files the verb listener's TLS is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, clients must present a certificate that chains to one of these CAs.
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("the {what} {path} is not valid PEM: {detail}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("the {what} {path} holds no {expected}")]
    Empty {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("the client CA file {path} has an unusable certificate: {detail}")]
    ClientCa { path: PathBuf, detail: String },
    #[error("certificate {cert} with key {key}: {source}")]
    Config {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

/// The raw bytes of the files, compared on each poll to detect a change.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn read_contents(files: &TlsFiles) -> Result<Contents, TlsError> {
    Ok(Contents {
        cert: read("certificate file", &files.cert)?,
        key: read("key file", &files.key)?,
        client_ca: files
            .client_ca
            .as_deref()
            .map(|p| read("client CA file", p))
            .transpose()?,
    })
}

fn certificates(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
            expected: "CERTIFICATE block",
        });
    }
    Ok(certs)
}

fn build(files: &TlsFiles, contents: &Contents) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates("certificate file", &files.cert, &contents.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what: "key file",
            path: files.key.clone(),
            expected: "PRIVATE KEY block (PKCS#8, PKCS#1 or SEC1)",
        },
        e => TlsError::Pem {
            what: "key file",
            path: files.key.clone(),
            detail: e.to_string(),
        },
    })?;
    let config_error = |source| TlsError::Config {
        cert: files.cert.clone(),
        key: files.key.clone(),
        source,
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(config_error)?;
    let builder = match (&files.client_ca, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let mut roots = RootCertStore::empty();
            for ca in certificates("client CA file", path, pem)? {
                roots.add(ca).map_err(|e| TlsError::ClientCa {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
            }
            // Default policy: a client certificate is required (anonymous clients are refused)
            // and must chain to one of these roots.
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::ClientCa {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(config_error)?;
    // The app speaks HTTP/1.1 only (axum's `http1` feature); say so in ALPN.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The TLS configuration new handshakes use; swapped whole on rotation, so a handshake sees
/// either the old configuration or the new one.
#[derive(Clone)]
pub struct LiveConfig(Arc<ArcSwap<ServerConfig>>);

impl LiveConfig {
    pub fn current(&self) -> Arc<ServerConfig> {
        self.0.load_full()
    }
}

/// The live TLS configuration of the verb listener and what it was built from.
pub struct TlsReloader {
    files: TlsFiles,
    current: Contents,
    config: LiveConfig,
    metrics: Metrics,
    /// The last change that was rejected (contents, or the read error's text): it is logged and
    /// counted once, not on every poll until someone fixes the Secret.
    rejected: Option<Result<Contents, String>>,
}

/// What one poll of the files found.
#[derive(Debug)]
pub enum Reload {
    Unchanged,
    Reloaded,
    /// The files changed but do not make a usable configuration; the old one keeps serving.
    Rejected(TlsError),
}

impl TlsReloader {
    /// Loads the files; at startup a bad file is an error (nothing to fall back to).
    pub fn load(files: TlsFiles, metrics: Metrics) -> Result<TlsReloader, TlsError> {
        let current = read_contents(&files)?;
        let config = LiveConfig(Arc::new(ArcSwap::from_pointee(build(&files, &current)?)));
        Ok(TlsReloader {
            files,
            current,
            config,
            metrics,
            rejected: None,
        })
    }

    /// The handle the listener accepts with; reloads swap what it holds.
    pub fn live_config(&self) -> LiveConfig {
        self.config.clone()
    }

    pub fn requires_client_certificates(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Reads the files and, when their content changed, swaps in a configuration built from
    /// them. A change that does not build is rejected, once: the same bad content is not
    /// reported again, and any further change is tried afresh.
    pub fn check(&mut self) -> Reload {
        let read = read_contents(&self.files);
        let seen = match &read {
            Ok(contents) if *contents == self.current => {
                self.rejected = None;
                return Reload::Unchanged;
            }
            Ok(contents) => Ok(contents.clone()),
            Err(e) => Err(e.to_string()),
        };
        if self.rejected.as_ref() == Some(&seen) {
            return Reload::Unchanged;
        }
        let outcome = match read {
            Ok(contents) => match build(&self.files, &contents) {
                Ok(config) => {
                    self.config.0.store(Arc::new(config));
                    self.current = contents;
                    self.rejected = None;
                    Reload::Reloaded
                }
                Err(e) => {
                    self.rejected = Some(seen);
                    Reload::Rejected(e)
                }
            },
            Err(e) => {
                self.rejected = Some(seen);
                Reload::Rejected(e)
            }
        };
        match &outcome {
            Reload::Reloaded => {
                self.metrics.tls_reloads.with_label_values(&["ok"]).inc();
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate files changed: reloaded");
            }
            Reload::Rejected(e) => {
                self.metrics.tls_reloads.with_label_values(&["error"]).inc();
                tracing::warn!(error = %e, "TLS certificate files changed but cannot be used; still serving the previous certificate");
            }
            Reload::Unchanged => {}
        }
        outcome
    }

    /// Polls the files every `interval` until `stop`.
    pub async fn run(mut self, interval: Duration, stop: CancellationToken) {
        let interval = interval.max(Duration::from_millis(10));
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(interval) => {
                    // File reads are small and rare; no need for spawn_blocking.
                    self.check();
                }
            }
        }
    }
}

/// Counts and logs a connection that never became a TLS session (no or a rejected client
/// certificate, plain HTTP on the TLS port, a handshake timeout).
pub fn record_handshake_failure(
    metrics: &Metrics,
    peer: Option<&std::net::SocketAddr>,
    e: &io::Error,
) {
    let reason = handshake_failure_reason(e);
    metrics
        .tls_handshake_failures
        .with_label_values(&[reason])
        .inc();
    let peer = peer.map(ToString::to_string).unwrap_or_default();
    match reason {
        "no_client_certificate" | "bad_client_certificate" => {
            tracing::warn!(peer, reason, error = %e, "refused a verb connection: client certificate");
        }
        _ => tracing::debug!(peer, reason, error = %e, "TLS handshake failed"),
    }
}

/// A small, fixed label set for the handshake-failure metric.
pub fn handshake_failure_reason(e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::TimedOut {
        return "timeout";
    }
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::NoCertificatesPresented) => "no_client_certificate",
        Some(rustls::Error::InvalidCertificate(_)) => "bad_client_certificate",
        Some(rustls::Error::InvalidMessage(_)) => "not_tls",
        Some(_) => "handshake",
        None => "io",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> TlsFiles {
        TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            client_ca: None,
        }
    }

    #[test]
    fn missing_and_empty_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(dir.path());
        let err = TlsReloader::load(f.clone(), Metrics::new()).err().unwrap();
        assert!(
            matches!(
                err,
                TlsError::Read {
                    what: "certificate file",
                    ..
                }
            ),
            "{err}"
        );
        std::fs::write(&f.cert, b"not pem at all").unwrap();
        std::fs::write(&f.key, b"").unwrap();
        let err = TlsReloader::load(f.clone(), Metrics::new()).err().unwrap();
        assert!(
            matches!(
                err,
                TlsError::Empty {
                    what: "certificate file",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("tls.crt"), "{err}");
    }

    fn self_signed(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_rejected_change_is_reported_once_and_a_fixed_one_loads() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(dir.path());
        let (cert1, key1) = self_signed("one.example");
        std::fs::write(&f.cert, &cert1).unwrap();
        std::fs::write(&f.key, &key1).unwrap();
        let metrics = Metrics::new();
        let mut reloader = TlsReloader::load(f.clone(), metrics.clone()).unwrap();
        assert!(matches!(reloader.check(), Reload::Unchanged));

        // A new certificate with the old key: rejected once, then not re-reported.
        let (cert2, key2) = self_signed("two.example");
        std::fs::write(&f.cert, &cert2).unwrap();
        let outcome = reloader.check();
        assert!(
            matches!(&outcome, Reload::Rejected(TlsError::Config { .. })),
            "{outcome:?}"
        );
        assert!(matches!(reloader.check(), Reload::Unchanged));
        let errors = || metrics.tls_reloads.with_label_values(&["error"]).get();
        assert_eq!(errors(), 1);

        // A missing file is a different rejection: reported (once) too.
        std::fs::remove_file(&f.key).unwrap();
        assert!(matches!(
            reloader.check(),
            Reload::Rejected(TlsError::Read { .. })
        ));
        assert!(matches!(reloader.check(), Reload::Unchanged));
        assert_eq!(errors(), 2);

        // The matching key arrives: the new pair loads.
        std::fs::write(&f.key, &key2).unwrap();
        assert!(matches!(reloader.check(), Reload::Reloaded));
        assert!(matches!(reloader.check(), Reload::Unchanged));
        assert_eq!(metrics.tls_reloads.with_label_values(&["ok"]).get(), 1);
        assert_eq!(errors(), 2);
    }

    #[test]
    fn failure_reasons_are_classified() {
        let e = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::NoCertificatesPresented,
        );
        assert_eq!(handshake_failure_reason(&e), "no_client_certificate");
        let e = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(handshake_failure_reason(&e), "bad_client_certificate");
        let e = io::Error::new(io::ErrorKind::TimedOut, "slow");
        assert_eq!(handshake_failure_reason(&e), "timeout");
        let e = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(handshake_failure_reason(&e), "io");
    }
}
