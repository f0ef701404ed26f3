//! Effective pod resource requests, computed the way Kubernetes' `PodRequests` does.
//!
//! Owns only the arithmetic: container requests (defaulted from limits), init containers and
//! restartable sidecars (KEP-753), pod overhead, deprecated device-name mapping. It does not
//! decide what the requests mean (that is `placement`), and never performs I/O.

use std::collections::BTreeMap;

use super::device::canonicalize_resource_names;
use super::pod::{Container, PodSpec, ResourceList};
use super::quantity::{Quantity, QuantityError};

/// Resource name -> exact quantity.
pub type Requests = BTreeMap<String, Quantity>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(
        "container {container:?}: {field} {resource}={value:?} is not a valid quantity: {source}"
    )]
    InvalidQuantity {
        container: String,
        field: &'static str,
        resource: String,
        value: String,
        #[source]
        source: QuantityError,
    },
    #[error("container {container:?}: {field} {resource}={value:?} must not be negative")]
    Negative {
        container: String,
        field: &'static str,
        resource: String,
        value: String,
    },
}

fn parse_list(
    list: Option<&ResourceList>,
    container: &str,
    field: &'static str,
) -> Result<Requests, RequestError> {
    let mut out = Requests::new();
    for (name, value) in list.into_iter().flatten() {
        let q = Quantity::parse(value).map_err(|source| RequestError::InvalidQuantity {
            container: container.to_string(),
            field,
            resource: name.clone(),
            value: value.clone(),
            source,
        })?;
        if q.milli() < 0 {
            return Err(RequestError::Negative {
                container: container.to_string(),
                field,
                resource: name.clone(),
                value: value.clone(),
            });
        }
        out.insert(name.clone(), q);
    }
    // koordinator renames deprecated device names per container before summing.
    Ok(canonicalize_resource_names(out))
}

/// A container's requests, with limits filling in resources that have no request (API-server
/// defaulting does this; we may see objects that were never defaulted, e.g. from files).
fn container_requests(c: &Container) -> Result<Requests, RequestError> {
    let mut req = parse_list(c.resources.requests.as_ref(), &c.name, "requests")?;
    let limits = parse_list(c.resources.limits.as_ref(), &c.name, "limits")?;
    for (name, q) in limits {
        req.entry(name).or_insert(q);
    }
    Ok(req)
}

fn add_into(acc: &mut Requests, other: &Requests) {
    for (name, q) in other {
        let e = acc.entry(name.clone()).or_insert(Quantity::ZERO);
        *e = *e + *q;
    }
}

fn max_into(acc: &mut Requests, other: &Requests) {
    for (name, q) in other {
        let e = acc.entry(name.clone()).or_insert(Quantity::ZERO);
        if *q > *e {
            *e = *q;
        }
    }
}

/// The pod's effective requests: max(init-phase peak, app containers + sidecars) + overhead, with
/// zero entries removed. Errors name the container and resource of an unparseable quantity.
pub fn pod_requests(spec: &PodSpec) -> Result<Requests, RequestError> {
    let mut reqs = Requests::new();
    for c in &spec.containers {
        add_into(&mut reqs, &container_requests(c)?);
    }
    // KEP-753: restartable init containers (sidecars) keep running, so they add to the app
    // containers and to every later init container's peak.
    let mut sidecars = Requests::new();
    let mut init_peak = Requests::new();
    for c in &spec.init_containers {
        let own = container_requests(c)?;
        let during = if c.restart_policy.as_deref() == Some("Always") {
            add_into(&mut reqs, &own);
            add_into(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut t = own;
            add_into(&mut t, &sidecars);
            t
        };
        max_into(&mut init_peak, &during);
    }
    max_into(&mut reqs, &init_peak);
    let overhead = parse_list(spec.overhead.as_ref(), "<pod overhead>", "overhead")?;
    add_into(&mut reqs, &overhead);
    reqs.retain(|_, q| !q.is_zero());
    Ok(reqs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::pod::ResourceRequirements;

    fn rl(pairs: &[(&str, &str)]) -> Option<ResourceList> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }
    fn c(name: &str, req: &[(&str, &str)], lim: &[(&str, &str)], always: bool) -> Container {
        Container {
            name: name.into(),
            resources: ResourceRequirements {
                requests: if req.is_empty() { None } else { rl(req) },
                limits: if lim.is_empty() { None } else { rl(lim) },
            },
            restart_policy: always.then(|| "Always".to_string()),
        }
    }
    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn sums_app_containers_and_defaults_from_limits() {
        let spec = PodSpec {
            containers: vec![
                c("a", &[("cpu", "1")], &[("nvidia.com/gpu", "1")], false),
                c("b", &[("cpu", "500m"), ("nvidia.com/gpu", "1")], &[], false),
            ],
            ..Default::default()
        };
        let r = pod_requests(&spec).unwrap();
        assert_eq!(r["cpu"], q("1500m"));
        assert_eq!(r["nvidia.com/gpu"], q("2"));
    }

    #[test]
    fn init_containers_and_sidecars_follow_kep_753() {
        // sidecar 1 cpu, then init 2 cpu (peak 3 with sidecar), app 1 cpu (+1 sidecar = 2).
        let spec = PodSpec {
            containers: vec![c("app", &[("cpu", "1")], &[], false)],
            init_containers: vec![
                c("side", &[("cpu", "1")], &[], true),
                c(
                    "init",
                    &[("cpu", "2"), ("koordinator.sh/gpu-memory-ratio", "50")],
                    &[],
                    false,
                ),
            ],
            overhead: rl(&[("cpu", "100m")]),
            ..Default::default()
        };
        let r = pod_requests(&spec).unwrap();
        assert_eq!(r["cpu"], q("3100m"));
        assert_eq!(r["koordinator.sh/gpu-memory-ratio"], q("50"));
    }

    #[test]
    fn drops_zero_entries_and_maps_deprecated_names() {
        let spec = PodSpec {
            containers: vec![c(
                "a",
                &[("cpu", "0"), ("kubernetes.io/gpu-memory-ratio", "30")],
                &[],
                false,
            )],
            ..Default::default()
        };
        let r = pod_requests(&spec).unwrap();
        assert!(!r.contains_key("cpu"));
        assert_eq!(r["koordinator.sh/gpu-memory-ratio"], q("30"));
    }

    #[test]
    fn bad_quantity_names_container_and_resource() {
        let spec = PodSpec {
            containers: vec![c("main", &[], &[("nvidia.com/gpu", "two")], false)],
            ..Default::default()
        };
        let e = pod_requests(&spec).unwrap_err().to_string();
        assert!(
            e.contains("\"main\"") && e.contains("nvidia.com/gpu"),
            "{e}"
        );
        let spec = PodSpec {
            containers: vec![c("main", &[("cpu", "-1")], &[], false)],
            ..Default::default()
        };
        assert!(
            pod_requests(&spec)
                .unwrap_err()
                .to_string()
                .contains("negative")
        );
    }
}
