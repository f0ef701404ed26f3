//! GPU partition tables (koordinator deviceshare v1.7.0: `allocator_gpu.go` `allocateByPartition`
//! and `selectPartitionByBinPack`, `allocator_gpu_helper.go` `GetGPUPartitionIndexer` and the
//! built-in `GPUPartitionIndexOfNVIDIAHopper`).
//!
//! On NVLink machines (H100/H800/H20 with 8 GPUs) only some GPU sets talk at full bandwidth; a
//! partition table lists them per GPU count. A whole-GPU request of N GPUs takes one free
//! partition of N (the fewest other partitions broken, by koordinator's bin-pack score), ahead of
//! the topology rules. Under `Honor` (the table's policy label, or a pod `gpu-partition-spec`) a
//! request no partition can hold fails; under `Prefer` it falls back to the general allocator.
//!
//! Owns the table's index and the choice. The wire form is `model::gpu_partition`'s; which table
//! a node uses (its Device's, else the built-in one its Node's labels select) is decided by the
//! inventory; the general allocator calls [`choose`]. Pure and deterministic.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::gpu_partition::{GpuPartitionSpec, RawPartition};
use crate::model::quantity::Quantity;
use crate::placement::{FitError, FitReason};

/// "Insufficient Partitioned GPU Devices": no listed partition of the size is free (resolvable).
pub const INSUFFICIENT: FitReason = FitReason::InsufficientGpuPartition;
/// "node(s) missing GPU Partition Table": partitions are honoured and the node has none.
pub const MISSING_TABLE: FitReason = FitReason::MissingGpuPartitionTable;
/// "node(s) Unsupported number of GPU requests": the table lists no partition of that size.
pub const UNSUPPORTED_COUNT: FitReason = FitReason::UnsupportedGpuPartitionCount;

/// The largest minor a partition may name (koordinator hashes minors into a 64-bit mask).
pub const MAX_MINOR: i64 = 63;

/// The largest allocation score accepted (either sign). Scores rank partitions (koordinator's
/// own tables use 1 and 2); with this bound the partition step's weighted sum (at most 10,000 ×
/// 10^9 × 64 partitions) stays far inside an i64, and it is computed saturating anyway.
pub const MAX_ALLOCATION_SCORE: i64 = 1_000_000_000;

/// One partition: the GPUs it is made of.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GpuPartition {
    /// Ascending, distinct, each ≤ [`MAX_MINOR`].
    pub minors: Vec<i32>,
    /// Bit `m` for each minor `m`.
    pub mask: u64,
    pub link: Option<String>,
    pub ring_bus_bandwidth: Option<Quantity>,
    pub allocation_score: i64,
}

/// The partitions of one size with one allocation score, in the table's order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScoreGroup {
    pub allocation_score: i64,
    pub partitions: Vec<GpuPartition>,
}

/// koordinator's partition index: per GPU count, the score groups by ascending allocation score
/// (koordinator takes the first group with a free partition; `Restricted` only the first).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PartitionTable {
    by_count: BTreeMap<usize, Vec<ScoreGroup>>,
}

/// Why a Device's partition table is refused (the node then uses the built-in table its labels
/// select, if any, as koordinator does with a table it cannot decode).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error(transparent)]
    Annotation(#[from] crate::model::gpu_partition::PartitionAnnotationError),
    /// koordinator would hand a pod asking for `count` GPUs this partition's GPUs instead.
    #[error("partition {index} of size {count} lists {minors:?}: not {count} distinct GPU minors")]
    WrongSize {
        count: i64,
        index: usize,
        minors: Vec<i64>,
    },
    /// A score outside ±[`MAX_ALLOCATION_SCORE`]: the partition step multiplies and sums
    /// scores, which koordinator lets wrap silently (issue 36 §5).
    #[error(
        "partition {index} of size {count} has allocationScore {score}, outside ±{MAX_ALLOCATION_SCORE}"
    )]
    ScoreOutOfRange {
        count: i64,
        index: usize,
        score: i64,
    },
    /// Minors outside 0..=63 cannot be hashed (koordinator panics on a negative one).
    #[error("partition {index} of size {count} names minor {minor}, outside 0..={MAX_MINOR}")]
    MinorOutOfRange {
        count: i64,
        index: usize,
        minor: i64,
    },
}

impl PartitionTable {
    /// The index of a decoded table. Sizes with no partition are dropped (a request of that
    /// size is then unsupported, as in koordinator).
    pub fn new(raw: &BTreeMap<i64, Vec<RawPartition>>) -> Result<Self, TableError> {
        let mut by_count: BTreeMap<usize, Vec<ScoreGroup>> = BTreeMap::new();
        for (&count, partitions) in raw {
            for (index, p) in partitions.iter().enumerate() {
                if let Some(&minor) = p.minors.iter().find(|m| !(0..=MAX_MINOR).contains(*m)) {
                    return Err(TableError::MinorOutOfRange {
                        count,
                        index,
                        minor,
                    });
                }
                if p.allocation_score.unsigned_abs() > MAX_ALLOCATION_SCORE as u64 {
                    return Err(TableError::ScoreOutOfRange {
                        count,
                        index,
                        score: p.allocation_score,
                    });
                }
                let mask = p.minors.iter().fold(0u64, |m, &minor| m | (1 << minor));
                let distinct = mask.count_ones() as usize;
                if count < 1 || distinct != p.minors.len() || distinct as i64 != count {
                    return Err(TableError::WrongSize {
                        count,
                        index,
                        minors: p.minors.clone(),
                    });
                }
                let mut minors: Vec<i32> = p.minors.iter().map(|&m| m as i32).collect();
                minors.sort_unstable();
                let groups = by_count.entry(count as usize).or_default();
                let partition = GpuPartition {
                    minors,
                    mask,
                    link: p.link.clone(),
                    ring_bus_bandwidth: p.ring_bus_bandwidth,
                    allocation_score: p.allocation_score,
                };
                match groups
                    .iter_mut()
                    .find(|g| g.allocation_score == p.allocation_score)
                {
                    Some(g) => g.partitions.push(partition),
                    None => groups.push(ScoreGroup {
                        allocation_score: p.allocation_score,
                        partitions: vec![partition],
                    }),
                }
            }
        }
        for groups in by_count.values_mut() {
            groups.sort_by_key(|g| g.allocation_score);
        }
        Ok(PartitionTable { by_count })
    }

    /// koordinator's built-in table for 8-GPU NVIDIA Hopper machines: singles, pairs (0-1, 2-3,
    /// 4-5, 6-7), halves (0-3, 4-7) and all eight, each with allocation score 1.
    pub fn hopper() -> Arc<PartitionTable> {
        static HOPPER: std::sync::LazyLock<Arc<PartitionTable>> = std::sync::LazyLock::new(|| {
            let mut raw: BTreeMap<i64, Vec<RawPartition>> = BTreeMap::new();
            for size in [1i64, 2, 4, 8] {
                raw.insert(
                    size,
                    (0..8 / size)
                        .map(|i| RawPartition {
                            minors: (i * size..(i + 1) * size).collect(),
                            link: Some("NVLink".into()),
                            ring_bus_bandwidth: None,
                            allocation_score: 1,
                        })
                        .collect(),
                );
            }
            Arc::new(PartitionTable::new(&raw).expect("the built-in table is valid"))
        });
        HOPPER.clone()
    }

    /// The sizes listed, ascending, with their score groups.
    pub fn sizes(&self) -> impl Iterator<Item = (usize, &[ScoreGroup])> {
        self.by_count.iter().map(|(n, g)| (*n, g.as_slice()))
    }
}

/// Where a node's partition table comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TableSource {
    /// The Device's `gpu-partitions` annotation.
    Device,
    /// koordinator's built-in Hopper table, selected by the Node's GPU model label.
    BuiltInHopper,
}

/// A node's partitions as the allocator sees them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodePartitions {
    /// `None`: the node has no table (honouring pods fail with [`MISSING_TABLE`]).
    pub table: Option<(Arc<PartitionTable>, TableSource)>,
    /// The policy label of the table's owner says `Honor`.
    pub honor: bool,
}

/// The partition step for a request of `count` whole GPUs (never for shared GPUs, which
/// koordinator leaves to the topology rules): `Ok(Some)` the minors to take, `Ok(None)` leave it
/// to the general allocator, `Err` the honoured rule that failed.
///
/// `free` has bit `m` for each healthy GPU the pod may use (on an allowed NUMA node) and `used`
/// for each GPU anything is allocated from.
pub fn choose(
    node: &NodePartitions,
    spec: Option<&GpuPartitionSpec>,
    count: usize,
    used: u64,
    total: u64,
) -> Result<Option<Vec<i32>>, FitError> {
    let honor = spec.is_some() || node.honor;
    match honoured(node, spec, count, used, total) {
        Ok(p) => Ok(Some(p.minors.clone())),
        Err(e) if honor => Err(e),
        Err(_) => Ok(None),
    }
}

fn honoured<'a>(
    node: &'a NodePartitions,
    spec: Option<&GpuPartitionSpec>,
    count: usize,
    used: u64,
    total: u64,
) -> Result<&'a GpuPartition, FitError> {
    let Some((table, _)) = &node.table else {
        return Err(FitError::new(MISSING_TABLE, true));
    };
    let Some(groups) = table.by_count.get(&count) else {
        return Err(FitError::new(UNSUPPORTED_COUNT, true));
    };
    let bandwidth = spec.and_then(|s| s.ring_bus_bandwidth);
    let restricted = spec.is_some_and(|s| s.restricted);
    let mut feasible: Vec<&GpuPartition> = Vec::new();
    for group in groups {
        feasible.extend(group.partitions.iter().filter(|p| {
            p.mask & used == 0
                && total & p.mask == p.mask
                && bandwidth.is_none_or(|want| p.ring_bus_bandwidth.is_some_and(|has| want <= has))
        }));
        if !feasible.is_empty() || restricted {
            break;
        }
    }
    if feasible.is_empty() {
        return Err(FitError::new(INSUFFICIENT, false));
    }
    Ok(bin_pack(used, &feasible, table, count))
}

/// koordinator's `selectPartitionByBinPack`: the feasible partition that leaves the most
/// partitions of 8, then 4, then 2 GPUs (of the first score group of each size, weighted
/// 10000 / 100 / 1 by their allocation score) whole; the first in table order on a tie.
fn bin_pack<'a>(
    used: u64,
    feasible: &[&'a GpuPartition],
    table: &PartitionTable,
    desired: usize,
) -> &'a GpuPartition {
    let mut best = feasible[0];
    if feasible.len() == 1 {
        return best;
    }
    let mut best_score = i64::MIN;
    for &candidate in feasible {
        let taken = used | candidate.mask;
        let mut score = 0i64;
        for (size, weight) in [(8usize, 10_000i64), (4, 100), (2, 1)] {
            if size < desired {
                continue;
            }
            let Some(first) = table.by_count.get(&size).and_then(|g| g.first()) else {
                continue;
            };
            // Saturating: bounded scores cannot overflow, and a table built without
            // `PartitionTable::new`'s check must not panic or wrap either.
            score = first
                .partitions
                .iter()
                .filter(|p| p.mask & taken == 0)
                .map(|p| weight.saturating_mul(p.allocation_score))
                .fold(score, i64::saturating_add);
        }
        if score > best_score {
            best = candidate;
            best_score = score;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gpu_partition::parse_partition_table;

    fn mask(minors: &[i32]) -> u64 {
        minors.iter().fold(0, |m, &i| m | (1 << i))
    }
    const ALL8: u64 = 0xff;

    fn hopper(honor: bool) -> NodePartitions {
        NodePartitions {
            table: Some((PartitionTable::hopper(), TableSource::BuiltInHopper)),
            honor,
        }
    }

    #[test]
    fn the_builtin_table_is_koordinators() {
        let t = PartitionTable::hopper();
        let sizes: Vec<(usize, Vec<Vec<i32>>)> = t
            .sizes()
            .map(|(n, g)| {
                assert_eq!(g.len(), 1);
                (
                    n,
                    g[0].partitions.iter().map(|p| p.minors.clone()).collect(),
                )
            })
            .collect();
        assert_eq!(
            sizes,
            vec![
                (1, (0..8).map(|m| vec![m]).collect()),
                (2, vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]),
                (4, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]),
                (8, vec![(0..8).collect()]),
            ]
        );
    }

    /// One GPU on a Hopper node with GPU 0 used: the bin-pack keeps the most pairs, halves and
    /// the whole node: GPU 1 (breaks nothing new), not GPU 2.
    #[test]
    fn bin_pack_takes_the_partition_that_breaks_the_fewest() {
        let node = hopper(false);
        assert_eq!(choose(&node, None, 1, mask(&[0]), ALL8), Ok(Some(vec![1])));
        // Pairs: with 0 and 4 used, 2-3 and 6-7 are free; 2-3 breaks half 0-3 (already broken),
        // 6-7 breaks 4-7 (already broken): equal, the first in table order.
        assert_eq!(
            choose(&node, None, 2, mask(&[0, 4]), ALL8),
            Ok(Some(vec![2, 3]))
        );
        // With only 0 used, 2-3 keeps half 4-7 whole; 4-5 or 6-7 would break it.
        assert_eq!(
            choose(&node, None, 2, mask(&[0]), ALL8),
            Ok(Some(vec![2, 3]))
        );
        assert_eq!(
            choose(&node, None, 4, mask(&[5]), ALL8),
            Ok(Some(vec![0, 1, 2, 3]))
        );
    }

    /// Honor fails with koordinator's reasons; Prefer falls back to the general allocator.
    #[test]
    fn honor_fails_where_prefer_falls_back() {
        // 0 and 2 used: no pair free among 0-1, 2-3; 4-5 and 6-7 are; no half is.
        let used = mask(&[0, 2]);
        for node in [hopper(true), hopper(false)] {
            assert_eq!(choose(&node, None, 2, used, ALL8), Ok(Some(vec![4, 5])));
        }
        let insufficient = choose(&hopper(true), None, 4, used | mask(&[4]), ALL8).unwrap_err();
        assert_eq!(insufficient.reason, INSUFFICIENT);
        assert!(!insufficient.unresolvable);
        assert_eq!(
            choose(&hopper(false), None, 4, used | mask(&[4]), ALL8),
            Ok(None)
        );
        let odd = choose(&hopper(true), None, 3, 0, ALL8).unwrap_err();
        assert_eq!((odd.reason, odd.unresolvable), (UNSUPPORTED_COUNT, true));
        assert_eq!(choose(&hopper(false), None, 3, 0, ALL8), Ok(None));
        // A pod spec honours partitions on a Prefer node too; no table at all is unresolvable.
        let spec = GpuPartitionSpec::default();
        assert!(choose(&hopper(false), Some(&spec), 3, 0, ALL8).is_err());
        let none = choose(&NodePartitions::default(), Some(&spec), 2, 0, ALL8).unwrap_err();
        assert_eq!((none.reason, none.unresolvable), (MISSING_TABLE, true));
        assert_eq!(
            choose(&NodePartitions::default(), None, 2, 0, ALL8),
            Ok(None)
        );
        // An unhealthy (or NUMA-excluded) GPU is not in `total`: its partitions are not free.
        assert_eq!(
            choose(&hopper(true), None, 8, 0, ALL8 & !mask(&[7]))
                .unwrap_err()
                .reason,
            INSUFFICIENT
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Issue 36 §5: any allocation scores (the whole i64 range) in an annotation, and any
        /// GPUs used: a table is refused, naming the score, or the partition step answers. Never
        /// a panic: before the fix `simulate` panicked with "attempt to multiply with overflow"
        /// in a debug build, and a release build wrapped and picked arbitrarily.
        #[test]
        fn any_allocation_scores_are_refused_or_scored_without_overflow(
            scores in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::prelude::any::<i64>(),
                    -MAX_ALLOCATION_SCORE..=MAX_ALLOCATION_SCORE,
                    proptest::prelude::Just(MAX_ALLOCATION_SCORE),
                    proptest::prelude::Just(-MAX_ALLOCATION_SCORE),
                ],
                15,
            ),
            used in proptest::prelude::any::<u8>(),
            count in proptest::prop_oneof![proptest::prelude::Just(1usize), proptest::prelude::Just(2), proptest::prelude::Just(4), proptest::prelude::Just(8)],
        ) {
            // The Hopper layout: 8 singles, 4 pairs, 2 halves, 1 whole, one score each.
            let mut it = scores.iter();
            let mut table = serde_json::Map::new();
            for size in [1i64, 2, 4, 8] {
                let parts: Vec<serde_json::Value> = (0..8 / size)
                    .map(|i| serde_json::json!({
                        "minors": (i * size..(i + 1) * size).collect::<Vec<_>>(),
                        "allocationScore": it.next().unwrap(),
                    }))
                    .collect();
                table.insert(size.to_string(), parts.into());
            }
            let raw = parse_partition_table(&serde_json::Value::Object(table).to_string()).unwrap();
            let in_range = scores.iter().all(|s| s.unsigned_abs() <= MAX_ALLOCATION_SCORE as u64);
            match PartitionTable::new(&raw) {
                Err(e) => {
                    proptest::prop_assert!(!in_range, "{e}");
                    proptest::prop_assert!(e.to_string().contains("allocationScore"), "{e}");
                }
                Ok(t) => {
                    proptest::prop_assert!(in_range);
                    let node = NodePartitions {
                        table: Some((Arc::new(t), TableSource::Device)),
                        honor: true,
                    };
                    let _ = choose(&node, None, count, u64::from(used), ALL8);
                }
            }
        }
    }

    /// Score groups ascending; `BestEffort` moves on to the next group, `Restricted` does not;
    /// a ring bus bandwidth wish skips partitions without enough.
    #[test]
    fn score_groups_restricted_and_bandwidth() {
        let raw = parse_partition_table(
            r#"{"2":[{"minors":[2,3],"allocationScore":2,"ringBusBandwidth":"400Gi"},
                     {"minors":[0,1],"allocationScore":1,"ringBusBandwidth":"200Gi"},
                     {"minors":[4,5],"allocationScore":1}]}"#,
        )
        .unwrap();
        let node = NodePartitions {
            table: Some((
                Arc::new(PartitionTable::new(&raw).unwrap()),
                TableSource::Device,
            )),
            honor: true,
        };
        let all = mask(&[0, 1, 2, 3, 4, 5]);
        assert_eq!(
            choose(&node, None, 2, 0, all),
            Ok(Some(vec![0, 1])),
            "score 1 first"
        );
        let used = mask(&[0, 4]);
        assert_eq!(choose(&node, None, 2, used, all), Ok(Some(vec![2, 3])));
        let restricted = GpuPartitionSpec {
            restricted: true,
            ring_bus_bandwidth: None,
        };
        assert_eq!(
            choose(&node, Some(&restricted), 2, used, all)
                .unwrap_err()
                .reason,
            INSUFFICIENT
        );
        let fast = GpuPartitionSpec {
            restricted: false,
            ring_bus_bandwidth: Some(Quantity::parse("300Gi").unwrap()),
        };
        assert_eq!(choose(&node, Some(&fast), 2, 0, all), Ok(Some(vec![2, 3])));
        let faster = GpuPartitionSpec {
            ring_bus_bandwidth: Some(Quantity::parse("500Gi").unwrap()),
            ..fast
        };
        assert_eq!(
            choose(&node, Some(&faster), 2, 0, all).unwrap_err().reason,
            INSUFFICIENT
        );
    }

    /// Every case koordinator's own `allocateByPartition` answered
    /// (tests/koord-compat/accumulator/partitions, seeded random tables, holdings, policies and
    /// pod specs): the same partition, the same failed rule, or the same fall-through.
    #[test]
    fn koordinators_partition_step_agrees_case_for_case() {
        use crate::model::gpu_partition::parse_partition_spec;
        #[derive(serde::Deserialize)]
        struct Case {
            #[serde(default)]
            table: String,
            #[serde(default)]
            builtin: bool,
            node_honor: bool,
            total: Option<Vec<i32>>,
            used: Option<Vec<i32>>,
            count: usize,
            #[serde(default)]
            spec: String,
            #[serde(default)]
            minors: Vec<i32>,
            #[serde(default)]
            reason: String,
        }
        let cases = include_str!("../../../tests/koord-compat/partition-cases.jsonl");
        let mut n = 0;
        for (i, line) in cases.lines().enumerate() {
            let c: Case = serde_json::from_str(line).expect("case");
            let table = if c.builtin {
                Some((PartitionTable::hopper(), TableSource::BuiltInHopper))
            } else if c.table.is_empty() {
                None
            } else {
                let raw = parse_partition_table(&c.table).expect("koordinator's table parses");
                let table = PartitionTable::new(&raw).expect("koordinator's table is valid");
                Some((Arc::new(table), TableSource::Device))
            };
            let node = NodePartitions {
                table,
                honor: c.node_honor,
            };
            let spec = (!c.spec.is_empty())
                .then(|| parse_partition_spec(&c.spec).expect("koordinator's spec parses"));
            let (used, total) = (c.used.unwrap_or_default(), c.total.unwrap_or_default());
            let got = choose(&node, spec.as_ref(), c.count, mask(&used), mask(&total));
            let mut want_minors = c.minors.clone();
            want_minors.sort_unstable();
            match got {
                Ok(Some(minors)) => assert_eq!(minors, want_minors, "case {i}: {line}"),
                Ok(None) => assert!(
                    c.minors.is_empty() && c.reason.is_empty(),
                    "case {i}: left to the general allocator; koordinator: {line}"
                ),
                Err(e) => assert_eq!(e.reason.to_string(), c.reason, "case {i}: {line}"),
            }
            n += 1;
        }
        assert_eq!(n, 3000);
    }

    #[test]
    fn malformed_tables_name_the_partition() {
        for (text, want) in [
            (r#"{"2":[{"minors":[0]}]}"#, "not 2 distinct"),
            (r#"{"2":[{"minors":[0,0]}]}"#, "not 2 distinct"),
            (r#"{"1":[{}]}"#, "not 1 distinct"),
            (r#"{"0":[{"minors":[]}]}"#, "not 0 distinct"),
            (r#"{"1":[{"minors":[64]}]}"#, "outside 0..=63"),
            (r#"{"1":[{"minors":[-1]}]}"#, "outside 0..=63"),
        ] {
            let raw = parse_partition_table(text).unwrap();
            let e = PartitionTable::new(&raw).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        let empty = parse_partition_table(r#"{"2":[]}"#).unwrap();
        assert_eq!(PartitionTable::new(&empty).unwrap().sizes().count(), 0);
    }
}
