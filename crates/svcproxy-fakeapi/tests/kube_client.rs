//! The fake API server against the real kube-rs client and kube-runtime watchers.
//!
//! Most tests run on a current-thread runtime on purpose: the server's handle calls
//! (`apply`, `drop_watches`, `compact`, ...) are synchronous, so a sequence of them
//! happens atomically with respect to the client, which only runs while the test
//! awaits. That makes "while the watch is disconnected" deterministic.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PartialObjectMeta};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config, ResourceExt};
use serde_json::{json, Value};
use svcproxy_fakeapi::FakeApiServer;

const STEP: Duration = Duration::from_secs(5);

async fn client(server: &FakeApiServer) -> Client {
    let kc = Kubeconfig::from_yaml(&server.kubeconfig_yaml()).unwrap();
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

fn service(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "ports": [{"port": 80, "protocol": "TCP"}]}
    })
}

fn node(name: &str, zone: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
        "spec": {"podCIDRs": ["10.244.1.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.1"}]}
    })
}

fn names<K: ResourceExt>(objs: &[K]) -> Vec<String> {
    objs.iter().map(|o| o.name_any()).collect()
}

/// A compact description of a watcher event, for assertions.
fn describe<K: ResourceExt>(ev: &watcher::Result<Event<K>>) -> String {
    match ev {
        Ok(Event::Init) => "Init".into(),
        Ok(Event::InitApply(o)) => format!("InitApply {}", o.name_any()),
        Ok(Event::InitDone) => "InitDone".into(),
        Ok(Event::Apply(o)) => format!("Apply {}", o.name_any()),
        Ok(Event::Delete(o)) => format!("Delete {}", o.name_any()),
        Err(watcher::Error::WatchError(s)) => format!("Err {} {}", s.code, s.reason),
        Err(e) => format!("Err {e}"),
    }
}

type Events<K> = Pin<Box<dyn Stream<Item = watcher::Result<Event<K>>> + Send>>;

/// The next `n` events that are not transport errors (those are listed apart).
async fn next_events<K: ResourceExt>(
    s: &mut Events<K>,
    n: usize,
    errors: &mut Vec<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < n {
        let ev = tokio::time::timeout(STEP, s.next())
            .await
            .unwrap_or_else(|_| panic!("no event within {STEP:?}; got {out:?}, errors {errors:?}"))
            .expect("the watcher stream ended");
        match &ev {
            Err(watcher::Error::WatchFailed(_) | watcher::Error::WatchStartFailed(_)) => {
                errors.push(describe(&ev))
            }
            _ => out.push(describe(&ev)),
        }
    }
    out
}

/// Polls the watcher until it has opened its watch (and asserts it is idle).
async fn settle<K: ResourceExt>(s: &mut Events<K>, server: &FakeApiServer, open: usize) {
    let deadline = tokio::time::Instant::now() + STEP;
    while server.open_watches() < open {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch never opened"
        );
        if let Ok(ev) = tokio::time::timeout(Duration::from_millis(20), s.next()).await {
            panic!(
                "unexpected event {}",
                describe(&ev.expect("the stream ended"))
            );
        }
    }
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn paginated_lists_are_consistent_snapshots() {
    let server = FakeApiServer::start().await.unwrap();
    for n in ["a", "b", "c", "d", "e"] {
        server.apply(service(n, json!({"v": "1"})));
    }
    let api: Api<Service> = Api::all(client(&server).await);
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(&first.items), ["a", "b"]);
    let rv = first.metadata.resource_version.clone().unwrap();
    assert_eq!(rv, "5");
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    // Changes between pages are not seen by the continued list.
    server.apply(service("c", json!({"v": "2"})));
    server.delete("Service", Some("default"), "d");
    server.apply(service("bb", json!({})));
    let token = first.metadata.continue_.clone().unwrap();
    let second = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&second.items), ["c", "d"]);
    assert_eq!(second.items[0].labels()["v"], "1", "c as of the first page");
    assert_eq!(second.metadata.resource_version.as_deref(), Some("5"));
    let third = api
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(second.metadata.continue_.as_ref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(names(&third.items), ["e"]);
    assert!(third.metadata.continue_.is_none());
    // A fresh list sees the present.
    let now = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&now.items), ["a", "b", "bb", "c", "e"]);
    assert_eq!(now.metadata.resource_version.as_deref(), Some("8"));

    // After a compaction the token is too old: 410 Expired.
    server.compact();
    let err = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        e => panic!("unexpected {e:?}"),
    }
    let reqs = server.requests();
    assert!(reqs
        .iter()
        .any(|r| r.query.contains("continue=") && r.status == 200));
    assert!(reqs
        .iter()
        .any(|r| r.query.contains("continue=") && r.status == 410));
}

#[tokio::test]
async fn label_and_field_selectors_filter_lists() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(service("web", json!({"app": "web", "tier": "front"})));
    server.apply(service("api", json!({"app": "api", "tier": "back"})));
    server.apply(service("db", json!({"app": "db", "legacy": "yes"})));
    let mut other = service("web", json!({"app": "web"}));
    other["metadata"]["namespace"] = json!("other");
    server.apply(other);
    let api: Api<Service> = Api::all(client(&server).await);
    let list = |labels: &'static str, fields: &'static str| {
        let api = api.clone();
        async move {
            let lp = ListParams::default().labels(labels).fields(fields);
            let l = api.list(&lp).await.unwrap();
            l.items
                .iter()
                .map(|s| format!("{}/{}", s.namespace().unwrap(), s.name_any()))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(list("app=web", "").await, ["default/web", "other/web"]);
    assert_eq!(list("app==web,tier", "").await, ["default/web"]);
    assert_eq!(
        list("tier in (front, back)", "").await,
        ["default/api", "default/web"]
    );
    assert_eq!(
        list("tier notin (front)", "").await,
        ["default/api", "default/db", "other/web"]
    );
    assert_eq!(
        list("!legacy,app!=api", "").await,
        ["default/web", "other/web"]
    );
    assert_eq!(list("", "metadata.namespace=other").await, ["other/web"]);
    assert_eq!(
        list("app=web", "metadata.namespace!=other").await,
        ["default/web"]
    );
    assert_eq!(list("", "metadata.name==db").await, ["default/db"]);
    // Namespaced paths.
    let ns: Api<Service> = Api::namespaced(client(&server).await, "other");
    assert_eq!(
        names(&ns.list(&ListParams::default()).await.unwrap().items),
        ["web"]
    );
    assert_eq!(ns.get("web").await.unwrap().labels()["app"], "web");
    assert!(ns.get_opt("nope").await.unwrap().is_none());
    // Malformed selectors: 400 Status.
    for (labels, fields) in [("app in (web", ""), ("", "spec.type=ClusterIP")] {
        match api
            .list(&ListParams::default().labels(labels).fields(fields))
            .await
        {
            Err(kube::Error::Api(s)) => {
                assert_eq!((s.code, s.reason.as_str()), (400, "BadRequest"))
            }
            other => panic!("{labels:?} {fields:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_watcher_sees_changes_and_selector_transitions() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(service("a", json!({"app": "x"})));
    server.apply(service("b", json!({"app": "y"})));
    let api: Api<Service> = Api::all(client(&server).await);
    let mut all: Events<Service> =
        watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    let mut xs: Events<Service> =
        watcher::watcher(api, watcher::Config::default().labels("app=x").page_size(1)).boxed();
    let mut errors = Vec::new();
    assert_eq!(
        next_events(&mut all, 4, &mut errors).await,
        strs(&["Init", "InitApply a", "InitApply b", "InitDone"])
    );
    assert_eq!(
        next_events(&mut xs, 3, &mut errors).await,
        strs(&["Init", "InitApply a", "InitDone"])
    );
    server.apply(service("c", json!({"app": "x"}))); // ADDED
    server.apply(service("a", json!({"app": "x", "more": "1"}))); // MODIFIED
    server.apply(service("b", json!({"app": "x"}))); // starts matching app=x
    server.apply(service("a", json!({"app": "z"}))); // stops matching app=x
    server.delete("Service", Some("default"), "c"); // DELETED
    assert_eq!(
        next_events(&mut all, 5, &mut errors).await,
        strs(&["Apply c", "Apply a", "Apply b", "Apply a", "Delete c"])
    );
    assert_eq!(
        next_events(&mut xs, 5, &mut errors).await,
        strs(&["Apply c", "Apply a", "Apply b", "Delete a", "Delete c"])
    );
    assert!(errors.is_empty(), "{errors:?}");
    // kube-rs' defaults: a paginated, most recent list (no resourceVersion), then
    // a watch with bookmarks from the list's resourceVersion.
    let reqs = server.requests();
    let list = reqs.iter().find(|r| !r.is_watch()).unwrap();
    assert_eq!(list.param("resourceVersion"), None);
    assert_eq!(list.param("limit").as_deref(), Some("500"));
    let watch = reqs.iter().find(|r| r.is_watch()).unwrap();
    assert_eq!(watch.param("allowWatchBookmarks").as_deref(), Some("true"));
    assert_eq!(watch.param("resourceVersion").as_deref(), Some("2"));
    assert_eq!(server.open_watches(), 2);
}

#[tokio::test]
async fn the_metadata_watcher_gets_partial_object_metadata() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(node("node-1", "zone-a"));
    server.apply(node("node-2", "zone-b"));
    let client = client(&server).await;
    let api: Api<Node> = Api::all(client.clone());
    // What kube-rs 5 recommends over the deprecated `metadata_watcher` (and what
    // svcproxy uses): an `Api<PartialObjectMeta<K>>`.
    let meta_api: Api<PartialObjectMeta<Node>> = Api::all(client);
    let mut s = watcher::watcher(
        meta_api,
        watcher::Config::default().fields("metadata.name!=node-2"),
    )
    .boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match tokio::time::timeout(STEP, s.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Event::InitApply(m) => {
                assert_eq!(m.labels()["topology.kubernetes.io/zone"], "zone-a");
                let types = m.types.clone().expect("kind and apiVersion");
                assert_eq!(
                    (types.kind.as_str(), types.api_version.as_str()),
                    ("PartialObjectMetadata", "meta.k8s.io/v1")
                );
                seen.push(format!("InitApply {}", m.name_any()));
            }
            Event::Init => seen.push("Init".into()),
            Event::InitDone => seen.push("InitDone".into()),
            e => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(seen, strs(&["Init", "InitApply node-1", "InitDone"]));
    server.apply(node("node-1", "zone-c"));
    server.apply(node("node-2", "zone-c"));
    server.apply(node("node-3", "zone-a"));
    let mut got = Vec::new();
    while got.len() < 2 {
        match tokio::time::timeout(STEP, s.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Event::Apply(m) => {
                assert!(m.metadata.resource_version.is_some());
                got.push((
                    m.name_any(),
                    m.labels()["topology.kubernetes.io/zone"].clone(),
                ));
            }
            e => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(
        got,
        [
            ("node-1".to_string(), "zone-c".to_string()),
            ("node-3".into(), "zone-a".into())
        ]
    );
    // Single metadata GET (what svcproxy does for its node's UID).
    let meta = api.get_metadata("node-1").await.unwrap();
    assert!(meta.metadata.uid.is_some());
    assert!(api.get_metadata_opt("node-9").await.unwrap().is_none());
    let accepts: Vec<String> = server
        .requests()
        .into_iter()
        .filter_map(|r| r.accept)
        .collect();
    assert!(accepts
        .iter()
        .any(|a| a.contains("as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")));
    assert!(accepts
        .iter()
        .any(|a| a.contains("as=PartialObjectMetadata;g=meta.k8s.io;v=v1")));
}

#[tokio::test]
async fn a_compacted_resource_version_makes_the_watcher_relist() {
    let server = FakeApiServer::start().await.unwrap();
    for n in ["a", "b", "c"] {
        server.apply(service(n, json!({})));
    }
    let api: Api<Service> = Api::all(client(&server).await);
    let mut s: Events<Service> = watcher::watcher(api, watcher::Config::default()).boxed();
    let mut errors = Vec::new();
    assert_eq!(next_events(&mut s, 5, &mut errors).await.len(), 5);
    server.apply(service("d", json!({})));
    assert_eq!(
        next_events(&mut s, 1, &mut errors).await,
        strs(&["Apply d"])
    );
    settle(&mut s, &server, 1).await;
    // While the watch is down (nothing runs the client until we await): b goes
    // away and the history is compacted.
    server.drop_watches();
    server.delete("Service", Some("default"), "b");
    server.compact();
    let evs = next_events(&mut s, 6, &mut errors).await;
    assert_eq!(
        evs,
        strs(&[
            "Err 410 Expired",
            "Init",
            "InitApply a",
            "InitApply c",
            "InitApply d",
            "InitDone"
        ]),
        "transport errors meanwhile: {errors:?}"
    );
    let reqs = server.requests();
    let watches: Vec<(Option<String>, u16)> = reqs
        .iter()
        .filter(|r| r.is_watch())
        .map(|r| (r.param("resourceVersion"), r.status))
        .collect();
    // The first watch, then its resumption from rv 4 (410 comes as an ERROR event
    // in a 200), then the watch after the re-list.
    assert_eq!(
        watches,
        [(Some("3".to_string()), 200), (Some("4".into()), 200)],
        "{reqs:#?}"
    );
    // And then it keeps watching from the new list.
    server.apply(service("e", json!({})));
    assert_eq!(
        next_events(&mut s, 1, &mut errors).await,
        strs(&["Apply e"])
    );
}

#[tokio::test]
async fn dropped_watches_resume_without_missing_changes() {
    let server = FakeApiServer::start().await.unwrap();
    for n in ["a", "b", "c"] {
        server.apply(service(n, json!({})));
    }
    let api: Api<Service> = Api::all(client(&server).await);
    let mut s: Events<Service> = watcher::watcher(api, watcher::Config::default()).boxed();
    let mut errors = Vec::new();
    assert_eq!(next_events(&mut s, 5, &mut errors).await.len(), 5);
    for round in 0..3 {
        settle(&mut s, &server, 1).await;
        server.drop_watches();
        server.apply(service("a", json!({"round": round.to_string()})));
        server.apply(service(&format!("new-{round}"), json!({})));
        server.delete(
            "Service",
            Some("default"),
            if round == 0 { "b" } else { "c" },
        );
        if round == 2 {
            // c was deleted in round 1: nothing to delete.
            assert_eq!(
                next_events(&mut s, 2, &mut errors).await,
                strs(&["Apply a", "Apply new-2"])
            );
        } else {
            let gone = if round == 0 { "b" } else { "c" };
            assert_eq!(
                next_events(&mut s, 3, &mut errors).await,
                vec![
                    "Apply a".to_string(),
                    format!("Apply new-{round}"),
                    format!("Delete {gone}")
                ]
            );
        }
    }
    let lists = server.requests().iter().filter(|r| !r.is_watch()).count();
    assert_eq!(lists, 1, "the watcher resumed without re-listing");
    let resumed: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.is_watch())
        .filter_map(|r| r.param("resourceVersion"))
        .collect();
    assert_eq!(resumed, ["3", "3", "6", "9"]);
    eprintln!("transport errors seen by the watcher: {errors:?}");
}

#[tokio::test]
async fn streaming_lists_work_too() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(service("a", json!({})));
    server.apply(service("b", json!({})));
    let api: Api<Service> = Api::all(client(&server).await);
    let mut s: Events<Service> =
        watcher::watcher(api, watcher::Config::default().streaming_lists()).boxed();
    let mut errors = Vec::new();
    assert_eq!(
        next_events(&mut s, 4, &mut errors).await,
        strs(&["Init", "InitApply a", "InitApply b", "InitDone"])
    );
    server.apply(service("c", json!({})));
    assert_eq!(
        next_events(&mut s, 1, &mut errors).await,
        strs(&["Apply c"])
    );
    assert!(server.requests().iter().all(|r| r.is_watch()));
}

#[tokio::test]
async fn the_event_recorder_creates_then_patches_a_series() {
    let server = FakeApiServer::start().await.unwrap();
    let client = client(&server).await;
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "svcproxy".into(),
            instance: Some("svcproxy-node-1".into()),
        },
    );
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some("node-1".into()),
        ..ObjectReference::default()
    };
    let ev = KubeEvent {
        type_: EventType::Normal,
        reason: "Starting".into(),
        note: Some("Starting svcproxy.".into()),
        action: "StartSvcproxy".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.unwrap();
    recorder.publish(&ev, &reference).await.unwrap();
    let events = server.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    assert_eq!(e["apiVersion"], "events.k8s.io/v1");
    assert_eq!(e["kind"], "Event");
    assert_eq!(e["metadata"]["namespace"], "default");
    assert_eq!(e["reason"], "Starting");
    assert_eq!(e["regarding"]["name"], "node-1");
    assert_eq!(e["series"]["count"], 2);
    let methods: Vec<(String, u16)> = server
        .requests()
        .into_iter()
        .map(|r| (r.method, r.status))
        .collect();
    assert_eq!(
        methods,
        [("POST".to_string(), 201), ("PATCH".to_string(), 200)]
    );
}

#[tokio::test]
async fn unserved_kinds_are_404_until_served() {
    let server = FakeApiServer::start().await.unwrap();
    server.set_served("EndpointSlice", false);
    let api: Api<EndpointSlice> = Api::all(client(&server).await);
    match api.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (404, "NotFound")),
        other => panic!("{other:?}"),
    }
    server.set_served("EndpointSlice", true);
    assert!(api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_goes_away_and_comes_back_on_the_same_address() {
    let server = FakeApiServer::start().await.unwrap();
    let addr = server.addr();
    server.apply(service("a", json!({})));
    let client = client(&server).await;
    let api: Api<Service> = Api::all(client.clone());
    let mut s: Events<Service> = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    let mut errors = Vec::new();
    assert_eq!(next_events(&mut s, 3, &mut errors).await.len(), 3);
    settle(&mut s, &server, 1).await;
    let handle = server.clone();
    server.shutdown().await;
    let deadline = tokio::time::Instant::now() + STEP;
    while handle.open_watches() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch survived the shutdown"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(handle);
    assert!(
        api.list(&ListParams::default()).await.is_err(),
        "still answering after shutdown"
    );
    // The open watch was cut: the watcher's reconnection fails.
    let ev = tokio::time::timeout(STEP, s.next()).await.unwrap().unwrap();
    assert!(
        matches!(ev, Err(watcher::Error::WatchStartFailed(_))),
        "{}",
        describe(&ev)
    );
    let server = FakeApiServer::start_on(addr).await.unwrap();
    server.apply(service("b", json!({})));
    let l = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&l.items), ["b"]);
    server.shutdown().await;
}
