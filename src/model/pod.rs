//! A slim Pod: identity, placement-relevant spec and phase. Decoded directly by the pod watcher.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// `ResourceList` as it appears on the wire: resource name -> quantity string.
pub type ResourceList = BTreeMap<String, String>;

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodSpec,
    #[serde(default)]
    pub status: PodStatus,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    // Aliases: Go decodes JSON keys case-insensitively, so lower-cased bodies (which
    // kube-scheduler's own compatibility test produces) must mean the same.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "nodename")]
    pub node_name: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "schedulername"
    )]
    pub scheduler_name: Option<String>,
    #[serde(default)]
    pub containers: Vec<Container>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        alias = "initcontainers"
    )]
    pub init_containers: Vec<Container>,
    /// Pod overhead (RuntimeClass); added to the pod's requests as Kubernetes does.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::resource_list"
    )]
    pub overhead: Option<ResourceList>,
    /// Pod priority; koordinator's priority class falls back to its range (CPU binding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub resources: ResourceRequirements,
    /// `Always` on an init container marks a restartable sidecar (KEP-753).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "restartpolicy"
    )]
    pub restart_policy: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ResourceRequirements {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::resource_list"
    )]
    pub requests: Option<ResourceList>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::resource_list"
    )]
    pub limits: Option<ResourceList>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct PodStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_cased_multi_word_keys_decode_like_go() {
        let pod: Pod = serde_json::from_str(
            r#"{"metadata":{"name":"p"},"spec":{"nodename":"n1","initcontainers":[{"name":"i","restartpolicy":"Always"}],"containers":[]}}"#,
        )
        .unwrap();
        assert_eq!(pod.node_name(), Some("n1"));
        assert_eq!(
            pod.spec.init_containers[0].restart_policy.as_deref(),
            Some("Always")
        );
    }
}

impl Pod {
    pub fn is_terminal(&self) -> bool {
        matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
    pub fn node_name(&self) -> Option<&str> {
        self.spec.node_name.as_deref().filter(|n| !n.is_empty())
    }
    pub fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
}

static_resource!(
    Pod,
    kind = "Pod",
    group = "",
    version = "v1",
    plural = "pods",
    scope = kube::core::NamespaceResourceScope
);

/// Quantities in hand-written YAML are often bare numbers (`nvidia.com/gpu: 1`); the API
/// server always sends strings. Accept both so a cluster file reads like `kubectl` output.
pub mod lenient {
    use serde::{Deserialize, Deserializer};
    use std::collections::BTreeMap;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum StrOrNum {
        S(String),
        I(i64),
        U(u64),
        F(f64),
    }

    impl StrOrNum {
        fn into_string(self) -> String {
            match self {
                StrOrNum::S(s) => s,
                StrOrNum::I(i) => i.to_string(),
                StrOrNum::U(u) => u.to_string(),
                StrOrNum::F(f) => f.to_string(),
            }
        }
    }

    pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Ok(Option::<StrOrNum>::deserialize(d)?
            .map(StrOrNum::into_string)
            .unwrap_or_default())
    }

    pub fn resource_list<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<BTreeMap<String, String>>, D::Error> {
        let m = Option::<BTreeMap<String, StrOrNum>>::deserialize(d)?;
        Ok(m.map(|m| m.into_iter().map(|(k, v)| (k, v.into_string())).collect()))
    }
}
