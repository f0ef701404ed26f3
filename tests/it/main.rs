//! The single integration-test binary (one link step instead of one per test file).
//! Add new test modules here.

#[path = "../support/mod.rs"]
mod support;

mod api_calls;
mod binary;
mod fake_apiserver;
mod gpu;
mod leader;
mod readiness;
mod scale;
mod smoke;
mod sync;
mod sync_prop;
mod wire;
