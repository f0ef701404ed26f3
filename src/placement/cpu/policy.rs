//! Node × pod policy resolution (koordinator nodenumaresource `PreFilter`/`Filter`): which bind policy, which NUMA policy and
//! which exclusivity apply to one pod on one node, or why the pair can never work.
//!
//! Owns only the resolution rules and their categorical reasons. It must not look at free CPUs
//! or NUMA usage: everything it rejects is unresolvable (freeing pods cannot change a policy).

use super::{
    CpuBindPolicy, CpuExclusivePolicy, FitError, NodeCpuBindPolicy, NumaExclusive, NumaPolicy,
    PodCpuRequest,
};
use crate::placement::FitReason;

/// How the pod's cpuset is to be chosen on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpusetPlan {
    pub policy: CpuBindPolicy,
    /// The policy is a constraint (pod `requiredCPUBindPolicy` or a node-forced policy).
    pub required: bool,
    pub exclusive: CpuExclusivePolicy,
    /// Whole CPUs wanted.
    pub cpus: usize,
}

/// The resolved CPU/NUMA demands of one pod on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub cpuset: Option<CpusetPlan>,
    pub numa_policy: NumaPolicy,
    /// `singleNUMANodeExclusive` is Required (after the `Unset` default).
    pub exclusive_required: bool,
}

fn bind_name(p: CpuBindPolicy) -> &'static str {
    match p {
        CpuBindPolicy::FullPcpus => "FullPCPUs",
        CpuBindPolicy::SpreadByPcpus => "SpreadByPCPUs",
    }
}

fn node_bind_name(p: NodeCpuBindPolicy) -> &'static str {
    match p {
        NodeCpuBindPolicy::None => "None",
        NodeCpuBindPolicy::FullPcpusOnly => "FullPCPUsOnly",
        NodeCpuBindPolicy::SpreadByPcpus => "SpreadByPCPUs",
    }
}

pub(crate) fn numa_name(p: NumaPolicy) -> &'static str {
    match p {
        NumaPolicy::None => "None",
        NumaPolicy::BestEffort => "BestEffort",
        NumaPolicy::Restricted => "Restricted",
        NumaPolicy::SingleNumaNode => "SingleNUMANode",
    }
}

fn unresolvable(reason: FitReason) -> FitError {
    FitError::new(reason, true)
}

/// Resolves `req` against a node's forced bind policy, NUMA policy and threads per core.
///
/// `Ok(None)`: nothing CPU/NUMA-related to decide (no cpuset, and no NUMA policy or nothing the
/// NUMA policy could place). `has_devices` keeps a NUMA-policy pod with only devices in play,
/// so its devices still get a NUMA affinity.
pub fn resolve(
    node_bind: NodeCpuBindPolicy,
    node_numa: NumaPolicy,
    cpus_per_core: usize,
    req: &PodCpuRequest,
    has_devices: bool,
) -> Result<Option<Resolved>, FitError> {
    let forced = match node_bind {
        NodeCpuBindPolicy::None => None,
        NodeCpuBindPolicy::FullPcpusOnly => Some(CpuBindPolicy::FullPcpus),
        NodeCpuBindPolicy::SpreadByPcpus => Some(CpuBindPolicy::SpreadByPcpus),
    };
    let mut cpuset = None;
    let wanted = match (forced, req.cpuset) {
        _ if req.cpu_milli <= 0 => None,
        (None, None) => None,
        (Some(f), Some(w)) if w.required && w.policy != f => {
            return Err(unresolvable(FitReason::CpuBindPolicyConflict {
                pod: bind_name(w.policy),
                node: node_bind_name(node_bind),
            }));
        }
        // A node-forced policy overrides a pod's mere preference (koordinator #1453: a
        // FullPCPUs-preferring pod on a SpreadByPCPUs node is spread, by design).
        (Some(f), _) => Some((f, true)),
        (None, Some(w)) => Some((w.policy, w.required)),
    };
    if let Some((policy, required)) = wanted {
        if req.cpu_milli % 1000 != 0 {
            return Err(unresolvable(FitReason::FractionalCpu {
                node_binds: forced.is_some(),
            }));
        }
        let exclusive = req.cpuset.map(|w| w.exclusive).unwrap_or_default();
        let cpus = usize::try_from(req.cpu_milli / 1000).unwrap_or(usize::MAX);
        if required && policy == CpuBindPolicy::FullPcpus && cpus % cpus_per_core.max(1) != 0 {
            return Err(unresolvable(FitReason::CpusNotWholeCores));
        }
        cpuset = Some(CpusetPlan {
            policy,
            required,
            exclusive,
            cpus,
        });
    }
    let numa_policy = match (req.numa_policy, node_numa) {
        (NumaPolicy::None, n) => n,
        (p, NumaPolicy::None) => p,
        (p, n) if p == n => p,
        (p, n) => {
            return Err(unresolvable(FitReason::NumaPolicyConflict {
                pod: numa_name(p),
                node: numa_name(n),
            }));
        }
    };
    let exclusive_required = match req.numa_exclusive {
        NumaExclusive::Required => true,
        NumaExclusive::Preferred => false,
        NumaExclusive::Unset => req.numa_policy != NumaPolicy::None,
    };
    let numa_has_work = numa_policy != NumaPolicy::None
        && (req.cpu_milli > 0 || req.memory_bytes > 0 || has_devices);
    if cpuset.is_none() && !numa_has_work {
        return Ok(None);
    }
    Ok(Some(Resolved {
        cpuset,
        numa_policy,
        exclusive_required,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::cpu::CpusetWish;

    fn wish(policy: CpuBindPolicy, required: bool) -> Option<CpusetWish> {
        Some(CpusetWish {
            policy,
            required,
            exclusive: CpuExclusivePolicy::None,
        })
    }

    fn req(cpu_milli: i64) -> PodCpuRequest {
        PodCpuRequest {
            cpu_milli,
            memory_bytes: 1 << 30,
            ..Default::default()
        }
    }

    #[test]
    fn plain_pod_on_plain_node_has_nothing_to_do() {
        let r = resolve(
            NodeCpuBindPolicy::None,
            NumaPolicy::None,
            2,
            &req(1500),
            true,
        );
        assert_eq!(r, Ok(None));
    }

    #[test]
    fn node_forced_policy_applies_to_any_cpu_request() {
        let r = resolve(
            NodeCpuBindPolicy::FullPcpusOnly,
            NumaPolicy::None,
            2,
            &req(4000),
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            r.cpuset,
            Some(CpusetPlan {
                policy: CpuBindPolicy::FullPcpus,
                required: true,
                exclusive: CpuExclusivePolicy::None,
                cpus: 4
            })
        );
        let e = resolve(
            NodeCpuBindPolicy::SpreadByPcpus,
            NumaPolicy::None,
            2,
            &req(500),
            false,
        )
        .unwrap_err();
        assert!(e.unresolvable);
        assert_eq!(e.reason, "fractional cpu request on a node that binds cpus");
    }

    #[test]
    fn required_policy_must_match_the_forced_one() {
        let mut r = req(4000);
        r.cpuset = wish(CpuBindPolicy::SpreadByPcpus, true);
        let e = resolve(
            NodeCpuBindPolicy::FullPcpusOnly,
            NumaPolicy::None,
            2,
            &r,
            false,
        )
        .unwrap_err();
        assert_eq!(
            e.reason,
            "cpu bind policy conflict: pod SpreadByPCPUs, node FullPCPUsOnly"
        );
        assert!(e.unresolvable);
        // A preference yields to the node (koordinator #1890/#1891 rejected this; we do not).
        r.cpuset = wish(CpuBindPolicy::SpreadByPcpus, false);
        let ok = resolve(
            NodeCpuBindPolicy::FullPcpusOnly,
            NumaPolicy::None,
            2,
            &r,
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(ok.cpuset.map(|c| c.policy), Some(CpuBindPolicy::FullPcpus));
    }

    #[test]
    fn smt_alignment_only_binds_required_full_pcpus() {
        let mut r = req(3000);
        r.cpuset = wish(CpuBindPolicy::FullPcpus, true);
        let e = resolve(NodeCpuBindPolicy::None, NumaPolicy::None, 2, &r, false).unwrap_err();
        assert_eq!(e.reason, "cpu count not a multiple of threads per core");
        r.cpuset = wish(CpuBindPolicy::FullPcpus, false);
        assert!(resolve(NodeCpuBindPolicy::None, NumaPolicy::None, 2, &r, false).is_ok());
        r.cpuset = wish(CpuBindPolicy::FullPcpus, true);
        assert!(resolve(NodeCpuBindPolicy::None, NumaPolicy::None, 1, &r, false).is_ok());
    }

    #[test]
    fn numa_policies_merge_or_conflict() {
        let mut r = req(2000);
        r.numa_policy = NumaPolicy::SingleNumaNode;
        let e = resolve(
            NodeCpuBindPolicy::None,
            NumaPolicy::Restricted,
            2,
            &r,
            false,
        )
        .unwrap_err();
        assert_eq!(
            e.reason,
            "numa topology policy conflict: pod SingleNUMANode, node Restricted"
        );
        let ok = resolve(NodeCpuBindPolicy::None, NumaPolicy::None, 2, &r, false)
            .unwrap()
            .unwrap();
        assert_eq!(ok.numa_policy, NumaPolicy::SingleNumaNode);
        // The pod set the policy, so exclusivity defaults to Required.
        assert!(ok.exclusive_required);
        let node_only = resolve(
            NodeCpuBindPolicy::None,
            NumaPolicy::Restricted,
            2,
            &req(2000),
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(node_only.numa_policy, NumaPolicy::Restricted);
        assert!(!node_only.exclusive_required);
        assert_eq!(node_only.cpuset, None);
        r.numa_exclusive = NumaExclusive::Preferred;
        let pref = resolve(NodeCpuBindPolicy::None, NumaPolicy::None, 2, &r, false)
            .unwrap()
            .unwrap();
        assert!(!pref.exclusive_required);
    }

    #[test]
    fn numa_policy_with_nothing_to_place_is_nothing_to_do_unless_devices() {
        let r = PodCpuRequest::default();
        assert_eq!(
            resolve(
                NodeCpuBindPolicy::None,
                NumaPolicy::SingleNumaNode,
                2,
                &r,
                false
            ),
            Ok(None)
        );
        assert!(
            resolve(
                NodeCpuBindPolicy::None,
                NumaPolicy::SingleNumaNode,
                2,
                &r,
                true
            )
            .unwrap()
            .is_some()
        );
    }
}
