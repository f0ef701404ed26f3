//! Fuzzing (issue 9 §3) with proptest, since `cargo fuzz` needs a nightly toolchain: arbitrary
//! bytes, and mutations of the golden wire fixtures (`tests/fixtures/wire`) and of valid
//! annotations, fed to every decoder the crate has for untrusted input: the extender wire
//! decoder (all four verbs), the `device-allocated` annotation parser, device request
//! annotations, quantities, and the Device CRD / Pod decode with the cache's record building;
//! and the NUMA side: the Linux CPU list form, `resource-status`, `resource-spec`,
//! `numa-topology-spec`, and every koordinator annotation on a NodeResourceTopology
//! (`cpu-topology`, `cpu-manager-policy`, `pod-cpu-allocs`, `reservation`,
//! `system-qos-resource`), alone and through the NRT decode into the CPU ledger.
//! Properties: never a panic; an error from the wire decoder is a 4xx; a parsed annotation
//! survives its own round trip. Cases per property: `FUZZ_CASES` (default 512); the figures
//! measured with larger counts are in RELIABILITY.md.

use std::collections::BTreeMap;
use std::path::Path;

use device_numa_extender::cluster::PodRecord;
use device_numa_extender::cluster::TopologyRecord;
use device_numa_extender::cluster::cpus::CpuLedger;
use device_numa_extender::cluster::devices::{DeviceLedger, NodeDevices};
use device_numa_extender::extender::input::decode;
use device_numa_extender::model::cpuset::CpuSet;
use device_numa_extender::model::device::{Device, DeviceAllocations};
use device_numa_extender::model::koord_cpu::{self, ResourceStatus};
use device_numa_extender::model::nrt::NodeResourceTopology;
use device_numa_extender::model::pod::Pod;
use device_numa_extender::model::quantity::Quantity;
use device_numa_extender::model::wire::{
    ExtenderArgs, ExtenderArgsRef, ExtenderBindingArgs, ExtenderPreemptionArgs,
};
use device_numa_extender::placement::device::pod_device_request;
use device_numa_extender::placement::device::request::parse_device_request;
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        // Regressions are reproduced by the printed seed, not persisted in the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn fixtures() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire");
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "json").then(|| {
                (
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    std::fs::read(&p).unwrap(),
                )
            })
        })
        .collect();
    out.sort();
    assert!(out.len() >= 10, "golden fixtures missing: {}", out.len());
    out
}

/// One byte-level edit: 0 flip a bit, 1 insert, 2 delete, 3 overwrite with a JSON-ish byte,
/// 4 truncate, 5 duplicate a span.
type Edit = (u8, usize, u8);

const JSONISH: &[u8] = b"{}[]\",:0-9eE.+ntfalsu\\";

fn mutate(base: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = base.to_vec();
    for &(op, pos, byte) in edits {
        let len = b.len().max(1);
        let at = pos % len;
        match op % 6 {
            0 if !b.is_empty() => b[at] ^= 1 << (byte % 8),
            1 => b.insert(at.min(b.len()), byte),
            2 if !b.is_empty() => {
                b.remove(at);
            }
            3 if !b.is_empty() => b[at] = JSONISH[byte as usize % JSONISH.len()],
            4 => b.truncate(at),
            5 if !b.is_empty() => {
                let end = (at + 1 + byte as usize).min(b.len());
                let span = b[at..end].to_vec();
                let ins = (at + byte as usize * 7) % b.len();
                b.splice(ins..ins, span);
            }
            _ => {}
        }
    }
    b
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(any::<Edit>(), 1..12)
}

/// Every verb's decoder on `bytes`: an error must be a 4xx with a message.
fn decode_all(bytes: &[u8]) -> Result<(), TestCaseError> {
    for r in [
        decode::<ExtenderArgs>(bytes).map(|_| ()),
        // What filter and prioritize decode: names borrowed from `bytes`.
        decode::<ExtenderArgsRef>(bytes).map(|_| ()),
        decode::<ExtenderBindingArgs>(bytes).map(|_| ()),
        decode::<ExtenderPreemptionArgs>(bytes).map(|_| ()),
    ] {
        if let Err(e) = r {
            prop_assert!(e.status.is_client_error(), "{:?}", e.status);
            prop_assert!(!e.message.is_empty());
        }
    }
    Ok(())
}

/// A parsed annotation re-encodes to one that parses to the same value.
fn annotation_round_trip(s: &str) -> Result<(), TestCaseError> {
    if let Ok(a) = DeviceAllocations::parse_annotation(s) {
        let again = DeviceAllocations::parse_annotation(&a.to_annotation());
        prop_assert_eq!(again.as_ref(), Ok(&a), "round trip of {}", s);
    }
    Ok(())
}

const ANNOTATION: &str = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"80Gi","koordinator.sh/gpu-memory-ratio":"100"},"id":"GPU-0"},{"minor":3,"resources":{"koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"}}],"rdma":[{"minor":1,"resources":{"koordinator.sh/rdma":"50"},"id":"0000:3d:00.0","extension":{"vfs":[{"busID":"0000:3d:00.2"}]}}]}"#;

const DEVICE: &str = r#"{"apiVersion":"scheduling.koordinator.sh/v1alpha1","kind":"Device","metadata":{"name":"n1","uid":"u1","resourceVersion":"7","labels":{"node.koordinator.sh/gpu-partition-policy":"Honor"},"annotations":{"scheduling.koordinator.sh/gpu-partitions":"{\"1\":[{\"minors\":[0],\"ringBusBandwidth\":\"400Gi\",\"allocationScore\":1}]}"}},"spec":{"devices":[{"type":"gpu","id":"GPU-0","minor":0,"health":true,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"80Gi","koordinator.sh/gpu-memory-ratio":"100"},"topology":{"socketID":0,"nodeID":0,"pcieID":"pci0","busID":"0000:00:00.0"}},{"type":"rdma","id":"0000:40:00.0","minor":0,"health":true,"resources":{"koordinator.sh/rdma":"100"},"vfGroups":[{"labels":{"a":"b"},"vfs":[{"minor":1,"busID":"0000:40:00.1"}]}]}]}}"#;

const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ml","uid":"u-p","resourceVersion":"9","annotations":{"scheduling.koordinator.sh/device-allocated":"{\"gpu\":[{\"minor\":1,\"resources\":{\"koordinator.sh/gpu-memory-ratio\":\"50\"}}]}","scheduling.koordinator.sh/device-joint-allocate":"{\"deviceTypes\":[\"gpu\",\"rdma\"],\"requiredScope\":\"SamePCIe\"}"}},"spec":{"nodeName":"n1","containers":[{"name":"a","resources":{"requests":{"koordinator.sh/gpu-memory-ratio":"50","koordinator.sh/rdma":"100"}}}],"initContainers":[{"name":"i","resources":{"limits":{"koordinator.sh/gpu-memory-ratio":"100"}}}]},"status":{"phase":"Running"}}"#;

/// The device request annotations the parser reads.
const REQUEST_ANNOTATIONS: [&str; 4] = [
    "scheduling.koordinator.sh/device-joint-allocate",
    "scheduling.koordinator.sh/device-allocate-hint",
    "scheduling.koordinator.sh/gpu-partition-spec",
    "scheduling.koordinator.sh/device-allocated",
];

fn device_pipeline(bytes: &[u8]) {
    if let Ok(d) = serde_json::from_slice::<Device>(bytes) {
        let (devices, _problems) = NodeDevices::from_device(&d);
        // The cache's ledger and the filter's fast index are built from it, too.
        let mut ledger = DeviceLedger::new();
        ledger.set_devices(Some(devices));
        let _ = ledger.device_index();
        let _ = ledger.free(&[]);
    }
}

fn pod_pipeline(bytes: &[u8]) {
    if let Ok(p) = serde_json::from_slice::<Pod>(bytes) {
        let _ = PodRecord::from_pod(&p);
        let _ = pod_device_request(&p);
    }
}

/// Valid seeds for the NUMA parsers: (name, parser index, value).
const NUMA_SEEDS: [&str; 8] = [
    r#"{"cpuset":"0-3,8","numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"8Gi"}}]}"#,
    r#"{"detail":[{"id":0,"core":0,"socket":0,"node":0},{"id":1,"core":0,"socket":0,"node":0},{"id":2,"core":1,"socket":1,"node":1}]}"#,
    r#"{"policy":"static","options":{"full-pcpus-only":"true"},"reservedCPUs":"0-1"}"#,
    r#"[{"namespace":"ml","name":"a","uid":"u1","cpuset":"2-3","managedByKubelet":true}]"#,
    r#"{"reservedCPUs":"4-5","resources":{"cpu":"2"}}"#,
    r#"{"cpuset":"6"}"#,
    r#"{"requiredCPUBindPolicy":"FullPCPUs","preferredCPUBindPolicy":"SpreadByPCPUs","preferredCPUExclusivePolicy":"PCPULevel"}"#,
    r#"{"numaTopologyPolicy":"SingleNUMANode","singleNUMANodeExclusive":"Preferred"}"#,
];

/// Runs parser `which` on `s`; a value that parses must survive its own round trip where the
/// type has a writer.
fn numa_parse(which: usize, s: &str) -> Result<(), TestCaseError> {
    match which % NUMA_SEEDS.len() {
        0 => {
            if let Ok(rs) = ResourceStatus::parse(s) {
                let again = ResourceStatus::parse(&rs.to_annotation());
                prop_assert_eq!(
                    again.as_ref().ok(),
                    Some(&rs),
                    "resource-status round trip of {:?}",
                    s
                );
            }
        }
        1 => {
            let _ = koord_cpu::parse_cpu_topology(s);
        }
        2 => {
            let _ = koord_cpu::parse_kubelet_cpu_policy(s);
        }
        3 => {
            let _ = koord_cpu::parse_pod_cpu_allocs(s);
        }
        4 => {
            let _ = koord_cpu::parse_node_reservation(s);
        }
        5 => {
            let _ = koord_cpu::parse_system_qos(s);
        }
        6 => {
            let _ = koord_cpu::parse_resource_spec(s);
        }
        _ => {
            let _ = koord_cpu::parse_numa_topology_spec(s);
        }
    }
    Ok(())
}

const NRT_ANNOTATIONS: [&str; 5] = [
    "node.koordinator.sh/cpu-topology",
    "kubelet.koordinator.sh/cpu-manager-policy",
    "node.koordinator.sh/pod-cpu-allocs",
    "node.koordinator.sh/reservation",
    "node.koordinator.sh/system-qos-resource",
];

/// An NRT whose annotations are the seeds, with annotation `key` replaced by `value`, decoded
/// and built into a CPU ledger the way the sync handler does; then the ledger's views.
fn nrt_pipeline(key: usize, value: &str) {
    let mut annotations = serde_json::Map::new();
    for (k, seed) in NRT_ANNOTATIONS.iter().zip([1usize, 2, 3, 4, 5]) {
        annotations.insert(k.to_string(), serde_json::json!(NUMA_SEEDS[seed]));
    }
    annotations.insert(
        NRT_ANNOTATIONS[key % NRT_ANNOTATIONS.len()].to_string(),
        serde_json::json!(value),
    );
    let nrt = serde_json::json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": "n", "uid": "u", "annotations": annotations},
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "zones": [{"name": "node-0", "type": "Node", "resources": [{"name": "cpu", "capacity": "2", "allocatable": "2", "available": "2"}]},
                  {"name": "node-1", "type": "Node", "resources": [{"name": "cpu", "capacity": "1", "allocatable": "1", "available": "1"}]}]
    });
    if let Ok(nrt) = serde_json::from_value::<NodeResourceTopology>(nrt) {
        let record = TopologyRecord::from_nrt(&nrt);
        let mut ledger = CpuLedger::default();
        ledger.set_nrt(Some(record.cpu.clone()));
        let _ = ledger.summary();
        let _ = ledger.debug_view();
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_cpu_list_form(s in "[0-9,\\- ]{0,40}|.{0,40}") {
        if let Ok(set) = s.parse::<CpuSet>() {
            let again = set.to_string().parse::<CpuSet>();
            prop_assert_eq!(again.ok(), Some(set), "list form round trip of {:?}", s);
        }
    }

    #[test]
    fn fuzz_numa_annotations_on_arbitrary_strings(which in 0usize..8, s in ".{0,200}") {
        numa_parse(which, &s)?;
    }

    #[test]
    fn fuzz_numa_annotations_on_mutations(which in 0usize..8, e in edits()) {
        let m = mutate(NUMA_SEEDS[which].as_bytes(), &e);
        numa_parse(which, &String::from_utf8_lossy(&m))?;
    }

    #[test]
    fn fuzz_nrt_decode_into_the_cpu_ledger(key in 0usize..5, e in edits(), arbitrary in ".{0,120}", mutated in any::<bool>()) {
        let base = NUMA_SEEDS[1 + key % 5];
        let value = if mutated {
            String::from_utf8_lossy(&mutate(base.as_bytes(), &e)).into_owned()
        } else {
            arbitrary
        };
        nrt_pipeline(key, &value);
    }

    #[test]
    fn fuzz_wire_decoders_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
        decode_all(&bytes)?;
    }

    #[test]
    fn fuzz_wire_decoders_on_mutated_golden_fixtures(pick in any::<usize>(), e in edits()) {
        let all = fixtures();
        let (_, base) = &all[pick % all.len()];
        decode_all(&mutate(base, &e))?;
    }

    #[test]
    fn fuzz_device_allocated_on_arbitrary_strings(s in ".{0,300}") {
        annotation_round_trip(&s)?;
    }

    #[test]
    fn fuzz_device_allocated_on_mutations(e in edits()) {
        let m = mutate(ANNOTATION.as_bytes(), &e);
        annotation_round_trip(&String::from_utf8_lossy(&m))?;
    }

    #[test]
    fn fuzz_quantities(s in "[-+0-9.eEkKMGTPmiu ]{0,24}|.{0,24}") {
        if let Ok(q) = Quantity::parse(&s) {
            let _ = (q.milli(), q.is_zero());
        }
    }

    #[test]
    fn fuzz_device_request_annotations(key in 0usize..4, value in ".{0,200}", e in edits(), mutated in any::<bool>()) {
        let value = if mutated {
            String::from_utf8_lossy(&mutate(br#"{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe","gpu":{"allocateStrategy":"ApplyForAll"}}"#, &e)).into_owned()
        } else {
            value
        };
        let mut requests = BTreeMap::new();
        requests.insert("nvidia.com/gpu".to_string(), Quantity::parse("1").unwrap());
        requests.insert("koordinator.sh/rdma".to_string(), Quantity::parse("100").unwrap());
        let mut annotations = BTreeMap::new();
        annotations.insert(REQUEST_ANNOTATIONS[key].to_string(), value);
        let _ = parse_device_request(&requests, Some(&annotations));
    }

    #[test]
    fn fuzz_device_crd_decode_on_mutations(e in edits()) {
        device_pipeline(&mutate(DEVICE.as_bytes(), &e));
    }

    #[test]
    fn fuzz_device_crd_decode_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        device_pipeline(&bytes);
    }

    #[test]
    fn fuzz_pod_decode_on_mutations(e in edits()) {
        pod_pipeline(&mutate(POD.as_bytes(), &e));
    }

    /// Issue 36 §5: values an object can carry, at their extremes, into the caches: a Node's
    /// amplification ratio annotation and partition, bind and NUMA policy labels (any string),
    /// its allocatable CPU and its pods' CPU requests (any quantity), a Device's partition table
    /// with any allocation score. The Node, Device and Pod records and the read snapshot (which
    /// computes every node's amplified CPU and partition facts) are built: never a panic.
    #[test]
    fn fuzz_node_and_device_values_into_the_caches(
        ratio in prop_oneof![".{0,40}", any::<f64>().prop_map(|r| format!(r#"{{"cpu":{r:e}}}"#)),
                             any::<i64>().prop_map(|r| format!(r#"{{"cpu":{r}}}"#))],
        label in ".{0,20}",
        allocatable in prop_oneof![".{0,20}", any::<i64>().prop_map(|v| v.to_string()), Just("9223372036854775807k".to_string())],
        requests in prop::collection::vec(prop_oneof![any::<u32>().prop_map(|v| v.to_string()), Just("9223372036854775807".to_string()), Just("99999999999999999999999Ei".to_string())], 0..4),
        score in any::<i64>(),
    ) {
        use device_numa_extender::cluster::{ClusterState, NodeRecord};
        use device_numa_extender::model::node::Node;
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "uid": "u",
                "annotations": {"node.koordinator.sh/resource-amplification-ratio": ratio},
                "labels": {"node.koordinator.sh/gpu-partition-policy": label.clone(),
                           "node.koordinator.sh/gpu-model": "H100",
                           "node.koordinator.sh/cpu-bind-policy": label.clone(),
                           "node.koordinator.sh/numa-topology-policy": label}},
            "status": {"allocatable": {"cpu": allocatable, "nvidia.com/gpu": "1"}}
        })).unwrap();
        let cluster = ClusterState::new();
        cluster.set_node("n1", Some(NodeRecord::from_node(&node)));
        let table = format!(r#"{{"1":[{{"minors":[0],"allocationScore":{score}}}],"2":[{{"minors":[0,1],"allocationScore":{score}}}]}}"#);
        let device: Device = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "annotations": {"scheduling.koordinator.sh/gpu-partitions": table}},
            "spec": {"devices": [
                {"type": "gpu", "minor": 0, "health": true, "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100", "koordinator.sh/gpu-memory": "80Gi"}},
                {"type": "gpu", "minor": 1, "health": true, "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100", "koordinator.sh/gpu-memory": "80Gi"}}
            ]}
        })).unwrap();
        let (devices, _problems) = NodeDevices::from_device(&device);
        cluster.set_devices("n1", Some(devices));
        for (i, cpu) in requests.iter().enumerate() {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p{i}"), "namespace": "ml", "uid": format!("u{i}")},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
                "status": {"phase": "Running"}
            })).unwrap();
            if let Some(record) = PodRecord::from_pod(&pod) {
                cluster.upsert_pod(None, &record);
            }
        }
        cluster.build_snapshot();
        let _ = cluster.read_snapshot();
    }
}

#[test]
fn numa_fuzz_seeds_are_valid_inputs() {
    // Each seed must parse, or its mutations only explore the error paths.
    assert!(ResourceStatus::parse(NUMA_SEEDS[0]).is_ok());
    assert!(koord_cpu::parse_cpu_topology(NUMA_SEEDS[1]).is_ok());
    assert!(koord_cpu::parse_kubelet_cpu_policy(NUMA_SEEDS[2]).is_ok());
    assert!(koord_cpu::parse_pod_cpu_allocs(NUMA_SEEDS[3]).is_ok());
    assert!(koord_cpu::parse_node_reservation(NUMA_SEEDS[4]).is_ok());
    assert!(koord_cpu::parse_system_qos(NUMA_SEEDS[5]).is_ok());
    assert!(koord_cpu::parse_resource_spec(NUMA_SEEDS[6]).is_ok());
    assert!(koord_cpu::parse_numa_topology_spec(NUMA_SEEDS[7]).is_ok());
}

#[test]
fn fuzz_seeds_are_valid_inputs() {
    // The mutation bases must parse, or the mutations only explore the error paths.
    assert!(DeviceAllocations::parse_annotation(ANNOTATION).is_ok());
    let d: Device = serde_json::from_str(DEVICE).expect("device seed");
    let (devices, problems) = NodeDevices::from_device(&d);
    assert!(
        devices.types().count() == 2 && problems.is_empty(),
        "{problems:?}"
    );
    let p: Pod = serde_json::from_str(POD).expect("pod seed");
    assert!(PodRecord::from_pod(&p).is_some());
    assert!(pod_device_request(&p).expect("valid request").is_some());
    for (name, bytes) in fixtures() {
        let ok = if name.starts_with("bind") {
            decode::<ExtenderBindingArgs>(&bytes).is_ok()
        } else if name.starts_with("preempt") {
            decode::<ExtenderPreemptionArgs>(&bytes).is_ok()
        } else if name.starts_with("cluster") {
            true
        } else {
            decode::<ExtenderArgs>(&bytes).is_ok()
        };
        assert!(ok, "{name} does not decode");
    }
}
