//! Identity newtypes: a pod UID is not a name, and a name is not a key.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A pod's `metadata.uid`. Ledgers are keyed by this, never by name: a StatefulSet pod
/// recreated under the same name is a different pod.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PodUid(Arc<str>);

impl PodUid {
    pub fn new(uid: impl AsRef<str>) -> Self {
        PodUid(Arc::from(uid.as_ref()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The same string, shared rather than copied.
    pub fn shared(&self) -> Arc<str> {
        self.0.clone()
    }
}

impl fmt::Debug for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PodUid({})", self.0)
    }
}
impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `namespace/name` for namespaced objects, `name` for cluster-scoped ones.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ObjectKey(Arc<str>);

impl ObjectKey {
    pub fn namespaced(namespace: &str, name: &str) -> Self {
        ObjectKey(Arc::from(format!("{namespace}/{name}")))
    }
    pub fn cluster(name: &str) -> Self {
        ObjectKey(Arc::from(name))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// `(namespace, name)`; the namespace is empty for a cluster-scoped key.
    pub fn split(&self) -> (&str, &str) {
        self.0.split_once('/').unwrap_or(("", &self.0))
    }
    /// The same string, shared rather than copied.
    pub fn shared(&self) -> Arc<str> {
        self.0.clone()
    }
}
impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
