//! Watches: the start of a watch (from a resourceVersion, or with the initial
//! events), and its stream of NDJSON lines: history replayed, changes seen
//! through the watch's selectors, bookmarks, `timeoutSeconds`, and the abort of
//! a dropped watch.
//!
//! Entry point: [`Ctx::watch`]; the stream is a [`WatchState`]'s.

use super::*;

impl Ctx<'_> {
    pub(super) fn watch(&self, kind: usize, ns: Option<&str>) -> Response {
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
