//! koordinator-compatible device placement (DeviceShare): request normalisation, allocation and
//! scoring. Pure and deterministic; reads its own views of a node ([`inventory::DeviceHoldings`]
//! for the full allocator, [`index::DeviceIndexRef`] for the fast path), which the caches
//! build. Never imports the caches.

pub mod allocate;
pub mod fast;
pub mod index;
pub mod inventory;
pub mod request;
pub mod score;

use crate::model::pod::Pod;
use crate::model::requests::pod_requests;

/// A pod's device request from its spec and annotations; `Ok(None)` when it needs no devices.
/// The error names the offending resource.
pub fn pod_device_request(pod: &Pod) -> Result<Option<request::PodDeviceRequest>, String> {
    let requests = pod_requests(&pod.spec).map_err(|e| format!("invalid pod resources: {e}"))?;
    request::parse_device_request(&requests, pod.metadata.annotations.as_ref())
        .map_err(|e| e.to_string())
}
