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
    // Pod-level requests (KEP-2837) replace the containers' sum for the resources they support
    // (cpu, memory, hugepages-*), as kube-scheduler's `PodRequests` does; limits fill a missing
    // request as API-server defaulting does.
    if let Some(pod_level) = &spec.resources {
        let supported =
            |name: &str| matches!(name, "cpu" | "memory") || name.starts_with("hugepages-");
        let mut level = parse_list(pod_level.requests.as_ref(), "<pod>", "resources.requests")?;
        for (name, q) in parse_list(pod_level.limits.as_ref(), "<pod>", "resources.limits")? {
            if !level.iter().any(|(n, _)| *n == name) {
                level.push((name, q));
            }
        }
        for (name, q) in level.into_iter().filter(|(n, _)| supported(n)) {
            *slot(&mut reqs, name) = q;
        }
    }
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

    /// The definition the fast path must equal, written again from the Kubernetes rules
    /// (effective requests: containers summed, limits standing in for absent requests, init
    /// containers' peak with restartable sidecars, overhead added, zeros dropped) with its own
    /// quantity reader and its own table of koordinator's deprecated names
    /// (koordinator `apis/extension/deprecated.go`). It uses neither `Quantity::parse`
    /// nor `canonicalize_resource_names`; amounts are milli-units. Errors are only told apart
    /// as "bad quantity" or "negative", by resource.
    mod reference {
        use std::collections::BTreeMap;

        use crate::model::pod::{Container, PodSpec, ResourceList};

        pub type Milli = BTreeMap<String, i128>;

        #[derive(Debug, PartialEq, Eq)]
        pub enum Bad {
            Quantity(String),
            Negative(String),
        }

        /// Decimal and binary suffixes; a number with an optional sign and fraction.
        pub fn milli(s: &str) -> Option<i128> {
            let (sign, rest) = match s.strip_prefix('-') {
                Some(r) => (-1, r),
                None => (1, s.strip_prefix('+').unwrap_or(s)),
            };
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            let (number, suffix) = rest.split_at(end);
            let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
            if whole.is_empty() && frac.is_empty() {
                return None;
            }
            // value = digits / 10^frac.len() × scale / 1000, in milli: digits × scale_milli.
            let digits: i128 = format!("{whole}{frac}").parse().ok()?;
            let scale_milli: i128 = match suffix {
                "" => 1000,
                "m" => 1,
                "k" => 1_000_000,
                "M" => 1_000_000_000,
                "G" => 1_000_000_000_000,
                "T" => 1_000_000_000_000_000,
                "Ki" => 1000 << 10,
                "Mi" => 1000 << 20,
                "Gi" => 1000 << 30,
                "Ti" => 1000 << 40,
                _ => return None,
            };
            let scaled = digits * scale_milli;
            let div = 10i128.pow(frac.len() as u32);
            // Kubernetes rounds a fraction of a milli-unit up.
            Some(sign * ((scaled + div - 1) / div))
        }

        fn canonical(name: &str) -> &str {
            match name {
                "kubernetes.io/gpu" => "koordinator.sh/gpu",
                "kubernetes.io/gpu-core" => "koordinator.sh/gpu-core",
                "kubernetes.io/gpu-memory" => "koordinator.sh/gpu-memory",
                "kubernetes.io/gpu-memory-ratio" => "koordinator.sh/gpu-memory-ratio",
                "kubernetes.io/rdma" => "koordinator.sh/rdma",
                "kubernetes.io/fpga" => "koordinator.sh/fpga",
                other => other,
            }
        }

        fn parse_list(list: Option<&ResourceList>) -> Result<Milli, Bad> {
            let mut current = Milli::new();
            let mut deprecated = Milli::new();
            for (name, value) in list.into_iter().flatten() {
                let v = milli(value).ok_or_else(|| Bad::Quantity(name.clone()))?;
                if v < 0 {
                    return Err(Bad::Negative(name.clone()));
                }
                let to = canonical(name);
                if to == name {
                    current.insert(name.clone(), v);
                } else {
                    deprecated.insert(to.to_string(), v);
                }
            }
            // The current name wins over its deprecated spelling.
            for (name, v) in deprecated {
                current.entry(name).or_insert(v);
            }
            Ok(current)
        }

        fn container(c: &Container) -> Result<Milli, Bad> {
            let mut req = parse_list(c.resources.requests.as_ref())?;
            for (name, v) in parse_list(c.resources.limits.as_ref())? {
                req.entry(name).or_insert(v);
            }
            Ok(req)
        }

        fn add(acc: &mut Milli, other: &Milli) {
            for (name, v) in other {
                *acc.entry(name.clone()).or_default() += v;
            }
        }

        fn max(acc: &mut Milli, other: &Milli) {
            for (name, v) in other {
                let e = acc.entry(name.clone()).or_default();
                *e = (*e).max(*v);
            }
        }

        pub fn pod_requests(spec: &PodSpec) -> Result<Milli, Bad> {
            let mut reqs = Milli::new();
            for c in &spec.containers {
                add(&mut reqs, &container(c)?);
            }
            let mut sidecars = Milli::new();
            let mut init_peak = Milli::new();
            for c in &spec.init_containers {
                let own = container(c)?;
                let during = if c.restart_policy.as_deref() == Some("Always") {
                    add(&mut reqs, &own);
                    add(&mut sidecars, &own);
                    sidecars.clone()
                } else {
                    let mut t = own;
                    add(&mut t, &sidecars);
                    t
                };
                max(&mut init_peak, &during);
            }
            max(&mut reqs, &init_peak);
            if let Some(level) = &spec.resources {
                let mut own = parse_list(level.requests.as_ref())?;
                for (name, v) in parse_list(level.limits.as_ref())? {
                    own.entry(name).or_insert(v);
                }
                for (name, v) in own {
                    if name == "cpu" || name == "memory" || name.starts_with("hugepages-") {
                        reqs.insert(name, v);
                    }
                }
            }
            add(&mut reqs, &parse_list(spec.overhead.as_ref())?);
            reqs.retain(|_, v| *v != 0);
            Ok(reqs)
        }

        #[test]
        fn the_reference_reader_reads_what_kubernetes_writes() {
            assert_eq!(milli("250m"), Some(250));
            assert_eq!(milli("2"), Some(2000));
            assert_eq!(milli("1.5Gi"), Some(1500 << 30));
            assert_eq!(milli("-1"), Some(-1000));
            assert_eq!(milli("0.0001"), Some(1));
            assert_eq!(milli("two"), None);
            assert_eq!(milli(""), None);
        }
    }

    mod equivalence {
        use super::super::*;
        use crate::model::pod::ResourceRequirements;
        use proptest::prelude::*;

        /// Names that collide after canonicalisation (all six deprecated names and their
        /// current twins), well-known and unknown ones.
        fn name() -> impl Strategy<Value = String> {
            prop::sample::select(vec![
                "cpu",
                "memory",
                "nvidia.com/gpu",
                "koordinator.sh/gpu",
                "kubernetes.io/gpu",
                "koordinator.sh/gpu-core",
                "kubernetes.io/gpu-core",
                "koordinator.sh/gpu-memory",
                "kubernetes.io/gpu-memory",
                "koordinator.sh/gpu-memory-ratio",
                "kubernetes.io/gpu-memory-ratio",
                "koordinator.sh/rdma",
                "kubernetes.io/rdma",
                "koordinator.sh/fpga",
                "kubernetes.io/fpga",
                "example.com/widget",
            ])
            .prop_map(str::to_string)
        }
        /// Mostly valid quantities, some zero, some below a milli-unit (Kubernetes rounds them
        /// up), some negative or malformed.
        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                6 => (0u32..5000).prop_map(|v| format!("{v}m")),
                3 => (0u32..64).prop_map(|v| v.to_string()),
                2 => (0u32..10_000, 1u32..5).prop_map(|(v, places)| {
                    // 0.0001 .. 9.9999 with up to four places: sub-milli parts included.
                    let s = format!("{:0width$}", v, width = places as usize + 1);
                    let (int, frac) = s.split_at(s.len() - places as usize);
                    format!("{int}.{frac}")
                }),
                1 => prop::sample::select(vec!["-1", "two", "1.5Gi", "0", "", "0.5m", "0.0001"])
                    .prop_map(str::to_string),
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
                prop::option::of((list(), list())),
            )
                .prop_map(|(containers, init_containers, overhead, pod_level)| {
                    PodSpec {
                        containers,
                        init_containers,
                        overhead,
                        resources: pod_level
                            .map(|(requests, limits)| ResourceRequirements { requests, limits }),
                        ..Default::default()
                    }
                })
        }

        proptest! {
            /// Independent: the reference above (own quantity reader, own name table).
            #[test]
            fn fast_path_equals_the_independent_definition(spec in spec()) {
                use super::reference::{Bad, Milli};
                let want = super::reference::pod_requests(&spec);
                let as_milli = |r: &Requests| -> Milli {
                    r.iter().map(|(k, q)| (k.clone(), q.milli())).collect()
                };
                let kind = |e: &RequestError| match e {
                    RequestError::InvalidQuantity { resource, .. } => Bad::Quantity(resource.clone()),
                    RequestError::Negative { resource, .. } => Bad::Negative(resource.clone()),
                };
                let got = pod_requests(&spec);
                prop_assert_eq!(got.as_ref().map(as_milli).map_err(kind), want);
                // The compact form equals the map form exactly.
                let compact = pod_requests_compact(&spec);
                prop_assert_eq!(compact.clone().map(|c| c.to_map()), got.clone());
                if let (Ok(c), Ok(w)) = (&compact, &got) {
                    prop_assert_eq!(c.len(), w.len());
                    for (name, q) in w {
                        prop_assert_eq!(c.get(name), Some(q));
                    }
                    prop_assert_eq!(c.get("not-requested"), None);
                }
            }
        }
    }

    /// Issue 36 §7: a pod that sets only pod-level resources requests them (kube-scheduler
    /// counts them; the amplified-CPU check summed 0 for such a pod before), for the resources
    /// pod level supports; extended resources stay the containers'.
    #[test]
    fn pod_level_requests_replace_the_containers_sum_for_cpu_and_memory() {
        let spec = PodSpec {
            containers: vec![
                c("a", &[("cpu", "500m")], &[("nvidia.com/gpu", "1")], false),
                c("b", &[], &[], false),
            ],
            resources: Some(ResourceRequirements {
                requests: rl(&[("cpu", "4")]),
                limits: rl(&[("cpu", "4"), ("memory", "8Gi"), ("nvidia.com/gpu", "2")]),
            }),
            ..Default::default()
        };
        let r = pod_requests(&spec).unwrap();
        assert_eq!(r["cpu"], q("4"));
        assert_eq!(
            r["memory"],
            q("8Gi"),
            "a pod-level limit defaults its request"
        );
        assert_eq!(r["nvidia.com/gpu"], q("1"), "not a pod-level resource");
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
