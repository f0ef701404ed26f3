//! A slim `NodeResourceTopology` (topology.node.k8s.io, v1alpha2 with v1alpha1 fallback).
//!
//! NUMA placement comes in a later issue; this keeps what it will need: zones with their CPU
//! resources, the policies, and koordinator's CPU-topology annotations, verbatim.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "topology.node.k8s.io";

/// Which served version the NRT watcher uses; chosen by discovery at startup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NrtVersion {
    #[default]
    V1alpha2,
    V1alpha1,
}

impl NrtVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            NrtVersion::V1alpha2 => "v1alpha2",
            NrtVersion::V1alpha1 => "v1alpha1",
        }
    }
    pub fn api_version(self) -> String {
        format!("{GROUP}/{}", self.as_str())
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeResourceTopology {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub zones: Vec<Zone>,
    /// v1alpha1 only; v1alpha2 moved policies into `attributes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_policies: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<Attribute>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Zone {
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "type")]
    pub zone_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ZoneResource>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub costs: Vec<Cost>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ZoneResource {
    #[serde(default)]
    pub name: String,
    #[serde(default, deserialize_with = "super::pod::lenient::string")]
    pub capacity: String,
    #[serde(default, deserialize_with = "super::pod::lenient::string")]
    pub allocatable: String,
    #[serde(default, deserialize_with = "super::pod::lenient::string")]
    pub available: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Cost {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: i64,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Attribute {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: String,
}

impl kube::Resource for NodeResourceTopology {
    type DynamicType = NrtVersion;
    type Scope = kube::core::ClusterResourceScope;

    fn kind(_: &NrtVersion) -> Cow<'_, str> {
        "NodeResourceTopology".into()
    }
    fn group(_: &NrtVersion) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(v: &NrtVersion) -> Cow<'_, str> {
        v.as_str().into()
    }
    fn plural(_: &NrtVersion) -> Cow<'_, str> {
        "noderesourcetopologies".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
