//! koordinator's device protocol: the `Device` CRD (`scheduling.koordinator.sh/v1alpha1`), the
//! deprecated-name mapping (over the name table of `super::resource_names`, which owns the
//! device resource names; they are re-exported here), and the `device-allocated` pod annotation.
//!
//! This module owns the wire shapes only: decoding, strict annotation parsing and byte-stable
//! annotation rendering that koordlet reads unchanged. It holds no state, performs no I/O and
//! makes no placement decisions (those live in `placement::device`).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::pod::ResourceList;
use super::quantity::Quantity;

/// Pod annotation carrying the allocation result; koordlet reads `minor` and `resources`.
pub const DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";
/// Pod annotation asking for joint allocation of several device types (e.g. GPU + RDMA).
pub const DEVICE_JOINT_ALLOCATE: &str = "scheduling.koordinator.sh/device-joint-allocate";
/// Pod annotation with per-type allocation hints (selectors, strategies, VFs). Not supported.
pub const DEVICE_ALLOCATE_HINT: &str = "scheduling.koordinator.sh/device-allocate-hint";
/// Pod annotation asking to honor GPU partition tables (see [`super::gpu_partition`]).
pub use super::gpu_partition::GPU_PARTITION_SPEC;

/// The device resource names are the name table's (`super::resource_names`, which owns them).
pub use super::resource_names::{
    AMD_GPU, FPGA, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU_SHARED, HUAWEI_NPU_CORE,
    HUAWEI_NPU_CPU, HUAWEI_NPU_DVPP, HYGON_DCU, KOORD_GPU, NVIDIA_GPU, RDMA,
};

/// The current name for a (possibly deprecated) device resource name (koordinator's informer
/// transformers rename them before anything reads them); from [`super::resource_names`]'s table.
pub fn canonical_resource_name(name: &str) -> &str {
    match super::resource_names::managed(name) {
        Some((_, r)) => r.canonical,
        None => name,
    }
}

/// Renames deprecated device resource names in a resource map. When both the deprecated and the
/// current name are present the current name wins, so an explicit new-style value is never
/// overwritten by a leftover old one (koordinator's map iteration order makes this random).
pub fn canonicalize_resource_names<V>(list: BTreeMap<String, V>) -> BTreeMap<String, V> {
    if !list
        .keys()
        .any(|k| canonical_resource_name(k) != k.as_str())
    {
        return list;
    }
    let mut out = BTreeMap::new();
    let mut deprecated = Vec::new();
    for (k, v) in list {
        let canonical = canonical_resource_name(&k);
        if canonical == k {
            out.insert(k, v);
        } else {
            deprecated.push((canonical.to_string(), v));
        }
    }
    for (k, v) in deprecated {
        out.entry(k).or_insert(v);
    }
    out
}

/// Exact device resources of one device or one allocation: name -> quantity.
pub type DeviceResources = BTreeMap<String, Quantity>;

/// `spec.devices[].type`. Unknown types are kept (so their allocations can be shown) but never
/// placed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    Gpu,
    Rdma,
    Fpga,
    Other(String),
}

impl DeviceType {
    pub fn parse(s: &str) -> Self {
        match s {
            "gpu" => DeviceType::Gpu,
            "rdma" => DeviceType::Rdma,
            "fpga" => DeviceType::Fpga,
            other => DeviceType::Other(other.to_string()),
        }
    }
    pub fn as_str(&self) -> &str {
        match self {
            DeviceType::Gpu => "gpu",
            DeviceType::Rdma => "rdma",
            DeviceType::Fpga => "fpga",
            DeviceType::Other(s) => s,
        }
    }
    /// Types this service places; `Other` types are only accounted.
    pub fn is_known(&self) -> bool {
        !matches!(self, DeviceType::Other(_))
    }
}

// Ordered by the wire string so maps keyed by type serialize with sorted keys, as Go does.
impl Ord for DeviceType {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}
impl PartialOrd for DeviceType {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
impl Serialize for DeviceType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}
impl<'de> Deserialize<'de> for DeviceType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(DeviceType::parse(&s))
    }
}

/// The `Device` custom resource; one per node, named after the node, cluster-scoped.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Device {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: DeviceSpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct DeviceSpec {
    #[serde(default)]
    pub devices: Vec<DeviceInfo>,
}

/// One device entry. Fields the scheduler never reads (`conditions`, `status`) are not decoded.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInfo {
    /// A missing type decodes as `Other("")` so one bad entry cannot fail the whole object.
    #[serde(rename = "type", default = "unknown_type")]
    pub device_type: DeviceType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// The device UUID (Go field `UUID`, JSON `id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Koordinator dereferences this without a nil check; we report a missing one instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i32>,
    #[serde(default, rename = "moduleID", skip_serializing_if = "Option::is_none")]
    pub module_id: Option<i32>,
    #[serde(default)]
    pub health: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceList>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<DeviceTopology>,
    /// SR-IOV VF groups: decoded so the object round-trips, but VFs are not allocated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vf_groups: Vec<VirtualFunctionGroup>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct DeviceTopology {
    #[serde(default, rename = "socketID")]
    pub socket_id: i32,
    /// NUMA node; -1 means unknown.
    #[serde(default, rename = "nodeID")]
    pub node_id: i32,
    /// PCIe switch; unique across NUMA nodes.
    #[serde(default, rename = "pcieID")]
    pub pcie_id: String,
    #[serde(default, rename = "busID", skip_serializing_if = "String::is_empty")]
    pub bus_id: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct VirtualFunctionGroup {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vfs: Vec<VirtualFunction>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct VirtualFunction {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i32>,
    #[serde(default, rename = "busID")]
    pub bus_id: String,
}

fn unknown_type() -> DeviceType {
    DeviceType::Other(String::new())
}

static_resource!(
    Device,
    kind = "Device",
    group = "scheduling.koordinator.sh",
    version = "v1alpha1",
    plural = "devices",
    scope = kube::core::ClusterResourceScope
);

/// One entry of the `device-allocated` annotation. Field order is koordinator's (Go struct order),
/// which is what makes `to_annotation` byte-compatible.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceAllocation {
    pub minor: i32,
    #[serde(serialize_with = "serialize_resources")]
    pub resources: DeviceResources,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extension: Option<DeviceAllocationExtension>,
}

/// `extension`: VFs and Huawei template names. We never produce these, but keep them when
/// another scheduler wrote them so a parsed annotation round-trips.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct DeviceAllocationExtension {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vfs: Vec<VirtualFunction>,
    #[serde(
        default,
        rename = "gpuSharedResourceTemplate",
        skip_serializing_if = "String::is_empty"
    )]
    pub gpu_shared_resource_template: String,
}

impl DeviceAllocationExtension {
    fn is_empty(&self) -> bool {
        self.vfs.is_empty() && self.gpu_shared_resource_template.is_empty()
    }
}

/// The whole `device-allocated` annotation: device type -> entries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct DeviceAllocations(pub BTreeMap<DeviceType, Vec<DeviceAllocation>>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    #[error("{DEVICE_ALLOCATED} is empty")]
    Empty,
    #[error("{DEVICE_ALLOCATED} is not valid JSON: {0}")]
    Json(String),
    #[error("{DEVICE_ALLOCATED} must be a JSON object of device type -> list, got {0}")]
    NotAnObject(&'static str),
    #[error("{DEVICE_ALLOCATED}: {device_type} must be a list of allocations, got {found}")]
    NotAList {
        device_type: String,
        found: &'static str,
    },
    #[error("{DEVICE_ALLOCATED}: {device_type}[{index}]: {problem}")]
    Entry {
        device_type: String,
        index: usize,
        problem: String,
    },
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

impl DeviceAllocations {
    pub fn is_empty(&self) -> bool {
        self.0.values().all(Vec::is_empty)
    }

    /// Parses the annotation strictly: every entry needs a non-negative integer `minor` and a
    /// `resources` object of valid quantities. Deprecated resource names are renamed. `null`
    /// is accepted as "no allocations" because Go marshals a nil map that way.
    pub fn parse_annotation(s: &str) -> Result<Self, AnnotationError> {
        if s.trim().is_empty() {
            return Err(AnnotationError::Empty);
        }
        let value: serde_json::Value =
            serde_json::from_str(s).map_err(|e| AnnotationError::Json(e.to_string()))?;
        let map = match value {
            serde_json::Value::Null => return Ok(Self::default()),
            serde_json::Value::Object(m) => m,
            other => return Err(AnnotationError::NotAnObject(json_kind(&other))),
        };
        let mut out = BTreeMap::new();
        for (type_name, entries) in map {
            let list = match entries {
                serde_json::Value::Array(l) => l,
                // Go unmarshals a null slice as empty.
                serde_json::Value::Null => Vec::new(),
                other => {
                    return Err(AnnotationError::NotAList {
                        device_type: type_name,
                        found: json_kind(&other),
                    });
                }
            };
            let mut parsed = Vec::with_capacity(list.len());
            for (index, entry) in list.into_iter().enumerate() {
                let alloc = parse_entry(entry).map_err(|problem| AnnotationError::Entry {
                    device_type: type_name.clone(),
                    index,
                    problem,
                })?;
                parsed.push(alloc);
            }
            out.insert(DeviceType::parse(&type_name), parsed);
        }
        Ok(DeviceAllocations(out))
    }

    /// Renders the annotation exactly as koordinator's Go code would shape it: keys sorted,
    /// fields in Go order, quantities as strings, empty `id`/`extension` omitted.
    pub fn to_annotation(&self) -> String {
        // Serializing BTreeMaps of strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

fn parse_entry(entry: serde_json::Value) -> Result<DeviceAllocation, String> {
    let mut obj = match entry {
        serde_json::Value::Object(o) => o,
        other => return Err(format!("expected an object, got {}", json_kind(&other))),
    };
    let minor = match obj.remove("minor") {
        None => return Err("missing \"minor\"".to_string()),
        Some(serde_json::Value::Number(n)) => n
            .as_i64()
            .and_then(|m| i32::try_from(m).ok())
            .filter(|m| *m >= 0)
            .ok_or_else(|| format!("\"minor\" must be a non-negative 32-bit integer, got {n}"))?,
        Some(other) => {
            return Err(format!(
                "\"minor\" must be an integer, got {}",
                json_kind(&other)
            ));
        }
    };
    let mut resources = BTreeMap::new();
    match obj.remove("resources") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(r)) => {
            for (name, q) in r {
                let text = match &q {
                    serde_json::Value::String(s) => s.clone(),
                    // apimachinery's Quantity also accepts a bare JSON number.
                    serde_json::Value::Number(n) => n.to_string(),
                    other => {
                        return Err(format!(
                            "resource {name:?} must be a quantity string, got {}",
                            json_kind(other)
                        ));
                    }
                };
                let quantity =
                    Quantity::parse(&text).map_err(|e| format!("resource {name:?}: {e}"))?;
                if quantity.milli() < 0 {
                    return Err(format!("resource {name:?} is negative ({text})"));
                }
                resources.insert(name, quantity);
            }
        }
        Some(other) => {
            return Err(format!(
                "\"resources\" must be an object, got {}",
                json_kind(&other)
            ));
        }
    }
    let id = match obj.remove("id") {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s,
        Some(other) => {
            return Err(format!(
                "\"id\" must be a string, got {}",
                json_kind(&other)
            ));
        }
    };
    let extension = match obj.remove("extension") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => {
            let ext: DeviceAllocationExtension = serde_json::from_value(v)
                .map_err(|e| format!("\"extension\" is malformed: {e}"))?;
            (!ext.is_empty()).then_some(ext)
        }
    };
    Ok(DeviceAllocation {
        minor,
        resources: canonicalize_resource_names(resources),
        id,
        extension,
    })
}

fn serialize_resources<S: Serializer>(r: &DeviceResources, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(r.len()))?;
    for (name, q) in r {
        let text = if name == GPU_MEMORY {
            format_bytes(*q)
        } else {
            q.to_string()
        };
        map.serialize_entry(name, &text)?;
    }
    map.end()
}

/// apimachinery's canonical BinarySI form: the largest power-of-1024 suffix that keeps the
/// number whole ("40Gi", "1536Mi"), plain bytes otherwise; below 1024 it is DecimalSI.
pub fn format_bytes(q: Quantity) -> String {
    if q.milli() % 1000 != 0 {
        return q.to_string();
    }
    let mut v = q.milli() / 1000;
    if v.abs() < 1024 {
        return if v != 0 && v % 1000 == 0 {
            format!("{}k", v / 1000)
        } else {
            v.to_string()
        };
    }
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut exp = 0;
    while exp < 6 && v % 1024 == 0 {
        v /= 1024;
        exp += 1;
    }
    format!("{v}{}", SUFFIXES[exp])
}

// Deserialize for `DeviceAllocations` goes through the strict parser so that every path that
// reads the annotation gets the same checks and messages.
impl<'de> Deserialize<'de> for DeviceAllocations {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        DeviceAllocations::parse_annotation(&v.to_string()).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn renders_koordinator_unit_test_form() {
        let mut res = DeviceResources::new();
        res.insert(GPU_CORE.into(), q("100"));
        res.insert(GPU_MEMORY.into(), q("16Gi"));
        res.insert(GPU_MEMORY_RATIO.into(), q("100"));
        let allocs = DeviceAllocations(BTreeMap::from([(
            DeviceType::Gpu,
            vec![DeviceAllocation {
                minor: 1,
                resources: res,
                id: String::new(),
                extension: None,
            }],
        )]));
        assert_eq!(
            allocs.to_annotation(),
            r#"{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"16Gi","koordinator.sh/gpu-memory-ratio":"100"}}]}"#
        );
    }

    #[test]
    fn renders_id_and_sorted_types() {
        let a = |minor, name: &str, v: &str, id: &str| DeviceAllocation {
            minor,
            resources: DeviceResources::from([(name.to_string(), q(v))]),
            id: id.into(),
            extension: None,
        };
        let allocs = DeviceAllocations(BTreeMap::from([
            (DeviceType::Rdma, vec![a(0, RDMA, "1", "0000:3d:00.0")]),
            (DeviceType::Gpu, vec![a(2, GPU_MEMORY, "40Gi", "GPU-x")]),
        ]));
        assert_eq!(
            allocs.to_annotation(),
            r#"{"gpu":[{"minor":2,"resources":{"koordinator.sh/gpu-memory":"40Gi"},"id":"GPU-x"}],"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"0000:3d:00.0"}]}"#
        );
    }

    #[test]
    fn bytes_format_is_canonical() {
        assert_eq!(format_bytes(q("40Gi")), "40Gi");
        assert_eq!(format_bytes(q("1536Mi")), "1536Mi");
        assert_eq!(format_bytes(q("28346784645")), "28346784645");
        assert_eq!(format_bytes(q("512")), "512");
        assert_eq!(format_bytes(q("1000")), "1k");
        assert_eq!(format_bytes(q("2048")), "2Ki");
    }

    #[test]
    fn parses_koordinator_examples_and_round_trips() {
        let s = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"80Gi","koordinator.sh/gpu-memory-ratio":"100"},"id":"GPU-1b2c"}],
 "rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"0000:3d:00.0","extension":{"vfs":[{"busID":"0000:3d:00.2"}]}}]}"#;
        let a = DeviceAllocations::parse_annotation(s).unwrap();
        assert_eq!(
            a.0[&DeviceType::Rdma][0]
                .extension
                .as_ref()
                .unwrap()
                .vfs
                .len(),
            1
        );
        let back = DeviceAllocations::parse_annotation(&a.to_annotation()).unwrap();
        assert_eq!(a, back);
    }

    #[test]
    fn maps_deprecated_names_in_annotations() {
        let a = DeviceAllocations::parse_annotation(
            r#"{"gpu":[{"minor":3,"resources":{"kubernetes.io/gpu-core":"50","kubernetes.io/gpu-memory-ratio":50}}]}"#,
        )
        .unwrap();
        let r = &a.0[&DeviceType::Gpu][0].resources;
        assert_eq!(r[GPU_CORE], q("50"));
        assert_eq!(r[GPU_MEMORY_RATIO], q("50"));
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn rejects_malformed_annotations_with_a_clear_reason() {
        let cases = [
            ("", "empty"),
            ("{", "not valid JSON"),
            ("[]", "JSON object"),
            (r#"{"gpu":{}}"#, "gpu must be a list"),
            (r#"{"gpu":[{"resources":{}}]}"#, "gpu[0]: missing \"minor\""),
            (r#"{"gpu":[{"minor":-1}]}"#, "non-negative"),
            (r#"{"gpu":[{"minor":"0"}]}"#, "must be an integer"),
            (
                r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"abc"}}]}"#,
                "koordinator.sh/gpu-core",
            ),
            (
                r#"{"gpu":[{"minor":0,"resources":[]}]}"#,
                "\"resources\" must be an object",
            ),
            (r#"{"gpu":[{"minor":0,"id":5}]}"#, "\"id\" must be a string"),
            (r#"{"rdma":[{"minor":0},7]}"#, "rdma[1]: expected an object"),
        ];
        for (input, needle) in cases {
            let err = DeviceAllocations::parse_annotation(input)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{input:?}: {err:?} lacks {needle:?}");
        }
        assert!(
            DeviceAllocations::parse_annotation("null")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn canonicalize_prefers_current_names() {
        let m = BTreeMap::from([
            ("kubernetes.io/gpu-core".to_string(), 1),
            (GPU_CORE.to_string(), 2),
            ("kubernetes.io/rdma".to_string(), 3),
            ("cpu".to_string(), 4),
        ]);
        let c = canonicalize_resource_names(m);
        assert_eq!(c[GPU_CORE], 2);
        assert_eq!(c[RDMA], 3);
        assert_eq!(c["cpu"], 4);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn decodes_device_object() {
        let y = serde_json::json!({
            "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
            "metadata": {"name": "n1"},
            "spec": {"devices": [
                {"type": "gpu", "id": "GPU-0", "minor": 0, "health": true, "moduleID": 1,
                 "resources": {"koordinator.sh/gpu-core": "100", "kubernetes.io/gpu-memory": "80Gi"},
                 "topology": {"socketID": -1, "nodeID": 0, "pcieID": "pci0000:3a", "busID": "0000:3b:00.0"},
                 "conditions": [{"type": "Healthy", "status": "True"}]},
                {"type": "xpu", "minor": 0, "health": true},
                {"type": "rdma", "minor": 0, "health": false,
                 "vfGroups": [{"labels": {"type": "general"}, "vfs": [{"minor": 0, "busID": "0000:3d:00.2"}]}]}
            ]}
        });
        let d: Device = serde_json::from_value(y).unwrap();
        assert_eq!(d.spec.devices.len(), 3);
        assert_eq!(d.spec.devices[0].device_type, DeviceType::Gpu);
        assert_eq!(
            d.spec.devices[0].topology.as_ref().unwrap().pcie_id,
            "pci0000:3a"
        );
        assert_eq!(
            d.spec.devices[1].device_type,
            DeviceType::Other("xpu".into())
        );
        assert_eq!(d.spec.devices[2].vf_groups[0].vfs.len(), 1);
        assert_eq!(<Device as kube::Resource>::plural(&()), "devices");
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn arb_alloc() -> impl Strategy<Value = DeviceAllocation> {
            (
                0i32..300,
                proptest::collection::btree_map(
                    prop_oneof![
                        Just(GPU_CORE.to_string()),
                        Just(GPU_MEMORY.to_string()),
                        Just(GPU_MEMORY_RATIO.to_string()),
                        Just(RDMA.to_string()),
                        Just("vendor.com/x".to_string()),
                    ],
                    (0i64..1 << 45).prop_map(Quantity::from_units),
                    0..4,
                ),
                "[a-zA-Z0-9-]{0,8}",
                proptest::option::of("[0-9:.]{1,12}"),
            )
                .prop_map(|(minor, resources, id, vf)| DeviceAllocation {
                    minor,
                    resources,
                    id,
                    extension: vf.map(|bus_id| DeviceAllocationExtension {
                        vfs: vec![VirtualFunction {
                            minor: None,
                            bus_id,
                        }],
                        gpu_shared_resource_template: String::new(),
                    }),
                })
        }

        proptest! {
            #[test]
            fn annotation_round_trips(
                m in proptest::collection::btree_map(
                    prop_oneof![Just(DeviceType::Gpu), Just(DeviceType::Rdma), Just(DeviceType::Fpga),
                        Just(DeviceType::Other("xpu".into()))],
                    proptest::collection::vec(arb_alloc(), 0..4),
                    0..4,
                )
            ) {
                let a = DeviceAllocations(m);
                let text = a.to_annotation();
                let back = DeviceAllocations::parse_annotation(&text).unwrap();
                prop_assert_eq!(&back, &a);
                prop_assert_eq!(back.to_annotation(), text);
            }

            #[test]
            fn parsing_never_panics(s in ".{0,200}") {
                let _ = DeviceAllocations::parse_annotation(&s);
            }

            #[test]
            fn parsing_json_shaped_input_never_panics(
                s in r#"\{"(gpu|rdma)":\[\{"minor":-?[0-9]{1,12},"resources":\{"[a-z./-]{1,20}":"?[0-9a-zA-Z.]{0,8}"?\}\}\]\}"#
            ) {
                let _ = DeviceAllocations::parse_annotation(&s);
            }
        }
    }
}
