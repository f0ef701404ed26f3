//! koordinator's node-side CPU annotations and labels: the NRT's annotations (CPU topology,
//! kubelet policy, pod CPU allocations, reservations, system QoS) and every NUMA policy and bind
//! policy string a Node or NRT carries.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::model::cpu_policy::{
    CpuDetail, NodeCpuBindPolicy, NumaAllocateStrategy, NumaId, NumaPolicy,
};
use crate::model::cpuset::{CpuId, CpuSet};

use super::*;

#[derive(Deserialize)]
struct CpuTopologyJson {
    detail: Option<Vec<CpuInfoJson>>,
}

#[derive(Deserialize)]
struct CpuInfoJson {
    id: Option<i64>,
    core: Option<i64>,
    socket: Option<i64>,
    node: Option<i64>,
}

/// The ratios of the two resources NUMA placement tracks, each `None` when the annotation names
/// none; a `null` ratio reads as 0.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AmplificationRatios {
    pub cpu: Option<f64>,
    pub memory: Option<f64>,
}

/// `node.koordinator.sh/resource-amplification-ratio` → its cpu and memory ratios (koordinator
/// `extension.GetNodeResourceAmplificationRatios`; every value must be a number or `null`, which
/// reads as 0, as Go decodes it). Any value not above 1 means no amplification, which is the
/// caller's to decide.
pub fn parse_amplification_ratios(s: &str) -> Result<AmplificationRatios, KoordCpuError> {
    let ratios: Option<BTreeMap<String, Option<f64>>> = json(RESOURCE_AMPLIFICATION_RATIO, s)?;
    let get = |name: &str| {
        ratios
            .as_ref()
            .and_then(|r| r.get(name).copied())
            .map(|r| r.unwrap_or(0.0))
    };
    Ok(AmplificationRatios {
        cpu: get("cpu"),
        memory: get("memory"),
    })
}

/// `node.koordinator.sh/cpu-topology` → the CPU details (not yet validated as a topology:
/// duplicates and capacity are `placement::cpu::CpuTopology::new`'s job).
pub fn parse_cpu_topology(s: &str) -> Result<Vec<CpuDetail>, KoordCpuError> {
    const A: &str = CPU_TOPOLOGY;
    let parsed: CpuTopologyJson = json(A, s)?;
    let detail = parsed.detail.ok_or_else(|| KoordCpuError::MissingField {
        annotation: A,
        field: "detail".into(),
    })?;
    let mut out = Vec::with_capacity(detail.len());
    for (i, d) in detail.iter().enumerate() {
        let field = |name: &str, v: Option<i64>| -> Result<u32, KoordCpuError> {
            let v = v.ok_or_else(|| KoordCpuError::MissingField {
                annotation: A,
                field: format!("detail[{i}].{name}"),
            })?;
            if v < 0 {
                return Err(KoordCpuError::Negative {
                    annotation: A,
                    field: format!("detail[{i}].{name}"),
                    value: v.to_string(),
                });
            }
            u32::try_from(v).map_err(|_| KoordCpuError::OutOfRange {
                annotation: A,
                field: format!("detail[{i}].{name}"),
                value: v.to_string(),
            })
        };
        out.push(CpuDetail {
            id: field("id", d.id)? as CpuId,
            core: field("core", d.core)?,
            socket: field("socket", d.socket)?,
            numa: field("node", d.node)? as NumaId,
        });
    }
    Ok(out)
}

/// `kubelet.koordinator.sh/cpu-manager-policy`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeletCpuPolicy {
    /// `none` or `static`.
    pub policy: String,
    /// `static` with option `full-pcpus-only: "true"`: every pod with a CPU request must get
    /// whole cores (the node-forced FullPCPUsOnly policy).
    pub full_pcpus_only: bool,
    pub reserved: CpuSet,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeletCpuPolicyJson {
    #[serde(default)]
    policy: String,
    #[serde(default)]
    options: BTreeMap<String, String>,
    #[serde(default, rename = "reservedCPUs")]
    reserved_cpus: String,
}

pub fn parse_kubelet_cpu_policy(s: &str) -> Result<KubeletCpuPolicy, KoordCpuError> {
    const A: &str = KUBELET_CPU_MANAGER_POLICY;
    let p: KubeletCpuPolicyJson = json(A, s)?;
    let reserved = cpu_list(A, "reservedCPUs", &p.reserved_cpus)?;
    Ok(KubeletCpuPolicy {
        full_pcpus_only: p.policy == "static"
            && p.options.get("full-pcpus-only").map(String::as_str) == Some("true"),
        policy: p.policy,
        reserved,
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodCpuAllocJson {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    cpuset: String,
    #[serde(default)]
    managed_by_kubelet: bool,
}

/// `node.koordinator.sh/pod-cpu-allocs` → the CPUs kubelet-static pods hold (reserved for us).
/// Only entries managed by the kubelet with a uid and a cpuset count (koordinator's rule).
pub fn parse_pod_cpu_allocs(s: &str) -> Result<CpuSet, KoordCpuError> {
    const A: &str = POD_CPU_ALLOCS;
    let list: Option<Vec<PodCpuAllocJson>> = json(A, s)?;
    let mut out = CpuSet::new();
    for (i, e) in list.iter().flatten().enumerate() {
        if e.managed_by_kubelet && !e.uid.is_empty() && !e.cpuset.is_empty() {
            out = out.union(&cpu_list(A, &format!("[{i}].cpuset"), &e.cpuset)?);
        }
    }
    Ok(out)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReservationJson {
    #[serde(default)]
    resources: BTreeMap<String, QuantityValue>,
    #[serde(default, rename = "reservedCPUs")]
    reserved_cpus: String,
}

/// `node.koordinator.sh/reservation` → its `reservedCPUs` (the resources are checked for
/// sanity only: a negative reservation means the annotation cannot be trusted).
pub fn parse_node_reservation(s: &str) -> Result<CpuSet, KoordCpuError> {
    const A: &str = NODE_RESERVATION;
    let r: ReservationJson = json(A, s)?;
    for (name, v) in &r.resources {
        quantity(A, &format!("resources.{name}"), v)?;
    }
    cpu_list(A, "reservedCPUs", &r.reserved_cpus)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SystemQosJson {
    #[serde(default)]
    cpuset: String,
    cpuset_exclusive: Option<bool>,
}

/// `node.koordinator.sh/system-qos-resource` → the CPUs reserved for system QoS (only when
/// exclusive, which is the default).
pub fn parse_system_qos(s: &str) -> Result<CpuSet, KoordCpuError> {
    const A: &str = SYSTEM_QOS_RESOURCE;
    let q: SystemQosJson = json(A, s)?;
    let set = cpu_list(A, "cpuset", &q.cpuset)?;
    Ok(if q.cpuset_exclusive.unwrap_or(true) {
        set
    } else {
        CpuSet::new()
    })
}

// ---- NUMA policy strings ---------------------------------------------------------------------

/// An NRT v1alpha1 `topologyPolicies` value. All nine strings are mapped deliberately
/// (koordinator maps only three and turns the strings koordlet itself writes into None):
/// every `…PodLevel` and `…ContainerLevel` variant means its policy, because a pod placed whole
/// on the NUMA node(s) the policy admits also satisfies the kubelet's per-container check.
/// `None` and unknown strings mean None.
pub fn numa_policy_from_nrt_policy(s: &str) -> NumaPolicy {
    match s {
        "SingleNUMANodePodLevel" | "SingleNUMANodeContainerLevel" => NumaPolicy::SingleNumaNode,
        "Restricted" | "RestrictedPodLevel" | "RestrictedContainerLevel" => NumaPolicy::Restricted,
        "BestEffort" | "BestEffortPodLevel" | "BestEffortContainerLevel" => NumaPolicy::BestEffort,
        _ => NumaPolicy::None,
    }
}

/// An NRT v1alpha2 `topologyManagerPolicy` attribute (kubelet's spelling).
pub fn numa_policy_from_kubelet(s: &str) -> NumaPolicy {
    match s {
        "single-numa-node" => NumaPolicy::SingleNumaNode,
        "restricted" => NumaPolicy::Restricted,
        "best-effort" => NumaPolicy::BestEffort,
        _ => NumaPolicy::None,
    }
}

/// A label or pod `numaTopologyPolicy` value. `None` and unknown strings mean None.
pub fn numa_policy_from_label(s: &str) -> NumaPolicy {
    match s {
        "SingleNUMANode" => NumaPolicy::SingleNumaNode,
        "Restricted" => NumaPolicy::Restricted,
        "BestEffort" => NumaPolicy::BestEffort,
        _ => NumaPolicy::None,
    }
}

/// The node's NUMA policy from its NRT: v1alpha2's `topologyManagerPolicy` attribute wins over
/// v1alpha1's `topologyPolicies[0]` (as scheduler-plugins derives it); the scope attribute does
/// not change the mapping (see [`numa_policy_from_nrt_policy`]).
pub fn numa_policy_from_nrt(policies: &[String], attributes: &[(String, String)]) -> NumaPolicy {
    if let Some((_, v)) = attributes
        .iter()
        .find(|(n, _)| n == "topologyManagerPolicy")
    {
        return numa_policy_from_kubelet(v);
    }
    policies
        .first()
        .map_or(NumaPolicy::None, |p| numa_policy_from_nrt_policy(p))
}

/// Label `node.koordinator.sh/cpu-bind-policy`.
pub fn node_bind_policy_from_label(s: &str) -> NodeCpuBindPolicy {
    match s {
        "FullPCPUsOnly" => NodeCpuBindPolicy::FullPcpusOnly,
        "SpreadByPCPUs" => NodeCpuBindPolicy::SpreadByPcpus,
        _ => NodeCpuBindPolicy::None,
    }
}

/// Label `node.koordinator.sh/numa-allocate-strategy`: `None` when absent or not
/// `MostAllocated`/`LeastAllocated` (`DistributeEvenly` orders like LeastAllocated, as in
/// koordinator's accumulator).
pub fn allocate_strategy_from_label(s: &str) -> Option<NumaAllocateStrategy> {
    match s {
        "MostAllocated" => Some(NumaAllocateStrategy::MostAllocated),
        "LeastAllocated" | "DistributeEvenly" => Some(NumaAllocateStrategy::LeastAllocated),
        _ => None,
    }
}
