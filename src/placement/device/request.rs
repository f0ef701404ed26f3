//! Device request normalisation and validation, following koordinator's `GetPodDeviceRequests`,
//! `ValidateDeviceRequest`, `ConvertDeviceRequest` and `calcDesiredRequestsAndCountForGPU`.
//!
//! Owns the mapping from a pod's effective requests (and its device annotations) to a
//! [`PodDeviceRequest`]: per device type, how many devices and how much of each. It rejects
//! illegal combinations with a message naming the offending resources, and rejects what this
//! service does not implement (Huawei NPUs, allocation hints, partition specs) instead of
//! silently mis-placing. It does not look at any node.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Deserialize;

use crate::model::device::{
    AMD_GPU, DEVICE_ALLOCATE_HINT, DEVICE_JOINT_ALLOCATE, DeviceResources, DeviceType, FPGA,
    GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU_PARTITION_SPEC, GPU_SHARED, HUAWEI_NPU_CORE,
    HUAWEI_NPU_CPU, HUAWEI_NPU_DVPP, HYGON_DCU, KOORD_GPU, NVIDIA_GPU, RDMA,
    canonicalize_resource_names,
};
use crate::model::gpu_partition::{GpuPartitionSpec, parse_partition_spec};
use crate::model::quantity::Quantity;
use crate::model::resource_names::ResourceNameSet;

/// Upper bound on devices per type for one pod. Far above any real node; it keeps arithmetic
/// and allocation work bounded for absurd inputs.
pub const MAX_DEVICES_PER_TYPE: i64 = 1024;

/// What a pod needs of one device type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceTypeRequest {
    /// The normalised per-pod request (koordinator's converted requests, `gpu.shared` included).
    pub total: DeviceResources,
    /// What each chosen device must provide (after integer division; `gpu.shared` removed).
    pub per_device: DeviceResources,
    /// How many distinct devices to allocate.
    pub count: usize,
    /// Partial-device request (GPU: per-GPU ratio < 100, or bytes without a ratio).
    pub shared: bool,
}

/// `device-joint-allocate` `requiredScope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JointScope {
    /// Secondary devices must sit on exactly the primary's PCIe switches.
    SamePcie,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JointAllocate {
    /// Requested types in annotation order; the first is the primary.
    pub device_types: Vec<DeviceType>,
    /// `None`: secondaries prefer the primary's PCIe switches but are not bound to them.
    pub required_scope: Option<JointScope>,
}

/// A pod's device needs, per type (only types the pod requests).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodDeviceRequest {
    pub types: BTreeMap<DeviceType, DeviceTypeRequest>,
    pub joint: Option<JointAllocate>,
    /// `scheduling.koordinator.sh/gpu-partition-spec` (GPU requests only): partitions are
    /// honoured for this pod on every node.
    pub gpu_partition: Option<GpuPartitionSpec>,
    /// `scheduling.koordinator.sh/device-allocate-hint`, by device type.
    pub hints: BTreeMap<DeviceType, DeviceHint>,
    /// The managed resource names the pod asks for, as written (deprecated ones too): what a
    /// node without a `Device` object must advertise to serve the pod through its device
    /// plugins (`scheduler::decide::deviceless_fit`).
    pub asked: ResourceNameSet,
}

impl PodDeviceRequest {
    pub fn get(&self, t: &DeviceType) -> Option<&DeviceTypeRequest> {
        self.types.get(t)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceRequestError {
    #[error("invalid device request: {resource}={value} {rule}")]
    InvalidValue {
        resource: String,
        value: String,
        rule: String,
    },
    #[error("invalid device request: {} is not a legal combination of GPU resources{}", .resources.join(" + "), hint_suffix(.hint))]
    IllegalCombination {
        resources: Vec<String>,
        hint: Option<&'static str>,
    },
    #[error("unsupported device request: {}: {reason}", .resources.join(", "))]
    Unsupported {
        resources: Vec<String>,
        reason: &'static str,
    },
    #[error("invalid annotation {key}: {reason}")]
    InvalidAnnotation { key: &'static str, reason: String },
    #[error("unsupported annotation {key}: {reason}")]
    UnsupportedAnnotation {
        key: &'static str,
        reason: &'static str,
    },
}

fn hint_suffix(h: &Option<&'static str>) -> String {
    h.map(|h| format!(" ({h})")).unwrap_or_default()
}

const GPU_NAMES: [&str; 11] = [
    NVIDIA_GPU,
    AMD_GPU,
    HYGON_DCU,
    KOORD_GPU,
    GPU_SHARED,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    HUAWEI_NPU_CORE,
    HUAWEI_NPU_CPU,
    HUAWEI_NPU_DVPP,
];
const NPU_NAMES: [&str; 3] = [HUAWEI_NPU_CORE, HUAWEI_NPU_CPU, HUAWEI_NPU_DVPP];
const WHOLE_GPU_NAMES: [&str; 3] = [NVIDIA_GPU, AMD_GPU, HYGON_DCU];

fn invalid(resource: &str, value: i64, rule: impl Into<String>) -> DeviceRequestError {
    DeviceRequestError::InvalidValue {
        resource: resource.to_string(),
        value: value.to_string(),
        rule: rule.into(),
    }
}

/// koordinator's `ValidatePercentageResource`: ≤100, or a whole number of devices.
fn check_percentage(name: &str, v: i64) -> Result<(), DeviceRequestError> {
    if v > 100 && v % 100 != 0 {
        return Err(invalid(name, v, "must be <= 100 or a multiple of 100"));
    }
    if v / 100 > MAX_DEVICES_PER_TYPE {
        return Err(invalid(
            name,
            v,
            format!("asks for more than {MAX_DEVICES_PER_TYPE} devices"),
        ));
    }
    Ok(())
}

fn units(q: Quantity) -> i64 {
    q.value()
}

/// Normalises and validates a pod's device requests (effective pod requests, see
/// [`crate::model::requests::pod_requests`]). `Ok(None)` means the pod needs no devices.
pub fn parse_device_request(
    requests: &BTreeMap<String, Quantity>,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<PodDeviceRequest>, DeviceRequestError> {
    let asked = ResourceNameSet::of(
        requests
            .iter()
            .filter(|(_, q)| q.milli() > 0)
            .map(|(k, _)| k.as_str()),
    );
    let requests: BTreeMap<String, Quantity> = canonicalize_resource_names(
        requests
            .iter()
            .filter(|(_, q)| !q.is_zero())
            .map(|(k, q)| (k.clone(), *q))
            .collect(),
    );
    let mut types = BTreeMap::new();
    for (name, q) in &requests {
        let device_name = GPU_NAMES.contains(&name.as_str()) || name == RDMA || name == FPGA;
        if device_name && q.milli() < 0 {
            return Err(invalid(name, units(*q), "must not be negative"));
        }
    }
    if let Some(gpu) = parse_gpu(&requests)? {
        types.insert(DeviceType::Gpu, gpu);
    }
    for (t, name) in [(DeviceType::Rdma, RDMA), (DeviceType::Fpga, FPGA)] {
        if let Some(q) = requests.get(name) {
            types.insert(t, parse_percentage_device(name, *q)?);
        }
    }
    if types.is_empty() {
        return Ok(None);
    }
    let joint = parse_annotations(annotations, &types)?;
    let hints = match annotations.and_then(|a| a.get(DEVICE_ALLOCATE_HINT)) {
        Some(raw) => parse_hints(raw)?,
        None => BTreeMap::new(),
    };
    // koordinator reads the partition spec only for pods asking for GPUs.
    let gpu_partition = match annotations.and_then(|a| a.get(GPU_PARTITION_SPEC)) {
        Some(raw) if types.contains_key(&DeviceType::Gpu) => Some(
            parse_partition_spec(raw).map_err(|e| DeviceRequestError::InvalidAnnotation {
                key: GPU_PARTITION_SPEC,
                reason: e.to_string(),
            })?,
        ),
        _ => None,
    };
    Ok(Some(PodDeviceRequest {
        types,
        joint,
        gpu_partition,
        hints,
        asked,
    }))
}

/// A label selector of a hint: koordinator's `metav1.LabelSelector` semantics (an empty one
/// matches every device), compared and hashed by its canonical JSON.
#[derive(Clone, Debug)]
pub struct HintSelector {
    text: String,
    selector: kube::core::Selector,
}

impl HintSelector {
    fn parse(field: &str, v: LabelSelector) -> Result<Self, DeviceRequestError> {
        let invalid = |reason: String| DeviceRequestError::InvalidAnnotation {
            key: DEVICE_ALLOCATE_HINT,
            reason: format!("{field}: {reason}"),
        };
        // What `metav1.LabelSelectorAsSelector` refuses and kube's conversion lets through.
        for r in v.match_expressions.iter().flatten() {
            let n = r.values.as_ref().map_or(0, Vec::len);
            match r.operator.as_str() {
                "In" | "NotIn" if n == 0 => {
                    return Err(invalid(format!(
                        "{} {}: the values can't be empty",
                        r.key, r.operator
                    )));
                }
                "Exists" | "DoesNotExist" if n > 0 => {
                    return Err(invalid(format!(
                        "{} {}: takes no values",
                        r.key, r.operator
                    )));
                }
                _ => {}
            }
        }
        let text = serde_json::to_string(&v).unwrap_or_default();
        let selector = kube::core::Selector::try_from(v).map_err(|e| invalid(e.to_string()))?;
        Ok(HintSelector { text, selector })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        use kube::core::SelectorExt;
        self.selector.matches(labels)
    }
}

impl PartialEq for HintSelector {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}
impl Eq for HintSelector {}
impl std::hash::Hash for HintSelector {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

/// One device type's `device-allocate-hint` (koordinator `DeviceHint`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DeviceHint {
    /// Only devices whose labels match are allocated.
    pub selector: Option<HintSelector>,
    /// Each allocated device must give the pod one free VF of a group whose labels match
    /// (RDMA/FPGA: koordinator's GPU allocator allocates no VFs).
    pub vf_selector: Option<HintSelector>,
    /// RDMA/FPGA (koordinator's `DefaultDeviceHandler`), unless the request is a multiple of
    /// whole devices: how many devices the request means.
    pub strategy: Option<AllocateStrategy>,
    /// GPUs: the narrowest topology scope (level) the GPUs must share; `Some(0)` for a scope
    /// name koordinator does not know (required, yet any scope qualifies).
    pub required_scope_level: Option<u8>,
    pub exclusive: Option<ExclusivePolicy>,
}

/// `allocateStrategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocateStrategy {
    /// Every device of the type (that the selector matches), each with the pod's request.
    ApplyForAll,
    /// The request's quantity is the number of devices, 1 each (100 with `DeviceLevel`).
    RequestsAsCount,
}

/// `exclusivePolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExclusivePolicy {
    /// With `RequestsAsCount`: each device taken whole.
    DeviceLevel,
    /// Only devices on PCIe switches none of whose devices of the type is in use.
    PcieLevel,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HintJson {
    #[serde(default)]
    selector: Option<LabelSelector>,
    #[serde(default)]
    vf_selector: Option<LabelSelector>,
    #[serde(default)]
    allocate_strategy: Option<String>,
    #[serde(default)]
    required_topology_scope: Option<String>,
    #[serde(default)]
    exclusive_policy: Option<String>,
}

/// `scheduling.koordinator.sh/device-allocate-hint` → the hints by device type (koordinator
/// `GetDeviceAllocateHints`).
fn parse_hints(raw: &str) -> Result<BTreeMap<DeviceType, DeviceHint>, DeviceRequestError> {
    if raw.trim().is_empty() {
        return Ok(BTreeMap::new());
    }
    let parsed: Option<BTreeMap<String, Option<HintJson>>> =
        serde_json::from_str(raw).map_err(|e| DeviceRequestError::InvalidAnnotation {
            key: DEVICE_ALLOCATE_HINT,
            reason: e.to_string(),
        })?;
    let mut out = BTreeMap::new();
    for (t, hint) in parsed.into_iter().flatten() {
        let Some(hint) = hint else { continue };
        // Unknown strategy and policy strings change nothing, as in koordinator's switches.
        let strategy = match hint.allocate_strategy.as_deref() {
            Some("ApplyForAll") => Some(AllocateStrategy::ApplyForAll),
            Some("RequestsAsCount") => Some(AllocateStrategy::RequestsAsCount),
            _ => None,
        };
        let exclusive = match hint.exclusive_policy.as_deref() {
            Some("DeviceLevel") => Some(ExclusivePolicy::DeviceLevel),
            Some("PCIeLevel") => Some(ExclusivePolicy::PcieLevel),
            _ => None,
        };
        // koordinator's `DeviceTopologyScopeLevel` (an unknown name reads as level 0).
        let required_scope_level = match hint.required_topology_scope.as_deref() {
            None | Some("") => None,
            Some("Device") => Some(4),
            Some("PCIe") => Some(3),
            Some("NUMANode") => Some(2),
            Some("Node") => Some(1),
            Some(_) => Some(0),
        };
        let device_type: DeviceType = serde_json::from_value(serde_json::Value::String(t.clone()))
            .map_err(|e| DeviceRequestError::InvalidAnnotation {
                key: DEVICE_ALLOCATE_HINT,
                reason: format!("device type {t:?}: {e}"),
            })?;
        let selector = hint
            .selector
            .map(|v| HintSelector::parse(&format!("{t}.selector"), v))
            .transpose()?;
        let vf_selector = hint
            .vf_selector
            .map(|v| HintSelector::parse(&format!("{t}.vfSelector"), v))
            .transpose()?;
        out.insert(
            device_type,
            DeviceHint {
                selector,
                vf_selector,
                strategy,
                required_scope_level,
                exclusive,
            },
        );
    }
    Ok(out)
}

fn parse_percentage_device(
    name: &str,
    q: Quantity,
) -> Result<DeviceTypeRequest, DeviceRequestError> {
    let v = units(q);
    check_percentage(name, v)?;
    // DefaultDeviceHandler: whole devices split into 100s, otherwise one device as given.
    let (count, per) = if v > 100 && v % 100 == 0 {
        (v / 100, 100)
    } else {
        (1, v)
    };
    Ok(DeviceTypeRequest {
        total: DeviceResources::from([(name.to_string(), Quantity::from_units(v))]),
        per_device: DeviceResources::from([(name.to_string(), Quantity::from_units(per))]),
        count: count as usize,
        shared: per < 100,
    })
}

fn parse_gpu(
    requests: &BTreeMap<String, Quantity>,
) -> Result<Option<DeviceTypeRequest>, DeviceRequestError> {
    let present: BTreeSet<&str> = GPU_NAMES
        .iter()
        .copied()
        .filter(|n| requests.contains_key(*n))
        .collect();
    if present.is_empty() {
        return Ok(None);
    }
    let npu: Vec<String> = NPU_NAMES
        .iter()
        .filter(|n| present.contains(**n))
        .map(|n| n.to_string())
        .collect();
    if !npu.is_empty() {
        return Err(DeviceRequestError::Unsupported {
            resources: npu,
            reason: "Huawei NPU sharing (vNPU templates) is not supported by this scheduler",
        });
    }
    let v = |name: &str| requests.get(name).map(|q| units(*q));
    if let Some(kg) = v(KOORD_GPU) {
        check_percentage(KOORD_GPU, kg)?;
    }
    let has = |n: &str| present.contains(n);
    let names: Vec<String> = present.iter().map(|s| s.to_string()).collect();
    let illegal = |hint| DeviceRequestError::IllegalCombination {
        resources: names.clone(),
        hint,
    };

    let mut total = DeviceResources::new();
    let whole: Vec<&str> = WHOLE_GPU_NAMES.iter().copied().filter(|n| has(n)).collect();
    if !whole.is_empty() {
        if present.len() != 1 {
            return Err(illegal(Some(
                "whole-GPU counts cannot be combined with other GPU resources",
            )));
        }
        let n = v(whole[0]).unwrap_or(0);
        if n > MAX_DEVICES_PER_TYPE {
            return Err(invalid(
                whole[0],
                n,
                format!("asks for more than {MAX_DEVICES_PER_TYPE} devices"),
            ));
        }
        total.insert(GPU_CORE.into(), Quantity::from_units(n * 100));
        total.insert(GPU_MEMORY_RATIO.into(), Quantity::from_units(n * 100));
    } else if has(KOORD_GPU) {
        if present.len() != 1 {
            return Err(illegal(Some(
                "koordinator.sh/gpu cannot be combined with other GPU resources",
            )));
        }
        let kg = v(KOORD_GPU).unwrap_or(0);
        total.insert(GPU_CORE.into(), Quantity::from_units(kg));
        total.insert(GPU_MEMORY_RATIO.into(), Quantity::from_units(kg));
    } else {
        if has(GPU_MEMORY) && has(GPU_MEMORY_RATIO) {
            return Err(illegal(Some(
                "request gpu-memory or gpu-memory-ratio, not both",
            )));
        }
        if !has(GPU_MEMORY) && !has(GPU_MEMORY_RATIO) {
            return Err(illegal(Some(
                "GPU requests need koordinator.sh/gpu-memory or koordinator.sh/gpu-memory-ratio",
            )));
        }
        let core = v(GPU_CORE);
        let ratio = v(GPU_MEMORY_RATIO);
        if let Some(shared) = v(GPU_SHARED) {
            if shared > MAX_DEVICES_PER_TYPE {
                return Err(invalid(
                    GPU_SHARED,
                    shared,
                    format!("asks for more than {MAX_DEVICES_PER_TYPE} devices"),
                ));
            }
            for (name, value) in [(GPU_CORE, core), (GPU_MEMORY_RATIO, ratio)] {
                if let Some(x) = value {
                    if x % shared != 0 {
                        return Err(invalid(
                            name,
                            x,
                            format!("must be a multiple of {GPU_SHARED}={shared}"),
                        ));
                    }
                    if x > 100 * shared {
                        return Err(invalid(
                            name,
                            x,
                            format!("must be <= 100 x {GPU_SHARED}={shared}"),
                        ));
                    }
                }
            }
        } else {
            for (name, value) in [(GPU_CORE, core), (GPU_MEMORY_RATIO, ratio)] {
                if let Some(x) = value {
                    check_percentage(name, x)?;
                }
            }
        }
        for name in [GPU_SHARED, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO] {
            if let Some(q) = requests.get(name) {
                total.insert(name.into(), Quantity::from_units(units(*q)));
            }
        }
    }
    Ok(Some(split_gpu(total)))
}

/// `calcDesiredRequestsAndCountForGPU`: spread over `gpu.shared` cards, or over whole cards when
/// the ratio is a multiple of 100; integer division drops remainders, as koordinator does.
fn split_gpu(total: DeviceResources) -> DeviceTypeRequest {
    let get = |n: &str| total.get(n).map(|q| q.value());
    let shared_n = get(GPU_SHARED).filter(|s| *s > 0);
    let count = match (shared_n, get(GPU_MEMORY_RATIO)) {
        (Some(s), _) => s,
        (None, Some(r)) if r > 100 && r % 100 == 0 => r / 100,
        _ => 1,
    };
    let per_device: DeviceResources = total
        .iter()
        .filter(|(n, _)| n.as_str() != GPU_SHARED)
        .map(|(n, q)| (n.clone(), Quantity::from_units(q.value() / count)))
        .collect();
    let per_ratio = per_device.get(GPU_MEMORY_RATIO).map(|q| q.value());
    let shared = match per_ratio {
        Some(r) => r < 100,
        None => per_device.contains_key(GPU_MEMORY),
    };
    DeviceTypeRequest {
        total,
        per_device,
        count: count as usize,
        shared,
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JointAnnotation {
    #[serde(default)]
    device_types: Vec<String>,
    #[serde(default)]
    required_scope: String,
}

fn parse_annotations(
    annotations: Option<&BTreeMap<String, String>>,
    types: &BTreeMap<DeviceType, DeviceTypeRequest>,
) -> Result<Option<JointAllocate>, DeviceRequestError> {
    let Some(ann) = annotations else {
        return Ok(None);
    };
    let Some(raw) = ann.get(DEVICE_JOINT_ALLOCATE) else {
        return Ok(None);
    };
    if raw.trim().is_empty() {
        return Ok(None);
    }
    let parsed: JointAnnotation =
        serde_json::from_str(raw).map_err(|e| DeviceRequestError::InvalidAnnotation {
            key: DEVICE_JOINT_ALLOCATE,
            reason: e.to_string(),
        })?;
    let required_scope = match parsed.required_scope.as_str() {
        "" => None,
        "SamePCIe" => Some(JointScope::SamePcie),
        other => {
            return Err(DeviceRequestError::InvalidAnnotation {
                key: DEVICE_JOINT_ALLOCATE,
                reason: format!("requiredScope {other:?} is not supported (only \"SamePCIe\")"),
            });
        }
    };
    let mut device_types = Vec::new();
    for name in &parsed.device_types {
        let t = DeviceType::parse(name);
        if !t.is_known() {
            return Err(DeviceRequestError::InvalidAnnotation {
                key: DEVICE_JOINT_ALLOCATE,
                reason: format!("unknown device type {name:?} (expected gpu, rdma or fpga)"),
            });
        }
        // Types the pod does not request are dropped, as koordinator does.
        if types.contains_key(&t) && !device_types.contains(&t) {
            device_types.push(t);
        }
    }
    if device_types.len() < 2 {
        return Ok(None);
    }
    Ok(Some(JointAllocate {
        device_types,
        required_scope,
    }))
}

impl fmt::Display for JointScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SamePCIe")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reqs(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity::parse(v).unwrap()))
            .collect()
    }
    fn res(pairs: &[(&str, &str)]) -> DeviceResources {
        reqs(pairs)
    }
    fn gpu(pairs: &[(&str, &str)]) -> DeviceTypeRequest {
        parse_device_request(&reqs(pairs), None)
            .unwrap()
            .unwrap()
            .types
            .remove(&DeviceType::Gpu)
            .unwrap()
    }

    #[test]
    fn legal_combinations_normalise_as_koordinator() {
        struct Case {
            input: &'static [(&'static str, &'static str)],
            total: &'static [(&'static str, &'static str)],
            per: &'static [(&'static str, &'static str)],
            count: usize,
            shared: bool,
        }
        let cases = [
            Case {
                input: &[(NVIDIA_GPU, "2")],
                total: &[(GPU_CORE, "200"), (GPU_MEMORY_RATIO, "200")],
                per: &[(GPU_CORE, "100"), (GPU_MEMORY_RATIO, "100")],
                count: 2,
                shared: false,
            },
            Case {
                input: &[(AMD_GPU, "1")],
                total: &[(GPU_CORE, "100"), (GPU_MEMORY_RATIO, "100")],
                per: &[(GPU_CORE, "100"), (GPU_MEMORY_RATIO, "100")],
                count: 1,
                shared: false,
            },
            Case {
                input: &[(HYGON_DCU, "3")],
                total: &[(GPU_CORE, "300"), (GPU_MEMORY_RATIO, "300")],
                per: &[(GPU_CORE, "100"), (GPU_MEMORY_RATIO, "100")],
                count: 3,
                shared: false,
            },
            Case {
                input: &[(KOORD_GPU, "50")],
                total: &[(GPU_CORE, "50"), (GPU_MEMORY_RATIO, "50")],
                per: &[(GPU_CORE, "50"), (GPU_MEMORY_RATIO, "50")],
                count: 1,
                shared: true,
            },
            Case {
                input: &[(KOORD_GPU, "200")],
                total: &[(GPU_CORE, "200"), (GPU_MEMORY_RATIO, "200")],
                per: &[(GPU_CORE, "100"), (GPU_MEMORY_RATIO, "100")],
                count: 2,
                shared: false,
            },
            Case {
                input: &[(GPU_MEMORY, "160Gi")],
                total: &[(GPU_MEMORY, "160Gi")],
                per: &[(GPU_MEMORY, "160Gi")],
                count: 1,
                shared: true,
            },
            Case {
                input: &[(GPU_MEMORY_RATIO, "50")],
                total: &[(GPU_MEMORY_RATIO, "50")],
                per: &[(GPU_MEMORY_RATIO, "50")],
                count: 1,
                shared: true,
            },
            Case {
                input: &[(GPU_MEMORY_RATIO, "300")],
                total: &[(GPU_MEMORY_RATIO, "300")],
                per: &[(GPU_MEMORY_RATIO, "100")],
                count: 3,
                shared: false,
            },
            Case {
                input: &[(GPU_CORE, "50"), (GPU_MEMORY, "8Gi")],
                total: &[(GPU_CORE, "50"), (GPU_MEMORY, "8Gi")],
                per: &[(GPU_CORE, "50"), (GPU_MEMORY, "8Gi")],
                count: 1,
                shared: true,
            },
            Case {
                input: &[(GPU_CORE, "30"), (GPU_MEMORY_RATIO, "40")],
                total: &[(GPU_CORE, "30"), (GPU_MEMORY_RATIO, "40")],
                per: &[(GPU_CORE, "30"), (GPU_MEMORY_RATIO, "40")],
                count: 1,
                shared: true,
            },
            Case {
                input: &[(GPU_CORE, "200"), (GPU_MEMORY_RATIO, "200")],
                total: &[(GPU_CORE, "200"), (GPU_MEMORY_RATIO, "200")],
                per: &[(GPU_CORE, "100"), (GPU_MEMORY_RATIO, "100")],
                count: 2,
                shared: false,
            },
            Case {
                input: &[(GPU_SHARED, "4"), (GPU_MEMORY, "160Gi")],
                total: &[(GPU_SHARED, "4"), (GPU_MEMORY, "160Gi")],
                per: &[(GPU_MEMORY, "40Gi")],
                count: 4,
                shared: true,
            },
            Case {
                input: &[(GPU_SHARED, "2"), (GPU_MEMORY_RATIO, "100")],
                total: &[(GPU_SHARED, "2"), (GPU_MEMORY_RATIO, "100")],
                per: &[(GPU_MEMORY_RATIO, "50")],
                count: 2,
                shared: true,
            },
            Case {
                input: &[(GPU_SHARED, "2"), (GPU_CORE, "60"), (GPU_MEMORY, "10Gi")],
                total: &[(GPU_SHARED, "2"), (GPU_CORE, "60"), (GPU_MEMORY, "10Gi")],
                per: &[(GPU_CORE, "30"), (GPU_MEMORY, "5Gi")],
                count: 2,
                shared: true,
            },
            Case {
                input: &[
                    (GPU_SHARED, "2"),
                    (GPU_CORE, "200"),
                    (GPU_MEMORY_RATIO, "200"),
                ],
                total: &[
                    (GPU_SHARED, "2"),
                    (GPU_CORE, "200"),
                    (GPU_MEMORY_RATIO, "200"),
                ],
                per: &[(GPU_CORE, "100"), (GPU_MEMORY_RATIO, "100")],
                count: 2,
                shared: false,
            },
            Case {
                input: &[(GPU_SHARED, "1"), (GPU_MEMORY_RATIO, "30")],
                total: &[(GPU_SHARED, "1"), (GPU_MEMORY_RATIO, "30")],
                per: &[(GPU_MEMORY_RATIO, "30")],
                count: 1,
                shared: true,
            },
            // Integer division drops the remainder (3 bytes over 2 cards -> 1 byte each).
            Case {
                input: &[(GPU_SHARED, "2"), (GPU_MEMORY, "3")],
                total: &[(GPU_SHARED, "2"), (GPU_MEMORY, "3")],
                per: &[(GPU_MEMORY, "1")],
                count: 2,
                shared: true,
            },
            // Deprecated names are mapped first.
            Case {
                input: &[
                    ("kubernetes.io/gpu-core", "100"),
                    ("kubernetes.io/gpu-memory-ratio", "100"),
                ],
                total: &[(GPU_CORE, "100"), (GPU_MEMORY_RATIO, "100")],
                per: &[(GPU_CORE, "100"), (GPU_MEMORY_RATIO, "100")],
                count: 1,
                shared: false,
            },
        ];
        for c in cases {
            let g = gpu(c.input);
            assert_eq!(g.total, res(c.total), "{:?}", c.input);
            assert_eq!(g.per_device, res(c.per), "{:?}", c.input);
            assert_eq!(g.count, c.count, "{:?}", c.input);
            assert_eq!(g.shared, c.shared, "{:?}", c.input);
        }
    }

    #[test]
    fn rdma_and_fpga_split() {
        let r = parse_device_request(&reqs(&[(RDMA, "1"), (FPGA, "200"), ("cpu", "4")]), None)
            .unwrap()
            .unwrap();
        let rd = &r.types[&DeviceType::Rdma];
        assert_eq!((rd.count, rd.per_device.clone()), (1, res(&[(RDMA, "1")])));
        let fp = &r.types[&DeviceType::Fpga];
        assert_eq!(
            (fp.count, fp.per_device.clone()),
            (2, res(&[(FPGA, "100")]))
        );
        let kr = parse_device_request(&reqs(&[("kubernetes.io/rdma", "100")]), None)
            .unwrap()
            .unwrap();
        assert_eq!(kr.types[&DeviceType::Rdma].count, 1);
    }

    #[test]
    fn no_device_names_means_none() {
        assert_eq!(
            parse_device_request(&reqs(&[("cpu", "1"), ("memory", "1Gi")]), None),
            Ok(None)
        );
        assert_eq!(
            parse_device_request(&reqs(&[(NVIDIA_GPU, "0")]), None),
            Ok(None)
        );
    }

    #[test]
    fn illegal_requests_name_the_resource() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                &[(GPU_MEMORY_RATIO, "150")],
                &["koordinator.sh/gpu-memory-ratio=150 must be <= 100 or a multiple of 100"],
            ),
            (&[(GPU_CORE, "50")], &[GPU_CORE, "not a legal combination"]),
            (
                &[(GPU_MEMORY, "1Gi"), (GPU_MEMORY_RATIO, "50")],
                &[GPU_MEMORY, GPU_MEMORY_RATIO],
            ),
            (
                &[(NVIDIA_GPU, "1"), (GPU_MEMORY, "1Gi")],
                &[NVIDIA_GPU, GPU_MEMORY],
            ),
            (&[(NVIDIA_GPU, "1"), (AMD_GPU, "1")], &[NVIDIA_GPU, AMD_GPU]),
            (
                &[(KOORD_GPU, "50"), (GPU_CORE, "50")],
                &[KOORD_GPU, GPU_CORE],
            ),
            (&[(KOORD_GPU, "150")], &["koordinator.sh/gpu=150"]),
            (
                &[(KOORD_GPU, "50"), (GPU_SHARED, "1")],
                &[KOORD_GPU, GPU_SHARED],
            ),
            (
                &[(GPU_SHARED, "2")],
                &[GPU_SHARED, "not a legal combination"],
            ),
            (
                &[(GPU_SHARED, "2"), (GPU_CORE, "60")],
                &[GPU_SHARED, GPU_CORE],
            ),
            (
                &[(GPU_SHARED, "2"), (GPU_MEMORY_RATIO, "75")],
                &[
                    "koordinator.sh/gpu-memory-ratio=75 must be a multiple of koordinator.sh/gpu.shared=2",
                ],
            ),
            (
                &[(GPU_SHARED, "2"), (GPU_MEMORY_RATIO, "300")],
                &["gpu-memory-ratio=300 must be <= 100 x"],
            ),
            (
                &[(GPU_CORE, "150"), (GPU_MEMORY, "1Gi")],
                &["koordinator.sh/gpu-core=150"],
            ),
            (
                &[(GPU_CORE, "50"), (GPU_MEMORY_RATIO, "250")],
                &["koordinator.sh/gpu-memory-ratio=250"],
            ),
            (&[(RDMA, "150")], &["koordinator.sh/rdma=150"]),
            (&[(FPGA, "101")], &["koordinator.sh/fpga=101"]),
            (
                &[(HUAWEI_NPU_CORE, "8"), (GPU_MEMORY_RATIO, "50")],
                &["unsupported", HUAWEI_NPU_CORE, "Huawei"],
            ),
            (
                &[
                    (GPU_SHARED, "1"),
                    (HUAWEI_NPU_CORE, "8"),
                    (HUAWEI_NPU_CPU, "1"),
                    (GPU_MEMORY, "1Gi"),
                ],
                &[HUAWEI_NPU_CORE, HUAWEI_NPU_CPU],
            ),
            (
                &[(NVIDIA_GPU, "100000")],
                &["nvidia.com/gpu=100000", "more than 1024"],
            ),
            (
                &[(NVIDIA_GPU, "-1")],
                &["nvidia.com/gpu=-1 must not be negative"],
            ),
        ];
        for (input, needles) in cases {
            let err = parse_device_request(&reqs(input), None)
                .unwrap_err()
                .to_string();
            for n in *needles {
                assert!(err.contains(n), "{input:?}: {err:?} lacks {n:?}");
            }
        }
    }

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn joint_allocation_annotation() {
        let r = reqs(&[(NVIDIA_GPU, "2"), (RDMA, "1")]);
        let a = ann(&[(
            DEVICE_JOINT_ALLOCATE,
            r#"{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}"#,
        )]);
        let p = parse_device_request(&r, Some(&a)).unwrap().unwrap();
        assert_eq!(
            p.joint,
            Some(JointAllocate {
                device_types: vec![DeviceType::Gpu, DeviceType::Rdma],
                required_scope: Some(JointScope::SamePcie)
            })
        );
        // Types without requests are dropped; one remaining type means no joint allocation.
        let a = ann(&[(DEVICE_JOINT_ALLOCATE, r#"{"deviceTypes":["gpu","fpga"]}"#)]);
        assert_eq!(
            parse_device_request(&r, Some(&a)).unwrap().unwrap().joint,
            None
        );
        for (bad, needle) in [
            (
                r#"{"deviceTypes":["gpu","rdma"],"requiredScope":"SameNUMA"}"#,
                "SameNUMA",
            ),
            (r#"{"deviceTypes":["gpu","npu"]}"#, "\"npu\""),
            ("not json", DEVICE_JOINT_ALLOCATE),
        ] {
            let e = parse_device_request(&r, Some(&ann(&[(DEVICE_JOINT_ALLOCATE, bad)])))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn hints_and_partition_spec_are_read_and_bad_selectors_refused() {
        let r = reqs(&[(NVIDIA_GPU, "1")]);
        let hinted =
            |hint: &str| parse_device_request(&r, Some(&ann(&[(DEVICE_ALLOCATE_HINT, hint)])));
        let ok = hinted(
            r#"{"rdma":{"vfSelector":{}},"gpu":{"selector":{"matchLabels":{"model":"H100"},
                "matchExpressions":[{"key":"zone","operator":"NotIn","values":["a"]}]}}}"#,
        )
        .unwrap()
        .unwrap();
        let rdma = &ok.hints[&DeviceType::Rdma];
        assert!(rdma.selector.is_none());
        let vf = rdma.vf_selector.as_ref().expect("vfSelector");
        assert!(
            vf.matches(&BTreeMap::new()),
            "an empty selector matches everything"
        );
        let gpu = ok.hints[&DeviceType::Gpu]
            .selector
            .as_ref()
            .expect("selector");
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(gpu.matches(&labels(&[("model", "H100")])));
        assert!(gpu.matches(&labels(&[("model", "H100"), ("zone", "b")])));
        assert!(!gpu.matches(&labels(&[("model", "H100"), ("zone", "a")])));
        assert!(!gpu.matches(&labels(&[("model", "A100")])));
        let all = hinted(
            r#"{"rdma":{"allocateStrategy":"RequestsAsCount","exclusivePolicy":"DeviceLevel"},
                "gpu":{"requiredTopologyScope":"PCIe"},"fpga":{"allocateStrategy":"Other"}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            all.hints[&DeviceType::Rdma].strategy,
            Some(AllocateStrategy::RequestsAsCount)
        );
        assert_eq!(
            all.hints[&DeviceType::Rdma].exclusive,
            Some(ExclusivePolicy::DeviceLevel)
        );
        assert_eq!(all.hints[&DeviceType::Gpu].required_scope_level, Some(3));
        assert_eq!(
            all.hints[&DeviceType::Fpga].strategy,
            None,
            "unknown: no effect"
        );
        for (hint, needle) in [
            (
                r#"{"rdma":{"selector":{"matchExpressions":[{"key":"a","operator":"In"}]}}}"#,
                "can't be empty",
            ),
            (
                r#"{"rdma":{"selector":{"matchExpressions":[{"key":"a","operator":"Exists","values":["x"]}]}}}"#,
                "takes no values",
            ),
            (
                r#"{"rdma":{"selector":{"matchExpressions":[{"key":"a","operator":"Near","values":["x"]}]}}}"#,
                "operator",
            ),
            (r#"{"rdma":"#, "invalid annotation"),
        ] {
            let e = hinted(hint).unwrap_err().to_string();
            assert!(
                e.contains(DEVICE_ALLOCATE_HINT) && e.contains(needle),
                "{hint}: {e}"
            );
        }
        for empty in ["", "{}", "null", r#"{"rdma":null}"#] {
            assert!(
                hinted(empty).unwrap().unwrap().hints.is_empty(),
                "{empty:?}"
            );
        }
        let spec = parse_device_request(
            &r,
            Some(&ann(&[(
                GPU_PARTITION_SPEC,
                r#"{"allocatePolicy":"Restricted"}"#,
            )])),
        )
        .unwrap()
        .unwrap()
        .gpu_partition;
        assert!(spec.is_some_and(|s| s.restricted));
        let e = parse_device_request(&r, Some(&ann(&[(GPU_PARTITION_SPEC, "{")]))).unwrap_err();
        assert!(e.to_string().contains(GPU_PARTITION_SPEC), "{e}");
        // Only GPU requests read it (koordinator `parseGPURequirements`).
        let rdma = reqs(&[(RDMA, "100")]);
        let only_rdma = parse_device_request(&rdma, Some(&ann(&[(GPU_PARTITION_SPEC, "{")])));
        assert!(only_rdma.unwrap().unwrap().gpu_partition.is_none());
        assert!(parse_device_request(&r, Some(&ann(&[(DEVICE_ALLOCATE_HINT, "{}")]))).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_any_request(
            m in proptest::collection::btree_map(
                proptest::sample::select(GPU_NAMES.iter().chain([RDMA, FPGA, "cpu"].iter()).copied().collect::<Vec<_>>()),
                proptest::prop_oneof![-5i64..500, proptest::prelude::any::<i64>()],
                0..5,
            )
        ) {
            let r: BTreeMap<String, Quantity> =
                m.into_iter().map(|(k, v)| (k.to_string(), Quantity::from_units(v))).collect();
            if let Ok(Some(p)) = parse_device_request(&r, None) {
                for t in p.types.values() {
                    proptest::prop_assert!(t.count >= 1 && t.count <= MAX_DEVICES_PER_TYPE as usize);
                }
            }
        }
    }
}
