//! The file source: a cluster file (multi-document YAML, a `kind: List`, or JSON) replayed as
//! one `Init, InitApply.., InitDone` per kind through the very same sync path as the watchers,
//! so offline runs become ready exactly the way a live bootstrap does.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::kind::Kind;
use crate::model::nrt::GROUP as NRT_GROUP;

#[derive(Debug, thiserror::Error)]
pub enum ClusterFileError {
    #[error("cannot read cluster file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cluster file {path} is not valid YAML or JSON: {message}")]
    Syntax { path: String, message: String },
    #[error("cluster file {path}: document {index} ({kind} {name:?}) is invalid: {message}")]
    Object {
        path: String,
        index: usize,
        kind: String,
        name: String,
        message: String,
    },
}

/// The objects of a cluster file, grouped by kind, in file order.
#[derive(Debug, Default)]
pub struct ClusterFile {
    pub nodes: Vec<crate::model::node::Node>,
    pub pods: Vec<crate::model::pod::Pod>,
    pub devices: Vec<Value>,
    pub topologies: Vec<crate::model::nrt::NodeResourceTopology>,
    pub device_classes: Vec<crate::model::dra::DeviceClass>,
    pub resource_slices: Vec<crate::model::dra::ResourceSlice>,
    pub resource_claims: Vec<crate::model::dra::ResourceClaim>,
    pub device_taint_rules: Vec<crate::model::dra::DeviceTaintRule>,
    pub disruption_budgets: Vec<k8s_openapi::api::policy::v1::PodDisruptionBudget>,
    /// Documents of kinds this service does not watch (kept count only, for the log).
    pub ignored: usize,
}

impl ClusterFile {
    pub fn load(path: &Path) -> Result<Self, ClusterFileError> {
        let display = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ClusterFileError::Read {
            path: display.clone(),
            source,
        })?;
        Self::parse(&text, &display)
    }

    pub fn parse(text: &str, path: &str) -> Result<Self, ClusterFileError> {
        let mut out = ClusterFile::default();
        for (i, item) in documents(text, path)?.into_iter().enumerate() {
            out.push(item, i + 1, path)?;
        }
        Ok(out)
    }

    fn push(&mut self, item: Value, index: usize, path: &str) -> Result<(), ClusterFileError> {
        let kind = item
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let api_version = item
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let name = item
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        fn typed<T: DeserializeOwned>(
            v: Value,
            index: usize,
            path: &str,
            kind: &str,
            name: &str,
        ) -> Result<T, ClusterFileError> {
            serde_json::from_value(v).map_err(|e| ClusterFileError::Object {
                path: path.to_string(),
                index,
                kind: kind.to_string(),
                name: name.to_string(),
                message: e.to_string(),
            })
        }
        match (kind.as_str(), api_version.split('/').next().unwrap_or("")) {
            ("Node", _) => self.nodes.push(typed(item, index, path, &kind, &name)?),
            ("Pod", _) => self.pods.push(typed(item, index, path, &kind, &name)?),
            ("Device", "scheduling.koordinator.sh") => self.devices.push(item),
            ("NodeResourceTopology", g) if g == NRT_GROUP => self
                .topologies
                .push(typed(item, index, path, &kind, &name)?),
            ("DeviceClass", "resource.k8s.io") => self
                .device_classes
                .push(typed(item, index, path, &kind, &name)?),
            ("ResourceSlice", "resource.k8s.io") => self
                .resource_slices
                .push(typed(item, index, path, &kind, &name)?),
            ("ResourceClaim", "resource.k8s.io") => self
                .resource_claims
                .push(typed(item, index, path, &kind, &name)?),
            ("DeviceTaintRule", "resource.k8s.io") => self
                .device_taint_rules
                .push(typed(item, index, path, &kind, &name)?),
            ("PodDisruptionBudget", "policy") => self
                .disruption_budgets
                .push(typed(item, index, path, &kind, &name)?),
            _ => self.ignored += 1,
        }
        Ok(())
    }

    pub fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Nodes => self.nodes.len(),
            Kind::Pods => self.pods.len(),
            Kind::NominatedPods => self
                .pods
                .iter()
                .filter(|p| {
                    p.node_name().is_none()
                        && p.status
                            .nominated_node_name
                            .as_deref()
                            .is_some_and(|n| !n.is_empty())
                })
                .count(),
            Kind::Devices => self.devices.len(),
            Kind::NodeResourceTopologies => self.topologies.len(),
            Kind::DeviceClasses => self.device_classes.len(),
            Kind::ResourceSlices => self.resource_slices.len(),
            Kind::ResourceClaims => self.resource_claims.len(),
            Kind::DeviceTaintRules => self.device_taint_rules.len(),
            Kind::PodDisruptionBudgets => self.disruption_budgets.len(),
        }
    }
}

/// The objects of a cluster file in file order, `kind: List` items flattened and empty
/// documents dropped: what [`ClusterFile::parse`] reads, left untyped (the `simulate` tool
/// writes them back with only the placed pods changed).
/// The YAML parser's limits for a cluster file. Its defaults (1,024 documents, 250,000 nodes,
/// a million events) guard a configuration file; a cluster file is the operator's own dump of a
/// cluster and has an object per document: 1,213 nodes with their Devices already passed the
/// document limit. Alias and anchor limits stay the parser's (they stop expansion bombs).
fn cluster_file_budget() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_documents: 10_000_000,
            max_nodes: 500_000_000,
            max_events: 1_000_000_000,
            max_total_scalar_bytes: 4 << 30,
        },
    }
}

pub fn documents(text: &str, path: &str) -> Result<Vec<Value>, ClusterFileError> {
    let docs: Vec<Value> = match serde_json::from_str::<Value>(text) {
        Ok(v) => vec![v],
        Err(_) => serde_saphyr::from_multiple_with_options::<Value>(text, cluster_file_budget())
            .map_err(|e| ClusterFileError::Syntax {
                path: path.to_string(),
                message: e.to_string(),
            })?,
    };
    let mut out = Vec::new();
    for doc in docs {
        if doc.is_null() {
            continue;
        }
        if doc
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k.ends_with("List"))
        {
            out.extend(
                doc.get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            );
        } else {
            out.push(doc);
        }
    }
    Ok(out)
}

/// Cluster files give objects no identity fields; a real API server always would. Fill in
/// a deterministic uid and resourceVersion so the sync's identity rules hold offline too.
pub fn fill_identity(
    meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    kind: Kind,
) {
    let ns = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    if meta.uid.as_deref().is_none_or(str::is_empty) {
        meta.uid = Some(format!("file-{}-{}-{}", kind.as_str(), ns, name));
    }
    if meta.resource_version.as_deref().is_none_or(str::is_empty) {
        meta.resource_version = Some("1".to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster file holds an object per document: thousands of them (the parser's default
    /// budget stopped at 1,024, so a 1,213-node cluster with its Devices could not be read).
    #[test]
    fn a_large_multi_document_cluster_file_is_read_whole() {
        let text: String = (0..3000)
            .map(|i| {
                format!(
                    "apiVersion: v1\nkind: Node\nmetadata: {{name: n{i}}}\nstatus: {{allocatable: {{cpu: '8'}}}}\n---\n"
                )
            })
            .collect();
        let file = ClusterFile::parse(&text, "big.yaml").expect("parses");
        assert_eq!(file.nodes.len(), 3000);
    }

    #[test]
    fn parses_multi_document_yaml_and_lists() {
        let text = r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {allocatable: {cpu: 64, nvidia.com/gpu: 8}}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: p1, namespace: default, uid: u1}
  spec: {nodeName: n1, containers: [{name: c, resources: {requests: {cpu: "2"}}}]}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: cm}
"#;
        let f = ClusterFile::parse(text, "t.yaml").unwrap();
        assert_eq!(f.nodes.len(), 1);
        assert_eq!(f.pods.len(), 1);
        assert_eq!(f.ignored, 1);
        let alloc = f.nodes[0].status.allocatable.as_ref().unwrap();
        assert_eq!(
            alloc["cpu"], "64",
            "bare YAML numbers are accepted as quantities"
        );
    }

    #[test]
    fn bad_objects_are_named() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: p1}\nspec: {containers: 3}\n";
        let err = ClusterFile::parse(text, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("document 1 (Pod \"p1\")"), "{err}");
        let err = ClusterFile::parse("a: [", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not valid YAML"), "{err}");
    }
}
