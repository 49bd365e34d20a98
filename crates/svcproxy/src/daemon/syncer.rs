//! What the runner calls at each sync ([`ProxySyncer`]): the state brought to a
//! snapshot, handed to the target, health, metrics and the cluster DNS updated,
//! the healthCheckNodePort servers moved where the plan says; the node's claim
//! ([`OwnerGate`]) and the hand-over at the end ([`hand_over`]).

use super::*;
use std::time::Instant;

pub(super) struct ProxySyncer<T> {
    pub(super) state: ClusterState,
    pub(super) target: T,
    pub(super) health: Arc<ProxyHealth>,
    pub(super) metrics: Arc<Metrics>,
    /// The servers, and the plan configuration that says where they listen.
    pub(super) health_checks: Option<(ServiceHealthServers, PlanConfig)>,
    /// The per-sync metric and health-check figures, kept from one snapshot to the
    /// next.
    pub(super) tallies: SnapshotTallies,
    pub(super) node_eligible: bool,
    /// The cluster DNS's catalog, fed the same updates as the state.
    pub(super) dns: Option<Arc<RwLock<svcproxy_dns::Catalog>>>,
    /// Update events applied so far (what a sync now covers, in `forward_events`'
    /// numbering).
    pub(super) received: u64,
    /// Whether every source had listed by now (the first sync was asked for).
    pub(super) listed: bool,
    /// Whether this process owns the node (programming the kernel only).
    pub(super) owner: Option<OwnerGate>,
}

/// A kernel target's claim on the node ([`crate::owner`]).
pub(super) struct OwnerGate {
    pub(super) ownership: Ownership,
    /// The mode it programs.
    pub(super) backend: &'static Backend,
    /// The modes' flags (where another mode's objects are, for their cleanup).
    pub(super) mode_options: svcproxy_dataplane::ModeOptions,
    /// The first sync as owner has succeeded (and the predecessor was told).
    pub(super) synced: bool,
    /// Whether the first sync may adopt sealed rules was decided (once).
    pub(super) adoption_decided: bool,
    /// When this process was first seen waiting as a standby, and first seen owning
    /// the node (the ownership metrics).
    standby_since: Option<Instant>,
    owner_since: Option<Instant>,
}

impl OwnerGate {
    pub(super) fn new(
        ownership: Ownership,
        backend: &'static Backend,
        mode_options: svcproxy_dataplane::ModeOptions,
    ) -> Self {
        // A standby from its claim on (it may own the node before this runs).
        let standby_since = ownership.standby_since();
        OwnerGate {
            ownership,
            backend,
            mode_options,
            synced: false,
            adoption_decided: false,
            standby_since,
            owner_since: None,
        }
    }

    /// How this process came to own the node, its first sync as owner just done
    /// (`adopted`: that sync took the predecessor's sealed objects).
    fn ownership(&self, adopted: bool) -> svcproxy_http::metrics::Ownership {
        use svcproxy_http::metrics::OwnershipHow;
        let now = Instant::now();
        let owner_since = self.owner_since.unwrap_or(now);
        let how = match self.ownership.current() {
            Role::Owner { locked: false, .. } => OwnershipHow::Unlocked,
            Role::Owner {
                handed_over: true, ..
            } => OwnershipHow::HandedOver,
            _ if self.standby_since.is_some() => OwnershipHow::TookOver,
            _ => OwnershipHow::First,
        };
        svcproxy_http::metrics::Ownership {
            how,
            standby: self
                .standby_since
                .map(|s| owner_since.saturating_duration_since(s))
                .unwrap_or_default(),
            take_over: now.saturating_duration_since(owner_since),
            adopted,
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
    pub(super) fn update_node_eligibility(&mut self) {
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
        if let Some(steps) = &done.steps {
            self.metrics.observe_sync_steps(steps);
        }
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
pub(super) fn follow_dns(
    dns: Option<&Arc<RwLock<svcproxy_dns::Catalog>>>,
    state: &mut ClusterState,
) {
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

    fn synced_as_owner(&self) -> bool {
        self.owner.as_ref().is_some_and(|g| g.synced)
    }

    fn skips_periodic_full_sync(&self) -> bool {
        self.target.skips_periodic_full_sync()
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
        if !std::mem::replace(&mut self.listed, true) {
            self.metrics.startup_step("listed");
        }
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
        if let Some(gate) = self.owner.as_mut() {
            match gate.standby_for() {
                Some(_) => {
                    gate.standby_since.get_or_insert_with(Instant::now);
                }
                None => {
                    gate.owner_since.get_or_insert_with(Instant::now);
                }
            }
        }
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
        let begun = std::time::Instant::now();
        let update = self.state.snapshot();
        tracing::debug!(
            ms = begun.elapsed().as_secs_f64() * 1e3,
            changed = update.changed.len(),
            "snapshot built"
        );
        self.metrics
            .add_changes(update.service_changes, update.endpoint_changes);
        self.metrics.set_pending_changes(0, 0);
        match self.target.sync(&self.state, &update, full) {
            Ok(done) => {
                self.after_sync(&update, &done);
                if let Some(gate) = self.owner.as_mut().filter(|g| !g.synced) {
                    gate.synced = true;
                    self.metrics.set_ownership(&gate.ownership(done.adopted));
                    self.metrics.startup_step("programmed");
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
pub(super) const TRIM_AFTER_CHANGES: usize = 1000;
/// Where healthCheckNodePort servers listen: on the NodePort addresses of each
/// family, as upstream (its servers listen on the addresses `--nodeport-addresses`
/// selects, everywhere when it selects all), recomputed after every sync so they
/// follow the Node's primary IPs and the host's addresses.
pub(super) fn health_check_listen(cfg: &PlanConfig, update: &SnapshotUpdate) -> Listen {
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
/// The servers of the services' healthCheckNodePorts, when the kernel is
/// programmed (`plan_cfg`) and they are asked for, with the plan configuration that
/// says where they listen.
pub(super) fn health_check_servers(
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
/// The run is over: an owner seals what its last sync wrote and hands the lock to
/// a standby, waiting for the standby's first sync (this process goes on forwarding
/// meanwhile, which the userspace mode needs).
pub(super) async fn hand_over<T: Target>(syncer: &mut ProxySyncer<T>, once: bool) {
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
pub(super) const HAND_OVER_WAIT: Duration = Duration::from_secs(20);

/// Tells the runner when this standby becomes the owner: its first real sync is due
/// at once.
pub(super) async fn announce_take_over(
    mut role: watch::Receiver<Role>,
    tx: mpsc::WeakSender<Event>,
) {
    if role.wait_for(Role::is_owner).await.is_err() {
        return;
    }
    tracing::info!("took over: this svcproxy programs the node now");
    if let Some(tx) = tx.upgrade() {
        let _ = tx.send(Event::TookOver).await;
    }
}
