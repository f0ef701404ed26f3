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

    /// Why this pending pod (`NAMESPACE/NAME`) does not fit: the nodes nearest to fitting, what
    /// each lacks in the pod's terms, and what would make it fit (preempting lower-priority
    /// pods, or moving pods; a dry run, nothing changes). From --cluster-file (with --pods) or
    /// a cluster.
    #[arg(long, value_name = "NAMESPACE/NAME", conflicts_with_all = ["server", "nodes"])]
    pub pod: Option<String>,

    /// More pods to look the --pod up in (pending pods kept apart from the cluster file, as
    /// for `simulate --pods`).
    #[arg(long, value_name = "FILE", requires = "pod")]
    pub pods: Option<PathBuf>,

    /// Whether kube-scheduler counts the GPU share names as `serve --gpu-share-totals` says:
    /// `ignored` (the default), `koord-manager` or `extender` (the Nodes advertise the totals and
    /// the scheduler's stanza counts them). How kube-scheduler is modelled: its resource fit,
    /// and the preemption victims it proposes for a pod asking for a share.
    #[arg(long, env = "DNE_GPU_SHARE_TOTALS", value_enum, default_value_t = crate::scheduler::share_totals::ShareTotals::Ignored)]
    pub gpu_share_totals: crate::scheduler::share_totals::ShareTotals,

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

    /// Whether kube-scheduler counts the GPU share names as `serve --gpu-share-totals` says:
    /// `ignored` (the default), `koord-manager` or `extender` (the Nodes advertise the totals and
    /// the scheduler's stanza counts them). How kube-scheduler's resource fit is modelled.
    #[arg(long, env = "DNE_GPU_SHARE_TOTALS", value_enum, default_value_t = crate::scheduler::share_totals::ShareTotals::Ignored)]
    pub gpu_share_totals: crate::scheduler::share_totals::ShareTotals,

    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: SimulateFormat,

    /// The scoring your deployment uses: the same flags (and environment) as `serve`.
    #[command(flatten)]
    pub scoring: ScoringArgs,
}

/// `serve` flags of the operator features.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeOpsArgs {
    /// Also export the capacity gauges per node (`dne_node_*{node=...}`): one series set per
    /// node, so off by default on big clusters.
    #[arg(long, env = "DNE_PER_NODE_METRICS")]
    pub per_node_metrics: bool,
}

/// The scoring flags, shared by `serve` and `simulate` so both decide alike.
#[derive(Debug, Clone, Args)]
pub struct ScoringArgs {
    /// Device scoring for prioritize and for ranking devices in bind: least-allocated spreads
    /// pods over nodes and cards, most-allocated bin-packs them, fragmentation places each GPU
    /// pod on the node and card where the workload's expected GPU fragmentation grows least
    /// (FGD; the workload is learned from the pods the extender sees).
    #[arg(long, env = "DNE_SCORE_STRATEGY", default_value = "least-allocated")]
    pub score_strategy: String,

    /// The workload the fragmentation strategy measures against, instead of the one it learns
    /// from the pods it sees: `WEIGHT:cpu=Q[,gpu=G]` per task kind, `;` between kinds; G below
    /// 1 is a share of one card, a whole number that many cards (e.g.
    /// `60:cpu=4,gpu=0.5;30:cpu=8,gpu=1;10:cpu=2`). Only with `--score-strategy fragmentation`.
    #[arg(long, env = "DNE_FRAGMENTATION_MIX")]
    pub fragmentation_mix: Option<String>,

    /// Resource weights for device scoring, `name=weight,...` (default:
    /// koordinator.sh/gpu-memory-ratio=1,koordinator.sh/gpu-memory=1,koordinator.sh/rdma=1,koordinator.sh/fpga=1).
    #[arg(long, env = "DNE_SCORE_WEIGHTS")]
    pub score_weights: Option<String>,

    /// Node-level CPU/memory scoring for pods that ask for CPU placement (a cpuset or a NUMA
    /// policy): least-allocated or most-allocated.
    #[arg(
        long,
        env = "DNE_CPU_SCORE_STRATEGY",
        default_value = "least-allocated"
    )]
    pub cpu_score_strategy: String,

    /// NUMA-level scoring: ranks NUMA hints and orders the cpuset accumulator on nodes without
    /// a `node.koordinator.sh/numa-allocate-strategy` label (least-allocated spreads over NUMA
    /// nodes, most-allocated packs them).
    #[arg(
        long,
        env = "DNE_NUMA_SCORE_STRATEGY",
        default_value = "least-allocated"
    )]
    pub numa_score_strategy: String,

    /// Weights of cpu and memory in both CPU scorers, `cpu=N,memory=N` (default cpu=1,memory=1).
    #[arg(long, env = "DNE_CPU_SCORE_WEIGHTS")]
    pub cpu_score_weights: Option<String>,

    /// The bind policy for LSE/LSR pods whose resource-spec says `Default` or nothing:
    /// FullPCPUs (whole physical cores) or SpreadByPCPUs (one hyperthread per core).
    #[arg(long, env = "DNE_DEFAULT_CPU_BIND_POLICY", default_value = "FullPCPUs")]
    pub default_cpu_bind_policy: String,
}

impl ScoringArgs {
    /// The one scoring configuration these flags give (device and CPU halves).
    pub fn config(
        &self,
    ) -> Result<crate::scheduler::ScoringConfig, crate::scheduler::ScoringError> {
        crate::scheduler::ScoringConfig::from_flags(&crate::scheduler::ScoringFlags {
            device_strategy: &self.score_strategy,
            device_weights: self.score_weights.as_deref(),
            fragmentation_mix: self.fragmentation_mix.as_deref(),
            cpu_strategy: &self.cpu_score_strategy,
            numa_strategy: &self.numa_score_strategy,
            cpu_weights: self.cpu_score_weights.as_deref(),
            default_cpu_bind_policy: &self.default_cpu_bind_policy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::ScoringFlags;
    use clap::CommandFactory;

    #[derive(clap::Parser)]
    struct Wrapper {
        #[command(flatten)]
        scoring: ScoringArgs,
    }

    /// The flags' declared defaults are `ScoringFlags::DEFAULT`, the one tests and benches
    /// build their configurations from (read from the declarations, so no environment
    /// variable can change the answer).
    #[test]
    fn the_declared_defaults_are_scoring_flags_default() {
        let command = Wrapper::command();
        let default_of = |id: &str| -> Option<String> {
            let arg = command.get_arguments().find(|a| a.get_id() == id)?;
            arg.get_default_values()
                .first()
                .map(|v| v.to_string_lossy().into_owned())
        };
        let d = ScoringFlags::DEFAULT;
        assert_eq!(
            default_of("score_strategy").as_deref(),
            Some(d.device_strategy)
        );
        assert_eq!(
            default_of("score_weights"),
            d.device_weights.map(str::to_owned)
        );
        assert_eq!(
            default_of("fragmentation_mix"),
            d.fragmentation_mix.map(str::to_owned)
        );
        assert_eq!(
            default_of("cpu_score_strategy").as_deref(),
            Some(d.cpu_strategy)
        );
        assert_eq!(
            default_of("numa_score_strategy").as_deref(),
            Some(d.numa_strategy)
        );
        assert_eq!(
            default_of("cpu_score_weights"),
            d.cpu_weights.map(str::to_owned)
        );
        assert_eq!(
            default_of("default_cpu_bind_policy").as_deref(),
            Some(d.default_cpu_bind_policy)
        );
    }
}
