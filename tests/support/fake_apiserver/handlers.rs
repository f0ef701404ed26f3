//! HTTP surface: one fallback handler that parses Kubernetes REST paths itself. Hand-parsing
//! (instead of an axum route per kind × scope × version) keeps the request log, the RBAC
//! mapping and the 404-for-unknown-paths behaviour in one place.

use std::borrow::Cow;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::http::{Method, StatusCode, header};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::Response;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::selector::FieldSelector;
use super::{
    ApiError, EventType, FakeApiServer, Inner, Kind, LogEntry, MAX_SNAPSHOTS, RecordedRequest,
    Snapshot, WatchMsg, WriteFault, WriteOp, meta_str, patch, resource_label,
};

/// A real server picks a random watch timeout of 30–60 min when the client sends none.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
const MAX_BODY: usize = 64 << 20;

pub(crate) fn router(fake: FakeApiServer) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(fake)
}

pub(crate) struct ResourcePath {
    pub(crate) kind: Kind,
    pub(crate) version: String,
    pub(crate) ns: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) sub: Option<String>,
}

pub(crate) enum Route {
    Version,
    CoreVersions,
    GroupList,
    Group(String),
    ResourceList { group: String, version: String },
    Resource(ResourcePath),
    NotFound,
}

pub(crate) fn parse_route(path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["api"] => Route::CoreVersions,
        ["api", v] => Route::ResourceList {
            group: String::new(),
            version: v.to_string(),
        },
        ["api", v, rest @ ..] => resource_route("", v, rest),
        ["apis"] => Route::GroupList,
        ["apis", g] => Route::Group(g.to_string()),
        ["apis", g, v] => Route::ResourceList {
            group: g.to_string(),
            version: v.to_string(),
        },
        ["apis", g, v, rest @ ..] => resource_route(g, v, rest),
        _ => Route::NotFound,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    let (ns, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return Route::NotFound,
    };
    let Some(kind) = Kind::lookup(group, version, plural) else {
        return Route::NotFound;
    };
    // Cluster-scoped kinds have no namespaced paths; namespaced kinds only offer the
    // all-namespaces collection (list/watch) outside a namespace.
    if (ns.is_some() && !kind.namespaced()) || (ns.is_none() && kind.namespaced() && name.is_some())
    {
        return Route::NotFound;
    }
    Route::Resource(ResourcePath {
        kind,
        version: version.to_string(),
        ns,
        name,
        sub,
    })
}

/// Lenient query parsing (kube sends `?&limit=..`), reusing axum's urlencoded decoder.
pub(crate) fn parse_query(q: &str) -> HashMap<String, String> {
    let Ok(uri) = format!("/?{q}").parse::<::http::Uri>() else {
        return HashMap::new();
    };
    axum::extract::Query::<HashMap<String, String>>::try_from_uri(&uri)
        .map(|q| q.0)
        .unwrap_or_default()
}

pub(crate) fn truthy(v: &str) -> bool {
    matches!(v, "true" | "1" | "True")
}

pub(crate) fn event_name(ty: EventType) -> &'static str {
    match ty {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
    }
}

fn json_response(code: u16, body: &impl Serialize) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(bytes))
        .unwrap_or_default()
}

fn status_response(err: &ApiError) -> Response {
    json_response(err.code, &err.to_status())
}

fn path_not_found() -> Response {
    status_response(&ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    ))
}

/// Rewrites `apiVersion` when an object is served through a non-storage version.
fn present<'a>(obj: &'a Value, api_version: &str) -> Cow<'a, Value> {
    if obj.get("apiVersion").and_then(Value::as_str) == Some(api_version) {
        return Cow::Borrowed(obj);
    }
    let mut o = obj.clone();
    if let Value::Object(m) = &mut o {
        m.insert("apiVersion".into(), Value::String(api_version.to_string()));
    }
    Cow::Owned(o)
}

async fn handle(State(fake): State<FakeApiServer>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or("").to_string();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    fake.inner.lock().requests.push(RecordedRequest {
        method: parts.method.to_string(),
        path: path.clone(),
        query: query.clone(),
        content_type: content_type.clone(),
    });
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return status_response(&ApiError::bad_request(format!("reading body: {e}"))),
    };
    let q = parse_query(&query);
    let route = parse_route(&path);
    if !matches!(route, Route::Resource(_)) && parts.method != Method::GET {
        return status_response(&ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ));
    }
    match route {
        Route::Version => json_response(200, &version_info()),
        Route::CoreVersions => json_response(
            200,
            &json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
            }),
        ),
        Route::GroupList => json_response(200, &group_list(&fake)),
        Route::Group(g) => match api_group(&fake, &g) {
            Some(v) => json_response(200, &v),
            None => path_not_found(),
        },
        Route::ResourceList { group, version } => match resource_list(&fake, &group, &version) {
            Some(v) => json_response(200, &v),
            None => path_not_found(),
        },
        Route::Resource(r) => resource(fake, parts.method, r, q, content_type, body).await,
        Route::NotFound => path_not_found(),
    }
}

fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-fake",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn served_kinds(fake: &FakeApiServer) -> Vec<Kind> {
    let g = fake.inner.lock();
    Kind::ALL
        .into_iter()
        .filter(|k| !g.kinds[k.idx()].not_served)
        .collect()
}

fn group_json(group: &str, kinds: &[Kind]) -> Option<Value> {
    let k = kinds.iter().find(|k| k.group() == group)?;
    let versions: Vec<Value> = k
        .versions()
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    Some(json!({
        "name": group,
        "versions": versions,
        "preferredVersion": versions[0].clone(),
    }))
}

fn group_list(fake: &FakeApiServer) -> Value {
    let kinds = served_kinds(fake);
    let mut groups: Vec<&str> = kinds
        .iter()
        .map(|k| k.group())
        .filter(|g| !g.is_empty())
        .collect();
    groups.dedup();
    let groups: Vec<Value> = groups
        .iter()
        .filter_map(|g| group_json(g, &kinds))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn api_group(fake: &FakeApiServer, group: &str) -> Option<Value> {
    let mut v = group_json(group, &served_kinds(fake))?;
    if let Value::Object(m) = &mut v {
        m.insert("kind".into(), json!("APIGroup"));
        m.insert("apiVersion".into(), json!("v1"));
    }
    Some(v)
}

fn resource_list(fake: &FakeApiServer, group: &str, version: &str) -> Option<Value> {
    let kinds: Vec<Kind> = served_kinds(fake)
        .into_iter()
        .filter(|k| k.group() == group && k.versions().contains(&version))
        .collect();
    if kinds.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for k in kinds {
        resources.push(json!({
            "name": k.plural(),
            "singularName": k.kind_name().to_lowercase(),
            "namespaced": k.namespaced(),
            "kind": k.kind_name(),
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        }));
        resources.push(json!({
            "name": format!("{}/status", k.plural()),
            "singularName": "",
            "namespaced": k.namespaced(),
            "kind": k.kind_name(),
            "verbs": ["get", "patch", "update"],
        }));
        if k == Kind::Pod {
            resources.push(json!({
                "name": "pods/binding",
                "singularName": "",
                "namespaced": true,
                "kind": "Binding",
                "verbs": ["create"],
            }));
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": resources,
    }))
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

async fn resource(
    fake: FakeApiServer,
    method: Method,
    r: ResourcePath,
    q: HashMap<String, String>,
    content_type: Option<String>,
    body: Bytes,
) -> Response {
    let kind = r.kind;
    if fake.inner.lock().kinds[kind.idx()].not_served {
        return path_not_found();
    }
    let sub = r.sub.as_deref();
    let whole_object = matches!(sub, None | Some("status"));
    let op = match (&method, r.name.is_some(), sub) {
        (&Method::PATCH, true, None | Some("status")) if kind == Kind::Pod => {
            Some(WriteOp::PodPatch)
        }
        (&Method::POST, true, Some("binding")) if kind == Kind::Pod => Some(WriteOp::PodBinding),
        _ => None,
    };
    let fault = op.and_then(|op| fake.take_write_fault(op));
    if let Some(WriteFault::Refuse(code)) = fault {
        return status_response(&ApiError::injected(code));
    }
    if let Some(WriteFault::NeverAnswers) = fault {
        return futures::future::pending().await;
    }
    if let Some(WriteFault::LandsLate(id)) = fault {
        // The deadline a real API server sets from the request's `timeout` (default 60 s).
        let timeout = q
            .get("timeout")
            .and_then(|t| t.strip_suffix('s'))
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(60);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let land = {
            let mut late = fake.late.lock();
            let w = late.entry(id).or_default();
            w.arrived = true;
            w.pod = r.name.clone();
            w.land.clone()
        };
        let late = fake.late.clone();
        tokio::spawn(async move {
            land.notified().await;
            let status = if tokio::time::Instant::now() >= deadline {
                504
            } else {
                resource_inner(fake, method, r, q, content_type, body, whole_object)
                    .await
                    .status()
                    .as_u16()
            };
            late.lock().entry(id).or_default().outcome = Some(status);
        });
        // A 500, not the 504 a real server sends on its timeout: kube's client retries 504s,
        // and the retry (with no fault) would apply at once, leaving nothing to land late.
        return status_response(&ApiError::injected(500));
    }
    let hanging = fake.hanging.clone();
    let end_hangs = fake.end_hangs.clone();
    let response = resource_inner(fake, method, r, q, content_type, body, whole_object).await;
    match fault {
        Some(f) if f != WriteFault::Pass && response.status().is_success() => {
            lose_answer(f, &hanging, &end_hangs).await
        }
        _ => response,
    }
}

/// The answer to a write that was applied but whose answer a [`WriteFault`] loses.
async fn lose_answer(
    fault: WriteFault,
    hanging: &AtomicU64,
    end_hangs: &tokio::sync::Notify,
) -> Response {
    match fault {
        WriteFault::Pass => status_response(&ApiError::injected(500)),
        WriteFault::Refuse(code) | WriteFault::AppliedThenStatus(code) => {
            status_response(&ApiError::injected(code))
        }
        WriteFault::AppliedThenDrop => {
            // Headers go out, then the body fails: hyper cuts the connection mid-response.
            let cut = futures::stream::once(async {
                Err::<Bytes, std::io::Error>(std::io::Error::other("injected: connection cut"))
            });
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(cut))
                .unwrap_or_default()
        }
        WriteFault::LandsLate(_) | WriteFault::NeverAnswers => {
            unreachable!("answered before the write is applied")
        }
        WriteFault::AppliedThenHang(d) => {
            // Counted down on drop too: a client that gives up (or dies) drops this future.
            struct Held<'a>(&'a AtomicU64);
            impl Drop for Held<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            // Registered before the hang is counted: a test that saw the count and ends the
            // hangs never misses this one.
            let ended = end_hangs.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            hanging.fetch_add(1, Ordering::SeqCst);
            let _held = Held(hanging);
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = ended => {}
            }
            status_response(&ApiError::injected(504))
        }
    }
}

async fn resource_inner(
    fake: FakeApiServer,
    method: Method,
    r: ResourcePath,
    q: HashMap<String, String>,
    content_type: Option<String>,
    body: Bytes,
    whole_object: bool,
) -> Response {
    let kind = r.kind;
    let api_version = kind.api_version_for(&r.version);
    let ns = r.ns.clone().unwrap_or_default();
    let sub = r.sub.as_deref();
    match (&method, r.name.as_deref()) {
        (&Method::GET, None) if sub.is_none() => {
            if q.get("watch").is_some_and(|w| truthy(w)) {
                watch(fake, &r, &q).await
            } else {
                list(fake, &r, &q).await
            }
        }
        (&Method::GET, Some(name)) if whole_object => {
            let g = fake.inner.lock();
            match g.kinds[kind.idx()]
                .objects
                .get(&Inner::key(kind, &ns, name))
            {
                Some(o) => json_response(200, &present(o, &api_version)),
                None => status_response(&ApiError::not_found(kind, name)),
            }
        }
        (&Method::POST, None) if sub.is_none() => write(&fake, kind, &api_version, |g| {
            let obj = parse_body(&body)?;
            Ok((201, g.create(kind, r.ns.as_deref(), obj, true)?))
        }),
        (&Method::POST, Some(name)) if kind == Kind::Pod && sub == Some("binding") => {
            write(&fake, kind, &api_version, |g| {
                let binding = parse_body(&body)?;
                g.bind(&ns, name, &binding)?;
                Ok((
                    201,
                    Arc::new(
                        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                    ),
                ))
            })
        }
        (&Method::PUT, Some(name)) if whole_object => write(&fake, kind, &api_version, |g| {
            let obj = parse_body(&body)?;
            let res = resource_label(kind);
            let o = g.update_with(kind, &ns, name, &res, |cur| {
                *cur = obj;
                Ok(())
            })?;
            Ok((200, o))
        }),
        (&Method::PATCH, Some(name)) if whole_object => write(&fake, kind, &api_version, |g| {
            let p = parse_body(&body)?;
            let ct = content_type.as_deref().unwrap_or("");
            let media = ct.split(';').next().unwrap_or("").trim();
            let res = resource_label(kind);
            let o = match media {
                // Strategic merge is approximated by a JSON merge patch (module docs).
                "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                    if !p.is_object() {
                        return Err(ApiError::bad_request("merge patch must be a JSON object"));
                    }
                    g.update_with(kind, &ns, name, &res, |cur| {
                        patch::merge_patch(cur, &p);
                        Ok(())
                    })?
                }
                "application/json-patch+json" => {
                    g.update_with(kind, &ns, name, &res, |cur| patch::json_patch(cur, &p))?
                }
                other => {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        format!(
                            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {other:?})"
                        ),
                    ));
                }
            };
            Ok((200, o))
        }),
        (&Method::DELETE, Some(name)) if sub.is_none() => write(&fake, kind, &api_version, |g| {
            // DeleteOptions are optional; only their preconditions matter here.
            let opts = if body.iter().all(u8::is_ascii_whitespace) {
                Value::Null
            } else {
                parse_body(&body)?
            };
            // Graceful deletion only when asked for explicitly (module docs of the fake).
            let grace = opts
                .get("gracePeriodSeconds")
                .and_then(Value::as_i64)
                .or_else(|| q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()));
            Ok((
                200,
                g.delete(kind, &ns, name, opts.get("preconditions"), grace)?,
            ))
        }),
        _ if sub.is_some_and(|s| s != "status" && s != "binding") => path_not_found(),
        _ => status_response(&ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )),
    }
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

/// Runs a write under the lock after consulting the `fail_writes` knob.
fn write(
    fake: &FakeApiServer,
    kind: Kind,
    api_version: &str,
    f: impl FnOnce(&mut Inner) -> Result<(u16, Arc<Value>), ApiError>,
) -> Response {
    let mut g = fake.inner.lock();
    if let Some(e) = g.fail_write(kind) {
        return status_response(&e);
    }
    match f(&mut g) {
        Ok((code, obj)) => {
            drop(g);
            if obj.get("kind").and_then(Value::as_str) == Some("Status") {
                json_response(code, &*obj)
            } else {
                json_response(code, &present(&obj, api_version))
            }
        }
        Err(e) => status_response(&e),
    }
}

fn parse_continue(tok: &str) -> Option<(u64, u64, usize)> {
    let mut it = tok.split('-');
    let rv = it.next()?.parse().ok()?;
    let id = it.next()?.parse().ok()?;
    let offset = it.next()?.parse().ok()?;
    it.next().is_none().then_some((rv, id, offset))
}

#[derive(Serialize)]
struct ListOut<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: String,
    metadata: Value,
    items: Vec<Cow<'a, Value>>,
}

/// Whether a request is one the test's scripted faults (gates, delays, injected failures)
/// apply to. Pods have two streams: the assigned pods, which every pod script means, and the
/// pending pods with a nominated node (`status.nominatedNodeName!=`), which lists ~nothing and
/// is left unscripted, so stepping through "the pod list" page by page stays one stream.
fn scripted(kind: Kind, q: &HashMap<String, String>) -> bool {
    kind != Kind::Pod
        || !q
            .get("fieldSelector")
            .is_some_and(|s| s.contains("status.nominatedNodeName!="))
}

async fn list(fake: FakeApiServer, r: &ResourcePath, q: &HashMap<String, String>) -> Response {
    let kind = r.kind;
    let (fail, delay, gate) = if !scripted(kind, q) {
        (None, Duration::ZERO, None)
    } else {
        let mut g = fake.inner.lock();
        let ks = g.ks(kind);
        ks.list_pages_since_arm += 1;
        let fail = match ks.fail_list_page {
            Some((nth, code)) if nth == ks.list_pages_since_arm => {
                ks.fail_list_page = None;
                Some(code)
            }
            _ => None,
        };
        let fail = fail.or_else(|| match ks.fail_lists.as_mut() {
            Some((code, left)) => {
                let code = *code;
                *left -= 1;
                if *left == 0 {
                    ks.fail_lists = None;
                }
                Some(code)
            }
            None => None,
        });
        (fail, ks.list_delay, ks.list_gate.clone())
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(gate) = gate {
        gate.wait().await;
    }
    if let Some(code) = fail {
        return status_response(&ApiError::injected(code));
    }
    let selector = match FieldSelector::parse(kind, q.get("fieldSelector").map(String::as_str)) {
        Ok(s) => s,
        Err(e) => return status_response(&e),
    };
    let limit = match q.get("limit").map(|l| l.parse::<usize>()) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => return status_response(&ApiError::bad_request("limit must be an integer")),
    };
    let (snap, page_start, page_end, cont) = {
        let mut g = fake.inner.lock();
        let (snap, offset, id) = match q.get("continue").filter(|t| !t.is_empty()) {
            Some(tok) => {
                let Some((rv, id, offset)) = parse_continue(tok) else {
                    return status_response(&ApiError::bad_request(format!(
                        "continue key is not valid: {tok:?}"
                    )));
                };
                match g.snapshots.get(&id) {
                    Some(s) if rv >= g.floor && s.rv == rv => (s.clone(), offset, Some(id)),
                    _ => {
                        return status_response(&ApiError::expired(
                            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results.",
                        ));
                    }
                }
            }
            None => {
                let ns = r.ns.as_deref();
                let items = g.kinds[kind.idx()]
                    .objects
                    .iter()
                    .filter(|((ons, _), o)| ns.is_none_or(|n| n == ons) && selector.matches(o))
                    .map(|(_, o)| o.clone())
                    .collect();
                (Arc::new(Snapshot { rv: g.rv, items }), 0, None)
            }
        };
        let len = snap.items.len();
        let start = offset.min(len);
        let end = if limit == 0 {
            len
        } else {
            (start + limit).min(len)
        };
        let cont = if end < len {
            let id = id.unwrap_or_else(|| {
                let id = g.next_id;
                g.next_id += 1;
                g.snapshots.insert(id, snap.clone());
                while g.snapshots.len() > MAX_SNAPSHOTS {
                    g.snapshots.pop_first();
                }
                id
            });
            Some(format!("{}-{id}-{end}", snap.rv))
        } else {
            if let Some(id) = id {
                g.snapshots.remove(&id);
            }
            None
        };
        (snap, start, end, cont)
    };
    let api_version = kind.api_version_for(&r.version);
    let mut metadata = json!({"resourceVersion": snap.rv.to_string()});
    if let Some(c) = cont {
        metadata["continue"] = json!(c);
        metadata["remainingItemCount"] = json!(snap.items.len() - page_end);
    }
    let out = ListOut {
        api_version: &api_version,
        kind: format!("{}List", kind.kind_name()),
        metadata,
        items: snap.items[page_start..page_end]
            .iter()
            .map(|o| present(o, &api_version))
            .collect(),
    };
    json_response(200, &out)
}

#[derive(Serialize)]
struct EventOut<'a> {
    #[serde(rename = "type")]
    ty: &'a str,
    object: &'a Value,
}

fn event_line(ty: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&EventOut { ty, object }).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

async fn watch(fake: FakeApiServer, r: &ResourcePath, q: &HashMap<String, String>) -> Response {
    let kind = r.kind;
    let (fail, delay, interval, gate) = if !scripted(kind, q) {
        let interval = fake.inner.lock().bookmark_interval;
        (None, Duration::ZERO, interval, None)
    } else {
        let mut g = fake.inner.lock();
        let interval = g.bookmark_interval;
        let ks = g.ks(kind);
        let fail = match ks.fail_watch_start.as_mut() {
            Some((code, left)) => {
                let code = *code;
                *left -= 1;
                if *left == 0 {
                    ks.fail_watch_start = None;
                }
                Some(code)
            }
            None => None,
        };
        (fail, ks.watch_delay, interval, ks.watch_gate.clone())
    };
    if let Some(code) = fail {
        return status_response(&ApiError::injected(code));
    }
    let selector = match FieldSelector::parse(kind, q.get("fieldSelector").map(String::as_str)) {
        Ok(s) => s,
        Err(e) => return status_response(&e),
    };
    let start_rv = match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(s) => match s.parse::<u64>() {
            Ok(v) => Some(v),
            Err(_) => {
                return status_response(&ApiError::bad_request(format!(
                    "invalid resource version: {s:?}"
                )));
            }
        },
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| truthy(b));
    let send_initial = q.get("sendInitialEvents").is_some_and(|b| truthy(b));
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(gate) = gate {
        gate.wait().await;
    }
    let api_version = kind.api_version_for(&r.version);
    let (in_tx, in_rx) = mpsc::unbounded_channel();
    let id = {
        let mut g = fake.inner.lock();
        match start_rv {
            Some(rv) if !send_initial => {
                if rv < g.floor {
                    // In-stream, with HTTP 200: an HTTP 410 would make kube retry the same RV
                    // forever instead of relisting (rust-stack.md §2.2).
                    let err =
                        ApiError::expired(format!("too old resource version: {rv} ({})", g.floor));
                    drop(g);
                    let line = event_line("ERROR", &err.to_status());
                    return stream_response(Body::from(line));
                }
                for e in g.kinds[kind.idx()].log.iter().filter(|e| e.rv > rv) {
                    let _ = in_tx.send(WatchMsg::Event(e.clone()));
                }
            }
            _ => {
                for o in g.kinds[kind.idx()].objects.values() {
                    let _ = in_tx.send(WatchMsg::Initial(o.clone()));
                }
                if send_initial {
                    let _ = in_tx.send(WatchMsg::InitialEnd(g.rv));
                }
            }
        }
        let id = g.next_id;
        g.next_id += 1;
        g.ks(kind).watchers.insert(id, in_tx);
        if !scripted(kind, q) {
            g.ks(kind).unscripted.insert(id);
        }
        id
    };
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Bytes>();
    let task = WatchTask {
        fake,
        kind,
        id,
        api_version,
        ns: r.ns.clone(),
        selector,
        bookmarks,
    };
    tokio::spawn(task.run(in_rx, out_tx, timeout, interval));
    let stream = futures::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    stream_response(Body::from_stream(stream))
}

fn stream_response(body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap_or_default()
}

struct WatchTask {
    fake: FakeApiServer,
    kind: Kind,
    id: u64,
    api_version: String,
    ns: Option<String>,
    selector: FieldSelector,
    bookmarks: bool,
}

impl WatchTask {
    async fn run(
        self,
        mut in_rx: mpsc::UnboundedReceiver<WatchMsg>,
        out: mpsc::UnboundedSender<Bytes>,
        timeout: Duration,
        interval: Duration,
    ) {
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = (self.bookmarks && !interval.is_zero()).then(|| {
            let mut i = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        });
        'outer: loop {
            tokio::select! {
                biased;
                _ = out.closed() => break,
                msg = in_rx.recv() => match msg {
                    None | Some(WatchMsg::Close) => break,
                    Some(m) => if !self.emit(&out, m) { break },
                },
                _ = async {
                    match ticker.as_mut() {
                        Some(t) => { t.tick().await; }
                        None => std::future::pending::<()>().await,
                    }
                } => {
                    // Drain under the lock so the bookmark RV never overtakes an event that
                    // was already committed but not yet sent on this stream.
                    let (pending, rv, held) = {
                        let mut g = self.fake.inner.lock();
                        let mut v = Vec::new();
                        while let Ok(m) = in_rx.try_recv() {
                            v.push(m);
                        }
                        let held = g.ks(self.kind).held_events.is_some();
                        (v, g.rv, held)
                    };
                    for m in pending {
                        if matches!(m, WatchMsg::Close) || !self.emit(&out, m) {
                            break 'outer;
                        }
                    }
                    // A lagging stream (events held) sends no bookmark past what it delivered.
                    if !held && !self.emit(&out, WatchMsg::Bookmark(rv)) {
                        break;
                    }
                }
                _ = &mut deadline => break,
            }
        }
        let mut g = self.fake.inner.lock();
        let ks = g.ks(self.kind);
        ks.watchers.remove(&self.id);
        ks.unscripted.remove(&self.id);
    }

    fn ns_ok(&self, obj: &Value) -> bool {
        self.ns
            .as_deref()
            .is_none_or(|ns| meta_str(obj, "namespace") == Some(ns))
    }

    /// Returns false when the client is gone.
    fn emit(&self, out: &mpsc::UnboundedSender<Bytes>, msg: WatchMsg) -> bool {
        let line = match msg {
            WatchMsg::Event(e) => match self.convert(&e) {
                Some(l) => l,
                None => return true,
            },
            WatchMsg::Initial(o) => {
                if !self.ns_ok(&o) || !self.selector.matches(&o) {
                    return true;
                }
                event_line("ADDED", &present(&o, &self.api_version))
            }
            WatchMsg::InitialEnd(rv) => self.bookmark(rv, true),
            WatchMsg::Bookmark(rv) => {
                if !self.bookmarks {
                    return true;
                }
                self.bookmark(rv, false)
            }
            WatchMsg::Close => return false,
        };
        out.send(line).is_ok()
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        event_line(
            "BOOKMARK",
            &json!({"kind": self.kind.kind_name(), "apiVersion": self.api_version, "metadata": metadata}),
        )
    }

    /// The apiserver cacheWatcher's rule: an object that starts matching the selector is
    /// ADDED, one that stops matching is DELETED carrying its *previous* content stamped with
    /// the event's RV, and MODIFIED only when it matched before and after.
    fn convert(&self, e: &LogEntry) -> Option<Bytes> {
        if !self.ns_ok(&e.obj) {
            return None;
        }
        let av = &self.api_version;
        let cur = self.selector.matches(&e.obj);
        match e.ty {
            EventType::Added => cur.then(|| event_line("ADDED", &present(&e.obj, av))),
            EventType::Deleted => cur.then(|| event_line("DELETED", &present(&e.obj, av))),
            EventType::Modified => {
                let old = self.selector.is_empty()
                    || e.prev.as_ref().is_some_and(|p| self.selector.matches(p));
                match (old, cur) {
                    (true, true) => Some(event_line("MODIFIED", &present(&e.obj, av))),
                    (false, true) => Some(event_line("ADDED", &present(&e.obj, av))),
                    (true, false) => {
                        let mut prev = e.prev.as_deref().cloned().unwrap_or(Value::Null);
                        if let Some(Value::Object(m)) = prev.get_mut("metadata") {
                            m.insert("resourceVersion".into(), json!(e.rv.to_string()));
                        }
                        Some(event_line("DELETED", &present(&prev, av)))
                    }
                    (false, false) => None,
                }
            }
        }
    }
}
