//! The koordinator annotations a committed CPU placement is written as: `resource-status`
//! (the cpuset and NUMA resources koordlet enforces), the completed `resource-spec`, and the
//! ledger entry the same placement is recorded as.

use crate::cluster::cpus::CpuAllocation;
use crate::model::koord_cpu::{self, ResourceSpec, ResourceStatus};
use crate::model::pod::Pod;
use crate::placement::cpu::{
    CpuBindPolicy, CpuExclusivePolicy, CpuPlacement, NodeCpuBindPolicy, PodCpuRequest,
};

/// What bind records in the CPU ledger for a placement.
pub fn recorded_cpus(placement: &CpuPlacement, req: &PodCpuRequest) -> CpuAllocation {
    CpuAllocation {
        cpuset: placement.cpuset,
        numa: placement.numa.clone(),
        exclusive: if placement.cpuset.is_empty() {
            CpuExclusivePolicy::None
        } else {
            req.cpuset.map_or(CpuExclusivePolicy::None, |w| w.exclusive)
        },
    }
}

/// The pod's CPU request in millicores (0 when it has none or it does not parse): what the
/// amplification check counts for an entry the watch has not listed yet.
pub fn cpu_request_milli(pod: &Pod) -> i64 {
    crate::model::requests::pod_requests_compact(&pod.spec)
        .ok()
        .and_then(|r| r.get("cpu").map(|q| q.milli_value()))
        .unwrap_or(0)
}

/// The `resource-status` value for a placement (`None` when it binds nothing).
pub fn resource_status(placement: &CpuPlacement) -> Option<String> {
    let status = ResourceStatus {
        cpuset: placement.cpuset,
        numa: placement.numa.clone(),
    };
    (!status.is_empty()).then(|| status.to_annotation())
}

/// The `resource-spec` write-back (koordinator nodenumaresource `PreBind`) for a placement with a cpuset (`None`: unchanged).
pub fn resource_spec_write_back(
    pod: &Pod,
    placement: &CpuPlacement,
    req: &PodCpuRequest,
    node_policy: NodeCpuBindPolicy,
) -> Option<String> {
    if placement.cpuset.is_empty() {
        return None;
    }
    let forced = match node_policy {
        NodeCpuBindPolicy::FullPcpusOnly => Some(CpuBindPolicy::FullPcpus),
        NodeCpuBindPolicy::SpreadByPcpus => Some(CpuBindPolicy::SpreadByPcpus),
        NodeCpuBindPolicy::None => None,
    };
    let effective = forced.or(req.cpuset.map(|w| w.policy))?;
    let current: Option<ResourceSpec> = pod
        .annotation(koord_cpu::RESOURCE_SPEC)
        .and_then(|s| koord_cpu::parse_resource_spec(s).ok());
    koord_cpu::resource_spec_write_back(current.as_ref(), forced, effective)
}
