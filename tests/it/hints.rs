//! Issue 23 §4 (the part built): `device-allocate-hint` device selectors and SR-IOV VFs end to
//! end, the real service over HTTP against the fake API server. The VFs each bound pod got are
//! read from the API server's pods (`device-allocated` `extension.vfs`), parsed here.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::gpu::{Env, annotation_of};
use crate::support::service;
use crate::support::{FakeApiServer, Kind};

/// A Device with `nics` RDMA NICs (labelled `zone: z{minor % 2}`), each with 2 general VFs.
fn rdma_device(node: &str, nics: i32, with_vfs: bool) -> Value {
    let devices: Vec<Value> = (0..nics)
        .map(|m| {
            let mut d = json!({"type": "rdma", "id": format!("0000:{:02x}:00.0", 0x3d + m), "minor": m,
                "health": true, "labels": {"zone": format!("z{}", m % 2)},
                "resources": {"koordinator.sh/rdma": "100"},
                "topology": {"socketID": 0, "nodeID": 0, "pcieID": format!("pci{m}")}});
            if with_vfs {
                d["vfGroups"] = json!([{"labels": {"type": "general"}, "vfs": [
                    {"minor": 0, "busID": format!("0000:{:02x}:00.2", 0x3d + m)},
                    {"minor": 1, "busID": format!("0000:{:02x}:00.3", 0x3d + m)}]}]);
            }
            d
        })
        .collect();
    json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
        "metadata": {"name": node}, "spec": {"devices": devices}})
}

fn vf_pod(name: &str, hint: &str) -> Value {
    let mut p = service::pending(name, json!({"koordinator.sh/rdma": "25"}));
    p["metadata"]["annotations"] = json!({"scheduling.koordinator.sh/device-allocate-hint": hint});
    p
}

/// Four pods asking for a quarter of a NIC and a general VF, on a node with 2 NICs of 2 VFs:
/// every one gets a distinct VF of the NIC it got; a fifth has no VF left. The zone selector
/// keeps a pod to the NICs of its zone; a node without VFs refuses VF pods unresolvably.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vf_pods_get_distinct_vfs_and_selectors_choose_nics() {
    let fake = FakeApiServer::new();
    for (node, with_vfs) in [("sriov", true), ("plain", false)] {
        fake.create(Kind::Node, service::node(node)).unwrap();
        fake.create(Kind::Device, rdma_device(node, 2, with_vfs))
            .unwrap();
    }
    let env = Env::start(&fake, &[]).await;
    let hint = r#"{"rdma":{"vfSelector":{"matchLabels":{"type":"general"}}}}"#;

    let mut seen = BTreeSet::new();
    for i in 0..4 {
        let pod = vf_pod(&format!("vf-{i}"), hint);
        fake.create(Kind::Pod, pod.clone()).unwrap();
        env.bind(&pod, "sriov").await.expect("a VF is left");
        let a: Value =
            serde_json::from_str(&annotation_of(&fake, &pod).expect("device-allocated")).unwrap();
        let entry = &a["rdma"][0];
        let bus = entry["extension"]["vfs"][0]["busID"]
            .as_str()
            .expect("a VF written")
            .to_string();
        let minor = entry["minor"].as_i64().expect("minor");
        assert!(
            bus.starts_with(&format!("0000:{:02x}:", 0x3d + minor)),
            "VF {bus} is not NIC {minor}'s"
        );
        assert!(seen.insert(bus.clone()), "VF {bus} given twice");
    }
    // The operator's view lists each holder's VF on its NIC.
    let (status, report) = env.http.get("/debug/nodes?nodes=sriov").await;
    assert_eq!(status, 200, "{report}");
    let listed: BTreeSet<String> = report["nodes"][0]["rdma"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|nic| nic["holders"].as_array().cloned().unwrap_or_default())
        .flat_map(|h| h["vfs"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    assert_eq!(listed, seen, "{report}");

    let fifth = vf_pod("vf-4", hint);
    fake.create(Kind::Pod, fifth.clone()).unwrap();
    let f = env.filter(&fifth, &["sriov", "plain"]).await;
    assert_eq!(f["NodeNames"], json!([]), "{f}");
    assert_eq!(
        f["FailedNodes"]["sriov"], "insufficient rdma devices",
        "{f}"
    );
    assert_eq!(
        f["FailedAndUnresolvableNodes"]["plain"], "Insufficient rdma VirtualFunctions",
        "{f}"
    );

    let zoned = vf_pod(
        "zoned",
        r#"{"rdma":{"selector":{"matchLabels":{"zone":"z1"}}}}"#,
    );
    fake.create(Kind::Pod, zoned.clone()).unwrap();
    env.bind(&zoned, "plain")
        .await
        .expect("NIC 1 is in zone z1");
    let a: Value =
        serde_json::from_str(&annotation_of(&fake, &zoned).expect("device-allocated")).unwrap();
    assert_eq!(a["rdma"][0]["minor"], 1, "{a}");
    assert!(a["rdma"][0]["extension"].is_null(), "no VF asked: {a}");
}
