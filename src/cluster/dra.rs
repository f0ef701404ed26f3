//! What Kubernetes' own device allocator (DRA) holds, per node, in the terms the device ledger
//! joins against its `Device` entries: [`DraIndex`] keeps the ResourceSlices (which device of
//! which driver and pool is which physical device, on which node), the ResourceClaims (which
//! of those devices an allocation holds) and the DeviceClasses that map a resource name to DRA
//! (KEP-5004), and answers, after each change, the new [`NodeDraHoldings`] of every node the
//! change touched.
//!
//! The rules (README "Beside DRA"):
//! - a claim's allocated device is named by `(driver, pool, device)`; the slice that lists it
//!   says on which node it is and which physical device it is ([`DeviceIdentity`]);
//! - an allocated device is held whole, whatever the claim consumes of it (consumable
//!   capacity is never less than the whole for the extender: conservative);
//! - a device the claims hold stays known after its slice is gone (a driver restarting
//!   republishes its slices): it is held until no claim holds it;
//! - a device whose slices are gone while its pool carries the extender's rule is remembered
//!   (`NodeDraHoldings::former`): kubelet wipes a node's slices at every kubelet start and
//!   30 s after a driver deregisters, and the rule must stay while a pod of ours holds the
//!   device, whatever the slices do; it is forgotten when the rule goes;
//! - a device two slices list (a bad slice, or two drivers or pools naming one device, a GPU
//!   driver and a VFIO driver say) is held under every identity and on every node any of them
//!   states, and published under every pool that lists it;
//! - a device's node is the slice's `nodeName`, or, with `perDeviceNodeSelection`, the
//!   device's own `nodeName`; a device reachable through a node selector or from all nodes
//!   (network-attached, or a selector the extender does not evaluate) is on [`ANY_NODE`]: it
//!   is joined by its UUID wherever a `Device` entry states it (a PCI address names a place
//!   on some node, not one device, so it is not joined there).
//!
//! Pure data: no locks, no I/O, no placement. `ClusterState` serializes the calls and
//! applies the answers to the nodes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::model::dra::{
    DeviceClass, DeviceIdentity, DeviceTaintRule, MANAGED_BY, MANAGED_BY_LABEL, OWNED_TAINT_KEY,
    ResourceClaim, ResourceSlice,
};
use crate::model::resource_names::ResourceNameSet;

/// The node of a listing reachable through a node selector or from all nodes: joined by its
/// UUID on every node (a node name never contains `*`).
pub const ANY_NODE: &str = "*";

/// A device as a claim's allocation names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DeviceRef {
    pub driver: Arc<str>,
    pub pool: Arc<str>,
    pub device: Arc<str>,
}

/// A driver's pool: what one of the extender's DeviceTaintRules selects.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePool {
    pub driver: Arc<str>,
    pub pool: Arc<str>,
}

impl std::fmt::Display for DevicePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.driver, self.pool)
    }
}

impl Serialize for DevicePool {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// What DRA means for one node's devices: per identity, the claims (`namespace/name`) holding
/// the device that states it; every device a slice publishes here, with its pool; which of
/// those pools are the extender's now (its DeviceTaintRule in effect, the node not handed to
/// DRA); and the DRA drivers that publish the node's CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeDraHoldings {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub held: BTreeMap<DeviceIdentity, BTreeSet<Arc<str>>>,
    /// Every pool that publishes the device (one device may be in several drivers' pools).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub published: BTreeMap<DeviceIdentity, BTreeSet<DevicePool>>,
    /// Devices once published here whose slices are gone while their pool carries the
    /// extender's rule: not DRA's now, but the rule must stay while a pod of ours holds one.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub former: BTreeMap<DeviceIdentity, BTreeSet<DevicePool>>,
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    pub owned: BTreeSet<DevicePool>,
    /// Ownership is enforced (DeviceTaintRules served, `--dra-ownership`): a published device
    /// whose pool is not `owned` is not the extender's to hand out.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub enforced: bool,
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    pub cpu_drivers: BTreeSet<Arc<str>>,
}

impl NodeDraHoldings {
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
            && self.published.is_empty()
            && self.former.is_empty()
            && self.cpu_drivers.is_empty()
    }
}

/// The name of every rule the extender writes starts so (`scheduler::dra_owner::rule_for`).
pub const RULE_NAME_PREFIX: &str = "dne-owned-";

/// One of the extender's DeviceTaintRules, as recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleRecord {
    pub pool: DevicePool,
    /// When kube-scheduler is taken to avoid the pool: the rule's creation plus the hand-over
    /// grace (`--dra-handover-grace`).
    pub created: SystemTime,
}

impl RuleRecord {
    /// The extender's rule (its label, its taint key, `NoSchedule`, a whole pool), or `None`
    /// for anyone else's.
    pub fn from_rule(rule: &DeviceTaintRule) -> Option<Self> {
        let ours = rule
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(MANAGED_BY_LABEL))
            .is_some_and(|v| v == MANAGED_BY);
        let spec = &rule.spec;
        let selector = spec.device_selector.as_ref()?;
        if !ours
            || spec.taint.key != OWNED_TAINT_KEY
            || spec.taint.effect != "NoSchedule"
            || selector.device.is_some()
        {
            return None;
        }
        let (Some(driver), Some(pool)) = (&selector.driver, &selector.pool) else {
            return None;
        };
        // No creation time (a cluster file): as old as can be.
        let created = rule
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| SystemTime::from(t.0))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Some(RuleRecord {
            pool: DevicePool {
                driver: Arc::from(driver.as_str()),
                pool: Arc::from(pool.as_str()),
            },
            created,
        })
    }
}

/// A problem with a DRA object: counted (`dne_dra_problems_total{problem}`), logged, and the
/// part it concerns is left out; nothing else changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraProblem {
    pub object: String,
    pub problem: &'static str,
    pub detail: String,
}

/// One slice as recorded: its node (slice-level `nodeName`) and what each of its devices is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceRecord {
    pub driver: Arc<str>,
    pub node: Option<Arc<str>>,
    pub devices: Vec<SliceDeviceRecord>,
}

/// One device of a slice: how claims name it, the node it is on ([`ANY_NODE`] for one a node
/// selector or `allNodes` reaches; `None`: no node at all, never joined) and what physical
/// device it is.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceDeviceRecord {
    pub r: DeviceRef,
    pub node: Option<Arc<str>>,
    pub ids: Vec<DeviceIdentity>,
}

impl SliceRecord {
    /// Decodes a slice; devices that cannot be joined are left out and reported.
    pub fn from_slice(slice: &ResourceSlice) -> (Self, Vec<DraProblem>) {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let spec = &slice.spec;
        let mut problems = Vec::new();
        let problem = |p: &'static str, detail: String| DraProblem {
            object: format!("resourceslice {name}"),
            problem: p,
            detail,
        };
        let driver: Arc<str> = Arc::from(spec.driver.as_str());
        let node: Option<Arc<str>> = spec
            .node_name
            .as_deref()
            .filter(|n| !n.is_empty())
            .map(Arc::from);
        let per_device = spec.per_device_node_selection == Some(true);
        let any: Arc<str> = Arc::from(ANY_NODE);
        let slice_node = match &node {
            Some(n) => Some(Arc::clone(n)),
            None if spec.node_selector.is_some() || spec.all_nodes == Some(true) => {
                Some(Arc::clone(&any))
            }
            None => None,
        };
        if spec.driver.is_empty() || spec.pool.name.is_empty() {
            problems.push(problem(
                "malformed",
                "no driver or no pool name: none of its devices can be named by a claim".into(),
            ));
            return (SliceRecord::default(), problems);
        }
        let pool: Arc<str> = Arc::from(spec.pool.name.as_str());
        let mut seen = BTreeSet::new();
        let mut devices = Vec::new();
        for d in &spec.devices {
            if d.name.is_empty() {
                problems.push(problem("malformed", "a device without a name".into()));
                continue;
            }
            if !seen.insert(d.name.as_str()) {
                problems.push(problem(
                    "device_named_twice",
                    format!("device {} is listed twice", d.name),
                ));
                continue;
            }
            let device_node = if per_device {
                match d.node_name.as_deref().filter(|n| !n.is_empty()) {
                    Some(n) => Some(Arc::from(n)),
                    None if d.node_selector.is_some() || d.all_nodes == Some(true) => {
                        Some(Arc::clone(&any))
                    }
                    None => {
                        problems.push(problem(
                            "device_without_node",
                            format!(
                                "device {} names no node, node selector or allNodes under perDeviceNodeSelection",
                                d.name
                            ),
                        ));
                        None
                    }
                }
            } else {
                slice_node.clone()
            };
            let mut ids = DeviceIdentity::of_slice_device(d);
            let anywhere = device_node.as_deref() == Some(ANY_NODE);
            if anywhere {
                ids.retain(DeviceIdentity::is_global);
            } else if ids.is_empty() && device_node.is_some() {
                // Not an error of the slice: it is simply not a device a `Device` entry can be.
                problems.push(problem(
                    "device_without_identity",
                    format!("device {} states no uuid or pciBusID", d.name),
                ));
            }
            devices.push(SliceDeviceRecord {
                r: DeviceRef {
                    driver: Arc::clone(&driver),
                    pool: Arc::clone(&pool),
                    device: Arc::from(d.name.as_str()),
                },
                node: device_node,
                ids,
            });
        }
        (
            SliceRecord {
                driver,
                node,
                devices,
            },
            problems,
        )
    }
}

/// One claim as recorded: the devices its allocation holds (empty: not allocated).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClaimRecord {
    pub devices: Vec<DeviceRef>,
}

impl ClaimRecord {
    pub fn from_claim(claim: &ResourceClaim) -> (Self, Vec<DraProblem>) {
        let mut problems = Vec::new();
        let mut devices = Vec::new();
        for r in claim
            .status
            .allocation
            .iter()
            .flat_map(|a| &a.devices.results)
        {
            if r.admin_access == Some(true) {
                // kube-scheduler's allocator does not count it as allocated: another claim
                // may be given the device, and so may a pod of ours.
                continue;
            }
            if r.driver.is_empty() || r.pool.is_empty() || r.device.is_empty() {
                problems.push(DraProblem {
                    object: format!(
                        "resourceclaim {}/{}",
                        claim.metadata.namespace.as_deref().unwrap_or_default(),
                        claim.metadata.name.as_deref().unwrap_or_default()
                    ),
                    problem: "malformed",
                    detail: "an allocation result without driver, pool or device".into(),
                });
                continue;
            }
            devices.push(DeviceRef {
                driver: Arc::from(r.driver.as_str()),
                pool: Arc::from(r.pool.as_str()),
                device: Arc::from(r.device.as_str()),
            });
        }
        devices.sort();
        devices.dedup();
        (ClaimRecord { devices }, problems)
    }
}

/// What the slices say of one device ref.
#[derive(Clone, Debug, Default)]
struct RefEntry {
    /// By slice name: the node and identities each listing states.
    listings: BTreeMap<Arc<str>, (Arc<str>, Vec<DeviceIdentity>)>,
    /// The last listing, kept while claims hold the device after its slices are gone.
    last: Option<(Arc<str>, Vec<DeviceIdentity>)>,
    /// The claims whose allocation holds it.
    holders: BTreeSet<Arc<str>>,
}

impl RefEntry {
    /// The node-local listings in effect: the current ones, or the last one while held.
    fn effective(&self) -> Vec<&(Arc<str>, Vec<DeviceIdentity>)> {
        if self.listings.is_empty() {
            self.last
                .iter()
                .filter(|_| !self.holders.is_empty())
                .collect()
        } else {
            self.listings.values().collect()
        }
    }

    /// A device no slice lists and no claim holds, kept while its pool carries the
    /// extender's rule (see the module header).
    fn tombstone(&self) -> Option<&(Arc<str>, Vec<DeviceIdentity>)> {
        self.last
            .as_ref()
            .filter(|_| self.listings.is_empty() && self.holders.is_empty())
    }

    fn nodes(&self) -> BTreeSet<Arc<str>> {
        self.effective()
            .into_iter()
            .chain(self.tombstone())
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// The DRA objects, indexed for the join. See the module header for the rules.
#[derive(Debug, Default)]
pub struct DraIndex {
    slices: HashMap<Arc<str>, SliceRecord>,
    refs: HashMap<DeviceRef, RefEntry>,
    by_node: HashMap<Arc<str>, BTreeSet<DeviceRef>>,
    /// Per node, per CPU driver, how many of its slices publish devices there.
    cpu_slices: HashMap<Arc<str>, BTreeMap<Arc<str>, usize>>,
    claims: HashMap<Arc<str>, ClaimRecord>,
    /// DeviceClass name → the managed resource name it maps (KEP-5004).
    classes: BTreeMap<Arc<str>, &'static str>,
    /// The DRA drivers whose slices are a node's CPUs (`--dra-cpu-drivers`).
    cpu_drivers: BTreeSet<String>,
    /// Per pool, the nodes its devices are on (with how many of its refs each).
    pool_nodes: HashMap<DevicePool, BTreeMap<Arc<str>, usize>>,
    /// The extender's DeviceTaintRules by name.
    rules: HashMap<Arc<str>, RuleRecord>,
    /// Rules under one of the extender's names that are not the extender's by form any more
    /// (someone edited the label, taint or selector): reconciled by name, never recreated.
    defaced: BTreeSet<Arc<str>>,
    /// The same by pool: when each of its rules was created (one, unless copied by hand).
    rule_times: HashMap<DevicePool, BTreeMap<Arc<str>, SystemTime>>,
    /// Nodes handed to DRA (`DEVICE_OWNER_LABEL: dra`).
    dra_nodes: HashSet<Arc<str>>,
    /// `Some(grace)`: ownership enforced, a rule in effect `grace` after its creation.
    ownership: Option<Duration>,
    /// Pools whose rule was recorded before it came into effect, by when it does: their
    /// nodes are recomputed then ([`Self::take_due`]).
    pending: BTreeMap<SystemTime, BTreeSet<DevicePool>>,
    /// Claim holdings of devices no slice lists (kept by [`Self::touch`]).
    unresolved: usize,
}

impl DraIndex {
    pub fn new(cpu_drivers: impl IntoIterator<Item = String>) -> Self {
        DraIndex {
            cpu_drivers: cpu_drivers.into_iter().collect(),
            ..Default::default()
        }
    }

    /// Changes one ref (its listings or holders) and keeps `by_node` true; returns the nodes
    /// whose holdings may have changed.
    fn touch(
        &mut self,
        r: &DeviceRef,
        change: impl FnOnce(&mut RefEntry),
        affected: &mut BTreeSet<Arc<str>>,
    ) {
        let pool = DevicePool {
            driver: Arc::clone(&r.driver),
            pool: Arc::clone(&r.pool),
        };
        let ruled = self.rule_times.contains_key(&pool);
        let entry = self.refs.entry(r.clone()).or_default();
        let unresolved = |e: &RefEntry| {
            if e.effective().is_empty() {
                e.holders.len()
            } else {
                0
            }
        };
        self.unresolved -= unresolved(entry);
        let before = entry.nodes();
        change(entry);
        if !ruled && entry.tombstone().is_some() {
            // No rule of ours on its pool: nothing to remember it for.
            entry.last = None;
        }
        let after = entry.nodes();
        self.unresolved += unresolved(entry);
        let gone = entry.listings.is_empty() && entry.holders.is_empty() && entry.last.is_none();
        if gone {
            self.refs.remove(r);
        }
        for n in before.difference(&after) {
            if let Some(set) = self.by_node.get_mut(n) {
                set.remove(r);
                if set.is_empty() {
                    self.by_node.remove(n);
                }
            }
            if let Some(nodes) = self.pool_nodes.get_mut(&pool) {
                if let Some(c) = nodes.get_mut(n) {
                    *c -= 1;
                    if *c == 0 {
                        nodes.remove(n);
                    }
                }
                if nodes.is_empty() {
                    self.pool_nodes.remove(&pool);
                }
            }
        }
        for n in after.difference(&before) {
            self.by_node.entry(n.clone()).or_default().insert(r.clone());
            *self
                .pool_nodes
                .entry(pool.clone())
                .or_default()
                .entry(n.clone())
                .or_default() += 1;
        }
        affected.extend(before);
        affected.extend(after);
    }

    /// Sets (`Some`) or removes (`None`) a slice; returns the nodes to recompute.
    pub fn set_slice(&mut self, name: &str, slice: Option<SliceRecord>) -> BTreeSet<Arc<str>> {
        let name: Arc<str> = Arc::from(name);
        let mut affected = BTreeSet::new();
        if let Some(old) = self.slices.remove(&name) {
            self.count_cpu_slice(&old, false, &mut affected);
            for d in &old.devices {
                let slice = Arc::clone(&name);
                self.touch(
                    &d.r,
                    |e| {
                        if let Some(listing) = e.listings.remove(&slice) {
                            e.last = Some(listing);
                        }
                    },
                    &mut affected,
                );
            }
        }
        if let Some(new) = slice {
            self.count_cpu_slice(&new, true, &mut affected);
            for d in &new.devices {
                let Some(node) = &d.node else { continue };
                let listing = (Arc::clone(node), d.ids.clone());
                let slice = Arc::clone(&name);
                self.touch(
                    &d.r,
                    |e| {
                        e.listings.insert(slice, listing);
                    },
                    &mut affected,
                );
            }
            self.slices.insert(name, new);
        }
        affected
    }

    fn count_cpu_slice(&mut self, s: &SliceRecord, add: bool, affected: &mut BTreeSet<Arc<str>>) {
        let Some(node) = &s.node else { return };
        if s.devices.is_empty() || !self.cpu_drivers.contains(&*s.driver) {
            return;
        }
        let per_node = self.cpu_slices.entry(Arc::clone(node)).or_default();
        let n = per_node.entry(Arc::clone(&s.driver)).or_default();
        if add {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_node.remove(&s.driver);
            }
            if per_node.is_empty() {
                self.cpu_slices.remove(node);
            }
        }
        affected.insert(Arc::clone(node));
    }

    /// Sets (`Some`) or removes (`None`) a claim (`namespace/name`); returns the nodes to
    /// recompute.
    pub fn set_claim(&mut self, key: &str, claim: Option<ClaimRecord>) -> BTreeSet<Arc<str>> {
        let key: Arc<str> = Arc::from(key);
        let mut affected = BTreeSet::new();
        let old = self.claims.remove(&key).unwrap_or_default();
        let new = claim.unwrap_or_default();
        for r in old.devices.iter().filter(|r| !new.devices.contains(r)) {
            let k = Arc::clone(&key);
            self.touch(
                r,
                |e| {
                    e.holders.remove(&k);
                },
                &mut affected,
            );
        }
        for r in new.devices.iter().filter(|r| !old.devices.contains(r)) {
            let k = Arc::clone(&key);
            self.touch(
                r,
                |e| {
                    e.holders.insert(k);
                },
                &mut affected,
            );
        }
        if !new.devices.is_empty() {
            self.claims.insert(key, new);
        }
        affected
    }

    /// Sets or removes a DeviceClass; true when the set of mapped managed names changed.
    pub fn set_class(&mut self, name: &str, class: Option<&DeviceClass>) -> bool {
        let before = self.extended_names();
        let mapped = class
            .and_then(|c| c.spec.extended_resource_name.as_deref())
            .and_then(|n| {
                crate::model::resource_names::MANAGED_RESOURCES
                    .iter()
                    .find(|r| r.name == n)
            })
            .map(|r| r.name);
        match mapped {
            Some(n) => {
                self.classes.insert(Arc::from(name), n);
            }
            None => {
                self.classes.remove(name);
            }
        }
        before != self.extended_names()
    }

    /// The managed names some DeviceClass maps to DRA.
    pub fn extended_names(&self) -> ResourceNameSet {
        ResourceNameSet::of(self.classes.values().copied())
    }

    /// The DeviceClasses that map a managed name, with that name.
    pub fn extended_classes(&self) -> impl Iterator<Item = (&str, &'static str)> {
        self.classes.iter().map(|(c, n)| (&**c, *n))
    }

    /// Enforces ownership (`Some(grace)`) or not (`None`); returns every node to recompute.
    pub fn set_ownership(&mut self, ownership: Option<Duration>) -> BTreeSet<Arc<str>> {
        self.ownership = ownership;
        self.by_node.keys().cloned().collect()
    }

    /// Sets (`Some`) or removes (`None`) one of the extender's rules; returns the nodes to
    /// recompute.
    pub fn set_rule(&mut self, name: &str, rule: Option<RuleRecord>) -> BTreeSet<Arc<str>> {
        if let (Some(r), Some(grace)) = (&rule, self.ownership) {
            let at = r.created + grace;
            if at > SystemTime::now() {
                self.pending.entry(at).or_default().insert(r.pool.clone());
            }
        }
        let old = match rule {
            Some(r) => self
                .rules
                .insert(Arc::from(name), r.clone())
                .into_iter()
                .chain([r])
                .collect::<Vec<_>>(),
            None => self.rules.remove(name).into_iter().collect(),
        };
        for r in &old {
            if let Some(times) = self.rule_times.get_mut(&r.pool) {
                times.remove(name);
                if times.is_empty() {
                    self.rule_times.remove(&r.pool);
                }
            }
        }
        if let Some(r) = self.rules.get(name) {
            self.rule_times
                .entry(r.pool.clone())
                .or_default()
                .insert(Arc::from(name), r.created);
        }
        let mut affected: BTreeSet<Arc<str>> =
            old.iter().flat_map(|r| self.nodes_of(&r.pool)).collect();
        for r in &old {
            if !self.rule_times.contains_key(&r.pool) {
                self.forget_tombstones(&r.pool, &mut affected);
            }
        }
        affected
    }

    /// The pool lost its last rule of ours: its remembered devices are forgotten.
    fn forget_tombstones(&mut self, pool: &DevicePool, affected: &mut BTreeSet<Arc<str>>) {
        let refs: Vec<DeviceRef> = self
            .nodes_of(pool)
            .iter()
            .filter_map(|n| self.by_node.get(n))
            .flatten()
            .filter(|r| r.driver == pool.driver && r.pool == pool.pool)
            .filter(|r| self.refs.get(*r).is_some_and(|e| e.tombstone().is_some()))
            .cloned()
            .collect();
        for r in refs {
            self.touch(&r, |e| e.last = None, affected);
        }
    }

    /// Whether some listing is on [`ANY_NODE`] (every node's holdings may then change with
    /// its `Device` object).
    pub fn has_any_node_listings(&self) -> bool {
        self.by_node.contains_key(ANY_NODE)
    }

    /// Whether the index holds anything for `node` of its own (not counting [`ANY_NODE`]).
    pub fn knows_node(&self, node: &str) -> bool {
        self.by_node.contains_key(node) || self.cpu_slices.contains_key(node)
    }

    fn nodes_of(&self, pool: &DevicePool) -> Vec<Arc<str>> {
        self.pool_nodes
            .get(pool)
            .map(|n| n.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether `node` is handed to DRA; returns the nodes to recompute (it, when it changed).
    pub fn set_node_owner(&mut self, node: &str, to_dra: bool) -> BTreeSet<Arc<str>> {
        let changed = if to_dra {
            self.dra_nodes.insert(Arc::from(node))
        } else {
            self.dra_nodes.remove(node)
        };
        if changed {
            BTreeSet::from([Arc::from(node)])
        } else {
            BTreeSet::new()
        }
    }

    /// Records whether the rule named `name` is one of the extender's names edited out of
    /// the extender's form ([`RULE_NAME_PREFIX`]).
    pub fn set_defaced(&mut self, name: &str, defaced: bool) {
        if defaced {
            self.defaced.insert(Arc::from(name));
        } else {
            self.defaced.remove(name);
        }
    }

    /// When the extender's rule `name` is taken to have been created.
    #[cfg(test)]
    pub(crate) fn rule_created(&self, name: &str) -> Option<SystemTime> {
        self.rules.get(name).map(|r| r.created)
    }

    /// The edited rules under the extender's names.
    pub fn defaced(&self) -> BTreeSet<Arc<str>> {
        self.defaced.clone()
    }

    /// The extender's rules by pool (name), for the reconciler.
    pub fn rules_by_pool(&self) -> BTreeMap<DevicePool, Arc<str>> {
        self.rules
            .iter()
            .map(|(n, r)| (r.pool.clone(), Arc::clone(n)))
            .collect()
    }

    /// The nodes of the pools whose rules came into effect by `now` since they were recorded
    /// (to recompute), and when the next one does.
    pub fn take_due(&mut self, now: SystemTime) -> (BTreeSet<Arc<str>>, Option<SystemTime>) {
        let later = self.pending.split_off(&now);
        let due = std::mem::replace(&mut self.pending, later);
        // `split_off` keeps `now` itself in the later half.
        let mut nodes: BTreeSet<Arc<str>> = due
            .values()
            .flatten()
            .flat_map(|p| self.nodes_of(p))
            .collect();
        if let Some(pools) = self.pending.remove(&now) {
            nodes.extend(pools.iter().flat_map(|p| self.nodes_of(p)));
        }
        (nodes, self.pending.keys().next().copied())
    }

    /// A node's holdings at `now`.
    pub fn holdings(&self, node: &str, now: SystemTime) -> NodeDraHoldings {
        let mut out = NodeDraHoldings {
            enforced: self.ownership.is_some(),
            ..Default::default()
        };
        let owner_grace = self.ownership.filter(|_| !self.dra_nodes.contains(node));
        let in_effect = |pool: &DevicePool| {
            owner_grace.is_some_and(|grace| {
                self.rule_times
                    .get(pool)
                    .and_then(|t| t.values().min())
                    .is_some_and(|created| *created + grace <= now)
            })
        };
        let anywhere = self.by_node.get(ANY_NODE).filter(|_| node != ANY_NODE);
        let here = |n: &str| n == node || n == ANY_NODE;
        for r in self.by_node.get(node).into_iter().chain(anywhere).flatten() {
            let Some(entry) = self.refs.get(r) else {
                continue;
            };
            let pool = DevicePool {
                driver: Arc::clone(&r.driver),
                pool: Arc::clone(&r.pool),
            };
            if in_effect(&pool) {
                out.owned.insert(pool.clone());
            }
            if let Some((n, ids)) = entry.tombstone()
                && here(n)
            {
                for id in ids {
                    out.former
                        .entry(id.clone())
                        .or_default()
                        .insert(pool.clone());
                }
            }
            for (n, ids) in entry.effective() {
                if !here(n) {
                    continue;
                }
                for id in ids {
                    out.published
                        .entry(id.clone())
                        .or_default()
                        .insert(pool.clone());
                    if !entry.holders.is_empty() {
                        out.held
                            .entry(id.clone())
                            .or_default()
                            .extend(entry.holders.iter().cloned());
                    }
                }
            }
        }
        if let Some(drivers) = self.cpu_slices.get(node) {
            out.cpu_drivers.extend(drivers.keys().cloned());
        }
        out
    }

    /// Claims with an allocation, and how many of their devices no slice names (held, but
    /// not known to be any node's device).
    pub fn claim_counts(&self) -> (usize, usize) {
        (self.claims.len(), self.unresolved)
    }
}

#[cfg(test)]
mod tests;
