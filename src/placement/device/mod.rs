//! koordinator-compatible device placement (DeviceShare): request normalisation, allocation and
//! scoring. Pure and deterministic; reads a [`crate::cluster::devices::DeviceLedger`], never
//! mutates it.

pub mod allocate;
pub mod request;
pub mod score;
