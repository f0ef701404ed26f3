//! A slim Node: identity, labels and allocatable. Decoded directly by the node watcher.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::pod::ResourceList;

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Node {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: NodeStatus,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct NodeStatus {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::pod::lenient::resource_list"
    )]
    pub allocatable: Option<ResourceList>,
}

impl Node {
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata.labels.clone().unwrap_or_default()
    }
}

static_resource!(
    Node,
    kind = "Node",
    group = "",
    version = "v1",
    plural = "nodes",
    scope = kube::core::ClusterResourceScope
);
