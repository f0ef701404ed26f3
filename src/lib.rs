//! device-numa-extender: a kube-scheduler HTTP extender that gives a stock kube-scheduler
//! koordinator-compatible GPU/device sharing and NUMA-aware CPU placement.
//!
//! Layout (dependency direction is downwards only):
//! - [`extender`]: HTTP surface (axum router, wire types, probes, handlers).
//! - [`bind`]: commits an allocation (lock node, allocate, assume, patch pod, bind).
//! - [`fit`]: the combined device + CPU/NUMA decision for one pod on one node.
//! - [`sync`]: force-synced bootstrap: watchers or a cluster file feeding buffer-and-diff per kind.
//! - [`placement`]: pure placement logic; no I/O.
//! - [`cluster`]: the caches (per-node state behind per-node locks); never touches the network.
//! - [`model`]: the slim API object types we decode, and quantity parsing.
//! - [`metrics`]: the prometheus registry.
//! - [`ops`]: operator tools (`inspect`, `simulate`, capacity gauges) on top of the above.

pub mod api_calls;
pub mod app;
pub mod bind;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod extender;
pub mod fit;
pub mod leader;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod placement;
pub mod sync;
