//! Effective pod resource requests, computed the way Kubernetes' `PodRequests` does.
//!
//! Owns only the arithmetic: container requests (defaulted from limits), init containers and
//! restartable sidecars (KEP-753), pod overhead, deprecated device-name mapping. It does not
//! decide what the requests mean (that is `placement`), and never performs I/O.

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::device::{
    FPGA, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, KOORD_GPU, NVIDIA_GPU, RDMA,
    canonical_resource_name,
};
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

/// Resource names common enough that the kept requests of 150,000 pods should not each own a
/// copy of them.
const WELL_KNOWN: [&str; 11] = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "pods",
    NVIDIA_GPU,
    KOORD_GPU,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    RDMA,
    FPGA,
];

/// A pod's effective requests as the caches keep them (one per pod, for every pod): a boxed
/// slice sorted by name, with well-known names static. A `BTreeMap<String, Quantity>` costs a
/// ~450-byte tree node plus one `String` per name for the usual two or three entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRequests(Box<[(Cow<'static, str>, Quantity)]>);

impl PodRequests {
    pub fn get(&self, name: &str) -> Option<&Quantity> {
        self.0
            .binary_search_by(|(n, _)| n.as_ref().cmp(name))
            .ok()
            .map(|i| &self.0[i].1)
    }
    /// In name order, like [`Requests`].
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Quantity)> {
        self.0.iter().map(|(n, q)| (n.as_ref(), q))
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn to_map(&self) -> Requests {
        self.iter().map(|(n, q)| (n.to_string(), *q)).collect()
    }
}

/// Accumulated requests with names borrowed from the spec (or static canonical names): the
/// arithmetic below allocates no names, and a pod has a handful of resources, so linear search
/// beats any map.
type Acc<'a> = Vec<(&'a str, Quantity)>;

fn slot<'a, 'b>(acc: &'b mut Acc<'a>, name: &'a str) -> &'b mut Quantity {
    let i = match acc.iter().position(|(n, _)| *n == name) {
        Some(i) => i,
        None => {
            acc.push((name, Quantity::ZERO));
            acc.len() - 1
        }
    };
    &mut acc[i].1
}

fn parse_list<'a>(
    list: Option<&'a ResourceList>,
    container: &str,
    field: &'static str,
) -> Result<Acc<'a>, RequestError> {
    let mut out = Acc::with_capacity(list.map_or(0, BTreeMap::len));
    let mut deprecated = Vec::new();
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
        // koordinator renames deprecated device names per container before summing.
        let canonical = canonical_resource_name(name);
        if canonical == name.as_str() {
            out.push((name.as_str(), q));
        } else {
            deprecated.push((canonical, q));
        }
    }
    // As `canonicalize_resource_names`: an explicit current name wins over a deprecated one.
    for (name, q) in deprecated {
        if !out.iter().any(|(n, _)| *n == name) {
            out.push((name, q));
        }
    }
    Ok(out)
}

/// A container's requests, with limits filling in resources that have no request (API-server
/// defaulting does this; we may see objects that were never defaulted, e.g. from files).
fn container_requests(c: &Container) -> Result<Acc<'_>, RequestError> {
    let mut req = parse_list(c.resources.requests.as_ref(), &c.name, "requests")?;
    let limits = parse_list(c.resources.limits.as_ref(), &c.name, "limits")?;
    for (name, q) in limits {
        if !req.iter().any(|(n, _)| *n == name) {
            req.push((name, q));
        }
    }
    Ok(req)
}

fn add_into<'a>(acc: &mut Acc<'a>, other: &Acc<'a>) {
    for &(name, q) in other {
        let e = slot(acc, name);
        *e = *e + q;
    }
}

fn max_into<'a>(acc: &mut Acc<'a>, other: &Acc<'a>) {
    for &(name, q) in other {
        let e = slot(acc, name);
        if q > *e {
            *e = q;
        }
    }
}

/// max(init-phase peak, app containers + sidecars) + overhead, zero entries removed, unsorted.
fn effective(spec: &PodSpec) -> Result<Acc<'_>, RequestError> {
    let mut reqs = Acc::new();
    for c in &spec.containers {
        add_into(&mut reqs, &container_requests(c)?);
    }
    // KEP-753: restartable init containers (sidecars) keep running, so they add to the app
    // containers and to every later init container's peak.
    let mut sidecars = Acc::new();
    let mut init_peak = Acc::new();
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
    reqs.retain(|(_, q)| !q.is_zero());
    Ok(reqs)
}

/// The pod's effective requests: max(init-phase peak, app containers + sidecars) + overhead, with
/// zero entries removed. Errors name the container and resource of an unparseable quantity.
pub fn pod_requests(spec: &PodSpec) -> Result<Requests, RequestError> {
    Ok(effective(spec)?
        .into_iter()
        .map(|(n, q)| (n.to_string(), q))
        .collect())
}

/// [`pod_requests`] in the compact form the pod records keep (same entries, same errors).
pub fn pod_requests_compact(spec: &PodSpec) -> Result<PodRequests, RequestError> {
    let mut reqs = effective(spec)?;
    reqs.sort_unstable_by(|a, b| a.0.cmp(b.0));
    Ok(PodRequests(
        reqs.into_iter()
            .map(|(n, q)| {
                let name = match WELL_KNOWN.iter().find(|k| **k == n) {
                    Some(k) => Cow::Borrowed(*k),
                    None => Cow::Owned(n.to_owned()),
                };
                (name, q)
            })
            .collect(),
    ))
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

    /// The map-based computation this module used before it accumulated borrowed names, kept
    /// as the definition the fast path must equal.
    mod reference {
        use super::super::*;
        use crate::model::device::canonicalize_resource_names;

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
            Ok(canonicalize_resource_names(out))
        }
        fn container_requests(c: &Container) -> Result<Requests, RequestError> {
            let mut req = parse_list(c.resources.requests.as_ref(), &c.name, "requests")?;
            for (name, q) in parse_list(c.resources.limits.as_ref(), &c.name, "limits")? {
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
        pub fn pod_requests(spec: &PodSpec) -> Result<Requests, RequestError> {
            let mut reqs = Requests::new();
            for c in &spec.containers {
                add_into(&mut reqs, &container_requests(c)?);
            }
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
    }

    mod equivalence {
        use super::super::*;
        use crate::model::pod::ResourceRequirements;
        use proptest::prelude::*;

        /// Names that collide after canonicalisation, well-known and unknown ones.
        fn name() -> impl Strategy<Value = String> {
            prop::sample::select(vec![
                "cpu",
                "memory",
                "nvidia.com/gpu",
                "koordinator.sh/gpu-core",
                "kubernetes.io/gpu-core",
                "koordinator.sh/gpu-memory-ratio",
                "kubernetes.io/gpu-memory-ratio",
                "kubernetes.io/rdma",
                "example.com/widget",
            ])
            .prop_map(str::to_string)
        }
        /// Mostly valid quantities, some zero, some negative or malformed.
        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                6 => (0u32..5000).prop_map(|v| format!("{v}m")),
                3 => (0u32..64).prop_map(|v| v.to_string()),
                1 => prop::sample::select(vec!["-1", "two", "1.5Gi", "0", ""]).prop_map(str::to_string),
            ]
        }
        fn list() -> impl Strategy<Value = Option<ResourceList>> {
            prop::option::of(prop::collection::btree_map(name(), value(), 0..4))
        }
        fn container() -> impl Strategy<Value = Container> {
            (list(), list(), any::<bool>(), 0u8..3).prop_map(|(requests, limits, always, n)| {
                Container {
                    name: format!("c{n}"),
                    resources: ResourceRequirements { requests, limits },
                    restart_policy: always.then(|| "Always".to_string()),
                }
            })
        }
        fn spec() -> impl Strategy<Value = PodSpec> {
            (
                prop::collection::vec(container(), 0..3),
                prop::collection::vec(container(), 0..3),
                list(),
            )
                .prop_map(|(containers, init_containers, overhead)| PodSpec {
                    containers,
                    init_containers,
                    overhead,
                    ..Default::default()
                })
        }

        proptest! {
            #[test]
            fn fast_path_equals_the_map_definition(spec in spec()) {
                let want = super::reference::pod_requests(&spec);
                prop_assert_eq!(&pod_requests(&spec), &want);
                let compact = pod_requests_compact(&spec);
                prop_assert_eq!(compact.clone().map(|c| c.to_map()), want.clone());
                if let (Ok(c), Ok(w)) = (&compact, &want) {
                    prop_assert_eq!(c.len(), w.len());
                    for (name, q) in w {
                        prop_assert_eq!(c.get(name), Some(q));
                    }
                    prop_assert_eq!(c.get("not-requested"), None);
                }
            }
        }
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
