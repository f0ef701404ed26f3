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
    // A flag given again overrides the earlier one: the chart's `extraArgs` come after its
    // own flags and must be able to change them (e.g. `--log-level=debug`).
    #[command(args_override_self = true)]
    Serve(Box<ServeArgs>),
    /// Show every node's devices, their use and holders, and a cluster summary.
    Inspect(crate::ops::args::InspectArgs),
    /// Schedule pending pods in memory through the real filter, prioritize and bind, and show
    /// where they land (or why nowhere) and what is left.
    Simulate(crate::ops::args::SimulateArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to serve the verbs and /debug on (HTTPS with --tls-cert-file), and also
    /// /healthz, /readyz and /metrics unless --probe-address is set. In a kube-scheduler pod,
    /// bind it to 127.0.0.1 so nothing outside the pod can call bind.
    #[arg(long, env = "DNE_LISTEN", default_value = "0.0.0.0:8888")]
    pub listen: SocketAddr,

    /// Serve /healthz, /readyz and /metrics on this address instead, always plain HTTP (for
    /// kubelet probes and Prometheus, which present no client certificate). --listen then
    /// carries only the verbs and /debug.
    #[arg(long, env = "DNE_PROBE_ADDRESS")]
    pub probe_address: Option<SocketAddr>,

    /// PEM certificate chain (leaf first) to serve --listen over TLS with; needs
    /// --tls-key-file. kube-scheduler then needs `enableHTTPS: true` and a `tlsConfig` whose
    /// caFile verifies this certificate. Reloaded when the file's content changes.
    #[arg(long, env = "DNE_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of --tls-cert-file.
    #[arg(long, env = "DNE_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,

    /// PEM CA bundle: require every connection to --listen to present a client certificate
    /// that chains to one of these CAs (kube-scheduler's `tlsConfig` certFile/keyFile);
    /// others are refused in the handshake. Without it, TLS encrypts but any client may call
    /// bind. Reloaded when the file's content changes.
    #[arg(long, env = "DNE_TLS_CLIENT_CA_FILE", requires = "tls_cert_file")]
    pub tls_client_ca_file: Option<PathBuf>,

    /// How often the TLS files are checked for changes (Secret volume updates); a change
    /// that does not load is logged and counted, and the previous certificate keeps serving.
    #[arg(long, env = "DNE_TLS_RELOAD_INTERVAL", value_parser = parse_duration, default_value = "10s")]
    pub tls_reload_interval: Duration,

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

    /// How often API discovery is repeated for optional kinds whose CRD was not served at
    /// start: a CRD installed later is then watched, and /readyz waits for its first list.
    #[arg(long, env = "DNE_REDISCOVER_INTERVAL", value_parser = parse_duration, default_value = "30s")]
    pub rediscover_interval: Duration,

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

    /// All request bodies being read or served at once may hold at most this many bytes
    /// together; a body waits (within --body-read-timeout) for budget held by others. Bounds
    /// body memory whatever --max-concurrency and the number of connections are.
    #[arg(long, env = "DNE_BODY_BUDGET_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub body_budget_bytes: usize,

    /// A request body must arrive whole within this long of its head, before it takes a
    /// --max-concurrency slot; slower ones get 408.
    #[arg(long, env = "DNE_BODY_READ_TIMEOUT", value_parser = parse_duration, default_value = "5s")]
    pub body_read_timeout: Duration,

    /// Open connections on --listen at most. At the cap, the connection that has waited
    /// longest without a request in progress is closed to make room; a new one is refused
    /// only while every open connection is serving a request.
    #[arg(long, env = "DNE_MAX_CONNECTIONS", default_value_t = 512)]
    pub max_connections: usize,

    /// Open connections on --probe-address at most (same eviction rule as --max-connections).
    #[arg(long, env = "DNE_PROBE_MAX_CONNECTIONS", default_value_t = 64)]
    pub probe_max_connections: usize,

    /// Every listener: a TLS handshake and each request head must arrive whole within this
    /// long of the connection opening, or of its first byte after the previous response.
    #[arg(long, env = "DNE_HEADER_READ_TIMEOUT", value_parser = parse_duration, default_value = "5s")]
    pub header_read_timeout: Duration,

    /// Every listener: a keep-alive connection with no request in progress is closed after
    /// this long. Longer than Go's 90 s client idle timeout, so kube-scheduler closes first.
    #[arg(long, env = "DNE_IDLE_TIMEOUT", value_parser = parse_duration, default_value = "120s")]
    pub idle_timeout: Duration,

    /// Every listener: a connection is closed at this age (after its request in progress), so
    /// no connection opened under a rotated-out client CA outlives the rotation for longer.
    #[arg(long, env = "DNE_MAX_CONNECTION_AGE", value_parser = parse_duration, default_value = "10m")]
    pub max_connection_age: Duration,

    /// Every listener: the largest request head (request line and headers) accepted, in
    /// bytes; larger ones get 431 and the connection is closed.
    #[arg(long, env = "DNE_MAX_HEADER_BYTES", default_value_t = 16 * 1024)]
    pub max_header_bytes: usize,

    /// Per-request deadline (including time queued behind --max-concurrency); answered 503.
    #[arg(long, env = "DNE_REQUEST_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub request_timeout: Duration,

    /// After every start and every leadership gain, binds wait this long (then for a fresh pod
    /// list) for bindings the previous binder may still land: a crashed process, the replica a
    /// rollout replaced, or the previous leader. Default: twice --request-timeout (the API
    /// server gives up each binding at its `?timeout=`, and kube's client may send a 504'd one
    /// once more). Lower it only where no other binder can have run before (0: wait for the
    /// fresh list only).
    #[arg(long, env = "DNE_TAKEOVER_WINDOW", value_parser = parse_duration)]
    pub takeover_window: Option<Duration>,

    /// A DeviceClass whose `extendedResourceName` is a resource name the extender manages
    /// (KEP-5004) makes kube-scheduler serve that request through DRA on nodes that do not
    /// advertise it. Without this flag that fails `/readyz` (the extender would be bypassed
    /// without anyone deciding it); with it the split is intended: on such nodes the
    /// extender allocates no device for those requests (README "Beside DRA").
    #[arg(long, env = "DNE_ALLOW_DRA_EXTENDED_RESOURCES")]
    pub allow_dra_extended_resources: bool,

    /// Keep DRA off the devices the extender hands out: one DeviceTaintRule (`NoSchedule`)
    /// per DRA driver pool that publishes devices of a node's `Device` object; a device both
    /// publish is the extender's only while that rule is in effect (README "Beside DRA").
    /// false: DRA's holders are counted, nothing is written, and a device DRA allocates in
    /// kube-scheduler's memory before its claim is written can be handed out twice.
    #[arg(long, env = "DNE_DRA_OWNERSHIP", action = clap::ArgAction::Set, default_value_t = true)]
    pub dra_ownership: bool,

    /// How long after the extender's DeviceTaintRule is created its pool becomes the
    /// extender's: kube-scheduler must have seen the rule, and an allocation it made in
    /// memory before must have reached its claim's status (and this cache).
    #[arg(long, env = "DNE_DRA_HANDOVER_GRACE", value_parser = parse_duration, default_value = "30s")]
    pub dra_handover_grace: Duration,

    /// DRA drivers whose ResourceSlices are a node's CPUs: on a node where one publishes,
    /// the extender places no cpusets (two allocators would pin the same cores).
    #[arg(
        long,
        env = "DNE_DRA_CPU_DRIVERS",
        value_delimiter = ',',
        default_value = "dra.cpu"
    )]
    pub dra_cpu_drivers: Vec<String>,

    /// Who keeps each Node's GPU share totals (`koordinator.sh/gpu-core`, `gpu-memory`,
    /// `gpu-memory-ratio` summed over its healthy GPUs) in `status.allocatable`, so that
    /// kube-scheduler counts share pods by node totals and a share pod can preempt (README
    /// "Preemption"). `ignored`: nobody, kube-scheduler ignores the names and share pods cannot
    /// preempt (readiness warns). `koord-manager`: it writes them; the extender reports nodes
    /// that do not match. `extender`: the leader writes them (`patch` on `nodes/status`). The
    /// chart's `extender.gpuShareTotals` sets this and the scheduler's stanza together.
    #[arg(long, env = "DNE_GPU_SHARE_TOTALS", value_enum, default_value_t = crate::scheduler::share_totals::ShareTotals::Ignored)]
    pub gpu_share_totals: crate::scheduler::share_totals::ShareTotals,

    /// Where the placement ranking reaches kube-scheduler. `prioritize`: filter passes every
    /// fitting node and prioritize scores them (the stanza's `weight` mixes them with
    /// kube-scheduler's own scores). `filter`: filter passes only the fitting nodes prioritize
    /// would score best, kube-scheduler's own scores choose among them, and the stanza needs no
    /// `prioritizeVerb` (one round trip per pod less; README "Ranking"). The chart's
    /// `extenderConfig.ranking` sets this and the stanza together.
    #[arg(long, env = "DNE_RANKING", value_enum, default_value_t = crate::scheduler::ranking::Ranking::Prioritize)]
    pub ranking: crate::scheduler::ranking::Ranking,

    /// Process-wide limit of requests handled at once; more wait in a queue.
    #[arg(long, env = "DNE_MAX_CONCURRENCY", default_value_t = 256)]
    pub max_concurrency: usize,

    /// After how long an assumed allocation that nothing else resolved (pod watch, relist,
    /// probe of an ambiguous bind, retry) is checked against the API server and dropped if its
    /// pod is gone, unbound, elsewhere or finished.
    #[arg(long, env = "DNE_ASSUME_TTL", value_parser = parse_duration, default_value = "5m")]
    pub assume_ttl: Duration,

    /// Make kube-scheduler retry the pods the extender rejected as soon as capacity they ask
    /// for returns (a Device turning healthy or growing, devices or CPUs released, an NRT
    /// change), by annotating a Node where it returned (needs `patch` on nodes). false: such
    /// pods wait for another cluster event or kube-scheduler's
    /// podMaxInUnschedulablePodsDuration (5 minutes by default).
    #[arg(long, env = "DNE_REQUEUE", action = clap::ArgAction::Set, default_value_t = true)]
    pub requeue: bool,

    /// Capacity returns gather this long before one requeue signal is written; also the least
    /// time between two signals (each retries every waiting pod at once).
    #[arg(long, env = "DNE_REQUEUE_INTERVAL", value_parser = parse_duration, default_value = "1s")]
    pub requeue_interval: Duration,

    /// For this long after becoming the ready leader (start or takeover), every capacity
    /// return is signalled even when no rejected pod is remembered: pods rejected before (by
    /// the previous leader or process) are unknown here until kube-scheduler filters them
    /// again. Match kube-scheduler's podMaxInUnschedulablePodsDuration (default 5m).
    #[arg(long, env = "DNE_REQUEUE_AFTER_TAKEOVER", value_parser = parse_duration, default_value = "5m")]
    pub requeue_after_takeover: Duration,

    /// Serve the admission webhook (`POST /mutate-pods`) on this address, HTTPS only: it sets
    /// `spec.schedulerName` to --webhook-scheduler-name on new pods that ask for a managed
    /// resource (and cpuset QoS pods with --webhook-route-cpuset-qos). Every replica answers,
    /// leader or not. Needs --webhook-tls-cert-file and --webhook-tls-key-file.
    #[arg(long, env = "DNE_WEBHOOK_LISTEN", requires_all = ["webhook_tls_cert_file", "webhook_tls_key_file"])]
    pub webhook_listen: Option<SocketAddr>,

    /// PEM certificate chain of the webhook listener (its SANs must cover the name in the
    /// webhook configuration's clientConfig; the caBundle there must verify it). Reloaded
    /// when the file's content changes (--tls-reload-interval).
    #[arg(
        long,
        env = "DNE_WEBHOOK_TLS_CERT_FILE",
        requires = "webhook_tls_key_file"
    )]
    pub webhook_tls_cert_file: Option<PathBuf>,

    /// PEM private key of --webhook-tls-cert-file.
    #[arg(
        long,
        env = "DNE_WEBHOOK_TLS_KEY_FILE",
        requires = "webhook_tls_cert_file"
    )]
    pub webhook_tls_key_file: Option<PathBuf>,

    /// The scheduler the webhook routes pods to (the extender's kube-scheduler profile).
    #[arg(
        long,
        env = "DNE_WEBHOOK_SCHEDULER_NAME",
        default_value = "device-numa-scheduler"
    )]
    pub webhook_scheduler_name: String,

    /// Resource names that route a pod when any container requests or limits one (comma
    /// separated; default: the chart's managedResources).
    #[arg(long, env = "DNE_WEBHOOK_MANAGED_RESOURCES", value_delimiter = ',')]
    pub webhook_managed_resources: Vec<String>,

    /// Open connections on --webhook-listen at most (its own cap: a flood of the verb
    /// listener never starves admission reviews, nor the reverse). Eviction at the cap as on
    /// --listen; a connection still sending its body counts as waiting.
    #[arg(long, env = "DNE_WEBHOOK_MAX_CONNECTIONS", default_value_t = 256)]
    pub webhook_max_connections: usize,

    /// Largest AdmissionReview body accepted by the webhook, in bytes (413 beyond). A pod is at
    /// most 1.5 MiB in etcd and a CREATE review carries it once.
    #[arg(long, env = "DNE_WEBHOOK_BODY_LIMIT_BYTES", default_value_t = 3 * 1024 * 1024)]
    pub webhook_body_limit_bytes: usize,

    /// All webhook bodies being read or served at once hold at most this many bytes together
    /// (as --body-budget-bytes, a budget of the webhook's own).
    #[arg(long, env = "DNE_WEBHOOK_BODY_BUDGET_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub webhook_body_budget_bytes: usize,

    /// Also route pods labelled koordinator.sh/qosClass LSE or LSR (cpuset pods).
    #[arg(long, env = "DNE_WEBHOOK_ROUTE_CPUSET_QOS")]
    pub webhook_route_cpuset_qos: bool,

    /// On SIGTERM/SIGINT, how long to keep serving with /readyz failing before stopping; a
    /// second SIGTERM/SIGINT meanwhile stops at once.
    #[arg(long, env = "DNE_SHUTDOWN_DELAY", value_parser = parse_duration, default_value = "3s")]
    pub shutdown_delay: Duration,

    /// Device and CPU scoring (shared with `simulate`).
    #[command(flatten)]
    pub scoring: crate::ops::args::ScoringArgs,

    /// Contend for a Lease and serve scheduling verbs only while holding it (standalone HA).
    /// Standbys keep their caches synced and answer /readyz 503.
    #[arg(
        long,
        env = "DNE_LEADER_ELECT",
        conflicts_with = "follow_scheduler_lease"
    )]
    pub leader_elect: bool,

    /// Name of the Lease for --leader-elect.
    #[arg(
        long,
        env = "DNE_LEADER_ELECT_LEASE_NAME",
        default_value = "device-numa-extender"
    )]
    pub leader_elect_lease_name: String,

    /// Namespace of the Lease (also of the scheduler Lease with --follow-scheduler-lease).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_elect_lease_namespace: String,

    /// This replica's identity in the Lease; defaults to the host name. With
    /// --follow-scheduler-lease it must be the pod name (kube-scheduler writes `<pod>_<uuid>`).
    #[arg(long, env = "POD_NAME")]
    pub leader_elect_identity: Option<String>,

    /// How long a Lease stays valid without renewal before a standby may take it.
    #[arg(long, env = "DNE_LEADER_ELECT_LEASE_DURATION", value_parser = parse_duration, default_value = "15s")]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps acting while renewals fail.
    #[arg(long, env = "DNE_LEADER_ELECT_RENEW_DEADLINE", value_parser = parse_duration, default_value = "10s")]
    pub leader_elect_renew_deadline: Duration,

    /// Interval between acquire/renew attempts.
    #[arg(long, env = "DNE_LEADER_ELECT_RETRY_PERIOD", value_parser = parse_duration, default_value = "2s")]
    pub leader_elect_retry_period: Duration,

    /// Scheduler mode: instead of a Lease of our own, serve while the named kube-scheduler
    /// Lease (in the lease namespace) is held by this pod (identity `<pod-name>_<uuid>`).
    #[arg(long, env = "DNE_FOLLOW_SCHEDULER_LEASE")]
    pub follow_scheduler_lease: Option<String>,

    #[command(flatten)]
    pub ops: crate::ops::args::ServeOpsArgs,
}

impl ServeArgs {
    /// The leader-election mode, if any.
    pub fn leader_mode(&self) -> Option<crate::leader::LeaderMode> {
        let identity = self.leader_elect_identity.clone().unwrap_or_else(|| {
            std::env::var("HOSTNAME").unwrap_or_else(|_| "device-numa-extender".to_string())
        });
        let config = |name: &str| crate::leader::LeaseConfig {
            name: name.to_string(),
            namespace: self.leader_elect_lease_namespace.clone(),
            identity: identity.clone(),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        };
        if let Some(name) = &self.follow_scheduler_lease {
            Some(crate::leader::LeaderMode::Follow(config(name)))
        } else if self.leader_elect {
            Some(crate::leader::LeaderMode::Elect(config(
                &self.leader_elect_lease_name,
            )))
        } else {
            None
        }
    }

    /// The verb listener's TLS files, when TLS is on.
    pub fn tls_files(&self) -> Option<crate::extender::tls::TlsFiles> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some(crate::extender::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca_file.clone(),
            }),
            _ => None,
        }
    }

    /// The connection limits of the verb listener (`probes: false`) or the probe listener.
    pub fn connection_limits(&self, probes: bool) -> crate::extender::listener::ConnectionLimits {
        crate::extender::listener::ConnectionLimits {
            max_connections: if probes {
                self.probe_max_connections
            } else {
                self.max_connections
            },
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            max_connection_age: self.max_connection_age,
            max_header_bytes: self.max_header_bytes,
            // A request in progress is answered within --request-timeout (a 503 at worst).
            drain_timeout: self.request_timeout + std::time::Duration::from_secs(5),
        }
    }

    /// The verb listener's body limits.
    pub fn body_limits(&self) -> crate::extender::admission::BodyLimits {
        crate::extender::admission::BodyLimits {
            max_bytes: self.body_limit_bytes,
            budget_bytes: self.body_budget_bytes,
            read_timeout: self.body_read_timeout,
            limit_flag: "--body-limit-bytes",
        }
    }

    /// The webhook listener's body limits (--body-read-timeout is shared).
    pub fn webhook_body_limits(&self) -> crate::extender::admission::BodyLimits {
        crate::extender::admission::BodyLimits {
            max_bytes: self.webhook_body_limit_bytes,
            budget_bytes: self.webhook_body_budget_bytes,
            read_timeout: self.body_read_timeout,
            limit_flag: "--webhook-body-limit-bytes",
        }
    }

    /// The webhook listener's connection limits: the shared deadlines, its own cap.
    pub fn webhook_connection_limits(&self) -> crate::extender::listener::ConnectionLimits {
        crate::extender::listener::ConnectionLimits {
            max_connections: self.webhook_max_connections,
            ..self.connection_limits(false)
        }
    }

    /// The webhook's routing rule and TLS files, when --webhook-listen is set.
    pub fn webhook(
        &self,
    ) -> Option<(
        SocketAddr,
        crate::placement::routing::RoutingRule,
        crate::extender::tls::TlsFiles,
    )> {
        let addr = self.webhook_listen?;
        let (cert, key) = (
            self.webhook_tls_cert_file.clone()?,
            self.webhook_tls_key_file.clone()?,
        );
        let managed = if self.webhook_managed_resources.is_empty() {
            crate::placement::routing::default_managed_resources()
        } else {
            self.webhook_managed_resources
                .iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        Some((
            addr,
            crate::placement::routing::RoutingRule {
                scheduler_name: self.webhook_scheduler_name.clone(),
                managed_resources: managed,
                cpuset_qos: self.webhook_route_cpuset_qos,
            },
            crate::extender::tls::TlsFiles {
                cert,
                key,
                client_ca: None,
            },
        ))
    }

    pub fn insisted_kinds(&self) -> BTreeSet<Kind> {
        self.require_kinds.iter().copied().collect()
    }
}

fn parse_kind(s: &str) -> Result<Kind, String> {
    match Kind::parse(s) {
        Some(k) if k.is_optional() => Ok(k),
        Some(k) => Err(format!(
            "{k} are always required; list only optional kinds (devices, noderesourcetopologies, deviceclasses, resourceslices, resourceclaims, devicetaintrules)"
        )),
        None => Err(format!(
            "unknown kind {s:?}: expected devices, noderesourcetopologies, deviceclasses, resourceslices, resourceclaims or devicetaintrules"
        )),
    }
}

/// Parses Go-style durations (`250ms`, `1.5s`, `5m`, `1h30m`) or a bare number of seconds.
pub fn parse_duration(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    let invalid = || format!("invalid duration {input:?}: expected e.g. 500ms, 10s, 5m, 1h30m");
    if s.is_empty() {
        return Err(invalid());
    }
    if let Ok(secs) = s.parse::<f64>() {
        return to_duration(secs, input);
    }
    let mut rest = s;
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (num, tail) = rest.split_at(split);
        let value: f64 = num.parse().map_err(|_| invalid())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let factor = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(format!(
                    "invalid duration unit {unit:?} in {input:?}: use ms, s, m or h"
                ));
            }
        };
        total += value * factor;
        rest = next;
    }
    to_duration(total, input)
}

fn to_duration(secs: f64, input: &str) -> Result<Duration, String> {
    if !secs.is_finite() || !(0.0..=365.0 * 86400.0).contains(&secs) {
        return Err(format!("duration {input:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `serve` and `simulate` take the same scoring flags and build the same configuration,
    /// CPU half included (simulate once parsed only the device half); a bad value names itself.
    #[test]
    fn serve_and_simulate_share_the_scoring_flags() {
        let flags = [
            "--score-strategy=most-allocated",
            "--cpu-score-strategy=most-allocated",
            "--numa-score-strategy=most-allocated",
            "--cpu-score-weights=cpu=2,memory=1",
            "--default-cpu-bind-policy=SpreadByPCPUs",
        ];
        let parse = |sub: &[&str]| {
            let mut argv = vec!["device-numa-extender"];
            argv.extend_from_slice(sub);
            argv.extend_from_slice(&flags);
            match Cli::try_parse_from(argv).expect("valid flags").command {
                Command::Serve(a) => a.scoring.config().expect("valid scoring"),
                Command::Simulate(a) => a.scoring.config().expect("valid scoring"),
                Command::Inspect(_) => unreachable!(),
            }
        };
        let serve = parse(&["serve"]);
        let simulate = parse(&["simulate", "--cluster-file=c.yaml", "--pods=p.yaml"]);
        assert_eq!(serve, simulate);
        assert_eq!(
            serve.cpu.default_bind_policy,
            crate::placement::cpu::CpuBindPolicy::SpreadByPcpus
        );
        assert_eq!(
            serve.device.strategy,
            crate::placement::device::score::ScoringStrategy::MostAllocated
        );
        let Command::Simulate(bad) = Cli::try_parse_from([
            "device-numa-extender",
            "simulate",
            "--cluster-file=c.yaml",
            "--pods=p.yaml",
            "--default-cpu-bind-policy=Whole",
        ])
        .unwrap()
        .command
        else {
            unreachable!()
        };
        let err = bad.scoring.config().unwrap_err().to_string();
        assert!(err.contains("\"Whole\""), "{err}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("m").is_err());
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
        let Command::Serve(args) = cli.command else {
            panic!("not serve");
        };
        assert_eq!(
            args.require_kinds,
            vec![Kind::Devices, Kind::NodeResourceTopologies]
        );
        assert!(Cli::try_parse_from(["x", "serve", "--require-kinds", "pods"]).is_err());
        assert!(Cli::try_parse_from(["x", "serve", "--listen", "nope"]).is_err());
        assert!(args.tls_files().is_none());
        // A repeated flag: the last one wins (the chart appends extraArgs after its flags).
        let cli = Cli::try_parse_from([
            "x",
            "serve",
            "--log-level=info",
            "--requeue=true",
            "--log-level=debug",
            "--requeue=false",
        ])
        .unwrap();
        let Command::Serve(repeated) = cli.command else {
            panic!("not serve");
        };
        assert_eq!(repeated.log_level, "debug");
        assert!(!repeated.requeue);
        // TLS flags come as a pair; a client CA needs a serving certificate.
        assert!(Cli::try_parse_from(["x", "serve", "--tls-cert-file", "c"]).is_err());
        assert!(Cli::try_parse_from(["x", "serve", "--tls-key-file", "k"]).is_err());
        assert!(Cli::try_parse_from(["x", "serve", "--tls-client-ca-file", "ca"]).is_err());
        let cli = Cli::try_parse_from([
            "x",
            "serve",
            "--tls-cert-file",
            "c",
            "--tls-key-file",
            "k",
            "--tls-client-ca-file",
            "ca",
            "--probe-address",
            "0.0.0.0:8889",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("parsed as another subcommand")
        };
        let files = args.tls_files().unwrap();
        assert_eq!(files.client_ca, Some(PathBuf::from("ca")));
        assert_eq!(args.probe_address, Some("0.0.0.0:8889".parse().unwrap()));
    }
}
