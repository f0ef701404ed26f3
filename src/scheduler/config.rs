//! The scoring configuration (device and CPU halves) and its parsing from the command-line
//! flags, shared by `serve` and `simulate` so both decide with the scoring the deployment uses.

use crate::placement::cpu::{CpuBindPolicy, CpuScoring};
use crate::placement::device::score::{DeviceScoring, DeviceScoringError};

/// How a decision scores: devices (ranking minors in bind, prioritize's device score) and
/// CPUs (the accumulator's order, NUMA hints, prioritize's CPU score, the default bind
/// policy). One config for one decision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScoringConfig {
    pub device: DeviceScoring,
    pub cpu: CpuScoring,
}

/// The scoring flags' raw values (see `ops::args::ScoringArgs`).
#[derive(Clone, Copy, Debug)]
pub struct ScoringFlags<'a> {
    pub device_strategy: &'a str,
    pub device_weights: Option<&'a str>,
    /// `--fragmentation-mix`: the operator's workload mix (fragmentation strategy only).
    pub fragmentation_mix: Option<&'a str>,
    pub cpu_strategy: &'a str,
    pub numa_strategy: &'a str,
    pub cpu_weights: Option<&'a str>,
    pub default_cpu_bind_policy: &'a str,
}

impl ScoringFlags<'static> {
    /// The flags' defaults, as `serve` and `simulate` declare them (`ops::args::ScoringArgs`;
    /// a test there holds the two equal).
    pub const DEFAULT: ScoringFlags<'static> = ScoringFlags {
        device_strategy: "least-allocated",
        device_weights: None,
        fragmentation_mix: None,
        cpu_strategy: "least-allocated",
        numa_strategy: "least-allocated",
        cpu_weights: None,
        default_cpu_bind_policy: "FullPCPUs",
    };
}

/// Why the scoring flags are invalid.
#[derive(Debug, thiserror::Error)]
pub enum ScoringError {
    #[error(transparent)]
    Device(#[from] DeviceScoringError),
    #[error(transparent)]
    Cpu(#[from] CpuScoringError),
}

impl ScoringConfig {
    /// From the flags' values; the first invalid one is the error.
    pub fn from_flags(flags: &ScoringFlags<'_>) -> Result<Self, ScoringError> {
        Ok(ScoringConfig {
            device: DeviceScoring::from_flags(flags.device_strategy, flags.device_weights)?
                .with_fixed_mix(flags.fragmentation_mix)?,
            cpu: cpu_scoring_from_flags(
                flags.cpu_strategy,
                flags.numa_strategy,
                flags.cpu_weights,
                flags.default_cpu_bind_policy,
            )?,
        })
    }
}

/// Why the CPU scoring flags are invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuScoringError {
    #[error("unknown CPU scoring strategy {0:?}: expected least-allocated or most-allocated")]
    Strategy(String),
    #[error("invalid CPU score weight {entry:?}: expected cpu=N,memory=N with N >= 0")]
    Weight { entry: String },
    #[error("CPU score weights must not all be zero")]
    NoWeights,
    #[error("unknown default CPU bind policy {0:?}: expected FullPCPUs or SpreadByPCPUs")]
    BindPolicy(String),
}

/// The CPU scoring configuration from the `--cpu-score-*`, `--numa-score-strategy` and
/// `--default-cpu-bind-policy` flags.
pub fn cpu_scoring_from_flags(
    node_strategy: &str,
    numa_strategy: &str,
    weights: Option<&str>,
    default_bind_policy: &str,
) -> Result<CpuScoring, CpuScoringError> {
    use crate::placement::cpu::CpuScoreStrategy;
    let strategy = |s: &str| match s.trim() {
        "least-allocated" | "LeastAllocated" => Ok(CpuScoreStrategy::LeastAllocated),
        "most-allocated" | "MostAllocated" => Ok(CpuScoreStrategy::MostAllocated),
        other => Err(CpuScoringError::Strategy(other.to_string())),
    };
    let mut out = CpuScoring {
        node_strategy: strategy(node_strategy)?,
        numa_strategy: strategy(numa_strategy)?,
        ..CpuScoring::default()
    };
    if let Some(w) = weights {
        for entry in w.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || CpuScoringError::Weight {
                entry: entry.to_string(),
            };
            let (name, value) = entry.split_once('=').ok_or_else(bad)?;
            let value: i64 = value.trim().parse().map_err(|_| bad())?;
            if value < 0 {
                return Err(bad());
            }
            match name.trim() {
                "cpu" => out.cpu_weight = value,
                "memory" => out.memory_weight = value,
                _ => return Err(bad()),
            }
        }
        if out.cpu_weight == 0 && out.memory_weight == 0 {
            return Err(CpuScoringError::NoWeights);
        }
    }
    out.default_bind_policy = match default_bind_policy.trim() {
        "FullPCPUs" => CpuBindPolicy::FullPcpus,
        "SpreadByPCPUs" => CpuBindPolicy::SpreadByPcpus,
        other => return Err(CpuScoringError::BindPolicy(other.to_string())),
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::cpu::CpuScoreStrategy;

    #[test]
    fn cpu_scoring_flags() {
        let s = cpu_scoring_from_flags(
            "most-allocated",
            "least-allocated",
            Some("cpu=2,memory=0"),
            "SpreadByPCPUs",
        )
        .unwrap();
        assert_eq!(s.node_strategy, CpuScoreStrategy::MostAllocated);
        assert_eq!((s.cpu_weight, s.memory_weight), (2, 0));
        assert_eq!(s.default_bind_policy, CpuBindPolicy::SpreadByPcpus);
        for (a, b, w, p) in [
            ("x", "least-allocated", None, "FullPCPUs"),
            (
                "least-allocated",
                "least-allocated",
                Some("gpu=1"),
                "FullPCPUs",
            ),
            (
                "least-allocated",
                "least-allocated",
                Some("cpu=-1"),
                "FullPCPUs",
            ),
            (
                "least-allocated",
                "least-allocated",
                Some("cpu=0,memory=0"),
                "FullPCPUs",
            ),
            ("least-allocated", "least-allocated", None, "Default"),
        ] {
            assert!(
                cpu_scoring_from_flags(a, b, w, p).is_err(),
                "{a} {b} {w:?} {p}"
            );
        }
    }
}
