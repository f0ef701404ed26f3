//! One replica of the real binary (`serve --kubeconfig ... --leader-elect`), started, SIGKILLed,
//! SIGTERMed and restarted by the chaos driver. Its log is kept for the failure report.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::service::Http;

/// `--request-timeout` of the replicas: a hung API answer must outlive it, as in production a
/// hung write outlives kube-scheduler's `httpTimeout`.
pub const REQUEST_TIMEOUT: &str = "2s";

pub struct Replica {
    pub identity: String,
    pub child: Option<Child>,
    pub addr: SocketAddr,
    pub http: Http,
    log: PathBuf,
    kubeconfig: PathBuf,
    pub starts: u32,
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

impl Replica {
    pub fn new(identity: &str, dir: &Path, kubeconfig: &Path) -> Replica {
        let addr = free_port();
        Replica {
            identity: identity.to_string(),
            child: None,
            addr,
            http: Http::new(addr),
            log: dir.join(format!("{identity}.log")),
            kubeconfig: kubeconfig.to_path_buf(),
            starts: 0,
        }
    }

    /// Starts the process on a fresh port (the old one may linger in TIME_WAIT).
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.identity);
        self.addr = free_port();
        self.http = Http::new(self.addr);
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let listen = self.addr.to_string();
        let child = Command::new(env!("CARGO_BIN_EXE_device-numa-extender"))
            .arg("serve")
            .args(["--listen", &listen, "--shutdown-delay", "0s"])
            .args([
                "--kubeconfig",
                self.kubeconfig.to_str().expect("utf-8 path"),
            ])
            .args(["--request-timeout", REQUEST_TIMEOUT])
            // `CHAOS_LOG_LEVEL=info` when replaying a seed: the dump then shows every
            // release and probe decision about the pods involved.
            .args([
                "--log-level",
                &std::env::var("CHAOS_LOG_LEVEL").unwrap_or_else(|_| "warn".into()),
            ])
            .args([
                "--leader-elect",
                "--leader-elect-identity",
                &self.identity,
                "--leader-elect-lease-duration",
                "2s",
                "--leader-elect-renew-deadline",
                "1s",
                "--leader-elect-retry-period",
                "100ms",
            ])
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .expect("start the binary");
        self.child = Some(child);
        self.starts += 1;
    }

    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for the exit (hang guard 30 s, then SIGKILL).
    pub async fn terminate(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if matches!(c.try_wait(), Ok(Some(_))) {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}
