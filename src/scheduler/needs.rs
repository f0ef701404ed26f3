//! What a pod asks of a node ([`PodNeeds`]), derived once per request by one rule
//! ([`pod_needs`]) from the pod and explicit facts of the cluster ([`NeedsInputs`]); an
//! invalid request is an error that makes every node unresolvable. It reads no cache itself.

use super::config::ScoringConfig;
use crate::cluster::ClusterState;
use crate::model::pod::Pod;
use crate::placement::cpu::classify::ClassifyError;
use crate::placement::cpu::classify::classify;
use crate::placement::cpu::{NumaPolicy, PodCpuRequest};
use crate::placement::device::request::PodDeviceRequest;
use crate::placement::device::score::ScoringStrategy;
use crate::placement::device::{PodDeviceRequestError, pod_device_request};
use crate::sync::Kind;
use crate::sync::Readiness;

/// What a pod asks of a node, computed once per request.
#[derive(Clone, Debug, Default, Hash)]
pub struct PodNeeds {
    /// `None` when the pod needs no devices (or device placement is off).
    pub devices: Option<PodDeviceRequest>,
    /// `None` when CPU placement is off (no NRT CRD) or the pod requests neither cpu nor
    /// memory and asks for no cpuset or NUMA policy.
    pub cpu: Option<PodCpuRequest>,
    /// The pod's CPU request in millicores, read only for a scorer that needs it whatever the
    /// CPU placement (the fragmentation strategy: a node short of CPU strands its GPUs).
    pub cpu_request_milli: Option<i64>,
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

/// What deriving a pod's needs reads besides the pod, named so filter, prioritize, preempt
/// and bind derive them by one rule from the same kind of facts.
#[derive(Clone, Copy, Debug)]
pub struct NeedsInputs<'a> {
    /// The cluster serves `Device` objects (device placement is on).
    pub devices: bool,
    /// The cluster serves `NodeResourceTopology` objects (CPU placement is on).
    pub cpus: bool,
    /// Some node checks pods that ask for no cpuset and no NUMA policy (it forces a bind
    /// policy, has a NUMA policy or amplifies its CPU): only then do such pods need CPU
    /// placement at all.
    pub plain_pods_checked: bool,
    pub scoring: &'a ScoringConfig,
}

impl<'a> NeedsInputs<'a> {
    /// The facts as the caches hold them now.
    pub fn of(readiness: &Readiness, cluster: &ClusterState, scoring: &'a ScoringConfig) -> Self {
        NeedsInputs {
            devices: readiness.is_enabled(Kind::Devices),
            cpus: readiness.is_enabled(Kind::NodeResourceTopologies),
            plain_pods_checked: cluster.cpu_constraining_nodes() > 0,
            scoring,
        }
    }
}

/// Everything the pod asks of a node; `Err` when its request is invalid everywhere. The one
/// derivation: the read verbs and bind both call it (bind then takes out what kube-scheduler
/// serves through DRA on its node).
pub fn pod_needs(pod: &Pod, inputs: NeedsInputs<'_>) -> Result<PodNeeds, InvalidRequest> {
    let cpu = cpu_needs(pod, inputs.cpus, inputs.scoring)?
        // A plain pod (no cpuset wish, no NUMA policy) needs CPU placement only on nodes that
        // check plain pods; with none in the cluster it stays pass-through.
        .filter(|c| {
            c.cpuset.is_some() || c.numa_policy != NumaPolicy::None || inputs.plain_pods_checked
        });
    let devices = if inputs.devices {
        pod_device_request(pod)?
    } else {
        None
    };
    let cpu_request_milli = (inputs.scoring.device.strategy == ScoringStrategy::Fragmentation)
        .then(|| {
            crate::model::requests::pod_requests_compact(&pod.spec)
                .ok()
                .and_then(|r| r.get("cpu").map(|q| q.milli_value()))
                .unwrap_or(0)
        });
    Ok(PodNeeds {
        devices,
        cpu,
        cpu_request_milli,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(qos: &str, requests: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u",
                "labels": {"koordinator.sh/qosClass": qos}},
            "spec": {"containers": [{"name": "c",
                "resources": {"requests": requests, "limits": requests}}]}}))
        .expect("pod")
    }

    fn inputs(scoring: &ScoringConfig, plain_pods_checked: bool) -> NeedsInputs<'_> {
        NeedsInputs {
            devices: true,
            cpus: true,
            plain_pods_checked,
            scoring,
        }
    }

    /// The plain-pod rule, which bind used to skip: a plain pod needs CPU placement only where
    /// some node checks plain pods; a cpuset pod always does; devices are the pod's.
    #[test]
    fn the_plain_pod_rule_applies_to_every_caller() {
        let scoring = ScoringConfig::default();
        let plain = pod(
            "LS",
            json!({"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"}),
        );
        let needs = pod_needs(&plain, inputs(&scoring, false)).unwrap();
        assert!(needs.cpu.is_none() && needs.devices.is_some());
        assert!(
            pod_needs(&plain, inputs(&scoring, true))
                .unwrap()
                .cpu
                .is_some()
        );
        let lsr = pod("LSR", json!({"cpu": "2", "memory": "1Gi"}));
        let needs = pod_needs(&lsr, inputs(&scoring, false)).unwrap();
        assert!(needs.cpu.is_some_and(|c| c.cpuset.is_some()));
        let off = NeedsInputs {
            devices: false,
            cpus: false,
            ..inputs(&scoring, true)
        };
        assert!(pod_needs(&plain, off).unwrap().is_none());
    }
}
