//! What a pod asks of a node ([`PodNeeds`]), computed once per request from the pod and the
//! kinds this cluster serves; an invalid request is an error that makes every node unresolvable.

use super::Scheduler;
use super::config::ScoringConfig;
use crate::model::pod::Pod;
use crate::placement::cpu::classify::ClassifyError;
use crate::placement::cpu::classify::classify;
use crate::placement::cpu::{NumaPolicy, PodCpuRequest};
use crate::placement::device::request::PodDeviceRequest;
use crate::placement::device::{PodDeviceRequestError, pod_device_request};
use crate::sync::Kind;

/// What a pod asks of a node, computed once per request.
#[derive(Clone, Debug, Default, Hash)]
pub struct PodNeeds {
    /// `None` when the pod needs no devices (or device placement is off).
    pub devices: Option<PodDeviceRequest>,
    /// `None` when CPU placement is off (no NRT CRD) or the pod requests neither cpu nor
    /// memory and asks for no cpuset or NUMA policy.
    pub cpu: Option<PodCpuRequest>,
}

impl PodNeeds {
    /// Nothing to decide anywhere: the verbs pass the pod through.
    pub fn is_none(&self) -> bool {
        self.devices.is_none() && self.cpu.is_none()
    }

    /// The pod itself asks for CPU placement (a cpuset wish or a NUMA policy): only then does
    /// the CPU score join prioritize (plain CPU is kube-scheduler's own NodeResourcesFit).
    pub fn wants_cpu_placement(&self) -> bool {
        self.cpu
            .as_ref()
            .is_some_and(|c| c.cpuset.is_some() || c.numa_policy != NumaPolicy::None)
    }
}

/// The CPU half of [`PodNeeds`]: classification, or an error that makes every node
/// unresolvable (it names the annotation or the fractional request).
pub fn cpu_needs(
    pod: &Pod,
    enabled: bool,
    scoring: &ScoringConfig,
) -> Result<Option<PodCpuRequest>, ClassifyError> {
    if !enabled {
        return Ok(None);
    }
    let req = classify(pod, scoring.cpu.default_bind_policy)?;
    let nothing = req.cpu_milli <= 0
        && req.memory_bytes <= 0
        && req.cpuset.is_none()
        && req.numa_policy == NumaPolicy::None;
    Ok((!nothing).then_some(req))
}

/// Why a pod's request is invalid on every node; the text names the resource or annotation.
#[derive(Debug, thiserror::Error)]
pub enum InvalidRequest {
    #[error(transparent)]
    Devices(#[from] PodDeviceRequestError),
    #[error(transparent)]
    Cpu(#[from] ClassifyError),
}

/// The pod's device request: `Ok(None)` when it needs no devices (or device placement is off).
pub fn device_request(
    state: &Scheduler,
    pod: &Pod,
) -> Result<Option<PodDeviceRequest>, PodDeviceRequestError> {
    if !state.readiness.is_enabled(Kind::Devices) {
        return Ok(None);
    }
    pod_device_request(pod)
}

/// Everything the pod asks of a node; `Err` when its request is invalid everywhere.
pub fn pod_needs(state: &Scheduler, pod: &Pod) -> Result<PodNeeds, InvalidRequest> {
    let cpu = cpu_needs(
        pod,
        state.readiness.is_enabled(Kind::NodeResourceTopologies),
        &state.scoring,
    )?
    // A plain pod (no cpuset wish, no NUMA policy) needs CPU placement only on nodes that
    // constrain plain pods; with none in the cluster it stays pass-through.
    .filter(|c| {
        c.cpuset.is_some()
            || c.numa_policy != crate::placement::cpu::NumaPolicy::None
            || state.cluster.cpu_constraining_nodes() > 0
    });
    Ok(PodNeeds {
        devices: device_request(state, pod)?,
        cpu,
    })
}
