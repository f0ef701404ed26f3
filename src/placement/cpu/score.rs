//! CPU/NUMA scoring (koordinator `least_allocated.go` / `most_allocated.go`):
//! LeastAllocated or MostAllocated over cpu and memory, weighted, integer arithmetic, 0..=100.
//!
//! Owns the formula only. Callers choose what "allocatable" and "requested" are (the whole
//! node, the NUMA nodes of a hint).

use super::{CpuScoreStrategy, CpuScoring};
use crate::placement::arith::div;

/// One resource's amounts: what the scope can hold, what it already holds, what the pod adds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Amounts {
    pub allocatable: i64,
    pub requested: i64,
    pub pod: i64,
}

fn resource_score(strategy: CpuScoreStrategy, a: Amounts) -> i64 {
    if a.allocatable <= 0 {
        return 0;
    }
    let alloc = i128::from(a.allocatable);
    let used = i128::from(a.requested.max(0)) + i128::from(a.pod.max(0));
    let s = match strategy {
        CpuScoreStrategy::LeastAllocated => {
            if used > alloc {
                0
            } else {
                div((alloc - used) * 100, alloc)
            }
        }
        CpuScoreStrategy::MostAllocated => div(used.min(alloc) * 100, alloc),
    };
    // 0..=100 by construction.
    s as i64
}

/// `Σ w·s_r / Σ w` over cpu and memory, skipping a resource whose allocatable is zero (as
/// koordinator does) and treating a negative weight as zero.
pub fn score(
    scoring: &CpuScoring,
    strategy: CpuScoreStrategy,
    cpu: Amounts,
    memory: Amounts,
) -> i64 {
    let mut num = 0i128;
    let mut den = 0i128;
    for (w, a) in [(scoring.cpu_weight, cpu), (scoring.memory_weight, memory)] {
        let w = i128::from(w.max(0));
        if a.allocatable <= 0 || w == 0 {
            continue;
        }
        num += w * i128::from(resource_score(strategy, a));
        den += w;
    }
    if den == 0 {
        return 0;
    }
    div(num, den) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(allocatable: i64, requested: i64, pod: i64) -> Amounts {
        Amounts {
            allocatable,
            requested,
            pod,
        }
    }

    #[test]
    fn least_and_most_allocated() {
        let cfg = CpuScoring::default();
        // cpu: (8000-(2000+2000))*100/8000 = 50; memory: (4-1-1)*100/4 = 50.
        assert_eq!(
            score(
                &cfg,
                CpuScoreStrategy::LeastAllocated,
                a(8000, 2000, 2000),
                a(4, 1, 1)
            ),
            50
        );
        // MostAllocated: cpu 50, memory 100 (clamped) → 75.
        assert_eq!(
            score(
                &cfg,
                CpuScoreStrategy::MostAllocated,
                a(8000, 2000, 2000),
                a(4, 4, 1)
            ),
            75
        );
        // Over-committed LeastAllocated is 0, and a zero allocatable is skipped.
        assert_eq!(
            score(
                &cfg,
                CpuScoreStrategy::LeastAllocated,
                a(1000, 1000, 1000),
                a(0, 0, 0)
            ),
            0
        );
        let weighted = CpuScoring {
            cpu_weight: 3,
            memory_weight: 1,
            ..CpuScoring::default()
        };
        // (3*100 + 1*0)/4 = 75.
        assert_eq!(
            score(
                &weighted,
                CpuScoreStrategy::LeastAllocated,
                a(10, 0, 0),
                a(10, 10, 0)
            ),
            75
        );
        let none = CpuScoring {
            cpu_weight: 0,
            memory_weight: -1,
            ..CpuScoring::default()
        };
        assert_eq!(
            score(
                &none,
                CpuScoreStrategy::LeastAllocated,
                a(10, 0, 0),
                a(10, 0, 0)
            ),
            0
        );
    }
}
