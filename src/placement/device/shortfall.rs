//! How far a node is from holding a pod's GPUs, in the pod's own terms: the words a pending
//! pod's `FailedScheduling` event shows ("largest free gpu-core on one card 40-49 of 100, pod
//! asks 50") and how near the node came (for `inspect --pod`'s nearest nodes).
//!
//! **No `%` in any word**: kube-scheduler v1.37 passes the reasons to its event recorder as a
//! *format string* (`Eventf(..., msg)`), so `40-49%, pod` reaches the event as
//! `40-49%!,(MISSING) pod` (found on the real control plane). Shares are written in the pod's
//! own units (gpu-core and gpu-memory-ratio count hundredths of a card).
//!
//! Owns the words and the nearness only. It decides nothing: it runs after the allocator has
//! refused the node, and says nothing (`None`) whenever its arithmetic would not explain the
//! refusal (a card that holds the share by its free resources but was ruled out by a hint, a
//! topology scope or NUMA alignment): the allocator's own reason then stands.
//!
//! The numbers are **banded** (tens of percent, powers of two of GiB, exact card counts), so
//! that kube-scheduler, which counts identical reasons across nodes ("3 insufficient gpu
//! devices: …"), folds a thousand nodes of one class into one line.

use std::fmt::Write as _;

use super::inventory::DeviceHoldings;
use super::request::DeviceTypeRequest;
use crate::model::device::{DeviceResources, DeviceType, format_bytes};
use crate::model::quantity::Quantity;
use crate::model::resource_names::{GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO};

/// What one node lacks for the pod's GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    /// Appended to the allocator's reason after a colon.
    pub detail: String,
    /// How much of the ask the node's best card (or its free whole cards) covers, in
    /// thousandths: 0 when nothing is free, below 1,000 always (the node was refused).
    pub met_permille: u16,
}

/// The share dimensions a per-card ask can name, in the order a tie between them is reported.
const SHARE_DIMENSIONS: [(&str, &str); 3] = [
    (GPU_CORE, "gpu-core"),
    (GPU_MEMORY_RATIO, "gpu-memory-ratio"),
    (GPU_MEMORY, "gpu-memory"),
];

/// The pod's GPU ask against the node's free GPUs (healthy cards only; an unhealthy card's
/// capacity is empty). `None` when the numbers do not explain a refusal.
pub fn gpu_shortfall(
    ledger: &(impl DeviceHoldings + ?Sized),
    ask: &DeviceTypeRequest,
) -> Option<Shortfall> {
    let devices = ledger.devices()?;
    let cards: Vec<Card<'_>> = devices
        .slots(&DeviceType::Gpu)
        .filter(|s| s.healthy && !s.total.is_empty())
        .map(|s| Card {
            minor: s.minor,
            total: &s.total,
        })
        .collect();
    let free = |card: &Card<'_>, name: &str| ledger.free_amount(&DeviceType::Gpu, card.minor, name);
    if ask.shared {
        share_shortfall(&cards, &free, ask)
    } else {
        whole_shortfall(&cards, &free, ask)
    }
}

/// A healthy card: its minor and capacity (what is free is read through the ledger, with no
/// copy of any map: a pod refused by thousands of nodes has each read).
struct Card<'a> {
    minor: i32,
    total: &'a DeviceResources,
}

/// Whether nothing of the card is held.
fn wholly_free(card: &Card<'_>, free: &dyn Fn(&Card<'_>, &str) -> Quantity) -> bool {
    card.total.iter().all(|(name, q)| free(card, name) >= *q)
}

/// Whole cards: how many are wholly free against how many the pod asks.
fn whole_shortfall(
    cards: &[Card<'_>],
    free_of: &dyn Fn(&Card<'_>, &str) -> Quantity,
    ask: &DeviceTypeRequest,
) -> Option<Shortfall> {
    let free = cards.iter().filter(|c| wholly_free(c, free_of)).count();
    if free >= ask.count || ask.count == 0 {
        return None;
    }
    if cards.len() < ask.count {
        // Freeing anything cannot help: say what the node has, not what is free.
        let detail = match cards.len() {
            1 => format!("only 1 healthy gpu, pod asks {}", ask.count),
            n => format!("only {n} healthy gpus, pod asks {}", ask.count),
        };
        return Some(Shortfall {
            detail,
            met_permille: permille(free as i128, ask.count as i128),
        });
    }
    let detail = match free {
        0 => format!("no whole gpu free, pod asks {}", ask.count),
        1 => format!("1 whole gpu free, pod asks {}", ask.count),
        n => format!("{n} whole gpus free, pod asks {}", ask.count),
    };
    Some(Shortfall {
        detail,
        met_permille: permille(free as i128, ask.count as i128),
    })
}

/// A share of one card: the card that comes nearest, the dimension that stops it, and
/// whether the node as a whole has room (then it is fragmentation, not capacity).
fn share_shortfall(
    cards: &[Card<'_>],
    free_of: &dyn Fn(&Card<'_>, &str) -> Quantity,
    ask: &DeviceTypeRequest,
) -> Option<Shortfall> {
    if ask.count != 1 {
        return None;
    }
    let dims: Vec<(&str, &str, Quantity)> = SHARE_DIMENSIONS
        .iter()
        .filter_map(|(name, label)| {
            let q = *ask.per_device.get(*name)?;
            (q > Quantity::ZERO).then_some((*name, *label, q))
        })
        .collect();
    if dims.is_empty() {
        return None;
    }
    let total_of = |card: &Card<'_>, name: &str| card.total.get(name).copied().unwrap_or_default();
    // The nearest card: the highest share of the ask its most limiting dimension covers; ties
    // go to the first card (minor ascending), so the words do not depend on hashing.
    let mut best: Option<(u16, usize, Quantity)> = None; // (met, dimension, free there)
    for card in cards {
        let (met, dim) = dims
            .iter()
            .enumerate()
            .map(|(i, (name, _, want))| (permille(free_of(card, name).milli(), want.milli()), i))
            .min_by_key(|(met, i)| (*met, *i))
            .expect("dims is not empty");
        if best.is_none_or(|(m, _, _)| met > m) {
            best = Some((met, dim, free_of(card, dims[dim].0)));
        }
    }
    let (met, dim, largest) = best.unwrap_or((0, 0, Quantity::ZERO));
    if met >= 1000 {
        // A card holds the share by its resources: something else (a hint, a scope, NUMA)
        // refused it, and the allocator's reason says what.
        return None;
    }
    // A dimension no card has as much of, even empty: freeing anything cannot help.
    for (name, label, want) in &dims {
        let most = cards
            .iter()
            .map(|card| total_of(card, name))
            .max()
            .unwrap_or_default();
        if most < *want {
            let (most, asks) = if *name == GPU_MEMORY {
                (format_bytes(most), format_bytes(*want))
            } else {
                (percent(most), percent(*want))
            };
            return Some(Shortfall {
                detail: format!("largest {label} of any card {most}, pod asks {asks}"),
                met_permille: met,
            });
        }
    }
    let (name, label, want) = dims[dim];
    let partly_free = cards
        .iter()
        .filter(|card| free_of(card, name) > Quantity::ZERO)
        .count();
    let node_holds_it = dims.iter().all(|(name, _, want)| {
        cards
            .iter()
            .map(|card| free_of(card, name).milli())
            .sum::<i128>()
            >= want.milli()
    });
    let is_bytes = name == GPU_MEMORY;
    let asks = if is_bytes {
        format_bytes(want)
    } else {
        percent(want)
    };
    let mut detail = String::new();
    if largest <= Quantity::ZERO {
        let _ = write!(detail, "no card has free {label}, pod asks {asks}");
    } else {
        let band = if is_bytes {
            bytes_band(largest, want)
        } else {
            percent_band(largest, want)
        };
        if node_holds_it && partly_free > 1 {
            let _ = write!(
                detail,
                "fragmented, {partly_free} cards partly free, largest free {label} on one card {band}, pod asks {asks}"
            );
        } else {
            let _ = write!(
                detail,
                "largest free {label} on one card {band}, pod asks {asks}"
            );
        }
    }
    Some(Shortfall {
        detail,
        met_permille: met,
    })
}

/// `have / want` in thousandths, at most 1,000.
fn permille(have: i128, want: i128) -> u16 {
    if want <= 0 {
        return 1000;
    }
    (have.max(0).saturating_mul(1000) / want).min(1000) as u16
}

/// A hundredths-of-a-card dimension's value as the pod wrote it (`50`, `12.5`).
fn percent(q: Quantity) -> String {
    let m = q.milli();
    if m % 1000 == 0 {
        format!("{}", m / 1000)
    } else {
        format!("{}", q)
    }
}

/// A free share in tens of hundredths, below the ask (`40-49 of 100`; `40-44 of 100` when the
/// pod asks 45): the band never reaches what the pod asks, so it cannot read as enough.
fn percent_band(free: Quantity, ask: Quantity) -> String {
    let low = (free.milli().max(0) / 1000) / 10 * 10;
    let high = (low + 9).min((ask.milli() - 1).max(0) / 1000);
    if high <= low {
        format!("{low} of 100")
    } else {
        format!("{low}-{high} of 100")
    }
}

/// Free bytes in powers of two of GiB, below the ask: `under 1Gi`, `1-2Gi`, `32-40Gi` when the
/// pod asks 40Gi, `32Gi+` when the ask leaves no whole GiB above the band's start.
fn bytes_band(free: Quantity, ask: Quantity) -> String {
    const GI: i128 = 1 << 30;
    let gib = free.milli().max(0) / 1000 / GI;
    if gib == 0 {
        return "under 1Gi".into();
    }
    let low = 1i128 << (127 - gib.leading_zeros());
    let high = (low * 2).min(ask.milli() / 1000 / GI);
    if high <= low {
        format!("{low}Gi+")
    } else {
        format!("{low}-{high}Gi")
    }
}

/// Whole GPUs wholly free per NUMA node: how many the best NUMA node holds, and over how many
/// NUMA nodes the free ones lie. For a pod whose NUMA policy refused the node although the
/// node has enough free cards in all.
pub fn whole_gpus_per_numa(
    ledger: &(impl DeviceHoldings + ?Sized),
) -> Option<(usize, usize, usize)> {
    let devices = ledger.devices()?;
    let mut per_numa = std::collections::BTreeMap::<i32, usize>::new();
    for s in devices
        .slots(&DeviceType::Gpu)
        .filter(|s| s.healthy && !s.total.is_empty())
    {
        let card = Card {
            minor: s.minor,
            total: &s.total,
        };
        let free =
            |card: &Card<'_>, name: &str| ledger.free_amount(&DeviceType::Gpu, card.minor, name);
        if wholly_free(&card, &free) {
            let numa = s.topology.as_ref().map_or(-1, |t| t.node_id);
            *per_numa.entry(numa).or_default() += 1;
        }
    }
    let total = per_numa.values().sum();
    let most = per_numa.values().copied().max().unwrap_or(0);
    Some((total, most, per_numa.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_fold_nodes_into_few_words() {
        let q = Quantity::from_units;
        let gi = |n: i64| Quantity::from_units(n << 30);
        assert_eq!(percent_band(q(47), q(50)), "40-49 of 100");
        assert_eq!(percent_band(q(42), q(45)), "40-44 of 100");
        assert_eq!(percent_band(q(40), q(41)), "40 of 100");
        assert_eq!(percent_band(q(5), q(100)), "0-9 of 100");
        assert_eq!(percent_band(q(90), q(100)), "90-99 of 100");
        assert_eq!(bytes_band(q(512 << 20), gi(16)), "under 1Gi");
        assert_eq!(bytes_band(gi(1), gi(16)), "1-2Gi");
        assert_eq!(bytes_band(q(7_500_000_000), gi(16)), "4-8Gi");
        assert_eq!(bytes_band(gi(32), gi(40)), "32-40Gi");
        assert_eq!(bytes_band(gi(32), q((32 << 30) + 1)), "32Gi+");
        assert_eq!(percent(Quantity::from_units(50)), "50");
        assert_eq!(permille(3, 4), 750);
        assert_eq!(permille(5, 4), 1000);
        assert_eq!(permille(1, 0), 1000);
    }
}
