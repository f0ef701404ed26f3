//! The single integration-test binary (one link step instead of one per test file).
//! Add new test modules here.

#[path = "../support/mod.rs"]
mod support;

mod api_calls;
mod binary;
mod chaos_found;
mod connections;
mod dra;
mod error_metrics;
mod fake_apiserver;
mod fuzz;
mod gpu;
mod hints;
mod hostile;
mod late_binding;
mod leader;
mod leak;
mod memo;
mod nominated;
mod numa;
mod outage;
mod partitions;
mod ranking;
mod readiness;
mod requeue;
mod scale;
mod share_totals;
mod smoke;
mod sync;
mod sync_prop;
mod tls;
mod victims;
mod wire;
// Out of alphabetical order on purpose: parallel branches add modules above.
mod fragmentation;
mod ops;
mod pending;
