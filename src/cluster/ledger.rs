//! What the device and CPU ledgers share: pod-keyed entries, each recorded either as
//! *assumed* (by our bind, at an instant) or *committed* (seen by the pod watch), and the
//! assumed-entry lifecycle queries over them. The ledgers own what an entry adds to the node
//! (used devices, held CPUs); this module only keeps the entries and answers about their
//! state. Pure data: no locks, no network.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::model::ids::PodUid;

/// How an entry came to be recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryState {
    /// Recorded by our bind, not yet confirmed by the pod watch.
    Assumed { at: Instant },
    /// Seen on an assigned pod by the pod watch.
    Committed,
}

/// One pod's recorded allocation (`A`: the ledger's allocation type) and how it was recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry<A> {
    pub allocation: A,
    pub state: EntryState,
}

/// A ledger's entries by pod UID.
#[derive(Clone, Debug)]
pub struct Entries<A>(BTreeMap<PodUid, Entry<A>>);

impl<A> Default for Entries<A> {
    fn default() -> Self {
        Entries(BTreeMap::new())
    }
}

impl<A> Entries<A> {
    /// Records (or replaces) `uid`'s entry, returning the one it replaced.
    pub fn insert(&mut self, uid: PodUid, allocation: A, state: EntryState) -> Option<Entry<A>> {
        self.0.insert(uid, Entry { allocation, state })
    }

    pub fn remove(&mut self, uid: &PodUid) -> Option<Entry<A>> {
        self.0.remove(uid)
    }

    pub fn get(&self, uid: &PodUid) -> Option<&Entry<A>> {
        self.0.get(uid)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&PodUid, &Entry<A>)> {
        self.0.iter()
    }

    pub fn contains_key(&self, uid: &PodUid) -> bool {
        self.0.contains_key(uid)
    }

    pub fn values(&self) -> impl Iterator<Item = &Entry<A>> {
        self.0.values()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Assumed entries older than `ttl`, with the instant each was assumed.
    pub fn assumed_older_than(&self, now: Instant, ttl: Duration) -> Vec<(PodUid, Instant)> {
        self.0
            .iter()
            .filter_map(|(uid, e)| match e.state {
                EntryState::Assumed { at } if now.saturating_duration_since(at) >= ttl => {
                    Some((uid.clone(), at))
                }
                _ => None,
            })
            .collect()
    }

    /// Whether `uid`'s entry is still the one assumed at `at` (not committed by the watch or
    /// re-assumed by a later bind in the meantime): only then may a rollback remove it.
    pub fn is_assumed_at(&self, uid: &PodUid, at: Instant) -> bool {
        matches!(
            self.0.get(uid).map(|e| e.state),
            Some(EntryState::Assumed { at: a }) if a == at
        )
    }
}
