//! Operator tools: what the extender sees, for the people who run it.
//!
//! - [`report`]: the per-node device report and cluster summary, computed from the caches (the one
//!   implementation behind `inspect`, `simulate`, `GET /debug/nodes` and the capacity gauges);
//! - [`inspect`]: the view from a cluster file, a kubeconfig (one list, no watch) or a running
//!   service, printed as a table or JSON;
//! - [`simulate`]: pending pods through the real filter → prioritize → bind, in memory;
//! - [`capacity`]: the scrape-time capacity gauges;
//! - [`args`]: their command-line flags.
//!
//! Nothing here parses API objects or decides placements: loading goes through [`crate::sync`],
//! decisions through [`crate::scheduler`] (its verbs and bind).

pub mod args;
pub(crate) mod capacity;
pub mod inspect;
pub mod pending;
pub(crate) mod render;
pub mod replay;
pub mod simulate;

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error(transparent)]
    ClusterFile(#[from] crate::sync::file_source::ClusterFileError),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Client(String),
    #[error("cannot list the cluster: {0}")]
    List(String),
    #[error("cannot read the view of {url}: {message}")]
    Server { url: String, message: String },
    #[error("not in the cluster: {}", .0.join(", "))]
    UnknownNodes(Vec<String>),
    /// `inspect --pod`: the pod named is malformed or not found.
    #[error("--pod {key}: {message}")]
    Pod { key: String, message: String },
    #[error("invalid scoring flags: {0}")]
    Scoring(#[from] crate::scheduler::ScoringError),
    #[error("cannot encode the output: {0}")]
    Encode(String),
    #[error("cannot write the output: {0}")]
    Io(std::io::Error),
}
