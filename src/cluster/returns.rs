//! Capacity returns: which nodes gained room for which kind of resource since their facts
//! were last published, collected for the requeue signal (`crate::scheduler::requeue`).
//!
//! kube-scheduler retries a pod the extender rejected only on a cluster event it watches
//! itself (kubernetes#122019); a Device turning healthy, a holder released without a pod
//! event, an NRT freeing CPUs are not such events. Every change of a node's facts passes
//! through the read snapshot's publish (`super::snapshot`), so that one place compares the
//! node's facts before and after ([`returned`]) and records the kinds whose capacity grew.
//!
//! "Grew" is judged on the summaries filter decides on: devices of a type grew when some
//! per-device request now fits on more devices than before, within the node or one NUMA node
//! (exact for up to [`EXACT_GROUPS`] distinct free groups, see `type_grew`); CPUs when a NUMA
//! node's free CPUs or cores, or a released exclusivity, increased; and whenever the facts
//! changed in a way the summary cannot order (an unindexed device set, a policy change, too
//! many groups). A false "returned" costs one retry of the waiting pods; a missed one costs a
//! pod its wait for an unrelated event, so doubt counts as returned. A property test
//! (`cluster::snapshot`'s `capacity_returns_miss_no_growth`) holds this to a model of raw
//! facts: no growth is missed.
//!
//! This module only compares and collects. It never writes to the API server and never
//! decides placement; nothing is collected until a consumer [`CapacityReturns::enable`]s it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::snapshot::{DeviceView, NodeSummary};
use crate::model::device::DeviceType;
use crate::placement::cpu::{Amplification, CpuSummary};
use crate::placement::device::deviceless::offers_any;
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
    /// Every kind: what a released hold may have kept from anyone (a nominee's, see
    /// `crate::sync::handlers::NominationHandler`).
    pub const ALL: ResourceKinds = ResourceKinds(1 | 2 | 4 | 8);
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
        DeviceView::Missing { held, advertised } if offers_any(held, advertised) => {
            ResourceKinds::DEVICES
        }
        DeviceView::Missing { .. } => ResourceKinds::empty(),
        DeviceView::Unindexed => ResourceKinds::DEVICES,
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
        // Device plugins own the node's devices either way: room grew only if the node now
        // advertises a name it did not (a device plugin registered).
        (
            DeviceView::Missing {
                held: false,
                advertised: old,
            },
            DeviceView::Missing {
                held: false,
                advertised: Some(new),
            },
        ) => {
            if old.unwrap_or_default().covers(*new) {
                ResourceKinds::empty()
            } else {
                ResourceKinds::DEVICES
            }
        }
        // The node now passes device filtering for what it advertises (its holders or its
        // Device went away).
        (_, DeviceView::Missing { held, advertised }) if offers_any(*held, *advertised) => {
            ResourceKinds::DEVICES
        }
        (_, DeviceView::Missing { .. }) => ResourceKinds::empty(),
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

/// One device type's room grew: some request that did not fit may fit now. Exactly: for some
/// per-device request `r` (every dimension, within the whole node or one NUMA node), more
/// devices have at least `r` free than before; a multi-device request of `r` each then fits
/// where it did not. Witnesses suffice among the componentwise minima of subsets of the new
/// free groups (if `r` witnesses, so does the minimum of the devices that hold `r`), so a node
/// with few distinct groups is decided exactly; one with more than [`EXACT_GROUPS`] counts as
/// grown. Cheap exits first: a free sum rose (grown); the new free groups are the old ones
/// with some made smaller (a bind, a sick device: not grown).
fn type_grew(old: &DeviceIndexRef<'_>, new: &DeviceIndexRef<'_>, t: &DeviceType) -> bool {
    let (o, n) = (old.sums(t).free, new.sums(t).free);
    if n.iter().zip(o.iter()).any(|(n, o)| n > o) {
        return true;
    }
    let (of, nf) = (old.frees(t), new.frees(t));
    if of == nf || shrunk_only(of, nf) {
        return false;
    }
    let mut regions: Vec<u32> = nf.iter().filter_map(|g| g.numa).collect();
    regions.sort_unstable();
    regions.dedup();
    // The whole node, then each NUMA node (devices of unknown NUMA node count in every one,
    // as a NUMA restriction admits them).
    std::iter::once(None)
        .chain(regions.into_iter().map(Some))
        .any(|region| {
            let within = |g: &&SlotGroup| match region {
                None => true,
                Some(numa) => g.numa.is_none_or(|m| m == numa),
            };
            let newr: Vec<&SlotGroup> = nf.iter().filter(within).collect();
            let oldr: Vec<&SlotGroup> = of.iter().filter(within).collect();
            grew_within(&oldr, &newr)
        })
}

/// Distinct free groups beyond which `type_grew` stops searching and counts growth.
pub const EXACT_GROUPS: usize = 12;

fn grew_within(old: &[&SlotGroup], new: &[&SlotGroup]) -> bool {
    if new.len() > EXACT_GROUPS {
        return true;
    }
    let holding = |groups: &[&SlotGroup], r: &[i64; INDEX_DIMS.len()]| -> u32 {
        groups
            .iter()
            .filter(|g| g.dims.iter().zip(r.iter()).all(|(d, r)| d >= r))
            .map(|g| u32::from(g.count))
            .sum()
    };
    (1u32..(1 << new.len())).any(|mask| {
        let mut r = [i64::MAX; INDEX_DIMS.len()];
        for (i, g) in new.iter().enumerate() {
            if mask & (1 << i) != 0 {
                for (r, d) in r.iter_mut().zip(g.dims.iter()) {
                    *r = (*r).min(*d);
                }
            }
        }
        holding(new, &r) > holding(old, &r)
    })
}

/// The new free groups are the old ones, some made smaller (or gone): each new device can be
/// matched to its own old device on the same NUMA node with at least as much free in every
/// dimension. Then no request fits that did not (a sufficient test; greedy on the few devices
/// that differ, `false` when unsure).
fn shrunk_only(old: &[SlotGroup], new: &[SlotGroup]) -> bool {
    let mut left: Vec<(DimVecRef, Option<u32>, u16)> =
        old.iter().map(|g| (g.dims, g.numa, g.count)).collect();
    let mut differing: Vec<(DimVecRef, Option<u32>)> = Vec::new();
    for g in new {
        let mut need = g.count;
        for x in left.iter_mut().filter(|x| x.0 == g.dims && x.1 == g.numa) {
            let take = need.min(x.2);
            x.2 -= take;
            need -= take;
        }
        for _ in 0..need {
            differing.push((g.dims, g.numa));
            if differing.len() > 8 {
                return false;
            }
        }
    }
    for (dims, numa) in differing {
        let Some(x) = left
            .iter_mut()
            .find(|x| x.2 > 0 && x.1 == numa && x.0.iter().zip(dims.iter()).all(|(o, n)| o >= n))
        else {
            return false;
        };
        x.2 -= 1;
    }
    true
}

type DimVecRef = [i64; INDEX_DIMS.len()];

fn cpu_returned(
    old: &crate::cluster::snapshot::CpuFacts,
    new: &crate::cluster::snapshot::CpuFacts,
) -> ResourceKinds {
    if old == new {
        return ResourceKinds::empty();
    }
    let grew = amplified_cpu_grew(&old.amplification, &new.amplification)
        || match (&old.summary, &new.summary) {
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

/// More amplified CPU left, a lower ratio (cpuset pods count smaller), or the check gone.
fn amplified_cpu_grew(old: &Amplification, new: &Amplification) -> bool {
    match (old, new) {
        (Amplification::Off, _) | (_, Amplification::Invalid) => false,
        (Amplification::Invalid, _) | (Amplification::On(_), Amplification::Off) => true,
        (Amplification::On(o), Amplification::On(n)) => {
            n.free_milli > o.free_milli || n.ratio.get() < o.ratio.get()
        }
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
