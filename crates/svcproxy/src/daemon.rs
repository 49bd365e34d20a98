//! Running the proxy: a source, the state, the sync loop ([`crate::runner`]), a
//! sync target ([`svcproxy_sync::Target`]), and the HTTP servers around them.
//!
//! Entry points: [`run`] (the daemon, `--once`, and the `snapshot`/`render`/`explain`
//! tools, which share everything but the target), and [`cleanup`].
//! The data plane comes from the registry (`Settings::proxy_mode`); nothing here
//! knows which modes exist. Sources hand
//! updates to the runner over a channel; the runner owns the state and the target, so
//! no lock is needed around them. Health and metrics are shared with the HTTP servers.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use svcproxy_core::model::IpFamily;
use svcproxy_core::objects::SourceUpdate;
use svcproxy_core::snapshot::SnapshotTallies;
use svcproxy_core::state::{ClusterState, SnapshotUpdate, StateConfig};
use svcproxy_dataplane::Backend;
use svcproxy_plan::intent::{nodeport_destinations, NodePortDestinations};
use svcproxy_plan::{NodePortAddresses, PlanConfig};
use svcproxy_sync::print::{ExplainPrinter, RenderPrinter, SnapshotPrinter};
use svcproxy_sync::Driver;
use tokio::sync::{mpsc, watch};

use crate::config::{self, Settings};
use crate::owner::{HandOver, Ownership, Role};
use crate::runner::{self, Event, RunnerConfig, Syncer};
use svcproxy_http::health::ProxyHealth;
use svcproxy_http::metrics::Metrics;
use svcproxy_http::service_health::{Listen, ServiceHealthServers};
use svcproxy_sources::kube::{self as kube_source, KubeSourceConfig};
use svcproxy_sources::manifests::ManifestDir;
use svcproxy_sync::{Checked, DnsOnly, SyncDone, Target};

/// What each sync does with the snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Program this node's nftables (the proxy).
    Kernel,
    /// Print the snapshot (`svcproxy snapshot`); with `watch`, again after every sync
    /// that changed it.
    Snapshot { json: bool, watch: bool },
    /// Print the full nftables script a first sync would apply (`svcproxy render`).
    Render,
    /// Follow one connection through the rules a first sync would apply
    /// (`svcproxy explain`).
    Explain {
        packet: svcproxy_plan::explain::Packet,
        json: bool,
        /// Also compare the kernel's rules (this network namespace's) with the plan.
        live: bool,
    },
    /// Serve the cluster DNS only (`svcproxy dns`), on `--dns-bind-address`.
    Dns,
}

/// Which HTTP servers to run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Servers {
    pub healthz: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
    /// healthCheckNodePort servers (only when programming the kernel).
    pub health_check_node_ports: bool,
}

/// Whether the plan needs this host's own addresses: `--nodeport-addresses` CIDRs
/// select NodePort addresses among them.
fn needs_host_addresses(cfg: &PlanConfig) -> bool {
    matches!(
        cfg.nodeport_addresses,
        NodePortAddresses::Cidrs(_) | NodePortAddresses::PrimaryAnd(_)
    )
}

/// Feeds this host's addresses to the state: read once now (before the first sync),
/// then, unless `once`, again whenever the kernel announces a change, from a thread
/// that sends each new list to the runner. An address added to or removed from an
/// interface thus moves NodePorts and healthCheckNodePort servers at the next sync.
fn watch_host_addresses(
    state: &mut ClusterState,
    tx: &mpsc::Sender<Event>,
    once: bool,
) -> anyhow::Result<()> {
    let changes = if once {
        None
    } else {
        // Subscribed before the first read, so no change in between is missed.
        Some(
            svcproxy_dataplane::AddressChanges::subscribe()
                .context("subscribing to this host's address changes (rtnetlink)")?,
        )
    };
    let mut current = svcproxy_dataplane::host_addresses()
        .context("listing this host's addresses to resolve --nodeport-addresses")?;
    tracing::info!(addresses = ?current, "host addresses for --nodeport-addresses");
    state.apply(SourceUpdate::HostAddresses(current.clone()));
    let Some(mut changes) = changes else {
        return Ok(());
    };
    // Weak: the runner ends when every source is gone, and this is no source of
    // objects; it must not keep the channel open.
    let tx = tx.downgrade();
    std::thread::Builder::new()
        .name("host-addresses".into())
        .spawn(move || loop {
            if let Err(e) = changes.wait() {
                tracing::error!(error = %e, "watching this host's addresses failed; NodePort addresses no longer follow them");
                return;
            }
            match svcproxy_dataplane::host_addresses() {
                Ok(now) if now != current => {
                    tracing::info!(addresses = ?now, "host addresses changed");
                    current = now;
                    // Blocking send: backpressure, never loss. Gone: the runner is.
                    let update = Event::Updates(vec![SourceUpdate::HostAddresses(current.clone())]);
                    if tx.upgrade().is_none_or(|tx| tx.blocking_send(update).is_err()) {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list this host's addresses; retrying at the next change");
                }
            }
        })
        .context("starting the host-address watcher")?;
    Ok(())
}

/// The sources' sender and the runner's receiver, with [`forward_events`] between
/// them (spawned on the current runtime).
fn event_channel(
    health: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
) -> (mpsc::Sender<Event>, mpsc::Receiver<Event>) {
    let (tx, from_sources) = mpsc::channel::<Event>(64);
    let (to_runner, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(forward_events(from_sources, to_runner, health, metrics));
    (tx, rx)
}

/// Passes the sources' events on to the runner, noting each update's arrival first
/// (the health timeout and the last-queued metric count from when an update reaches
/// svcproxy, as upstream's: the runner takes events only between syncs, and a sync
/// that hangs must not hide the updates waiting behind it). Ends when every source
/// is gone, closing the runner's channel in turn.
async fn forward_events(
    mut from: mpsc::Receiver<Event>,
    to: mpsc::Sender<Event>,
    health: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
) {
    while let Some(ev) = from.recv().await {
        if matches!(&ev, Event::Updates(u) if !u.is_empty()) {
            health.queued_update();
            metrics.queued(SystemTime::now());
        }
        if to.send(ev).await.is_err() {
            return;
        }
    }
}

struct ProxySyncer<T> {
    state: ClusterState,
    target: T,
    health: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
    /// The servers, and the plan configuration that says where they listen.
    health_checks: Option<(ServiceHealthServers, PlanConfig)>,
    /// The per-sync metric and health-check figures, kept from one snapshot to the
    /// next.
    tallies: SnapshotTallies,
    node_eligible: bool,
    /// The cluster DNS's catalog, fed the same updates as the state.
    dns: Option<Arc<RwLock<svcproxy_dns::Catalog>>>,
    /// Update events applied so far (what a sync now covers, in `forward_events`'
    /// numbering).
    received: u64,
    /// Whether this process owns the node (programming the kernel only).
    owner: Option<OwnerGate>,
}

/// A kernel target's claim on the node ([`crate::owner`]).
struct OwnerGate {
    ownership: Ownership,
    /// The mode it programs.
    backend: &'static Backend,
    /// The modes' flags (where another mode's objects are, for their cleanup).
    mode_options: svcproxy_dataplane::ModeOptions,
    /// The first sync as owner has succeeded (and the predecessor was told).
    synced: bool,
    /// Whether the first sync may adopt sealed rules was decided (once).
    adoption_decided: bool,
}

impl OwnerGate {
    fn new(
        ownership: Ownership,
        backend: &'static Backend,
        mode_options: svcproxy_dataplane::ModeOptions,
    ) -> Self {
        OwnerGate {
            ownership,
            backend,
            mode_options,
            synced: false,
            adoption_decided: false,
        }
    }

    /// The owner's PID while this process is a standby.
    fn standby_for(&self) -> Option<u32> {
        match self.ownership.current() {
            Role::Standby { owner_pid, .. } => Some(owner_pid),
            Role::Owner { .. } => None,
        }
    }
}

impl<T: Target> ProxySyncer<T> {
    fn update_node_eligibility(&mut self) {
        let eligible = self
            .state
            .own_node()
            .is_none_or(|n| !n.deleting && !n.to_be_deleted);
        if eligible != self.node_eligible {
            if eligible {
                tracing::info!("this Node is eligible for load-balancer traffic again");
            } else {
                tracing::warn!("this Node is being deleted or drained by the cluster autoscaler: /healthz reports it not eligible");
            }
            self.node_eligible = eligible;
        }
        self.health.set_node_eligible(eligible);
    }

    fn after_sync(&mut self, update: &SnapshotUpdate, done: &SyncDone) {
        let now = SystemTime::now();
        self.health.updated_through(self.received);
        self.metrics
            .observe_sync(done.full, done.duration, &done.families);
        self.metrics
            .observe_network_programming(&update.trigger_times, now);
        self.tallies.update([&update.v4, &update.v6]);
        for family in IpFamily::BOTH {
            let (internal, external) = self.tallies.no_local_endpoints(family);
            self.metrics
                .set_no_local_endpoints(family, internal, external);
        }
        self.metrics
            .set_invalid_objects(self.state.invalid_counts());
        if let Some(ct) = &done.conntrack {
            self.metrics.conntrack_cleanup(ct);
        }
        self.metrics.set_rule_counts(&done.rules);
        if let Some(n) = done.lost_claims {
            self.metrics.set_lost_claims(n);
        }
        if let Some((servers, cfg)) = &mut self.health_checks {
            servers.set_listen(health_check_listen(cfg, update));
            let wanted: BTreeMap<_, _> = self
                .tallies
                .health_checks()
                .into_iter()
                .map(|(svc, hc)| (svc, (hc.node_port, hc.local_endpoints)))
                .collect();
            servers.sync(&wanted);
            self.metrics
                .set_health_check_bind_failures(servers.bind_failures());
        }
    }
}

/// Brings the cluster DNS's catalog, if it runs, up to date with the state's
/// model (the state logged the objects it could not read, for both).
fn follow_dns(dns: Option<&Arc<RwLock<svcproxy_dns::Catalog>>>, state: &mut ClusterState) {
    if let Some(dns) = dns {
        dns.write().unwrap_or_else(|e| e.into_inner()).follow(state);
    }
}

impl<T: Target> Syncer for ProxySyncer<T> {
    fn apply(&mut self, updates: Vec<SourceUpdate>) {
        // One call per update event, as `forward_events` numbers them.
        self.received += 1;
        for u in updates {
            self.state.apply(u);
        }
        follow_dns(self.dns.as_ref(), &mut self.state);
        self.update_node_eligibility();
    }

    fn check_drift(&mut self) -> bool {
        // A standby has written nothing, and must not: the owner checks its own.
        if self
            .owner
            .as_ref()
            .is_some_and(|g| g.standby_for().is_some())
        {
            return false;
        }
        let Some(drift) = self.target.drift() else {
            return false;
        };
        tracing::warn!(%drift, "the kernel lost svcproxy's rules behind its back: rewriting everything now; /healthz says 503 until then");
        self.health.drift_detected();
        self.metrics.drift_detected();
        true
    }

    fn queued(&mut self) {
        // Arrival itself was noted by `forward_events`.
        let (services, endpoints) = self.state.pending_changes();
        self.metrics.set_pending_changes(services, endpoints);
    }

    fn sync(&mut self, full: bool) -> anyhow::Result<()> {
        // The runner syncs once every source has listed: the catalog is complete.
        if let Some(dns) = &self.dns {
            let mut catalog = dns.write().unwrap_or_else(|e| e.into_inner());
            if !catalog.is_ready() {
                catalog.set_ready();
                // Until now every query was answered SERVFAIL (never a false NXDOMAIN).
                tracing::info!("cluster DNS answering: every source has listed");
            }
        }
        // A warm standby keeps its state (applied as updates arrive) and writes
        // nothing: "synced" as far as its own state goes.
        if let Some(owner_pid) = self.owner.as_ref().and_then(OwnerGate::standby_for) {
            self.health.set_standby(Some(owner_pid));
            self.health.updated_through(self.received);
            return Ok(());
        }
        if let Some(gate) = self
            .owner
            .as_mut()
            .filter(|g| !g.synced && !g.adoption_decided)
        {
            gate.adoption_decided = true;
            // Kernel settings the mode needs: written by the owner only, before its
            // first sync (a standby writes nothing).
            self.target.prepare_node();
            if matches!(
                gate.ownership.current(),
                Role::Owner {
                    handed_over: true,
                    ..
                }
            ) {
                self.target.allow_adoption();
            }
        }
        // The snapshot is always complete; `changed` only lets the planner skip work.
        // After a failed apply the data plane re-plans everything regardless.
        let update = self.state.snapshot();
        self.metrics
            .add_changes(update.service_changes, update.endpoint_changes);
        self.metrics.set_pending_changes(0, 0);
        match self.target.sync(&self.state, &update, full) {
            Ok(done) => {
                self.after_sync(&update, &done);
                if let Some(gate) = self.owner.as_mut().filter(|g| !g.synced) {
                    gate.synced = true;
                    gate.ownership.synced();
                    self.health.set_standby(None);
                    // Another kind of mode ran here before (a mode switch): its rules
                    // go, now that this mode's are in (as kube-proxy at start).
                    for (mode, e) in
                        svcproxy_dataplane::cleanup_other_modes(gate.backend, &gate.mode_options)
                    {
                        tracing::warn!(mode, error = %e, "cannot remove the objects the {mode} mode left");
                    }
                }
                // After a burst (the initial list, a file of thousands of objects,
                // a full rewrite) the allocator holds what it freed: give it back.
                if done.full
                    || update.service_changes + update.endpoint_changes >= TRIM_AFTER_CHANGES
                {
                    drop(update);
                    crate::alloc::release_free_memory();
                }
                Ok(())
            }
            Err(e) => {
                self.metrics.sync_failed(e.is_partial());
                Err(e.into())
            }
        }
    }
}

/// A sync that applied at least this many Service and EndpointSlice changes is
/// followed by [`crate::alloc::release_free_memory`].
const TRIM_AFTER_CHANGES: usize = 1000;

/// Where Services, EndpointSlices and Nodes come from.
enum Source {
    Manifests(ManifestDir),
    Api(KubeSourceConfig),
}

fn source(settings: &Settings) -> anyhow::Result<Source> {
    match &settings.manifests {
        Some(_) if settings.kubeconfig.is_some() || settings.master.is_some() => {
            bail!("--manifests and --kubeconfig/--master are alternatives: pass one")
        }
        Some(dir) => Ok(Source::Manifests(ManifestDir::new(dir.clone()))),
        None => Ok(Source::Api(KubeSourceConfig {
            node_name: settings.node_name.clone(),
            service_proxy_name: settings.service_proxy_name.clone(),
            kubeconfig: settings.kubeconfig.clone(),
            master: settings.master.clone(),
            client_connection: settings.client_connection.clone(),
            dns: settings.dns_bind.is_some(),
            // A central server places clients by their Pods.
            dns_pods: settings.dns_bind.is_some() && settings.dns.clients_node.is_none(),
        })),
    }
}

/// How a run ended well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    Clean,
    /// A one-shot tool (`snapshot`, `render`, `explain`) ran, and its input had
    /// errors: objects or fields rejected or ignored, or input it could not read.
    InputErrors,
}

/// Runs until SIGTERM/SIGINT (rules stay in place for a successor), or syncs once
/// (`--once`, and the one-shot tools); says whether a one-shot tool's input had
/// errors.
pub fn run(settings: Settings, output: Output, servers: Servers) -> anyhow::Result<Finished> {
    let errors = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let one_shot = matches!(
        output,
        Output::Snapshot { watch: false, .. } | Output::Explain { .. } | Output::Render
    );
    run_target(settings, output, servers, errors.clone())?;
    Ok(
        if one_shot && errors.load(std::sync::atomic::Ordering::Relaxed) {
            Finished::InputErrors
        } else {
            Finished::Clean
        },
    )
}

fn run_target(
    settings: Settings,
    output: Output,
    servers: Servers,
    input_errors: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match output {
        Output::Kernel => run_kernel(&rt, settings, servers),
        Output::Snapshot { json, watch } => {
            let target = Checked {
                inner: SnapshotPrinter {
                    json,
                    compact: watch,
                    last: None,
                },
                input_errors: input_errors.clone(),
            };
            rt.block_on(serve(Serving::printer(settings, servers, target, !watch)))
        }
        Output::Explain { packet, json, live } => {
            let backend = settings.proxy_mode;
            let cfg = settings.plan.clone();
            let live = live.then(|| (backend.new)(&cfg, &settings.mode_options));
            let target = Checked {
                inner: ExplainPrinter {
                    cfg: cfg.clone(),
                    packet,
                    json,
                    live,
                },
                input_errors: input_errors.clone(),
            };
            rt.block_on(serve(Serving {
                plan: Some(cfg),
                ..Serving::printer(settings, servers, target, true)
            }))
        }
        Output::Dns => rt.block_on(serve(Serving::printer(settings, servers, DnsOnly, false))),
        Output::Render => {
            let backend = settings.proxy_mode;
            let plan_cfg = settings.plan.clone();
            let plane = (backend.new)(&plan_cfg, &settings.mode_options);
            let target = Checked {
                inner: RenderPrinter {
                    cfg: plan_cfg.clone(),
                    plane,
                },
                input_errors: input_errors.clone(),
            };
            rt.block_on(serve(Serving {
                plan: Some(plan_cfg),
                backend: Some(backend),
                ..Serving::printer(settings, servers, target, true)
            }))
        }
    }
}

/// The kernel's data plane: the mode's preflight and node preparation, then the
/// daemon (or, with `--init-only`, the preparation alone).
fn run_kernel(
    rt: &tokio::runtime::Runtime,
    settings: Settings,
    servers: Servers,
) -> anyhow::Result<()> {
    set_oom_score_adj(settings.oom_score_adj);
    // A look at the node for kube-proxy's rules (a dozen iptables-save
    // runs, about 0.1 s): beside the start rather than before it.
    let _leftovers = (!settings.init_only && settings.service_proxy_name.is_none())
        .then(|| JoinOnDrop(Some(std::thread::spawn(warn_about_kube_proxy_leftovers))));
    let backend = settings.proxy_mode;
    let plan_cfg = settings.plan.clone();
    let mut plane = Driver::new(
        plan_cfg.clone(),
        (backend.new)(&plan_cfg, &settings.mode_options),
    );
    if !settings.init_only {
        // A node that cannot run the mode at all: refused now, naming why,
        // rather than a sync retried for ever.
        plane
            .preflight()
            .with_context(|| format!("the {} mode cannot run on this node", backend.mode))?;
    }
    let needs = plane.node_requirements();
    if settings.init_only {
        prepare_only(&settings, &needs, backend);
        return Ok(());
    }
    for module in &needs.modules {
        if !std::path::Path::new("/sys/module").join(module).exists() {
            tracing::warn!(
                module,
                mode = backend.mode,
                "a kernel module this mode needs is not loaded"
            );
        }
    }
    let target = plane.with_conntrack_sysctls(settings.conntrack.clone());
    rt.block_on(serve(Serving {
        once: settings.once,
        plan: Some(plan_cfg),
        backend: Some(backend),
        claim: Some(backend.mode),
        ..Serving::printer(settings, servers, target, false)
    }))
}

/// kube-proxy's `--init-only`: what needs full privileges (the mode's sysctls, the
/// conntrack ones), then exit; the proxy itself then runs with NET_ADMIN only (no
/// rule is written here).
fn prepare_only(
    settings: &Settings,
    needs: &svcproxy_dataplane::NodeRequirements,
    backend: &'static Backend,
) {
    let prepared = svcproxy_dataplane::prepare_node(&needs.sysctls);
    let conntrack = svcproxy_dataplane::apply_conntrack_sysctls(&settings.conntrack.clone());
    let warnings: Vec<_> = prepared
        .warnings
        .iter()
        .chain(&conntrack.warnings)
        .collect();
    tracing::info!(
        changed = ?prepared.changed.iter().chain(&conntrack.changed).collect::<Vec<_>>(),
        warnings = warnings.len(),
        mode = backend.mode,
        "--init-only: node prepared; exiting"
    );
}

/// Writes the process's OOM score adjustment (kube-proxy's `oomScoreAdj`): a failure
/// (no CAP_SYS_RESOURCE for a negative value, no procfs) is logged, never fatal, as
/// upstream.
fn set_oom_score_adj(value: i32) {
    let path = "/proc/self/oom_score_adj";
    match std::fs::read_to_string(path) {
        Ok(current) if current.trim() == value.to_string() => {}
        _ => match std::fs::write(path, value.to_string()) {
            Ok(()) => tracing::debug!(value, "OOM score adjustment set"),
            // As upstream (at its verbosity 2): lowering it needs CAP_SYS_RESOURCE,
            // which a container without privileges lacks.
            Err(e) => tracing::info!(value, error = %e, "cannot set the OOM score adjustment"),
        },
    }
}

/// A fixed-address HTTP server's listener: bound at start-up, or (without
/// `bindAddressHardFail`, as upstream) bound later by a retry every 5 seconds after a
/// failure that is logged, or bound once this process owns the node (a warm
/// standby's metrics server: the owner's holds the port meanwhile).
enum Listener {
    Bound(tokio::net::TcpListener),
    Retrying(SocketAddr, &'static str, bool),
    WhenOwner(SocketAddr, &'static str, watch::Receiver<Role>),
}

async fn listener(
    addr: SocketAddr,
    what: &'static str,
    hard_fail: bool,
    shared: bool,
) -> anyhow::Result<Listener> {
    match svcproxy_http::bind(addr, what, shared).await {
        Ok(l) => Ok(Listener::Bound(l)),
        Err(e) if hard_fail => Err(e.context("bindAddressHardFail is set")),
        Err(e) => {
            tracing::error!(
                "{e:#}; retrying every 5s (set --bind-address-hard-fail to exit instead)"
            );
            Ok(Listener::Retrying(addr, what, shared))
        }
    }
}

impl Listener {
    async fn get(self) -> tokio::net::TcpListener {
        let (addr, what, shared) = match self {
            Listener::Bound(l) => return l,
            Listener::Retrying(addr, what, shared) => (addr, what, shared),
            Listener::WhenOwner(addr, what, mut role) => {
                // Closed: the process is stopping; the caller's stop wins the race.
                if role.wait_for(Role::is_owner).await.is_err() {
                    std::future::pending::<()>().await;
                }
                match svcproxy_http::bind(addr, what, false).await {
                    Ok(l) => return l,
                    // The old owner may hold it for a moment longer.
                    Err(e) => tracing::debug!("{e:#}; retrying every 5s"),
                }
                (addr, what, false)
            }
        };
        let mut attempts = 1u32;
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            attempts += 1;
            match svcproxy_http::bind(addr, what, shared).await {
                Ok(l) => {
                    tracing::info!(%addr, attempts, "{what}: listening now");
                    return l;
                }
                Err(e) => tracing::debug!(attempts, "{e:#}"),
            }
        }
    }
}

/// Resolves when the `--config` file's content differs from `initial` (checked every
/// second: a plain read follows ConfigMap volumes' symlink swaps, which a watch on the
/// file's inode misses). kube-proxy exits when its config file changes, so that the
/// DaemonSet restarts it with the new configuration; svcproxy does the same.
async fn config_file_changed(path: std::path::PathBuf, initial: Option<Vec<u8>>) -> anyhow::Error {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A file missing for a moment (mid-swap) is not a change; new content is.
        if let Ok(now) = std::fs::read(&path) {
            if Some(&now) != initial.as_ref() {
                return anyhow::anyhow!(
                    "the content of the config file {} changed; exiting so that svcproxy is \
                     restarted with it (as kube-proxy)",
                    path.display()
                );
            }
        }
    }
}

/// Where healthCheckNodePort servers listen: on the NodePort addresses of each
/// family, as upstream (its servers listen on the addresses `--nodeport-addresses`
/// selects, everywhere when it selects all), recomputed after every sync so they
/// follow the Node's primary IPs and the host's addresses.
fn health_check_listen(cfg: &PlanConfig, update: &SnapshotUpdate) -> Listen {
    let mut ips = Vec::new();
    let mut every_family = true;
    for family in [IpFamily::V4, IpFamily::V6] {
        if !cfg.family_enabled(family) {
            every_family = false;
            continue;
        }
        match nodeport_destinations(family, cfg, update.family(family)) {
            NodePortDestinations::AllLocal => ips.push(match family {
                IpFamily::V4 => IpAddr::from(std::net::Ipv4Addr::UNSPECIFIED),
                IpFamily::V6 => IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED),
            }),
            NodePortDestinations::Ips(v) => {
                every_family = false;
                ips.extend(v);
            }
        }
    }
    if every_family {
        Listen::Everywhere
    } else {
        Listen::ips(ips)
    }
}

/// What one run serves: the settings and servers, where each sync's snapshot goes,
/// and what comes with that target.
struct Serving<T> {
    settings: Settings,
    servers: Servers,
    target: T,
    /// Sync (or print) once and end: `--once` and the one-shot tools.
    once: bool,
    /// The plan's configuration, for the targets that apply or render it (the
    /// kernel, `render`, `explain`): where NodePorts and healthCheckNodePort servers
    /// listen.
    plan: Option<PlanConfig>,
    /// The mode whose metrics are served (the kernel, `render`).
    backend: Option<&'static Backend>,
    /// Programs the node in this mode: only while owning it (`crate::owner`).
    claim: Option<&'static str>,
}

impl<T: Target> Serving<T> {
    /// A tool that prints what each sync's snapshot shows, programming nothing.
    fn printer(settings: Settings, servers: Servers, target: T, once: bool) -> Self {
        Serving {
            settings,
            servers,
            target,
            once,
            plan: None,
            backend: None,
            claim: None,
        }
    }
}

async fn serve<T: Target>(what: Serving<T>) -> anyhow::Result<()> {
    let Serving {
        settings,
        servers,
        target,
        once,
        plan: plan_cfg,
        backend,
        claim,
    } = what;
    // First of all: a SIGTERM from here on stops the process in order.
    let stop_signal = shutdown_signal();
    let ownership = claim_node(claim, once).await?;
    let role = ownership.as_ref().map(Ownership::role);
    let (healthz, metrics_listener) = bind_http(&settings, &servers, role.as_ref()).await?;
    // Read now, so that a change between start-up and the first check is seen.
    let config_watch = match (&settings.config_file, once) {
        (Some(path), false) => Some((path.clone(), std::fs::read(path).ok())),
        _ => None,
    };
    // As upstream: unhealthy when an update waits longer than twice the sync period.
    let health = ProxyHealth::new(settings.sync_period.saturating_mul(2));
    let metrics = metrics_for(backend, &settings, &target);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut running = Running {
        tasks: spawn_http(healthz, metrics_listener, &health, &metrics, &stop_rx),
        source: None,
        _manifest_watch: None,
    };

    let mut state = new_state(&settings, &target);
    let mut runner_cfg = RunnerConfig::new(settings.min_sync_period, settings.sync_period);
    let (tx, rx) = event_channel(health.clone(), metrics.clone());
    if plan_cfg.as_ref().is_some_and(needs_host_addresses) || target.wants_host_addresses() {
        watch_host_addresses(&mut state, &tx, once)?;
    }
    let dns = match settings.dns_bind {
        Some(addr) => {
            let (catalog, task) = start_dns(&settings, addr, &metrics, &stop_rx)?;
            running.tasks.push(task);
            Some(catalog)
        }
        None => None,
    };
    if let Some(role) = role.as_ref().filter(|r| !r.borrow().is_owner()) {
        tokio::spawn(announce_take_over(role.clone(), tx.downgrade()));
    }
    let started = start_source(
        &settings,
        &servers,
        once,
        tx,
        &mut state,
        dns.as_ref(),
        &metrics,
    )
    .await?;
    running.source = started.task;
    running._manifest_watch = started.watch;
    if !started.initial_lists.is_empty() {
        runner_cfg.initial_sources = started.initial_lists;
    }
    let mut syncer = ProxySyncer {
        health_checks: health_check_servers(plan_cfg, &servers, &health, &metrics),
        state,
        target,
        health,
        metrics,
        tallies: SnapshotTallies::default(),
        node_eligible: true,
        dns,
        received: 0,
        owner: ownership.zip(backend).map(|(ownership, backend)| {
            OwnerGate::new(ownership, backend, settings.mode_options.clone())
        }),
    };
    syncer.update_node_eligibility();
    // A one-shot tool (`snapshot`, `render`, `explain`, `--once`) has nothing to
    // announce: it prints, or syncs, and ends.
    if once {
        tracing::debug!(node = %settings.node_name, "svcproxy started");
    } else {
        tracing::info!(node = %settings.node_name, "svcproxy started");
    }
    let stopped_by = StopWhen {
        signal: stop_signal,
        config_watch,
    };
    let result = run_until_stopped(&mut syncer, runner_cfg, rx, once, stopped_by).await;
    stop_all(&mut syncer, once, &stop_tx, running).await;
    result
}

/// The process's metrics: kube-proxy's for the mode, the configuration, and the
/// data plane's own.
fn metrics_for<T: Target>(
    backend: Option<&'static Backend>,
    settings: &Settings,
    target: &T,
) -> Arc<Metrics> {
    let metrics = match backend {
        Some(b) => Metrics::for_backend(b),
        None => Metrics::new(),
    };
    metrics.set_configz(&config::effective::configz_json(settings));
    metrics.register_data_plane(target.collectors());
    metrics
}

/// The cluster state as this process keeps it: for the proxy's snapshots, the
/// cluster DNS, or both.
fn new_state<T: Target>(settings: &Settings, target: &T) -> ClusterState {
    ClusterState::new(StateConfig {
        node_name: settings.node_name.clone(),
        service_proxy_name: settings.service_proxy_name.clone(),
        ignore_external_ips: !settings.feature_gates.service_external_ips(),
        dns: settings.dns_bind.is_some(),
        without_snapshots: !target.uses_snapshots(),
    })
}

/// Stops in order: the node handed over (or the lock given up), the data plane
/// (which lets its own connections finish), then the servers.
async fn stop_all<T: Target>(
    syncer: &mut ProxySyncer<T>,
    once: bool,
    stop_tx: &watch::Sender<bool>,
    running: Running,
) {
    hand_over(syncer, once).await;
    // A data plane forwarding connections itself lets them finish first (the
    // health and metrics servers still answer meanwhile).
    tokio::task::block_in_place(|| syncer.target.shutdown());
    let _ = stop_tx.send(true);
    if let Some((servers, _)) = &mut syncer.health_checks {
        servers.shutdown();
    }
    running.stop().await;
}

/// The servers of the services' healthCheckNodePorts, when the kernel is
/// programmed (`plan_cfg`) and they are asked for, with the plan configuration that
/// says where they listen.
fn health_check_servers(
    plan_cfg: Option<PlanConfig>,
    servers: &Servers,
    health: &Arc<ProxyHealth>,
    metrics: &Arc<Metrics>,
) -> Option<(ServiceHealthServers, PlanConfig)> {
    let cfg = plan_cfg.filter(|_| servers.health_check_node_ports)?;
    // Everywhere until the first sync says where.
    let listen =
        ServiceHealthServers::new(Listen::Everywhere, health.clone(), Some(metrics.clone()));
    Some((listen, cfg))
}

/// What ends the sync loop besides its own end: a stop signal, or a change of the
/// configuration file (`Some((path, its content at start))`), which kube-proxy
/// answers by exiting to be restarted.
struct StopWhen<F> {
    signal: F,
    config_watch: Option<(std::path::PathBuf, Option<Vec<u8>>)>,
}

/// Runs the sync loop until it ends (`once`), a stop signal, or a change of the
/// configuration file (an error, as upstream: the process exits to be restarted).
async fn run_until_stopped<T: Target>(
    syncer: &mut ProxySyncer<T>,
    runner_cfg: RunnerConfig,
    rx: mpsc::Receiver<Event>,
    once: bool,
    stop: StopWhen<impl std::future::Future<Output = ()>>,
) -> anyhow::Result<()> {
    let config_changed = async move {
        match stop.config_watch {
            Some((path, initial)) => config_file_changed(path, initial).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = runner::run(runner_cfg, &mut *syncer, rx, once) => r,
        _ = stop.signal => {
            if syncer.target.leaves_rules() {
                tracing::info!("shutting down; the rules stay in place");
            } else {
                tracing::info!("shutting down");
            }
            Ok(())
        }
        e = config_changed => Err(e),
    }
}

/// The cluster DNS's catalog, shared with its server.
type SharedCatalog = Arc<RwLock<svcproxy_dns::Catalog>>;

/// A server's task: its result once stopped.
type ServerTask = tokio::task::JoinHandle<anyhow::Result<()>>;

/// What runs beside the sync loop until the process stops.
struct Running {
    /// The HTTP servers' tasks and the DNS server's (each ends at the stop signal).
    tasks: Vec<ServerTask>,
    /// The Kubernetes API source.
    source: Option<tokio::task::JoinHandle<()>>,
    /// The manifests directory's watch (stopped when dropped).
    _manifest_watch: Option<svcproxy_sources::manifests::WatchHandle>,
}

impl Running {
    /// Stops the source and lets in-flight HTTP answers finish, briefly.
    async fn stop(self) {
        if let Some(t) = self.source {
            t.abort();
        }
        for t in self.tasks {
            match tokio::time::timeout(Duration::from_secs(2), t).await {
                Ok(Ok(Err(e))) => tracing::warn!("HTTP server: {e:#}"),
                Ok(_) => {}
                Err(_) => tracing::warn!("an HTTP server did not stop within 2s"),
            }
        }
    }
}

/// Resolves once `stop` says so.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Takes the node, or stands by ([`crate::owner`]), when this run programs the
/// kernel (`claim` names the mode); a one-shot sync beside another owner is refused.
async fn claim_node(claim: Option<&'static str>, once: bool) -> anyhow::Result<Option<Ownership>> {
    let Some(mode) = claim else {
        return Ok(None);
    };
    let ownership = Ownership::claim(mode).await;
    let role = ownership.role().borrow().clone();
    if let (
        true,
        Role::Standby {
            owner_pid,
            owner_mode,
        },
    ) = (once, &role)
    {
        bail!(
            "another svcproxy (PID {owner_pid}, {owner_mode} mode) programs this \
             node's rules: --once would fight it; stop it first"
        );
    }
    Ok(Some(ownership))
}

/// Binds the health and metrics listeners first: with bindAddressHardFail an
/// address in use is a start-up error, before anything else runs; otherwise it is
/// logged and retried. /healthz and /livez are shared with a standby (or an owner)
/// on the same node; the metrics of a standby wait until it owns the node.
async fn bind_http(
    settings: &Settings,
    servers: &Servers,
    role: Option<&watch::Receiver<Role>>,
) -> anyhow::Result<(Option<Listener>, Option<Listener>)> {
    let hard_fail = settings.bind_address_hard_fail;
    let healthz = match servers.healthz {
        Some(addr) => Some(listener(addr, "--healthz-bind-address", hard_fail, true).await?),
        None => None,
    };
    let standby = role.filter(|r| !r.borrow().is_owner());
    let metrics = match (servers.metrics, standby) {
        (Some(addr), Some(role)) => Some(Listener::WhenOwner(
            addr,
            "--metrics-bind-address",
            role.clone(),
        )),
        (Some(addr), None) => {
            Some(listener(addr, "--metrics-bind-address", hard_fail, false).await?)
        }
        (None, _) => None,
    };
    Ok((healthz, metrics))
}

/// The health and metrics servers, each on its own task until `stop`.
fn spawn_http(
    healthz: Option<Listener>,
    metrics_listener: Option<Listener>,
    health: &Arc<ProxyHealth>,
    metrics: &Arc<Metrics>,
    stop: &watch::Receiver<bool>,
) -> Vec<ServerTask> {
    let mut tasks = Vec::new();
    if let Some(l) = healthz {
        let (health, metrics, stop) = (health.clone(), metrics.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let l = tokio::select! {
                l = l.get() => l,
                _ = stopped(stop.clone()) => return Ok(()),
            };
            svcproxy_http::health::serve(l, health, Some(metrics), stopped(stop)).await
        }));
    }
    if let Some(l) = metrics_listener {
        let (metrics, stop) = (metrics.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let l = tokio::select! {
                l = l.get() => l,
                _ = stopped(stop.clone()) => return Ok(()),
            };
            svcproxy_http::metrics::serve(l, metrics, stopped(stop)).await
        }));
    }
    tasks
}

/// The cluster DNS (`--dns-bind-address`): its catalog, fed beside the state, and
/// the task that stops its server at `stop`.
fn start_dns(
    settings: &Settings,
    addr: SocketAddr,
    metrics: &Arc<Metrics>,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<(SharedCatalog, ServerTask)> {
    let catalog = svcproxy_dns::Catalog::new(&settings.dns)?;
    let catalog = Arc::new(RwLock::new(catalog));
    let options = svcproxy_dns::server::Options {
        upstreams: match &settings.dns_upstreams {
            Some(given) => svcproxy_dns::server::Upstreams {
                configured: given.clone(),
                resolv_conf: String::new(),
            },
            None => svcproxy_dns::server::Upstreams {
                configured: Vec::new(),
                resolv_conf: std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
            },
        },
        rate_limit: settings.dns_rate_limit,
        udp_workers: 0,
    };
    // On a thread and runtime of its own: queries never wait behind a sync.
    let server = svcproxy_dns::server::Dedicated::start(catalog.clone(), addr, &options)
        .with_context(|| format!("binding the DNS server (--dns-bind-address {addr})"))?;
    metrics.register_dns(server.counters.clone());
    let (bound, upstreams) = (server.addr, server.upstreams.clone());
    tracing::info!(address = %bound, zone = %settings.dns.zone, ?upstreams, rate_limit = ?settings.dns_rate_limit, "cluster DNS listening (UDP and TCP)");
    match (&settings.dns_upstreams, upstreams.is_empty()) {
        (Some(given), true) if given.is_empty() => {
            tracing::info!("cluster DNS: --dns-upstream none: names outside the cluster domain are refused");
        }
        (_, true) => tracing::warn!("cluster DNS: no upstream resolver (--dns-upstream, /etc/resolv.conf): names outside the cluster domain are refused"),
        _ => {}
    }
    let stop = stop.clone();
    let task = tokio::spawn(async move {
        stopped(stop).await;
        tokio::task::spawn_blocking(move || server.stop())
            .await
            .context("stopping the DNS server")?
            .context("stopping the DNS server")
    });
    Ok((catalog, task))
}

/// A started source.
struct StartedSource {
    /// The API source's task.
    task: Option<tokio::task::JoinHandle<()>>,
    /// The manifests directory's watch.
    watch: Option<svcproxy_sources::manifests::WatchHandle>,
    /// The lists the first sync waits for (the API source's watches).
    initial_lists: Vec<&'static str>,
}

/// Starts the source of Services, EndpointSlices and Nodes: a manifests directory
/// is read here (its initial list applied to `state`, when the target keeps one,
/// before the first sync) and then watched; the API source lists and watches on a
/// task of its own.
async fn start_source(
    settings: &Settings,
    servers: &Servers,
    once: bool,
    tx: mpsc::Sender<Event>,
    state: &mut ClusterState,
    dns: Option<&SharedCatalog>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<StartedSource> {
    let mut started = StartedSource {
        task: None,
        watch: None,
        initial_lists: Vec::new(),
    };
    match source(settings)? {
        Source::Manifests(mut dir) => {
            // Each object converted as soon as it is read (see `rescan_into`): a
            // cold start holds the state and one document, not every object.
            let scan = dir
                .rescan_into(&mut |update| state.apply(update))
                .with_context(|| format!("reading manifests from {}", dir.root().display()))?;
            // Its problems were logged by the scan (once each).
            if let Some(problems) = scan.input_problems {
                state.apply(problems);
            }
            follow_dns(dns, state);
            if !once {
                let period = settings.manifests_rescan_period;
                started.watch = Some(svcproxy_sources::manifests::watch(
                    dir,
                    period,
                    move |updates| {
                        // Blocking send from the watcher thread: backpressure, never loss.
                        let _ = tx.blocking_send(Event::Updates(updates));
                    },
                )?);
            }
        }
        Source::Api(cfg) => {
            let client = kube_source::client_with_metrics(&cfg, metrics.rest_client()).await?;
            started.initial_lists = kube_source::WATCHES.to_vec();
            if cfg.dns_pods {
                started.initial_lists.push(kube_source::POD_WATCH);
            }
            if servers.health_check_node_ports {
                // The daemon announces itself on its Node, as kube-proxy does.
                tokio::spawn(kube_source::record_startup_event(
                    client.clone(),
                    cfg.node_name.clone(),
                ));
            }
            started.task = Some(tokio::spawn(kube_source::run(client, cfg, tx)));
        }
    }
    Ok(started)
}

/// The run is over: an owner seals what its last sync wrote and hands the lock to
/// a standby, waiting for the standby's first sync (this process goes on forwarding
/// meanwhile, which the userspace mode needs).
async fn hand_over<T: Target>(syncer: &mut ProxySyncer<T>, once: bool) {
    let Some(gate) = &syncer.owner else {
        return;
    };
    let was_owner = gate.ownership.current().is_owner();
    if was_owner && !once {
        // What the last sync wrote, sealed: a successor whose first sync would
        // write the same takes it as it is.
        tokio::task::block_in_place(|| syncer.target.seal());
    }
    match gate.ownership.hand_over(HAND_OVER_WAIT).await {
        HandOver::Synced => tracing::info!("handed over: the successor's first sync is in"),
        HandOver::TimedOut => {
            tracing::warn!(wait = ?HAND_OVER_WAIT, "handed over, but the successor's first sync did not come within the wait")
        }
        HandOver::NoSuccessor if was_owner && !once => {
            tracing::debug!("no standby to hand over to")
        }
        HandOver::NoSuccessor => {}
    }
}

/// The longest a stopping owner waits for its successor's first sync (within
/// Kubernetes' default 30 s termination grace period).
const HAND_OVER_WAIT: Duration = Duration::from_secs(20);

/// Tells the runner when this standby becomes the owner: its first real sync is due
/// at once.
async fn announce_take_over(mut role: watch::Receiver<Role>, tx: mpsc::WeakSender<Event>) {
    if role.wait_for(Role::is_owner).await.is_err() {
        return;
    }
    tracing::info!("took over: this svcproxy programs the node now");
    if let Some(tx) = tx.upgrade() {
        let _ = tx.send(Event::TookOver).await;
    }
}

/// SIGTERM or SIGINT. The handlers are installed here, when called, not when the
/// future is first polled: `select!` may poll a sync that blocks for seconds first,
/// and a signal before the handlers exist would kill the process outright (no
/// hand-over, no drain).
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (Ok(mut term), Err(_)) => {
                term.recv().await;
            }
            (Err(_), Ok(mut int)) => {
                int.recv().await;
            }
            (Err(_), Err(_)) => std::future::pending().await,
        }
    }
}

/// `svcproxy cleanup --kube-proxy`: removes kube-proxy's leftovers from this node, as
/// `kube-proxy --cleanup` does, unless kube-proxy still runs (it would put them back
/// at its next sync, and both would answer for the same Services).
pub fn cleanup_kube_proxy() -> anyhow::Result<()> {
    use svcproxy_dataplane::kernel::kube_proxy;
    if let Some(pid) = kube_proxy::kube_proxy_running() {
        bail!(
            "kube-proxy is running (PID {pid}): stop it first (scale its DaemonSet off \
             this node or delete it), or it re-creates its rules at its next sync"
        );
    }
    let done = kube_proxy::cleanup_kube_proxy(&[]);
    for (place, chains) in &done.iptables {
        tracing::info!(%place, chains = chains.len(), "removed kube-proxy's iptables chains");
    }
    for (place, chains) in &done.kept {
        tracing::warn!(%place, ?chains, "kept kube-proxy chains that another chain still jumps to");
    }
    for table in &done.nft_tables {
        tracing::info!(table = %table, "removed kube-proxy's nftables table");
    }
    if done.ipvs {
        tracing::info!("removed kube-proxy's IPVS state (kube-ipvs0)");
    }
    for w in &done.warnings {
        tracing::warn!("{w}");
    }
    if done.is_empty() && done.kept.is_empty() {
        tracing::info!("no kube-proxy leftovers found");
    }
    match done.errors.as_slice() {
        [] => Ok(()),
        errors => {
            for e in errors {
                tracing::error!("{e}");
            }
            bail!(
                "{} part(s) of kube-proxy's leftovers could not be removed",
                errors.len()
            )
        }
    }
}

/// A thread waited for when it goes out of scope, whichever way: the look for
/// kube-proxy's leftovers, whose warning belongs in the log of a short run (or a
/// failed start) too.
struct JoinOnDrop(Option<std::thread::JoinHandle<()>>);

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            let _ = handle.join();
        }
    }
}

/// At start (no `--service-proxy-name`): kube-proxy's rules still in the kernel would
/// answer for the same Services as svcproxy's (stale once kube-proxy is stopped), so
/// say so and how to remove them.
fn warn_about_kube_proxy_leftovers() {
    let found = svcproxy_dataplane::kernel::kube_proxy::find_leftovers(&[]);
    if found.is_empty() {
        return;
    }
    let running = svcproxy_dataplane::kernel::kube_proxy::kube_proxy_running();
    tracing::warn!(
        iptables = ?found.iptables.keys().collect::<Vec<_>>(),
        nftables = ?found.nft_tables,
        ipvs = found.ipvs,
        kube_proxy_pid = ?running,
        "kube-proxy's rules are installed on this node: they answer for the same Services \
         (stale once kube-proxy is stopped); stop kube-proxy and run `svcproxy cleanup \
         --kube-proxy`, or run beside it with --service-proxy-name"
    );
}

/// Removes what every svcproxy mode created (each mode's own objects, and only
/// those, where `options` say they are: the ebpf mode's pin directory). Every mode
/// is tried; the first failure is returned.
pub fn cleanup(options: &svcproxy_dataplane::ModeOptions) -> anyhow::Result<()> {
    let failures = svcproxy_dataplane::cleanup_all(&PlanConfig::default(), options);
    for b in svcproxy_dataplane::BACKENDS {
        match failures.iter().find(|(mode, _)| *mode == b.mode) {
            Some((mode, e)) => tracing::error!(mode, error = %e, "cleanup failed"),
            None => tracing::info!(mode = b.mode, "removed svcproxy's objects"),
        }
    }
    match failures.into_iter().next() {
        Some((mode, e)) => Err(e).with_context(|| format!("removing svcproxy's {mode} objects")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A syncer whose syncs after the first block until released (a hung apply), as
    /// the runner runs them: on its own task, taking events only between syncs.
    struct Hanging {
        health: Arc<ProxyHealth>,
        release: Arc<AtomicBool>,
        syncs: u32,
        received: u64,
    }

    impl Syncer for Hanging {
        fn apply(&mut self, _updates: Vec<SourceUpdate>) {
            self.received += 1;
        }

        fn sync(&mut self, _full: bool) -> anyhow::Result<()> {
            self.syncs += 1;
            if self.syncs > 1 {
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while !self.release.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            self.health.updated_through(self.received);
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_update_waiting_behind_a_hung_sync_makes_the_proxy_unhealthy() {
        let timeout = Duration::from_millis(300);
        let health = ProxyHealth::new(timeout);
        let (tx, rx) = event_channel(health.clone(), Metrics::new());
        let release = Arc::new(AtomicBool::new(false));
        let mut syncer = Hanging {
            health: health.clone(),
            release: release.clone(),
            syncs: 0,
            received: 0,
        };
        // The first sync at once; the periodic one 100 ms later hangs.
        let cfg = RunnerConfig::new(Duration::ZERO, Duration::from_millis(100));
        let runner = tokio::spawn(async move {
            let _ = runner::run(cfg, &mut syncer, rx, false).await;
        });
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(health.status().healthy, "nothing is waiting yet");
        // An update arrives while the periodic sync hangs: nothing takes it from the
        // runner's channel, yet it counts from now.
        tx.send(runner::tests::update()).await.unwrap();
        tokio::time::sleep(timeout + Duration::from_millis(200)).await;
        assert!(
            !health.status().healthy,
            "an update has waited past the timeout behind a hung sync"
        );
        // The sync finishes; the next one takes the update and health comes back.
        release.store(true, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !health.status().healthy && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(health.status().healthy);
        drop(tx);
        runner.abort();
    }
}
