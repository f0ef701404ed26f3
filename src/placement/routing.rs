//! Which scheduler a new pod belongs to: the admission webhook's rule (`extender::webhook`).
//!
//! A pod that asks for a managed resource (a GPU, a koordinator share, RDMA, FPGA: the
//! chart's `managedResources`) or, when enabled, a koordinator cpuset QoS class (LSE, LSR)
//! must be scheduled by the extender's scheduler: the default scheduler knows nothing of
//! device shares or cpusets, and koordlet then enforces nothing for the pod. The rule routes
//! such a pod when it names no scheduler or the default one, and leaves a pod that names
//! another scheduler alone (its owner chose; the webhook warns instead).
//!
//! Which names are managed is the one table's (`model::resource_names`): a deprecated name
//! (`kubernetes.io/gpu-core`) is managed when its current name is, and a routed pod gets its
//! deprecated names renamed, because kube-scheduler cannot be told about them. A managed pod
//! that presets `spec.nodeName` would bypass every scheduler and the ledger: it is refused.
//!
//! Pure: reads the decoded pod, decides, never does I/O.

use std::collections::BTreeSet;

use crate::model::koord_cpu::QOS_CLASS_LABEL;
use crate::model::pod::{Container, Pod};
use crate::model::resource_names::{MANAGED_RESOURCES, managed};

/// What the API server defaults an unset `schedulerName` to (before mutating admission).
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// The resources the webhook routes by default: every name of the one table (the chart's
/// `extenderConfig.managedResources` is the same list).
pub fn default_managed_resources() -> BTreeSet<String> {
    MANAGED_RESOURCES
        .iter()
        .map(|r| r.name.to_string())
        .collect()
}

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
    /// Set `spec.schedulerName` to the rule's scheduler and apply `renames`; `why` names the
    /// resource or label.
    Route { why: String, renames: Vec<Rename> },
    /// Already the extender's scheduler; only `renames` (maybe none) to apply.
    AlreadyRouted { renames: Vec<Rename> },
    /// Asks for nothing the extender manages.
    NotManaged,
    /// Asks for `why` but names another scheduler: left alone.
    OtherScheduler { scheduler: String, why: String },
    /// Asks for `why`, would be the extender's, but sets `spec.nodeName`: it would reach no
    /// scheduler, carry no allocation, and hold a device the ledger cannot see. Refused.
    PresetNode { node: String, why: String },
}

/// One deprecated resource name to rename in a pod (JSON pointer of the resource list).
/// kube-scheduler cannot be told about the deprecated names (see
/// [`super::resource_names::ManagedResource::deprecated`]), so a routed pod keeps only current
/// ones. Where the list also names the current one, the deprecated entry is dropped: the
/// current value wins, as in the request parser (`canonicalize_resource_names`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rename {
    /// `/spec/containers/0/resources/limits`, ...
    pub list: String,
    pub from: &'static str,
    pub to: &'static str,
    /// The list names `to` already: remove `from` only.
    pub drop_only: bool,
}

impl Rename {
    /// The JSON patch operation (RFC 6902; `/` in a name is escaped as `~1`).
    pub fn patch_op(&self) -> serde_json::Value {
        let escape = |name: &str| name.replace('~', "~0").replace('/', "~1");
        let from = format!("{}/{}", self.list, escape(self.from));
        if self.drop_only {
            serde_json::json!({ "op": "remove", "path": from })
        } else {
            serde_json::json!({
                "op": "move",
                "from": from,
                "path": format!("{}/{}", self.list, escape(self.to)),
            })
        }
    }
}

impl RoutingRule {
    pub fn route(&self, pod: &Pod) -> Routing {
        let Some(why) = self.reason(pod) else {
            return Routing::NotManaged;
        };
        // A preset node first, whatever scheduler the pod names: it reaches none, so no one
        // allocates its devices, and a holder the ledger can only guess at (trust IV §10: it
        // was admitted when it named another scheduler).
        if let Some(node) = pod.spec.node_name.as_deref().filter(|n| !n.is_empty()) {
            return Routing::PresetNode {
                node: node.to_string(),
                why,
            };
        }
        let ours = match pod.spec.scheduler_name.as_deref() {
            None | Some("") | Some(DEFAULT_SCHEDULER) => false,
            Some(s) if s == self.scheduler_name => true,
            Some(other) => {
                return Routing::OtherScheduler {
                    scheduler: other.to_string(),
                    why,
                };
            }
        };
        let renames = renames(pod);
        if ours {
            Routing::AlreadyRouted { renames }
        } else {
            Routing::Route { why, renames }
        }
    }

    /// Whether `name` is managed: listed itself, or a deprecated name whose current name is.
    fn manages(&self, name: &str) -> bool {
        self.managed_resources.contains(name)
            || managed(name).is_some_and(|(_, r)| self.managed_resources.contains(r.canonical))
    }

    /// Why the pod is the extender's: the first managed resource it names, or its QoS class.
    fn reason(&self, pod: &Pod) -> Option<String> {
        let names = |c: &Container| {
            let r = &c.resources;
            r.requests
                .iter()
                .chain(r.limits.iter())
                .flat_map(|list| list.keys())
                .find(|name| self.manages(name))
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

/// Every deprecated device resource name in the pod's containers, to rename.
fn renames(pod: &Pod) -> Vec<Rename> {
    let mut out = Vec::new();
    let groups = [
        ("containers", &pod.spec.containers),
        ("initContainers", &pod.spec.init_containers),
    ];
    for (group, containers) in groups {
        for (i, c) in containers.iter().enumerate() {
            let lists = [
                ("requests", &c.resources.requests),
                ("limits", &c.resources.limits),
            ];
            for (list_name, list) in lists {
                let Some(list) = list else { continue };
                for name in list.keys() {
                    let Some((_, r)) = managed(name).filter(|(_, r)| r.deprecated()) else {
                        continue;
                    };
                    out.push(Rename {
                        list: format!("/spec/{group}/{i}/resources/{list_name}"),
                        from: r.name,
                        to: r.canonical,
                        drop_only: list.contains_key(r.canonical),
                    });
                }
            }
        }
    }
    out
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
        assert_eq!(r.route(&mine), Routing::AlreadyRouted { renames: vec![] });
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

    /// Trust IV §10: a managed pod that presets `spec.nodeName` is one to deny whatever
    /// scheduler it names (it reaches none).
    #[test]
    fn a_preset_node_is_denied_whatever_scheduler_the_pod_names() {
        let r = rule(false);
        for scheduler in ["", "default-scheduler", "device-numa-scheduler", "volcano"] {
            let p = pod(
                serde_json::json!({"spec": {"schedulerName": scheduler, "nodeName": "gpu-1",
                "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
            );
            assert_eq!(
                r.route(&p),
                Routing::PresetNode {
                    node: "gpu-1".into(),
                    why: "it asks for nvidia.com/gpu".into()
                },
                "{scheduler}"
            );
        }
    }

    /// Issue 36 §3: a deprecated name routes a pod when its current name is managed, and the
    /// routed pod gets current names only (the current value wins where both are given).
    #[test]
    fn deprecated_names_route_and_are_renamed() {
        let r = rule(false);
        let p = pod(serde_json::json!({"spec": {"containers": [
            {"name": "a", "resources": {"limits": {"kubernetes.io/gpu-core": "50"}}},
            {"name": "b", "resources": {"requests": {"kubernetes.io/gpu-core": "10", "koordinator.sh/gpu-core": "20"}}}
        ]}}));
        let Routing::Route { why, renames } = r.route(&p) else {
            panic!("not routed: {:?}", r.route(&p));
        };
        assert_eq!(why, "it asks for kubernetes.io/gpu-core");
        let ops: Vec<serde_json::Value> = renames.iter().map(Rename::patch_op).collect();
        assert_eq!(
            ops,
            [
                serde_json::json!({"op": "move", "from": "/spec/containers/0/resources/limits/kubernetes.io~1gpu-core", "path": "/spec/containers/0/resources/limits/koordinator.sh~1gpu-core"}),
                serde_json::json!({"op": "remove", "path": "/spec/containers/1/resources/requests/kubernetes.io~1gpu-core"}),
            ]
        );
        // A deprecated name whose current name the rule does not manage is not the extender's.
        let rdma = pod(
            serde_json::json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"kubernetes.io/rdma": "1"}}}]}}),
        );
        assert_eq!(r.route(&rdma), Routing::NotManaged);
        // The default rule manages every name of the table, deprecated ones included.
        let all = RoutingRule {
            managed_resources: default_managed_resources(),
            ..rule(false)
        };
        for entry in MANAGED_RESOURCES {
            let p = pod(serde_json::json!({"spec": {"containers": [
                {"name": "a", "resources": {"limits": {entry.name: "1"}}}
            ]}}));
            let Routing::Route { renames, .. } = all.route(&p) else {
                panic!("{} not routed", entry.name);
            };
            assert_eq!(
                renames.len(),
                usize::from(entry.deprecated()),
                "{}",
                entry.name
            );
        }
    }

    /// Issue 36 §4: a managed pod that presets `spec.nodeName` is refused; an unmanaged one,
    /// or one of another scheduler, is not the extender's business.
    #[test]
    fn a_managed_pod_with_a_preset_node_is_refused() {
        let r = rule(true);
        for scheduler in [
            None,
            Some("default-scheduler"),
            Some("device-numa-scheduler"),
        ] {
            let mut spec = serde_json::json!({"nodeName": "n1", "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]});
            if let Some(s) = scheduler {
                spec["schedulerName"] = s.into();
            }
            let verdict = r.route(&pod(serde_json::json!({"spec": spec})));
            assert_eq!(
                verdict,
                Routing::PresetNode {
                    node: "n1".into(),
                    why: "it asks for nvidia.com/gpu".into()
                },
                "{scheduler:?}"
            );
        }
        let lse = pod(
            serde_json::json!({"metadata": {"labels": {"koordinator.sh/qosClass": "LSE"}}, "spec": {"nodeName": "n1", "containers": [{"name": "a"}]}}),
        );
        assert!(matches!(r.route(&lse), Routing::PresetNode { .. }));
        let plain =
            pod(serde_json::json!({"spec": {"nodeName": "n1", "containers": [{"name": "a"}]}}));
        assert_eq!(r.route(&plain), Routing::NotManaged);
        // Trust IV §10: naming another scheduler does not make a preset node reach one.
        let other = pod(
            serde_json::json!({"spec": {"nodeName": "n1", "schedulerName": "volcano", "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
        );
        assert!(matches!(r.route(&other), Routing::PresetNode { .. }));
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
