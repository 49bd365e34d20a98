//! A fake Kubernetes API server for tests, speaking the real wire protocol over plain
//! HTTP/1.1, so that the real kube-rs client (lists, `watcher`, `metadata_watcher`,
//! the events `Recorder`) and the real `svcproxy` binary can talk to it.
//!
//! Served: Services (`/api/v1/services`), EndpointSlices
//! (`/apis/discovery.k8s.io/v1/endpointslices`), Nodes (`/api/v1/nodes`, also as
//! `PartialObjectMetadata`), ServiceCIDRs (`/apis/networking.k8s.io/v1/servicecidrs`)
//! and Pods (`/api/v1/pods`, for the cluster DNS), cluster-wide and (namespaced kinds) per namespace, plus single-object GETs; Events
//! (`events.k8s.io/v1` and core `v1`) can be created, patched, replaced, read and
//! deleted.
//!
//! Protocol: one global resourceVersion bumped per write; lists with
//! `resourceVersion`/`resourceVersionMatch`, `limit`/`continue` (consistent snapshots
//! across pages, 410 Expired after [`FakeApiServer::compact`]), label and field
//! selectors; watches (NDJSON in a chunked response) replaying the history after a
//! resourceVersion, selector-aware ADDED/DELETED on updates, bookmarks,
//! `timeoutSeconds`, `sendInitialEvents`, and the `ERROR` 410 event for a compacted
//! resourceVersion. Errors are `Status` objects.
//!
//! Fault injection: [`FakeApiServer::drop_watches`], [`FakeApiServer::compact`],
//! [`FakeApiServer::set_served`], [`FakeApiServer::set_watches_refused`],
//! [`FakeApiServer::shutdown`] and [`FakeApiServer::start_on`] (a server that comes
//! back on the same address).

pub mod churn;
mod http;
pub mod scale;
mod selector;
mod store;
mod util;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use http::Shared;
use store::{kind_index_or_panic, KINDS};

/// One request the server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// `GET`, `POST`, `PATCH`, ...
    pub method: String,
    /// The URL path, e.g. `/api/v1/services`.
    pub path: String,
    /// The raw (still percent-encoded) query string, without `?`; kube-rs starts it
    /// with `&`.
    pub query: String,
    /// The `Accept` header, if any.
    pub accept: Option<String>,
    /// The HTTP status of the response (200 for watches, even when they carry an
    /// ERROR event).
    pub status: u16,
}

impl RequestRecord {
    /// A decoded query parameter (the last one of that name).
    pub fn param(&self, name: &str) -> Option<String> {
        util::parse_query(&self.query)
            .into_iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }

    /// Whether this is a watch request (`watch=true` or `watch=1`).
    pub fn is_watch(&self) -> bool {
        self.param("watch")
            .and_then(|v| util::parse_bool(&v))
            .unwrap_or(false)
    }

    /// Whether this asked for metadata only (`as=PartialObjectMetadata[List]`).
    pub fn is_metadata(&self) -> bool {
        self.accept
            .as_deref()
            .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
    }
}

/// A running fake API server. Clones are handles to the same server; it stops on
/// [`FakeApiServer::shutdown`] or when the last handle is dropped.
#[derive(Clone)]
pub struct FakeApiServer {
    shared: Arc<Shared>,
    tasks: Arc<Tasks>,
    addr: SocketAddr,
}

struct Tasks {
    serve: Mutex<Option<JoinHandle<()>>>,
    ticker: JoinHandle<()>,
    closed: watch::Sender<bool>,
}

impl Drop for Tasks {
    fn drop(&mut self) {
        let _ = self.closed.send(true);
        if let Some(serve) = self.serve.lock().unwrap_or_else(|e| e.into_inner()).take() {
            serve.abort();
        }
        self.ticker.abort();
    }
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl FakeApiServer {
    /// Starts a server on 127.0.0.1 and a free port.
    pub async fn start() -> io::Result<FakeApiServer> {
        FakeApiServer::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts a server on `addr` (e.g. one a client already tries to reach).
    pub async fn start_on(addr: SocketAddr) -> io::Result<FakeApiServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new());
        let (closed, closed_rx) = watch::channel(false);
        let app = Router::new()
            .fallback(http::handle)
            .with_state(shared.clone());
        let listener = ClosingListener {
            inner: listener,
            closed: closed_rx,
        };
        let serve = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "fake API server stopped");
            }
        });
        let ticker = tokio::spawn(http::bookmark_ticker(shared.clone()));
        tracing::debug!(%addr, "fake API server listening");
        Ok(FakeApiServer {
            shared,
            tasks: Arc::new(Tasks {
                serve: Mutex::new(Some(serve)),
                ticker,
                closed,
            }),
            addr,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig for this server (plain HTTP, a token user).
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig_yaml(&self.url())
    }

    /// Creates or updates an object, by `kind` ("Service", "EndpointSlice", "Node",
    /// "ServiceCIDR"), namespace (default "default" for namespaced kinds) and name.
    /// Fills `apiVersion`, `metadata.uid`, `creationTimestamp` and
    /// `resourceVersion`; returns the object's resourceVersion (unchanged when the
    /// object is unchanged: no-op updates write nothing, as on a real server).
    ///
    /// Panics on an unknown kind or a missing name.
    pub fn apply(&self, obj: Value) -> u64 {
        self.shared.store().apply(obj)
    }

    /// Deletes an object; false if it did not exist. `namespace` is ignored for
    /// cluster-scoped kinds and defaults to "default" for namespaced ones.
    pub fn delete(&self, kind: &str, namespace: Option<&str>, name: &str) -> bool {
        let k = kind_index_or_panic(kind);
        let ns = if KINDS[k].namespaced {
            namespace.unwrap_or("default").to_string()
        } else {
            String::new()
        };
        self.shared.store().delete(k, &(ns, name.to_string()))
    }

    /// The current objects of a kind (ordered by namespace, name).
    pub fn list_objects(&self, kind: &str) -> Vec<Value> {
        let k = kind_index_or_panic(kind);
        self.shared
            .store()
            .objects(k)
            .map(|o| (**o).clone())
            .collect()
    }

    /// The current resourceVersion (of the last write).
    pub fn resource_version(&self) -> u64 {
        self.shared.store().rv
    }

    /// Ends every open watch mid-stream: the response is aborted (no final chunk),
    /// as when the connection breaks. Events queued before the call are sent first.
    pub fn drop_watches(&self) {
        self.shared.store().drop_watches();
    }

    /// Forgets the history up to now: a list continuation, an `Exact` list or a
    /// watch from an older resourceVersion gets 410 Expired.
    pub fn compact(&self) {
        self.shared.store().compact();
    }

    /// Forgets all but the last `keep` changes (a bounded history for long runs).
    pub fn trim_history(&self, keep: usize) {
        self.shared.store().trim_history(keep);
    }

    /// Serves (true, the default) or not (404, as a resource the cluster does not
    /// have) a kind. Open watches are not affected.
    pub fn set_served(&self, kind: &str, served: bool) {
        let k = kind_index_or_panic(kind);
        self.shared.store().unserved[k] = !served;
    }

    /// While true, every new watch request fails with 500 InternalError (lists still
    /// work): a way to keep clients disconnected while changing and compacting.
    pub fn set_watches_refused(&self, refused: bool) {
        // Under the store lock, so that no watch registers across the change (see
        // the check in the watch handler).
        let _store = self.shared.store();
        self.shared.watches_refused.store(refused, Ordering::SeqCst);
    }

    /// How often watches that allow bookmarks get one (default 1 s).
    pub fn set_bookmark_interval(&self, d: Duration) {
        *self
            .shared
            .bookmark_interval
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = d.max(Duration::from_millis(1));
        self.shared.interval_changed.notify_one();
    }

    /// Sends a bookmark at the current resourceVersion to every watch allowing them.
    pub fn send_bookmarks(&self) {
        self.shared.store().bookmark_all();
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// The Events posted (either API group), in creation order, as they are now.
    pub fn events(&self) -> Vec<Value> {
        let store = self.shared.store();
        store
            .event_order
            .iter()
            .filter_map(|k| store.events.get(k).cloned())
            .collect()
    }

    /// The number of watch responses currently streaming.
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }

    /// Stops listening and closes every connection (open watches are aborted); the
    /// address can be bound again afterwards.
    pub async fn shutdown(self) {
        let _ = self.tasks.closed.send(true);
        self.shared.store().drop_watches();
        let serve = self
            .tasks
            .serve
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(serve) = serve {
            serve.abort();
            let _ = serve.await;
        }
        self.tasks.ticker.abort();
        // Let the connection tasks see the close.
        tokio::task::yield_now().await;
    }
}

/// A kubeconfig for a plain-HTTP server with a token user.
pub fn kubeconfig_yaml(server_url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {server_url}\n\
         users:\n- name: fake\n  user:\n    token: fake-token\ncontexts:\n- name: fake\n  context:\n    \
         cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\npreferences: {{}}\n"
    )
}

/// A TCP listener whose connections all fail once `closed` turns true.
struct ClosingListener {
    inner: TcpListener,
    closed: watch::Receiver<bool>,
}

impl axum::serve::Listener for ClosingListener {
    type Io = ClosableIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    return (ClosableIo::new(stream, self.closed.clone()), addr);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "accept");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that fails every read and write (so hyper drops it) once the
/// server shuts down.
struct ClosableIo {
    io: TcpStream,
    closed: Pin<Box<dyn Future<Output = ()> + Send>>,
    is_closed: bool,
}

impl ClosableIo {
    fn new(io: TcpStream, mut rx: watch::Receiver<bool>) -> ClosableIo {
        let closed = Box::pin(async move {
            // Ends when the flag turns true or the sender is gone.
            let _ = rx.wait_for(|c| *c).await;
        });
        ClosableIo {
            io,
            closed,
            is_closed: false,
        }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.is_closed && self.closed.as_mut().poll(cx).is_ready() {
            self.is_closed = true;
        }
        if self.is_closed {
            Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "svcproxy-fakeapi shut down",
            ))
        } else {
            Ok(())
        }
    }
}

impl AsyncRead for ClosableIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClosableIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
