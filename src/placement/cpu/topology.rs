//! [`CpuTopology`]: a node's logical CPUs with their physical core, socket and NUMA node,
//! validated once when the NRT arrives so placement never re-checks it.
//!
//! Cores are keyed by (socket, core): Linux core ids repeat per socket (as koordinator's `topology_options.go` keys them).

use std::collections::{BTreeMap, BTreeSet};

use super::NumaId;
pub use crate::model::cpu_policy::CpuDetail;
use crate::model::cpuset::{CpuId, CpuSet};

/// Why a CPU map cannot be used for cpuset placement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("the CPU topology lists no CPUs")]
    Empty,
    #[error("CPU id {id} is out of range (ids must be below {})", CpuSet::CAPACITY)]
    CpuOutOfRange { id: u64 },
    #[error("CPU id {id} is listed twice")]
    DuplicateCpu { id: CpuId },
    #[error(
        "NUMA node {numa} is out of range (ids must be below {})",
        super::MAX_NUMA_NODES
    )]
    NumaOutOfRange { numa: u64 },
}

/// A physical core: its hyperthreads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Core {
    pub socket: u32,
    pub core: u32,
    pub numa: NumaId,
    pub cpus: CpuSet,
}

/// A node's validated CPU map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuTopology {
    /// By CPU id, ascending.
    cpus: Vec<CpuDetail>,
    /// Physical cores ordered by (socket, core).
    cores: Vec<Core>,
    all: CpuSet,
    /// Per NUMA id (ascending): its CPUs.
    numa_cpus: BTreeMap<NumaId, CpuSet>,
    /// Per socket id (ascending): its CPUs.
    socket_cpus: BTreeMap<u32, CpuSet>,
}

impl CpuTopology {
    pub fn new(mut details: Vec<CpuDetail>) -> Result<Self, TopologyError> {
        if details.is_empty() {
            return Err(TopologyError::Empty);
        }
        details.sort();
        let mut all = CpuSet::new();
        let mut numa_cpus: BTreeMap<NumaId, CpuSet> = BTreeMap::new();
        let mut socket_cpus: BTreeMap<u32, CpuSet> = BTreeMap::new();
        let mut cores: BTreeMap<(u32, u32), Core> = BTreeMap::new();
        for d in &details {
            if d.id >= CpuSet::CAPACITY {
                return Err(TopologyError::CpuOutOfRange { id: d.id.into() });
            }
            if d.numa as usize >= super::MAX_NUMA_NODES {
                return Err(TopologyError::NumaOutOfRange {
                    numa: d.numa.into(),
                });
            }
            if all.contains(d.id) {
                return Err(TopologyError::DuplicateCpu { id: d.id });
            }
            all.insert(d.id);
            numa_cpus.entry(d.numa).or_default().insert(d.id);
            socket_cpus.entry(d.socket).or_default().insert(d.id);
            cores
                .entry((d.socket, d.core))
                .or_insert_with(|| Core {
                    socket: d.socket,
                    core: d.core,
                    numa: d.numa,
                    cpus: CpuSet::new(),
                })
                .cpus
                .insert(d.id);
        }
        Ok(CpuTopology {
            cpus: details,
            cores: cores.into_values().collect(),
            all,
            numa_cpus,
            socket_cpus,
        })
    }

    /// Every CPU, by id ascending.
    pub fn cpus(&self) -> &[CpuDetail] {
        &self.cpus
    }

    pub fn cpu(&self, id: CpuId) -> Option<&CpuDetail> {
        self.cpus
            .binary_search_by_key(&id, |d| d.id)
            .ok()
            .map(|i| &self.cpus[i])
    }

    /// Physical cores, ordered by (socket, core).
    pub fn cores(&self) -> &[Core] {
        &self.cores
    }

    pub fn all(&self) -> CpuSet {
        self.all
    }

    /// NUMA ids ascending.
    pub fn numa_ids(&self) -> impl Iterator<Item = NumaId> + '_ {
        self.numa_cpus.keys().copied()
    }

    pub fn numa_cpus(&self, numa: NumaId) -> CpuSet {
        self.numa_cpus.get(&numa).copied().unwrap_or_default()
    }

    pub fn socket_cpus(&self, socket: u32) -> CpuSet {
        self.socket_cpus.get(&socket).copied().unwrap_or_default()
    }

    pub fn sockets(&self) -> impl Iterator<Item = u32> + '_ {
        self.socket_cpus.keys().copied()
    }

    /// Hyperthreads per core (koordinator: NumCPUs / NumCores; assumes homogeneous SMT).
    pub fn cpus_per_core(&self) -> usize {
        (self.cpus.len() / self.cores.len()).max(1)
    }

    /// CPUs per NUMA node (NumCPUs / number of distinct (socket, NUMA) pairs).
    pub fn cpus_per_numa(&self) -> usize {
        let pairs: BTreeSet<(u32, NumaId)> = self.cpus.iter().map(|d| (d.socket, d.numa)).collect();
        (self.cpus.len() / pairs.len().max(1)).max(1)
    }

    pub fn cpus_per_socket(&self) -> usize {
        (self.cpus.len() / self.socket_cpus.len().max(1)).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: u32, core: u32, socket: u32, numa: u32) -> CpuDetail {
        CpuDetail {
            id,
            core,
            socket,
            numa,
        }
    }

    #[test]
    fn cores_are_keyed_by_socket_and_core() {
        // Core id 0 exists on both sockets: two cores, not one.
        let t = CpuTopology::new(vec![
            d(0, 0, 0, 0),
            d(1, 0, 0, 0),
            d(2, 0, 1, 1),
            d(3, 0, 1, 1),
        ])
        .unwrap();
        assert_eq!(t.cores().len(), 2);
        assert_eq!(t.cpus_per_core(), 2);
        assert_eq!(t.numa_cpus(1).to_string(), "2-3");
        assert_eq!(t.cpus_per_numa(), 2);
        assert_eq!(t.cpus_per_socket(), 2);
    }

    #[test]
    fn rejects_unusable_maps() {
        assert_eq!(CpuTopology::new(vec![]), Err(TopologyError::Empty));
        assert_eq!(
            CpuTopology::new(vec![d(1, 0, 0, 0), d(1, 1, 0, 0)]),
            Err(TopologyError::DuplicateCpu { id: 1 })
        );
        assert_eq!(
            CpuTopology::new(vec![d(5000, 0, 0, 0)]),
            Err(TopologyError::CpuOutOfRange { id: 5000 })
        );
        assert_eq!(
            CpuTopology::new(vec![d(0, 0, 0, 99)]),
            Err(TopologyError::NumaOutOfRange { numa: 99 })
        );
    }
}
