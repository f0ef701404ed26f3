//! koordinator's GPU partition annotations and labels (koordinator `apis/extension/device_share.go`,
//! v1.7.0): the Device's partition table (`scheduling.koordinator.sh/gpu-partitions`), the
//! partition policy label (`node.koordinator.sh/gpu-partition-policy`, on the Device or the
//! Node), the GPU model and vendor labels that select koordinator's built-in Hopper table, and
//! the pod's `scheduling.koordinator.sh/gpu-partition-spec`.
//!
//! Owns the wire form only: strict parse functions whose errors name the annotation and the
//! part. What a table means (its index, the allocation) is `placement::device::partition`'s.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::model::quantity::Quantity;

/// Device annotation: the node's GPU partitions by GPU count,
/// `{"2":[{"minors":[0,1],"gpuLinkType":"NVLink","allocationScore":1}],...}`.
pub const GPU_PARTITIONS: &str = "scheduling.koordinator.sh/gpu-partitions";
/// Device (with a table) or Node (built-in table) label: `Honor` | `Prefer` (anything else).
pub const GPU_PARTITION_POLICY_LABEL: &str = "node.koordinator.sh/gpu-partition-policy";
/// Pod annotation: `{"allocatePolicy":"Restricted"|"BestEffort","ringBusBandwidth":"200Gi"}`.
pub const GPU_PARTITION_SPEC: &str = "scheduling.koordinator.sh/gpu-partition-spec";
/// Node label: the GPU model (`H100`, `H800`, `H20` select the built-in Hopper table).
pub const GPU_MODEL_LABEL: &str = "node.koordinator.sh/gpu-model";
/// Node label: the GPU vendor (empty or `nvidia` for the built-in table).
pub const GPU_VENDOR_LABEL: &str = "node.koordinator.sh/gpu-vendor";

/// Why a partition annotation could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionAnnotationError {
    #[error("annotation {annotation}: invalid JSON: {reason}")]
    Json {
        annotation: &'static str,
        reason: String,
    },
    #[error("annotation {annotation}: {field}={value:?} is not a quantity")]
    Quantity {
        annotation: &'static str,
        field: String,
        value: String,
    },
    #[error("annotation {GPU_PARTITIONS}: the table is null")]
    NullTable,
}

/// One partition as the annotation lists it (not yet validated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawPartition {
    pub minors: Vec<i64>,
    /// `gpuLinkType` (`NVLink`); informational.
    pub link: Option<String>,
    pub ring_bus_bandwidth: Option<Quantity>,
    pub allocation_score: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PartitionJson {
    #[serde(default)]
    minors: Option<Vec<i64>>,
    #[serde(default)]
    gpu_link_type: Option<String>,
    #[serde(default)]
    ring_bus_bandwidth: Option<serde_json::Value>,
    #[serde(default)]
    allocation_score: Option<i64>,
}

/// A JSON object as a struct: Go decodes only objects into structs (serde would also take an
/// array of the fields in order).
fn object<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, String> {
    if !v.is_object() {
        return Err(format!("expected an object, found {v}"));
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// A quantity field in koordinator's JSON form: a string, or a number.
fn quantity(
    annotation: &'static str,
    field: String,
    v: &serde_json::Value,
) -> Result<Option<Quantity>, PartitionAnnotationError> {
    let text = match v {
        serde_json::Value::Null => return Ok(None),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        other => other.to_string(),
    };
    Quantity::parse(&text)
        .map(Some)
        .map_err(|_| PartitionAnnotationError::Quantity {
            annotation,
            field,
            value: text,
        })
}

/// `scheduling.koordinator.sh/gpu-partitions` → partitions by the GPU count they are for
/// (koordinator `GetGPUPartitionTable`: JSON object keys are integers; a `null` table is an
/// error). Counts with an empty list are kept here and dropped by the index, as koordinator does.
pub fn parse_partition_table(
    s: &str,
) -> Result<BTreeMap<i64, Vec<RawPartition>>, PartitionAnnotationError> {
    const A: &str = GPU_PARTITIONS;
    let json_error = |reason: String| PartitionAnnotationError::Json {
        annotation: A,
        reason,
    };
    let parsed: Option<BTreeMap<String, Option<Vec<serde_json::Value>>>> =
        serde_json::from_str(s).map_err(|e| json_error(e.to_string()))?;
    let parsed = parsed.ok_or(PartitionAnnotationError::NullTable)?;
    let mut out = BTreeMap::new();
    for (key, partitions) in parsed {
        let count: i64 = key
            .parse()
            .map_err(|_| json_error(format!("key {key:?} is not a GPU count")))?;
        let mut list = Vec::new();
        for (i, p) in partitions.into_iter().flatten().enumerate() {
            let p: PartitionJson = object(p).map_err(|e| json_error(format!("{key}[{i}]: {e}")))?;
            let field = format!("{key}[{i}].ringBusBandwidth");
            list.push(RawPartition {
                minors: p.minors.unwrap_or_default(),
                link: p.gpu_link_type.filter(|l| !l.is_empty()),
                ring_bus_bandwidth: match &p.ring_bus_bandwidth {
                    Some(v) => quantity(A, field, v)?,
                    None => None,
                },
                allocation_score: p.allocation_score.unwrap_or(0),
            });
        }
        out.insert(count, list);
    }
    Ok(out)
}

/// Whether a partition policy label says `Honor` (koordinator `GetGPUPartitionPolicy`: any other
/// value, or none, is `Prefer`).
pub fn honors_partitions(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(GPU_PARTITION_POLICY_LABEL))
        .is_some_and(|v| v == "Honor")
}

/// A pod's `gpu-partition-spec`: present means partitions are honoured for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuPartitionSpec {
    /// `Restricted`: only the partitions of the first allocation-score group are considered;
    /// anything else (default `BestEffort`) tries the next group when none is free.
    pub restricted: bool,
    /// A partition must offer at least this ring bus bandwidth.
    pub ring_bus_bandwidth: Option<Quantity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecJson {
    #[serde(default)]
    allocate_policy: Option<String>,
    #[serde(default)]
    ring_bus_bandwidth: Option<serde_json::Value>,
}

/// `scheduling.koordinator.sh/gpu-partition-spec` → the spec (koordinator `GetGPUPartitionSpec`:
/// an empty or unparseable value is an error; an unknown policy is `BestEffort`).
pub fn parse_partition_spec(s: &str) -> Result<GpuPartitionSpec, PartitionAnnotationError> {
    const A: &str = GPU_PARTITION_SPEC;
    let json_error = |reason: String| PartitionAnnotationError::Json {
        annotation: A,
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_str(s).map_err(|e| json_error(e.to_string()))?;
    if value.is_null() {
        return Ok(GpuPartitionSpec::default());
    }
    let parsed: SpecJson = object(value).map_err(json_error)?;
    Ok(GpuPartitionSpec {
        restricted: parsed.allocate_policy.as_deref() == Some("Restricted"),
        ring_bus_bandwidth: match &parsed.ring_bus_bandwidth {
            Some(v) => quantity(A, "ringBusBandwidth".into(), v)?,
            None => None,
        },
    })
}

/// The GPU model of a Node that selects koordinator's built-in Hopper table: vendor empty or
/// `nvidia`, model `H100`, `H800` or `H20` (koordinator `GetDesignatedGPUPartitionIndexer`).
pub fn has_builtin_hopper_table(labels: &BTreeMap<String, String>) -> bool {
    let vendor = labels.get(GPU_VENDOR_LABEL).map_or("", String::as_str);
    (vendor.is_empty() || vendor == "nvidia")
        && matches!(
            labels.get(GPU_MODEL_LABEL).map(String::as_str),
            Some("H100" | "H800" | "H20")
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_parse_as_koordinator_decodes_them() {
        let t = parse_partition_table(
            r#"{"1":[{"minors":[0]},{"minors":[1],"allocationScore":2}],
                "2":[{"minors":[0,1],"gpuLinkType":"NVLink","ringBusBandwidth":"400Gi","allocationScore":1}],
                "4":[]}"#,
        )
        .unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[&1][1].allocation_score, 2);
        assert_eq!(t[&1][0].allocation_score, 0);
        assert_eq!(t[&2][0].link.as_deref(), Some("NVLink"));
        assert_eq!(
            t[&2][0].ring_bus_bandwidth,
            Some(Quantity::parse("400Gi").unwrap())
        );
        assert!(t[&4].is_empty());
        for bad in [
            "null",
            "",
            "[]",
            r#"{"x":[]}"#,
            r#"{"1":[{"minors":"0"}]}"#,
            r#"{"1":[[[0]]]}"#,
            r#"{"1":[{"minors":[0],"ringBusBandwidth":"fast"}]}"#,
        ] {
            let e = parse_partition_table(bad).unwrap_err();
            assert!(e.to_string().contains(GPU_PARTITIONS), "{bad}: {e}");
        }
    }

    #[test]
    fn specs_parse_as_koordinator_decodes_them() {
        assert_eq!(
            parse_partition_spec(r#"{"allocatePolicy":"Restricted"}"#).unwrap(),
            GpuPartitionSpec {
                restricted: true,
                ring_bus_bandwidth: None
            }
        );
        for best_effort in [
            "{}",
            r#"{"allocatePolicy":"BestEffort"}"#,
            r#"{"allocatePolicy":"x"}"#,
        ] {
            assert!(!parse_partition_spec(best_effort).unwrap().restricted);
        }
        assert_eq!(
            parse_partition_spec(r#"{"ringBusBandwidth":"200Gi"}"#)
                .unwrap()
                .ring_bus_bandwidth,
            Some(Quantity::parse("200Gi").unwrap())
        );
        for bad in ["", "{", r#"{"ringBusBandwidth":"x"}"#, "[]"] {
            let e = parse_partition_spec(bad).unwrap_err();
            assert!(e.to_string().contains(GPU_PARTITION_SPEC), "{bad}: {e}");
        }
    }

    #[test]
    fn the_builtin_table_is_for_nvidia_hopper_models() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(has_builtin_hopper_table(&labels(&[(
            GPU_MODEL_LABEL,
            "H100"
        )])));
        assert!(has_builtin_hopper_table(&labels(&[
            (GPU_MODEL_LABEL, "H20"),
            (GPU_VENDOR_LABEL, "nvidia")
        ])));
        assert!(!has_builtin_hopper_table(&labels(&[
            (GPU_MODEL_LABEL, "H100"),
            (GPU_VENDOR_LABEL, "amd")
        ])));
        assert!(!has_builtin_hopper_table(&labels(&[(
            GPU_MODEL_LABEL,
            "A100"
        )])));
        assert!(honors_partitions(Some(&labels(&[(
            GPU_PARTITION_POLICY_LABEL,
            "Honor"
        )]))));
        assert!(!honors_partitions(Some(&labels(&[(
            GPU_PARTITION_POLICY_LABEL,
            "honor"
        )]))));
        assert!(!honors_partitions(None));
    }
}
