//! What the caches keep of a Node and of a NodeResourceTopology ([`NodeRecord`],
//! [`NodeCpuLabels`], [`TopologyRecord`]): the fields decisions read, converted once per object change.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::nrt::NrtCpuInfo;
use crate::model::koord_cpu::{
    self, CPU_BIND_POLICY_LABEL, NUMA_ALLOCATE_STRATEGY_LABEL, NUMA_TOPOLOGY_POLICY_LABEL,
    RESOURCE_AMPLIFICATION_RATIO,
};
use crate::model::node::Node;
use crate::model::nrt::{Attribute, NodeResourceTopology, Zone};
use crate::model::pod::ResourceList;
use crate::model::quantity::Quantity;
use crate::model::resource_names::ResourceNameSet;
use crate::placement::cpu::{
    NodeCpuBindPolicy, NumaAllocateStrategy, NumaAmplification, NumaPolicy, Ratio,
};

/// Device minors a pod's allocation takes beyond their capacity.
pub type Overcommitted = Vec<(crate::model::device::DeviceType, i32)>;

/// What the caches keep of a Node object.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NodeRecord {
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub allocatable: ResourceList,
    /// `node.koordinator.sh/resource-amplification-ratio`'s CPU ratio.
    #[serde(skip_serializing_if = "CpuAmplificationRatio::is_off")]
    pub cpu_amplification: CpuAmplificationRatio,
    /// The same annotation's cpu and memory ratios above 1, as NUMA placement applies them
    /// (none when it does not parse).
    #[serde(skip)]
    pub numa_amplification: NumaAmplification,
    /// The managed resource names `allocatable` offers a positive quantity of: what device
    /// plugins serve here when the node has no `Device` object.
    #[serde(skip)]
    pub advertised: ResourceNameSet,
    /// What the Device-less rule (`placement::device::deviceless`) takes from `advertised` as
    /// a device plugin's: all of it, less the names the caches were told come from `Device`
    /// objects (`ClusterState::set_deviceless_untrusted`: the GPU share totals, when
    /// koord-manager or the extender writes them, are never a device plugin's).
    #[serde(skip)]
    pub deviceless_advertised: ResourceNameSet,
}

impl NodeRecord {
    pub fn from_node(node: &Node) -> Self {
        let parsed = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RESOURCE_AMPLIFICATION_RATIO))
            .map(|r| koord_cpu::parse_amplification_ratios(r));
        let advertised = ResourceNameSet::of(
            node.status
                .allocatable
                .iter()
                .flatten()
                .filter(|(_, q)| Quantity::parse(q).is_ok_and(|q| q.milli() > 0))
                .map(|(name, _)| name.as_str()),
        );
        NodeRecord {
            uid: node.metadata.uid.clone().unwrap_or_default(),
            labels: node.labels(),
            allocatable: node.status.allocatable.clone().unwrap_or_default(),
            advertised,
            deviceless_advertised: advertised,
            cpu_amplification: CpuAmplificationRatio::from_parsed(parsed.as_ref()),
            numa_amplification: match &parsed {
                Some(Ok(r)) => NumaAmplification {
                    cpu: r.cpu.and_then(Ratio::above_one),
                    memory: r.memory.and_then(Ratio::above_one),
                },
                _ => NumaAmplification::default(),
            },
        }
    }

    /// The Node's allocatable CPU in millicores (0 when absent: no CPU to give).
    pub fn allocatable_milli_cpu(&self) -> i64 {
        self.allocatable
            .get("cpu")
            .and_then(|q| Quantity::parse(q).ok())
            .map_or(0, |q| q.milli_value())
    }
}

/// A Node's CPU amplification ratio, parsed once per Node change.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum CpuAmplificationRatio {
    /// No annotation, no CPU ratio in it, or a ratio of at most 1.
    #[default]
    Off,
    Ratio(Ratio),
    /// The annotation does not parse: pods with a CPU request are refused here.
    Invalid(String),
}

impl CpuAmplificationRatio {
    pub fn from_annotation(value: Option<&str>) -> Self {
        Self::from_parsed(value.map(koord_cpu::parse_amplification_ratios).as_ref())
    }

    /// From the annotation already parsed (`None`: no annotation).
    pub fn from_parsed(
        parsed: Option<&Result<koord_cpu::AmplificationRatios, koord_cpu::KoordCpuError>>,
    ) -> Self {
        match parsed.map(|p| p.as_ref().map(|r| r.cpu)) {
            None | Some(Ok(None)) => CpuAmplificationRatio::Off,
            Some(Ok(Some(r))) => {
                Ratio::above_one(r).map_or(CpuAmplificationRatio::Off, CpuAmplificationRatio::Ratio)
            }
            Some(Err(e)) => CpuAmplificationRatio::Invalid(e.to_string()),
        }
    }

    pub fn is_off(&self) -> bool {
        matches!(self, CpuAmplificationRatio::Off)
    }
}

impl Serialize for CpuAmplificationRatio {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            CpuAmplificationRatio::Off => s.serialize_none(),
            CpuAmplificationRatio::Ratio(r) => s.serialize_f64(r.get()),
            CpuAmplificationRatio::Invalid(e) => s.serialize_str(&format!("invalid: {e}")),
        }
    }
}

/// What the caches keep of a NodeResourceTopology: zones, policies and koordinator's CPU
/// topology annotations (verbatim; NUMA placement parses them).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TopologyRecord {
    pub zones: Vec<Zone>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<Attribute>,
    /// `node.koordinator.sh/*` and `kubelet.koordinator.sh/*` annotations.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub koordinator_annotations: BTreeMap<String, String>,
    /// The CPU/NUMA reading of the above, parsed once per NRT change.
    #[serde(skip)]
    pub cpu: Arc<NrtCpuInfo>,
}

impl TopologyRecord {
    pub fn from_nrt(nrt: &NodeResourceTopology) -> Self {
        let koordinator_annotations = nrt
            .metadata
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| {
                k.starts_with("node.koordinator.sh/") || k.starts_with("kubelet.koordinator.sh/")
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let cpu = Arc::new(NrtCpuInfo::parse(
            &nrt.zones,
            &nrt.topology_policies,
            &nrt.attributes,
            &koordinator_annotations,
        ));
        TopologyRecord {
            cpu,
            zones: nrt.zones.clone(),
            policies: nrt.topology_policies.clone(),
            attributes: nrt.attributes.clone(),
            koordinator_annotations,
        }
    }
}

/// The CPU-relevant labels of a Node, and its amplification ratios, parsed once per Node change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeCpuLabels {
    pub bind_policy: NodeCpuBindPolicy,
    /// `Some` when the label is set (non-empty): it overrides the NRT, `None`/unknown → None.
    pub numa_policy: Option<NumaPolicy>,
    pub strategy: Option<NumaAllocateStrategy>,
    pub amplification: NumaAmplification,
}

impl NodeCpuLabels {
    pub fn from_node(node: &NodeRecord) -> Self {
        NodeCpuLabels {
            amplification: node.numa_amplification,
            ..Self::from_labels(&node.labels)
        }
    }

    pub fn from_labels(labels: &BTreeMap<String, String>) -> Self {
        NodeCpuLabels {
            bind_policy: labels
                .get(CPU_BIND_POLICY_LABEL)
                .map_or(NodeCpuBindPolicy::None, |v| {
                    koord_cpu::node_bind_policy_from_label(v)
                }),
            numa_policy: labels
                .get(NUMA_TOPOLOGY_POLICY_LABEL)
                .filter(|v| !v.is_empty())
                .map(|v| koord_cpu::numa_policy_from_label(v)),
            strategy: labels
                .get(NUMA_ALLOCATE_STRATEGY_LABEL)
                .and_then(|v| koord_cpu::allocate_strategy_from_label(v)),
            amplification: NumaAmplification::default(),
        }
    }
}

/// A test node's NodeResourceTopology: 2 NUMA nodes × 8 cores × 2 threads (NUMA `n` holds CPUs
/// `16n..16n+15`, a core's threads adjacent), 64 GiB per NUMA node, no NUMA policy.
#[cfg(test)]
pub(crate) fn two_numa_test_topology() -> TopologyRecord {
    use serde_json::json;
    let detail: Vec<_> = (0..32)
        .map(|id| json!({"id": id, "core": id / 2, "socket": id / 16, "node": id / 16}))
        .collect();
    let zones: Vec<_> = (0..2)
        .map(|z| json!({"name": format!("node-{z}"), "type": "Node",
            "resources": [{"name": "cpu", "capacity": "16", "allocatable": "16", "available": "16"},
                          {"name": "memory", "capacity": "64Gi", "allocatable": "64Gi", "available": "64Gi"}]}))
        .collect();
    let nrt: NodeResourceTopology = serde_json::from_value(json!({
        "metadata": {"name": "n", "annotations": {
            "node.koordinator.sh/cpu-topology": json!({"detail": detail}).to_string()}},
        "topologyPolicies": ["None"],
        "zones": zones
    }))
    .expect("nrt");
    TopologyRecord::from_nrt(&nrt)
}
