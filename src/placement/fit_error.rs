//! Why a pod does not fit a node: one error for the device and the CPU/NUMA halves, so the
//! scheduler passes either on unchanged.

use std::borrow::Cow;

/// Why a pod does not fit a node (its devices or its CPUs/NUMA nodes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct FitError {
    /// Short and categorical ("insufficient gpu devices", "insufficient cpus on one NUMA
    /// node"), suitable for FailedNodes. Static for every fixed reason, so rejecting a node (or
    /// repeating a memoized verdict) does not allocate.
    pub reason: Cow<'static, str>,
    /// True when freeing resources can never help (no such devices, too few in total, no
    /// topology, policy conflict, SMT misalignment, a request larger than any NUMA node).
    pub unresolvable: bool,
}
