//! The one table of resource names the extender manages ([`MANAGED_RESOURCES`]), and the
//! compact set of them a pod asks for or a node advertises ([`ResourceNameSet`]).
//!
//! Everything that asks "is this a device resource, and which one?" reads this table: the
//! device request parser (`placement::device::request`), the deprecated-name mapping
//! (`model::device::canonical_resource_name`), the webhook's routing rule (`placement::routing`),
//! and the rule for nodes without a `Device` object (`scheduler::decide::deviceless_fit`). The
//! chart's `extenderConfig.managedResources` must list exactly these names
//! (`chart_lists_every_managed_resource`), and from that list the chart renders the webhook's
//! CEL condition, its `--webhook-managed-resources` flag and the scheduler's extender stanza.
//!
//! Owns names only: no quantities, no decisions, no I/O.

/// Whole NVIDIA GPUs (count).
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
/// Whole AMD GPUs (count).
pub const AMD_GPU: &str = "amd.com/gpu";
/// Whole Hygon DCUs (count).
pub const HYGON_DCU: &str = "dcu.com/gpu";
/// Percent of a GPU (100 = one card); deprecated but supported.
pub const KOORD_GPU: &str = "koordinator.sh/gpu";
/// Number of GPUs a shared request is spread over.
pub const GPU_SHARED: &str = "koordinator.sh/gpu.shared";
/// Compute percent, 100 per GPU.
pub const GPU_CORE: &str = "koordinator.sh/gpu-core";
/// GPU memory in bytes.
pub const GPU_MEMORY: &str = "koordinator.sh/gpu-memory";
/// GPU memory percent, 100 per GPU.
pub const GPU_MEMORY_RATIO: &str = "koordinator.sh/gpu-memory-ratio";
/// Huawei Ascend (v)NPU dimensions: recognised, rejected as unsupported.
pub const HUAWEI_NPU_CORE: &str = "huawei.com/npu-core";
pub const HUAWEI_NPU_CPU: &str = "huawei.com/npu-cpu";
pub const HUAWEI_NPU_DVPP: &str = "huawei.com/npu-dvpp";
/// Percent of an RDMA NIC.
pub const RDMA: &str = "koordinator.sh/rdma";
/// Percent of an FPGA.
pub const FPGA: &str = "koordinator.sh/fpga";

/// One managed resource name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManagedResource {
    pub name: &'static str,
    /// The current name: `name` itself, or what koordinator renames a deprecated name to.
    pub canonical: &'static str,
    /// The chart's `ignoredByScheduler`: kube-scheduler's NodeResourcesFit must not check the
    /// node total (per-device quantities only the extender can check). The vendor whole-GPU
    /// counts are checked in-tree: their device plugins advertise them on every GPU node.
    pub ignored_by_scheduler: bool,
}

impl ManagedResource {
    /// koordinator's deprecated `kubernetes.io/` names. kube-scheduler refuses them in an
    /// extender's `managedResources` (they are not extended resource names), so the chart
    /// leaves them out of the stanza and the webhook renames them to `canonical` instead.
    pub const fn deprecated(&self) -> bool {
        // `name != canonical`, in a const fn.
        let (a, b) = (self.name.as_bytes(), self.canonical.as_bytes());
        if a.len() != b.len() {
            return true;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return true;
            }
            i += 1;
        }
        false
    }
}

const fn current(name: &'static str, ignored_by_scheduler: bool) -> ManagedResource {
    ManagedResource {
        name,
        canonical: name,
        ignored_by_scheduler,
    }
}

const fn deprecated(name: &'static str, canonical: &'static str) -> ManagedResource {
    ManagedResource {
        name,
        canonical,
        ignored_by_scheduler: true,
    }
}

/// Every resource name whose request makes a pod the extender's, current names first.
pub const MANAGED_RESOURCES: [ManagedResource; 19] = [
    current(NVIDIA_GPU, false),
    current(AMD_GPU, false),
    current(HYGON_DCU, false),
    current(KOORD_GPU, true),
    current(GPU_CORE, true),
    current(GPU_MEMORY, true),
    current(GPU_MEMORY_RATIO, true),
    current(GPU_SHARED, true),
    current(HUAWEI_NPU_CORE, true),
    current(HUAWEI_NPU_CPU, true),
    current(HUAWEI_NPU_DVPP, true),
    current(RDMA, true),
    current(FPGA, true),
    deprecated("kubernetes.io/gpu", KOORD_GPU),
    deprecated("kubernetes.io/gpu-core", GPU_CORE),
    deprecated("kubernetes.io/gpu-memory", GPU_MEMORY),
    deprecated("kubernetes.io/gpu-memory-ratio", GPU_MEMORY_RATIO),
    deprecated("kubernetes.io/rdma", RDMA),
    deprecated("kubernetes.io/fpga", FPGA),
];

/// The table's entry for `name`, with its position.
pub fn managed(name: &str) -> Option<(usize, &'static ManagedResource)> {
    MANAGED_RESOURCES
        .iter()
        .enumerate()
        .find(|(_, r)| r.name == name)
}

/// A set of [`MANAGED_RESOURCES`] names, one bit per entry: what a pod asks for, what a node
/// advertises in `status.allocatable`. Copy and hashable, so the read snapshot carries it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ResourceNameSet(u32);

const _: () = assert!(MANAGED_RESOURCES.len() <= 32, "one bit per name");

impl ResourceNameSet {
    /// The managed names among `names` (others are ignored).
    pub fn of<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        names
            .into_iter()
            .filter_map(managed)
            .fold(ResourceNameSet(0), |set, (i, _)| {
                ResourceNameSet(set.0 | 1 << i)
            })
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set as bits (for an atomic); [`Self::from_bits`] reads them back.
    pub const fn bits(self) -> u32 {
        self.0
    }

    pub const fn from_bits(bits: u32) -> Self {
        ResourceNameSet(bits)
    }

    /// Whether every name of `other` is in `self`.
    pub fn covers(self, other: ResourceNameSet) -> bool {
        other.0 & !self.0 == 0
    }

    /// The names in both.
    pub fn and(self, other: ResourceNameSet) -> ResourceNameSet {
        ResourceNameSet(self.0 & other.0)
    }

    /// The names in either.
    pub fn or(self, other: ResourceNameSet) -> ResourceNameSet {
        ResourceNameSet(self.0 | other.0)
    }

    /// The names of `self` that `other` lacks.
    pub fn without(self, other: ResourceNameSet) -> ResourceNameSet {
        ResourceNameSet(self.0 & !other.0)
    }

    pub fn names(self) -> impl Iterator<Item = &'static str> {
        MANAGED_RESOURCES
            .iter()
            .enumerate()
            .filter(move |(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, r)| r.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_deprecated_ones_map_to_current_ones() {
        let mut seen = std::collections::BTreeSet::new();
        for r in MANAGED_RESOURCES {
            assert!(seen.insert(r.name), "{} twice", r.name);
            if r.deprecated() {
                assert!(r.name.starts_with("kubernetes.io/"), "{}", r.name);
                let (_, target) = managed(r.canonical).expect("the canonical name is managed");
                assert!(
                    !target.deprecated(),
                    "{} renames to a deprecated name",
                    r.name
                );
            } else {
                assert!(!r.name.starts_with("kubernetes.io/"), "{}", r.name);
            }
        }
    }

    #[test]
    fn sets_cover_and_name_what_they_hold() {
        let node = ResourceNameSet::of(["nvidia.com/gpu", "cpu", "koordinator.sh/gpu-core"]);
        let pod =
            ResourceNameSet::of(["koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"]);
        assert!(!node.covers(pod));
        assert_eq!(
            pod.without(node).names().collect::<Vec<_>>(),
            ["koordinator.sh/gpu-memory-ratio"]
        );
        assert!(node.covers(ResourceNameSet::of(["nvidia.com/gpu"])));
        assert!(node.covers(ResourceNameSet::default()));
        assert!(ResourceNameSet::of(["cpu", "memory"]).is_empty());
    }

    /// The chart's default `extenderConfig.managedResources` is this table, name for name and
    /// `ignoredByScheduler` for `ignoredByScheduler`, in the same order.
    #[test]
    fn chart_lists_every_managed_resource() {
        #[derive(serde::Deserialize)]
        struct Values {
            #[serde(rename = "extenderConfig")]
            extender_config: ExtenderConfig,
        }
        #[derive(serde::Deserialize)]
        struct ExtenderConfig {
            #[serde(rename = "managedResources")]
            managed_resources: Vec<Entry>,
        }
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Entry {
            name: String,
            #[serde(rename = "ignoredByScheduler")]
            ignored_by_scheduler: bool,
        }
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/charts/device-numa-extender/values.yaml"
        );
        let text = std::fs::read_to_string(path).expect("the chart's values.yaml");
        let values: Values = serde_saphyr::from_str(&text).expect("values.yaml parses");
        let want: Vec<Entry> = MANAGED_RESOURCES
            .iter()
            .map(|r| Entry {
                name: r.name.to_string(),
                ignored_by_scheduler: r.ignored_by_scheduler,
            })
            .collect();
        assert_eq!(values.extender_config.managed_resources, want);
    }
}
