//! The DRA index against an oracle written from the API objects alone: after any sequence of
//! slice and claim writes and deletes, a node's held identities are exactly those that the
//! current slices state for the devices the current claims' allocations name — plus, for a
//! device whose every slice is gone while a claim holds it, what a slice last said of it.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::json;

use std::time::SystemTime;

use super::*;

fn slice(node: &str, driver: &str, pool: &str, devices: &[(&str, &str)]) -> ResourceSlice {
    let devices: Vec<_> = devices
        .iter()
        .map(|(name, uuid)| json!({"name": name, "attributes": {"uuid": {"string": uuid}}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-{driver}-{pool}")},
        "spec": {"driver": driver, "pool": {"name": pool}, "nodeName": node, "devices": devices}
    }))
    .unwrap()
}

fn claim(results: &[(&str, &str, &str)]) -> ResourceClaim {
    let results: Vec<_> = results
        .iter()
        .map(|(driver, pool, device)| json!({"request": "r", "driver": driver, "pool": pool, "device": device}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns"},
        "status": {"allocation": {"devices": {"results": results}}}
    }))
    .unwrap()
}

fn uuid(u: &str) -> DeviceIdentity {
    DeviceIdentity::uuid(u).unwrap()
}

#[test]
fn a_claim_holds_the_physical_device_its_slice_names_until_it_lets_go() {
    let mut index = DraIndex::new(["dra.cpu".to_string()]);
    let (s, problems) = SliceRecord::from_slice(&slice(
        "n1",
        "gpu.nvidia.com",
        "n1",
        &[("gpu-0", "GPU-a"), ("gpu-1", "GPU-b")],
    ));
    assert!(problems.is_empty());
    assert_eq!(
        index.set_slice("s1", Some(s)),
        BTreeSet::from([Arc::from("n1")])
    );
    let published = index.holdings("n1", SystemTime::now());
    assert!(published.held.is_empty());
    assert_eq!(published.published.len(), 2);

    let (c, _) = ClaimRecord::from_claim(&claim(&[("gpu.nvidia.com", "n1", "gpu-1")]));
    assert_eq!(
        index.set_claim("ns/c", Some(c)),
        BTreeSet::from([Arc::from("n1")])
    );
    let held = index.holdings("n1", SystemTime::now());
    assert_eq!(held.held.keys().collect::<Vec<_>>(), vec![&uuid("GPU-B")]);
    assert_eq!(
        held.held[&uuid("GPU-B")],
        BTreeSet::from([Arc::from("ns/c")])
    );
    assert_eq!(index.claim_counts(), (1, 0));

    // The driver restarts: its slice goes and comes back; the claim's device stays held.
    index.set_slice("s1", None);
    assert_eq!(
        index.holdings("n1", SystemTime::now()).held.len(),
        1,
        "held while its slice is gone"
    );
    assert_eq!(index.claim_counts(), (1, 0));

    // Released: a return.
    assert_eq!(
        index.set_claim("ns/c", None),
        BTreeSet::from([Arc::from("n1")])
    );
    assert!(index.holdings("n1", SystemTime::now()).is_empty());
    assert_eq!(index.claim_counts(), (0, 0));
}

#[test]
fn a_claim_on_a_device_no_slice_names_is_held_once_its_slice_arrives() {
    let mut index = DraIndex::new([]);
    let (c, _) = ClaimRecord::from_claim(&claim(&[("d", "p", "x")]));
    assert!(index.set_claim("ns/c", Some(c)).is_empty());
    assert_eq!(index.claim_counts(), (1, 1));
    let (s, _) = SliceRecord::from_slice(&slice("n2", "d", "p", &[("x", "GPU-x")]));
    assert_eq!(
        index.set_slice("s", Some(s)),
        BTreeSet::from([Arc::from("n2")])
    );
    assert_eq!(index.holdings("n2", SystemTime::now()).held.len(), 1);
    assert_eq!(index.claim_counts(), (1, 0));
}

#[test]
fn bad_slices_and_claims_are_reported_and_change_nothing_else() {
    let bad: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "bad"},
        "spec": {"driver": "d", "pool": {"name": "p"}, "nodeName": "n", "devices": [
            {"name": "a", "attributes": {"uuid": {"string": "GPU-a"}}},
            {"name": "a", "attributes": {"uuid": {"string": "GPU-z"}}},
            {"name": "", "attributes": {}},
            {"name": "b", "attributes": {"index": {"int": 1}}}
        ]}
    }))
    .unwrap();
    let (s, problems) = SliceRecord::from_slice(&bad);
    let classes: Vec<_> = problems.iter().map(|p| p.problem).collect();
    assert_eq!(
        classes,
        vec!["device_named_twice", "malformed", "device_without_identity"]
    );
    // The first listing of `a` stands; `b` is kept (a claim may still name it) with no identity.
    assert_eq!(s.devices.len(), 2);
    assert_eq!(s.devices[0].ids, vec![uuid("GPU-a")]);

    let no_pool: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "np"}, "spec": {"driver": "d", "nodeName": "n", "devices": [{"name": "a"}]}
    }))
    .unwrap();
    let (s, problems) = SliceRecord::from_slice(&no_pool);
    assert!(s.devices.is_empty());
    assert_eq!(problems[0].problem, "malformed");

    let (c, problems) = ClaimRecord::from_claim(&claim(&[("d", "", "a"), ("d", "p", "a")]));
    assert_eq!(c.devices.len(), 1);
    assert_eq!(problems[0].problem, "malformed");
}

#[test]
fn the_cpu_driver_marks_the_nodes_it_publishes() {
    let mut index = DraIndex::new(["dra.cpu".to_string()]);
    let (s, _) = SliceRecord::from_slice(&slice("n1", "dra.cpu", "n1", &[("cpudevnuma0", "")]));
    index.set_slice("c1", Some(s));
    assert_eq!(
        index.holdings("n1", SystemTime::now()).cpu_drivers,
        BTreeSet::from([Arc::from("dra.cpu")])
    );
    index.set_slice("c1", None);
    assert!(
        index
            .holdings("n1", SystemTime::now())
            .cpu_drivers
            .is_empty()
    );
}

#[test]
fn only_managed_names_mapped_by_a_class_count() {
    let mut index = DraIndex::new([]);
    let class = |name: &str| -> DeviceClass {
        serde_json::from_value(
            json!({"metadata": {"name": "c"}, "spec": {"extendedResourceName": name}}),
        )
        .unwrap()
    };
    assert!(!index.set_class("other", Some(&class("example.com/foo"))));
    assert!(index.set_class("gpus", Some(&class("nvidia.com/gpu"))));
    assert_eq!(
        index.extended_names().names().collect::<Vec<_>>(),
        vec!["nvidia.com/gpu"]
    );
    assert!(!index.set_class("gpus2", Some(&class("nvidia.com/gpu"))));
    assert!(
        !index.set_class("gpus", None),
        "another class still maps it"
    );
    assert!(index.set_class("gpus2", None));
    assert!(index.extended_names().is_empty());
}

/// Trust IV §1: a slice with `perDeviceNodeSelection` names each device's node itself; a
/// claim holding both GPUs of n1 holds them on n1 (the join read only the slice-level
/// `nodeName` before, and a one-GPU pod was bound to minor 0).
#[test]
fn per_device_node_selection_puts_each_device_on_its_own_node() {
    let mut index = DraIndex::new([]);
    let partitioned: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "per-device"},
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "fleet"}, "perDeviceNodeSelection": true,
                 "devices": [
            {"name": "gpu-0", "nodeName": "n1", "attributes": {"uuid": {"string": "GPU-a"}}},
            {"name": "gpu-1", "nodeName": "n1", "attributes": {"uuid": {"string": "GPU-b"}}},
            {"name": "gpu-2", "nodeName": "n2", "attributes": {"uuid": {"string": "GPU-c"},
                "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"}}},
            {"name": "lost", "attributes": {"uuid": {"string": "GPU-z"}}}
        ]}
    }))
    .unwrap();
    let (record, problems) = SliceRecord::from_slice(&partitioned);
    assert_eq!(
        problems.iter().map(|p| p.problem).collect::<Vec<_>>(),
        vec!["device_without_node"]
    );
    assert_eq!(
        index.set_slice("per-device", Some(record)),
        BTreeSet::from([Arc::from("n1"), Arc::from("n2")])
    );
    let (c, _) = ClaimRecord::from_claim(&claim(&[
        ("gpu.nvidia.com", "fleet", "gpu-0"),
        ("gpu.nvidia.com", "fleet", "gpu-1"),
    ]));
    assert_eq!(
        index.set_claim("ns/c", Some(c)),
        BTreeSet::from([Arc::from("n1")])
    );
    let n1 = index.holdings("n1", SystemTime::now());
    assert_eq!(
        n1.held.keys().cloned().collect::<Vec<_>>(),
        vec![uuid("GPU-a"), uuid("GPU-b")]
    );
    let n2 = index.holdings("n2", SystemTime::now());
    assert!(n2.held.is_empty());
    assert_eq!(n2.published.len(), 2, "uuid and bus ID of gpu-2: {n2:?}");
}

/// A device reachable through a node selector (or from all nodes) is joined by its UUID on
/// whichever node states it; its PCI address names a place on every node and is not joined.
#[test]
fn a_device_a_selector_reaches_is_joined_by_uuid_on_any_node() {
    let mut index = DraIndex::new([]);
    let selected: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "sel"},
        "spec": {"driver": "d", "pool": {"name": "p"},
                 "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                     {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]},
                 "devices": [{"name": "x", "attributes": {"uuid": {"string": "GPU-x"},
                     "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"}}}]}
    }))
    .unwrap();
    let (record, problems) = SliceRecord::from_slice(&selected);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(record.devices[0].ids, vec![uuid("GPU-x")]);
    assert_eq!(
        index.set_slice("sel", Some(record)),
        BTreeSet::from([Arc::from(ANY_NODE)])
    );
    assert!(index.has_any_node_listings());
    let (c, _) = ClaimRecord::from_claim(&claim(&[("d", "p", "x")]));
    index.set_claim("ns/c", Some(c));
    for node in ["n1", "n7"] {
        let h = index.holdings(node, SystemTime::now());
        assert_eq!(
            h.held.keys().cloned().collect::<Vec<_>>(),
            vec![uuid("GPU-x")]
        );
    }
    assert!(
        !index.knows_node("n7"),
        "no node entry is made for a selector"
    );
    index.set_slice("sel", None);
    index.set_claim("ns/c", None);
    assert!(!index.has_any_node_listings());
    assert!(index.holdings("n1", SystemTime::now()).is_empty());
}

/// Trust IV §3: kubelet wipes a node's slices at every start. While the pool carries the
/// extender's rule the device is remembered (`former`), so the rule is not deleted under a pod
/// of ours; once the rule goes, nothing is remembered; a pool without a rule keeps nothing.
#[test]
fn a_wiped_slice_is_remembered_while_its_pool_carries_the_rule() {
    let mut index = DraIndex::new([]);
    index.set_ownership(Some(std::time::Duration::ZERO));
    let pool = DevicePool {
        driver: Arc::from("gpu.nvidia.com"),
        pool: Arc::from("n1"),
    };
    let rule = RuleRecord {
        pool: pool.clone(),
        created: SystemTime::UNIX_EPOCH,
    };
    index.set_rule("r", Some(rule));
    let (s, _) =
        SliceRecord::from_slice(&slice("n1", "gpu.nvidia.com", "n1", &[("gpu-0", "GPU-a")]));
    index.set_slice("s1", Some(s.clone()));
    let h = index.holdings("n1", SystemTime::now());
    assert!(h.owned.contains(&pool) && h.former.is_empty());

    assert_eq!(
        index.set_slice("s1", None),
        BTreeSet::from([Arc::from("n1")])
    );
    let h = index.holdings("n1", SystemTime::now());
    assert!(h.published.is_empty());
    assert_eq!(h.former[&uuid("GPU-a")], BTreeSet::from([pool.clone()]));
    assert!(index.knows_node("n1"));

    // Republished: published again, not remembered.
    index.set_slice("s1", Some(s.clone()));
    let h = index.holdings("n1", SystemTime::now());
    assert!(h.former.is_empty() && h.published.len() == 1);

    // Wiped again, then the rule goes: forgotten.
    index.set_slice("s1", None);
    assert_eq!(index.set_rule("r", None), BTreeSet::from([Arc::from("n1")]));
    assert!(index.holdings("n1", SystemTime::now()).is_empty());
    assert!(!index.knows_node("n1"));

    // No rule: a wiped slice leaves nothing behind.
    index.set_slice("s1", Some(s));
    index.set_slice("s1", None);
    assert!(index.holdings("n1", SystemTime::now()).is_empty());
}

/// Trust IV §5: a device allocated with `adminAccess` is not counted as allocated by
/// kube-scheduler's allocator (another claim may be given it), so it holds nothing here.
#[test]
fn an_admin_access_result_holds_nothing() {
    let admin: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "mon", "namespace": "ops"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": "d", "pool": "p", "device": "a", "adminAccess": true},
            {"request": "r", "driver": "d", "pool": "p", "device": "b", "adminAccess": false}
        ]}}}
    }))
    .unwrap();
    let (c, problems) = ClaimRecord::from_claim(&admin);
    assert!(problems.is_empty());
    assert_eq!(c.devices.len(), 1);
    assert_eq!(&*c.devices[0].device, "b");
}

// ---- property test against the objects ----

const NODES: [&str; 2] = ["n0", "n1"];
const DEVICES: [&str; 3] = ["d0", "d1", "d2"];

#[derive(Clone, Debug)]
enum Op {
    /// Slice `s` (0..3) on a node, listing devices (name index, uuid index) of pool `p`.
    Slice {
        s: usize,
        node: usize,
        pool: usize,
        devices: Vec<(usize, usize)>,
    },
    DeleteSlice(usize),
    /// Claim `c` (0..4) holding devices (pool, name index).
    Claim {
        c: usize,
        devices: Vec<(usize, usize)>,
    },
    DeleteClaim(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0..3usize,
            0..2usize,
            0..2usize,
            proptest::collection::vec((0..3usize, 0..4usize), 0..4)
        )
            .prop_map(|(s, node, pool, devices)| Op::Slice {
                s,
                node,
                pool,
                devices
            }),
        (0..3usize).prop_map(Op::DeleteSlice),
        (
            0..4usize,
            proptest::collection::vec((0..2usize, 0..3usize), 0..3)
        )
            .prop_map(|(c, devices)| Op::Claim { c, devices }),
        (0..4usize).prop_map(Op::DeleteClaim),
    ]
}

/// The objects as the API server holds them, as JSON.
#[derive(Default)]
struct World {
    slices: BTreeMap<usize, serde_json::Value>,
    claims: BTreeMap<usize, serde_json::Value>,
}

/// Identities per node from the current objects alone.
fn oracle(world: &World) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for claim in world.claims.values() {
        for r in claim["status"]["allocation"]["devices"]["results"]
            .as_array()
            .unwrap()
        {
            for s in world.slices.values() {
                if s["spec"]["driver"] != r["driver"] || s["spec"]["pool"]["name"] != r["pool"] {
                    continue;
                }
                // The first listing of a name in a slice is the one that counts.
                let first = s["spec"]["devices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|d| d["name"] == r["device"]);
                if let Some(d) = first {
                    out.entry(s["spec"]["nodeName"].as_str().unwrap().to_string())
                        .or_default()
                        .insert(
                            d["attributes"]["uuid"]["string"]
                                .as_str()
                                .unwrap()
                                .to_ascii_uppercase(),
                        );
                }
            }
        }
    }
    out
}

proptest! {
    #[test]
    fn held_identities_are_what_the_current_objects_say(ops in proptest::collection::vec(op(), 1..40)) {
        let mut index = DraIndex::new([]);
        let mut world = World::default();
        // Every identity some slice ever stated on a node: the only extra a node may show is
        // such a one, of a device whose slices are all gone while a claim holds it.
        let mut ever: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Slice { s, node, pool, devices } => {
                    let devices: Vec<_> = devices
                        .iter()
                        .map(|(d, u)| json!({"name": DEVICES[*d], "attributes": {"uuid": {"string": format!("gpu-{u}")}}}))
                        .collect();
                    let v = json!({
                        "metadata": {"name": format!("s{s}")},
                        "spec": {"driver": "drv", "pool": {"name": format!("p{pool}")}, "nodeName": NODES[node], "devices": devices}
                    });
                    let typed: ResourceSlice = serde_json::from_value(v.clone()).unwrap();
                    for d in &typed.spec.devices {
                        ever.entry(NODES[node].into()).or_default().insert(
                            d.attributes["uuid"].string.clone().unwrap().to_ascii_uppercase(),
                        );
                    }
                    index.set_slice(&format!("s{s}"), Some(SliceRecord::from_slice(&typed).0));
                    world.slices.insert(s, v);
                }
                Op::DeleteSlice(s) => {
                    index.set_slice(&format!("s{s}"), None);
                    world.slices.remove(&s);
                }
                Op::Claim { c, devices } => {
                    let results: Vec<_> = devices
                        .iter()
                        .map(|(p, d)| json!({"driver": "drv", "pool": format!("p{p}"), "device": DEVICES[*d]}))
                        .collect();
                    let v = json!({
                        "metadata": {"name": format!("c{c}"), "namespace": "ns"},
                        "status": {"allocation": {"devices": {"results": results}}}
                    });
                    let typed: ResourceClaim = serde_json::from_value(v.clone()).unwrap();
                    index.set_claim(&format!("ns/c{c}"), Some(ClaimRecord::from_claim(&typed).0));
                    world.claims.insert(c, v);
                }
                Op::DeleteClaim(c) => {
                    index.set_claim(&format!("ns/c{c}"), None);
                    world.claims.remove(&c);
                }
            }
            let want = oracle(&world);
            for node in NODES {
                let got: BTreeSet<String> = index
                    .holdings(node, SystemTime::now())
                    .held
                    .keys()
                    .map(|id| match id {
                        DeviceIdentity::Uuid(u) => u.clone(),
                        DeviceIdentity::PciBusId(b) => b.clone(),
                    })
                    .collect();
                let want = want.get(node).cloned().unwrap_or_default();
                prop_assert!(got.is_superset(&want), "{node}: held {got:?}, objects say {want:?}");
                let extra: BTreeSet<_> = got.difference(&want).cloned().collect();
                let stated = ever.get(node).cloned().unwrap_or_default();
                prop_assert!(extra.is_subset(&stated), "{node}: {extra:?} never stated there");
                if world.claims.is_empty() {
                    prop_assert!(got.is_empty(), "{node}: held {got:?} with no claim");
                }
            }
        }
    }
}
