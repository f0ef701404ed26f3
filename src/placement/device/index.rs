//! A node's devices in fixed-size form: per known device type, one [`SlotIndex`] per minor
//! (totals and free as integer vectors over [`INDEX_DIMS`]). Filter and prioritize read this
//! for every candidate node (`super::fast`), so it holds no maps and no strings.
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

/// One minor in the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotIndex {
    pub minor: i32,
    pub healthy: bool,
    /// The total map is empty (unhealthy devices have an empty total).
    pub total_empty: bool,
    /// The free map is empty.
    pub free_empty: bool,
    /// The device's NUMA node (`topology.nodeID`); `None` when unknown, which every NUMA
    /// restriction admits (as `allocate::on_numa` does).
    pub numa: Option<u32>,
    pub total: DimVec,
    pub free: DimVec,
}

/// One device type's totals and free summed over its devices, in whole units rounded up (as
/// `Quantity::value()`), free counted as zero on a blocked node: all prioritize's device
/// score needs, computed once per change instead of once per request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TypeSums {
    pub total: DimVec,
    pub free: DimVec,
}

/// Per entry of [`INDEXED_TYPES`].
pub type NodeSums = [TypeSums; INDEXED_TYPES.len()];

/// A node's device index, owned: its slots grouped by type (`INDEXED_TYPES` order, ascending
/// minor within a type).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceIndex {
    /// A malformed holding makes every device count as used.
    pub blocked: bool,
    pub slots: Vec<SlotIndex>,
    /// `(start, len)` in `slots` per entry of [`INDEXED_TYPES`].
    pub ranges: [(u32, u32); INDEXED_TYPES.len()],
    pub sums: NodeSums,
}

/// A node's device index, borrowed: what the fast path reads.
#[derive(Clone, Copy, Debug)]
pub struct DeviceIndexRef<'a> {
    pub blocked: bool,
    /// Per entry of [`INDEXED_TYPES`].
    pub by_type: [&'a [SlotIndex]; INDEXED_TYPES.len()],
    pub sums: &'a NodeSums,
}

impl<'a> DeviceIndexRef<'a> {
    /// The slots of `t`, ascending minor; empty for a type the node lacks.
    #[inline]
    pub fn slots(&self, t: &DeviceType) -> &'a [SlotIndex] {
        type_pos(t).map_or(&[], |i| self.by_type[i])
    }

    /// The sums of `t` (zero for a type the node lacks).
    #[inline]
    pub fn sums(&self, t: &DeviceType) -> TypeSums {
        type_pos(t).map_or_else(TypeSums::default, |i| self.sums[i])
    }
}

/// Whole units rounded up, as `Quantity::value()`.
fn whole_units(milli: i128) -> Option<i64> {
    i64::try_from(milli.div_euclid(1000) + i128::from(milli.rem_euclid(1000) != 0)).ok()
}

fn sums_of(slots: &[SlotIndex], blocked: bool) -> Option<TypeSums> {
    let mut total = [0i128; INDEX_DIMS.len()];
    let mut free = [0i128; INDEX_DIMS.len()];
    for s in slots {
        for d in 0..INDEX_DIMS.len() {
            total[d] += i128::from(s.total[d]);
            if !blocked {
                free[d] += i128::from(s.free[d]);
            }
        }
    }
    let mut out = TypeSums::default();
    for d in 0..INDEX_DIMS.len() {
        out.total[d] = whole_units(total[d])?;
        out.free[d] = whole_units(free[d])?;
    }
    Some(out)
}

fn dims(r: &DeviceResources) -> Option<DimVec> {
    let mut out = [0i64; INDEX_DIMS.len()];
    for (name, q) in r {
        out[dim_of(name)?] = i64::try_from(q.milli()).ok()?;
    }
    Some(out)
}

impl DeviceIndex {
    /// The index of `devices` with `free` (as `DeviceHoldings::free(&[])` computes it) and
    /// `blocked`; `None` when some device cannot be indexed exactly.
    pub fn build(devices: &NodeDevices, free: &FreeMap, blocked: bool) -> Option<DeviceIndex> {
        let mut slots = Vec::new();
        let mut ranges = [(0u32, 0u32); INDEXED_TYPES.len()];
        for t in devices.types() {
            let pos = type_pos(t)?;
            let start = slots.len();
            for slot in devices.slots(t) {
                let slot_free = free.get(t).and_then(|m| m.get(&slot.minor));
                slots.push(SlotIndex {
                    minor: slot.minor,
                    healthy: slot.healthy,
                    total_empty: slot.total.is_empty(),
                    free_empty: slot_free.is_none_or(|f| f.is_empty()),
                    numa: slot
                        .topology
                        .as_ref()
                        .and_then(|t| u32::try_from(t.node_id).ok()),
                    total: dims(&slot.total)?,
                    free: match slot_free {
                        Some(f) => dims(f)?,
                        None => [0; INDEX_DIMS.len()],
                    },
                });
            }
            ranges[pos] = (start as u32, (slots.len() - start) as u32);
        }
        let mut sums = NodeSums::default();
        for (pos, (start, len)) in ranges.iter().enumerate() {
            sums[pos] = sums_of(&slots[*start as usize..(*start + *len) as usize], blocked)?;
        }
        Some(DeviceIndex {
            blocked,
            slots,
            ranges,
            sums,
        })
    }

    pub fn as_ref(&self) -> DeviceIndexRef<'_> {
        DeviceIndexRef::over(&self.slots, self.blocked, &self.ranges, &self.sums)
    }
}

impl<'a> DeviceIndexRef<'a> {
    /// The view of `ranges` within `slots` (the snapshot keeps many nodes' slots in one
    /// vector).
    pub fn over(
        slots: &'a [SlotIndex],
        blocked: bool,
        ranges: &[(u32, u32); INDEXED_TYPES.len()],
        sums: &'a NodeSums,
    ) -> Self {
        let by_type = ranges.map(|(start, len)| {
            let (s, l) = (start as usize, len as usize);
            &slots[s..s + l]
        });
        DeviceIndexRef {
            blocked,
            by_type,
            sums,
        }
    }
}
