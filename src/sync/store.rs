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
use std::sync::Arc;

use super::kind::{Kind, SyncEvent};
use super::readiness::Readiness;
use crate::metrics::Metrics;

/// An object reduced to what the cache keeps, plus its identity.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded<R> {
    pub key: String,
    pub uid: String,
    pub resource_version: String,
    pub record: R,
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
}

pub struct KindSync<H: Handler> {
    handler: H,
    recorded: HashMap<String, Decoded<H::Record>>,
    buffer: Option<HashMap<String, Decoded<H::Record>>>,
    readiness: Arc<Readiness>,
    metrics: Metrics,
}

impl<H: Handler> KindSync<H> {
    pub fn new(handler: H, readiness: Arc<Readiness>, metrics: Metrics) -> Self {
        KindSync {
            handler,
            recorded: HashMap::new(),
            buffer: None,
            readiness,
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

    pub fn recorded(&self) -> impl Iterator<Item = &Decoded<H::Record>> {
        self.recorded.values()
    }

    fn count(&self, event: &str) {
        self.metrics
            .events_applied
            .with_label_values(&[H::KIND.as_str(), event])
            .inc();
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
                self.buffer = Some(HashMap::with_capacity(self.recorded.len()));
                self.readiness.on_init(H::KIND);
            }
            SyncEvent::InitApply(object) => {
                let Some(decoded) = self.decode(&object) else {
                    return;
                };
                match self.buffer.as_mut() {
                    Some(buffer) => {
                        buffer.insert(decoded.key.clone(), decoded);
                        self.readiness.on_init_apply(H::KIND);
                    }
                    // kube's watcher never does this; a source bug must not lose the object.
                    None => self.apply_one(decoded),
                }
            }
            SyncEvent::InitDone => {
                let buffer = self.buffer.take().unwrap_or_default();
                let replayed = buffer.len() as u64;
                self.diff(buffer);
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
        match self.recorded.get(&new.key) {
            Some(old) if old.uid == new.uid && old.resource_version == new.resource_version => {
                self.count("noop");
            }
            Some(old) => {
                self.handler.apply(&new.key, Some(&old.record), &new.record);
                self.count("update");
                self.recorded.insert(new.key.clone(), new);
            }
            None => {
                self.handler.apply(&new.key, None, &new.record);
                self.count("add");
                self.recorded.insert(new.key.clone(), new);
            }
        }
    }

    fn delete_key(&mut self, key: &str) {
        if let Some(old) = self.recorded.remove(key) {
            self.handler.remove(key, &old.record);
            self.count("delete");
        }
    }

    fn diff(&mut self, mut listed: HashMap<String, Decoded<H::Record>>) {
        let gone: Vec<String> = self
            .recorded
            .keys()
            .filter(|k| !listed.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            self.delete_key(&key);
        }
        for (_, new) in listed.drain() {
            self.apply_one(new);
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
