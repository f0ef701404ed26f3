//! What prioritize sends: the scores relative to the most common one, and only the hosts
//! whose score differs from it.
//!
//! kube-scheduler v1.37 (`schedule_one.go`, `prioritizeNodes`) adds `score × weight × 10` to
//! the total of each host the extender lists and nothing to a host it leaves out; it never
//! checks the range. Subtracting one constant from every host's score therefore changes no
//! difference between two totals: the ranking and the sets of tied nodes are the same. So the
//! answer subtracts the most common score and leaves out every host that had it: on a large
//! cluster most nodes score alike (empty nodes under either strategy), and kube-scheduler then
//! encodes, sends and decodes a few entries instead of one per candidate. Scores below the
//! most common one become negative, which kube-scheduler adds like any other.
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

use std::collections::BTreeMap;

use crate::model::wire::HostPriority;

/// The most common score (the lowest of those equally common: the answer then stays
/// non-negative whenever the lowest score is among them). `None` for no hosts.
fn most_common(scores: impl Iterator<Item = i64>) -> Option<i64> {
    // Prioritize's scores are 0..=10: counted in an array, anything else in a map.
    let mut in_range = [0usize; 11];
    let mut others: BTreeMap<i64, usize> = BTreeMap::new();
    for s in scores {
        match usize::try_from(s).ok().filter(|i| *i < in_range.len()) {
            Some(i) => in_range[i] += 1,
            None => *others.entry(s).or_default() += 1,
        }
    }
    let counted = (0i64..).zip(in_range).filter(|&(_, n)| n > 0);
    let mut all: Vec<(i64, usize)> = counted.chain(others).collect();
    all.sort_unstable_by_key(|&(score, _)| score);
    // Ascending scores: `max_by_key` keeps the last of equal counts, so compare reversed.
    all.into_iter()
        .rev()
        .max_by_key(|&(_, n)| n)
        .map(|(score, _)| score)
}

/// The answer kube-scheduler reads the same way as `scores`: each host whose score differs
/// from the most common one, with that score subtracted, in the order given.
pub fn relative_to_most_common(mut scores: Vec<HostPriority<'_>>) -> Vec<HostPriority<'_>> {
    let Some(common) = most_common(scores.iter().map(|h| h.score)) else {
        return scores;
    };
    // In place: when most scores differ (CPU-scored pods), the list is barely shorter, and a
    // second list of thousands of hosts would cost more than the pass itself.
    scores.retain_mut(|h| {
        h.score -= common;
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
        relative_to_most_common(hosts)
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

    /// Nodes with an in-tree total (the v1.37 default plugins' at most 1,500) and our score, mostly
    /// 0..=10 (what prioritize answers), sometimes outside it (the function must not care).
    fn cluster() -> impl Strategy<Value = (Vec<i64>, Vec<i64>)> {
        (1usize..60).prop_flat_map(|n| {
            (
                prop::collection::vec(0i64..=1500, n),
                // Few distinct values, as a real cluster has: many repeats.
                prop::collection::vec(prop_oneof![Just(0i64), Just(10), 0i64..=10, -20i64..=30], n),
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
            // Only hosts that were asked about, each at most once, none at the common score.
            prop_assert!(short.len() <= full.len());
            prop_assert!(short.iter().all(|(h, s)| *s != 0 && names.contains(h)));
            // The hosts left out all had one score, and it was the most common one.
            let left_out: Vec<i64> = full
                .iter()
                .filter(|(h, _)| !short.iter().any(|(s, _)| s == h))
                .map(|(_, s)| *s)
                .collect();
            if let Some(first) = left_out.first() {
                prop_assert!(left_out.iter().all(|s| s == first));
                let count = |v: i64| ours.iter().filter(|s| **s == v).count();
                prop_assert!(ours.iter().all(|s| count(*s) <= count(*first)));
            }
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
    fn the_most_common_score_is_left_out_and_the_rest_shifted() {
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
        // Least-allocated: the empty nodes score 10 and are the common case.
        assert_eq!(answer(&full(&[10, 10, 6, 10])), vec![("n2".into(), -4)]);
        // Equally common: the lower one goes (the answer stays non-negative).
        assert_eq!(answer(&full(&[10, 0])), vec![("n0".into(), 10)]);
        // Out of the usual range (counted apart), and ties across both: the lowest goes.
        assert_eq!(
            answer(&full(&[-3, 12, 12, -3, 5])),
            vec![("n1".into(), 15), ("n2".into(), 15), ("n4".into(), 8)]
        );
        // All alike: nothing to say.
        assert!(answer(&full(&[7, 7, 7])).is_empty());
        assert!(answer(&[]).is_empty());
    }
}
