//! device-numa-extender: a kube-scheduler HTTP extender that gives a stock kube-scheduler
//! koordinator-compatible GPU/device sharing and NUMA-aware CPU placement.
//!
//! Layout: see `ARCHITECTURE.md` at the repository root for the layers, the rule of each,
//! and the life of a request; `scripts/import_graph.py` checks that no import cycle exists.
//! - [`extender`]: HTTP surface (routers, listener, TLS, probes, handlers).
//! - [`scheduler`]: the scheduling core both front ends share: needs, the full decision, the
//!   snapshot fast path, the read verbs, bind (the one place that commits) and requeue.
//! - [`sync`]: force-synced bootstrap, readiness and the Kubernetes client.
//! - [`placement`]: pure placement logic; no I/O.
//! - [`cluster`]: the caches, the read snapshot and the operator view; never the network.
//! - [`model`]: the API types, annotations, policy vocabulary and the extender wire types.
//! - [`metrics`]: the prometheus registry.
//! - [`ops`]: operator tools (`inspect`, `simulate`, capacity gauges) on top of the above.

pub mod api_calls;
pub mod app;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod extender;
mod leader;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod placement;
pub mod scheduler;
pub mod sync;
