//! The kinds this service watches and the event shape every source produces.

use std::fmt;

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Nodes,
    Pods,
    /// Pending pods with a nominated node (preemptors waiting for their victims): a second
    /// pod watch, whose selector is the complement of the first's `spec.nodeName`.
    #[serde(rename = "nominatedpods")]
    NominatedPods,
    Devices,
    #[serde(rename = "noderesourcetopologies")]
    NodeResourceTopologies,
    /// Kubernetes' own device allocator (DRA, `resource.k8s.io/v1`): what it holds, joined to
    /// the `Device` entries (`cluster::dra`).
    #[serde(rename = "deviceclasses")]
    DeviceClasses,
    #[serde(rename = "resourceslices")]
    ResourceSlices,
    #[serde(rename = "resourceclaims")]
    ResourceClaims,
    /// The extender's own DeviceTaintRules (and anyone's, ignored): which DRA pools it owns.
    #[serde(rename = "devicetaintrules")]
    DeviceTaintRules,
    /// PodDisruptionBudgets (`policy/v1`): what preempt's own victims would violate.
    #[serde(rename = "poddisruptionbudgets")]
    PodDisruptionBudgets,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Nodes,
        Kind::Pods,
        Kind::NominatedPods,
        Kind::Devices,
        Kind::NodeResourceTopologies,
        Kind::DeviceClasses,
        Kind::ResourceSlices,
        Kind::ResourceClaims,
        Kind::DeviceTaintRules,
        Kind::PodDisruptionBudgets,
    ];

    /// Position in [`Kind::ALL`], for per-kind arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Nodes => "nodes",
            Kind::Pods => "pods",
            Kind::NominatedPods => "nominatedpods",
            Kind::Devices => "devices",
            Kind::NodeResourceTopologies => "noderesourcetopologies",
            Kind::DeviceClasses => "deviceclasses",
            Kind::ResourceSlices => "resourceslices",
            Kind::ResourceClaims => "resourceclaims",
            Kind::DeviceTaintRules => "devicetaintrules",
            Kind::PodDisruptionBudgets => "poddisruptionbudgets",
        }
    }

    /// Kinds backed by a CRD or an API group a cluster may not serve (everything but the core
    /// kinds and `policy/v1`, GA since Kubernetes 1.21).
    pub fn is_optional(self) -> bool {
        !matches!(
            self,
            Kind::Nodes | Kind::Pods | Kind::NominatedPods | Kind::PodDisruptionBudgets
        )
    }

    /// The DRA kinds: served together (`resource.k8s.io/v1`) and watched together.
    pub fn is_dra(self) -> bool {
        matches!(
            self,
            Kind::DeviceClasses
                | Kind::ResourceSlices
                | Kind::ResourceClaims
                | Kind::DeviceTaintRules
        )
    }

    /// What stops working when this kind is disabled.
    pub fn features(self) -> &'static str {
        match self {
            Kind::Devices => "GPU/RDMA/FPGA sharing (device requests are left to the kubelet)",
            Kind::NodeResourceTopologies => "NUMA-aware CPU placement",
            Kind::DeviceClasses | Kind::ResourceSlices | Kind::ResourceClaims => {
                "counting what Kubernetes' own device allocator (DRA) holds (no DRA in this cluster)"
            }
            Kind::DeviceTaintRules => {
                "handing out devices a DRA driver also publishes (with --dra-ownership they are refused: nothing keeps DRA off them)"
            }
            Kind::NominatedPods => "holding a preemptor's capacity while its victims go",
            Kind::PodDisruptionBudgets => {
                "counting the disruption budgets preempt's victims violate"
            }
            Kind::Nodes | Kind::Pods => "everything",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nodes" | "node" => Some(Kind::Nodes),
            "pods" | "pod" => Some(Kind::Pods),
            "nominatedpods" | "nominatedpod" => Some(Kind::NominatedPods),
            "devices" | "device" => Some(Kind::Devices),
            "noderesourcetopologies" | "noderesourcetopology" | "nrt" | "nrts" => {
                Some(Kind::NodeResourceTopologies)
            }
            "deviceclasses" | "deviceclass" => Some(Kind::DeviceClasses),
            "resourceslices" | "resourceslice" => Some(Kind::ResourceSlices),
            "resourceclaims" | "resourceclaim" => Some(Kind::ResourceClaims),
            "devicetaintrules" | "devicetaintrule" => Some(Kind::DeviceTaintRules),
            "poddisruptionbudgets" | "poddisruptionbudget" | "pdb" | "pdbs" => {
                Some(Kind::PodDisruptionBudgets)
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
