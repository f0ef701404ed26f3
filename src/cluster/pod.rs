//! The compact pod record the caches keep instead of whole Pod objects.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::cpus::CpuAllocation;
use crate::model::annotations::{DEVICE_ALLOCATED, RESOURCE_STATUS};
use crate::model::device::DeviceAllocations;
use crate::model::ids::{ObjectKey, PodUid};
use crate::model::koord_cpu::{RESOURCE_SPEC, ResourceStatus, parse_resource_spec};
use crate::model::pod::Pod;
use crate::model::requests::{PodRequests, pod_requests_compact};
use crate::model::resource_names::ResourceNameSet;
use crate::model::resource_names::managed;
use crate::placement::cpu::CpuExclusivePolicy;
use crate::placement::device::pod_device_request;
use crate::placement::device::request::PodDeviceRequest;

fn serialize_requests<S: serde::Serializer>(r: &PodRequests, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(r.len()))?;
    for (k, v) in r.iter() {
        map.serialize_entry(k, &v.to_string())?;
    }
    map.end()
}

/// Everything the caches need to know about one pod: identity, placement, and the raw
/// allocation annotations it carries (parsed lazily by the ledgers that own their meaning).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PodRecord {
    pub uid: PodUid,
    pub key: ObjectKey,
    /// `spec.nodeName`, if assigned.
    pub node: Option<Arc<str>>,
    pub phase: Option<String>,
    /// Effective pod requests (Kubernetes `PodRequests`); empty when the spec's quantities are
    /// invalid (the API server never admits such pods).
    #[serde(
        serialize_with = "serialize_requests",
        skip_serializing_if = "PodRequests::is_empty"
    )]
    pub requests: PodRequests,
    /// The parsed `device-allocated` annotation.
    pub devices: PodDevices,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_status: Option<String>,
    /// The parsed `resource-status` (what the CPU ledger records).
    #[serde(skip)]
    pub cpus: PodCpus,
    /// `spec.priority` (0 when unset, as kube-scheduler reads it): who may be a preemption
    /// victim of whom.
    #[serde(skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// `metadata.labels`, kept only for a pod that holds devices or CPUs here (the only pods
    /// `preempt` may name as its own victims), for the PodDisruptionBudgets covering it
    /// (`super::budgets`); empty for every other pod, which costs nothing.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

impl PodRecord {
    pub fn from_pod(pod: &Pod) -> Option<Self> {
        let meta = &pod.metadata;
        let uid = meta.uid.as_deref().filter(|u| !u.is_empty())?;
        let name = meta.name.as_deref()?;
        let namespace = meta.namespace.as_deref().unwrap_or("default");
        let devices = PodDevices::of_pod(pod);
        let cpus = PodCpus::from_pod(pod);
        let holds = !matches!(devices, PodDevices::None) || !matches!(cpus, PodCpus::None);
        Some(PodRecord {
            uid: PodUid::new(uid),
            key: ObjectKey::namespaced(namespace, name),
            node: pod.node_name().map(Arc::from),
            phase: pod.status.phase.clone(),
            requests: pod_requests_compact(&pod.spec).unwrap_or_default(),
            devices,
            resource_status: pod.annotation(RESOURCE_STATUS).map(str::to_owned),
            cpus,
            priority: pod.spec.priority.unwrap_or(0),
            labels: match (&meta.labels, holds) {
                (Some(labels), true) => labels.clone(),
                _ => BTreeMap::new(),
            },
        })
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    /// The node this pod holds resources on: assigned and not terminal.
    pub fn holding_node(&self) -> Option<&Arc<str>> {
        if self.is_terminal() {
            None
        } else {
            self.node.as_ref()
        }
    }
}

/// What a pod's `scheduling.koordinator.sh/device-allocated` annotation says it holds.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum PodDevices {
    /// No annotation, or one that allocates nothing (and no managed device request if bound).
    #[default]
    None,
    Allocated(DeviceAllocations),
    /// Unparseable: counted conservatively by the ledger, never silently free.
    Malformed(String),
    /// Bound, asks for managed devices, and carries no annotation: a pod that preset
    /// `spec.nodeName` or that another scheduler bound. It holds devices nobody recorded; the
    /// ledger counts that much capacity as held, of unknown identity (issue 36 §4).
    Unannotated(Arc<PodDeviceRequest>),
}

impl PodDevices {
    /// From the annotation; a bound pod without one that asks for managed devices is
    /// [`PodDevices::Unannotated`]. Most pods name no managed resource: they are told apart by
    /// a look at their request names, without parsing a device request.
    pub fn of_pod(pod: &Pod) -> Self {
        let annotation = pod.annotation(DEVICE_ALLOCATED);
        let from_annotation = Self::from_annotation(annotation);
        if annotation.is_some() || pod.node_name().is_none() {
            return from_annotation;
        }
        let names_a_device = pod
            .spec
            .containers
            .iter()
            .chain(&pod.spec.init_containers)
            .flat_map(|c| c.resources.requests.iter().chain(c.resources.limits.iter()))
            .flat_map(|list| list.keys())
            .any(|name| managed(name).is_some());
        if !names_a_device {
            return from_annotation;
        }
        // A request that does not parse holds nothing koordlet would enforce: as before.
        match pod_device_request(pod) {
            // kube-scheduler served its requests through DRA (KEP-5004): its claim holds the
            // devices, and the DRA join counts them. Served only in part: counted whole here
            // too (never less than it holds).
            Ok(Some(req))
                if pod
                    .dra_extended_resources()
                    .is_some_and(|(_, names)| ResourceNameSet::of(names).covers(req.asked)) =>
            {
                from_annotation
            }
            Ok(Some(req)) => PodDevices::Unannotated(Arc::new(req)),
            _ => from_annotation,
        }
    }

    pub fn from_annotation(value: Option<&str>) -> Self {
        match value {
            None => PodDevices::None,
            Some(v) => match DeviceAllocations::parse_annotation(v) {
                Ok(a) if a.is_empty() => PodDevices::None,
                Ok(a) => PodDevices::Allocated(a),
                Err(e) => PodDevices::Malformed(e.to_string()),
            },
        }
    }
}

impl Serialize for PodDevices {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PodDevices::None => s.serialize_none(),
            PodDevices::Allocated(a) => s.serialize_str(&a.to_annotation()),
            PodDevices::Malformed(e) => s.serialize_str(&format!("malformed: {e}")),
            PodDevices::Unannotated(_) => s.serialize_str("unknown identity: no annotation"),
        }
    }
}

/// What a pod's `scheduling.koordinator.sh/resource-status` says it holds.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum PodCpus {
    /// No annotation, or one that binds nothing.
    #[default]
    None,
    /// Boxed: most pods hold no cpuset, and records are kept for every pod.
    Allocated(Box<CpuAllocation>),
    /// Unparseable: the node takes no cpuset pods until it is fixed or the pod goes.
    Malformed(String),
}

impl PodCpus {
    pub fn from_pod(pod: &Pod) -> Self {
        let Some(v) = pod.annotation(RESOURCE_STATUS) else {
            return PodCpus::None;
        };
        match ResourceStatus::parse(v) {
            Ok(s) if s.is_empty() => PodCpus::None,
            Ok(s) => {
                // The exclusivity a cpuset was allocated with lives in the pod's resource-spec;
                // an unparseable spec only loses the exclusivity, never the CPUs held.
                let exclusive = pod
                    .annotation(RESOURCE_SPEC)
                    .and_then(|s| parse_resource_spec(s).ok())
                    .map_or(CpuExclusivePolicy::None, |s| s.exclusive);
                PodCpus::Allocated(Box::new(CpuAllocation {
                    cpuset: s.cpuset,
                    numa: s.numa,
                    exclusive,
                }))
            }
            Err(e) => PodCpus::Malformed(e.to_string()),
        }
    }
}
