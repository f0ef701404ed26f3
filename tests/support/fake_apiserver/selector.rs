//! Field selectors, limited to what the extender and kube-scheduler send. A real API server
//! rejects a field it does not index with 400, so we do the same instead of silently matching
//! everything (a silently ignored selector would hide bugs in the code under test).

use serde_json::Value;

use super::{ApiError, Kind};

#[derive(Clone, Debug, Default)]
pub(crate) struct FieldSelector {
    terms: Vec<Term>,
}

#[derive(Clone, Debug)]
struct Term {
    field: &'static str,
    equals: bool,
    value: String,
}

impl FieldSelector {
    pub(crate) fn parse(kind: Kind, raw: Option<&str>) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        let Some(raw) = raw else {
            return Ok(Self { terms });
        };
        for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            // `!=` must be tried before `=`; `==` is an accepted spelling of `=`.
            let (field, equals, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: {part:?}: does not contain an operator"
                )));
            };
            let field = supported_field(kind, field.trim()).ok_or_else(|| {
                ApiError::bad_request(format!("field label not supported: {}", field.trim()))
            })?;
            terms.push(Term {
                field,
                equals,
                value: value.trim().to_string(),
            });
        }
        Ok(Self { terms })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|t| {
            // A missing field reads as "" like in the real server's field sets, so
            // `spec.nodeName!=` selects exactly the assigned pods.
            let actual = field_value(obj, t.field);
            (actual == t.value) == t.equals
        })
    }
}

fn supported_field(kind: Kind, field: &str) -> Option<&'static str> {
    const COMMON: [&str; 2] = ["metadata.name", "metadata.namespace"];
    const POD: [&str; 3] = ["spec.nodeName", "status.phase", "status.nominatedNodeName"];
    let candidates: &[&'static str] = if kind == Kind::Pod { &POD } else { &[] };
    COMMON
        .iter()
        .chain(candidates.iter())
        .find(|f| **f == field)
        .copied()
}

fn field_value<'a>(obj: &'a Value, field: &str) -> &'a str {
    let mut cur = obj;
    for seg in field.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}
