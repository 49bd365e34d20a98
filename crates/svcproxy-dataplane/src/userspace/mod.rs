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
//!
//! The same data plane, [`UserspaceDataPlane::localhost_nodeports`], is the
//! nftables mode when it serves NodePorts on loopback (`--nodeport-localhost`):
//! the set chains DNAT as usual and redirect only connections to 127.0.0.0/8 or
//! ::1 to this proxy, which listens on loopback alone and holds only the service
//! ports that have a NodePort. The kernel cannot DNAT those connections out of the
//! node without `route_localnet` (and the martian packets it lets in,
//! CVE-2020-8558); the proxy connects from the node's own address instead.

mod metrics;
mod options;
mod relay;
mod tcp;
mod udp;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use svcproxy_core::model::{IpFamily, Protocol, ServicePortName};
use svcproxy_plan::intent::{EndpointSetId, FamilyIntent, FrontendKey, ServiceIntent};
use svcproxy_plan::nft::CapturePorts;
use svcproxy_plan::{Intent, IntentDelta, ModeSemantics, PlanConfig};
use tokio::net::TcpListener;

pub use metrics::UserspaceCollector;
pub use options::{parse_port_range, Scheduler, UserspaceConfig};
pub use tcp::{
    serve_tcp, Options, Pool, PortBook, PortCounters, RouteTable, Routes, Sets, Stats,
    MAX_PORT_SERIES,
};
pub use udp::{bind_wildcard, UdpFrontend};

use crate::error::DataPlaneError;
use crate::kernel::conntrack::ConntrackFilter;
use crate::seam::{
    ApplyReport, Comparison, ConfigSection, DataPlane, KernelObjects, LocalhostDefault,
    ModeDefaults, ModeInfo, NodePortDefault, NodeRequirements,
};

/// The userspace mode's behaviour where modes differ: NodePorts answer on
/// 127.0.0.1 (the proxy connects from the node; no `route_localnet` needed), and
/// the service address space is guarded as in the nftables mode, whose table it
/// uses.
pub const SEMANTICS: ModeSemantics = ModeSemantics {
    localhost_nodeports: svcproxy_plan::LocalhostNodePorts::Proxy,
    guard_service_ips: true,
    drop_invalid_forwarded: false,
    schedulers: false,
};

/// The `--proxy-mode` name.
pub const MODE: &str = "userspace";

/// The flag group of the userspace proxy's own flags (`--userspace-*`,
/// `--proxy-port-range`, `--udp-timeout`).
pub const FLAGS: &str = "userspace";

/// The userspace mode in the registry.
pub const INFO: ModeInfo = ModeInfo {
    mode: MODE,
    aliases: &[],
    gate: None,
    defaults: ModeDefaults {
        // It captures with the nftables mode's table.
        config_section: ConfigSection::Nftables,
        // The userspace proxy listened on every address for NodePorts.
        nodeport_addresses: NodePortDefault::AllLocal,
        localhost_nodeports: LocalhostDefault::IptablesSetting,
    },
    flag_groups: &[FLAGS],
    // Upstream's userspace proxy had no failure counters of its own.
    failure_counters: &[],
    counts_rules: false,
    large_cluster_endpoints: None,
    objects: KernelObjects::NftablesTables,
    semantics: SEMANTICS,
};

/// The table the proxy captures with, made by whoever composes the mode (the
/// registry: the nftables mode's tables): each endpoint set's chain redirecting
/// to the proxy's socket for it once `capture` names them, and DNATing as usual
/// before (`None`). The same configuration the proxy was made for.
pub type CaptureTable = fn(&PlanConfig, Option<Arc<dyn CapturePorts>>) -> Box<dyn DataPlane>;

const SETS: [EndpointSetId; 2] = [EndpointSetId::Cluster, EndpointSetId::Local];

/// What the proxy serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    /// Every TCP and UDP frontend (the userspace mode).
    All,
    /// NodePorts on loopback, in these families (the nftables mode's localhost
    /// NodePorts); UDP ones too when `udp`
    /// ([`PlanConfig::localhost_nodeports_serve_udp`]; the rules reject the others).
    LoopbackNodePorts { v4: bool, v6: bool, udp: bool },
}

impl Scope {
    /// Whether the proxy holds `svc` (an SCTP one only to say it is not proxied).
    fn serves(self, svc: &ServiceIntent) -> bool {
        match self {
            Scope::All => true,
            Scope::LoopbackNodePorts { v4, v6, udp } => {
                let family = match svc.family {
                    IpFamily::V4 => v4,
                    IpFamily::V6 => v6,
                };
                family
                    && (svc.protocol == Protocol::Tcp || (udp && svc.protocol == Protocol::Udp))
                    && svc
                        .frontends
                        .iter()
                        .any(|f| matches!(f.key, FrontendKey::NodePort { .. }))
            }
        }
    }

    /// Whether connections to `key` can reach the proxy (a service IP cannot be
    /// loopback: only NodePorts reach the localhost proxy).
    fn routes(self, key: &FrontendKey) -> bool {
        self == Scope::All || matches!(key, FrontendKey::NodePort { .. })
    }

    fn families(self, enabled: &[IpFamily]) -> Vec<IpFamily> {
        enabled
            .iter()
            .copied()
            .filter(|f| match (self, f) {
                (Scope::All, _) => true,
                (Scope::LoopbackNodePorts { v4, .. }, IpFamily::V4) => v4,
                (Scope::LoopbackNodePorts { v6, .. }, IpFamily::V6) => v6,
            })
            .collect()
    }

    /// The address the proxy's sockets bind: every address for the userspace mode
    /// (a redirect of a forwarded packet goes to the address of the interface it
    /// came in on), loopback alone for localhost NodePorts.
    fn bind_ip(self, family: IpFamily) -> IpAddr {
        match (self, family) {
            (Scope::All, IpFamily::V4) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            (Scope::All, IpFamily::V6) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            (Scope::LoopbackNodePorts { .. }, IpFamily::V4) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            (Scope::LoopbackNodePorts { .. }, IpFamily::V6) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        }
    }
}

/// Where the capture rules send each set's connections.
struct Ports {
    scope: Scope,
    tcp: HashMap<(IpFamily, EndpointSetId), u16>,
    udp: Mutex<HashMap<(IpFamily, ServicePortName, EndpointSetId), udp::UdpFrontend>>,
}

impl CapturePorts for Ports {
    fn loopback_only(&self) -> bool {
        self.scope != Scope::All
    }

    fn port(&self, svc: &ServiceIntent, set: EndpointSetId) -> Option<u16> {
        if !self.scope.serves(svc) {
            return None;
        }
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
struct RenderPorts(Scope, u16);

impl CapturePorts for RenderPorts {
    fn loopback_only(&self) -> bool {
        self.0 != Scope::All
    }

    fn port(&self, svc: &ServiceIntent, _set: EndpointSetId) -> Option<u16> {
        (svc.protocol != Protocol::Sctp && self.0.serves(svc)).then_some(self.1)
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
    scope: Scope,
    families: Vec<IpFamily>,
    /// The capture's table ([`CaptureTable`]).
    nft: Box<dyn DataPlane>,
    /// How to make it.
    table: CaptureTable,
    engine: Option<Engine>,
    stats: Arc<Stats>,
    cursor: PortCursor,
    /// The intent generation the routes were last brought to.
    generation: Option<u64>,
    /// A socket could not be bound: the next sync writes everything again.
    retry_full: bool,
    sctp_logged: HashSet<ServicePortName>,
    /// The conntrack entries of UDP sockets closed since the last successful sync,
    /// handed to the driver's cleanup with that sync's report.
    stale_flows: Vec<ConntrackFilter>,
    /// The configuration it was made for (the metrics that depend on it).
    plan_cfg: PlanConfig,
}

impl UserspaceDataPlane {
    pub fn new(cfg: &PlanConfig, options: UserspaceConfig, table: CaptureTable) -> Self {
        Self::with_scope(cfg, options, Scope::All, table)
    }

    /// The nftables mode serving NodePorts on loopback through the proxy (see the
    /// module's doc), in the families where `cfg` serves them.
    pub fn localhost_nodeports(
        cfg: &PlanConfig,
        options: UserspaceConfig,
        table: CaptureTable,
    ) -> Self {
        Self::with_scope(
            cfg,
            options,
            Scope::LoopbackNodePorts {
                v4: cfg.serves_localhost_nodeports(IpFamily::V4),
                v6: cfg.serves_localhost_nodeports(IpFamily::V6),
                udp: cfg.localhost_nodeports_serve_udp(),
            },
            table,
        )
    }

    fn with_scope(
        cfg: &PlanConfig,
        options: UserspaceConfig,
        scope: Scope,
        table: CaptureTable,
    ) -> Self {
        let enabled: Vec<IpFamily> = IpFamily::BOTH
            .into_iter()
            .filter(|f| cfg.family_enabled(*f))
            .collect();
        UserspaceDataPlane {
            cursor: PortCursor::new(options.port_range),
            cfg: options,
            scope,
            families: scope.families(&enabled),
            nft: table(cfg, None),
            table,
            engine: None,
            stats: Arc::new(Stats::default()),
            generation: None,
            retry_full: false,
            sctp_logged: HashSet::new(),
            stale_flows: Vec::new(),
            plan_cfg: cfg.clone(),
        }
    }

    fn options(&self) -> Options {
        Options {
            connect_timeout: self.cfg.connect_timeout,
            drain_timeout: self.cfg.drain_timeout,
            zero_copy: self.cfg.zero_copy,
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
        raise_open_files_limit();
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
                let ip = self.scope.bind_ip(family);
                let bound = self.cursor.bind(|port| listen_tcp(ip, port));
                let listener = match bound {
                    Ok(l) => l,
                    Err(e) => {
                        // A family the host cannot serve (IPv6 disabled): its TCP
                        // services are not captured; the other family still is.
                        tracing::error!(%family, error = %e, "userspace proxy: cannot listen for TCP; this family's TCP services are not proxied");
                        self.stats.listener_failures[tcp::family_index(family)]
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
            scope: self.scope,
            tcp,
            udp: Mutex::new(HashMap::new()),
        });
        let capture: Arc<dyn CapturePorts> = ports.clone();
        self.nft = (self.table)(&self.plan_cfg, Some(capture));
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
    /// The TCP frontends of `fam`: which service port a captured connection is for.
    fn update_frontends(
        &self,
        table: &mut RouteTable,
        fam: &FamilyIntent,
        delta: &IntentDelta,
        rebuild: bool,
    ) {
        let family = fam.family();
        if rebuild {
            table.vips.retain(|a, _| IpFamily::of(&a.ip()) != family);
            table.nodeports.retain(|(f, _), _| *f != family);
            for (svc, f) in fam.frontends() {
                if self.scope.routes(&f.key) {
                    insert_frontend(table, family, &f.key, &svc.name);
                }
            }
        } else {
            for change in &delta.family(family).frontends {
                remove_frontend(table, family, &change.key);
                if let Some(svc) = &change.after {
                    if self.scope.routes(&change.key) {
                        insert_frontend(table, family, &change.key, &svc.name);
                    }
                }
            }
        }
    }

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
                let held: HashSet<ServicePortName> = table
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
                rebuild_work(fam, held)
            } else {
                delta
                    .family(family)
                    .services
                    .iter()
                    .map(|c| (c.name.clone(), c.after.clone()))
                    .collect()
            };
            for (name, svc) in work {
                // A service port the proxy does not serve is one it does not hold.
                let svc = svc.filter(|s| self.scope.serves(s));
                match name.protocol {
                    Protocol::Tcp => {
                        update_tcp(&mut table, family, &name, svc.as_deref(), &self.cfg, &stats)
                    }
                    Protocol::Udp => {
                        let failed = update_udp(
                            &mut udp,
                            &handle,
                            &mut self.cursor,
                            self.scope.bind_ip(family),
                            &name,
                            svc.as_deref(),
                            &self.cfg,
                            &stats,
                            &mut self.stale_flows,
                        );
                        self.retry_full |= failed;
                    }
                    Protocol::Sctp if self.scope != Scope::All => {}
                    Protocol::Sctp => {
                        if svc.is_some() && self.sctp_logged.insert(name.clone()) {
                            tracing::warn!(service = %name, "SCTP is not proxied in userspace mode (as upstream's userspace proxy); this service port is not captured");
                        } else if svc.is_none() {
                            self.sctp_logged.remove(&name);
                        }
                    }
                }
            }
            self.update_frontends(&mut table, fam, delta, rebuild);
            if self.scope != Scope::All {
                // Every frontend of this scope is a NodePort on loopback: its TCP
                // routes and its UDP service ports are what it listens for.
                let udp_ports: HashSet<&ServicePortName> = udp
                    .keys()
                    .filter(|(f, _, _)| *f == family)
                    .map(|(_, n, _)| n)
                    .collect();
                let tcp_ports = table.nodeports.keys().filter(|(f, _)| *f == family).count();
                stats.loopback_listeners[tcp::family_index(family)].store(
                    (tcp_ports + udp_ports.len()) as u64,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        }
    }
}

/// A rebuild's work for one family: every service port of `fam`, and those
/// `held` now that it no longer has (gone).
#[allow(clippy::type_complexity)]
fn rebuild_work(
    fam: &FamilyIntent,
    mut held: HashSet<ServicePortName>,
) -> Vec<(ServicePortName, Option<Arc<ServiceIntent>>)> {
    let mut work: Vec<_> = fam
        .services()
        .iter()
        .map(|(name, svc)| {
            held.remove(name);
            (name.clone(), Some(svc.clone()))
        })
        .collect();
    work.extend(held.into_iter().map(|n| (n, None)));
    work
}

/// Raises the soft limit on open files to the hard one: each proxied TCP
/// connection holds two sockets and, while relaying with splice, two pipes (six
/// descriptors), and systemd's default soft limit is 1,024. Go raises it at start
/// for every program (kube-proxy included); a failure is logged, and connections
/// past the limit are refused or relayed without splice.
fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some() && limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                tracing::info!(from = ?limit.current, to = ?limit.maximum, "userspace proxy: open files limit raised")
            }
            Err(e) => {
                tracing::warn!(limit = ?limit.current, error = %e, "userspace proxy: cannot raise the open files limit")
            }
        }
    }
}

/// A TCP listener on `ip` at `port` (0: any).
fn listen_tcp(ip: IpAddr, port: u16) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol as P, Socket, Type};
    let domain = match ip {
        IpAddr::V4(_) => Domain::IPV4,
        IpAddr::V6(_) => Domain::IPV6,
    };
    let s = Socket::new(domain, Type::STREAM, Some(P::TCP))?;
    if ip.is_ipv6() {
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
    bind_ip: IpAddr,
    name: &ServicePortName,
    svc: Option<&ServiceIntent>,
    cfg: &UserspaceConfig,
    stats: &Arc<Stats>,
    stale_flows: &mut Vec<ConntrackFilter>,
) -> bool {
    let family = IpFamily::of(&bind_ip);
    let mut failed = false;
    for set in SETS {
        let key = (family, name.clone(), set);
        let current = udp.get(&key).map(|f| f.pool());
        let next = svc
            .and_then(|svc| next_pool(current.as_deref(), svc, set, cfg, stats).map(|p| (svc, p)));
        match next {
            Some((svc, pool)) => match udp.get_mut(&key) {
                Some(frontend) => {
                    frontend.set_pool(Arc::new(pool));
                    frontend.dports = redirected_ports(svc);
                }
                None => {
                    let started = cursor
                        .bind(|port| udp::bind(SocketAddr::new(bind_ip, port)))
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
                        Ok(mut frontend) => {
                            frontend.dports = redirected_ports(svc);
                            udp.insert(key, frontend);
                        }
                        Err(e) => {
                            tracing::error!(service = %name, %family, error = %e, "userspace proxy: cannot bind a UDP socket; this service port is not proxied until the next full sync");
                            stats.listener_failures[tcp::family_index(family)]
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            failed = true;
                        }
                    }
                }
            },
            None => {
                if let Some(closed) = udp.remove(&key) {
                    stale_flows.extend(closed.flow_filters(family));
                }
            }
        }
    }
    if svc.is_none() {
        stats.forget(family, name);
    }
    failed
}

/// The destination ports of `svc`'s frontends: what its capture rules redirect.
fn redirected_ports(svc: &ServiceIntent) -> Vec<u16> {
    let mut ports: Vec<u16> = svc
        .frontends
        .iter()
        .map(|f| match f.key {
            FrontendKey::Vip { port, .. } | FrontendKey::NodePort { port, .. } => port,
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
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
        match self.scope {
            Scope::All => MODE,
            // The nftables mode's, whose table this is.
            Scope::LoopbackNodePorts { .. } => self.nft.mode(),
        }
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
        let mut report = self.nft.sync(intent, delta, full)?;
        // Only now do the rules no longer redirect to the closed sockets.
        report.stale_flows = std::mem::take(&mut self.stale_flows);
        Ok(report)
    }

    fn render(&self, intent: &Intent) -> String {
        if self.engine.is_some() {
            return self.nft.render(intent);
        }
        let port = self.cfg.port_range.map_or(0, |(lo, _)| lo);
        let capture: Arc<dyn CapturePorts> = Arc::new(RenderPorts(self.scope, port));
        let script = (self.table)(&self.plan_cfg, Some(capture)).render(intent);
        let what = match self.scope {
            Scope::All => "userspace mode: each endpoint set's chain redirects",
            Scope::LoopbackNodePorts { .. } => {
                "nftables mode with localhost NodePorts: a NodePort's endpoint set chains redirect connections to loopback"
            }
        };
        format!(
            "# {what} to a socket of the proxy, whose\n\
             # port is known once it is bound; shown as {port} (the first of --proxy-port-range, or 0).\n{script}"
        )
    }

    fn cleanup(&mut self) -> Result<(), DataPlaneError> {
        self.nft.cleanup()
    }

    fn node_requirements(&self, cfg: &PlanConfig) -> NodeRequirements {
        // Localhost NodePorts are redirected to the proxy on loopback itself: the
        // configuration asks for no route_localnet.
        self.nft.node_requirements(cfg)
    }

    fn drift(&mut self) -> Result<Option<String>, DataPlaneError> {
        self.nft.drift()
    }

    /// Against the plan with the capture (each set's redirect, whatever its port:
    /// a plan made apart from the running proxy cannot know its sockets' ports).
    fn compare(&mut self, intent: &Intent) -> Result<Comparison, DataPlaneError> {
        if self.engine.is_some() {
            return self.nft.compare(intent);
        }
        let port = self.cfg.port_range.map_or(0, |(lo, _)| lo);
        let capture: Arc<dyn CapturePorts> = Arc::new(RenderPorts(self.scope, port));
        (self.table)(&self.plan_cfg, Some(capture)).compare(intent)
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        let mut all: Vec<Box<dyn prometheus::core::Collector>> =
            vec![Box::new(UserspaceCollector::new(self.stats.clone()))];
        if let Scope::LoopbackNodePorts { v4, v6, .. } = self.scope {
            all.push(Box::new(metrics::LocalhostNodePortCollector::new(
                self.stats.clone(),
                [v4, v6],
            )));
            // The table's own: the reject counters of NodePorts on loopback.
            all.extend(self.nft.collectors());
        }
        all
    }

    /// Stops accepting (the listeners close: new connections are refused), then
    /// waits for the open connections to end, at most
    /// `--userspace-shutdown-timeout`; what is still open then is cut when the
    /// runtime stops.
    fn shutdown(&mut self) {
        let grace = self.cfg.shutdown_timeout;
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
