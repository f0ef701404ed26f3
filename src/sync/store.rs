//! Buffer-and-diff per kind: the one place a stream of [`SyncEvent`]s becomes cache changes.
//!
//! Each object key owns exactly one recorded contribution. `Init` starts a fresh buffer (also
//! mid-list), `InitApply` fills it, `InitDone` diffs it against the recorded set: missing keys
//! are deletions undone from the *recorded* record, new keys adds, a changed UID or
//! resourceVersion an update, an equal resourceVersion a no-op. resourceVersions are compared
//! only for equality: they are opaque. The old state stays authoritative until the diff.
//!
//! This module knows nothing of kube or files; sources feed it, handlers apply to the caches.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use prometheus::IntCounter;

use super::kind::{Kind, SyncEvent};
use super::readiness::Readiness;
use crate::metrics::Metrics;

/// The store's maps are keyed by API object names: a fast, still randomly seeded hasher
/// (SipHash was ~12% of bootstrap CPU).
type Map<V> = HashMap<Arc<str>, V, ahash::RandomState>;

/// An object reduced to what the cache keeps, plus its identity. Key and UID are shared
/// (`Arc<str>`) so a handler can hand over strings its record already holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded<R> {
    pub key: Arc<str>,
    pub uid: Arc<str>,
    pub resource_version: String,
    pub record: R,
}

/// What is kept per key: the map key is the object key, so it is not stored again.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded<R> {
    pub uid: Arc<str>,
    pub resource_version: String,
    pub record: R,
}

impl<R> Decoded<R> {
    fn split(self) -> (Arc<str>, Recorded<R>) {
        (
            self.key,
            Recorded {
                uid: self.uid,
                resource_version: self.resource_version,
                record: self.record,
            },
        )
    }
}

/// Why an object could not be used; counted per reason and skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invalid(pub &'static str);

/// Applies one kind's records to the caches. `apply` and `remove` must be idempotent per key.
pub trait Handler: Send + 'static {
    type Object: Send + 'static;
    type Record: Clone + Send + Sync + 'static;
    const KIND: Kind;

    fn decode(&self, object: &Self::Object) -> Result<Decoded<Self::Record>, Invalid>;
    fn apply(&self, key: &str, old: Option<&Self::Record>, new: &Self::Record);
    fn remove(&self, key: &str, old: &Self::Record);
    /// Applies a list over an empty recorded set: every listed key is an add (`apply` with no
    /// `old`). Handlers whose adds are independent of each other may batch them; the result
    /// must equal applying them one by one in the iterator's order.
    fn apply_listed<'a>(&self, listed: impl Iterator<Item = (&'a str, &'a Self::Record)>)
    where
        Self::Record: 'a,
    {
        for (key, record) in listed {
            self.apply(key, None, record);
        }
    }
    /// A (re)list's `Init` arrived; the list itself is requested only after this returns.
    fn relist_started(&self) {}
    /// The (re)list's `InitDone` was applied; `listed` is every record the list held.
    fn relist_done(&self, _listed: &mut dyn Iterator<Item = &Self::Record>) {}
}

/// `dne_events_applied_total{kind, event}` for one kind, looked up once instead of per object.
struct Counters {
    add: IntCounter,
    update: IntCounter,
    noop: IntCounter,
    delete: IntCounter,
}

impl Counters {
    fn new(metrics: &Metrics, kind: Kind) -> Self {
        let c = |event: &str| {
            metrics
                .events_applied
                .with_label_values(&[kind.as_str(), event])
        };
        Counters {
            add: c("add"),
            update: c("update"),
            noop: c("noop"),
            delete: c("delete"),
        }
    }
}

pub struct KindSync<H: Handler> {
    handler: H,
    recorded: Map<Recorded<H::Record>>,
    buffer: Option<Map<Recorded<H::Record>>>,
    readiness: Arc<Readiness>,
    metrics: Metrics,
    counters: Counters,
}

impl<H: Handler> KindSync<H> {
    pub fn new(handler: H, readiness: Arc<Readiness>, metrics: Metrics) -> Self {
        KindSync {
            handler,
            recorded: Map::default(),
            buffer: None,
            readiness,
            counters: Counters::new(&metrics, H::KIND),
            metrics,
        }
    }

    pub fn readiness(&self) -> &Arc<Readiness> {
        &self.readiness
    }

    pub fn len(&self) -> usize {
        self.recorded.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recorded.is_empty()
    }

    /// Every recorded key with what was recorded for it.
    pub fn recorded(&self) -> impl Iterator<Item = (&str, &Recorded<H::Record>)> {
        self.recorded.iter().map(|(k, v)| (&**k, v))
    }

    fn decode(&self, object: &H::Object) -> Option<Decoded<H::Record>> {
        match self.handler.decode(object) {
            Ok(d) => Some(d),
            Err(Invalid(reason)) => {
                tracing::warn!(kind = %H::KIND, reason, "ignoring unusable object");
                self.metrics
                    .invalid_objects
                    .with_label_values(&[H::KIND.as_str(), reason])
                    .inc();
                None
            }
        }
    }

    pub fn handle(&mut self, event: SyncEvent<H::Object>) {
        match event {
            SyncEvent::Init => {
                if self.buffer.is_some() {
                    tracing::info!(kind = %H::KIND, "relist restarted before completing; dropping partial buffer");
                }
                self.buffer = Some(Map::with_capacity_and_hasher(
                    self.recorded.len(),
                    Default::default(),
                ));
                self.readiness.on_init(H::KIND);
                self.handler.relist_started();
            }
            SyncEvent::InitApply(object) => {
                let Some(decoded) = self.decode(&object) else {
                    return;
                };
                match self.buffer.as_mut() {
                    Some(buffer) => {
                        let (key, entry) = decoded.split();
                        buffer.insert(key, entry);
                        self.readiness.on_init_apply(H::KIND);
                    }
                    // kube's watcher never does this; a source bug must not lose the object.
                    None => self.apply_one(decoded),
                }
            }
            SyncEvent::InitDone => {
                // Without a buffer there was no Init: diffing "nothing listed" would delete
                // every object of the kind. kube's watcher never does this; a source bug must
                // not wipe the cache.
                let Some(buffer) = self.buffer.take() else {
                    tracing::error!(kind = %H::KIND, "InitDone without Init: ignored");
                    self.metrics
                        .sync_protocol_errors
                        .with_label_values(&[H::KIND.as_str(), "init_done_without_init"])
                        .inc();
                    return;
                };
                let replayed = buffer.len() as u64;
                self.diff(buffer);
                self.handler
                    .relist_done(&mut self.recorded.values().map(|r| &r.record));
                self.metrics
                    .cached_objects
                    .with_label_values(&[H::KIND.as_str()])
                    .set(self.recorded.len() as i64);
                self.readiness
                    .on_init_done(H::KIND, replayed, self.recorded.len() as u64);
            }
            SyncEvent::Apply(object) => {
                if let Some(decoded) = self.decode(&object) {
                    self.apply_one(decoded);
                    self.after_live_change();
                }
            }
            SyncEvent::Delete(object) => {
                if let Some(decoded) = self.decode(&object) {
                    self.delete_key(&decoded.key);
                    self.after_live_change();
                }
            }
        }
    }

    fn after_live_change(&self) {
        let n = self.recorded.len();
        self.metrics
            .cached_objects
            .with_label_values(&[H::KIND.as_str()])
            .set(n as i64);
        self.readiness.on_applied(H::KIND, n as u64);
    }

    fn apply_one(&mut self, new: Decoded<H::Record>) {
        let (key, new) = new.split();
        self.apply_entry(key, new);
    }

    /// One hash lookup per key: an equal UID and resourceVersion is a no-op, anything else is
    /// applied with the recorded record as `old` and then recorded.
    fn apply_entry(&mut self, key: Arc<str>, new: Recorded<H::Record>) {
        match self.recorded.entry(key) {
            Entry::Occupied(mut o) => {
                let old = o.get();
                if old.uid == new.uid && old.resource_version == new.resource_version {
                    self.counters.noop.inc();
                } else {
                    self.handler.apply(o.key(), Some(&old.record), &new.record);
                    self.counters.update.inc();
                    o.insert(new);
                }
            }
            Entry::Vacant(v) => {
                self.handler.apply(v.key(), None, &new.record);
                self.counters.add.inc();
                v.insert(new);
            }
        }
    }

    fn delete_key(&mut self, key: &str) {
        if let Some(old) = self.recorded.remove(key) {
            self.handler.remove(key, &old.record);
            self.counters.delete.inc();
        }
    }

    fn diff(&mut self, listed: Map<Recorded<H::Record>>) {
        if self.recorded.is_empty() {
            // Nothing recorded (the first list, or everything was deleted): every listed key
            // is an add, so apply them and keep the buffer itself as the recorded set instead
            // of re-inserting each entry into another map.
            self.handler
                .apply_listed(listed.iter().map(|(k, r)| (&**k, &r.record)));
            self.counters.add.inc_by(listed.len() as u64);
            self.recorded = listed;
            return;
        }
        let gone: Vec<Arc<str>> = self
            .recorded
            .keys()
            .filter(|k| !listed.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            self.delete_key(&key);
        }
        for (key, new) in listed {
            self.apply_entry(key, new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::collections::BTreeMap;

    /// (key, uid, rv, payload)
    type Obj = (&'static str, &'static str, &'static str, i32);

    #[derive(Clone, Default)]
    struct Sum(Arc<Mutex<BTreeMap<String, i32>>>);

    impl Handler for Sum {
        type Object = Obj;
        type Record = i32;
        const KIND: Kind = Kind::Nodes;
        fn decode(&self, o: &Obj) -> Result<Decoded<i32>, Invalid> {
            if o.1.is_empty() {
                return Err(Invalid("missing uid"));
            }
            Ok(Decoded {
                key: o.0.into(),
                uid: o.1.into(),
                resource_version: o.2.into(),
                record: o.3,
            })
        }
        fn apply(&self, key: &str, old: Option<&i32>, new: &i32) {
            let mut m = self.0.lock();
            let prev = m.insert(key.to_string(), *new);
            assert_eq!(prev.as_ref(), old, "handler saw a stale old record");
        }
        fn remove(&self, key: &str, old: &i32) {
            let prev = self.0.lock().remove(key);
            assert_eq!(prev.as_ref(), Some(old));
        }
    }

    fn sync() -> (KindSync<Sum>, Sum, Arc<Readiness>) {
        let metrics = Metrics::new();
        let readiness = Readiness::new(BTreeMap::new(), None, metrics.clone());
        let h = Sum::default();
        (
            KindSync::new(h.clone(), readiness.clone(), metrics),
            h,
            readiness,
        )
    }

    fn state(h: &Sum) -> BTreeMap<String, i32> {
        h.0.lock().clone()
    }

    #[test]
    fn relist_diffs_deletions_updates_and_noops() {
        let (mut s, h, r) = sync();
        s.handle(SyncEvent::Init);
        s.handle(SyncEvent::InitApply(("a", "u1", "1", 1)));
        s.handle(SyncEvent::InitApply(("b", "u2", "2", 2)));
        assert!(state(&h).is_empty(), "nothing applied before InitDone");
        s.handle(SyncEvent::InitDone);
        assert_eq!(
            state(&h),
            BTreeMap::from([("a".into(), 1), ("b".into(), 2)])
        );
        s.handle(SyncEvent::Apply(("c", "u3", "3", 3)));
        // Relist after a gap: b deleted, a recreated with a new uid, c unchanged.
        s.handle(SyncEvent::Init);
        s.handle(SyncEvent::InitApply(("a", "u9", "9", 10)));
        s.handle(SyncEvent::InitApply(("c", "u3", "3", 3)));
        assert_eq!(state(&h).len(), 3, "old state authoritative until InitDone");
        s.handle(SyncEvent::InitDone);
        assert_eq!(
            state(&h),
            BTreeMap::from([("a".into(), 10), ("c".into(), 3)])
        );
        assert_eq!(r.report().kinds[&Kind::Nodes].replayed, 2);
    }

    #[test]
    fn first_list_is_adopted_as_recorded_and_counted() {
        let metrics = Metrics::new();
        let readiness = Readiness::new(BTreeMap::new(), None, metrics.clone());
        let h = Sum::default();
        let mut s = KindSync::new(h.clone(), readiness, metrics.clone());
        let count = |event: &str| {
            metrics
                .events_applied
                .with_label_values(&["nodes", event])
                .get()
        };
        s.handle(SyncEvent::Init);
        s.handle(SyncEvent::InitApply(("a", "u1", "1", 1)));
        s.handle(SyncEvent::InitApply(("b", "u2", "2", 2)));
        // A key listed twice keeps its last version, as with any relist.
        s.handle(SyncEvent::InitApply(("a", "u1", "3", 3)));
        s.handle(SyncEvent::InitDone);
        assert_eq!(
            state(&h),
            BTreeMap::from([("a".into(), 3), ("b".into(), 2)])
        );
        assert_eq!((s.len(), count("add")), (2, 2));
        let mut rec: Vec<_> = s
            .recorded()
            .map(|(k, r)| (k.to_string(), r.resource_version.clone(), r.record))
            .collect();
        rec.sort();
        assert_eq!(
            rec,
            vec![("a".into(), "3".into(), 3), ("b".into(), "2".into(), 2)]
        );
        // Everything deleted live, then a relist: again nothing recorded, all adds.
        s.handle(SyncEvent::Delete(("a", "u1", "3", 3)));
        s.handle(SyncEvent::Delete(("b", "u2", "2", 2)));
        assert!(s.is_empty() && state(&h).is_empty());
        s.handle(SyncEvent::Init);
        s.handle(SyncEvent::InitApply(("c", "u3", "1", 5)));
        s.handle(SyncEvent::InitDone);
        assert_eq!(state(&h), BTreeMap::from([("c".into(), 5)]));
        assert_eq!((count("add"), count("delete")), (3, 2));
        // A relist over a recorded set diffs: one noop, one update.
        s.handle(SyncEvent::Apply(("d", "u4", "1", 6)));
        s.handle(SyncEvent::Init);
        s.handle(SyncEvent::InitApply(("c", "u3", "1", 5)));
        s.handle(SyncEvent::InitApply(("d", "u4", "2", 7)));
        s.handle(SyncEvent::InitDone);
        assert_eq!(
            state(&h),
            BTreeMap::from([("c".into(), 5), ("d".into(), 7)])
        );
        assert_eq!((count("noop"), count("update"), count("add")), (1, 1, 4));
    }

    #[test]
    fn init_mid_list_drops_the_partial_buffer() {
        let (mut s, h, _) = sync();
        s.handle(SyncEvent::Init);
        s.handle(SyncEvent::InitApply(("a", "u1", "1", 1)));
        s.handle(SyncEvent::Init);
        s.handle(SyncEvent::InitApply(("b", "u2", "2", 2)));
        s.handle(SyncEvent::InitDone);
        assert_eq!(state(&h), BTreeMap::from([("b".into(), 2)]));
    }

    #[test]
    fn duplicate_apply_and_unknown_delete_are_noops() {
        let (mut s, h, _) = sync();
        s.handle(SyncEvent::Init);
        s.handle(SyncEvent::InitDone);
        s.handle(SyncEvent::Apply(("a", "u1", "1", 1)));
        s.handle(SyncEvent::Apply(("a", "u1", "1", 1)));
        s.handle(SyncEvent::Delete(("zzz", "u5", "5", 5)));
        assert_eq!(state(&h), BTreeMap::from([("a".into(), 1)]));
        s.handle(SyncEvent::Delete(("a", "u1", "2", 1)));
        assert!(state(&h).is_empty());
    }

    /// An `InitDone` with no `Init` before it must not diff "nothing listed"
    /// against the cache (which deleted every object of the kind).
    #[test]
    fn init_done_without_init_is_ignored_and_counted() {
        let metrics = Metrics::new();
        let readiness = Readiness::new(BTreeMap::new(), None, metrics.clone());
        let h = Sum::default();
        let mut s = KindSync::new(h.clone(), readiness, metrics.clone());
        s.handle(SyncEvent::Init);
        s.handle(SyncEvent::InitApply(("a", "u1", "1", 1)));
        s.handle(SyncEvent::InitDone);
        s.handle(SyncEvent::Apply(("b", "u2", "1", 2)));
        s.handle(SyncEvent::InitDone);
        assert_eq!(
            state(&h),
            BTreeMap::from([("a".into(), 1), ("b".into(), 2)])
        );
        assert_eq!(s.len(), 2);
        assert_eq!(
            metrics
                .sync_protocol_errors
                .with_label_values(&["nodes", "init_done_without_init"])
                .get(),
            1
        );
    }

    #[test]
    fn invalid_objects_are_skipped_not_fatal() {
        let (mut s, h, _) = sync();
        s.handle(SyncEvent::Init);
        s.handle(SyncEvent::InitApply(("a", "", "1", 1)));
        s.handle(SyncEvent::InitApply(("b", "u2", "1", 2)));
        s.handle(SyncEvent::InitDone);
        assert_eq!(state(&h), BTreeMap::from([("b".into(), 2)]));
    }
}
