//! Kubernetes' own device allocator (DRA, `resource.k8s.io/v1`) as this service reads it: the
//! slim `ResourceSlice`, `ResourceClaim` and `DeviceClass` types, and how a slice device names
//! the physical device behind it ([`DeviceIdentity`]), which is how it is joined to a
//! koordinator `Device` entry (`cluster::dra`).
//!
//! Only the fields the join and the counting read are decoded. This module owns no state,
//! decides nothing and performs no I/O.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// The API group and version every DRA kind is watched at (GA since Kubernetes 1.34).
pub const DRA_API_VERSION: &str = "resource.k8s.io/v1";

/// The annotation kube-scheduler puts on the claim it creates for a pod's extended resources
/// (KEP-5004), and the key under which that claim is named in the pod's status.
pub const EXTENDED_RESOURCE_CLAIM: &str = "resource.kubernetes.io/extended-resource-claim";

/// A DRA driver's devices in one pool, for one node (or several).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ResourceSlice {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ResourceSliceSpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub pool: ResourcePool,
    /// Set when every device of the slice is local to one node (the common case: GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Devices reachable from the nodes a selector picks (network-attached devices). Only its
    /// presence is read: such a device is joined by its UUID wherever a `Device` entry states
    /// it (`cluster::dra`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_nodes: Option<bool>,
    /// Each device names its own node (`devices[].nodeName`, `nodeSelector` or `allNodes`);
    /// the slice-level fields are unset (partitionable devices, KEP-4815, on by default since
    /// Kubernetes 1.36).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_device_node_selection: Option<bool>,
    #[serde(default)]
    pub devices: Vec<SliceDevice>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ResourcePool {
    #[serde(default)]
    pub name: String,
}

/// One device of a slice: its name in the pool, its attributes, and (with the slice's
/// `perDeviceNodeSelection`) which node or nodes it is on.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceDevice {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub attributes: BTreeMap<String, DeviceAttribute>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_nodes: Option<bool>,
}

/// One attribute value: exactly one of these is set on a valid slice.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct DeviceAttribute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// A request for devices, and (once kube-scheduler allocated it) which devices it holds.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ResourceClaim {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: ResourceClaimStatus,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationResult>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_for: Vec<ConsumerReference>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct AllocationResult {
    #[serde(default)]
    pub devices: DeviceAllocationResult,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct DeviceAllocationResult {
    #[serde(default)]
    pub results: Vec<DeviceRequestAllocationResult>,
}

/// One allocated device: `(driver, pool, device)` names it in the slices. `shareID` and
/// `consumedCapacity` (consumable capacity, KEP-5075) are not read: a shared device is counted
/// as wholly held, which is never less than what the claim holds.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRequestAllocationResult {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub device: String,
    /// Administrative access (monitoring, diagnostics; GA in 1.36, only in namespaces labelled
    /// `resource.kubernetes.io/admin-access`): kube-scheduler's allocator does not count such
    /// a device as allocated (`allocateddevices.go`), so neither does the extender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_access: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ConsumerReference {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub name: String,
}

/// A class of devices; one with `extendedResourceName` lets kube-scheduler satisfy that plain
/// resource request from DRA on nodes that do not advertise it (KEP-5004).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct DeviceClass {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: DeviceClassSpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClassSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended_resource_name: Option<String>,
}

/// A taint on the devices a selector picks; with effect `NoSchedule` the DRA allocator never
/// picks them for a claim that does not tolerate it. The extender keeps DRA off the devices it
/// hands out with one such rule per driver pool (`scheduler::dra_owner`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct DeviceTaintRule {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: DeviceTaintRuleSpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTaintRuleSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_selector: Option<DeviceTaintSelector>,
    #[serde(default)]
    pub taint: DeviceTaint,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct DeviceTaintSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct DeviceTaint {
    #[serde(default)]
    pub key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    #[serde(default)]
    pub effect: String,
}

/// The taint key of the extender's rules.
pub const OWNED_TAINT_KEY: &str = "device-numa-extender.io/owned";
/// The label that marks a DeviceTaintRule as the extender's.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "device-numa-extender";
/// A Node label: `dra` hands the node's devices that DRA also publishes to DRA; anything
/// else (or none) leaves them the extender's.
pub const DEVICE_OWNER_LABEL: &str = "device-numa-extender.io/device-owner";

/// The versions DeviceTaintRule is served at, newest first: `v1` from Kubernetes 1.37,
/// `v1beta2` in 1.36 (gate `DRADeviceTaints`, on), `v1alpha3` from 1.33 (gate off). The fields
/// the extender reads and writes have one shape in all three.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TaintRuleVersion {
    #[default]
    V1,
    V1beta2,
    V1alpha3,
}

impl TaintRuleVersion {
    pub const ALL: [TaintRuleVersion; 3] = [
        TaintRuleVersion::V1,
        TaintRuleVersion::V1beta2,
        TaintRuleVersion::V1alpha3,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            TaintRuleVersion::V1 => "v1",
            TaintRuleVersion::V1beta2 => "v1beta2",
            TaintRuleVersion::V1alpha3 => "v1alpha3",
        }
    }
    pub fn api_version(self) -> String {
        format!("resource.k8s.io/{}", self.as_str())
    }
}

impl kube::Resource for DeviceTaintRule {
    type DynamicType = TaintRuleVersion;
    type Scope = kube::core::ClusterResourceScope;

    fn kind(_: &TaintRuleVersion) -> std::borrow::Cow<'_, str> {
        "DeviceTaintRule".into()
    }
    fn group(_: &TaintRuleVersion) -> std::borrow::Cow<'_, str> {
        "resource.k8s.io".into()
    }
    fn version(v: &TaintRuleVersion) -> std::borrow::Cow<'_, str> {
        v.as_str().into()
    }
    fn plural(_: &TaintRuleVersion) -> std::borrow::Cow<'_, str> {
        "devicetaintrules".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

static_resource!(
    ResourceSlice,
    kind = "ResourceSlice",
    group = "resource.k8s.io",
    version = "v1",
    plural = "resourceslices",
    scope = kube::core::ClusterResourceScope
);
static_resource!(
    ResourceClaim,
    kind = "ResourceClaim",
    group = "resource.k8s.io",
    version = "v1",
    plural = "resourceclaims",
    scope = kube::core::NamespaceResourceScope
);
static_resource!(
    DeviceClass,
    kind = "DeviceClass",
    group = "resource.k8s.io",
    version = "v1",
    plural = "deviceclasses",
    scope = kube::core::ClusterResourceScope
);

/// What names one physical device, in a form both sides can be compared in: a slice device's
/// `uuid` / `pciBusID` attributes, a koordinator `Device` entry's `id` / `topology.busID`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceIdentity {
    /// Upper-cased (`GPU-9f1c…`): NVML and the DRA driver agree but for case.
    Uuid(String),
    /// `dddd:bb:dd.f`, lower-case hex: NVML writes an 8-digit domain (`00000000:3B:00.0`),
    /// sysfs and the DRA driver a 4-digit one.
    PciBusId(String),
}

impl fmt::Display for DeviceIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceIdentity::Uuid(u) => write!(f, "uuid {u}"),
            DeviceIdentity::PciBusId(b) => write!(f, "pciBusID {b}"),
        }
    }
}

/// As its display form (`uuid GPU-…`), so it can key a JSON map (the debug views).
impl Serialize for DeviceIdentity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl DeviceIdentity {
    pub fn uuid(raw: &str) -> Option<Self> {
        let u = raw.trim();
        (!u.is_empty()).then(|| DeviceIdentity::Uuid(u.to_ascii_uppercase()))
    }

    /// A PCI address `[domain:]bus:device.function` in canonical form; `None` when it is not
    /// one (a device `id` that is a UUID, say).
    pub fn pci_bus_id(raw: &str) -> Option<Self> {
        let raw = raw.trim();
        let (rest, function) = raw.rsplit_once('.')?;
        let mut parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts.len() {
            3 => (parts.remove(0), parts.remove(0), parts.remove(0)),
            2 => ("0", parts.remove(0), parts.remove(0)),
            _ => return None,
        };
        let hex = |s: &str, max_len: usize| {
            (!s.is_empty() && s.len() <= max_len)
                .then(|| u32::from_str_radix(s, 16).ok())
                .flatten()
        };
        let (domain, bus, device, function) = (
            hex(domain, 8)?,
            hex(bus, 2)?,
            hex(device, 2)?,
            hex(function, 1)?,
        );
        (domain <= 0xffff && device < 32 && function < 8).then(|| {
            DeviceIdentity::PciBusId(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
        })
    }

    /// Whether this identity names one device cluster-wide (a UUID) rather than a place on
    /// some node (a PCI address: every node has a `0000:3b:00.0`).
    pub fn is_global(&self) -> bool {
        matches!(self, DeviceIdentity::Uuid(_))
    }

    /// The identities a slice device states. Attribute names are matched by their last path
    /// element, so the driver's own domain (`gpu.nvidia.com/uuid`, or unqualified `uuid`) and
    /// the standard `resource.kubernetes.io/pciBusID` are both read.
    pub fn of_slice_device(device: &SliceDevice) -> Vec<DeviceIdentity> {
        let mut out = Vec::new();
        for (name, value) in &device.attributes {
            let Some(text) = value.string.as_deref() else {
                continue;
            };
            let short = name.rsplit('/').next().unwrap_or(name);
            // A MIG device names the GPU it is carved from: holding it holds that GPU.
            let identity =
                if short.eq_ignore_ascii_case("uuid") || short.eq_ignore_ascii_case("parentUUID") {
                    DeviceIdentity::uuid(text)
                } else if short.eq_ignore_ascii_case("pciBusID") {
                    DeviceIdentity::pci_bus_id(text)
                } else {
                    None
                };
            out.extend(identity);
        }
        out.sort();
        out.dedup();
        out
    }

    /// The identities a koordinator `Device` entry states: its `id` (a UUID for GPUs, often a
    /// PCI address for RDMA) and its `topology.busID`.
    pub fn of_koord_device(id: &str, bus_id: Option<&str>) -> Vec<DeviceIdentity> {
        let mut out = Vec::new();
        match DeviceIdentity::pci_bus_id(id) {
            Some(b) => out.push(b),
            None => out.extend(DeviceIdentity::uuid(id)),
        }
        out.extend(bus_id.and_then(DeviceIdentity::pci_bus_id));
        out.sort();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_compare_in_one_form() {
        let canon = Some(DeviceIdentity::PciBusId("0000:3b:00.0".into()));
        for raw in [
            "0000:3b:00.0",
            "00000000:3B:00.0",
            "3b:00.0",
            " 0000:3B:00.0 ",
        ] {
            assert_eq!(DeviceIdentity::pci_bus_id(raw), canon, "{raw}");
        }
        for bad in [
            "GPU-0b1c2d3e-aaaa-bbbb-cccc-000000000000",
            "3b:00",
            "zz:00.0",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "",
        ] {
            assert_eq!(DeviceIdentity::pci_bus_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_slice_device_names_its_gpu_by_uuid_and_bus_id_whatever_the_domain() {
        let device: SliceDevice = serde_json::from_value(serde_json::json!({
            "name": "gpu-0",
            "attributes": {
                "gpu.nvidia.com/uuid": {"string": "gpu-abc"},
                "resource.kubernetes.io/pciBusID": {"string": "0000:3B:00.0"},
                "index": {"int": 0},
                "productName": {"string": "H100"}
            }
        }))
        .unwrap();
        assert_eq!(
            DeviceIdentity::of_slice_device(&device),
            vec![
                DeviceIdentity::Uuid("GPU-ABC".into()),
                DeviceIdentity::PciBusId("0000:3b:00.0".into()),
            ]
        );
        assert_eq!(
            DeviceIdentity::of_koord_device("GPU-abc", Some("00000000:3b:00.0")),
            DeviceIdentity::of_slice_device(&device)
        );
        // An RDMA entry whose id is its PCI address.
        assert_eq!(
            DeviceIdentity::of_koord_device("0000:3d:00.0", None),
            vec![DeviceIdentity::PciBusId("0000:3d:00.0".into())]
        );
    }
}
