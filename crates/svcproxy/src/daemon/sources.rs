//! Where the state's input comes from: the source of Services, EndpointSlices
//! and Nodes (a manifests directory or the API server, [`start_source`]), the
//! events they send to the runner ([`event_channel`]), this host's addresses
//! ([`watch_host_addresses`]) and the cluster DNS fed beside the state
//! ([`start_dns`]).

use super::*;

/// Whether the plan needs this host's own addresses: `--nodeport-addresses` CIDRs
/// select NodePort addresses among them.
pub(super) fn needs_host_addresses(cfg: &PlanConfig) -> bool {
    matches!(
        cfg.nodeport_addresses,
        NodePortAddresses::Cidrs(_) | NodePortAddresses::PrimaryAnd(_)
    )
}

/// Feeds this host's addresses to the state: read once now (before the first sync),
/// then, unless `once`, again whenever the kernel announces a change, from a thread
/// that sends each new list to the runner. An address added to or removed from an
/// interface thus moves NodePorts and healthCheckNodePort servers at the next sync.
pub(super) fn watch_host_addresses(
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
pub(super) fn event_channel(
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
pub(super) async fn forward_events(
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

/// Where Services, EndpointSlices and Nodes come from.
pub(super) enum Source {
    Manifests(ManifestDir),
    Api(KubeSourceConfig),
}

pub(super) fn source(settings: &Settings) -> anyhow::Result<Source> {
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

/// The cluster DNS (`--dns-bind-address`): its catalog, fed beside the state, and
/// the task that stops its server at `stop`.
pub(super) fn start_dns(
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
pub(super) struct StartedSource {
    /// The API source's task.
    pub(super) task: Option<tokio::task::JoinHandle<()>>,
    /// The manifests directory's watch.
    pub(super) watch: Option<svcproxy_sources::manifests::WatchHandle>,
    /// The lists the first sync waits for (the API source's watches).
    pub(super) initial_lists: Vec<&'static str>,
}

/// The reason of the Warning Event a defaulted mode posts on the Node (upstream's
/// own could not be read; its IPVS deprecation Event says `IPVSDeprecation` with the
/// action `ProxyModeCheck`, and this one follows that shape).
pub(super) const MODE_DEFAULTED_REASON: &str = "ProxyModeDefaulted";

/// Drops `value` on a thread of its own, off the caller's path: for a large
/// structure the process no longer needs. Without a thread it is dropped here
/// (with the closure `spawn` could not run).
fn free_beside<V: Send + 'static>(value: V) {
    let _ = std::thread::Builder::new()
        .name("free".into())
        .spawn(move || drop(value));
}

/// Starts the source of Services, EndpointSlices and Nodes: a manifests directory
/// is read here (its initial list applied to `state`, when the target keeps one,
/// before the first sync) and then watched; the API source lists and watches on a
/// task of its own.
pub(super) async fn start_source(
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
            if once {
                // Not read again: its record of every file is freed beside the
                // first sync rather than before it (0.2 s at 100k Services).
                free_beside(dir);
            } else {
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
                // With a Warning Event when no mode was set, as kube-proxy 1.37.
                let warnings = settings
                    .mode_defaulted
                    .then(|| kube_source::NodeWarning {
                        reason: MODE_DEFAULTED_REASON,
                        action: "ProxyModeCheck",
                        note: svcproxy_dataplane::DEFAULT_MODE_WARNING.to_string(),
                    })
                    .into_iter()
                    .collect();
                tokio::spawn(kube_source::record_startup_event(
                    client.clone(),
                    cfg.node_name.clone(),
                    warnings,
                ));
            }
            started.task = Some(tokio::spawn(kube_source::run(client, cfg, tx)));
        }
    }
    Ok(started)
}
