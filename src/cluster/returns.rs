//! Capacity returns: which nodes gained room for which kind of resource since their facts
//! were last published, collected for the requeue signal (`crate::requeue`).
//!
//! kube-scheduler retries a pod the extender rejected only on a cluster event it watches
//! itself (kubernetes#122019); a Device turning healthy, a holder released without a pod
//! event, an NRT freeing CPUs are not such events. Every change of a node's facts passes
//! through the read snapshot's publish (`super::snapshot`), so that one place compares the
//! node's facts before and after ([`returned`]) and records the kinds whose capacity grew.
//!
//! "Grew" is judged on the summaries filter decides on, conservatively: a kind counts as
//! returned when anything a pod of that kind could use increased (a free sum, the largest
//! free of one device, a NUMA node's free CPUs or cores, a released exclusivity), or when the
//! node's facts changed in a way the summary cannot order (an unindexed device set, a policy
//! change). A false "returned" costs one retry of the waiting pods; a missed one costs a pod
//! its wait for an unrelated event, so doubt counts as returned.
//!
//! This module only compares and collects. It never writes to the API server and never
//! decides placement; nothing is collected until a consumer [`CapacityReturns::enable`]s it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::snapshot::{DeviceView, NodeSummary};
use crate::model::device::DeviceType;
use crate::placement::cpu::CpuSummary;
use crate::placement::device::index::{DeviceIndexRef, INDEX_DIMS, INDEXED_TYPES, SlotGroup};

/// A set of resource kinds a pod can wait for: the device types the index carries and
/// CPU/NUMA placement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ResourceKinds(u8);

impl ResourceKinds {
    pub const GPU: ResourceKinds = ResourceKinds(1);
    pub const RDMA: ResourceKinds = ResourceKinds(2);
    pub const FPGA: ResourceKinds = ResourceKinds(4);
    pub const CPU: ResourceKinds = ResourceKinds(8);
    const DEVICES: ResourceKinds = ResourceKinds(1 | 2 | 4);
    /// Every kind, with the label each has in metrics and logs.
    pub const LABELED: [(ResourceKinds, &'static str); 4] = [
        (Self::GPU, "gpu"),
        (Self::RDMA, "rdma"),
        (Self::FPGA, "fpga"),
        (Self::CPU, "cpu"),
    ];

    pub const fn empty() -> Self {
        ResourceKinds(0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn union(self, other: ResourceKinds) -> ResourceKinds {
        ResourceKinds(self.0 | other.0)
    }

    pub fn intersects(self, other: ResourceKinds) -> bool {
        self.0 & other.0 != 0
    }

    /// The kind of a device type; empty for a type the index does not carry.
    pub fn of_device(t: &DeviceType) -> ResourceKinds {
        match t {
            DeviceType::Gpu => Self::GPU,
            DeviceType::Rdma => Self::RDMA,
            DeviceType::Fpga => Self::FPGA,
            DeviceType::Other(_) => Self::empty(),
        }
    }

    /// The labels of the kinds in the set, in [`Self::LABELED`] order.
    pub fn labels(self) -> impl Iterator<Item = &'static str> {
        Self::LABELED
            .into_iter()
            .filter(move |(k, _)| self.intersects(*k))
            .map(|(_, l)| l)
    }
}

impl std::fmt::Display for ResourceKinds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self.labels().collect();
        f.write_str(&labels.join(","))
    }
}

/// The kinds whose capacity grew from `old` to `new` (`old`: `None` for a node that was not
/// in the snapshot; a removed node returns nothing).
pub fn returned(old: Option<&NodeSummary>, new: &NodeSummary) -> ResourceKinds {
    let new_view = new.view();
    let Some(old) = old else {
        // A node that appears (or reappears): whatever it offers is new room.
        return offered(new);
    };
    let old_view = old.view();
    devices_returned(&old_view.devices, &new_view.devices)
        .union(cpu_returned(old_view.cpu, new_view.cpu))
}

/// What a node offers at all, for a node that was absent.
fn offered(summary: &NodeSummary) -> ResourceKinds {
    let view = summary.view();
    let devices = match view.devices {
        DeviceView::Missing { held: false } | DeviceView::Unindexed => ResourceKinds::DEVICES,
        DeviceView::Missing { held: true } => ResourceKinds::empty(),
        DeviceView::Indexed(idx) if idx.blocked => ResourceKinds::empty(),
        DeviceView::Indexed(idx) => INDEXED_TYPES
            .iter()
            .filter(|t| !idx.frees(t).is_empty())
            .fold(ResourceKinds::empty(), |k, t| {
                k.union(ResourceKinds::of_device(t))
            }),
    };
    let cpu = if view.cpu.summary.is_ok() {
        ResourceKinds::CPU
    } else {
        ResourceKinds::empty()
    };
    devices.union(cpu)
}

fn devices_returned(old: &DeviceView<'_>, new: &DeviceView<'_>) -> ResourceKinds {
    match (old, new) {
        // Device plugins own the node's devices either way: nothing we track changed.
        (DeviceView::Missing { held: false }, DeviceView::Missing { held: false }) => {
            ResourceKinds::empty()
        }
        // The node now passes device filtering (its holders or its Device went away).
        (_, DeviceView::Missing { held: false }) => ResourceKinds::DEVICES,
        (_, DeviceView::Missing { held: true }) => ResourceKinds::empty(),
        // Facts the fixed-size index cannot carry: any change may be room.
        (_, DeviceView::Unindexed) => ResourceKinds::DEVICES,
        (_, DeviceView::Indexed(new)) if new.blocked => ResourceKinds::empty(),
        (DeviceView::Indexed(old), DeviceView::Indexed(new)) if !old.blocked => INDEXED_TYPES
            .iter()
            .filter(|t| type_grew(old, new, t))
            .fold(ResourceKinds::empty(), |k, t| {
                k.union(ResourceKinds::of_device(t))
            }),
        // From nothing allocatable (missing with holders, blocked, unindexed) to an index.
        (_, DeviceView::Indexed(new)) => INDEXED_TYPES
            .iter()
            .filter(|t| !new.frees(t).is_empty())
            .fold(ResourceKinds::empty(), |k, t| {
                k.union(ResourceKinds::of_device(t))
            }),
    }
}

/// One device type's room grew: a free sum rose, or one device now has more free in some
/// dimension than any device had (a whole-GPU request can fit after two half releases that
/// leave the sum equal), or a NUMA node gained a free device.
fn type_grew(old: &DeviceIndexRef<'_>, new: &DeviceIndexRef<'_>, t: &DeviceType) -> bool {
    let (o, n) = (old.sums(t).free, new.sums(t).free);
    if n.iter().zip(o.iter()).any(|(n, o)| n > o) {
        return true;
    }
    let (of, nf) = (old.frees(t), new.frees(t));
    if of == nf {
        return false;
    }
    let best = |groups: &[SlotGroup]| {
        let mut best = [i64::MIN; INDEX_DIMS.len()];
        for g in groups {
            for (b, d) in best.iter_mut().zip(g.dims.iter()) {
                *b = (*b).max(*d);
            }
        }
        best
    };
    let (ob, nb) = (best(of), best(nf));
    if nb.iter().zip(ob.iter()).any(|(n, o)| n > o) {
        return true;
    }
    let per_numa = |groups: &[SlotGroup]| {
        let mut m: BTreeMap<Option<u32>, u32> = BTreeMap::new();
        for g in groups {
            *m.entry(g.numa).or_default() += u32::from(g.count);
        }
        m
    };
    let (on, nn) = (per_numa(of), per_numa(nf));
    nn.iter()
        .any(|(numa, n)| on.get(numa).is_none_or(|o| n > o))
}

fn cpu_returned(
    old: &crate::cluster::snapshot::CpuFacts,
    new: &crate::cluster::snapshot::CpuFacts,
) -> ResourceKinds {
    if old == new {
        return ResourceKinds::empty();
    }
    let grew = match (&old.summary, &new.summary) {
        (_, Err(_)) => false,
        (Err(_), Ok(_)) => true,
        (Ok(o), Ok(n)) => {
            old.bind_policy != new.bind_policy
                || old.constrains_plain_pods && !new.constrains_plain_pods
                || cpu_summary_grew(o, n)
        }
    };
    if grew {
        ResourceKinds::CPU
    } else {
        ResourceKinds::empty()
    }
}

fn cpu_summary_grew(o: &CpuSummary, n: &CpuSummary) -> bool {
    if o.bind_policy != n.bind_policy || o.numa_policy != n.numa_policy {
        return true;
    }
    let (os, ns) = (&o.stats, &n.stats);
    if os.len != ns.len || os.cpus_per_core != ns.cpus_per_core {
        return true;
    }
    let (on, nn) = (&os.node, &ns.node);
    if nn.free_cpus > on.free_cpus
        || nn.free_full_cpus > on.free_full_cpus
        || nn.free_cores > on.free_cores
        || nn.usable_cpus > on.usable_cpus
    {
        return true;
    }
    let zones = usize::from(ns.len);
    os.zones[..zones]
        .iter()
        .zip(&ns.zones[..zones])
        .any(|(o, n)| {
            o.id != n.id
                || n.free_cpus > o.free_cpus
                || n.free_full_cpus > o.free_full_cpus
                || n.free_cores > o.free_cores
                || n.usable_cpus > o.usable_cpus
                || (o.single && !n.single)
                || (o.multi && !n.multi)
                || n.cpu_milli - n.cpu_used_milli > o.cpu_milli - o.cpu_used_milli
                || n.memory_bytes - n.memory_used_bytes > o.memory_bytes - o.memory_used_bytes
        })
}

/// The nodes whose capacity returned since the consumer last took them, with the kinds.
///
/// A filter that decided on a snapshot loaded before a return was recorded may reject a pod
/// the return would admit, and record it as waiting only after the consumer took that return:
/// [`Self::generation`] (read before the snapshot) and [`Self::replay`] close that gap.
#[derive(Debug, Default)]
pub struct CapacityReturns {
    enabled: AtomicBool,
    pending: Mutex<BTreeMap<Arc<str>, ResourceKinds>>,
    /// Per entry of [`ResourceKinds::LABELED`]: the node it last returned on.
    last: Mutex<[Option<Arc<str>>; 4]>,
    /// Bumped after every recorded return (after its snapshot was published).
    generation: AtomicU64,
    notify: tokio::sync::Notify,
}

impl CapacityReturns {
    /// Starts collecting (before that, [`Self::record`] drops everything: nobody would take it).
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::SeqCst);
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// Records that `kinds` returned on `node` and wakes the consumer. At most one entry per
    /// node: the map is bounded by the node count however often capacity returns.
    pub fn record(&self, node: &str, kinds: ResourceKinds) {
        if kinds.is_empty() || !self.is_enabled() {
            return;
        }
        let node: Arc<str> = {
            let mut pending = self.pending.lock();
            match pending.get_key_value(node) {
                Some((name, k)) => {
                    let name = name.clone();
                    let k = k.union(kinds);
                    pending.insert(name.clone(), k);
                    name
                }
                None => {
                    let name: Arc<str> = Arc::from(node);
                    pending.insert(name.clone(), kinds);
                    name
                }
            }
        };
        {
            let mut last = self.last.lock();
            for (slot, (kind, _)) in last.iter_mut().zip(ResourceKinds::LABELED) {
                if kinds.intersects(kind) {
                    *slot = Some(node.clone());
                }
            }
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// Counts recorded returns: read it before loading the snapshot a decision is made on.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Records again the nodes where `kinds` last returned (a decision that may have missed
    /// them was made after the consumer took them).
    pub fn replay(&self, kinds: ResourceKinds) {
        let nodes: Vec<(Arc<str>, ResourceKinds)> = {
            let last = self.last.lock();
            last.iter()
                .zip(ResourceKinds::LABELED)
                .filter(|(_, (kind, _))| kinds.intersects(*kind))
                .filter_map(|(node, (kind, _))| node.clone().map(|n| (n, kind)))
                .collect()
        };
        for (node, kind) in nodes {
            self.record(&node, kind);
        }
    }

    /// Waits until something was recorded (returns at once if something was recorded since
    /// the last wait).
    pub async fn changed(&self) {
        self.notify.notified().await
    }

    /// Takes every recorded node.
    pub fn take(&self) -> BTreeMap<Arc<str>, ResourceKinds> {
        std::mem::take(&mut *self.pending.lock())
    }
}
