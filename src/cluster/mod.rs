//! The caches: per-node state (Node, topology, pods, device ledger) behind per-node locks,
//! the lifecycle records of assumed allocations (`assumed`), and the read snapshot that
//! filter and prioritize decide on (`snapshot`), which every write publishes to.
//!
//! Everything here is in-memory bookkeeping. It must never call the network or decide where
//! a pod goes; sync writes into it and placement reads views of it.

pub(crate) mod assumed;
pub mod budgets;
pub mod cpus;
pub mod devices;
pub mod dra;
pub(crate) mod ledger;
pub(crate) mod node;
pub mod nominated;
pub(crate) mod nrt;
mod parallel;
pub(crate) mod pod;
pub(crate) mod records;
pub mod report;
pub mod returns;
pub(crate) mod snapshot;
pub(crate) mod state;

pub use node::{NodeEntry, NodeState};
pub use pod::PodRecord;
pub use records::{NodeRecord, Overcommitted, TopologyRecord};
pub use state::{Assumption, ClusterState};
