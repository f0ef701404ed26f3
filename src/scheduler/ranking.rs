//! Where the extender's ranking reaches kube-scheduler (`--ranking`): in prioritize, as scores
//! it weighs against its own, or in filter, which then passes only the fitting nodes that score
//! best and leaves kube-scheduler's own scores to choose among them.
//!
//! Why filter can carry the ranking: kube-scheduler v1.37 (`schedule_one.go`,
//! `prioritizeNodes`) adds `score × weight × 10` to each host's in-tree total (every score
//! plugin normalized to 0..=100, times its weight) and takes a host with the highest total
//! (`framework/sorted_nodes.go`). When one point of ours outweighs any in-tree total (weight
//! × 10 > 100 × the sum of the score plugins' weights: the chart's 200 against the v1.37
//! defaults' 15, so 2,000 > 1,500), only hosts with our best score can win, and among them our
//! score adds one constant. Passing only those hosts and sending no score leaves kube-scheduler
//! the same contest, and it costs less:
//! - one host left: kube-scheduler takes it without scoring (`schedulePod`, "only one node
//!   after predicate");
//! - its score plugins run on our best hosts only;
//! - no prioritize call at all (the chart drops `prioritizeVerb`): one HTTP round trip per pod,
//!   the pod and every candidate's name encoded once instead of twice.
//!
//! What differs, and why it is the intent anyway:
//! - In-tree plugins that normalize over the scored hosts (NodeAffinity's and InterPodAffinity's
//!   preferences, TaintToleration's PreferNoSchedule, PodTopologySpread's soft spread) normalize
//!   over our best hosts instead of every fitting one, so where those preferences are not flat
//!   they may break our tie differently. kube-scheduler varies that set every cycle itself
//!   (`percentageOfNodesToScore`, its rotating start index); the property tests below show the
//!   choice is the same whenever the normalizing plugins are flat, and always one of our best.
//! - Exact ties on the total break at random, as before or better: for an extender without a
//!   `prioritizeVerb`, `HTTPExtender.Prioritize` lists every host with score 0, so kube-scheduler
//!   draws its `Randomizer` for each (the relative prioritize answer leaves the lowest
//!   score out, and those hosts tie in the heap's order).
//! - With a weight that does not dominate, prioritize lets in-tree scores pick a host we rank
//!   lower; filter never does: our ranking always comes first (the chart's stated intent).
//! - A filtering extender chained after this one sees only our best hosts.
//!
//! Must not score anything: it keeps what prioritize's own scores say is best
//! (`verbs::scores`).

/// Where the ranking goes (`--ranking`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Ranking {
    /// Filter passes every fitting node; prioritize scores them (kube-scheduler weighs the
    /// scores by the stanza's `weight`).
    #[default]
    Prioritize,
    /// Filter passes only the fitting nodes prioritize would score best; the stanza needs no
    /// `prioritizeVerb`.
    Filter,
}

/// Keeps the items whose score is the best of `scores` (one score per item, in order) and
/// returns how many it removed.
pub fn retain_best<T>(items: &mut Vec<T>, scores: &[i64]) -> usize {
    debug_assert_eq!(items.len(), scores.len());
    let Some(best) = scores.iter().copied().max() else {
        return 0;
    };
    let before = items.len();
    let mut score = scores.iter();
    items.retain(|_| score.next() == Some(&best));
    before - items.len()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    const MAX_NODE_SCORE: i64 = 100;
    const MAX_EXTENDER_PRIORITY: i64 = 10;

    /// One in-tree score plugin's raw scores for every fitting node, and its weight.
    #[derive(Clone, Debug)]
    struct Plugin {
        weight: i64,
        raw: Vec<i64>,
        /// Normalized over the hosts scored, as `helper.DefaultNormalizeScore` does
        /// (NodeAffinity, TaintToleration with `reverse`); else already 0..=100 per node
        /// (NodeResourcesFit, BalancedAllocation, ImageLocality).
        normalizes: Option<Reverse>,
    }

    #[derive(Clone, Copy, Debug)]
    struct Reverse(bool);

    /// `helper.DefaultNormalizeScore(MaxNodeScore, reverse, scores)`, written from
    /// `pkg/scheduler/framework/plugins/helper/normalize_score.go`.
    fn default_normalize(scores: &mut [i64], reverse: bool) {
        let max = scores.iter().copied().max().unwrap_or(0);
        if max == 0 {
            if reverse {
                scores.iter_mut().for_each(|s| *s = MAX_NODE_SCORE);
            }
            return;
        }
        for s in scores.iter_mut() {
            *s = MAX_NODE_SCORE * *s / max;
            if reverse {
                *s = MAX_NODE_SCORE - *s;
            }
        }
    }

    /// The hosts (indices into the fitting nodes) kube-scheduler v1.37 may choose for a pod
    /// whose feasible hosts after every extender's filter are `feasible`: one host is taken as
    /// it is (`schedulePod`); otherwise each score plugin scores the feasible hosts (normalized
    /// over them), the extender's answer (`answer`: host index and score) adds `score × weight ×
    /// 10`, and the hosts with the highest total tie (its heap breaks the tie).
    fn kube_scheduler_choices(
        feasible: &[usize],
        plugins: &[Plugin],
        answer: Option<&[(usize, i64)]>,
        weight: i64,
    ) -> BTreeSet<usize> {
        if feasible.len() <= 1 {
            return feasible.iter().copied().collect();
        }
        let mut totals = vec![0i64; feasible.len()];
        for p in plugins {
            let mut scores: Vec<i64> = feasible.iter().map(|&i| p.raw[i]).collect();
            if let Some(Reverse(reverse)) = p.normalizes {
                default_normalize(&mut scores, reverse);
            }
            for (t, s) in totals.iter_mut().zip(scores) {
                *t += s * p.weight;
            }
        }
        for &(host, score) in answer.unwrap_or_default() {
            if let Some(k) = feasible.iter().position(|&i| i == host) {
                totals[k] += score * weight * (MAX_NODE_SCORE / MAX_EXTENDER_PRIORITY);
            }
        }
        let best = totals.iter().copied().max();
        feasible
            .iter()
            .zip(&totals)
            .filter(|&(_, t)| Some(*t) == best)
            .map(|(&i, _)| i)
            .collect()
    }

    /// Prioritize mode: every fitting node passes; the answer is prioritize's, relative (what
    /// the HTTP handler sends, `relative::relative_to_lowest`).
    fn prioritize_mode(ours: &[i64], plugins: &[Plugin], weight: i64) -> BTreeSet<usize> {
        use std::borrow::Cow;
        let feasible: Vec<usize> = (0..ours.len()).collect();
        let names: Vec<String> = feasible.iter().map(|i| i.to_string()).collect();
        let full = names
            .iter()
            .zip(ours)
            .map(|(n, s)| crate::model::wire::HostPriority {
                host: Cow::Borrowed(n.as_str()),
                score: *s,
            })
            .collect();
        let answer: Vec<(usize, i64)> = super::super::relative::relative_to_lowest(full)
            .into_iter()
            .map(|h| (h.host.parse().unwrap(), h.score))
            .collect();
        kube_scheduler_choices(&feasible, plugins, Some(&answer), weight)
    }

    /// Filter mode: only the best pass; no prioritize call.
    fn filter_mode(ours: &[i64], plugins: &[Plugin]) -> BTreeSet<usize> {
        let mut feasible: Vec<usize> = (0..ours.len()).collect();
        retain_best(&mut feasible, ours);
        kube_scheduler_choices(&feasible, plugins, None, 0)
    }

    /// The v1.37 default score plugins' weights (`default_plugins.go`, VolumeBinding's
    /// defaulted 1): TaintToleration 3, NodeAffinity 2, NodeResourcesFit 1, PodTopologySpread 2,
    /// InterPodAffinity 2, BalancedAllocation 1, ImageLocality 1, DynamicResources 2,
    /// VolumeBinding 1 (sum 15).
    const DEFAULT_WEIGHTS: [i64; 9] = [3, 2, 1, 2, 2, 1, 1, 2, 1];

    /// A cluster of `n` fitting nodes: our scores (0..=10, few distinct values, as prioritize's
    /// normalized answers are) and the default plugins' raw scores; `flat` makes the
    /// normalizing plugins (the first two: TaintToleration reversed, NodeAffinity) score every
    /// node alike.
    fn cluster(flat: bool) -> impl Strategy<Value = (Vec<i64>, Vec<Plugin>)> {
        (1usize..40).prop_flat_map(move |n| {
            let ours = prop::collection::vec(prop_oneof![Just(10i64), Just(0), 0i64..=10], n);
            let raws = prop::collection::vec(prop::collection::vec(0i64..=100, n), 9);
            let flat_raws = prop::collection::vec(0i64..=5, 2);
            (ours, raws, flat_raws).prop_map(move |(ours, raws, flat_raws)| {
                let plugins = raws
                    .into_iter()
                    .enumerate()
                    .map(|(k, raw)| {
                        let normalizes = match k {
                            0 => Some(Reverse(true)),
                            1 => Some(Reverse(false)),
                            _ => None,
                        };
                        let raw = if flat && k < 2 {
                            vec![flat_raws[k]; raw.len()]
                        } else {
                            raw
                        };
                        Plugin {
                            weight: DEFAULT_WEIGHTS[k],
                            raw,
                            normalizes,
                        }
                    })
                    .collect();
                (ours, plugins)
            })
        })
    }

    proptest! {
        /// With the chart's weight over the default plugins, and the normalizing plugins flat:
        /// kube-scheduler may choose exactly the same hosts in both modes.
        #[test]
        fn filter_ranking_leaves_kube_scheduler_the_same_choice((ours, plugins) in cluster(true)) {
            prop_assert_eq!(filter_mode(&ours, &plugins), prioritize_mode(&ours, &plugins, 200));
        }

        /// Whatever the in-tree scores: every host filter mode may choose has our best score
        /// and the highest in-tree total among those hosts (normalized over them); prioritize
        /// mode at the chart's weight also chooses only hosts with our best score.
        #[test]
        fn filter_ranking_always_chooses_among_our_best((ours, plugins) in cluster(false)) {
            let best = *ours.iter().max().unwrap();
            let chosen = filter_mode(&ours, &plugins);
            prop_assert!(!chosen.is_empty());
            prop_assert!(chosen.iter().all(|&i| ours[i] == best));
            let by_prioritize = prioritize_mode(&ours, &plugins, 200);
            prop_assert!(by_prioritize.iter().all(|&i| ours[i] == best));
        }
    }

    #[test]
    fn retain_best_keeps_the_highest_scores_in_order() {
        let mut names = vec!["a", "b", "c", "d", "e"];
        assert_eq!(retain_best(&mut names, &[3, 10, 7, 10, 0]), 3);
        assert_eq!(names, ["b", "d"]);
        let mut alike = vec!["a", "b"];
        assert_eq!(retain_best(&mut alike, &[4, 4]), 0);
        assert_eq!(alike, ["a", "b"]);
        let mut none: Vec<&str> = Vec::new();
        assert_eq!(retain_best(&mut none, &[]), 0);
    }

    /// The two conditions the equivalence needs, each shown necessary by a counterexample
    /// kube-scheduler's combination produces.
    #[test]
    fn the_choice_differs_below_the_dominating_weight_or_with_normalizing_preferences() {
        let absolute = |raw: Vec<i64>| Plugin {
            weight: 1,
            raw,
            normalizes: None,
        };
        // Weight 10 (one point = 100): node 1's in-tree 200 beats our one-point lead of node 0
        // in prioritize mode; filter mode keeps our ranking.
        let ours = [10, 9];
        let plugins = [Plugin {
            weight: 2,
            ..absolute(vec![0, 100])
        }];
        assert_eq!(prioritize_mode(&ours, &plugins, 10), BTreeSet::from([1]));
        assert_eq!(filter_mode(&ours, &plugins), BTreeSet::from([0]));
        assert_eq!(prioritize_mode(&ours, &plugins, 200), BTreeSet::from([0]));
        // A preference normalized over the hosts scored: node 2 (not among our best) holds the
        // maximum, so over every fitting node nodes 0 and 1 get 10 and 0; over our best alone
        // 100 and 0, which outweighs the absolute plugin's 50-point lead of node 1.
        let ours = [10, 10, 5];
        let plugins = [
            Plugin {
                weight: 1,
                raw: vec![1, 0, 10],
                normalizes: Some(Reverse(false)),
            },
            absolute(vec![0, 50, 0]),
        ];
        assert_eq!(prioritize_mode(&ours, &plugins, 200), BTreeSet::from([1]));
        assert_eq!(filter_mode(&ours, &plugins), BTreeSet::from([0]));
    }
}
