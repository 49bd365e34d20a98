//! One run from start to stop ([`serve`], given a [`Serving`]): the node claimed,
//! the servers, the state, the source and the DNS started, the sync loop run
//! until it ends, a signal, or a change of the config file, then everything
//! stopped in order.

use super::*;

/// Resolves when the `--config` file's content differs from `initial` (checked every
/// second: a plain read follows ConfigMap volumes' symlink swaps, which a watch on the
/// file's inode misses). kube-proxy exits when its config file changes, so that the
/// DaemonSet restarts it with the new configuration; svcproxy does the same.
pub(super) async fn config_file_changed(
    path: std::path::PathBuf,
    initial: Option<Vec<u8>>,
) -> anyhow::Error {
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
/// What one run serves: the settings and servers, where each sync's snapshot goes,
/// and what comes with that target.
pub(super) struct Serving<T> {
    pub(super) settings: Settings,
    pub(super) servers: Servers,
    pub(super) target: T,
    /// Sync (or print) once and end: `--once` and the one-shot tools.
    pub(super) once: bool,
    /// The plan's configuration, for the targets that apply or render it (the
    /// kernel, `render`, `explain`): where NodePorts and healthCheckNodePort servers
    /// listen.
    pub(super) plan: Option<PlanConfig>,
    /// The mode whose metrics are served (the kernel, `render`).
    pub(super) backend: Option<&'static Backend>,
    /// Programs the node in this mode: only while owning it (`crate::owner`).
    pub(super) claim: Option<&'static str>,
}

impl<T: Target> Serving<T> {
    /// A tool that prints what each sync's snapshot shows, programming nothing.
    pub(super) fn printer(settings: Settings, servers: Servers, target: T, once: bool) -> Self {
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

pub(super) async fn serve<T: Target>(what: Serving<T>) -> anyhow::Result<()> {
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
        listed: false,
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
    if once {
        // The process ends with this run: the cluster's state and its last
        // snapshot go with it rather than being freed object by object first
        // (0.3 s at 100k Services x 10 endpoints). Plain data: nothing is lost.
        let ProxySyncer { state, tallies, .. } = syncer;
        std::mem::forget((state, tallies));
    }
    result
}

/// The process's metrics: kube-proxy's for the mode, the configuration, and the
/// data plane's own.
pub(super) fn metrics_for<T: Target>(
    backend: Option<&'static Backend>,
    settings: &Settings,
    target: &T,
) -> Arc<Metrics> {
    let started = crate::process_started();
    let metrics = match backend {
        Some(b) => Metrics::started_at(started, b),
        None => Metrics::started_at(
            started,
            svcproxy_dataplane::resolve_mode("")
                .expect("the default mode")
                .backend,
        ),
    };
    metrics.set_configz(&config::effective::configz_json(settings));
    metrics.register_data_plane(target.collectors());
    metrics
}

/// The cluster state as this process keeps it: for the proxy's snapshots, the
/// cluster DNS, or both.
pub(super) fn new_state<T: Target>(settings: &Settings, target: &T) -> ClusterState {
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
pub(super) async fn stop_all<T: Target>(
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
/// What ends the sync loop besides its own end: a stop signal, or a change of the
/// configuration file (`Some((path, its content at start))`), which kube-proxy
/// answers by exiting to be restarted.
pub(super) struct StopWhen<F> {
    pub(super) signal: F,
    pub(super) config_watch: Option<(std::path::PathBuf, Option<Vec<u8>>)>,
}

/// Runs the sync loop until it ends (`once`), a stop signal, or a change of the
/// configuration file (an error, as upstream: the process exits to be restarted).
pub(super) async fn run_until_stopped<T: Target>(
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
pub(super) type SharedCatalog = Arc<RwLock<svcproxy_dns::Catalog>>;

/// A server's task: its result once stopped.
pub(super) type ServerTask = tokio::task::JoinHandle<anyhow::Result<()>>;

/// What runs beside the sync loop until the process stops.
pub(super) struct Running {
    /// The HTTP servers' tasks and the DNS server's (each ends at the stop signal).
    pub(super) tasks: Vec<ServerTask>,
    /// The Kubernetes API source.
    pub(super) source: Option<tokio::task::JoinHandle<()>>,
    /// The manifests directory's watch (stopped when dropped).
    pub(super) _manifest_watch: Option<svcproxy_sources::manifests::WatchHandle>,
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
pub(super) async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Takes the node, or stands by ([`crate::owner`]), when this run programs the
/// kernel (`claim` names the mode); a one-shot sync beside another owner is refused.
pub(super) async fn claim_node(
    claim: Option<&'static str>,
    once: bool,
) -> anyhow::Result<Option<Ownership>> {
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
/// SIGTERM or SIGINT. The handlers are installed here, when called, not when the
/// future is first polled: `select!` may poll a sync that blocks for seconds first,
/// and a signal before the handlers exist would kill the process outright (no
/// hand-over, no drain).
pub(super) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
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
