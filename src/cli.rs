//! Command-line and environment configuration. Every flag can also be set from the
//! environment variable named in its help.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::sync::Kind;

#[derive(Debug, Parser)]
#[command(
    name = "device-numa-extender",
    version,
    about = "kube-scheduler extender for koordinator-compatible GPU/device sharing and NUMA-aware CPU placement"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the extender HTTP service.
    Serve(Box<ServeArgs>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to serve HTTP on (verbs, probes, metrics).
    #[arg(long, env = "DNE_LISTEN", default_value = "0.0.0.0:8888")]
    pub listen: SocketAddr,

    /// Prefix for the verb routes, e.g. `/gpu` makes `POST /gpu/filter`. Must match the
    /// `urlPrefix` in the scheduler's extender config. Probes and metrics stay at the root.
    #[arg(long, env = "DNE_PATH_PREFIX", default_value = "")]
    pub path_prefix: String,

    /// Kubeconfig file to reach the API server. Without it: KUBECONFIG, then in-cluster.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Run offline from a cluster file (YAML multi-document, `kind: List`, or JSON) instead of
    /// an API server (takes precedence over --kubeconfig). Binds then change only memory.
    #[arg(long, env = "DNE_CLUSTER_FILE")]
    pub cluster_file: Option<PathBuf>,

    /// Optional kinds to insist on even if their CRD is not served (comma separated:
    /// devices, noderesourcetopologies). An insisted-on kind that is absent keeps /readyz failing.
    #[arg(long, env = "DNE_REQUIRE_KINDS", value_delimiter = ',', value_parser = parse_kind)]
    pub require_kinds: Vec<Kind>,

    /// Fail /readyz when a kind's watch has been failing for longer than this (e.g. 5m). Off
    /// by default: a failing watch keeps serving from the last known state.
    #[arg(long, env = "DNE_MAX_STALENESS", value_parser = parse_duration)]
    pub max_staleness: Option<Duration>,

    /// Log format.
    #[arg(long, env = "DNE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log filter, e.g. `info` or `info,device_numa_extender=debug`.
    #[arg(long, env = "DNE_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Largest accepted request body in bytes; larger ones get 413. Full-Node requests
    /// (`nodeCacheCapable: false`) of big clusters need more than the default.
    #[arg(long, env = "DNE_BODY_LIMIT_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub body_limit_bytes: usize,

    /// Per-request deadline (including time queued behind --max-concurrency); answered 503.
    #[arg(long, env = "DNE_REQUEST_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub request_timeout: Duration,

    /// Process-wide limit of requests handled at once; more wait in a queue.
    #[arg(long, env = "DNE_MAX_CONCURRENCY", default_value_t = 256)]
    pub max_concurrency: usize,

    /// How long a bind's assumed allocation is kept without the pod watch confirming it.
    #[arg(long, env = "DNE_ASSUME_TTL", value_parser = parse_duration, default_value = "5m")]
    pub assume_ttl: Duration,

    /// On SIGTERM/SIGINT, how long to keep serving with /readyz failing before stopping.
    #[arg(long, env = "DNE_SHUTDOWN_DELAY", value_parser = parse_duration, default_value = "3s")]
    pub shutdown_delay: Duration,
}

impl ServeArgs {
    pub fn insisted_kinds(&self) -> BTreeSet<Kind> {
        self.require_kinds.iter().copied().collect()
    }
}

fn parse_kind(s: &str) -> Result<Kind, String> {
    match Kind::parse(s) {
        Some(k) if k.is_optional() => Ok(k),
        Some(k) => Err(format!(
            "{k} are always required; list only devices or noderesourcetopologies"
        )),
        None => Err(format!(
            "unknown kind {s:?}: expected devices or noderesourcetopologies"
        )),
    }
}

/// Parses `250ms`, `10s`, `5m`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 500ms, 10s, 5m, 1h"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("invalid duration unit in {s:?}: use ms, s, m or h")),
    };
    if !secs.is_finite() || !(0.0..=365.0 * 86400.0).contains(&secs) {
        return Err(format!("duration {s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn cli_parses_and_rejects() {
        let cli = Cli::try_parse_from([
            "x",
            "serve",
            "--require-kinds",
            "devices,nrt",
            "--max-staleness",
            "5m",
            "--path-prefix",
            "/gpu",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command;
        assert_eq!(
            args.require_kinds,
            vec![Kind::Devices, Kind::NodeResourceTopologies]
        );
        assert!(Cli::try_parse_from(["x", "serve", "--require-kinds", "pods"]).is_err());
        assert!(Cli::try_parse_from(["x", "serve", "--listen", "nope"]).is_err());
    }
}
