//! The one rule for a node without a koordinator `Device` object ([`deviceless_fit`]), which
//! filter, its fast path, preempt and bind all ask, and what capacity returns read of it
//! ([`offers_any`]). Pure: names in, verdict out.

use crate::model::resource_names::ResourceNameSet;
use crate::placement::{FitError, FitReason};

/// The one rule for a node without a `Device` object, in filter, its fast path, preempt and
/// bind alike (issue 36 §6):
/// - pods there still hold koordinator device allocations (`held`): its Device object is
///   missing (deleted, or not yet arrived) and nothing is allocatable until it is back, while
///   what those pods hold stays counted (koordinator #1186; resolvable);
/// - otherwise the node's device plugins own its devices (koordinator #1594), but only the
///   names its Node's `status.allocatable` offers (`advertised`): a pod asking for a name the
///   node does not advertise would be admitted by kubelet without that device (kube-scheduler
///   checks nothing for the koordinator share names it ignores), so it is refused here
///   (unresolvable: no preemption makes the node advertise it);
/// - no Node object in the cache yet (`advertised` is `None`): resolvable, it may arrive.
pub fn deviceless_fit(
    held: bool,
    advertised: Option<ResourceNameSet>,
    asked: ResourceNameSet,
) -> Result<(), FitError> {
    if held {
        return Err(FitError::new(FitReason::DeviceObjectMissing, false));
    }
    let Some(advertised) = advertised else {
        return Err(FitError::new(FitReason::NodeNotCached, false));
    };
    let missing = asked.without(advertised);
    if missing.is_empty() {
        return Ok(());
    }
    Err(FitError::new(FitReason::NotAdvertised(missing), true))
}

/// Whether some device pod can pass [`deviceless_fit`] on such a node: nothing held there, and
/// a Node that advertises a managed name.
pub fn offers_any(held: bool, advertised: Option<ResourceNameSet>) -> bool {
    !held && advertised.is_some_and(|a| !a.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deviceless_node_serves_only_what_it_advertises() {
        let asked =
            ResourceNameSet::of(["koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"]);
        let plugin = ResourceNameSet::of(["nvidia.com/gpu"]);
        let e = deviceless_fit(false, Some(plugin), asked).unwrap_err();
        assert!(e.unresolvable);
        assert_eq!(
            e.reason,
            "node has no Device object and does not advertise koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio"
        );
        let koord = ResourceNameSet::of([
            "koordinator.sh/gpu-core",
            "koordinator.sh/gpu-memory-ratio",
            "cpu",
        ]);
        assert_eq!(deviceless_fit(false, Some(koord), asked), Ok(()));
        // Holders without a Device object: missing, resolvable, whatever is advertised.
        let e = deviceless_fit(true, Some(koord), asked).unwrap_err();
        assert_eq!(
            (e.reason.text().as_ref(), e.unresolvable),
            ("device object missing", false)
        );
        // No Node object yet: resolvable.
        assert!(!deviceless_fit(false, None, asked).unwrap_err().unresolvable);
        assert!(!offers_any(false, Some(ResourceNameSet::default())));
        assert!(offers_any(false, Some(plugin)) && !offers_any(true, Some(plugin)));
    }
}
