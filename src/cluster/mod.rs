//! The caches: per-node state (Node, topology, pods, device ledger) behind per-node locks,
//! the lifecycle records of assumed allocations (`assumed`), and the read snapshot that
//! filter and prioritize decide on (`snapshot`), which every write publishes to.
//!
//! Everything here is in-memory bookkeeping. It must never call the network or decide where
//! a pod goes; sync writes into it and placement reads views of it.

pub mod assumed;
pub mod cpus;
pub mod devices;
pub mod pod;
pub mod returns;
pub mod snapshot;
pub mod state;
pub mod view;

pub use pod::PodRecord;
pub use state::{ClusterState, NodeEntry, NodeRecord, NodeState, TopologyRecord};
