//! Tests of the fake API server itself, driven through the real `kube::Client` and the real
//! `kube::runtime::watcher`, so the fake is checked against the protocol kube actually speaks.

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::support::{FakeApiServer, Kind, RbacRequest};

const WAIT: Duration = Duration::from_secs(10);

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
}

fn pod(ns: &str, name: &str, node: Option<&str>, phase: &str) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": phase},
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    p
}

async fn next<S: Stream + Unpin>(s: &mut S) -> S::Item {
    tokio::time::timeout(WAIT, s.next())
        .await
        .expect("timed out waiting for a stream item")
        .expect("stream ended")
}

/// Compact label for a watcher event, so sequences compare as strings.
fn label<K: kube::Resource>(ev: &Result<watcher::Event<K>, watcher::Error>) -> String {
    match ev {
        Ok(watcher::Event::Init) => "Init".into(),
        Ok(watcher::Event::InitApply(o)) => format!("InitApply({})", o.name_any()),
        Ok(watcher::Event::InitDone) => "InitDone".into(),
        Ok(watcher::Event::Apply(o)) => format!("Apply({})", o.name_any()),
        Ok(watcher::Event::Delete(o)) => format!("Delete({})", o.name_any()),
        Err(e) => format!("Err({e})"),
    }
}

/// Runs a watcher in its own task, as a real consumer does: kube only opens the watch when the
/// stream is polled past `InitDone`, so a test that waits for `open_watches` must keep it polled.
fn drive<K>(
    s: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
) -> tokio::sync::mpsc::UnboundedReceiver<String>
where
    K: kube::Resource + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut s = std::pin::pin!(s);
        while let Some(ev) = s.next().await {
            if tx.send(label(&ev)).is_err() {
                break;
            }
        }
    });
    rx
}

async fn recv(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("timed out waiting for a watcher event")
        .expect("watcher task ended")
}

async fn recv_n(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, n: usize) -> Vec<String> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(recv(rx).await);
    }
    v
}

/// Polls an undriven watcher briefly so it opens its watch, then confirms it is open. Keeping
/// the watcher unpolled afterwards lets a test change the server "while it is away".
async fn establish<S: Stream + Unpin>(fake: &FakeApiServer, kind: Kind, s: &mut S) {
    assert!(
        tokio::time::timeout(Duration::from_millis(300), s.next())
            .await
            .is_err(),
        "unexpected event while establishing the watch"
    );
    assert!(fake.wait_for_watches(kind, 1, WAIT).await);
}

fn watch_label<K: kube::Resource>(ev: &kube::Result<WatchEvent<K>>) -> String {
    match ev {
        Ok(WatchEvent::Added(o)) => format!("ADDED({})", o.name_any()),
        Ok(WatchEvent::Modified(o)) => format!("MODIFIED({})", o.name_any()),
        Ok(WatchEvent::Deleted(o)) => format!("DELETED({})", o.name_any()),
        Ok(WatchEvent::Bookmark(b)) => format!("BOOKMARK({})", b.metadata.resource_version),
        Ok(WatchEvent::Error(s)) => format!("ERROR({} {})", s.code, s.reason),
        Err(e) => format!("Err({e})"),
    }
}

fn api_code<T: std::fmt::Debug>(r: kube::Result<T>) -> u16 {
    match r {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn list_pagination_serves_a_consistent_snapshot() {
    let fake = FakeApiServer::new();
    fake.create_many(Kind::Node, (0..10).map(|i| node(&format!("n{i:02}"))))
        .unwrap();
    let nodes: Api<Node> = Api::all(fake.client());

    let first = nodes.list(&ListParams::default().limit(4)).await.unwrap();
    let list_rv = first.metadata.resource_version.clone().unwrap();
    let mut names: Vec<String> = first.items.iter().map(|n| n.name_any()).collect();
    assert_eq!(names.len(), 4);

    // Writes between pages must not show up in the continuation pages.
    fake.delete(Kind::Node, "", "n07").unwrap();
    fake.create(Kind::Node, node("n99")).unwrap();

    let mut token = first.metadata.continue_.clone();
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = nodes
            .list(&ListParams::default().limit(4).continue_token(&t))
            .await
            .unwrap();
        assert_eq!(page.metadata.resource_version.as_deref(), Some(&*list_rv));
        names.extend(page.items.iter().map(|n| n.name_any()));
        token = page.metadata.continue_.clone();
    }
    let want: Vec<String> = (0..10).map(|i| format!("n{i:02}")).collect();
    assert_eq!(names, want);

    // A fresh list sees the writes.
    let now: Vec<String> = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert!(now.contains(&"n99".to_string()) && !now.contains(&"n07".to_string()));

    // A continue token minted below the compaction floor answers HTTP 410 Expired.
    let first = nodes.list(&ListParams::default().limit(4)).await.unwrap();
    fake.create(Kind::Node, node("n100")).unwrap();
    fake.compact();
    let tok = first.metadata.continue_.unwrap();
    let err = nodes
        .list(&ListParams::default().limit(4).continue_token(&tok))
        .await;
    match err {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_replays_from_a_resource_version() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, node("a")).unwrap();
    fake.create(Kind::Node, node("b")).unwrap();
    let rv = fake.current_rv().to_string();
    fake.create(Kind::Node, node("c")).unwrap();
    fake.patch_merge(
        Kind::Node,
        "",
        "a",
        json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .unwrap();
    fake.delete(Kind::Node, "", "b").unwrap();

    let nodes: Api<Node> = Api::all(fake.client());
    let mut s = nodes
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(watch_label(&next(&mut s).await));
    }
    assert_eq!(got, ["ADDED(c)", "MODIFIED(a)", "DELETED(b)"]);

    // Live events follow the replay on the same stream.
    fake.create(Kind::Node, node("d")).unwrap();
    assert_eq!(watch_label(&next(&mut s).await), "ADDED(d)");

    // DELETED carries the deletion's RV, newer than the object's last write.
    let rv_before = fake.current_rv();
    fake.delete(Kind::Node, "", "d").unwrap();
    match next(&mut s).await.unwrap() {
        WatchEvent::Deleted(n) => {
            assert_eq!(n.resource_version(), Some((rv_before + 1).to_string()))
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn bookmarks_are_sent_and_swallowed_by_the_watcher() {
    let fake = FakeApiServer::new();
    fake.set_bookmark_interval(Duration::from_millis(20));
    fake.create(Kind::Node, node("a")).unwrap();

    // Raw watch: bookmarks arrive, with the kind's apiVersion/kind and the current RV.
    let nodes: Api<Node> = Api::all(fake.client());
    let rv = fake.current_rv().to_string();
    let mut raw = nodes
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match next(&mut raw).await.unwrap() {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.metadata.resource_version, rv);
            assert_eq!(
                (b.types.api_version.as_str(), b.types.kind.as_str()),
                ("v1", "Node")
            );
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
    drop(raw);

    // kube's watcher: bookmarks never surface; the next event after them is the real change.
    let mut w = drive(watcher(nodes, watcher::Config::default()));
    assert_eq!(
        recv_n(&mut w, 3).await,
        ["Init", "InitApply(a)", "InitDone"]
    );
    assert!(fake.wait_for_watches(Kind::Node, 1, WAIT).await);
    tokio::time::sleep(Duration::from_millis(100)).await; // several periodic bookmarks
    fake.send_bookmarks(); // and an on-demand one
    fake.create(Kind::Node, node("b")).unwrap();
    assert_eq!(recv(&mut w).await, "Apply(b)");
}

#[tokio::test]
async fn watch_ends_after_timeout_seconds() {
    let fake = FakeApiServer::new();
    let nodes: Api<Node> = Api::all(fake.client());
    let rv = fake.current_rv().to_string();
    let mut s = nodes
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    let end = tokio::time::timeout(WAIT, s.next()).await.unwrap();
    assert!(end.is_none(), "expected the stream to end");
    // The server side lets go of the ended watch (a wait for "at least 0" could not fail).
    let deadline = tokio::time::Instant::now() + WAIT;
    while fake.open_watches(Kind::Node) != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ended watch is still registered on the server"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn compaction_plus_closed_watch_forces_a_relist() {
    let fake = FakeApiServer::new();
    for n in ["a", "b", "c"] {
        fake.create(Kind::Node, node(n)).unwrap();
    }
    let nodes: Api<Node> = Api::all(fake.client());
    let mut w = watcher(nodes, watcher::Config::default()).boxed();
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(label(&next(&mut w).await));
    }
    assert_eq!(
        got,
        [
            "Init",
            "InitApply(a)",
            "InitApply(b)",
            "InitApply(c)",
            "InitDone"
        ]
    );
    establish(&fake, Kind::Node, &mut w).await;

    // Drop the stream first, so the delete is never delivered; then compact past it.
    fake.close_watches();
    assert_eq!(fake.open_watches(Kind::Node), 0);
    fake.delete(Kind::Node, "", "b").unwrap();
    fake.create(Kind::Node, node("d")).unwrap();
    fake.compact();

    let err = label(&next(&mut w).await);
    assert!(err.starts_with("Err(") && err.contains("Expired"), "{err}");
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(label(&next(&mut w).await));
    }
    assert_eq!(
        got,
        [
            "Init",
            "InitApply(a)",
            "InitApply(c)",
            "InitApply(d)",
            "InitDone"
        ]
    );
}

#[tokio::test]
async fn a_closed_watch_resumes_without_relist_when_not_compacted() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, node("a")).unwrap();
    let nodes: Api<Node> = Api::all(fake.client());
    let mut w = watcher(nodes, watcher::Config::default()).boxed();
    for _ in 0..3 {
        next(&mut w).await.unwrap();
    }
    establish(&fake, Kind::Node, &mut w).await;
    fake.close_watches();
    fake.delete(Kind::Node, "", "a").unwrap();
    // The re-watch from the last RV replays the missed DELETED: no Init, no Err.
    assert_eq!(label(&next(&mut w).await), "Delete(a)");
}

#[tokio::test]
async fn field_selector_transitions_match_a_real_server() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Pod, pod("ns", "running", Some("n1"), "Running"))
        .unwrap();
    fake.create(Kind::Pod, pod("ns", "pending", None, "Pending"))
        .unwrap();
    let pods: Api<Pod> = Api::all(fake.client());

    // kube-scheduler's non-terminal pods watch.
    let mut active = drive(watcher(
        pods.clone(),
        watcher::Config::default().fields("status.phase!=Failed,status.phase!=Succeeded"),
    ));
    // The assigned-pods watch.
    let mut assigned = drive(watcher(
        pods.clone(),
        watcher::Config::default().fields("spec.nodeName!="),
    ));
    let got = recv_n(&mut active, 4).await;
    assert_eq!(
        got,
        [
            "Init",
            "InitApply(pending)",
            "InitApply(running)",
            "InitDone"
        ]
    );
    assert_eq!(
        recv_n(&mut assigned, 3).await,
        ["Init", "InitApply(running)", "InitDone"]
    );
    assert!(fake.wait_for_watches(Kind::Pod, 2, WAIT).await);

    // Binding makes the pending pod start matching `spec.nodeName!=`: ADDED there, MODIFIED
    // on the phase watch.
    fake.bind_pod("ns", "pending", "n2").unwrap();
    assert_eq!(recv(&mut assigned).await, "Apply(pending)");
    assert_eq!(recv(&mut active).await, "Apply(pending)");

    // Turning Succeeded stops matching the phase selector: DELETED there, MODIFIED on the
    // assigned watch.
    fake.set_pod_phase("ns", "running", "Succeeded").unwrap();
    assert_eq!(recv(&mut active).await, "Delete(running)");
    assert_eq!(recv(&mut assigned).await, "Apply(running)");

    // The raw stream shows the real event types (the watcher folds ADDED/MODIFIED into Apply).
    let rv = fake.current_rv().to_string();
    let wp = WatchParams::default().fields("status.phase!=Failed,status.phase!=Succeeded");
    let mut raw = pods.watch(&wp, &rv).await.unwrap().boxed();
    let wp2 = WatchParams::default().fields("spec.nodeName!=");
    let mut raw2 = pods.watch(&wp2, &rv).await.unwrap().boxed();
    fake.create(Kind::Pod, pod("ns", "new", None, "Pending"))
        .unwrap();
    assert_eq!(watch_label(&next(&mut raw).await), "ADDED(new)");
    fake.bind_pod("ns", "new", "n1").unwrap();
    assert_eq!(watch_label(&next(&mut raw).await), "MODIFIED(new)");
    assert_eq!(watch_label(&next(&mut raw2).await), "ADDED(new)");
    let rv_before = fake.current_rv();
    fake.set_pod_phase("ns", "new", "Failed").unwrap();
    match next(&mut raw).await.unwrap() {
        // Like the apiserver's cacheWatcher: previous content, stamped with the event's RV.
        WatchEvent::Deleted(p) => {
            assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
            assert_eq!(
                p.metadata.resource_version,
                Some((rv_before + 1).to_string())
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(watch_label(&next(&mut raw2).await), "MODIFIED(new)");
    fake.delete(Kind::Pod, "ns", "new").unwrap();
    assert_eq!(watch_label(&next(&mut raw2).await), "DELETED(new)");

    // Lists filter too; an unsupported field is a 400, not a silent match-all.
    let lp = ListParams::default().fields("spec.nodeName=n2,metadata.name=pending");
    let names: Vec<String> = pods
        .list(&lp)
        .await
        .unwrap()
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(names, ["pending"]);
    let lp = ListParams::default().fields("spec.schedulerName=x");
    assert_eq!(api_code(pods.list(&lp).await), 400);
}

#[tokio::test]
async fn binding_sets_node_name_with_conflicts() {
    let fake = FakeApiServer::new();
    let created = fake
        .create(Kind::Pod, pod("ns", "p", None, "Pending"))
        .unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let pods: Api<Pod> = Api::namespaced(fake.client(), "ns");
    let bind = |node: &str, uid: Option<&str>| {
        let mut b = json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "p"}, "target": {"kind": "Node", "name": node}});
        if let Some(u) = uid {
            b["metadata"]["uid"] = json!(u);
        }
        b
    };
    let pp = PostParams::default();

    let wrong_uid = pods
        .create_subresource::<_, Value>("binding", "p", &pp, &bind("n1", Some("nope")))
        .await;
    assert_eq!(api_code(wrong_uid), 409);

    let ok: Value = pods
        .create_subresource("binding", "p", &pp, &bind("n1", Some(&uid)))
        .await
        .unwrap();
    assert_eq!(ok["status"], "Success");
    let p = pods.get("p").await.unwrap();
    assert_eq!(p.spec.unwrap().node_name.as_deref(), Some("n1"));
    let conds = p.status.unwrap().conditions.unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "True")
    );

    let again = pods
        .create_subresource::<_, Value>("binding", "p", &pp, &bind("n2", None))
        .await;
    assert_eq!(api_code(again), 409);
    let missing = pods
        .create_subresource::<_, Value>("binding", "nope", &pp, &bind("n2", None))
        .await;
    assert_eq!(api_code(missing), 400); // name in URL vs body
}

#[tokio::test]
async fn patches_and_resource_version_preconditions() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Pod, pod("ns", "p", Some("n1"), "Running"))
        .unwrap();
    let client = fake.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
    let pp = PatchParams::default();

    let p = pods
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"annotations": {"a": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.annotations().get("a").map(String::as_str), Some("1"));
    let rv = p.resource_version().unwrap();

    // Strategic merge is treated as a merge patch.
    pods.patch(
        "p",
        &pp,
        &Patch::Strategic(json!({"metadata": {"labels": {"l": "x"}}})),
    )
    .await
    .unwrap();

    // JSON patch through the raw client (kube's Patch::Json needs the json-patch crate).
    let req = http::Request::patch("/api/v1/namespaces/ns/pods/p")
        .header("content-type", "application/json-patch+json")
        .body(
            serde_json::to_vec(&json!([
                {"op": "add", "path": "/metadata/annotations/b", "value": "2"},
                {"op": "remove", "path": "/metadata/annotations/a"},
            ]))
            .unwrap(),
        )
        .unwrap();
    let p: Pod = client.request(req).await.unwrap();
    let ann = p.annotations();
    assert_eq!(
        (ann.get("a"), ann.get("b").map(String::as_str)),
        (None, Some("2"))
    );

    // A failing `test` op rejects the whole patch with 422 and changes nothing.
    let req = http::Request::patch("/api/v1/namespaces/ns/pods/p")
        .header("content-type", "application/json-patch+json")
        .body(
            serde_json::to_vec(&json!([
                {"op": "add", "path": "/metadata/annotations/c", "value": "3"},
                {"op": "test", "path": "/spec/nodeName", "value": "other"},
            ]))
            .unwrap(),
        )
        .unwrap();
    assert_eq!(api_code(client.request::<Pod>(req).await), 422);
    assert!(fake.get(Kind::Pod, "ns", "p").unwrap()["metadata"]["annotations"]["c"].is_null());

    // A stale metadata.resourceVersion inside a patch is a precondition → 409.
    let stale = Patch::Merge(json!({"metadata": {"resourceVersion": rv, "labels": {"z": "1"}}}));
    assert_eq!(api_code(pods.patch("p", &pp, &stale).await), 409);
    // ...and so is a stale PUT; a fresh one succeeds.
    let mut cur = pods.get("p").await.unwrap();
    let mut stale_obj = cur.clone();
    stale_obj.metadata.resource_version = Some(rv.clone());
    assert_eq!(
        api_code(pods.replace("p", &PostParams::default(), &stale_obj).await),
        409
    );
    cur.labels_mut().insert("fresh".into(), "yes".into());
    let replaced = pods
        .replace("p", &PostParams::default(), &cur)
        .await
        .unwrap();
    assert_ne!(replaced.resource_version(), cur.resource_version());

    // A no-op patch does not bump the RV (real GuaranteedUpdate behaviour).
    let before = fake.current_rv();
    pods.patch(
        "p",
        &pp,
        &Patch::Merge(json!({"metadata": {"labels": {"fresh": "yes"}}})),
    )
    .await
    .unwrap();
    assert_eq!(fake.current_rv(), before);

    // Unsupported patch type, unknown object, create conflicts, delete.
    let apply = PatchParams::apply("test");
    assert_eq!(
        api_code(pods.patch("p", &apply, &Patch::Apply(json!({}))).await),
        415
    );
    assert_eq!(
        api_code(pods.patch("zz", &pp, &Patch::Merge(json!({}))).await),
        404
    );
    let mut dup: Pod = serde_json::from_value(pod("ns", "p", None, "Pending")).unwrap();
    assert_eq!(
        api_code(pods.create(&PostParams::default(), &dup).await),
        409
    );
    dup.metadata.name = Some("q".into());
    pods.create(&PostParams::default(), &dup).await.unwrap();
    pods.delete("q", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_code(pods.get("q").await), 404);
}

#[tokio::test]
async fn leases_support_leader_election_calls() {
    let fake = FakeApiServer::new();
    let leases: Api<Lease> = Api::namespaced(fake.client(), "kube-system");
    let l: Lease = serde_json::from_value(json!({
        "metadata": {"name": "ext"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &l).await.unwrap();
    assert_eq!(created.namespace().as_deref(), Some("kube-system"));
    let mut mine = leases.get("ext").await.unwrap();
    let theirs = mine.clone();
    mine.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("ext", &PostParams::default(), &mine)
        .await
        .unwrap();
    // The loser of the race gets 409.
    assert_eq!(
        api_code(leases.replace("ext", &PostParams::default(), &theirs).await),
        409
    );
}

#[tokio::test]
async fn fault_knobs_fail_lists_and_writes() {
    let fake = FakeApiServer::new();
    fake.create_many(Kind::Node, (0..5).map(|i| node(&format!("n{i}"))))
        .unwrap();
    let nodes: Api<Node> = Api::all(fake.client());

    // The second page of the next list fails; kube's watcher reports it and relists.
    fake.fail_list_page(Kind::Node, 2, 500);
    let mut w = watcher(nodes.clone(), watcher::Config::default().page_size(2)).boxed();
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(label(&next(&mut w).await));
    }
    assert_eq!(&got[..3], ["Init", "InitApply(n0)", "InitApply(n1)"]);
    assert!(got[3].starts_with("Err("), "{got:?}");
    let mut got = Vec::new();
    for _ in 0..7 {
        got.push(label(&next(&mut w).await));
    }
    assert_eq!(got[0], "Init");
    assert_eq!(got[6], "InitDone");

    // Writes: exactly `count` HTTP writes fail, then they succeed again.
    fake.fail_writes(Kind::Node, 503, 2);
    let n: Node = serde_json::from_value(node("x")).unwrap();
    assert_eq!(
        api_code(nodes.create(&PostParams::default(), &n).await),
        503
    );
    let pp = PatchParams::default();
    let patch = Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}));
    assert_eq!(api_code(nodes.patch("n0", &pp, &patch).await), 503);
    nodes.create(&PostParams::default(), &n).await.unwrap();

    // Pod bindings count as pod writes.
    fake.create(Kind::Pod, pod("ns", "p", None, "Pending"))
        .unwrap();
    fake.fail_writes(Kind::Pod, 500, 1);
    let pods: Api<Pod> = Api::namespaced(fake.client(), "ns");
    let b = json!({"metadata": {"name": "p"}, "target": {"name": "n0"}});
    let r = pods
        .create_subresource::<_, Value>("binding", "p", &PostParams::default(), &b)
        .await;
    assert_eq!(api_code(r), 500);
    pods.create_subresource::<_, Value>("binding", "p", &PostParams::default(), &b)
        .await
        .unwrap();

    // Watch start failures are HTTP errors (kube retries the same RV).
    fake.fail_watch_start(Kind::Node, 403, 1);
    let r = nodes.watch(&WatchParams::default(), "1").await;
    assert!(r.is_err());
}

#[tokio::test]
async fn delays_hold_lists_and_watches() {
    let fake = FakeApiServer::new();
    let nodes: Api<Node> = Api::all(fake.client());
    fake.set_list_delay(Kind::Node, Duration::from_millis(200));
    let t = std::time::Instant::now();
    nodes.list(&ListParams::default()).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(200));
    fake.set_watch_delay(Kind::Node, Duration::from_millis(200));
    let t = std::time::Instant::now();
    let _s = nodes.watch(&WatchParams::default(), "1").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn crds_can_be_unserved_and_versions_convert() {
    let fake = FakeApiServer::new();
    fake.create(
        Kind::Device,
        json!({"metadata": {"name": "n1"}, "spec": {"devices": []}}),
    )
    .unwrap();
    fake.create(
        Kind::NodeResourceTopology,
        json!({"metadata": {"name": "n1"}, "zones": []}),
    )
    .unwrap();
    let client = fake.client();
    let devices: Api<DynamicObject> = Api::all_with(client.clone(), &Kind::Device.api_resource());
    assert_eq!(
        devices
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // NRT is served under v1alpha2 and v1alpha1, each object in the requested version.
    let v1 = Kind::NodeResourceTopology.api_resource_at("v1alpha1");
    let nrt_v1: Api<DynamicObject> = Api::all_with(client.clone(), &v1);
    let got = nrt_v1.get("n1").await.unwrap();
    assert_eq!(
        got.types.unwrap().api_version,
        "topology.node.k8s.io/v1alpha1"
    );

    let groups: Value = client
        .request(http::Request::get("/apis").body(Vec::new()).unwrap())
        .await
        .unwrap();
    let has = |g: &Value, name: &str| {
        g["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == name)
    };
    assert!(has(&groups, "scheduling.koordinator.sh"));

    fake.set_crd_served(Kind::Device, false);
    assert_eq!(api_code(devices.list(&ListParams::default()).await), 404);
    let groups: Value = client
        .request(http::Request::get("/apis").body(Vec::new()).unwrap())
        .await
        .unwrap();
    assert!(!has(&groups, "scheduling.koordinator.sh"));
    assert!(has(&groups, "topology.node.k8s.io"));
    let rl = client
        .request::<Value>(
            http::Request::get("/apis/scheduling.koordinator.sh/v1alpha1")
                .body(Vec::new())
                .unwrap(),
        )
        .await;
    assert_eq!(api_code(rl), 404);

    fake.set_crd_served(Kind::Device, true);
    assert_eq!(
        devices
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let v: Value = client
        .request(http::Request::get("/version").body(Vec::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(v["major"], "1");
}

#[tokio::test]
async fn request_log_maps_to_rbac_attributes() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Pod, pod("ns", "p", None, "Pending"))
        .unwrap();
    let client = fake.client();
    let pods: Api<Pod> = Api::all(client.clone());
    let ns_pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
    pods.list(&ListParams::default()).await.unwrap();
    let _w = pods.watch(&WatchParams::default(), "1").await.unwrap();
    ns_pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    let b = json!({"metadata": {"name": "p"}, "target": {"name": "n0"}});
    ns_pods
        .create_subresource::<_, Value>("binding", "p", &PostParams::default(), &b)
        .await
        .unwrap();
    let _ = client
        .request::<Value>(http::Request::get("/version").body(Vec::new()).unwrap())
        .await;

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 5);
    // The list: a GET of the collection, not a watch.
    assert_eq!(
        (reqs[0].method.as_str(), reqs[0].path.as_str()),
        ("GET", "/api/v1/pods")
    );
    assert!(!reqs[0].query.contains("watch"), "{:?}", reqs[0]);
    assert_eq!(
        (reqs[1].method.as_str(), reqs[1].path.as_str()),
        ("GET", "/api/v1/pods")
    );
    assert!(reqs[1].query.contains("watch=true"), "{:?}", reqs[1]);
    assert_eq!(
        reqs[2].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    let r = |g: &str, res: &str, v: &str| RbacRequest {
        group: g.into(),
        resource: res.into(),
        verb: v.into(),
    };
    let want = [
        r("", "pods", "list"),
        r("", "pods", "watch"),
        r("", "pods", "patch"),
        r("", "pods/binding", "create"),
    ];
    assert_eq!(fake.rbac_requests().into_iter().collect::<Vec<_>>(), {
        let mut w = want.to_vec();
        w.sort();
        w
    });
    assert_eq!(reqs[4].rbac(), None); // /version is a non-resource URL
}

#[tokio::test]
async fn streaming_list_watch_is_supported() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, node("a")).unwrap();
    let nodes: Api<Node> = Api::all(fake.client());
    let mut w = watcher(nodes, watcher::Config::default().streaming_lists()).boxed();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(label(&next(&mut w).await));
    }
    assert_eq!(got, ["Init", "InitApply(a)", "InitDone"]);
    fake.create(Kind::Node, node("b")).unwrap();
    assert_eq!(label(&next(&mut w).await), "Apply(b)");
}

#[tokio::test]
async fn served_over_tcp_with_a_kubeconfig() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Node, node("a")).unwrap();
    let served = fake.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    served.write_kubeconfig(&path).unwrap();

    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    assert_eq!(config.cluster_url.to_string(), format!("{}/", served.url()));
    let client = Client::try_from(config).unwrap();
    let nodes: Api<Node> = Api::all(client);
    let mut w = drive(watcher(nodes.clone(), watcher::Config::default()));
    assert_eq!(
        recv_n(&mut w, 3).await,
        ["Init", "InitApply(a)", "InitDone"]
    );
    assert!(fake.wait_for_watches(Kind::Node, 1, WAIT).await);
    fake.create(Kind::Node, node("b")).unwrap();
    assert_eq!(recv(&mut w).await, "Apply(b)");

    served.stop().await;
    assert!(nodes.list(&ListParams::default()).await.is_err());
}

/// The bootstrap scale a later test uses: bulk setup holds every object and a paginated list
/// returns each exactly once. (How fast setup is belongs to the bootstrap bench, not here.)
#[tokio::test]
async fn bulk_setup_scales_to_bootstrap_size() {
    let fake = FakeApiServer::new();
    fake.create_many(
        Kind::Node,
        (0..5_000).map(|i| node(&format!("node-{i:05}"))),
    )
    .unwrap();
    fake.create_many(
        Kind::Pod,
        (0..50_000).map(|i| {
            let n = format!("node-{:05}", i % 5_000);
            pod("default", &format!("pod-{i:06}"), Some(&n), "Running")
        }),
    )
    .unwrap();
    assert_eq!(fake.count(Kind::Node), 5_000);
    assert_eq!(fake.count(Kind::Pod), 50_000);

    let pods: Api<Pod> = Api::all(fake.client());
    let mut w = watcher(pods, watcher::Config::default()).boxed();
    let mut n = 0;
    let mut names = std::collections::BTreeSet::new();
    loop {
        match next(&mut w).await {
            Ok(watcher::Event::InitApply(p)) => {
                n += 1;
                names.insert(p.name_any());
            }
            Ok(watcher::Event::InitDone) => break,
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(n, 50_000);
    assert_eq!(
        names.len(),
        50_000,
        "a paginated list repeated or skipped pods"
    );
    // 50_000 / 500 pages
    let lists = fake
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch"))
        .count();
    assert_eq!(lists, 100);
}

#[tokio::test]
async fn bad_requests_get_status_errors() {
    let fake = FakeApiServer::new();
    fake.create(Kind::Pod, pod("ns", "p", None, "Pending"))
        .unwrap();
    let client = fake.client();
    let call = |method: &str, uri: &str, ct: &str, body: &[u8]| {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", ct)
            .body(body.to_vec())
            .unwrap()
    };
    let json = "application/json";
    let cases = [
        (
            call("POST", "/api/v1/namespaces/ns/pods", json, b"{not json"),
            400,
        ),
        (
            call("POST", "/api/v1/namespaces/ns/pods", json, b"[1]"),
            400,
        ),
        (call("POST", "/api/v1/namespaces/ns/pods", json, b"{}"), 422),
        (call("GET", "/api/v1/pods?limit=x", json, b""), 400),
        (
            call("GET", "/api/v1/pods?limit=1&continue=garbage", json, b""),
            400,
        ),
        (
            call("GET", "/api/v1/pods?watch=1&resourceVersion=abc", json, b""),
            400,
        ),
        (
            call("GET", "/api/v1/pods?fieldSelector=spec.nodeName", json, b""),
            400,
        ),
        (
            call(
                "PATCH",
                "/api/v1/namespaces/ns/pods/p",
                "application/json-patch+json",
                b"{}",
            ),
            400,
        ),
        (
            call(
                "PATCH",
                "/api/v1/namespaces/ns/pods/p",
                "application/json-patch+json",
                b"[{\"op\":\"nope\",\"path\":\"/a\"}]",
            ),
            400,
        ),
        (
            call("PATCH", "/api/v1/namespaces/ns/pods/p", "text/plain", b"{}"),
            415,
        ),
        (
            call(
                "PUT",
                "/api/v1/namespaces/ns/pods/p",
                json,
                b"{\"metadata\":{\"name\":\"other\"}}",
            ),
            400,
        ),
        (
            call(
                "POST",
                "/api/v1/namespaces/ns/pods/p/binding",
                json,
                b"{\"metadata\":{\"name\":\"p\"}}",
            ),
            422,
        ),
        (call("GET", "/api/v1/nodes/n/pods", json, b""), 404),
        (call("GET", "/api/v1/namespaces/ns/nodes", json, b""), 404),
        (call("GET", "/apis/unknown.io/v1/things", json, b""), 404),
        (call("GET", "/healthz", json, b""), 404),
        (call("DELETE", "/api/v1/namespaces/ns/pods", json, b""), 405),
    ];
    for (req, code) in cases {
        let what = format!("{} {}", req.method(), req.uri());
        match client.request::<Value>(req).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, code, "{what}: {s:?}"),
            other => panic!("{what}: expected {code}, got {other:?}"),
        }
    }
    // Nothing changed.
    assert_eq!(fake.list(Kind::Pod).len(), 1);
}

/// Graceful deletion (opt-in, module docs of the fake): a bound pod DELETEd with a grace
/// period gets `deletionTimestamp` (MODIFIED, still matching the assigned-pod selector), is
/// refused a binding, and goes with DELETED at the final delete; an unbound pod goes at once.
#[tokio::test]
async fn graceful_pod_deletion_marks_first_and_deletes_at_the_end() {
    let fake = FakeApiServer::new();
    let client = fake.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
    fake.create(Kind::Pod, pod("ns", "bound", Some("n1"), "Running"))
        .unwrap();
    fake.create(Kind::Pod, pod("ns", "pending", None, "Pending"))
        .unwrap();
    let rv = fake.current_rv().to_string();
    let wp = WatchParams::default().fields("spec.nodeName!=,status.phase!=Succeeded");
    let mut raw = Api::<Pod>::all(client)
        .watch(&wp, &rv)
        .await
        .unwrap()
        .boxed();

    let dp = DeleteParams {
        grace_period_seconds: Some(30),
        ..DeleteParams::default()
    };
    pods.delete("bound", &dp).await.unwrap();
    match next(&mut raw).await.unwrap() {
        WatchEvent::Modified(p) => {
            assert!(p.metadata.deletion_timestamp.is_some(), "{p:?}");
            assert_eq!(p.metadata.deletion_grace_period_seconds, Some(30));
        }
        other => panic!("{other:?}"),
    }
    assert!(fake.get(Kind::Pod, "ns", "bound").is_some(), "still there");
    // A second graceful delete changes nothing; the final one removes it.
    pods.delete("bound", &dp).await.unwrap();
    fake.finish_deletion("ns", "bound").unwrap();
    assert_eq!(watch_label(&next(&mut raw).await), "DELETED(bound)");
    assert!(fake.get(Kind::Pod, "ns", "bound").is_none());
    // Unbound: immediate, as on a real server.
    pods.delete("pending", &dp).await.unwrap();
    assert!(fake.get(Kind::Pod, "ns", "pending").is_none());
    // The helper, and the binding refusal for a terminating pod.
    fake.create(Kind::Pod, pod("ns", "late", None, "Pending"))
        .unwrap();
    fake.bind_pod("ns", "late", "n1").unwrap();
    fake.delete_graceful("ns", "late", 5).unwrap();
    assert!(!fake.get(Kind::Pod, "ns", "late").unwrap()["metadata"]["deletionTimestamp"].is_null());
}

/// Per-verb write faults: refused writes change nothing; "applied then lost" writes change the
/// object while the client sees an error (status, cut connection, or a hang); `Pass` lets a
/// write through so a later fault hits the n-th one; hits are counted by class.
#[tokio::test]
async fn write_faults_refuse_or_apply_and_lose_the_answer() {
    use crate::support::{WriteFault, WriteOp};
    let fake = FakeApiServer::new();
    let pods: Api<Pod> = Api::namespaced(fake.client(), "ns");
    fake.create(Kind::Pod, pod("ns", "p", None, "Pending"))
        .unwrap();
    let annotate = |v: &str| Patch::Merge(json!({"metadata": {"annotations": {"k": v}}}));
    let ann = |fake: &FakeApiServer| {
        fake.get(Kind::Pod, "ns", "p").unwrap()["metadata"]["annotations"]["k"].clone()
    };

    fake.push_write_fault(WriteOp::PodPatch, WriteFault::Pass);
    fake.push_write_fault(WriteOp::PodPatch, WriteFault::Refuse(409));
    fake.push_write_fault(WriteOp::PodPatch, WriteFault::AppliedThenStatus(500));
    fake.push_write_fault(WriteOp::PodPatch, WriteFault::AppliedThenDrop);
    let pp = PatchParams::default();
    pods.patch("p", &pp, &annotate("a")).await.unwrap();
    assert_eq!(ann(&fake), "a");
    let e = pods.patch("p", &pp, &annotate("b")).await.unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 409), "{e}");
    assert_eq!(ann(&fake), "a", "a refused write changes nothing");
    let e = pods.patch("p", &pp, &annotate("c")).await.unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 500), "{e}");
    assert_eq!(ann(&fake), "c", "applied although the client saw 500");
    let e = pods.patch("p", &pp, &annotate("d")).await.unwrap_err();
    assert!(
        !matches!(e, kube::Error::Api(_)),
        "a cut connection, not a status: {e}"
    );
    assert_eq!(ann(&fake), "d", "applied although the answer was cut");
    assert_eq!(fake.pending_write_faults(), 0);

    // Binding: applied, answer held, then 504.
    fake.push_write_fault(
        WriteOp::PodBinding,
        WriteFault::AppliedThenHang(Duration::from_millis(300)),
    );
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"},
                         "target": {"kind": "Node", "name": "n1"}});
    let e = pods
        .create_subresource::<_, Value>("binding", "p", &PostParams::default(), &binding)
        .await
        .unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 504), "{e}");
    assert_eq!(
        fake.get(Kind::Pod, "ns", "p").unwrap()["spec"]["nodeName"],
        "n1"
    );
    assert_eq!(fake.hanging_answers(), 0);
    let hits = fake.write_fault_hits();
    for class in [
        "PodPatch/pass",
        "PodPatch/refuse_409",
        "PodPatch/applied_then_500",
        "PodPatch/applied_then_drop",
        "PodBinding/applied_then_hang",
    ] {
        assert_eq!(hits.get(class), Some(&1), "{class}: {hits:?}");
    }
}
