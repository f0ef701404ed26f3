//! The kube-scheduler extender wire types (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go types carry no JSON tags: keys are Go field names (PascalCase) and unset fields are
//! `null`. kube-scheduler decodes case-insensitively, and so do we: every request type here
//! matches its keys ignoring ASCII case, so hand-written or lower-cased bodies work too.
//! Responses always use PascalCase and emit `null` for unset fields.
//!
//! Embedded API objects: the Pod is decoded into the slim [`Pod`]; full Nodes (nodes mode) are
//! kept as raw JSON so the response can echo them back without re-encoding.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::model::pod::Pod;

/// Generates a case-insensitive `Deserialize` for a struct of optional fields (with at most
/// one lifetime parameter, whose `Cow` fields then decode owned).
macro_rules! case_insensitive {
    ($ty:ident $(< $lt:lifetime >)? { $($field:ident : $fty:ty => $key:literal),* $(,)? }) => {
        impl<'de $(: $lt, $lt)?> Deserialize<'de> for $ty $(< $lt >)? {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V $(< $lt >)? (std::marker::PhantomData<($(&$lt (),)?)>);
                impl<'de $(: $lt, $lt)?> Visitor<'de> for V $(< $lt >)? {
                    type Value = $ty $(< $lt >)?;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        write!(f, concat!("a ", stringify!($ty), " object"))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                        let mut out = <$ty $(< $lt >)?>::default();
                        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
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
                d.deserialize_map(V(std::marker::PhantomData))
            }
        }
    };
}

/// Request of `filter` and `prioritize`. `N` is how a node name is held: owned `String`s by
/// default, or, as the service decodes it ([`ExtenderArgsRef`]), `Cow`s borrowing from the
/// request body.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs<N = String> {
    pub pod: Option<Pod>,
    pub nodes: Option<NodeList>,
    pub node_names: Option<Vec<N>>,
}

/// The request as the service decodes it: in names mode each of the (up to thousands of) node
/// names is a slice of the request body, not an allocation of its own; only a name with JSON
/// escapes, which needs unescaping, is owned.
pub type ExtenderArgsRef<'a> = ExtenderArgs<Cow<'a, str>>;

/// How a decoded node name is held: owned, or borrowed from the input (`'de`) when possible.
pub trait NodeName<'de>: AsRef<str> {
    /// From the name as decoded: borrowed unless it had escapes.
    fn from_decoded(name: Cow<'de, str>) -> Self;
}

impl<'de> NodeName<'de> for String {
    fn from_decoded(name: Cow<'de, str>) -> Self {
        name.into_owned()
    }
}

impl<'de: 'a, 'a> NodeName<'de> for Cow<'a, str> {
    fn from_decoded(name: Cow<'de, str>) -> Self {
        name
    }
}

/// As `case_insensitive!` would generate it, except that `NodeNames` may borrow.
impl<'de, N: NodeName<'de>> Deserialize<'de> for ExtenderArgs<N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<N>(PhantomData<N>);
        impl<'de, N: NodeName<'de>> Visitor<'de> for V<N> {
            type Value = ExtenderArgs<N>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a ExtenderArgs object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = ExtenderArgs {
                    pod: None,
                    nodes: None,
                    node_names: None,
                };
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    // Go decodes `null` into a zero value; so do we.
                    if key.eq_ignore_ascii_case("Pod") {
                        out.pod = map.next_value::<Option<Pod>>()?;
                    } else if key.eq_ignore_ascii_case("Nodes") {
                        out.nodes = map.next_value::<Option<NodeList>>()?;
                    } else if key.eq_ignore_ascii_case("NodeNames") {
                        out.node_names = map.next_value::<Option<Names<N>>>()?.map(|n| n.0);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// A JSON array of strings, each borrowed from the input when it has no escapes.
struct Names<N>(Vec<N>);

impl<'de, N: NodeName<'de>> Deserialize<'de> for Names<N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<N>(PhantomData<N>);
        impl<'de, N: NodeName<'de>> Visitor<'de> for V<N> {
            type Value = Names<N>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // As serde's own `Vec`: trust a size hint only so far.
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(Name(name)) = seq.next_element()? {
                    out.push(N::from_decoded(name));
                }
                Ok(Names(out))
            }
        }
        d.deserialize_seq(V(PhantomData))
    }
}

/// One string, borrowed from the input when it has no escapes.
struct Name<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Name(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

impl<N: AsRef<str>> ExtenderArgs<N> {
    /// The candidate node names, whichever mode the scheduler uses.
    pub fn candidate_names(&self) -> Vec<&str> {
        if let Some(names) = &self.node_names {
            names.iter().map(AsRef::as_ref).collect()
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

impl<'a> ExtenderArgsRef<'a> {
    /// Takes the candidate node names out of the request, whichever mode the scheduler uses:
    /// names mode moves them (no copy), nodes mode copies each Node's name (the Nodes stay, to
    /// be echoed).
    pub fn take_candidates(&mut self) -> Vec<Cow<'a, str>> {
        if let Some(names) = self.node_names.take() {
            names
        } else if let Some(nodes) = &self.nodes {
            nodes
                .items
                .iter()
                .map(|n| Cow::Owned(n.name.clone()))
                .collect()
        } else {
            Vec::new()
        }
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

/// Node name → reason. The names borrow from the request like the candidates they were;
/// reasons are mostly static text, so a rejection does not allocate.
pub type FailedNodesMap<'a> = BTreeMap<Cow<'a, str>, Cow<'static, str>>;

/// Response of `filter`.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult<'a> {
    pub nodes: Option<NodeList>,
    pub node_names: Option<Vec<Cow<'a, str>>>,
    pub failed_nodes: Option<FailedNodesMap<'a>>,
    pub failed_and_unresolvable_nodes: Option<FailedNodesMap<'a>>,
    pub error: String,
}
case_insensitive!(ExtenderFilterResult<'a> {
    nodes: Option<NodeList> => "Nodes",
    node_names: Option<Vec<Cow<'a, str>>> => "NodeNames",
    failed_nodes: Option<FailedNodesMap<'a>> => "FailedNodes",
    failed_and_unresolvable_nodes: Option<FailedNodesMap<'a>> => "FailedAndUnresolvableNodes",
    error: String => "Error",
});

impl ExtenderFilterResult<'_> {
    pub fn error(message: impl Into<String>) -> Self {
        ExtenderFilterResult {
            error: message.into(),
            ..Default::default()
        }
    }
}

/// One entry of the `prioritize` response (a bare JSON array of these). The host borrows from
/// the request: no allocation per candidate.
#[derive(Debug, Default, Serialize, Clone, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority<'a> {
    pub host: Cow<'a, str>,
    /// 0..=10; kube-scheduler multiplies it by weight × 10 without clamping.
    pub score: i64,
}
case_insensitive!(HostPriority<'a> {
    host: Cow<'a, str> => "Host",
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

    /// `ExtenderArgs` as the `case_insensitive!` macro decoded it before names borrowed: the
    /// reference the hand-written decoder must agree with.
    #[derive(Debug, Default, Serialize)]
    #[serde(rename_all = "PascalCase")]
    struct MacroArgs {
        pod: Option<Pod>,
        nodes: Option<NodeList>,
        node_names: Option<Vec<String>>,
    }
    case_insensitive!(MacroArgs {
        pod: Option<Pod> => "Pod",
        nodes: Option<NodeList> => "Nodes",
        node_names: Option<Vec<String>> => "NodeNames",
    });

    /// Both decoders on `bytes`, through the service's `decode` (paths in errors): the same
    /// value, or the same status and message (but for the type's name in "expected ...").
    fn same_as_macro(bytes: &[u8]) {
        use crate::extender::input::decode;
        let reference = decode::<MacroArgs>(bytes).map(|a| serde_json::to_value(a).unwrap());
        let borrowed = decode::<ExtenderArgsRef>(bytes).map(|a| serde_json::to_value(a).unwrap());
        let owned = decode::<ExtenderArgs>(bytes).map(|a| serde_json::to_value(a).unwrap());
        for got in [borrowed, owned] {
            match (&reference, got) {
                (Ok(want), Ok(got)) => assert_eq!(want, &got),
                (Err(want), Err(got)) => {
                    assert_eq!(want.status, got.status);
                    assert_eq!(
                        want.message.replace("MacroArgs", "ExtenderArgs"),
                        got.message
                    );
                }
                (want, got) => panic!("{}: {want:?} vs {got:?}", String::from_utf8_lossy(bytes)),
            }
        }
    }

    #[test]
    fn names_borrow_from_the_body_unless_escaped() {
        let body = br#"{"Pod":{},"NodeNames":["node-a","node-\u0062","n\"c"]}"#;
        let args: ExtenderArgsRef = crate::extender::input::decode(body).unwrap();
        let names = args.node_names.as_ref().unwrap();
        assert!(matches!(names[0], Cow::Borrowed("node-a")), "{names:?}");
        assert!(
            matches!(&names[1], Cow::Owned(n) if n == "node-b"),
            "{names:?}"
        );
        assert!(
            matches!(&names[2], Cow::Owned(n) if n == "n\"c"),
            "{names:?}"
        );
        for body in [
            &br#"{"pod":{},"nodenames":["a"]}"#[..],
            br#"{"POD":{},"NODENAMES":["a"]}"#,
            br#"{"pOd":{},"nOdEnAmEs":["a"]}"#,
        ] {
            let args: ExtenderArgsRef = crate::extender::input::decode(body).unwrap();
            assert_eq!(args.candidate_names(), ["a"]);
            assert!(args.pod.is_some());
        }
        let args: ExtenderArgsRef =
            crate::extender::input::decode(br#"{"NodeNames":null,"Nodes":null}"#).unwrap();
        assert!(args.node_names.is_none() && args.nodes.is_none());
    }

    #[test]
    fn decoders_agree_with_the_macro_on_fixtures_and_bad_shapes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire");
        for entry in std::fs::read_dir(dir).unwrap() {
            same_as_macro(&std::fs::read(entry.unwrap().path()).unwrap());
        }
        for body in [
            &br#"{"NodeNames": "a"}"#[..],
            br#"{"NodeNames": [1]}"#,
            br#"{"NodeNames": ["a", null]}"#,
            br#"{"NodeNames": ["a"], "nodenames": ["b"]}"#,
            br#"{"NodeNames": ["a"], "nodenames": null}"#,
            br#"{"Pod": {"spec": {"containers": "x"}}, "NodeNames": ["a"]}"#,
            br#"{"Nodes":{"items":[{"metadata":{}}]}}"#,
            br#"{"Nodes":{"items":[{"metadata":{"name":"n"}}]},"NodeNames":null}"#,
            br#"[1,2]"#,
            br#""x""#,
            br#"null"#,
            br#"{"NodeNames": ["a"#,
            br#"{"NodeNames": ["\ud800"]}"#,
            br#"{"NodeNames": ["a"]} x"#,
            b"",
        ] {
            same_as_macro(body);
        }
    }

    #[test]
    fn answers_borrow_and_serialize_as_before() {
        let hosts = [
            HostPriority {
                host: Cow::Borrowed("a"),
                score: 10,
            },
            HostPriority {
                host: Cow::Owned("b\"".into()),
                score: 0,
            },
        ];
        assert_eq!(
            serde_json::to_string(&hosts).unwrap(),
            r#"[{"Host":"a","Score":10},{"Host":"b\"","Score":0}]"#
        );
        let r = ExtenderFilterResult {
            node_names: Some(vec![Cow::Borrowed("a")]),
            failed_nodes: Some(BTreeMap::from([(Cow::Borrowed("b"), Cow::Borrowed("why"))])),
            failed_and_unresolvable_nodes: Some(BTreeMap::new()),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"Nodes":null,"NodeNames":["a"],"FailedNodes":{"b":"why"},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
        let back: ExtenderFilterResult =
            serde_json::from_str(r#"{"nodenames":["a"],"failednodes":{"b":"why"},"error":"e"}"#)
                .unwrap();
        assert_eq!(back.node_names.unwrap(), ["a"]);
        assert_eq!(back.error, "e");
        let back: HostPriority = serde_json::from_str(r#"{"host":"a","SCORE":3}"#).unwrap();
        assert_eq!(back.host, "a");
        assert_eq!(back.score, 3);
    }

    proptest::proptest! {
        /// Arbitrary documents under the request's keys, in any casing: the hand-written
        /// decoders agree with the macro, values and errors alike.
        #[test]
        fn decoders_agree_with_the_macro(v in arb_json(), key in "(?i)(pod|nodes|nodenames|other)") {
            same_as_macro(serde_json::json!({ key: v }).to_string().as_bytes());
            same_as_macro(serde_json::json!({ "NodeNames": [v] }).to_string().as_bytes());
        }
    }
}
