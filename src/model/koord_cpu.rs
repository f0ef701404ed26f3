//! koordinator's CPU/NUMA annotations and labels (reference `numa.md` §1.1, §1.8): the keys,
//! their JSON shapes, strict parse functions with error enums, and the `resource-status` writer.
//!
//! Owns the wire form only: what a string means is decided here (including the deliberate
//! mapping of every NUMA policy string), but nothing here keeps state, counts, logs or decides
//! placement. Every parse error names the annotation and the offending part.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cpu_policy::{
    CpuBindPolicy, CpuDetail, CpuExclusivePolicy, MAX_NUMA_NODES, NodeCpuBindPolicy,
    NumaAllocateStrategy, NumaExclusive, NumaId, NumaPolicy, NumaShare,
};
use super::cpuset::{CpuId, CpuSet, CpuSetError};
use super::quantity::{Quantity, QuantityError};

// ---- keys ------------------------------------------------------------------------------------

/// NRT annotation: the CPU map, `{"detail":[{"id":0,"core":0,"socket":0,"node":0},...]}`.
pub const CPU_TOPOLOGY: &str = "node.koordinator.sh/cpu-topology";
/// NRT annotation: kubelet's CPU manager policy, options and reserved CPUs.
pub const KUBELET_CPU_MANAGER_POLICY: &str = "kubelet.koordinator.sh/cpu-manager-policy";
/// NRT annotation: CPUs of kubelet-static pods.
pub const POD_CPU_ALLOCS: &str = "node.koordinator.sh/pod-cpu-allocs";
/// NRT annotation (copied from the Node): node reservation, `reservedCPUs` materialised.
pub const NODE_RESERVATION: &str = "node.koordinator.sh/reservation";
/// NRT annotation (copied from the Node): the system QoS cpuset.
pub const SYSTEM_QOS_RESOURCE: &str = "node.koordinator.sh/system-qos-resource";

/// The NRT annotations the CPU ledger reads, in the order they are parsed.
pub const NRT_CPU_ANNOTATIONS: [&str; 5] = [
    CPU_TOPOLOGY,
    KUBELET_CPU_MANAGER_POLICY,
    POD_CPU_ALLOCS,
    NODE_RESERVATION,
    SYSTEM_QOS_RESOURCE,
];

/// Pod annotation: CPU bind and exclusivity wishes (read, and written back at bind).
pub const RESOURCE_SPEC: &str = "scheduling.koordinator.sh/resource-spec";
/// Pod annotation: pod-level NUMA policy.
pub const NUMA_TOPOLOGY_SPEC: &str = "scheduling.koordinator.sh/numa-topology-spec";
/// Pod annotation: the cpuset and NUMA shares the scheduler chose (koordlet applies it).
pub const RESOURCE_STATUS: &str = super::annotations::RESOURCE_STATUS;

/// Node label: `None` | `FullPCPUsOnly` | `SpreadByPCPUs`.
pub const CPU_BIND_POLICY_LABEL: &str = "node.koordinator.sh/cpu-bind-policy";
/// Node label: `BestEffort` | `Restricted` | `SingleNUMANode` (overrides the NRT).
pub const NUMA_TOPOLOGY_POLICY_LABEL: &str = "node.koordinator.sh/numa-topology-policy";
/// Node label: `MostAllocated` | `LeastAllocated` | `DistributeEvenly`.
pub const NUMA_ALLOCATE_STRATEGY_LABEL: &str = "node.koordinator.sh/numa-allocate-strategy";

/// Pod label: `LSE` | `LSR` | `LS` | `BE` | `SYSTEM`.
pub const QOS_CLASS_LABEL: &str = "koordinator.sh/qosClass";
/// Pod label: `koord-prod` | `koord-mid` | `koord-batch` | `koord-free`.
pub const PRIORITY_CLASS_LABEL: &str = "koordinator.sh/priority-class";

/// The short form of an annotation key, for metric labels.
pub fn short_key(key: &str) -> &str {
    key.rsplit_once('/').map_or(key, |(_, k)| k)
}

// ---- errors ----------------------------------------------------------------------------------

/// Why a koordinator CPU/NUMA annotation could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KoordCpuError {
    #[error("annotation {annotation}: invalid JSON: {source}")]
    Json {
        annotation: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("annotation {annotation}: {field} is missing")]
    MissingField {
        annotation: &'static str,
        field: String,
    },
    #[error("annotation {annotation}: {field}={value} must not be negative")]
    Negative {
        annotation: &'static str,
        field: String,
        value: String,
    },
    #[error("annotation {annotation}: {field}={value} is out of range")]
    OutOfRange {
        annotation: &'static str,
        field: String,
        value: String,
    },
    #[error("annotation {annotation}: {field} is not a CPU list: {source}")]
    CpuList {
        annotation: &'static str,
        field: String,
        #[source]
        source: CpuSetError,
    },
    #[error("annotation {annotation}: {field}={value:?} is not a quantity: {source}")]
    Quantity {
        annotation: &'static str,
        field: String,
        value: String,
        #[source]
        source: QuantityError,
    },
}

impl KoordCpuError {
    /// Short label for metrics.
    pub fn class(&self) -> &'static str {
        match self {
            KoordCpuError::Json { .. } => "bad_json",
            KoordCpuError::MissingField { .. } => "missing_field",
            KoordCpuError::Negative { .. } => "negative",
            KoordCpuError::OutOfRange { .. } => "out_of_range",
            KoordCpuError::CpuList { .. } => "bad_cpu_list",
            KoordCpuError::Quantity { .. } => "bad_quantity",
        }
    }
    pub fn annotation(&self) -> &'static str {
        match self {
            KoordCpuError::Json { annotation, .. }
            | KoordCpuError::MissingField { annotation, .. }
            | KoordCpuError::Negative { annotation, .. }
            | KoordCpuError::OutOfRange { annotation, .. }
            | KoordCpuError::CpuList { annotation, .. }
            | KoordCpuError::Quantity { annotation, .. } => annotation,
        }
    }
}

fn json<'a, T: Deserialize<'a>>(annotation: &'static str, s: &'a str) -> Result<T, KoordCpuError> {
    serde_json::from_str(s).map_err(|source| KoordCpuError::Json { annotation, source })
}

/// A CPU list field. Negative ids (`"-1"`, `"0,-2"`) are reported as such, not as "not a
/// number", because a negative reservation is a distinct koordlet bug class.
fn cpu_list(annotation: &'static str, field: &str, s: &str) -> Result<CpuSet, KoordCpuError> {
    if s.split(',')
        .any(|e| e.trim().starts_with('-') && e.trim().len() > 1)
    {
        return Err(KoordCpuError::Negative {
            annotation,
            field: field.to_string(),
            value: s.to_string(),
        });
    }
    s.parse().map_err(|source| KoordCpuError::CpuList {
        annotation,
        field: field.to_string(),
        source,
    })
}

/// A JSON number or string as a quantity (koordinator's own tests write `"cpu":4`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum QuantityValue {
    S(String),
    I(i64),
    F(f64),
}

impl QuantityValue {
    fn text(&self) -> String {
        match self {
            QuantityValue::S(s) => s.clone(),
            QuantityValue::I(i) => i.to_string(),
            QuantityValue::F(f) => f.to_string(),
        }
    }
}

fn quantity(
    annotation: &'static str,
    field: &str,
    v: &QuantityValue,
) -> Result<Quantity, KoordCpuError> {
    let text = v.text();
    let q = Quantity::parse(&text).map_err(|source| KoordCpuError::Quantity {
        annotation,
        field: field.to_string(),
        value: text.clone(),
        source,
    })?;
    if q.milli() < 0 {
        return Err(KoordCpuError::Negative {
            annotation,
            field: field.to_string(),
            value: text,
        });
    }
    Ok(q)
}

// ---- NRT annotations -------------------------------------------------------------------------

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

// ---- pod annotations -------------------------------------------------------------------------

/// A bind policy string as it appears in `resource-spec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindPolicyValue {
    /// Absent, empty or `Default`: the configured default.
    Default,
    /// `None` or an unknown string: no cpuset.
    None,
    Policy(CpuBindPolicy),
}

fn bind_policy_value(s: Option<&str>) -> BindPolicyValue {
    match s.unwrap_or("") {
        "" | "Default" => BindPolicyValue::Default,
        "FullPCPUs" => BindPolicyValue::Policy(CpuBindPolicy::FullPcpus),
        "SpreadByPCPUs" => BindPolicyValue::Policy(CpuBindPolicy::SpreadByPcpus),
        _ => BindPolicyValue::None,
    }
}

pub fn bind_policy_str(p: CpuBindPolicy) -> &'static str {
    match p {
        CpuBindPolicy::FullPcpus => "FullPCPUs",
        CpuBindPolicy::SpreadByPcpus => "SpreadByPCPUs",
    }
}

/// `scheduling.koordinator.sh/resource-spec`, as parsed; `raw` keeps every field so a
/// write-back preserves what we do not interpret.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceSpec {
    pub required: Option<BindPolicyValue>,
    pub preferred: BindPolicyValue,
    pub exclusive: CpuExclusivePolicy,
    pub raw: serde_json::Map<String, serde_json::Value>,
}

pub fn parse_resource_spec(s: &str) -> Result<ResourceSpec, KoordCpuError> {
    const A: &str = RESOURCE_SPEC;
    let raw: serde_json::Map<String, serde_json::Value> = json(A, s)?;
    let field = |name: &str| raw.get(name).and_then(|v| v.as_str());
    let required = match field("requiredCPUBindPolicy") {
        None | Some("") => None,
        v => Some(bind_policy_value(v)),
    };
    let exclusive = match field("preferredCPUExclusivePolicy") {
        Some("PCPULevel") => CpuExclusivePolicy::PcpuLevel,
        Some("NUMANodeLevel") => CpuExclusivePolicy::NumaNodeLevel,
        _ => CpuExclusivePolicy::None,
    };
    Ok(ResourceSpec {
        required,
        preferred: bind_policy_value(field("preferredCPUBindPolicy")),
        exclusive,
        raw,
    })
}

/// The §1.8 write-back: record the policy the pod was actually bound with so later readers
/// (koordinator, a restarted scheduler) need not re-derive it. `forced` is the node-forced
/// required policy, `effective` the policy the cpuset was allocated with. `None` when the
/// annotation would not change.
pub fn resource_spec_write_back(
    current: Option<&ResourceSpec>,
    forced: Option<CpuBindPolicy>,
    effective: CpuBindPolicy,
) -> Option<String> {
    let mut raw = current.map(|c| c.raw.clone()).unwrap_or_default();
    let before = raw.clone();
    let get = |raw: &serde_json::Map<String, serde_json::Value>, k: &str| {
        raw.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string()
    };
    let required = get(&raw, "requiredCPUBindPolicy");
    let preferred = get(&raw, "preferredCPUBindPolicy");
    if let Some(f) = forced
        && (required.is_empty() || required == "Default")
    {
        raw.insert("requiredCPUBindPolicy".into(), bind_policy_str(f).into());
    }
    if preferred == "Default" || (preferred.is_empty() && required.is_empty()) {
        raw.insert(
            "preferredCPUBindPolicy".into(),
            bind_policy_str(effective).into(),
        );
    }
    (raw != before).then(|| serde_json::Value::Object(raw).to_string())
}

/// `scheduling.koordinator.sh/numa-topology-spec`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NumaTopologySpec {
    pub policy: NumaPolicy,
    pub exclusive: NumaExclusive,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NumaTopologySpecJson {
    #[serde(default)]
    numa_topology_policy: String,
    #[serde(default, rename = "singleNUMANodeExclusive")]
    single_numa_node_exclusive: String,
}

pub fn parse_numa_topology_spec(s: &str) -> Result<NumaTopologySpec, KoordCpuError> {
    let j: NumaTopologySpecJson = json(NUMA_TOPOLOGY_SPEC, s)?;
    Ok(NumaTopologySpec {
        policy: numa_policy_from_label(&j.numa_topology_policy),
        exclusive: match j.single_numa_node_exclusive.as_str() {
            "Required" => NumaExclusive::Required,
            "Preferred" => NumaExclusive::Preferred,
            _ => NumaExclusive::Unset,
        },
    })
}

/// `scheduling.koordinator.sh/resource-status`: what koordlet applies. Both parts may be
/// empty (then the pod holds nothing CPU-specific).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceStatus {
    pub cpuset: CpuSet,
    /// Ascending NUMA id; only cpu and memory are accounted.
    pub numa: Vec<NumaShare>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResourceStatusJson {
    #[serde(default)]
    cpuset: String,
    #[serde(default)]
    numa_node_resources: Option<Vec<NumaNodeResourceJson>>,
}

#[derive(Deserialize)]
struct NumaNodeResourceJson {
    node: Option<i64>,
    #[serde(default)]
    resources: BTreeMap<String, QuantityValue>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceStatusOut<'a> {
    #[serde(skip_serializing_if = "String::is_empty")]
    cpuset: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    numa_node_resources: Vec<NumaNodeResourceOut<'a>>,
}

#[derive(Serialize)]
struct NumaNodeResourceOut<'a> {
    node: NumaId,
    resources: BTreeMap<&'a str, String>,
}

impl ResourceStatus {
    pub fn is_empty(&self) -> bool {
        self.cpuset.is_empty() && self.numa.is_empty()
    }

    pub fn parse(s: &str) -> Result<Self, KoordCpuError> {
        const A: &str = RESOURCE_STATUS;
        let j: ResourceStatusJson = json(A, s)?;
        let cpuset = cpu_list(A, "cpuset", &j.cpuset)?;
        let mut numa: BTreeMap<NumaId, NumaShare> = BTreeMap::new();
        for (i, e) in j.numa_node_resources.iter().flatten().enumerate() {
            let field = format!("numaNodeResources[{i}].node");
            let node = e.node.ok_or_else(|| KoordCpuError::MissingField {
                annotation: A,
                field: field.clone(),
            })?;
            if node < 0 {
                return Err(KoordCpuError::Negative {
                    annotation: A,
                    field,
                    value: node.to_string(),
                });
            }
            let id = NumaId::try_from(node)
                .ok()
                .filter(|id| (*id as usize) < MAX_NUMA_NODES)
                .ok_or_else(|| KoordCpuError::OutOfRange {
                    annotation: A,
                    field,
                    value: node.to_string(),
                })?;
            let share = numa.entry(id).or_insert(NumaShare {
                numa: id,
                cpu_milli: 0,
                memory_bytes: 0,
            });
            for (name, v) in &e.resources {
                let q = quantity(A, &format!("numaNodeResources[{i}].resources.{name}"), v)?;
                match name.as_str() {
                    "cpu" => share.cpu_milli = share.cpu_milli.saturating_add(q.milli_value()),
                    "memory" => share.memory_bytes = share.memory_bytes.saturating_add(q.value()),
                    _ => {}
                }
            }
        }
        Ok(ResourceStatus {
            cpuset,
            numa: numa.into_values().collect(),
        })
    }

    /// The annotation value koordlet parses: Linux list form, quantities as Kubernetes strings
    /// (`"4"`, `"500m"`, `"8Gi"`), both fields omitted when empty.
    pub fn to_annotation(&self) -> String {
        let out = ResourceStatusOut {
            cpuset: self.cpuset.to_string(),
            numa_node_resources: self
                .numa
                .iter()
                .map(|s| {
                    let mut resources = BTreeMap::new();
                    if s.cpu_milli > 0 {
                        resources
                            .insert("cpu", Quantity::from_milli(s.cpu_milli.into()).to_string());
                    }
                    if s.memory_bytes > 0 {
                        resources.insert(
                            "memory",
                            super::device::format_bytes(Quantity::from_units(s.memory_bytes)),
                        );
                    }
                    NumaNodeResourceOut {
                        node: s.numa,
                        resources,
                    }
                })
                .collect(),
        };
        serde_json::to_string(&out).unwrap_or_else(|_| "{}".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_status_round_trips_in_koordlet_form() {
        let s = ResourceStatus {
            cpuset: "0-3,8".parse().unwrap(),
            numa: vec![NumaShare {
                numa: 0,
                cpu_milli: 4000,
                memory_bytes: 8 << 30,
            }],
        };
        let text = s.to_annotation();
        assert_eq!(
            text,
            r#"{"cpuset":"0-3,8","numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"8Gi"}}]}"#
        );
        assert_eq!(ResourceStatus::parse(&text).unwrap(), s);
        assert_eq!(ResourceStatus::default().to_annotation(), "{}");
        // koordinator's own tests write numbers.
        let n = ResourceStatus::parse(
            r#"{"cpuset":"35-36,67-68","numaNodeResources":[{"node":1,"resources":{"cpu":4}}]}"#,
        )
        .unwrap();
        assert_eq!(n.numa[0].cpu_milli, 4000);
        assert_eq!(n.cpuset.len(), 4);
    }

    #[test]
    fn resource_status_errors_name_the_part() {
        for (bad, class) in [
            ("{", "bad_json"),
            (r#"{"cpuset":"a"}"#, "bad_cpu_list"),
            (r#"{"cpuset":"-1"}"#, "negative"),
            (
                r#"{"numaNodeResources":[{"resources":{}}]}"#,
                "missing_field",
            ),
            (r#"{"numaNodeResources":[{"node":-1}]}"#, "negative"),
            (r#"{"numaNodeResources":[{"node":99}]}"#, "out_of_range"),
            (
                r#"{"numaNodeResources":[{"node":0,"resources":{"cpu":"x"}}]}"#,
                "bad_quantity",
            ),
        ] {
            let e = ResourceStatus::parse(bad).unwrap_err();
            assert_eq!(e.class(), class, "{bad}: {e}");
            assert!(e.to_string().contains(RESOURCE_STATUS));
        }
    }

    #[test]
    fn cpu_topology_parses_and_names_missing_fields() {
        let d = parse_cpu_topology(
            r#"{"detail":[{"id":0,"core":0,"socket":0,"node":0},{"id":1,"core":0,"socket":0,"node":0}]}"#,
        )
        .unwrap();
        assert_eq!(d.len(), 2);
        let e = parse_cpu_topology(r#"{"detail":[{"id":0,"core":0,"socket":0}]}"#).unwrap_err();
        assert_eq!(e.class(), "missing_field");
        assert!(e.to_string().contains("detail[0].node"), "{e}");
        assert_eq!(
            parse_cpu_topology("{}").unwrap_err().class(),
            "missing_field"
        );
        assert_eq!(
            parse_cpu_topology(r#"{"detail":[{"id":-1,"core":0,"socket":0,"node":0}]}"#)
                .unwrap_err()
                .class(),
            "negative"
        );
        assert_eq!(
            parse_cpu_topology(r#"{"detail":[{"id":99999999999,"core":0,"socket":0,"node":0}]}"#)
                .unwrap_err()
                .class(),
            "out_of_range"
        );
    }

    #[test]
    fn reserved_sources() {
        let k = parse_kubelet_cpu_policy(
            r#"{"policy":"static","options":{"full-pcpus-only":"true"},"reservedCPUs":"0,48"}"#,
        )
        .unwrap();
        assert!(k.full_pcpus_only);
        assert_eq!(k.reserved.to_string(), "0,48");
        assert!(
            !parse_kubelet_cpu_policy(r#"{"policy":"none"}"#)
                .unwrap()
                .full_pcpus_only
        );
        assert_eq!(
            parse_kubelet_cpu_policy(r#"{"policy":"static","reservedCPUs":"-2"}"#)
                .unwrap_err()
                .class(),
            "negative"
        );
        let allocs = parse_pod_cpu_allocs(
            r#"[{"namespace":"a","name":"b","uid":"u","cpuset":"4-7","managedByKubelet":true},
                {"uid":"v","cpuset":"8","managedByKubelet":false},{"uid":"","cpuset":"9","managedByKubelet":true}]"#,
        )
        .unwrap();
        assert_eq!(allocs.to_string(), "4-7");
        assert!(parse_pod_cpu_allocs("null").unwrap().is_empty());
        assert_eq!(
            parse_node_reservation(r#"{"resources":{"cpu":"2"},"reservedCPUs":"0-1"}"#)
                .unwrap()
                .to_string(),
            "0-1"
        );
        assert_eq!(
            parse_node_reservation(r#"{"resources":{"cpu":"-2"}}"#)
                .unwrap_err()
                .class(),
            "negative"
        );
        assert_eq!(
            parse_system_qos(r#"{"cpuset":"0-1"}"#).unwrap().to_string(),
            "0-1"
        );
        assert!(
            parse_system_qos(r#"{"cpuset":"0-1","cpusetExclusive":false}"#)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn all_nine_nrt_policy_strings_are_mapped() {
        use NumaPolicy::*;
        for (s, p) in [
            ("None", None),
            ("BestEffort", BestEffort),
            ("BestEffortPodLevel", BestEffort),
            ("BestEffortContainerLevel", BestEffort),
            ("Restricted", Restricted),
            ("RestrictedPodLevel", Restricted),
            ("RestrictedContainerLevel", Restricted),
            ("SingleNUMANodePodLevel", SingleNumaNode),
            ("SingleNUMANodeContainerLevel", SingleNumaNode),
            ("whatever", None),
        ] {
            assert_eq!(numa_policy_from_nrt_policy(s), p, "{s}");
        }
        let attrs = vec![(
            "topologyManagerPolicy".to_string(),
            "restricted".to_string(),
        )];
        assert_eq!(
            numa_policy_from_nrt(&["SingleNUMANodePodLevel".into()], &attrs),
            Restricted,
            "v1alpha2 attributes win"
        );
        assert_eq!(numa_policy_from_label("None"), None);
        assert_eq!(numa_policy_from_label("bogus"), None);
    }

    #[test]
    fn resource_spec_and_write_back() {
        let s = parse_resource_spec(
            r#"{"preferredCPUBindPolicy":"Default","preferredCPUExclusivePolicy":"PCPULevel","x":1}"#,
        )
        .unwrap();
        assert_eq!(s.preferred, BindPolicyValue::Default);
        assert_eq!(s.exclusive, CpuExclusivePolicy::PcpuLevel);
        let w = resource_spec_write_back(Some(&s), None, CpuBindPolicy::FullPcpus).unwrap();
        let v: serde_json::Value = serde_json::from_str(&w).unwrap();
        assert_eq!(v["preferredCPUBindPolicy"], "FullPCPUs");
        assert_eq!(v["x"], 1, "unknown fields kept");
        let forced = resource_spec_write_back(
            None,
            Some(CpuBindPolicy::SpreadByPcpus),
            CpuBindPolicy::SpreadByPcpus,
        )
        .unwrap();
        assert_eq!(
            forced,
            r#"{"preferredCPUBindPolicy":"SpreadByPCPUs","requiredCPUBindPolicy":"SpreadByPCPUs"}"#
        );
        let done = parse_resource_spec(r#"{"requiredCPUBindPolicy":"FullPCPUs"}"#).unwrap();
        assert_eq!(
            resource_spec_write_back(Some(&done), None, CpuBindPolicy::FullPcpus),
            None
        );
        assert!(parse_resource_spec("[").is_err());
    }
}
