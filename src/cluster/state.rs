//! Cluster state: one entry per node behind its own lock, created lazily by whichever object
//! names the node first (a pod can arrive before its Node, Device or NRT).
//!
//! This module owns the per-node locks and the rule for moving a pod's recorded contribution
//! between nodes. It never talks to the network and never decides placement.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::RwLock;
use serde::Serialize;

use super::devices::{DeviceLedger, EntryState, NodeDevices, RecordedAllocation};
use super::pod::{PodDevices, PodRecord};
use crate::model::ids::PodUid;
use crate::model::node::Node;
use crate::model::nrt::{Attribute, NodeResourceTopology, Zone};
use crate::model::pod::ResourceList;

/// What the caches keep of a Node object.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NodeRecord {
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub allocatable: ResourceList,
}

impl NodeRecord {
    pub fn from_node(node: &Node) -> Self {
        NodeRecord {
            uid: node.metadata.uid.clone().unwrap_or_default(),
            labels: node.labels(),
            allocatable: node.status.allocatable.clone().unwrap_or_default(),
        }
    }
}

/// What the caches keep of a NodeResourceTopology: zones, policies and koordinator's CPU
/// topology annotations (verbatim; NUMA placement parses them).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TopologyRecord {
    pub zones: Vec<Zone>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<Attribute>,
    /// `node.koordinator.sh/*` and `kubelet.koordinator.sh/*` annotations.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub koordinator_annotations: BTreeMap<String, String>,
}

impl TopologyRecord {
    pub fn from_nrt(nrt: &NodeResourceTopology) -> Self {
        let koordinator_annotations = nrt
            .metadata
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| {
                k.starts_with("node.koordinator.sh/") || k.starts_with("kubelet.koordinator.sh/")
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        TopologyRecord {
            zones: nrt.zones.clone(),
            policies: nrt.topology_policies.clone(),
            attributes: nrt.attributes.clone(),
            koordinator_annotations,
        }
    }
}

/// Everything known about one node. Guarded by the node's own lock.
#[derive(Debug, Default, Serialize)]
pub struct NodeState {
    /// The Node object; `None` until it arrives or after it is deleted.
    pub node: Option<NodeRecord>,
    pub topology: Option<TopologyRecord>,
    /// Device totals (from the Device object) and who holds what (by pod UID).
    #[serde(skip)]
    pub devices: DeviceLedger,
    /// Assigned, non-terminal pods on this node, by UID. The records are shared with the pod
    /// sync's store (one copy per pod).
    pub pods: BTreeMap<PodUid, Arc<PodRecord>>,
}

impl NodeState {
    /// Everything known about the node as JSON, ledger included (for `/debug/nodes`).
    pub fn debug_json(&self, now: std::time::Instant) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = v.as_object_mut() {
            map.insert(
                "devices".into(),
                serde_json::to_value(self.devices.debug_view(now)).unwrap_or_default(),
            );
        }
        v
    }

    fn is_empty(&self) -> bool {
        self.node.is_none()
            && self.topology.is_none()
            && self.devices.devices().is_none()
            && self.devices.is_empty()
            && self.pods.is_empty()
    }
}

#[derive(Debug)]
pub struct NodeEntry {
    pub name: Arc<str>,
    state: RwLock<NodeState>,
}

impl NodeEntry {
    pub fn read(&self) -> parking_lot::RwLockReadGuard<'_, NodeState> {
        self.state.read()
    }
    pub fn write(&self) -> parking_lot::RwLockWriteGuard<'_, NodeState> {
        self.state.write()
    }
}

/// The shared cache. Cloning the `Arc<ClusterState>` is how every component sees it.
#[derive(Debug, Default)]
pub struct ClusterState {
    /// Looked up once per pod event: a fast (randomly seeded) hasher, not SipHash.
    nodes: RwLock<HashMap<Arc<str>, Arc<NodeEntry>, ahash::RandomState>>,
}

impl ClusterState {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn node(&self, name: &str) -> Option<Arc<NodeEntry>> {
        self.nodes.read().get(name).cloned()
    }

    /// Atomic get-or-create (koordinator #1182: two racing creators must not lose updates).
    pub fn node_or_create(&self, name: &str) -> Arc<NodeEntry> {
        if let Some(entry) = self.node(name) {
            return entry;
        }
        let mut nodes = self.nodes.write();
        nodes
            .entry(Arc::from(name))
            .or_insert_with(|| {
                Arc::new(NodeEntry {
                    name: Arc::from(name),
                    state: RwLock::new(NodeState::default()),
                })
            })
            .clone()
    }

    pub fn node_names(&self) -> Vec<Arc<str>> {
        let mut names: Vec<_> = self.nodes.read().keys().cloned().collect();
        names.sort();
        names
    }

    pub fn node_count(&self) -> usize {
        self.nodes.read().len()
    }

    /// Drops a node entry once nothing refers to it any more.
    fn gc(&self, name: &str) {
        let mut nodes = self.nodes.write();
        if let Some(entry) = nodes.get(name)
            && entry.read().is_empty()
        {
            nodes.remove(name);
        }
    }

    pub fn set_node(&self, name: &str, node: Option<NodeRecord>) {
        let removed = node.is_none();
        self.with_node(name, |s| s.node = node);
        if removed {
            self.gc(name);
        }
    }

    pub fn set_topology(&self, name: &str, topology: Option<TopologyRecord>) {
        let removed = topology.is_none();
        self.with_node(name, |s| s.topology = topology);
        if removed {
            self.gc(name);
        }
    }

    /// Sets a node's devices from its Device object; `None` when the object is deleted, which
    /// leaves nothing allocatable but keeps what pods hold (koordinator #1186).
    pub fn set_devices(&self, name: &str, devices: Option<NodeDevices>) {
        let removed = devices.is_none();
        self.with_node(name, |s| s.devices.set_devices(devices));
        if removed {
            self.gc(name);
        }
    }

    /// Deterministic JSON of every node (no timings), for comparing caches in tests.
    pub fn snapshot(&self) -> BTreeMap<String, serde_json::Value> {
        let entries: Vec<_> = self.nodes.read().values().cloned().collect();
        let mut out = BTreeMap::new();
        for entry in entries {
            let state = entry.read();
            let mut v = state.debug_json(std::time::Instant::now());
            if let Some(entries) = v
                .pointer_mut("/devices/entries")
                .and_then(|e| e.as_object_mut())
            {
                for e in entries.values_mut() {
                    if let Some(o) = e.as_object_mut() {
                        o.remove("assumed_for_ms");
                    }
                }
            }
            out.insert(entry.name.to_string(), v);
        }
        out
    }

    fn with_node<R>(&self, name: &str, f: impl FnOnce(&mut NodeState) -> R) -> R {
        let entry = self.node_or_create(name);
        let mut state = entry.write();
        f(&mut state)
    }

    /// Applies a pod add or update. `old` is the record the pod sync recorded for this key,
    /// which is what gets undone: never the pod's current annotations.
    pub fn upsert_pod(&self, old: Option<&PodRecord>, new: &PodRecord) {
        self.upsert_pod_shared(old, &Arc::new(new.clone()));
    }

    /// [`Self::upsert_pod`] keeping `new` itself (not a copy) in the node's pod map.
    pub fn upsert_pod_shared(&self, old: Option<&PodRecord>, new: &Arc<PodRecord>) {
        if let Some(old) = old {
            let same_holder = old.uid == new.uid && old.holding_node() == new.holding_node();
            if !same_holder {
                self.remove_pod(old);
            }
        }
        if let Some(node) = new.holding_node() {
            self.with_node(node, |s| {
                s.pods.insert(new.uid.clone(), Arc::clone(new));
                // The watch confirms what the pod holds: this replaces any assumed entry.
                match &new.devices {
                    PodDevices::None => {
                        s.devices.remove(&new.uid);
                    }
                    PodDevices::Allocated(a) => {
                        s.devices.record(
                            new.uid.clone(),
                            RecordedAllocation::Allocated(a.clone()),
                            EntryState::Committed,
                        );
                    }
                    PodDevices::Malformed(reason) => {
                        s.devices.record(
                            new.uid.clone(),
                            RecordedAllocation::Malformed {
                                reason: reason.clone(),
                            },
                            EntryState::Committed,
                        );
                    }
                }
            });
        }
    }

    /// Undoes exactly what was recorded for `old`.
    pub fn remove_pod(&self, old: &PodRecord) {
        if let Some(node) = old.holding_node() {
            if let Some(entry) = self.node(node) {
                let mut s = entry.write();
                s.pods.remove(&old.uid);
                s.devices.remove(&old.uid);
            }
            self.gc(node);
        }
    }
}
