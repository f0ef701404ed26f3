//! RFC 7386 merge patch and RFC 6902 JSON patch, written here rather than pulled in as a
//! dependency: both are small, and the fake must map failures to the exact Status codes the
//! real API server uses (400 for an undecodable patch, 422 for a patch that does not apply).

use serde_json::{Map, Value};

use super::ApiError;

pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(map) = target {
        for (k, v) in patch {
            if v.is_null() {
                map.remove(k);
            } else {
                merge_patch(map.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Applies the whole patch to a copy so a failing operation leaves `target` untouched, as the
/// real server applies a patch atomically.
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let ops = patch
        .as_array()
        .ok_or_else(|| ApiError::bad_request("json patch must be an array of operations"))?;
    let mut doc = target.clone();
    for (i, op) in ops.iter().enumerate() {
        apply_op(&mut doc, op).map_err(|e| match e {
            OpError::Decode(m) => ApiError::bad_request(format!("json patch operation {i}: {m}")),
            OpError::Apply(m) => ApiError::invalid(format!("json patch operation {i}: {m}")),
        })?;
    }
    *target = doc;
    Ok(())
}

enum OpError {
    Decode(String),
    Apply(String),
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<(), OpError> {
    let str_field = |name: &str| {
        op.get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| OpError::Decode(format!("missing string field {name:?}")))
    };
    let value_field = || {
        op.get("value")
            .cloned()
            .ok_or_else(|| OpError::Decode("missing field \"value\"".into()))
    };
    let path = parse_pointer(str_field("path")?)?;
    match str_field("op")? {
        "add" => add(doc, &path, value_field()?),
        "remove" => remove(doc, &path).map(drop),
        "replace" => {
            let v = value_field()?;
            let slot = get_mut(doc, &path)
                .ok_or_else(|| OpError::Apply("replace: path does not exist".into()))?;
            *slot = v;
            Ok(())
        }
        "move" => {
            let from = parse_pointer(str_field("from")?)?;
            if path.len() > from.len() && path[..from.len()] == from[..] {
                return Err(OpError::Apply("move: from is a prefix of path".into()));
            }
            let v = remove(doc, &from)?;
            add(doc, &path, v)
        }
        "copy" => {
            let from = parse_pointer(str_field("from")?)?;
            let v = get(doc, &from)
                .cloned()
                .ok_or_else(|| OpError::Apply("copy: from does not exist".into()))?;
            add(doc, &path, v)
        }
        "test" => {
            let want = value_field()?;
            match get(doc, &path) {
                Some(have) if *have == want => Ok(()),
                _ => Err(OpError::Apply("test failed".into())),
            }
        }
        other => Err(OpError::Decode(format!("unknown op {other:?}"))),
    }
}

fn parse_pointer(p: &str) -> Result<Vec<String>, OpError> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let rest = p
        .strip_prefix('/')
        .ok_or_else(|| OpError::Decode(format!("invalid JSON pointer {p:?}")))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn get<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |cur, tok| match cur {
        Value::Object(m) => m.get(tok),
        Value::Array(a) => tok.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn get_mut<'a>(doc: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(doc, |cur, tok| match cur {
        Value::Object(m) => m.get_mut(tok),
        Value::Array(a) => tok.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
        _ => None,
    })
}

fn add(doc: &mut Value, path: &[String], v: Value) -> Result<(), OpError> {
    let Some((last, parent_path)) = path.split_last() else {
        *doc = v;
        return Ok(());
    };
    let parent = get_mut(doc, parent_path)
        .ok_or_else(|| OpError::Apply("add: parent does not exist".into()))?;
    match parent {
        Value::Object(m) => {
            m.insert(last.clone(), v);
            Ok(())
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(v);
                return Ok(());
            }
            match last.parse::<usize>() {
                Ok(i) if i <= a.len() => {
                    a.insert(i, v);
                    Ok(())
                }
                _ => Err(OpError::Apply(format!("add: bad array index {last:?}"))),
            }
        }
        _ => Err(OpError::Apply("add: parent is not a container".into())),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, OpError> {
    let (last, parent_path) = path
        .split_last()
        .ok_or_else(|| OpError::Apply("remove: cannot remove the root".into()))?;
    let missing = || OpError::Apply("remove: path does not exist".into());
    match get_mut(doc, parent_path).ok_or_else(missing)? {
        Value::Object(m) => m.remove(last).ok_or_else(missing),
        Value::Array(a) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing()),
        },
        _ => Err(missing()),
    }
}
