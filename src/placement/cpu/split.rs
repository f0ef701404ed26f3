//! The NUMA split of one resource of a request over the NUMA nodes of a chosen hint (reference
//! koordinator `tryBestToDistributeEvenly`): walk the nodes by ascending availability and
//! give each `remaining / nodes_left`, capped at what it has.
//!
//! Koordinator sorts by availability indexed by slice *position* instead of NUMA id (a quirk,
//! a koordinator quirk) so its "smallest first" order is only right when ids equal positions; this module
//! implements the intended order (smallest availability first, ties by lower zone index).
//!
//! Owns the arithmetic only, in whatever unit the caller chose (whole cores, whole CPUs,
//! millicores, bytes); no allocation, fixed-size arrays.

use super::MAX_NUMA_NODES;

/// Splits `need` units over the zones whose index bit is set in `members`, given each zone's
/// availability in `avail`. Returns per-zone amounts (zero outside `members`), or `None` when
/// the members together hold less than `need`.
///
/// Greedy on ascending availability never strands capacity: a zone that takes
/// `floor(rem / left)` below its availability leaves `rem' ≤ (left−1)·(q+1)`, and every later
/// zone holds at least `q+1`. So this succeeds exactly when the members' sum covers `need`.
pub fn split(
    avail: &[i64; MAX_NUMA_NODES],
    members: u32,
    need: i64,
) -> Option<[i64; MAX_NUMA_NODES]> {
    let mut out = [0i64; MAX_NUMA_NODES];
    if need <= 0 {
        return Some(out);
    }
    let mut order = [0usize; MAX_NUMA_NODES];
    let mut n = 0;
    for (i, slot) in (0..MAX_NUMA_NODES)
        .filter(|i| members & (1 << i) != 0)
        .zip(order.iter_mut())
    {
        *slot = i;
        n += 1;
    }
    let order = &mut order[..n];
    order.sort_by_key(|&i| (avail[i].max(0), i));
    let mut remaining = need;
    for (k, &i) in order.iter().enumerate() {
        let left = (n - k) as i64;
        let give = (remaining / left).min(avail[i].max(0));
        out[i] = give;
        remaining -= give;
    }
    // The last zone took `remaining / 1` capped at its availability: anything left is a
    // shortfall.
    (remaining == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arr(v: &[i64]) -> [i64; MAX_NUMA_NODES] {
        let mut a = [0; MAX_NUMA_NODES];
        a[..v.len()].copy_from_slice(v);
        a
    }

    #[test]
    fn smallest_available_first_gets_its_even_share_or_less() {
        // Zone 1 has least: it gets min(6/2, 2) = 2, zone 0 the rest.
        let out = split(&arr(&[8, 2]), 0b11, 6).unwrap();
        assert_eq!(&out[..2], &[4, 2]);
        // Even split when both can.
        let out = split(&arr(&[8, 8]), 0b11, 6).unwrap();
        assert_eq!(&out[..2], &[3, 3]);
        // Odd amounts: the smaller (here: lower index on ties) gets the floor.
        let out = split(&arr(&[8, 8]), 0b11, 5).unwrap();
        assert_eq!(&out[..2], &[2, 3]);
        // Non-members get nothing even when they have plenty.
        let out = split(&arr(&[1, 100, 4]), 0b101, 5).unwrap();
        assert_eq!(&out[..3], &[1, 0, 4]);
        assert_eq!(split(&arr(&[1, 100, 3]), 0b101, 5), None);
    }

    #[test]
    fn order_is_by_availability_not_position() {
        // Koordinator's index quirk would treat zone 2 (the smallest) as if it were zone 0.
        let out = split(&arr(&[10, 10, 1]), 0b110, 8).unwrap();
        assert_eq!(&out[..3], &[0, 7, 1]);
    }

    proptest! {
        #[test]
        fn succeeds_exactly_when_the_members_cover_the_need(
            avail in proptest::collection::vec(0i64..50, 1..8),
            members in 1u32..256,
            need in 0i64..200,
        ) {
            let a = arr(&avail);
            let members = members & ((1 << avail.len()) - 1);
            let sum: i64 = (0..avail.len()).filter(|i| members & (1 << i) != 0).map(|i| avail[i]).sum();
            match split(&a, members, need) {
                Some(out) => {
                    prop_assert!(sum >= need);
                    prop_assert_eq!(out.iter().sum::<i64>(), need);
                    for i in 0..MAX_NUMA_NODES {
                        prop_assert!(out[i] >= 0 && out[i] <= a[i]);
                        if members & (1 << i) == 0 { prop_assert_eq!(out[i], 0); }
                    }
                }
                None => prop_assert!(sum < need),
            }
        }
    }
}
