//! Which scheduler a new pod belongs to: the admission webhook's rule (`extender::webhook`).
//!
//! A pod that asks for a managed resource (a GPU, a koordinator share, RDMA, FPGA: the
//! chart's `managedResources`) or, when enabled, a koordinator cpuset QoS class (LSE, LSR)
//! must be scheduled by the extender's scheduler: the default scheduler knows nothing of
//! device shares or cpusets, and koordlet then enforces nothing for the pod. The rule routes
//! such a pod when it names no scheduler or the default one, and leaves a pod that names
//! another scheduler alone (its owner chose; the webhook warns instead).
//!
//! Pure: reads the decoded pod, decides, never does I/O.

use std::collections::BTreeSet;

use super::koord_cpu::QOS_CLASS_LABEL;
use super::pod::{Container, Pod};

/// What the API server defaults an unset `schedulerName` to (before mutating admission).
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// The resources the webhook routes by default: the chart's `extenderConfig.managedResources`.
pub const DEFAULT_MANAGED_RESOURCES: [&str; 13] = [
    "nvidia.com/gpu",
    "amd.com/gpu",
    "dcu.com/gpu",
    "koordinator.sh/gpu",
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/gpu.shared",
    "huawei.com/npu-core",
    "huawei.com/npu-cpu",
    "huawei.com/npu-dvpp",
    "koordinator.sh/rdma",
    "koordinator.sh/fpga",
];

/// The koordinator QoS classes whose pods get a cpuset.
pub const CPUSET_QOS_CLASSES: [&str; 2] = ["LSE", "LSR"];

/// The webhook's routing rule.
#[derive(Clone, Debug)]
pub struct RoutingRule {
    /// The extender's scheduler (`spec.schedulerName` routed pods get).
    pub scheduler_name: String,
    /// Resource names whose request or limit in any container routes a pod.
    pub managed_resources: BTreeSet<String>,
    /// Also route pods labelled with a cpuset QoS class ([`CPUSET_QOS_CLASSES`]).
    pub cpuset_qos: bool,
}

/// The rule's verdict for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Set `spec.schedulerName` to the rule's scheduler; `why` names the resource or label.
    Route { why: String },
    /// Already the extender's scheduler.
    AlreadyRouted,
    /// Asks for nothing the extender manages.
    NotManaged,
    /// Asks for `why` but names another scheduler: left alone.
    OtherScheduler { scheduler: String, why: String },
}

impl RoutingRule {
    pub fn route(&self, pod: &Pod) -> Routing {
        let Some(why) = self.reason(pod) else {
            return Routing::NotManaged;
        };
        match pod.spec.scheduler_name.as_deref() {
            None | Some("") | Some(DEFAULT_SCHEDULER) => Routing::Route { why },
            Some(s) if s == self.scheduler_name => Routing::AlreadyRouted,
            Some(other) => Routing::OtherScheduler {
                scheduler: other.to_string(),
                why,
            },
        }
    }

    /// Why the pod is the extender's: the first managed resource it names, or its QoS class.
    fn reason(&self, pod: &Pod) -> Option<String> {
        let names = |c: &Container| {
            let r = &c.resources;
            r.requests
                .iter()
                .chain(r.limits.iter())
                .flat_map(|list| list.keys())
                .find(|name| self.managed_resources.contains(name.as_str()))
                .cloned()
        };
        if let Some(name) = pod
            .spec
            .containers
            .iter()
            .chain(&pod.spec.init_containers)
            .find_map(names)
        {
            return Some(format!("it asks for {name}"));
        }
        pod.label(QOS_CLASS_LABEL)
            .filter(|c| self.cpuset_qos && CPUSET_QOS_CLASSES.contains(c))
            .map(|class| format!("it is labelled {QOS_CLASS_LABEL}={class}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(cpuset_qos: bool) -> RoutingRule {
        RoutingRule {
            scheduler_name: "device-numa-scheduler".into(),
            managed_resources: ["nvidia.com/gpu", "koordinator.sh/gpu-core"]
                .map(String::from)
                .into(),
            cpuset_qos,
        }
    }

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn routes_pods_that_name_a_managed_resource_anywhere() {
        let r = rule(false);
        for spec in [
            serde_json::json!({"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
            serde_json::json!({"containers": [{"name": "a"}, {"name": "b", "resources": {"requests": {"koordinator.sh/gpu-core": "50"}}}]}),
            serde_json::json!({"schedulerName": "default-scheduler", "containers": [{"name": "a"}], "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
        ] {
            let verdict = r.route(&pod(
                serde_json::json!({"metadata": {"name": "p"}, "spec": spec}),
            ));
            assert!(
                matches!(verdict, Routing::Route { .. }),
                "{spec}: {verdict:?}"
            );
        }
    }

    #[test]
    fn leaves_other_pods_and_other_schedulers_alone() {
        let r = rule(false);
        let plain = pod(
            serde_json::json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": "1", "amd.com/gpu": "1"}}}]}}),
        );
        assert_eq!(r.route(&plain), Routing::NotManaged);
        let mine = pod(
            serde_json::json!({"spec": {"schedulerName": "device-numa-scheduler", "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
        );
        assert_eq!(r.route(&mine), Routing::AlreadyRouted);
        let other = pod(
            serde_json::json!({"spec": {"schedulerName": "volcano", "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
        );
        assert_eq!(
            r.route(&other),
            Routing::OtherScheduler {
                scheduler: "volcano".into(),
                why: "it asks for nvidia.com/gpu".into()
            }
        );
    }

    #[test]
    fn cpuset_qos_labels_route_only_when_enabled() {
        let lsr = pod(
            serde_json::json!({"metadata": {"labels": {"koordinator.sh/qosClass": "LSR"}}, "spec": {"containers": [{"name": "a"}]}}),
        );
        assert_eq!(rule(false).route(&lsr), Routing::NotManaged);
        assert!(matches!(rule(true).route(&lsr), Routing::Route { .. }));
        let ls = pod(
            serde_json::json!({"metadata": {"labels": {"koordinator.sh/qosClass": "LS"}}, "spec": {"containers": [{"name": "a"}]}}),
        );
        assert_eq!(rule(true).route(&ls), Routing::NotManaged);
    }
}
