//! A node's CPU information as its NodeResourceTopology states it ([`NrtCpuInfo`]): the CPU
//! topology annotation (parsed once per distinct value, cached per thread), the NUMA zones,
//! the kubelet's policies, and every problem found ([`NrtProblem`]). Parsing only: what pods
//! hold is the ledger's (`cluster::cpus`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::model::cpuset::CpuSet;
use crate::model::koord_cpu::{
    self, CPU_TOPOLOGY, KUBELET_CPU_MANAGER_POLICY, KoordCpuError, NODE_RESERVATION,
    POD_CPU_ALLOCS, SYSTEM_QOS_RESOURCE,
};
use crate::model::nrt::{Attribute, Zone};
use crate::model::quantity::Quantity;
use crate::placement::cpu::{
    CpuTopology, MAX_NUMA_NODES, NumaId, NumaPolicy, NumaZone, TopologyError,
};

/// One thing wrong with a node's NRT (a malformed annotation, an unusable zone).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NrtProblem {
    /// The annotation's short key (`cpu-topology`) or `zones`.
    pub annotation: String,
    /// Short label for metrics (`bad_json`, `duplicate_cpu`, `negative`, ...).
    pub problem: &'static str,
    pub message: String,
}

impl NrtProblem {
    fn from_error(e: &KoordCpuError) -> Self {
        NrtProblem {
            annotation: koord_cpu::short_key(e.annotation()).to_string(),
            problem: e.class(),
            message: e.to_string(),
        }
    }
    fn topology(e: &TopologyError) -> Self {
        let problem = match e {
            TopologyError::Empty => "empty",
            TopologyError::CpuOutOfRange { .. } => "out_of_range",
            TopologyError::DuplicateCpu { .. } => "duplicate_cpu",
            TopologyError::NumaOutOfRange { .. } => "out_of_range",
        };
        NrtProblem {
            annotation: koord_cpu::short_key(CPU_TOPOLOGY).to_string(),
            problem,
            message: format!("annotation {CPU_TOPOLOGY}: {e}"),
        }
    }
    fn zone(problem: &'static str, message: String) -> Self {
        NrtProblem {
            annotation: "zones".into(),
            problem,
            message,
        }
    }
}

/// What one NodeResourceTopology says about CPUs, parsed once per NRT change.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NrtCpuInfo {
    /// `None` when the cpu-topology annotation is absent or unusable.
    pub topology: Option<Arc<CpuTopology>>,
    /// kubelet `static` with `full-pcpus-only`: forces FullPCPUsOnly on the node.
    pub kubelet_full_pcpus_only: bool,
    /// Never handed out: kubelet reserved ∪ kubelet-static pods ∪ node reservation ∪
    /// exclusive system QoS (koordinator `topology_options.go`).
    pub reserved: CpuSet,
    /// `type: Node` zones by ascending id: `allocatable` (never `available`, which koordlet
    /// copies from allocatable and never updates), cpu reduced by the reserved CPUs in it.
    pub zones: Vec<NumaZone>,
    /// The NUMA policy the NRT states (label overrides are applied with the node's labels).
    pub policy: NumaPolicy,
    /// Malformed annotations and unusable zones. Any problem makes the node unable to take
    /// cpuset pods: what is reserved or which CPU is where is then unknown.
    pub problems: Vec<NrtProblem>,
}

type TopologyReading = Result<Arc<CpuTopology>, NrtProblem>;

/// `node.koordinator.sh/cpu-topology` read into a topology, or the problem with it.
fn parse_topology(v: &str) -> TopologyReading {
    let details = koord_cpu::parse_cpu_topology(v).map_err(|e| NrtProblem::from_error(&e))?;
    CpuTopology::new(details)
        .map(Arc::new)
        .map_err(|e| NrtProblem::topology(&e))
}

thread_local! {
    /// The last cpu-topology annotation this thread read, with its reading. Node pools are
    /// homogeneous: listing thousands of NRTs mostly repeats one annotation, and parsing it
    /// (JSON, then the topology) was most of decoding an NRT at bootstrap.
    static LAST_TOPOLOGY: std::cell::RefCell<Option<(String, TopologyReading)>> =
        const { std::cell::RefCell::new(None) };
}

/// [`parse_topology`], reusing the previous reading when the annotation is the same text (the
/// topology is immutable and shared; the result is the same either way).
fn parse_topology_cached(v: &str) -> TopologyReading {
    LAST_TOPOLOGY.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((text, reading)) = last.as_ref()
            && text == v
        {
            return reading.clone();
        }
        let reading = parse_topology(v);
        *last = Some((v.to_owned(), reading.clone()));
        reading
    })
}

impl NrtCpuInfo {
    pub fn parse(
        zones: &[Zone],
        policies: &[String],
        attributes: &[Attribute],
        annotations: &BTreeMap<String, String>,
    ) -> Self {
        let mut problems = Vec::new();
        let mut note = |r: Result<CpuSet, KoordCpuError>| match r {
            Ok(s) => s,
            Err(e) => {
                problems.push(NrtProblem::from_error(&e));
                CpuSet::new()
            }
        };
        let mut kubelet_full_pcpus_only = false;
        let mut reserved = CpuSet::new();
        if let Some(v) = annotations.get(KUBELET_CPU_MANAGER_POLICY) {
            let k = koord_cpu::parse_kubelet_cpu_policy(v).map(|k| {
                kubelet_full_pcpus_only = k.full_pcpus_only;
                k.reserved
            });
            reserved = reserved.union(&note(k));
        }
        if let Some(v) = annotations.get(POD_CPU_ALLOCS) {
            reserved = reserved.union(&note(koord_cpu::parse_pod_cpu_allocs(v)));
        }
        if let Some(v) = annotations.get(NODE_RESERVATION) {
            reserved = reserved.union(&note(koord_cpu::parse_node_reservation(v)));
        }
        if let Some(v) = annotations.get(SYSTEM_QOS_RESOURCE) {
            reserved = reserved.union(&note(koord_cpu::parse_system_qos(v)));
        }
        let topology = match annotations
            .get(CPU_TOPOLOGY)
            .map(|v| parse_topology_cached(v))
        {
            None => None,
            Some(Ok(t)) => Some(t),
            Some(Err(p)) => {
                problems.push(p);
                None
            }
        };

        let mut by_id: BTreeMap<NumaId, NumaZone> = BTreeMap::new();
        for z in zones.iter().filter(|z| z.zone_type == "Node") {
            let id = z
                .name
                .strip_prefix("node-")
                .and_then(|n| n.parse::<NumaId>().ok())
                .filter(|id| (*id as usize) < MAX_NUMA_NODES);
            let Some(id) = id else {
                problems.push(NrtProblem::zone(
                    "bad_zone_name",
                    format!(
                        "zone {:?}: name must be node-<id> with id below {MAX_NUMA_NODES}",
                        z.name
                    ),
                ));
                continue;
            };
            let mut zone = NumaZone {
                id,
                cpu_milli: 0,
                memory_bytes: 0,
            };
            for r in &z.resources {
                let target = match r.name.as_str() {
                    "cpu" => &mut zone.cpu_milli,
                    "memory" => &mut zone.memory_bytes,
                    _ => continue,
                };
                match Quantity::parse(&r.allocatable) {
                    Ok(q) if q.milli() >= 0 => {
                        *target = if r.name == "cpu" {
                            q.milli_value()
                        } else {
                            q.value()
                        }
                    }
                    _ => problems.push(NrtProblem::zone(
                        "bad_quantity",
                        format!(
                            "zone {}: {} allocatable {:?} is not a non-negative quantity",
                            z.name, r.name, r.allocatable
                        ),
                    )),
                }
            }
            by_id.insert(id, zone);
        }
        if let Some(t) = &topology {
            for zone in by_id.values_mut() {
                let held = reserved.intersection(&t.numa_cpus(zone.id)).len() as i64;
                zone.cpu_milli = (zone.cpu_milli - held * 1000).max(0);
            }
        }
        let attrs: Vec<(String, String)> = attributes
            .iter()
            .map(|a| (a.name.clone(), a.value.clone()))
            .collect();
        NrtCpuInfo {
            topology,
            kubelet_full_pcpus_only,
            reserved,
            zones: by_id.into_values().collect(),
            policy: koord_cpu::numa_policy_from_nrt(policies, &attrs),
            problems,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::cpus::tests::topology_json;

    /// The per-thread reuse of the last cpu-topology reading answers exactly as parsing
    /// each annotation afresh: same topology, same problems, whatever came before.
    #[test]
    fn reused_topology_reading_equals_a_fresh_parse() {
        let texts = [
            topology_json(2, 4),
            topology_json(2, 4),
            "{not json".to_string(),
            "{not json".to_string(),
            topology_json(1, 2),
            topology_json(2, 4),
            r#"{"detail":[{"id":0,"core":0,"socket":0,"node":0},{"id":0,"core":1,"socket":0,"node":0}]}"#
                .to_string(),
            topology_json(1, 2),
        ];
        for t in &texts {
            let fresh = parse_topology(t);
            let reused = parse_topology_cached(t);
            match (&fresh, &reused) {
                (Ok(a), Ok(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}")),
                (Err(a), Err(b)) => assert_eq!(a, b),
                _ => panic!("{t}: fresh {fresh:?}, reused {reused:?}"),
            }
        }
    }
}
