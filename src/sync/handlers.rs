//! Per-kind handlers: decode an API object into its compact record and apply it to the caches.

use std::sync::Arc;

use super::kind::Kind;
use super::store::{Decoded, Handler, Invalid};
use crate::cluster::{ClusterState, NodeRecord, PodRecord, TopologyRecord};
use crate::model::node::Node;
use crate::model::nrt::NodeResourceTopology;
use crate::model::pod::Pod;

fn identity(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<(String, String, String), Invalid> {
    let name = meta
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or(Invalid("missing metadata.name"))?;
    let uid = meta
        .uid
        .clone()
        .filter(|u| !u.is_empty())
        .ok_or(Invalid("missing metadata.uid"))?;
    let rv = meta.resource_version.clone().unwrap_or_default();
    Ok((name, uid, rv))
}

pub struct NodeHandler(pub Arc<ClusterState>);

impl Handler for NodeHandler {
    type Object = Node;
    type Record = NodeRecord;
    const KIND: Kind = Kind::Nodes;

    fn decode(&self, node: &Node) -> Result<Decoded<NodeRecord>, Invalid> {
        let (name, uid, rv) = identity(&node.metadata)?;
        Ok(Decoded {
            key: name,
            uid,
            resource_version: rv,
            record: NodeRecord::from_node(node),
        })
    }
    fn apply(&self, key: &str, _old: Option<&NodeRecord>, new: &NodeRecord) {
        self.0.set_node(key, Some(new.clone()));
    }
    fn remove(&self, key: &str, _old: &NodeRecord) {
        self.0.set_node(key, None);
    }
}

pub struct PodHandler(pub Arc<ClusterState>);

impl Handler for PodHandler {
    type Object = Pod;
    type Record = PodRecord;
    const KIND: Kind = Kind::Pods;

    fn decode(&self, pod: &Pod) -> Result<Decoded<PodRecord>, Invalid> {
        let (_, uid, rv) = identity(&pod.metadata)?;
        let record = PodRecord::from_pod(pod).ok_or(Invalid("missing metadata.uid"))?;
        Ok(Decoded {
            key: record.key.to_string(),
            uid,
            resource_version: rv,
            record,
        })
    }
    fn apply(&self, _key: &str, old: Option<&PodRecord>, new: &PodRecord) {
        self.0.upsert_pod(old, new);
    }
    fn remove(&self, _key: &str, old: &PodRecord) {
        self.0.remove_pod(old);
    }
}

pub struct TopologyHandler(pub Arc<ClusterState>);

impl Handler for TopologyHandler {
    type Object = NodeResourceTopology;
    type Record = TopologyRecord;
    const KIND: Kind = Kind::NodeResourceTopologies;

    fn decode(&self, nrt: &NodeResourceTopology) -> Result<Decoded<TopologyRecord>, Invalid> {
        let (name, uid, rv) = identity(&nrt.metadata)?;
        Ok(Decoded {
            key: name,
            uid,
            resource_version: rv,
            record: TopologyRecord::from_nrt(nrt),
        })
    }
    fn apply(&self, key: &str, _old: Option<&TopologyRecord>, new: &TopologyRecord) {
        self.0.set_topology(key, Some(new.clone()));
    }
    fn remove(&self, key: &str, _old: &TopologyRecord) {
        self.0.set_topology(key, None);
    }
}

/// Temporary Device object until the device model lands: metadata plus the raw spec.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
pub struct RawDevice {
    #[serde(default)]
    pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    #[serde(default)]
    pub spec: serde_json::Value,
}

impl kube::Resource for RawDevice {
    type DynamicType = ();
    type Scope = kube::core::ClusterResourceScope;
    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Device".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "scheduling.koordinator.sh".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1alpha1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "devices".into()
    }
    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &mut self.metadata
    }
}

pub struct DeviceHandler {
    cluster: Arc<ClusterState>,
    metrics: crate::metrics::Metrics,
}

impl DeviceHandler {
    pub fn new(cluster: Arc<ClusterState>, metrics: crate::metrics::Metrics) -> Self {
        DeviceHandler { cluster, metrics }
    }

    /// Cluster-file Devices arrive as JSON values; undecodable ones are counted and skipped.
    pub fn decode_values(&self, values: Vec<serde_json::Value>) -> Vec<RawDevice> {
        values
            .into_iter()
            .filter_map(|v| match serde_json::from_value::<RawDevice>(v) {
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
    type Object = RawDevice;
    type Record = serde_json::Value;
    const KIND: Kind = Kind::Devices;

    fn decode(&self, d: &RawDevice) -> Result<Decoded<serde_json::Value>, Invalid> {
        let (name, uid, rv) = identity(&d.metadata)?;
        Ok(Decoded {
            key: name,
            uid,
            resource_version: rv,
            record: d.spec.clone(),
        })
    }
    fn apply(&self, key: &str, _old: Option<&serde_json::Value>, new: &serde_json::Value) {
        self.cluster.set_device_spec(key, Some(new.clone()));
    }
    fn remove(&self, key: &str, _old: &serde_json::Value) {
        self.cluster.set_device_spec(key, None);
    }
}
