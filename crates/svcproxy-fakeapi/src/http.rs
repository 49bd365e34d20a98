//! The HTTP side: routing, lists, gets, watches, Events and `Status` errors, as the
//! Kubernetes API server answers them.

// Helpers return the error response itself (`Result<_, Response>`): a cold path.
#![allow(clippy::result_large_err)]

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::Response;
use serde::Serialize;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::selector::{FieldSelector, Filter, LabelSelector};
use crate::store::{self, Change, KindInfo, Msg, RvError, Store, WatchStart, KINDS};
use crate::util;
use crate::RequestRecord;

/// The state shared by the handles and the server tasks.
pub(crate) struct Shared {
    pub(crate) store: Mutex<Store>,
    pub(crate) requests: Mutex<Vec<RequestRecord>>,
    pub(crate) bookmark_interval: Mutex<Duration>,
    pub(crate) interval_changed: Notify,
    pub(crate) open_watches: AtomicUsize,
    pub(crate) watches_refused: AtomicBool,
}

impl Shared {
    pub(crate) fn new() -> Shared {
        Shared {
            store: Mutex::new(Store::default()),
            requests: Mutex::new(Vec::new()),
            bookmark_interval: Mutex::new(Duration::from_secs(1)),
            interval_changed: Notify::new(),
            open_watches: AtomicUsize::new(0),
            watches_refused: AtomicBool::new(false),
        }
    }

    pub(crate) fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Sends a bookmark to every watch that asked for them, every interval.
pub(crate) async fn bookmark_ticker(shared: Arc<Shared>) {
    loop {
        let interval = *shared
            .bookmark_interval
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        tokio::select! {
            _ = tokio::time::sleep(interval) => shared.store().bookmark_all(),
            _ = shared.interval_changed.notified() => {}
        }
    }
}

const META_API_VERSION: &str = "meta.k8s.io/v1";
const MAX_BODY: usize = 16 << 20;

pub(crate) async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let (accept, content_type) = {
        let header_str = |name: header::HeaderName| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        };
        (header_str(header::ACCEPT), header_str(header::CONTENT_TYPE))
    };
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return status_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                &format!("reading the request body: {e}"),
                None,
            )
        }
    };
    let ctx = Ctx {
        shared: &shared,
        method: &method,
        path: &path,
        params: util::parse_query(&query),
        accept: accept.as_deref(),
        content_type: content_type.as_deref(),
        body: &body,
    };
    let resp = ctx.route();
    tracing::debug!(%method, %path, %query, status = resp.status().as_u16(), "fake API request");
    shared
        .requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(RequestRecord {
            method: method.to_string(),
            path,
            query,
            accept,
            status: resp.status().as_u16(),
        });
    resp
}

// ---------------------------------------------------------------------------
// Responses

fn json_bytes_response(code: StatusCode, body: Vec<u8>) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("a valid response")
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    json_bytes_response(code, serde_json::to_vec(v).expect("JSON"))
}

/// A `Status` object (as JSON value).
pub(crate) fn status_object(
    code: u16,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> Value {
    let mut s = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some(d) = details {
        s["details"] = d;
    }
    s
}

fn status_response(
    code: StatusCode,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> Response {
    // As the API server's responsewriters: a Status asking to be retried after some
    // seconds says so in a Retry-After header too, which clients act on.
    let retry_after = details
        .as_ref()
        .and_then(|d| d.get("retryAfterSeconds"))
        .and_then(Value::as_u64)
        .filter(|s| *s > 0);
    let mut resp = json_response(
        code,
        &status_object(code.as_u16(), reason, message, details),
    );
    if let Some(secs) = retry_after {
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(secs),
        );
    }
    resp
}

fn not_found_path() -> Response {
    status_response(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
        Some(json!({})),
    )
}

fn bad_request(message: &str) -> Response {
    status_response(StatusCode::BAD_REQUEST, "BadRequest", message, None)
}

fn invalid(kind: &str, message: &str) -> Response {
    status_response(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("{kind} is invalid: {message}"),
        Some(
            json!({"group": "meta.k8s.io", "kind": kind, "causes": [{"reason": "FieldValueInvalid", "message": message}]}),
        ),
    )
}

fn method_not_allowed() -> Response {
    status_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        Some(json!({})),
    )
}

fn object_not_found(group: &str, plural: &str, name: &str) -> Response {
    let qualified = if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    };
    let mut details = json!({"name": name, "kind": plural});
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    status_response(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{qualified} \"{name}\" not found"),
        Some(details),
    )
}

fn rv_error_response(e: RvError, what: &str, requested: u64) -> Response {
    match e {
        RvError::Expired { compacted } => status_response(
            StatusCode::GONE,
            "Expired",
            &format!("The resourceVersion for the provided {what} is too old ({requested} < {compacted})."),
            None,
        ),
        RvError::TooLarge { current } => too_large(requested, current),
    }
}

fn too_large(requested: u64, current: u64) -> Response {
    status_response(
        StatusCode::GATEWAY_TIMEOUT,
        "Timeout",
        &format!("Too large resource version: {requested}, current: {current}"),
        Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1
        })),
    )
}

// ---------------------------------------------------------------------------
// Encoding

/// What the client asked for in `Accept`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    Full,
    /// `as=PartialObjectMetadata;g=meta.k8s.io;v=v1`
    Meta,
    /// `as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`
    MetaList,
}

/// The first media range we can serve, ignoring q-values (None: nothing acceptable).
fn parse_accept(accept: Option<&str>) -> Option<Want> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Want::Full);
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let mime = parts.next().unwrap_or("").to_ascii_lowercase();
        if !matches!(mime.as_str(), "application/json" | "application/*" | "*/*") {
            continue;
        }
        let (mut as_, mut g, mut v) = ("", "", "");
        for p in parts {
            match p.split_once('=') {
                Some(("as", x)) => as_ = x,
                Some(("g", x)) => g = x,
                Some(("v", x)) => v = x,
                _ => {}
            }
        }
        let meta_group = g == "meta.k8s.io" && (v == "v1" || v == "v1beta1");
        match as_ {
            "" => return Some(Want::Full),
            "PartialObjectMetadata" if meta_group => return Some(Want::Meta),
            "PartialObjectMetadataList" if meta_group => return Some(Want::MetaList),
            _ => {}
        }
    }
    None
}

fn not_acceptable() -> Response {
    status_response(
        StatusCode::NOT_ACCEPTABLE,
        "NotAcceptable",
        "only the following media types are accepted: application/json, application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        None,
    )
}

#[derive(Serialize)]
struct Partial<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: &'a Value,
}

static EMPTY_META: Value = Value::Null;

fn write_object(out: &mut Vec<u8>, obj: &Value, meta: bool) {
    if meta {
        let m = obj.get("metadata").unwrap_or(&EMPTY_META);
        let empty = json!({});
        let partial = Partial {
            kind: "PartialObjectMetadata",
            api_version: META_API_VERSION,
            metadata: if m.is_null() { &empty } else { m },
        };
        serde_json::to_writer(&mut *out, &partial).expect("JSON");
    } else {
        serde_json::to_writer(&mut *out, obj).expect("JSON");
    }
}

fn event_line(ty: &str, obj: &Value, meta: bool) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(ty.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    write_object(&mut out, obj, meta);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn bookmark_line(info: &KindInfo, meta: bool, rv: u64, initial_end: bool) -> Bytes {
    let (kind, api_version) = if meta {
        ("PartialObjectMetadata", META_API_VERSION)
    } else {
        (info.kind, info.api_version)
    };
    let mut m = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        m["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": kind, "apiVersion": api_version, "metadata": m});
    let mut out = serde_json::to_vec(&json!({"type": "BOOKMARK", "object": obj})).expect("JSON");
    out.push(b'\n');
    Bytes::from(out)
}

fn error_line(status: &Value) -> Bytes {
    let mut out = serde_json::to_vec(&json!({"type": "ERROR", "object": status})).expect("JSON");
    out.push(b'\n');
    Bytes::from(out)
}

// ---------------------------------------------------------------------------
// Continue tokens: base64url of {"v":"meta.k8s.io/v1","rv":N,"start":"ns/name"}

fn encode_continue(rv: u64, key: &store::Key) -> String {
    let token = json!({"v": META_API_VERSION, "rv": rv, "start": format!("{}/{}", key.0, key.1)});
    util::base64url_encode(token.to_string().as_bytes())
}

fn decode_continue(token: &str) -> Option<(u64, store::Key)> {
    let raw = util::base64url_decode(token)?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    if v.get("v")?.as_str()? != META_API_VERSION {
        return None;
    }
    let rv = v.get("rv")?.as_u64().filter(|rv| *rv > 0)?;
    let (ns, name) = v.get("start")?.as_str()?.split_once('/')?;
    Some((rv, (ns.to_string(), name.to_string())))
}

// ---------------------------------------------------------------------------
// Routing

struct Ctx<'a> {
    shared: &'a Arc<Shared>,
    method: &'a Method,
    path: &'a str,
    params: Vec<(String, String)>,
    accept: Option<&'a str>,
    content_type: Option<&'a str>,
    body: &'a Bytes,
}

enum EventsApi {
    EventsV1,
    CoreV1,
}

impl Ctx<'_> {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn bool_param(&self, name: &str) -> Result<Option<bool>, Response> {
        match self.param(name) {
            None | Some("") => Ok(None),
            Some(v) => util::parse_bool(v)
                .map(Some)
                .ok_or_else(|| bad_request(&format!("invalid boolean for {name}: {v:?}"))),
        }
    }

    fn route(&self) -> Response {
        let segs: Vec<&str> = self
            .path
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let (group, version, rest) = match segs.as_slice() {
            ["version"] => {
                return json_response(
                    StatusCode::OK,
                    &json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-svcproxy-fakeapi",
                            "platform": "linux/amd64"}),
                )
            }
            ["healthz" | "livez" | "readyz"] => {
                return Response::builder()
                    .status(StatusCode::OK)
                    .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                    .body(Body::from("ok"))
                    .expect("a valid response")
            }
            ["api", "v1", rest @ ..] => ("", "v1", rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return not_found_path(),
        };
        let (ns, plural, name) = match rest {
            [plural] => (None, *plural, None),
            [plural, name] => (None, *plural, Some(*name)),
            ["namespaces", ns, plural] => (Some(*ns), *plural, None),
            ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
            _ => return not_found_path(),
        };
        if plural == "events" {
            match (group, version) {
                ("events.k8s.io", "v1") => return self.events(EventsApi::EventsV1, ns, name),
                ("", "v1") => return self.events(EventsApi::CoreV1, ns, name),
                _ => {}
            }
        }
        let Some(kind) = KINDS
            .iter()
            .position(|k| k.group == group && k.version == version && k.plural == plural)
        else {
            return not_found_path();
        };
        let info = &KINDS[kind];
        if self.shared.store().unserved[kind] {
            return not_found_path();
        }
        if ns.is_some() && !info.namespaced {
            return not_found_path();
        }
        match name {
            Some(name) => {
                if info.namespaced && ns.is_none() {
                    return not_found_path();
                }
                if self.method != Method::GET {
                    return method_not_allowed();
                }
                self.get(kind, ns.unwrap_or(""), name)
            }
            None => {
                if self.method != Method::GET {
                    return method_not_allowed();
                }
                match self.bool_param("watch") {
                    Err(r) => r,
                    Ok(Some(true)) => self.watch(kind, ns),
                    Ok(_) => self.list(kind, ns),
                }
            }
        }
    }

    fn filter(&self, ns: Option<&str>) -> Result<Filter, Response> {
        let labels = LabelSelector::parse(self.param("labelSelector").unwrap_or(""))
            .map_err(|e| bad_request(&e))?;
        let mut fields = FieldSelector::parse(self.param("fieldSelector").unwrap_or(""))
            .map_err(|e| bad_request(&e))?;
        if let Some(ns) = ns {
            fields = fields.with_namespace(ns);
        }
        Ok(Filter { labels, fields })
    }

    fn get(&self, kind: usize, ns: &str, name: &str) -> Response {
        let info = &KINDS[kind];
        let meta = match parse_accept(self.accept) {
            Some(Want::Full) => false,
            Some(Want::Meta) => true,
            Some(Want::MetaList) | None => return not_acceptable(),
        };
        let obj = self
            .shared
            .store()
            .get(kind, &(ns.to_string(), name.to_string()));
        match obj {
            None => object_not_found(info.group, info.plural, name),
            Some(obj) => {
                let mut out = Vec::new();
                write_object(&mut out, &obj, meta);
                json_bytes_response(StatusCode::OK, out)
            }
        }
    }

    fn list(&self, kind: usize, ns: Option<&str>) -> Response {
        let info = &KINDS[kind];
        let meta = match parse_accept(self.accept) {
            Some(Want::Full) => false,
            Some(Want::MetaList) => true,
            Some(Want::Meta) | None => return not_acceptable(),
        };
        let filter = match self.filter(ns) {
            Ok(f) => f,
            Err(r) => return r,
        };
        let limit = match self.param("limit").filter(|s| !s.is_empty()) {
            None => None,
            Some(l) => match l.parse::<i64>() {
                Ok(n) if n > 0 => Some(n as usize),
                Ok(_) => None,
                Err(_) => return bad_request(&format!("invalid limit {l:?}")),
            },
        };
        let rv_param = self.param("resourceVersion").unwrap_or("");
        let rv_match = self.param("resourceVersionMatch").unwrap_or("");
        let cont = self.param("continue").unwrap_or("");
        let store = self.shared.store();
        let (at_rv, after) = if !cont.is_empty() {
            if !rv_param.is_empty() && rv_param != "0" {
                return invalid("ListOptions", "resourceVersion: Forbidden: specifying resource version is not allowed when using continue");
            }
            if !rv_match.is_empty() {
                return invalid("ListOptions", "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided");
            }
            let Some((rv, key)) = decode_continue(cont) else {
                return bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)");
            };
            if rv < store.compacted {
                return status_response(
                    StatusCode::GONE,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    None,
                );
            }
            (rv, Some(key))
        } else if rv_param.is_empty() {
            if !rv_match.is_empty() {
                return invalid("ListOptions", "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided");
            }
            (store.rv, None)
        } else {
            let Ok(rv) = rv_param.parse::<u64>() else {
                return bad_request(&format!("invalid resource version: {rv_param:?}"));
            };
            match rv_match {
                "Exact" => {
                    if rv == 0 {
                        return invalid("ListOptions", "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"");
                    }
                    (rv, None)
                }
                "" | "NotOlderThan" => {
                    if rv > store.rv {
                        return too_large(rv, store.rv);
                    }
                    (store.rv, None)
                }
                other => {
                    return invalid(
                        "ListOptions",
                        &format!("resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""),
                    )
                }
            }
        };
        let page = match store.list(kind, at_rv, after.as_ref(), limit, &filter) {
            Ok(p) => p,
            Err(e) => return rv_error_response(e, "list", at_rv),
        };
        drop(store);
        let (list_kind, api_version) = if meta {
            ("PartialObjectMetadataList", META_API_VERSION)
        } else {
            (info.list_kind, info.api_version)
        };
        let mut list_meta = Map::new();
        list_meta.insert("resourceVersion".into(), json!(at_rv.to_string()));
        if let Some(next) = &page.next {
            list_meta.insert("continue".into(), json!(encode_continue(at_rv, next)));
            if let Some(n) = page.remaining {
                list_meta.insert("remainingItemCount".into(), json!(n));
            }
        }
        let mut out = Vec::with_capacity(1024 + page.items.len() * 512);
        out.extend_from_slice(
            format!(
                "{{\"kind\":\"{list_kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{},\"items\":[",
                Value::Object(list_meta)
            )
            .as_bytes(),
        );
        for (i, item) in page.items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_object(&mut out, item, meta);
        }
        out.extend_from_slice(b"]}");
        json_bytes_response(StatusCode::OK, out)
    }

    fn watch(&self, kind: usize, ns: Option<&str>) -> Response {
        let info = &KINDS[kind];
        let refused = || {
            status_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "Internal error occurred: watches are refused (svcproxy-fakeapi set_watches_refused)",
                None,
            )
        };
        if self.shared.watches_refused.load(Ordering::SeqCst) {
            return refused();
        }
        let meta = match parse_accept(self.accept) {
            Some(Want::Full) => false,
            Some(Want::Meta | Want::MetaList) => true,
            None => return not_acceptable(),
        };
        let filter = match self.filter(ns) {
            Ok(f) => f,
            Err(r) => return r,
        };
        let bookmarks = match self.bool_param("allowWatchBookmarks") {
            Ok(b) => b.unwrap_or(false),
            Err(r) => return r,
        };
        let send_initial = match self.bool_param("sendInitialEvents") {
            Ok(b) => b,
            Err(r) => return r,
        };
        let timeout = match self.param("timeoutSeconds").filter(|s| !s.is_empty()) {
            None => None,
            Some(t) => match t.parse::<u64>() {
                Ok(0) => None,
                Ok(n) => Some(Instant::now() + Duration::from_secs(n)),
                Err(_) => return bad_request(&format!("invalid timeoutSeconds {t:?}")),
            },
        };
        let rv_param = self.param("resourceVersion").unwrap_or("");
        let rv_match = self.param("resourceVersionMatch").unwrap_or("");
        let requested: Option<u64> = match rv_param {
            "" | "0" => None,
            s => match s.parse() {
                Ok(rv) => Some(rv),
                Err(_) => return bad_request(&format!("invalid resource version: {s:?}")),
            },
        };
        let mut store = self.shared.store();
        // Again under the store lock, which set_watches_refused also takes: a watch
        // checked just before refusal began cannot register after a drop_watches.
        if self.shared.watches_refused.load(Ordering::SeqCst) {
            return refused();
        }
        let (from, initial_end) = match send_initial {
            Some(true) => {
                if !bookmarks {
                    return invalid("ListOptions", "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks=true");
                }
                if rv_match != "NotOlderThan" {
                    return invalid("ListOptions", "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch=NotOlderThan");
                }
                if let Some(rv) = requested.filter(|rv| *rv > store.rv) {
                    return too_large(rv, store.rv);
                }
                (None, true)
            }
            _ => {
                if !rv_match.is_empty() {
                    return invalid("ListOptions", "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided");
                }
                match requested {
                    Some(rv) => (Some(rv), false),
                    None if send_initial == Some(false) => (Some(store.rv), false),
                    None => (None, false),
                }
            }
        };
        let (start, start_rv, rx) = match store.watch(kind, from, &filter, bookmarks) {
            Ok(w) => w,
            Err(RvError::Expired { compacted }) => {
                drop(store);
                // What the API server does: HTTP 200, then one ERROR event.
                let rv = from.unwrap_or(0);
                let status = status_object(
                    410,
                    "Expired",
                    &format!("too old resource version: {rv} ({compacted})"),
                    None,
                );
                let line = error_line(&status);
                let body = Body::from_stream(futures::stream::iter([Ok::<_, io::Error>(line)]));
                return watch_response(body);
            }
            Err(e @ RvError::TooLarge { .. }) => {
                return rv_error_response(e, "watch", from.unwrap_or(0))
            }
        };
        drop(store);
        let (initial, replay) = match start {
            WatchStart::Initial(objs) => (VecDeque::from(objs), VecDeque::new()),
            WatchStart::Replay(changes) => (VecDeque::new(), VecDeque::from(changes)),
        };
        self.shared.open_watches.fetch_add(1, Ordering::SeqCst);
        let state = WatchState {
            info,
            kind,
            meta,
            filter,
            bookmarks,
            initial,
            initial_end: initial_end.then_some(start_rv),
            replay,
            rx,
            deadline: timeout,
            done: false,
            _guard: WatchGuard(self.shared.clone()),
        };
        let stream = futures::stream::unfold(state, |mut st| async move {
            let item = st.next_item().await?;
            Some((item, st))
        });
        watch_response(Body::from_stream(stream))
    }

    // -----------------------------------------------------------------------
    // Events (events.k8s.io/v1 and core v1): stored, not watchable.

    fn events(&self, api: EventsApi, ns: Option<&str>, name: Option<&str>) -> Response {
        let (api_version, group): (&'static str, &str) = match api {
            EventsApi::EventsV1 => ("events.k8s.io/v1", "events.k8s.io"),
            EventsApi::CoreV1 => ("v1", ""),
        };
        match (self.method.clone(), ns, name) {
            (Method::GET, _, None) => {
                let store = self.shared.store();
                let items: Vec<&Value> = store
                    .events
                    .iter()
                    .filter(|((av, ens, _), _)| *av == api_version && ns.is_none_or(|n| n == ens))
                    .map(|(_, v)| v)
                    .collect();
                json_response(
                    StatusCode::OK,
                    &json!({"kind": "EventList", "apiVersion": api_version,
                            "metadata": {"resourceVersion": store.rv.to_string()}, "items": items}),
                )
            }
            (Method::POST, Some(ns), None) => self.create_event(api_version, group, ns),
            (Method::GET, Some(ns), Some(name)) => {
                let key = (api_version, ns.to_string(), name.to_string());
                match self.shared.store().events.get(&key) {
                    Some(ev) => json_response(StatusCode::OK, ev),
                    None => object_not_found(group, "events", name),
                }
            }
            (Method::PATCH, Some(ns), Some(name)) => self.patch_event(api_version, group, ns, name),
            (Method::PUT, Some(ns), Some(name)) => self.put_event(api_version, group, ns, name),
            (Method::DELETE, Some(ns), Some(name)) => {
                let key = (api_version, ns.to_string(), name.to_string());
                let mut store = self.shared.store();
                if store.events.remove(&key).is_none() {
                    return object_not_found(group, "events", name);
                }
                store.next_rv();
                json_response(
                    StatusCode::OK,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                            "details": {"name": name, "group": group, "kind": "events"}}),
                )
            }
            _ => method_not_allowed(),
        }
    }

    fn body_object(&self) -> Result<Value, Response> {
        let v: Value = serde_json::from_slice(self.body).map_err(|e| {
            bad_request(&format!(
                "the body of the request was in an unknown format: {e}"
            ))
        })?;
        if !v.is_object() {
            return Err(bad_request("the body of the request is not a JSON object"));
        }
        Ok(v)
    }

    fn create_event(&self, api_version: &'static str, group: &str, ns: &str) -> Response {
        let mut ev = match self.body_object() {
            Ok(v) => v,
            Err(r) => return r,
        };
        if !ev.get("metadata").is_some_and(Value::is_object) {
            ev["metadata"] = json!({});
        }
        let body_ns = ev["metadata"]
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !body_ns.is_empty() && body_ns != ns {
            return bad_request("the namespace of the provided object does not match the namespace sent on the request");
        }
        let name = match ev["metadata"].get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match ev["metadata"].get("generateName").and_then(Value::as_str) {
                Some(g) if !g.is_empty() => format!("{g}{}", util::suffix(util::random_u64(), 5)),
                _ => {
                    return invalid(
                        "Event",
                        "metadata.name: Required value: name or generateName is required",
                    )
                }
            },
        };
        let key = (api_version, ns.to_string(), name.clone());
        let mut store = self.shared.store();
        if store.events.contains_key(&key) {
            let qualified = if group.is_empty() {
                "events".to_string()
            } else {
                format!("events.{group}")
            };
            return status_response(
                StatusCode::CONFLICT,
                "AlreadyExists",
                &format!("{qualified} \"{name}\" already exists"),
                Some(json!({"name": name, "group": group, "kind": "events"})),
            );
        }
        let rv = store.next_rv();
        stamp_event(
            &mut ev,
            api_version,
            ns,
            &name,
            Some(json!(util::new_uid())),
            Some(json!(util::now_rfc3339())),
            rv,
        );
        store.events.insert(key.clone(), ev.clone());
        store.event_order.push(key);
        json_response(StatusCode::CREATED, &ev)
    }

    fn patch_event(
        &self,
        api_version: &'static str,
        group: &str,
        ns: &str,
        name: &str,
    ) -> Response {
        let ct = self
            .content_type
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim();
        let apply = match ct {
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => false,
            "application/apply-patch+yaml" | "application/apply-patch+json" => true,
            _ => {
                return status_response(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    &format!("the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {ct:?})"),
                    None,
                )
            }
        };
        let patch = match self.body_object() {
            Ok(v) => v,
            Err(r) => return r,
        };
        let key = (api_version, ns.to_string(), name.to_string());
        let mut store = self.shared.store();
        let (mut ev, created) = match store.events.get(&key) {
            Some(ev) => (ev.clone(), false),
            None if apply => (
                json!({"metadata": {"uid": util::new_uid(), "creationTimestamp": util::now_rfc3339()}}),
                true,
            ),
            None => return object_not_found(group, "events", name),
        };
        let keep = |ev: &Value, f: &str| ev["metadata"].get(f).cloned();
        let (uid, created_at) = (keep(&ev, "uid"), keep(&ev, "creationTimestamp"));
        util::merge_patch(&mut ev, &patch);
        let rv = store.next_rv();
        stamp_event(&mut ev, api_version, ns, name, uid, created_at, rv);
        store.events.insert(key.clone(), ev.clone());
        if created {
            store.event_order.push(key);
            return json_response(StatusCode::CREATED, &ev);
        }
        json_response(StatusCode::OK, &ev)
    }

    fn put_event(&self, api_version: &'static str, group: &str, ns: &str, name: &str) -> Response {
        let mut ev = match self.body_object() {
            Ok(v) => v,
            Err(r) => return r,
        };
        let key = (api_version, ns.to_string(), name.to_string());
        let mut store = self.shared.store();
        let Some(old) = store.events.get(&key).cloned() else {
            return object_not_found(group, "events", name);
        };
        if ev["metadata"]
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| n != name)
        {
            return bad_request("the name of the object does not match the name on the URL");
        }
        let rv = store.next_rv();
        let keep = |f: &str| Some(old["metadata"][f].clone());
        stamp_event(
            &mut ev,
            api_version,
            ns,
            name,
            keep("uid"),
            keep("creationTimestamp"),
            rv,
        );
        store.events.insert(key, ev.clone());
        json_response(StatusCode::OK, &ev)
    }
}

/// Sets the fields of an Event the server owns: its type, identity, and (when given)
/// uid and creation time, and the new resourceVersion.
fn stamp_event(
    ev: &mut Value,
    api_version: &str,
    ns: &str,
    name: &str,
    uid: Option<Value>,
    created: Option<Value>,
    rv: u64,
) {
    ev["kind"] = json!("Event");
    ev["apiVersion"] = json!(api_version);
    if !ev.get("metadata").is_some_and(Value::is_object) {
        ev["metadata"] = json!({});
    }
    let meta = ev["metadata"].as_object_mut().expect("object");
    meta.insert("name".into(), json!(name));
    meta.insert("namespace".into(), json!(ns));
    if let Some(uid) = uid {
        meta.insert("uid".into(), uid);
    }
    if let Some(ts) = created {
        meta.insert("creationTimestamp".into(), ts);
    }
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
}

fn watch_response(body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(body)
        .expect("a valid response")
}

/// Counts an open watch stream while it lives.
struct WatchGuard(Arc<Shared>);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

struct WatchState {
    info: &'static KindInfo,
    kind: usize,
    meta: bool,
    filter: Filter,
    bookmarks: bool,
    /// Synthetic ADDED events still to send.
    initial: VecDeque<Arc<Value>>,
    /// The `k8s.io/initial-events-end` bookmark to send after them.
    initial_end: Option<u64>,
    /// Changes from the history still to send.
    replay: VecDeque<Arc<Change>>,
    rx: mpsc::UnboundedReceiver<Msg>,
    deadline: Option<Instant>,
    done: bool,
    _guard: WatchGuard,
}

impl WatchState {
    /// The watch event of a change as seen through this watch's selectors: an
    /// object that starts matching is ADDED, one that stops matching is DELETED
    /// (its previous state at the new resourceVersion), as the API server does.
    fn encode_change(&self, c: &Change) -> Option<Bytes> {
        if c.kind != self.kind {
            return None;
        }
        let old = c.old.as_ref().is_some_and(|o| self.filter.matches(o));
        let new = c.new.as_ref().is_some_and(|o| self.filter.matches(o));
        match (old, new) {
            (_, true) => Some(event_line(
                if old { "MODIFIED" } else { "ADDED" },
                c.new.as_ref().expect("matched"),
                self.meta,
            )),
            (true, false) => {
                let gone = store::with_rv(c.old.as_ref().expect("matched"), c.rv);
                Some(event_line("DELETED", &gone, self.meta))
            }
            (false, false) => None,
        }
    }

    async fn next_item(&mut self) -> Option<Result<Bytes, io::Error>> {
        if self.done {
            return None;
        }
        loop {
            if let Some(obj) = self.initial.pop_front() {
                return Some(Ok(event_line("ADDED", &obj, self.meta)));
            }
            if let Some(rv) = self.initial_end.take() {
                return Some(Ok(bookmark_line(self.info, self.meta, rv, true)));
            }
            if let Some(c) = self.replay.pop_front() {
                match self.encode_change(&c) {
                    Some(line) => return Some(Ok(line)),
                    None => continue,
                }
            }
            let msg = match self.deadline {
                Some(deadline) => tokio::select! {
                    m = self.rx.recv() => m,
                    _ = tokio::time::sleep_until(deadline) => {
                        // timeoutSeconds: a clean end of the stream.
                        self.done = true;
                        return None;
                    }
                },
                None => self.rx.recv().await,
            };
            match msg {
                Some(Msg::Change(c)) => {
                    if let Some(line) = self.encode_change(&c) {
                        return Some(Ok(line));
                    }
                }
                Some(Msg::Bookmark(rv)) => {
                    if self.bookmarks {
                        return Some(Ok(bookmark_line(self.info, self.meta, rv, false)));
                    }
                }
                None => {
                    // drop_watches/shutdown: abort the response mid-stream (no final
                    // chunk), as a broken connection does.
                    self.done = true;
                    return Some(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "watch dropped by svcproxy-fakeapi",
                    )));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation() {
        assert_eq!(parse_accept(None), Some(Want::Full));
        assert_eq!(parse_accept(Some("application/json")), Some(Want::Full));
        assert_eq!(parse_accept(Some("*/*")), Some(Want::Full));
        assert_eq!(
            parse_accept(Some(
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            )),
            Some(Want::MetaList)
        );
        assert_eq!(
            parse_accept(Some(
                "application/json; as=PartialObjectMetadata; g=meta.k8s.io; v=v1, application/json"
            )),
            Some(Want::Meta)
        );
        assert_eq!(
            parse_accept(Some(
                "application/json;as=Table;g=meta.k8s.io;v=v1, application/json"
            )),
            Some(Want::Full)
        );
        assert_eq!(
            parse_accept(Some("application/vnd.kubernetes.protobuf")),
            None
        );
    }

    #[test]
    fn continue_tokens_round_trip() {
        let key = ("ns".to_string(), "a-b".to_string());
        let t = encode_continue(42, &key);
        assert_eq!(decode_continue(&t), Some((42, key)));
        let cluster = (String::new(), "node-1".to_string());
        assert_eq!(
            decode_continue(&encode_continue(7, &cluster)),
            Some((7, cluster))
        );
        assert_eq!(decode_continue("garbage!"), None);
        assert_eq!(
            decode_continue(&util::base64url_encode(b"{\"rv\":1}")),
            None
        );
    }
}
