//! Pod classification (koordinator nodenumaresource `PreFilter`): a [`PodCpuRequest`] from a Pod,
//! independent of any node.
//!
//! Pure: reads the pod's requests, labels, priority and the `resource-spec` /
//! `numa-topology-spec` annotations. Node × pod resolution (node-forced bind policy, policy
//! conflicts, SMT alignment) is `place`'s job, not this module's.

use crate::model::koord_cpu::{
    self, BindPolicyValue, KoordCpuError, NUMA_TOPOLOGY_SPEC, PRIORITY_CLASS_LABEL,
    QOS_CLASS_LABEL, RESOURCE_SPEC,
};
use crate::model::pod::Pod;
use crate::model::requests::{RequestError, pod_requests};

use super::{CpuBindPolicy, CpuExclusivePolicy, CpusetWish, PodCpuRequest};

/// Why a pod's CPU request is invalid everywhere (FailedAndUnresolvable on every node).
#[derive(Debug, thiserror::Error)]
pub enum ClassifyError {
    #[error("invalid pod requests: {0}")]
    Requests(#[from] RequestError),
    #[error(
        "the requested CPUs must be integer for a cpuset (cpu request {milli}m; qosClass {qos} asks for {policy})"
    )]
    FractionalCpu {
        milli: i64,
        qos: String,
        policy: &'static str,
    },
    #[error("invalid annotation: {0}")]
    Annotation(#[from] KoordCpuError),
}

/// koordinator's priority classes, by the bands of `spec.priority`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PriorityClass {
    Prod,
    Mid,
    Batch,
    Free,
}

/// Label `koordinator.sh/priority-class`, else the `spec.priority` band, else from the QoS
/// class (LSE/LSR/LS/SYSTEM → prod, BE → batch).
pub fn priority_class(pod: &Pod) -> Option<PriorityClass> {
    let from_label = match pod.label(PRIORITY_CLASS_LABEL) {
        Some("koord-prod") => Some(PriorityClass::Prod),
        Some("koord-mid") => Some(PriorityClass::Mid),
        Some("koord-batch") => Some(PriorityClass::Batch),
        Some("koord-free") => Some(PriorityClass::Free),
        _ => None,
    };
    let from_priority = pod.spec.priority.and_then(|p| match p {
        9000..=9999 => Some(PriorityClass::Prod),
        7000..=7999 => Some(PriorityClass::Mid),
        5000..=5999 => Some(PriorityClass::Batch),
        3000..=3999 => Some(PriorityClass::Free),
        _ => None,
    });
    let from_qos = match pod.label(QOS_CLASS_LABEL) {
        Some("LSE" | "LSR" | "LS" | "SYSTEM") => Some(PriorityClass::Prod),
        Some("BE") => Some(PriorityClass::Batch),
        _ => None,
    };
    from_label.or(from_priority).or(from_qos)
}

/// The pod's CPU/NUMA request. `default_policy` resolves `Default` bind policies.
pub fn classify(pod: &Pod, default_policy: CpuBindPolicy) -> Result<PodCpuRequest, ClassifyError> {
    let requests = pod_requests(&pod.spec)?;
    let cpu_milli = requests.get("cpu").map_or(0, |q| q.milli_value());
    let memory_bytes = requests.get("memory").map_or(0, |q| q.value());
    let spec = pod
        .annotation(RESOURCE_SPEC)
        .map(koord_cpu::parse_resource_spec)
        .transpose()?;
    let numa = pod
        .annotation(NUMA_TOPOLOGY_SPEC)
        .map(koord_cpu::parse_numa_topology_spec)
        .transpose()?
        .unwrap_or_default();

    let qos = pod.label(QOS_CLASS_LABEL).unwrap_or("");
    let allow_cpuset =
        matches!(qos, "LSE" | "LSR") && priority_class(pod) == Some(PriorityClass::Prod);
    let mut cpuset = None;
    if allow_cpuset {
        let resolve = |v: BindPolicyValue| match v {
            BindPolicyValue::Default => Some(default_policy),
            BindPolicyValue::Policy(p) => Some(p),
            BindPolicyValue::None => None,
        };
        let preferred = spec
            .as_ref()
            .map_or(BindPolicyValue::Default, |s| s.preferred);
        let required = spec.as_ref().and_then(|s| s.required);
        let (policy, is_required) = match required {
            Some(r) => (resolve(r), true),
            None => (resolve(preferred), false),
        };
        if let Some(policy) = policy {
            if cpu_milli % 1000 != 0 {
                return Err(ClassifyError::FractionalCpu {
                    milli: cpu_milli,
                    qos: qos.to_string(),
                    policy: koord_cpu::bind_policy_str(policy),
                });
            }
            if cpu_milli > 0 {
                cpuset = Some(CpusetWish {
                    policy,
                    required: is_required,
                    exclusive: spec
                        .as_ref()
                        .map_or(CpuExclusivePolicy::None, |s| s.exclusive),
                });
            }
        }
    }
    Ok(PodCpuRequest {
        cpu_milli,
        memory_bytes,
        cpuset,
        numa_policy: numa.policy,
        numa_exclusive: numa.exclusive,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::cpu::{NumaExclusive, NumaPolicy};

    fn pod(labels: &[(&str, &str)], annotations: &[(&str, &str)], cpu: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "uid": "u",
                "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>(),
                "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>(),
            },
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
        }))
        .unwrap()
    }

    #[test]
    fn lsr_prod_gets_the_default_policy() {
        let r = classify(
            &pod(&[(QOS_CLASS_LABEL, "LSR")], &[], "4"),
            CpuBindPolicy::FullPcpus,
        )
        .unwrap();
        assert_eq!(
            r.cpuset,
            Some(CpusetWish {
                policy: CpuBindPolicy::FullPcpus,
                required: false,
                exclusive: CpuExclusivePolicy::None
            })
        );
        assert_eq!(r.cpu_milli, 4000);
        assert_eq!(r.memory_bytes, 1 << 30);
    }

    #[test]
    fn priority_decides_eligibility() {
        let batch = pod(
            &[
                (QOS_CLASS_LABEL, "LSR"),
                (PRIORITY_CLASS_LABEL, "koord-batch"),
            ],
            &[],
            "4",
        );
        assert_eq!(
            classify(&batch, CpuBindPolicy::FullPcpus).unwrap().cpuset,
            None
        );
        let mut by_priority = pod(&[(QOS_CLASS_LABEL, "LSE")], &[], "2");
        by_priority.spec.priority = Some(5500);
        assert_eq!(priority_class(&by_priority), Some(PriorityClass::Batch));
        assert_eq!(
            classify(&by_priority, CpuBindPolicy::FullPcpus)
                .unwrap()
                .cpuset,
            None
        );
        by_priority.spec.priority = Some(9100);
        assert!(
            classify(&by_priority, CpuBindPolicy::FullPcpus)
                .unwrap()
                .cpuset
                .is_some()
        );
        let ls = pod(&[(QOS_CLASS_LABEL, "LS")], &[], "4");
        assert_eq!(
            classify(&ls, CpuBindPolicy::FullPcpus).unwrap().cpuset,
            None
        );
    }

    #[test]
    fn required_overrides_preferred_and_exclusive_is_kept() {
        let p = pod(
            &[(QOS_CLASS_LABEL, "LSR")],
            &[(
                RESOURCE_SPEC,
                r#"{"requiredCPUBindPolicy":"SpreadByPCPUs","preferredCPUBindPolicy":"FullPCPUs","preferredCPUExclusivePolicy":"NUMANodeLevel"}"#,
            )],
            "4",
        );
        let w = classify(&p, CpuBindPolicy::FullPcpus)
            .unwrap()
            .cpuset
            .unwrap();
        assert_eq!(w.policy, CpuBindPolicy::SpreadByPcpus);
        assert!(w.required);
        assert_eq!(w.exclusive, CpuExclusivePolicy::NumaNodeLevel);
    }

    #[test]
    fn fractional_cpuset_request_is_invalid_and_named() {
        let e = classify(
            &pod(&[(QOS_CLASS_LABEL, "LSR")], &[], "1500m"),
            CpuBindPolicy::FullPcpus,
        )
        .unwrap_err();
        assert!(e.to_string().contains("must be integer"), "{e}");
        assert!(e.to_string().contains("1500m"), "{e}");
        // Without a wish a fractional request is fine.
        assert!(classify(&pod(&[], &[], "1500m"), CpuBindPolicy::FullPcpus).is_ok());
    }

    #[test]
    fn numa_spec_and_bad_annotations() {
        let p = pod(
            &[],
            &[(
                NUMA_TOPOLOGY_SPEC,
                r#"{"numaTopologyPolicy":"SingleNUMANode","singleNUMANodeExclusive":"Preferred"}"#,
            )],
            "1",
        );
        let r = classify(&p, CpuBindPolicy::FullPcpus).unwrap();
        assert_eq!(r.numa_policy, NumaPolicy::SingleNumaNode);
        assert_eq!(r.numa_exclusive, NumaExclusive::Preferred);
        let bad = pod(&[], &[(NUMA_TOPOLOGY_SPEC, "{")], "1");
        let e = classify(&bad, CpuBindPolicy::FullPcpus).unwrap_err();
        assert!(e.to_string().contains(NUMA_TOPOLOGY_SPEC), "{e}");
        let none = pod(
            &[],
            &[(NUMA_TOPOLOGY_SPEC, r#"{"numaTopologyPolicy":"None"}"#)],
            "1",
        );
        assert_eq!(
            classify(&none, CpuBindPolicy::FullPcpus)
                .unwrap()
                .numa_policy,
            NumaPolicy::None
        );
    }
}
