//! The kinds this service watches and the event shape every source produces.

use std::fmt;

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Nodes,
    Pods,
    Devices,
    #[serde(rename = "noderesourcetopologies")]
    NodeResourceTopologies,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::Nodes,
        Kind::Pods,
        Kind::Devices,
        Kind::NodeResourceTopologies,
    ];

    /// Position in [`Kind::ALL`], for per-kind arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Nodes => "nodes",
            Kind::Pods => "pods",
            Kind::Devices => "devices",
            Kind::NodeResourceTopologies => "noderesourcetopologies",
        }
    }

    /// Kinds backed by a CRD, which may be absent from a cluster.
    pub fn is_optional(self) -> bool {
        matches!(self, Kind::Devices | Kind::NodeResourceTopologies)
    }

    /// What stops working when this kind is disabled.
    pub fn features(self) -> &'static str {
        match self {
            Kind::Devices => "GPU/RDMA/FPGA sharing (device requests are left to the kubelet)",
            Kind::NodeResourceTopologies => "NUMA-aware CPU placement",
            Kind::Nodes | Kind::Pods => "everything",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nodes" | "node" => Some(Kind::Nodes),
            "pods" | "pod" => Some(Kind::Pods),
            "devices" | "device" => Some(Kind::Devices),
            "noderesourcetopologies" | "noderesourcetopology" | "nrt" | "nrts" => {
                Some(Kind::NodeResourceTopologies)
            }
            _ => None,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One step of a kind's stream, whatever the source (kube watcher or cluster file).
/// Mirrors kube-runtime's `watcher::Event`.
#[derive(Debug)]
pub enum SyncEvent<T> {
    /// A (re)list starts: buffer afresh, even if a previous list was half done.
    Init,
    InitApply(T),
    /// The listed set is complete: diff it against the cache.
    InitDone,
    Apply(T),
    Delete(T),
}
