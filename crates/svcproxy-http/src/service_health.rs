//! healthCheckNodePort servers: for every LoadBalancer Service with
//! `externalTrafficPolicy: Local`, an HTTP server on its `healthCheckNodePort` that
//! tells the cloud load balancer whether this node has local endpoints, answering
//! exactly as kube-proxy's (upstream `pkg/proxy/healthcheck/service_health.go`).
//!
//! Entry point: [`ServiceHealthServers::sync`] with the wanted services, after every
//! sync. A server is bound synchronously and closed synchronously (its listening socket
//! is dropped before `sync` returns, so a port moving between services or addresses is
//! free at once). A port that cannot be bound is logged once, counted, retried on every
//! later sync, and never affects the other services.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Router;
use svcproxy_core::model::ServiceName;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::health::{json_response, ProxyHealth};
use super::metrics::Metrics;

/// Where the healthCheckNodePort servers listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// Every address of both families (one dual-stack socket where the host allows).
    Everywhere,
    /// These addresses; an unspecified one (`0.0.0.0`, `::`) is every address of its
    /// family only. Empty: nowhere (no server runs until addresses appear).
    Ips(Vec<IpAddr>),
}

impl Listen {
    /// `ips` sorted and deduplicated, so equal sets compare equal.
    pub fn ips(mut ips: Vec<IpAddr>) -> Listen {
        ips.sort();
        ips.dedup();
        Listen::Ips(ips)
    }

    fn is_nowhere(&self) -> bool {
        matches!(self, Listen::Ips(ips) if ips.is_empty())
    }
}

/// The healthCheckNodePort servers of this node.
pub struct ServiceHealthServers {
    listen: Listen,
    health: Arc<ProxyHealth>,
    metrics: Option<Arc<Metrics>>,
    runtime: tokio::runtime::Handle,
    servers: BTreeMap<ServiceName, Server>,
    /// Services whose port could not be bound: the port and the error last logged.
    failing: BTreeMap<ServiceName, (u16, String)>,
    /// The last wanted services, to re-open them when the addresses change.
    wanted: BTreeMap<ServiceName, (u16, usize)>,
}

/// One service's server: a listener per address, all sharing the endpoint count.
struct Server {
    port: u16,
    local_endpoints: Arc<AtomicUsize>,
    listeners: Vec<Closable>,
    /// Dropping it shuts the serving tasks down (and closes idle connections).
    _stop: watch::Sender<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        for l in &self.listeners {
            l.close();
        }
    }
}

/// A listener the owner can close synchronously while a task accepts on it.
#[derive(Clone)]
struct Closable(Arc<Mutex<Option<TcpListener>>>);

impl Closable {
    fn close(&self) {
        // Dropping the listener closes the socket now, not when the task next runs.
        drop(self.0.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

impl axum::serve::Listener for Closable {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            let result = std::future::poll_fn(|cx| {
                let guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
                match guard.as_ref() {
                    Some(l) => l.poll_accept(cx),
                    // Closed: the shutdown signal ends the server.
                    None => std::task::Poll::Pending,
                }
            })
            .await;
            match result {
                Ok(conn) => return conn,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::ConnectionRefused
                    ) => {}
                Err(e) => {
                    // E.g. out of file descriptors: wait for some to be released.
                    tracing::error!("healthCheckNodePort accept: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        match self.0.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(l) => l.local_addr(),
            None => Err(io::Error::new(io::ErrorKind::NotConnected, "closed")),
        }
    }
}

/// What one service's handler needs.
struct Handler {
    service: ServiceName,
    local_endpoints: Arc<AtomicUsize>,
    health: Arc<ProxyHealth>,
}

/// Upstream's hcHandler answer, byte for byte (its dedented template), with the
/// names JSON-escaped.
fn answer(h: &Handler) -> Response {
    let count = h.local_endpoints.load(Ordering::Relaxed);
    let healthy = h.health.is_healthy();
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string());
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {count},\n\t\"serviceProxyHealthy\": {healthy}\n}}",
        quote(&h.service.namespace),
        quote(&h.service.name),
    );
    let code = if count > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut resp = json_response(code, body);
    resp.headers_mut().insert(
        "x-load-balancing-endpoint-weight",
        count
            .to_string()
            .parse()
            .expect("digits are a valid header value"),
    );
    resp
}

/// Whether a wildcard IPv6 socket is IPv6-only on this host (it is dual-stack unless
/// the `net.ipv6.bindv6only` sysctl says otherwise).
pub(super) fn ipv6_wildcard_is_v6_only() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").is_ok_and(|s| s.trim() == "1")
}

/// A listener on `addr`, with `SO_REUSEPORT`: a new owner (the binary's hand-over) binds
/// the healthCheckNodePorts at its first sync while the old one still holds them.
fn bind_std(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

/// A listener on every IPv6 address and no IPv4 one (`IPV6_V6ONLY`), so that
/// specific IPv4 addresses can take the same port.
fn bind_v6_only_wildcard(port: u16) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::IPV6, Type::STREAM, None)?;
    sock.set_only_v6(true)?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.bind(&SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port).into())?;
    sock.listen(1024)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

impl ServiceHealthServers {
    /// Must be called inside a tokio runtime, where the servers will run.
    pub fn new(listen: Listen, health: Arc<ProxyHealth>, metrics: Option<Arc<Metrics>>) -> Self {
        ServiceHealthServers {
            listen,
            health,
            metrics,
            runtime: tokio::runtime::Handle::current(),
            servers: BTreeMap::new(),
            failing: BTreeMap::new(),
            wanted: BTreeMap::new(),
        }
    }

    /// Makes the running servers those of `services` (service → (healthCheckNodePort,
    /// local ready endpoints)): opens missing ones, closes unwanted ones and those
    /// whose port changed, and updates the counts running ones answer with.
    pub fn sync(&mut self, services: &BTreeMap<ServiceName, (u16, usize)>) {
        self.wanted = services.clone();
        if self.listen.is_nowhere() {
            self.servers.clear();
            self.failing.clear();
            if let Some(m) = &self.metrics {
                m.set_health_check_bind_failures(0);
            }
            return;
        }
        // Close first, so a port moving from one service to another is free.
        self.servers.retain(|name, server| {
            let keep = services.get(name).is_some_and(|(p, _)| *p == server.port);
            if !keep {
                tracing::info!(service = %name, port = server.port, "closing healthCheckNodePort server");
            }
            keep
        });
        self.failing
            .retain(|name, (port, _)| services.get(name).is_some_and(|(p, _)| p == port));
        for (name, &(port, count)) in services {
            if let Some(server) = self.servers.get(name) {
                server.local_endpoints.store(count, Ordering::Relaxed);
                continue;
            }
            match self.open(name, port, count) {
                Ok(server) => {
                    if self.failing.remove(name).is_some() {
                        tracing::info!(service = %name, port, "healthCheckNodePort server listening after earlier failures");
                    } else {
                        tracing::info!(service = %name, port, "opened healthCheckNodePort server");
                    }
                    self.servers.insert(name.clone(), server);
                }
                Err(err) => {
                    let entry = (port, err);
                    if self.failing.get(name) != Some(&entry) {
                        tracing::error!(
                            service = %name,
                            port,
                            error = %entry.1,
                            "cannot open the healthCheckNodePort server; the load balancer \
                             will see this node as unhealthy for the service (retried on \
                             every sync)"
                        );
                        self.failing.insert(name.clone(), entry);
                    }
                }
            }
        }
        if let Some(m) = &self.metrics {
            m.set_health_check_bind_failures(self.failing.len());
        }
    }

    /// Changes where the servers listen; when it differs, every server is re-opened
    /// there.
    pub fn set_listen(&mut self, listen: Listen) {
        if listen == self.listen {
            return;
        }
        if listen.is_nowhere() {
            tracing::warn!("no address of this host is a NodePort address (--nodeport-addresses): healthCheckNodePort servers are closed until one is");
        } else {
            tracing::info!(?listen, "healthCheckNodePort servers move to new addresses");
        }
        self.listen = listen;
        self.servers.clear();
        self.failing.clear();
        let wanted = std::mem::take(&mut self.wanted);
        self.sync(&wanted);
    }

    /// Services whose server currently cannot listen.
    pub fn bind_failures(&self) -> usize {
        self.failing.len()
    }

    /// Closes every server.
    pub fn shutdown(&mut self) {
        self.servers.clear();
        self.failing.clear();
        self.wanted.clear();
    }

    /// The listening sockets for `port`: one per configured IP, or the wildcard.
    fn bind_all(&self, port: u16) -> Result<Vec<std::net::TcpListener>, String> {
        let describe = |addr: SocketAddr, e: io::Error| format!("listen on {addr}: {e}");
        if let Listen::Ips(ips) = &self.listen {
            return ips
                .iter()
                .map(|ip| {
                    let addr = SocketAddr::new(*ip, port);
                    match ip {
                        IpAddr::V6(v6) if v6.is_unspecified() => bind_v6_only_wildcard(port),
                        _ => bind_std(addr),
                    }
                    .map_err(|e| describe(addr, e))
                })
                .collect();
        }
        // As Go's ":port": one dual-stack IPv6 socket, IPv4 alone if the host has no
        // IPv6, and both sockets where IPv6 wildcards are IPv6-only.
        let v6 = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port);
        let v4 = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port);
        match bind_std(v6) {
            Ok(l6) if ipv6_wildcard_is_v6_only() => {
                let l4 = bind_std(v4).map_err(|e| describe(v4, e))?;
                Ok(vec![l6, l4])
            }
            Ok(l6) => Ok(vec![l6]),
            Err(e) if matches!(e.kind(), io::ErrorKind::AddrInUse) => Err(describe(v6, e)),
            Err(_) => Ok(vec![bind_std(v4).map_err(|e| describe(v4, e))?]),
        }
    }

    fn open(&self, name: &ServiceName, port: u16, count: usize) -> Result<Server, String> {
        if port == 0 {
            return Err("healthCheckNodePort 0 is not a port".to_string());
        }
        // All or nothing, as upstream: listeners bound so far close on error.
        let std_listeners = self.bind_all(port)?;
        let _enter = self.runtime.enter();
        let local_endpoints = Arc::new(AtomicUsize::new(count));
        let (stop, stopped) = watch::channel(());
        let handler = Arc::new(Handler {
            service: name.clone(),
            local_endpoints: local_endpoints.clone(),
            health: self.health.clone(),
        });
        let mut listeners = Vec::new();
        for l in std_listeners {
            let addr = l.local_addr().ok();
            let listener =
                TcpListener::from_std(l).map_err(|e| format!("listen on {addr:?}: {e}"))?;
            let closable = Closable(Arc::new(Mutex::new(Some(listener))));
            listeners.push(closable.clone());
            let app = Router::new()
                .fallback(|State(h): State<Arc<Handler>>| async move { answer(&h) })
                .with_state(handler.clone());
            let mut stopped = stopped.clone();
            let service = name.clone();
            self.runtime.spawn(async move {
                let shutdown = async move {
                    // Errs when the sender is dropped: the server was closed.
                    let _ = stopped.changed().await;
                };
                if let Err(e) = axum::serve(closable, app)
                    .with_graceful_shutdown(shutdown)
                    .await
                {
                    tracing::warn!(service = %service, ?addr, "healthCheckNodePort server: {e}");
                }
            });
        }
        Ok(Server {
            port,
            local_endpoints,
            listeners,
            _stop: stop,
        })
    }
}

impl Drop for ServiceHealthServers {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::UNIX_EPOCH;

    use crate::health::testing::ManualClock;

    const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    /// A port that was free a moment ago.
    fn free_port() -> u16 {
        std::net::TcpListener::bind((LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn svc(ns: &str, name: &str) -> ServiceName {
        ServiceName::new(ns, name)
    }

    fn synced_health() -> (Arc<ProxyHealth>, Arc<ManualClock>) {
        let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_714_557_600));
        let h = ProxyHealth::with_clock(Duration::from_secs(60), clock.clone());
        h.updated();
        (h, clock)
    }

    /// A fresh connection per request: reused connections would hide closed servers.
    async fn get(port: u16, path: &str) -> reqwest::Result<(u16, Option<String>, String)> {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let resp = client
            .get(format!("http://127.0.0.1:{port}{path}"))
            .send()
            .await?;
        let code = resp.status().as_u16();
        let headers = resp.headers().clone();
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let weight = headers
            .get("x-load-balancing-endpoint-weight")
            .map(|v| v.to_str().unwrap().to_string());
        Ok((code, weight, resp.text().await?))
    }

    fn body(ns: &str, name: &str, count: usize, healthy: bool) -> String {
        format!(
            "{{\n\t\"service\": {{\n\t\t\"namespace\": \"{ns}\",\n\t\t\"name\": \"{name}\"\n\t}},\n\t\"localEndpoints\": {count},\n\t\"serviceProxyHealthy\": {healthy}\n}}"
        )
    }

    /// Binding succeeds within a few seconds (the server let go of the port).
    async fn rebindable(port: u16) -> bool {
        for _ in 0..50 {
            if std::net::TcpListener::bind((LOCALHOST, port)).is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn servers_answer_with_the_local_endpoint_count_and_follow_its_changes() {
        let (health, _clock) = synced_health();
        let mut servers = ServiceHealthServers::new(Listen::ips(vec![LOCALHOST]), health, None);
        let (p1, p2) = (free_port(), free_port());
        let web = svc("shop", "web");
        let api = svc("shop", "api");
        let mut wanted = BTreeMap::from([(web.clone(), (p1, 1)), (api.clone(), (p2, 0))]);
        servers.sync(&wanted);
        assert_eq!(servers.bind_failures(), 0);

        let (code, weight, text) = get(p1, "/").await.unwrap();
        assert_eq!((code, weight.as_deref()), (200, Some("1")));
        assert_eq!(text, body("shop", "web", 1, true));
        // Any path answers, as upstream.
        assert_eq!(get(p1, "/healthz").await.unwrap().0, 200);
        let (code, weight, text) = get(p2, "/").await.unwrap();
        assert_eq!((code, weight.as_deref()), (503, Some("0")));
        assert_eq!(text, body("shop", "api", 0, true));

        // The last local endpoint goes: 200 → 503.
        wanted.insert(web.clone(), (p1, 0));
        servers.sync(&wanted);
        let (code, weight, text) = get(p1, "/").await.unwrap();
        assert_eq!((code, weight.as_deref()), (503, Some("0")));
        assert_eq!(text, body("shop", "web", 0, true));

        // Two arrive: 503 → 200.
        wanted.insert(web.clone(), (p1, 2));
        servers.sync(&wanted);
        let (code, weight, text) = get(p1, "/").await.unwrap();
        assert_eq!((code, weight.as_deref()), (200, Some("2")));
        assert_eq!(text, body("shop", "web", 2, true));

        // A removed service's port is closed and free again.
        wanted.remove(&api);
        servers.sync(&wanted);
        assert!(get(p2, "/").await.unwrap_err().is_connect());
        assert!(std::net::TcpListener::bind((LOCALHOST, p2)).is_ok());
        assert_eq!(get(p1, "/").await.unwrap().0, 200);

        servers.shutdown();
        assert!(rebindable(p1).await);
    }

    #[tokio::test]
    async fn a_port_change_moves_the_server() {
        let (health, _clock) = synced_health();
        let mut servers = ServiceHealthServers::new(Listen::ips(vec![LOCALHOST]), health, None);
        let (p1, p2) = (free_port(), free_port());
        let web = svc("shop", "web");
        servers.sync(&BTreeMap::from([(web.clone(), (p1, 1))]));
        assert_eq!(get(p1, "/").await.unwrap().0, 200);
        // Another service takes over the old port in the same sync.
        let other = svc("shop", "other");
        servers.sync(&BTreeMap::from([(web, (p2, 1)), (other, (p1, 3))]));
        assert_eq!(servers.bind_failures(), 0);
        assert_eq!(get(p2, "/").await.unwrap().0, 200);
        let (_, weight, text) = get(p1, "/").await.unwrap();
        assert_eq!(weight.as_deref(), Some("3"));
        assert_eq!(text, body("shop", "other", 3, true));
    }

    #[tokio::test]
    async fn a_port_in_use_is_counted_and_retried_without_affecting_others() {
        let (health, _clock) = synced_health();
        let metrics = Metrics::new();
        let mut servers =
            ServiceHealthServers::new(Listen::ips(vec![LOCALHOST]), health, Some(metrics.clone()));
        let squatter = std::net::TcpListener::bind((LOCALHOST, 0)).unwrap();
        let taken = squatter.local_addr().unwrap().port();
        let free = free_port();
        let wanted = BTreeMap::from([
            (svc("a", "blocked"), (taken, 1)),
            (svc("b", "fine"), (free, 1)),
        ]);
        servers.sync(&wanted);
        assert_eq!(servers.bind_failures(), 1);
        assert!(metrics
            .render()
            .lines()
            .any(|l| l == "svcproxy_service_health_check_bind_failures 1"));
        assert_eq!(get(free, "/").await.unwrap().0, 200);
        // Still taken: still failing (and logged only once).
        servers.sync(&wanted);
        assert_eq!(servers.bind_failures(), 1);

        drop(squatter);
        servers.sync(&wanted);
        assert_eq!(servers.bind_failures(), 0);
        assert!(metrics
            .render()
            .lines()
            .any(|l| l == "svcproxy_service_health_check_bind_failures 0"));
        let (code, _, text) = get(taken, "/").await.unwrap();
        assert_eq!(code, 200);
        assert_eq!(text, body("a", "blocked", 1, true));
    }

    #[tokio::test]
    async fn an_unhealthy_proxy_answers_503_even_with_local_endpoints() {
        let (health, clock) = synced_health();
        let mut servers =
            ServiceHealthServers::new(Listen::ips(vec![LOCALHOST]), health.clone(), None);
        let port = free_port();
        servers.sync(&BTreeMap::from([(svc("shop", "web"), (port, 3))]));
        assert_eq!(get(port, "/").await.unwrap().0, 200);
        health.queued_update();
        clock.advance(Duration::from_secs(61));
        let (code, weight, text) = get(port, "/").await.unwrap();
        assert_eq!((code, weight.as_deref()), (503, Some("3")));
        assert_eq!(text, body("shop", "web", 3, false));
        health.updated();
        assert_eq!(get(port, "/").await.unwrap().0, 200);
    }

    #[tokio::test]
    async fn names_are_json_escaped() {
        let (health, _clock) = synced_health();
        let mut servers = ServiceHealthServers::new(Listen::ips(vec![LOCALHOST]), health, None);
        let port = free_port();
        servers.sync(&BTreeMap::from([(svc("ns\"x", "a\\b\n"), (port, 1))]));
        let (_, _, text) = get(port, "/").await.unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["service"]["namespace"], "ns\"x");
        assert_eq!(v["service"]["name"], "a\\b\n");
        assert_eq!(v["localEndpoints"], 1);
        assert_eq!(v["serviceProxyHealthy"], true);
    }

    #[tokio::test]
    async fn new_listen_addresses_reopen_every_server() {
        let (health, _clock) = synced_health();
        // Every address first (dual-stack or IPv4 wildcard), then 127.0.0.1 only.
        let mut servers = ServiceHealthServers::new(Listen::Everywhere, health, None);
        let port = free_port();
        let wanted = BTreeMap::from([(svc("shop", "web"), (port, 1))]);
        servers.sync(&wanted);
        assert_eq!(servers.bind_failures(), 0);
        assert_eq!(get(port, "/").await.unwrap().0, 200);
        assert!(std::net::TcpListener::bind((LOCALHOST, port)).is_err());
        servers.set_listen(Listen::ips(vec![LOCALHOST]));
        assert_eq!(servers.bind_failures(), 0, "the wildcard was closed first");
        assert_eq!(get(port, "/").await.unwrap().0, 200);
        servers.set_listen(Listen::ips(vec![IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))]));
        assert!(get(port, "/").await.unwrap_err().is_connect());
        // Nowhere: nothing listens, nothing fails; addresses coming back re-open.
        servers.set_listen(Listen::ips(Vec::new()));
        assert_eq!(servers.bind_failures(), 0);
        assert!(std::net::TcpListener::bind((Ipv4Addr::new(127, 0, 0, 2), port)).is_ok());
        servers.set_listen(Listen::ips(vec![LOCALHOST]));
        assert_eq!(get(port, "/").await.unwrap().0, 200);
    }

    #[tokio::test]
    async fn an_ipv6_wildcard_leaves_ipv4_addresses_to_their_own_listeners() {
        if std::net::TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).is_err() {
            svcproxy_testkit::netns::skip(
                "an_ipv6_wildcard_leaves_ipv4_addresses_to_their_own_listeners",
                "this host has no IPv6",
            );
            return;
        }
        let (health, _clock) = synced_health();
        let listen = Listen::ips(vec![Ipv6Addr::UNSPECIFIED.into(), LOCALHOST]);
        let mut servers = ServiceHealthServers::new(listen, health, None);
        let port = free_port();
        servers.sync(&BTreeMap::from([(svc("shop", "web"), (port, 1))]));
        // Without IPV6_V6ONLY the `::` socket would also hold 127.0.0.1's port.
        assert_eq!(servers.bind_failures(), 0);
        assert_eq!(get(port, "/").await.unwrap().0, 200);
    }
}
