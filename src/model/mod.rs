//! The API objects this service decodes, as slim hand-written serde types.
//!
//! We decode only the fields placement and accounting need: a full `k8s_openapi` Pod costs far
//! more to deserialize and to keep, and the bootstrap budget is set by decode cost. Every type
//! here implements `kube::Resource` by hand so kube-runtime watchers can stream it directly.
//! This module owns no state and performs no I/O.

pub mod device;
pub mod ids;
pub mod pod;
pub mod quantity;
pub mod requests;
