//! A slim Pod: identity, placement-relevant spec and phase. Decoded directly by the pod watcher.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// `ResourceList` as it appears on the wire: resource name -> quantity string.
pub type ResourceList = BTreeMap<String, String>;

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    #[serde(default, deserialize_with = "lean_meta::deserialize")]
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
    /// Pod-level resources (KEP-2837, on by default since Kubernetes 1.34): kube-scheduler takes
    /// the pod's cpu, memory and hugepages requests from here when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
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
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Set by kube-scheduler's preemption on the preemptor while its victims go: the node
    /// whose capacity is held for it (`cluster::nominated`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "nominatednodename"
    )]
    pub nominated_node_name: Option<String>,
    /// Set by kube-scheduler (PreBind, before the extender's bind) when it satisfies some of
    /// the pod's extended resources through DRA (KEP-5004): those requests are DRA's.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "extendedresourceclaimstatus"
    )]
    pub extended_resource_claim_status: Option<ExtendedResourceClaimStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtendedResourceClaimStatus {
    #[serde(default)]
    pub resource_claim_name: String,
    #[serde(default)]
    pub request_mappings: Vec<ContainerExtendedResourceRequest>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerExtendedResourceRequest {
    #[serde(default)]
    pub container_name: String,
    #[serde(default)]
    pub resource_name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch event's pod as the API server sends it: every metadata field set, and the
    /// managed fields of two managers.
    const FULL_METADATA: &str = r#"{"metadata":{
        "name":"p","generateName":"p-","namespace":"ml","uid":"u1","resourceVersion":"42",
        "generation":3,"selfLink":"/api/v1/namespaces/ml/pods/p",
        "creationTimestamp":"2026-12-07T01:00:00Z","deletionTimestamp":"2026-12-07T02:00:00Z",
        "deletionGracePeriodSeconds":30,"labels":{"app":"a"},"annotations":{"k":"v"},
        "finalizers":["f"],
        "ownerReferences":[{"apiVersion":"batch/v1","kind":"Job","name":"j","uid":"ju","controller":true}],
        "managedFields":[
          {"manager":"kubectl","operation":"Update","apiVersion":"v1","time":"2026-12-07T01:00:00Z",
           "fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:containers":{"k:{\"name\":\"main\"}":{".":{},"f:image":{}}}}}},
          {"manager":"kube-scheduler","operation":"Update","apiVersion":"v1","subresource":"status",
           "fieldsType":"FieldsV1","fieldsV1":{"f:status":{"f:conditions":{}}}}
        ]},"spec":{"containers":[]}}"#;

    #[test]
    fn metadata_decodes_as_object_meta_does_but_without_managed_fields() {
        let pod: Pod = serde_json::from_str(FULL_METADATA).unwrap();
        // The reference is k8s-openapi's own decoder of the same object.
        let full: serde_json::Value = serde_json::from_str(FULL_METADATA).unwrap();
        let mut reference: ObjectMeta = serde_json::from_value(full["metadata"].clone()).unwrap();
        assert_eq!(reference.managed_fields.as_ref().map(Vec::len), Some(2));
        reference.managed_fields = None;
        assert_eq!(pod.metadata, reference);
        // Absent and null metadata: the default, as before.
        for json in [r#"{"spec":{}}"#, r#"{"metadata":null}"#] {
            let pod: Pod = serde_json::from_str(json).unwrap();
            assert_eq!(pod.metadata, ObjectMeta::default());
        }
        // A malformed field is still an error, naming it.
        let bad = serde_json::from_str::<Pod>(r#"{"metadata":{"generation":"three"}}"#);
        assert!(bad.is_err_and(|e| e.to_string().contains("invalid type")));
    }

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
    /// The resource names kube-scheduler satisfies through DRA for this pod (KEP-5004), and
    /// the claim it created for them; `None` when it satisfies none.
    pub fn dra_extended_resources(&self) -> Option<(&str, Vec<&str>)> {
        let status = self.status.extended_resource_claim_status.as_ref()?;
        let names = status
            .request_mappings
            .iter()
            .map(|m| m.resource_name.as_str())
            .collect();
        Some((status.resource_claim_name.as_str(), names))
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

/// A pod's `metadata` without its `managedFields`: the API server sends them with every watch
/// event and list item (one entry per field manager, each a tree of the fields it owns), no
/// decision reads them, and decoding them into `ManagedFieldsEntry` values allocates for every
/// node of those trees. Every other field decodes as `ObjectMeta` itself decodes it.
pub mod lean_meta {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
    use serde::{Deserialize, Deserializer};

    /// `ObjectMeta`'s fields but `managedFields`, which serde then skips without building it.
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Lean {
        annotations: Option<BTreeMap<String, String>>,
        creation_timestamp: Option<Time>,
        deletion_grace_period_seconds: Option<i64>,
        deletion_timestamp: Option<Time>,
        finalizers: Option<Vec<String>>,
        generate_name: Option<String>,
        generation: Option<i64>,
        labels: Option<BTreeMap<String, String>>,
        name: Option<String>,
        namespace: Option<String>,
        owner_references: Option<Vec<OwnerReference>>,
        resource_version: Option<String>,
        self_link: Option<String>,
        uid: Option<String>,
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
        let m = Option::<Lean>::deserialize(d)?;
        Ok(m.map_or_else(ObjectMeta::default, |m| ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }))
    }
}

/// Quantities in hand-written YAML are often bare numbers (`nvidia.com/gpu: 1`); the API
/// server always sends strings. Accept both so a cluster file reads like `kubectl` output.
///
/// Hand-written visitors, not an untagged enum: `#[serde(untagged)]` buffers every value
/// before trying each variant, and resource lists are decoded for every container of every
/// pod at bootstrap (~9% of the service's CPU there).
pub mod lenient {
    use std::collections::BTreeMap;
    use std::fmt;

    use serde::Deserializer;
    use serde::de::{DeserializeSeed, Error, MapAccess, Visitor};

    /// A string, or a number written out as `i64`/`u64`/`f64` `to_string` does.
    struct Text;

    impl<'de> Visitor<'de> for Text {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string or a number")
        }
        fn visit_str<E: Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }
        fn visit_string<E: Error>(self, v: String) -> Result<String, E> {
            Ok(v)
        }
        fn visit_i64<E: Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }

    impl<'de> DeserializeSeed<'de> for Text {
        type Value = String;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
            d.deserialize_any(self)
        }
    }

    /// `None` for null or absent, else what `inner` makes of the value.
    struct Optional<V>(V);

    impl<'de, V: Visitor<'de>> Visitor<'de> for Optional<V> {
        type Value = Option<V::Value>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.expecting(f)?;
            f.write_str(" or null")
        }
        fn visit_none<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self.0).map(Some)
        }
    }

    /// A map of names to [`Text`] values; a repeated name keeps its last value.
    struct List;

    impl<'de> Visitor<'de> for List {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of resource names to quantities")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(name) = map.next_key::<String>()? {
                let value = map.next_value_seed(Text)?;
                out.insert(name, value);
            }
            Ok(out)
        }
    }

    pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Ok(d.deserialize_option(Optional(Text))?.unwrap_or_default())
    }

    pub fn resource_list<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<BTreeMap<String, String>>, D::Error> {
        d.deserialize_option(Optional(List))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[derive(Debug, serde::Deserialize)]
        struct R {
            #[serde(default, deserialize_with = "resource_list")]
            list: Option<BTreeMap<String, String>>,
            #[serde(default, deserialize_with = "string")]
            text: String,
        }

        fn r(json: &str) -> Result<R, String> {
            serde_json::from_str(json).map_err(|e| e.to_string())
        }

        #[test]
        fn strings_and_numbers_read_as_their_text() {
            let got = r(r#"{"list":{"cpu":"500m","gpu":1,"neg":-2,"big":18446744073709551615,"f":0.5,"cpu":"2"},"text":7}"#).unwrap();
            let want: BTreeMap<String, String> = [
                ("cpu", "2"),
                ("gpu", "1"),
                ("neg", "-2"),
                ("big", "18446744073709551615"),
                ("f", "0.5"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            assert_eq!(got.list, Some(want));
            assert_eq!(got.text, "7");
            // From a serde_json::Value too (cluster files go through one).
            let v = serde_json::json!({"list": {"gpu": 2}, "text": "x"});
            let got: R = serde_json::from_value(v).unwrap();
            assert_eq!(got.list.unwrap()["gpu"], "2");
            assert_eq!(got.text, "x");
        }

        #[test]
        fn null_and_absent_are_empty_and_other_types_are_errors() {
            let got = r(r#"{"list":null,"text":null}"#).unwrap();
            assert_eq!((got.list, got.text.as_str()), (None, ""));
            let got = r("{}").unwrap();
            assert_eq!((got.list, got.text.as_str()), (None, ""));
            for bad in [
                r#"{"list":{"cpu":true}}"#,
                r#"{"list":{"cpu":null}}"#,
                r#"{"list":{"cpu":["1"]}}"#,
                r#"{"list":["cpu"]}"#,
                r#"{"text":{"a":1}}"#,
            ] {
                assert!(r(bad).is_err(), "{bad} should be rejected");
            }
        }
    }
}
