//! The HTTP side: routing, lists, gets, watches, Events and `Status` errors, as the
//! Kubernetes API server answers them.
//!
//! The parts: `routing` (a path and method to the handler of a kind), `read`
//! (a single object's GET, and lists with their pages), `watch` (watch streams),
//! `events` (the Events APIs), `encoding` (what `Accept` asks for, objects and
//! watch lines as JSON), `responses` (`Status` errors and other responses).
//! Here: the state the server shares, the bookmark ticker, and [`handle`], the
//! entry point of every request, with the request's [`Ctx`].

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

mod encoding;
mod events;
mod read;
mod responses;
mod routing;
mod watch;

use encoding::*;
use responses::*;

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
