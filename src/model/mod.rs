//! The API objects this service decodes, as slim hand-written serde types.
//!
//! We decode only the fields placement and accounting need: a full `k8s_openapi` Pod costs far
//! more to deserialize and to keep, and the bootstrap budget is set by decode cost. Every type
//! here implements `kube::Resource` by hand so kube-runtime watchers can stream it directly.
//! This module owns no state and performs no I/O.

/// Implements `kube::Resource` for a slim type with a fixed group/version (what
/// `#[derive(CustomResource)]` would generate, without the derive's compile cost).
macro_rules! static_resource {
    ($ty:ty, kind = $kind:literal, group = $group:literal, version = $version:literal,
     plural = $plural:literal, scope = $scope:ty) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub mod cpu_policy;
pub mod cpuset;
pub mod device;
pub mod dra;
pub mod gpu_partition;
pub mod ids;
pub mod koord_cpu;
pub mod node;
pub mod nrt;
pub mod pod;
pub mod quantity;
pub mod requests;
pub mod resource_names;
pub mod wire;

/// Koordinator annotation keys this service reads or writes.
pub mod annotations {
    /// GPU/RDMA/FPGA allocation written at bind; read by koordlet (defined with its parser).
    pub use super::device::DEVICE_ALLOCATED;
    /// CPU/NUMA allocation (cpuset, NUMA node resources) written at bind; read by koordlet.
    pub const RESOURCE_STATUS: &str = "scheduling.koordinator.sh/resource-status";
}
