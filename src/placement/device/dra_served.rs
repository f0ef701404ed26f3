//! The one rule for a pod's managed requests that kube-scheduler may satisfy through DRA
//! (KEP-5004: a DeviceClass with `extendedResourceName` makes kube-scheduler serve that plain
//! request from ResourceSlices on nodes that do not advertise the name): [`dra_serves`], which
//! filter, its fast path, preempt and bind all ask before deciding devices. Pure: names in,
//! verdict out.

use crate::model::resource_names::ResourceNameSet;
use crate::placement::FitError;

/// Who serves a pod's device requests on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraServes {
    /// None of them: the extender decides as everywhere.
    Nothing,
    /// All of them: kube-scheduler allocates them from DRA with a claim of its own; the
    /// extender allocates no device for the pod here (its cpuset is still the extender's).
    Everything,
    /// Some (these): refused. One pod's devices are never split between two allocators that
    /// cannot see each other's choice (a joint GPU + RDMA request would lose its alignment,
    /// and a card could be held once by each).
    Part(ResourceNameSet),
}

/// `asked`: the managed names the pod's device request asks; `served_here`: those
/// kube-scheduler serves through DRA on this node (mapped by a DeviceClass, not advertised).
pub fn dra_serves(asked: ResourceNameSet, served_here: ResourceNameSet) -> DraServes {
    let dra = asked.and(served_here);
    if dra.is_empty() {
        DraServes::Nothing
    } else if dra == asked {
        DraServes::Everything
    } else {
        DraServes::Part(dra)
    }
}

/// The refusal of [`DraServes::Part`] (unresolvable: no preemption changes it).
pub fn split_error(dra: ResourceNameSet) -> FitError {
    FitError::new(crate::placement::FitReason::DraSplit(dra), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_or_nothing_per_node() {
        let gpu = ResourceNameSet::of(["nvidia.com/gpu"]);
        let gpu_rdma = ResourceNameSet::of(["nvidia.com/gpu", "koordinator.sh/rdma"]);
        assert_eq!(
            dra_serves(gpu, ResourceNameSet::default()),
            DraServes::Nothing
        );
        assert_eq!(dra_serves(gpu, gpu), DraServes::Everything);
        assert_eq!(dra_serves(gpu, gpu_rdma), DraServes::Everything);
        assert_eq!(dra_serves(gpu_rdma, gpu), DraServes::Part(gpu));
        let e = split_error(gpu);
        assert!(e.unresolvable);
        assert!(
            e.reason
                .to_string()
                .starts_with("kube-scheduler serves nvidia.com/gpu through DRA")
        );
    }
}
