//! A node's devices in fixed-size form: per known device type, its devices grouped by what
//! feasibility reads of them ([`SlotGroup`]: totals and free as integer vectors over
//! [`INDEX_DIMS`], with a count), and per-type sums for the score. Filter and prioritize read
//! this for every candidate node (`super::fast`), so it holds no maps and no strings, and a
//! node whose eight GPUs are alike is two or three groups, not eight devices.
//!
//! [`DeviceIndex`] is the owned form, built from a node's [`NodeDevices`] and free map;
//! [`DeviceIndexRef`] is the borrowed form the fast path takes: plain slices, which the
//! cluster-wide read snapshot lays out contiguously for many nodes. Building never fails: a
//! node whose devices cannot be indexed exactly (a resource outside [`INDEX_DIMS`], a value
//! beyond 64 bits) gets no index, and callers use the full allocator for it.

use crate::model::device::{DeviceResources, DeviceType};

use super::inventory::{FreeMap, NodeDevices};

/// The resource dimensions the fast placement path understands, by index.
pub const INDEX_DIMS: [&str; 5] = [
    crate::model::device::GPU_CORE,
    crate::model::device::GPU_MEMORY,
    crate::model::device::GPU_MEMORY_RATIO,
    crate::model::device::RDMA,
    crate::model::device::FPGA,
];

/// Milli-units per dimension of [`INDEX_DIMS`]. 64 bits hold 9.2 × 10¹⁵ units (an 8 EiB GPU);
/// a larger value makes the node unindexable rather than wrong.
pub type DimVec = [i64; INDEX_DIMS.len()];

/// Position of a resource name in [`INDEX_DIMS`].
pub fn dim_of(name: &str) -> Option<usize> {
    INDEX_DIMS.iter().position(|d| *d == name)
}

/// The device types the index carries, in this order (every type `NodeDevices` keeps).
pub const INDEXED_TYPES: [DeviceType; 3] = [DeviceType::Gpu, DeviceType::Rdma, DeviceType::Fpga];

fn type_pos(t: &DeviceType) -> Option<usize> {
    match t {
        DeviceType::Gpu => Some(0),
        DeviceType::Rdma => Some(1),
        DeviceType::Fpga => Some(2),
        DeviceType::Other(_) => None,
    }
}

/// Devices of one type that feasibility cannot tell apart, and how many there are. In a
/// type's *total* groups, `dims` is the total of healthy devices with a non-empty total; in
/// its *free* groups, the free of healthy devices with a non-empty free, with the device's
/// memory size (`total_mem`: a GPU request's memory is converted with it) and NUMA node.
/// Devices that can never hold anything (unhealthy, empty) are in no group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotGroup {
    pub dims: DimVec,
    /// The device's total `gpu-memory` in milli-bytes (0 for other types).
    pub total_mem: i64,
    /// The device's NUMA node (`topology.nodeID`); `None` when unknown, which every NUMA
    /// restriction admits (as `allocate::on_numa` does). Always `None` in total groups.
    pub numa: Option<u32>,
    pub count: u16,
}

/// One device type's totals and free summed over its devices, in whole units rounded up (as
/// `Quantity::value()`), free counted as zero on a blocked node: all prioritize's device
/// score needs, computed once per change instead of once per request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TypeSums {
    pub total: DimVec,
    pub free: DimVec,
}

/// Per entry of [`INDEXED_TYPES`].
pub type NodeSums = [TypeSums; INDEXED_TYPES.len()];

/// Per entry of [`INDEXED_TYPES`]: `(start, len)` of its total groups, then of its free
/// groups, in a group vector.
pub type GroupRanges = [[(u32, u32); 2]; INDEXED_TYPES.len()];

/// A node's device index, owned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceIndex {
    /// A malformed holding makes every device count as used.
    pub blocked: bool,
    pub groups: Vec<SlotGroup>,
    pub ranges: GroupRanges,
    pub sums: NodeSums,
}

/// A node's device index, borrowed: what the fast path reads.
#[derive(Clone, Copy, Debug)]
pub struct DeviceIndexRef<'a> {
    pub blocked: bool,
    /// Per entry of [`INDEXED_TYPES`].
    pub totals: [&'a [SlotGroup]; INDEXED_TYPES.len()],
    /// Per entry of [`INDEXED_TYPES`].
    pub frees: [&'a [SlotGroup]; INDEXED_TYPES.len()],
    pub sums: &'a NodeSums,
}

impl<'a> DeviceIndexRef<'a> {
    /// The total groups of `t`; empty for a type the node lacks.
    #[inline]
    pub fn totals(&self, t: &DeviceType) -> &'a [SlotGroup] {
        type_pos(t).map_or(&[], |i| self.totals[i])
    }

    /// The free groups of `t`; empty for a type the node lacks.
    #[inline]
    pub fn frees(&self, t: &DeviceType) -> &'a [SlotGroup] {
        type_pos(t).map_or(&[], |i| self.frees[i])
    }

    /// The sums of `t` (zero for a type the node lacks).
    #[inline]
    pub fn sums(&self, t: &DeviceType) -> TypeSums {
        type_pos(t).map_or_else(TypeSums::default, |i| self.sums[i])
    }

    /// The view of `ranges` within `groups` (the snapshot keeps many nodes' groups in one
    /// vector).
    pub fn over(
        groups: &'a [SlotGroup],
        blocked: bool,
        ranges: &GroupRanges,
        sums: &'a NodeSums,
    ) -> Self {
        let slice = |(start, len): (u32, u32)| &groups[start as usize..(start + len) as usize];
        DeviceIndexRef {
            blocked,
            totals: ranges.map(|r| slice(r[0])),
            frees: ranges.map(|r| slice(r[1])),
            sums,
        }
    }
}

/// Whole units rounded up, as `Quantity::value()`.
fn whole_units(milli: i128) -> Option<i64> {
    i64::try_from(milli.div_euclid(1000) + i128::from(milli.rem_euclid(1000) != 0)).ok()
}

fn dims(r: &DeviceResources) -> Option<DimVec> {
    let mut out = [0i64; INDEX_DIMS.len()];
    for (name, q) in r {
        out[dim_of(name)?] = i64::try_from(q.milli()).ok()?;
    }
    Some(out)
}

/// `groups` sorted, equal entries merged (their counts added).
fn merged(mut groups: Vec<SlotGroup>) -> Vec<SlotGroup> {
    groups.sort_unstable();
    let mut out: Vec<SlotGroup> = Vec::with_capacity(groups.len());
    for g in groups {
        match out.last_mut() {
            Some(last)
                if (last.dims, last.total_mem, last.numa) == (g.dims, g.total_mem, g.numa) =>
            {
                last.count = last.count.saturating_add(g.count);
            }
            _ => out.push(g),
        }
    }
    out
}

impl DeviceIndex {
    /// The index of `devices` with `free` (as `DeviceHoldings::free(&[])` computes it) and
    /// `blocked`; `None` when some device cannot be indexed exactly.
    pub fn build(devices: &NodeDevices, free: &FreeMap, blocked: bool) -> Option<DeviceIndex> {
        const MEM: usize = 1;
        debug_assert_eq!(INDEX_DIMS[MEM], crate::model::device::GPU_MEMORY);
        let mut groups = Vec::new();
        let mut ranges = GroupRanges::default();
        let mut sums = NodeSums::default();
        for t in devices.types() {
            let pos = type_pos(t)?;
            let (mut totals, mut frees) = (Vec::new(), Vec::new());
            let (mut total_sum, mut free_sum) =
                ([0i128; INDEX_DIMS.len()], [0i128; INDEX_DIMS.len()]);
            for slot in devices.slots(t) {
                let slot_free = free.get(t).and_then(|m| m.get(&slot.minor));
                let total = dims(&slot.total)?;
                let free_dims = match slot_free {
                    Some(f) => dims(f)?,
                    None => [0; INDEX_DIMS.len()],
                };
                for d in 0..INDEX_DIMS.len() {
                    total_sum[d] += i128::from(total[d]);
                    if !blocked {
                        free_sum[d] += i128::from(free_dims[d]);
                    }
                }
                if !slot.healthy {
                    continue;
                }
                let total_mem = if *t == DeviceType::Gpu { total[MEM] } else { 0 };
                if !slot.total.is_empty() {
                    totals.push(SlotGroup {
                        dims: total,
                        total_mem,
                        numa: None,
                        count: 1,
                    });
                }
                if slot_free.is_some_and(|f| !f.is_empty()) {
                    frees.push(SlotGroup {
                        dims: free_dims,
                        total_mem,
                        numa: slot
                            .topology
                            .as_ref()
                            .and_then(|t| u32::try_from(t.node_id).ok()),
                        count: 1,
                    });
                }
            }
            for (k, list) in [merged(totals), merged(frees)].into_iter().enumerate() {
                ranges[pos][k] = (groups.len() as u32, list.len() as u32);
                groups.extend(list);
            }
            for d in 0..INDEX_DIMS.len() {
                sums[pos].total[d] = whole_units(total_sum[d])?;
                sums[pos].free[d] = whole_units(free_sum[d])?;
            }
        }
        Some(DeviceIndex {
            blocked,
            groups,
            ranges,
            sums,
        })
    }

    pub fn as_ref(&self) -> DeviceIndexRef<'_> {
        DeviceIndexRef::over(&self.groups, self.blocked, &self.ranges, &self.sums)
    }
}
