//! The API writes bind makes ([`PodApi`]): implemented for the kube client ([`KubePodApi`],
//! each call given up after the request timeout) and for offline mode ([`OfflinePodApi`]: a
//! cluster file's pods in memory, for `simulate` and the tests).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use kube::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;

use crate::model::pod::Pod;

/// An API call failed.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status when the server answered, e.g. 409.
    pub status: Option<u16>,
    pub message: String,
}

impl From<kube::Error> for ApiError {
    fn from(e: kube::Error) -> Self {
        match &e {
            kube::Error::Api(s) => ApiError {
                status: Some(s.code),
                message: s.message.clone(),
            },
            _ => ApiError {
                status: None,
                message: e.to_string(),
            },
        }
    }
}

/// The API writes bind needs. Implemented for the kube client and for offline mode.
pub trait PodApi: Send + Sync {
    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, ApiError>>;
    /// Merge-patches annotations (`None` removes one), with the pod UID and, when given, the
    /// resourceVersion as preconditions (409 when either no longer matches).
    fn patch_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        annotations: &'a BTreeMap<String, Option<String>>,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
    /// Creates `pods/binding` with the pod UID and, when given, the resourceVersion as
    /// preconditions, carrying `annotations`, which the API server merges into the pod in the
    /// same write as `spec.nodeName` (409 when a precondition fails or the pod is bound).
    fn create_binding<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        node: &'a str,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
    /// The longest the API server may take to apply a binding we sent (its deadline for the
    /// request): past it, a binding whose answer never came can no longer land.
    fn binding_deadline(&self) -> std::time::Duration;
    /// True when a pod watch will confirm binds; false when bind must commit itself (offline).
    fn confirmed_by_watch(&self) -> bool;
}

pub struct KubePodApi {
    client: kube::Client,
    /// How long one call may wait for the API server's answer.
    timeout: std::time::Duration,
}

impl KubePodApi {
    /// Calls through `client`, each given up after `request_timeout` plus a second without an
    /// answer. The kube client sets no read timeout (its watches are long reads), and a bind
    /// runs detached from its request, so without this a hung API server would keep the bind,
    /// its assumed allocation and the pod's in-flight slot forever. The extra second lets the
    /// request's own timeout answer the scheduler first. A call given up is an error without a
    /// status, like a lost answer: bind treats it as possibly applied.
    pub fn new(client: kube::Client, request_timeout: std::time::Duration) -> Self {
        KubePodApi {
            client,
            timeout: request_timeout + std::time::Duration::from_secs(1),
        }
    }

    fn api(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(ApiError {
                status: None,
                message: format!(
                    "no answer from the API server to {what} within {:?}",
                    self.timeout
                ),
            }),
        }
    }
}

impl PodApi for KubePodApi {
    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, ApiError>> {
        Box::pin(async move {
            self.call("get the pod", self.api(namespace).get_opt(name))
                .await
        })
    }

    fn patch_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        annotations: &'a BTreeMap<String, Option<String>>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            // A merge patch carrying metadata.uid / metadata.resourceVersion is checked by the
            // API server against the stored object: optimistic concurrency.
            let mut meta = serde_json::json!({ "uid": uid, "annotations": annotations });
            if let Some(rv) = resource_version {
                meta["resourceVersion"] = serde_json::Value::String(rv.to_string());
            }
            let patch = serde_json::json!({ "metadata": meta });
            let api = self.api(namespace);
            self.call(
                "the annotation removal patch",
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?;
            Ok(())
        })
    }

    fn create_binding<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        node: &'a str,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let mut meta = serde_json::json!({ "name": name, "namespace": namespace, "uid": uid });
            if let Some(rv) = resource_version {
                meta["resourceVersion"] = serde_json::Value::String(rv.to_string());
            }
            if !annotations.is_empty() {
                meta["annotations"] = serde_json::json!(annotations);
            }
            let binding = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": meta,
                "target": { "apiVersion": "v1", "kind": "Node", "name": node },
            });
            let body = serde_json::to_vec(&binding).map_err(|e| ApiError {
                status: None,
                message: format!("cannot encode the binding: {e}"),
            })?;
            let mut request =
                kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/pods"))
                    .create_subresource("binding", name, &PostParams::default(), body)
                    .map_err(|e| ApiError {
                        status: None,
                        message: format!("cannot build the binding request: {e}"),
                    })?;
            // The API server gives the request up at our own deadline, so a binding whose
            // answer we never got cannot land later than `binding_deadline` after sending.
            let uri = request.uri().to_string();
            let sep = if uri.contains('?') { '&' } else { '?' };
            *request.uri_mut() = format!("{uri}{sep}timeout={}s", self.timeout.as_secs().max(1))
                .parse()
                .map_err(|e| ApiError {
                    status: None,
                    message: format!("cannot build the binding request: {e}"),
                })?;
            self.call(
                "the binding",
                self.client.request::<serde_json::Value>(request),
            )
            .await?;
            Ok(())
        })
    }

    fn binding_deadline(&self) -> std::time::Duration {
        // kube's client retries a 429/503/504 within the call, so the binding may be sent
        // again up to `timeout` after the first send; the server gives each send up `timeout`
        // after it arrived.
        self.timeout * 2
    }

    fn confirmed_by_watch(&self) -> bool {
        true
    }
}

/// Offline mode: the cluster file's pods (assigned or not) in memory; binds change only memory.
pub struct OfflinePodApi {
    pods: Mutex<BTreeMap<(String, String), Pod>>,
}

impl OfflinePodApi {
    pub fn new(pods: impl IntoIterator<Item = Pod>) -> Self {
        let pods = pods
            .into_iter()
            .filter_map(|p| {
                let ns = p
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into());
                let name = p.metadata.name.clone()?;
                Some(((ns, name), p))
            })
            .collect();
        OfflinePodApi {
            pods: Mutex::new(pods),
        }
    }
}

impl OfflinePodApi {
    /// Runs `f` on the stored pod, as the API server would after its UID precondition.
    fn with_pod<R>(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        f: impl FnOnce(&mut Pod) -> Result<R, ApiError>,
    ) -> Result<R, ApiError> {
        let mut pods = self.pods.lock();
        let pod = pods
            .get_mut(&(namespace.to_string(), name.to_string()))
            .ok_or_else(|| ApiError {
                status: Some(404),
                message: format!("pod {namespace}/{name} not found"),
            })?;
        if pod.metadata.uid.as_deref() != Some(uid) {
            return Err(ApiError {
                status: Some(409),
                message: "uid precondition failed".into(),
            });
        }
        let result = f(pod)?;
        // Every write moves a (numeric) resourceVersion on, as on an API server, so a
        // precondition taken before it fails after it.
        if let Some(rv) = &mut pod.metadata.resource_version
            && let Ok(n) = rv.parse::<u64>()
        {
            *rv = (n + 1).to_string();
        }
        Ok(result)
    }
}

impl PodApi for OfflinePodApi {
    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, ApiError>> {
        let pod = self
            .pods
            .lock()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned();
        Box::pin(async move { Ok(pod) })
    }

    fn patch_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        annotations: &'a BTreeMap<String, Option<String>>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let result = self.with_pod(namespace, name, uid, |pod| {
            // The check is kept so offline mode refuses what the API server would.
            if let (Some(want), Some(have)) = (resource_version, &pod.metadata.resource_version)
                && want != have
            {
                return Err(ApiError {
                    status: Some(409),
                    message: "resourceVersion precondition failed".into(),
                });
            }
            let target = pod
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            for (k, v) in annotations {
                match v {
                    Some(v) => target.insert(k.clone(), v.clone()),
                    None => target.remove(k),
                };
            }
            Ok(())
        });
        Box::pin(async move { result })
    }

    fn create_binding<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
        resource_version: Option<&'a str>,
        node: &'a str,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let result = self.with_pod(namespace, name, uid, |pod| {
            if let (Some(want), Some(have)) = (resource_version, &pod.metadata.resource_version)
                && want != have
            {
                return Err(ApiError {
                    status: Some(409),
                    message: "resourceVersion precondition failed".into(),
                });
            }
            if let Some(existing) = pod.node_name() {
                return Err(ApiError {
                    status: Some(409),
                    message: format!("pod is already assigned to node {existing}"),
                });
            }
            pod.spec.node_name = Some(node.to_string());
            let target = pod
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            for (k, v) in annotations {
                target.insert(k.clone(), v.clone());
            }
            Ok(())
        });
        Box::pin(async move { result })
    }

    fn binding_deadline(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    fn confirmed_by_watch(&self) -> bool {
        false
    }
}
