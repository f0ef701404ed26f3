//! koordinator-compatible device placement (DeviceShare): request normalisation, allocation and
//! scoring. Pure and deterministic; reads its own views of a node ([`inventory::DeviceHoldings`]
//! for the full allocator, [`index::DeviceIndexRef`] for the fast path), which the caches
//! build. Never imports the caches.

pub(crate) mod allocate;
pub mod deviceless;
pub mod dra_served;
pub(crate) mod fast;
pub mod fragmentation;
pub(crate) mod index;
pub(crate) mod inventory;
pub(crate) mod partition;
pub mod request;
pub mod score;
pub mod shortfall;

use crate::model::pod::Pod;
use crate::model::requests::{RequestError, pod_requests};

/// Why a pod's device request is invalid (on every node).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodDeviceRequestError {
    /// The pod's resource requests themselves do not parse.
    #[error("invalid pod resources: {0}")]
    Resources(#[from] RequestError),
    /// The device resources or annotations are not a valid koordinator request.
    #[error(transparent)]
    Device(#[from] request::DeviceRequestError),
}

/// A pod's device request from its spec and annotations; `Ok(None)` when it needs no devices.
/// The error names the offending resource.
pub fn pod_device_request(
    pod: &Pod,
) -> Result<Option<request::PodDeviceRequest>, PodDeviceRequestError> {
    let requests = pod_requests(&pod.spec)?;
    Ok(request::parse_device_request(
        &requests,
        pod.metadata.annotations.as_ref(),
    )?)
}
