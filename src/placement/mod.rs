//! Pure placement logic: request parsing, device fit, choice and scoring. No I/O, no locks, no
//! mutation of caches; callers pass views and record results themselves.

pub mod arith;
pub mod cpu;
pub mod device;
pub mod fit_error;
pub mod routing;

pub use fit_error::{FitError, FitReason};
