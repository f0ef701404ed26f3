//! [`CpuSet`]: a fixed-size set of logical CPU ids, with the Linux list form
//! (`0-3,8,10-11`) that cgroups, koordlet and the kubelet all use.
//!
//! Fixed-size (1,024 CPUs, 128 bytes, `Copy`) so the NUMA hint enumeration and the filter fast
//! path can copy and combine sets without allocating. Ids at or above [`CpuSet::CAPACITY`] are
//! rejected at parse time with an error naming the id, never truncated. This module owns the
//! type and its text form only; it knows nothing about topology.

use std::fmt;
use std::str::FromStr;

/// A logical CPU id as Linux numbers it (`/sys/devices/system/cpu/cpuN`).
pub type CpuId = u32;

const WORDS: usize = 16;

/// A set of logical CPU ids below [`CpuSet::CAPACITY`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CpuSet {
    words: [u64; WORDS],
}

/// Why a CPU list did not parse. Each variant names the offending part of the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetError {
    #[error("invalid CPU list element {element:?}: not a number or range")]
    NotANumber { element: String },
    #[error("invalid CPU range {element:?}: start is after end")]
    ReversedRange { element: String },
    #[error(
        "CPU id {id} is out of range (this service supports ids below {})",
        CpuSet::CAPACITY
    )]
    OutOfRange { id: u64 },
}

impl CpuSet {
    /// One more than the largest CPU id a set can hold.
    pub const CAPACITY: CpuId = (WORDS * 64) as CpuId;

    pub const fn new() -> Self {
        CpuSet { words: [0; WORDS] }
    }

    /// Builds a set from ids; `Err` names the first id out of range.
    pub fn try_from_ids(ids: impl IntoIterator<Item = CpuId>) -> Result<Self, CpuSetError> {
        let mut set = CpuSet::new();
        for id in ids {
            if !set.try_insert(id) {
                return Err(CpuSetError::OutOfRange { id: id.into() });
            }
        }
        Ok(set)
    }

    /// Inserts `id`; false (and no change) when it is out of range.
    pub fn try_insert(&mut self, id: CpuId) -> bool {
        if id >= Self::CAPACITY {
            return false;
        }
        self.words[(id / 64) as usize] |= 1 << (id % 64);
        true
    }

    /// Inserts `id`.
    ///
    /// # Panics
    /// When `id >= CAPACITY`: callers insert ids that came from a [`CpuSet`] or a validated
    /// topology; untrusted ids go through [`CpuSet::try_insert`] or [`str::parse`].
    pub fn insert(&mut self, id: CpuId) {
        assert!(self.try_insert(id), "CPU id {id} out of range");
    }

    pub fn remove(&mut self, id: CpuId) {
        if id < Self::CAPACITY {
            self.words[(id / 64) as usize] &= !(1 << (id % 64));
        }
    }

    pub fn contains(&self, id: CpuId) -> bool {
        id < Self::CAPACITY && self.words[(id / 64) as usize] & (1 << (id % 64)) != 0
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        self.zip(other, |a, b| a | b)
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        self.zip(other, |a, b| a & b)
    }

    /// `self` without the CPUs of `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        self.zip(other, |a, b| a & !b)
    }

    pub fn is_disjoint(&self, other: &CpuSet) -> bool {
        self.intersection(other).is_empty()
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.difference(other).is_empty()
    }

    /// Ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = CpuId> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &word)| {
            let mut w = word;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros();
                w &= w - 1;
                Some(i as CpuId * 64 + bit)
            })
        })
    }

    /// The lowest id, if any.
    pub fn first(&self) -> Option<CpuId> {
        self.iter().next()
    }

    fn zip(&self, other: &CpuSet, f: impl Fn(u64, u64) -> u64) -> CpuSet {
        let mut words = [0; WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            *w = f(self.words[i], other.words[i]);
        }
        CpuSet { words }
    }
}

impl FromIterator<CpuId> for CpuSet {
    /// # Panics
    /// On an id out of range; see [`CpuSet::insert`].
    fn from_iter<I: IntoIterator<Item = CpuId>>(iter: I) -> Self {
        let mut set = CpuSet::new();
        for id in iter {
            set.insert(id);
        }
        set
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetError;

    /// Parses the Linux list form: comma-separated ids and inclusive `a-b` ranges, in any order,
    /// overlaps allowed; the empty string (and surrounding whitespace) is the empty set.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut set = CpuSet::new();
        let s = s.trim();
        if s.is_empty() {
            return Ok(set);
        }
        for element in s.split(',') {
            let element = element.trim();
            let number = |t: &str| -> Result<u64, CpuSetError> {
                t.trim()
                    .parse::<u64>()
                    .map_err(|_| CpuSetError::NotANumber {
                        element: element.to_string(),
                    })
            };
            let (start, end) = match element.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => {
                    let n = number(element)?;
                    (n, n)
                }
            };
            if start > end {
                return Err(CpuSetError::ReversedRange {
                    element: element.to_string(),
                });
            }
            if end >= u64::from(Self::CAPACITY) {
                return Err(CpuSetError::OutOfRange { id: end });
            }
            for id in start..=end {
                set.insert(id as CpuId);
            }
        }
        Ok(set)
    }
}

impl fmt::Display for CpuSet {
    /// The canonical Linux list form: ascending, runs of two or more as `a-b`
    /// (`0-3,8,10-11`); the empty set is the empty string.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut run: Option<(CpuId, CpuId)> = None;
        let mut first = true;
        let mut flush = |f: &mut fmt::Formatter<'_>, (a, b): (CpuId, CpuId)| -> fmt::Result {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if a == b {
                write!(f, "{a}")
            } else {
                write!(f, "{a}-{b}")
            }
        };
        for id in self.iter() {
            run = match run {
                Some((a, b)) if b + 1 == id => Some((a, id)),
                Some(r) => {
                    flush(f, r)?;
                    Some((id, id))
                }
                None => Some((id, id)),
            };
        }
        if let Some(r) = run {
            flush(f, r)?;
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl serde::Serialize for CpuSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for CpuSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(s: &str) -> CpuSet {
        s.parse().unwrap()
    }

    #[test]
    fn formats_runs_as_ranges() {
        assert_eq!(set("0,1,2,3,8,10,11").to_string(), "0-3,8,10-11");
        assert_eq!(set("35-36,67-68").to_string(), "35-36,67-68");
        assert_eq!(set("").to_string(), "");
        assert_eq!(set("5").to_string(), "5");
        assert_eq!(set("1023").to_string(), "1023");
        assert_eq!(set("63-64").to_string(), "63-64");
    }

    #[test]
    fn parses_unordered_overlapping_and_spaced_lists() {
        assert_eq!(set(" 8, 0-3 ,2-4 ").to_string(), "0-4,8");
        assert_eq!(set("\n").len(), 0);
    }

    #[test]
    fn rejects_bad_lists_naming_the_element() {
        assert_eq!(
            "0-3,x".parse::<CpuSet>(),
            Err(CpuSetError::NotANumber {
                element: "x".into()
            })
        );
        assert_eq!(
            "5-2".parse::<CpuSet>(),
            Err(CpuSetError::ReversedRange {
                element: "5-2".into()
            })
        );
        assert_eq!(
            "0,1024".parse::<CpuSet>(),
            Err(CpuSetError::OutOfRange { id: 1024 })
        );
        assert_eq!(
            "0-99999999999".parse::<CpuSet>(),
            Err(CpuSetError::OutOfRange { id: 99999999999 })
        );
        assert!("-1".parse::<CpuSet>().is_err());
        assert!("1,,2".parse::<CpuSet>().is_err());
        assert!("1-".parse::<CpuSet>().is_err());
    }

    #[test]
    fn set_operations() {
        let a = set("0-7");
        let b = set("4-11");
        assert_eq!(a.union(&b), set("0-11"));
        assert_eq!(a.intersection(&b), set("4-7"));
        assert_eq!(a.difference(&b), set("0-3"));
        assert!(!a.is_disjoint(&b));
        assert!(set("4-5").is_subset(&a));
        assert_eq!(a.first(), Some(0));
        let mut c = a;
        c.remove(0);
        c.remove(5000);
        assert_eq!(c, set("1-7"));
        assert!(!c.try_insert(CpuSet::CAPACITY));
    }

    #[test]
    fn serde_uses_the_list_form() {
        let s = set("0-3,8");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"0-3,8\"");
        assert_eq!(serde_json::from_str::<CpuSet>("\"0-3,8\"").unwrap(), s);
        assert!(serde_json::from_str::<CpuSet>("\"0-x\"").is_err());
    }

    proptest! {
        #[test]
        fn list_form_round_trips(ids in proptest::collection::btree_set(0u32..CpuSet::CAPACITY, 0..200)) {
            let s: CpuSet = ids.iter().copied().collect();
            let text = s.to_string();
            let back: CpuSet = text.parse().unwrap();
            prop_assert_eq!(back, s);
            prop_assert_eq!(back.iter().collect::<std::collections::BTreeSet<_>>(), ids.clone());
            prop_assert_eq!(back.len(), ids.len());
        }

        #[test]
        fn parse_never_panics(text in "[0-9, \\-]{0,40}") {
            let _ = text.parse::<CpuSet>();
        }
    }
}
