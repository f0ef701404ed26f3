//! koordinator's CPU/NUMA annotations and labels (koordinator `apis/extension`: `resource.go`, `numa_aware.go`): the keys,
//! their JSON shapes, strict parse functions with error enums, and the `resource-status` writer.
//!
//! Owns the wire form only: what a string means is decided here (including the deliberate
//! mapping of every NUMA policy string), but nothing here keeps state, counts, logs or decides
//! placement. Every parse error names the annotation and the offending part. The node side
//! (NRT annotations, policy labels) is in [`node`], the pod side in [`pod`]; both are
//! re-exported here.

use serde::Deserialize;

use crate::model::cpuset::{CpuSet, CpuSetError};
use crate::model::quantity::{Quantity, QuantityError};

// ---- keys ------------------------------------------------------------------------------------

/// NRT annotation: the CPU map, `{"detail":[{"id":0,"core":0,"socket":0,"node":0},...]}`.
pub const CPU_TOPOLOGY: &str = "node.koordinator.sh/cpu-topology";
/// NRT annotation: kubelet's CPU manager policy, options and reserved CPUs.
pub const KUBELET_CPU_MANAGER_POLICY: &str = "kubelet.koordinator.sh/cpu-manager-policy";
/// NRT annotation: CPUs of kubelet-static pods.
pub const POD_CPU_ALLOCS: &str = "node.koordinator.sh/pod-cpu-allocs";
/// NRT annotation (copied from the Node): node reservation, `reservedCPUs` materialised.
pub const NODE_RESERVATION: &str = "node.koordinator.sh/reservation";
/// NRT annotation (copied from the Node): the system QoS cpuset.
pub const SYSTEM_QOS_RESOURCE: &str = "node.koordinator.sh/system-qos-resource";

/// The NRT annotations the CPU ledger reads, in the order they are parsed.
pub const NRT_CPU_ANNOTATIONS: [&str; 5] = [
    CPU_TOPOLOGY,
    KUBELET_CPU_MANAGER_POLICY,
    POD_CPU_ALLOCS,
    NODE_RESERVATION,
    SYSTEM_QOS_RESOURCE,
];

/// Node annotation (koord-manager's node resource controller): amplification ratios per
/// resource, `{"cpu":1.5}`; the Node's allocatable is already multiplied by them.
pub const RESOURCE_AMPLIFICATION_RATIO: &str = "node.koordinator.sh/resource-amplification-ratio";

/// Pod annotation: CPU bind and exclusivity wishes (read, and written back at bind).
pub const RESOURCE_SPEC: &str = "scheduling.koordinator.sh/resource-spec";
/// Pod annotation: pod-level NUMA policy.
pub const NUMA_TOPOLOGY_SPEC: &str = "scheduling.koordinator.sh/numa-topology-spec";
/// Pod annotation: the cpuset and NUMA shares the scheduler chose (koordlet applies it).
pub const RESOURCE_STATUS: &str = crate::model::annotations::RESOURCE_STATUS;

/// Node label: `None` | `FullPCPUsOnly` | `SpreadByPCPUs`.
pub const CPU_BIND_POLICY_LABEL: &str = "node.koordinator.sh/cpu-bind-policy";
/// Node label: `BestEffort` | `Restricted` | `SingleNUMANode` (overrides the NRT).
pub const NUMA_TOPOLOGY_POLICY_LABEL: &str = "node.koordinator.sh/numa-topology-policy";
/// Node label: `MostAllocated` | `LeastAllocated` | `DistributeEvenly`.
pub const NUMA_ALLOCATE_STRATEGY_LABEL: &str = "node.koordinator.sh/numa-allocate-strategy";

/// Pod label: `LSE` | `LSR` | `LS` | `BE` | `SYSTEM`.
pub const QOS_CLASS_LABEL: &str = "koordinator.sh/qosClass";
/// Pod label: `koord-prod` | `koord-mid` | `koord-batch` | `koord-free`.
pub const PRIORITY_CLASS_LABEL: &str = "koordinator.sh/priority-class";

/// The short form of an annotation key, for metric labels.
pub fn short_key(key: &str) -> &str {
    key.rsplit_once('/').map_or(key, |(_, k)| k)
}

// ---- errors ----------------------------------------------------------------------------------

/// Why a koordinator CPU/NUMA annotation could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KoordCpuError {
    #[error("annotation {annotation}: invalid JSON: {source}")]
    Json {
        annotation: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("annotation {annotation}: {field} is missing")]
    MissingField {
        annotation: &'static str,
        field: String,
    },
    #[error("annotation {annotation}: {field}={value} must not be negative")]
    Negative {
        annotation: &'static str,
        field: String,
        value: String,
    },
    #[error("annotation {annotation}: {field}={value} is out of range")]
    OutOfRange {
        annotation: &'static str,
        field: String,
        value: String,
    },
    #[error("annotation {annotation}: {field} is not a CPU list: {source}")]
    CpuList {
        annotation: &'static str,
        field: String,
        #[source]
        source: CpuSetError,
    },
    #[error("annotation {annotation}: {field}={value:?} is not a quantity: {source}")]
    Quantity {
        annotation: &'static str,
        field: String,
        value: String,
        #[source]
        source: QuantityError,
    },
}

impl KoordCpuError {
    /// Short label for metrics.
    pub fn class(&self) -> &'static str {
        match self {
            KoordCpuError::Json { .. } => "bad_json",
            KoordCpuError::MissingField { .. } => "missing_field",
            KoordCpuError::Negative { .. } => "negative",
            KoordCpuError::OutOfRange { .. } => "out_of_range",
            KoordCpuError::CpuList { .. } => "bad_cpu_list",
            KoordCpuError::Quantity { .. } => "bad_quantity",
        }
    }
    pub fn annotation(&self) -> &'static str {
        match self {
            KoordCpuError::Json { annotation, .. }
            | KoordCpuError::MissingField { annotation, .. }
            | KoordCpuError::Negative { annotation, .. }
            | KoordCpuError::OutOfRange { annotation, .. }
            | KoordCpuError::CpuList { annotation, .. }
            | KoordCpuError::Quantity { annotation, .. } => annotation,
        }
    }
}

fn json<'a, T: Deserialize<'a>>(annotation: &'static str, s: &'a str) -> Result<T, KoordCpuError> {
    serde_json::from_str(s).map_err(|source| KoordCpuError::Json { annotation, source })
}

/// A CPU list field. Negative ids (`"-1"`, `"0,-2"`) are reported as such, not as "not a
/// number", because a negative reservation is a distinct koordlet bug class.
fn cpu_list(annotation: &'static str, field: &str, s: &str) -> Result<CpuSet, KoordCpuError> {
    if s.split(',')
        .any(|e| e.trim().starts_with('-') && e.trim().len() > 1)
    {
        return Err(KoordCpuError::Negative {
            annotation,
            field: field.to_string(),
            value: s.to_string(),
        });
    }
    s.parse().map_err(|source| KoordCpuError::CpuList {
        annotation,
        field: field.to_string(),
        source,
    })
}

/// A JSON number or string as a quantity (koordinator's own tests write `"cpu":4`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum QuantityValue {
    S(String),
    I(i64),
    F(f64),
}

impl QuantityValue {
    fn text(&self) -> String {
        match self {
            QuantityValue::S(s) => s.clone(),
            QuantityValue::I(i) => i.to_string(),
            QuantityValue::F(f) => f.to_string(),
        }
    }
}

fn quantity(
    annotation: &'static str,
    field: &str,
    v: &QuantityValue,
) -> Result<Quantity, KoordCpuError> {
    let text = v.text();
    let q = Quantity::parse(&text).map_err(|source| KoordCpuError::Quantity {
        annotation,
        field: field.to_string(),
        value: text.clone(),
        source,
    })?;
    if q.milli() < 0 {
        return Err(KoordCpuError::Negative {
            annotation,
            field: field.to_string(),
            value: text,
        });
    }
    Ok(q)
}

mod node;
mod pod;

pub use node::*;
pub use pod::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu_policy::{CpuBindPolicy, CpuExclusivePolicy, NumaPolicy, NumaShare};

    #[test]
    fn resource_status_round_trips_in_koordlet_form() {
        let s = ResourceStatus {
            cpuset: "0-3,8".parse().unwrap(),
            numa: vec![NumaShare {
                numa: 0,
                cpu_milli: 4000,
                memory_bytes: 8 << 30,
            }],
        };
        let text = s.to_annotation();
        assert_eq!(
            text,
            r#"{"cpuset":"0-3,8","numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"8Gi"}}]}"#
        );
        assert_eq!(ResourceStatus::parse(&text).unwrap(), s);
        assert_eq!(ResourceStatus::default().to_annotation(), "{}");
        // koordinator's own tests write numbers.
        let n = ResourceStatus::parse(
            r#"{"cpuset":"35-36,67-68","numaNodeResources":[{"node":1,"resources":{"cpu":4}}]}"#,
        )
        .unwrap();
        assert_eq!(n.numa[0].cpu_milli, 4000);
        assert_eq!(n.cpuset.len(), 4);
    }

    /// As koordinator's `GetNodeResourceAmplificationRatio` decodes the Node annotation.
    #[test]
    fn amplification_ratio_reads_as_koordinator_decodes_it() {
        for (text, want) in [
            (r#"{"cpu":1.5}"#, Some(1.5)),
            (r#"{"cpu":2,"memory":1.2}"#, Some(2.0)),
            (r#"{"memory":1.2}"#, None),
            ("{}", None),
            ("null", None),
            (r#"{"cpu":null}"#, Some(0.0)),
        ] {
            assert_eq!(
                parse_amplification_ratios(text).unwrap().cpu,
                want,
                "{text}"
            );
        }
        let both = parse_amplification_ratios(r#"{"cpu":2,"memory":1.25,"pods":3}"#).unwrap();
        assert_eq!((both.cpu, both.memory), (Some(2.0), Some(1.25)));
        let memory = parse_amplification_ratios(r#"{"memory":null}"#).unwrap();
        assert_eq!((memory.cpu, memory.memory), (None, Some(0.0)));
        for bad in [
            "",
            "1.5",
            r#"{"cpu":"1.5"}"#,
            r#"{"cpu":1.5"#,
            "[1.5]",
            r#"{"memory":"2"}"#,
        ] {
            let err = parse_amplification_ratios(bad).unwrap_err();
            assert_eq!(err.annotation(), RESOURCE_AMPLIFICATION_RATIO, "{bad}");
            assert_eq!(err.class(), "bad_json");
        }
    }

    #[test]
    fn resource_status_errors_name_the_part() {
        for (bad, class) in [
            ("{", "bad_json"),
            (r#"{"cpuset":"a"}"#, "bad_cpu_list"),
            (r#"{"cpuset":"-1"}"#, "negative"),
            (
                r#"{"numaNodeResources":[{"resources":{}}]}"#,
                "missing_field",
            ),
            (r#"{"numaNodeResources":[{"node":-1}]}"#, "negative"),
            (r#"{"numaNodeResources":[{"node":99}]}"#, "out_of_range"),
            (
                r#"{"numaNodeResources":[{"node":0,"resources":{"cpu":"x"}}]}"#,
                "bad_quantity",
            ),
        ] {
            let e = ResourceStatus::parse(bad).unwrap_err();
            assert_eq!(e.class(), class, "{bad}: {e}");
            assert!(e.to_string().contains(RESOURCE_STATUS));
        }
    }

    #[test]
    fn cpu_topology_parses_and_names_missing_fields() {
        let d = parse_cpu_topology(
            r#"{"detail":[{"id":0,"core":0,"socket":0,"node":0},{"id":1,"core":0,"socket":0,"node":0}]}"#,
        )
        .unwrap();
        assert_eq!(d.len(), 2);
        let e = parse_cpu_topology(r#"{"detail":[{"id":0,"core":0,"socket":0}]}"#).unwrap_err();
        assert_eq!(e.class(), "missing_field");
        assert!(e.to_string().contains("detail[0].node"), "{e}");
        assert_eq!(
            parse_cpu_topology("{}").unwrap_err().class(),
            "missing_field"
        );
        assert_eq!(
            parse_cpu_topology(r#"{"detail":[{"id":-1,"core":0,"socket":0,"node":0}]}"#)
                .unwrap_err()
                .class(),
            "negative"
        );
        assert_eq!(
            parse_cpu_topology(r#"{"detail":[{"id":99999999999,"core":0,"socket":0,"node":0}]}"#)
                .unwrap_err()
                .class(),
            "out_of_range"
        );
    }

    #[test]
    fn reserved_sources() {
        let k = parse_kubelet_cpu_policy(
            r#"{"policy":"static","options":{"full-pcpus-only":"true"},"reservedCPUs":"0,48"}"#,
        )
        .unwrap();
        assert!(k.full_pcpus_only);
        assert_eq!(k.reserved.to_string(), "0,48");
        assert!(
            !parse_kubelet_cpu_policy(r#"{"policy":"none"}"#)
                .unwrap()
                .full_pcpus_only
        );
        assert_eq!(
            parse_kubelet_cpu_policy(r#"{"policy":"static","reservedCPUs":"-2"}"#)
                .unwrap_err()
                .class(),
            "negative"
        );
        let allocs = parse_pod_cpu_allocs(
            r#"[{"namespace":"a","name":"b","uid":"u","cpuset":"4-7","managedByKubelet":true},
                {"uid":"v","cpuset":"8","managedByKubelet":false},{"uid":"","cpuset":"9","managedByKubelet":true}]"#,
        )
        .unwrap();
        assert_eq!(allocs.to_string(), "4-7");
        assert!(parse_pod_cpu_allocs("null").unwrap().is_empty());
        assert_eq!(
            parse_node_reservation(r#"{"resources":{"cpu":"2"},"reservedCPUs":"0-1"}"#)
                .unwrap()
                .to_string(),
            "0-1"
        );
        assert_eq!(
            parse_node_reservation(r#"{"resources":{"cpu":"-2"}}"#)
                .unwrap_err()
                .class(),
            "negative"
        );
        assert_eq!(
            parse_system_qos(r#"{"cpuset":"0-1"}"#).unwrap().to_string(),
            "0-1"
        );
        assert!(
            parse_system_qos(r#"{"cpuset":"0-1","cpusetExclusive":false}"#)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn all_nine_nrt_policy_strings_are_mapped() {
        use NumaPolicy::*;
        for (s, p) in [
            ("None", None),
            ("BestEffort", BestEffort),
            ("BestEffortPodLevel", BestEffort),
            ("BestEffortContainerLevel", BestEffort),
            ("Restricted", Restricted),
            ("RestrictedPodLevel", Restricted),
            ("RestrictedContainerLevel", Restricted),
            ("SingleNUMANodePodLevel", SingleNumaNode),
            ("SingleNUMANodeContainerLevel", SingleNumaNode),
            ("whatever", None),
        ] {
            assert_eq!(numa_policy_from_nrt_policy(s), p, "{s}");
        }
        let attrs = vec![(
            "topologyManagerPolicy".to_string(),
            "restricted".to_string(),
        )];
        assert_eq!(
            numa_policy_from_nrt(&["SingleNUMANodePodLevel".into()], &attrs),
            Restricted,
            "v1alpha2 attributes win"
        );
        assert_eq!(numa_policy_from_label("None"), None);
        assert_eq!(numa_policy_from_label("bogus"), None);
    }

    #[test]
    fn resource_spec_and_write_back() {
        let s = parse_resource_spec(
            r#"{"preferredCPUBindPolicy":"Default","preferredCPUExclusivePolicy":"PCPULevel","x":1}"#,
        )
        .unwrap();
        assert_eq!(s.preferred, BindPolicyValue::Default);
        assert_eq!(s.exclusive, CpuExclusivePolicy::PcpuLevel);
        let w = resource_spec_write_back(Some(&s), None, CpuBindPolicy::FullPcpus).unwrap();
        let v: serde_json::Value = serde_json::from_str(&w).unwrap();
        assert_eq!(v["preferredCPUBindPolicy"], "FullPCPUs");
        assert_eq!(v["x"], 1, "unknown fields kept");
        let forced = resource_spec_write_back(
            None,
            Some(CpuBindPolicy::SpreadByPcpus),
            CpuBindPolicy::SpreadByPcpus,
        )
        .unwrap();
        assert_eq!(
            forced,
            r#"{"preferredCPUBindPolicy":"SpreadByPCPUs","requiredCPUBindPolicy":"SpreadByPCPUs"}"#
        );
        let done = parse_resource_spec(r#"{"requiredCPUBindPolicy":"FullPCPUs"}"#).unwrap();
        assert_eq!(
            resource_spec_write_back(Some(&done), None, CpuBindPolicy::FullPcpus),
            None
        );
        assert!(parse_resource_spec("[").is_err());
    }
}
