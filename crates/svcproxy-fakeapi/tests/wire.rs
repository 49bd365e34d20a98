//! The wire format, over raw HTTP: Status bodies, list envelopes, NDJSON watch
//! streams in chunked responses, bookmarks, timeouts, ERROR events, Events.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use svcproxy_fakeapi::{scale, FakeApiServer};

fn service(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "ports": [{"port": 80, "protocol": "TCP"}]}
    })
}

async fn get(server: &FakeApiServer, path_and_query: &str) -> (u16, Value) {
    let r = reqwest::get(format!("{}{path_and_query}", server.url()))
        .await
        .unwrap();
    let code = r.status().as_u16();
    assert_eq!(
        r.headers()["content-type"],
        "application/json",
        "{path_and_query}"
    );
    (code, r.json().await.unwrap())
}

/// Reads a watch response until it ends (or `max` elapses): its lines, and whether
/// it ended cleanly.
async fn watch_lines(resp: reqwest::Response, max: Duration) -> (Vec<Value>, Result<(), String>) {
    let mut resp = resp;
    let mut buf = Vec::new();
    let deadline = Instant::now() + max;
    let end = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, resp.chunk()).await {
            Err(_) => break Err("still streaming".to_string()),
            Ok(Ok(Some(chunk))) => buf.extend_from_slice(&chunk),
            Ok(Ok(None)) => break Ok(()),
            Ok(Err(e)) => break Err(format!("{e}")),
        }
    };
    let lines = buf
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("each line is one JSON document"))
        .collect();
    (lines, end)
}

fn summary(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            let name = l["object"]["metadata"]["name"].as_str().unwrap_or("");
            let rv = l["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("");
            format!("{} {name} {rv}", l["type"].as_str().unwrap())
        })
        .collect()
}

#[tokio::test]
async fn errors_are_status_objects() {
    let server = FakeApiServer::start().await.unwrap();
    let (code, body) = get(&server, "/api/v1/configmaps").await;
    assert_eq!(code, 404);
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "the server could not find the requested resource",
               "reason": "NotFound", "details": {}, "code": 404})
    );
    let (code, body) = get(&server, "/nope").await;
    assert_eq!((code, body["reason"].as_str()), (404, Some("NotFound")));
    let (code, body) = get(&server, "/api/v1/namespaces/default/services/missing").await;
    assert_eq!(code, 404);
    assert_eq!(body["message"], "services \"missing\" not found");
    assert_eq!(
        body["details"],
        json!({"name": "missing", "kind": "services"})
    );
    server.set_served("ServiceCIDR", false);
    let (code, body) = get(&server, "/apis/networking.k8s.io/v1/servicecidrs").await;
    assert_eq!((code, body["kind"].as_str()), (404, Some("Status")));
    server.set_served("ServiceCIDR", true);
    let (code, body) = get(&server, "/apis/networking.k8s.io/v1/servicecidrs").await;
    assert_eq!(
        (code, body["kind"].as_str()),
        (200, Some("ServiceCIDRList"))
    );
    for q in [
        "labelSelector=a%20in%20(b",
        "labelSelector=a%3D%3D%3Db",
        "fieldSelector=spec.clusterIP%3D1.2.3.4",
        "limit=x",
        "watch=maybe",
    ] {
        let (code, body) = get(&server, &format!("/api/v1/services?{q}")).await;
        assert_eq!(
            (code, body["reason"].as_str()),
            (400, Some("BadRequest")),
            "{q}: {body}"
        );
        assert_eq!(body["kind"], "Status");
    }
    // Validation like the API server's.
    let (code, body) = get(&server, "/api/v1/services?resourceVersionMatch=Exact").await;
    assert_eq!((code, body["reason"].as_str()), (422, Some("Invalid")));
    let (code, body) = get(&server, "/api/v1/services?resourceVersion=99").await;
    assert_eq!((code, body["reason"].as_str()), (504, Some("Timeout")));
    let r = reqwest::Client::new()
        .delete(format!("{}/api/v1/services", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
}

#[tokio::test]
async fn lists_carry_kind_resource_version_and_typed_items() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(service("a", json!({})));
    for o in scale::cluster(0, 0, 2) {
        server.apply(o);
    }
    let (code, body) = get(&server, "/api/v1/services").await;
    assert_eq!(code, 200);
    assert_eq!(body["kind"], "ServiceList");
    assert_eq!(body["apiVersion"], "v1");
    assert_eq!(body["metadata"], json!({"resourceVersion": "4"}));
    let item = &body["items"][0];
    assert_eq!(
        (item["kind"].as_str(), item["apiVersion"].as_str()),
        (Some("Service"), Some("v1"))
    );
    let meta = &item["metadata"];
    assert_eq!(meta["resourceVersion"], "1");
    assert_eq!(meta["namespace"], "default");
    assert!(meta["uid"].as_str().unwrap().len() == 36);
    assert!(meta["creationTimestamp"].as_str().unwrap().ends_with('Z'));

    // Metadata-only: PartialObjectMetadataList of PartialObjectMetadata.
    let r = reqwest::Client::new()
        .get(format!("{}/api/v1/nodes?limit=1", server.url()))
        .header(
            "Accept",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["kind"], "PartialObjectMetadataList");
    assert_eq!(body["apiVersion"], "meta.k8s.io/v1");
    assert!(body["metadata"]["continue"].is_string());
    assert_eq!(body["metadata"]["remainingItemCount"], 1);
    let item = body["items"][0].as_object().unwrap();
    let mut keys: Vec<&str> = item.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["apiVersion", "kind", "metadata"]);
    assert_eq!(item["kind"], "PartialObjectMetadata");
    assert_eq!(item["metadata"]["name"], "node-1");
    assert!(item["metadata"]["labels"]["topology.kubernetes.io/zone"].is_string());
    // A single-object Accept on a list is not acceptable.
    let r = reqwest::Client::new()
        .get(format!("{}/api/v1/nodes", server.url()))
        .header(
            "Accept",
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 406);
    // Exact reads of the past.
    server.apply(service("a", json!({"x": "y"})));
    let (_, old) = get(
        &server,
        "/api/v1/services?resourceVersion=1&resourceVersionMatch=Exact",
    )
    .await;
    assert_eq!(old["metadata"]["resourceVersion"], "1");
    assert!(old["items"][0]["metadata"]
        .get("labels")
        .unwrap()
        .as_object()
        .unwrap()
        .is_empty());
    server.compact();
    let (code, body) = get(
        &server,
        "/api/v1/services?resourceVersion=1&resourceVersionMatch=Exact",
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (410, Some("Expired")));
}

#[tokio::test]
async fn watches_are_chunked_ndjson_with_selector_transitions() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(service("a", json!({"app": "x"}))); // 1
    server.apply(service("b", json!({"app": "y"}))); // 2
    server.apply(service("b", json!({"app": "x"}))); // 3: b starts matching
    server.apply(service("a", json!({"app": "y"}))); // 4: a stops matching
    server.delete("Service", Some("default"), "b"); // 5
    server.apply(service("c", json!({"app": "x"}))); // 6
    let url = format!(
        "{}/api/v1/services?watch=1&resourceVersion=1&labelSelector=app%3Dx&timeoutSeconds=1",
        server.url()
    );
    let start = Instant::now();
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.headers()["transfer-encoding"], "chunked");
    assert!(r.headers().get("content-length").is_none());
    // A live change too.
    server.apply(service("c", json!({"app": "x", "v": "2"}))); // 7
    let (lines, end) = watch_lines(r, Duration::from_secs(5)).await;
    assert_eq!(end, Ok(()), "timeoutSeconds ends the stream cleanly");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(
        summary(&lines),
        [
            "ADDED b 3",
            "DELETED a 4",
            "DELETED b 5",
            "ADDED c 6",
            "MODIFIED c 7"
        ]
    );
    // A DELETED object for a selector transition is the previous state at the new
    // resourceVersion (as the API server's watch cache sends it).
    assert_eq!(lines[1]["object"]["metadata"]["labels"]["app"], "x");
    assert_eq!(lines[0]["object"]["kind"], "Service");
    // resourceVersion 0: the current state as ADDED events first.
    let r = reqwest::get(format!(
        "{}/api/v1/services?watch=true&resourceVersion=0&timeoutSeconds=1",
        server.url()
    ))
    .await
    .unwrap();
    let (lines, _) = watch_lines(r, Duration::from_secs(5)).await;
    assert_eq!(summary(&lines), ["ADDED a 4", "ADDED c 7"]);
}

#[tokio::test]
async fn bookmarks_and_streaming_lists() {
    let server = FakeApiServer::start().await.unwrap();
    server.set_bookmark_interval(Duration::from_millis(100));
    server.apply(service("a", json!({})));
    let r = reqwest::get(format!(
        "{}/api/v1/services?watch=true&resourceVersion=1&allowWatchBookmarks=true&timeoutSeconds=1",
        server.url()
    ))
    .await
    .unwrap();
    server.apply(service("b", json!({})));
    let (lines, end) = watch_lines(r, Duration::from_secs(5)).await;
    assert_eq!(end, Ok(()));
    assert_eq!(lines[0]["type"], "ADDED");
    let bookmarks: Vec<&Value> = lines.iter().filter(|l| l["type"] == "BOOKMARK").collect();
    assert!(bookmarks.len() >= 5, "{lines:?}");
    assert_eq!(
        *bookmarks[0],
        json!({"type": "BOOKMARK", "object": {"kind": "Service", "apiVersion": "v1",
                                              "metadata": {"resourceVersion": "2"}}})
    );
    // No bookmarks unless asked for.
    let r = reqwest::get(format!(
        "{}/api/v1/services?watch=true&resourceVersion=2&timeoutSeconds=1",
        server.url()
    ))
    .await
    .unwrap();
    let (lines, _) = watch_lines(r, Duration::from_secs(5)).await;
    assert!(lines.is_empty(), "{lines:?}");
    // sendInitialEvents: ADDED for the current state, then the initial-events-end
    // bookmark, then live events.
    server.set_bookmark_interval(Duration::from_secs(60));
    let r = reqwest::get(format!(
        "{}/api/v1/services?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion=&timeoutSeconds=1",
        server.url()
    ))
    .await
    .unwrap();
    server.delete("Service", Some("default"), "a");
    let (lines, _) = watch_lines(r, Duration::from_secs(5)).await;
    assert_eq!(
        summary(&lines),
        ["ADDED a 1", "ADDED b 2", "BOOKMARK  2", "DELETED a 3"]
    );
    assert_eq!(
        lines[2]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    // sendInitialEvents needs bookmarks and NotOlderThan (422 otherwise).
    let (code, body) = get(
        &server,
        "/api/v1/services?watch=true&sendInitialEvents=true",
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (422, Some("Invalid")));
}

#[tokio::test]
async fn a_watch_from_a_compacted_resource_version_gets_an_error_event() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(service("a", json!({})));
    server.apply(service("b", json!({})));
    server.compact();
    let r = reqwest::get(format!(
        "{}/api/v1/services?watch=true&resourceVersion=1",
        server.url()
    ))
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (lines, end) = watch_lines(r, Duration::from_secs(5)).await;
    assert_eq!(end, Ok(()), "the stream ends after the error");
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["type"], "ERROR");
    let status = &lines[0]["object"];
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["code"], 410);
    assert_eq!(status["reason"], "Expired");
    assert!(status["message"]
        .as_str()
        .unwrap()
        .starts_with("too old resource version: 1"));
    // From the compaction point on, watching works.
    let r = reqwest::get(format!(
        "{}/api/v1/services?watch=true&resourceVersion=2&timeoutSeconds=1",
        server.url()
    ))
    .await
    .unwrap();
    server.apply(service("c", json!({})));
    let (lines, _) = watch_lines(r, Duration::from_secs(5)).await;
    assert_eq!(summary(&lines), ["ADDED c 3"]);
    // Too new: 504.
    let (code, body) = get(&server, "/api/v1/services?watch=true&resourceVersion=10").await;
    assert_eq!((code, body["reason"].as_str()), (504, Some("Timeout")));
}

#[tokio::test]
async fn dropped_watches_are_cut_mid_stream_and_refused_watches_fail() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(service("a", json!({})));
    let mut r = reqwest::get(format!(
        "{}/api/v1/nodes?watch=true&resourceVersion=1",
        server.url()
    ))
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.open_watches() != 1 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.apply(json!({"kind": "Node", "metadata": {"name": "n1"}}));
    let first = tokio::time::timeout(Duration::from_secs(5), r.chunk())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let line: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(line["type"], "ADDED");
    assert_eq!(line["object"]["apiVersion"], "v1");
    server.drop_watches();
    let (lines, end) = watch_lines(r, Duration::from_secs(5)).await;
    assert!(lines.is_empty());
    assert!(
        end.is_err() && end != Err("still streaming".into()),
        "cut, not ended cleanly: {end:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.open_watches() != 0 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A client going away closes its watch on the server too.
    let r = reqwest::get(format!("{}/api/v1/nodes?watch=true", server.url()))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.open_watches() != 1 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(r);
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.open_watches() != 0 {
        assert!(Instant::now() < deadline, "the watch outlived its client");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.set_watches_refused(true);
    let (code, body) = get(&server, "/api/v1/nodes?watch=true&resourceVersion=1").await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (500, Some("InternalError"))
    );
    let (code, _) = get(&server, "/api/v1/nodes").await;
    assert_eq!(code, 200, "lists still work");
    server.set_watches_refused(false);
    // The request log.
    let reqs = server.requests();
    let w = &reqs[0];
    assert_eq!(
        (w.method.as_str(), w.path.as_str()),
        ("GET", "/api/v1/nodes")
    );
    assert_eq!(w.query, "watch=true&resourceVersion=1");
    assert!(w.is_watch());
    assert_eq!(reqs[2].status, 500);
}

#[tokio::test]
async fn events_are_created_patched_and_listed() {
    let server = FakeApiServer::start().await.unwrap();
    let c = reqwest::Client::new();
    let base = format!(
        "{}/apis/events.k8s.io/v1/namespaces/default/events",
        server.url()
    );
    let ev = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                    "metadata": {"name": "node-1.abc"}, "reason": "Starting", "note": "Starting svcproxy.",
                    "regarding": {"kind": "Node", "name": "node-1"}, "type": "Normal", "action": "StartSvcproxy"});
    let r = c.post(&base).json(&ev).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let created: Value = r.json().await.unwrap();
    assert_eq!(created["metadata"]["namespace"], "default");
    assert!(created["metadata"]["resourceVersion"].is_string());
    let r = c.post(&base).json(&ev).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 409);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["reason"], "AlreadyExists");
    let r = c
        .patch(format!("{base}/node-1.abc"))
        .header("Content-Type", "application/merge-patch+json")
        .body(json!({"series": {"count": 2, "lastObservedTime": "2025-01-01T00:00:00.000000Z"}, "note": null}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let patched: Value = r.json().await.unwrap();
    assert_eq!(patched["series"]["count"], 2);
    assert!(patched.get("note").is_none());
    assert_eq!(patched["metadata"]["uid"], created["metadata"]["uid"]);
    let r = c
        .patch(format!("{base}/missing"))
        .header("Content-Type", "application/merge-patch+json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let r = c
        .patch(format!("{base}/node-1.abc"))
        .header("Content-Type", "application/json-patch+json")
        .body("[]")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    // Core v1 events, generateName.
    let r = c
        .post(format!("{}/api/v1/namespaces/kube-system/events", server.url()))
        .json(&json!({"metadata": {"generateName": "x-"}, "reason": "R", "involvedObject": {"kind": "Node"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let events = server.events();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["series"]["count"], 2);
    assert_eq!(events[1]["apiVersion"], "v1");
    assert!(events[1]["metadata"]["name"]
        .as_str()
        .unwrap()
        .starts_with("x-"));
    let (code, list) = get(&server, "/apis/events.k8s.io/v1/namespaces/default/events").await;
    assert_eq!((code, list["items"].as_array().unwrap().len()), (200, 1));
}
