//! kube-scheduler's NodeResourcesFit filter as the extender predicts it: the node's pod count,
//! and for each requested resource that `counted` says kube-scheduler checks, the node's
//! allocatable against the requests of the pods on it. `simulate` and `inspect --pod` play
//! kube-scheduler with it; `preempt` uses it to keep any victim set it proposes one that
//! kube-scheduler's own filter still passes (kube-scheduler v1.37 takes an extender's victims as
//! they are and re-checks nothing before it evicts them).
//!
//! Pure over a node's cached state: reads, never writes.

use crate::cluster::NodeState;
use crate::model::ids::PodUid;
use crate::model::quantity::Quantity;
use crate::model::requests::Requests;

/// Whether kube-scheduler's resource fit passes `requests` on `node` with `removed`'s pods gone
/// (preemption victims, pods a plan moves away); the reason it refuses, in its words, if not.
pub fn node_resources_fit(
    node: &NodeState,
    requests: &Requests,
    removed: &[PodUid],
    counted: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let Some(record) = &node.node else {
        return Err("node not found".into());
    };
    let allocatable = |name: &str| -> Quantity {
        record
            .allocatable
            .get(name)
            .and_then(|v| Quantity::parse(v).ok())
            .unwrap_or(Quantity::ZERO)
    };
    if record.allocatable.contains_key("pods") {
        let max = allocatable("pods").value();
        let pods = node.pods.keys().filter(|u| !removed.contains(u)).count();
        if i64::try_from(pods).unwrap_or(i64::MAX) >= max {
            return Err("Too many pods".into());
        }
    }
    for (name, want) in requests {
        if want.is_zero() || !counted(name) {
            continue;
        }
        let used: i128 = node
            .pods
            .values()
            .filter(|p| !removed.contains(&p.uid))
            .filter_map(|p| p.requests.get(name))
            .map(Quantity::milli)
            .sum();
        if used + want.milli() > allocatable(name).milli() {
            return Err(format!("Insufficient {name}"));
        }
    }
    Ok(())
}
