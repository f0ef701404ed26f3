//! Force-synced bootstrap: sources (kube watchers, or a cluster file) feed one ordered stream
//! per kind into buffer-and-diff ([`store`]), whose handlers ([`handlers`]) apply to the
//! caches, and [`readiness`] records when every required kind has applied its first list.

pub mod handlers;
pub mod kind;
pub mod readiness;
pub mod store;

pub use kind::{Kind, SyncEvent};
pub use readiness::{Readiness, Requirement};
