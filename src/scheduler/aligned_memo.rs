//! One request's memo of what its device-aligned decisions share between nodes: filter's
//! aligned check and prioritize's aligned CPU score, for a pod whose devices must sit on the
//! NUMA nodes of its CPUs.
//!
//! The verbs' verdict memo (`scheduler::memo`) decides once per distinct pair of device and CPU
//! fingerprints. For such a pod that is every pair present, ~100 on a fleet in a few dozen
//! states, and each was a whole aligned decision (~0.45 µs over HTTP). But its two halves
//! vary apart:
//!
//! - **the device capacity** (per NUMA node, how many devices could take the request) is a
//!   function of the node's device facts and the pod: one per device fingerprint;
//! - **the CPU side** (the NUMA hint choice, [`crate::placement::cpu::fast_aligned`]) is a
//!   deterministic function of the node's CPU facts, the pod, and the devices' answers to
//!   the masks it asks about (`do the devices fit within this mask?`). So per CPU
//!   fingerprint this keeps each decision's transcript: the masks asked, in order, with
//!   their answers, and the result. For another node with the same CPU facts whose devices
//!   answer every recorded question the same way, the decision would ask exactly those
//!   questions (each question depends only on the CPU facts and the earlier answers) and end
//!   in the same result; so the result is replayed after asking only those masks of the
//!   node's capacity, a few sums.
//!
//! Equal fingerprints mean equal facts (`cluster::snapshot::Fingerprint`), as for the verdict
//! memo. Debug builds decide every replayed answer again in full and compare. Tests: a
//! property test (`scheduler::aligned_tests`) holds a shared memo's answers to each node's own
//! full decision over random fleets of a few device and CPU states; the verbs' memo property
//! (`it::memo`, whose fleets include CPU twins with every GPU held) holds a request's answers
//! to each node's alone. Replaying on the first recorded answer only fails both.
//!
//! Bounded: [`MAX_KEYS`] fingerprints per half and [`MAX_TRANSCRIPTS`] transcripts per CPU
//! fingerprint; past that a decision is made in full and not kept (a fleet of distinct
//! nodes). Per request only: nothing here outlives the request's snapshot. Owns no placement
//! logic: the decisions themselves are the callers'.

use std::fmt::Debug;

use hashbrown::HashTable;

use crate::cluster::snapshot::Fingerprint;
use crate::placement::cpu::NumaMask;
use crate::placement::device::fast::{self as fast_device, Capacity, FastRequest};
use crate::placement::device::index::DeviceIndexRef;

/// Fingerprints kept per half.
const MAX_KEYS: usize = 64;
/// Transcripts kept per CPU fingerprint.
const MAX_TRANSCRIPTS: usize = 8;

/// One CPU-side decision: the masks it asked the devices about, in order, with their answers,
/// and what it decided.
struct Transcript<R> {
    asked: Vec<(NumaMask, bool)>,
    result: R,
}

/// See the module header. `R`: what the CPU side decides (filter: the affinity or the error;
/// prioritize: the score).
pub struct AlignedMemo<R> {
    capacity: HashTable<(u128, Capacity)>,
    transcripts: HashTable<(u128, Vec<Transcript<R>>)>,
    /// Decisions replayed from a transcript (tests).
    replayed: u32,
}

impl<R> Default for AlignedMemo<R> {
    fn default() -> Self {
        AlignedMemo {
            capacity: HashTable::new(),
            transcripts: HashTable::new(),
            replayed: 0,
        }
    }
}

impl<R: Clone + PartialEq + Debug> AlignedMemo<R> {
    /// The node's device capacity for `fast` and the CPU side's result, where `cpu_side(f)`
    /// decides with `f` answering "do the devices fit within this mask". `fingerprint` is the
    /// node's; `index` and the facts `cpu_side` reads must be the node's too.
    pub fn decide_aligned(
        &mut self,
        fingerprint: Fingerprint,
        index: DeviceIndexRef<'_>,
        fast: &FastRequest,
        cpu_side: impl Fn(&mut dyn FnMut(NumaMask) -> bool) -> R,
    ) -> (R, Capacity) {
        let capacity = self.capacity(fingerprint.devices, index, fast);
        let mut answer = |mask: NumaMask| capacity.within(fast, Some(mask)).is_ok();
        let hash = fingerprint.cpu as u64;
        let room = self.transcripts.len() < MAX_KEYS;
        let known = self
            .transcripts
            .find_mut(hash, |(k, _)| *k == fingerprint.cpu);
        if let Some((_, transcripts)) = &known
            && let Some(t) = transcripts
                .iter()
                .find(|t| t.asked.iter().all(|&(mask, yes)| answer(mask) == yes))
        {
            let result = t.result.clone();
            self.replayed += 1;
            if cfg!(debug_assertions) {
                assert_eq!(
                    result,
                    cpu_side(&mut answer),
                    "a replayed aligned decision differs from the node's own"
                );
            }
            return (result, capacity);
        }
        let keep = match &known {
            Some((_, transcripts)) => transcripts.len() < MAX_TRANSCRIPTS,
            None => room,
        };
        if !keep {
            // Nowhere to keep it (a fleet of distinct nodes): decide without recording.
            return (cpu_side(&mut answer), capacity);
        }
        let mut asked = Vec::new();
        let result = cpu_side(&mut |mask| {
            let yes = answer(mask);
            asked.push((mask, yes));
            yes
        });
        let transcript = Transcript {
            asked,
            result: result.clone(),
        };
        match known {
            Some((_, transcripts)) => transcripts.push(transcript),
            None => {
                self.transcripts.insert_unique(
                    hash,
                    (fingerprint.cpu, vec![transcript]),
                    |(k, _)| *k as u64,
                );
            }
        }
        (result, capacity)
    }

    /// The device capacity of a node with device fingerprint `key` and index `index`.
    fn capacity(&mut self, key: u128, index: DeviceIndexRef<'_>, fast: &FastRequest) -> Capacity {
        // The fingerprints are uniform: their low bits are the hash.
        let hash = key as u64;
        if let Some((_, known)) = self.capacity.find(hash, |(k, _)| *k == key) {
            return known.clone();
        }
        let capacity = fast_device::capacity(index, fast);
        if self.capacity.len() < MAX_KEYS {
            self.capacity
                .insert_unique(hash, (key, capacity.clone()), |(k, _)| *k as u64);
        }
        capacity
    }

    /// Decisions answered by replaying a transcript (tests).
    #[cfg(test)]
    pub fn replayed(&self) -> u32 {
        self.replayed
    }

    /// Device and CPU fingerprints kept (tests).
    #[cfg(test)]
    pub fn kept(&self) -> (usize, usize) {
        (self.capacity.len(), self.transcripts.len())
    }
}
