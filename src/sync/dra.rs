//! The DRA kinds' handlers: decode ResourceSlices, ResourceClaims and DeviceClasses into the
//! records `cluster::dra` joins, report what cannot be used, and apply them to the caches.
//! A DeviceClass that moves a managed resource name to DRA (KEP-5004) is reported here too:
//! a metric, a log line naming it, and `/readyz` failing unless the split is intended
//! (`--allow-dra-extended-resources`).

use std::sync::Arc;

use super::kind::Kind;
use super::readiness::Readiness;
use super::store::{Decoded, Handler, Invalid};
use crate::cluster::ClusterState;
use crate::cluster::dra::{ClaimRecord, DraProblem, RULE_NAME_PREFIX, RuleRecord, SliceRecord};
use crate::metrics::Metrics;
use crate::model::dra::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};

fn identity(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    namespaced: bool,
) -> Result<(Arc<str>, Arc<str>, String), Invalid> {
    let name = meta
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(Invalid("missing metadata.name"))?;
    let uid = meta
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or(Invalid("missing metadata.uid"))?;
    let key = if namespaced {
        format!("{}/{name}", meta.namespace.as_deref().unwrap_or_default())
    } else {
        name.to_string()
    };
    Ok((
        Arc::from(key),
        Arc::from(uid),
        meta.resource_version.clone().unwrap_or_default(),
    ))
}

fn report(metrics: &Metrics, problems: &[DraProblem]) {
    for p in problems {
        tracing::warn!(object = %p.object, problem = p.problem, detail = %p.detail, "DRA object left out of the join in part");
        metrics.dra_problems.with_label_values(&[p.problem]).inc();
    }
}

fn conflicts(metrics: &Metrics, found: Vec<(String, crate::cluster::Overcommitted)>) {
    for (node, minors) in found {
        let minors: Vec<String> = minors.iter().map(|(t, m)| format!("{t}/{m}")).collect();
        tracing::error!(%node, minors = %minors.join(","), "devices held by a DRA claim and by pods' device-allocated annotations at once: both allocators handed them out; counted as used");
        metrics.dra_conflicts.inc_by(minors.len() as u64);
    }
}

pub struct ResourceSliceHandler {
    cluster: Arc<ClusterState>,
    metrics: Metrics,
}

impl ResourceSliceHandler {
    pub fn new(cluster: Arc<ClusterState>, metrics: Metrics) -> Self {
        ResourceSliceHandler { cluster, metrics }
    }
}

impl Handler for ResourceSliceHandler {
    type Object = ResourceSlice;
    type Record = Arc<SliceRecord>;
    const KIND: Kind = Kind::ResourceSlices;

    fn decode(&self, slice: &ResourceSlice) -> Result<Decoded<Arc<SliceRecord>>, Invalid> {
        let (key, uid, resource_version) = identity(&slice.metadata, false)?;
        let (record, problems) = SliceRecord::from_slice(slice);
        report(&self.metrics, &problems);
        Ok(Decoded {
            key,
            uid,
            resource_version,
            record: Arc::new(record),
        })
    }
    fn apply(&self, key: &str, _old: Option<&Arc<SliceRecord>>, new: &Arc<SliceRecord>) {
        let found = self
            .cluster
            .set_resource_slice(key, Some(SliceRecord::clone(new)));
        conflicts(&self.metrics, found);
    }
    fn remove(&self, key: &str, _old: &Arc<SliceRecord>) {
        let found = self.cluster.set_resource_slice(key, None);
        conflicts(&self.metrics, found);
    }
}

pub struct ResourceClaimHandler {
    cluster: Arc<ClusterState>,
    metrics: Metrics,
}

impl ResourceClaimHandler {
    pub fn new(cluster: Arc<ClusterState>, metrics: Metrics) -> Self {
        ResourceClaimHandler { cluster, metrics }
    }

    fn counts(&self) {
        let (allocated, unresolved) = self.cluster.dra_claim_counts();
        let g = &self.metrics.dra_claims;
        g.with_label_values(&["allocated"]).set(allocated as i64);
        g.with_label_values(&["unresolved"]).set(unresolved as i64);
    }
}

impl Handler for ResourceClaimHandler {
    type Object = ResourceClaim;
    type Record = Arc<ClaimRecord>;
    const KIND: Kind = Kind::ResourceClaims;

    fn decode(&self, claim: &ResourceClaim) -> Result<Decoded<Arc<ClaimRecord>>, Invalid> {
        let (key, uid, resource_version) = identity(&claim.metadata, true)?;
        let (record, problems) = ClaimRecord::from_claim(claim);
        report(&self.metrics, &problems);
        Ok(Decoded {
            key,
            uid,
            resource_version,
            record: Arc::new(record),
        })
    }
    fn apply(&self, key: &str, _old: Option<&Arc<ClaimRecord>>, new: &Arc<ClaimRecord>) {
        let found = self
            .cluster
            .set_resource_claim(key, Some(ClaimRecord::clone(new)));
        conflicts(&self.metrics, found);
        self.counts();
    }
    fn remove(&self, key: &str, _old: &Arc<ClaimRecord>) {
        let found = self.cluster.set_resource_claim(key, None);
        conflicts(&self.metrics, found);
        self.counts();
    }
}

pub struct DeviceClassHandler {
    cluster: Arc<ClusterState>,
    readiness: Arc<Readiness>,
    metrics: Metrics,
    /// `--allow-dra-extended-resources`: the split is intended; report, but stay ready.
    allow_extended: bool,
}

impl DeviceClassHandler {
    pub fn new(
        cluster: Arc<ClusterState>,
        readiness: Arc<Readiness>,
        metrics: Metrics,
        allow_extended: bool,
    ) -> Self {
        DeviceClassHandler {
            cluster,
            readiness,
            metrics,
            allow_extended,
        }
    }

    fn judge(&self, mapping: Vec<(String, &'static str)>) {
        self.metrics
            .dra_extended_resource_classes
            .set(mapping.len() as i64);
        if mapping.is_empty() {
            self.readiness.set_refusal(None);
            return;
        }
        let named: Vec<String> = mapping
            .iter()
            .map(|(class, name)| format!("DeviceClass {class} maps {name}"))
            .collect();
        let message = format!(
            "{}: kube-scheduler serves it through DRA on nodes that do not advertise it",
            named.join(", ")
        );
        if self.allow_extended {
            tracing::warn!(classes = %named.join(", "), "managed resource names are served through DRA where nodes do not advertise them (--allow-dra-extended-resources): the extender allocates no device for them there");
            self.readiness.set_refusal(None);
        } else {
            tracing::error!(classes = %named.join(", "), "managed resource names are moved to DRA by a DeviceClass: not ready until the class is removed or --allow-dra-extended-resources says the split is intended");
            self.readiness.set_refusal(Some(format!(
                "{message} (start with --allow-dra-extended-resources if the split is intended)"
            )));
        }
    }
}

impl Handler for DeviceClassHandler {
    type Object = DeviceClass;
    type Record = Arc<DeviceClass>;
    const KIND: Kind = Kind::DeviceClasses;

    fn decode(&self, class: &DeviceClass) -> Result<Decoded<Arc<DeviceClass>>, Invalid> {
        let (key, uid, resource_version) = identity(&class.metadata, false)?;
        // Only what the rule reads is kept.
        let kept = DeviceClass {
            metadata: Default::default(),
            spec: class.spec.clone(),
        };
        Ok(Decoded {
            key,
            uid,
            resource_version,
            record: Arc::new(kept),
        })
    }
    fn apply(&self, key: &str, _old: Option<&Arc<DeviceClass>>, new: &Arc<DeviceClass>) {
        let mapping = self.cluster.set_device_class(key, Some(new));
        self.judge(mapping);
    }
    fn remove(&self, key: &str, _old: &Arc<DeviceClass>) {
        let mapping = self.cluster.set_device_class(key, None);
        self.judge(mapping);
    }
}

/// What a DeviceTaintRule is to the extender.
#[derive(Clone, Debug, PartialEq)]
pub enum RuleSeen {
    /// One of its rules.
    Ours(Arc<RuleRecord>),
    /// Under one of its names, but edited out of its form (label, taint, selector).
    Defaced,
    /// Anyone else's: changes nothing.
    Other,
}

/// The extender's DeviceTaintRules (others are recorded as [`RuleSeen::Other`] and change
/// nothing; an edited one of its names as [`RuleSeen::Defaced`]).
pub struct DeviceTaintRuleHandler {
    cluster: Arc<ClusterState>,
    metrics: Metrics,
}

impl DeviceTaintRuleHandler {
    pub fn new(cluster: Arc<ClusterState>, metrics: Metrics) -> Self {
        DeviceTaintRuleHandler { cluster, metrics }
    }
}

impl Handler for DeviceTaintRuleHandler {
    type Object = DeviceTaintRule;
    type Record = RuleSeen;
    const KIND: Kind = Kind::DeviceTaintRules;

    fn decode(&self, rule: &DeviceTaintRule) -> Result<Decoded<RuleSeen>, Invalid> {
        let (key, uid, resource_version) = identity(&rule.metadata, false)?;
        let record = match RuleRecord::from_rule(rule) {
            Some(r) => RuleSeen::Ours(Arc::new(r)),
            None if key.starts_with(RULE_NAME_PREFIX) => RuleSeen::Defaced,
            None => RuleSeen::Other,
        };
        Ok(Decoded {
            key,
            uid,
            resource_version,
            record,
        })
    }
    fn apply(&self, key: &str, old: Option<&RuleSeen>, new: &RuleSeen) {
        let was_ours = matches!(old, Some(RuleSeen::Ours(_)));
        let was_defaced = matches!(old, Some(RuleSeen::Defaced));
        self.cluster
            .set_defaced_taint_rule(key, *new == RuleSeen::Defaced);
        let found = match new {
            RuleSeen::Ours(r) => {
                let mut record = RuleRecord::clone(r);
                if was_defaced {
                    // Restored after an edit took our taint off the pool: DRA may have
                    // allocated from it meanwhile, in memory. Its creation time says nothing
                    // of that, so the hand-over grace starts again now.
                    record.created = record.created.max(std::time::SystemTime::now());
                }
                self.cluster.set_device_taint_rule(key, Some(record))
            }
            _ if was_ours => self.cluster.set_device_taint_rule(key, None),
            _ => return,
        };
        conflicts(&self.metrics, found);
    }
    fn remove(&self, key: &str, old: &RuleSeen) {
        self.cluster.set_defaced_taint_rule(key, false);
        if !matches!(old, RuleSeen::Ours(_)) {
            return;
        }
        tracing::info!(
            rule = key,
            "the extender's DeviceTaintRule is gone: its pool is not the extender's until the rule is back and in effect"
        );
        let found = self.cluster.set_device_taint_rule(key, None);
        conflicts(&self.metrics, found);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::dra::DevicePool;

    /// A rule of ours edited out of its form (its taint taken off the pool) and then restored
    /// is not in effect at once from its old creation time: DRA may hold an allocation made
    /// meanwhile in memory, so the grace starts again.
    #[test]
    fn a_restored_rule_waits_out_the_grace_again() {
        let cluster = Arc::new(ClusterState::new());
        let handler = DeviceTaintRuleHandler::new(cluster.clone(), Metrics::new());
        let pool = DevicePool {
            driver: Arc::from("d"),
            pool: Arc::from("p"),
        };
        let rule = crate::scheduler::dra_owner::rule_for(&pool);
        let name = rule.metadata.name.clone().unwrap();
        let ours = || {
            let mut r = RuleRecord::from_rule(&rule).unwrap();
            r.created = std::time::SystemTime::UNIX_EPOCH;
            RuleSeen::Ours(Arc::new(r))
        };
        let created = |c: &ClusterState| c.dra_rule_created(&name);
        handler.apply(&name, None, &ours());
        assert_eq!(created(&cluster), Some(std::time::SystemTime::UNIX_EPOCH));
        handler.apply(&name, Some(&ours()), &RuleSeen::Defaced);
        assert_eq!(created(&cluster), None, "not ours while edited");
        assert!(cluster.dra_ownership_plan().defaced.contains(&*name));
        let before = std::time::SystemTime::now();
        handler.apply(&name, Some(&RuleSeen::Defaced), &ours());
        let restored = created(&cluster).unwrap();
        assert!(restored >= before, "{restored:?} is the old creation time");
        assert!(cluster.dra_ownership_plan().defaced.is_empty());
    }
}
