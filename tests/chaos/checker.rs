//! The independent checker: what the API server's Pods and Devices say is held, computed from
//! the API objects alone. It parses the koordinator annotations and quantities itself (from
//! `reference/koord-deviceshare.md` §2.4 and `reference/numa.md` §0.5) and never calls the
//! crate: a shared parser bug would otherwise hide itself.
//!
//! Invariants (DESIGN.md: "never hands out a device or CPU that is already in use"):
//! 1. per node, device type and minor, the sum of every resource dimension over assigned,
//!    non-terminal pods (terminating ones included: they still run) ≤ the minor's capacity;
//! 2. no allocation first seen after a device was unhealthy, removed, or its node's Device
//!    object missing (at the start of the scheduling round) names that device;
//! 3. no CPU is in two pods' exclusive cpusets (`resource-status` `cpuset`) on one node;
//! 4. at quiescence, the service's `/debug/nodes/{name}` ledger equals this view;
//! 5. every new allocation carries exactly what its pod asked (summed per asked dimension,
//!    whole GPUs as distinct cards), and an exclusive cpuset is as large as the CPU request:
//!    capacity sums alone pass an allocator that records less than it hands out;
//! 6. per NUMA node, the `numaNodeResources` of its holders fit the NRT zone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

pub const DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";
pub const RESOURCE_STATUS: &str = "scheduling.koordinator.sh/resource-status";

/// (device type, minor) → resource name → amount in milli-units.
pub type Allocation = BTreeMap<(String, i64), BTreeMap<String, i128>>;

/// A Kubernetes quantity in milli-units: plain or decimal numbers, binary (Ki..Ei) and decimal
/// (k, M, G, T, P, E, m) suffixes. Enough for what Devices and allocations carry.
pub fn parse_quantity(s: &str) -> Option<i128> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let mult: i128 = match suffix {
        "" => 1000,
        "m" => 1,
        "k" => 1000 * 1000,
        "M" => 1000 * 1_000_000,
        "G" => 1000 * 1_000_000_000,
        "T" => 1000 * 1_000_000_000_000,
        "P" => 1000 * 1_000_000_000_000_000,
        "Ki" => 1000 << 10,
        "Mi" => 1000 << 20,
        "Gi" => 1000 << 30,
        "Ti" => 1000 << 40,
        "Pi" => 1000 << 50,
        "Ei" => 1000 << 60,
        _ => return None,
    };
    if num.is_empty() {
        return None;
    }
    match num.split_once('.') {
        None => num.parse::<i128>().ok()?.checked_mul(mult),
        Some((int, frac)) => {
            let neg = int.starts_with('-');
            let int_v: i128 = if int.is_empty() || int == "-" {
                0
            } else {
                int.parse().ok()?
            };
            let frac_digits = frac.len() as u32;
            if frac_digits > 18 || !frac.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            let frac_v: i128 = if frac.is_empty() {
                0
            } else {
                frac.parse().ok()?
            };
            let scale = 10i128.pow(frac_digits);
            let whole = int_v.checked_mul(mult)?;
            let part = frac_v.checked_mul(mult)? / scale;
            Some(if neg { whole - part } else { whole + part })
        }
    }
}

/// The `device-allocated` annotation: `{type: [{minor, resources: {name: quantity}}, ...]}`.
pub fn parse_device_allocated(s: &str) -> Result<Allocation, String> {
    let v: Value = serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))?;
    let types = v.as_object().ok_or("not an object")?;
    let mut out = Allocation::new();
    for (ty, entries) in types {
        for e in entries
            .as_array()
            .ok_or_else(|| format!("{ty}: not an array"))?
        {
            let minor = e["minor"]
                .as_i64()
                .ok_or_else(|| format!("{ty}: entry without an integer minor: {e}"))?;
            let slot = out.entry((ty.clone(), minor)).or_default();
            for (name, q) in e["resources"].as_object().into_iter().flatten() {
                let amount = q
                    .as_str()
                    .and_then(parse_quantity)
                    .ok_or_else(|| format!("{ty}/{minor}: bad quantity {name}={q}"))?;
                *slot.entry(name.clone()).or_default() += amount;
            }
        }
    }
    Ok(out)
}

/// A Linux CPU list (`0-3,8,10-11`).
pub fn parse_cpu_list(s: &str) -> Result<BTreeSet<u32>, String> {
    let mut out = BTreeSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let a: u32 = a
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad cpu range {part:?}"))?;
                let b: u32 = b
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad cpu range {part:?}"))?;
                if a > b || b - a > 100_000 {
                    return Err(format!("bad cpu range {part:?}"));
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(part.parse().map_err(|_| format!("bad cpu {part:?}"))?);
            }
        }
    }
    Ok(out)
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["annotations"][key].as_str()
}

fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or("")
}

fn uid(obj: &Value) -> &str {
    obj["metadata"]["uid"].as_str().unwrap_or("")
}

/// The node a pod is assigned to, if it is assigned and not terminal (terminating pods still
/// hold what they hold).
pub fn holding_node(pod: &Value) -> Option<&str> {
    let node = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty())?;
    match pod["status"]["phase"].as_str() {
        Some("Succeeded" | "Failed") => None,
        _ => Some(node),
    }
}

/// Device resource names as the API objects spell them (current and koordinator's deprecated
/// ones): a pod naming one in a container asks for managed devices.
const DEVICE_NAMES: [&str; 19] = [
    "nvidia.com/gpu",
    "amd.com/gpu",
    "dcu.com/gpu",
    "koordinator.sh/gpu",
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/gpu.shared",
    "huawei.com/npu-core",
    "huawei.com/npu-cpu",
    "huawei.com/npu-dvpp",
    "koordinator.sh/rdma",
    "koordinator.sh/fpga",
    "kubernetes.io/gpu",
    "kubernetes.io/gpu-core",
    "kubernetes.io/gpu-memory",
    "kubernetes.io/gpu-memory-ratio",
    "kubernetes.io/rdma",
    "kubernetes.io/fpga",
];

/// Per node, the pods that hold devices of unknown identity there (issue 36 §4): bound, not
/// terminal, asking for a device resource, with no `device-allocated` annotation (a pod
/// another scheduler bound, or one that preset `spec.nodeName`).
pub fn unknown_holders(pods: &[Value]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for pod in pods {
        let Some(node) = holding_node(pod) else {
            continue;
        };
        if annotation(pod, DEVICE_ALLOCATED).is_some() {
            continue;
        }
        let asks = pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(
                pod["spec"]["initContainers"]
                    .as_array()
                    .into_iter()
                    .flatten(),
            )
            .flat_map(|c| ["requests", "limits"].map(|l| &c["resources"][l]))
            .flat_map(|list| list.as_object().into_iter().flatten())
            .any(|(name, q)| {
                DEVICE_NAMES.contains(&name.as_str())
                    && q.as_str().and_then(parse_quantity).is_some_and(|v| v > 0)
            });
        if asks {
            out.entry(node.to_string())
                .or_default()
                .insert(uid(pod).to_string());
        }
    }
    out
}

/// What a pod asks of managed devices, summed over its containers (an init container's ask
/// counts where it is larger, as kube-scheduler counts it), in milli-units, keyed by the name
/// koordinator records it under (`reference/koord-deviceshare.md` §2.2: whole-GPU names become
/// `gpu-core` and `gpu-memory-ratio` of N×100 each and N cards; `koordinator.sh/gpu` both of v;
/// deprecated `kubernetes.io/*` names their `koordinator.sh/*` twins). `"cards"` is the number
/// of distinct GPUs the pod must hold (whole GPUs or `gpu.shared`), where it says.
pub fn device_asks(pod: &Value) -> BTreeMap<String, i128> {
    fn of(c: &Value) -> BTreeMap<String, i128> {
        let mut out: BTreeMap<String, i128> = BTreeMap::new();
        let requests = c["resources"]["requests"].as_object();
        let limits = c["resources"]["limits"].as_object();
        let mut names: BTreeSet<&String> = BTreeSet::new();
        names.extend(requests.into_iter().flatten().map(|(k, _)| k));
        names.extend(limits.into_iter().flatten().map(|(k, _)| k));
        for n in names {
            // Extended resources: a limit without a request is the request.
            let q = requests
                .and_then(|r| r.get(n))
                .or_else(|| limits.and_then(|l| l.get(n)))
                .and_then(Value::as_str)
                .and_then(parse_quantity)
                .unwrap_or(0);
            let name = n
                .strip_prefix("kubernetes.io/")
                .map_or(n.clone(), |rest| format!("koordinator.sh/{rest}"));
            let mut add = |k: &str, v: i128| *out.entry(k.to_string()).or_default() += v;
            match name.as_str() {
                "nvidia.com/gpu" | "amd.com/gpu" | "dcu.com/gpu" => {
                    add("koordinator.sh/gpu-core", q * 100);
                    add("koordinator.sh/gpu-memory-ratio", q * 100);
                    add("cards", q);
                }
                "koordinator.sh/gpu" => {
                    add("koordinator.sh/gpu-core", q);
                    add("koordinator.sh/gpu-memory-ratio", q);
                }
                "koordinator.sh/gpu.shared" => add("cards", q),
                "koordinator.sh/gpu-core"
                | "koordinator.sh/gpu-memory"
                | "koordinator.sh/gpu-memory-ratio"
                | "koordinator.sh/rdma"
                | "koordinator.sh/fpga" => add(&name, q),
                _ => {}
            }
        }
        out.retain(|_, v| *v > 0);
        out
    }
    let mut total: BTreeMap<String, i128> = BTreeMap::new();
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        for (k, v) in of(c) {
            *total.entry(k).or_default() += v;
        }
    }
    for c in pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for (k, v) in of(c) {
            let t = total.entry(k).or_default();
            *t = (*t).max(v);
        }
    }
    total
}

/// Why an allocation does not carry what its pod asked (`None`: it does): every asked
/// dimension summed over the recorded entries equals the ask (`"cards"`: that many distinct
/// GPUs). Under-recording passes every capacity sum; this is the check that catches it. Only
/// dimensions the pod names are judged: koordinator fills others (a ratio's GPU memory).
pub fn carries_what_was_asked(asks: &BTreeMap<String, i128>, alloc: &Allocation) -> Option<String> {
    let mut problems = Vec::new();
    for (dim, want) in asks {
        let got: i128 = if dim == "cards" {
            1000 * alloc.keys().filter(|(ty, _)| ty == "gpu").count() as i128
        } else {
            alloc.values().filter_map(|r| r.get(dim)).sum()
        };
        if got != *want {
            problems.push(format!("{dim}: asked {want}, recorded {got} (milli)"));
        }
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// One Device entry: health and capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    pub healthy: bool,
    pub capacity: BTreeMap<String, i128>,
}

/// A Device object's entries by (type, minor); the first entry of a duplicated minor wins.
pub fn device_slots(device: &Value) -> BTreeMap<(String, i64), Slot> {
    let mut out = BTreeMap::new();
    for d in device["spec"]["devices"].as_array().into_iter().flatten() {
        let (Some(ty), Some(minor)) = (d["type"].as_str(), d["minor"].as_i64()) else {
            continue;
        };
        let capacity = d["resources"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, q)| Some((k.clone(), parse_quantity(q.as_str()?)?)))
            .collect();
        out.entry((ty.to_string(), minor)).or_insert(Slot {
            healthy: d["health"].as_bool().unwrap_or(false),
            capacity,
        });
    }
    out
}

/// Where nothing may be newly allocated: unhealthy or absent minors, and GPU nodes whose
/// Device object is missing. Taken at the start of a scheduling round.
#[derive(Clone, Debug, Default)]
pub struct Forbidden {
    pub minors: BTreeSet<(String, String, i64)>,
    pub deviceless: BTreeSet<String>,
}

#[derive(Default)]
pub struct Checker {
    /// Last known capacity of every minor ever seen, so a minor removed by a shrink still
    /// bounds the pods that hold it.
    capacity: BTreeMap<(String, String, i64), BTreeMap<String, i128>>,
    /// (uid, node, annotation) of allocations already judged against [`Forbidden`].
    seen: BTreeSet<(String, String, String)>,
    pub violations: Vec<String>,
    pub checks: u64,
    pub allocations_seen: u64,
    /// (uid, node, cpuset) of non-empty cpusets already judged by invariant 3.
    seen_cpusets: BTreeSet<(String, String, String)>,
    pub cpusets_seen: u64,
    /// Every CPU id each node's NodeResourceTopology has ever listed in its
    /// `node.koordinator.sh/cpu-topology` annotation (the union, as with `capacity`).
    cpu_ids: BTreeMap<String, BTreeSet<u32>>,
    /// Each node's NUMA zones (`node-N`): NUMA node → resource → allocatable milli-units, the
    /// largest ever listed.
    zones: BTreeMap<String, BTreeMap<i64, BTreeMap<String, i128>>>,
    /// (uid, node, resource-status) of NUMA-bound allocations already counted.
    seen_numa: BTreeSet<(String, String, String)>,
    pub numa_allocations_seen: u64,
}

impl Checker {
    /// Records the CPU ids of every NodeResourceTopology's koordinator CPU topology.
    pub fn observe_topologies(&mut self, nrts: &[Value]) {
        for nrt in nrts {
            let Some(a) = annotation(nrt, "node.koordinator.sh/cpu-topology") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(a) else {
                continue;
            };
            let ids = self.cpu_ids.entry(name(nrt).to_string()).or_default();
            for cpu in v["detail"].as_array().into_iter().flatten() {
                if let Some(id) = cpu["id"].as_u64() {
                    ids.insert(id as u32);
                }
            }
        }
        for nrt in nrts {
            let zones = self.zones.entry(name(nrt).to_string()).or_default();
            for z in nrt["zones"].as_array().into_iter().flatten() {
                let Some(numa) = z["name"]
                    .as_str()
                    .and_then(|n| n.strip_prefix("node-"))
                    .and_then(|n| n.parse::<i64>().ok())
                else {
                    continue;
                };
                let zone = zones.entry(numa).or_default();
                for r in z["resources"].as_array().into_iter().flatten() {
                    if let (Some(rn), Some(v)) = (
                        r["name"].as_str(),
                        r["allocatable"].as_str().and_then(parse_quantity),
                    ) {
                        let e = zone.entry(rn.to_string()).or_default();
                        *e = (*e).max(v);
                    }
                }
            }
        }
    }

    /// Records the current capacity of every present minor; returns what is forbidden now.
    /// `gpu_nodes` are the nodes that are meant to have a Device object.
    pub fn observe_devices(&mut self, devices: &[Value], gpu_nodes: &[String]) -> Forbidden {
        let mut forbidden = Forbidden::default();
        let mut present: BTreeSet<&str> = BTreeSet::new();
        for dev in devices {
            let node = name(dev).to_string();
            present.insert(name(dev));
            let slots = device_slots(dev);
            for ((ty, minor), slot) in &slots {
                self.capacity
                    .insert((node.clone(), ty.clone(), *minor), slot.capacity.clone());
                if !slot.healthy {
                    forbidden.minors.insert((node.clone(), ty.clone(), *minor));
                }
            }
            // Minors known before but absent now (a shrink) are forbidden.
            for (n, ty, minor) in self.capacity.keys() {
                if n == &node && !slots.contains_key(&(ty.clone(), *minor)) {
                    forbidden.minors.insert((n.clone(), ty.clone(), *minor));
                }
            }
        }
        for n in gpu_nodes {
            if !present.contains(n.as_str()) {
                forbidden.deviceless.insert(n.clone());
            }
        }
        forbidden
    }

    /// The per-node view of what assigned, non-terminal pods hold: node → uid → allocation.
    pub fn holdings(
        pods: &[Value],
    ) -> (BTreeMap<String, BTreeMap<String, Allocation>>, Vec<String>) {
        let mut out: BTreeMap<String, BTreeMap<String, Allocation>> = BTreeMap::new();
        let mut problems = Vec::new();
        for pod in pods {
            let Some(node) = holding_node(pod) else {
                continue;
            };
            let Some(a) = annotation(pod, DEVICE_ALLOCATED) else {
                continue;
            };
            match parse_device_allocated(a) {
                Ok(alloc) => {
                    out.entry(node.to_string())
                        .or_default()
                        .insert(uid(pod).to_string(), alloc);
                }
                Err(e) => problems.push(format!(
                    "pod {} on {node} has an unparseable {DEVICE_ALLOCATED}: {e}: {a}",
                    name(pod)
                )),
            }
        }
        (out, problems)
    }

    /// [`Checker::check_with`] where every new allocation comes from a round that began when
    /// `forbidden` held.
    pub fn check(&mut self, step: u64, pods: &[Value], forbidden: &Forbidden) {
        let f = Arc::new(forbidden.clone());
        self.check_with(step, pods, |_| vec![f.clone()]);
    }

    /// Checks invariants 1–3 on the API server's current pods. `rounds(uid)` gives what was
    /// forbidden at the start of each bind round that may have produced the pod's allocation
    /// (a bind detached by a timeout can land rounds later): a new allocation on a device is a
    /// violation only if that device was forbidden in every one of them.
    pub fn check_with(
        &mut self,
        step: u64,
        pods: &[Value],
        rounds: impl Fn(&str) -> Vec<Arc<Forbidden>>,
    ) {
        self.checks += 1;
        let (holdings, problems) = Self::holdings(pods);
        for p in problems {
            self.violations.push(format!("step {step}: {p}"));
        }
        for (node, by_uid) in &holdings {
            let mut sums: BTreeMap<(String, i64), BTreeMap<String, i128>> = BTreeMap::new();
            for alloc in by_uid.values() {
                for (slot, res) in alloc {
                    let s = sums.entry(slot.clone()).or_default();
                    for (r, v) in res {
                        *s.entry(r.clone()).or_default() += v;
                    }
                }
            }
            for ((ty, minor), used) in &sums {
                let Some(cap) = self.capacity.get(&(node.clone(), ty.clone(), *minor)) else {
                    self.violations.push(format!(
                        "step {step}: {node} {ty}/{minor} is held ({used:?}) but no Device ever had it"
                    ));
                    continue;
                };
                for (r, v) in used {
                    let c = cap.get(r).copied().unwrap_or(0);
                    if *v > c {
                        let who: Vec<String> = by_uid
                            .iter()
                            .filter(|(_, a)| a.contains_key(&(ty.clone(), *minor)))
                            .map(|(u, _)| u.clone())
                            .collect();
                        self.violations.push(format!(
                            "step {step}: OVER-ALLOCATION on {node} {ty}/{minor} {r}: {v} > {c} (milli), held by {who:?}"
                        ));
                    }
                }
            }
        }
        // Invariant 2: allocations first seen now must avoid what was forbidden.
        for pod in pods {
            let Some(node) = holding_node(pod) else {
                continue;
            };
            let Some(a) = annotation(pod, DEVICE_ALLOCATED) else {
                continue;
            };
            let key = (uid(pod).to_string(), node.to_string(), a.to_string());
            if self.seen.contains(&key) {
                continue;
            }
            self.seen.insert(key);
            self.allocations_seen += 1;
            let Ok(alloc) = parse_device_allocated(a) else {
                continue;
            };
            // Invariant 5: the allocation carries what the pod asked.
            let asks = device_asks(pod);
            if !asks.is_empty()
                && let Some(why) = carries_what_was_asked(&asks, &alloc)
            {
                self.violations.push(format!(
                    "step {step}: pod {} on {node} holds less or more than it asked: {why}: {a}",
                    name(pod)
                ));
            }
            let candidates = rounds(uid(pod));
            if candidates.is_empty() {
                continue;
            }
            if candidates.iter().all(|f| f.deviceless.contains(node)) && !alloc.is_empty() {
                self.violations.push(format!(
                    "step {step}: pod {} allocated on {node} while its Device object was missing: {a}",
                    name(pod)
                ));
            }
            for (ty, minor) in alloc.keys() {
                let slot = (node.to_string(), ty.clone(), *minor);
                if candidates.iter().all(|f| f.minors.contains(&slot)) {
                    self.violations.push(format!(
                        "step {step}: pod {} newly allocated {node} {ty}/{minor}, which was unhealthy or absent",
                        name(pod)
                    ));
                }
            }
        }
        // Invariant 6: per NUMA node, what holders record in `numaNodeResources` fits the
        // zone (NUMA-policy nodes record every pod's share there).
        let mut numa_used: BTreeMap<(&str, i64), BTreeMap<String, i128>> = BTreeMap::new();
        for pod in pods {
            let (Some(node), Some(rs)) = (holding_node(pod), annotation(pod, RESOURCE_STATUS))
            else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(rs) else {
                continue; // reported below
            };
            let numa = v["numaNodeResources"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !numa.is_empty()
                && self
                    .seen_numa
                    .insert((uid(pod).to_string(), node.to_string(), rs.to_string()))
            {
                self.numa_allocations_seen += 1;
            }
            for n in numa {
                let Some(id) = n["node"].as_i64() else {
                    self.violations.push(format!(
                        "step {step}: pod {} has a numaNodeResources entry without a node: {rs}",
                        name(pod)
                    ));
                    continue;
                };
                let used = numa_used.entry((node, id)).or_default();
                for (r, q) in n["resources"].as_object().into_iter().flatten() {
                    match q.as_str().and_then(parse_quantity) {
                        Some(v) => *used.entry(r.clone()).or_default() += v,
                        None => self.violations.push(format!(
                            "step {step}: pod {} has a bad numaNodeResources quantity {r}={q}",
                            name(pod)
                        )),
                    }
                }
            }
        }
        for ((node, id), used) in &numa_used {
            let Some(zone) = self.zones.get(*node).and_then(|z| z.get(id)) else {
                self.violations.push(format!(
                    "step {step}: {node} NUMA node {id} is held ({used:?}) but no NRT zone node-{id} was ever listed"
                ));
                continue;
            };
            for (r, v) in used {
                if let Some(c) = zone.get(r)
                    && v > c
                {
                    self.violations.push(format!(
                        "step {step}: NUMA OVER-ALLOCATION on {node} NUMA node {id} {r}: {v} > {c} (milli)"
                    ));
                }
            }
        }
        // Invariant 3: exclusive cpusets are disjoint per node.
        let mut cpus: BTreeMap<&str, BTreeMap<u32, &str>> = BTreeMap::new();
        for pod in pods {
            let Some(node) = holding_node(pod) else {
                continue;
            };
            let Some(rs) = annotation(pod, RESOURCE_STATUS) else {
                continue;
            };
            let cpuset = match serde_json::from_str::<Value>(rs) {
                Ok(v) => v["cpuset"].as_str().unwrap_or("").to_string(),
                Err(e) => {
                    self.violations.push(format!(
                        "step {step}: pod {} has an unparseable {RESOURCE_STATUS}: {e}",
                        name(pod)
                    ));
                    continue;
                }
            };
            match parse_cpu_list(&cpuset) {
                Ok(set) => {
                    if !set.is_empty()
                        && let Some(want) = integer_cpus(pod)
                        && set.len() != want as usize
                    {
                        self.violations.push(format!(
                            "step {step}: pod {} asked for {want} CPUs and holds {cpuset:?}",
                            name(pod)
                        ));
                    }
                    if let Some(ids) = self.cpu_ids.get(node)
                        && let Some(bad) = set.iter().find(|c| !ids.contains(c))
                    {
                        self.violations.push(format!(
                            "step {step}: pod {} holds CPU {bad} on {node}, which its topology does not have",
                            name(pod)
                        ));
                    }
                    if !set.is_empty()
                        && self.seen_cpusets.insert((
                            uid(pod).to_string(),
                            node.to_string(),
                            cpuset.clone(),
                        ))
                    {
                        self.cpusets_seen += 1;
                    }
                    let owners = cpus.entry(node).or_default();
                    for cpu in set {
                        if let Some(other) = owners.insert(cpu, name(pod)) {
                            self.violations.push(format!(
                                "step {step}: CPU {cpu} on {node} is in the cpusets of {other} and {}",
                                name(pod)
                            ));
                        }
                    }
                }
                Err(e) => self.violations.push(format!(
                    "step {step}: pod {} has a bad cpuset {cpuset:?}: {e}",
                    name(pod)
                )),
            }
        }
    }
}

/// Differences between a service's `/debug/nodes/{node}` view and what the API objects say.
#[derive(Debug, Default)]
pub struct LedgerDiff {
    /// Real disagreements.
    pub problems: Vec<String>,
    /// Assumed entries whose pod is not assigned to this node (issue 11's leak).
    pub stale_assumed: Vec<String>,
}

fn parse_rendered(map: &Value) -> BTreeMap<String, i128> {
    map.as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, q)| Some((k.clone(), parse_quantity(q.as_str()?)?)))
        .filter(|(_, v)| *v != 0)
        .collect()
}

/// Compares one node of the ledger (`debug["state"]["devices"]`) with the pods that hold on it
/// according to the API server: committed entries must be exactly the holding pods with their
/// annotations; assumed entries are either a holding pod not yet confirmed or stale; `used`
/// per minor must equal the sum of every entry.
pub fn compare_ledger(
    node: &str,
    debug: &Value,
    holding: &BTreeMap<String, Allocation>,
    unknown: &BTreeSet<String>,
) -> LedgerDiff {
    let mut diff = LedgerDiff::default();
    let devices = &debug["state"]["devices"];
    let mut seen = BTreeSet::new();
    let mut sums: BTreeMap<(String, i64), BTreeMap<String, i128>> = BTreeMap::new();
    // Unknown-identity holders: an entry exactly for each (where the node has a Device object
    // to count them on), wherever the allocator put it, or a blocking one if nothing was left.
    for (uid, e) in devices["entries"].as_object().into_iter().flatten() {
        if e["state"] == "unknown-identity" && !unknown.contains(uid) {
            diff.problems.push(format!(
                "{node}: unknown-identity entry {uid} for a pod that is not bound here without an annotation"
            ));
        }
    }
    if devices["device_object_present"] == true {
        for uid in unknown {
            if devices["entries"][uid]["state"] != "unknown-identity" {
                diff.problems.push(format!(
                    "{node}: pod {uid} is bound here without an annotation and asks for devices, but the ledger counts nothing for it"
                ));
            }
        }
    }
    for (uid, e) in devices["entries"].as_object().into_iter().flatten() {
        let state = e["state"].as_str().unwrap_or("?");
        if state == "unknown-identity" && e["malformed"].is_string() {
            continue;
        }
        let alloc = match e["allocation"].as_str().map(parse_device_allocated) {
            Some(Ok(a)) => a,
            other => {
                diff.problems.push(format!(
                    "{node}: entry {uid} ({state}) has no parseable allocation: {other:?} {e}"
                ));
                continue;
            }
        };
        for (slot, res) in &alloc {
            let s = sums.entry(slot.clone()).or_default();
            for (r, v) in res {
                *s.entry(r.clone()).or_default() += v;
            }
        }
        match (state, holding.get(uid)) {
            ("unknown-identity", _) => {}
            ("committed", Some(want)) if *want == alloc => {
                seen.insert(uid.clone());
            }
            ("committed", Some(want)) => diff.problems.push(format!(
                "{node}: committed entry {uid} is {alloc:?}, the pod's annotation says {want:?}"
            )),
            ("committed", None) => diff.problems.push(format!(
                "{node}: committed entry {uid} for a pod that does not hold anything here"
            )),
            ("assumed", Some(want)) if *want == alloc => {
                // Bound here, the watch has not confirmed it yet: not quiescent.
                diff.problems.push(format!(
                    "{node}: entry {uid} still assumed although its pod is bound here"
                ));
                seen.insert(uid.clone());
            }
            ("assumed", Some(want)) => diff.problems.push(format!(
                "{node}: assumed entry {uid} is {alloc:?}, the bound pod's annotation says {want:?}"
            )),
            ("assumed", None) => diff
                .stale_assumed
                .push(format!("{node}/{uid}: {}", e["allocation"])),
            (other, _) => diff
                .problems
                .push(format!("{node}: entry {uid} in state {other:?}")),
        }
    }
    for uid in holding.keys() {
        if !seen.contains(uid) {
            diff.problems.push(format!(
                "{node}: pod {uid} holds {:?} but the ledger has no entry",
                holding[uid]
            ));
        }
    }
    for (ty, minors) in devices["types"].as_object().into_iter().flatten() {
        for (minor, view) in minors.as_object().into_iter().flatten() {
            let Ok(m) = minor.parse::<i64>() else {
                diff.problems.push(format!("{node}: minor key {minor:?}"));
                continue;
            };
            let used = parse_rendered(&view["used"]);
            let want = sums.remove(&(ty.clone(), m)).unwrap_or_default();
            let want: BTreeMap<String, i128> = want.into_iter().filter(|(_, v)| *v != 0).collect();
            if used != want {
                diff.problems.push(format!(
                    "{node}: {ty}/{minor} used {used:?}, entries sum to {want:?}"
                ));
            }
        }
    }
    for (slot, want) in sums {
        if want.values().any(|v| *v != 0) {
            diff.problems.push(format!(
                "{node}: entries hold {slot:?} = {want:?} but the ledger shows no such minor"
            ));
        }
    }
    diff
}

/// The cpuset a pod holds per its `resource-status` annotation (`None`: no annotation or no
/// cpuset in it); `Err` names what does not parse.
pub fn cpuset_of(pod: &Value) -> Result<Option<BTreeSet<u32>>, String> {
    let Some(rs) = annotation(pod, RESOURCE_STATUS) else {
        return Ok(None);
    };
    let v: Value = serde_json::from_str(rs).map_err(|e| format!("{RESOURCE_STATUS}: {e}"))?;
    match v["cpuset"].as_str() {
        None | Some("") => Ok(None),
        Some(list) => parse_cpu_list(list).map(Some),
    }
}

/// node → uid → cpuset, for assigned, non-terminal pods holding one.
pub fn cpuset_holdings(pods: &[Value]) -> BTreeMap<String, BTreeMap<String, BTreeSet<u32>>> {
    let mut out: BTreeMap<String, BTreeMap<String, BTreeSet<u32>>> = BTreeMap::new();
    for pod in pods {
        let Some(node) = holding_node(pod) else {
            continue;
        };
        if let Ok(Some(set)) = cpuset_of(pod) {
            out.entry(node.to_string())
                .or_default()
                .insert(uid(pod).to_string(), set);
        }
    }
    out
}

/// The pod's whole-CPU request (sum over its containers), if its cpu request is integral.
pub fn integer_cpus(pod: &Value) -> Option<u32> {
    let mut milli = 0i128;
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        if let Some(q) = c["resources"]["requests"]["cpu"].as_str() {
            milli += parse_quantity(q)?;
        }
    }
    (milli > 0 && milli % 1000 == 0).then_some((milli / 1000) as u32)
}

/// Compares the CPU half of one node's `/debug` view (`state.cpus.allocated_by_pod`) with the
/// cpusets the API server's pods hold there: every committed cpuset entry is a holding pod
/// with the same cpuset; every holding pod has an entry; assumed entries without a holding
/// pod are stale (issue 11).
pub fn compare_cpu_ledger(
    node: &str,
    debug: &Value,
    holding: &BTreeMap<String, BTreeSet<u32>>,
) -> LedgerDiff {
    let mut diff = LedgerDiff::default();
    let mut seen = BTreeSet::new();
    for (uid, e) in debug["state"]["cpus"]["allocated_by_pod"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let state = e["state"].as_str().unwrap_or("?");
        let cpuset = match e["resource_status"].as_str() {
            None => None,
            Some(rs) => match serde_json::from_str::<Value>(rs) {
                Ok(v) => match v["cpuset"].as_str() {
                    None | Some("") => None,
                    Some(list) => match parse_cpu_list(list) {
                        Ok(set) => Some(set),
                        Err(err) => {
                            diff.problems
                                .push(format!("{node}: CPU entry {uid}: {err}: {rs}"));
                            continue;
                        }
                    },
                },
                Err(err) => {
                    diff.problems
                        .push(format!("{node}: CPU entry {uid}: {err}: {rs}"));
                    continue;
                }
            },
        };
        let Some(cpuset) = cpuset else {
            continue;
        };
        match (state, holding.get(uid)) {
            ("committed", Some(want)) if *want == cpuset => {
                seen.insert(uid.clone());
            }
            ("committed", want) => diff.problems.push(format!(
                "{node}: committed CPU entry {uid} holds {cpuset:?}, the pod says {want:?}"
            )),
            ("assumed", Some(_)) => {
                diff.problems.push(format!(
                    "{node}: CPU entry {uid} still assumed although its pod is bound here"
                ));
                seen.insert(uid.clone());
            }
            ("assumed", None) => diff
                .stale_assumed
                .push(format!("{node}/{uid}: cpuset {cpuset:?}")),
            (other, _) => diff
                .problems
                .push(format!("{node}: CPU entry {uid} in state {other:?}")),
        }
    }
    for (uid, set) in holding {
        if !seen.contains(uid) {
            diff.problems.push(format!(
                "{node}: pod {uid} holds cpuset {set:?} but the CPU ledger has no entry"
            ));
        }
    }
    diff
}
