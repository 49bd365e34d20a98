//! The userspace proxy's TCP engine: connections captured by the mode's rules are
//! accepted here, an endpoint is chosen, a connection is opened to it, and bytes
//! are copied both ways until both sides have closed.
//!
//! What the kernel cannot do, done here: an endpoint that refuses the connection, or
//! does not accept it within the connect timeout, is skipped and the next one tried
//! (each at most once), so a client never sees a dead endpoint the API has not
//! caught up with; round-robin or least-connections choice; ClientIP affinity with
//! its timeout. A half-close (one side shutting down its writing) is passed on, and
//! the other direction keeps flowing until it closes too. Connections to an
//! endpoint that left its pool are closed after the drain timeout, if one is set.
//!
//! A listener serves one endpoint set (cluster or local) of every TCP service of
//! its family: the capture rules chose the set, the connection's original
//! destination (`SO_ORIGINAL_DST`) says which service, through [`RouteTable`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

pub use super::options::Scheduler;
use svcproxy_core::model::IpFamily;
use svcproxy_core::model::ServicePortName;
use svcproxy_plan::intent::EndpointSetId;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One endpoint of a pool, and the connections open to it.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub addr: SocketAddr,
    active: AtomicUsize,
    /// Becomes true when the endpoint leaves its pool (drain).
    removed: watch::Sender<bool>,
}

impl Endpoint {
    /// Whether the endpoint has left its pool.
    pub fn is_removed(&self) -> bool {
        *self.removed.borrow()
    }

    fn new(addr: SocketAddr) -> Self {
        Endpoint {
            addr,
            active: AtomicUsize::new(0),
            removed: watch::Sender::new(false),
        }
    }
}

/// ClientIP session affinity: a client's endpoint, while it keeps connecting
/// within the timeout.
#[derive(Debug)]
struct Affinity {
    timeout: Duration,
    clients: Mutex<HashMap<IpAddr, (usize, Instant)>>,
}

/// Clients remembered per pool at most; past it, expired ones are forgotten, and
/// if none has expired the new client is not remembered (it still connects).
const MAX_AFFINITY_CLIENTS: usize = 100_000;

/// One service port's endpoints, as the engine balances over them.
#[derive(Debug)]
pub struct Pool {
    endpoints: Vec<Arc<Endpoint>>,
    scheduler: Scheduler,
    next: AtomicUsize,
    affinity: Option<Affinity>,
    /// The service port's counters (kept by the pools that follow this one).
    counters: Arc<PortCounters>,
}

impl Pool {
    /// `affinity`: ClientIP affinity's timeout, if the service has it.
    pub fn new(
        endpoints: Vec<SocketAddr>,
        scheduler: Scheduler,
        affinity: Option<Duration>,
    ) -> Self {
        Pool {
            endpoints: endpoints
                .into_iter()
                .map(|addr| Arc::new(Endpoint::new(addr)))
                .collect(),
            scheduler,
            next: AtomicUsize::new(0),
            affinity: affinity.map(|timeout| Affinity {
                timeout,
                clients: Mutex::new(HashMap::new()),
            }),
            counters: Arc::default(),
        }
    }

    /// The pool, counting into `counters` (its service port's, from [`Stats::port`]).
    pub fn counting(mut self, counters: Arc<PortCounters>) -> Self {
        self.counters = counters;
        self
    }

    /// What the pool's service port has done.
    pub fn counters(&self) -> &Arc<PortCounters> {
        &self.counters
    }

    /// The pool that replaces `self` when its endpoints or settings change:
    /// endpoints that stay keep their connection counts (and their affinity
    /// clients, when the timeout is the same); those that leave are told so (their
    /// connections drain).
    pub fn successor(
        &self,
        endpoints: Vec<SocketAddr>,
        scheduler: Scheduler,
        affinity: Option<Duration>,
    ) -> Pool {
        let mut next = Pool::new(endpoints, scheduler, affinity);
        for ep in &mut next.endpoints {
            if let Some(old) = self.endpoints.iter().find(|o| o.addr == ep.addr) {
                *ep = old.clone();
            }
        }
        for old in &self.endpoints {
            if !next.endpoints.iter().any(|e| Arc::ptr_eq(e, old)) {
                old.removed.send_replace(true);
            }
        }
        if let (Some(a), Some(b)) = (&self.affinity, &next.affinity) {
            if a.timeout == b.timeout {
                let old = a.clients.lock().unwrap_or_else(|e| e.into_inner());
                let mut new = b.clients.lock().unwrap_or_else(|e| e.into_inner());
                for (client, (i, at)) in old.iter() {
                    let addr = self.endpoints.get(*i).map(|e| e.addr);
                    if let Some(j) = next.endpoints.iter().position(|e| Some(e.addr) == addr) {
                        new.insert(*client, (j, *at));
                    }
                }
            }
        }
        next.next = AtomicUsize::new(self.next.load(Ordering::Relaxed));
        next.counters = self.counters.clone();
        next
    }

    /// Tells every endpoint it has left (the pool is gone): their connections drain.
    pub fn retire(&self) {
        for ep in &self.endpoints {
            ep.removed.send_replace(true);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The endpoint for a datagram flow from `client` (UDP: no refusal to retry on).
    pub(crate) fn pick(&self, client: IpAddr) -> Option<Arc<Endpoint>> {
        let now = Instant::now();
        let i = *self.order(client, now).first()?;
        self.chose(client, i, now);
        Some(self.endpoints[i].clone())
    }

    /// The endpoints to try for a connection from `client`, in order, each once:
    /// the client's own while its affinity lasts, else the scheduler's choice,
    /// then the others in turn.
    fn order(&self, client: IpAddr, now: Instant) -> Vec<usize> {
        let n = self.endpoints.len();
        if n == 0 {
            return Vec::new();
        }
        let sticky = self.affinity.as_ref().and_then(|a| {
            let clients = a.clients.lock().unwrap_or_else(|e| e.into_inner());
            clients
                .get(&client)
                .filter(|(i, at)| *i < n && now.saturating_duration_since(*at) < a.timeout)
                .map(|(i, _)| *i)
        });
        let first = sticky.unwrap_or_else(|| match self.scheduler {
            Scheduler::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % n,
            Scheduler::LeastConnections => {
                let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
                (0..n)
                    .map(|k| (start + k) % n)
                    .min_by_key(|i| self.endpoints[*i].active.load(Ordering::Relaxed))
                    .unwrap_or(start)
            }
        });
        (0..n).map(|k| (first + k) % n).collect()
    }

    /// `client` is now on endpoint `i` (affinity renewed).
    fn chose(&self, client: IpAddr, i: usize, now: Instant) {
        let Some(a) = &self.affinity else { return };
        let mut clients = a.clients.lock().unwrap_or_else(|e| e.into_inner());
        if clients.len() >= MAX_AFFINITY_CLIENTS && !clients.contains_key(&client) {
            clients.retain(|_, (_, at)| now.saturating_duration_since(*at) < a.timeout);
            if clients.len() >= MAX_AFFINITY_CLIENTS {
                return;
            }
        }
        clients.insert(client, (i, now));
    }

    /// Connections open to each endpoint through this pool.
    pub fn active(&self) -> Vec<(SocketAddr, usize)> {
        self.endpoints
            .iter()
            .map(|e| (e.addr, e.active.load(Ordering::Relaxed)))
            .collect()
    }
}

/// A service port's pools, one per endpoint set it has.
#[derive(Clone, Debug, Default)]
pub struct Sets {
    pub cluster: Option<Arc<Pool>>,
    pub local: Option<Arc<Pool>>,
}

impl Sets {
    pub fn get(&self, set: EndpointSetId) -> Option<&Arc<Pool>> {
        match set {
            EndpointSetId::Cluster => self.cluster.as_ref(),
            EndpointSetId::Local => self.local.as_ref(),
        }
    }

    pub fn slot(&mut self, set: EndpointSetId) -> &mut Option<Arc<Pool>> {
        match set {
            EndpointSetId::Cluster => &mut self.cluster,
            EndpointSetId::Local => &mut self.local,
        }
    }
}

/// Which service port a captured TCP connection is for, by its original
/// destination, and that port's pools. The data plane replaces a pool when its
/// endpoints change: new connections use the new pool at once, open ones keep
/// theirs.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// Service IPs (cluster, external, load-balancer) with their port.
    pub vips: HashMap<SocketAddr, ServicePortName>,
    /// NodePorts, on whatever node address the capture accepted them.
    pub nodeports: HashMap<(IpFamily, u16), ServicePortName>,
    pub services: HashMap<(IpFamily, ServicePortName), Sets>,
}

impl RouteTable {
    /// The pool of `set` for a connection to `original`: a service IP first, then
    /// a NodePort (the order of the capture's own lookups).
    pub fn pool(&self, original: SocketAddr, set: EndpointSetId) -> Option<Arc<Pool>> {
        let family = IpFamily::of(&original.ip());
        let name = self
            .vips
            .get(&original)
            .or_else(|| self.nodeports.get(&(family, original.port())))?;
        self.services
            .get(&(family, name.clone()))?
            .get(set)
            .cloned()
    }
}

/// The route table, shared by the data plane (writer) and the listeners.
pub type Routes = Arc<RwLock<RouteTable>>;

/// What the proxy did for one service port (in one family), or for those past
/// [`MAX_PORT_SERIES`] together.
#[derive(Debug, Default)]
pub struct PortCounters {
    pub accepted: AtomicU64,
    pub active: AtomicU64,
    pub retried: AtomicU64,
    pub failed: AtomicU64,
    pub bytes_to_endpoints: AtomicU64,
    pub bytes_to_clients: AtomicU64,
    pub udp_flows: AtomicU64,
    pub udp_datagrams: AtomicU64,
}

/// Service ports counted apart at most (the metrics' cardinality bound); the
/// others are counted together, for as long as they exist, so every series stays
/// monotonic.
pub const MAX_PORT_SERIES: usize = 1000;

/// Per service port counters: each port's own while there is room, else the
/// shared rest.
#[derive(Debug, Default)]
pub struct PortBook {
    pub named: HashMap<(IpFamily, ServicePortName), Arc<PortCounters>>,
    pub rest: Arc<PortCounters>,
    /// Ports counted in `rest`.
    rest_ports: std::collections::HashSet<(IpFamily, ServicePortName)>,
}

/// What the engine has done: monotonic counts.
#[derive(Debug, Default)]
pub struct Stats {
    /// Per service port (see [`Stats::port`]).
    pub ports: Mutex<PortBook>,
    pub accepted: AtomicU64,
    pub active: AtomicU64,
    /// Connection attempts to an endpoint that failed (each followed by the next
    /// endpoint, if any).
    pub retried: AtomicU64,
    /// Client connections closed because no endpoint could be reached, or the
    /// frontend has none.
    pub failed: AtomicU64,
    pub bytes_to_endpoints: AtomicU64,
    pub bytes_to_clients: AtomicU64,
    /// Connections whose original destination no route names (refused).
    pub unrouted: AtomicU64,
    /// Connections closed because their endpoint left and the drain timeout passed.
    pub drained: AtomicU64,
    /// UDP flows opened (one upstream socket per client and service port).
    pub udp_flows: AtomicU64,
    pub udp_datagrams_to_endpoints: AtomicU64,
    pub udp_datagrams_to_clients: AtomicU64,
    /// Per family (IPv4, IPv6): the NodePort service ports served on loopback
    /// (upstream's `kubeproxy_nftables_localhost_nodeport_listeners`), set after each
    /// sync in the nftables mode's localhost scope.
    pub loopback_listeners: [AtomicU64; 2],
    /// Per family: listeners and sockets that could not be bound
    /// (`..._listener_creation_failures_total`).
    pub listener_failures: [AtomicU64; 2],
}

/// The index of `family` in [`Stats`]'s per-family figures.
pub fn family_index(family: IpFamily) -> usize {
    match family {
        IpFamily::V4 => 0,
        IpFamily::V6 => 1,
    }
}

impl Stats {
    /// The counters of `name` in `family`: its own while fewer than
    /// [`MAX_PORT_SERIES`] ports have their own, else the shared rest.
    pub fn port(&self, family: IpFamily, name: &ServicePortName) -> Arc<PortCounters> {
        let mut book = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        let key = (family, name.clone());
        if let Some(c) = book.named.get(&key) {
            return c.clone();
        }
        if book.rest_ports.contains(&key) || book.named.len() >= MAX_PORT_SERIES {
            book.rest_ports.insert(key);
            return book.rest.clone();
        }
        let c = Arc::new(PortCounters::default());
        book.named.insert(key, c.clone());
        c
    }

    /// `name` in `family` is gone: its own counters go (and free their room).
    pub fn forget(&self, family: IpFamily, name: &ServicePortName) {
        let mut book = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        let key = (family, name.clone());
        book.named.remove(&key);
        book.rest_ports.remove(&key);
    }
}

/// How the engine connects.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// How long an endpoint may take to accept before the next is tried.
    pub connect_timeout: Duration,
    /// How long a connection to an endpoint that left its pool goes on; zero: to
    /// its end.
    pub drain_timeout: Duration,
    /// Relay with `splice(2)` (see [`super::relay`]).
    pub zero_copy: bool,
}

/// Accepts connections on `listener` until it fails, forwarding each to the
/// endpoints of `set` by `routes`.
pub async fn serve_tcp(
    listener: TcpListener,
    set: EndpointSetId,
    routes: Routes,
    options: Options,
    stats: Arc<Stats>,
) {
    loop {
        match listener.accept().await {
            Ok((client, peer)) => {
                stats.accepted.fetch_add(1, Ordering::Relaxed);
                let (routes, stats) = (routes.clone(), stats.clone());
                tokio::spawn(
                    async move { forward(client, peer, set, &routes, options, &stats).await },
                );
            }
            Err(e) => {
                // Out of file descriptors, most likely: wait rather than spin.
                tracing::warn!(error = %e, "userspace proxy: accepting a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The frontend `client` connected to: the destination before the capture's
/// redirect (conntrack's original destination), else the listener's own address.
fn frontend(client: &TcpStream) -> Option<SocketAddr> {
    let sock = socket2::SockRef::from(client);
    let local = client.local_addr().ok()?;
    let original = if local.is_ipv4() {
        sock.original_dst_v4()
    } else {
        sock.original_dst_v6()
    };
    Some(original.ok().and_then(|a| a.as_socket()).unwrap_or(local))
}

/// Closes `client` with a reset: as an immediate refusal looks to it.
fn refuse(client: TcpStream) {
    let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
    drop(client);
}

async fn forward(
    mut client: TcpStream,
    peer: SocketAddr,
    set: EndpointSetId,
    routes: &Routes,
    options: Options,
    stats: &Stats,
) {
    let pool = frontend(&client).and_then(|f| {
        routes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .pool(f, set)
    });
    let Some(pool) = pool else {
        stats.failed.fetch_add(1, Ordering::Relaxed);
        stats.unrouted.fetch_add(1, Ordering::Relaxed);
        refuse(client);
        return;
    };
    let port = pool.counters.clone();
    port.accepted.fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    let mut upstream = None;
    for i in pool.order(peer.ip(), now) {
        let addr = pool.endpoints[i].addr;
        match tokio::time::timeout(options.connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                upstream = Some((i, s));
                break;
            }
            Ok(Err(e)) => {
                tracing::debug!(endpoint = %addr, error = %e, "userspace proxy: endpoint refused; trying the next");
                stats.retried.fetch_add(1, Ordering::Relaxed);
                port.retried.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                tracing::debug!(endpoint = %addr, "userspace proxy: endpoint did not accept in time; trying the next");
                stats.retried.fetch_add(1, Ordering::Relaxed);
                port.retried.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let Some((i, mut upstream)) = upstream else {
        stats.failed.fetch_add(1, Ordering::Relaxed);
        port.failed.fetch_add(1, Ordering::Relaxed);
        refuse(client);
        return;
    };
    pool.chose(peer.ip(), i, now);
    let endpoint = pool.endpoints[i].clone();
    drop(pool);
    endpoint.active.fetch_add(1, Ordering::Relaxed);
    stats.active.fetch_add(1, Ordering::Relaxed);
    port.active.fetch_add(1, Ordering::Relaxed);
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    // Each direction until its end of file, which is passed on as a shutdown of
    // the other side's writing: a half-closed connection keeps its other half.
    let copy = super::relay::relay(&mut client, &mut upstream, options.zero_copy);
    let mut removed = endpoint.removed.subscribe();
    let drain = async {
        if options.drain_timeout.is_zero() || removed.wait_for(|r| *r).await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(options.drain_timeout).await;
    };
    tokio::select! {
        copied = copy => match copied {
            Ok((up, down)) => {
                stats.bytes_to_endpoints.fetch_add(up, Ordering::Relaxed);
                stats.bytes_to_clients.fetch_add(down, Ordering::Relaxed);
                port.bytes_to_endpoints.fetch_add(up, Ordering::Relaxed);
                port.bytes_to_clients.fetch_add(down, Ordering::Relaxed);
            }
            Err(_) => {
                // One side aborted (a reset): the other is aborted too, as it would
                // see without a proxy in the path. A graceful close instead would
                // leave this node a TIME_WAIT socket per aborted connection, and at
                // thousands of connections a second the node runs out of ports to
                // the endpoint (measured: connects slowed from 0.7 to 16 ms).
                let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
                let _ = socket2::SockRef::from(&upstream).set_linger(Some(Duration::ZERO));
            }
        },
        () = drain => {
            tracing::debug!(endpoint = %endpoint.addr, client = %peer, "userspace proxy: endpoint removed; its connection closed after the drain timeout");
            stats.drained.fetch_add(1, Ordering::Relaxed);
            let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
            let _ = socket2::SockRef::from(&upstream).set_linger(Some(Duration::ZERO));
        }
    }
    endpoint.active.fetch_sub(1, Ordering::Relaxed);
    stats.active.fetch_sub(1, Ordering::Relaxed);
    port.active.fetch_sub(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn round_robin_then_the_others_in_turn_each_once() {
        let eps = vec![
            addr("10.0.0.1:80"),
            addr("10.0.0.2:80"),
            addr("10.0.0.3:80"),
        ];
        let p = Pool::new(eps, Scheduler::RoundRobin, None);
        let c: IpAddr = "192.0.2.1".parse().unwrap();
        let now = Instant::now();
        assert_eq!(p.order(c, now), [0, 1, 2]);
        assert_eq!(p.order(c, now), [1, 2, 0]);
        assert_eq!(p.order(c, now), [2, 0, 1]);
        assert_eq!(p.order(c, now), [0, 1, 2]);
        assert!(Pool::new(Vec::new(), Scheduler::RoundRobin, None)
            .order(c, now)
            .is_empty());
    }

    #[test]
    fn least_connections_prefers_the_idle_endpoint() {
        let eps = vec![addr("10.0.0.1:80"), addr("10.0.0.2:80")];
        let p = Pool::new(eps, Scheduler::LeastConnections, None);
        let c: IpAddr = "192.0.2.1".parse().unwrap();
        let now = Instant::now();
        p.endpoints[0].active.store(3, Ordering::Relaxed);
        for _ in 0..4 {
            assert_eq!(p.order(c, now)[0], 1);
        }
        p.endpoints[1].active.store(5, Ordering::Relaxed);
        assert_eq!(p.order(c, now)[0], 0);
    }

    #[test]
    fn affinity_sticks_while_renewed_and_expires() {
        let eps = vec![addr("10.0.0.1:80"), addr("10.0.0.2:80")];
        let p = Pool::new(eps, Scheduler::RoundRobin, Some(Duration::from_secs(10)));
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let t0 = Instant::now();
        let first = p.order(a, t0)[0];
        p.chose(a, first, t0);
        let other = p.order(b, t0)[0];
        p.chose(b, other, t0);
        assert_ne!(first, other);
        // Renewed by each connection: 9 s apart, three times.
        for k in 1..=3u64 {
            let t = t0 + Duration::from_secs(9 * k);
            assert_eq!(p.order(a, t)[0], first);
            p.chose(a, first, t);
        }
        // 10 s without a connection: chosen afresh.
        let t = t0 + Duration::from_secs(27 + 10);
        let orders: Vec<usize> = (0..2).map(|_| p.order(a, t)[0]).collect();
        assert!(orders.contains(&other), "{orders:?}");
    }
}
