//! Command-line arguments of the operator subcommands (`inspect`, `simulate`) and the `serve`
//! flags the operator features add. Kept apart from `cli.rs` so the service's own flags and
//! these evolve without touching each other.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// `inspect` output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InspectFormat {
    /// One block per node, one row per device, holders one per line (fits 80 columns).
    Table,
    /// The table plus device IDs, holder UIDs and each holder's share.
    Wide,
    /// The view as JSON (documented in docs/inspect.md; fields are only ever added).
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// Read the cluster from a file (YAML multi-document, `kind: List`, or JSON), through the
    /// same sync as `serve --cluster-file`.
    #[arg(long, conflicts_with_all = ["kubeconfig", "server"])]
    pub cluster_file: Option<PathBuf>,

    /// List the cluster once (no watch) through this kubeconfig, with the service's own sync
    /// code. Without any source flag: KUBECONFIG, then in-cluster config.
    #[arg(long, conflicts_with = "server")]
    pub kubeconfig: Option<PathBuf>,

    /// Ask a running extender (e.g. `http://127.0.0.1:8888`) for its in-memory view
    /// (`GET /debug/nodes`), assumed allocations included.
    #[arg(long)]
    pub server: Option<String>,

    /// Only these nodes (repeat the flag or separate with commas). Unknown names are an error.
    #[arg(long = "node", value_name = "NAME", value_delimiter = ',', num_args = 1..)]
    pub nodes: Vec<String>,

    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: InspectFormat,
}

/// `simulate` output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SimulateFormat {
    Table,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The cluster to simulate on (same format as `serve --cluster-file`).
    #[arg(long)]
    pub cluster_file: PathBuf,

    /// The pods to schedule, in this order (Pods in YAML/JSON; assigned or finished ones are
    /// skipped).
    #[arg(long)]
    pub pods: PathBuf,

    /// Write the resulting cluster here (the input with the placed pods bound and annotated),
    /// loadable with --cluster-file, so runs can be chained.
    #[arg(long)]
    pub output_cluster: Option<PathBuf>,

    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: SimulateFormat,

    /// As `serve --score-strategy`: simulate the scoring your deployment uses.
    #[arg(long, default_value = "least-allocated")]
    pub score_strategy: String,

    /// As `serve --score-weights`.
    #[arg(long)]
    pub score_weights: Option<String>,
}

/// `serve` flags of the operator features.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeOpsArgs {
    /// Also export the capacity gauges per node (`dne_node_*{node=...}`): one series set per
    /// node, so off by default on big clusters.
    #[arg(long, env = "DNE_PER_NODE_METRICS")]
    pub per_node_metrics: bool,
}
