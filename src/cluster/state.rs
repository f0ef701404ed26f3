//! Cluster state: one entry per node behind its own lock, created lazily by whichever object
//! names the node first (a pod can arrive before its Node, Device or NRT).
//!
//! This module owns the per-node locks and the rule for moving a pod's recorded contribution
//! between nodes. It never talks to the network and never decides placement.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::RwLock;

use super::assumed::{AssumedPod, Assumptions};
use super::cpus::{NodeCpuLabels, RecordedCpus};
use super::devices::{EntryState, NodeDevices, NodeGpuLabels, RecordedAllocation};
use super::dra::{ClaimRecord, DevicePool, DraIndex, RuleRecord, SliceRecord};
use super::node::{NodeEntry, NodeState};
use super::parallel::on_cores;
use super::pod::{PodCpus, PodDevices, PodRecord};
use super::records::{NodeRecord, Overcommitted, TopologyRecord};
use super::returns::CapacityReturns;
use super::snapshot::{ReadSnapshots, Snapshot};
use crate::model::device::DeviceAllocations;
use crate::model::ids::PodUid;
use crate::model::resource_names::ResourceNameSet;

/// What `scheduler::dra_owner` reconciles (see [`ClusterState::dra_ownership_plan`]).
#[derive(Debug, Default)]
pub struct DraOwnershipPlan {
    pub wanted: std::collections::BTreeSet<DevicePool>,
    pub in_use: std::collections::BTreeSet<DevicePool>,
    pub rules: BTreeMap<DevicePool, Arc<str>>,
    /// Rules under the extender's names edited out of its form (never created over).
    pub defaced: std::collections::BTreeSet<Arc<str>>,
}

/// What a bind assumes on a node ([`ClusterState::assume`]): its allocations and what the
/// assumption record keeps to write, probe and release them.
#[derive(Debug)]
pub struct Assumption {
    pub devices: Option<DeviceAllocations>,
    pub cpus: Option<RecordedCpus>,
    /// The pod's CPU request (millicores), counted by the amplification check until the
    /// watch lists the pod on the node.
    pub cpu_milli: i64,
    pub namespace: String,
    pub name: String,
    /// The annotations the bind writes (`None` = removed).
    pub annotations: BTreeMap<String, Option<String>>,
}

/// The shared cache. Cloning the `Arc<ClusterState>` is how every component sees it.
#[derive(Debug, Default)]
pub struct ClusterState {
    /// Looked up once per pod event: a fast (randomly seeded) hasher, not SipHash.
    nodes: RwLock<HashMap<Arc<str>, Arc<NodeEntry>, ahash::RandomState>>,
    /// Binds in flight and the pods behind assumed ledger entries (bind writes them, the pod
    /// sync's relists and the binder's probes release them).
    assumptions: Assumptions,
    /// Nodes whose CPU config changes anything for a plain pod (forced bind policy or a NUMA
    /// policy): while zero, pods without a cpuset wish or NUMA policy skip CPU placement.
    cpu_constraining_nodes: std::sync::atomic::AtomicUsize,
    /// What filter and prioritize read (see [`super::snapshot`]).
    snapshots: ReadSnapshots,
    /// Hands out node state versions (under the node's lock).
    versions: std::sync::atomic::AtomicU64,
    /// Nodes whose capacity grew, for the requeue signal (see [`super::returns`]).
    returns: CapacityReturns,
    /// What DRA holds, joined per node (see [`super::dra`]). Locked before any node lock and
    /// held while the changed nodes are written, so two DRA events apply in order.
    dra: parking_lot::Mutex<DraIndex>,
    /// `DraIndex::extended_names` as bits, for nodes created after a class arrived.
    dra_extended: std::sync::atomic::AtomicU32,
    /// Names a Node advertises that the Device-less rule never takes for a device plugin's
    /// (bits; [`Self::set_deviceless_untrusted`]).
    deviceless_untrusted: std::sync::atomic::AtomicU32,
    /// Pending pods kube-scheduler nominated to a node (see [`super::nominated`]).
    nominations: super::nominated::Nominations,
    /// PodDisruptionBudgets, for preemption's violation count (see [`super::budgets`]).
    budgets: super::budgets::DisruptionBudgets,
}

impl ClusterState {
    pub fn new() -> Self {
        Self::default()
    }

    /// The nodes whose capacity grew since the requeue signal last took them.
    pub fn capacity_returns(&self) -> &CapacityReturns {
        &self.returns
    }

    pub fn node(&self, name: &str) -> Option<Arc<NodeEntry>> {
        self.nodes.read().get(name).cloned()
    }

    /// Atomic get-or-create (koordinator #1182: two racing creators must not lose updates).
    pub fn node_or_create(&self, name: &str) -> Arc<NodeEntry> {
        if let Some(entry) = self.node(name) {
            return entry;
        }
        let mut nodes = self.nodes.write();
        nodes
            .entry(Arc::from(name))
            .or_insert_with(|| {
                // Under the map's write lock: a class change stores the names before it
                // walks the map, so a node created meanwhile has them either way.
                let names = ResourceNameSet::from_bits(
                    self.dra_extended.load(std::sync::atomic::Ordering::SeqCst),
                );
                Arc::new(NodeEntry::new(name, names))
            })
            .clone()
    }

    pub fn assumptions(&self) -> &Assumptions {
        &self.assumptions
    }

    /// Pending pods nominated to a node, whose capacity filter holds for them.
    pub fn nominations(&self) -> &super::nominated::Nominations {
        &self.nominations
    }

    /// The PodDisruptionBudgets preemption counts violations of.
    pub fn budgets(&self) -> &super::budgets::DisruptionBudgets {
        &self.budgets
    }

    /// Decides on `node` under its write lock and records what `decide` returns as assumed:
    /// in the node's ledgers and in the assumptions, with one instant (kube-scheduler's
    /// `AssumePod`; the twin of [`Self::release_assumed`], its `ForgetPod`). Concurrent binds
    /// on the node see each other's assumed entries; `decide` reads the state, it cannot
    /// write it. `None` when no object names the node (no entry is created); `Ok(None)` when
    /// the decision holds nothing. Lock order: the node, then the assumptions.
    pub fn assume<E>(
        &self,
        node: &str,
        uid: &PodUid,
        decide: impl FnOnce(&NodeState) -> Result<Option<Assumption>, E>,
    ) -> Option<Result<Option<std::time::Instant>, E>> {
        self.with_existing_node(node, |state| {
            let Some(a) = decide(state)? else {
                return Ok(None);
            };
            if a.devices.is_none() && a.cpus.is_none() {
                return Ok(None);
            }
            let at = std::time::Instant::now();
            state.record_assumed(uid, a.devices, a.cpus, a.cpu_milli, at);
            self.assumptions.record(
                uid.clone(),
                AssumedPod {
                    namespace: a.namespace,
                    name: a.name,
                    node: Arc::from(node),
                    at,
                    annotations: a.annotations,
                    outcome: super::assumed::Outcome::Writing,
                    binding: None,
                },
            );
            Ok(Some(at))
        })
    }

    /// Removes `uid`'s assumed entries on `node` if they are still the ones assumed at `at`
    /// (not committed by the watch, not re-assumed by a later bind), and forgets the record.
    /// True when a ledger entry was removed. Both ledgers (devices and CPUs) are released
    /// here, keyed by the same `at`: one bind, one lifecycle.
    pub fn release_assumed(&self, node: &str, uid: &PodUid, at: std::time::Instant) -> bool {
        let removed = self
            .with_existing_node(node, |s| s.remove_if_assumed_at(uid, at))
            .unwrap_or(false);
        self.assumptions.forget(uid, at);
        if removed {
            self.gc(node);
        }
        removed
    }

    /// Every assumed ledger entry: `(node, pod uid, assumed at)`.
    pub fn assumed_entries(&self) -> Vec<(Arc<str>, PodUid, std::time::Instant)> {
        let entries: Vec<_> = self.nodes.read().values().cloned().collect();
        let mut out = Vec::new();
        for entry in entries {
            let state = entry.read();
            out.extend(
                state
                    .assumed_older_than(std::time::Instant::now(), std::time::Duration::ZERO)
                    .into_iter()
                    .map(|(uid, at)| (entry.name.clone(), uid, at)),
            );
        }
        out
    }

    /// At a relist's `InitDone`: releases the assumed entries whose bind finished before the
    /// relist's `Init` (`mark`) and whose pod the list does not hold on that node. `listed`
    /// answers, for a pod UID, whether the list holds it and on which node it holds
    /// resources. The safety argument is in [`super::assumed`]. Returns how many ledger
    /// entries were released.
    pub fn release_absent_at_relist(
        &self,
        mark: u64,
        listed: impl Fn(&PodUid) -> Option<Option<Arc<str>>>,
    ) -> usize {
        let mut released = 0;
        for (uid, pod) in self.assumptions.relist_candidates(mark) {
            let here = matches!(listed(&uid), Some(Some(node)) if node == pod.node);
            if here {
                continue;
            }
            if self.release_assumed(&pod.node, &uid, pod.at) {
                tracing::info!(node = %pod.node, pod = %format!("{}/{}", pod.namespace, pod.name), pod_uid = %uid, "relist: released an assumed allocation whose pod is gone");
                released += 1;
            }
        }
        released
    }

    /// Forgets assumption records whose ledger entry was committed, rolled back or replaced.
    pub fn prune_assumptions(&self) {
        let settled: Vec<(PodUid, AssumedPod)> = self
            .assumptions
            .snapshot()
            .into_iter()
            .filter(|(uid, p)| {
                let state = self.node(&p.node).and_then(|e| e.read().entry_state(uid));
                !matches!(state, Some(EntryState::Assumed { at }) if at == p.at)
            })
            .collect();
        for (uid, p) in settled {
            self.assumptions.forget(&uid, p.at);
        }
    }

    pub fn node_names(&self) -> Vec<Arc<str>> {
        let mut names: Vec<_> = self.nodes.read().keys().cloned().collect();
        names.sort();
        names
    }

    pub fn node_count(&self) -> usize {
        self.nodes.read().len()
    }

    /// Drops a node entry once nothing refers to it any more.
    ///
    /// Writers look an entry up and lock it in two steps, so one may hold the `Arc` of an
    /// entry this removes. The entry is therefore marked dead under its own
    /// write lock, taken while the map's write lock is held: a writer that then locks it sees
    /// `dead` and looks the name up again ([`Self::with_node`]). Lock order: map, then entry;
    /// nothing takes the map lock while holding an entry lock.
    fn gc(&self, name: &str) {
        let mut nodes = self.nodes.write();
        if let Some(entry) = nodes.get(name) {
            let mut state = entry.write();
            if state.is_empty() {
                state.dead = true;
                self.written(name, &mut state);
                drop(state);
                nodes.remove(name);
            }
        }
    }

    /// Names whose totals on a Node come from its `Device` object (the GPU share totals, when
    /// `--gpu-share-totals` is `koord-manager` or `extender`): on a node without one they are
    /// stale (the Device deleted, the totals not yet taken back, or the take-back refused)
    /// and never a device plugin's, so the Device-less rule does not serve them (trust IV §6:
    /// a share pod was bound to a node with no GPU). Nodes already cached are judged anew.
    pub fn set_deviceless_untrusted(&self, names: ResourceNameSet) {
        self.deviceless_untrusted
            .store(names.bits(), std::sync::atomic::Ordering::SeqCst);
        let all: Vec<Arc<str>> = self.nodes.read().keys().cloned().collect();
        for n in all {
            self.with_node(&n, |s| {
                if let Some(node) = &mut s.node {
                    node.deviceless_advertised = node.advertised.without(names);
                }
            });
        }
    }

    pub fn set_node(&self, name: &str, node: Option<NodeRecord>) {
        let untrusted = ResourceNameSet::from_bits(
            self.deviceless_untrusted
                .load(std::sync::atomic::Ordering::SeqCst),
        );
        let node = node.map(|mut n| {
            n.deviceless_advertised = n.advertised.without(untrusted);
            n
        });
        let removed = node.is_none();
        {
            let to_dra = node
                .as_ref()
                .and_then(|n| n.labels.get(crate::model::dra::DEVICE_OWNER_LABEL))
                .is_some_and(|v| v == "dra");
            let mut dra = self.dra.lock();
            let affected = dra.set_node_owner(name, to_dra);
            self.write_dra(&dra, affected);
        }
        self.with_node(name, |s| {
            let before = s.checks_plain_pods();
            s.cpus.set_labels(
                node.as_ref()
                    .map(NodeCpuLabels::from_node)
                    .unwrap_or_default(),
            );
            s.devices.set_gpu_labels(
                node.as_ref()
                    .map(|n| NodeGpuLabels::from_labels(&n.labels))
                    .unwrap_or_default(),
            );
            s.node = node;
            self.count_constraining(before, s.checks_plain_pods());
        });
        if removed {
            self.gc(name);
        }
    }

    pub fn set_topology(&self, name: &str, topology: Option<TopologyRecord>) {
        self.set_topology_shared(name, topology.map(Arc::new));
    }

    /// [`Self::set_topology`] with a shared copy (the NRT sync's record).
    pub fn set_topology_shared(&self, name: &str, topology: Option<Arc<TopologyRecord>>) {
        let removed = topology.is_none();
        self.with_node(name, |s| {
            let before = s.checks_plain_pods();
            s.cpus.set_nrt(topology.as_ref().map(|t| t.cpu.clone()));
            s.topology = topology;
            self.count_constraining(before, s.checks_plain_pods());
        });
        if removed {
            self.gc(name);
        }
    }

    /// Called under the node's lock, so transitions of one node are counted in order.
    fn count_constraining(&self, before: bool, after: bool) {
        use std::sync::atomic::Ordering;
        match (before, after) {
            (false, true) => {
                self.cpu_constraining_nodes.fetch_add(1, Ordering::SeqCst);
            }
            (true, false) => {
                self.cpu_constraining_nodes.fetch_sub(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }

    /// How many nodes check plain pods: they force a bind policy, have a NUMA policy or amplify
    /// their CPU ([`NodeState::checks_plain_pods`]).
    pub fn cpu_constraining_nodes(&self) -> usize {
        self.cpu_constraining_nodes
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sets a node's devices from its Device object; `None` when the object is deleted, which
    /// leaves nothing allocatable but keeps what pods hold (koordinator #1186).
    /// Sets (or removes) a node's Device object; returns the minors its pods' recorded
    /// allocations now overcommit.
    pub fn set_devices(&self, name: &str, devices: Option<NodeDevices>) -> Overcommitted {
        self.set_devices_shared(name, devices.map(Arc::new))
    }

    /// [`Self::set_devices`] with a shared copy (the Device sync's record).
    pub fn set_devices_shared(
        &self,
        name: &str,
        devices: Option<Arc<NodeDevices>>,
    ) -> Overcommitted {
        let removed = devices.is_none();
        let over = self.with_node(name, |s| {
            // Unknown-identity holders are placed again after the write; only known holders
            // can over-commit the new device set.
            s.devices.remove_unknown_entries();
            s.devices.set_devices_shared(devices);
            s.devices.overcommitted()
        });
        {
            // A device a node selector reaches is joined wherever a `Device` states it: a node
            // whose entry did not exist when that slice came learns of it now. Checked after
            // the write, so a slice applied meanwhile is seen by one side or the other.
            let dra = self.dra.lock();
            if dra.has_any_node_listings() {
                let _ = self.write_dra(&dra, std::collections::BTreeSet::from([Arc::from(name)]));
            }
        }
        if removed {
            self.gc(name);
        }
        over
    }

    /// The DRA drivers whose slices are a node's CPUs (`--dra-cpu-drivers`); set before the
    /// sync starts.
    pub fn configure_dra(&self, cpu_drivers: impl IntoIterator<Item = String>) {
        *self.dra.lock() = DraIndex::new(cpu_drivers);
    }

    /// Applies a ResourceSlice (`None`: deleted) and writes the holdings of every node it
    /// touched. Returns the minors held both by a claim and by pods' annotations there.
    pub fn set_resource_slice(
        &self,
        name: &str,
        slice: Option<SliceRecord>,
    ) -> Vec<(String, Overcommitted)> {
        let mut dra = self.dra.lock();
        let affected = dra.set_slice(name, slice);
        self.write_dra(&dra, affected)
    }

    /// Applies a ResourceClaim (`namespace/name`; `None`: deleted or not allocated).
    pub fn set_resource_claim(
        &self,
        key: &str,
        claim: Option<ClaimRecord>,
    ) -> Vec<(String, Overcommitted)> {
        let mut dra = self.dra.lock();
        let affected = dra.set_claim(key, claim);
        self.write_dra(&dra, affected)
    }

    /// Applies a DeviceClass (`None`: deleted). When the managed names some class maps to DRA
    /// change, every node learns them (rare: classes are few and change seldom).
    pub fn set_device_class(
        &self,
        name: &str,
        class: Option<&crate::model::dra::DeviceClass>,
    ) -> Vec<(String, &'static str)> {
        let mut dra = self.dra.lock();
        if dra.set_class(name, class) {
            let names = dra.extended_names();
            self.dra_extended
                .store(names.bits(), std::sync::atomic::Ordering::SeqCst);
            let all: Vec<Arc<str>> = self.nodes.read().keys().cloned().collect();
            for n in all {
                self.with_node(&n, |s| s.dra_extended = names);
            }
        }
        dra.extended_classes()
            .map(|(c, n)| (c.to_string(), n))
            .collect()
    }

    /// Applies one of the extender's DeviceTaintRules (`None`: deleted, or not the extender's).
    pub fn set_device_taint_rule(
        &self,
        name: &str,
        rule: Option<RuleRecord>,
    ) -> Vec<(String, Overcommitted)> {
        let mut dra = self.dra.lock();
        let affected = dra.set_rule(name, rule);
        self.write_dra(&dra, affected)
    }

    /// Records whether the DeviceTaintRule `name` is one of the extender's names edited out of
    /// its form (see `scheduler::dra_owner`).
    pub fn set_defaced_taint_rule(&self, name: &str, defaced: bool) {
        self.dra.lock().set_defaced(name, defaced);
    }

    /// Enforces device ownership against DRA (`Some(grace)`: DeviceTaintRules are served and
    /// `--dra-ownership` is on) or not.
    pub fn set_dra_ownership(&self, ownership: Option<std::time::Duration>) {
        let mut dra = self.dra.lock();
        let affected = dra.set_ownership(ownership);
        self.write_dra(&dra, affected);
    }

    /// Recomputes the nodes whose pools' rules came into effect by now; returns when the next
    /// one does.
    pub fn refresh_dra_ownership(&self) -> Option<std::time::SystemTime> {
        let mut dra = self.dra.lock();
        let (due, next) = dra.take_due(std::time::SystemTime::now());
        let _ = self.write_dra(&dra, due);
        next
    }

    /// What the ownership reconciler needs: per pool, whether some node the extender owns has
    /// a `Device` entry joined to it (the pool should carry the extender's rule), whether an
    /// annotation holds one of its joined devices (its rule must stay), and the extender's
    /// rules by pool.
    pub fn dra_ownership_plan(&self) -> DraOwnershipPlan {
        let (rules, defaced) = {
            let dra = self.dra.lock();
            (dra.rules_by_pool(), dra.defaced())
        };
        let entries: Vec<Arc<NodeEntry>> = self.nodes.read().values().cloned().collect();
        let mut plan = DraOwnershipPlan {
            rules,
            defaced,
            ..Default::default()
        };
        for entry in entries {
            let state = entry.read();
            let to_dra = state
                .node
                .as_ref()
                .and_then(|n| n.labels.get(crate::model::dra::DEVICE_OWNER_LABEL))
                .is_some_and(|v| v == "dra");
            for joined in state.devices.joined_pools() {
                // A pool only remembered (its slices gone) is wanted while a pod of ours holds
                // one of its devices: the rule must outlive a kubelet-style slice wipe.
                if !to_dra && (joined.published || joined.in_use) {
                    plan.wanted.insert(joined.pool.clone());
                }
                if joined.in_use {
                    plan.in_use.insert(joined.pool);
                }
            }
            // Without its Device object a node's recorded holdings cannot be joined: while
            // any remain, every pool published (or remembered) there keeps its rule.
            if state.devices.devices().is_none() && !state.devices.is_empty() {
                let dra = state.devices.dra();
                plan.in_use.extend(
                    dra.published
                        .values()
                        .chain(dra.former.values())
                        .flatten()
                        .cloned(),
                );
            }
        }
        plan
    }

    /// Claims with an allocation, and allocated devices no slice names.
    /// When the extender's rule `name` is taken to have been created (its hand-over grace
    /// counts from then).
    #[cfg(test)]
    pub(crate) fn dra_rule_created(&self, name: &str) -> Option<std::time::SystemTime> {
        self.dra.lock().rule_created(name)
    }

    pub fn dra_claim_counts(&self) -> (usize, usize) {
        self.dra.lock().claim_counts()
    }

    fn write_dra(
        &self,
        dra: &DraIndex,
        affected: std::collections::BTreeSet<Arc<str>>,
    ) -> Vec<(String, Overcommitted)> {
        let names = dra.extended_names();
        let mut conflicts = Vec::new();
        let mut affected = affected;
        if affected.remove(super::dra::ANY_NODE) {
            // A device a node selector reaches: every node's `Device` may state it.
            affected.extend(self.nodes.read().keys().cloned());
        }
        for n in affected {
            if !dra.knows_node(&n) && self.node(&n).is_none() {
                continue;
            }
            let holdings = dra.holdings(&n, std::time::SystemTime::now());
            let over = self.with_node(&n, |s| {
                s.dra_extended = names;
                s.cpus
                    .set_dra_cpu_drivers(holdings.cpu_drivers.iter().cloned().collect());
                s.devices.set_dra(holdings);
                s.devices.dra_conflicts()
            });
            if !over.is_empty() {
                conflicts.push((n.to_string(), over));
            }
            self.gc(&n);
        }
        conflicts
    }

    /// Deterministic JSON of every node (no timings), for comparing caches in tests.
    pub fn debug_dump(&self) -> BTreeMap<String, serde_json::Value> {
        let entries: Vec<_> = self.nodes.read().values().cloned().collect();
        let mut out = BTreeMap::new();
        for entry in entries {
            let state = entry.read();
            let mut v = state.debug_json(std::time::Instant::now());
            if let Some(entries) = v
                .pointer_mut("/devices/entries")
                .and_then(|e| e.as_object_mut())
            {
                for e in entries.values_mut() {
                    if let Some(o) = e.as_object_mut() {
                        o.remove("assumed_for_ms");
                    }
                }
            }
            out.insert(entry.name.to_string(), v);
        }
        out
    }

    /// Runs `f` under the write lock of `name`'s entry, creating it if needed; never on an
    /// entry [`Self::gc`] has removed (it retries with the live one).
    fn with_node<R>(&self, name: &str, f: impl FnOnce(&mut NodeState) -> R) -> R {
        loop {
            let entry = self.node_or_create(name);
            let mut state = entry.write();
            if !state.dead {
                let out = f(&mut state);
                self.written(name, &mut state);
                return out;
            }
        }
    }

    /// The version of the latest write to any node's state (0 before any): unchanged, nothing
    /// any node's state says has changed since it was read.
    pub fn last_version(&self) -> u64 {
        self.versions.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// After every write, under the node's write lock: a new version, published to the read
    /// snapshot once it is live (a dead entry publishes the node's removal).
    fn written(&self, name: &str, state: &mut NodeState) {
        if !state.dead {
            state.place_unknown_holders();
        }
        state.version = self
            .versions
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        if self.snapshots.is_live() {
            let summary = (!state.dead).then(|| state.summary());
            // Judged only while the requeue signal collects: nothing extra on the write path
            // with `--requeue=false` or offline.
            let returns = &self.returns;
            let returned = self
                .snapshots
                .publish(name, state.version, summary, |before, after| {
                    if returns.is_enabled() {
                        super::returns::returned(before, after)
                    } else {
                        super::returns::ResourceKinds::empty()
                    }
                });
            returns.record(name, returned);
        }
    }

    /// The read snapshot filter and prioritize decide on. The first call builds it if
    /// bootstrap has not (see [`Self::build_snapshot`]).
    /// Whether the read snapshot has been built (bootstrap, or the first read).
    pub fn snapshot_built(&self) -> bool {
        self.snapshots.is_built()
    }

    pub fn read_snapshot(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        if !self.snapshots.is_built() {
            self.build_snapshot();
        }
        self.snapshots.load()
    }

    /// Builds the read snapshot once, from every node (bootstrap calls this when every kind
    /// is synced, so the initial lists are applied without publishing per event). Writers
    /// publish from the moment it starts; what they publish meanwhile wins over this build
    /// when newer (versions).
    pub fn build_snapshot(&self) {
        let Some(building) = self.snapshots.start_build() else {
            return;
        };
        // Listed after `live` is set: an entry created later publishes itself.
        let entries: Vec<_> = self.nodes.read().values().cloned().collect();
        let summarize = |entries: &[Arc<NodeEntry>]| -> Vec<_> {
            entries
                .iter()
                .filter_map(|e| {
                    let state = e.read();
                    (!state.dead).then(|| (e.name.clone(), state.version, state.summary()))
                })
                .collect()
        };
        // Bootstrap waits for this (readiness flips after it): summarize on every core.
        let threads = if entries.len() >= PARALLEL_SNAPSHOT_MIN {
            PARALLEL_LIST_THREADS
        } else {
            1
        };
        let nodes = on_cores(&entries, threads, summarize);
        self.snapshots.install(nodes);
        self.snapshots.finish_build(building);
    }

    /// Whether the published snapshot equals one built now from the authoritative state
    /// (every node locked in turn); `Err` names the first difference. Only meaningful while
    /// no writer runs (tests).
    pub fn check_snapshot(&self) -> Result<(), String> {
        let snapshot = self.read_snapshot();
        let entries: Vec<_> = self.nodes.read().values().cloned().collect();
        let mut live = 0;
        for e in &entries {
            let state = e.read();
            if state.dead {
                continue;
            }
            live += 1;
            let want = state.summary();
            match snapshot.summary(&e.name) {
                None => return Err(format!("node {} missing from the snapshot", e.name)),
                Some(got) if got != want => {
                    return Err(format!(
                        "node {}: snapshot {got:?}, rebuilt {want:?}",
                        e.name
                    ));
                }
                Some(_) => {}
            }
        }
        if snapshot.len() != live {
            return Err(format!(
                "snapshot holds {} nodes, the caches {live}",
                snapshot.len()
            ));
        }
        Ok(())
    }

    /// Runs `f` under the write lock of `name`'s entry if there is one; `None` (and no entry
    /// created) otherwise. [`Self::assume`] uses this: a bind naming a node nothing else knows
    /// must not leave an empty entry behind that no event would ever collect.
    pub(super) fn with_existing_node<R>(
        &self,
        name: &str,
        f: impl FnOnce(&mut NodeState) -> R,
    ) -> Option<R> {
        loop {
            let entry = self.node(name)?;
            let mut state = entry.write();
            if !state.dead {
                let out = f(&mut state);
                self.written(name, &mut state);
                return Some(out);
            }
        }
    }

    /// [`Self::with_existing_node`], for tests outside the caches that build a node's state
    /// by hand (production code writes only through the caches' own methods).
    #[cfg(test)]
    pub(crate) fn edit_node_for_test<R>(
        &self,
        name: &str,
        f: impl FnOnce(&mut NodeState) -> R,
    ) -> Option<R> {
        self.with_existing_node(name, f)
    }

    /// Applies a pod add or update. `old` is the record the pod sync recorded for this key,
    /// which is what gets undone: never the pod's current annotations.
    pub fn upsert_pod(&self, old: Option<&PodRecord>, new: &PodRecord) {
        self.upsert_pod_shared(old, &Arc::new(new.clone()));
    }

    /// [`Self::upsert_pod`] keeping `new` itself (not a copy) in the node's pod map. Returns
    /// the minors the pod's allocation takes beyond their capacity (overcommitting
    /// annotations: counted, never refused — the pods hold them).
    pub fn upsert_pod_shared(
        &self,
        old: Option<&PodRecord>,
        new: &Arc<PodRecord>,
    ) -> Vec<(crate::model::device::DeviceType, i32)> {
        if let Some(old) = old {
            let same_holder = old.uid == new.uid && old.holding_node() == new.holding_node();
            if !same_holder {
                self.remove_pod(old);
            }
        }
        let Some(node) = new.holding_node() else {
            return Vec::new();
        };
        self.with_node(node, |s| record_pod(s, new, false))
    }

    /// Applies a first list of pods (nothing recorded for any of them: every one is an add,
    /// as [`Self::upsert_pod_shared`] with no `old`). Each pod touches only its own node, so
    /// the pods are grouped by node and each node is written once (one lookup, one lock, one
    /// version, its CPU ledger derived once), in the listed order within the node; large lists
    /// are spread over the available cores, node by node. The caches end up exactly as after
    /// applying the pods one by one. Returns the pods whose allocation overcommits, with the
    /// minors (as `upsert_pod_shared` returns them, checked in the same per-node order).
    pub fn upsert_listed_pods<'a>(
        &self,
        pods: impl Iterator<Item = &'a Arc<PodRecord>>,
    ) -> Vec<(Arc<PodRecord>, Overcommitted)> {
        let mut by_node: HashMap<&str, Vec<&Arc<PodRecord>>, ahash::RandomState> =
            HashMap::default();
        let mut listed = 0usize;
        for pod in pods {
            if let Some(node) = pod.holding_node() {
                by_node.entry(&**node).or_default().push(pod);
                listed += 1;
            }
        }
        let groups: Vec<(&str, Vec<&Arc<PodRecord>>)> = by_node.into_iter().collect();
        let apply = |groups: &[(&str, Vec<&Arc<PodRecord>>)]| {
            let mut over = Vec::new();
            for (node, pods) in groups {
                self.with_node(node, |s| {
                    for pod in pods {
                        let o = record_pod(s, pod, true);
                        if !o.is_empty() {
                            over.push((Arc::clone(pod), o));
                        }
                    }
                    s.cpus.finish_deferred();
                });
            }
            over
        };
        let threads = if listed >= PARALLEL_LIST_MIN {
            PARALLEL_LIST_THREADS
        } else {
            1
        };
        on_cores(&groups, threads, apply)
    }

    /// Undoes exactly what was recorded for `old`.
    pub fn remove_pod(&self, old: &PodRecord) {
        if let Some(node) = old.holding_node() {
            self.with_existing_node(node, |s| {
                s.pods.remove(&old.uid);
                s.devices.remove(&old.uid);
                s.devices.clear_unknown(&old.uid);
                s.cpus.remove(&old.uid);
            });
            self.gc(node);
        }
    }
}

/// Below this many listed pods the first list is applied on the calling thread.
const PARALLEL_LIST_MIN: usize = 4096;
/// Below this many nodes the read snapshot is built on the calling thread.
const PARALLEL_SNAPSHOT_MIN: usize = 512;
/// At most this many threads apply a first list or build the read snapshot.
const PARALLEL_LIST_THREADS: usize = 4;

/// Records one pod on its node (under the node's lock): the pod map and both ledgers; the
/// watch confirms what the pod holds, which replaces any assumed entry. With `defer_cpu`,
/// the CPU ledger's derived state is left for [`CpuLedger::finish_deferred`]. Returns the
/// minors the pod's allocation takes beyond their capacity.
fn record_pod(s: &mut NodeState, new: &Arc<PodRecord>, defer_cpu: bool) -> Overcommitted {
    s.pods.insert(new.uid.clone(), Arc::clone(new));
    // Listed now: its requests count from `pods`.
    s.assumed_cpu_milli.remove(&new.uid);
    // Known holders are judged against known holders alone; the unknown ones are placed again
    // after the write (`NodeState::place_unknown_holders`).
    s.devices.remove_unknown_entries();
    if let PodDevices::Unannotated(request) = &new.devices {
        s.devices.set_unknown(new.uid.clone(), Arc::clone(request));
    } else {
        s.devices.clear_unknown(&new.uid);
    }
    match &new.devices {
        PodDevices::None | PodDevices::Unannotated(_) => {
            s.devices.remove(&new.uid);
        }
        PodDevices::Allocated(a) => {
            s.devices.record(
                new.uid.clone(),
                RecordedAllocation::Allocated(a.clone()),
                EntryState::Committed,
            );
        }
        PodDevices::Malformed(reason) => {
            s.devices.record(
                new.uid.clone(),
                RecordedAllocation::Malformed {
                    reason: reason.clone(),
                },
                EntryState::Committed,
            );
        }
    }
    let cpus = match &new.cpus {
        PodCpus::None => None,
        PodCpus::Allocated(a) => Some(RecordedCpus::Allocated((**a).clone())),
        PodCpus::Malformed(reason) => Some(RecordedCpus::Malformed {
            reason: reason.clone(),
        }),
    };
    match (cpus, defer_cpu) {
        (None, false) => {
            s.cpus.remove(&new.uid);
        }
        (None, true) => {
            s.cpus.remove_deferred(&new.uid);
        }
        (Some(c), false) => {
            s.cpus.record(new.uid.clone(), c, EntryState::Committed);
        }
        (Some(c), true) => {
            s.cpus
                .record_deferred(new.uid.clone(), c, EntryState::Committed);
        }
    }
    match &new.devices {
        PodDevices::Allocated(a) => s.devices.overcommitted_by(a),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::pod::PodDevices;
    use crate::model::device::{
        Device, DeviceAllocation, DeviceAllocations, DeviceInfo, DeviceSpec, DeviceType, GPU_CORE,
        GPU_MEMORY_RATIO,
    };
    use crate::model::ids::ObjectKey;

    fn devices() -> NodeDevices {
        let device = Device {
            metadata: Default::default(),
            spec: DeviceSpec {
                devices: vec![DeviceInfo {
                    device_type: DeviceType::Gpu,
                    labels: None,
                    id: Some("GPU-0".into()),
                    minor: Some(0),
                    module_id: None,
                    health: true,
                    resources: Some(BTreeMap::from([
                        (GPU_CORE.to_string(), "100".to_string()),
                        (GPU_MEMORY_RATIO.to_string(), "100".to_string()),
                    ])),
                    topology: None,
                    vf_groups: vec![],
                }],
            },
        };
        NodeDevices::from_device(&device).0
    }

    fn pod(i: usize) -> PodRecord {
        let alloc = DeviceAllocations(BTreeMap::from([(
            DeviceType::Gpu,
            vec![DeviceAllocation {
                minor: 0,
                resources: BTreeMap::from([(
                    GPU_MEMORY_RATIO.to_string(),
                    crate::model::quantity::Quantity::from_milli(1000),
                )]),
                id: String::new(),
                extension: None,
            }],
        )]));
        PodRecord {
            uid: PodUid::new(format!("uid-{i}")),
            key: ObjectKey::namespaced("ns", &format!("p{i}")),
            node: Some(Arc::from("n")),
            phase: Some("Running".into()),
            requests: Default::default(),
            devices: PodDevices::Allocated(alloc),
            resource_status: None,
            cpus: Default::default(),
            priority: 0,
            labels: Default::default(),
        }
    }

    /// A first list applied grouped by node (and, this large, on several threads) leaves the
    /// caches exactly as applying its pods one by one in the same order: device and CPU
    /// ledgers, malformed annotations, terminal pods, a UID listed twice on one node.
    #[test]
    fn listed_pods_batch_equals_one_by_one() {
        use crate::model::koord_cpu::ResourceStatus;
        let cpus = |i: usize| {
            let s = ResourceStatus::parse(&format!(r#"{{"cpuset":"{}-{}"}}"#, i % 8, i % 8 + 1))
                .unwrap();
            PodCpus::Allocated(Box::new(super::super::cpus::CpuAllocation {
                cpuset: s.cpuset,
                numa: s.numa,
                exclusive: Default::default(),
            }))
        };
        let pods: Vec<Arc<PodRecord>> = (0..PARALLEL_LIST_MIN + 500)
            .map(|i| {
                let mut p = pod(i);
                p.node = Some(Arc::from(format!("n{}", i % 37).as_str()));
                if i % 3 == 0 {
                    p.devices = PodDevices::None;
                }
                if i % 5 == 0 {
                    p.cpus = cpus(i);
                }
                if i % 211 == 0 {
                    p.cpus = PodCpus::Malformed("bad".into());
                }
                if i % 307 == 0 {
                    p.devices = PodDevices::Malformed("bad".into());
                }
                if i % 401 == 0 {
                    p.phase = Some("Succeeded".into());
                }
                if i > 0 && i % 503 == 0 {
                    // Same UID as the previous pod on this node, another key.
                    p.uid = PodUid::new(format!("uid-{}", i - 37));
                }
                Arc::new(p)
            })
            .collect();
        let one_by_one = ClusterState::new();
        let mut want_over = Vec::new();
        for p in &pods {
            let o = one_by_one.upsert_pod_shared(None, p);
            if !o.is_empty() {
                want_over.push((p.key.to_string(), o));
            }
        }
        let batch = ClusterState::new();
        let mut got_over: Vec<_> = batch
            .upsert_listed_pods(pods.iter())
            .into_iter()
            .map(|(p, o)| (p.key.to_string(), o))
            .collect();
        want_over.sort();
        got_over.sort();
        assert_eq!(batch.debug_dump(), one_by_one.debug_dump());
        assert_eq!(got_over, want_over);
        assert_eq!(batch.node_count(), one_by_one.node_count());
    }

    /// A snapshot this large is summarized on several threads: it must hold every node, as
    /// built one by one.
    #[test]
    fn parallel_snapshot_build_holds_every_node() {
        let cluster = ClusterState::new();
        for i in 0..PARALLEL_SNAPSHOT_MIN * 2 + 3 {
            let name = format!("n{i}");
            if i % 2 == 0 {
                cluster.set_devices(&name, Some(devices()));
            }
            let mut p = pod(i);
            p.node = Some(Arc::from(name.as_str()));
            cluster.upsert_pod(None, &p);
        }
        cluster.build_snapshot();
        assert_eq!(cluster.read_snapshot().len(), PARALLEL_SNAPSHOT_MIN * 2 + 3);
        cluster.check_snapshot().unwrap();
    }

    /// Writers racing the node-entry GC must never land in an entry that is no
    /// longer in the map. Each round starts with no entry for the node; one thread owns its
    /// Device object (adds it, then deletes it, which collects the entry), the others each own
    /// one pod (add, remove, add: every remove may collect the entry too), all concurrently on
    /// the same node name. After each round the cache must equal a sequential replay of each
    /// owner's final object: no Device, every pod counted.
    #[test]
    fn gc_never_loses_a_concurrent_write() {
        const PODS: usize = 3;
        const ROUNDS: usize = 20_000;
        let cluster = Arc::new(ClusterState::new());
        let start = Arc::new(std::sync::Barrier::new(PODS + 2));
        let end = Arc::new(std::sync::Barrier::new(PODS + 2));
        let mut handles = Vec::new();
        {
            let (c, s, e) = (cluster.clone(), start.clone(), end.clone());
            handles.push(std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    s.wait();
                    c.set_devices("n", Some(devices()));
                    c.set_devices("n", None);
                    e.wait();
                }
            }));
        }
        for i in 0..PODS {
            let (c, s, e) = (cluster.clone(), start.clone(), end.clone());
            handles.push(std::thread::spawn(move || {
                let p = pod(i);
                for _ in 0..ROUNDS {
                    s.wait();
                    c.upsert_pod(None, &p);
                    c.remove_pod(&p);
                    c.upsert_pod(None, &p);
                    e.wait();
                }
            }));
        }
        let replay = ClusterState::new();
        for i in 0..PODS {
            replay.upsert_pod(None, &pod(i));
        }
        let want = replay.debug_dump();
        let mut lost = 0;
        for round in 0..ROUNDS {
            start.wait();
            end.wait();
            if cluster.debug_dump() != want {
                lost += 1;
                if lost == 1 {
                    eprintln!("round {round}: {:?}", cluster.debug_dump());
                }
            }
            for i in 0..PODS {
                cluster.remove_pod(&pod(i));
            }
            assert_eq!(
                cluster.node_count(),
                0,
                "round {round}: entry not collected"
            );
        }
        for h in handles {
            h.join().expect("worker panicked");
        }
        assert_eq!(
            lost, 0,
            "{lost} of {ROUNDS} rounds lost a write to a collected entry"
        );
    }
}
