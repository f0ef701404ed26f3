//! Every Kubernetes API call the binary makes: the single source of truth for the chart's ClusterRole.
//! Tests check the chart against this table and the fake API server's request log against it.
pub struct ApiCall {
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
}
pub const API_CALLS: &[ApiCall] = &[
    ApiCall {
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
    },
    ApiCall {
        group: "",
        resource: "pods",
        verbs: &["get", "list", "watch", "patch"],
    },
    ApiCall {
        group: "",
        resource: "pods/binding",
        verbs: &["create"],
    },
    ApiCall {
        group: "scheduling.koordinator.sh",
        resource: "devices",
        verbs: &["list", "watch"],
    },
    ApiCall {
        group: "topology.node.k8s.io",
        resource: "noderesourcetopologies",
        verbs: &["list", "watch"],
    },
    // Kubernetes' own device allocator (DRA), read to count what its claims hold and which
    // resource names its DeviceClasses take over (README "Beside DRA").
    ApiCall {
        group: "resource.k8s.io",
        resource: "deviceclasses",
        verbs: &["list", "watch"],
    },
    ApiCall {
        group: "resource.k8s.io",
        resource: "resourceslices",
        verbs: &["list", "watch"],
    },
    ApiCall {
        group: "resource.k8s.io",
        resource: "resourceclaims",
        verbs: &["list", "watch"],
    },
    ApiCall {
        group: "resource.k8s.io",
        resource: "devicetaintrules",
        verbs: &["list", "watch"],
    },
    // The budgets preempt's own victims are counted against (README "Preemption").
    ApiCall {
        group: "policy",
        resource: "poddisruptionbudgets",
        verbs: &["list", "watch"],
    },
];
/// Only with `--dra-ownership` (the default): the leader keeps its `NoSchedule`
/// DeviceTaintRule on every DRA pool that publishes devices of a `Device` object
/// (`crate::scheduler::dra_owner`).
pub const DRA_OWNERSHIP_API_CALLS: &[ApiCall] = &[ApiCall {
    group: "resource.k8s.io",
    resource: "devicetaintrules",
    verbs: &["create", "delete"],
}];
/// Only with `--gpu-share-totals=extender`: the leader merge-patches the GPU share totals into
/// a Node's `status.capacity` and `status.allocatable` (`crate::scheduler::share_totals`).
pub const SHARE_TOTALS_API_CALLS: &[ApiCall] = &[ApiCall {
    group: "",
    resource: "nodes/status",
    verbs: &["patch"],
}];
/// Only with `--leader-elect` (get, create, update) / `--follow-scheduler-lease` (get).
pub const LEADER_ELECTION_API_CALLS: &[ApiCall] = &[ApiCall {
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["get", "create", "update"],
}];
/// Only with `--requeue` (the default): the requeue signal merge-patches one annotation onto a
/// Node where capacity returned (`crate::scheduler::requeue`).
pub const REQUEUE_API_CALLS: &[ApiCall] = &[ApiCall {
    group: "",
    resource: "nodes",
    verbs: &["patch"],
}];
