//! koordinator's pod-side CPU annotations: `resource-spec` (the pod's wish, and its
//! write-back), `numa-topology-spec`, and `resource-status` (what a bind wrote: the cpuset and
//! NUMA resources koordlet enforces) with its writer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::cpu_policy::{
    CpuBindPolicy, CpuExclusivePolicy, MAX_NUMA_NODES, NumaExclusive, NumaId, NumaPolicy, NumaShare,
};
use crate::model::cpuset::CpuSet;
use crate::model::quantity::Quantity;

use super::*;

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

/// The `resource-spec` write-back (koordinator nodenumaresource `PreBind`): record the policy the pod was actually bound with so later readers
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
                            crate::model::device::format_bytes(Quantity::from_units(
                                s.memory_bytes,
                            )),
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
