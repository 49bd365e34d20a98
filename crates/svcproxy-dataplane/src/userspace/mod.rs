//! The userspace mode (`--proxy-mode userspace`): the proxy itself accepts every
//! connection to a service and opens its own to an endpoint.
//!
//! Entry point: [`UserspaceDataPlane`]. Capture is the nftables mode's own table,
//! translated from the same intent, with one difference: an endpoint set's chain
//! redirects to a socket of the proxy instead of DNATing to an endpoint (see
//! [`svcproxy_plan::nft::CapturePorts`]). So drops, rejects, the
//! loadBalancerSourceRanges firewall, the NodePort addresses and the short
//! circuits that choose the cluster set for the node's own pods and the host are
//! enforced by exactly the rules the nftables mode uses, and the proxy only
//! chooses among a set's endpoints.
//!
//! - TCP: two listeners per family (one per endpoint set) on the wildcard address,
//!   whatever the number of services. The connection's original destination
//!   (`SO_ORIGINAL_DST`) names the service port through the [`RouteTable`]
//!   ([`tcp`]).
//! - UDP: a socket per endpoint set of each UDP service port ([`udp`]), as the
//!   original userspace proxy had; conntrack cannot tell a userspace socket a
//!   datagram's original destination, but the port it was redirected to can.
//! - SCTP is not proxied (as upstream's userspace proxy): no rule captures it; this
//!   is logged once per service port.
//!
//! The proxy runs on a runtime of its own (one worker per CPU), started at the
//! first sync; `render`, `cleanup` and the other commands never bind a socket.

mod tcp;
mod udp;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use svcproxy_core::model::{IpFamily, Protocol, ServicePortName};
use svcproxy_plan::intent::{EndpointSetId, FrontendKey, ServiceIntent};
use svcproxy_plan::nft::CapturePorts;
use svcproxy_plan::{Intent, IntentDelta, ModeSemantics, PlanConfig, UserspaceConfig};
use tokio::net::TcpListener;

pub use tcp::{
    serve_tcp, Options, Pool, PortBook, PortCounters, RouteTable, Routes, Scheduler, Sets, Stats,
    MAX_PORT_SERIES,
};
pub use udp::{bind_wildcard, UdpFrontend};

use crate::backend::{ApplyReport, Backend, Comparison, DataPlane, NodeRequirements};
use crate::error::DataPlaneError;
use crate::nft::NftDataPlane;
use crate::sink::NftCommand;

/// The userspace mode's behaviour where modes differ: NodePorts answer on
/// 127.0.0.1 (the proxy connects from the node; no `route_localnet` needed), and
/// the service address space is guarded as in the nftables mode, whose table it
/// uses.
pub const SEMANTICS: ModeSemantics = ModeSemantics {
    localhost_nodeports: true,
    guard_service_ips: true,
    drop_invalid_forwarded: false,
};

/// The userspace mode in the registry.
pub const BACKEND: Backend = Backend {
    mode: "userspace",
    // Upstream's userspace proxy had no failure counters of its own.
    failure_counters: &[],
    counts_rules: false,
    semantics: SEMANTICS,
    new: |cfg| Box::new(UserspaceDataPlane::new(cfg)),
};

const SETS: [EndpointSetId; 2] = [EndpointSetId::Cluster, EndpointSetId::Local];

/// Where the capture rules send each set's connections.
struct Ports {
    tcp: HashMap<(IpFamily, EndpointSetId), u16>,
    udp: Mutex<HashMap<(IpFamily, ServicePortName, EndpointSetId), udp::UdpFrontend>>,
}

impl CapturePorts for Ports {
    fn port(&self, svc: &ServiceIntent, set: EndpointSetId) -> Option<u16> {
        match svc.protocol {
            Protocol::Tcp => self.tcp.get(&(svc.family, set)).copied(),
            Protocol::Udp => self
                .udp
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&(svc.family, svc.name.clone(), set))
                .map(|f| f.port),
            Protocol::Sctp => None,
        }
    }
}

/// The ports `svcproxy render` shows: the sockets' ports are only known once they
/// are bound, so each is shown as the first port of `--proxy-port-range` or 0.
struct RenderPorts(u16);

impl CapturePorts for RenderPorts {
    fn port(&self, svc: &ServiceIntent, _set: EndpointSetId) -> Option<u16> {
        (svc.protocol != Protocol::Sctp).then_some(self.0)
    }
}

/// The running proxy: its runtime, its sockets and what they route by.
struct Engine {
    runtime: Option<tokio::runtime::Runtime>,
    routes: Routes,
    ports: Arc<Ports>,
    /// The TCP listeners' tasks: aborting one closes its listener.
    listeners: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Never blocks, even when dropped on another runtime's thread.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Ports of `--proxy-port-range`, handed out in turn (0: the kernel chooses).
struct PortCursor {
    range: Option<(u16, u16)>,
    next: u16,
}

impl PortCursor {
    fn new(range: Option<(u16, u16)>) -> Self {
        PortCursor {
            range,
            next: range.map_or(0, |(lo, _)| lo),
        }
    }

    /// Binds with `bind` at the next free port of the range (each tried at most
    /// once), or at 0 without a range.
    fn bind<T>(&mut self, mut bind: impl FnMut(u16) -> std::io::Result<T>) -> std::io::Result<T> {
        let Some((lo, hi)) = self.range else {
            return bind(0);
        };
        let span = u32::from(hi - lo) + 1;
        let mut last = None;
        for _ in 0..span {
            let port = self.next;
            self.next = if self.next >= hi { lo } else { self.next + 1 };
            match bind(port) {
                Ok(t) => return Ok(t),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("empty port range")))
    }
}

/// The userspace mode's data plane: the capture table (through the nftables
/// mode's planner and writer) and the proxy it sends connections to.
pub struct UserspaceDataPlane {
    cfg: UserspaceConfig,
    families: Vec<IpFamily>,
    nft: NftDataPlane<NftCommand>,
    engine: Option<Engine>,
    stats: Arc<Stats>,
    cursor: PortCursor,
    /// The intent generation the routes were last brought to.
    generation: Option<u64>,
    /// A socket could not be bound: the next sync writes everything again.
    retry_full: bool,
    sctp_logged: HashSet<ServicePortName>,
}

impl UserspaceDataPlane {
    pub fn new(cfg: &PlanConfig) -> Self {
        let families = IpFamily::BOTH
            .into_iter()
            .filter(|f| cfg.family_enabled(*f))
            .collect();
        UserspaceDataPlane {
            cfg: cfg.userspace.clone(),
            families,
            nft: NftDataPlane::new(),
            engine: None,
            stats: Arc::new(Stats::default()),
            cursor: PortCursor::new(cfg.userspace.port_range),
            generation: None,
            retry_full: false,
            sctp_logged: HashSet::new(),
        }
    }

    fn options(&self) -> Options {
        Options {
            connect_timeout: self.cfg.connect_timeout,
            drain_timeout: self.cfg.drain_timeout,
        }
    }

    /// Starts the runtime and the TCP listeners, and switches the writer to a
    /// planner that captures to them.
    fn start(&mut self) -> Result<(), DataPlaneError> {
        if self.engine.is_some() {
            return Ok(());
        }
        let io_err = |what: &str, e: std::io::Error| DataPlaneError::Io {
            command: what.to_string(),
            source: e,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(
                std::thread::available_parallelism()
                    .map_or(1, |n| n.get())
                    .min(64),
            )
            .thread_name("svcproxy-userspace")
            .enable_all()
            .build()
            .map_err(|e| io_err("starting the userspace proxy's runtime", e))?;
        let routes = Routes::default();
        let stats = self.stats.clone();
        let mut tcp = HashMap::new();
        let mut listeners = Vec::new();
        for family in self.families.clone() {
            for set in SETS {
                let bound = self.cursor.bind(|port| listen_tcp(family, port));
                let listener = match bound {
                    Ok(l) => l,
                    Err(e) => {
                        // A family the host cannot serve (IPv6 disabled): its TCP
                        // services are not captured; the other family still is.
                        tracing::error!(%family, error = %e, "userspace proxy: cannot listen for TCP; this family's TCP services are not proxied");
                        continue;
                    }
                };
                let _guard = runtime.enter();
                let listener = TcpListener::from_std(listener)
                    .map_err(|e| io_err("registering a TCP listener", e))?;
                let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
                tracing::info!(%family, set = ?set, port, "userspace proxy listening for TCP");
                tcp.insert((family, set), port);
                listeners.push(runtime.spawn(serve_tcp(
                    listener,
                    set,
                    routes.clone(),
                    self.options(),
                    stats.clone(),
                )));
            }
        }
        let ports = Arc::new(Ports {
            tcp,
            udp: Mutex::new(HashMap::new()),
        });
        let capture: Arc<dyn CapturePorts> = ports.clone();
        self.nft = NftDataPlane::with_capture(NftCommand::default(), Some(capture));
        self.engine = Some(Engine {
            runtime: Some(runtime),
            routes,
            ports,
            listeners,
        });
        Ok(())
    }

    /// Brings the routes and UDP sockets to `intent`: from `delta`, or from the
    /// whole intent when `rebuild`.
    fn update_routes(&mut self, intent: &Intent, delta: &IntentDelta, rebuild: bool) {
        let Some(engine) = self.engine.as_ref() else {
            return;
        };
        let (routes, ports, stats) = (
            engine.routes.clone(),
            engine.ports.clone(),
            self.stats.clone(),
        );
        let handle = match engine.runtime.as_ref() {
            Some(rt) => rt.handle().clone(),
            None => return,
        };
        let mut table = routes.write().unwrap_or_else(|e| e.into_inner());
        let mut udp = ports.udp.lock().unwrap_or_else(|e| e.into_inner());
        for fam in intent.families() {
            let family = fam.family();
            let work: Vec<(ServicePortName, Option<Arc<ServiceIntent>>)> = if rebuild {
                let mut gone: HashSet<ServicePortName> = table
                    .services
                    .keys()
                    .filter(|(f, _)| *f == family)
                    .map(|(_, n)| n.clone())
                    .chain(
                        udp.keys()
                            .filter(|(f, _, _)| *f == family)
                            .map(|(_, n, _)| n.clone()),
                    )
                    .collect();
                let mut work: Vec<_> = fam
                    .services()
                    .iter()
                    .map(|(name, svc)| {
                        gone.remove(name);
                        (name.clone(), Some(svc.clone()))
                    })
                    .collect();
                work.extend(gone.into_iter().map(|n| (n, None)));
                work
            } else {
                delta
                    .family(family)
                    .services
                    .iter()
                    .map(|c| (c.name.clone(), c.after.clone()))
                    .collect()
            };
            for (name, svc) in work {
                match name.protocol {
                    Protocol::Tcp => {
                        update_tcp(&mut table, family, &name, svc.as_deref(), &self.cfg, &stats)
                    }
                    Protocol::Udp => {
                        let failed = update_udp(
                            &mut udp,
                            &handle,
                            &mut self.cursor,
                            family,
                            &name,
                            svc.as_deref(),
                            &self.cfg,
                            &stats,
                        );
                        self.retry_full |= failed;
                    }
                    Protocol::Sctp => {
                        if svc.is_some() && self.sctp_logged.insert(name.clone()) {
                            tracing::warn!(service = %name, "SCTP is not proxied in userspace mode (as upstream's userspace proxy); this service port is not captured");
                        } else if svc.is_none() {
                            self.sctp_logged.remove(&name);
                        }
                    }
                }
            }
            // TCP frontends: which service port a captured connection is for.
            if rebuild {
                table.vips.retain(|a, _| IpFamily::of(&a.ip()) != family);
                table.nodeports.retain(|(f, _), _| *f != family);
                for (svc, f) in fam.frontends() {
                    insert_frontend(&mut table, family, &f.key, &svc.name);
                }
            } else {
                for change in &delta.family(family).frontends {
                    remove_frontend(&mut table, family, &change.key);
                    if let Some(svc) = &change.after {
                        insert_frontend(&mut table, family, &change.key, &svc.name);
                    }
                }
            }
        }
    }
}

/// A TCP listener on the family's wildcard address at `port` (0: any).
fn listen_tcp(family: IpFamily, port: u16) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol as P, Socket, Type};
    let (domain, ip) = match family {
        IpFamily::V4 => (Domain::IPV4, IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        IpFamily::V6 => (Domain::IPV6, IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
    };
    let s = Socket::new(domain, Type::STREAM, Some(P::TCP))?;
    if family == IpFamily::V6 {
        s.set_only_v6(true)?;
    }
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&SocketAddr::new(ip, port).into())?;
    s.listen(4096)?;
    Ok(s.into())
}

fn affinity(svc: &ServiceIntent) -> Option<Duration> {
    svc.affinity_timeout
        .map(|t| Duration::from_secs(u64::from(t)))
}

/// The pool that follows `old` for `set` of `svc` (`None`: the set is gone).
fn next_pool(
    old: Option<&Pool>,
    svc: &ServiceIntent,
    set: EndpointSetId,
    cfg: &UserspaceConfig,
    stats: &Stats,
) -> Option<Pool> {
    let endpoints = svc.set(set)?;
    Some(match old {
        Some(old) => old.successor(endpoints, cfg.scheduler, affinity(svc)),
        None => Pool::new(endpoints, cfg.scheduler, affinity(svc))
            .counting(stats.port(svc.family, &svc.name)),
    })
}

fn update_tcp(
    table: &mut RouteTable,
    family: IpFamily,
    name: &ServicePortName,
    svc: Option<&ServiceIntent>,
    cfg: &UserspaceConfig,
    stats: &Stats,
) {
    let key = (family, name.clone());
    let Some(svc) = svc else {
        if let Some(sets) = table.services.remove(&key) {
            for pool in [sets.cluster, sets.local].into_iter().flatten() {
                pool.retire();
            }
        }
        stats.forget(family, name);
        return;
    };
    let sets = table.services.entry(key).or_default();
    for set in SETS {
        let slot = sets.slot(set);
        match next_pool(slot.as_deref(), svc, set, cfg, stats) {
            Some(pool) => *slot = Some(Arc::new(pool)),
            None => {
                if let Some(old) = slot.take() {
                    old.retire();
                }
            }
        }
    }
}

/// Returns whether a socket could not be bound.
#[allow(clippy::too_many_arguments)]
fn update_udp(
    udp: &mut HashMap<(IpFamily, ServicePortName, EndpointSetId), udp::UdpFrontend>,
    handle: &tokio::runtime::Handle,
    cursor: &mut PortCursor,
    family: IpFamily,
    name: &ServicePortName,
    svc: Option<&ServiceIntent>,
    cfg: &UserspaceConfig,
    stats: &Arc<Stats>,
) -> bool {
    let mut failed = false;
    for set in SETS {
        let key = (family, name.clone(), set);
        let current = udp.get(&key).map(|f| f.pool());
        match svc.and_then(|svc| next_pool(current.as_deref(), svc, set, cfg, stats)) {
            Some(pool) => match udp.get(&key) {
                Some(frontend) => frontend.set_pool(Arc::new(pool)),
                None => {
                    let started = cursor
                        .bind(|port| udp::bind_wildcard(family, port))
                        .and_then(|sock| {
                            udp::UdpFrontend::start(
                                handle,
                                family,
                                sock,
                                pool,
                                cfg.udp_timeout,
                                stats.clone(),
                            )
                        });
                    match started {
                        Ok(frontend) => {
                            udp.insert(key, frontend);
                        }
                        Err(e) => {
                            tracing::error!(service = %name, %family, error = %e, "userspace proxy: cannot bind a UDP socket; this service port is not proxied until the next full sync");
                            failed = true;
                        }
                    }
                }
            },
            None => {
                udp.remove(&key);
            }
        }
    }
    if svc.is_none() {
        stats.forget(family, name);
    }
    failed
}

fn insert_frontend(
    table: &mut RouteTable,
    family: IpFamily,
    key: &FrontendKey,
    name: &ServicePortName,
) {
    match *key {
        FrontendKey::Vip {
            ip,
            protocol: Protocol::Tcp,
            port,
        } => {
            table.vips.insert(SocketAddr::new(ip, port), name.clone());
        }
        FrontendKey::NodePort {
            protocol: Protocol::Tcp,
            port,
        } => {
            table.nodeports.insert((family, port), name.clone());
        }
        _ => {}
    }
}

fn remove_frontend(table: &mut RouteTable, family: IpFamily, key: &FrontendKey) {
    match *key {
        FrontendKey::Vip {
            ip,
            protocol: Protocol::Tcp,
            port,
        } => {
            table.vips.remove(&SocketAddr::new(ip, port));
        }
        FrontendKey::NodePort {
            protocol: Protocol::Tcp,
            port,
        } => {
            table.nodeports.remove(&(family, port));
        }
        _ => {}
    }
}

impl DataPlane for UserspaceDataPlane {
    fn mode(&self) -> &'static str {
        BACKEND.mode
    }

    fn sync(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        full: bool,
    ) -> Result<ApplyReport, DataPlaneError> {
        self.start()?;
        let rebuild = full || self.generation != Some(delta.from);
        self.generation = Some(intent.generation());
        self.update_routes(intent, delta, rebuild);
        let full = full || std::mem::take(&mut self.retry_full);
        self.nft.sync(intent, delta, full)
    }

    fn render(&self, intent: &Intent) -> String {
        if self.engine.is_some() {
            return self.nft.render(intent);
        }
        let port = self.cfg.port_range.map_or(0, |(lo, _)| lo);
        let capture: Arc<dyn CapturePorts> = Arc::new(RenderPorts(port));
        let script = svcproxy_plan::nft::render_full_with(intent, Some(capture));
        format!(
            "# userspace mode: each endpoint set's chain redirects to a socket of the proxy, whose\n\
             # port is known once it is bound; shown as {port} (the first of --proxy-port-range, or 0).\n{script}"
        )
    }

    fn cleanup(&mut self) -> Result<(), DataPlaneError> {
        self.nft.cleanup()
    }

    fn node_requirements(&self, _cfg: &PlanConfig) -> NodeRequirements {
        // Localhost NodePorts are redirected to the proxy on loopback itself: no
        // route_localnet.
        NodeRequirements::default()
    }

    fn drift(&mut self) -> Result<Option<String>, DataPlaneError> {
        self.nft.drift()
    }

    fn compare(&mut self, intent: &Intent) -> Result<Comparison, DataPlaneError> {
        self.nft.compare(intent)
    }

    fn proxy_stats(&self) -> Option<Arc<Stats>> {
        Some(self.stats.clone())
    }

    /// Stops accepting (the listeners close: new connections are refused), then
    /// waits for the open connections to end, at most `grace`; what is still open
    /// then is cut when the runtime stops.
    fn shutdown(&mut self, grace: Duration) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        for l in engine.listeners.drain(..) {
            l.abort();
        }
        let deadline = std::time::Instant::now() + grace;
        let active = || self.stats.active.load(std::sync::atomic::Ordering::Relaxed);
        let open = active();
        if open > 0 {
            tracing::info!(connections = open, grace = ?grace, "userspace proxy: no longer accepting; letting open connections finish");
        }
        while active() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let left = active();
        if left > 0 {
            tracing::warn!(
                connections = left,
                "userspace proxy: connections still open at the shutdown deadline are closed"
            );
        }
        self.engine = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_cursor_walks_the_range_once_and_wraps() {
        let mut c = PortCursor::new(Some((40000, 40002)));
        let mut taken = Vec::new();
        for _ in 0..3 {
            taken.push(
                c.bind(|p| {
                    if p == 40001 {
                        Err(std::io::Error::other("busy"))
                    } else {
                        Ok(p)
                    }
                })
                .unwrap(),
            );
        }
        assert_eq!(taken, [40000, 40002, 40000]);
        let mut all_busy = PortCursor::new(Some((40000, 40001)));
        let mut tried = Vec::new();
        assert!(all_busy
            .bind(|p| -> std::io::Result<u16> {
                tried.push(p);
                Err(std::io::Error::other("busy"))
            })
            .is_err());
        assert_eq!(tried, [40000, 40001]);
        assert_eq!(PortCursor::new(None).bind(Ok).unwrap(), 0);
    }
}
