//! Per-kind handlers: decode an API object into its compact record and apply it to the caches.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::kind::Kind;
use super::store::{Decoded, Handler, Invalid};
use crate::cluster::budgets::Budget;
use crate::cluster::devices::NodeDevices;
use crate::cluster::nominated::NominatedPod;
use crate::cluster::pod::{PodCpus, PodDevices};
use crate::cluster::{ClusterState, NodeRecord, PodRecord, TopologyRecord};
use crate::metrics::Metrics;
use crate::model::device::Device;
use crate::model::ids::PodUid;
use crate::model::node::Node;
use crate::model::nrt::NodeResourceTopology;
use crate::model::pod::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

/// Name, UID and resourceVersion, borrowed; a missing or empty name or UID makes the object
/// unusable.
fn identity(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<(&str, &str, &str), Invalid> {
    let name = meta
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(Invalid("missing metadata.name"))?;
    let uid = meta
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or(Invalid("missing metadata.uid"))?;
    let rv = meta.resource_version.as_deref().unwrap_or_default();
    Ok((name, uid, rv))
}

/// A cluster-scoped object keyed by its name.
fn decoded<R>(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    record: impl FnOnce(&str) -> R,
) -> Result<Decoded<R>, Invalid> {
    let (name, uid, rv) = identity(meta)?;
    Ok(Decoded {
        key: Arc::from(name),
        uid: Arc::from(uid),
        resource_version: rv.to_owned(),
        record: record(name),
    })
}

pub struct NodeHandler(pub Arc<ClusterState>);

impl Handler for NodeHandler {
    type Object = Node;
    type Record = NodeRecord;
    const KIND: Kind = Kind::Nodes;

    fn decode(&self, node: &Node) -> Result<Decoded<NodeRecord>, Invalid> {
        decoded(&node.metadata, |_| NodeRecord::from_node(node))
    }
    fn apply(&self, key: &str, _old: Option<&NodeRecord>, new: &NodeRecord) {
        self.0.set_node(key, Some(new.clone()));
    }
    fn remove(&self, key: &str, _old: &NodeRecord) {
        self.0.set_node(key, None);
    }
}

pub struct PodHandler {
    cluster: Arc<ClusterState>,
    metrics: Metrics,
    /// The current relist's mark ([`crate::cluster::assumed::Assumptions::relist_mark`]),
    /// 0 when no relist is open.
    relist_mark: AtomicU64,
}

impl PodHandler {
    pub fn new(cluster: Arc<ClusterState>, metrics: Metrics) -> Self {
        PodHandler {
            cluster,
            metrics,
            relist_mark: AtomicU64::new(0),
        }
    }
}

impl PodHandler {
    fn overcommitted(&self, pod: &PodRecord, over: &[(crate::model::device::DeviceType, i32)]) {
        if over.is_empty() {
            return;
        }
        let minors: Vec<String> = over.iter().map(|(t, m)| format!("{t}/{m}")).collect();
        tracing::warn!(pod = %pod.key, node = ?pod.node, minors = %minors.join(","), "pod annotations overcommit these devices: counted as used, nothing more is placed on them");
        self.metrics
            .device_problems
            .with_label_values(&["overcommitted"])
            .inc();
    }
}

impl Handler for PodHandler {
    type Object = Pod;
    /// Shared with the node's pod map: one record per pod, however many maps refer to it.
    type Record = Arc<PodRecord>;
    const KIND: Kind = Kind::Pods;

    fn decode(&self, pod: &Pod) -> Result<Decoded<Arc<PodRecord>>, Invalid> {
        let (_, _, rv) = identity(&pod.metadata)?;
        let record = PodRecord::from_pod(pod).ok_or(Invalid("missing metadata.uid"))?;
        if let PodDevices::Malformed(reason) = &record.devices {
            tracing::warn!(pod = %record.key, node = ?record.node, reason, "malformed device-allocated annotation: counting the node's devices as used");
            self.metrics
                .malformed_annotations
                .with_label_values(&["device-allocated"])
                .inc();
        }
        if let PodCpus::Malformed(reason) = &record.cpus {
            tracing::warn!(pod = %record.key, node = ?record.node, reason, "malformed resource-status annotation: the node takes no cpuset pods until it is fixed or the pod goes");
            self.metrics
                .malformed_annotations
                .with_label_values(&["resource-status"])
                .inc();
        }
        Ok(Decoded {
            key: record.key.shared(),
            uid: record.uid.shared(),
            resource_version: rv.to_owned(),
            record: Arc::new(record),
        })
    }
    fn apply(&self, _key: &str, old: Option<&Arc<PodRecord>>, new: &Arc<PodRecord>) {
        let over = self.cluster.upsert_pod_shared(old.map(|o| &**o), new);
        self.overcommitted(new, &over);
    }
    /// The first list: grouped by node (see [`ClusterState::upsert_listed_pods`]).
    fn apply_listed<'a>(&self, listed: impl Iterator<Item = (&'a str, &'a Arc<PodRecord>)>) {
        for (pod, over) in self.cluster.upsert_listed_pods(listed.map(|(_, r)| r)) {
            self.overcommitted(&pod, &over);
        }
    }
    fn remove(&self, _key: &str, old: &Arc<PodRecord>) {
        self.cluster.remove_pod(old);
    }
    fn relist_started(&self) {
        // Taken when Init arrives, before the watcher requests the list (issue 11; the
        // argument is in `cluster::assumed`). A restarted relist takes a new mark.
        self.relist_mark
            .store(self.cluster.assumptions().relist_mark(), Ordering::SeqCst);
    }
    fn relist_done(&self, listed: &mut dyn Iterator<Item = &Arc<PodRecord>>) {
        let mark = self.relist_mark.swap(0, Ordering::SeqCst);
        if mark == 0
            || self
                .cluster
                .assumptions()
                .relist_candidates(mark)
                .is_empty()
        {
            return;
        }
        let listed: HashMap<PodUid, Option<Arc<str>>> = listed
            .map(|r| (r.uid.clone(), r.holding_node().cloned()))
            .collect();
        let released = self
            .cluster
            .release_absent_at_relist(mark, |uid| listed.get(uid).cloned());
        if released > 0 {
            self.metrics
                .assumed_released
                .with_label_values(&["relist"])
                .inc_by(released as u64);
        }
    }
}

/// Pending pods with a nominated node, into [`crate::cluster::nominated::Nominations`].
///
/// A nomination that leaves a node (cleared, moved, the pod gone or bound) ends the hold filter
/// kept there for it, and filter may have refused pods for that hold (`held_for_nominated`),
/// which no fact of the node's own records as a return. So it is recorded as a capacity return
/// of every kind on that node, for the requeue signal. When the nominee itself bound there, the
/// hold became its allocation and the pods retried are refused again: one retry wasted, where
/// missing the return would leave them waiting for an unrelated event.
pub struct NominationHandler(pub Arc<ClusterState>);

impl NominationHandler {
    fn released(&self, old: Option<&Arc<NominatedPod>>, new: Option<&Arc<NominatedPod>>) {
        let Some(node) = old.and_then(|o| o.node.as_deref()) else {
            return;
        };
        if new.and_then(|n| n.node.as_deref()) != Some(node) {
            self.0
                .capacity_returns()
                .record(node, crate::cluster::returns::ResourceKinds::ALL);
        }
    }
}

impl Handler for NominationHandler {
    type Object = Pod;
    type Record = Arc<NominatedPod>;
    const KIND: Kind = Kind::NominatedPods;

    fn decode(&self, pod: &Pod) -> Result<Decoded<Arc<NominatedPod>>, Invalid> {
        let (_, _, rv) = identity(&pod.metadata)?;
        let record = NominatedPod::from_pod(pod).ok_or(Invalid("missing metadata.name"))?;
        Ok(Decoded {
            key: record.key.shared(),
            uid: record.uid.shared(),
            resource_version: rv.to_owned(),
            record: Arc::new(record),
        })
    }
    fn apply(&self, _key: &str, old: Option<&Arc<NominatedPod>>, new: &Arc<NominatedPod>) {
        self.0.nominations().set(Arc::clone(new));
        self.released(old, Some(new));
    }
    fn remove(&self, _key: &str, old: &Arc<NominatedPod>) {
        self.0.nominations().forget(&old.uid);
        self.released(Some(old), None);
    }
}

/// PodDisruptionBudgets, into [`crate::cluster::budgets::DisruptionBudgets`].
pub struct BudgetHandler(pub Arc<ClusterState>);

impl Handler for BudgetHandler {
    type Object = PodDisruptionBudget;
    type Record = Arc<Budget>;
    const KIND: Kind = Kind::PodDisruptionBudgets;

    fn decode(&self, pdb: &PodDisruptionBudget) -> Result<Decoded<Arc<Budget>>, Invalid> {
        let (_, uid, rv) = identity(&pdb.metadata)?;
        let budget = Budget::from_pdb(pdb).ok_or(Invalid("missing metadata.name"))?;
        Ok(Decoded {
            key: budget.key.shared(),
            uid: Arc::from(uid),
            resource_version: rv.to_owned(),
            record: Arc::new(budget),
        })
    }
    fn apply(&self, _key: &str, old: Option<&Arc<Budget>>, new: &Arc<Budget>) {
        if let Some(old) = old.filter(|o| o.key != new.key) {
            self.0.budgets().remove(old);
        }
        self.0.budgets().set(Arc::clone(new));
    }
    fn remove(&self, _key: &str, old: &Arc<Budget>) {
        self.0.budgets().remove(old);
    }
}

pub struct TopologyHandler {
    cluster: Arc<ClusterState>,
    metrics: Metrics,
}

impl TopologyHandler {
    pub fn new(cluster: Arc<ClusterState>, metrics: Metrics) -> Self {
        TopologyHandler { cluster, metrics }
    }
}

impl Handler for TopologyHandler {
    type Object = NodeResourceTopology;
    /// Shared with the node's state: one copy per NRT.
    type Record = Arc<TopologyRecord>;
    const KIND: Kind = Kind::NodeResourceTopologies;

    fn decode(&self, nrt: &NodeResourceTopology) -> Result<Decoded<Arc<TopologyRecord>>, Invalid> {
        decoded(&nrt.metadata, |name| {
            let record = TopologyRecord::from_nrt(nrt);
            for p in &record.cpu.problems {
                tracing::warn!(node = %name, annotation = %p.annotation, problem = p.problem, message = %p.message, "unusable NodeResourceTopology CPU data: the node takes no cpuset pods");
                self.metrics
                    .nrt_problems
                    .with_label_values(&[p.annotation.as_str(), p.problem])
                    .inc();
            }
            Arc::new(record)
        })
    }
    fn apply(&self, key: &str, _old: Option<&Arc<TopologyRecord>>, new: &Arc<TopologyRecord>) {
        self.cluster.set_topology_shared(key, Some(Arc::clone(new)));
    }
    fn remove(&self, key: &str, _old: &Arc<TopologyRecord>) {
        self.cluster.set_topology_shared(key, None);
    }
}

pub struct DeviceHandler {
    cluster: Arc<ClusterState>,
    metrics: Metrics,
}

impl DeviceHandler {
    pub fn new(cluster: Arc<ClusterState>, metrics: Metrics) -> Self {
        DeviceHandler { cluster, metrics }
    }

    /// Cluster-file Devices arrive as JSON values; undecodable ones are counted and skipped.
    pub fn decode_values(&self, values: Vec<serde_json::Value>) -> Vec<Device> {
        values
            .into_iter()
            .filter_map(|v| match serde_json::from_value::<Device>(v) {
                Ok(mut d) => {
                    super::file_source::fill_identity(&mut d.metadata, Kind::Devices);
                    Some(d)
                }
                Err(error) => {
                    tracing::warn!(%error, "ignoring undecodable Device in cluster file");
                    self.metrics
                        .invalid_objects
                        .with_label_values(&["devices", "undecodable"])
                        .inc();
                    None
                }
            })
            .collect()
    }
}

impl Handler for DeviceHandler {
    type Object = Device;
    /// Shared with the node's device ledger: one copy per Device.
    type Record = Arc<NodeDevices>;
    const KIND: Kind = Kind::Devices;

    fn decode(&self, device: &Device) -> Result<Decoded<Arc<NodeDevices>>, Invalid> {
        decoded(&device.metadata, |name| {
            let (devices, problems) = NodeDevices::from_device(device);
            for problem in &problems {
                tracing::warn!(node = %name, %problem, "ignoring bad Device entry");
                self.metrics
                    .device_problems
                    .with_label_values(&[problem.class()])
                    .inc();
            }
            Arc::new(devices)
        })
    }
    fn apply(&self, key: &str, _old: Option<&Arc<NodeDevices>>, new: &Arc<NodeDevices>) {
        let over = self.cluster.set_devices_shared(key, Some(Arc::clone(new)));
        if !over.is_empty() {
            let minors: Vec<String> = over.iter().map(|(t, m)| format!("{t}/{m}")).collect();
            tracing::warn!(node = %key, minors = %minors.join(","), "pods' annotations overcommit these devices: counted as used, nothing more is placed on them");
            self.metrics
                .device_problems
                .with_label_values(&["overcommitted"])
                .inc_by(over.len() as u64);
        }
    }
    fn remove(&self, key: &str, _old: &Arc<NodeDevices>) {
        self.cluster.set_devices_shared(key, None);
    }
}
