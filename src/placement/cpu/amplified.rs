//! koordinator's CPU amplification check (`nodenumaresource/plugin.go` `filterAmplifiedCPUs`,
//! v1.7.0): on a node whose `node.koordinator.sh/resource-amplification-ratio` gives CPU a
//! ratio above 1, koord-manager has multiplied the Node's allocatable CPU by it, so plain pods
//! share more millicores than the machine has; a cpuset pod, which owns its CPUs, counts at its
//! CPUs × the ratio.
//!
//! Owns that arithmetic only: the node's figures are gathered by `cluster` (allocatable from
//! the Node, the pods' requests, the CPUs cpusets hold) and the ratio parsed by
//! `model::koord_cpu`. Pure; nothing here reads a ledger or a pod.

use crate::placement::{FitError, FitReason};

/// "node(s) invalid CPU amplification ratio": the ratio annotation does not parse (koordinator
/// answers UnschedulableAndUnresolvable).
pub const INVALID_RATIO: FitReason = FitReason::InvalidAmplificationRatio;
/// "Insufficient amplified cpu": koordinator's reason, verbatim.
pub const INSUFFICIENT: FitReason = FitReason::InsufficientAmplifiedCpu;

/// A CPU amplification ratio above 1 (koordinator's `extension.Ratio`); the only ratios that
/// change anything. Compared and hashed by its bits, so node facts holding it can be keys.
#[derive(Clone, Copy, Debug)]
pub struct Ratio(f64);

impl Ratio {
    /// `Some` for a finite ratio above 1; `None` for any other value, which koordinator treats
    /// as no amplification (`ratio <= 1`).
    pub fn above_one(ratio: f64) -> Option<Self> {
        (ratio.is_finite() && ratio > 1.0).then_some(Ratio(ratio))
    }

    pub fn get(self) -> f64 {
        self.0
    }

    /// koordinator's `extension.Amplify`: `ceil(origin × ratio)` in float64, as Go computes it
    /// (a result beyond i64 saturates: Rust's float-to-int `as` does).
    pub fn amplify(self, origin: i64) -> i64 {
        (origin as f64 * self.0).ceil() as i64
    }
}

impl PartialEq for Ratio {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for Ratio {}
impl std::hash::Hash for Ratio {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

/// What koordinator's `amplifyNUMANodeResources` multiplies (`nodenumaresource/util.go`,
/// v1.7.0): each NUMA node's cpu and memory by the Node's ratios for them, and, in what a NUMA
/// node has handed out, the CPUs cpusets hold there (`getAvailableNUMANodeResources`,
/// `node_allocation.go`). A cpuset pod's request counts amplified in the scores (it owns whole
/// CPUs), while its NUMA shares stay what it asked (koordinator splits the original request).
/// `Default` amplifies nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NumaAmplification {
    pub cpu: Option<Ratio>,
    pub memory: Option<Ratio>,
}

impl NumaAmplification {
    pub fn is_off(&self) -> bool {
        self.cpu.is_none() && self.memory.is_none()
    }

    /// A NUMA node's (or a cpuset pod's) millicores, amplified (`extension.Amplify`).
    pub fn cpu(&self, milli: i64) -> i64 {
        match self.cpu {
            Some(r) if milli != 0 => r.amplify(milli),
            _ => milli,
        }
    }

    /// A NUMA node's memory bytes, amplified.
    pub fn memory(&self, bytes: i64) -> i64 {
        match self.memory {
            Some(r) if bytes != 0 => r.amplify(bytes),
            _ => bytes,
        }
    }

    /// What a NUMA node has handed out, with the `cpuset_cpus` CPUs cpusets hold there counted
    /// at their amplified size: `used − c + amplify(c)`. Only when the shares cover those CPUs
    /// (every cpuset pod records its CPUs as NUMA shares; koordinator applies it to whatever it
    /// has recorded, which differs only while a cpuset has no recorded share), as the
    /// node-level check does.
    pub fn used_cpu(&self, used_milli: i64, cpuset_cpus: u16) -> i64 {
        let held = i64::from(cpuset_cpus) * 1000;
        match self.cpu {
            Some(r) if held > 0 && used_milli >= held => used_milli
                .saturating_sub(held)
                .saturating_add(r.amplify(held)),
            _ => used_milli,
        }
    }
}

/// A node's CPU as the amplification check sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Amplification {
    /// No ratio for CPU, or one of at most 1: nothing to check.
    Off,
    /// The ratio annotation does not parse: every pod with a CPU request is refused, unresolvably.
    Invalid,
    /// A ratio above 1 and what is left of the node's amplified allocatable.
    On(AmplifiedCpu),
}

/// The pod-independent half of the check, computed once per node change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AmplifiedCpu {
    pub ratio: Ratio,
    /// Allocatable millicores minus the requested ones, with the CPUs cpusets hold counted at
    /// their amplified size. May be negative.
    pub free_milli: i64,
}

impl AmplifiedCpu {
    /// koordinator's arithmetic: `allocatable_milli` is the Node's (already amplified)
    /// allocatable CPU, `requested_milli` the sum of its pods' CPU requests, `cpuset_cpus` the
    /// number of distinct CPUs cpusets hold there. When the requests cover those CPUs, their
    /// share of the requests is replaced by its amplified size (koordinator leaves the requests
    /// as they are otherwise, which only happens while its caches disagree).
    pub fn new(
        ratio: Ratio,
        allocatable_milli: i64,
        requested_milli: i64,
        cpuset_cpus: usize,
    ) -> Self {
        // Saturating throughout: the figures come from objects (a pod may request 10^15 CPUs,
        // a Node advertise as many), and a wrapped sum would turn a full node into a free one.
        let allocated = i64::try_from(cpuset_cpus)
            .unwrap_or(i64::MAX)
            .saturating_mul(1000);
        let requested = if allocated > 0 && requested_milli >= allocated {
            requested_milli
                .saturating_sub(allocated)
                .saturating_add(ratio.amplify(allocated))
        } else {
            requested_milli
        };
        AmplifiedCpu {
            ratio,
            free_milli: allocatable_milli.saturating_sub(requested),
        }
    }
}

impl Amplification {
    /// The check for a pod requesting `cpu_milli` millicores; `bound`: it gets a cpuset on this
    /// node (its own wish or the node's bind policy), so it counts amplified.
    pub fn check(&self, cpu_milli: i64, bound: bool) -> Result<(), FitError> {
        if cpu_milli <= 0 {
            return Ok(());
        }
        match self {
            Amplification::Off => Ok(()),
            Amplification::Invalid => Err(FitError::new(INVALID_RATIO, true)),
            Amplification::On(node) => {
                let request = if bound {
                    node.ratio.amplify(cpu_milli)
                } else {
                    cpu_milli
                };
                if request > node.free_milli {
                    Err(FitError::new(INSUFFICIENT, false))
                } else {
                    Ok(())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        /// Issue 36 §5: any figures an object can carry (quantities clamp to i64 millicores;
        /// any ratio, any cpuset size): a verdict, never a panic, and never a wrapped sum that
        /// turns a full node into a free one.
        #[test]
        fn any_figures_give_a_verdict_without_overflow(
            ratio in 1.000_001f64..1e12,
            allocatable in proptest::prelude::any::<i64>(),
            requested in proptest::prelude::any::<i64>(),
            cpus in proptest::prelude::any::<usize>(),
            pod in proptest::prelude::any::<i64>(),
            bound in proptest::prelude::any::<bool>(),
        ) {
            let ratio = Ratio::above_one(ratio).unwrap();
            let node = AmplifiedCpu::new(ratio, allocatable, requested, cpus);
            let verdict = Amplification::On(node).check(pod, bound);
            // Requests at least the allocatable leave no room: a positive pod never fits.
            if requested >= allocatable && requested >= 0 && cpus == 0 && pod > 0 {
                proptest::prop_assert!(verdict.is_err(), "{node:?}");
            }
        }
    }

    fn on(ratio: f64, allocatable: i64, requested: i64, cpuset_cpus: usize) -> Amplification {
        Amplification::On(AmplifiedCpu::new(
            Ratio::above_one(ratio).unwrap(),
            allocatable,
            requested,
            cpuset_cpus,
        ))
    }

    #[test]
    fn ratios_at_most_one_or_not_finite_change_nothing() {
        for r in [1.0, 0.5, 0.0, -2.0, f64::NAN, f64::INFINITY] {
            assert!(Ratio::above_one(r).is_none(), "{r}");
        }
        assert_eq!(Ratio::above_one(1.01).unwrap().amplify(1000), 1010);
    }

    /// koordinator's `Amplify`: ceil of the float product.
    #[test]
    fn amplify_rounds_up() {
        let r = Ratio::above_one(1.5).unwrap();
        assert_eq!(r.amplify(1000), 1500);
        assert_eq!(r.amplify(1), 2);
        assert_eq!(Ratio::above_one(1.33).unwrap().amplify(3000), 3990);
    }

    /// A node of 16 CPUs amplified 1.5× has 24,000m allocatable. A 4-CPU cpuset pod holds
    /// 4 physical CPUs = 6,000m amplified; plain pods request 10,000m.
    #[test]
    fn cpuset_holdings_count_amplified() {
        let node = on(1.5, 24_000, 14_000, 4);
        // requested = 14,000 − 4,000 + 6,000 = 16,000; free 8,000.
        assert_eq!(node.check(8_000, false), Ok(()));
        assert_eq!(node.check(8_001, false).unwrap_err().reason, INSUFFICIENT);
        // A new cpuset pod counts amplified too: 5 CPUs = 7,500m fits, 6 CPUs = 9,000m does not.
        assert_eq!(node.check(5_000, true), Ok(()));
        let err = node.check(6_000, true).unwrap_err();
        assert_eq!(err.reason, INSUFFICIENT);
        assert!(!err.unresolvable, "freeing CPU helps");
    }

    /// koordinator amplifies the cpuset share only when the requests cover it.
    #[test]
    fn requests_below_the_cpuset_share_stay_as_they_are() {
        let node = on(2.0, 10_000, 3_000, 4);
        assert_eq!(node.check(7_000, false), Ok(()));
        assert!(node.check(7_001, false).is_err());
    }

    #[test]
    fn zero_requests_pass_and_invalid_ratios_are_unresolvable() {
        assert_eq!(Amplification::Invalid.check(0, true), Ok(()));
        let err = Amplification::Invalid.check(100, false).unwrap_err();
        assert_eq!(err.reason, INVALID_RATIO);
        assert!(err.unresolvable);
        assert_eq!(on(2.0, 0, 0, 0).check(0, true), Ok(()));
        assert_eq!(Amplification::Off.check(1_000_000, true), Ok(()));
    }
}
