//! The kube-scheduler extender wire types (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go types carry no JSON tags: keys are Go field names (PascalCase) and unset fields are
//! `null`. kube-scheduler decodes case-insensitively, and so do we: every request type here
//! matches its keys ignoring ASCII case, so hand-written or lower-cased bodies work too.
//! Responses always use PascalCase and emit `null` for unset fields.
//!
//! Embedded API objects: the Pod is decoded into the slim [`Pod`]; full Nodes (nodes mode) are
//! kept as raw JSON so the response can echo them back without re-encoding.

use std::collections::BTreeMap;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::model::pod::Pod;

/// Generates a case-insensitive `Deserialize` for a struct of optional fields.
macro_rules! case_insensitive {
    ($ty:ident { $($field:ident : $fty:ty => $key:literal),* $(,)? }) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        write!(f, concat!("a ", stringify!($ty), " object"))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$ty, A::Error> {
                        let mut out = $ty::default();
                        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                            $(
                                if key.eq_ignore_ascii_case($key) {
                                    // Go decodes `null` into a zero value; so do we.
                                    out.$field = map.next_value::<Option<$fty>>()?.unwrap_or_default();
                                    continue;
                                }
                            )*
                            map.next_value::<IgnoredAny>()?;
                        }
                        Ok(out)
                    }
                }
                d.deserialize_map(V)
            }
        }
    };
}

/// Request of `filter` and `prioritize`.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs {
    pub pod: Option<Pod>,
    pub nodes: Option<NodeList>,
    pub node_names: Option<Vec<String>>,
}
case_insensitive!(ExtenderArgs {
    pod: Option<Pod> => "Pod",
    nodes: Option<NodeList> => "Nodes",
    node_names: Option<Vec<String>> => "NodeNames",
});

impl ExtenderArgs {
    /// The candidate node names, whichever mode the scheduler uses.
    pub fn candidate_names(&self) -> Vec<&str> {
        if let Some(names) = &self.node_names {
            names.iter().map(String::as_str).collect()
        } else if let Some(nodes) = &self.nodes {
            nodes.items.iter().map(|n| n.name.as_str()).collect()
        } else {
            Vec::new()
        }
    }

    /// True when the scheduler sent full Node objects (`nodeCacheCapable: false`).
    pub fn nodes_mode(&self) -> bool {
        self.node_names.is_none() && self.nodes.is_some()
    }
}

/// A `v1.NodeList` whose items are kept verbatim.
#[derive(Debug, Default)]
pub struct NodeList {
    pub metadata: Option<Box<RawValue>>,
    pub items: Vec<RawNode>,
}

/// A full Node object, kept as raw JSON, with its name extracted.
#[derive(Debug)]
pub struct RawNode {
    pub name: String,
    pub raw: Box<RawValue>,
}

impl<'de> Deserialize<'de> for RawNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Meta {
            #[serde(default)]
            name: String,
        }
        #[derive(Deserialize)]
        struct Named {
            metadata: Meta,
        }
        let raw = Box::<RawValue>::deserialize(d)?;
        let named: Named = serde_json::from_str(raw.get())
            .map_err(|e| de::Error::custom(format!("node without metadata.name: {e}")))?;
        if named.metadata.name.is_empty() {
            return Err(de::Error::custom("node with an empty metadata.name"));
        }
        Ok(RawNode {
            name: named.metadata.name,
            raw,
        })
    }
}

impl<'de> Deserialize<'de> for NodeList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Lenient {
            #[serde(default)]
            metadata: Option<Box<RawValue>>,
            #[serde(default)]
            items: Option<Vec<RawNode>>,
        }
        let l = Lenient::deserialize(d)?;
        Ok(NodeList {
            metadata: l.metadata,
            items: l.items.unwrap_or_default(),
        })
    }
}

impl Serialize for NodeList {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("NodeList", 2)?;
        match &self.metadata {
            Some(m) => st.serialize_field("metadata", m)?,
            None => st.serialize_field("metadata", &serde_json::json!({}))?,
        }
        let items: Vec<&RawValue> = self.items.iter().map(|n| n.raw.as_ref()).collect();
        st.serialize_field("items", &items)?;
        st.end()
    }
}

impl Serialize for RawNode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

/// node name -> reason.
pub type FailedNodesMap = BTreeMap<String, String>;

/// Response of `filter`.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult {
    pub nodes: Option<NodeList>,
    pub node_names: Option<Vec<String>>,
    pub failed_nodes: Option<FailedNodesMap>,
    pub failed_and_unresolvable_nodes: Option<FailedNodesMap>,
    pub error: String,
}
case_insensitive!(ExtenderFilterResult {
    nodes: Option<NodeList> => "Nodes",
    node_names: Option<Vec<String>> => "NodeNames",
    failed_nodes: Option<FailedNodesMap> => "FailedNodes",
    failed_and_unresolvable_nodes: Option<FailedNodesMap> => "FailedAndUnresolvableNodes",
    error: String => "Error",
});

impl ExtenderFilterResult {
    pub fn error(message: impl Into<String>) -> Self {
        ExtenderFilterResult {
            error: message.into(),
            ..Default::default()
        }
    }
}

/// One entry of the `prioritize` response (a bare JSON array of these).
#[derive(Debug, Default, Serialize, Clone, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    pub host: String,
    /// 0..=10; kube-scheduler multiplies it by weight × 10 without clamping.
    pub score: i64,
}
case_insensitive!(HostPriority {
    host: String => "Host",
    score: i64 => "Score",
});

/// Request of `bind`.
#[derive(Debug, Default, Serialize, Clone)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    pub node: String,
}
case_insensitive!(ExtenderBindingArgs {
    pod_name: String => "PodName",
    pod_namespace: String => "PodNamespace",
    pod_uid: String => "PodUID",
    node: String => "Node",
});

/// Response of `bind`: empty `Error` means success.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingResult {
    pub error: String,
}
case_insensitive!(ExtenderBindingResult {
    error: String => "Error",
});

/// Request of `preempt`.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderPreemptionArgs {
    pub pod: Option<Pod>,
    pub node_name_to_victims: Option<BTreeMap<String, Victims>>,
    pub node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>>,
}
case_insensitive!(ExtenderPreemptionArgs {
    pod: Option<Pod> => "Pod",
    node_name_to_victims: Option<BTreeMap<String, Victims>> => "NodeNameToVictims",
    node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>> => "NodeNameToMetaVictims",
});

/// Victims with full pods (nodes mode).
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Victims {
    pub pods: Option<Vec<Pod>>,
    #[serde(rename = "NumPDBViolations")]
    pub num_pdb_violations: i64,
}
case_insensitive!(Victims {
    pods: Option<Vec<Pod>> => "Pods",
    num_pdb_violations: i64 => "NumPDBViolations",
});

/// Victims by UID (names mode, and every response).
#[derive(Debug, Default, Serialize, Clone, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct MetaVictims {
    pub pods: Option<Vec<MetaPod>>,
    #[serde(rename = "NumPDBViolations")]
    pub num_pdb_violations: i64,
}
case_insensitive!(MetaVictims {
    pods: Option<Vec<MetaPod>> => "Pods",
    num_pdb_violations: i64 => "NumPDBViolations",
});

#[derive(Debug, Default, Serialize, Clone, PartialEq, Eq)]
pub struct MetaPod {
    #[serde(rename = "UID")]
    pub uid: String,
}
case_insensitive!(MetaPod {
    uid: String => "UID",
});

/// Response of `preempt`: always the Meta form.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderPreemptionResult {
    pub node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>>,
}
case_insensitive!(ExtenderPreemptionResult {
    node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>> => "NodeNameToMetaVictims",
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_mode_round_trip_and_any_case() {
        let body = r#"{"Pod":{"metadata":{"name":"p","namespace":"ns","uid":"u"}},"Nodes":null,"NodeNames":["a","b"]}"#;
        let args: ExtenderArgs = serde_json::from_str(body).unwrap();
        assert_eq!(args.candidate_names(), vec!["a", "b"]);
        let lower: ExtenderArgs = serde_json::from_str(&body.to_lowercase()).unwrap();
        assert_eq!(lower.candidate_names(), vec!["a", "b"]);
        let camel: ExtenderArgs = serde_json::from_str(r#"{"pod":{},"nodeNames":["x"]}"#).unwrap();
        assert_eq!(camel.candidate_names(), vec!["x"]);
    }

    #[test]
    fn filter_result_is_pascal_case_with_nulls() {
        let r = ExtenderFilterResult::error("boom");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"Nodes":null,"NodeNames":null,"FailedNodes":null,
                "FailedAndUnresolvableNodes":null,"Error":"boom"})
        );
    }

    #[test]
    fn nodes_mode_echoes_raw_nodes() {
        let body = r#"{"Pod":{},"Nodes":{"metadata":{},"items":[{"metadata":{"name":"n1","labels":{"a":"b"}},"status":{"capacity":{"cpu":"4"}}}]},"NodeNames":null}"#;
        let args: ExtenderArgs = serde_json::from_str(body).unwrap();
        assert!(args.nodes_mode());
        let nodes = args.nodes.unwrap();
        let out = serde_json::to_value(&nodes).unwrap();
        assert_eq!(out["items"][0]["status"]["capacity"]["cpu"], "4");
    }

    proptest::proptest! {
        /// No body, however odd, panics a decoder: it parses or it is an error.
        #[test]
        fn decoding_never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..256),
                                 text in ".{0,200}") {
            for input in [&body[..], text.as_bytes()] {
                let _ = serde_json::from_slice::<ExtenderArgs>(input);
                let _ = serde_json::from_slice::<ExtenderBindingArgs>(input);
                let _ = serde_json::from_slice::<ExtenderPreemptionArgs>(input);
            }
        }

        /// Arbitrary JSON documents with the right top-level keys never panic either.
        #[test]
        fn decoding_json_values_never_panics(v in arb_json()) {
            for key in ["Pod", "NodeNames", "Nodes", "NodeNameToVictims", "NodeNameToMetaVictims", "PodUID"] {
                let doc = serde_json::json!({ key: v.clone() }).to_string();
                let _ = serde_json::from_str::<ExtenderArgs>(&doc);
                let _ = serde_json::from_str::<ExtenderBindingArgs>(&doc);
                let _ = serde_json::from_str::<ExtenderPreemptionArgs>(&doc);
            }
        }
    }

    fn arb_json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            ".{0,8}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("[a-zA-Z]{1,10}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn wrong_shapes_are_errors_not_panics() {
        assert!(serde_json::from_str::<ExtenderArgs>(r#"{"NodeNames": "a"}"#).is_err());
        assert!(serde_json::from_str::<ExtenderArgs>(r#"[1,2]"#).is_err());
        assert!(
            serde_json::from_str::<ExtenderArgs>(r#"{"Nodes":{"items":[{"metadata":{}}]}}"#)
                .is_err()
        );
        assert!(serde_json::from_str::<ExtenderBindingArgs>(r#"{"PodName": 3}"#).is_err());
        let nulls: ExtenderBindingArgs =
            serde_json::from_str(r#"{"PodName":"p","PodNamespace":null,"PodUID":"u","Node":"n"}"#)
                .unwrap();
        assert_eq!(
            nulls.pod_namespace, "",
            "null decodes to the zero value as in Go"
        );
    }
}
