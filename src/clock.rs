//! A clock that keeps counting while the machine is suspended (`CLOCK_BOOTTIME` on Linux), for
//! lease expiry: `std::time::Instant` (`CLOCK_MONOTONIC`) stops during a VM suspend, so a
//! leader resumed after longer than its lease would still believe it holds it while a standby
//! has taken over. Elsewhere it falls back to the monotonic clock.
//!
//! This module only reads the clock; sleeping stays with tokio (a sleep may overrun across a
//! suspend, which is why deadlines are compared with this clock, not waited out).

use std::ops::Add;
use std::time::Duration;

/// A point on the suspend-counting clock, as time since an arbitrary origin (boot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(Duration);

impl BootInstant {
    #[cfg(target_os = "linux")]
    pub fn now() -> BootInstant {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists since Linux 2.6.39.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
        BootInstant(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    #[cfg(not(target_os = "linux"))]
    pub fn now() -> BootInstant {
        use std::sync::OnceLock;
        static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
        BootInstant(ORIGIN.get_or_init(std::time::Instant::now).elapsed())
    }

    /// Time since `earlier`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    pub fn elapsed(self) -> Duration {
        BootInstant::now().saturating_duration_since(self)
    }

    /// Nanoseconds since the origin (for atomics); never 0 after boot.
    pub fn as_nanos(self) -> u64 {
        self.0.as_nanos().min(u64::MAX as u128) as u64
    }

    pub fn from_nanos(nanos: u64) -> BootInstant {
        BootInstant(Duration::from_nanos(nanos))
    }
}

impl Add<Duration> for BootInstant {
    type Output = BootInstant;
    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0 + d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_forward_and_adds() {
        let a = BootInstant::now();
        let b = BootInstant::now();
        assert!(b >= a);
        assert!(a.as_nanos() > 0);
        let later = a + Duration::from_secs(5);
        assert_eq!(later.saturating_duration_since(a), Duration::from_secs(5));
        assert_eq!(a.saturating_duration_since(later), Duration::ZERO);
        assert_eq!(BootInstant::from_nanos(a.as_nanos()), a);
    }
}
