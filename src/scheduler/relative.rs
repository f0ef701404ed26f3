//! What prioritize sends: the scores less the lowest one, and only the hosts whose score is
//! above it. Every score sent stays inside the extender API's documented range,
//! 0..=`MaxExtenderPriority` (10).
//!
//! kube-scheduler v1.37 (`schedule_one.go`, `prioritizeNodes`) adds `score × weight × 10` to
//! the total of each host the extender lists and nothing to a host it leaves out. Subtracting
//! one constant from every host's score therefore changes no difference between two totals:
//! the ranking and the sets of tied nodes are the same. So the answer subtracts the lowest
//! score and leaves out every host that had it: on a large cluster most nodes score alike
//! (under most-allocated and fragmentation scoring the empty nodes, which score lowest), and
//! kube-scheduler then encodes, sends and decodes a few entries instead of one per candidate.
//!
//! Why the lowest and not the most common score (the encoding before trust IV): subtracting
//! the most common one sent negative scores whenever some host scored below it (13 of 14
//! answers in a seeded differential). v1.37 happens not to check the range; nothing promises a
//! later release, or another caller of the extender API, will not. Subtracting the lowest
//! keeps every answer in 0..=10 and keeps the compression for the common case; where the
//! common score is the highest (least-allocated scoring on an empty cluster) the answer lists
//! every host that scores above the lowest, as the plain encoding would.
//!
//! Ties: kube-scheduler breaks a tie on the total by a random number it draws only for the
//! hosts an extender listed (`Randomizer`; 0 for the rest, the stock scheduler's order when no
//! extender scores). Hosts with the same score are either all listed or all left out, so ties
//! among them break as before (listed) or in kube-scheduler's own node order (left out). A tie
//! between a listed and a left-out host needs the in-tree scores to differ by exactly
//! `weight × 10` times the score difference, which the chart's weight (200, against an in-tree
//! total of at most 1,500 for the v1.37 default plugins) makes impossible; with a smaller weight the listed host wins such a
//! tie. The property tests below check all of this against kube-scheduler's combination,
//! written out from its source.
//!
//! Must not decide anything: it re-encodes prioritize's answer (`verbs::prioritize`, which
//! `simulate` and the tests read in full).

use crate::model::wire::HostPriority;

/// The extender API's highest score (`extenderv1.MaxExtenderPriority`).
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// The answer kube-scheduler reads the same way as `scores`: each host whose score is above
/// the lowest one, with the lowest subtracted, in the order given. Scores are first held to
/// 0..=[`MAX_EXTENDER_PRIORITY`] (prioritize's own are; a score outside would be a bug, and
/// must still not leave the documented range on the wire).
pub fn relative_to_lowest(mut scores: Vec<HostPriority<'_>>) -> Vec<HostPriority<'_>> {
    for h in &mut scores {
        debug_assert!(
            (0..=MAX_EXTENDER_PRIORITY).contains(&h.score),
            "prioritize scored {} outside 0..=10: {}",
            h.host,
            h.score
        );
        h.score = h.score.clamp(0, MAX_EXTENDER_PRIORITY);
    }
    let Some(lowest) = scores.iter().map(|h| h.score).min() else {
        return scores;
    };
    // In place: when most scores differ (CPU-scored pods), the list is barely shorter, and a
    // second list of thousands of hosts would cost more than the pass itself.
    scores.retain_mut(|h| {
        h.score -= lowest;
        h.score != 0
    });
    scores
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// kube-scheduler v1.37's combination, written from `schedule_one.go` (`prioritizeNodes`)
    /// and `framework/sorted_nodes.go`: each listed host gets `score × weight ×
    /// (MaxNodeScore / MaxExtenderPriority)` added to its in-tree total and a random
    /// `Randomizer`; a host not listed gets nothing and `Randomizer` 0. Returns
    /// `(total, listed)` per node, in the nodes' order.
    fn kube_scheduler_totals(
        in_tree: &[i64],
        names: &[String],
        answer: &[(String, i64)],
        weight: i64,
    ) -> Vec<(i64, bool)> {
        const MAX_NODE_SCORE: i64 = 100;
        const MAX_EXTENDER_PRIORITY: i64 = 10;
        let mut by_host: HashMap<&str, i64> = HashMap::new();
        for (host, score) in answer {
            *by_host.entry(host.as_str()).or_default() +=
                score * weight * (MAX_NODE_SCORE / MAX_EXTENDER_PRIORITY);
        }
        names
            .iter()
            .zip(in_tree)
            .map(|(n, own)| match by_host.get(n.as_str()) {
                Some(extra) => (own + extra, true),
                None => (*own, false),
            })
            .collect()
    }

    fn answer(full: &[(String, i64)]) -> Vec<(String, i64)> {
        let hosts = full
            .iter()
            .map(|(h, s)| HostPriority {
                host: Cow::Borrowed(h.as_str()),
                score: *s,
            })
            .collect();
        relative_to_lowest(hosts)
            .into_iter()
            .map(|h| (h.host.into_owned(), h.score))
            .collect()
    }

    /// Names `node-<i>` for scores in order: the names, and the full answer.
    fn named(ours: &[i64]) -> (Vec<String>, Vec<(String, i64)>) {
        let names: Vec<String> = (0..ours.len()).map(|i| format!("node-{i}")).collect();
        let full = names.iter().cloned().zip(ours.iter().copied()).collect();
        (names, full)
    }

    /// Nodes with an in-tree total (the v1.37 default plugins' at most 1,500) and our score,
    /// 0..=10 (what prioritize answers).
    fn cluster() -> impl Strategy<Value = (Vec<i64>, Vec<i64>)> {
        (1usize..60).prop_flat_map(|n| {
            (
                prop::collection::vec(0i64..=1500, n),
                // Few distinct values, as a real cluster has: many repeats.
                prop::collection::vec(prop_oneof![Just(0i64), Just(10), 0i64..=10], n),
            )
        })
    }

    proptest! {
        /// Every node's total moves by the same constant: same ranking, same ties.
        #[test]
        fn kube_scheduler_ranks_the_short_answer_as_the_full_one(
            (in_tree, ours) in cluster(),
            weight in 1i64..=400,
        ) {
            let (names, full) = named(&ours);
            let short = answer(&full);
            let before = kube_scheduler_totals(&in_tree, &names, &full, weight);
            let after = kube_scheduler_totals(&in_tree, &names, &short, weight);
            let shift = after[0].0 - before[0].0;
            for (b, a) in before.iter().zip(&after) {
                prop_assert_eq!(a.0 - b.0, shift);
            }
            // Only hosts that were asked about, each at most once, every score inside the
            // extender API's range 1..=10 (0 is what leaving a host out means).
            prop_assert!(short.len() <= full.len());
            prop_assert!(short.iter().all(|(h, s)| (1..=10).contains(s) && names.contains(h)));
            // The hosts left out all had one score, and it was the lowest.
            let lowest = *ours.iter().min().unwrap();
            let left_out: Vec<i64> = full
                .iter()
                .filter(|(h, _)| !short.iter().any(|(s, _)| s == h))
                .map(|(_, s)| *s)
                .collect();
            prop_assert!(!left_out.is_empty());
            prop_assert!(left_out.iter().all(|s| *s == lowest));
        }

        /// Ties on the total: within a tie, the hosts with one extender score are all listed or
        /// all left out; and with the chart's weight (score steps of 2,000 against in-tree
        /// totals of at most 1,500) a tie never mixes listed and left-out hosts, so
        /// kube-scheduler's random tie-break covers exactly the ties it covered before, or
        /// none (all left out, its own order).
        #[test]
        fn ties_mix_listed_and_left_out_hosts_only_below_the_charts_weight(
            (in_tree, ours) in cluster(),
            weight in 1i64..=400,
        ) {
            let (names, full) = named(&ours);
            let after = kube_scheduler_totals(&in_tree, &names, &answer(&full), weight);
            let mut ties: HashMap<i64, Vec<usize>> = HashMap::new();
            for (i, (total, _)) in after.iter().enumerate() {
                ties.entry(*total).or_default().push(i);
            }
            for members in ties.values() {
                for &i in members {
                    for &j in members {
                        if ours[i] == ours[j] {
                            prop_assert_eq!(after[i].1, after[j].1);
                        } else if weight * 10 > 1500 {
                            prop_assert!(false, "a tie across extender scores at weight {}", weight);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_lowest_score_is_left_out_and_the_rest_shifted() {
        let full = |v: &[i64]| -> Vec<(String, i64)> {
            v.iter()
                .enumerate()
                .map(|(i, s)| (format!("n{i}"), *s))
                .collect()
        };
        // Most-allocated on a mostly empty cluster: the empty nodes (0) go.
        assert_eq!(
            answer(&full(&[0, 10, 0, 4, 0])),
            vec![("n1".into(), 10), ("n3".into(), 4)]
        );
        // Least-allocated: the empty nodes score 10 and are the common case; the lowest still
        // goes, and nothing is sent below 0 (the most common encoding sent n2 at -4).
        assert_eq!(
            answer(&full(&[10, 10, 6, 10])),
            vec![("n0".into(), 4), ("n1".into(), 4), ("n3".into(), 4)]
        );
        // The case the trust IV review caught: most hosts at 3, one at 1 (sent as -2 before).
        assert_eq!(
            answer(&full(&[3, 3, 1, 3, 9])),
            vec![
                ("n0".into(), 2),
                ("n1".into(), 2),
                ("n3".into(), 2),
                ("n4".into(), 8)
            ]
        );
        // All alike: nothing to say.
        assert!(answer(&full(&[7, 7, 7])).is_empty());
        assert!(answer(&[]).is_empty());
    }
}
